//! Memory per GPU vs the number of GPUs, one line per data-parallel sharding: plain DDP, ZeRO-1
//! (optimizer states), ZeRO-2 (+ gradients), ZeRO-3 (+ parameters), and the configured FSDP
//! variant if it is one. Each line's fewest GPUs that fit is found exactly by search.
//!
//! GPU counts are multiples of the configured tp × pp × cp (one model replica), doubling from one
//! replica to 1,024 GPUs or the configured count if more.

use super::axis::{Axis, Frame};
use super::draw::{self, DrawResult, LegendEntry, Mark, Spec};
use super::search::{fits, model_parallel, smallest_bracketed};
use super::table::{Column, Table};
use super::{gpu_name, okabe_ito, Theme};
use crate::estimator::config::{Config, Offload, Unit, Zero};
use crate::estimator::estimate;
use crate::estimator::expr::group_digits;
use crate::estimator::ledger::Bytes;
use crate::estimator::units::in_unit;
use plotters::coord::Shift;
use plotters::prelude::*;

/// One sharding's line.
#[derive(Clone, Debug, PartialEq)]
pub struct StageLine {
    pub zero: Zero,
    pub label: String,
    pub color: RGBColor,
    /// Peak per GPU at each GPU count (`None`: the configuration is invalid there).
    pub peak: Vec<Option<Bytes>>,
    /// The fewest GPUs on which it fits.
    pub fewest: Option<u64>,
}

/// The chart's data.
#[derive(Clone, Debug, PartialEq)]
pub struct GpusData {
    pub model: String,
    pub gpus: Vec<u64>,
    pub lines: Vec<StageLine>,
    pub capacity: Bytes,
    pub gpu: String,
    pub unit: Unit,
    /// The configured sharding and GPU count with its peak.
    pub current: Option<(Zero, u64, Bytes)>,
}

/// The name of a sharding.
pub fn zero_label(z: Zero) -> &'static str {
    match z {
        Zero::Ddp => "DDP (no sharding)",
        Zero::Z1 => "ZeRO-1",
        Zero::Z2 => "ZeRO-2",
        Zero::Z3 => "ZeRO-3",
        Zero::FullShard => "FSDP full_shard",
        Zero::ShardGradOp => "FSDP shard_grad_op",
        Zero::HybridShard => "FSDP hybrid_shard",
    }
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

/// The shardings drawn for `cfg`: the four ZeRO stages, and its own if it is an FSDP one.
pub fn shardings(cfg: &Config) -> Vec<Zero> {
    let mut z = vec![Zero::Ddp, Zero::Z1, Zero::Z2, Zero::Z3];
    if !z.contains(&cfg.zero) {
        z.push(cfg.zero);
    }
    z
}

/// The GPU counts of the axis: one replica, doubling, up to 1,024 GPUs (or the configured count).
pub fn gpu_points(cfg: &Config) -> Vec<u64> {
    let mp = model_parallel(cfg);
    let top = (1024u64).max(mp).max(cfg.gpus);
    let mut v = Vec::new();
    let mut n = mp;
    while n <= top {
        v.push(n);
        n *= 2;
    }
    if cfg.gpus % mp == 0 && !v.contains(&cfg.gpus) {
        v.push(cfg.gpus);
        v.sort_unstable();
    }
    v
}

/// Sweeps the GPU count for every sharding.
pub fn gpus_data(cfg: &Config) -> GpusData {
    let gpus = gpu_points(cfg);
    let mp = model_parallel(cfg);
    let capacity = crate::estimator::capacity(cfg);
    let lines = shardings(cfg)
        .into_iter()
        .map(|zero| {
            // Offloading parameters needs ZeRO-3; the lower stages offload the optimizer only.
            let offload = if zero.stage() < 3 && cfg.offload == Offload::OptimizerParams { Offload::Optimizer } else { cfg.offload };
            let base = Config { zero, offload, ..cfg.clone() };
            let peak: Vec<Option<Bytes>> =
                gpus.iter().map(|&n| estimate(&Config { gpus: n, ..base.clone() }).ok().map(|e| e.memory.peak)).collect();
            // The fewest GPUs: binary search between the last sampled count that does not fit
            // and the first that does (exact; the doubling samples only bracket it).
            let samples: Vec<(u64, bool)> = gpus.iter().zip(&peak).map(|(n, p)| (*n, p.is_some_and(|p| p <= capacity))).collect();
            let fewest = smallest_bracketed(&samples, mp, |n| fits(&Config { gpus: n, ..base.clone() }));
            StageLine { zero, label: zero_label(zero).to_string(), color: zero_color(zero), peak, fewest }
        })
        .collect();
    GpusData {
        model: cfg.display_name(),
        gpus,
        lines,
        capacity,
        gpu: gpu_name(cfg),
        unit: cfg.unit,
        current: estimate(cfg).ok().map(|e| (cfg.zero, cfg.gpus, e.memory.peak)),
    }
}

impl GpusData {
    /// "ZeRO-3: fits from 4 GPUs".
    pub fn fewest_text(line: &StageLine) -> String {
        match line.fewest {
            Some(n) => format!("{}: fits from {} GPU{}", short(line.zero), group_digits(n as u128), if n == 1 { "" } else { "s" }),
            None => format!("{}: does not fit", short(line.zero)),
        }
    }

