//! Hugging Face `config.json` import.
//!
//! Each supported `model_type` is read with its own key names and, for optional keys, the
//! defaults its transformers configuration class defines (transformers 5.24,
//! `models/<type>/configuration_<type>.py`). For the families trainmem accepted before 2026 the
//! keys that size the model — vocabulary, hidden size, layers, heads, intermediate size — must be
//! present: a config without them is not a checkpoint's config, and guessing would give a
//! confident wrong count. The 2026 families (and Gemma 3's text model, whose multimodal
//! checkpoints ship a sparse `text_config`) take their class's defaults for absent keys, exactly
//! as transformers builds them, and the import says which sizes came from defaults.
//!
//! What the import assumes or leaves out is said in [`Imported::notes`]; what it cannot represent
//! exactly is refused with an error that names the model type or key.

use super::family::Family;
use super::model::{Activation, LayerRule, MlpKind, ModelSpec, NormKind, Positions, QkNorm, Router, WindowKind};
use super::presets::default_spec;
use serde_json::{Map, Value};
use std::cell::RefCell;

/// The `model_type`s the importer reads (multimodal wrappers included: their language model).
pub const SUPPORTED: &[&str] = &[
    "gpt2",
    "gpt_neox",
    "opt",
    "falcon",
    "phi",
    "phi3",
    "llama",
    "llama4",
    "llama4_text",
    "mistral",
    "mistral3",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "olmo",
    "olmo2",
    "stablelm",
    "starcoder2",
    "deepseek_v2",
    "deepseek_v3",
    "kimi_k2",
    "gpt_oss",
    "glm4_moe",
    "smollm3",
    "falcon_h1",
];

/// Multimodal checkpoints whose language model (`text_config`) is imported, with the text model
/// type their `text_config` defaults to. The vision tower and projector are not counted, and the
/// import says so.
pub const MULTIMODAL: &[(&str, &str)] = &[("llama4", "llama4_text"), ("gemma3", "gemma3_text"), ("mistral3", "mistral")];

/// Model types refused on purpose, with the reason.
pub const REFUSED: &[(&str, &str)] = &[(
    "qwen3_next",
    "its layers alternate gated DeltaNet linear attention (a recurrent state and causal convolutions in place of an \
     attention matrix) with gated full attention, and trainmem does not model the DeltaNet layers' activations, so it \
     could not account for them exactly",
)];

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
    #[error("model_type `{model_type}` is not supported: {reason}")]
    Refused { model_type: String, reason: &'static str },
    #[error("config.json is missing `{0}`")]
    Missing(&'static str),
    #[error("`{key}` in config.json must be {expected}")]
    Type { key: &'static str, expected: &'static str },
    #[error("`{key}` in config.json: {reason}")]
    Field { key: &'static str, reason: String },
    #[error("config.json describes an impossible model: {0}")]
    Model(String),
}

impl HfError {
    /// The field at fault, if one is.
    pub fn key(&self) -> Option<&'static str> {
        match self {
            HfError::Missing(k) | HfError::Type { key: k, .. } | HfError::Field { key: k, .. } => Some(k),
            HfError::NoModelType | HfError::Unsupported(_) | HfError::Refused { .. } => Some("model_type"),
            _ => None,
        }
    }
}

/// A model read from a config.json.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// The file's `model_type` (the wrapper's, for a multimodal checkpoint).
    pub model_type: String,
    /// `_name_or_path` when the file has one.
    pub name: String,
    pub spec: ModelSpec,
    /// What the import assumed or left out, one sentence each: a multimodal checkpoint's vision
    /// tower not counted, multi-token-prediction layers that transformers does not build, the
    /// quantized checkpoint format versus the training dtype, sizes taken from class defaults.
    pub notes: Vec<String>,
}

impl Imported {
    /// One line for the page or the CLI: the model, its count and every note.
    pub fn summary(&self) -> String {
        let name = if self.name.is_empty() { "config.json" } else { &self.name };
        let mut s = format!("imported {name} ({}): {} parameters", self.model_type, self.spec.counts().total);
        for n in &self.notes {
            s.push_str(". ");
            s.push_str(n);
        }
        s
    }
}

/// One flag per layer (local attention or not) and the kind of the local layers.
type LocalLayers = (Vec<bool>, Option<WindowKind>);

struct Fields<'a> {
    map: &'a Map<String, Value>,
    /// Sizing keys that were absent and took the configuration class's default.
    defaulted: RefCell<Vec<&'static str>>,
}

