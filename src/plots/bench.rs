//! The benchmark's charts: time and memory against sequence length on log-log axes, for the
//! materialized and the fused kernel, with the estimator's prediction of the score bytes for the
//! same shapes overlaid. Plain data in (this module knows nothing of the benchmark's types).

use super::axis::{decade_ticks, pow2_ticks, Axis};
use super::draw::{self, DrawResult, Header, Layout, LegendEntry, Mark, Spec};
use super::format::tokens_label;
use super::theme::{okabe_ito, Theme};
use plotters::coord::Shift;
use plotters::prelude::*;

/// One kernel's measured points: (sequence length, value).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BenchSeries {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// What a benchmark chart shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BenchChart {
    pub title: String,
    pub y_title: String,
    /// Measured series (materialized, fused).
    pub series: Vec<BenchSeries>,
    /// The estimator's prediction for the same shapes, dashed.
    pub predicted: Option<BenchSeries>,
    /// Formats a y value for tick labels.
    pub y_unit: YUnit,
}

/// How y values read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum YUnit {
    #[default]
    Milliseconds,
    /// Bytes in decimal units (KB, MB, GB), as the page's GB setting.
    Bytes,
    /// Bytes in binary units (KiB, MiB, GiB), as the page's GiB setting.
    BinaryBytes,
}

fn y_label(v: f64, unit: YUnit) -> String {
    match unit {
        YUnit::Milliseconds => {
            if v >= 1000.0 {
                format!("{} s", trim(v / 1000.0))
            } else if v >= 1.0 {
                format!("{v:.0} ms")
            } else {
                format!("{:.0} µs", v * 1000.0)
            }
        }
        YUnit::Bytes => {
            let units = [(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")];
            units.iter().find(|(s, _)| v >= *s).map_or(format!("{v:.0} B"), |(s, u)| format!("{} {u}", trim(v / s)))
        }
        YUnit::BinaryBytes => {
            let units = [(1_099_511_627_776.0, "TiB"), (1_073_741_824.0, "GiB"), (1_048_576.0, "MiB"), (1024.0, "KiB")];
            units.iter().find(|(s, _)| v >= *s).map_or(format!("{v:.0} B"), |(s, u)| format!("{} {u}", trim(v / s)))
        }
    }
}

fn trim(x: f64) -> String {
    if x >= 10.0 || x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

const COLORS: [RGBColor; 3] = [okabe_ito::VERMILLION, okabe_ito::BLUE, okabe_ito::GREY];

/// The chart's title and legend.
pub fn bench_header(c: &BenchChart, theme: &Theme) -> Header {
    let mut legend: Vec<LegendEntry> =
        c.series.iter().enumerate().map(|(i, s)| LegendEntry::new(s.label.clone(), COLORS[i % COLORS.len()], Mark::Line)).collect();
    if let Some(p) = &c.predicted {
        legend.push(LegendEntry::new(p.label.clone(), theme.foreground, Mark::Dashed));
    }
    Header { title: c.title.clone(), legend, notes: Vec::new() }
}

/// Draws one log-log chart; returns its layout.
pub fn draw_bench<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &BenchChart, theme: &Theme) -> DrawResult<Layout, DB> {
    let all: Vec<(f64, f64)> =
        c.series.iter().chain(c.predicted.iter()).flat_map(|s| s.points.iter().copied()).filter(|(x, y)| *x > 0.0 && *y > 0.0).collect();
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in &all {
        x0 = x0.min(*x);
        x1 = x1.max(*x);
        y0 = y0.min(*y);
        y1 = y1.max(*y);
    }
    if all.is_empty() {
        (x0, x1, y0, y1) = (256.0, 4096.0, 1.0, 10.0);
    }
    let (x0, x1) = (x0 / 1.15, (x1 * 1.15).max(x0 * 2.0));
    let (y0, y1) = (y0 / 1.5, (y1 * 1.5).max(y0 * 2.0));
    let (w, _) = root.dim_in_pixel();
    let x = Axis::log(x0, x1).with_ticks(pow2_ticks(x0, x1)).with_light([]).thinned(draw::plot_width(w), 40.0, &[]);
    let (decades, light) = decade_ticks(y0, y1);
    // Less than a decade apart: the 2…9 multiples become the ticks.
    let y = if decades.len() < 2 {
        Axis::log(y0, y1).with_ticks(decades.into_iter().chain(light))
    } else {
        Axis::log(y0, y1).with_ticks(decades).with_light(light)
    };
    let header = bench_header(c, theme);
    let unit = c.y_unit;
    let spec = Spec {
        header: &header,
        x,
        y,
        x_title: "sequence length s (tokens, log scale)",
        y_title: &c.y_title,
        x_label: &|v| tokens_label(v),
        y_label: &|v| y_label(v, unit),
    };
    let (mut chart, layout) = draw::frame(root, &spec, theme)?;
    for (i, s) in c.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        draw::line(&mut chart, &s.points, color.stroke_width(2), false)?;
        for p in &s.points {
            draw::dot(&mut chart, *p, 3, color, true)?;
        }
    }
    if let Some(p) = &c.predicted {
        draw::line(&mut chart, &p.points, theme.foreground.stroke_width(1), true)?;
    }
    root.present()?;
    Ok(layout)
}

/// The height a benchmark chart takes at `width`.
pub fn bench_height(c: &BenchChart, width: u32, theme: &Theme) -> u32 {
    draw::header_height(&bench_header(c, theme), width, theme) + 260
}

/// The chart as SVG (export and tests).
pub fn bench_svg(c: &BenchChart, theme: &Theme, size: (u32, u32)) -> String {
    draw::svg_of(size, |root| draw_bench(root, c, theme).map(|_| ()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plots::theme::LIGHT;

    #[test]
    fn the_memory_chart_names_both_kernels_and_the_prediction() {
        let c = BenchChart {
            title: "Memory".into(),
            y_title: "bytes allocated".into(),
            series: vec![
                BenchSeries { label: "materialized".into(), points: vec![(256.0, 262_144.0), (512.0, 1_048_576.0), (1024.0, 4_194_304.0)] },
                BenchSeries { label: "fused".into(), points: vec![(256.0, 65_536.0), (512.0, 131_072.0), (1024.0, 262_144.0)] },
            ],
            predicted: Some(BenchSeries {
                label: "estimator: eager scores".into(),
                points: vec![(256.0, 393_216.0), (1024.0, 6_291_456.0)],
            }),
            y_unit: YUnit::Bytes,
        };
        let svg = bench_svg(&c, &LIGHT, (640, 360));
        for want in ["materialized", "fused", "estimator: eager scores", "sequence length s", "MB"] {
            assert!(svg.contains(want), "missing {want}");
        }
    }

    #[test]
    fn tick_labels_read_in_human_units() {
        assert_eq!(y_label(1_500_000.0, YUnit::Bytes), "1.5 MB");
        assert_eq!(y_label(1_572_864.0, YUnit::BinaryBytes), "1.5 MiB");
        assert_eq!(y_label(0.25, YUnit::Milliseconds), "250 µs");
        assert_eq!(y_label(2500.0, YUnit::Milliseconds), "2.5 s");
    }
}
