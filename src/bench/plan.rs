//! Planning a sweep over sequence lengths, without a GPU: the ladder of lengths, what each
//! kernel's buffers and dispatches need at a length against the device's limits, the bytes and
//! traffic of a run, progress and cancellation. Pure functions, shared by the benchmark module
//! (which runs the plan) and the app (which shows it).

use super::info::{LimitsSummary, TimingMethod};
use super::results::{median, KernelPoint};
use super::shape::{AttentionShape, BenchError, Dtype};
use serde::{Deserialize, Serialize};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Workgroup size (each side) of `scores.wgsl` and `pv.wgsl`: 16 × 16 invocations.
pub const TILE: u32 = 16;
/// Rows (and, for `scores.wgsl`, columns) of the output block one workgroup of `scores.wgsl`
/// or `pv.wgsl` computes; `pv.wgsl`'s block is also 64 channels wide.
pub const BLOCK: u32 = 64;
/// Query rows one workgroup of `fused.wgsl` owns (its workgroup is 16 × 16).
pub const FUSED_ROWS: u32 = 16;
/// Largest head dimension `fused.wgsl` supports (its private arrays and tiles are this wide).
pub const MAX_HEAD_DIM: u32 = 128;
/// Workgroup memory `fused.wgsl` declares: a V tile (16 × 128 f32) and a score tile
/// (16 × 16 f32).
pub const FUSED_WORKGROUP_BYTES: u32 = (16 * MAX_HEAD_DIM + 16 * 16) * 4;
/// Workgroup size of `copy.wgsl`.
pub const COPY_WG: u32 = 256;

/// Bytes of one timestamp query result (WebGPU and Vulkan write a 64-bit tick count; wgpu's
/// `QUERY_SIZE`).
pub const QUERY_SIZE: u64 = 8;

/// Most timed runs per point (a timestamp query set holds two per run).
pub const MAX_RUNS: u32 = 100;

/// Largest element count of one buffer the kernels index (32-bit indices with headroom).
const MAX_ELEMS: u64 = 1 << 31;

/// The two attention kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    Materialized,
    Fused,
}

/// What to sweep and within which limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SweepOptions {
    pub batch: u32,
    pub heads: u32,
    /// 1 to 128 (64 and 128 are the usual).
    pub head_dim: u32,
    /// First sequence length; the sweep visits powers of two and their midpoints
    /// (256, 384, 512, 768, 1024, …) from here up to `max_seq` (see [`seq_ladder`]).
    pub min_seq: u32,
    pub max_seq: u32,
    /// No point creates more than this many bytes of buffers.
    pub mem_cap_bytes: u64,
    /// The sweep starts no point it predicts would end after this many milliseconds (the
    /// first point always runs).
    pub budget_ms: f64,
    /// Untimed runs before the timed ones, per kernel and point.
    pub warmup: u32,
    /// Timed runs per kernel and point (1 to [`MAX_RUNS`]); the median is reported.
    pub runs: u32,
    /// Size of the copy-bandwidth probe's buffers (0: no probe); lowered to the device's
    /// limits and to half the memory cap.
    pub copy_probe_bytes: u64,
    /// Seed of the random Q, K, V.
    pub seed: u64,
    /// Element type of Q, K, V, S, O in GPU memory ([`Dtype::F16`] needs
    /// [`AdapterSummary::f16`](super::info::AdapterSummary::f16)).
    pub dtype: Dtype,
}

impl Default for SweepOptions {
    fn default() -> Self {
        SweepOptions {
            batch: 1,
            heads: 8,
            head_dim: 64,
            min_seq: 256,
            max_seq: 16384,
            mem_cap_bytes: 1 << 30,
            budget_ms: 30_000.0,
            warmup: 1,
            runs: 5,
            copy_probe_bytes: 64 << 20,
            seed: 0x5eed,
            dtype: Dtype::F32,
        }
    }
}

