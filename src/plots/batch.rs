//! Memory vs micro-batch: the step's peak stacked by category (its composition at the peak
//! event, as in the sequence chart) for micro-batches 1, 2, 3, 4, 6, 8, …, the capacity, and the
//! largest micro-batch that fits, found exactly by search ([`crate::estimator::sweep::batch_sweep`]).

use super::axis::{pow2_ticks, Axis, Frame};
use super::draw::{self, DrawResult, Header, Layout, LegendEntry, Mark, Spec};
use super::format::gpu_name;
use super::table::{stack_columns, Column, Table};
use super::theme::{category_color, Theme};
use crate::estimator::config::{Config, Unit};
use crate::estimator::expr::group_digits;
use crate::estimator::ledger::{Bytes, Category};
use crate::estimator::sweep::{BatchSweep, MAX_BATCH};
use crate::estimator::units::in_unit;
use plotters::coord::Shift;
use plotters::prelude::*;

/// The chart's data: the sweep and what it is drawn with.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchData {
    pub sweep: BatchSweep,
    pub model: String,
    pub gpu: String,
    pub unit: Unit,
    pub current: Option<(u64, Bytes)>,
}

impl BatchData {
    /// The sweep of `cfg`, drawn in its unit, without a marker.
    pub fn new(sweep: BatchSweep, cfg: &Config) -> BatchData {
        BatchData { sweep, model: cfg.display_name(), gpu: gpu_name(cfg), unit: cfg.unit, current: None }
    }

    pub fn peaks(&self) -> Vec<Bytes> {
        self.sweep.peaks()
    }

    /// "Largest micro-batch that fits: 13".
    pub fn limit_text(&self) -> String {
        match self.sweep.limit {
            None => "Does not fit even at micro-batch 1".into(),
            Some(b) if b >= MAX_BATCH => format!("Fits up to micro-batch {} (the search's end)", group_digits(b as u128)),
            Some(b) => format!("Largest micro-batch that fits: {}", group_digits(b as u128)),
        }
    }

    pub fn table(&self, theme: &Theme) -> Table {
        let mut columns = stack_columns(&self.sweep.stack);
        columns.push(Column {
            key: "peak_bytes".into(),
            label: "Peak".into(),
            color: theme.foreground,
            values: self.peaks().into_iter().map(Some).collect(),
        });
        Table {
            x_key: "micro_batch".into(),
            x_title: "Micro-batch per GPU".into(),
            x: self.sweep.batches.iter().map(|b| *b as f64).collect(),
            x_text: self.sweep.batches.iter().map(|b| format!("micro-batch {}", group_digits(*b as u128))).collect(),
            text_in_csv: false,
            columns,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "Peak memory per GPU of {} at {} tokens against the micro-batch from 1 to {}, stacked by category. {}.",
            self.model,
            group_digits(self.sweep.seq as u128),
            group_digits(self.sweep.range.1 as u128),
            self.limit_text()
        )
    }
}

/// The chart's title, legend and notes.
pub fn batch_header(data: &BatchData, theme: &Theme) -> Header {
    let d = &data.sweep;
    let mut legend: Vec<LegendEntry> = Category::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| d.stack.iter().any(|s| s[*i] > 0))
        .map(|(_, c)| LegendEntry::new(c.label(), category_color(*c), Mark::Area))
        .collect();
    legend.push(LegendEntry::new("Peak", theme.foreground, Mark::Line));
    legend.push(LegendEntry::new(format!("{} capacity", data.gpu), theme.alert, Mark::Line));
    let title = format!("Peak memory vs micro-batch — {}, {} tokens", data.model, group_digits(d.seq as u128));
    Header { title, legend, notes: vec![(super::seq::STACKED.to_string(), theme.foreground)] }
}

/// Draws the chart; returns where it put the data and its layout.
pub fn draw_batch<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, data: &BatchData, theme: &Theme) -> DrawResult<(Frame, Layout), DB> {
    let d = &data.sweep;
    let u = data.unit;
    let (w, _) = root.dim_in_pixel();
    let (lo, hi) = (d.range.0 as f64, d.range.1 as f64);
    let x = Axis::log(lo, hi).with_ticks(pow2_ticks(lo, hi)).with_light([]).thinned(draw::plot_width(w), 36.0, &[]);
    let peaks: Vec<f64> = data.peaks().into_iter().map(|b| in_unit(b, u)).collect();
    let cap = in_unit(d.capacity, u);
    let max = peaks.iter().copied().fold(0.0, f64::max);
    let min = peaks.iter().copied().fold(f64::INFINITY, f64::min);
    let top = if cap > 0.0 { max.min(cap * 2.0).max(cap * 1.15).max(min * 1.25) } else { max };
    let y = draw::memory_axis(top);
    let header = batch_header(data, theme);
    let y_title = draw::memory_title(u);
    let spec = Spec {
        header: &header,
        x,
        y: y.clone(),
        x_title: "Micro-batch per GPU (log scale)",
        y_title: &y_title,
        x_label: &|v| draw::num_label(v.round()),
        y_label: &|v| draw::num_label(v),
    };
    let (mut chart, mut layout) = draw::frame(root, &spec, theme)?;
    let xs: Vec<f64> = d.batches.iter().map(|b| *b as f64).collect();
    let layers: Vec<(RGBColor, Vec<f64>)> =
        Category::ALL.iter().enumerate().map(|(i, c)| (category_color(*c), d.stack.iter().map(|s| in_unit(s[i], u)).collect())).collect();
    draw::stack(&mut chart, &xs, &layers, 0.0)?;
    let pts: Vec<(f64, f64)> = xs.iter().copied().zip(peaks.iter().copied()).collect();
    draw::line(&mut chart, &pts, theme.foreground.stroke_width(2), false)?;
    draw::capacity(&mut chart, d.capacity, u, &data.gpu, true, theme, &mut layout.parts)?;
    if let Some((i, top)) = peaks.iter().copied().enumerate().max_by(|a, b| a.1.total_cmp(&b.1)) {
        draw::cut_note(&mut chart, u, top, &format!("the peak (micro-batch {})", xs[i]), theme, &mut layout.parts)?;
    }
    if let Some((b, peak)) = data.current {
        let at = (b as f64, in_unit(peak, u));
        if chart.as_coord_spec().x_spec().contains(at.0) && y.contains(at.1) {
            draw::dot(&mut chart, at, 5, theme.foreground, false)?;
            draw::label(&mut chart, &format!("now: {b}"), at, draw::font(theme, 12), false, theme, &mut layout.parts)?;
        }
    }
    let strong = draw::bold(theme, 13, theme.alert);
    let text = data.limit_text();
    match d.limit {
        Some(b) if (b as f64) < hi && d.capacity > 0 => {
            let at = (b as f64, cap);
            draw::vline(&mut chart, at.0, 0.0, cap, theme.alert.stroke_width(2))?;
            draw::dot(&mut chart, at, 5, theme.alert, true)?;
            draw::label_dy(
                &mut chart,
                &text,
                (at.0, if y.contains(cap) { cap } else { y.hi() }),
                strong,
                true,
                16,
                theme,
                &mut layout.parts,
            )?;
        }
        _ => draw::label(&mut chart, &text, (lo, y.hi()), strong, false, theme, &mut layout.parts)?,
    }
    let frame = draw::frame_of(&chart);
    root.present()?;
    Ok((frame, layout))
}

pub fn batch_svg(data: &BatchData, theme: &Theme, size: (u32, u32)) -> String {
    draw::svg_of(size, |root| draw_batch(root, data, theme).map(|_| ()))
}
