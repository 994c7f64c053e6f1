//! Course mode: the calculator as teaching material — the settings an instructor writes into an
//! embed link, exercises whose answer key is the estimator itself, and snippets for the places
//! courses live. Pure and natively tested; the UI renders it.
//!
//! Depends on `config`, `estimator` and `plots` (a chart's kind names its panel); nothing
//! depends on it but the UI and the CLI.

pub mod exercises;
pub mod layout;
pub mod panel;
pub mod settings;
pub mod snippets;
