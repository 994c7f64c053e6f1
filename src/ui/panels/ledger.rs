//! The ledger: every component of one GPU's memory with its bytes and share; each row opens to
//! its formula, the same formula with this configuration's numbers, and its source.
//!
//! A read-out written as HTML text ([`crate::ui::html`]): a few dozen rows, far cheaper in wasm
//! than a keyed list of reactive rows. When an edit keeps the same rows, only their figures are
//! updated in place; otherwise the list is rebuilt. Which rows are open is kept across rebuilds;
//! their formulas come from [`explain`], run only while some row is open. A row opened or
//! closed by the visitor is filled or emptied in place (one `toggle` listener on the list), so
//! focus stays where it was.

use crate::config::{Config, Unit};
use crate::course::exercises::category_name;
use crate::estimator::expr::group_digits;
use crate::estimator::ledger::{Bytes, Row};
use crate::estimator::units::format_bytes;
use crate::estimator::{by_category, Estimate, EstimateError};
use crate::plots::{category_color, hex};
use crate::ui::dom;
use crate::ui::html::esc;
use crate::ui::state::use_store;
use leptos::html::Section;
use leptos::prelude::*;
use wasm_bindgen::closure::Closure;
use wasm_bindgen::JsCast;

/// A row's key: stable while the row exists.
fn row_key(r: &Row, depth: usize, host: bool) -> String {
    format!("{}{}:{depth}:{}", if host { "host:" } else { "" }, r.id, r.label)
}

/// The row behind a key.
fn find<'a>(rows: &'a [Row], depth: usize, host: bool, key: &str) -> Option<&'a Row> {
    rows.iter().find_map(|r| if row_key(r, depth, host) == key { Some(r) } else { find(&r.children, depth + 1, host, key) })
}

/// A row's formula, substituted formula, symbols, source and note.
fn formula(r: &Row) -> String {
    let mut s = format!(
        "<div class=\"formula\"><div class=\"math-row\"><span class=\"what\">Formula</span><span class=\"math\"><math display=\"block\">{}</math></span></div>\
         <div class=\"math-row\"><span class=\"what\">Here</span><span class=\"math\"><math display=\"block\"><mrow>{}<mo>=</mo><mn>{}</mn><mtext>&#160;B</mtext></mrow></math></span></div>",
        r.expr.mathml(false),
        r.expr.mathml(true),
        group_digits(r.bytes)
    );
    let symbols = r.expr.symbols();
    if !symbols.is_empty() {
        s.push_str("<ul class=\"legend\">");
        for (sym, v) in symbols {
            let name = if sym.sub.is_empty() { sym.base.to_string() } else { format!("{}_{}", sym.base, sym.sub) };
            s.push_str(&format!("<li><span class=\"sym\">{}</span> = {} — {}</li>", esc(&name), group_digits(v), esc(sym.meaning)));
        }
        s.push_str("</ul>");
    }
    s.push_str(&format!("<p class=\"source\"><strong>Source: </strong>{}</p>", esc(r.source)));
    if !r.note.is_empty() {
        s.push_str(&format!("<p class=\"note\">{}</p>", esc(&r.note)));
    }
    s.push_str(&format!("<p class=\"plain\"><code>{}</code></p></div>", esc(&r.expr.symbolic())));
    s
}

/// One list of the ledger (the GPU's, or the host's) and what its rows are written with.
struct List<'a> {
    host: bool,
    total: Bytes,
    unit: Unit,
    open: &'a [String],
    explained: Option<&'a Estimate>,
}

