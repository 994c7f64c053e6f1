//! DeepSeek-V3 (`deepseek_v3`, and Kimi K2; transformers 5.24
//! `models/deepseek_v3/modeling_deepseek_v3.py`): Llama's pre-norm layer around multi-head
//! latent attention (MLA, `DeepseekV3Attention`), dense MLPs on the first
//! `first_k_dense_replace` layers and the sigmoid-routed MoE block with shared experts
//! ([`super::sigmoid_moe`]) on the others.
//!
//! MLA (DeepSeek-AI 2024, DeepSeek-V2 §2.1) compresses the keys and values of a token into one
//! latent of r_kv dims plus one rotary key of d_r dims shared by all heads
//! (`kv_a_proj_with_mqa`, then `kv_a_layernorm` on the latent), and expands the latent per head
//! (`kv_b_proj`) into the non-rotary key (d_nope) and the value (d_v). Queries go through a
//! rank-r_q bottleneck (`q_a_proj`, `q_a_layernorm`, `q_b_proj`) unless `q_lora_rank` is null.
//! What training keeps per layer is therefore the latents (`b·s·(r_q + r_kv + d_r)`) and the
//! per-head tensors the attention core needs; the KV cache saving of MLA is an inference
//! saving, but the projections' inputs shrink too.

use super::super::blocks::shapes::tok;
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Out, Shape, Split, Tid, B, X};
use super::common::{cache_position, cat_promote, causal_mask, rms_norm, rotary_polar, rotate_halves, tokens};
use super::common::{Kind, Params, Rms, Shared};
use super::modeling::{ConfigFile, Modeling};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{Linear, ModelSpec, Router};
use crate::estimator::part::Part;
use crate::estimator::preset_base::{llama, Preset, FP8_CHECKPOINT};
use serde_json::{Map, Value};

/// What `DeepseekV2Model.forward` computes after the embedding (also a later pipeline stage's
/// prologue): Llama's positions and mask, then `DeepseekV2RotaryEmbedding.forward`
/// ([`rotary_polar`]): `freqs_cis` complex64 `[1, s, d_r / 2]` — the bytes of fp32
/// `[1, s, d_r]`, which is how the program carries it (in the `cos` slot; `sin` is empty).
fn positions_v2(b: &mut Builder, attn: Attention) -> Shared {
    let pos = cache_position(b);
    let mask = causal_mask(b, pos, attn);
    let fc = rotary_polar(b, pos, Shape::new(&[Dim::Q(Q::S), DR2], Split::None), Shape::new(&[Dim::Q(Q::S), DR], Split::None));
    Shared { cos: Some(fc), pos: Some(pos), mask, ..Shared::default() }
}

/// `xq_ * freqs_cis` on complex views (MulBackward0 keeps `freqs_cis`; backward `conj()` is
/// materialized by a `clone`, then the product): `x` and the result carry the complex
/// `[…, d_r / 2]` as fp32 `[…, d_r]`.
pub(super) fn complex_mul(b: &mut Builder, x: Tid, fc: Tid) -> Tid {
    use super::super::ir::S;
    let (shape, rg, bytes, dtype) = (b.shape(x), b.rg(x), b.bytes(x), b.t(x).dtype);
    let fb = b.bytes(fc);
    let out = b.out(shape, Dt::F32, rg);
    let bw: &[B] = if rg {
        &[B::Alloc { bytes: fb, dtype, op: "clone" }, B::Alloc { bytes, dtype, op: "mul" }, B::Free(0), B::Grad { input: 0, temp: 1 }]
    } else {
        &[]
    };
    b.op("mul", "MulBackward0", &[x, fc], &[out], if rg { &[S::In(1)] } else { &[] }, bw)[0]
}

/// DeepSeek-V2's `apply_rotary_emb(q_pe, k_pe, freqs_cis)`:
/// ```python
/// xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
/// xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
/// xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3).type_as(xq)
/// xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3).type_as(xk)
/// ```
/// The fp32 copies (`float()`, none in fp32) live until the function returns.
fn rope_complex(b: &mut Builder, q: Tid, k: Tid, fc: Tid) -> (Tid, Tid) {
    let (qdt, kdt) = (b.t(q).dt, b.t(k).dt);
    let q32 = b.to_copy(q, Dt::F32);
    let k32 = b.to_copy(k, Dt::F32);
    let qm = complex_mul(b, q32, fc);
    // `view_as_real`'s backward is `view_as_complex(grad.contiguous())`: q's gradient arrives as
    // a narrowed view of the query's (CatBackward0) and is copied, unless `type_as` made a new
    // one (reduced precision: ToCopyBackward0).
    let qm = if qdt == Dt::F32 || b.dtype(qdt) == b.dtype(Dt::F32) {
        let shape = b.shape(qm);
        b.view(qm, shape, "ViewAsRealBackward0", true)
    } else {
        qm
    };
    let qe = b.to_copy(qm, qdt);
    let km = complex_mul(b, k32, fc);
    let ke = b.to_copy(km, kdt);
    b.hold(q32);
    b.hold(k32);
    (qe, ke)
}

/// `scores.masked_fill(mask, value)`: MaskedFillBackward0 keeps the mask; backward one
/// `masked_fill` of the gradient.
fn masked_fill(b: &mut Builder, x: Tid, mask: Tid) -> Tid {
    use super::super::ir::S;
    let (shape, dt, rg, bytes, dtype) = (b.shape(x), b.t(x).dt, b.rg(x), b.bytes(x), b.t(x).dtype);
    let out = b.out(shape, dt, rg);
    let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "masked_fill" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    b.op("masked_fill", "MaskedFillBackward0", &[x, mask], &[out], if rg { &[S::In(1)] } else { &[] }, bw)[0]
}

