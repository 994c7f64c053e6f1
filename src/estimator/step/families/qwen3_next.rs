//! Qwen3-Next (`models/qwen3_next/modeling_qwen3_next.py`, transformers 5.24): decoder layers
//! whose token mixer is, by `layer_types`, either the gated DeltaNet (`linear_attention`:
//! `Qwen3NextGatedDeltaNet`) or a gated full attention (`full_attention`: `Qwen3NextAttention`,
//! whose `q_proj` also emits a gate, with per-head (1 + w) q/k norms and a partial rotary
//! embedding), each followed by Qwen2-MoE's sparse block with a gated shared expert
//! (`Qwen3NextSparseMoeBlock`); every norm is Gemma's `(1 + w)` RMSNorm (`Qwen3NextRMSNorm`).
//!
//! The gated DeltaNet is built as transformers runs it without the `flash-linear-attention` and
//! `causal-conv1d` kernels (the path of a CPU, which the fixtures measure): the input
//! projections, `F.silu(self.conv1d(mixed_qkv)[:, :, :seq_len])`, the module-level
//! `torch_chunk_gated_delta_rule` (chunk C = 64: the l2norms, the padded chunks, the pairwise
//! decays, the two `torch.linalg.solve_triangular` solves, then the loop over the chunks that
//! carries the `[b, Hv, dk, dv]` state) and `Qwen3NextRMSNormGated`, then `out_proj`. What each
//! op's node keeps is `validation/check_formulas.py` `deltanet_terms`. On `kernels = cuda` the
//! convolution and the delta rule are the CUDA kernels' nodes instead ([`super::fla`]: what
//! `causal_conv1d_fn` and `fla`'s `chunk_gated_delta_rule` keep, far less).

use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Out, Shape, Split, Tid, B, S, X};
use super::common::{proj_or, rms_norm, AttnW, Kind, Norm, Params, Rms, Shared};
use super::fla;
use super::llama::{attend, decoder_layer, rope_partial, rope_qk, Core, Ffn, PartialRope};
use super::mamba2::{node, write_ssm_dtype};
use super::modeling::{ConfigFile, Modeling};
use super::moe::{sparse_block, MoeW, SharedW, Topk};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{Gdn, LayerRule, Linear, ModelSpec, QkNorm, StateDtype};
use crate::estimator::part::Part;
use crate::estimator::preset_base::{llama, Preset};
use serde_json::{Map, Value};

fn shape(ds: &[Dim]) -> Shape {
    Shape::new(ds, Split::None)
}
const BD: Dim = Dim::Q(Q::B);
const SD: Dim = Dim::Q(Q::S);
const HV: Dim = Dim::X(X::GdnVHeads);
const DK: Dim = Dim::X(X::GdnKDim);
const DV: Dim = Dim::X(X::GdnVDim);
const CH: Dim = Dim::X(X::GdnChunk);
const NC: Dim = Dim::X(X::GdnChunks);
const SP: Dim = Dim::X(X::GdnPadded);

/// The gated DeltaNet's parameters, in registration order (`conv1d`, the input projections,
/// `dt_bias`, `A_log`, `norm`, `out_proj`).
pub struct GdnW {
    conv_w: Option<Tid>,
    /// Qwen3-Next: `in_proj_qkvz`, `in_proj_ba`; Qwen3.5: `in_proj_qkv`, `in_proj_z`,
    /// `in_proj_b`, `in_proj_a`.
    ins: [Option<Tid>; 4],
    dt_bias: Option<Tid>,
    a_log: Option<Tid>,
    norm_w: Option<Tid>,
    out_w: Option<Tid>,
}

impl GdnW {
    pub fn new(b: &mut Builder, p: &Params, split: bool) -> GdnW {
        let conv_w = p.w(b, "layers.*.linear_attn.conv1d.weight");
        let ins = if split {
            [
                p.w(b, "layers.*.linear_attn.in_proj_qkv.weight"),
                p.w(b, "layers.*.linear_attn.in_proj_z.weight"),
                p.w(b, "layers.*.linear_attn.in_proj_b.weight"),
                p.w(b, "layers.*.linear_attn.in_proj_a.weight"),
            ]
        } else {
            [p.w(b, "layers.*.linear_attn.in_proj_qkvz.weight"), p.w(b, "layers.*.linear_attn.in_proj_ba.weight"), None, None]
        };
        let dt_bias = p.w(b, "layers.*.linear_attn.dt_bias");
        let a_log = p.w(b, "layers.*.linear_attn.A_log");
        let norm_w = p.w(b, "layers.*.linear_attn.norm.weight");
        let out_w = p.w(b, "layers.*.linear_attn.out_proj.weight");
        GdnW { conv_w, ins, dt_bias, a_log, norm_w, out_w }
    }
}

/// A parameter the mixer always has (a frozen empty one where the stage lacks it).
pub(super) fn req(b: &mut Builder, w: Option<Tid>) -> Tid {
    match w {
        Some(t) => t,
        None => b.plain("zeros", &[], shape(&[Dim::N(0)]), Dt::Model),
    }
}

/// A linear of the mixer (module `module`) into `[b, s, width]`.
fn lin(b: &mut Builder, x: Tid, w: Option<Tid>, width: Dim, module: &'static str) -> Tid {
    b.module = module;
    b.part = Part::AttentionInputs;
    let y = proj_or(b, x, w, None, shape(&[BD, SD, width]), Linear::Qkv);
    b.module = "linear_attn";
    b.part = Part::AttentionCore;
    y
}

/// A `reshape` of a strided view that must copy (`_unsafe_view` of a `clone`: the gradient
/// passes).
fn reshape_copy(b: &mut Builder, x: Tid, to: Shape) -> Tid {
    b.copy(x, to)
}

/// `F.pad(x, …)` (`constant_pad_nd`): a new tensor even when the pad is 0; its gradient is a
/// narrowed view of the incoming one.
pub(super) fn pad(b: &mut Builder, x: Tid, to: Shape) -> Tid {
    let (dt, rg) = (b.t(x).dt, b.rg(x));
    let out = b.out(to, dt, rg);
    let bw: &[B] = if rg { &[B::Pass { input: 0, output: 0 }] } else { &[] };
    b.op("constant_pad_nd", "ConstantPadNdBackward0", &[x], &[out], &[], bw)[0]
}

/// `torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)`: keeps `a` and its
/// result; backward solves for the right-hand side's gradient (its size), then `a`'s.
fn solve_triangular(b: &mut Builder, a: Tid, rhs: Tid) -> Tid {
    let (shp, dt) = (b.shape(rhs), b.t(rhs).dt);
    let rg = b.rg(a) || b.rg(rhs);
    let out = b.out(shp, dt, rg);
    // grad_B = solve_triangular(A^H, grad); grad_A = -(grad_B @ X^H), then its lower triangle
    // (`linalg_solve_triangular_backward`): a matmul, its negation and the `tril`, each of A's
    // size, the previous freed after the next is made.
    let mut bw: Vec<B> = Vec::new();
    if b.rg(rhs) || b.rg(a) {
        bw.push(B::Alloc { bytes: b.bytes(rhs), dtype: b.t(rhs).dtype, op: "linalg_solve_triangular" });
    }
    if b.rg(a) {
        let (bytes, dtype) = (b.bytes(a), b.t(a).dtype);
        bw.push(B::Alloc { bytes, dtype, op: "bmm" });
        bw.push(B::Alloc { bytes, dtype, op: "neg" });
        bw.push(B::Free(1));
        bw.push(B::Alloc { bytes, dtype, op: "tril" });
        bw.push(B::Free(2));
        bw.push(B::Grad { input: 0, temp: 3 });
    }
    if b.rg(rhs) {
        bw.push(B::Grad { input: 1, temp: 0 });
    } else if b.rg(a) {
        bw.push(B::Free(0));
    }
    b.op("linalg_solve_triangular", "LinalgSolveTriangularBackward0", &[a, rhs], &[out], &[S::In(0), S::Out(0)], &bw)[0]
}

