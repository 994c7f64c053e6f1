//! Course mode's page-wide parts: what a course link sets on the page (`hide=`, `quiz=`), the
//! message protocol with the embedding page (docs/embed.md), the course tools (duplicate as B,
//! print, snapshot) and the print sheet.
//!
//! Messages out, each `{source: "trainmem", version: 1, type, …}`: `ready` (after the first
//! paint, with the state and the height), `resize` (see the embed page), `change` (each new
//! configuration), `answered` (see the exercises). Messages in: `setState` (a query string) and
//! `setTheme`, obeyed only from the parent's origin at load or an origin of `allow_origin=`.

use crate::config::encode_query;
use crate::config::KEYS;
use crate::course::exercises::Target;
use crate::course::panel::Panel;
use crate::estimator::expr::group_digits;
use crate::estimator::flatten;
use crate::estimator::units::format_bytes;
use crate::plots::bar::{bar_data, bar_height, draw_bar};
use crate::plots::{category_color, hex, svg_of};
use crate::ui::dom;
use crate::ui::html::esc;
use crate::ui::state::{gpu_of, use_store, Store, ThemeChoice};
use leptos::html::Div;
use leptos::prelude::*;
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};

/// The CSS that hides a quiz's chosen rows until the learner has guessed (the rest of what a
/// quiz hides is in the stylesheet, under `html[data-quiz=hidden]`).
fn quiz_rows_css(rows: &[String]) -> String {
    let q = "html[data-quiz=hidden]";
    if rows.is_empty() {
        return format!("{q} li.row .bytes, {q} li.row .share {{ visibility: hidden; }}");
    }
    let sel: Vec<String> = rows
        .iter()
        .filter(|r| r.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        .flat_map(|r| [format!("{q} li.row[data-row=\"{r}\"] .bytes"), format!("{q} li.row[data-row=\"{r}\"] .share")])
        .collect();
    format!("{} {{ visibility: hidden; }}", sel.join(", "))
}

/// Sets up what a course link asks of the whole page, and the conversation with an embedding
/// page. Effects here only keep the outside world (attributes of `<html>`, the parent window)
/// in step with the store.
pub fn provide_course(store: Store) {
    let (hide, quiz, rows) = store.course.with_value(|s| {
        let target = s.exercise.as_ref().map(|e| e.target.clone()).unwrap_or(Target::Memory(crate::course::exercises::Field::Peak));
        (s.hide.iter().map(|h| h.id()).collect::<Vec<_>>().join(" "), s.quiz, target.rows())
    });
    if !hide.is_empty() {
        dom::set_root_attribute("data-hide", &hide);
    }
    if quiz {
        let doc = document();
        if let (Ok(style), Some(head)) = (doc.create_element("style"), doc.head()) {
            style.set_text_content(Some(&quiz_rows_css(&rows)));
            let _ = head.append_child(&style);
        }
        Effect::new(move |_| dom::set_root_attribute("data-quiz", if store.revealed.get() { "revealed" } else { "hidden" }));
    }
    if dom::framed_parent().is_some() {
        talk_to_parent(store);
    }
}

/// The message protocol with the embedding page.
fn talk_to_parent(store: Store) {
    let parent = dom::parent_origin();
    // `change`: each configuration after the first.
    Effect::new(move |prev: Option<String>| {
        let q = store.config.with(encode_query);
        if prev.as_ref().is_some_and(|p| *p != q) {
            let (peak, fits) = store.estimate.with(|e| e.as_ref().map_or((0.0, false), |e| (e.memory.peak as f64, e.fits())));
            dom::post_to_parent("change", &[("state", q.clone().into()), ("peak_bytes", peak.into()), ("fits", fits.into())]);
        }
        q
    });
    // `ready`: after the first paint, with the state and the page's height.
    request_animation_frame(move || {
        let height = document().body().map_or(0.0, |b| dom::content_height(&b));
        dom::post_to_parent("ready", &[("state", store.config.with_untracked(encode_query).into()), ("height", height.into())]);
    });
    // `warning`: what in the link (or a `setState`) could not be used, as the notice says it.
    Effect::new(move |prev: Option<Vec<crate::config::ConfigError>>| {
        let now = store.notices.get();
        if !now.is_empty() && prev.as_ref() != Some(&now) {
            post_warning(&now);
        }
        now
    });
    let _ = window_event_listener(leptos::ev::message, move |ev: web_sys::MessageEvent| {
        let origin = ev.origin();
        if !store.course.with_value(|s| s.accepts_origin(&origin, parent.as_deref())) {
            return;
        }
        let data = ev.data();
        if js_sys::Reflect::get(&data, &"version".into()).ok().and_then(|v| v.as_f64()).is_some_and(|v| v != 1.0) {
            return;
        }
        match dom::field(&data, "type").as_deref() {
            Some("setState") => {
                if let Some(q) = dom::field(&data, "state") {
                    let errors = store.set_state(&q);
                    store.notices.set(errors);
                }
            }
            Some("setTheme") => {
                if let Some(t) = dom::field(&data, "theme").and_then(|t| ThemeChoice::parse(&t)) {
                    store.theme.set(t);
                }
            }
            _ => {}
        }
    });
}

/// Posts `warning` with the problems the page's notice lists: `notices` (`{key, value,
/// reason}` each) and `text` (the notice's sentence).
fn post_warning(notices: &[crate::config::ConfigError]) {
    let list = js_sys::Array::new();
    for n in notices {
        let o = js_sys::Object::new();
        let _ = js_sys::Reflect::set(&o, &"key".into(), &n.key.as_str().into());
        let _ = js_sys::Reflect::set(&o, &"value".into(), &n.value.as_str().into());
        let _ = js_sys::Reflect::set(&o, &"reason".into(), &n.reason.as_str().into());
        list.push(&o);
    }
    let text = format!(
        "Some settings in this link could not be used — the rest of the configuration applies: {}",
        notices.iter().map(|n| format!("{} = '{}': {}", n.key, n.value, n.reason)).collect::<Vec<_>>().join("; ")
    );
    dom::post_to_parent("warning", &[("notices", list.into()), ("text", text.into())]);
}

/// The snapshot of the current view as SVG: the verdict, the stacked bar and the ledger's rows.
fn snapshot_svg(store: Store) -> Option<String> {
    let theme = store.look().chart_theme();
    let cfg = store.config.get_untracked();
    store.estimate.with_untracked(|e| {
        let e = e.as_ref().ok()?;
        let unit = cfg.unit;
        let gpu = gpu_of(&cfg).label();
        let width = 900u32;
        let data = bar_data(e, unit, &gpu);
        let bar_h = bar_height(&data, width, &theme);
        let bar = svg_of((width, bar_h), |root| draw_bar(root, &data, &theme).map(|_| ()));
        let (fg, muted, bg) = (hex(theme.foreground), hex(theme.muted), hex(theme.background));
        let headline = crate::words::verdict(e, &cfg, &gpu).headline;
        let mut rows = String::new();
        let top = 96 + bar_h;
        let mut y = top + 28;
        for r in &e.components {
            rows.push_str(&format!(
                "<rect x=\"20\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"40\" y=\"{y}\" fill=\"{fg}\">{}</text><text x=\"{}\" y=\"{y}\" text-anchor=\"end\" fill=\"{fg}\">{}</text>",
                y - 11,
                hex(category_color(r.category)),
                esc(&r.label),
                width - 20,
                esc(&format_bytes(r.bytes, unit))
            ));
            y += 22;
        }
        let h = y + 10;
        Some(format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{h}\" viewBox=\"0 0 {width} {h}\" font-family=\"sans-serif\" font-size=\"{}\">\
             <rect width=\"100%\" height=\"100%\" fill=\"{bg}\"/>\
             <text x=\"20\" y=\"32\" font-size=\"{}\" font-weight=\"bold\" fill=\"{fg}\">{}</text>\
             <text x=\"20\" y=\"58\" fill=\"{fg}\">{}</text>\
             <text x=\"20\" y=\"80\" fill=\"{muted}\">Peak per GPU {} · {}</text>\
             <g transform=\"translate(0,90)\">{}</g>{rows}</svg>",
            theme.px(14),
            theme.px(20),
            esc(&format!("trainmem — {}", e.model)),
            esc(&headline),
            esc(&format_bytes(e.memory.peak, unit)),
            esc(&encode_query(&cfg)),
            bar.trim_start_matches(|c| c != '<').replacen("<?xml version=\"1.0\" encoding=\"UTF-8\"?>", "", 1),
        ))
    })
}

