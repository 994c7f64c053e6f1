//! The Hugging Face importer against real checkpoints' config.json files: every fixture's
//! parameter count and tensor count must equal what transformers itself builds from the same
//! file (tests/fixtures/hf/expected.json, counted on the meta device — see its README).

use serde_json::Value;
use std::path::Path;
use trainmem::estimator::hf::import_json;
use trainmem::estimator::hf_fields::python_json;

fn fixtures() -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf");
    let text = std::fs::read_to_string(dir.join("expected.json")).expect("expected.json is committed");
    serde_json::from_str::<Vec<Value>>(&text).expect("expected.json is a list")
}

fn read(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_fixture_imports_to_the_parameter_count_transformers_builds() {
    let mut failures = Vec::new();
    let all = fixtures();
    assert!(all.len() >= 40, "fixtures for every preset and model_type");
    for f in &all {
        let file = f["file"].as_str().unwrap_or_default();
        let want = f["parameter_count"].as_u64();
        match import_json(&read(file)) {
            Ok(m) => {
                let got = m.spec.counts().total;
                if Some(got) != want {
                    failures.push(format!("{file}: counted {got}, transformers says {want:?}"));
                }
            }
            Err(e) => failures.push(format!("{file}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_fixture_has_the_tensor_count_adamw_keeps_a_step_for() {
    let mut failures = Vec::new();
    for f in fixtures() {
        let file = f["file"].as_str().unwrap_or_default();
        let want = f["parameter_tensors"].as_u64();
        if let Ok(m) = import_json(&read(file)) {
            let got = m.spec.counts().tensors;
            if Some(got) != want {
                failures.push(format!("{file}: {got} tensors, transformers has {want:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn published_counts_are_matched_exactly() {
    for f in fixtures() {
        if let Some(published) = f["published_count"].as_u64() {
            let file = f["file"].as_str().unwrap_or_default();
            let got = import_json(&read(file)).map(|m| m.spec.counts().total);
            assert_eq!(got, Ok(published), "{file}");
        }
    }
}

#[test]
fn every_supported_model_type_has_a_fixture() {
    // A fixture's model_type, or the text model type inside a multimodal wrapper's text_config.
    let mut types: Vec<String> = Vec::new();
    for f in fixtures() {
        types.extend(f["model_type"].as_str().map(String::from));
        // Read as the importer reads it: Python's `json` writes `Infinity` (Falcon-H1's time_step_limit).
        let text = python_json(&read(f["file"].as_str().unwrap_or_default())).expect("fixture is Python's JSON");
        let file: Value = serde_json::from_str(&text).expect("fixture is JSON");
        types.extend(file["text_config"]["model_type"].as_str().map(String::from));
    }
    for t in trainmem::estimator::hf::SUPPORTED.iter() {
        assert!(types.iter().any(|x| x == t), "no fixture for {t}");
    }
}

#[test]
fn every_multimodal_fixture_counts_the_text_model_and_says_what_it_leaves_out() {
    for f in fixtures().iter().filter(|f| f["counted"].as_str().is_some_and(|c| c.starts_with("the text model only"))) {
        let file = f["file"].as_str().unwrap_or_default();
        let m = import_json(&read(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(m.notes.first().is_some_and(|n| n.contains("vision tower") && n.contains("not")), "{file}: {:?}", m.notes);
    }
}

#[test]
fn mtp_layers_and_quantized_checkpoints_are_stated_not_silently_dropped() {
    let v3 = import_json(&read("deepseek-v3.json")).expect("DeepSeek-V3 imports");
    assert!(v3.notes.iter().any(|n| n.contains("multi-token-prediction") && n.contains("not counted")), "{:?}", v3.notes);
    assert!(v3.notes.iter().any(|n| n.contains("fp8")), "{:?}", v3.notes);
    let oss = import_json(&read("gpt-oss-20b.json")).expect("gpt-oss imports");
    assert!(oss.notes.iter().any(|n| n.contains("MXFP4") && n.contains("bf16")), "{:?}", oss.notes);
    let air = import_json(&read("glm-4.5-air.json")).expect("GLM-4.5-Air imports");
    assert!(air.notes.iter().any(|n| n.contains("multi-token-prediction")), "{:?}", air.notes);
    // Kimi K2 has no MTP layer (num_nextn_predict_layers 0): no such note.
    let kimi = import_json(&read("kimi-k2-instruct.json")).expect("Kimi K2 imports");
    assert!(!kimi.notes.iter().any(|n| n.contains("multi-token-prediction")), "{:?}", kimi.notes);
    assert!(kimi.notes.iter().any(|n| n.contains("deepseek_v3")), "{:?}", kimi.notes);
}

#[test]
fn the_mistral_small_wrapper_whose_class_would_tie_the_head_is_said_to_differ() {
    // Mistral3Config defaults tie_word_embeddings to true; the text model and the checkpoint
    // (24,011,361,280 parameters with the vision tower) keep a separate lm_head.
    let m = import_json(&read("mistral-small-3.1-24b-instruct-2503.json")).expect("Mistral-Small-3.1 imports");
    assert!(!m.spec.tied);
    assert!(m.notes.iter().any(|n| n.contains("tied to the embedding")), "{:?}", m.notes);
}

#[test]
fn presets_agree_with_their_checkpoints_config_json() {
    // A preset and the importer reading the same checkpoint's file describe the same model.
    let mut failures = Vec::new();
    for p in trainmem::estimator::presets::presets() {
        let file = format!("{}.json", p.id);
        let alt = format!("{}-hf.json", p.id);
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf");
        let name = if dir.join(&file).exists() { file } else { alt };
        let m = import_json(&read(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        if m.spec != p.spec {
            let (a, b) = (serde_json::to_value(&p.spec).unwrap_or_default(), serde_json::to_value(&m.spec).unwrap_or_default());
            let keys: Vec<String> = a
                .as_object()
                .map(|o| {
                    o.iter()
                        .filter(|(k, v)| b.get(k.as_str()) != Some(*v))
                        .map(|(k, v)| format!("{k}: preset {v}, import {}", b[k]))
                        .collect()
                })
                .unwrap_or_default();
            failures.push(format!("{}: {}", p.id, keys.join("; ")));
        }
        // A preset that leaves something out of its checkpoint says so, as the importer does.
        if p.notes.is_empty() != m.notes.iter().all(|n| n.starts_with("absent from config.json")) {
            failures.push(format!("{}: preset notes {:?}, import notes {:?}", p.id, p.notes, m.notes));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_imported_model_survives_a_share_link() {
    // Every architecture field has a key: the URL of an imported model decodes to the same model.
    let mut failures = Vec::new();
    for f in fixtures() {
        let file = f["file"].as_str().unwrap_or_default();
        let Ok(m) = import_json(&read(file)) else { continue };
        let mut cfg = trainmem::config::Config::default();
        trainmem::config::apply_import(&mut cfg, &m);
        let query = trainmem::config::encode_query(&cfg);
        let back = trainmem::config::decode_query(&query);
        if back.config.arch != m.spec || !back.errors.is_empty() {
            failures.push(format!("{file}: {query} -> {:?}", back.errors));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn qwen3_next_reads_its_gated_deltanet_layers_from_layer_types() {
    let config = |types: &str| {
        format!(
            r#"{{"model_type": "qwen3_next", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 176,
                "layer_types": {types}, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                "linear_key_head_dim": 16, "linear_value_head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                "moe_intermediate_size": 40, "shared_expert_intermediate_size": 40, "partial_rotary_factor": 0.25}}"#
        )
    };
    let imported = import_json(&config(r#"["linear_attention", "full_attention"]"#)).expect("qwen3_next imports");
    let m = &imported.spec;
    assert_eq!((m.linear_attention_layers(), m.attention_layers()), (1, 1));
    assert_eq!(m.gdn.conv_dim(), 128);
    assert!(m.attn_gate);
    assert_eq!(m.counts().total, 239_608, "the measured tiny model's parameters (validation/ qwen3_next records)");
    let err = import_json(&config(r#"["linear_attention", "sliding_attention"]"#)).err();
    assert_eq!(err.as_ref().and_then(|e| e.key()), Some("layer_types"));
}

#[test]
fn the_recurrent_state_dtype_a_checkpoint_names_is_read() {
    use trainmem::estimator::model::StateDtype;
    // Qwen3.5's config.json names `"mamba_ssm_dtype": "float32"` in its text_config; Qwen3-Next's,
    // Falcon-H1's and Granite 4.0-H's name none.
    for (file, want) in [
        ("qwen3.5-27b.json", StateDtype::Float32),
        ("qwen3.5-35b-a3b.json", StateDtype::Float32),
        ("qwen3-next-80b-a3b-thinking.json", StateDtype::Auto),
        ("falcon-h1-0.5b-instruct.json", StateDtype::Auto),
        ("granite-4.0-h-tiny.json", StateDtype::Auto),
    ] {
        let m = import_json(&read(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(m.spec.ssm_dtype, want, "{file}");
    }
    // Falcon-H1 reads the key alike; a value no engine takes names the key.
    let text = python_json(&read("falcon-h1-0.5b-instruct.json")).unwrap_or_default();
    let mut falcon: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    falcon["mamba_ssm_dtype"] = "bfloat16".into();
    let m = import_json(&falcon.to_string()).expect("falcon_h1 imports");
    assert_eq!(m.spec.ssm_dtype, StateDtype::Bfloat16);
    falcon["mamba_ssm_dtype"] = "float8".into();
    let err = import_json(&falcon.to_string()).err();
    assert_eq!(err.as_ref().and_then(|e| e.key()), Some("mamba_ssm_dtype"));
}
