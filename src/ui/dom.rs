//! Small wrappers over the browser APIs the app uses. Every call tolerates failure (a page in a
//! sandboxed iframe may lack history, storage or the clipboard) and never panics.

use leptos::prelude::{document, window};
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};

fn js_error(e: JsValue) -> String {
    e.as_string().or_else(|| e.dyn_ref::<js_sys::Error>().map(|e| String::from(e.message()))).unwrap_or_else(|| "unknown error".into())
}

/// Loads one of the lazily loaded modules (`bench`, `more`) and resolves to its exports. The
/// page defines the loader (`window.trainmemLoad`, an inline script of index.html) and names
/// each module's content-hashed files in `<meta name="trainmem-NAME">`, both written at build
/// time (scripts/build-modules.sh); the loader fetches a module once.
pub async fn load_module(name: &str) -> Result<JsValue, String> {
    let loader = js_sys::Reflect::get(&window(), &"trainmemLoad".into())
        .ok()
        .and_then(|f| f.dyn_into::<js_sys::Function>().ok())
        .ok_or("this page has no module loader")?;
    let promise = loader.call1(&JsValue::NULL, &name.into()).map_err(js_error)?;
    let promise = promise.dyn_into::<js_sys::Promise>().map_err(|_| "the module loader returned no promise".to_string())?;
    wasm_bindgen_futures::JsFuture::from(promise).await.map_err(js_error)
}

/// Moves the focus to the first control under `el` (a panel that took the place of the
/// button that opened it).
pub fn focus_first(el: &web_sys::Element) {
    let first = el
        .query_selector("button:not([disabled]), input:not([disabled]), select:not([disabled]), textarea, summary, a[href]")
        .ok()
        .flatten();
    if let Some(f) = first.and_then(|f| f.dyn_into::<web_sys::HtmlElement>().ok()) {
        let _ = f.focus();
    }
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
    if let Ok(blob) = web_sys::Blob::new_with_u8_array_sequence_and_options(&parts, &opts) {
        download_blob(filename, &blob);
    }
}

