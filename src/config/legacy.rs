//! Links written before the `family` key existed (trainmem before December 2026) describe a
//! custom architecture by its numbers alone, and the estimator of the day picked the modeling
//! code from them. [`family_of_old_link`] reads such a link's family the way that estimator did,
//! once, so that an old link still shows what it showed. Nothing else guesses a family: the
//! importer, the presets and every link written since name it.

use crate::estimator::family::Family;
use crate::estimator::model::{Activation, LayerRule, MlpKind, ModelSpec, NormKind, Positions, QkNorm, Router, WindowKind};

/// OPT's learned position table keeps two extra rows (`modeling_opt.py`, `offset = 2`).
const OPT_POSITION_OFFSET: u64 = 2;

/// The family the estimator before the `family` key built `s` with: its decoder-layer dispatch,
/// in its order (the first rule that holds wins), then the embeddings it told apart.
pub fn family_of_old_link(s: &ModelSpec) -> Family {
    let layer_norm = matches!(s.norm, NormKind::Layernorm | NormKind::LayernormNoBias);
    let gpt2 = layer_norm
        && s.positions == Positions::Learned
        && s.fused_qkv
        && s.mlp == MlpKind::Plain
        && s.act == Activation::GeluNew
        && s.pos_offset == 0
        && s.embed_proj == 0;
    let rope_ln_plain = s.norm == NormKind::Layernorm && s.positions == Positions::Rope && s.mlp == MlpKind::Plain;
    let neox = rope_ln_plain && s.fused_qkv && s.mlp_bias && s.qkv_bias && s.kv_heads == s.heads && s.layer_norms == 2;
    let plain_router = s.router == Router::Softmax && !s.router_bias && !s.router_fp32 && s.router_groups <= 1;
    let plain_experts = s.fused_experts && !s.expert_bias && !s.experts_in_out && !s.moe_all_experts;
    let qwen = (s.shared_gate && s.shared_experts == 1) || (s.qk_norm == QkNorm::Head && s.shared_experts == 0);
    let qwen_moe = s.experts > 0 && s.kv_lora_rank == 0 && s.norm == NormKind::Rmsnorm && plain_router && plain_experts && qwen;
    let mistral = s.window > 0
        && s.window_kind == WindowKind::Sliding
        && s.window_layers == LayerRule::All
        && s.norm == NormKind::Rmsnorm
        && s.experts == 0
        && !s.fused_qkv
        && s.kv_lora_rank == 0;
    let gemma_norm = s.norm == NormKind::RmsnormGemma;
    if s.ssm.heads > 0 {
        // No link before the `family` key carried a Mamba-2 mixer; one that does without naming
        // its family is read as the hybrid whose layout it has: the mixer in place of attention on
        // the `linear_layers` (Granite 4.0-H), else beside it on every layer (Falcon-H1).
        if s.linear_attention_layers() > 0 {
            Family::GraniteMoeHybrid
        } else {
            Family::FalconH1
        }
    } else if s.gdn.k_heads > 0 {
        // Gated DeltaNet layers: Qwen3.5 has four input projections, Qwen3-Next two.
        match (s.gdn.split, s.experts > 0) {
            (false, _) => Family::Qwen3Next,
            (true, false) => Family::Qwen35Text,
            (true, true) => Family::Qwen35MoeText,
        }
    } else if gpt2 {
        Family::Gpt2
    } else if s.attn_sinks {
        Family::GptOss
    } else if s.moe_all_experts {
        Family::Llama4
    } else if s.positions == Positions::Learned
        && s.pos_offset == OPT_POSITION_OFFSET
        && s.mlp == MlpKind::Plain
        && !s.fused_qkv
        && s.embed_proj == 0
        && layer_norm
    {
        Family::Opt
    } else if s.fused_qkv && s.positions == Positions::Rope && s.norm == NormKind::Rmsnorm {
        Family::Phi3
    } else if gemma_norm && s.layer_norms == 4 {
        if s.qk_norm == QkNorm::Head {
            Family::Gemma3
        } else {
            Family::Gemma2
        }
    } else if s.is_mla() && s.router == Router::Softmax {
        Family::DeepseekV2
    } else if s.is_mla() && s.dsa.heads > 0 {
        // The indexer's keys came with the `family` key: only DeepSeek-V3.2 sets them.
        Family::DeepseekV32
    } else if s.is_mla() && s.router == Router::Sigmoid {
        Family::DeepseekV3
    } else if s.router == Router::Sigmoid && !s.is_mla() {
        Family::Glm4Moe
    } else if s.norm == NormKind::Nonparametric {
        Family::Olmo
    } else if s.norm == NormKind::Rmsnorm && s.qk_norm == QkNorm::Full {
        Family::Olmo2
    } else if gemma_norm && s.experts == 0 {
        Family::Gemma
    } else if qwen_moe {
        if s.shared_gate {
            Family::Qwen2Moe
        } else {
            Family::Qwen3Moe
        }
    } else if rope_ln_plain && !s.fused_qkv && !s.parallel && s.layer_norms == 2 {
        Family::Starcoder2
    } else if rope_ln_plain && !s.fused_qkv && s.parallel && s.layer_norms == 1 {
        Family::Phi
    } else if neox {
        Family::GptNeox
    } else if s.norm == NormKind::Layernorm && s.positions == Positions::Rope && s.mlp == MlpKind::Gated && !s.fused_qkv {
        Family::Stablelm
    } else if s.norm == NormKind::Layernorm && s.fused_qkv && s.mlp == MlpKind::Plain {
        Family::Falcon
    } else if mistral {
        Family::Mistral
    } else {
        Family::Llama
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::presets::presets;

    /// The families the old dispatch could not tell from Llama's, whose code it ran as Llama's
    /// (Mistral's only differs once its window is set); and the families added after the
    /// `family` key, which no old link names: the old dispatch read their numbers as the family
    /// whose rule they meet first (OLMo 3's q/k norms over the projections as OLMo-2's,
    /// MiniMax-M2's sigmoid router as GLM-4.5's, Kimi Linear's KDA layers as Qwen3-Next's gated
    /// DeltaNet, the others as Llama's).
    fn built_as(s: &ModelSpec) -> Family {
        match s.family {
            Family::Qwen2 | Family::Qwen3 | Family::Mixtral | Family::Smollm3 => Family::Llama,
            Family::SeedOss | Family::Exaone4 | Family::Apertus => Family::Llama,
            Family::Olmo3 => Family::Olmo2,
            Family::MinimaxM2 => Family::Glm4Moe,
            // Its KDA layers sit in the gated DeltaNet's keys (two projections' worth: not split).
            Family::KimiLinear => Family::Qwen3Next,
            Family::Mistral if s.window == 0 => Family::Llama,
            f => f,
        }
    }

    #[test]
    fn an_old_link_to_any_presets_architecture_reads_as_the_presets_family() {
        let wrong: Vec<String> = presets()
            .into_iter()
            .filter_map(|p| {
                let old = ModelSpec { family: Family::Llama, ..p.spec.clone() };
                let (got, want) = (family_of_old_link(&old), built_as(&p.spec));
                (got != want).then(|| format!("{}: {got:?}, not {want:?}", p.id))
            })
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}
