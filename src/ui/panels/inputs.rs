//! The configuration form: the model, training, cluster and overhead fieldsets. Every field is
//! one of the codec's keys ([`crate::ui::widgets`]); the model picker holds its choice typed (a
//! preset, or the configuration's own custom architecture), as the GPU field does (one of the
//! catalog, or a custom size).

use crate::estimator::presets::presets;
use crate::estimator::units::format_count;
use crate::ui::html::esc;
use crate::ui::state::{use_store, ModelChoice};
use crate::ui::widgets::fields_html;
use leptos::prelude::*;

/// The searchable preset picker and the model's summary.
#[component]
pub fn Model() -> impl IntoView {
    let store = use_store();
    let filter = RwSignal::new(String::new());
    // Labels once; the list is rebuilt only when the filter or the model changes.
    let all = StoredValue::new(
        presets()
            .into_iter()
            .map(|p| {
                let label = format!("{} — {} ({})", p.id, format_count(p.spec.counts().total), p.family);
                (p.id, format!("{} {} {}", p.id, p.family, p.checkpoint).to_ascii_lowercase(), label)
            })
            .collect::<Vec<_>>(),
    );
    let model = Memo::new(move |_| store.model());
    // The options as HTML: a few dozen, rebuilt when the filter or the model changes.
    let options = move || {
        let f = filter.get().to_ascii_lowercase();
        let current = model.get();
        let mut out = String::new();
        all.with_value(|ps| {
            for (id, _, label) in ps.iter().filter(|(_, h, _)| f.is_empty() || h.contains(&f)) {
                let selected = matches!(&current, ModelChoice::Preset(p) if p == id);
                out.push_str(&format!("<option value=\"{id}\"{}>{}</option>", if selected { " selected" } else { "" }, esc(label)));
            }
        });
        if let ModelChoice::Custom(name) = current {
            out.push_str(&format!("<option value=\"custom\" selected>custom: {}</option>", esc(&name)));
        }
        out
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
    let choose = move |ev: leptos::ev::Event| {
        let id = event_target_value(&ev);
        let choice = if id == "custom" { ModelChoice::Custom(String::new()) } else { ModelChoice::Preset(id) };
        let _ = store.set_model(&choice);
    };
    view! {
        <fieldset data-panel="model">
            <legend>"Model"</legend>
            <div class="field">
                <label for="preset-filter">"Find a model"</label>
                <input id="preset-filter" type="search" placeholder="llama, qwen, gemma…" autocomplete="off" disabled=locked
                    prop:value=move || filter.get() on:input=move |ev| filter.set(event_target_value(&ev))/>
            </div>
            <div class="field">
                <label for="in-model">"Model "<code class="key">"model"</code></label>
                <select id="in-model" size="6" data-testid="model-select" disabled=locked on:change=choose inner_html=options></select>
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

#[component]
pub fn Training() -> impl IntoView {
    fieldset(
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
            "attn",
            "recompute",
            "dropout",
            "loss",
            "framework",
        ],
    )
}

#[component]
pub fn Cluster() -> impl IntoView {
    fieldset("cluster", "Cluster", &["gpu", "gpu_gib", "gpus", "zero", "shard_group", "tp", "sp", "pp", "vpp", "cp", "ep", "offload"])
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
