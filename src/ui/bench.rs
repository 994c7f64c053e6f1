//! The benchmark's page, compiled into its own wasm module (`src/bin/trainmem-bench.rs`) that
//! the app loads only when the visitor opens the benchmark: WebGPU, wgpu and the kernels cost
//! nothing on first load.
//!
//! It mounts into `#bench-root`, reads the configuration from the address bar (its heads and
//! head dim become the benchmark's shape, its dtype the estimator's prediction), runs the sweep
//! with a progress bar and a cancel button, and shows the table, the log-log fits and the
//! charts — or a shared result from `?bench=`.

use super::canvas_draw;
use super::dom;
use crate::bench::{self, Bench, BenchOptions, Dtype, SharedResult, SweepOptions, SweepResult};
use crate::config::{decode_query, Config};
use crate::estimator::activations::eager_score_bytes;
use crate::estimator::precision::recipe;
use crate::estimator::units::format_bytes;
use crate::plots::bench::{bench_svg, draw_bench, BenchChart, BenchSeries, YUnit};
use leptos::prelude::*;
use std::cell::Cell;
use std::rc::Rc;
use wasm_bindgen::JsCast;

/// Mounts the benchmark page into `#bench-root` (called by the module's `main`).
pub fn mount() {
    console_error_panic_hook::set_once();
    let Some(root) = document().get_element_by_id("bench-root").and_then(|e| e.dyn_into::<web_sys::HtmlElement>().ok()) else { return };
    root.set_inner_html("");
    leptos::mount::mount_to(root, BenchPage).forget();
}

#[derive(Clone)]
enum Device {
    Checking,
    Missing(String),
    Ready(Rc<Bench>),
    Failed(String),
}

/// Whether the browser exposes WebGPU at all.
fn has_webgpu() -> bool {
    js_sys::Reflect::has(&window().navigator(), &"gpu".into()).unwrap_or(false)
}

const NO_WEBGPU: &str = "WebGPU is not available in this browser, so the benchmark cannot run here. \
It is on by default in Chrome and Edge 113+ on Windows, macOS and ChromeOS with a supported GPU; on Linux enable \
chrome://flags/#enable-unsafe-webgpu (or start Chromium with --enable-unsafe-webgpu); in Firefox enable dom.webgpu.enabled; \
Safari 26+ has it. Shared results (links with bench=) still display.";

fn current_config() -> Config {
    decode_query(&dom::search()).config
}

fn shared_from_url() -> Option<Result<SharedResult, String>> {
    let q = dom::search();
    let q = q.strip_prefix('?').unwrap_or(&q);
    let v = q.split('&').find_map(|p| p.strip_prefix("bench="))?;
    Some(bench::decode_compact(&crate::config::percent_decode(v)).map_err(|e| e.to_string()))
}

