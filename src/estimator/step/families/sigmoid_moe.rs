//! The mixture-of-experts block of DeepSeek-V3 and GLM-4.5 (`DeepseekV3MoE`,
//! `Glm4MoeMoE`; GLM's modular file copies DeepSeek-V3's): a sigmoid router kept in fp32 with the
//! `e_score_correction_bias` buffer and a group-limited top-k (`DeepseekV3TopkRouter`,
//! `Glm4MoeTopkRouter`), the routed experts of `grouped_mm_experts_forward` ([`super::moe`]),
//! and the shared experts, a gated MLP of `n_shared_experts · moe_intermediate_size` on the
//! block's input, added to the routed output.
//!
//! Sources: transformers 5.24, `models/deepseek_v3/modeling_deepseek_v3.py`
//! (`DeepseekV3TopkRouter.forward`, `DeepseekV3MoE.forward`) and
//! `models/glm4_moe/modeling_glm4_moe.py` (`Glm4MoeTopkRouter.forward`, `Glm4MoeMoE.forward`).

use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Shape, Tid, B, S, X};
use super::common::{gated_mlp, tokens, Gated, Kind, MlpW, Norm, Params, Rms, SILU};
use super::llama::{decoder_layer, Ffn};
use super::moe::MoeW;
use crate::estimator::ctx::Q;
use crate::estimator::model::ModelSpec;
use crate::estimator::part::Part;

/// Bytes of an fp32 element (the router's weight and logits whatever the model dtype).
pub const FP32_BYTES: u64 = 4;
/// `topk(2, dim=-1)` in the group scores: each group is scored by its two best experts.
pub const GROUP_SCORE_TOP: u32 = 2;

/// A parameter created in fp32 whatever the model dtype (`torch.zeros(..., dtype=torch.float32)`
/// in the router's `__init__`, kept by `_keep_in_fp32_modules_strict`): fp32 weight, fp32
/// gradient.
pub fn fp32_param(b: &mut Builder, p: &Params, name: &str) -> Option<Tid> {
    let (numel, trains, expert) = p.find(name)?;
    let shards = if expert { p.expert_shards } else { p.shards } as u128;
    let bytes = numel as u128 * FP32_BYTES as u128;
    let grad = if trains { (numel as u128).div_ceil(shards.max(1)) * FP32_BYTES as u128 } else { 0 };
    Some(b.param(bytes, super::super::ir::DType::Fp32, grad))
}

/// The block's parameters in registration order (`experts`, `gate`, `shared_experts`).
#[derive(Clone, Copy)]
pub struct SigmoidMoeW {
    pub experts: MoeW,
    pub shared: MlpW,
}

impl SigmoidMoeW {
    pub fn new(b: &mut Builder, p: &Params) -> SigmoidMoeW {
        let gate_up = p.w(b, "layers.*.mlp.experts.gate_up_proj");
        let down = p.w(b, "layers.*.mlp.experts.down_proj");
        let router = fp32_param(b, p, "layers.*.mlp.router.weight");
        let shared = MlpW::shared(b, p);
        SigmoidMoeW { experts: MoeW { router, gate_up, down }, shared }
    }
}

/// `scores.gather(1, topk_indices)` into `[b, s, K]`: GatherBackward0 keeps the indices and
/// `self` (`gather_backward(grad, self, dim, index, sparse_grad)`: the scores, which their own
/// node keeps already — no memory of their own, but a second pack under activation
/// offloading), in the generated node's order of its saved variables, and scatters the
/// gradient into zeros of the input (`new_zeros`, `scatter_add`).
pub fn gather(b: &mut Builder, x: Tid, idx: Tid) -> Tid {
    let (dt, rg, bytes, dtype) = (b.t(x).dt, b.rg(x), b.bytes(x), b.t(x).dtype);
    let out = b.out(tokens(&[Dim::X(X::K)]), dt, rg);
    let bw: &[B] = if rg {
        &[
            B::Alloc { bytes, dtype, op: "new_zeros" },
            B::Alloc { bytes, dtype, op: "scatter_add" },
            B::Free(0),
            B::Grad { input: 0, temp: 1 },
        ]
    } else {
        &[]
    };
    b.op("gather", "GatherBackward0", &[x, idx], &[out], if rg { &[S::In(1), S::In(0)] } else { &[] }, bw)[0]
}

