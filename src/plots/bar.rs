//! The ledger's stacked bar: each category of memory side by side, against the GPU's capacity.

use super::{category_color, Theme};
use crate::estimator::config::Unit;
use crate::estimator::ledger::{Bytes, Category};
use crate::estimator::units::{in_unit, unit_symbol};
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
    pub unit: Unit,
}

impl BarData {
    pub fn total(&self) -> Bytes {
        self.segments.iter().map(|s| s.bytes).sum()
    }
}

/// The bar of an estimate: one segment per non-empty category.
pub fn bar_data(e: &Estimate, unit: Unit, gpu_label: &str) -> BarData {
    let segments = by_category(e)
        .into_iter()
        .filter(|(_, b)| *b > 0)
        .map(|(c, b): (Category, Bytes)| Segment { label: c.label().to_string(), bytes: b, color: category_color(c) })
        .collect();
    BarData { segments, capacity: e.capacity, capacity_label: gpu_label.to_string(), peak: e.memory.peak_opt(), unit }
}

/// Draws the bar into `root`.
pub fn draw_bar<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    data: &BarData,
    theme: &Theme,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&theme.background)?;
    let unit = unit_symbol(data.unit);
    let total = in_unit(data.total(), data.unit);
    let cap = in_unit(data.capacity, data.unit);
    let x_max = (total.max(cap) * 1.08).max(1e-9);
    let (w, h) = root.dim_in_pixel();
    let font = ("sans-serif", 13).into_font().color(&theme.foreground);
    let mut chart = ChartBuilder::on(root)
        .margin(10)
        .margin_right(24)
        .x_label_area_size(34)
        .y_label_area_size(4)
        .build_cartesian_2d(0.0..x_max, 0.0..1.0)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc(format!("memory per GPU ({unit})"))
        .x_labels(if w < 420 { 4 } else { 8 })
        .x_label_formatter(&|v| format!("{v:.0}"))
        .axis_style(theme.muted)
        .light_line_style(theme.grid)
        .bold_line_style(theme.grid)
        .label_style(font.clone())
        .axis_desc_style(font.clone())
        .draw()?;

    let (y0, y1) = (0.45, 0.95);
    let mut x = 0.0;
    for s in &data.segments {
        let dx = in_unit(s.bytes, data.unit);
        chart.draw_series(std::iter::once(Rectangle::new([(x, y0), (x + dx, y1)], s.color.filled())))?;
        x += dx;
    }
    // Legend row under the bar: swatch + label, wrapping by the available width.
    let legend_y = 0.3;
    let mut lx = 0.0;
    let step = x_max / if w < 420 { 3.0 } else { 6.0 };
    let mut row = 0.0;
    for s in &data.segments {
        let y = legend_y - row * 0.14;
        chart.draw_series(std::iter::once(Rectangle::new([(lx, y - 0.05), (lx + x_max * 0.015, y + 0.05)], s.color.filled())))?;
        chart.draw_series(std::iter::once(Text::new(s.label.clone(), (lx + x_max * 0.022, y + 0.05), font.clone())))?;
        lx += step;
        if lx + step > x_max * 1.001 {
            lx = 0.0;
            row += 1.0;
        }
    }
    if data.capacity > 0 {
        chart.draw_series(std::iter::once(PathElement::new(vec![(cap, 0.38), (cap, 1.0)], theme.alert.stroke_width(3))))?;
        let label = format!("{}: {cap:.1} {unit}", data.capacity_label);
        let anchor = if cap > x_max * 0.6 { (cap - x_max * 0.01, 1.0) } else { (cap + x_max * 0.01, 1.0) };
        let style = font.clone().color(&theme.alert);
        let style = if cap > x_max * 0.6 { style.pos(Pos::new(HPos::Right, VPos::Top)) } else { style };
        chart.draw_series(std::iter::once(Text::new(label, anchor, style)))?;
    }
    if let Some(peak) = data.peak {
        let p = in_unit(peak, data.unit);
        chart.draw_series(std::iter::once(PathElement::new(vec![(p, y0 - 0.04), (p, y1 + 0.04)], theme.foreground.stroke_width(2))))?;
    }
    let _ = h;
    root.present()?;
    Ok(())
}

/// The bar as an SVG document (export, and native tests).
pub fn bar_svg(data: &BarData, theme: &Theme, size: (u32, u32)) -> String {
    super::svg_of(size, |root| draw_bar(root, data, theme))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::config::Config;
    use crate::estimator::estimate;
    use crate::plots::LIGHT;

    #[test]
    fn the_bar_has_a_segment_and_a_legend_entry_per_category() {
        let e = estimate(&Config::default()).expect("valid");
        let data = bar_data(&e, Unit::Gb, "H100 80 GB");
        let svg = bar_svg(&data, &LIGHT, (720, 160));
        for s in &data.segments {
            assert!(svg.contains(&s.label), "legend lacks {}", s.label);
            assert!(
                svg.contains(&super::super::hex(s.color).to_uppercase()) || svg.contains(&super::super::hex(s.color)),
                "no fill for {}",
                s.label
            );
        }
        assert!(svg.contains("H100 80 GB: 85.5 GB"), "capacity label");
        assert!(svg.contains("memory per GPU (GB)"));
    }

    #[test]
    fn the_segments_add_up_to_the_ledger_total() {
        let e = estimate(&Config::default()).expect("valid");
        assert_eq!(bar_data(&e, Unit::Gib, "x").total(), e.memory.total);
    }
}
