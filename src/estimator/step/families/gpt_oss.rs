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

use super::super::blocks::shapes::{heads, heads_bshd, tok};
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Group, Out, Shape, Split, Tid, B, S, X};
use super::common::{has_rope, mask_shape};
use super::common::{Kind, Params, Shared};
use super::llama::{repeat_kv, AttnW};
use super::modeling::Modeling;
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::Attention;
use crate::estimator::model::{Linear, ModelSpec};
use crate::estimator::step::part::Part;

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

/// `GptOssRMSNorm.forward`:
/// ```python
/// hidden_states = hidden_states.to(torch.float32)
/// variance = hidden_states.pow(2).mean(-1, keepdim=True)
/// hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
/// return (self.weight * hidden_states).to(input_dtype)  # main diff with Llama
/// ```
/// Unlike Llama's, the weight multiplies the fp32 normalized input: the product is fp32 and is
/// cast back after. Keeps the fp32 input (pow, mul), the rsqrt and the fp32 normalized input
/// (the weight's gradient); `variance` and the product live until the return.
pub fn rms_norm(b: &mut Builder, x: Tid, w: Option<Tid>) -> Tid {
    let in_dt = b.t(x).dt;
    let x32 = b.to_copy(x, Dt::F32);
    let sq = b.pow(x32);
    let var = b.mean_last(sq);
    let ve = b.add_scalar(var);
    let r = b.rsqrt(ve);
    let n32 = b.mul(x32, r);
    let p = match w {
        Some(w) => weight_mul(b, w, n32),
        None => n32,
    };
    let y = b.to_copy(p, in_dt);
    // `hidden_states` names the normalized input until the return.
    b.hold(var);
    b.hold(n32);
    b.hold(p);
    b.hold(x);
    y
}

/// `weight * x` for a `[h]` weight and an fp32 `[b, s, h]` input (type promotion: fp32 out).
/// MulBackward0: the input's gradient `grad * weight` (fp32), then the weight's `grad * x`
/// (fp32, full size); the engine's `validate_outputs` sums it to `[h]` (fp32) and, for a weight
/// of another dtype, casts the sum to it (`_to_copy`).
fn weight_mul(b: &mut Builder, w: Tid, x: Tid) -> Tid {
    let (shape, dt) = (b.shape(x), b.t(x).dt);
    let (rw, rx) = (b.rg(w), b.rg(x));
    let out = b.out(shape, dt, rw || rx);
    let (full, fd) = (b.bytes(x), b.t(x).dtype);
    let (wd, wg) = (b.t(w).dtype, b.grad_bytes(w));
    // The weight's elements in the product's dtype (the sum before the cast).
    let wsum = wg / wd.bytes().max(1) as u128 * fd.bytes() as u128;
    let mut bw: Vec<B> = Vec::with_capacity(10);
    let mut saved: Vec<S> = Vec::with_capacity(2);
    if rx {
        saved.push(S::In(0));
    }
    if rw {
        saved.push(S::In(1));
    }
    let mut temps = 0u8;
    let tx = if rx {
        bw.push(B::Alloc { bytes: full, dtype: fd, op: "mul" });
        temps += 1;
        Some(temps - 1)
    } else {
        None
    };
    let tw = if rw {
        bw.push(B::Alloc { bytes: full, dtype: fd, op: "mul" });
        bw.push(B::Apply);
        bw.push(B::Alloc { bytes: wsum, dtype: fd, op: "sum" });
        bw.push(B::Free(temps));
        let mut t = temps + 1;
        if wd != fd {
            bw.push(B::Alloc { bytes: wg, dtype: wd, op: "_to_copy" });
            bw.push(B::Free(t));
            t += 1;
        }
        Some(t)
    } else {
        None
    };
    if let Some(t) = tw {
        bw.push(B::Grad { input: 0, temp: t });
    }
    if let Some(t) = tx {
        bw.push(B::Grad { input: 1, temp: t });
    }
    b.op("mul", "MulBackward0", &[w, x], &[out], &saved, &bw)[0]
}

