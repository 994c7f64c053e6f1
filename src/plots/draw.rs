//! What every chart shares: the header above the plot (the title, the legend and notes,
//! wrapped to the width so that nothing overlaps and nothing covers data), the axes with their
//! titles and tick labels, and the few marks the charts are made of (stacked areas, clipped
//! lines, the capacity line, labelled markers). Each chart module composes these.
//!
//! Every chart reports where it put things as a [`Layout`] (in the drawing's pixels): the plot
//! area and a box per title line, legend entry and note. The native tests check that no two
//! boxes overlap and that none enters the plot area, at every width from 320 to 1600 pixels;
//! the browser tests check the same on the page, against the text widths the browser measures.

use super::axis::{Axis, Frame};
use super::scene::{draw_scene, Area};
use super::theme::Theme;
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
use std::convert::Infallible;

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
    /// A dotted line ([`DOTTED`]).
    Dotted,
    /// A line of long dashes ([`LONG_DASHED`]).
    LongDashed,
    /// A dot (markers).
    Dot,
}

impl Mark {
    /// The (dash, gap) pattern a line of this mark is drawn with ([`line_pattern`]); `None`: solid
    /// (or not a line).
    pub fn dash(self) -> Option<(u32, u32)> {
        match self {
            Mark::Dashed => Some(DASHED),
            Mark::Dotted => Some(DOTTED),
            Mark::LongDashed => Some(LONG_DASHED),
            Mark::Area | Mark::Line | Mark::Dot => None,
        }
    }
}

/// Dash and gap, pixels, of [`Mark::Dashed`] lines.
pub const DASHED: (u32, u32) = (7, 5);
/// Dash and gap of [`Mark::Dotted`] lines.
pub const DOTTED: (u32, u32) = (2, 4);
/// Dash and gap of [`Mark::LongDashed`] lines.
pub const LONG_DASHED: (u32, u32) = (14, 5);

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

/// What a chart says above its plot: a title, a legend and notes (the limits it found, each in
/// its series' colour).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Header {
    pub title: String,
    pub legend: Vec<LegendEntry>,
    pub notes: Vec<(String, RGBColor)>,
}

/// A rectangle in the drawing's pixels: `x0..x1` × `y0..y1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Rect {
    pub x0: i32,
    pub y0: i32,
    pub x1: i32,
    pub y1: i32,
}

impl Rect {
    pub fn new(x0: i32, y0: i32, x1: i32, y1: i32) -> Rect {
        Rect { x0, y0, x1, y1 }
    }
    /// Whether the two share any area (touching edges do not count).
    pub fn intersects(&self, o: &Rect) -> bool {
        self.x0 < o.x1 && o.x0 < self.x1 && self.y0 < o.y1 && o.y0 < self.y1
    }
    /// Whether `o` lies inside this rectangle.
    pub fn contains(&self, o: &Rect) -> bool {
        o.x0 >= self.x0 && o.x1 <= self.x1 && o.y0 >= self.y0 && o.y1 <= self.y1
    }
}

/// What a laid-out box holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Title,
    Legend,
    Note,
    /// A label on the data (the capacity, a marker), placed clear of the legend and of the
    /// other labels, inside the plot area.
    Label,
    /// An axis' tick label or title, outside the plot area.
    Axis,
}

impl Part {
    fn name(self) -> &'static str {
        match self {
            Part::Title => "title",
            Part::Legend => "legend",
            Part::Note => "note",
            Part::Label => "label",
            Part::Axis => "axis",
        }
    }
}

/// One box of text the chart laid out. For a legend entry the box holds its swatch
/// ([`SWATCH`] pixels) and its text; `text_x` is where the text starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Placed {
    pub part: Part,
    pub text: String,
    /// Font size in pixels, and whether bold.
    pub size: u32,
    pub bold: bool,
    pub rect: Rect,
    pub text_x: i32,
}

