//! The benchmark panel: attention on the visitor's own GPU. The GPU work runs in the benchmark
//! module (its own wasm, fetched only when the visitor opens the panel; see
//! [`crate::ui::bench_client`]); this panel holds the settings, the progress, and the results:
//! the fitted slopes, the log-log charts with the estimator's prediction, the table, the share
//! link and the CSV. A shared result (`?bench=`) shows without loading the module.
//!
//! Most visitors never open it, so it is built to cost little wasm: the settings are a static
//! form read when a run starts; everything else is one HTML text ([`crate::ui::html`]) rebuilt
//! from the panel's state after each event of the module, its buttons answer through one
//! delegated click handler (`data-action`), and its two charts are painted after each rebuild.
//!
//! The panel's page lives in the lazily loaded module ([`crate::ui::lazy`]): the page holds the
//! heading, the settings and the button that opens the benchmark ([`Bench`]); pressing it loads
//! the module, whose [`Page`] then loads the benchmark's own. A shared result (`bench=`) or an
//! embed of the benchmark loads it at once.

use crate::bench::api::{Adapter, Event, Finished};
use crate::bench::{decode_compact, Dtype, SharedResult, SharedTiming, SweepOptions};
use crate::config::{encode_query, percent_encode, Config, Unit};
use crate::estimator::activations::eager_score_bytes;
use crate::estimator::precision::recipe;
use crate::estimator::units::format_bytes;
use crate::plots::bench::{bench_height, bench_svg, draw_bench, BenchChart, BenchSeries, YUnit};
use crate::plots::LIGHT;
use crate::ui::bench_client::BenchModule;
use crate::ui::canvas::draw_on;
use crate::ui::dom;
use crate::ui::html::{esc, stat};
use crate::ui::lazy::{use_more, Lazy, Slot};
use crate::ui::state::{use_store, Store};
use leptos::html::Div;
use leptos::prelude::*;
use wasm_bindgen::JsCast;

/// Where the module stands.
#[derive(Clone, Default)]
enum Device {
    #[default]
    Closed,
    Loading,
    Ready(Adapter),
    /// No WebGPU, no adapter, or the module could not be loaded: what to say.
    Unavailable(String),
}

/// Everything the panel shows.
#[derive(Default)]
struct Panel {
    device: Device,
    module: Option<BenchModule>,
    running: bool,
    progress: (u32, u32),
    message: Option<String>,
    verified: Option<(bool, String)>,
    finished: Option<Finished>,
    shared: Option<SharedResult>,
}

/// The value of an input of the settings form.
fn setting(id: &str) -> String {
    let el = document().get_element_by_id(id);
    if let Some(i) = el.as_ref().and_then(|e| e.dyn_ref::<web_sys::HtmlInputElement>()) {
        return if i.type_() == "checkbox" { i.checked().to_string() } else { i.value() };
    }
    el.and_then(|e| e.dyn_into::<web_sys::HtmlSelectElement>().ok()).map_or_else(String::new, |s| s.value())
}

/// The sweep the settings ask for.
fn options() -> SweepOptions {
    let num = |id: &str, default: f64| setting(id).trim().parse::<f64>().ok().filter(|v| v.is_finite()).unwrap_or(default);
    SweepOptions {
        heads: num("b-heads", 8.0).clamp(1.0, 64.0) as u32,
        head_dim: num("b-hd", 64.0) as u32,
        max_seq: num("b-max", 4096.0).max(256.0) as u32,
        mem_cap_bytes: (num("b-cap", 1024.0).max(16.0) * if setting("b-cap-unit") == "mib" { 1_048_576.0 } else { 1e6 }) as u64,
        budget_ms: num("b-budget", 20.0).max(1.0) * 1000.0,
        dtype: if setting("b-f16") == "true" { Dtype::F16 } else { Dtype::F32 },
        ..SweepOptions::default()
    }
}

