//! Results of a sweep: the per-point table, log-log fits, CSV and JSON.

use super::info::{AdapterSummary, CopyProbe, TimingMethod};
use super::shape::Dtype;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Why a kernel's part of the sweep (or the whole sweep) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// Every planned sequence length up to `max_seq` ran.
    MaxSeq,
    /// The next point's buffers would exceed the user's memory cap.
    MemoryCap,
    /// The next point's buffers or dispatches would exceed the device's limits.
    AdapterLimit,
    /// The next point would not finish within the time budget.
    TimeBudget,
    /// The device's limits allowed the next point's buffers but the GPU ran out of memory.
    OutOfMemory,
    /// The cancellation flag was set.
    Cancelled,
}

impl StopReason {
    pub const ALL: [StopReason; 6] = [
        StopReason::MaxSeq,
        StopReason::MemoryCap,
        StopReason::AdapterLimit,
        StopReason::TimeBudget,
        StopReason::OutOfMemory,
        StopReason::Cancelled,
    ];

    /// The JSON spelling (`max_seq`, `memory_cap`, …).
    pub fn name(self) -> &'static str {
        match self {
            StopReason::MaxSeq => "max_seq",
            StopReason::MemoryCap => "memory_cap",
            StopReason::AdapterLimit => "adapter_limit",
            StopReason::TimeBudget => "time_budget",
            StopReason::OutOfMemory => "out_of_memory",
            StopReason::Cancelled => "cancelled",
        }
    }

    /// Reads [`StopReason::name`].
    pub fn parse(s: &str) -> Option<StopReason> {
        StopReason::ALL.into_iter().find(|r| r.name() == s)
    }

    pub fn label(self) -> &'static str {
        match self {
            StopReason::MaxSeq => "reached max seq",
            StopReason::MemoryCap => "memory cap",
            StopReason::AdapterLimit => "adapter limit",
            StopReason::TimeBudget => "time budget",
            StopReason::OutOfMemory => "out of gpu memory",
            StopReason::Cancelled => "cancelled",
        }
    }
}

/// One kernel at one sequence length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelPoint {
    /// Median of the timed runs, in milliseconds.
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    /// Timed runs (after the warm-up).
    pub runs: u32,
    pub timing: TimingMethod,
    /// Sum of the sizes of every buffer this kernel's run created or bound (Q, K, V, the
    /// kernel's own buffers, the params uniform and the timestamp buffers).
    pub bytes_allocated: u64,
    /// Compulsory memory traffic of one run: Q, K, V read and O written once; for the
    /// materialized path also S written (scores), read and written (softmax) and read (P·V).
    pub bytes_moved: u64,
    /// `bytes_moved / median`, GB/s (10⁹ B/s).
    pub gb_per_s: f64,
    /// `4·b·a·s²·d / median` (the two matmuls), GFLOP/s.
    pub gflop_per_s: f64,
    /// `gb_per_s` over the copy probe's bandwidth, where the probe ran.
    pub fraction_of_copy: Option<f64>,
}

/// One sequence length of the sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    pub seq: u32,
    /// Bytes of the materialized score matrix, `b·a·s²·element size`: the estimator's
    /// attention-score term.
    pub score_bytes: u64,
    /// `None` where the materialized path no longer fits (or was not run).
    pub materialized: Option<KernelPoint>,
    pub fused: Option<KernelPoint>,
}

/// Log-log slopes of one kernel: time ∝ s^time, memory ∝ s^memory.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct KernelSlopes {
    /// `None` with fewer than two points.
    pub time: Option<f64>,
    pub memory: Option<f64>,
}

/// The fitted exponents of both kernels.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Slopes {
    /// `memory` fits every buffer of the run (Q, K, V, O and S): it tends to 2 as S dominates.
    pub materialized: KernelSlopes,
    /// `memory` fits Q, K, V, O: 1.
    pub fused: KernelSlopes,
    /// The score matrix alone (`b·a·s²·4` bytes) over the points the materialized path ran:
    /// 2, the term the estimator predicts.
    pub scores_memory: Option<f64>,
}

