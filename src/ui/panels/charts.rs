//! The charts: memory vs sequence length, model size, micro-batch and GPU count, and the step
//! timeline — as tabs on the full page, one at a time ([`ChartPanel`]) in an embed.
//!
//! Each panel memoizes its sweep ([`crate::estimator::sweep::run`]) on the sweep's key (the
//! configuration without what the chart sweeps over or merely displays), so changing the unit or
//! the swept value inside the axis only redraws. Drawing returns the chart's [`Frame`]; the hover
//! and keyboard read-outs map CSS pixels back through it to the chart's [`Table`], the same
//! numbers the CSV export writes.
//!
//! Performance: `trainmem:sweep:<kind>` measures a sweep when it reruns, `trainmem:charts` the
//! sweep (if due) and the draw of the visible chart; the panel also carries its last sweep +
//! draw time in `data-render-ms`.

use crate::config::Config;
use crate::estimator::sweep;
use crate::estimator::units::format_bytes;
use crate::plots::{hex, ChartData, ChartKind, Frame, Table};
use crate::ui::canvas::{ChartCanvas, Draw, Height};
use crate::ui::dom;
use crate::ui::html::esc;
use crate::ui::state::use_store;
use leptos::html::Canvas;
use leptos::prelude::*;
use std::rc::Rc;
use wasm_bindgen::{JsCast, JsValue};

/// All charts as a tab list (one chart computed and drawn at a time); the tab opened first is
/// the `view=` of the link if it names a chart.
#[component]
pub fn Charts() -> impl IntoView {
    let store = use_store();
    let active = RwSignal::new(ChartKind::from_view(&store.view.get_untracked()).unwrap_or(ChartKind::Seq));
    let select = move |k: ChartKind, focus: bool| {
        active.set(k);
        if focus {
            if let Some(el) =
                document().get_element_by_id(&format!("chart-tab-{k}")).and_then(|e| e.dyn_into::<web_sys::HtmlElement>().ok())
            {
                let _ = el.focus();
            }
        }
    };
    let on_key = move |ev: leptos::ev::KeyboardEvent| {
        let all = ChartKind::ALL;
        let i = all.iter().position(|k| *k == active.get_untracked()).unwrap_or(0);
        let next = match ev.key().as_str() {
            "ArrowRight" => all[(i + 1) % all.len()],
            "ArrowLeft" => all[(i + all.len() - 1) % all.len()],
            "Home" => all[0],
            "End" => all[all.len() - 1],
            _ => return,
        };
        ev.prevent_default();
        select(next, true);
    };
    let tabs = ChartKind::ALL
        .into_iter()
        .map(|k| {
            let selected = move || active.get() == k;
            view! {
                <button type="button" role="tab" id=format!("chart-tab-{k}") data-testid=format!("chart-tab-{k}")
                    aria-selected=move || selected().to_string() aria-controls="chart-tabpanel"
                    tabindex=move || if selected() { "0" } else { "-1" } class="chart-tab"
                    on:click=move |_| select(k, false)>{k.tab()}</button>
            }
        })
        .collect_view();
    view! {
        <section class="charts" aria-labelledby="charts-h" data-testid="charts" data-panel="charts">
            <h2 id="charts-h">"Charts"</h2>
            <p class="hint">"Point at a chart (or focus it and use the arrow keys) to read every series' value; each chart exports as SVG, PNG and CSV."</p>
            <div class="chart-tabs" role="tablist" aria-label="Charts" on:keydown=on_key>{tabs}</div>
            <div id="chart-tabpanel" role="tabpanel" aria-labelledby=move || format!("chart-tab-{}", active.get())>
                {move || {
                    let kind = active.get();
                    view! { <ChartPanel kind=kind/> }
                }}
            </div>
        </section>
    }
}

/// Points of the step-timeline chart (about one per device pixel of a wide chart).
const TRACE_POINTS: usize = 600;

/// The chart's data for the live configuration: its sweep (memoized on `key`) with the unit,
/// names and marker of `cfg`.
fn chart_of(kind: ChartKind, key: &Config) -> Result<ChartData, String> {
    match kind.axis() {
        Some(axis) => sweep::run(axis, key).map(|s| ChartData::from_sweep(s, key)).map_err(|e| e.to_string()),
        // The step op by op with the allocator's reserved memory; the coarse timeline where the
        // trace cannot be simulated.
        None => crate::estimator::estimate(key)
            .map(|e| match crate::estimator::reserve::step_trace(key, e.stream_at(), TRACE_POINTS) {
                Ok(t) => ChartData::trace(&t, &e, key),
                Err(_) => ChartData::timeline(&e, key),
            })
            .map_err(|e| e.to_string()),
    }
}

