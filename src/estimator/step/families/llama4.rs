//! Llama 4's text model (`modeling_llama4.py`, transformers 5.24): RMSNorms that cast back before
//! the weight, complex RoPE (`apply_rotary_emb`: q and k viewed as complex numbers times
//! `freqs_cis`) followed by a weightless L2 norm of q and k on RoPE layers, NoPE layers (every
//! `no_rope_layer_interval`-th) whose queries are scaled by `attn_temperature_tuning`, chunked
//! attention on the RoPE layers (a materialized chunked mask), a softmax in the scores' dtype,
//! and `interleave_moe_layer_step`: MoE layers (`Llama4TextMoe`: every expert runs every token,
//! its input scaled by the sigmoid of the routed top-k logits, beside a shared expert) between
//! dense layers of `intermediate_size_mlp`.
//!
//! Every op below is one aten op the modeling code dispatches, in its order, checked allocation
//! by allocation against `tests/fixtures/pytorch/steps/llama4_text__*.json`. Complex64 tensors
//! are written as fp32 tensors of twice the last dim (the same bytes).

use super::super::blocks::shapes::{heads, heads_bshd};
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Group, Out, Shape, Split, Tid, B, S, X};
use super::common::{
    arange, cache_position, causal_mask, embed_then, gated_mlp, has_rope, head_proj, mask_shape, out_proj, packed_detection, rms_norm,
    rotary_polar, sdpa_mask_of, set_part, tokens,
};
use super::common::{AttnW, Gated, Kind, MlpW, Norm, Params, Rms, Shared, SILU};
use super::llama::{decoder_layer_with, eager_core_as, in_group, mlp, repeat_kv, sdpa_bool_mask, Core, Ffn, MaskBuild, Residual};
use super::modeling::{ConfigFile, Modeling};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{LayerRule, Linear, ModelSpec, Router, WindowKind};
use crate::estimator::part::Part;
use crate::estimator::preset_base::{llama, Preset, VISION_NOT_COUNTED};
use serde_json::{Map, Value};

/// Whether the model materializes the chunked layers' mask: eager always; SDPA only when the
/// keys reach a chunk (`_ignore_causal_mask_sdpa`: `kv_length >= local_attention_size` keeps it),
/// else the chunked layers run causal SDPA.
pub fn chunk_mask(spec: &ModelSpec, attn: Attention, s_kv: u64) -> bool {
    spec.window_layers.count(spec.layers) > 0 && (attn == Attention::Eager || s_kv >= spec.window)
}

/// Whether `spec` is exactly the layout this module builds (what `estimator::unmodelled_feature`
/// accepts): Llama 4's experts and router, a shared expert, RoPE on every layer not in
/// `nope_layers`, the L2 q/k norm on those (or on none), chunks on RoPE layers only.
pub fn layout(spec: &ModelSpec) -> bool {
    use crate::estimator::model::{Activation, Router};
    // Chunks on exactly the RoPE layers (the default `layer_types`), or on none: what a layer
    // keeps then depends only on whether it has RoPE.
    let chunks = spec.window_layers.count(spec.layers) > 0;
    let rope_only_chunks = !chunks || (0..spec.layers).all(|i| spec.window_layers.contains(i) != spec.nope_layers.contains(i));
    spec.moe_all_experts
        && !spec.is_mla()
        && !spec.attn_sinks
        && spec.experts > 0
        && spec.router == Router::TopkSigmoid
        && !spec.router_bias
        && !spec.router_fp32
        && spec.router_groups <= 1
        && !spec.expert_bias
        && spec.experts_in_out
        && spec.shared_experts == 1
        && !spec.shared_gate
        && spec.dense_layers == 0
        && spec.act == Activation::Silu
        && (spec.window_kind == WindowKind::Chunked || spec.window_layers.count(spec.layers) == 0)
        && rope_only_chunks
        && super::common::has_rope(spec)
        && super::common::rotary_dims(spec) == spec.head_dim
}

/// `Llama4TextRMSNorm` ([`Rms::Llama4`]), in the layers and after them.
const NORM: Norm = Norm::Rms(Rms::Llama4);

/// `xq_ * freqs_cis[:, :, None, :]` on complex views: MulBackward0 keeps `freqs_cis` and makes
/// `grad * freqs_cis.conj()` (the conjugate resolved first: a copy of `freqs_cis`).
fn complex_mul(b: &mut Builder, x: Tid, f: Tid) -> Tid {
    let (shape, rg, bytes, dtype) = (b.shape(x), b.rg(x), b.bytes(x), b.t(x).dtype);
    let out = b.out(shape, Dt::F32, rg);
    let fb = b.bytes(f);
    let bw: &[B] = if rg {
        &[B::Alloc { bytes: fb, dtype, op: "clone" }, B::Alloc { bytes, dtype, op: "mul" }, B::Free(0), B::Grad { input: 0, temp: 1 }]
    } else {
        &[]
    };
    b.op("mul", "MulBackward0", &[x, f], &[out], &[S::In(1)], bw)[0]
}

