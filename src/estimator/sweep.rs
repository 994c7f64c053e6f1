//! Analysis by running the estimator many times: the limits of a configuration (the largest
//! micro-batch, the longest sequence, the fewest GPUs, the smallest GPU of the catalog that
//! fits) and the sweeps the charts draw (memory against sequence length, model size,
//! micro-batch and GPU count).
//!
//! "Fits" is always the step's **deciding peak** against the GPU's capacity
//! ([`Estimate::fits`] after [`super::with_reserve`]: what nvidia-smi will show, the caching
//! allocator's simulated reserve included), the verdict the page shows, never a sampled curve.
//! Replaying the allocator costs milliseconds, so the searches run on the fast figure — the
//! allocated peak with what lives outside the allocator, never above the deciding one — and then
//! refine their answer on the deciding figure: the exact limit can only lie below (or, for GPU
//! counts, above) the fast one, a few replays away. The chart curves draw the fast figure. The searches rest on the estimator's
//! monotonicity: memory grows with the micro-batch and the sequence length and, from two
//! model replicas on, shrinks with the GPU count (one replica has no NCCL buffers, so it is
//! tried on its own). The tests check every answer at its boundary on every preset: the
//! largest micro-batch `B` fits and `B + 1` does not, and likewise for the sequence (to one
//! token) and the GPU count (to one valid step).
//!
//! The searches interpolate: memory is close to affine in the micro-batch, affine or
//! quadratic in the sequence length and affine in 1/GPUs, so the crossing with the capacity
//! is usually found in four to eight estimates instead of the twenty of a bisection
//! (regula falsi on the bracket, with a bisection whenever the bracket does not halve). The
//! answers stay exact: the search ends only when it holds a value that fits next to one that
//! does not.

use super::analyse::analyse;
use super::config::{Attention, Config, Offload, Recompute, Unit, Zero};
use super::estimate::{capacity, estimate, Estimate};
use super::gpu::{Gpu, GPUS};
use super::ledger::Bytes;
use super::model::ModelSpec;
use super::presets::{preset, presets};
use super::validate::{validate, EstimateError};

/// The step's peak for `cfg` by the fast path (allocated + CUDA context, cuBLAS, NCCL; never
/// above [`deciding_peak`]), or `None` if it cannot be estimated.
pub fn peak(cfg: &Config) -> Option<Bytes> {
    estimate(cfg).ok().map(|e| e.memory.peak)
}

/// The step's deciding peak for `cfg` (what nvidia-smi will show), or `None` if it cannot be
/// estimated.
pub fn deciding_peak(cfg: &Config) -> Option<Bytes> {
    analyse(cfg).ok().map(|a| a.verdict.deciding)
}

/// A largest value that fits, found on the fast peak (`fast`), refined on the deciding peak:
/// that is never lower, so the answer is `fast` itself or lies below it.
fn refine_largest(
    lo: u64,
    fast: Option<u64>,
    cap: Bytes,
    x_of: impl Fn(u64) -> f64,
    deciding_at: impl FnMut(u64) -> Option<Bytes>,
) -> Option<u64> {
    let mut deciding_at = deciding_at;
    let b = fast?;
    if deciding_at(b).is_some_and(|p| p <= cap) {
        return Some(b);
    }
    if b <= lo {
        return None;
    }
    last_fit(lo, b - 1, cap, x_of, deciding_at)
}

/// Whether `cfg` can be estimated and its deciding peak fits.
pub fn fits(cfg: &Config) -> bool {
    analyse(cfg).is_ok_and(|a| a.verdict.fits)
}

/// The step's peak by category (`Category::ALL` order): the timeline's peak event. Sums to
/// `memory.peak`.
pub fn peak_composition(e: &Estimate) -> [Bytes; 6] {
    e.timeline.peak_event().map_or([0; 6], |ev| ev.by_category)
}

// ---------------------------------------------------------------------------------------
// Searches
// ---------------------------------------------------------------------------------------