/// `l2norm(x)` (`modeling_qwen3_next.py`): `x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) +
/// eps)` — the square keeps x twice, the rsqrt its result, the product x and the rsqrt.
fn l2norm(b: &mut Builder, x: Tid) -> Tid {
    let shp = b.shape(x);
    let sq = b.mul_to(x, x, shp, b.t(x).dt);
    let s = node(b, "sum", "SumBackward1", &[sq], shp.last(Dim::N(1)), b.t(x).dt, &[]);
    let e = b.add_scalar(s);
    let r = b.rsqrt(e);
    b.mul(x, r)
}

/// `torch_chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64,
/// use_qk_l2norm_in_kernel=True)` (no initial state, the final state discarded) on q, k
/// `[b, s, Hv, dk]`, v `[b, s, Hv, dv]`, g and beta `[b, s, Hv]`: the output `[b, s, Hv, dv]` in
/// the input's dtype. Everything inside runs in fp32 (`.to(torch.float32)`); under autocast each
/// matmul casts its operands to bf16.
fn chunk_rule(b: &mut Builder, q: Tid, k: Tid, v: Tid, g: Tid, beta: Tid) -> Tid {
    let in_dt = b.t(v).dt;
    let s = b.c.n(Q::S);
    let c = Gdn::CHUNK;
    let n = s.div_ceil(c).max(1);
    let bhs = |d: Dim| shape(&[BD, HV, SD, d]);
    let bhp = |d: Dim| shape(&[BD, HV, SP, d]);
    let chunked = |d: Dim| shape(&[BD, HV, NC, CH, d]);
    let per = |d: Dim| shape(&[BD, HV, CH, d]);
    // x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format): a copy unless
    // already fp32 (then the transposed view itself).
    let tr = |b: &mut Builder, x: Tid, to: Shape| {
        let t = b.view(x, to, "TransposeBackward0", false);
        if b.t(t).dtype == b.dtype(Dt::F32) {
            t
        } else {
            b.to_copy(t, Dt::F32)
        }
    };
    // fp32 inputs and no padding: `.to(...)` returns the transposed input and `F.pad` by 0
    // keeps its layout, so q, k and what follows them stay laid out `[b, s, Hv, d]`: the
    // chunked matmuls copy their operands into `bmm`'s layout unless one batch of one chunk
    // folds as a view, and each chunk's slice of the decayed q and k is copied when b > 1.
    let strided = b.t(q).dtype == b.dtype(Dt::F32) && s.is_multiple_of(c);
    let batch = b.c.n(Q::B);
    let fold5 = |b: &mut Builder, x: Tid| {
        if strided && (batch > 1 || n > 1) {
            let shp = b.shape(x);
            b.copy(x, shp)
        } else {
            x
        }
    };
    let fold_chunk = |b: &mut Builder, x: Tid| {
        if strided && batch > 1 {
            let shp = b.shape(x);
            b.copy(x, shp)
        } else {
            x
        }
    };
    let qf = tr(b, q, bhs(DK));
    let kf = tr(b, k, bhs(DK));
    let vf = tr(b, v, bhs(DV));
    let betaf = tr(b, beta, shape(&[BD, HV, SD]));
    let gf = tr(b, g, shape(&[BD, HV, SD]));
    let qn = l2norm(b, qf);
    let kn = l2norm(b, kf);
    let qs = b.mul_scalar(qn);
    // F.pad to s_p = n·C (new tensors even when nothing is padded).
    let qp = pad(b, qs, bhp(DK));
    let kp = pad(b, kn, bhp(DK));
    let vp = pad(b, vf, bhp(DV));
    let bp = pad(b, betaf, shape(&[BD, HV, SP]));
    let gp = pad(b, gf, shape(&[BD, HV, SP]));
    let bu = b.view(bp, bhp(Dim::N(1)), "UnsqueezeBackward0", false);
    let v_beta = b.mul_to(vp, bu, bhp(DV), Dt::F32);
    let k_beta = b.mul_to(kp, bu, bhp(DK), Dt::F32);
    // reshape into chunks (views)
    let qc = b.view(qp, chunked(DK), "ViewBackward0", false);
    let kc = b.view(kp, chunked(DK), "ViewBackward0", false);
    let kbc = b.view(k_beta, chunked(DK), "ViewBackward0", false);
    let vbc = b.view(v_beta, chunked(DV), "ViewBackward0", false);
    let gc = b.view(gp, shape(&[BD, HV, NC, CH]), "ViewBackward0", false);
    let ones = b.plain("ones", &[], shape(&[CH, CH]), Dt::Bool);
    let upper = b.plain("triu", &[ones], shape(&[CH, CH]), Dt::Bool);
    let cum = node(b, "cumsum", "CumsumBackward0", &[gc], shape(&[BD, HV, NC, CH]), Dt::F32, &[]);
    // pairwise_decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(strictly_upper, -inf).exp()
    let cc = chunked(CH);
    let diff = node(b, "sub", "SubBackward0", &[cum, cum], cc, Dt::F32, &[]);
    let filled = node(b, "masked_fill", "MaskedFillBackward0", &[diff, upper], cc, Dt::F32, &[S::In(1)]);
    let pair = b.unary("exp", "ExpBackward0", filled, Keep::Output, "mul");
    // ut_system = (k_beta @ key^T) * pairwise; intra_chunk_attn = (query @ key^T) * pairwise
    let kt = b.view(kc, chunked(DK), "TransposeBackward0", false);
    let a1 = fold5(b, kbc);
    let a2 = fold5(b, kt);
    let kb_kt = b.bmm(a1, a2, cc);
    let ut = b.mul_to(kb_kt, pair, cc, Dt::F32);
    let a3 = fold5(b, qc);
    let a4 = fold5(b, kt);
    let q_kt = b.bmm(a3, a4, cc);
    for t in [a1, a2, a3, a4] {
        b.hold(t);
    }
    let intra = b.mul_to(q_kt, pair, cc, Dt::F32);
    // decayed_k_beta = k_beta * cum.exp()[..., None]
    let ce1 = b.unary("exp", "ExpBackward0", cum, Keep::Output, "mul");
    let ce1u = b.view(ce1, chunked(Dim::N(1)), "UnsqueezeBackward0", false);
    let dkb = b.mul_to(kbc, ce1u, chunked(DK), Dt::F32);
    let new_values = solve_triangular(b, ut, vbc);
    let k_cumdecay = solve_triangular(b, ut, dkb);
    // query * cum.exp()[..., None]; key * (cum[..., -1:] - cum).exp()[..., None]; chunk decay
    let ce2 = b.unary("exp", "ExpBackward0", cum, Keep::Output, "mul");
    let ce2u = b.view(ce2, chunked(Dim::N(1)), "UnsqueezeBackward0", false);
    let qd = b.mul_to(qc, ce2u, chunked(DK), Dt::F32);
    // The decayed key and the chunk decays feed only the state updates: with one chunk, only
    // the discarded final state (a dead graph, freed at once: not built).
    let decays = (n > 1).then(|| {
        let last = b.slice(cum, shape(&[BD, HV, NC, Dim::N(1)]));
        let kdiff = node(b, "sub", "SubBackward0", &[last, cum], shape(&[BD, HV, NC, CH]), Dt::F32, &[]);
        let ce3 = b.unary("exp", "ExpBackward0", kdiff, Keep::Output, "mul");
        let ce3u = b.view(ce3, chunked(Dim::N(1)), "UnsqueezeBackward0", false);
        let kd = b.mul_to(kc, ce3u, chunked(DK), Dt::F32);
        let lastc = b.slice(cum, shape(&[BD, HV, NC]));
        let cdec = b.unary("exp", "ExpBackward0", lastc, Keep::Output, "mul");
        for t in [kdiff, ce3] {
            b.hold(t);
        }
        (kd, cdec)
    });
    // With one chunk, under activation offloading, the decays are built as the dead graph
    // they are (their nodes pack their saves: [`dead_decays`]).
    let dead = (n == 1 && b.dead_graphs).then(|| dead_decays(b, kc, cum));
    // The loop over the chunks: the state starts at zeros (no gradient); the last chunk's
    // update feeds only the discarded final state (a dead graph, freed at once: not built
    // unless its packs count, [`dead_update`]).
    let mut state = b.plain("zeros", &[], shape(&[BD, HV, DK, DV]), Dt::F32);
    let zeros = b.plain("zeros", &[], chunked(DV), Dt::F32);
    let mut out = zeros;
    let mut kept: Vec<Tid> = Vec::new();
    for i in 0..n {
        let nv_i = b.slice(new_values, per(DV));
        let kcd_i = b.slice(k_cumdecay, per(DK));
        let q_i = b.slice(qd, per(DK));
        let q_i = fold_chunk(b, q_i);
        let in_i = b.slice(intra, shape(&[BD, HV, CH, CH]));
        // v_new = new_values_i - k_cumdecay_i @ state
        let vp_i = b.bmm(kcd_i, state, per(DV));
        let v_new = node(b, "sub", "SubBackward0", &[nv_i, vp_i], per(DV), Dt::F32, &[]);
        // out[:, :, i] = query_i @ state + intra_i @ v_new
        let inter = b.bmm(q_i, state, per(DV));
        let local = b.bmm(in_i, v_new, per(DV));
        let o_i = b.add(inter, local);
        let rg = b.rg(o_i) || b.rg(out);
        let o = b.view_out(out, chunked(DV));
        let o = Out { requires_grad: rg, ..o };
        let bw: &[B] = &[B::Pass { input: 0, output: 0 }, B::Pass { input: 1, output: 0 }];
        out = b.op("copy_", "CopySlices", &[out, o_i], &[o], &[], if rg { bw } else { &[] })[0];
        kept.extend([q_i, vp_i, v_new, inter, local, o_i]);
        if let Some((kd, cdec)) = decays.filter(|_| i + 1 < n) {
            // state = state * chunk_decay_i + key_i^T @ v_new
            let cd_i = b.slice(cdec, shape(&[BD, HV, Dim::N(1), Dim::N(1)]));
            let k_i = b.slice(kd, per(DK));
            let k_i = fold_chunk(b, k_i);
            let kt_i = b.view(k_i, per(DK), "TransposeBackward0", false);
            let sd = b.mul_to(state, cd_i, shape(&[BD, HV, DK, DV]), Dt::F32);
            let upd = b.bmm(kt_i, v_new, shape(&[BD, HV, DK, DV]));
            b.hold(state);
            state = b.add(sd, upd);
            kept.extend([sd, upd]);
        } else if let Some((kd, cdec)) = decays.or(dead).filter(|_| b.dead_graphs) {
            let rg = [b.rg(cum), b.rg(cum) || b.rg(kc)];
            dead_update(b, state, kd, cdec, v_new, [per(DK), shape(&[BD, HV, DK, DV])], rg);
        } else {
            kept.extend(dead_state_bmm(b, v_new, shape(&[BD, HV, DK, DV])));
        }
    }
    for t in kept {
        b.hold(t);
    }
    // core_attn_out.reshape(b, Hv, s_p, dv)[:, :, :s].transpose(1, 2).contiguous().to(dtype)
    let flat = b.view(out, bhp(DV), "ViewBackward0", false);
    let sl = if s.is_multiple_of(c) { flat } else { b.slice(flat, bhs(DV)) };
    let t = b.view(sl, shape(&[BD, SD, HV, DV]), "TransposeBackward0", false);
    let y = if b.dtype(in_dt) == b.dtype(Dt::F32) { b.copy(t, shape(&[BD, SD, HV, DV])) } else { b.to_copy(t, in_dt) };
    // The function's locals live until it returns (the names rebound on the way — the fp32
    // copies, the l2norm and scaled q/k, the pairwise differences — die at once unless saved).
    for t in [qp, kp, vp, bp, gp, v_beta, k_beta, cum, pair, ut, intra, ce1, dkb, new_values, k_cumdecay, ce2, qd, state, out, upper] {
        b.hold(t);
    }
    for t in decays.map_or([None, None], |(kd, cd)| [Some(kd), Some(cd)]).into_iter().flatten() {
        b.hold(t);
    }
    y
}

