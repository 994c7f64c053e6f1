//! The Hugging Face importer against real checkpoints' config.json files: every fixture's
//! parameter count and tensor count must equal what transformers itself builds from the same
//! file (tests/fixtures/hf/expected.json, counted on the meta device — see its README).

use serde_json::Value;
use std::path::Path;
use trainmem::estimator::hf::import_json;

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
    let types: Vec<String> = fixtures().iter().filter_map(|f| f["model_type"].as_str().map(String::from)).collect();
    for t in trainmem::estimator::hf::SUPPORTED {
        assert!(types.iter().any(|x| x == t), "no fixture for {t}");
    }
}

#[test]
fn presets_agree_with_their_checkpoints_config_json() {
    // A preset and the importer reading the same checkpoint's file describe the same model.
    for p in trainmem::estimator::presets::presets() {
        let file = format!("{}.json", p.id);
        let alt = format!("{}-hf.json", p.id);
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf");
        let name = if dir.join(&file).exists() { file } else { alt };
        let m = import_json(&read(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(m.spec.counts(), p.spec.counts(), "{}", p.id);
    }
}
