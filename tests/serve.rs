//! Serving memory (issue 29): the KV cache against what transformers 5.24 allocates, record by
//! record, and the engine budgets against the engines' published startup logs.

use serde_json::Value;
use trainmem::config::decode_query;
use trainmem::estimator::hf;
use trainmem::estimator::serve::{
    analyse_serving, transformers_bytes, transformers_layers, weight_bytes, Count, Format, KvDtype, PagedLayout, StateFormat, WeightDtype,
    BF16,
};

fn load(path: &str) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The cache format of a record: the model's dtype, or FP8 with its two per-layer scales; and
/// the states' formats (conv in the model's dtype, recurrent in FP32).
fn format_of(r: &Value) -> (Format, StateFormat) {
    let model = match r["dtype"].as_str() {
        Some("float32") => Format::plain(4, "fp32"),
        Some("bfloat16") => BF16,
        other => panic!("dtype {other:?}"),
    };
    let sf = StateFormat::transformers(model);
    if r["cache"] == "fp8" {
        (KvDtype::Fp8.format(model), sf)
    } else {
        (model, sf)
    }
}

/// Every record of `tests/fixtures/serve/transformers_kv.json` (validation/serve/measure_kv.py):
/// the bytes of the tensors transformers' cache holds, logical and in storage, equal
/// [`transformers_bytes`] for the imported config.json, layer by layer and in total — hybrid
/// layers' conv and recurrent states (Qwen3-Next, Qwen3.5, Falcon-H1) and DeepSeek-V3.2's
/// indexer keys included. Every record is compared: none is skipped.
#[test]
fn the_kv_cache_equals_what_transformers_holds_for_every_record() {
    let doc = load("tests/fixtures/serve/transformers_kv.json");
    let records = doc["records"].as_array().cloned().unwrap_or_default();
    assert!(records.len() >= 600, "{} records", records.len());
    let mut failures = Vec::new();
    let mut families = std::collections::BTreeSet::new();
    for r in &records {
        let id = r["id"].as_str().unwrap_or_default();
        let cfg = &doc["configs"][r["config"].as_str().unwrap_or_default()];
        let spec = match hf::import_value(cfg) {
            Ok(i) => i.spec,
            Err(e) => {
                failures.push(format!("{id}: import: {e}"));
                continue;
            }
        };
        let layers = transformers_layers(&spec).unwrap_or_default();
        let (fmt, sf) = format_of(r);
        let (b, p, n) = (r["batch"].as_u64().unwrap_or(0), r["prefill"].as_u64().unwrap_or(0), r["decode"].as_u64().unwrap_or(0));
        let logical = transformers_bytes(&layers, fmt, sf, b, p, n, Count::Logical);
        let storage = transformers_bytes(&layers, fmt, sf, b, p, n, Count::Storage);
        let (want_l, want_s) = (r["bytes"].as_u64().unwrap_or(0), r["storage_bytes"].as_u64().unwrap_or(0));
        if (logical, storage) != (want_l, want_s) {
            failures.push(format!("{id}: logical {logical} (measured {want_l}), storage {storage} (measured {want_s})"));
        }
        // Layer by layer as well: the same total could hide two errors that cancel.
        let measured = r["layers"].as_array().cloned().unwrap_or_default();
        if measured.len() != layers.len() {
            failures.push(format!("{id}: {} layers (measured {})", layers.len(), measured.len()));
        }
        for (i, (l, m)) in layers.iter().zip(&measured).enumerate() {
            let got = transformers_bytes(std::slice::from_ref(l), fmt, sf, b, p, n, Count::Storage);
            let want: u64 = m["tensors"].as_array().into_iter().flatten().map(|t| t["storage_bytes"].as_u64().unwrap_or(0)).sum();
            if got != want {
                failures.push(format!("{id}: layer {i}: {got} (measured {want})"));
            }
        }
        families.insert(r["model_type"].as_str().unwrap_or_default().to_string());
    }
    assert!(failures.is_empty(), "{} of {} records differ:\n{}", failures.len(), records.len(), failures.join("\n"));
    // Every family the estimator accepts is measured (issue 25's ten included).
    let accepted: std::collections::BTreeSet<String> =
        trainmem::estimator::family::Family::ALL.iter().map(|(_, t, _)| t.to_string()).collect();
    assert_eq!(families, accepted);
}

