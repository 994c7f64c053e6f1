//! The panels a visitor opens later — the planner, the exercises and "make this an exercise",
//! compare, verify, the embed dialog, the benchmark's page and the config.json import — are a
//! second wasm module, `trainmem-more` (src/bin/trainmem-more.rs; its side is [`super::more`]),
//! fetched the first time one of them is opened, by its content-hashed name (scripts/build-
//! modules.sh writes it into the page, as it does the benchmark's), and precached for offline
//! use with the rest of the build. The first screen's module holds none of their code.
//!
//! This is the page's side:
//! - [`Slot`]: where a lazily loaded panel goes. It shows a placeholder (the panel's heading and
//!   the button that opens it, or nothing) until the panel is asked for — by its button
//!   ([`More::request`]), or at once when the link asks for it (`sections=`, an embed's
//!   `view=`, a quiz) — then loads the module, and the module mounts the panel there.
//! - The typed API between the two: the page's store is the one source of truth. The module
//!   gets the page's [`Mirror`] when it opens and after every change; a panel there writes
//!   through the same setters as here, which send a [`Change`] to the page's store ([`answer`]),
//!   applied as the page applies its own, and answered with the new state.
//!
//! Both modules are built from the same crate: what each holds is what its entry points reach
//! (the page's `mount`, the module's exports).

use super::dom;
use super::state::{use_store, Change, Store};
use crate::config::percent_encode;
use leptos::html::Div;
use leptos::prelude::*;
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};

/// A panel of the lazily loaded module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lazy {
    Plan,
    Exercises,
    Compare,
    Verify,
    Import,
    Embed,
    Bench,
}

impl Lazy {
    pub const ALL: [Lazy; 7] = [Lazy::Plan, Lazy::Exercises, Lazy::Compare, Lazy::Verify, Lazy::Import, Lazy::Embed, Lazy::Bench];

