//! The weights one GPU holds while serving, in the served dtype.
//!
//! The tensors are the model's exact table ([`crate::estimator::model::ModelSpec::tensors`]) cut
//! to the GPU's pipeline stage and split by tensor and expert parallelism
//! ([`crate::estimator::params::local_groups`]). vLLM and SGLang pad the vocabulary of the
//! embedding and the LM head to a multiple of 64 before splitting it
//! (`VocabParallelEmbedding`, `DEFAULT_VOCAB_PADDING_SIZE = 64`,
//! vllm/model_executor/layers/vocab_parallel_embedding.py).
//!
//! Quantized formats quantize the linear layers of the decoder (attention projections, MLPs,
//! experts); the embedding, the LM head, norms, biases and routers stay 16-bit, as the published
//! FP8, AWQ, GPTQ, NVFP4 and MXFP4 checkpoints keep them. Per linear weight `[E, out, in]`:
//! - `fp8`: `E·out·in` bytes + one FP32 scale per weight (per expert);
//! - `fp8-block`: `E·out·in` + `E·⌈out/128⌉·⌈in/128⌉` FP32 scales;
//! - `int8`: `E·out·in` + `E·out` FP32 channel scales;
//! - `int4-awq`: `E·out·in/2` + per group of 128 inputs `out` FP16 scales and `out/2` bytes of
//!   packed 4-bit zeros (`qweight`, `scales`, `qzeros`);
//! - `int4-gptq`: as AWQ plus `E·in` int32 `g_idx`;
//! - `nvfp4`: `E·out·in/2` + `E·out·in/16` FP8 block scales + two FP32 global scales per weight;
//! - `mxfp4` (gpt-oss): the experts only, `E·out·in/2` + `E·out·in/32` E8M0 scales.
//!
//! vLLM and SGLang also count, in "Loading model weights took", the rotary embedding's
//! `cos_sin_cache` buffer ([`rope_cache_bytes`]).

use super::super::config::{Config, Finetune};
use super::super::model::Part;
use super::super::params::{local_groups, stages, LocalGroup};
use super::dtype::{Format, FP16_SCALE_BYTES, FP32_SCALE_BYTES, FP8_BLOCK, INT4_GROUP, MXFP4_BLOCK, NVFP4_BLOCK};
use crate::estimator::serve_config::WeightDtype;

/// vLLM's `DEFAULT_VOCAB_PADDING_SIZE`: the vocabulary is padded to a multiple of this.
pub const VOCAB_PADDING: u64 = 64;
/// Bytes of an int32 (`g_idx`, packed 4-bit zeros).
const INT32_BYTES: u64 = 4;

/// Bytes of one quantized linear weight of `e` matrices `[out, in]` in `dtype`.
pub fn quantized_linear_bytes(dtype: WeightDtype, e: u64, out: u64, inp: u64) -> u64 {
    let n = e * out * inp;
    match dtype {
        WeightDtype::Fp8 => n + e * FP32_SCALE_BYTES,
        WeightDtype::Fp8Block => n + e * out.div_ceil(FP8_BLOCK) * inp.div_ceil(FP8_BLOCK) * FP32_SCALE_BYTES,
        WeightDtype::Int8 => n + e * out * FP32_SCALE_BYTES,
        WeightDtype::Int4Awq | WeightDtype::Int4Gptq => {
            let groups = inp.div_ceil(INT4_GROUP);
            // scales [in/g, out] fp16; qzeros [in/g, out/8] int32 (eight 4-bit zeros per int32).
            let scales = e * groups * out * FP16_SCALE_BYTES;
            let zeros = e * groups * out.div_ceil(8) * INT32_BYTES;
            let g_idx = if dtype == WeightDtype::Int4Gptq { e * inp * INT32_BYTES } else { 0 };
            n.div_ceil(2) + scales + zeros + g_idx
        }
        WeightDtype::Nvfp4 => n.div_ceil(2) + n.div_ceil(NVFP4_BLOCK) + e * 2 * FP32_SCALE_BYTES,
        WeightDtype::Mxfp4 => n.div_ceil(2) + n.div_ceil(MXFP4_BLOCK),
        WeightDtype::Auto | WeightDtype::Bf16 | WeightDtype::Fp16 => 2 * n,
    }
}