/// DeepSeek-V2's router (`DeepseekV2TopkRouter.forward`):
/// ```python
/// router_logits = F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32))
/// scores = router_logits.softmax(dim=-1, dtype=torch.float32)
/// if self.topk_method == "greedy":
///     topk_weights, topk_indices = torch.topk(scores, k=self.top_k, dim=-1, sorted=False)
/// elif self.topk_method == "group_limited_greedy":
///     group_scores = scores.view(-1, G, E // G).max(dim=-1).values
///     group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
///     group_mask = torch.zeros_like(group_scores); group_mask.scatter_(1, group_idx, 1)
///     score_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
///     scores = scores.masked_fill(~score_mask.bool(), 0.0)
///     topk_weights, topk_indices = torch.topk(scores, k=self.top_k, dim=-1, sorted=False)
/// topk_weights = topk_weights * self.routed_scaling_factor
/// ```
/// The softmax keeps its result, the masked fill its mask, the top-k its indices; the group
/// choice (max, group top-k) carries no gradient to the loss. `norm_topk_prob` is not read.
pub fn router_v2(b: &mut Builder, spec: &ModelSpec, w: Option<Tid>, x2: Tid) -> (Tid, Tid, Tid) {
    let logits = super::sigmoid_moe::fp32_logits(b, w, x2);
    let lf = b.to_copy(logits, Dt::F32);
    let scores = b.unary("_softmax", "SoftmaxBackward0", lf, Keep::Output, "_softmax_backward_data");
    let groups = spec.router_groups.max(1);
    let kk = || tokens(&[Dim::X(X::K)]);
    let mut locals: Vec<Tid> = Vec::new();
    let mut kept_by_node: Vec<Tid> = Vec::new();
    let (vals, idx) = if groups > 1 {
        let g = Dim::W(groups);
        let outs = [b.out(tokens(&[g]), Dt::F32, false), b.out(tokens(&[g]), Dt::I64, false)];
        let r = b.plain_n("max", &[scores], &outs);
        let (gmax, gargmax) = (r[0], r[1]);
        // MaxBackward0 (dead: the group choice reaches no loss) keeps the arg-max.
        let rg = b.rg(scores);
        b.dead_save(gargmax, rg);
        let [gidx, gmask, smask, inv] = super::sigmoid_moe::group_mask(b, spec, gmax, rg);
        let filled = masked_fill(b, scores, inv);
        locals.extend([filled, gmax, gidx, gmask, smask]);
        // MaxBackward0 keeps the arg-max until `group_scores` goes at the return.
        kept_by_node.push(gargmax);
        b.topk(filled, kk())
    } else {
        // `scores` names the probabilities until the return.
        locals.push(scores);
        b.topk(scores, kk())
    };
    let weights = b.mul_scalar(vals);
    // The function's locals live until it returns.
    for t in locals {
        b.hold(t);
    }
    for t in kept_by_node {
        super::sigmoid_moe::node_kept(b, t);
    }
    (logits, weights, idx)
}

/// `[b, s, w]` of an MLA latent: not split by tensor parallelism (`q_a_proj` and
/// `kv_a_proj_with_mqa` are whole on every rank).
pub(super) fn lat(w: X) -> Shape {
    Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::X(w)], Split::None)
}

/// `[b, s, heads, w]`.
pub(super) fn bshw(h: Dim, w: Dim) -> Shape {
    Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), h, w], Split::Tp)
}

/// `[b, heads, s, w]`.
pub(super) fn bhsw(h: Dim, w: Dim) -> Shape {
    Shape::new(&[Dim::Q(Q::B), h, Dim::Q(Q::S), w], Split::Tp)
}

/// `[b, 1, s, w]`: the shared rotary key.
fn b1sw(w: Dim) -> Shape {
    Shape::new(&[Dim::Q(Q::B), Dim::N(1), Dim::Q(Q::S), w], Split::None)
}

pub(super) const A: Dim = Dim::Q(Q::A);
pub(super) const D: Dim = Dim::Q(Q::D);
pub(super) const DR: Dim = Dim::X(X::DRot);
pub(super) const DR2: Dim = Dim::HalfX(X::DRot);
pub(super) const DV: Dim = Dim::X(X::MlaV);
pub(super) const DN: Dim = Dim::X(X::MlaNope);

/// `torch.split(x, [n1, n2], dim=-1)`: two views; SplitWithSizesBackward0 concatenates their
/// gradients into a full-size `cat`.
pub(super) fn split2(b: &mut Builder, x: Tid, s1: Shape, s2: Shape) -> (Tid, Tid) {
    let (rg, bytes, dtype) = (b.rg(x), b.bytes(x), b.t(x).dtype);
    let o1 = b.view_out(x, s1);
    let o2 = b.view_out(x, s2);
    let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "cat" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    let r = b.op("split_with_sizes", "SplitWithSizesBackward0", &[x], &[o1, o2], &[], bw);
    (r[0], r[1])
}

/// `x[..., 0::2]` or `x[..., 1::2]`: a strided view; SliceBackward0 allocates the full input.
fn half(b: &mut Builder, x: Tid) -> Tid {
    let shape = b.shape(x).last(DR2);
    b.slice(x, shape)
}

/// The MLA attention's parameters in registration order (`DeepseekV3Attention.__init__`).
#[derive(Clone, Copy)]
pub struct MlaW {
    pub q: Option<Tid>,
    pub q_a: Option<Tid>,
    pub q_a_bias: Option<Tid>,
    pub q_a_norm: Option<Tid>,
    pub q_b: Option<Tid>,
    pub kv_a: Option<Tid>,
    pub kv_a_bias: Option<Tid>,
    pub kv_a_norm: Option<Tid>,
    pub kv_b: Option<Tid>,
    pub o: Option<Tid>,
    pub o_bias: Option<Tid>,
    /// DeepSeek-V3.2's indexer (registered after `o_proj`).
    pub idx: super::dsa::IndexerW,
}

