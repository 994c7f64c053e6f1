//! Hugging Face `config.json` export: the inverse of [`super::hf`].
//!
//! [`to_config_json`] writes a transformers 5.24 `config.json` whose model is exactly a
//! [`ModelSpec`]: the "verify on your GPU" script builds its model from it with
//! `AutoConfig.for_model(model_type, **config)` and `AutoModelForCausalLM.from_config`, with random
//! weights.
//!
//! # How the model type is chosen
//!
//! It is the spec's family ([`ModelSpec::family`], decided by the importer, a preset or the link):
//! each family has a writer here that puts every field of the spec into the keys that type's
//! configuration class reads (transformers 5.24, `models/<type>/configuration_<type>.py`) — and
//! only those: a key the class ignores would make the round trip below pass while transformers
//! built something else. The file is accepted only if the importer reads it back into a spec
//! **equal** to the input (the round trip; per-layer rules are compared in their shortest form
//! over the model's layers, so a Gemma-2 cut to two layers, whose `every:2:0` is `first:1` there,
//! still round-trips). Fields a type fixes (Gemma's four norms, Qwen2's q/k/v biases, gpt-oss's
//! sinks) thereby decide what a family's class can express: an architecture its class does not
//! build is an error that names the fields it could not express.
//!
//! # What is written beyond the spec
//!
//! - `pad_token_id: null` in every file: the spec has no padding token, and some classes' defaults
//!   (Phi-3's 32,000, SmolLM3's 128,004) would point outside a small vocabulary.
//!   `nn.Embedding(padding_idx=…)` changes no memory.
//! - Router details the spec does not carry take the measured checkpoints' values: Qwen3-MoE
//!   renormalises its top-k weights (`norm_topk_prob: true`, as Qwen3-30B-A3B and the validation
//!   harness), Qwen2-MoE does not (Qwen1.5-MoE-A2.7B).
//! - Nothing about RoPE bases, token ids or initialisation: they change no byte of the step.

use super::family::Family;
use super::hf;
use super::model::{Activation, LayerRule, ModelSpec, NormKind, Positions, QkNorm, WindowKind};
use serde_json::{Map, Value};

/// The model types [`to_config_json`] can write: every family's.
pub fn exportable() -> impl Iterator<Item = &'static str> {
    Family::ALL.iter().map(|(_, t, _)| *t)
}

/// Why a spec cannot be exported.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExportError {
    /// No model type's configuration reads back into the spec.
    #[error("this custom architecture is not one transformers' `{model_type}` class builds exactly: {reason}")]
    NoModelType { model_type: &'static str, reason: String },
    /// The spec itself is not a valid model.
    #[error("the architecture is not a valid model: {0}")]
    Invalid(String),
}

/// A written config.json and the model type it uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    pub model_type: &'static str,
    pub config: Value,
}

/// A transformers 5.24 `config.json` of `spec`'s family whose model is exactly `spec` (see the
/// module doc).
pub fn to_config_json(spec: &ModelSpec) -> Result<Value, ExportError> {
    export(spec).map(|e| e.config)
}

/// [`to_config_json`] with its model type.
pub fn export(spec: &ModelSpec) -> Result<Exported, ExportError> {
    spec.validate().map_err(|e| ExportError::Invalid(e.to_string()))?;
    let want = canonical(spec);
    let t = spec.family.model_type();
    // The closest miss, for the error: (differing fields, what differs).
    let mut closest: Option<(usize, String)> = None;
    for config in candidates(t, spec) {
        let value = Value::Object(config);
        match hf::import_value(&value) {
            Ok(back) if canonical(&back.spec) == want => return Ok(Exported { model_type: t, config: value }),
            Ok(back) => {
                let diff = differing_fields(&want, &canonical(&back.spec));
                if closest.as_ref().is_none_or(|(n, _)| diff.len() < *n) {
                    closest = Some((diff.len(), format!("its config would change {}", diff.join(", "))));
                }
            }
            Err(e) => {
                if closest.is_none() {
                    closest = Some((usize::MAX, format!("its config does not import ({e})")));
                }
            }
        }
    }
    let reason = closest.map_or_else(|| "no writer accepts it".to_string(), |(_, why)| why);
    Err(ExportError::NoModelType { model_type: t, reason })
}

