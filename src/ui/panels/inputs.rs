//! The configuration form: the model, training, cluster and overhead fieldsets. Every field is a
//! [`KeyInput`] of the codec's key table, except the two choices the UI holds typed: the model
//! (a preset, or the configuration's own custom architecture) and the GPU (one of the catalog,
//! or a custom size).

use crate::config::{Finetune, Zero};
use crate::estimator::gpu::GPUS;
use crate::estimator::presets::presets;
use crate::estimator::units::format_count;
use crate::ui::html::esc;
use crate::ui::state::{use_store, GpuChoice, ModelChoice};
use crate::ui::widgets::{fields, KeyInput};
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
                (p.id, format!("{} {} {}", p.id, p.family, p.checkpoint).to_lowercase(), label)
            })
            .collect::<Vec<_>>(),
    );
    let model = Memo::new(move |_| store.model());
    // The options as HTML: a few dozen, rebuilt when the filter or the model changes.
    let options = move || {
        let f = filter.get().to_lowercase();
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
    let summary = move || {
        store.estimate.with(|e| {
            e.as_ref().map_or(String::new(), |e| {
                format!(
                    "{} — {} parameters ({} active), {} tensors",
                    e.model,
                    format_count(e.parameter_count),
                    format_count(e.active_parameter_count),
                    e.parameter_tensors
                )
            })
        })
    };
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
                <input id="preset-filter" type="search" placeholder="llama, qwen, gemma…" autocomplete="off"
                    prop:value=move || filter.get() on:input=move |ev| filter.set(event_target_value(&ev))/>
            </div>
            <div class="field">
                <label for="in-model">"Model "<code class="key">"model"</code></label>
                <select id="in-model" size="6" data-testid="model-select" on:change=choose inner_html=options></select>
            </div>
            <p class="model-summary" data-testid="model-summary">{summary}</p>
        </fieldset>
    }
}

#[component]
pub fn Training() -> impl IntoView {
    let store = use_store();
    let lora = Memo::new(move |_| store.config.with(|c| c.finetune != Finetune::Full));
    view! {
        <fieldset data-panel="training">
            <legend>"Training"</legend>
            <div class="grid">
                {fields(&["batch", "seq", "accum", "precision", "optim", "optim_impl", "finetune"])}
                {move || lora.get().then(|| fields(&["lora_rank", "lora_targets"]))}
                {fields(&["attn", "recompute", "dropout", "loss", "framework"])}
            </div>
        </fieldset>
    }
}

/// The GPU: one of the catalog, or a custom size (then its GiB field appears).
#[component]
fn GpuPicker() -> impl IntoView {
    let store = use_store();
    let gpu = Memo::new(move |_| store.gpu());
    let choose = move |ev: leptos::ev::Event| {
        let id = event_target_value(&ev);
        let choice = match GPUS.iter().find(|g| g.id == id) {
            Some(g) => GpuChoice::Catalog(*g),
            None => GpuChoice::Custom(store.config.with_untracked(|c| c.gpu_gib)),
        };
        let _ = store.set_gpu(choice);
    };
    let selected = move || match gpu.get() {
        GpuChoice::Catalog(g) => g.id,
        GpuChoice::Custom(_) => "custom",
    };
    let options = GPUS.iter().map(|g| view! { <option value=g.id>{g.name}</option> }).collect_view();
    view! {
        <div class="field">
            <label for="in-gpu">"GPU "<code class="key">"gpu"</code></label>
            <select id="in-gpu" prop:value=selected on:change=choose>{options}<option value="custom">"Custom size…"</option></select>
        </div>
        {move || matches!(gpu.get(), GpuChoice::Custom(_)).then(|| view! { <KeyInput name="gpu_gib"/> })}
    }
}

#[component]
pub fn Cluster() -> impl IntoView {
    let store = use_store();
    let hybrid = Memo::new(move |_| store.config.with(|c| c.zero == Zero::HybridShard));
    let pipeline = Memo::new(move |_| store.config.with(|c| c.pp > 1));
    view! {
        <fieldset data-panel="cluster">
            <legend>"Cluster"</legend>
            <div class="grid">
                <GpuPicker/>
                {fields(&["gpus", "zero"])}
                {move || hybrid.get().then(|| fields(&["shard_group"]))}
                {fields(&["tp", "sp", "pp"])}
                {move || pipeline.get().then(|| fields(&["vpp"]))}
                {fields(&["cp", "ep", "offload"])}
            </div>
        </fieldset>
    }
}

#[component]
pub fn Overhead() -> impl IntoView {
    view! {
        <details class="overhead" data-panel="overhead">
            <summary>"Overhead assumptions"</summary>
            <p class="hint">"Named assumptions, not measurements: set them to what your setup shows (nvidia-smi for the context, torch.cuda.memory_reserved vs memory_allocated for fragmentation)."</p>
            <div class="grid">{fields(&["cuda_ctx_mib", "nccl_mib", "frag_pct", "prefetch_layers", "bucket_view"])}</div>
        </details>
    }
}
