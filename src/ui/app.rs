//! The page: the store, then the panels a [`Layout`] lists, in its two columns (or one, in an
//! embed). Each panel is its own component under [`super::panels`]; this file only places them.
//! The panels a visitor opens later are placed as their shells: each loads its panel from the
//! lazily loaded module when it is opened ([`super::lazy`]).

use super::analysis;
use super::dom;
use super::layout::{Layout, Panel};
use super::lazy;
use super::panels::{
    architecture, bar, bench, charts, compare, course, embed, exercise, frameworks, import, inputs, ledger, notices, plan, serve, textbook,
    toolbar, verdict, verify,
};
use super::state::{use_store, Store};
use super::widgets;
use leptos::html::Main;
use leptos::prelude::*;

/// Mounts the app on `<body>`; in the compile worker (no `window`), runs the first screen's
/// analysis instead, so that its code is compiled off the page's main thread (see [`super::warm`]).
pub fn mount() {
    if web_sys::window().is_none() {
        super::warm::run();
        return;
    }
    console_error_panic_hook::set_once();
    dom::mark("trainmem:start");
    // A task of its own, apart from the wasm's instantiation: the page's start-up comes in
    // short tasks (see `panels`).
    set_timeout(
        || {
            // The link's state first, in a task of its own (decoding it is the first use of
            // much of the config's code, compiled as it first runs); the mount in the next.
            STORE.with(|s| s.set(Some(Store::from_url())));
            set_timeout(
                || {
                    leptos::mount::mount_to_body(App);
                },
                std::time::Duration::ZERO,
            );
        },
        std::time::Duration::ZERO,
    );
}

thread_local! {
    /// The store [`mount`] made from the link in the task before the mount, for [`App`] to take.
    static STORE: std::cell::Cell<Option<Store>> = const { std::cell::Cell::new(None) };
}

/// One panel. Each arm is a function of its own (`#[inline(never)]`): WebAssembly compiles a
/// function the first time it runs, so showing the first panels compiles their code only, not
/// every panel's.
fn panel(p: Panel) -> AnyView {
    match p {
        Panel::Model => model(),
        Panel::Import => import(),
        Panel::Architecture => architecture(),
        Panel::Training => training(),
        Panel::Cluster => cluster(),
        Panel::Overhead => overhead(),
        Panel::Verdict => verdict(),
        Panel::Answers => answers(),
        Panel::Bar => bar(),
        Panel::Ledger => ledger(),
        Panel::Textbook => textbook(),
        Panel::Charts => charts(),
        Panel::Chart(kind) => chart(kind),
        Panel::Bench => bench(),
        Panel::Exercises => exercises(),
        Panel::Compare => compare(),
        Panel::Plan => plan(),
        Panel::Verify => verify(),
        Panel::Frameworks => frameworks(),
        Panel::Serving => serving(),
        Panel::Serve => serve(),
        // Parts of other things, never placed on their own.
        Panel::Share | Panel::Formulas => ().into_any(),
    }
}