/// The published startup logs of `tests/fixtures/serve/engine_logs.json`, each reproduced from
/// the inputs it states.
#[test]
fn the_engines_published_startup_figures_are_reproduced() {
    let doc = load("tests/fixtures/serve/engine_logs.json");
    const GIB: f64 = (1u64 << 30) as f64;
    for log in doc["logs"].as_array().into_iter().flatten() {
        let id = log["id"].as_str().unwrap_or_default();
        let cfg = decode_query(log["query"].as_str().unwrap_or_default());
        assert!(cfg.errors.is_empty(), "{id}: {:?}", cfg.errors);
        let c = cfg.config;
        let want = &log["logged"];
        // Weights, as the engine logs them (GiB, two decimals).
        if let Some(w) = want["weights_gib"].as_f64() {
            let pad = matches!(c.serve.engine, trainmem::estimator::serve::Engine::Vllm | trainmem::estimator::serve::Engine::Sglang);
            let got = weight_bytes(&c, c.serve.weight_dtype, pad) as f64 / GIB;
            let tol = log["weights_tolerance_gib"].as_f64().unwrap_or(0.005);
            // A named known miss (`known_miss.weights_gib`: its diagnosis) must stay a miss: if
            // the estimate comes within tolerance, the record's diagnosis is stale.
            if let Some(why) = log["known_miss"]["weights_gib"].as_str() {
                assert!((got - w).abs() > tol, "{id}: weights {got:.4} GiB now match the logged {w}: drop the known miss ({why})");
            } else {
                assert!((got - w).abs() <= tol, "{id}: weights {got:.4} GiB, logged {w}");
            }
        }
        let layers = trainmem::estimator::serve::gpu_layers(&c).unwrap_or_default();
        let fmt = trainmem::estimator::serve::kv_format(&c);
        let sf = trainmem::estimator::serve::state_format(&c);
        let align = trainmem::estimator::serve::hybrid_block_align(&c);
        let layout = PagedLayout::aligned(&layers, fmt, sf, c.serve.block_size.unwrap_or(16), align);
        // vLLM: its own available KV memory → blocks (logged, or implied by the logged tokens
        // and concurrency below), cache tokens, concurrency.
        if let (Some(kv_gib), Ok(layout)) = (want["available_kv_gib"].as_f64(), &layout) {
            // The log rounds to 0.01 GiB: the blocks of both ends of that interval.
            let lo = layout.num_blocks(((kv_gib - 0.005) * GIB) as u128);
            let hi = layout.num_blocks(((kv_gib + 0.005) * GIB) as u128);
            if let Some(blocks) = want["gpu_blocks"].as_u64().or(log["implied_gpu_blocks"].as_u64()) {
                assert!((lo..=hi).contains(&blocks), "{id}: {blocks} blocks outside {lo}..={hi}");
            }
        }
        if let (Some(blocks), Ok(layout)) = (want["gpu_blocks"].as_u64(), &layout) {
            let len = log["max_model_len"].as_u64().unwrap_or(0);
            if let Some(conc) = want["max_concurrency"].as_f64() {
                let got = layout.max_concurrency(blocks, len, c.serve.max_num_batched_tokens.unwrap_or(8192));
                assert!((got - conc).abs() < 0.005 + 1e-9, "{id}: concurrency {got:.4}, logged {conc}");
            }
            if let Some(tokens) = want["kv_cache_tokens"].as_u64() {
                assert_eq!(layout.cache_tokens(blocks), tokens, "{id}");
            }
        }
        // vLLM's hybrid attention block ("Setting attention block size to N tokens").
        if let (Some(b), Ok(layout)) = (want["block_size"].as_u64(), &layout) {
            assert_eq!(layout.block_size, b, "{id}: attention block");
        }
        // Recent vLLM prints no "# GPU blocks", only "GPU KV cache size: T tokens" (⌊n / groups⌋ · B)
        // and the concurrency (n / blocks per request): some block count n must give both.
        if let (None, Some(tokens), Some(conc), Ok(layout)) =
            (want["gpu_blocks"].as_u64(), want["kv_cache_tokens"].as_u64(), want["max_concurrency"].as_f64(), &layout)
        {
            let len = log["max_model_len"].as_u64().unwrap_or(0);
            let batched = c.serve.max_num_batched_tokens.unwrap_or(8192);
            let groups = layout.groups.len().max(1) as u64;
            let first = tokens / layout.block_size.max(1) * groups;
            let fits: Vec<u64> = (first..first + groups)
                .filter(|&n| layout.cache_tokens(n) == tokens)
                .filter(|&n| (layout.max_concurrency(n, len, batched) - conc).abs() < 0.005 + 1e-9)
                .collect();
            assert!(!fits.is_empty(), "{id}: no block count gives {tokens} tokens and {conc}x (block {})", layout.block_size);
            if let Some(n) = log["implied_gpu_blocks"].as_u64() {
                assert!(fits.contains(&n), "{id}: {n} blocks not among {fits:?}");
            }
        }
        // vLLM's budget arithmetic from its own logged parts.
        if let (Some(total), Some(util), Some(w), Some(act), Some(nt), Some(kv)) = (
            want["total_gib"].as_f64(),
            log["gpu_memory_utilization"].as_f64(),
            want["weights_gib"].as_f64(),
            want["activation_gib"].as_f64(),
            want["non_torch_gib"].as_f64(),
            want["available_kv_gib"].as_f64(),
        ) {
            let got = total * util - w - act - nt;
            assert!((got - kv).abs() <= 0.02, "{id}: {total}·{util} − {w} − {act} − {nt} = {got:.3}, logged {kv}");
        }
        // SGLang's MambaPool: `max_mamba_cache_size + 1` slots of every layer's conv and SSM
        // state ("Mamba Cache is allocated. … conv_state size: X GB, ssm_state size: Y GB", GiB).
        if let (Some(slots), Some(conv_gib), Some(ssm_gib)) =
            (want["mamba_slots"].as_u64(), want["conv_state_gib"].as_f64(), want["ssm_state_gib"].as_f64())
        {
            let conv: u64 = layers.iter().map(|l| sf.conv.bytes(l.state.conv)).sum();
            let ssm: u64 = layers.iter().map(|l| sf.recurrent.bytes(l.state.recurrent)).sum();
            let pool = |b: u64| ((slots + 1) * b) as f64 / GIB;
            assert!((pool(conv) - conv_gib).abs() < 0.005, "{id}: conv state {:.4} GiB, logged {conv_gib}", pool(conv));
            assert!((pool(ssm) - ssm_gib).abs() < 0.005, "{id}: ssm state {:.4} GiB, logged {ssm_gib}", pool(ssm));
        }
        // SGLang: the pool's K size from its token count.
        if let (Some(tokens), Some(k_gib)) = (want["sglang_tokens"].as_u64(), want["sglang_k_gib"].as_f64()) {
            let k: u64 = layers.iter().map(|l| fmt.bytes(l.k)).sum();
            let got = (tokens + 1) as f64 * k as f64 / GIB;
            assert!((got - k_gib).abs() < 0.005, "{id}: K size {got:.4} GiB, logged {k_gib}");
        }
        // SGLang's MLA pool (`MLATokenToKVPool`, one buffer of latent and rotary key per layer):
        // "KV size" from its token count, `(#tokens + 1) · Σ_layers (r_kv + d_r) · bytes`.
        if let (Some(tokens), Some(kv_gib)) = (want["sglang_tokens"].as_u64(), want["sglang_kv_gib"].as_f64()) {
            let kv: u64 = layers.iter().map(|l| fmt.bytes(l.k) + fmt.bytes(l.v)).sum();
            let got = (tokens + 1) as f64 * kv as f64 / GIB;
            assert!((got - kv_gib).abs() < 0.005, "{id}: KV size {got:.4} GiB, logged {kv_gib}");
        }
        // The whole analysis runs for every logged configuration.
        assert!(analyse_serving(&c).is_ok(), "{id}");
    }
}

