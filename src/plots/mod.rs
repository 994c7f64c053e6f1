//! Charts, generic over plotters' `DrawingBackend`: data in, pixels out. The browser draws them
//! on `<canvas>` (plotters-canvas), native tests render them to SVG strings and assert on what
//! they contain.

pub mod bar;

use crate::estimator::config::Unit;
use crate::estimator::ledger::{Bytes, Category};
use crate::estimator::units::in_unit;
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
    crate::estimator::units::format_count(v.max(0.0) as u64)
}

/// Bytes in the display unit as a float (chart coordinates).
pub fn y_of(bytes: Bytes, unit: Unit) -> f64 {
    in_unit(bytes, unit)
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
    fn every_category_has_a_distinct_colour() {
        let mut colours: Vec<String> = Category::ALL.iter().map(|&c| hex(category_color(c))).collect();
        colours.sort();
        colours.dedup();
        assert_eq!(colours.len(), Category::ALL.len());
    }
}
