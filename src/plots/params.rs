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
use super::draw::{self, DrawResult, LegendEntry, Mark, Spec};
use super::search::{fits, largest_bracketed};
use super::table::{Column, Table};
use super::{gpu_name, okabe_ito, params_label, Theme};
use crate::estimator::config::{Config, Unit, Zero};
use crate::estimator::estimate;
use crate::estimator::ledger::Bytes;
use crate::estimator::model::ModelSpec;
use crate::estimator::presets::{preset, presets};
use crate::estimator::units::{format_count, in_unit};
use plotters::coord::Shift;
use plotters::prelude::*;

/// The GPU counts compared.
pub const GPU_COUNTS: [u64; 3] = [1, 8, 64];

/// A preset of the family, estimated as configured on each GPU count.
#[derive(Clone, Debug, PartialEq)]
pub struct PresetMark {
    pub id: String,
    /// The tick label: "8B", "70B", "0.5B", "124M".
    pub short: String,
    pub params: u64,
    /// Peak per GPU on each of [`GPU_COUNTS`].
    pub peak: Vec<Option<Bytes>>,
}

/// The chart's data.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamsData {
    pub model: String,
    pub family: Option<String>,
    pub zero: Zero,
    /// Parameter counts of the scaled models, ascending.
    pub params: Vec<u64>,
    /// Peak per GPU, `[gpu count][point]`.
    pub peak: Vec<Vec<Option<Bytes>>>,
    /// Parameters + gradients + optimizer states per GPU, `[gpu count][point]`.
    pub statics: Vec<Vec<Option<Bytes>>>,
    /// Activations per GPU (on one GPU; data parallelism does not change them).
    pub activations: Vec<Option<Bytes>>,
    /// The largest scaled model that fits on each GPU count (parameters).
    pub limits: Vec<Option<u64>>,
    /// The axis' range of parameter counts.
    pub range: (u64, u64),
    pub presets: Vec<PresetMark>,
    pub capacity: Bytes,
    pub gpu: String,
    pub unit: Unit,
    /// The configured model's parameter count.
    pub current: Option<u64>,
}

/// The architecture scaled by `k`: attention heads (in whole key/value groups) and with them the
/// hidden and MLP sizes by about `k`, layers so that `hidden² × layers` grows as `k³`.
pub fn scaled(arch: &ModelSpec, k: f64) -> ModelSpec {
    let mut m = arch.clone();
    let group = if arch.kv_heads > 0 && arch.heads % arch.kv_heads == 0 { arch.heads / arch.kv_heads } else { 1 };
    let groups = ((arch.heads as f64 * k / group as f64).round() as u64).max(1);
    m.heads = groups * group;
    // One key/value head per group (a model whose heads do not group evenly becomes MHA).
    m.kv_heads = groups;
    let w = m.heads as f64 / arch.heads.max(1) as f64;
    let round64 = |v: f64| ((v / 64.0).round() as u64).max(1) * 64;
    m.hidden = if arch.hidden == arch.heads * arch.head_dim { m.heads * arch.head_dim } else { round64(arch.hidden as f64 * w) };
    let wf = m.hidden as f64 / arch.hidden.max(1) as f64;
    let scale = |v: u64| if v == 0 { 0 } else { round64(v as f64 * wf) };
    m.ffn = scale(arch.ffn);
    m.expert_ffn = scale(arch.expert_ffn);
    m.shared_ffn = scale(arch.shared_ffn);
    m.embed_proj = scale(arch.embed_proj);
    m.layers = ((arch.layers as f64 * k * k * k / (wf * wf)).round() as u64).max(1);
    m.dense_layers = arch.dense_layers.min(m.layers);
    m
}

fn params_of(arch: &ModelSpec) -> u64 {
    arch.counts().total
}

/// The scale factor whose model has about (at least) `target` parameters (bisection on ln k).
fn k_for(arch: &ModelSpec, target: f64, k_lo: f64, k_hi: f64) -> f64 {
    let (mut a, mut b) = (k_lo.ln(), k_hi.ln());
    for _ in 0..24 {
        let m = 0.5 * (a + b);
        if (params_of(&scaled(arch, m.exp())) as f64) < target {
            a = m;
        } else {
            b = m;
        }
    }
    // The upper end: its model has at least `target` parameters.
    b.exp()
}

