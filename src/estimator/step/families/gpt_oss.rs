//! gpt-oss (`modeling_gpt_oss.py`, transformers 5.24): Llama-shaped decoder layers whose
//! attention has biases, a half-split RoPE (`_apply_rotary_emb`), and a learned sink logit per
//! head joined to every row of the scores before the softmax (eager only: `_supports_sdpa =
//! False`); layers alternate sliding-window and full attention (`layer_types`); every layer's
//! feed-forward block is a mixture of experts with a biased top-k router (top-k of the logits,
//! then a softmax over those k) and biased experts stored `[E, in, out]` (gate and up columns
//! interleaved) run by `grouped_mm_experts_forward` (`integrations/moe.py`) with the clamped
//! SwiGLU of `GptOssExperts._apply_gate`.
//!
//! Every op below is one aten op the modeling code dispatches, in its order, checked allocation
//! by allocation against `tests/fixtures/pytorch/steps/gpt_oss__*.json`.

use super::super::blocks::shapes::{heads, heads_bshd};
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Out, Shape, Split, Tid, B, S, X};
use super::common::{
    additive_mask, cache_position, clamp_backward, has_rope, head_proj, mask_shape, out_proj, pairs, rotary_tables, rotate_halves,
    sdpa_mask, sub, to_heads, tokens,
};
use super::common::{AttnW, Kind, Norm, Params, Rms, Shared};
use super::llama::{decoder_layer_with, in_group, repeat_kv, Residual};
use super::modeling::{ConfigFile, Modeling};
use super::moe::{group_pairs, ungroup};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{Activation, LayerRule, Linear, ModelSpec, Router, WindowKind};
use crate::estimator::part::Part;
use crate::estimator::preset_base::{llama, Preset};
use serde_json::{Map, Value};

/// Whether `spec` is exactly the layout this module builds: sinks, sliding or full layers,
/// every layer an MoE layer with a biased top-k-then-softmax router (model dtype) and biased
/// `[E, in, out]` experts with the clamped SwiGLU, and nothing else the activation model refuses
/// (`estimator::unmodelled_feature` accepts such a spec).
pub fn layout(spec: &ModelSpec) -> bool {
    use crate::estimator::model::{Activation, LayerRule, Router, WindowKind};
    spec.attn_sinks
        && !spec.is_mla()
        && !spec.qk_l2_norm
        && spec.nope_layers.count(spec.layers) == 0
        && (spec.window_kind == WindowKind::Sliding || spec.window_layers.count(spec.layers) == 0)
        && spec.experts > 0
        && spec.dense_layers == 0
        && spec.moe_rule == LayerRule::All
        && spec.shared_experts == 0
        && spec.router == Router::TopkSoftmax
        && spec.router_bias
        && !spec.router_fp32
        && spec.router_groups <= 1
        && spec.expert_bias
        && spec.experts_in_out
        && !spec.moe_all_experts
        && spec.act == Activation::SwigluClamped
}

/// `GptOssRMSNorm` (the weight multiplies the fp32 normalized input: [`Rms::WeightFirst`]).
const NORM: Norm = Norm::Rms(Rms::WeightFirst { rows: false });

/// `_apply_rotary_emb(x, cos, sin)` on one of q, k (`[b, heads, s, d]`, cos/sin `[1, 1, s, d/2]`):
/// `first_half, second_half = torch.chunk(x, 2, dim=-1)`, then [`rotate_halves`].
fn rope(b: &mut Builder, x: Tid, cos: Tid, sin: Tid) -> Tid {
    let full = b.shape(x);
    let half = full.last(Dim::Half(Q::D));
    let (first, second) = b.chunk2(x, half);
    rotate_halves(b, first, second, cos, sin, full)
}

