//! The serving charts (issue 29), drawn from the series of [`crate::estimator::serve`]:
//!
//! - **KV cache against context** ([`KvData`]): one sequence's cache, as the configured engine
//!   holds it, from 1K tokens to the model's context, beside the same model without MLA (per-head
//!   keys and values), without its sliding windows and with an FP8 cache — where those differ
//!   from it. Both axes are logarithmic: a cache that grows with the context is a line of slope
//!   1, a window flattens it, and a constant factor (FP8's half, MLA's latent) is a parallel line.
//! - **Concurrency against context** ([`ConcurrencyData`]): how many sequences of each length
//!   the engine's KV budget holds at once on the chosen GPU (vLLM's "Maximum concurrency"), with
//!   the target concurrency and the longest context at which it still fits.
//!
//! Like every chart here, each is a data struct, a header, a `draw_*` returning the [`Frame`]
//! and [`Layout`], and a `*_svg`; nothing here runs the estimator.

use super::axis::{pow2_ticks, Axis, Frame};
use super::draw::{self, DrawResult, Header, Layout, LegendEntry, Mark, Spec};
use super::format::tokens_label;
use super::theme::{okabe_ito, Theme};
use crate::estimator::config::Unit;
use crate::estimator::expr::group_digits;
use crate::estimator::ledger::Bytes;
use crate::estimator::serve::Series;
use crate::estimator::units::{in_unit, unit_symbol};
use plotters::coord::Shift;
use plotters::prelude::*;

/// The colours of the KV chart's lines, in the order the estimator gives its series (the
/// configured model first; a hybrid's "recurrent state (constant)" and "every layer full
/// attention" take the next two, so a model has at most five distinct lines).
fn kv_color(i: usize, theme: &Theme) -> RGBColor {
    match i {
        0 => theme.foreground,
        1 => okabe_ito::PURPLE,
        2 => okabe_ito::SKY_BLUE,
        3 => okabe_ito::GREEN,
        4 => okabe_ito::VERMILLION,
        _ => okabe_ito::ORANGE,
    }
}

/// A log axis over the positive values of `values`, with room above and below.
fn log_axis(values: impl Iterator<Item = f64>) -> Axis {
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for v in values.filter(|v| v.is_finite() && *v > 0.0) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() || hi <= 0.0 {
        return Axis::log(0.1, 10.0);
    }
    let (lo, hi) = (lo * 0.7, hi * 1.5);
    Axis::log(lo, hi.max(lo * 10.0))
}

/// The x axis of both charts: contexts on a log scale, ticks at powers of two.
fn context_axis(xs: &[f64], width: u32) -> Axis {
    let lo = xs.first().copied().unwrap_or(1024.0);
    let hi = xs.last().copied().unwrap_or(lo * 2.0).max(lo * 2.0);
    Axis::log(lo, hi).with_ticks(pow2_ticks(lo, hi)).with_light([]).thinned(draw::plot_width(width), 44.0, &[])
}

/// KV memory of one sequence against its length, for the model and its variants.
#[derive(Clone, Debug, PartialEq)]
pub struct KvData {
    /// The model as configured first, then the variants.
    pub series: Vec<Series<Bytes>>,
    pub model: String,
    /// The engine's name ("vLLM").
    pub engine: String,
    pub unit: Unit,
    /// The configured context and its cache (the "you are here" dot).
    pub current: Option<(u64, Bytes)>,
}

impl KvData {
    /// A sentence for screen readers.
    pub fn describe(&self) -> String {
        let sym = unit_symbol(self.unit);
        let mut s =
            format!("KV cache of one sequence of {} as {} holds it, against the context length (log scales).", self.model, self.engine);
        for line in &self.series {
            if let (Some(first), Some(last)) = (line.points.first(), line.points.last()) {
                s.push_str(&format!(
                    " {}: {:.3} {sym} at {} tokens, {:.2} {sym} at {} tokens.",
                    line.label,
                    in_unit(first.1, self.unit),
                    group_digits(first.0 as u128),
                    in_unit(last.1, self.unit),
                    group_digits(last.0 as u128)
                ));
            }
        }
        s
    }

    fn xs(&self) -> Vec<f64> {
        self.series.first().map(|s| s.points.iter().map(|p| p.0 as f64).collect()).unwrap_or_default()
    }
}

