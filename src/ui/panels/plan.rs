//! The planner ([`crate::estimator::plan`]): a cluster, a target and the knobs the search may
//! turn; the search runs in slices between frames (a few milliseconds each, then a task
//! boundary), so the page keeps answering, with progress and a Cancel button; then the Pareto
//! frontier of headroom against estimated step time, the ranked plans (each row opens its share
//! link), the CSV and JSON the CLI writes, and why the top plan sets each knob where it does.
//!
//! The cluster and the sequence length are the configuration's own keys, edited through the
//! store's setters (the plan is for the configuration the page shows); the global batch and the
//! knobs are the panel's. Step times, throughput and MFU are the cost model's estimates, and
//! every place that shows one says so.
//!
//! Where nothing of the space fits, the panel offers to search again with the knobs that take
//! memory off the GPU and still train every parameter ([`crate::estimator::plan::widen`]'s
//! knobs), one button; asked by the answers ("no single change makes it fit",
//! [`crate::ui::state::Store::plan_asks`]), it searches at once and widens by itself, saying so.
//!
//! The planner lives in the lazily loaded module ([`crate::ui::lazy`]): the page shows the
//! panel's heading and the button that opens it ([`Shell`]), or opens it at once where the link
//! asks for it (`sections=plan`, an embed's `view=plan`).
//!
//! Test hook: `window.trainmemPlanBenchmark()` runs [`plan::benchmark_request`] (the native
//! benchmark's 10⁵-configuration search) in one go and returns its time by the page's clock
//! (`performance.now()`), as JSON, with where it goes: laying out the space, and `estimate()`
//! alone re-run on every fitting configuration found. The panel also carries the wall time of its last search
//! (`data-search-ms`) and the time spent searching inside its slices (`data-compute-ms`).

use crate::config::{self, encode_query, ActOffload, Config, Finetune, Offload, KEYS};
use crate::course::panel::Panel;
use crate::estimator::expr::group_digits;
use crate::estimator::gpu::{Vendor, GPUS};
use crate::estimator::plan::{self, GlobalBatch, PlanRequest, PlanResult, Progress, Search, Space};
use crate::estimator::units::format_bytes;
use crate::plots::plan::{draw_plan, plan_height, PlanChartData};
use crate::plots::Layout;
use crate::ui::canvas::{ChartCanvas, Draw, Height};
use crate::ui::dom;
use crate::ui::html::esc;
use crate::ui::lazy::{use_more, Lazy, Slot};
use crate::ui::state::{gpu_of, use_store, GpuChoice, Store};
use crate::words::{gpu_short, option_text};
use leptos::html::Div;
use leptos::prelude::*;
use std::rc::Rc;
use std::time::Duration;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

/// How long one slice of the search runs before the page gets the thread back, milliseconds.
const SLICE_MS: f64 = 25.0;
/// Estimates per call of [`Search::step`] inside a slice (the clock is read between calls).
const STEP_ESTIMATES: u64 = 32;

/// The knobs the visitor may open, with what each opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Knob {
    Batch,
    Zero,
    Recompute,
    Compile,
    Attn,
    Optim,
    Offload,
    ActOffload,
    Tp,
    Pp,
    Cp,
    Ep,
    Finetune,
}

impl Knob {
    const ALL: [Knob; 13] = [
        Knob::Batch,
        Knob::Zero,
        Knob::Recompute,
        Knob::Compile,
        Knob::Attn,
        Knob::Optim,
        Knob::Offload,
        Knob::ActOffload,
        Knob::Tp,
        Knob::Pp,
        Knob::Cp,
        Knob::Ep,
        Knob::Finetune,
    ];