impl MlaW {
    pub fn new(b: &mut Builder, p: &Params) -> MlaW {
        MlaW {
            q: p.w(b, "layers.*.attn.q_proj.weight"),
            q_a: p.w(b, "layers.*.attn.q_a_proj.weight"),
            q_a_bias: p.w(b, "layers.*.attn.q_a_proj.bias"),
            q_a_norm: p.w(b, "layers.*.attn.q_a_layernorm.weight"),
            q_b: p.w(b, "layers.*.attn.q_b_proj.weight"),
            kv_a: p.w(b, "layers.*.attn.kv_a_proj_with_mqa.weight"),
            kv_a_bias: p.w(b, "layers.*.attn.kv_a_proj_with_mqa.bias"),
            kv_a_norm: p.w(b, "layers.*.attn.kv_a_layernorm.weight"),
            kv_b: p.w(b, "layers.*.attn.kv_b_proj.weight"),
            o: p.w(b, "layers.*.attn.o_proj.weight"),
            o_bias: p.w(b, "layers.*.attn.o_proj.bias"),
            idx: super::dsa::IndexerW::new(b, p),
        }
    }
}

/// `key_states[..., a:b].copy_(src)` into the `new_empty` key (CopySlices): no allocation
/// forward; backward the base's gradient is cloned whole (`new_empty_strided`), the slice's
/// gradient cloned for `src`, and — when the base itself needs a gradient — the slice zeroed in
/// the clone (`zeros_like` of the slice, copied in).
fn copy_slice(b: &mut Builder, base: Tid, src: Tid) -> Tid {
    let shape = b.shape(base);
    let (full, dtype) = (b.bytes(base), b.t(base).dtype);
    let part = b.bytes(src);
    let base_rg = b.rg(base);
    let rg = base_rg || b.rg(src);
    let out = Out { shape, dt: b.t(base).dt, view_of: Some(base), requires_grad: rg };
    let bw: &[B] = if base_rg {
        &[
            B::Alloc { bytes: full, dtype, op: "new_empty_strided" },
            B::Alloc { bytes: part, dtype, op: "clone" },
            B::Alloc { bytes: part, dtype, op: "zeros_like" },
            B::Free(2),
            B::Grad { input: 0, temp: 0 },
            B::Grad { input: 1, temp: 1 },
        ]
    } else {
        &[
            B::Alloc { bytes: full, dtype, op: "new_empty_strided" },
            B::Alloc { bytes: part, dtype, op: "clone" },
            B::Free(0),
            B::Grad { input: 1, temp: 1 },
        ]
    };
    b.op("copy_", "CopySlices", &[base, src], &[out], &[], if rg { bw } else { &[] })[0]
}