/// `apply_rotary_emb(xq, xk, freqs_cis)`:
/// ```python
/// xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
/// xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
/// xq_out = torch.view_as_real(xq_ * freqs_cis[:, :, None, :]).flatten(3)
/// xk_out = torch.view_as_real(xk_ * freqs_cis[:, :, None, :]).flatten(3)
/// return xq_out.type_as(xq), xk_out.type_as(xk)
/// ```
/// `view_as_real`'s backward needs a contiguous gradient (`clone` when it is not: `q_contig`,
/// `k_contig` say whether it arrives contiguous).
pub fn rope(b: &mut Builder, q: Tid, k: Tid, f: Tid, q_contig: bool, k_contig: bool) -> (Tid, Tid) {
    let (qdt, kdt) = (b.t(q).dt, b.t(k).dt);
    let q32 = b.to_copy(q, Dt::F32);
    let qc = b.view(q32, b.shape(q32), "ViewAsComplexBackward0", false);
    let k32 = b.to_copy(k, Dt::F32);
    let kc = b.view(k32, b.shape(k32), "ViewAsComplexBackward0", false);
    let mq = complex_mul(b, qc, f);
    let qr = b.view(mq, b.shape(mq), "ViewAsRealBackward0", !q_contig);
    let mk = complex_mul(b, kc, f);
    let kr = b.view(mk, b.shape(mk), "ViewAsRealBackward0", !k_contig);
    let qo = b.to_copy(qr, qdt);
    let ko = b.to_copy(kr, kdt);
    // The function's locals (xq_, xk_, xq_out, xk_out) go at its return.
    for t in [q32, k32, mq, mk] {
        b.hold(t);
    }
    (qo, ko)
}

/// `attn_temperature_tuning` on a NoPE layer:
/// ```python
/// positions = torch.arange(s) + past_seen_tokens
/// attn_scales = torch.log1p(torch.floor((positions.float() + 1.0) / self.floor_scale)) * self.attn_scale + 1.0
/// query_states = (query_states * attn_scales.view(1, s, 1, 1).expand(b, s, 1, 1)).to(query_states.dtype)
/// ```
/// Returns the scaled q and the positions and scales (locals of the attention's forward).
fn temperature(b: &mut Builder, q: Tid) -> (Tid, [Tid; 2]) {
    let s1 = || Shape::new(&[Dim::Q(Q::S)], Split::None);
    let pos = arange(b);
    let pf = b.plain("_to_copy", &[pos], s1(), Dt::F32);
    let p1 = b.plain("add", &[pf], s1(), Dt::F32);
    let dv = b.plain("div", &[p1], s1(), Dt::F32);
    let fl = b.plain("floor", &[dv], s1(), Dt::F32);
    let lg = b.plain("log1p", &[fl], s1(), Dt::F32);
    let ml = b.plain("mul", &[lg], s1(), Dt::F32);
    let sc = b.plain("add", &[ml], s1(), Dt::F32);
    let qdt = b.t(q).dt;
    let shape = b.shape(q);
    let dt = if b.t(q).dtype.bytes() >= 4 { qdt } else { Dt::F32 };
    // `attn_scales.view(1, s, 1, 1).expand(b, s, 1, 1)`: MulBackward0 keeps the expanded view,
    // no memory of its own but packed at its own size (b·s·4 bytes) under activation offloading.
    let ex = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::N(1), Dim::N(1)], Split::None);
    let sv = b.view(sc, ex, "ExpandBackward0", false);
    let qs = b.mul_to(q, sv, shape, dt);
    let qs = b.to_copy(qs, qdt);
    // `attn_scales` and `positions` are locals of the attention's forward.
    b.p.tensors[sc as usize].hold = b.p.tensors[sc as usize].hold.max(b.last_op());
    (qs, [pos, sc])
}

