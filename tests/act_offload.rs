//! Issue 26's activation offloading (`act_offload`) end to end: its values through the URL and
//! the CLI, the pinned host memory it fills in `estimate --json` (the `offloaded_activations`
//! host row, counted in `memory.host`), and its refusals by name.

use serde_json::Value;
use trainmem::config::{decode_query, encode_query, find_key, ActOffload, Config};

#[test]
fn act_offload_round_trips_through_the_url_with_each_of_its_values() {
    assert!(find_key("act_offload").is_some());
    for (value, want) in [("none", ActOffload::None), ("torchtune", ActOffload::Torchtune), ("save_on_cpu", ActOffload::SaveOnCpu)] {
        let q = format!("model=llama-3.1-8b&seq=2048&act_offload={value}");
        let d = decode_query(&q);
        assert!(d.errors.is_empty(), "{q}: {:?}", d.errors);
        assert_eq!(d.config.act_offload, want, "{q}");
        let encoded = encode_query(&d.config);
        let again = decode_query(&encoded);
        assert_eq!(again.config, d.config, "{q} → {encoded}");
        if want != ActOffload::None {
            assert!(encoded.contains(&format!("act_offload={value}")), "{encoded}");
        }
    }
}

#[test]
fn the_boolean_act_offload_of_older_links_reads_as_torchtunes() {
    assert_eq!(decode_query("act_offload=true").config.act_offload, ActOffload::Torchtune);
    assert_eq!(decode_query("act_offload=false").config.act_offload, ActOffload::None);
    let old: Config = serde_json::from_str(&format!(
        "{{{}}}",
        serde_json::to_string(&Config::default())
            .expect("json")
            .trim_matches(['{', '}'])
            .replace("\"act_offload\":\"none\"", "\"act_offload\":true")
    ))
    .expect("an older saved configuration");
    assert_eq!(old.act_offload, ActOffload::Torchtune);
    let d = decode_query("act_offload=sometimes");
    assert_eq!(d.errors.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["act_offload"]);
}

fn estimate_json(args: &str) -> Result<Value, String> {
    let args: Vec<String> = format!("estimate --model llama-3.1-8b {args} --json").split_whitespace().map(String::from).collect();
    let mut out = Vec::new();
    trainmem::cli::run(&args, &mut out).map_err(|e| e.to_string())?;
    Ok(serde_json::from_slice(&out).unwrap_or(Value::Null))
}

fn host_row(v: &Value) -> Option<u64> {
    v["host"].as_array()?.iter().find(|r| r["name"] == "offloaded_activations").and_then(|r| r["bytes"].as_u64())
}

#[test]
fn the_json_counts_the_offloaded_activations_in_host_memory_and_lowers_the_step_peak() {
    let plain = estimate_json("--seq 8192 --precision bf16").expect("estimated");
    assert_eq!(host_row(&plain), None, "no offloading, no row");
    let mut host = Vec::new();
    for kind in ["torchtune", "save_on_cpu"] {
        let v = estimate_json(&format!("--seq 8192 --precision bf16 --act_offload {kind}")).expect("estimated");
        assert_eq!(v["query"].as_str().map(|q| q.contains(&format!("act_offload={kind}"))), Some(true), "{}", v["query"]);
        let bytes = host_row(&v).expect("the offloaded_activations host row");
        assert!(bytes > 0);
        assert!(v["memory"]["host"].as_u64().is_some_and(|h| h >= bytes), "{}", v["memory"]);
        let (peak, plain_peak) = (v["memory"]["peak"].as_u64().unwrap_or(0), plain["memory"]["peak"].as_u64().unwrap_or(0));
        assert!(peak < plain_peak, "{kind}: peak {peak} not below {plain_peak}");
        host.push(bytes);
    }
    // save_on_cpu moves every saved tensor, the head's and the loss's too.
    assert!(host[1] > host[0], "{host:?}");
}

#[test]
fn pinned_host_memory_beyond_host_ram_gib_is_warned() {
    let v = estimate_json("--seq 8192 --precision bf16 --act_offload torchtune --host_ram_gib 16").expect("estimated");
    let warned = v["warnings"].as_array().is_some_and(|w| w.iter().any(|x| x.as_str().is_some_and(|s| s.contains("host_ram_gib"))));
    assert!(warned, "{}", v["warnings"]);
}