/// The KV chart's title and legend.
pub fn kv_header(data: &KvData, theme: &Theme) -> Header {
    let legend = data
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let label = if i == 0 { format!("{} ({})", data.model, s.label) } else { s.label.clone() };
            LegendEntry::new(label, kv_color(i, theme), if i == 0 { Mark::Line } else { Mark::Dashed })
        })
        .collect();
    Header {
        title: format!("KV cache per sequence vs context — {} on {}", data.model, data.engine),
        legend,
        notes: vec![("Both axes logarithmic: a cache that grows with the context is a line of slope 1".to_string(), theme.foreground)],
    }
}

/// Draws the KV chart; returns where it put the data and its layout.
pub fn draw_kv<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, data: &KvData, theme: &Theme) -> DrawResult<(Frame, Layout), DB> {
    let u = data.unit;
    let (w, _) = root.dim_in_pixel();
    let xs = data.xs();
    let x = context_axis(&xs, w);
    let y = log_axis(data.series.iter().flat_map(|s| s.points.iter().map(|p| in_unit(p.1, u))));
    let header = kv_header(data, theme);
    let y_title = format!("KV cache ({}, log scale)", unit_symbol(u));
    let spec = Spec {
        header: &header,
        x,
        y: y.clone(),
        x_title: "Context per sequence (tokens, log scale)",
        y_title: &y_title,
        x_label: &|v| tokens_label(v),
        y_label: &|v| draw::num_label(v),
    };
    let (mut chart, mut layout) = draw::frame(root, &spec, theme)?;
    // The variants first, the configured model on top.
    for (i, s) in data.series.iter().enumerate().rev() {
        let pts: Vec<(f64, f64)> = s.points.iter().map(|p| (p.0 as f64, in_unit(p.1, u))).collect();
        let style = kv_color(i, theme).stroke_width(if i == 0 { 3 } else { 2 });
        draw::line(&mut chart, &pts, style, i != 0)?;
    }
    if let Some((t, b)) = data.current {
        let at = (t as f64, in_unit(b, u));
        if chart.as_coord_spec().x_spec().contains(at.0) && y.contains(at.1) {
            draw::dot(&mut chart, at, 5, theme.foreground, true)?;
            let text = format!("now: {} tokens, {:.2} {}", tokens_label(at.0), at.1, unit_symbol(u));
            draw::label(&mut chart, &text, at, draw::font(theme, 12), true, theme, &mut layout.parts)?;
        }
    }
    let frame = draw::frame_of(&chart);
    root.present()?;
    Ok((frame, layout))
}

/// The KV chart as an SVG document.
pub fn kv_svg(data: &KvData, theme: &Theme, size: (u32, u32)) -> String {
    draw::svg_of(size, |root| draw_kv(root, data, theme).map(|_| ()))
}

/// Concurrent sequences against context on one GPU group.
#[derive(Clone, Debug, PartialEq)]
pub struct ConcurrencyData {
    pub series: Series<f64>,
    pub model: String,
    pub gpu: String,
    /// The concurrency asked for (`concurrency`).
    pub target: u64,
    /// The configured context and the concurrency there.
    pub current: Option<(u64, f64)>,
    /// The longest context at which `target` sequences fit (0: none).
    pub max_context: u64,
}

impl ConcurrencyData {
    /// "1 sequence fits up to 131,072 tokens".
    pub fn limit_text(&self) -> String {
        let n = group_digits(self.target as u128);
        let seqs = if self.target == 1 { "sequence fits" } else { "sequences fit" };
        if self.max_context == 0 {
            format!("{n} {seqs} at no context")
        } else {
            format!("{n} {seqs} up to {} tokens", group_digits(self.max_context as u128))
        }
    }

    pub fn describe(&self) -> String {
        let pts: Vec<String> = self.series.points.iter().map(|(t, c)| format!("{:.1} at {} tokens", c, group_digits(*t as u128))).collect();
        format!(
            "Concurrent sequences of {} that {} holds at once, against the context length (log scales): {}. {}.",
            self.model,
            self.series.label,
            pts.join(", "),
            self.limit_text()
        )
    }
}

