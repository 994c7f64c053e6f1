//! The verdict: does the step fit and the key figures; and the one-click answers
//! ([`crate::estimator::sweep::answers`]): the largest micro-batch, the longest sequence, the
//! fewest GPUs and the smallest GPU that fit, each a button that applies it.
//!
//! When the configuration does not fit, the answers also list the three cheapest single changes
//! that make it fit ([`crate::estimator::plan::cheapest_fixes`]), each with its new headroom and
//! its cost (executed FLOPs and the cost model's estimated step time), each a button that
//! applies it; where no single change does, they say so, and their button asks the planner to
//! search for combinations that fit (it opens, searches, and widens its own search where
//! nothing of its default space fits: [`crate::ui::panels::plan`]).
//!
//! Both come from [`crate::ui::analysis`]: from the analysis worker where there is one, so the
//! panel lags a reply behind a change and says so (`aria-busy="true"`, its buttons inert until
//! then). Both are rebuilt whole on each change, as HTML text ([`crate::ui::html`]); the answers'
//! buttons carry the keys they set (`data-apply="batch=6"`), a fix's button its index
//! (`data-fix="0"`: a change may set several keys, applied together), and one click handler
//! applies them through the store's setters.
//!
//! The verdict is written with `view!`: the same markup as an HTML string cost 4.1 KB less
//! brotli wasm (scripts/build.sh's size table: 545,782 against 549,842 B), under the 10 KB bar.
//! The answers stay an HTML string for now (not measured).
//!
//! The verdict's line is [`crate::words::verdict`]'s, the one every panel writes. A fix applied
//! here is remembered with what it promised ([`crate::ui::state::Applied`]): when the
//! configuration it led to still does not fit, or fits with under 2 % of the card to spare, the
//! verdict says so and the answers offer the next changes ([`crate::next_change`]), each
//! re-estimated as the verdict is, in place of the fixes.

use crate::answers::{key_of, Found, FoundFix};
use crate::config::{encode_query, find_key, Config, Unit};
use crate::estimator::expr::group_digits;
use crate::estimator::units::{format_bytes, format_count};
use crate::estimator::{Estimate, EstimateError};
use crate::next_change::{next_changes, NextChange};
use crate::plots::zero_label;
use crate::ui::analysis::{use_answers, Answers};
use crate::ui::dom;
use crate::ui::html::esc;
use crate::ui::state::{gpu_of, use_store, Applied, GpuChoice};
use crate::words;
use leptos::prelude::*;
use wasm_bindgen::JsCast;

/// One figure of the verdict's `<dl class="stats">`.
fn stat(dt: String, testid: &'static str, bytes: Option<String>, dd: String, sub: Option<String>) -> impl IntoView {
    view! {
        <div>
            <dt>{dt}</dt>
            <dd data-testid=(!testid.is_empty()).then_some(testid) data-bytes=bytes>{dd}{sub.map(|s| view! { <span class="sub">{s}</span> })}</dd>
        </div>
    }
}

/// What the verdict says about the change last applied from the answers panel, while the page
/// shows the configuration it led to: whether it kept its promise, and when it did not (or left
/// under 2 % to spare), that the next changes are listed under it.
fn applied_note(applied: &Applied, v: &words::Verdict, capacity: u128, unit: Unit) -> Option<String> {
    let promised = applied.promised.map_or_else(String::new, |p| format!(" (it promised +{} headroom)", format_bytes(u128::from(p), unit)));
    let pct = words::headroom_pct(v.headroom, capacity);
    Some(if !v.fits {
        format!(
            "After “{}”{promised}: it still does not fit — {} more are needed. The next changes are listed below, each checked the way this verdict is.",
            applied.label,
            format_bytes(v.headroom.unsigned_abs(), unit)
        )
    } else if v.tight {
        format!(
            "After “{}”{promised}: it fits, with only {} ({pct:.1} %) to spare — under {} %, a different library version or allocator setting can tip it over. The next changes are listed below.",
            applied.label,
            format_bytes(v.headroom.unsigned_abs(), unit),
            words::TIGHT_PCT
        )
    } else {
        format!(
            "After “{}”{promised}: it fits, with {} ({pct:.1} %) to spare.",
            applied.label,
            format_bytes(v.headroom.unsigned_abs(), unit)
        )
    })
}

