//! The step timeline: memory in use after each event of one simulated training step (forward
//! layer by layer, loss, backward, gradient reduction, optimizer step), stacked by category, the
//! peak marked with its event — the analytic twin of PyTorch's memory snapshot viewer.

use super::axis::{Axis, Frame};
use super::draw::{self, DrawResult, Header, Layout, LegendEntry, Mark, Spec};
use super::format::gpu_name;
use super::table::{key_of, Column, Table};
use super::theme::{category_color, Theme};
use crate::estimator::config::{Config, Unit};
use crate::estimator::ledger::{Bytes, Category};
use crate::estimator::reserve::StepTrace;
use crate::estimator::step::Phase;
use crate::estimator::timeline::{EventKind, OVERHEAD};
use crate::estimator::units::{format_bytes, in_unit};
use crate::estimator::Estimate;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One event of the step.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub kind: EventKind,
    /// 1-based decoder layer of a layer event, 0 otherwise.
    pub layer: u32,
    pub label: String,
    pub by_category: [Bytes; 6],
    /// What the caching allocator holds at this point plus what lives outside it (the
    /// op-level trace under `kernels=cuda`), drawn as a band above the allocated memory.
    pub reserved: Option<Bytes>,
}

/// The chart's data.
#[derive(Clone, Debug, PartialEq)]
pub struct TimelineData {
    pub model: String,
    pub steps: Vec<Step>,
    /// Index of the peak event.
    pub peak: usize,
    pub capacity: Bytes,
    pub gpu: String,
    pub unit: Unit,
}

/// The timeline of an estimate.
pub fn timeline_data(e: &Estimate, cfg: &Config) -> TimelineData {
    TimelineData {
        model: e.model.clone(),
        steps: e
            .timeline
            .events
            .iter()
            .map(|ev| {
                // bitsandbytes' paged states the driver evicted to the host are not on the GPU.
                let mut by_category = ev.by_category;
                by_category[OVERHEAD] = by_category[OVERHEAD].saturating_sub(e.memory.paged_evicted);
                Step { kind: ev.kind, layer: ev.layer, label: ev.label(), by_category, reserved: None }
            })
            .collect(),
        peak: e.timeline.peak,
        capacity: e.capacity,
        gpu: gpu_name(cfg),
        unit: cfg.unit,
    }
}

/// The timeline of the step op by op ([`StepTrace`]): each point stacked by category (weights,
/// gradients, optimizer states, saved activations, temporaries, and what lives outside the
/// allocator — CUDA context, cuBLAS workspaces, NCCL buffers), with the caching allocator's
/// reserved memory above it.
pub fn trace_data(t: &StepTrace, e: &Estimate, cfg: &Config) -> TimelineData {
    // What lives outside the allocator and on the GPU: bitsandbytes' paged states the driver
    // evicted to the host are not.
    let outside: Bytes = e.components.iter().filter(|r| r.id.outside_allocator()).map(|r| r.bytes).sum::<Bytes>() - e.memory.paged_evicted;
    let (mut layers_seen, mut backward_layers_seen) = (false, false);
    let steps = t
        .points
        .iter()
        .map(|p| {
            let kind = match (p.phase, p.layer) {
                (Phase::Forward, Some(_)) => {
                    layers_seen = true;
                    EventKind::ForwardLayer
                }
                (Phase::Forward, None) if !layers_seen => EventKind::Embedding,
                (Phase::Forward | Phase::Loss, _) => EventKind::LossForward,
                (Phase::Backward, Some(_)) => {
                    backward_layers_seen = true;
                    EventKind::BackwardLayer
                }
                (Phase::Backward, None) if !backward_layers_seen => EventKind::LossBackward,
                (Phase::Backward, None) => EventKind::EmbeddingBackward,
                (Phase::Reduction, _) => EventKind::GradientReduction,
                (Phase::Optimizer | Phase::ZeroGrad, _) => EventKind::OptimizerStep,
            };
            let mut by_category = [0; 6];
            for (i, c) in Category::ALL.iter().enumerate() {
                by_category[i] = match c {
                    Category::Parameters => p.weights,
                    Category::Gradients => p.gradients + p.resident_gradients,
                    Category::OptimizerStates => p.optimizer,
                    Category::Activations => p.activations,
                    Category::Transient => p.transient + p.other_resident,
                    Category::FrameworkOverhead => outside,
                };
            }
            Step {
                kind,
                layer: p.layer.map_or(0, |l| l + 1),
                label: p.label.clone(),
                by_category,
                reserved: p.reserved.map(|r| r + outside),
            }
        })
        .collect();
    TimelineData { model: e.model.clone(), steps, peak: t.peak, capacity: e.capacity, gpu: gpu_name(cfg), unit: cfg.unit }
}