#[test]
fn deepseek_v3_caches_one_latent_per_token_and_layer_in_every_engine() {
    // 61 layers · (512 + 64) · 2 B = 70,272 B per token, on each of 8 TP ranks.
    for engine in ["vllm", "sglang", "trtllm"] {
        let c = decode_query(&format!("mode=serve&model=deepseek-v3&gpus=8&tp=8&gpu=h200&engine={engine}&weight_dtype=fp8-block")).config;
        let s = analyse_serving(&c).unwrap_or_else(|e| panic!("{engine}: {e}"));
        assert_eq!(s.kv_per_token, 61 * 576 * 2, "{engine}");
    }
}

#[test]
fn kimi_linear_keeps_fp32_kda_states_in_blocks_aligned_to_64_tokens() {
    // Kimi-Linear-48B-A3B at TP 2 (vLLM issue #28228): a KDA layer keeps 3 conv states of
    // 2,048 channels · 3 columns in bf16 (36,864 B) and 16 · 128 · 128 recurrent values in FP32
    // (`kda_state_dtype`: 1,048,576 B); an MLA token is (512 + 64) · 2 = 1,152 B, and MLA
    // aligns the hybrid block to 64: 64 · ⌈1,085,440 / (64 · 1,152)⌉ = 960 tokens (a bf16 state
    // or a 16-token alignment would give 496 or 944).
    let c = decode_query("mode=serve&model=kimi-linear-48b-a3b&gpus=2&tp=2&gpu=rtx-3090").config;
    let layers = trainmem::estimator::serve::gpu_layers(&c).unwrap_or_default();
    let sf = trainmem::estimator::serve::state_format(&c);
    assert_eq!(sf.recurrent.bytes(1), 4);
    let align = trainmem::estimator::serve::hybrid_block_align(&c);
    assert_eq!(align, 64);
    let fmt = trainmem::estimator::serve::kv_format(&c);
    let p = PagedLayout::aligned(&layers, fmt, sf, 16, align).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((p.state_page_bytes, p.block_size, p.page_bytes), (1_085_440, 960, 960 * 1_152));
}

