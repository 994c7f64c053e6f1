//! Serving memory: the KV cache, exact per architecture and engine layout, and the inference
//! engines' budgets (vLLM, SGLang, TensorRT-LLM, transformers' `generate()`).

mod activation;
mod analyse;
mod budget;
mod dtype;
mod kv;
mod layers;
mod report;
mod series;
mod weights;

pub use super::serve_config::{Engine, KvDtype, Mode, Serving, WeightDtype};
pub use activation::{prefill_peak_bytes, SAMPLER_FP32_COPIES};
pub use analyse::{
    analyse_serving, context_of, fixes, gpu_layers, hybrid_block_align, kv_format, size, state_format, Pool, Serve, ServeError, ServeFix,
    ServeRow, Sized, MAX_CONTEXT,
};
pub use budget::{
    cuda_graph_bytes, fraction_of, sglang_default_fraction, torch_total_bytes, CUDA_GRAPH_DEFAULT_MIB, H100_80GB_TORCH_TOTAL_CENTI_GIB,
};
pub use dtype::{Format, BF16, FP16};
pub use kv::{
    hybrid_block_size, per_token_bytes, state_bytes, state_dtype_format, transformers_bytes, window_tokens, Count, PagedError, PagedLayout,
    StateFormat, FP32, SLIDING_WINDOW_TENSOR_BYTES, VLLM_HYBRID_BLOCK_ALIGN, VLLM_MLA_HYBRID_BLOCK_ALIGN,
};
pub use layers::{
    attn_of, gdn_state, has_states, is_linear, kv_heads_per_gpu, kv_layers, layers_for, mamba2_state, transformers_layers, without_mla,
    without_states, without_windows, Attn, Holder, KvLayer, LayoutError, State,
};
pub use report::{render_text, to_json};
pub use series::{concurrency_against_context, context_axis, kv_against_context, Series};
pub use weights::{quantized_linear_bytes, rope_cache_bytes, weight_bytes, VOCAB_PADDING};
