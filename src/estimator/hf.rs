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
//!
//! This file is the flow: the `model_type` names a family ([`Family::from_model_type`], or one of
//! a family's aliases or multimodal wrappers), whose `Modeling::import` reads the keys
//! (`step/families/<family>.rs`) with the shared readers of [`hf_fields`](crate::estimator::hf_fields).

use super::family::Family;
use super::model::ModelSpec;
use super::step::families::config_file;
use serde_json::Value;
use std::sync::LazyLock;

pub use crate::estimator::hf_fields::{Fields, HfError};

/// The `model_type`s the importer reads, family by family (`Family::ALL`'s order): each
/// family's own, its aliases, and the multimodal wrappers of its language model.
pub static SUPPORTED: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    let mut v = Vec::new();
    for &(f, t, _) in Family::ALL {
        let code = config_file(f);
        v.push(t);
        v.extend(code.aliases());
        v.extend(code.wrappers());
    }
    v
});

/// Multimodal checkpoints whose language model (`text_config`) is imported, with the text model
/// type their `text_config` defaults to (the family whose `Modeling::wrappers` names them). The
/// vision tower and projector are not counted, and the import says so.
pub static MULTIMODAL: LazyLock<Vec<(&'static str, &'static str)>> =
    LazyLock::new(|| Family::ALL.iter().flat_map(|&(f, t, _)| config_file(f).wrappers().iter().map(move |&w| (w, t))).collect());

/// Model types refused on purpose, with the reason (none today).
pub const REFUSED: &[(&str, &str)] = &[];

/// The family whose code reads `model_type`: its own, or one of its aliases.
pub fn family_of(model_type: &str) -> Option<Family> {
    Family::from_model_type(model_type)
        .or_else(|| Family::ALL.iter().map(|&(f, _, _)| f).find(|&f| config_file(f).aliases().contains(&model_type)))
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

/// Parses a config.json text, as Python's `json` writes it (`Infinity`, `-Infinity` and `NaN`
/// included: [`crate::estimator::hf_fields::python_json`]).
pub fn import_json(text: &str) -> Result<Imported, HfError> {
    let v: Value = serde_json::from_str(&crate::estimator::hf_fields::python_json(text)?).map_err(|e| HfError::Json(e.to_string()))?;
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
    // The family is the model type's: decided here, once (Kimi K2 is DeepSeek-V3's code).
    let family =
        family_of(&model_type).ok_or_else(|| HfError::Unsupported { model_type: model_type.clone(), supported: SUPPORTED.join(", ") })?;
    let mut notes = Vec::new();
    let mut spec = config_file(family).import(&model_type, &f, &mut notes)?;
    spec.family = family;
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

    /// Real Falcon-H1 and Granite-4 files carry `time_step_limit: [0.0, Infinity]`, as Python's
    /// `json` writes it; a config with Python's three non-finite numbers imports like one
    /// without them, and any other non-standard number is refused naming its key.
    #[test]
    fn python_infinity_and_nan_import_and_other_bare_numbers_are_refused_naming_the_key() {
        let base = r#""model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 6"#;
        let plain = import_json(&format!("{{{base}}}")).map(|m| m.spec);
        let python = format!(r#"{{{base}, "time_step_limit": [0.0, Infinity], "lo": -Infinity, "x": {{"y": NaN}}, "s": "NaN: Infinity"}}"#);
        assert_eq!(import_json(&python).map(|m| m.spec), plain);
        let v: Value = serde_json::from_str(&crate::estimator::hf_fields::python_json(&python).expect("reads")).expect("standard JSON");
        assert_eq!(v["time_step_limit"][1], "Infinity");
        assert_eq!(v["s"], "NaN: Infinity", "strings are left as they are");
        assert_eq!(crate::estimator::hf_fields::python_float("-Infinity"), Some(f64::NEG_INFINITY));
        for (bad, key) in [("0x10", "hidden_act"), ("inf", "time_step_limit"), ("1.", "rope_theta"), ("+1", "rope_theta"), (".5", "a")] {
            let json = format!(r#"{{{base}, "{key}": [1, {bad}]}}"#);
            let err = import_json(&json).err();
            assert_eq!(err, Some(HfError::BadNumber { key: key.to_string(), token: bad.to_string() }), "{json}");
            assert!(err.map(|e| e.to_string()).is_some_and(|s| s.contains(&format!("`{key}`"))));
        }
    }

    /// Granite 4.0-H's file (Python's `Infinity` in `time_step_limit`, Hub `layer_types`
    /// "mamba"/"attention") imports as its family, its Mamba-2 mixer on the "mamba" layers only.
    #[test]
    fn granite_4_imports_with_its_mamba_layers_and_python_infinity() {
        let json = r#"{"model_type": "granitemoehybrid", "time_step_limit": [0.0, Infinity], "hidden_size": 64,
            "num_hidden_layers": 3, "num_attention_heads": 4, "layer_types": ["mamba", "attention", "mamba"],
            "mamba_n_heads": 8, "position_embedding_type": "nope"}"#;
        let spec = import_json(json).map(|m| m.spec).expect("imports");
        assert_eq!(spec.family, crate::estimator::family::Family::GraniteMoeHybrid);
        assert_eq!((spec.ssm.heads, spec.ssm.head_dim, spec.ssm_layers(), spec.attention_layers()), (8, 16, 2, 1));
        let rope = json.replace(r#""nope""#, r#""rope""#);
        assert_eq!(import_json(&rope).err().as_ref().and_then(HfError::key), Some("position_embedding_type"));
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

    /// Every mix of Python's non-finite numbers, JSON's own values and malformed numbers, in
    /// any of a key's value positions: Python's read as floats, anything else refused naming
    /// the key, never a panic.
    #[test]
    fn non_standard_numbers_anywhere_in_a_config_are_read_or_refused_by_key() {
        let tokens = ["Infinity", "-Infinity", "NaN", "0.0", "-1e5", "true", "null", "inf", "nan", "1.", "-", "Infinityx", "0x1F", "+2"];
        let python = |t: &str| crate::estimator::hf_fields::python_float(t).is_some();
        let json_ok = |t: &str| serde_json::from_str::<Value>(t).is_ok();
        for a in tokens {
            for b in tokens {
                for (form, used) in
                    [(a.to_string(), vec![a]), (format!("[{a}, {b}]"), vec![a, b]), (format!(r#"{{"lo": {a}, "hi": [{b}]}}"#), vec![a, b])]
                {
                    let text = format!(r#"{{"model_type": "llama", "vocab_size": 10, "time_step_limit": {form}}}"#);
                    let standard = used.iter().all(|t| python(t) || json_ok(t));
                    match crate::estimator::hf_fields::python_json(&text) {
                        Ok(out) => {
                            assert!(standard, "{text}");
                            assert!(serde_json::from_str::<Value>(&out).is_ok(), "{text} -> {out}");
                        }
                        Err(HfError::BadNumber { key, token }) => {
                            assert!(!python(&token) && !json_ok(&token), "{text}: {token}");
                            assert!(["time_step_limit", "lo", "hi"].contains(&key.as_str()), "{text}: {key}");
                        }
                        Err(e) => panic!("{text}: {e}"),
                    }
                }
            }
        }
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