/// The decayed key and the chunk decays of a single chunk, which feed only the last (dead) state
/// update, as the dead graph they are (no gradient reaches them; each op's node packs what it
/// would save, [`Builder::dead_save`]):
/// ```python
/// key = key * (cum_decay[..., -1:] - cum_decay).exp().unsqueeze(-1)   # ExpBackward0: result; MulBackward0: both
/// chunk_decay = cum_decay[..., -1].exp()[..., None, None]             # ExpBackward0: result
/// ```
/// Returns the decayed key `[b, H, n, C, dk]` and the chunk decays `[b, H, n]`.
pub(super) fn dead_decays(b: &mut Builder, kc: Tid, cum: Tid) -> (Tid, Tid) {
    let (rk, rg) = (b.rg(kc), b.rg(cum));
    let cs = b.shape(cum);
    let kdiff = b.plain("sub", &[cum], cs, Dt::F32);
    let ce = b.plain("exp", &[kdiff], cs, Dt::F32);
    b.dead_save(ce, rg);
    let mut ks = b.shape(kc);
    ks = ks.last(Dim::N(1));
    let ceu = b.op("unsqueeze", "", &[ce], &[b.view_out(ce, ks)], &[], &[])[0];
    let kshape = b.shape(kc);
    let kd = b.plain("mul", &[kc, ceu], kshape, Dt::F32);
    // MulBackward0's saved variables: `other` (for self's gradient), `self` (for other's).
    b.dead_save(ceu, rk);
    b.dead_save(kc, rg);
    let last = cs.drop_last();
    let cdec = b.plain("exp", &[cum], last, Dt::F32);
    b.dead_save(cdec, rg);
    (kd, cdec)
}

