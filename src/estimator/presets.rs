//! Built-in models: real checkpoints, each pinned in a test to its exact published parameter
//! count. Ids are the checkpoint's Hugging Face name in lower case without its organisation.
//!
//! Figures come from each checkpoint's `config.json` (committed under `tests/fixtures/hf/`,
//! where the importer test reads them too).

use super::model::{Activation, LayerRule, MlpKind, ModelSpec, NormKind, Positions, QkNorm, Router, WindowKind};

/// A named preset.
#[derive(Clone, Debug, PartialEq)]
pub struct Preset {
    pub id: &'static str,
    /// The Hugging Face repository it describes.
    pub checkpoint: &'static str,
    pub family: &'static str,
    pub spec: ModelSpec,
}

/// The id used when a configuration names no model.
pub const DEFAULT_PRESET: &str = "llama-3.1-8b";

/// The architecture of [`DEFAULT_PRESET`], Llama-3.1-8B.
pub const fn default_spec() -> ModelSpec {
    llama(128256, 4096, 32, 32, 8, 14336, 131072)
}

/// Llama-style decoder: RMSNorm, SwiGLU, rotary, untied, no biases.
const fn llama(vocab: u64, hidden: u64, layers: u64, heads: u64, kv_heads: u64, ffn: u64, max_pos: u64) -> ModelSpec {
    ModelSpec {
        vocab,
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim: hidden / heads,
        ffn,
        mlp: MlpKind::Gated,
        act: Activation::Silu,
        norm: NormKind::Rmsnorm,
        layer_norms: 2,
        final_norm: true,
        qk_norm: QkNorm::None,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        head_bias: false,
        tied: false,
        positions: Positions::Rope,
        max_pos,
        pos_offset: 0,
        rotary_pct: 100,
        parallel: false,
        embed_proj: 0,
        experts: 0,
        top_k: 0,
        expert_ffn: 0,
        shared_experts: 0,
        shared_ffn: 0,
        shared_gate: false,
        dense_layers: 0,
        fused_qkv: false,
        fused_gate_up: false,
        fused_experts: false,
        softcap: false,
        softmax_fp32: true,
        resid_dropout: false,
        embed_dropout: false,
        q_lora_rank: 0,
        kv_lora_rank: 0,
        qk_rope_dim: 0,
        v_head_dim: 0,
        attn_sinks: false,
        qk_l2_norm: false,
        nope_layers: LayerRule::None,
        window_layers: LayerRule::None,
        window: 0,
        window_kind: WindowKind::Sliding,
        moe_rule: LayerRule::All,
        router: Router::Softmax,
        router_bias: false,
        router_fp32: false,
        router_groups: 0,
        router_group_topk: 0,
        expert_bias: false,
        experts_in_out: false,
        moe_all_experts: false,
    }
}

/// GPT-2: learned positions, LayerNorm, `gelu_new` MLP of 4h, fused Conv1D QKV, all biases,
/// tied head, n_positions = 1024.
const fn gpt2(hidden: u64, layers: u64, heads: u64) -> ModelSpec {
    let mut m = llama(50257, hidden, layers, heads, heads, 4 * hidden, 1024);
    m.mlp = MlpKind::Plain;
    m.act = Activation::GeluNew;
    m.norm = NormKind::Layernorm;
    m.qkv_bias = true;
    m.o_bias = true;
    m.mlp_bias = true;
    m.tied = true;
    m.positions = Positions::Learned;
    m.rotary_pct = 0;
    m.fused_qkv = true;
    m.softmax_fp32 = false;
    m.resid_dropout = true;
    m.embed_dropout = true;
    m
}

const fn tied(mut m: ModelSpec) -> ModelSpec {
    m.tied = true;
    m
}

const fn with_head_dim(mut m: ModelSpec, head_dim: u64) -> ModelSpec {
    m.head_dim = head_dim;
    m
}

/// Qwen2: Llama with biases on Q, K and V.
const fn qwen2(vocab: u64, hidden: u64, layers: u64, heads: u64, kv_heads: u64, ffn: u64, max_pos: u64) -> ModelSpec {
    let mut m = llama(vocab, hidden, layers, heads, kv_heads, ffn, max_pos);
    m.qkv_bias = true;
    m
}