impl Slopes {
    /// Fits time and memory against seq for each kernel, from `(seq, ms, bytes)` series; and
    /// the score matrix's bytes, `score_bytes_per_seq2 · s²` (that is `b·a·element size`), over
    /// the materialized series' seqs.
    pub fn fit(materialized: &[(f64, f64, f64)], fused: &[(f64, f64, f64)], score_bytes_per_seq2: u64) -> Slopes {
        let one = |series: &[(f64, f64, f64)]| {
            let time: Vec<(f64, f64)> = series.iter().map(|&(s, t, _)| (s, t)).collect();
            let memory: Vec<(f64, f64)> = series.iter().map(|&(s, _, b)| (s, b)).collect();
            KernelSlopes { time: fit_loglog(&time), memory: fit_loglog(&memory) }
        };
        let scores: Vec<(f64, f64)> = materialized.iter().map(|&(s, _, _)| (s, score_bytes_per_seq2 as f64 * s * s)).collect();
        Slopes { materialized: one(materialized), fused: one(fused), scores_memory: fit_loglog(&scores) }
    }
}

/// Everything a sweep measured. Serializes to the JSON the CLI prints (`--json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepResult {
    pub adapter: AdapterSummary,
    pub batch: u32,
    pub heads: u32,
    pub head_dim: u32,
    /// Element type of Q, K, V, S, O in GPU memory.
    pub dtype: Dtype,
    /// How the points were timed (wall clock if any point fell back to it).
    pub timing: TimingMethod,
    /// The copy-bandwidth probe, if it ran.
    pub copy: Option<CopyProbe>,
    /// The per-point table, by increasing seq.
    pub points: Vec<SweepPoint>,
    /// Log-log slopes of time and of `bytes_allocated` against seq, for both kernels, and of
    /// the score matrix's bytes.
    pub slopes: Slopes,
    /// The largest seq the materialized path ran at.
    pub largest_materialized_seq: Option<u32>,
    /// The largest seq whose score matrix this device's limits allow for this shape (ignoring
    /// the memory cap): the most it could ever materialize in one buffer.
    pub materializable_seq_limit: u32,
    /// Why the materialized path stopped.
    pub materialized_stop: StopReason,
    /// Why the sweep stopped.
    pub stop: StopReason,
    /// Wall time of the whole sweep, ms.
    pub elapsed_ms: f64,
}

impl SweepResult {
    /// The per-point table as CSV (header line, then one line per seq; empty cells where a
    /// kernel did not run).
    pub fn to_csv(&self) -> String {
        let mut out = String::from(
            "seq,score_bytes,materialized_ms,materialized_bytes,materialized_gb_per_s,materialized_gflop_per_s,\
             materialized_fraction_of_copy,fused_ms,fused_bytes,fused_gb_per_s,fused_gflop_per_s\n",
        );
        let opt = |x: Option<f64>| x.map(|v| format!("{v:.6}")).unwrap_or_default();
        for p in &self.points {
            let m = p.materialized.as_ref();
            let f = p.fused.as_ref();
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{}",
                p.seq,
                p.score_bytes,
                opt(m.map(|k| k.median_ms)),
                m.map(|k| k.bytes_allocated.to_string()).unwrap_or_default(),
                opt(m.map(|k| k.gb_per_s)),
                opt(m.map(|k| k.gflop_per_s)),
                opt(m.and_then(|k| k.fraction_of_copy)),
                opt(f.map(|k| k.median_ms)),
                f.map(|k| k.bytes_allocated.to_string()).unwrap_or_default(),
                opt(f.map(|k| k.gb_per_s)),
                opt(f.map(|k| k.gflop_per_s)),
            );
        }
        out
    }

    /// Pretty JSON of the whole result.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// `(seq, median ms, bytes allocated)` of the points where the kernel ran.
    pub fn series(&self, fused: bool) -> Vec<(f64, f64, f64)> {
        self.points
            .iter()
            .filter_map(|p| {
                let k = if fused { p.fused.as_ref() } else { p.materialized.as_ref() }?;
                Some((p.seq as f64, k.median_ms, k.bytes_allocated as f64))
            })
            .collect()
    }
}