fn button(action: &str, testid: &str, text: &str, enabled: bool, primary: bool) -> String {
    format!(
        "<button type=\"button\"{} data-action=\"{action}\" data-testid=\"{testid}\"{}>{text}</button>",
        if primary { " class=\"primary\"" } else { "" },
        if enabled { "" } else { " disabled" }
    )
}

/// The panel's changing part, as HTML.
fn render(p: &Panel, cfg: &Config) -> String {
    let mut s = String::new();
    match &p.device {
        Device::Closed => s.push_str(&button("open", "bench-open", "Open the benchmark", true, true)),
        Device::Loading => s.push_str("<p role=\"status\">Loading the benchmark…</p>"),
        Device::Unavailable(m) => {
            s.push_str(&format!("<p class=\"notice\" role=\"alert\" data-testid=\"bench-unavailable\">{}</p>", esc(m)))
        }
        Device::Ready(a) => {
            if a.device_type.eq_ignore_ascii_case("cpu") {
                s.push_str(
                    "<p class=\"notice\" data-testid=\"bench-software\">This adapter is a software renderer (device type: cpu — SwiftShader or llvmpipe): its timings say how fast your processor emulates a GPU, nothing about a GPU. The memory it allocates still shows the s² term.</p>",
                );
            }
            s.push_str("<dl class=\"stats\" data-testid=\"bench-adapter\">");
            let bytes = |b: u64| format_bytes(b as u128, cfg.unit);
            stat(&mut s, "Adapter", "", &esc(if a.name.is_empty() { "(name hidden by the browser)" } else { &a.name }));
            stat(&mut s, "Backend / type", "", &esc(&format!("{} / {}", a.backend, a.device_type)));
            stat(&mut s, "Largest buffer", "", &bytes(a.max_buffer_size));
            stat(&mut s, "Largest storage binding", "", &bytes(a.max_storage_buffer_binding_size));
            stat(&mut s, "Timing", "", if a.timestamps { "GPU timestamps" } else { "wall clock (no timestamp queries)" });
            stat(&mut s, "f16", "", if a.f16 { "available" } else { "not available" });
            s.push_str("</dl>");
        }
    }
    let ready = matches!(p.device, Device::Ready(_));
    let (done, planned) = p.progress;
    if matches!(p.device, Device::Closed) && p.shared.is_none() {
        return s;
    }
    s.push_str(&format!(
        "<div class=\"row\">{}{}{}<progress data-testid=\"bench-progress\" max=\"{}\" value=\"{done}\" aria-label=\"Benchmark progress\"></progress><span role=\"status\" data-testid=\"bench-status\">{}</span></div>",
        button("run", "bench-run", "Run the benchmark", ready && !p.running, true),
        button("cancel", "bench-cancel", "Cancel", p.running, false),
        button("verify", "bench-verify", "Check the kernels against the CPU", ready && !p.running, false),
        planned.max(1),
        if p.running && planned > 0 { format!("{done} of {planned} points") } else { String::new() }
    ));
    if let Some(m) = &p.message {
        s.push_str(&format!("<p class=\"notice\" role=\"alert\" data-testid=\"bench-error\">{}</p>", esc(m)));
    }
    if let Some((ok, t)) = &p.verified {
        s.push_str(&format!(
            "<pre class=\"verify\" data-testid=\"bench-verify-result\" data-passed=\"{ok}\">{}\n{}</pre>",
            if *ok { "Both kernels match the CPU reference." } else { "Mismatch against the CPU reference:" },
            esc(t)
        ));
    }
    if let Some(shared) = &p.shared {
        results(&mut s, shared, p.finished.as_ref(), cfg);
    }
    s
}

fn series(s: &SharedResult, fused: bool, time: bool) -> Vec<(f64, f64)> {
    s.points
        .iter()
        .filter_map(|p| {
            let t: &SharedTiming = if fused { p.fused.as_ref() } else { p.materialized.as_ref() }?;
            Some((p.seq as f64, if time { t.ms() } else { t.bytes as f64 }))
        })
        .collect()
}

