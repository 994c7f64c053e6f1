//! The page's state: one store, derived from one [`Config`].
//!
//! - **The configuration** is the single source of truth. The estimate (numbers only, the
//!   fast path) is a memo of it; every panel reads one or the other and writes through the
//!   typed setters here, which go through the codec's own keys ([`config::apply_pairs`]), so a
//!   value typed in the page is checked exactly as one in a link.
//! - **One URL sync** ([`sync_url`]): the address is decoded once, at start; every change is
//!   written back with `replaceState` once a run of quick edits has ended (and a new history
//!   entry once an edit has settled for a second, so back and forward step through meaningful
//!   states); `popstate` restores a state.
//! - **One theme source**: `theme=` in the link (light, dark, projector, auto), else the
//!   visitor's last choice, else the system's; [`Store::look`] is what the page and the charts
//!   draw with.
//! - **One unit source**: the configuration's `unit`.
//! - **Typed choices**: the model and the GPU are [`ModelChoice`] and [`GpuChoice`] here; the
//!   codec's `custom` spelling stays in the URL.
//! - **One store across two modules**: the panels a visitor opens later run in their own wasm
//!   module (`ui::more`), with a store of their own that mirrors the page's ([`Mirror`]) and
//!   sends every change to the page's ([`Change`]): the page's store stays the one source of
//!   truth, and a panel writes through the same setters in either module.

use super::dom;
use crate::config::{self, decode_query, encode_query, ChartView, Config, ConfigError, Unit};
use crate::course::settings::Settings;
use crate::estimator::gpu::{self, Gpu};
use crate::estimator::hf::Imported;
use crate::estimator::{Estimate, EstimateError};
use crate::plots::{Theme, DARK, LIGHT, PROJECTOR};
use leptos::prelude::*;

/// The theme the visitor chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThemeChoice {
    /// The system's light or dark.
    Auto,
    Light,
    Dark,
    /// High contrast and large type, for a room's projector.
    Projector,
}

impl ThemeChoice {
    pub const ALL: [ThemeChoice; 4] = [ThemeChoice::Auto, ThemeChoice::Light, ThemeChoice::Dark, ThemeChoice::Projector];

    /// The spelling of `theme=` and of `<html data-theme>`.
    pub fn as_str(self) -> &'static str {
        match self {
            ThemeChoice::Auto => "auto",
            ThemeChoice::Light => "light",
            ThemeChoice::Dark => "dark",
            ThemeChoice::Projector => "projector",
        }
    }

    pub fn parse(s: &str) -> Option<ThemeChoice> {
        ThemeChoice::ALL.into_iter().find(|t| t.as_str().eq_ignore_ascii_case(s.trim()))
    }

    /// The next one of the theme button's cycle.
    pub fn next(self) -> ThemeChoice {
        match self {
            ThemeChoice::Auto => ThemeChoice::Light,
            ThemeChoice::Light => ThemeChoice::Dark,
            ThemeChoice::Dark => ThemeChoice::Projector,
            ThemeChoice::Projector => ThemeChoice::Auto,
        }
    }
}

/// What the page is drawn with: the chosen theme with `auto` resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    Light,
    Dark,
    Projector,
}

impl Look {
    /// The charts' colours and type.
    pub fn chart_theme(self) -> Theme {
        match self {
            Look::Light => LIGHT,
            Look::Dark => DARK,
            Look::Projector => PROJECTOR,
        }
    }
}

/// The model, as the UI holds it.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelChoice {
    /// A preset, by id.
    Preset(String),
    /// The configuration's own architecture, with its display name.
    Custom(String),
}

/// The GPU, as the UI holds it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GpuChoice {
    Catalog(Gpu),
    /// A GPU of this many GiB.
    Custom(f64),
}

