//! Fuzzing the two doors user text comes through: the share-URL decoder (and the CLI's
//! `--query`, which reads the same links) and the config.json importer. Whatever comes in, decoding never panics, always yields a configuration the
//! estimator accepts, and estimating it never panics or overflows.
//!
//! The normal test run tries a few thousand inputs; the full run is outside it:
//! `cargo test --release --test fuzz -- --ignored` (TRAINMEM_FUZZ_CASES, default 1,000,000).

use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use serde_json::{json, Value};
use trainmem::config::{decode_query, encode_query, KEYS};
use trainmem::estimator::EstimateError;
use trainmem::estimator::{estimate, hf};

/// Query strings: random key/value pairs, biased towards real keys with hostile values.
fn query() -> impl Strategy<Value = String> {
    let keys: Vec<String> = KEYS.iter().map(|k| k.name.to_string()).chain(["embed", "view", "", "%", "✓"].map(String::from)).collect();
    let value = prop_oneof![
        "[0-9]{1,30}",
        "-?[0-9]{1,5}(\\.[0-9]{1,5})?[kKmM]?",
        "\\PC{0,12}",
        prop::sample::select(vec!["true", "false", "NaN", "inf", "-0", "1e308", "0x10", "%", "%%", "%E2%9C", "+", "all", "custom", "fsdp"])
            .prop_map(String::from),
    ];
    let pair = (prop::sample::select(keys), value).prop_map(|(k, v)| format!("{k}={v}"));
    prop_oneof![
        4 => prop::collection::vec(pair, 0..12).prop_map(|v| v.join("&")),
        1 => "\\PC{0,80}",
        1 => prop::collection::vec(any::<u8>(), 0..60).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

/// config.json objects: real model types with random, often wrong, fields.
fn hf_config() -> impl Strategy<Value = Value> {
    let number = prop_oneof![
        (0u64..100_000).prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        Just(json!(null)),
        Just(json!("12")),
        Just(json!([1, 2])),
        Just(json!(true)),
    ];
    let fields = [
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "n_embd",
        "n_layer",
        "n_head",
        "n_inner",
        "ffn_dim",
        "word_embed_proj_dim",
        "num_local_experts",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "decoder_sparse_step",
        "max_position_embeddings",
        "partial_rotary_factor",
    ];
    let flags = [
        "tie_word_embeddings",
        "attention_bias",
        "mlp_bias",
        "new_decoder_architecture",
        "multi_query",
        "parallel_attn",
        "qk_layernorm",
        "use_parallel_residual",
        "alibi",
        "bias",
    ];
    let types: Vec<&str> = hf::SUPPORTED.iter().copied().chain(["bert", "", "gemma3"]).collect();
    (
        prop::sample::select(types),
        prop::collection::vec((prop::sample::select(fields.to_vec()), number), 0..16),
        prop::collection::vec((prop::sample::select(flags.to_vec()), any::<bool>()), 0..4),
        prop::sample::select(vec![json!(null), json!([]), json!(["0", 1]), json!([1, 3, 99])]),
    )
        .prop_map(|(t, nums, bools, mlp_only)| {
            let mut m = serde_json::Map::new();
            m.insert("model_type".into(), json!(t));
            for (k, v) in nums {
                m.insert(k.into(), v);
            }
            for (k, v) in bools {
                m.insert(k.into(), json!(v));
            }
            m.insert("mlp_only_layers".into(), mlp_only);
            Value::Object(m)
        })
}

fn check_query(q: &str) -> Result<(), TestCaseError> {
    let d = decode_query(q);
    let e = estimate(&d.config);
    // A decoded link is always consistent; the only refusal left is an architecture whose
    // activations are not modelled yet, and that refusal names the feature.
    prop_assert!(e.is_ok() || matches!(e, Err(EstimateError::Unmodelled { .. })), "decoded config rejected: {:?} from {q:?}", e.err());
    // What the page writes back decodes to the same configuration, without complaint.
    let again = decode_query(&encode_query(&d.config));
    prop_assert_eq!(&again.config, &d.config);
    prop_assert!(again.errors.is_empty(), "{:?}", again.errors);
    // The CLI's `--query` reads the same link: never a panic, and a link the decoder takes
    // without complaint is the same configuration there.
    if let Ok(args) = trainmem::cli::expand_sources(&["--query".to_string(), q.to_string()]) {
        if let (Ok((cfg, _)), true) = (trainmem::cli::parse_estimate_args(&args), d.errors.is_empty()) {
            prop_assert_eq!(&cfg, &d.config, "from {:?}", q);
        }
    }
    Ok(())
}

fn check_hf(v: &Value) -> Result<(), TestCaseError> {
    if let Ok(m) = hf::import_value(v) {
        let mut c = trainmem::config::Config::default();
        trainmem::config::apply_import(&mut c, &m);
        let counts = m.spec.counts();
        prop_assert!(counts.total >= counts.active);
        // Whatever imported, the estimator either estimates it or names the key.
        if let Err(e) = estimate(&c) {
            prop_assert!(!e.key().is_empty());
        }
    }
    // The text path too.
    let _ = hf::import_json(&v.to_string());
    Ok(())
}

fn run(cases: u32) -> u32 {
    let mut runner = TestRunner::new(RunnerConfig { cases, failure_persistence: None, ..RunnerConfig::default() });
    runner.run(&query(), |q| check_query(&q)).unwrap_or_else(|e| panic!("URL decoder: {e}"));
    let mut runner = TestRunner::new(RunnerConfig { cases, failure_persistence: None, ..RunnerConfig::default() });
    runner.run(&hf_config(), |v| check_hf(&v)).unwrap_or_else(|e| panic!("config.json importer: {e}"));
    cases
}

#[test]
fn a_few_thousand_hostile_inputs_never_break_the_decoder_or_the_importer() {
    assert_eq!(run(3000), 3000);
}

#[test]
#[ignore = "a million inputs: run with --ignored, in release"]
fn a_million_hostile_inputs_never_break_the_decoder_or_the_importer() {
    let cases: u32 = std::env::var("TRAINMEM_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let done = run(cases);
    println!("fuzzed {done} URL queries and {done} config.json objects");
    assert_eq!(done, cases);
}
