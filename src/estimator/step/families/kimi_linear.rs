//! Kimi Linear (`models/kimi_linear/modeling_kimi_linear.py`, transformers 5.24): decoder
//! layers whose token mixer is, by `layer_types`, either Kimi Delta Attention
//! (`linear_attention`: `KimiLinearDeltaAttention`, a gated DeltaNet whose forget gate decays
//! each key channel on its own) or DeepSeek-V2-style multi-head latent attention without any
//! rotary embedding (`full_attention`: `KimiLinearAttention`, [`super::deepseek::attention`]
//! with no rotary tables), followed by a dense SwiGLU (`mlp_layer_types` "dense") or
//! DeepSeek-V3's MoE block ([`super::sigmoid_moe`]: the fp32 sigmoid router with its
//! correction bias, renormalised by `moe_renormalize`, grouped_mm experts and shared experts).
//!
//! The KDA layer is built as transformers runs it without the `flash-linear-attention` and
//! `causal-conv1d` kernels (a CPU's path, which the fixtures measure): the q/k/v projections
//! concatenated through one depthwise causal `conv1d` and `silu`, the forget gate
//! (`KimiLinearForgetGate`: `f_b_proj(f_a_proj(x)) + dt_bias`, `-exp(A_log) ·
//! where(g > 20, g, log(1 + exp(g)))`), `beta = sigmoid(b_proj(x))`, the module-level
//! `chunk_kimi_delta_attention` (chunk C = 64, everything fp32: the l2norms, the padded chunks,
//! the per-channel decays `exp(g_i − g_j)` of `[b, H, n, C, C, K]`, the row-by-row forward
//! substitution, then the loop over the chunks carrying the `[b, H, K, K]` state), and the
//! sigmoid-gated RMSNorm (`KimiLinearRMSNormGated`) of `g_b_proj(g_a_proj(x))`, then `o_proj`.
//! What each op's node keeps is `validation/check_formulas.py` `kda_terms`. On `kernels = cuda`
//! the convolution and the chunked rule are the CUDA kernels' nodes instead ([`super::fla`]:
//! what `causal_conv1d_fn` and fla's `chunk_kda` keep, far less).
//!
//! The spec carries the KDA layer in [`Gdn`] with H key heads and H value heads of K
//! (`linear_num_heads`, `linear_head_dim`), so the step's gated DeltaNet sizes serve it; its
//! tensors are its own (`ModelSpec::tensors`).

use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Out, Shape, Split, Tid, B, S, X};
use super::common::{proj_or, Kind, Params, Shared};
use super::fla;
use super::mamba2::node;
use super::modeling::{ConfigFile, Modeling};
use super::qwen3_next::{dead_state_bmm, pad, req};
use super::sigmoid_moe::{fp32_param, router_normalized, RouterFn};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::model::{Gdn, LayerRule, Linear, ModelSpec, Positions, Router, KDA_DT_BIAS};
use crate::estimator::part::Part;
use crate::estimator::preset_base::Preset;
use serde_json::{Map, Value};

fn shape(ds: &[Dim]) -> Shape {
    Shape::new(ds, Split::None)
}
const BD: Dim = Dim::Q(Q::B);
const SD: Dim = Dim::Q(Q::S);
const HV: Dim = Dim::X(X::GdnVHeads);
const DK: Dim = Dim::X(X::GdnKDim);
const HK: Dim = Dim::X(X::GdnValueWidth);
const CD: Dim = Dim::X(X::GdnConvDim);
const CH: Dim = Dim::X(X::GdnChunk);
const NC: Dim = Dim::X(X::GdnChunks);
const SP: Dim = Dim::X(X::GdnPadded);
/// `KimiLinearForgetGate`'s softplus threshold: `where(g > 20, g, log(1 + exp(g)))`.
const SOFTPLUS_THRESHOLD: &str = "20";

/// What the estimate of a Kimi Linear model assumes (a preset's note, an import's).
pub const TORCH_PATH: &str =
    "the Kimi Delta Attention layers follow the kernels setting: kernels=cpu, transformers' torch fallback (what the \
     records measure); kernels=cuda, the flash-linear-attention and causal-conv1d kernels transformers calls when installed \
     (what they keep read from their sources, not measured on a GPU)";

/// The KDA layer's parameters in named-parameter order (`KimiLinearDeltaAttention.__init__`;
/// the forget gate's own `dt_bias` and `A_log` come before its projections).
pub struct KdaW {
    q: Option<Tid>,
    k: Option<Tid>,
    v: Option<Tid>,
    conv: Option<Tid>,
    dt_bias: Option<Tid>,
    a_log: Option<Tid>,
    f_a: Option<Tid>,
    f_b: Option<Tid>,
    b: Option<Tid>,
    g_a: Option<Tid>,
    g_b: Option<Tid>,
    o_norm: Option<Tid>,
    o: Option<Tid>,
}

impl KdaW {
    pub fn new(b: &mut Builder, p: &Params) -> KdaW {
        let w = |b: &mut Builder, n: &str| p.w(b, &format!("layers.*.linear_attn.{n}"));
        KdaW {
            q: w(b, "q_proj.weight"),
            k: w(b, "k_proj.weight"),
            v: w(b, "v_proj.weight"),
            conv: w(b, "conv1d.weight"),
            // `dt_bias` is kept in fp32 whatever the model dtype (`_keep_in_fp32_modules_strict`).
            dt_bias: fp32_param(b, p, KDA_DT_BIAS),
            a_log: w(b, "forget_gate.A_log"),
            f_a: w(b, "forget_gate.f_a_proj.weight"),
            f_b: w(b, "forget_gate.f_b_proj.weight"),
            b: w(b, "b_proj.weight"),
            g_a: w(b, "g_a_proj.weight"),
            g_b: w(b, "g_b_proj.weight"),
            o_norm: w(b, "o_norm.weight"),
            o: w(b, "o_proj.weight"),
        }
    }
}

/// A linear of the layer (module `module`) into `[b, s, width]`.
fn lin(b: &mut Builder, x: Tid, w: Option<Tid>, width: Dim, module: &'static str, l: Linear) -> Tid {
    b.module = module;
    b.part = Part::AttentionInputs;
    let y = proj_or(b, x, w, None, shape(&[BD, SD, width]), l);
    b.module = "self_attn";
    b.part = Part::AttentionCore;
    y
}

