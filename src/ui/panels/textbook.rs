//! The textbook's closed formulas for activation memory beside the exact accounting, and why
//! they differ for this configuration. A read-out rebuilt whole on each change, as HTML text.

use crate::config::Config;
use crate::estimator::activations::textbook_differences;
use crate::estimator::ledger::Bytes;
use crate::estimator::units::format_bytes;
use crate::estimator::Estimate;
use crate::ui::html::esc;
use crate::ui::state::use_store;
use leptos::prelude::*;

fn table(e: &Estimate, cfg: &Config, notes: &[String]) -> String {
    let unit = cfg.unit;
    let exact = e.memory.activations;
    let diff = |b: Bytes| {
        let d = b as f64 - exact as f64;
        let pct = if exact > 0 { d / exact as f64 * 100.0 } else { 0.0 };
        let sign = if d >= 0.0 { "+" } else { "−" };
        format!("{sign}{} ({sign}{:.0} %)", format_bytes(d.abs() as u128, unit), pct.abs())
    };
    let mut s = format!(
        "<h2 id=\"tb-h\">Textbook formulas vs. what the framework keeps</h2><div class=\"scroll\"><table>\
         <thead><tr><th scope=\"col\">Activations of the whole model</th><th scope=\"col\">Bytes</th><th scope=\"col\">vs. exact</th></tr></thead><tbody>\
         <tr><td><strong>Exact: the tensors PyTorch saves for backward</strong><br><small>this ledger's activation row (validated byte for byte against PyTorch)</small></td>\
         <td class=\"num\"><strong>{}</strong></td><td class=\"num\">—</td></tr>",
        format_bytes(exact, unit)
    );
    for r in &e.textbook {
        s.push_str(&format!(
            "<tr><td>{}<br><span class=\"math\"><math>{}</math></span><br><small>{}</small></td><td class=\"num\" data-testid=\"textbook-{}\">{}</td><td class=\"num\">{}</td></tr>",
            esc(&r.label),
            r.expr.mathml(false),
            esc(r.source),
            esc(r.id),
            format_bytes(r.bytes, unit),
            diff(r.bytes)
        ));
    }
    s.push_str("</tbody></table></div><h3>Why they differ here</h3><ul>");
    for n in notes {
        s.push_str(&format!("<li>{}</li>", esc(n)));
    }
    s.push_str("</ul>");
    s
}

#[component]
pub fn Textbook() -> impl IntoView {
    let store = use_store();
    let notes = Memo::new(move |_| store.config.with(textbook_differences));
    let html = move || store.config.with(|c| store.estimate.with(|e| e.as_ref().map_or(String::new(), |e| notes.with(|n| table(e, c, n)))));
    view! { <section class="textbook" aria-labelledby="tb-h" data-panel="textbook" inner_html=html></section> }
}
