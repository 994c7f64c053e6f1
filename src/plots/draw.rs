//! What every chart shares: the title and legend above the plot, the axes with their titles and
//! tick labels, and the few marks the charts are made of (stacked areas, clipped lines, the
//! capacity line, labelled markers). Each chart module composes these.

use super::axis::{Axis, Frame};
use super::Theme;
use crate::estimator::config::Unit;
use crate::estimator::ledger::Bytes;
use crate::estimator::units::{format_bytes, in_unit, unit_symbol};
use plotters::chart::ChartContext;
use plotters::coord::cartesian::Cartesian2d;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontTransform;

/// The result of drawing on backend `DB`.
pub type DrawResult<T, DB> = Result<T, DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// A chart in the making: plotters' context over our two axes.
pub type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<Axis, Axis>>;

/// How a legend entry shows its series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// A filled swatch (a stacked area).
    Area,
    /// A solid line.
    Line,
    /// A dashed line.
    Dashed,
    /// A dot (markers).
    Dot,
}

/// One legend entry.
#[derive(Clone, Debug, PartialEq)]
pub struct LegendEntry {
    pub label: String,
    pub color: RGBColor,
    pub mark: Mark,
}

impl LegendEntry {
    pub fn new(label: impl Into<String>, color: RGBColor, mark: Mark) -> LegendEntry {
        LegendEntry { label: label.into(), color, mark }
    }
}

/// What the frame of a chart needs.
pub struct Spec<'s> {
    pub title: &'s str,
    pub legend: &'s [LegendEntry],
    pub x: Axis,
    pub y: Axis,
    pub x_title: &'s str,
    pub y_title: &'s str,
    pub x_label: &'s dyn Fn(f64) -> String,
    pub y_label: &'s dyn Fn(f64) -> String,
}

pub const FONT: &str = "sans-serif";

pub fn font(theme: &Theme, size: u32) -> TextStyle<'static> {
    (FONT, size).into_font().color(&theme.foreground)
}

/// Pixel width of the plotting area a chart of `width` pixels will have (for thinning ticks
/// before the chart is built): the frame's margins and the y label area.
pub fn plot_width(width: u32) -> f64 {
    (width as f64 - 20.0 - 64.0).max(40.0)
}

/// The width of `text` in pixels at `size` (an estimate from character classes of a sans-serif
/// face). Backends could measure text, but plotters' web backend does so by inserting a DOM
/// element and reading its size — a forced layout of the whole page per string, which cost
/// more than the rest of a redraw — so the charts lay text out by this estimate instead.
pub fn text_width(text: &str, size: u32, bold: bool) -> u32 {
    let em: f64 = text
        .chars()
        .map(|c| match c {
            // Widths of DejaVu Sans (what "sans-serif" is on most Linux systems, and among the
            // widest common faces), rounded up: overestimating only adds a little space.
            'i' | 'l' | 'j' | '.' | ',' | ':' | ';' | '\'' | '|' | '!' | 'I' => 0.3,
            '(' | ')' | ' ' | 't' | 'f' | 'r' => 0.4,
            'm' | 'w' | 'M' | 'W' | '—' | '%' | '@' => 0.92,
            '0'..='9' => 0.64,
            'A'..='Z' => 0.72,
            _ => 0.62,
        })
        .sum();
    (em * size as f64 * if bold { 1.08 } else { 1.0 }).ceil() as u32
}

/// The legend laid out in rows that fit `width`: (entry index, x) per row.
fn legend_rows(legend: &[LegendEntry], width: u32) -> Vec<Vec<(usize, u32)>> {
    let mut rows: Vec<Vec<(usize, u32)>> = vec![Vec::new()];
    let mut x = 10u32;
    for (i, e) in legend.iter().enumerate() {
        let w = 24 + text_width(&e.label, 12, false) + 16;
        if x + w > width.saturating_sub(10) && x > 10 {
            rows.push(Vec::new());
            x = 10;
        }
        if let Some(row) = rows.last_mut() {
            row.push((i, x));
        }
        x += w;
    }
    rows
}

