//! Memory per GPU vs the number of GPUs, one line per data-parallel sharding: plain DDP, ZeRO-1
//! (optimizer states), ZeRO-2 (+ gradients), ZeRO-3 (+ parameters), and the configured FSDP
//! variant if it is one. Each line's fewest GPUs that fit is found exactly by search.
//!
//! GPU counts are multiples of the configured tp × pp × cp (one model replica), doubling from one
//! replica to 1,024 GPUs or the configured count if more.

use super::axis::{Axis, Frame};
use super::draw::{self, DrawResult, Header, Layout, LegendEntry, Mark, Spec};
use super::format::{gpu_name, zero_label};
use super::table::{Column, Table};
use super::theme::{okabe_ito, Theme};
use crate::estimator::config::{Config, Unit, Zero};
use crate::estimator::expr::group_digits;
use crate::estimator::ledger::Bytes;
use crate::estimator::sweep::{GpusSweep, ShardingLine};
use crate::estimator::units::in_unit;
use plotters::coord::Shift;
use plotters::prelude::*;

/// The chart's data: the sweep and what it is drawn with.
#[derive(Clone, Debug, PartialEq)]
pub struct GpusData {
    pub sweep: GpusSweep,
    pub model: String,
    pub gpu: String,
    pub unit: Unit,
    /// The configured sharding and GPU count with its peak.
    pub current: Option<(Zero, u64, Bytes)>,
}

fn zero_color(z: Zero) -> RGBColor {
    use okabe_ito::*;
    match z {
        Zero::Ddp => ORANGE,
        Zero::Z1 => SKY_BLUE,
        Zero::Z2 => GREEN,
        Zero::Z3 => BLUE,
        Zero::FullShard | Zero::ShardGradOp | Zero::HybridShard => PURPLE,
    }
}

/// A sharding's colour in the chart.
pub fn line_color(z: Zero) -> RGBColor {
    zero_color(z)
}

impl GpusData {
    /// The sweep of `cfg`, drawn in its unit, without a marker.
    pub fn new(sweep: GpusSweep, cfg: &Config) -> GpusData {
        GpusData { sweep, model: cfg.display_name(), gpu: gpu_name(cfg), unit: cfg.unit, current: None }
    }

    /// "ZeRO-3: fits from 4 GPUs".
    pub fn fewest_text(line: &ShardingLine) -> String {
        match line.fewest {
            Some(n) => format!("{}: fits from {} GPU{}", short(line.zero), group_digits(n as u128), if n == 1 { "" } else { "s" }),
            None => format!("{}: does not fit", short(line.zero)),
        }
    }

    pub fn table(&self, _theme: &Theme) -> Table {
        Table {
            x_key: "gpus".into(),
            x_title: "GPUs".into(),
            x: self.sweep.gpus.iter().map(|n| *n as f64).collect(),
            x_text: self.sweep.gpus.iter().map(|n| format!("{} GPU{}", group_digits(*n as u128), if *n == 1 { "" } else { "s" })).collect(),
            text_in_csv: false,
            columns: self
                .sweep
                .lines
                .iter()
                .map(|l| Column {
                    key: format!("{}_peak_bytes", key(l.zero)),
                    label: zero_label(l.zero).to_string(),
                    color: zero_color(l.zero),
                    values: l.peak.clone(),
                })
                .collect(),
        }
    }

    pub fn describe(&self) -> String {
        let fits: Vec<String> = self.sweep.lines.iter().map(GpusData::fewest_text).collect();
        format!("Peak memory per GPU of {} against the number of GPUs, one line per sharding. {}.", self.model, fits.join("; "))
    }
}

fn dashed(z: Zero) -> bool {
    !matches!(z, Zero::Ddp | Zero::Z2 | Zero::Z3)
}

fn short(z: Zero) -> &'static str {
    match z {
        Zero::Ddp => "DDP",
        other => zero_label(other),
    }
}

pub(crate) fn key(z: Zero) -> &'static str {
    match z {
        Zero::Ddp => "ddp",
        Zero::Z1 => "zero1",
        Zero::Z2 => "zero2",
        Zero::Z3 => "zero3",
        Zero::FullShard => "full_shard",
        Zero::ShardGradOp => "shard_grad_op",
        Zero::HybridShard => "hybrid_shard",
    }
}

