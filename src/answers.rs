//! The answers panel's data: the one-click answers ([`crate::estimator::sweep::answers`]) and
//! the cheapest fixes ([`crate::estimator::plan::cheapest_fixes`]) for one configuration, as
//! the panel shows and applies them, and their wire format.
//!
//! The page computes them in its analysis worker where it has one (`ui::analysis`): the worker
//! runs the app's exported `analyse` on the configuration's query ([`analyse_query`]) and posts
//! back the JSON of a [`Found`]. Numbers cross as integers and the percentages as the text the
//! page shows, so nothing is rounded on the way, and the same function computes them in the
//! page when there is no worker.

use crate::config::{decode_query, encode_query, Config, Unit, KEYS};
use crate::estimator::cost::Assumptions;
use crate::estimator::plan::{cheapest_fixes, Fix, DEFAULT_FIXES};
use crate::estimator::sweep::answers;
use serde::{Deserialize, Serialize};

/// What the answers and fixes depend on: the configuration without its display unit.
pub fn key_of(cfg: &Config) -> Config {
    Config { unit: Unit::Gb, ..cfg.clone() }
}

/// The one-click answers and the cheapest fixes for one configuration, as the answers panel
/// shows them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Found {
    /// The configuration they are for: the query of its [`key_of`] ([`encode_query`]).
    pub query: String,
    /// The largest micro-batch that fits (`None`: not even 1).
    pub max_batch: Option<u64>,
    /// The longest sequence that fits, in tokens.
    pub max_seq: Option<u64>,
    /// The fewest GPUs that fit with this sharding.
    pub fewest_gpus: Option<u64>,
    /// The smallest GPU of the catalog that fits: its id and name.
    pub smallest_gpu: Option<(String, String)>,
    /// The cheapest single changes that make it fit (empty when it fits or none was ranked).
    pub fixes: Vec<FoundFix>,
    /// Why no change was ranked, if none could be. (Two fields, not a `Result`: serde's
    /// `Result` visitor costs the app's wasm ~6 KB for this one type.)
    pub fixes_error: Option<String>,
}

/// One of the cheapest fixes, as its button shows and applies it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FoundFix {
    /// The key it changes and its new value, as the URL spells them.
    pub key: String,
    pub value: String,
    /// "selective recompute", "ZeRO-3", …
    pub label: String,
    /// Bytes left free once it fits (a fix always fits, so never below zero).
    pub headroom: u64,
    /// The change in executed FLOPs per step, as shown ("+0.9 %", "±0 %").
    pub flops: String,
    /// The change in the cost model's estimated step time, as shown.
    pub step_time: String,
    /// Whether the change alters what is trained (optimizer, fine-tuning method), not only how.
    pub changes_training: bool,
    /// Every key (and value) on which the fixed configuration differs: what applying it sets.
    pub pairs: Vec<(String, String)>,
}

/// Computes the answers and fixes for `key` (a [`key_of`]).
pub fn analyse(key: &Config) -> Found {
    let a = answers(key);
    let (fixes, fixes_error) = match cheapest_fixes(key, &Assumptions::default(), DEFAULT_FIXES) {
        Ok(f) => (f.iter().map(|f| found_fix(key, f)).collect(), None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    Found {
        query: encode_query(key),
        max_batch: a.max_batch,
        max_seq: a.max_seq,
        fewest_gpus: a.fewest_gpus,
        smallest_gpu: a.smallest_gpu.map(|g| (g.id.to_string(), g.name.to_string())),
        fixes,
        fixes_error,
    }
}

/// The analysis worker's entry (exported by the app's binary as `analyse`): [`analyse`] for the
/// configuration a query decodes to, as JSON.
pub fn analyse_query(query: &str) -> String {
    let found = analyse(&key_of(&decode_query(query).config));
    // A struct of strings, integers and options: serializing it cannot fail.
    serde_json::to_string(&found).unwrap_or_default()
}

fn found_fix(from: &Config, f: &Fix) -> FoundFix {
    FoundFix {
        key: f.key.to_string(),
        value: f.value.clone(),
        label: f.label.clone(),
        headroom: u64::try_from(f.headroom.max(0)).unwrap_or(u64::MAX),
        flops: pct(f.flops_pct),
        step_time: pct(f.step_time_pct),
        changes_training: f.changes_training,
        pairs: fix_pairs(from, &f.config).into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    }
}

/// A percentage change as the answers show it: one decimal and a sign, "±0 %" when it rounds
/// to nothing.
fn pct(v: f64) -> String {
    /// Below this (in percent) a change shows as none.
    const NO_CHANGE: f64 = 0.05;
    if v.abs() < NO_CHANGE {
        "±0 %".into()
    } else {
        format!("{v:+.1} %")
    }
}

/// The keys (and values) on which a fix's configuration differs from `from`, as the codec
/// spells them: what applying the fix sets.
fn fix_pairs(from: &Config, fix: &Config) -> Vec<(&'static str, String)> {
    KEYS.iter()
        .filter(|k| k.name != "unit")
        .filter_map(|k| {
            let v = (k.get)(fix);
            (v != (k.get)(from)).then_some((k.name, v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_cross_the_worker_boundary_unchanged() {
        // A configuration that does not fit, so that fixes are ranked too.
        let cfg = decode_query("seq=16384&zero=3&gpus=8").config;
        let found = analyse(&key_of(&cfg));
        assert!(!found.fixes.is_empty() && found.fixes_error.is_none(), "{:?}", found.fixes_error);
        let json = serde_json::to_string(&found).unwrap();
        assert_eq!(serde_json::from_str::<Found>(&json).unwrap(), found);
        assert_eq!(analyse_query(&found.query), json, "the worker's entry gives the same for the key's query");
    }

    #[test]
    fn the_key_ignores_the_unit_and_its_query_decodes_back_to_it() {
        let cfg = decode_query("unit=gib&batch=3&model=qwen2.5-0.5b").config;
        let key = key_of(&cfg);
        assert_eq!(key, key_of(&Config { unit: Unit::Gb, ..cfg.clone() }));
        assert_eq!(key_of(&decode_query(&encode_query(&key)).config), key);
    }

    #[test]
    fn a_fix_carries_every_key_it_changes_and_not_the_unit() {
        let from = Config::default();
        let to = Config { batch: from.batch + 1, seq: from.seq * 2, unit: Unit::Gib, ..from.clone() };
        let mut pairs = fix_pairs(&from, &to);
        pairs.sort();
        assert_eq!(pairs, vec![("batch", (from.batch + 1).to_string()), ("seq", (from.seq * 2).to_string())]);
    }

    #[test]
    fn small_changes_show_as_none_and_others_with_their_sign() {
        assert_eq!(pct(0.04), "±0 %");
        assert_eq!(pct(-0.04), "±0 %");
        assert_eq!(pct(1.26), "+1.3 %");
        assert_eq!(pct(-12.0), "-12.0 %");
    }
}