/// The spec with its per-layer rules in their shortest form over its layers (`every:2:0` over two
/// layers is `first:1`, as the importer writes it) and no window size without a local layer: two
/// specs of the same model compare equal.
fn canonical(spec: &ModelSpec) -> ModelSpec {
    let flags = |rule: &LayerRule| LayerRule::from_flags(&(0..spec.layers).map(|i| rule.contains(i)).collect::<Vec<_>>());
    let mut s = ModelSpec {
        nope_layers: flags(&spec.nope_layers),
        window_layers: flags(&spec.window_layers),
        moe_rule: flags(&spec.moe_rule),
        ..spec.clone()
    };
    if s.window_layers == LayerRule::None {
        s.window = 0;
        s.window_kind = WindowKind::default();
    }
    s
}

/// The names of the spec fields that differ (serde names, in declaration order).
fn differing_fields(a: &ModelSpec, b: &ModelSpec) -> Vec<String> {
    let (Ok(Value::Object(a)), Ok(Value::Object(b))) = (serde_json::to_value(a), serde_json::to_value(b)) else {
        return vec!["the architecture".to_string()];
    };
    a.iter().filter(|(k, v)| b.get(*k) != Some(*v)).map(|(k, v)| format!("{k} ({v} → {})", b.get(k).unwrap_or(&Value::Null))).collect()
}

// ---- Writers ---------------------------------------------------------------------------------------

/// The configs to try for model type `t` (most types have one; Falcon has two layouts).
fn candidates(t: &str, s: &ModelSpec) -> Vec<Map<String, Value>> {
    let one = |m: Option<Map<String, Value>>| m.into_iter().collect();
    match t {
        "llama" | "mistral" | "mixtral" | "qwen2" | "qwen2_moe" | "qwen3" | "qwen3_moe" | "gemma" | "gemma2" | "olmo" | "olmo2"
        | "phi3" => one(llama_family(t, s)),
        "gemma3_text" => one(gemma3_text(s)),
        "gpt2" => one(gpt2(s)),
        "gpt_neox" => one(gpt_neox(s)),
        "opt" => one(opt(s)),
        "falcon" => falcon(s),
        "phi" => one(phi(s)),
        "stablelm" => one(stablelm(s)),
        "starcoder2" => one(starcoder2(s)),
        "deepseek_v2" | "deepseek_v3" => one(deepseek(t, s)),
        "gpt_oss" => one(gpt_oss(s)),
        "llama4_text" => one(llama4_text(s)),
        "glm4_moe" => one(glm4_moe(s)),
        "smollm3" => one(smollm3(s)),
        _ => Vec::new(),
    }
}

/// A config map from key/value pairs.
struct Writer(Map<String, Value>);

impl Writer {
    fn new(model_type: &str) -> Writer {
        let mut m = Map::new();
        m.insert("model_type".into(), Value::from(model_type));
        m.insert("pad_token_id".into(), Value::Null);
        Writer(m)
    }
    fn set(&mut self, key: &str, v: impl Into<Value>) -> &mut Writer {
        self.0.insert(key.to_string(), v.into());
        self
    }
    fn done(&mut self) -> Option<Map<String, Value>> {
        Some(std::mem::take(&mut self.0))
    }
}

/// The `hidden_act` spelling of an activation; `None` for the clamped SwiGLU, which only gpt-oss
/// has (and fixes).
fn act_name(a: Activation) -> Option<&'static str> {
    Some(match a {
        Activation::Silu => "silu",
        Activation::Gelu => "gelu",
        Activation::GeluTanh => "gelu_pytorch_tanh",
        Activation::GeluNew => "gelu_new",
        Activation::Relu => "relu",
        Activation::SwigluClamped => return None,
    })
}

