//! Problems with the link the page was opened with: each key that could not be used, and why.

use crate::ui::state::use_store;
use leptos::prelude::*;

#[component]
pub fn Notices() -> impl IntoView {
    let store = use_store();
    move || {
        store.notices.with(|n| {
            (!n.is_empty()).then(|| {
                let items = n.iter().map(|e| view! { <li><code>{e.key.clone()}</code>" = '"{e.value.clone()}"': "{e.reason.clone()}</li> }).collect_view();
                view! {
                    <div class="notice" role="alert" data-testid="notice">
                        <p><strong>"Some settings in this link could not be used"</strong>" — the rest of the configuration applies:"</p>
                        <ul>{items}</ul>
                        <button type="button" data-testid="dismiss-notice" on:click=move |_| store.notices.set(Vec::new())>"Dismiss"</button>
                    </div>
                }
            })
        })
    }
}
