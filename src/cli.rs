//! The native command line: `trainmem estimate`, `trainmem presets`, `trainmem keys`,
//! `trainmem bench`. Every `--KEY VALUE` is a configuration key of [`crate::config`], the same
//! names and values as the share URL (`--seq 4096` ⇔ `?seq=4096`).

use crate::config::{self, Config, ConfigError, KEYS};
use crate::estimator::hf::{self, HfError};
use crate::estimator::units::{format_bytes, format_count};
use crate::estimator::{explain, flatten, presets, Estimate, EstimateError};
use serde::Serialize;
use std::io::Write;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Estimate(#[from] EstimateError),
    #[error("{path}: {err}")]
    Hf { path: String, err: HfError },
    #[error("cannot read {path}: {err}")]
    Io { path: String, err: String },
    #[error("{0}")]
    Bench(String),
}

const USAGE: &str = "usage:
  trainmem estimate (--model ID | --hf-config PATH) [--KEY VALUE ...] [--json]
  trainmem presets [--json]
  trainmem keys
  trainmem bench [--max-seq N] [--heads N] [--head-dim N] [--budget-ms N] [--mem-mib N] [--json]

Every KEY is a configuration key (see `trainmem keys`), spelled as in the share URL:
  trainmem estimate --model llama-3.1-8b --seq 8192 --zero 3 --gpus 8";

/// Runs the CLI on the process arguments; returns the exit code.
pub fn main() -> i32 {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match run(&args, &mut out) {
        Ok(()) => 0,
        Err(CliError::Usage(msg)) => {
            eprintln!("trainmem: {msg}\n\n{USAGE}");
            2
        }
        Err(e) => {
            eprintln!("trainmem: {e}");
            1
        }
    }
}

/// Runs one command, writing its output to `out`.
pub fn run(args: &[String], out: &mut dyn Write) -> Result<(), CliError> {
    let Some((cmd, rest)) = args.split_first() else {
        return Err(CliError::Usage("no command given".into()));
    };
    let w = |out: &mut dyn Write, s: String| {
        out.write_all(s.as_bytes()).map_err(|e| CliError::Io { path: "stdout".into(), err: e.to_string() })
    };
    match cmd.as_str() {
        "estimate" => {
            let (cfg, json) = parse_estimate_args(rest)?;
            let e = explain(&cfg)?;
            if json {
                w(out, format!("{}\n", to_json(&cfg, &e)))
            } else {
                w(out, render_table(&cfg, &e))
            }
        }
        "presets" => {
            let json = rest.iter().any(|a| a == "--json");
            if let Some(bad) = rest.iter().find(|a| *a != "--json") {
                return Err(CliError::Usage(format!("unexpected argument '{bad}'")));
            }
            w(out, render_presets(json))
        }
        "keys" => w(out, render_keys()),
        "bench" => crate::bench::cli::run(rest, out).map_err(CliError::Bench),
        "-h" | "--help" | "help" => w(out, format!("{USAGE}\n")),
        other => Err(CliError::Usage(format!("unknown command '{other}'"))),
    }
}

/// Reads `estimate`'s arguments into a configuration (and whether to print JSON).
pub fn parse_estimate_args(args: &[String]) -> Result<(Config, bool), CliError> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    let mut json = false;
    let mut hf_path: Option<String> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--json" {
            json = true;
            continue;
        }
        let Some(key) = a.strip_prefix("--") else {
            return Err(CliError::Usage(format!("unexpected argument '{a}' (options look like --KEY VALUE)")));
        };
        let (key, inline) = match key.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (key.to_string(), None),
        };
        let value = match inline {
            Some(v) => v,
            None => it.next().cloned().ok_or_else(|| CliError::Usage(format!("--{key} needs a value")))?,
        };
        let key = key.replace('-', "_");
        if key == "hf_config" {
            hf_path = Some(value);
        } else {
            pairs.push((key, value));
        }
    }
    let mut cfg = Config::default();
    if let Some(path) = &hf_path {
        if pairs.iter().any(|(k, _)| k == "model") {
            return Err(CliError::Usage("give either --model or --hf-config, not both".into()));
        }
        let text = std::fs::read_to_string(path).map_err(|e| CliError::Io { path: path.clone(), err: e.to_string() })?;
        let imported = hf::import_json(&text).map_err(|err| CliError::Hf { path: path.clone(), err })?;
        config::apply_import(&mut cfg, &imported);
    }
    let errors = config::apply_pairs(&mut cfg, pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect());
    match errors.into_iter().next() {
        Some(e) => Err(e.into()),
        None => Ok((cfg, json)),
    }
}

