//! The native command line: `trainmem estimate`, `trainmem plan`, `trainmem presets`,
//! `trainmem keys`, `trainmem bench`, `trainmem verify-script`, `trainmem compare`, `trainmem import`,
//! `trainmem export`, `trainmem recipes`. Every `--KEY VALUE` is a configuration key of [`crate::config`], the same
//! names and values as the share URL (`--seq 4096` ⇔ `?seq=4096`).

use crate::config::{self, Config, ConfigError, KEYS};
use crate::estimator::hf::{self, HfError};
use crate::estimator::plan::{self, GlobalBatch, PlanError, PlanRequest, Space};
use crate::estimator::units::{format_bytes, format_count};
use crate::estimator::{flatten, presets, Estimate, EstimateError};
use crate::verify::{self, compare::CompareError, VerifyError};
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
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error("cannot generate the verify script: {0}")]
    Verify(#[from] VerifyError),
    #[error("{path}: {err}")]
    Compare { path: String, err: CompareError },
    #[error("{0}")]
    Serve(#[from] crate::estimator::serve::ServeError),
    #[error("{0}")]
    Import(#[from] crate::frameworks::ImportError),
}

const USAGE: &str = "usage:
  trainmem estimate (--model ID | --hf-config PATH) [--KEY VALUE ...] [--json]
      every command that takes --KEY VALUE also takes --query Q (a share link or its query) and
      --import FILE (a framework's config file, read as `trainmem import` reads it); --KEY flags win
  trainmem step (--model ID | --hf-config PATH) [--KEY VALUE ...] [--json]
      the steady-state step op by op: every allocation and free, allocated and reserved after each (CSV)
  trainmem plan (--model ID | --hf-config PATH) --gpu ID --gpus N --seq N
                (--global-batch-tokens N | --global-batch SEQUENCES) [--KEY VALUE ...]
                [--try-KNOB v1,v2,...] [--top N] [--all] [--fix] [--json | --csv]
      KNOB: batch zero recompute attn optim optim-impl offload tp pp vpp cp ep sp finetune
            compile recompute-every recompute-layers act-offload act-offload-layers
      also: --compute-efficiency F, --link-efficiency F, --compile-speedup F, --no-overlap
      where nothing fits, it searches again with offload, act-offload and optim open (text, and
      --json's `widened`; --csv lists the asked search only)
  trainmem presets [--json]
  trainmem keys
  trainmem --version
  trainmem bench [--max-seq N] [--heads N] [--head-dim N] [--budget-ms N] [--mem-mib N] [--json]
  trainmem verify-script (--model ID | --hf-config PATH) [--KEY VALUE ...] [--out FILE]
      a self-contained PyTorch script that measures the step on your GPU (or CPU) beside trainmem's prediction
  trainmem compare FILE.json [--json]
      the script's measurements against a fresh estimate, row by row
  trainmem serve (--model ID | --hf-config PATH) [--engine vllm|sglang|trtllm|transformers] [--context N]
                 [--concurrency N] [--kv_dtype auto|bf16|fp8|int8|nvfp4] [--KEY VALUE ...] [--json]
      serving memory per GPU: weights, KV cache per token and sequence, the engine's budget and blocks,
      max concurrency, max context (verify-script --mode serve writes the vLLM/SGLang check)
  trainmem import FILE... [--as FORMAT] [--json]
      framework config files (torchtune/axolotl/litgpt/accelerate/Megatron-Bridge YAML, torchtitan TOML,
      DeepSpeed/Trainer/PEFT JSON, Megatron-LM arguments) as a share-URL query and a report of every key
  trainmem export --format torchtune|torchtitan|accelerate-deepspeed|megatron [--out DIR] [--KEY VALUE ...]
      the configuration as the file a framework runs: only the keys memory depends on, commented
  trainmem recipes [--json]
      the recipe presets (recipe=ID) and the file and version each comes from

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
    let expanded;
    let rest = if CONFIGURED.contains(&cmd.as_str()) {
        expanded = expand_sources(rest)?;
        expanded.as_slice()
    } else {
        rest
    };
    let w = |out: &mut dyn Write, s: String| {
        out.write_all(s.as_bytes()).map_err(|e| CliError::Io { path: "stdout".into(), err: e.to_string() })
    };
    match cmd.as_str() {
        "estimate" => {
            let (cfg, json) = parse_estimate_args(rest)?;
            let e = crate::estimator::analyse(&cfg)?.explain()?;
            if json {
                w(out, format!("{}\n", to_json(&cfg, &e)))
            } else {
                w(out, render_table(&cfg, &e))
            }
        }
        "step" => {
            let (cfg, json) = parse_estimate_args(rest)?;
            w(out, render_step(&cfg, json)?)
        }
        "plan" => {
            let args = parse_plan_args(rest)?;
            w(out, run_plan(&args)?)
        }
        "serve" => {
            let (mut cfg, json) = parse_estimate_args(rest)?;
            cfg.serve.mode = crate::estimator::serve::Mode::Serve;
            let s = crate::estimator::serve::analyse_serving(&cfg)?;
            let query = config::encode_query(&cfg);
            if json {
                w(out, format!("{}\n", crate::estimator::serve::to_json(&s, &query)))
            } else {
                w(out, crate::estimator::serve::render_text(&s, &query))
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
        #[cfg(feature = "gpu")]
        "bench" => crate::bench::cli::run(rest, out).map_err(CliError::Bench),
        #[cfg(not(feature = "gpu"))]
        "bench" => Err(CliError::Bench("this build has no GPU benchmark: it was built without the `gpu` feature".into())),
        "verify-script" => {
            let (rest, path) = take_out(rest)?;
            if rest.iter().any(|a| a == "--json") {
                return Err(CliError::Usage("verify-script writes a Python script; --json is not one of its options".into()));
            }
            let (cfg, _) = parse_estimate_args(&rest)?;
            let script = if cfg.serve.mode == crate::estimator::serve::Mode::Serve {
                verify::serve::serve_script(&cfg)?
            } else {
                verify::verify_script(&cfg)?
            };
            match path {
                Some(p) => {
                    std::fs::write(&p, script).map_err(|e| CliError::Io { path: p.clone(), err: e.to_string() })?;
                    w(out, format!("wrote {p}; run it with: python3 {p}\n"))
                }
                None => w(out, script),
            }
        }
        "compare" => {
            let json = rest.iter().any(|a| a == "--json");
            let files: Vec<&String> = rest.iter().filter(|a| *a != "--json").collect();
            let path = match files.as_slice() {
                [p] if !p.starts_with("--") => p.to_string(),
                [] => return Err(CliError::Usage("compare needs the JSON file the verify script wrote".into())),
                _ => {
                    return Err(CliError::Usage(format!(
                        "compare takes one file and --json, not '{}'",
                        files.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" ")
                    )))
                }
            };
            let text = std::fs::read_to_string(&path).map_err(|e| CliError::Io { path: path.clone(), err: e.to_string() })?;
            let c = verify::compare::compare(&text).map_err(|err| CliError::Compare { path: path.clone(), err })?;
            if json {
                w(out, format!("{}\n", verify::compare::render_json(&c)))
            } else {
                w(out, verify::compare::render_text(&c))
            }
        }
        "import" => run_import(rest, out),
        "export" => run_export(rest, out),
        "recipes" => {
            let json = rest.iter().any(|a| a == "--json");
            if let Some(bad) = rest.iter().find(|a| *a != "--json") {
                return Err(CliError::Usage(format!("unexpected argument '{bad}'")));
            }
            w(out, render_recipes(json))
        }
        "-h" | "--help" | "help" => w(out, format!("{USAGE}\n")),
        "-V" | "--version" | "version" => w(out, format!("{}\n", crate::version::LABEL)),
        other => Err(CliError::Usage(format!("unknown command '{other}'"))),
    }
}

/// Splits `--out FILE` (or `--out=FILE`) from the other arguments.
fn take_out(args: &[String]) -> Result<(Vec<String>, Option<String>), CliError> {
    let mut rest = Vec::new();
    let mut path = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--out" {
            path = Some(it.next().cloned().ok_or_else(|| CliError::Usage("--out needs a file name".into()))?);
        } else if let Some(p) = a.strip_prefix("--out=") {
            path = Some(p.to_string());
        } else {
            rest.push(a.clone());
        }
    }
    Ok((rest, path))
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
    let old_custom = hf_path.is_none() && config::names_an_old_custom_architecture(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let errors = config::apply_pairs(&mut cfg, pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect());
    if old_custom && cfg.model == "custom" {
        cfg.arch.family = config::family_of_old_link(&cfg.arch);
    }
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
    /// What the frameworks' own logs will print about memory ([`crate::estimator::logs`]).
    logs: Vec<crate::estimator::logs::LogLine>,
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
        logs: crate::estimator::logs::log_lines(cfg, e),
        warnings: &e.warnings,
    };
    serde_json::to_string_pretty(&doc).unwrap_or_else(|err| format!("{{\"error\": \"{err}\"}}"))
}

/// What `trainmem plan` was asked.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanArgs {
    pub request: PlanRequest,
    pub output: PlanOutput,
    /// Print the cheapest single changes that make the base configuration fit instead.
    pub fix: bool,
}

/// How `trainmem plan` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanOutput {
    Text,
    Json,
    Csv,
}