/// `a - b` with broadcasting into `to` (SubBackward0: `other`'s gradient `-grad`, then each
/// broadcast input's `sum` to its shape, the full temporary freed).
fn sub_to(b: &mut Builder, a: Tid, o: Tid, to: Shape) -> Tid {
    let (ra, ro) = (b.rg(a), b.rg(o));
    let dt = b.promote(a, o, a);
    let out = b.out(to, dt, ra || ro);
    let full = b.bytes_of(&to, dt);
    let dtype = b.dtype(dt);
    let mut bw: Vec<B> = Vec::new();
    if ro {
        bw.push(B::Alloc { bytes: full, dtype, op: "neg" });
    }
    bw.push(B::Apply);
    let mut t = u8::from(ro);
    if ra {
        bw.push(B::Alloc { bytes: b.grad_bytes(a), dtype, op: "sum" });
        bw.push(B::Grad { input: 0, temp: t });
        t += 1;
    }
    if ro {
        bw.push(B::Alloc { bytes: b.grad_bytes(o), dtype, op: "sum" });
        bw.push(B::Free(0));
        bw.push(B::Grad { input: 1, temp: t });
    }
    let bw = if ra || ro { bw } else { Vec::new() };
    b.op("sub", "SubBackward0", &[a, o], &[out], &[], &bw)[0]
}

/// `a / d` with `d` broadcast over the last dim: DivBackward0 keeps both
/// ([`Builder::div_backward`]).
fn div(b: &mut Builder, a: Tid, d: Tid) -> Tid {
    let (shp, dt) = (b.shape(a), b.t(a).dt);
    let out = b.out(shp, dt, b.rg(a) || b.rg(d));
    let bw = b.div_backward(a, d);
    b.op("div", "DivBackward0", &[a, d], &[out], &[S::In(0), S::In(1)], &bw)[0]
}

/// `x.masked_fill(mask, v)`: MaskedFillBackward0 keeps the mask; backward one `masked_fill`.
fn masked_fill(b: &mut Builder, x: Tid, mask: Tid) -> Tid {
    let (shp, dt, rg, bytes, dtype) = (b.shape(x), b.t(x).dt, b.rg(x), b.bytes(x), b.t(x).dtype);
    let out = b.out(shp, dt, rg);
    let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "masked_fill" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    b.op("masked_fill", "MaskedFillBackward0", &[x, mask], &[out], if rg { &[S::In(1)] } else { &[] }, bw)[0]
}

/// `x[idx] = src` in place through a view (CopySlices over CopyBackwards): no allocation
/// forward; backward the base's gradient is copied whole (`new_empty_strided`), the slice's
/// gradient cloned for `src`, and the slice zeroed in the copy (`zeros_like`, copied in).
fn copy_into(b: &mut Builder, base: Tid, src: Tid) -> Tid {
    let shp = b.shape(base);
    let (full, dtype, part) = (b.bytes(base), b.t(base).dtype, b.bytes(src));
    let base_rg = b.rg(base);
    let rg = base_rg || b.rg(src);
    let out = Out { shape: shp, dt: b.t(base).dt, view_of: Some(base), requires_grad: rg };
    let mut bw = vec![B::Alloc { bytes: full, dtype, op: "new_empty_strided" }, B::Alloc { bytes: part, dtype, op: "clone" }];
    if base_rg {
        bw.extend([B::Alloc { bytes: part, dtype, op: "zeros_like" }, B::Free(2), B::Grad { input: 0, temp: 0 }]);
    } else {
        bw.push(B::Free(0));
    }
    bw.push(B::Grad { input: 1, temp: 1 });
    b.op("copy_", "CopySlices", &[base, src], &[out], &[], if rg { &bw } else { &[] })[0]
}

/// `l2norm(x)` (`modeling_kimi_linear.py`): `x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) +
/// eps)` — the square keeps x, the sqrt its result, the division x and the sqrt.
fn l2norm(b: &mut Builder, x: Tid) -> Tid {
    let shp = b.shape(x);
    let sq = b.mul_to(x, x, shp, Dt::F32);
    let s = node(b, "sum", "SumBackward1", &[sq], shp.last(Dim::N(1)), Dt::F32, &[]);
    let e = b.add_scalar(s);
    let r = b.unary("sqrt", "SqrtBackward0", e, Keep::Output, "div");
    div(b, x, r)
}

/// The last chunk's state update, built as the dead graph it is (the final state is discarded)
/// where its nodes' packs count (activation offloading, [`Builder::dead_save`]):
/// ```python
/// state = state * g_i[:, :, -1].exp().unsqueeze(-1) + (k_i * (g_i[:, :, -1:] - g_i).exp()).transpose(-1, -2) @ v_new
/// ```
/// ExpBackward0 keeps each result; MulBackward0 the state (the decay too when the state has a
/// gradient, after the first chunk) and both factors of the decayed key; the transposed key
/// folds into `bmm`'s layout as a view (its batch dims are contiguous) and BmmBackward0 keeps
/// both operands: per layer `[b, H, K]` + `[b, H, K, K]` + 5 × `[b, H, C, K]`, fp32. `rg`:
/// whether the decays and the key require a gradient.
fn dead_update(b: &mut Builder, state: Tid, g_i: Tid, k_i: Tid, v_new: Tid, rg: [bool; 2]) {
    let [rgg, rgk] = rg;
    let (rs, rv) = (b.rg(state), b.rg(v_new));
    let view = |b: &mut Builder, x: Tid, to: Shape| b.op("view", "", &[x], &[b.view_out(x, to)], &[], &[])[0];
    let sshape = b.shape(state);
    let sdt = b.t(state).dt;
    let gl = view(b, g_i, shape(&[BD, HV, DK]));
    let gle = b.plain("exp", &[gl], shape(&[BD, HV, DK]), Dt::F32);
    b.dead_save(gle, rgg);
    let gleu = view(b, gle, shape(&[BD, HV, DK, Dim::N(1)]));
    let sd = b.plain("mul", &[state, gleu], sshape, sdt);
    // MulBackward0's saved variables: `other` (for self's gradient), `self` (for other's).
    b.dead_save(gleu, rs);
    b.dead_save(state, rgg);
    let gl1 = view(b, g_i, shape(&[BD, HV, Dim::N(1), DK]));
    let kd = b.plain("sub", &[gl1, g_i], shape(&[BD, HV, CH, DK]), Dt::F32);
    let kde = b.plain("exp", &[kd], shape(&[BD, HV, CH, DK]), Dt::F32);
    b.dead_save(kde, rgg);
    let kk = b.plain("mul", &[k_i, kde], shape(&[BD, HV, CH, DK]), Dt::F32);
    b.dead_save(kde, rgk);
    b.dead_save(k_i, rgg);
    let kt = view(b, kk, shape(&[BD, HV, DK, CH]));
    let upd = b.plain("bmm", &[kt, v_new], sshape, sdt);
    // BmmBackward0's saved variables: `mat2` (for self's gradient), `self` (for mat2's).
    b.dead_save(v_new, rgk || rgg);
    b.dead_save(kt, rv);
    b.plain("add", &[sd, upd], sshape, sdt);
}

