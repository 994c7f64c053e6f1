//! The one-click answers and the cheapest fixes, computed beside the page in the analysis
//! worker where there is one.
//!
//! Why: every change of the configuration recomputes them, and they are the page's costliest
//! update: binary searches over the decided estimate, each step a replay of the caching
//! allocator (~4–5 ms of the ~15 ms an input took on the main thread, by `scripts/perf.sh`).
//! The compile worker (web/compile-worker.js) already holds an instance of the app's module,
//! warmed on the page's configuration; it stays alive as the analysis worker and computes them
//! on the second core while the page's main thread updates the verdict, the ledger and the
//! charts. The page's loader leaves that worker as `trainmemAnalysis` on the window, with its
//! first answers (`trainmemFound`, computed during the warm-up for the page's own query).
//!
//! What crosses is [`Found`] as JSON ([`crate::answers`]).
//!
//! Without a worker (it failed, or the page was started another way), or once the worker has
//! failed, the page computes them itself, at once, as it always did: [`found_for`] hides which.
//! Replies come in order and at most one request is in flight: when the configuration changed
//! meanwhile, only its latest value is asked for next.

use super::dom;
use crate::answers::{analyse, Found};
use crate::config::{encode_query, Config};
use leptos::prelude::*;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};

/// The window property the page's loader leaves the analysis worker in.
const WORKER_PROPERTY: &str = "trainmemAnalysis";
/// The measure of a request's round trip, from its post to its reply's arrival.
const ROUND_TRIP: &str = "answers:worker";
/// The window property that holds the warm-up's answers (JSON), taken once.
const FIRST_PROPERTY: &str = "trainmemFound";

/// The page's answers and the query they must be for, as [`provide`] sets them up.
#[derive(Clone, Copy)]
pub struct Answers {
    /// The query ([`encode_query`]) of the configuration the answers depend on
    /// ([`crate::answers::key_of`]): what a [`Found`] says it is for.
    pub query: Memo<String>,
    /// Its answers, possibly an earlier configuration's (see [`found_for`]).
    pub found: Signal<Option<Found>>,
    /// Whether the page places the planner, where "no single change makes it fit" leads (a
    /// course page or an embed may leave it out): the page's layout, as [`provide`] was told.
    pub plan_placed: bool,
}

/// Sets up the answers for the page's configuration, where its layout shows them, before any
/// panel: their request to the analysis worker is then the first thing each change does,
/// ahead of the page's own estimate (an effect created first is run first), so the worker
/// computes while the page's main thread updates the other views. Created in a panel, it came
/// after them, ~8 ms into each change (measured). `plan_placed`: whether the page's layout
/// places the planner ([`Answers::plan_placed`]).
pub fn provide(config: RwSignal<Config>, plan_placed: bool) {
    let key = Memo::new(move |_| config.with(crate::answers::key_of));
    let query = Memo::new(move |_| key.with(encode_query));
    provide_context(Answers { query, found: found_for(key, query), plan_placed });
}

/// The page's answers ([`provide`]).
pub fn use_answers() -> Answers {
    expect_context::<Answers>()
}

/// The answers and fixes for the configuration `key` holds (a [`key_of`], `query` its query),
/// kept current: from the analysis worker where there is one (the value lags a reply behind a
/// change; its [`Found::query`] says which configuration it is for), else computed here at
/// once.
fn found_for(key: Memo<Config>, query: Memo<String>) -> Signal<Option<Found>> {
    let Some(worker) = analysis_worker() else {
        let found = Memo::new(move |_| computed_here(key));
        return Signal::derive(move || Some(found.get()));
    };
    let client = Rc::new(Client {
        worker,
        found: RwSignal::new(take_first()),
        key,
        in_flight: Cell::new(false),
        wanted: RefCell::new(None),
        alive: Cell::new(true),
    });
    let on_reply = {
        let client = client.clone();
        Closure::<dyn Fn(web_sys::MessageEvent)>::new(move |ev: web_sys::MessageEvent| client.reply(ev))
    };
    client.worker.set_onmessage(Some(on_reply.as_ref().unchecked_ref()));
    // The worker's listener lives as long as the page.
    on_reply.forget();
    let found = client.found;
    Effect::new(move |_| {
        let query = query.get();
        if found.with_untracked(|f| f.as_ref().is_some_and(|f| f.query == query)) {
            // Already shown: the warm-up's answers, or a reply for it.
            return;
        }
        if !client.alive.get() {
            client.found.set(Some(computed_here(key)));
            return;
        }
        *client.wanted.borrow_mut() = Some(query);
        if !client.in_flight.get() {
            client.post_wanted();
        }
    });
    found.into()
}

/// The answers computed on the page's main thread (no worker, or it failed).
fn computed_here(key: Memo<Config>) -> Found {
    dom::timed("answers", || key.with(analyse))
}

/// The page's side of the analysis worker.
struct Client {
    worker: web_sys::Worker,
    /// What the panel shows.
    found: RwSignal<Option<Found>>,
    key: Memo<Config>,
    /// Whether a request is in flight.
    in_flight: Cell<bool>,
    /// The latest query the page wants answers for, not yet asked.
    wanted: RefCell<Option<String>>,
    /// False once the worker failed: the page computes from then on.
    alive: Cell<bool>,
}

impl Client {
    fn post_wanted(&self) {
        let Some(query) = self.wanted.borrow_mut().take() else { return };
        let message = js_sys::Object::new();
        let _ = js_sys::Reflect::set(&message, &"analyse".into(), &JsValue::from_str(&query));
        if self.worker.post_message(&message).is_ok() {
            dom::time_from(ROUND_TRIP);
            self.in_flight.set(true);
        } else {
            self.give_up();
        }
    }

    /// A reply: shown (it is newer than what is shown), then the latest wanted query asked for.
    fn reply(&self, ev: web_sys::MessageEvent) {
        if self.in_flight.replace(false) {
            dom::time_to(ROUND_TRIP);
        }
        let json = js_sys::Reflect::get(&ev.data(), &"found".into()).ok().and_then(|f| f.as_string());
        match json.as_deref().map(serde_json::from_str::<Found>) {
            Some(Ok(f)) => {
                // Changed and changed back while this was computed: nothing more to ask.
                if self.wanted.borrow().as_ref() == Some(&f.query) {
                    self.wanted.borrow_mut().take();
                }
                self.found.set(Some(f));
                self.post_wanted();
            }
            // The worker failed (a trap leaves its instance unusable).
            _ => self.give_up(),
        }
    }

    /// Drops the worker and computes the current answers here, as from now on.
    fn give_up(&self) {
        self.alive.set(false);
        self.worker.terminate();
        self.wanted.borrow_mut().take();
        self.found.set(Some(computed_here(self.key)));
    }
}

/// The analysis worker the page's loader left, if any.
fn analysis_worker() -> Option<web_sys::Worker> {
    dom::window_property(WORKER_PROPERTY)?.dyn_into::<web_sys::Worker>().ok()
}

/// The warm-up's answers (once: the property is cleared).
fn take_first() -> Option<Found> {
    let json = dom::window_property(FIRST_PROPERTY)?.as_string();
    dom::delete_window_property(FIRST_PROPERTY);
    serde_json::from_str(&json?).ok()
}