/// The largest compile speed-up `--compile-speedup` takes: compute twice as fast.
const MAX_COMPILE_SPEEDUP: f64 = 1.0;

/// The commands that take a configuration (`--KEY VALUE …`), and with it `--query` and
/// `--import` ([`expand_sources`]).
const CONFIGURED: [&str; 6] = ["estimate", "step", "plan", "serve", "verify-script", "export"];

/// The query of `--query`'s value: after the first `?` where what stands before it is an
/// address (a link: `https://…/trainmem/?model=…`, or `?model=…`), else the whole value — a
/// query whose values hold a `?` (`name=?&…`, which the fuzz test found read as a link and the
/// name lost) is a query.
fn link_query(value: &str) -> &str {
    match value.split_once('?') {
        Some((address, query)) if !address.contains(['=', '&']) => query,
        _ => value,
    }
}

/// `--query Q` (a share link's query, or the whole link: what the page's address and `trainmem
/// import` print) and `--import FILE` (a framework's config file, read as `trainmem import`
/// reads it; several combine as there) turned into the `--KEY VALUE` pairs they set, ahead of
/// the other arguments, which therefore override them wherever they stand: `trainmem estimate
/// --import job.toml --gpus 64` is the job on 64 GPUs. The page's own keys in a link (`view`,
/// `embed`, …) are passed over; a file with a value that cannot be used is an error naming its
/// file, line and key, as `trainmem import` reports it.
pub fn expand_sources(args: &[String]) -> Result<Vec<String>, CliError> {
    let mut front: Vec<String> = Vec::new();
    let mut files: Vec<(String, String)> = Vec::new();
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f == "--query" || f == "--import" => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        if flag != "--query" && flag != "--import" {
            rest.push(a.clone());
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => it.next().cloned().ok_or_else(|| CliError::Usage(format!("{flag} needs a value")))?,
        };
        if flag == "--query" {
            for (k, v) in config::query_pairs(link_query(&value)) {
                if !config::PRESENTATION_KEYS.contains(&k.as_str()) {
                    front.extend([format!("--{k}"), v]);
                }
            }
        } else {
            let text = std::fs::read_to_string(&value).map_err(|e| CliError::Io { path: value.clone(), err: e.to_string() })?;
            files.push((value, text));
        }
    }
    if !files.is_empty() {
        let named: Vec<(&str, &str)> = files.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
        let imported = crate::frameworks::import(&named)?;
        if let Some(e) = imported.errors.first() {
            return Err(CliError::Import(e.clone()));
        }
        for (k, v) in &imported.pairs {
            front.extend([format!("--{k}"), v.clone()]);
        }
    }
    front.extend(rest);
    Ok(front)
}