    fn id(self) -> &'static str {
        match self {
            Knob::Batch => "batch",
            Knob::Zero => "zero",
            Knob::Recompute => "recompute",
            Knob::Compile => "compile",
            Knob::Attn => "attn",
            Knob::Optim => "optim",
            Knob::Offload => "offload",
            Knob::ActOffload => "act_offload",
            Knob::Tp => "tp",
            Knob::Pp => "pp",
            Knob::Cp => "cp",
            Knob::Ep => "ep",
            Knob::Finetune => "finetune",
        }
    }

    /// The knob of a [`plan::KNOBS`] name, where the panel has a checkbox for it.
    fn of_id(id: &str) -> Option<Knob> {
        Knob::ALL.into_iter().find(|k| k.id() == id)
    }

    fn label(self) -> &'static str {
        match self {
            Knob::Batch => "Micro-batch and accumulation",
            Knob::Zero => "ZeRO 0–3 / FSDP / HSDP",
            Knob::Recompute => "Recomputation: none, selective, op-level, every 2nd layer, full",
            Knob::Compile => "torch.compile (over the configured regions)",
            Knob::Attn => "Attention implementation",
            Knob::Optim => "Optimizer (AdamW, 8-bit Adam) and its implementation",
            Knob::Offload => "CPU offload of the optimizer and parameters",
            Knob::ActOffload => "Activation offloading to pinned host memory",
            Knob::Tp => "Tensor parallelism (with sequence parallelism)",
            Knob::Pp => "Pipeline parallelism with virtual stages",
            Knob::Cp => "Context parallelism",
            Knob::Ep => "Expert parallelism (MoE models)",
            Knob::Finetune => "LoRA or QLoRA (changes what is trained)",
        }
    }

    /// Open unless asked: the knobs that do not change what is trained or how it runs on the host.
    fn default_on(self) -> bool {
        matches!(self, Knob::Batch | Knob::Zero | Knob::Recompute | Knob::Compile | Knob::Tp | Knob::Pp | Knob::Cp | Knob::Ep)
    }
}

/// The space the checked knobs open around `base`: the default space's values for the knobs it
/// turns, and [`Space::opened`]'s for the ones it leaves as configured (attention, optimizer,
/// offloading, activation offloading, fine-tuning method).
fn space_of(base: &Config, on: &[Knob]) -> Space {
    let open = Space::default_for(base);
    let fixed = Space::fixed(base);
    let has = |k: Knob| on.contains(&k);
    let space = Space {
        batch: if has(Knob::Batch) { Vec::new() } else { vec![base.batch] },
        zero: if has(Knob::Zero) { open.zero } else { fixed.zero },
        recompute: if has(Knob::Recompute) { open.recompute } else { fixed.recompute },
        tp: if has(Knob::Tp) { open.tp } else { fixed.tp },
        sp: if has(Knob::Tp) { open.sp } else { fixed.sp },
        pp: if has(Knob::Pp) { open.pp } else { fixed.pp },
        vpp: if has(Knob::Pp) { vec![1, 2] } else { fixed.vpp },
        cp: if has(Knob::Cp) { open.cp } else { fixed.cp },
        ep: if has(Knob::Ep) { open.ep } else { fixed.ep },
        compile: if has(Knob::Compile) { open.compile } else { fixed.compile },
        recompute_every: if has(Knob::Recompute) { open.recompute_every } else { fixed.recompute_every },
        recompute_layers: if has(Knob::Recompute) { open.recompute_layers } else { fixed.recompute_layers },
        ..fixed
    };
    [Knob::Attn, Knob::Optim, Knob::Offload, Knob::ActOffload, Knob::Finetune]
        .into_iter()
        .filter(|k| has(*k))
        .fold(space, |s, k| s.opened(base, k.id()))
}

/// What a finished (or cancelled) search left.
struct Finished {
    request: PlanRequest,
    result: PlanResult,
    chart: PlanChartData,
    /// Wall time from start to end, and the time spent inside the search, milliseconds.
    wall_ms: f64,
}

/// The configuration keys the panel edits, with their labels.
const CLUSTER_KEYS: [(&str, &str); 7] = [
    ("gpu", "GPU type"),
    ("gpu_gib", "Custom GPU memory, GiB"),
    ("gpu_tflops", "Custom GPU dense 16-bit TFLOP/s"),
    ("gpu_hbm_gbs", "Custom GPU memory bandwidth, GB/s"),
    ("gpus", "GPUs"),
    ("gpus_per_node", "GPUs per node (NVLink domain)"),
    ("interconnect", "Interconnect between nodes"),
];

fn custom_only(name: &str) -> bool {
    matches!(name, "gpu_gib" | "gpu_tflops" | "gpu_hbm_gbs")
}

