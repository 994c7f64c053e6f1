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

mod common;

fn fixtures() -> PathBuf {
    common::pytorch_root()
}

/// The record shards: (file stem, document).
fn shards() -> Vec<(String, Value)> {
    common::json_shards(&fixtures().join("records"))
}

/// A record's configuration as the tracker ran it: its own config.json through the importer,
/// `kernels = cpu`, AdamW single-tensor (torch's choice on CPU), no overheads.
fn config_of(doc: &Value, r: &Value) -> Option<Config> {
    let cfg_json = &doc["configs"][r["config_key"].as_str()?];
    let imported = hf::import_value(cfg_json).ok()?;
    let mut c = Config::default();
    trainmem::config::apply_import(&mut c, &imported);
    c.batch = r["batch"].as_u64()?;
    c.seq = r["seq"].as_u64()?;
    c.precision = match r["dtype"].as_str()? {
        "fp32" => Precision::Fp32,
        "bf16" => Precision::Bf16,
        "amp-bf16" => Precision::AmpBf16,
        _ => return None,
    };
    c.attn = if r["attn"] == "eager" { Attention::Eager } else { Attention::Sdpa };
    c.recompute = if r["checkpointing"].as_bool().unwrap_or(false) { Recompute::Full } else { Recompute::None };
    c.dropout = r["dropout"].as_f64().unwrap_or(0.0);
    c.kernels = Kernels::Cpu;
    c.optim = Optimizer::Adamw;
    c.optim_impl = OptimImpl::Forloop;
    c.cuda_ctx_mib = Some(0);
    c.nccl_mib = Some(0);
    c.frag_pct = None;
    Some(c)
}

/// Records of something the estimator does not model (yet): transformers' per-expert Python
/// loop (`experts_implementation="eager"`), reentrant checkpointing.
fn modelled(r: &Value) -> bool {
    let id = r["id"].as_str().unwrap_or_default();
    !id.contains("experts-eager") && r["checkpoint_mode"] != "reentrant"
}

/// Families of the grid the estimator refuses, each with the reason its refusal gives (issue
/// 10: refused explicitly, never approximated). Every other family is checked record by record:
/// an architecture the estimator accepts is an architecture it must get right.
const REFUSED: &[&str] = &[
    // issue 25: measured, estimator pending
];

/// Of the [`REFUSED`] families, those whose config.json the estimator already accepts but models
/// wrongly (measured, estimator pending): reported only, not failed for being estimated. None
/// today (issue 25's gpt2 with `activation_function: gelu_pytorch_tanh` is modelled).
const ACCEPTED_PENDING: &[&str] = &[];

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