#[test]
fn act_offload_with_megatrons_selective_recomputation_or_pipelines_is_refused_by_name() {
    for args in ["--act_offload torchtune --recompute selective", "--act_offload save_on_cpu --pp 2 --gpus 2"] {
        let err = estimate_json(args).expect_err(args);
        assert!(err.contains("act_offload") && err.contains("not modelled yet"), "{args}: {err}");
    }
}

#[test]
fn under_full_checkpointing_torchtune_offloads_each_layers_input_and_the_final_norms_saves() {
    // Llama 3.1 8B, b1 s8192 bf16: the 32 checkpoints' positional inputs (`[b, s, h]` bf16,
    // packed by the outer hooks at the checkpoint call) and the eager final norm's fp32 saves;
    // nothing saved inside a checkpoint moves (FINDINGS §15.5).
    let v = estimate_json("--seq 8192 --precision bf16 --recompute full --act_offload torchtune").expect("estimated");
    let bytes = host_row(&v).expect("the offloaded_activations host row");
    let layer_input: u64 = 8192 * 4096 * 2;
    assert!(bytes >= 32 * layer_input, "{bytes}");
    assert!(bytes < 32 * layer_input + 4 * 2 * layer_input, "{bytes}: more than the layer inputs and the final norm's saves");
    let all = estimate_json("--seq 8192 --precision bf16 --recompute full --act_offload save_on_cpu").expect("estimated");
    assert!(host_row(&all).is_some_and(|b| b > bytes), "save_on_cpu moves the head's and the loss's saves too");
}

/// Transformer Engine's per-layer offloading (`act_offload_layers`, Megatron's
/// `--cpu-offloading-num-layers`): what the first `n` layers push leaves the device `L − n`
/// layers later, so the step's peak falls as `n` grows, and the host holds `n` layers' copies —
/// on Megatron's own modules (`framework=megatron`) and around transformers' layers with eager
/// attention (measured: `recipes/llama-gqa-L4.json`).
#[test]
fn offloading_more_layers_fills_more_host_memory_and_never_raises_the_peak() {
    for base in ["--framework megatron --seq 8192 --precision mixed-bf16", "--attn eager --seq 4096 --precision bf16"] {
        let plain = estimate_json(base).expect("estimated");
        let (mut host, mut peak) = (0, plain["memory"]["peak"].as_u64().unwrap_or(0));
        for n in [4, 8, 16] {
            let v = estimate_json(&format!("{base} --act_offload_layers {n}")).expect("estimated");
            assert_eq!(v["query"].as_str().map(|q| q.contains(&format!("act_offload_layers={n}"))), Some(true), "{}", v["query"]);
            let h = host_row(&v).expect("the offloaded_activations host row");
            let p = v["memory"]["peak"].as_u64().unwrap_or(u64::MAX);
            assert!(h > host, "{base} n={n}: host {h} not above {host}");
            assert!(p <= peak, "{base} n={n}: peak {p} above {peak}");
            (host, peak) = (h, p);
        }
        assert!(peak < plain["memory"]["peak"].as_u64().unwrap_or(0), "{base}: 16 layers offloaded lower the peak");
    }
}

#[test]
fn per_layer_offloading_is_refused_by_its_key_where_megatron_or_transformer_engine_refuses_it() {
    for (args, says) in [
        // Transformer Engine: the last layer is never offloaded.
        ("--framework megatron --act_offload_layers 32", "all but the last layer"),
        // Megatron-Core's TransformerConfig checks.
        ("--framework megatron --act_offload_layers 4 --pp 2 --gpus 2", "pipeline parallelism"),
        ("--framework megatron --act_offload_layers 4 --recompute full", "recomputation"),
        // Around transformers' SDPA attention Transformer Engine's start_offload raises.
        ("--act_offload_layers 4", "SDPA"),
        ("--act_offload_layers 4 --act_offload torchtune --attn eager", "choose one"),
    ] {
        let err = estimate_json(args).expect_err(args);
        assert!(err.contains("act_offload_layers") && err.contains(says), "{args}: {err}");
    }
}

#[test]
fn act_offload_layers_round_trips_through_the_url() {
    let d = decode_query("model=llama-3.1-8b&framework=megatron&attn=flash&act_offload_layers=6");
    assert!(d.errors.is_empty(), "{:?}", d.errors);
    assert_eq!(d.config.act_offload_layers, 6);
    let encoded = encode_query(&d.config);
    assert!(encoded.contains("act_offload_layers=6"), "{encoded}");
    assert_eq!(decode_query(&encoded).config, d.config);
}
