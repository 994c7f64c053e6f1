//! Colours and type of the charts: light, dark and projector (high contrast, large type), the
//! Okabe–Ito series palette, and the colour of each ledger category (the same in every chart
//! and in the ledger's swatches).

use crate::estimator::ledger::Category;
use plotters::style::RGBColor;

/// One chart theme.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Theme {
    pub background: RGBColor,
    pub foreground: RGBColor,
    pub muted: RGBColor,
    pub grid: RGBColor,
    /// The capacity line and OOM marks.
    pub alert: RGBColor,
    /// Type size in percent of the charts' base sizes (projector: larger).
    pub text: u32,
}

impl Theme {
    /// A font size of the charts (12 for tick labels, 15 for titles) in this theme's type.
    pub fn px(&self, base: u32) -> u32 {
        (base * self.text).div_ceil(100)
    }
}

pub const LIGHT: Theme = Theme {
    background: RGBColor(255, 255, 255),
    foreground: RGBColor(28, 28, 32),
    muted: RGBColor(88, 88, 96),
    grid: RGBColor(226, 226, 232),
    alert: RGBColor(200, 0, 60),
    text: 100,
};

pub const DARK: Theme = Theme {
    background: RGBColor(24, 24, 28),
    foreground: RGBColor(232, 232, 236),
    muted: RGBColor(170, 170, 180),
    grid: RGBColor(58, 58, 66),
    alert: RGBColor(255, 96, 128),
    text: 100,
};

/// For a room's projector: black on white, darker grid and muted text, type a quarter larger.
pub const PROJECTOR: Theme = Theme {
    background: RGBColor(255, 255, 255),
    foreground: RGBColor(0, 0, 0),
    muted: RGBColor(40, 40, 40),
    grid: RGBColor(170, 170, 170),
    alert: RGBColor(180, 0, 40),
    text: 125,
};

/// Okabe & Ito (2008), "Color Universal Design": distinguishable with the common colour-vision
/// deficiencies and legible on both backgrounds.
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

/// The colour of a ledger category.
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
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(7);
    s.push('#');
    for b in [c.0, c.1, c.2] {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_category_has_a_distinct_colour() {
        let mut colours: Vec<String> = Category::ALL.iter().map(|&c| hex(category_color(c))).collect();
        colours.sort();
        colours.dedup();
        assert_eq!(colours.len(), Category::ALL.len());
    }

    #[test]
    fn colours_print_as_css_hex() {
        assert_eq!(hex(RGBColor(0, 114, 178)), "#0072b2");
        assert_eq!(hex(RGBColor(255, 255, 255)), "#ffffff");
    }

    #[test]
    fn the_projector_theme_has_larger_type() {
        assert_eq!(LIGHT.px(12), 12);
        assert_eq!(PROJECTOR.px(12), 15);
    }
}
