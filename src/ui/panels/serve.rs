//! Serving (issue 29): the page's second mode, `mode=serve`.
//!
//! - [`ModeTabs`]: the two tabs, training and serving (the `mode` key; arrow keys move between
//!   them).
//! - [`Serving`]: the serving fieldset — engine, context, concurrency, the dtypes and each
//!   engine's budget keys (only the ones the chosen engine reads are shown), each a field of
//!   the codec's key table ([`KeyField`]).
//! - [`Serve`]: the answers of [`crate::estimator::serve::analyse_serving`] — weights, the KV
//!   cache per token and per sequence, the engine's blocks, the most concurrent sequences at the
//!   context and the longest context at the concurrency, the engine's budget row by row with
//!   its formula, the cheapest changes that make the target fit (each a button), and the two
//!   charts of [`crate::plots::serve`].

use crate::config::{find_key, Config, Key, Unit};
use crate::estimator::expr::group_digits;
use crate::estimator::serve::{
    analyse_serving, concurrency_against_context, context_axis, context_of, kv_against_context, Engine, Mode, Serve as Answers, ServeRow,
    MAX_CONTEXT,
};
use crate::estimator::units::format_bytes;
use crate::plots::draw::chart_height;
use crate::plots::serve::{concurrency_header, draw_concurrency, draw_kv, kv_header, ConcurrencyData, KvData};
use crate::ui::canvas::{ChartCanvas, Draw, Height};
use crate::ui::dom;
use crate::ui::state::use_store;
use crate::words::option_text;
use leptos::prelude::*;
use std::rc::Rc;
use wasm_bindgen::JsCast;

/// The two modes as tabs: training (the step) and serving (KV cache and engine budget).
#[component]
pub fn ModeTabs() -> impl IntoView {
    let store = use_store();
    let serving = Memo::new(move |_| store.config.with(|c| c.serve.mode == Mode::Serve));
    let locked = store.locked("mode");
    let select = move |serve: bool, focus: bool| {
        let _ = store.set_key("mode", if serve { "serve" } else { "train" });
        if focus {
            let id = if serve { "mode-tab-serve" } else { "mode-tab-train" };
            if let Some(el) = document().get_element_by_id(id).and_then(|e| e.dyn_into::<web_sys::HtmlElement>().ok()) {
                let _ = el.focus();
            }
        }
    };
    let on_key = move |ev: leptos::ev::KeyboardEvent| {
        let next = match ev.key().as_str() {
            "ArrowRight" | "ArrowLeft" => !serving.get_untracked(),
            "Home" => false,
            "End" => true,
            _ => return,
        };
        ev.prevent_default();
        select(next, true);
    };
    let tab = move |serve: bool, id: &'static str, text: &'static str| {
        let selected = move || serving.get() == serve;
        view! {
            <button type="button" role="tab" id=id data-testid=id class="mode-tab" aria-controls="mode-panel" disabled=locked
                aria-selected=move || selected().to_string() tabindex=move || if selected() { "0" } else { "-1" }
                on:click=move |_| select(serve, false)>{text}</button>
        }
    };
    view! {
        // In a landmark of its own, as every piece of the page is (axe's region rule).
        <nav aria-label="Mode">
            <div class="mode-tabs" role="tablist" aria-label="What to answer" data-testid="mode-tabs" on:keydown=on_key>
                {tab(false, "mode-tab-train", "Training: the step")}
                {tab(true, "mode-tab-serve", "Serving: KV cache and engine")}
            </div>
        </nav>
    }
}

/// Whether the fieldset shows `name` for `cfg` (each engine reads its own budget keys).
fn shown(name: &str, cfg: &Config) -> bool {
    let e = cfg.serve.engine;
    match name {
        "gpu_memory_utilization" | "max_num_seqs" => e == Engine::Vllm,
        "max_num_batched_tokens" => matches!(e, Engine::Vllm | Engine::Trtllm),
        "mem_fraction_static" => e == Engine::Sglang,
        "free_gpu_memory_fraction" => e == Engine::Trtllm,
        "block_size" | "cuda_graphs" => e != Engine::Transformers,
        "cuda_graph_mib" => e != Engine::Transformers && cfg.serve.cuda_graphs,
        "dp_attention" => matches!(e, Engine::Vllm | Engine::Sglang),
        // Only a model with states has one, and transformers takes no such option.
        "mamba_ssm_cache_dtype" => e != Engine::Transformers && crate::estimator::serve::has_states(&cfg.arch),
        _ => true,
    }
}

