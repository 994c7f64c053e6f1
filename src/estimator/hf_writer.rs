//! The shared writers of a `config.json`: a [`Writer`] of key/value pairs and the keys several
//! families' classes write alike (sizes, activation names, `layer_types`, windows, soft-caps).
//! Each family's own writing is its `Modeling::export` (in that family's module, beside its op-level program); the
//! round trip that accepts a written file is `estimator::hf_export`'s.

use crate::estimator::model::{Activation, LayerRule, ModelSpec};
use serde_json::{Map, Value};

/// A config map from key/value pairs.
pub struct Writer(Map<String, Value>);

impl Writer {
    pub fn new(model_type: &str) -> Writer {
        let mut m = Map::new();
        m.insert("model_type".into(), Value::from(model_type));
        m.insert("pad_token_id".into(), Value::Null);
        Writer(m)
    }
    pub fn set(&mut self, key: &str, v: impl Into<Value>) -> &mut Writer {
        self.0.insert(key.to_string(), v.into());
        self
    }
    pub fn done(&mut self) -> Option<Map<String, Value>> {
        Some(std::mem::take(&mut self.0))
    }
}

/// The `hidden_act` spelling of an activation; `None` for the clamped SwiGLU, which only gpt-oss
/// has (and fixes).
pub fn act_name(a: Activation) -> Option<&'static str> {
    Some(match a {
        Activation::Silu => "silu",
        Activation::Gelu => "gelu",
        Activation::GeluTanh => "gelu_pytorch_tanh",
        Activation::GeluNew => "gelu_new",
        Activation::Relu => "relu",
        Activation::SwigluClamped => return None,
        Activation::Xielu => "xielu",
    })
}

/// `partial_rotary_factor` as transformers reads it: the rotary percentage as a fraction.
pub fn rotary_fraction(s: &ModelSpec) -> f64 {
    s.rotary_pct as f64 / 100.0
}

/// `layer_types`: `kind` on the layers of `window_layers`, `full_attention` elsewhere.
pub fn layer_types(s: &ModelSpec, kind: &str) -> Value {
    Value::from((0..s.layers).map(|i| if s.window_layers.contains(i) { kind } else { "full_attention" }).collect::<Vec<_>>())
}

/// The window size, or `null` when no layer is local.
pub fn window_or_null(s: &ModelSpec) -> Value {
    if s.window_layers.count(s.layers) > 0 {
        Value::from(s.window)
    } else {
        Value::Null
    }
}

/// Layer indices in `rule` among the model's layers.
pub fn indices(rule: &LayerRule, layers: u64) -> Vec<u64> {
    (0..layers).filter(|&i| rule.contains(i)).collect()
}

/// The sizes every Llama-style class reads under the same names.
pub fn llama_sizes(w: &mut Writer, s: &ModelSpec) {
    w.set("vocab_size", s.vocab)
        .set("hidden_size", s.hidden)
        .set("num_hidden_layers", s.layers)
        .set("num_attention_heads", s.heads)
        .set("num_key_value_heads", s.kv_heads)
        .set("head_dim", s.head_dim)
        .set("max_position_embeddings", s.max_pos)
        .set("tie_word_embeddings", s.tied);
}

/// A Llama-style class's config (Llama, Mistral, Mixtral, Qwen2/3 and their MoE, Gemma 1/2,
/// OLMo 1/2, Phi-3: the importer's `fields::llama_keys`): the sizes and the activation under
/// `act_key`; the family writes the rest. `None` for an activation no class names.
pub fn llama_base(t: &str, s: &ModelSpec, act_key: &str) -> Option<Writer> {
    let mut w = Writer::new(t);
    llama_sizes(&mut w, s);
    w.set(act_key, act_name(s.act)?);
    Some(w)
}

/// The sizes GPT-NeoX, Phi, StableLM and StarCoder2 read under the same names (`intermediate_size`,
/// `hidden_act`; `num_key_value_heads` where the class has grouped queries); the family writes the
/// rest. `None` for an activation no class names.
pub fn plain_base(t: &str, s: &ModelSpec, kv_heads: bool) -> Option<Writer> {
    let mut w = Writer::new(t);
    w.set("vocab_size", s.vocab)
        .set("hidden_size", s.hidden)
        .set("num_hidden_layers", s.layers)
        .set("num_attention_heads", s.heads)
        .set("intermediate_size", s.ffn)
        .set("hidden_act", act_name(s.act)?)
        .set("tie_word_embeddings", s.tied)
        .set("max_position_embeddings", s.max_pos);
    if kv_heads {
        w.set("num_key_value_heads", s.kv_heads);
    }
    Some(w)
}

/// Gemma-2's and Gemma-3's tanh soft-capping: the Gemma-2 checkpoints' values, or none.
pub fn softcaps(w: &mut Writer, s: &ModelSpec) {
    const ATTN_SOFTCAP: f64 = 50.0;
    const FINAL_SOFTCAP: f64 = 30.0;
    let cap = |v: f64| if s.softcap { Value::from(v) } else { Value::Null };
    w.set("attn_logit_softcapping", cap(ATTN_SOFTCAP)).set("final_logit_softcapping", cap(FINAL_SOFTCAP));
}

/// `sliding_window` for a class that gives it to every layer (Mistral, Mixtral, Phi-3,
/// StarCoder2): the window when every layer slides, else `null`.
pub fn every_layer_window(s: &ModelSpec) -> Value {
    if s.window_layers == LayerRule::All && s.window > 0 {
        Value::from(s.window)
    } else {
        Value::Null
    }
}

/// `no_rope_layers` as Llama 4 and SmolLM3 write it: 1 where a layer uses RoPE.
pub fn rope_layers(s: &ModelSpec) -> Vec<u64> {
    (0..s.layers).map(|i| u64::from(!s.nope_layers.contains(i))).collect()
}