/// The concurrency chart's title and legend.
pub fn concurrency_header(data: &ConcurrencyData, theme: &Theme) -> Header {
    Header {
        title: format!("Concurrent sequences vs context — {}, {}", data.model, data.series.label),
        legend: vec![
            LegendEntry::new("Sequences the KV cache holds at once", theme.foreground, Mark::Line),
            LegendEntry::new(format!("Target: {} (concurrency)", group_digits(data.target as u128)), theme.alert, Mark::Line),
        ],
        notes: vec![(data.limit_text(), theme.alert)],
    }
}

/// Draws the concurrency chart; returns where it put the data and its layout.
pub fn draw_concurrency<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    data: &ConcurrencyData,
    theme: &Theme,
) -> DrawResult<(Frame, Layout), DB> {
    let (w, _) = root.dim_in_pixel();
    let xs: Vec<f64> = data.series.points.iter().map(|p| p.0 as f64).collect();
    let x = context_axis(&xs, w);
    let target = data.target.max(1) as f64;
    let y = log_axis(data.series.points.iter().map(|p| p.1).chain([target]).chain(data.current.map(|c| c.1)));
    let header = concurrency_header(data, theme);
    let spec = Spec {
        header: &header,
        x,
        y: y.clone(),
        x_title: "Context per sequence (tokens, log scale)",
        y_title: "Sequences at once (log scale)",
        x_label: &|v| tokens_label(v),
        y_label: &|v| draw::num_label(v),
    };
    let (mut chart, mut layout) = draw::frame(root, &spec, theme)?;
    draw::hline(&mut chart, target, theme.alert.stroke_width(2))?;
    // A pool with no room at a length has no point on a log axis: the line breaks there.
    let pts: Vec<(f64, f64)> = data.series.points.iter().map(|p| (p.0 as f64, if p.1 > 0.0 { p.1 } else { f64::NAN })).collect();
    draw::line(&mut chart, &pts, theme.foreground.stroke_width(3), false)?;
    let (x_lo, x_hi) = (xs.first().copied().unwrap_or(1.0), xs.last().copied().unwrap_or(1.0));
    let strong = draw::bold(theme, 13, theme.alert);
    let text = data.limit_text();
    let m = data.max_context as f64;
    if m >= x_lo && m <= x_hi {
        draw::vline(&mut chart, m, y.lo(), target, theme.alert.stroke_width(2))?;
        draw::dot(&mut chart, (m, target), 5, theme.alert, true)?;
        draw::label_dy(&mut chart, &text, (m, target), strong, true, 8, theme, &mut layout.parts)?;
    } else {
        draw::label(&mut chart, &text, (x_lo, target), strong, true, theme, &mut layout.parts)?;
    }
    if let Some((t, c)) = data.current {
        let at = (t as f64, c);
        if chart.as_coord_spec().x_spec().contains(at.0) && c > 0.0 && y.contains(c) {
            draw::dot(&mut chart, at, 5, theme.foreground, false)?;
            let text = format!("now: {:.1} at {} tokens", c, tokens_label(at.0));
            draw::label(&mut chart, &text, at, draw::font(theme, 12), false, theme, &mut layout.parts)?;
        }
    }
    let frame = draw::frame_of(&chart);
    root.present()?;
    Ok((frame, layout))
}