/// The key's help, capitalized, for its label; for a choice only what comes before a colon.
fn label_of(k: &Key) -> String {
    let help = if (k.choices)().len() > 2 { k.help.split(':').next().unwrap_or(k.help) } else { k.help };
    let mut c = help.chars();
    c.next().map_or_else(|| k.name.to_string(), |f| f.to_uppercase().chain(c).collect())
}

/// One configuration key as a labelled field: a select for a choice (its id under it), a
/// checkbox for a switch, a text box (`8k`-style numbers) otherwise. It shows the
/// configuration's value and writes through the store's setter; a value the codec refuses is
/// named under the field and not applied. `lock=` makes it read-only.
#[component]
pub fn KeyField(key: &'static Key) -> impl IntoView {
    let store = use_store();
    let name = key.name;
    let value = Memo::new(move |_| store.config.with(|c| (key.get)(c)));
    let visible = Memo::new(move |_| store.config.with(|c| shown(name, c)));
    let error = RwSignal::new(None::<String>);
    let locked = store.locked(name);
    let set = move |v: String| error.set(store.set_key(name, &v).err().map(|e| format!("{name}: {e}")));
    let id = format!("in-{name}");
    let choices = (key.choices)();
    let is_bool = choices == ["false", "true"];
    let class = if is_bool {
        "field check"
    } else if choices.is_empty() {
        "field"
    } else {
        "field wide"
    };
    let err_id = format!("err-{name}");
    let control = if is_bool {
        view! {
            <input id=id.clone() type="checkbox" data-testid=id.clone() disabled=locked prop:checked=move || value.get() == "true"
                on:change=move |ev| set(event_target_checked(&ev).to_string())/>
        }
        .into_any()
    } else if !choices.is_empty() {
        let options = choices
            .into_iter()
            .map(|c| view! { <option value=c selected=move || value.with(|v| v == c)>{option_text(name, c)}</option> })
            .collect_view();
        let id_of = format!("id-{name}");
        view! {
            <select id=id.clone() data-testid=id.clone() aria-describedby=id_of.clone() disabled=locked
                on:change=move |ev| set(event_target_value(&ev))>{options}</select>
            <small class="choice-id" id=id_of>{move || value.get()}</small>
        }
        .into_any()
    } else {
        view! {
            <input id=id.clone() type="text" inputmode="decimal" autocomplete="off" spellcheck="false" data-testid=id.clone()
                readonly=locked aria-readonly=locked.to_string() aria-describedby=err_id.clone()
                aria-invalid=move || error.with(Option::is_some).to_string() prop:value=move || value.get()
                on:input=move |ev| set(event_target_value(&ev))/>
        }
        .into_any()
    };
    view! {
        <div class=class data-field=name hidden=move || !visible.get()>
            <div class="field-head">
                <label for=id>{label_of(key)}{locked.then_some(" (locked)")}</label>
                <code class="key">{name}</code>
            </div>
            {control}
            <span class="field-error" id=err_id role="status">{move || error.get()}</span>
        </div>
    }
}

/// The serving keys, in the fieldset's order.
pub const SERVING_KEYS: [&str; 15] = [
    "engine",
    "context",
    "concurrency",
    "kv_dtype",
    "weight_dtype",
    "mamba_ssm_cache_dtype",
    "gpu_memory_utilization",
    "max_num_batched_tokens",
    "max_num_seqs",
    "block_size",
    "mem_fraction_static",
    "free_gpu_memory_fraction",
    "cuda_graphs",
    "cuda_graph_mib",
    "dp_attention",
];

/// The serving fieldset.
#[component]
pub fn Serving() -> impl IntoView {
    let fields = SERVING_KEYS.iter().filter_map(|n| find_key(n)).map(|k| view! { <KeyField key=k/> }).collect_view();
    view! {
        <fieldset data-panel="serving" data-testid="serving-fields">
            <legend>"Serving"</legend>
            <p class="hint">"The model and the cluster's GPU, tp, pp and ep above and below apply too; each engine's own budget keys are shown for it."</p>
            <div class="grid">{fields}</div>
        </fieldset>
    }
}

/// Bytes in the page's unit, with a sign when negative (an overdrawn budget).
fn signed_bytes(b: i128, unit: Unit) -> String {
    let s = format_bytes(b.unsigned_abs(), unit);
    if b < 0 {
        format!("−{s}")
    } else {
        s
    }
}

/// "55.13" (two decimals, as vLLM logs its "Maximum concurrency … 55.13x").
fn times(c: f64) -> String {
    format!("{c:.2}")
}