/// `a - b` (SubBackward0): `other`'s gradient `-grad` (`neg`, summed to its shape when it was
/// broadcast), `self`'s the gradient itself.
fn sub(b: &mut Builder, a: Tid, o: Tid) -> Tid {
    let (shape, dt) = (b.shape(a), b.t(a).dt);
    let (ra, ro) = (b.rg(a), b.rg(o));
    let out = b.out(shape, dt, ra || ro);
    let (full, fd) = (b.bytes(a), b.t(a).dtype);
    let mut bw: Vec<B> = Vec::with_capacity(6);
    if ro {
        bw.push(B::Alloc { bytes: full, dtype: fd, op: "neg" });
        if b.bytes(o) < full {
            bw.push(B::Apply);
            bw.push(B::Alloc { bytes: b.grad_bytes(o), dtype: b.t(o).dtype, op: "sum" });
            bw.push(B::Free(0));
            bw.push(B::Grad { input: 1, temp: 1 });
        } else {
            bw.push(B::Grad { input: 1, temp: 0 });
        }
    }
    if ra {
        bw.push(B::Pass { input: 0, output: 0 });
    }
    b.op("sub", "SubBackward0", &[a, o], &[out], &[], &bw)[0]
}

/// `_apply_rotary_emb(x, cos, sin)` on one of q, k (`[b, heads, s, d]`, cos/sin `[1, 1, s, d/2]`):
/// ```python
/// first_half, second_half = torch.chunk(x, 2, dim=-1)
/// first_ = first_half * cos - second_half * sin
/// second_ = second_half * cos + first_half * sin
/// return torch.cat((first_, second_), dim=-1)
/// ```
/// The products keep only the shared cos/sin; the output is a contiguous `cat`.
fn rope(b: &mut Builder, x: Tid, cos: Tid, sin: Tid) -> Tid {
    let full = b.shape(x);
    let half = full.last(Dim::Half(Q::D));
    let (first, second) = b.chunk2(x, half);
    let m1 = b.mul(first, cos);
    let m2 = b.mul(second, sin);
    let f = sub(b, m1, m2);
    let m3 = b.mul(second, cos);
    let m4 = b.mul(first, sin);
    let s = b.add(m3, m4);
    b.cat2(f, s, full)
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
    let AttnW { wq, bq, wk, bk, wv, bv, wo, bo, .. } = *w;
    let proj = |b: &mut Builder, w: Option<Tid>, bias: Option<Tid>, h: Q, module: &'static str, lin: Linear| -> (Tid, Tid) {
        b.module = module;
        b.part = Part::AttentionInputs;
        let y = match w {
            Some(w) => b.proj(x, w, bias, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(h), Dim::Q(Q::D)], Split::Tp), lin),
            None => x,
        };
        b.module = "self_attn";
        // Every gradient comes back laid out [b, heads, s, d] (a `cat`, repeat_kv's `sum`):
        // the view's backward copies it.
        let v = b.view(y, heads_bshd(h), "ViewBackward0", true);
        (y, b.view(v, heads(h), "TransposeBackward0", false))
    };
    let (qy, q) = proj(b, wq, bq, Q::A, "self_attn.q_proj", Linear::Q);
    let (ky, k) = proj(b, wk, bk, Q::KV, "self_attn.k_proj", Linear::K);
    let (vy, v) = proj(b, wv, bv, Q::KV, "self_attn.v_proj", Linear::V);
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
    b.part = Part::AttentionInputs;
    b.module = "self_attn.o_proj";
    let out = match wo {
        Some(w) => b.proj(o, w, bo, tok(Q::H), Linear::O),
        None => o,
    };
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

/// `[b, s, K, extra…]`: one row per token–expert pair.
fn pairs(extra: &[Dim]) -> Shape {
    let mut d = vec![Dim::Q(Q::B), Dim::Q(Q::S), Dim::X(X::K)];
    d.extend_from_slice(extra);
    Shape::new(&d, Split::None)
}

