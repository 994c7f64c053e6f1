//! trainmem: where GPU memory goes when you train a transformer.
//!
//! Dependencies point one way: `ui → {answers, course, verify, config, estimator, plots, bench}`,
//! `answers → {config, estimator}`, `course → {config, estimator}`, `verify → {config, estimator}`, `plots → estimator`,
//! `frameworks → {config, estimator}`, `config → estimator`, and `estimator →` nothing of ours. The estimator never touches a web
//! API; the CLI (native) and the UI (wasm) are thin shells over it.

pub mod answers;
pub mod bench;
pub mod config;
pub mod course;
pub mod estimator;
pub mod frameworks;
pub mod plots;
pub mod verify;
pub mod version;

#[cfg(not(target_arch = "wasm32"))]
pub mod cli;

#[cfg(all(target_arch = "wasm32", feature = "app"))]
pub mod ui;