/// Offers a blob as a download named `filename`.
pub fn download_blob(filename: &str, blob: &web_sys::Blob) {
    let Ok(url) = web_sys::Url::create_object_url_with_blob(blob) else {
        return;
    };
    if let Some(a) = document().create_element("a").ok().and_then(|a| a.dyn_into::<web_sys::HtmlAnchorElement>().ok()) {
        a.set_href(&url);
        a.set_download(filename);
        a.click();
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

/// Removes the element with `id`, if there is one.
pub fn remove_by_id(id: &str) {
    if let Some(el) = document().get_element_by_id(id) {
        el.remove();
    }
}

/// Sets an attribute on `<html>` (the theme).
pub fn set_root_attribute(name: &str, value: &str) {
    if let Some(el) = document().document_element() {
        let _ = el.set_attribute(name, value);
    }
}

/// `performance.mark(name)`: the page-speed script reads these.
pub fn mark(name: &str) {
    if let Some(p) = window().performance() {
        let _ = p.mark(name);
    }
}

/// `performance.measure(name, start, end)` between two marks.
pub fn measure(name: &str, start: &str, end: &str) {
    if let Some(p) = window().performance() {
        let _ = p.measure_with_start_mark_and_end_mark(name, start, end);
    }
}

/// The window property the page-speed script sets (before the page loads) to have the page
/// record where each update's time goes ([`timed`], [`time_from`], [`time_to`], and the
/// charts' sweep and draw measures).
const TIMING_PROPERTY: &str = "trainmemTiming";

thread_local! {
    static TIMING: std::cell::OnceCell<bool> = const { std::cell::OnceCell::new() };
}

/// Whether the page records its timings: only when the page-speed script asked
/// ([`TIMING_PROPERTY`]). A visitor's page skips them: the two marks, the measure and their
/// names cost ~1 ms of main thread per change for some ten timed parts (a CPU profile of 60
/// edits in Chromium).
pub fn timing() -> bool {
    TIMING.with(|t| *t.get_or_init(|| window_property(TIMING_PROPERTY).is_some_and(|v| v.is_truthy())))
}

/// Runs `f` as a `performance.measure` named `trainmem:time:<name>` (the page-speed script
/// reads these to say where an update's time goes), when the page records its timings.
pub fn timed<T>(name: &str, f: impl FnOnce() -> T) -> T {
    time_from(name);
    let out = f();
    time_to(name);
    out
}

/// Starts the `trainmem:time:<name>` measure that [`time_to`] ends (work that spans tasks: a
/// worker's round trip), when the page records its timings.
pub fn time_from(name: &str) {
    if timing() {
        mark(&format!("trainmem:time:{name}:start"));
    }
}

/// Ends the `trainmem:time:<name>` measure [`time_from`] started.
pub fn time_to(name: &str) {
    if !timing() {
        return;
    }
    let (start, end) = (format!("trainmem:time:{name}:start"), format!("trainmem:time:{name}:end"));
    mark(&end);
    measure(&format!("trainmem:time:{name}"), &start, &end);
}

/// `performance.now()`, milliseconds.
pub fn now_ms() -> f64 {
    window().performance().map_or(0.0, |p| p.now())
}

/// `devicePixelRatio` (1 where unknown), between 1 and 4.
pub fn pixel_ratio() -> f64 {
    let r = window().device_pixel_ratio();
    if r.is_finite() {
        r.clamp(1.0, 4.0)
    } else {
        1.0
    }
}

/// The height of `content` in CSS pixels, from its own bounding box (the document's scroll
/// height never falls below the frame's, so a frame given too much height could never shrink).
pub fn content_height(content: &web_sys::Element) -> f64 {
    let rect = content.get_bounding_client_rect();
    (rect.bottom() + window().scroll_y().unwrap_or(0.0)).ceil()
}

/// Posts the height of `content` to the embedding page: `{source: "trainmem", version: 1,
/// type: "resize", height}` (docs/embed.md), and the older `{type: "trainmem:height", height}`
/// that snippets made before course mode listen for.
pub fn post_height(content: &web_sys::Element) {
    let height = content_height(content);
    post_to_parent("resize", &[("height", JsValue::from(height))]);
    if let Some(parent) = framed_parent() {
        let msg = js_sys::Object::new();
        let _ = js_sys::Reflect::set(&msg, &"type".into(), &"trainmem:height".into());
        let _ = js_sys::Reflect::set(&msg, &"height".into(), &JsValue::from(height));
        let _ = parent.post_message(&msg, "*");
    }
}

/// The embedding page's window, when the app runs in a frame.
pub fn framed_parent() -> Option<web_sys::Window> {
    let parent = window().parent().ok().flatten()?;
    let own: JsValue = window().into();
    let theirs: &JsValue = parent.as_ref();
    (*theirs != own).then_some(parent)
}

/// Posts `{source: "trainmem", version: 1, type, …fields}` to the embedding page (docs/embed.md),
/// if there is one. The messages carry only what the link already shows, so any origin may
/// read them.
pub fn post_to_parent(kind: &str, fields: &[(&str, JsValue)]) {
    let Some(parent) = framed_parent() else { return };
    let msg = js_sys::Object::new();
    let _ = js_sys::Reflect::set(&msg, &"source".into(), &"trainmem".into());
    let _ = js_sys::Reflect::set(&msg, &"version".into(), &JsValue::from(1));
    let _ = js_sys::Reflect::set(&msg, &"type".into(), &kind.into());
    for (k, v) in fields {
        let _ = js_sys::Reflect::set(&msg, &(*k).into(), v);
    }
    let _ = parent.post_message(&msg, "*");
}

/// The embedding page's origin at load (from `document.referrer`), if the app runs in a frame.
pub fn parent_origin() -> Option<String> {
    framed_parent()?;
    let referrer = document().referrer();
    let origin = web_sys::Url::new(&referrer).ok()?.origin();
    (!origin.is_empty() && origin != "null").then_some(origin)
}

/// A string field of a message's data object.
pub fn field(data: &JsValue, name: &str) -> Option<String> {
    js_sys::Reflect::get(data, &name.into()).ok()?.as_string()
}

/// Calls a function now and whenever an element changes size, until dropped.
pub struct ResizeWatch {
    observer: web_sys::ResizeObserver,
    _callback: Closure<dyn FnMut(js_sys::Array)>,
}

impl ResizeWatch {
    pub fn new(el: &web_sys::Element, f: impl Fn() + 'static) -> Option<ResizeWatch> {
        f();
        let callback = Closure::<dyn FnMut(js_sys::Array)>::new(move |_: js_sys::Array| f());
        let observer = web_sys::ResizeObserver::new(callback.as_ref().unchecked_ref()).ok()?;
        observer.observe(el);
        Some(ResizeWatch { observer, _callback: callback })
    }
}

impl Drop for ResizeWatch {
    fn drop(&mut self) {
        self.observer.disconnect();
    }
}

fn dark_query() -> Option<web_sys::MediaQueryList> {
    window().match_media("(prefers-color-scheme: dark)").ok().flatten()
}

/// Whether the system prefers a dark colour scheme.
pub fn prefers_dark() -> bool {
    dark_query().is_some_and(|m| m.matches())
}

/// Calls `f(dark)` whenever the system's colour scheme changes, for the page's life.
pub fn on_color_scheme_change(f: impl Fn(bool) + 'static) {
    let Some(q) = dark_query() else { return };
    let cb = Closure::<dyn FnMut(web_sys::MediaQueryListEvent)>::new(move |e: web_sys::MediaQueryListEvent| f(e.matches()));
    let _ = q.add_event_listener_with_callback("change", cb.as_ref().unchecked_ref());
    cb.forget();
}

/// A property the page's loader left on the window (`None`: absent, undefined or null).
pub fn window_property(name: &str) -> Option<wasm_bindgen::JsValue> {
    js_sys::Reflect::get(&window(), &name.into()).ok().filter(|v| !v.is_undefined() && !v.is_null())
}

/// Removes a property from the window (what is taken once).
pub fn delete_window_property(name: &str) {
    let _ = js_sys::Reflect::delete_property(&window(), &name.into());
}
