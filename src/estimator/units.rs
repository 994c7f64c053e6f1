//! Byte formatting in GB (10⁹) or GiB (2³⁰).

use super::config::Unit;
use super::ledger::Bytes;

pub const GB: f64 = 1e9;
pub const GIB: f64 = (1u64 << 30) as f64;

/// The unit's symbol.
pub fn unit_symbol(unit: Unit) -> &'static str {
    match unit {
        Unit::Gb => "GB",
        Unit::Gib => "GiB",
    }
}

/// Bytes as a number of the unit.
pub fn in_unit(bytes: Bytes, unit: Unit) -> f64 {
    let b = bytes as f64;
    match unit {
        Unit::Gb => b / GB,
        Unit::Gib => b / GIB,
    }
}

/// `12.35 GB`; small values keep three significant digits, huge ones are grouped (`1,234 GB`).
pub fn format_bytes(bytes: Bytes, unit: Unit) -> String {
    let v = in_unit(bytes, unit);
    let sym = unit_symbol(unit);
    if bytes == 0 {
        format!("0 {sym}")
    } else if bytes < 1_000_000 {
        format!("{} B", super::expr::group_digits(bytes))
    } else if v >= 1000.0 {
        format!("{} {sym}", super::expr::group_digits(v.round() as u128))
    } else if v >= 100.0 {
        format!("{v:.1} {sym}")
    } else if v >= 0.01 {
        format!("{v:.2} {sym}")
    } else {
        format!("{v:.4} {sym}")
    }
}

/// Compact count: 124M, 8.03B, 405B, 1.2K.
pub fn format_count(n: u64) -> String {
    let v = n as f64;
    let (x, s) = if v >= 1e12 {
        (v / 1e12, "T")
    } else if v >= 1e9 {
        (v / 1e9, "B")
    } else if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "K")
    } else {
        return n.to_string();
    };
    if x >= 100.0 {
        format!("{x:.0}{s}")
    } else if x >= 10.0 {
        format!("{x:.1}{s}")
    } else {
        format!("{x:.2}{s}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gigabytes_and_gibibytes_differ_by_seven_percent() {
        assert_eq!(format_bytes(80_000_000_000, Unit::Gb), "80.00 GB");
        assert_eq!(format_bytes(80_000_000_000, Unit::Gib), "74.51 GiB");
    }

    #[test]
    fn large_and_small_values_stay_readable() {
        assert_eq!(format_bytes(1_120_000_000_000, Unit::Gb), "1,120 GB");
        assert_eq!(format_bytes(0, Unit::Gb), "0 GB");
        assert_eq!(format_bytes(1_234_000, Unit::Gb), "0.0012 GB");
        assert_eq!(format_bytes(1_164, Unit::Gib), "1,164 B");
    }

    #[test]
    fn counts_use_k_m_b_suffixes() {
        assert_eq!(format_count(124_439_808), "124M");
        assert_eq!(format_count(8_030_261_248), "8.03B");
        assert_eq!(format_count(405_853_388_800), "406B");
        assert_eq!(format_count(999), "999");
    }
}
