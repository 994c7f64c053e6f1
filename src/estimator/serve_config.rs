//! The serving configuration: which engine, how long a sequence, how many at once, and the
//! dtypes the weights and the KV cache are served in. [`Serving`] is one field of
//! [`crate::estimator::config::Config`] (`serve`), edited through the codec's keys like every
//! other setting; its defaults are vLLM's own, so that a link without serving keys stays empty.

use crate::estimator::model::StateDtype;
use serde::{Deserialize, Serialize};

/// What the page and the CLI answer (`mode`): the training step (the default) or serving.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    #[default]
    Train,
    Serve,
}

/// The inference engine whose memory layout and budget apply (`engine`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    /// vLLM's V1 engine: paged KV blocks of `block_size` tokens, budget from a profiling run.
    #[default]
    Vllm,
    /// SGLang: a token-granular KV pool sized by `mem_fraction_static`.
    Sglang,
    /// TensorRT-LLM (PyTorch backend): `free_gpu_memory_fraction` of what is free after loading.
    Trtllm,
    /// Hugging Face transformers' `generate()` with its `DynamicCache` (or `QuantizedCache`).
    Transformers,
}

/// The dtype of the KV cache (`kv_dtype`, vLLM's `--kv-cache-dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvDtype {
    /// The model's dtype (bf16 unless `weight_dtype=fp16`).
    #[default]
    Auto,
    Bf16,
    Fp16,
    /// FP8 e4m3 with one scale per layer for K and one for V (vLLM `fp8`, transformers'
    /// `QuantizedCache(backend="fp8")`).
    Fp8,
    /// INT8 with a per-tensor scale (TensorRT-LLM `int8` KV cache).
    Int8,
    /// NVFP4: 4-bit e2m1 values, one FP8 e4m3 scale per 16 values and an FP32 scale per tensor.
    Nvfp4,
}

/// The dtype the weights are served in (`weight_dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WeightDtype {
    /// bf16 (what `--dtype auto` loads for a bf16 checkpoint).
    #[default]
    Auto,
    Bf16,
    Fp16,
    /// FP8 e4m3 linears with one FP32 scale per weight tensor (per expert for MoE).
    Fp8,
    /// FP8 e4m3 linears with one FP32 scale per 128 × 128 block (DeepSeek-V3's checkpoint).
    Fp8Block,
    /// INT8 linears with one FP32 scale per output channel (W8A8, compressed-tensors).
    Int8,
    /// INT4 AWQ: 4-bit weights packed in int32, FP16 scales and packed 4-bit zeros per group of 128.
    Int4Awq,
    /// INT4 GPTQ: as AWQ plus an int32 `g_idx` per input channel.
    Int4Gptq,
    /// NVFP4: 4-bit e2m1, one FP8 scale per 16 values, FP32 global scales per tensor.
    Nvfp4,
    /// MXFP4 on the MoE experts only (gpt-oss's checkpoint): 4-bit e2m1 with one E8M0 byte per
    /// 32 values; every other tensor bf16.
    Mxfp4,
}

/// vLLM's defaults (`vllm/config/cache.py`, `vllm/config/scheduler.py`).
pub const VLLM_GPU_MEMORY_UTILIZATION: f64 = 0.9;
/// vLLM's `max_num_seqs` default for online serving on a large GPU (`EngineArgs`'s usage-context
/// defaults: 1,024 for the API server on ≥ 70 GiB cards in recent releases, 256 before); we take
/// the long-standing 256 and let `max_num_seqs` override it.
pub const VLLM_MAX_NUM_SEQS: u64 = 256;
/// vLLM's default `max_num_batched_tokens` for the API server with chunked prefill (8,192 on
/// large GPUs in `EngineArgs._set_default_args`).
pub const VLLM_MAX_NUM_BATCHED_TOKENS: u64 = 8192;
/// TensorRT-LLM's `KvCacheConfig.free_gpu_memory_fraction` default.
pub const TRTLLM_FREE_GPU_MEMORY_FRACTION: f64 = 0.9;

