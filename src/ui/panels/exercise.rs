//! Exercises: the built-in set ([`crate::course::exercises::builtin`]), a link's own question
//! (`ask=`, `tol=`, `hint=`, `question=`) and predict-then-reveal (`quiz=1`: the page's figures
//! stay hidden until the learner has guessed). A guess is checked against the estimator's own
//! numbers within the tolerance, then the answer, the error and the rows behind it — each with
//! its formula substituted — are shown, and an `answered` message tells the embedding page.
//!
//! "Make this an exercise" turns the current configuration and a question into a link; nothing
//! is stored anywhere.
//!
//! The panel lives in the lazily loaded module ([`crate::ui::lazy`]): the page shows its heading
//! and the button that opens it ([`Shell`]), or opens it at once where the link asks for an
//! exercise (`quiz=`, `ask=`, `step=`), lists it (`sections=`) or is an embed's.

use crate::config::{encode_query, Config};
use crate::course::exercises::{answer, builtin, category_name, check, example_guess, Answer, Field, Target};
use crate::course::panel::Panel;
use crate::course::settings::{CustomExercise, Settings, DEFAULT_TOLERANCE_PCT};
use crate::estimator::expr::group_digits;
use crate::estimator::ledger::{Category, Row};
use crate::estimator::units::{format_bytes, format_count};
use crate::estimator::{flatten, Estimate};
use crate::ui::dom;
use crate::ui::html::esc;
use crate::ui::lazy::{use_more, Lazy, Slot};
use crate::ui::state::{compare_query, use_store, Store};
use leptos::prelude::*;
use wasm_bindgen::{JsCast, JsValue};

/// One question the panel can ask.
#[derive(Clone, Debug, PartialEq)]
struct Task {
    /// `answered` messages name it: a built-in id, `custom` (ask=) or `quiz`.
    id: &'static str,
    title: String,
    question: String,
    target: Target,
    tolerance_pct: f64,
    hint: String,
    explanation: String,
    /// A built-in exercise's own configuration (and B); otherwise the page's.
    query: Option<(&'static str, Option<&'static str>)>,
}

fn tasks(s: &Settings) -> Vec<Task> {
    let mut out = Vec::new();
    if s.exercise.is_some() || s.quiz {
        let e = s.exercise.clone().unwrap_or(CustomExercise {
            target: Target::Memory(Field::Peak),
            tolerance_pct: DEFAULT_TOLERANCE_PCT,
            hint: String::new(),
            question: String::new(),
        });
        let question = if e.question.is_empty() { format!("Predict {} for this configuration.", describe(&e.target)) } else { e.question };
        out.push(Task {
            id: if s.exercise.is_some() { "custom" } else { "quiz" },
            title: "Your prediction".into(),
            question,
            target: e.target,
            tolerance_pct: e.tolerance_pct,
            hint: e.hint,
            explanation: String::new(),
            query: None,
        });
    }
    for ex in builtin() {
        out.push(Task {
            id: ex.id,
            title: ex.title.into(),
            question: ex.question.into(),
            target: ex.target,
            tolerance_pct: ex.tolerance_pct,
            hint: ex.hint.into(),
            explanation: ex.explanation.into(),
            query: Some((ex.query, ex.compare)),
        });
    }
    out
}

/// What a target asks for, in words.
fn describe(t: &Target) -> String {
    match t {
        Target::Rows(r) => format!("the bytes of {}", r.join(" + ")),
        Target::Memory(Field::ParameterCount) => "the number of parameters".into(),
        Target::Memory(f) => format!("the {} memory per GPU (bytes)", f.name().replace('_', " ")),
        Target::Share { part, whole } => format!("{} as a percentage of {}", part.join(" + "), whole.join(" + ")),
        Target::PerParameter(r) => format!("the bytes per parameter of {}", r.join(" + ")),
        Target::PerLayer(f) => format!("the {} bytes one more layer adds", f.name().replace('_', " ")),
        Target::Dominant => "the category that takes the most memory".into(),
        Target::Difference(r) => format!("how many bytes of {} change from A to B", r.join(" + ")),
    }
}