/// `[b, s, extra…]`: one row per token.
fn tokens(extra: &[Dim]) -> Shape {
    let mut d = vec![Dim::Q(Q::B), Dim::Q(Q::S)];
    d.extend_from_slice(extra);
    Shape::new(&d, Split::None)
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
/// `scalar_tensor`, the bound masks (bool), and `where`.
fn clamp(b: &mut Builder, x: Tid, both: bool) -> Tid {
    let (shape, dt, rg, bytes, dtype) = (b.shape(x), b.t(x).dt, b.rg(x), b.bytes(x), b.t(x).dtype);
    let out = b.out(shape, dt, rg);
    let mask = bytes / dtype.bytes().max(1) as u128;
    let scalar = dtype.bytes() as u128;
    use super::super::ir::DType;
    let bw: Vec<B> = if !rg {
        Vec::new()
    } else if both {
        vec![
            B::Alloc { bytes: scalar, dtype, op: "scalar_tensor" },
            B::Alloc { bytes: mask, dtype: DType::Bool, op: "gt" },
            B::Alloc { bytes: mask, dtype: DType::Bool, op: "lt" },
            B::Alloc { bytes, dtype, op: "where" },
            B::Free(2),
            B::Free(1),
            B::Free(0),
            B::Grad { input: 0, temp: 3 },
        ]
    } else {
        vec![
            B::Alloc { bytes: scalar, dtype, op: "scalar_tensor" },
            B::Alloc { bytes: mask, dtype: DType::Bool, op: "lt" },
            B::Alloc { bytes, dtype, op: "where" },
            B::Free(1),
            B::Free(0),
            B::Grad { input: 0, temp: 2 },
        ]
    };
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
    let sw = b.view(scores, pairs(&[]), "ViewBackward0", false);
    let ids = b.view(idx, pairs(&[]), "", false);
    let sorted = [b.out(pairs(&[]), Dt::I64, false), b.out(pairs(&[]), Dt::I64, false)];
    let r = b.plain_n("sort", &[ids], &sorted);
    let (ids_g, perm) = (r[0], r[1]);
    let tok_i = b.plain("floor_divide", &[perm], pairs(&[]), Dt::I64);
    let xg = b.index(x2, tok_i, pairs(&[Dim::Q(Q::H)]));
    let swg = b.index(sw, perm, pairs(&[]));
    let hf = b.plain("_to_copy", &[ids_g], pairs(&[]), Dt::F32);
    let hist = b.plain("histc", &[hf], Shape::new(&[Dim::X(X::E)], Split::None), Dt::F32);
    let offs = b.plain("cumsum", &[hist], Shape::new(&[Dim::X(X::E)], Split::None), Dt::I32);
    let gu_shape = pairs(&[Dim::N(2), Dim::X(X::FE)]);
    let bias_g = w.gate_up_b.map(|p| b.index(p, ids_g, gu_shape));
    let gu = match w.gate_up {
        Some(wg) => b.grouped_mm(xg, wg, offs, gu_shape),
        None => b.plain("_grouped_mm", &[xg], gu_shape, Dt::Model),
    };
    let gu = match bias_g {
        Some(bg) => add_(b, gu, bg),
        None => gu,
    };
    let m = apply_gate(b, gu);
    // `proj_out` names the projection until the gate's output rebinds it.
    b.hold(gu);
    let h_shape = pairs(&[Dim::Q(Q::H)]);
    let bias_d = w.down_b.map(|p| b.index(p, ids_g, h_shape));
    // `selected_biases` is rebound: the gate-up biases go.
    if let Some(bg) = bias_g {
        b.hold(bg);
    }
    let d = match w.down {
        Some(wd) => b.grouped_mm(m, wd, offs, h_shape),
        None => b.plain("_grouped_mm", &[m], h_shape, Dt::Model),
    };
    let d = match bias_d {
        Some(bd) => add_(b, d, bd),
        None => d,
    };
    let swu = b.view(swg, pairs(&[Dim::N(1)]), "UnsqueezeBackward0", false);
    let wo = b.mul(d, swu);
    let inv = b.plain("empty_like", &[perm], pairs(&[]), Dt::I64);
    let ar = b.plain("arange", &[], pairs(&[]), Dt::I64);
    b.op("index_put_", "", &[inv, perm, ar], &[], &[], &[]);
    let wr = b.index(wo, inv, h_shape);
    let wv = b.view(wr, h_shape, "ViewBackward0", true);
    let sm = b.sum_dim(wv, tokens(&[Dim::Q(Q::H)]));
    let out = b.to_copy(sm, out_dt);
    // The function's named locals live until it returns.
    for t in [ids_g, perm, xg, swg, hf, hist, offs, d, wr, inv, sm] {
        b.hold(t);
    }
    if let Some(bd) = bias_d {
        b.hold(bd);
    }
    out
}

/// `GptOssMLP.forward`: `hidden_states.reshape(-1, h)`, the router, the experts; the router's
/// logits (`_`) live until it returns, its scores are returned to the layer (its `_`).
fn mlp(b: &mut Builder, w: &MoeW, x: Tid) -> (Tid, Tid) {
    b.part = Part::Moe;
    b.module = "mlp";
    let x2 = b.view(x, b.shape(x), "ViewBackward0", false);
    let (logits, scores, idx) = router(b, w, x2);
    let out = experts(b, w, x2, scores, idx);
    b.module = "mlp";
    for t in [logits, idx, x2] {
        b.hold(t);
    }
    (out, scores)
}

/// `GptOssDecoderLayer.forward`: `input_layernorm` → attention (sinks) → residual →
/// `post_attention_layernorm` → the MoE block → residual.
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    let _ = (spec, kind);
    b.group = Group::All;
    // Parameters in registration order: self_attn (its own `sinks` before its submodules' q, k,
    // v, o), mlp, the two norms.
    let sinks = p.w(b, "layers.*.attn.sinks");
    let aw = AttnW::new(b, p);
    let mw = MoeW::new(b, p);
    let n_in = p.w(b, "layers.*.norm.weight");
    let n_post = p.w(b, "layers.*.norm.weight");
    b.module = "input_layernorm";
    b.part = Part::Norms;
    let n1 = rms_norm(b, x, n_in);
    let (a, weights) = attention(b, &aw, sinks, n1, sh, attn);
    b.hold(n1);
    b.module = "";
    b.part = Part::Norms;
    let h = b.add(x, a);
    b.module = "post_attention_layernorm";
    let n2 = rms_norm(b, h, n_post);
    b.group = Group::Moe;
    let (m, scores) = mlp(b, &mw, n2);
    b.group = Group::All;
    // `hidden_states, _ = self.mlp(…)` rebinds `_`: the attention weights go.
    if let Some(w) = weights {
        b.hold(w);
    }
    b.hold(n2);
    b.module = "";
    let y = b.add(h, m);
    b.hold(h);
    b.hold(scores);
    y
}

