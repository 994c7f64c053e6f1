//! What each decoder layer keeps per token while serving: which attention it runs (full,
//! sliding window, chunked) and how many cache values per token one GPU holds for it.
//!
//! Per layer and token a GPU keeps `k` key values and `v` value values:
//! - ordinary attention (MHA, GQA, MQA): `k = v = k_gpu · d` with `k_gpu` the key/value heads on
//!   the GPU — `k / tp` under tensor parallelism, or 1 when `tp > k` (vLLM replicates the heads:
//!   `QKVParallelLinear`'s `num_kv_head_replicas`);
//! - multi-head latent attention (DeepSeek-V2/V3, Kimi K2): one latent of `r_kv`
//!   (`kv_lora_rank`) and one rotary key of `d_r` (`qk_rope_head_dim`) per token, whatever the
//!   head count and not split by tensor parallelism (every TP rank keeps the whole latent):
//!   transformers 5.24 caches `(k_nope, k_pe)` before `kv_b_proj` expands them
//!   (modeling_deepseek_v3.py `DeepseekV3Attention.forward`: "Cache read / write is performed
//!   while latent KV is still compressed"), vLLM's `MLAAttentionSpec` and SGLang's
//!   `MLATokenToKVPool` store `kv_lora_rank + qk_rope_head_dim` per token.
//!
//! NoPE layers (Llama 4, SmolLM3) cache exactly what RoPE layers cache; attention sinks
//! (gpt-oss's per-head logit) are parameters, not cache entries.

use super::super::model::{ModelSpec, WindowKind};
use serde::Serialize;

/// The attention a layer runs, as far as its cache is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "tokens")]
pub enum Attn {
    /// Every earlier token.
    Full,
    /// The `w` tokens before each query (`sliding_window`).
    Sliding(u64),
    /// Chunks of `c` tokens (Llama 4's `attention_chunk_size`).
    Chunked(u64),
}

/// One layer's cache on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct KvLayer {
    pub attn: Attn,
    /// Key (or latent) values per token.
    pub k: u64,
    /// Value (or MLA rotary-key) values per token.
    pub v: u64,
}

/// Why a model's cache cannot be laid out on this many GPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("`tp` {tp} does not divide the {kv} key/value heads (vLLM needs kv_heads % tp == 0 or tp % kv_heads == 0)")]
    HeadsSplit { tp: u64, kv: u64 },
}

/// Key/value heads one GPU keeps under `tp`-way tensor parallelism (vLLM
/// `QKVParallelLinear`: `max(1, k / tp)`, replicated when `tp ≥ k`).
pub fn kv_heads_per_gpu(kv_heads: u64, tp: u64) -> Result<u64, LayoutError> {
    let tp = tp.max(1);
    if kv_heads >= tp {
        if kv_heads % tp != 0 {
            return Err(LayoutError::HeadsSplit { tp, kv: kv_heads });
        }
        Ok(kv_heads / tp)
    } else if tp % kv_heads != 0 {
        Err(LayoutError::HeadsSplit { tp, kv: kv_heads })
    } else {
        Ok(1)
    }
}

/// The attention of layer `i`.
pub fn attn_of(spec: &ModelSpec, i: u64) -> Attn {
    if spec.window > 0 && spec.window_layers.contains(i) {
        match spec.window_kind {
            WindowKind::Sliding => Attn::Sliding(spec.window),
            WindowKind::Chunked => Attn::Chunked(spec.window),
        }
    } else {
        Attn::Full
    }
}

/// The cache of every layer of `spec` on one GPU of a `tp`-way attention group.
pub fn kv_layers(spec: &ModelSpec, tp: u64) -> Result<Vec<KvLayer>, LayoutError> {
    let (k, v) = if spec.is_mla() {
        (spec.kv_lora_rank, spec.qk_rope_dim)
    } else {
        let heads = kv_heads_per_gpu(spec.kv_heads, tp)?;
        (heads * spec.head_dim, heads * spec.head_dim)
    };
    Ok((0..spec.layers).map(|i| KvLayer { attn: attn_of(spec, i), k, v }).collect())
}

