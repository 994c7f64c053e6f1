//! The KV cache, byte by byte, in each engine's layout.
//!
//! - [`per_token_bytes`]: one token of every layer at full attention, per GPU.
//! - [`transformers_bytes`]: what transformers 5.24's `DynamicCache` (or
//!   `QuantizedCache(backend="fp8")`) holds after a prefill and some decode steps, as
//!   `generate()` builds it (`DynamicCache(config=model.config)`, cache_utils.py).
//! - [`PagedLayout`]: vLLM's blocks (`vllm/v1/core/kv_cache_utils.py`, `vllm/v1/kv_cache_interface.py`).

use super::dtype::{Format, BF16, FP16};
use super::layers::{Attn, KvLayer, State};
use crate::estimator::family::Family;
use crate::estimator::model::{ModelSpec, StateDtype};
use serde::Serialize;

/// FP32, 4 bytes: the recurrent state transformers keeps.
pub const FP32: Format = Format::plain(4, "fp32");

/// The dtypes a layer's fixed-size [`State`] is kept in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateFormat {
    /// The conv state's format.
    pub conv: Format,
    /// The recurrent (SSM) state's format.
    pub recurrent: Format,
}

impl StateFormat {
    /// transformers 5.24 on its torch path (measured, tests/fixtures/serve/transformers_kv.json):
    /// the conv state in the model's dtype (`torch.zeros(…, dtype=conv_states.dtype)`, the
    /// activations'), the recurrent state in FP32 — `torch_chunk_gated_delta_rule` casts q, k, v,
    /// β and g `.to(torch.float32)` (modeling_qwen3_next.py) and `mamba2_chunk_scan`'s torch
    /// fallback returns its final state in FP32 (modeling_falcon_h1.py), and
    /// `LinearAttentionLayer.lazy_initialization` keeps `torch.zeros_like(recurrent_states)`.
    pub fn transformers(model: Format) -> StateFormat {
        StateFormat { conv: model, recurrent: FP32 }
    }

    /// vLLM: the conv state in the model's dtype (`--mamba-cache-dtype` "auto"), the SSM /
    /// temporal state in `--mamba-ssm-cache-dtype` (`set`), whose "auto" is the conv's dtype
    /// (`MambaStateDtypeCalculator._mamba_state_dtype`, vllm/model_executor/layers/mamba/
    /// mamba_utils.py) — except for Qwen3.5, whose checkpoint's `mamba_ssm_dtype` (text_config)
    /// replaces "auto" (`Qwen3_5ForConditionalGenerationConfig.verify_and_update_config`,
    /// vllm/model_executor/models/config.py, mapped for `Qwen3_5ForConditionalGeneration` and
    /// `Qwen3_5MoeForConditionalGeneration`; Qwen3-Next, Falcon-H1 and Granite 4.0-H keep
    /// "auto"). The KV cache's dtype (`kv_dtype`) does not apply to states. Kimi Linear's KDA
    /// layers keep their recurrent state in FP32 whatever is set (`kda_state_dtype` returns
    /// `(state_dtype, state_dtype, state_dtype, torch.float32)`: conv q, k, v, recurrent).
    pub fn vllm(model: Format, spec: &ModelSpec, set: StateDtype) -> StateFormat {
        if spec.family == Family::KimiLinear {
            return StateFormat { conv: model, recurrent: FP32 };
        }
        let qwen35 = matches!(spec.family, Family::Qwen35Text | Family::Qwen35MoeText);
        let checkpoint = if qwen35 { spec.ssm_dtype } else { StateDtype::Auto };
        StateFormat { conv: model, recurrent: state_dtype_format(set.or(checkpoint), model) }
    }

    /// SGLang: the conv state in bf16 (`SGLANG_MAMBA_CONV_DTYPE`'s default, whatever the
    /// model's dtype), the SSM / temporal state in `--mamba-ssm-dtype` (`set`, which SGLang
    /// passes on as `SGLANG_MAMBA_SSM_DTYPE`), else the config's `mamba_ssm_dtype`
    /// (`text_config`'s for the multimodal checkpoints), else **FP32** for every hybrid
    /// (`mamba2_state_dtype`, python/sglang/srt/configs/mamba_utils.py: "3. Default float32").
    pub fn sglang(spec: &ModelSpec, set: StateDtype) -> StateFormat {
        StateFormat { conv: BF16, recurrent: state_dtype_format(set.or(spec.ssm_dtype), FP32) }
    }

