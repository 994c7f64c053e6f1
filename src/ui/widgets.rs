//! The form's one widget: a labelled input for a configuration key, generated from the codec's
//! key table, so its label, accepted values and the URL key it writes are the same ones the
//! CLI documents.

use super::state::use_store;
use crate::config::{Key, KEYS};
use leptos::prelude::*;

fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// The key's help text, capitalized, for a label.
fn label_of(k: &Key) -> String {
    let mut c = k.help.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => k.name.to_string(),
    }
}

/// One labelled input for a configuration key: a select for enumerations, a checkbox for
/// switches, a text box (accepting `8k`-style suffixes) for numbers. A value the codec or the
/// estimator rejects is named under the input and not applied.
#[component]
pub fn KeyInput(name: &'static str) -> impl IntoView {
    let store = use_store();
    let Some(k) = key(name) else {
        return ().into_any();
    };
    let id = format!("in-{name}");
    let err_id = format!("err-{name}");
    let error = RwSignal::new(None::<String>);
    // A memo: the input's DOM is touched only when its own key's value changes.
    let value = Memo::new(move |_| store.config.with(|c| (k.get)(c)));
    let set = move |v: &str| error.set(store.set_key(name, v).err());
    let choices = (k.choices)();
    let is_bool = choices == ["false", "true"];
    let control = if is_bool {
        view! {
            <input id=id.clone() type="checkbox" prop:checked=move || value.get() == "true"
                on:change=move |ev| set(if event_target_checked(&ev) { "true" } else { "false" })/>
        }
        .into_any()
    } else if !choices.is_empty() {
        let options = choices.iter().map(|c| view! { <option value=*c>{*c}</option> }).collect_view();
        view! { <select id=id.clone() prop:value=value on:change=move |ev| set(&event_target_value(&ev))>{options}</select> }.into_any()
    } else {
        view! {
            <input id=id.clone() type="text" inputmode="decimal" autocomplete="off" spellcheck="false" prop:value=value
                aria-invalid=move || error.with(|e| e.is_some().to_string()) aria-describedby=err_id.clone()
                on:input=move |ev| set(&event_target_value(&ev))/>
        }
        .into_any()
    };
    view! {
        <div class="field" class:check=is_bool>
            <label for=id>{label_of(k)}" "<code class="key">{name}</code></label>
            {control}
            <span class="field-error" id=err_id role="status">{move || error.get()}</span>
        </div>
    }
    .into_any()
}

/// A block of inputs, by key name.
pub fn fields(names: &[&'static str]) -> impl IntoView {
    names.iter().map(|n| view! { <KeyInput name=*n/> }).collect_view()
}