/// Falcon's `new_decoder_architecture` (Falcon-40B/180B), as the spec shows it: parallel blocks
/// with two norms or more than one KV head (the predicate of step/families/falcon.rs `new_arch`).
fn falcon_new_decoder(spec: &ModelSpec) -> bool {
    spec.family == super::super::family::Family::Falcon && spec.parallel && (spec.layer_norms == 2 || spec.kv_heads != 1)
}

/// The cache of every layer as transformers 5.24 holds it: [`kv_layers`] on one GPU, except that
/// Falcon's new decoder broadcasts its KV heads to all `a` query heads before
/// `layer_past.update` (modeling_falcon.py `FalconAttention._split_heads` and `forward`:
/// `num_kv_heads = self.num_heads if self.new_decoder_architecture`), so it caches `a · d`.
pub fn transformers_layers(spec: &ModelSpec) -> Result<Vec<KvLayer>, LayoutError> {
    if falcon_new_decoder(spec) {
        let w = spec.heads * spec.head_dim;
        return Ok((0..spec.layers).map(|i| KvLayer { attn: attn_of(spec, i), k: w, v: w }).collect());
    }
    kv_layers(spec, 1)
}

/// The same model with MLA's latent expanded to per-head keys and values (what an engine that
/// runs MLA as ordinary attention would cache: `a · (d_nope + d_r)` keys and `a · d_v` values per
/// token) — the comparison the charts draw.
pub fn without_mla(spec: &ModelSpec) -> ModelSpec {
    if !spec.is_mla() {
        return spec.clone();
    }
    let mut s = spec.clone();
    s.kv_lora_rank = 0;
    s.q_lora_rank = 0;
    s.kv_heads = spec.heads;
    s.head_dim = spec.head_dim;
    s
}

/// The same model with every layer attending to the whole prefix.
pub fn without_windows(spec: &ModelSpec) -> ModelSpec {
    let mut s = spec.clone();
    s.window_layers = super::super::model::LayerRule::None;
    s.window = 0;
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::presets::preset;

    fn spec(id: &str) -> ModelSpec {
        preset(id).map(|p| p.spec).unwrap_or_else(crate::estimator::presets::default_spec)
    }

    #[test]
    fn gqa_heads_split_by_tp_and_replicate_beyond_it() {
        assert_eq!(kv_heads_per_gpu(8, 2), Ok(4));
        assert_eq!(kv_heads_per_gpu(8, 16), Ok(1));
        assert!(kv_heads_per_gpu(8, 3).is_err());
        // Llama-3.1-8B: 8 heads of 128 per token and layer, 4 of them on each of 2 GPUs.
        let l = kv_layers(&spec("llama-3.1-8b"), 2).unwrap_or_default();
        assert_eq!((l.len(), l[0].k, l[0].v), (32, 512, 512));
    }

    #[test]
    fn mla_keeps_one_latent_and_one_rotary_key_whatever_the_tp() {
        // DeepSeek-V3: r_kv 512 + d_r 64 per token and layer, on every TP rank.
        let l = kv_layers(&spec("deepseek-v3"), 8).unwrap_or_default();
        assert_eq!((l[0].k, l[0].v, l.len()), (512, 64, 61));
        // Expanded: 128 heads of 192 keys and 128 values.
        let e = kv_layers(&without_mla(&spec("deepseek-v3")), 1).unwrap_or_default();
        assert_eq!((e[0].k, e[0].v), (128 * 192, 128 * 192));
    }

    #[test]
    fn windows_follow_the_layer_rule() {
        // Gemma 3: five sliding layers of 1,024 tokens, then a full one.
        let l = kv_layers(&spec("gemma-3-27b-it"), 1).unwrap_or_default();
        assert_eq!(l[0].attn, Attn::Sliding(1024));
        assert_eq!(l[5].attn, Attn::Full);
        // Llama 4 Scout: chunks of 8,192 on three layers of four.
        let s = kv_layers(&spec("llama-4-scout-17b-16e-instruct"), 1).unwrap_or_default();
        assert_eq!((s[0].attn, s[3].attn), (Attn::Chunked(8192), Attn::Full));
        assert!(kv_layers(&without_windows(&spec("gemma-3-27b-it")), 1).unwrap_or_default().iter().all(|l| l.attn == Attn::Full));
    }
}
