//! Mixtral (`models/mixtral/`, transformers 5.24): Llama's attention and a sparse MoE block on
//! every layer (`MixtralSparseMoeBlock`: softmax router, top-k, fused experts), optionally a
//! sliding window on every layer. Its step is Llama's code ([`super::llama`]); the MoE layers
//! are in the spec.

use super::modeling::{ConfigFile, Modeling};
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Ffn, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::ModelSpec;
use crate::estimator::preset_base::{llama, Preset};
use serde_json::{Map, Value};

/// Mixtral (`modeling_mixtral.py`).
pub struct Mixtral;
impl ConfigFile for Mixtral {
    /// `MixtralConfig`: `intermediate_size` is the experts' (no dense MLP), `num_local_experts`
    /// experts, `num_experts_per_tok`, `sliding_window` on every layer (null: none).
    fn import(&self, t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_keys(f, Ffn::Experts, false, 131_072)?;
        fields::window_on_every_layer(&mut m, f, t, None)?;
        m.fused_experts = true;
        m.experts = f.required(&["num_local_experts", "num_experts"])?;
        m.top_k = f.required(&["num_experts_per_tok"])?;
        m.expert_ffn = f.required(&["intermediate_size"])?;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::llama_base("mixtral", s, "hidden_act") else { return Vec::new() };
        w.set("intermediate_size", s.expert_ffn)
            .set("sliding_window", writer::every_layer_window(s))
            .set("num_local_experts", s.experts)
            .set("num_experts_per_tok", s.top_k);
        w.done().into_iter().collect()
    }
}

impl Modeling for Mixtral {
    fn presets(&self) -> Vec<Preset> {
        let mut m = llama(32000, 4096, 32, 32, 8, 0, 32768);
        m.family = Family::Mixtral;
        m.experts = 8;
        m.top_k = 2;
        m.expert_ffn = 14336;
        m.fused_experts = true;
        vec![Preset::new(13, "mixtral-8x7b-v0.1", "mistralai/Mixtral-8x7B-v0.1", "Mistral", m)]
    }
}
