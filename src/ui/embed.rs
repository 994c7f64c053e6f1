//! Embed mode (`embed=1`): a compact view for iframes on course pages, which tells its parent
//! how tall it is, and the dialog that writes the `<iframe>` snippet.
//!
//! The height message is `{type: "trainmem:height", height: <CSS pixels>}`, posted to the
//! parent on load and whenever the page's size changes. The parent-side listener (in the dialog
//! and the README):
//!
//! ```js
//! window.addEventListener("message", (e) => {
//!   if (e.data && e.data.type === "trainmem:height") {
//!     for (const f of document.querySelectorAll("iframe")) {
//!       if (f.contentWindow === e.source) f.style.height = e.data.height + "px";
//!     }
//!   }
//! });
//! ```

use super::results::{Ledger, Verdict};
use super::{app, dom};
use crate::config::encode_query;
use leptos::html::Dialog;
use leptos::prelude::*;
use wasm_bindgen::closure::Closure;
use wasm_bindgen::JsCast;

/// The listener an embedding page adds (shown in the dialog).
pub const PARENT_LISTENER: &str = r#"<script>
window.addEventListener("message", (e) => {
  if (e.data && e.data.type === "trainmem:height") {
    for (const f of document.querySelectorAll("iframe")) {
      if (f.contentWindow === e.source) f.style.height = e.data.height + "px";
    }
  }
});
</script>"#;

/// The compact page: verdict, bar, and the panel `view=` asks for.
#[component]
pub fn EmbedView() -> impl IntoView {
    let app = app();
    // Tell the parent our height now and on every resize.
    Effect::new(move |_| {
        dom::post_height();
        let cb = Closure::<dyn FnMut(js_sys::Array)>::new(move |_entries: js_sys::Array| dom::post_height());
        if let Ok(ro) = web_sys::ResizeObserver::new(cb.as_ref().unchecked_ref()) {
            if let Some(body) = document().body() {
                ro.observe(&body);
            }
        }
        cb.forget();
    });
    let open_href = move || {
        let q = app.config.with(encode_query);
        if q.is_empty() {
            dom::base_url()
        } else {
            format!("{}?{q}", dom::base_url())
        }
    };
    let panel = move || {
        let view = app.view.get();
        match view.as_str() {
            "ledger" => view! { <Ledger/> }.into_any(),
            "bench" => view! { <super::bench_panel::BenchPanel autostart=true/> }.into_any(),
            "" | "bar" | "result" => view! { <span></span> }.into_any(),
            other if super::charts::ChartKind::from_view(other).is_some() => {
                view! { <div id="charts-root" class="slot" data-view=other.to_string()></div> }.into_any()
            }
            other => view! { <p class="hint">{format!("unknown view '{other}'")}</p> }.into_any(),
        }
    };
    view! {
        <main class="embed" data-testid="embed">
            <Verdict/>
            <div id="bar-root" class="slot bar-slot"></div>
            {panel}
            <p class="open"><a href=open_href target="_blank" rel="noopener">"Open this configuration in trainmem ↗"</a></p>
        </main>
    }
}

/// The "Embed" button and its dialog with the `<iframe>` snippet for the current configuration.
#[component]
pub fn EmbedButton() -> impl IntoView {
    let app = app();
    let dialog = NodeRef::<Dialog>::new();
    let view_sel = RwSignal::new(String::new());
    let snippet = move || {
        let q = app.config.with(encode_query);
        let mut query = if q.is_empty() { "embed=1".to_string() } else { format!("{q}&embed=1") };
        let v = view_sel.get();
        if !v.is_empty() {
            query.push_str(&format!("&view={v}"));
        }
        format!(
            "<iframe src=\"{}?{query}\" title=\"trainmem: GPU memory for this training configuration\" width=\"100%\" height=\"420\" style=\"border:0\" loading=\"lazy\"></iframe>\n{PARENT_LISTENER}",
            dom::base_url()
        )
    };
    let open = move |_| {
        if let Some(d) = dialog.get() {
            let _ = d.show_modal();
        }
    };
    let close = move |_| {
        if let Some(d) = dialog.get() {
            d.close();
        }
    };
    let copied = RwSignal::new(false);
    let copy = move |_| {
        let text = snippet();
        leptos::task::spawn_local(async move {
            copied.set(dom::copy_text(&text).await);
        });
    };
    view! {
        <button type="button" on:click=open data-testid="embed-button">"Embed"</button>
        <dialog node_ref=dialog aria-labelledby="embed-h" data-testid="embed-dialog">
            <h2 id="embed-h">"Embed this configuration"</h2>
            <p class="hint">"Paste into a course page. The frame reports its height with postMessage; the script below resizes it."</p>
            <div class="field">
                <label for="embed-view">"Panel under the result"</label>
                <select id="embed-view" on:change=move |ev| view_sel.set(event_target_value(&ev))>
                    <option value="">"none (result and bar)"</option>
                    <option value="ledger">"ledger with formulas"</option>
                    <option value="seq">"memory vs sequence length"</option>
                    <option value="params">"memory vs parameter count"</option>
                    <option value="batch">"memory vs micro-batch"</option>
                    <option value="gpus">"memory vs GPUs per ZeRO stage"</option>
                    <option value="timeline">"step timeline"</option>
                </select>
            </div>
            <div class="field">
                <label for="embed-snippet">"HTML"</label>
                <textarea id="embed-snippet" rows="10" readonly data-testid="embed-snippet" prop:value=snippet></textarea>
            </div>
            <div class="row">
                <button type="button" class="primary" on:click=copy>{move || if copied.get() { "Copied ✓" } else { "Copy snippet" }}</button>
                <button type="button" on:click=close>"Close"</button>
            </div>
        </dialog>
    }
}
