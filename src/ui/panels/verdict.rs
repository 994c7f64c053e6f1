//! The verdict: does the step fit and the key figures; and the one-click answers
//! ([`crate::estimator::sweep::answers`]): the largest micro-batch, the longest sequence, the
//! fewest GPUs and the smallest GPU that fit, each a button that applies it.
//!
//! When the configuration does not fit, the answers also list the three cheapest single changes
//! that make it fit ([`crate::estimator::plan::cheapest_fixes`]), each with its new headroom and
//! its cost (executed FLOPs and the cost model's estimated step time), each a button that
//! applies it.
//!
//! Both come from [`crate::ui::analysis`]: from the analysis worker where there is one, so the
//! panel lags a reply behind a change and says so (`aria-busy="true"`, its buttons inert until
//! then). Both are rebuilt whole on each change, as HTML text ([`crate::ui::html`]); the answers'
//! buttons carry the keys they set (`data-apply="batch=6"`), a fix's button its index
//! (`data-fix="0"`: a change may set several keys, applied together), and one click handler
//! applies them through the store's setters.

use crate::answers::{Found, FoundFix};
use crate::config::{find_key, Config, Unit};
use crate::estimator::expr::group_digits;
use crate::estimator::units::{format_bytes, format_count};
use crate::estimator::{Estimate, EstimateError};
use crate::plots::zero_label;
use crate::ui::analysis::{use_answers, Answers};
use crate::ui::dom;
use crate::ui::html::{esc, stat};
use crate::ui::state::{gpu_of, use_store};
use leptos::prelude::*;
use wasm_bindgen::JsCast;

fn figures(e: &Result<Estimate, EstimateError>, cfg: &Config) -> String {
    let e = match e {
        Err(e) => {
            return format!(
                "<div class=\"verdict bad\" data-testid=\"estimate-error\"><p><strong>This configuration cannot be estimated: </strong>{}</p></div>",
                esc(&e.to_string())
            )
        }
        Ok(e) => e,
    };
    let unit = cfg.unit;
    let gpu = gpu_of(cfg).label();
    let peak = e.memory.peak;
    // The verdict decides on what nvidia-smi will show (the caching allocator replayed) where
    // it was simulated, else on the allocated peak with what lives outside the allocator.
    let deciding = e.deciding_peak();
    let fits = e.fits();
    let basis = if e.memory.nvidia_smi.is_some() { " (nvidia-smi)" } else { "" };
    let headline = if fits {
        format!("Fits on {gpu}: {} headroom{basis}", format_bytes(e.capacity - deciding, unit))
    } else {
        format!("Does not fit on {gpu}: needs {} more{basis}", format_bytes(deciding - e.capacity, unit))
    };
    let mut s = format!(
        "<div class=\"verdict{}\" data-testid=\"verdict\" data-fits=\"{fits}\"><p class=\"headline\">{}</p><dl class=\"stats\">",
        if fits { "" } else { " bad" },
        esc(&headline)
    );
    let bytes = |testid: &str, b: u128| format!("data-testid=\"{testid}\" data-bytes=\"{b}\"");
    stat(
        &mut s,
        "Peak in use per GPU",
        &bytes("peak-bytes", peak),
        &format!("{}<span class=\"sub\">at: {}</span>", format_bytes(peak, unit), esc(&e.memory.peak_event)),
    );
    if let (Some(smi), Some(res)) = (e.memory.nvidia_smi, e.memory.reserved_peak) {
        let outside = smi.saturating_sub(res);
        stat(
            &mut s,
            "nvidia-smi will show",
            &bytes("nvidia-smi-bytes", smi),
            &format!(
                "{}<span class=\"sub\">{} reserved (simulated) + {} context, cuBLAS, NCCL</span>",
                format_bytes(smi, unit),
                format_bytes(res, unit),
                format_bytes(outside, unit)
            ),
        );
    }
    stat(
        &mut s,
        "Allocated peak",
        &bytes("allocated-peak-bytes", e.memory.allocated_peak),
        &format!("{}<span class=\"sub\">max_memory_allocated</span>", format_bytes(e.memory.allocated_peak, unit)),
    );
    stat(&mut s, "Sum of components", &bytes("total-bytes", e.memory.total), &format_bytes(e.memory.total, unit));
    stat(&mut s, "GPU capacity", &bytes("capacity-bytes", e.capacity), &format_bytes(e.capacity, unit));
    stat(
        &mut s,
        &format!("Cluster ({} GPUs)", e.layout.gpus),
        &bytes("cluster-bytes", e.cluster_total()),
        &format_bytes(e.cluster_total(), unit),
    );
    stat(
        &mut s,
        "Parameters",
        &format!("data-testid=\"param-count\" data-count=\"{}\"", e.parameter_count),
        &format!("{} ({} trainable)", format_count(e.parameter_count), format_count(e.trainable_parameter_count)),
    );
    stat(&mut s, "Tokens per step", "", &group_digits(e.layout.tokens_per_step));
    s.push_str("</dl>");
    if e.memory.host > 0 {
        s.push_str(&format!("<p class=\"host\">Host (CPU) memory per GPU process: {}</p>", format_bytes(e.memory.host, unit)));
    }
    if !e.warnings.is_empty() {
        s.push_str("<ul class=\"warnings\">");
        for w in &e.warnings {
            s.push_str(&format!("<li>{}</li>", esc(w)));
        }
        s.push_str("</ul>");
    }
    s.push_str("</div>");
    s
}

