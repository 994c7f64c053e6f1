//! Model names as the frameworks write them, and trainmem's presets they stand for.

use crate::estimator::presets::presets;

/// A preset for a Hugging Face repository id or a path ending in one
/// (`NousResearch/Meta-Llama-3-8B`, `checkpoints/meta-llama/Meta-Llama-3.1-8B`): the preset
/// whose checkpoint has the same model name, compared without case, `Meta-` and
/// `-Instruct`/`-hf`; Llama 3 (not 3.1) names map to the Llama 3.1 preset of their size, whose
/// shapes are the same. Returns the preset id and a note when the match is not exact.
pub fn by_repo(id: &str) -> Option<(&'static str, Option<&'static str>)> {
    let name = id.trim().trim_end_matches('/').rsplit('/').next()?.to_ascii_lowercase();
    let norm = |s: &str| {
        let s = s.to_ascii_lowercase();
        let s = s.strip_prefix("meta-").unwrap_or(&s).to_string();
        s.trim_end_matches("-instruct").trim_end_matches("-hf").trim_end_matches("-base").to_string()
    };
    let want = norm(&name);
    for p in presets() {
        let have = norm(p.checkpoint.rsplit('/').next().unwrap_or(""));
        if have == want || p.id == want {
            return Some((p.id, None));
        }
    }
    let llama3 = [("llama-3-8b", "llama-3.1-8b"), ("llama-3-70b", "llama-3.1-70b")];
    llama3
        .iter()
        .find(|(n, _)| want == *n)
        .map(|(_, id)| (*id, Some("Llama 3 has the same shapes as Llama 3.1 (only the rotary scaling and context length differ)")))
}

/// torchtune's model builders (`torchtune.models.llama3_1.lora_llama3_1_8b`): the preset of the
/// base builder, and whether the builder is a LoRA or QLoRA one.
pub fn torchtune_builder(component: &str) -> Option<(&'static str, Tuning)> {
    let name = component.trim().rsplit('.').next()?;
    let (base, tuning) = if let Some(b) = name.strip_prefix("qlora_") {
        (b, Tuning::Qlora)
    } else if let Some(b) = name.strip_prefix("lora_") {
        (b, Tuning::Lora)
    } else {
        (name, Tuning::Full)
    };
    let base = base.trim_end_matches("_instruct").trim_end_matches("_base");
    let id = TORCHTUNE.iter().find(|(b, _)| *b == base)?.1;
    Some((id, tuning))
}

/// torchtune builder (without `lora_`/`qlora_` and `_base`/`_instruct`) → preset.
pub const TORCHTUNE: &[(&str, &str)] = &[
    ("llama2_7b", "llama-2-7b"),
    ("llama2_13b", "llama-2-13b"),
    ("llama2_70b", "llama-2-70b"),
    ("llama3_8b", "llama-3.1-8b"),
    ("llama3_70b", "llama-3.1-70b"),
    ("llama3_1_8b", "llama-3.1-8b"),
    ("llama3_1_70b", "llama-3.1-70b"),
    ("llama3_1_405b", "llama-3.1-405b"),
    ("llama3_2_1b", "llama-3.2-1b"),
    ("llama3_2_3b", "llama-3.2-3b"),
    ("mistral_7b", "mistral-7b-v0.1"),
    ("qwen2_5_0_5b", "qwen2.5-0.5b"),
    ("qwen2_5_7b", "qwen2.5-7b"),
    ("qwen2_5_72b", "qwen2.5-72b"),
    ("qwen3_0_6b", "qwen3-0.6b"),
    ("qwen3_1_7b", "qwen3-1.7b"),
    ("qwen3_4b", "qwen3-4b"),
    ("qwen3_8b", "qwen3-8b"),
    ("qwen3_14b", "qwen3-14b"),
    ("qwen3_32b", "qwen3-32b"),
    ("gemma2_2b", "gemma-2-2b"),
    ("gemma2_9b", "gemma-2-9b"),
    ("gemma2_27b", "gemma-2-27b"),
    ("phi3_mini", "phi-3-mini-4k-instruct"),
    ("phi4", "phi-4"),
];

