//! The parsed file as one tree (JSON's data model, whatever the syntax), its leaves as dotted
//! keys, and where a key sits in the text. Parsing goes through maintained crates only:
//! `serde_json`, `yaml_serde` (serde_yaml's successor, maintained by the YAML organization),
//! `toml` and `shlex`.

use serde_json::Value;

/// A syntax error: its 1-based line when the parser knows it, and the parser's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub line: Option<usize>,
    pub reason: String,
}

/// JSON text as a tree.
pub fn parse_json(text: &str) -> Result<Value, SyntaxError> {
    serde_json::from_str(text).map_err(|e| SyntaxError { line: Some(e.line().max(1)), reason: lower(&strip_at(&e.to_string())) })
}

/// YAML text (one document) as a tree. Keys must be strings, as in every framework's config.
pub fn parse_yaml(text: &str) -> Result<Value, SyntaxError> {
    yaml_serde::from_str::<Value>(text)
        .map_err(|e| SyntaxError { line: e.location().map(|l| l.line().max(1)), reason: lower(&strip_at(&e.to_string())) })
}

/// TOML text as a tree.
pub fn parse_toml(text: &str) -> Result<Value, SyntaxError> {
    toml::from_str::<Value>(text).map_err(|e| {
        let line = e.span().map(|s| text.get(..s.start).unwrap_or(text).matches('\n').count() + 1);
        SyntaxError { line, reason: lower(e.message().trim()) }
    })
}

/// A command line's words, as a POSIX shell splits them: comments (`#` to the end of a line)
/// and line continuations (`\` before a newline) are removed first.
pub fn split_words(text: &str) -> Result<Vec<(String, usize)>, SyntaxError> {
    let mut words = Vec::new();
    let mut pending = String::new();
    let mut first_line = 1;
    for (i, raw) in text.lines().enumerate() {
        let line = strip_comment(raw);
        let (body, continues) = match line.trim_end().strip_suffix('\\') {
            Some(b) => (b.to_string(), true),
            None => (line.to_string(), false),
        };
        if pending.is_empty() {
            first_line = i + 1;
        }
        pending.push_str(&body);
        pending.push(' ');
        if continues {
            continue;
        }
        push_words(&pending, first_line, i + 1, &mut words)?;
        pending.clear();
    }
    if !pending.trim().is_empty() {
        push_words(&pending, first_line, first_line, &mut words)?;
    }
    Ok(words)
}

fn push_words(chunk: &str, first: usize, last: usize, out: &mut Vec<(String, usize)>) -> Result<(), SyntaxError> {
    let words = shlex::split(chunk).ok_or_else(|| SyntaxError { line: Some(last), reason: "unbalanced quotes".into() })?;
    // Each word's line: the first line of the chunk that holds it (continuations span lines).
    for w in words {
        out.push((w, first));
    }
    Ok(())
}

/// A line without its `#` comment (a `#` that starts a word, outside quotes).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double, mut prev_space) = (false, false, true);
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev_space => return &line[..i],
            _ => {}
        }
        prev_space = c.is_whitespace();
    }
    line
}

fn strip_at(s: &str) -> String {
    s.trim().to_string()
}

/// Error messages begin in lowercase, like the rest of the project's.
fn lower(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

/// The leaves of a tree as (dotted key, value), in the tree's order. Arrays and empty objects
/// are leaves; so is a `_component_`'s object in torchtune (the object's other keys are leaves
/// of their own).
pub fn leaves(root: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    walk(root, String::new(), &mut out, 0);
    out
}

fn walk<'a>(v: &'a Value, prefix: String, out: &mut Vec<(String, &'a Value)>, depth: usize) {
    match v {
        Value::Object(m) if !m.is_empty() && depth < 64 => {
            for (k, child) in m {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                walk(child, key, out, depth + 1);
            }
        }
        _ if prefix.is_empty() => {}
        _ => out.push((prefix, v)),
    }
}

/// The value at a dotted key.
pub fn get<'a>(root: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(root, |v, seg| v.get(seg))
}

