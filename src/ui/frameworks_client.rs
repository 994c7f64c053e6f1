//! The app's side of the frameworks module ([`crate::frameworks::api`]): loads the module the
//! first time a framework file is imported or exported (its content-hashed files, through
//! `window.trainmemLoadFrameworks` in index.html), calls it in JSON and reads its replies; and
//! [`ExportButtons`], the download of a configuration as the files each framework runs, which
//! the frameworks panel (the configuration on screen) and the planner (its top plan) both show.
//!
//! The page's own module names only the API's plain data (the reply types, the format lists):
//! the parsers stay in the lazily loaded module.

use super::dom;
use crate::config::{encode_query, Config};
use crate::frameworks::api::{export_formats, ExportReply, FileIn, ImportReply};
use leptos::prelude::*;
use std::cell::RefCell;
use wasm_bindgen::{JsCast, JsValue};

thread_local! {
    /// The loaded module's exports.
    static MODULE: RefCell<Option<JsValue>> = const { RefCell::new(None) };
}

fn js_error(e: JsValue) -> String {
    e.as_string().or_else(|| e.dyn_ref::<js_sys::Error>().map(|e| String::from(e.message()))).unwrap_or_else(|| "unknown error".into())
}

/// The module's exports, loading it the first time.
async fn module() -> Result<JsValue, String> {
    if let Some(m) = MODULE.with(|m| m.borrow().clone()) {
        return Ok(m);
    }
    let loader = js_sys::Reflect::get(&window(), &"trainmemLoadFrameworks".into())
        .ok()
        .and_then(|f| f.dyn_into::<js_sys::Function>().ok())
        .ok_or("this page has no frameworks loader")?;
    dom::mark("trainmem:frameworks:load");
    let promise = loader.call0(&JsValue::NULL).map_err(js_error)?;
    let promise = promise.dyn_into::<js_sys::Promise>().map_err(|_| "the frameworks loader returned no promise".to_string())?;
    let exports = wasm_bindgen_futures::JsFuture::from(promise)
        .await
        .map_err(|e| format!("could not load the frameworks module: {}", js_error(e)))?;
    MODULE.with(|m| *m.borrow_mut() = Some(exports.clone()));
    Ok(exports)
}

/// Calls the module's `name` with string arguments; its reply is a string.
async fn call(name: &str, args: &[&str]) -> Result<String, String> {
    let exports = module().await?;
    let f = js_sys::Reflect::get(&exports, &name.into())
        .ok()
        .and_then(|f| f.dyn_into::<js_sys::Function>().ok())
        .ok_or_else(|| format!("the frameworks module has no `{name}`"))?;
    let this = JsValue::NULL;
    let r = match args {
        [a] => f.call1(&this, &JsValue::from_str(a)),
        [a, b] => f.call2(&this, &JsValue::from_str(a), &JsValue::from_str(b)),
        _ => return Err("wrong number of arguments".into()),
    }
    .map_err(js_error)?;
    r.as_string().ok_or_else(|| format!("the frameworks module's `{name}` returned no text"))
}

/// Reads framework files (see [`crate::frameworks::api::import_files`]).
pub async fn import(files: &[FileIn]) -> Result<ImportReply, String> {
    let request = serde_json::to_string(files).map_err(|e| e.to_string())?;
    let reply = call("import_files", &[&request]).await?;
    serde_json::from_str(&reply).map_err(|e| e.to_string())
}

/// Writes a configuration in a framework's format (see [`crate::frameworks::api::export_query`]).
pub async fn export(cfg: &Config, format: &str) -> Result<ExportReply, String> {
    let reply = call("export_files", &[&encode_query(cfg), format]).await?;
    serde_json::from_str(&reply).map_err(|e| e.to_string())
}

/// The MIME type of an exported file, by its name.
fn mime_of(name: &str) -> &'static str {
    if name.ends_with(".json") {
        "application/json"
    } else if name.ends_with(".sh") {
        "text/x-shellscript"
    } else if name.ends_with(".toml") {
        "application/toml"
    } else {
        "application/yaml"
    }
}

/// One button per export format: downloads `config` (when there is one) as the files that
/// framework runs; the accelerate + DeepSpeed pair is two files. `id` prefixes the buttons'
/// test ids (`{id}-torchtune`, …) and names the status line.
#[component]
pub fn ExportButtons(#[prop(into)] config: Signal<Option<Config>>, id: &'static str, label: &'static str) -> impl IntoView {
    let status = RwSignal::new(None::<Result<String, String>>);
    let busy = RwSignal::new(false);
    let buttons = export_formats()
        .into_iter()
        .map(|(format, words)| {
            let click = move |_| {
                let Some(cfg) = config.get_untracked() else { return };
                busy.set(true);
                leptos::task::spawn_local(async move {
                    let result = match export(&cfg, format).await {
                        Ok(ExportReply { error: Some(e), .. }) => Err(e),
                        Ok(ExportReply { files, .. }) => {
                            for f in &files {
                                dom::download(&f.name, mime_of(&f.name), f.text.as_bytes());
                            }
                            Ok(format!("Downloaded {}.", files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>().join(" and ")))
                        }
                        Err(e) => Err(e),
                    };
                    status.set(Some(result));
                    busy.set(false);
                });
            };
            view! {
                <button type="button" data-testid=format!("{id}-{format}") data-format=format on:click=click
                    disabled=move || busy.get() || config.with(Option::is_none)>{words}</button>
            }
        })
        .collect_view();
    view! {
        <div class="chart-tools export-files" role="group" aria-label=label data-testid=id>
            <span class="export-label">{label}</span>
            {buttons}
            <p class="status" role="status" data-testid=format!("{id}-status") class:error=move || status.with(|s| matches!(s, Some(Err(_))))>
                {move || status.get().map(|s| s.unwrap_or_else(|e| e))}
            </p>
        </div>
    }
}