/// Reads `plan`'s arguments: plan options, `--try-KNOB` lists, and every configuration key.
pub fn parse_plan_args(args: &[String]) -> Result<PlanArgs, CliError> {
    let mut rest: Vec<String> = Vec::new();
    let mut global: Option<GlobalBatch> = None;
    let mut tries: Vec<(String, String)> = Vec::new();
    let mut output = PlanOutput::Text;
    let mut fix = false;
    let mut all = false;
    let mut keep: Option<usize> = None;
    let mut assumptions = crate::estimator::cost::Assumptions::default();
    let mut it = args.iter();
    let value = |it: &mut std::slice::Iter<String>, name: &str, inline: Option<String>| -> Result<String, CliError> {
        match inline {
            Some(v) => Ok(v),
            None => it.next().cloned().ok_or_else(|| CliError::Usage(format!("--{name} needs a value"))),
        }
    };
    let count = |key: &str, v: &str| -> Result<u64, CliError> {
        config::parse_uint(v).map_err(|reason| ConfigError { key: key.into(), value: v.into(), reason }.into())
    };
    // A number the range `ok` accepts, else an error naming the key with `reason`.
    let number_in = |key: &str, v: &str, ok: fn(f64) -> bool, reason: String| -> Result<f64, CliError> {
        v.trim().parse::<f64>().ok().filter(|&f| ok(f)).ok_or_else(|| ConfigError { key: key.into(), value: v.into(), reason }.into())
    };
    let fraction = |key: &str, v: &str| number_in(key, v, |f| f > 0.0 && f <= 1.0, "must be a fraction in (0, 1]".into());
    let speedup = |key: &str, v: &str| {
        number_in(
            key,
            v,
            |f| (0.0..=MAX_COMPILE_SPEEDUP).contains(&f),
            format!("must be a fraction from 0 to {MAX_COMPILE_SPEEDUP} (0.1: compute 10 % faster)"),
        )
    };
    while let Some(a) = it.next() {
        let Some(flag) = a.strip_prefix("--") else {
            rest.push(a.clone());
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (flag.to_string(), None),
        };
        match name.as_str() {
            "json" => output = PlanOutput::Json,
            "csv" => output = PlanOutput::Csv,
            "fix" => fix = true,
            "all" => all = true,
            "no-overlap" => assumptions.overlap = false,
            "global-batch-tokens" => global = Some(GlobalBatch::Tokens(count("global_batch_tokens", &value(&mut it, &name, inline)?)?)),
            "global-batch" => global = Some(GlobalBatch::Sequences(count("global_batch", &value(&mut it, &name, inline)?)?)),
            "top" => keep = Some(count("top", &value(&mut it, &name, inline)?)? as usize),
            "compute-efficiency" => assumptions.compute_efficiency = fraction("compute_efficiency", &value(&mut it, &name, inline)?)?,
            "link-efficiency" => assumptions.link_efficiency = fraction("link_efficiency", &value(&mut it, &name, inline)?)?,
            "compile-speedup" => assumptions.compile_speedup = speedup("compile_speedup", &value(&mut it, &name, inline)?)?,
            n if n.starts_with("try-") => {
                let knob = n["try-".len()..].replace('-', "_");
                if !plan::KNOBS.contains(&knob.as_str()) {
                    return Err(CliError::Usage(format!("--{n}: no such knob (try one of {})", plan::KNOBS.join(", "))));
                }
                tries.push((knob, value(&mut it, &name, inline)?));
            }
            _ => {
                rest.push(a.clone());
                if inline.is_none() {
                    if let Some(v) = it.next() {
                        rest.push(v.clone());
                    }
                }
            }
        }
    }
    let (base, json) = parse_estimate_args(&rest)?;
    if json {
        output = PlanOutput::Json;
    }
    let global = match global {
        Some(g) => g,
        None if fix => GlobalBatch::Sequences(base.batch * base.accum * base.dp().max(1)),
        None => return Err(CliError::Usage("give the target's global batch: --global-batch-tokens N or --global-batch SEQUENCES".into())),
    };
    let mut space = Space::default_for(&base);
    for (knob, list) in &tries {
        apply_try(&mut space, &base, knob, list)?;
    }
    let mut request = PlanRequest { base, global_batch: global, space, assumptions, keep: plan::DEFAULT_KEEP, skip_dominated: !all };
    if let Some(k) = keep {
        request.keep = k;
    }
    Ok(PlanArgs { request, output, fix })
}