/// `partial_rotary_factor` as transformers reads it: the rotary percentage as a fraction.
fn rotary_fraction(s: &ModelSpec) -> f64 {
    s.rotary_pct as f64 / 100.0
}

/// `layer_types`: `kind` on the layers of `window_layers`, `full_attention` elsewhere.
fn layer_types(s: &ModelSpec, kind: &str) -> Value {
    Value::from((0..s.layers).map(|i| if s.window_layers.contains(i) { kind } else { "full_attention" }).collect::<Vec<_>>())
}

/// The window size, or `null` when no layer is local.
fn window_or_null(s: &ModelSpec) -> Value {
    if s.window_layers.count(s.layers) > 0 {
        Value::from(s.window)
    } else {
        Value::Null
    }
}

/// Layer indices in `rule` among the model's layers.
fn indices(rule: &LayerRule, layers: u64) -> Vec<u64> {
    (0..layers).filter(|&i| rule.contains(i)).collect()
}

/// The sizes every Llama-style class reads under the same names.
fn llama_sizes(w: &mut Writer, s: &ModelSpec) {
    w.set("vocab_size", s.vocab)
        .set("hidden_size", s.hidden)
        .set("num_hidden_layers", s.layers)
        .set("num_attention_heads", s.heads)
        .set("num_key_value_heads", s.kv_heads)
        .set("head_dim", s.head_dim)
        .set("max_position_embeddings", s.max_pos)
        .set("tie_word_embeddings", s.tied);
}

/// Llama, Mistral, Mixtral, Qwen2/3 (dense and MoE), Gemma 1/2, OLMo 1/2 and Phi-3: the importer's
/// shared branch (hf.rs, `spec_for`).
/// The `clip_qkv` written for an OLMo that clamps its q, k, v (OLMo-1.7-7B's value; the memory
/// does not depend on it).
const OLMO_CLIP_QKV: f64 = 8.0;

fn llama_family(t: &str, s: &ModelSpec) -> Option<Map<String, Value>> {
    let mut w = Writer::new(t);
    llama_sizes(&mut w, s);
    let act_key = if t == "gemma2" { "hidden_activation" } else { "hidden_act" };
    w.set(act_key, act_name(s.act)?);
    w.set("intermediate_size", if t == "mixtral" { s.expert_ffn } else { s.ffn });
    // Which classes read `attention_bias` and `mlp_bias` (configuration_<type>.py).
    if matches!(t, "llama" | "qwen3" | "qwen3_moe" | "gemma" | "gemma2" | "olmo" | "olmo2") {
        w.set("attention_bias", s.qkv_bias);
    }
    if t == "llama" {
        w.set("mlp_bias", s.mlp_bias);
    }
    if t == "qwen2_moe" {
        w.set("qkv_bias", s.qkv_bias);
    }
    if t == "phi3" {
        w.set("partial_rotary_factor", rotary_fraction(s));
    }
    match t {
        "gemma2" => {
            w.set("sliding_window", window_or_null(s)).set("layer_types", layer_types(s, "sliding_attention"));
            softcaps(&mut w, s);
        }
        // Mistral, Mixtral and Phi-3 give `sliding_window` to every layer.
        "mistral" | "mixtral" | "phi3" => {
            let all = s.window_layers == LayerRule::All && s.window > 0;
            w.set("sliding_window", if all { Value::from(s.window) } else { Value::Null });
        }
        "qwen2" | "qwen2_moe" | "qwen3" | "qwen3_moe" => {
            w.set("use_sliding_window", false);
        }
        // Any value clamps (and keeps) the same tensors: OLMo-1.7-7B's.
        "olmo" if s.clip_qkv => {
            w.set("clip_qkv", OLMO_CLIP_QKV);
        }
        _ => {}
    }
    match t {
        "mixtral" => {
            w.set("num_local_experts", s.experts).set("num_experts_per_tok", s.top_k);
        }
        "qwen2_moe" | "qwen3_moe" => {
            let dense: Vec<u64> = (0..s.layers).filter(|&i| !s.moe_rule.contains(i)).collect();
            w.set("num_experts", s.experts)
                .set("num_experts_per_tok", s.top_k)
                .set("moe_intermediate_size", s.expert_ffn)
                .set("decoder_sparse_step", 1)
                .set("mlp_only_layers", dense)
                .set("norm_topk_prob", t == "qwen3_moe");
            if t == "qwen2_moe" {
                w.set("shared_expert_intermediate_size", s.shared_ffn);
            }
        }
        _ => {}
    }
    w.done()
}

