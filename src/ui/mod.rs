//! The web app (Leptos, client-side rendered), one wasm module.
//!
//! - [`state`]: the one store, derived from one `Config`; the URL, theme and unit sync; the
//!   typed setters every panel writes through.
//! - [`layout`]: which panels a page shows, in what order (the full page, an embed).
//! - [`panels`]: one file per panel; each reads the store and writes through its setters.
//! - [`app`]: mounts the store and lays the panels out.
//! - Shared by panels: `widgets` (the key input), `canvas` (hi-DPI chart canvases), `dom`
//!   (browser calls), `bench_client` (the lazily loaded benchmark module's typed API),
//!   `analysis` (the answers, from the analysis worker where there is one), `frameworks_client`
//!   (the lazily loaded frameworks module's typed API and the export buttons).
//! - [`warm`]: the first screen's analysis, run in the compile worker so that its code is
//!   compiled there, off the page's main thread.
//!
//! Imports run one way: `app → panels → {state, widgets, canvas, bench_client, analysis} → dom`, and
//! everything here → `config`, `estimator`, `plots`, `bench` (its plain data).

mod analysis;
pub mod app;
mod bench_client;
mod canvas;
mod dom;
mod frameworks_client;
mod html;
pub mod layout;
mod lazy;
pub mod more;
pub mod panels;
pub mod state;
mod warm;
mod widgets;

pub use app::mount;
