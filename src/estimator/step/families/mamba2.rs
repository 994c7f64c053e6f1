//! The Mamba-2 mixer as transformers 5.24 runs it without the `mamba_ssm` and `causal_conv1d`
//! kernels (its torch fallback, the path of a CPU): `FalconH1Mixer.forward`
//! (`models/falcon_h1/modeling_falcon_h1.py`) and `GraniteMoeHybridMambaLayer.forward`
//! (`models/granitemoehybrid/modeling_granitemoehybrid.py`), both calling the module-level
//! `causal_conv1d_fn` (`F.conv1d` + SiLU) and `mamba2_chunk_scan` (the SSD "minimal" chunked scan
//! with `segment_sum`).
//!
//! Symbols (`ir::X`): H heads of P dims (d_ssm = H·P), N state, G groups, c_d = d_ssm + 2·G·N
//! convolution channels, D_in = d_ssm + c_d + H, chunk C, n_c = ⌈s / C⌉ chunks, s_p = n_c·C. In
//! the scan everything is fp32 (`.float()`), except that under autocast each `einsum` runs as a
//! bf16 `bmm` of bf16 casts of its operands. What each op's node saves is the list of
//! `validation/check_formulas.py` `mamba2_terms`, verified byte for byte against the records of
//! `falcon_h1` and `granitemoehybrid`.
//!
//! `kernels = cuda` would run `mamba_split_conv1d_scan_combined` (mamba_ssm
//! `ops/triton/ssd_combined.py`, `MambaSplitConv1dScanCombinedFn`), which saves only its inputs
//! (zxbcdt, the conv and norm weights, dt_bias, A, D, out_proj's weight) and the `out` of the scan
//! before out_proj, and recomputes the convolution and the chunk states in backward: see
//! `validation/README.md`. This module builds the CPU path the fixtures measure.

use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Origin, Out, Shape, Split, Tid, B, S, X};
use super::common::Params;
use crate::estimator::ctx::Q;
use crate::estimator::hf_fields::{Fields, HfError};
use crate::estimator::hf_writer::Writer;
use crate::estimator::model::{ModelSpec, Ssm, StateDtype};
use crate::estimator::part::Part;

/// The mixer's parameters, in registration order (`conv1d`, `in_proj`, `dt_bias`, `A_log`,
/// `norm`, `D`, `out_proj`).
pub struct MambaW {
    conv_w: Tid,
    conv_b: Option<Tid>,
    in_w: Tid,
    in_b: Option<Tid>,
    dt_bias: Tid,
    a_log: Tid,
    pub norm_w: Option<Tid>,
    d: Tid,
    out_w: Tid,
    out_b: Option<Tid>,
}

/// A parameter the mixer always has (a frozen empty one where the stage lacks it).
fn req(b: &mut Builder, p: &Params, name: &str) -> Tid {
    p.w(b, name).unwrap_or_else(|| p.make(b, 0, false, false))
}

impl MambaW {
    pub fn new(b: &mut Builder, p: &Params) -> MambaW {
        let conv_w = req(b, p, "layers.*.mamba.conv1d.weight");
        let conv_b = p.w(b, "layers.*.mamba.conv1d.bias");
        let in_w = req(b, p, "layers.*.mamba.in_proj.weight");
        let in_b = p.w(b, "layers.*.mamba.in_proj.bias");
        let dt_bias = req(b, p, "layers.*.mamba.dt_bias");
        let a_log = req(b, p, "layers.*.mamba.A_log");
        let norm_w = p.w(b, "layers.*.mamba.norm.weight");
        let d = req(b, p, "layers.*.mamba.D");
        let out_w = req(b, p, "layers.*.mamba.out_proj.weight");
        let out_b = p.w(b, "layers.*.mamba.out_proj.bias");
        MambaW { conv_w, conv_b, in_w, in_b, dt_bias, a_log, norm_w, d, out_w, out_b }
    }
}

fn shape(ds: &[Dim]) -> Shape {
    Shape::new(ds, Split::None)
}
const BD: Dim = Dim::Q(Q::B);
const SD: Dim = Dim::Q(Q::S);
const HD: Dim = Dim::X(X::SsmHeads);
const PD: Dim = Dim::X(X::SsmHeadDim);
const ND: Dim = Dim::X(X::SsmState);
const CD: Dim = Dim::X(X::SsmChunk);
const NC: Dim = Dim::X(X::SsmChunks);
const NC1: Dim = Dim::X(X::SsmChunks1);
const SP: Dim = Dim::X(X::SsmPadded);