/// Fills the background, draws the title and the legend, builds the chart with its axes,
/// grid, tick labels and axis titles, and hands it back for the series.
pub fn frame<'a, DB: DrawingBackend>(root: &'a DrawingArea<DB, Shift>, spec: &Spec, theme: &Theme) -> DrawResult<Chart<'a, DB>, DB> {
    root.fill(&theme.background)?;
    let (w, _h) = root.dim_in_pixel();
    let title_style = (FONT, 15).into_font().style(FontStyle::Bold).color(&theme.foreground);
    root.draw(&Text::new(spec.title.to_string(), (10, 8), title_style))?;
    let legend_style = font(theme, 12);
    let rows = legend_rows(spec.legend, w);
    let row_h = 18;
    let top = 30;
    for (r, row) in rows.iter().enumerate() {
        let y = top + r as i32 * row_h;
        for &(i, x) in row {
            let e = &spec.legend[i];
            let x = x as i32;
            match e.mark {
                Mark::Area => root.draw(&Rectangle::new([(x, y + 2), (x + 18, y + 12)], e.color.filled()))?,
                Mark::Line => root.draw(&PathElement::new(vec![(x, y + 7), (x + 18, y + 7)], e.color.stroke_width(3)))?,
                Mark::Dashed => {
                    root.draw(&PathElement::new(vec![(x, y + 7), (x + 6, y + 7)], e.color.stroke_width(2)))?;
                    root.draw(&PathElement::new(vec![(x + 12, y + 7), (x + 18, y + 7)], e.color.stroke_width(2)))?;
                }
                Mark::Dot => root.draw(&Circle::new((x + 9, y + 7), 4, e.color.filled()))?,
            }
            root.draw(&Text::new(e.label.clone(), (x + 24, y + 1), legend_style.clone()))?;
        }
    }
    let header = top + rows.len() as i32 * row_h + 4;

    let y_label_width = spec.y.ticks().iter().map(|t| text_width(&(spec.y_label)(*t), 12, false)).max().unwrap_or(24).max(16);
    let chart = ChartBuilder::on(root)
        .margin(10)
        .margin_top(header as u32)
        .margin_right(18)
        .x_label_area_size(42)
        .y_label_area_size(y_label_width + 30)
        .build_cartesian_2d(spec.x.clone(), spec.y.clone())?;
    mesh(root, &frame_of(&chart), spec, theme)?;
    Ok(chart)
}

/// Grid, axis lines, ticks, tick labels and axis titles, drawn from the chart's own frame.
fn mesh<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, f: &Frame, spec: &Spec, theme: &Theme) -> DrawResult<(), DB> {
    let xr = f.x_pixels();
    let yr = f.y_pixels();
    let (left, right) = (xr.start.min(xr.end), xr.start.max(xr.end));
    let (top, bottom) = (yr.start.min(yr.end), yr.start.max(yr.end));
    let (xa, ya) = (f.x_axis(), f.y_axis());
    let light = theme.grid.mix(0.45);
    let px = |v: f64| f.to_px(v, ya.lo()).0;
    let py = |v: f64| f.to_px(xa.lo(), v).1;
    for v in xa.light().iter().filter(|v| !xa.ticks().contains(v)) {
        root.draw(&PathElement::new(vec![(px(*v), top), (px(*v), bottom)], light))?;
    }
    for v in ya.light().iter().filter(|v| !ya.ticks().contains(v)) {
        root.draw(&PathElement::new(vec![(left, py(*v)), (right, py(*v))], light))?;
    }
    for v in xa.ticks() {
        root.draw(&PathElement::new(vec![(px(*v), top), (px(*v), bottom)], theme.grid))?;
    }
    for v in ya.ticks() {
        root.draw(&PathElement::new(vec![(left, py(*v)), (right, py(*v))], theme.grid))?;
    }
    root.draw(&PathElement::new(vec![(left, top), (left, bottom), (right, bottom)], theme.muted))?;
    let label = font(theme, 12);
    for v in xa.ticks() {
        let x = px(*v);
        root.draw(&PathElement::new(vec![(x, bottom), (x, bottom + 5)], theme.muted))?;
        root.draw(&Text::new((spec.x_label)(*v), (x, bottom + 8), label.clone().pos(Pos::new(HPos::Center, VPos::Top))))?;
    }
    for v in ya.ticks() {
        let y = py(*v);
        root.draw(&PathElement::new(vec![(left - 5, y), (left, y)], theme.muted))?;
        root.draw(&Text::new((spec.y_label)(*v), (left - 8, y), label.clone().pos(Pos::new(HPos::Right, VPos::Center))))?;
    }
    let desc = font(theme, 12).color(&theme.muted);
    root.draw(&Text::new(
        spec.x_title.to_string(),
        ((left + right) / 2, bottom + 25),
        desc.clone().pos(Pos::new(HPos::Center, VPos::Top)),
    ))?;
    let y_desc = desc.transform(FontTransform::Rotate270).pos(Pos::new(HPos::Center, VPos::Top));
    root.draw(&Text::new(spec.y_title.to_string(), (12, (top + bottom) / 2), y_desc))?;
    Ok(())
}