/// The shared rotary key expanded over the heads into `shape` (`k_rot.expand(-1, a, -1, -1)`
/// here, `[b, a, s, d_r]`; torchtitan's `k_pe.expand(-1, -1, n_heads, -1)`, `[b, s, a, d_r]`): a
/// view; ExpandBackward0 sums the gradient back to the key's one head.
pub(super) fn expand_heads(b: &mut Builder, x: Tid, shape: Shape) -> Tid {
    let (bytes, dtype) = (b.bytes(x), b.t(x).dtype);
    let out = b.view_out(x, shape);
    let bw: &[B] = if b.rg(x) { &[B::Alloc { bytes, dtype, op: "sum" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    b.op("expand", "ExpandBackward0", &[x], &[out], &[], bw)[0]
}

/// `DeepseekV3Attention.forward`:
/// ```python
/// q_states = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))   # or q_proj
/// q_states = q_states.view(query_shape).transpose(1, 2)
/// q_pass, q_rot = torch.split(q_states, [d_nope, d_r], dim=-1)
/// compressed_kv = self.kv_a_proj_with_mqa(hidden_states)
/// kv_nope, k_rot = torch.split(compressed_kv, [r_kv, d_r], dim=-1)
/// kv_nope = self.kv_a_layernorm(kv_nope).view(b, 1, s, r_kv); k_rot = k_rot.view(b, 1, s, d_r)
/// q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
/// query_states = torch.cat((q_pass, q_rot), dim=-1)
/// key_states, value_states = self.expand_kv(kv_nope, k_rot)
/// attn_output, attn_weights = attention_interface(self, query_states, key_states, value_states, …)
/// attn_output = self.o_proj(attn_output.reshape(b, s, -1).contiguous())
/// ```
/// `expand_kv`: `kv_b_proj(kv_nope).view(b, s, a, d_nope + d_v).transpose(1, 2)` split into
/// k_nope and the value, and the key built in a `new_empty` `[b, a, s, d]` by two slice copies
/// (k_nope, then the rotary key expanded over the heads). Every local lives until the return.
pub fn attention(b: &mut Builder, w: &MlaW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let _ = spec;
    b.part = Part::AttentionInputs;
    let qshape = bshw(A, D);
    let mut q_resid = None;
    let qs = match (w.q_a, w.q) {
        (Some(wa), _) => {
            b.module = "self_attn.q_a_proj";
            let qa = b.proj(x, wa, w.q_a_bias, lat(X::MlaRq), Linear::Q);
            // The query latent, its norm and q_b_proj's input: the MLA row of the ledger.
            b.module = "self_attn.q_a_layernorm";
            b.part = Part::Mla;
            let qn = rms_norm(b, qa, w.q_a_norm, Rms::Llama);
            q_resid = Some(qn);
            b.module = "self_attn.q_b_proj";
            match w.q_b {
                Some(wb) => b.proj(qn, wb, None, qshape, Linear::Q),
                None => b.plain("mm", &[qn], qshape, Dt::Model),
            }
        }
        (None, Some(wq)) => {
            b.module = "self_attn.q_proj";
            b.proj(x, wq, None, qshape, Linear::Q)
        }
        (None, None) => {
            b.module = "self_attn.q_proj";
            b.plain("mm", &[x], qshape, Dt::Model)
        }
    };
    b.module = "self_attn";
    b.part = Part::AttentionCore;
    let q4 = b.view(qs, bshw(A, D), "ViewBackward0", true);
    let qt = b.view(q4, bhsw(A, D), "TransposeBackward0", false);
    // Kimi Linear's NoPE MLA (`KimiLinearAttention.forward`): no rotary tables, the query used
    // as projected (its transposed view), neither split nor concatenated.
    let nope = sh.cos.is_none();
    let (q_pass, q_rot) = if nope { (qt, qt) } else { split2(b, qt, bhsw(A, DN), bhsw(A, DR)) };
    b.part = Part::AttentionInputs;
    b.module = "self_attn.kv_a_proj_with_mqa";
    let ckv = match w.kv_a {
        Some(wk) => b.proj(x, wk, w.kv_a_bias, lat(X::MlaKvA), Linear::K),
        None => b.plain("mm", &[x], lat(X::MlaKvA), Dt::Model),
    };
    b.module = "self_attn";
    // The compressed KV latent and the shared rotary key, the latent's norm and kv_b_proj's
    // input: the MLA row of the ledger.
    b.part = Part::Mla;
    let (kv_nope, k_rot) = split2(b, ckv, lat(X::MlaRkv), Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), DR], Split::None));
    b.module = "self_attn.kv_a_layernorm";
    let kvn = rms_norm(b, kv_nope, w.kv_a_norm, Rms::Llama);
    b.module = "self_attn";
    b.part = Part::AttentionCore;
    let (q_rot, k_rot) = match (sh.cos, sh.sin) {
        // DeepSeek-V2: `freqs_cis` alone.
        (Some(fc), None) => rope_complex(b, q_rot, k_rot, fc),
        (Some(cos), Some(sin)) => {
            // `cos[..., : d_r // 2].unsqueeze(1)`: views of the model's cos and sin.
            let ch = b.view(cos, Shape::new(&[Dim::Q(Q::S), DR2], Split::None), "", false);
            let shh = b.view(sin, Shape::new(&[Dim::Q(Q::S), DR2], Split::None), "", false);
            let q1 = half(b, q_rot);
            let q2 = half(b, q_rot);
            let k1 = half(b, k_rot);
            let k2 = half(b, k_rot);
            let qe = rotate_halves(b, q1, q2, ch, shh, bhsw(A, DR));
            let ke = rotate_halves(b, k1, k2, ch, shh, b1sw(DR));
            (qe, ke)
        }
        _ => (q_rot, k_rot),
    };
    let eager = attn == Attention::Eager;
    let query = match nope {
        // matmul folds the transposed view into `[b·a, s, d]`: a copy unless b = 1.
        true if eager => b.fold(qt, bhsw(A, D)),
        true => qt,
        false => cat_promote(b, q_pass, q_rot, bhsw(A, D)),
    };
    // expand_kv
    b.part = Part::Mla;
    b.module = "self_attn.kv_b_proj";
    let kvb_shape = bshw(A, Dim::X(X::MlaKvB));
    let kvb = match w.kv_b {
        Some(wb) => b.proj(kvn, wb, None, kvb_shape, Linear::V),
        None => b.plain("mm", &[kvn], kvb_shape, Dt::Model),
    };
    b.module = "self_attn";
    b.part = Part::AttentionCore;
    let kvb4 = b.view(kvb, kvb_shape, "ViewBackward0", true);
    let kvt = b.view(kvb4, bhsw(A, Dim::X(X::MlaKvB)), "TransposeBackward0", false);
    let (k_nope, value) = split2(b, kvt, bhsw(A, DN), bhsw(A, DV));
    let k_rot_e = expand_heads(b, k_rot, bhsw(A, DR));
    let key0 = b.plain("new_empty", &[kvb], bhsw(A, D), Dt::Model);
    let key1 = copy_slice(b, key0, k_nope);
    let key = copy_slice(b, key1, k_rot_e);
    // DeepSeek-V3.2: the indexer's top-k folded into the mask (`DeepseekV32Attention.forward`).
    let sparse = match q_resid.filter(|_| spec.dsa.heads > 0) {
        Some(qr) => super::dsa::sparse_mask(b, &w.idx, x, qr, sh),
        None => None,
    };
    let mask = sparse.map_or(sh.mask, |(m, _)| Some(m));
    let (o, weights) = if eager {
        eager_core(b, query, key, value, mask)
    } else if b.c.cuda || spec.v_head_dim == spec.head_dim {
        (flash_core(b, query, key, value, sparse.map(|(m, _)| m)), None)
    } else {
        (sdpa_math(b, query, key, value, sparse.map(|(m, _)| m)), None)
    };
    b.part = Part::AttentionInputs;
    b.module = "self_attn.o_proj";
    let out = match w.o {
        Some(wo) => b.proj(o, wo, w.o_bias, tok(Q::H), Linear::O),
        None => b.plain("mm", &[o], tok(Q::H), Dt::Model),
    };
    for t in [qs, q_rot, ckv, kvn, k_rot, query, key, kvb] {
        b.hold(t);
    }
    for t in sparse.map(|(_, held)| held).into_iter().flatten() {
        b.hold(t);
    }
    (out, weights)
}