impl GpuChoice {
    /// "NVIDIA H100 80 GB (SXM)", "custom 24 GiB GPU".
    pub fn label(&self) -> String {
        match self {
            GpuChoice::Catalog(g) => g.name.to_string(),
            GpuChoice::Custom(gib) => format!("custom {gib} GiB GPU"),
        }
    }
}

/// Everything the panels read, and the setters they write through.
#[derive(Clone, Copy)]
pub struct Store {
    pub config: RwSignal<Config>,
    /// The estimate's numbers for the configuration.
    pub estimate: Memo<Result<Estimate, EstimateError>>,
    /// Problems with the link the page was opened with (dismissible).
    pub notices: RwSignal<Vec<ConfigError>>,
    /// `embed=1`: the compact view for iframes.
    pub embed: bool,
    /// `view=`: the panel an embed shows, or the chart the full page opens first.
    pub view: RwSignal<String>,
    pub theme: RwSignal<ThemeChoice>,
    /// Whether the link carried `theme=` (then the address keeps it).
    theme_in_url: bool,
    /// The system's colour scheme.
    system_dark: RwSignal<bool>,
    /// `bench=`: a shared benchmark result, kept in the address.
    pub bench: RwSignal<String>,
    /// `chart=`: how the sequence chart is drawn (log axis, the recipes compared), kept in the
    /// address so that a shared link or a course's embed shows what its author saw.
    pub chart: RwSignal<ChartView>,
    /// Course mode (`sections=`, `hide=`, `lock=`, `step=`, `quiz=`, `ask=`, `allow_origin=`, …),
    /// decoded once with the rest of the link ([`Settings::decode`]); bad values are notices.
    pub course: StoredValue<Settings>,
    /// The configuration compared with (`compare=`, or "duplicate as B").
    pub compare: RwSignal<Option<Config>>,
    /// The estimate's numbers for [`Store::compare`].
    pub compare_estimate: Memo<Option<Result<Estimate, EstimateError>>>,
    /// Predict-then-reveal (`quiz=1`): whether the learner has guessed, so the figures show.
    pub revealed: RwSignal<bool>,
    /// The last change applied from the answers panel (a fix, a next change): what it promised,
    /// so that the verdict can say whether the configuration it led to keeps that promise.
    pub applied: RwSignal<Option<Applied>>,
    /// How many times the answers asked the planner to search for what fits (their "no single
    /// change" line's button): the Plan panel searches on each new ask, and widens the search
    /// by itself where nothing fits ([`crate::estimator::plan::widen`]).
    pub plan_asks: RwSignal<u32>,
    /// In the lazily loaded module: where its changes go (the page's store, which answers
    /// with its new state); `None` on the page, where they are applied here.
    remote: Option<StoredValue<Remote, LocalStorage>>,
}

/// Sends a change to the page's store and follows the state it answers with.
pub type Remote = std::rc::Rc<dyn Fn(Change) -> Result<(), String>>;

/// A change of the page's state, as one of the store's setters makes it: applied to the page's
/// store, or sent to it from the lazily loaded module as text ([`Change::encode`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Configuration keys and their values, as a link spells them ([`Store::apply`]).
    Keys(Vec<(String, String)>),
    /// A whole configuration (an imported architecture): its query.
    Config(String),
    /// A whole state: the configuration, and `compare=` and `theme=` if it has them
    /// ([`Store::set_state`]).
    State(String),
    /// The configuration compared with (its query), or none.
    Compare(Option<String>),
    /// A and B change places ([`Store::swap_compare`]).
    Swap,
    /// A quiz's figures show ([`Store::reveal`]).
    Reveal,
}

impl Change {
    /// One line naming the change, then its text (percent-encoded).
    pub fn encode(&self) -> String {
        let pe = config::percent_encode;
        match self {
            Change::Keys(pairs) => {
                format!("keys\n{}", pairs.iter().map(|(k, v)| format!("{}={}", pe(k), pe(v))).collect::<Vec<_>>().join("&"))
            }
            Change::Config(q) => format!("config\n{}", pe(q)),
            Change::State(q) => format!("state\n{}", pe(q)),
            Change::Compare(Some(q)) => format!("compare\n{}", pe(q)),
            Change::Compare(None) => "compare".into(),
            Change::Swap => "swap".into(),
            Change::Reveal => "reveal".into(),
        }
    }

