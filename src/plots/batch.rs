//! Memory vs micro-batch: the step's peak stacked by category (its composition at the peak
//! event, as in the sequence chart) for micro-batches 1, 2, 3, 4, 6, 8, …, the capacity, and the
//! largest micro-batch that fits, found exactly by search.

use super::axis::{pow2_ticks, Axis, Frame};
use super::draw::{self, DrawResult, LegendEntry, Mark, Spec};
use super::search::{largest_bracketed, MAX_BATCH};
use super::seq::octave_points;
use super::table::{stack_columns, Column, Table};
use super::{category_color, gpu_name, peak_composition, Theme};
use crate::estimator::config::{Config, Unit};
use crate::estimator::estimate;
use crate::estimator::expr::group_digits;
use crate::estimator::ledger::{Bytes, Category};
use crate::estimator::units::in_unit;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::collections::BTreeMap;

/// The chart's data.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchData {
    pub model: String,
    pub seq: u64,
    /// Micro-batches, ascending.
    pub batches: Vec<u64>,
    /// The step's peak by category at each micro-batch.
    pub stack: Vec<[Bytes; 6]>,
    /// The largest micro-batch that fits (`None`: not even 1).
    pub limit: Option<u64>,
    pub range: (u64, u64),
    pub capacity: Bytes,
    pub gpu: String,
    pub unit: Unit,
    pub current: Option<(u64, Bytes)>,
}

/// The axis' right end: twice the limit (so the crossing sits mid-chart), at least 64 and the
/// configured micro-batch, a power of two.
pub fn batch_top(limit: Option<u64>, current: u64) -> u64 {
    let want = limit.unwrap_or(1).saturating_mul(2).max(64).max(current);
    want.checked_next_power_of_two().unwrap_or(MAX_BATCH).min(MAX_BATCH)
}

/// Sweeps the micro-batch for `cfg`.
pub fn batch_data(cfg: &Config) -> BatchData {
    let capacity = crate::estimator::capacity(cfg);
    // Peaks by micro-batch, each estimated once (the search and the curve share them).
    let mut known: BTreeMap<u64, Option<[Bytes; 6]>> = BTreeMap::new();
    let mut at =
        |b: u64| *known.entry(b).or_insert_with(|| estimate(&Config { batch: b, ..cfg.clone() }).ok().map(|e| peak_composition(&e)));
    let fits_at = |c: Option<[Bytes; 6]>| c.is_some_and(|c| c.iter().sum::<Bytes>() <= capacity);
    // Doubling until it no longer fits brackets the largest micro-batch; a binary search between
    // the last two doublings finds it exactly.
    let mut samples = Vec::new();
    let mut b = 1;
    loop {
        let ok = fits_at(at(b));
        samples.push((b, ok));
        if !ok || b >= MAX_BATCH {
            break;
        }
        b *= 2;
    }
    let limit = largest_bracketed(&samples, 1, |b| fits_at(at(b)));
    let hi = batch_top(limit, cfg.batch);
    let mut batches = Vec::new();
    let mut stack = Vec::new();
    for b in octave_points(1, hi) {
        if let Some(c) = at(b) {
            batches.push(b);
            stack.push(c);
        }
    }
    BatchData {
        model: cfg.display_name(),
        seq: cfg.seq,
        batches,
        stack,
        limit,
        range: (1, hi),
        capacity,
        gpu: gpu_name(cfg),
        unit: cfg.unit,
        current: estimate(cfg).ok().map(|e| (cfg.batch, e.memory.peak)),
    }
}

impl BatchData {
    pub fn peaks(&self) -> Vec<Bytes> {
        self.stack.iter().map(|s| s.iter().sum()).collect()
    }

    /// "Largest micro-batch that fits: 13".
    pub fn limit_text(&self) -> String {
        match self.limit {
            None => "Does not fit even at micro-batch 1".into(),
            Some(b) if b >= MAX_BATCH => format!("Fits up to micro-batch {} (the search's end)", group_digits(b as u128)),
            Some(b) => format!("Largest micro-batch that fits: {}", group_digits(b as u128)),
        }
    }

