//! `trainmem compare FILE.json`: what the verify script measured, beside a fresh estimate.
//!
//! The configuration is re-derived from the record's `query` (the share link's query), set to the
//! kernels of the device the script ran on (`kernels`), and estimated again, so an old record is
//! judged by today's trainmem; the predictions the script carried are kept beside it
//! (`predicted_in_script` in the JSON output).
//!
//! Version 2 records (the script loads through `from_pretrained`) carry the loading's fields
//! (`load_peak`, `load_reserved`) and the step's reserved peak (`step_reserved_peak`) beside the
//! whole run's (`reserved_peak`). Version 1 records are still read: the model was built in place
//! (no loading), their `reserved_peak` was the step's, and the fields they lack are "not measured".
//! With `act_offload`, `host_offloaded` (the pinned host bytes the offloading hooks copied in the
//! forward pass) is compared with the estimate's `offloaded_activations` host row; records written
//! before the field existed read it as not measured.

use super::{predictions_for, FIELDS, SCHEMA, SCHEMA_VERSION};

/// The oldest record version this trainmem reads.
pub const OLDEST_VERSION: u64 = 1;
use crate::config::{self, Config, Kernels};
use crate::estimator::expr::group_digits;
use crate::estimator::EstimateError;
use serde::Serialize;
use serde_json::Value;

/// The band the step model targets under `kernels=cpu` (issue 11): −1 % to +3 % of the measured.
pub const TARGET_BAND_PCT: (f64, f64) = (-1.0, 3.0);

/// Why a record cannot be compared; names the field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CompareError {
    #[error("the record is not valid JSON: {0}")]
    Json(String),
    #[error("the record is not a trainmem verify record (`schema` must be \"{SCHEMA}\")")]
    NotVerify,
    #[error("`version` {0} is not one this trainmem reads (it reads versions {OLDEST_VERSION} to {SCHEMA_VERSION})")]
    Version(u64),
    #[error("`{field}` must be {expected}")]
    Field { field: String, expected: &'static str },
    #[error("`query`: {0}")]
    Query(String),
    #[error("the configuration of `query` cannot be estimated: {0}")]
    Estimate(#[from] EstimateError),
}

/// One field, measured and predicted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub field: &'static str,
    pub label: &'static str,
    pub measured: Option<u128>,
    /// Today's estimate.
    pub predicted: Option<u128>,
    /// What the script carried when it was generated.
    pub predicted_in_script: Option<u128>,
    /// predicted − measured, bytes.
    pub difference_bytes: Option<i128>,
    /// The difference in percent of the measured.
    pub difference_pct: Option<f64>,
}

/// A record compared with a fresh estimate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    pub model: String,
    pub query: String,
    pub kernels: &'static str,
    pub device: String,
    pub versions: String,
    pub steady_step: u64,
    pub rows: Vec<Row>,
    /// The field with the largest relative difference.
    pub worst: Option<&'static str>,
    pub verdict: String,
    pub notes: Vec<String>,
}

/// The label of a field, as the script prints it.
pub fn label(field: &str) -> &'static str {
    match field {
        "after_forward" => "allocated after forward",
        "forward_peak" => "forward peak",
        "backward_peak" => "backward peak",
        "step_peak" => "optimizer step peak",
        "peak" => "step peak (allocated)",
        "load_peak" => "loading: max allocated",
        "load_reserved" => "loading: max reserved",
        "step_reserved_peak" => "step: max reserved",
        "reserved_peak" => "run: max reserved",
        "nvidia_smi" => "nvidia-smi",
        "host_offloaded" => "host: offloaded activations",
        _ => "?",
    }
}

fn field_err(field: impl Into<String>, expected: &'static str) -> CompareError {
    CompareError::Field { field: field.into(), expected }
}

fn str_at<'a>(v: &'a Value, path: &str) -> Result<&'a str, CompareError> {
    v.pointer(&format!("/{}", path.replace('.', "/"))).and_then(Value::as_str).ok_or_else(|| field_err(path, "a string"))
}

