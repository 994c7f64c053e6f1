//! trainmem: where GPU memory goes when you train a transformer.
//!
//! Dependencies point one way: `ui → {answers, course, verify, words, next_change, search, config, estimator, plots, bench}`,
//! `answers → {config, estimator}`, `course → {config, estimator, plots}`, `verify → {config, estimator}`,
//! `words → {config, estimator}` (the page's words for figures and choices), `next_change → {words, config, estimator}`,
//! `search → estimator` (finding a preset by what people type), `plots → estimator`,
//! `frameworks → {config, estimator}` (framework config files in and out), `config → estimator`, and `estimator →` nothing of ours. The estimator never touches a web
//! API; the CLI (native) and the UI (wasm) are thin shells over it.

pub mod answers;
pub mod bench;
pub mod config;
pub mod course;
pub mod estimator;
pub mod frameworks;
pub mod next_change;
pub mod plots;
pub mod search;
pub mod verify;
pub mod version;
pub mod words;

#[cfg(not(target_arch = "wasm32"))]
pub mod cli;

#[cfg(all(target_arch = "wasm32", feature = "app"))]
pub mod ui;
