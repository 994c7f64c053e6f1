//! Sparse mixture-of-experts blocks of transformers 5: a top-k router (`MixtralTopKRouter`)
//! and 3-D expert weights run by `grouped_mm_experts_forward` (`integrations/moe.py`, the
//! default `experts_implementation`), whose sizes depend only on the S = b·s·K token–expert
//! pairs, not on the routing.

use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Shape, Split, Tid, X};
use super::common::Params;
use crate::estimator::activations::ctx::Q;
use crate::estimator::step::part::Part;

/// The block's parameters in registration order (`gate`, `experts.gate_up_proj`,
/// `experts.down_proj`).
#[derive(Clone, Copy)]
pub struct MoeW {
    pub router: Option<Tid>,
    pub gate_up: Option<Tid>,
    pub down: Option<Tid>,
}

impl MoeW {
    pub fn new(b: &mut Builder, p: &Params) -> MoeW {
        let router = p.w(b, "layers.*.mlp.router.weight");
        let gate_up = p.w(b, "layers.*.mlp.experts.gate_up_proj");
        let down = p.w(b, "layers.*.mlp.experts.down_proj");
        MoeW { router, gate_up, down }
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

/// The router (`MixtralTopKRouter.forward`):
/// ```python
/// router_logits = F.linear(hidden_states, self.weight)
/// router_probs = softmax(router_logits.float(), dim=-1)
/// router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
/// router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
/// ```
/// Returns (logits, weights, indices).
pub fn router(b: &mut Builder, w: Option<Tid>, x2: Tid, normalize: bool) -> (Tid, Tid, Tid) {
    b.module = "mlp.gate";
    let logits = match w {
        Some(w) => b.linear(x2, w, None, tokens(&[Dim::X(X::E)])),
        None => b.plain("mm", &[x2], tokens(&[Dim::X(X::E)]), Dt::Model),
    };
    let lf = b.to_copy(logits, Dt::F32);
    let probs = b.unary("_softmax", "SoftmaxBackward0", lf, Keep::Output, "_softmax_backward_data");
    let (vals, idx) = b.topk(probs, tokens(&[Dim::X(X::K)]));
    let weights = if normalize {
        let sum = b.sum_dim(vals, tokens(&[]));
        b.div_(vals, sum)
    } else {
        vals
    };
    b.hold(probs);
    (logits, weights, idx)
}

/// `grouped_mm_experts_forward`: sort the pairs by expert, gather their tokens, two grouped
/// GEMMs around the gated activation, weight by the routing scores (fp32), restore the order,
/// and sum each token's K rows.
pub fn experts(b: &mut Builder, w: &MoeW, x2: Tid, weights: Tid, idx: Tid) -> Tid {
    b.module = "mlp.experts";
    let out_dt = b.t(x2).dt;
    let sw = b.view(weights, pairs(&[]), "ViewBackward0", false);
    let ids = b.view(idx, pairs(&[]), "", false);
    let sorted = [b.out(pairs(&[]), Dt::I64, false), b.out(pairs(&[]), Dt::I64, false)];
    let r = b.plain_n("sort", &[ids], &sorted);
    let (ids_g, perm) = (r[0], r[1]);
    let tok = b.plain("floor_divide", &[perm], pairs(&[]), Dt::I64);
    let xg = b.index(x2, tok, pairs(&[Dim::Q(Q::H)]));
    let swg = b.index(sw, perm, pairs(&[]));
    let hf = b.plain("_to_copy", &[ids_g], pairs(&[]), Dt::F32);
    let hist = b.plain("histc", &[hf], Shape::new(&[Dim::X(X::E)], Split::None), Dt::F32);
    let offs = b.plain("cumsum", &[hist], Shape::new(&[Dim::X(X::E)], Split::None), Dt::I32);
    let gu = match w.gate_up {
        Some(wg) => b.grouped_mm(xg, wg, offs, pairs(&[Dim::N(2), Dim::X(X::FE)])),
        None => b.plain("_grouped_mm", &[xg], pairs(&[Dim::N(2), Dim::X(X::FE)]), Dt::Model),
    };
    let gu = lora_pairs(b, xg, gu, crate::estimator::model::Linear::GateUp);
    let (g, u) = b.chunk2(gu, pairs(&[Dim::X(X::FE)]));
    b.module = "mlp.experts.act_fn";
    let a = b.unary("silu", "SiluBackward0", g, Keep::Input, "silu_backward");
    b.module = "mlp.experts";
    let m = b.mul(a, u);
    let d = match w.down {
        Some(wd) => b.grouped_mm(m, wd, offs, pairs(&[Dim::Q(Q::H)])),
        None => b.plain("_grouped_mm", &[m], pairs(&[Dim::Q(Q::H)]), Dt::Model),
    };
    let d = lora_pairs(b, m, d, crate::estimator::model::Linear::Down);
    let swu = b.view(swg, pairs(&[Dim::N(1)]), "UnsqueezeBackward0", false);
    // `proj_out * sample_weights_g.unsqueeze(-1)`: type promotion (fp32 with Mixtral's fp32
    // weights, the experts' dtype with Qwen's weights cast back to the logits' dtype).
    let wdt = b.promote(d, swu, d);
    let wo = b.mul_to(d, swu, pairs(&[Dim::Q(Q::H)]), wdt);
    let inv = b.plain("empty_like", &[perm], pairs(&[]), Dt::I64);
    let ar = b.plain("arange", &[], pairs(&[]), Dt::I64);
    b.op("index_put_", "", &[inv, perm, ar], &[], &[], &[]);
    let wr = b.index(wo, inv, pairs(&[Dim::Q(Q::H)]));
    let wv = b.view(wr, pairs(&[Dim::Q(Q::H)]), "ViewBackward0", true);
    let sm = b.sum_dim(wv, tokens(&[Dim::Q(Q::H)]));
    let out = b.to_copy(sm, out_dt);
    // The function's named locals live until it returns.
    for t in [ids_g, perm, xg, swg, hf, hist, offs, d, wr, inv, sm] {
        b.hold(t);
    }
    out
}

/// LoRA on 3-D expert weights, approximated as PEFT adapts per-expert linears: `lora_A` keeps
/// the pairs' input, `lora_B` its `[S, r]` output; the delta is added to the base output.
/// (PEFT's `target_parameters` path for fused experts is not measured.)
fn lora_pairs(b: &mut Builder, x: Tid, base: Tid, lin: crate::estimator::model::Linear) -> Tid {
    let Some(l) = b.lora.filter(|l| super::super::blocks::targeted(lin, l.targets)) else { return base };
    let shape = b.shape(base);
    let a = b.plain("lora_A", &[x], pairs(&[Dim::X(X::R)]), Dt::Model);
    let (xb, xd, ab, ad) = (b.bytes(x), b.t(x).dtype, b.bytes(a), b.t(a).dtype);
    let _ = l;
    // A node that keeps x and lora_A's output, and hands x its gradient.
    use super::super::ir::{B, S};
    let part = b.part;
    b.part = Part::Lora;
    let out = b.out(shape, b.t(base).dt, true);
    let delta = b.op(
        "lora_B",
        "LoraBackward",
        &[x, a],
        &[out],
        &[S::In(0), S::In(1)],
        &[
            B::Alloc { bytes: ab, dtype: ad, op: "mm" },
            B::Free(0),
            B::Alloc { bytes: xb, dtype: xd, op: "mm" },
            B::Grad { input: 0, temp: 1 },
        ],
    )[0];
    b.part = part;
    b.add(base, delta)
}

/// A sparse MoE block (`MixtralSparseMoeBlock.forward`): `hidden_states.view(-1, h)`, the
/// router, the experts; the router's logits and the top-k weights live until it returns.
pub fn sparse_block(b: &mut Builder, w: &MoeW, x: Tid, normalize: bool) -> Tid {
    b.part = Part::Moe;
    b.module = "mlp";
    let x2 = b.view(x, b.shape(x), "ViewBackward0", false);
    let (logits, weights, idx) = router(b, w.router, x2, normalize);
    let out = experts(b, w, x2, weights, idx);
    b.module = "mlp";
    for t in [logits, weights, idx, x2] {
        b.hold(t);
    }
    out
}
