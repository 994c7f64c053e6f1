//! Charts, generic over plotters' `DrawingBackend`: data in, pixels out. The browser draws them
//! on `<canvas>` (plotters-canvas), native tests render them to SVG strings and assert on what
//! they contain.
//!
//! Each chart is a data struct computed from a [`Config`] (a sweep of the estimator, or the
//! estimate's own timeline), a `draw_*<DB: DrawingBackend>(root, data, theme) -> Frame` that
//! draws it and returns where it put the data (the hover read-out maps pixels back through it),
//! a `*_svg` for export and tests, and a [`Table`] of the numbers it drew (read-out and CSV).
//! [`ChartKind`] names them and [`ChartData`] dispatches over them.

pub mod axis;
pub mod bar;
pub mod batch;
pub mod bench;
pub mod draw;
pub mod gpus;
pub mod params;
pub mod search;
pub mod seq;
pub mod table;
pub mod timeline;

pub use axis::{Axis, Frame};
pub use table::{Column, Reading, Table};

use crate::estimator::config::{Config, Unit, Zero};
use crate::estimator::ledger::{Bytes, Category};
use crate::estimator::units::in_unit;
use crate::estimator::{estimate, Estimate, EstimateError};
use plotters::coord::Shift;
use plotters::prelude::{DrawingArea, DrawingAreaErrorKind, DrawingBackend, IntoDrawingArea, SVGBackend};
use plotters::style::RGBColor;

/// Colours of one light/dark theme. Series colours are the Okabe–Ito palette, distinguishable
/// with the common colour-vision deficiencies and legible on both backgrounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Theme {
    pub background: RGBColor,
    pub foreground: RGBColor,
    pub muted: RGBColor,
    pub grid: RGBColor,
    /// The capacity line and OOM marks.
    pub alert: RGBColor,
}

pub const LIGHT: Theme = Theme {
    background: RGBColor(255, 255, 255),
    foreground: RGBColor(28, 28, 32),
    muted: RGBColor(96, 96, 104),
    grid: RGBColor(226, 226, 232),
    alert: RGBColor(200, 0, 60),
};

pub const DARK: Theme = Theme {
    background: RGBColor(24, 24, 28),
    foreground: RGBColor(232, 232, 236),
    muted: RGBColor(170, 170, 180),
    grid: RGBColor(58, 58, 66),
    alert: RGBColor(255, 96, 128),
};

/// Okabe & Ito (2008), "Color Universal Design".
pub mod okabe_ito {
    use plotters::style::RGBColor;
    pub const ORANGE: RGBColor = RGBColor(230, 159, 0);
    pub const SKY_BLUE: RGBColor = RGBColor(86, 180, 233);
    pub const GREEN: RGBColor = RGBColor(0, 158, 115);
    pub const YELLOW: RGBColor = RGBColor(240, 228, 66);
    pub const BLUE: RGBColor = RGBColor(0, 114, 178);
    pub const VERMILLION: RGBColor = RGBColor(213, 94, 0);
    pub const PURPLE: RGBColor = RGBColor(204, 121, 167);
    pub const GREY: RGBColor = RGBColor(153, 153, 153);
}

/// The colour of a ledger category, the same in every chart and in the ledger's swatches.
pub fn category_color(c: Category) -> RGBColor {
    use okabe_ito::*;
    match c {
        Category::Parameters => BLUE,
        Category::Gradients => ORANGE,
        Category::OptimizerStates => GREEN,
        Category::Activations => VERMILLION,
        Category::Transient => PURPLE,
        Category::FrameworkOverhead => GREY,
    }
}