/// Gemma-2's and Gemma-3's tanh soft-capping: the Gemma-2 checkpoints' values, or none.
fn softcaps(w: &mut Writer, s: &ModelSpec) {
    const ATTN_SOFTCAP: f64 = 50.0;
    const FINAL_SOFTCAP: f64 = 30.0;
    let cap = |v: f64| if s.softcap { Value::from(v) } else { Value::Null };
    w.set("attn_logit_softcapping", cap(ATTN_SOFTCAP)).set("final_logit_softcapping", cap(FINAL_SOFTCAP));
}

fn gemma3_text(s: &ModelSpec) -> Option<Map<String, Value>> {
    let mut w = Writer::new("gemma3_text");
    llama_sizes(&mut w, s);
    w.set("intermediate_size", s.ffn)
        .set("hidden_activation", act_name(s.act)?)
        .set("attention_bias", s.qkv_bias)
        .set("sliding_window", window_or_null(s))
        .set("layer_types", layer_types(s, "sliding_attention"));
    softcaps(&mut w, s);
    w.done()
}

fn gpt2(s: &ModelSpec) -> Option<Map<String, Value>> {
    Writer::new("gpt2")
        .set("vocab_size", s.vocab)
        .set("n_embd", s.hidden)
        .set("n_layer", s.layers)
        .set("n_head", s.heads)
        .set("n_inner", s.ffn)
        .set("activation_function", act_name(s.act)?)
        .set("n_positions", s.max_pos)
        .set("tie_word_embeddings", s.tied)
        .done()
}

fn gpt_neox(s: &ModelSpec) -> Option<Map<String, Value>> {
    Writer::new("gpt_neox")
        .set("vocab_size", s.vocab)
        .set("hidden_size", s.hidden)
        .set("num_hidden_layers", s.layers)
        .set("num_attention_heads", s.heads)
        .set("intermediate_size", s.ffn)
        .set("hidden_act", act_name(s.act)?)
        .set("attention_bias", s.qkv_bias)
        .set("tie_word_embeddings", s.tied)
        .set("max_position_embeddings", s.max_pos)
        .set("partial_rotary_factor", rotary_fraction(s))
        .set("use_parallel_residual", s.parallel)
        .done()
}

fn opt(s: &ModelSpec) -> Option<Map<String, Value>> {
    let (affine, bias) = match s.norm {
        NormKind::Nonparametric => (false, s.qkv_bias),
        NormKind::Layernorm => (true, true),
        NormKind::LayernormNoBias => (true, false),
        NormKind::Rmsnorm | NormKind::RmsnormGemma => return None,
    };
    Writer::new("opt")
        .set("vocab_size", s.vocab)
        .set("hidden_size", s.hidden)
        .set("num_hidden_layers", s.layers)
        .set("num_attention_heads", s.heads)
        .set("ffn_dim", s.ffn)
        .set("activation_function", act_name(s.act)?)
        .set("layer_norm_elementwise_affine", affine)
        .set("enable_bias", bias)
        .set("tie_word_embeddings", s.tied)
        .set("max_position_embeddings", s.max_pos)
        .set("word_embed_proj_dim", if s.embed_proj > 0 { s.embed_proj } else { s.hidden })
        // Pre-norm OPT has a final layer norm; post-norm OPT (350m) has none.
        .set("do_layer_norm_before", s.final_norm)
        .done()
}

