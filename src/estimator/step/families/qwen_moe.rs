//! Qwen2-MoE and Qwen3-MoE (`modeling_qwen2_moe.py`, `modeling_qwen3_moe.py`): Llama's decoder
//! layer (Qwen3-MoE with its per-head q/k norms) whose sparse layers route through
//! `Qwen*TopKRouter` — Mixtral's router, but its top-k weights are renormalised only when
//! `norm_topk_prob` and then cast back to the logits' dtype — and, in Qwen2-MoE, a shared expert
//! gated by a sigmoid (`shared_expert_gate`, a h → 1 linear); the block is
//! [`super::moe::sparse_block`].

use super::super::ir::{Builder, Tid};
use super::common::{cache_position, causal_mask, rope_pair, sliding_window_mask};
use super::common::{AttnW, Kind, Norm, Params, Rms, Shared};
use super::llama::{attention, decoder_layer, Ffn};
use super::modeling::Modeling;
use super::moe::{sparse_block, MoeW, SharedW, Topk};
use crate::estimator::config::Attention;
use crate::estimator::model::ModelSpec;

/// How the router ends: it renormalises its top-k weights only with `norm_topk_prob` —
/// Qwen3-MoE's checkpoints set it, Qwen2-MoE's (Qwen1.5-MoE-A2.7B, the configuration default)
/// do not, as `hf_export` writes them — and casts them to the logits' dtype.
fn topk(spec: &ModelSpec) -> Topk {
    Topk { normalize: !spec.shared_gate, cast: true }
}

/// One decoder layer (`Qwen2MoeDecoderLayer.forward` = `LlamaDecoderLayer.forward` with the
/// sparse block on MoE layers).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    // Parameters in registration order: self_attn, mlp (Qwen2-MoE: gate, experts,
    // shared_expert, shared_expert_gate; Qwen3-MoE: experts, gate), input_layernorm,
    // post_attention_layernorm.
    let aw = AttnW::new(b, p);
    let ffn = Ffn::new(b, p, kind, |b, p| {
        if spec.shared_gate {
            return (MoeW::new(b, p), Some(SharedW::new(b, p)));
        }
        // Qwen3MoeSparseMoeBlock.__init__ registers `experts` before `gate`.
        let gate_up = p.w(b, "layers.*.mlp.experts.gate_up_proj");
        let down = p.w(b, "layers.*.mlp.experts.down_proj");
        let router = p.w(b, "layers.*.mlp.router.weight");
        (MoeW { router, gate_up, down }, None)
    });
    let ffn = |b: &mut Builder, n: Tid| ffn.forward(b, n, |b, (w, sw), n| sparse_block(b, &w, sw.as_ref(), n, topk(spec)));
    decoder_layer(b, p, x, Norm::Rms(Rms::Llama), |b, n| attention(b, &aw, spec, n, sh, attn), ffn)
}

/// Qwen2-MoE (`modeling_qwen2_moe.py`): Llama's layers with sparse blocks of softmax-then-top-k
/// experts beside a gated shared expert, and the unused sliding-window mask its model builds.
pub struct Qwen2Moe;
impl Modeling for Qwen2Moe {
    /// `Qwen2MoeModel.forward` after the embedding: Llama's, and the mask of the
    /// `sliding_attention` layers too (`create_sliding_window_causal_mask`, called whatever
    /// `layer_types` says), whose window `Qwen2MoeConfig.__post_init__` sets to 0 unless
    /// `use_sliding_window`: the mask is always materialized (bool for SDPA, additive for
    /// eager), held by `causal_mask_mapping` until the model returns, and read by no layer.
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        let pos = cache_position(b);
        let mask = causal_mask(b, pos, attn);
        let unused = sliding_window_mask(b, pos, attn);
        let (cos, sin) = rope_pair(b, spec, pos, true);
        Shared { cos, sin, pos: Some(pos), mask, locals: [None, Some(unused)], ..Shared::default() }
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
}

/// Qwen3-MoE (`modeling_qwen3_moe.py`): Qwen3's attention (per-head q/k norms) with sparse
/// blocks of softmax-then-top-k experts, renormalised.
pub struct Qwen3Moe;
impl Modeling for Qwen3Moe {
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
}
