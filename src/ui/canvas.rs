//! Draws the plots module's charts on `<canvas>` elements, sharp on every screen: a chart draws
//! into a [`Scene`] at its size in CSS pixels, and the scene is painted on a canvas that holds
//! `devicePixelRatio` device pixels per CSS pixel (its context scaled to match). A chart is
//! redrawn whenever what it reads changes, and when the canvas is resized.
//!
//! Each drawing reports its [`Layout`] (the plot area and every title, legend and note box, in
//! CSS pixels), which the canvas carries as `data-layout` for the browser tests, and ends with
//! the performance mark `trainmem:drawn:<testid>`.

use super::dom;
use super::state::use_store;
use crate::plots::scene::{draw_scene, Align, Area, Baseline, Scene, Shape};
use crate::plots::{Layout, Theme};
use leptos::html::Canvas;
use leptos::prelude::*;
use std::rc::Rc;
use wasm_bindgen::JsCast;
use web_sys::CanvasRenderingContext2d as Context;

/// Draws a chart in a theme; returns its layout (`None` if it could not draw).
pub type Draw = Rc<dyn Fn(&Area, &Theme) -> Option<Layout>>;
/// The height a chart takes at a width, in a theme (CSS pixels).
pub type Height = Rc<dyn Fn(u32, &Theme) -> u32>;

/// A horizontal or vertical line of odd width sits on pixel centres (else it blurs over two).
fn crisp(a: (i32, i32), b: (i32, i32), width: u32) -> ((f64, f64), (f64, f64)) {
    let half = if width % 2 == 1 { 0.5 } else { 0.0 };
    let (mut a, mut b) = ((a.0 as f64, a.1 as f64), (b.0 as f64, b.1 as f64));
    if a.0 == b.0 {
        a.0 += half;
        b.0 += half;
    }
    if a.1 == b.1 {
        a.1 += half;
        b.1 += half;
    }
    (a, b)
}

fn trace(ctx: &Context, points: &[(i32, i32)]) {
    ctx.begin_path();
    for (i, (x, y)) in points.iter().enumerate() {
        if i == 0 {
            ctx.move_to(*x as f64, *y as f64);
        } else {
            ctx.line_to(*x as f64, *y as f64);
        }
    }
}

/// Paints a scene on a canvas' context (in the context's own units). The context's state is set
/// only when it changes (setting `font` makes the browser parse a CSS font: the dearest call of
/// a redraw when made for every text).
pub fn paint(ctx: &Context, scene: &Scene) {
    let mut font = String::new();
    let (mut align_set, mut baseline_set) = (None, None);
    for shape in &scene.shapes {
        match shape {
            Shape::Line { from, to, paint, width } => {
                let (a, b) = crisp(*from, *to, *width);
                ctx.set_stroke_style_str(&paint.css());
                ctx.set_line_width(*width as f64);
                ctx.begin_path();
                ctx.move_to(a.0, a.1);
                ctx.line_to(b.0, b.1);
                ctx.stroke();
            }
            Shape::Path { points, paint, width } => {
                ctx.set_stroke_style_str(&paint.css());
                ctx.set_line_width(*width as f64);
                trace(ctx, points);
                ctx.stroke();
            }
            Shape::Rect { from, to, paint, fill, width } => {
                let (x, y, w, h) = (from.0 as f64, from.1 as f64, (to.0 - from.0) as f64, (to.1 - from.1) as f64);
                if *fill {
                    ctx.set_fill_style_str(&paint.css());
                    ctx.fill_rect(x, y, w, h);
                } else {
                    ctx.set_stroke_style_str(&paint.css());
                    ctx.set_line_width((*width).max(1) as f64);
                    ctx.stroke_rect(x + 0.5, y + 0.5, w, h);
                }
            }
            Shape::Polygon { points, paint } => {
                ctx.set_fill_style_str(&paint.css());
                trace(ctx, points);
                ctx.close_path();
                ctx.fill();
            }
            Shape::Circle { center, radius, paint, fill, width } => {
                ctx.begin_path();
                let _ = ctx.arc(center.0 as f64, center.1 as f64, *radius as f64, 0.0, std::f64::consts::TAU);
                if *fill {
                    ctx.set_fill_style_str(&paint.css());
                    ctx.fill();
                } else {
                    ctx.set_stroke_style_str(&paint.css());
                    ctx.set_line_width(*width as f64);
                    ctx.stroke();
                }
            }
            Shape::Text { text, at, size, bold, family, paint, align, baseline, degrees } => {
                let f = format!("{}{size}px {family}", if *bold { "bold " } else { "" });
                let a = match align {
                    Align::Start => "start",
                    Align::Center => "center",
                    Align::End => "end",
                };
                let b = match baseline {
                    Baseline::Top => "top",
                    Baseline::Middle => "middle",
                    Baseline::Bottom => "bottom",
                };
                ctx.set_fill_style_str(&paint.css());
                if *degrees != 0 {
                    // Rotated (the y axis' title): its own state, restored after.
                    ctx.save();
                    let _ = ctx.translate(at.0 as f64, at.1 as f64);
                    let _ = ctx.rotate(*degrees as f64 * std::f64::consts::PI / 180.0);
                    ctx.set_font(&f);
                    ctx.set_text_align(a);
                    ctx.set_text_baseline(b);
                    let _ = ctx.fill_text(text, 0.0, 0.0);
                    ctx.restore();
                } else {
                    if f != font {
                        ctx.set_font(&f);
                        font = f;
                    }
                    if Some(a) != align_set {
                        ctx.set_text_align(a);
                        align_set = Some(a);
                    }
                    if Some(b) != baseline_set {
                        ctx.set_text_baseline(b);
                        baseline_set = Some(b);
                    }
                    let _ = ctx.fill_text(text, at.0 as f64, at.1 as f64);
                }
            }
        }
    }
}

