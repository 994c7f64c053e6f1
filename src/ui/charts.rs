//! The charts: memory vs sequence length, model size, micro-batch and GPU count, and the step
//! timeline — as tabs on the full page, and one at a time (`ChartPanel`) in embed mode.
//!
//! Each panel memoizes its sweep on [`sweep_key`] (the configuration without what the chart
//! sweeps over or merely displays), so changing the unit or the swept value inside the axis only
//! redraws. Drawing returns the chart's [`Frame`]; the hover and keyboard read-outs map pixels
//! back through it to the chart's [`Table`], the same numbers the CSV export writes.
//!
//! Performance marks: `trainmem:sweep:<kind>` (the estimator sweep, when it reruns) and
//! `trainmem:charts` (sweep if due + draw of the visible chart) as `performance.measure`
//! entries; the panel also carries the last sweep+draw time in `data-render-ms`.

use super::app;
use super::canvas::{theme, ChartCanvas, Draw};
use super::dom;
use crate::config::encode_query;
use crate::estimator::units::format_bytes;
use crate::plots::timeline::timeline_data;
use crate::plots::{chart_data, hex, sweep_key, ChartData, Frame, Table};
use leptos::html::Canvas;
use leptos::prelude::*;
use std::rc::Rc;
use wasm_bindgen::{JsCast, JsValue};

pub use crate::plots::ChartKind;

/// Canvas height of every chart, CSS pixels.
const HEIGHT: u32 = 420;

fn measure(name: &str, start: &str, end: &str) {
    if let Some(p) = window().performance() {
        let _ = p.measure_with_start_mark_and_end_mark(name, start, end);
    }
}

/// All charts as a tab list (one chart computed and drawn at a time); the tab opened first is
/// the `view=` of the link if it names a chart.
#[component]
pub fn Charts() -> impl IntoView {
    let app = app();
    let first = ChartKind::from_view(&app.view.get_untracked()).unwrap_or(ChartKind::Seq);
    let active = RwSignal::new(first);
    let select = move |k: ChartKind, focus: bool| {
        active.set(k);
        if focus {
            if let Some(el) = document().get_element_by_id(&format!("chart-tab-{k}")) {
                if let Ok(el) = el.dyn_into::<web_sys::HtmlElement>() {
                    let _ = el.focus();
                }
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
                    tabindex=move || if selected() { "0" } else { "-1" }
                    class="chart-tab" class:active=selected
                    style:font-weight=move || if selected() { "650" } else { "400" }
                    style:border-bottom=move || if selected() { "3px solid var(--accent)" } else { "3px solid transparent" }
                    on:click=move |_| select(k, false)>
                    {k.tab()}
                </button>
            }
        })
        .collect_view();
    view! {
        <section class="charts" aria-labelledby="charts-h" data-testid="charts">
            <h2 id="charts-h">"Charts"</h2>
            <p class="hint">"Point at a chart (or focus it and use the arrow keys) to read every series' value; each chart exports as SVG, PNG and CSV."</p>
            <div class="chart-tabs" role="tablist" aria-label="Charts" on:keydown=on_key
                style="display:flex;flex-wrap:wrap;gap:4px;border-bottom:1px solid var(--line);margin:6px 0 10px">
                {tabs}
            </div>
            <div id="chart-tabpanel" role="tabpanel" aria-labelledby=move || format!("chart-tab-{}", active.get())>
                {move || {
                    let k = active.get();
                    view! { <ChartPanel kind=k/> }
                }}
            </div>
        </section>
    }
}