    /// TensorRT-LLM (an approximation): the conv state in the model's dtype, the SSM state in
    /// `KvCacheConfig.mamba_ssm_cache_dtype` (`set`), else the checkpoint's `mamba_ssm_dtype`
    /// (`resolve_mamba_ssm_cache_dtype`, tensorrt_llm/_torch/pyexecutor/config_utils.py, which
    /// looks in `text_config` too), else the model's dtype. Later TensorRT-LLM changes keep
    /// "auto" at the model's dtype for Qwen3.5; the version is not pinned here.
    pub fn trtllm(model: Format, spec: &ModelSpec, set: StateDtype) -> StateFormat {
        StateFormat { conv: model, recurrent: state_dtype_format(set.or(spec.ssm_dtype), model) }
    }

    /// Bytes of one sequence's state: `bytes(conv) + bytes(recurrent)`.
    pub fn bytes(&self, s: State) -> u64 {
        self.conv.bytes(s.conv) + self.recurrent.bytes(s.recurrent)
    }
}

/// The format of a named state dtype; `auto` gives `default`.
pub fn state_dtype_format(d: StateDtype, default: Format) -> Format {
    match d {
        StateDtype::Auto => default,
        StateDtype::Float32 => FP32,
        StateDtype::Bfloat16 => BF16,
        StateDtype::Float16 => FP16,
    }
}

/// Bytes of one sequence's states in every layer: `Σ_layers bytes(conv) + bytes(recurrent)`,
/// the same whatever the context.
pub fn state_bytes(layers: &[KvLayer], sf: StateFormat) -> u64 {
    layers.iter().map(|l| sf.bytes(l.state)).sum()
}

/// `DynamicSlidingWindowLayer._sliding_window_tensor`: the window as a 0-dim int64 tensor, moved
/// to the cache's device (cache_utils.py, transformers 5.24).
pub const SLIDING_WINDOW_TENSOR_BYTES: u64 = 8;

/// Bytes of one token's keys and values in every layer of `layers`, ignoring windows:
/// `Σ_layers (bytes(k) + bytes(v))`. The per-tensor scales of a quantized cache are not per token
/// and are left out, and so are states (linear-attention layers add 0: `k = v = 0`).
pub fn per_token_bytes(layers: &[KvLayer], fmt: Format) -> u64 {
    layers.iter().map(|l| fmt.bytes(l.k) + fmt.bytes(l.v) + fmt.bytes(l.idx)).sum()
}

/// Which bytes of transformers' cache to count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// `numel · element_size` of the tensors the cache layers hold (what `keys.shape` says).
    Logical,
    /// The storages behind them: `DynamicSlidingWindowLayer.update` keeps
    /// `torch.cat([keys, new])[:, :, -w + 1:]`, a view that keeps the whole concatenation alive.
    Storage,
}

/// The tokens a `DynamicSlidingWindowLayer` of window `w` holds after a prefill of `p` tokens and
/// `n` single-token decode steps (`t = p + n`): logically `min(t, w − 1)`; in storage the last
/// concatenation, `p` tokens after the prefill alone (n = 0) and `min(t, w)` after a decode step.
/// Chunked layers are the same class with `w` = the chunk (`DYNAMIC_LAYER_TYPE_MAPPING`).
pub fn window_tokens(w: u64, prefill: u64, decode: u64, count: Count) -> u64 {
    let t = prefill + decode;
    match count {
        Count::Logical => t.min(w.saturating_sub(1)),
        Count::Storage if decode == 0 => prefill,
        Count::Storage => t.min(w),
    }
}

