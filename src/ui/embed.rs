//! Embed mode and the embed dialog.
use leptos::prelude::*;

#[component]
pub fn EmbedView() -> impl IntoView {
    view! { <p>"embed"</p> }
}

#[component]
pub fn EmbedButton() -> impl IntoView {
    view! { <span></span> }
}