/// Sets one knob's allowed values from a comma-separated list, each read by the configuration
/// key of the same name (so `--try-zero 2,3,full_shard` takes the URL's spellings).
fn apply_try(space: &mut Space, base: &Config, knob: &str, list: &str) -> Result<(), CliError> {
    let mut values: Vec<Config> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let mut c = base.clone();
        config::set(&mut c, knob, item)?;
        values.push(c);
    }
    if values.is_empty() {
        return Err(ConfigError { key: knob.into(), value: list.into(), reason: "lists no value".into() }.into());
    }
    if !space.set_from(knob, &values) {
        return Err(CliError::Usage(format!("--try-{knob}: no such knob")));
    }
    Ok(())
}

/// Runs `trainmem plan` and renders its output.
pub fn run_plan(args: &PlanArgs) -> Result<String, CliError> {
    let req = &args.request;
    if args.fix {
        let fixes = plan::cheapest_fixes(&req.base, &req.assumptions, plan::DEFAULT_FIXES)?;
        return Ok(render_fixes(&req.base, &fixes, args.output));
    }
    let started = std::time::Instant::now();
    let result = plan::plan(req.clone())?;
    let seconds = started.elapsed().as_secs_f64();
    // Where nothing fits, the same search with the knobs that take memory off the GPU opened
    // (text and JSON; the CSV stays the asked search's rows, its columns one search's).
    let widened = if result.plans.is_empty() && args.output != PlanOutput::Csv {
        let started = std::time::Instant::now();
        plan::widen(req)?.map(|w| (w, started.elapsed().as_secs_f64()))
    } else {
        None
    };
    let widened = widened.as_ref().map(|(w, s)| (w, *s));
    Ok(match args.output {
        PlanOutput::Json => format!("{}\n", plan_json(req, &result, seconds, widened)),
        PlanOutput::Csv => plan::to_csv(&result, config::encode_query),
        PlanOutput::Text if result.plans.is_empty() => {
            let mut s = render_plan(req, &result, seconds);
            s.push_str(&render_widened(widened));
            s
        }
        PlanOutput::Text => render_plan(req, &result, seconds),
    })
}

/// Where nothing fits: what the same search finds with the knobs that take memory off the GPU
/// and still train every parameter opened ([`plan::widen`]; `None` where they were open
/// already), with the flags that open them.
fn render_widened(widened: Option<(&plan::Widened, f64)>) -> String {
    let Some((w, seconds)) = widened else {
        return "(offload, act_offload and optim are open already: LoRA or QLoRA, --try-finetune full,lora,qlora, changes what is trained)\n"
            .into();
    };
    let flags: Vec<String> =
        w.opened().into_iter().map(|(key, values)| format!("--try-{} {}", key.replace('_', "-"), values.join(","))).collect();
    let mut s =
        format!("\nthe knobs that take memory off the GPU and still train every parameter (at a cost in step time or in the optimizer states' precision), opened as well ({}):\n\n", flags.join(" "));
    if w.result.plans.is_empty() {
        s.push_str("none of those fits either: LoRA or QLoRA (--try-finetune full,lora,qlora) changes what is trained; or add GPUs\n");
    } else {
        s.push_str(&render_plan(&w.request, &w.result, seconds));
    }
    s
}