/// `GptOssAttention.forward` with `eager_attention_forward` (sinks): projections with biases,
/// the half-split RoPE on q then k (the projections' outputs go when q and k are rebound), the
/// core, `o_proj`. Returns the output and `attn_weights` (held by the layer's `_`).
///
/// transformers 5.24 runs gpt-oss eager only (`_supports_sdpa = False`). Asked for `sdpa`, the
/// core is SDPA's flash kernel (what the flash-attention kernels with sinks keep: q, k, v, the
/// output and the log-sum-exp; the sinks' `[a]` gradient is not modelled) — unmeasured, and
/// `estimate` says so in its warnings.
fn attention(b: &mut Builder, w: &AttnW, sinks: Option<Tid>, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let proj = |b: &mut Builder, w: Option<Tid>, bias: Option<Tid>, h: Q, module: &'static str, lin: Linear| -> (Tid, Tid) {
        let y = head_proj(b, x, w, bias, h, module, lin);
        b.module = "self_attn";
        // Every gradient comes back laid out [b, heads, s, d] (a `cat`, repeat_kv's `sum`):
        // the view's backward copies it.
        (y, to_heads(b, y, h, true))
    };
    let (qy, q) = proj(b, w.wq, w.bq, Q::A, "self_attn.q_proj", Linear::Q);
    let (ky, k) = proj(b, w.wk, w.bk, Q::KV, "self_attn.k_proj", Linear::K);
    let (vy, v) = proj(b, w.wv, w.bv, Q::KV, "self_attn.v_proj", Linear::V);
    b.part = Part::AttentionCore;
    b.module = "self_attn";
    let (q, k) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) => {
            let qe = rope(b, q, cos, sin);
            let ke = rope(b, k, cos, sin);
            b.hold(qy);
            b.hold(ky);
            (qe, ke)
        }
        _ => (q, k),
    };
    let (o, weights) = if attn == Attention::Eager {
        let (o, w) = eager_sinks(b, q, k, v, sh.mask, sinks);
        (o, Some(w))
    } else {
        (super::llama::sdpa_core_copy(b, q, k, v, true), None)
    };
    let out = out_proj(b, o, w.wo, w.bo, "self_attn.o_proj");
    // The forward's locals (query_states, key_states, value_states) go at its return.
    b.hold(q);
    b.hold(k);
    b.hold(vy);
    (out, weights)
}

/// `[b, a, s, s_kv + 1]`: the scores with the sink column.
fn combined() -> Shape {
    Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::A), Dim::Q(Q::S), Dim::Plus1(Q::S_KV)], Split::Tp)
}