/// The benchmark's two charts: time, and memory with the estimator's prediction.
fn charts(shared: &SharedResult, cfg: &Config) -> [BenchChart; 2] {
    let chart = |title: &str, y_title: &str, time: bool, predicted: Option<BenchSeries>| BenchChart {
        title: title.into(),
        y_title: y_title.into(),
        series: vec![
            BenchSeries { label: "materialized (eager)".into(), points: series(shared, false, time) },
            BenchSeries { label: "fused (flash-style)".into(), points: series(shared, true, time) },
        ],
        predicted,
        y_unit: match (time, cfg.unit) {
            (true, _) => YUnit::Milliseconds,
            (false, Unit::Gb) => YUnit::Bytes,
            (false, Unit::Gib) => YUnit::BinaryBytes,
        },
    };
    let p = recipe(cfg.precision).compute.bytes();
    let predicted = shared
        .points
        .iter()
        .map(|pt| (pt.seq as f64, eager_score_bytes(shared.batch as u64, shared.heads as u64, pt.seq as u64, p) as f64))
        .collect();
    let prediction = BenchSeries { label: format!("estimator: eager scores kept for backward, {} heads", shared.heads), points: predicted };
    [
        chart("Time per attention pass", "median time (log scale)", true, None),
        chart("Memory allocated", "bytes (log scale)", false, Some(prediction)),
    ]
}

/// The link that reopens these results.
fn share_link(shared: &SharedResult, cfg: &Config) -> String {
    let q = encode_query(cfg);
    format!("{}?{}bench={}", dom::base_url(), if q.is_empty() { String::new() } else { format!("{q}&") }, percent_encode(&shared.encode()))
}