/// `sdpa_attention_forward` with the chunked layers' boolean mask: k and v repeated to a heads
/// (`repeat_kv`: no `enable_gqa` with a mask on CPU), the mask turned additive in the model dtype
/// (`torch.where`, two `scalar_tensor`s), then the CPU flash kernel, which keeps the mask too.
fn sdpa_masked(b: &mut Builder, q: Tid, k: Tid, v: Tid, mask: Tid) -> Tid {
    let kr = repeat_kv(b, k);
    let vr = repeat_kv(b, v);
    let shape = Shape::new(&[Dim::Q(Q::B), Dim::N(1), Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None);
    sdpa_bool_mask(b, q, kr, vr, mask, MaskBuild { shape, before_autocast: true, hold_kv: true })
}

/// `Llama4TextAttention.forward`. q and k stay `[b, s, heads, d]` through RoPE, the L2 norm (RoPE
/// layers) or the temperature (NoPE layers), then are transposed for the core; v is transposed
/// at once. Returns the output and the eager attention weights.
fn attention(b: &mut Builder, w: &AttnW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let eager = attn == Attention::Eager;
    let rope_layer = sh.cos.is_some();
    let mask = sh.mask;
    let proj =
        |b: &mut Builder, w: Option<Tid>, bias: Option<Tid>, h: Q, module: &'static str, clone_bw: bool, lin: Linear| -> (Tid, Tid) {
            let y = head_proj(b, x, w, bias, h, module, lin);
            b.module = "self_attn";
            (y, b.view(y, heads_bshd(h), "ViewBackward0", clone_bw))
        };
    // Which gradients come back laid out [b, heads, s, d] (a copy for `view` or `view_as_real`):
    // eager attention's (matmul's copies, repeat_kv's sum), SDPA's for repeated k and v; SDPA's
    // dq (and dk, dv without repeat_kv) are laid out like q.
    let repeated = eager || mask.is_some();
    let (qy, q) = proj(b, w.wq, w.bq, Q::A, "self_attn.q_proj", eager && !rope_layer, Linear::Q);
    let (ky, k) = proj(b, w.wk, w.bk, Q::KV, "self_attn.k_proj", repeated && !rope_layer, Linear::K);
    let (vy, v) = proj(b, w.wv, w.bv, Q::KV, "self_attn.v_proj", repeated, Linear::V);
    let v = b.view(v, heads(Q::KV), "TransposeBackward0", false);
    b.part = Part::AttentionCore;
    b.module = "self_attn";
    let (q, k, pos) = match sh.cos {
        Some(f) => {
            let (q, k) = rope(b, q, k, f, !eager, !repeated);
            b.hold(qy);
            b.hold(ky);
            if spec.qk_l2_norm {
                // `Llama4TextL2Norm`: the RMSNorm without a weight.
                b.module = "self_attn.qk_norm";
                let (qn, kn) = in_group_of(b, Group::Rope, |b| (rms_norm(b, q, None, Rms::Llama4), rms_norm(b, k, None, Rms::Llama4)));
                b.module = "self_attn";
                (qn, kn, None)
            } else {
                (q, k, None)
            }
        }
        None => {
            let (qs, pos) = in_group_of(b, Group::Nope, |b| temperature(b, q));
            b.hold(qy);
            (qs, k, Some(pos))
        }
    };
    let qt = b.view(q, heads(Q::A), "TransposeBackward0", false);
    let kt = b.view(k, heads(Q::KV), "TransposeBackward0", false);
    let (o, weights) = if eager {
        // Llama 4's `eager_attention_forward`: Llama's with `softmax(attn_weights, dim=-1)` in the
        // scores' dtype (no fp32 upcast).
        eager_core_as(b, spec, [qt, kt, v], mask, Core { fp32: false, ..Core::LLAMA })
    } else {
        // SDPA keeps more on chunked (RoPE) layers (k and v repeated, the additive mask) than on
        // NoPE layers: its saves are counted per group.
        let o = in_group_of(b, if rope_layer { Group::Rope } else { Group::Nope }, |b| match mask {
            Some(m) => sdpa_masked(b, qt, kt, v, m),
            None => super::llama::sdpa_core(b, qt, kt, v),
        });
        (o, None)
    };
    let out = out_proj(b, o, w.wo, w.bo, "self_attn.o_proj");
    // The forward's locals (query_states, key_states, value_states, positions) go at its return.
    b.hold(q);
    b.hold(k);
    b.hold(vy);
    for t in pos.into_iter().flatten() {
        b.hold(t);
    }
    (out, weights)
}

/// Runs `f` with its saves counted in `group` (the RoPE or the NoPE layers'), then returns to
/// the layer's.
fn in_group_of<T>(b: &mut Builder, group: Group, f: impl FnOnce(&mut Builder) -> T) -> T {
    let g = b.group;
    b.group = group;
    let r = f(b);
    b.group = g;
    r
}

/// The MoE block's parameters in registration order (`experts.gate_up_proj`,
/// `experts.down_proj`, `router`, `shared_expert`).
#[derive(Clone, Copy)]
struct MoeW {
    gate_up: Option<Tid>,
    down: Option<Tid>,
    router: Option<Tid>,
    shared: MlpW,
}

impl MoeW {
    fn new(b: &mut Builder, p: &Params) -> MoeW {
        let gate_up = p.w(b, "layers.*.mlp.experts.gate_up_proj");
        let down = p.w(b, "layers.*.mlp.experts.down_proj");
        let router = p.w(b, "layers.*.mlp.router.weight");
        MoeW { gate_up, down, router, shared: MlpW::shared(b, p) }
    }
}

/// `[E, b, s, extra…]`: every expert's copy of every token.
fn all_pairs(extra: &[Dim]) -> Shape {
    let mut d = vec![Dim::X(X::E), Dim::Q(Q::B), Dim::Q(Q::S)];
    d.extend_from_slice(extra);
    Shape::new(&d, Split::None)
}

