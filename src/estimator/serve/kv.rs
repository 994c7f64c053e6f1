//! The KV cache, byte by byte, in each engine's layout.
//!
//! - [`per_token_bytes`]: one token of every layer at full attention, per GPU.
//! - [`transformers_bytes`]: what transformers 5.24's `DynamicCache` (or
//!   `QuantizedCache(backend="fp8")`) holds after a prefill and some decode steps, as
//!   `generate()` builds it (`DynamicCache(config=model.config)`, cache_utils.py).
//! - [`PagedLayout`]: vLLM's blocks (`vllm/v1/core/kv_cache_utils.py`, `vllm/v1/kv_cache_interface.py`).

use super::dtype::Format;
use super::layers::{Attn, KvLayer};
use serde::Serialize;

/// `DynamicSlidingWindowLayer._sliding_window_tensor`: the window as a 0-dim int64 tensor, moved
/// to the cache's device (cache_utils.py, transformers 5.24).
pub const SLIDING_WINDOW_TENSOR_BYTES: u64 = 8;

/// Bytes of one token's keys and values in every layer of `layers`, ignoring windows:
/// `Σ_layers (bytes(k) + bytes(v))`. The per-tensor scales of a quantized cache are not per token
/// and are left out.
pub fn per_token_bytes(layers: &[KvLayer], fmt: Format) -> u64 {
    layers.iter().map(|l| fmt.bytes(l.k) + fmt.bytes(l.v)).sum()
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
/// `DynamicCache`: a full layer holds `b · t · (k + v)` values (`DynamicLayer`, one `torch.cat`
/// per step); a sliding or chunked layer `b · window_tokens · (k + v)` values plus its 8-byte
/// window tensor. `QuantizedCache(backend="fp8")` (`fp8` = true; full-attention models only):
/// per layer `b · t · (k + v)` FP8 bytes plus one FP32 scale for K and one for V
/// (`Fp8QuantizedLayer`, frozen after the first update), its 16-bit `keys`/`values` left empty.
pub fn transformers_bytes(layers: &[KvLayer], fmt: Format, batch: u64, prefill: u64, decode: u64, count: Count) -> u64 {
    let t = prefill + decode;
    layers
        .iter()
        .map(|l| {
            let (tokens, extra) = match l.attn {
                Attn::Full => (t, 0),
                Attn::Sliding(w) | Attn::Chunked(w) => (window_tokens(w, prefill, decode, count), SLIDING_WINDOW_TENSOR_BYTES),
            };
            fmt.bytes(batch * tokens * l.k) + fmt.bytes(batch * tokens * l.v) + 2 * fmt.tensor_scale_bytes + extra
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

/// vLLM's KV cache groups: layers of one attention type share a block table; groups of equal
/// size share memory pools (`_get_kv_cache_config_uniform_page_size`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PagedLayout {
    /// Tokens per block.
    pub block_size: u64,
    /// Bytes of one block of one layer: `block_size · (bytes(k) + bytes(v))` (`page_size_bytes`).
    pub page_bytes: u64,
    /// Layers per group: all of them for a uniform model, else the fewest layers of any type.
    pub group_size: u64,
    /// Each group's attention (a type with `n` layers makes `⌈n / group_size⌉` groups, the last
    /// padded).
    pub groups: Vec<Attn>,
    /// Whether the model mixes attention types (vLLM's hybrid allocator).
    pub hybrid: bool,
}

impl PagedLayout {
    /// The layout of `layers` in blocks of `block_size` tokens.
    pub fn new(layers: &[KvLayer], fmt: Format, block_size: u64) -> Result<PagedLayout, PagedError> {
        let first = layers.first().ok_or(PagedError::Empty)?;
        let page = |l: &KvLayer| fmt.bytes(block_size * l.k) + fmt.bytes(block_size * l.v);
        let page_bytes = page(first);
        if let Some(other) = layers.iter().map(page).find(|&p| p != page_bytes) {
            return Err(PagedError::MixedPages(page_bytes, other));
        }
        // Layer counts per attention type, in order of first appearance.
        let mut types: Vec<(Attn, u64)> = Vec::new();
        for l in layers {
            match types.iter_mut().find(|(a, _)| *a == l.attn) {
                Some((_, n)) => *n += 1,
                None => types.push((l.attn, 1)),
            }
        }
        let hybrid = types.len() > 1;
        let group_size = types.iter().map(|(_, n)| *n).min().unwrap_or(1).max(1);
        let groups = types.iter().flat_map(|&(a, n)| std::iter::repeat_n(a, n.div_ceil(group_size) as usize)).collect();
        Ok(PagedLayout { block_size, page_bytes, group_size, groups, hybrid })
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
    /// `⌈min(w − 1 + batched, len) / B⌉ + 1`; chunked `⌈min(c + batched, len) / B⌉`.
    pub fn group_blocks(&self, attn: Attn, len: u64, batched: u64) -> u64 {
        let b = self.block_size.max(1);
        match attn {
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
        KvLayer { attn, k: 4, v: 4 }
    }

    #[test]
    fn a_full_layer_holds_every_token_and_a_window_its_last_w_minus_1() {
        let l = [layer(Attn::Full), layer(Attn::Sliding(8))];
        // 2 sequences of 10 tokens: full 2·10·8·2 = 320 B; window 7 tokens: 2·7·8·2 = 224 B + 8.
        assert_eq!(transformers_bytes(&l, BF16, 2, 10, 0, Count::Logical), 320 + 224 + 8);
        // The prefill's concatenation stays alive behind the view: 10 tokens, then 8 after a step.
        assert_eq!(transformers_bytes(&l, BF16, 2, 10, 0, Count::Storage), 320 + 320 + 8);
        assert_eq!(window_tokens(8, 10, 1, Count::Storage), 8);
        assert_eq!(window_tokens(8, 3, 2, Count::Storage), 5);
        assert_eq!(per_token_bytes(&l, FP16), 32);
    }

    #[test]
    fn vllm_groups_a_hybrid_model_by_its_rarest_layer_type() {
        // 5 sliding : 1 full over 12 layers: groups of 2 layers, 1 full group + 5 sliding groups.
        let l: Vec<_> = (0..12).map(|i| layer(if i % 6 == 5 { Attn::Full } else { Attn::Sliding(32) })).collect();
        let p = PagedLayout::new(&l, BF16, 16).unwrap_or_else(|_| PagedLayout::new(&l[..1], BF16, 16).expect("one layer"));
        assert_eq!((p.page_bytes, p.group_size, p.groups.len(), p.hybrid), (16 * 16, 2, 6, true));
        // 10 MiB: ⌊10 MiB / 256 / 2⌋ = 20,480 blocks; a 1,000-token request with 256 batched
        // tokens: ⌈1000/16⌉ = 63 full blocks + 5 · (⌈(31 + 256)/16⌉ + 1) = 5 · 19 = 95.
        let n = p.num_blocks(10 << 20);
        assert_eq!(n, 20_480);
        assert_eq!(p.blocks_per_request(1000, 256), 63 + 95);
        assert_eq!(p.cache_tokens(n), 20_480 / 6 * 16);
    }

    #[test]
    fn a_uniform_model_is_one_group_of_every_layer() {
        let l = vec![layer(Attn::Full); 32];
        let p = PagedLayout::new(&l, BF16, 16).unwrap_or_else(|_| PagedLayout::new(&l[..1], BF16, 16).expect("one layer"));
        assert_eq!((p.group_size, p.groups.len()), (32, 1));
        assert_eq!(p.max_concurrency(1381, 2048, 8192), 1381.0 / 128.0);
        let mixed = [layer(Attn::Full), KvLayer { attn: Attn::Full, k: 8, v: 8 }];
        assert!(PagedLayout::new(&mixed, BF16, 16).is_err());
    }
}
