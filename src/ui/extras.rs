//! The extras module: the stacked bar, the charts, the textbook comparison and the config.json
//! import, compiled into their own wasm (`src/bin/trainmem-extras.rs`) and loaded right after
//! the first paint, so the first load carries only the inputs, the verdict and the ledger.
//!
//! It builds its own [`App`] from the address bar, follows the main module's
//! `trainmem:config` events (new configuration or theme), and mounts each part into the slot
//! the main page left for it (`#bar-root`, `#textbook-root`, `#charts-root` — with `data-view`
//! for an embedded chart — and `#hf-root`). Edits it makes (an import) go back to the main
//! module, which owns the address bar, as `trainmem:set-query`.

use super::charts::{ChartKind, ChartPanel, Charts};
use super::inputs::HfImport;
use super::results::{Bar, Textbook};
use super::{dom, App};
use crate::config::decode_query;
use leptos::prelude::*;
use wasm_bindgen::JsCast;

fn slot(id: &str) -> Option<web_sys::HtmlElement> {
    document().get_element_by_id(id).and_then(|e| e.dyn_into::<web_sys::HtmlElement>().ok())
}

/// The theme the main module set on `<html>`.
fn dom_theme() -> String {
    document().document_element().and_then(|e| e.get_attribute("data-theme")).unwrap_or_else(|| "auto".into())
}

/// Mounts every part whose slot exists (called by the module's `main`).
pub fn mount() {
    console_error_panic_hook::set_once();
    // One owner for the module's whole life: the parts share its signals.
    let owner = Owner::new();
    owner.set();
    let app = App::from_url();
    app.notices.set(Vec::new());
    app.theme.set(dom_theme());
    let _ = window_event_listener_untyped(dom::CONFIG_EVENT, move |_| {
        let d = decode_query(&dom::search());
        if app.config.with_untracked(|c| *c != d.config) {
            app.config.set(d.config);
        }
        let t = dom_theme();
        if app.theme.with_untracked(|x| *x != t) {
            app.theme.set(t);
        }
    });
    let mount = |id: &str, f: fn() -> AnyView| {
        if let Some(el) = slot(id) {
            el.set_inner_html("");
            leptos::mount::mount_to(el, move || {
                provide_context(app);
                f()
            })
            .forget();
        }
    };
    mount("bar-root", || view! { <Bar/> }.into_any());
    mount("textbook-root", || view! { <Textbook/> }.into_any());
    mount("hf-root", || view! { <HfImport/> }.into_any());
    if let Some(el) = slot("charts-root") {
        let kind = el.get_attribute("data-view").and_then(|v| ChartKind::from_view(&v));
        el.set_inner_html("");
        leptos::mount::mount_to(el, move || {
            provide_context(app);
            match kind {
                Some(k) => view! { <ChartPanel kind=k/> }.into_any(),
                None => view! { <Charts/> }.into_any(),
            }
        })
        .forget();
    }
    std::mem::forget(owner);
}
