//! Course settings: what an instructor puts in an embed link to shape what students see — which
//! panels show and in what order (`sections=`), which are hidden (`hide=`), which configuration keys
//! are read-only (`lock=`), the theme (`theme=light|dark|projector`), a guided step to open
//! (`step=`), predict-then-reveal (`quiz=1`), an exercise of their own (`ask=`, `tol=`, `hint=`,
//! `question=`), a second configuration to compare with (`compare=`), and the origins allowed to
//! drive the frame (`allow_origin=`).
//!
//! Like every key of the link, these are decoded tolerantly: a bad value is reported, naming the
//! key, and falls back to its default without losing the rest (PhET's `screens=` and GeoGebra's
//! applet parameters behave the same way). `docs/embed.md` documents each one.

use super::exercises::{self, Target};
use super::panel::{list_names, Panel};
use crate::config::{percent_encode, ConfigError, KEYS};

/// The page's colour scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Theme {
    /// The system preference.
    #[default]
    Auto,
    Light,
    Dark,
    /// High contrast and large type, for a lecture hall's projector.
    Projector,
}

impl Theme {
    pub fn name(self) -> &'static str {
        match self {
            Theme::Auto => "auto",
            Theme::Light => "light",
            Theme::Dark => "dark",
            Theme::Projector => "projector",
        }
    }
    pub fn from_name(s: &str) -> Option<Theme> {
        [Theme::Auto, Theme::Light, Theme::Dark, Theme::Projector].into_iter().find(|t| t.name().eq_ignore_ascii_case(s.trim()))
    }
}

/// An exercise written by an instructor into the link: which figure to predict, how close is
/// right, a hint and the question's wording.
#[derive(Clone, Debug, PartialEq)]
pub struct CustomExercise {
    pub target: Target,
    /// Accepted relative error, percent.
    pub tolerance_pct: f64,
    pub hint: String,
    pub question: String,
}

/// The tolerance an exercise gets when the link names none: within 5 % counts as right.
pub const DEFAULT_TOLERANCE_PCT: f64 = 5.0;
/// What a bad `sections=` or `hide=` name is told.
const SECTION_NAMES: &str = "names no panel (verdict, inputs, model, training, cluster, overhead, architecture, import, answers, bar, ledger, verify, charts, seq, params, batch, gpus, timeline, textbook, bench, plan, exercises, compare, share, formulas)";
/// The longest free text (hint, question) a link may carry.
pub const MAX_TEXT: usize = 500;
/// The only language for now (`lang=` is reserved for translations).
pub const LANGUAGES: &[&str] = &["en"];

/// Everything a link says about presentation and teaching (the configuration aside).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Settings {
    /// `embed=1`: the compact layout for iframes.
    pub embed: bool,
    /// `view=`: the one panel an embed shows (kept for old links; `sections=` generalizes it).
    pub view: Option<String>,
    /// `sections=`: the panels to show, in this order (empty: the page's own layout).
    pub sections: Vec<Panel>,
    /// `hide=`: panels (and the share buttons, the formula view) to leave out.
    pub hide: Vec<Panel>,
    /// `lock=`: configuration keys shown read-only.
    pub lock: Vec<&'static str>,
    pub theme: Theme,
    /// `step=`: the built-in exercise to open.
    pub step: Option<&'static str>,
    /// `quiz=1`: predict, then reveal.
    pub quiz: bool,
    /// `ask=…` (+ `tol=`, `hint=`, `question=`): the instructor's own exercise.
    pub exercise: Option<CustomExercise>,
    /// `compare=`: a second configuration (a query string) shown beside this one.
    pub compare: Option<String>,
    /// `allow_origin=`: origins whose `setState`/`setTheme` messages the frame obeys, besides the
    /// parent's origin at load.
    pub allow_origin: Vec<String>,
    /// `lang=`: reserved; only English exists.
    pub lang: String,
}

/// The link keys [`Settings`] reads (the configuration codec passes them over).
pub const SETTINGS_KEYS: &[&str] = &[
    "embed",
    "view",
    "sections",
    "hide",
    "lock",
    "theme",
    "step",
    "quiz",
    "ask",
    "tol",
    "hint",
    "question",
    "compare",
    "allow_origin",
    "lang",
];