fn answer_text(a: &Answer, cfg: &Config) -> String {
    match a {
        Answer::Bytes(b) => format!("{} ({} B)", format_bytes(*b, cfg.unit), group_digits(*b)),
        Answer::Count(n) => format!("{} ({})", format_count(*n as u64), group_digits(*n)),
        Answer::Percent(p) => format!("{p:.1} %"),
        Answer::BytesPerParameter(p) => format!("{p:.2} bytes per parameter"),
        Answer::Category(c) => c.label().to_string(),
    }
}

fn answer_raw(a: &Answer) -> String {
    match a {
        Answer::Bytes(b) | Answer::Count(b) => b.to_string(),
        Answer::Percent(p) | Answer::BytesPerParameter(p) => format!("{p}"),
        Answer::Category(c) => category_name(*c).to_string(),
    }
}

/// The rows a reveal shows: the target's (a category name stands for its top-level rows), or
/// the top-level ledger when the target names none.
fn reveal_rows<'a>(e: &'a Estimate, target: &Target) -> Vec<&'a Row> {
    let ids = target.rows();
    if ids.is_empty() {
        return e.components.iter().collect();
    }
    let all = flatten(&e.components);
    let mut out = Vec::new();
    for id in &ids {
        match all.iter().find(|r| r.id.as_str() == id.as_str()) {
            Some(r) => out.push(*r),
            None => out.extend(e.components.iter().filter(|r| category_name(r.category) == id.as_str())),
        }
    }
    out
}

fn rows_html(e: &Estimate, target: &Target, cfg: &Config, title: &str) -> String {
    let mut s = format!("<h3>{}</h3><ul class=\"reveal-rows\" data-testid=\"ex-rows\">", esc(title));
    for r in reveal_rows(e, target) {
        s.push_str(&format!(
            "<li data-row=\"{}\"><strong>{}</strong>: {}<div class=\"math\" tabindex=\"0\"><math display=\"block\">{}</math></div><div class=\"math\" tabindex=\"0\"><math display=\"block\"><mrow>{}<mo>=</mo><mn>{}</mn><mtext>&#160;B</mtext></mrow></math></div></li>",
            esc(r.id.as_str()),
            esc(&r.label),
            esc(&format_bytes(r.bytes, cfg.unit)),
            r.expr.mathml(false),
            r.expr.mathml(true),
            group_digits(r.bytes)
        ));
    }
    s.push_str("</ul>");
    s
}

/// Checks a guess and writes the reveal; posts `answered`.
fn run_check(store: Store, task: &Task, guess: &str) -> String {
    let (cfg, cmp) = task_configs(store, task, store.unit());
    let a = match answer(&task.target, &cfg, cmp.as_ref()) {
        Ok(a) => a,
        Err(e) => return format!("<p class=\"bad\">{}</p>", esc(&e.to_string())),
    };
    let Some(c) = check(&a, guess, task.tolerance_pct) else {
        return format!(
            "<p class=\"bad\" data-testid=\"ex-unreadable\">Enter a number, with its unit if it has one ({}; GB, GiB, 1.5e9 and % all work).</p>",
            esc(&example_guess(&a, cfg.unit))
        );
    };
    store.reveal();
    dom::post_to_parent(
        "answered",
        &[
            ("exercise", task.id.into()),
            ("target", task.target.spec().into()),
            ("guess", guess.into()),
            ("correct", c.correct.into()),
            ("error_pct", c.error_pct.into()),
            ("answer", answer_raw(&a).into()),
            ("state", JsValue::from(encode_query(&cfg))),
        ],
    );
    let verdict = if c.correct { "Right" } else { "Not quite" };
    let error = if matches!(a, Answer::Category(_)) {
        String::new()
    } else {
        format!(" Your error: {:.1} % (within {} % counts as right).", c.error_pct, task.tolerance_pct)
    };
    let mut s = format!(
        "<p class=\"ex-verdict {}\" data-testid=\"ex-verdict\" data-correct=\"{}\"><strong>{verdict}.</strong> The calculator's answer: <span data-testid=\"ex-answer\" data-answer=\"{}\">{}</span>.{error}</p>",
        if c.correct { "good" } else { "bad" },
        c.correct,
        esc(&answer_raw(&a)),
        esc(&answer_text(&a, &cfg))
    );
    if !task.explanation.is_empty() {
        s.push_str(&format!("<p>{}</p>", esc(&task.explanation)));
    }
    if let Ok(e) = crate::estimator::analyse(&cfg).and_then(|a| a.explain()) {
        s.push_str(&rows_html(&e, &task.target, &cfg, if cmp.is_some() { "The rows behind it (A)" } else { "The rows behind it" }));
        if let Some(Ok(b)) = cmp.as_ref().map(|c| crate::estimator::analyse(c).and_then(|a| a.explain())) {
            s.push_str(&rows_html(&b, &task.target, &cfg, "The same rows in B"));
        }
    }
    s
}

