//! Sparse mixture-of-experts blocks of transformers 5: a top-k router (`MixtralTopKRouter`,
//! `Qwen2MoeTopKRouter`) and 3-D expert weights run by `grouped_mm_experts_forward`
//! (`integrations/moe.py`, the default `experts_implementation`), whose sizes depend only on
//! the S = b·s·K token–expert pairs, not on the routing; Qwen2-MoE's sigmoid-gated shared
//! expert beside them.

use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Shape, Split, Tid, B, S, X};
use super::common::{gated_mlp, pairs, tokens, Gated, MlpW, Params, SILU};
use crate::estimator::ctx::Q;
use crate::estimator::model::Linear;
use crate::estimator::part::Part;

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

/// How a softmax-then-top-k router ends: whether it renormalises its top-k weights
/// (`norm_topk_prob`) and whether it casts them back to the logits' dtype (Qwen's).
#[derive(Clone, Copy, Debug)]
pub struct Topk {
    pub normalize: bool,
    pub cast: bool,
}

impl Topk {
    /// `MixtralTopKRouter`: renormalised, fp32.
    pub const MIXTRAL: Topk = Topk { normalize: true, cast: false };
}

/// The router (`MixtralTopKRouter.forward`, `Qwen2MoeTopKRouter.forward` =
/// `Qwen3MoeTopKRouter.forward`):
/// ```python
/// router_logits = F.linear(hidden_states, self.weight)
/// router_probs = softmax(router_logits, dtype=torch.float, dim=-1)
/// router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
/// if self.norm_topk_prob:                                           # Mixtral: always
///     router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
/// router_top_value = router_top_value.to(router_logits.dtype)       # Qwen
/// ```
/// The softmax keeps its fp32 result; Qwen's returned weights are in the logits' dtype (the
/// compute dtype: bf16 in bf16 models and under autocast, whose `linear` returns bf16).
/// Returns (logits, weights, indices).
pub fn router(b: &mut Builder, w: Option<Tid>, x2: Tid, how: Topk) -> (Tid, Tid, Tid) {
    b.module = "mlp.gate";
    let logits = match w {
        Some(w) => b.linear(x2, w, None, tokens(&[Dim::X(X::E)])),
        None => b.plain("mm", &[x2], tokens(&[Dim::X(X::E)]), Dt::Model),
    };
    let lf = b.to_copy(logits, Dt::F32);
    let probs = b.unary("_softmax", "SoftmaxBackward0", lf, Keep::Output, "_softmax_backward_data");
    let (vals, idx) = b.topk(probs, tokens(&[Dim::X(X::K)]));
    let top = if how.normalize {
        let sum = b.sum_dim(vals, tokens(&[]));
        b.div_(vals, sum)
    } else {
        vals
    };
    let weights = if how.cast {
        let ldt = b.t(logits).dt;
        let weights = b.to_copy(top, ldt);
        b.hold(top);
        weights
    } else {
        top
    };
    b.hold(probs);
    (logits, weights, idx)
}

/// The token–expert pairs of `grouped_mm_experts_forward`, sorted by expert: the sorted expert
/// ids and the permutation, the pairs' tokens and routing weights, the per-expert counts
/// (`histc` of the ids as fp32) and their offsets for the grouped GEMMs.
pub struct Grouped {
    pub ids_g: Tid,
    pub perm: Tid,
    pub xg: Tid,
    pub swg: Tid,
    pub offs: Tid,
    counts: [Tid; 2],
}

/// ```python
/// expert_ids = top_k_index.reshape(-1); sample_weights = top_k_weights.reshape(-1)
/// expert_ids_g, perm = torch.sort(expert_ids)
/// selected_hidden_states_g = hidden_states[perm // num_top_k]
/// sample_weights_g = sample_weights[perm]
/// tokens_per_expert = torch.histc(expert_ids_g.float(), bins=E, min=0, max=E - 1)
/// offsets = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)
/// ```
pub fn group_pairs(b: &mut Builder, x2: Tid, weights: Tid, idx: Tid) -> Grouped {
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
    Grouped { ids_g, perm, xg, swg, offs, counts: [hf, hist] }
}