/// A differentiable op whose node keeps `saved` and whose backward allocates one gradient per
/// input that needs one, the size of that input.
pub fn node(b: &mut Builder, name: &'static str, node: &'static str, ins: &[Tid], shape: Shape, dt: Dt, saved: &[S]) -> Tid {
    let rg = ins.iter().any(|&t| b.rg(t));
    let out = b.out(shape, dt, rg);
    let indexed: Vec<(u8, Tid)> = ins.iter().enumerate().map(|(i, &t)| (i as u8, t)).collect();
    let bw = b.input_grads(&indexed, name, 0);
    b.op(name, node, ins, &[out], if rg { saved } else { &[] }, &bw)[0]
}

/// `x.split(sizes, dim=-1)` into views of `shapes`: SplitWithSizesBackward0 concatenates the
/// gradients into one tensor of `x`'s size.
pub fn split_views(b: &mut Builder, x: Tid, shapes: &[Shape]) -> [Tid; 4] {
    let outs: Vec<Out> = shapes.iter().map(|&s| b.view_out(x, s)).collect();
    let (bytes, dtype, rg) = (b.bytes(x), b.t(x).dtype, b.rg(x));
    let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "cat" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    b.op("split_with_sizes", "SplitWithSizesBackward0", &[x], &outs, &[], bw)
}

/// `F.pad(x, …)` (`constant_pad_nd`): always a new tensor, even when the pad is 0; the
/// gradient is a narrowed view of the incoming one.
fn pad(b: &mut Builder, x: Tid, shape: Shape) -> Tid {
    let (dt, rg) = (b.t(x).dt, b.rg(x));
    let out = b.out(shape, dt, rg);
    let bw: &[B] = if rg { &[B::Pass { input: 0, output: 0 }] } else { &[] };
    b.op("constant_pad_nd", "ConstantPadNdBackward0", &[x], &[out], &[], bw)[0]
}

/// `segment_sum(x)` then `torch.exp` (`modeling_falcon_h1.py` `segment_sum`): `x[..., None]`
/// expanded to `[…, T, T]`, two `tril(ones(T, T, bool))` masks whose negations `masked_fill`
/// keeps (bool `[T, T]` each), a `cumsum` between them; `exp` keeps its result `out`.
fn exp_segment_sum(b: &mut Builder, x: Tid, t: Dim, out: Shape) -> Tid {
    let e = b.view(x, out, "ExpandBackward0", false);
    let mask = |b: &mut Builder| {
        let ones = b.plain("ones", &[], shape(&[t, t]), Dt::Bool);
        let tril = b.plain("tril", &[ones], shape(&[t, t]), Dt::Bool);
        b.plain("bitwise_not", &[tril], shape(&[t, t]), Dt::Bool)
    };
    let m1 = mask(b);
    let f1 = node(b, "masked_fill", "MaskedFillBackward0", &[e, m1], out, Dt::F32, &[S::In(1)]);
    let c = node(b, "cumsum", "CumsumBackward0", &[f1], out, Dt::F32, &[]);
    let m2 = mask(b);
    let f2 = node(b, "masked_fill", "MaskedFillBackward0", &[c, m2], out, Dt::F32, &[S::In(1)]);
    b.unary("exp", "ExpBackward0", f2, Keep::Output, "mul")
}

/// An `einsum` contraction as ATen runs it: each operand permuted and copied into the layout
/// `bmm` wants (`a_shape`, `b_shape`; under autocast then cast to bf16 by `bmm`'s autocast
/// rule), `bmm` keeping both; the result in `out`.
fn einsum(b: &mut Builder, x: Tid, x_shape: Option<Shape>, y: Tid, y_shape: Shape, out: Shape) -> Tid {
    let xc = match x_shape {
        Some(s) => b.copy(x, s),
        None => x,
    };
    let yc = b.copy(y, y_shape);
    b.bmm(xc, yc, out)
}