/// The configuration (and B) a task is asked about, in the page's unit.
fn task_configs(store: Store, task: &Task, unit: crate::config::Unit) -> (Config, Option<Config>) {
    let (cfg, cmp) = match task.query {
        Some((q, c)) => (crate::config::decode_query(q).config, c.map(|c| crate::config::decode_query(c).config)),
        None => (store.config.get_untracked(), store.compare.get_untracked()),
    };
    (Config { unit, ..cfg }, cmp)
}

/// How to write a guess for `task`: an example in the answer's kind and the page's unit, far
/// from the answer ([`example_guess`]); never the answer itself.
fn example_for(store: Store, task: &Task, unit: crate::config::Unit) -> String {
    let (cfg, cmp) = task_configs(store, task, unit);
    match answer(&task.target, &cfg, cmp.as_ref()) {
        Ok(a) => example_guess(&a, unit),
        Err(_) => "a number".into(),
    }
}

/// The question, its hint and the guess control, as HTML (rebuilt when the exercise or the
/// unit changes). `example` shows how to write a guess ([`example_for`]).
fn ask_html(task: &Task, example: &str) -> String {
    let mut s = format!("<p class=\"question\" data-testid=\"ex-question\">{}</p>", esc(&task.question));
    if !task.hint.is_empty() {
        s.push_str(&format!("<details class=\"hint-box\"><summary>Hint</summary><p>{}</p></details>", esc(&task.hint)));
    }
    if matches!(task.target, Target::Dominant) {
        s.push_str("<label for=\"ex-guess\">Your prediction (a category)</label><div class=\"row\"><select id=\"ex-guess\" data-testid=\"ex-guess\"><option value=\"\">Choose…</option>");
        for c in Category::ALL {
            s.push_str(&format!("<option value=\"{}\">{}</option>", category_name(c), c.label()));
        }
        s.push_str("</select>");
    } else {
        s.push_str(&format!(
            "<label for=\"ex-guess\">Your prediction <span class=\"example\" data-testid=\"ex-example\">({})</span></label><div class=\"row\">\
             <input id=\"ex-guess\" data-testid=\"ex-guess\" type=\"text\" inputmode=\"decimal\" autocomplete=\"off\">",
            esc(example)
        ));
    }
    s.push_str("<button type=\"submit\" class=\"primary\" data-testid=\"ex-check\">Check</button></div>");
    if task.query.is_some() {
        s.push_str("<p><button type=\"button\" data-testid=\"ex-open\">Show this configuration in the calculator</button></p>");
    }
    s
}

/// The value of a form control found by `selector` under `root`.
fn control_value(root: &web_sys::Element, selector: &str) -> Option<String> {
    let el = root.query_selector(selector).ok().flatten()?;
    if let Some(i) = el.dyn_ref::<web_sys::HtmlInputElement>() {
        return Some(if i.type_() == "checkbox" { i.checked().to_string() } else { i.value() });
    }
    el.dyn_ref::<web_sys::HtmlSelectElement>().map(|s| s.value())
}

fn target_element(ev: &web_sys::Event) -> Option<web_sys::Element> {
    ev.target().and_then(|t| t.dyn_into::<web_sys::Element>().ok())
}

