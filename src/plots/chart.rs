//! The charts the app shows, by name ([`ChartKind`]), and their data ([`ChartData`]) built from
//! an estimator sweep or an estimate's timeline: one type to memoize, draw, export and describe
//! whatever chart is open.

use super::axis::Frame;
use super::batch::{self, BatchData};
use super::draw::{self, Header, Layout};
use super::gpus::{self, GpusData};
use super::params::{self, ParamsData};
use super::seq::{self, SeqData};
use super::table::Table;
use super::theme::{Theme, LIGHT};
use super::timeline::{self, TimelineData};
use crate::estimator::config::{Config, Unit};
use crate::estimator::ledger::Bytes;
use crate::estimator::sweep::{Axis, Sweep};
use crate::estimator::Estimate;
use plotters::coord::Shift;
use plotters::prelude::{DrawingArea, DrawingAreaErrorKind, DrawingBackend};

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

    /// The estimator sweep behind the chart (`None`: the timeline, which is the estimate's own).
    pub fn axis(self) -> Option<Axis> {
        match self {
            ChartKind::Seq => Some(Axis::Seq),
            ChartKind::Params => Some(Axis::Params),
            ChartKind::Batch => Some(Axis::Batch),
            ChartKind::Gpus => Some(Axis::Gpus),
            ChartKind::Timeline => None,
        }
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

    /// The `data-testid` of the chart's canvas in the page: `chart-seq`.
    pub fn canvas_testid(self) -> &'static str {
        match self {
            ChartKind::Seq => "chart-seq",
            ChartKind::Params => "chart-params",
            ChartKind::Batch => "chart-batch",
            ChartKind::Gpus => "chart-gpus",
            ChartKind::Timeline => "chart-timeline",
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

/// The data of any chart.
#[derive(Clone, Debug, PartialEq)]
pub enum ChartData {
    Seq(SeqData),
    Params(ParamsData),
    Batch(BatchData),
    Gpus(GpusData),
    Timeline(TimelineData),
}

impl ChartData {
    /// A sweep's chart for `cfg` (its unit and names; the marker comes with
    /// [`ChartData::with_current`]).
    pub fn from_sweep(sweep: Sweep, cfg: &Config) -> ChartData {
        match sweep {
            Sweep::Seq(s) => ChartData::Seq(SeqData::new(s, cfg)),
            Sweep::Params(s) => ChartData::Params(ParamsData::new(s, cfg)),
            Sweep::Batch(s) => ChartData::Batch(BatchData::new(s, cfg)),
            Sweep::Gpus(s) => ChartData::Gpus(GpusData::new(s, cfg)),
        }
    }

    /// The step timeline of an estimate (its coarse events, layer by layer).
    pub fn timeline(e: &Estimate, cfg: &Config) -> ChartData {
        ChartData::Timeline(timeline::timeline_data(e, cfg))
    }

    /// The step timeline op by op, with the caching allocator's reserved memory
    /// ([`crate::estimator::reserve::step_trace`]).
    pub fn trace(t: &crate::estimator::reserve::StepTrace, e: &Estimate, cfg: &Config) -> ChartData {
        ChartData::Timeline(timeline::trace_data(t, e, cfg))
    }

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

    /// The chart's title, legend and notes.
    pub fn header(&self, theme: &Theme) -> Header {
        match self {
            ChartData::Seq(d) => seq::seq_header(d, theme),
            ChartData::Params(d) => params::params_header(d, theme),
            ChartData::Batch(d) => batch::batch_header(d, theme),
            ChartData::Gpus(d) => gpus::gpus_header(d, theme),
            ChartData::Timeline(d) => timeline::timeline_header(d, theme),
        }
    }

    /// The height the chart wants at `width` pixels: its header and the plot.
    pub fn height(&self, width: u32, theme: &Theme) -> u32 {
        draw::chart_height(&self.header(theme), width, theme)
    }

    /// Draws the chart; returns where it put the data and its layout.
    pub fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        theme: &Theme,
    ) -> Result<(Frame, Layout), DrawingAreaErrorKind<DB::ErrorType>> {
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
        draw::svg_of(size, |root| self.draw(root, theme).map(|_| ()))
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

    /// The series a comparison draws over another configuration's chart ([`draw::overlay`]):
    /// the peak at each x (the gpus chart: the peak of the configuration's own ZeRO stage; the
    /// params chart: its first GPU count). `None` for the timeline, whose events differ.
    pub fn overlay_series(&self) -> Option<Vec<(f64, Option<Bytes>)>> {
        if matches!(self, ChartData::Timeline(_)) {
            return None;
        }
        let t = self.table(&LIGHT);
        let own = match self {
            ChartData::Gpus(d) => {
                d.current.and_then(|(z, _, _)| t.columns.iter().find(|c| c.key.starts_with(&format!("{}_peak", gpus::key(z)))))
            }
            _ => None,
        };
        let col = own.or_else(|| t.columns.iter().find(|c| c.key.contains("peak")))?;
        Some(t.x.iter().copied().zip(col.values.iter().copied()).collect())
    }

    /// Draws the chart with a second configuration's peak (B) over it, dashed, on A's axes.
    pub fn draw_compared<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        theme: &Theme,
        b: &[(f64, Option<Bytes>)],
    ) -> Result<(Frame, Layout), DrawingAreaErrorKind<DB::ErrorType>> {
        let (frame, layout) = self.draw(root, theme)?;
        draw::overlay(root, &frame, b, self.unit(), "B peak", theme)?;
        root.present()?;
        Ok((frame, layout))
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
    fn chart_kinds_parse_from_their_view_names() {
        for k in ChartKind::ALL {
            assert_eq!(ChartKind::from_view(k.as_str()), Some(k));
            assert_eq!(k.as_str().parse::<ChartKind>(), Ok(k));
        }
        assert_eq!(ChartKind::from_view("Timeline"), Some(ChartKind::Timeline));
        assert_eq!(ChartKind::from_view("ledger"), None);
        assert_eq!(ChartKind::Seq.filename("csv"), "trainmem-seq.csv");
    }
}