/// Falcon's two layouts: the original (multi-query or MHA, one norm for parallel blocks) and
/// `new_decoder_architecture` (GQA, `num_ln_in_parallel_attn` norms).
fn falcon(s: &ModelSpec) -> Vec<Map<String, Value>> {
    let Some(act) = act_name(s.act) else { return Vec::new() };
    let base = |new_arch: bool| {
        let mut w = Writer::new("falcon");
        w.set("vocab_size", s.vocab)
            .set("hidden_size", s.hidden)
            .set("num_hidden_layers", s.layers)
            .set("num_attention_heads", s.heads)
            .set("ffn_hidden_size", s.ffn)
            .set("activation", act)
            .set("bias", s.qkv_bias)
            .set("tie_word_embeddings", s.tied)
            .set("max_position_embeddings", s.max_pos)
            .set("alibi", s.positions == Positions::None)
            .set("new_decoder_architecture", new_arch);
        w
    };
    let mut old = base(false);
    old.set("multi_query", s.kv_heads == 1).set("parallel_attn", s.parallel);
    let mut new = base(true);
    new.set("num_kv_heads", s.kv_heads).set("num_ln_in_parallel_attn", s.layer_norms).set("parallel_attn", true);
    [old.done(), new.done()].into_iter().flatten().collect()
}

fn phi(s: &ModelSpec) -> Option<Map<String, Value>> {
    Writer::new("phi")
        .set("vocab_size", s.vocab)
        .set("hidden_size", s.hidden)
        .set("num_hidden_layers", s.layers)
        .set("num_attention_heads", s.heads)
        .set("num_key_value_heads", s.kv_heads)
        .set("intermediate_size", s.ffn)
        .set("hidden_act", act_name(s.act)?)
        .set("tie_word_embeddings", s.tied)
        .set("max_position_embeddings", s.max_pos)
        .set("partial_rotary_factor", rotary_fraction(s))
        .set("qk_layernorm", s.qk_norm == QkNorm::Head)
        .done()
}

fn stablelm(s: &ModelSpec) -> Option<Map<String, Value>> {
    Writer::new("stablelm")
        .set("vocab_size", s.vocab)
        .set("hidden_size", s.hidden)
        .set("num_hidden_layers", s.layers)
        .set("num_attention_heads", s.heads)
        .set("num_key_value_heads", s.kv_heads)
        .set("intermediate_size", s.ffn)
        .set("hidden_act", act_name(s.act)?)
        .set("use_qkv_bias", s.qkv_bias)
        .set("tie_word_embeddings", s.tied)
        .set("max_position_embeddings", s.max_pos)
        .set("partial_rotary_factor", rotary_fraction(s))
        .set("use_parallel_residual", s.parallel)
        .set("qk_layernorm", s.qk_norm == QkNorm::PerHead)
        .done()
}

fn starcoder2(s: &ModelSpec) -> Option<Map<String, Value>> {
    Writer::new("starcoder2")
        .set("vocab_size", s.vocab)
        .set("hidden_size", s.hidden)
        .set("num_hidden_layers", s.layers)
        .set("num_attention_heads", s.heads)
        .set("num_key_value_heads", s.kv_heads)
        .set("intermediate_size", s.ffn)
        .set("hidden_act", act_name(s.act)?)
        .set("use_bias", s.qkv_bias)
        .set("tie_word_embeddings", s.tied)
        .set("max_position_embeddings", s.max_pos)
        // Every layer attends through `sliding_window` (null: none).
        .set("sliding_window", if s.window_layers == LayerRule::All && s.window > 0 { Value::from(s.window) } else { Value::Null })
        .done()
}

