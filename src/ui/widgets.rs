//! The form's fields: a labelled control for each configuration key, generated from the codec's
//! key table, so its label, accepted values and the URL key it writes are the same ones the CLI
//! documents: a select for enumerations, a checkbox for switches, a text box (accepting
//! `8k`-style suffixes) for numbers.
//!
//! The fields are HTML text written once ([`fields_html`]); [`Form`] holds them all, applies
//! what the visitor types through the store's setters (one delegated `input`/`change` handler;
//! a value the codec or the estimator rejects is named under its field and not applied), and
//! keeps every field showing the configuration (one effect: a field is written only when its
//! own key's value changed, and the fields that depend on another key are shown or hidden).
//! Seventy fields cost one handler and one effect, not seventy components.

use super::html::esc;
use super::state::{gpu_of, use_store, GpuChoice, Store};
use crate::config::{find_key, Config, Finetune, Key, Zero, KEYS};
use crate::estimator::gpu::{Vendor, GPUS};
use crate::words::{capacity_note, gpu_short, option_text};
use leptos::html::Form as FormElement;
use leptos::prelude::*;
use wasm_bindgen::JsCast;

/// The key's help text, capitalized, for a label; for a choice, only what comes before a colon
/// (after it the help lists the ids, which the options now say in words).
fn label_of(k: &Key) -> String {
    let help = if (k.choices)().len() > 2 { k.help.split(':').next().unwrap_or(k.help) } else { k.help };
    let mut c = help.chars();
    match c.next() {
        Some(f) => std::iter::once(f.to_ascii_uppercase()).chain(c).collect(),
        None => k.name.to_string(),
    }
}

/// The fields that show only when another key asks for them, each with that condition.
type ShownWhen = fn(&Config) -> bool;
const DEPENDENT: [(&str, ShownWhen); 15] = [
    ("lora_rank", |c| c.finetune != Finetune::Full),
    ("lora_targets", |c| c.finetune != Finetune::Full),
    ("lora_dropout", |c| c.finetune != Finetune::Full),
    ("lora_dtype", |c| c.finetune != Finetune::Full),
    ("shard_group", |c| c.zero == Zero::HybridShard),
    ("vpp", |c| c.pp > 1),
    ("gpu_gib", |c| c.gpu == "custom"),
    ("compile_regions", |c| c.compile),
    ("fp8_allgather", |c| c.fp8.torchao()),
    // FSDP2's root unit is followed under torchtune's distributed recipes (shown while set
    // elsewhere, so that its refusal names a field the page shows).
    ("fsdp_root_reshard", |c| {
        (c.framework == crate::config::Framework::Torchtune && c.gpus > 1 && c.zero == Zero::FullShard) || !c.fsdp_root_reshard
    }),
    ("fp8_recompute_weight", |c| c.fp8.torchao()),
    ("fp8_model_init", |c| c.fp8.te()),
    ("qlora_quant", |c| c.finetune == Finetune::Qlora),
    ("host_ram_gib", |c| c.act_offload.on() || c.act_offload_layers > 0 || c.offload != crate::config::Offload::None),
    // Megatron's block method picks among the layers full recomputation recomputes (shown while
    // set elsewhere, so that its refusal names a field the page shows).
    ("recompute_layers", |c| {
        (c.framework == crate::config::Framework::Megatron && c.recompute == crate::config::Recompute::Full) || c.recompute_layers > 0
    }),
];

/// Whether a key's field shows for `cfg`: every field but the [`DEPENDENT`] ones, which show
/// when their condition holds.
fn shown(name: &str, cfg: &Config) -> bool {
    DEPENDENT.iter().find(|(n, _)| *n == name).is_none_or(|(_, when)| when(cfg))
}