/// `chunk_kimi_delta_attention(query, key, value, g, beta, use_qk_l2norm_in_kernel=True)` (no
/// initial state, the final state discarded) on q, k, v and g `[b, s, H, K]`, beta `[b, s, H]`:
/// the output `[b, s, H, K]` in the input's dtype. Everything inside runs in fp32; under
/// autocast each matmul casts its operands to bf16.
fn chunk_kda(b: &mut Builder, q: Tid, k: Tid, v: Tid, g: Tid, beta: Tid) -> Tid {
    let in_dt = b.t(v).dt;
    let s = b.c.n(Q::S);
    let c = Gdn::CHUNK;
    let n = s.div_ceil(c).max(1);
    let bhs = |d: Dim| shape(&[BD, HV, SD, d]);
    let bhp = |d: Dim| shape(&[BD, HV, SP, d]);
    let chunked = |d: Dim| shape(&[BD, HV, NC, CH, d]);
    let per = |d: Dim| shape(&[BD, HV, CH, d]);
    let pairs = shape(&[BD, HV, NC, CH, CH, DK]);
    let attn_shape = shape(&[BD, HV, NC, CH, CH]);
    // x.transpose(1, 2).contiguous().to(torch.float32)
    let tr = |b: &mut Builder, x: Tid, to: Shape| {
        let t = b.view(x, to, "TransposeBackward0", false);
        let c = b.copy(t, to);
        b.to_copy(c, Dt::F32)
    };
    let qf = tr(b, q, bhs(DK));
    let kf = tr(b, k, bhs(DK));
    let vf = tr(b, v, bhs(DK));
    let betaf = tr(b, beta, shape(&[BD, HV, SD]));
    let gf = tr(b, g, bhs(DK));
    let qn = l2norm(b, qf);
    let kn = l2norm(b, kf);
    // F.pad to s_p = n·C (new tensors even when nothing is padded); the query scaled after.
    let qp = pad(b, qn, bhp(DK));
    let qs = b.mul_scalar(qp);
    let kp = pad(b, kn, bhp(DK));
    let vp = pad(b, vf, bhp(DK));
    let gp = pad(b, gf, bhp(DK));
    let bp = pad(b, betaf, shape(&[BD, HV, SP]));
    let bu = b.view(bp, bhp(Dim::N(1)), "UnsqueezeBackward0", false);
    let v_beta = b.mul_to(vp, bu, bhp(DK), Dt::F32);
    let k_beta = b.mul_to(kp, bu, bhp(DK), Dt::F32);
    // reshape into chunks (views)
    let qc = b.view(qs, chunked(DK), "ViewBackward0", false);
    let kc = b.view(kp, chunked(DK), "ViewBackward0", false);
    let kbc = b.view(k_beta, chunked(DK), "ViewBackward0", false);
    let vbc = b.view(v_beta, chunked(DK), "ViewBackward0", false);
    let gc = b.view(gp, chunked(DK), "ViewBackward0", false);
    let cum = node(b, "cumsum", "CumsumBackward0", &[gc], chunked(DK), Dt::F32, &[]);
    let ones = b.plain("ones", &[], shape(&[CH, CH]), Dt::Bool);
    let mask = b.plain("triu", &[ones], shape(&[CH, CH]), Dt::Bool);
    let strict = b.plain("triu", &[mask], shape(&[CH, CH, Dim::N(1)]), Dt::Bool);
    // decay_mask = (g.unsqueeze(-2) - g.unsqueeze(-3)).masked_fill(strictly_upper[..., None], -inf).exp()
    let gi = b.view(cum, shape(&[BD, HV, NC, CH, Dim::N(1), DK]), "UnsqueezeBackward0", false);
    let gj = b.view(cum, shape(&[BD, HV, NC, Dim::N(1), CH, DK]), "UnsqueezeBackward0", false);
    let diff = sub_to(b, gi, gj, pairs);
    let filled = masked_fill(b, diff, strict);
    let decay = b.unary("exp", "ExpBackward0", filled, Keep::Output, "mul");
    // attn = -(k_beta.unsqueeze(-2) * key.unsqueeze(-3) * decay_mask).sum(-1).masked_fill(mask, 0)
    let kbu = b.view(kbc, shape(&[BD, HV, NC, CH, Dim::N(1), DK]), "UnsqueezeBackward0", false);
    let ku = b.view(kc, shape(&[BD, HV, NC, Dim::N(1), CH, DK]), "UnsqueezeBackward0", false);
    let p1 = b.mul_to(kbu, ku, pairs, Dt::F32);
    let p2 = b.mul_to(p1, decay, pairs, Dt::F32);
    let sm = b.sum_dim(p2, attn_shape);
    let ng = b.unary("neg", "NegBackward0", sm, Keep::Nothing, "neg");
    let mut attn = masked_fill(b, ng, mask);
    // The forward substitution, row by row, in place:
    // row = attn[..., i, :i].clone(); sub = attn[..., :i, :i].clone()
    // attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
    for i in 1..c as u32 {
        let sel = b.slice(attn, shape(&[BD, HV, NC, CH]));
        let rs = b.slice(sel, shape(&[BD, HV, NC, Dim::N(i)]));
        let row = b.copy(rs, shape(&[BD, HV, NC, Dim::N(i)]));
        let top = b.slice(attn, shape(&[BD, HV, NC, Dim::N(i), CH]));
        let ss = b.slice(top, shape(&[BD, HV, NC, Dim::N(i), Dim::N(i)]));
        let sub = b.copy(ss, shape(&[BD, HV, NC, Dim::N(i), Dim::N(i)]));
        let ru = b.view(row, shape(&[BD, HV, NC, Dim::N(i), Dim::N(1)]), "UnsqueezeBackward0", false);
        let prod = b.mul_to(ru, sub, shape(&[BD, HV, NC, Dim::N(i), Dim::N(i)]), Dt::F32);
        let red = b.sum_dim(prod, shape(&[BD, HV, NC, Dim::N(i)]));
        let new = b.add(row, red);
        attn = copy_into(b, attn, new);
    }
    let eye = b.plain("eye", &[], shape(&[CH, CH]), Dt::F32);
    let attn = b.add(attn, eye);
    let value = b.bmm(attn, vbc, chunked(DK));
    let ge = b.unary("exp", "ExpBackward0", cum, Keep::Output, "mul");
    let kbg = b.mul_to(kbc, ge, chunked(DK), Dt::F32);
    let k_cumdecay = b.bmm(attn, kbg, chunked(DK));
    // The loop over the chunks: the state starts at zeros (no gradient); the last chunk's
    // update feeds only the discarded final state (a dead graph, freed at once: not built).
    // Both in `value`'s dtype: bf16 under autocast (its `bmm`'s output).
    let vdt = b.t(value).dt;
    let mut state = b.plain("zeros", &[], shape(&[BD, HV, DK, DK]), vdt);
    let mut out = b.plain("zeros_like", &[], chunked(DK), vdt);
    let ones2 = b.plain("ones", &[], shape(&[CH, CH]), Dt::Bool);
    let mask2 = b.plain("triu", &[ones2], shape(&[CH, CH]), Dt::Bool);
    let mut kept: Vec<Tid> = Vec::new();
    for i in 0..n {
        let q_i = b.slice(qc, per(DK));
        let k_i = b.slice(kc, per(DK));
        let v_i = b.slice(value, per(DK));
        let g_i = b.slice(cum, per(DK));
        // attn_inter = (q_i * g_i.exp()) @ state
        let gie = b.unary("exp", "ExpBackward0", g_i, Keep::Output, "mul");
        let qg = b.mul_to(q_i, gie, per(DK), Dt::F32);
        let inter = b.bmm(qg, state, per(DK));
        // attn_intra = (q_i.unsqueeze(-2) * k_i.unsqueeze(-3) * decay_mask[:, :, i]).sum(-1).masked_fill(mask, 0)
        let one = shape(&[BD, HV, CH, CH, DK]);
        let qiu = b.view(q_i, shape(&[BD, HV, CH, Dim::N(1), DK]), "UnsqueezeBackward0", false);
        let kiu = b.view(k_i, shape(&[BD, HV, Dim::N(1), CH, DK]), "UnsqueezeBackward0", false);
        let pi1 = b.mul_to(qiu, kiu, one, Dt::F32);
        let dm = b.slice(decay, one);
        let pi2 = b.mul_to(pi1, dm, one, Dt::F32);
        let ps = b.sum_dim(pi2, shape(&[BD, HV, CH, CH]));
        let intra = masked_fill(b, ps, mask2);
        // v_new = v_i - k_cumdecay[:, :, i] @ state
        let kcd_i = b.slice(k_cumdecay, per(DK));
        let vpr = b.bmm(kcd_i, state, per(DK));
        let v_new = sub_to(b, v_i, vpr, per(DK));
        // core_attn_out[:, :, i] = attn_inter + attn_intra @ v_new
        let local = b.bmm(intra, v_new, per(DK));
        let o_i = b.add(inter, local);
        out = copy_into(b, out, o_i);
        kept.extend([q_i, k_i, v_i, g_i, gie, qg, inter, intra, vpr, v_new, local, o_i]);
        if i + 1 < n {
            // state = state * g_i[:, :, -1].exp().unsqueeze(-1)
            //         + (k_i * (g_i[:, :, -1:] - g_i).exp()).transpose(-1, -2) @ v_new
            let gl = b.slice(g_i, shape(&[BD, HV, DK]));
            let gle = b.unary("exp", "ExpBackward0", gl, Keep::Output, "mul");
            let gleu = b.view(gle, shape(&[BD, HV, DK, Dim::N(1)]), "UnsqueezeBackward0", false);
            let sd = b.mul_to(state, gleu, shape(&[BD, HV, DK, DK]), Dt::F32);
            let gl1 = b.slice(g_i, shape(&[BD, HV, Dim::N(1), DK]));
            let kd = sub_to(b, gl1, g_i, per(DK));
            let kde = b.unary("exp", "ExpBackward0", kd, Keep::Output, "mul");
            let kk = b.mul_to(k_i, kde, per(DK), Dt::F32);
            let kt = b.view(kk, shape(&[BD, HV, DK, CH]), "TransposeBackward0", false);
            let upd = b.bmm(kt, v_new, shape(&[BD, HV, DK, DK]));
            b.hold(state);
            state = b.add(sd, upd);
        } else if b.dead_graphs {
            let rg = [b.rg(cum), b.rg(kc)];
            dead_update(b, state, g_i, k_i, v_new, rg);
        } else {
            kept.extend(dead_state_bmm(b, v_new, shape(&[BD, HV, DK, DK])));
        }
    }
    for t in kept {
        b.hold(t);
    }
    // core_attn_out.reshape(b, H, s_p, K)[:, :, :s].transpose(1, 2).contiguous().to(dtype)
    let flat = b.view(out, bhp(DK), "ViewBackward0", false);
    let sl = if s.is_multiple_of(c) { flat } else { b.slice(flat, bhs(DK)) };
    let t = b.view(sl, shape(&[BD, SD, HV, DK]), "TransposeBackward0", false);
    let y = b.copy(t, shape(&[BD, SD, HV, DK]));
    let y = b.to_copy(y, in_dt);
    // The function's locals live until it returns.
    for t in [qs, kp, vp, gp, bp, v_beta, k_beta, cum, mask, strict, decay, attn, value, k_cumdecay, state, out, mask2] {
        b.hold(t);
    }
    y
}