fn text_is_bold(style: &TextStyle) -> bool {
    matches!(style.font.get_style(), FontStyle::Bold)
}

/// The frame of a drawn chart (for the read-out).
pub fn frame_of<DB: DrawingBackend>(chart: &Chart<DB>) -> Frame {
    Frame { coord: chart.as_coord_spec().clone() }
}

/// Stacked areas: `layers` bottom to top, each the values at `xs`; the stack's floor is drawn
/// at `floor` (0 on a linear axis, the axis' bottom on a log axis, which has no 0).
pub fn stack<DB: DrawingBackend>(chart: &mut Chart<DB>, xs: &[f64], layers: &[(RGBColor, Vec<f64>)], floor: f64) -> DrawResult<(), DB> {
    let mut below = vec![0.0f64; xs.len()];
    for (color, values) in layers {
        let above: Vec<f64> = below.iter().zip(values).map(|(b, v)| b + v.max(0.0)).collect();
        if values.iter().any(|v| *v > 0.0) {
            let mut pts: Vec<(f64, f64)> = xs.iter().copied().zip(above.iter().copied()).collect();
            pts.extend(xs.iter().copied().zip(below.iter().map(|b| b.max(floor))).rev());
            chart.draw_series(std::iter::once(Polygon::new(pts, color.mix(0.88).filled())))?;
        }
        below = above;
    }
    Ok(())
}

/// The parts of a polyline inside the y range of the chart, cut where it leaves (a curve that
/// shoots off the top of the chart ends at the edge instead of running along it).
pub fn clip_y(x: &Axis, y: &Axis, pts: &[(f64, f64)]) -> Vec<Vec<(f64, f64)>> {
    let mut parts: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut cur: Vec<(f64, f64)> = Vec::new();
    let inside = |v: f64| v.is_finite() && y.contains(v);
    let lerp = |a: (f64, f64), b: (f64, f64), edge: f64| {
        // Interpolate in axis space (log or linear), where the drawn segment is straight.
        let (ya, yb, ye) = (y.fraction(a.1), y.fraction(b.1), y.fraction(edge));
        let t = if yb == ya { 0.0 } else { (ye - ya) / (yb - ya) };
        let xf = x.fraction(a.0) + t * (x.fraction(b.0) - x.fraction(a.0));
        (x.value_at(xf), edge)
    };
    for w in 0..pts.len() {
        let p = pts[w];
        if !p.1.is_finite() {
            if cur.len() > 1 {
                parts.push(std::mem::take(&mut cur));
            }
            cur.clear();
            continue;
        }
        let prev = if w > 0 && pts[w - 1].1.is_finite() { Some(pts[w - 1]) } else { None };
        match (prev.map(|q| inside(q.1)), inside(p.1)) {
            (None, true) => cur.push(p),
            (None, false) => {}
            (Some(true), true) => cur.push(p),
            (Some(true), false) => {
                let q = prev.unwrap_or(p);
                let edge = if p.1 > y.hi() { y.hi() } else { y.lo() };
                cur.push(lerp(q, p, edge));
                if cur.len() > 1 {
                    parts.push(std::mem::take(&mut cur));
                }
                cur.clear();
            }
            (Some(false), true) => {
                let q = prev.unwrap_or(p);
                let edge = if q.1 > y.hi() { y.hi() } else { y.lo() };
                cur.push(lerp(q, p, edge));
                cur.push(p);
            }
            (Some(false), false) => {}
        }
    }
    if cur.len() > 1 {
        parts.push(cur);
    }
    parts
}

/// A line through `pts`, clipped to the chart's y range; dashed if asked.
pub fn line<DB: DrawingBackend>(chart: &mut Chart<DB>, pts: &[(f64, f64)], style: ShapeStyle, dashed: bool) -> DrawResult<(), DB> {
    let (x, y) = {
        let c = chart.as_coord_spec();
        (c.x_spec().clone(), c.y_spec().clone())
    };
    for part in clip_y(&x, &y, pts) {
        if dashed {
            chart.draw_series(std::iter::once(DashedPathElement::new(part, 7, 5, style)))?;
        } else {
            chart.draw_series(std::iter::once(PathElement::new(part, style)))?;
        }
    }
    Ok(())
}