impl<'a> Fields<'a> {
    fn new(map: &'a Map<String, Value>) -> Fields<'a> {
        Fields { map, defaulted: RefCell::new(Vec::new()) }
    }
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }
    /// Whether the key is present with an explicit `null`.
    fn is_null(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(Value::is_null)
    }
    /// A sizing key with its configuration class's default when absent (recorded for the note).
    fn size(&self, key: &'static str, default: u64) -> Result<u64, HfError> {
        match self.uint(key)? {
            Some(v) => Ok(v),
            None => {
                self.defaulted.borrow_mut().push(key);
                Ok(default)
            }
        }
    }
    /// The first present of `keys` (transformers' attribute_map aliases), else the default.
    fn size_any(&self, keys: &[&'static str], default: u64) -> Result<u64, HfError> {
        for k in keys {
            if let Some(v) = self.uint(k)? {
                return Ok(v);
            }
        }
        self.size(keys[0], default)
    }
    /// A layer list of 0/1 flags (`no_rope_layers`); empty when absent or `[]`.
    fn flags(&self, key: &'static str) -> Result<Vec<bool>, HfError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| match v {
                    Value::Bool(b) => Some(*b),
                    v => v.as_u64().filter(|&n| n <= 1).map(|n| n == 1),
                })
                .collect::<Option<Vec<bool>>>()
                .ok_or(HfError::Type { key, expected: "a list of 0/1 layer flags" }),
            Some(_) => Err(HfError::Type { key, expected: "a list of 0/1 layer flags" }),
        }
    }
    /// `layer_types` as window flags: `sliding_attention`/`chunked_attention` layers are local.
    fn layer_types(&self, layers: u64) -> Result<Option<LocalLayers>, HfError> {
        const KEY: &str = "layer_types";
        let Some(v) = self.get(KEY) else { return Ok(None) };
        let items = v.as_array().ok_or(HfError::Type { key: KEY, expected: "a list of attention types" })?;
        if items.len() as u64 != layers {
            return Err(HfError::Field { key: KEY, reason: format!("lists {} layers for {} num_hidden_layers", items.len(), layers) });
        }
        let mut kind = None;
        let mut flags = Vec::with_capacity(items.len());
        for item in items {
            let local = match item.as_str() {
                Some("full_attention") => None,
                Some("sliding_attention") => Some(WindowKind::Sliding),
                Some("chunked_attention") => Some(WindowKind::Chunked),
                Some(other) => {
                    return Err(HfError::Field {
                        key: KEY,
                        reason: format!(
                            "layer type `{other}` is not modelled (full_attention, sliding_attention and chunked_attention are)"
                        ),
                    })
                }
                None => return Err(HfError::Type { key: KEY, expected: "a list of attention types" }),
            };
            if let Some(k) = local {
                if kind.is_some_and(|prev| prev != k) {
                    return Err(HfError::Field { key: KEY, reason: "mixes sliding and chunked layers, which is not modelled".into() });
                }
                kind = Some(k);
            }
            flags.push(local.is_some());
        }
        Ok(Some((flags, kind)))
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
    let f = Fields::new(obj);
    let model_type = f.string("model_type")?.ok_or(HfError::NoModelType)?.to_string();
    if let Some((_, reason)) = REFUSED.iter().find(|(t, _)| *t == model_type) {
        return Err(HfError::Refused { model_type, reason });
    }
    if let Some((_, text_type)) = MULTIMODAL.iter().find(|(t, _)| *t == model_type) {
        return import_multimodal(&f, &model_type, text_type);
    }
    let mut notes = Vec::new();
    let mut spec = spec_for(&model_type, &f, &mut notes)?;
    // The family is the model type's: decided here, once (Kimi K2 is DeepSeek-V3's code).
    let text_type = if model_type == "kimi_k2" { "deepseek_v3" } else { model_type.as_str() };
    spec.family = Family::from_model_type(text_type).ok_or_else(|| HfError::Unsupported(model_type.clone()))?;
    spec.validate().map_err(|e| HfError::Model(e.to_string()))?;
    notes.extend(defaults_note(&model_type, &f));
    notes.extend(quantization_note(&model_type, &f)?);
    Ok(Imported { name: name_of(&f), model_type, spec, notes })
}

/// A multimodal checkpoint: its `text_config` imported as a model of its own, and notes naming
/// what is not counted.
fn import_multimodal(f: &Fields, wrapper: &str, text_type: &str) -> Result<Imported, HfError> {
    let Some(Value::Object(text)) = f.map.get("text_config") else {
        return Err(HfError::Missing("text_config"));
    };
    let mut t = text.clone();
    let inner = t.get("model_type").and_then(Value::as_str).unwrap_or(text_type).to_string();
    t.insert("model_type".into(), Value::String(inner.clone()));
    let mut imported = import_value(&Value::Object(t))?;
    let tower = match f.map.get("vision_config") {
        Some(Value::Object(v)) => {
            let kind = v.get("model_type").and_then(Value::as_str).unwrap_or("vision model");
            match (v.get("num_hidden_layers").and_then(Value::as_u64), v.get("hidden_size").and_then(Value::as_u64)) {
                (Some(l), Some(h)) => format!("the vision tower ({kind}, {l} layers of width {h})"),
                _ => format!("the vision tower ({kind})"),
            }
        }
        _ => "the vision tower".to_string(),
    };
    let mut notes = vec![format!(
        "`{wrapper}` is a multimodal checkpoint: only its language model (`{inner}` from text_config) is counted; \
         {tower} and the multimodal projector are not"
    )];
    // transformers 5.24 ties a wrapper's LM head by the top-level `tie_word_embeddings` (class
    // default true for Gemma3Config and Mistral3Config; Llama4ForConditionalGeneration never
    // ties), not by the text config's.
    let wrapper_ties = wrapper != "llama4" && f.flag("tie_word_embeddings", true)?;
    if wrapper_ties != imported.spec.tied {
        notes.push(format!(
            "transformers 5.24 builds `{wrapper}`'s wrapper class with the LM head {} (the top-level `tie_word_embeddings`), \
             unlike its text model; the text model's own layout ({}) is counted, as its checkpoint stores it",
            if wrapper_ties { "tied to the embedding" } else { "untied" },
            if imported.spec.tied { "tied" } else { "a separate lm_head" }
        ));
    }
    notes.append(&mut imported.notes);
    notes.extend(quantization_note(wrapper, f)?);
    imported.notes = notes;
    imported.model_type = wrapper.to_string();
    let outer = name_of(f);
    if !outer.is_empty() {
        imported.name = outer;
    }
    Ok(imported)
}

