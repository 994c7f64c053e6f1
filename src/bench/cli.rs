//! `trainmem bench`: the sweep natively (Vulkan, Metal or DX12; lavapipe on a machine without a
//! GPU), as a table or as JSON.

use super::gpu::{Bench, BenchOptions};
use super::plan::{SweepOptions, SweepProgress};
use super::results::{StopReason, SweepResult};
use super::shape::Dtype;
use super::verify::{self, VerifyReport};
use std::fmt::Write as _;
use std::io::IsTerminal;

/// The CLI's defaults: small enough to finish in well under a minute on lavapipe (2 cores);
/// the time budget bounds the sweep on anything slower.
pub fn default_options() -> SweepOptions {
    SweepOptions {
        heads: 1,
        head_dim: 64,
        min_seq: 256,
        max_seq: 768,
        mem_cap_bytes: 512 << 20,
        budget_ms: 25_000.0,
        warmup: 1,
        runs: 3,
        copy_probe_bytes: 64 << 20,
        ..SweepOptions::default()
    }
}

const HELP: &str = "trainmem bench [--max-seq N] [--heads N] [--head-dim N] [--budget-ms N] [--mem-mib N] [--json]
  also: [--min-seq N] [--batch N] [--runs N] [--copy-mib N] [--dtype f32|f16] [--verify]
Times attention with the score matrix materialized (as eager PyTorch) and fused (FlashAttention-
style) over seq = 256, 384, 512, 768, … on this machine's GPU, next to a copy-bandwidth probe.";

/// What `trainmem bench` was asked to do.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchArgs {
    pub sweep: SweepOptions,
    /// Print JSON instead of a table.
    pub json: bool,
    /// Check both kernels against the CPU reference instead of sweeping.
    pub verify: bool,
}

/// Parses the arguments of `trainmem bench`; `None` for `--help`.
pub fn parse_args(args: &[String]) -> Result<Option<BenchArgs>, String> {
    let mut opts = default_options();
    let mut json = false;
    let mut verify = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--json" {
            json = true;
            continue;
        }
        if arg == "--verify" {
            verify = true;
            continue;
        }
        if arg == "--help" || arg == "-h" {
            return Ok(None);
        }
        let Some(flag) = arg.strip_prefix("--") else {
            return Err(format!("unexpected argument '{arg}'\nusage: {HELP}"));
        };
        let (flag, value) = match flag.split_once('=') {
            Some((f, v)) => (f.to_string(), v.to_string()),
            None => (flag.to_string(), it.next().cloned().ok_or_else(|| format!("--{flag} needs a value"))?),
        };
        let int =
            |v: &str| -> Result<u64, String> { v.trim().parse::<u64>().map_err(|_| format!("--{flag} wants a whole number, not '{v}'")) };
        let small = |v: &str| -> Result<u32, String> { u32::try_from(int(v)?).map_err(|_| format!("--{flag} is too large")) };
        match flag.as_str() {
            "max-seq" => opts.max_seq = small(&value)?,
            "min-seq" => opts.min_seq = small(&value)?,
            "heads" => opts.heads = small(&value)?,
            "head-dim" => opts.head_dim = small(&value)?,
            "batch" => opts.batch = small(&value)?,
            "runs" => opts.runs = small(&value)?,
            "budget-ms" => opts.budget_ms = int(&value)? as f64,
            "mem-mib" => opts.mem_cap_bytes = int(&value)?.saturating_mul(1 << 20),
            "copy-mib" => opts.copy_probe_bytes = int(&value)?.saturating_mul(1 << 20),
            "dtype" => opts.dtype = Dtype::parse(&value).ok_or_else(|| format!("--dtype is f32 or f16, not '{value}'"))?,
            other => return Err(format!("unknown option '--{other}'\nusage: {HELP}")),
        }
    }
    if opts.max_seq < opts.min_seq {
        opts.min_seq = opts.max_seq.min(opts.min_seq);
    }
    Ok(Some(BenchArgs { sweep: opts, json, verify }))
}

/// `trainmem bench [--max-seq N] [--heads N] [--head-dim N] [--budget-ms N] [--mem-mib N] [--json]`.
pub fn run(args: &[String], out: &mut dyn std::io::Write) -> Result<(), String> {
    let Some(BenchArgs { sweep: opts, json, verify }) = parse_args(args)? else {
        return out.write_all(format!("usage: {HELP}\n").as_bytes()).map_err(|e| e.to_string());
    };
    let bench = pollster::block_on(Bench::new(BenchOptions::default())).map_err(|e| e.to_string())?;
    if verify {
        let report = pollster::block_on(verify::verify(&bench)).map_err(|e| e.to_string())?;
        let text =
            if json { format!("{}\n", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?) } else { render_verify(&report) };
        out.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
        return if report.passed { Ok(()) } else { Err("the gpu kernels disagree with the cpu reference".into()) };
    }
    let live = !json && std::io::stderr().is_terminal();
    let mut progress = |p: SweepProgress| {
        if let (true, Some(s)) = (live, p.seq) {
            eprint!("\rseq {s:>6}: {}/{} points, {:.1} s ", p.done, p.planned, p.elapsed_ms / 1e3);
        }
    };
    let result = pollster::block_on(bench.sweep(&opts, &mut progress, &())).map_err(|e| e.to_string())?;
    if live {
        eprintln!();
    }
    let text = if json { format!("{}\n", result.to_json()) } else { render_table(&result) };
    out.write_all(text.as_bytes()).map_err(|e| e.to_string())
}