/// A whole number: JSON/YAML/TOML integers, integral floats (`1e9`) and numeric strings.
pub fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15).map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A non-negative whole number that fits every trainmem key.
pub fn count(v: &Value) -> Option<u64> {
    int(v).filter(|n| (0..=1 << 40).contains(n)).map(|n| n as u64)
}

/// A number.
pub fn float(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A boolean: true/false, and the spellings YAML 1.1 and Python people write.
pub fn boolean(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" | "1" => Some(true),
            "false" | "no" | "off" | "0" => Some(false),
            _ => None,
        },
        Value::Number(n) => n.as_i64().map(|i| i != 0),
        _ => None,
    }
}

/// A string (numbers and booleans as written).
pub fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.trim().to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A value as the report quotes it (shortened to 60 characters).
pub fn show(v: &Value) -> String {
    let s = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if s.chars().count() > 60 {
        s.chars().take(57).collect::<String>() + "..."
    } else {
        s
    }
}

/// The 1-based line where a dotted key is written: each part of the key is looked for on a
/// later line than the part before it (`key:`, `key =`, `"key":` or a `[table.key]` header).
pub fn line_of(text: &str, key: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut from = 0;
    let mut found = None;
    for seg in key.split('.') {
        let (i, header) = (from..lines.len()).find_map(|i| names(lines[i], seg).map(|h| (i, h)))?;
        found = Some(i);
        // A TOML header names several parts on one line.
        from = if header { i } else { i + 1 };
    }
    found.map(|i| i + 1)
}

/// Whether `line` writes the key `seg` (`Some(true)`: in a TOML table header).
fn names(line: &str, seg: &str) -> Option<bool> {
    let t = line.trim_start();
    let t = t.strip_prefix("- ").unwrap_or(t).trim_start();
    if let Some(inner) = t.strip_prefix('[') {
        let inner = inner.trim_start_matches('[');
        let inner = inner.split(']').next().unwrap_or("");
        return inner.split('.').any(|p| p.trim().trim_matches('"') == seg).then_some(true);
    }
    let t = t.trim_start_matches(['"', '\'']);
    let rest = t.strip_prefix(seg)?;
    let rest = rest.trim_start_matches(['"', '\'']).trim_start();
    (rest.starts_with(':') || rest.starts_with('=')).then_some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_found_on_its_line_in_each_syntax() {
        let yaml = "a:\n  b: 1\nc:\n  b: 2\n";
        assert_eq!(line_of(yaml, "c.b"), Some(4));
        let toml = "[x]\nk = 1\n[quantize.linear.float8]\nenable = true\n";
        assert_eq!(line_of(toml, "quantize.linear.float8.enable"), Some(4));
        let json = "{\n  \"zero_optimization\": {\n    \"stage\": 3\n  }\n}";
        assert_eq!(line_of(json, "zero_optimization.stage"), Some(3));
        assert_eq!(line_of(json, "missing"), None);
    }

    #[test]
    fn syntax_errors_name_their_line() {
        assert_eq!(parse_yaml("a: 1\nb: [\n").map_err(|e| e.line.is_some()), Err(true));
        assert_eq!(parse_toml("a = 1\nb = \n").map_err(|e| e.line), Err(Some(2)));
        assert_eq!(parse_json("{\n\"a\": ,}").map_err(|e| e.line), Err(Some(2)));
    }

    #[test]
    fn command_lines_split_like_a_shell_without_comments_and_continuations() {
        let w = split_words("torchrun --nproc_per_node 8 \\\n  x.py --a 'b c' # note\n--d 1\n").expect("words");
        let words: Vec<&str> = w.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(words, ["torchrun", "--nproc_per_node", "8", "x.py", "--a", "b c", "--d", "1"]);
        assert_eq!(w.last().map(|(_, l)| *l), Some(3));
        assert!(split_words("--a 'open").is_err());
    }

    #[test]
    fn numbers_read_from_integers_floats_and_strings() {
        assert_eq!(int(&serde_json::json!(1e9)), Some(1_000_000_000));
        assert_eq!(int(&serde_json::json!("8")), Some(8));
        assert_eq!(count(&serde_json::json!(-1)), None);
        assert_eq!(boolean(&serde_json::json!("True")), Some(true));
    }
}