/// `eager_attention_forward` on MLA's q, k `[b, a, s, d]` (both contiguous: a `cat` and the
/// `new_empty` key) and v `[b, a, s, d_v]` (a view of `kv_b_proj`'s output, copied by matmul's
/// reshape when b > 1): scores, scaling, mask, fp32 softmax, the product with v, the
/// `transpose(1, 2).contiguous()` copy. Returns `[b, s, a, d_v]` and the probabilities.
fn eager_core(b: &mut Builder, q: Tid, k: Tid, v: Tid, mask: Option<Tid>) -> (Tid, Option<Tid>) {
    let sc = b.bmm(q, k, super::super::blocks::shapes::scores());
    let sm = b.mul_scalar(sc);
    let sa = match mask {
        Some(m) => b.add(sm, m),
        None => sm,
    };
    let s32 = b.to_copy(sa, Dt::F32);
    let pr = b.unary("_softmax", "SoftmaxBackward0", s32, Keep::Output, "_softmax_backward_data");
    let pc = b.to_copy(pr, b.t(q).dt);
    b.hold(sa);
    let pc = b.dropout(pc);
    let vc = b.fold(v, bhsw(A, DV));
    let o = b.bmm(pc, vc, bhsw(A, DV));
    // matmul's `_unsafe_view` back to [b, a, s, d_v]: its gradient arrives transposed (from the
    // `.contiguous()` copy) and `reshape` copies it, unless b = 1 (the batch dim merges freely).
    let batched = b.c.n(Q::B) > 1;
    let o = b.view(o, bhsw(A, DV), "UnsafeViewBackward0", batched);
    let ot = b.view(o, bshw(A, DV), "TransposeBackward0", false);
    let oc = b.copy(ot, bshw(A, DV));
    (oc, Some(pc))
}

/// `F.scaled_dot_product_attention` when the value head differs from the query/key head
/// (d_v ≠ d): CPU has no fused kernel for it and runs `_scaled_dot_product_attention_math`:
/// q, k, v upcast to fp32 (reduced precision on CPU), q and kᵀ scaled by √scale, the causal
/// mask built (`ones(s, s).tril()`, `where(…, 0, -inf)`), the scores, `_safe_softmax`, the
/// probabilities cast back (returned and dropped), the product with v, the output cast back;
/// then the caller's `transpose(1, 2).contiguous()` copy. Returns `[b, s, a, d_v]`.
pub(super) fn sdpa_math(b: &mut Builder, q: Tid, k: Tid, v: Tid, bool_mask: Option<Tid>) -> Tid {
    // Under autocast SDPA runs in the lower precision: its inputs are cast first, and the ops
    // inside it run with autocast excluded (the math path upcasts them again).
    let (q, k, v) = (b.autocast_in(q), b.autocast_in(k), b.autocast_in(v));
    let autocast = std::mem::replace(&mut b.autocast, false);
    let out_dt = b.t(q).dt;
    // A given bool mask (DeepSeek-V3.2's) is made additive in q's dtype before the kernel.
    let given = bool_mask.map(|m| super::dsa::sdpa_float_mask(b, m, q));
    let q32 = b.to_copy(q, Dt::F32);
    let k32 = b.to_copy(k, Dt::F32);
    let v32 = b.to_copy(v, Dt::F32);
    let qs = b.mul_scalar(q32);
    let mask = match given {
        Some(m) => m,
        None => {
            let ss = Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None);
            let ones = b.plain("ones", &[], ss, Dt::Bool);
            let tril = b.plain("tril", &[ones], ss, Dt::Bool);
            let zero = b.plain("scalar_tensor", &[], Shape::scalar(), Dt::F32);
            let ninf = b.plain("scalar_tensor", &[], Shape::scalar(), Dt::F32);
            b.plain("where", &[tril, zero, ninf], ss, Dt::F32)
        }
    };
    let kt = b.view(k32, bhsw(A, D), "TransposeBackward0", false);
    let ks = b.mul_scalar(kt);
    let sc = b.bmm(qs, ks, super::super::blocks::shapes::scores());
    let sa = b.add(sc, mask);
    let sm = b.unary("_safe_softmax", "SafeSoftmaxBackward0", sa, Keep::Output, "_softmax_backward_data");
    let ret = b.to_copy(sm, out_dt);
    let vc = b.fold(v32, bhsw(A, DV));
    let o = b.bmm(sm, vc, bhsw(A, DV));
    // matmul's `_unsafe_view` back to [b, a, s, d_v]: its gradient arrives transposed (from the
    // `.contiguous()` copy) and `reshape` copies it, unless b = 1 (the batch dim merges freely).
    let batched = b.c.n(Q::B) > 1;
    let o = b.view(o, bhsw(A, DV), "UnsafeViewBackward0", batched);
    let o = b.to_copy(o, out_dt);
    for t in [mask, v32, k32, q32, qs, sm, ret] {
        b.hold(t);
    }
    b.autocast = autocast;
    let ot = b.view(o, bshw(A, DV), "TransposeBackward0", false);
    b.copy(ot, bshw(A, DV))
}

