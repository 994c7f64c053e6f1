//! The source's shape, checked from the files themselves: no import cycle among the modules of
//! `ui/`, `bench/`, `plots/` and `estimator/`; imports between the areas run one way
//! (`ui → plots → estimator`, and the benchmark depends on nothing of ours, so its wasm module
//! holds no Leptos and no estimator); and `plots/` only draws (no call that runs the estimator).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The `.rs` files under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a source folder") {
        let p = entry.expect("an entry").path();
        if p.is_dir() {
            out.extend(files(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// A file's code without its unit tests and its comments (what the app compiles).
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("readable");
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The module path of a file: `src/ui/panels/ledger.rs` → `ui::panels::ledger`,
/// `src/ui/panels/mod.rs` → `ui::panels`.
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(src()).expect("under src");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// The modules a file's code names: `crate::a::b::…` and `super::x::…` paths (in `use`
/// declarations, braces expanded, and in expressions), resolved to the longest known module.
fn references(path: &Path, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let me = module_of(path);
    // `super` of a file is its folder's module; of a mod.rs, the folder's parent.
    // `super` names the parent module (for a mod.rs too: its folder's parent).
    let mut base: Vec<&str> = me.split("::").collect();
    base.pop();
    let text = code(path);
    // Flatten `use a::{b, c::{d, e}};` into `a::b`, `a::c::d`, `a::c::e`.
    let mut paths = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("use ") {
        let line_start = rest[..i].rfind('\n').map_or(0, |n| n + 1);
        let lead = rest[line_start..i].trim();
        let end = rest[i..].find(';').map_or(rest.len(), |e| i + e);
        if lead.is_empty() || lead == "pub" || lead.starts_with("pub(") {
            let body: String = without_renames(&rest[i + 4..end]).chars().filter(|c| !c.is_whitespace()).collect();
            expand(&body, &mut paths);
        }
        rest = &rest[(i + 4).min(end.max(i + 4))..];
    }
    for word in text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')) {
        // `super::{a, b}` leaves the bare prefix `super::` as a word: the list is read above.
        if (word.starts_with("crate::") || word.starts_with("super::")) && !word.ends_with("::") {
            paths.push(word.to_string());
        }
    }
    let mut out = BTreeSet::new();
    for p in paths {
        let full: Vec<String> = if let Some(rest) = p.strip_prefix("crate::") {
            rest.split("::").map(str::to_string).collect()
        } else if p.starts_with("super::") {
            let mut b: Vec<String> = base.iter().map(|s| s.to_string()).collect();
            let mut rest = p.as_str();
            while let Some(r) = rest.strip_prefix("super::") {
                if r.starts_with("super::") {
                    b.pop();
                }
                rest = r;
            }
            b.extend(rest.split("::").map(str::to_string));
            b
        } else {
            continue;
        };
        // The longest prefix that is a module of ours.
        for n in (1..=full.len()).rev() {
            let m = full[..n].join("::");
            if modules.contains(&m) {
                if m != me {
                    out.insert(m);
                }
                break;
            }
        }
    }
    out
}

/// A `use` body without its renames: `a::b as c` is `a::b`, `a::{self as b, C}` is `a::{self, C}`
/// (the path is what is imported; the alias is only its local name).
fn without_renames(body: &str) -> String {
    let mut out = String::new();
    let mut words = body.split_whitespace();
    while let Some(w) = words.next() {
        if w == "as" {
            // The alias: drop its name, keep what follows it (`,` or `}`).
            if let Some(alias) = words.next() {
                out.push_str(alias.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_'));
            }
            continue;
        }
        out.push(' ');
        out.push_str(w);
    }
    out
}

fn expand(body: &str, out: &mut Vec<String>) {
    match body.find('{') {
        None => {
            if !body.is_empty() {
                out.push(body.trim_end_matches("::*").to_string());
            }
        }
        Some(i) => {
            let prefix = &body[..i];
            let inner = &body[i + 1..body.rfind('}').unwrap_or(body.len())];
            // Split `inner` at top-level commas.
            let (mut depth, mut start) = (0, 0);
            let bytes: Vec<char> = inner.chars().collect();
            for (j, c) in bytes.iter().enumerate() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        let part: String = bytes[start..j].iter().collect();
                        expand(&format!("{prefix}{part}"), out);
                        start = j + 1;
                    }
                    _ => {}
                }
            }
            let part: String = bytes[start..].iter().collect();
            expand(&format!("{prefix}{part}"), out);
        }
    }
}

