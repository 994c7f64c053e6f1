//! The planner's chart: memory headroom per GPU against the estimated step time, one dot per
//! fitting configuration the search estimated, the Pareto frontier (no plan beats one of its
//! points on both axes) as a line through its points, and the top plan (the fastest) ringed.
//!
//! The numbers come from [`crate::estimator::plan`] (a [`PlanResult`] and the search's fitting
//! [`Point`]s); this module only draws them. Step times are the cost model's *estimates*: the
//! axis title and the chart's title say so.

use super::axis::{Axis, Frame};
use super::draw::{self, DrawResult, Header, Layout, LegendEntry, Mark, Spec};
use super::table::{Column, Table};
use super::theme::{okabe_ito, Theme};
use crate::estimator::config::Unit;
use crate::estimator::plan::{PlanResult, Point};
use crate::estimator::units::{format_bytes, in_unit, unit_symbol};
use plotters::coord::Shift;
use plotters::prelude::*;

/// At most this many non-frontier points are drawn (evenly thinned): a search can find tens of
/// thousands of fitting configurations, and a cloud of that many dots says no more than this.
pub const MAX_CLOUD: usize = 2000;

/// One point of the chart.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanDot {
    /// Estimated step time, seconds.
    pub step_s: f64,
    /// Headroom per GPU, bytes (≥ 0: every plan fits).
    pub headroom: u128,
    /// The plan's rank (1 = fastest) when it is one of the listed plans or the frontier.
    pub rank: Option<usize>,
}

/// The chart's data.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanChartData {
    /// Every fitting configuration found (thinned to [`MAX_CLOUD`]).
    pub cloud: Vec<PlanDot>,
    /// The Pareto frontier, fastest first.
    pub frontier: Vec<PlanDot>,
    /// The fastest plan.
    pub top: Option<PlanDot>,
    pub model: String,
    pub gpu: String,
    pub unit: Unit,
}

impl PlanChartData {
    /// The chart of a result and the fitting points its search found.
    pub fn new(result: &PlanResult, points: &[Point], model: String, gpu: String, unit: Unit) -> PlanChartData {
        let dot = |step_s: f64, headroom: i128, rank: Option<usize>| PlanDot { step_s, headroom: headroom.max(0) as u128, rank };
        let stride = points.len().div_ceil(MAX_CLOUD).max(1);
        PlanChartData {
            cloud: points.iter().step_by(stride).map(|p| dot(p.step_s, p.headroom, None)).collect(),
            frontier: result.frontier.iter().map(|p| dot(p.step_s, p.headroom, Some(p.rank))).collect(),
            top: result.plans.first().map(|p| dot(p.step_s, p.headroom, Some(p.rank))),
            model,
            gpu,
            unit,
        }
    }

    /// The frontier's numbers (the read-out and its CSV).
    pub fn table(&self) -> Table {
        Table {
            x_key: "step_s_estimate".into(),
            x_title: "Estimated step time (s)".into(),
            x: self.frontier.iter().map(|d| d.step_s).collect(),
            x_text: self.frontier.iter().map(|d| format!("{} s (estimate)", draw::num_label(round3(d.step_s)))).collect(),
            text_in_csv: false,
            columns: vec![Column {
                key: "headroom_bytes".into(),
                label: "Headroom per GPU".into(),
                color: okabe_ito::BLUE,
                values: self.frontier.iter().map(|d| Some(d.headroom)).collect(),
            }],
        }
    }