/// The serving settings of one configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Serving {
    pub mode: Mode,
    pub engine: Engine,
    /// Tokens per sequence (vLLM's `max_model_len`); `None` = the model's `max_position_embeddings`,
    /// as vLLM defaults it.
    pub context: Option<u64>,
    /// Concurrent sequences the longest-context answer is asked for.
    pub concurrency: u64,
    pub kv_dtype: KvDtype,
    pub weight_dtype: WeightDtype,
    /// The recurrent (SSM / gated DeltaNet) state's dtype, overriding the engine's choice: vLLM
    /// `--mamba-ssm-cache-dtype`, SGLang `--mamba-ssm-dtype`; `Auto` = the engine's default
    /// (`crate::estimator::serve::state_format`).
    pub mamba_ssm_cache_dtype: StateDtype,
    /// vLLM `gpu_memory_utilization`: the share of the card's total memory vLLM may use.
    pub gpu_memory_utilization: f64,
    /// Tokens of one prefill chunk (`max_num_batched_tokens`); `None` = the engine's default.
    pub max_num_batched_tokens: Option<u64>,
    /// Most sequences in one batch (`max_num_seqs`): the sampler's rows in vLLM's profiling run.
    pub max_num_seqs: u64,
    /// Tokens per KV block (`block_size`; SGLang `page_size`, TensorRT-LLM `tokens_per_block`);
    /// `None` = the engine's default (16, 1, 32).
    pub block_size: Option<u64>,
    /// SGLang `mem_fraction_static`; `None` = SGLang's default for the card.
    pub mem_fraction_static: Option<f64>,
    /// TensorRT-LLM `free_gpu_memory_fraction`.
    pub free_gpu_memory_fraction: f64,
    /// CUDA graphs captured (vLLM's default; `false` = `--enforce-eager`).
    pub cuda_graphs: bool,
    /// Memory the CUDA graphs take, MiB; `None` = the assumed figure (see `budget.rs`).
    pub cuda_graph_mib: Option<u64>,
    /// Data-parallel attention (SGLang `--enable-dp-attention`, vLLM DP attention with EP): each
    /// GPU of the TP group holds whole KV heads for its own sequences.
    pub dp_attention: bool,
}

impl Default for Serving {
    fn default() -> Self {
        Serving {
            mode: Mode::Train,
            engine: Engine::Vllm,
            context: None,
            concurrency: 1,
            kv_dtype: KvDtype::Auto,
            weight_dtype: WeightDtype::Auto,
            mamba_ssm_cache_dtype: StateDtype::Auto,
            gpu_memory_utilization: VLLM_GPU_MEMORY_UTILIZATION,
            max_num_batched_tokens: None,
            max_num_seqs: VLLM_MAX_NUM_SEQS,
            block_size: None,
            mem_fraction_static: None,
            free_gpu_memory_fraction: TRTLLM_FREE_GPU_MEMORY_FRACTION,
            cuda_graphs: true,
            cuda_graph_mib: None,
            dp_attention: false,
        }
    }
}

impl Engine {
    /// Tokens per KV block when `block_size` is not set: vLLM 16 (`CacheConfig.block_size`),
    /// SGLang 1 (`page_size`), TensorRT-LLM 32 (`tokens_per_block`), transformers 1 (it grows
    /// its tensors token by token).
    pub fn default_block_size(self) -> u64 {
        match self {
            Engine::Vllm => 16,
            Engine::Sglang | Engine::Transformers => 1,
            Engine::Trtllm => 32,
        }
    }

    /// The engine's name for people.
    pub fn label(self) -> &'static str {
        match self {
            Engine::Vllm => "vLLM",
            Engine::Sglang => "SGLang",
            Engine::Trtllm => "TensorRT-LLM",
            Engine::Transformers => "transformers",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_vllms() {
        let s = Serving::default();
        assert_eq!((s.mode, s.engine, s.concurrency), (Mode::Train, Engine::Vllm, 1));
        assert_eq!(s.gpu_memory_utilization, 0.9);
        assert_eq!(Engine::Vllm.default_block_size(), 16);
        assert_eq!(Engine::Trtllm.default_block_size(), 32);
    }

    #[test]
    fn a_configuration_saved_before_serving_reads_with_the_defaults() {
        let s: Serving = serde_json::from_str("{}").unwrap_or_else(|_| Serving { concurrency: 0, ..Serving::default() });
        assert_eq!(s, Serving::default());
    }
}