/// The fields of `names` as HTML, showing `cfg`.
pub fn fields_html(names: &[&str], cfg: &Config) -> String {
    // Course mode's `lock=`: such a field is shown read-only.
    let store = use_context::<Store>();
    let mut s = String::new();
    for name in names {
        let Some(k) = find_key(name) else { continue };
        let locked = store.is_some_and(|st| st.locked(name));
        let (dis, ro) = if locked { (" disabled", " readonly aria-readonly=\"true\"") } else { ("", "") };
        let value = (k.get)(cfg);
        let choices = (k.choices)();
        let is_bool = choices == ["false", "true"];
        let (control, below) = if *name == "gpu" {
            // The GPU: the catalog by maker and short name (no select cuts it off), or a custom
            // size; under it the card's marketed size beside what a process can use.
            let mut o = format!("<select id=\"in-gpu\" data-key=\"gpu\" aria-describedby=\"gpu-note\"{dis}>");
            for (maker, vendor) in [("NVIDIA", Vendor::Nvidia), ("AMD", Vendor::Amd)] {
                o.push_str(&format!("<optgroup label=\"{maker}\">"));
                for g in GPUS.iter().filter(|g| g.vendor == vendor) {
                    o.push_str(&format!(
                        "<option value=\"{}\"{}>{}</option>",
                        g.id,
                        if g.id == value { " selected" } else { "" },
                        esc(&gpu_short(g))
                    ));
                }
                o.push_str("</optgroup>");
            }
            o.push_str(&format!(
                "<option value=\"custom\"{}>Custom size…</option></select>",
                if value == "custom" { " selected" } else { "" }
            ));
            (o, format!("<small class=\"gpu-note\" id=\"gpu-note\" data-testid=\"gpu-note\">{}</small>", esc(&gpu_note(cfg))))
        } else if is_bool {
            (
                format!(
                    "<input id=\"in-{name}\" type=\"checkbox\" data-key=\"{name}\"{dis}{}>",
                    if value == "true" { " checked" } else { "" }
                ),
                String::new(),
            )
        } else if !choices.is_empty() {
            let options: String = choices
                .iter()
                .map(|c| {
                    format!("<option value=\"{c}\"{}>{}</option>", if *c == value { " selected" } else { "" }, esc(&option_text(name, c)))
                })
                .collect();
            (
                format!("<select id=\"in-{name}\" data-key=\"{name}\" aria-describedby=\"id-{name}\"{dis}>{options}</select>"),
                format!("<small class=\"choice-id\" id=\"id-{name}\" data-choice-id=\"{name}\">{}</small>", esc(&value)),
            )
        } else {
            (
                format!(
                    "<input id=\"in-{name}\" type=\"text\" inputmode=\"decimal\" autocomplete=\"off\" spellcheck=\"false\" data-key=\"{name}\" value=\"{}\" aria-invalid=\"false\" aria-describedby=\"err-{name}\"{ro}>",
                    esc(&value)
                ),
                String::new(),
            )
        };
        let wide = !is_bool && !choices.is_empty();
        s.push_str(&format!(
            "<div class=\"field{}{}\" data-field=\"{name}\"{}{}><div class=\"field-head\"><label for=\"in-{name}\">{}{}</label><code class=\"key\">{name}</code></div>{control}{below}<span class=\"field-error\" id=\"err-{name}\" role=\"status\"></span></div>",
            if is_bool { " check" } else { "" },
            if wide { " wide" } else { "" },
            if shown(name, cfg) { "" } else { " hidden" },
            if locked { " data-locked=\"true\"" } else { "" },
            esc(&label_of(k)),
            if locked { " <span class=\"locked\">(locked)</span>" } else { "" }
        ));
    }
    s
}

/// The line under the GPU field ([`capacity_note`]).
fn gpu_note(cfg: &Config) -> String {
    match gpu_of(cfg) {
        GpuChoice::Catalog(g) => capacity_note(Some(&g), 0.0, cfg.unit),
        GpuChoice::Custom(gib) => capacity_note(None, gib, cfg.unit),
    }
}

fn element(form: &web_sys::Element, selector: &str) -> Option<web_sys::Element> {
    form.query_selector(selector).ok().flatten()
}

