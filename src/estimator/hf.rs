//! Hugging Face `config.json` import.
//!
//! Each supported `model_type` is read with its own key names and, for optional keys, the
//! defaults its transformers configuration class defines (transformers 5.24,
//! `models/<type>/configuration_<type>.py`). The keys that size the model — vocabulary, hidden
//! size, layers, heads, intermediate size — must be present: a config without them is not a
//! checkpoint's config, and guessing would give a confident wrong count.

use super::model::{Activation, MlpKind, ModelSpec, NormKind, Positions, QkNorm};
use super::presets::default_spec;
use serde_json::{Map, Value};

/// The `model_type`s the importer reads.
pub const SUPPORTED: &[&str] = &[
    "gpt2",
    "gpt_neox",
    "opt",
    "falcon",
    "phi",
    "phi3",
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "olmo",
    "olmo2",
    "stablelm",
    "starcoder2",
];

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HfError {
    #[error("config.json is not valid JSON: {0}")]
    Json(String),
    #[error("config.json must be a JSON object")]
    NotObject,
    #[error("config.json has no `model_type`")]
    NoModelType,
    #[error("unsupported model_type `{0}` (supported: {list})", list = SUPPORTED.join(", "))]
    Unsupported(String),
    #[error("config.json is missing `{0}`")]
    Missing(&'static str),
    #[error("`{key}` in config.json must be {expected}")]
    Type { key: &'static str, expected: &'static str },
    #[error("config.json describes an impossible model: {0}")]
    Model(String),
}

impl HfError {
    /// The field at fault, if one is.
    pub fn key(&self) -> Option<&'static str> {
        match self {
            HfError::Missing(k) | HfError::Type { key: k, .. } => Some(k),
            HfError::NoModelType | HfError::Unsupported(_) => Some("model_type"),
            _ => None,
        }
    }
}

/// A model read from a config.json.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    pub model_type: String,
    /// `_name_or_path` when the file has one.
    pub name: String,
    pub spec: ModelSpec,
}

struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }
    /// An integer field; `None` when absent or null.
    fn uint(&self, key: &'static str) -> Result<Option<u64>, HfError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 1e15).map(|f| f as u64))
                .map(Some)
                .ok_or(HfError::Type { key, expected: "a non-negative integer" }),
        }
    }
    fn uint_or(&self, key: &'static str, default: u64) -> Result<u64, HfError> {
        Ok(self.uint(key)?.unwrap_or(default))
    }
    /// The first of `keys` present (transformers' attribute_map aliases).
    fn required(&self, keys: &[&'static str]) -> Result<u64, HfError> {
        for k in keys {
            if let Some(v) = self.uint(k)? {
                return Ok(v);
            }
        }
        Err(HfError::Missing(keys[0]))
    }
    fn flag(&self, key: &'static str, default: bool) -> Result<bool, HfError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or(HfError::Type { key, expected: "true or false" }),
        }
    }
    fn float(&self, key: &'static str) -> Result<Option<f64>, HfError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or(HfError::Type { key, expected: "a number" }),
        }
    }
    fn string(&self, key: &'static str) -> Result<Option<&str>, HfError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or(HfError::Type { key, expected: "a string" }),
        }
    }
    /// Rotary fraction from `partial_rotary_factor`, `rotary_pct` or (transformers 5)
    /// `rope_parameters.partial_rotary_factor`, as a percentage.
    fn rotary_pct(&self, default: f64) -> Result<u64, HfError> {
        let mut f = self.float("partial_rotary_factor")?.or(self.float("rotary_pct")?);
        if f.is_none() {
            if let Some(Value::Object(rp)) = self.get("rope_parameters") {
                f = rp.get("partial_rotary_factor").and_then(Value::as_f64);
            }
        }
        let f = f.unwrap_or(default);
        if !(0.0..=1.0).contains(&f) {
            return Err(HfError::Type { key: "partial_rotary_factor", expected: "a fraction between 0 and 1" });
        }
        Ok((f * 100.0).round() as u64)
    }
    fn activation(&self, keys: &[&'static str], default: Activation) -> Result<Activation, HfError> {
        for k in keys {
            if let Some(s) = self.string(k)? {
                return Ok(match s {
                    "silu" | "swish" => Activation::Silu,
                    "gelu" => Activation::Gelu,
                    "gelu_pytorch_tanh" | "gelu_fast" => Activation::GeluTanh,
                    "gelu_new" => Activation::GeluNew,
                    "relu" => Activation::Relu,
                    _ => return Err(HfError::Type { key: k, expected: "one of silu, gelu, gelu_new, gelu_pytorch_tanh, relu" }),
                });
            }
        }
        Ok(default)
    }
    fn list_len(&self, key: &'static str) -> Result<Vec<u64>, HfError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => {
                a.iter().map(|v| v.as_u64().ok_or(HfError::Type { key, expected: "a list of layer indices" })).collect()
            }
            Some(_) => Err(HfError::Type { key, expected: "a list of layer indices" }),
        }
    }
}

