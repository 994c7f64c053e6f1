//! The configuration form: the model, training, cluster and overhead fieldsets. Every field is
//! one of the codec's keys ([`crate::ui::widgets`]); the model picker holds its choice typed (a
//! preset, or the configuration's own custom architecture), as the GPU field does (one of the
//! catalog, or a custom size).

use crate::estimator::presets::presets;
use crate::estimator::units::format_count;
use crate::search::{haystack, matches};
use crate::ui::html::esc;
use crate::ui::state::{use_store, ModelChoice};
use crate::ui::widgets::fields_html;
use leptos::prelude::*;

/// The searchable preset picker and the model's summary. The search is forgiving
/// ([`crate::search`]: "llama 3.1 8b", "llama8b", "405b"); Enter in the search box takes the
/// first model found, ArrowDown moves into the list (Enter there takes the one highlighted), and
/// a search that finds nothing says so.
#[component]
pub fn Model() -> impl IntoView {
    let store = use_store();
    let filter = RwSignal::new(String::new());
    // Labels and search tokens once; the list is rebuilt only when the filter or the model
    // changes.
    let all = StoredValue::new(
        presets()
            .into_iter()
            .map(|p| {
                let label = format!("{} — {} ({})", p.id, format_count(p.spec.counts().total), p.family);
                (p.id, haystack(&p), label)
            })
            .collect::<Vec<_>>(),
    );
    let model = Memo::new(move |_| store.model());
    // The ids the filter finds, in the catalog's order.
    let found = Memo::new(move |_| {
        filter.with(|f| all.with_value(|ps| ps.iter().filter(|(_, h, _)| matches(f, h)).map(|(id, _, _)| *id).collect::<Vec<_>>()))
    });
    // The options as HTML: a few dozen, rebuilt when the filter or the model changes.
    let options = move || {
        let current = model.get();
        let mut out = String::new();
        found.with(|ids| {
            all.with_value(|ps| {
                for (id, _, label) in ps.iter().filter(|(id, _, _)| ids.contains(id)) {
                    let selected = matches!(&current, ModelChoice::Preset(p) if p == id);
                    out.push_str(&format!("<option value=\"{id}\"{}>{}</option>", if selected { " selected" } else { "" }, esc(label)));
                }
            })
        });
        if let ModelChoice::Custom(name) = current {
            out.push_str(&format!("<option value=\"custom\" selected>custom: {}</option>", esc(&name)));
        }
        out
    };
    let none = move || {
        found.with(|ids| ids.is_empty()).then(|| {
            let q = filter.get();
            format!("No model matches “{q}”: try a family (llama, qwen, gemma) or a size (8b, 70b).")
        })
    };
    // From the configuration alone (the counts the estimate reports), so that the model's line
    // shows before the first estimate has run.
    let summary = move || {
        store.config.with(|c| {
            let n = c.arch.counts();
            format!(
                "{} — {} parameters ({} active), {} tensors",
                c.display_name(),
                format_count(n.total),
                format_count(n.active),
                n.tensors
            )
        })
    };
    let locked = store.locked("model");
    let choose_id = move |id: String| {
        let choice = if id == "custom" { ModelChoice::Custom(String::new()) } else { ModelChoice::Preset(id) };
        let _ = store.set_model(&choice);
    };
    let choose = move |ev: leptos::ev::Event| choose_id(event_target_value(&ev));
    let list = NodeRef::<leptos::html::Select>::new();
    let on_search_key = move |ev: leptos::ev::KeyboardEvent| match ev.key().as_str() {
        "Enter" => {
            ev.prevent_default();
            if let Some(id) = found.with_untracked(|ids| ids.first().copied()) {
                choose_id(id.to_string());
            }
        }
        "ArrowDown" => {
            ev.prevent_default();
            if let Some(el) = list.get_untracked() {
                if found.with_untracked(|ids| !ids.is_empty()) {
                    el.set_selected_index(0);
                }
                let _ = el.focus();
            }
        }
        _ => {}
    };
    let on_list_key = move |ev: leptos::ev::KeyboardEvent| {
        if ev.key() == "Enter" {
            ev.prevent_default();
            if let Some(el) = list.get_untracked() {
                let v = el.value();
                if !v.is_empty() {
                    choose_id(v);
                }
            }
        }
    };
    view! {
        <fieldset data-panel="model">
            <legend>"Model"</legend>
            <div class="field">
                <label for="preset-filter">"Find a model"</label>
                <input id="preset-filter" type="search" placeholder="llama 3.1 8b, qwen 7b, 405b…" autocomplete="off" disabled=locked
                    data-testid="model-search" aria-describedby="model-none" aria-controls="in-model"
                    prop:value=move || filter.get() on:input=move |ev| filter.set(event_target_value(&ev)) on:keydown=on_search_key/>
                <span class="hint" id="model-none" role="status" data-testid="model-none">{none}</span>
            </div>
            <div class="field">
                <div class="field-head"><label for="in-model">"Model"</label><code class="key">"model"</code></div>
                <select id="in-model" size="6" data-testid="model-select" disabled=locked node_ref=list on:change=choose on:keydown=on_list_key inner_html=options></select>
            </div>
            <p class="model-summary" data-testid="model-summary">{summary}</p>
        </fieldset>
    }
}

