//! "Verify on your GPU": the current configuration as a self-contained PyTorch script to
//! download ([`crate::verify::verify_script`], the same script `trainmem verify-script` writes),
//! and the JSON it writes pasted back, compared with a fresh estimate row by row
//! ([`crate::verify::compare`], what `trainmem compare` prints).
//!
//! The panel's body lives in the lazily loaded module ([`crate::ui::lazy`]), with the script's
//! template: the page holds the disclosure ([`Verify`]), and opening it loads the body
//! ([`Body`]).

use crate::estimator::units::format_bytes;
use crate::ui::dom;
use crate::ui::lazy::{use_more, Lazy, Slot};
use crate::ui::state::use_store;
use crate::verify::{self, compare};
use leptos::prelude::*;

/// Name of the downloaded script.
const SCRIPT_NAME: &str = "trainmem-verify.py";

/// The comparison as an HTML table (numbers in the page's unit, exact bytes in `data-bytes`).
fn table(c: &compare::Comparison, unit: crate::config::Unit) -> String {
    let cell = |b: Option<u128>| match b {
        Some(b) => format!("<td data-bytes=\"{b}\">{}</td>", format_bytes(b, unit)),
        None => "<td>n/a</td>".to_string(),
    };
    let mut s = format!(
        "<p data-testid=\"verify-verdict\">{}</p><table class=\"verify-table\" data-testid=\"verify-table\"><caption>{} on {} ({}), step {} compared</caption>\
         <thead><tr><th scope=\"col\">Field</th><th scope=\"col\">Measured</th><th scope=\"col\">trainmem</th><th scope=\"col\">Difference</th></tr></thead><tbody>",
        esc(&c.verdict),
        esc(&c.model),
        esc(&c.device),
        esc(&c.versions),
        c.steady_step
    );
    for r in &c.rows {
        let diff = match (r.difference_bytes, r.difference_pct) {
            (Some(b), Some(p)) => format!("{b:+} B ({p:+.2} %)"),
            _ => "not measured here".to_string(),
        };
        s.push_str(&format!(
            "<tr data-field=\"{}\"><th scope=\"row\">{}</th>{}{}<td>{}</td></tr>",
            r.field,
            esc(r.label),
            cell(r.measured),
            cell(r.predicted),
            esc(&diff)
        ));
    }
    s.push_str("</tbody></table>");
    for n in &c.notes {
        s.push_str(&format!("<p class=\"hint\">{}</p>", esc(n)));
    }
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The page's side: the disclosure; opening it loads its body.
#[component]
pub fn Verify() -> impl IntoView {
    let more = use_more();
    view! {
        <details class="verify" data-panel="verify" on:toggle=move |ev| { if event_target::<web_sys::HtmlDetailsElement>(&ev).open() { more.request(Lazy::Verify) } }>
            <summary>"Verify on your GPU"</summary>
            <Slot panel=Lazy::Verify open=false>
                <p class="hint" role="status">"Loading…"</p>
            </Slot>
        </details>
    }
}

/// The disclosure's body (in the lazily loaded module).
#[component]
pub fn Body() -> impl IntoView {
    let store = use_store();
    let text = RwSignal::new(String::new());
    let problem = RwSignal::new(String::new());
    let result = RwSignal::new(String::new());
    let download = move |_| {
        let script = store.config.with_untracked(verify::verify_script);
        match script {
            Ok(s) => {
                problem.set(String::new());
                dom::download(SCRIPT_NAME, "text/x-python", s.as_bytes());
            }
            Err(e) => problem.set(format!("The script cannot reproduce this configuration: {e}")),
        }
    };
    let run_compare = move |_| match compare::compare(&text.get_untracked()) {
        Ok(c) => {
            problem.set(String::new());
            result.set(table(&c, store.unit()));
        }
        Err(e) => {
            result.set(String::new());
            problem.set(format!("Cannot compare: {e}"));
        }
    };
    view! {
            <p class="hint">
                "A self-contained PyTorch script (torch + transformers, random weights, nothing downloaded) that loads the model with from_pretrained as you would, trains this configuration for three steps and prints what it measures — the loading's max allocated and max reserved, allocated after forward, the forward, backward and step peaks, the step's and the whole run's max_memory_reserved and nvidia-smi — beside trainmem's prediction. It also runs on a CPU (a dispatch-level tracker instead of torch.cuda). Paste the JSON it writes below to compare row by row."
            </p>
            <div class="row">
                <button type="button" data-testid="verify-download" on:click=download>"Download the script (" {SCRIPT_NAME} ")"</button>
            </div>
            <div class="field">
                <label for="verify-json">"The script's JSON"</label>
                <textarea id="verify-json" rows="4" spellcheck="false" data-testid="verify-json"
                    prop:value=move || text.get() on:input=move |ev| text.set(event_target_value(&ev))></textarea>
            </div>
            <div class="row">
                <button type="button" data-testid="verify-compare" on:click=run_compare>"Compare with trainmem"</button>
            </div>
            <p class="status error" role="status" data-testid="verify-problem">{move || problem.get()}</p>
            <div class="verify-result" aria-live="polite" inner_html=move || result.get()></div>
    }
}