/// Parses a config.json text.
pub fn import_json(text: &str) -> Result<Imported, HfError> {
    let v: Value = serde_json::from_str(text).map_err(|e| HfError::Json(e.to_string()))?;
    import_value(&v)
}

/// Reads a parsed config.json.
pub fn import_value(v: &Value) -> Result<Imported, HfError> {
    let obj = v.as_object().ok_or(HfError::NotObject)?;
    let f = Fields(obj);
    let model_type = f.string("model_type")?.ok_or(HfError::NoModelType)?.to_string();
    // Multimodal Gemma-3 checkpoints carry the language model in `text_config`.
    if model_type == "gemma3" {
        if let Some(Value::Object(text)) = obj.get("text_config") {
            let mut t = text.clone();
            t.insert("model_type".into(), Value::String("gemma3_text".into()));
            return import_value(&Value::Object(t)).map(|mut i| {
                i.name = name_of(&f);
                i
            });
        }
    }
    let spec = spec_for(&model_type, &f)?;
    spec.validate().map_err(|e| HfError::Model(e.to_string()))?;
    Ok(Imported { name: name_of(&f), model_type, spec })
}

fn name_of(f: &Fields) -> String {
    f.string("_name_or_path").ok().flatten().unwrap_or_default().chars().take(120).collect()
}