/// Which sizes came from the configuration class's defaults, if any.
fn defaults_note(model_type: &str, f: &Fields) -> Option<String> {
    let d = f.defaulted.borrow();
    (!d.is_empty()).then(|| {
        format!(
            "absent from config.json, {} took the transformers 5.24 `{model_type}` configuration class's defaults",
            d.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
        )
    })
}

/// A quantized checkpoint: what the count and the training dtype assume.
fn quantization_note(model_type: &str, f: &Fields) -> Result<Option<String>, HfError> {
    let Some(q) = f.get("quantization_config") else { return Ok(None) };
    let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("an unnamed method");
    Ok(Some(if method == "mxfp4" {
        format!(
            "the `{model_type}` checkpoint stores its experts in MXFP4 (4-bit blocks with shared scales); trainmem assumes \
             training from the dequantized weights (transformers' Mxfp4Config(dequantize=True)) in the recipe's dtype, \
             e.g. bf16, and counts the dequantized parameters"
        )
    } else {
        format!(
            "the checkpoint is stored quantized ({method}); trainmem counts its parameters and assumes training from \
             dequantized weights in the recipe's dtype (QLoRA quantizes the base itself)"
        )
    }))
}

fn name_of(f: &Fields) -> String {
    f.string("_name_or_path").ok().flatten().unwrap_or_default().chars().take(120).collect()
}

/// Sizes of a Llama-style decoder and its configuration class's defaults for absent keys.
struct Dims {
    vocab: u64,
    hidden: u64,
    layers: u64,
    heads: u64,
    /// `None`: as many as query heads.
    kv_heads: Option<u64>,
    /// `None`: hidden / heads (modeling's `getattr(config, "head_dim", h // a)`).
    head_dim: Option<u64>,
    ffn: u64,
    max_pos: u64,
    tied: bool,
}

/// A Llama-style decoder (RMSNorm, gated SiLU MLP, rotary) read with a class's defaults.
fn llama_like(f: &Fields, d: Dims) -> Result<ModelSpec, HfError> {
    let mut m = default_spec();
    m.vocab = f.size("vocab_size", d.vocab)?;
    m.hidden = f.size("hidden_size", d.hidden)?;
    m.layers = f.size("num_hidden_layers", d.layers)?;
    m.heads = f.size("num_attention_heads", d.heads)?;
    check_layers(m.layers)?;
    if m.heads == 0 {
        return Err(HfError::Model("`num_attention_heads` must be at least 1".into()));
    }
    m.kv_heads = f.uint("num_key_value_heads")?.unwrap_or(d.kv_heads.unwrap_or(m.heads));
    m.head_dim = f.uint("head_dim")?.unwrap_or(d.head_dim.unwrap_or(m.hidden / m.heads));
    m.ffn = f.size("intermediate_size", d.ffn)?;
    m.max_pos = f.uint_or("max_position_embeddings", d.max_pos)?;
    m.tied = f.flag("tie_word_embeddings", d.tied)?;
    m.act = f.activation(&["hidden_act"], Activation::Silu)?;
    m.mlp = MlpKind::Gated;
    m.norm = NormKind::Rmsnorm;
    m.layer_norms = 2;
    m.positions = Positions::Rope;
    m.rotary_pct = 100;
    Ok(m)
}

/// Per-layer rules are built from one flag per layer: refuse absurd layer counts before that
/// (the model's own validation would refuse them afterwards anyway).
fn check_layers(layers: u64) -> Result<(), HfError> {
    const MAX_LAYERS: u64 = 1 << 14;
    if layers > MAX_LAYERS {
        return Err(HfError::Model(format!("`num_hidden_layers` {layers} is beyond the supported {MAX_LAYERS}")));
    }
    Ok(())
}

/// Local attention: `layer_types` when the file lists them, else the class's default rule; no
/// local layer when the window key is null (the modeling code then passes `sliding_window=None`).
fn set_window(
    m: &mut ModelSpec,
    f: &Fields,
    key: &'static str,
    default_window: Option<u64>,
    default: (LayerRule, WindowKind),
) -> Result<(), HfError> {
    let window = if f.is_null(key) { None } else { f.uint(key)?.or(default_window) };
    let (rule, kind) = match f.layer_types(m.layers)? {
        Some((flags, kind)) => (LayerRule::from_flags(&flags), kind.unwrap_or(default.1)),
        None => default,
    };
    match window {
        Some(w) if w > 0 && rule.count(m.layers) > 0 => {
            m.window_layers = rule;
            m.window_kind = kind;
            m.window = w;
        }
        _ => {
            m.window_layers = LayerRule::None;
            m.window = 0;
        }
    }
    Ok(())
}

/// The multi-token-prediction layers a checkpoint carries beyond `num_hidden_layers`.
fn mtp_note(f: &Fields, class: &str) -> Result<Option<String>, HfError> {
    Ok(f.uint("num_nextn_predict_layers")?.filter(|&n| n > 0).map(|n| {
        format!(
            "the checkpoint's {n} multi-token-prediction layer{} (`num_nextn_predict_layers`) {} not built by transformers' \
             {class} and {} not counted",
            if n == 1 { "" } else { "s" },
            if n == 1 { "is" } else { "are" },
            if n == 1 { "is" } else { "are" }
        )
    }))
}

