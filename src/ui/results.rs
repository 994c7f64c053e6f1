//! The results: verdict, stacked bar, and the ledger whose rows open into their formulas.

use super::app;
use super::canvas::{ChartCanvas, Draw};
use crate::config::Config;
use crate::estimator::gpu;
use crate::estimator::ledger::{Bytes, Row};
use crate::estimator::units::{format_bytes, format_count};
use crate::plots::bar::{bar_data, draw_bar};
use crate::plots::{category_color, hex};
use leptos::prelude::*;
use std::collections::BTreeSet;
use std::rc::Rc;

/// Problems with the link the page was opened with.
#[component]
pub fn Notices() -> impl IntoView {
    let app = app();
    view! {
        <Show when=move || app.notices.with(|n| !n.is_empty())>
            <div class="notice" role="alert" data-testid="notice">
                <p><strong>"Some settings in this link could not be used"</strong>" — the rest of the configuration applies:"</p>
                <ul>
                    {move || app.notices.get().into_iter().map(|e| view! { <li><code>{e.key.clone()}</code>" = '"{e.value.clone()}"': "{e.reason.clone()}</li> }).collect_view()}
                </ul>
                <button type="button" data-testid="dismiss-notice" on:click=move |_| app.notices.set(Vec::new())>"Dismiss"</button>
            </div>
        </Show>
    }
}

pub fn gpu_label(c: &Config) -> String {
    if c.gpu == "custom" {
        format!("custom {} GiB GPU", c.gpu_gib)
    } else {
        gpu::gpu(&c.gpu).map_or_else(|| c.gpu.clone(), |g| g.name.to_string())
    }
}

/// Verdict and key figures.
#[component]
pub fn Verdict() -> impl IntoView {
    let app = app();
    move || {
        let c = app.config.get();
        let u = c.unit;
        match app.estimate.get() {
            Err(e) => view! {
                <div class="verdict bad" role="status" data-testid="estimate-error">
                    <p><strong>"This configuration cannot be estimated: "</strong>{e.to_string()}</p>
                </div>
            }
            .into_any(),
            Ok(e) => {
                let peak = e.memory.peak;
                let fits = peak <= e.capacity;
                let headroom = if fits { e.capacity - peak } else { peak - e.capacity };
                let gpu = gpu_label(&c);
                let headline = if fits {
                    format!("Fits on {gpu}: {} headroom", format_bytes(headroom, u))
                } else {
                    format!("Does not fit on {gpu}: needs {} more", format_bytes(headroom, u))
                };
                view! {
                    <div class="verdict" class:bad=!fits role="status" aria-live="polite" data-testid="verdict" data-fits=fits.to_string()>
                        <p class="headline">{headline}</p>
                        <dl class="stats">
                            <div><dt>"Peak per GPU"</dt><dd data-testid="peak-bytes" data-bytes=peak.to_string()>{format_bytes(peak, u)}<span class="sub">{format!("at: {}", e.memory.peak_event)}</span></dd></div>
                            <div><dt>"Sum of components"</dt><dd data-testid="total-bytes" data-bytes=e.memory.total.to_string()>{format_bytes(e.memory.total, u)}</dd></div>
                            <div><dt>"GPU capacity"</dt><dd data-testid="capacity-bytes" data-bytes=e.capacity.to_string()>{format_bytes(e.capacity, u)}</dd></div>
                            <div><dt>{format!("Cluster ({} GPUs)", e.layout.gpus)}</dt><dd>{format_bytes(e.memory.peak.saturating_mul(e.layout.gpus as u128), u)}</dd></div>
                            <div><dt>"Parameters"</dt><dd data-testid="param-count" data-count=e.parameter_count.to_string()>{format!("{} ({} trainable)", format_count(e.parameter_count), format_count(e.trainable_parameter_count))}</dd></div>
                            <div><dt>"Tokens per step"</dt><dd>{crate::estimator::expr::group_digits(e.layout.tokens_per_step)}</dd></div>
                        </dl>
                        {(e.memory.host > 0).then(|| view! { <p class="host">"Host (CPU) memory per GPU process: "{format_bytes(e.memory.host, u)}</p> })}
                        {(!e.warnings.is_empty()).then(|| view! { <ul class="warnings">{e.warnings.iter().map(|w| view! { <li>{w.clone()}</li> }).collect_view()}</ul> })}
                    </div>
                }
                .into_any()
            }
        }
    }
}