/// `#rrggbb` of a colour (for CSS swatches).
pub fn hex(c: RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

/// Tick label of a token or parameter count: 1K, 32K, 1M, 8B (binary K/M for token counts, as
/// people say "8K context" for 8,192).
pub fn tokens_label(v: f64) -> String {
    let short = |x: f64| {
        if x.fract() == 0.0 {
            format!("{x}")
        } else {
            format!("{x:.1}")
        }
    };
    let v = v.round();
    if v >= 1_048_576.0 {
        format!("{}M", short(v / 1_048_576.0))
    } else if v >= 1024.0 {
        format!("{}K", short(v / 1024.0))
    } else {
        format!("{v}")
    }
}

/// Tick label of a parameter count in decimal units: 125M, 8B, 1.5T.
pub fn params_label(v: f64) -> String {
    let s = crate::estimator::units::format_count(v.max(0.0).round() as u64);
    // format_count keeps three digits ("1.00B", "10.0B"); a tick reads better as "1B", "10B".
    match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) if s[..i].contains('.') => {
            let (num, suffix) = s.split_at(i);
            format!("{}{suffix}", num.trim_end_matches('0').trim_end_matches('.'))
        }
        _ => s,
    }
}

/// Bytes in the display unit as a float (chart coordinates).
pub fn y_of(bytes: Bytes, unit: Unit) -> f64 {
    in_unit(bytes, unit)
}

/// The name of the configured GPU ("NVIDIA H100 80 GB (SXM)", "custom 24 GiB GPU").
pub fn gpu_name(cfg: &Config) -> String {
    if cfg.gpu == "custom" {
        format!("custom {} GiB GPU", cfg.gpu_gib)
    } else {
        crate::estimator::gpu::gpu(&cfg.gpu).map_or_else(|| cfg.gpu.clone(), |g| g.name.to_string())
    }
}

/// The step's peak by category (`Category::ALL` order): the timeline's peak event. Sums to
/// `memory.peak`.
pub fn peak_composition(e: &Estimate) -> [Bytes; 6] {
    e.timeline.peak_event().map_or([0; 6], |ev| ev.by_category)
}

/// Renders a drawing function into an SVG document (empty if drawing failed).
pub fn svg_of(
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend, Shift>) -> Result<(), DrawingAreaErrorKind<std::io::Error>>,
) -> String {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        if draw(&root).is_err() {
            return String::new();
        }
    }
    out
}

/// The charts the app shows, by the name `view=` and the file names use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChartKind {
    Seq,
    Params,
    Batch,
    Gpus,
    Timeline,
}

impl ChartKind {
    pub const ALL: [ChartKind; 5] = [ChartKind::Seq, ChartKind::Params, ChartKind::Batch, ChartKind::Gpus, ChartKind::Timeline];

    /// The `view=` value and file-name part: `seq`, `params`, `batch`, `gpus`, `timeline`.
    pub fn as_str(self) -> &'static str {
        match self {
            ChartKind::Seq => "seq",
            ChartKind::Params => "params",
            ChartKind::Batch => "batch",
            ChartKind::Gpus => "gpus",
            ChartKind::Timeline => "timeline",
        }
    }

    /// Parses a `view=` value (case-insensitive; `None` for anything else).
    pub fn from_view(s: &str) -> Option<ChartKind> {
        ChartKind::ALL.into_iter().find(|k| k.as_str().eq_ignore_ascii_case(s.trim()))
    }

    /// The heading of its panel.
    pub fn title(self) -> &'static str {
        match self {
            ChartKind::Seq => "Memory vs sequence length",
            ChartKind::Params => "Memory vs model size",
            ChartKind::Batch => "Memory vs micro-batch",
            ChartKind::Gpus => "Memory vs number of GPUs",
            ChartKind::Timeline => "Memory during one step",
        }
    }

    /// A short tab label.
    pub fn tab(self) -> &'static str {
        match self {
            ChartKind::Seq => "Sequence length",
            ChartKind::Params => "Model size",
            ChartKind::Batch => "Micro-batch",
            ChartKind::Gpus => "GPUs",
            ChartKind::Timeline => "Step timeline",
        }
    }

    /// `trainmem-seq.csv`.
    pub fn filename(self, ext: &str) -> String {
        format!("trainmem-{}.{ext}", self.as_str())
    }
}

