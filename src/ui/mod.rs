//! The web app (Leptos, client-side rendered). One [`Config`] signal is the state: the inputs
//! edit it through the codec's keys, the ledger and charts are derived from it, and an effect
//! mirrors it into the address bar — so a link always reproduces exactly what is on screen.

pub mod bench;
mod bench_panel;
mod canvas;
mod canvas_draw;
mod charts;
mod dom;
mod embed;
pub mod extras;
mod inputs;
mod results;

use crate::config::{decode_query, encode_query, Config, ConfigError};
use crate::estimator::{explain, Estimate, EstimateError};
use leptos::prelude::*;
use wasm_bindgen::JsCast;

/// Loads the extras module (bar, charts, textbook, config.json import) into its slots.
async fn load_extras() {
    if let Err(e) = dom::load_module("./extras/trainmem-extras.js", "./extras/trainmem-extras_bg.wasm").await {
        leptos::logging::warn!("the charts module could not be loaded: {e}");
    }
}

/// What every component reads: the configuration, the estimate derived from it, and the
/// page's presentation state.
#[derive(Clone, Copy)]
pub struct App {
    pub config: RwSignal<Config>,
    pub estimate: Memo<Result<Estimate, EstimateError>>,
    /// Problems with the link the page was opened with (dismissible).
    pub notices: RwSignal<Vec<ConfigError>>,
    /// `embed=1`: the compact view for iframes.
    pub embed: bool,
    /// `view=`: which panel an embed shows.
    pub view: RwSignal<String>,
    /// `light`, `dark` or `auto`.
    pub theme: RwSignal<String>,
    /// `bench=`: a shared benchmark result, kept in the address bar for the benchmark module.
    pub bench: RwSignal<String>,
}

impl App {
    /// Is the effective theme dark?
    pub fn dark(&self) -> bool {
        match self.theme.get().as_str() {
            "dark" => true,
            "light" => false,
            _ => dom::prefers_dark(),
        }
    }
}

pub fn app() -> App {
    use_context::<App>().unwrap_or_else(|| {
        // Only reachable if a component is mounted outside <Root/>, which the app never does.
        let config = RwSignal::new(Config::default());
        App {
            config,
            estimate: Memo::new(move |_| config.with(explain)),
            notices: RwSignal::new(Vec::new()),
            embed: false,
            view: RwSignal::new(String::new()),
            theme: RwSignal::new("auto".into()),
            bench: RwSignal::new(String::new()),
        }
    })
}

/// Presentation keys (`embed`, `view`, `theme`) appended to the configuration's query.
fn presentation_query(app: &App) -> String {
    let mut extra = Vec::new();
    if app.embed {
        extra.push("embed=1".to_string());
    }
    let view = app.view.get_untracked();
    if !view.is_empty() {
        extra.push(format!("view={}", crate::config::percent_encode(&view)));
    }
    let bench = app.bench.get_untracked();
    if !bench.is_empty() {
        extra.push(format!("bench={}", crate::config::percent_encode(&bench)));
    }
    extra.join("&")
}

fn full_query(app: &App, cfg: &Config) -> String {
    let q = encode_query(cfg);
    let p = presentation_query(app);
    match (q.is_empty(), p.is_empty()) {
        (true, _) => p,
        (_, true) => q,
        _ => format!("{q}&{p}"),
    }
}

/// Mounts the app on `<body>`.
pub fn mount() {
    console_error_panic_hook::set_once();
    dom::mark("trainmem:start");
    leptos::mount::mount_to_body(Root);
}

impl App {
    /// The page's state from its address: the configuration, what was wrong with the link, and
    /// the presentation keys.
    pub fn from_url() -> App {
        let decoded = decode_query(&dom::search());
        let get_p = |k: &str| decoded.presentation.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        let embed = get_p("embed").is_some_and(|v| v == "1" || v == "true");
        let theme =
            get_p("theme").filter(|t| t == "light" || t == "dark").or_else(|| dom::load("trainmem-theme")).unwrap_or_else(|| "auto".into());
        let config = RwSignal::new(decoded.config);
        App {
            config,
            estimate: Memo::new(move |_| config.with(explain)),
            notices: RwSignal::new(decoded.errors),
            embed,
            view: RwSignal::new(get_p("view").unwrap_or_default()),
            theme: RwSignal::new(theme),
            bench: RwSignal::new(get_p("bench").unwrap_or_default()),
        }
    }
}

