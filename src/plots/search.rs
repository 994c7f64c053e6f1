//! Exact limits by search on the estimator: the longest sequence, the largest micro-batch, the
//! fewest GPUs that fit. "Fits" is always the step's **peak** against the GPU's capacity
//! ([`Estimate::fits`]) — the same verdict the page shows — never a sampled curve.
//!
//! The searches assume memory grows with the swept value (sequence, batch) or, from two GPUs
//! on, shrinks with the GPU count; the estimator's formulas are monotone in each.

use crate::estimator::config::{Config, Zero};
use crate::estimator::{estimate, Estimate};

/// Whether `cfg` can be estimated and its peak fits.
pub fn fits(cfg: &Config) -> bool {
    estimate(cfg).as_ref().is_ok_and(Estimate::fits)
}

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

/// The longest sequence in `lo..=hi` whose step fits, everything else as in `cfg`.
pub fn max_seq(cfg: &Config, lo: u64, hi: u64) -> Option<u64> {
    largest(lo, hi, |s| fits(&Config { seq: s, ..cfg.clone() }))
}

/// Upper end of the micro-batch search (the codec's own limit).
pub const MAX_BATCH: u64 = 1 << 20;

/// The largest micro-batch whose step fits, everything else as in `cfg`.
pub fn max_batch(cfg: &Config) -> Option<u64> {
    largest(1, MAX_BATCH, |b| fits(&Config { batch: b, ..cfg.clone() }))
}

/// GPUs one model replica spans: tp × pp × cp (the GPU count must be a multiple).
pub fn model_parallel(cfg: &Config) -> u64 {
    (cfg.tp * cfg.pp * cfg.cp).max(1)
}

/// The fewest GPUs (a multiple of tp × pp × cp, at most `hi`) on which `cfg` with sharding
/// `zero` fits. One replica is tried first (it has no NCCL buffers, so it can fit where two
/// do not); beyond it memory per GPU only shrinks with more GPUs, so a doubling search brackets
/// the answer and a binary search finds it. A GPU count the configuration rejects (expert
/// parallelism or a hybrid-shard group that does not divide the data-parallel degree) counts as
/// not fitting.
pub fn min_gpus(cfg: &Config, zero: Zero, hi: u64) -> Option<u64> {
    let mp = model_parallel(cfg);
    let ok = |m: u64| fits(&Config { gpus: m * mp, zero, ..cfg.clone() });
    let max_m = (hi / mp).max(1);
    if ok(1) {
        return Some(mp);
    }
    let mut m = 2;
    while m <= max_m && !ok(m) {
        m *= 2;
    }
    if m > max_m {
        if ok(max_m) {
            m = max_m;
        } else {
            return None;
        }
    }
    // ok(m) holds and nothing at or below m / 2 was found to fit.
    let (mut bad, mut good) = ((m / 2).max(1), m);
    while good - bad > 1 {
        let mid = bad + (good - bad) / 2;
        if ok(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Some(good * mp)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // Nothing holds / everything holds.
        assert_eq!(largest_bracketed(&[(128, false)], 1, |v| v <= 100), Some(100));
        assert_eq!(largest_bracketed(&[(128, false)], 1, |_| false), None);
        assert_eq!(largest_bracketed(&[(128, true), (256, true)], 1, |_| true), Some(256));
        // The smallest multiple of 4 from 20 on, bracketed by 16 (fails) and 32 (holds).
        let samples: Vec<(u64, bool)> = [4u64, 8, 16, 32, 64].iter().map(|&n| (n, n >= 20)).collect();
        assert_eq!(smallest_bracketed(&samples, 4, |n| n >= 20), Some(20));
        assert_eq!(smallest_bracketed(&[(4, false)], 4, |_| true), None);
    }

    #[test]
    fn the_longest_sequence_that_fits_fits_and_one_token_more_does_not() {
        let cfg = Config {
            model: "custom".into(),
            arch: crate::estimator::presets::preset("qwen2.5-0.5b").expect("preset").spec,
            ..Config::default()
        };
        let s = max_seq(&cfg, 1, 1 << 20).expect("a 0.5B model fits at some length on an 80 GB GPU");
        assert!(fits(&Config { seq: s, ..cfg.clone() }));
        assert!(!fits(&Config { seq: s + 1, ..cfg.clone() }));
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
}