/// Bytes transformers' cache holds for `batch` sequences after a prefill of `prefill` tokens and
/// `decode` decode steps.
///
/// `DynamicCache`: a full layer holds `b · t · (k + v + idx)` values (`DynamicLayer`, one `torch.cat`
/// per step); a sliding or chunked layer `b · window_tokens · (k + v)` values plus its 8-byte
/// window tensor. `QuantizedCache(backend="fp8")` (`fp8` = true; full-attention models only):
/// per layer `b · t · (k + v)` FP8 bytes plus one FP32 scale for K and one for V
/// (`Fp8QuantizedLayer`, frozen after the first update), its 16-bit `keys`/`values` left empty.
///
/// A layer with a state adds `b · (bytes(conv) + bytes(recurrent))` in `sf` once a token went
/// through it (`LinearAttentionLayer`: allocated at the first update, then copied into in place,
/// so storage = logical); a linear-attention layer (`Attn::Linear`) holds no keys or values.
pub fn transformers_bytes(layers: &[KvLayer], fmt: Format, sf: StateFormat, batch: u64, prefill: u64, decode: u64, count: Count) -> u64 {
    let t = prefill + decode;
    layers
        .iter()
        .map(|l| {
            let state = if t > 0 { batch * sf.bytes(l.state) } else { 0 };
            let (tokens, extra) = match l.attn {
                Attn::Full => (t, 0),
                Attn::Sliding(w) | Attn::Chunked(w) => (window_tokens(w, prefill, decode, count), SLIDING_WINDOW_TENSOR_BYTES),
                Attn::Linear => return state,
            };
            let idx = fmt.bytes(batch * tokens * l.idx);
            fmt.bytes(batch * tokens * l.k) + fmt.bytes(batch * tokens * l.v) + idx + 2 * fmt.tensor_scale_bytes + extra + state
        })
        .sum()
}

/// Why a paged layout cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PagedError {
    #[error("the layers' pages differ in size ({0} and {1} bytes per block), which vLLM's hybrid allocator does not support")]
    MixedPages(u64, u64),
    #[error("the model has no attention layer to cache")]
    Empty,
}

/// vLLM's attention block alignment for hybrid models: "some attention backends (e.g. FA) only
/// support setting block size to multiple of 16" (vllm/model_executor/models/config.py
/// `HybridAttentionMambaModelConfig.verify_and_update_config`).
pub const VLLM_HYBRID_BLOCK_ALIGN: u64 = 16;
/// The same alignment when the attention layers are MLA: "MLA backends: kernel_block_size 64
/// alignment" (`kernel_block_alignment_size = 128 if use_cutlass_mla else 64`, same function;
/// the CUTLASS_MLA backend's 128 is not modelled).
pub const VLLM_MLA_HYBRID_BLOCK_ALIGN: u64 = 64;

/// The attention block size vLLM picks for a model with states, so that one attention page
/// holds at least one state page: `B' = a · ⌈state_page / (a · attn_page_1_token)⌉` with the
/// alignment `a` ([`VLLM_HYBRID_BLOCK_ALIGN`], [`VLLM_MLA_HYBRID_BLOCK_ALIGN`] for MLA), kept
/// when the configured `B` is larger (`HybridAttentionMambaModelConfig`: "override attention
/// block size if either (a) the user has not set it or (b) the user has set it too small";
/// vLLM at commit 0144dd5b). The state page is then padded to the attention page
/// (`mamba_page_size_padded`).
pub fn hybrid_block_size(state_page: u64, attn_page_1_token: u64, block_size: u64, align: u64) -> u64 {
    let a = align.max(1);
    let need = a * state_page.div_ceil(a * attn_page_1_token.max(1));
    block_size.max(need)
}

