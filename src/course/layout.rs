//! Which panels the page shows, and in what order: the full page's two columns (the form and
//! the results) or an embed's single one. Panels are named ([`Panel::id`]), so a link can
//! choose and order them (course mode's `sections=` and `hide=` build a [`Layout`] from the
//! same names), and the UI's `app` renders whatever a layout lists.

use super::panel::Panel;
use super::settings::Settings;

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
            inputs: vec![Model, Import, Frameworks, Architecture, Training, Cluster, Overhead],
            results: vec![Verdict, Answers, Bar, Ledger, Verify, Textbook, Charts, Plan, Bench],
        }
    }

    /// An embed: the verdict and the bar, then the panel `view=` names (nothing more if it is
    /// empty, the verdict or the bar); an unknown name is an error, to say in the page. The
    /// answers are left out (a frame's room is short) unless asked for.
    pub fn embed(view: &str) -> Result<Layout, String> {
        let mut results = vec![Panel::Verdict, Panel::Bar];
        match view.trim() {
            "" => {}
            v => match Panel::parse(v) {
                Some(p) if results.contains(&p) => {}
                // Serving's answers stand alone: the training verdict and bar say nothing of them.
                Some(Panel::Serve) => results = vec![Panel::Serve],
                Some(p) if p.is_panel() && !p.is_input() => results.push(p),
                _ => {
                    return Err(
                        "names no panel an embed can show (ledger, seq, params, batch, gpus, timeline, textbook, exercises, compare, bench, plan, verify, answers, serve)"
                            .into(),
                    )
                }
            },
        }
        Ok(Layout { inputs: Vec::new(), results })
    }
}

/// The panels an item of `sections=` stands for: the verdict brings the one-click answers on
/// the full page (unless the list places them itself); `share` and `formulas` are not panels.
fn panels_of(p: Panel, embed: bool, listed: &[Panel]) -> Vec<Panel> {
    match p {
        Panel::Verdict if !embed && !listed.contains(&Panel::Answers) => vec![Panel::Verdict, Panel::Answers],
        p if p.is_panel() => vec![p],
        _ => Vec::new(),
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
            let all: Vec<Panel> = settings.sections.iter().flat_map(|p| panels_of(*p, embed, &settings.sections)).collect();
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
        let shown = |p: &Panel| !settings.hides(*p);
        layout.inputs.retain(shown);
        layout.results.retain(shown);
        (layout, problem)
    }
}

/// Whether a panel answers the training step (in serving mode, `mode=serve`, the serving
/// answers take the place of all of them).
fn answers_training(p: Panel) -> bool {
    use Panel::*;
    matches!(p, Verdict | Answers | Bar | Ledger | Verify | Textbook | Charts | Chart(_) | Plan | Bench | Exercises | Compare)
}

impl Layout {
    /// The same page in serving mode (`mode=serve`): the serving fieldset in place of the training
    /// one (the framework files, which describe training runs, go), and the serving answers in
    /// place of the first panel that answers training (the others go); then without what
    /// `hide=` hides. A layout without training panels keeps what it lists.
    pub fn serving(self, settings: &Settings) -> Layout {
        let mut inputs = Vec::new();
        for p in self.inputs {
            match p {
                Panel::Training if !inputs.contains(&Panel::Serving) => inputs.push(Panel::Serving),
                Panel::Training | Panel::Frameworks => {}
                p => inputs.push(p),
            }
        }
        let mut results = Vec::new();
        let has_serve = self.results.contains(&Panel::Serve);
        for p in self.results {
            if !answers_training(p) {
                results.push(p);
            } else if !has_serve && !results.contains(&Panel::Serve) {
                results.push(Panel::Serve);
            }
        }
        let shown = |p: &Panel| !settings.hides(*p);
        inputs.retain(shown);
        results.retain(shown);
        Layout { inputs, results }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plots::ChartKind;

    fn settings(q: &str) -> Settings {
        let pairs: Vec<(String, String)> =
            q.split('&').filter_map(|p| p.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let (s, errors) = Settings::decode(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        assert!(errors.is_empty(), "{q}: {errors:?}");
        s
    }

    #[test]
    fn view_and_sections_name_panels_with_one_spelling_and_old_ones_still_read() {
        // `view=result` (the old spelling) and `view=verdict` are the same embed.
        assert_eq!(Layout::embed("result"), Layout::embed(""));
        assert_eq!(Layout::embed("verdict"), Layout::embed(""));
        assert_eq!(Layout::embed("ledger").map(|l| l.results), Ok(vec![Panel::Verdict, Panel::Bar, Panel::Ledger]));
        assert_eq!(Layout::embed("seq").map(|l| l.results), Ok(vec![Panel::Verdict, Panel::Bar, Panel::Chart(ChartKind::Seq)]));
        assert!(Layout::embed("nonsense").is_err());
        assert!(Layout::embed("share").is_err(), "not a panel");
        // `sections=` reads the same names, the old spelling too.
        let new = Layout::course(&settings("sections=verdict,ledger"), true, "", false).0;
        let old = Layout::course(&settings("sections=result,ledger"), true, "", false).0;
        assert_eq!(new, old);
        assert_eq!(new.results, [Panel::Verdict, Panel::Ledger]);
        // The full page's verdict brings its answers.
        let full = Layout::course(&settings("sections=ledger,verdict"), false, "", false).0;
        assert_eq!(full.results, [Panel::Ledger, Panel::Verdict, Panel::Answers]);
    }

    #[test]
    fn serving_mode_swaps_the_training_fieldset_and_answers_for_the_serving_ones() {
        let (l, _) = Layout::course(&settings(""), false, "", false);
        let s = l.serving(&settings(""));
        assert_eq!(s.inputs, [Panel::Model, Panel::Import, Panel::Architecture, Panel::Serving, Panel::Cluster, Panel::Overhead]);
        assert_eq!(s.results, [Panel::Serve]);
        // An embed's verdict and bar become the serving answers; view=serve shows them alone.
        let (e, _) = Layout::course(&settings("embed=1"), true, "", false);
        assert_eq!(e.serving(&settings("")).results, [Panel::Serve]);
        assert_eq!(Layout::embed("serve").map(|l| l.results), Ok(vec![Panel::Serve]));
        let (v, problem) = Layout::course(&settings("embed=1"), true, "serve", false);
        assert_eq!((v.results.as_slice(), problem), (&[Panel::Serve][..], None));
        // sections= places them like any panel, and hide= takes them out.
        let (c, _) = Layout::course(&settings("sections=serving,serve"), true, "", false);
        assert_eq!(c.results, [Panel::Serving, Panel::Serve]);
        let hidden = settings("hide=serve");
        assert_eq!(Layout::course(&hidden, false, "", false).0.serving(&hidden).results, Vec::<Panel>::new());
    }

    #[test]
    fn hide_takes_a_panel_with_what_goes_with_it() {
        let (l, _) = Layout::course(&settings("hide=verdict,inputs"), false, "", false);
        assert!(!l.results.contains(&Panel::Verdict) && !l.results.contains(&Panel::Answers));
        assert_eq!(l.inputs, [Panel::Import, Panel::Frameworks, Panel::Architecture]);
        let (l, _) = Layout::course(&settings("hide=ledger"), false, "", false);
        assert!(!l.results.contains(&Panel::Ledger) && !l.results.contains(&Panel::Verify));
        let (l, _) = Layout::course(&settings("embed=1&hide=charts"), true, "seq", false);
        assert_eq!(l.results, [Panel::Verdict, Panel::Bar]);
    }
}