/// `mamba2_chunk_scan(x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus=True, dt_limit)` on
/// `x` `[b, s, H, P]`, `dt` `[b, s, H]`, `B`/`C` `[b, s, G, N]`, `a` (`-exp(A_log.float())` `[H]`):
/// the padded `[b, s_p, H, P]` fp32 output (`output + D_residual`).
pub fn chunk_scan(b: &mut Builder, w: &MambaW, x: Tid, dt: Tid, a: Tid, bm: Tid, cm: Tid) -> Tid {
    let f32s = |ds: &[Dim]| shape(ds);
    // dt = softplus(dt + dt_bias.to(dt.dtype)); dt = clamp(dt, *dt_limit)
    let dt_dt = b.t(dt).dt;
    let bias = b.to_copy(w.dt_bias, dt_dt);
    let dt1 = b.add(dt, bias);
    let sp = b.unary("softplus", "SoftplusBackward0", dt1, Keep::Input, "softplus_backward");
    b.hold(dt1);
    let dt = b.unary("clamp", "ClampBackward1", sp, Keep::Input, "where");
    b.hold(sp);
    // hidden_states.float(); B/C .float().repeat_interleave(H // G, dim=2)
    let xf = b.to_copy(x, Dt::F32);
    let bf = b.to_copy(bm, Dt::F32);
    let br = node(b, "repeat_interleave", "CloneBackward0", &[bf], f32s(&[BD, SD, HD, ND]), Dt::F32, &[]);
    let cf = b.to_copy(cm, Dt::F32);
    let cr = node(b, "repeat_interleave", "CloneBackward0", &[cf], f32s(&[BD, SD, HD, ND]), Dt::F32, &[]);
    // D_residual = D[..., None] * pad_tensor_by_size(hidden_states, pad_size)
    let xp = pad(b, xf, f32s(&[BD, SP, HD, PD]));
    let dv = b.view(w.d, shape(&[HD, Dim::N(1)]), "UnsqueezeBackward0", false);
    let d_res = b.mul_to(dv, xp, f32s(&[BD, SP, HD, PD]), Dt::F32);
    // hidden_states = hidden_states * dt[..., None].float(); A = A.to(dtype) * dt.float()
    let dt4 = b.view(dt, shape(&[BD, SD, HD, Dim::N(1)]), "UnsqueezeBackward0", false);
    let dtf = b.to_copy(dt4, Dt::F32);
    let xdt = b.mul_to(xf, dtf, f32s(&[BD, SD, HD, PD]), Dt::F32);
    b.hold(xf);
    let dtf2 = b.to_copy(dt, Dt::F32);
    let adt = b.mul_to(a, dtf2, f32s(&[BD, SD, HD]), Dt::F32);
    b.hold(a);
    // reshape_into_chunks: each padded (a copy), then viewed [b, n_c, C, …]
    let xdt = pad(b, xdt, f32s(&[BD, SP, HD, PD]));
    let adt = pad(b, adt, f32s(&[BD, SP, HD]));
    let bp = pad(b, br, f32s(&[BD, SP, HD, ND]));
    let cp = pad(b, cr, f32s(&[BD, SP, HD, ND]));
    for t in [xdt, adt, br, cr] {
        b.hold(t);
    }
    // A = A.permute(0, 3, 1, 2); A_cumsum = torch.cumsum(A, dim=-1)
    let ap = b.view(adt, f32s(&[BD, HD, NC, CD]), "PermuteBackward0", false);
    let acs = node(b, "cumsum", "CumsumBackward0", &[ap], f32s(&[BD, HD, NC, CD]), Dt::F32, &[]);
    // 1. L = exp(segment_sum(A)); G = einsum(C, B); M = G * L; Y_diag = einsum(M, x)
    let l = exp_segment_sum(b, acs, CD, f32s(&[BD, HD, NC, CD, CD]));
    let g = einsum(b, cp, Some(f32s(&[BD, NC, HD, CD, ND])), bp, f32s(&[BD, NC, HD, ND, CD]), f32s(&[BD, NC, HD, CD, CD]));
    let lp = b.view(l, f32s(&[BD, NC, CD, CD, HD]), "PermuteBackward0", false);
    let gv = b.view(g, f32s(&[BD, NC, CD, CD, HD]), "PermuteBackward0", false);
    let m = b.mul_to(gv, lp, f32s(&[BD, NC, CD, CD, HD]), Dt::F32);
    let y_diag = einsum(b, m, None, xdt, f32s(&[BD, NC, HD, CD, PD]), f32s(&[BD, NC, HD, CD, PD]));
    // 2. decay_states = exp(A_cumsum[..., -1:] - A_cumsum); B_decay = B * decay; states = einsum
    let last = b.slice(acs, f32s(&[BD, HD, NC, Dim::N(1)]));
    let diff = node(b, "sub", "SubBackward0", &[last, acs], f32s(&[BD, HD, NC, CD]), Dt::F32, &[]);
    let decay = b.unary("exp", "ExpBackward0", diff, Keep::Output, "mul");
    let dp = b.view(decay, f32s(&[BD, NC, CD, HD, Dim::N(1)]), "UnsqueezeBackward0", false);
    let b_decay = b.mul_to(bp, dp, f32s(&[BD, SP, HD, ND]), Dt::F32);
    let states = einsum(b, b_decay, Some(f32s(&[BD, NC, HD, ND, CD])), xdt, f32s(&[BD, NC, HD, CD, PD]), f32s(&[BD, NC, HD, PD, ND]));
    // 3. states = cat([zeros_like(states[:, :1]), states]); decay_chunk = exp(segment_sum(pad(A_cumsum[..., -1])))
    let sd = b.t(states).dt;
    let zeros = b.plain("zeros", &[], f32s(&[BD, Dim::N(1), HD, PD, ND]), sd);
    let cat = b.cat2(zeros, states, f32s(&[BD, NC1, HD, PD, ND]));
    b.hold(states);
    let lastc = b.slice(acs, f32s(&[BD, HD, NC]));
    let padded = pad(b, lastc, f32s(&[BD, HD, NC1]));
    let decay_chunk = exp_segment_sum(b, padded, NC1, f32s(&[BD, HD, NC1, NC1]));
    let new_states = einsum(b, decay_chunk, None, cat, f32s(&[BD, HD, NC1, PD, ND]), f32s(&[BD, HD, NC1, PD, ND]));
    let prev = b.slice(new_states, f32s(&[BD, NC, HD, PD, ND]));
    b.hold(cat);
    // 4. state_decay_out = exp(A_cumsum); C_times_states = einsum(C, states); Y_off = C_times_states * decay_out
    let decay_out = b.unary("exp", "ExpBackward0", acs, Keep::Output, "mul");
    let cts = einsum(b, cp, Some(f32s(&[BD, NC, HD, CD, ND])), prev, f32s(&[BD, NC, HD, ND, PD]), f32s(&[BD, NC, HD, CD, PD]));
    let ctv = b.view(cts, f32s(&[BD, NC, CD, HD, PD]), "PermuteBackward0", false);
    let dov = b.view(decay_out, f32s(&[BD, NC, CD, HD, Dim::N(1)]), "UnsqueezeBackward0", false);
    let y_off = b.mul_to(ctv, dov, f32s(&[BD, SP, HD, PD]), Dt::F32);
    // output = (Y_diag + Y_off).contiguous().reshape(b, -1, H, P) + D_residual
    let ydv = b.view(y_diag, f32s(&[BD, SP, HD, PD]), "PermuteBackward0", false);
    let y = b.add(ydv, y_off);
    let y = b.copy(y, f32s(&[BD, SP, HD, PD]));
    let out = b.add(y, d_res);
    b.hold(y);
    // The function's locals live until it returns.
    for t in
        [dt, xdt, adt, bp, cp, d_res, acs, l, g, m, y_diag, decay, b_decay, zeros, decay_chunk, new_states, prev, decay_out, cts, y_off]
    {
        b.hold(t);
    }
    out
}