/// vLLM's KV cache groups: layers of one attention type share a block table; groups of equal
/// size share memory pools (`_get_kv_cache_config_uniform_page_size`).
///
/// A layer's state is one more cache layer of type [`Attn::Linear`] (vLLM's `MambaSpec`, one per
/// `MambaMixer2` / `GatedDeltaNet`; Falcon-H1's decoder layer registers its attention and its
/// mixer separately), whose page is its state padded to the attention page, and whose group
/// takes one block per request (`MambaSpec.max_memory_usage_bytes` = `page_size_bytes`; vLLM
/// turns prefix caching off for hybrid models, `MambaModelConfig`, so no block per chunk is
/// kept). Linear-attention layers make no attention group.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PagedLayout {
    /// Tokens per block (raised for hybrids: [`hybrid_block_size`]).
    pub block_size: u64,
    /// Bytes of one block of one layer: `block_size · (bytes(k) + bytes(v))` (`page_size_bytes`).
    pub page_bytes: u64,
    /// Bytes of the largest layer state before padding to `page_bytes` (0: no state).
    pub state_page_bytes: u64,
    /// Layers per group: all of them for a uniform model, else the fewest layers of any type.
    pub group_size: u64,
    /// Each group's attention (a type with `n` layers makes `⌈n / group_size⌉` groups, the last
    /// padded; [`Attn::Linear`] for state groups).
    pub groups: Vec<Attn>,
    /// Whether the model mixes attention types (vLLM's hybrid allocator).
    pub hybrid: bool,
}

impl PagedLayout {
    /// The layout of `layers` in blocks of `block_size` tokens, states in `sf`, a hybrid's
    /// block aligned to [`VLLM_HYBRID_BLOCK_ALIGN`] (attention other than MLA).
    pub fn new(layers: &[KvLayer], fmt: Format, sf: StateFormat, block_size: u64) -> Result<PagedLayout, PagedError> {
        PagedLayout::aligned(layers, fmt, sf, block_size, VLLM_HYBRID_BLOCK_ALIGN)
    }

    /// [`PagedLayout::new`] with a hybrid's block aligned to `align` tokens
    /// ([`hybrid_block_size`]).
    pub fn aligned(layers: &[KvLayer], fmt: Format, sf: StateFormat, block_size: u64, align: u64) -> Result<PagedLayout, PagedError> {
        let attention: Vec<&KvLayer> = layers.iter().filter(|l| l.attn != Attn::Linear).collect();
        let first = attention.first().ok_or(PagedError::Empty)?;
        let page = |l: &KvLayer, b: u64| fmt.bytes(b * l.k) + fmt.bytes(b * l.v) + fmt.bytes(b * l.idx);
        let state_page_bytes = layers.iter().map(|l| sf.bytes(l.state)).max().unwrap_or(0);
        let block_size =
            if state_page_bytes > 0 { hybrid_block_size(state_page_bytes, page(first, 1), block_size, align) } else { block_size };
        let page_bytes = page(first, block_size);
        if let Some(other) = attention.iter().map(|l| page(l, block_size)).find(|&p| p != page_bytes) {
            return Err(PagedError::MixedPages(page_bytes, other));
        }
        // Cache layers per type, in order of first appearance: a layer's attention, then its
        // state.
        let mut types: Vec<(Attn, u64)> = Vec::new();
        let mut add = |a: Attn| match types.iter_mut().find(|(t, _)| *t == a) {
            Some((_, n)) => *n += 1,
            None => types.push((a, 1)),
        };
        for l in layers {
            if l.attn != Attn::Linear {
                add(l.attn);
            }
            if l.state.is_some() {
                add(Attn::Linear);
            }
        }
        let hybrid = types.len() > 1;
        let group_size = types.iter().map(|(_, n)| *n).min().unwrap_or(1).max(1);
        let groups = types.iter().flat_map(|&(a, n)| std::iter::repeat_n(a, n.div_ceil(group_size) as usize)).collect();
        Ok(PagedLayout { block_size, page_bytes, state_page_bytes, group_size, groups, hybrid })
    }

    /// Bytes of one block across a group's layers: `page_bytes · group_size`.
    pub fn block_bytes(&self) -> u64 {
        self.page_bytes * self.group_size
    }

    /// Blocks vLLM makes of `available` bytes: `⌊available / page_bytes / group_size⌋`
    /// (`get_num_blocks`).
    pub fn num_blocks(&self, available: u128) -> u64 {
        (available / self.page_bytes.max(1) as u128 / self.group_size as u128).min(u64::MAX as u128) as u64
    }