/// The stacked bar of components against the GPU (mounted by the extras module).
#[component]
pub fn Bar() -> impl IntoView {
    let app = app();
    let draw: Draw = Rc::new(move |root, theme| {
        let c = app.config.get();
        app.estimate.with(|e| {
            if let Ok(e) = e {
                let _ = draw_bar(root, &bar_data(e, c.unit, &gpu_label(&c)), theme);
            }
        });
    });
    let label = Signal::derive(move || {
        app.estimate.with(|e| match e {
            Ok(e) => format!("Stacked bar: the ledger's categories, {} in all, against a capacity of {}", e.memory.total, e.capacity),
            Err(_) => "no estimate".into(),
        })
    });
    view! { <ChartCanvas label=label height=150 draw=draw testid="bar-canvas".to_string()/> }
}

/// One line of the ledger, flattened (children follow their parent with a greater depth).
#[derive(Clone, Debug, PartialEq)]
struct Line {
    /// Stable across estimates while the row exists: its DOM is kept and only its figures change.
    key: String,
    id: &'static str,
    label: String,
    category: crate::estimator::ledger::Category,
    bytes: Bytes,
    depth: usize,
}

fn line_key(r: &Row, depth: usize, host: bool) -> String {
    format!("{}{}:{depth}:{}", if host { "host:" } else { "" }, r.id, r.label)
}

fn flatten_lines(rows: &[Row], depth: usize, host: bool, out: &mut Vec<Line>) {
    for r in rows {
        out.push(Line { key: line_key(r, depth, host), id: r.id, label: r.label.to_string(), category: r.category, bytes: r.bytes, depth });
        flatten_lines(&r.children, depth + 1, host, out);
    }
}

/// Finds the row behind a line's key (for its formula, rendered only while open).
fn find_row<'a>(rows: &'a [Row], depth: usize, host: bool, key: &str) -> Option<&'a Row> {
    rows.iter().find_map(|r| if line_key(r, depth, host) == key { Some(r) } else { find_row(&r.children, depth + 1, host, key) })
}

fn formula_view(r: &Row) -> AnyView {
    let legend = r.expr.symbols();
    view! {
        <div class="formula">
            <div class="math-row"><span class="what">"Formula"</span>
                <span class="math" inner_html=format!("<math display=\"block\">{}</math>", r.expr.mathml(false))></span></div>
            <div class="math-row"><span class="what">"Here"</span>
                <span class="math" inner_html=format!("<math display=\"block\"><mrow>{}<mo>=</mo><mn>{}</mn><mtext>&#160;B</mtext></mrow></math>", r.expr.mathml(true), crate::estimator::expr::group_digits(r.bytes))></span></div>
            {(!legend.is_empty()).then(|| view! {
                <ul class="legend">{legend.into_iter().map(|(s, v)| view! {
                    <li><span class="sym">{if s.sub.is_empty() { s.base.to_string() } else { format!("{}_{}", s.base, s.sub) }}</span>" = "{crate::estimator::expr::group_digits(v)}" — "{s.meaning}</li>
                }).collect_view()}</ul>
            })}
            <p class="source"><strong>"Source: "</strong>{r.source}</p>
            {(!r.note.is_empty()).then(|| view! { <p class="note">{r.note.clone()}</p> })}
            <p class="plain"><code>{r.expr.symbolic()}</code></p>
        </div>
    }
    .into_any()
}

