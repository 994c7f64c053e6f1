//! The embed dialog: the `<iframe>` snippet for the current configuration, with the panel to
//! show under the result, and the listener a host page adds so the frame takes its content's
//! height. The frame posts `{type: "trainmem:height", height: <CSS pixels>}` on load and
//! whenever its content changes size (see README, "Embedding").

use super::toolbar::EMBED_DIALOG;
use crate::config::encode_query;
use crate::ui::dom;
use crate::ui::state::use_store;
use leptos::html::Dialog;
use leptos::prelude::*;

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

/// The panels an embed can show under the result (`view=`), with their descriptions.
const VIEWS: [(&str, &str); 8] = [
    ("", "none (result and bar)"),
    ("ledger", "ledger with formulas"),
    ("seq", "memory vs sequence length"),
    ("params", "memory vs parameter count"),
    ("batch", "memory vs micro-batch"),
    ("gpus", "memory vs GPUs per ZeRO stage"),
    ("timeline", "step timeline"),
    ("bench", "WebGPU benchmark"),
];

#[component]
pub fn EmbedDialog() -> impl IntoView {
    let store = use_store();
    let dialog = NodeRef::<Dialog>::new();
    let view_sel = RwSignal::new(String::new());
    let snippet = move || {
        let q = store.config.with(encode_query);
        let mut query = if q.is_empty() { "embed=1".to_string() } else { format!("{q}&embed=1") };
        view_sel.with(|v| {
            if !v.is_empty() {
                query.push_str("&view=");
                query.push_str(v);
            }
        });
        format!(
            "<iframe src=\"{}?{query}\" title=\"trainmem: GPU memory for this training configuration\" width=\"100%\" height=\"420\" style=\"border:0\" loading=\"lazy\"></iframe>\n{PARENT_LISTENER}",
            dom::base_url()
        )
    };
    let close = move |_| {
        if let Some(d) = dialog.get() {
            d.close();
        }
    };
    let copied = RwSignal::new(false);
    let copy = move |_| {
        let text = snippet();
        leptos::task::spawn_local(async move { copied.set(dom::copy_text(&text).await) });
    };
    let options = VIEWS.iter().map(|(v, label)| view! { <option value=*v>{*label}</option> }).collect_view();
    view! {
        <dialog id=EMBED_DIALOG node_ref=dialog aria-labelledby="embed-h" data-testid="embed-dialog">
            <h2 id="embed-h">"Embed this configuration"</h2>
            <p class="hint">"Paste into a course page. The frame reports its height with postMessage; the script below resizes it."</p>
            <div class="field">
                <label for="embed-view">"Panel under the result"</label>
                <select id="embed-view" on:change=move |ev| view_sel.set(event_target_value(&ev))>{options}</select>
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