/// One result: the heading, slopes and what they mean, the charts' canvases, the table, the
/// share link and the exports.
fn results(s: &mut String, shared: &SharedResult, full: Option<&Finished>, cfg: &Config) {
    let slopes = shared.slopes();
    let fmt = |x: Option<f64>| x.map_or("—".to_string(), |v| format!("{v:.2}"));
    let adapter = if shared.adapter.is_empty() { "this GPU" } else { &shared.adapter };
    s.push_str(&format!(
        "<section class=\"bench-results\" data-testid=\"bench-results\" aria-label=\"Benchmark results\"><h3>{} — {} × {} heads × head dim {}, {}</h3><dl class=\"stats\" data-testid=\"bench-slopes\">",
        esc(adapter),
        shared.batch,
        shared.heads,
        shared.head_dim,
        shared.dtype.name()
    ));
    stat(s, "Materialized: time ∝ sᵏ", "data-testid=\"slope-mat-time\"", &fmt(slopes.materialized.time));
    stat(s, "Materialized: memory ∝ sᵏ", "data-testid=\"slope-mat-mem\"", &fmt(slopes.materialized.memory));
    stat(s, "Score matrix alone", "data-testid=\"slope-scores\"", &fmt(slopes.scores_memory));
    stat(s, "Fused: time ∝ sᵏ", "data-testid=\"slope-fused-time\"", &fmt(slopes.fused.time));
    stat(s, "Fused: memory ∝ sᵏ", "data-testid=\"slope-fused-mem\"", &fmt(slopes.fused.memory));
    let largest = full
        .and_then(|r| r.largest_materialized_seq)
        .or_else(|| shared.points.iter().filter(|p| p.materialized.is_some()).map(|p| p.seq).max());
    let limit =
        full.map_or(String::new(), |r| format!("<span class=\"sub\">device limit for this shape: {}</span>", r.materializable_seq_limit));
    stat(
        s,
        "Largest s materialized",
        "data-testid=\"bench-largest\"",
        &format!("{}{limit}", largest.map_or("—".to_string(), |v| v.to_string())),
    );
    if let Some(f) = full.and_then(|f| f.best_fraction_of_copy) {
        stat(s, "Best fraction of copy bandwidth", "", &format!("{:.0} %", f * 100.0));
    }
    if let Some(f) = full {
        stat(s, "Stopped at", &format!("data-testid=\"bench-stop\" data-stop=\"{}\"", f.stop.name()), f.stop.label());
    }
    let p = recipe(cfg.precision).compute.bytes();
    let per_layer = eager_score_bytes(cfg.batch, cfg.arch.heads, cfg.seq, p);
    s.push_str(&format!(
        "</dl><p>For your configuration ({}, {} tokens, micro-batch {}), eager attention keeps {} of scores per layer — {} over {} layers — the s² term this benchmark makes visible; SDPA/FlashAttention keep none of it.</p>\
         <div class=\"bench-charts\"><canvas class=\"chart\" role=\"img\" data-testid=\"bench-time-chart\" aria-label=\"Log-log time against sequence length for both kernels\"></canvas>\
         <canvas class=\"chart\" role=\"img\" data-testid=\"bench-memory-chart\" aria-label=\"Log-log memory against sequence length for both kernels, with the estimator's prediction\"></canvas></div>\
         <div class=\"scroll\"><table class=\"bench-table\"><thead><tr><th scope=\"col\">s</th><th scope=\"col\">S bytes</th><th scope=\"col\">materialized ms</th><th scope=\"col\">materialized bytes</th><th scope=\"col\">fused ms</th><th scope=\"col\">fused bytes</th></tr></thead><tbody>",
        esc(&cfg.display_name()),
        cfg.seq,
        cfg.batch,
        format_bytes(per_layer, cfg.unit),
        format_bytes(per_layer * cfg.arch.layers as u128, cfg.unit),
        cfg.arch.layers
    ));
    let elem = shared.dtype.bytes() as u128;
    for pt in &shared.points {
        let score = pt.seq as u128 * pt.seq as u128 * shared.heads as u128 * shared.batch as u128 * elem;
        let cell = |t: Option<&SharedTiming>| {
            t.map_or("<td>—</td><td>—</td>".to_string(), |t| {
                format!("<td>{:.3}</td><td>{}</td>", t.ms(), format_bytes(t.bytes as u128, cfg.unit))
            })
        };
        s.push_str(&format!(
            "<tr><td>{}</td><td>{}</td>{}{}</tr>",
            pt.seq,
            format_bytes(score, cfg.unit),
            cell(pt.materialized.as_ref()),
            cell(pt.fused.as_ref())
        ));
    }
    s.push_str(&format!(
        "</tbody></table></div><div class=\"row\"><a href=\"{}\" data-testid=\"bench-share-link\">Link to these results</a>{}{}{}</div>\
         <p class=\"hint\">The estimator's dashed line is what transformers' eager attention keeps for these shapes in the compute dtype of your precision setting (fp32 softmax plus its cast); the benchmark's materialized path allocates one score matrix in its own dtype, plus Q, K, V and O.</p></section>",
        esc(&share_link(shared, cfg)),
        button("copy", "bench-copy", "Copy link", true, false),
        if full.is_some() { button("csv", "bench-csv", "Download CSV", true, false) } else { String::new() },
        button("svg", "bench-svg", "Download memory chart (SVG)", true, false)
    ));
}

