//! How the sequence chart is drawn, as the address keeps it (`chart=`, a presentation key: it
//! changes no figure, only what the chart shows).

/// How the sequence chart is drawn (`chart=log,recipes`): its memory axis logarithmic, and the
/// recipes (none, op-level SAC, full, torch.compile) compared beside the configuration's own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChartView {
    pub log_y: bool,
    pub recipes: bool,
}

impl ChartView {
    const WORDS: [&'static str; 2] = ["log", "recipes"];

    /// Reads `chart=`'s comma-separated words; an unknown one is an error naming the words.
    pub fn parse(v: &str) -> Result<ChartView, String> {
        let mut out = ChartView::default();
        for w in v.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match w {
                "log" => out.log_y = true,
                "recipes" => out.recipes = true,
                other => return Err(format!("'{other}' is not one of {}, comma-separated", Self::WORDS.join(", "))),
            }
        }
        Ok(out)
    }

    /// `chart=`'s value, or `None` for the default (nothing to write).
    pub fn encode(&self) -> Option<String> {
        let words: Vec<&str> = Self::WORDS.iter().zip([self.log_y, self.recipes]).filter(|(_, on)| *on).map(|(w, _)| *w).collect();
        (!words.is_empty()).then(|| words.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_view_round_trips_through_its_words_in_a_fixed_order() {
        let both = ChartView { log_y: true, recipes: true };
        assert_eq!(both.encode().as_deref(), Some("log,recipes"));
        assert_eq!(ChartView::parse("recipes, log"), Ok(both));
        assert_eq!(ChartView::parse("recipes").map(|v| v.encode()), Ok(Some("recipes".to_string())));
        // The default writes nothing, and an empty value reads as it.
        assert_eq!(ChartView::default().encode(), None);
        assert_eq!(ChartView::parse(""), Ok(ChartView::default()));
    }

    #[test]
    fn an_unknown_chart_word_is_named_with_the_words_it_could_be() {
        let e = ChartView::parse("log,linear").expect_err("refused");
        assert!(e.contains("'linear'") && e.contains("log, recipes"), "{e}");
    }
}