/// The rows of one list, depth first; open rows carry their formula from the explained
/// estimate.
fn rows(out: &mut String, rows: &[Row], depth: usize, list: &List) {
    let (host, total, unit) = (list.host, list.total, list.unit);
    for r in rows {
        let key = row_key(r, depth, host);
        let share = if total > 0 { r.bytes as f64 * 100.0 / total as f64 } else { 0.0 };
        let is_open = list.open.contains(&key);
        let body = if is_open {
            list.explained.and_then(|e| find(if host { &e.host } else { &e.components }, 0, host, &key)).map(formula).unwrap_or_default()
        } else {
            String::new()
        };
        out.push_str(&format!(
            "<li class=\"row\" data-row=\"{}\" data-depth=\"{depth}\" style=\"margin-left:{}px\"><details data-key=\"{}\"{}><summary>\
             <span class=\"swatch\" style=\"background:{}\" aria-hidden=\"true\"></span><span class=\"label\">{}</span>\
             <span class=\"bytes\" data-bytes=\"{}\">{}</span>\
             <span class=\"share\" aria-label=\"{share:.1} percent of the sum\"><span class=\"share-bar\" style=\"width:{:.1}%\"></span><span class=\"share-num\">{share:.1} %</span></span>\
             </summary><div class=\"slot\">{body}</div></details></li>",
            esc(r.id.as_str()),
            depth * 22,
            esc(&key),
            if is_open { " open" } else { "" },
            hex(category_color(r.category)),
            esc(&r.label),
            r.bytes,
            format_bytes(r.bytes, unit),
            share.min(100.0),
        ));
        self::rows(out, &r.children, depth + 1, list);
    }
}

/// The ledger's categories: each one's sum of rows and what of it is resident at the step's
/// peak (the figures the bar and the charts stack, under the same names), then what nvidia-smi
/// adds above the peak and the deciding total.
fn categories(e: &Estimate, unit: Unit) -> String {
    let at_peak = e.timeline.peak_event().map_or([0; 6], |ev| ev.by_category);
    let sums = by_category(e);
    let mut s = String::from(
        "<table class=\"by-category\" data-testid=\"ledger-categories\"><caption>By category: every row of a category added up, and what of it is in use at the step's peak (what the bar and the charts draw)</caption>\
         <thead><tr><th scope=\"col\">Category</th><th scope=\"col\">Sum of rows</th><th scope=\"col\">At the peak</th></tr></thead><tbody>",
    );
    for (i, (c, sum)) in sums.iter().enumerate() {
        let key = category_name(*c);
        s.push_str(&format!(
            "<tr data-category=\"{key}\"><th scope=\"row\"><span class=\"swatch\" style=\"background:{}\" aria-hidden=\"true\"></span> {}</th>\
             <td data-testid=\"cat-sum-{key}\" data-bytes=\"{sum}\">{}</td><td data-testid=\"cat-peak-{key}\" data-bytes=\"{}\">{}</td></tr>",
            hex(category_color(*c)),
            esc(c.label()),
            format_bytes(*sum, unit),
            at_peak[i],
            format_bytes(at_peak[i], unit)
        ));
    }
    s.push_str(&format!(
        "</tbody><tfoot><tr><th scope=\"row\">Total</th><td data-testid=\"cat-sum-total\" data-bytes=\"{}\">{}</td><td data-testid=\"cat-peak-total\" data-bytes=\"{}\">{}</td></tr>",
        e.memory.total,
        format_bytes(e.memory.total, unit),
        e.memory.peak,
        format_bytes(e.memory.peak, unit)
    ));
    if let Some(smi) = e.memory.nvidia_smi {
        let adds = smi.saturating_sub(e.memory.peak);
        s.push_str(&format!(
            "<tr><th scope=\"row\">nvidia-smi adds above the peak (the caching allocator's reserve)</th><td></td><td data-testid=\"cat-smi-adds\" data-bytes=\"{adds}\">{}</td></tr>\
             <tr><th scope=\"row\">nvidia-smi will show (decides the verdict)</th><td></td><td data-testid=\"cat-smi\" data-bytes=\"{smi}\">{}</td></tr>",
            format_bytes(adds, unit),
            format_bytes(smi, unit)
        ));
    }
    s.push_str("</tfoot></table>");
    s
}