/// Draws an SVG document onto a canvas at twice its size and offers it as a PNG.
fn download_png(svg: String, name: &'static str) {
    let Ok(img) = web_sys::HtmlImageElement::new() else { return };
    let src = format!("data:image/svg+xml;charset=utf-8,{}", String::from(js_sys::encode_uri_component(&svg)));
    let image = img.clone();
    let onload = Closure::once_into_js(move || {
        let Some(canvas) = document().create_element("canvas").ok().and_then(|c| c.dyn_into::<web_sys::HtmlCanvasElement>().ok()) else {
            return;
        };
        let (w, h) = (image.natural_width(), image.natural_height());
        canvas.set_width(w * 2);
        canvas.set_height(h * 2);
        if let Some(ctx) = canvas.get_context("2d").ok().flatten().and_then(|c| c.dyn_into::<web_sys::CanvasRenderingContext2d>().ok()) {
            let _ = ctx.scale(2.0, 2.0);
            let _ = ctx.draw_image_with_html_image_element(&image, 0.0, 0.0);
        }
        let cb = Closure::once_into_js(move |blob: JsValue| {
            if let Ok(b) = blob.dyn_into::<web_sys::Blob>() {
                dom::download_blob(name, &b);
            }
        });
        let _ = canvas.to_blob(cb.unchecked_ref());
    });
    img.set_onload(Some(onload.unchecked_ref()));
    img.set_src(&src);
}

