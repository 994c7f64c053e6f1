//! The ledger: one row per memory component, each with its bytes, its formula and its source.

use super::expr::{Expr, Sym};
use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};
use std::borrow::Cow;

/// Bytes. `u128` so that no realistic cluster-wide figure overflows.
pub type Bytes = u128;

/// The summary bucket a row is counted in (`memory.*` in the CLI's JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameters,
    Gradients,
    OptimizerStates,
    Activations,
    /// Working memory that exists only around the peak (backward's temporaries, the
    /// optimizer step's temporaries).
    Transient,
    FrameworkOverhead,
}

impl Category {
    pub const ALL: [Category; 6] = [
        Category::Parameters,
        Category::Gradients,
        Category::OptimizerStates,
        Category::Activations,
        Category::Transient,
        Category::FrameworkOverhead,
    ];
    pub fn label(self) -> &'static str {
        match self {
            Category::Parameters => "Parameters",
            Category::Gradients => "Gradients",
            Category::OptimizerStates => "Optimizer states",
            Category::Activations => "Activations",
            Category::Transient => "Transient buffers",
            Category::FrameworkOverhead => "Framework overhead",
        }
    }
}

/// One component of memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Stable machine name (`weights`, `optimizer_states`, `activations.attention`, …).
    pub id: &'static str,
    pub label: Cow<'static, str>,
    pub category: Category,
    pub bytes: Bytes,
    /// The formula whose value is `bytes`.
    pub expr: Expr,
    /// Paper (table/section) or framework file the formula follows.
    pub source: &'static str,
    /// Dtype assumptions and caveats, in a sentence or two.
    pub note: Cow<'static, str>,
    /// Sub-rows whose bytes add up to this row's.
    pub children: Vec<Row>,
}

impl Row {
    /// A row whose bytes are its formula's value.
    pub fn new(id: &'static str, label: impl Into<Cow<'static, str>>, category: Category, expr: Expr, source: &'static str) -> Row {
        Row { id, label: label.into(), category, bytes: expr.eval(), expr, source, note: Cow::Borrowed(""), children: Vec::new() }
    }
    pub fn note(mut self, note: impl Into<Cow<'static, str>>) -> Row {
        self.note = note.into();
        self
    }
    /// A row that is the sum of its children; its formula is the sum of theirs by symbol.
    pub fn parent(
        id: &'static str,
        label: impl Into<Cow<'static, str>>,
        category: Category,
        children: Vec<Row>,
        source: &'static str,
    ) -> Row {
        let sym_terms =
            children.iter().map(|c| Expr::var(Sym::new("M", c.id.rsplit('.').next().unwrap_or(c.id), "a sub-row's bytes"), c.bytes));
        let expr = Expr::sum(sym_terms);
        Row { id, label: label.into(), category, bytes: expr.eval(), expr, source, note: Cow::Borrowed(""), children }
    }
}

impl Serialize for Row {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Row", 8)?;
        st.serialize_field("name", self.id)?;
        st.serialize_field("label", &self.label)?;
        st.serialize_field("category", &self.category)?;
        st.serialize_field("bytes", &self.bytes)?;
        st.serialize_field("formula", &self.expr.symbolic())?;
        st.serialize_field("substituted", &self.expr.substituted())?;
        st.serialize_field("source", self.source)?;
        st.serialize_field("note", &self.note)?;
        if !self.children.is_empty() {
            st.serialize_field("children", &self.children)?;
        }
        st.end()
    }
}

/// Per-GPU bytes by category.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub parameters: Bytes,
    pub gradients: Bytes,
    pub optimizer_states: Bytes,
    pub activations: Bytes,
    pub transient: Bytes,
    pub framework_overhead: Bytes,
    /// Sum of every row.
    pub total: Bytes,
}

impl Summary {
    pub fn of(rows: &[Row]) -> Summary {
        let mut s = Summary::default();
        for r in rows {
            let slot = match r.category {
                Category::Parameters => &mut s.parameters,
                Category::Gradients => &mut s.gradients,
                Category::OptimizerStates => &mut s.optimizer_states,
                Category::Activations => &mut s.activations,
                Category::Transient => &mut s.transient,
                Category::FrameworkOverhead => &mut s.framework_overhead,
            };
            *slot = slot.saturating_add(r.bytes);
            s.total = s.total.saturating_add(r.bytes);
        }
        s
    }
    pub fn get(&self, c: Category) -> Bytes {
        match c {
            Category::Parameters => self.parameters,
            Category::Gradients => self.gradients,
            Category::OptimizerStates => self.optimizer_states,
            Category::Activations => self.activations,
            Category::Transient => self.transient,
            Category::FrameworkOverhead => self.framework_overhead,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parent_row_is_the_sum_of_its_children() {
        let a = Row::new("a", "A", Category::Activations, Expr::num(3u8), "");
        let b = Row::new("b", "B", Category::Activations, Expr::num(4u8), "");
        let p = Row::parent("p", "P", Category::Activations, vec![a, b], "");
        assert_eq!(p.bytes, 7);
        assert_eq!(p.expr.symbolic(), "M_a + M_b");
        let c = Row::new("x.norms", "N", Category::Activations, Expr::num(1u8), "");
        assert_eq!(Row::parent("x", "X", Category::Activations, vec![c], "").expr.symbolic(), "M_norms");
    }

    #[test]
    fn the_summary_total_adds_every_category() {
        let rows = vec![
            Row::new("w", "W", Category::Parameters, Expr::num(10u8), ""),
            Row::new("g", "G", Category::Gradients, Expr::num(5u8), ""),
            Row::new("o", "O", Category::FrameworkOverhead, Expr::num(1u8), ""),
        ];
        let s = Summary::of(&rows);
        assert_eq!((s.parameters, s.gradients, s.framework_overhead, s.total), (10, 5, 1, 16));
    }
}