/// Every record with a `step` object (every family but the [`REFUSED`] ones), by family: the
/// estimate's peak against `measured_peak_bytes`.
#[test]
fn the_peak_of_every_measured_step_is_within_minus_1_to_plus_3_percent() {
    let shards = shards();
    if common::missing(shards.is_empty(), "records", &fixtures()) {
        return;
    }
    let mut all: Vec<f64> = Vec::new();
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for (stem, doc) in &shards {
        if only().is_some_and(|o| stem != &o) {
            continue;
        }
        let ported = !REFUSED.contains(&stem.as_str());
        let mut errs: Vec<(f64, String)> = Vec::new();
        let mut refused = 0;
        for r in doc["records"].as_array().into_iter().flatten().filter(|r| modelled(r)) {
            let id = r["id"].as_str().unwrap_or_default();
            let Some(measured) = r["step"]["measured_peak_bytes"].as_u64() else { continue };
            let Some(cfg) = config_of(doc, r) else {
                refused += 1;
                if ported {
                    failures.push(format!("{id}: its config.json is refused"));
                }
                continue;
            };
            let e = match estimate(&cfg) {
                Ok(e) if !ported && !ACCEPTED_PENDING.contains(&stem.as_str()) => {
                    failures.push(format!("{id}: estimated ({} B) although its family is listed as refused", e.memory.peak));
                    continue;
                }
                Ok(e) => e,
                Err(err) => {
                    refused += 1;
                    if ported {
                        failures.push(format!("{id}: refused: {err}"));
                    }
                    continue;
                }
            };
            let rel = (e.memory.peak as f64 - measured as f64) / measured as f64;
            if std::env::var("STEP_VERBOSE").is_ok() {
                println!("{id:60} measured {measured:>12} estimated {:>12} {:+.3} %  ({})", e.memory.peak, rel * 100.0, e.memory.peak_op);
            }
            if ported && !(-0.01..=0.03).contains(&rel) {
                failures.push(format!("{id}: {} vs {measured} ({:+.3} %)", e.memory.peak, rel * 100.0));
            }
            errs.push((rel, id.to_string()));
        }
        if errs.is_empty() {
            report.push(format!("{stem:20} refused ({refused})"));
            continue;
        }
        errs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let med = errs[errs.len() / 2].0;
        let worst = errs.iter().max_by(|a, b| a.0.abs().total_cmp(&b.0.abs())).expect("some");
        report.push(format!(
            "{stem:20} {:>3} records  median {:+7.3} %  worst {:+7.3} % ({}){}",
            errs.len(),
            med * 100.0,
            worst.0 * 100.0,
            worst.1,
            if ported { "" } else { "  [not ported: reported only]" }
        ));
        if ported {
            all.extend(errs.iter().map(|e| e.0));
        }
    }
    println!("{}", report.join("\n"));
    if !all.is_empty() {
        all.sort_by(f64::total_cmp);
        let worst = all.iter().map(|e| e.abs()).fold(0.0, f64::max);
        println!(
            "ported families: {} records, median {:+.3} %, worst |error| {:.3} %",
            all.len(),
            all[all.len() / 2] * 100.0,
            worst * 100.0
        );
    }
    assert!(failures.is_empty(), "{} records off:\n{}", failures.len(), failures.join("\n"));
}

/// The step event logs (a subset of the records with every allocation and free): the
/// materialized stream's peak against the log's, and `STEP_DUMP` writes the stream to compare
/// them event by event.
#[test]
fn the_simulated_stream_peaks_with_every_logged_step() {
    let shards = shards();
    let logs = logs();
    if common::missing(logs.is_empty(), "step logs", &fixtures()) {
        return;
    }
    let mut errs: Vec<(f64, String)> = Vec::new();
    let mut failures = Vec::new();
    for (id, measured, _log) in &logs {
        if only().is_some_and(|o| !id.starts_with(&format!("{o}/"))) {
            continue;
        }
        let Some((stem, doc, r)) = shards.iter().find_map(|(stem, doc)| {
            doc["records"].as_array().into_iter().flatten().find(|r| r["id"] == id.as_str()).map(|r| (stem, doc, r))
        }) else {
            continue;
        };
        let Some(cfg) = config_of(doc, r) else { continue };
        let Ok(stream) = step_stream(&cfg) else { continue };
        let got = stream.peak;
        let rel = (got as f64 - *measured as f64) / *measured as f64;
        if let Ok(dir) = std::env::var("STEP_DUMP") {
            dump(&dir, id, &stream);
        }
        println!(
            "{id:60} measured {measured:>12} simulated {got:>12} {:+.3} %  ({})",
            rel * 100.0,
            stream.peak_event().map(|e| e.label()).unwrap_or_default()
        );
        if !REFUSED.contains(&stem.as_str()) {
            if !(-0.01..=0.03).contains(&rel) {
                failures.push(format!("{id}: {got} vs {measured} ({:+.3} %)", rel * 100.0));
            }
            errs.push((rel, id.clone()));
        }
    }
    errs.sort_by(|a, b| a.0.total_cmp(&b.0));
    if !errs.is_empty() {
        let worst = errs.iter().map(|e| e.0.abs()).fold(0.0, f64::max);
        println!(
            "{} logged steps of ported families: median {:+.3} %, worst |error| {:.3} %",
            errs.len(),
            errs[errs.len() / 2].0 * 100.0,
            worst * 100.0
        );
    }
    assert!(failures.is_empty(), "{} of {} off:\n{}", failures.len(), errs.len(), failures.join("\n"));
}
