//! Memory vs sequence length: the configuration with `seq` swept on a log axis, the step's peak
//! stacked by category, the other attention implementation as an overlay (the s² term of
//! materialized scores against the linear growth of fused kernels), the GPU's capacity, and the
//! longest sequence that fits, found exactly by search ([`crate::estimator::sweep::seq_sweep`]).
//!
//! The stack is the composition **at the step's peak** (the timeline's peak event), not the
//! ledger's sum of components: its top is exactly the peak, which is what decides out-of-memory,
//! so the stack meets the capacity line exactly where the search says it does.

use super::axis::{pow2_ticks, Axis, Frame};
use super::draw::{self, DrawResult, Header, Layout, LegendEntry, Mark, Spec};
use super::format::{gpu_name, tokens_label};
use super::table::{stack_columns, Column, Table};
use super::theme::{category_color, okabe_ito, Theme};
use crate::estimator::config::{Config, Unit};
use crate::estimator::expr::group_digits;
use crate::estimator::ledger::{Bytes, Category};
use crate::estimator::names::Named;
use crate::estimator::sweep::{SeqRecipe, SeqSweep};
use crate::estimator::units::in_unit;
use plotters::coord::Shift;
use plotters::prelude::*;

/// The chart's data: the sweep and what it is drawn with.
#[derive(Clone, Debug, PartialEq)]
pub struct SeqData {
    pub sweep: SeqSweep,
    pub model: String,
    pub gpu: String,
    pub unit: Unit,
    /// A log memory axis (shows the s² vs s slopes as 2 vs 1).
    pub log_y: bool,
    /// The configured length and its peak (the "you are here" dot).
    pub current: Option<(u64, Bytes)>,
}

/// What the stack is, in the ledger's words (its "At the peak" column).
pub const STACKED: &str = "Stacked: each of the ledger's categories in use at the step's peak";

/// The MLA overlay's name: the same model with keys and values not compressed
/// ([`crate::estimator::sweep::uncompressed_kv`]).
pub const UNCOMPRESSED: &str = "Peak without MLA (K/V uncompressed, same heads)";

/// How each compared recipe's line is drawn: colour and legend mark (its dash pattern).
fn recipe_style(r: SeqRecipe, theme: &Theme) -> (RGBColor, Mark) {
    match r {
        SeqRecipe::None => (theme.foreground, Mark::LongDashed),
        SeqRecipe::Op => (theme.foreground, Mark::Dashed),
        SeqRecipe::Full => (theme.foreground, Mark::Dotted),
        SeqRecipe::Compile => (theme.muted, Mark::Dashed),
    }
}

impl SeqData {
    /// The sweep of `cfg`, drawn in its unit, without a marker.
    pub fn new(sweep: SeqSweep, cfg: &Config) -> SeqData {
        SeqData { sweep, model: cfg.display_name(), gpu: gpu_name(cfg), unit: cfg.unit, log_y: false, current: None }
    }

    /// The peak at each length (top of the stack).
    pub fn peaks(&self) -> Vec<Bytes> {
        self.sweep.peaks()
    }

    /// What the marker says: "OOM beyond 11,264 tokens".
    pub fn limit_text(&self) -> String {
        match self.sweep.limit {
            None => "OOM at every length".to_string(),
            Some(n) if n >= self.sweep.range.1 => format!("Fits up to {} tokens", group_digits(self.sweep.range.1 as u128)),
            Some(n) => format!("OOM beyond {} tokens", group_digits(n as u128)),
        }
    }

    /// The chart's numbers (hover read-out and CSV).
    pub fn table(&self, theme: &Theme) -> Table {
        let mut columns = stack_columns(&self.sweep.stack);
        columns.push(Column {
            key: format!("peak_{}_bytes", self.sweep.attn.name()),
            label: format!("Peak ({})", self.sweep.attn.name()),
            color: theme.foreground,
            values: self.peaks().into_iter().map(Some).collect(),
        });
        columns.push(Column {
            key: format!("peak_{}_bytes", self.sweep.other.name()),
            label: format!("Peak with {} attention", self.sweep.other.name()),
            color: okabe_ito::SKY_BLUE,
            values: self.sweep.other_peak.clone(),
        });
        if !self.sweep.uncompressed_peak.is_empty() {
            columns.push(Column {
                key: "peak_uncompressed_kv_bytes".into(),
                label: UNCOMPRESSED.into(),
                color: okabe_ito::PURPLE,
                values: self.sweep.uncompressed_peak.clone(),
            });
        }
        for line in &self.sweep.recipes {
            columns.push(Column {
                key: format!("peak_recipe_{}_bytes", line.recipe.name()),
                label: format!("Peak: {}", line.recipe.label()),
                color: recipe_style(line.recipe, theme).0,
                values: line.peak.clone(),
            });
        }
        Table {
            x_key: "seq".into(),
            x_title: "Sequence length (tokens)".into(),
            x: self.sweep.seqs.iter().map(|s| *s as f64).collect(),
            x_text: self.sweep.seqs.iter().map(|s| format!("{} tokens", group_digits(*s as u128))).collect(),
            text_in_csv: false,
            columns,
        }
    }