#[test]
fn fp8_weights_of_a_70b_fit_one_h100_and_bf16_do_not() {
    let bf16 = decode_query("model=llama-3.1-70b").config;
    let b = weight_bytes(&bf16, WeightDtype::Auto, true);
    let f = weight_bytes(&bf16, WeightDtype::Fp8, true);
    assert!(b > 80 << 30 && f < 80 << 30, "{b} {f}");
}

#[test]
fn every_serving_key_round_trips_through_the_url() {
    use trainmem::config::{encode_query, Group, KEYS};
    let q = "mode=serve&engine=sglang&context=32k&concurrency=12&kv_dtype=nvfp4&weight_dtype=int4-gptq&mamba_ssm_cache_dtype=float32\
             &gpu_memory_utilization=0.85&max_num_batched_tokens=4096&max_num_seqs=64&block_size=32\
             &mem_fraction_static=0.8&free_gpu_memory_fraction=0.7&cuda_graphs=false&cuda_graph_mib=900&dp_attention=true";
    let d = decode_query(q);
    assert!(d.errors.is_empty(), "{:?}", d.errors);
    let again = decode_query(&encode_query(&d.config));
    assert_eq!(again.config, d.config);
    // Every key of the serving group was set to something other than its default.
    let encoded = encode_query(&d.config);
    for k in KEYS.iter().filter(|k| k.group == Group::Serving) {
        assert!(encoded.contains(&format!("{}=", k.name)), "{} missing from {encoded}", k.name);
    }
    assert_eq!(encode_query(&trainmem::config::Config::default()), "");
    // A bad value names its key.
    let bad = decode_query("kv_dtype=fp7&gpu_memory_utilization=1.5&mamba_ssm_cache_dtype=fp8");
    let keys: Vec<_> = bad.errors.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["kv_dtype", "gpu_memory_utilization", "mamba_ssm_cache_dtype"]);
    // Each value of the state dtype survives the link, and the checkpoint's own (an architecture
    // key) too: a Qwen3.5 told bf16 stays a Qwen3.5 whose checkpoint says float32.
    for d in ["auto", "float32", "bfloat16", "float16"] {
        let c = decode_query(&format!("mode=serve&model=qwen3.5-27b&mamba_ssm_cache_dtype={d}"));
        assert!(c.errors.is_empty(), "{d}: {:?}", c.errors);
        let back = decode_query(&encode_query(&c.config)).config;
        assert_eq!(back, c.config, "{d}");
        assert_eq!(back.serve.mamba_ssm_cache_dtype.name(), d);
        assert_eq!(back.arch.ssm_dtype.name(), "float32");
    }
    let custom = decode_query("model=qwen3-next-80b-a3b-thinking&mamba_ssm_dtype=float32").config;
    assert_eq!(decode_query(&encode_query(&custom)).config.arch.ssm_dtype.name(), "float32");
}