/// The largest `v` in `lo..=hi` for which `ok(v)` holds, when `ok` holds up to some value and
/// fails beyond it; `None` if it fails at `lo` already. About log₂(hi − lo) calls.
pub fn largest(lo: u64, hi: u64, mut ok: impl FnMut(u64) -> bool) -> Option<u64> {
    if hi < lo || !ok(lo) {
        return None;
    }
    if ok(hi) {
        return Some(hi);
    }
    let (mut good, mut bad) = (lo, hi);
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if ok(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Some(good)
}

/// [`largest`], bracketed by values already evaluated: `samples` are ascending `(value, ok)`
/// pairs (a sweep's points); the search runs only between the last sample that holds and the
/// first that fails, or below the first sample (down to `lo`) if none holds. Same answer as
/// [`largest`] over `lo..=` the last sample when `ok` is monotone, in far fewer calls.
pub fn largest_bracketed(samples: &[(u64, bool)], lo: u64, mut ok: impl FnMut(u64) -> bool) -> Option<u64> {
    let first_bad = samples.iter().position(|(_, good)| !good);
    match first_bad {
        None => samples.last().map(|(v, _)| *v),
        Some(0) => {
            let below = samples[0].0.checked_sub(1)?;
            largest(lo, below, ok)
        }
        Some(j) => {
            let (good, bad) = (samples[j - 1].0, samples[j].0);
            largest(good + 1, bad - 1, &mut ok).or(Some(good))
        }
    }
}

/// The smallest multiple of `step` for which `ok` holds, bracketed by ascending `samples`
/// (multiples of `step`, with whether `ok` holds there): the first sample that holds, or a
/// smaller multiple above the sample before it (binary search, `ok` assumed monotone between
/// the two). `None` if no sample holds.
pub fn smallest_bracketed(samples: &[(u64, bool)], step: u64, mut ok: impl FnMut(u64) -> bool) -> Option<u64> {
    let j = samples.iter().position(|(_, good)| *good)?;
    if j == 0 {
        return Some(samples[0].0);
    }
    let step = step.max(1);
    let (mut bad, mut good) = (samples[j - 1].0 / step, samples[j].0 / step);
    while good - bad > 1 {
        let mid = bad + (good - bad) / 2;
        if ok(mid * step) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Some(good * step)
}

/// One evaluated point of a boundary search: the index searched over and the peak there
/// (`None`: the configuration is invalid there, which counts as not fitting).
#[derive(Clone, Copy, Debug)]
struct Probe {
    at: u64,
    peak: Option<Bytes>,
}

/// The root in `lo..hi` (exclusive) of the parabola through three points `(x, y)` at height
/// `level`, or of the line through the first two if the parabola has none there.
fn model_root(pts: &[(f64, f64)], level: f64, lo: f64, hi: f64) -> Option<f64> {
    let inside = |r: f64| (r > lo && r < hi && r.is_finite()).then_some(r);
    if let [(x0, y0), (x1, y1), (x2, y2)] = pts[..] {
        // y = a·x² + b·x + c through the three points (Lagrange form, expanded).
        let d = (x0 - x1) * (x0 - x2) * (x1 - x2);
        if d != 0.0 {
            let a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / d;
            let b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / d;
            let c = (x1 * x2 * (x1 - x2) * y0 + x2 * x0 * (x2 - x0) * y1 + x0 * x1 * (x0 - x1) * y2) / d - level;
            let root = if a.abs() <= f64::MIN_POSITIVE {
                (b != 0.0).then(|| -c / b).and_then(inside)
            } else {
                let disc = b * b - 4.0 * a * c;
                (disc >= 0.0)
                    .then(|| {
                        // The numerically stable pair of roots.
                        let q = -0.5 * (b + disc.sqrt().copysign(b));
                        inside(q / a).or_else(|| (q != 0.0).then(|| c / q).and_then(inside))
                    })
                    .flatten()
            };
            if root.is_some() {
                return root;
            }
        }
    }
    let [(x0, y0), (x1, y1), ..] = pts[..] else { return None };
    (y1 != y0).then(|| x0 + (level - y0) * (x1 - x0) / (y1 - y0)).and_then(inside)
}

/// The boundary between indices that fit and indices that do not, on a bracket `good`
/// (fits) / `bad` (does not, or is invalid): returns the index next to `bad` on `good`'s side
/// that fits. `good` and `bad` may come in either order (a largest-value search has
/// `good < bad`, a smallest-value search `good > bad`). `x_of` maps an index to a coordinate
/// in which the peak is a low-degree polynomial (the micro-batch or the sequence length
/// themselves, 1/GPUs); `seen` holds the probes so far.
///
/// Each step fits a parabola through the three latest probes (a line through two when it
/// has no root in the bracket) and probes where it reaches the capacity, rounded towards
/// `good`, then that probe's neighbour towards `bad`: an affine or quadratic peak, which the
/// estimator's is in each of these variables between changes of its peak event, ends there.
/// When two steps in a row fail to halve the bracket, the next is a bisection.
fn boundary(
    mut good: Probe,
    mut bad: Probe,
    cap: Bytes,
    x_of: impl Fn(u64) -> f64,
    mut peak_at: impl FnMut(u64) -> Option<Bytes>,
    seen: &mut Vec<Probe>,
) -> u64 {
    let fits = |p: Option<Bytes>| p.is_some_and(|p| p <= cap);
    let mut slow = 0u32;
    while good.at.abs_diff(bad.at) > 1 {
        let span = good.at.abs_diff(bad.at);
        let up = bad.at > good.at;
        let (lo, hi) = (good.at.min(bad.at), good.at.max(bad.at));
        let (xl, xh) = (x_of(lo), x_of(hi));
        let rising = xh > xl;
        let mut model = None;
        if slow < 2 {
            // The three latest probes at distinct coordinates, newest first.
            let mut pts: Vec<(f64, f64)> = Vec::with_capacity(3);
            for p in seen.iter().rev() {
                if let Some(v) = p.peak {
                    let x = x_of(p.at);
                    if pts.len() < 3 && pts.iter().all(|q| q.0 != x) {
                        pts.push((x, v as f64));
                    }
                }
            }
            model = model_root(&pts, cap as f64, xl.min(xh), xl.max(xh));
        }
        let next = match model {
            Some(x) => {
                // The last index from `lo` whose coordinate is on the low side of the root
                // (bisection on the monotone x_of), then rounded towards good.
                let below = |i: u64| if rising { x_of(i) <= x } else { x_of(i) >= x };
                let (mut a, mut b) = (lo + 1, hi - 1);
                while a < b {
                    let m = a + (b - a).div_ceil(2);
                    if below(m) {
                        a = m;
                    } else {
                        b = m - 1;
                    }
                }
                if up {
                    a
                } else {
                    (a + 1).min(hi - 1)
                }
            }
            None => lo + span / 2,
        };
        let probe = Probe { at: next, peak: peak_at(next) };
        seen.push(probe);
        if fits(probe.peak) {
            good = probe;
            if model.is_some() && good.at.abs_diff(bad.at) > 1 {
                let n = if up { good.at + 1 } else { good.at - 1 };
                let p = Probe { at: n, peak: peak_at(n) };
                seen.push(p);
                if fits(p.peak) {
                    good = p;
                } else {
                    bad = p;
                }
            }
        } else {
            bad = probe;
        }
        slow = if good.at.abs_diff(bad.at) * 2 > span { slow + 1 } else { 0 };
    }
    good.at
}

/// The largest `v` in `lo..=hi` at which `peak_at(v)` fits under `cap`, assuming the peak
/// grows with `v`; `None` if `lo` does not fit. The line through the first two values
/// predicts the crossing; from there (stepping further out while the prediction still fits)
/// [`boundary`] narrows the bracket. Five estimates for an affine or quadratic peak.
fn last_fit(lo: u64, hi: u64, cap: Bytes, x_of: impl Fn(u64) -> f64, mut peak_at: impl FnMut(u64) -> Option<Bytes>) -> Option<u64> {
    let fits = |p: Option<Bytes>| p.is_some_and(|p| p <= cap);
    if hi < lo {
        return None;
    }
    let first = Probe { at: lo, peak: peak_at(lo) };
    if !fits(first.peak) {
        return None;
    }
    if hi == lo {
        return Some(lo);
    }
    let second = Probe { at: lo + 1, peak: peak_at(lo + 1) };
    if !fits(second.peak) {
        return Some(lo);
    }
    let mut seen = vec![first, second];
    let ahead = match (first.peak, second.peak) {
        (Some(p0), Some(p1)) if p1 > p0 => ((cap - p1) / (p1 - p0)).min(u64::MAX as u128) as u64,
        _ => hi - second.at,
    };
    let mut good = second;
    let mut step = ahead.max(1);
    loop {
        let at = good.at.saturating_add(step).min(hi);
        let p = Probe { at, peak: peak_at(at) };
        seen.push(p);
        if !fits(p.peak) {
            return Some(boundary(good, p, cap, &x_of, &mut peak_at, &mut seen));
        }
        if at == hi {
            return Some(hi);
        }
        good = p;
        step = step.saturating_mul(2);
    }
}

/// [`last_fit`] seeded by a sweep's samples: `samples` are ascending `(value, peak)` pairs,
/// the peak growing with the value. The answer lies between the last sample that fits and the
/// first that does not, where [`boundary`] starts from the samples around the crossing (so a
/// sweep's limit costs a few estimates more than its curve); below the first sample (down to
/// `lo`) if none fits; the last sample if all do.
pub fn last_fit_sampled(
    samples: &[(u64, Option<Bytes>)],
    lo: u64,
    cap: Bytes,
    x_of: impl Fn(u64) -> f64,
    mut peak_at: impl FnMut(u64) -> Option<Bytes>,
) -> Option<u64> {
    let fits = |p: Option<Bytes>| p.is_some_and(|p| p <= cap);
    match samples.iter().position(|(_, p)| !fits(*p)) {
        None => samples.last().map(|(v, _)| *v),
        Some(0) => last_fit(lo, samples[0].0.checked_sub(1)?, cap, x_of, peak_at),
        Some(j) => {
            let probe = |i: usize| Probe { at: samples[i].0, peak: samples[i].1 };
            let mut seen: Vec<Probe> = (j.saturating_sub(2)..=j).map(probe).collect();
            Some(boundary(probe(j - 1), probe(j), cap, x_of, &mut peak_at, &mut seen))
        }
    }
}

/// The smallest value that fits, seeded by ascending `(value, peak)` samples whose peak
/// shrinks with the value (GPU counts): between the last sample that does not fit and the first
/// that does, from the samples around them (`model_from` is the first sample on the curve the
/// others follow: one replica has no NCCL buffers). `None` if no sample fits.
pub fn first_fit_sampled(
    samples: &[(u64, Option<Bytes>)],
    model_from: usize,
    cap: Bytes,
    x_of: impl Fn(u64) -> f64,
    mut peak_at: impl FnMut(u64) -> Option<Bytes>,
) -> Option<u64> {
    let fits = |p: Option<Bytes>| p.is_some_and(|p| p <= cap);
    let j = samples.iter().position(|(_, p)| fits(*p))?;
    if j == 0 {
        return Some(samples[0].0);
    }
    let probe = |i: usize| Probe { at: samples[i].0, peak: samples[i].1 };
    let mut seen: Vec<Probe> = (model_from.max(j.saturating_sub(1))..(j + 2).min(samples.len())).map(probe).collect();
    Some(boundary(probe(j), probe(j - 1), cap, x_of, &mut peak_at, &mut seen))
}

/// Upper end of the micro-batch search (the estimator's own limit).
pub const MAX_BATCH: u64 = 1 << 20;
/// Upper end of the sequence-length search (the estimator's own limit).
pub const MAX_SEQ: u64 = 1 << 24;
/// Upper end of the GPU-count search (the estimator's own limit).
pub const MAX_GPUS: u64 = 1 << 20;

/// The largest micro-batch whose step fits, everything else as in `cfg` (`None`: not even 1).
pub fn max_batch(cfg: &Config) -> Option<u64> {
    let cap = capacity(cfg);
    let fast = last_fit(1, MAX_BATCH, cap, |b| b as f64, |b| peak(&Config { batch: b, ..cfg.clone() }));
    refine_largest(1, fast, cap, |b| b as f64, |b| deciding_peak(&Config { batch: b, ..cfg.clone() }))
}

/// The longest sequence in `lo..=hi` whose step fits, everything else as in `cfg`.
pub fn max_seq(cfg: &Config, lo: u64, hi: u64) -> Option<u64> {
    let cap = capacity(cfg);
    let fast = last_fit(lo.max(1), hi, cap, |s| s as f64, |s| peak(&Config { seq: s, ..cfg.clone() }));
    refine_largest(lo.max(1), fast, cap, |s| s as f64, |s| deciding_peak(&Config { seq: s, ..cfg.clone() }))
}

/// The longest sequence whose step fits, to one token (from the context-parallel degree up
/// to the estimator's limit).
pub fn longest_seq(cfg: &Config) -> Option<u64> {
    max_seq(cfg, cfg.cp.max(1), MAX_SEQ)
}

/// GPUs one model replica spans: tp × pp × cp (the GPU count must be a multiple).
pub fn model_parallel(cfg: &Config) -> u64 {
    (cfg.tp * cfg.pp * cfg.cp).max(1)
}

/// The step between valid GPU counts: one model replica, times the expert-parallel degree
/// (the data-parallel degree must be a multiple of it) and the hybrid-shard group (which must
/// divide it).
pub fn gpu_step(cfg: &Config) -> u64 {
    let group = if cfg.zero == Zero::HybridShard { cfg.shard_group.max(1) } else { 1 };
    model_parallel(cfg).saturating_mul(cfg.ep.max(1)).saturating_mul(group)
}

/// The fewest GPUs (a multiple of `step`, at most `hi`) on which `cfg` with sharding `zero`
/// fits. One step is tried first (one replica has no NCCL buffers, so it can fit where two do
/// not); beyond it memory per GPU only shrinks with more GPUs, so if the most GPUs do not fit
/// none do, and otherwise the crossing is searched in 1/GPUs, where the sharded terms are
/// affine. A count the configuration rejects counts as not fitting.
pub fn min_gpus_step(cfg: &Config, zero: Zero, step: u64, hi: u64) -> Option<u64> {
    let step = step.max(1);
    let base = Config { zero, ..cfg.clone() };
    let at = |m: u64| peak(&Config { gpus: m * step, ..base.clone() });
    let cap = capacity(cfg);
    let fits = |p: Option<Bytes>| p.is_some_and(|p| p <= cap);
    let max_m = (hi / step).max(1);
    let one = at(1);
    if fits(one) {
        return Some(step);
    }
    if max_m == 1 {
        return None;
    }
    let top = Probe { at: max_m, peak: at(max_m) };
    if !fits(top.peak) {
        return None;
    }
    if max_m == 2 {
        return Some(2 * step);
    }
    let two = Probe { at: 2, peak: at(2) };
    if fits(two.peak) {
        return Some(2 * step);
    }
    // One replica (no NCCL buffers) is off the curve the others follow: not a model point.
    let mut seen = vec![top, two];
    Some(boundary(top, two, cap, |m| 1.0 / m as f64, at, &mut seen) * step)
}

/// [`min_gpus_step`] over multiples of one model replica (what the GPU chart's lines use).
pub fn min_gpus(cfg: &Config, zero: Zero, hi: u64) -> Option<u64> {
    min_gpus_step(cfg, zero, model_parallel(cfg), hi)
}

/// The fewest GPUs on which `cfg` fits with its own sharding (valid counts only).
pub fn fewest_gpus(cfg: &Config) -> Option<u64> {
    let step = gpu_step(cfg);
    let fast = min_gpus_step(cfg, cfg.zero, step, MAX_GPUS)?;
    // The deciding peak is never below the fast one: the answer is `fast` or more GPUs. From
    // two replicas on memory only shrinks with more GPUs: double until it fits, then bisect.
    let cap = capacity(cfg);
    let ok = |g: u64| deciding_peak(&Config { gpus: g, ..cfg.clone() }).is_some_and(|p| p <= cap);
    if ok(fast) {
        return Some(fast);
    }
    let max_m = (MAX_GPUS / step).max(1);
    let (mut bad, mut m) = (fast / step, (fast / step).max(1) * 2);
    while m <= max_m && !ok(m * step) {
        bad = m;
        m *= 2;
    }
    if m > max_m {
        return None;
    }
    while m - bad > 1 {
        let mid = bad + (m - bad) / 2;
        if ok(mid * step) {
            m = mid;
        } else {
            bad = mid;
        }
    }
    Some(m * step)
}

/// The GPUs of the catalog, smallest memory first.
pub fn gpus_by_memory() -> Vec<&'static Gpu> {
    // An insertion sort: the catalog is a dozen cards.
    let mut v: Vec<&'static Gpu> = Vec::with_capacity(GPUS.len());
    for g in GPUS {
        let at = v.iter().position(|o| o.mib > g.mib).unwrap_or(v.len());
        v.insert(at, g);
    }
    v
}

/// The GPU of the catalog with the least memory on which `cfg` fits (each estimated, the
/// smallest first).
pub fn smallest_gpu(cfg: &Config) -> Option<&'static Gpu> {
    // The fast peak rules out the cards that cannot hold it; the deciding one confirms.
    gpus_by_memory().into_iter().find(|g| {
        let c = Config { gpu: g.id.to_string(), ..cfg.clone() };
        peak(&c).is_some_and(|p| p <= capacity(&c)) && fits(&c)
    })
}

