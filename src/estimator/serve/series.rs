//! The charts' data: KV memory against context for the chosen model beside the same model
//! without MLA, without sliding windows and with an FP8 cache, and concurrency against context
//! on the chosen GPU. Plotting comes later; these are the series.

use super::super::config::Config;
use super::analyse::{size, ServeError};
use super::layers::{has_states, without_mla, without_states, without_windows};
use crate::estimator::serve_config::KvDtype;
use serde::Serialize;

/// One line of a chart: its label and `(context tokens, value)` points.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Series<T> {
    pub label: String,
    pub points: Vec<(u64, T)>,
}

/// Bytes of one sequence's cache, as the configured engine holds it, at each context.
fn kv_line(cfg: &Config, label: String, contexts: &[u64]) -> Result<Series<u128>, ServeError> {
    let sized = size(cfg)?;
    Ok(Series { label, points: contexts.iter().map(|&t| (t, sized.pool.sequence_bytes(t, sized.cell))).collect() })
}

/// KV bytes per sequence against context: the model as configured, and — where they differ —
/// without MLA (per-head K/V), without its windows, for a hybrid (gated DeltaNet or Mamba-2
/// layers) its states alone ("recurrent state (constant)": [`super::analyse::Pool::state_bytes`],
/// flat) and the same model with every layer full attention and no state (growing: Qwen3-Next's
/// 48 layers all attention; Falcon-H1's attention without its Mamba-2 mixers), and with an FP8
/// cache.
pub fn kv_against_context(cfg: &Config, contexts: &[u64]) -> Result<Vec<Series<u128>>, ServeError> {
    let mut out = vec![kv_line(cfg, "as configured".into(), contexts)?];
    if cfg.arch.is_mla() {
        let c = Config { arch: without_mla(&cfg.arch), ..cfg.clone() };
        out.push(kv_line(&c, "without MLA (per-head keys and values)".into(), contexts)?);
    }
    if cfg.arch.window_layers.count(cfg.arch.layers) > 0 && cfg.arch.window > 0 {
        let c = Config { arch: without_windows(&cfg.arch), ..cfg.clone() };
        out.push(kv_line(&c, "without sliding windows".into(), contexts)?);
    }
    if has_states(&cfg.arch) {
        let state = size(cfg)?.pool.state_bytes();
        out.push(Series { label: "recurrent state (constant)".into(), points: contexts.iter().map(|&t| (t, state)).collect() });
        let c = Config { arch: without_states(&cfg.arch), ..cfg.clone() };
        out.push(kv_line(&c, "every layer full attention".into(), contexts)?);
    }
    if cfg.serve.kv_dtype != KvDtype::Fp8 {
        let mut c = cfg.clone();
        c.serve.kv_dtype = KvDtype::Fp8;
        if let Ok(s) = kv_line(&c, "FP8 KV cache".into(), contexts) {
            out.push(s);
        }
    }
    Ok(out)
}

/// Concurrent sequences against context on the configured GPU and engine.
pub fn concurrency_against_context(cfg: &Config, contexts: &[u64]) -> Result<Series<f64>, ServeError> {
    let sized = size(cfg)?;
    let dp = if cfg.serve.dp_attention { cfg.tp.max(1) } else { 1 } as f64;
    Ok(Series {
        label: format!("{} on {}", cfg.serve.engine.label(), cfg.gpu),
        points: contexts.iter().map(|&t| (t, dp * sized.pool.concurrency(t, sized.cell))).collect(),
    })
}

/// Contexts from 1k to `max` tokens, doubling: the charts' x axis.
pub fn context_axis(max: u64) -> Vec<u64> {
    std::iter::successors(Some(1024u64), |&t| (t < max).then(|| (t * 2).min(max))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::decode_query;

    #[test]
    fn mla_saves_what_per_head_keys_would_cost() {
        let c = decode_query("mode=serve&model=deepseek-v2-lite").config;
        let s = kv_against_context(&c, &[4096]).unwrap_or_default();
        let labels: Vec<_> = s.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(labels, ["as configured", "without MLA (per-head keys and values)", "FP8 KV cache"]);
        assert!(s[1].points[0].1 > 10 * s[0].points[0].1);
    }

    #[test]
    fn a_hybrids_state_is_flat_beside_full_attentions_growth() {
        for model in ["qwen3-next-80b-a3b-thinking", "falcon-h1-0.5b-instruct", "qwen3.5-27b"] {
            let c = decode_query(&format!("mode=serve&model={model}")).config;
            let s = kv_against_context(&c, &context_axis(131_072)).unwrap_or_default();
            let labels: Vec<_> = s.iter().map(|l| l.label.as_str()).collect();
            assert_eq!(labels, ["as configured", "recurrent state (constant)", "every layer full attention", "FP8 KV cache"], "{model}");
            let (state, full) = (&s[1].points, &s[2].points);
            assert!(state[0].1 > 0 && state.iter().all(|p| p.1 == state[0].1), "{model}: {state:?}");
            assert!(full.windows(2).all(|w| w[1].1 > w[0].1), "{model}: {full:?}");
            // As configured: the attention layers' growth plus the flat state.
            assert!(s[0].points.iter().zip(state).all(|(a, st)| a.1 > st.1), "{model}");
        }
    }

    #[test]
    fn windows_flatten_the_curve_and_concurrency_falls_with_context() {
        let c = decode_query("mode=serve&model=gemma-3-27b-it").config;
        let s = kv_against_context(&c, &context_axis(65_536)).unwrap_or_default();
        assert_eq!(s[1].label, "without sliding windows");
        let last = s[0].points.len() - 1;
        assert!(s[1].points[last].1 > 3 * s[0].points[last].1);
        let conc = concurrency_against_context(&c, &[4096, 65_536]).map(|s| s.points).unwrap_or_default();
        assert!(conc[0].1 > conc[1].1);
        assert_eq!(context_axis(5000), vec![1024, 2048, 4096, 5000]);
    }
}