/// `Llama4Router.forward`:
/// ```python
/// router_logits = super().forward(hidden_states)
/// router_top_value, router_indices = torch.topk(router_logits, self.top_k, dim=1)
/// router_scores = torch.full_like(router_logits, float("-inf")).scatter_(1, router_indices, router_top_value)
/// router_scores = torch.nn.functional.sigmoid(router_scores.float()).to(router_scores.dtype)
/// ```
/// Returns (scores, logits).
fn router(b: &mut Builder, w: Option<Tid>, x2: Tid) -> (Tid, Tid) {
    b.module = "feed_forward.router";
    let e = tokens(&[Dim::X(X::E)]);
    let logits = match w {
        Some(w) => b.linear(x2, w, None, e),
        None => b.plain("mm", &[x2], e, Dt::Model),
    };
    let (vals, idx) = b.topk(logits, tokens(&[Dim::X(X::K)]));
    let full = b.plain("full_like", &[logits], e, b.t(logits).dt);
    // scatter_ in place: ScatterBackward0 keeps the indices; the source's gradient is `gather`.
    let (vb, vd, rg) = (b.bytes(vals), b.t(vals).dtype, b.rg(vals));
    let o = b.view_out(full, e);
    let o = Out { requires_grad: rg, ..o };
    let bw: &[B] = if rg { &[B::Alloc { bytes: vb, dtype: vd, op: "gather" }, B::Grad { input: 2, temp: 0 }] } else { &[] };
    let sc = b.op("scatter_", "ScatterBackward0", &[full, idx, vals], &[o], &[S::In(1)], bw)[0];
    let dt = b.t(logits).dt;
    let s32 = b.to_copy(sc, Dt::F32);
    let sg = b.unary("sigmoid", "SigmoidBackward0", s32, Keep::Output, "sigmoid_backward");
    let scores = b.to_copy(sg, dt);
    // `router_scores` names the scattered logits until the sigmoid's cast rebinds it; the
    // forward's locals (router_top_value, router_indices) go at its return.
    b.hold(full);
    b.hold(vals);
    b.hold(idx);
    (scores, logits)
}

/// Under autocast, `bmm` casts a parameter (a leaf that requires grad) through autocast's weight
/// cache (`cached_cast`): the copy lives until the autocast context exits.
fn cached_cast(b: &mut Builder, p: Tid) -> Tid {
    if !b.autocast {
        return p;
    }
    let part = b.part;
    b.part = Part::Autocast;
    let c = b.cast_weight(p);
    b.part = part;
    c
}

/// `hidden_states.repeat(E, 1)`: RepeatBackward0 sums the copies back (`sum`).
fn repeat(b: &mut Builder, x: Tid, shape: Shape) -> Tid {
    let (dt, rg, bytes, dtype) = (b.t(x).dt, b.rg(x), b.bytes(x), b.t(x).dtype);
    let out = b.out(shape, dt, rg);
    let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "sum" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    b.op("repeat", "RepeatBackward0", &[x], &[out], &[], bw)[0]
}

/// `Llama4TextMoe.forward`:
/// ```python
/// router_scores, router_logits = self.router(hidden_states)
/// routed_in = hidden_states.repeat(router_scores.shape[1], 1)
/// routed_in = routed_in * router_scores.transpose(0, 1).reshape(-1, 1)
/// routed_out = self.experts(routed_in)      # bmm with gate_up_proj, chunk, up * silu(gate), bmm with down_proj
/// out = self.shared_expert(hidden_states)
/// out.add_(routed_out.reshape(E, -1, h).sum(dim=0))
/// ```
/// Returns (out, router_logits).
fn moe(b: &mut Builder, w: &MoeW, x: Tid) -> (Tid, Tid) {
    b.part = Part::Moe;
    b.module = "feed_forward";
    let x2 = b.view(x, b.shape(x), "ViewBackward0", false);
    let (scores, logits) = router(b, w.router, x2);
    b.module = "feed_forward";
    let rep = repeat(b, x2, all_pairs(&[Dim::Q(Q::H)]));
    let st = b.view(scores, Shape::new(&[Dim::X(X::E), Dim::Q(Q::B), Dim::Q(Q::S)], Split::None), "TransposeBackward0", false);
    let sc = b.copy(st, all_pairs(&[Dim::N(1)]));
    let ri = b.mul(rep, sc);
    b.hold(rep);
    b.module = "feed_forward.experts";
    let gu_shape = all_pairs(&[Dim::N(2), Dim::X(X::FE)]);
    let gu = match w.gate_up {
        Some(p) => {
            let p = cached_cast(b, p);
            b.bmm(ri, p, gu_shape)
        }
        None => b.plain("bmm", &[ri], gu_shape, Dt::Model),
    };
    let (g, u) = b.chunk2(gu, all_pairs(&[Dim::X(X::FE)]));
    b.module = "feed_forward.experts.act_fn";
    let a = b.unary("silu", "SiluBackward0", g, Keep::Input, "silu_backward");
    b.module = "feed_forward.experts";
    let m = b.mul(u, a);
    let ro = match w.down {
        Some(p) => {
            let p = cached_cast(b, p);
            b.bmm(m, p, all_pairs(&[Dim::Q(Q::H)]))
        }
        None => b.plain("bmm", &[m], all_pairs(&[Dim::Q(Q::H)]), Dt::Model),
    };
    b.hold(gu);
    let out = gated_mlp(b, &w.shared, x2, &SHARED_EXPERT);
    b.module = "feed_forward";
    let rv = b.view(ro, all_pairs(&[Dim::Q(Q::H)]), "ViewBackward0", true);
    let sm = b.sum_dim(rv, tokens(&[Dim::Q(Q::H)]));
    let o = b.view_out(out, b.shape(out));
    let o = Out { requires_grad: b.rg(out) || b.rg(sm), ..o };
    let y = b.op("add_", "AddBackward0", &[out, sm], &[o], &[], &[B::Pass { input: 0, output: 0 }, B::Pass { input: 1, output: 0 }])[0];
    // The forward's locals (routed_in, routed_out) go at its return.
    b.hold(ri);
    b.hold(ro);
    b.hold(scores);
    (y, logits)
}