/// The panel's configuration fields as HTML (ids `plan-<key>`), showing `cfg`.
fn fields_html(cfg: &Config) -> String {
    let mut s = String::new();
    for (name, label) in CLUSTER_KEYS.iter().chain(&[("seq", "Target sequence length, tokens")]) {
        let Some(k) = KEYS.iter().find(|k| k.name == *name) else { continue };
        let value = (k.get)(cfg);
        let wide = *name == "gpu" || !(k.choices)().is_empty();
        let control = if *name == "gpu" {
            let mut o = String::from("<select id=\"plan-gpu\" data-plan-key=\"gpu\">");
            for (maker, vendor) in [("NVIDIA", Vendor::Nvidia), ("AMD", Vendor::Amd)] {
                o.push_str(&format!("<optgroup label=\"{maker}\">"));
                for g in GPUS.iter().filter(|g| g.vendor == vendor) {
                    o.push_str(&format!(
                        "<option value=\"{}\"{}>{}</option>",
                        g.id,
                        if g.id == value { " selected" } else { "" },
                        esc(&gpu_short(g))
                    ));
                }
                o.push_str("</optgroup>");
            }
            o.push_str(&format!("<option value=\"custom\"{}>Custom…</option></select>", if value == "custom" { " selected" } else { "" }));
            o
        } else if !(k.choices)().is_empty() {
            let options: String = (k.choices)()
                .iter()
                .map(|c| {
                    format!("<option value=\"{c}\"{}>{}</option>", if *c == value { " selected" } else { "" }, esc(&option_text(name, c)))
                })
                .collect();
            format!(
                "<select id=\"plan-{name}\" data-plan-key=\"{name}\" aria-describedby=\"plan-id-{name}\">{options}</select><small class=\"choice-id\" id=\"plan-id-{name}\" data-plan-id=\"{name}\">{}</small>",
                esc(&value)
            )
        } else {
            format!(
                "<input id=\"plan-{name}\" type=\"text\" inputmode=\"decimal\" autocomplete=\"off\" data-plan-key=\"{name}\" value=\"{}\" aria-invalid=\"false\" aria-describedby=\"plan-err-{name}\">",
                esc(&value)
            )
        };
        s.push_str(&format!(
            "<div class=\"field{}\" data-plan-field=\"{name}\"{}><div class=\"field-head\"><label for=\"plan-{name}\">{}</label><code class=\"key\">{name}</code></div>{control}<span class=\"field-error\" id=\"plan-err-{name}\" role=\"status\"></span></div>",
            if wide { " wide" } else { "" },
            if custom_only(name) && cfg.gpu != "custom" { " hidden" } else { "" },
            esc(label)
        ));
    }
    s
}

/// Applies a field's edit through the store's setters; returns the error to show.
fn edit(store: Store, key: &str, value: &str) -> Option<String> {
    let k = KEYS.iter().find(|k| k.name == key)?;
    let r = if k.name == "gpu" {
        match GPUS.iter().find(|g| g.id == value) {
            Some(g) => store.set_gpu(GpuChoice::Catalog(*g)),
            None => store.set_gpu(GpuChoice::Custom(store.config.with_untracked(|c| c.gpu_gib))),
        }
    } else {
        store.set_key(k.name, value)
    };
    r.err().map(|e| format!("{}: {e}", k.name))
}

/// Keeps the panel's fields showing the configuration.
fn sync_fields(root: &web_sys::Element, cfg: &Config) {
    for (name, _) in CLUSTER_KEYS.iter().chain(&[("seq", "")]) {
        let Some(k) = KEYS.iter().find(|k| k.name == *name) else { continue };
        let value = (k.get)(cfg);
        if let Ok(Some(el)) = root.query_selector(&format!("[data-plan-key=\"{name}\"]")) {
            if let Some(i) = el.dyn_ref::<web_sys::HtmlInputElement>() {
                if i.value() != value && i.get_attribute("aria-invalid").as_deref() != Some("true") {
                    i.set_value(&value);
                }
            } else if let Some(s) = el.dyn_ref::<web_sys::HtmlSelectElement>() {
                if s.value() != value {
                    s.set_value(&value);
                }
            }
        }
        if let Ok(Some(id)) = root.query_selector(&format!("[data-plan-id=\"{name}\"]")) {
            id.set_text_content(Some(&value));
        }
        if custom_only(name) {
            if let Ok(Some(f)) = root.query_selector(&format!("[data-plan-field=\"{name}\"]")) {
                let _ = f.toggle_attribute_with_force("hidden", cfg.gpu != "custom");
            }
        }
    }
}

fn secs(s: f64) -> String {
    if s >= 100.0 {
        format!("{s:.0} s")
    } else if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.0} ms", s * 1000.0)
    }
}

fn progress_text(p: &Progress) -> String {
    format!(
        "{} of {} configurations settled: {} estimated ({} fit), {} proven not to fit without an estimate, {} dominated, {} invalid",
        group_digits(p.settled as u128),
        group_digits(p.configurations as u128),
        group_digits((p.fitting + p.not_fitting) as u128),
        group_digits(p.fitting as u128),
        group_digits(p.pruned as u128),
        group_digits(p.dominated as u128),
        group_digits(p.invalid as u128)
    )
}

