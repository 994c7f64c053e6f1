//! Which panels the page shows, and in what order: the full page's two columns (the form and
//! the results) or an embed's single one. Panels are named ([`Panel::id`]), so a link can
//! choose and order them (course mode's `sections=` and `hide=` build a [`Layout`] from the
//! same names), and [`super::app`] renders whatever a layout lists.

use crate::course::settings::{Section, Settings};
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
    /// Course mode: the built-in exercises, a quiz, "make this an exercise".
    Exercises,
    /// Course mode: A and B side by side.
    Compare,
    /// The planner: what fits, ranked by estimated step time.
    Plan,
    /// "Verify on your GPU": the script to download, its JSON compared row by row.
    Verify,
}

impl Panel {
    /// Every panel with a name of its own (a single chart is named by its kind).
    pub const NAMED: [Panel; 17] = [
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
        Panel::Exercises,
        Panel::Compare,
        Panel::Plan,
        Panel::Verify,
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
            Panel::Exercises => "exercises",
            Panel::Compare => "compare",
            Panel::Plan => "plan",
            Panel::Verify => "verify",
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
            results: vec![Verdict, Answers, Bar, Ledger, Verify, Textbook, Charts, Plan, Bench],
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

impl Panel {
    /// The course section (`sections=`, `hide=`) a panel belongs to.
    pub fn section(self) -> Section {
        match self {
            Panel::Model | Panel::Training | Panel::Cluster | Panel::Overhead => Section::Inputs,
            Panel::Import => Section::Import,
            Panel::Architecture => Section::Architecture,
            Panel::Verdict | Panel::Answers => Section::Verdict,
            Panel::Bar => Section::Bar,
            Panel::Ledger => Section::Ledger,
            Panel::Textbook => Section::Textbook,
            Panel::Charts | Panel::Chart(_) => Section::Charts,
            Panel::Bench => Section::Bench,
            Panel::Exercises => Section::Exercises,
            Panel::Compare => Section::Compare,
            Panel::Plan => Section::Plan,
            Panel::Verify => Section::Ledger,
        }
    }
}

/// The panels a course section stands for (the inputs are four fieldsets; the verdict brings
/// the one-click answers on the full page).
fn panels_of(section: Section, embed: bool) -> Vec<Panel> {
    use Panel::*;
    match section {
        Section::Verdict if embed => vec![Verdict],
        Section::Verdict => vec![Verdict, Answers],
        Section::Inputs => vec![Model, Training, Cluster, Overhead],
        Section::Architecture => vec![Architecture],
        Section::Import => vec![Import],
        Section::Ledger => vec![Ledger],
        Section::Bar => vec![Bar],
        Section::Charts => vec![Charts],
        Section::Textbook => vec![Textbook],
        Section::Bench => vec![Bench],
        Section::Exercises => vec![Exercises],
        Section::Compare => vec![Compare],
        Section::Plan => vec![Plan],
        // Not panels (the toolbar and the formula view are hidden by `hide=` through the
        // stylesheet).
        Section::Share | Section::Formulas => Vec::new(),
    }
}

impl Layout {
    /// The layout a course link asks for: `sections=` (in that order) or the page's own layout,
    /// with the exercises when the link sets one (`step=`, `quiz=`, `ask=`) and the comparison
    /// when it has a B; then without what `hide=` hides. An embed's layout is one column
    /// ([`Layout::results`]), inputs included where they are listed. The second value is what
    /// was wrong with `view=`, to say in the page.
    pub fn course(settings: &Settings, embed: bool, view: &str, compare: bool) -> (Layout, Option<String>) {
        let teaching = settings.quiz || settings.exercise.is_some() || settings.step.is_some();
        let mut problem = None;
        let mut layout = if !settings.sections.is_empty() {
            let all: Vec<Panel> = settings.sections.iter().flat_map(|s| panels_of(*s, embed)).collect();
            if embed {
                Layout { inputs: Vec::new(), results: all }
            } else {
                let (inputs, results) = all.into_iter().partition(|p| p.is_input());
                Layout { inputs, results }
            }
        } else if embed {
            let mut l = Layout::embed(view).unwrap_or_else(|e| {
                problem = Some(e);
                Layout::embed("").unwrap_or(Layout { inputs: Vec::new(), results: vec![Panel::Verdict, Panel::Bar] })
            });
            if teaching {
                l.results.insert(1, Panel::Exercises);
            }
            if compare {
                l.results.push(Panel::Compare);
            }
            l
        } else {
            let mut l = Layout::full();
            let at = l.results.iter().position(|p| *p == Panel::Textbook).map_or(l.results.len(), |i| i + 1);
            l.results.insert(at, Panel::Compare);
            l.results.insert(at, Panel::Exercises);
            if teaching {
                // A quiz's question comes right under the verdict it hides.
                l.results.retain(|p| *p != Panel::Exercises);
                l.results.insert(1, Panel::Exercises);
            }
            l
        };
        let shown = |p: &Panel| !settings.hide.contains(&p.section());
        layout.inputs.retain(shown);
        layout.results.retain(shown);
        (layout, problem)
    }
}