    /// A sentence for screen readers.
    pub fn describe(&self) -> String {
        let mla = if self.sweep.uncompressed_peak.is_empty() {
            ""
        } else {
            " The same model without multi-head latent attention (keys and values uncompressed) is drawn for comparison."
        };
        format!(
            "Peak memory per GPU of {} against sequence length from {} to {} tokens, stacked by category, with {} attention for comparison. {}.{}{}",
            self.model,
            tokens_label(self.sweep.range.0 as f64),
            tokens_label(self.sweep.range.1 as f64),
            self.sweep.other.name(),
            self.limit_text(),
            mla,
            self.recipes_text()
        )
    }

    /// What the compared recipes are, for screen readers and the chart's note ("" when none).
    pub fn recipes_text(&self) -> String {
        let d = &self.sweep;
        if d.recipes.is_empty() && d.refused_recipes.is_empty() {
            return String::new();
        }
        let mut s = String::new();
        if !d.recipes.is_empty() {
            let names: Vec<&str> = d.recipes.iter().map(|l| l.recipe.label()).collect();
            s.push_str(&format!(" Compared: {}.", names.join("; ")));
        }
        if let Some(refused) = self.refused_text() {
            s.push_str(&format!(" {refused}."));
        }
        s
    }

    /// "Not estimated for this configuration: compile" — the recipes refused at every length.
    fn refused_text(&self) -> Option<String> {
        let d = &self.sweep;
        (!d.refused_recipes.is_empty()).then(|| {
            let names: Vec<&str> = d.refused_recipes.iter().map(|r| r.name()).collect();
            format!("Not estimated for this configuration: {}", names.join(", "))
        })
    }

    fn y_axis(&self) -> Axis {
        let u = self.unit;
        let peaks: Vec<f64> = self.peaks().into_iter().map(|b| in_unit(b, u)).collect();
        let cap = in_unit(self.sweep.capacity, u);
        let max = peaks.iter().copied().fold(0.0, f64::max);
        let min = peaks.iter().copied().fold(f64::INFINITY, f64::min);
        if self.log_y {
            let recipes = self.sweep.recipes.iter().flat_map(|l| l.peak.iter());
            let others = self.sweep.other_peak.iter().chain(&self.sweep.uncompressed_peak).chain(recipes).flatten().map(|b| in_unit(*b, u));
            let all_max = others.clone().fold(max.max(cap), f64::max);
            let all_min = others.fold(min.min(if cap > 0.0 { cap } else { f64::INFINITY }), f64::min);
            let lo = if all_min.is_finite() && all_min > 0.0 { all_min * 0.7 } else { 0.1 };
            return Axis::log(lo, all_max.max(lo * 10.0) * 1.3);
        }
        // Linear: show the capacity with room above it and the stack up to twice the capacity;
        // beyond that, curves leave through the top (the overlay of an s² term soon does).
        let top = if cap > 0.0 { max.min(cap * 2.0).max(cap * 1.15).max(min * 1.25) } else { max };
        draw::memory_axis(top)
    }
}

/// The chart's title, legend and notes.
pub fn seq_header(data: &SeqData, theme: &Theme) -> Header {
    let d = &data.sweep;
    let mut legend: Vec<LegendEntry> = Category::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| d.stack.iter().any(|s| s[*i] > 0))
        .map(|(_, c)| LegendEntry::new(c.label(), category_color(*c), Mark::Area))
        .collect();
    legend.push(LegendEntry::new(format!("Peak ({})", d.attn.name()), theme.foreground, Mark::Line));
    legend.push(LegendEntry::new(format!("Peak with {} attention", d.other.name()), okabe_ito::SKY_BLUE, Mark::Dashed));
    if !d.uncompressed_peak.is_empty() {
        legend.push(LegendEntry::new(UNCOMPRESSED, okabe_ito::PURPLE, Mark::Dashed));
    }
    for line in &d.recipes {
        let (color, mark) = recipe_style(line.recipe, theme);
        legend.push(LegendEntry::new(line.recipe.label(), color, mark));
    }
    legend.push(LegendEntry::new(format!("{} capacity", data.gpu), theme.alert, Mark::Line));
    let title = format!("Peak memory vs sequence length — {} ({} attention)", data.model, d.attn.name());
    let mut notes = vec![(STACKED.to_string(), theme.foreground)];
    if let Some(refused) = data.refused_text() {
        notes.push((refused, theme.muted));
    }
    Header { title, legend, notes }
}