/// The last chunk's state update, built as the dead graph it is (its result, the final state,
/// is discarded) where its nodes' packs count (activation offloading):
/// ```python
/// last_recurrent_state = last_recurrent_state * chunk_decay[:, :, i] + key[:, :, i].transpose(-1, -2) @ v_new
/// ```
/// MulBackward0 keeps the state (for the decay's gradient; the decay too when the state has a
/// gradient, after the first chunk); `matmul` copies the transposed key slice into `bmm`'s
/// layout when b > 1 and BmmBackward0 keeps both operands. `shapes`: the key slice
/// `[b, H, C, dk]` and the state `[b, H, dk, dv]`; `rg`: whether the decays and the decayed key
/// would require a gradient (a dead graph's tensors carry none in the program).
pub(super) fn dead_update(b: &mut Builder, state: Tid, kd: Tid, cdec: Tid, v_new: Tid, shapes: [Shape; 2], rg: [bool; 2]) {
    let [kshape, sshape] = shapes;
    let (rs, rv) = (b.rg(state), b.rg(v_new));
    let (rd, rk) = (rg[0] || b.rg(cdec), rg[1] || b.rg(kd));
    let cd_i = b.op("select", "", &[cdec], &[b.view_out(cdec, Shape::new(&[BD, HV, Dim::N(1), Dim::N(1)], Split::None))], &[], &[])[0];
    let sd = b.plain("mul", &[state, cd_i], sshape, Dt::F32);
    b.dead_save(cd_i, rs);
    b.dead_save(state, rd);
    let k_i = b.op("select", "", &[kd], &[b.view_out(kd, kshape)], &[], &[])[0];
    let kt = if b.c.n(Q::B) == 1 { k_i } else { b.plain("clone", &[k_i], kshape, Dt::F32) };
    let upd = b.plain("bmm", &[kt, v_new], sshape, Dt::F32);
    // BmmBackward0's saved variables: `mat2` (for self's gradient), `self` (for mat2's).
    b.dead_save(v_new, rk || rd);
    b.dead_save(kt, rv);
    b.plain("add", &[sd, upd], sshape, Dt::F32);
}

/// The last chunk's state update feeds only the discarded final state: a dead graph (freed at
/// once, not built), except that op-level selective checkpointing caches its `bmm`'s output
/// `[b, H, dk, dv]` all the same (`_CachingTorchDispatchMode` caches every saved op's output).
pub(super) fn dead_state_bmm(b: &mut Builder, v_new: Tid, state: Shape) -> Option<Tid> {
    let dt = if b.autocast { Dt::Bf16 } else { Dt::F32 };
    b.sac.is_some().then(|| b.plain("bmm", &[v_new], state, dt))
}

/// `Qwen3NextRMSNormGated.forward(core_attn_out, z)` on `[b·s·Hv, dv]` rows:
/// ```python
/// hidden_states = hidden_states.to(torch.float32)
/// variance = hidden_states.pow(2).mean(-1, keepdim=True)
/// hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
/// hidden_states = self.weight * hidden_states.to(input_dtype)
/// hidden_states = hidden_states * F.silu(gate.to(torch.float32))
/// return hidden_states.to(input_dtype)
/// ```
fn gated_norm(b: &mut Builder, w: Option<Tid>, x: Tid, z: Tid) -> Tid {
    b.module = "linear_attn.norm";
    let in_dt = b.t(x).dt;
    let x32 = b.to_copy(x, Dt::F32);
    let sq = b.pow(x32);
    let var = b.mean_last(sq);
    let ve = b.add_scalar(var);
    let r = b.rsqrt(ve);
    let n32 = b.mul(x32, r);
    let nd = b.to_copy(n32, in_dt);
    let wn = match w {
        Some(w) => b.mul(w, nd),
        None => nd,
    };
    let z32 = b.to_copy(z, Dt::F32);
    let sg = b.unary("silu", "SiluBackward0", z32, Keep::Input, "silu_backward");
    let shp = b.shape(x);
    let y = b.mul_to(wn, sg, shp, Dt::F32);
    let o = b.to_copy(y, in_dt);
    // `variance` and the last `hidden_states` live until the return.
    for t in [var, y] {
        b.hold(t);
    }
    b.hold(x);
    o
}