/// The one-click answers next to the verdict: what this configuration can grow to, or must
/// change, to fit.
#[derive(Clone, Debug, PartialEq)]
pub struct Answers {
    /// The largest micro-batch that fits (`None`: not even 1).
    pub max_batch: Option<u64>,
    /// The longest sequence that fits, in tokens.
    pub max_seq: Option<u64>,
    /// The fewest GPUs that fit with this sharding.
    pub fewest_gpus: Option<u64>,
    /// The smallest GPU of the catalog that fits.
    pub smallest_gpu: Option<&'static Gpu>,
}

/// Every answer for `cfg` (an invalid configuration has none).
pub fn answers(cfg: &Config) -> Answers {
    if validate(cfg).is_err() {
        return Answers { max_batch: None, max_seq: None, fewest_gpus: None, smallest_gpu: None };
    }
    Answers { max_batch: max_batch(cfg), max_seq: longest_seq(cfg), fewest_gpus: fewest_gpus(cfg), smallest_gpu: smallest_gpu(cfg) }
}

// ---------------------------------------------------------------------------------------
// Chart sweeps
// ---------------------------------------------------------------------------------------

/// What a sweep runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Axis {
    /// Sequence length (log axis, powers of two and their midpoints).
    Seq,
    /// Parameter count: the current architecture scaled, on 1, 8 and 64 GPUs.
    Params,
    /// Micro-batch.
    Batch,
    /// GPU count, one line per sharding.
    Gpus,
}

/// A sweep's numbers.
#[derive(Clone, Debug, PartialEq)]
pub enum Sweep {
    Seq(SeqSweep),
    Params(ParamsSweep),
    Batch(BatchSweep),
    Gpus(GpusSweep),
}

/// Runs the sweep over `axis` for `cfg` (tens of estimates).
pub fn run(axis: Axis, cfg: &Config) -> Result<Sweep, EstimateError> {
    validate(cfg)?;
    Ok(match axis {
        Axis::Seq => Sweep::Seq(seq_sweep(cfg)),
        Axis::Params => Sweep::Params(params_sweep(cfg)),
        Axis::Batch => Sweep::Batch(batch_sweep(cfg)),
        Axis::Gpus => Sweep::Gpus(gpus_sweep(cfg)),
    })
}