/// `GptOssModel.forward` before the layers: the token embedding, `position_ids` (`arange`),
/// `create_causal_mask` and `create_sliding_window_causal_mask` (no `position_ids` passed: no
/// packed-sequence detection; eager materializes both), and the rotary embedding.
pub fn embed(b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Option<Tid>, attn: Attention) -> (Tid, Shared) {
    b.part = Part::Embedding;
    b.module = "model.embed_tokens";
    let emb_w = ids.and_then(|_| p.w(b, "embed_tokens.weight"));
    let x0 = match (ids, emb_w) {
        (Some(ids), Some(w)) => super::llama::embedding(b, ids, w),
        (Some(ids), None) => b.plain("embedding", &[ids], tok(Q::H), Dt::Resid),
        // A later pipeline stage receives its input.
        (None, _) => {
            b.module = "model";
            let out = b.out(Shape::tok(Q::H), Dt::Resid, true);
            b.op("recv", "", &[], &[out], &[], &[])[0]
        }
    };
    b.module = "model";
    let s1 = || Shape::new(&[Dim::Q(Q::S)], Split::None);
    let ar = b.plain("arange", &[], s1(), Dt::I64);
    let pos = b.plain("add", &[ar], s1(), Dt::I64);
    b.p.tensors[pos as usize].part = Some(Part::Checkpoints);
    let (mask, mask_local) = if attn == Attention::Eager {
        let full = mask(b, false);
        let local = mask(b, true);
        (Some(full), Some(local))
    } else {
        (None, None)
    };
    let (cos, sin) = if super::common::has_rope(spec) {
        let (c, s) = rotary(b, spec, pos);
        (Some(c), Some(s))
    } else {
        (None, None)
    };
    let locals = if ids.is_some() { [Some(x0), None] } else { [None, None] };
    (
        x0,
        Shared {
            cos,
            sin,
            pos: Some(pos),
            mask,
            mask_local,
            emb_w: if spec.tied { emb_w } else { None },
            locals,
            cos_local: None,
            sin_local: None,
        },
    )
}

/// One materialized eager mask `[b, 1, s, s_kv]` (`sdpa_mask` + `where`): causal, or causal
/// within the sliding window.
fn mask(b: &mut Builder, sliding: bool) -> Tid {
    let s1 = || Shape::new(&[Dim::Q(Q::S)], Split::None);
    let ss = || Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None);
    let ba = b.plain("arange", &[], Shape::new(&[Dim::Q(Q::B)], Split::None), Dt::I64);
    let ha = b.plain("arange", &[], Shape::new(&[Dim::N(1)], Split::None), Dt::I64);
    let kv0 = b.plain("arange", &[], s1(), Dt::I64);
    let kv = b.plain("add", &[kv0], s1(), Dt::I64);
    let q0 = b.plain("arange", &[], s1(), Dt::I64);
    let qi = b.plain("add", &[q0], s1(), Dt::I64);
    let m = if sliding {
        let one = b.plain("new_ones", &[], Shape::scalar(), Dt::Bool);
        let sub = b.plain("sub", &[qi], s1(), Dt::I64);
        let gt = b.plain("gt", &[kv, sub], ss(), Dt::Bool);
        let and1 = b.plain("bitwise_and", &[one, gt], ss(), Dt::Bool);
        let le = b.plain("le", &[kv, qi], ss(), Dt::Bool);
        b.plain("bitwise_and", &[and1, le], ss(), Dt::Bool)
    } else {
        b.plain("le", &[kv, qi], ss(), Dt::Bool)
    };
    for t in [ba, ha, kv, qi] {
        b.hold(t);
    }
    let zero = b.plain("zeros", &[], Shape::scalar(), Dt::Resid);
    let min = b.plain("scalar_tensor", &[], Shape::scalar(), Dt::Resid);
    let w = b.plain("where", &[m, zero, min], Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None), Dt::Resid);
    b.p.tensors[w as usize].part = Some(Part::Checkpoints);
    w
}

