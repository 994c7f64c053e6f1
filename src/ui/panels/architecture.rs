//! Every architecture field of the model, editable: editing a preset's turns it into a custom
//! model (the link then carries the whole architecture).

use crate::config::{Group, KEYS};
use crate::ui::state::use_store;
use crate::ui::widgets::fields_html;
use leptos::prelude::*;

#[component]
pub fn Architecture() -> impl IntoView {
    let store = use_store();
    // The fields (some 300 elements) are written when the panel is first opened, with the
    // configuration of that moment; the form keeps them in sync from then on.
    let opened = RwSignal::new(false);
    let html = move || {
        if !opened.get() {
            return String::new();
        }
        let keys: Vec<&'static str> = KEYS.iter().filter(|k| k.group == Group::Architecture).map(|k| k.name).collect();
        store.config.with_untracked(|c| fields_html(&keys, c))
    };
    view! {
        <details class="arch" data-panel="architecture" on:toggle=move |_| if !opened.get_untracked() { opened.set(true) }>
            <summary>"Architecture (every field editable)"</summary>
            <p class="hint">"Editing a preset's architecture turns it into a custom model."</p>
            <div class="grid" inner_html=html></div>
        </details>
    }
}
