//! Serving, answered: per GPU, the weights, the KV cache per token and per sequence, the engine's
//! budget and blocks, the most concurrent sequences at a context length, the longest context at
//! a concurrency, and the cheapest changes that make a target fit.

use super::super::config::Config;
use super::super::gpu::MIB;
use super::super::model::StateDtype;
use super::super::overhead::{cuda_context_bytes, nccl_buffer_bytes};
use super::activation::prefill_peak_bytes;
use super::budget::{cuda_graph_bytes, fraction_of, sglang_default_fraction, torch_total_bytes};
use super::dtype::Format;
use super::kv::{per_token_bytes, state_bytes, transformers_bytes, Count, PagedError, PagedLayout, StateFormat};
use super::layers::{kv_layers, KvLayer, LayoutError};
use crate::estimator::serve_config::{Engine, KvDtype, VLLM_MAX_NUM_BATCHED_TOKENS};
use serde::Serialize;

/// The longest context any answer considers (16 M tokens).
pub const MAX_CONTEXT: u64 = 1 << 24;

/// Why a serving configuration cannot be answered; names the key at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ServeError {
    #[error("`tp` {0}")]
    Layout(#[from] LayoutError),
    #[error("`model` {0}")]
    Paged(#[from] PagedError),
    #[error("`{key}` {reason}")]
    Invalid { key: &'static str, reason: String },
}

impl ServeError {
    /// The configuration key at fault.
    pub fn key(&self) -> &'static str {
        match self {
            ServeError::Layout(_) => "tp",
            ServeError::Paged(_) => "model",
            ServeError::Invalid { key, .. } => key,
        }
    }
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ServeError {
    ServeError::Invalid { key, reason: reason.into() }
}

/// One row of the budget: its bytes, its formula, the formula with this configuration's numbers,
/// and where the formula comes from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServeRow {
    pub name: &'static str,
    pub label: &'static str,
    /// Bytes; negative when the budget is overdrawn.
    pub bytes: i128,
    pub formula: String,
    pub substituted: String,
    pub source: &'static str,
}

/// A change that makes the target (`concurrency` sequences of `context` tokens) fit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServeFix {
    /// What changes, for people ("FP8 KV cache").
    pub change: String,
    /// The changed configuration as a share-link query's keys (`kv_dtype=fp8`).
    pub set: Vec<(&'static str, String)>,
    /// Concurrent sequences of `context` tokens per GPU group after the change.
    pub max_concurrency: f64,
}

/// How the cache is pooled, with what it needs to answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Pool {
    /// vLLM: blocks of a paged layout.
    Paged { layout: PagedLayout, num_blocks: u64, batched: u64 },
    /// SGLang: a pool of `tokens` token slots of `cell` bytes, `page` tokens per page, and for
    /// a hybrid `state` bytes of fixed-size state per sequence in `MambaPool`, whose
    /// `state_slots` cap the running requests at `⌊slots / 3⌋` (0 and 0 without states).
    Tokens { tokens: u64, cell: u64, page: u64, state: u64, state_slots: u64 },
    /// TensorRT-LLM: `num_blocks` blocks of `block` tokens, `state` bytes of state per sequence.
    Blocks { num_blocks: u64, block: u64, state: u64 },
    /// transformers: whatever is free, `bytes`, filled sequence by sequence.
    Free { bytes: u128, layers: Vec<KvLayer>, fmt: Format, sf: StateFormat },
}

impl Pool {
    /// The bytes one sequence of `len` tokens takes from the pool (the engine's reservation:
    /// vLLM's blocks per request with sliding-window reuse, SGLang's token slots, TensorRT-LLM's
    /// blocks, transformers' tensors after a decode step), states included.
    pub fn sequence_bytes(&self, len: u64, cell: u64) -> u128 {
        match self {
            Pool::Paged { layout, batched, .. } => layout.blocks_per_request(len, *batched) as u128 * layout.block_bytes() as u128,
            Pool::Tokens { page, state, .. } => {
                len.div_ceil((*page).max(1)) as u128 * (*page).max(1) as u128 * cell as u128 + *state as u128
            }
            Pool::Blocks { block, state, .. } => {
                len.div_ceil((*block).max(1)) as u128 * (*block).max(1) as u128 * cell as u128 + *state as u128
            }
            Pool::Free { layers, fmt, sf, .. } => {
                transformers_bytes(layers, *fmt, *sf, 1, len.saturating_sub(1), 1.min(len), Count::Storage) as u128
            }
        }
    }

    /// The part of [`Pool::sequence_bytes`] that does not grow with the context: the layers'
    /// fixed-size states as the engine holds them (vLLM: one padded block per state group).
    pub fn state_bytes(&self) -> u128 {
        match self {
            Pool::Paged { layout, .. } => layout.state_bytes_per_request() as u128,
            Pool::Tokens { state, .. } | Pool::Blocks { state, .. } => *state as u128,
            Pool::Free { layers, sf, .. } => state_bytes(layers, *sf) as u128,
        }
    }

