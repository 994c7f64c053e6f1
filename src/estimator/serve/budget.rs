//! The engines' budgets: how much of the card each engine gives the KV cache, each formula as
//! the engine's source computes it.
//!
//! - **vLLM** (V1 `Worker.determine_available_memory`, vllm/v1/worker/gpu_worker.py, read at
//!   commit 35d5cda; `memory_profiling`, vllm/utils/mem_utils.py at a6d5c39):
//!   `available = total · gpu_memory_utilization − (weights + torch peak increase of the
//!   profiling run + non-torch increase)`. `total` is `torch.cuda.mem_get_info()[1]`; the CUDA
//!   context and what NCCL set up before `init_snapshot` are outside the sum; CUDA graphs are
//!   captured after the cache is allocated and come on top.
//! - **SGLang** (`ModelRunner.profile_max_num_token`, python/sglang/srt/model_executor/
//!   model_runner.py): `rest = free after loading − total · (1 − mem_fraction_static)`, i.e.
//!   `mem_fraction_static · total − (total − free)`; the pool is `rest / cell_size` tokens.
//!   Unset `mem_fraction_static` takes the table of `ServerArgs.__post_init__` (0.88 at TP 1,
//!   0.87 at 2, 0.85 at 4, 0.81 at 8, 0.79 at 16; the 0.4 series — 0.5 derives it from reserved
//!   memory, so set it for 0.5.23).
//! - **TensorRT-LLM** (PyTorch backend, `KvCacheCreator` in tensorrt_llm/_torch/pyexecutor/
//!   _util.py, `KvCacheConfig.free_gpu_memory_fraction`): `free_gpu_memory_fraction` of what is
//!   free after the weights and the profiling forward.
//! - **transformers**: no pool; a sequence's cache grows until the card is full.

use super::super::config::Config;
use super::super::gpu::{gpu, GIB, MIB};

/// What `torch.cuda.mem_get_info()[1]` reports on an H100 80GB HBM3: 79.22 GiB in vLLM's own
/// startup logs (vllm-project/vllm PR #10511, PR #12126: "total_gpu_memory 79.22GiB"), 81,121 MiB
/// (the driver's 81,559 MiB less what it keeps).
pub const H100_80GB_TORCH_TOTAL_CENTI_GIB: u128 = 7922;
/// The memory CUDA graphs take when `cuda_graph_mib` is not set, MiB — an assumption: vLLM logs
/// "Graph capturing finished … took X GiB" with X from about 0.3 to 1 GiB for dense models up to
/// 70B at the default capture sizes; set `cuda_graph_mib` to your log's figure.
pub const CUDA_GRAPH_DEFAULT_MIB: u64 = 512;

/// The card's total memory as the engines read it (`torch.cuda.mem_get_info()[1]`): the logged
/// figure where we have one, else the catalog's (or `gpu_gib` for a custom card).
pub fn torch_total_bytes(cfg: &Config) -> u128 {
    match gpu(&cfg.gpu) {
        Some(g) if g.id == "h100-80gb" => H100_80GB_TORCH_TOTAL_CENTI_GIB * GIB / 100,
        Some(g) => g.bytes(),
        None => super::super::gpu::custom_bytes(cfg.gpu_gib),
    }
}

/// SGLang's default `mem_fraction_static` for a `tp`-way group (`ServerArgs.__post_init__`).
pub fn sglang_default_fraction(tp: u64) -> f64 {
    match tp {
        t if t >= 16 => 0.79,
        t if t >= 8 => 0.81,
        t if t >= 4 => 0.85,
        t if t >= 2 => 0.87,
        _ => 0.88,
    }
}

/// SGLang's `mamba_full_memory_ratio` default: state memory ÷ full-attention KV memory
/// (`ServerArgs`, 0.9).
pub const SGLANG_MAMBA_FULL_MEMORY_RATIO: f64 = 0.9;
/// SGLang's state slots per running request with the radix cache on
/// (`MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO`, model_runner_kv_cache_mixin.py).
pub const SGLANG_MAMBA_SLOTS_PER_REQUEST: u64 = 3;

/// SGLang's split of the pool memory `rest` between its `MambaPool` and the attention layers'
/// KV for a model whose states take `per_req` bytes per sequence
/// (`ModelRunnerKVCacheMixin.handle_max_mamba_cache`, sglang commit 001ccef0, without
/// speculative decoding or `max_mamba_cache_size`): `slots = ⌊rest · r / (1 + r) / per_req⌋`
/// (`max_mamba_cache_size`), the KV gets `rest − slots · per_req`. Returns `(slots, kv bytes)`.
pub fn sglang_state_split(rest: u128, per_req: u64) -> (u64, u128) {
    if per_req == 0 {
        return (0, rest);
    }
    let r = SGLANG_MAMBA_FULL_MEMORY_RATIO;
    let raw = rest as f64 * r / (1.0 + r);
    let slots = (raw / per_req as f64).floor() as u64;
    (slots, rest.saturating_sub(slots as u128 * per_req as u128))
}

/// CUDA graphs' memory (0 with `cuda_graphs=false`).
pub fn cuda_graph_bytes(cfg: &Config) -> u128 {
    if !cfg.serve.cuda_graphs {
        return 0;
    }
    cfg.serve.cuda_graph_mib.unwrap_or(CUDA_GRAPH_DEFAULT_MIB) as u128 * MIB
}

/// `x · f` for a fraction `f` in [0, 1], rounded down as Python's `int()` does.
pub fn fraction_of(x: u128, f: f64) -> u128 {
    (x as f64 * f).floor().max(0.0) as u128
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::decode_query;

    #[test]
    fn the_h100_total_is_the_figure_vllm_logs() {
        let c = decode_query("").config;
        let t = torch_total_bytes(&c);
        assert_eq!(t, 7922 * GIB / 100);
        // 79.22 GiB · 0.90 = 71.298 GiB: vLLM logs "71.29GiB" (its rounding of the exact total).
        assert!((fraction_of(t, 0.9) as f64 / GIB as f64 - 71.298).abs() < 0.001);
    }

    #[test]
    fn sglang_fraction_follows_its_table() {
        assert_eq!(sglang_default_fraction(1), 0.88);
        assert_eq!(sglang_default_fraction(4), 0.85);
        assert_eq!(sglang_default_fraction(8), 0.81);
    }
}

#[cfg(test)]
mod hybrid_tests {
    use super::*;

    #[test]
    fn sglang_gives_states_nine_nineteenths_of_the_pool() {
        // 19 GiB and 1 MiB of state per sequence: 9 GiB of states = 9,216 slots, 10 GiB of KV.
        let (slots, kv) = sglang_state_split(19 << 30, 1 << 20);
        assert_eq!((slots, kv), (9_216, 10 << 30));
        assert_eq!(sglang_state_split(100, 0), (0, 100));
    }
}