#[inline(never)]
fn model() -> AnyView {
    view! { <inputs::Model/> }.into_any()
}
#[inline(never)]
fn import() -> AnyView {
    view! { <import::Import/> }.into_any()
}
#[inline(never)]
fn architecture() -> AnyView {
    view! { <architecture::Architecture/> }.into_any()
}
#[inline(never)]
fn training() -> AnyView {
    view! { <inputs::Training/> }.into_any()
}
#[inline(never)]
fn cluster() -> AnyView {
    view! { <inputs::Cluster/> }.into_any()
}
#[inline(never)]
fn overhead() -> AnyView {
    view! { <inputs::Overhead/> }.into_any()
}
#[inline(never)]
fn verdict() -> AnyView {
    view! { <verdict::Verdict/> }.into_any()
}
#[inline(never)]
fn answers() -> AnyView {
    view! { <verdict::Answers/> }.into_any()
}
#[inline(never)]
fn bar() -> AnyView {
    view! { <bar::Bar/> }.into_any()
}
#[inline(never)]
fn ledger() -> AnyView {
    view! { <ledger::Ledger/> }.into_any()
}
#[inline(never)]
fn textbook() -> AnyView {
    view! { <textbook::Textbook/> }.into_any()
}
#[inline(never)]
fn charts() -> AnyView {
    view! { <charts::Charts/> }.into_any()
}
#[inline(never)]
fn chart(kind: crate::plots::ChartKind) -> AnyView {
    view! { <charts::ChartPanel kind=kind/> }.into_any()
}
#[inline(never)]
fn bench() -> AnyView {
    view! { <bench::Bench/> }.into_any()
}
#[inline(never)]
fn exercises() -> AnyView {
    view! { <exercise::Shell/> }.into_any()
}
#[inline(never)]
fn compare() -> AnyView {
    view! { <compare::Shell/> }.into_any()
}
#[inline(never)]
fn plan() -> AnyView {
    view! { <plan::Shell/> }.into_any()
}
#[inline(never)]
fn verify() -> AnyView {
    view! { <verify::Verify/> }.into_any()
}
#[inline(never)]
fn frameworks() -> AnyView {
    view! { <frameworks::Frameworks/> }.into_any()
}
#[inline(never)]
fn serving() -> AnyView {
    view! { <serve::Serving/> }.into_any()
}
#[inline(never)]
fn serve() -> AnyView {
    view! { <serve::Serve/> }.into_any()
}

/// The order waiting panels are shown in: the model's fieldset, the rest of the form's first
/// screen, then (after the estimate, computed in a task of its own: [`Estimated`]) the verdict,
/// then the ledger, then the rest in page order (the answers first; what is below the first
/// screen after).
fn turn(p: Panel) -> u8 {
    match p {
        Panel::Model => MODEL,
        Panel::Training => FORM,
        Panel::Verdict | Panel::Serve => VERDICT,
        Panel::Ledger => LEDGER,
        Panel::Serving => FORM,
        _ => REST,
    }
}

/// The turns, in order. The page's header first, a task after the mount's (which only sets
/// up the store and the page's frame), then the tabs and the layout's frame, then the model's
/// fieldset: each a task of its own, so that none is long.
const HEADER: u8 = 0;
const MODEL: u8 = 1;
/// The form's other fieldsets.
const FORM: u8 = 2;
/// The estimate ([`Estimated`]): after the form, before the verdict.
const ESTIMATE: u8 = 3;
/// The verdict, then the dialogs the toolbar and the browser's print open.
const VERDICT: u8 = 4;
const LEDGER: u8 = 5;
/// Every other panel, in page order.
const REST: u8 = 6;
/// What comes after every panel (the footer): while panels are still coming, a footer would sit
/// in the first screen and be its largest paint.
const LAST: u8 = 7;

thread_local! {
    /// Panels waiting to be shown, with their [`turn`] ([`Later`]).
    static QUEUE: std::cell::RefCell<Vec<(u8, RwSignal<bool>)>> = Default::default();
}

/// Shows the next waiting panel (the first of the lowest turn), then schedules the one after it
/// in a task of its own.
fn show_next() {
    let next = QUEUE.with(|q| {
        let mut q = q.borrow_mut();
        let i = (0..q.len()).min_by_key(|&i| (q[i].0, i))?;
        Some(q.remove(i).1)
    });
    if let Some(ready) = next {
        ready.set(true);
        set_timeout(show_next, std::time::Duration::ZERO);
    }
}

/// A signal that turns true in `turn` (the first waits a frame, each next one a task after the
/// one before).
fn queued(turn: u8) -> RwSignal<bool> {
    let ready = RwSignal::new(false);
    let first = QUEUE.with(|q| {
        let mut q = q.borrow_mut();
        q.push((turn, ready));
        q.len() == 1
    });
    if first {
        request_animation_frame(move || set_timeout(show_next, std::time::Duration::ZERO));
    }
    ready
}