/// The mixer's input projection and its `A` (shared by the torch fallback, [`mixer_scan`], and
/// the fused kernel, [`mixer_fused`]): `in_proj` (Falcon-H1: of `x * ssm_in_multiplier`, times the
/// `mup_vector` buffer) and `A = -exp(A_log.float())`. Returns `[b, s, D_in]`, `A` `[H]` fp32 and
/// the projection's dtype.
fn in_proj_and_a(b: &mut Builder, w: &MambaW, spec: &ModelSpec, x: Tid) -> (Tid, Tid, Dt) {
    let m = spec.ssm;
    b.module = "mamba";
    b.part = Part::AttentionInputs;
    let xs = if m.mup { b.mul_scalar(x) } else { x };
    b.module = "mamba.in_proj";
    let proj = b.linear(xs, w.in_w, w.in_b, shape(&[BD, SD, Dim::X(X::SsmIn)]));
    b.module = "mamba";
    b.part = Part::AttentionCore;
    let proj = if m.mup {
        let buf = b.external(shape(&[Dim::N(1), Dim::N(1), Dim::X(X::SsmIn)]), Dt::Resid, Origin::Buffer, false);
        let y = b.mul(proj, buf);
        b.hold(xs);
        y
    } else {
        proj
    };
    let af = b.to_copy(w.a_log, Dt::F32);
    let e = b.unary("exp", "ExpBackward0", af, Keep::Output, "mul");
    let a = b.unary("neg", "NegBackward0", e, Keep::Nothing, "neg");
    let pd = b.t(proj).dt;
    (proj, a, pd)
}

