//! The configuration codec: the canonical keys of [`Config`], shared by the share URL
//! (`?seq=8192&zero=3`), the CLI (`--seq 8192 --zero 3`) and the UI's inputs.
//!
//! Decoding is tolerant by design: links outlive versions of the app, and people edit them by
//! hand. A bad or unknown key never loses the rest of the configuration — it is reported
//! (naming the key and value) and that one key falls back to its default. Encoding writes only
//! the keys that differ from the defaults, in a fixed order, so links stay short and readable.

mod chart_view;
mod keys;
mod legacy;
pub mod recipes;

pub use crate::estimator::config::*;
pub use chart_view::ChartView;
pub use keys::{apply_recipe, matching_recipe};
pub use keys::{parse_uint, Group, Key, KEYS};
pub use recipes::{recipe, Recipe, RECIPES};

use crate::estimator::hf::Imported;
use crate::estimator::presets::{default_spec, preset};

/// Keys the page itself uses (embed mode, the panel to show, a benchmark result); the codec
/// passes them over without complaint.
pub const PRESENTATION_KEYS: &[&str] = &[
    "embed",
    "view",
    "bench",
    "v",
    "theme",
    "sections",
    "hide",
    "lock",
    "step",
    "quiz",
    "ask",
    "tol",
    "hint",
    "question",
    "compare",
    "allow_origin",
    "lang",
    "chart",
];

/// One key that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{key}` = '{value}': {reason}")]
pub struct ConfigError {
    pub key: String,
    /// The offending value, shortened to 60 characters.
    pub value: String,
    pub reason: String,
}

impl ConfigError {
    /// An error about `key` = `value` of the link, for decoders beside this codec (course
    /// settings).
    pub fn for_key(key: &str, value: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::new(key, value, reason)
    }
    fn new(key: &str, value: &str, reason: impl Into<String>) -> ConfigError {
        let value: String = value.chars().take(60).collect();
        ConfigError { key: key.chars().take(60).collect(), value, reason: reason.into() }
    }
}

/// The result of decoding: the configuration (always usable) and what was wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub config: Config,
    pub errors: Vec<ConfigError>,
    /// Presentation keys found, in order (`embed`, `view`, …).
    pub presentation: Vec<(String, String)>,
}

/// The key named `name` in the codec's table (`None`: no such key).
pub fn find_key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// Applies `key = value` to `cfg`, or says why not (leaving `cfg` unchanged).
pub fn set(cfg: &mut Config, key: &str, value: &str) -> Result<(), ConfigError> {
    let k = find_key(key).ok_or_else(|| ConfigError::new(key, value, "unknown key"))?;
    let mut next = cfg.clone();
    (k.set)(&mut next, value.trim()).map_err(|reason| ConfigError::new(key, value, reason))?;
    *cfg = next;
    Ok(())
}

/// The value of `key` in `cfg`, as the codec writes it.
pub fn get(cfg: &Config, key: &str) -> Option<String> {
    find_key(key).map(|k| (k.get)(cfg))
}

/// Decodes key/value pairs (already percent-decoded) into a configuration.
///
/// `model` applies first (it sets the architecture), then architecture keys, then the rest;
/// a repeated key keeps its last value. An architecture that no longer equals its preset turns
/// the model into `custom`. Finally the whole is checked; a key the estimator rejects falls
/// back to its default and is reported.
pub fn decode_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Decoded {
    let mut cfg = Config::default();
    let mut errors = Vec::new();
    let mut presentation = Vec::new();
    let mut ordered: Vec<(&str, &str)> = Vec::new();
    for (k, v) in pairs {
        if PRESENTATION_KEYS.contains(&k) {
            presentation.push((k.to_string(), v.to_string()));
        } else if k.is_empty() && v.is_empty() {
            continue;
        } else {
            ordered.retain(|(ok, _)| *ok != k);
            ordered.push((k, v));
        }
    }
    let old_custom = names_an_old_custom_architecture(ordered.iter().map(|(k, v)| (*k, *v)));
    errors.extend(apply_pairs(&mut cfg, ordered));
    if old_custom && cfg.model == "custom" {
        cfg.arch.family = legacy::family_of_old_link(&cfg.arch);
    }
    repair(&mut cfg, &mut errors);
    Decoded { config: cfg, errors, presentation }
}

/// Whether these pairs describe a custom architecture the way links did before the `family` key:
/// architecture keys on no preset (no `model`, or `model=custom`) and no `family`. Such a link's
/// family is read from its numbers as the estimator of the day chose it ([`legacy`]).
pub fn names_an_old_custom_architecture<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> bool {
    let (mut arch, mut preset, mut family) = (false, false, false);
    for (k, v) in pairs {
        match k {
            "family" => family = true,
            "model" => preset = !v.trim().eq_ignore_ascii_case("custom"),
            "recipe" => preset |= recipe(v).is_some_and(|r| r.pairs.iter().any(|(k, _)| *k == "model")),
            _ => arch |= find_key(k).is_some_and(|key| key.group == Group::Architecture),
        }
    }
    arch && !preset && !family
}