impl TimelineData {
    /// The largest reserved memory of the trace (with what lives outside the allocator).
    pub fn reserved_peak(&self) -> Option<Bytes> {
        self.steps.iter().filter_map(|s| s.reserved).max()
    }

    pub fn totals(&self) -> Vec<Bytes> {
        self.steps.iter().map(|s| s.by_category.iter().sum()).collect()
    }

    pub fn peak_bytes(&self) -> Bytes {
        self.steps.get(self.peak).map_or(0, |s| s.by_category.iter().sum())
    }

    /// "Peak 150.2 GB at loss + LM head backward".
    pub fn peak_text(&self) -> String {
        match self.steps.get(self.peak) {
            Some(s) => match self.reserved_peak() {
                Some(r) => format!(
                    "Peak {} allocated at {}; {} reserved",
                    format_bytes(self.peak_bytes(), self.unit),
                    s.label,
                    format_bytes(r, self.unit)
                ),
                None => format!("Peak {} at {}", format_bytes(self.peak_bytes(), self.unit), s.label),
            },
            None => "No step simulated".into(),
        }
    }

    pub fn table(&self, theme: &Theme) -> Table {
        let mut columns: Vec<Column> = Category::ALL
            .iter()
            .enumerate()
            .filter(|(i, _)| self.steps.iter().any(|s| s.by_category[*i] > 0))
            .map(|(i, c)| Column {
                key: key_of(c.label()),
                label: c.label().to_string(),
                color: category_color(*c),
                values: self.steps.iter().map(|s| Some(s.by_category[i])).collect(),
            })
            .collect();
        columns.push(Column {
            key: "total_bytes".into(),
            label: "In use".into(),
            color: theme.foreground,
            values: self.totals().into_iter().map(Some).collect(),
        });
        if self.reserved_peak().is_some() {
            columns.push(Column {
                key: "reserved_bytes".into(),
                label: "Reserved (simulated)".into(),
                color: theme.muted,
                values: self.steps.iter().map(|s| s.reserved).collect(),
            });
        }
        Table {
            x_key: "event".into(),
            x_title: "Event of the step".into(),
            x: (0..self.steps.len()).map(|i| i as f64).collect(),
            x_text: self
                .steps
                .iter()
                .enumerate()
                .map(|(i, s)| if i == self.peak { format!("{} (peak)", s.label) } else { s.label.clone() })
                .collect(),
            text_in_csv: true,
            columns,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "Memory in use during one training step of {}, event by event ({} events: forward, loss, backward, gradient reduction, optimizer step), stacked by category. {}.",
            self.model,
            self.steps.len(),
            self.peak_text()
        )
    }

    /// Ticks: the first and last forward layer, the loss, the last backward layer and the
    /// optimizer step, with short names.
    fn ticks(&self) -> Vec<(usize, String)> {
        let first = |k: EventKind| self.steps.iter().position(|s| s.kind == k);
        let last = |k: EventKind| self.steps.iter().rposition(|s| s.kind == k);
        let mut t = Vec::new();
        let mut push = |i: Option<usize>, name: String| {
            if let Some(i) = i {
                t.push((i, name));
            }
        };
        push(first(EventKind::LossForward), "loss".into());
        push(first(EventKind::Start), "start".into());
        push(first(EventKind::OptimizerStep), "optimizer".into());
        let fl = first(EventKind::ForwardLayer);
        let layer = |i: Option<usize>| i.map_or(0, |i| self.steps[i].layer);
        push(fl, format!("fwd L{}", layer(fl)));
        let ll = last(EventKind::ForwardLayer);
        push(ll, format!("fwd L{}", layer(ll)));
        let bl = last(EventKind::BackwardLayer);
        push(bl, format!("bwd L{}", layer(bl)));
        let bf = first(EventKind::BackwardLayer);
        push(bf, format!("bwd L{}", layer(bf)));
        t
    }
}

/// The chart's title and legend.
pub fn timeline_header(data: &TimelineData, theme: &Theme) -> Header {
    let mut legend: Vec<LegendEntry> = Category::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| data.steps.iter().any(|s| s.by_category[*i] > 0))
        .map(|(_, c)| LegendEntry::new(c.label(), category_color(*c), Mark::Area))
        .collect();
    if data.reserved_peak().is_some() {
        legend.push(LegendEntry::new("Reserved by the caching allocator (simulated)", theme.muted, Mark::Area));
    }
    legend.push(LegendEntry::new(format!("{} capacity", data.gpu), theme.alert, Mark::Line));
    Header { title: format!("Memory during one training step — {}", data.model), legend, notes: Vec::new() }
}

