//! The estimate against memory figures published for real GPU training runs
//! (`tests/fixtures/published/training_runs.json`: framework benchmarks, READMEs, issue and
//! pull-request logs, each with its source, every stated input and what its figure reads).
//!
//! Each record's `query` is decoded as a share link is (`trainmem::config::decode_query`) and
//! estimated as `trainmem estimate` does (`trainmem::estimator::analyse`); the figure is compared
//! with the estimate's field that reads the same counter (`compare`). A record the estimator
//! refuses carries the refusal (`refused`), asserted word for word so that a setting it does not
//! model is never estimated as something else; a record outside its tolerance carries
//! `known_miss` (why, with figures) and is asserted to stay outside, so that a fix is noticed and
//! the record promoted. Run with `-- --nocapture` for the table (validation/README.md, "Against
//! published GPU runs").

use serde::Deserialize;
use trainmem::config::decode_query;
use trainmem::estimator::{analyse, Memory};

/// Bytes of a GiB and of a decimal GB.
const GIB: f64 = 1_073_741_824.0;
const GB: f64 = 1e9;

#[derive(Deserialize)]
struct Fixture {
    records: Vec<Record>,
}

#[derive(Deserialize)]
struct Record {
    id: String,
    query: String,
    published: Published,
    compare: String,
    tolerance_pct: f64,
    #[serde(default)]
    refused: Option<String>,
    #[serde(default)]
    known_miss: Option<String>,
}

#[derive(Deserialize)]
struct Published {
    value: f64,
    unit: String,
}

fn records() -> Vec<Record> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/published/training_runs.json");
    let text = std::fs::read_to_string(&path).expect("the published runs fixture");
    serde_json::from_str::<Fixture>(&text).expect("the fixture parses").records
}

/// The published figure in bytes.
fn published_bytes(p: &Published) -> f64 {
    match p.unit.as_str() {
        "GiB" => p.value * GIB,
        "GB" => p.value * GB,
        other => panic!("unit {other} is neither GiB nor GB"),
    }
}

/// The estimate's field that reads the counter the figure reads.
fn estimated_bytes(m: &Memory, compare: &str) -> Option<u128> {
    match compare {
        "step_reserved_peak" => m.step_reserved_peak,
        "reserved_peak" => m.reserved_peak,
        "allocated_peak" => Some(m.allocated_peak),
        // litgpt's `Memory used`: `max_memory_allocated()` never reset, the loading's peak included.
        "run_allocated_peak" => Some(m.allocated_peak.max(m.load_allocated_peak)),
        "nvidia_smi" => m.nvidia_smi,
        "peak" => Some(m.peak),
        other => panic!("compare {other} names no estimate field"),
    }
}

/// What the estimator says about the record: its refusals, in the words `trainmem estimate`
/// prints (`` `key` reason ``), or the estimate's figure.
fn estimate(r: &Record) -> Result<f64, Vec<String>> {
    let decoded = decode_query(&r.query);
    if !decoded.errors.is_empty() {
        return Err(decoded.errors.iter().map(|e| format!("`{}` {}", e.key, e.reason)).collect());
    }
    let a = analyse(&decoded.config).map_err(|e| vec![e.to_string()])?;
    let bytes = estimated_bytes(&a.estimate.memory, &r.compare).ok_or_else(|| vec![format!("{}: {} not simulated", r.id, r.compare)])?;
    Ok(bytes as f64)
}

#[test]
fn every_published_run_is_estimated_within_its_tolerance_or_refused_or_a_known_miss_by_name() {
    let records = records();
    assert!(records.len() >= 20, "{} records", records.len());
    let mut failures = Vec::new();
    println!("| record | published | estimated | error |");
    println!("| --- | ---: | ---: | ---: |");
    for r in &records {
        let published = published_bytes(&r.published);
        let shown = format!("{} {}", r.published.value, r.published.unit);
        match (estimate(r), &r.refused) {
            (Err(reasons), Some(expected)) => {
                if !reasons.iter().any(|m| m == expected) {
                    failures.push(format!("{}: refused with {reasons:?}, the record says {expected:?}", r.id));
                }
                println!("| {} | {shown} | refused: {} | — |", r.id, expected.split(" (").next().unwrap_or(expected));
            }
            (Err(reasons), None) => failures.push(format!("{}: refused with {reasons:?}", r.id)),
            (Ok(bytes), Some(expected)) => {
                failures.push(format!("{}: now estimated ({:.2} GiB); the record expects the refusal {expected:?}", r.id, bytes / GIB))
            }
            (Ok(bytes), None) => {
                let error = 100.0 * (bytes - published) / published;
                let estimated = if r.published.unit == "GB" { format!("{:.2} GB", bytes / GB) } else { format!("{:.2} GiB", bytes / GIB) };
                let within = error.abs() <= r.tolerance_pct;
                let mark = if r.known_miss.is_some() { " (known miss)" } else { "" };
                println!("| {} | {shown} | {estimated} | {error:+.1} %{mark} |", r.id);
                match (&r.known_miss, within) {
                    (None, false) => failures.push(format!("{}: {error:+.1} % is outside ±{} %", r.id, r.tolerance_pct)),
                    (Some(_), true) => {
                        failures.push(format!("{}: {error:+.1} % is now within ±{} %: promote it (drop known_miss)", r.id, r.tolerance_pct))
                    }
                    _ => {}
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_record_names_its_source_inputs_and_what_its_figure_reads() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/published/training_runs.json");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json");
    let records = doc["records"].as_array().expect("records");
    let mut ids = std::collections::BTreeSet::new();
    for r in records {
        let id = r["id"].as_str().expect("id");
        assert!(ids.insert(id.to_string()), "{id} twice");
        let src = &r["source"];
        assert!(src["repo"].is_string() && (src["path"].is_string() || src["url"].is_string()), "{id}: source");
        assert!(src["where"].is_string(), "{id}: where in the source");
        for k in ["gpu", "gpus", "micro_batch", "seq", "precision"] {
            assert!(!r["inputs"][k].is_null(), "{id}: input {k}");
        }
        assert!(r["published"]["meaning"].as_str().is_some_and(|m| !m.is_empty()), "{id}: what the figure reads");
        assert!(r["published"]["value"].as_f64().is_some_and(|v| v > 0.0), "{id}: figure");
    }
}
