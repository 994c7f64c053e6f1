//! The numbers behind a chart: one row per x value, one column per series. The hover read-out,
//! the keyboard read-out and the CSV export all read this table, so what they report is exactly
//! what the chart drew.

use crate::estimator::config::Unit;
use crate::estimator::ledger::Bytes;
use crate::estimator::units::format_bytes;
use plotters::style::RGBColor;

/// One series of a chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    /// CSV header: snake case, with its unit (`activations_bytes`).
    pub key: String,
    /// What the legend calls it.
    pub label: String,
    pub color: RGBColor,
    /// Bytes at each x (`None`: not computable there, e.g. an invalid configuration).
    pub values: Vec<Option<Bytes>>,
}

/// The data of a chart as rows and columns.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// CSV header of the x column (`seq`, `parameters`, `event`).
    pub x_key: String,
    /// The x axis' title (`Sequence length (tokens)`).
    pub x_title: String,
    /// The x values, in chart coordinates.
    pub x: Vec<f64>,
    /// How the read-out names each x value (`8,192 tokens`, `forward layer 12`).
    pub x_text: Vec<String>,
    /// Whether the CSV carries `x_text` as a second column (when it is more than the number).
    pub text_in_csv: bool,
    pub columns: Vec<Column>,
}

/// One series' value at one x, for the read-out.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    pub label: String,
    pub color: RGBColor,
    pub bytes: Option<Bytes>,
}

impl Table {
    pub fn len(&self) -> usize {
        self.x.len()
    }
    pub fn is_empty(&self) -> bool {
        self.x.is_empty()
    }

    /// Every series' value at row `i`.
    pub fn readings(&self, i: usize) -> Vec<Reading> {
        self.columns.iter().map(|c| Reading { label: c.label.clone(), color: c.color, bytes: c.values.get(i).copied().flatten() }).collect()
    }

    /// Row `i` in words, for screen readers: "8,192 tokens: Parameters 16.06 GB, …".
    pub fn sentence(&self, i: usize, unit: Unit) -> String {
        let Some(x) = self.x_text.get(i) else { return String::new() };
        let values: Vec<String> = self
            .readings(i)
            .into_iter()
            .map(|r| format!("{} {}", r.label, r.bytes.map_or_else(|| "n/a".to_string(), |b| format_bytes(b, unit))))
            .collect();
        format!("{x}: {}", values.join(", "))
    }

    /// The table as CSV: a header, then one line per x; values in bytes (exact integers), an
    /// empty field where a value does not exist.
    pub fn csv(&self) -> String {
        let mut out = String::new();
        let mut header = vec![csv_field(&self.x_key)];
        if self.text_in_csv {
            header.push("label".to_string());
        }
        header.extend(self.columns.iter().map(|c| csv_field(&c.key)));
        out.push_str(&header.join(","));
        out.push('\n');
        for i in 0..self.x.len() {
            let mut row = vec![number(self.x[i])];
            if self.text_in_csv {
                row.push(csv_field(&self.x_text[i]));
            }
            row.extend(self.columns.iter().map(|c| c.values.get(i).copied().flatten().map_or_else(String::new, |b| b.to_string())));
            out.push_str(&row.join(","));
            out.push('\n');
        }
        out
    }
}

/// An x value as CSV writes it: integers without a fraction.
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e18 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// RFC 4180 quoting where needed.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// One column per ledger category of a stacked chart's points.
pub fn stack_columns(stack: &[[Bytes; 6]]) -> Vec<Column> {
    use crate::estimator::ledger::Category;
    // Every one of the ledger's categories, under its name, a category none of which is in use
    // at the peak included (its 0 is what the ledger's "At the peak" column says too).
    Category::ALL
        .iter()
        .enumerate()
        .map(|(i, c)| Column {
            key: key_of(c.label()),
            label: c.label().to_string(),
            color: super::theme::category_color(*c),
            values: stack.iter().map(|s| Some(s[i])).collect(),
        })
        .collect()
}

/// A series key from a label: `Optimizer states` → `optimizer_states_bytes`.
pub fn key_of(label: &str) -> String {
    let mut k = String::new();
    for ch in label.chars() {
        if ch.is_ascii_alphanumeric() {
            k.push(ch.to_ascii_lowercase());
        } else if !k.ends_with('_') && !k.is_empty() {
            k.push('_');
        }
    }
    let k = k.trim_end_matches('_');
    format!("{k}_bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> Table {
        Table {
            x_key: "event".into(),
            x_title: "Event".into(),
            x: vec![0.0, 1.0],
            x_text: vec!["step start".into(), "forward layer 1, \"q\"".into()],
            text_in_csv: true,
            columns: vec![
                Column { key: "a_bytes".into(), label: "A".into(), color: RGBColor(0, 0, 0), values: vec![Some(10), None] },
                Column { key: "b_bytes".into(), label: "B".into(), color: RGBColor(0, 0, 0), values: vec![Some(2_000_000_000), Some(3)] },
            ],
        }
    }

    #[test]
    fn the_csv_has_a_header_one_line_per_x_and_quotes_what_needs_quoting() {
        assert_eq!(toy().csv(), "event,label,a_bytes,b_bytes\n0,step start,10,2000000000\n1,\"forward layer 1, \"\"q\"\"\",,3\n");
    }

    #[test]
    fn a_row_reads_as_a_sentence_in_the_chosen_unit() {
        let f = |b| format_bytes(b, Unit::Gb);
        assert_eq!(toy().sentence(0, Unit::Gb), format!("step start: A {}, B 2.00 GB", f(10)));
        assert_eq!(toy().sentence(1, Unit::Gb), format!("forward layer 1, \"q\": A n/a, B {}", f(3)));
    }

    #[test]
    fn series_keys_are_snake_case_with_their_unit() {
        assert_eq!(key_of("Optimizer states"), "optimizer_states_bytes");
        assert_eq!(key_of("Peak, eager attention"), "peak_eager_attention_bytes");
    }
}
