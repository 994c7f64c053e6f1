//! Finding a model by what people type: "llama 3.1 8b", "llama8b", "qwen 7b", "llama3.1", "405b".
//!
//! A preset is described by its id, its checkpoint, its family and its size (the parameter count,
//! as "8b" and "8.03b"), cut into tokens: lower case, split at anything that is not a letter, a
//! digit or a decimal point, and where letters meet digits ("llama3.1" → "llama", "3.1"; a size
//! such as "8b" stays whole). Every token of the query must start some token of the preset; a
//! number only where the number ends there ("3" starts "3.1" and "8b", not "30b").

use crate::estimator::presets::Preset;
use crate::estimator::units::format_count;

/// The tokens of a text (see the module's doc).
pub fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for piece in text.to_lowercase().split(|c: char| !(c.is_alphanumeric() || c == '.')) {
        let piece = piece.trim_matches('.');
        let mut cur = String::new();
        let mut prev: Option<char> = None;
        for c in piece.chars() {
            // A digit after a letter starts a new token ("llama3" → "llama", "3"); a letter after
            // a digit does not ("8b" is one size).
            if c.is_ascii_digit() && prev.is_some_and(|p| p.is_alphabetic()) && !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            cur.push(c);
            prev = Some(c);
        }
        if !cur.is_empty() {
            out.push(cur);
        }
    }
    out
}

/// Whether query token `q` starts token `t` (a number only where the number ends in `t`).
fn starts(t: &str, q: &str) -> bool {
    if !t.starts_with(q) {
        return false;
    }
    let numeric_end = q.chars().last().is_some_and(|c| c.is_ascii_digit());
    !numeric_end || !t[q.len()..].starts_with(|c: char| c.is_ascii_digit())
}

/// What a preset is found by: its id, checkpoint, family and size.
pub fn haystack(p: &Preset) -> Vec<String> {
    let n = p.spec.counts().total;
    let size = format_count(n).to_lowercase();
    let rounded = {
        let (digits, unit): (String, String) = size.chars().partition(|c| c.is_ascii_digit() || *c == '.');
        digits.parse::<f64>().map(|d| format!("{}{unit}", d.round())).unwrap_or_default()
    };
    let mut t = tokens(&format!("{} {} {} {size} {rounded}", p.id, p.checkpoint, p.family));
    t.dedup();
    t
}

/// Whether every token of `query` starts a token of `hay` (an empty query finds everything).
pub fn matches(query: &str, hay: &[String]) -> bool {
    tokens(query).iter().all(|q| hay.iter().any(|t| starts(t, q)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::presets::presets;

    fn found(query: &str) -> Vec<&'static str> {
        presets().into_iter().filter(|p| matches(query, &haystack(p))).map(|p| p.id).collect()
    }

    #[test]
    fn words_and_numbers_are_cut_apart_and_sizes_kept_whole() {
        assert_eq!(tokens("llama3.1"), ["llama", "3.1"]);
        assert_eq!(tokens("llama8b"), ["llama", "8b"]);
        assert_eq!(tokens("Llama 3.1 8B"), ["llama", "3.1", "8b"]);
        assert_eq!(tokens("meta-llama/Llama-3.1-8B"), ["meta", "llama", "llama", "3.1", "8b"]);
        assert_eq!(tokens("qwen2.5-7b"), ["qwen", "2.5", "7b"]);
    }

    #[test]
    fn what_people_type_finds_the_model() {
        for (q, want) in [
            ("llama 3.1 8b", "llama-3.1-8b"),
            ("llama 8b", "llama-3.1-8b"),
            ("qwen 7b", "qwen2.5-7b"),
            ("llama3.1", "llama-3.1-70b"),
            ("llama8b", "llama-3.1-8b"),
            ("405b", "llama-3.1-405b"),
            ("LLAMA-3.1-8B", "llama-3.1-8b"),
            ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
            ("kimi 1t", "kimi-k2-instruct"),
            ("mixtral", "mixtral-8x7b-v0.1"),
            ("gpt2", "gpt2-xl"),
        ] {
            assert!(found(q).contains(&want), "'{q}' finds {:?}", found(q));
        }
        // And not what it does not mean.
        assert_eq!(found("llama 3.1 8b"), ["llama-3.1-8b"]);
        assert_eq!(found("405b"), ["llama-3.1-405b"]);
        assert!(!found("gpt2").contains(&"gpt-oss-20b"), "2 does not start 20b");
        assert!(!found("qwen 7b").contains(&"qwen3-8b"));
        assert!(found("no such model").is_empty());
        assert_eq!(found("").len(), presets().len());
    }
}