/// The mixer's forward up to the scan's output (`FalconH1Mixer.forward` /
/// `GraniteMoeHybridMambaLayer.forward` before the gate): `in_proj` (Falcon-H1: of
/// `x * ssm_in_multiplier`, times the `mup_vector` buffer), `A = -exp(A_log.float())`, the
/// split into gate, xBC and dt, `causal_conv1d_fn` (`F.conv1d` of xBC `.to(weight.dtype)`,
/// padding K_c − 1, sliced to s, SiLU, `.to(xBC.dtype)`), the split into x, B, C, and
/// [`chunk_scan`]. Returns the scan's output viewed `[b, s, d_ssm]`, the gate, and the
/// forward's other locals (held by the caller until the forward returns).
pub fn mixer_scan(b: &mut Builder, w: &MambaW, spec: &ModelSpec, x: Tid) -> (Tid, Tid, [Tid; 8]) {
    let m = spec.ssm;
    let (proj, a, pd) = in_proj_and_a(b, w, spec, x);
    let tok = |x: X| shape(&[BD, SD, Dim::X(x)]);
    let [gate, xbc, dt, _] = split_views(b, proj, &[tok(X::SsmInner), tok(X::SsmConvDim), tok(X::SsmHeads)]);
    let xbc_t = b.view(xbc, shape(&[BD, Dim::X(X::SsmConvDim), SD]), "TransposeBackward0", false);
    // causal_conv1d_fn
    let wdt = b.t(w.conv_w).dt;
    let xin = b.to_copy(xbc_t, wdt);
    let xin = b.autocast_in(xin);
    let (cw, cb) = if b.autocast { (b.cast_weight(w.conv_w), w.conv_b.map(|t| b.cast_weight(t))) } else { (w.conv_w, w.conv_b) };
    let mut ins = vec![xin, cw];
    ins.extend(cb);
    let cdt = b.t(xin).dt;
    let conv = node(
        b,
        "convolution",
        "ConvolutionBackward0",
        &ins,
        shape(&[BD, Dim::X(X::SsmConvDim), Dim::X(X::SsmConvLen)]),
        cdt,
        &[S::In(0), S::In(1)],
    );
    let sl = b.slice(conv, shape(&[BD, Dim::X(X::SsmConvDim), SD]));
    let act = b.unary("silu", "SiluBackward0", sl, Keep::Input, "silu_backward");
    let act = b.to_copy(act, pd);
    let act_t = b.view(act, tok(X::SsmConvDim), "TransposeBackward0", false);
    let [xh, bm, cm, _] = split_views(b, act_t, &[tok(X::SsmInner), tok(X::SsmGroupState), tok(X::SsmGroupState)]);
    let xv = b.view(xh, shape(&[BD, SD, HD, PD]), "ViewBackward0", false);
    let out = chunk_scan(b, w, xv, dt, a, bm, cm);
    let sliced = if b.c.n(Q::S).is_multiple_of(m.chunk.max(1)) { out } else { b.slice(out, shape(&[BD, SD, HD, PD])) };
    let y = b.view(sliced, tok(X::SsmInner), "ViewBackward0", false);
    (y, gate, [proj, a, dt, act_t, xh, bm, cm, out])
}