/// DeepSeek-V2/V3 (and Kimi K2, DeepSeek-V3's architecture): MLA attention, `first_k_dense_replace`
/// dense layers, then MoE layers of routed and shared experts (configuration_deepseek_v3.py,
/// configuration_deepseek_v2.py; modeling_deepseek_v3.py `DeepseekV3DecoderLayer`, `DeepseekV3MoE`).
fn deepseek(t: &str, f: &Fields, notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
    let v3 = t != "deepseek_v2";
    let d = |v2: u64, v3v: u64| if v3 { v3v } else { v2 };
    let mut m = llama_like(
        f,
        Dims {
            vocab: d(102_400, 129_280),
            hidden: d(4096, 7168),
            layers: d(32, 61),
            heads: d(32, 128),
            kv_heads: None,
            head_dim: None,
            ffn: d(11_008, 18_432),
            max_pos: d(2048, 4096),
            tied: false,
        },
    )?;
    if let Some(kv) = f.uint("num_key_value_heads")? {
        if kv != m.heads {
            return Err(HfError::Field {
                key: "num_key_value_heads",
                reason: format!(
                    "{kv} differs from the {} attention heads; transformers' MLA expands keys and values for every head, so \
                     only equal counts build",
                    m.heads
                ),
            });
        }
    }
    m.kv_heads = m.heads;
    m.kv_lora_rank = f.size("kv_lora_rank", 512)?;
    // `q_lora_rank: null` (DeepSeek-V2-Lite) means a plain q_proj; absent means the default 1536.
    m.q_lora_rank = if f.is_null("q_lora_rank") { 0 } else { f.size("q_lora_rank", 1536)? };
    m.qk_rope_dim = f.size("qk_rope_head_dim", 64)?;
    m.head_dim = f.size("qk_nope_head_dim", 128)?.saturating_add(m.qk_rope_dim);
    m.v_head_dim = f.size("v_head_dim", 128)?;
    let attention_bias = f.flag("attention_bias", false)?;
    m.qkv_bias = attention_bias;
    m.o_bias = attention_bias;
    // DeepseekV2MLP takes `mlp_bias`; DeepseekV3MLP has none.
    m.mlp_bias = !v3 && f.flag("mlp_bias", false)?;
    m.experts = f.size_any(&["n_routed_experts", "num_local_experts", "num_experts"], d(64, 256))?;
    m.top_k = match f.uint("num_experts_per_tok")? {
        Some(k) => k,
        None if v3 => 8,
        None => return Err(HfError::Missing("num_experts_per_tok")),
    };
    m.expert_ffn = f.size("moe_intermediate_size", d(1407, 2048))?;
    m.shared_experts = f.uint_or("n_shared_experts", d(2, 1))?;
    m.shared_ffn = m.expert_ffn;
    m.dense_layers = f.uint_or("first_k_dense_replace", d(0, 3))?.min(m.layers);
    m.fused_experts = true;
    m.router_fp32 = true;
    if let Some(freq) = f.uint("moe_layer_freq")? {
        if freq != 1 {
            return Err(HfError::Field {
                key: "moe_layer_freq",
                reason: format!(
                    "{freq}: transformers' DeepSeek classes put an MoE block on every layer from first_k_dense_replace on and \
                     ignore this key, so they cannot build such a checkpoint"
                ),
            });
        }
    }
    if v3 {
        m.router = Router::Sigmoid;
        m.router_groups = f.uint_or("n_group", 8)?;
        m.router_group_topk = f.uint_or("topk_group", 4)?;
    } else {
        m.router = Router::Softmax;
        if f.string("topk_method")? == Some("group_limited_greedy") {
            m.router_groups = f.uint("n_group")?.ok_or(HfError::Missing("n_group"))?;
            m.router_group_topk = f.uint("topk_group")?.ok_or(HfError::Missing("topk_group"))?;
        }
    }
    if t == "kimi_k2" {
        notes.push(
            "model_type `kimi_k2` is DeepSeek-V3's architecture (its config names DeepseekV3ForCausalLM); it is read as \
             `deepseek_v3`, as transformers reads Kimi K2.5's text model"
                .into(),
        );
    }
    notes.extend(mtp_note(f, if v3 { "DeepseekV3ForCausalLM" } else { "DeepseekV2ForCausalLM" })?);
    Ok(m)
}

/// gpt-oss (configuration_gpt_oss.py, modeling_gpt_oss.py): biased q/k/v/o, attention sinks,
/// alternating sliding (128) and full layers, every layer MoE with biased experts stored
/// `[E, h, 2f]`/`[E, f, h]`, a biased router whose top-k logits are softmaxed, clamped SwiGLU.
fn gpt_oss(f: &Fields) -> Result<ModelSpec, HfError> {
    let mut m = llama_like(
        f,
        Dims {
            vocab: 201_088,
            hidden: 2880,
            layers: 36,
            heads: 64,
            kv_heads: Some(8),
            head_dim: Some(64),
            ffn: 2880,
            max_pos: 131_072,
            tied: false,
        },
    )?;
    m.expert_ffn = m.ffn;
    m.ffn = 0;
    m.act = Activation::SwigluClamped;
    m.experts = f.size_any(&["num_local_experts", "num_experts"], 128)?;
    m.top_k = f.uint_or("num_experts_per_tok", 4)?;
    m.fused_experts = true;
    m.experts_in_out = true;
    m.expert_bias = true;
    m.router = Router::TopkSoftmax;
    m.router_bias = true;
    m.attn_sinks = true;
    let bias = f.flag("attention_bias", true)?;
    m.qkv_bias = bias;
    m.o_bias = bias;
    // Default layer_types: sliding_attention where (i + 1) % 2 != 0, i.e. the even layers.
    set_window(&mut m, f, "sliding_window", Some(128), (LayerRule::Every { step: 2, offset: 0 }, WindowKind::Sliding))?;
    Ok(m)
}