/// gpt-oss's `eager_attention_forward`:
/// ```python
/// key_states = repeat_kv(key, n_rep); value_states = repeat_kv(value, n_rep)
/// attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
/// attn_weights = attn_weights + attention_mask
/// sinks = module.sinks.reshape(1, -1, 1, 1).expand(b, -1, s, -1)
/// combined_logits = torch.cat([attn_weights, sinks], dim=-1)
/// combined_logits = combined_logits - combined_logits.max(dim=-1, keepdim=True).values
/// probs = F.softmax(combined_logits, dim=-1, dtype=combined_logits.dtype)
/// scores = probs[..., :-1]  # we drop the sink here
/// attn_weights = nn.functional.dropout(scores, p=dropout, training=module.training).to(value_states.dtype)
/// attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
/// ```
/// q is RoPE's contiguous `cat` (matmul views it); the scores gain one column (the sink), the
/// row max is kept as indices (MaxBackward0), the softmax keeps its output `[b, a, s, s_kv + 1]`
/// in the scores' dtype (not fp32). Returns `[b, s, a·d]` and `attn_weights`.
fn eager_sinks(b: &mut Builder, q: Tid, k: Tid, v: Tid, mask: Option<Tid>, sinks: Option<Tid>) -> (Tid, Tid) {
    let gqa = b.c.n(Q::KV) != b.c.n(Q::A);
    let (kr, vr) = if gqa { (repeat_kv(b, k), repeat_kv(b, v)) } else { (k, v) };
    let sc = b.bmm(q, kr, super::super::blocks::shapes::scores());
    let sm = b.mul_scalar(sc);
    let sa = match mask {
        Some(m) => b.add(sm, m),
        None => sm,
    };
    let dt = b.t(sa).dt;
    // The sinks `[a]` viewed `[1, a, 1, 1]` and expanded (ExpandBackward0 sums back to them).
    let sink_shape = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::A), Dim::Q(Q::S), Dim::N(1)], Split::Tp);
    let se = match sinks {
        Some(p) => {
            let sink_dt = b.t(p).dt;
            let rv = b.view(p, Shape::new(&[Dim::N(1), Dim::Q(Q::A), Dim::N(1), Dim::N(1)], Split::Tp), "ViewBackward0", false);
            let out = Out { shape: sink_shape, dt: sink_dt, view_of: Some(rv), requires_grad: b.rg(rv) };
            let (gb, gd) = (b.grad_bytes(p), b.t(p).dtype);
            let bw: &[B] = if b.rg(rv) { &[B::Alloc { bytes: gb, dtype: gd, op: "sum" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
            b.op("expand", "ExpandBackward0", &[rv], &[out], &[], bw)[0]
        }
        None => b.plain("zeros", &[], sink_shape, dt),
    };
    let cat = b.cat2(sa, se, combined());
    let rows = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::A), Dim::Q(Q::S), Dim::N(1)], Split::Tp);
    let mx = max_last(b, cat, rows);
    let cl = sub(b, cat, mx);
    let pr = b.unary("_softmax", "SoftmaxBackward0", cl, Keep::Output, "_softmax_backward_data");
    let sc = b.slice(pr, super::super::blocks::shapes::scores());
    let sc = b.dropout(sc);
    let vdt = b.t(vr).dt;
    let aw = b.to_copy(sc, vdt);
    // `attn_weights` names the masked scores until the probabilities rebind it.
    b.hold(sa);
    let o = b.bmm(aw, vr, heads(Q::A));
    let o = b.view(o, heads(Q::A), "UnsafeViewBackward0", true);
    let ot = b.view(o, heads_bshd(Q::A), "TransposeBackward0", false);
    let oc = b.copy(ot, heads_bshd(Q::A));
    // The function's locals go at its return (combined_logits, the repeated k and v).
    b.hold(cl);
    if gqa {
        b.hold(kr);
        b.hold(vr);
    }
    let out = b.view(oc, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::A), Dim::Q(Q::D)], Split::Tp), "ViewBackward0", false);
    (out, aw)
}

/// `x.max(dim=-1, keepdim=True)`: values (with gradient) and int64 indices `[…, 1]`; only
/// `.values` is used, the indices are kept by MaxBackward0 (`value_selecting_reduction_backward`:
/// `new_zeros` of the input, then `scatter`).
fn max_last(b: &mut Builder, x: Tid, rows: Shape) -> Tid {
    let (dt, rg, bytes, dtype) = (b.t(x).dt, b.rg(x), b.bytes(x), b.t(x).dtype);
    let outs = [b.out(rows, dt, rg), b.out(rows, Dt::I64, false)];
    let bw: &[B] = if rg {
        &[B::Alloc { bytes, dtype, op: "new_zeros" }, B::Alloc { bytes, dtype, op: "scatter" }, B::Free(0), B::Grad { input: 0, temp: 1 }]
    } else {
        &[]
    };
    let r = b.op("max", "MaxBackward0", &[x], &outs, &[S::Out(1)], bw);
    // The values are a temporary of the expression; the indices live in the node.
    r[0]
}

/// The MoE block's parameters in registration order (`router.weight`, `router.bias`,
/// `experts.gate_up_proj`, `gate_up_proj_bias`, `down_proj`, `down_proj_bias`).
#[derive(Clone, Copy)]
struct MoeW {
    router: Option<Tid>,
    router_b: Option<Tid>,
    gate_up: Option<Tid>,
    gate_up_b: Option<Tid>,
    down: Option<Tid>,
    down_b: Option<Tid>,
}

