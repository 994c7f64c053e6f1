//! The textbook's closed formulas for activation memory beside the exact accounting, and why
//! they differ for this configuration.
//!
//! Written with `view!`: a row per formula, built when the set of formulas changes (its MathML
//! then comes from the rows built with their symbols: the estimate's rows are numbers only); the
//! figures are reactive text, so an edit only updates them. As an HTML string patched in place it
//! cost 6.2 KB less brotli wasm: under the 10 KB bar (a keyed `<For>` cost 8.7 KB, a plain list
//! does here: the rows change only with the formulas).

use crate::estimator::activations::{textbook_differences, textbook_rows};
use crate::estimator::expr::with_formulas;
use crate::estimator::ledger::Bytes;
use crate::estimator::units::format_bytes;
use crate::ui::state::use_store;
use leptos::prelude::*;

/// A formula's bytes against the exact activations: "+75.59 GB (+265 %)".
fn versus(b: Bytes, exact: Bytes, unit: crate::config::Unit) -> String {
    let d = b as f64 - exact as f64;
    let pct = if exact > 0 { d / exact as f64 * 100.0 } else { 0.0 };
    let sign = if d >= 0.0 { "+" } else { "−" };
    format!("{sign}{} ({sign}{:.0} %)", format_bytes(d.abs() as u128, unit), pct.abs())
}

#[component]
pub fn Textbook() -> impl IntoView {
    let store = use_store();
    let notes = Memo::new(move |_| store.config.with(textbook_differences));
    let unit = Memo::new(move |_| store.config.with(|c| c.unit));
    // What an edit changes: the exact activations and each formula's bytes.
    let figures = Memo::new(move |_| {
        crate::ui::dom::timed("textbook", || {
            store.estimate.with(|e| {
                e.as_ref().ok().map(|e| (e.memory.activations, e.textbook.iter().map(|r| (r.id.as_str(), r.bytes)).collect::<Vec<_>>()))
            })
        })
    });
    // Which formulas the table holds, with their label, source and MathML (built when the set
    // changes).
    let ids =
        Memo::new(move |_| figures.with(|f| f.as_ref().map(|f| f.1.iter().map(|(id, _)| *id).collect::<Vec<_>>()).unwrap_or_default()));
    let rows = Memo::new(move |_| {
        ids.with(|ids| {
            let built = store.config.with_untracked(|c| with_formulas(|| textbook_rows(c)));
            ids.iter()
                .filter_map(|id| built.iter().find(|r| r.id.as_str() == *id))
                .map(|r| (r.id.as_str(), r.label.to_string(), r.source, format!("<math>{}</math>", r.expr.mathml(false))))
                .collect::<Vec<_>>()
        })
    });
    let exact = move || figures.with(|f| f.as_ref().map_or(0, |f| f.0));
    let bytes_of = move |id: &'static str| figures.with(|f| f.as_ref().and_then(|f| f.1.iter().find(|(i, _)| *i == id).map(|(_, b)| *b)));
    let table = move || {
        figures.with(Option::is_some).then(|| {
            view! {
                <h2 id="tb-h">"Textbook formulas vs. what the framework keeps"</h2>
                <div class="scroll"><table>
                    <thead><tr><th scope="col">"Activations of the whole model"</th><th scope="col">"Bytes"</th><th scope="col">"vs. exact"</th></tr></thead>
                    <tbody>
                        <tr>
                            <td><strong>"Exact: the tensors PyTorch saves for backward"</strong><br/><small>"this ledger's activation row (validated byte for byte against PyTorch)"</small></td>
                            <td class="num"><strong data-testid="textbook-exact">{move || format_bytes(exact(), unit.get())}</strong></td>
                            <td class="num">"—"</td>
                        </tr>
                        {move || {
                            rows.get()
                                .into_iter()
                                .map(|(id, label, source, math)| {
                                    view! {
                                        <tr>
                                            <td>{label}<br/><span class="math" inner_html=math></span><br/><small>{source}</small></td>
                                            <td class="num" data-testid=format!("textbook-{id}") data-bytes=move || bytes_of(id).map(|b| b.to_string())>
                                                {move || bytes_of(id).map(|b| format_bytes(b, unit.get()))}
                                            </td>
                                            <td class="num" data-testid=format!("textbook-diff-{id}")>{move || bytes_of(id).map(|b| versus(b, exact(), unit.get()))}</td>
                                        </tr>
                                    }
                                })
                                .collect_view()
                        }}
                    </tbody>
                </table></div>
                <h3>"Why they differ here"</h3>
                <ul>{move || notes.get().into_iter().map(|n| view! { <li>{n}</li> }).collect_view()}</ul>
            }
        })
    };
    view! { <section class="textbook" aria-labelledby="tb-h" data-panel="textbook">{table}</section> }
}