/// Llama 4's text model (configuration_llama4.py `Llama4TextConfig`, modeling_llama4.py).
fn llama4_text(f: &Fields) -> Result<ModelSpec, HfError> {
    let mut m = llama_like(
        f,
        Dims {
            vocab: 202_048,
            hidden: 5120,
            layers: 48,
            heads: 40,
            kv_heads: Some(8),
            head_dim: Some(128),
            ffn: 8192,
            max_pos: 131_072,
            tied: false,
        },
    )?;
    let l = m.layers as usize;
    // Routed experts and the shared expert use `intermediate_size`; dense layers
    // `intermediate_size_mlp` (`Llama4TextDecoderLayer`).
    m.expert_ffn = m.ffn;
    m.shared_experts = 1;
    m.shared_ffn = m.ffn;
    m.ffn = f.size("intermediate_size_mlp", 16_384)?;
    m.experts = f.size("num_local_experts", 16)?;
    m.top_k = f.uint_or("num_experts_per_tok", 1)?;
    m.fused_experts = true;
    m.experts_in_out = true;
    m.moe_all_experts = true;
    m.router = Router::TopkSigmoid;
    let bias = f.flag("attention_bias", false)?;
    m.qkv_bias = bias;
    m.o_bias = bias;
    // MoE layers: `moe_layers` as listed, else every `interleave_moe_layer_step`-th from step − 1.
    m.moe_rule = match f.get("moe_layers") {
        Some(_) => {
            let listed = f.list_len("moe_layers")?;
            LayerRule::from_flags(&(0..m.layers).map(|i| listed.contains(&i)).collect::<Vec<_>>())
        }
        None => {
            let step = f.uint_or("interleave_moe_layer_step", 1)?;
            if step == 0 {
                return Err(HfError::Field { key: "interleave_moe_layer_step", reason: "must be at least 1".into() });
            }
            LayerRule::from_flags(&(0..m.layers).map(|i| i % step == step - 1).collect::<Vec<_>>())
        }
    };
    // `no_rope_layers[i]` is 1 where layer i uses RoPE; empty or absent: every
    // `no_rope_layer_interval`-th layer is NoPE.
    let rope = rope_flags(f, l)?;
    m.nope_layers = LayerRule::from_flags(&rope.iter().map(|r| !r).collect::<Vec<_>>());
    m.qk_l2_norm = f.flag("use_qk_norm", true)?;
    // Default layer_types: chunked_attention on the RoPE layers when attention_chunk_size is set.
    let rope_rule = LayerRule::from_flags(&rope);
    set_window(&mut m, f, "attention_chunk_size", Some(8192), (rope_rule, WindowKind::Chunked))?;
    Ok(m)
}

/// `no_rope_layers` flags (1 = RoPE), or the default every-`no_rope_layer_interval`-th NoPE.
fn rope_flags(f: &Fields, layers: usize) -> Result<Vec<bool>, HfError> {
    let listed = f.flags("no_rope_layers")?;
    if !listed.is_empty() {
        if listed.len() != layers {
            return Err(HfError::Field {
                key: "no_rope_layers",
                reason: format!("lists {} layers for {layers} num_hidden_layers", listed.len()),
            });
        }
        return Ok(listed);
    }
    let every = f.uint_or("no_rope_layer_interval", 4)?;
    if every == 0 {
        return Err(HfError::Field { key: "no_rope_layer_interval", reason: "must be at least 1".into() });
    }
    Ok((0..layers as u64).map(|i| (i + 1) % every != 0).collect())
}

/// GLM-4.5 (configuration_glm4_moe.py, modeling_glm4_moe.py): partial rotary, q/k/v biases,
/// optional q/k RMSNorm over the head, `first_k_dense_replace` dense layers, then MoE with a
/// shared expert and a sigmoid router with correction bias.
fn glm4_moe(f: &Fields, notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
    let mut m = llama_like(
        f,
        Dims {
            vocab: 151_552,
            hidden: 4096,
            layers: 46,
            heads: 96,
            kv_heads: Some(8),
            head_dim: None,
            ffn: 10_944,
            max_pos: 131_072,
            tied: false,
        },
    )?;
    m.qkv_bias = f.flag("attention_bias", false)?;
    m.o_bias = false;
    if f.flag("use_qk_norm", false)? {
        m.qk_norm = QkNorm::Head;
    }
    m.rotary_pct = f.rotary_pct(0.5)?;
    m.experts = f.size_any(&["n_routed_experts", "num_local_experts"], 128)?;
    m.top_k = f.uint_or("num_experts_per_tok", 8)?;
    m.expert_ffn = f.size("moe_intermediate_size", 1408)?;
    m.shared_experts = f.uint_or("n_shared_experts", 1)?;
    m.shared_ffn = m.expert_ffn;
    m.dense_layers = f.uint_or("first_k_dense_replace", 1)?.min(m.layers);
    m.fused_experts = true;
    m.router = Router::Sigmoid;
    m.router_fp32 = true;
    m.router_groups = f.uint_or("n_group", 1)?;
    m.router_group_topk = f.uint_or("topk_group", 1)?;
    notes.extend(mtp_note(f, "Glm4MoeForCausalLM")?);
    Ok(m)
}