/// Where a chart put its plot area and its text.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Layout {
    pub width: u32,
    pub height: u32,
    pub plot: Rect,
    pub parts: Vec<Placed>,
}

impl Layout {
    /// The layout as JSON (the page puts it in the canvas' `data-layout` for the browser
    /// tests): `{"w":…,"h":…,"plot":[x0,y0,x1,y1],"parts":[{"part":"legend","text":…,
    /// "size":12,"bold":false,"box":[…],"text_x":…},…]}`.
    pub fn json(&self) -> String {
        let r = |r: &Rect| format!("[{},{},{},{}]", r.x0, r.y0, r.x1, r.y1);
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|p| {
                format!(
                    "{{\"part\":\"{}\",\"text\":\"{}\",\"size\":{},\"bold\":{},\"box\":{},\"text_x\":{}}}",
                    p.part.name(),
                    json_escape(&p.text),
                    p.size,
                    p.bold,
                    r(&p.rect),
                    p.text_x
                )
            })
            .collect();
        format!("{{\"w\":{},\"h\":{},\"plot\":{},\"parts\":[{}]}}", self.width, self.height, r(&self.plot), parts.join(","))
    }

    /// What is wrong with the layout, in words: boxes of the header that overlap each other or
    /// the plot area, or leave the drawing. Empty when it is sound.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let all = Rect::new(0, 0, self.width as i32, self.height as i32);
        for (i, a) in self.parts.iter().enumerate() {
            if !all.contains(&a.rect) {
                out.push(format!("{} '{}' leaves the drawing: {:?}", a.part.name(), a.text, a.rect));
            }
            if !matches!(a.part, Part::Label) && a.rect.intersects(&self.plot) {
                out.push(format!("{} '{}' covers the plot area", a.part.name(), a.text));
            }
            for b in &self.parts[i + 1..] {
                if a.rect.intersects(&b.rect) {
                    out.push(format!("{} '{}' overlaps {} '{}'", a.part.name(), a.text, b.part.name(), b.text));
                }
            }
        }
        out
    }
}

fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

pub const FONT: &str = "sans-serif";

/// The theme's text at `base` size (scaled by the theme), in the foreground colour.
pub fn font(theme: &Theme, base: u32) -> TextStyle<'static> {
    (FONT, theme.px(base)).into_font().color(&theme.foreground)
}

/// Bold text at `base` size in `color`.
pub fn bold(theme: &Theme, base: u32, color: RGBColor) -> TextStyle<'static> {
    (FONT, theme.px(base)).into_font().style(FontStyle::Bold).color(&color)
}

/// The y-label area and margins around the plot: the plot spans the width less these.
const SIDE: u32 = 20 + 64;

/// Pixel width of the plotting area a chart of `width` pixels will have (for thinning ticks
/// before the chart is built): the frame's margins and the y label area.
pub fn plot_width(width: u32) -> f64 {
    (width as f64 - SIDE as f64).max(40.0)
}

/// The width of `text` in pixels at `size` (an estimate from character classes of a sans-serif
/// face). Backends could measure text, but plotters' web backend does so by inserting a DOM
/// element and reading its size — a forced layout of the whole page per string, which cost
/// more than the rest of a redraw — so the charts lay text out by this estimate instead. It
/// errs wide: the browser tests compare it with the widths the browser measures.
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
    (em * size as f64 * if bold { 1.12 } else { 1.0 }).ceil() as u32
}

/// `text` broken at spaces into lines at most `width` pixels wide (a word wider than that gets a
/// line of its own).
pub fn wrap(text: &str, size: u32, bold: bool, width: u32) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for word in text.split(' ') {
        let candidate = if cur.is_empty() { word.to_string() } else { format!("{cur} {word}") };
        if !cur.is_empty() && text_width(&candidate, size, bold) > width {
            lines.push(std::mem::replace(&mut cur, word.to_string()));
        } else {
            cur = candidate;
        }
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    lines
}