/// A horizontal line across the chart at `y`.
pub fn hline<DB: DrawingBackend>(chart: &mut Chart<DB>, y: f64, style: ShapeStyle) -> DrawResult<(), DB> {
    let (x0, x1) = {
        let c = chart.as_coord_spec();
        (c.x_spec().lo(), c.x_spec().hi())
    };
    line(chart, &[(x0, y), (x1, y)], style, false)
}

/// A vertical dashed line at `x` from `y0` to `y1`.
pub fn vline<DB: DrawingBackend>(chart: &mut Chart<DB>, x: f64, y0: f64, y1: f64, style: ShapeStyle) -> DrawResult<(), DB> {
    line(chart, &[(x, y0), (x, y1)], style, true)
}

/// A label at a data point on a backing box of the background colour, placed left or right of
/// the point depending on where it sits, above or below it.
pub fn label<DB: DrawingBackend>(
    chart: &mut Chart<DB>,
    text: &str,
    at: (f64, f64),
    style: TextStyle,
    above: bool,
    theme: &Theme,
) -> DrawResult<(), DB> {
    label_dy(chart, text, at, style, above, 0, theme)
}

/// [`label`], moved a further `dy` pixels away from the point (to stack several labels).
pub fn label_dy<DB: DrawingBackend>(
    chart: &mut Chart<DB>,
    text: &str,
    at: (f64, f64),
    style: TextStyle,
    above: bool,
    dy: i32,
    theme: &Theme,
) -> DrawResult<(), DB> {
    let right_half = chart.as_coord_spec().x_spec().fraction(at.0) > 0.6;
    let bold = text_is_bold(&style);
    let (tw, th) = (text_width(text, style.font.get_size() as u32, bold) as i32, style.font.get_size().round() as i32 + 2);
    let x0 = if right_half { -6 - tw } else { 6 };
    let y0 = if above { -5 - th - dy } else { 5 + dy };
    let element = EmptyElement::at(at)
        + Rectangle::new([(x0 - 3, y0 - 2), (x0 + tw + 3, y0 + th + 2)], theme.background.mix(0.85).filled())
        + Text::new(text.to_string(), (x0, y0), style);
    chart.draw_series(std::iter::once(element))?;
    Ok(())
}

/// A dot at a data point (hollow if not `filled`).
pub fn dot<DB: DrawingBackend>(chart: &mut Chart<DB>, at: (f64, f64), r: u32, color: RGBColor, filled: bool) -> DrawResult<(), DB> {
    let style = if filled { color.filled() } else { color.stroke_width(2) };
    chart.draw_series(std::iter::once(Circle::new(at, r, style)))?;
    Ok(())
}

/// The capacity of one GPU: a horizontal line with its label above it at the left end (where
/// the curves of memory growing with x are still low) or the right end.
pub fn capacity<DB: DrawingBackend>(
    chart: &mut Chart<DB>,
    capacity: Bytes,
    unit: Unit,
    label_text: &str,
    left: bool,
    theme: &Theme,
) -> DrawResult<(), DB> {
    if capacity == 0 {
        return Ok(());
    }
    let y = in_unit(capacity, unit);
    let (x_end, inside) = {
        let c = chart.as_coord_spec();
        (if left { c.x_spec().lo() } else { c.x_spec().hi() }, c.y_spec().contains(y))
    };
    hline(chart, y, theme.alert.stroke_width(2))?;
    if inside {
        let text = format!("{label_text}: {}", format_bytes(capacity, unit));
        label(chart, &text, (x_end, y), font(theme, 12).color(&theme.alert), true, theme)?;
    }
    Ok(())
}

/// Which corner of the plotting area a note goes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corner {
    TopLeft,
    TopRight,
    BottomRight,
}