#[component]
fn BenchPage() -> impl IntoView {
    let cfg = current_config();
    let device = RwSignal::new_local(Device::Checking);
    let result = RwSignal::new_local(None::<SweepResult>);
    let shared = RwSignal::new_local(None::<SharedResult>);
    let message = RwSignal::new(None::<String>);
    let progress = RwSignal::new((0u32, 0u32));
    let running = RwSignal::new(false);
    let cancel: Rc<Cell<bool>> = Rc::new(Cell::new(false));
    let verify_text = RwSignal::new(None::<(bool, String)>);

    // Shape defaults from the user's model (capped to what runs in seconds on most GPUs).
    let heads = RwSignal::new(cfg.arch.heads.clamp(1, 8) as u32);
    let head_dim = RwSignal::new(if cfg.arch.head_dim % 4 == 0 && cfg.arch.head_dim <= 128 { cfg.arch.head_dim as u32 } else { 64 });
    let max_seq = RwSignal::new(4096u32);
    let mem_cap_mib = RwSignal::new(1024u64);
    let budget_s = RwSignal::new(20.0f64);
    let f16 = RwSignal::new(false);

    if let Some(s) = shared_from_url() {
        match s {
            Ok(s) => shared.set(Some(s)),
            Err(e) => message.set(Some(format!("the shared result in this link could not be read: {e}"))),
        }
    }
    if has_webgpu() {
        leptos::task::spawn_local(async move {
            match Bench::new(BenchOptions::default()).await {
                Ok(b) => device.set(Device::Ready(Rc::new(b))),
                Err(e) => device.set(Device::Failed(format!("{e}. {}", NO_WEBGPU))),
            }
        });
    } else {
        device.set(Device::Missing(NO_WEBGPU.to_string()));
    }

    let bench_rc = move || match device.get() {
        Device::Ready(b) => Some(b),
        _ => None,
    };
    let cancel_run = cancel.clone();
    let run = move |_| {
        let Some(b) = bench_rc() else { return };
        let opts = SweepOptions {
            heads: heads.get_untracked(),
            head_dim: head_dim.get_untracked(),
            max_seq: max_seq.get_untracked(),
            mem_cap_bytes: mem_cap_mib.get_untracked() << 20,
            budget_ms: budget_s.get_untracked() * 1000.0,
            dtype: if f16.get_untracked() { Dtype::F16 } else { Dtype::F32 },
            ..SweepOptions::default()
        };
        cancel_run.set(false);
        running.set(true);
        message.set(None);
        let cancel = cancel_run.clone();
        leptos::task::spawn_local(async move {
            let mut on_progress = |p: bench::SweepProgress| progress.set((p.done, p.planned));
            match b.sweep(&opts, &mut on_progress, &cancel).await {
                Ok(r) => {
                    shared.set(Some(SharedResult::from_result(&r)));
                    result.set(Some(r));
                }
                Err(e) => message.set(Some(format!("the benchmark stopped: {e}"))),
            }
            running.set(false);
        });
    };
    let verify = move |_| {
        let Some(b) = bench_rc() else { return };
        running.set(true);
        leptos::task::spawn_local(async move {
            match bench::verify(&b).await {
                Ok(r) => {
                    let lines: Vec<String> = r
                        .cases
                        .iter()
                        .map(|c| {
                            format!(
                                "{} {:?}: scores {:.1e}, materialized {:.1e}, fused {:.1e} (tolerance {:.0e}) {}",
                                c.shape,
                                c.dtype,
                                c.scores_max_abs_err,
                                c.materialized_max_abs_err,
                                c.fused_max_abs_err,
                                c.tolerance,
                                if c.passed { "✓" } else { "✗" }
                            )
                        })
                        .collect();
                    verify_text.set(Some((r.passed, lines.join("\n"))));
                }
                Err(e) => verify_text.set(Some((false, e.to_string()))),
            }
            running.set(false);
        });
    };
    let cancel_btn = cancel.clone();

    view! {
        <div class="bench-page" data-testid="bench-page">
            {move || match device.get() {
                Device::Checking => view! { <p role="status">"Looking for a WebGPU adapter…"</p> }.into_any(),
                Device::Missing(m) | Device::Failed(m) => view! { <p class="notice" role="alert" data-testid="bench-unavailable">{m}</p> }.into_any(),
                Device::Ready(b) => {
                    let i = b.info().clone();
                    view! {
                        <dl class="stats" data-testid="bench-adapter">
                            <div><dt>"Adapter"</dt><dd>{if i.name.is_empty() { "(name hidden by the browser)".to_string() } else { i.name.clone() }}</dd></div>
                            <div><dt>"Backend / type"</dt><dd>{format!("{} / {}", i.backend, i.device_type)}</dd></div>
                            <div><dt>"Largest buffer"</dt><dd>{format_bytes(i.limits.max_buffer_size as u128, crate::config::Unit::Gib)}</dd></div>
                            <div><dt>"Largest storage binding"</dt><dd>{format_bytes(i.limits.max_storage_buffer_binding_size as u128, crate::config::Unit::Gib)}</dd></div>
                            <div><dt>"Timing"</dt><dd>{if i.timestamps { "GPU timestamps" } else { "wall clock (no timestamp queries)" }}</dd></div>
                            <div><dt>"f16"</dt><dd>{if i.f16 { "available" } else { "not available" }}</dd></div>
                        </dl>
                    }
                    .into_any()
                }
            }}
            <form class="grid bench-controls" on:submit=|ev| ev.prevent_default() aria-label="Benchmark settings">
                <div class="field"><label for="b-heads">"Heads"</label>
                    <input id="b-heads" type="number" min="1" max="64" prop:value=move || heads.get() on:input=move |ev| { if let Ok(v) = event_target_value(&ev).parse::<u32>() { heads.set(v.clamp(1, 64)) } }/></div>
                <div class="field"><label for="b-hd">"Head dim"</label>
                    <select id="b-hd" prop:value=move || head_dim.get().to_string() on:change=move |ev| { if let Ok(v) = event_target_value(&ev).parse::<u32>() { head_dim.set(v) } }>
                        <option value="64">"64"</option><option value="128">"128"</option><option value="32">"32"</option>
                    </select></div>
                <div class="field"><label for="b-max">"Longest sequence"</label>
                    <input id="b-max" type="number" min="256" prop:value=move || max_seq.get() on:input=move |ev| { if let Ok(v) = event_target_value(&ev).parse::<u32>() { max_seq.set(v.max(256)) } }/></div>
                <div class="field"><label for="b-cap">"Memory cap (MiB)"</label>
                    <input id="b-cap" type="number" min="16" prop:value=move || mem_cap_mib.get() on:input=move |ev| { if let Ok(v) = event_target_value(&ev).parse::<u64>() { mem_cap_mib.set(v.max(16)) } }/></div>
                <div class="field"><label for="b-budget">"Time budget (s)"</label>
                    <input id="b-budget" type="number" min="1" prop:value=move || budget_s.get() on:input=move |ev| { if let Ok(v) = event_target_value(&ev).parse::<f64>() { budget_s.set(v.max(1.0)) } }/></div>
                <div class="field check"><label for="b-f16">"f16 (where supported)"</label>
                    <input id="b-f16" type="checkbox" prop:checked=move || f16.get() on:change=move |ev| f16.set(event_target_checked(&ev))/></div>
            </form>
            <div class="row">
                <button type="button" class="primary" data-testid="bench-run" disabled=move || running.get() || bench_rc().is_none() on:click=run>"Run the benchmark"</button>
                <button type="button" data-testid="bench-cancel" disabled=move || !running.get() on:click=move |_| cancel_btn.set(true)>"Cancel"</button>
                <button type="button" data-testid="bench-verify" disabled=move || running.get() || bench_rc().is_none() on:click=verify>"Check the kernels against the CPU"</button>
                <progress data-testid="bench-progress" max=move || progress.get().1.max(1) prop:value=move || progress.get().0 aria-label="Benchmark progress"></progress>
                <span role="status">{move || { let (d, p) = progress.get(); if running.get() && p > 0 { format!("{d} of {p} points") } else { String::new() } }}</span>
            </div>
            {move || message.get().map(|m| view! { <p class="notice" role="alert" data-testid="bench-error">{m}</p> })}
            {move || verify_text.get().map(|(ok, t)| view! {
                <pre class="verify" data-testid="bench-verify-result" data-passed=ok.to_string()>{format!("{}\n{t}", if ok { "Both kernels match the CPU reference." } else { "Mismatch against the CPU reference:" })}</pre>
            })}
            {move || shared.get().map(|s| view! { <BenchResults shared=s full=result.get()/> })}
        </div>
    }
}