/// A tensor that only a dying autograd node keeps (the group top-k's indices, kept by its
/// TopkBackward0 until the router returns and drops `group_scores`, the node's last owner):
/// held to the return when the forward saves, freed after its last use in a checkpointed
/// layer's first forward, which saves nothing.
pub fn node_kept(b: &mut Builder, t: Tid) {
    let in_checkpoint = b.p.regions.last().is_some_and(|r| r.end == r.first);
    if !in_checkpoint {
        b.hold(t);
    }
}

/// Whether `group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)` copies: only when
/// both G and E / G exceed one (otherwise the expanded dims merge into a view).
pub fn mask_copies(spec: &ModelSpec) -> bool {
    let g = spec.router_groups.max(1);
    g > 1 && spec.experts / g > 1
}

/// The router's logits in fp32 (DeepSeek-V2's and V3's, GLM-4.5's `mlp.gate`):
/// `router_logits = F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32))`.
pub fn fp32_logits(b: &mut Builder, w: Option<Tid>, x2: Tid) -> Tid {
    b.module = "mlp.gate";
    let xf = b.to_copy(x2, Dt::F32);
    let e = tokens(&[Dim::X(X::E)]);
    match w {
        Some(w) => b.linear(xf, w, None, e),
        None => b.plain("mm", &[xf], e, Dt::F32),
    }
}

/// The group limit's mask over the experts, from the scores of the G groups (no gradient):
/// ```python
/// group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
/// group_mask = torch.zeros_like(group_scores)
/// group_mask.scatter_(1, group_idx, 1)
/// score_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
/// ~score_mask.bool()
/// ```
/// Returns the chosen groups, the group and the expert masks (the function's locals), and the
/// inverted expert mask. `rg`: the group scores derive from scores that require a gradient, so
/// the group top-k has a node (dead: it keeps its indices, packed under offloading).
pub fn group_mask(b: &mut Builder, spec: &ModelSpec, group_scores: Tid, rg: bool) -> [Tid; 4] {
    let e = || tokens(&[Dim::X(X::E)]);
    let groups = spec.router_groups.max(1);
    let kg = Dim::W(spec.router_group_topk.clamp(1, groups));
    let top = [b.out(tokens(&[kg]), Dt::F32, false), b.out(tokens(&[kg]), Dt::I64, false)];
    let r = b.plain_n("topk", &[group_scores], &top);
    let gidx = r[1];
    b.dead_save(gidx, rg);
    let gmask = b.plain("zeros_like", &[group_scores], tokens(&[Dim::W(groups)]), Dt::F32);
    b.op("scatter_", "", &[gmask, gidx], &[], &[], &[]);
    let smask = if mask_copies(spec) { b.plain("clone", &[gmask], e(), Dt::F32) } else { gmask };
    let mb = b.plain("_to_copy", &[smask], e(), Dt::Bool);
    let inv = b.plain("bitwise_not", &[mb], e(), Dt::Bool);
    [gidx, gmask, smask, inv]
}