/// A panel shown after the first paint, in its turn.
#[component]
fn Later(panel: Panel) -> impl IntoView {
    let ready = queued(turn(panel));
    move || ready.get().then(|| self::panel(panel))
}

/// Computes the estimate in its turn, a task of its own: the verdict's task then only shows it
/// (two shorter tasks at start-up instead of one long one). Shows nothing.
#[component]
fn Estimated() -> impl IntoView {
    let store = use_store();
    let ready = queued(ESTIMATE);
    move || {
        if ready.get() {
            store.estimate.with_untracked(|_| ());
        }
    }
}

/// Anything else shown after the first paint, in `turn`.
#[component]
fn InTurn(turn: u8, children: ChildrenFn) -> impl IntoView {
    let ready = queued(turn);
    move || ready.get().then(|| children())
}

fn panels(list: Vec<Panel>) -> impl IntoView {
    // Every panel waits for the first paint: the mount builds the page's skeleton, and the panels
    // follow one per task in their [`turn`] ([`Later`]), the model's fieldset first, so that no
    // single task of the page's start-up blocks input for long. The wasm compiles each function
    // the first time it runs: a Chromium trace showed ~650 functions compiled in the mount's one
    // task when it built the model's fieldset too, ~100 ms of the 4×-throttled main thread.
    list.into_iter().map(|p| view! { <Later panel=p/> }).collect_view()
}

/// An embed's one column: runs of input panels go into a form of their own, in place.
fn grouped(list: Vec<Panel>) -> impl IntoView {
    let mut runs: Vec<(bool, Vec<Panel>)> = Vec::new();
    for p in list {
        match runs.last_mut() {
            Some((input, run)) if *input == p.is_input() => run.push(p),
            _ => runs.push((p.is_input(), vec![p])),
        }
    }
    runs.into_iter()
        .map(|(input, run)| if input { view! { <widgets::Form>{panels(run)}</widgets::Form> }.into_any() } else { panels(run).into_any() })
        .collect_view()
}

#[component]
fn App() -> impl IntoView {
    let store = STORE.with(std::cell::Cell::take).unwrap_or_else(Store::from_url);
    store.provide();
    lazy::provide(store);
    course::provide_course(store);
    dom::mark("trainmem:mounted");
    if store.embed {
        // index.html hides its header in an embed; it goes with the mount.
        dom::remove_by_id("boot");
        EmbedPage().into_any()
    } else {
        FullPage().into_any()
    }
}

/// Sets up the answers (the analysis worker) where `results` shows them, before any panel is
/// created (see [`analysis::provide`] for why the order matters).
fn provide_answers(results: &[Panel], store: Store) {
    if results.contains(&Panel::Answers) {
        analysis::provide(store.config, results.contains(&Panel::Plan));
    }
}