/// The table, fits, charts, share link and CSV of one result.
#[component]
fn BenchResults(shared: SharedResult, full: Option<SweepResult>) -> impl IntoView {
    let cfg = current_config();
    let slopes = shared.slopes();
    let fmt = |x: Option<f64>| x.map_or("—".to_string(), |v| format!("{v:.2}"));
    let elem = if shared.dtype == Dtype::F16 { 2u64 } else { 4u64 };
    let p = recipe(cfg.precision).compute.bytes();
    let predicted: Vec<(f64, f64)> = shared
        .points
        .iter()
        .map(|pt| (pt.seq as f64, eager_score_bytes(shared.batch as u64, shared.heads as u64, pt.seq as u64, p) as f64))
        .collect();
    let series = |fused: bool, time: bool| -> Vec<(f64, f64)> {
        shared
            .points
            .iter()
            .filter_map(|pt| {
                let t = if fused { pt.fused.as_ref() } else { pt.materialized.as_ref() }?;
                Some((pt.seq as f64, if time { t.ms() } else { t.bytes as f64 }))
            })
            .collect()
    };
    let time_chart = BenchChart {
        title: "Time per attention pass".into(),
        y_title: "median time (log scale)".into(),
        series: vec![
            BenchSeries { label: "materialized (eager)".into(), points: series(false, true) },
            BenchSeries { label: "fused (flash-style)".into(), points: series(true, true) },
        ],
        predicted: None,
        y_unit: YUnit::Milliseconds,
    };
    let mem_chart = BenchChart {
        title: "Memory allocated".into(),
        y_title: "bytes (log scale)".into(),
        series: vec![
            BenchSeries { label: "materialized (eager)".into(), points: series(false, false) },
            BenchSeries { label: "fused (flash-style)".into(), points: series(true, false) },
        ],
        predicted: Some(BenchSeries {
            label: format!("estimator: eager scores kept for backward, {} heads", shared.heads),
            points: predicted,
        }),
        y_unit: YUnit::Bytes,
    };
    let largest = full
        .as_ref()
        .and_then(|r| r.largest_materialized_seq)
        .or_else(|| shared.points.iter().filter(|p| p.materialized.is_some()).map(|p| p.seq).max());
    let limit = full.as_ref().map(|r| r.materializable_seq_limit);
    let meaning = {
        let per_layer = eager_score_bytes(cfg.batch, cfg.arch.heads, cfg.seq, p);
        let layers = cfg.arch.layers as u128;
        format!(
            "For your configuration ({}, {} tokens, micro-batch {}), eager attention keeps {} of scores per layer — {} over {} layers — the s² term this benchmark makes visible; SDPA/FlashAttention keep none of it.",
            cfg.display_name(),
            cfg.seq,
            cfg.batch,
            format_bytes(per_layer, cfg.unit),
            format_bytes(per_layer * layers, cfg.unit),
            layers
        )
    };
    let rows = shared
        .points
        .iter()
        .map(|pt| {
            let score = pt.seq as u128 * pt.seq as u128 * shared.heads as u128 * shared.batch as u128 * elem as u128;
            let cell = |t: Option<&bench::SharedTiming>| t.map_or(("—".to_string(), "—".to_string()), |t| (format!("{:.3}", t.ms()), format_bytes(t.bytes as u128, crate::config::Unit::Gib)));
            let (mt, mb) = cell(pt.materialized.as_ref());
            let (ft, fb) = cell(pt.fused.as_ref());
            view! { <tr><td class="num">{pt.seq}</td><td class="num">{format_bytes(score, crate::config::Unit::Gib)}</td><td class="num">{mt}</td><td class="num">{mb}</td><td class="num">{ft}</td><td class="num">{fb}</td></tr> }
        })
        .collect_view();
    let link = match full.as_ref().map(bench::encode_compact) {
        None => format!("{}{}", dom::base_url(), dom::search()),
        Some(value) => {
            let q = dom::search();
            let q = q.strip_prefix('?').unwrap_or(&q);
            let rest: Vec<&str> = q.split('&').filter(|p| !p.is_empty() && !p.starts_with("bench=")).collect();
            let mut query = rest.join("&");
            if !query.is_empty() {
                query.push('&');
            }
            format!("{}?{query}bench={}", dom::base_url(), value)
        }
    };
    let csv = full.as_ref().map(SweepResult::to_csv);
    let mem_svg = bench_svg(&mem_chart, &crate::plots::LIGHT, (720, 360));
    let copy_fraction = full.as_ref().and_then(|r| {
        let fr: Vec<f64> = r.points.iter().filter_map(|p| p.materialized.as_ref().and_then(|m| m.fraction_of_copy)).collect();
        (!fr.is_empty()).then(|| fr.iter().cloned().fold(0.0, f64::max))
    });
    view! {
        <section class="bench-results" data-testid="bench-results" aria-label="Benchmark results">
            <h3>{format!("{} — {} × {} heads × head dim {}, {:?}", if shared.adapter.is_empty() { "this GPU".to_string() } else { shared.adapter.clone() }, shared.batch, shared.heads, shared.head_dim, shared.dtype)}</h3>
            <dl class="stats" data-testid="bench-slopes">
                <div><dt>"Materialized: time ∝ sᵏ"</dt><dd data-testid="slope-mat-time">{fmt(slopes.materialized.time)}</dd></div>
                <div><dt>"Materialized: memory ∝ sᵏ"</dt><dd data-testid="slope-mat-mem">{fmt(slopes.materialized.memory)}</dd></div>
                <div><dt>"Score matrix alone"</dt><dd data-testid="slope-scores">{fmt(slopes.scores_memory)}</dd></div>
                <div><dt>"Fused: time ∝ sᵏ"</dt><dd data-testid="slope-fused-time">{fmt(slopes.fused.time)}</dd></div>
                <div><dt>"Fused: memory ∝ sᵏ"</dt><dd data-testid="slope-fused-mem">{fmt(slopes.fused.memory)}</dd></div>
                <div><dt>"Largest s materialized"</dt><dd data-testid="bench-largest">{largest.map_or("—".to_string(), |s| s.to_string())}{limit.map(|l| view! { <span class="sub">{format!("device limit for this shape: {l}")}</span> })}</dd></div>
                {copy_fraction.map(|f| view! { <div><dt>"Best fraction of copy bandwidth"</dt><dd>{format!("{:.0} %", f * 100.0)}</dd></div> })}
            </dl>
            <p>{meaning}</p>
            <div class="bench-charts">
                {canvas_draw::canvas(Rc::new(move |root, theme| { let _ = draw_bench(root, &time_chart, theme); }), 320, "bench-time-chart", "Log-log time against sequence length for both kernels")}
                {canvas_draw::canvas(Rc::new(move |root, theme| { let _ = draw_bench(root, &mem_chart, theme); }), 320, "bench-memory-chart", "Log-log memory against sequence length for both kernels, with the estimator's prediction")}
            </div>
            <div class="scroll"><table class="bench-table">
                <thead><tr><th scope="col">"s"</th><th scope="col">"S bytes"</th><th scope="col">"materialized ms"</th><th scope="col">"materialized bytes"</th><th scope="col">"fused ms"</th><th scope="col">"fused bytes"</th></tr></thead>
                <tbody>{rows}</tbody>
            </table></div>
            <div class="row">
                <a href=link.clone() data-testid="bench-share-link">"Link to these results"</a>
                <button type="button" on:click=move |_| { let l = link.clone(); leptos::task::spawn_local(async move { dom::copy_text(&l).await; }); }>"Copy link"</button>
                {csv.map(|c| view! { <button type="button" data-testid="bench-csv" on:click=move |_| dom::download("trainmem-bench.csv", "text/csv", c.as_bytes())>"Download CSV"</button> })}
                <button type="button" data-testid="bench-svg" on:click=move |_| dom::download("trainmem-bench-memory.svg", "image/svg+xml", mem_svg.as_bytes())>"Download memory chart (SVG)"</button>
            </div>
            <p class="hint">"The estimator's dashed line is what transformers' eager attention keeps for these shapes in the compute dtype of your precision setting (fp32 softmax plus its cast); the benchmark's materialized path allocates one score matrix in its own dtype, plus Q, K, V and O."</p>
        </section>
    }
}