/// Width of a legend entry's swatch and the gap before its text.
pub const SWATCH: i32 = 24;
/// Space between two legend entries on a row.
const ENTRY_GAP: i32 = 16;
/// Left and right margin of the header.
const EDGE: i32 = 10;

/// One laid-out header item before drawing: what, where, in which lines.
struct Item {
    part: Part,
    lines: Vec<String>,
    size: u32,
    bold: bool,
    color: RGBColor,
    mark: Option<Mark>,
    x: i32,
    y: i32,
    w: i32,
}

/// Lays the header out at `width` pixels: title lines, then legend entries and notes flowing in
/// rows (an entry too wide for a row of its own wraps its text). Returns the items and the
/// height the header takes.
fn layout_header(h: &Header, width: u32, theme: &Theme, top: i32) -> (Vec<Item>, i32) {
    let mut items = Vec::new();
    let avail = (width as i32 - 2 * EDGE).max(40);
    let title = theme.px(15);
    let mut y = top;
    for line in wrap(&h.title, title, true, avail as u32).into_iter().filter(|l| !l.is_empty()) {
        let w = text_width(&line, title, true) as i32;
        items.push(Item {
            part: Part::Title,
            lines: vec![line],
            size: title,
            bold: true,
            color: theme.foreground,
            mark: None,
            x: EDGE,
            y,
            w,
        });
        y += title as i32 + 5;
    }
    if y > top {
        y += 4;
    }
    let size = theme.px(12);
    let line_h = size as i32 + 6;
    let flow = h
        .legend
        .iter()
        .map(|e| (Part::Legend, e.label.as_str(), false, e.color, Some(e.mark)))
        .chain(h.notes.iter().map(|(t, c)| (Part::Note, t.as_str(), true, *c, (*c != theme.foreground).then_some(Mark::Dot))));
    let mut x = EDGE;
    let mut row_h = 0;
    for (part, text, is_bold, color, mark) in flow {
        let lead = if mark.is_some() { SWATCH } else { 0 };
        let mut lines = vec![text.to_string()];
        let mut w = lead + text_width(text, size, is_bold) as i32;
        if w > avail {
            lines = wrap(text, size, is_bold, (avail - lead) as u32);
            w = lead + lines.iter().map(|l| text_width(l, size, is_bold) as i32).max().unwrap_or(0);
        }
        if x > EDGE && x + w > EDGE + avail {
            x = EDGE;
            y += row_h;
            row_h = 0;
        }
        row_h = row_h.max(line_h * lines.len() as i32);
        items.push(Item { part, lines, size, bold: is_bold, color, mark, x, y, w });
        x += w + ENTRY_GAP;
    }
    y += row_h;
    (items, y + 4)
}

/// Where a header of `h` laid out from `top` at `width` pixels ends.
pub fn header_bottom(h: &Header, width: u32, theme: &Theme, top: i32) -> i32 {
    layout_header(h, width, theme, top).1
}

/// The height of the header of `h` at `width` pixels.
pub fn header_height(h: &Header, width: u32, theme: &Theme) -> u32 {
    layout_header(h, width, theme, 8).1.max(0) as u32
}

/// Height of the plot, its tick labels and axis title under the header.
pub const PLOT_HEIGHT: u32 = 330;

/// The height a chart with header `h` takes at `width`: its header and [`PLOT_HEIGHT`].
pub fn chart_height(h: &Header, width: u32, theme: &Theme) -> u32 {
    header_height(h, width, theme) + PLOT_HEIGHT
}