/// The page's side: the panel's heading and the button that opens the exercises (fetching the
/// lazily loaded module), or the exercises at once where the link asks for them.
#[component]
pub fn Shell() -> impl IntoView {
    let store = use_store();
    let more = use_more();
    let (asked, quiz) = store.course.with_value(|s| {
        let teaching = s.quiz || s.exercise.is_some() || s.step.is_some();
        (teaching || store.embed || s.sections.contains(&Panel::Exercises), s.quiz || s.exercise.is_some())
    });
    let loading = move || more.requested(Lazy::Exercises);
    view! {
        <Slot panel=Lazy::Exercises open=asked>
            <section class="exercises" data-panel="exercises" aria-labelledby="ex-h">
                <h2 id="ex-h">{if quiz { "Predict, then reveal" } else { "Exercises" }}</h2>
                {(!asked).then(|| view! {
                    <p class="hint">"Predict a figure of a worked configuration, check it against the estimator, and see the rows and formulas behind the answer — or make this configuration an exercise of your own."</p>
                    <button type="button" class="primary" data-testid="exercises-open" aria-busy=move || loading().to_string() on:click=move |_| more.request(Lazy::Exercises)>
                        {move || if loading() { "Loading the exercises…" } else { "Open the exercises" }}
                    </button>
                })}
            </section>
        </Slot>
    }
}

/// The exercises panel (in the lazily loaded module). Its controls are HTML text with one handler per event kind (as the
/// form's fields are): a few signals, not a tree of reactive nodes.
#[component]
pub fn Exercises() -> impl IntoView {
    let store = use_store();
    let (all, step, quiz) = store.course.with_value(|s| (tasks(s), s.step, s.quiz || s.exercise.is_some()));
    let first = step.and_then(|id| all.iter().position(|x| x.id == id)).unwrap_or(0);
    let picker = (!quiz).then(|| {
        let mut s = String::from("<label for=\"ex-pick\">Exercise</label><select id=\"ex-pick\" data-testid=\"ex-pick\">");
        for (i, x) in all.iter().enumerate() {
            s.push_str(&format!("<option value=\"{i}\"{}>{}</option>", if i == first { " selected" } else { "" }, esc(&x.title)));
        }
        s.push_str("</select>");
        s
    });
    let all = StoredValue::new(all);
    let chosen = RwSignal::new(first);
    let result = RwSignal::new(String::new());
    let task = move || all.with_value(|t| t[chosen.get_untracked().min(t.len() - 1)].clone());
    let on_change = move |ev: leptos::ev::Event| {
        if let Some(el) = target_element(&ev).filter(|e| e.id() == "ex-pick") {
            if let Some(v) = el.dyn_ref::<web_sys::HtmlSelectElement>().map(|s| s.value()) {
                chosen.set(v.parse().unwrap_or(0));
                result.set(String::new());
            }
        }
    };
    let on_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let guess = target_element(&ev).and_then(|f| control_value(&f, "#ex-guess")).unwrap_or_default();
        result.set(run_check(store, &task(), &guess));
    };
    let on_click = move |ev: leptos::ev::MouseEvent| {
        if target_element(&ev).and_then(|e| e.get_attribute("data-testid")).as_deref() != Some("ex-open") {
            return;
        }
        if let Some((q, c)) = task().query {
            let state = match c {
                Some(c) => format!("{q}&compare={}", crate::config::percent_encode(c)),
                None => q.to_string(),
            };
            store.set_state(&state);
            if c.is_none() {
                store.set_compare(None);
            }
        }
    };
    let unit = Memo::new(move |_| store.config.with(|c| c.unit));
    let ask = move || {
        let unit = unit.get();
        all.with_value(|t| {
            let task = &t[chosen.get().min(t.len() - 1)];
            ask_html(task, &example_for(store, task, unit))
        })
    };
    view! {
        <section class="exercises" data-panel="exercises" data-testid="exercises" aria-labelledby="ex-h" on:change=on_change on:click=on_click>
            <h2 id="ex-h">{if quiz { "Predict, then reveal" } else { "Exercises" }}</h2>
            {picker.map(|p| view! { <div class="field" inner_html=p></div> })}
            <form class="guess" on:submit=on_submit inner_html=ask></form>
            <div class="ex-result" role="status" aria-live="polite" data-testid="ex-result" inner_html=move || result.get()></div>
            {(!store.embed && !quiz).then(|| view! { <Author/> })}
        </section>
    }
}

