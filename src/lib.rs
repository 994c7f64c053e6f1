//! trainmem: where GPU memory goes when you train a transformer.
//!
//! Dependencies point one way: `ui → {config, estimator, plots, bench}`, `plots → estimator`,
//! `config → estimator`, and `estimator →` nothing of ours. The estimator never touches a web
//! API; the CLI (native) and the UI (wasm) are thin shells over it.

pub mod bench;
pub mod config;
pub mod estimator;
pub mod plots;
pub mod version;

#[cfg(not(target_arch = "wasm32"))]
pub mod cli;

#[cfg(target_arch = "wasm32")]
pub mod ui;