/// SDPA through a fused kernel (CUDA's memory-efficient or flash kernels; the CPU flash kernel
/// when d_v = d): the output `[b, a, s, d_v]` in q's layout and an fp32 log-sum-exp `[b, a, s]`;
/// the node keeps q, k, v, the output and the log-sum-exp; backward allocates dq, dk, dv (each
/// like its input). The caller's `transpose(1, 2).contiguous()` copies the output (q is
/// contiguous after its `cat`). Returns `[b, s, a, d_v]`.
pub(super) fn flash_core(b: &mut Builder, q: Tid, k: Tid, v: Tid, bool_mask: Option<Tid>) -> Tid {
    use super::super::ir::S;
    let (q, k, v) = (b.autocast_in(q), b.autocast_in(k), b.autocast_in(v));
    // A given bool mask (DeepSeek-V3.2's): made additive in q's dtype, an input the kernel's
    // node keeps.
    let mask = bool_mask.map(|m| super::dsa::sdpa_float_mask(b, m, q));
    let rg = b.rg(q) || b.rg(k) || b.rg(v);
    let o = b.out(bhsw(A, DV), b.t(q).dt, rg);
    let lse = b.out(Shape::new(&[Dim::Q(Q::B), A, Dim::Q(Q::S)], Split::Tp), Dt::F32, false);
    let mut bw: Vec<B> = Vec::with_capacity(6);
    let mut grads: Vec<B> = Vec::with_capacity(3);
    for (i, t) in [q, k, v].into_iter().enumerate() {
        if b.rg(t) {
            bw.push(B::Alloc { bytes: b.bytes(t), dtype: b.t(t).dtype, op: "_scaled_dot_product_flash_attention_for_cpu_backward" });
            grads.push(B::Grad { input: i as u8, temp: grads.len() as u8 });
        }
    }
    bw.extend(grads);
    let r = match mask {
        None => b.op(
            "_scaled_dot_product_flash_attention_for_cpu",
            "ScaledDotProductFlashAttentionForCpuBackward0",
            &[q, k, v],
            &[o, lse],
            &[S::In(0), S::In(1), S::In(2), S::Out(0), S::Out(1)],
            &bw,
        ),
        Some(m) => b.op(
            "_scaled_dot_product_flash_attention_for_cpu",
            "ScaledDotProductFlashAttentionForCpuBackward0",
            &[q, k, v, m],
            &[o, lse],
            &[S::In(0), S::In(1), S::In(2), S::In(3), S::Out(0), S::Out(1)],
            &bw,
        ),
    };
    let ot = b.view(r[0], bshw(A, DV), "TransposeBackward0", false);
    b.copy(ot, bshw(A, DV))
}

/// `DeepseekV3DecoderLayer.forward` (Llama's, [`super::sigmoid_moe::layer`]) around MLA; the
/// MLP is `DeepseekV3MLP` on the first `first_k_dense_replace` layers, `DeepseekV3MoE` after
/// (DeepSeek-V2: `DeepseekV2Moe`, with [`router_v2`]).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
#[allow(clippy::too_many_arguments)] // the shared layer signature plus the MoE router's variant
pub fn layer(
    b: &mut Builder,
    p: &Params,
    spec: &ModelSpec,
    x: Tid,
    sh: &Shared,
    kind: Kind,
    attn: Attention,
    router: super::sigmoid_moe::RouterFn,
) -> Tid {
    let aw = MlaW::new(b, p);
    super::sigmoid_moe::layer(b, p, spec, x, kind, |b, n| attention(b, &aw, spec, n, sh, attn), router)
}

/// DeepSeek-V2/V3 (and Kimi K2, DeepSeek-V3's architecture): MLA attention, `first_k_dense_replace`
/// dense layers, then MoE layers of routed and shared experts (configuration_deepseek_v3.py,
/// configuration_deepseek_v2.py; modeling_deepseek_v3.py `DeepseekV3DecoderLayer`, `DeepseekV3MoE`).
pub(super) fn import(t: &str, f: &Fields, notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
    let v3 = t != "deepseek_v2";
    let d = |v2: u64, v3v: u64| if v3 { v3v } else { v2 };
    let mut m = fields::llama_like(
        f,
        fields::Dims {
            vocab: d(102_400, 129_280),
            hidden: d(4096, 7168),
            layers: d(32, 61),
            heads: d(32, 128),
            kv_heads: None,
            head_dim: None,
            ffn: d(11_008, 18_432),
            max_pos: d(2048, 4096),
            tied: false,
        },
    )?;
    if let Some(kv) = f.uint("num_key_value_heads")? {
        if kv != m.heads {
            return Err(HfError::Field {
                key: "num_key_value_heads",
                reason: format!(
                    "{kv} differs from the {} attention heads; transformers' MLA expands keys and values for every head, so \
                     only equal counts build",
                    m.heads
                ),
            });
        }
    }
    m.kv_heads = m.heads;
    m.kv_lora_rank = f.size("kv_lora_rank", 512)?;
    // `q_lora_rank: null` (DeepSeek-V2-Lite) means a plain q_proj; absent means the default 1536.
    m.q_lora_rank = if f.is_null("q_lora_rank") { 0 } else { f.size("q_lora_rank", 1536)? };
    m.qk_rope_dim = f.size("qk_rope_head_dim", 64)?;
    m.head_dim = f.size("qk_nope_head_dim", 128)?.saturating_add(m.qk_rope_dim);
    m.v_head_dim = f.size("v_head_dim", 128)?;
    let attention_bias = f.flag("attention_bias", false)?;
    m.qkv_bias = attention_bias;
    m.o_bias = attention_bias;
    // DeepseekV2MLP takes `mlp_bias`; DeepseekV3MLP has none.
    m.mlp_bias = !v3 && f.flag("mlp_bias", false)?;
    m.experts = f.size_any(&["n_routed_experts", "num_local_experts", "num_experts"], d(64, 256))?;
    m.top_k = match f.uint("num_experts_per_tok")? {
        Some(k) => k,
        None if v3 => 8,
        None => return Err(HfError::Missing("num_experts_per_tok")),
    };
    m.expert_ffn = f.size("moe_intermediate_size", d(1407, 2048))?;
    m.shared_experts = f.uint_or("n_shared_experts", d(2, 1))?;
    m.shared_ffn = m.expert_ffn;
    m.dense_layers = f.uint_or("first_k_dense_replace", d(0, 3))?.min(m.layers);
    m.fused_experts = true;
    m.router_fp32 = true;
    if let Some(freq) = f.uint("moe_layer_freq")? {
        if freq != 1 {
            return Err(HfError::Field {
                key: "moe_layer_freq",
                reason: format!(
                    "{freq}: transformers' DeepSeek classes put an MoE block on every layer from first_k_dense_replace on and \
                     ignore this key, so they cannot build such a checkpoint"
                ),
            });
        }
    }
    if v3 {
        m.router = Router::Sigmoid;
        m.router_groups = f.uint_or("n_group", 8)?;
        m.router_group_topk = f.uint_or("topk_group", 4)?;
    } else {
        m.router = Router::Softmax;
        if f.string("topk_method")? == Some("group_limited_greedy") {
            m.router_groups = f.uint("n_group")?.ok_or(HfError::Missing("n_group"))?;
            m.router_group_topk = f.uint("topk_group")?.ok_or(HfError::Missing("topk_group"))?;
        }
    }
    if t == "kimi_k2" {
        notes.push(
            "model_type `kimi_k2` is DeepSeek-V3's architecture (its config names DeepseekV3ForCausalLM); it is read as \
             `deepseek_v3`, as transformers reads Kimi K2.5's text model"
                .into(),
        );
    }
    let class = match t {
        "deepseek_v2" => "DeepseekV2ForCausalLM",
        "deepseek_v32" => "DeepseekV32ForCausalLM",
        _ => "DeepseekV3ForCausalLM",
    };
    notes.extend(fields::mtp_note(f, class)?);
    Ok(m)
}