/// What a sweep depends on: `cfg` with what it sweeps over (inside the axis' own range) or
/// merely displays reset, so that two configurations with equal keys give equal sweeps. The
/// app memoizes sweeps on this key: changing the unit, or the swept value within the axis,
/// redraws without a new sweep.
pub fn key(axis: Axis, cfg: &Config) -> Config {
    let mut k = Config { unit: Unit::Gb, ..cfg.clone() };
    match axis {
        Axis::Seq => {
            if (128..=default_top(cfg)).contains(&cfg.seq) {
                k.seq = 128u64.max(cfg.cp);
            }
        }
        Axis::Batch => {
            if cfg.batch <= 64 {
                k.batch = 1;
            }
        }
        Axis::Gpus => {
            // A GPU count on the axis' own doubling points changes nothing but the marker.
            let mp = model_parallel(cfg);
            if gpu_points(&Config { gpus: mp, ..cfg.clone() }).contains(&cfg.gpus) {
                k.gpus = mp;
            }
            if matches!(cfg.zero, Zero::Ddp | Zero::Z1 | Zero::Z2 | Zero::Z3) {
                k.zero = Zero::Ddp;
            }
        }
        Axis::Params => {
            k.gpus = 1;
        }
    }
    // A key the estimator rejects (tp = 8 on the one GPU of the model-size key, say) would turn
    // a valid configuration's chart into an error: fall back to the configuration itself.
    if validate(&k).is_err() {
        return Config { unit: Unit::Gb, ..cfg.clone() };
    }
    k
}

/// Memory against sequence length.
#[derive(Clone, Debug, PartialEq)]
pub struct SeqSweep {
    pub attn: Attention,
    /// The overlay's attention implementation ([`other_attention`]).
    pub other: Attention,
    /// Sequence lengths, ascending (those the estimator accepts).
    pub seqs: Vec<u64>,
    /// The step's peak by category at each length (`Category::ALL` order); sums to the peak.
    pub stack: Vec<[Bytes; 6]>,
    /// The peak with the other attention implementation.
    pub other_peak: Vec<Option<Bytes>>,
    /// Multi-head latent attention only (empty otherwise): the peak of the same model with
    /// its keys and values not compressed ([`uncompressed_kv`]) — what MLA's latent changes.
    pub uncompressed_peak: Vec<Option<Bytes>>,
    /// The swept range (the axis).
    pub range: (u64, u64),
    /// The longest sequence in `1..=range.1` that fits (search on the peak).
    pub limit: Option<u64>,
    pub capacity: Bytes,
    /// The recipes compared at the same lengths ([`SeqSweep::with_recipes`]; empty until asked:
    /// each is a second estimate per length).
    pub recipes: Vec<RecipeLine>,
    /// The recipes [`SeqSweep::with_recipes`] left out because the estimator refuses them at
    /// every length.
    pub refused_recipes: Vec<SeqRecipe>,
}

/// A recipe the sequence chart compares: the configuration with its recomputation and
/// compilation set to one of issue 26's four (every-Nth-layer checkpointing off, everything
/// else as configured).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqRecipe {
    /// `recompute = none`, eager.
    None,
    /// `recompute = op`: torchtitan's per-op selective checkpointing, eager.
    Op,
    /// `recompute = full`, eager.
    Full,
    /// `compile = true` over the configured regions, no recomputation.
    Compile,
}

impl SeqRecipe {
    pub const ALL: [SeqRecipe; 4] = [SeqRecipe::None, SeqRecipe::Op, SeqRecipe::Full, SeqRecipe::Compile];

    /// The short name the chart labels its line with (and the CSV's column key).
    pub fn name(self) -> &'static str {
        match self {
            SeqRecipe::None => "none",
            SeqRecipe::Op => "op",
            SeqRecipe::Full => "full",
            SeqRecipe::Compile => "compile",
        }
    }

    /// What the recipe does, in the legend's words.
    pub fn label(self) -> &'static str {
        match self {
            SeqRecipe::None => "No recomputation (recompute=none)",
            SeqRecipe::Op => "Op-level SAC (recompute=op)",
            SeqRecipe::Full => "Full recomputation (recompute=full)",
            SeqRecipe::Compile => "torch.compile, no recomputation (compile=true)",
        }
    }

    /// `cfg` with this recipe.
    pub fn apply(self, cfg: &Config) -> Config {
        let (recompute, compile) = match self {
            SeqRecipe::None => (Recompute::None, false),
            SeqRecipe::Op => (Recompute::Op, false),
            SeqRecipe::Full => (Recompute::Full, false),
            SeqRecipe::Compile => (Recompute::None, true),
        };
        Config { recompute, compile, recompute_every: 0, recompute_layers: 0, ..cfg.clone() }
    }

    /// Whether `cfg` already is this recipe (its line would be the configuration's own peak).
    pub fn is(self, cfg: &Config) -> bool {
        let r = self.apply(cfg);
        (r.recompute, r.compile, r.recompute_every, r.recompute_layers)
            == (cfg.recompute, cfg.compile, cfg.recompute_every, cfg.recompute_layers)
    }
}

/// One recipe's peak at each length of the sweep (`None` where the estimator refuses it).
#[derive(Clone, Debug, PartialEq)]
pub struct RecipeLine {
    pub recipe: SeqRecipe,
    pub peak: Vec<Option<Bytes>>,
}

/// The attention implementation the sequence sweep compares with: materialized for fused ones
/// and the other way round.
pub fn other_attention(a: Attention) -> Attention {
    match a {
        Attention::Eager => Attention::Sdpa,
        Attention::Sdpa | Attention::Flash => Attention::Eager,
    }
}

/// Longest length the sequence sweep shows by default: the model's maximum position, at
/// most 1M.
pub fn default_top(cfg: &Config) -> u64 {
    let max = if cfg.arch.max_pos > 0 { cfg.arch.max_pos } else { 1 << 20 };
    max.min(1 << 20)
}

/// The swept range: 128 (or less if configured less) up to [`default_top`] (or the configured
/// length if longer); never below the context-parallel degree.
pub fn seq_range(cfg: &Config) -> (u64, u64) {
    let lo = cfg.seq.clamp(1, 128).max(cfg.cp);
    let hi = default_top(cfg).max(cfg.seq).min(MAX_SEQ).max(lo);
    (lo, hi)
}

/// Powers of two and the midpoints between them (×1.5), plus both ends.
pub fn octave_points(lo: u64, hi: u64) -> Vec<u64> {
    let mut pts = vec![lo];
    let mut p = 1u64;
    while p <= hi {
        for v in [p, p + p / 2] {
            if v > lo && v < hi && pts.last().is_some_and(|l| v > *l) {
                pts.push(v);
            }
        }
        p *= 2;
    }
    if pts.last().is_some_and(|l| hi > *l) {
        pts.push(hi);
    }
    pts
}

/// An MLA model (DeepSeek-V2/V3, Kimi K2) with its keys and values not compressed: standard
/// multi-head attention with the same heads and query/key head dim d = d_nope + d_r, keys and
/// values projected from the hidden state per head (`k_proj`, `v_proj` [a·d, h]) and values of
/// d dims — the attention MLA's latent (r_kv + d_r per token, DeepSeek-V2 §2.1) replaces.
/// `None` for models without MLA.
pub fn uncompressed_kv(spec: &crate::estimator::model::ModelSpec) -> Option<crate::estimator::model::ModelSpec> {
    if !spec.is_mla() {
        return None;
    }
    let mut m = spec.clone();
    m.kv_lora_rank = 0;
    m.q_lora_rank = 0;
    m.qk_rope_dim = 0;
    m.v_head_dim = 0;
    m.kv_heads = m.heads;
    // The code of that attention beside the same MoE: GLM-4.5's layer is DeepSeek-V3's sigmoid
    // router and experts with ordinary attention; DeepSeek-V2's softmax router is Llama's MoE
    // block's.
    m.family = if m.router == crate::estimator::model::Router::Sigmoid {
        crate::estimator::family::Family::Glm4Moe
    } else {
        crate::estimator::family::Family::Llama
    };
    Some(m)
}

