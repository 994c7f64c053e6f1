//! The next change, for a configuration that fits with less than [`TIGHT_PCT`] to spare or
//! does not fit although a change was just applied to make it fit: the planner's single changes
//! that fit with at least [`TIGHT_PCT`] of the capacity free, decided by the verdict itself
//! ([`changes_that_fit`]: each one's headroom is the headroom its own link shows), as the page
//! shows them (the keys each sets).
//!
//! Computed on the page, only in those two cases (some twenty analysed configurations).

use crate::config::{Config, KEYS};
use crate::estimator::analyse::{headroom_pct, TIGHT_PCT};
use crate::estimator::cost::Assumptions;
use crate::estimator::plan::changes_that_fit;

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
    let fixes = changes_that_fit(cfg, &Assumptions::default(), n, TIGHT_PCT).unwrap_or_default();
    fixes
        .into_iter()
        .map(|f| {
            let capacity = crate::estimator::capacity(&f.config);
            NextChange {
                label: f.label,
                pairs: pairs_between(cfg, &f.config),
                headroom: u64::try_from(f.headroom.max(0)).unwrap_or(u64::MAX),
                headroom_pct: headroom_pct(f.headroom, capacity),
                step_time_pct: f.step_time_pct,
                changes_training: f.changes_training,
            }
        })
        .collect()
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
                let v = crate::estimator::analyse(&to).expect("valid").verdict;
                assert!(v.fits, "{q}: {} does not fit", c.label);
                assert_eq!(v.headroom, c.headroom as i128, "{q}: {} claims what its link shows", c.label);
                assert!(c.headroom_pct >= TIGHT_PCT);
            }
        }
    }
}