/// The import graph of an area (`ui`, `bench`, `plots`, `estimator`): module → modules of the
/// same area it names, and every parent (a `mod.rs`, or a `name.rs` beside `name/`) → its child
/// modules (a parent holds its children: a child that names its parent's own items makes a
/// loop, and is counted).
fn graph(area: &str) -> BTreeMap<String, BTreeSet<String>> {
    let all: Vec<PathBuf> = files(&src());
    let modules: BTreeSet<String> = all.iter().map(|p| module_of(p)).collect();
    let mut g = BTreeMap::new();
    for p in files(&src().join(area)) {
        let me = module_of(&p);
        let mut refs: BTreeSet<String> =
            references(&p, &modules).into_iter().filter(|m| m == area || m.starts_with(&format!("{area}::"))).collect();
        // A parent holds its children, whether it is a `mod.rs` or a `name.rs` beside a
        // `name/` folder.
        refs.extend(children(&me, &modules));
        g.insert(me, refs);
    }
    g
}

/// The modules directly below `module` (what its `mod.rs`, or `name.rs`, declares).
fn children(module: &str, modules: &BTreeSet<String>) -> Vec<String> {
    let prefix = format!("{module}::");
    modules.iter().filter(|m| m.strip_prefix(&prefix).is_some_and(|rest| !rest.contains("::"))).cloned().collect()
}