/// Draws the header's items from `top` down; returns their boxes and where the header ends.
pub fn draw_header<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    h: &Header,
    theme: &Theme,
    top: i32,
) -> DrawResult<(Vec<Placed>, i32), DB> {
    let (w, _) = root.dim_in_pixel();
    let (items, height) = layout_header(h, w, theme, top);
    let mut placed = Vec::new();
    for it in items {
        // Text in the foreground colour (contrast); the series' colour is in the mark.
        let style = (FONT, it.size).into_font().style(if it.bold { FontStyle::Bold } else { FontStyle::Normal }).color(&theme.foreground);
        let (x, y) = (it.x, it.y);
        let line_h = if it.part == Part::Title { it.size as i32 + 5 } else { it.size as i32 + 6 };
        if let Some(mark) = it.mark {
            match mark {
                Mark::Area => root.draw(&Rectangle::new([(x, y + 2), (x + 18, y + 12)], it.color.filled()))?,
                Mark::Line => root.draw(&PathElement::new(vec![(x, y + 7), (x + 18, y + 7)], it.color.stroke_width(3)))?,
                Mark::Dashed => {
                    root.draw(&PathElement::new(vec![(x, y + 7), (x + 6, y + 7)], it.color.stroke_width(2)))?;
                    root.draw(&PathElement::new(vec![(x + 12, y + 7), (x + 18, y + 7)], it.color.stroke_width(2)))?;
                }
                Mark::Dotted => {
                    for dx in [0, 6, 12] {
                        root.draw(&PathElement::new(vec![(x + dx, y + 7), (x + dx + 2, y + 7)], it.color.stroke_width(2)))?;
                    }
                }
                Mark::LongDashed => {
                    root.draw(&PathElement::new(vec![(x, y + 7), (x + 11, y + 7)], it.color.stroke_width(2)))?;
                    root.draw(&PathElement::new(vec![(x + 15, y + 7), (x + 18, y + 7)], it.color.stroke_width(2)))?;
                }
                Mark::Dot => root.draw(&Circle::new((x + 9, y + 7), 4, it.color.filled()))?,
            }
        }
        let text_x = x + if it.mark.is_some() { SWATCH } else { 0 };
        for (i, line) in it.lines.iter().enumerate() {
            root.draw(&Text::new(line.clone(), (text_x, y + 1 + i as i32 * line_h), style.clone()))?;
        }
        let text = it.lines.join(" ");
        let rect = Rect::new(x, y, x + it.w, y + line_h * it.lines.len() as i32 - 2);
        placed.push(Placed { part: it.part, text, size: it.size, bold: it.bold, rect, text_x });
    }
    Ok((placed, height))
}

/// What the frame of a chart needs.
pub struct Spec<'s> {
    pub header: &'s Header,
    pub x: Axis,
    pub y: Axis,
    pub x_title: &'s str,
    pub y_title: &'s str,
    pub x_label: &'s dyn Fn(f64) -> String,
    pub y_label: &'s dyn Fn(f64) -> String,
}

/// Fills the background, draws the header, builds the chart with its axes, grid, tick labels
/// and axis titles, and hands it back for the series with the layout so far.
pub fn frame<'a, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    spec: &Spec,
    theme: &Theme,
) -> DrawResult<(Chart<'a, DB>, Layout), DB> {
    root.fill(&theme.background)?;
    let (w, h) = root.dim_in_pixel();
    let (parts, header) = draw_header(root, spec.header, theme, 8)?;
    let tick = theme.px(12);
    let y_label_width = spec.y.ticks().iter().map(|t| text_width(&(spec.y_label)(*t), tick, false)).max().unwrap_or(24).max(16);
    let chart = ChartBuilder::on(root)
        .margin(10)
        .margin_top(header.max(0) as u32)
        .margin_right(18)
        .x_label_area_size(30 + 2 * tick)
        .y_label_area_size(y_label_width + 18 + tick)
        .build_cartesian_2d(spec.x.clone(), spec.y.clone())?;
    let f = frame_of(&chart);
    let mut parts = parts;
    mesh(root, &f, spec, theme, &mut parts)?;
    let (xr, yr) = (f.x_pixels(), f.y_pixels());
    let plot = Rect::new(xr.start.min(xr.end), yr.start.min(yr.end), xr.start.max(xr.end), yr.start.max(yr.end));
    Ok((chart, Layout { width: w, height: h, plot, parts }))
}

