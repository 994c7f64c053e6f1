//! Built-in models: real checkpoints, each pinned in a test to its exact parameter count — the
//! count transformers 5.24 builds from the checkpoint's `config.json` (on the meta device), which
//! equals the published safetensors total for text-only checkpoints. For a multimodal checkpoint
//! the preset is its language model (the vision tower is not counted, and the preset's notes say
//! so). Ids are the checkpoint's Hugging Face name in lower case without its organisation.
//!
//! Figures come from each checkpoint's `config.json` (committed under `tests/fixtures/hf/`,
//! where the importer test reads them too and checks that the import equals the preset).

use super::family::Family;
use super::model::{Activation, LayerRule, MlpKind, ModelSpec, NormKind, Positions, QkNorm, Router, WindowKind};

/// A named preset.
#[derive(Clone, Debug, PartialEq)]
pub struct Preset {
    pub id: &'static str,
    /// The Hugging Face repository it describes.
    pub checkpoint: &'static str,
    pub family: &'static str,
    pub spec: ModelSpec,
    /// What the preset leaves out of the checkpoint or assumes about it, one sentence each (the
    /// same statements the importer makes for the checkpoint's config.json).
    pub notes: &'static [&'static str],
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
        family: Family::Llama,
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
        clip_qkv: false,
        ssm: crate::estimator::model::Ssm::NONE,
    }
}

/// GPT-2: learned positions, LayerNorm, `gelu_new` MLP of 4h, fused Conv1D QKV, all biases,
/// tied head, n_positions = 1024.
const fn gpt2(hidden: u64, layers: u64, heads: u64) -> ModelSpec {
    let mut m = llama(50257, hidden, layers, heads, heads, 4 * hidden, 1024);
    m.family = Family::Gpt2;
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
    m.family = Family::Qwen2;
    m.qkv_bias = true;
    m
}

/// Gemma-2: GeGLU (tanh GELU), four RMSNorms per layer, explicit head_dim, tied 256K
/// vocabulary, tanh soft-capping of scores and logits.
const fn gemma2(hidden: u64, layers: u64, heads: u64, kv_heads: u64, head_dim: u64, ffn: u64) -> ModelSpec {
    let mut m = llama(256000, hidden, layers, heads, kv_heads, ffn, 8192);
    m.family = Family::Gemma2;
    m.head_dim = head_dim;
    m.act = Activation::GeluTanh;
    m.norm = NormKind::RmsnormGemma;
    m.layer_norms = 4;
    m.tied = true;
    m.softcap = true;
    m
}

/// Gemma-2 with its local layers: Gemma2Config's default `layer_types` slide a 4,096-token
/// window on the even layers.
fn gemma2_windowed(hidden: u64, layers: u64, heads: u64, kv_heads: u64, head_dim: u64, ffn: u64) -> ModelSpec {
    ModelSpec {
        window_layers: LayerRule::Every { step: 2, offset: 0 },
        window: 4096,
        ..gemma2(hidden, layers, heads, kv_heads, head_dim, ffn)
    }
}

/// Mistral-7B-v0.1: Llama with GQA and a 4,096-token sliding window on every layer.
fn mistral_7b() -> ModelSpec {
    ModelSpec { family: Family::Mistral, window_layers: LayerRule::All, window: 4096, ..llama(32000, 4096, 32, 32, 8, 14336, 32768) }
}

/// Qwen3 dense: head_dim 128, RMSNorm over each head of q and k, 40,960 positions.
const fn qwen3(hidden: u64, layers: u64, heads: u64, ffn: u64, tied: bool) -> ModelSpec {
    let mut m = llama(151_936, hidden, layers, heads, 8, ffn, 40_960);
    m.family = Family::Qwen3;
    m.head_dim = 128;
    m.qk_norm = QkNorm::Head;
    m.tied = tied;
    m
}

/// Qwen3-MoE: every layer sparse, fused experts, no shared expert.
const fn qwen3_moe(hidden: u64, layers: u64, heads: u64, kv_heads: u64, ffn: u64, expert_ffn: u64) -> ModelSpec {
    let mut m = qwen3(hidden, layers, heads, ffn, false);
    m.family = Family::Qwen3Moe;
    m.kv_heads = kv_heads;
    m.experts = 128;
    m.top_k = 8;
    m.expert_ffn = expert_ffn;
    m.fused_experts = true;
    m
}