fn figures(e: &Result<Estimate, EstimateError>, cfg: &Config, applied: Option<&Applied>) -> AnyView {
    let e = match e {
        Err(e) => {
            let why = e.to_string();
            return view! {
                <div class="verdict bad" data-testid="estimate-error"><p><strong>"This configuration cannot be estimated: "</strong>{why}</p></div>
            }
            .into_any();
        }
        Ok(e) => e,
    };
    let unit = cfg.unit;
    let gpu = gpu_of(cfg);
    // The verdict decides on what nvidia-smi will show (the caching allocator replayed) where
    // it was simulated, else on the allocated peak with what lives outside the allocator.
    let v = words::verdict(e, cfg, &gpu.label());
    let note = applied.and_then(|a| applied_note(a, &v, e.capacity, unit));
    let tight = (v.tight && note.is_none()).then(|| {
        format!(
            "Only {:.1} % of the card is left free: under {} %, a different library version or allocator setting can tip it over. The next changes are listed below.",
            words::headroom_pct(v.headroom, e.capacity),
            words::TIGHT_PCT
        )
    });
    let class = if !v.fits {
        "verdict bad"
    } else if v.tight {
        "verdict tight"
    } else {
        "verdict"
    };
    let peak = e.memory.peak;
    let bytes = |b: u128| Some(b.to_string());
    let smi = match (e.memory.nvidia_smi, e.memory.reserved_peak) {
        (Some(smi), Some(res)) => Some(stat(
            "nvidia-smi will show".into(),
            "nvidia-smi-bytes",
            bytes(smi),
            format_bytes(smi, unit),
            Some(format!(
                "{} reserved (simulated) + {} context, cuBLAS, NCCL{}",
                format_bytes(res, unit),
                format_bytes(smi.saturating_sub(res), unit),
                if e.paged_states() > 0 { ", paged optimizer states" } else { "" }
            )),
        )),
        _ => None,
    };
    let capacity_sub = match gpu {
        GpuChoice::Catalog(g) => words::marketed_gb(g.name).map(|m| format!("usable; sold as {m} GB")),
        GpuChoice::Custom(_) => Some("custom size".into()),
    };
    let params = format!("{} ({} trainable)", format_count(e.parameter_count), format_count(e.trainable_parameter_count));
    let host = (e.memory.host > 0).then(|| format!("Host (CPU) memory per GPU process: {}", format_bytes(e.memory.host, unit)));
    let warnings = (!e.warnings.is_empty()).then(|| {
        let items = e.warnings.iter().map(|w| view! { <li>{w.clone()}</li> }).collect_view();
        view! { <ul class="warnings">{items}</ul> }
    });
    // What the frameworks' logs will print, from the same figures (estimator::logs).
    let logs = crate::estimator::logs::log_lines(cfg, e);
    let logs = (!logs.is_empty()).then(|| {
        let items = logs.into_iter().map(|l| view! { <li title=l.source>{l.framework}": "<code>{l.line}</code></li> }).collect_view();
        view! {
            <details class="logs" data-testid="verdict-logs">
                <summary>"What the logs will say"</summary>
                <ul>{items}</ul>
            </details>
        }
    });
    view! {
        <div class=class data-testid="verdict" data-fits=v.fits.to_string() data-tight=v.tight.to_string() data-headroom=v.headroom.to_string()>
            <p class="headline" data-testid="verdict-headline">{v.headline}</p>
            {note.map(|n| view! { <p class="after-fix" data-testid="verdict-after-fix">{n}</p> })}
            {tight.map(|n| view! { <p class="after-fix" data-testid="verdict-tight">{n}</p> })}
            <dl class="stats">
                {stat("Peak in use per GPU".into(), "peak-bytes", bytes(peak), format_bytes(peak, unit), Some(format!("at: {}", e.memory.peak_event)))}
                {smi}
                {stat("Allocated peak".into(), "allocated-peak-bytes", bytes(e.memory.allocated_peak), format_bytes(e.memory.allocated_peak, unit), Some("max_memory_allocated".into()))}
                {stat("Sum of components".into(), "total-bytes", bytes(e.memory.total), format_bytes(e.memory.total, unit), None)}
                {stat("GPU capacity".into(), "capacity-bytes", bytes(e.capacity), format_bytes(e.capacity, unit), capacity_sub)}
                {stat(format!("Cluster ({})", words::count_of(e.layout.gpus, "GPU", "GPUs")), "cluster-bytes", bytes(e.cluster_total()), format_bytes(e.cluster_total(), unit), None)}
                <div><dt>"Parameters"</dt><dd data-testid="param-count" data-count=e.parameter_count.to_string()>{params}</dd></div>
                {stat("Tokens per step".into(), "", None, group_digits(e.layout.tokens_per_step), None)}
            </dl>
            {host.map(|h| view! { <p class="host">{h}</p> })}
            {logs}
            {warnings}
        </div>
    }
    .into_any()
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
/// fits). When it does not fit and no single change makes it, that is said, with a button to
/// the planner where the page has one (`plan`: it searches combinations of changes).
fn fixes_html(fixes: &[FoundFix], error: Option<&str>, unit: Unit, fits: bool, plan: bool) -> String {
    if let Some(e) = error {
        return format!("<p class=\"hint\" data-testid=\"fixes-error\">No change ranked: {}</p>", esc(e));
    }
    if fixes.is_empty() {
        return if fits { String::new() } else { no_single_fix_html(plan) };
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

/// What the answers say when the configuration does not fit and no single change makes it
/// (a 70B full fine-tune on 8 × 80 GB at 8K: the sharded states alone exceed the card, and
/// more GPUs do not shrink the activations): combined changes are the planner's, so the line
/// leads there, with a button that opens it where the page places it.
fn no_single_fix_html(plan: bool) -> String {
    let lead = "No single change makes it fit: it takes several at once (more GPUs with recomputation, sharding, offloading or a smaller micro-batch).";
    if plan {
        format!(
            "<p class=\"hint\" data-testid=\"fixes-none\">{lead} <button type=\"button\" class=\"answer\" data-open-plan=\"\" data-testid=\"fixes-plan\">Search the planner for combinations that fit</button></p>"
        )
    } else {
        format!("<p class=\"hint\" data-testid=\"fixes-none\">{lead} The full page's planner searches combinations of changes.</p>")
    }
}

/// Asks the planner to search for what fits ([`crate::ui::state::Store::plan_asks`]), opens it
/// (fetching its module) and brings it into view, its heading focused so that a keyboard or
/// screen-reader user lands where the button sent them.
fn open_plan(store: crate::ui::state::Store, more: crate::ui::lazy::More) {
    store.plan_asks.update(|n| *n += 1);
    more.request(crate::ui::lazy::Lazy::Plan);
    let Some(doc) = web_sys::window().and_then(|w| w.document()) else { return };
    if let Ok(Some(section)) = doc.query_selector("[data-panel=plan]") {
        section.scroll_into_view();
    }
    if let Some(h) = doc.get_element_by_id("plan-h") {
        let _ = h.set_attribute("tabindex", "-1");
        if let Ok(h) = h.dyn_into::<web_sys::HtmlElement>() {
            let _ = h.focus();
        }
    }
}

#[component]
pub fn Verdict() -> impl IntoView {
    let store = use_store();
    let first = StoredValue::new(true);
    // The applied change is spoken of only while the page shows the configuration it led to.
    Effect::new(move |_| {
        let query = store.config.with(|c| encode_query(&key_of(c)));
        if store.applied.with_untracked(|a| a.as_ref().is_some_and(|a| a.query != query)) {
            store.applied.set(None);
        }
    });
    let body = move || {
        let v = dom::timed("verdict", || {
            store.applied.with(|a| {
                store.config.with(|c| store.estimate.with(|e| figures(e, c, a.as_ref().filter(|a| a.query == encode_query(&key_of(c))))))
            })
        });
        if first.get_value() {
            first.set_value(false);
            dom::mark("trainmem:verdict");
        }
        v
    };
    view! { <div data-panel="verdict" role="status" aria-live="polite">{body}</div> }
}

/// On a narrow screen the verdict's line stays pinned at the top of the page while the form
/// is scrolled and edited (the stylesheet shows it below 860 px only): every edit stays one
/// glance from its result. The same line as the verdict's ([`words::verdict`]), with the card's
/// short name; hidden from screen readers, which have the verdict itself.
#[component]
pub fn Pin() -> impl IntoView {
    let store = use_store();
    let line = Memo::new(move |_| {
        store.config.with(|c| {
            store.estimate.with(|e| match e {
                Ok(e) => {
                    let gpu = match gpu_of(c) {
                        GpuChoice::Catalog(g) => words::gpu_short(&g),
                        g => g.label(),
                    };
                    let v = words::verdict(e, c, &gpu);
                    let class = if !v.fits {
                        "pin bad"
                    } else if v.tight {
                        "pin tight"
                    } else {
                        "pin"
                    };
                    (class, v.headline, v.fits.to_string(), v.headroom.to_string())
                }
                Err(e) => ("pin bad", format!("Cannot be estimated: {e}"), "false".into(), String::new()),
            })
        })
    });
    view! {
        <div class=move || line.with(|l| l.0) data-testid="verdict-pin" aria-hidden="true"
            data-fits=move || line.with(|l| l.2.clone()) data-headroom=move || line.with(|l| l.3.clone())>
            {move || line.with(|l| l.1.clone())}
        </div>
    }
}

/// Marked each time the answers panel shows the current configuration's answers (the
/// page-speed script waits for it).
const ANSWERS_MARK: &str = "trainmem:answers";

/// The next changes ([`next_changes`]) as buttons, each with the headroom its own link shows.
fn next_html(next: &[NextChange], unit: Unit) -> String {
    if next.is_empty() {
        return "<p class=\"hint\" data-testid=\"next-none\">No single change leaves 2 % of the card free: see the Plan panel for combined changes.</p>".into();
    }
    let mut s = String::from(
        "<h3 id=\"next-h\">Next change: each leaves at least 2 % of the card free</h3><p class=\"hint\">Each is one change, re-estimated as the verdict above is (nvidia-smi against the usable capacity); its cost is the change in the cost model's estimated step time.</p><ul data-testid=\"next\" aria-labelledby=\"next-h\">",
    );
    for (i, n) in next.iter().enumerate() {
        let time = if n.step_time_pct.abs() < 0.05 { "±0 %".to_string() } else { format!("{:+.1} %", n.step_time_pct) };
        let text = format!(
            "{}: fits, +{} headroom ({:.1} %), {time} est. step time{}",
            n.label,
            format_bytes(u128::from(n.headroom), unit),
            n.headroom_pct,
            if n.changes_training { " (changes what is trained)" } else { "" }
        );
        s.push_str(&format!(
            "<li><button type=\"button\" class=\"answer\" data-testid=\"next-{i}\" data-next=\"{i}\" data-headroom=\"{}\">{}</button></li>",
            n.headroom,
            esc(&text)
        ));
    }
    s.push_str("</ul>");
    s
}

/// The one-click answers, recomputed when the configuration changes (not its unit).
#[component]
pub fn Answers() -> impl IntoView {
    let store = use_store();
    let Answers { query, found, plan_placed } = use_answers();
    // Until the analysis worker answers for this configuration, the answers shown are those of
    // an earlier one (or none yet): said, and their buttons do nothing.
    let busy = Memo::new(move |_| found.with(|f| f.as_ref().is_none_or(|f| query.with(|q| f.query != *q))));
    // The next changes, when the configuration fits with under 2 % to spare or a change just
    // applied did not make it fit (computed here, only then).
    let next = Memo::new(move |_| {
        let due = store.estimate.with(|e| {
            let Ok(e) = e else { return false };
            let v = store.config.with(|c| words::verdict(e, c, ""));
            let failed = !v.fits && store.applied.with(|a| a.as_ref().is_some_and(|a| query.with(|q| a.query == *q)));
            v.tight || failed
        });
        due.then(|| store.config.with(|c| next_changes(&key_of(c), 3)))
    });
    // Whether the configuration fits, as the verdict says (no fixes are offered when it does).
    let fits =
        Memo::new(move |_| store.estimate.with(|e| e.as_ref().map_or(true, |e| store.config.with(|c| words::verdict(e, c, "").fits))));
    let more = crate::ui::lazy::use_more();
    // While a reply is due the panel keeps what it shows (the same text: no new HTML to parse
    // and lay out); the reply, or a change that needs none (the unit), renders it again.
    let shown = StoredValue::new(String::new());
    let html = move || {
        if busy.get() {
            return shown.get_value();
        }
        let s = store.config.with(|c| {
            found.with(|f| {
                let Some(f) = f.as_ref() else { return String::new() };
                let mut s = answers_html(f, c);
                match next.with(|n| n.as_ref().map(|n| next_html(n, c.unit))) {
                    // After a change that did not keep its promise, only changes checked as the
                    // verdict is are offered.
                    Some(n) => s.push_str(&n),
                    None => s.push_str(&fixes_html(&f.fixes, f.fixes_error.as_deref(), c.unit, fits.get(), plan_placed)),
                }
                s
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
        let attr =
            |name: &str| target.as_ref().and_then(|e| e.closest(&format!("[{name}]")).ok().flatten()).and_then(|e| e.get_attribute(name));
        if let Some(i) = attr("data-fix").and_then(|i| i.parse::<usize>().ok()) {
            let fix = found.with_untracked(|f| {
                let fix = f.as_ref().and_then(|f| f.fixes.get(i))?;
                let pairs = fix.pairs.iter().filter_map(|(k, v)| Some((find_key(k)?.name, v.clone()))).collect::<Vec<_>>();
                Some((fix.label.clone(), fix.headroom, pairs))
            });
            if let Some((label, headroom, pairs)) = fix {
                let _ = store.apply_promised(label, Some(headroom), &pairs);
            }
            return;
        }
        if let Some(i) = attr("data-next").and_then(|i| i.parse::<usize>().ok()) {
            if let Some(n) = next.with_untracked(|n| n.as_ref().and_then(|n| n.get(i).cloned())) {
                let _ = store.apply_promised(n.label, Some(n.headroom), &n.pairs);
            }
            return;
        }
        if attr("data-open-plan").is_some() {
            open_plan(store, more);
            return;
        }
        if let Some((k, v)) = attr("data-apply").as_deref().and_then(|a| a.split_once('=')) {
            if let Some(key) = find_key(k) {
                let _ = store.apply(&[(key.name, v.to_string())]);
            }
        }
    };
    view! {
        <section class="answers" data-testid="answers" data-panel="answers" aria-label="What fits" aria-busy=move || busy.get().to_string() on:click=on_click inner_html=html></section>
    }
}
