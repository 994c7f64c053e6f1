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
//!
//! Hybrid layers keep a state of fixed size per sequence, whatever the context ([`State`]):
//! - gated DeltaNet (Qwen3-Next, Qwen3.5: the layers of `linear_layers`) instead of attention:
//!   a conv state over `cd = 2·Hk·dk + Hv·dv` channels and a recurrent state `Hv·dk·dv`
//!   ([`gdn_state`]); the layer is [`Attn::Linear`] and caches no key or value;
//! - Mamba-2 (Falcon-H1: every layer) beside attention: a conv state over
//!   `cd = H·P + 2·G·N` channels and an SSM state `H·P·N` ([`mamba2_state`]).
//!
//! transformers keeps `Kc` conv columns (`LinearAttentionLayer.lazy_initialization`: the
//! kernel size passed as `conv_kernel_size`), the engines `Kc − 1` (vLLM
//! `MambaStateShapeCalculator`, SGLang's `MambaPool`: the conv1d's left context only).

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
    /// No attention: a linear-attention layer (gated DeltaNet) that keeps only its [`State`]
    /// (transformers' `linear_attention` layer type, a `LinearAttentionLayer`). In a paged
    /// layout, also the type of the state groups (vLLM's `MambaSpec`).
    Linear,
}

/// A layer's fixed-size state, values per sequence on one GPU (0 and 0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct State {
    /// The short convolution's state: channels × kept columns.
    pub conv: u64,
    /// The recurrent (gated DeltaNet) or SSM (Mamba-2) state.
    pub recurrent: u64,
}

impl State {
    /// No state.
    pub const NONE: State = State { conv: 0, recurrent: 0 };
    /// Whether the layer keeps a state.
    pub fn is_some(&self) -> bool {
        self.conv + self.recurrent > 0
    }
}

/// Who holds the state, which decides its columns and dtypes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// transformers 5.24's `LinearAttentionLayer`: `Kc` conv columns.
    Transformers,
    /// vLLM and SGLang: `Kc − 1` conv columns.
    Engine,
}

impl Holder {
    /// Conv columns kept of a kernel of `kc`: transformers' `torch.zeros((*shape[:-1],
    /// conv_kernel_size))` (cache_utils.py `LinearAttentionLayer.lazy_initialization`) keeps
    /// `Kc`; vLLM's `MambaStateShapeCalculator.gated_delta_net_state_shape` /
    /// `mamba2_state_shape` keep `conv_kernel_size − 1`.
    pub fn conv_columns(self, kc: u64) -> u64 {
        match self {
            Holder::Transformers => kc,
            Holder::Engine => kc.saturating_sub(1),
        }
    }
}