/// One answer as a button: what it says and the keys it sets (none: nothing to apply).
fn answer(out: &mut String, id: &str, text: &str, apply: Option<(&str, String)>, current: bool) {
    let (attr, disabled) = match &apply {
        Some((k, v)) if !current => (format!(" data-apply=\"{k}={}\" data-value=\"{}\"", esc(v), esc(v)), ""),
        Some((_, v)) => (format!(" data-value=\"{}\"", esc(v)), " disabled"),
        None => (String::new(), " disabled"),
    };
    let label = if current { format!("{text} (this configuration)") } else { text.to_string() };
    out.push_str(&format!(
        "<li><button type=\"button\" class=\"answer\" data-testid=\"answer-{id}\"{attr}{disabled}>{}</button></li>",
        esc(&label)
    ));
}

fn answers_html(a: &Found, cfg: &Config) -> String {
    let mut s = String::from("<h2 class=\"sr-only\">What fits</h2><ul>");
    match a.max_batch {
        Some(b) => answer(
            &mut s,
            "batch",
            &format!("Largest micro-batch that fits: {}", group_digits(b as u128)),
            Some(("batch", b.to_string())),
            b == cfg.batch,
        ),
        None => answer(&mut s, "batch", "No micro-batch fits", None, false),
    }
    match a.max_seq {
        Some(n) => answer(
            &mut s,
            "seq",
            &format!("Longest sequence that fits: {} tokens", group_digits(n as u128)),
            Some(("seq", n.to_string())),
            n == cfg.seq,
        ),
        None => answer(&mut s, "seq", "No sequence length fits", None, false),
    }
    let zero = zero_label(cfg.zero);
    match a.fewest_gpus {
        Some(n) => answer(
            &mut s,
            "gpus",
            &format!("Fewest GPUs that fit with {zero}: {}", group_digits(n as u128)),
            Some(("gpus", n.to_string())),
            n == cfg.gpus,
        ),
        None => answer(&mut s, "gpus", &format!("No number of GPUs fits with {zero}"), None, false),
    }
    match &a.smallest_gpu {
        Some((id, name)) => answer(&mut s, "gpu", &format!("Smallest GPU that fits: {name}"), Some(("gpu", id.clone())), *id == cfg.gpu),
        None => answer(&mut s, "gpu", "No GPU of the catalog fits", None, false),
    }
    s.push_str("</ul>");
    s
}