/// The category table's cells and their bytes, for [`patch`].
fn category_cells(e: &Estimate) -> Vec<(String, Bytes)> {
    let at_peak = e.timeline.peak_event().map_or([0; 6], |ev| ev.by_category);
    let mut out = Vec::new();
    for (i, (c, sum)) in by_category(e).into_iter().enumerate() {
        out.push((format!("cat-sum-{}", category_name(c)), sum));
        out.push((format!("cat-peak-{}", category_name(c)), at_peak[i]));
    }
    out.push(("cat-sum-total".into(), e.memory.total));
    out.push(("cat-peak-total".into(), e.memory.peak));
    if let Some(smi) = e.memory.nvidia_smi {
        out.push(("cat-smi-adds".into(), smi.saturating_sub(e.memory.peak)));
        out.push(("cat-smi".into(), smi));
    }
    out
}

fn ledger(e: &Result<Estimate, EstimateError>, cfg: &Config, open: &[String]) -> String {
    let Ok(e) = e else { return String::new() };
    let unit = cfg.unit;
    let explained = if open.is_empty() { None } else { crate::estimator::analyse(cfg).and_then(|a| a.explain()).ok() };
    let stage = if e.layout.pp > 1 {
        format!(" — the {} ({} layers), the most loaded", e.layout.stage.label(), e.layout.stage_layers)
    } else {
        String::new()
    };
    let mut s = format!(
        "<h2 id=\"ledger-h\">Ledger per GPU{}</h2><p class=\"hint\">Open a row for its formula, the same formula with this configuration's numbers, and its source.</p><ul class=\"rows\" data-testid=\"ledger\">",
        esc(&stage)
    );
    rows(&mut s, &e.components, 0, &List { host: false, total: e.memory.total, unit, open, explained: explained.as_ref() });
    s.push_str("</ul>");
    s.push_str(&categories(e, unit));
    s.push_str(&format!(
        "<p class=\"sum\">Sum of components: <strong>{}</strong> · peak during the step: <strong>{}</strong> (not every component is resident at once)</p>",
        format_bytes(e.memory.total, unit),
        format_bytes(e.memory.peak, unit)
    ));
    if !e.host.is_empty() {
        s.push_str("<h3>Host memory per GPU process</h3><ul class=\"rows host\" data-testid=\"host-ledger\">");
        rows(&mut s, &e.host, 0, &List { host: true, total: e.memory.host, unit, open, explained: explained.as_ref() });
        s.push_str("</ul>");
    }
    s
}

/// The figures of every row, depth first: bytes, as shown, and share of the list's total.
fn figures(rows: &[Row], total: Bytes, unit: Unit, out: &mut Vec<(Bytes, String, f64)>) {
    for r in rows {
        let share = if total > 0 { r.bytes as f64 * 100.0 / total as f64 } else { 0.0 };
        out.push((r.bytes, format_bytes(r.bytes, unit), share));
        figures(&r.children, total, unit, out);
    }
}

/// What the ledger's HTML holds besides its figures: the rows (by key) and the stage.
fn shape(e: &Estimate) -> String {
    fn keys(rows: &[Row], depth: usize, host: bool, out: &mut String) {
        for r in rows {
            out.push_str(&row_key(r, depth, host));
            out.push('|');
            keys(&r.children, depth + 1, host, out);
        }
    }
    let mut s = format!("{}:{}:{}|", e.layout.stage.label(), e.layout.pp, e.memory.nvidia_smi.is_some());
    keys(&e.components, 0, false, &mut s);
    keys(&e.host, 0, true, &mut s);
    s
}