/// Sweeps `seq` for `cfg`.
pub fn seq_sweep(cfg: &Config) -> SeqSweep {
    let (lo, hi) = seq_range(cfg);
    let other = other_attention(cfg.attn);
    let mut seqs = Vec::new();
    let mut stack = Vec::new();
    let mut other_peak = Vec::new();
    let mut uncompressed_peak = Vec::new();
    let uncompressed = uncompressed_kv(&cfg.arch);
    for s in octave_points(lo, hi) {
        let c = Config { seq: s, ..cfg.clone() };
        let Ok(e) = estimate(&c) else { continue };
        seqs.push(s);
        stack.push(peak_composition(&e));
        if let Some(u) = &uncompressed {
            uncompressed_peak.push(peak(&Config { arch: u.clone(), ..c.clone() }));
        }
        other_peak.push(peak(&Config { attn: other, ..c }));
    }
    // The longest length that fits: a search on the estimator between the last sampled length
    // that fits and the first that does not (exact; the samples only bracket it).
    let cap = capacity(cfg);
    let samples: Vec<(u64, Option<Bytes>)> = seqs.iter().zip(&stack).map(|(s, c)| (*s, Some(c.iter().sum::<Bytes>()))).collect();
    let fast = last_fit_sampled(&samples, cfg.cp.max(1), cap, |s| s as f64, |s| peak(&Config { seq: s, ..cfg.clone() }));
    let limit = refine_largest(cfg.cp.max(1), fast, cap, |s| s as f64, |s| deciding_peak(&Config { seq: s, ..cfg.clone() }));
    SeqSweep {
        attn: cfg.attn,
        other,
        seqs,
        stack,
        other_peak,
        uncompressed_peak,
        range: (lo, hi),
        limit,
        capacity: cap,
        recipes: Vec::new(),
        refused_recipes: Vec::new(),
    }
}

impl SeqSweep {
    /// The sweep with the recipes of [`SeqSweep::compare_recipes`] set.
    pub fn with_recipes(mut self, cfg: &Config) -> SeqSweep {
        (self.recipes, self.refused_recipes) = self.compare_recipes(cfg);
        self
    }

    /// The recipes of [`SeqRecipe::ALL`] compared at this sweep's lengths: each recipe the
    /// configuration is not already, with its peak where the estimator accepts it; and, apart,
    /// the recipes refused at every length (compiling a family not measured compiled, say).
    pub fn compare_recipes(&self, cfg: &Config) -> (Vec<RecipeLine>, Vec<SeqRecipe>) {
        let (mut lines, mut refused) = (Vec::new(), Vec::new());
        for r in SeqRecipe::ALL.into_iter().filter(|r| !r.is(cfg)) {
            let base = r.apply(cfg);
            let peak: Vec<Option<Bytes>> = self.seqs.iter().map(|&s| peak(&Config { seq: s, ..base.clone() })).collect();
            if peak.iter().any(Option::is_some) {
                lines.push(RecipeLine { recipe: r, peak });
            } else {
                refused.push(r);
            }
        }
        (lines, refused)
    }

    /// The peak at each length (top of the stack).
    pub fn peaks(&self) -> Vec<Bytes> {
        self.stack.iter().map(|s| s.iter().sum()).collect()
    }
}

/// Memory against the micro-batch.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchSweep {
    pub seq: u64,
    /// Micro-batches, ascending.
    pub batches: Vec<u64>,
    /// The step's peak by category at each micro-batch.
    pub stack: Vec<[Bytes; 6]>,
    /// The largest micro-batch that fits (`None`: not even 1).
    pub limit: Option<u64>,
    pub range: (u64, u64),
    pub capacity: Bytes,
}

impl BatchSweep {
    pub fn peaks(&self) -> Vec<Bytes> {
        self.stack.iter().map(|s| s.iter().sum()).collect()
    }
}

/// The batch axis' right end: twice the limit (so the crossing sits mid-chart), at least 64 and
/// the configured micro-batch, a power of two.
pub fn batch_top(limit: Option<u64>, current: u64) -> u64 {
    let want = limit.unwrap_or(1).saturating_mul(2).max(64).max(current);
    want.checked_next_power_of_two().unwrap_or(MAX_BATCH).min(MAX_BATCH)
}

/// Sweeps the micro-batch for `cfg`.
pub fn batch_sweep(cfg: &Config) -> BatchSweep {
    let cap = capacity(cfg);
    // Peaks by micro-batch, each estimated once (the search and the curve share them).
    let mut known: Vec<(u64, Option<[Bytes; 6]>)> = Vec::new();
    let mut at = |b: u64| -> Option<[Bytes; 6]> {
        if let Some((_, c)) = known.iter().find(|(k, _)| *k == b) {
            return *c;
        }
        let c = estimate(&Config { batch: b, ..cfg.clone() }).ok().map(|e| peak_composition(&e));
        known.push((b, c));
        c
    };
    let fits_at = |c: Option<[Bytes; 6]>| c.is_some_and(|c| c.iter().sum::<Bytes>() <= cap);
    // Doubling until it no longer fits brackets the largest micro-batch; a binary search between
    // the last two doublings finds it exactly.
    let total = |c: Option<[Bytes; 6]>| c.map(|c| c.iter().sum::<Bytes>());
    let mut samples = Vec::new();
    let mut b = 1;
    loop {
        let p = at(b);
        samples.push((b, total(p)));
        if !fits_at(p) || b >= MAX_BATCH {
            break;
        }
        b *= 2;
    }
    let fast = last_fit_sampled(&samples, 1, cap, |b| b as f64, |b| total(at(b)));
    let limit = refine_largest(1, fast, cap, |b| b as f64, |b| deciding_peak(&Config { batch: b, ..cfg.clone() }));
    let hi = batch_top(limit, cfg.batch);
    let mut batches = Vec::new();
    let mut stack = Vec::new();
    for b in octave_points(1, hi) {
        if let Some(c) = at(b) {
            batches.push(b);
            stack.push(c);
        }
    }
    BatchSweep { seq: cfg.seq, batches, stack, limit, range: (1, hi), capacity: cap }
}

/// The GPU counts the model-size sweep compares.
pub const GPU_COUNTS: [u64; 3] = [1, 8, 64];

/// A preset of the current model's family, estimated as configured on each GPU count.
#[derive(Clone, Debug, PartialEq)]
pub struct PresetPoint {
    pub id: &'static str,
    pub params: u64,
    /// Peak per GPU on each of [`GPU_COUNTS`].
    pub peak: Vec<Option<Bytes>>,
}

/// Memory against the parameter count.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamsSweep {
    pub family: Option<String>,
    pub zero: Zero,
    /// Parameter counts of the scaled models, ascending.
    pub params: Vec<u64>,
    /// Peak per GPU, `[gpu count][point]`.
    pub peak: Vec<Vec<Option<Bytes>>>,
    /// Parameters + gradients + optimizer states per GPU, `[gpu count][point]`.
    pub statics: Vec<Vec<Option<Bytes>>>,
    /// Activations per GPU (on one GPU; data parallelism does not change them).
    pub activations: Vec<Option<Bytes>>,
    /// The largest scaled model that fits on each GPU count (parameters).
    pub limits: Vec<Option<u64>>,
    /// The axis' range of parameter counts.
    pub range: (u64, u64),
    pub presets: Vec<PresetPoint>,
    pub capacity: Bytes,
    /// The configured model's parameter count.
    pub current: u64,
}

