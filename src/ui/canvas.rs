//! Draws the plots module's charts on `<canvas>` elements, redrawn whenever what they read
//! changes (and when the canvas is resized).

use super::app;
use crate::plots::{Theme, DARK, LIGHT};
use leptos::html::Canvas;
use leptos::prelude::*;
use plotters::coord::Shift;
use plotters::prelude::DrawingArea;
use plotters_canvas::CanvasBackend;
use std::rc::Rc;

/// The drawing function of one canvas.
pub type Draw = Rc<dyn Fn(&DrawingArea<CanvasBackend, Shift>, &Theme)>;

/// The current chart theme.
pub fn theme() -> Theme {
    if app().dark() {
        DARK
    } else {
        LIGHT
    }
}

/// A canvas that calls `draw` inside a reactive effect at its CSS width × `height`: whatever
/// signals `draw` reads, a change redraws it.
///
/// `label` is the accessible description: canvases are images to assistive technology, so the
/// caller describes the data in words (and every chart also has a table/CSV export).
#[component]
pub fn ChartCanvas(
    #[prop(into)] label: Signal<String>,
    height: u32,
    draw: Draw,
    #[prop(optional, into)] testid: String,
    #[prop(optional)] node: Option<NodeRef<Canvas>>,
) -> impl IntoView {
    let node = node.unwrap_or_default();
    let app = app();
    let width = RwSignal::new(0u32);
    // Track the element's width. The resize listener goes when the canvas does: charts mount
    // and unmount (tabs), and a listener outliving its signal would panic on the next resize.
    let listener = StoredValue::new_local(None::<WindowListenerHandle>);
    Effect::new(move |_| {
        let Some(canvas) = node.get() else { return };
        let measure = move || {
            let w = canvas.client_width().max(240) as u32;
            if width.try_get_untracked().is_some_and(|old| old != w) {
                width.set(w);
            }
        };
        measure();
        let handle = window_event_listener(leptos::ev::resize, move |_| measure());
        if let Some(old) = listener.try_update_value(|h| h.replace(handle)).flatten() {
            old.remove();
        }
    });
    on_cleanup(move || {
        if let Some(h) = listener.try_update_value(Option::take).flatten() {
            h.remove();
        }
    });
    Effect::new(move |_| {
        let w = width.get();
        let _theme = app.theme.get();
        let Some(canvas) = node.get() else { return };
        if w == 0 {
            return;
        }
        canvas.set_width(w);
        canvas.set_height(height);
        if let Some(backend) = CanvasBackend::with_canvas_object(canvas) {
            let root = plotters::prelude::IntoDrawingArea::into_drawing_area(backend);
            draw(&root, &theme());
        }
    });
    view! {
        <canvas node_ref=node role="img" aria-label=move || label.get() data-testid=testid
            style:height=format!("{height}px") class="chart"></canvas>
    }
}