    pub fn table(&self, _theme: &Theme) -> Table {
        Table {
            x_key: "gpus".into(),
            x_title: "GPUs".into(),
            x: self.gpus.iter().map(|n| *n as f64).collect(),
            x_text: self.gpus.iter().map(|n| format!("{} GPU{}", group_digits(*n as u128), if *n == 1 { "" } else { "s" })).collect(),
            text_in_csv: false,
            columns: self
                .lines
                .iter()
                .map(|l| Column {
                    key: format!("{}_peak_bytes", key(l.zero)),
                    label: l.label.clone(),
                    color: l.color,
                    values: l.peak.clone(),
                })
                .collect(),
        }
    }

    pub fn describe(&self) -> String {
        let fits: Vec<String> = self.lines.iter().map(GpusData::fewest_text).collect();
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

fn key(z: Zero) -> &'static str {
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

/// Draws the chart; returns where it put the data.
pub fn draw_gpus<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, data: &GpusData, theme: &Theme) -> DrawResult<Frame, DB> {
    let u = data.unit;
    let (w, _) = root.dim_in_pixel();
    let lo = data.gpus.first().copied().unwrap_or(1) as f64;
    let hi = (data.gpus.last().copied().unwrap_or(2) as f64).max(lo * 2.0);
    let xs: Vec<f64> = data.gpus.iter().map(|n| *n as f64).collect();
    let x = Axis::log(lo, hi).with_ticks(xs.clone()).with_light([]).thinned(draw::plot_width(w), 34.0, &[lo]);
    let all = data.lines.iter().flat_map(|l| l.peak.iter().flatten()).map(|b| in_unit(*b, u));
    let cap = in_unit(data.capacity, u);
    let max = all.clone().fold(cap, f64::max);
    let min = all.fold(if cap > 0.0 { cap } else { f64::INFINITY }, f64::min);
    // A log memory axis: ZeRO-3 divides by the GPU count, so its line falls by decades.
    let y = Axis::log((min * 0.7).max(1e-6), (max * 1.4).max(min * 10.0));
    let current = data.current.map(|c| c.0);
    let mut legend: Vec<LegendEntry> = data
        .lines
        .iter()
        .map(|l| {
            LegendEntry::new(
                if Some(l.zero) == current { format!("{} (current)", l.label) } else { l.label.clone() },
                l.color,
                if dashed(l.zero) { Mark::Dashed } else { Mark::Line },
            )
        })
        .collect();
    legend.push(LegendEntry::new(format!("{} capacity", data.gpu), theme.alert, Mark::Line));
    let title = format!("Peak memory per GPU vs number of GPUs — {}", data.model);
    let y_title = format!("{}, log scale", draw::memory_title(u));
    let spec = Spec {
        title: &title,
        legend: &legend,
        x,
        y: y.clone(),
        x_title: "GPUs (log scale)",
        y_title: &y_title,
        x_label: &|v| draw::num_label(v.round()),
        y_label: &|v| draw::num_label(v),
    };
    let mut chart = draw::frame(root, &spec, theme)?;
    let mut order: Vec<&StageLine> = data.lines.iter().collect();
    order.sort_by_key(|l| dashed(l.zero));
    for l in order {
        let pts: Vec<(f64, f64)> = xs.iter().copied().zip(l.peak.iter().map(|b| b.map_or(f64::NAN, |b| in_unit(b, u)))).collect();
        // ZeRO-1 and the FSDP variants are dashed: they often coincide with another line (at the
        // peak ZeRO-1 and ZeRO-2 may hold the same), and a dashed line on top shows both.
        let width = if Some(l.zero) == current { 4 } else { 2 };
        draw::line(&mut chart, &pts, l.color.stroke_width(width + u32::from(dashed(l.zero))), dashed(l.zero))?;
        for p in pts.iter().filter(|p| p.1.is_finite()) {
            draw::dot(&mut chart, *p, 3, l.color, true)?;
        }
    }
    draw::capacity(&mut chart, data.capacity, u, &data.gpu, false, theme)?;
    if let Some((_, n, peak)) = data.current {
        let at = (n as f64, in_unit(peak, u));
        if chart.as_coord_spec().x_spec().contains(at.0) && y.contains(at.1) {
            draw::dot(&mut chart, at, 7, theme.foreground, false)?;
        }
    }
    // The fewest GPUs of each sharding: a dot on the capacity line; the figures in a corner.
    if data.capacity > 0 && y.contains(cap) {
        for l in &data.lines {
            if let Some(n) = l.fewest {
                draw::dot(&mut chart, (n as f64, cap), 6, l.color, true)?;
            }
        }
    }
    let note: Vec<(String, RGBColor)> = data.lines.iter().map(|l| (GpusData::fewest_text(l), l.color)).collect();
    draw::corner_note(&mut chart, &note, draw::Corner::TopRight, theme)?;
    let frame = draw::frame_of(&chart);
    root.present()?;
    Ok(frame)
}

pub fn gpus_svg(data: &GpusData, theme: &Theme, size: (u32, u32)) -> String {
    super::svg_of(size, |root| draw_gpus(root, data, theme).map(|_| ()))
}