impl MoeW {
    fn new(b: &mut Builder, p: &Params) -> MoeW {
        MoeW {
            router: p.w(b, "layers.*.mlp.router.weight"),
            router_b: p.w(b, "layers.*.mlp.router.bias"),
            gate_up: p.w(b, "layers.*.mlp.experts.gate_up_proj"),
            gate_up_b: p.w(b, "layers.*.mlp.experts.gate_up_proj_bias"),
            down: p.w(b, "layers.*.mlp.experts.down_proj"),
            down_b: p.w(b, "layers.*.mlp.experts.down_proj_bias"),
        }
    }
}

/// `GptOssTopKRouter.forward`:
/// ```python
/// router_logits = F.linear(hidden_states, self.weight, self.bias)
/// router_top_value, router_indices = torch.topk(router_logits, self.top_k, dim=-1)
/// router_scores = torch.nn.functional.softmax(router_top_value, dim=1, dtype=router_top_value.dtype)
/// ```
/// Returns (logits, scores, indices); the top values go at the return.
fn router(b: &mut Builder, w: &MoeW, x2: Tid) -> (Tid, Tid, Tid) {
    b.module = "mlp.router";
    let logits = match w.router {
        Some(rw) => b.linear(x2, rw, w.router_b, tokens(&[Dim::X(X::E)])),
        None => b.plain("addmm", &[x2], tokens(&[Dim::X(X::E)]), Dt::Model),
    };
    let (vals, idx) = b.topk(logits, tokens(&[Dim::X(X::K)]));
    let scores = b.unary("_softmax", "SoftmaxBackward0", vals, Keep::Output, "_softmax_backward_data");
    (logits, scores, idx)
}

/// `out.add_(bias)` in place (`_grouped_linear`): AddBackward0 hands the gradient to both.
fn add_(b: &mut Builder, out: Tid, bias: Tid) -> Tid {
    let shape = b.shape(out);
    let o = b.view_out(out, shape);
    let o = Out { requires_grad: b.rg(out) || b.rg(bias), ..o };
    let bw: &[B] = &[B::Pass { input: 0, output: 0 }, B::Pass { input: 1, output: 0 }];
    b.op("add_", "AddBackward0", &[out, bias], &[o], &[], bw)[0]
}

/// `x.clamp(min, max)` (both bounds) or `x.clamp(max=…)`: ClampBackward1 keeps x; backward
/// [`clamp_backward`].
fn clamp(b: &mut Builder, x: Tid, both: bool) -> Tid {
    let (shape, dt, rg) = (b.shape(x), b.t(x).dt, b.rg(x));
    let out = b.out(shape, dt, rg);
    let bw = clamp_backward(b, x, both);
    b.op("clamp", "ClampBackward1", &[x], &[out], &[S::In(0)], &bw)[0]
}

/// `GptOssExperts._apply_gate` on the interleaved `[S, 2·f_e]` projection:
/// ```python
/// gate, up = gate_up[..., ::2], gate_up[..., 1::2]
/// gate = gate.clamp(min=None, max=self.limit)
/// up = up.clamp(min=-self.limit, max=self.limit)
/// glu = gate * torch.sigmoid(gate * self.alpha)
/// return (up + 1) * glu
/// ```
fn apply_gate(b: &mut Builder, gu: Tid) -> Tid {
    let half = pairs(&[Dim::X(X::FE)]);
    let g = b.slice(gu, half);
    let u = b.slice(gu, half);
    let g = clamp(b, g, false);
    let u = clamp(b, u, true);
    let ga = b.mul_scalar(g);
    let sg = b.unary("sigmoid", "SigmoidBackward0", ga, Keep::Output, "sigmoid_backward");
    let glu = b.mul(g, sg);
    let u1 = b.add_scalar(u);
    let out = b.mul(u1, glu);
    // The function's locals (gate, up, glu) go at its return.
    b.hold(g);
    b.hold(u);
    b.hold(glu);
    out
}