    pub fn decode(text: &str) -> Option<Change> {
        let (kind, rest) = text.split_once('\n').map_or((text, None), |(k, r)| (k, Some(r)));
        let pd = config::percent_decode;
        Some(match (kind, rest) {
            // The page's own splitter: a pair without `=` is the key with an empty value.
            ("keys", Some(r)) => Change::Keys(config::query_pairs(r)),
            ("config", Some(r)) => Change::Config(pd(r)),
            ("state", Some(r)) => Change::State(pd(r)),
            ("compare", r) => Change::Compare(r.map(pd)),
            ("swap", None) => Change::Swap,
            ("reveal", None) => Change::Reveal,
            _ => return None,
        })
    }
}

/// What the lazily loaded module's panels read of the page's state, as the page sends it
/// ([`Store::mirror`], [`Store::follow`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Mirror {
    /// The configuration's query.
    pub config: String,
    /// The configuration compared with, its query.
    pub compare: Option<String>,
    /// The theme the page is drawn in.
    pub look: Look,
    /// Whether a quiz's figures show.
    pub revealed: bool,
    /// A shared benchmark result (`bench=`).
    pub bench: String,
    /// [`Store::plan_asks`].
    pub plan_asks: u32,
}

impl Mirror {
    /// One line a field, each percent-encoded.
    pub fn encode(&self) -> String {
        let pe = config::percent_encode;
        let look = match self.look {
            Look::Light => "light",
            Look::Dark => "dark",
            Look::Projector => "projector",
        };
        let compare = self.compare.as_deref().map_or_else(|| "-".to_string(), |q| format!("+{}", pe(q)));
        format!("{}\n{compare}\n{look}\n{}\n{}\n{}", pe(&self.config), u8::from(self.revealed), pe(&self.bench), self.plan_asks)
    }

    pub fn decode(text: &str) -> Option<Mirror> {
        let pd = config::percent_decode;
        let mut lines = text.split('\n');
        let config = pd(lines.next()?);
        let compare = lines.next()?.strip_prefix('+').map(pd);
        let look = match lines.next()? {
            "dark" => Look::Dark,
            "projector" => Look::Projector,
            _ => Look::Light,
        };
        let revealed = lines.next()? == "1";
        let bench = pd(lines.next()?);
        let plan_asks = lines.next()?.parse().ok()?;
        Some(Mirror { config, compare, look, revealed, bench, plan_asks })
    }
}

/// A change applied from the answers panel, and what it promised.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// What the button called it ("full recompute").
    pub label: String,
    /// The headroom it claimed, bytes.
    pub promised: Option<u64>,
    /// The query of the configuration it led to ([`crate::answers::key_of`], encoded): the
    /// verdict speaks of it only while the page shows that configuration.
    pub query: String,
}

/// The store of the page (set up by [`Store::provide`]).
pub fn use_store() -> Store {
    expect_context::<Store>()
}

impl Store {
    /// The page's state from its address: the configuration, what was wrong with the link, and
    /// the presentation keys.
    pub fn from_url() -> Store {
        Store::from_query(&dom::search())
    }