/// The family an old link's custom architecture was built with (see
/// [`names_an_old_custom_architecture`]).
pub fn family_of_old_link(spec: &crate::estimator::model::ModelSpec) -> crate::estimator::family::Family {
    legacy::family_of_old_link(spec)
}

/// Applies key/value pairs to `cfg` — `model` first (it sets the architecture), then the
/// architecture keys, then the rest — and returns the ones that could not be used. An
/// architecture that no longer equals its preset turns the model into `custom`. The URL decoder
/// and the CLI both go through here.
pub fn apply_pairs<'a>(cfg: &mut Config, mut pairs: Vec<(&'a str, &'a str)>) -> Vec<ConfigError> {
    // `recipe` first (it sets many keys, the model among them), then `model`, then the rest.
    let rank = |k: &str| match find_key(k).map(|k| k.group) {
        _ if k == "recipe" => 0,
        _ if k == "model" => 1,
        Some(Group::Architecture) => 2,
        _ => 3,
    };
    pairs.sort_by_key(|(k, _)| rank(k));
    let mut errors = Vec::new();
    let mut arch_touched = false;
    for (k, v) in pairs {
        match set(cfg, k, v) {
            Ok(()) => arch_touched |= rank(k) == 2,
            Err(e) => errors.push(e),
        }
    }
    if arch_touched {
        mark_custom_if_changed(cfg);
    }
    normalize(cfg);
    errors
}

