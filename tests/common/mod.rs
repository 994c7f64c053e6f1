//! What the fixture tests share: where the PyTorch fixtures are, whether CI runs them (where a
//! missing fixture fails instead of skipping), and a directory's JSON shards.
#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};

/// `tests/fixtures/pytorch`, or `$TRAINMEM_PYTORCH_FIXTURES` (a harness run in progress).
pub fn pytorch_root() -> PathBuf {
    std::env::var("TRAINMEM_PYTORCH_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pytorch"))
}

/// [`pytorch_root`]`/<sub>`.
pub fn pytorch_fixtures(sub: &str) -> PathBuf {
    pytorch_root().join(sub)
}

/// `CI=1` (or `true`), which `.ci/run` sets.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// Whether a test has nothing to check because its fixtures (`what`, under `dir`) are missing:
/// under CI a failure (the fixtures are committed), elsewhere said on stderr and skipped.
pub fn missing(empty: bool, what: &str, dir: &Path) -> bool {
    if empty {
        assert!(!ci(), "no {what} under {} (CI=1: the fixtures are committed, so this fails)", dir.display());
        eprintln!("no {what} under {}", dir.display());
    }
    empty
}

/// The `records` of the fixture file `sub` under [`pytorch_root`] (`fsdp/pp.json`); empty, and
/// under CI a failure, when the file is missing.
pub fn fixture_records(sub: &str) -> Vec<Value> {
    let path = pytorch_fixtures(sub);
    match std::fs::read_to_string(&path) {
        Ok(s) => serde_json::from_str::<Value>(&s).expect("json")["records"].as_array().cloned().unwrap_or_default(),
        Err(e) => {
            assert!(!ci(), "{}: {e} (CI=1: the fixture is committed, so this fails)", path.display());
            eprintln!("{}: {e}", path.display());
            Vec::new()
        }
    }
}

/// Every `*.json` in `dir` but `index.json`, sorted by name: (file stem, document). Empty when
/// the directory is missing.
pub fn json_shards(dir: &Path) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        let mut paths: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
            if p.extension().is_some_and(|x| x == "json") && stem != "index" {
                let doc: Value = serde_json::from_str(&std::fs::read_to_string(&p).expect("readable")).expect("json");
                out.push((stem, doc));
            }
        }
    }
    out
}

/// The live bytes of the FSDP units' allocations (`Cat::Gathered`) after each event of `s`.
pub fn gathered_live(s: &trainmem::estimator::step::Stream) -> Vec<u128> {
    use trainmem::estimator::step::{Cat, EventKind};
    let mut live = 0u128;
    s.events
        .iter()
        .map(|e| {
            if e.cat == Cat::Gathered {
                match e.kind {
                    EventKind::Alloc => live += e.bytes,
                    EventKind::Free => live -= e.bytes,
                }
            }
            live
        })
        .collect()
}
