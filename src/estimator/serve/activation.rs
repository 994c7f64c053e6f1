//! The activation peak of one prefill chunk: what vLLM's profiling run
//! (`GPUModelRunner.profile_run`: a forward of `max_num_batched_tokens` dummy tokens, then the
//! sampler on `min(max_num_seqs, max_num_batched_tokens)` rows) adds to `torch.cuda`'s allocated
//! peak above the weights — the "PyTorch activation peak memory" of its startup log.
//!
//! **An estimate, not a replay**: vLLM's kernels (fused QKV, `SiluAndMul`, FlashAttention's
//! in-place output, fused MoE) are not simulated op by op. The peak is taken as one decoder
//! layer's largest moment plus the sampler's buffers:
//!
//! `peak = T·h·e (residual) + T·h·e (normed input) + max(attention, MLP, MoE) + R·V_gpu·(e + 4·3)`
//!
//! - attention: `T·(q + 2·kv)·e` (fused QKV output) + `T·q·e` (attention output);
//! - dense MLP: `T·2f·e` (fused gate/up output) + `T·f·e` (`SiluAndMul`'s output);
//! - MoE: `T·k_top·2f_e·e + T·k_top·f_e·e + T·k_top·h·e` (the routed tokens' gate/up, activation
//!   and down outputs before the weighted sum);
//! - sampler: `R = min(max_num_seqs, T)` rows of logits in the model dtype plus three FP32
//!   copies (upcast logits, probabilities, log-probabilities).
//!
//! with widths per GPU (`q`, `kv`, `f` divided by `tp`). Against vLLM PR #10511's log
//! (Llama-3-8B, H100, 8,192 batched tokens, 256 sequences: 1.26 GiB) this gives 1.21 GiB.

use super::super::model::ModelSpec;
use super::dtype::Format;

/// FP32 copies of the sampler's logits alive at its peak (upcast logits, probabilities,
/// log-probabilities) — the assumption behind the sampler term.
pub const SAMPLER_FP32_COPIES: u64 = 3;
/// Bytes of an FP32 value.
const FP32: u64 = 4;

/// The estimated activation peak of a forward of `tokens` tokens with `rows` sampled rows, on one
/// GPU of a `tp`-way group, in the model's 16-bit `fmt`.
pub fn prefill_peak_bytes(spec: &ModelSpec, fmt: Format, tp: u64, tokens: u64, rows: u64) -> u64 {
    let tp = tp.max(1);
    let e = fmt.bytes(1);
    let t = tokens;
    let residual = 2 * t * spec.hidden * e;
    let q = spec.q_width().div_ceil(tp);
    let kv = if spec.is_mla() { spec.kv_lora_rank + spec.qk_rope_dim } else { spec.kv_width().div_ceil(tp) };
    let attention = t * (q + 2 * kv) * e + t * spec.o_width().div_ceil(tp) * e;
    let dense = if spec.dense_mlp_layers() > 0 { 3 * t * spec.ffn.div_ceil(tp) * e } else { 0 };
    let moe = if spec.moe_layers() > 0 {
        let fe = spec.expert_ffn.div_ceil(tp);
        let k = spec.top_k.max(1);
        let shared = 3 * t * (spec.shared_ffn * spec.shared_experts).div_ceil(tp) * e;
        t * k * (3 * fe + spec.hidden) * e + shared
    } else {
        0
    };
    let sampler = rows.min(tokens) * spec.vocab.div_ceil(tp) * (e + SAMPLER_FP32_COPIES * FP32);
    residual + attention.max(dense).max(moe) + sampler
}

#[cfg(test)]
mod tests {
    use super::super::dtype::BF16;
    use super::*;
    use crate::estimator::presets::preset;

    #[test]
    fn llama_3_8b_at_8192_tokens_is_near_vllms_logged_peak() {
        let spec = preset("llama-3.1-8b").map(|p| p.spec).unwrap_or_else(crate::estimator::presets::default_spec);
        let b = prefill_peak_bytes(&spec, BF16, 1, 8192, 256);
        // residual 2·8192·4096·2 = 134,217,728; MLP 3·8192·14336·2 = 704,643,072;
        // sampler 256·128,256·14 = 459,669,504.
        assert_eq!(b, 134_217_728 + 704_643_072 + 459_669_504);
        let logged = 1.26 * (1u64 << 30) as f64;
        assert!(((b as f64 - logged) / logged).abs() < 0.05);
    }

    #[test]
    fn the_sampler_rows_never_exceed_the_tokens() {
        let spec = crate::estimator::presets::default_spec();
        assert!(prefill_peak_bytes(&spec, BF16, 1, 16, 256) < prefill_peak_bytes(&spec, BF16, 1, 256, 256));
    }
}