/// The pairs' weighted outputs `wo` back in token order, each token's K rows summed, cast to
/// `out_dt`:
/// ```python
/// inv_perm = torch.empty_like(perm); inv_perm[perm] = torch.arange(perm.size(0))
/// weighted_out = weighted_out[inv_perm]
/// final_hidden_states = weighted_out.view(num_tokens, num_top_k, hidden_dim).sum(dim=1)
/// return final_hidden_states.to(hidden_states.dtype)
/// ```
/// The function's named locals (the grouping's, the restored rows, the sum) live until it
/// returns.
pub fn ungroup(b: &mut Builder, g: &Grouped, wo: Tid, out_dt: Dt) -> Tid {
    let inv = b.plain("empty_like", &[g.perm], pairs(&[]), Dt::I64);
    let ar = b.plain("arange", &[], pairs(&[]), Dt::I64);
    b.op("index_put_", "", &[inv, g.perm, ar], &[], &[], &[]);
    let wr = b.index(wo, inv, pairs(&[Dim::Q(Q::H)]));
    let wv = b.view(wr, pairs(&[Dim::Q(Q::H)]), "ViewBackward0", true);
    let sm = b.sum_dim(wv, tokens(&[Dim::Q(Q::H)]));
    let out = b.to_copy(sm, out_dt);
    for t in [g.ids_g, g.perm, g.xg, g.swg, g.counts[0], g.counts[1], g.offs, wr, inv, sm] {
        b.hold(t);
    }
    out
}

/// `grouped_mm_experts_forward`: the pairs grouped by expert ([`group_pairs`]), two grouped
/// GEMMs around the gated activation, the routing scores' product (fp32), the order restored
/// ([`ungroup`]).
pub fn experts(b: &mut Builder, w: &MoeW, x2: Tid, weights: Tid, idx: Tid) -> Tid {
    b.module = "mlp.experts";
    let out_dt = b.t(x2).dt;
    let g = group_pairs(b, x2, weights, idx);
    let gu = match w.gate_up {
        Some(wg) => b.grouped_mm(g.xg, wg, g.offs, pairs(&[Dim::N(2), Dim::X(X::FE)])),
        None => b.plain("_grouped_mm", &[g.xg], pairs(&[Dim::N(2), Dim::X(X::FE)]), Dt::Model),
    };
    let gu = lora_pairs(b, g.xg, gu, Linear::GateUp);
    let (gate, u) = b.chunk2(gu, pairs(&[Dim::X(X::FE)]));
    b.module = "mlp.experts.act_fn";
    let a = b.unary("silu", "SiluBackward0", gate, Keep::Input, "silu_backward");
    b.module = "mlp.experts";
    let m = b.mul(a, u);
    let d = match w.down {
        Some(wd) => b.grouped_mm(m, wd, g.offs, pairs(&[Dim::Q(Q::H)])),
        None => b.plain("_grouped_mm", &[m], pairs(&[Dim::Q(Q::H)]), Dt::Model),
    };
    let d = lora_pairs(b, m, d, Linear::Down);
    let swu = b.view(g.swg, pairs(&[Dim::N(1)]), "UnsqueezeBackward0", false);
    // `proj_out * sample_weights_g.unsqueeze(-1)`: type promotion (fp32 with Mixtral's fp32
    // weights, the experts' dtype with Qwen's weights cast back to the logits' dtype).
    let wdt = b.promote(d, swu, d);
    let wo = b.mul_to(d, swu, pairs(&[Dim::Q(Q::H)]), wdt);
    let out = ungroup(b, &g, wo, out_dt);
    b.hold(d);
    out
}