#[component]
fn FullPage() -> impl IntoView {
    let store = use_store();
    let (training, _) = store.course.with_value(|s| Layout::course(s, false, "", store.compare.with_untracked(Option::is_some)));
    provide_answers(&training.results, store);
    // `mode=serve` (the mode tabs): the serving fieldset and answers take the training ones'
    // places; the page is laid out again when the mode changes.
    let serving = Memo::new(move |_| store.config.with(|c| c.serve.mode == crate::estimator::serve::Mode::Serve));
    let training = StoredValue::new(training);
    let layout = move || if serving.get() { store.course.with_value(|s| training.get_value().serving(s)) } else { training.get_value() };
    let tabs = !store.locked("mode") || serving.get_untracked();
    view! {
        <a class="skip" href="#results">"Skip to results"</a>
        <InTurn turn=HEADER>
            <Header/>
        </InTurn>
        <Estimated/>
        // The tabs and the layout's frame in the model's turn, a task after the mount's (the
        // model's fieldset comes a task after them, first in that turn's queue).
        <InTurn turn=MODEL>
        {tabs.then(|| view! { <serve::ModeTabs/> })}
        // Unnamed: a named tabpanel outside a landmark is a region axe asks to be one (the tabs
        // that control it say what it shows).
        <div id="mode-panel" role="tabpanel">
            {move || {
                let layout = layout();
                let has_inputs = !layout.inputs.is_empty();
                let pinned = has_inputs && layout.results.contains(&Panel::Verdict);
                view! {
                    // The verdict's line, pinned on a phone (where the results come after the form).
                    {pinned.then(|| view! { <InTurn turn=VERDICT><verdict::Pin/></InTurn> })}
                    <main class=if has_inputs { "layout" } else { "layout single" }>
                        {has_inputs.then(|| view! { <widgets::Form>{panels(layout.inputs)}</widgets::Form> })}
                        <section id="results" class="results" aria-label="Results" tabindex="-1">{panels(layout.results)}</section>
                    </main>
                }
            }}
        </div>
        </InTurn>
        <InTurn turn=LAST>
            <footer class="foot">
                <p>
                    "trainmem estimates training memory per GPU from first principles: every figure shows its formula and source. "
                    "GB = 10⁹ bytes, GiB = 2³⁰ bytes. Activation accounting follows Hugging Face transformers' module code and is checked against PyTorch's saved tensors."
                </p>
                <p data-testid="version">{crate::version::LABEL}</p>
            </footer>
        </InTurn>
        // In the verdict's turn, a task after the form's (ready once the verdict is): the
        // toolbar opens the one, the browser's print fills the other.
        <InTurn turn=VERDICT>
            <embed::Shell/>
            <course::PrintSheet/>
        </InTurn>
    }
}

/// The page's header, the notices and the course bar, in a task after the mount's. index.html
/// paints a header before the wasm arrives; this one takes its place in the same task, so
/// nothing flickers or shifts.
#[component]
fn Header() -> impl IntoView {
    dom::remove_by_id("boot");
    view! {
        <toolbar::Toolbar/>
        <notices::Notices/>
        <course::CourseBar/>
    }
}

/// The compact page of `embed=1`: the verdict, the bar and the panel `view=` asks for, and a
/// link to the full page. It tells its parent its height (the content's own box, so a frame
/// given too much room shrinks to it).
#[component]
fn EmbedPage() -> impl IntoView {
    let store = use_store();
    let main = NodeRef::<Main>::new();
    let watch = StoredValue::new_local(None::<dom::ResizeWatch>);
    Effect::new(move |_| {
        if let Some(el) = main.get() {
            let content = el.clone();
            watch.set_value(dom::ResizeWatch::new(&el, move || dom::post_height(&content)));
        }
    });
    let (layout, problem) =
        store.course.with_value(|s| Layout::course(s, true, &store.view.get_untracked(), store.compare.with_untracked(Option::is_some)));
    // A `view=` that names no panel is one more thing the link's notice lists.
    if let Some(p) = problem {
        let view = store.view.get_untracked();
        store.notices.update(|n| n.push(crate::config::ConfigError::for_key("view", &view, p)));
    }
    provide_answers(&layout.results, store);
    // In serving mode the serving answers take the training verdict's place.
    let serving = store.config.with_untracked(|c| c.serve.mode == crate::estimator::serve::Mode::Serve);
    let list = if serving { store.course.with_value(|s| layout.serving(s)).results } else { layout.results };
    view! {
        <main class="embed" data-testid="embed" node_ref=main>
            <h1 class="sr-only">"trainmem"</h1>
            // The same notice as the full page's: what in the link could not be used.
            <notices::Notices/>
            // A chart alone has a third-level heading, as under the full page's "Charts".
            {list.iter().any(|p| matches!(p, Panel::Chart(_))).then(|| view! { <h2 class="sr-only">"Charts"</h2> })}
            {grouped(list)}
            <p class="open"><a data-testid="open-full" href=move || store.share_url() target="_blank" rel="noopener">"Open this configuration in trainmem ↗"</a></p>
        </main>
    }
}
