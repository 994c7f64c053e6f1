//! Framework config files, both ways: `import` reads the files a run already has (torchtune and
//! axolotl and litgpt YAML, torchtitan TOML, DeepSpeed JSON, accelerate YAML, the Trainer's
//! `TrainingArguments` and PEFT's `adapter_config.json`, Megatron-Bridge/NeMo YAML, Megatron-LM
//! command lines) into a [`crate::config::Config`] with a report of every key; `export` writes
//! the keys memory depends on in a framework's own format. The recipe presets (`recipe=`) are
//! data in [`crate::config`]; this module only parses, so the page's first screen never links
//! a parser (`toml`, `yaml_serde`, `shlex` are reached from here alone).
//!
//! This area depends on `config` and `estimator` only. What each key maps to, and what the
//! estimate assumes about it: `docs/frameworks.md`.

mod accelerate;
pub mod api;
mod deepspeed;
mod export;
mod import;
mod megatron;
mod models;
mod report;
mod torchtitan;
mod torchtune;
mod trainer;
mod tree;

pub use export::{export, export_files, ExportFile, ExportFormat};
pub use import::{apply, import, import_with};
pub use report::{Format, ImportError, Imported, KeyReport, Status};
