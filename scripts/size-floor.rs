//! The size floor of the app's first screen: what the page computes and draws before its first
//! verdict, ledger, bar and chart, with no UI framework around it. `scripts/size-floor.sh`
//! builds it as a crate of its own (this file its `lib.rs`, the repository its path dependency
//! without default features, its Cargo.lock) for the browser as Trunk builds the app: the
//! release profile's settings, the wasm32 flags of `.cargo/config.toml`, wasm-bindgen,
//! `wasm-opt -Oz`. It prints the brotli size beside the app module's: the difference is what
//! Leptos and the panels add.
//!
//! The one export mirrors `src/ui/warm.rs`, the first screen's work as the compile worker runs
//! it: the decided estimate (verdict, ledger), the ledger's formulas in full, the bar drawn into
//! a scene, the textbook's notes and the sequence chart's sweep drawn likewise.

use trainmem::config::decode_query;
use trainmem::estimator::{activations, explain, gpu, sweep};
use trainmem::plots::bar::{bar_data, bar_height, draw_bar};
use trainmem::plots::chart::ChartData;
use trainmem::plots::scene::draw_scene;
use trainmem::plots::theme::LIGHT;

/// The width the bar and the chart are drawn at (CSS pixels; any width runs the same code).
const DRAW_WIDTH: u32 = 640;

/// Runs the first screen for the configuration of `query` (a URL query string of `len` bytes
/// at `ptr`); returns a number that depends on everything computed, so none of it is dropped.
///
/// # Safety
/// `ptr` must point at `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn first_screen(ptr: *const u8, len: usize) -> u64 {
    // SAFETY: the caller passes a readable buffer of `len` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
    let cfg = decode_query(std::str::from_utf8(bytes).unwrap_or_default()).config;
    let mut seen = 0u64;
    let decided = sweep::decided(&cfg);
    if let Ok(e) = &decided {
        let label = gpu::gpu(&cfg.gpu).map_or_else(|| format!("{} GiB", cfg.gpu_gib), |g| g.name.to_string());
        let bar = bar_data(e, cfg.unit, &label);
        let (scene, _) = draw_scene((DRAW_WIDTH, bar_height(&bar, DRAW_WIDTH, &LIGHT)), |root| draw_bar(root, &bar, &LIGHT).is_ok());
        seen += scene.shapes.len() as u64 + e.memory.total as u64;
    }
    if let Ok(e) = explain(&cfg) {
        seen += e.components.iter().map(|r| (r.expr.symbolic().len() + r.expr.substituted().len()) as u64).sum::<u64>();
    }
    seen += activations::textbook_differences(&cfg).len() as u64;
    let key = sweep::key(sweep::Axis::Seq, &cfg);
    if let Ok(chart) = sweep::run(sweep::Axis::Seq, &key).map(|s| ChartData::from_sweep(s, &key).with_current(&cfg, decided.as_ref().ok()))
    {
        let (scene, _) = draw_scene((DRAW_WIDTH, chart.height(DRAW_WIDTH, &LIGHT)), |root| chart.draw(root, &LIGHT).is_ok());
        seen += scene.shapes.len() as u64;
    }
    seen
}