/// The router (`DeepseekV3TopkRouter.forward`, `Glm4MoeTopkRouter.forward`):
/// ```python
/// hidden_states = hidden_states.view(-1, self.hidden_dim)
/// router_logits = F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32))
/// scores = router_logits.sigmoid()
/// scores_for_choice = scores + self.e_score_correction_bias
/// group_scores = scores_for_choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
/// group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
/// group_mask = torch.zeros_like(group_scores); group_mask.scatter_(1, group_idx, 1)
/// score_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
/// scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf"))
/// topk_indices = torch.topk(scores_for_choice, k=self.top_k, dim=-1, sorted=False)[1]
/// topk_weights = scores.gather(1, topk_indices)
/// if self.norm_topk_prob:
///     denominator = topk_weights.sum(dim=-1, keepdim=True) + 1e-20
///     topk_weights /= denominator
/// topk_weights = topk_weights * self.routed_scaling_factor
/// ```
/// The choice (bias, group scores, mask, top-k values) carries no gradient that reaches the
/// loss: its autograd nodes die with their outputs, so only the logits (`mm`, keeping the fp32
/// input), the sigmoid (keeping its result), the gather and the normalisation are in the graph.
/// The dead nodes' saves are packs under activation offloading ([`Builder::dead_save`]): the
/// group top-k's indices `[T, G, 2]`, the group choice's `[T, topk_group]`, the fill's mask
/// `[T, E]` (bool) and the final top-k's indices `[T, K]` (int64).
/// With one group `reshape` of the expanded mask is a view; with more it copies `[T, E]`.
/// Returns (logits, weights, indices).
pub fn router(b: &mut Builder, spec: &ModelSpec, w: Option<Tid>, x2: Tid, normalize: bool) -> (Tid, Tid, Tid) {
    let e = || tokens(&[Dim::X(X::E)]);
    let logits = fp32_logits(b, w, x2);
    let scores = b.unary("sigmoid", "SigmoidBackward0", logits, Keep::Output, "sigmoid_backward");
    // The choice: no gradient reaches the loss through it.
    let choice = b.plain("add", &[scores], e(), Dt::F32);
    let groups = spec.router_groups.max(1);
    let g = Dim::W(groups);
    let top = [b.out(tokens(&[g, Dim::N(GROUP_SCORE_TOP)]), Dt::F32, false), b.out(tokens(&[g, Dim::N(GROUP_SCORE_TOP)]), Dt::I64, false)];
    let rg = b.rg(scores);
    let r = b.plain_n("topk", &[choice], &top);
    let (gv, gi) = (r[0], r[1]);
    b.dead_save(gi, rg);
    let gscores = b.plain("sum", &[gv], tokens(&[g]), Dt::F32);
    let [gidx, gmask, smask, inv] = group_mask(b, spec, gscores, rg);
    let filled = b.plain("masked_fill", &[choice, inv], e(), Dt::F32);
    b.dead_save(inv, rg);
    let top = [b.out(tokens(&[Dim::X(X::K)]), Dt::F32, false), b.out(tokens(&[Dim::X(X::K)]), Dt::I64, false)];
    let r = b.plain_n("topk", &[filled], &top);
    let idx = r[1];
    b.dead_save(idx, rg);
    let mut weights = gather(b, scores, idx);
    let mut den = None;
    if normalize {
        let sum = b.sum_dim(weights, tokens(&[Dim::N(1)]));
        let d = b.add_scalar(sum);
        weights = b.div_(weights, d);
        den = Some(d);
    }
    let scaled = b.mul_scalar(weights);
    // `denominator` is a local too.
    if let Some(d) = den {
        b.hold(d);
    }
    // The function's locals live until it returns.
    for t in [scores, filled, gscores, gidx, gmask, smask] {
        b.hold(t);
    }
    // The group top-k's indices and the fill's mask are kept by nodes that die at the return.
    node_kept(b, gi);
    node_kept(b, inv);
    (logits, scaled, idx)
}

/// The shared experts (`DeepseekV3MLP` / `Glm4MoeMLP` of `n_shared · f_e`):
/// `down_proj(act_fn(gate_proj(x)) * up_proj(x))`.
const SHARED_EXPERTS: Gated = Gated {
    modules: [
        "mlp.shared_experts.gate_proj",
        "mlp.shared_experts.act_fn",
        "mlp.shared_experts.up_proj",
        "mlp.shared_experts",
        "mlp.shared_experts.down_proj",
    ],
    width: Dim::X(X::FS),
    act: SILU,
};

/// The router with `norm_topk_prob` (DeepSeek-V3's and GLM-4.5's configurations and
/// checkpoints set it; the importer does not keep it).
pub fn router_normalized(b: &mut Builder, spec: &ModelSpec, w: Option<Tid>, x2: Tid) -> (Tid, Tid, Tid) {
    router(b, spec, w, x2, true)
}

/// A router: (builder, spec, weight, `[b·s, h]` input) → (logits, weights, indices).
pub type RouterFn = fn(&mut Builder, &ModelSpec, Option<Tid>, Tid) -> (Tid, Tid, Tid);