/// Least-squares slope of `ln y` against `ln x`: the exponent `k` of `y ≈ c·xᵏ`.
///
/// Points with a non-positive or non-finite coordinate are skipped; `None` when fewer than
/// two distinct `x` remain.
pub fn fit_loglog(points: &[(f64, f64)]) -> Option<f64> {
    let logs: Vec<(f64, f64)> =
        points.iter().filter(|(x, y)| x.is_finite() && y.is_finite() && *x > 0.0 && *y > 0.0).map(|(x, y)| (x.ln(), y.ln())).collect();
    let n = logs.len() as f64;
    if logs.len() < 2 {
        return None;
    }
    let mx = logs.iter().map(|p| p.0).sum::<f64>() / n;
    let my = logs.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = logs.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = logs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx <= 1e-12 {
        return None;
    }
    let slope = sxy / sxx;
    slope.is_finite().then_some(slope)
}

/// Median (mean of the middle two for an even count); 0 for no values.
pub fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_of_a_quadratic_is_two_and_of_a_line_is_one() {
        let quad: Vec<(f64, f64)> = [256.0, 384.0, 512.0, 768.0, 1024.0].iter().map(|&s| (s, 4.0 * s * s)).collect();
        let line: Vec<(f64, f64)> = [256.0, 384.0, 512.0, 768.0, 1024.0].iter().map(|&s| (s, 1e3 * s)).collect();
        assert!((fit_loglog(&quad).unwrap() - 2.0).abs() < 1e-9);
        assert!((fit_loglog(&line).unwrap() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn the_fit_of_noisy_quadratic_timings_is_close_to_two() {
        // ±10 % multiplicative noise, deterministic.
        let noise = [1.08, 0.93, 1.02, 0.97, 1.1, 0.9, 1.0];
        let pts: Vec<(f64, f64)> = (0..7)
            .map(|i| {
                let s = 256.0 * 2f64.powf(i as f64 / 2.0);
                (s, 1e-6 * s * s * noise[i])
            })
            .collect();
        let k = fit_loglog(&pts).unwrap();
        assert!((k - 2.0).abs() < 0.1, "{k}");
    }

    #[test]
    fn the_fit_needs_two_distinct_positive_points() {
        assert_eq!(fit_loglog(&[]), None);
        assert_eq!(fit_loglog(&[(1.0, 2.0)]), None);
        assert_eq!(fit_loglog(&[(3.0, 2.0), (3.0, 5.0)]), None);
        assert_eq!(fit_loglog(&[(0.0, 2.0), (-1.0, 5.0), (f64::NAN, 1.0)]), None);
        assert!(fit_loglog(&[(0.0, 2.0), (2.0, 4.0), (4.0, 8.0)]).is_some());
    }

    #[test]
    fn stop_reasons_are_named_as_serde_writes_them() {
        for r in StopReason::ALL {
            assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{}\"", r.name()));
            assert_eq!(StopReason::parse(r.name()), Some(r));
        }
    }

    #[test]
    fn the_median_takes_the_middle_value() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn slopes_fit_each_kernel_separately() {
        let mat: Vec<(f64, f64, f64)> = [512.0, 1024.0, 2048.0].iter().map(|&s| (s, s * s, 4.0 * s * s)).collect();
        let fused: Vec<(f64, f64, f64)> = [512.0, 1024.0, 2048.0].iter().map(|&s| (s, s * s, 4.0 * s)).collect();
        let sl = Slopes::fit(&mat, &fused, 8);
        assert!((sl.scores_memory.unwrap() - 2.0).abs() < 1e-9);
        assert!((sl.materialized.memory.unwrap() - 2.0).abs() < 1e-9);
        assert!((sl.fused.memory.unwrap() - 1.0).abs() < 1e-9);
        assert!((sl.fused.time.unwrap() - 2.0).abs() < 1e-9);
        let json = serde_json::to_value(sl).unwrap();
        assert!(json["materialized"]["time"].is_number() && json["fused"]["memory"].is_number());
    }
}