/// Decodes a URL query string (with or without the leading `?`).
pub fn decode_query(query: &str) -> Decoded {
    let pairs = query_pairs(query);
    decode_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

/// A URL query string's key/value pairs, percent-decoded, in order (with or without the leading
/// `?`; a key without `=` has an empty value, empty pairs are skipped): what [`decode_query`]
/// and the CLI's `--query` read.
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    let q = query.strip_prefix('?').unwrap_or(query);
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// Resets, one at a time, each key the estimator rejects, until the whole is valid.
fn repair(cfg: &mut Config, errors: &mut Vec<ConfigError>) {
    let mut reset_keys: Vec<&'static str> = Vec::new();
    for _ in 0..KEYS.len() {
        let Err(e) = crate::estimator::validate_consistency(cfg) else {
            return;
        };
        let key = e.key();
        if reset_keys.contains(&key) {
            break;
        }
        let value = get(cfg, key).unwrap_or_default();
        errors.push(ConfigError::new(key, &value, e.to_string().trim_start_matches(&format!("`{key}` ")).to_string()));
        reset(cfg, key);
        reset_keys.push(key);
    }
    // Still invalid: keep the model and start the rest over from the defaults.
    if crate::estimator::validate_consistency(cfg).is_err() {
        let keep = Config { model: cfg.model.clone(), name: cfg.name.clone(), arch: cfg.arch.clone(), ..Config::default() };
        *cfg = if crate::estimator::validate_consistency(&keep).is_ok() { keep } else { Config::default() };
    }
}

/// Puts one key back to its default (an architecture key to its preset's value).
pub fn reset(cfg: &mut Config, key: &str) {
    let Some(k) = find_key(key) else { return };
    let base = if k.group == Group::Architecture {
        let spec = preset(&cfg.model).map(|p| p.spec).unwrap_or_else(default_spec);
        Config { arch: spec, ..Config::default() }
    } else {
        Config::default()
    };
    let value = (k.get)(&base);
    let _ = (k.set)(cfg, &value);
}

/// Drops what a configuration cannot carry: a display name belongs to custom models only (a
/// preset is named by its id), so it is not kept where the URL would not write it.
pub fn normalize(cfg: &mut Config) {
    if cfg.model != "custom" {
        cfg.name.clear();
    }
}

/// After architecture edits: a preset whose architecture changed becomes `custom`.
pub fn mark_custom_if_changed(cfg: &mut Config) {
    if let Some(p) = preset(&cfg.model) {
        if p.spec != cfg.arch {
            if cfg.name.is_empty() {
                cfg.name = format!("{} (modified)", p.id);
            }
            cfg.model = "custom".to_string();
        }
    }
}

/// Replaces the model with an imported config.json.
pub fn apply_import(cfg: &mut Config, imported: &Imported) {
    cfg.model = "custom".to_string();
    cfg.name = if imported.name.is_empty() { format!("imported {}", imported.model_type) } else { imported.name.clone() };
    cfg.arch = imported.spec.clone();
}

/// The non-default keys of `cfg`, in canonical order. A recipe preset is never written: a link
/// spells its keys out (a recipe of mostly default keys would otherwise name any configuration).
pub fn encode_pairs(cfg: &Config) -> Vec<(&'static str, String)> {
    let default = Config::default();
    let custom = cfg.model == "custom";
    KEYS.iter()
        .filter(|k| k.group != Group::Architecture || custom)
        .filter(|k| k.name != "name" || custom)
        .filter_map(|k| {
            let v = (k.get)(cfg);
            // A custom architecture always names its family, even Llama's: a custom link
            // without one is a link from before the key ([`names_an_old_custom_architecture`]).
            let always = custom && k.name == "family";
            (always || v != (k.get)(&default)).then_some((k.name, v))
        })
        .collect()
}

/// The query string (without `?`) of `cfg`: only non-default keys, human-readable.
pub fn encode_query(cfg: &Config) -> String {
    encode_pairs(cfg).iter().map(|(k, v)| format!("{k}={}", percent_encode(v))).collect::<Vec<_>>().join("&")
}

/// Percent-decoding of `application/x-www-form-urlencoded` (`+` is a space); invalid escapes
/// are kept literally and invalid UTF-8 is replaced, never a panic.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Percent-encoding for query values: unreserved characters and `,` stay, all else is escaped.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b',') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_configuration_encodes_to_an_empty_query() {
        assert_eq!(encode_query(&Config::default()), "");
    }

    #[test]
    fn a_query_round_trips_through_decode_and_encode() {
        let d = decode_query("?model=llama-3.1-70b&seq=8192&zero=3&gpus=8");
        assert_eq!(d.errors, vec![]);
        assert_eq!(encode_query(&d.config), "model=llama-3.1-70b&seq=8192&gpus=8&zero=3");
        assert_eq!(decode_query(&encode_query(&d.config)).config, d.config);
    }

    #[test]
    fn a_bad_value_names_its_key_and_keeps_the_rest() {
        let d = decode_query("seq=lots&batch=4&zero=3&gpus=8");
        assert_eq!(d.errors.len(), 1);
        assert_eq!(d.errors[0].key, "seq");
        assert_eq!(d.errors[0].value, "lots");
        assert_eq!((d.config.seq, d.config.batch, d.config.gpus), (4096, 4, 8));
    }

    #[test]
    fn an_unknown_key_is_reported_and_ignored() {
        let d = decode_query("colour=blue&seq=1024");
        assert_eq!(d.errors.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["colour"]);
        assert_eq!(d.config.seq, 1024);
    }

    #[test]
    fn editing_a_presets_architecture_makes_it_custom_and_the_link_reproduces_it() {
        let d = decode_query("model=gpt2&layers=6");
        assert_eq!(d.config.model, "custom");
        assert_eq!(d.config.arch.layers, 6);
        assert_eq!(d.config.arch.hidden, 768);
        let again = decode_query(&encode_query(&d.config));
        assert_eq!(again.config.arch, d.config.arch);
        assert_eq!(again.errors, vec![]);
    }

    #[test]
    fn an_inconsistent_key_falls_back_and_is_reported() {
        // 32 heads do not split over 3 GPUs: tp falls back to 1, the GPU count stays.
        let d = decode_query("tp=3&gpus=8&model=llama-3.1-70b");
        assert_eq!(d.errors.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["tp"]);
        assert_eq!((d.config.tp, d.config.gpus), (1, 8));
        assert_eq!(d.config.model, "llama-3.1-70b");
        assert!(crate::estimator::validate_consistency(&d.config).is_ok());
    }

    #[test]
    fn a_custom_link_names_its_family_and_an_old_one_reads_it_from_the_numbers() {
        // Written now: the family is in the link, Llama's too.
        let d = decode_query("model=custom&fused_qkv=true&family=llama");
        assert_eq!(d.config.arch.family, crate::estimator::family::Family::Llama);
        assert!(encode_query(&d.config).contains("family=llama"), "{}", encode_query(&d.config));
        assert_eq!(decode_query(&encode_query(&d.config)).config, d.config);
        // Written before the key: a fused-QKV RMSNorm RoPE model was built with Phi-3's code.
        let old = decode_query("model=custom&fused_qkv=true");
        assert_eq!(old.config.arch.family, crate::estimator::family::Family::Phi3);
        // A preset's family comes with it and needs no key.
        assert_eq!(decode_query("model=gpt2&layers=6").config.arch.family, crate::estimator::family::Family::Gpt2);
    }

    #[test]
    fn presentation_keys_pass_through() {
        let d = decode_query("embed=1&view=seq&seq=2048");
        assert_eq!(d.errors, vec![]);
        assert_eq!(d.presentation, vec![("embed".to_string(), "1".to_string()), ("view".to_string(), "seq".to_string())]);
    }

    #[test]
    fn percent_decoding_never_panics_on_broken_escapes() {
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("%"), "%");
        assert_eq!(percent_decode("%zz"), "%zz");
        assert_eq!(percent_decode("%E2%9C%93+x"), "✓ x");
        assert_eq!(percent_decode("%FF"), "\u{FFFD}");
    }

    #[test]
    fn every_key_round_trips_its_own_default() {
        let c = Config::default();
        for k in KEYS {
            let mut d = c.clone();
            assert_eq!((k.set)(&mut d, &(k.get)(&c)), Ok(()), "{}", k.name);
            assert_eq!(d, c, "{}", k.name);
        }
    }
}