/// DeepSeek-V2/V3: MLA, `first_k_dense_replace` dense layers, routed and shared experts.
pub(super) fn config(t: &str, s: &ModelSpec) -> Option<Map<String, Value>> {
    let mut w = writer::Writer::new(t);
    w.set("vocab_size", s.vocab)
        .set("hidden_size", s.hidden)
        .set("num_hidden_layers", s.layers)
        .set("num_attention_heads", s.heads)
        .set("num_key_value_heads", s.heads)
        .set("intermediate_size", s.ffn)
        .set("max_position_embeddings", s.max_pos)
        .set("tie_word_embeddings", s.tied)
        .set("hidden_act", writer::act_name(s.act)?)
        .set("kv_lora_rank", s.kv_lora_rank)
        .set("q_lora_rank", if s.q_lora_rank > 0 { Value::from(s.q_lora_rank) } else { Value::Null })
        .set("qk_rope_head_dim", s.qk_rope_dim)
        .set("qk_nope_head_dim", s.head_dim.checked_sub(s.qk_rope_dim)?)
        .set("v_head_dim", s.v_head_dim)
        .set("attention_bias", s.qkv_bias)
        .set("n_routed_experts", s.experts)
        .set("num_experts_per_tok", s.top_k)
        .set("moe_intermediate_size", s.expert_ffn)
        .set("n_shared_experts", s.shared_experts)
        .set("first_k_dense_replace", s.dense_layers);
    if t != "deepseek_v2" {
        w.set("n_group", s.router_groups).set("topk_group", s.router_group_topk);
    } else {
        w.set("mlp_bias", s.mlp_bias);
        if s.router_groups > 0 {
            w.set("topk_method", "group_limited_greedy").set("n_group", s.router_groups).set("topk_group", s.router_group_topk);
        } else {
            w.set("topk_method", "greedy");
        }
    }
    w.done()
}

/// DeepSeek-V2 (`modeling_deepseek_v2.py`): MLA with complex rotary embedding (`freqs_cis`,
/// `apply_rotary_emb`) and the softmax router (`DeepseekV2TopkRouter`, greedy or group-limited
/// greedy).
pub struct DeepseekV2;
impl ConfigFile for DeepseekV2 {
    fn import(&self, t: &str, f: &Fields, notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        import(t, f, notes)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        config("deepseek_v2", s).into_iter().collect()
    }
}

impl Modeling for DeepseekV2 {
    fn presets(&self) -> Vec<Preset> {
        vec![Preset::new(39, "deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite", "DeepSeek", deepseek_v2_lite())]
    }
    fn positions(&self, b: &mut Builder, _spec: &ModelSpec, attn: Attention) -> Shared {
        positions_v2(b, attn)
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn, router_v2)
    }
    /// `freqs_cis` `[s, d_r / 2]` complex64: the bytes of fp32 `[s, d_r]`, no sin.
    fn rope_tables(&self, _spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
        Some((Shape::new(&[Dim::Q(Q::S), DR], Split::None), Dt::F32, false))
    }
}

/// MLA attention of DeepSeek-V2/V3 (d = 128 + 64 per query/key head, d_v = 128, r_kv = 512).
const fn mla(mut m: ModelSpec, q_lora_rank: u64) -> ModelSpec {
    m.kv_lora_rank = 512;
    m.q_lora_rank = q_lora_rank;
    m.qk_rope_dim = 64;
    m.head_dim = 128 + 64;
    m.v_head_dim = 128;
    m
}

/// DeepSeek-V3's architecture (also Kimi K2): MLA with r_q = 1536, `dense` dense layers of
/// 18,432, then MoE layers of `experts` × 2,048 routed (top-8) + one shared expert, sigmoid
/// router in fp32 with correction bias, group-limited over `groups` groups.
pub(super) const fn deepseek_v3(
    vocab: u64,
    heads: u64,
    experts: u64,
    dense: u64,
    groups: u64,
    topk_groups: u64,
    max_pos: u64,
) -> ModelSpec {
    let mut m = mla(llama(vocab, 7168, 61, heads, heads, 18_432, max_pos), 1536);
    m.family = Family::DeepseekV3;
    m.experts = experts;
    m.top_k = 8;
    m.expert_ffn = 2048;
    m.shared_experts = 1;
    m.shared_ffn = 2048;
    m.dense_layers = dense;
    m.fused_experts = true;
    m.router = Router::Sigmoid;
    m.router_fp32 = true;
    m.router_groups = groups;
    m.router_group_topk = topk_groups;
    m
}