/// "ZeRO 3 · selective · TP 2 + SP · PP 1 · CP 1 · 4 × 8 accumulation".
fn knobs_text(p: &plan::Plan) -> String {
    let k = &p.knobs;
    let c = &p.config;
    let mut parts = vec![
        format!("zero {}", config::get(c, "zero").unwrap_or_default()),
        format!(
            "recompute {}{}",
            config::get(c, "recompute").unwrap_or_default(),
            if k.recompute_every > 0 {
                format!(" + every {} full", k.recompute_every)
            } else if k.recompute_layers > 0 {
                format!(" (first {} layers of each stage)", k.recompute_layers)
            } else {
                String::new()
            }
        ),
        format!("tp {}{}", k.tp, if k.sp { " + sp" } else { "" }),
        format!("pp {}{}", k.pp, if k.vpp > 1 { format!(" × {} virtual", k.vpp) } else { String::new() }),
        format!("cp {}", k.cp),
    ];
    if k.ep > 1 {
        parts.push(format!("ep {}", k.ep));
    }
    parts.push(format!("attn {}", config::get(c, "attn").unwrap_or_default()));
    parts.push(format!("optim {} ({})", config::get(c, "optim").unwrap_or_default(), config::get(c, "optim_impl").unwrap_or_default()));
    if k.offload != Offload::None {
        parts.push(format!("offload {}", config::get(c, "offload").unwrap_or_default()));
    }
    if k.act_offload != ActOffload::None {
        parts.push(format!("activations offloaded ({})", config::get(c, "act_offload").unwrap_or_default()));
    }
    if k.act_offload_layers > 0 {
        parts.push(format!("{} layers offloaded", k.act_offload_layers));
    }
    if k.compile {
        parts.push(format!("compiled ({})", config::get(c, "compile_regions").unwrap_or_default()));
    }
    if k.finetune != Finetune::Full {
        parts.push(config::get(c, "finetune").unwrap_or_default());
    }
    parts.join(" · ")
}

/// The ranked plans as an HTML table: rank, estimates, memory, knobs and the share link.
fn table_html(f: &Finished, base_url: &str) -> String {
    let r = &f.result;
    let unit = f.request.base.unit;
    let mut s = String::from(
        "<table class=\"plan-table\" data-testid=\"plan-table\"><caption>Fitting plans, fastest first by the cost model's estimate (★: on the Pareto frontier). Each link opens the plan's configuration.</caption>\
         <thead><tr><th scope=\"col\">Rank</th><th scope=\"col\">Step time (estimate)</th><th scope=\"col\">Tokens/s (estimate)</th><th scope=\"col\">MFU (estimate)</th>\
         <th scope=\"col\">Memory per GPU</th><th scope=\"col\">Headroom</th><th scope=\"col\">Micro-batch × accumulation</th><th scope=\"col\">Knobs</th><th scope=\"col\">Link</th></tr></thead><tbody>",
    );
    let mut rows: Vec<&plan::Plan> = r.plans.iter().collect();
    for p in &r.frontier {
        if !rows.iter().any(|q| q.knobs == p.knobs) {
            rows.push(p);
        }
    }
    for p in rows {
        let star = if r.frontier.iter().any(|q| q.knobs == p.knobs) { " ★" } else { "" };
        let q = encode_query(&p.config);
        let href = if q.is_empty() { base_url.to_string() } else { format!("{base_url}?{q}") };
        s.push_str(&format!(
            "<tr data-testid=\"plan-row\" data-rank=\"{rank}\" data-query=\"{qa}\"><th scope=\"row\">{rank}{star}</th><td>{}</td><td>{}</td><td>{:.1} %</td><td>{}</td><td>{}</td><td>{} × {}</td><td>{}</td>\
             <td><a data-testid=\"plan-row-link\" href=\"{}\" target=\"_blank\" rel=\"noopener\">Open plan {rank}</a></td></tr>",
            secs(p.step_s),
            group_digits(p.tokens_per_s.round().max(0.0) as u128),
            100.0 * p.mfu,
            format_bytes(p.memory, unit),
            format_bytes(p.headroom.max(0) as u128, unit),
            p.knobs.batch,
            p.knobs.accum,
            esc(&knobs_text(p)),
            esc(&href),
            rank = p.rank,
            qa = esc(&q),
        ));
    }
    s.push_str("</tbody></table>");
    s
}

