//! Memory vs parameter count: which model sizes fit on 1, 8 and 64 GPUs of the chosen kind under
//! the chosen sharding, and why — the static memory (parameters, gradients, optimizer states)
//! grows with the parameter count and shrinks with sharding, while activations grow with width
//! and depth only.
//!
//! The x axis is the **current architecture scaled** (width by whole groups of attention heads,
//! depth so that the parameter count grows smoothly), from 100M (or the smallest the shape
//! allows) to 1T parameters, everything else as configured: one continuous family through the
//! current model. The presets of the current model's family (Llama 3.1: 8B, 70B, 405B) are drawn
//! as dots at their own exact estimates and name the x ticks. For each GPU count the largest
//! scaled model that fits is found by search on the step's peak.

use super::axis::{Axis, Frame};
use super::draw::{self, DrawResult, Header, Layout, LegendEntry, Mark, Spec};
use super::format::{gpu_name, params_label, zero_label};
use super::table::{Column, Table};
use super::theme::{okabe_ito, Theme};
use crate::estimator::config::{Config, Unit};
use crate::estimator::ledger::Bytes;
use crate::estimator::sweep::{ParamsSweep, GPU_COUNTS};
use crate::estimator::units::{format_count, in_unit};
use plotters::coord::Shift;
use plotters::prelude::*;

/// The chart's data: the sweep and what it is drawn with.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamsData {
    pub sweep: ParamsSweep,
    pub model: String,
    pub gpu: String,
    pub unit: Unit,
    /// The tick label of each of the sweep's presets: "8B", "70B", "0.5B", "124M".
    pub shorts: Vec<String>,
}

/// The short name of a preset's size: "llama-3.1-70b" → "70B"; otherwise its rounded count.
pub fn short_size(id: &str, params: u64) -> String {
    id.rsplit('-')
        .find_map(|seg| {
            let num = seg.strip_suffix('b').map(|n| (n, "B")).or_else(|| seg.strip_suffix('m').map(|n| (n, "M")))?;
            (!num.0.is_empty() && num.0.chars().all(|c| c.is_ascii_digit() || c == '.')).then(|| format!("{}{}", num.0, num.1))
        })
        .unwrap_or_else(|| format_count(params))
}

fn gpus_word(n: u64) -> String {
    if n == 1 {
        "1 GPU".into()
    } else {
        format!("{n} GPUs")
    }
}

const COLORS: [RGBColor; 3] = [okabe_ito::BLUE, okabe_ito::GREEN, okabe_ito::PURPLE];

impl ParamsData {
    /// The sweep of `cfg`, drawn in its unit.
    pub fn new(sweep: ParamsSweep, cfg: &Config) -> ParamsData {
        let shorts = sweep.presets.iter().map(|p| short_size(p.id, p.params)).collect();
        ParamsData { sweep, model: cfg.display_name(), gpu: gpu_name(cfg), unit: cfg.unit, shorts }
    }

    /// "8 GPUs: up to 13.2B".
    pub fn limit_text(&self, gi: usize) -> String {
        let n = gpus_word(GPU_COUNTS[gi]);
        match self.sweep.limits.get(gi).copied().flatten() {
            None => format!("{n}: none of these fit"),
            Some(p) if p >= self.sweep.range.1 => format!("{n}: all fit (up to {})", format_count(p)),
            Some(p) => format!("{n}: up to {}", format_count(p)),
        }
    }

    pub fn table(&self, _theme: &Theme) -> Table {
        let mut columns = Vec::new();
        for (gi, &g) in GPU_COUNTS.iter().enumerate() {
            columns.push(Column {
                key: format!("peak_{g}_gpus_bytes"),
                label: format!("Peak, {}", gpus_word(g)),
                color: COLORS[gi],
                values: self.sweep.peak[gi].clone(),
            });
        }
        for (gi, &g) in GPU_COUNTS.iter().enumerate() {
            columns.push(Column {
                key: format!("static_{g}_gpus_bytes"),
                label: format!("Params + grads + optimizer, {}", gpus_word(g)),
                color: COLORS[gi],
                values: self.sweep.statics[gi].clone(),
            });
        }
        columns.push(Column {
            key: "activations_bytes".into(),
            label: "Activations".into(),
            color: okabe_ito::VERMILLION,
            values: self.sweep.activations.clone(),
        });
        Table {
            x_key: "parameters".into(),
            x_title: "Parameters".into(),
            x: self.sweep.params.iter().map(|p| *p as f64).collect(),
            x_text: self.sweep.params.iter().map(|p| format!("{} parameters", format_count(*p))).collect(),
            text_in_csv: false,
            columns,
        }
    }

    pub fn describe(&self) -> String {
        let limits: Vec<String> = (0..GPU_COUNTS.len()).map(|i| self.limit_text(i)).collect();
        format!(
            "Peak memory per GPU against the parameter count of {} scaled from {} to {}, on 1, 8 and 64 GPUs under {}, with the static memory and the activations. Largest that fits: {}.",
            self.model,
            format_count(self.sweep.range.0),
            format_count(self.sweep.range.1),
            zero_label(self.sweep.zero),
            limits.join("; ")
        )
    }
}