/// `Qwen3NextGatedDeltaNet.forward` (no cache, no padding mask) on the input norm's output `x`
/// (Qwen3.5's `Qwen3_5GatedDeltaNet.forward` with `split`: four projections, the conv input the
/// `in_proj_qkv` output itself).
pub fn gated_deltanet(b: &mut Builder, w: &GdnW, spec: &ModelSpec, x: Tid) -> Tid {
    let m = spec.gdn;
    let r = m.v_heads / m.k_heads.max(1);
    b.module = "linear_attn";
    b.part = Part::AttentionCore;
    let tok = |d: Dim| shape(&[BD, SD, d]);
    let (mixed, z, bb, a, locals) = if m.split {
        let qkv = lin(b, x, w.ins[0], Dim::X(X::GdnConvDim), "linear_attn.in_proj_qkv");
        let z = lin(b, x, w.ins[1], Dim::X(X::GdnValueWidth), "linear_attn.in_proj_z");
        let zv = b.view(z, shape(&[BD, SD, HV, DV]), "ViewBackward0", false);
        let bb = lin(b, x, w.ins[2], HV, "linear_attn.in_proj_b");
        let a = lin(b, x, w.ins[3], HV, "linear_attn.in_proj_a");
        (qkv, zv, bb, a, vec![z])
    } else {
        let qkvz = lin(b, x, w.ins[0], Dim::X(X::GdnQkvz), "linear_attn.in_proj_qkvz");
        let ba = lin(b, x, w.ins[1], Dim::X(X::GdnBa), "linear_attn.in_proj_ba");
        // fix_query_key_value_ordering: views per key head, split; value, z, b, a reshaped
        // (copies of strided views unless there is one key head).
        let kh = Dim::X(X::GdnKHeads);
        let sub = |d: Dim| shape(&[BD, SD, kh, d]);
        let outs: Vec<Out> = [DK, DK, DV, DV].iter().map(|&d| b.view_out(qkvz, sub(d))).collect();
        let rg = b.rg(qkvz);
        let (bytes, dtype) = (b.bytes(qkvz), b.t(qkvz).dtype);
        let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "cat" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
        let [q, k, v, zz] = b.op("split_with_sizes", "SplitWithSizesBackward0", &[qkvz], &outs, &[], bw);
        let (bh, ah) = b.chunk2(ba, shape(&[BD, SD, kh, Dim::N(1)]));
        let one_k = m.k_heads == 1;
        let re = |b: &mut Builder, x: Tid, to: Shape| if one_k { b.view(x, to, "ViewBackward0", false) } else { reshape_copy(b, x, to) };
        let v = re(b, v, shape(&[BD, SD, HV, DV]));
        let z = re(b, zz, shape(&[BD, SD, HV, DV]));
        let bb = re(b, bh, tok(HV));
        let a = re(b, ah, tok(HV));
        // query, key, value = (x.reshape(b, s, -1) for x in (query, key, value)); cat
        let q = re(b, q, tok(Dim::X(X::GdnKeyWidth)));
        let k = re(b, k, tok(Dim::X(X::GdnKeyWidth)));
        let vv = b.view(v, tok(Dim::X(X::GdnValueWidth)), "ViewBackward0", false);
        let qk = b.cat2(q, k, tok(Dim::X(X::GdnConvDim)));
        let mixed = b.cat2(qk, vv, tok(Dim::X(X::GdnConvDim)));
        b.hold(qk);
        (mixed, z, bb, a, vec![qkvz, ba, q, k, v])
    };
    // mixed_qkv.transpose(1, 2); F.silu(self.conv1d(mixed_qkv)[:, :, :seq_len])
    let cd = Dim::X(X::GdnConvDim);
    let mt = b.view(mixed, shape(&[BD, cd, SD]), "TransposeBackward0", false);
    let cw = req(b, w.conv_w);
    // With causal-conv1d (kernels = cuda) one fused node keeps only its input
    // ([`fla::causal_conv1d`]); the fallback convolves, slices and applies SiLU op by op.
    let (conv, act) = if b.c.cuda {
        let act = fla::causal_conv1d(b, mt, cw);
        (act, act)
    } else {
        let xin = b.autocast_in(mt);
        let cw = if b.autocast { b.cast_weight(cw) } else { cw };
        let cdt = b.t(xin).dt;
        let conv =
            node(b, "convolution", "ConvolutionBackward0", &[xin, cw], shape(&[BD, cd, Dim::X(X::GdnConvLen)]), cdt, &[S::In(0), S::In(1)]);
        let sl = b.slice(conv, shape(&[BD, cd, SD]));
        (conv, b.unary("silu", "SiluBackward0", sl, Keep::Input, "silu_backward"))
    };
    let at = b.view(act, tok(cd), "TransposeBackward0", false);
    let kw = Dim::X(X::GdnKeyWidth);
    let outs: Vec<Out> = [kw, kw, Dim::X(X::GdnValueWidth)].iter().map(|&d| b.view_out(at, tok(d))).collect();
    let (bytes, dtype, rg) = (b.bytes(at), b.t(at).dtype, b.rg(at));
    let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "cat" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    let [q, k, v, _] = b.op("split_with_sizes", "SplitWithSizesBackward0", &[at], &outs, &[], bw);
    let kh = Dim::X(X::GdnKHeads);
    let q = b.view(q, shape(&[BD, SD, kh, DK]), "ViewBackward0", false);
    let k = b.view(k, shape(&[BD, SD, kh, DK]), "ViewBackward0", false);
    let v = b.view(v, shape(&[BD, SD, HV, DV]), "ViewBackward0", false);
    // beta = b.sigmoid(); g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
    let beta = b.unary("sigmoid", "SigmoidBackward0", bb, Keep::Output, "sigmoid_backward");
    let alog = req(b, w.a_log);
    let af = b.to_copy(alog, Dt::F32);
    let e = b.unary("exp", "ExpBackward0", af, Keep::Output, "mul");
    let ne = b.unary("neg", "NegBackward0", e, Keep::Nothing, "neg");
    let a32 = b.to_copy(a, Dt::F32);
    let dtb = req(b, w.dt_bias);
    let ab = b.add(a32, dtb);
    let ab = if b.dtype(b.t(ab).dt) == b.dtype(Dt::F32) { ab } else { b.to_copy(ab, Dt::F32) };
    let sp = b.unary("softplus", "SoftplusBackward0", ab, Keep::Input, "softplus_backward");
    let g = b.mul_to(ne, sp, tok(HV), Dt::F32);
    // repeat_interleave to Hv heads (when Hv > Hk), in the fallback only: fla's kernel takes
    // the key heads as they are.
    let (q, k) = if r > 1 && !b.c.cuda {
        let qr = node(b, "repeat_interleave", "IndexSelectBackward0", &[q], shape(&[BD, SD, HV, DK]), b.t(q).dt, &[]);
        let kr = node(b, "repeat_interleave", "IndexSelectBackward0", &[k], shape(&[BD, SD, HV, DK]), b.t(k).dt, &[]);
        (qr, kr)
    } else {
        (q, k)
    };
    let core = if b.c.cuda { fla::chunk_delta_rule(b, fla::Rule::Gated, q, k, v, g, beta) } else { chunk_rule(b, q, k, v, g, beta) };
    b.module = "linear_attn";
    let rows = shape(&[BD, SD, HV, DV]);
    let normed = gated_norm(b, w.norm_w, core, z);
    let flat = b.view(normed, tok(Dim::X(X::GdnValueWidth)), "ViewBackward0", false);
    let _ = rows;
    b.module = "linear_attn.out_proj";
    b.part = Part::AttentionInputs;
    let out = proj_or(b, flat, w.out_w, None, Shape::tok(Q::H), Linear::O);
    for t in locals.into_iter().chain([mixed, conv, act, q, k, v, z, bb, a, beta, af, e, ne, a32, ab, sp, g, core, normed]) {
        b.hold(t);
    }
    out
}

/// `Qwen3NextAttention.forward`: `q_proj` emits q and a gate (`[b, s, a, 2d]`, chunked), the
/// gate reshaped (a copy), (1 + w) per-head q/k norms, the partial rotary embedding, the core,
/// `attn_output * torch.sigmoid(gate)`, then `o_proj`.
pub fn gated_attention(b: &mut Builder, w: &AttnW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let bshd = |h: Q| Shape::new(&[BD, SD, Dim::Q(h), Dim::Q(Q::D)], Split::Tp);
    let bhsd = |h: Q| Shape::new(&[BD, Dim::Q(h), SD, Dim::Q(Q::D)], Split::Tp);
    b.module = "self_attn.q_proj";
    b.part = Part::AttentionInputs;
    let qg = proj_or(b, x, w.wq, w.bq, Shape::new(&[BD, SD, Dim::Q(Q::A), Dim::N(2), Dim::Q(Q::D)], Split::Tp), Linear::Q);
    b.module = "self_attn";
    b.part = Part::AttentionCore;
    let (q, gate) = b.chunk2(qg, bshd(Q::A));
    let gate = b.copy(gate, bshd(Q::A));
    b.module = "self_attn.q_norm";
    let qn = rms_norm(b, q, w.qn, Rms::Gemma);
    b.module = "self_attn";
    let q = b.view(qn, bhsd(Q::A), "TransposeBackward0", false);
    b.module = "self_attn.k_proj";
    b.part = Part::AttentionInputs;
    let k = proj_or(b, x, w.wk, w.bk, bshd(Q::KV), Linear::K);
    b.module = "self_attn.k_norm";
    b.part = Part::AttentionCore;
    let kn = rms_norm(b, k, w.kn, Rms::Gemma);
    b.module = "self_attn";
    let kt = b.view(kn, bhsd(Q::KV), "TransposeBackward0", false);
    b.module = "self_attn.v_proj";
    b.part = Part::AttentionInputs;
    let v = proj_or(b, x, w.wv, w.bv, bshd(Q::KV), Linear::V);
    b.module = "self_attn";
    b.part = Part::AttentionCore;
    let eager = attn == Attention::Eager;
    let vt = b.view(v, bhsd(Q::KV), "TransposeBackward0", eager);
    let partial = super::common::rotary_dims(spec) < spec.head_dim;
    let (q, k) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) if partial => {
            let qk = rope_partial(b, spec, q, kt, cos, sin, PartialRope::default());
            b.hold(q);
            b.hold(kt);
            qk
        }
        (Some(cos), Some(sin)) => rope_qk(b, q, kt, Some((cos, sin))),
        _ => (q, kt),
    };
    let how = Core { selective: false, ..if partial { Core::CONTIGUOUS } else { Core::LLAMA } };
    let (o, weights, kept) = attend(b, spec, [q, k, vt], sh.mask, attn, how);
    b.module = "self_attn";
    let sg = b.unary("sigmoid", "SigmoidBackward0", gate, Keep::Output, "sigmoid_backward");
    let shp = b.shape(o);
    let og = b.mul_to(o, sg, shp, b.t(o).dt);
    let out = super::common::out_proj(b, og, w.wo, w.bo, "self_attn.o_proj");
    for t in kept.into_iter().chain([qg, gate, qn, kn, v, o, sg, og]) {
        b.hold(t);
    }
    (out, weights)
}