/// LoRA on 3-D expert weights, approximated as PEFT adapts per-expert linears: `lora_A` keeps
/// the pairs' input, `lora_B` its `[S, r]` output; the delta is added to the base output.
/// (PEFT's `target_parameters` path for fused experts is not measured.)
fn lora_pairs(b: &mut Builder, x: Tid, base: Tid, lin: Linear) -> Tid {
    let Some(l) = b.lora.filter(|l| super::super::blocks::targeted(lin, l.targets)) else { return base };
    let shape = b.shape(base);
    let a = b.plain("lora_A", &[x], pairs(&[Dim::X(X::R)]), Dt::Model);
    let (xb, xd, ab, ad) = (b.bytes(x), b.t(x).dtype, b.bytes(a), b.t(a).dtype);
    let _ = l;
    // A node that keeps x and lora_A's output, and hands x its gradient.
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

/// Qwen2-MoE's shared expert (`shared_expert.{gate,up,down}_proj`, then `shared_expert_gate`),
/// registered after the router and the experts.
#[derive(Clone, Copy)]
pub struct SharedW {
    pub mlp: MlpW,
    pub gate: Option<Tid>,
}

impl SharedW {
    pub fn new(b: &mut Builder, p: &Params) -> SharedW {
        let mlp = MlpW::shared(b, p);
        SharedW { mlp, gate: p.w(b, "layers.*.mlp.shared_expert_gate.weight") }
    }
}

/// `Qwen2MoeMLP` as the shared expert: `down_proj(silu(gate_proj(x)) * up_proj(x))` of width f_s.
const SHARED_EXPERT: Gated = Gated {
    modules: [
        "mlp.shared_expert.gate_proj",
        "mlp.shared_expert.act_fn",
        "mlp.shared_expert.up_proj",
        "mlp.shared_expert",
        "mlp.shared_expert.down_proj",
    ],
    width: Dim::X(X::FS),
    act: SILU,
};

/// A sparse MoE block (`MixtralSparseMoeBlock.forward`, `Qwen2MoeSparseMoeBlock.forward` /
/// `Qwen3MoeSparseMoeBlock.forward`):
/// ```python
/// hidden_states_reshaped = hidden_states.view(-1, hidden_dim)
/// shared_expert_output = self.shared_expert(hidden_states_reshaped)          # Qwen2-MoE
/// _, routing_weights, selected_experts = self.gate(hidden_states_reshaped)
/// expert_output = self.experts(hidden_states_reshaped, selected_experts, routing_weights)
/// shared_expert_output = F.sigmoid(self.shared_expert_gate(hidden_states_reshaped)) * shared_expert_output
/// expert_output = expert_output + shared_expert_output
/// ```
/// The router's logits and the top-k weights live until it returns. The experts
/// (`grouped_mm_experts_forward`) return the block input's dtype (fp32 under autocast, where
/// `grouped_mm` is not autocast); the gated shared output is the autocast dtype, so the sum
/// promotes and its backward casts the shared branch's gradient back.
pub fn sparse_block(b: &mut Builder, w: &MoeW, sw: Option<&SharedW>, x: Tid, how: Topk) -> Tid {
    b.part = Part::Moe;
    b.module = "mlp";
    let x2 = b.view(x, b.shape(x), "ViewBackward0", false);
    let shared = sw.map(|sw| gated_mlp(b, &sw.mlp, x2, &SHARED_EXPERT));
    let (logits, weights, idx) = router(b, w.router, x2, how);
    let out = experts(b, w, x2, weights, idx);
    b.module = "mlp";
    let y = match (sw, shared) {
        (Some(sw), Some(so)) => {
            b.module = "mlp.shared_expert_gate";
            let gl = match sw.gate {
                Some(gw) => b.linear(x2, gw, None, tokens(&[Dim::N(1)])),
                None => b.plain("mm", &[x2], tokens(&[Dim::N(1)]), Dt::Model),
            };
            b.module = "mlp";
            let sg = b.unary("sigmoid", "SigmoidBackward0", gl, Keep::Output, "sigmoid_backward");
            let gated = b.mul(sg, so);
            b.hold(so);
            add_promote(b, out, gated)
        }
        _ => out,
    };
    // `_, routing_weights, selected_experts = self.gate(...)`: the block's locals.
    for t in [logits, weights, idx, x2] {
        b.hold(t);
    }
    y
}

/// `a + b` where `b` may be of a narrower dtype (AddBackward0: the gradient passes to `a`; for
/// `b` the engine's `validate_outputs` casts it to `b`'s dtype, a `_to_copy`).
fn add_promote(b: &mut Builder, x: Tid, y: Tid) -> Tid {
    if b.t(x).dtype == b.t(y).dtype {
        return b.add(x, y);
    }
    let (shape, dt) = (b.shape(x), b.promote(x, y, x));
    let (rx, ry) = (b.rg(x), b.rg(y));
    let out = b.out(shape, dt, rx || ry);
    let (yb, yd) = (b.bytes(y), b.t(y).dtype);
    let mut bw: Vec<B> = Vec::with_capacity(4);
    if rx {
        bw.push(B::Pass { input: 0, output: 0 });
    }
    if ry {
        bw.push(B::Apply);
        bw.push(B::Alloc { bytes: yb, dtype: yd, op: "_to_copy" });
        bw.push(B::Grad { input: 1, temp: 0 });
    }
    b.op("add", "AddBackward0", &[x, y], &[out], &[], &bw)[0]
}