#[derive(Serialize)]
struct JsonDoc<'a> {
    model: &'a str,
    /// The configuration as a share-URL query.
    query: String,
    parameter_count: u64,
    trainable_parameter_count: u64,
    active_parameter_count: u64,
    parameter_tensors: u64,
    memory: &'a crate::estimator::Memory,
    capacity: u128,
    fits: bool,
    headroom: i128,
    layout: &'a crate::estimator::Layout,
    components: &'a [crate::estimator::ledger::Row],
    host: &'a [crate::estimator::ledger::Row],
    breakdown: Vec<(&'static str, u64)>,
    /// Memory after each event of one simulated step.
    timeline: Vec<TimelineJson>,
    /// The closed textbook formulas for the same configuration.
    textbook: &'a [crate::estimator::ledger::Row],
    warnings: &'a [String],
}

#[derive(Serialize)]
struct TimelineJson {
    event: String,
    bytes: u128,
    parameters: u128,
    gradients: u128,
    optimizer_states: u128,
    activations: u128,
    transient: u128,
    framework_overhead: u128,
}

/// The stable JSON document of `trainmem estimate --json`.
pub fn to_json(cfg: &Config, e: &Estimate) -> String {
    let doc = JsonDoc {
        model: &e.model,
        query: config::encode_query(cfg),
        parameter_count: e.parameter_count,
        trainable_parameter_count: e.trainable_parameter_count,
        active_parameter_count: e.active_parameter_count,
        parameter_tensors: e.parameter_tensors,
        memory: &e.memory,
        capacity: e.capacity,
        fits: e.fits(),
        headroom: e.headroom(),
        layout: &e.layout,
        components: &e.components,
        host: &e.host,
        breakdown: e.breakdown.iter().map(|(p, n)| (p.label(), *n)).collect(),
        timeline: e
            .timeline
            .events
            .iter()
            .map(|ev| {
                let c = ev.by_category;
                TimelineJson {
                    event: ev.label(),
                    bytes: ev.bytes,
                    parameters: c[0],
                    gradients: c[1],
                    optimizer_states: c[2],
                    activations: c[3],
                    transient: c[4],
                    framework_overhead: c[5],
                }
            })
            .collect(),
        textbook: &e.textbook,
        warnings: &e.warnings,
    };
    serde_json::to_string_pretty(&doc).unwrap_or_else(|err| format!("{{\"error\": \"{err}\"}}"))
}