/// DeepSeek-V2/V3: MLA, `first_k_dense_replace` dense layers, routed and shared experts.
fn deepseek(t: &str, s: &ModelSpec) -> Option<Map<String, Value>> {
    let mut w = Writer::new(t);
    w.set("vocab_size", s.vocab)
        .set("hidden_size", s.hidden)
        .set("num_hidden_layers", s.layers)
        .set("num_attention_heads", s.heads)
        .set("num_key_value_heads", s.heads)
        .set("intermediate_size", s.ffn)
        .set("max_position_embeddings", s.max_pos)
        .set("tie_word_embeddings", s.tied)
        .set("hidden_act", act_name(s.act)?)
        .set("kv_lora_rank", s.kv_lora_rank)
        .set("q_lora_rank", if s.q_lora_rank > 0 { Value::from(s.q_lora_rank) } else { Value::Null })
        .set("qk_rope_head_dim", s.qk_rope_dim)
        .set("qk_nope_head_dim", s.head_dim.checked_sub(s.qk_rope_dim)?)
        .set("v_head_dim", s.v_head_dim)
        .set("attention_bias", s.qkv_bias)
        .set("n_routed_experts", s.experts)
        .set("num_experts_per_tok", s.top_k)
        .set("moe_intermediate_size", s.expert_ffn)
        .set("n_shared_experts", s.shared_experts)
        .set("first_k_dense_replace", s.dense_layers);
    if t == "deepseek_v3" {
        w.set("n_group", s.router_groups).set("topk_group", s.router_group_topk);
    } else {
        w.set("mlp_bias", s.mlp_bias);
        if s.router_groups > 0 {
            w.set("topk_method", "group_limited_greedy").set("n_group", s.router_groups).set("topk_group", s.router_group_topk);
        } else {
            w.set("topk_method", "greedy");
        }
    }
    w.done()
}

fn gpt_oss(s: &ModelSpec) -> Option<Map<String, Value>> {
    let mut w = Writer::new("gpt_oss");
    llama_sizes(&mut w, s);
    w.set("intermediate_size", s.expert_ffn)
        .set("num_local_experts", s.experts)
        .set("num_experts_per_tok", s.top_k)
        .set("attention_bias", s.qkv_bias)
        .set("sliding_window", window_or_null(s))
        .set("layer_types", layer_types(s, "sliding_attention"))
        .done()
}

fn llama4_text(s: &ModelSpec) -> Option<Map<String, Value>> {
    let chunked = s.window_kind == WindowKind::Chunked || s.window_layers.count(s.layers) == 0;
    if !chunked {
        return None;
    }
    let mut w = Writer::new("llama4_text");
    llama_sizes(&mut w, s);
    let rope: Vec<u64> = (0..s.layers).map(|i| u64::from(!s.nope_layers.contains(i))).collect();
    w.set("hidden_act", act_name(s.act)?)
        .set("intermediate_size", s.expert_ffn)
        .set("intermediate_size_mlp", s.ffn)
        .set("num_local_experts", s.experts)
        .set("num_experts_per_tok", s.top_k)
        .set("moe_layers", indices(&s.moe_rule, s.layers))
        .set("no_rope_layers", rope)
        .set("use_qk_norm", s.qk_l2_norm)
        .set("attention_bias", s.qkv_bias)
        .set("attention_chunk_size", window_or_null(s))
        .set("layer_types", layer_types(s, "chunked_attention"))
        .done()
}