/// The architecture scaled by `k`: attention heads (in whole key/value groups) and with them the
/// hidden and MLP sizes by about `k`, layers so that `hidden² × layers` grows as `k³`.
pub fn scaled(arch: &ModelSpec, k: f64) -> ModelSpec {
    let mut m = arch.clone();
    let group = if arch.kv_heads > 0 && arch.heads.is_multiple_of(arch.kv_heads) { arch.heads / arch.kv_heads } else { 1 };
    let groups = ((arch.heads as f64 * k / group as f64).round() as u64).max(1);
    m.heads = groups * group;
    // One key/value head per group (a model whose heads do not group evenly becomes MHA).
    m.kv_heads = groups;
    let w = m.heads as f64 / arch.heads.max(1) as f64;
    let round64 = |v: f64| ((v / 64.0).round() as u64).max(1) * 64;
    m.hidden = if arch.hidden == arch.heads * arch.head_dim { m.heads * arch.head_dim } else { round64(arch.hidden as f64 * w) };
    let wf = m.hidden as f64 / arch.hidden.max(1) as f64;
    let scale = |v: u64| if v == 0 { 0 } else { round64(v as f64 * wf) };
    m.ffn = scale(arch.ffn);
    m.expert_ffn = scale(arch.expert_ffn);
    m.shared_ffn = scale(arch.shared_ffn);
    m.embed_proj = scale(arch.embed_proj);
    m.layers = ((arch.layers as f64 * k * k * k / (wf * wf)).round() as u64).max(1);
    m.dense_layers = arch.dense_layers.min(m.layers);
    m
}

fn params_of(arch: &ModelSpec) -> u64 {
    arch.counts().total
}

/// The scale factor whose model has about (at least) `target` parameters (bisection on ln k).
fn k_for(arch: &ModelSpec, target: f64, k_lo: f64, k_hi: f64) -> f64 {
    let (mut a, mut b) = (k_lo.ln(), k_hi.ln());
    for _ in 0..24 {
        let m = 0.5 * (a + b);
        if (params_of(&scaled(arch, m.exp())) as f64) < target {
            a = m;
        } else {
            b = m;
        }
    }
    // The upper end: its model has at least `target` parameters.
    b.exp()
}

/// `cfg` with architecture `arch` on `n` GPUs: its own tensor/pipeline/context parallelism if
/// that divides `n`, plain data parallelism otherwise.
pub fn on_gpus(cfg: &Config, arch: &ModelSpec, n: u64) -> Config {
    let c = Config { model: "custom".into(), arch: arch.clone(), gpus: n, ..cfg.clone() };
    if validate(&c).is_ok() {
        c
    } else {
        Config { tp: 1, pp: 1, cp: 1, ep: 1, vpp: 1, ..c }
    }
}

/// Sweeps the parameter count for `cfg`.
pub fn params_sweep(cfg: &Config) -> ParamsSweep {
    let arch = &cfg.arch;
    let group = if arch.kv_heads > 0 && arch.heads.is_multiple_of(arch.kv_heads) { arch.heads / arch.kv_heads } else { 1 };
    // The smallest shape: one key/value group of heads.
    let k_min = group as f64 / arch.heads.max(1) as f64;
    let k_max = 64.0;
    let p_min = params_of(&scaled(arch, k_min)) as f64;
    let lo = p_min.max(1e8);
    let current = params_of(arch);
    let hi = 1e12f64.max(current as f64);
    // Three points a decade, evenly spaced on the log axis, snapped to a fine grid of scale
    // factors (GRID steps from one end to the other) on which the limits are then searched.
    let (k_lo, k_hi) = (k_for(arch, lo, k_min, k_max), k_for(arch, hi, k_min, k_max));
    const GRID: u64 = 2000;
    let k_at = |i: u64| k_lo * (k_hi / k_lo).powf(i as f64 / GRID as f64);
    let index_of = |k: f64| ((k / k_lo).ln() / (k_hi / k_lo).ln() * GRID as f64).round().clamp(0.0, GRID as f64) as u64;
    let n = (((hi / lo).log10() * 3.0).ceil() as usize).max(4);
    let mut idx: Vec<u64> = (0..=n)
        .map(|i| match i {
            0 => 0,
            _ if i == n => GRID,
            _ => index_of(k_for(arch, lo * (hi / lo).powf(i as f64 / n as f64), k_lo, k_hi)),
        })
        .collect();
    idx.dedup();
    let mut params: Vec<u64> = Vec::new();
    let mut archs: Vec<ModelSpec> = Vec::new();
    let mut grid: Vec<u64> = Vec::new();
    for i in idx {
        let a = scaled(arch, k_at(i));
        let p = params_of(&a);
        // Keep the x values ascending (rounding heads can make a step go backwards).
        if params.last().is_none_or(|last| p > *last) {
            params.push(p);
            archs.push(a);
            grid.push(i);
        }
    }
    let mut peak = Vec::new();
    let mut statics = Vec::new();
    let mut activations = vec![None; archs.len()];
    for (gi, &g) in GPU_COUNTS.iter().enumerate() {
        let mut p = Vec::new();
        let mut s = Vec::new();
        for (i, a) in archs.iter().enumerate() {
            let e = estimate(&on_gpus(cfg, a, g)).ok();
            p.push(e.as_ref().map(|e| e.memory.peak));
            s.push(e.as_ref().map(|e| e.memory.parameters + e.memory.gradients + e.memory.optimizer_states));
            if gi == 0 {
                activations[i] = e.as_ref().map(|e| e.memory.activations);
            }
        }
        peak.push(p);
        statics.push(s);
    }
    // The largest scaled model that fits on each GPU count: binary search on the grid of scale
    // factors between the last sample that fits and the first that does not.
    let cap = capacity(cfg);
    let limits = GPU_COUNTS
        .iter()
        .enumerate()
        .map(|(gi, &g)| {
            let samples: Vec<(u64, Option<Bytes>)> = grid.iter().zip(&peak[gi]).map(|(i, p)| (*i, *p)).collect();
            // The peak is close to affine in the parameter count, the model's coordinate.
            let x_of = |i: u64| params_of(&scaled(arch, k_at(i))) as f64;
            last_fit_sampled(&samples, 0, cap, x_of, |i| self::peak(&on_gpus(cfg, &scaled(arch, k_at(i)), g)))
                .map(|i| params_of(&scaled(arch, k_at(i))))
        })
        .collect();
    let family = preset(&cfg.model).map(|p| p.family.to_string());
    let presets = family
        .as_ref()
        .map(|f| {
            presets()
                .into_iter()
                .filter(|p| p.family == f)
                .map(|p| PresetPoint {
                    id: p.id,
                    params: params_of(&p.spec),
                    peak: GPU_COUNTS.iter().map(|&g| self::peak(&Config { model: p.id.to_string(), ..on_gpus(cfg, &p.spec, g) })).collect(),
                })
                .collect()
        })
        .unwrap_or_default();
    ParamsSweep {
        family,
        zero: cfg.zero,
        range: (params.first().copied().unwrap_or(1), params.last().copied().unwrap_or(2)),
        params,
        peak,
        statics,
        activations,
        limits,
        presets,
        capacity: cap,
        current,
    }
}

/// One sharding's line of the GPU sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardingLine {
    pub zero: Zero,
    /// Peak per GPU at each GPU count (`None`: the configuration is invalid there).
    pub peak: Vec<Option<Bytes>>,
    /// The fewest GPUs on which it fits.
    pub fewest: Option<u64>,
}

/// Memory per GPU against the GPU count, per sharding.
#[derive(Clone, Debug, PartialEq)]
pub struct GpusSweep {
    pub gpus: Vec<u64>,
    pub lines: Vec<ShardingLine>,
    pub capacity: Bytes,
}

/// The shardings the GPU sweep compares for `cfg`: the four ZeRO stages, and its own if it is
/// an FSDP one.
pub fn shardings(cfg: &Config) -> Vec<Zero> {
    let mut z = vec![Zero::Ddp, Zero::Z1, Zero::Z2, Zero::Z3];
    if !z.contains(&cfg.zero) {
        z.push(cfg.zero);
    }
    z
}

