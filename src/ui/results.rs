//! The results: verdict, stacked bar, and the ledger whose rows open into their formulas.

use super::app;
use super::canvas::{ChartCanvas, Draw};
use crate::config::Config;
use crate::estimator::gpu;
use crate::estimator::ledger::{Bytes, Row};
use crate::estimator::units::{format_bytes, format_count};
use crate::estimator::Estimate;
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

/// One ledger row and, when open, its formula.
fn row_view(r: &Row, depth: usize, total: Bytes, unit: crate::config::Unit, open: RwSignal<BTreeSet<String>>) -> AnyView {
    let key = format!("{}:{depth}:{}", r.id, r.label);
    let k2 = key.clone();
    let k3 = key.clone();
    let is_open = move || open.with(|o| o.contains(&k2));
    let is_open2 = move || open.with(|o| o.contains(&k3));
    let share = if total > 0 { r.bytes as f64 * 100.0 / total as f64 } else { 0.0 };
    let color = hex(category_color(r.category));
    let r2 = r.clone();
    let formula = move || {
        is_open().then(|| {
            let legend = r2.expr.symbols();
            view! {
                <div class="formula">
                    <div class="math-row"><span class="what">"Formula"</span>
                        <span class="math" inner_html=format!("<math display=\"block\">{}</math>", r2.expr.mathml(false))></span></div>
                    <div class="math-row"><span class="what">"Here"</span>
                        <span class="math" inner_html=format!("<math display=\"block\"><mrow>{}<mo>=</mo><mn>{}</mn><mtext>&#160;B</mtext></mrow></math>", r2.expr.mathml(true), crate::estimator::expr::group_digits(r2.bytes))></span></div>
                    {(!legend.is_empty()).then(|| view! {
                        <ul class="legend">{legend.into_iter().map(|(s, v)| view! {
                            <li><span class="sym">{if s.sub.is_empty() { s.base.to_string() } else { format!("{}_{}", s.base, s.sub) }}</span>" = "{crate::estimator::expr::group_digits(v)}" — "{s.meaning}</li>
                        }).collect_view()}</ul>
                    })}
                    <p class="source"><strong>"Source: "</strong>{r2.source}</p>
                    {(!r2.note.is_empty()).then(|| view! { <p class="note">{r2.note.clone()}</p> })}
                    <p class="plain"><code>{r2.expr.symbolic()}</code></p>
                </div>
            }
        })
    };
    let toggle = move |ev: leptos::ev::Event| {
        let Some(d) = ev.target().and_then(|t| wasm_bindgen::JsCast::dyn_into::<web_sys::HtmlDetailsElement>(t).ok()) else {
            return;
        };
        let now_open = d.open();
        open.update(|o| {
            if now_open {
                o.insert(key.clone());
            } else {
                o.remove(&key);
            }
        });
    };
    let children: Vec<AnyView> = r.children.iter().map(|c| row_view(c, depth + 1, total, unit, open)).collect();
    view! {
        <li class="row" data-row=r.id data-depth=depth.to_string()>
            <details on:toggle=toggle prop:open=is_open2>
                <summary>
                    <span class="swatch" style:background=color aria-hidden="true"></span>
                    <span class="label">{r.label.clone()}</span>
                    <span class="bytes" data-bytes=r.bytes.to_string()>{format_bytes(r.bytes, unit)}</span>
                    <span class="share" aria-label=format!("{share:.1} percent of the sum")>
                        <span class="share-bar" style:width=format!("{:.1}%", share.min(100.0))></span>
                        <span class="share-num">{format!("{share:.1} %")}</span>
                    </span>
                </summary>
                {formula}
            </details>
            {(!children.is_empty()).then(|| view! { <ul class="children">{children}</ul> })}
        </li>
    }
    .into_any()
}

/// The ledger: every component with its bytes and share; each opens to its formula.
#[component]
pub fn Ledger() -> impl IntoView {
    let app = app();
    let open = RwSignal::new(BTreeSet::<String>::new());
    move || {
        let unit = app.config.with(|c| c.unit);
        app.estimate.with(|e| match e {
            Err(_) => view! { <p></p> }.into_any(),
            Ok(e) => ledger_view(e, unit, open),
        })
    }
}

fn ledger_view(e: &Estimate, unit: crate::config::Unit, open: RwSignal<BTreeSet<String>>) -> AnyView {
    let total = e.memory.total;
    let rows: Vec<AnyView> = e.components.iter().map(|r| row_view(r, 0, total, unit, open)).collect();
    let host: Vec<AnyView> = e.host.iter().map(|r| row_view(r, 0, e.memory.host, unit, open)).collect();
    let stage = if e.layout.pp > 1 {
        format!(" — the {} ({} layers), the most loaded", e.layout.stage.label(), e.layout.stage_layers)
    } else {
        String::new()
    };
    view! {
        <section class="ledger" aria-labelledby="ledger-h">
            <h2 id="ledger-h">"Ledger per GPU"{stage}</h2>
            <p class="hint">"Open a row for its formula, the same formula with this configuration's numbers, and its source."</p>
            <ul class="rows" data-testid="ledger">{rows}</ul>
            <p class="sum">"Sum of components: "<strong>{format_bytes(total, unit)}</strong>
                " · peak during the step: "<strong>{format_bytes(e.memory.peak, unit)}</strong>
                " (not every component is resident at once)"</p>
            {(!host.is_empty()).then(|| view! {
                <h3>"Host memory per GPU process"</h3>
                <ul class="rows host" data-testid="host-ledger">{host}</ul>
            })}
        </section>
    }
    .into_any()
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