/// `grouped_mm_experts_forward` with biases and `[E, in, out]` weights: sort the pairs by
/// expert, gather their tokens and scores, per-pair biases (`bias[expert_ids_g]`) added in place
/// after each grouped GEMM, the clamped SwiGLU, the routing weights (model dtype), the order
/// restored and each token's K rows summed.
fn experts(b: &mut Builder, w: &MoeW, x2: Tid, scores: Tid, idx: Tid) -> Tid {
    b.module = "mlp.experts";
    let out_dt = b.t(x2).dt;
    let g = group_pairs(b, x2, scores, idx);
    let gu_shape = pairs(&[Dim::N(2), Dim::X(X::FE)]);
    let bias_g = w.gate_up_b.map(|p| b.index(p, g.ids_g, gu_shape));
    let gu = match w.gate_up {
        Some(wg) => b.grouped_mm(g.xg, wg, g.offs, gu_shape),
        None => b.plain("_grouped_mm", &[g.xg], gu_shape, Dt::Model),
    };
    let gu = match bias_g {
        Some(bg) => add_(b, gu, bg),
        None => gu,
    };
    let m = apply_gate(b, gu);
    // `proj_out` names the projection until the gate's output rebinds it.
    b.hold(gu);
    let h_shape = pairs(&[Dim::Q(Q::H)]);
    let bias_d = w.down_b.map(|p| b.index(p, g.ids_g, h_shape));
    // `selected_biases` is rebound: the gate-up biases go.
    if let Some(bg) = bias_g {
        b.hold(bg);
    }
    let d = match w.down {
        Some(wd) => b.grouped_mm(m, wd, g.offs, h_shape),
        None => b.plain("_grouped_mm", &[m], h_shape, Dt::Model),
    };
    let d = match bias_d {
        Some(bd) => add_(b, d, bd),
        None => d,
    };
    let swu = b.view(g.swg, pairs(&[Dim::N(1)]), "UnsqueezeBackward0", false);
    let wo = b.mul(d, swu);
    let out = ungroup(b, &g, wo, out_dt);
    b.hold(d);
    if let Some(bd) = bias_d {
        b.hold(bd);
    }
    out
}

/// `GptOssMLP.forward`: `hidden_states.reshape(-1, h)`, the router, the experts; the router's
/// logits (`_`) live until it returns, its scores are returned to the layer (its `_`).
fn mlp(b: &mut Builder, w: &MoeW, x: Tid) -> (Tid, Option<Tid>) {
    b.part = Part::Moe;
    b.module = "mlp";
    let x2 = b.view(x, b.shape(x), "ViewBackward0", false);
    let (logits, scores, idx) = router(b, w, x2);
    let out = experts(b, w, x2, scores, idx);
    b.module = "mlp";
    for t in [logits, idx, x2] {
        b.hold(t);
    }
    (out, Some(scores))
}

/// `GptOssDecoderLayer.forward`: Llama's ([`decoder_layer_with`]) with the attention's sinks,
/// and the MoE block's router scores bound to the layer's `_` (`hidden_states, _ = self.mlp(…)`).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    // Parameters in registration order: self_attn (its own `sinks` before its submodules' q, k,
    // v, o), mlp, the two norms.
    let sinks = p.w(b, "layers.*.attn.sinks");
    let aw = AttnW::new(b, p);
    let mw = MoeW::new(b, p);
    let attention = |b: &mut Builder, n: Tid| attention(b, &aw, sinks, n, sh, attn);
    decoder_layer_with(b, p, x, NORM, Residual::default(), attention, |b, n| in_group(b, Kind::Moe, |b| mlp(b, &mw, n)))
}

