//! Paste or upload a Hugging Face `config.json`: the model becomes a custom one with that
//! architecture.
//!
//! The importer (serde_json and the Hugging Face reader) lives in the lazily loaded module
//! ([`crate::ui::lazy`]): the page holds the disclosure ([`Import`]), and opening it loads its
//! body ([`Body`]).

use crate::estimator::hf;
use crate::estimator::units::format_count;
use crate::ui::lazy::{use_more, Lazy, Slot};
use crate::ui::state::use_store;
use leptos::prelude::*;
use wasm_bindgen::JsCast;

/// The page's side: the disclosure; opening it loads its body.
#[component]
pub fn Import() -> impl IntoView {
    let more = use_more();
    view! {
        <details class="hf" data-panel="import" on:toggle=move |ev| { if event_target::<web_sys::HtmlDetailsElement>(&ev).open() { more.request(Lazy::Import) } }>
            <summary>"Import a Hugging Face config.json"</summary>
            <Slot panel=Lazy::Import open=false>
                <p class="hint" role="status">"Loading…"</p>
            </Slot>
        </details>
    }
}

/// The disclosure's body (in the lazily loaded module).
#[component]
pub fn Body() -> impl IntoView {
    let store = use_store();
    let text = RwSignal::new(String::new());
    let status = RwSignal::new(None::<Result<String, String>>);
    let import = move |json: String| {
        status.set(Some(match hf::import_json(&json) {
            Ok(imported) => {
                let msg = format!(
                    "imported {} ({}): {} parameters",
                    if imported.name.is_empty() { "config.json" } else { &imported.name },
                    imported.model_type,
                    format_count(imported.spec.counts().total)
                );
                store.import(&imported);
                Ok(msg)
            }
            Err(e) => Err(e.to_string()),
        }))
    };
    let on_file = move |ev: leptos::ev::Event| {
        let file = ev.target().and_then(|t| t.dyn_into::<web_sys::HtmlInputElement>().ok()).and_then(|i| i.files()).and_then(|f| f.get(0));
        let Some(file) = file else { return };
        leptos::task::spawn_local(async move {
            match wasm_bindgen_futures::JsFuture::from(file.text()).await {
                Ok(v) => {
                    let s = v.as_string().unwrap_or_default();
                    text.set(s.clone());
                    import(s);
                }
                Err(_) => status.set(Some(Err("could not read the file".into()))),
            }
        });
    };
    view! {
            <div class="field">
                <label for="hf-text">"Paste config.json"</label>
                <textarea id="hf-text" rows="5" spellcheck="false" data-testid="hf-text"
                    prop:value=move || text.get() on:input=move |ev| text.set(event_target_value(&ev))></textarea>
            </div>
            <div class="row">
                <button type="button" data-testid="hf-import" on:click=move |_| import(text.get_untracked())>"Import"</button>
                <label class="file">"or upload "<input type="file" accept=".json,application/json" on:change=on_file/></label>
            </div>
            <p class="status" role="status" data-testid="hf-status" class:error=move || status.with(|s| matches!(s, Some(Err(_))))>
                {move || status.get().map(|s| s.unwrap_or_else(|e| e))}
            </p>
            <p class="hint">{format!("Supported model_type: {}.", hf::SUPPORTED.join(", "))}</p>
    }
}