/// The serving verdict in one line, and whether the target fits.
fn headline(s: &Answers, gpu: &str) -> (bool, String) {
    let fits = s.max_concurrency >= s.concurrency as f64;
    let ctx = group_digits(s.context as u128);
    let what = if s.concurrency == 1 { "1 sequence".to_string() } else { format!("{} sequences", group_digits(s.concurrency as u128)) };
    let text = if s.kv_cache_bytes == 0 {
        format!("{} on {gpu}: no memory left for the KV cache", s.engine)
    } else if fits {
        format!("{what} of {ctx} tokens fit with {} on {gpu}: room for {} at once", s.engine, times(s.max_concurrency))
    } else {
        format!("{what} of {ctx} tokens do not fit with {} on {gpu}: room for {} at once", s.engine, times(s.max_concurrency))
    };
    (fits, text)
}

/// One figure of the answers.
fn figure(label: String, testid: &'static str, value: String, data: String, sub: Option<String>) -> impl IntoView {
    view! {
        <div>
            <dt>{label}</dt>
            <dd data-testid=testid data-value=data>{value}{sub.map(|s| view! { <span class="sub">{s}</span> })}</dd>
        </div>
    }
}

/// One row of the engine's budget, opening to its formula, the formula with these numbers and
/// its source.
fn budget_row(r: &ServeRow, unit: Unit) -> impl IntoView {
    view! {
        <li class="row" data-row=r.name>
            <details>
                <summary>
                    <span class="label">{r.label}</span>
                    <span class="bytes" data-bytes=r.bytes.to_string()>{signed_bytes(r.bytes, unit)}</span>
                </summary>
                <div class="formula">
                    <p class="math-row"><span class="what">"Formula"</span><code>{r.formula.clone()}</code></p>
                    <p class="math-row"><span class="what">"Here"</span><code>{r.substituted.clone()}</code></p>
                    <p class="source"><strong>"Source: "</strong>{r.source}</p>
                </div>
            </details>
        </li>
    }
}

/// The charts' data for `cfg`: contexts from 1K to the longer of the context asked for and the
/// model's, doubling.
fn charts_of(cfg: &Config, s: &Answers) -> Result<(KvData, ConcurrencyData), String> {
    let hi = context_of(cfg).max(cfg.arch.max_pos).clamp(4096, MAX_CONTEXT);
    let xs = context_axis(hi);
    let kv = kv_against_context(cfg, &xs).map_err(|e| e.to_string())?;
    let conc = concurrency_against_context(cfg, &xs).map_err(|e| e.to_string())?;
    let model = cfg.display_name();
    Ok((
        KvData { series: kv, model: model.clone(), engine: s.engine.to_string(), unit: cfg.unit, current: Some((s.context, s.kv_bytes)) },
        ConcurrencyData {
            series: conc,
            model,
            gpu: crate::plots::gpu_name(cfg),
            target: s.concurrency,
            current: Some((s.context, s.max_concurrency)),
            max_context: s.max_context,
        },
    ))
}