fn spec_for(t: &str, f: &Fields) -> Result<ModelSpec, HfError> {
    let base = default_spec();
    let vocab = f.required(&["vocab_size"])?;
    let mut m = ModelSpec { vocab, ..base };
    match t {
        "llama" | "mistral" | "mixtral" | "qwen2" | "qwen2_moe" | "qwen3" | "qwen3_moe" | "gemma" | "gemma2" | "gemma3_text" | "olmo"
        | "olmo2" | "phi3" => {
            m.hidden = f.required(&["hidden_size"])?;
            m.layers = f.required(&["num_hidden_layers"])?;
            m.heads = f.required(&["num_attention_heads"])?;
            m.kv_heads = f.uint_or("num_key_value_heads", m.heads)?;
            let default_head_dim = if m.heads > 0 { m.hidden / m.heads } else { 0 };
            m.head_dim = f.uint_or("head_dim", default_head_dim)?;
            m.mlp = MlpKind::Gated;
            m.norm = NormKind::Rmsnorm;
            m.layer_norms = 2;
            m.positions = Positions::Rope;
            m.rotary_pct = 100;
            m.act = f.activation(&["hidden_act", "hidden_activation"], Activation::Silu)?;
            let moe = matches!(t, "mixtral" | "qwen2_moe" | "qwen3_moe");
            m.ffn = if moe { f.uint("intermediate_size")?.unwrap_or(0) } else { f.required(&["intermediate_size"])? };
            m.tied = f.flag("tie_word_embeddings", matches!(t, "gemma" | "gemma2" | "gemma3_text"))?;
            m.max_pos = f.uint_or("max_position_embeddings", default_max_pos(t))?;
            let attention_bias = f.flag("attention_bias", false)?;
            m.qkv_bias = attention_bias;
            m.o_bias = attention_bias;
            m.mlp_bias = f.flag("mlp_bias", false)?;
            match t {
                "qwen2" => {
                    m.qkv_bias = true;
                    m.o_bias = false;
                }
                "qwen2_moe" => {
                    m.qkv_bias = f.flag("qkv_bias", true)?;
                    m.o_bias = false;
                }
                "gemma2" => {
                    m.norm = NormKind::RmsnormGemma;
                    m.layer_norms = 4;
                    m.softcap = f.float("attn_logit_softcapping")?.is_some() || f.float("final_logit_softcapping")?.is_some();
                    m.act = f.activation(&["hidden_activation", "hidden_act"], Activation::GeluTanh)?;
                }
                "gemma3_text" => {
                    m.norm = NormKind::RmsnormGemma;
                    m.layer_norms = 4;
                    m.qk_norm = QkNorm::Head;
                    m.softcap = f.float("attn_logit_softcapping")?.is_some() || f.float("final_logit_softcapping")?.is_some();
                    m.act = f.activation(&["hidden_activation", "hidden_act"], Activation::GeluTanh)?;
                }
                "gemma" => {
                    m.norm = NormKind::RmsnormGemma;
                    m.act = f.activation(&["hidden_activation", "hidden_act"], Activation::GeluTanh)?;
                }
                "qwen3" | "qwen3_moe" => m.qk_norm = QkNorm::Head,
                "olmo" => m.norm = NormKind::Nonparametric,
                "olmo2" => m.qk_norm = QkNorm::Full,
                "phi3" => {
                    m.resid_dropout = true;
                    m.fused_qkv = true;
                    m.fused_gate_up = true;
                    m.rotary_pct = f.rotary_pct(1.0)?;
                }
                _ => {}
            }
            if moe {
                m.fused_experts = true;
                m.experts = f.required(&["num_local_experts", "num_experts"])?;
                m.top_k = f.required(&["num_experts_per_tok"])?;
                m.expert_ffn = if t == "mixtral" { f.required(&["intermediate_size"])? } else { f.required(&["moe_intermediate_size"])? };
                if t != "mixtral" {
                    // A layer is sparse unless listed in mlp_only_layers, and only every
                    // decoder_sparse_step-th layer is (modeling_qwen2_moe.py, DecoderLayer).
                    let step = f.uint_or("decoder_sparse_step", 1)?;
                    let dense_only = f.list_len("mlp_only_layers")?;
                    let sparse = (0..m.layers).filter(|i| !dense_only.contains(i) && step > 0 && (i + 1) % step == 0).count() as u64;
                    m.dense_layers = m.layers - sparse;
                    if m.dense_layers > 0 && m.ffn == 0 {
                        return Err(HfError::Missing("intermediate_size"));
                    }
                }
                if t == "qwen2_moe" {
                    m.shared_experts = 1;
                    m.shared_ffn = f.required(&["shared_expert_intermediate_size"])?;
                    m.shared_gate = true;
                }
            }
        }
        "gpt2" => {
            m.hidden = f.required(&["n_embd", "hidden_size"])?;
            m.layers = f.required(&["n_layer", "num_hidden_layers"])?;
            m.heads = f.required(&["n_head", "num_attention_heads"])?;
            m.kv_heads = m.heads;
            m.head_dim = m.hidden / m.heads.max(1);
            m.ffn = f.uint("n_inner")?.unwrap_or(4 * m.hidden);
            m.mlp = MlpKind::Plain;
            m.act = f.activation(&["activation_function"], Activation::GeluNew)?;
            m.norm = NormKind::Layernorm;
            m.qkv_bias = true;
            m.o_bias = true;
            m.mlp_bias = true;
            m.tied = f.flag("tie_word_embeddings", true)?;
            m.positions = Positions::Learned;
            m.max_pos = f.uint_or("n_positions", 1024)?;
            m.rotary_pct = 0;
            m.fused_qkv = true;
            m.softmax_fp32 = false;
            m.resid_dropout = true;
            m.embed_dropout = true;
        }
        "gpt_neox" => {
            m.resid_dropout = true;
            m.embed_dropout = true;
            m.hidden = f.required(&["hidden_size"])?;
            m.layers = f.required(&["num_hidden_layers"])?;
            m.heads = f.required(&["num_attention_heads"])?;
            m.kv_heads = m.heads;
            m.head_dim = m.hidden / m.heads.max(1);
            m.ffn = f.required(&["intermediate_size"])?;
            m.mlp = MlpKind::Plain;
            m.act = f.activation(&["hidden_act"], Activation::Gelu)?;
            m.norm = NormKind::Layernorm;
            let bias = f.flag("attention_bias", true)?;
            m.qkv_bias = bias;
            m.o_bias = bias;
            m.mlp_bias = true;
            m.tied = f.flag("tie_word_embeddings", false)?;
            m.max_pos = f.uint_or("max_position_embeddings", 2048)?;
            m.rotary_pct = f.rotary_pct(0.25)?;
            m.parallel = f.flag("use_parallel_residual", true)?;
            m.fused_qkv = true;
        }
        "opt" => {
            m.resid_dropout = true;
            m.embed_dropout = true;
            m.hidden = f.required(&["hidden_size"])?;
            m.layers = f.required(&["num_hidden_layers"])?;
            m.heads = f.required(&["num_attention_heads"])?;
            m.kv_heads = m.heads;
            m.head_dim = m.hidden / m.heads.max(1);
            m.ffn = f.required(&["ffn_dim"])?;
            m.mlp = MlpKind::Plain;
            m.act = f.activation(&["activation_function"], Activation::Relu)?;
            let affine = f.flag("layer_norm_elementwise_affine", true)?;
            let bias = f.flag("enable_bias", true)?;
            m.norm = match (affine, bias) {
                (false, _) => NormKind::Nonparametric,
                (true, true) => NormKind::Layernorm,
                (true, false) => NormKind::LayernormNoBias,
            };
            m.qkv_bias = bias;
            m.o_bias = bias;
            m.mlp_bias = bias;
            m.tied = f.flag("tie_word_embeddings", true)?;
            m.positions = Positions::Learned;
            m.max_pos = f.uint_or("max_position_embeddings", 2048)?;
            // OPTLearnedPositionalEmbedding keeps 2 extra rows (modeling_opt.py, offset = 2).
            m.pos_offset = 2;
            m.rotary_pct = 0;
            let proj = f.uint_or("word_embed_proj_dim", m.hidden)?;
            m.embed_proj = if proj != m.hidden { proj } else { 0 };
            // Post-norm OPT (350m) removes the decoder's final layer norm.
            m.final_norm = f.flag("do_layer_norm_before", true)? && !f.flag("_remove_final_layer_norm", false)?;
        }
        "falcon" => {
            m.resid_dropout = true;
            m.hidden = f.required(&["hidden_size"])?;
            m.layers = f.required(&["num_hidden_layers", "n_layer"])?;
            m.heads = f.required(&["num_attention_heads", "n_head"])?;
            m.head_dim = m.hidden / m.heads.max(1);
            let new_arch = f.flag("new_decoder_architecture", false)?;
            let multi_query = f.flag("multi_query", true)?;
            m.kv_heads = if new_arch {
                f.uint_or("num_kv_heads", m.heads)?
            } else if multi_query {
                1
            } else {
                m.heads
            };
            m.ffn = f.uint("ffn_hidden_size")?.unwrap_or(4 * m.hidden);
            m.mlp = MlpKind::Plain;
            m.act = f.activation(&["activation"], Activation::Gelu)?;
            m.norm = NormKind::Layernorm;
            let bias = f.flag("bias", false)?;
            m.qkv_bias = bias;
            m.o_bias = bias;
            m.mlp_bias = bias;
            m.tied = f.flag("tie_word_embeddings", true)?;
            m.max_pos = f.uint_or("max_position_embeddings", 2048)?;
            m.positions = if f.flag("alibi", false)? { Positions::None } else { Positions::Rope };
            let parallel = f.flag("parallel_attn", true)?;
            m.parallel = parallel || new_arch;
            m.layer_norms = if new_arch {
                f.uint_or("num_ln_in_parallel_attn", 2)?
            } else if parallel {
                1
            } else {
                2
            };
            m.fused_qkv = true;
        }
        "phi" => {
            m.resid_dropout = true;
            m.embed_dropout = true;
            m.hidden = f.required(&["hidden_size"])?;
            m.layers = f.required(&["num_hidden_layers"])?;
            m.heads = f.required(&["num_attention_heads"])?;
            m.kv_heads = f.uint_or("num_key_value_heads", m.heads)?;
            m.head_dim = m.hidden / m.heads.max(1);
            m.ffn = f.required(&["intermediate_size"])?;
            m.mlp = MlpKind::Plain;
            m.act = f.activation(&["hidden_act"], Activation::GeluNew)?;
            m.norm = NormKind::Layernorm;
            m.layer_norms = 1;
            m.parallel = true;
            m.qkv_bias = true;
            m.o_bias = true;
            m.mlp_bias = true;
            m.head_bias = true;
            m.tied = f.flag("tie_word_embeddings", false)?;
            m.max_pos = f.uint_or("max_position_embeddings", 2048)?;
            m.rotary_pct = f.rotary_pct(0.5)?;
            if f.flag("qk_layernorm", false)? {
                m.qk_norm = QkNorm::Head;
            }
        }
        "stablelm" => {
            m.resid_dropout = true;
            m.hidden = f.required(&["hidden_size"])?;
            m.layers = f.required(&["num_hidden_layers"])?;
            m.heads = f.required(&["num_attention_heads"])?;
            m.kv_heads = f.uint_or("num_key_value_heads", m.heads)?;
            m.head_dim = m.hidden / m.heads.max(1);
            m.ffn = f.required(&["intermediate_size"])?;
            m.mlp = MlpKind::Gated;
            m.act = f.activation(&["hidden_act"], Activation::Silu)?;
            m.norm = NormKind::Layernorm;
            m.qkv_bias = f.flag("use_qkv_bias", false)?;
            m.tied = f.flag("tie_word_embeddings", false)?;
            m.max_pos = f.uint_or("max_position_embeddings", 4096)?;
            m.rotary_pct = f.rotary_pct(0.25)?;
            m.parallel = f.flag("use_parallel_residual", false)?;
            m.layer_norms = if m.parallel { 1 } else { 2 };
            if f.flag("qk_layernorm", false)? {
                m.qk_norm = QkNorm::PerHead;
            }
        }
        "starcoder2" => {
            m.resid_dropout = true;
            m.embed_dropout = true;
            m.hidden = f.required(&["hidden_size"])?;
            m.layers = f.required(&["num_hidden_layers"])?;
            m.heads = f.required(&["num_attention_heads"])?;
            m.kv_heads = f.uint_or("num_key_value_heads", 2)?;
            m.head_dim = m.hidden / m.heads.max(1);
            m.ffn = f.required(&["intermediate_size"])?;
            m.mlp = MlpKind::Plain;
            m.act = f.activation(&["hidden_act"], Activation::GeluTanh)?;
            m.norm = NormKind::Layernorm;
            let bias = f.flag("use_bias", true)?;
            m.qkv_bias = bias;
            m.o_bias = bias;
            m.mlp_bias = bias;
            m.tied = f.flag("tie_word_embeddings", true)?;
            m.max_pos = f.uint_or("max_position_embeddings", 4096)?;
        }
        other => return Err(HfError::Unsupported(other.to_string())),
    }
    if m.heads == 0 {
        return Err(HfError::Model("`num_attention_heads` must be at least 1".into()));
    }
    Ok(m)
}