/// How Qwen3-Next's router ends (`Qwen3NextTopKRouter`: Qwen2-MoE's, renormalised with
/// `norm_topk_prob`; Qwen3.5-MoE always renormalises).
fn topk(spec: &ModelSpec) -> Topk {
    let _ = spec;
    Topk { normalize: true, cast: true }
}

/// One decoder layer (`Qwen3NextDecoderLayer.forward`): the token mixer (gated DeltaNet or gated
/// attention, by `layer_types`), then the sparse block (or Qwen3.5's dense SwiGLU).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    // Parameters in registration order: the mixer, mlp, input_layernorm, post_attention_layernorm.
    let linear = sh.linear;
    let gw = linear.then(|| GdnW::new(b, p, spec.gdn.split));
    let aw = (!linear).then(|| AttnW::new(b, p));
    let ffn = Ffn::new(b, p, kind, |b, p| (MoeW::new(b, p), spec.shared_gate.then(|| SharedW::new(b, p))));
    let ffn = |b: &mut Builder, n: Tid| ffn.forward(b, n, |b, (w, sw), n| sparse_block(b, &w, sw.as_ref(), n, topk(spec)));
    let mixer = |b: &mut Builder, n: Tid| match (&gw, &aw) {
        (Some(gw), _) => (gated_deltanet(b, gw, spec, n), None),
        (_, Some(aw)) => gated_attention(b, aw, spec, n, sh, attn),
        _ => (n, None),
    };
    decoder_layer(b, p, x, Norm::Rms(Rms::Gemma), mixer, ffn)
}

/// What every Qwen3-Next / Qwen3.5 checkpoint shares: heads of 256 with a quarter rotary, q/k
/// norms per head, the gated attention's output gate, gated DeltaNet key/value heads of 128 with a
/// conv of 4, and three DeltaNet layers to each full-attention layer (`layer_types`).
fn hybrid(family: Family, base: ModelSpec, k_heads: u64, v_heads: u64, split: bool) -> ModelSpec {
    let mut m = base;
    m.family = family;
    m.head_dim = 256;
    m.rotary_pct = 25;
    m.qk_norm = QkNorm::Head;
    m.attn_gate = true;
    m.gdn = Gdn { k_heads, v_heads, k_dim: 128, v_dim: 128, conv: 4, split };
    m.linear_layers = LayerRule::AllBut { step: 4, offset: 3 };
    m
}

/// A fused-expert MoE on every layer with one gated shared expert, experts and shared expert of 512.
fn hybrid_moe(mut m: ModelSpec, experts: u64, top_k: u64) -> ModelSpec {
    m.experts = experts;
    m.top_k = top_k;
    m.expert_ffn = 512;
    m.fused_experts = true;
    m.shared_experts = 1;
    m.shared_ffn = 512;
    m.shared_gate = true;
    m.moe_rule = LayerRule::All;
    m
}

/// Qwen3-Next-80B-A3B: 48 layers of h 2048 (three gated DeltaNet layers, then one gated
/// attention layer, repeated), 16 query / 2 KV heads of 256 with a quarter rotary, DeltaNet of
/// 16 key heads × 128 and 32 value heads × 128 (conv 4), 512 experts (top 10) of 512 and a gated
/// shared expert of 512, vocab 151,936, untied.
fn qwen3_next_80b() -> ModelSpec {
    let m = hybrid(Family::Qwen3Next, llama(151_936, 2048, 48, 16, 2, 5120, 262_144), 16, 32, false);
    hybrid_moe(m, 512, 10)
}

/// `layer_types` as the gated DeltaNet layers (`linear_attention`); every other entry must be
/// `full_attention`. Absent: `Qwen3NextConfig`'s default, every `full_attention_interval`-th
/// layer (4) full.
fn linear_layers(f: &Fields, layers: u64) -> Result<LayerRule, HfError> {
    const KEY: &str = "layer_types";
    let Some(v) = f.get(KEY) else {
        let step = f.uint_or("full_attention_interval", 4)?.max(1);
        return Ok(LayerRule::AllBut { step, offset: step - 1 });
    };
    let items = v.as_array().ok_or(HfError::Type { key: KEY, expected: "a list of layer types" })?;
    if items.len() as u64 != layers {
        return Err(HfError::Field { key: KEY, reason: format!("lists {} layers for {} num_hidden_layers", items.len(), layers) });
    }
    let mut lin = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match item.as_str() {
            Some("linear_attention") => lin.push(i as u64),
            Some("full_attention") => {}
            Some(other) => {
                return Err(HfError::Field {
                    key: KEY,
                    reason: format!("layer type `{other}` is not modelled (linear_attention and full_attention are)"),
                })
            }
            None => return Err(HfError::Type { key: KEY, expected: "a list of layer types" }),
        }
    }
    // Every `step`-th layer full (the configurations' `full_attention_interval` layout).
    let step = (0..layers).find(|i| !lin.contains(i)).map_or(0, |f| f + 1);
    let interval = step > 1 && (0..layers).all(|i| lin.contains(&i) == (i % step != step - 1));
    Ok(if lin.is_empty() {
        LayerRule::None
    } else if lin.len() as u64 == layers {
        LayerRule::All
    } else if interval {
        LayerRule::AllBut { step, offset: step - 1 }
    } else {
        LayerRule::List(lin)
    })
}

/// How a config.json states the gated DeltaNet layers: `full_attention_interval` when every
/// `step`-th layer is full attention (as the configurations default to), else `layer_types`.
fn layer_types(s: &ModelSpec) -> (&'static str, Value) {
    match s.linear_layers {
        LayerRule::AllBut { step, offset } if step > 0 && offset + 1 == step => ("full_attention_interval", step.into()),
        _ => {
            let types: Vec<&str> =
                (0..s.layers).map(|i| if s.linear_layers.contains(i) { "linear_attention" } else { "full_attention" }).collect();
            ("layer_types", types.into())
        }
    }
}

/// The gated DeltaNet's keys (`Qwen3NextConfig`, `Qwen3_5TextConfig`).
fn gdn_keys(f: &Fields, split: bool) -> Result<Gdn, HfError> {
    let g = Gdn {
        k_heads: f.size("linear_num_key_heads", 16)?,
        v_heads: f.size("linear_num_value_heads", 32)?,
        k_dim: f.size("linear_key_head_dim", 128)?,
        v_dim: f.size("linear_value_head_dim", 128)?,
        conv: f.size("linear_conv_kernel_dim", 4)?,
        split,
    };
    if g.k_heads == 0 || !g.v_heads.is_multiple_of(g.k_heads) {
        return Err(HfError::Model(format!(
            "`linear_num_value_heads` ({}) must be a multiple of `linear_num_key_heads` ({})",
            g.v_heads, g.k_heads
        )));
    }
    Ok(g)
}

/// What the estimate of a gated DeltaNet model assumes (a preset's note, an import's).
pub const TORCH_PATH: &str = "the gated DeltaNet layers follow the kernels setting: kernels=cpu, transformers' torch fallback (what the \
     records measure); kernels=cuda, the flash-linear-attention and causal-conv1d kernels transformers calls when installed \
     (what they keep read from their sources, not measured on a GPU)";