    pub fn table(&self, theme: &Theme) -> Table {
        let mut columns = stack_columns(&self.stack);
        columns.push(Column {
            key: "peak_bytes".into(),
            label: "Peak".into(),
            color: theme.foreground,
            values: self.peaks().into_iter().map(Some).collect(),
        });
        Table {
            x_key: "micro_batch".into(),
            x_title: "Micro-batch per GPU".into(),
            x: self.batches.iter().map(|b| *b as f64).collect(),
            x_text: self.batches.iter().map(|b| format!("micro-batch {}", group_digits(*b as u128))).collect(),
            text_in_csv: false,
            columns,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "Peak memory per GPU of {} at {} tokens against the micro-batch from 1 to {}, stacked by category. {}.",
            self.model,
            group_digits(self.seq as u128),
            group_digits(self.range.1 as u128),
            self.limit_text()
        )
    }
}

/// Draws the chart; returns where it put the data.
pub fn draw_batch<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, data: &BatchData, theme: &Theme) -> DrawResult<Frame, DB> {
    let u = data.unit;
    let (w, _) = root.dim_in_pixel();
    let (lo, hi) = (data.range.0 as f64, data.range.1 as f64);
    let x = Axis::log(lo, hi).with_ticks(pow2_ticks(lo, hi)).with_light([]).thinned(draw::plot_width(w), 36.0, &[]);
    let peaks: Vec<f64> = data.peaks().into_iter().map(|b| in_unit(b, u)).collect();
    let cap = in_unit(data.capacity, u);
    let max = peaks.iter().copied().fold(0.0, f64::max);
    let min = peaks.iter().copied().fold(f64::INFINITY, f64::min);
    let top = if cap > 0.0 { max.min(cap * 2.0).max(cap * 1.15).max(min * 1.25) } else { max };
    let y = draw::memory_axis(top);
    let mut legend: Vec<LegendEntry> = Category::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| data.stack.iter().any(|s| s[*i] > 0))
        .map(|(_, c)| LegendEntry::new(c.label(), category_color(*c), Mark::Area))
        .collect();
    legend.push(LegendEntry::new("Peak", theme.foreground, Mark::Line));
    legend.push(LegendEntry::new(format!("{} capacity", data.gpu), theme.alert, Mark::Line));
    let title = format!("Peak memory vs micro-batch — {}, {} tokens", data.model, group_digits(data.seq as u128));
    let y_title = draw::memory_title(u);
    let spec = Spec {
        title: &title,
        legend: &legend,
        x,
        y: y.clone(),
        x_title: "Micro-batch per GPU (log scale)",
        y_title: &y_title,
        x_label: &|v| draw::num_label(v.round()),
        y_label: &|v| draw::num_label(v),
    };
    let mut chart = draw::frame(root, &spec, theme)?;
    let xs: Vec<f64> = data.batches.iter().map(|b| *b as f64).collect();
    let layers: Vec<(RGBColor, Vec<f64>)> = Category::ALL
        .iter()
        .enumerate()
        .map(|(i, c)| (category_color(*c), data.stack.iter().map(|s| in_unit(s[i], u)).collect()))
        .collect();
    draw::stack(&mut chart, &xs, &layers, 0.0)?;
    let pts: Vec<(f64, f64)> = xs.iter().copied().zip(peaks.iter().copied()).collect();
    draw::line(&mut chart, &pts, theme.foreground.stroke_width(2), false)?;
    draw::capacity(&mut chart, data.capacity, u, &data.gpu, true, theme)?;
    if let Some((b, peak)) = data.current {
        let at = (b as f64, in_unit(peak, u));
        if chart.as_coord_spec().x_spec().contains(at.0) && y.contains(at.1) {
            draw::dot(&mut chart, at, 5, theme.foreground, false)?;
            draw::label(&mut chart, &format!("now: {b}"), at, draw::font(theme, 12), false, theme)?;
        }
    }
    let strong = (draw::FONT, 13).into_font().style(FontStyle::Bold).color(&theme.alert);
    let text = data.limit_text();
    match data.limit {
        Some(b) if (b as f64) < hi && data.capacity > 0 => {
            let at = (b as f64, cap);
            draw::vline(&mut chart, at.0, 0.0, cap, theme.alert.stroke_width(2))?;
            draw::dot(&mut chart, at, 5, theme.alert, true)?;
            draw::label_dy(&mut chart, &text, (at.0, if y.contains(cap) { cap } else { y.hi() }), strong, true, 16, theme)?;
        }
        _ => draw::label(&mut chart, &text, (lo, y.hi()), strong, false, theme)?,
    }
    let frame = draw::frame_of(&chart);
    root.present()?;
    Ok(frame)
}

pub fn batch_svg(data: &BatchData, theme: &Theme, size: (u32, u32)) -> String {
    super::svg_of(size, |root| draw_batch(root, data, theme).map(|_| ()))
}