fn default_max_pos(t: &str) -> u64 {
    match t {
        "mistral" | "mixtral" => 131_072,
        "qwen2" | "qwen2_moe" | "qwen3" | "qwen3_moe" => 32_768,
        "gemma" | "gemma2" => 8192,
        "gemma3_text" => 131_072,
        "phi3" => 4096,
        _ => 2048,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_llama_config_counts_like_the_preset() {
        let json = r#"{"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "max_position_embeddings": 131072}"#;
        let m = import_json(json).map(|i| i.spec.counts().total);
        assert_eq!(m, Ok(8_030_261_248));
    }

    #[test]
    fn an_unknown_model_type_is_named() {
        let err = import_json(r#"{"model_type": "bert", "vocab_size": 3}"#).err();
        assert_eq!(err.as_ref().and_then(HfError::key), Some("model_type"));
        assert!(err.map(|e| e.to_string()).is_some_and(|s| s.contains("`bert`")));
    }

    #[test]
    fn a_missing_size_field_is_named_not_guessed() {
        let err = import_json(
            r#"{"model_type": "llama", "vocab_size": 32000, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 8}"#,
        )
        .err();
        assert_eq!(err, Some(HfError::Missing("hidden_size")));
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named() {
        let err = import_json(r#"{"model_type": "llama", "vocab_size": "many"}"#).err();
        assert_eq!(err.as_ref().and_then(HfError::key), Some("vocab_size"));
    }

    #[test]
    fn bad_json_is_a_clear_error() {
        assert!(matches!(import_json("{not json"), Err(HfError::Json(_))));
        assert_eq!(import_json("[1, 2]"), Err(HfError::NotObject));
    }
}
