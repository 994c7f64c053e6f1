//! Framework config files (issue 28): import the files a run already has, pick a framework's
//! shipped recipe, and download the configuration on screen as the files each framework runs.
//!
//! - **Import**: paste or upload one or several files (torchtune, axolotl, litgpt, accelerate or
//!   Megatron-Bridge YAML, torchtitan TOML, DeepSpeed, Trainer or PEFT JSON, Megatron-LM
//!   arguments). The frameworks module ([`crate::ui::frameworks_client`], loaded now and not
//!   before) reads them as `trainmem import` does; the configuration becomes the one they
//!   describe (the same share-URL query as the CLI's), and the report lists every key of every
//!   file: understood (and what it set), ignored, unmodelled, unknown, a framework default, or
//!   invalid, with its line. A file that cannot be read is named with its line and key, and the
//!   other files are still read; a failed import changes nothing.
//! - **Recipe** (`recipe=`): a framework's shipped config sets every knob it decides; each can
//!   still be changed after.
//! - **Export**: the configuration on screen as a torchtune YAML, a torchtitan TOML, an
//!   accelerate + DeepSpeed pair or Megatron-LM arguments.

use crate::config::{decode_query, matching_recipe, recipe, KEYS, RECIPES};
use crate::frameworks::api::{import_formats, FileIn, ImportReply, KeyRow};
use crate::ui::frameworks_client::{self, ExportButtons};
use crate::ui::state::use_store;
use leptos::prelude::*;
use wasm_bindgen::JsCast;

/// One file to import, as the visitor fills it in.
#[derive(Clone, Copy)]
struct Slot {
    id: u32,
    name: RwSignal<String>,
    text: RwSignal<String>,
    format: RwSignal<String>,
}

impl Slot {
    fn new(id: u32, name: String, text: String) -> Slot {
        Slot { id, name: RwSignal::new(name), text: RwSignal::new(text), format: RwSignal::new(String::new()) }
    }
}

/// The report's statuses, in the order the summary counts them.
const STATUSES: [&str; 6] = ["understood", "default", "ignored", "unmodelled", "unknown", "invalid"];

