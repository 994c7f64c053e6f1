//! The page's header: the name, the unit switch, the theme, "copy link" and "embed".

use crate::config::Unit;
use crate::ui::dom;
use crate::ui::lazy::{use_more, Lazy};
use crate::ui::state::use_store;
use leptos::prelude::*;

/// The id of the embed dialog ([`super::embed::EmbedDialog`]), which the button opens (asking
/// for it first: it is in the lazily loaded module, and opens itself once there).
pub const EMBED_DIALOG: &str = "embed-dialog";

#[component]
pub fn Toolbar() -> impl IntoView {
    let store = use_store();
    let copied = RwSignal::new(false);
    let copy = move |_| {
        let url = store.share_url();
        leptos::task::spawn_local(async move {
            copied.set(dom::copy_text(&url).await);
            set_timeout(move || copied.set(false), std::time::Duration::from_millis(2000));
        });
    };
    let gib = move || store.unit() == Unit::Gib;
    let more = use_more();
    let open_embed = move |_| match document().get_element_by_id(EMBED_DIALOG) {
        Some(d) => {
            let _ = wasm_bindgen::JsCast::unchecked_into::<web_sys::HtmlDialogElement>(d).show_modal();
        }
        None => more.request(Lazy::Embed),
    };
    view! {
        <header class="top">
            <div class="brand">
                <h1>"trainmem"</h1>
                <p class="tagline">"Where GPU memory goes when you train a transformer — every byte, with its formula."</p>
            </div>
            <div class="tools" role="toolbar" aria-label="Page tools">
                <fieldset class="seg">
                    <legend class="sr-only">"Byte unit"</legend>
                    <label><input type="radio" name="unit" prop:checked=move || !gib() on:change=move |_| store.set_unit(Unit::Gb)/>"GB (10⁹)"</label>
                    <label><input type="radio" name="unit" prop:checked=gib on:change=move |_| store.set_unit(Unit::Gib)/>"GiB (2³⁰)"</label>
                </fieldset>
                <button type="button" data-testid="theme" on:click=move |_| store.set_theme(store.theme.get_untracked().next())>
                    {move || format!("Theme: {}", store.theme.get().as_str())}
                </button>
                <button type="button" on:click=copy data-testid="copy-link">{move || if copied.get() { "Link copied ✓" } else { "Copy link" }}</button>
                <button type="button" on:click=open_embed data-testid="embed-button">"Embed"</button>
            </div>
        </header>
    }
}