/// Whether `dtype` quantizes this tensor.
fn quantizes(dtype: WeightDtype, g: &LocalGroup) -> bool {
    let linear = g.group.linear.is_some() && matches!(g.group.part, Part::Attention | Part::Mlp | Part::Experts | Part::SharedExperts);
    match dtype {
        WeightDtype::Mxfp4 => linear && g.group.part == Part::Experts,
        d => d.quantized() && linear,
    }
}

/// Bytes of one group of tensors on the GPU.
fn group_bytes(dtype: WeightDtype, model: Format, g: &LocalGroup, pad_vocab: bool) -> u64 {
    let t = &g.group;
    if quantizes(dtype, g) {
        let (e, out, inp) = match t.shape.as_slice() {
            [e, o, i] => (*e, *o, *i),
            [o, i] => (1, *o, *i),
            _ => (1, t.numel(), 1),
        };
        // Experts stored [E, in, out] (gpt-oss, Llama 4) quantize the same matrices.
        return quantized_linear_bytes(dtype, e, out, inp) * t.count;
    }
    let mut numel = t.total();
    if pad_vocab && matches!(t.part, Part::Embedding | Part::LmHead) {
        if let [rows, cols] = t.shape.as_slice() {
            numel = padded_rows(*rows) * cols * t.count;
        }
    }
    model.bytes(numel)
}

/// A vocabulary shard's rows after vLLM's padding: the local shard of a padded vocabulary is
/// `⌈V_pad / tp⌉`; `local_groups` already divided, so pad the shard to the same multiple.
fn padded_rows(rows: u64) -> u64 {
    rows.div_ceil(VOCAB_PADDING) * VOCAB_PADDING
}

/// Bytes of the rotary embedding's cos/sin cache that vLLM and SGLang keep on every GPU:
/// `max_position_embeddings · rotary_dim · bytes(model dtype)`.
///
/// vLLM's `RotaryEmbedding.__init__` (vllm/model_executor/layers/rotary_embedding.py, the same
/// code in SGLang's `srt/layers/rotary_embedding.py`) builds `cos_sin_cache` of shape
/// `[max_position, rotary_dim]` (cos and sin halves concatenated), casts it `.to(dtype)` (the
/// model's dtype, `torch.get_default_dtype()` while loading) and registers it as a
/// non-persistent buffer, so it is allocated with the model and counted in "Loading model
/// weights took". `get_rope` caches instances (`_ROPE_DICT`), so every layer shares one cache,
/// neither split by TP nor by stage. `rotary_dim` is the query/key head's rotary part
/// ([`crate::estimator::model::ModelSpec::rope_dims`]: `qk_rope_head_dim` for MLA); models
/// without rotary positions keep none. Checked against vLLM's logs: Llama-3.1-8B
/// 131,072 · 128 · 2 B = 32 MiB ("14.9888 GB" = 14.9575 GiB of parameters + 0.03125),
/// Qwen3-0.6B 40,960 · 128 · 2 B = 10 MiB ("1.1201 GiB"). Not modelled: a second cache where a
/// model builds two rotary embeddings (Gemma 3's local and global bases).
pub fn rope_cache_bytes(cfg: &Config, dtype: WeightDtype) -> u64 {
    dtype.model_format().bytes(cfg.arch.max_pos * cfg.arch.rope_dims())
}

/// The weights one GPU holds: the largest pipeline stage's share, split by `tp` and `ep`.
/// `engine_layout`: vLLM's and SGLang's — the vocabulary padded to a multiple of 64, and the
/// rotary cache ([`rope_cache_bytes`]) loaded with the weights.
pub fn weight_bytes(cfg: &Config, dtype: WeightDtype, engine_layout: bool) -> u64 {
    let pad_vocab = engine_layout;
    let rope = if engine_layout { rope_cache_bytes(cfg, dtype) } else { 0 };
    let plain = Config { finetune: Finetune::Full, ..cfg.clone() };
    let model = dtype.model_format();
    let pad = pad_vocab && cfg.tp == 1;
    stages(cfg.pp)
        .iter()
        .map(|&stage| {
            let groups = local_groups(&plain, stage);
            // Under TP the padding is applied to the whole vocabulary before splitting.
            let vocab_pad_extra = if pad_vocab && cfg.tp > 1 { vocab_padding_extra(cfg, &groups, model) } else { 0 };
            groups.iter().map(|g| group_bytes(dtype, model, g, pad)).sum::<u64>() + vocab_pad_extra + rope
        })
        .max()
        .unwrap_or(0)
}