    /// Sequences of `len` tokens the pool holds at once, as the engine reports it.
    ///
    /// SGLang with states: `min(tokens / len, ⌊state_slots / 3⌋)` — the token pool holds the
    /// attention layers' K/V only (`HybridLinearKVPool`; `cell` counts those), and
    /// `init_memory` caps `max_num_reqs` at `max_mamba_cache_size //
    /// MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO` (radix cache on).
    ///
    /// TensorRT-LLM with states (an approximation): its Mamba cache manager keeps one state per
    /// sequence beside the attention blocks; here both come out of the same budget,
    /// `blocks · B · cell / (⌈len / B⌉ · B · cell + state)`.
    pub fn concurrency(&self, len: u64, cell: u64) -> f64 {
        match self {
            Pool::Paged { layout, num_blocks, batched } => layout.max_concurrency(*num_blocks, len, *batched),
            Pool::Tokens { tokens, state: 0, .. } => *tokens as f64 / len.max(1) as f64,
            Pool::Tokens { tokens, state_slots, .. } => {
                (*tokens as f64 / len.max(1) as f64).min((*state_slots / super::budget::SGLANG_MAMBA_SLOTS_PER_REQUEST) as f64)
            }
            Pool::Blocks { num_blocks, block, state: 0 } => *num_blocks as f64 / len.div_ceil((*block).max(1)).max(1) as f64,
            Pool::Blocks { num_blocks, block, state } => {
                let block_bytes = ((*block).max(1) * cell) as f64;
                *num_blocks as f64 * block_bytes / (len.div_ceil((*block).max(1)) as f64 * block_bytes + *state as f64).max(1.0)
            }
            Pool::Free { bytes, .. } => *bytes as f64 / self.sequence_bytes(len, cell).max(1) as f64,
        }
    }