/// `out_proj(scan_output.to(dtype))` with `dtype` the mixer input's (`Dt::Resid`).
pub fn out_proj(b: &mut Builder, w: &MambaW, y: Tid) -> Tid {
    let y = b.to_copy(y, Dt::Resid);
    b.module = "mamba.out_proj";
    b.part = Part::AttentionCore;
    b.linear(y, w.out_w, w.out_b, Shape::tok(Q::H))
}

/// Falcon-H1's mixer without its gated norm (`mamba_rms_norm` false): `scan_output *
/// silu(gate)`, then [`out_proj`]; the forward's locals (`locals`) die when it returns.
pub fn gated_out(b: &mut Builder, w: &MambaW, y: Tid, gate: Tid, locals: [Tid; 8]) -> Tid {
    b.module = "mamba";
    let sg = b.unary("silu", "SiluBackward0", gate, Keep::Input, "silu_backward");
    let shp = b.shape(y);
    let g = b.mul_to(y, sg, shp, Dt::F32);
    let o = out_proj(b, w, g);
    for t in locals.into_iter().chain([y, g]) {
        b.hold(t);
    }
    o
}

/// The mixer with `kernels = cuda` (training, no cache): `FalconH1Mixer.forward` /
/// `GraniteMoeHybridMambaLayer.forward` hand `in_proj`'s output to mamba_ssm's
/// `mamba_split_conv1d_scan_combined` (`mamba_ssm/ops/triton/ssd_combined.py`,
/// `MambaSplitConv1dScanCombinedFn.forward`), one autograd node from `zxbcdt` to `out_proj`'s
/// output that keeps `ctx.save_for_backward(zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D,
/// dt_bias, initial_states, seq_idx, rmsnorm_weight, rstd, outproj_weight, outproj_bias)`: the
/// `in_proj` output `[b, s, D_in]`, the scan's output `out_x` `[b, s, d_ssm]` (its dtype), and with
/// the gated norm its fp32 `rstd` `[b·s·G]`; the convolution, the chunk states and `out_proj`'s
/// input are recomputed in its backward, which allocates the gradients of `zxbcdt` and the
/// weights.
pub fn mixer_fused(b: &mut Builder, w: &MambaW, spec: &ModelSpec, x: Tid) -> Tid {
    let m = spec.ssm;
    let (proj, a, pd) = in_proj_and_a(b, w, spec, x);
    // out_x and rstd: made inside the node, kept by it (outputs of a no-grad helper here).
    let out_x = b.plain("_mamba_chunk_scan_combined_fwd", &[proj], shape(&[BD, SD, Dim::X(X::SsmInner)]), pd);
    let rstd = w.norm_w.map(|_| b.plain("_layer_norm_fwd", &[out_x], shape(&[BD, SD, Dim::N(m.groups.max(1) as u32)]), Dt::F32));
    let mut ins = vec![proj, out_x, a, w.conv_w, w.d, w.dt_bias, w.out_w];
    ins.extend(rstd);
    let mut saved = vec![S::In(0), S::In(1)];
    if rstd.is_some() {
        saved.push(S::In(7));
    }
    let rg = b.rg(proj);
    let out = b.out(Shape::tok(Q::H), Dt::Resid, rg);
    let grads = [(0u8, proj), (2, a), (3, w.conv_w), (4, w.d), (5, w.dt_bias), (6, w.out_w)];
    let bw = b.input_grads(&grads, "mamba_split_conv1d_scan_combined_bwd", 0);
    let o = b.op("mamba_split_conv1d_scan_combined", "MambaSplitConv1dScanCombinedFnBackward", &ins, &[out], &saved, &bw)[0];
    b.hold(proj);
    o
}