/// A byte count or `null`.
fn bytes_at(v: &Value, path: &str) -> Result<Option<u128>, CompareError> {
    match v.pointer(&format!("/{}", path.replace('.', "/"))) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_u64().map(|b| Some(b as u128)).ok_or_else(|| field_err(path, "a non-negative whole number of bytes or null")),
    }
}

/// Compares a record (the script's JSON text) with a fresh estimate of its configuration.
pub fn compare(text: &str) -> Result<Comparison, CompareError> {
    let v: Value = serde_json::from_str(text).map_err(|e| CompareError::Json(e.to_string()))?;
    if !v.is_object() {
        return Err(CompareError::NotVerify);
    }
    if v.get("schema").and_then(Value::as_str) != Some(SCHEMA) {
        return Err(CompareError::NotVerify);
    }
    let version = v.get("version").and_then(Value::as_u64).ok_or_else(|| field_err("version", "a whole number"))?;
    if !(OLDEST_VERSION..=SCHEMA_VERSION).contains(&version) {
        return Err(CompareError::Version(version));
    }
    let query = str_at(&v, "query")?.to_string();
    let kernels = match str_at(&v, "kernels")? {
        "cuda" => Kernels::Cuda,
        "cpu" => Kernels::Cpu,
        _ => return Err(field_err("kernels", "\"cuda\" or \"cpu\"")),
    };
    let decoded = config::decode_query(&query);
    if let Some(e) = decoded.errors.first() {
        return Err(CompareError::Query(e.to_string()));
    }
    let cfg = Config { kernels, ..decoded.config };
    let predicted = predictions_for(&cfg, kernels)?;
    let mut rows = Vec::new();
    for field in FIELDS {
        // Version 1 measured the step's reserved peak, with no loading before it.
        let measured = if version == 1 && matches!(field, "reserved_peak" | "step_reserved_peak" | "load_peak" | "load_reserved") {
            None
        } else {
            bytes_at(&v, &format!("fields.{field}.measured"))?
        };
        let in_script = bytes_at(&v, &format!("fields.{field}.predicted"))?;
        let predicted = predicted.as_ref().and_then(|p| p.get(field));
        let (difference_bytes, difference_pct) = match (measured, predicted) {
            (Some(m), Some(p)) => {
                let d = p as i128 - m as i128;
                (Some(d), (m > 0).then(|| d as f64 * 100.0 / m as f64))
            }
            _ => (None, None),
        };
        rows.push(Row {
            field,
            label: label(field),
            measured,
            predicted,
            predicted_in_script: in_script,
            difference_bytes,
            difference_pct,
        });
    }
    let worst = rows.iter().filter_map(|r| r.difference_pct.map(|p| (r, p.abs()))).max_by(|a, b| a.1.total_cmp(&b.1)).map(|(r, _)| r);
    let verdict = match worst {
        None if predicted.is_none() => "nothing to compare: trainmem does not estimate this configuration yet".to_string(),
        None => "nothing to compare: the record measured none of the fields trainmem predicts".to_string(),
        Some(r) => verdict_of(r),
    };
    let worst = worst.map(|r| r.field);
    let device = match (v.pointer("/device/type").and_then(Value::as_str), v.pointer("/device/name").and_then(Value::as_str)) {
        (Some(t), Some(n)) if !n.is_empty() => format!("{t} ({n})"),
        (Some(t), _) => t.to_string(),
        _ => "an unnamed device".to_string(),
    };
    let version_of = |k: &str| v.pointer(&format!("/versions/{k}")).and_then(Value::as_str).unwrap_or("?").to_string();
    let mut notes: Vec<String> = v
        .get("notes")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect())
        .unwrap_or_default();
    if version == 1 {
        notes.push(
            "a version-1 record: its script built the model in place without from_pretrained, so its reserved memory holds no loading \
             and is not compared (regenerate the script to measure the loading and both reserved peaks)"
                .into(),
        );
    }
    Ok(Comparison {
        model: v.get("model").and_then(Value::as_str).map_or_else(|| cfg.display_name(), String::from),
        query,
        kernels: if kernels == Kernels::Cuda { "cuda" } else { "cpu" },
        device,
        versions: format!("torch {}, transformers {}", version_of("torch"), version_of("transformers")),
        steady_step: v.get("steady_step").and_then(Value::as_u64).unwrap_or(0),
        rows,
        worst,
        verdict,
        notes,
    })
}

