//! The estimator core: from a [`Config`] to an [`Estimate`] — every byte one GPU holds during a
//! training step, as a ledger of rows that each carry their formula and source.
//!
//! Pure Rust: no web API, no I/O. The web app, the charts and the CLI all read this one ledger.
//! This file is the index: each item lives in the module named beside its re-export.

pub mod activations;
pub mod allocator;
pub mod analyse;
pub mod config;
pub mod cost;
pub mod ctx;
pub mod estimate;
pub mod expr;
pub mod family;
pub mod gpu;
pub mod hf;
pub mod hf_export;
pub mod hf_fields;
pub mod hf_writer;
pub mod ledger;
pub mod loading;
pub mod logs;
pub mod model;
pub mod names;
pub mod optimizer;
pub mod overhead;
pub mod params;
pub mod part;
pub mod plan;
pub mod precision;
pub mod preset_base;
pub mod presets;
pub mod reserve;
pub mod serve;
pub mod serve_config;
pub mod sharding;
pub mod statics;
pub mod step;
pub mod step_stream;
pub mod sweep;
pub mod timeline;
pub mod units;
pub mod validate;

pub use analyse::{analyse, Analysis, Verdict};
pub use config::Config;
pub use estimate::{
    after_forward, allocated_peaks_by_stage, by_category, capacity, estimate, explain, flatten, step_stream, stream_at, with_reserve,
    Estimate, Layout, Memory,
};
pub use step_stream::{after_forward_of, resident_of, step_parts, stream_of, StepParts, StreamAt};
pub use validate::{unmodelled_feature, validate, validate_consistency, EstimateError};