/// Granite 4's mixer end (`GraniteMoeHybridMambaLayer.forward`: `self.norm(scan_output, gate)`,
/// then [`out_proj`]): `GraniteMoeHybridRMSNormGated.forward` in fp32 — `x * silu(gate.to(fp32))`,
/// an RMSNorm over each of the `groups` groups of `d_ssm / groups` (`pow`, `mean`, `rsqrt`, the
/// product), then `weight * x.to(input_dtype)` (the scan's output is fp32, so that cast is a
/// no-op and the product fp32). The forward's `locals` die when it returns.
pub fn gated_norm_out(b: &mut Builder, w: &MambaW, y: Tid, gate: Tid, groups: u64, locals: [Tid; 8]) -> Tid {
    b.module = "mamba.norm";
    let g32 = b.to_copy(gate, Dt::F32);
    let sg = b.unary("silu", "SiluBackward0", g32, Keep::Input, "silu_backward");
    let shp = b.shape(y);
    let prod = b.mul_to(y, sg, shp, Dt::F32);
    let grouped = shape(&[BD, SD, Dim::N(groups.max(1) as u32), Dim::X(X::SsmInner)]);
    let stats = shape(&[BD, SD, Dim::N(groups.max(1) as u32)]);
    let pv = b.view(prod, shp, "ViewBackward0", false);
    let sq = b.pow(pv);
    let var = node(b, "mean", "MeanBackward1", &[sq], stats, Dt::F32, &[]);
    let ve = b.add_scalar(var);
    let r = b.rsqrt(ve);
    let normed = b.mul_to(pv, r, shp, Dt::F32);
    let _ = grouped;
    let out = match w.norm_w {
        Some(nw) => b.mul_to(nw, normed, shp, Dt::F32),
        None => normed,
    };
    for t in [g32, sg, prod, sq, var, ve, r, normed] {
        b.hold(t);
    }
    let o = out_proj(b, w, out);
    for t in locals.into_iter().chain([y, out]) {
        b.hold(t);
    }
    o
}

/// The mixer's `config.json` keys that `FalconH1Config` and `GraniteMoeHybridConfig` read alike,
/// with their defaults: `mamba_n_heads` (128) heads of `mamba_d_head` ("auto": the scan's width
/// `inner` over the heads, which must make `inner`, named `inner_key` in the error),
/// `mamba_d_state` (256), `mamba_n_groups` (1), `mamba_d_conv` (4), `mamba_chunk_size` (256),
/// `mamba_conv_bias` (true), `mamba_proj_bias` (false) on `in_proj`. The family's own fields
/// (`out_bias`, `gated_norm`, `mup`) come from `own`.
pub fn ssm_keys(f: &Fields, inner: u64, inner_key: &str, own: Ssm) -> Result<Ssm, HfError> {
    let heads = f.size("mamba_n_heads", 128)?;
    let head_dim = match f.uint("mamba_d_head") {
        Ok(Some(d)) => d,
        _ => inner / heads.max(1),
    };
    if heads * head_dim != inner {
        return Err(HfError::Model(format!("`mamba_n_heads` × `mamba_d_head` ({heads} × {head_dim}) must be {inner_key} ({inner})")));
    }
    Ok(Ssm {
        heads,
        head_dim,
        state: f.size("mamba_d_state", 256)?,
        groups: f.size("mamba_n_groups", 1)?,
        conv: f.size("mamba_d_conv", 4)?,
        chunk: f.size("mamba_chunk_size", 256)?,
        conv_bias: f.flag("mamba_conv_bias", true)?,
        in_bias: f.flag("mamba_proj_bias", false)?,
        ..own
    })
}

/// `mamba_ssm_dtype` (the recurrent state's dtype the checkpoint names: Qwen3.5's `float32`),
/// written back when the spec has one; Falcon-H1, Granite 4.0-H and Qwen3.5 read it alike.
pub fn write_ssm_dtype(w: &mut Writer, s: &ModelSpec) {
    if s.ssm_dtype != StateDtype::Auto {
        w.set("mamba_ssm_dtype", s.ssm_dtype.name());
    }
}

/// The keys [`ssm_keys`] reads, written back from `m`.
pub fn write_ssm_keys(w: &mut Writer, m: &Ssm) {
    w.set("mamba_n_heads", m.heads)
        .set("mamba_d_head", m.head_dim)
        .set("mamba_d_state", m.state)
        .set("mamba_n_groups", m.groups)
        .set("mamba_d_conv", m.conv)
        .set("mamba_chunk_size", m.chunk)
        .set("mamba_conv_bias", m.conv_bias)
        .set("mamba_proj_bias", m.in_bias);
}