/// Qwen3-Next: gated DeltaNet and gated attention layers, MoE with a gated shared expert.
pub struct Qwen3Next;
impl ConfigFile for Qwen3Next {
    /// `Qwen3NextConfig`: Llama's sizes, `head_dim`, `partial_rotary_factor` (0.25), the gated
    /// DeltaNet's `linear_*` keys and `layer_types`, the experts (`num_experts`,
    /// `num_experts_per_tok`, `moe_intermediate_size`, `shared_expert_intermediate_size`,
    /// `decoder_sparse_step`, `mlp_only_layers`).
    fn import(&self, _t: &str, f: &Fields, notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        notes.push(TORCH_PATH.into());
        let mut m = fields::llama_keys(f, fields::Ffn::Optional, false, 32_768)?;
        m.qkv_bias = f.flag("attention_bias", false)?;
        m.o_bias = m.qkv_bias;
        m.qk_norm = QkNorm::Head;
        m.attn_gate = true;
        m.rotary_pct = f.rotary_pct(0.25)?;
        m.gdn = gdn_keys(f, false)?;
        m.linear_layers = linear_layers(f, m.layers)?;
        m.ssm_dtype = f.state_dtype("mamba_ssm_dtype")?;
        m.fused_experts = true;
        m.experts = f.required(&["num_experts"])?;
        m.top_k = f.required(&["num_experts_per_tok"])?;
        m.expert_ffn = f.required(&["moe_intermediate_size"])?;
        let step = f.uint_or("decoder_sparse_step", 1)?;
        let dense_only = f.list_len("mlp_only_layers")?;
        let sparse: Vec<bool> = (0..m.layers).map(|i| !dense_only.contains(&i) && step > 0 && (i + 1) % step == 0).collect();
        m.moe_rule = LayerRule::from_flags(&sparse);
        m.dense_layers = 0;
        if m.dense_mlp_layers() > 0 && m.ffn == 0 {
            return Err(HfError::Missing("intermediate_size"));
        }
        m.shared_ffn = f.uint_or("shared_expert_intermediate_size", 0)?;
        m.shared_experts = u64::from(m.shared_ffn > 0);
        m.shared_gate = m.shared_ffn > 0;
        if !f.flag("norm_topk_prob", true)? {
            return Err(HfError::Field {
                key: "norm_topk_prob",
                reason: "false is not modelled (Qwen3-Next renormalises its top-k weights)".into(),
            });
        }
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::llama_base("qwen3_next", s, "hidden_act") else { return Vec::new() };
        let g = s.gdn;
        let types = layer_types(s);
        let dense: Vec<u64> = (0..s.layers).filter(|&i| !s.moe_rule.contains(i)).collect();
        w.set("intermediate_size", s.ffn)
            .set("attention_bias", s.qkv_bias)
            .set("partial_rotary_factor", s.rotary_pct as f64 / 100.0)
            .set("linear_num_key_heads", g.k_heads)
            .set("linear_num_value_heads", g.v_heads)
            .set("linear_key_head_dim", g.k_dim)
            .set("linear_value_head_dim", g.v_dim)
            .set("linear_conv_kernel_dim", g.conv)
            .set(types.0, types.1)
            .set("num_experts", s.experts)
            .set("num_experts_per_tok", s.top_k)
            .set("moe_intermediate_size", s.expert_ffn)
            .set("shared_expert_intermediate_size", s.shared_ffn)
            .set("decoder_sparse_step", 1)
            .set("mlp_only_layers", dense)
            .set("norm_topk_prob", true);
        write_ssm_dtype(&mut w, s);
        w.done().into_iter().collect()
    }
}

impl Modeling for Qwen3Next {
    fn presets(&self) -> Vec<Preset> {
        vec![Preset::new(70, "qwen3-next-80b-a3b-thinking", "Qwen/Qwen3-Next-80B-A3B-Thinking", "Qwen3-Next", qwen3_next_80b())
            .with_notes(&[TORCH_PATH])]
    }
    fn norm(&self) -> Norm {
        Norm::Rms(Rms::Gemma)
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
}

/// The interleaved M-RoPE tables of Qwen3.5 (`Qwen3_5TextRotaryEmbedding`, Qwen3-VL's): text
/// position ids are expanded to `[3, b, s]`, so cos and sin are `[b, s, d_rot]`, one row of
/// positions per batch row.
fn mrope_shape(spec: &ModelSpec) -> Shape {
    let d = if super::common::rotary_dims(spec) == spec.head_dim { Dim::Q(Q::D) } else { Dim::X(X::DRot) };
    Shape::new(&[BD, SD, d], Split::None)
}

/// Qwen3.5 text models (`models/qwen3_5/modeling_qwen3_5.py` `Qwen3_5ForCausalLM`, and
/// `models/qwen3_5_moe/modeling_qwen3_5_moe.py` `Qwen3_5MoeForCausalLM`): Qwen3-Next's mixers,
/// the gated DeltaNet with four input projections (`in_proj_qkv`, `in_proj_z`, `in_proj_b`,
/// `in_proj_a`), M-RoPE tables per batch row; a dense SwiGLU on every layer (`qwen3_5_text`) or
/// Qwen3-Next's sparse block, its top-k always renormalised (`qwen3_5_moe_text`).
pub struct Qwen35 {
    /// `qwen3_5_moe_text` (else `qwen3_5_text`).
    pub moe: bool,
}

/// Qwen3.5-27B's language model: 64 layers of h 5120 (three gated DeltaNet layers, then one
/// gated attention layer, repeated), 24 query / 4 KV heads of 256 with a quarter rotary, DeltaNet
/// of 16 key heads × 128 and 48 value heads × 128, a dense SwiGLU of 17,408, vocab 248,320.
/// Its config.json names `"mamba_ssm_dtype": "float32"` (in `text_config`).
fn qwen35_27b() -> ModelSpec {
    let m = hybrid(Family::Qwen35Text, llama(248_320, 5120, 64, 24, 4, 17_408, 262_144), 16, 48, true);
    ModelSpec { ssm_dtype: StateDtype::Float32, ..m }
}

/// Qwen3.5-35B-A3B's language model: 40 layers of h 2048, 16 query / 2 KV heads of 256,
/// DeltaNet of 16 key heads × 128 and 32 value heads × 128, 256 experts (top 8) of 512 and a
/// gated shared expert of 512 on every layer; `"mamba_ssm_dtype": "float32"`, as the 27B.
fn qwen35_35b_a3b() -> ModelSpec {
    let m = hybrid(Family::Qwen35MoeText, llama(248_320, 2048, 40, 16, 2, 0, 262_144), 16, 32, true);
    ModelSpec { ssm_dtype: StateDtype::Float32, ..hybrid_moe(m, 256, 8) }
}

impl ConfigFile for Qwen35 {
    /// The multimodal checkpoints' `qwen3_5` / `qwen3_5_moe` (`Qwen3_5ForConditionalGeneration`):
    /// their `text_config`.
    fn wrappers(&self) -> &'static [&'static str] {
        if self.moe {
            &["qwen3_5_moe"]
        } else {
            &["qwen3_5"]
        }
    }
    /// `Qwen3_5TextConfig` / `Qwen3_5MoeTextConfig`: Llama's sizes, `head_dim`, the rotary
    /// fraction of `rope_parameters`, the gated DeltaNet's `linear_*` keys and `layer_types`;
    /// the MoE one its experts and shared expert.
    fn import(&self, t: &str, f: &Fields, notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        notes.push(TORCH_PATH.into());
        let moe = t == "qwen3_5_moe_text";
        let ffn = if moe { fields::Ffn::Optional } else { fields::Ffn::Required };
        let mut m = fields::llama_keys(f, ffn, false, 32_768)?;
        m.family = if moe { Family::Qwen35MoeText } else { Family::Qwen35Text };
        m.qkv_bias = f.flag("attention_bias", false)?;
        m.o_bias = m.qkv_bias;
        m.qk_norm = QkNorm::Head;
        if !f.flag("attn_output_gate", true)? {
            return Err(HfError::Field { key: "attn_output_gate", reason: "false is not modelled".into() });
        }
        m.attn_gate = true;
        m.rotary_pct = f.rotary_pct(0.25)?;
        m.gdn = gdn_keys(f, true)?;
        m.linear_layers = linear_layers(f, m.layers)?;
        m.ssm_dtype = f.state_dtype("mamba_ssm_dtype")?;
        if moe {
            m.fused_experts = true;
            m.experts = f.required(&["num_experts"])?;
            m.top_k = f.required(&["num_experts_per_tok"])?;
            m.expert_ffn = f.required(&["moe_intermediate_size"])?;
            m.moe_rule = LayerRule::All;
            m.dense_layers = 0;
            m.shared_ffn = f.uint_or("shared_expert_intermediate_size", 0)?;
            m.shared_experts = u64::from(m.shared_ffn > 0);
            m.shared_gate = m.shared_ffn > 0;
        }
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let moe = s.family == Family::Qwen35MoeText;
        let t = if moe { "qwen3_5_moe_text" } else { "qwen3_5_text" };
        let Some(mut w) = writer::llama_base(t, s, "hidden_act") else { return Vec::new() };
        let g = s.gdn;
        let types = layer_types(s);
        w.set("attention_bias", s.qkv_bias)
            .set("partial_rotary_factor", s.rotary_pct as f64 / 100.0)
            .set("linear_num_key_heads", g.k_heads)
            .set("linear_num_value_heads", g.v_heads)
            .set("linear_key_head_dim", g.k_dim)
            .set("linear_value_head_dim", g.v_dim)
            .set("linear_conv_kernel_dim", g.conv)
            .set(types.0, types.1);
        if moe {
            w.set("num_experts", s.experts)
                .set("num_experts_per_tok", s.top_k)
                .set("moe_intermediate_size", s.expert_ffn)
                .set("shared_expert_intermediate_size", s.shared_ffn);
        } else {
            w.set("intermediate_size", s.ffn);
        }
        write_ssm_dtype(&mut w, s);
        w.done().into_iter().collect()
    }
}