    /// Blocks one group needs for a request of `len` tokens when `batched` tokens are scheduled
    /// per step (`max_memory_usage_bytes` / `page_size_bytes`): full `⌈len / B⌉`; sliding window
    /// `⌈min(w − 1 + batched, len) / B⌉ + 1`; chunked `⌈min(c + batched, len) / B⌉`; a state
    /// group 1 (`MambaSpec`).
    pub fn group_blocks(&self, attn: Attn, len: u64, batched: u64) -> u64 {
        let b = self.block_size.max(1);
        match attn {
            Attn::Linear => 1,
            Attn::Full => len.div_ceil(b),
            Attn::Sliding(w) => (w.saturating_sub(1) + batched).min(len).div_ceil(b) + 1,
            Attn::Chunked(c) => (c + batched).min(len).div_ceil(b),
        }
    }

    /// Blocks one request of `len` tokens holds in every group together
    /// (`get_max_concurrency_for_kv_cache_config`'s `num_block_per_request`).
    pub fn blocks_per_request(&self, len: u64, batched: u64) -> u64 {
        self.groups.iter().map(|&a| self.group_blocks(a, len, batched)).sum()
    }

    /// The tokens vLLM logs as "GPU KV cache size": `num_blocks · B` for one group,
    /// `⌊num_blocks / groups⌋ · B` for a hybrid model.
    pub fn cache_tokens(&self, num_blocks: u64) -> u64 {
        num_blocks / (self.groups.len().max(1) as u64) * self.block_size
    }

    /// Bytes one request's states take: one block per state group, `groups_state · page_bytes ·
    /// group_size` (the padded pages).
    pub fn state_bytes_per_request(&self) -> u64 {
        self.groups.iter().filter(|&&a| a == Attn::Linear).count() as u64 * self.block_bytes()
    }