/// `KimiLinearRMSNormGated.forward(core_attn_out, gate)` on `[b, s, H, K]` rows, a strict fp32
/// norm with a sigmoid gate:
/// ```python
/// hidden_states = hidden_states.to(torch.float32)
/// variance = hidden_states.pow(2).mean(-1, keepdim=True)
/// hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
/// hidden_states = self.weight.to(torch.float32) * hidden_states
/// hidden_states = hidden_states * torch.sigmoid(gate.to(torch.float32))
/// return hidden_states.to(input_dtype)
/// ```
fn gated_norm(b: &mut Builder, w: Option<Tid>, x: Tid, gate: Tid) -> Tid {
    b.module = "self_attn.o_norm";
    let in_dt = b.t(x).dt;
    let x32 = b.to_copy(x, Dt::F32);
    let sq = b.pow(x32);
    let var = b.mean_last(sq);
    let ve = b.add_scalar(var);
    let r = b.rsqrt(ve);
    let n32 = b.mul(x32, r);
    let wn = match w {
        Some(w) => {
            let w32 = b.to_copy(w, Dt::F32);
            b.mul(w32, n32)
        }
        None => n32,
    };
    let g32 = b.to_copy(gate, Dt::F32);
    let sg = b.unary("sigmoid", "SigmoidBackward0", g32, Keep::Output, "sigmoid_backward");
    let shp = b.shape(x);
    let y = b.mul_to(wn, sg, shp, Dt::F32);
    let o = b.to_copy(y, in_dt);
    for t in [var, y] {
        b.hold(t);
    }
    b.module = "self_attn";
    o
}