#[test]
fn the_cli_prints_the_promised_fields() {
    let args: Vec<String> =
        "serve --model gemma-3-27b-it --context 32768 --concurrency 4 --kv_dtype fp8 --json".split_whitespace().map(String::from).collect();
    let mut out = Vec::new();
    trainmem::cli::run(&args, &mut out).unwrap_or_else(|e| panic!("{e}"));
    let v: Value = serde_json::from_slice(&out).unwrap_or(Value::Null);
    for k in ["weights", "kv_per_token", "kv_blocks", "max_context"] {
        assert!(v[k].is_u64(), "{k}: {v}");
    }
    assert!(v["kv_bytes"].is_u64() && v["max_concurrency"].is_f64());
    assert!(v["rows"].as_array().is_some_and(|r| r.iter().all(|r| r["formula"].is_string() && r["source"].is_string())));
    assert_eq!(v["query"], "model=gemma-3-27b-it&mode=serve&context=32768&concurrency=4&kv_dtype=fp8");
}

#[test]
fn the_cli_shows_qwen3_5s_recurrent_state_in_fp32() {
    // `trainmem serve --model qwen3.5-27b --json`: vLLM follows the checkpoint's
    // `mamba_ssm_dtype` "float32"; at the model's 262,144 tokens one sequence holds 3 state
    // blocks of 16 pages of 784 tokens · 4,096 B (3,211,264 B): 154,140,672 B of states.
    let run = |line: &str| {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        let mut out = Vec::new();
        trainmem::cli::run(&args, &mut out).unwrap_or_else(|e| panic!("{e}"));
        serde_json::from_slice::<Value>(&out).unwrap_or(Value::Null)
    };
    let v = run("serve --model qwen3.5-27b --json");
    assert_eq!((v["state_dtype"].as_str(), v["state_bytes"].as_u64()), (Some("fp32"), Some(3 * 16 * 3_211_264)), "{v}");
    assert_eq!(v["block_size"], 784);
    let b = run("serve --model qwen3.5-27b --mamba_ssm_cache_dtype bfloat16 --json");
    assert_eq!((b["state_dtype"].as_str(), b["block_size"].as_u64()), (Some("bf16"), Some(400)), "{b}");
    // A model without states says nothing of them.
    let l = run("serve --model llama-3.1-8b --json");
    assert!(l["state_dtype"].is_null() && l["state_bytes"] == 0, "{l}");
}