/// One line on the worst field.
fn verdict_of(r: &Row) -> String {
    let (lo, hi) = TARGET_BAND_PCT;
    let pct = r.difference_pct.unwrap_or(0.0);
    let d = r.difference_bytes.unwrap_or(0);
    let way = if d >= 0 { "more" } else { "less" };
    let band = if (lo..=hi).contains(&pct) { "within" } else { "outside" };
    format!(
        "worst: {} — trainmem predicts {:.2} % {way} than measured ({}{} B), {band} the {lo:+} %..{hi:+} % target",
        r.label,
        pct.abs(),
        if d >= 0 { "+" } else { "-" },
        group_digits(d.unsigned_abs())
    )
}

fn mib(b: Option<u128>) -> String {
    b.map_or_else(|| "n/a".to_string(), |b| format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64))
}

/// The comparison as a table, row by row, with the verdict last.
pub fn render_text(c: &Comparison) -> String {
    let mut s = format!("{} measured on {}, {}; step {} compared\n", c.model, c.device, c.versions, c.steady_step);
    s.push_str(&format!("configuration: ?{} (predictions for kernels={})\n\n", c.query, c.kernels));
    s.push_str(&format!("{:<26}{:>16}{:>16}   difference (trainmem - measured)\n", "", "measured", "trainmem"));
    for r in &c.rows {
        let diff = match (r.difference_bytes, r.difference_pct) {
            (Some(d), Some(p)) => format!("{}{} B ({p:+.2} %)", if d >= 0 { "+" } else { "-" }, group_digits(d.unsigned_abs())),
            (Some(d), None) => format!("{}{} B", if d >= 0 { "+" } else { "-" }, group_digits(d.unsigned_abs())),
            _ if r.measured.is_none() => "not measured here".to_string(),
            _ => "no prediction".to_string(),
        };
        s.push_str(&format!("{:<26}{:>16}{:>16}   {diff}\n", r.label, mib(r.measured), mib(r.predicted)));
    }
    for n in &c.notes {
        s.push_str(&format!("note: {n}\n"));
    }
    s.push_str(&format!("\n{}\n", c.verdict));
    s
}

