//! The shared readers of a `config.json`: the error type, [`Fields`] (typed access to the keys,
//! each error naming its key, absent sizing keys recorded when they take a class default), and
//! the pieces several families' importers read alike (a Llama-style decoder's keys, local
//! attention from `layer_types`, NoPE flags, multi-token-prediction layers). Each family's own
//! reading is its `Modeling::import` (in that family's module, beside its op-level program); the flow from `model_type`
//! to a family is `estimator::hf`'s.

use crate::estimator::model::{Activation, LayerRule, MlpKind, ModelSpec, NormKind, Positions, StateDtype, WindowKind};
use crate::estimator::preset_base::default_spec;
use serde_json::{Map, Value};
use std::cell::RefCell;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HfError {
    #[error("config.json is not valid JSON: {0}")]
    Json(String),
    #[error("config.json must be a JSON object")]
    NotObject,
    #[error("config.json has no `model_type`")]
    NoModelType,
    /// A model type no family reads, with the list of those that are read.
    #[error("unsupported model_type `{model_type}` (supported: {supported})")]
    Unsupported { model_type: String, supported: String },
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
    /// A bare value that is neither JSON's nor one of the three Python's `json` writes.
    #[error("`{key}` in config.json: `{token}` is not a number (JSON's, or Python's Infinity, -Infinity or NaN)")]
    BadNumber { key: String, token: String },
}

impl HfError {
    /// The field at fault, if one is.
    pub fn key(&self) -> Option<&'static str> {
        match self {
            HfError::Missing(k) | HfError::Type { key: k, .. } | HfError::Field { key: k, .. } => Some(k),
            HfError::NoModelType | HfError::Unsupported { .. } | HfError::Refused { .. } => Some("model_type"),
            _ => None,
        }
    }
}

/// One flag per layer (local attention or not) and the kind of the local layers.
pub type LocalLayers = (Vec<bool>, Option<WindowKind>);

pub struct Fields<'a> {
    pub map: &'a Map<String, Value>,
    /// Sizing keys that were absent and took the configuration class's default.
    pub defaulted: RefCell<Vec<&'static str>>,
}

impl<'a> Fields<'a> {
    pub fn new(map: &'a Map<String, Value>) -> Fields<'a> {
        Fields { map, defaulted: RefCell::new(Vec::new()) }
    }
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }
    /// Whether the key is present with an explicit `null`.
    pub fn is_null(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(Value::is_null)
    }
    /// A sizing key with its configuration class's default when absent (recorded for the note).
    pub fn size(&self, key: &'static str, default: u64) -> Result<u64, HfError> {
        match self.uint(key)? {
            Some(v) => Ok(v),
            None => {
                self.defaulted.borrow_mut().push(key);
                Ok(default)
            }
        }
    }
    /// The first present of `keys` (transformers' attribute_map aliases), else the default.
    pub fn size_any(&self, keys: &[&'static str], default: u64) -> Result<u64, HfError> {
        for k in keys {
            if let Some(v) = self.uint(k)? {
                return Ok(v);
            }
        }
        self.size(keys[0], default)
    }
    /// A layer list of 0/1 flags (`no_rope_layers`); empty when absent or `[]`.
    pub fn flags(&self, key: &'static str) -> Result<Vec<bool>, HfError> {
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
    pub fn layer_types(&self, layers: u64) -> Result<Option<LocalLayers>, HfError> {
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
    pub fn uint(&self, key: &'static str) -> Result<Option<u64>, HfError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 1e15).map(|f| f as u64))
                .map(Some)
                .ok_or(HfError::Type { key, expected: "a non-negative integer" }),
        }
    }
    pub fn uint_or(&self, key: &'static str, default: u64) -> Result<u64, HfError> {
        Ok(self.uint(key)?.unwrap_or(default))
    }
    /// The first of `keys` present (transformers' attribute_map aliases).
    pub fn required(&self, keys: &[&'static str]) -> Result<u64, HfError> {
        for k in keys {
            if let Some(v) = self.uint(k)? {
                return Ok(v);
            }
        }
        Err(HfError::Missing(keys[0]))
    }
    pub fn flag(&self, key: &'static str, default: bool) -> Result<bool, HfError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or(HfError::Type { key, expected: "true or false" }),
        }
    }
    /// A number; Python's `Infinity`, `-Infinity` and `NaN` (read by [`python_json`] as their
    /// names) are the floats they name.
    pub fn float(&self, key: &'static str) -> Result<Option<f64>, HfError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_f64().or_else(|| v.as_str().and_then(python_float)).map(Some).ok_or(HfError::Type { key, expected: "a number" })
            }
        }
    }
    pub fn string(&self, key: &'static str) -> Result<Option<&str>, HfError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or(HfError::Type { key, expected: "a string" }),
        }
    }
    /// A recurrent state's dtype named by `key` (`mamba_ssm_dtype`: `float32`, `bfloat16`,
    /// `float16`); `StateDtype::Auto` when the key is absent or null.
    pub fn state_dtype(&self, key: &'static str) -> Result<StateDtype, HfError> {
        if self.is_null(key) {
            return Ok(StateDtype::Auto);
        }
        match self.string(key)? {
            None => Ok(StateDtype::Auto),
            Some(s) => StateDtype::parse(s)
                .filter(|d| *d != StateDtype::Auto)
                .ok_or_else(|| HfError::Field { key, reason: format!("`{s}` is not float32, bfloat16 or float16") }),
        }
    }
    /// Rotary fraction from `partial_rotary_factor`, `rotary_pct` or (transformers 5)
    /// `rope_parameters.partial_rotary_factor`, as a percentage.
    pub fn rotary_pct(&self, default: f64) -> Result<u64, HfError> {
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
    pub fn activation(&self, keys: &[&'static str], default: Activation) -> Result<Activation, HfError> {
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
    pub fn list_len(&self, key: &'static str) -> Result<Vec<u64>, HfError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => {
                a.iter().map(|v| v.as_u64().ok_or(HfError::Type { key, expected: "a list of layer indices" })).collect()
            }
            Some(_) => Err(HfError::Type { key, expected: "a list of layer indices" }),
        }
    }
}