/// "12 understood, 3 defaults, 2 ignored".
fn counts(keys: &[KeyRow]) -> String {
    STATUSES
        .iter()
        .filter_map(|s| {
            let n = keys.iter().filter(|k| k.status == *s).count();
            (n > 0).then(|| format!("{n} {s}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The key report as a table.
fn report(reply: &ImportReply) -> impl IntoView {
    let rows = reply
        .keys
        .iter()
        .map(|k| {
            let at = match k.line {
                Some(l) => format!("{}:{l}", k.file),
                None => k.file.clone(),
            };
            view! {
                <tr data-status=k.status.clone() data-key=k.key.clone()>
                    <td><span class=format!("status-tag {}", k.status)>{k.status.clone()}</span></td>
                    <td>{at}</td>
                    <td><code>{k.key.clone()}</code></td>
                    <td><code>{k.set.clone()}</code></td>
                    <td>{k.note.clone()}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <div class="plan-table-wrap" tabindex="0" role="region" aria-label="Key report">
            <table class="plan-table key-report" data-testid="fw-report">
                <caption>"Every key of every file: what trainmem made of it"</caption>
                <thead><tr><th scope="col">"Status"</th><th scope="col">"File:line"</th><th scope="col">"Key"</th><th scope="col">"Set"</th><th scope="col">"Why / assumed"</th></tr></thead>
                <tbody>{rows}</tbody>
            </table>
        </div>
    }
}

#[component]
pub fn Frameworks() -> impl IntoView {
    let store = use_store();
    let next_id = StoredValue::new(1u32);
    let slots = RwSignal::new(vec![Slot::new(0, String::new(), String::new())]);
    let add = move |name: String, text: String| {
        let id = next_id.get_value();
        next_id.set_value(id + 1);
        slots.update(|v| {
            // An empty first slot takes the first file.
            if let [only] = v.as_slice() {
                if only.text.with_untracked(String::is_empty) && only.name.with_untracked(String::is_empty) {
                    v.clear();
                }
            }
            v.push(Slot::new(id, name, text));
        });
    };
    let reply = RwSignal::new(None::<ImportReply>);
    let status = RwSignal::new(None::<Result<String, String>>);
    let busy = RwSignal::new(false);

    let run = move |_| {
        let files: Vec<FileIn> = slots.with_untracked(|v| {
            v.iter()
                .map(|s| FileIn { name: s.name.get_untracked(), text: s.text.get_untracked(), format: Some(s.format.get_untracked()) })
                .collect()
        });
        busy.set(true);
        status.set(Some(Ok("Reading the files…".into())));
        leptos::task::spawn_local(async move {
            let result = match frameworks_client::import(&files).await {
                Err(e) => Err(e),
                Ok(r) if !r.read => {
                    let e = r.errors.join("; ");
                    reply.set(Some(r));
                    Err(format!("Nothing imported: {e}"))
                }
                Ok(r) => {
                    let mut cfg = decode_query(&r.query).config;
                    let current = store.config.get_untracked();
                    cfg.unit = current.unit;
                    let locked: Vec<&str> =
                        KEYS.iter().filter(|k| store.locked(k.name) && (k.get)(&cfg) != (k.get)(&current)).map(|k| k.name).collect();
                    let files = r.formats.iter().map(|(f, fmt)| format!("{f} ({fmt})")).collect::<Vec<_>>().join(", ");
                    let out = if !locked.is_empty() {
                        Err(format!("Not applied: the course page locks {}", locked.join(", ")))
                    } else {
                        store.config.set(cfg);
                        let skipped = if r.skipped.is_empty() { String::new() } else { format!(" Left out: {}.", r.skipped.join(", ")) };
                        Ok(format!("Imported {files}: {}.{skipped}", counts(&r.keys)))
                    };
                    reply.set(Some(r));
                    out
                }
            };
            status.set(Some(result));
            busy.set(false);
        });
    };

    let on_files = move |ev: leptos::ev::Event| {
        let Some(input) = ev.target().and_then(|t| t.dyn_into::<web_sys::HtmlInputElement>().ok()) else { return };
        let Some(list) = input.files() else { return };
        for i in 0..list.length() {
            let Some(file) = list.get(i) else { continue };
            leptos::task::spawn_local(async move {
                match wasm_bindgen_futures::JsFuture::from(file.text()).await {
                    Ok(v) => add(file.name(), v.as_string().unwrap_or_default()),
                    Err(_) => status.set(Some(Err(format!("could not read {}", file.name())))),
                }
            });
        }
    };

    let format_options = move |current: RwSignal<String>| {
        std::iter::once("auto")
            .chain(import_formats())
            .map(|f| {
                let text = if f == "auto" { "auto-detect" } else { f };
                view! { <option value=f selected=move || current.with(|c| c == f || (c.is_empty() && f == "auto"))>{text}</option> }
            })
            .collect_view()
    };
    let slot_view = move |s: Slot| {
        let n = s.id;
        view! {
            <div class="fw-file" data-testid=format!("fw-file-{n}")>
                <div class="row">
                    <div class="field">
                        <label for=format!("fw-name-{n}")>"File name"</label>
                        <input id=format!("fw-name-{n}") type="text" autocomplete="off" spellcheck="false" placeholder="e.g. ds_config.json"
                            data-testid=format!("fw-name-{n}") prop:value=move || s.name.get() on:input=move |ev| s.name.set(event_target_value(&ev))/>
                    </div>
                    <div class="field">
                        <label for=format!("fw-format-{n}")>"Read as"</label>
                        <select id=format!("fw-format-{n}") data-testid=format!("fw-format-{n}") on:change=move |ev| s.format.set(event_target_value(&ev))>
                            {format_options(s.format)}
                        </select>
                    </div>
                    <button type="button" class="fw-remove" data-testid=format!("fw-remove-{n}") aria-label=format!("Remove file {}", n + 1)
                        on:click=move |_| slots.update(|v| v.retain(|x| x.id != n))>"Remove"</button>
                </div>
                <div class="field">
                    <label for=format!("fw-text-{n}")>"Contents"</label>
                    <textarea id=format!("fw-text-{n}") rows="6" spellcheck="false" data-testid=format!("fw-text-{n}")
                        prop:value=move || s.text.get() on:input=move |ev| s.text.set(event_target_value(&ev))></textarea>
                </div>
            </div>
        }
    };

    // The recipes, by framework.
    let mut frameworks: Vec<&str> = Vec::new();
    for r in RECIPES {
        if !frameworks.contains(&r.framework) {
            frameworks.push(r.framework);
        }
    }
    let groups = frameworks
        .into_iter()
        .map(|fw| {
            let options =
                RECIPES.iter().filter(|r| r.framework == fw).map(|r| view! { <option value=r.id>{r.title}</option> }).collect_view();
            view! { <optgroup label=fw>{options}</optgroup> }
        })
        .collect_view();
    let recipe_problem = RwSignal::new(None::<String>);
    let chosen = RwSignal::new(String::new());
    let on_recipe = move |ev: leptos::ev::Event| {
        let id = event_target_value(&ev);
        chosen.set(id.clone());
        if !id.is_empty() {
            recipe_problem.set(store.set_key("recipe", &id).err());
        }
    };
    let matching = Memo::new(move |_| store.config.with(|c| matching_recipe(c).map(|r| r.id)));
    let recipe_line = move || {
        let id = matching.get().map(str::to_string).or_else(|| chosen.with(|c| (!c.is_empty()).then(|| c.clone())))?;
        let r = recipe(&id)?;
        let state = if matching.get() == Some(r.id) { "The configuration is this recipe" } else { "Changed since choosing this recipe" };
        Some(format!("{state}: {} — {} {} at {}, {}.", r.title, r.framework, r.repo, r.version, r.path))
    };
    let locked_recipe = store.locked("recipe");

    view! {
        <details class="hf frameworks" data-panel="frameworks" data-testid="frameworks">
            <summary>"Framework config files: import, recipes, export"</summary>
            <h2 class="fw-h">"Import the files your run has"</h2>
            <p class="hint">"torchtune, axolotl, litgpt, accelerate and Megatron-Bridge YAML; torchtitan TOML; DeepSpeed, Trainer and PEFT JSON; Megatron-LM arguments. Several files combine (a Trainer JSON with its DeepSpeed JSON); the result replaces the configuration, as trainmem import does."</p>
            <For each=move || slots.get() key=|s| s.id children=slot_view/>
            <div class="row">
                <button type="button" data-testid="fw-add" on:click=move |_| add(String::new(), String::new())>"Add a file"</button>
                <label class="file">"or upload "<input type="file" multiple=true data-testid="fw-upload" accept=".yaml,.yml,.toml,.json,.sh,.txt,.args" on:change=on_files/></label>
                <button type="button" class="primary" data-testid="fw-import" disabled=move || busy.get() on:click=run>"Import"</button>
            </div>
            <p class="status" role="status" data-testid="fw-status" class:error=move || status.with(|s| matches!(s, Some(Err(_))))>
                {move || status.get().map(|s| s.unwrap_or_else(|e| e))}
            </p>
            {move || reply.with(|r| r.as_ref().map(|r| {
                let errors = (!r.errors.is_empty()).then(|| {
                    let items = r.errors.iter().map(|e| view! { <li>{e.clone()}</li> }).collect_view();
                    view! { <ul class="warnings fw-errors" data-testid="fw-errors">{items}</ul> }
                });
                view! {
                    {errors}
                    {(!r.keys.is_empty()).then(|| report(r))}
                }
            }))}
            <h2 class="fw-h">"Start from a framework's recipe"</h2>
            <div class="field">
                <div class="field-head"><label for="in-recipe">"Recipe (a framework's shipped config; any key can be changed after)"</label><code class="key">"recipe"</code></div>
                <select id="in-recipe" data-testid="fw-recipe" disabled=locked_recipe on:change=on_recipe>
                    <option value="" selected=true>"Choose a recipe…"</option>
                    {groups}
                </select>
                <span class="field-error" role="status">{move || recipe_problem.get()}</span>
                <small class="choice-id" data-testid="fw-recipe-source">{recipe_line}</small>
            </div>
            <h2 class="fw-h">"Run it"</h2>
            <ExportButtons config=Signal::derive(move || Some(store.config.get())) id="fw-export" label="Download this configuration as"/>
        </details>
    }
}