/// Extra bytes of the vocabulary padding on one TP rank: `(⌈V/64⌉·64 / tp − ⌈V/tp⌉) · h` per
/// embedding or head tensor.
fn vocab_padding_extra(cfg: &Config, groups: &[LocalGroup], model: Format) -> u64 {
    let v = cfg.arch.vocab;
    let padded_shard = padded_rows(v) / cfg.tp;
    let shard = v.div_ceil(cfg.tp);
    groups
        .iter()
        .filter(|g| matches!(g.group.part, Part::Embedding | Part::LmHead) && g.group.shape.len() == 2)
        .map(|g| model.bytes(padded_shard.saturating_sub(shard) * g.group.shape[1] * g.group.count))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::decode_query;

    #[test]
    fn llama_3_8b_in_bf16_is_its_parameters_twice_and_the_rotary_cache() {
        // 8,030,261,248 parameters; vocabulary 128,256 = 64 · 2,004 needs no padding; the
        // cos/sin cache 131,072 · 128 · 2 B = 32 MiB (vLLM logs "14.9888 GB").
        let rope = 131_072 * 128 * 2;
        let c = decode_query("model=llama-3.1-8b").config;
        assert_eq!(rope_cache_bytes(&c, WeightDtype::Auto), rope);
        assert_eq!(weight_bytes(&c, WeightDtype::Auto, true), 2 * 8_030_261_248 + rope);
        assert_eq!(weight_bytes(&c, WeightDtype::Auto, false), 2 * 8_030_261_248);
        // TP 2 halves everything but the norms (2·32·4096 + 4096 replicated) and the cache.
        let c2 = decode_query("model=llama-3.1-8b&tp=2&gpus=2").config;
        assert_eq!(weight_bytes(&c2, WeightDtype::Auto, true), (8_030_261_248 - 266_240) + 266_240 * 2 + rope);
        // MLA caches its rotary part only: DeepSeek-V3's 163,840 positions · 64 · 2 B.
        assert_eq!(rope_cache_bytes(&decode_query("model=deepseek-v3").config, WeightDtype::Auto), 163_840 * 64 * 2);
        // GPT-2's learned positions keep no cache.
        assert_eq!(rope_cache_bytes(&decode_query("model=gpt2").config, WeightDtype::Auto), 0);
    }

    #[test]
    fn quantized_linears_count_their_scales() {
        // One 256 × 256 matrix: fp8 65,536 + 4; block 65,536 + 4·4; int4 AWQ 32,768 + 2·256·2 +
        // 2·32·4; NVFP4 32,768 + 4,096 + 8; MXFP4 32,768 + 2,048.
        assert_eq!(quantized_linear_bytes(WeightDtype::Fp8, 1, 256, 256), 65_540);
        assert_eq!(quantized_linear_bytes(WeightDtype::Fp8Block, 1, 256, 256), 65_552);
        assert_eq!(quantized_linear_bytes(WeightDtype::Int4Awq, 1, 256, 256), 32_768 + 1024 + 256);
        assert_eq!(quantized_linear_bytes(WeightDtype::Int4Gptq, 1, 256, 256), 32_768 + 1024 + 256 + 1024);
        assert_eq!(quantized_linear_bytes(WeightDtype::Nvfp4, 1, 256, 256), 32_768 + 4096 + 8);
        assert_eq!(quantized_linear_bytes(WeightDtype::Mxfp4, 1, 256, 256), 32_768 + 2048);
    }

    #[test]
    fn mxfp4_quantizes_only_gpt_oss_experts() {
        let c = decode_query("model=gpt-oss-20b").config;
        let bf16 = weight_bytes(&c, WeightDtype::Auto, true);
        let mx = weight_bytes(&c, WeightDtype::Mxfp4, true);
        // gpt-oss-20b: ~20.9 B parameters, ~19.1 B of them in experts → ~13 GB served.
        assert!(mx < bf16 / 2 && mx > bf16 / 4, "{mx} vs {bf16}");
    }
}