fn render_table(cfg: &Config, e: &Estimate) -> String {
    let u = cfg.unit;
    let mut s = String::new();
    s.push_str(&format!(
        "{} — {} parameters ({} trainable), {} tensors\n",
        e.model,
        format_count(e.parameter_count),
        format_count(e.trainable_parameter_count),
        e.parameter_tensors
    ));
    s.push_str(&format!(
        "{} GPU(s): dp {} × tp {} × pp {} × cp {}; ledger of the {} ({} layers)\n\n",
        e.layout.gpus,
        e.layout.dp,
        e.layout.tp,
        e.layout.pp,
        e.layout.cp,
        e.layout.stage.label(),
        e.layout.stage_layers
    ));
    for r in flatten(&e.components) {
        let depth = if e.components.iter().any(|top| std::ptr::eq(top, r)) { 0 } else { 2 };
        s.push_str(&format!("{:indent$}{:<40} {:>12}   {}\n", "", r.label, format_bytes(r.bytes, u), r.expr.symbolic(), indent = depth));
        s.push_str(&format!("{:indent$}{:<40} {:>12}   = {}\n", "", "", "", r.expr.substituted(), indent = depth));
    }
    s.push_str(&format!("\n{:<40} {:>12}\n", "Sum of components per GPU", format_bytes(e.memory.total, u)));
    s.push_str(&format!("{:<40} {:>12}   (at: {})\n", "Peak per GPU during the step", format_bytes(e.memory.peak, u), e.memory.peak_event));
    s.push_str(&format!("{:<40} {:>12}\n", "GPU capacity", format_bytes(e.capacity, u)));
    let h = e.headroom();
    if h >= 0 {
        s.push_str(&format!("fits, with {} headroom\n", format_bytes(h as u128, u)));
    } else {
        s.push_str(&format!("does not fit: needs {} more\n", format_bytes(h.unsigned_abs(), u)));
    }
    if e.memory.host > 0 {
        s.push_str(&format!("host memory per GPU process: {}\n", format_bytes(e.memory.host, u)));
    }
    for w in &e.warnings {
        s.push_str(&format!("warning: {w}\n"));
    }
    s
}

fn render_presets(json: bool) -> String {
    let all = presets::presets();
    if json {
        let v: Vec<serde_json::Value> = all
            .iter()
            .map(|p| {
                let c = p.spec.counts();
                serde_json::json!({"id": p.id, "checkpoint": p.checkpoint, "family": p.family, "parameter_count": c.total, "parameter_tensors": c.tensors})
            })
            .collect();
        return format!("{}\n", serde_json::Value::Array(v));
    }
    let mut s = String::new();
    for p in &all {
        s.push_str(&format!("{:<26} {:>8}  {}\n", p.id, format_count(p.spec.counts().total), p.checkpoint));
    }
    s
}

fn render_keys() -> String {
    let mut s = String::new();
    let default = Config::default();
    for k in KEYS {
        let choices = (k.choices)();
        let choices = if choices.is_empty() || choices.len() > 12 { String::new() } else { format!(" [{}]", choices.join("|")) };
        s.push_str(&format!("--{:<16} {}{} (default {})\n", k.name, k.help, choices, (k.get)(&default)));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn estimate_reads_keys_exactly_as_the_url_names_them() {
        let (cfg, json) = parse_estimate_args(&args("--model llama-3.1-70b --seq 8192 --zero 3 --gpus 8 --json")).expect("valid");
        assert!(json);
        assert_eq!(config::encode_query(&cfg), "model=llama-3.1-70b&seq=8192&gpus=8&zero=3");
    }

    #[test]
    fn a_bad_value_is_one_line_naming_the_key() {
        let err = parse_estimate_args(&args("--seq many")).err().map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("`seq` = 'many': expected a whole number"));
    }

    #[test]
    fn the_json_document_has_the_promised_fields() {
        let mut out = Vec::new();
        run(&args("estimate --model gpt2 --json"), &mut out).expect("runs");
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(v["parameter_count"], 124_439_808u64);
        for k in ["parameters", "gradients", "optimizer_states", "activations", "framework_overhead", "total"] {
            assert!(v["memory"][k].is_u64(), "memory.{k}");
        }
        assert!(v["components"].as_array().is_some_and(|c| c.iter().all(|r| r["formula"].is_string() && r["bytes"].is_u64())));
    }

    #[test]
    fn unknown_commands_and_keys_fail() {
        let mut out = Vec::new();
        assert!(matches!(run(&args("frobnicate"), &mut out), Err(CliError::Usage(_))));
        assert!(matches!(run(&args("estimate --colour blue"), &mut out), Err(CliError::Config(_))));
    }
}
