//! The sweep charts and the step timeline (being built).
use leptos::prelude::*;

/// All charts, as panels.
#[component]
pub fn Charts() -> impl IntoView {
    view! { <section class="charts" aria-label="Charts"></section> }
}