/// What `GptOssModel.forward` computes after the embedding (also a later pipeline stage's
/// prologue): `position_ids` (`arange`), `create_causal_mask` and
/// `create_sliding_window_causal_mask` (no `position_ids` passed: no packed-sequence detection;
/// eager materializes both), and `GptOssRotaryEmbedding.forward` ([`rotary_tables`]:
/// `emb = freqs`, no `cat`: cos/sin are `[1, s, d/2]`; `attention_scaling` is YaRN's factor;
/// both cast to the hidden states' dtype).
fn positions(b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
    let pos = cache_position(b);
    let masks = (attn == Attention::Eager).then(|| {
        let full = sdpa_mask(b, false);
        let full = additive_mask(b, full);
        let local = sdpa_mask(b, true);
        (full, additive_mask(b, local))
    });
    let (cos, sin) = if has_rope(spec) {
        let (c, s) = rotary_tables(b, pos, cos_shape(spec), None, true);
        (Some(c), Some(s))
    } else {
        (None, None)
    };
    Shared { cos, sin, pos: Some(pos), mask: masks.map(|m| m.0), mask_local: masks.map(|m| m.1), ..Shared::default() }
}

/// The shape of gpt-oss's cos/sin `[s, d/2]`: its rotary embedding does not repeat its
/// frequencies.
fn cos_shape(spec: &ModelSpec) -> Shape {
    let _ = spec;
    Shape::new(&[Dim::Q(Q::S), Dim::Half(Q::D)], Split::None)
}

/// gpt-oss: 64 query / 8 KV heads of 64 with biases and sinks, every layer MoE (top-4) with
/// biased experts of 2,880 stored [E, in, out] and a clamped SwiGLU, biased top-k-softmax router,
/// sliding window of 128 on the even layers, 201,088 vocabulary.
fn gpt_oss(layers: u64, experts: u64) -> ModelSpec {
    let mut m = llama(201_088, 2880, layers, 64, 8, 0, 131_072);
    m.family = Family::GptOss;
    m.head_dim = 64;
    m.qkv_bias = true;
    m.o_bias = true;
    m.attn_sinks = true;
    m.act = Activation::SwigluClamped;
    m.experts = experts;
    m.top_k = 4;
    m.expert_ffn = 2880;
    m.fused_experts = true;
    m.experts_in_out = true;
    m.expert_bias = true;
    m.router = Router::TopkSoftmax;
    m.router_bias = true;
    ModelSpec { window_layers: LayerRule::Every { step: 2, offset: 0 }, window: 128, ..m }
}

/// gpt-oss (see the module doc).
pub struct GptOss;
impl ConfigFile for GptOss {
    /// gpt-oss (configuration_gpt_oss.py, modeling_gpt_oss.py): biased q/k/v/o, attention sinks,
    /// alternating sliding (128) and full layers, every layer MoE with biased experts stored
    /// `[E, h, 2f]`/`[E, f, h]`, a biased router whose top-k logits are softmaxed, clamped SwiGLU.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_like(
            f,
            fields::Dims {
                vocab: 201_088,
                hidden: 2880,
                layers: 36,
                heads: 64,
                kv_heads: Some(8),
                head_dim: Some(64),
                ffn: 2880,
                max_pos: 131_072,
                tied: false,
            },
        )?;
        m.expert_ffn = m.ffn;
        m.ffn = 0;
        m.act = Activation::SwigluClamped;
        m.experts = f.size_any(&["num_local_experts", "num_experts"], 128)?;
        m.top_k = f.uint_or("num_experts_per_tok", 4)?;
        m.fused_experts = true;
        m.experts_in_out = true;
        m.expert_bias = true;
        m.router = Router::TopkSoftmax;
        m.router_bias = true;
        m.attn_sinks = true;
        let bias = f.flag("attention_bias", true)?;
        m.qkv_bias = bias;
        m.o_bias = bias;
        // Default layer_types: sliding_attention where (i + 1) % 2 != 0, i.e. the even layers.
        fields::set_window(&mut m, f, "sliding_window", Some(128), (LayerRule::Every { step: 2, offset: 0 }, WindowKind::Sliding))?;
        Ok(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let mut w = writer::Writer::new("gpt_oss");
        writer::llama_sizes(&mut w, s);
        w.set("intermediate_size", s.expert_ffn)
            .set("num_local_experts", s.experts)
            .set("num_experts_per_tok", s.top_k)
            .set("attention_bias", s.qkv_bias)
            .set("sliding_window", writer::window_or_null(s))
            .set("layer_types", writer::layer_types(s, "sliding_attention"))
            .done()
            .into_iter()
            .collect()
    }
}