/// `KimiLinearForgetGate.forward(x)`: the per-channel log-decay `[b, s, H, K]` in fp32.
/// ```python
/// forget_gate = self.f_b_proj(self.f_a_proj(hidden_states))
/// g = (forget_gate.float() + self.dt_bias.float().view(1, 1, -1)).view(hidden_shape)
/// decay_rate = torch.exp(self.A_log.float())
/// g_softplus = torch.where(g > 20.0, g, torch.log(1.0 + torch.exp(g)))
/// return -decay_rate * g_softplus
/// ```
fn forget_gate(b: &mut Builder, w: &KdaW, x: Tid) -> Tid {
    let fa = lin(b, x, w.f_a, DK, "self_attn.forget_gate.f_a_proj", Linear::Qkv);
    let fb = lin(b, fa, w.f_b, HK, "self_attn.forget_gate.f_b_proj", Linear::Qkv);
    b.module = "self_attn.forget_gate";
    let f32 = b.to_copy(fb, Dt::F32);
    let dtb = req(b, w.dt_bias);
    let g = b.add(f32, dtb);
    let g = b.view(g, shape(&[BD, SD, HV, DK]), "ViewBackward0", false);
    let alog = req(b, w.a_log);
    let af = b.to_copy(alog, Dt::F32);
    let rate = b.unary("exp", "ExpBackward0", af, Keep::Output, "mul");
    let _ = SOFTPLUS_THRESHOLD;
    let gshape = b.shape(g);
    let cond = b.plain("gt", &[g], gshape, Dt::Bool);
    let e = b.unary("exp", "ExpBackward0", g, Keep::Output, "mul");
    let e1 = b.add_scalar(e);
    let lg = b.unary("log", "LogBackward0", e1, Keep::Input, "div");
    // torch.where(cond, g, log(...)): WhereBackward0 keeps the condition; backward one `where`
    // per input (the log's first, as the node lists its inputs last to first).
    let (bytes, dtype) = (b.bytes(g), b.t(g).dtype);
    let out = b.out(gshape, Dt::F32, true);
    let bw = [
        B::Alloc { bytes, dtype, op: "where" },
        B::Alloc { bytes, dtype, op: "where" },
        B::Grad { input: 1, temp: 0 },
        B::Grad { input: 2, temp: 1 },
    ];
    let sp = b.op("where", "WhereBackward0", &[cond, g, lg], &[out], &[S::In(0)], &bw)[0];
    let neg = b.unary("neg", "NegBackward0", rate, Keep::Nothing, "neg");
    let y = b.mul_to(neg, sp, gshape, Dt::F32);
    for t in [fa, fb, f32, g, alog, af, rate, cond, e, e1, lg, sp] {
        b.hold(t);
    }
    y
}

