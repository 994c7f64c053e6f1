//! The verdict: does the step fit and the key figures; and the one-click answers
//! ([`crate::estimator::sweep::answers`]): the largest micro-batch, the longest sequence, the
//! fewest GPUs and the smallest GPU that fit, each a button that applies it.
//!
//! When the configuration does not fit, the answers also list the three cheapest single changes
//! that make it fit ([`crate::estimator::plan::cheapest_fixes`]), each with its new headroom and
//! its cost (executed FLOPs and the cost model's estimated step time), each a button that
//! applies it.
//!
//! Both are rebuilt whole on each change, as HTML text ([`crate::ui::html`]); the answers'
//! buttons carry the keys they set (`data-apply="batch=6"`), a fix's button its index
//! (`data-fix="0"`: a change may set several keys, applied together), and one click handler
//! applies them through the store's setters.

use crate::config::{Config, Unit, KEYS};
use crate::estimator::cost::Assumptions;
use crate::estimator::expr::group_digits;
use crate::estimator::plan::{cheapest_fixes, Fix, PlanError, DEFAULT_FIXES};
use crate::estimator::sweep::{answers, Answers as Found};
use crate::estimator::units::{format_bytes, format_count};
use crate::estimator::{Estimate, EstimateError};
use crate::plots::zero_label;
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
    match a.smallest_gpu {
        Some(g) => answer(&mut s, "gpu", &format!("Smallest GPU that fits: {}", g.name), Some(("gpu", g.id.to_string())), g.id == cfg.gpu),
        None => answer(&mut s, "gpu", "No GPU of the catalog fits", None, false),
    }
    s.push_str("</ul>");
    s
}

fn pct(v: f64) -> String {
    if v.abs() < 0.05 {
        "±0 %".into()
    } else {
        format!("{v:+.1} %")
    }
}

/// The cheapest single changes that make the configuration fit, as buttons (nothing when it
/// fits).
fn fixes_html(fixes: &Result<Vec<Fix>, PlanError>, unit: Unit) -> String {
    let fixes = match fixes {
        Ok(f) if f.is_empty() => return String::new(),
        Ok(f) => f,
        Err(e) => return format!("<p class=\"hint\" data-testid=\"fixes-error\">No change ranked: {}</p>", esc(&e.to_string())),
    };
    let mut s = String::from(
        "<h3 id=\"fixes-h\">Cheapest changes that make it fit</h3><p class=\"hint\">Each is one change; its cost is the change in executed FLOPs per step and in the cost model's estimated step time (an estimate).</p><ul data-testid=\"fixes\" aria-labelledby=\"fixes-h\">",
    );
    for (i, f) in fixes.iter().enumerate() {
        let text = format!(
            "{}: fits, +{} headroom, {} step FLOPs, {} est. step time{}",
            f.label,
            format_bytes(f.headroom.max(0) as u128, unit),
            pct(f.flops_pct),
            pct(f.step_time_pct),
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

/// The keys (and values) on which a fix's configuration differs from `from`, as the codec
/// spells them: what applying the fix sets.
fn fix_pairs(from: &Config, fix: &Config) -> Vec<(&'static str, String)> {
    KEYS.iter()
        .filter(|k| k.name != "unit")
        .filter_map(|k| {
            let v = (k.get)(fix);
            (v != (k.get)(from)).then_some((k.name, v))
        })
        .collect()
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

/// The one-click answers, recomputed when the configuration changes (not its unit).
#[component]
pub fn Answers() -> impl IntoView {
    let store = use_store();
    let key = Memo::new(move |_| store.config.with(|c| Config { unit: Unit::Gb, ..c.clone() }));
    let found = Memo::new(move |_| dom::timed("answers", || key.with(answers)));
    let fixes = Memo::new(move |_| dom::timed("fixes", || key.with(|k| cheapest_fixes(k, &Assumptions::default(), DEFAULT_FIXES))));
    let html = move || store.config.with(|c| found.with(|a| answers_html(a, c)) + &fixes.with(|f| fixes_html(f, c.unit)));
    let on_click = move |ev: leptos::ev::MouseEvent| {
        let target = ev.target().and_then(|t| t.dyn_into::<web_sys::Element>().ok());
        let fix = target.as_ref().and_then(|e| e.closest("[data-fix]").ok().flatten()).and_then(|e| e.get_attribute("data-fix"));
        if let Some(i) = fix.and_then(|i| i.parse::<usize>().ok()) {
            let pairs =
                fixes.with_untracked(|f| f.as_ref().ok().and_then(|f| f.get(i)).map(|f| key.with_untracked(|k| fix_pairs(k, &f.config))));
            if let Some(pairs) = pairs {
                let _ = store.apply(&pairs);
            }
            return;
        }
        let apply = target.and_then(|e| e.get_attribute("data-apply"));
        if let Some((k, v)) = apply.as_deref().and_then(|a| a.split_once('=')) {
            if let Some(key) = crate::config::KEYS.iter().find(|x| x.name == k).map(|x| x.name) {
                let _ = store.apply(&[(key, v.to_string())]);
            }
        }
    };
    view! { <section class="answers" data-testid="answers" data-panel="answers" aria-label="What fits" on:click=on_click inner_html=html></section> }
}