/// SmolLM3 (configuration_smollm3.py): Llama with NoPE on every `no_rope_layer_interval`-th
/// layer, biases by `attention_bias`/`mlp_bias`, tied head by default.
fn smollm3(f: &Fields) -> Result<ModelSpec, HfError> {
    let mut m = llama_like(
        f,
        Dims {
            vocab: 128_256,
            hidden: 2048,
            layers: 36,
            heads: 16,
            kv_heads: Some(4),
            head_dim: None,
            ffn: 11_008,
            max_pos: 32_768,
            tied: true,
        },
    )?;
    let bias = f.flag("attention_bias", false)?;
    m.qkv_bias = bias;
    m.o_bias = bias;
    m.mlp_bias = f.flag("mlp_bias", false)?;
    let rope = rope_flags(f, m.layers as usize)?;
    m.nope_layers = LayerRule::from_flags(&rope.iter().map(|r| !r).collect::<Vec<_>>());
    // Default layer_types: sliding on the NoPE layers when use_sliding_window and sliding_window.
    let sliding = if f.flag("use_sliding_window", false)? { m.nope_layers.clone() } else { LayerRule::None };
    set_window(&mut m, f, "sliding_window", None, (sliding, WindowKind::Sliding))?;
    Ok(m)
}

/// Falcon-H1 (transformers 5.24 `configuration_falcon_h1.py` `FalconH1Config`, the model
/// `modeling_falcon_h1.py`): every layer runs a Mamba-2 mixer (`FalconH1Mixer`) and Llama's GQA
/// attention side by side on one input norm, then a SwiGLU MLP. `mamba_d_ssm` (default: the
/// expand × hidden) is H·P; `mamba_d_head` "auto" is `mamba_d_ssm / mamba_n_heads`.
fn falcon_h1(f: &Fields) -> Result<ModelSpec, HfError> {
    let mut m = llama_like(
        f,
        Dims {
            vocab: 128_000,
            hidden: 4096,
            layers: 32,
            heads: 32,
            kv_heads: Some(8),
            head_dim: None,
            ffn: 14_336,
            max_pos: 8192,
            tied: false,
        },
    )?;
    m.qkv_bias = f.flag("attention_bias", false)?;
    m.o_bias = m.qkv_bias;
    m.mlp_bias = f.flag("mlp_bias", false)?;
    let heads = f.size("mamba_n_heads", 128)?;
    let expand = f.uint_or("mamba_expand", 2)?;
    let inner = f.uint("mamba_d_ssm")?.unwrap_or(expand * m.hidden);
    let head_dim = match f.uint("mamba_d_head") {
        Ok(Some(d)) => d,
        _ => inner / heads.max(1),
    };
    if heads * head_dim != inner {
        return Err(HfError::Model(format!("`mamba_n_heads` × `mamba_d_head` ({heads} × {head_dim}) must be `mamba_d_ssm` ({inner})")));
    }
    m.ssm = crate::estimator::model::Ssm {
        heads,
        head_dim,
        state: f.size("mamba_d_state", 256)?,
        groups: f.size("mamba_n_groups", 1)?,
        conv: f.size("mamba_d_conv", 4)?,
        chunk: f.size("mamba_chunk_size", 256)?,
        conv_bias: f.flag("mamba_conv_bias", true)?,
        in_bias: f.flag("mamba_proj_bias", false)?,
        out_bias: f.flag("projectors_bias", false)?,
        gated_norm: f.flag("mamba_rms_norm", false)?,
        mup: true,
    };
    Ok(m)
}

/// Gemma 3's text model (configuration_gemma3.py `Gemma3TextConfig`): Gemma RMSNorms, four per
/// layer, q/k norms over the head, GeGLU, tied head, five sliding layers for every full one.
fn gemma3_text(f: &Fields) -> Result<ModelSpec, HfError> {
    let mut m = llama_like(
        f,
        Dims {
            vocab: 262_208,
            hidden: 2304,
            layers: 26,
            heads: 8,
            kv_heads: Some(4),
            head_dim: Some(256),
            ffn: 9216,
            max_pos: 131_072,
            tied: true,
        },
    )?;
    m.norm = NormKind::RmsnormGemma;
    m.layer_norms = 4;
    m.qk_norm = QkNorm::Head;
    m.softcap = f.float("attn_logit_softcapping")?.is_some() || f.float("final_logit_softcapping")?.is_some();
    m.act = f.activation(&["hidden_activation", "hidden_act"], Activation::GeluTanh)?;
    let bias = f.flag("attention_bias", false)?;
    m.qkv_bias = bias;
    m.o_bias = bias;
    // Default layer_types: sliding where (i + 1) % sliding_window_pattern != 0 (pattern 6).
    let pattern = f.uint_or("sliding_window_pattern", 6)?;
    let rule = if pattern == 0 { LayerRule::None } else { LayerRule::AllBut { step: pattern, offset: pattern - 1 } };
    let rule = if pattern == 1 { LayerRule::None } else { rule };
    set_window(&mut m, f, "sliding_window", Some(4096), (rule, WindowKind::Sliding))?;
    Ok(m)
}