impl std::fmt::Display for ChartKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ChartKind {
    type Err = String;
    fn from_str(s: &str) -> Result<ChartKind, String> {
        ChartKind::from_view(s).ok_or_else(|| format!("unknown chart '{s}' (seq, params, batch, gpus or timeline)"))
    }
}

/// What a chart's data depends on: `cfg` with what the chart ignores or sweeps over reset, so
/// that two configurations with equal keys give equal data (apart from the "current" marker,
/// which [`ChartData::with_current`] sets). The app memoizes sweeps on this key: changing the
/// unit, or the swept key within the axis' range, redraws without recomputing.
pub fn sweep_key(kind: ChartKind, cfg: &Config) -> Config {
    let mut k = Config { unit: Unit::Gb, ..cfg.clone() };
    match kind {
        ChartKind::Seq => {
            if (128..=seq::default_top(cfg)).contains(&cfg.seq) {
                k.seq = 128u64.max(cfg.cp);
            }
        }
        ChartKind::Batch => {
            if cfg.batch <= 64 {
                k.batch = 1;
            }
        }
        ChartKind::Gpus => {
            // A GPU count on the axis' own doubling points changes nothing but the marker.
            let mp = search::model_parallel(cfg);
            if gpus::gpu_points(&Config { gpus: mp, ..cfg.clone() }).contains(&cfg.gpus) {
                k.gpus = mp;
            }
            if matches!(cfg.zero, Zero::Ddp | Zero::Z1 | Zero::Z2 | Zero::Z3) {
                k.zero = Zero::Ddp;
            }
        }
        ChartKind::Params => {
            k.gpus = 1;
        }
        ChartKind::Timeline => {}
    }
    // A key the estimator rejects (tp = 8 on the one GPU of the model-size key, say) would turn
    // a valid configuration's chart into an error: fall back to the configuration itself.
    if crate::estimator::validate(&k).is_err() {
        return Config { unit: Unit::Gb, ..cfg.clone() };
    }
    k
}

/// The data of any chart.
#[derive(Clone, Debug, PartialEq)]
pub enum ChartData {
    Seq(seq::SeqData),
    Params(params::ParamsData),
    Batch(batch::BatchData),
    Gpus(gpus::GpusData),
    Timeline(timeline::TimelineData),
}

/// Computes chart `kind` for `cfg`: a sweep of the estimator (tens of estimates), or the
/// estimate's timeline.
pub fn chart_data(kind: ChartKind, cfg: &Config) -> Result<ChartData, EstimateError> {
    crate::estimator::validate(cfg)?;
    Ok(match kind {
        ChartKind::Seq => ChartData::Seq(seq::seq_data(cfg)),
        ChartKind::Params => ChartData::Params(params::params_data(cfg)),
        ChartKind::Batch => ChartData::Batch(batch::batch_data(cfg)),
        ChartKind::Gpus => ChartData::Gpus(gpus::gpus_data(cfg)),
        ChartKind::Timeline => ChartData::Timeline(timeline::timeline_data(&estimate(cfg)?, cfg)),
    })
}

impl ChartData {
    pub fn kind(&self) -> ChartKind {
        match self {
            ChartData::Seq(_) => ChartKind::Seq,
            ChartData::Params(_) => ChartKind::Params,
            ChartData::Batch(_) => ChartKind::Batch,
            ChartData::Gpus(_) => ChartKind::Gpus,
            ChartData::Timeline(_) => ChartKind::Timeline,
        }
    }

    /// Sets what follows the live configuration without a new sweep: the unit, the "you are
    /// here" marker (from the configuration's own estimate) and the model's display name.
    pub fn with_current(mut self, cfg: &Config, e: Option<&Estimate>) -> ChartData {
        let peak = e.map(|e| e.memory.peak);
        match &mut self {
            ChartData::Seq(d) => {
                d.unit = cfg.unit;
                d.current = peak.map(|p| (cfg.seq, p));
                d.model = cfg.display_name();
            }
            ChartData::Params(d) => {
                d.unit = cfg.unit;
                d.model = cfg.display_name();
            }
            ChartData::Batch(d) => {
                d.unit = cfg.unit;
                d.current = peak.map(|p| (cfg.batch, p));
                d.model = cfg.display_name();
            }
            ChartData::Gpus(d) => {
                d.unit = cfg.unit;
                d.current = peak.map(|p| (cfg.zero, cfg.gpus, p));
                d.model = cfg.display_name();
            }
            ChartData::Timeline(d) => d.unit = cfg.unit,
        }
        self
    }