/// Gemma-2: GeGLU (tanh GELU), four RMSNorms per layer, explicit head_dim, tied 256K
/// vocabulary, tanh soft-capping of scores and logits.
const fn gemma2(hidden: u64, layers: u64, heads: u64, kv_heads: u64, head_dim: u64, ffn: u64) -> ModelSpec {
    let mut m = llama(256000, hidden, layers, heads, kv_heads, ffn, 8192);
    m.head_dim = head_dim;
    m.act = Activation::GeluTanh;
    m.norm = NormKind::RmsnormGemma;
    m.layer_norms = 4;
    m.tied = true;
    m.softcap = true;
    m
}

const fn mixtral() -> ModelSpec {
    let mut m = llama(32000, 4096, 32, 32, 8, 0, 32768);
    m.experts = 8;
    m.top_k = 2;
    m.expert_ffn = 14336;
    m.fused_experts = true;
    m
}

const fn phi3_mini() -> ModelSpec {
    let mut m = llama(32064, 3072, 32, 32, 32, 8192, 4096);
    m.fused_qkv = true;
    m.fused_gate_up = true;
    m.resid_dropout = true;
    m
}

/// Every preset, in the order the picker lists them.
pub fn presets() -> Vec<Preset> {
    let p = |id, checkpoint, family, spec| Preset { id, checkpoint, family, spec };
    vec![
        p("gpt2", "openai-community/gpt2", "GPT-2", gpt2(768, 12, 12)),
        p("gpt2-medium", "openai-community/gpt2-medium", "GPT-2", gpt2(1024, 24, 16)),
        p("gpt2-large", "openai-community/gpt2-large", "GPT-2", gpt2(1280, 36, 20)),
        p("gpt2-xl", "openai-community/gpt2-xl", "GPT-2", gpt2(1600, 48, 25)),
        p("llama-2-7b", "meta-llama/Llama-2-7b-hf", "Llama 2", llama(32000, 4096, 32, 32, 32, 11008, 4096)),
        p("llama-2-13b", "meta-llama/Llama-2-13b-hf", "Llama 2", llama(32000, 5120, 40, 40, 40, 13824, 4096)),
        p("llama-2-70b", "meta-llama/Llama-2-70b-hf", "Llama 2", llama(32000, 8192, 80, 64, 8, 28672, 4096)),
        p("llama-3.1-8b", "meta-llama/Llama-3.1-8B", "Llama 3.1", default_spec()),
        p("llama-3.1-70b", "meta-llama/Llama-3.1-70B", "Llama 3.1", llama(128256, 8192, 80, 64, 8, 28672, 131072)),
        p("llama-3.1-405b", "meta-llama/Llama-3.1-405B", "Llama 3.1", llama(128256, 16384, 126, 128, 8, 53248, 131072)),
        p("llama-3.2-1b", "meta-llama/Llama-3.2-1B", "Llama 3.2", with_head_dim(tied(llama(128256, 2048, 16, 32, 8, 8192, 131072)), 64)),
        p("llama-3.2-3b", "meta-llama/Llama-3.2-3B", "Llama 3.2", with_head_dim(tied(llama(128256, 3072, 28, 24, 8, 8192, 131072)), 128)),
        p("mistral-7b-v0.1", "mistralai/Mistral-7B-v0.1", "Mistral", llama(32000, 4096, 32, 32, 8, 14336, 32768)),
        p("mixtral-8x7b-v0.1", "mistralai/Mixtral-8x7B-v0.1", "Mistral", mixtral()),
        p("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", "Qwen2.5", tied(qwen2(151936, 896, 24, 14, 2, 4864, 32768))),
        p("qwen2.5-7b", "Qwen/Qwen2.5-7B", "Qwen2.5", qwen2(152064, 3584, 28, 28, 4, 18944, 131072)),
        p("qwen2.5-72b", "Qwen/Qwen2.5-72B", "Qwen2.5", qwen2(152064, 8192, 80, 64, 8, 29568, 131072)),
        p("gemma-2-2b", "google/gemma-2-2b", "Gemma 2", gemma2(2304, 26, 8, 4, 256, 9216)),
        p("gemma-2-9b", "google/gemma-2-9b", "Gemma 2", gemma2(3584, 42, 16, 8, 256, 14336)),
        p("gemma-2-27b", "google/gemma-2-27b", "Gemma 2", gemma2(4608, 46, 32, 16, 128, 36864)),
        p("phi-3-mini-4k-instruct", "microsoft/Phi-3-mini-4k-instruct", "Phi-3", phi3_mini()),
    ]
}