    /// The state a query string describes.
    pub fn from_query(query: &str) -> Store {
        let decoded = decode_query(query);
        let get = |k: &str| decoded.presentation.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        let url_theme = get("theme").and_then(|t| ThemeChoice::parse(&t));
        let theme = url_theme.or_else(|| dom::load(THEME_STORAGE).and_then(|t| ThemeChoice::parse(&t))).unwrap_or(ThemeChoice::Auto);
        let config = RwSignal::new(decoded.config);
        let (course, course_errors) = Settings::decode(decoded.presentation.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let mut notices = decoded.errors;
        notices.extend(course_errors);
        let compare = RwSignal::new(course.compare.as_deref().map(|q| {
            let d = decode_query(q);
            notices.extend(d.errors.into_iter().map(|e| ConfigError::for_key("compare", q, format!("{}: {}", e.key, e.reason))));
            d.config
        }));
        let quiz = course.quiz;
        let chart = get("chart").map_or_else(ChartView::default, |v| {
            ChartView::parse(&v).unwrap_or_else(|reason| {
                notices.push(ConfigError::for_key("chart", &v, reason));
                ChartView::default()
            })
        });
        Store {
            config,
            estimate: Memo::new(move |_| dom::timed("estimate", || config.with(|c| crate::estimator::analyse(c).map(|a| a.estimate)))),
            notices: RwSignal::new(notices),
            embed: get("embed").is_some_and(|v| v == "1" || v == "true"),
            view: RwSignal::new(get("view").unwrap_or_default()),
            theme: RwSignal::new(theme),
            theme_in_url: url_theme.is_some(),
            system_dark: RwSignal::new(dom::prefers_dark()),
            bench: RwSignal::new(get("bench").unwrap_or_default()),
            chart: RwSignal::new(chart),
            course: StoredValue::new(course),
            compare,
            compare_estimate: Memo::new(move |_| compare.with(|c| c.as_ref().map(|c| crate::estimator::analyse(c).map(|a| a.estimate)))),
            revealed: RwSignal::new(!quiz),
            applied: RwSignal::new(None),
            plan_asks: RwSignal::new(0),
            remote: None,
        }
    }

    /// This store, sending its changes to the page's through `remote` (the lazily loaded
    /// module's store).
    pub fn with_remote(self, remote: Remote) -> Store {
        Store { remote: Some(StoredValue::new_local(remote)), ..self }
    }

    /// Applies a change here, or sends it to the page's store (which then answers with its
    /// state, followed at once).
    pub fn send(&self, change: Change) -> Result<(), String> {
        match self.remote {
            Some(remote) => remote.with_value(|r| r.clone())(change),
            None => self.change(change),
        }
    }

    /// Applies a change to this store (the page's).
    pub fn change(&self, change: Change) -> Result<(), String> {
        match change {
            Change::Keys(pairs) => self.apply_here(&pairs),
            Change::Config(q) => {
                self.config.set(decode_query(&q).config);
                Ok(())
            }
            Change::State(q) => {
                self.set_state_here(&q);
                Ok(())
            }
            Change::Compare(q) => {
                self.compare.set(q.map(|q| decode_query(&q).config));
                Ok(())
            }
            Change::Swap => {
                if let Some(b) = self.compare.get_untracked() {
                    let a = self.config.get_untracked();
                    self.config.set(Config { unit: a.unit, ..b });
                    self.compare.set(Some(a));
                }
                Ok(())
            }
            Change::Reveal => {
                self.revealed.set(true);
                Ok(())
            }
        }
    }

    /// What the lazily loaded module's panels read of this store (tracked).
    pub fn mirror(&self) -> Mirror {
        Mirror {
            config: self.config.with(encode_query),
            compare: self.compare.with(|b| b.as_ref().map(compare_query)),
            look: self.look(),
            revealed: self.revealed.get(),
            bench: self.bench.get(),
            plan_asks: self.plan_asks.get(),
        }
    }

    /// Takes the page's state into this store (the lazily loaded module's): what differs is set.
    pub fn follow(&self, m: &Mirror) {
        let cfg = decode_query(&m.config).config;
        if self.config.with_untracked(|c| *c != cfg) {
            self.config.set(cfg);
        }
        let b = m.compare.as_deref().map(|q| decode_query(q).config);
        if self.compare.with_untracked(|c| *c != b) {
            self.compare.set(b);
        }
        let theme = match m.look {
            Look::Light => ThemeChoice::Light,
            Look::Dark => ThemeChoice::Dark,
            Look::Projector => ThemeChoice::Projector,
        };
        if self.theme.get_untracked() != theme {
            self.theme.set(theme);
        }
        if self.revealed.get_untracked() != m.revealed {
            self.revealed.set(m.revealed);
        }
        if self.bench.with_untracked(|b| *b != m.bench) {
            self.bench.set(m.bench.clone());
        }
        if self.plan_asks.get_untracked() != m.plan_asks {
            self.plan_asks.set(m.plan_asks);
        }
    }

    /// Makes this the page's store and starts what keeps it in step with the outside world:
    /// the address, the history, the theme on `<html>` and the system's colour scheme.
    pub fn provide(self) {
        provide_context(self);
        sync_url(self);
        sync_theme(self);
    }

    /// The display unit.
    pub fn unit(&self) -> Unit {
        self.config.with(|c| c.unit)
    }

    /// The theme resolved against the system's.
    pub fn look(&self) -> Look {
        match self.theme.get() {
            ThemeChoice::Light => Look::Light,
            ThemeChoice::Dark => Look::Dark,
            ThemeChoice::Projector => Look::Projector,
            ThemeChoice::Auto if self.system_dark.get() => Look::Dark,
            ThemeChoice::Auto => Look::Light,
        }
    }

    /// The model of the configuration.
    pub fn model(&self) -> ModelChoice {
        self.config.with(|c| if c.model == "custom" { ModelChoice::Custom(c.display_name()) } else { ModelChoice::Preset(c.model.clone()) })
    }

    /// The GPU of the configuration.
    pub fn gpu(&self) -> GpuChoice {
        self.config.with(gpu_of)
    }

    /// Sets one key of the configuration from its text (as a link would), or says why not.
    pub fn set_key(&self, key: &'static str, value: &str) -> Result<(), String> {
        self.apply(&[(key, value.to_string())])
    }

    /// Sets several keys at once (a one-click answer), or says what was wrong with the first
    /// that could not be used (then nothing changes).
    pub fn apply(&self, pairs: &[(&'static str, String)]) -> Result<(), String> {
        self.send(Change::Keys(pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()))
    }

    fn apply_here(&self, pairs: &[(String, String)]) -> Result<(), String> {
        if let Some((k, _)) = pairs.iter().find(|(k, _)| self.locked(k)) {
            return Err(format!("{k}: locked by the course page"));
        }
        let mut c = self.config.get_untracked();
        if let Some(e) = config::apply_pairs(&mut c, pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()).into_iter().next() {
            return Err(format!("{}: {}", e.key, e.reason));
        }
        if let Err(e) = crate::estimator::validate(&c) {
            return Err(e.to_string());
        }
        dom::mark("trainmem:input");
        self.config.set(c);
        Ok(())
    }

    pub fn set_model(&self, m: &ModelChoice) -> Result<(), String> {
        match m {
            ModelChoice::Preset(id) => self.set_key("model", id),
            ModelChoice::Custom(_) => self.set_key("model", "custom"),
        }
    }

    pub fn set_gpu(&self, g: GpuChoice) -> Result<(), String> {
        match g {
            GpuChoice::Catalog(g) => self.set_key("gpu", g.id),
            GpuChoice::Custom(gib) => self.apply(&[("gpu", "custom".into()), ("gpu_gib", gib.to_string())]),
        }
    }

    pub fn set_unit(&self, u: Unit) {
        self.config.update(|c| c.unit = u);
    }

    pub fn set_theme(&self, t: ThemeChoice) {
        self.theme.set(t);
        dom::store(THEME_STORAGE, t.as_str());
    }

    /// The sequence chart's log memory axis on or off (`chart=`).
    pub fn set_chart_log(&self, on: bool) {
        self.chart.update(|c| c.log_y = on);
    }

    /// The sequence chart's recipe comparison on or off (`chart=`).
    pub fn set_chart_recipes(&self, on: bool) {
        self.chart.update(|c| c.recipes = on);
    }

    /// Whether `lock=` makes a configuration key read-only.
    pub fn locked(&self, key: &str) -> bool {
        self.course.with_value(|s| s.locked(key))
    }

    /// Replaces the whole state from a query string (a host page's `setState`, an exercise's
    /// configuration): the configuration, and `compare=` and `theme=` if it has them. Locks
    /// bind the learner, not the course page. Returns what could not be used.
    pub fn set_state(&self, query: &str) -> Vec<ConfigError> {
        if self.remote.is_some() {
            let _ = self.send(Change::State(query.to_string()));
            return decode_query(query).errors;
        }
        self.set_state_here(query)
    }

    fn set_state_here(&self, query: &str) -> Vec<ConfigError> {
        let d = decode_query(query);
        let get = |k: &str| d.presentation.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        if let Some(t) = get("theme").and_then(|t| ThemeChoice::parse(&t)) {
            self.theme.set(t);
        }
        if let Some(q) = get("compare") {
            self.compare.set((!q.is_empty()).then(|| decode_query(&q).config));
        }
        self.config.set(d.config);
        d.errors
    }

    /// Sets (or clears) the configuration compared with.
    pub fn set_compare(&self, b: Option<Config>) {
        let _ = self.send(Change::Compare(b.as_ref().map(compare_query)));
    }

    /// "Duplicate as B": the current configuration becomes B, to compare edits of A with.
    pub fn duplicate_as_b(&self) {
        self.set_compare(Some(self.config.get_untracked()));
    }

    /// Swaps A and B (the display unit stays A's).
    pub fn swap_compare(&self) {
        let _ = self.send(Change::Swap);
    }

    /// Shows the figures a quiz hid (after a guess).
    pub fn reveal(&self) {
        let _ = self.send(Change::Reveal);
    }

    /// Applies a change from the answers panel and remembers what it promised (see
    /// [`Store::applied`]).
    pub fn apply_promised(&self, label: String, promised: Option<u64>, pairs: &[(&'static str, String)]) -> Result<(), String> {
        self.apply(pairs)?;
        let query = self.config.with_untracked(|c| encode_query(&crate::answers::key_of(c)));
        self.applied.set(Some(Applied { label, promised, query }));
        Ok(())
    }

    /// Replaces the model with an imported config.json.
    pub fn import(&self, imported: &Imported) {
        let mut c = self.config.get_untracked();
        config::apply_import(&mut c, imported);
        let _ = self.send(Change::Config(encode_query(&c)));
    }

    /// The address of the current state, for "copy link".
    pub fn share_url(&self) -> String {
        let q = self.config.with(encode_query);
        if q.is_empty() {
            dom::base_url()
        } else {
            format!("{}?{q}", dom::base_url())
        }
    }

    /// The whole query: the configuration's keys, then the page's own (`embed`, `view`,
    /// `theme`, `bench`).
    fn query(&self, cfg: &Config) -> String {
        let mut parts = Vec::new();
        let q = encode_query(cfg);
        if !q.is_empty() {
            parts.push(q);
        }
        if self.embed {
            parts.push("embed=1".to_string());
        }
        self.view.with(|v| (!v.is_empty()).then(|| parts.push(format!("view={}", config::percent_encode(v)))));
        if self.theme_in_url {
            parts.push(format!("theme={}", self.theme.get().as_str()));
        }
        self.bench.with(|b| (!b.is_empty()).then(|| parts.push(format!("bench={}", config::percent_encode(b)))));
        if let Some(v) = self.chart.with(ChartView::encode) {
            parts.push(format!("chart={v}"));
        }
        // Course settings stay in the address (the page's own keys and `compare` are above and
        // below).
        self.course.with_value(|s| {
            for (k, v) in s.encode() {
                if !matches!(k, "embed" | "view" | "theme" | "compare") {
                    parts.push(format!("{k}={}", config::percent_encode(&v)));
                }
            }
        });
        self.compare.with(|b| b.as_ref().map(|b| parts.push(format!("compare={}", config::percent_encode(&compare_query(b))))));
        parts.join("&")
    }
}

/// The GPU of a configuration.
pub fn gpu_of(c: &Config) -> GpuChoice {
    match gpu::gpu(&c.gpu) {
        Some(g) if c.gpu != "custom" => GpuChoice::Catalog(g),
        _ => GpuChoice::Custom(c.gpu_gib),
    }
}

/// The query of a compared configuration, never empty (an empty `compare=` means none).
pub fn compare_query(b: &Config) -> String {
    let q = encode_query(b);
    if q.is_empty() {
        format!("model={}", b.model)
    } else {
        q
    }
}

const THEME_STORAGE: &str = "trainmem-theme";
/// An edit older than this starts a new history entry.
const SETTLED_MS: f64 = 1000.0;
/// How long the address waits after an edit before it is written: of quick successive edits
/// (typing a number, holding an arrow key) only the last is written. `replaceState` costs
/// ~1.6 ms of the page's main thread per call (Chromium, this page; a CPU profile of 60 edits),
/// the views come first, and Chromium throttles a page that calls it hundreds of times in a
/// few seconds.
const URL_WRITE_MS: u64 = 250;

/// Keeps the address bar in step with the store, and the store with back and forward. The
/// address is written [`URL_WRITE_MS`] after the last of a run of edits, and at once when the
/// page is hidden (another tab, a closed window: the session keeps the last edit); a new history
/// entry, once asked for, is kept for it. An address that already says the configuration
/// (after back or forward, say) is left alone.
fn sync_url(store: Store) {
    let last_edit = StoredValue::new(0.0f64);
    let push_due = StoredValue::new(false);
    // The query waiting to be written, if any.
    let pending = StoredValue::new(None::<String>);
    let write = move || {
        let Some(target) = pending.try_update_value(Option::take).flatten() else { return };
        let push = push_due.try_update_value(std::mem::take).unwrap_or(false);
        if dom::search().trim_start_matches('?') == target {
            return;
        }
        if push {
            dom::push_query(&target);
        } else {
            dom::replace_query(&target);
        }
    };
    Effect::new(move |prev: Option<String>| {
        let q = store.config.with(|c| store.query(c));
        if prev.as_deref() != Some(q.as_str()) {
            let now = dom::now_ms();
            if prev.is_some() && now - last_edit.get_value() > SETTLED_MS {
                push_due.set_value(true);
            }
            last_edit.set_value(now);
            pending.set_value(Some(q.clone()));
            let target = q.clone();
            set_timeout(
                move || {
                    // A later edit has its own timer: only the last of a run writes.
                    if pending.try_with_value(|p| p.as_deref() == Some(target.as_str())).unwrap_or(false) {
                        write();
                    }
                },
                std::time::Duration::from_millis(URL_WRITE_MS),
            );
        }
        q
    });
    let _ = window_event_listener(leptos::ev::pagehide, move |_| write());
    let _ = window_event_listener(leptos::ev::visibilitychange, move |_| write());
    let _ = window_event_listener(leptos::ev::popstate, move |_| {
        pending.set_value(None);
        let d = decode_query(&dom::search());
        store.config.set(d.config);
        store.notices.set(d.errors);
    });
}

/// Puts the chosen theme on `<html data-theme>` (the stylesheet's switch) and follows the
/// system's colour scheme for `auto`.
fn sync_theme(store: Store) {
    Effect::new(move |_| dom::set_root_attribute("data-theme", store.theme.get().as_str()));
    dom::on_color_scheme_change(move |dark| store.system_dark.set(dark));
}