/// Serving's answers and charts.
#[component]
pub fn Serve() -> impl IntoView {
    let store = use_store();
    let answers = Memo::new(move |_| store.config.with(|c| dom::timed("serve", || analyse_serving(c))));
    let charts = Memo::new(move |_| {
        answers.with(|a| match a {
            Ok(s) => store.config.with(|c| dom::timed("serve-charts", || charts_of(c, s))),
            Err(e) => Err(e.to_string()),
        })
    });
    let problem = RwSignal::new(None::<String>);
    let body = move || {
        let unit = store.unit();
        let gpu = store.gpu().label();
        answers.with(|a| match a {
            Err(e) => view! {
                <p class="status error" role="alert" data-testid="serve-error" data-key=e.key()>{format!("Serving cannot be answered: {e}")}</p>
            }
            .into_any(),
            Ok(s) => {
                let (fits, line) = headline(s, &gpu);
                let ctx = group_digits(s.context as u128);
                let n = group_digits(s.concurrency as u128);
                let blocks = if s.kv_blocks > 0 {
                    format!("{} blocks of {} tokens", group_digits(s.kv_blocks as u128), s.block_size)
                } else {
                    "none (grows with each sequence)".to_string()
                };
                let rows = s.rows.iter().map(|r| budget_row(r, unit)).collect_view();
                let notes = (!s.notes.is_empty()).then(|| {
                    let items = s.notes.iter().map(|n| view! { <li>{n.clone()}</li> }).collect_view();
                    view! { <ul class="warnings" data-testid="serve-notes">{items}</ul> }
                });
                let fixes = (!fits && !s.fixes.is_empty()).then(|| {
                    let buttons = s
                        .fixes
                        .iter()
                        .enumerate()
                        .map(|(i, f)| {
                            let set = f.set.clone();
                            let text = format!("{} → room for {} at once", f.change, times(f.max_concurrency));
                            let title = set.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&");
                            view! {
                                <li><button type="button" class="answer" data-testid=format!("serve-fix-{i}") title=title
                                    on:click=move |_| problem.set(store.apply(&set).err())>{text}</button></li>
                            }
                        })
                        .collect_view();
                    view! {
                        <div class="answers" data-testid="serve-fixes">
                            <h3>{format!("The cheapest changes that make {n} sequences of {ctx} tokens fit")}</h3>
                            <ul>{buttons}</ul>
                        </div>
                    }
                });
                let class = if fits && s.kv_cache_bytes > 0 { "verdict" } else { "verdict bad" };
                view! {
                    <div class=class data-testid="serve-verdict" data-fits=fits.to_string()>
                        <p class="headline" data-testid="serve-headline">{line}</p>
                        <dl class="stats">
                            {figure("Weights per GPU".into(), "serve-weights", format_bytes(s.weights as u128, unit), s.weights.to_string(), None)}
                            {figure("KV cache per token".into(), "serve-kv-per-token", format!("{} B", group_digits(s.kv_per_token as u128)),
                                s.kv_per_token.to_string(), Some(format!("{}, at full attention", s.kv_dtype)))}
                            {figure(format!("KV cache per sequence of {ctx} tokens"), "serve-kv-bytes", format_bytes(s.kv_bytes, unit), s.kv_bytes.to_string(),
                                Some("windows included, as the engine holds it".into()))}
                            {figure("KV cache budget".into(), "serve-kv-cache", format_bytes(s.kv_cache_bytes, unit), s.kv_cache_bytes.to_string(),
                                Some(format!("{} tokens", group_digits(s.kv_cache_tokens as u128))))}
                            {figure("KV blocks".into(), "serve-blocks", blocks, s.kv_blocks.to_string(), None)}
                            {figure(format!("Max concurrency at {ctx} tokens"), "serve-max-concurrency", format!("{}×", times(s.max_concurrency)),
                                s.max_concurrency.to_string(), Some("sequences at once".into()))}
                            {figure(format!("Max context at {n} at once"), "serve-max-context", format!("{} tokens", group_digits(s.max_context as u128)),
                                s.max_context.to_string(), None)}
                            {figure("Activation peak (estimate)".into(), "serve-activation", format_bytes(s.activation_peak as u128, unit),
                                s.activation_peak.to_string(), Some(format!("prefill chunk of {} tokens", group_digits(s.max_num_batched_tokens as u128))))}
                            {figure("nvidia-smi will show".into(), "serve-process", format_bytes(s.process_bytes, unit), s.process_bytes.to_string(), None)}
                        </dl>
                        {notes}
                    </div>
                    {fixes}
                    <p class="field-error" role="alert" data-testid="serve-problem">{move || problem.get()}</p>
                    <h3 id="serve-budget-h">{format!("{}'s budget, row by row", s.engine)}</h3>
                    <p class="hint">"Open a row for its formula, the formula with this configuration's numbers, and its source."</p>
                    <ul class="rows serve-rows" aria-labelledby="serve-budget-h" data-testid="serve-rows">{rows}</ul>
                }
                .into_any()
            }
        })
    };
    let kv_label = Signal::derive(move || charts.with(|c| c.as_ref().map_or_else(|e| format!("No chart: {e}"), |(k, _)| k.describe())));
    let conc_label = Signal::derive(move || charts.with(|c| c.as_ref().map_or_else(|e| format!("No chart: {e}"), |(_, c)| c.describe())));
    let kv_draw: Draw =
        Rc::new(move |root, theme| charts.with(|c| c.as_ref().ok().and_then(|(k, _)| draw_kv(root, k, theme).ok().map(|r| r.1))));
    let kv_height: Height =
        Rc::new(move |w, theme| charts.with(|c| c.as_ref().map_or(120, |(k, _)| chart_height(&kv_header(k, theme), w, theme))));
    let conc_draw: Draw =
        Rc::new(move |root, theme| charts.with(|c| c.as_ref().ok().and_then(|(_, k)| draw_concurrency(root, k, theme).ok().map(|r| r.1))));
    let conc_height: Height =
        Rc::new(move |w, theme| charts.with(|c| c.as_ref().map_or(120, |(_, k)| chart_height(&concurrency_header(k, theme), w, theme))));
    view! {
        <section class="serve" aria-labelledby="serve-h" data-testid="serve" data-panel="serve">
            <h2 id="serve-h">"Serving memory per GPU"</h2>
            {body}
            <h3>"KV cache against context"</h3>
            <ChartCanvas label=kv_label draw=kv_draw height=kv_height testid="chart-serve-kv"/>
            <h3>"Concurrency against context"</h3>
            <ChartCanvas label=conc_label draw=conc_draw height=conc_height testid="chart-serve-concurrency"/>
        </section>
    }
}