/// A fieldset of fields, written once (the form keeps them in step with the configuration).
fn fieldset(panel: &'static str, legend: &'static str, names: &[&str]) -> impl IntoView {
    let store = use_store();
    let html = store.config.with_untracked(|c| fields_html(names, c));
    view! {
        <fieldset data-panel=panel>
            <legend>{legend}</legend>
            <div class="grid" inner_html=html></div>
        </fieldset>
    }
}

/// The recipes real runs use (issues 26 and 27): compile, activation offloading, FP8, 4-bit
/// bases and loading — each field labelled with the one line its key's help says.
const RECIPE_KEYS: &[&str] = &[
    "compile",
    "compile_regions",
    "act_offload",
    "act_offload_layers",
    "host_ram_gib",
    "fp8",
    "fp8_allgather",
    "fp8_recompute_weight",
    "fp8_model_init",
    "qlora_quant",
    "load",
    "empty_cache",
];

#[component]
pub fn Training() -> impl IntoView {
    let store = use_store();
    let recipes = store.config.with_untracked(|c| fields_html(RECIPE_KEYS, c));
    let training = fieldset(
        "training",
        "Training",
        &[
            "batch",
            "seq",
            "accum",
            "precision",
            "optim",
            "optim_impl",
            "finetune",
            "lora_rank",
            "lora_targets",
            "lora_dropout",
            "lora_dtype",
            "attn",
            "recompute",
            "recompute_every",
            "recompute_layers",
            "optim_in_bwd",
            "optim_paged",
            "dropout",
            "loss",
            "framework",
        ],
    );
    view! {
        {training}
        <details class="recipes" data-testid="recipes">
            <summary>"Recipes: compile, offloading, FP8, 4-bit bases, loading"</summary>
            <div class="grid" inner_html=recipes></div>
        </details>
    }
}

#[component]
pub fn Cluster() -> impl IntoView {
    fieldset(
        "cluster",
        "Cluster",
        &["gpu", "gpu_gib", "gpus", "zero", "shard_group", "tp", "sp", "pp", "vpp", "cp", "ep", "offload", "fsdp_root_reshard"],
    )
}

#[component]
pub fn Overhead() -> impl IntoView {
    let store = use_store();
    let html = store.config.with_untracked(|c| fields_html(&["cuda_ctx_mib", "nccl_mib", "frag_pct", "prefetch_layers", "bucket_view"], c));
    view! {
        <details class="overhead" data-panel="overhead">
            <summary>"Overhead assumptions"</summary>
            <p class="hint">"Named assumptions, not measurements: set them to what your setup shows (nvidia-smi for the context, torch.cuda.memory_reserved vs memory_allocated for fragmentation)."</p>
            <div class="grid" inner_html=html></div>
        </details>
    }
}