/// One chart with its read-out, exports and "open alone" link; what embed mode shows for
/// `view=seq|params|batch|gpus|timeline`.
#[component]
pub fn ChartPanel(kind: ChartKind) -> impl IntoView {
    let app = app();
    // The sweep, recomputed only when what it depends on changes.
    let key = Memo::new(move |_| app.config.with(|c| sweep_key(kind, c)));
    // The estimate's error, if any (changes far less often than the estimate itself).
    let invalid = Memo::new(move |_| app.estimate.with(|e| e.as_ref().err().map(ToString::to_string)));
    // Set when the sweep reran: the next draw's measure then starts at the sweep's start.
    let sweep_started = StoredValue::new(None::<(String, f64)>);
    let swept: Memo<Result<ChartData, String>> = Memo::new(move |_| {
        let (start, end) = (format!("trainmem:sweep:{kind}:start"), format!("trainmem:sweep:{kind}:end"));
        let t0 = dom::now_ms();
        dom::mark(&start);
        let r = if kind == ChartKind::Timeline {
            app.estimate.with(|e| match e {
                Ok(e) => Ok(ChartData::Timeline(key.with(|k| timeline_data(e, k)))),
                Err(e) => Err(e.to_string()),
            })
        } else if let Some(e) = invalid.get() {
            Err(e)
        } else {
            key.with(|k| chart_data(kind, k).map_err(|e| e.to_string()))
        };
        dom::mark(&end);
        measure(&format!("trainmem:sweep:{kind}"), &start, &end);
        sweep_started.set_value(Some((start, t0)));
        r
    });
    let log_y = RwSignal::new(false);
    // What is drawn: the sweep with the live unit, marker and options.
    let live: Memo<Result<ChartData, String>> = Memo::new(move |_| {
        let cfg = app.config.get();
        let log = log_y.get();
        app.estimate.with(|e| {
            swept.with(|d| {
                d.clone().map(|d| match d.with_current(&cfg, e.as_ref().ok()) {
                    ChartData::Seq(mut s) => {
                        s.log_y = log;
                        ChartData::Seq(s)
                    }
                    other => other,
                })
            })
        })
    });
    let table: Memo<Option<Table>> = Memo::new(move |_| {
        let t = theme();
        live.with(|d| d.as_ref().ok().map(|d| d.table(&t)))
    });
    let frame = StoredValue::new_local(None::<Frame>);
    // The canvas' accessible description, set by the draw (so that only the draw reads the
    // chart's data, and the "trainmem:charts" measure spans the sweep and the draw).
    let label = RwSignal::new(String::new());
    let frame_version = RwSignal::new(0u64);
    let render_ms = RwSignal::new(0.0f64);
    let draw: Draw = Rc::new(move |root, theme| {
        dom::mark("trainmem:charts:start");
        let t0 = dom::now_ms();
        let text = live.with(|d| d.as_ref().map_or_else(|e| format!("No chart: {e}"), ChartData::describe));
        dom::mark("trainmem:charts:data");
        live.with(|d| match d {
            Ok(d) => {
                if let Ok(f) = d.draw(root, theme) {
                    frame.set_value(Some(f));
                }
            }
            Err(e) => {
                frame.set_value(None);
                let _ = root.fill(&theme.background);
                let style = plotters::style::IntoFont::into_font(("sans-serif", 14)).color(&theme.muted);
                let _ = root.draw(&plotters::element::Text::new(format!("No chart: {e}"), (14, 20), style));
                let _ = root.present();
            }
        });
        dom::mark("trainmem:charts:end");
        let (start, t0) =
            sweep_started.try_update_value(Option::take).flatten().unwrap_or_else(|| ("trainmem:charts:start".to_string(), t0));
        measure("trainmem:charts", &start, "trainmem:charts:end");
        measure("trainmem:charts:draw", "trainmem:charts:data", "trainmem:charts:end");
        render_ms.set(dom::now_ms() - t0);
        if label.with_untracked(|l| *l != text) {
            label.set(text);
        }
        frame_version.update(|v| *v += 1);
    });

    let canvas = NodeRef::<Canvas>::new();

    // The read-out: the index of the x value under the pointer (or stepped to by keyboard).
    let hover = RwSignal::new(None::<usize>);
    let pixel_of = move |c: &web_sys::HtmlCanvasElement, ev: &web_sys::MouseEvent| -> (i32, i32) {
        let r = c.get_bounding_client_rect();
        let sx = if r.width() > 0.0 { c.width() as f64 / (r.width() - 2.0 * c.client_left() as f64).max(1.0) } else { 1.0 };
        let x = (ev.client_x() as f64 - r.left() - c.client_left() as f64) * sx;
        let y = (ev.client_y() as f64 - r.top() - c.client_top() as f64) * sx;
        (x.round() as i32, y.round() as i32)
    };
    let on_move = move |ev: web_sys::MouseEvent| {
        let Some(c) = canvas.get_untracked() else { return };
        let p = pixel_of(&c, &ev);
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
    // Where the crosshair goes (CSS pixels inside the wrapper) and what the read-out says.
    let cross = move || {
        frame_version.get();
        let i = hover.get()?;
        let c = canvas.get()?;
        let x = table.with(|t| t.as_ref().and_then(|t| t.x.get(i).copied()))?;
        frame.with_value(|f| {
            let f = f.as_ref()?;
            let (px, _) = f.to_px(x, f.y_axis().lo());
            let ys = f.y_pixels();
            let scale = (c.client_width() as f64 / c.width().max(1) as f64).max(0.01);
            let off_x = (c.offset_left() + c.client_left()) as f64;
            let off_y = (c.offset_top() + c.client_top()) as f64;
            let (top, bottom) = (ys.start.min(ys.end) as f64, ys.start.max(ys.end) as f64);
            let right_half = (px as f64) > c.width() as f64 * 0.55;
            Some((off_x + px as f64 * scale, off_y + top * scale, (bottom - top) * scale, right_half))
        })
    };
    let readings = move || {
        let i = hover.get()?;
        let unit = app.config.with(|c| c.unit);
        table.with(|t| {
            let t = t.as_ref()?;
            let head = t.x_text.get(i)?.clone();
            let rows: Vec<(String, String, String)> = t
                .readings(i)
                .into_iter()
                .map(|r| (hex(r.color), r.label, r.bytes.map_or_else(|| "n/a".to_string(), |b| format_bytes(b, unit))))
                .collect();
            Some((head, rows))
        })
    };
    let sentence = move || {
        let unit = app.config.with(|c| c.unit);
        hover.get().and_then(|i| table.with(|t| t.as_ref().map(|t| t.sentence(i, unit)))).unwrap_or_default()
    };

    // Exports.
    let export_svg = move |_| {
        let (w, h) = canvas.get_untracked().map_or((960, HEIGHT), |c| (c.width().max(480), c.height().max(240)));
        let t = theme();
        if let Ok(d) = live.get_untracked() {
            let svg = d.svg(&t, (w, h));
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
    // "Open chart alone": this configuration with only this chart, in embed mode.
    let alone = move || {
        let q = app.config.with(encode_query);
        if q.is_empty() {
            format!("?embed=1&view={kind}")
        } else {
            format!("?{q}&embed=1&view={kind}")
        }
    };
    let heading_id = format!("chart-{kind}-h");
    let labelled_by = heading_id.clone();

    view! {
        <section class="chart-panel" aria-labelledby=labelled_by data-testid=format!("chart-panel-{kind}")
            data-render-ms=move || format!("{:.2}", render_ms.get())>
            <h3 id=heading_id>{kind.title()}</h3>
            <div class="chart-frame" tabindex="0" role="group" data-testid=format!("chart-{kind}-frame")
                aria-label=format!("{}: interactive chart. Arrow keys step through the values, Escape hides them.", kind.title())
                aria-describedby=format!("chart-{kind}-readout")
                style="position:relative"
                on:mousemove=on_move on:mouseleave=move |_| hover.set(None) on:keydown=on_key
                on:blur=move |_| hover.set(None)>
                <ChartCanvas label=label height=HEIGHT draw=draw testid=format!("chart-{kind}") node=canvas/>
                {move || cross().map(|(x, top, h, _)| view! {
                    <div class="chart-crosshair" aria-hidden="true" data-testid=format!("chart-{kind}-crosshair")
                        style="position:absolute;width:0;border-left:1px dashed var(--fg);pointer-events:none"
                        style:left=format!("{x:.1}px") style:top=format!("{top:.1}px") style:height=format!("{h:.1}px")></div>
                })}
                {move || cross().zip(readings()).map(|((x, top, _, right), (head, rows))| view! {
                    <div class="chart-tooltip" aria-hidden="true" data-testid=format!("chart-{kind}-tooltip")
                        style="position:absolute;z-index:2;pointer-events:none;background:var(--panel);color:var(--fg);border:1px solid var(--line);border-radius:6px;padding:6px 8px;font-size:0.8rem;line-height:1.35;box-shadow:0 2px 8px rgb(0 0 0 / 0.18);white-space:nowrap"
                        style:left=if right { String::new() } else { format!("{:.1}px", x + 10.0) }
                        style:right=if right { format!("calc(100% - {:.1}px)", x - 10.0) } else { String::new() }
                        style:top=format!("{:.1}px", top + 4.0)>
                        <div style="font-weight:650;margin-bottom:2px">{head}</div>
                        {rows.into_iter().map(|(color, label, value)| view! {
                            <div style="display:flex;gap:6px;align-items:center">
                                <span style="display:inline-block;width:10px;height:10px;border-radius:2px" style:background=color></span>
                                <span style="flex:1">{label}</span>
                                <span style="font-variant-numeric:tabular-nums;font-weight:600;margin-left:10px">{value}</span>
                            </div>
                        }).collect_view()}
                    </div>
                })}
            </div>
            <p id=format!("chart-{kind}-readout") class="sr-only" aria-live="polite" data-testid=format!("chart-{kind}-readout")>{sentence}</p>
            <div class="chart-tools" role="toolbar" aria-label=format!("{} exports", kind.title())
                style="display:flex;flex-wrap:wrap;gap:6px;align-items:center;margin:6px 0 0">
                {(kind == ChartKind::Seq).then(|| view! {
                    <label style="margin-right:auto">
                        <input type="checkbox" data-testid="chart-seq-logy" prop:checked=move || log_y.get()
                            on:change=move |ev| log_y.set(event_target_checked(&ev))/>
                        " Log memory axis (s² vs s as slopes 2 vs 1)"
                    </label>
                })}
                <button type="button" data-testid=format!("export-{kind}-svg") on:click=export_svg>"Download SVG"</button>
                <button type="button" data-testid=format!("export-{kind}-png") on:click=export_png>"Download PNG"</button>
                <button type="button" data-testid=format!("export-{kind}-csv") on:click=export_csv>"Download data (CSV)"</button>
                {(!app.embed).then(|| view! {
                    <a data-testid=format!("open-{kind}") href=alone target="_blank" rel="noopener">"Open chart alone ↗"</a>
                })}
            </div>
        </section>
    }
}