/// `KimiLinearDeltaAttention.forward` (no cache, no padding mask) on the input norm's output.
pub fn kda(b: &mut Builder, w: &KdaW, x: Tid) -> Tid {
    b.module = "self_attn";
    b.part = Part::AttentionCore;
    let tok = |d: Dim| shape(&[BD, SD, d]);
    // mixed_qkv = torch.cat([q_proj(x), k_proj(x), v_proj(x)], dim=-1).transpose(1, 2)
    let q = lin(b, x, w.q, HK, "self_attn.q_proj", Linear::Q);
    let k = lin(b, x, w.k, HK, "self_attn.k_proj", Linear::K);
    let v = lin(b, x, w.v, HK, "self_attn.v_proj", Linear::V);
    let rg = b.rg(q) || b.rg(k) || b.rg(v);
    let o = b.out(tok(CD), b.t(q).dt, rg);
    let pass: &[B] = &[B::Pass { input: 0, output: 0 }, B::Pass { input: 1, output: 0 }, B::Pass { input: 2, output: 0 }];
    let mixed = b.op("cat", "CatBackward0", &[q, k, v], &[o], &[], if rg { pass } else { &[] })[0];
    let mt = b.view(mixed, shape(&[BD, CD, SD]), "TransposeBackward0", false);
    // causal_conv1d_fn: F.conv1d(x.to(weight.dtype), weight.unsqueeze(1), padding=Kc - 1,
    // groups=3HK)[:, :, :s], then silu, then .to(x.dtype)
    let cw = req(b, w.conv);
    // With causal-conv1d (kernels = cuda) one fused node keeping only its input
    // ([`fla::causal_conv1d`]); the fallback casts, convolves, slices, applies SiLU and casts back.
    let (xw, conv, act) = if b.c.cuda {
        let act = fla::causal_conv1d(b, mt, cw);
        (act, act, act)
    } else {
        let wdt = b.t(cw).dt;
        let xw = b.to_copy(mt, wdt);
        let xin = b.autocast_in(xw);
        let cw = if b.autocast { b.cast_weight(cw) } else { cw };
        let cdt = b.t(xin).dt;
        let conv =
            node(b, "convolution", "ConvolutionBackward0", &[xin, cw], shape(&[BD, CD, Dim::X(X::GdnConvLen)]), cdt, &[S::In(0), S::In(1)]);
        let sl = b.slice(conv, shape(&[BD, CD, SD]));
        let act = b.unary("silu", "SiluBackward0", sl, Keep::Input, "silu_backward");
        (xw, conv, b.to_copy(act, b.t(mt).dt))
    };
    let at = b.view(act, tok(CD), "TransposeBackward0", false);
    let outs: Vec<Out> = [HK, HK, HK].iter().map(|&d| b.view_out(at, tok(d))).collect();
    let (bytes, dtype, rg) = (b.bytes(at), b.t(at).dtype, b.rg(at));
    let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "cat" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    let [qq, kk, vv, _] = b.op("split_with_sizes", "SplitWithSizesBackward0", &[at], &outs, &[], bw);
    let heads = shape(&[BD, SD, HV, DK]);
    let qq = b.view(qq, heads, "ViewBackward0", false);
    let kk = b.view(kk, heads, "ViewBackward0", false);
    let vv = b.view(vv, heads, "ViewBackward0", false);
    // g = self.forget_gate(x); beta = torch.sigmoid(self.b_proj(x))
    let g = forget_gate(b, w, x);
    let bl = lin(b, x, w.b, HV, "self_attn.b_proj", Linear::Qkv);
    let beta = b.unary("sigmoid", "SigmoidBackward0", bl, Keep::Output, "sigmoid_backward");
    let core = if b.c.cuda { fla::chunk_delta_rule(b, fla::Rule::Kda, qq, kk, vv, g, beta) } else { chunk_kda(b, qq, kk, vv, g, beta) };
    b.module = "self_attn";
    // gate = self.g_b_proj(self.g_a_proj(x)).view(hidden_shape)
    let ga = lin(b, x, w.g_a, DK, "self_attn.g_a_proj", Linear::Qkv);
    let gb = lin(b, ga, w.g_b, HK, "self_attn.g_b_proj", Linear::Qkv);
    let gate = b.view(gb, heads, "ViewBackward0", false);
    let normed = gated_norm(b, w.o_norm, core, gate);
    let flat = b.view(normed, tok(HK), "ViewBackward0", false);
    b.module = "self_attn.o_proj";
    b.part = Part::AttentionInputs;
    let out = proj_or(b, flat, w.o, None, Shape::tok(Q::H), Linear::O);
    for t in [mixed, xw, conv, act, qq, kk, vv, g, bl, beta, core, ga, gate, normed] {
        b.hold(t);
    }
    out
}

/// One decoder layer (`KimiLinearDecoderLayer.forward`): the token mixer (KDA or NoPE MLA, by
/// `layer_types`), then the dense MLP or the MoE block (by `mlp_layer_types`).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    let r: RouterFn = router_normalized;
    if sh.linear {
        let w = KdaW::new(b, p);
        super::sigmoid_moe::layer(b, p, spec, x, kind, |b, n| (kda(b, &w, n), None), r)
    } else {
        super::deepseek::layer(b, p, spec, x, sh, kind, attn, r)
    }
}

/// `layer_types` (or the checkpoint's `linear_attn_config` `kda_layers` / `full_attn_layers`,
/// 1-indexed) as the KDA layers; absent, `KimiLinearConfig`'s default: every layer but each
/// 4th from layer 4 (`i and i % 4 == 0`) is KDA.
fn kda_layers(f: &Fields, layers: u64) -> Result<LayerRule, HfError> {
    const KEY: &str = "layer_types";
    let mut flags: Vec<bool> = (0..layers).map(|i| !(i > 0 && i % 4 == 0)).collect();
    if let Some(v) = f.get(KEY) {
        let items = v.as_array().ok_or(HfError::Type { key: KEY, expected: "a list of layer types" })?;
        if items.len() as u64 != layers {
            return Err(HfError::Field { key: KEY, reason: format!("lists {} layers for {} num_hidden_layers", items.len(), layers) });
        }
        flags = items
            .iter()
            .map(|t| match t.as_str() {
                Some("linear_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                Some(other) => Err(HfError::Field {
                    key: KEY,
                    reason: format!("layer type `{other}` is not modelled (linear_attention and full_attention are)"),
                }),
                None => Err(HfError::Type { key: KEY, expected: "a list of layer types" }),
            })
            .collect::<Result<_, _>>()?;
    } else if let Some(cfg) = f.get("linear_attn_config") {
        const SUB: &str = "linear_attn_config";
        let list = |k: &str| -> Option<Vec<u64>> { cfg.get(k)?.as_array()?.iter().map(Value::as_u64).collect() };
        if let (Some(full), Some(kda)) = (list("full_attn_layers"), list("kda_layers")) {
            for (set, on) in [(full, false), (kda, true)] {
                for l in set {
                    let i = l.checked_sub(1).filter(|&i| i < layers).ok_or(HfError::Field {
                        key: SUB,
                        reason: format!("layer {l} is outside 1..={layers} (the lists are 1-indexed)"),
                    })?;
                    flags[i as usize] = on;
                }
            }
        }
    }
    Ok(LayerRule::from_flags(&flags))
}