/// DeepSeek-V2-Lite: MLA without query compression, one dense layer of 10,944, then 64 routed
/// (top-6) + 2 shared experts of 1,408, softmax router in fp32.
const fn deepseek_v2_lite() -> ModelSpec {
    let mut m = mla(llama(102_400, 2048, 27, 16, 16, 10_944, 163_840), 0);
    m.family = Family::DeepseekV2;
    m.experts = 64;
    m.top_k = 6;
    m.expert_ffn = 1408;
    m.shared_experts = 2;
    m.shared_ffn = 1408;
    m.dense_layers = 1;
    m.fused_experts = true;
    m.router_fp32 = true;
    m
}

/// DeepSeek-V3 (`modeling_deepseek_v3.py`, also Kimi K2): MLA with Llama's rotary tables and the
/// sigmoid router with its correction bias, group-limited, renormalised (`norm_topk_prob`: its
/// configuration and checkpoints set it).
pub struct DeepseekV3;
impl ConfigFile for DeepseekV3 {
    fn import(&self, t: &str, f: &Fields, notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        import(t, f, notes)
    }
    fn aliases(&self) -> &'static [&'static str] {
        &["kimi_k2"]
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        config("deepseek_v3", s).into_iter().collect()
    }
}

impl Modeling for DeepseekV3 {
    fn presets(&self) -> Vec<Preset> {
        vec![
            Preset::new(38, "deepseek-v3", "deepseek-ai/DeepSeek-V3", "DeepSeek", deepseek_v3(129_280, 128, 256, 3, 8, 4, 163_840)).with_notes(&[
                "the checkpoint's multi-token-prediction layer (num_nextn_predict_layers 1) is not built by transformers' DeepseekV3ForCausalLM and is not counted",
                FP8_CHECKPOINT,
            ]),
            Preset::new(40, "kimi-k2-instruct", "moonshotai/Kimi-K2-Instruct", "Kimi K2", deepseek_v3(163_840, 64, 384, 1, 1, 1, 131_072))
                .with_notes(&["Kimi K2 is DeepSeek-V3's architecture (model_type kimi_k2, read as deepseek_v3)", FP8_CHECKPOINT]),
        ]
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn, super::sigmoid_moe::router_normalized)
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::ledger::kept;
    use super::super::super::model::Setup;
    use super::*;
    use crate::estimator::config::{Config, Kernels, Precision};
    use crate::estimator::params::Stage;
    use crate::estimator::precision::recipe;
    use crate::estimator::presets::preset;

    /// A toy DeepSeek-V3: h = 8, a = 2, d = d_nope + d_r = 2 + 2, d_v = 2, r_q = 4, r_kv = 4.
    fn toy() -> Config {
        let mut m = preset("deepseek-v3").expect("preset").spec;
        (m.vocab, m.hidden, m.layers, m.dense_layers, m.heads, m.kv_heads, m.head_dim, m.ffn) = (16, 8, 2, 1, 2, 2, 4, 8);
        (m.qk_rope_dim, m.v_head_dim, m.q_lora_rank, m.kv_lora_rank) = (2, 2, 4, 4);
        (m.experts, m.top_k, m.expert_ffn, m.shared_ffn, m.router_groups, m.router_group_topk) = (4, 2, 4, 4, 2, 1);
        Config {
            model: "custom".into(),
            arch: m,
            batch: 1,
            seq: 4,
            precision: Precision::Fp32,
            attn: Attention::Eager,
            kernels: Kernels::Cpu,
            ..Config::default()
        }
    }

    fn saved(part: Part) -> u128 {
        let cfg = toy();
        let setup = Setup::new(&cfg, &recipe(cfg.precision), Stage::Whole);
        let (prog, _, _) = setup.layer_alone(Kind::Dense, super::super::common::Var::default(), 0, false);
        kept(&prog).iter().filter(|k| k.part == part && !k.elsewhere).map(|k| prog.tensors[k.t as usize].bytes).sum()
    }

    #[test]
    fn the_mla_row_keeps_the_two_latents_their_norms_and_the_up_projections_inputs() {
        // fp32, b = 1, s = 4 (4 bytes × b·s = 16 bytes per dim of a token):
        // q latent q_a_proj(x) [r_q] kept by q_a_layernorm's pow: 16 × 4 = 64; its rsqrt
        // [b, s, 1]: 16; the normalized latent (its mul with the weight): 64; q_b_proj's input
        // (the norm's output): 64 → 208.
        // kv: kv_a_proj_with_mqa's output [r_kv + d_r] kept whole by the norm's pow on its
        // latent slice: 16 × 6 = 96; rsqrt 16; normalized 64; kv_b_proj's input 64 → 240.
        assert_eq!(saved(Part::Mla), 208 + 240);
    }

    #[test]
    fn the_uncompressed_model_has_no_mla_row() {
        let mut cfg = toy();
        cfg.arch = crate::estimator::sweep::uncompressed_kv(&cfg.arch).expect("MLA");
        let setup = Setup::new(&cfg, &recipe(cfg.precision), Stage::Whole);
        let (prog, _, _) = setup.layer_alone(Kind::Dense, super::super::common::Var::default(), 0, false);
        assert!(kept(&prog).iter().all(|k| k.part != Part::Mla));
    }
}
