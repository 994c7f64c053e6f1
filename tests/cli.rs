//! The `trainmem` binary end to end.

use std::path::Path;
use std::process::Command;

fn trainmem(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_trainmem")).args(args).output().expect("the binary runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn estimate_with_a_tiny_hf_config_prints_the_activation_bytes_pytorch_saves() {
    // A llama with GQA as the validation harness built it; PyTorch saved 1,311,236 bytes for
    // batch 2, seq 64, bf16, sdpa (tests/fixtures/pytorch/records/llama-gqa.json,
    // llama-gqa/b2/s64/bf16/sdpa/ckpt0) — and RMSNorm models keep the same on CUDA and CPU.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let records: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("tests/fixtures/pytorch/records/llama-gqa.json")).expect("fixtures"))
            .expect("json");
    let rec = records["records"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["id"] == "llama-gqa/b2/s64/bf16/sdpa/ckpt0"))
        .expect("record")
        .clone();
    let cfg = &records["configs"][rec["config_key"].as_str().expect("key")];
    let dir = std::env::temp_dir().join(format!("trainmem-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let tiny = dir.join("tiny.json");
    std::fs::write(&tiny, cfg.to_string()).expect("write config");
    let (code, out, err) = trainmem(&[
        "estimate",
        "--hf-config",
        tiny.to_str().expect("utf-8 path"),
        "--batch",
        "2",
        "--seq",
        "64",
        "--precision",
        "bf16",
        "--attn",
        "sdpa",
        "--recompute",
        "none",
        "--dropout",
        "0",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json output");
    assert_eq!(v["memory"]["activations"], rec["saved_bytes"]);
    assert_eq!(v["parameter_count"], rec["parameter_count"]);
}

#[test]
fn a_bad_value_exits_non_zero_with_one_line_naming_the_key() {
    let (code, out, err) = trainmem(&["estimate", "--model", "llama-3.1-8b", "--zero", "4"]);
    assert_ne!(code, 0);
    assert!(out.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("`zero`") && err.contains("'4'"), "{err}");
}

#[test]
fn an_inconsistent_configuration_names_the_key() {
    let (code, _, err) = trainmem(&["estimate", "--gpus", "6", "--tp", "4"]);
    assert_eq!(code, 1);
    assert!(err.contains("`tp`"), "{err}");
}

#[test]
fn a_missing_hf_config_field_is_named() {
    let dir = std::env::temp_dir().join(format!("trainmem-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join("bad.json");
    std::fs::write(&p, r#"{"model_type": "llama", "vocab_size": 32000}"#).expect("write");
    let (code, _, err) = trainmem(&["estimate", "--hf-config", p.to_str().expect("utf-8")]);
    assert_eq!(code, 1);
    assert!(err.contains("hidden_size"), "{err}");
}

#[test]
fn presets_lists_every_preset_with_its_count() {
    let (code, out, _) = trainmem(&["presets", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let gpt2 = v.as_array().and_then(|a| a.iter().find(|p| p["id"] == "gpt2")).cloned();
    assert_eq!(gpt2.map(|p| p["parameter_count"].clone()), Some(serde_json::json!(124_439_808u64)));
}

#[test]
fn the_table_output_shows_formulas_and_the_verdict() {
    let (code, out, _) = trainmem(&["estimate", "--model", "llama-3.1-8b", "--seq", "4096"]);
    assert_eq!(code, 0);
    assert!(out.contains("Ψ_T × b_w"), "{out}");
    assert!(out.contains("Peak per GPU"));
    assert!(out.contains("fits") || out.contains("does not fit"));
}

#[test]
fn an_estimate_that_does_not_fit_names_the_commands_that_find_what_does_and_they_do() {
    // Llama 3.1 8B in full on one H100 at 4K: 145 GB in use.
    let flags = ["--model", "llama-3.1-8b", "--seq", "4096"];
    let (code, out, err) = trainmem(&[&["estimate"][..], &flags].concat());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("does not fit") && out.contains("`trainmem plan --fix` with the same flags"), "{out}");
    let (code, fixes, err) = trainmem(&[&["plan", "--fix"][..], &flags].concat());
    assert_eq!(code, 0, "{err}");
    assert!(fixes.starts_with("the cheapest single changes that make it fit"), "{fixes}");
}

#[test]
fn step_exports_every_event_with_allocated_and_reserved_bytes() {
    let (code, out, err) = trainmem(&["step", "--model", "gpt2", "--seq", "128"]);
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("index,kind,phase,layer,module,op,node,category,bytes,allocated_bytes,reserved_bytes"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert!(rows.len() > 500, "{} events", rows.len());
    // Reserved memory (simulated) never falls below what is allocated, event by event.
    for r in &rows {
        let (alloc, reserved): (u128, u128) = (r[9].parse().expect("allocated"), r[10].parse().expect("reserved"));
        assert!(reserved >= alloc, "{r:?}");
    }
    // The JSON names the peak and carries the same events.
    let (code, js, err) = trainmem(&["step", "--model", "gpt2", "--seq", "128", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&js).expect("json");
    assert_eq!(v["events"].as_array().map(Vec::len), Some(rows.len()));
    assert!(v["reserved_peak_bytes"].as_u64().expect("cuda") >= v["allocated_peak_bytes"].as_u64().expect("peak"));
}

/// What `trainmem estimate --json` reads back as its configuration.
fn query_of(args: &[&str]) -> String {
    let (code, out, err) = trainmem(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("json");
    doc["query"].as_str().expect("query").to_string()
}

#[test]
fn a_framework_file_or_a_share_link_is_estimated_directly_and_each_flag_wins_over_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let toml = root.join("tests/fixtures/frameworks/torchtitan/llama3_8b.toml");
    let toml = toml.to_str().expect("utf-8 path");
    // What `trainmem import` prints on its first line is what `--import` estimates.
    let (code, imported, err) = trainmem(&["import", toml]);
    assert_eq!(code, 0, "{err}");
    let query = imported.lines().next().expect("the query line").to_string();
    assert!(query.contains("recompute=op") && query.contains("framework=torchtitan"), "{query}");
    assert_eq!(query_of(&["estimate", "--import", toml, "--json"]), query);
    // The same query as a link (the page's own keys passed over), and a flag after it winning.
    let link = format!("https://example.org/trainmem/?{query}&view=seq&chart=log");
    assert_eq!(query_of(&["estimate", "--query", &link, "--json"]), query);
    let on_64 = query_of(&["estimate", &format!("--import={toml}"), "--gpus", "64", "--json"]);
    assert!(on_64.contains("gpus=64") && on_64.contains("recompute=op"), "{on_64}");
    // A flag wins wherever it stands (the file's recomputation is op-level SAC).
    let before = query_of(&["estimate", "--recompute", "full", "--import", toml, "--json"]);
    assert!(before.contains("recompute=full") && before.contains("framework=torchtitan"), "{before}");
    // The planner and the exporter take them too.
    let (code, out, err) =
        trainmem(&["export", "--format", "megatron", "--query", "model=llama-3.1-8b&recompute=full&recompute_layers=4&framework=megatron"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("--recompute-num-layers 4"), "{out}");
    // A file with a bad value: one error naming its file, line and key.
    let dir = std::env::temp_dir().join(format!("trainmem-cli-import-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[training]\nseq_len = \"long\"\n").expect("write");
    let (code, _, err) = trainmem(&["estimate", "--import", bad.to_str().expect("utf-8 path")]);
    assert_ne!(code, 0);
    assert!(err.contains("line 2") && err.contains("seq_len"), "{err}");
    let (code, _, err) = trainmem(&["estimate", "--query"]);
    assert_ne!(code, 0);
    assert!(err.contains("--query needs a value"), "{err}");
}