/// The status line, the explanation and the assumptions as HTML.
fn summary_html(f: &Finished) -> String {
    let r = &f.result;
    let p = &r.progress;
    let mut s = format!(
        "<p data-testid=\"plan-summary\">{} {} fitting configurations found in {} ({}); {} plans listed. Step times, throughput and MFU are an <strong>{}</strong>.</p>",
        if p.cancelled { "Search cancelled:" } else { "Search done:" },
        group_digits(p.fitting as u128),
        secs(f.wall_ms / 1000.0),
        esc(&progress_text(p)),
        r.plans.len(),
        esc(r.label),
    );
    if let Some(top) = r.plans.first() {
        s.push_str(&format!(
            "<h3>Why plan 1 sets each knob where it does</h3><p class=\"hint\">Plan 1: {} estimated step, {} headroom per GPU.</p><ul data-testid=\"plan-explanation\">",
            secs(top.step_s),
            format_bytes(top.headroom.max(0) as u128, f.request.base.unit)
        ));
        for reason in &r.explanation {
            s.push_str(&format!("<li>{}</li>", esc(&reason.sentence)));
        }
        s.push_str("</ul>");
    } else {
        s.push_str(
            "<p data-testid=\"plan-none\">No configuration of the space fits: open more knobs (LoRA or QLoRA changes what is trained), add GPUs or shorten the sequence.</p>",
        );
    }
    s.push_str("<details class=\"plan-assumptions\"><summary>The cost model's assumptions (the step time is an estimate)</summary><ul>");
    for a in &r.assumptions {
        s.push_str(&format!("<li>{}</li>", esc(&a.text)));
    }
    s.push_str("</ul></details>");
    s
}

/// Installs `window.trainmemPlanBenchmark()` (see the module docs).
fn install_benchmark_hook() {
    let f = Closure::<dyn Fn() -> JsValue>::new(|| {
        let req = plan::benchmark_request();
        let t0 = dom::now_ms();
        let mut s = match Search::new(req.clone()) {
            Ok(s) => s,
            Err(e) => return JsValue::from_str(&format!("{{\"error\":\"{e}\"}}")),
        };
        let layout_ms = dom::now_ms() - t0;
        while !s.step(u64::MAX).done {}
        let search_ms = dom::now_ms() - t0;
        let r = s.result();
        let total_ms = dom::now_ms() - t0;
        let p = r.progress;
        // Where the time goes: estimate() alone on every fitting configuration found.
        let configs: Vec<Config> = s.points().iter().map(|q| q.knobs.apply(&req.base)).collect();
        let t1 = dom::now_ms();
        for c in &configs {
            let _ = crate::estimator::estimate(c);
        }
        let fitting_estimates_ms = dom::now_ms() - t1;
        JsValue::from_str(&format!(
            "{{\"search_ms\":{search_ms:.1},\"search_and_result_ms\":{total_ms:.1},\"layout_ms\":{layout_ms:.1},\"fitting_estimates_ms\":{fitting_estimates_ms:.1},\"configurations\":{},\"estimate_calls\":{},\"fitting\":{},\"plans\":{}}}",
            p.configurations,
            p.estimate_calls,
            p.fitting,
            r.plans.len()
        ))
    });
    let _ = js_sys::Reflect::set(&window(), &JsValue::from_str("trainmemPlanBenchmark"), f.as_ref());
    f.forget();
}

/// The Pareto chart of the last search.
#[component]
fn PlanChart(chart: Memo<Option<PlanChartData>>) -> impl IntoView {
    let label = Signal::derive(move || chart.with(|c| c.as_ref().map(PlanChartData::describe).unwrap_or_default()));
    let draw: Draw = Rc::new(move |root, theme| -> Option<Layout> {
        chart.with(|c| c.as_ref().and_then(|d| draw_plan(root, d, theme).ok().map(|(_, l)| l)))
    });
    let height: Height = Rc::new(move |w, theme| chart.with(|c| c.as_ref().map_or(120, |d| plan_height(d, w, theme))));
    view! { <ChartCanvas label=label draw=draw height=height testid="chart-plan"/> }
}

/// What the panel says under its heading.
const HINT: &str = "Every configuration of the space that fits, ranked by the cost model's estimated step time (an estimate, not a measurement). Pruning only skips configurations proven not to fit or dominated.";

/// The page's side: the panel's heading and the button that opens the planner (fetching the
/// lazily loaded module), or the planner at once where the link asks for it.
#[component]
pub fn Shell() -> impl IntoView {
    let store = use_store();
    let more = use_more();
    let asked = store.embed || store.course.with_value(|s| s.sections.contains(&Panel::Plan));
    let loading = move || more.requested(Lazy::Plan);
    view! {
        <Slot panel=Lazy::Plan open=asked>
            <section class="plan" aria-labelledby="plan-h" data-panel="plan">
                <h2 id="plan-h">"Plan"</h2>
                <p class="hint">{HINT}</p>
                <button type="button" class="primary" data-testid="plan-open" aria-busy=move || loading().to_string() on:click=move |_| more.request(Lazy::Plan)>
                    {move || if loading() { "Loading the planner…" } else { "Open the planner" }}
                </button>
            </section>
        </Slot>
    }
}