/// `Llama4TextMLP` as the shared expert (`intermediate_size`): `down(silu(gate(x)) * up(x))`.
const SHARED_EXPERT: Gated = Gated {
    modules: [
        "feed_forward.shared_expert.gate_proj",
        "feed_forward.shared_expert.activation_fn",
        "feed_forward.shared_expert.up_proj",
        "feed_forward.shared_expert",
        "feed_forward.shared_expert.down_proj",
    ],
    width: Dim::X(X::FS),
    act: SILU,
};

/// `Llama4TextDecoderLayer.forward`:
/// ```python
/// residual = hidden_states
/// hidden_states = self.input_layernorm(hidden_states)
/// attention_states, _ = self.self_attn(...)
/// hidden_states = residual + attention_states
/// residual = hidden_states
/// hidden_states = self.post_attention_layernorm(hidden_states)
/// hidden_states = self.feed_forward(hidden_states)
/// if self.is_moe_layer:
///     hidden_states, _ = hidden_states
/// hidden_states = residual + hidden_states.view(residual.shape)
/// ```
/// `attention_states` (o_proj's output) lives until the layer returns.
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    // Parameters in registration order: self_attn, feed_forward, the two norms.
    let aw = AttnW::new(b, p);
    let ffn = Ffn::new(b, p, kind, MoeW::new);
    // `hidden_states, _ = hidden_states` on MoE layers: the router logits rebind `_`.
    let ffn = |b: &mut Builder, n: Tid| match ffn {
        Ffn::Dense(mw) => (mlp(b, &mw, n), None),
        Ffn::Moe(w) => {
            let (m, logits) = moe(b, &w, n);
            (m, Some(logits))
        }
    };
    let how = Residual { attention_states: true, ..Residual::default() };
    decoder_layer_with(b, p, x, NORM, how, |b, n| attention(b, &aw, spec, n, sh, attn), |b, n| in_group(b, kind, |b| ffn(b, n)))
}

/// What `Llama4TextModel.forward` computes after the embedding (also a later pipeline stage's
/// prologue): `position_ids`, `create_causal_mask` (packed-sequence detection; eager
/// materializes it, SDPA runs causal) and `create_chunked_causal_mask` (packed-sequence
/// detection, then the chunk test: eager makes it additive, SDPA keeps it boolean), and the
/// rotary embedding (`freqs_cis`, complex: [`rotary_polar`], `[1, s, d/2]` complex64 — the
/// bytes of fp32 `[s, d]` — whatever the model dtype).
fn positions(b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
    let pos = cache_position(b);
    let mask = causal_mask(b, pos, attn);
    let chunks = spec.window_layers.count(spec.layers) > 0;
    let s_kv = b.c.n(Q::S_KV);
    let mask_local = if chunk_mask(spec, attn, s_kv) {
        Some(chunked_mask(b, pos, attn))
    } else {
        if chunks {
            // SDPA below one chunk: the left-padding count is made, then the mask is skipped.
            packed_detection(b, pos);
            b.plain("zeros", &[], Shape::new(&[Dim::Q(Q::B)], Split::None), Dt::I64);
        }
        None
    };
    let f = rotary_polar(
        b,
        pos,
        Shape::new(&[Dim::Q(Q::S), Dim::Half(Q::D)], Split::None),
        Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::D)], Split::None),
    );
    Shared { cos: Some(f), pos: Some(pos), mask, mask_local, ..Shared::default() }
}

