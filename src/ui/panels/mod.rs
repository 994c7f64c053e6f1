//! One file per panel. Each reads the store ([`super::state`]) and writes through its typed
//! setters; none imports another (what two panels share lives in `state`, `widgets`, `canvas`
//! or `dom`).

pub mod architecture;
pub mod bar;
pub mod bench;
pub mod charts;
pub mod compare;
pub mod course;
pub mod embed;
pub mod exercise;
pub mod frameworks;
pub mod import;
pub mod inputs;
pub mod ledger;
pub mod notices;
pub mod plan;
pub mod serve;
pub mod textbook;
pub mod toolbar;
pub mod verdict;
pub mod verify;