/// Grid, axis lines, ticks, tick labels and axis titles, drawn from the chart's own frame. Each
/// tick label and title is kept inside the drawing (a label at the axis' end is moved in, a
/// title too wide for the chart is wrapped) and reported in `parts`.
fn mesh<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    f: &Frame,
    spec: &Spec,
    theme: &Theme,
    parts: &mut Vec<Placed>,
) -> DrawResult<(), DB> {
    let (w, _) = root.dim_in_pixel();
    let w = w as i32;
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
    let size = theme.px(12);
    let label = font(theme, 12);
    let tick = size as i32;
    let mut axis_part =
        |text: String, rect: Rect, text_x: i32| parts.push(Placed { part: Part::Axis, text, size, bold: false, rect, text_x });
    let mut last_x1 = i32::MIN;
    for v in xa.ticks() {
        let x = px(*v);
        root.draw(&PathElement::new(vec![(x, bottom), (x, bottom + 5)], theme.muted))?;
        let text = (spec.x_label)(*v);
        if text.is_empty() {
            continue;
        }
        // Centred under its tick, moved in where it would leave the drawing; a label that would
        // touch the one before it is left out (its tick stays).
        let tw = text_width(&text, size, false) as i32;
        let x0 = (x - tw / 2).clamp(2, (w - 2 - tw).max(2));
        if x0 < last_x1 + 4 {
            continue;
        }
        last_x1 = x0 + tw;
        root.draw(&Text::new(text.clone(), (x0, bottom + 8), label.clone()))?;
        axis_part(text, Rect::new(x0, bottom + 8, x0 + tw, bottom + 8 + tick), x0);
    }
    for v in ya.ticks() {
        let y = py(*v);
        root.draw(&PathElement::new(vec![(left - 5, y), (left, y)], theme.muted))?;
        let text = (spec.y_label)(*v);
        let tw = text_width(&text, size, false) as i32;
        root.draw(&Text::new(text.clone(), (left - 8, y), label.clone().pos(Pos::new(HPos::Right, VPos::Center))))?;
        axis_part(text, Rect::new(left - 8 - tw, y - tick / 2 - 1, left - 8, y + tick / 2 + 1), left - 8 - tw);
    }
    let desc = font(theme, 12).color(&theme.muted);
    // The x title under the tick labels, on two lines if one is wider than the drawing.
    let lines = wrap(spec.x_title, size, false, (w - 8).max(40) as u32);
    for (i, line) in lines.iter().take(2).enumerate() {
        let tw = text_width(line, size, false) as i32;
        let x0 = ((left + right) / 2 - tw / 2).clamp(2, (w - 2 - tw).max(2));
        let y0 = bottom + 13 + tick + i as i32 * (tick + 2);
        root.draw(&Text::new(line.clone(), (x0, y0), desc.clone()))?;
        axis_part(line.clone(), Rect::new(x0, y0, x0 + tw, y0 + tick), x0);
    }
    // The y title, turned, centred on the plot's height (shortened to it if longer).
    let th = text_width(spec.y_title, size, false) as i32;
    let y_desc = desc.transform(FontTransform::Rotate270).pos(Pos::new(HPos::Center, VPos::Top));
    let mid = (top + bottom) / 2;
    root.draw(&Text::new(spec.y_title.to_string(), (12, mid), y_desc))?;
    axis_part(spec.y_title.to_string(), Rect::new(12, mid - th / 2, 12 + tick, mid + th / 2), 12);
    Ok(())
}

/// Renders a drawing function into an SVG document (empty if drawing failed).
pub fn svg_of(size: (u32, u32), draw: impl FnOnce(&Area) -> Result<(), DrawingAreaErrorKind<Infallible>>) -> String {
    match draw_scene(size, draw) {
        (scene, Ok(())) => scene.svg(),
        _ => String::new(),
    }
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
    line_pattern(chart, pts, style, dashed.then_some(DASHED))
}

