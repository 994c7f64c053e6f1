//! Which panels the page shows, and in what order: the full page's two columns (the form and
//! the results) or an embed's single one. Panels are named ([`Panel::id`]), so a link can
//! choose and order them (course mode's `sections=` and `hide=` build a [`Layout`] from the
//! same names), and [`super::app`] renders whatever a layout lists.

use crate::plots::ChartKind;

/// Everything the page can show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Panel {
    /// The preset picker and the model's summary.
    Model,
    /// Importing a Hugging Face config.json.
    Import,
    /// Every architecture field.
    Architecture,
    Training,
    Cluster,
    /// The overhead assumptions.
    Overhead,
    /// The verdict and its key figures.
    Verdict,
    /// The one-click answers: what fits.
    Answers,
    /// The stacked bar against the GPU.
    Bar,
    /// The ledger, each row opening to its formula.
    Ledger,
    /// The textbook formulas beside the exact accounting.
    Textbook,
    /// Every chart, as tabs.
    Charts,
    /// One chart alone.
    Chart(ChartKind),
    /// The WebGPU benchmark.
    Bench,
    /// The planner: what fits, ranked by estimated step time.
    Plan,
}

impl Panel {
    /// Every panel with a name of its own (a single chart is named by its kind).
    pub const NAMED: [Panel; 14] = [
        Panel::Model,
        Panel::Import,
        Panel::Architecture,
        Panel::Training,
        Panel::Cluster,
        Panel::Overhead,
        Panel::Verdict,
        Panel::Answers,
        Panel::Bar,
        Panel::Ledger,
        Panel::Textbook,
        Panel::Charts,
        Panel::Bench,
        Panel::Plan,
    ];

    /// The panel's name in links and in the page (`data-panel`).
    pub fn id(self) -> &'static str {
        match self {
            Panel::Model => "model",
            Panel::Import => "import",
            Panel::Architecture => "architecture",
            Panel::Training => "training",
            Panel::Cluster => "cluster",
            Panel::Overhead => "overhead",
            Panel::Verdict => "result",
            Panel::Answers => "answers",
            Panel::Bar => "bar",
            Panel::Ledger => "ledger",
            Panel::Textbook => "textbook",
            Panel::Charts => "charts",
            Panel::Chart(k) => k.as_str(),
            Panel::Bench => "bench",
            Panel::Plan => "plan",
        }
    }

    /// Reads a panel's name (a chart's kind names that chart alone).
    pub fn parse(s: &str) -> Option<Panel> {
        Panel::NAMED.into_iter().find(|p| p.id().eq_ignore_ascii_case(s.trim())).or_else(|| ChartKind::from_view(s).map(Panel::Chart))
    }

    /// Whether the panel belongs to the form (the inputs' column).
    pub fn is_input(self) -> bool {
        matches!(self, Panel::Model | Panel::Import | Panel::Architecture | Panel::Training | Panel::Cluster | Panel::Overhead)
    }
}

/// The panels of a page, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    /// The form's column.
    pub inputs: Vec<Panel>,
    /// The results' column.
    pub results: Vec<Panel>,
}

impl Layout {
    /// The full page.
    pub fn full() -> Layout {
        use Panel::*;
        Layout {
            inputs: vec![Model, Import, Architecture, Training, Cluster, Overhead],
            results: vec![Verdict, Answers, Bar, Ledger, Textbook, Charts, Plan, Bench],
        }
    }

    /// An embed: the verdict and the bar, then the panel `view=` names (nothing more if it is
    /// empty, `result` or `bar`); an unknown name is an error, to say in the page. The answers
    /// are left out (a frame's room is short) unless asked for.
    pub fn embed(view: &str) -> Result<Layout, String> {
        let mut results = vec![Panel::Verdict, Panel::Bar];
        match view.trim() {
            "" | "result" | "bar" => {}
            v => match Panel::parse(v) {
                Some(p) if !p.is_input() && !results.contains(&p) => results.push(p),
                _ => return Err(format!("unknown view '{v}'")),
            },
        }
        Ok(Layout { inputs: Vec::new(), results })
    }
}