    /// The name the module's `mount` takes.
    pub fn id(self) -> &'static str {
        match self {
            Lazy::Plan => "plan",
            Lazy::Exercises => "exercises",
            Lazy::Compare => "compare",
            Lazy::Verify => "verify",
            Lazy::Import => "import",
            Lazy::Embed => "embed",
            Lazy::Bench => "bench",
        }
    }

    pub fn parse(id: &str) -> Option<Lazy> {
        Lazy::ALL.into_iter().find(|p| p.id() == id)
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// The loaded module's exports.
#[derive(Clone)]
struct Module {
    exports: JsValue,
}

impl Module {
    fn call(&self, name: &str, args: &[JsValue]) -> Result<(), String> {
        let f = js_sys::Reflect::get(&self.exports, &name.into())
            .ok()
            .and_then(|f| f.dyn_into::<js_sys::Function>().ok())
            .ok_or_else(|| format!("the panels' module has no `{name}`"))?;
        let args: js_sys::Array = args.iter().collect();
        f.apply(&JsValue::NULL, &args)
            .map(|_| ())
            .map_err(|e| e.as_string().unwrap_or_else(|| format!("the panels' module's `{name}` failed")))
    }
}

/// What waits for the module: called with it once it is there, or with why it is not.
type Waiting = Box<dyn FnOnce(Result<Module, String>)>;

/// Where the module stands.
enum Load {
    Idle,
    /// Fetching: what to do once it is there.
    Loading(Vec<Waiting>),
    Ready(Module),
    Failed(String),
}

/// The page's handle on the module ([`provide`], [`use_more`]).
#[derive(Clone, Copy)]
pub struct More {
    load: StoredValue<Load, LocalStorage>,
    /// True once the module is open: from then on the page's state is mirrored to it.
    open: RwSignal<bool>,
    /// The panels asked for by a button (bits of [`Lazy`]).
    asked: RwSignal<u8>,
}

/// Sets up the page's side for `store`: no module is fetched until a panel asks for it.
pub fn provide(store: Store) {
    let more = More { load: StoredValue::new_local(Load::Idle), open: RwSignal::new(false), asked: RwSignal::new(0) };
    provide_context(more);
    // Every change of what the module's panels read, once it is open (before: nothing tracked).
    Effect::new(move |_| {
        if more.open.get() {
            let mirror = store.mirror().encode();
            more.load.with_value(|l| {
                if let Load::Ready(m) = l {
                    let _ = m.call("state", &[JsValue::from_str(&mirror)]);
                }
            });
        }
    });
}

/// The page's handle on the module ([`provide`]).
pub fn use_more() -> More {
    expect_context::<More>()
}

/// The page's answer to a change the module sends: the error (percent-encoded; empty when it
/// was applied), then the page's state.
fn answer(store: Store, text: &str) -> String {
    let result = Change::decode(text).ok_or_else(|| format!("the page does not know the change {text:?}")).and_then(|c| store.change(c));
    let mirror = untrack(|| store.mirror()).encode();
    format!("{}\n{mirror}", result.err().map(|e| percent_encode(&e)).unwrap_or_default())
}

impl More {
    /// Asks for a panel (its button was pressed): its [`Slot`] loads it.
    pub fn request(self, panel: Lazy) {
        self.asked.update(|a| *a |= panel.bit());
    }

    /// Whether a panel was asked for (tracked).
    pub fn requested(self, panel: Lazy) -> bool {
        self.asked.with(|a| a & panel.bit() != 0)
    }

    /// Runs `f` with the module, fetching and opening it first if need be.
    fn with_module(self, store: Store, f: impl FnOnce(Result<Module, String>) + 'static) {
        enum Now {
            Ready(Module),
            Failed(String),
            Wait,
            Start,
        }
        let now = self.load.with_value(|l| match l {
            Load::Ready(m) => Now::Ready(m.clone()),
            Load::Failed(e) => Now::Failed(e.clone()),
            Load::Loading(_) => Now::Wait,
            Load::Idle => Now::Start,
        });
        match now {
            Now::Ready(m) => f(Ok(m)),
            Now::Failed(e) => f(Err(e)),
            Now::Wait => self.load.update_value(|l| {
                if let Load::Loading(q) = l {
                    q.push(Box::new(f));
                }
            }),
            Now::Start => {
                self.load.set_value(Load::Loading(vec![Box::new(f)]));
                dom::mark("trainmem:more:fetch");
                leptos::task::spawn_local(async move {
                    let result = fetch(store).await;
                    let ready = match &result {
                        Ok(m) => Load::Ready(m.clone()),
                        Err(e) => Load::Failed(e.clone()),
                    };
                    let waiting = match self.load.try_update_value(|l| std::mem::replace(l, ready)) {
                        Some(Load::Loading(q)) => q,
                        _ => Vec::new(),
                    };
                    if result.is_ok() {
                        dom::mark("trainmem:more:open");
                        self.open.set(true);
                    }
                    for f in waiting {
                        f(result.clone());
                    }
                });
            }
        }
    }

    /// Mounts `panel` into `el` (fetching the module first if need be); `options` are the
    /// panel's (the benchmark's `open`).
    fn mount(
        self,
        store: Store,
        panel: Lazy,
        el: web_sys::Element,
        options: &'static str,
        then: impl FnOnce(Result<(), String>) + 'static,
    ) {
        self.with_module(store, move |m| {
            then(m.and_then(|m| m.call("mount", &[JsValue::from_str(panel.id()), el.into(), JsValue::from_str(options)])))
        });
    }
}

/// Fetches the module (its content-hashed files, checked by their digests) and opens it with
/// the page's state and the function that answers its changes.
async fn fetch(store: Store) -> Result<Module, String> {
    let module = Module { exports: dom::load_module("more").await? };
    let host = Closure::<dyn Fn(String) -> String>::new(move |text: String| answer(store, &text));
    let mirror = untrack(|| store.mirror()).encode();
    module.call("open", &[host.as_ref().clone(), JsValue::from_str(&mirror)])?;
    // The module keeps it for the page's life.
    host.forget();
    Ok(module)
}

/// Where a slot stands.
#[derive(Clone, Debug, PartialEq)]
enum Shown {
    Placeholder,
    Loading,
    Mounted,
    Failed(String),
}

/// Where a lazily loaded panel goes: `children` (its placeholder; none for a panel that shows
/// nothing until it is asked for) until it is asked for — by
/// [`More::request`], or by `open` (what the link asks for) — then the panel, mounted here by
/// the module. Both wrappers are `display: contents`, so the panel lays out as if it were in
/// the slot's place. `options` say how to mount it (read when it is mounted); `on_mount` runs
/// once it is there. Where the placeholder held the focus, the panel's first control takes it.
#[component]
pub fn Slot(
    panel: Lazy,
    #[prop(into)] open: Signal<bool>,
    #[prop(optional)] options: Option<Callback<(), &'static str>>,
    #[prop(optional)] on_mount: Option<Callback<()>>,
    #[prop(optional)] children: Option<ChildrenFn>,
) -> impl IntoView {
    let store = use_store();
    let more = use_more();
    let shown = RwSignal::new(Shown::Placeholder);
    let outer = NodeRef::<Div>::new();
    let target = NodeRef::<Div>::new();
    Effect::new(move |_| {
        if shown.with_untracked(|s| *s != Shown::Placeholder) || !(open.get() || more.requested(panel)) {
            return;
        }
        let (Some(el), Some(outer)) = (target.get(), outer.get()) else { return };
        shown.set(Shown::Loading);
        let options = options.map_or("", |o| o.run(()));
        let target_el: web_sys::Element = el.clone().into();
        more.mount(store, panel, target_el, options, move |r| match r {
            Ok(()) => {
                let focused =
                    document().active_element().is_some_and(|a| outer.contains(Some(a.as_ref())) && !el.contains(Some(a.as_ref())));
                shown.set(Shown::Mounted);
                if focused {
                    dom::focus_first(&el);
                }
                if let Some(f) = on_mount {
                    f.run(());
                }
            }
            Err(e) => shown.set(Shown::Failed(e)),
        });
    });
    let placeholder = Memo::new(move |_| shown.with(|s| *s != Shown::Mounted));
    view! {
        <div class="lazy" data-lazy=panel.id() node_ref=outer aria-busy=move || shown.with(|s| *s == Shown::Loading).to_string()>
            {move || placeholder.get().then(|| children.as_ref().map(|c| c()))}
            {move || shown.with(|s| match s {
                Shown::Failed(e) => Some(view! { <p class="notice" role="alert" data-testid="lazy-error">"This panel could not be loaded: "{e.clone()}</p> }),
                _ => None,
            })}
            <div class="lazy" node_ref=target></div>
        </div>
    }
}
