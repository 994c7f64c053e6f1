//! Small wrappers over the browser APIs the app uses. Every call tolerates failure (a page in a
//! sandboxed iframe may lack history, storage or the clipboard) and never panics.

use leptos::prelude::{document, window};
use wasm_bindgen::prelude::wasm_bindgen;
use wasm_bindgen::{JsCast, JsValue};

/// The main module tells the others that the address (configuration, theme) changed.
pub const CONFIG_EVENT: &str = "trainmem:config";
/// Another module asks the main one to apply a query (its `detail`).
pub const SET_QUERY_EVENT: &str = "trainmem:set-query";

#[wasm_bindgen(inline_js = "export function load_module(js, wasm) {
  const base = document.baseURI;
  return import(new URL(js, base).href).then((m) => m.default({ module_or_path: new URL(wasm, base).href }));
}")]
extern "C" {
    #[wasm_bindgen(catch, js_name = load_module)]
    fn load_module_js(js: &str, wasm: &str) -> Result<js_sys::Promise, JsValue>;
}

/// Loads another of the app's wasm modules (paths relative to the page); its `main` mounts it.
pub async fn load_module(js: &str, wasm: &str) -> Result<(), String> {
    let promise = load_module_js(js, wasm).map_err(|e| format!("{e:?}"))?;
    wasm_bindgen_futures::JsFuture::from(promise).await.map(|_| ()).map_err(|e| e.as_string().unwrap_or_else(|| format!("{e:?}")))
}

fn dispatch(name: &str, detail: Option<&str>) {
    let init = web_sys::CustomEventInit::new();
    if let Some(d) = detail {
        init.set_detail(&JsValue::from_str(d));
    }
    if let Ok(ev) = web_sys::CustomEvent::new_with_event_init_dict(name, &init) {
        let _ = window().dispatch_event(&ev);
    }
}

/// Announces a new configuration or theme to the other modules.
pub fn notify_config() {
    dispatch(CONFIG_EVENT, None);
}

/// Asks the main module to apply `query`.
pub fn send_query(query: &str) {
    dispatch(SET_QUERY_EVENT, Some(query));
}

/// `location.search` (with its leading `?`), or empty.
pub fn search() -> String {
    window().location().search().unwrap_or_default()
}

/// The page's address without its query or hash.
pub fn base_url() -> String {
    let loc = window().location();
    let origin = loc.origin().unwrap_or_default();
    let path = loc.pathname().unwrap_or_default();
    format!("{origin}{path}")
}

fn with_query(query: &str) -> String {
    let path = window().location().pathname().unwrap_or_default();
    if query.is_empty() {
        path
    } else {
        format!("{path}?{query}")
    }
}

/// Rewrites the address bar without a new history entry.
pub fn replace_query(query: &str) {
    if let Ok(h) = window().history() {
        let _ = h.replace_state_with_url(&JsValue::NULL, "", Some(&with_query(query)));
    }
}

/// Rewrites the address bar with a new history entry (back returns to the previous state).
pub fn push_query(query: &str) {
    if let Ok(h) = window().history() {
        let _ = h.push_state_with_url(&JsValue::NULL, "", Some(&with_query(query)));
    }
}

/// Copies text to the clipboard; resolves to whether it worked.
pub async fn copy_text(text: &str) -> bool {
    let clipboard = window().navigator().clipboard();
    wasm_bindgen_futures::JsFuture::from(clipboard.write_text(text)).await.is_ok()
}

/// Offers `bytes` as a download named `filename`.
pub fn download(filename: &str, mime: &str, bytes: &[u8]) {
    let array = js_sys::Uint8Array::from(bytes);
    let parts = js_sys::Array::of1(&array);
    let opts = web_sys::BlobPropertyBag::new();
    opts.set_type(mime);
    let Ok(blob) = web_sys::Blob::new_with_u8_array_sequence_and_options(&parts, &opts) else {
        return;
    };
    download_blob(filename, &blob);
}

/// Offers a blob as a download named `filename`.
pub fn download_blob(filename: &str, blob: &web_sys::Blob) {
    let Ok(url) = web_sys::Url::create_object_url_with_blob(blob) else {
        return;
    };
    if let Ok(a) = document().create_element("a") {
        if let Ok(a) = a.dyn_into::<web_sys::HtmlAnchorElement>() {
            a.set_href(&url);
            a.set_download(filename);
            a.set_attribute("data-testid", "download-link").ok();
            a.set_attribute("data-filename", filename).ok();
            a.click();
        }
    }
    let _ = web_sys::Url::revoke_object_url(&url);
}

/// A value from `localStorage`.
pub fn load(key: &str) -> Option<String> {
    window().local_storage().ok().flatten()?.get_item(key).ok().flatten()
}

/// Stores a value in `localStorage` (silently skipped where storage is blocked).
pub fn store(key: &str, value: &str) {
    if let Some(s) = window().local_storage().ok().flatten() {
        let _ = s.set_item(key, value);
    }
}

/// Sets an attribute on `<html>` (the theme).
pub fn set_root_attribute(name: &str, value: &str) {
    if let Some(el) = document().document_element() {
        let _ = el.set_attribute(name, value);
    }
}

/// `performance.mark(name)` — the page-speed script reads these.
pub fn mark(name: &str) {
    if let Some(p) = window().performance() {
        let _ = p.mark(name);
    }
}

/// `performance.now()`, milliseconds.
pub fn now_ms() -> f64 {
    window().performance().map_or(0.0, |p| p.now())
}

/// Posts the document's height to the embedding page:
/// `{type: "trainmem:height", height: <CSS pixels>}` (see README, "Embedding").
pub fn post_height() {
    let height = document().document_element().map_or(0, |e| e.scroll_height());
    if let Ok(Some(parent)) = window().parent() {
        let msg = js_sys::Object::new();
        let _ = js_sys::Reflect::set(&msg, &"type".into(), &"trainmem:height".into());
        let _ = js_sys::Reflect::set(&msg, &"height".into(), &JsValue::from(height));
        let _ = parent.post_message(&msg, "*");
    }
}

/// Whether the system prefers a dark colour scheme.
pub fn prefers_dark() -> bool {
    window().match_media("(prefers-color-scheme: dark)").ok().flatten().is_some_and(|m| m.matches())
}