/// A cycle in `g`, if any, as the modules along it.
fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let i = stack.iter().position(|s| s == m).unwrap_or(0);
                    let mut c = stack[i..].to_vec();
                    c.push(m.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = visit(m, g, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(n, g, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn a_child_that_names_its_parents_items_is_a_cycle() {
    // estimator::step's children are below it: naming step's own items from one of them would
    // close a loop through the mod.rs → child edge.
    let modules: BTreeSet<String> = files(&src()).iter().map(|p| module_of(p)).collect();
    let kids = children("estimator::step", &modules);
    assert!(kids.contains(&"estimator::step::ir".to_string()), "{kids:?}");
    assert!(!kids.iter().any(|k| k.matches("::").count() > 2), "{kids:?}");
}

#[test]
fn the_modules_of_ui_bench_plots_and_the_estimator_import_each_other_without_a_cycle() {
    for area in ["ui", "bench", "plots", "estimator"] {
        let g = graph(area);
        assert!(g.len() > 5, "{area}: {} modules found", g.len());
        assert_eq!(cycle(&g), None, "{area}: an import cycle");
    }
}

#[test]
fn a_renamed_import_names_the_module_it_imports_not_its_alias() {
    assert_eq!(without_renames("crate::estimator::hf_writer as writer").trim(), "crate::estimator::hf_writer");
    let mut out = Vec::new();
    let body: String =
        without_renames("crate::estimator::hf_fields::{self as fields, Fields, HfError}").chars().filter(|c| !c.is_whitespace()).collect();
    expand(&body, &mut out);
    assert_eq!(out, ["crate::estimator::hf_fields::self", "crate::estimator::hf_fields::Fields", "crate::estimator::hf_fields::HfError"]);
}

#[test]
fn the_cycle_finder_finds_a_planted_cycle() {
    let g: BTreeMap<String, BTreeSet<String>> = [("a", vec!["b"]), ("b", vec!["c"]), ("c", vec!["a"]), ("d", vec![])]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into_iter().map(str::to_string).collect()))
        .collect();
    assert_eq!(cycle(&g), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
    // And reads braces and `super` the way the code writes them.
    let mut out = Vec::new();
    expand("super::{draw::{self,Layout},theme::Theme}", &mut out);
    assert_eq!(out, ["super::draw::self", "super::draw::Layout", "super::theme::Theme"]);
}

#[test]
fn imports_between_areas_run_one_way() {
    let all: Vec<PathBuf> = files(&src());
    let modules: BTreeSet<String> = all.iter().map(|p| module_of(p)).collect();
    let area = |m: &str| m.split("::").next().unwrap_or("").to_string();
    // What each area may name besides itself.
    let allowed: BTreeMap<&str, &[&str]> =
        // `version` is a leaf (the build's name); `course` (exercises answered by the estimator,
        // the page's panels by name, a chart's kind among them), `verify` (the verify script and
        // its comparison), `answers` (the answers panel's data, computed in the analysis worker),
        // `words` (the page's words for figures and choices), `next_change` (the changes offered
        // after a tight fit) and `search` (the model search) sit beside the estimator.
        [
            ("plots", &["estimator"][..]),
            ("bench", &[][..]),
            ("course", &["config", "estimator", "plots"][..]),
            ("verify", &["config", "estimator"][..]),
            ("answers", &["config", "estimator"][..]),
            // `frameworks` (framework config files in and out) reads and writes configurations.
            ("frameworks", &["config", "estimator"][..]),
            ("words", &["config", "estimator"][..]),
            ("next_change", &["words", "config", "estimator"][..]),
            ("search", &["estimator"][..]),
            (
                "ui",
                &["answers", "config", "estimator", "plots", "bench", "course", "verify", "version", "words", "next_change", "search", "frameworks"][..],
            ),
        ]
        .into_iter()
        .collect();
    for (from, may) in allowed {
        // An area is a folder, or a single file.
        let dir = src().join(from);
        let paths = if dir.is_dir() { files(&dir) } else { vec![src().join(format!("{from}.rs"))] };
        assert!(paths.iter().all(|p| p.exists()), "{from}: no such area");
        for p in paths {
            for m in references(&p, &modules) {
                let to = area(&m);
                assert!(to == from || may.contains(&to.as_str()), "{} names {m}: {from} may not depend on {to}", module_of(&p));
            }
        }
    }
}

#[test]
fn the_page_names_the_frameworks_only_through_their_lazily_loaded_modules_api() {
    // The parsers (yaml_serde, toml, shlex) are reached from frameworks' readers alone; the app
    // names only `frameworks::api`'s plain data and calls the module it loads on demand, so the
    // first screen's wasm links none of them.
    for p in files(&src().join("ui")) {
        let text = code(&p);
        for (i, _) in text.match_indices("frameworks::") {
            let before = &text[..i];
            if before.ends_with("crate::") || before.ends_with("super::") {
                assert!(text[i..].starts_with("frameworks::api::"), "{} names {}", p.display(), &text[i..(i + 40).min(text.len())]);
            }
        }
        for parser in ["yaml_serde", "toml::", "shlex"] {
            assert!(!text.contains(parser), "{} names {parser}", p.display());
        }
    }
}

#[test]
fn the_benchmark_names_neither_leptos_nor_the_estimator() {
    for p in files(&src().join("bench")) {
        let text = code(&p);
        for forbidden in ["leptos", "crate::estimator", "crate::ui", "crate::plots", "crate::config"] {
            assert!(!text.contains(forbidden), "{} names {forbidden}", p.display());
        }
    }
}

#[test]
fn plots_only_draw_they_never_run_the_estimator() {
    for p in files(&src().join("plots")) {
        let text = code(&p);
        // The estimator's entry points and every function of estimator::sweep that runs it.
        for call in [
            "estimate(",
            "explain(",
            "run(",
            "seq_sweep(",
            "batch_sweep(",
            "params_sweep(",
            "gpus_sweep(",
            "answers(",
            "max_batch(",
            "max_seq(",
            "longest_seq(",
            "min_gpus(",
            "fewest_gpus(",
            "smallest_gpu(",
            "fits(",
            "peak(",
        ] {
            let word_start = |i: usize| !text[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '.');
            let found = text.match_indices(call).any(|(i, _)| word_start(i));
            assert!(!found, "{} calls {call}", p.display());
        }
    }
}
