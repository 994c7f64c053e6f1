//! How the charts write numbers: tick labels of token and parameter counts, bytes in the
//! display unit, the GPU's name.

use crate::estimator::config::{Config, Unit, Zero};
use crate::estimator::ledger::Bytes;
use crate::estimator::units::in_unit;

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
    let s = crate::estimator::units::format_count(v.max(0.0).round() as u64);
    // format_count keeps three digits ("1.00B", "10.0B"); a tick reads better as "1B", "10B".
    match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) if s[..i].contains('.') => {
            let (num, suffix) = s.split_at(i);
            format!("{}{suffix}", num.trim_end_matches('0').trim_end_matches('.'))
        }
        _ => s,
    }
}

/// Bytes in the display unit as a float (chart coordinates).
pub fn y_of(bytes: Bytes, unit: Unit) -> f64 {
    in_unit(bytes, unit)
}

/// The name of the configured GPU ("NVIDIA H100 80 GB (SXM)", "custom 24 GiB GPU").
pub fn gpu_name(cfg: &Config) -> String {
    if cfg.gpu == "custom" {
        format!("custom {} GiB GPU", cfg.gpu_gib)
    } else {
        crate::estimator::gpu::gpu(&cfg.gpu).map_or_else(|| cfg.gpu.clone(), |g| g.name.to_string())
    }
}

/// The name of a sharding.
pub fn zero_label(z: Zero) -> &'static str {
    match z {
        Zero::Ddp => "DDP (no sharding)",
        Zero::Z1 => "ZeRO-1",
        Zero::Z2 => "ZeRO-2",
        Zero::Z3 => "ZeRO-3",
        Zero::FullShard => "FSDP full_shard",
        Zero::ShardGradOp => "FSDP shard_grad_op",
        Zero::HybridShard => "FSDP hybrid_shard",
    }
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
    fn parameter_ticks_read_like_model_sizes() {
        assert_eq!(params_label(1e9), "1B");
        assert_eq!(params_label(1e10), "10B");
        assert_eq!(params_label(1e12), "1T");
        assert_eq!(params_label(1e8), "100M");
        assert_eq!(params_label(8.03e9), "8.03B");
        assert_eq!(params_label(1.5e9), "1.5B");
    }
}