/// The block (`DeepseekV3MoE.forward`, `Glm4MoeMoE.forward`; DeepSeek-V2's `DeepseekV2Moe.forward`
/// with its softmax router is otherwise the same block):
/// ```python
/// residuals = hidden_states
/// _, topk_weights, topk_indices = self.gate(hidden_states)
/// hidden_states = self.experts(hidden_states.view(-1, h), topk_indices, topk_weights).view(*orig_shape)
/// hidden_states = hidden_states + self.shared_experts(residuals)
/// ```
/// The router's logits (`_`) and weights live until the block returns.
pub fn block(b: &mut Builder, spec: &ModelSpec, w: &SigmoidMoeW, x: Tid, route: RouterFn) -> Tid {
    b.part = Part::Moe;
    b.module = "mlp";
    let xr = b.view(x, b.shape(x), "ViewBackward0", false);
    let (logits, weights, idx) = route(b, spec, w.experts.router, xr);
    b.module = "mlp";
    let x2 = b.view(x, b.shape(x), "ViewBackward0", false);
    let routed = super::moe::experts(b, &w.experts, x2, weights, idx);
    let routed = b.view(routed, Shape::tok(Q::H), "ViewBackward0", false);
    let s = &w.shared;
    let shared = if s.wg.is_some() || s.wu.is_some() || s.wd.is_some() {
        b.part = Part::Moe;
        Some(gated_mlp(b, s, x, &SHARED_EXPERTS))
    } else {
        None
    };
    b.module = "mlp";
    let out = match shared {
        Some(s) => b.add(routed, s),
        None => routed,
    };
    for t in [logits, weights, idx, xr, x2] {
        b.hold(t);
    }
    out
}

/// The decoder layer of DeepSeek-V2/V3 and GLM-4.5 (`DeepseekV3DecoderLayer.forward`,
/// `Glm4MoeDecoderLayer.forward`: Llama's, [`decoder_layer`]) around the family's attention,
/// whose parameters the caller has registered: the dense MLP on the first
/// `first_k_dense_replace` layers, the block ([`block`], routed by `route`) on the others.
pub fn layer(
    b: &mut Builder,
    p: &Params,
    spec: &ModelSpec,
    x: Tid,
    kind: Kind,
    attention: impl FnOnce(&mut Builder, Tid) -> (Tid, Option<Tid>),
    route: RouterFn,
) -> Tid {
    // Registration order: self_attn, mlp, input_layernorm, post_attention_layernorm.
    let ffn = Ffn::new(b, p, kind, SigmoidMoeW::new);
    decoder_layer(b, p, x, Norm::Rms(Rms::Llama), attention, |b, n| ffn.forward(b, n, |b, w, n| block(b, spec, &w, n, route)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::config::Config;
    use crate::estimator::presets::preset;

    fn spec(id: &str) -> ModelSpec {
        preset(id).expect("preset").spec
    }

    #[test]
    fn the_group_mask_is_copied_only_when_groups_and_experts_per_group_both_exceed_one() {
        // DeepSeek-V3: 8 groups of 32 experts → reshape copies [T, 256].
        assert!(mask_copies(&spec("deepseek-v3")));
        // GLM-4.5-Air: n_group 1 → [T, 1, E] merges into a view.
        assert!(!mask_copies(&spec("glm-4.5-air")));
        // One expert per group → [T, G, 1] merges into a view too.
        let mut m = spec("deepseek-v3");
        m.router_groups = m.experts;
        assert!(!mask_copies(&m));
    }

    #[test]
    fn the_correction_bias_buffer_is_e_fp32_per_moe_layer() {
        // DeepSeek-V3: 61 layers, the first 3 dense → 58 × 256 × 4 = 59,392 bytes.
        let cfg = Config { model: "deepseek-v3".into(), arch: spec("deepseek-v3"), ..Config::default() };
        assert_eq!(super::super::super::model::router_bias_buffer_bytes(&cfg), 59_392);
        // Softmax routers have no such buffer.
        let cfg = Config { model: "deepseek-v2-lite".into(), arch: spec("deepseek-v2-lite"), ..Config::default() };
        assert_eq!(super::super::super::model::router_bias_buffer_bytes(&cfg), 0);
    }
}
