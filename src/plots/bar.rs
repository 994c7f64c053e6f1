//! The ledger's stacked bar: each category of memory side by side (the ledger's sums, under the
//! ledger's names), against the GPU's capacity, with the two figures of the step: the peak in
//! use, and what nvidia-smi will show — the figure the verdict decides on — with what it adds
//! above the peak (the caching allocator's reserve) bracketed between the two marks.
//!
//! Laid out in pixels, top to bottom: the capacity's label (on its own line, beside the
//! capacity line, never on the bar), the bar with the capacity line, the peak's mark and the
//! nvidia-smi mark, the axis, and the legend flowing in rows under it. The height follows the width
//! ([`bar_height`]): a narrow screen gets more legend rows, never overlapping ones.

use super::axis::nice_ticks;
use super::draw::{self, DrawResult, Header, Layout, LegendEntry, Mark, Part, Placed, Rect};
use super::theme::{category_color, Theme};
use crate::estimator::config::Unit;
use crate::estimator::ledger::{Bytes, Category};
use crate::estimator::units::{format_bytes, in_unit, unit_symbol};
use crate::estimator::{by_category, Estimate};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One coloured piece of the bar.
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub label: String,
    pub bytes: Bytes,
    pub color: RGBColor,
}

/// Everything the bar shows.
#[derive(Clone, Debug, PartialEq)]
pub struct BarData {
    pub segments: Vec<Segment>,
    pub capacity: Bytes,
    pub capacity_label: String,
    /// The step's peak (the components are not all resident at once).
    pub peak: Option<Bytes>,
    /// What nvidia-smi will show at the peak (the caching allocator replayed): what the
    /// verdict decides on.
    pub nvidia_smi: Option<Bytes>,
    pub unit: Unit,
}

impl BarData {
    pub fn total(&self) -> Bytes {
        self.segments.iter().map(|s| s.bytes).sum()
    }

    /// The capacity's label: "NVIDIA H100 80 GB (SXM): 85.5 GB".
    pub fn capacity_text(&self) -> String {
        format!("{}: {}", self.capacity_label, format_bytes(self.capacity, self.unit))
    }

    fn legend(&self) -> Header {
        let mut legend: Vec<LegendEntry> = self.segments.iter().map(|s| LegendEntry::new(s.label.clone(), s.color, Mark::Area)).collect();
        if let Some(p) = self.peak {
            legend.push(LegendEntry::new(format!("Peak in use: {}", format_bytes(p, self.unit)), RGBColor(0, 0, 0), Mark::Line));
        }
        if let (Some(smi), Some(p)) = (self.nvidia_smi, self.peak) {
            legend.push(LegendEntry::new(
                format!(
                    "nvidia-smi will show: {} (+{} above the peak, the allocator's reserve; decides the verdict)",
                    format_bytes(smi, self.unit),
                    format_bytes(smi.saturating_sub(p), self.unit)
                ),
                RGBColor(0, 0, 0),
                Mark::Dashed,
            ));
        }
        Header { title: String::new(), legend, notes: Vec::new() }
    }
}

/// The bar of an estimate: one segment per non-empty category.
pub fn bar_data(e: &Estimate, unit: Unit, gpu_label: &str) -> BarData {
    let segments = by_category(e)
        .into_iter()
        .filter(|(_, b)| *b > 0)
        .map(|(c, b): (Category, Bytes)| Segment { label: c.label().to_string(), bytes: b, color: category_color(c) })
        .collect();
    BarData {
        segments,
        capacity: e.capacity,
        capacity_label: gpu_label.to_string(),
        peak: e.memory.peak_opt(),
        nvidia_smi: e.memory.nvidia_smi,
        unit,
    }
}

/// Left and right margins of the bar.
const LEFT: i32 = 10;
const RIGHT: i32 = 24;
/// Height of the bar itself.
const BAR: i32 = 34;

/// The vertical positions of the bar's parts at `width`: (top of the bar, top of the legend).
fn rows(data: &BarData, width: u32, theme: &Theme) -> (i32, i32) {
    let label_lines = draw::wrap(&data.capacity_text(), theme.px(13), false, (width as i32 - LEFT - RIGHT).max(40) as u32).len() as i32;
    let bar_top = 6 + label_lines * (theme.px(13) as i32 + 4) + 4;
    let axis = bar_top + BAR + 6 + 2 * theme.px(12) as i32 + 14;
    (bar_top, axis)
}

/// The height the bar takes at `width` pixels.
pub fn bar_height(data: &BarData, width: u32, theme: &Theme) -> u32 {
    let (_, legend_top) = rows(data, width, theme);
    let mut legend = data.legend();
    legend.legend.iter_mut().filter(|e| matches!(e.mark, Mark::Line | Mark::Dashed)).for_each(|e| e.color = theme.foreground);
    (draw::header_bottom(&legend, width, theme, legend_top) + 6).max(0) as u32
}