    /// The chart in a sentence (the canvas' accessible name).
    pub fn describe(&self) -> String {
        if self.frontier.is_empty() {
            return format!("No configuration of {} fits on {} in the space searched.", self.model, self.gpu);
        }
        let ends = |d: &PlanDot| format!("{} s with {} headroom", draw::num_label(round3(d.step_s)), format_bytes(d.headroom, self.unit));
        let (first, last) = (&self.frontier[0], &self.frontier[self.frontier.len() - 1]);
        format!(
            "Memory headroom per GPU against estimated step time for {} on {}: {} fitting configurations drawn; the Pareto frontier has {} plans, from the fastest ({}) to the most headroom ({}).",
            self.model,
            self.gpu,
            self.cloud.len(),
            self.frontier.len(),
            ends(first),
            ends(last)
        )
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Colour of the frontier.
pub const FRONTIER: RGBColor = okabe_ito::BLUE;
/// Colour of the top plan's ring.
pub const TOP: RGBColor = okabe_ito::VERMILLION;

/// The chart's title and legend.
pub fn plan_header(data: &PlanChartData, theme: &Theme) -> Header {
    let mut legend =
        vec![LegendEntry::new("Fitting configuration", theme.muted, Mark::Dot), LegendEntry::new("Pareto frontier", FRONTIER, Mark::Line)];
    if data.top.is_some() {
        legend.push(LegendEntry::new("Plan 1 (fastest)", TOP, Mark::Dot));
    }
    Header {
        title: format!("Headroom vs estimated step time — {} on {}", data.model, data.gpu),
        legend,
        notes: vec![("Step times are estimates of the cost model, not measurements".to_string(), theme.foreground)],
    }
}

/// The chart's height at a width.
pub fn plan_height(data: &PlanChartData, width: u32, theme: &Theme) -> u32 {
    draw::chart_height(&plan_header(data, theme), width, theme)
}

/// Draws the chart; returns where it put the data and its layout.
pub fn draw_plan<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    data: &PlanChartData,
    theme: &Theme,
) -> DrawResult<(Frame, Layout), DB> {
    let u = data.unit;
    let all = data.cloud.iter().chain(&data.frontier);
    let (mut t_lo, mut t_hi, mut h_lo, mut h_hi) = (f64::INFINITY, 0.0f64, f64::INFINITY, 0.0f64);
    for d in all {
        t_lo = t_lo.min(d.step_s);
        t_hi = t_hi.max(d.step_s);
        h_lo = h_lo.min(in_unit(d.headroom, u));
        h_hi = h_hi.max(in_unit(d.headroom, u));
    }
    if !t_lo.is_finite() || t_lo <= 0.0 {
        (t_lo, t_hi) = (0.1, 1.0);
    }
    // A log time axis: plans differ by factors (pipeline bubbles, offload), not by seconds.
    let x = Axis::log(t_lo / 1.15, (t_hi * 1.15).max(t_lo * 2.0));
    // The headroom axis spans the points (from 0 when they reach down near it): plans often
    // differ by a few GB out of tens, and an axis from 0 would flatten them into a line.
    let y = if h_lo.is_finite() && h_hi > h_lo && h_lo > 0.25 * h_hi {
        let pad = 0.08 * (h_hi - h_lo);
        Axis::linear((h_lo - pad).max(0.0), h_hi + pad, 6)
    } else {
        draw::memory_axis(h_hi)
    };
    let header = plan_header(data, theme);
    let y_title = format!("Headroom per GPU ({})", unit_symbol(u));
    let spec = Spec {
        header: &header,
        x,
        y,
        x_title: "Estimated step time (s, log scale)",
        y_title: &y_title,
        x_label: &|v| draw::num_label(round3(v)),
        y_label: &|v| draw::num_label(v),
    };
    let (mut chart, layout) = draw::frame(root, &spec, theme)?;
    let at = |d: &PlanDot| (d.step_s, in_unit(d.headroom, u));
    chart.draw_series(data.cloud.iter().map(|d| Circle::new(at(d), 2, theme.muted.mix(0.55).filled())))?;
    let line: Vec<(f64, f64)> = data.frontier.iter().map(at).collect();
    draw::line(&mut chart, &line, FRONTIER.stroke_width(2), false)?;
    for p in &line {
        draw::dot(&mut chart, *p, 4, FRONTIER, true)?;
    }
    if let Some(top) = &data.top {
        draw::dot(&mut chart, at(top), 8, TOP, false)?;
    }
    let frame = draw::frame_of(&chart);
    root.present()?;
    Ok((frame, layout))
}

/// The chart as SVG (exports and tests).
pub fn plan_svg(data: &PlanChartData, theme: &Theme, size: (u32, u32)) -> String {
    draw::svg_of(size, |root| draw_plan(root, data, theme).map(|_| ()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::config::Config;
    use crate::estimator::plan::{plan, GlobalBatch, PlanRequest, Search};
    use crate::estimator::presets::preset;
    use crate::plots::draw::Part;
    use crate::plots::scene::draw_scene;
    use crate::plots::{hex, LIGHT};

    fn data() -> PlanChartData {
        let arch = preset("qwen2.5-0.5b").map(|p| p.spec).expect("preset");
        let base = Config { model: "qwen2.5-0.5b".into(), arch, gpus: 8, seq: 1024, ..Config::default() };
        let req = PlanRequest::new(base, GlobalBatch::Sequences(64));
        let s = {
            let mut s = Search::new(req.clone()).expect("search");
            while !s.step(u64::MAX).done {}
            s
        };
        let r = plan(req).expect("plan");
        assert_eq!(s.result().frontier.len(), r.frontier.len());
        PlanChartData::new(&r, s.points(), "qwen2.5-0.5b".into(), "H100".into(), Unit::Gb)
    }

    #[test]
    fn the_svg_draws_a_dot_per_frontier_plan_and_rings_the_fastest() {
        let d = data();
        assert!(d.frontier.len() >= 2, "a frontier of {}", d.frontier.len());
        let svg = plan_svg(&d, &LIGHT, (900, 520));
        let blue = hex(FRONTIER).to_uppercase();
        assert!(svg.matches("<circle").count() > d.cloud.len() + d.frontier.len());
        // Each frontier plan is a filled dot of radius 4 in the frontier's colour.
        let filled =
            svg.split("<circle").filter(|c| c.contains("r=\"4\"") && c.to_uppercase().contains(&format!("FILL=\"{blue}\""))).count();
        assert_eq!(filled, d.frontier.len());
        let ring = svg.split("<circle").filter(|c| c.contains("r=\"8\"") && c.to_uppercase().contains(&hex(TOP).to_uppercase())).count();
        assert_eq!(ring, 1);
        assert!(svg.contains("Estimated step time (s, log scale)") && svg.contains("estimates"));
    }

    #[test]
    fn the_frontier_falls_in_time_as_headroom_grows_and_the_header_never_covers_it() {
        let d = data();
        assert!(d.frontier.windows(2).all(|w| w[0].step_s <= w[1].step_s && w[0].headroom < w[1].headroom));
        for w in [320, 480, 800, 1200, 1600] {
            let h = plan_height(&d, w, &LIGHT);
            let (_, r) = draw_scene((w, h), |root| draw_plan(root, &d, &LIGHT));
            let (frame, layout) = r.expect("draws");
            assert_eq!(layout.problems(), Vec::<String>::new(), "at {w} px");
            // Every frontier point lies inside the plot area.
            for p in &d.frontier {
                let (x, y) = frame.to_px(p.step_s, in_unit(p.headroom, d.unit));
                let r = layout.plot;
                assert!(x >= r.x0 && x <= r.x1 && y >= r.y0 && y <= r.y1, "({x}, {y}) outside {r:?} at {w} px");
            }
        }
    }

    #[test]
    fn plans_close_in_time_still_get_three_time_ticks() {
        // Every plan between 70 and 90 s: the log axis' decades and 2-5 marks give one tick
        // ("100"), so it falls back to evenly spaced ones.
        let dot = |step_s: f64, gb: u128| PlanDot { step_s, headroom: gb * 1_000_000_000, rank: None };
        let d = PlanChartData {
            cloud: vec![dot(71.0, 3), dot(78.0, 6), dot(89.0, 9)],
            frontier: vec![dot(71.0, 3), dot(89.0, 9)],
            top: None,
            model: "m".into(),
            gpu: "g".into(),
            unit: Unit::Gb,
        };
        for w in [390, 700, 1400] {
            let (_, r) = draw_scene((w, plan_height(&d, w, &LIGHT)), |root| draw_plan(root, &d, &LIGHT));
            let (_, layout) = r.expect("draws");
            assert_eq!(layout.problems(), Vec::<String>::new(), "at {w} px");
            let x_ticks: Vec<&str> =
                layout.parts.iter().filter(|p| p.part == Part::Axis && p.rect.y0 == layout.plot.y1 + 8).map(|p| p.text.as_str()).collect();
            assert!(x_ticks.len() >= 3, "at {w} px: {x_ticks:?}");
        }
    }

    #[test]
    fn an_empty_result_still_draws_and_says_so() {
        let d = PlanChartData { cloud: vec![], frontier: vec![], top: None, model: "m".into(), gpu: "g".into(), unit: Unit::Gb };
        assert!(!plan_svg(&d, &LIGHT, (600, 400)).is_empty());
        assert!(d.describe().contains("No configuration"));
    }
}
