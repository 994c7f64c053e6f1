//! The stacked bar of the ledger's categories against the GPU's capacity.

use crate::plots::bar::{bar_data, bar_height, draw_bar};
use crate::ui::canvas::{ChartCanvas, Draw, Height};
use crate::ui::state::{gpu_of, use_store};
use leptos::prelude::*;
use std::rc::Rc;

#[component]
pub fn Bar() -> impl IntoView {
    let store = use_store();
    let data = Memo::new(move |_| {
        let (unit, gpu) = store.config.with(|c| (c.unit, gpu_of(c).label()));
        store.estimate.with(|e| e.as_ref().ok().map(|e| bar_data(e, unit, &gpu)))
    });
    let draw: Draw = Rc::new(move |root, theme| data.with(|d| d.as_ref().and_then(|d| draw_bar(root, d, theme).ok())));
    let height: Height = Rc::new(move |w, theme| data.with(|d| d.as_ref().map_or(60, |d| bar_height(d, w, theme))));
    let label = Signal::derive(move || {
        data.with(|d| match d {
            Some(d) => {
                let parts: Vec<String> =
                    d.segments.iter().map(|s| format!("{} {}", s.label, crate::estimator::units::format_bytes(s.bytes, d.unit))).collect();
                let u = d.unit;
                let fmt = |b: u128| crate::estimator::units::format_bytes(b, u);
                let peak = d.peak.map_or(String::new(), |p| format!("; peak in use {}", fmt(p)));
                let smi = d.nvidia_smi.map_or(String::new(), |s| format!("; nvidia-smi will show {} (decides the verdict)", fmt(s)));
                format!("Stacked bar of the ledger's categories: {}{peak}{smi}; against {}", parts.join(", "), d.capacity_text())
            }
            None => "no estimate".into(),
        })
    });
    view! { <div class="bar-slot" data-panel="bar"><ChartCanvas label=label draw=draw height=height testid="bar-canvas"/></div> }
}