/// Draws the chart; returns where it put the data and its layout.
pub fn draw_timeline<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    data: &TimelineData,
    theme: &Theme,
) -> DrawResult<(Frame, Layout), DB> {
    let u = data.unit;
    let (w, _) = root.dim_in_pixel();
    let n = data.steps.len().max(2);
    let ticks = data.ticks();
    let names: Vec<(f64, String)> = ticks.iter().map(|(i, s)| (*i as f64, s.clone())).collect();
    let priority: Vec<f64> = names.iter().map(|(i, _)| *i).collect();
    let x = Axis::linear(0.0, (n - 1) as f64, 4).with_ticks(priority.clone()).thinned(draw::plot_width(w), 64.0, &priority);
    let totals: Vec<f64> = data.totals().into_iter().map(|b| in_unit(b, u)).collect();
    let cap = in_unit(data.capacity, u);
    let reserved: Vec<Option<f64>> = data.steps.iter().map(|s| s.reserved.map(|r| in_unit(r, u))).collect();
    let top = totals.iter().copied().chain(reserved.iter().flatten().copied()).fold(0.0, f64::max).max(cap);
    let y = draw::memory_axis(top);
    let header = timeline_header(data, theme);
    let y_title = draw::memory_title(u);
    let label_of = move |v: f64| names.iter().find(|(i, _)| (*i - v).abs() < 0.5).map_or_else(String::new, |(_, s)| s.clone());
    let spec = Spec {
        header: &header,
        x,
        y: y.clone(),
        x_title: "Events of the step: forward → loss → backward → optimizer",
        y_title: &y_title,
        x_label: &label_of,
        y_label: &|v| draw::num_label(v),
    };
    let (mut chart, mut layout) = draw::frame(root, &spec, theme)?;
    let xs: Vec<f64> = (0..data.steps.len()).map(|i| i as f64).collect();
    let layers: Vec<(RGBColor, Vec<f64>)> = Category::ALL
        .iter()
        .enumerate()
        .map(|(i, c)| (category_color(*c), data.steps.iter().map(|s| in_unit(s.by_category[i], u)).collect()))
        .collect();
    // Reserved above allocated: a muted band between the two, then the stacked categories.
    if reserved.iter().any(Option::is_some) {
        let mut band: Vec<(f64, f64)> = xs.iter().zip(&reserved).map(|(&x, r)| (x, r.unwrap_or(0.0))).collect();
        let top_edge = band.clone();
        band.extend(xs.iter().rev().map(|&x| (x, 0.0)));
        chart.draw_series(std::iter::once(Polygon::new(band, theme.muted.mix(0.35).filled())))?;
        draw::line(&mut chart, &top_edge, theme.muted.stroke_width(1), false)?;
    }
    draw::stack(&mut chart, &xs, &layers, 0.0)?;
    // Phase names over their stretch of events.
    let span = |k: EventKind| {
        let first = data.steps.iter().position(|s| s.kind == k)?;
        let last = data.steps.iter().rposition(|s| s.kind == k)?;
        Some((first + last) as f64 / 2.0)
    };
    for (k, name) in [(EventKind::ForwardLayer, "forward →"), (EventKind::BackwardLayer, "← backward")] {
        if let Some(mid) = span(k) {
            let style = draw::font(theme, 12).color(&theme.muted).pos(Pos::new(HPos::Center, VPos::Top));
            chart.draw_series(std::iter::once(EmptyElement::at((mid, y.hi())) + Text::new(name, (0, 4), style)))?;
        }
    }
    let pts: Vec<(f64, f64)> = xs.iter().copied().zip(totals.iter().copied()).collect();
    draw::line(&mut chart, &pts, theme.foreground.stroke_width(2), false)?;
    draw::capacity(&mut chart, data.capacity, u, &data.gpu, false, theme, &mut layout.parts)?;
    if let Some(&p) = totals.get(data.peak) {
        let at = (data.peak as f64, p);
        draw::vline(&mut chart, at.0, 0.0, p, theme.foreground.stroke_width(1))?;
        draw::dot(&mut chart, at, 5, theme.foreground, true)?;
        let strong = draw::bold(theme, 13, theme.foreground);
        let above = y.fraction(p) < 0.85;
        draw::label_dy(&mut chart, &data.peak_text(), at, strong, above, 4, theme, &mut layout.parts)?;
    }
    let frame = draw::frame_of(&chart);
    root.present()?;
    Ok((frame, layout))
}

pub fn timeline_svg(data: &TimelineData, theme: &Theme, size: (u32, u32)) -> String {
    draw::svg_of(size, |root| draw_timeline(root, data, theme).map(|_| ()))
}