/// Looks a preset up by id (case-insensitive).
pub fn preset(id: &str) -> Option<Preset> {
    presets().into_iter().find(|p| p.id.eq_ignore_ascii_case(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Published counts: the sum of `numel` over each checkpoint's safetensors (tied weights
    /// once), as its model card and `model.safetensors.index.json` give them.
    const PUBLISHED: &[(&str, u64)] = &[
        ("gpt2", 124_439_808),
        ("gpt2-medium", 354_823_168),
        ("gpt2-large", 774_030_080),
        ("gpt2-xl", 1_557_611_200),
        ("llama-2-7b", 6_738_415_616),
        ("llama-2-13b", 13_015_864_320),
        ("llama-2-70b", 68_976_648_192),
        ("llama-3.1-8b", 8_030_261_248),
        ("llama-3.1-70b", 70_553_706_496),
        ("llama-3.1-405b", 405_853_388_800),
        ("llama-3.2-1b", 1_235_814_400),
        ("llama-3.2-3b", 3_212_749_824),
        ("mistral-7b-v0.1", 7_241_732_096),
        ("mixtral-8x7b-v0.1", 46_702_792_704),
        ("qwen2.5-0.5b", 494_032_768),
        ("qwen2.5-7b", 7_615_616_512),
        ("qwen2.5-72b", 72_706_203_648),
        ("gemma-2-2b", 2_614_341_888),
        ("gemma-2-9b", 9_241_705_984),
        ("gemma-2-27b", 27_227_128_320),
        ("phi-3-mini-4k-instruct", 3_821_079_552),
    ];

    #[test]
    fn every_preset_counts_exactly_its_published_parameters() {
        let all = presets();
        assert_eq!(all.len(), PUBLISHED.len(), "every preset needs a pinned count");
        for (id, want) in PUBLISHED {
            let p = preset(id).unwrap_or_else(|| panic!("no preset {id}"));
            assert_eq!(p.spec.counts().total, *want, "{id}");
        }
    }

    #[test]
    fn every_preset_is_a_valid_model() {
        for p in presets() {
            assert_eq!(p.spec.validate(), Ok(()), "{}", p.id);
        }
    }

    #[test]
    fn llama_3_1_70b_has_83_9_million_qkv_parameters_per_layer_and_an_untied_head() {
        // q: 8192 × 8192 = 67,108,864; k and v: 8192 × (8 × 128) = 8,388,608 each.
        let p = preset("llama-3.1-70b").map(|p| p.spec);
        let spec = p.as_ref().map(|s| (s.q_width() + 2 * s.kv_width()) * s.hidden);
        assert_eq!(spec, Some(83_886_080));
        assert_eq!(p.map(|s| s.tied), Some(false));
    }

    #[test]
    fn mixtral_activates_about_13_billion_parameters_per_token() {
        let c = preset("mixtral-8x7b-v0.1").map(|p| p.spec.counts());
        // 46.70 B total; each token uses 2 of 8 experts: 46.70 B − 6 × 32 × 3 × 4096 × 14336.
        assert_eq!(c.map(|c| c.active), Some(46_702_792_704 - 6 * 32 * 3 * 4096 * 14336));
    }

    #[test]
    fn preset_lookup_ignores_case_and_rejects_unknown_ids() {
        assert!(preset("Llama-3.1-8B").is_some());
        assert!(preset("llama-9").is_none());
    }
}