    /// Draws the chart; returns where it put the data.
    pub fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        theme: &Theme,
    ) -> Result<Frame, DrawingAreaErrorKind<DB::ErrorType>> {
        match self {
            ChartData::Seq(d) => seq::draw_seq(root, d, theme),
            ChartData::Params(d) => params::draw_params(root, d, theme),
            ChartData::Batch(d) => batch::draw_batch(root, d, theme),
            ChartData::Gpus(d) => gpus::draw_gpus(root, d, theme),
            ChartData::Timeline(d) => timeline::draw_timeline(root, d, theme),
        }
    }

    /// The chart as an SVG document of `size` pixels.
    pub fn svg(&self, theme: &Theme, size: (u32, u32)) -> String {
        svg_of(size, |root| self.draw(root, theme).map(|_| ()))
    }

    /// The numbers drawn, for the read-out and the CSV.
    pub fn table(&self, theme: &Theme) -> Table {
        match self {
            ChartData::Seq(d) => d.table(theme),
            ChartData::Params(d) => d.table(theme),
            ChartData::Batch(d) => d.table(theme),
            ChartData::Gpus(d) => d.table(theme),
            ChartData::Timeline(d) => d.table(theme),
        }
    }

    /// The data as CSV (bytes, exact).
    pub fn csv(&self) -> String {
        self.table(&LIGHT).csv()
    }

    /// The chart in a sentence or two (the canvas' accessible name).
    pub fn describe(&self) -> String {
        match self {
            ChartData::Seq(d) => d.describe(),
            ChartData::Params(d) => d.describe(),
            ChartData::Batch(d) => d.describe(),
            ChartData::Gpus(d) => d.describe(),
            ChartData::Timeline(d) => d.describe(),
        }
    }

    pub fn unit(&self) -> Unit {
        match self {
            ChartData::Seq(d) => d.unit,
            ChartData::Params(d) => d.unit,
            ChartData::Batch(d) => d.unit,
            ChartData::Gpus(d) => d.unit,
            ChartData::Timeline(d) => d.unit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ticks_read_like_context_lengths() {
        assert_eq!(tokens_label(1024.0), "1K");
        assert_eq!(tokens_label(32768.0), "32K");
        assert_eq!(tokens_label(1_048_576.0), "1M");
        assert_eq!(tokens_label(128.0), "128");
        assert_eq!(tokens_label(1536.0), "1.5K");
    }

    #[test]
    fn parameter_ticks_read_like_model_sizes() {
        assert_eq!(params_label(1e9), "1B");
        assert_eq!(params_label(1e10), "10B");
        assert_eq!(params_label(1e12), "1T");
        assert_eq!(params_label(1e8), "100M");
        assert_eq!(params_label(8.03e9), "8.03B");
        assert_eq!(params_label(1.5e9), "1.5B");
    }

    #[test]
    fn chart_kinds_parse_from_their_view_names() {
        for k in ChartKind::ALL {
            assert_eq!(ChartKind::from_view(k.as_str()), Some(k));
            assert_eq!(k.as_str().parse::<ChartKind>(), Ok(k));
        }
        assert_eq!(ChartKind::from_view("Timeline"), Some(ChartKind::Timeline));
        assert_eq!(ChartKind::from_view("ledger"), None);
        assert_eq!(ChartKind::Seq.filename("csv"), "trainmem-seq.csv");
    }

    #[test]
    fn every_category_has_a_distinct_colour() {
        let mut colours: Vec<String> = Category::ALL.iter().map(|&c| hex(category_color(c))).collect();
        colours.sort();
        colours.dedup();
        assert_eq!(colours.len(), Category::ALL.len());
    }
}