/// Applies the edit an `input` or `change` event carries, if it comes from a field.
fn edit(store: Store, ev: &web_sys::Event) {
    let Some(target) = ev.target().and_then(|t| t.dyn_into::<web_sys::Element>().ok()) else { return };
    let Some(name) = target.get_attribute("data-key") else { return };
    let Some(k) = find_key(&name) else { return };
    let text_box = target.dyn_ref::<web_sys::HtmlInputElement>().filter(|i| i.type_() == "text");
    // Text boxes apply as they are typed in; selects and checkboxes when they change.
    if (ev.type_() == "input") != text_box.is_some() {
        return;
    }
    let value = if let Some(i) = target.dyn_ref::<web_sys::HtmlInputElement>() {
        if i.type_() == "checkbox" {
            i.checked().to_string()
        } else {
            i.value()
        }
    } else if let Some(s) = target.dyn_ref::<web_sys::HtmlSelectElement>() {
        s.value()
    } else {
        return;
    };
    let result = if k.name == "gpu" {
        let choice = match GPUS.iter().find(|g| g.id == value) {
            Some(g) => GpuChoice::Catalog(*g),
            None => GpuChoice::Custom(store.config.with_untracked(|c| c.gpu_gib)),
        };
        store.set_gpu(choice)
    } else {
        store.set_key(k.name, &value)
    };
    let error = result.err().map(|e| format!("{}: {e}", k.name));
    if let Some(form) = target.closest("form").ok().flatten() {
        if let Some(span) = element(&form, &format!("#err-{}", k.name)) {
            span.set_text_content(error.as_deref());
        }
    }
    if text_box.is_some() {
        let _ = target.set_attribute("aria-invalid", if error.is_some() { "true" } else { "false" });
    }
}

/// Makes every field of `form` show `cfg`: the values that changed since `shown_values`, and
/// which dependent fields are shown.
fn sync(form: &web_sys::Element, cfg: &Config, shown_values: &mut [String]) {
    for (i, k) in KEYS.iter().enumerate() {
        let value = (k.get)(cfg);
        if shown_values.get(i) == Some(&value) {
            continue;
        }
        if let Some(el) = element(form, &format!("[data-key=\"{}\"]", k.name)) {
            if let Some(input) = el.dyn_ref::<web_sys::HtmlInputElement>() {
                if input.type_() == "checkbox" {
                    input.set_checked(value == "true");
                } else if input.value() != value {
                    input.set_value(&value);
                }
            } else if let Some(select) = el.dyn_ref::<web_sys::HtmlSelectElement>() {
                select.set_value(&value);
            }
        }
        if let Some(id) = element(form, &format!("[data-choice-id=\"{}\"]", k.name)) {
            id.set_text_content(Some(&value));
        }
        // The GPU's line depends on the card, a custom size and the unit.
        if matches!(k.name, "gpu" | "gpu_gib" | "unit") {
            if let Some(note) = element(form, "[data-testid=gpu-note]") {
                note.set_text_content(Some(&gpu_note(cfg)));
            }
        }
        if i < shown_values.len() {
            shown_values[i] = value;
        }
    }
    // Fields shown by another key's value (only these are ever hidden): checked on every change
    // (a handful).
    for (name, when) in DEPENDENT {
        if let Some(field) = element(form, &format!("[data-field=\"{name}\"]")) {
            field.toggle_attribute_with_force("hidden", !when(cfg)).ok();
        }
    }
}

/// The configuration form around the input panels.
#[component]
pub fn Form(children: Children) -> impl IntoView {
    let store = use_store();
    let node = NodeRef::<FormElement>::new();
    let values = StoredValue::new(KEYS.iter().map(|_| String::new()).collect::<Vec<_>>());
    Effect::new(move |first: Option<()>| {
        let Some(form) = node.get() else { return };
        store.config.with(|c| {
            if first.is_none() {
                // The fields were written with these values.
                values.set_value(KEYS.iter().map(|k| (k.get)(c)).collect());
            } else {
                values.update_value(|v| sync(&form, c, v));
            }
        });
    });
    view! {
        <form class="inputs" aria-label="Configuration" node_ref=node on:submit=|ev| ev.prevent_default()
            on:input=move |ev| edit(store, &ev) on:change=move |ev| edit(store, &ev)>
            {children()}
        </form>
    }
}