/// Draws a chart on `canvas`, `w` CSS pixels wide and `height(w)` high: the chart into a scene,
/// the scene onto the canvas at the device's pixel ratio, the layout into `data-layout`, then
/// the mark `trainmem:drawn:<testid>`. Nothing if `w` is 0. It reads no layout (the width comes
/// from a resize observer, the canvas' border lies outside its content box), so drawing after
/// other panels changed never forces the page to lay out.
pub fn draw_on(
    canvas: &web_sys::HtmlCanvasElement,
    w: u32,
    theme: &Theme,
    draw: &dyn Fn(&Area, &Theme) -> Option<Layout>,
    height: &dyn Fn(u32, &Theme) -> u32,
) {
    if w == 0 {
        return;
    }
    let id = canvas.get_attribute("data-testid").unwrap_or_default();
    let h = height(w, theme).max(1);
    let (scene, layout) = dom::timed(&format!("scene:{id}"), || draw_scene((w, h), |root| draw(root, theme)));
    let ratio = dom::pixel_ratio();
    canvas.set_width((w as f64 * ratio).round() as u32);
    canvas.set_height((h as f64 * ratio).round() as u32);
    let _ = web_sys::HtmlElement::style(canvas).set_property("height", &format!("{h}px"));
    let ctx = canvas.get_context("2d").ok().flatten().and_then(|c| c.dyn_into::<Context>().ok());
    if let Some(ctx) = ctx {
        if ctx.set_transform(ratio, 0.0, 0.0, ratio, 0.0, 0.0).is_ok() {
            dom::timed(&format!("paint:{id}"), || paint(&ctx, &scene));
        }
    }
    if let Some(layout) = layout {
        let _ = canvas.set_attribute("data-layout", &layout.json());
    }
    dom::mark(&format!("trainmem:drawn:{id}"));
}

/// A canvas as wide as its container, `height(width)` high, drawn by `draw` inside a reactive
/// effect: whatever signals `draw` and `height` read, a change redraws it, as does the theme
/// and the canvas' own width.
///
/// `label` is the accessible description: canvases are images to assistive technology, so the
/// caller describes the data in words (and every chart also has a table/CSV export).
#[component]
pub fn ChartCanvas(
    #[prop(into)] label: Signal<String>,
    draw: Draw,
    height: Height,
    testid: &'static str,
    #[prop(optional)] node: Option<NodeRef<Canvas>>,
) -> impl IntoView {
    let node = node.unwrap_or_default();
    let store = use_store();
    let width = RwSignal::new(0u32);
    // The width follows the element (a resize observer that goes with the canvas).
    let watch = StoredValue::new_local(None::<dom::ResizeWatch>);
    Effect::new(move |_| {
        let Some(canvas) = node.get() else { return };
        let el = canvas.clone();
        let w = dom::ResizeWatch::new(&canvas, move || {
            let w = el.client_width().max(0) as u32;
            if w > 0 && width.try_get_untracked().is_some_and(|old| old != w) {
                width.set(w);
            }
        });
        watch.set_value(w);
    });
    // The first drawing waits a task after the canvas has its width: the panel's creation is
    // one task and the drawing (and the first compile of its code) another, so that neither
    // blocks input for long at the page's start-up. Later drawings follow their changes at once.
    let armed = RwSignal::new(false);
    Effect::new(move |_| {
        let w = width.get();
        let theme = store.look().chart_theme();
        let Some(canvas) = node.get() else { return };
        if !armed.get() {
            if w > 0 {
                set_timeout(
                    move || {
                        if armed.try_get_untracked() == Some(false) {
                            armed.set(true)
                        }
                    },
                    std::time::Duration::ZERO,
                );
            }
            return;
        }
        draw_on(&canvas, w, &theme, &*draw, &*height);
    });
    view! { <canvas node_ref=node role="img" aria-label=move || label.get() data-testid=testid class="chart"></canvas> }
}