/// The print sheet's HTML: every input as a compact table, every ledger row with its formula
/// substituted with this configuration's numbers.
fn print_html(store: Store) -> String {
    let cfg = store.config.get_untracked();
    let mut s = String::from("<h2>Configuration</h2><table class=\"print-inputs\" data-testid=\"print-inputs\"><tbody>");
    for (i, k) in KEYS.iter().enumerate() {
        if i % 3 == 0 {
            s.push_str("<tr>");
        }
        s.push_str(&format!("<th scope=\"row\">{}</th><td>{}</td>", esc(k.name), esc(&(k.get)(&cfg))));
        if i % 3 == 2 {
            s.push_str("</tr>");
        }
    }
    s.push_str("</tbody></table>");
    if let Ok(e) = crate::estimator::analyse(&cfg).and_then(|a| a.explain()) {
        s.push_str("<h2>Every ledger row with its formula</h2><ol class=\"print-rows\" data-testid=\"print-rows\">");
        for r in flatten(&e.components).into_iter().chain(flatten(&e.host)) {
            s.push_str(&format!(
                "<li><strong>{}</strong> — {}<br><code class=\"subst\">{} = {}</code><br><code class=\"subst\">= {} B</code></li>",
                esc(&r.label),
                esc(&format_bytes(r.bytes, cfg.unit)),
                esc(&r.expr.symbolic()),
                esc(&r.expr.substituted()),
                group_digits(r.bytes)
            ));
        }
        s.push_str("</ol>");
    }
    s
}

/// Hidden on screen; filled just before printing (`beforeprint`, or the Print button) with the
/// inputs and every formula, which the print stylesheet shows in place of the form.
#[component]
pub fn PrintSheet() -> impl IntoView {
    let store = use_store();
    let node = NodeRef::<Div>::new();
    let _ = window_event_listener(leptos::ev::beforeprint, move |_| {
        if let Some(el) = node.get_untracked() {
            el.set_inner_html(&print_html(store));
        }
    });
    view! { <div class="print-sheet" data-testid="print-sheet" node_ref=node></div> }
}

/// The course tools: duplicate as B (or stop comparing), print, and snapshots of the view.
#[component]
pub fn CourseBar() -> impl IntoView {
    let store = use_store();
    let comparing = move || store.compare.with(Option::is_some);
    let print = move |_| {
        if let Some(el) = document().query_selector(".print-sheet").ok().flatten() {
            el.set_inner_html(&print_html(store));
        }
        let _ = window().print();
    };
    let svg = move |_| {
        if let Some(svg) = snapshot_svg(store) {
            dom::download("trainmem-snapshot.svg", "image/svg+xml", svg.as_bytes());
        }
    };
    let png = move |_| {
        if let Some(svg) = snapshot_svg(store) {
            download_png(svg, "trainmem-snapshot.png");
        }
    };
    let compare_shown = store.course.with_value(|s| s.shows(Panel::Compare));
    view! {
        <aside class="course-tools" aria-label="Course tools" data-testid="course-tools"><div class="row" role="toolbar" aria-label="Course tools">
            {compare_shown.then(|| view! {
                <button type="button" data-testid="duplicate-b" on:click=move |_| if comparing() { store.set_compare(None) } else { store.duplicate_as_b() }>
                    {move || if comparing() { "Stop comparing" } else { "Duplicate as B (compare)" }}
                </button>
            })}
            <button type="button" data-testid="print" on:click=print>"Print"</button>
            <button type="button" data-testid="snapshot-png" on:click=png>"Snapshot PNG"</button>
            <button type="button" data-testid="snapshot-svg" on:click=svg>"Snapshot SVG"</button>
        </div></aside>
    }
}