impl SweepOptions {
    /// The shape at one sequence length.
    pub fn shape(&self, seq: u32) -> AttentionShape {
        AttentionShape { batch: self.batch, heads: self.heads, seq, head_dim: self.head_dim }
    }

    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |m: String| Err(BenchError::InvalidOptions(m));
        check_shape(self.shape(self.min_seq.max(1))).map_err(BenchError::InvalidOptions)?;
        if self.min_seq == 0 {
            return bad("min_seq must be at least 1".into());
        }
        if self.max_seq < self.min_seq {
            return bad(format!("max_seq ({}) is below min_seq ({})", self.max_seq, self.min_seq));
        }
        if self.runs == 0 || self.runs > MAX_RUNS {
            return bad(format!("runs must be 1 to {MAX_RUNS}, not {}", self.runs));
        }
        if self.warmup > MAX_RUNS {
            return bad(format!("warmup must be at most {MAX_RUNS}, not {}", self.warmup));
        }
        if self.budget_ms.is_nan() || self.budget_ms < 0.0 {
            return bad("budget_ms must be a non-negative number".into());
        }
        Ok(())
    }
}

/// Progress of a sweep, reported before the first point and after every point.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SweepProgress {
    /// Points finished.
    pub done: u32,
    /// Points planned: sequence lengths that fit the limits (the time budget may end the
    /// sweep before).
    pub planned: u32,
    /// The seq of the point just finished.
    pub seq: Option<u32>,
    pub elapsed_ms: f64,
}

/// A cancellation flag, checked between points (and between the two kernels of a point).
/// Implemented for `AtomicBool`, `Cell<bool>`, `()` (never cancelled), and references,
/// `Rc`s and `Arc`s of those.
pub trait CancelToken {
    fn is_cancelled(&self) -> bool;
}

impl CancelToken for AtomicBool {
    fn is_cancelled(&self) -> bool {
        self.load(Ordering::Relaxed)
    }
}

impl CancelToken for Cell<bool> {
    fn is_cancelled(&self) -> bool {
        self.get()
    }
}

impl CancelToken for () {
    fn is_cancelled(&self) -> bool {
        false
    }
}

impl<T: CancelToken + ?Sized> CancelToken for &T {
    fn is_cancelled(&self) -> bool {
        (**self).is_cancelled()
    }
}

impl<T: CancelToken + ?Sized> CancelToken for Rc<T> {
    fn is_cancelled(&self) -> bool {
        (**self).is_cancelled()
    }
}

impl<T: CancelToken + ?Sized> CancelToken for Arc<T> {
    fn is_cancelled(&self) -> bool {
        (**self).is_cancelled()
    }
}

/// Powers of two and their midpoints (1, 2, 3, 4, 6, 8, 12, …, 256, 384, 512, 768, …) within
/// `[min, max]`.
pub fn seq_ladder(min: u32, max: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut p: u64 = 1;
    while p <= max as u64 {
        for s in [p, p + p / 2] {
            if s >= min.max(1) as u64 && s <= max as u64 && (s == p || p >= 2) {
                out.push(s as u32);
            }
        }
        p *= 2;
    }
    out.dedup();
    out
}