/// The stable JSON document of `trainmem plan --json` (the page's JSON export is the same,
/// from [`plan::to_json`]), with the widened search where the asked one found nothing.
pub fn plan_json(req: &PlanRequest, r: &plan::PlanResult, seconds: f64, widened: Option<(&plan::Widened, f64)>) -> String {
    plan::to_json(req, r, seconds, widened, config::encode_query)
}

fn gpu_name(cfg: &Config) -> String {
    crate::estimator::gpu::gpu(&cfg.gpu).map_or_else(|| format!("custom GPU ({} GiB)", cfg.gpu_gib), |g| g.name.to_string())
}

fn seconds_text(s: f64) -> String {
    if s >= 100.0 {
        format!("{s:.0} s")
    } else if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.0} ms", s * 1000.0)
    }
}

fn render_plan(req: &PlanRequest, r: &plan::PlanResult, seconds: f64) -> String {
    let b = &req.base;
    let u = b.unit;
    let p = &r.progress;
    let mut s = String::new();
    s.push_str(&format!(
        "Plan for {} on {} × {}, {} per node, {}\n",
        b.display_name(),
        b.gpus,
        gpu_name(b),
        b.gpus_per_node,
        crate::estimator::cost::interconnect_name(b.interconnect)
    ));
    s.push_str(&format!(
        "target: {} sequences × {} tokens = {} tokens per step\n",
        r.global_sequences,
        b.seq,
        crate::estimator::expr::group_digits(r.global_tokens as u128)
    ));
    s.push_str(&format!(
        "searched {} configurations in {}: {} fit, {} do not, {} pruned (proven not to fit), {} dominated (skipped; --all lists them), {} invalid; {} estimate() calls ({} probes)\n",
        p.configurations,
        seconds_text(seconds),
        p.fitting,
        p.not_fitting,
        p.pruned,
        p.dominated,
        p.invalid,
        p.estimate_calls,
        p.probe_calls
    ));
    s.push_str(&format!("step times, throughput and MFU are an {}\n\n", r.label));
    if r.plans.is_empty() {
        s.push_str("no configuration of the space fits; try `--fix` on one, more GPUs, or a wider space (--try-KNOB)\n");
        return s;
    }
    // Knobs the space varies beyond the usual ones get a column each.
    let sp = &req.space;
    const ALWAYS_SHOWN: [&str; 9] = ["batch", "zero", "recompute", "tp", "pp", "vpp", "cp", "ep", "sp"];
    let extra: Vec<&str> =
        plan::KNOBS.iter().copied().filter(|k| !ALWAYS_SHOWN.contains(k) && sp.tried(k).is_some_and(|n| n > 1)).collect();
    let mut head = format!(
        "{:>4}  {:>10}  {:>10}  {:>5}  {:>10}  {:>10}  {:>7}  {:<13} {:<9} {:>2} {:>2} {:>3} {:>2} {:>2} {:<3}",
        "rank", "step est.", "tokens/s", "MFU", "memory", "headroom", "b×acc", "zero", "recompute", "tp", "pp", "vpp", "cp", "ep", "sp"
    );
    for k in &extra {
        head.push_str(&format!(" {k:<16}"));
    }
    s.push_str(head.trim_end());
    s.push('\n');
    let frontier: Vec<usize> = r.frontier.iter().map(|f| f.rank).collect();
    for pl in &r.plans {
        let k = &pl.knobs;
        let mut row = format!(
            "{:>4}{} {:>10}  {:>10}  {:>4.0}%  {:>10}  {:>10}  {:>7}  {:<13} {:<9} {:>2} {:>2} {:>3} {:>2} {:>2} {:<3}",
            pl.rank,
            if frontier.contains(&pl.rank) { "*" } else { " " },
            seconds_text(pl.step_s),
            format_count(pl.tokens_per_s as u64),
            pl.mfu * 100.0,
            format_bytes(pl.memory, u),
            format_bytes(pl.headroom.max(0) as u128, u),
            format!("{}×{}", k.batch, k.accum),
            config::get(&pl.config, "zero").unwrap_or_default(),
            config::get(&pl.config, "recompute").unwrap_or_default(),
            k.tp,
            k.pp,
            k.vpp,
            k.cp,
            k.ep,
            if k.sp { "on" } else { "off" }
        );
        for key in &extra {
            row.push_str(&format!(" {:<16}", config::get(&pl.config, key).unwrap_or_default()));
        }
        s.push_str(row.trim_end());
        s.push('\n');
    }
    s.push_str(&format!(
        "\n* on the frontier (headroom against estimated step time): ranks {}\n",
        frontier.iter().map(|r| if *r == 0 { "beyond the list".to_string() } else { r.to_string() }).collect::<Vec<_>>().join(", ")
    ));
    if let Some(top) = r.plans.first() {
        s.push_str(&format!("\nplan 1: ?{}\n", config::encode_query(&top.config)));
        if let Some(c) = &top.cost {
            s.push_str(&format!(
                "  estimated step {}: compute {}, exposed communication {}, pipeline bubble {}, optimizer {}\n",
                seconds_text(c.step_s),
                seconds_text(c.compute_s),
                seconds_text(c.exposed_comm_s),
                seconds_text(c.bubble_s),
                seconds_text(c.optimizer_s)
            ));
        }
        s.push_str("why plan 1 sets each knob where it does:\n");
        for reason in &r.explanation {
            s.push_str(&format!("  - {}\n", reason.sentence));
        }
    }
    s.push_str("\nassumptions of the estimate:\n");
    for a in &r.assumptions {
        s.push_str(&format!("  - {}\n", a.text));
    }
    s
}