/// The concurrency chart as an SVG document.
pub fn concurrency_svg(data: &ConcurrencyData, theme: &Theme, size: (u32, u32)) -> String {
    draw::svg_of(size, |root| draw_concurrency(root, data, theme).map(|_| ()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plots::scene::draw_scene;
    use crate::plots::{DARK, LIGHT, PROJECTOR};

    fn kv() -> KvData {
        let pts = |f: u128| vec![(1024, 1024 * f), (4096, 4096 * f), (32_768, 32_768 * f)];
        KvData {
            series: vec![
                Series { label: "as configured".into(), points: pts(70_272) },
                Series { label: "without MLA (per-head keys and values)".into(), points: pts(4_997_120) },
                Series { label: "FP8 KV cache".into(), points: pts(35_136) },
            ],
            model: "DeepSeek-V2-Lite".into(),
            engine: "vLLM".into(),
            unit: Unit::Gib,
            current: Some((4096, 4096 * 70_272)),
        }
    }

    /// A hybrid (Qwen3-Next-80B-A3B, vLLM, bf16): 12 attention layers of 2·2·256 values
    /// (24,576 B per token), 36 gated DeltaNet states beside, flat; every layer full
    /// attention is 98,304 B per token.
    fn hybrid() -> KvData {
        let pts = |f: u128, c: u128| vec![(1024, 1024 * f + c), (4096, 4096 * f + c), (32_768, 32_768 * f + c)];
        KvData {
            series: vec![
                Series { label: "as configured".into(), points: pts(24_576, 36 << 20) },
                Series { label: "recurrent state (constant)".into(), points: pts(0, 36 << 20) },
                Series { label: "every layer full attention".into(), points: pts(98_304, 0) },
                Series { label: "FP8 KV cache".into(), points: pts(12_288, 36 << 20) },
            ],
            model: "Qwen3-Next-80B-A3B".into(),
            engine: "vLLM".into(),
            unit: Unit::Gib,
            current: Some((4096, 4096 * 24_576 + (36 << 20))),
        }
    }

    #[test]
    fn a_hybrids_flat_state_and_full_attention_lines_are_drawn_and_named() {
        for theme in [LIGHT, DARK, PROJECTOR] {
            for w in [320, 720, 1600] {
                let h = draw::chart_height(&kv_header(&hybrid(), &theme), w, &theme);
                let (_, r) = draw_scene((w, h), |root| draw_kv(root, &hybrid(), &theme));
                let layout = r.map(|(_, l)| l).unwrap_or_default();
                assert!(layout.problems().is_empty(), "hybrid at {w}: {:?}", layout.problems());
            }
        }
        let svg = kv_svg(&hybrid(), &LIGHT, (960, 480));
        for s in ["recurrent state (constant)", "every layer full attention"] {
            assert!(svg.contains(s), "{s}");
        }
        // Every line its own colour.
        let colors: std::collections::BTreeSet<_> = (0..4)
            .map(|i| {
                let c = kv_color(i, &LIGHT);
                (c.0, c.1, c.2)
            })
            .collect();
        assert_eq!(colors.len(), 4);
    }

    fn conc() -> ConcurrencyData {
        ConcurrencyData {
            series: Series { label: "vLLM on h100-80gb".into(), points: vec![(1024, 400.0), (8192, 50.0), (131_072, 3.1)] },
            model: "Llama-3.1-8B".into(),
            gpu: "NVIDIA H100 80 GB (SXM)".into(),
            target: 8,
            current: Some((8192, 50.0)),
            max_context: 51_000,
        }
    }

    #[test]
    fn the_serving_charts_lay_out_without_overlaps_at_every_width_and_theme() {
        for theme in [LIGHT, DARK, PROJECTOR] {
            for w in [320, 480, 720, 960, 1600] {
                let h = draw::chart_height(&kv_header(&kv(), &theme), w, &theme);
                let (_, r) = draw_scene((w, h), |root| draw_kv(root, &kv(), &theme));
                let layout = r.map(|(_, l)| l).unwrap_or_default();
                assert!(layout.problems().is_empty(), "kv at {w}: {:?}", layout.problems());
                let h = draw::chart_height(&concurrency_header(&conc(), &theme), w, &theme);
                let (_, r) = draw_scene((w, h), |root| draw_concurrency(root, &conc(), &theme));
                let layout = r.map(|(_, l)| l).unwrap_or_default();
                assert!(layout.problems().is_empty(), "concurrency at {w}: {:?}", layout.problems());
            }
        }
    }

    #[test]
    fn the_charts_say_what_they_draw() {
        let svg = kv_svg(&kv(), &LIGHT, (960, 480));
        for s in ["without MLA (per-head keys and values)", "FP8 KV cache", "KV cache (GiB, log scale)", "32K"] {
            assert!(svg.contains(s), "{s}");
        }
        let svg = concurrency_svg(&conc(), &LIGHT, (960, 480));
        assert!(svg.contains("8 sequences fit up to 51,000 tokens"), "{svg}");
        assert!(svg.contains("Sequences at once (log scale)"));
        assert!(conc().describe().contains("50.0 at 8,192 tokens"));
        assert!(kv().describe().contains("FP8 KV cache"));
    }
}