/// One line; its DOM lives as long as the row does, its figures follow the estimate.
fn line_view(
    line: Line,
    host: bool,
    lines: Memo<Vec<Line>>,
    total: Memo<Bytes>,
    unit: Memo<crate::config::Unit>,
    open: RwSignal<BTreeSet<String>>,
) -> impl IntoView {
    let app = app();
    let key = StoredValue::new(line.key.clone());
    let bytes = move || lines.with(|ls| key.with_value(|k| ls.iter().find(|l| &l.key == k).map_or(0, |l| l.bytes)));
    let share = move || {
        let t = total.get();
        if t > 0 {
            bytes() as f64 * 100.0 / t as f64
        } else {
            0.0
        }
    };
    let is_open = move || open.with(|o| key.with_value(|k| o.contains(k)));
    let depth = line.depth;
    let formula = move || {
        is_open().then(|| {
            app.estimate.with(|e| {
                let e = e.as_ref().ok()?;
                let rows = if host { &e.host } else { &e.components };
                key.with_value(|k| find_row(rows, 0, host, k)).map(formula_view)
            })
        })
    };
    let toggle = move |ev: leptos::ev::Event| {
        let Some(d) = ev.target().and_then(|t| wasm_bindgen::JsCast::dyn_into::<web_sys::HtmlDetailsElement>(t).ok()) else {
            return;
        };
        let now_open = d.open();
        open.update(|o| {
            let k = key.get_value();
            if now_open {
                o.insert(k);
            } else {
                o.remove(&k);
            }
        });
    };
    view! {
        <li class="row" data-row=line.id data-depth=depth.to_string() style:margin-left=format!("{}px", depth * 22)>
            <details on:toggle=toggle prop:open=is_open>
                <summary>
                    <span class="swatch" style:background=hex(category_color(line.category)) aria-hidden="true"></span>
                    <span class="label">{line.label.clone()}</span>
                    <span class="bytes" data-bytes=move || bytes().to_string()>{move || format_bytes(bytes(), unit.get())}</span>
                    <span class="share" aria-label=move || format!("{:.1} percent of the sum", share())>
                        <span class="share-bar" style:width=move || format!("{:.1}%", share().min(100.0))></span>
                        <span class="share-num">{move || format!("{:.1} %", share())}</span>
                    </span>
                </summary>
                {formula}
            </details>
        </li>
    }
}

/// The ledger: every component with its bytes and share; each opens to its formula. Rows are
/// keyed, so an edit updates figures in place instead of rebuilding the list.
#[component]
pub fn Ledger() -> impl IntoView {
    let app = app();
    let open = RwSignal::new(BTreeSet::<String>::new());
    let unit = Memo::new(move |_| app.config.with(|c| c.unit));
    let flat = move |host: bool| {
        app.estimate.with(|e| {
            let mut out = Vec::new();
            if let Ok(e) = e {
                flatten_lines(if host { &e.host } else { &e.components }, 0, host, &mut out);
            }
            out
        })
    };
    let lines = Memo::new(move |_| flat(false));
    let host_lines = Memo::new(move |_| flat(true));
    let total = Memo::new(move |_| app.estimate.with(|e| e.as_ref().map_or(0, |e| e.memory.total)));
    let host_total = Memo::new(move |_| app.estimate.with(|e| e.as_ref().map_or(0, |e| e.memory.host)));
    let summary = Memo::new(move |_| {
        app.estimate.with(|e| {
            e.as_ref().ok().map(|e| {
                let stage = if e.layout.pp > 1 {
                    format!(" — the {} ({} layers), the most loaded", e.layout.stage.label(), e.layout.stage_layers)
                } else {
                    String::new()
                };
                (stage, format_bytes(e.memory.total, unit.get()), format_bytes(e.memory.peak, unit.get()))
            })
        })
    });
    view! {
        <Show when=move || summary.with(Option::is_some)>
            <section class="ledger" aria-labelledby="ledger-h">
                <h2 id="ledger-h">"Ledger per GPU"{move || summary.with(|s| s.as_ref().map(|s| s.0.clone()))}</h2>
                <p class="hint">"Open a row for its formula, the same formula with this configuration's numbers, and its source."</p>
                <ul class="rows" data-testid="ledger">
                    <For each=move || lines.get() key=|l| l.key.clone() let:l>
                        {line_view(l, false, lines, total, unit, open)}
                    </For>
                </ul>
                <p class="sum">"Sum of components: "<strong>{move || summary.with(|s| s.as_ref().map(|s| s.1.clone()))}</strong>
                    " · peak during the step: "<strong>{move || summary.with(|s| s.as_ref().map(|s| s.2.clone()))}</strong>
                    " (not every component is resident at once)"</p>
                <Show when=move || host_lines.with(|l| !l.is_empty())>
                    <h3>"Host memory per GPU process"</h3>
                    <ul class="rows host" data-testid="host-ledger">
                        <For each=move || host_lines.get() key=|l| l.key.clone() let:l>
                            {line_view(l, true, host_lines, host_total, unit, open)}
                        </For>
                    </ul>
                </Show>
            </section>
        </Show>
    }
}

