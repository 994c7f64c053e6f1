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
//! each family's `Modeling::export` (`step/families/<family>.rs`, with the shared writers of
//! [`hf_writer`](crate::estimator::hf_writer)) puts every field of the spec into the keys that type's
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
use super::model::{LayerRule, ModelSpec, WindowKind};
use super::step::families::config_file;
use serde_json::Value;

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
    for config in config_file(spec.family).export(spec) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::model::Positions;
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
