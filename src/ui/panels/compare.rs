//! Compare: the page's configuration (A) beside a second one (B, from `compare=` or "duplicate
//! as B") — both verdicts, both bars on one scale, and the ledger's diff: every row with A's and
//! B's bytes and the change, rows whose formula changed highlighted with both formulas.
//!
//! A read-out written as HTML text ([`crate::ui::html`]), rebuilt when A or B changes. The
//! formulas come from [`explain`] of both configurations.
//!
//! The panel lives in the lazily loaded module ([`crate::ui::lazy`]): until something is
//! compared, the page shows its invitation ([`Shell`]), and the first B (from the button, the
//! course tools, `compare=`, an exercise) loads it.

use crate::config::{decode_query, Config};
use crate::estimator::expr::group_digits;
use crate::estimator::ledger::{Category, Row};
use crate::estimator::units::format_bytes;
use crate::estimator::{flatten, Estimate, EstimateError};
use crate::plots::{category_color, hex};
use crate::ui::html::esc;
use crate::ui::lazy::{Lazy, Slot};
use crate::ui::state::{compare_query, gpu_of, use_store};
use crate::words;
use leptos::prelude::*;
use wasm_bindgen::JsCast;

fn verdict(name: &str, e: &Result<Estimate, EstimateError>, cfg: &Config) -> String {
    match e {
        Err(err) => format!(
            "<div class=\"cmp-verdict bad\" data-testid=\"cmp-verdict-{name}\"><h3>{name}</h3><p>{}</p></div>",
            esc(&err.to_string())
        ),
        Ok(e) => {
            // The page's own verdict line for this configuration (the same function, the same
            // figure: nvidia-smi against the usable capacity).
            let v = words::verdict(e, cfg, &gpu_of(cfg).label());
            format!(
                "<div class=\"cmp-verdict{}\" data-testid=\"cmp-verdict-{name}\" data-fits=\"{}\" data-headroom=\"{}\"><h3>{name}: {}</h3><p data-testid=\"cmp-headline-{name}\">{}</p><p>nvidia-smi <strong data-bytes=\"{}\">{}</strong> · peak in use {}</p></div>",
                if v.fits { "" } else { " bad" },
                v.fits,
                v.headroom,
                esc(&e.model),
                esc(&v.headline),
                e.deciding_peak(),
                format_bytes(e.deciding_peak(), cfg.unit),
                format_bytes(e.memory.peak, cfg.unit)
            )
        }
    }
}

/// A stacked bar of the categories on a scale shared by A and B (`max` bytes wide).
fn bar(name: &str, e: &Estimate, max: u128, cfg: &Config) -> String {
    let mut parts = String::new();
    let mut said = Vec::new();
    for c in Category::ALL {
        let b: u128 = e.components.iter().filter(|r| r.category == c).map(|r| r.bytes).sum();
        if b == 0 {
            continue;
        }
        let w = b as f64 * 100.0 / max.max(1) as f64;
        parts.push_str(&format!("<span class=\"seg\" style=\"width:{w:.2}%;background:{}\"></span>", hex(category_color(c))));
        said.push(format!("{} {}", c.label(), format_bytes(b, cfg.unit)));
    }
    let cap = e.capacity as f64 * 100.0 / max.max(1) as f64;
    // What decides, as on the page's bar: nvidia-smi's figure, marked dashed.
    let smi = e.deciding_peak() as f64 * 100.0 / max.max(1) as f64;
    format!(
        "<div class=\"cmp-bar\" role=\"img\" data-testid=\"cmp-bar-{name}\" aria-label=\"{name}: {}; nvidia-smi will show {}; capacity {}\"><span class=\"cmp-name\" aria-hidden=\"true\">{name}</span><div class=\"track\">{parts}<span class=\"smi\" style=\"left:{smi:.2}%\"></span><span class=\"cap\" style=\"left:{cap:.2}%\"></span></div></div>",
        esc(&said.join(", ")),
        format_bytes(e.deciding_peak(), cfg.unit),
        format_bytes(e.capacity, cfg.unit)
    )
}