/// `create_chunked_causal_mask` (`masking_utils.py`, `chunked_causal_mask_function` and
/// `sdpa_mask`): the chunk index of every key and query (`(idx - left_padding) // chunk`),
/// `eq`, `and` with causality; eager turns it into an additive `where` in the model dtype.
fn chunked_mask(b: &mut Builder, pos: Tid, attn: Attention) -> Tid {
    packed_detection(b, pos);
    let b4 = |d: [Dim; 4]| Shape::new(&d, Split::None);
    let (bb, one, s, skv) = (Dim::Q(Q::B), Dim::N(1), Dim::Q(Q::S), Dim::Q(Q::S_KV));
    let pad = b.plain("zeros", &[], Shape::new(&[bb], Split::None), Dt::I64);
    let m = sdpa_mask_of(b, |b, kv, qi| {
        let t = b.plain("new_ones", &[], Shape::scalar(), Dt::Bool);
        let ik = b.plain("index", &[pad], b4([bb, one, one, one]), Dt::I64);
        let sk = b.plain("sub", &[kv, ik], b4([bb, one, one, skv]), Dt::I64);
        let ck = b.plain("floor_divide", &[sk], b4([bb, one, one, skv]), Dt::I64);
        let iq = b.plain("index", &[pad], b4([bb, one, one, one]), Dt::I64);
        let sq = b.plain("sub", &[qi, iq], b4([bb, one, s, one]), Dt::I64);
        let cq = b.plain("floor_divide", &[sq], b4([bb, one, s, one]), Dt::I64);
        let eq = b.plain("eq", &[ck, cq], b4([bb, one, s, skv]), Dt::Bool);
        let and1 = b.plain("bitwise_and", &[t, eq], b4([bb, one, s, skv]), Dt::Bool);
        let le = b.plain("le", &[kv, qi], Shape::new(&[s, skv], Split::None), Dt::Bool);
        b.plain("bitwise_and", &[and1, le], b4([bb, one, s, skv]), Dt::Bool)
    });
    let m = if attn == Attention::Eager {
        let zero = b.plain("zeros", &[], Shape::scalar(), Dt::Resid);
        let min = b.plain("scalar_tensor", &[], Shape::scalar(), Dt::Resid);
        b.plain("where", &[m, zero, min], b4([bb, one, s, skv]), Dt::Resid)
    } else {
        m
    };
    b.hold(pad);
    set_part(b, m, Part::Checkpoints)
}

/// Llama 4's text model: 40 query / 8 KV heads of 128, MoE layers by `moe_rule` with `experts`
/// routed (top-1, sigmoid of the top logit, every expert computing every token) + one shared
/// expert of 8,192, dense layers of 16,384, every 4th layer NoPE, chunked attention (8,192) on
/// the RoPE layers, optional weightless L2 q/k norm there.
fn llama4(experts: u64, moe_rule: LayerRule, qk_l2_norm: bool, max_pos: u64) -> ModelSpec {
    let mut m = llama(202_048, 5120, 48, 40, 8, 16_384, max_pos);
    m.family = Family::Llama4;
    m.experts = experts;
    m.top_k = 1;
    m.expert_ffn = 8192;
    m.shared_experts = 1;
    m.shared_ffn = 8192;
    m.fused_experts = true;
    m.experts_in_out = true;
    m.moe_all_experts = true;
    m.router = Router::TopkSigmoid;
    m.qk_l2_norm = qk_l2_norm;
    ModelSpec {
        moe_rule,
        nope_layers: LayerRule::Every { step: 4, offset: 3 },
        window_layers: LayerRule::AllBut { step: 4, offset: 3 },
        window: 8192,
        window_kind: WindowKind::Chunked,
        ..m
    }
}

