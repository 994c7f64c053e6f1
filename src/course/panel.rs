//! The page's panels, by name: one enum for the layout ([`crate::ui::layout`]), an embed's
//! `view=` and course mode's `sections=` and `hide=`, so that a panel has one spelling
//! everywhere (`verdict`, `ledger`, `seq`, …) and the compiler sees every use.
//!
//! Older links used other spellings for the same panels (`view=result` for the verdict); those
//! are still read ([`Panel::parse`]) and written back in the new one. `sections=` and `hide=`
//! also accept `inputs` (the form's four fieldsets at once); `hide=` also takes the two things
//! that are not panels: `share` (the toolbar's share buttons) and `formulas` (the formula view
//! inside ledger rows).

use crate::plots::ChartKind;

/// Everything the page can show, and the two hide-only parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Panel {
    /// The preset picker and the model's summary.
    Model,
    /// Importing a Hugging Face config.json.
    Import,
    /// Framework config files in (torchtune, torchtitan, DeepSpeed, …) and out, and the recipes.
    Frameworks,
    /// Every architecture field.
    Architecture,
    Training,
    Cluster,
    /// The overhead assumptions.
    Overhead,
    /// The serving fieldset (`mode=serve`): engine, context, concurrency, dtypes, budgets.
    Serving,
    /// Serving's answers: weights, KV cache, the engine's budget, concurrency, fixes, charts.
    Serve,
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
    /// Not a panel (`hide=` only): the share, embed, print and snapshot buttons.
    Share,
    /// Not a panel (`hide=` only): the formula view inside ledger rows.
    Formulas,
}

/// The form's fieldsets that `inputs` stands for in `sections=` and `hide=`.
pub const INPUTS: [Panel; 4] = [Panel::Model, Panel::Training, Panel::Cluster, Panel::Overhead];

/// The name that stands for [`INPUTS`].
pub const INPUTS_NAME: &str = "inputs";

impl Panel {
    /// Every name of its own (a single chart is named by its kind).
    pub const NAMED: [Panel; 23] = [
        Panel::Model,
        Panel::Import,
        Panel::Frameworks,
        Panel::Architecture,
        Panel::Training,
        Panel::Cluster,
        Panel::Overhead,
        Panel::Serving,
        Panel::Serve,
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
        Panel::Share,
        Panel::Formulas,
        // Listed last: `Chart` stands for every kind, parsed through `ChartKind`.
        Panel::Chart(ChartKind::Seq),
    ];

    /// The panel's name in links (`view=`, `sections=`, `hide=`) and in the page (`data-panel`).
    pub fn id(self) -> &'static str {
        match self {
            Panel::Model => "model",
            Panel::Import => "import",
            Panel::Frameworks => "frameworks",
            Panel::Architecture => "architecture",
            Panel::Training => "training",
            Panel::Cluster => "cluster",
            Panel::Overhead => "overhead",
            Panel::Serving => "serving",
            Panel::Serve => "serve",
            Panel::Verdict => "verdict",
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
            Panel::Share => "share",
            Panel::Formulas => "formulas",
        }
    }

    /// Older spellings still read: `view=result` named the verdict before `sections=` and
    /// `view=` shared one list.
    fn old_spellings(self) -> &'static [&'static str] {
        match self {
            Panel::Verdict => &["result"],
            _ => &[],
        }
    }

    /// Reads a name, its old spelling or a chart's kind (case-insensitive).
    pub fn parse(s: &str) -> Option<Panel> {
        let s = s.trim();
        Panel::NAMED
            .into_iter()
            .filter(|p| !matches!(p, Panel::Chart(_)))
            .find(|p| p.id().eq_ignore_ascii_case(s) || p.old_spellings().iter().any(|o| o.eq_ignore_ascii_case(s)))
            .or_else(|| ChartKind::from_view(s).map(Panel::Chart))
    }

    /// Reads an item of `sections=` or `hide=`: a panel, or `inputs` for the form's four
    /// fieldsets.
    pub fn parse_item(s: &str) -> Option<Vec<Panel>> {
        if s.trim().eq_ignore_ascii_case(INPUTS_NAME) {
            return Some(INPUTS.to_vec());
        }
        Panel::parse(s).map(|p| vec![p])
    }

    /// Whether it is something the page shows as a panel (`share` and `formulas` are parts of
    /// other things, which `hide=` can take out but `sections=` cannot place).
    pub fn is_panel(self) -> bool {
        !matches!(self, Panel::Share | Panel::Formulas)
    }

    /// Whether the panel belongs to the form (the inputs' column).
    pub fn is_input(self) -> bool {
        matches!(
            self,
            Panel::Model
                | Panel::Import
                | Panel::Frameworks
                | Panel::Architecture
                | Panel::Training
                | Panel::Cluster
                | Panel::Overhead
                | Panel::Serving
        )
    }

    /// The panel this one goes with: hiding that one hides this one too (the answers go with
    /// the verdict, "verify on your GPU" with the ledger, a chart with the charts).
    pub fn goes_with(self) -> Option<Panel> {
        match self {
            Panel::Answers => Some(Panel::Verdict),
            Panel::Verify => Some(Panel::Ledger),
            Panel::Chart(_) => Some(Panel::Charts),
            _ => None,
        }
    }
}

/// A list of panels as `sections=` and `hide=` write it: the canonical names, with the form's
/// four fieldsets in their order written as `inputs`.
pub fn list_names(panels: &[Panel]) -> String {
    let mut out: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < panels.len() {
        if panels[i..].starts_with(&INPUTS) {
            out.push(INPUTS_NAME);
            i += INPUTS.len();
        } else {
            out.push(panels[i].id());
            i += 1;
        }
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_reads_back_as_its_panel() {
        for p in Panel::NAMED {
            assert_eq!(Panel::parse(p.id()), Some(p), "{}", p.id());
        }
        for k in ChartKind::ALL {
            assert_eq!(Panel::parse(k.as_str()), Some(Panel::Chart(k)));
        }
    }

    #[test]
    fn old_spellings_are_still_read() {
        assert_eq!(Panel::parse("result"), Some(Panel::Verdict));
        assert_eq!(Panel::parse(" Result "), Some(Panel::Verdict));
        assert_eq!(Panel::parse("verdict"), Some(Panel::Verdict));
        assert_eq!(Panel::parse_item("inputs"), Some(INPUTS.to_vec()));
        assert_eq!(Panel::parse("nonsense"), None);
    }

    #[test]
    fn a_list_writes_the_inputs_group_by_its_name() {
        let mut l = vec![Panel::Verdict];
        l.extend(INPUTS);
        l.push(Panel::Ledger);
        assert_eq!(list_names(&l), "verdict,inputs,ledger");
        assert_eq!(list_names(&[Panel::Model, Panel::Ledger]), "model,ledger");
    }
}