/// The ledger diff: A's rows in order, then B's rows A lacks.
fn diff(a: &Estimate, b: &Estimate, cfg: &Config) -> String {
    let (ra, rb) = (flatten(&a.components), flatten(&b.components));
    let find = |rows: &[&'_ Row], id: &str| rows.iter().find(|r| r.id.as_str() == id).map(|r| (*r).clone());
    let mut ids: Vec<&str> = ra.iter().map(|r| r.id.as_str()).collect();
    ids.extend(rb.iter().map(|r| r.id.as_str()).filter(|id| !ra.iter().any(|r| r.id.as_str() == *id)));
    ids.dedup();
    let unit = cfg.unit;
    let mut s = String::from(
        "<table class=\"cmp-diff\" data-testid=\"cmp-diff\"><caption>Ledger per GPU, A against B (highlighted: the formula changed)</caption>\
         <thead><tr><th scope=\"col\">Row</th><th scope=\"col\">A</th><th scope=\"col\">B</th><th scope=\"col\">B − A</th></tr></thead><tbody>",
    );
    let mut seen = Vec::new();
    for id in ids {
        if seen.contains(&id) {
            continue;
        }
        seen.push(id);
        let (x, y) = (find(&ra, id), find(&rb, id));
        let label = x.as_ref().or(y.as_ref()).map(|r| r.label.to_string()).unwrap_or_default();
        let bytes = |r: &Option<Row>| r.as_ref().map_or_else(|| "—".to_string(), |r| format_bytes(r.bytes, unit));
        let (fa, fb) = (x.as_ref().map(|r| r.expr.symbolic()), y.as_ref().map(|r| r.expr.symbolic()));
        let changed = fa != fb;
        let delta = match (&x, &y) {
            (Some(x), Some(y)) if y.bytes >= x.bytes => format!("+{}", format_bytes(y.bytes - x.bytes, unit)),
            (Some(x), Some(y)) => format!("−{}", format_bytes(x.bytes - y.bytes, unit)),
            (Some(_), None) => "only in A".into(),
            _ => "only in B".into(),
        };
        let signed = match (&x, &y) {
            (Some(x), Some(y)) => y.bytes as i128 - x.bytes as i128,
            (Some(x), None) => -(x.bytes as i128),
            (None, Some(y)) => y.bytes as i128,
            _ => 0,
        };
        s.push_str(&format!(
            "<tr data-row=\"{}\" data-delta=\"{signed}\"{}><th scope=\"row\">{}</th><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(id),
            if changed { " class=\"changed\" data-changed=\"true\"" } else { "" },
            esc(&label),
            bytes(&x),
            bytes(&y),
            esc(&delta)
        ));
        if changed {
            let f = |v: &Option<String>, r: &Option<Row>| {
                v.as_ref().map_or_else(
                    || "—".to_string(),
                    |v| format!("<code>{}</code> = {} B", esc(v), r.as_ref().map_or(String::new(), |r| group_digits(r.bytes))),
                )
            };
            s.push_str(&format!(
                "<tr class=\"changed formula-diff\"><td colspan=\"4\"><span class=\"what\">A:</span> {}<br><span class=\"what\">B:</span> {}</td></tr>",
                f(&fa, &x),
                f(&fb, &y)
            ));
        }
    }
    s.push_str(&format!(
        "</tbody><tfoot><tr><th scope=\"row\">Peak in use</th><td>{}</td><td>{}</td><td></td></tr><tr><th scope=\"row\">nvidia-smi (decides)</th><td>{}</td><td>{}</td><td></td></tr></tfoot></table>",
        format_bytes(a.memory.peak, unit),
        format_bytes(b.memory.peak, unit),
        format_bytes(a.deciding_peak(), unit),
        format_bytes(b.deciding_peak(), unit)
    ));
    s
}

fn html(a_cfg: &Config, b_cfg: &Config) -> String {
    let b_cfg = Config { unit: a_cfg.unit, ..b_cfg.clone() };
    let (a, b) = (crate::estimator::analyse(a_cfg).and_then(|a| a.explain()), crate::estimator::analyse(&b_cfg).and_then(|a| a.explain()));
    let mut s = format!("<div class=\"cmp-verdicts\">{}{}</div>", verdict("A", &a, a_cfg), verdict("B", &b, &b_cfg));
    if let (Ok(a), Ok(b)) = (&a, &b) {
        let max =
            [a.memory.total, b.memory.total, a.capacity, b.capacity, a.deciding_peak(), b.deciding_peak()].into_iter().max().unwrap_or(1);
        s.push_str(&bar("A", a, max, a_cfg));
        s.push_str(&bar("B", b, max, &b_cfg));
        s.push_str(&diff(a, b, a_cfg));
    }
    s
}

/// The panel's content as HTML: the "duplicate" invitation, or B's settings, A and B, and the
/// swap and stop buttons (one handler per event kind reads `data-action`).
fn panel_html(a: &Config, b: Option<&Config>, error: &str) -> String {
    let Some(b) = b else {
        return format!(
            "<p class=\"hint\">{INVITE}</p><button type=\"button\" data-action=\"duplicate\" data-testid=\"cmp-duplicate\">Duplicate as B</button>"
        );
    };
    format!(
        "<div class=\"field\"><label for=\"cmp-b\">B's settings (as in a link)</label>\
         <input id=\"cmp-b\" data-testid=\"cmp-b\" type=\"text\" spellcheck=\"false\" value=\"{}\">\
         <span class=\"field-error\" role=\"status\">{}</span></div><div class=\"cmp-body\">{}</div>\
         <div class=\"row\"><button type=\"button\" data-action=\"swap\" data-testid=\"cmp-swap\">Swap A and B</button>\
         <button type=\"button\" data-action=\"clear\" data-testid=\"cmp-clear\">Stop comparing</button></div>",
        esc(&compare_query(b)),
        esc(error),
        html(a, b)
    )
}

/// What the panel says before anything is compared.
const INVITE: &str = "Duplicate this configuration as B, then change A: the verdicts, the bars and the ledger show what changed.";

/// The page's side: the invitation, until there is a B to compare with; then the panel
/// (fetching the lazily loaded module).
#[component]
pub fn Shell() -> impl IntoView {
    let store = use_store();
    let comparing = Signal::derive(move || store.compare.with(Option::is_some));
    view! {
        <Slot panel=Lazy::Compare open=comparing>
            <section class="compare" data-panel="compare" data-testid="compare" aria-labelledby="cmp-h">
                <h2 id="cmp-h">"Compare A and B"</h2>
                <div>
                    <p class="hint">{INVITE}</p>
                    <button type="button" data-testid="cmp-duplicate" on:click=move |_| store.duplicate_as_b()>"Duplicate as B"</button>
                </div>
            </section>
        </Slot>
    }
}

/// The comparison (in the lazily loaded module).
#[component]
pub fn Compare() -> impl IntoView {
    let store = use_store();
    let error = RwSignal::new(String::new());
    let body = move || store.config.with(|a| store.compare.with(|b| error.with(|e| panel_html(a, b.as_ref(), e))));
    let on_click = move |ev: leptos::ev::MouseEvent| {
        let action = ev.target().and_then(|t| t.dyn_into::<web_sys::Element>().ok()).and_then(|e| e.get_attribute("data-action"));
        match action.as_deref() {
            Some("duplicate") => store.duplicate_as_b(),
            Some("swap") => store.swap_compare(),
            Some("clear") => store.set_compare(None),
            _ => {}
        }
    };
    let on_change = move |ev: leptos::ev::Event| {
        let Some(input) = ev.target().and_then(|t| t.dyn_into::<web_sys::HtmlInputElement>().ok()).filter(|i| i.id() == "cmp-b") else {
            return;
        };
        let d = decode_query(&input.value());
        error.set(d.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "));
        store.set_compare(Some(d.config));
    };
    view! {
        <section class="compare" data-panel="compare" data-testid="compare" aria-labelledby="cmp-h" on:click=on_click on:change=on_change>
            <h2 id="cmp-h">"Compare A and B"</h2>
            <div inner_html=body></div>
        </section>
    }
}