/// `mlp_layer_types` (`dense` / `sparse`), else `first_k_dense_replace` (1) dense layers: the
/// first `k` layers dense and every later one MoE as `dense_layers` when the dense layers lead,
/// else the MoE layers as `moe_rule`.
fn moe_layers(f: &Fields, m: &mut ModelSpec) -> Result<(), HfError> {
    const KEY: &str = "mlp_layer_types";
    let sparse: Vec<bool> = match f.get(KEY) {
        Some(v) => {
            let items = v.as_array().ok_or(HfError::Type { key: KEY, expected: "a list of MLP types" })?;
            if items.len() as u64 != m.layers {
                return Err(HfError::Field {
                    key: KEY,
                    reason: format!("lists {} layers for {} num_hidden_layers", items.len(), m.layers),
                });
            }
            items
                .iter()
                .map(|t| match t.as_str() {
                    Some("sparse") => Ok(true),
                    Some("dense") => Ok(false),
                    _ => Err(HfError::Type { key: KEY, expected: "a list of \"dense\" / \"sparse\"" }),
                })
                .collect::<Result<_, _>>()?
        }
        None => {
            let k = f.uint_or("first_k_dense_replace", 1)?;
            (0..m.layers).map(|i| i >= k).collect()
        }
    };
    let lead = sparse.iter().take_while(|s| !**s).count() as u64;
    if sparse.iter().skip(lead as usize).all(|s| *s) {
        m.dense_layers = lead;
        m.moe_rule = LayerRule::All;
    } else {
        m.dense_layers = 0;
        m.moe_rule = LayerRule::from_flags(&sparse);
    }
    Ok(())
}

/// The KDA sizes: `linear_num_heads` / `linear_head_dim` / `linear_conv_kernel_dim`, or the
/// checkpoint's `linear_attn_config` (`num_heads`, `head_dim`, `short_conv_kernel_size`), which
/// `KimiLinearConfig.__post_init__` reads over them.
fn kda_keys(f: &Fields) -> Result<Gdn, HfError> {
    let sub = f.get("linear_attn_config");
    let from_sub = |k: &str| sub.and_then(|c| c.get(k)).and_then(Value::as_u64);
    let heads = match from_sub("num_heads") {
        Some(v) => v,
        None => f.size("linear_num_heads", 32)?,
    };
    let dim = match from_sub("head_dim") {
        Some(v) => v,
        None => f.size("linear_head_dim", 128)?,
    };
    let conv = match from_sub("short_conv_kernel_size") {
        Some(v) => v,
        None => f.size("linear_conv_kernel_dim", 4)?,
    };
    if heads == 0 || dim == 0 {
        return Err(HfError::Model("Kimi Delta Attention needs at least one head of at least one dim".into()));
    }
    Ok(Gdn { k_heads: heads, v_heads: heads, k_dim: dim, v_dim: dim, conv, split: false })
}

/// Kimi-Linear-48B-A3B (`moonshotai/Kimi-Linear-48B-A3B-Instruct`): 27 layers of h 2304, KDA
/// (32 heads of 128, conv 4) on 20 of them and NoPE MLA (32 heads, q_proj without compression,
/// r_kv 512, d_nope 128 + d_r 64, d_v 128) on layers 4, 8, …, 24 and 27 (1-indexed), a dense
/// SwiGLU of 9,216 on layer 1 and 256 experts (top 8) of 1,024 plus one shared on the others,
/// vocab 163,840, untied. 49,122,675,072 parameters in 511 tensors (transformers 5.24 on the
/// meta device): embeddings and head 2 × 377,487,360; per KDA layer q/k/v/o 4 × 9,437,184,
/// conv 49,152, gates f/g a+b 2 × 819,200, dt_bias 4,096, A_log 32, b_proj 73,728, o_norm 128
/// (39,514,272 × 20); per MLA layer q_proj 14,155,776, kv_a 1,327,104, its norm 512, kv_b
/// 4,194,304, o_proj 9,437,184 (29,114,880 × 7); the dense MLP 63,700,992; per MoE layer
/// experts 1,811,939,328, router 589,824, shared 7,077,888 (1,819,607,040 × 26); norms
/// 2 × 2,304 × 27 + 2,304.
fn kimi_linear_48b() -> ModelSpec {
    // DeepSeek-V3's MLA (r_kv 512, d_nope 128 + d_r 64, d_v 128) and MoE (top 8 of 256, one
    // shared, fp32 sigmoid router) at Kimi's sizes, q_proj uncompressed and no rotary anywhere.
    let mut m = super::deepseek::deepseek_v3(163_840, 32, 256, 1, 1, 1, 1_048_576);
    m.family = Family::KimiLinear;
    (m.hidden, m.layers, m.ffn, m.q_lora_rank, m.expert_ffn, m.shared_ffn) = (2304, 27, 9216, 0, 1024, 1024);
    m.positions = Positions::None;
    m.gdn = Gdn { k_heads: 32, v_heads: 32, k_dim: 128, v_dim: 128, conv: 4, split: false };
    let full = [3u64, 7, 11, 15, 19, 23, 26];
    m.linear_layers = LayerRule::from_flags(&(0..27).map(|i| !full.contains(&i)).collect::<Vec<_>>());
    m
}

/// DeepSeek-V3's configuration keys as `KimiLinearConfig` names them (its `attribute_map`).
const KIMI_NAMES: [(&str, &str); 5] = [
    ("max_position_embeddings", "model_max_length"),
    ("n_routed_experts", "num_experts"),
    ("num_experts_per_tok", "num_experts_per_token"),
    ("n_shared_experts", "num_shared_experts"),
    ("n_group", "num_expert_group"),
];