/// One layer's cache on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct KvLayer {
    pub attn: Attn,
    /// Key (or latent) values per token.
    pub k: u64,
    /// Value (or MLA rotary-key) values per token.
    pub v: u64,
    /// DeepSeek-V3.2's indexer keys per token: one head of `d_i` (`index_head_dim`), cached by
    /// transformers' `DynamicIndexedLayer.update_indexer` (`indexer_keys` [b, t, d_i], the
    /// model's dtype) on every layer, not split by TP; 0 without an indexer. The engines keep
    /// them in a separate indexer cache (vLLM `DeepseekV32IndexerCache`: FP8 values plus a
    /// scale per 128); here they are counted like keys, in the KV cache's format (an
    /// approximation for the engines).
    pub idx: u64,
    /// The fixed-size state beside (Falcon-H1) or instead of (gated DeltaNet) the keys and
    /// values.
    pub state: State,
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
        if !kv_heads.is_multiple_of(tp) {
            return Err(LayoutError::HeadsSplit { tp, kv: kv_heads });
        }
        Ok(kv_heads / tp)
    } else if !tp.is_multiple_of(kv_heads) {
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

/// Whether layer `i` of `spec` is a gated DeltaNet layer (`layer_types` "linear_attention").
pub fn is_linear(spec: &ModelSpec, i: u64) -> bool {
    spec.gdn.k_heads > 0 && spec.linear_layers.contains(i)
}

/// The gated DeltaNet state of one sequence on one GPU of a `tp`-way group, `columns` conv
/// columns kept:
/// - conv `cd/tp · columns`, cd = 2·Hk·dk + Hv·dv (transformers: `conv_states[0]`
///   [b, cd, Kc], modeling_qwen3_next.py `Qwen3NextGatedDeltaNet.forward`:
///   `cache.update_conv_state(mixed_qkv, …, conv_kernel_size=self.conv_kernel_size)`);
/// - recurrent `Hv/tp · dk · dv` (`recurrent_states[0]` [b, Hv, dk, dv], the chunked delta
///   rule's `last_recurrent_state`; vLLM `gated_delta_net_state_shape`'s temporal state
///   `(num_v_heads / tp, head_k_dim, head_v_dim)`).
pub fn gdn_state(spec: &ModelSpec, tp: u64, columns: u64) -> State {
    let g = &spec.gdn;
    let tp = tp.max(1);
    State { conv: g.conv_dim().div_ceil(tp) * columns, recurrent: g.v_heads.div_ceil(tp) * g.k_dim * g.v_dim }
}

/// The Mamba-2 state of one sequence on one GPU of a `tp`-way group, `columns` conv columns
/// kept:
/// - conv `cd/tp · columns`, cd = H·P + 2·G·N (modeling_falcon_h1.py `FalconH1Mixer`:
///   `conv_dim = intermediate_size + 2·n_groups·ssm_state_size`; vLLM `mamba2_state_shape`
///   replicates the groups to `tp` when `G % tp ≠ 0`, `extra_groups_for_head_shards`);
/// - SSM `H/tp · P · N` (`mamba2_chunk_scan`'s final state [b, H, P, N]).
pub fn mamba2_state(spec: &ModelSpec, tp: u64, columns: u64) -> State {
    let m = &spec.ssm;
    let tp = tp.max(1);
    let groups = if tp > 1 && !m.groups.is_multiple_of(tp) { tp } else { m.groups };
    let cd = m.heads * m.head_dim + 2 * groups * m.state;
    State { conv: cd.div_ceil(tp) * columns, recurrent: m.heads.div_ceil(tp) * m.head_dim * m.state }
}

/// The cache of every layer of `spec` on one GPU of a `tp`-way attention group, states as
/// `holder` keeps them.
pub fn layers_for(spec: &ModelSpec, tp: u64, holder: Holder) -> Result<Vec<KvLayer>, LayoutError> {
    let (k, v) = if spec.is_mla() {
        (spec.kv_lora_rank, spec.qk_rope_dim)
    } else {
        let heads = kv_heads_per_gpu(spec.kv_heads, tp)?;
        (heads * spec.head_dim, heads * spec.head_dim)
    };
    let idx = if spec.is_mla() { spec.dsa.head_dim * u64::from(spec.dsa.heads > 0) } else { 0 };
    Ok((0..spec.layers)
        .map(|i| {
            if is_linear(spec, i) {
                KvLayer { attn: Attn::Linear, k: 0, v: 0, idx: 0, state: gdn_state(spec, tp, holder.conv_columns(spec.gdn.conv)) }
            } else if spec.ssm.heads > 0 && spec.linear_attention_layers() > 0 {
                // Granite 4.0-H: a layer is a Mamba-2 mixer or attention, never both (with
                // `linear_layers` the mixer replaces attention there, as `ModelSpec::ssm_layers`
                // reads the spec; without, Falcon-H1 runs it beside attention in every layer).
                if spec.linear_layers.contains(i) {
                    KvLayer { attn: Attn::Linear, k: 0, v: 0, idx: 0, state: mamba2_state(spec, tp, holder.conv_columns(spec.ssm.conv)) }
                } else {
                    KvLayer { attn: attn_of(spec, i), k, v, idx, state: State::NONE }
                }
            } else if spec.ssm.heads > 0 {
                KvLayer { attn: attn_of(spec, i), k, v, idx, state: mamba2_state(spec, tp, holder.conv_columns(spec.ssm.conv)) }
            } else {
                KvLayer { attn: attn_of(spec, i), k, v, idx, state: State::NONE }
            }
        })
        .collect())
}

/// The cache of every layer of `spec` on one GPU of a `tp`-way attention group, as the
/// serving engines keep it.
pub fn kv_layers(spec: &ModelSpec, tp: u64) -> Result<Vec<KvLayer>, LayoutError> {
    layers_for(spec, tp, Holder::Engine)
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
        return Ok((0..spec.layers).map(|i| KvLayer { attn: attn_of(spec, i), k: w, v: w, idx: 0, state: State::NONE }).collect());
    }
    layers_for(spec, 1, Holder::Transformers)
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

/// The same model with full attention in every layer and no state: gated DeltaNet layers
/// become the model's (gated) full attention, Mamba-2 mixers are dropped (Falcon-H1's
/// attention alone) — the comparison the charts draw for hybrids.
pub fn without_states(spec: &ModelSpec) -> ModelSpec {
    let mut s = spec.clone();
    s.linear_layers = super::super::model::LayerRule::None;
    s.gdn = super::super::model::Gdn::NONE;
    s.ssm = super::super::model::Ssm::NONE;
    s
}

/// Whether any layer of `spec` keeps a fixed-size state (gated DeltaNet or Mamba-2).
pub fn has_states(spec: &ModelSpec) -> bool {
    spec.ssm.heads > 0 || (spec.gdn.k_heads > 0 && spec.linear_layers.count(spec.layers) > 0)
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
    fn qwen3_next_caches_twelve_attention_layers_and_keeps_36_delta_net_states() {
        // Qwen3-Next-80B-A3B: 48 layers, every 4th full attention (12), 2 KV heads × 256.
        let s = spec("qwen3-next-80b-a3b-thinking");
        let l = kv_layers(&s, 1).unwrap_or_default();
        assert_eq!(l.len(), 48);
        assert_eq!(l.iter().filter(|l| l.attn == Attn::Full).count(), 12);
        assert_eq!((l[3].attn, l[3].k, l[3].v, l[3].state), (Attn::Full, 512, 512, State::NONE));
        // Gated DeltaNet: Hk 16, Hv 32, dk = dv = 128, Kc 4; cd = 2·16·128 + 32·128 = 8,192.
        // Engines keep Kc − 1 = 3 conv columns: 24,576; recurrent 32·128·128 = 524,288.
        assert_eq!((l[0].attn, l[0].k, l[0].state), (Attn::Linear, 0, State { conv: 24_576, recurrent: 524_288 }));
        // transformers keeps Kc = 4 columns: 32,768.
        let t = transformers_layers(&s).unwrap_or_default();
        assert_eq!(t[0].state, State { conv: 32_768, recurrent: 524_288 });
        // TP 4: heads and channels split, the 2 KV heads replicated (1 per GPU).
        let q = kv_layers(&s, 4).unwrap_or_default();
        assert_eq!((q[0].state, q[3].k), (State { conv: 6_144, recurrent: 131_072 }, 256));
        assert!(has_states(&s) && !has_states(&without_states(&s)));
        assert!(kv_layers(&without_states(&s), 1).unwrap_or_default().iter().all(|l| l.attn == Attn::Full && !l.state.is_some()));
    }

    #[test]
    fn granite_4_0_h_keeps_a_mamba_state_or_attention_in_each_layer_never_both() {
        // Granite 4.0-H-Tiny: 40 layers, attention (4 KV heads × 128) on layers 5, 15, 25, 35,
        // Mamba-2 (H 48, P 64, N 128, G 1, Kc 4) on the other 36: cd = 48·64 + 2·128 = 3,328,
        // 4 columns 13,312 (transformers); SSM 48·64·128 = 393,216. Per token 4 layers × 512
        // keys and 512 values.
        let s = spec("granite-4.0-h-tiny");
        let l = transformers_layers(&s).unwrap_or_default();
        assert_eq!(l.len(), 40);
        assert_eq!((l[5].attn, l[5].k, l[5].v, l[5].state), (Attn::Full, 512, 512, State::NONE));
        assert_eq!((l[0].attn, l[0].k, l[0].state), (Attn::Linear, 0, State { conv: 13_312, recurrent: 393_216 }));
        assert_eq!(l.iter().filter(|l| l.attn == Attn::Linear).count(), 36);
    }

    #[test]
    fn falcon_h1_keeps_attention_and_a_mamba_state_in_every_layer() {
        // Falcon-H1-0.5B: 36 layers, 2 KV heads × 64; Mamba-2 H 24, P 64, N 128, G 1, Kc 4.
        // cd = 24·64 + 2·1·128 = 1,792: 3 columns 5,376 (engines), 4 columns 7,168
        // (transformers); SSM 24·64·128 = 196,608.
        let s = spec("falcon-h1-0.5b-instruct");
        let l = kv_layers(&s, 1).unwrap_or_default();
        assert!(l.iter().all(|l| l.attn == Attn::Full && l.k == 128 && l.state == State { conv: 5_376, recurrent: 196_608 }));
        assert_eq!(transformers_layers(&s).unwrap_or_default()[0].state.conv, 7_168);
        // TP 2: the one group is replicated to 2 (`extra_groups_for_head_shards`):
        // cd = (1,536 + 2·2·128) / 2 = 1,024 → 3,072; SSM 12·64·128 = 98,304.
        assert_eq!(kv_layers(&s, 2).unwrap_or_default()[0].state, State { conv: 3_072, recurrent: 98_304 });
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
