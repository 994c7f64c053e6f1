//! The configuration form. Every input is generated from the codec's key table, so its label,
//! accepted values and the URL key it writes are the same ones the CLI documents.

use super::app;
use crate::config::{self, Group, Key, KEYS};
use crate::estimator::hf;
use crate::estimator::presets::presets;
use crate::estimator::units::format_count;
use leptos::prelude::*;
use wasm_bindgen::JsCast;

fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// Capitalizes the key's help text for a label.
fn label_of(k: &Key) -> String {
    let mut c = k.help.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => k.name.to_string(),
    }
}

/// Applies one edit, or reports why not.
fn apply(name: &'static str, value: &str) -> Result<(), String> {
    let app = app();
    let mut c = app.config.get_untracked();
    if let Some(e) = config::apply_pairs(&mut c, vec![(name, value)]).into_iter().next() {
        return Err(e.reason);
    }
    super::dom::mark("trainmem:input");
    app.config.set(c);
    Ok(())
}

/// One labelled input for a configuration key: a select for enumerations, a checkbox for
/// switches, a text box (accepting `8k`-style suffixes) for numbers.
#[component]
pub fn KeyInput(name: &'static str) -> impl IntoView {
    let app = app();
    let Some(k) = key(name) else {
        return view! { <span></span> }.into_any();
    };
    let id = format!("in-{name}");
    let err_id = format!("err-{name}");
    let error = RwSignal::new(None::<String>);
    // A memo: the input's DOM is touched only when its own key's value changes, not on every
    // edit of any key.
    let value = Memo::new(move |_| app.config.with(|c| (k.get)(c)));
    let choices = (k.choices)();
    let label = label_of(k);
    let is_bool = choices == ["false", "true"];
    let control = if is_bool {
        view! {
            <input id=id.clone() type="checkbox" prop:checked=move || value.get() == "true"
                on:change=move |ev| { let _ = apply(name, if event_target_checked(&ev) { "true" } else { "false" }); }/>
        }
        .into_any()
    } else if !choices.is_empty() {
        let options = choices.iter().map(|c| view! { <option value=*c>{*c}</option> }).collect_view();
        view! {
            <select id=id.clone() prop:value=value on:change=move |ev| { error.set(apply(name, &event_target_value(&ev)).err()); }>
                {options}
            </select>
        }
        .into_any()
    } else {
        view! {
            <input id=id.clone() type="text" inputmode="decimal" autocomplete="off" spellcheck="false"
                prop:value=value
                aria-invalid=move || error.with(|e| e.is_some().to_string())
                aria-describedby=err_id.clone()
                on:input=move |ev| { error.set(apply(name, &event_target_value(&ev)).err()); }/>
        }
        .into_any()
    };
    view! {
        <div class="field" class:check=is_bool>
            <label for=id>{label}" "<code class="key">{name}</code></label>
            {control}
            <span class="field-error" id=format!("err-{name}") role="status">{move || error.get().map(|e| format!("{name}: {e}"))}</span>
        </div>
    }
    .into_any()
}

/// A block of inputs, by key name.
fn fields(names: &'static [&'static str]) -> impl IntoView {
    names.iter().map(|n| view! { <KeyInput name=*n/> }).collect_view()
}

#[component]
pub fn Inputs() -> impl IntoView {
    let app = app();
    let cfg = move || app.config.get();
    let arch_keys: Vec<&'static str> = KEYS.iter().filter(|k| k.group == Group::Architecture).map(|k| k.name).collect();
    let arch_fields = arch_keys.into_iter().map(|n| view! { <KeyInput name=n/> }).collect_view();
    view! {
        <form class="inputs" aria-label="Configuration" on:submit=|ev| ev.prevent_default()>
            <fieldset>
                <legend>"Model"</legend>
                <ModelPicker/>
                <div id="hf-root" class="slot"></div>
                <details class="arch">
                    <summary>"Architecture (every field editable)"</summary>
                    <p class="hint">"Editing a preset's architecture turns it into a custom model."</p>
                    <div class="grid">{arch_fields}</div>
                </details>
            </fieldset>
            <fieldset>
                <legend>"Training"</legend>
                <div class="grid">
                    {fields(&["batch", "seq", "accum", "precision", "optim", "optim_impl", "finetune"])}
                    <Show when=move || cfg().finetune != config::Finetune::Full>
                        {fields(&["lora_rank", "lora_targets"])}
                    </Show>
                    {fields(&["attn", "recompute", "dropout", "loss", "framework"])}
                </div>
            </fieldset>
            <fieldset>
                <legend>"Cluster"</legend>
                <div class="grid">
                    {fields(&["gpu"])}
                    <Show when=move || cfg().gpu == "custom">{fields(&["gpu_gib"])}</Show>
                    {fields(&["gpus", "zero"])}
                    <Show when=move || cfg().zero == config::Zero::HybridShard>{fields(&["shard_group"])}</Show>
                    {fields(&["tp", "sp", "pp"])}
                    <Show when=move || { cfg().pp > 1 }>{fields(&["vpp"])}</Show>
                    {fields(&["cp", "ep", "offload"])}
                </div>
            </fieldset>
            <details class="overhead">
                <summary>"Overhead assumptions"</summary>
                <p class="hint">"Named assumptions, not measurements: set them to what your setup shows (nvidia-smi for the context, torch.cuda.memory_reserved vs memory_allocated for fragmentation)."</p>
                <div class="grid">{fields(&["cuda_ctx_mib", "nccl_mib", "frag_pct", "prefetch_layers", "bucket_view"])}</div>
            </details>
        </form>
    }
}