    /// "Maximum concurrency for `len` tokens per request": `num_blocks / blocks_per_request`.
    pub fn max_concurrency(&self, num_blocks: u64, len: u64, batched: u64) -> f64 {
        num_blocks as f64 / self.blocks_per_request(len, batched).max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::super::dtype::{BF16, FP16};
    use super::*;

    fn layer(attn: Attn) -> KvLayer {
        KvLayer { attn, k: 4, v: 4, idx: 0, state: State::NONE }
    }
    const SF: StateFormat = StateFormat { conv: BF16, recurrent: BF16 };

    #[test]
    fn a_full_layer_holds_every_token_and_a_window_its_last_w_minus_1() {
        let l = [layer(Attn::Full), layer(Attn::Sliding(8))];
        // 2 sequences of 10 tokens: full 2·10·8·2 = 320 B; window 7 tokens: 2·7·8·2 = 224 B + 8.
        assert_eq!(transformers_bytes(&l, BF16, SF, 2, 10, 0, Count::Logical), 320 + 224 + 8);
        // The prefill's concatenation stays alive behind the view: 10 tokens, then 8 after a step.
        assert_eq!(transformers_bytes(&l, BF16, SF, 2, 10, 0, Count::Storage), 320 + 320 + 8);
        assert_eq!(window_tokens(8, 10, 1, Count::Storage), 8);
        assert_eq!(window_tokens(8, 3, 2, Count::Storage), 5);
        assert_eq!(per_token_bytes(&l, FP16), 32);
    }

    #[test]
    fn vllm_groups_a_hybrid_model_by_its_rarest_layer_type() {
        // 5 sliding : 1 full over 12 layers: groups of 2 layers, 1 full group + 5 sliding groups.
        let l: Vec<_> = (0..12).map(|i| layer(if i % 6 == 5 { Attn::Full } else { Attn::Sliding(32) })).collect();
        let p = PagedLayout::new(&l, BF16, SF, 16).unwrap_or_else(|_| PagedLayout::new(&l[..1], BF16, SF, 16).expect("one layer"));
        assert_eq!((p.page_bytes, p.group_size, p.groups.len(), p.hybrid), (16 * 16, 2, 6, true));
        // 10 MiB: ⌊10 MiB / 256 / 2⌋ = 20,480 blocks; a 1,000-token request with 256 batched
        // tokens: ⌈1000/16⌉ = 63 full blocks + 5 · (⌈(31 + 256)/16⌉ + 1) = 5 · 19 = 95.
        let n = p.num_blocks(10 << 20);
        assert_eq!(n, 20_480);
        assert_eq!(p.blocks_per_request(1000, 256), 63 + 95);
        assert_eq!(p.cache_tokens(n), 20_480 / 6 * 16);
    }

    #[test]
    fn a_delta_net_layer_holds_its_state_and_no_keys() {
        // The tiny Qwen3-Next of the fixture: a gated DeltaNet layer (cd 128 × Kc 4 = 512 conv
        // values in bf16, Hv·dk·dv = 4·16·16 = 1,024 recurrent values in fp32) and a full layer
        // of 2 heads × 16. Two sequences of one token: 2·(512·2 + 1,024·4) = 10,240 B of
        // state + 2·1·64·2 = 256 B of keys and values = 10,496 B, as measured
        // (qwen3_next/bfloat16/dynamic/b2/s1+0); after 30 + 2 tokens only the keys grow.
        let l = [
            KvLayer { attn: Attn::Linear, k: 0, v: 0, idx: 0, state: State { conv: 512, recurrent: 1024 } },
            KvLayer { attn: Attn::Full, k: 32, v: 32, idx: 0, state: State::NONE },
        ];
        let sf = StateFormat::transformers(BF16);
        assert_eq!(transformers_bytes(&l, BF16, sf, 2, 1, 0, Count::Logical), 10_496);
        assert_eq!(transformers_bytes(&l, BF16, sf, 2, 30, 2, Count::Storage), 10_240 + 2 * 32 * 64 * 2);
        assert_eq!(per_token_bytes(&l, BF16), 128);
        assert_eq!(state_bytes(&l, sf), 5_120);
    }

    #[test]
    fn vllm_pads_states_to_an_attention_page_and_gives_each_state_group_one_block() {
        // Three state layers of (96 + 1,024) bf16 values = 2,240 B, one full layer of
        // (4 + 4) · 2 = 16 B per token: block 16·⌈2,240 / (16·16)⌉ = 16 · 9 = 144 tokens, page
        // 144·16 = 2,304 B (each state padded by 64 B); the rarest type has 1 layer, so 4 groups:
        // three state groups and one full.
        let st = State { conv: 96, recurrent: 1024 };
        let mut l = vec![KvLayer { attn: Attn::Linear, k: 0, v: 0, idx: 0, state: st }; 3];
        l.push(layer(Attn::Full));
        let p = PagedLayout::new(&l, BF16, SF, 16).unwrap_or_else(|_| PagedLayout::new(&l[3..], BF16, SF, 16).expect("one layer"));
        assert_eq!((p.block_size, p.page_bytes, p.state_page_bytes, p.group_size), (144, 2_304, 2_240, 1));
        assert_eq!(p.groups, [Attn::Linear, Attn::Linear, Attn::Linear, Attn::Full]);
        // 1,000 tokens: 3 state blocks + ⌈1000/144⌉ = 7 full blocks; the states 3·2,304 B.
        assert_eq!(p.blocks_per_request(1000, 256), 10);
        assert_eq!(p.state_bytes_per_request(), 6_912);
        // A block size set above the need is kept.
        assert_eq!(hybrid_block_size(2_240, 32, 128, VLLM_HYBRID_BLOCK_ALIGN), 128);
    }

    #[test]
    fn a_uniform_model_is_one_group_of_every_layer() {
        let l = vec![layer(Attn::Full); 32];
        let p = PagedLayout::new(&l, BF16, SF, 16).unwrap_or_else(|_| PagedLayout::new(&l[..1], BF16, SF, 16).expect("one layer"));
        assert_eq!((p.group_size, p.groups.len()), (32, 1));
        assert_eq!(p.max_concurrency(1381, 2048, 8192), 1381.0 / 128.0);
        let mixed = [layer(Attn::Full), KvLayer { attn: Attn::Full, k: 8, v: 8, idx: 0, state: State::NONE }];
        assert!(PagedLayout::new(&mixed, BF16, SF, 16).is_err());
    }
}