/// The GPU counts of the GPU sweep: one replica, doubling, up to 1,024 GPUs (or the configured
/// count, which is included).
pub fn gpu_points(cfg: &Config) -> Vec<u64> {
    let mp = model_parallel(cfg);
    let top = (1024u64).max(mp).max(cfg.gpus);
    let mut v = Vec::new();
    let mut n = mp;
    while n <= top {
        if cfg.gpus.is_multiple_of(mp) && cfg.gpus > v.last().copied().unwrap_or(0) && cfg.gpus < n {
            v.push(cfg.gpus);
        }
        v.push(n);
        n *= 2;
    }
    if cfg.gpus.is_multiple_of(mp) && cfg.gpus > v.last().copied().unwrap_or(0) {
        v.push(cfg.gpus);
    }
    v
}

/// Sweeps the GPU count for every sharding.
pub fn gpus_sweep(cfg: &Config) -> GpusSweep {
    let gpus = gpu_points(cfg);
    let mp = model_parallel(cfg);
    let cap = capacity(cfg);
    let lines = shardings(cfg)
        .into_iter()
        .map(|zero| {
            // Offloading parameters needs ZeRO-3; the lower stages offload the optimizer only.
            let offload = if zero.stage() < super::sharding::PARAMETERS_FROM && cfg.offload == Offload::OptimizerParams {
                Offload::Optimizer
            } else {
                cfg.offload
            };
            let base = Config { zero, offload, ..cfg.clone() };
            let peak: Vec<Option<Bytes>> = gpus.iter().map(|&n| peak(&Config { gpus: n, ..base.clone() })).collect();
            // The fewest GPUs: binary search between the last sampled count that does not fit
            // and the first that does (exact; the doubling samples only bracket it).
            // In replicas (multiples of tp × pp × cp), where the sharded terms go as 1/replicas.
            let samples: Vec<(u64, Option<Bytes>)> =
                gpus.iter().zip(&peak).filter(|(n, _)| *n % mp == 0).map(|(n, p)| (*n / mp, *p)).collect();
            let fewest = first_fit_sampled(&samples, 1, cap, |m| 1.0 / m as f64, |m| self::peak(&Config { gpus: m * mp, ..base.clone() }))
                .map(|m| m * mp);
            ShardingLine { zero, peak, fewest }
        })
        .collect();
    GpusSweep { gpus, lines, capacity: cap }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::presets::presets;

    fn with_model(id: &str) -> Config {
        let mut c = Config::default();
        let p = preset(id).expect("preset");
        c.model = p.id.to_string();
        c.arch = p.spec;
        c
    }

    #[test]
    fn the_search_finds_the_last_value_that_holds() {
        // ok(v) ⇔ v ≤ 11,264: found in ~17 steps over 1..=131,072.
        let mut calls = 0;
        assert_eq!(
            largest(1, 131_072, |v| {
                calls += 1;
                v <= 11_264
            }),
            Some(11_264)
        );
        assert!(calls <= 20, "{calls} calls");
        assert_eq!(largest(1, 100, |_| false), None);
        assert_eq!(largest(1, 100, |_| true), Some(100));
    }

    #[test]
    fn a_bracketed_search_agrees_with_the_plain_one_in_fewer_calls() {
        let limit = 11_264;
        let samples: Vec<(u64, bool)> = [128u64, 1024, 8192, 16_384, 131_072].iter().map(|&s| (s, s <= limit)).collect();
        let mut calls = 0;
        let found = largest_bracketed(&samples, 1, |v| {
            calls += 1;
            v <= limit
        });
        assert_eq!(found, Some(limit));
        assert_eq!(found, largest(1, 131_072, |v| v <= limit));
        // 8,192 < limit < 16,384: the bracket's two ends and log₂ 8,192 = 13 halvings, where
        // the plain search over 1..=131,072 takes 2 + 17.
        assert!(calls <= 15, "{calls} calls");
        assert_eq!(largest_bracketed(&[(128, false)], 1, |v| v <= 100), Some(100));
        assert_eq!(largest_bracketed(&[(128, false)], 1, |_| false), None);
        assert_eq!(largest_bracketed(&[(128, true), (256, true)], 1, |_| true), Some(256));
        // The smallest multiple of 4 from 20 on, bracketed by 16 (fails) and 32 (holds).
        let samples: Vec<(u64, bool)> = [4u64, 8, 16, 32, 64].iter().map(|&n| (n, n >= 20)).collect();
        assert_eq!(smallest_bracketed(&samples, 4, |n| n >= 20), Some(20));
        assert_eq!(smallest_bracketed(&[(4, false)], 4, |_| true), None);
    }

    #[test]
    fn the_interpolating_search_is_exact_on_affine_and_quadratic_peaks_and_cheap_on_affine_ones() {
        // peak(v) = 1000 + 37·v against 100,000: the last fit is ⌊99,000 / 37⌋ = 2,675.
        let mut calls = 0;
        let found = last_fit(
            1,
            1 << 20,
            100_000,
            |v| v as f64,
            |v| {
                calls += 1;
                Some(1000 + 37 * v as u128)
            },
        );
        assert_eq!(found, Some(2675));
        assert!(calls <= 6, "{calls} estimates for an affine peak");
        // peak(v) = 5·v² + 3·v: the last fit under 10⁹ is 14,141 (5·14,141² + 3·14,141 =
        // 999,870,428; 14,142 gives 1,000,011,846). The parabola through three probes finds it.
        let mut calls = 0;
        let found = last_fit(
            1,
            1 << 24,
            1_000_000_000,
            |v| v as f64,
            |v| {
                calls += 1;
                Some(5 * (v as u128) * (v as u128) + 3 * v as u128)
            },
        );
        assert_eq!(found, Some(14_141));
        assert!(calls <= 6, "{calls} estimates for a quadratic peak");
        // Invalid values (None) count as not fitting, and nothing fits / everything fits.
        assert_eq!(last_fit(1, 100, 10, |v| v as f64, |v| (v < 50).then_some(1)), Some(49));
        assert_eq!(last_fit(1, 100, 10, |v| v as f64, |_| Some(11)), None);
        assert_eq!(last_fit(1, 100, 10, |v| v as f64, |_| Some(10)), Some(100));
        assert_eq!(last_fit(5, 5, 10, |v| v as f64, |_| Some(3)), Some(5));
    }

    #[test]
    fn the_largest_micro_batch_fits_and_one_more_does_not_on_every_preset() {
        for p in presets() {
            // On the largest GPU of the catalog, sharded over 64 GPUs, so that most presets
            // fit at some micro-batch.
            let cfg = Config { gpu: "mi300x".into(), gpus: 64, zero: Zero::Z3, ..with_model(p.id) };
            match max_batch(&cfg) {
                Some(b) => {
                    assert!(fits(&Config { batch: b, ..cfg.clone() }), "{}: {b} fits", p.id);
                    assert!(b == MAX_BATCH || !fits(&Config { batch: b + 1, ..cfg.clone() }), "{}: {} does not", p.id, b + 1);
                }
                None => assert!(!fits(&Config { batch: 1, ..cfg.clone() }), "{}", p.id),
            }
        }
    }

    #[test]
    fn the_longest_sequence_fits_and_one_token_more_does_not_on_every_preset() {
        for p in presets() {
            for attn in [Attention::Sdpa, Attention::Eager] {
                let cfg = Config { gpu: "mi300x".into(), gpus: 64, zero: Zero::Z3, attn, ..with_model(p.id) };
                match longest_seq(&cfg) {
                    Some(s) => {
                        assert!(fits(&Config { seq: s, ..cfg.clone() }), "{} {attn:?}: {s} fits", p.id);
                        assert!(s == MAX_SEQ || !fits(&Config { seq: s + 1, ..cfg.clone() }), "{} {attn:?}: {} does not", p.id, s + 1);
                    }
                    None => assert!(!fits(&Config { seq: 1, ..cfg.clone() }), "{}", p.id),
                }
            }
        }
    }

    #[test]
    fn the_fewest_gpus_fit_and_one_step_fewer_does_not_on_every_preset() {
        for p in presets() {
            for zero in [Zero::Z3, Zero::Z1, Zero::Ddp] {
                let cfg = Config { zero, seq: 2048, ..with_model(p.id) };
                let step = gpu_step(&cfg);
                match fewest_gpus(&cfg) {
                    Some(n) => {
                        assert_eq!(n % step, 0);
                        assert!(fits(&Config { gpus: n, ..cfg.clone() }), "{} {zero:?}: {n} GPUs fit", p.id);
                        assert!(n == step || !fits(&Config { gpus: n - step, ..cfg.clone() }), "{} {zero:?}: {} do not", p.id, n - step);
                    }
                    None => {
                        // Nothing fits: neither one replica nor the most GPUs.
                        assert!(!fits(&Config { gpus: step, ..cfg.clone() }), "{}", p.id);
                        assert!(!fits(&Config { gpus: MAX_GPUS / step * step, ..cfg.clone() }), "{}", p.id);
                    }
                }
            }
        }
    }

    #[test]
    fn the_fewest_gpus_agree_with_a_plain_scan() {
        // Llama-3.1-8B at 4K tokens: ZeRO-3 shards 16 B/param over n GPUs.
        let cfg = Config { zero: Zero::Z3, ..Config::default() };
        let scan = (1..=256).find(|&n| fits(&Config { gpus: n, ..cfg.clone() }));
        assert_eq!(fewest_gpus(&cfg), scan);
        assert!(scan.is_some_and(|n| n > 1));
    }

    #[test]
    fn the_smallest_gpu_of_the_catalog_that_fits_is_the_first_by_memory_that_fits_on_every_preset() {
        for p in presets() {
            let cfg = Config { gpus: 8, zero: Zero::Z3, seq: 2048, ..with_model(p.id) };
            let brute = gpus_by_memory().into_iter().find(|g| fits(&Config { gpu: g.id.to_string(), ..cfg.clone() }));
            assert_eq!(smallest_gpu(&cfg).map(|g| g.id), brute.map(|g| g.id), "{}", p.id);
        }
        // A 124M model fits on the smallest card; a 405B one on a single GPU on none.
        assert_eq!(smallest_gpu(&with_model("gpt2")).map(|g| g.mib), gpus_by_memory().first().map(|g| g.mib));
        assert_eq!(smallest_gpu(&with_model("llama-3.1-405b")), None);
    }

    #[test]
    fn llama_8b_with_adamw_needs_several_gpus_unless_sharded_it_never_fits() {
        // 16 B/param × 8.03 B = 128 GB of model states: no number of DDP replicas helps, while
        // ZeRO-3 splits them (16 × 8.03 / n GB each) and fits from a handful of GPUs.
        let cfg = Config::default();
        assert_eq!(min_gpus(&cfg, Zero::Ddp, 1024), None);
        let n = min_gpus(&cfg, Zero::Z3, 1024).expect("ZeRO-3 fits eventually");
        assert!(n > 1 && fits(&Config { gpus: n, zero: Zero::Z3, ..cfg.clone() }));
        assert!(!fits(&Config { gpus: n - 1, zero: Zero::Z3, ..cfg }));
    }

    #[test]
    fn answers_of_an_invalid_configuration_are_empty() {
        let bad = Config { tp: 3, gpus: 8, ..Config::default() };
        assert_eq!(answers(&bad), Answers { max_batch: None, max_seq: None, fewest_gpus: None, smallest_gpu: None });
    }

    #[test]
    fn octave_points_are_ascending_and_hold_both_ends() {
        assert_eq!(octave_points(128, 1024), vec![128, 192, 256, 384, 512, 768, 1024]);
        assert_eq!(octave_points(100, 300), vec![100, 128, 192, 256, 300]);
        assert_eq!(octave_points(5, 5), vec![5]);
    }

    #[test]
    fn gpu_points_double_from_one_replica_and_include_the_configured_count() {
        let c = Config { gpus: 24, tp: 2, ..Config::default() };
        let v = gpu_points(&c);
        assert_eq!(&v[..6], &[2, 4, 8, 16, 24, 32]);
        assert!(v.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(v.last(), Some(&1024));
    }

    #[test]
    fn a_sweep_of_an_invalid_configuration_is_an_error_naming_the_key() {
        let bad = Config { tp: 3, gpus: 8, ..Config::default() };
        assert_eq!(run(Axis::Seq, &bad).err().map(|e| e.key()), Some("tp"));
    }

    #[test]
    fn an_mla_models_sequence_sweep_draws_the_same_model_with_uncompressed_keys_and_values() {
        let cfg = Config { seq: 2048, gpu: "mi300x".into(), gpus: 64, zero: Zero::Z3, ..with_model("deepseek-v3") };
        let s = seq_sweep(&cfg);
        assert_eq!(s.uncompressed_peak.len(), s.seqs.len());
        // The uncompressed model projects k and v per head from h: 61 layers × 128 heads ×
        // 192 dims × 7,168 × 2 more weights than MLA's latent projections replace; its peak is
        // estimated (its sigmoid router is modelled) and differs at every length.
        let unc = uncompressed_kv(&cfg.arch).expect("DeepSeek-V3 has MLA");
        assert_eq!((unc.kv_lora_rank, unc.kv_heads, unc.head_dim), (0, 128, 192));
        for (p, u) in s.peaks().iter().zip(&s.uncompressed_peak) {
            let u = u.expect("the uncompressed model is estimated");
            assert_ne!(*p, u);
        }
        // Models without MLA carry no such curve.
        assert!(seq_sweep(&with_model("llama-3.1-8b")).uncompressed_peak.is_empty());
    }

    #[test]
    fn the_sequence_sweep_compares_the_recipes_the_configuration_is_not() {
        let cfg = with_model("llama-3.2-1b");
        let plain = seq_sweep(&cfg);
        assert!(plain.recipes.is_empty() && plain.refused_recipes.is_empty(), "only when asked");
        let s = plain.with_recipes(&cfg);
        // recompute = none, eager: its own line is the peak; the three others are compared.
        let names: Vec<&str> = s.recipes.iter().map(|l| l.recipe.name()).collect();
        assert_eq!(names, ["op", "full", "compile"]);
        assert!(s.refused_recipes.is_empty());
        let line = |n: &str| s.recipes.iter().find(|l| l.recipe.name() == n).expect("a line");
        for (i, &seq) in s.seqs.iter().enumerate() {
            // Each point is the recipe's own estimate at that length…
            let want = peak(&Config { seq, ..SeqRecipe::Op.apply(&cfg) });
            assert_eq!(line("op").peak[i], want);
        }
        // …and at the longest length the saved activations order the peaks: full < op < none,
        // compile < none.
        let last = s.seqs.len() - 1;
        let none = s.peaks()[last];
        let at = |n: &str| line(n).peak[last].expect("estimated");
        assert!(at("full") < at("op") && at("op") < none, "{} {} {none}", at("full"), at("op"));
        assert!(at("compile") < none);
        // A configuration with op SAC compares none, full and compile instead.
        let op = Config { recompute: Recompute::Op, ..cfg.clone() };
        let names: Vec<&str> = seq_sweep(&op).with_recipes(&op).recipes.iter().map(|l| l.recipe.name()).collect();
        assert_eq!(names, ["none", "full", "compile"]);
    }

    #[test]
    fn a_recipe_the_estimator_refuses_at_every_length_is_named_not_drawn() {
        // Transformer Engine's per-layer offloading refuses any recomputation (Megatron's rule)
        // and compiled layers: only the configuration's own recipe (none) is drawn.
        let cfg = Config { framework: crate::estimator::config::Framework::Megatron, act_offload_layers: 4, ..with_model("llama-3.2-1b") };
        assert!(estimate(&cfg).is_ok());
        let s = seq_sweep(&cfg).with_recipes(&cfg);
        assert!(s.recipes.is_empty(), "{:?}", s.recipes.iter().map(|l| l.recipe).collect::<Vec<_>>());
        assert_eq!(s.refused_recipes, [SeqRecipe::Op, SeqRecipe::Full, SeqRecipe::Compile]);
    }
}
