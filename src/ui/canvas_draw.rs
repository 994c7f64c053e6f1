//! A canvas drawn once its width is known, for pages without the app's context (the lazily
//! loaded benchmark module): the theme comes from `<html data-theme>` or the system.

use super::canvas::Draw;
use super::dom;
use crate::plots::{Theme, DARK, LIGHT};
use leptos::html::Canvas;
use leptos::prelude::*;
use plotters_canvas::CanvasBackend;

/// The theme the page shows: `data-theme` on `<html>` if set to light or dark, else the system's.
pub fn page_theme() -> Theme {
    let attr = document().document_element().and_then(|e| e.get_attribute("data-theme")).unwrap_or_default();
    match attr.as_str() {
        "dark" => DARK,
        "light" => LIGHT,
        _ if dom::prefers_dark() => DARK,
        _ => LIGHT,
    }
}

/// A canvas of `height` CSS pixels at its container's width, drawn by `draw`.
pub fn canvas(draw: Draw, height: u32, testid: &'static str, label: &'static str) -> impl IntoView {
    let node = NodeRef::<Canvas>::new();
    Effect::new(move |_| {
        let Some(c) = node.get() else { return };
        let w = c.client_width().max(240) as u32;
        c.set_width(w);
        c.set_height(height);
        if let Some(backend) = CanvasBackend::with_canvas_object(c) {
            let root = plotters::prelude::IntoDrawingArea::into_drawing_area(backend);
            draw(&root, &page_theme());
        }
    });
    view! { <canvas node_ref=node role="img" aria-label=label data-testid=testid class="chart" style:height=format!("{height}px")></canvas> }
}
