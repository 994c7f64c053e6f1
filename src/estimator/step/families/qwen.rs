//! Qwen2 and Qwen3, dense (`models/qwen2/`, `models/qwen3/`, transformers 5.24): Llama's code
//! ([`super::llama`]) — Qwen2 with biases on q, k and v, Qwen3 with an RMSNorm over each head
//! of q and k; both differences are in the spec.

use super::modeling::{ConfigFile, Modeling};
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Ffn, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{ModelSpec, QkNorm};
use crate::estimator::preset_base::{llama, tied, Preset};
use serde_json::{Map, Value};

/// Qwen2: Llama with biases on Q, K and V.
const fn qwen2(vocab: u64, hidden: u64, layers: u64, heads: u64, kv_heads: u64, ffn: u64, max_pos: u64) -> ModelSpec {
    let mut m = llama(vocab, hidden, layers, heads, kv_heads, ffn, max_pos);
    m.family = Family::Qwen2;
    m.qkv_bias = true;
    m
}

/// Qwen3 dense: head_dim 128, RMSNorm over each head of q and k, 40,960 positions.
pub const fn qwen3(hidden: u64, layers: u64, heads: u64, ffn: u64, tied: bool) -> ModelSpec {
    let mut m = llama(151_936, hidden, layers, heads, 8, ffn, 40_960);
    m.family = Family::Qwen3;
    m.head_dim = 128;
    m.qk_norm = QkNorm::Head;
    m.tied = tied;
    m
}

/// Qwen2 (`modeling_qwen2.py`).
pub struct Qwen2;
impl ConfigFile for Qwen2 {
    /// `Qwen2Config`: q, k and v always biased, o never; 32,768 positions by default; a sliding
    /// window is refused.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_keys(f, Ffn::Required, false, 32_768)?;
        m.qkv_bias = true;
        m.o_bias = false;
        fields::no_qwen_sliding_window(f)?;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::llama_base("qwen2", s, "hidden_act") else { return Vec::new() };
        w.set("intermediate_size", s.ffn).set("use_sliding_window", false);
        w.done().into_iter().collect()
    }
}

impl Modeling for Qwen2 {
    fn presets(&self) -> Vec<Preset> {
        let p = |order, id, checkpoint, spec| Preset::new(order, id, checkpoint, "Qwen2.5", spec);
        vec![
            p(14, "qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", tied(qwen2(151936, 896, 24, 14, 2, 4864, 32768))),
            p(15, "qwen2.5-7b", "Qwen/Qwen2.5-7B", qwen2(152064, 3584, 28, 28, 4, 18944, 131072)),
            p(16, "qwen2.5-72b", "Qwen/Qwen2.5-72B", qwen2(152064, 8192, 80, 64, 8, 29568, 131072)),
        ]
    }
}

/// Qwen3 (`modeling_qwen3.py`).
pub struct Qwen3;
impl ConfigFile for Qwen3 {
    /// `Qwen3Config`: Llama's keys and q/k norms over each head; a sliding window is refused.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_keys(f, Ffn::Required, false, 32_768)?;
        m.qk_norm = QkNorm::Head;
        fields::no_qwen_sliding_window(f)?;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::llama_base("qwen3", s, "hidden_act") else { return Vec::new() };
        w.set("intermediate_size", s.ffn).set("attention_bias", s.qkv_bias).set("use_sliding_window", false);
        w.done().into_iter().collect()
    }
}

impl Modeling for Qwen3 {
    fn presets(&self) -> Vec<Preset> {
        let p = |order, id, checkpoint, spec| Preset::new(order, id, checkpoint, "Qwen3", spec);
        vec![
            p(22, "qwen3-0.6b", "Qwen/Qwen3-0.6B", qwen3(1024, 28, 16, 3072, true)),
            p(23, "qwen3-1.7b", "Qwen/Qwen3-1.7B", qwen3(2048, 28, 16, 6144, true)),
            p(24, "qwen3-4b", "Qwen/Qwen3-4B", qwen3(2560, 36, 32, 9728, true)),
            p(25, "qwen3-8b", "Qwen/Qwen3-8B", qwen3(4096, 36, 32, 12288, false)),
            p(26, "qwen3-14b", "Qwen/Qwen3-14B", qwen3(5120, 40, 40, 17408, false)),
            p(27, "qwen3-32b", "Qwen/Qwen3-32B", qwen3(5120, 64, 64, 25600, false)),
        ]
    }
}
