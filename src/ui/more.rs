//! The lazily loaded module's side ([`super::lazy`] is the page's): the entry points of
//! src/bin/trainmem-more.rs. `open` sets up the module's store — the page's link read again
//! (the course settings, `embed=`, `view=`), then the page's [`Mirror`] — whose setters send
//! each change to the page's store through `host` and follow the state it answers with;
//! `mount` puts a panel into an element of the page; `state` takes the page's state after each
//! change there.

use super::dom;
use super::lazy::Lazy;
use super::panels::{bench, compare, embed, exercise, import, plan, verify};
use super::state::{Change, Mirror, Remote, Store};
use crate::config::percent_decode;
use leptos::prelude::*;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use wasm_bindgen::JsValue;

thread_local! {
    /// The module's store, once open.
    static STORE: Cell<Option<Store>> = const { Cell::new(None) };
    /// What owns the store's signals, for the page's life.
    static OWNER: RefCell<Option<Owner>> = const { RefCell::new(None) };
}

/// Sets up the module's store, mirroring the page's (`mirror`, [`Mirror::encode`]); `host`
/// answers a change ([`Change::encode`]) with the error, if any, and the page's new state.
pub fn open(host: js_sys::Function, mirror: &str) -> Result<(), String> {
    console_error_panic_hook::set_once();
    let owner = Owner::new();
    owner.set();
    OWNER.with(|o| *o.borrow_mut() = Some(owner));
    let store = Store::from_query(&dom::search());
    let remote: Remote = Rc::new(move |change: Change| {
        let reply = host
            .call1(&JsValue::NULL, &JsValue::from_str(&change.encode()))
            .ok()
            .and_then(|r| r.as_string())
            .ok_or("the page did not answer")?;
        let (error, state) = reply.split_once('\n').unwrap_or((reply.as_str(), ""));
        if let Some(m) = Mirror::decode(state) {
            store.follow(&m);
        }
        if error.is_empty() {
            Ok(())
        } else {
            Err(percent_decode(error))
        }
    });
    let store = store.with_remote(remote);
    state_of(store, mirror);
    STORE.with(|s| s.set(Some(store)));
    Ok(())
}

fn state_of(store: Store, mirror: &str) {
    if let Some(m) = Mirror::decode(mirror) {
        store.follow(&m);
    }
}

/// The page's state after a change there.
pub fn state(mirror: &str) {
    if let Some(store) = STORE.with(Cell::get) {
        state_of(store, mirror);
    }
}

/// Mounts a panel ([`Lazy::id`]) at the end of `el`, for the page's life. `options`: `open`
/// opens the benchmark at once.
pub fn mount(panel: &str, el: web_sys::HtmlElement, options: &str) -> Result<(), String> {
    let store = STORE.with(Cell::get).ok_or("the panels' module is not open")?;
    let panel = Lazy::parse(panel).ok_or_else(|| format!("the panels' module has no panel {panel}"))?;
    let open = options == "open";
    leptos::mount::mount_to(el, move || {
        provide_context(store);
        view_of(panel, open)
    })
    .forget();
    Ok(())
}

/// One panel. Each arm is a function of its own: WebAssembly compiles a function the first time
/// it runs, so opening one panel compiles its code only.
fn view_of(panel: Lazy, open: bool) -> AnyView {
    match panel {
        Lazy::Plan => plan_panel(),
        Lazy::Exercises => exercises_panel(),
        Lazy::Compare => compare_panel(),
        Lazy::Verify => verify_panel(),
        Lazy::Import => import_panel(),
        Lazy::Embed => embed_panel(),
        Lazy::Bench => bench_panel(open),
    }
}

#[inline(never)]
fn plan_panel() -> AnyView {
    view! { <plan::Plan/> }.into_any()
}
#[inline(never)]
fn exercises_panel() -> AnyView {
    view! { <exercise::Exercises/> }.into_any()
}
#[inline(never)]
fn compare_panel() -> AnyView {
    view! { <compare::Compare/> }.into_any()
}
#[inline(never)]
fn verify_panel() -> AnyView {
    view! { <verify::Body/> }.into_any()
}
#[inline(never)]
fn import_panel() -> AnyView {
    view! { <import::Body/> }.into_any()
}
#[inline(never)]
fn embed_panel() -> AnyView {
    view! { <embed::EmbedDialog/> }.into_any()
}
#[inline(never)]
fn bench_panel(open: bool) -> AnyView {
    view! { <bench::Page open=open/> }.into_any()
}