/// Lines of text in a corner of the plotting area, each in its colour, on a backing box.
pub fn corner_note<DB: DrawingBackend>(
    chart: &mut Chart<DB>,
    lines: &[(String, RGBColor)],
    corner: Corner,
    theme: &Theme,
) -> DrawResult<(), DB> {
    if lines.is_empty() {
        return Ok(());
    }
    let area = chart.plotting_area().strip_coord_spec();
    let (w, h) = area.dim_in_pixel();
    let styles: Vec<TextStyle> = lines.iter().map(|(_, c)| (FONT, 12).into_font().style(FontStyle::Bold).color(c)).collect();
    let widths: Vec<i32> = lines.iter().map(|(t, _)| text_width(t, 12, true) as i32).collect();
    let box_w = widths.iter().copied().max().unwrap_or(0) + 12;
    let line_h = 17;
    let box_h = line_h * lines.len() as i32 + 8;
    let x0 = match corner {
        Corner::TopLeft => 8,
        Corner::TopRight | Corner::BottomRight => w as i32 - box_w - 8,
    };
    let y0 = match corner {
        Corner::TopLeft | Corner::TopRight => 8,
        Corner::BottomRight => h as i32 - box_h - 8,
    };
    area.draw(&Rectangle::new([(x0, y0), (x0 + box_w, y0 + box_h)], theme.background.mix(0.88).filled()))?;
    area.draw(&Rectangle::new([(x0, y0), (x0 + box_w, y0 + box_h)], theme.grid.stroke_width(1)))?;
    for (i, ((t, _), s)) in lines.iter().zip(styles).enumerate() {
        area.draw(&Text::new(t.clone(), (x0 + 6, y0 + 5 + line_h * i as i32), s))?;
    }
    Ok(())
}

/// `1,234.5`-style tick labels: as few decimals as the ticks need, thousands grouped.
pub fn num_label(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    let decimals = if a >= 100.0 {
        0
    } else if a >= 10.0 {
        usize::from(v.fract().abs() > 1e-9)
    } else if a >= 1.0 {
        if (v * 10.0).fract().abs() > 1e-6 {
            2
        } else {
            usize::from(v.fract().abs() > 1e-9)
        }
    } else {
        let mut d = 1;
        while d < 6 && ((v * 10f64.powi(d as i32)).round() - v * 10f64.powi(d as i32)).abs() > 1e-6 {
            d += 1;
        }
        d
    };
    let s = format!("{:.*}", decimals, a);
    let (int, frac) = s.split_once('.').map_or((s.as_str(), None), |(i, f)| (i, Some(f)));
    let mut grouped = String::new();
    for (i, ch) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(ch);
    }
    let sign = if v < 0.0 { "-" } else { "" };
    match frac {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

/// The y axis title: "Memory per GPU (GB)".
pub fn memory_title(unit: Unit) -> String {
    format!("Memory per GPU ({})", unit_symbol(unit))
}

/// A linear y axis from 0 that shows `top` with a little headroom.
pub fn memory_axis(top: f64) -> Axis {
    let top = if top.is_finite() && top > 0.0 { top * 1.08 } else { 1.0 };
    Axis::linear(0.0, top, 6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_numbers_use_as_few_decimals_as_needed_and_group_thousands() {
        assert_eq!(num_label(0.0), "0");
        assert_eq!(num_label(20.0), "20");
        assert_eq!(num_label(2.5), "2.5");
        assert_eq!(num_label(0.25), "0.25");
        assert_eq!(num_label(1250.0), "1,250");
        assert_eq!(num_label(1_000_000.0), "1,000,000");
        assert_eq!(num_label(12.5), "12.5");
    }

    #[test]
    fn a_line_leaving_the_top_is_cut_at_the_edge() {
        let x = Axis::linear(0.0, 10.0, 5);
        let y = Axis::linear(0.0, 100.0, 5);
        // From (0, 50) to (10, 150): it crosses 100 halfway.
        let parts = clip_y(&x, &y, &[(0.0, 50.0), (10.0, 150.0)]);
        assert_eq!(parts.len(), 1);
        let end = parts[0][1];
        assert!((end.0 - 5.0).abs() < 1e-9 && (end.1 - 100.0).abs() < 1e-9, "{end:?}");
    }

    #[test]
    fn a_line_that_comes_back_into_range_is_split_in_two() {
        let x = Axis::linear(0.0, 4.0, 4);
        let y = Axis::linear(0.0, 10.0, 5);
        let parts = clip_y(&x, &y, &[(0.0, 5.0), (1.0, 20.0), (2.0, 20.0), (3.0, 5.0), (4.0, 5.0)]);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[1].last(), Some(&(4.0, 5.0)));
    }
}