/// Llama 4's text model (see the module doc).
pub struct Llama4;
impl ConfigFile for Llama4 {
    /// Llama 4's text model (configuration_llama4.py `Llama4TextConfig`, modeling_llama4.py).
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_like(
            f,
            fields::Dims {
                vocab: 202_048,
                hidden: 5120,
                layers: 48,
                heads: 40,
                kv_heads: Some(8),
                head_dim: Some(128),
                ffn: 8192,
                max_pos: 131_072,
                tied: false,
            },
        )?;
        let l = m.layers as usize;
        // Routed experts and the shared expert use `intermediate_size`; dense layers
        // `intermediate_size_mlp` (`Llama4TextDecoderLayer`).
        m.expert_ffn = m.ffn;
        m.shared_experts = 1;
        m.shared_ffn = m.ffn;
        m.ffn = f.size("intermediate_size_mlp", 16_384)?;
        m.experts = f.size("num_local_experts", 16)?;
        m.top_k = f.uint_or("num_experts_per_tok", 1)?;
        m.fused_experts = true;
        m.experts_in_out = true;
        m.moe_all_experts = true;
        m.router = Router::TopkSigmoid;
        let bias = f.flag("attention_bias", false)?;
        m.qkv_bias = bias;
        m.o_bias = bias;
        // MoE layers: `moe_layers` as listed, else every `interleave_moe_layer_step`-th from step − 1.
        m.moe_rule = match f.get("moe_layers") {
            Some(_) => {
                let listed = f.list_len("moe_layers")?;
                LayerRule::from_flags(&(0..m.layers).map(|i| listed.contains(&i)).collect::<Vec<_>>())
            }
            None => {
                let step = f.uint_or("interleave_moe_layer_step", 1)?;
                if step == 0 {
                    return Err(HfError::Field { key: "interleave_moe_layer_step", reason: "must be at least 1".into() });
                }
                LayerRule::from_flags(&(0..m.layers).map(|i| i % step == step - 1).collect::<Vec<_>>())
            }
        };
        // `no_rope_layers[i]` is 1 where layer i uses RoPE; empty or absent: every
        // `no_rope_layer_interval`-th layer is NoPE.
        let rope = fields::rope_flags(f, l)?;
        m.nope_layers = LayerRule::from_flags(&rope.iter().map(|r| !r).collect::<Vec<_>>());
        m.qk_l2_norm = f.flag("use_qk_norm", true)?;
        // Default layer_types: chunked_attention on the RoPE layers when attention_chunk_size is set.
        let rope_rule = LayerRule::from_flags(&rope);
        fields::set_window(&mut m, f, "attention_chunk_size", Some(8192), (rope_rule, WindowKind::Chunked))?;
        Ok(m)
    }
    fn wrappers(&self) -> &'static [&'static str] {
        &["llama4"]
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(act) = writer::act_name(s.act) else { return Vec::new() };
        let chunked = s.window_kind == WindowKind::Chunked || s.window_layers.count(s.layers) == 0;
        if !chunked {
            return Vec::new();
        }
        let mut w = writer::Writer::new("llama4_text");
        writer::llama_sizes(&mut w, s);
        let rope: Vec<u64> = (0..s.layers).map(|i| u64::from(!s.nope_layers.contains(i))).collect();
        w.set("hidden_act", act)
            .set("intermediate_size", s.expert_ffn)
            .set("intermediate_size_mlp", s.ffn)
            .set("num_local_experts", s.experts)
            .set("num_experts_per_tok", s.top_k)
            .set("moe_layers", writer::indices(&s.moe_rule, s.layers))
            .set("no_rope_layers", rope)
            .set("use_qk_norm", s.qk_l2_norm)
            .set("attention_bias", s.qkv_bias)
            .set("attention_chunk_size", writer::window_or_null(s))
            .set("layer_types", writer::layer_types(s, "chunked_attention"))
            .done()
            .into_iter()
            .collect()
    }
}