/// One chart with its read-out, exports and "open alone" link; what an embed shows for
/// `view=seq|params|batch|gpus|timeline`.
#[component]
pub fn ChartPanel(kind: ChartKind) -> impl IntoView {
    let store = use_store();
    // The sweep, recomputed only when what it depends on changes (the timeline is the
    // estimate's own, keyed on the whole configuration).
    let key = Memo::new(move |_| store.config.with(|c| kind.axis().map_or_else(|| c.clone(), |a| sweep::key(a, c))));
    let sweep_started = StoredValue::new(None::<String>);
    let swept = Memo::new(move |_| {
        let sweep = || key.with(|k| chart_of(kind, k));
        if !dom::timing() {
            return sweep();
        }
        let (start, end) = (format!("trainmem:sweep:{kind}:start"), format!("trainmem:sweep:{kind}:end"));
        dom::mark(&start);
        let r = sweep();
        dom::mark(&end);
        dom::measure(&format!("trainmem:sweep:{kind}"), &start, &end);
        sweep_started.set_value(Some(start));
        r
    });
    // The sweep in the panel's own task; the canvas draws it in the next ([`ChartCanvas`]).
    swept.with_untracked(|_| ());
    // The sequence chart's view (`chart=`, in the address): a log memory axis, and the recipe
    // comparison (none, op, full, compile) — a second estimate per length and recipe, so
    // computed only when asked, and memoized on the sweep as it is.
    let seq = kind == ChartKind::Seq;
    let log_y = Memo::new(move |_| seq && store.chart.with(|c| c.log_y));
    let recipes_on = Memo::new(move |_| seq && store.chart.with(|c| c.recipes));
    let recipes = Memo::new(move |_| {
        if !recipes_on.get() {
            return None;
        }
        key.with(|k| {
            swept.with(|d| match d {
                Ok(ChartData::Seq(s)) => Some(dom::timed("sweep:seq:recipes", || s.sweep.compare_recipes(k))),
                _ => None,
            })
        })
    });
    // What is drawn: the sweep with the live unit, marker and options.
    let live = Memo::new(move |_| {
        let log = log_y.get();
        let compared = recipes.get();
        store.config.with(|cfg| {
            store.estimate.with(|e| {
                swept.with(|d| {
                    d.clone().map(|d| match d.with_current(cfg, e.as_ref().ok()) {
                        ChartData::Seq(mut s) => {
                            s.log_y = log;
                            if let Some((lines, refused)) = compared.clone() {
                                s.sweep.recipes = lines;
                                s.sweep.refused_recipes = refused;
                            }
                            ChartData::Seq(s)
                        }
                        other => other,
                    })
                })
            })
        })
    });
    // Course mode's compare: B's peak over the same axes (the timeline has none).
    let b_series = Memo::new(move |_| {
        store.compare.with(|b| {
            let b = b.as_ref()?;
            let key = kind.axis().map_or_else(|| b.clone(), |a| sweep::key(a, b));
            let d = chart_of(kind, &key).ok()?;
            store.compare_estimate.with(|e| d.with_current(b, e.as_ref().and_then(|e| e.as_ref().ok()))).overlay_series()
        })
    });
    let table = Memo::new(move |_| {
        let t = store.look().chart_theme();
        dom::timed("table", || live.with(|d| d.as_ref().ok().map(|d| d.table(&t))))
    });
    let frame = StoredValue::new_local(None::<Frame>);
    let label = RwSignal::new(String::new());
    let frame_version = RwSignal::new(0u64);
    let render_ms = RwSignal::new(0.0f64);
    let draw: Draw = Rc::new(move |root, theme| {
        let timing = dom::timing();
        if timing {
            dom::mark("trainmem:charts:start");
        }
        let t0 = dom::now_ms();
        let overlay = b_series.get();
        let mut text = live.with(|d| d.as_ref().map_or_else(|e| format!("No chart: {e}"), ChartData::describe));
        if overlay.is_some() {
            text.push_str(" Dashed: the peak of the compared configuration B.");
        }
        let layout = live.with(|d| match d {
            Ok(d) => match &overlay {
                Some(b) => d.draw_compared(root, theme, b),
                None => d.draw(root, theme),
            }
            .ok()
            .map(|(f, l)| {
                frame.set_value(Some(f));
                l
            }),
            Err(e) => {
                frame.set_value(None);
                let _ = root.fill(&theme.background);
                let style = plotters::style::IntoFont::into_font(("sans-serif", theme.px(14))).color(&theme.muted);
                let _ = root.draw(&plotters::element::Text::new(format!("No chart: {e}"), (14, 20), style));
                let _ = root.present();
                None
            }
        });
        if timing {
            // Sweep (when this draw follows one) + draw: the page-speed script's charts figure.
            dom::mark("trainmem:charts:end");
            let start = sweep_started.try_update_value(Option::take).flatten().unwrap_or_else(|| "trainmem:charts:start".to_string());
            dom::measure("trainmem:charts", &start, "trainmem:charts:end");
        }
        render_ms.set(dom::now_ms() - t0);
        if label.with_untracked(|l| *l != text) {
            label.set(text);
        }
        frame_version.update(|v| *v += 1);
        layout
    });
    let height: Height = Rc::new(move |w, theme| live.with(|d| d.as_ref().map_or(120, |d| d.height(w, theme))));
    let canvas = NodeRef::<Canvas>::new();

    // The read-out: the index of the x value under the pointer (or stepped to by keyboard).
    let hover = RwSignal::new(None::<usize>);
    let on_move = move |ev: web_sys::MouseEvent| {
        let Some(c) = canvas.get_untracked() else { return };
        let r = c.get_bounding_client_rect();
        let p = ((ev.client_x() as f64 - r.left()).round() as i32, (ev.client_y() as f64 - r.top()).round() as i32);
        let i = frame.with_value(|f| f.as_ref().and_then(|f| table.with_untracked(|t| t.as_ref().and_then(|t| f.index_at(&t.x, p, 6)))));
        if hover.get_untracked() != i {
            hover.set(i);
        }
    };
    let on_key = move |ev: leptos::ev::KeyboardEvent| {
        let n = table.with_untracked(|t| t.as_ref().map_or(0, Table::len));
        if n == 0 {
            return;
        }
        let cur = hover.get_untracked();
        let next = match ev.key().as_str() {
            "ArrowRight" | "ArrowUp" => Some(cur.map_or(0, |i| (i + 1).min(n - 1))),
            "ArrowLeft" | "ArrowDown" => Some(cur.map_or(0, |i| i.saturating_sub(1))),
            "Home" => Some(0),
            "End" => Some(n - 1),
            "Escape" => None,
            _ => return,
        };
        ev.prevent_default();
        hover.set(next);
    };
    // Where the crosshair goes (CSS pixels inside the frame) and what the read-out says.
    let cross = move || {
        frame_version.get();
        let i = hover.get()?;
        let c = canvas.get()?;
        let x = table.with(|t| t.as_ref().and_then(|t| t.x.get(i).copied()))?;
        frame.with_value(|f| {
            let f = f.as_ref()?;
            let (px, _) = f.to_px(x, f.y_axis().lo());
            let ys = f.y_pixels();
            let (top, bottom) = (ys.start.min(ys.end) as f64, ys.start.max(ys.end) as f64);
            let (ox, oy) = ((c.offset_left() + c.client_left()) as f64, (c.offset_top() + c.client_top()) as f64);
            let right_half = (px as f64) > c.client_width() as f64 * 0.55;
            Some((ox + px as f64, oy + top, bottom - top, right_half))
        })
    };
    // The crosshair and the read-out's box, as HTML (rebuilt whole as the pointer moves).
    let tooltip = move || {
        let Some((x, top, h, right)) = cross() else { return String::new() };
        let Some(i) = hover.get() else { return String::new() };
        let unit = store.unit();
        table.with(|t| {
            let Some(t) = t.as_ref() else { return String::new() };
            let at = if right { format!("right:calc(100% - {:.1}px)", x - 10.0) } else { format!("left:{:.1}px", x + 10.0) };
            let mut s = format!(
                "<div class=\"chart-crosshair\" data-testid=\"chart-{kind}-crosshair\" style=\"left:{x:.1}px;top:{top:.1}px;height:{h:.1}px\"></div>\
                 <div class=\"chart-tooltip\" data-testid=\"chart-{kind}-tooltip\" style=\"{at};top:{:.1}px\"><div class=\"tt-head\">{}</div>",
                top + 4.0,
                esc(t.x_text.get(i).map_or("", |s| s.as_str()))
            );
            for r in t.readings(i) {
                s.push_str(&format!(
                    "<div class=\"tt-row\"><span class=\"tt-swatch\" style=\"background:{}\"></span><span class=\"tt-label\">{}</span><span class=\"tt-value\">{}</span></div>",
                    hex(r.color),
                    esc(&r.label),
                    r.bytes.map_or_else(|| "n/a".to_string(), |b| format_bytes(b, unit))
                ));
            }
            s.push_str("</div>");
            s
        })
    };
    let sentence = move || {
        let unit = store.unit();
        hover.get().and_then(|i| table.with(|t| t.as_ref().map(|t| t.sentence(i, unit)))).unwrap_or_default()
    };

    // Exports.
    let export_svg = move |_| {
        let w = canvas.get_untracked().map_or(960, |c| (c.client_width().max(480)) as u32);
        let t = store.look().chart_theme();
        if let Ok(d) = live.get_untracked() {
            let svg = d.svg(&t, (w, d.height(w, &t)));
            dom::download(&kind.filename("svg"), "image/svg+xml", svg.as_bytes());
        }
    };
    let export_png = move |_| {
        let Some(c) = canvas.get_untracked() else { return };
        let name = kind.filename("png");
        let cb = wasm_bindgen::closure::Closure::once_into_js(move |blob: JsValue| {
            if let Ok(b) = blob.dyn_into::<web_sys::Blob>() {
                dom::download_blob(&name, &b);
            }
        });
        let _ = c.to_blob(cb.unchecked_ref());
    };
    let export_csv = move |_| {
        if let Ok(d) = live.get_untracked() {
            dom::download(&kind.filename("csv"), "text/csv", d.csv().as_bytes());
        }
    };
    // "Open chart alone": this configuration with only this chart, in embed mode (the sequence
    // chart as it is drawn here).
    let alone = move || {
        let q = store.config.with(crate::config::encode_query);
        let view = if seq { store.chart.with(|c| c.encode()).map(|v| format!("&chart={v}")).unwrap_or_default() } else { String::new() };
        if q.is_empty() {
            format!("?embed=1&view={kind}{view}")
        } else {
            format!("?{q}&embed=1&view={kind}{view}")
        }
    };
    let heading = format!("chart-{kind}-h");
    let labelled_by = heading.clone();

    view! {
        <section class="chart-panel" aria-labelledby=labelled_by data-testid=format!("chart-panel-{kind}") data-panel=kind.as_str()
            data-render-ms=move || format!("{:.2}", render_ms.get()) data-compared=move || b_series.with(Option::is_some).to_string()>
            <h3 id=heading>{kind.title()}</h3>
            <div class="chart-frame" tabindex="0" role="group" data-testid=format!("chart-{kind}-frame")
                aria-label=format!("{}: interactive chart. Arrow keys step through the values, Escape hides them.", kind.title())
                aria-describedby=format!("chart-{kind}-readout")
                on:mousemove=on_move on:mouseleave=move |_| hover.set(None) on:keydown=on_key on:blur=move |_| hover.set(None)>
                <ChartCanvas label=label draw=draw height=height testid=kind.canvas_testid() node=canvas/>
                <div class="chart-overlay" aria-hidden="true" inner_html=tooltip></div>
            </div>
            <p id=format!("chart-{kind}-readout") class="sr-only" aria-live="polite" data-testid=format!("chart-{kind}-readout")>{sentence}</p>
            <div class="chart-tools" role="toolbar" aria-label=format!("{} exports", kind.title())>
                {(kind == ChartKind::Seq).then(|| view! {
                    <label class="logy"><input type="checkbox" data-testid="chart-seq-logy" prop:checked=move || log_y.get()
                        on:change=move |ev| store.set_chart_log(event_target_checked(&ev))/>" Log memory axis (s² vs s as slopes 2 vs 1)"</label>
                    <label class="logy"><input type="checkbox" data-testid="chart-seq-recipes" prop:checked=move || recipes_on.get()
                        on:change=move |ev| store.set_chart_recipes(event_target_checked(&ev))/>" Compare recipes: no recomputation, op-level SAC, full recomputation, torch.compile"</label>
                })}
                <button type="button" data-testid=format!("export-{kind}-svg") on:click=export_svg>"Download SVG"</button>
                <button type="button" data-testid=format!("export-{kind}-png") on:click=export_png>"Download PNG"</button>
                <button type="button" data-testid=format!("export-{kind}-csv") on:click=export_csv>"Download data (CSV)"</button>
                {(!store.embed).then(|| view! { <a data-testid=format!("open-{kind}") href=alone target="_blank" rel="noopener">"Open chart alone ↗"</a> })}
            </div>
        </section>
    }
}
