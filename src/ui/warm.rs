//! The app's module, run once in the compile worker before the page starts it: the analysis the
//! first screen needs, so that its code is compiled there and not on the page's main thread.
//!
//! Why: browsers compile a WebAssembly function the first time it runs (V8's lazy
//! compilation). On the first screen that is ~2,000 functions and ~100 ms of the page's main
//! thread (a Chromium trace's `wasm.CompileLazy`), in the tasks Lighthouse counts as blocking.
//! A compiled module posted from a worker shares its code with the page, what was compiled
//! lazily in the worker included, so running the first screen's analysis there first leaves
//! the page's main thread only the UI's own code to compile (~1,400 functions). Measured: see
//! web/compile-worker.js.
//!
//! web/compile-worker.js sets the page's query as `trainmemWarmQuery` on the worker's global
//! and instantiates the module; its start function (`main` → [`super::mount`]) finds no
//! `window` and comes here. Nothing here touches the DOM, and nothing it computes is kept.

use crate::config::decode_query;
use crate::estimator::{activations, sweep};
use crate::plots::bar::{bar_data, bar_height, draw_bar};
use crate::plots::chart::ChartData;
use crate::plots::scene::draw_scene;
use crate::plots::theme::LIGHT;
use crate::ui::state::gpu_of;
use std::hint::black_box;

/// The worker-global property that holds the page's query string.
const QUERY_PROPERTY: &str = "trainmemWarmQuery";

/// The width the bar and the chart are drawn at here (CSS pixels; any width runs the same code).
const DRAW_WIDTH: u32 = 640;

/// Runs what the first screen computes for the page's configuration, in the order the page
/// shows it: the decided estimate (verdict, ledger) and its bar, drawn into a scene as the page
/// draws it; the textbook's notes; the sequence chart's sweep, drawn likewise. The one-click
/// answers and fixes come next, from the worker itself: it calls the module's `analyse` export
/// and hands their result to the page with the module, and it stays as the page's analysis
/// worker ([`super::analysis`]).
pub fn run() {
    let query = js_sys::Reflect::get(&js_sys::global(), &QUERY_PROPERTY.into()).ok().and_then(|q| q.as_string()).unwrap_or_default();
    let cfg = decode_query(&query).config;
    let decided = crate::estimator::analyse(&cfg).map(|a| a.estimate);
    if let Ok(e) = &decided {
        let bar = bar_data(e, cfg.unit, &gpu_of(&cfg).label());
        let _ = black_box(draw_scene((DRAW_WIDTH, bar_height(&bar, DRAW_WIDTH, &LIGHT)), |root| draw_bar(root, &bar, &LIGHT).is_ok()));
    }
    let _ = black_box(activations::textbook_differences(&cfg));
    let key = sweep::key(sweep::Axis::Seq, &cfg);
    if let Ok(chart) = sweep::run(sweep::Axis::Seq, &key).map(|s| ChartData::from_sweep(s, &key).with_current(&cfg, decided.as_ref().ok()))
    {
        let _ = black_box(draw_scene((DRAW_WIDTH, chart.height(DRAW_WIDTH, &LIGHT)), |root| chart.draw(root, &LIGHT).is_ok()));
    }
}