/// The fields of "make this an exercise", as HTML (the target list is filled separately).
const AUTHOR_FIELDS: &str = "<div class=\"field\"><label for=\"ask-tol\">Tolerance (%)</label><input id=\"ask-tol\" data-testid=\"ask-tol\" type=\"text\" inputmode=\"decimal\" value=\"5\"></div>\
<div class=\"field\"><label for=\"ask-question\">Question</label><input id=\"ask-question\" data-testid=\"ask-question\" type=\"text\"></div>\
<div class=\"field\"><label for=\"ask-hint\">Hint</label><input id=\"ask-hint\" data-testid=\"ask-hint\" type=\"text\"></div>\
<div class=\"field check\"><label for=\"ask-embed\">For an iframe (embed=1)</label><input id=\"ask-embed\" type=\"checkbox\" checked></div>";

/// What the author has typed: target, tolerance, question, hint, embed.
#[derive(Clone, Debug, PartialEq)]
struct Draft {
    target: String,
    tol: String,
    question: String,
    hint: String,
    embed: bool,
}

/// "Make this an exercise": the current configuration and a question, as a link.
#[component]
fn Author() -> impl IntoView {
    let store = use_store();
    let draft = RwSignal::new(Draft {
        target: "memory:peak".into(),
        tol: DEFAULT_TOLERANCE_PCT.to_string(),
        question: String::new(),
        hint: String::new(),
        embed: true,
    });
    let fields =
        ["peak", "total", "static", "parameters", "gradients", "optimizer_states", "activations", "after_forward", "parameter_count"];
    let targets = move || {
        let current = draft.with_untracked(|d| d.target.clone());
        let option = |value: String, label: String| {
            format!("<option value=\"{}\"{}>{}</option>", esc(&value), if value == current { " selected" } else { "" }, esc(&label))
        };
        let mut s: String = fields.iter().map(|f| option(format!("memory:{f}"), format!("whole step: {}", f.replace('_', " ")))).collect();
        s.push_str(&option("dominant".into(), "the largest category".into()));
        store.estimate.with(|e| {
            if let Ok(e) = e {
                for r in flatten(&e.components) {
                    s.push_str(&option(format!("row:{}", r.id), format!("row: {}", r.label)));
                }
            }
        });
        s
    };
    let on_edit = move |ev: leptos::ev::Event| {
        let Some(root) = target_element(&ev).and_then(|e| e.closest("details").ok().flatten()) else { return };
        let v = |sel: &str| control_value(&root, sel).unwrap_or_default();
        draft.set(Draft {
            target: v("#ask-target"),
            tol: v("#ask-tol"),
            question: v("#ask-question"),
            hint: v("#ask-hint"),
            embed: v("#ask-embed") == "true",
        });
    };
    let url = move || {
        let d = draft.get();
        let Ok(t) = Target::parse(&d.target) else { return String::new() };
        let tolerance_pct =
            d.tol.trim().parse().ok().filter(|v: &f64| v.is_finite() && (0.0..=100.0).contains(v)).unwrap_or(DEFAULT_TOLERANCE_PCT);
        let settings = Settings {
            embed: d.embed,
            quiz: true,
            exercise: Some(CustomExercise { target: t, tolerance_pct, hint: d.hint, question: d.question }),
            compare: store.compare.with(|b| b.as_ref().map(compare_query)),
            ..Settings::default()
        };
        let q = store.config.with(encode_query);
        let sep = if q.is_empty() { "" } else { "&" };
        format!("{}?{q}{sep}{}", dom::base_url(), settings.query())
    };
    let copied = RwSignal::new(false);
    let copy = move |_| {
        let text = url();
        leptos::task::spawn_local(async move { copied.set(dom::copy_text(&text).await) });
    };
    view! {
        <details class="author" data-testid="make-exercise" on:input=on_edit on:change=on_edit>
            <summary>"Make this an exercise"</summary>
            <p class="hint">"The current configuration and your question become a link (predict, then reveal). Nothing is stored anywhere."</p>
            <div class="field">
                <label for="ask-target">"What to predict"</label>
                <select id="ask-target" data-testid="ask-target" inner_html=targets></select>
            </div>
            <div inner_html=AUTHOR_FIELDS></div>
            <div class="field"><label for="ask-url">"Link"</label>
                <input id="ask-url" data-testid="exercise-url" type="text" readonly prop:value=url/></div>
            <button type="button" on:click=copy>{move || if copied.get() { "Copied ✓" } else { "Copy link" }}</button>
        </details>
    }
}