/// Draws the chart; returns where it put the data (for the read-out) and its layout.
pub fn draw_seq<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, data: &SeqData, theme: &Theme) -> DrawResult<(Frame, Layout), DB> {
    let d = &data.sweep;
    let u = data.unit;
    let (w, _) = root.dim_in_pixel();
    let (lo, hi) = (d.range.0 as f64, d.range.1 as f64);
    let x = Axis::log(lo, hi).with_ticks(pow2_ticks(lo, hi)).with_light([]).thinned(draw::plot_width(w), 44.0, &[]);
    let y = data.y_axis();
    let header = seq_header(data, theme);
    let x_title = "Sequence length (tokens, log scale)";
    let y_title = if data.log_y { format!("{}, log scale", draw::memory_title(u)) } else { draw::memory_title(u) };
    let spec = Spec {
        header: &header,
        x,
        y: y.clone(),
        x_title,
        y_title: &y_title,
        x_label: &|v| tokens_label(v),
        y_label: &|v| draw::num_label(v),
    };
    let (mut chart, mut layout) = draw::frame(root, &spec, theme)?;
    let xs: Vec<f64> = d.seqs.iter().map(|s| *s as f64).collect();
    let layers: Vec<(RGBColor, Vec<f64>)> =
        Category::ALL.iter().enumerate().map(|(i, c)| (category_color(*c), d.stack.iter().map(|s| in_unit(s[i], u)).collect())).collect();
    let floor = if y.is_log() { y.lo() } else { 0.0 };
    draw::stack(&mut chart, &xs, &layers, floor)?;
    let peaks: Vec<(f64, f64)> = xs.iter().copied().zip(data.peaks().into_iter().map(|b| in_unit(b, u))).collect();
    draw::line(&mut chart, &peaks, theme.foreground.stroke_width(2), false)?;
    let other: Vec<(f64, f64)> = xs.iter().copied().zip(d.other_peak.iter().map(|b| b.map_or(f64::NAN, |b| in_unit(b, u)))).collect();
    draw::line(&mut chart, &other, okabe_ito::SKY_BLUE.stroke_width(3), true)?;
    if !d.uncompressed_peak.is_empty() {
        let unc: Vec<(f64, f64)> =
            xs.iter().copied().zip(d.uncompressed_peak.iter().map(|b| b.map_or(f64::NAN, |b| in_unit(b, u)))).collect();
        draw::line(&mut chart, &unc, okabe_ito::PURPLE.stroke_width(2), true)?;
    }
    for line in &d.recipes {
        let (color, mark) = recipe_style(line.recipe, theme);
        let pts: Vec<(f64, f64)> = xs.iter().copied().zip(line.peak.iter().map(|b| b.map_or(f64::NAN, |b| in_unit(b, u)))).collect();
        draw::line_pattern(&mut chart, &pts, color.stroke_width(2), mark.dash())?;
        // Named at its last point inside the frame, so the lines read without the legend.
        if let Some(&at) = pts.iter().rev().find(|p| p.1.is_finite() && y.contains(p.1)) {
            draw::label(&mut chart, line.recipe.name(), at, draw::font(theme, 12), true, theme, &mut layout.parts)?;
        }
    }
    draw::capacity(&mut chart, d.capacity, u, &data.gpu, true, theme, &mut layout.parts)?;
    let cap = in_unit(d.capacity, u);
    if let Some((i, top)) = peaks.iter().enumerate().map(|(i, p)| (i, p.1)).max_by(|a, b| a.1.total_cmp(&b.1)) {
        let at = format!("the peak ({})", tokens_label(xs[i]));
        draw::cut_note(&mut chart, u, top, &at, theme, &mut layout.parts)?;
    }
    if let Some((s, peak)) = data.current {
        let at = (s as f64, in_unit(peak, u));
        if chart.as_coord_spec().x_spec().contains(at.0) && y.contains(at.1) {
            draw::dot(&mut chart, at, 5, theme.foreground, false)?;
            draw::label(
                &mut chart,
                &format!("now: {}", tokens_label(s as f64)),
                at,
                draw::font(theme, 12),
                false,
                theme,
                &mut layout.parts,
            )?;
        }
    }
    // The out-of-memory mark: where the peak reaches the capacity.
    let text = data.limit_text();
    let strong = draw::bold(theme, 13, theme.alert);
    match d.limit {
        Some(n) if n < d.range.1 && (n as f64) >= lo && d.capacity > 0 => {
            let at = (n as f64, cap);
            draw::vline(&mut chart, at.0, floor, cap, theme.alert.stroke_width(2))?;
            draw::dot(&mut chart, at, 5, theme.alert, true)?;
            let y_label = if y.contains(cap) { cap } else { y.hi() };
            draw::label_dy(&mut chart, &text, (at.0, y_label), strong, true, 16, theme, &mut layout.parts)?;
        }
        _ => {
            draw::label(&mut chart, &text, (lo, y.hi()), strong, false, theme, &mut layout.parts)?;
        }
    }
    let frame = draw::frame_of(&chart);
    root.present()?;
    Ok((frame, layout))
}

/// The chart as an SVG document.
pub fn seq_svg(data: &SeqData, theme: &Theme, size: (u32, u32)) -> String {
    draw::svg_of(size, |root| draw_seq(root, data, theme).map(|_| ()))
}