/// The page's side: the heading, the settings (read when a run starts) and the button that
/// opens the benchmark; then its page, from the lazily loaded module.
#[component]
pub fn Bench() -> impl IntoView {
    let store = use_store();
    let more = use_more();
    let unit = Memo::new(move |_| store.config.with(|c| c.unit));
    // The shape from the user's model, capped to what runs in seconds on most GPUs.
    let cfg = store.config.get_untracked();
    let heads = cfg.arch.heads.clamp(1, 8).to_string();
    let hd = if cfg.arch.head_dim.is_multiple_of(4) && cfg.arch.head_dim <= 128 { cfg.arch.head_dim } else { 64 };
    let hd_options = [64u64, 128, 32].map(|d| view! { <option value=d.to_string() selected=d == hd>{d.to_string()}</option> });
    // An embed of the benchmark opens it at once; a shared result shows without the GPU.
    let embedded = store.embed && store.view.get_untracked() == "bench";
    let shared = !store.bench.with_untracked(String::is_empty);
    let options = Callback::new(move |_| if embedded || more.requested(Lazy::Bench) { "open" } else { "" });
    view! {
        <section class="bench" aria-labelledby="bench-h" data-testid="bench-panel" data-panel="bench">
            <h2 id="bench-h">"Attention on your own GPU (WebGPU benchmark)"</h2>
            <p class="hint">"Times eager-style attention, which writes the whole b·a·s² score matrix to memory, against a fused FlashAttention-style kernel that never stores it, over growing sequence lengths — so you can watch the quadratic term the ledger predicts. The benchmark is loaded only when you open it."</p>
            <form class="grid bench-controls" on:submit=|ev| ev.prevent_default() aria-label="Benchmark settings">
                <div class="field"><label for="b-heads">"Heads"</label><input id="b-heads" type="number" min="1" max="64" value=heads/></div>
                <div class="field"><label for="b-hd">"Head dim"</label><select id="b-hd">{hd_options}</select></div>
                <div class="field"><label for="b-max">"Longest sequence (tokens)"</label><input id="b-max" type="number" min="256" value="4096"/></div>
                <div class="field"><label for="b-cap">{move || if unit.get() == Unit::Gib { "Memory cap (MiB)" } else { "Memory cap (MB)" }}</label><input id="b-cap" type="number" min="16" value="1024"/>
                    <input type="hidden" id="b-cap-unit" prop:value=move || if unit.get() == Unit::Gib { "mib" } else { "mb" }/></div>
                <div class="field"><label for="b-budget">"Time budget (s)"</label><input id="b-budget" type="number" min="1" value="20"/></div>
                <div class="field check"><label for="b-f16">"f16 (where supported)"</label><input id="b-f16" type="checkbox"/></div>
            </form>
            <div class="bench-page" data-testid="bench-page">
                <Slot panel=Lazy::Bench open=embedded || shared options=options>
                    <button type="button" class="primary" data-testid="bench-open" on:click=move |_| more.request(Lazy::Bench)>"Open the benchmark"</button>
                </Slot>
            </div>
        </section>
    }
}