/// `GptOssRotaryEmbedding.forward`: `freqs = position_ids[..., None].float() * inv_freq`,
/// `emb = freqs` (no `cat`: cos/sin are `[1, s, d/2]`), `cos = emb.cos() * attention_scaling`
/// (YaRN's factor), the same for sin, both cast to the hidden states' dtype.
fn rotary(b: &mut Builder, spec: &ModelSpec, pos: Tid) -> (Tid, Tid) {
    b.module = "model.rotary_emb";
    let half = cos_shape(spec);
    let pf = b.plain("_to_copy", &[pos], Shape::new(&[Dim::Q(Q::S)], Split::None), Dt::F32);
    let freqs = b.plain("mul", &[pf], half, Dt::F32);
    let c = b.plain("cos", &[freqs], half, Dt::F32);
    let cs = b.plain("mul", &[c], half, Dt::F32);
    let s = b.plain("sin", &[freqs], half, Dt::F32);
    let ss = b.plain("mul", &[s], half, Dt::F32);
    let cos = b.to_copy(cs, Dt::Resid);
    let sin = b.to_copy(ss, Dt::Resid);
    b.hold(freqs);
    b.hold(cs);
    b.hold(ss);
    for t in [cos, sin] {
        b.p.tensors[t as usize].part = Some(Part::Embedding);
    }
    (cos, sin)
}

/// The final norm (`model.norm`, gpt-oss's RMSNorm).
pub fn final_norm(b: &mut Builder, p: &Params, x: Tid) -> Tid {
    b.module = "model.norm";
    b.part = Part::Head;
    let w = p.w(b, "norm.weight");
    rms_norm(b, x, w)
}

/// The shape of gpt-oss's cos/sin `[s, d/2]`: its rotary embedding does not repeat its
/// frequencies.
fn cos_shape(spec: &ModelSpec) -> Shape {
    let _ = spec;
    Shape::new(&[Dim::Q(Q::S), Dim::Half(Q::D)], Split::None)
}

/// gpt-oss (see the module doc).
pub struct GptOss;
impl Modeling for GptOss {
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        embed(b, p, spec, Some(ids), attn)
    }
    fn receive(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, attn: Attention) -> (Tid, Shared) {
        embed(b, p, spec, None, attn)
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
    fn final_norm(&self, b: &mut Builder, p: &Params, _spec: &ModelSpec, x: Tid) -> Tid {
        final_norm(b, p, x)
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
    use crate::estimator::model::Router;
    use crate::estimator::params::Stage;
    use crate::estimator::precision::recipe;
    use crate::estimator::presets::presets;
    use crate::estimator::step::ledger::kept;
    use crate::estimator::step::model::Setup;

    fn preset(id: &str) -> ModelSpec {
        presets().into_iter().find(|p| p.id == id).map(|p| p.spec).expect("the preset exists")
    }

    #[test]
    fn both_gpt_oss_presets_have_the_layout_this_module_builds() {
        for id in ["gpt-oss-20b", "gpt-oss-120b"] {
            assert!(layout(&preset(id)), "{id}");
            assert!(crate::estimator::unmodelled_feature(&preset(id)).is_none(), "{id} is accepted");
        }
    }

    #[test]
    fn sinks_with_another_router_are_not_gpt_oss_and_stay_refused() {
        let spec = ModelSpec { router: Router::Softmax, ..preset("gpt-oss-20b") };
        assert!(!layout(&spec));
        assert!(crate::estimator::unmodelled_feature(&spec).is_some());
    }

    /// A toy gpt-oss (h = 64, a = 4 heads of 16, k = 2, E = 4, K = 2, f_e = 40), fp32, eager,
    /// b = 2, s = 64. The eager core keeps, per layer: the softmax of the scores with the sink
    /// column, 4·b·a·s·(s + 1) = 4·2·4·64·65 = 133,120 bytes, and the row maxima's int64
    /// indices, 8·b·a·s = 4,096 bytes.
    #[test]
    fn the_eager_core_keeps_the_softmax_with_the_sink_column_and_the_max_indices() {
        let mut arch = preset("gpt-oss-20b");
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
            let (prog, _, _) = setup.layer_alone(Kind::Moe, super::super::common::Var { sliding: true, nope: false }, 0, false);
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