/// The torchtune builder a preset is exported as (`module.builder`, the full-model builder; LoRA
/// builders add `lora_` to its last part).
pub fn torchtune_export(preset: &str) -> Option<String> {
    let base = TORCHTUNE.iter().rev().find(|(_, id)| *id == preset)?.0;
    let module = match base {
        b if b.starts_with("llama3_1") => "llama3_1",
        b if b.starts_with("llama3_2") => "llama3_2",
        b if b.starts_with("llama3") => "llama3",
        b if b.starts_with("llama2") => "llama2",
        b if b.starts_with("qwen2_5") => "qwen2_5",
        b if b.starts_with("qwen3") => "qwen3",
        b if b.starts_with("gemma2") => "gemma2",
        b if b.starts_with("mistral") => "mistral",
        b if b.starts_with("phi3") => "phi3",
        _ => "phi4",
    };
    let suffix = if module == "qwen2_5" || module == "qwen3" { "_instruct" } else { "" };
    Some(format!("torchtune.models.{module}.{base}{suffix}"))
}

/// The kind of model a builder makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tuning {
    Full,
    Lora,
    Qlora,
}

/// torchtitan's (model.name, model.flavor) → preset.
pub const TORCHTITAN: &[(&str, &str, &str)] = &[
    ("llama3", "8B", "llama-3.1-8b"),
    ("llama3", "70B", "llama-3.1-70b"),
    ("llama3", "405B", "llama-3.1-405b"),
    ("qwen3", "0.6B", "qwen3-0.6b"),
    ("qwen3", "1.7B", "qwen3-1.7b"),
    ("qwen3", "4B", "qwen3-4b"),
    ("qwen3", "8B", "qwen3-8b"),
    ("qwen3", "14B", "qwen3-14b"),
    ("qwen3", "32B", "qwen3-32b"),
    ("qwen3", "30B-A3B", "qwen3-30b-a3b"),
    ("qwen3", "235B-A22B", "qwen3-235b-a22b"),
    ("llama4", "17bx16e", "llama-4-scout-17b-16e-instruct"),
    ("llama4", "17bx128e", "llama-4-maverick-17b-128e-instruct"),
    ("deepseek_v3", "16B", "deepseek-v2-lite"),
    ("deepseek_v3", "671B", "deepseek-v3"),
];

/// The preset whose shapes are these (Megatron's arguments name shapes, not checkpoints):
/// vocabulary, hidden, layers, heads, key/value heads, MLP size.
pub fn by_shape(vocab: u64, hidden: u64, layers: u64, heads: u64, kv_heads: u64, ffn: u64) -> Option<&'static str> {
    presets()
        .into_iter()
        .find(|p| {
            let s = &p.spec;
            (s.vocab, s.hidden, s.layers, s.heads, s.kv_heads, s.ffn) == (vocab, hidden, layers, heads, kv_heads, ffn) && s.experts == 0
        })
        .map(|p| p.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_names_find_their_presets() {
        assert_eq!(by_repo("meta-llama/Llama-3.1-8B"), Some(("llama-3.1-8b", None)));
        assert_eq!(by_repo("checkpoints/meta-llama/Meta-Llama-3.1-8B").map(|p| p.0), Some("llama-3.1-8b"));
        assert_eq!(by_repo("NousResearch/Meta-Llama-3-8B").map(|p| p.0), Some("llama-3.1-8b"));
        assert_eq!(by_repo("Qwen/Qwen2.5-7B-Instruct").map(|p| p.0), Some("qwen2.5-7b"));
        assert_eq!(by_repo("someone/my-model"), None);
    }

    #[test]
    fn every_table_names_an_existing_preset() {
        let ids: Vec<&str> = presets().iter().map(|p| p.id).collect();
        for (_, id) in TORCHTUNE {
            assert!(ids.contains(id), "{id}");
        }
        for (_, _, id) in TORCHTITAN {
            assert!(ids.contains(id), "{id}");
        }
    }

    #[test]
    fn torchtune_builders_name_the_model_and_the_tuning() {
        assert_eq!(torchtune_builder("torchtune.models.llama3_1.qlora_llama3_1_8b"), Some(("llama-3.1-8b", Tuning::Qlora)));
        assert_eq!(torchtune_builder("torchtune.models.qwen2_5.qwen2_5_7b_instruct"), Some(("qwen2.5-7b", Tuning::Full)));
        assert_eq!(torchtune_builder("torchtune.models.clip.clip_vision_encoder"), None);
    }

    #[test]
    fn llama_shapes_find_the_llama_preset() {
        assert_eq!(by_shape(128_256, 4096, 32, 32, 8, 14_336), Some("llama-3.1-8b"));
    }
}