impl Modeling for Llama4 {
    fn presets(&self) -> Vec<Preset> {
        vec![
            Preset::new(
                43,
                "llama-4-scout-17b-16e-instruct",
                "meta-llama/Llama-4-Scout-17B-16E-Instruct",
                "Llama 4",
                llama4(16, LayerRule::All, true, 10_485_760),
            )
            .with_notes(VISION_NOT_COUNTED),
            Preset::new(
                44,
                "llama-4-maverick-17b-128e-instruct",
                "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
                "Llama 4",
                llama4(128, LayerRule::Every { step: 2, offset: 1 }, false, 1_048_576),
            )
            .with_notes(VISION_NOT_COUNTED),
        ]
    }
    /// `Llama4TextModel.forward` before the layers: Llama's; the model's embedding weight is
    /// not handed to a tied head (which registers its own).
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        let (x0, sh) = embed_then(b, p, spec, ids, false, |b| positions(b, spec, attn));
        (x0, Shared { emb_w: None, ..sh })
    }
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        positions(b, spec, attn)
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
    fn norm(&self) -> Norm {
        NORM
    }
    /// The `chunked_attention` layers of `layer_types`.
    fn sliding(&self, spec: &ModelSpec, i: usize) -> bool {
        spec.window_kind == WindowKind::Chunked && spec.window_layers.contains(i as u64)
    }
    /// One complex `freqs_cis` `[s, d]` table (fp32 pairs), no sin.
    fn rope_tables(&self, spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
        has_rope(spec).then(|| (Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::D)], Split::None), Dt::F32, false))
    }
    /// Eager's causal mask, and the chunked layers' `[b, s, s_kv]` mask: additive in the
    /// residual dtype under eager, boolean under SDPA, which needs none below one chunk.
    fn mask_shapes(&self, b: &Builder, spec: &ModelSpec, attn: Attention) -> [Option<(Shape, Dt)>; 2] {
        let eager = attn == Attention::Eager;
        let dt = if eager { Dt::Resid } else { Dt::Bool };
        let chunks =
            chunk_mask(spec, attn, b.c.n(Q::S_KV)).then(|| (Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None), dt));
        [eager.then(|| mask_shape(attn)), chunks]
    }
    fn builds_own_layout(&self, spec: &ModelSpec) -> bool {
        layout(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::config::{Config, Kernels, Precision};
    use crate::estimator::expr::numbers_only;
    use crate::estimator::params::Stage;
    use crate::estimator::precision::recipe;
    use crate::estimator::presets::preset;
    use crate::estimator::step::families::Var;
    use crate::estimator::step::ledger::kept;
    use crate::estimator::step::model::Setup;

    /// The fixture's toy Llama 4 (h = 64, a = 4 heads of 16, k = 2, E = 4, K = 1, f_e = f_s = 40,
    /// f = 176, chunks of 48, layers 1 and 3 MoE, layer 3 NoPE of 4), fp32, eager, b = 2, s = 64.
    fn toy(attn: Attention) -> Config {
        let mut arch = preset("llama-4-maverick-17b-128e-instruct").expect("the preset exists").spec;
        (arch.hidden, arch.heads, arch.kv_heads, arch.head_dim, arch.layers, arch.vocab) = (64, 4, 2, 16, 4, 1000);
        (arch.experts, arch.expert_ffn, arch.shared_ffn, arch.ffn, arch.window, arch.qk_l2_norm) = (4, 40, 40, 176, 48, true);
        Config {
            model: "custom".into(),
            arch,
            batch: 2,
            seq: 64,
            precision: Precision::Fp32,
            attn,
            kernels: Kernels::Cpu,
            ..Config::default()
        }
    }

    #[test]
    fn moe_layers_follow_the_interleave_step() {
        let cfg = toy(Attention::Eager);
        let r = recipe(cfg.precision);
        let setup = Setup::new(&cfg, &r, Stage::Whole);
        assert_eq!(setup.kinds, [Kind::Dense, Kind::Moe, Kind::Dense, Kind::Moe]);
        assert!(!setup.var(0).nope && setup.var(0).sliding, "layer 0: RoPE, chunked");
        assert!(setup.var(3).nope && !setup.var(3).sliding, "layer 3: NoPE, full");
    }

    /// Under SDPA a chunked layer gets its mask (k and v repeated, the mask made additive and
    /// kept) only when the keys reach a chunk (48): at s = 64, not at s = 32.
    #[test]
    fn sdpa_masks_a_chunked_layer_only_from_one_chunk_of_keys_on() {
        for (seq, masked) in [(64, true), (32, false)] {
            let cfg = Config { seq, ..toy(Attention::Sdpa) };
            let r = recipe(cfg.precision);
            let ops: Vec<&str> = numbers_only(|| {
                let setup = Setup::new(&cfg, &r, Stage::Whole);
                let (prog, _, _) = setup.layer_alone(Kind::Dense, setup.var(0), 0, false);
                prog.ops.iter().map(|o| o.name).collect()
            });
            assert_eq!(ops.contains(&"where"), masked, "s = {seq}");
            assert_eq!(ops.iter().filter(|&&o| o == "clone").count() >= 2, masked, "s = {seq}: repeat_kv");
        }
    }

    /// A RoPE layer keeps the L2 norm's rsqrt of q and k, `[b, s, heads, 1]` fp32:
    /// 4·2·64·4 = 2,048 and 4·2·64·2 = 1,024 bytes (group `Rope`); a NoPE layer keeps the
    /// temperature scales `[s]` fp32, 4·64 = 256 bytes (group `Nope`); an MoE layer keeps every
    /// expert's copy of every token, `[E·b·s, h]` fp32: 4·4·128·64 = 131,072 bytes.
    #[test]
    fn rope_nope_and_moe_layers_keep_what_only_they_compute() {
        let cfg = toy(Attention::Eager);
        let r = recipe(cfg.precision);
        let rows = |kind: Kind, var: Var| {
            numbers_only(|| {
                let setup = Setup::new(&cfg, &r, Stage::Whole);
                let (prog, _, _) = setup.layer_alone(kind, var, 0, false);
                kept(&prog).iter().map(|k| (k.group, prog.tensors[k.t as usize].op, prog.tensors[k.t as usize].bytes)).collect::<Vec<_>>()
            })
        };
        let rope = rows(Kind::Dense, Var { sliding: true, nope: false, every_nth: false, linear: false });
        assert!(rope.contains(&(Group::Rope, "rsqrt", 2_048)), "{rope:?}");
        assert!(rope.contains(&(Group::Rope, "rsqrt", 1_024)), "{rope:?}");
        assert!(!rope.iter().any(|k| k.0 == Group::Nope));
        let nope = rows(Kind::Moe, Var { sliding: false, nope: true, every_nth: false, linear: false });
        assert!(nope.contains(&(Group::Nope, "add", 256)), "{nope:?}");
        assert!(!nope.iter().any(|k| k.0 == Group::Rope));
        assert!(nope.contains(&(Group::Moe, "repeat", 131_072)), "{nope:?}");
    }
}
