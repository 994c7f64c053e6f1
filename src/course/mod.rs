//! Course mode: the calculator as teaching material — the settings an instructor writes into an
//! embed link, exercises whose answer key is the estimator itself, and snippets for the places
//! courses live. Pure and natively tested; the UI renders it.
//!
//! Depends on `config` and `estimator`; nothing depends on it but the UI and the CLI.

pub mod exercises;
pub mod settings;
pub mod snippets;