/// Updates the figures of a ledger whose rows are the same in place (no new HTML to parse);
/// `false` if the page's rows do not match.
fn patch(section: &web_sys::Element, e: &Estimate, unit: Unit) -> bool {
    let mut rows = Vec::new();
    figures(&e.components, e.memory.total, unit, &mut rows);
    figures(&e.host, e.memory.host, unit, &mut rows);
    let Ok(items) = section.query_selector_all("li.row") else { return false };
    if items.length() as usize != rows.len() {
        return false;
    }
    let set = |li: &web_sys::Element, sel: &str, f: &dyn Fn(&web_sys::Element)| {
        if let Some(el) = li.query_selector(sel).ok().flatten() {
            f(&el);
        }
    };
    for (i, (bytes, text, share)) in rows.iter().enumerate() {
        let Some(li) = items.item(i as u32).and_then(|n| n.dyn_into::<web_sys::Element>().ok()) else { return false };
        set(&li, ".bytes", &|el| {
            let _ = el.set_attribute("data-bytes", &bytes.to_string());
            el.set_text_content(Some(text));
        });
        set(&li, ".share", &|el| {
            let _ = el.set_attribute("aria-label", &format!("{share:.1} percent of the sum"));
        });
        set(&li, ".share-bar", &|el| {
            let _ = el.set_attribute("style", &format!("width:{:.1}%", share.min(100.0)));
        });
        set(&li, ".share-num", &|el| el.set_text_content(Some(&format!("{share:.1} %"))));
    }
    for (id, b) in category_cells(e) {
        if let Some(el) = section.query_selector(&format!("[data-testid=\"{id}\"]")).ok().flatten() {
            let _ = el.set_attribute("data-bytes", &b.to_string());
            el.set_text_content(Some(&format_bytes(b, unit)));
        }
    }
    if let Ok(sums) = section.query_selector_all(".sum strong") {
        for (i, b) in [e.memory.total, e.memory.peak].into_iter().enumerate() {
            if let Some(n) = sums.item(i as u32) {
                n.set_text_content(Some(&format_bytes(b, unit)));
            }
        }
    }
    true
}

#[component]
pub fn Ledger() -> impl IntoView {
    let store = use_store();
    // The open rows: read when the ledger is rebuilt, changed by the visitor in place.
    let open = StoredValue::new(Vec::<String>::new());
    let node = NodeRef::<Section>::new();
    // What the page's HTML was built for (rows, stage): the same rows are only patched.
    let built = StoredValue::new(None::<String>);
    Effect::new(move |_| {
        let Some(section) = node.get() else { return };
        dom::timed("ledger", || {
            store.config.with(|c| {
                store.estimate.with(|e| {
                    let shape = e.as_ref().ok().map(shape);
                    let same = shape.is_some() && built.with_value(|b| *b == shape) && open.with_value(Vec::is_empty);
                    if !(same && e.as_ref().is_ok_and(|e| patch(&section, e, c.unit))) {
                        section.set_inner_html(&open.with_value(|o| ledger(e, c, o)));
                        built.set_value(shape);
                    }
                })
            })
        });
    });
    let listening = StoredValue::new_local(None::<Closure<dyn FnMut(web_sys::Event)>>);
    Effect::new(move |_| {
        let Some(section) = node.get() else { return };
        if listening.with_value(Option::is_some) {
            return;
        }
        let on_toggle = Closure::<dyn FnMut(web_sys::Event)>::new(move |ev: web_sys::Event| {
            let Some(d) = ev.target().and_then(|t| t.dyn_into::<web_sys::HtmlDetailsElement>().ok()) else { return };
            let Some(key) = d.get_attribute("data-key") else { return };
            let Some(slot) = d.query_selector(".slot").ok().flatten() else { return };
            // A rebuilt ledger's open rows fire `toggle` too, with their formula already in.
            if d.open() && slot.child_element_count() > 0 {
                return;
            }
            if d.open() {
                open.update_value(|o| {
                    if !o.contains(&key) {
                        o.push(key.clone());
                    }
                });
                let body = store.config.with_untracked(|c| {
                    let e = crate::estimator::analyse(c).and_then(|a| a.explain()).ok()?;
                    let host = key.starts_with("host:");
                    find(if host { &e.host } else { &e.components }, 0, host, &key).map(formula)
                });
                slot.set_inner_html(&body.unwrap_or_default());
            } else {
                open.update_value(|o| o.retain(|k| *k != key));
                slot.set_inner_html("");
            }
        });
        // `toggle` does not bubble: listen in the capture phase.
        let _ = section.add_event_listener_with_callback_and_bool("toggle", on_toggle.as_ref().unchecked_ref(), true);
        listening.set_value(Some(on_toggle));
    });
    view! { <section class="ledger" aria-labelledby="ledger-h" data-panel="ledger" node_ref=node></section> }
}