/// Kimi Linear: KDA and NoPE MLA layers, DeepSeek-V3's MoE.
pub struct KimiLinear;
impl ConfigFile for KimiLinear {
    /// `KimiLinearConfig` (DeepSeek-V3's configuration with Kimi's `attribute_map`:
    /// `num_experts`, `num_experts_per_token`, `num_shared_experts`, `num_expert_group`,
    /// `moe_renormalize`, `model_max_length`): Llama's sizes, MLA's ranks and head dims
    /// (`q_lora_rank` null by default), no rotary embedding, the KDA keys and `layer_types`,
    /// `mlp_layer_types` (or `first_k_dense_replace`, 1).
    fn import(&self, _t: &str, f: &Fields, notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        notes.push(TORCH_PATH.into());
        let mut m = fields::llama_like(
            f,
            fields::Dims {
                vocab: 163_840,
                hidden: 2304,
                layers: 27,
                heads: 32,
                kv_heads: None,
                head_dim: None,
                ffn: 9216,
                max_pos: 1_048_576,
                tied: false,
            },
        )?;
        m.max_pos = f.uint_or("model_max_length", 1_048_576)?;
        if m.kv_heads != m.heads {
            return Err(HfError::Field {
                key: "num_key_value_heads",
                reason: format!(
                    "{} differs from the {} attention heads; transformers' MLA expands keys and values for every head",
                    m.kv_heads, m.heads
                ),
            });
        }
        m.positions = Positions::None;
        m.kv_lora_rank = f.size("kv_lora_rank", 512)?;
        m.q_lora_rank = f.uint("q_lora_rank")?.unwrap_or(0);
        m.qk_rope_dim = f.size("qk_rope_head_dim", 64)?;
        m.head_dim = f.size("qk_nope_head_dim", 128)?.saturating_add(m.qk_rope_dim);
        m.v_head_dim = f.size("v_head_dim", 128)?;
        if f.flag("attention_bias", false)? {
            return Err(HfError::Field {
                key: "attention_bias",
                reason: "true is not modelled (KimiLinearAttention sets it false)".into(),
            });
        }
        m.gdn = kda_keys(f)?;
        m.linear_layers = kda_layers(f, m.layers)?;
        m.experts = f.size_any(&["num_experts", "num_local_experts", "n_routed_experts"], 256)?;
        m.top_k = f.size_any(&["num_experts_per_token", "num_experts_per_tok"], 8)?;
        m.expert_ffn = f.size("moe_intermediate_size", 1024)?;
        m.shared_experts = f.size_any(&["num_shared_experts", "n_shared_experts"], 1)?;
        m.shared_ffn = m.expert_ffn;
        moe_layers(f, &mut m)?;
        m.fused_experts = true;
        m.router = Router::Sigmoid;
        m.router_fp32 = true;
        m.router_groups = f.size_any(&["num_expert_group", "n_group"], 1)?;
        m.router_group_topk = f.uint_or("topk_group", 1)?;
        if !f.flag("moe_renormalize", true)? {
            return Err(HfError::Field {
                key: "moe_renormalize",
                reason: "false is not modelled (the public checkpoint renormalises its top-k weights)".into(),
            });
        }
        Ok(m)
    }
    /// DeepSeek-V3's keys ([`super::deepseek::config`]) under Kimi's names, the KDA keys, both
    /// layer-type lists (in place of `first_k_dense_replace`) and `moe_renormalize`.
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut m) = super::deepseek::config("kimi_linear", s) else { return Vec::new() };
        for (from, to) in KIMI_NAMES {
            if let Some(v) = m.remove(from) {
                m.insert(to.into(), v);
            }
        }
        m.remove("first_k_dense_replace");
        let types: Vec<&str> =
            (0..s.layers).map(|i| if s.linear_layers.contains(i) { "linear_attention" } else { "full_attention" }).collect();
        let mlp: Vec<&str> = (0..s.layers).map(|i| if s.is_moe_layer(i) { "sparse" } else { "dense" }).collect();
        let extra: [(&str, Value); 6] = [
            ("linear_num_heads", s.gdn.v_heads.into()),
            ("linear_head_dim", s.gdn.v_dim.into()),
            ("linear_conv_kernel_dim", s.gdn.conv.into()),
            ("layer_types", types.into()),
            ("mlp_layer_types", mlp.into()),
            ("moe_renormalize", true.into()),
        ];
        m.extend(extra.into_iter().map(|(k, v)| (k.to_string(), v)));
        vec![m]
    }
}

impl Modeling for KimiLinear {
    fn presets(&self) -> Vec<Preset> {
        vec![Preset::new(115, "kimi-linear-48b-a3b", "moonshotai/Kimi-Linear-48B-A3B-Instruct", "Kimi Linear", kimi_linear_48b())
            .with_notes(&[TORCH_PATH])]
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
}

#[cfg(test)]
mod tests {
    use crate::estimator::hf::{import_value, HfError};
    use crate::estimator::model::LayerRule;
    use serde_json::{json, Value};

    /// A 4-layer Kimi Linear config.json with `extra` keys on top.
    fn tiny(extra: Value) -> Value {
        let mut c = json!({
            "model_type": "kimi_linear", "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 4,
            "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 64, "moe_intermediate_size": 16,
            "kv_lora_rank": 8, "q_lora_rank": null, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8, "v_head_dim": 8,
            "num_experts": 4, "num_experts_per_token": 2, "num_shared_experts": 1,
        });
        c.as_object_mut().expect("an object").extend(extra.as_object().expect("an object").clone());
        c
    }

    #[test]
    fn the_checkpoints_one_indexed_layer_lists_name_its_kda_and_mla_layers() {
        let c = tiny(json!({"linear_attn_config": {"full_attn_layers": [2, 4], "kda_layers": [1, 3], "num_heads": 2,
            "head_dim": 8, "short_conv_kernel_size": 4}, "first_k_dense_replace": 1}));
        let m = import_value(&c).expect("imports").spec;
        assert_eq!((0..4).filter(|&i| m.linear_layers.contains(i)).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!((m.gdn.v_heads, m.gdn.v_dim, m.gdn.conv), (2, 8, 4));
        assert_eq!((m.dense_layers, m.moe_rule.clone()), (1, LayerRule::All));
    }

    #[test]
    fn layer_types_win_over_the_checkpoints_lists_and_mlp_layer_types_over_first_k_dense_replace() {
        let c = tiny(json!({
            "layer_types": ["full_attention", "linear_attention", "linear_attention", "linear_attention"],
            "linear_attn_config": {"full_attn_layers": [2], "kda_layers": [1, 3, 4]},
            "mlp_layer_types": ["sparse", "dense", "sparse", "sparse"], "first_k_dense_replace": 3,
        }));
        let m = import_value(&c).expect("imports").spec;
        assert_eq!((0..4).filter(|&i| m.linear_layers.contains(i)).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!((0..4).filter(|&i| m.is_moe_layer(i)).collect::<Vec<_>>(), vec![0, 2, 3]);
    }

    #[test]
    fn top_k_weights_left_unnormalised_are_refused_naming_the_key() {
        let err = import_value(&tiny(json!({"moe_renormalize": false}))).err();
        assert!(matches!(err, Some(HfError::Field { key: "moe_renormalize", .. })), "{err:?}");
    }
}