/// Sizes of a Llama-style decoder and its configuration class's defaults for absent keys.
pub struct Dims {
    pub vocab: u64,
    pub hidden: u64,
    pub layers: u64,
    pub heads: u64,
    /// `None`: as many as query heads.
    pub kv_heads: Option<u64>,
    /// `None`: hidden / heads (modeling's `getattr(config, "head_dim", h // a)`).
    pub head_dim: Option<u64>,
    pub ffn: u64,
    pub max_pos: u64,
    pub tied: bool,
}

/// A Llama-style decoder (RMSNorm, gated SiLU MLP, rotary) read with a class's defaults.
pub fn llama_like(f: &Fields, d: Dims) -> Result<ModelSpec, HfError> {
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
pub fn check_layers(layers: u64) -> Result<(), HfError> {
    const MAX_LAYERS: u64 = 1 << 14;
    if layers > MAX_LAYERS {
        return Err(HfError::Model(format!("`num_hidden_layers` {layers} is beyond the supported {MAX_LAYERS}")));
    }
    Ok(())
}

/// Local attention: `layer_types` when the file lists them, else the class's default rule; no
/// local layer when the window key is null (the modeling code then passes `sliding_window=None`).
pub fn set_window(
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
pub fn mtp_note(f: &Fields, class: &str) -> Result<Option<String>, HfError> {
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

/// `no_rope_layers` flags (1 = RoPE), or the default every-`no_rope_layer_interval`-th NoPE.
pub fn rope_flags(f: &Fields, layers: usize) -> Result<Vec<bool>, HfError> {
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

/// The default architecture with the file's `vocab_size`, which the importers of the families
/// from before 2026 require first (their sizing keys must be present).
pub fn with_vocab(f: &Fields) -> Result<ModelSpec, HfError> {
    let vocab = f.required(&["vocab_size"])?;
    Ok(ModelSpec { vocab, ..default_spec() })
}

/// [`with_vocab`] and the sizes GPT-NeoX, OPT, Phi, StableLM and StarCoder2 read under the same
/// names (`hidden_size`, `num_hidden_layers`, `num_attention_heads`, all required), with the
/// residual and embedding dropout their modeling files apply.
pub fn with_plain_sizes(f: &Fields) -> Result<ModelSpec, HfError> {
    let mut m = with_vocab(f)?;
    m.resid_dropout = true;
    m.embed_dropout = true;
    m.hidden = f.required(&["hidden_size"])?;
    m.layers = f.required(&["num_hidden_layers"])?;
    m.heads = f.required(&["num_attention_heads"])?;
    Ok(m)
}

/// How a Llama-style class reads `intermediate_size` ([`llama_keys`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ffn {
    /// The dense MLP's size, required.
    Required,
    /// An MoE model's dense layers' size, 0 when absent.
    Optional,
    /// Not the dense MLP's (Mixtral's is its experts'): no dense MLP.
    Experts,
}

/// The keys every Llama-style class from before 2026 reads alike (configuration_llama.py and
/// the classes written from it: Mistral, Mixtral, Qwen2/3 and their MoE, Gemma 1/2, OLMo 1/2,
/// Phi-3): the sizes (required), the key/value heads and `head_dim` (default `h / a`), the
/// activation (`hidden_act` or `hidden_activation`, default SiLU), the intermediate size as
/// `ffn` says, the tie (default `tied`), `max_position_embeddings` (default `max_pos`),
/// `attention_bias` on q, k, v and o, and `mlp_bias`. RMSNorm, a gated MLP, full RoPE.
pub fn llama_keys(f: &Fields, ffn: Ffn, tied: bool, max_pos: u64) -> Result<ModelSpec, HfError> {
    let mut m = with_vocab(f)?;
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
    m.ffn = match ffn {
        Ffn::Experts => 0,
        Ffn::Optional => f.uint("intermediate_size")?.unwrap_or(0),
        Ffn::Required => f.required(&["intermediate_size"])?,
    };
    m.tied = f.flag("tie_word_embeddings", tied)?;
    m.max_pos = f.uint_or("max_position_embeddings", max_pos)?;
    let attention_bias = f.flag("attention_bias", false)?;
    m.qkv_bias = attention_bias;
    m.o_bias = attention_bias;
    m.mlp_bias = f.flag("mlp_bias", false)?;
    Ok(m)
}

/// The last check of the importers of the families from before 2026: at least one head.
pub fn with_heads(m: ModelSpec) -> Result<ModelSpec, HfError> {
    if m.heads == 0 {
        return Err(HfError::Model("`num_attention_heads` must be at least 1".into()));
    }
    Ok(m)
}

/// `config.sliding_window` on every layer (Mistral, Mixtral and Phi-3 pass it to every
/// attention layer; `default` when absent); such a class reads no `layer_types`.
pub fn window_on_every_layer(m: &mut ModelSpec, f: &Fields, t: &str, default: Option<u64>) -> Result<(), HfError> {
    if f.get("layer_types").is_some() {
        return Err(HfError::Field {
            key: "layer_types",
            reason: format!("is not read by transformers' `{t}` classes (Ministral is another model type)"),
        });
    }
    set_window(m, f, "sliding_window", default, (LayerRule::All, WindowKind::Sliding))
}

/// Qwen's `use_sliding_window: true` is refused (Qwen's published checkpoints set it false).
pub fn no_qwen_sliding_window(f: &Fields) -> Result<(), HfError> {
    if f.flag("use_sliding_window", false)? {
        return Err(HfError::Field {
            key: "use_sliding_window",
            reason: "true is not modelled (Qwen's published checkpoints set it false)".into(),
        });
    }
    Ok(())
}

/// Python's non-finite floats, as its `json.dumps` writes them (`allow_nan=True`, the default).
const PYTHON_FLOATS: [(&str, f64); 3] = [("Infinity", f64::INFINITY), ("-Infinity", f64::NEG_INFINITY), ("NaN", f64::NAN)];

/// The float a Python non-finite token names (`"Infinity"` → +∞), if it is one.
pub fn python_float(token: &str) -> Option<f64> {
    PYTHON_FLOATS.iter().find(|(t, _)| *t == token).map(|(_, f)| *f)
}

/// A `config.json` as Python's `json` writes it, made standard JSON: the bare `Infinity`,
/// `-Infinity` and `NaN` (real Falcon-H1 and Granite-4 files carry `time_step_limit: [0.0,
/// Infinity]`) become the strings of their names, which [`Fields::float`] reads back as floats.
/// Any other bare value that is not `true`, `false`, `null` or a JSON number is an error naming
/// its key (the innermost object key around it). Text inside strings is left as it is.
pub fn python_json(text: &str) -> Result<String, HfError> {
    let mut out = String::with_capacity(text.len());
    // The key of each open container (an array inherits its key's), and the last string read.
    let mut keys: Vec<String> = vec![String::new()];
    let mut last = String::new();
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => {
                let start = i;
                let mut end = text.len();
                let mut escaped = false;
                for (j, d) in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if d == '\\' {
                        escaped = true;
                    } else if d == '"' {
                        end = j + 1;
                        break;
                    }
                }
                let s = &text[start..end];
                out.push_str(s);
                last = s.trim_matches('"').to_string();
            }
            ':' => {
                if let Some(k) = keys.last_mut() {
                    *k = std::mem::take(&mut last);
                }
                out.push(c);
            }
            '{' => {
                keys.push(String::new());
                out.push(c);
            }
            '[' => {
                let k = keys.last().cloned().unwrap_or_default();
                keys.push(k);
                out.push(c);
            }
            '}' | ']' => {
                keys.pop();
                out.push(c);
            }
            c if c.is_whitespace() || c == ',' => out.push(c),
            _ => {
                let mut end = text.len();
                while let Some(&(j, d)) = chars.peek() {
                    if d.is_whitespace() || matches!(d, ',' | ']' | '}' | ':' | '"' | '[' | '{') {
                        end = j;
                        break;
                    }
                    chars.next();
                }
                let token = &text[i..end];
                if python_float(token).is_some() {
                    out.push('"');
                    out.push_str(token);
                    out.push('"');
                } else if matches!(token, "true" | "false" | "null") || json_number(token) {
                    out.push_str(token);
                } else {
                    let key = keys.last().cloned().unwrap_or_default();
                    if key.is_empty() {
                        // Not a key's value: not a config at all, which the JSON parser says.
                        out.push_str(token);
                        continue;
                    }
                    return Err(HfError::BadNumber { key, token: token.chars().take(40).collect() });
                }
            }
        }
    }
    Ok(out)
}

/// Whether `t` is a number as JSON writes one: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn json_number(t: &str) -> bool {
    let b = t.as_bytes();
    let mut i = usize::from(b.first() == Some(&b'-'));
    let digits = |i: &mut usize| {
        let s = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i - s
    };
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(d) if d.is_ascii_digit() => {
            digits(&mut i);
        }
        _ => return false,
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}