/// The chart's title, legend and notes (the largest model that fits on each GPU count).
pub fn params_header(data: &ParamsData, theme: &Theme) -> Header {
    let d = &data.sweep;
    let mut legend: Vec<LegendEntry> =
        GPU_COUNTS.iter().zip(COLORS).map(|(g, c)| LegendEntry::new(format!("Peak, {}", gpus_word(*g)), c, Mark::Line)).collect();
    legend.push(LegendEntry::new("Params + grads + optimizer (dashed, per GPU count)", theme.muted, Mark::Dashed));
    legend.push(LegendEntry::new("Activations", okabe_ito::VERMILLION, Mark::Dashed));
    if !d.presets.is_empty() {
        legend.push(LegendEntry::new(format!("{} presets", d.family.clone().unwrap_or_default()), theme.foreground, Mark::Dot));
    }
    legend.push(LegendEntry::new(format!("{} capacity", data.gpu), theme.alert, Mark::Line));
    let title = format!("Peak memory vs model size — {} scaled, {}", data.model, zero_label(d.zero));
    let mut notes = vec![("Largest that fits:".to_string(), theme.foreground)];
    notes.extend((0..GPU_COUNTS.len()).map(|gi| (data.limit_text(gi), COLORS[gi])));
    Header { title, legend, notes }
}

/// Draws the chart; returns where it put the data and its layout.
pub fn draw_params<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, data: &ParamsData, theme: &Theme) -> DrawResult<(Frame, Layout), DB> {
    let d = &data.sweep;
    let u = data.unit;
    let (w, _) = root.dim_in_pixel();
    let (lo, hi) = (d.range.0 as f64, (d.range.1 as f64).max(d.range.0 as f64 * 10.0));
    let (decades, light) = super::axis::decade_ticks(lo, hi);
    let preset_ticks: Vec<f64> = d.presets.iter().map(|p| p.params as f64).collect();
    let ticks = preset_ticks.iter().copied().chain(decades.iter().copied());
    let x = Axis::log(lo, hi).with_ticks(ticks).with_light(light).thinned(draw::plot_width(w), 40.0, &preset_ticks);
    let all = d
        .peak
        .iter()
        .chain(d.statics.iter())
        .flat_map(|v| v.iter().flatten())
        .chain(d.activations.iter().flatten())
        .map(|b| in_unit(*b, u))
        .filter(|v| *v > 0.0);
    let cap = in_unit(d.capacity, u);
    let max = all.clone().fold(cap, f64::max);
    let min = all.fold(if cap > 0.0 { cap } else { f64::INFINITY }, f64::min);
    let y = Axis::log((min * 0.7).max(1e-6), (max * 1.4).max(min * 10.0));
    let header = params_header(data, theme);
    let y_title = format!("{}, log scale", draw::memory_title(u));
    let names: Vec<(f64, String)> = d.presets.iter().zip(&data.shorts).map(|(p, s)| (p.params as f64, s.clone())).collect();
    let x_label = move |v: f64| names.iter().find(|(p, _)| (p / v - 1.0).abs() < 1e-9).map_or_else(|| params_label(v), |(_, s)| s.clone());
    let spec = Spec {
        header: &header,
        x,
        y: y.clone(),
        x_title: "Parameters (log scale; current architecture scaled)",
        y_title: &y_title,
        x_label: &x_label,
        y_label: &|v| draw::num_label(v),
    };
    let (mut chart, mut layout) = draw::frame(root, &spec, theme)?;
    let xs: Vec<f64> = d.params.iter().map(|p| *p as f64).collect();
    let series = |v: &[Option<Bytes>]| -> Vec<(f64, f64)> {
        xs.iter().copied().zip(v.iter().map(|b| b.map_or(f64::NAN, |b| in_unit(b, u)))).collect()
    };
    draw::line(&mut chart, &series(&d.activations), okabe_ito::VERMILLION.stroke_width(2), true)?;
    for ((statics, peak), color) in d.statics.iter().zip(&d.peak).zip(COLORS) {
        draw::line(&mut chart, &series(statics), color.stroke_width(2), true)?;
        draw::line(&mut chart, &series(peak), color.stroke_width(3), false)?;
    }
    for p in &d.presets {
        for (gi, b) in p.peak.iter().enumerate() {
            if let Some(b) = b {
                let at = (p.params as f64, in_unit(*b, u));
                if y.contains(at.1) {
                    draw::dot(&mut chart, at, 5, COLORS[gi], false)?;
                }
            }
        }
    }
    draw::capacity(&mut chart, d.capacity, u, &data.gpu, true, theme, &mut layout.parts)?;
    let cx = d.current as f64;
    if chart.as_coord_spec().x_spec().contains(cx) {
        draw::vline(&mut chart, cx, y.lo(), y.hi(), theme.muted.stroke_width(1))?;
        draw::label(
            &mut chart,
            &format!("{} ({})", data.model, format_count(d.current)),
            (cx, y.hi()),
            draw::font(theme, 12),
            false,
            theme,
            &mut layout.parts,
        )?;
    }
    // Where each GPU count stops fitting: a dot on the capacity line (the figures are notes).
    if d.capacity > 0 && y.contains(cap) {
        for (gi, (limit, color)) in d.limits.iter().zip(COLORS).enumerate() {
            if let Some(p) = limit.filter(|p| (*p as f64) < hi && (*p as f64) >= lo) {
                draw::dot(&mut chart, (p as f64, cap), 6 - gi as u32, color, true)?;
            }
        }
    }
    let frame = draw::frame_of(&chart);
    root.present()?;
    Ok((frame, layout))
}

pub fn params_svg(data: &ParamsData, theme: &Theme, size: (u32, u32)) -> String {
    draw::svg_of(size, |root| draw_params(root, data, theme).map(|_| ()))
}
