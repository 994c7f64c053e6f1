//! The next change, for a configuration that fits with less than [`TIGHT_PCT`] to spare or
//! does not fit although a change was just applied to make it fit: the planner's single changes
//! ([`candidate_changes`]), each re-estimated the way the verdict decides
//! ([`crate::estimator::sweep::decided`]: nvidia-smi against the usable capacity) and kept only
//! when it leaves at least [`TIGHT_PCT`] of the capacity free; changes that keep what is trained
//! first, then by the cost model's estimated step time. So a change offered here keeps its
//! promise by the page's own verdict: the headroom shown is the headroom its link shows.
//!
//! Computed on the page, only in those two cases (some twenty decided estimates).

use crate::config::{Config, KEYS};
use crate::estimator::cost::{step_cost, Assumptions};
use crate::estimator::plan::candidate_changes;
use crate::estimator::sweep::decided;
use crate::words::TIGHT_PCT;

/// One change that fits with room to spare.
#[derive(Clone, Debug, PartialEq)]
pub struct NextChange {
    /// "selective recompute", "ZeRO-3", …
    pub label: String,
    /// Every key (and value) it sets, as the link spells them.
    pub pairs: Vec<(&'static str, String)>,
    /// Bytes free at the peak once applied (the verdict's figure), and as a share of the
    /// capacity, percent.
    pub headroom: u64,
    pub headroom_pct: f64,
    /// The change in the cost model's estimated step time, percent.
    pub step_time_pct: f64,
    /// Whether it changes what is trained (optimizer, fine-tuning method).
    pub changes_training: bool,
}

/// The keys (and values) on which `to` differs from `from` (the display unit aside).
pub fn pairs_between(from: &Config, to: &Config) -> Vec<(&'static str, String)> {
    KEYS.iter()
        .filter(|k| k.name != "unit")
        .filter_map(|k| {
            let v = (k.get)(to);
            (v != (k.get)(from)).then_some((k.name, v))
        })
        .collect()
}

/// Up to `n` single changes of `cfg` that fit with at least [`TIGHT_PCT`] of the capacity free.
pub fn next_changes(cfg: &Config, n: usize) -> Vec<NextChange> {
    let a = Assumptions::default();
    let base = step_cost(cfg, &a).ok().map(|c| c.step_s);
    let mut out: Vec<NextChange> = candidate_changes(cfg)
        .into_iter()
        .filter_map(|(_, _, label, changes_training, c)| {
            let e = decided(&c).ok()?;
            let headroom = e.headroom();
            let pct = crate::words::headroom_pct(headroom, e.capacity);
            if !e.fits() || pct < TIGHT_PCT {
                return None;
            }
            let step_time_pct = match (base, step_cost(&c, &a)) {
                (Some(b), Ok(k)) if b > 0.0 => 100.0 * (k.step_s - b) / b,
                _ => 0.0,
            };
            Some(NextChange {
                label,
                pairs: pairs_between(cfg, &c),
                headroom: u64::try_from(headroom).unwrap_or(u64::MAX),
                headroom_pct: pct,
                step_time_pct,
                changes_training,
            })
        })
        .collect();
    out.sort_by(|x, y| {
        x.changes_training.cmp(&y.changes_training).then(x.step_time_pct.total_cmp(&y.step_time_pct)).then(y.headroom.cmp(&x.headroom))
    });
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::decode_query;

    #[test]
    fn every_next_change_fits_with_room_by_the_verdicts_own_figure() {
        // A run on a 24 GB card that does not fit (by 26 %), and a LoRA run that fits with 0.3 %
        // to spare.
        for q in ["model=llama-3.2-1b&gpu=rtx-4090", "model=llama-3.1-8b&finetune=lora&gpu=a100-80gb&seq=8800"] {
            let cfg = decode_query(q).config;
            let next = next_changes(&cfg, 3);
            assert!(!next.is_empty(), "{q}: some single change leaves 2 % free");
            for c in &next {
                let mut to = cfg.clone();
                crate::config::apply_pairs(&mut to, c.pairs.iter().map(|(k, v)| (*k, v.as_str())).collect());
                let e = decided(&to).expect("valid");
                assert!(e.fits(), "{q}: {} does not fit", c.label);
                assert_eq!(e.headroom(), c.headroom as i128, "{q}: {} claims what its link shows", c.label);
                assert!(c.headroom_pct >= TIGHT_PCT);
            }
        }
    }
}