/// The cheapest single changes that make the configuration fit, as buttons (nothing when it
/// fits).
fn fixes_html(fixes: &[FoundFix], error: Option<&str>, unit: Unit) -> String {
    if let Some(e) = error {
        return format!("<p class=\"hint\" data-testid=\"fixes-error\">No change ranked: {}</p>", esc(e));
    }
    if fixes.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "<h3 id=\"fixes-h\">Cheapest changes that make it fit</h3><p class=\"hint\">Each is one change; its cost is the change in executed FLOPs per step and in the cost model's estimated step time (an estimate).</p><ul data-testid=\"fixes\" aria-labelledby=\"fixes-h\">",
    );
    for (i, f) in fixes.iter().enumerate() {
        let text = format!(
            "{}: fits, +{} headroom, {} step FLOPs, {} est. step time{}",
            f.label,
            format_bytes(u128::from(f.headroom), unit),
            f.flops,
            f.step_time,
            if f.changes_training { " (changes what is trained)" } else { "" }
        );
        s.push_str(&format!(
            "<li><button type=\"button\" class=\"answer\" data-testid=\"fix-{i}\" data-fix=\"{i}\" data-key=\"{}\" data-value=\"{}\">{}</button></li>",
            f.key,
            esc(&f.value),
            esc(&text)
        ));
    }
    s.push_str("</ul>");
    s
}

#[component]
pub fn Verdict() -> impl IntoView {
    let store = use_store();
    let first = StoredValue::new(true);
    let html = move || {
        let s = dom::timed("verdict", || store.config.with(|c| store.estimate.with(|e| figures(e, c))));
        if first.get_value() {
            first.set_value(false);
            dom::mark("trainmem:verdict");
        }
        s
    };
    view! { <div data-panel="result" role="status" aria-live="polite" inner_html=html></div> }
}

/// Marked each time the answers panel shows the current configuration's answers (the
/// page-speed script waits for it).
const ANSWERS_MARK: &str = "trainmem:answers";

/// The one-click answers, recomputed when the configuration changes (not its unit).
#[component]
pub fn Answers() -> impl IntoView {
    let store = use_store();
    let Answers { query, found } = use_answers();
    // Until the analysis worker answers for this configuration, the answers shown are those of
    // an earlier one (or none yet): said, and their buttons do nothing.
    let busy = Memo::new(move |_| found.with(|f| f.as_ref().is_none_or(|f| query.with(|q| f.query != *q))));
    // While a reply is due the panel keeps what it shows (the same text: no new HTML to parse
    // and lay out); the reply, or a change that needs none (the unit), renders it again.
    let shown = StoredValue::new(String::new());
    let html = move || {
        if busy.get() {
            return shown.get_value();
        }
        let s = store.config.with(|c| {
            found.with(|f| {
                f.as_ref().map(|f| answers_html(f, c) + &fixes_html(&f.fixes, f.fixes_error.as_deref(), c.unit)).unwrap_or_default()
            })
        });
        dom::mark(ANSWERS_MARK);
        shown.set_value(s.clone());
        s
    };
    let on_click = move |ev: leptos::ev::MouseEvent| {
        if busy.get_untracked() {
            return;
        }
        let target = ev.target().and_then(|t| t.dyn_into::<web_sys::Element>().ok());
        let fix = target.as_ref().and_then(|e| e.closest("[data-fix]").ok().flatten()).and_then(|e| e.get_attribute("data-fix"));
        if let Some(i) = fix.and_then(|i| i.parse::<usize>().ok()) {
            let pairs = found.with_untracked(|f| {
                let fix = f.as_ref().and_then(|f| f.fixes.get(i))?;
                Some(fix.pairs.iter().filter_map(|(k, v)| Some((find_key(k)?.name, v.clone()))).collect::<Vec<_>>())
            });
            if let Some(pairs) = pairs {
                let _ = store.apply(&pairs);
            }
            return;
        }
        let apply = target.and_then(|e| e.get_attribute("data-apply"));
        if let Some((k, v)) = apply.as_deref().and_then(|a| a.split_once('=')) {
            if let Some(key) = find_key(k) {
                let _ = store.apply(&[(key.name, v.to_string())]);
            }
        }
    };
    view! {
        <section class="answers" data-testid="answers" data-panel="answers" aria-label="What fits" aria-busy=move || busy.get().to_string() on:click=on_click inner_html=html></section>
    }
}