#[derive(Serialize)]
struct FixJson<'a> {
    key: &'a str,
    value: &'a str,
    label: &'a str,
    headroom: i128,
    step_time_pct_estimate: f64,
    flops_pct: f64,
    changes_training: bool,
    sentence: &'a str,
    query: String,
}

fn render_fixes(base: &Config, fixes: &[plan::Fix], output: PlanOutput) -> String {
    if output == PlanOutput::Json {
        let v: Vec<FixJson> = fixes
            .iter()
            .map(|f| FixJson {
                key: f.key,
                value: &f.value,
                label: &f.label,
                headroom: f.headroom,
                step_time_pct_estimate: f.step_time_pct,
                flops_pct: f.flops_pct,
                changes_training: f.changes_training,
                sentence: &f.sentence,
                query: config::encode_query(&f.config),
            })
            .collect();
        return format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    let mut s = String::new();
    if fixes.is_empty() {
        let fits = crate::estimator::analyse(base).is_ok_and(|a| a.verdict.fits);
        s.push_str(if fits {
            "it fits already\n"
        } else {
            "no single change makes it fit: `trainmem plan` without --fix searches combinations of changes\n"
        });
        return s;
    }
    s.push_str("the cheapest single changes that make it fit (step time is an estimate):\n");
    for f in fixes {
        s.push_str(&format!("  - {}\n    ?{}\n", f.sentence, config::encode_query(&f.config)));
    }
    s
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
    s.push_str(&format!("{:<40} {:>12}   (torch.cuda.max_memory_allocated)\n", "Allocated peak", format_bytes(e.memory.allocated_peak, u)));
    if let (Some(res), Some(smi)) = (e.memory.reserved_peak, e.memory.nvidia_smi) {
        s.push_str(&format!("{:<40} {:>12}   (torch.cuda.max_memory_reserved, simulated)\n", "Reserved peak", format_bytes(res, u)));
        s.push_str(&format!(
            "{:<40} {:>12}   = reserved + CUDA context + cuBLAS workspaces + NCCL buffers; the verdict uses it\n",
            "What nvidia-smi will show",
            format_bytes(smi, u)
        ));
    }
    let logs = crate::estimator::logs::log_lines(cfg, e);
    if !logs.is_empty() {
        s.push_str("What the logs will say (the step's figures, in each framework's format):\n");
        for l in &logs {
            s.push_str(&format!("  {:<12} {}\n", l.framework, l.line));
        }
    }
    s.push_str(&format!("{:<40} {:>12}\n", "GPU capacity", format_bytes(e.capacity, u)));
    let h = e.headroom();
    if h >= 0 {
        s.push_str(&format!("fits, with {} headroom\n", format_bytes(h as u128, u)));
    } else {
        s.push_str(&format!("does not fit: needs {} more\n", format_bytes(h.unsigned_abs(), u)));
        s.push_str("  the cheapest single changes that fit: `trainmem plan --fix` with the same flags; combinations of them: `trainmem plan --gpu ID --gpus N --seq N --global-batch N`\n");
    }
    if e.memory.host > 0 {
        s.push_str(&format!("host memory per GPU process: {}\n", format_bytes(e.memory.host, u)));
    }
    for w in &e.warnings {
        s.push_str(&format!("warning: {w}\n"));
    }
    s
}

/// The step's event stream: CSV (one row per event) or JSON (the stream, reserved per event and
/// the reserved peak).
fn render_step(cfg: &Config, json: bool) -> Result<String, CliError> {
    let r = crate::estimator::reserve::stream_with_reserved(cfg, crate::estimator::stream_at(cfg)?)?;
    if json {
        let v = serde_json::json!({
            "configuration": crate::config::encode_query(cfg),
            "resident_bytes": r.stream.resident,
            "allocated_peak_bytes": r.stream.peak,
            "peak_event": r.stream.peak_index,
            "reserved_peak_bytes": r.reserved_peak,
            "reserved_peak_at": r.reserved_at,
            "reserved_after_bytes": r.reserved,
            "events": r.stream.events,
        });
        return Ok(format!("{v}\n"));
    }
    let mut s = String::from("index,kind,phase,layer,module,op,node,category,bytes,allocated_bytes,reserved_bytes\n");
    let quote = |t: &str| if t.contains([',', '"']) { format!("\"{}\"", t.replace('"', "\"\"")) } else { t.to_string() };
    for (i, e) in r.stream.events.iter().enumerate() {
        let reserved = r.reserved.as_ref().and_then(|v| v.get(i)).map(|b| b.to_string()).unwrap_or_default();
        s.push_str(&format!(
            "{i},{},{},{},{},{},{},{},{},{},{reserved}\n",
            if e.kind == crate::estimator::step::EventKind::Alloc { "alloc" } else { "free" },
            e.phase.name(),
            e.layer.map(|l| l.to_string()).unwrap_or_default(),
            quote(e.module),
            quote(e.op),
            quote(e.node),
            match e.cat {
                crate::estimator::step::Cat::Activations => "activations",
                crate::estimator::step::Cat::Gradients => "gradients",
                crate::estimator::step::Cat::Transient => "transient",
                crate::estimator::step::Cat::Gathered => "gathered",
            },
            e.bytes,
            r.stream.resident + e.live,
        ));
    }
    Ok(s)
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

/// `trainmem import FILE... [--as FORMAT] [--json]`: the query on the first line, then one
/// line per key (or the JSON document); keys whose values could not be used are listed on
/// stderr too and make the exit status 1, with the rest of the configuration still printed.
fn run_import(args: &[String], out: &mut dyn Write) -> Result<(), CliError> {
    use crate::frameworks::{import_with, Format};
    let mut json = false;
    let mut format: Option<Format> = None;
    let mut paths: Vec<(String, Option<Format>)> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => json = true,
            "--as" => {
                let name = it.next().ok_or_else(|| CliError::Usage("--as needs a format".into()))?;
                format = Some(Format::parse(name).ok_or_else(|| {
                    CliError::Usage(format!(
                        "--as {name}: expected one of {}",
                        Format::ALL.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")
                    ))
                })?);
            }
            flag if flag.starts_with("--") => return Err(CliError::Usage(format!("import: unexpected option '{flag}'"))),
            path => paths.push((path.to_string(), format)),
        }
    }
    if paths.is_empty() {
        return Err(CliError::Usage("import needs at least one file".into()));
    }
    let mut texts = Vec::new();
    for (p, f) in &paths {
        let text = std::fs::read_to_string(p).map_err(|e| CliError::Io { path: p.clone(), err: e.to_string() })?;
        texts.push((p.clone(), text, *f));
    }
    let files: Vec<(&str, &str, Option<Format>)> = texts.iter().map(|(p, t, f)| (p.as_str(), t.as_str(), *f)).collect();
    let imported = import_with(&files)?;
    let text = if json { format!("{}\n", imported.to_json()) } else { imported.to_text() };
    out.write_all(text.as_bytes()).map_err(|e| CliError::Io { path: "stdout".into(), err: e.to_string() })?;
    match imported.errors.first() {
        Some(e) => Err(CliError::Import(e.clone())),
        None => Ok(()),
    }
}