/// The textbook's closed formulas beside the exact accounting.
#[component]
pub fn Textbook() -> impl IntoView {
    let app = app();
    move || {
        let c = app.config.get();
        let u = c.unit;
        app.estimate.with(|e| {
            let Ok(e) = e else { return view! { <span></span> }.into_any() };
            let exact = e.memory.activations;
            let diff = |b: Bytes| {
                let d = b as f64 - exact as f64;
                let pct = if exact > 0 { d / exact as f64 * 100.0 } else { 0.0 };
                let sign = if d >= 0.0 { "+" } else { "−" };
                format!("{sign}{} ({sign}{:.0} %)", format_bytes(d.abs() as u128, u), pct.abs())
            };
            let rows = e.textbook.iter().map(|r| {
                view! {
                    <tr>
                        <td>{r.label.clone()}<br/><span class="math" inner_html=format!("<math>{}</math>", r.expr.mathml(false))></span>
                            <br/><small>{r.source}</small></td>
                        <td class="num" data-testid=format!("textbook-{}", r.id)>{format_bytes(r.bytes, u)}</td>
                        <td class="num">{diff(r.bytes)}</td>
                    </tr>
                }
            }).collect_view();
            let notes = crate::estimator::activations::textbook_differences(&c);
            view! {
                <section class="textbook" aria-labelledby="tb-h">
                    <h2 id="tb-h">"Textbook formulas vs. what the framework keeps"</h2>
                    <div class="scroll"><table>
                        <thead><tr><th scope="col">"Activations of the whole model"</th><th scope="col">"Bytes"</th><th scope="col">"vs. exact"</th></tr></thead>
                        <tbody>
                            <tr><td><strong>"Exact: the tensors PyTorch saves for backward"</strong><br/><small>"this ledger's activation row (validated byte for byte against PyTorch)"</small></td>
                                <td class="num"><strong>{format_bytes(exact, u)}</strong></td><td class="num">"—"</td></tr>
                            {rows}
                        </tbody>
                    </table></div>
                    <h3>"Why they differ here"</h3>
                    <ul>{notes.into_iter().map(|n| view! { <li>{n}</li> }).collect_view()}</ul>
                </section>
            }
            .into_any()
        })
    }
}

#[component]
pub fn Results() -> impl IntoView {
    view! {
        <section id="results" class="results" aria-label="Results" tabindex="-1">
            <Verdict/>
            <div id="bar-root" class="slot bar-slot"></div>
            <Ledger/>
            <div id="textbook-root" class="slot"></div>
            <div id="charts-root" class="slot"></div>
            <super::bench_panel::BenchPanel autostart=super::dom::search().contains("bench=")/>
        </section>
    }
}
