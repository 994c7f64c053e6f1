//! The embed dialog: the snippet for the current configuration, for the host it goes into
//! ([`crate::course::snippets`]: an LMS iframe, an iframe with the resize script, MyST, Jupyter,
//! reveal.js, Quarto, MkDocs), with the panel to show under the result, the theme, and
//! predict-then-reveal. The frame speaks the versioned message protocol of docs/embed.md.
//!
//! The dialog lives in the lazily loaded module ([`crate::ui::lazy`]): the toolbar's button asks
//! for it, and the page's [`Shell`] mounts it and opens it.

use super::toolbar::EMBED_DIALOG;
use crate::config::encode_query;
use crate::course::snippets::{snippet, Embed, Host, DEFAULT_HEIGHT};
use crate::ui::dom;
use crate::ui::lazy::{Lazy, Slot};
use crate::ui::state::{compare_query, use_store};
use leptos::html::Dialog;
use leptos::prelude::*;
use wasm_bindgen::JsCast;

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

/// What the dialog's controls say.
#[derive(Clone, Debug, PartialEq)]
struct Choice {
    host: Host,
    view: String,
    theme: String,
    quiz: bool,
}

/// The dialog's controls as HTML (written once; one `change` handler reads them).
fn controls_html() -> String {
    let mut s = String::from(
        "<div class=\"field\"><label for=\"embed-host\">Where it goes</label><select id=\"embed-host\" data-testid=\"embed-host\">",
    );
    for h in Host::ALL {
        s.push_str(&format!("<option value=\"{}\">{}</option>", h.id(), h.label()));
    }
    s.push_str("</select></div><div class=\"field\"><label for=\"embed-view\">Panel under the result</label><select id=\"embed-view\">");
    for (v, label) in VIEWS {
        s.push_str(&format!("<option value=\"{v}\">{label}</option>"));
    }
    s.push_str(
        "</select></div><div class=\"field\"><label for=\"embed-theme\">Theme</label><select id=\"embed-theme\">\
         <option value=\"\">the reader's</option><option value=\"light\">light</option><option value=\"dark\">dark</option>\
         <option value=\"projector\">projector (high contrast, large type)</option></select></div>\
         <div class=\"field check\"><label for=\"embed-quiz\">Predict, then reveal (quiz=1)</label><input id=\"embed-quiz\" type=\"checkbox\"></div>",
    );
    s
}

fn value_of(root: &web_sys::Element, id: &str) -> String {
    match root.query_selector(&format!("#{id}")).ok().flatten() {
        Some(el) => match el.dyn_ref::<web_sys::HtmlInputElement>() {
            Some(i) => i.checked().to_string(),
            None => el.dyn_ref::<web_sys::HtmlSelectElement>().map(|s| s.value()).unwrap_or_default(),
        },
        None => String::new(),
    }
}

/// Opens the dialog once it is there.
fn show() {
    if let Some(d) = document().get_element_by_id(EMBED_DIALOG) {
        let _ = d.unchecked_into::<web_sys::HtmlDialogElement>().show_modal();
    }
}

/// The page's side: where the dialog goes once the toolbar's button asks for it; it opens as
/// soon as it is there.
#[component]
pub fn Shell() -> impl IntoView {
    view! { <Slot panel=Lazy::Embed open=false on_mount=Callback::new(|_| show()) /> }
}

/// The dialog (in the lazily loaded module).
#[component]
pub fn EmbedDialog() -> impl IntoView {
    let store = use_store();
    let dialog = NodeRef::<Dialog>::new();
    let choice = RwSignal::new(Choice { host: Host::Lms, view: String::new(), theme: String::new(), quiz: false });
    let url = move || {
        let c = choice.get();
        let mut parts = vec![];
        let q = store.config.with(encode_query);
        if !q.is_empty() {
            parts.push(q);
        }
        parts.push("embed=1".to_string());
        if !c.view.is_empty() {
            parts.push(format!("view={}", c.view));
        }
        if !c.theme.is_empty() {
            parts.push(format!("theme={}", c.theme));
        }
        if c.quiz {
            parts.push("quiz=1".into());
        }
        store.compare.with(|b| b.as_ref().map(|b| parts.push(format!("compare={}", crate::config::percent_encode(&compare_query(b))))));
        format!("{}?{}", dom::base_url(), parts.join("&"))
    };
    let text = move || {
        let u = url();
        snippet(
            choice.with(|c| c.host),
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
    let on_change = move |_: leptos::ev::Event| {
        let Some(d) = dialog.get_untracked() else { return };
        let host = value_of(&d, "embed-host");
        choice.set(Choice {
            host: Host::ALL.into_iter().find(|h| h.id() == host).unwrap_or(Host::Lms),
            view: value_of(&d, "embed-view"),
            theme: value_of(&d, "embed-theme"),
            quiz: value_of(&d, "embed-quiz") == "true",
        });
    };
    view! {
        <dialog id=EMBED_DIALOG node_ref=dialog aria-labelledby="embed-h" data-testid="embed-dialog" on:change=on_change>
            <h2 id="embed-h">"Embed this configuration"</h2>
            <p class="hint">"Paste into a course page. Without a script the frame scrolls inside and links to the full page; with one it takes its content's height (docs/embed.md)."</p>
            <div inner_html=controls_html()></div>
            <div class="field">
                <label for="embed-snippet">"Snippet"</label>
                <textarea id="embed-snippet" rows="10" readonly data-testid="embed-snippet" prop:value=text></textarea>
            </div>
            <p class="hint" data-testid="embed-note">{move || choice.with(|c| c.host.note())}</p>
            <div class="row">
                <button type="button" class="primary" on:click=copy>{move || if copied.get() { "Copied ✓" } else { "Copy snippet" }}</button>
                <button type="button" on:click=close>"Close"</button>
            </div>
        </dialog>
    }
}