/// `trainmem export --format F [--out DIR] [--KEY VALUE ...]`.
fn run_export(args: &[String], out: &mut dyn Write) -> Result<(), CliError> {
    use crate::frameworks::{export, export_files, ExportFormat};
    let (rest, dir) = take_out(args)?;
    let mut format = None;
    let mut keys = Vec::new();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        if a == "--format" || a.starts_with("--format=") {
            let name = match a.strip_prefix("--format=") {
                Some(v) => v.to_string(),
                None => it.next().cloned().ok_or_else(|| CliError::Usage("--format needs a value".into()))?,
            };
            format = Some(ExportFormat::parse(&name).ok_or_else(|| {
                CliError::Usage(format!(
                    "--format {name}: expected one of {}",
                    ExportFormat::ALL.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")
                ))
            })?);
        } else {
            keys.push(a.clone());
        }
    }
    let format =
        format.ok_or_else(|| CliError::Usage("export needs --format torchtune|torchtitan|accelerate-deepspeed|megatron".into()))?;
    if keys.iter().any(|a| a == "--json") {
        return Err(CliError::Usage("export writes a framework's file; --json is not one of its options".into()));
    }
    let (cfg, _) = parse_estimate_args(&keys)?;
    let write = |out: &mut dyn Write, s: String| {
        out.write_all(s.as_bytes()).map_err(|e| CliError::Io { path: "stdout".into(), err: e.to_string() })
    };
    match dir {
        None => write(out, export(&cfg, format)),
        Some(dir) => {
            std::fs::create_dir_all(&dir).map_err(|e| CliError::Io { path: dir.clone(), err: e.to_string() })?;
            for f in export_files(&cfg, format) {
                let path = std::path::Path::new(&dir).join(&f.name);
                std::fs::write(&path, &f.text).map_err(|e| CliError::Io { path: path.display().to_string(), err: e.to_string() })?;
                write(out, format!("wrote {}\n", path.display()))?;
            }
            Ok(())
        }
    }
}

