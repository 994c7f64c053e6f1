//! Issue 27's keys end to end: `fp8`, `fp8_allgather`, `fp8_recompute_weight`,
//! `fp8_model_init`, `qlora_quant`, `load`, `empty_cache` through the URL and the CLI, and the
//! loading's figures in `estimate --json` (`memory.load_peak`, `memory.step_reserved_peak`).

use serde_json::Value;
use trainmem::config::{decode_query, encode_query, find_key};

/// Each key with every value the issue names.
const VALUES: &[(&str, &[&str])] = &[
    ("fp8", &["none", "torchao-tensorwise", "torchao-rowwise", "te-delayed", "te-current", "te-mxfp8"]),
    ("fp8_allgather", &["true", "false"]),
    ("fp8_recompute_weight", &["true", "false"]),
    ("fp8_model_init", &["true", "false"]),
    ("qlora_quant", &["nf4", "gptq"]),
    ("load", &["from-pretrained", "quantize-on-load", "meta-sharded", "zero-init"]),
    ("empty_cache", &["true", "false"]),
];

/// A configuration in which `key=value` is valid (each recipe where its code runs).
fn query(key: &str, value: &str) -> String {
    let base = "model=llama-3.1-8b&seq=2048";
    let extra = match (key, value) {
        ("fp8", "te-mxfp8") => "&gpu=b200&precision=mixed-bf16",
        ("fp8", _) => "&precision=mixed-bf16",
        ("fp8_allgather", _) => "&fp8=torchao-tensorwise&gpus=8&zero=full_shard",
        ("fp8_recompute_weight", _) => "&fp8=torchao-tensorwise",
        ("fp8_model_init", _) => "&fp8=te-delayed&precision=mixed-bf16",
        ("qlora_quant", _) => "&finetune=qlora",
        ("load", "quantize-on-load") => "&finetune=qlora",
        ("load", "meta-sharded") => "&gpus=8&zero=full_shard",
        ("load", "zero-init") => "&gpus=8&zero=3",
        _ => "",
    };
    format!("{base}{extra}&{key}={value}")
}

#[test]
fn every_issue_27_key_round_trips_through_the_url_with_each_of_its_values() {
    for (key, values) in VALUES {
        assert!(find_key(key).is_some(), "{key} is a key");
        for value in *values {
            let q = query(key, value);
            let d = decode_query(&q);
            assert!(d.errors.is_empty(), "{q}: {:?}", d.errors);
            let encoded = encode_query(&d.config);
            let again = decode_query(&encoded);
            assert_eq!(again.config, d.config, "{q} → {encoded}");
            assert!(again.errors.is_empty(), "{encoded}: {:?}", again.errors);
            let default = find_key(key).map(|k| (k.get)(&trainmem::config::Config::default())).unwrap_or_default();
            if *value != default {
                assert!(encoded.contains(&format!("{key}={value}")), "{key}={value} missing from {encoded}");
            }
        }
    }
}

#[test]
fn a_value_the_issue_does_not_name_is_refused_naming_its_key() {
    for (key, bad) in [("fp8", "fp4"), ("qlora_quant", "awq8"), ("load", "lazy"), ("empty_cache", "maybe"), ("fp8_allgather", "2")] {
        let d = decode_query(&format!("{key}={bad}"));
        assert_eq!(d.errors.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), [key], "{key}={bad}");
    }
}

#[test]
fn a_recipe_where_its_code_does_not_run_is_refused_naming_its_key() {
    for (q, key) in [
        ("fp8=te-mxfp8&gpu=h100", "fp8"),
        ("fp8_allgather=true&fp8=torchao-rowwise&gpus=8&zero=full_shard", "fp8_allgather"),
        ("fp8_model_init=true&fp8=torchao-tensorwise", "fp8_model_init"),
        ("load=quantize-on-load", "load"),
        ("load=zero-init", "load"),
    ] {
        let d = decode_query(&format!("model=llama-3.1-8b&{q}"));
        assert!(d.errors.iter().any(|e| e.key == key), "{q}: {:?}", d.errors);
    }
}

fn estimate_json(args: &str) -> Value {
    let args: Vec<String> = format!("estimate --model llama-3.1-8b {args} --json").split_whitespace().map(String::from).collect();
    let mut out = Vec::new();
    trainmem::cli::run(&args, &mut out).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    serde_json::from_slice(&out).unwrap_or(Value::Null)
}

#[test]
fn the_json_reports_the_loading_peak_beside_the_steps_and_the_runs_reserved_peak_covers_both() {
    for args in
        ["--seq 2048", "--finetune qlora --load quantize-on-load --seq 512", "--fp8 torchao-rowwise --seq 2048 --precision mixed-bf16"]
    {
        let v = estimate_json(args);
        let m = &v["memory"];
        let (load, step, run) = (m["load_peak"].as_u64(), m["step_reserved_peak"].as_u64(), m["reserved_peak"].as_u64());
        let (Some(load), Some(step), Some(run)) = (load, step, run) else { panic!("{args}: {m}") };
        assert!(load > 0 && step > 0, "{args}: {m}");
        assert!(run >= step, "{args}: the run's reserved peak {run} < the step's {step}");
        assert!(run >= m["load_reserved_peak"].as_u64().unwrap_or(0), "{args}: {m}");
    }
}

#[test]
fn the_cli_takes_each_key_as_a_flag() {
    let v = estimate_json("--finetune qlora --qlora_quant gptq --empty_cache true --load from-pretrained");
    assert_eq!(v["query"].as_str().map(|q| q.contains("qlora_quant=gptq") && q.contains("empty_cache=true")), Some(true), "{}", v["query"]);
    let f = estimate_json("--fp8 torchao-tensorwise --fp8_recompute_weight true --precision mixed-bf16");
    assert_eq!(
        f["query"].as_str().map(|q| q.contains("fp8=torchao-tensorwise") && q.contains("fp8_recompute_weight=true")),
        Some(true),
        "{}",
        f["query"]
    );
}