/// `cfg` with architecture `arch` on `n` GPUs: its own tensor/pipeline/context parallelism if
/// that divides `n`, plain data parallelism otherwise.
pub fn on_gpus(cfg: &Config, arch: &ModelSpec, n: u64) -> Config {
    let c = Config { model: "custom".into(), arch: arch.clone(), gpus: n, ..cfg.clone() };
    if crate::estimator::validate(&c).is_ok() {
        c
    } else {
        Config { tp: 1, pp: 1, cp: 1, ep: 1, vpp: 1, ..c }
    }
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

/// Sweeps the parameter count for `cfg`.
pub fn params_data(cfg: &Config) -> ParamsData {
    let arch = &cfg.arch;
    let group = if arch.kv_heads > 0 && arch.heads % arch.kv_heads == 0 { arch.heads / arch.kv_heads } else { 1 };
    // The smallest shape: one key/value group of heads.
    let k_min = group as f64 / arch.heads.max(1) as f64;
    let k_max = 64.0;
    let p_min = params_of(&scaled(arch, k_min)) as f64;
    let lo = p_min.max(1e8);
    let current = params_of(arch);
    let hi = 1e12f64.max(current as f64);
    // Three points a decade, evenly spaced on the log axis, snapped to a fine grid of scale
    // factors (GRID steps from one end to the other) on which the limits are then searched.
    let (k_lo, k_hi) = (k_for(arch, lo, k_min, k_max), k_for(arch, hi, k_min, k_max));
    const GRID: u64 = 2000;
    let k_at = |i: u64| k_lo * (k_hi / k_lo).powf(i as f64 / GRID as f64);
    let index_of = |k: f64| ((k / k_lo).ln() / (k_hi / k_lo).ln() * GRID as f64).round().clamp(0.0, GRID as f64) as u64;
    let n = (((hi / lo).log10() * 3.0).ceil() as usize).max(4);
    let mut idx: Vec<u64> = (0..=n)
        .map(|i| match i {
            0 => 0,
            _ if i == n => GRID,
            _ => index_of(k_for(arch, lo * (hi / lo).powf(i as f64 / n as f64), k_lo, k_hi)),
        })
        .collect();
    idx.dedup();
    let mut params: Vec<u64> = Vec::new();
    let mut archs: Vec<ModelSpec> = Vec::new();
    let mut grid: Vec<u64> = Vec::new();
    for i in idx {
        let a = scaled(arch, k_at(i));
        let p = params_of(&a);
        // Keep the x values ascending (rounding heads can make a step go backwards).
        if params.last().is_none_or(|last| p > *last) {
            params.push(p);
            archs.push(a);
            grid.push(i);
        }
    }
    let mut peak = Vec::new();
    let mut statics = Vec::new();
    let mut activations = vec![None; archs.len()];
    for (gi, &g) in GPU_COUNTS.iter().enumerate() {
        let mut p = Vec::new();
        let mut s = Vec::new();
        for (i, a) in archs.iter().enumerate() {
            let e = estimate(&on_gpus(cfg, a, g)).ok();
            p.push(e.as_ref().map(|e| e.memory.peak));
            s.push(e.as_ref().map(|e| e.memory.parameters + e.memory.gradients + e.memory.optimizer_states));
            if gi == 0 {
                activations[i] = e.as_ref().map(|e| e.memory.activations);
            }
        }
        peak.push(p);
        statics.push(s);
    }
    // The largest scaled model that fits on each GPU count: binary search on the grid of scale
    // factors between the last sample that fits and the first that does not.
    let capacity = crate::estimator::capacity(cfg);
    let limits = GPU_COUNTS
        .iter()
        .enumerate()
        .map(|(gi, &g)| {
            let samples: Vec<(u64, bool)> = grid.iter().zip(&peak[gi]).map(|(i, p)| (*i, p.is_some_and(|p| p <= capacity))).collect();
            largest_bracketed(&samples, 0, |i| fits(&on_gpus(cfg, &scaled(arch, k_at(i)), g))).map(|i| params_of(&scaled(arch, k_at(i))))
        })
        .collect();
    let family = preset(&cfg.model).map(|p| p.family.to_string());
    let presets = family
        .as_ref()
        .map(|f| {
            presets()
                .into_iter()
                .filter(|p| p.family == f)
                .map(|p| {
                    let params = params_of(&p.spec);
                    PresetMark {
                        id: p.id.to_string(),
                        short: short_size(p.id, params),
                        params,
                        peak: GPU_COUNTS
                            .iter()
                            .map(|&g| estimate(&Config { model: p.id.to_string(), ..on_gpus(cfg, &p.spec, g) }).ok().map(|e| e.memory.peak))
                            .collect(),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    ParamsData {
        model: cfg.display_name(),
        family,
        zero: cfg.zero,
        range: (params.first().copied().unwrap_or(1), params.last().copied().unwrap_or(2)),
        params,
        peak,
        statics,
        activations,
        limits,
        presets,
        capacity,
        gpu: gpu_name(cfg),
        unit: cfg.unit,
        current: Some(current),
    }
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
    /// "8 GPUs: up to 13.2B".
    pub fn limit_text(&self, gi: usize) -> String {
        let n = gpus_word(GPU_COUNTS[gi]);
        match self.limits.get(gi).copied().flatten() {
            None => format!("{n}: none of these fit"),
            Some(p) if p >= self.range.1 => format!("{n}: all fit (up to {})", format_count(p)),
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
                values: self.peak[gi].clone(),
            });
        }
        for (gi, &g) in GPU_COUNTS.iter().enumerate() {
            columns.push(Column {
                key: format!("static_{g}_gpus_bytes"),
                label: format!("Params + grads + optimizer, {}", gpus_word(g)),
                color: COLORS[gi],
                values: self.statics[gi].clone(),
            });
        }
        columns.push(Column {
            key: "activations_bytes".into(),
            label: "Activations".into(),
            color: okabe_ito::VERMILLION,
            values: self.activations.clone(),
        });
        Table {
            x_key: "parameters".into(),
            x_title: "Parameters".into(),
            x: self.params.iter().map(|p| *p as f64).collect(),
            x_text: self.params.iter().map(|p| format!("{} parameters", format_count(*p))).collect(),
            text_in_csv: false,
            columns,
        }
    }

    pub fn describe(&self) -> String {
        let limits: Vec<String> = (0..GPU_COUNTS.len()).map(|i| self.limit_text(i)).collect();
        format!(
            "Peak memory per GPU against the parameter count of {} scaled from {} to {}, on 1, 8 and 64 GPUs under {}, with the static memory and the activations. Largest that fits: {}.",
            self.model,
            format_count(self.range.0),
            format_count(self.range.1),
            super::gpus::zero_label(self.zero),
            limits.join("; ")
        )
    }
}

/// Draws the chart; returns where it put the data.
pub fn draw_params<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, data: &ParamsData, theme: &Theme) -> DrawResult<Frame, DB> {
    let u = data.unit;
    let (w, _) = root.dim_in_pixel();
    let (lo, hi) = (data.range.0 as f64, (data.range.1 as f64).max(data.range.0 as f64 * 10.0));
    let (decades, light) = super::axis::decade_ticks(lo, hi);
    let preset_ticks: Vec<f64> = data.presets.iter().map(|p| p.params as f64).collect();
    let ticks = preset_ticks.iter().copied().chain(decades.iter().copied());
    let x = Axis::log(lo, hi).with_ticks(ticks).with_light(light).thinned(draw::plot_width(w), 40.0, &preset_ticks);
    let all = data
        .peak
        .iter()
        .chain(data.statics.iter())
        .flat_map(|v| v.iter().flatten())
        .chain(data.activations.iter().flatten())
        .map(|b| in_unit(*b, u))
        .filter(|v| *v > 0.0);
    let cap = in_unit(data.capacity, u);
    let max = all.clone().fold(cap, f64::max);
    let min = all.fold(if cap > 0.0 { cap } else { f64::INFINITY }, f64::min);
    let y = Axis::log((min * 0.7).max(1e-6), (max * 1.4).max(min * 10.0));
    let mut legend: Vec<LegendEntry> =
        GPU_COUNTS.iter().zip(COLORS).map(|(g, c)| LegendEntry::new(format!("Peak, {}", gpus_word(*g)), c, Mark::Line)).collect();
    legend.push(LegendEntry::new("Params + grads + optimizer (dashed, per GPU count)", theme.muted, Mark::Dashed));
    legend.push(LegendEntry::new("Activations", okabe_ito::VERMILLION, Mark::Dashed));
    if !data.presets.is_empty() {
        legend.push(LegendEntry::new(format!("{} presets", data.family.clone().unwrap_or_default()), theme.foreground, Mark::Dot));
    }
    legend.push(LegendEntry::new(format!("{} capacity", data.gpu), theme.alert, Mark::Line));
    let title = format!("Peak memory vs model size — {} scaled, {}", data.model, super::gpus::zero_label(data.zero));
    let y_title = format!("{}, log scale", draw::memory_title(u));
    let names: Vec<(f64, String)> = data.presets.iter().map(|p| (p.params as f64, p.short.clone())).collect();
    let x_label = move |v: f64| names.iter().find(|(p, _)| (p / v - 1.0).abs() < 1e-9).map_or_else(|| params_label(v), |(_, s)| s.clone());
    let spec = Spec {
        title: &title,
        legend: &legend,
        x,
        y: y.clone(),
        x_title: "Parameters (log scale; current architecture scaled)",
        y_title: &y_title,
        x_label: &x_label,
        y_label: &|v| draw::num_label(v),
    };
    let mut chart = draw::frame(root, &spec, theme)?;
    let xs: Vec<f64> = data.params.iter().map(|p| *p as f64).collect();
    let series = |v: &[Option<Bytes>]| -> Vec<(f64, f64)> {
        xs.iter().copied().zip(v.iter().map(|b| b.map_or(f64::NAN, |b| in_unit(b, u)))).collect()
    };
    draw::line(&mut chart, &series(&data.activations), okabe_ito::VERMILLION.stroke_width(2), true)?;
    for ((statics, peak), color) in data.statics.iter().zip(&data.peak).zip(COLORS) {
        draw::line(&mut chart, &series(statics), color.stroke_width(2), true)?;
        draw::line(&mut chart, &series(peak), color.stroke_width(3), false)?;
    }
    for p in &data.presets {
        for (gi, b) in p.peak.iter().enumerate() {
            if let Some(b) = b {
                let at = (p.params as f64, in_unit(*b, u));
                if y.contains(at.1) {
                    draw::dot(&mut chart, at, 5, COLORS[gi], false)?;
                }
            }
        }
    }
    draw::capacity(&mut chart, data.capacity, u, &data.gpu, true, theme)?;
    if let Some(c) = data.current {
        let cx = c as f64;
        if chart.as_coord_spec().x_spec().contains(cx) {
            draw::vline(&mut chart, cx, y.lo(), y.hi(), theme.muted.stroke_width(1))?;
            draw::label(&mut chart, &format!("{} ({})", data.model, format_count(c)), (cx, y.hi()), draw::font(theme, 12), false, theme)?;
        }
    }
    // Where each GPU count stops fitting: a dot on the capacity line; the figures in a corner.
    if data.capacity > 0 && y.contains(cap) {
        for (gi, (limit, color)) in data.limits.iter().zip(COLORS).enumerate() {
            if let Some(p) = limit.filter(|p| (*p as f64) < hi && (*p as f64) >= lo) {
                draw::dot(&mut chart, (p as f64, cap), 6 - gi as u32, color, true)?;
            }
        }
    }
    let mut note = vec![("Largest that fits:".to_string(), theme.foreground)];
    note.extend((0..GPU_COUNTS.len()).map(|gi| (data.limit_text(gi), COLORS[gi])));
    draw::corner_note(&mut chart, &note, draw::Corner::BottomRight, theme)?;
    let frame = draw::frame_of(&chart);
    root.present()?;
    Ok(frame)
}

pub fn params_svg(data: &ParamsData, theme: &Theme, size: (u32, u32)) -> String {
    super::svg_of(size, |root| draw_params(root, data, theme).map(|_| ()))
}
