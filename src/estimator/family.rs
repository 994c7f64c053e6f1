//! The model family: whose modeling code a model runs, decided once — by the `config.json`
//! importer from its `model_type`, by a preset, or by the `family` key of a link — and never
//! guessed again from the architecture's numbers.
//!
//! A family is a transformers `model_type` (its `models/<type>/modeling_<type>.py`); the
//! estimator's code for each lives in `step/families/`, whose module doc says what adding one
//! takes. This file is the list: a variant, its `model_type`, and the words the page shows.

use serde::{Deserialize, Serialize};

/// Whose modeling code a model follows (transformers 5.24 `model_type`, text model).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// `modeling_llama.py`: the defaults of every other family.
    #[default]
    Llama,
    Mistral,
    Mixtral,
    Qwen2,
    Qwen2Moe,
    Qwen3,
    Qwen3Moe,
    Gemma,
    Gemma2,
    #[serde(rename = "gemma3_text")]
    Gemma3,
    Olmo,
    Olmo2,
    Phi,
    Phi3,
    Gpt2,
    GptNeox,
    Opt,
    Falcon,
    Stablelm,
    Starcoder2,
    DeepseekV2,
    DeepseekV3,
    Glm4Moe,
    GptOss,
    #[serde(rename = "llama4_text")]
    Llama4,
    Smollm3,
    SeedOss,
    Olmo3,
    FalconH1,
    DeepseekV32,
    Exaone4,
    Apertus,
    MinimaxM2,
    Qwen3Next,
    #[serde(rename = "qwen3_5_text")]
    Qwen35Text,
    #[serde(rename = "qwen3_5_moe_text")]
    Qwen35MoeText,
    #[serde(rename = "granitemoehybrid")]
    GraniteMoeHybrid,
    KimiLinear,
}

impl Family {
    /// Every family, with its `model_type` and a name for people.
    pub const ALL: &'static [(Family, &'static str, &'static str)] = &[
        (Family::Llama, "llama", "Llama"),
        (Family::Mistral, "mistral", "Mistral"),
        (Family::Mixtral, "mixtral", "Mixtral"),
        (Family::Qwen2, "qwen2", "Qwen2"),
        (Family::Qwen2Moe, "qwen2_moe", "Qwen2-MoE"),
        (Family::Qwen3, "qwen3", "Qwen3"),
        (Family::Qwen3Moe, "qwen3_moe", "Qwen3-MoE"),
        (Family::Gemma, "gemma", "Gemma"),
        (Family::Gemma2, "gemma2", "Gemma 2"),
        (Family::Gemma3, "gemma3_text", "Gemma 3"),
        (Family::Olmo, "olmo", "OLMo"),
        (Family::Olmo2, "olmo2", "OLMo 2"),
        (Family::Phi, "phi", "Phi-1/2"),
        (Family::Phi3, "phi3", "Phi-3"),
        (Family::Gpt2, "gpt2", "GPT-2"),
        (Family::GptNeox, "gpt_neox", "GPT-NeoX"),
        (Family::Opt, "opt", "OPT"),
        (Family::Falcon, "falcon", "Falcon"),
        (Family::Stablelm, "stablelm", "StableLM"),
        (Family::Starcoder2, "starcoder2", "StarCoder2"),
        (Family::DeepseekV2, "deepseek_v2", "DeepSeek-V2"),
        (Family::DeepseekV3, "deepseek_v3", "DeepSeek-V3"),
        (Family::Glm4Moe, "glm4_moe", "GLM-4.5"),
        (Family::GptOss, "gpt_oss", "gpt-oss"),
        (Family::Llama4, "llama4_text", "Llama 4"),
        (Family::Smollm3, "smollm3", "SmolLM3"),
        (Family::SeedOss, "seed_oss", "Seed-OSS"),
        (Family::Olmo3, "olmo3", "OLMo 3"),
        (Family::FalconH1, "falcon_h1", "Falcon-H1"),
        (Family::DeepseekV32, "deepseek_v32", "DeepSeek-V3.2"),
        (Family::Exaone4, "exaone4", "EXAONE 4"),
        (Family::Apertus, "apertus", "Apertus"),
        (Family::MinimaxM2, "minimax_m2", "MiniMax-M2"),
        (Family::Qwen3Next, "qwen3_next", "Qwen3-Next"),
        (Family::Qwen35Text, "qwen3_5_text", "Qwen3.5"),
        (Family::Qwen35MoeText, "qwen3_5_moe_text", "Qwen3.5-MoE"),
        (Family::GraniteMoeHybrid, "granitemoehybrid", "Granite 4.0-H"),
        (Family::KimiLinear, "kimi_linear", "Kimi Linear"),
    ];

    /// The transformers `model_type` (`family=` in a link).
    pub fn model_type(self) -> &'static str {
        Self::ALL.iter().find(|(f, _, _)| *f == self).map_or("llama", |(_, t, _)| t)
    }

    /// The family's name for people ("Gemma 2").
    pub fn label(self) -> &'static str {
        Self::ALL.iter().find(|(f, _, _)| *f == self).map_or("Llama", |(_, _, l)| l)
    }

    /// The family of a (text) `model_type`.
    pub fn from_model_type(t: &str) -> Option<Family> {
        Self::ALL.iter().find(|(_, m, _)| *m == t).map(|(f, _, _)| *f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_reads_back_from_its_model_type_and_serializes_as_it() {
        for &(f, t, _) in Family::ALL {
            assert_eq!(Family::from_model_type(t), Some(f));
            assert_eq!(serde_json::to_value(f).ok(), Some(serde_json::Value::from(t)));
        }
        assert_eq!(Family::from_model_type("bert"), None);
    }
}