/// Searchable preset picker.
#[component]
fn ModelPicker() -> impl IntoView {
    let app = app();
    let filter = RwSignal::new(String::new());
    // Labels once; the list is rebuilt only when the filter or the model (not any key) changes.
    let all = StoredValue::new(
        presets()
            .into_iter()
            .map(|p| {
                let label = format!("{} — {} ({})", p.id, format_count(p.spec.counts().total), p.family);
                (p.id, format!("{} {} {}", p.id, p.family.to_lowercase(), p.checkpoint.to_lowercase()), label)
            })
            .collect::<Vec<_>>(),
    );
    let model = Memo::new(move |_| app.config.with(|c| (c.model.clone(), c.display_name())));
    let options = move || {
        let f = filter.get().to_lowercase();
        let (current, name) = model.get();
        let mut out: Vec<AnyView> = Vec::new();
        all.with_value(|ps| {
            for (id, _, label) in ps.iter().filter(|(_, h, _)| f.is_empty() || h.contains(&f)) {
                out.push(view! { <option value=*id selected=current == *id>{label.clone()}</option> }.into_any());
            }
        });
        if current == "custom" {
            out.push(view! { <option value="custom" selected=true>{format!("custom: {name}")}</option> }.into_any());
        }
        out
    };
    let summary = move || {
        app.estimate.with(|e| match e {
            Ok(e) => format!(
                "{} — {} parameters ({} active), {} tensors",
                e.model,
                format_count(e.parameter_count),
                format_count(e.active_parameter_count),
                e.parameter_tensors
            ),
            Err(_) => String::new(),
        })
    };
    view! {
        <div class="field">
            <label for="preset-filter">"Find a model"</label>
            <input id="preset-filter" type="search" placeholder="llama, qwen, gemma…" autocomplete="off"
                prop:value=move || filter.get()
                on:input=move |ev| filter.set(event_target_value(&ev))/>
        </div>
        <div class="field">
            <label for="in-model">"Model "<code class="key">"model"</code></label>
            <select id="in-model" size="6" data-testid="model-select"
                on:change=move |ev| { let _ = apply("model", &event_target_value(&ev)); }>
                {options}
            </select>
        </div>
        <p class="model-summary" data-testid="model-summary">{summary}</p>
    }
}

/// Paste or upload a Hugging Face config.json (mounted by the extras module).
#[component]
pub fn HfImport() -> impl IntoView {
    let app = app();
    let text = RwSignal::new(String::new());
    let status = RwSignal::new(None::<Result<String, String>>);
    let import = move |json: String| match hf::import_json(&json) {
        Ok(imported) => {
            let n = imported.spec.counts().total;
            let msg = format!(
                "imported {} ({}): {} parameters",
                if imported.name.is_empty() { "config.json" } else { &imported.name },
                imported.model_type,
                format_count(n)
            );
            app.config.update(|c| config::apply_import(c, &imported));
            // The extras module hands the import to the main one, which owns the address bar.
            super::dom::send_query(&app.config.with(config::encode_query));
            status.set(Some(Ok(msg)));
        }
        Err(e) => status.set(Some(Err(e.to_string()))),
    };
    let on_file = move |ev: leptos::ev::Event| {
        let Some(input) = ev.target().and_then(|t| t.dyn_into::<web_sys::HtmlInputElement>().ok()) else {
            return;
        };
        let Some(file) = input.files().and_then(|f| f.get(0)) else {
            return;
        };
        leptos::task::spawn_local(async move {
            match wasm_bindgen_futures::JsFuture::from(file.text()).await {
                Ok(v) => {
                    let s = v.as_string().unwrap_or_default();
                    text.set(s.clone());
                    import(s);
                }
                Err(_) => status.set(Some(Err("could not read the file".into()))),
            }
        });
    };
    view! {
        <details class="hf">
            <summary>"Import a Hugging Face config.json"</summary>
            <div class="field">
                <label for="hf-text">"Paste config.json"</label>
                <textarea id="hf-text" rows="5" spellcheck="false" data-testid="hf-text"
                    prop:value=move || text.get() on:input=move |ev| text.set(event_target_value(&ev))></textarea>
            </div>
            <div class="row">
                <button type="button" data-testid="hf-import" on:click=move |_| import(text.get_untracked())>"Import"</button>
                <label class="file">"or upload "<input type="file" accept=".json,application/json" on:change=on_file/></label>
            </div>
            <p class="status" role="status" data-testid="hf-status" class:error=move || status.with(|s| matches!(s, Some(Err(_))))>
                {move || status.get().map(|s| match s { Ok(m) => m, Err(e) => e })}
            </p>
            <p class="hint">{format!("Supported model_type: {}.", hf::SUPPORTED.join(", "))}</p>
        </details>
    }
}