    /// The longest context at which `n` sequences fit at once (0 when none does).
    pub fn max_context(&self, n: u64, cell: u64) -> u64 {
        let fits = |t: u64| self.concurrency(t, cell) >= n.max(1) as f64;
        if !fits(1) {
            return 0;
        }
        let (mut lo, mut hi) = (1u64, MAX_CONTEXT);
        if fits(hi) {
            return hi;
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The pool's blocks (vLLM's "# GPU blocks", SGLang's pages, TensorRT-LLM's blocks; 0 for
    /// transformers, which has none).
    pub fn blocks(&self) -> u64 {
        match self {
            Pool::Paged { num_blocks, .. } | Pool::Blocks { num_blocks, .. } => *num_blocks,
            Pool::Tokens { tokens, page, .. } => tokens / (*page).max(1),
            Pool::Free { .. } => 0,
        }
    }

    /// Tokens the pool holds (vLLM's "GPU KV cache size"; SGLang's "#tokens").
    pub fn tokens(&self, cell: u64) -> u64 {
        match self {
            Pool::Paged { layout, num_blocks, .. } => layout.cache_tokens(*num_blocks),
            Pool::Tokens { tokens, .. } => *tokens,
            Pool::Blocks { num_blocks, block, .. } => num_blocks * block,
            Pool::Free { bytes, .. } => (*bytes / cell.max(1) as u128).min(u64::MAX as u128) as u64,
        }
    }
}

/// The answers for one GPU of the serving configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Serve {
    pub engine: &'static str,
    pub model: String,
    pub gpu: String,
    /// Tokens per sequence the answers are for (`context`, else the model's `max_pos`).
    pub context: u64,
    /// Sequences the longest-context answer is for (`concurrency`).
    pub concurrency: u64,
    pub kv_dtype: &'static str,
    /// The recurrent (SSM / gated DeltaNet) state's dtype, for a model with states: `fp32` where
    /// the engine or the checkpoint's `mamba_ssm_dtype` says so ([`state_format`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dtype: Option<&'static str>,
    /// The part of `kv_bytes` that does not grow with the context: one sequence's fixed-size
    /// states as the engine holds them (vLLM: its padded state blocks); 0 without states.
    pub state_bytes: u128,
    /// Weights on this GPU, bytes.
    pub weights: u64,
    /// One token's keys and values in this GPU's layers at full attention, bytes (gated
    /// DeltaNet layers add nothing; states are not per token).
    pub kv_per_token: u64,
    /// The cache of one sequence of `context` tokens as the engine holds it, windows and the
    /// hybrid layers' fixed-size states included.
    pub kv_bytes: u128,
    /// Bytes the engine gives the KV cache.
    pub kv_cache_bytes: u128,
    /// Tokens the cache holds.
    pub kv_cache_tokens: u64,
    /// Tokens per block (1 for token pools and transformers).
    pub block_size: u64,
    /// The engine's blocks (vLLM "# GPU blocks").
    pub kv_blocks: u64,
    /// Sequences of `context` tokens at once (vLLM's "Maximum concurrency … x"), this GPU's
    /// group; with data-parallel attention, times the group's size.
    pub max_concurrency: f64,
    /// The longest context at which `concurrency` sequences fit.
    pub max_context: u64,
    /// The estimated activation peak of one prefill chunk.
    pub activation_peak: u64,
    /// Tokens in one prefill chunk.
    pub max_num_batched_tokens: u64,
    /// What the process takes on the card (nvidia-smi), bytes.
    pub process_bytes: u128,
    /// The budget, row by row.
    pub rows: Vec<ServeRow>,
    /// Changes that make `concurrency` sequences of `context` tokens fit (cheapest first), when
    /// they do not.
    pub fixes: Vec<ServeFix>,
    pub notes: Vec<String>,
    #[serde(skip)]
    pub pool: Pool,
}

fn gib(b: i128) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

fn row(name: &'static str, label: &'static str, bytes: i128, formula: &str, substituted: String, source: &'static str) -> ServeRow {
    ServeRow { name, label, bytes, formula: formula.to_string(), substituted, source }
}

/// The layers one GPU caches: the first pipeline stage's (the largest, ⌈L / pp⌉ layers), split
/// over the attention's tensor-parallel group (whole heads with data-parallel attention).
pub fn gpu_layers(cfg: &Config) -> Result<Vec<KvLayer>, ServeError> {
    let per_stage = cfg.arch.layers.div_ceil(cfg.pp.max(1));
    let stage = cfg.arch.stage(0..per_stage);
    if cfg.serve.engine == Engine::Transformers {
        return Ok(super::layers::transformers_layers(&stage)?);
    }
    let tp_attn = if cfg.serve.dp_attention { 1 } else { cfg.tp };
    Ok(kv_layers(&stage, tp_attn)?)
}

/// The dtypes of the layers' states for this configuration, as each engine chooses them from
/// the model's dtype, the checkpoint's `mamba_ssm_dtype` (`arch.ssm_dtype`) and the
/// `mamba_ssm_cache_dtype` key: transformers conv in the model's dtype and recurrent in FP32
/// (it reads no such key); vLLM, SGLang and TensorRT-LLM as [`StateFormat::vllm`],
/// [`StateFormat::sglang`] and [`StateFormat::trtllm`] say.
pub fn state_format(cfg: &Config) -> StateFormat {
    let model = cfg.serve.weight_dtype.model_format();
    let set = cfg.serve.mamba_ssm_cache_dtype;
    match cfg.serve.engine {
        Engine::Transformers => StateFormat::transformers(model),
        Engine::Vllm => StateFormat::vllm(model, &cfg.arch, set),
        Engine::Sglang => StateFormat::sglang(&cfg.arch, set),
        Engine::Trtllm => StateFormat::trtllm(model, &cfg.arch, set),
    }
}

/// The alignment of vLLM's hybrid attention block for this model: 64 tokens when its attention
/// is MLA (Kimi Linear), else 16 ([`super::kv::hybrid_block_size`]).
pub fn hybrid_block_align(cfg: &Config) -> u64 {
    if cfg.arch.is_mla() {
        super::kv::VLLM_MLA_HYBRID_BLOCK_ALIGN
    } else {
        super::kv::VLLM_HYBRID_BLOCK_ALIGN
    }
}

/// The KV cache's format for this configuration.
pub fn kv_format(cfg: &Config) -> Format {
    cfg.serve.kv_dtype.format(cfg.serve.weight_dtype.model_format())
}

/// The context the answers are for.
pub fn context_of(cfg: &Config) -> u64 {
    cfg.serve.context.unwrap_or(cfg.arch.max_pos).clamp(1, MAX_CONTEXT)
}

/// Everything a pool needs, and the budget's rows.
pub struct Sized {
    pub pool: Pool,
    pub cell: u64,
    pub weights: u64,
    pub activation: u64,
    pub batched: u64,
    pub kv_cache_bytes: u128,
    pub process_bytes: u128,
    pub rows: Vec<ServeRow>,
    pub notes: Vec<String>,
}

/// The engine's pool for `cfg`.
pub fn size(cfg: &Config) -> Result<Sized, ServeError> {
    let s = &cfg.serve;
    if !(0.0..=1.0).contains(&s.gpu_memory_utilization) || s.gpu_memory_utilization == 0.0 {
        return Err(invalid("gpu_memory_utilization", "must be in (0, 1]"));
    }
    let layers = gpu_layers(cfg)?;
    let fmt = kv_format(cfg);
    let model_fmt = s.weight_dtype.model_format();
    let cell = per_token_bytes(&layers, fmt);
    let sf = state_format(cfg);
    let state = state_bytes(&layers, sf);
    let total = torch_total_bytes(cfg);
    let ctx = cuda_context_bytes(cfg).bytes;
    let tp_attn = if s.dp_attention { 1 } else { cfg.tp };
    let group = Config { gpus: cfg.tp * cfg.pp, cp: 1, zero: super::super::config::Zero::Ddp, ..cfg.clone() };
    let nccl = nccl_buffer_bytes(&group).map_or(0, |r| r.bytes);
    let engine = s.engine;
    let pad = matches!(engine, Engine::Vllm | Engine::Sglang);
    let weights = super::weights::weight_bytes(cfg, s.weight_dtype, pad);
    let block = s.block_size.unwrap_or(engine.default_block_size()).max(1);
    let batched = s.max_num_batched_tokens.unwrap_or(VLLM_MAX_NUM_BATCHED_TOKENS).max(1);
    let rows_sampled = s.max_num_seqs.min(batched);
    let activation = prefill_peak_bytes(&cfg.arch, model_fmt, tp_attn, batched, rows_sampled);
    let graphs = cuda_graph_bytes(cfg);
    let mut rows = vec![row(
        "total",
        "GPU memory as torch sees it",
        total as i128,
        "M_total = torch.cuda.mem_get_info()[1]",
        gib(total as i128),
        "budget.rs torch_total_bytes: vLLM's logged total for an H100 80GB, else the catalog",
    )];
    rows.push(row(
        "weights",
        "weights",
        weights as i128,
        if pad { "Σ_tensors on this GPU bytes(tensor, weight_dtype) + rotary cos/sin cache" } else { "Σ_tensors on this GPU bytes(tensor, weight_dtype)" },
        format!("{} ({})", gib(weights as i128), s.weight_dtype_name()),
        "weights.rs: the model's tensor table split by tp/ep, cut to the largest pp stage (vLLM/SGLang: vocabulary padded to 64, rope_cache_bytes)",
    ));
    let mut notes = Vec::new();
    let (pool, kv_cache_bytes, process_bytes) = match engine {
        Engine::Vllm => {
            let requested = fraction_of(total, s.gpu_memory_utilization);
            let avail = requested as i128 - weights as i128 - activation as i128 - nccl as i128;
            rows.push(row(
                "requested",
                "vLLM's share of the card",
                requested as i128,
                "M_req = M_total · gpu_memory_utilization",
                format!("{} · {} = {}", gib(total as i128), s.gpu_memory_utilization, gib(requested as i128)),
                "vllm/v1/worker/gpu_worker.py Worker.init_device: requested_memory",
            ));
            rows.push(row(
                "activation_peak",
                "activation peak of the profiling run (estimate)",
                activation as i128,
                "T·2h·e + max(attn, mlp, moe) + R·V·(e + 12)",
                format!("T = {batched}, R = {rows_sampled}: {}", gib(activation as i128)),
                "activation.rs; vLLM GPUModelRunner.profile_run (torch peak increase)",
            ));
            rows.push(row(
                "non_torch",
                "memory outside torch set up after the snapshot (NCCL)",
                nccl as i128,
                "n_comm · n_ch · n_peer · (Simple + LL + LL128)",
                gib(nccl as i128),
                "vllm/utils/mem_utils.py memory_profiling: non_torch_increase",
            ));
            rows.push(row(
                "kv_cache",
                "available KV cache memory",
                avail,
                "M_kv = M_req − weights − activation peak − non-torch",
                format!(
                    "{} − {} − {} − {} = {}",
                    gib(requested as i128),
                    gib(weights as i128),
                    gib(activation as i128),
                    gib(nccl as i128),
                    gib(avail)
                ),
                "vllm/v1/worker/gpu_worker.py Worker.determine_available_memory",
            ));
            let layout = PagedLayout::aligned(&layers, fmt, sf, block, hybrid_block_align(cfg))?;
            if layout.state_page_bytes > 0 {
                notes.push(format!(
                    "vLLM's hybrid allocator: {} B of state per layer padded to pages of {} tokens ({} B), one block per request in each state group",
                    layout.state_page_bytes, layout.block_size, layout.page_bytes
                ));
            }
            let num_blocks = layout.num_blocks(avail.max(0) as u128);
            rows.push(row(
                "kv_blocks",
                "# GPU blocks",
                num_blocks as i128 * layout.block_bytes() as i128,
                "n_blocks = ⌊M_kv / page_bytes / group_size⌋",
                format!("⌊{} / {} / {}⌋ = {num_blocks} blocks", avail.max(0), layout.page_bytes, layout.group_size),
                "vllm/v1/core/kv_cache_utils.py get_num_blocks",
            ));
            if avail <= 0 {
                notes.push("vLLM would stop: \"No available memory for the cache blocks\"".into());
            }
            let process = ctx + requested + graphs;
            (Pool::Paged { layout, num_blocks, batched }, avail.max(0) as u128, process)
        }
        Engine::Sglang => {
            let frac = s.mem_fraction_static.unwrap_or_else(|| sglang_default_fraction(cfg.tp));
            let used = ctx + weights as u128 + nccl;
            let rest_all = fraction_of(total, frac) as i128 - used as i128;
            let (state_slots, kv_rest) = super::budget::sglang_state_split(rest_all.max(0) as u128, state);
            let rest = if state > 0 { kv_rest as i128 } else { rest_all };
            if state > 0 {
                rows.push(row(
                    "state_pool",
                    "MambaPool (hybrid layers' states)",
                    (rest_all.max(0) as u128 - kv_rest) as i128,
                    "slots = ⌊rest · r / (1 + r) / state_per_req⌋, r = mamba_full_memory_ratio (0.9)",
                    format!(
                        "⌊{} · 0.9 / 1.9 / {state}⌋ = {state_slots} slots (at most {} running requests)",
                        gib(rest_all),
                        state_slots / super::budget::SGLANG_MAMBA_SLOTS_PER_REQUEST
                    ),
                    "sglang model_runner_kv_cache_mixin.py ModelRunnerKVCacheMixin.handle_max_mamba_cache, init_memory",
                ));
            }
            rows.push(row(
                "kv_cache",
                "KV pool (rest memory)",
                rest,
                if state > 0 {
                    "M_kv = mem_fraction_static · M_total − (CUDA context + weights + NCCL) − MambaPool"
                } else {
                    "M_kv = mem_fraction_static · M_total − (CUDA context + weights + NCCL)"
                },
                if state > 0 {
                    format!("{frac} · {} − {} − {} = {}", gib(total as i128), gib(used as i128), gib(rest_all - rest), gib(rest))
                } else {
                    format!("{frac} · {} − {} = {}", gib(total as i128), gib(used as i128), gib(rest))
                },
                "sglang python/sglang/srt/model_executor/model_runner.py ModelRunner.profile_max_num_token",
            ));
            let tokens = (rest.max(0) as u128 / cell.max(1) as u128) as u64 / block * block;
            rows.push(row(
                "kv_tokens",
                "#tokens of the pool",
                tokens as i128 * cell as i128,
                "max_total_num_tokens = ⌊M_kv / cell_size⌋ (page-aligned)",
                format!("⌊{} / {cell}⌋ = {tokens} tokens", rest.max(0)),
                "sglang ModelRunner.profile_max_num_token: cell_size = Σ_layers (k + v) · e",
            ));
            if layers.iter().any(|l| matches!(l.attn, super::layers::Attn::Sliding(_) | super::layers::Attn::Chunked(_))) {
                notes.push("SGLang's hybrid sliding-window pool (SWA) is not modelled: every layer is sized as full attention (SGLang with --disable-hybrid-swa-memory)".into());
            }

            let process = ctx + fraction_of(total, frac).max(used) + graphs;
            (Pool::Tokens { tokens, cell, page: block, state, state_slots }, rest.max(0) as u128, process)
        }
        Engine::Trtllm => {
            let free = total as i128 - ctx as i128 - weights as i128 - activation as i128 - nccl as i128;
            let kv = fraction_of(free.max(0) as u128, s.free_gpu_memory_fraction);
            rows.push(row(
                "activation_peak",
                "activation peak of the profiling forward (estimate)",
                activation as i128,
                "T·2h·e + max(attn, mlp, moe) + R·V·(e + 12)",
                format!("T = {batched}: {}", gib(activation as i128)),
                "activation.rs; tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator (profiling forward)",
            ));
            rows.push(row(
                "kv_cache",
                "KV cache (free_gpu_memory_fraction of what is free)",
                kv as i128,
                "M_kv = free_gpu_memory_fraction · (M_total − CUDA context − weights − activation peak − NCCL)",
                format!("{} · {} = {}", s.free_gpu_memory_fraction, gib(free), gib(kv as i128)),
                "TensorRT-LLM KvCacheConfig.free_gpu_memory_fraction; _torch/pyexecutor/_util.py",
            ));
            let block_bytes = cell * block;
            let num_blocks = (kv / block_bytes.max(1) as u128) as u64;
            if layers.iter().any(|l| matches!(l.attn, super::layers::Attn::Sliding(_) | super::layers::Attn::Chunked(_))) {
                notes.push("TensorRT-LLM's variable sliding-window pools are not modelled: every layer is sized as full attention".into());
            }
            if state > 0 {
                notes.push(format!("TensorRT-LLM's state cache is approximated: {state} B of state per sequence taken from the KV budget"));
            }
            (Pool::Blocks { num_blocks, block, state }, kv, ctx + (total as i128 - free.max(0)) as u128 + kv)
        }
        Engine::Transformers => {
            if cfg.tp > 1 || cfg.pp > 1 {
                return Err(invalid(
                    if cfg.tp > 1 { "tp" } else { "pp" },
                    "is not modelled for transformers' generate() (one process on one GPU)",
                ));
            }
            if s.mamba_ssm_cache_dtype != StateDtype::Auto {
                return Err(invalid(
                    "mamba_ssm_cache_dtype",
                    "is not an option of transformers 5.24's cache (its torch path keeps the recurrent state in fp32)",
                ));
            }
            let quantized = match s.kv_dtype {
                KvDtype::Auto | KvDtype::Bf16 | KvDtype::Fp16 => false,
                KvDtype::Fp8 => true,
                KvDtype::Int8 | KvDtype::Nvfp4 => {
                    return Err(invalid(
                        "kv_dtype",
                        "is not a cache transformers 5.24 offers without optimum-quanto or hqq (not modelled); use fp8 (QuantizedCache backend fp8)",
                    ))
                }
            };
            if quantized && layers.iter().any(|l| l.attn != super::layers::Attn::Full || l.state.is_some()) {
                return Err(invalid(
                    "kv_dtype",
                    "fp8: transformers' QuantizedCache refuses models with sliding, chunked, linear-attention or Mamba layers",
                ));
            }
            let prefill_peak = prefill_peak_bytes(&cfg.arch, model_fmt, 1, context_of(cfg), 1);
            let free = total as i128 - ctx as i128 - weights as i128 - prefill_peak as i128;
            rows.push(row(
                "kv_cache",
                "memory left for the cache",
                free,
                "M_kv = M_total − CUDA context − weights − activation peak of one prefill",
                format!(
                    "{} − {} − {} − {} = {}",
                    gib(total as i128),
                    gib(ctx as i128),
                    gib(weights as i128),
                    gib(prefill_peak as i128),
                    gib(free)
                ),
                "transformers generate(): DynamicCache grows until the card is full",
            ));
            (Pool::Free { bytes: free.max(0) as u128, layers: layers.clone(), fmt, sf }, free.max(0) as u128, total)
        }
    };
    rows.push(row(
        "cuda_context",
        "CUDA context (outside the budget)",
        ctx as i128,
        "measured figure for the GPU's generation",
        gib(ctx as i128),
        "overhead.rs cuda_context_bytes",
    ));
    if engine != Engine::Transformers && graphs > 0 {
        rows.push(row(
            "cuda_graphs",
            "CUDA graphs (captured after the cache; outside the budget)",
            graphs as i128,
            "cuda_graph_mib · 2^20",
            format!("{} MiB", graphs / MIB),
            "budget.rs CUDA_GRAPH_DEFAULT_MIB (assumed) or cuda_graph_mib",
        ));
    }
    Ok(Sized { pool, cell, weights, activation, batched, kv_cache_bytes, process_bytes, rows, notes })
}

impl crate::estimator::serve_config::Serving {
    fn weight_dtype_name(&self) -> String {
        serde_json::to_value(self.weight_dtype).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
    }
}

/// Concurrent sequences for `cfg`'s whole attention group (times the group's size with
/// data-parallel attention, where each GPU serves its own sequences).
fn group_concurrency(cfg: &Config, pool: &Pool, len: u64, cell: u64) -> f64 {
    let dp = if cfg.serve.dp_attention { cfg.tp.max(1) } else { 1 };
    pool.concurrency(len, cell) * dp as f64
}

/// The serving answers for `cfg`.
pub fn analyse_serving(cfg: &Config) -> Result<Serve, ServeError> {
    let sized = size(cfg)?;
    let context = context_of(cfg);
    let n = cfg.serve.concurrency.max(1);
    let dp = if cfg.serve.dp_attention { cfg.tp.max(1) } else { 1 };
    let per_gpu_n = n.div_ceil(dp);
    let max_concurrency = group_concurrency(cfg, &sized.pool, context, sized.cell);
    let mut notes = sized.notes;
    if context > cfg.arch.max_pos {
        notes.push(format!("context {context} is beyond the model's max_position_embeddings {}", cfg.arch.max_pos));
    }
    let fixes = if max_concurrency >= n as f64 { Vec::new() } else { fixes(cfg, context, n) };
    let max_context = sized.pool.max_context(per_gpu_n, sized.cell);
    if max_context > cfg.arch.max_pos {
        notes.push(format!(
            "the cache would hold {max_context} tokens per sequence, beyond the model's max_position_embeddings {} (an engine refuses a longer max_model_len unless told to)",
            cfg.arch.max_pos
        ));
    }
    if fixes.is_empty() && max_concurrency < n as f64 {
        notes.push(format!(
            "no single change (FP8 KV, a smaller prefill chunk, twice the TP, another replica) makes {n} sequences of {context} tokens fit"
        ));
    }
    Ok(Serve {
        engine: cfg.serve.engine.label(),
        model: cfg.display_name(),
        gpu: cfg.gpu.clone(),
        context,
        concurrency: n,
        kv_dtype: kv_format(cfg).name,
        state_dtype: super::layers::has_states(&cfg.arch).then(|| state_format(cfg).recurrent.name),
        state_bytes: sized.pool.state_bytes(),
        weights: sized.weights,
        kv_per_token: sized.cell,
        kv_bytes: sized.pool.sequence_bytes(context, sized.cell),
        kv_cache_bytes: sized.kv_cache_bytes,
        kv_cache_tokens: sized.pool.tokens(sized.cell),
        block_size: match &sized.pool {
            Pool::Paged { layout, .. } => layout.block_size,
            Pool::Blocks { block, .. } => *block,
            Pool::Tokens { page, .. } => *page,
            Pool::Free { .. } => 1,
        },
        kv_blocks: sized.pool.blocks(),
        max_concurrency,
        max_context,
        activation_peak: sized.activation,
        max_num_batched_tokens: sized.batched,
        process_bytes: sized.process_bytes,
        rows: sized.rows,
        fixes,
        notes,
        pool: sized.pool,
    })
}

/// Concurrency at `context` of the changed configuration `c`.
fn concurrency_of(c: &Config, context: u64) -> Option<f64> {
    let sized = size(c).ok()?;
    Some(group_concurrency(c, &sized.pool, context, sized.cell))
}

/// A candidate fix: its label, the keys it changes, and the configuration with them.
type Candidate = (String, Vec<(&'static str, String)>, Config);

/// The single changes that make `n` sequences of `context` tokens fit, cheapest first: an FP8
/// KV cache, a smaller prefill chunk, twice the tensor parallelism, another GPU (a data-parallel
/// replica, which serves half the sequences). Each change is made on the configuration itself
/// and named by the keys a share link writes for it.
pub fn fixes(cfg: &Config, context: u64, n: u64) -> Vec<ServeFix> {
    let s = &cfg.serve;
    let more_gpus = cfg.gpus.max(cfg.tp * cfg.pp) * 2;
    let mut candidates: Vec<Candidate> = Vec::new();
    if matches!(s.kv_dtype, KvDtype::Auto | KvDtype::Bf16 | KvDtype::Fp16) {
        let mut c = cfg.clone();
        c.serve.kv_dtype = KvDtype::Fp8;
        candidates.push(("FP8 KV cache".into(), vec![("kv_dtype", "fp8".into())], c));
    }
    let batched = s.max_num_batched_tokens.unwrap_or(VLLM_MAX_NUM_BATCHED_TOKENS);
    if matches!(s.engine, Engine::Vllm | Engine::Trtllm) && batched > 2048 {
        let mut c = cfg.clone();
        c.serve.max_num_batched_tokens = Some(batched / 2);
        candidates.push((
            format!("max_num_batched_tokens {} instead of {batched}", batched / 2),
            vec![("max_num_batched_tokens", (batched / 2).to_string())],
            c,
        ));
    }
    let tp = cfg.tp * 2;
    if s.engine != Engine::Transformers {
        let c = Config { tp, gpus: more_gpus, ..cfg.clone() };
        candidates.push((format!("tensor parallelism {tp}"), vec![("tp", tp.to_string()), ("gpus", more_gpus.to_string())], c));
    }
    let mut out = Vec::new();
    for (change, set, c) in candidates {
        // A change the configuration rejects (heads that do not split over tp) is no fix.
        if crate::estimator::validate::validate_consistency(&c).is_err() {
            continue;
        }
        if let Some(conc) = concurrency_of(&c, context) {
            if conc >= n as f64 {
                out.push(ServeFix { change, set, max_concurrency: conc });
            }
        }
    }
    // Another replica: each serves half the sequences.
    if let Some(c) = concurrency_of(cfg, context) {
        if 2.0 * c >= n as f64 {
            out.push(ServeFix {
                change: "another GPU group (a data-parallel replica)".into(),
                set: vec![("gpus", more_gpus.to_string())],
                max_concurrency: 2.0 * c,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::decode_query;

    fn serve(q: &str) -> Serve {
        let c = decode_query(q).config;
        match analyse_serving(&c) {
            Ok(s) => s,
            Err(e) => panic!("{q}: {e}"),
        }
    }

    #[test]
    fn llama_8b_on_an_h100_gets_vllms_blocks() {
        let s = serve("mode=serve&model=llama-3.1-8b&context=8192");
        // 32 layers · 2 · 8 heads · 128 · 2 B = 131,072 B per token; a block of 16 is 2 MiB.
        assert_eq!(s.kv_per_token, 131_072);
        assert_eq!(s.kv_bytes, 8192 * 131_072);
        assert_eq!(s.block_size, 16);
        // The blocks are the KV budget in 2 MiB pieces.
        assert_eq!(s.kv_blocks as u128, s.kv_cache_bytes / (2 << 20));
        assert!((s.max_concurrency - s.kv_blocks as f64 / 512.0).abs() < 1e-9);
        assert!(s.max_context >= 8192);
    }

    #[test]
    fn qwen3_next_counts_its_twelve_attention_layers_and_its_delta_net_states() {
        // Qwen3-Next-80B-A3B, bf16: 12 full layers · 2 · 2 heads · 256 · 2 B = 24,576 B per
        // token (48 layers counted as attention gave 98,304 B).
        let q = "mode=serve&model=qwen3-next-80b-a3b-thinking&context=32768&gpus=2&tp=2";
        let v = serve(q);
        // TP 2: one KV head of 256 per GPU, 12 · 2 · 256 · 2 = 12,288 B per token.
        assert_eq!(v.kv_per_token, 12_288);
        // vLLM's state per layer and GPU: conv 8,192/2 · 3 · 2 B = 24,576, temporal
        // 16 · 128 · 128 · 2 B = 524,288: 548,864 B. Attention page per token 1,024 B → block
        // 16·⌈548,864 / 16,384⌉ = 16 · 34 = 544 tokens, page 557,056 B; groups of 12 layers:
        // 3 state groups + 1 full. 32,768 tokens: ⌈32,768 / 544⌉ = 61 + 3 blocks of
        // 12 · 557,056 B = 64 · 6,684,672 = 427,819,008 B (32,768 · 12,288 = 402,653,184 of
        // keys and values before, had the 36 DeltaNet layers been attention: 4×).
        assert_eq!((v.block_size, v.kv_bytes), (544, 427_819_008));
        // transformers, one GPU: 32,768 · 24,576 B of keys and values + 36 states of
        // 8,192 · 4 · 2 B conv + 32 · 128 · 128 · 4 B recurrent (2,162,688 B) = 883,163,136 B.
        let t = serve("mode=serve&engine=transformers&model=qwen3-next-80b-a3b-thinking&context=32768&gpu=b200");
        assert_eq!((t.kv_per_token, t.kv_bytes), (24_576, 32_768 * 24_576 + 36 * 2_162_688));
        // SGLang: the token pool's cell counts the attention layers only; its MambaPool takes
        // 0.9/1.9 of the rest, in slots of the 36 states, and the running requests are at most
        // a third of the slots. SGLang keeps the temporal state in FP32 by default (no
        // `mamba_ssm_dtype` in Qwen3-Next's config): conv 24,576 B (bf16) + 16 · 128 · 128 · 4 B
        // = 1,073,152 B per layer and GPU.
        let g = serve(&format!("{q}&engine=sglang&gpu=b200"));
        assert_eq!((g.kv_per_token, g.kv_bytes), (12_288, 32_768 * 12_288 + 36 * 1_073_152));
        assert_eq!((g.state_dtype, g.state_bytes), (Some("fp32"), 36 * 1_073_152));
        let state_row = g.rows.iter().find(|r| r.name == "state_pool").map(|r| r.bytes).unwrap_or(0);
        let kv_row = g.rows.iter().find(|r| r.name == "kv_cache").map(|r| r.bytes).unwrap_or(0);
        assert!(state_row > 0 && (state_row as f64 / kv_row as f64 - 0.9).abs() < 0.01, "{state_row} {kv_row}");
        let slots = state_row as u64 / (36 * 1_073_152);
        assert!(g.max_concurrency <= (slots / 3) as f64);
    }

    #[test]
    fn qwen3_next_keeps_vllms_bf16_state_unless_the_key_says_fp32() {
        let q = "mode=serve&model=qwen3-next-80b-a3b-thinking&context=32768&gpus=2&tp=2";
        // Its config.json names no `mamba_ssm_dtype`: vLLM's "auto" is the model's bf16.
        let v = serve(q);
        assert_eq!((v.state_dtype, v.state_bytes), (Some("bf16"), 3 * 12 * 557_056));
        // `mamba_ssm_cache_dtype=float32` (vLLM --mamba-ssm-cache-dtype float32): the state per
        // layer and GPU is 24,576 + 16 · 128 · 128 · 4 = 1,073,152 B; the block becomes
        // 16 · ⌈1,073,152 / 16,384⌉ = 16 · 66 = 1,056 tokens, a page of 1,081,344 B; 32,768
        // tokens take ⌈32,768 / 1,056⌉ = 32 + 3 state blocks of 12 pages: 454,164,480 B.
        let f = serve(&format!("{q}&mamba_ssm_cache_dtype=float32"));
        assert_eq!((f.state_dtype, f.block_size, f.kv_bytes), (Some("fp32"), 1056, 35 * 12 * 1_081_344));
        // SGLang told bf16: conv 24,576 + 524,288 = 548,864 B per layer.
        let g = serve(&format!("{q}&engine=sglang&gpu=b200&mamba_ssm_cache_dtype=bfloat16"));
        assert_eq!((g.state_dtype, g.state_bytes), (Some("bf16"), 36 * 548_864));
    }

    #[test]
    fn qwen3_5_27b_keeps_its_recurrent_state_in_fp32_as_its_config_says() {
        // Qwen3.5-27B (config.json text_config: "mamba_ssm_dtype": "float32"), bf16, one H100:
        // 16 full layers · 2 · 4 heads · 256 · 2 B = 65,536 B per token. Each of the 48 DeltaNet
        // layers: conv cd = 2 · 16 · 128 + 48 · 128 = 10,240 channels, recurrent
        // Hv · dk · dv = 48 · 128 · 128 = 786,432 values.
        // (Toy check of the formula: Hk 2, Hv 4, dk = dv 16 → cd 2·2·16 + 4·16 = 128,
        // recurrent 4·16·16 = 1,024 values = 4,096 B in fp32, 2,048 B in bf16.)
        let q = "mode=serve&model=qwen3.5-27b&context=32768";
        let v = serve(q);
        assert_eq!(v.kv_per_token, 65_536);
        // vLLM follows the checkpoint (Qwen3_5ForConditionalGenerationConfig): 3 conv columns
        // · 10,240 · 2 B = 61,440 + 786,432 · 4 B = 3,145,728 → 3,207,168 B per state. Block
        // 16 · ⌈3,207,168 / (16 · 4,096)⌉ = 16 · 49 = 784 tokens, page 3,211,264 B, groups of
        // 16 layers (3 state + 1 full): ⌈32,768 / 784⌉ = 42 + 3 blocks of 16 pages.
        assert_eq!((v.state_dtype, v.block_size), (Some("fp32"), 784));
        assert_eq!(v.kv_bytes, 45 * 16 * 3_211_264);
        assert_eq!(v.state_bytes, 3 * 16 * 3_211_264);
        // With --mamba-ssm-cache-dtype bfloat16: 61,440 + 1,572,864 = 1,634,304 B per state,
        // block 16 · ⌈1,634,304 / 65,536⌉ = 400 tokens, page 1,638,400 B: 82 + 3 blocks.
        let b = serve(&format!("{q}&mamba_ssm_cache_dtype=bfloat16"));
        assert_eq!((b.state_dtype, b.block_size, b.kv_bytes), (Some("bf16"), 400, 85 * 16 * 1_638_400));
        assert!(b.max_concurrency > v.max_concurrency);
        // SGLang reads the config too (float32 is also its default): 48 · 3,207,168 B.
        let g = serve(&format!("{q}&engine=sglang"));
        assert_eq!((g.state_dtype, g.kv_bytes), (Some("fp32"), 32_768 * 65_536 + 48 * 3_207_168));
        // transformers: its torch path keeps Kc = 4 conv columns (81,920 B) and an fp32
        // recurrent state whatever the config says: 48 · 3,227,648 B.
        let t = serve(&format!("{q}&engine=transformers&gpu=b200"));
        assert_eq!((t.state_dtype, t.kv_bytes), (Some("fp32"), 32_768 * 65_536 + 48 * 3_227_648));
    }

    #[test]
    fn fp8_kv_doubles_the_blocks() {
        let a = serve("mode=serve&model=llama-3.1-8b&context=8192");
        let b = serve("mode=serve&model=llama-3.1-8b&context=8192&kv_dtype=fp8");
        assert_eq!(b.kv_per_token * 2, a.kv_per_token);
        assert!(b.kv_blocks >= 2 * a.kv_blocks && b.kv_blocks <= 2 * a.kv_blocks + 1);
    }

    #[test]
    fn a_target_that_does_not_fit_gets_its_fixes() {
        let s = serve("mode=serve&model=llama-3.1-70b&context=32768&concurrency=64&gpus=4&tp=4");
        assert!(s.max_concurrency < 64.0);
        assert!(s.fixes.iter().all(|f| f.max_concurrency >= 64.0));
    }

    #[test]
    fn transformers_refuses_what_it_does_not_offer_naming_the_key() {
        let c = decode_query("mode=serve&engine=transformers&kv_dtype=int8").config;
        assert_eq!(analyse_serving(&c).err().map(|e| e.key()), Some("kv_dtype"));
        let g = decode_query("mode=serve&engine=transformers&kv_dtype=fp8&model=gemma-3-27b-it").config;
        assert_eq!(analyse_serving(&g).err().map(|e| e.key()), Some("kv_dtype"));
        let m = decode_query("mode=serve&engine=transformers&model=qwen3.5-27b&mamba_ssm_cache_dtype=bfloat16").config;
        assert_eq!(analyse_serving(&m).err().map(|e| e.key()), Some("mamba_ssm_cache_dtype"));
    }
}