/// The benchmark's page (in the lazily loaded module): the device, the progress, the results.
/// `open`: open the benchmark at once (its button on the page was pressed, or an embed shows it).
#[component]
pub fn Page(open: bool) -> impl IntoView {
    let store = use_store();
    let state = StoredValue::new_local(Panel::default());
    let root = NodeRef::<Div>::new();
    let link_value = store.bench.get_untracked();
    if !link_value.is_empty() {
        state.update_value(|p| match decode_compact(&crate::config::percent_decode(&link_value)) {
            Ok(s) => p.shared = Some(s),
            Err(e) => p.message = Some(format!("the shared result in this link could not be read: {e}")),
        });
    }
    let refresh = move || {
        let Some(el) = root.get_untracked() else { return };
        let cfg = store.config.get_untracked();
        state.with_value(|p| el.set_inner_html(&render(p, &cfg)));
        // The charts: painted once their canvases are in place.
        let drawn = state.with_value(|p| p.shared.as_ref().map(|s| charts(s, &cfg)));
        if let Some(cs) = drawn {
            let theme = store.look().chart_theme();
            for (chart, id) in cs.into_iter().zip(["bench-time-chart", "bench-memory-chart"]) {
                if let Some(c) = el
                    .query_selector(&format!("[data-testid={id}]"))
                    .ok()
                    .flatten()
                    .and_then(|c| c.dyn_into::<web_sys::HtmlCanvasElement>().ok())
                {
                    draw_on(&c, c.client_width().max(0) as u32, &theme, &|root, t| draw_bench(root, &chart, t).ok(), &|w, t| {
                        bench_height(&chart, w, t)
                    });
                }
            }
        }
    };
    // The unit alone (a change of any other key leaves the results as they are).
    let unit = Memo::new(move |_| store.config.with(|c| c.unit));
    Effect::new(move |_| {
        // Once mounted, and again when the theme changes (the charts' colours) or the unit (every
        // figure follows the page's GB or GiB).
        store.look();
        unit.get();
        refresh();
    });
    let on_event = move |e: Event| {
        state.update_value(|p| match e {
            Event::Ready(a) => p.device = Device::Ready(a),
            Event::Unavailable(m) => p.device = Device::Unavailable(m),
            Event::Progress { done, planned } => p.progress = (done, planned),
            Event::Finished(f) => {
                p.running = false;
                match decode_compact(&f.shared) {
                    Ok(s) => p.shared = Some(s),
                    Err(e) => p.message = Some(e.to_string()),
                }
                p.finished = Some(f);
            }
            Event::Verified { passed, report } => {
                p.running = false;
                p.verified = Some((passed, report));
            }
            Event::Failed(m) => {
                p.running = false;
                p.message = Some(m);
            }
        });
        refresh();
    };
    let open_now = move || {
        state.update_value(|p| p.device = Device::Loading);
        refresh();
        leptos::task::spawn_local(async move {
            match BenchModule::load(on_event).await {
                Ok(m) => state.update_value(|p| p.module = Some(m)),
                Err(e) => {
                    state.update_value(|p| p.device = Device::Unavailable(format!("The benchmark module could not be loaded: {e}")));
                    refresh();
                }
            }
        });
    };
    if open {
        open_now();
    }
    let on_click = move |ev: leptos::ev::MouseEvent| {
        let action = ev.target().and_then(|t| t.dyn_into::<web_sys::Element>().ok()).and_then(|e| e.get_attribute("data-action"));
        act(store, state, action.as_deref().unwrap_or(""), &open_now, &refresh);
    };
    view! { <div node_ref=root on:click=on_click></div> }
}

/// What a button of the panel does.
fn act(store: Store, state: StoredValue<Panel, LocalStorage>, action: &str, open: &dyn Fn(), refresh: &dyn Fn()) {
    let call = |f: &dyn Fn(&BenchModule) -> Result<(), String>, busy: bool| {
        let r = state.with_value(|p| p.module.as_ref().map(f)).unwrap_or_else(|| Err("the benchmark is not open".into()));
        state.update_value(|p| match r {
            Ok(()) => p.running |= busy,
            Err(e) => {
                p.running = false;
                p.message = Some(e);
            }
        });
        refresh();
    };
    match action {
        "open" => open(),
        "run" => {
            state.update_value(|p| {
                p.message = None;
                p.progress = (0, 0);
            });
            let opts = options();
            call(&|m| m.start(&opts), true);
        }
        "cancel" => call(&|m| m.cancel(), false),
        "verify" => call(&|m| m.verify(), true),
        "copy" | "csv" | "svg" => {
            let cfg = store.config.get_untracked();
            state.with_value(|p| {
                let Some(shared) = &p.shared else { return };
                match action {
                    "copy" => {
                        let link = share_link(shared, &cfg);
                        leptos::task::spawn_local(async move {
                            dom::copy_text(&link).await;
                        });
                    }
                    "csv" => {
                        if let Some(f) = &p.finished {
                            dom::download("trainmem-bench.csv", "text/csv", f.csv.as_bytes());
                        }
                    }
                    _ => {
                        let [_, memory] = charts(shared, &cfg);
                        dom::download("trainmem-bench-memory.svg", "image/svg+xml", bench_svg(&memory, &LIGHT, (720, 400)).as_bytes());
                    }
                }
            });
        }
        _ => {}
    }
}