/// The chart's title, legend and notes (the fewest GPUs of each sharding).
pub fn gpus_header(data: &GpusData, theme: &Theme) -> Header {
    let current = data.current.map(|c| c.0);
    let mut legend: Vec<LegendEntry> = data
        .sweep
        .lines
        .iter()
        .map(|l| {
            let label = zero_label(l.zero);
            LegendEntry::new(
                if Some(l.zero) == current { format!("{label} (current)") } else { label.to_string() },
                zero_color(l.zero),
                if dashed(l.zero) { Mark::Dashed } else { Mark::Line },
            )
        })
        .collect();
    legend.push(LegendEntry::new(format!("{} capacity", data.gpu), theme.alert, Mark::Line));
    let title = format!("Peak memory per GPU vs number of GPUs — {}", data.model);
    let notes = data.sweep.lines.iter().map(|l| (GpusData::fewest_text(l), zero_color(l.zero))).collect();
    Header { title, legend, notes }
}

/// Draws the chart; returns where it put the data and its layout.
pub fn draw_gpus<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, data: &GpusData, theme: &Theme) -> DrawResult<(Frame, Layout), DB> {
    let d = &data.sweep;
    let u = data.unit;
    let (w, _) = root.dim_in_pixel();
    let lo = d.gpus.first().copied().unwrap_or(1) as f64;
    let hi = (d.gpus.last().copied().unwrap_or(2) as f64).max(lo * 2.0);
    let xs: Vec<f64> = d.gpus.iter().map(|n| *n as f64).collect();
    let x = Axis::log(lo, hi).with_ticks(xs.clone()).with_light([]).thinned(draw::plot_width(w), 34.0, &[lo]);
    let all = d.lines.iter().flat_map(|l| l.peak.iter().flatten()).map(|b| in_unit(*b, u));
    let cap = in_unit(d.capacity, u);
    let max = all.clone().fold(cap, f64::max);
    let min = all.fold(if cap > 0.0 { cap } else { f64::INFINITY }, f64::min);
    // A log memory axis: ZeRO-3 divides by the GPU count, so its line falls by decades.
    let y = Axis::log((min * 0.7).max(1e-6), (max * 1.4).max(min * 10.0));
    let current = data.current.map(|c| c.0);
    let header = gpus_header(data, theme);
    let y_title = format!("{}, log scale", draw::memory_title(u));
    let spec = Spec {
        header: &header,
        x,
        y: y.clone(),
        x_title: "GPUs (log scale)",
        y_title: &y_title,
        x_label: &|v| draw::num_label(v.round()),
        y_label: &|v| draw::num_label(v),
    };
    let (mut chart, mut layout) = draw::frame(root, &spec, theme)?;
    // Solid lines first, dashed ones on top: ZeRO-1 and the FSDP variants often coincide with
    // another line (at the peak ZeRO-1 and ZeRO-2 may hold the same), and a dashed line on top
    // shows both.
    for pass_dashed in [false, true] {
        for l in d.lines.iter().filter(|l| dashed(l.zero) == pass_dashed) {
            let color = zero_color(l.zero);
            let pts: Vec<(f64, f64)> = xs.iter().copied().zip(l.peak.iter().map(|b| b.map_or(f64::NAN, |b| in_unit(b, u)))).collect();
            let width = if Some(l.zero) == current { 4 } else { 2 };
            draw::line(&mut chart, &pts, color.stroke_width(width + u32::from(dashed(l.zero))), dashed(l.zero))?;
            for p in pts.iter().filter(|p| p.1.is_finite()) {
                draw::dot(&mut chart, *p, 3, color, true)?;
            }
        }
    }
    draw::capacity(&mut chart, d.capacity, u, &data.gpu, false, theme, &mut layout.parts)?;
    if let Some((_, n, peak)) = data.current {
        let at = (n as f64, in_unit(peak, u));
        if chart.as_coord_spec().x_spec().contains(at.0) && y.contains(at.1) {
            draw::dot(&mut chart, at, 7, theme.foreground, false)?;
        }
    }
    // The fewest GPUs of each sharding: a dot on the capacity line (the figures are notes).
    if d.capacity > 0 && y.contains(cap) {
        for l in &d.lines {
            if let Some(n) = l.fewest {
                draw::dot(&mut chart, (n as f64, cap), 6, zero_color(l.zero), true)?;
            }
        }
    }
    let frame = draw::frame_of(&chart);
    root.present()?;
    Ok((frame, layout))
}

pub fn gpus_svg(data: &GpusData, theme: &Theme, size: (u32, u32)) -> String {
    draw::svg_of(size, |root| draw_gpus(root, data, theme).map(|_| ()))
}