/// Draws the bar into `root`; returns where it put the bar and its text.
pub fn draw_bar<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, data: &BarData, theme: &Theme) -> DrawResult<Layout, DB> {
    root.fill(&theme.background)?;
    let (w, h) = root.dim_in_pixel();
    let (bar_top, legend_top) = rows(data, w, theme);
    let (x0, x1) = (LEFT, (w as i32 - RIGHT).max(LEFT + 40));
    let u = data.unit;
    let total = in_unit(data.total(), u);
    let cap = in_unit(data.capacity, u);
    let smi = data.nvidia_smi.map_or(0.0, |b| in_unit(b, u));
    let x_max = (total.max(cap).max(smi) * 1.08).max(1e-9);
    let px = |v: f64| x0 + ((v / x_max) * (x1 - x0) as f64).round() as i32;
    let bar = Rect::new(x0, bar_top, x1, bar_top + BAR);
    let mut parts = Vec::new();

    // The segments.
    let mut at = 0.0;
    for s in &data.segments {
        let dx = in_unit(s.bytes, u);
        root.draw(&Rectangle::new([(px(at), bar.y0), (px(at + dx), bar.y1)], s.color.filled()))?;
        at += dx;
    }
    // The axis under the bar: ticks and their values, then its title.
    let tick_font = draw::font(theme, 12);
    let ticks = nice_ticks(0.0, x_max, if w < 420 { 4 } else { 8 });
    let axis_y = bar.y1 + 6;
    root.draw(&PathElement::new(vec![(x0, axis_y), (x1, axis_y)], theme.muted))?;
    for t in ticks {
        let x = px(t);
        root.draw(&PathElement::new(vec![(x, axis_y), (x, axis_y + 4)], theme.muted))?;
        root.draw(&Text::new(draw::num_label(t), (x, axis_y + 6), tick_font.clone().pos(Pos::new(HPos::Center, VPos::Top))))?;
    }
    let title = format!("memory per GPU ({})", unit_symbol(u));
    let title_y = axis_y + 8 + theme.px(12) as i32;
    root.draw(&Text::new(title, ((x0 + x1) / 2, title_y), tick_font.clone().color(&theme.muted).pos(Pos::new(HPos::Center, VPos::Top))))?;

    // The peak's mark across the bar; nvidia-smi's beside it, dashed, and a bracket over the
    // bar from the one to the other (what nvidia-smi adds above the peak).
    if let Some(peak) = data.peak {
        let x = px(in_unit(peak, u));
        root.draw(&PathElement::new(vec![(x, bar.y0 - 3), (x, bar.y1 + 3)], theme.foreground.stroke_width(2)))?;
        if let Some(smi) = data.nvidia_smi {
            let smi_style = theme.foreground.stroke_width(3);
            let xs = px(in_unit(smi, u));
            root.draw(&PathElement::new(vec![(xs, bar.y0 - 3), (xs, bar.y0 + 4)], smi_style))?;
            root.draw(&PathElement::new(vec![(xs, bar.y0 + 9), (xs, bar.y1 - 9)], smi_style))?;
            root.draw(&PathElement::new(vec![(xs, bar.y1 - 4), (xs, bar.y1 + 3)], smi_style))?;
            root.draw(&PathElement::new(vec![(x, bar.y0 - 3), (xs.max(x + 1), bar.y0 - 3)], smi_style))?;
        }
    }
    // The capacity: a line through the bar and up to its label, which sits above the bar on the
    // line's side with the most room.
    if data.capacity > 0 {
        let x = px(cap);
        root.draw(&PathElement::new(vec![(x, 4), (x, bar.y1 + 4)], theme.alert.stroke_width(3)))?;
        let size = theme.px(13);
        let lines = draw::wrap(&data.capacity_text(), size, false, (x1 - x0) as u32);
        let tw = lines.iter().map(|l| draw::text_width(l, size, false) as i32).max().unwrap_or(0);
        let lx = if x > (x0 + x1) / 2 { x - 6 - tw } else { x + 6 };
        let lx = lx.clamp(x0, (x1 - tw).max(x0));
        let style = (draw::FONT, size).into_font().color(&theme.alert);
        for (i, line) in lines.iter().enumerate() {
            root.draw(&Text::new(line.clone(), (lx, 6 + i as i32 * (size as i32 + 4)), style.clone()))?;
        }
        let rect = Rect::new(lx, 6, lx + tw, 6 + lines.len() as i32 * (size as i32 + 4) - 2);
        parts.push(Placed { part: Part::Note, text: lines.join(" "), size, bold: false, rect, text_x: lx });
    }
    // The legend under the axis.
    let mut legend = data.legend();
    legend.legend.iter_mut().filter(|e| matches!(e.mark, Mark::Line | Mark::Dashed)).for_each(|e| e.color = theme.foreground);
    let (placed, _) = draw::draw_header(root, &legend, theme, legend_top)?;

    parts.extend(placed);
    root.present()?;
    Ok(Layout { width: w, height: h, plot: bar, parts })
}

/// The bar as an SVG document (export, and native tests), at its own height for `width`.
pub fn bar_svg(data: &BarData, theme: &Theme, width: u32) -> String {
    draw::svg_of((width, bar_height(data, width, theme)), |root| draw_bar(root, data, theme).map(|_| ()))
}