/// The comparison as JSON.
pub fn render_json(c: &Comparison) -> String {
    serde_json::to_string_pretty(c).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(query: &str, kernels: &str, measured: u64) -> String {
        let fields: serde_json::Map<String, Value> = FIELDS
            .iter()
            .map(|f| {
                let m = if super::super::CUDA_ONLY.contains(f) { Value::Null } else { Value::from(measured) };
                (f.to_string(), serde_json::json!({"measured": m, "predicted": null}))
            })
            .collect();
        serde_json::json!({"schema": SCHEMA, "version": 2, "query": query, "kernels": kernels, "steady_step": 3,
            "device": {"type": kernels, "name": "test"}, "versions": {"torch": "x", "transformers": "y"}, "fields": fields})
        .to_string()
    }

    #[test]
    fn a_record_is_compared_row_by_row_with_a_fresh_estimate() {
        let c = compare(&record("model=gpt2&batch=2&seq=64&precision=fp32&layers=2", "cpu", 100_000_000)).expect("compares");
        assert_eq!(c.rows.len(), FIELDS.len());
        let peak = c.rows.iter().find(|r| r.field == "peak").expect("peak row");
        assert!(peak.predicted.is_some_and(|p| p > 0));
        assert_eq!(peak.difference_bytes, peak.predicted.map(|p| p as i128 - 100_000_000));
        // Reserved memory and nvidia-smi do not apply on the CPU: no difference there.
        assert!(c.rows.iter().filter(|r| r.field == "nvidia_smi").all(|r| r.difference_bytes.is_none()));
        assert!(c.worst.is_some() && c.verdict.starts_with("worst: "), "{}", c.verdict);
    }

    #[test]
    fn malformed_records_name_the_field() {
        assert!(matches!(compare("{oops"), Err(CompareError::Json(_))));
        assert_eq!(compare("{\"schema\": \"other\"}"), Err(CompareError::NotVerify));
        let v3 = record("", "cpu", 1).replace("\"version\":2", "\"version\":3");
        assert_eq!(compare(&v3), Err(CompareError::Version(3)));
        let bad = record("", "tpu", 1);
        assert!(matches!(compare(&bad), Err(CompareError::Field { field, .. }) if field == "kernels"));
        let neg = record("", "cpu", 1).replace("\"measured\":1", "\"measured\":-5");
        assert!(matches!(compare(&neg), Err(CompareError::Field { field, .. }) if field.starts_with("fields.")));
        let q = record("seq=lots", "cpu", 1);
        assert!(compare(&q).err().map(|e| e.to_string()).is_some_and(|e| e.contains("`seq`")));
    }

    #[test]
    fn a_cuda_record_compares_the_loading_and_both_reserved_peaks_and_a_version_1_record_not_its_reserve() {
        let q = "model=gpt2&batch=2&seq=64&precision=fp32&layers=2";
        let all = |version: u64| {
            let fields: serde_json::Map<String, Value> =
                FIELDS.iter().map(|f| (f.to_string(), serde_json::json!({"measured": 100_000_000u64, "predicted": null}))).collect();
            serde_json::json!({"schema": SCHEMA, "version": version, "query": q, "kernels": "cuda", "steady_step": 3,
                "device": {"type": "cuda", "name": "test"}, "versions": {"torch": "x", "transformers": "y"}, "fields": fields})
            .to_string()
        };
        let c = compare(&all(2)).expect("compares");
        for field in ["load_peak", "load_reserved", "step_reserved_peak", "reserved_peak"] {
            let r = c.rows.iter().find(|r| r.field == field).expect("row");
            assert!(r.predicted.is_some() && r.difference_bytes.is_some(), "{field}");
        }
        let load = c.rows.iter().find(|r| r.field == "load_peak").and_then(|r| r.predicted).unwrap_or(0);
        let run = c.rows.iter().find(|r| r.field == "reserved_peak").and_then(|r| r.predicted).unwrap_or(0);
        assert!(run >= load && load > 0, "the run's reserve holds the loading's peak");
        let old = compare(&all(1)).expect("compares a version-1 record");
        for field in ["load_peak", "load_reserved", "step_reserved_peak", "reserved_peak"] {
            assert_eq!(old.rows.iter().find(|r| r.field == field).and_then(|r| r.measured), None, "{field}");
        }
        assert!(old.notes.iter().any(|n| n.starts_with("a version-1 record")));
    }

    #[test]
    fn the_verdict_says_whether_the_worst_field_is_inside_the_target_band() {
        let row = |d: i128, p: f64| Row {
            field: "peak",
            label: "step peak (allocated)",
            measured: Some(100),
            predicted: Some((100 + d) as u128),
            predicted_in_script: None,
            difference_bytes: Some(d),
            difference_pct: Some(p),
        };
        assert!(verdict_of(&row(2, 2.0)).ends_with("within the -1 %..+3 % target"));
        assert!(verdict_of(&row(-2, -2.0)).contains("2.00 % less than measured (-2 B), outside"));
    }
}
