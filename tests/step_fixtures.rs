//! The step's peak against the dispatch-level tracker (`validation/tracker.py`): every measured
//! record that has a `step` object (and every step event log) is rebuilt from its config.json
//! with `kernels = cpu`, no overheads (CUDA context, NCCL, fragmentation at 0) and AdamW
//! for-loop, and `memory.peak` is compared with `measured_peak_bytes` (parameters + optimizer
//! states + buffers + batch + the live-storage peak of step 2): within −1 %..+3 % on every one.
//!
//! Fixtures: `tests/fixtures/pytorch/records/*.json` and `tests/fixtures/pytorch/steps/*.json`
//! (`TRAINMEM_PYTORCH_FIXTURES` points elsewhere, e.g. a harness run in progress).
//! `STEP_DUMP=DIR` writes each rebuilt stream next to the log's name for `validation`'s viewers.

use serde_json::Value;
use std::path::{Path, PathBuf};
use trainmem::config::{Attention, Config, Kernels, OptimImpl, Optimizer, Precision, Recompute};
use trainmem::estimator::{estimate, hf, step_stream};

fn fixtures() -> PathBuf {
    std::env::var("TRAINMEM_PYTORCH_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pytorch"))
}

/// Every config.json the records carry, by `config_key`.
fn configs() -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    let dir = fixtures().join("records");
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "json") && p.file_name().is_some_and(|n| n != "index.json") {
                let doc: Value = serde_json::from_str(&std::fs::read_to_string(&p).expect("readable")).expect("json");
                if let Some(c) = doc["configs"].as_object() {
                    out.extend(c.clone());
                }
            }
        }
    }
    if let Ok(extra) = std::env::var("TRAINMEM_STEP_CONFIGS") {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(extra).expect("readable")).expect("json");
        if let Some(c) = doc.as_object() {
            for (k, v) in c {
                out.entry(k.clone()).or_insert(v.clone());
            }
        }
    }
    out
}

/// A record's configuration as the tracker ran it.
struct Spec {
    id: String,
    family: String,
    batch: u64,
    seq: u64,
    dtype: String,
    attn: String,
    ckpt: bool,
}

fn spec_of_id(id: &str) -> Option<Spec> {
    let p: Vec<&str> = id.split('/').collect();
    if p.len() < 6 {
        return None;
    }
    Some(Spec {
        id: id.to_string(),
        family: p[0].to_string(),
        batch: p[1].trim_start_matches('b').parse().ok()?,
        seq: p[2].trim_start_matches('s').parse().ok()?,
        dtype: p[3].to_string(),
        attn: p[4].to_string(),
        ckpt: p[5] != "ckpt0",
    })
}

fn config_of(configs: &serde_json::Map<String, Value>, s: &Spec) -> Option<Config> {
    let key = format!("{}/{}", s.family, if s.dtype == "bf16" { "bfloat16" } else { "float32" });
    let cfg_json = configs.get(&key)?;
    let imported = hf::import_value(cfg_json).ok()?;
    let mut c = Config::default();
    trainmem::config::apply_import(&mut c, &imported);
    c.batch = s.batch;
    c.seq = s.seq;
    c.precision = match s.dtype.as_str() {
        "fp32" => Precision::Fp32,
        "bf16" => Precision::Bf16,
        _ => Precision::AmpBf16,
    };
    c.attn = if s.attn == "eager" { Attention::Eager } else { Attention::Sdpa };
    c.recompute = if s.ckpt { Recompute::Full } else { Recompute::None };
    c.kernels = Kernels::Cpu;
    c.optim = Optimizer::Adamw;
    c.optim_impl = OptimImpl::Forloop;
    c.cuda_ctx_mib = Some(0);
    c.nccl_mib = Some(0);
    c.frag_pct = None;
    Some(c)
}

/// The step event logs: (record id, measured peak, the log).
fn logs() -> Vec<(String, u128, Value)> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(fixtures().join("steps")) {
        let mut paths: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            let doc: Value = serde_json::from_str(&std::fs::read_to_string(&p).expect("readable")).expect("json");
            let id = doc["id"].as_str().unwrap_or_default().to_string();
            let peak = doc["summary"]["measured_peak_bytes"].as_u64().unwrap_or(0) as u128;
            out.push((id, peak, doc));
        }
    }
    out
}

fn only() -> Option<String> {
    std::env::var("STEP_ONLY").ok()
}

fn dump(dir: &str, id: &str, s: &trainmem::estimator::step::Stream) {
    let rows: Vec<Value> = s
        .events
        .iter()
        .map(|e| {
            serde_json::json!([
                if e.kind == trainmem::estimator::step::EventKind::Alloc { "a" } else { "f" },
                e.id,
                e.bytes as u64,
                e.dtype,
                e.op,
                e.layer,
                e.module,
                e.node,
                e.phase,
                e.live as u64
            ])
        })
        .collect();
    let doc = serde_json::json!({"id": id, "resident": s.resident as u64, "peak": s.peak as u64, "events": rows});
    let name = id.replace('/', "__") + ".json";
    std::fs::create_dir_all(dir).expect("dump dir");
    std::fs::write(Path::new(dir).join(name), doc.to_string()).expect("dump written");
}

#[test]
fn the_simulated_peak_matches_every_logged_step_within_minus_1_to_plus_3_percent() {
    let configs = configs();
    let logs = logs();
    assert!(!logs.is_empty(), "no step logs under {}", fixtures().display());
    let mut errs: Vec<(f64, String)> = Vec::new();
    let mut failures = Vec::new();
    let mut skipped = Vec::new();
    for (id, measured, _log) in &logs {
        if only().is_some_and(|o| !id.contains(&o)) {
            continue;
        }
        let Some(spec) = spec_of_id(id) else { continue };
        let Some(cfg) = config_of(&configs, &spec) else {
            skipped.push(id.clone());
            continue;
        };
        let e = match estimate(&cfg) {
            Ok(e) => e,
            Err(err) => {
                skipped.push(format!("{id}: {err}"));
                continue;
            }
        };
        let stream = step_stream(&cfg).expect("simulates");
        let got = stream.peak;
        let _ = &e;
        let rel = (got as f64 - *measured as f64) / *measured as f64;
        if let Ok(dir) = std::env::var("STEP_DUMP") {
            dump(&dir, &spec.id, &stream);
        }
        println!(
            "{id:60} measured {measured:>12} simulated {got:>12} {:+.3} %  ({})",
            rel * 100.0,
            stream.peak_event().map(|e| e.label()).unwrap_or_default()
        );
        if !(-0.01..=0.03).contains(&rel) {
            failures.push(format!("{id}: {got} vs {measured} ({:+.3} %)", rel * 100.0));
        }
        errs.push((rel, id.clone()));
    }
    errs.sort_by(|a, b| a.0.total_cmp(&b.0));
    if !errs.is_empty() {
        let med = errs[errs.len() / 2].0;
        let worst = errs.iter().map(|e| e.0.abs()).fold(0.0, f64::max);
        println!("{} logged steps: median {:+.3} %, worst |error| {:.3} %", errs.len(), med * 100.0, worst * 100.0);
    }
    println!("skipped (no config or refused): {}", skipped.len());
    assert!(failures.is_empty(), "{} of {} off:\n{}", failures.len(), errs.len(), failures.join("\n"));
}