fn glm4_moe(s: &ModelSpec) -> Option<Map<String, Value>> {
    let mut w = Writer::new("glm4_moe");
    llama_sizes(&mut w, s);
    w.set("hidden_act", act_name(s.act)?)
        .set("intermediate_size", s.ffn)
        .set("attention_bias", s.qkv_bias)
        .set("use_qk_norm", s.qk_norm == QkNorm::Head)
        .set("partial_rotary_factor", rotary_fraction(s))
        .set("n_routed_experts", s.experts)
        .set("num_experts_per_tok", s.top_k)
        .set("moe_intermediate_size", s.expert_ffn)
        .set("n_shared_experts", s.shared_experts)
        .set("first_k_dense_replace", s.dense_layers)
        .set("n_group", s.router_groups)
        .set("topk_group", s.router_group_topk)
        .done()
}

fn smollm3(s: &ModelSpec) -> Option<Map<String, Value>> {
    let mut w = Writer::new("smollm3");
    llama_sizes(&mut w, s);
    let rope: Vec<u64> = (0..s.layers).map(|i| u64::from(!s.nope_layers.contains(i))).collect();
    let windowed = s.window_layers.count(s.layers) > 0;
    w.set("hidden_act", act_name(s.act)?)
        .set("intermediate_size", s.ffn)
        .set("attention_bias", s.qkv_bias)
        .set("mlp_bias", s.mlp_bias)
        .set("no_rope_layers", rope)
        .set("use_sliding_window", windowed)
        .set("sliding_window", window_or_null(s))
        .set("layer_types", layer_types(s, "sliding_attention"))
        .done()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::presets::presets;

    #[test]
    fn every_preset_round_trips_through_its_familys_model_type() {
        let mut failures = Vec::new();
        for p in presets() {
            match export(&p.spec) {
                Ok(e) => {
                    assert_eq!(e.model_type, p.spec.family.model_type(), "{}", p.id);
                    let back = hf::import_value(&e.config).map(|i| i.spec);
                    assert_eq!(back.as_ref(), Ok(&p.spec), "{}", p.id);
                }
                Err(err) => failures.push(format!("{}: {err}", p.id)),
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn an_architecture_its_familys_class_does_not_build_is_refused_naming_what_differs() {
        // Llama with a learned position table: transformers' llama class has RoPE only.
        let mut spec = crate::estimator::presets::default_spec();
        spec.positions = Positions::Learned;
        spec.rotary_pct = 0;
        let err = export(&spec).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.starts_with("this custom architecture is not one transformers' `llama` class builds exactly"), "{err}");
        assert!(err.contains("positions"), "{err}");
    }

    #[test]
    fn a_window_on_every_layer_exports_as_mistral_once_the_family_is_mistral() {
        let llama = ModelSpec { window_layers: LayerRule::All, window: 512, ..crate::estimator::presets::default_spec() };
        // Llama's class reads no `sliding_window`: the window cannot be written as a llama.
        assert!(export(&llama).is_err());
        let mistral = ModelSpec { family: Family::Mistral, ..llama };
        let e = export(&mistral).expect("exports");
        assert_eq!(e.model_type, "mistral");
        assert_eq!(e.config["sliding_window"], 512);
    }

    #[test]
    fn a_preset_cut_to_fewer_layers_still_round_trips_through_its_type() {
        // Gemma-2's sliding layers are every:2:0; over two layers the importer writes first:1.
        let spec = ModelSpec { layers: 2, ..crate::estimator::presets::preset("gemma-2-2b").map(|p| p.spec).expect("preset") };
        let e = export(&spec).expect("exports");
        assert_eq!(e.model_type, "gemma2");
        assert_eq!(e.config["layer_types"], serde_json::json!(["sliding_attention", "full_attention"]));
        let back = hf::import_value(&e.config).map(|i| i.spec.window_layers);
        assert_eq!(back, Ok(LayerRule::FirstK(1)));
    }

    #[test]
    fn an_invalid_spec_is_an_error_not_a_config() {
        let spec = ModelSpec { heads: 0, ..crate::estimator::presets::default_spec() };
        assert!(matches!(export(&spec), Err(ExportError::Invalid(_))));
    }
}
