//! The benchmark's charts: time and memory against sequence length on log-log axes, for the
//! materialized and the fused kernel, with the estimator's prediction of the score bytes for the
//! same shapes overlaid. Plain data in (this module knows nothing of the benchmark's types).

use super::{okabe_ito, tokens_label, Theme};
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
    Bytes,
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

/// Draws one log-log chart.
pub fn draw_bench<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    c: &BenchChart,
    theme: &Theme,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&theme.background)?;
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
    let font = ("sans-serif", 13).into_font().color(&theme.foreground);
    let mut chart = ChartBuilder::on(root)
        .caption(&c.title, ("sans-serif", 15).into_font().color(&theme.foreground))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(62)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())?;
    let unit = c.y_unit;
    chart
        .configure_mesh()
        .x_desc("sequence length s (tokens, log scale)")
        .y_desc(c.y_title.clone())
        .x_label_formatter(&|v| tokens_label(*v))
        .y_label_formatter(&|v| y_label(*v, unit))
        .axis_style(theme.muted)
        .light_line_style(theme.grid)
        .bold_line_style(theme.grid)
        .label_style(font.clone())
        .axis_desc_style(font.clone())
        .draw()?;
    for (i, s) in c.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    if let Some(p) = &c.predicted {
        let color = theme.foreground;
        chart
            .draw_series(DashedLineSeries::new(p.points.iter().copied(), 6, 4, color.stroke_width(1)))?
            .label(p.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(1)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(theme.background.mix(0.85))
        .border_style(theme.grid)
        .label_font(font)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The chart as SVG (export and tests).
pub fn bench_svg(c: &BenchChart, theme: &Theme, size: (u32, u32)) -> String {
    super::svg_of(size, |root| draw_bench(root, c, theme))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plots::LIGHT;

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
        assert_eq!(y_label(0.25, YUnit::Milliseconds), "250 µs");
        assert_eq!(y_label(2500.0, YUnit::Milliseconds), "2.5 s");
    }
}