/// A line through `pts`, solid or with a (dash, gap) pattern in pixels ([`DASHED`],
/// [`DOTTED`], [`LONG_DASHED`]); clipped to the frame as [`line`] is.
pub fn line_pattern<DB: DrawingBackend>(
    chart: &mut Chart<DB>,
    pts: &[(f64, f64)],
    style: ShapeStyle,
    pattern: Option<(u32, u32)>,
) -> DrawResult<(), DB> {
    let (x, y) = {
        let c = chart.as_coord_spec();
        (c.x_spec().clone(), c.y_spec().clone())
    };
    for part in clip_y(&x, &y, pts) {
        match pattern {
            Some((dash, gap)) => {
                chart.draw_series(std::iter::once(DashedPathElement::new(part, dash, gap, style)))?;
            }
            None => {
                chart.draw_series(std::iter::once(PathElement::new(part, style)))?;
            }
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
/// the point depending on where it sits, above or below it; reported in `parts`.
pub fn label<DB: DrawingBackend>(
    chart: &mut Chart<DB>,
    text: &str,
    at: (f64, f64),
    style: TextStyle,
    above: bool,
    theme: &Theme,
    parts: &mut Vec<Placed>,
) -> DrawResult<(), DB> {
    label_dy(chart, text, at, style, above, 0, theme, parts)
}

/// [`label`], moved a further `dy` pixels away from the point (to stack several labels).
///
/// The label stays inside the plot area and clear of the labels already in `parts`: it is
/// wrapped to the plot's width, and of the places beside the point (the preferred side and
/// height first, then the other side, the other height, then further away) it takes the first
/// that fits; its box is added to `parts`.
#[allow(clippy::too_many_arguments)]
pub fn label_dy<DB: DrawingBackend>(
    chart: &mut Chart<DB>,
    text: &str,
    at: (f64, f64),
    style: TextStyle,
    above: bool,
    dy: i32,
    theme: &Theme,
    parts: &mut Vec<Placed>,
) -> DrawResult<(), DB> {
    let right_half = chart.as_coord_spec().x_spec().fraction(at.0) > 0.6;
    let bold = text_is_bold(&style);
    let size = style.font.get_size().round() as u32;
    let (px, py) = chart.backend_coord(&at);
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let lines = wrap(text, size, bold, (xr.end - xr.start - 12).max(40) as u32);
    let line_h = size as i32 + 2;
    let tw = lines.iter().map(|l| text_width(l, size, bold) as i32).max().unwrap_or(0);
    let th = line_h * lines.len() as i32;
    let others: Vec<Rect> = parts.iter().filter(|p| p.part == Part::Label).map(|p| p.rect).collect();
    // The label's box for offsets (x0, y0) of its text from the point.
    let rect = |x0: i32, y0: i32| Rect::new(px + x0 - 3, py + y0 - 2, px + x0 + tw + 3, py + y0 + th + 2);
    let inside = |r: &Rect| r.x0 >= xr.start && r.x1 <= xr.end && r.y0 >= yr.start && r.y1 <= yr.end;
    let free = |r: &Rect| !others.iter().any(|o| o.intersects(r));
    // Beside the point on either side, or (a label as wide as the plot) moved in to fit.
    let fit = |x0: i32| x0.clamp(xr.start - px + 3, (xr.end - px - tw - 3).max(xr.start - px + 3));
    let sides = if right_half { [-6 - tw, 6, fit(-tw / 2)] } else { [6, -6 - tw, fit(-tw / 2)] };
    let heights = if above { [-5 - th - dy, 5 + dy] } else { [5 + dy, -5 - th - dy] };
    let mut chosen = None;
    'search: for step in 0..16 {
        for y0 in heights {
            let y0 = y0 + step * (th + 4) * y0.signum();
            for x0 in sides {
                if inside(&rect(x0, y0)) && free(&rect(x0, y0)) {
                    chosen = Some((x0, y0));
                    break 'search;
                }
            }
        }
    }
    // Nowhere free: the preferred place, moved inside the plot.
    let (x0, y0) = chosen.unwrap_or_else(|| {
        let (x0, y0) = (sides[0], heights[0]);
        let x0 = fit(x0);
        let y0 = y0.clamp(yr.start - py + 2, (yr.end - py - th - 2).max(yr.start - py + 2));
        (x0, y0)
    });
    let backing =
        EmptyElement::at(at) + Rectangle::new([(x0 - 3, y0 - 2), (x0 + tw + 3, y0 + th + 2)], theme.background.mix(0.85).filled());
    chart.draw_series(std::iter::once(backing))?;
    for (i, line) in lines.iter().enumerate() {
        let t = EmptyElement::at(at) + Text::new(line.clone(), (x0, y0 + i as i32 * line_h), style.clone());
        chart.draw_series(std::iter::once(t))?;
    }
    parts.push(Placed { part: Part::Label, text: lines.join(" "), size, bold, rect: rect(x0, y0), text_x: px + x0 });
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
    parts: &mut Vec<Placed>,
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
        label(chart, &text, (x_end, y), font(theme, 12).color(&theme.alert), true, theme, parts)?;
    }
    Ok(())
}

/// Where a y axis stops below the highest value it plots: a note at the top of the plot saying
/// where it was cut and how high the series goes (`what` names the series and where it peaks).
pub fn cut_note<DB: DrawingBackend>(
    chart: &mut Chart<DB>,
    unit: Unit,
    highest: f64,
    what: &str,
    theme: &Theme,
    parts: &mut Vec<Placed>,
) -> DrawResult<(), DB> {
    let (x, y) = {
        let c = chart.as_coord_spec();
        (c.x_spec().clone(), c.y_spec().clone())
    };
    if !(highest.is_finite() && highest > y.hi()) {
        return Ok(());
    }
    let sym = unit_symbol(unit);
    let text = format!("↑ axis cut at {} {sym}: {what} reaches {} {sym}", num_label(y.hi().round()), num_label(highest.round()));
    label(chart, &text, (x.value_at(0.99), y.hi()), bold(theme, 12, theme.foreground), false, theme, parts)
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

/// The colour of a compared configuration's line (B) over a chart.
pub const OVERLAY: RGBColor = super::theme::okabe_ito::VERMILLION;

/// Draws a second configuration's series (B) over a drawn chart: a dashed line through the
/// points inside the chart's axes (`None` and points outside split the line), labelled `label`
/// at its last point. Coordinates come from the chart's own [`Frame`], so B shares A's axes.
pub fn overlay<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    frame: &Frame,
    pts: &[(f64, Option<Bytes>)],
    unit: Unit,
    label: &str,
    theme: &Theme,
) -> DrawResult<(), DB> {
    let (xa, ya) = (frame.x_axis(), frame.y_axis());
    let mut runs: Vec<Vec<(i32, i32)>> = vec![Vec::new()];
    for (x, b) in pts {
        let at = b.map(|b| (*x, in_unit(b, unit))).filter(|(x, y)| xa.contains(*x) && ya.contains(*y));
        match (at, runs.last_mut()) {
            (Some((x, y)), Some(run)) => run.push(frame.to_px(x, y)),
            (None, Some(run)) if !run.is_empty() => runs.push(Vec::new()),
            _ => {}
        }
    }
    let style = OVERLAY.stroke_width(3);
    for run in runs.iter().filter(|r| r.len() > 1) {
        root.draw(&DashedPathElement::new(run.clone(), 4, 4, style))?;
    }
    if let Some(&(px, py)) = runs.iter().rev().find_map(|r| r.last()) {
        root.draw(&Text::new(label.to_string(), (px - 28, py - theme.px(13) as i32 - 6), bold(theme, 13, OVERLAY)))?;
    }
    Ok(())
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