impl Modeling for Qwen35 {
    fn presets(&self) -> Vec<Preset> {
        let (order, id, checkpoint, spec) = if self.moe {
            (72, "qwen3.5-35b-a3b", "Qwen/Qwen3.5-35B-A3B", qwen35_35b_a3b())
        } else {
            (71, "qwen3.5-27b", "Qwen/Qwen3.5-27B", qwen35_27b())
        };
        vec![Preset::new(order, id, checkpoint, "Qwen3.5", spec).with_notes(&[TORCH_PATH])]
    }
    /// `Qwen3_5TextModel.forward` before the layers: the causal mask and the M-RoPE tables
    /// (`[b, s, d_rot]`).
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        let pos = super::common::cache_position(b);
        let mask = super::common::causal_mask(b, pos, attn);
        if !super::common::has_rope(spec) {
            return Shared { pos: Some(pos), mask, ..Shared::default() };
        }
        let full = mrope_shape(spec);
        let half =
            if super::common::rotary_dims(spec) == spec.head_dim { full.last(Dim::Half(Q::D)) } else { full.last(Dim::HalfX(X::DRot)) };
        let (cos, sin) = super::common::rotary_tables(b, pos, half, Some(full), true);
        Shared { cos: Some(cos), sin: Some(sin), pos: Some(pos), mask, ..Shared::default() }
    }
    fn rope_tables(&self, spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
        super::common::has_rope(spec).then(|| (mrope_shape(spec), Dt::Resid, true))
    }
    fn norm(&self) -> Norm {
        Norm::Rms(Rms::Gemma)
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_old_link_to_a_gated_deltanet_preset_reads_as_its_family() {
        let gdn = [Family::Qwen3Next, Family::Qwen35Text, Family::Qwen35MoeText];
        let presets: Vec<Preset> = crate::estimator::presets::presets().into_iter().filter(|p| gdn.contains(&p.spec.family)).collect();
        assert_eq!(presets.len(), 3);
        for p in presets {
            let old = ModelSpec { family: Family::Llama, ..p.spec.clone() };
            assert_eq!(crate::config::family_of_old_link(&old), p.spec.family, "{}", p.id);
        }
    }
}

#[cfg(test)]
mod debug {
    use crate::estimator::config::{Attention, Config, Kernels, Precision, Recompute};
    use crate::estimator::expr::numbers_only;
    use crate::estimator::params::Stage;
    use crate::estimator::precision::recipe;
    use crate::estimator::step::model::Setup;

    /// `GDN_RECORD=<record id> cargo test --lib gdn_dump -- --ignored --nocapture`: what each op
    /// of the program saves (by storage, first saver), to set beside the record's rows.
    #[test]
    #[ignore]
    fn gdn_dump() {
        let id = std::env::var("GDN_RECORD").unwrap_or_default();
        let fam = id.split('/').next().unwrap_or_default().to_string();
        let path = format!("{}/tests/fixtures/pytorch/records/{fam}.json", env!("CARGO_MANIFEST_DIR"));
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).expect("record")).expect("json");
        let r = doc["records"].as_array().expect("records").iter().find(|r| r["id"] == id.as_str()).expect("id");
        let imported = crate::estimator::hf::import_value(&doc["configs"][r["config_key"].as_str().expect("key")]).expect("import");
        let mut c = Config::default();
        crate::config::apply_import(&mut c, &imported);
        c.batch = r["batch"].as_u64().expect("b");
        c.seq = r["seq"].as_u64().expect("s");
        c.precision = match r["dtype"].as_str() {
            Some("fp32") => Precision::Fp32,
            Some("bf16") => Precision::Bf16,
            _ => Precision::AmpBf16,
        };
        c.attn = if r["attn"] == "eager" { Attention::Eager } else { Attention::Sdpa };
        c.recompute = if r["checkpointing"].as_bool().unwrap_or(false) { Recompute::Full } else { Recompute::None };
        c.kernels = Kernels::Cpu;
        numbers_only(|| {
            let rc = recipe(c.precision);
            let setup = Setup::new(&c, &rc, Stage::Whole);
            let prog = setup.whole();
            let mut seen = std::collections::HashSet::new();
            let mut total = 0u128;
            for op in &prog.ops {
                for s in prog.saved(op) {
                    let base = prog.tensors[s.t as usize].base;
                    let t = &prog.tensors[base as usize];
                    if matches!(t.origin, crate::estimator::step::ir::Origin::Param { .. }) {
                        continue;
                    }
                    if seen.insert(base) {
                        total += t.bytes;
                        println!("{:>3} {:40} {:28} {:>9} {:?}", op.layer, op.module, op.node, t.bytes, t.dtype);
                    }
                }
            }
            println!("total {total} want {}", r["saved_bytes"]);
        });
    }
}