/// Gemma 3's text model as the 4B–27B checkpoints have it: Gemma-2's layout plus q/k norms,
/// 262,208 vocabulary, 131,072 positions, no soft-capping, five layers with a 1,024-token sliding
/// window for every full one (1B differs in vocabulary, positions and window).
fn gemma3(hidden: u64, layers: u64, heads: u64, kv_heads: u64, head_dim: u64, ffn: u64) -> ModelSpec {
    let mut m = gemma2(hidden, layers, heads, kv_heads, head_dim, ffn);
    m.family = Family::Gemma3;
    m.vocab = 262_208;
    m.max_pos = 131_072;
    m.softcap = false;
    m.qk_norm = QkNorm::Head;
    ModelSpec { window_layers: LayerRule::AllBut { step: 6, offset: 5 }, window: 1024, ..m }
}

/// OLMo-2: untied Llama with q/k RMSNorms over all heads, 100,352 vocabulary, 4,096 positions.
const fn olmo2(hidden: u64, layers: u64, heads: u64, ffn: u64) -> ModelSpec {
    let mut m = llama(100_352, hidden, layers, heads, heads, ffn, 4096);
    m.family = Family::Olmo2;
    m.qk_norm = QkNorm::Full;
    m
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
const fn deepseek_v3(vocab: u64, heads: u64, experts: u64, dense: u64, groups: u64, topk_groups: u64, max_pos: u64) -> ModelSpec {
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

/// GLM-4.5-Air: 96 query / 8 KV heads of 128 with q/k/v biases, half-rotary, one dense layer of
/// 10,944, then 128 routed (top-8) + 1 shared expert of 1,408, sigmoid fp32 router.
const fn glm45_air() -> ModelSpec {
    let mut m = llama(151_552, 4096, 46, 96, 8, 10_944, 131_072);
    m.family = Family::Glm4Moe;
    m.head_dim = 128;
    m.qkv_bias = true;
    m.rotary_pct = 50;
    m.experts = 128;
    m.top_k = 8;
    m.expert_ffn = 1408;
    m.shared_experts = 1;
    m.shared_ffn = 1408;
    m.dense_layers = 1;
    m.fused_experts = true;
    m.router = Router::Sigmoid;
    m.router_fp32 = true;
    m.router_groups = 1;
    m.router_group_topk = 1;
    m
}

/// SmolLM3-3B: tied Llama with 16 query / 4 KV heads and every 4th layer NoPE.
fn smollm3_3b() -> ModelSpec {
    ModelSpec {
        family: Family::Smollm3,
        nope_layers: LayerRule::Every { step: 4, offset: 3 },
        ..tied(llama(128_256, 2048, 36, 16, 4, 11_008, 65_536))
    }
}

/// Phi-4: Phi-3's fused layout at 14B, GQA 40/10, 100,352 vocabulary, untied.
const fn phi4() -> ModelSpec {
    let mut m = llama(100_352, 5120, 40, 40, 10, 17_920, 16_384);
    m.family = Family::Phi3;
    m.fused_qkv = true;
    m.fused_gate_up = true;
    m.resid_dropout = true;
    m
}

const fn mixtral() -> ModelSpec {
    let mut m = llama(32000, 4096, 32, 32, 8, 0, 32768);
    m.family = Family::Mixtral;
    m.experts = 8;
    m.top_k = 2;
    m.expert_ffn = 14336;
    m.fused_experts = true;
    m
}

/// Phi-3-mini-4k: fused QKV and gate/up, and a 2,047-token sliding window on every layer
/// (`sliding_window` in its config.json, passed to every layer by modeling_phi3.py).
fn phi3_mini() -> ModelSpec {
    let mut m = llama(32064, 3072, 32, 32, 32, 8192, 4096);
    m.family = Family::Phi3;
    m.fused_qkv = true;
    m.fused_gate_up = true;
    m.resid_dropout = true;
    ModelSpec { window_layers: LayerRule::All, window: 2047, ..m }
}

/// What the fp8 checkpoints' presets assume.
const FP8_CHECKPOINT: &str =
    "the checkpoint is stored in fp8 (128×128 blocks); trainmem assumes training from dequantized weights in the recipe's dtype";

/// What the multimodal presets leave out.
const VISION_NOT_COUNTED: &[&str] = &["the language model of a multimodal checkpoint: its vision tower and projector are not counted"];

/// Every preset, in the order the picker lists them.
pub fn presets() -> Vec<Preset> {
    let p = |id, checkpoint, family, spec| Preset { id, checkpoint, family, spec, notes: &[] };
    let n = |id, checkpoint, family, spec, notes| Preset { id, checkpoint, family, spec, notes };
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
        p("mistral-7b-v0.1", "mistralai/Mistral-7B-v0.1", "Mistral", mistral_7b()),
        p("mixtral-8x7b-v0.1", "mistralai/Mixtral-8x7B-v0.1", "Mistral", mixtral()),
        p("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", "Qwen2.5", tied(qwen2(151936, 896, 24, 14, 2, 4864, 32768))),
        p("qwen2.5-7b", "Qwen/Qwen2.5-7B", "Qwen2.5", qwen2(152064, 3584, 28, 28, 4, 18944, 131072)),
        p("qwen2.5-72b", "Qwen/Qwen2.5-72B", "Qwen2.5", qwen2(152064, 8192, 80, 64, 8, 29568, 131072)),
        p("gemma-2-2b", "google/gemma-2-2b", "Gemma 2", gemma2_windowed(2304, 26, 8, 4, 256, 9216)),
        p("gemma-2-9b", "google/gemma-2-9b", "Gemma 2", gemma2_windowed(3584, 42, 16, 8, 256, 14336)),
        p("gemma-2-27b", "google/gemma-2-27b", "Gemma 2", gemma2_windowed(4608, 46, 32, 16, 128, 36864)),
        p("phi-3-mini-4k-instruct", "microsoft/Phi-3-mini-4k-instruct", "Phi-3", phi3_mini()),
        p("phi-4", "microsoft/phi-4", "Phi-4", phi4()),
        p("qwen3-0.6b", "Qwen/Qwen3-0.6B", "Qwen3", qwen3(1024, 28, 16, 3072, true)),
        p("qwen3-1.7b", "Qwen/Qwen3-1.7B", "Qwen3", qwen3(2048, 28, 16, 6144, true)),
        p("qwen3-4b", "Qwen/Qwen3-4B", "Qwen3", qwen3(2560, 36, 32, 9728, true)),
        p("qwen3-8b", "Qwen/Qwen3-8B", "Qwen3", qwen3(4096, 36, 32, 12288, false)),
        p("qwen3-14b", "Qwen/Qwen3-14B", "Qwen3", qwen3(5120, 40, 40, 17408, false)),
        p("qwen3-32b", "Qwen/Qwen3-32B", "Qwen3", qwen3(5120, 64, 64, 25600, false)),
        p("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "Qwen3", qwen3_moe(2048, 48, 32, 4, 6144, 768)),
        p("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", "Qwen3", qwen3_moe(4096, 94, 64, 4, 12288, 1536)),
        p("gemma-3-1b-it", "google/gemma-3-1b-it", "Gemma 3", ModelSpec { vocab: 262_144, max_pos: 32_768, window: 512, ..gemma3(1152, 26, 4, 1, 256, 6912) }),
        n("gemma-3-4b-it", "google/gemma-3-4b-it", "Gemma 3", gemma3(2560, 34, 8, 4, 256, 10_240), VISION_NOT_COUNTED),
        n("gemma-3-12b-it", "google/gemma-3-12b-it", "Gemma 3", gemma3(3840, 48, 16, 8, 256, 15_360), VISION_NOT_COUNTED),
        n("gemma-3-27b-it", "google/gemma-3-27b-it", "Gemma 3", gemma3(5376, 62, 32, 16, 128, 21_504), VISION_NOT_COUNTED),
        p("olmo-2-1124-7b", "allenai/OLMo-2-1124-7B", "OLMo 2", olmo2(4096, 32, 32, 11_008)),
        p("olmo-2-1124-13b", "allenai/OLMo-2-1124-13B", "OLMo 2", olmo2(5120, 40, 40, 13_824)),
        p("smollm3-3b", "HuggingFaceTB/SmolLM3-3B", "SmolLM3", smollm3_3b()),
        n(
            "mistral-small-3.1-24b-instruct-2503",
            "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
            "Mistral",
            ModelSpec { family: Family::Mistral, head_dim: 128, ..llama(131_072, 5120, 40, 32, 8, 32_768, 131_072) },
            VISION_NOT_COUNTED,
        ),
        n(
            "deepseek-v3",
            "deepseek-ai/DeepSeek-V3",
            "DeepSeek",
            deepseek_v3(129_280, 128, 256, 3, 8, 4, 163_840),
            &[
                "the checkpoint's multi-token-prediction layer (num_nextn_predict_layers 1) is not built by transformers' DeepseekV3ForCausalLM and is not counted",
                FP8_CHECKPOINT,
            ],
        ),
        p("deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite", "DeepSeek", deepseek_v2_lite()),
        n(
            "kimi-k2-instruct",
            "moonshotai/Kimi-K2-Instruct",
            "Kimi K2",
            deepseek_v3(163_840, 64, 384, 1, 1, 1, 131_072),
            &["Kimi K2 is DeepSeek-V3's architecture (model_type kimi_k2, read as deepseek_v3)", FP8_CHECKPOINT],
        ),
        n(
            "gpt-oss-20b",
            "openai/gpt-oss-20b",
            "gpt-oss",
            gpt_oss(24, 32),
            &["the checkpoint stores its experts in MXFP4; trainmem assumes training from the dequantized weights in the recipe's dtype (e.g. bf16)"],
        ),
        n(
            "gpt-oss-120b",
            "openai/gpt-oss-120b",
            "gpt-oss",
            gpt_oss(36, 128),
            &["the checkpoint stores its experts in MXFP4; trainmem assumes training from the dequantized weights in the recipe's dtype (e.g. bf16)"],
        ),
        n(
            "llama-4-scout-17b-16e-instruct",
            "meta-llama/Llama-4-Scout-17B-16E-Instruct",
            "Llama 4",
            llama4(16, LayerRule::All, true, 10_485_760),
            VISION_NOT_COUNTED,
        ),
        n(
            "llama-4-maverick-17b-128e-instruct",
            "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
            "Llama 4",
            llama4(128, LayerRule::Every { step: 2, offset: 1 }, false, 1_048_576),
            VISION_NOT_COUNTED,
        ),
        n(
            "glm-4.5-air",
            "zai-org/GLM-4.5-Air",
            "GLM-4.5",
            glm45_air(),
            &["the checkpoint's multi-token-prediction layer (num_nextn_predict_layers 1) is not built by transformers' Glm4MoeForCausalLM and is not counted"],
        ),
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

    /// The 2026 presets: transformers 5.24's count on the meta device (tests/fixtures/hf/count.py)
    /// — for a multimodal checkpoint its text model's — with the published figure it rounds to.
    const COUNTED: &[(&str, u64)] = &[
        ("phi-4", 14_659_507_200),                               // 14.7 B
        ("qwen3-0.6b", 596_049_920),                             // 0.6 B
        ("qwen3-1.7b", 1_720_574_976),                           // 1.7 B
        ("qwen3-4b", 4_022_468_096),                             // 4.0 B
        ("qwen3-8b", 8_190_735_360),                             // 8.2 B
        ("qwen3-14b", 14_768_307_200),                           // 14.8 B
        ("qwen3-32b", 32_762_123_264),                           // 32.8 B
        ("qwen3-30b-a3b", 30_532_122_624),                       // 30.5 B
        ("qwen3-235b-a22b", 235_093_634_560),                    // 235 B
        ("gemma-3-1b-it", 999_885_952),                          // 1.0 B
        ("gemma-3-4b-it", 3_880_263_168),                        // 4.3 B with the 419.8 M vision tower
        ("gemma-3-12b-it", 11_766_034_176),                      // 12.2 B with the 421.3 M vision tower
        ("gemma-3-27b-it", 27_009_346_304),                      // 27.4 B with the 423.1 M vision tower
        ("olmo-2-1124-7b", 7_298_617_344),                       // 7.3 B
        ("olmo-2-1124-13b", 13_716_198_400),                     // 13.7 B
        ("smollm3-3b", 3_075_098_624),                           // 3.1 B
        ("mistral-small-3.1-24b-instruct-2503", 23_572_403_200), // 24,011,361,280 with the vision tower
        ("deepseek-v3", 671_026_404_352),                        // 671 B, MTP layer excluded
        ("deepseek-v2-lite", 15_706_484_224),                    // 15.7 B
        ("kimi-k2-instruct", 1_026_408_209_408),                 // 1.03 T
        ("gpt-oss-20b", 20_914_757_184),                         // 20.9 B
        ("gpt-oss-120b", 116_829_156_672),                       // 116.8 B
        ("llama-4-scout-17b-16e-instruct", 107_769_861_120),     // 108.6 B with the 871.9 M vision tower
        ("llama-4-maverick-17b-128e-instruct", 400_711_848_960), // 401.6 B with the vision tower
        ("glm-4.5-air", 106_852_245_504),                        // 106 B, MTP layer excluded
    ];

    #[test]
    fn every_preset_counts_exactly_its_published_parameters() {
        let all = presets();
        assert_eq!(all.len(), PUBLISHED.len() + COUNTED.len(), "every preset needs a pinned count");
        for (id, want) in PUBLISHED.iter().chain(COUNTED) {
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

    #[test]
    fn deepseek_v3_counts_671_billion_without_its_mtp_layer_and_says_so() {
        let p = preset("deepseek-v3").expect("preset");
        assert_eq!(p.spec.counts().total, 671_026_404_352);
        assert!(p.notes.iter().any(|n| n.contains("multi-token-prediction")));
        // 58 MoE layers after 3 dense ones; 8 of 256 routed experts per token.
        assert_eq!((p.spec.dense_mlp_layers(), p.spec.moe_layers()), (3, 58));
    }

    #[test]
    fn gpt_oss_activates_the_model_cards_figures_beside_its_embedding() {
        // OpenAI's model card: 3.61 B and 5.13 B active parameters, not counting the embedding
        // table (201,088 × 2,880 = 579,133,440).
        let embedding = 201_088 * 2880;
        let active = |id| preset(id).map(|p| p.spec.counts().active - embedding);
        assert_eq!(active("gpt-oss-20b"), Some(3_608_307_264));
        assert_eq!(active("gpt-oss-120b"), Some(5_132_849_472));
    }

    #[test]
    fn llama_4_maverick_alternates_dense_and_moe_layers_and_scout_is_all_moe() {
        let m = preset("llama-4-maverick-17b-128e-instruct").map(|p| (p.spec.dense_mlp_layers(), p.spec.moe_layers()));
        let s = preset("llama-4-scout-17b-16e-instruct").map(|p| (p.spec.dense_mlp_layers(), p.spec.moe_layers()));
        assert_eq!((m, s), (Some((24, 24)), Some((0, 48))));
    }

    #[test]
    fn multimodal_presets_say_their_vision_tower_is_not_counted() {
        for id in
            ["gemma-3-4b-it", "gemma-3-12b-it", "gemma-3-27b-it", "mistral-small-3.1-24b-instruct-2503", "llama-4-scout-17b-16e-instruct"]
        {
            let p = preset(id).unwrap_or_else(|| panic!("no preset {id}"));
            assert!(p.notes.iter().any(|n| n.contains("vision tower")), "{id}");
        }
    }

    #[test]
    fn the_presets_from_before_2026_use_no_new_architectural_feature_except_their_windows() {
        for (id, _) in PUBLISHED {
            let p = preset(id).unwrap_or_else(|| panic!("no preset {id}"));
            let f: Vec<_> = p.spec.features().into_iter().filter(|f| !f.contains("sliding-window")).collect();
            assert!(f.is_empty(), "{id}: {f:?}");
        }
    }
}