impl Modeling for GptOss {
    fn presets(&self) -> Vec<Preset> {
        const MXFP4: &[&str] =
            &["the checkpoint stores its experts in MXFP4; trainmem assumes training from the dequantized weights in the recipe's dtype (e.g. bf16)"];
        vec![
            Preset::new(41, "gpt-oss-20b", "openai/gpt-oss-20b", "gpt-oss", gpt_oss(24, 32)).with_notes(MXFP4),
            Preset::new(42, "gpt-oss-120b", "openai/gpt-oss-120b", "gpt-oss", gpt_oss(36, 128)).with_notes(MXFP4),
        ]
    }
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        positions(b, spec, attn)
    }
    fn layer(&self, b: &mut Builder, p: &Params, _spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, x, sh, attn)
    }
    fn norm(&self) -> Norm {
        NORM
    }
    /// `layer_types`' `sliding_attention` layers.
    fn sliding(&self, spec: &ModelSpec, i: usize) -> bool {
        spec.window_layers.contains(i as u64)
    }
    fn rope_tables(&self, spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
        has_rope(spec).then(|| (cos_shape(spec), Dt::Resid, true))
    }
    /// Eager attention materializes both the causal and the sliding-window mask.
    fn mask_shapes(&self, _b: &Builder, _spec: &ModelSpec, attn: Attention) -> [Option<(Shape, Dt)>; 2] {
        let eager = attn == Attention::Eager;
        [eager.then(|| mask_shape(attn)), eager.then(|| mask_shape(attn))]
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
    use crate::estimator::step::ledger::kept;
    use crate::estimator::step::model::Setup;

    /// A toy gpt-oss (h = 64, a = 4 heads of 16, k = 2, E = 4, K = 2, f_e = 40), fp32, eager,
    /// b = 2, s = 64. The eager core keeps, per layer: the softmax of the scores with the sink
    /// column, 4·b·a·s·(s + 1) = 4·2·4·64·65 = 133,120 bytes, and the row maxima's int64
    /// indices, 8·b·a·s = 4,096 bytes.
    #[test]
    fn the_eager_core_keeps_the_softmax_with_the_sink_column_and_the_max_indices() {
        let mut arch = preset("gpt-oss-20b").expect("the preset exists").spec;
        (arch.hidden, arch.heads, arch.kv_heads, arch.head_dim, arch.layers, arch.vocab) = (64, 4, 2, 16, 2, 1000);
        (arch.experts, arch.top_k, arch.expert_ffn, arch.window) = (4, 2, 40, 48);
        let cfg = Config {
            model: "custom".into(),
            arch,
            batch: 2,
            seq: 64,
            precision: Precision::Fp32,
            attn: Attention::Eager,
            kernels: Kernels::Cpu,
            ..Config::default()
        };
        let r = recipe(cfg.precision);
        let sizes: Vec<u128> = numbers_only(|| {
            let setup = Setup::new(&cfg, &r, Stage::Whole);
            let (prog, _, _) = setup.layer_alone(
                Kind::Moe,
                super::super::common::Var { sliding: true, nope: false, every_nth: false, linear: false },
                0,
                false,
            );
            kept(&prog)
                .iter()
                .filter(|k| matches!(prog.tensors[k.t as usize].op, "_softmax" | "max"))
                .map(|k| prog.tensors[k.t as usize].bytes)
                .collect()
        });
        assert!(sizes.contains(&133_120), "{sizes:?}");
        assert!(sizes.contains(&4_096), "{sizes:?}");
    }
}