#[component]
fn Root() -> impl IntoView {
    let app = App::from_url();
    let config = app.config;
    provide_context(app);

    // The address bar follows the configuration: replaceState while the user is editing, and a
    // new history entry once an edit has settled for a second, so back/forward step through
    // meaningful states.
    let last_push = StoredValue::new(0.0f64);
    Effect::new(move |prev: Option<String>| {
        let q = config.with(|c| full_query(&app, c));
        if prev.as_deref() != Some(q.as_str()) {
            let now = dom::now_ms();
            if prev.is_some() && now - last_push.get_value() > 1000.0 {
                dom::push_query(&q);
            } else {
                dom::replace_query(&q);
            }
            last_push.set_value(now);
            // After this task: the ledger paints first, the charts follow.
            set_timeout(dom::notify_config, std::time::Duration::from_millis(0));
        }
        q
    });
    // The lazily loaded module (charts, bar, textbook, import) edits the configuration through
    // an event carrying its query.
    let _ = window_event_listener_untyped(dom::SET_QUERY_EVENT, move |ev| {
        if let Some(q) = ev.dyn_ref::<web_sys::CustomEvent>().and_then(|e| e.detail().as_string()) {
            config.set(decode_query(&q).config);
        }
    });
    // After the first paint: the extras module.
    request_animation_frame(|| set_timeout(|| leptos::task::spawn_local(load_extras()), std::time::Duration::from_millis(0)));
    // Back/forward restore the configuration of that entry.
    let _ = window_event_listener(leptos::ev::popstate, move |_| {
        let d = decode_query(&dom::search());
        config.set(d.config);
        app.notices.set(d.errors);
    });
    Effect::new(move |_| {
        let t = app.theme.get();
        dom::set_root_attribute("data-theme", &t);
        dom::notify_config();
    });
    dom::mark("trainmem:mounted");

    view! {
        <Show when=move || app.embed fallback=|| view! { <FullPage/> }>
            <embed::EmbedView/>
        </Show>
    }
}

#[component]
fn FullPage() -> impl IntoView {
    view! {
        <a class="skip" href="#results">"Skip to results"</a>
        <Header/>
        <results::Notices/>
        <main class="layout">
            <inputs::Inputs/>
            <results::Results/>
        </main>
        <footer class="foot">
            <p>
                "trainmem estimates training memory per GPU from first principles: every figure shows its formula and source. "
                "GB = 10⁹ bytes, GiB = 2³⁰ bytes. Activation accounting follows Hugging Face transformers' module code and is checked against PyTorch's saved tensors."
            </p>
            <p data-testid="version">{crate::version::LABEL}</p>
        </footer>
    }
}

#[component]
fn Header() -> impl IntoView {
    let app = app();
    let copied = RwSignal::new(false);
    let copy = move |_| {
        let url = format!("{}{}", dom::base_url(), dom::search());
        leptos::task::spawn_local(async move {
            let ok = dom::copy_text(&url).await;
            copied.set(ok);
            set_timeout(move || copied.set(false), std::time::Duration::from_millis(2000));
        });
    };
    let cycle_theme = move |_| {
        let next = match app.theme.get().as_str() {
            "auto" => "light",
            "light" => "dark",
            _ => "auto",
        };
        app.theme.set(next.to_string());
        dom::store("trainmem-theme", next);
    };
    let unit_gib = move || app.config.with(|c| c.unit == crate::config::Unit::Gib);
    let set_unit = move |gib: bool| app.config.update(|c| c.unit = if gib { crate::config::Unit::Gib } else { crate::config::Unit::Gb });
    view! {
        <header class="top">
            <div class="brand">
                <h1>"trainmem"</h1>
                <p class="tagline">"Where GPU memory goes when you train a transformer — every byte, with its formula."</p>
            </div>
            <div class="tools" role="toolbar" aria-label="Page tools">
                <fieldset class="seg" aria-label="Byte unit">
                    <legend class="sr-only">"Byte unit"</legend>
                    <label><input type="radio" name="unit" prop:checked=move || !unit_gib() on:change=move |_| set_unit(false)/>"GB (10⁹)"</label>
                    <label><input type="radio" name="unit" prop:checked=unit_gib on:change=move |_| set_unit(true)/>"GiB (2³⁰)"</label>
                </fieldset>
                <button type="button" on:click=cycle_theme aria-label="Colour theme">
                    {move || format!("Theme: {}", app.theme.get())}
                </button>
                <button type="button" on:click=copy data-testid="copy-link">
                    {move || if copied.get() { "Link copied ✓" } else { "Copy link" }}
                </button>
                <embed::EmbedButton/>
            </div>
        </header>
    }
}