/// `trainmem recipes`: each recipe preset, its source and what it sets.
fn render_recipes(json: bool) -> String {
    if json {
        #[derive(Serialize)]
        struct R<'a> {
            id: &'a str,
            framework: &'a str,
            title: &'a str,
            repo: &'a str,
            version: &'a str,
            path: &'a str,
            query: String,
        }
        let all: Vec<R> = config::RECIPES
            .iter()
            .map(|r| R {
                id: r.id,
                framework: r.framework,
                title: r.title,
                repo: r.repo,
                version: r.version,
                path: r.path,
                query: r.pairs.iter().map(|(k, v)| format!("{k}={}", config::percent_encode(v))).collect::<Vec<_>>().join("&"),
            })
            .collect();
        return format!("{}\n", serde_json::to_string_pretty(&all).unwrap_or_default());
    }
    let mut s = String::new();
    for r in config::RECIPES {
        s.push_str(&format!("{:<44} {} ({} {}: {})\n", r.id, r.title, r.repo, r.version, r.path));
        s.push_str(&format!("{:<44} {}\n", "", r.pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")));
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
    fn a_query_whose_values_hold_a_question_mark_is_a_query_and_a_link_gives_its_query() {
        assert_eq!(link_query("name=?&ssm_heads=1"), "name=?&ssm_heads=1");
        assert_eq!(link_query("https://example.org/trainmem/?model=gpt2&name=a?b"), "model=gpt2&name=a?b");
        assert_eq!(link_query("?model=gpt2"), "model=gpt2");
        assert_eq!(link_query("model=gpt2"), "model=gpt2");
        let args = expand_sources(&["--query".to_string(), "name=?&seq=512".to_string()]).expect("expands");
        assert_eq!(args, ["--name", "?", "--seq", "512"]);
    }

    #[test]
    fn the_usage_lists_every_planner_knob_as_its_flag_spells_it() {
        let line = USAGE.split("KNOB:").nth(1).and_then(|r| r.split("also:").next()).expect("the KNOB list");
        let listed: Vec<&str> = line.split_whitespace().collect();
        let knobs: Vec<String> = plan::KNOBS.iter().map(|k| k.replace('_', "-")).collect();
        assert_eq!(listed, knobs);
    }

    #[test]
    fn plan_reads_its_cost_assumptions_within_their_ranges_and_names_the_key_of_one_outside() {
        let a = parse_plan_args(&args(
            "--model llama-3.1-8b --global-batch 8 --compute-efficiency 0.4 --compile-speedup=0 --link-efficiency 1",
        ))
        .expect("valid");
        let got = &a.request.assumptions;
        assert_eq!((got.compute_efficiency, got.compile_speedup, got.link_efficiency), (0.4, 0.0, 1.0));
        for (flag, key) in [
            ("--compute-efficiency 0", "compute_efficiency"),
            ("--link-efficiency 1.5", "link_efficiency"),
            ("--compile-speedup 1.01", "compile_speedup"),
            ("--compile-speedup NaN", "compile_speedup"),
            ("--compute-efficiency half", "compute_efficiency"),
        ] {
            let e = parse_plan_args(&args(&format!("--model llama-3.1-8b --global-batch 8 {flag}"))).expect_err(flag).to_string();
            assert!(e.contains(key) && e.contains("must be a fraction"), "{flag}: {e}");
        }
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
    fn plan_reads_its_target_its_knob_lists_and_every_key() {
        let a = parse_plan_args(&args(
            "--model llama-3.1-8b --gpus 16 --seq 4k --global-batch-tokens 1m --try-zero 1,3 --try-tp 2,4 --top 5 --json",
        ))
        .expect("valid");
        assert_eq!(a.output, PlanOutput::Json);
        assert_eq!(a.request.global_batch, GlobalBatch::Tokens(1 << 20));
        assert_eq!(a.request.space.zero, vec![crate::config::Zero::Z1, crate::config::Zero::Z3]);
        assert_eq!(a.request.space.tp, vec![2, 4]);
        assert_eq!(a.request.keep, 5);
        assert_eq!((a.request.base.gpus, a.request.base.seq), (16, 4096));
    }

    #[test]
    fn a_bad_knob_value_names_the_key() {
        let err = parse_plan_args(&args("--global-batch 8 --try-zero 9")).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.starts_with("`zero` = '9'")));
        assert!(matches!(parse_plan_args(&args("--gpus 8")), Err(CliError::Usage(_))));
        assert!(matches!(parse_plan_args(&args("--global-batch 8 --try-colour red")), Err(CliError::Usage(_))));
    }

    #[test]
    fn plan_prints_ranked_plans_with_their_share_links() {
        let mut out = Vec::new();
        run(&args("plan --model qwen2.5-0.5b --gpus 8 --seq 1024 --global-batch 32 --top 3"), &mut out).expect("runs");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(text.contains("estimate") && text.contains("plan 1: ?") && text.contains("why plan 1"), "{text}");
    }

    #[test]
    fn unknown_commands_and_keys_fail() {
        let mut out = Vec::new();
        assert!(matches!(run(&args("frobnicate"), &mut out), Err(CliError::Usage(_))));
        assert!(matches!(run(&args("estimate --colour blue"), &mut out), Err(CliError::Config(_))));
    }
}