/// The human-readable verification report.
pub fn render_verify(r: &VerifyReport) -> String {
    let mut s = String::from("kernels against the cpu reference (max abs error):\n");
    for c in &r.cases {
        let _ = writeln!(
            s,
            "  {} {:<44} S {:.1e}  materialized O {:.1e}  fused O {:.1e}  (tolerance {:.0e}) {}",
            c.dtype.name(),
            c.shape.to_string(),
            c.scores_max_abs_err,
            c.materialized_max_abs_err,
            c.fused_max_abs_err,
            c.tolerance,
            if c.passed { "ok" } else { "FAILED" }
        );
    }
    let _ = writeln!(s, "{}", if r.passed { "all passed" } else { "some cases FAILED" });
    s
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

fn slope(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.2}")).unwrap_or_else(|| "–".into())
}

/// The human-readable report of a sweep.
pub fn render_table(r: &SweepResult) -> String {
    let mut s = String::new();
    let a = &r.adapter;
    let _ = writeln!(s, "adapter: {} ({}, {}); timing: {}", a.name, a.backend, a.device_type, r.timing.label());
    let _ = writeln!(s, "shape: batch {} × {} heads × head_dim {}, {}", r.batch, r.heads, r.head_dim, r.dtype.name());
    match &r.copy {
        Some(c) => {
            let _ = writeln!(s, "copy bandwidth: {:.2} GB/s ({:.0} MiB buffers)", c.gb_per_s, mib(c.bytes));
        }
        None => {
            let _ = writeln!(s, "copy bandwidth: not measured");
        }
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "{:>6} | {:>30} materialized {:>13} | {:>14} fused {:>8}", "", "", "", "", "");
    let _ = writeln!(
        s,
        "{:>6} | {:>9} {:>9} {:>9} {:>7} {:>8} {:>9} | {:>9} {:>9} {:>8}",
        "seq", "ms", "MiB", "S MiB", "GB/s", "of copy", "GFLOP/s", "ms", "MiB", "GFLOP/s"
    );
    for p in &r.points {
        let m = match &p.materialized {
            Some(k) => format!(
                "{:>9.3} {:>9.2} {:>9.2} {:>7.2} {:>8} {:>9.2}",
                k.median_ms,
                mib(k.bytes_allocated),
                mib(p.score_bytes),
                k.gb_per_s,
                k.fraction_of_copy.map(|f| format!("{:.0} %", f * 100.0)).unwrap_or_else(|| "–".into()),
                k.gflop_per_s
            ),
            None => format!("{:>9} {:>9} {:>9.2} {:>7} {:>8} {:>9}", "–", "–", mib(p.score_bytes), "", "", ""),
        };
        let f = match &p.fused {
            Some(k) => format!("{:>9.3} {:>9.2} {:>8.2}", k.median_ms, mib(k.bytes_allocated), k.gflop_per_s),
            None => format!("{:>9} {:>9} {:>8}", "–", "–", ""),
        };
        let _ = writeln!(s, "{:>6} | {m} | {f}", p.seq);
    }
    let _ = writeln!(s);
    let sl = &r.slopes;
    let _ = writeln!(
        s,
        "log-log slopes vs seq: materialized time {}, memory {} (score matrix alone {}); fused time {}, memory {}",
        slope(sl.materialized.time),
        slope(sl.materialized.memory),
        slope(sl.scores_memory),
        slope(sl.fused.time),
        slope(sl.fused.memory)
    );
    let largest = r.largest_materialized_seq.map(|x| x.to_string()).unwrap_or_else(|| "none".into());
    let _ = writeln!(
        s,
        "largest materialized seq: {largest} (stopped: {}); this device's limits allow up to seq {} for this shape",
        r.materialized_stop.label(),
        r.materializable_seq_limit
    );
    let _ = write!(s, "sweep stopped: {} after {:.1} s", r.stop.label(), r.elapsed_ms / 1e3);
    if r.stop == StopReason::TimeBudget {
        let _ = write!(s, " (raise --budget-ms to go further)");
    }
    let _ = writeln!(s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_cli_reads_every_documented_option() {
        let BenchArgs { sweep: o, json, verify } =
            parse_args(&args(&["--max-seq", "1024", "--heads", "2", "--head-dim", "128", "--budget-ms", "5000", "--mem-mib=64", "--json"]))
                .unwrap()
                .unwrap();
        assert!(json && !verify);
        assert_eq!((o.max_seq, o.heads, o.head_dim, o.budget_ms, o.mem_cap_bytes), (1024, 2, 128, 5000.0, 64 << 20));
    }

    #[test]
    fn the_cli_rejects_unknown_options_and_bad_numbers() {
        assert!(parse_args(&args(&["--frobnicate", "1"])).is_err());
        assert!(parse_args(&args(&["--heads", "many"])).is_err());
        assert!(parse_args(&args(&["--heads"])).is_err());
        assert!(parse_args(&args(&["stray"])).is_err());
        assert!(parse_args(&args(&["--max-seq", "99999999999"])).is_err());
        assert_eq!(parse_args(&args(&["--help"])), Ok(None));
    }

    #[test]
    fn a_max_seq_below_the_default_minimum_still_sweeps() {
        let o = parse_args(&args(&["--max-seq", "128"])).unwrap().unwrap().sweep;
        assert!(o.min_seq <= o.max_seq);
        let a = parse_args(&args(&["--verify", "--dtype", "f16"])).unwrap().unwrap();
        assert!(a.verify && a.sweep.dtype == Dtype::F16);
        assert!(parse_args(&args(&["--dtype", "bf16"])).is_err());
    }
}
