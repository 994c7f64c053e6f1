//! The textbook's closed formulas for activation memory beside the exact accounting, and why
//! they differ for this configuration. Written as HTML text; an edit that keeps the same
//! formulas and notes only updates the figures in place (the MathML is not parsed again).

use crate::config::{Config, Unit};
use crate::estimator::activations::{textbook_differences, textbook_rows};
use crate::estimator::expr::with_formulas;
use crate::estimator::ledger::Bytes;
use crate::estimator::units::format_bytes;
use crate::estimator::Estimate;
use crate::ui::html::esc;
use crate::ui::state::use_store;
use leptos::html::Section;
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
         <td class=\"num\"><strong data-testid=\"textbook-exact\">{}</strong></td><td class=\"num\">—</td></tr>",
        format_bytes(exact, unit)
    );
    // The estimate's rows are numbers only (their formulas folded to their values): the
    // formulas come from the same rows built with their symbols.
    let formulas = with_formulas(|| textbook_rows(cfg));
    for r in &e.textbook {
        let formula = formulas.iter().find(|f| f.id == r.id).map_or_else(String::new, |f| f.expr.mathml(false));
        s.push_str(&format!(
            "<tr><td>{}<br><span class=\"math\"><math>{formula}</math></span><br><small>{}</small></td><td class=\"num\" data-testid=\"textbook-{}\" data-bytes=\"{}\">{}</td><td class=\"num\" data-testid=\"textbook-diff-{}\">{}</td></tr>",
            esc(&r.label),
            esc(r.source),
            esc(r.id),
            r.bytes,
            format_bytes(r.bytes, unit),
            esc(r.id),
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

/// The table's figures by cell: the exact bytes, then each formula's bytes and difference.
fn figures(e: &Estimate, unit: Unit) -> Vec<(String, String)> {
    let exact = e.memory.activations;
    let mut out = vec![("textbook-exact".to_string(), format_bytes(exact, unit))];
    for r in &e.textbook {
        let d = r.bytes as f64 - exact as f64;
        let pct = if exact > 0 { d / exact as f64 * 100.0 } else { 0.0 };
        let sign = if d >= 0.0 { "+" } else { "−" };
        out.push((format!("textbook-{}", r.id), format_bytes(r.bytes, unit)));
        out.push((format!("textbook-diff-{}", r.id), format!("{sign}{} ({sign}{:.0} %)", format_bytes(d.abs() as u128, unit), pct.abs())));
    }
    out
}

#[component]
pub fn Textbook() -> impl IntoView {
    let store = use_store();
    let notes = Memo::new(move |_| store.config.with(textbook_differences));
    let node = NodeRef::<Section>::new();
    // What the HTML was built for (the formulas and the notes): the same table is only patched.
    let built = StoredValue::new(None::<String>);
    Effect::new(move |_| {
        let Some(section) = node.get() else { return };
        crate::ui::dom::timed("textbook", || {
            store.config.with(|c| {
                store.estimate.with(|e| {
                    let Ok(e) = e else {
                        section.set_inner_html("");
                        built.set_value(None);
                        return;
                    };
                    let shape =
                        notes.with(|n| format!("{}|{}", e.textbook.iter().map(|r| r.id).collect::<Vec<_>>().join(","), n.join("|")));
                    if built.with_value(|b| b.as_deref() == Some(shape.as_str())) {
                        for (id, text) in figures(e, c.unit) {
                            if let Some(el) = section.query_selector(&format!("[data-testid=\"{id}\"]")).ok().flatten() {
                                el.set_text_content(Some(&text));
                            }
                        }
                    } else {
                        section.set_inner_html(&notes.with(|n| table(e, c, n)));
                        built.set_value(Some(shape));
                    }
                })
            })
        });
    });
    view! { <section class="textbook" aria-labelledby="tb-h" data-panel="textbook" node_ref=node></section> }
}