/// The shape is one the kernels handle (all sizes at least 1, head_dim at most 128).
pub fn check_shape(shape: AttentionShape) -> Result<(), String> {
    if shape.batch == 0 || shape.heads == 0 || shape.seq == 0 || shape.head_dim == 0 {
        return Err(format!("every size must be at least 1 ({shape})"));
    }
    if !shape.head_dim.is_multiple_of(4) {
        return Err(format!("head_dim {} is not a multiple of 4 (the kernels load vec4s)", shape.head_dim));
    }
    if shape.head_dim > MAX_HEAD_DIM {
        return Err(format!("head_dim {} is above the kernels' maximum of {}", shape.head_dim, MAX_HEAD_DIM));
    }
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// Whether one run of `kernel` at `shape` stays within the device's limits: every storage
/// buffer within `max_buffer_size` and `max_storage_buffer_binding_size` and within what
/// 32-bit indices address, every dispatch within `max_compute_workgroups_per_dimension`.
pub fn check_fit(kernel: Kernel, shape: AttentionShape, dtype: Dtype, limits: &LimitsSummary) -> Result<(), String> {
    check_shape(shape)?;
    let max_bytes = limits.max_storage_bytes();
    let max_groups = limits.max_compute_workgroups_per_dimension as u64;
    let mut buffers = vec![("q, k, v and o", shape.qkv_elems())];
    let mut dispatches = vec![("batch·heads", shape.bh())];
    match kernel {
        Kernel::Materialized => {
            buffers.push(("the score matrix", shape.score_elems()));
            dispatches.push(("seq (softmax rows)", shape.seq as u64));
            dispatches.push(("seq/64 (score blocks)", (shape.seq as u64).div_ceil(BLOCK as u64)));
        }
        Kernel::Fused => dispatches.push(("seq/16 (fused row blocks)", (shape.seq as u64).div_ceil(FUSED_ROWS as u64))),
    }
    for (what, elems) in buffers {
        let bytes = pad4(elems * dtype.bytes());
        if bytes > max_bytes {
            return Err(format!(
                "{what} at seq {} needs {} per buffer, above the device's limit of {}",
                shape.seq,
                mib(bytes),
                mib(max_bytes)
            ));
        }
        if elems > MAX_ELEMS {
            return Err(format!("{what} at seq {} has {elems} elements, beyond the kernels' 32-bit indexing", shape.seq));
        }
    }
    for (what, groups) in dispatches {
        if groups > max_groups {
            return Err(format!("{what} = {groups} workgroups, above max_compute_workgroups_per_dimension ({max_groups})"));
        }
    }
    Ok(())
}

/// Bytes of the buffers a materialized run creates, timestamp buffers aside: the params
/// uniform (16), Q, K, V, O (`b·a·s·d·4` each) and S (`b·a·s²·4`).
pub fn materialized_bytes(shape: AttentionShape, dtype: Dtype) -> u64 {
    16 + 4 * pad4(shape.qkv_elems() * dtype.bytes()) + pad4(shape.score_elems() * dtype.bytes())
}

/// Bytes of the buffers a fused run creates, timestamp buffers aside: the params uniform,
/// Q, K, V and O. Linear in seq.
pub fn fused_bytes(shape: AttentionShape, dtype: Dtype) -> u64 {
    16 + 4 * pad4(shape.qkv_elems() * dtype.bytes())
}

/// The largest seq whose materialized run fits the device's limits for this batch, head
/// count and head_dim (`shape.seq` is ignored); 0 if none does.
pub fn max_materializable_seq(shape: AttentionShape, dtype: Dtype, limits: &LimitsSummary) -> u32 {
    let fits = |s: u32| check_fit(Kernel::Materialized, AttentionShape { seq: s, ..shape }, dtype, limits).is_ok();
    if !fits(1) {
        return 0;
    }
    let (mut lo, mut hi) = (1u32, 1u32 << 24);
    if fits(hi) {
        return hi;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

pub fn timestamp_bytes(timestamps: bool, runs: u32) -> u64 {
    if timestamps {
        2 * (2 * runs as u64 * QUERY_SIZE)
    } else {
        0
    }
}

/// Buffers are whole multiples of 4 bytes.
fn pad4(bytes: u64) -> u64 {
    bytes.max(4).next_multiple_of(4)
}

pub fn kernel_point(
    kernel: Kernel,
    shape: AttentionShape,
    dtype: Dtype,
    times: &[f64],
    method: TimingMethod,
    bytes_allocated: u64,
    copy_gbps: Option<f64>,
) -> KernelPoint {
    let med = median(times);
    let min = times.iter().copied().fold(f64::INFINITY, f64::min);
    let max = times.iter().copied().fold(0.0, f64::max);
    let linear = 4 * shape.qkv_elems() * dtype.bytes();
    let bytes_moved = match kernel {
        Kernel::Materialized => linear + 4 * shape.score_elems() * dtype.bytes(),
        Kernel::Fused => linear,
    };
    let secs = med.max(1e-9) / 1e3;
    let gb_per_s = bytes_moved as f64 / secs / 1e9;
    KernelPoint {
        median_ms: med,
        min_ms: if min.is_finite() { min } else { 0.0 },
        max_ms: max,
        runs: times.len() as u32,
        timing: method,
        bytes_allocated,
        bytes_moved,
        gb_per_s,
        gflop_per_s: shape.matmul_flops() / secs / 1e9,
        fraction_of_copy: copy_gbps.filter(|c| *c > 0.0).map(|c| gb_per_s / c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F32: Dtype = Dtype::F32;

    fn limits(max_bytes: u64) -> LimitsSummary {
        LimitsSummary {
            max_buffer_size: max_bytes,
            max_storage_buffer_binding_size: max_bytes,
            max_compute_workgroup_storage_size: 16384,
            max_compute_invocations_per_workgroup: 256,
            max_compute_workgroup_size_x: 256,
            max_compute_workgroup_size_y: 256,
            max_compute_workgroups_per_dimension: 65535,
            max_storage_buffers_per_shader_stage: 8,
        }
    }

    fn shape(seq: u32) -> AttentionShape {
        AttentionShape { batch: 1, heads: 8, seq, head_dim: 64 }
    }

    #[test]
    fn the_ladder_holds_powers_of_two_and_their_midpoints() {
        assert_eq!(seq_ladder(256, 2048), vec![256, 384, 512, 768, 1024, 1536, 2048]);
        assert_eq!(seq_ladder(1, 8), vec![1, 2, 3, 4, 6, 8]);
        assert_eq!(seq_ladder(300, 700), vec![384, 512]);
        assert!(seq_ladder(5000, 100).is_empty());
        assert_eq!(seq_ladder(u32::MAX - 1, u32::MAX), Vec::<u32>::new());
        assert_eq!(*seq_ladder(1, u32::MAX).last().unwrap(), 3 << 30);
    }

    #[test]
    fn the_materialized_path_stops_where_the_score_matrix_exceeds_the_buffer_limit() {
        // 8 heads × s² × 4 bytes ≤ 128 MiB  ⇔  s ≤ 2048.
        let l = limits(128 << 20);
        assert!(check_fit(Kernel::Materialized, shape(2048), F32, &l).is_ok());
        assert!(check_fit(Kernel::Materialized, shape(2049), F32, &l).is_err());
        assert_eq!(max_materializable_seq(shape(0), F32, &l), 2048);
        // Half the bytes per score: √2 times the seq.
        assert_eq!(max_materializable_seq(shape(0), Dtype::F16, &l), 2896);
        // The fused kernel only needs Q, K, V, O: s·64·8·4 ≤ 128 MiB ⇔ s ≤ 65536.
        assert!(check_fit(Kernel::Fused, shape(65536), F32, &l).is_ok());
        assert!(check_fit(Kernel::Fused, shape(65537), F32, &l).is_err());
    }

    #[test]
    fn dispatch_limits_and_32_bit_indexing_bound_the_fit() {
        let mut l = limits(u64::MAX);
        l.max_compute_workgroups_per_dimension = 1000;
        assert!(check_fit(Kernel::Materialized, shape(1000), F32, &l).is_ok());
        assert!(check_fit(Kernel::Materialized, shape(1001), F32, &l).is_err(), "softmax dispatches one workgroup per row");
        assert!(check_fit(Kernel::Fused, shape(16000), F32, &l).is_ok());
        assert!(check_fit(Kernel::Fused, shape(16001), F32, &l).is_err(), "one fused workgroup per 16 query rows");
        let l = limits(u64::MAX);
        // 8 · s² ≤ 2³¹  ⇔  s ≤ 16384.
        assert_eq!(max_materializable_seq(shape(0), F32, &l), 16384);
    }

    #[test]
    fn invalid_shapes_are_rejected() {
        let at = |heads, head_dim| AttentionShape { batch: 1, heads, seq: 4, head_dim };
        assert!(check_shape(at(0, 64)).is_err());
        assert!(check_shape(at(1, 132)).is_err(), "above 128");
        assert!(check_shape(at(1, 30)).is_err(), "not a multiple of 4");
        assert!(check_shape(at(1, 128)).is_ok());
        assert!(check_shape(at(1, 4)).is_ok());
    }

    #[test]
    fn memory_counts_are_quadratic_for_the_materialized_path_and_linear_for_the_fused_one() {
        let s = shape(1024);
        assert_eq!(materialized_bytes(s, F32), 16 + 4 * 8 * 1024 * 64 * 4 + 8 * 1024 * 1024 * 4);
        assert_eq!(materialized_bytes(s, Dtype::F16), 16 + 4 * 8 * 1024 * 64 * 2 + 8 * 1024 * 1024 * 2);
        assert_eq!(fused_bytes(s, F32), 16 + 4 * 8 * 1024 * 64 * 4);
        // An odd count of f16 pads each buffer to 4 bytes.
        let odd = AttentionShape { batch: 1, heads: 1, seq: 3, head_dim: 4 };
        assert_eq!(materialized_bytes(odd, Dtype::F16), 16 + 4 * 24 + 20);
    }

    #[test]
    fn options_are_validated() {
        let ok = SweepOptions::default();
        assert!(ok.validate().is_ok());
        for bad in [
            SweepOptions { heads: 0, ..ok.clone() },
            SweepOptions { head_dim: 256, ..ok.clone() },
            SweepOptions { min_seq: 0, ..ok.clone() },
            SweepOptions { max_seq: 100, ..ok.clone() },
            SweepOptions { runs: 0, ..ok.clone() },
            SweepOptions { budget_ms: f64::NAN, ..ok.clone() },
        ] {
            assert!(matches!(bad.validate(), Err(BenchError::InvalidOptions(_))), "{bad:?}");
        }
    }

    #[test]
    fn cancel_tokens_of_every_kind_report_the_flag() {
        let a = Arc::new(AtomicBool::new(false));
        let c = Rc::new(Cell::new(false));
        assert!(!a.is_cancelled() && !c.is_cancelled() && !().is_cancelled());
        a.store(true, Ordering::Relaxed);
        c.set(true);
        assert!(a.is_cancelled() && c.is_cancelled() && CancelToken::is_cancelled(&&*a));
    }

    #[test]
    fn a_kernel_point_reports_bandwidth_flops_and_the_fraction_of_copy() {
        let s = AttentionShape { batch: 1, heads: 1, seq: 1024, head_dim: 64 };
        let p = kernel_point(Kernel::Materialized, s, F32, &[2.0, 1.0, 3.0], TimingMethod::WallClock, 123, Some(10.0));
        assert_eq!(p.median_ms, 2.0);
        assert_eq!((p.min_ms, p.max_ms, p.runs), (1.0, 3.0, 3));
        let moved = 4 * 1024 * 64 * 4 + 4 * 1024 * 1024 * 4;
        assert_eq!(p.bytes_moved, moved);
        assert!((p.gb_per_s - moved as f64 / 2e-3 / 1e9).abs() < 1e-9);
        assert!((p.fraction_of_copy.unwrap() - p.gb_per_s / 10.0).abs() < 1e-12);
        assert!((p.gflop_per_s - 4.0 * 1024.0 * 1024.0 * 64.0 / 2e-3 / 1e9).abs() < 1e-6);
    }
}
