//! Formulas that evaluate to the bytes they explain.
//!
//! Every ledger row carries an [`Expr`]: the formula in symbols (`Ψ_T × b_g`), and — because each
//! symbol is bound to this configuration's value — the same formula with numbers substituted
//! (`8,030,261,248 × 2`). The row's bytes are *computed from the expression*, so the formula a
//! student reads and the figure the estimator reports can never drift apart.
//!
//! Two paths, one source. Building every formula tree costs allocations; the planner and the
//! charts need millions of estimates and only their numbers. Inside [`numbers_only`] every
//! constructor below folds at once to a bare [`Expr::Num`] (no symbols, no heap), so the very
//! same term functions yield the numbers (`estimator::estimate`) or the explained formulas
//! (`estimator::explain`); a test checks the two agree on every preset.
//!
//! Arithmetic is on `u128`, saturating: 405 B parameters × 16,384 GPUs × a million tokens of eager
//! attention scores is ~10²¹ bytes, past `u64` but nowhere near `u128`. Division rounds up
//! ([`Expr::ceil_div`]) where it models a shard (a rank holds ⌈n/N⌉ elements, padding included)
//! and down ([`Expr::floor_div`]) only where the source divides exactly.

use serde::Serialize;
use std::cell::Cell;
use std::fmt::Write as _;

thread_local! {
    /// Set while [`numbers_only`] runs: constructors fold to values instead of building trees.
    static NUMERIC: Cell<bool> = const { Cell::new(false) };
}

/// Whether formulas are being folded to their values (inside [`numbers_only`]).
pub fn is_numeric() -> bool {
    NUMERIC.with(Cell::get)
}

/// Runs `f` with every [`Expr`] constructor folding to its value: the fast numeric path.
/// Re-entrant; the previous mode is restored even if `f` unwinds.
pub fn numbers_only<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            NUMERIC.with(|n| n.set(self.0));
        }
    }
    let _restore = Restore(NUMERIC.with(|n| n.replace(true)));
    f()
}

/// Runs `f` with full formula trees, even inside [`numbers_only`].
pub fn with_formulas<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            NUMERIC.with(|n| n.set(self.0));
        }
    }
    let _restore = Restore(NUMERIC.with(|n| n.replace(false)));
    f()
}

/// A mathematical symbol with an optional subscript, e.g. `Ψ` or `b` with subscript `grad`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Sym {
    pub base: &'static str,
    pub sub: &'static str,
    /// What the symbol stands for, shown as a legend under the formula.
    pub meaning: &'static str,
}

impl Sym {
    pub const fn new(base: &'static str, sub: &'static str, meaning: &'static str) -> Self {
        Sym { base, sub, meaning }
    }