/// The planner (in the lazily loaded module).
#[component]
pub fn Plan() -> impl IntoView {
    let store = use_store();
    install_benchmark_hook();
    let fields = NodeRef::<Div>::new();
    let initial = store.config.with_untracked(fields_html);
    Effect::new(move |_| {
        let Some(root) = fields.get() else { return };
        store.config.with(|c| sync_fields(&root, c));
    });
    let on_field = move |ev: web_sys::Event| {
        let Some(t) = ev.target().and_then(|t| t.dyn_into::<web_sys::Element>().ok()) else { return };
        let Some(key) = t.get_attribute("data-plan-key") else { return };
        let text = t.dyn_ref::<web_sys::HtmlInputElement>().map(|i| i.value());
        if (ev.type_() == "input") != text.is_some() {
            return;
        }
        let value = text.or_else(|| t.dyn_ref::<web_sys::HtmlSelectElement>().map(|s| s.value())).unwrap_or_default();
        let err = edit(store, &key, &value);
        if let Ok(Some(span)) = document().query_selector(&format!("#plan-err-{key}")) {
            span.set_text_content(err.as_deref());
        }
        if t.dyn_ref::<web_sys::HtmlInputElement>().is_some() {
            let _ = t.set_attribute("aria-invalid", if err.is_some() { "true" } else { "false" });
        }
    };

    // The target's global batch and the knobs: the panel's own.
    let batch_text = RwSignal::new(store.config.with_untracked(|c| (c.batch * c.accum * c.dp().max(1)).to_string()));
    let batch_in_tokens = RwSignal::new(false);
    let knobs = RwSignal::new(Knob::ALL.into_iter().filter(|k| k.default_on()).collect::<Vec<_>>());
    let global = move || -> Result<GlobalBatch, String> {
        let text = batch_text.get();
        let n = config::parse_uint(&text).map_err(|e| format!("global batch: {e}"))?;
        Ok(if batch_in_tokens.get() { GlobalBatch::Tokens(n) } else { GlobalBatch::Sequences(n) })
    };

    // The search and what it shows.
    let search = StoredValue::new_local(None::<Search>);
    let generation = StoredValue::new(0u64);
    let running = RwSignal::new(false);
    let progress = RwSignal::new(None::<Progress>);
    let finished = StoredValue::new_local(None::<Rc<Finished>>);
    let version = RwSignal::new(0u64);
    let problem = RwSignal::new(String::new());
    let started_at = StoredValue::new(0.0f64);
    let compute_ms = RwSignal::new(0.0f64);
    let wall_ms = RwSignal::new(0.0f64);

    let finish = move || {
        let done = search.try_update_value(|s| {
            s.as_ref().map(|s| {
                let result = s.result();
                let req = s.request().clone();
                let cfg = &req.base;
                let gpu = gpu_of(cfg).label();
                let chart = PlanChartData::new(&result, s.points(), cfg.display_name(), gpu, cfg.unit);
                (req, result, chart)
            })
        });
        if let Some(Some((request, result, chart))) = done {
            let wall = dom::now_ms() - started_at.get_value();
            wall_ms.set(wall);
            finished.set_value(Some(Rc::new(Finished { request, result, chart, wall_ms: wall })));
            version.update(|v| *v += 1);
        }
        running.set(false);
        dom::mark("trainmem:plan:done");
    };

    fn slice(
        gen: u64,
        generation: StoredValue<u64>,
        search: StoredValue<Option<Search>, LocalStorage>,
        progress: RwSignal<Option<Progress>>,
        compute_ms: RwSignal<f64>,
        finish: impl Fn() + Copy + 'static,
    ) {
        if generation.try_get_value() != Some(gen) {
            return;
        }
        let t0 = dom::now_ms();
        let p = search.try_update_value(|s| {
            s.as_mut().map(|s| {
                let mut p = s.progress();
                while !p.done && dom::now_ms() - t0 < SLICE_MS {
                    p = s.step(STEP_ESTIMATES);
                }
                p
            })
        });
        compute_ms.update(|m| *m += dom::now_ms() - t0);
        let Some(Some(p)) = p else { return };
        progress.set(Some(p));
        if p.done {
            finish();
        } else {
            set_timeout(move || slice(gen, generation, search, progress, compute_ms, finish), Duration::ZERO);
        }
    }

    // The knobs the last search opened by itself (asked by the answers, nothing fitting), said
    // above its results until another search is started by hand.
    let widened_by_itself = RwSignal::new(Vec::<Knob>::new());
    let run = move || {
        problem.set(String::new());
        let base = store.config.get_untracked();
        let g = match global() {
            Ok(g) => g,
            Err(e) => {
                problem.set(e);
                return;
            }
        };
        let mut req = PlanRequest::new(base.clone(), g);
        req.space = space_of(&base, &knobs.get_untracked());
        match Search::new(req) {
            Ok(s) => {
                let gen = generation.get_value() + 1;
                generation.set_value(gen);
                progress.set(Some(s.progress()));
                search.set_value(Some(s));
                running.set(true);
                compute_ms.set(0.0);
                started_at.set_value(dom::now_ms());
                dom::mark("trainmem:plan:start");
                // The first slice after the button's own frame paints.
                request_animation_frame(move || {
                    set_timeout(move || slice(gen, generation, search, progress, compute_ms, finish), Duration::ZERO);
                });
            }
            Err(e) => problem.set(format!("{}: {e}", e.key())),
        }
    };
    let start = move |_: leptos::ev::MouseEvent| {
        widened_by_itself.set(Vec::new());
        run();
    };
    // When nothing fits: the knobs of `plan::WIDENINGS` the search left closed, checked, and the
    // search run again (each takes memory off the GPU and still trains every parameter).
    let closed_widenings = move || -> Vec<Knob> {
        finished.with_value(|f| match f.as_ref() {
            Some(f) if f.result.plans.is_empty() => {
                plan::WIDENINGS.into_iter().filter_map(Knob::of_id).filter(|k| knobs.with(|on| !on.contains(k))).collect()
            }
            _ => Vec::new(),
        })
    };
    let widen = move |_: leptos::ev::MouseEvent| {
        let more = closed_widenings();
        knobs.update(|v| v.extend(more));
        widened_by_itself.set(Vec::new());
        run();
    };
    // Asked by the answers ("no single change makes it fit", [`Store::plan_asks`]): search at
    // once and, where nothing fits, again with the host-memory knobs open — said above the
    // results, the knobs checked.
    let asks_seen = StoredValue::new(0u32);
    let widen_when_empty = StoredValue::new(false);
    Effect::new(move |_| {
        let n = store.plan_asks.get();
        if n > asks_seen.get_value() {
            asks_seen.set_value(n);
            widen_when_empty.set_value(true);
            widened_by_itself.set(Vec::new());
            run();
        }
    });
    Effect::new(move |_| {
        version.get();
        if running.get() || !widen_when_empty.get_value() {
            return;
        }
        widen_when_empty.set_value(false);
        let more = closed_widenings();
        if !more.is_empty() {
            knobs.update(|v| v.extend(more.iter().copied()));
            widened_by_itself.set(more);
            run();
        }
    });
    let cancel = move |_| {
        search.update_value(|s| {
            if let Some(s) = s {
                s.cancel();
            }
        });
    };

    let export = move |json: bool| {
        let Some(f) = finished.get_value() else { return };
        if json {
            let text = plan::to_json(&f.request, &f.result, f.wall_ms / 1000.0, None, encode_query);
            dom::download("trainmem-plan.json", "application/json", text.as_bytes());
        } else {
            let text = plan::to_csv(&f.result, encode_query);
            dom::download("trainmem-plan.csv", "text/csv", text.as_bytes());
        }
    };

    let chart = Memo::new(move |_| {
        version.get();
        finished.with_value(|f| f.as_ref().map(|f| f.chart.clone()))
    });
    let results = move || {
        version.get();
        let url = dom::base_url();
        finished.with_value(|f| f.as_ref().map(|f| (summary_html(f), table_html(f, &url))))
    };

    let knob_boxes = Knob::ALL
        .into_iter()
        .map(|k| {
            let id = format!("plan-knob-{}", k.id());
            let for_id = id.clone();
            view! {
                <label class="check" for=for_id>
                    <input type="checkbox" id=id data-testid=format!("plan-knob-{}", k.id())
                        prop:checked=move || knobs.with(|v| v.contains(&k))
                        on:change=move |ev| {
                            let on = event_target_checked(&ev);
                            knobs.update(|v| {
                                v.retain(|x| *x != k);
                                if on {
                                    v.push(k);
                                }
                            });
                        }/>
                    " " {k.label()}
                </label>
            }
        })
        .collect_view();

    view! {
        <section class="plan" aria-labelledby="plan-h" data-testid="plan" data-panel="plan"
            data-search-ms=move || format!("{:.1}", wall_ms.get()) data-compute-ms=move || format!("{:.1}", compute_ms.get())>
            <h2 id="plan-h">"Plan"</h2>
            <p class="hint">{HINT}</p>
            <div class="grid" node_ref=fields on:input=on_field on:change=on_field inner_html=initial></div>
            <div class="grid">
                <div class="field">
                    <label for="plan-global">"Global batch per optimizer step"</label>
                    <input id="plan-global" type="text" inputmode="decimal" autocomplete="off" data-testid="plan-global"
                        prop:value=move || batch_text.get() on:input=move |ev| batch_text.set(event_target_value(&ev))/>
                </div>
                <div class="field">
                    <label for="plan-global-unit">"Global batch counted in"</label>
                    <select id="plan-global-unit" data-testid="plan-global-unit" aria-describedby="plan-global-hint"
                        on:change=move |ev| batch_in_tokens.set(event_target_value(&ev) == "tokens")>
                        <option value="sequences" selected=true>"sequences"</option>
                        <option value="tokens">"tokens"</option>
                    </select>
                    <small class="choice-id" id="plan-global-hint">"tokens: a multiple of the sequence length"</small>
                </div>
            </div>
            <fieldset class="plan-knobs">
                <legend>"Knobs the search may turn"</legend>
                {knob_boxes}
            </fieldset>
            <div class="plan-run">
                <button type="button" data-testid="plan-run" on:click=start disabled=move || running.get()>"Search"</button>
                <button type="button" data-testid="plan-cancel" on:click=cancel disabled=move || !running.get()>"Cancel"</button>
                <p class="field-error" role="alert" data-testid="plan-problem">{move || problem.get()}</p>
            </div>
            {move || progress.get().map(|p| view! {
                <div class="plan-progress" data-testid="plan-progress" data-settled=p.settled.to_string() data-configurations=p.configurations.to_string() data-done=p.done.to_string()>
                    <progress max=p.configurations.max(1).to_string() value=p.settled.to_string() aria-label="Search progress"></progress>
                    <p>{progress_text(&p)}</p>
                </div>
            })}
            <div role="status" aria-live="polite" class="sr-only" data-testid="plan-status">
                {move || { version.get(); if running.get() { "Searching…".to_string() } else { finished.with_value(|f| f.as_ref().map(|f| format!("Search finished: {} fitting configurations.", f.result.progress.fitting)).unwrap_or_default()) } }}
            </div>
            {move || results().map(|(summary, table)| view! {
                <div class="plan-results" data-testid="plan-results">
                    {move || widened_by_itself.with(|w| (!w.is_empty()).then(|| {
                        let names = w.iter().map(|k| k.label()).collect::<Vec<_>>().join("; ");
                        view! {
                            <p class="hint" data-testid="plan-widened">
                                "Nothing fit with the knobs as they were, so the search ran again with these checked as well (they still train every parameter, at a cost in step time or in the optimizer states' precision): " {names} "."
                            </p>
                        }
                    }))}
                    <div inner_html=summary></div>
                    {move || {
                        version.get();
                        let closed = closed_widenings();
                        (!closed.is_empty()).then(|| {
                            let names = closed.iter().map(|k| k.label()).collect::<Vec<_>>().join("; ");
                            view! {
                                <p class="hint" data-testid="plan-widen-hint">
                                    "These knobs take memory off the GPU and still train every parameter, at a cost in step time (offloading) or in the optimizer states' precision (8-bit Adam); the search left them as configured: " {names} "."
                                </p>
                                <button type="button" class="primary" data-testid="plan-widen" on:click=widen disabled=move || running.get()>
                                    "Search again with them open"
                                </button>
                            }
                        })
                    }}
                    <div class="chart-frame">
                        <PlanChart chart=chart/>
                    </div>
                    <div class="chart-tools" role="toolbar" aria-label="Plan exports">
                        <button type="button" data-testid="plan-export-csv" on:click=move |_| export(false)>"Download plans (CSV)"</button>
                        <button type="button" data-testid="plan-export-json" on:click=move |_| export(true)>"Download plans (JSON)"</button>
                    </div>
                    <crate::ui::frameworks_client::ExportButtons id="plan-export-top" label="Download plan 1 to run as"
                        config=Signal::derive(move || { version.get(); finished.with_value(|f| f.as_ref().and_then(|f| f.result.plans.first().map(|p| p.config.clone()))) })/>
                    <div class="plan-table-wrap" tabindex="0" role="region" aria-label="Ranked plans" inner_html=table></div>
                </div>
            })}
        </section>
    }
}