fn list(v: &str) -> impl Iterator<Item = &str> {
    v.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// A web origin as `postMessage` reports it: scheme, host and optional port, nothing else.
fn valid_origin(o: &str) -> bool {
    let Some((scheme, rest)) = o.split_once("://") else { return false };
    matches!(scheme, "https" | "http")
        && !rest.is_empty()
        && !rest.contains('/')
        && rest.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
}

impl Settings {
    /// Reads the settings from a link's presentation pairs; each bad value is reported and
    /// dropped, the rest kept.
    pub fn decode<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> (Settings, Vec<ConfigError>) {
        let mut s = Settings { lang: "en".into(), ..Settings::default() };
        let mut errors = Vec::new();
        let mut err = |k: &str, v: &str, why: &str| errors.push(ConfigError::for_key(k, v, why));
        let (mut ask, mut tol, mut hint, mut question) = (None::<(String, Target)>, None, String::new(), String::new());
        for (k, v) in pairs {
            match k {
                "embed" => s.embed = matches!(v, "1" | "true"),
                "view" => s.view = (!v.is_empty()).then(|| v.to_string()),
                "sections" | "hide" => {
                    let mut out = Vec::new();
                    for name in list(v) {
                        match Panel::parse_item(name) {
                            Some(ps) if k == "sections" && ps.iter().any(|p| !p.is_panel()) => {
                                err(k, name, "is not a panel (hide it instead)")
                            }
                            Some(ps) => {
                                for p in ps {
                                    if !out.contains(&p) {
                                        out.push(p);
                                    }
                                }
                            }
                            None => err(k, name, SECTION_NAMES),
                        }
                    }
                    if k == "sections" {
                        s.sections = out;
                    } else {
                        s.hide = out;
                    }
                }
                "lock" => {
                    s.lock.clear();
                    for name in list(v) {
                        match KEYS.iter().find(|key| key.name == name) {
                            Some(key) if !s.lock.contains(&key.name) => s.lock.push(key.name),
                            Some(_) => {}
                            None => err(k, name, "is not a configuration key"),
                        }
                    }
                }
                "theme" => match Theme::from_name(v) {
                    Some(t) => s.theme = t,
                    None => err(k, v, "must be light, dark, projector or auto"),
                },
                "step" => match exercises::builtin().into_iter().find(|e| e.id == v) {
                    Some(e) => s.step = Some(e.id),
                    None => err(k, v, "names no built-in exercise"),
                },
                "quiz" => s.quiz = matches!(v, "1" | "true"),
                "ask" => match Target::parse(v) {
                    Ok(t) => ask = Some((v.to_string(), t)),
                    Err(why) => err(k, v, &why),
                },
                "tol" => match v.trim().parse::<f64>() {
                    Ok(t) if t.is_finite() && (0.0..=100.0).contains(&t) => tol = Some(t),
                    _ => err(k, v, "must be a percentage between 0 and 100"),
                },
                "hint" => hint = v.chars().take(MAX_TEXT).collect(),
                "question" => question = v.chars().take(MAX_TEXT).collect(),
                "compare" => s.compare = (!v.is_empty()).then(|| v.chars().take(4000).collect()),
                "allow_origin" => {
                    s.allow_origin.clear();
                    for o in list(v) {
                        if valid_origin(o) {
                            s.allow_origin.push(o.to_string());
                        } else {
                            err(k, o, "is not an origin like https://canvas.example.edu");
                        }
                    }
                }
                "lang" => {
                    if LANGUAGES.contains(&v) {
                        s.lang = v.to_string();
                    } else {
                        err(k, v, "only English (en) is available for now");
                    }
                }
                _ => {}
            }
        }
        if let Some((_, target)) = ask {
            s.exercise = Some(CustomExercise { target, tolerance_pct: tol.unwrap_or(DEFAULT_TOLERANCE_PCT), hint, question });
        } else if tol.is_some() || !hint.is_empty() || !question.is_empty() {
            err("ask", "", "tol, hint and question need ask= (the figure to predict)");
        }
        (s, errors)
    }

    /// The settings as link pairs, in a fixed order, leaving out what is at its default.
    pub fn encode(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if self.embed {
            out.push(("embed", "1".to_string()));
        }
        if let Some(v) = &self.view {
            out.push(("view", v.clone()));
        }
        if !self.sections.is_empty() {
            out.push(("sections", list_names(&self.sections)));
        }
        if !self.hide.is_empty() {
            out.push(("hide", list_names(&self.hide)));
        }
        if !self.lock.is_empty() {
            out.push(("lock", self.lock.join(",")));
        }
        if self.theme != Theme::Auto {
            out.push(("theme", self.theme.name().to_string()));
        }
        if let Some(step) = self.step {
            out.push(("step", step.to_string()));
        }
        if self.quiz {
            out.push(("quiz", "1".to_string()));
        }
        if let Some(e) = &self.exercise {
            out.push(("ask", e.target.spec()));
            if e.tolerance_pct != DEFAULT_TOLERANCE_PCT {
                out.push(("tol", format!("{}", e.tolerance_pct)));
            }
            if !e.hint.is_empty() {
                out.push(("hint", e.hint.clone()));
            }
            if !e.question.is_empty() {
                out.push(("question", e.question.clone()));
            }
        }
        if let Some(c) = &self.compare {
            out.push(("compare", c.clone()));
        }
        if !self.allow_origin.is_empty() {
            out.push(("allow_origin", self.allow_origin.join(",")));
        }
        out
    }

    /// [`Settings::encode`] as a query-string fragment (`embed=1&hide=inputs`).
    pub fn query(&self) -> String {
        self.encode().into_iter().map(|(k, v)| format!("{k}={}", percent_encode(&v))).collect::<Vec<_>>().join("&")
    }

    /// Whether a panel shows: not hidden (itself or the panel it goes with), and listed when
    /// `sections=` lists panels.
    pub fn shows(&self, panel: Panel) -> bool {
        !self.hides(panel) && (self.sections.is_empty() || !panel.is_panel() || self.sections.contains(&panel))
    }

    /// Whether `hide=` leaves the panel out, itself or with the panel it goes with.
    pub fn hides(&self, panel: Panel) -> bool {
        self.hide.contains(&panel) || panel.goes_with().is_some_and(|p| self.hide.contains(&p))
    }

    /// Whether the configuration key is read-only for the learner.
    pub fn locked(&self, key: &str) -> bool {
        self.lock.contains(&key)
    }

    /// Whether a `setState`/`setTheme` message from `origin` may drive the frame: listed in
    /// `allow_origin=`, or the parent's own origin at load (`parent_origin`).
    pub fn accepts_origin(&self, origin: &str, parent_origin: Option<&str>) -> bool {
        parent_origin == Some(origin) || self.allow_origin.iter().any(|o| o == origin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(q: &str) -> (Settings, Vec<ConfigError>) {
        let pairs: Vec<(String, String)> =
            q.split('&').filter_map(|p| p.split_once('=')).map(|(k, v)| (k.to_string(), crate::config::percent_decode(v))).collect();
        Settings::decode(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    #[test]
    fn hide_lock_and_sections_are_read_in_order_and_deduplicated() {
        let (s, errors) = decode("sections=verdict,ledger,verdict&hide=inputs,formulas&lock=seq,model");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(s.sections, [Panel::Verdict, Panel::Ledger]);
        assert_eq!(s.hide, [Panel::Model, Panel::Training, Panel::Cluster, Panel::Overhead, Panel::Formulas]);
        assert_eq!(s.lock, ["seq", "model"]);
        assert!(s.shows(Panel::Ledger) && !s.shows(Panel::Charts) && !s.shows(Panel::Training));
        assert!(s.locked("seq") && !s.locked("batch"));
    }

    #[test]
    fn a_bad_value_is_named_and_dropped_while_the_rest_is_kept() {
        let (s, errors) = decode("theme=neon&hide=inputs,nonsense&lock=seqq,batch&tol=200&lang=fr");
        let keys: Vec<&str> = errors.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["theme", "hide", "lock", "tol", "lang"]);
        assert_eq!(s.theme, Theme::Auto);
        assert_eq!(s.hide, super::super::panel::INPUTS);
        assert_eq!(s.lock, ["batch"]);
        assert_eq!(s.lang, "en");
        // A hint with nothing to predict is reported under `ask`.
        let (s, errors) = decode("hint=think%20about%20Adam");
        assert!(s.exercise.is_none());
        assert_eq!(errors.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["ask"]);
    }

    #[test]
    fn the_formula_view_can_be_hidden_but_not_placed_as_a_panel() {
        let (s, errors) = decode("sections=ledger,formulas");
        assert_eq!(s.sections, [Panel::Ledger]);
        assert_eq!(errors.len(), 1);
    }

    #[test]
    fn settings_survive_a_round_trip_through_the_link() {
        let q = "embed=1&sections=verdict,ledger&hide=share&lock=seq&theme=projector&step=sixteen-psi&quiz=1&ask=row:optimizer_states&tol=10&hint=Adam%20keeps%20two%20moments&compare=attn%3Deager&allow_origin=https://canvas.example.edu";
        let (s, errors) = decode(q);
        assert!(errors.is_empty(), "{errors:?}");
        let (again, errors) = decode(&s.query());
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(again, s);
        assert_eq!(s.exercise.as_ref().map(|e| e.tolerance_pct), Some(10.0));
    }

    #[test]
    fn only_listed_origins_or_the_parent_drive_the_frame() {
        let (s, _) = decode("allow_origin=https://a.example,http://localhost:8000,javascript:alert(1)");
        assert_eq!(s.allow_origin, ["https://a.example", "http://localhost:8000"]);
        assert!(s.accepts_origin("https://a.example", None));
        assert!(s.accepts_origin("https://lms.example", Some("https://lms.example")));
        assert!(!s.accepts_origin("https://evil.example", Some("https://lms.example")));
    }
}