fn spec_for(t: &str, f: &Fields, notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
    match t {
        "deepseek_v2" | "deepseek_v3" | "kimi_k2" => return deepseek(t, f, notes),
        "gpt_oss" => return gpt_oss(f),
        "llama4_text" => return llama4_text(f),
        "glm4_moe" => return glm4_moe(f, notes),
        "smollm3" => return smollm3(f),
        "falcon_h1" => return falcon_h1(f),
        "gemma3_text" => return gemma3_text(f),
        _ => {}
    }
    let base = default_spec();
    let vocab = f.required(&["vocab_size"])?;
    let mut m = ModelSpec { vocab, ..base };
    match t {
        "llama" | "mistral" | "mixtral" | "qwen2" | "qwen2_moe" | "qwen3" | "qwen3_moe" | "gemma" | "gemma2" | "olmo" | "olmo2"
        | "phi3" => {
            m.hidden = f.required(&["hidden_size"])?;
            m.layers = f.required(&["num_hidden_layers"])?;
            m.heads = f.required(&["num_attention_heads"])?;
            m.kv_heads = f.uint_or("num_key_value_heads", m.heads)?;
            let default_head_dim = m.hidden.checked_div(m.heads).unwrap_or(0);
            m.head_dim = f.uint_or("head_dim", default_head_dim)?;
            m.mlp = MlpKind::Gated;
            m.norm = NormKind::Rmsnorm;
            m.layer_norms = 2;
            m.positions = Positions::Rope;
            m.rotary_pct = 100;
            m.act = f.activation(&["hidden_act", "hidden_activation"], Activation::Silu)?;
            check_layers(m.layers)?;
            let moe = matches!(t, "mixtral" | "qwen2_moe" | "qwen3_moe");
            // Mixtral's `intermediate_size` is its experts' size: it has no dense MLP.
            m.ffn = match t {
                "mixtral" => 0,
                _ if moe => f.uint("intermediate_size")?.unwrap_or(0),
                _ => f.required(&["intermediate_size"])?,
            };
            m.tied = f.flag("tie_word_embeddings", matches!(t, "gemma" | "gemma2"))?;
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
                "gemma" => {
                    m.norm = NormKind::RmsnormGemma;
                    m.act = f.activation(&["hidden_activation", "hidden_act"], Activation::GeluTanh)?;
                }
                "qwen3" | "qwen3_moe" => m.qk_norm = QkNorm::Head,
                "olmo" => {
                    m.norm = NormKind::Nonparametric;
                    m.clip_qkv = f.float("clip_qkv")?.is_some();
                }
                "olmo2" => m.qk_norm = QkNorm::Full,
                "phi3" => {
                    m.resid_dropout = true;
                    m.fused_qkv = true;
                    m.fused_gate_up = true;
                    m.rotary_pct = f.rotary_pct(1.0)?;
                }
                _ => {}
            }
            match t {
                // Gemma2Config: layer_types default sliding where (i + 1) % 2 != 0 (even layers).
                "gemma2" => {
                    set_window(&mut m, f, "sliding_window", Some(4096), (LayerRule::Every { step: 2, offset: 0 }, WindowKind::Sliding))?
                }
                // Mistral, Mixtral and Phi-3 pass `config.sliding_window` to every layer.
                "mistral" | "mixtral" | "phi3" => {
                    let default = if t == "mistral" { Some(4096) } else { None };
                    if f.get("layer_types").is_some() {
                        return Err(HfError::Field {
                            key: "layer_types",
                            reason: format!("is not read by transformers' `{t}` classes (Ministral is another model type)"),
                        });
                    }
                    set_window(&mut m, f, "sliding_window", default, (LayerRule::All, WindowKind::Sliding))?;
                }
                "qwen2" | "qwen2_moe" | "qwen3" | "qwen3_moe" if f.flag("use_sliding_window", false)? => {
                    return Err(HfError::Field {
                        key: "use_sliding_window",
                        reason: "true is not modelled (Qwen's published checkpoints set it false)".into(),
                    });
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
                    let sparse: Vec<bool> = (0..m.layers).map(|i| !dense_only.contains(&i) && step > 0 && (i + 1) % step == 0).collect();
                    m.moe_rule = LayerRule::from_flags(&sparse);
                    m.dense_layers = 0;
                    if m.dense_mlp_layers() > 0 && m.ffn == 0 {
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
            m.ffn = f.uint("n_inner")?.unwrap_or(m.hidden.saturating_mul(4));
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
            m.ffn = f.uint("ffn_hidden_size")?.unwrap_or(m.hidden.saturating_mul(4));
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
            // Starcoder2Attention passes `config.sliding_window` to every layer (null: none).
            set_window(&mut m, f, "sliding_window", None, (LayerRule::All, WindowKind::Sliding))?;
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
    use crate::estimator::model::{LayerRule, WindowKind};

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

    #[test]
    fn a_bare_deepseek_v3_config_takes_the_class_defaults_and_says_so() {
        // DeepseekV3Config's defaults are DeepSeek-V3 itself: 671,026,404,352 parameters.
        let m = import_json(r#"{"model_type": "deepseek_v3"}"#).expect("the defaults build");
        assert_eq!(m.spec.counts().total, 671_026_404_352);
        assert!(m.notes.iter().any(|n| n.starts_with("absent from config.json") && n.contains("`kv_lora_rank`")), "{:?}", m.notes);
    }

    #[test]
    fn a_null_q_lora_rank_means_one_plain_query_projection() {
        let base = r#""model_type": "deepseek_v2", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 6, "kv_lora_rank": 2, "qk_rope_head_dim": 1,
            "qk_nope_head_dim": 3, "v_head_dim": 3, "n_routed_experts": 2, "num_experts_per_tok": 1,
            "moe_intermediate_size": 4, "first_k_dense_replace": 1"#;
        let plain = import_json(&format!("{{{base}, \"q_lora_rank\": null}}")).map(|m| m.spec.q_lora_rank);
        let default = import_json(&format!("{{{base}}}")).map(|m| m.spec.q_lora_rank);
        assert_eq!((plain, default), (Ok(0), Ok(1536)));
    }

    #[test]
    fn llama4_moe_layers_follow_the_interleave_step_and_nope_every_fourth_layer() {
        let m = import_json(
            r#"{"model_type": "llama4_text", "num_hidden_layers": 8, "interleave_moe_layer_step": 2, "no_rope_layers": [],
                "use_qk_norm": false}"#,
        )
        .expect("imports")
        .spec;
        assert_eq!(m.moe_rule, LayerRule::Every { step: 2, offset: 1 });
        assert_eq!(m.nope_layers, LayerRule::Every { step: 4, offset: 3 });
        // Chunked attention on the RoPE layers, 8,192 tokens by default.
        assert_eq!(
            (m.window_layers.clone(), m.window_kind, m.window),
            (LayerRule::AllBut { step: 4, offset: 3 }, WindowKind::Chunked, 8192)
        );
        assert_eq!((m.moe_layers(), m.dense_mlp_layers(), m.ffn, m.expert_ffn), (4, 4, 16_384, 8192));
    }

    #[test]
    fn smollm3_reads_its_no_rope_list() {
        let m = import_json(r#"{"model_type": "smollm3", "num_hidden_layers": 4, "no_rope_layers": [1, 0, 1, 0]}"#).expect("imports").spec;
        assert_eq!(m.nope_layers, LayerRule::Every { step: 2, offset: 1 });
        assert!(m.tied, "SmolLM3Config ties the head by default");
    }

    #[test]
    fn an_unmodelled_layer_type_is_refused_naming_the_key() {
        let err =
            import_json(r#"{"model_type": "gpt_oss", "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]}"#)
                .err();
        assert_eq!(err.as_ref().and_then(HfError::key), Some("layer_types"));
        assert!(err.map(|e| e.to_string()).is_some_and(|s| s.contains("linear_attention")));
    }

    #[test]
    fn a_moe_layer_freq_transformers_cannot_build_is_refused() {
        let err = import_json(r#"{"model_type": "deepseek_v3", "moe_layer_freq": 2}"#).err();
        assert_eq!(err.as_ref().and_then(HfError::key), Some("moe_layer_freq"));
    }

    #[test]
    fn a_multimodal_wrapper_names_its_vision_tower_and_needs_a_text_config() {
        let m = import_json(
            r#"{"model_type": "gemma3", "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34},
                "vision_config": {"model_type": "siglip_vision_model", "num_hidden_layers": 27, "hidden_size": 1152}}"#,
        )
        .expect("imports");
        assert_eq!(m.model_type, "gemma3");
        // Gemma-3-4B's text model (vocabulary, heads and head_dim from Gemma3TextConfig's defaults).
        assert_eq!(m.spec.counts().total, 3_880_263_168);
        assert!(m.notes[0].contains("siglip_vision_model, 27 layers of width 1152"), "{:?}", m.notes);
        assert_eq!(import_json(r#"{"model_type": "llama4"}"#).err(), Some(HfError::Missing("text_config")));
    }

    /// OLMo's `clip_qkv` (a number or null) becomes the spec's flag, and the exporter writes it
    /// back for the same spec.
    #[test]
    fn olmo_clip_qkv_is_imported_and_exported() {
        let base = r#""model_type": "olmo", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 6"#;
        let clipped = import_json(&format!("{{{base}, \"clip_qkv\": 8.0}}")).expect("imports").spec;
        let plain = import_json(&format!("{{{base}, \"clip_qkv\": null}}")).expect("imports").spec;
        assert!(clipped.clip_qkv);
        assert!(!plain.clip_qkv);
        let out = crate::estimator::hf_export::export(&clipped).expect("exports");
        let back = import_value(&serde_json::to_value(&out.config).expect("json")).expect("re-imports").spec;
        assert!(back.clip_qkv);
    }

    #[test]
    fn qwen_sliding_windows_are_refused_rather_than_approximated() {
        let err = import_json(
            r#"{"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
                "intermediate_size": 6, "use_sliding_window": true}"#,
        )
        .err();
        assert_eq!(err.as_ref().and_then(HfError::key), Some("use_sliding_window"));
    }

    #[test]
    fn absurd_numbers_in_the_new_families_are_errors_not_panics() {
        let huge = u64::MAX;
        for t in ["deepseek_v3", "deepseek_v2", "kimi_k2", "gpt_oss", "llama4_text", "glm4_moe", "smollm3", "gemma3_text"] {
            for key in [
                "num_hidden_layers",
                "qk_nope_head_dim",
                "qk_rope_head_dim",
                "kv_lora_rank",
                "hidden_size",
                "interleave_moe_layer_step",
                "no_rope_layer_interval",
                "sliding_window_pattern",
                "n_group",
                "num_experts_per_tok",
            ] {
                let json = format!(r#"{{"model_type": "{t}", "{key}": {huge}, "num_experts_per_tok": 2}}"#);
                if let Ok(m) = import_json(&json) {
                    // Whatever imports is a valid model whose count does not overflow.
                    assert_eq!(m.spec.validate(), Ok(()), "{json}");
                    let _ = m.spec.counts();
                }
            }
        }
    }
}