    fn text(&self) -> String {
        if self.sub.is_empty() {
            self.base.to_string()
        } else {
            format!("{}_{}", self.base, self.sub)
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// A configuration quantity bound to its value.
    Var(Sym, u128),
    /// A named constant of the code (`ADAM_STATES = 2`); rendered as its value.
    Const(&'static str, u128),
    Sum(Vec<Expr>),
    Prod(Vec<Expr>),
    /// ⌈a / b⌉ — a shard, a block count.
    CeilDiv(Box<Expr>, Box<Expr>),
    /// ⌊a / b⌋ — only where the division is exact by construction.
    FloorDiv(Box<Expr>, Box<Expr>),
    Max(Vec<Expr>),
    Min(Vec<Expr>),
    /// A bare number that is not a named quantity (a count of 1, a percentage's 100).
    Num(u128),
}

impl Expr {
    pub fn var(sym: Sym, value: impl Into<u128>) -> Expr {
        if is_numeric() {
            return Expr::Num(value.into());
        }
        Expr::Var(sym, value.into())
    }
    pub fn konst(name: &'static str, value: impl Into<u128>) -> Expr {
        if is_numeric() {
            return Expr::Num(value.into());
        }
        Expr::Const(name, value.into())
    }
    pub fn num(value: impl Into<u128>) -> Expr {
        Expr::Num(value.into())
    }
    pub fn zero() -> Expr {
        Expr::Num(0)
    }
    pub fn prod(factors: impl IntoIterator<Item = Expr>) -> Expr {
        if is_numeric() {
            return Expr::Num(factors.into_iter().fold(1u128, |a, e| a.saturating_mul(e.eval())));
        }
        let v: Vec<Expr> = factors.into_iter().collect();
        if v.len() == 1 {
            v.into_iter().next().unwrap_or(Expr::Num(1))
        } else {
            Expr::Prod(v)
        }
    }
    /// A sum; literal zeros are dropped.
    pub fn sum(terms: impl IntoIterator<Item = Expr>) -> Expr {
        if is_numeric() {
            return Expr::Num(terms.into_iter().fold(0u128, |a, e| a.saturating_add(e.eval())));
        }
        let v: Vec<Expr> = terms.into_iter().filter(|t| *t != Expr::Num(0)).collect();
        match v.len() {
            0 => Expr::Num(0),
            1 => v.into_iter().next().unwrap_or(Expr::Num(0)),
            _ => Expr::Sum(v),
        }
    }
    /// A sum whose identical terms are gathered: `x + y + x` → `2 × x + y`.
    pub fn sum_merged(terms: impl IntoIterator<Item = Expr>) -> Expr {
        if is_numeric() {
            return Expr::sum(terms);
        }
        let mut groups: Vec<(Expr, u128)> = Vec::new();
        for t in terms.into_iter().filter(|t| *t != Expr::Num(0)) {
            match groups.iter_mut().find(|(g, _)| *g == t) {
                Some((_, n)) => *n += 1,
                None => groups.push((t, 1)),
            }
        }
        Expr::sum(groups.into_iter().map(|(t, n)| match (n, t) {
            (1, t) => t,
            (n, Expr::Prod(mut f)) => {
                f.insert(0, Expr::Num(n));
                Expr::Prod(f)
            }
            (n, t) => Expr::Prod(vec![Expr::Num(n), t]),
        }))
    }
    /// The largest of the terms (alternatives that never coexist).
    pub fn max(terms: impl IntoIterator<Item = Expr>) -> Expr {
        if is_numeric() {
            return Expr::Num(terms.into_iter().map(|e| e.eval()).max().unwrap_or(0));
        }
        Expr::Max(terms.into_iter().collect())
    }
    /// The smallest of the terms (a cap).
    pub fn min(terms: impl IntoIterator<Item = Expr>) -> Expr {
        if is_numeric() {
            return Expr::Num(terms.into_iter().map(|e| e.eval()).min().unwrap_or(0));
        }
        Expr::Min(terms.into_iter().collect())
    }

    pub fn ceil_div(self, by: Expr) -> Expr {
        if is_numeric() {
            let b = by.eval();
            return Expr::Num(if b == 0 { 0 } else { self.eval().div_ceil(b) });
        }
        Expr::CeilDiv(Box::new(self), Box::new(by))
    }
    pub fn floor_div(self, by: Expr) -> Expr {
        if is_numeric() {
            return Expr::Num(self.eval().checked_div(by.eval()).unwrap_or(0));
        }
        Expr::FloorDiv(Box::new(self), Box::new(by))
    }
    pub fn times(self, other: Expr) -> Expr {
        if is_numeric() {
            return Expr::Num(self.eval().saturating_mul(other.eval()));
        }
        match self {
            Expr::Prod(mut v) => {
                v.push(other);
                Expr::Prod(v)
            }
            e => Expr::Prod(vec![e, other]),
        }
    }
    pub fn plus(self, other: Expr) -> Expr {
        if is_numeric() {
            return Expr::Num(self.eval().saturating_add(other.eval()));
        }
        match self {
            Expr::Sum(mut v) => {
                v.push(other);
                Expr::Sum(v)
            }
            e => Expr::Sum(vec![e, other]),
        }
    }
    /// Divides by `by` rounding up, but writes nothing when `by` is the number 1 — so a
    /// single-GPU formula reads `Ψ × b` rather than `⌈Ψ × b / 1⌉`.
    pub fn shard(self, by: Expr) -> Expr {
        if by.eval() == 1 && matches!(by, Expr::Num(_)) {
            self
        } else {
            self.ceil_div(by)
        }
    }

    /// The value, saturating at `u128::MAX`; division by zero gives zero (never reached from a
    /// validated configuration, and never a panic).
    pub fn eval(&self) -> u128 {
        match self {
            Expr::Var(_, v) | Expr::Const(_, v) | Expr::Num(v) => *v,
            Expr::Sum(v) => v.iter().fold(0u128, |a, e| a.saturating_add(e.eval())),
            Expr::Prod(v) => v.iter().fold(1u128, |a, e| a.saturating_mul(e.eval())),
            Expr::CeilDiv(a, b) => {
                let (a, b) = (a.eval(), b.eval());
                if b == 0 {
                    0
                } else {
                    a.div_ceil(b)
                }
            }
            Expr::FloorDiv(a, b) => {
                let (a, b) = (a.eval(), b.eval());
                a.checked_div(b).unwrap_or(0)
            }
            Expr::Max(v) => v.iter().map(Expr::eval).max().unwrap_or(0),
            Expr::Min(v) => v.iter().map(Expr::eval).min().unwrap_or(0),
        }
    }

    /// The formula in symbols, plain text: `⌈Ψ_T / N_d⌉ × b_g`.
    pub fn symbolic(&self) -> String {
        let mut s = String::new();
        self.write_text(&mut s, false, Prec::Top);
        s
    }

    /// The same formula with this configuration's numbers: `⌈8,030,261,248 / 8⌉ × 2`.
    pub fn substituted(&self) -> String {
        let mut s = String::new();
        self.write_text(&mut s, true, Prec::Top);
        s
    }

    /// The symbols used, in order of first appearance, each once (the formula's legend).
    pub fn symbols(&self) -> Vec<(Sym, u128)> {
        let mut out: Vec<(Sym, u128)> = Vec::new();
        self.collect_symbols(&mut out);
        out
    }

    fn collect_symbols(&self, out: &mut Vec<(Sym, u128)>) {
        match self {
            Expr::Var(s, v) => {
                if !out.iter().any(|(o, _)| o == s) {
                    out.push((*s, *v));
                }
            }
            Expr::Sum(v) | Expr::Prod(v) | Expr::Max(v) | Expr::Min(v) => v.iter().for_each(|e| e.collect_symbols(out)),
            Expr::CeilDiv(a, b) | Expr::FloorDiv(a, b) => {
                a.collect_symbols(out);
                b.collect_symbols(out);
            }
            Expr::Const(..) | Expr::Num(_) => {}
        }
    }

    fn write_text(&self, s: &mut String, numbers: bool, outer: Prec) {
        match self {
            Expr::Var(sym, v) => {
                if numbers {
                    s.push_str(&group_digits(*v))
                } else {
                    s.push_str(&sym.text())
                }
            }
            Expr::Const(_, v) | Expr::Num(v) => s.push_str(&group_digits(*v)),
            Expr::Sum(v) => {
                let paren = outer > Prec::Sum;
                if paren {
                    s.push('(');
                }
                for (i, e) in v.iter().enumerate() {
                    if i > 0 {
                        s.push_str(" + ");
                    }
                    e.write_text(s, numbers, Prec::Sum);
                }
                if paren {
                    s.push(')');
                }
            }
            Expr::Prod(v) => {
                let paren = outer > Prec::Prod;
                if paren {
                    s.push('(');
                }
                for (i, (e, n)) in runs(v).into_iter().enumerate() {
                    if i > 0 {
                        s.push_str(" × ");
                    }
                    e.write_text(s, numbers, Prec::Prod);
                    if n > 1 {
                        s.push_str(&superscript(n));
                    }
                }
                if paren {
                    s.push(')');
                }
            }
            Expr::CeilDiv(a, b) => {
                s.push('⌈');
                a.write_text(s, numbers, Prec::Prod);
                s.push_str(" / ");
                b.write_text(s, numbers, Prec::Atom);
                s.push('⌉');
            }
            Expr::FloorDiv(a, b) => {
                let paren = outer > Prec::Prod;
                if paren {
                    s.push('(');
                }
                a.write_text(s, numbers, Prec::Prod);
                s.push_str(" / ");
                b.write_text(s, numbers, Prec::Atom);
                if paren {
                    s.push(')');
                }
            }
            Expr::Max(v) | Expr::Min(v) => {
                s.push_str(if matches!(self, Expr::Max(_)) { "max(" } else { "min(" });
                for (i, e) in v.iter().enumerate() {
                    if i > 0 {
                        s.push_str(", ");
                    }
                    e.write_text(s, numbers, Prec::Top);
                }
                s.push(')');
            }
        }
    }

    /// Presentation MathML (the `<math>` element's content) of the formula, in symbols or with
    /// numbers. Only symbols and digits of our own go in; every text is escaped all the same.
    pub fn mathml(&self, numbers: bool) -> String {
        let mut s = String::new();
        self.write_mathml(&mut s, numbers, Prec::Top);
        s
    }

    fn write_mathml(&self, s: &mut String, numbers: bool, outer: Prec) {
        match self {
            Expr::Var(sym, v) => {
                if numbers {
                    let _ = write!(s, "<mn>{}</mn>", group_digits(*v));
                } else if sym.sub.is_empty() {
                    let _ = write!(s, "<mi>{}</mi>", escape(sym.base));
                } else {
                    let _ = write!(s, "<msub><mi>{}</mi><mtext>{}</mtext></msub>", escape(sym.base), escape(sym.sub));
                }
            }
            Expr::Const(_, v) | Expr::Num(v) => {
                let _ = write!(s, "<mn>{}</mn>", group_digits(*v));
            }
            Expr::Sum(v) | Expr::Prod(v) => {
                let (op, prec) = if matches!(self, Expr::Sum(_)) { ("+", Prec::Sum) } else { ("×", Prec::Prod) };
                let paren = outer > prec;
                s.push_str("<mrow>");
                if paren {
                    s.push_str("<mo>(</mo>");
                }
                let items: Vec<(&Expr, usize)> = if prec == Prec::Prod { runs(v) } else { v.iter().map(|e| (e, 1)).collect() };
                for (i, (e, n)) in items.into_iter().enumerate() {
                    if i > 0 {
                        let _ = write!(s, "<mo>{op}</mo>");
                    }
                    if n > 1 {
                        s.push_str("<msup>");
                        e.write_mathml(s, numbers, Prec::Atom);
                        let _ = write!(s, "<mn>{n}</mn></msup>");
                    } else {
                        e.write_mathml(s, numbers, prec);
                    }
                }
                if paren {
                    s.push_str("<mo>)</mo>");
                }
                s.push_str("</mrow>");
            }
            Expr::CeilDiv(a, b) => {
                s.push_str("<mrow><mo>⌈</mo><mfrac><mrow>");
                a.write_mathml(s, numbers, Prec::Top);
                s.push_str("</mrow><mrow>");
                b.write_mathml(s, numbers, Prec::Top);
                s.push_str("</mrow></mfrac><mo>⌉</mo></mrow>");
            }
            Expr::FloorDiv(a, b) => {
                s.push_str("<mfrac><mrow>");
                a.write_mathml(s, numbers, Prec::Top);
                s.push_str("</mrow><mrow>");
                b.write_mathml(s, numbers, Prec::Top);
                s.push_str("</mrow></mfrac>");
            }
            Expr::Max(v) | Expr::Min(v) => {
                let name = if matches!(self, Expr::Max(_)) { "max" } else { "min" };
                let _ = write!(s, "<mrow><mi>{name}</mi><mo>(</mo>");
                for (i, e) in v.iter().enumerate() {
                    if i > 0 {
                        s.push_str("<mo>,</mo>");
                    }
                    e.write_mathml(s, numbers, Prec::Top);
                }
                s.push_str("<mo>)</mo></mrow>");
            }
        }
    }
}

/// Consecutive equal symbols of a product, counted (`s × s` → `(s, 2)`, shown as s²).
fn runs(v: &[Expr]) -> Vec<(&Expr, usize)> {
    let mut out: Vec<(&Expr, usize)> = Vec::new();
    for e in v {
        match out.last_mut() {
            Some((last, n)) if matches!(e, Expr::Var(..)) && *last == e => *n += 1,
            _ => out.push((e, 1)),
        }
    }
    out
}

fn superscript(n: usize) -> String {
    const DIGITS: [char; 10] = ['⁰', '¹', '²', '³', '⁴', '⁵', '⁶', '⁷', '⁸', '⁹'];
    n.to_string().chars().map(|c| c.to_digit(10).map_or(c, |d| DIGITS[d as usize])).collect()
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Prec {
    Top,
    Sum,
    Prod,
    Atom,
}

/// `8030261248` → `8,030,261,248`.
pub fn group_digits(v: u128) -> String {
    let digits = v.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Escapes the five XML-significant characters.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PSI: Sym = Sym::new("Ψ", "", "parameters");
    const N: Sym = Sym::new("N", "d", "data-parallel ranks");

    #[test]
    fn a_sharded_product_evaluates_with_ceiling_division() {
        // (4 + 12) × ⌈7 / 2⌉ = 16 × 4 = 64: each of two ranks holds 4 of the 7 elements.
        let e = Expr::sum([Expr::num(4u8), Expr::konst("K", 12u8)]).times(Expr::var(PSI, 7u8).ceil_div(Expr::var(N, 2u8)));
        assert_eq!(e.eval(), 64);
        assert_eq!(e.symbolic(), "(4 + 12) × ⌈Ψ / N_d⌉");
        assert_eq!(e.substituted(), "(4 + 12) × ⌈7 / 2⌉");
    }

    #[test]
    fn repeated_symbols_render_as_powers() {
        let s = Sym::new("s", "", "tokens");
        let e = Expr::prod([Expr::num(4u8), Expr::var(s, 3u8), Expr::var(s, 3u8)]);
        assert_eq!(e.symbolic(), "4 × s²");
        assert_eq!(e.substituted(), "4 × 3²");
        assert_eq!(e.eval(), 36);
        assert!(e.mathml(false).contains("<msup><mi>s</mi><mn>2</mn></msup>"));
    }

    #[test]
    fn identical_terms_of_a_sum_are_gathered() {
        let x = Expr::prod([Expr::num(4u8), Expr::var(PSI, 2u8)]);
        let e = Expr::sum_merged([x.clone(), Expr::var(N, 5u8), x]);
        assert_eq!(e.symbolic(), "2 × 4 × Ψ + N_d");
        assert_eq!(e.eval(), 21);
    }

    #[test]
    fn digits_are_grouped_in_thousands() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
        assert_eq!(group_digits(8_030_261_248), "8,030,261,248");
    }

    #[test]
    fn arithmetic_saturates_instead_of_overflowing() {
        let e = Expr::prod([Expr::num(u128::MAX), Expr::num(2u8)]);
        assert_eq!(e.eval(), u128::MAX);
        assert_eq!(Expr::num(5u8).ceil_div(Expr::num(0u8)).eval(), 0);
    }

    #[test]
    fn sharding_by_the_number_one_writes_nothing() {
        let e = Expr::var(PSI, 10u8).shard(Expr::num(1u8));
        assert_eq!(e.symbolic(), "Ψ");
        let e = Expr::var(PSI, 10u8).shard(Expr::var(N, 1u8));
        assert_eq!(e.symbolic(), "⌈Ψ / N_d⌉");
    }

    #[test]
    fn mathml_uses_subscripts_and_escapes_text() {
        let e = Expr::var(Sym::new("b", "<g>", "x"), 2u8);
        assert_eq!(e.mathml(false), "<msub><mi>b</mi><mtext>&lt;g&gt;</mtext></msub>");
        assert_eq!(e.mathml(true), "<mn>2</mn>");
    }

    #[test]
    fn the_numeric_path_folds_the_same_formula_to_the_same_value() {
        let build = || {
            Expr::sum_merged([
                Expr::prod([Expr::konst("K", 4u8), Expr::var(PSI, 7u8)]).ceil_div(Expr::var(N, 2u8)),
                Expr::max([Expr::var(N, 3u8), Expr::num(5u8)]),
                Expr::min([Expr::var(PSI, 9u8), Expr::num(6u8)]).times(Expr::num(2u8)),
            ])
        };
        // ⌈4 × 7 / 2⌉ + max(3, 5) + min(9, 6) × 2 = 14 + 5 + 12 = 31.
        let explained = build();
        let numeric = numbers_only(build);
        assert_eq!(explained.eval(), 31);
        assert_eq!(numeric, Expr::Num(31));
        assert!(explained.symbolic().contains("Ψ"));
    }

    #[test]
    fn the_numeric_mode_is_restored_after_it_ends_and_can_be_suspended() {
        assert!(!is_numeric());
        numbers_only(|| {
            assert!(is_numeric());
            with_formulas(|| assert!(matches!(Expr::var(PSI, 1u8), Expr::Var(..))));
            assert!(is_numeric());
        });
        assert!(!is_numeric());
    }

    #[test]
    fn symbols_are_listed_once_in_order_of_appearance() {
        let e = Expr::prod([Expr::var(PSI, 3u8), Expr::var(N, 2u8), Expr::var(PSI, 3u8)]);
        let names: Vec<&str> = e.symbols().iter().map(|(s, _)| s.base).collect();
        assert_eq!(names, ["Ψ", "N"]);
    }
}
