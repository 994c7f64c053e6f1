//! The embed dialog: the snippet for the current configuration, for the host it goes into
//! ([`crate::course::snippets`]: an LMS iframe, an iframe with the resize script, MyST, Jupyter,
//! reveal.js, Quarto, MkDocs), with the panel to show under the result, the theme, and
//! predict-then-reveal. The frame speaks the versioned message protocol of docs/embed.md.

use super::toolbar::EMBED_DIALOG;
use crate::config::encode_query;
use crate::course::snippets::{snippet, Embed, Host, DEFAULT_HEIGHT};
use crate::ui::dom;
use crate::ui::state::{compare_query, use_store};
use leptos::html::Dialog;
use leptos::prelude::*;

/// The panels an embed can show under the result (`view=`), with their descriptions.
const VIEWS: [(&str, &str); 9] = [
    ("", "none (result and bar)"),
    ("ledger", "ledger with formulas"),
    ("seq", "memory vs sequence length"),
    ("params", "memory vs parameter count"),
    ("batch", "memory vs micro-batch"),
    ("gpus", "memory vs GPUs per ZeRO stage"),
    ("timeline", "step timeline"),
    ("exercises", "exercises"),
    ("bench", "WebGPU benchmark"),
];

#[component]
pub fn EmbedDialog() -> impl IntoView {
    let store = use_store();
    let dialog = NodeRef::<Dialog>::new();
    let view_sel = RwSignal::new(String::new());
    let host = RwSignal::new(Host::Lms);
    let theme = RwSignal::new(String::new());
    let quiz = RwSignal::new(false);
    let url = move || {
        let mut parts = vec![];
        let q = store.config.with(encode_query);
        if !q.is_empty() {
            parts.push(q);
        }
        parts.push("embed=1".to_string());
        view_sel.with(|v| (!v.is_empty()).then(|| parts.push(format!("view={v}"))));
        theme.with(|t| (!t.is_empty()).then(|| parts.push(format!("theme={t}"))));
        if quiz.get() {
            parts.push("quiz=1".into());
        }
        store.compare.with(|b| b.as_ref().map(|b| parts.push(format!("compare={}", crate::config::percent_encode(&compare_query(b))))));
        format!("{}?{}", dom::base_url(), parts.join("&"))
    };
    let text = move || {
        let u = url();
        snippet(
            host.get(),
            &Embed { url: &u, title: "trainmem: GPU memory for this training configuration", height: DEFAULT_HEIGHT, placeholder: None },
        )
    };
    let close = move |_| {
        if let Some(d) = dialog.get() {
            d.close();
        }
    };
    let copied = RwSignal::new(false);
    let copy = move |_| {
        let t = text();
        leptos::task::spawn_local(async move { copied.set(dom::copy_text(&t).await) });
    };
    let options = VIEWS.iter().map(|(v, label)| view! { <option value=*v>{*label}</option> }).collect_view();
    let hosts = Host::ALL.iter().map(|h| view! { <option value=h.id()>{h.label()}</option> }).collect_view();
    let pick_host = move |ev: leptos::ev::Event| {
        let id = event_target_value(&ev);
        if let Some(h) = Host::ALL.into_iter().find(|h| h.id() == id) {
            host.set(h);
        }
    };
    view! {
        <dialog id=EMBED_DIALOG node_ref=dialog aria-labelledby="embed-h" data-testid="embed-dialog">
            <h2 id="embed-h">"Embed this configuration"</h2>
            <p class="hint">"Paste into a course page. Without a script the frame scrolls inside and links to the full page; with one it takes its content's height (docs/embed.md)."</p>
            <div class="field">
                <label for="embed-host">"Where it goes"</label>
                <select id="embed-host" data-testid="embed-host" on:change=pick_host>{hosts}</select>
            </div>
            <div class="field">
                <label for="embed-view">"Panel under the result"</label>
                <select id="embed-view" on:change=move |ev| view_sel.set(event_target_value(&ev))>{options}</select>
            </div>
            <div class="field">
                <label for="embed-theme">"Theme"</label>
                <select id="embed-theme" on:change=move |ev| theme.set(event_target_value(&ev))>
                    <option value="">"the reader's"</option>
                    <option value="light">"light"</option>
                    <option value="dark">"dark"</option>
                    <option value="projector">"projector (high contrast, large type)"</option>
                </select>
            </div>
            <div class="field check">
                <label for="embed-quiz">"Predict, then reveal (quiz=1)"</label>
                <input id="embed-quiz" type="checkbox" prop:checked=move || quiz.get() on:change=move |ev| quiz.set(event_target_checked(&ev))/>
            </div>
            <div class="field">
                <label for="embed-snippet">"Snippet"</label>
                <textarea id="embed-snippet" rows="10" readonly data-testid="embed-snippet" prop:value=text></textarea>
            </div>
            <p class="hint" data-testid="embed-note">{move || host.get().note()}</p>
            <div class="row">
                <button type="button" class="primary" on:click=copy>{move || if copied.get() { "Copied ✓" } else { "Copy snippet" }}</button>
                <button type="button" on:click=close>"Close"</button>
            </div>
        </dialog>
    }
}
