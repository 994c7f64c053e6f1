//! `framework = torchtitan`: torchtitan 0.2.2's own Llama 3 (its Qwen3, dense or MoE: [`Qwen3`]; its DeepSeek-V3: [`DeepseekV3`]; its Llama 4: [`Llama4`])
//! (`torchtitan/models/llama3/model/model.py`), its loss (`torchtitan/components/loss.py`,
//! `train.py` `forward_backward_step`) and its full activation checkpointing
//! (`torchtitan/distributed/activation_checkpoint.py` `_apply_full_ac`: each `TransformerBlock`
//! in `checkpoint_wrapper`, non-reentrant, which the step's checkpoint regions already are).
//!
//! Where it differs from transformers' `modeling_llama.py` (the [`super::modeling::Llama`]
//! defaults), each measured in `tests/fixtures/pytorch/frameworks/torchtitan-llama3.json`:
//! - the norms are `torch.nn.RMSNorm` ([`Rms::Torch`]): the weight multiplies the fp32
//!   normalized input, which is what the weight's gradient keeps (transformers keeps its cast);
//! - RoPE multiplies complex views by the model's `freqs_cis` buffer (`apply_rotary_emb`):
//!   the code of transformers' Llama 4, [`llama4::rope`], which keeps nothing but the buffer;
//! - no position ids, no mask, no rotary tables computed per forward: `freqs_cis` is a model
//!   buffer (`[max_seq_len, d/2]` complex64, `max_seq_len` = the training `seq_len`);
//! - the model's forward keeps no local (`h` is rebound by every layer);
//! - the loss takes the logits as they are (the dataloader shifted the labels) and sums:
//!   `cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum")`, then
//!   `/ global_valid_tokens`.
//!
//! Its Qwen3 (`torchtitan/models/qwen3/model/model.py`, dense; `torchtitan-qwen3.json`) is this
//! Llama 3 with, against transformers' `modeling_qwen3.py`:
//! - `q_norm` / `k_norm` as `nn.RMSNorm(head_dim)` ([`Rms::Torch`]) on the `[b, s, heads, d]`
//!   views, and RoPE on them before the transpose: SDPA's dq and dk come back contiguous, so
//!   the projections' views copy no gradient (transformers rotates the transposed q and k);
//! - RoPE written as transformers writes it (`rotate_half`) but against the model's
//!   `rope_cache` buffer (`[max_seq_len, 2 × head_dim]` fp32, cos then sin): cos and sin are
//!   slices of it, cast to q's dtype in each layer (copies the products keep, unless fp32).
//!
//! Its Qwen3 MoE (`moe_enabled`; `torchtitan-qwen3_moe.json`) is that Qwen3 with torchtitan's
//! `MoE` (`models/moe/moe.py`, [`moe`]) as every layer's feed-forward: its own router, token
//! reordering and padded grouped GEMMs, none of which keeps what transformers' Qwen3-MoE keeps.
//!
//! Its DeepSeek-V3 (`models/deepseek_v3/model/model.py`, in the 16B flavor's shape;
//! `torchtitan-deepseek_v3.json`, [`DeepseekV3`]) is MLA as torchtitan writes it
//! ([`mla_attention`]), dense first blocks, then that `MoE` with the flavor's router (no
//! `route_norm`) and shared experts.
//!
//! The attention's core (`ScaledDotProductAttentionWrapper`: SDPA with `is_causal=True`,
//! `enable_gqa`), `transpose(1, 2).contiguous()`, the projections and `FeedForward`
//! (`w2(F.silu(w1(x)) * w3(x))`) save what transformers' Llama saves: they reuse its builders.

use super::super::blocks::shapes::{heads, heads_bshd, tok_tp};
use super::super::blocks::Keep;
use super::super::ir::{Builder, DType, Dim, Dt, Origin, Out, Shape, Split, Tid, B, S, X};
use super::common::rms_norm;
use super::common::{head_proj, out_proj, proj_or, token_embedding, AttnW, Kind, MlpW, Norm, Params, Rms, Shared, LLAMA_MLP};
use super::common::{pairs, tokens};
use super::llama::{decoder_layer, in_group, mlp, rope as rope_half, sdpa_core, Ffn};
use super::llama4;
use super::modeling::Modeling;
use crate::estimator::config::{Attention, Config, Framework};
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::ledger::Bytes;
use crate::estimator::model::{Linear, ModelSpec};
use crate::estimator::part::Part;

/// Bytes of one complex64 element (`freqs_cis`): two fp32.
const COMPLEX64_BYTES: u128 = 8;

/// Bytes of one fp32 element (Qwen3's `rope_cache`, the MoE's load-balancing buffers).
const F32_BYTES: u128 = 4;

/// The fp32 `[E]` buffers of each torchtitan `MoE`: `expert_bias` and `tokens_per_expert`.
const MOE_BUFFERS: u128 = 2;

/// `nn.RMSNorm`, in the blocks (`attention_norm`, `ffn_norm`) and after them (`norm`).
const NORM: Norm = Norm::Rms(Rms::Torch);

/// torchtitan's `freqs_cis` buffer `[1, s, d/2]` complex64 (its bytes: fp32 `[s, d]`), as the
/// layers read it.
fn freqs_shape() -> Shape {
    Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::D)], Split::None)
}

/// `Attention.forward` with `attn_type = "sdpa"`:
/// ```python
/// xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
/// xq = xq.view(bs, seqlen, -1, self.head_dim)          # xk, xv alike
/// xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)
/// xq = xq.transpose(1, 2)                               # xk, xv alike
/// output = self.inner_attention(xq, xk, xv, enable_gqa=self.enable_gqa).transpose(1, 2).contiguous()
/// return self.wo(output.view(bs, seqlen, -1))
/// ```
fn attention(b: &mut Builder, w: &AttnW, x: Tid, sh: &Shared) -> (Tid, Option<Tid>) {
    let proj = |b: &mut Builder, w: Option<Tid>, h: Q, module: &'static str, lin: Linear| {
        let y = head_proj(b, x, w, None, h, module, lin);
        b.module = "attention";
        (y, b.view(y, heads_bshd(h), "ViewBackward0", false))
    };
    let (qy, q) = proj(b, w.wq, Q::A, "attention.wq", Linear::Q);
    let (ky, k) = proj(b, w.wk, Q::KV, "attention.wk", Linear::K);
    let (vy, v) = proj(b, w.wv, Q::KV, "attention.wv", Linear::V);
    b.part = Part::AttentionCore;
    b.module = "attention";
    let (q, k) = match sh.cos {
        // SDPA's dq and dk come back laid out like q and k: no copy for `view_as_real`.
        Some(f) => llama4::rope(b, q, k, f, true, true),
        None => (q, k),
    };
    let qt = b.view(q, heads(Q::A), "TransposeBackward0", false);
    let kt = b.view(k, heads(Q::KV), "TransposeBackward0", false);
    let vt = b.view(v, heads(Q::KV), "TransposeBackward0", false);
    b.module = "attention.inner_attention";
    let o = sdpa_core(b, qt, kt, vt);
    let out = tp_out_proj(b, w, o);
    // The forward's locals (xq, xk, xv, output) go at its return.
    for t in [qy, ky, vy, q, k] {
        b.hold(t);
    }
    (out, None)
}

/// `wo` on the attention's output: [`out_proj`], and under tensor parallelism with sequence
/// parallelism (`RowwiseParallel(output_layouts=Shard(1))`) its `[b, s, h]` partial sums
/// reduce-scattered to `[b, s/tp, h]` ([`sp_reduce_scatter`]).
fn tp_out_proj(b: &mut Builder, w: &AttnW, o: Tid) -> Tid {
    if !sp_tp(b) {
        return out_proj(b, o, w.wo, w.bo, "attention.wo");
    }
    b.part = Part::AttentionInputs;
    b.module = "attention.wo";
    let y = proj_or(b, o, w.wo, w.bo, gathered(), Linear::O);
    sp_reduce_scatter(b, y)
}

/// `TransformerBlock.forward`:
/// ```python
/// h = x + self.attention(self.attention_norm(x), freqs_cis, attention_masks, positions)
/// out = h + self.feed_forward(self.ffn_norm(h))
/// ```
/// transformers' pre-norm layer with `nn.RMSNorm` ([`decoder_layer`]); dense layers only.
///
/// Under tensor parallelism with sequence parallelism each norm's sequence-sharded output is
/// all-gathered before the attention and the feed-forward ([`sp_all_gather`]).
fn layer(b: &mut Builder, p: &Params, x: Tid, sh: &Shared) -> Tid {
    let aw = AttnW::new(b, p);
    let mw = MlpW::new(b, p);
    decoder_layer(
        b,
        p,
        x,
        NORM,
        |b, n| {
            let n = sp_all_gather(b, n);
            attention(b, &aw, n, sh)
        },
        |b, n| {
            let n = sp_all_gather(b, n);
            tp_mlp(b, &mw, n)
        },
    )
}

/// Tensor and sequence parallelism are both on: torchtitan's `apply_tp` plan applies (Llama 3;
/// its Qwen3's `apply_non_moe_tp`, models/qwen3/infra/parallelize.py 0.2.2, is the same plan on
/// the dense layers: measured, `torchtitan-qwen3-tp.json`).
fn sp_tp(b: &Builder) -> bool {
    b.c.cfg.sp && b.c.cfg.tp > 1
}

/// `[b, s, h]` over the whole sequence, on every rank.
fn gathered() -> Shape {
    Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::H)], Split::None)
}

/// `FeedForward.forward` (`w2(F.silu(w1(x)) * w3(x))`): [`mlp`], and under tensor parallelism
/// with sequence parallelism `w2` (RowwiseParallel, `output_layouts=Shard(1)`) returns its
/// partial sums over the whole sequence, `[b, s, h]`, reduce-scattered to `[b, s/tp, h]`
/// ([`sp_reduce_scatter`]).
fn tp_mlp(b: &mut Builder, w: &MlpW, x: Tid) -> Tid {
    if !sp_tp(b) {
        return mlp(b, w, x);
    }
    b.part = Part::Mlp;
    let MlpW { wg, wu, wd } = *w;
    let [gate, act, up, mul, down] = LLAMA_MLP.modules;
    b.module = gate;
    let g = proj_or(b, x, wg, None, tok_tp(LLAMA_MLP.width), Linear::Gate);
    b.module = act;
    let (op, node, back) = LLAMA_MLP.act;
    let a = b.unary(op, node, g, Keep::Input, back);
    b.module = up;
    let u = proj_or(b, x, wu, None, tok_tp(LLAMA_MLP.width), Linear::Up);
    b.module = mul;
    let m = b.mul(a, u);
    b.module = down;
    let y = proj_or(b, m, wd, None, gathered(), Linear::Down);
    sp_reduce_scatter(b, y)
}

/// The row-parallel `wo` and `w2` under torchtitan's plan (`RowwiseParallel(output_layouts=
/// Shard(1))`, models/llama3/infra/parallelize.py 0.2.2): the local mm gives `[b, s, h]` partial
/// sums (a `Partial` DTensor), which torch 2.15's `redistribute` (`Partial → Shard(1)`)
/// reduce-scatters (`_c10d_functional.reduce_scatter_tensor`) into a new `[b, s/tp, h]` tensor;
/// the mm's output goes after it. The backward all-gathers the `[b, s/tp, h]` gradient into a
/// `[b, s, h]` one (`Shard(1) → Replicate`) for the mm's backward. torchtitan's op-level
/// selective checkpointing saves the reduce-scatter's output (`_op_sac_save_list`; measured:
/// two `[b, s/tp, h]` per block, `torchtitan-llama3-tp.json`).
fn sp_reduce_scatter(b: &mut Builder, y: Tid) -> Tid {
    let (bytes, dtype, dt) = (b.bytes(y), b.t(y).dtype, b.t(y).dt);
    let out = b.out(Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::H)], Split::Sp), dt, true);
    b.op(
        "reduce_scatter_tensor",
        "ReduceScatterBackward",
        &[y],
        &[out],
        &[],
        &[B::Alloc { bytes, dtype, op: "all_gather" }, B::Grad { input: 0, temp: 0 }],
    )[0]
}

/// torchtitan's `apply_tp` (models/llama3/infra/parallelize.py, 0.2.2) puts
/// `PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())` on
/// `attention` and `feed_forward`: the norm's `[b, s/tp, h]` output is all-gathered to
/// `[b, s, h]` (torch 2.15 DTensor `redistribute`, `Shard(1) → Replicate`), and the
/// column-parallel `wq`/`wk`/`wv` (`w1`/`w3`) save that gathered tensor (one storage for the
/// three: measured, `torchtitan-llama3-tp.json`, `MmBackward0 _saved_self [b·s, h]`) — unlike
/// Megatron's sequence-parallel linears, which save the shard and gather again in backward.
/// In backward the gradient (a `Partial` sum) is reduce-scattered back to `[b, s/tp, h]`.
/// Without `sp` (or `tp = 1`) the input passes as it is.
fn sp_all_gather(b: &mut Builder, n: Tid) -> Tid {
    if !sp_tp(b) {
        return n;
    }
    b.sequence_all_gather(n)
}

/// `h = self.tok_embeddings(tokens)`. Under torchtitan's sequence-parallel plan
/// (`RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))` on the embedding,
/// models/llama3/infra/parallelize.py 0.2.2) each rank looks its `V/tp` rows up into a whole
/// `[b, s, h]` partial sum, which [`sp_reduce_scatter`] scatters over the sequence. In
/// backward the `[b, s/tp, h]` gradient is all-gathered, and torch 2.15's DTensor has no
/// row-sharded strategy for `embedding_dense_backward` (`_ops/_embedding_ops.py`: all
/// replicated, column-sharded or batch-sharded into a `Partial`): the weight's gradient is the
/// whole `[V, h]` table on every rank, `tp` times the shard's, and AccumulateGrad keeps it so
/// until `zero_grad` (each optimizer op then redistributes it to the shard; measured: 256,000 B
/// for a `[500, 64]` fp32 shard, `torchtitan-llama3-tp.json`'s step logs, eager and compiled).
fn tok_embeddings(b: &mut Builder, p: &Params, ids: Tid) -> Tid {
    let w = if sp_tp(b) { p.w(b, "embed_tokens.weight") } else { None };
    let Some(w) = w else {
        return token_embedding(b, p, ids, "tok_embeddings").0;
    };
    b.part = crate::estimator::part::Part::Embedding;
    b.module = "tok_embeddings";
    let whole = b.grad_bytes(w) * b.c.cfg.tp as u128;
    let partial = super::common::lookup_with_grad(b, ids, w, gathered(), whole);
    sp_reduce_scatter(b, partial)
}

/// What every torchtitan model this module follows shares (Llama 3's `Transformer.forward`,
/// its Qwen3's, DeepSeek-V3's and Llama 4's alike): `h = self.tok_embeddings(tokens)`, rebound
/// by every block (the embedding's output goes with the first block's saves), the blocks reading
/// one RoPE table the model registers as a buffer (model state, not an activation: no sin beside
/// it), `nn.RMSNorm`, and the framework's own code — SDPA with `is_causal=True` (no mask),
/// positions of its own ([`Modeling::framework_code`]). A model names its RoPE buffer's shape
/// and its block; [`Modeling`] follows for every [`TitanModel`].
trait TitanModel: Sync {
    /// The RoPE buffer as the blocks read it.
    fn rope_shape(&self) -> Shape;
    /// One `TransformerBlock.forward` on `x`.
    #[allow(clippy::too_many_arguments)] // Modeling::layer's signature less the attention kind
    fn block(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind) -> Tid;
}

impl<T: TitanModel> Modeling for T {
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        let x0 = tok_embeddings(b, p, ids);
        b.module = "";
        (x0, self.positions(b, spec, attn))
    }
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        let _ = attn;
        let cos = super::common::has_rope(spec).then(|| b.external(self.rope_shape(), Dt::F32, Origin::Buffer, false));
        Shared { cos, ..Shared::default() }
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        let _ = attn;
        self.block(b, p, spec, x, sh, kind)
    }
    fn norm(&self) -> Norm {
        NORM
    }
    fn x0_is_local(&self) -> bool {
        false
    }
    fn rope_tables(&self, spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
        super::common::has_rope(spec).then(|| (self.rope_shape(), Dt::F32, false))
    }
    fn framework_code(&self) -> bool {
        true
    }
}

/// torchtitan 0.2.2's Llama 3 (`Transformer`, see the module doc): its RoPE buffer `freqs_cis`
/// `[s, d/2]` complex64 ([`freqs_shape`]), its block [`layer`].
pub struct Llama3;
impl TitanModel for Llama3 {
    fn rope_shape(&self) -> Shape {
        freqs_shape()
    }
    fn block(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind) -> Tid {
        let _ = (spec, kind);
        layer(b, p, x, sh)
    }
}

/// torchtitan's Qwen3 `rope_cache` buffer as each half of it is read (`[s, d]` fp32: cos in the
/// first `head_dim` columns, sin in the last).
fn rope_cache_shape() -> Shape {
    Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::D)], Split::None)
}

/// Qwen3's `apply_rotary_emb(xq, xk, rope_cache)` (`models/qwen3/model/model.py`):
/// ```python
/// rope_cache = reshape_for_broadcast(rope_cache, xq)           # a view of the buffer's first s rows
/// cos = rope_cache[..., :head_dim].to(dtype=xq.dtype)          # a copy unless xq is fp32
/// sin = rope_cache[..., head_dim:].to(dtype=xq.dtype)
/// xq_out = (xq * cos) + (rotate_half(xq) * sin)                # xk_out alike
/// return xq_out.type_as(xq), xk_out.type_as(xk)
/// ```
/// transformers' `apply_rotary_pos_emb` ([`rope_half`]) on the `[b, s, heads, d]` views, with
/// cos and sin `[1, s, 1, d]` cut from the buffer: in fp32 they are the buffer's (model state),
/// else `_to_copy`s that the products keep.
fn qwen3_rope(b: &mut Builder, q: Tid, k: Tid, cache: Tid) -> (Tid, Tid) {
    let dt = b.t(q).dt;
    let cos = b.to_copy(cache, dt);
    // The second half: its own view of the buffer, so that the two casts are two values.
    let sin_half = b.view(cache, rope_cache_shape(), "", false);
    let sin = b.to_copy(sin_half, dt);
    let qe = rope_half(b, q, cos, sin, Q::A);
    let ke = rope_half(b, k, cos, sin, Q::KV);
    (qe, ke)
}

/// Qwen3's `Attention.forward` with `attn_type = "sdpa"`: [`attention`]'s, with
/// `q_norm` / `k_norm` (`nn.RMSNorm(head_dim)`) on the `[b, s, heads, d]` views before RoPE:
/// ```python
/// xq = xq.view(bs, seqlen, -1, self.head_dim)          # xk, xv alike
/// xq = self.q_norm(xq); xk = self.k_norm(xk)
/// xq, xk = apply_rotary_emb(xq, xk, rope_cache, positions)
/// xq = xq.transpose(1, 2)                               # xk, xv alike
/// output = self.inner_attention(xq, xk, xv, scale=self.scaling, enable_gqa=self.enable_gqa).transpose(1, 2).contiguous()
/// return self.wo(output.view(bs, seqlen, -1))
/// ```
/// Under tensor parallelism with sequence parallelism (`apply_non_moe_tp`, 0.2.2) the input is
/// the all-gathered `[b, s, h]` ([`sp_all_gather`], in [`Qwen3::layer`]) and `wo`'s partial sums
/// are reduce-scattered ([`tp_out_proj`]), as Llama 3's; `wq`/`wk`/`wv` keep DTensor outputs
/// (`use_local_output=False`) and `q_norm`/`k_norm` are `SequenceParallel(sequence_dim=2)`, over
/// the local heads: what is saved is the local path's (measured, `torchtitan-qwen3-tp.json`:
/// saved bytes exact).
fn qwen3_attention(b: &mut Builder, w: &AttnW, x: Tid, sh: &Shared) -> Tid {
    let proj = |b: &mut Builder, w: Option<Tid>, h: Q, module: &'static str, lin: Linear| {
        let y = head_proj(b, x, w, None, h, module, lin);
        b.module = "attention";
        (y, b.view(y, heads_bshd(h), "ViewBackward0", false))
    };
    let (qy, q) = proj(b, w.wq, Q::A, "attention.wq", Linear::Q);
    let (ky, k) = proj(b, w.wk, Q::KV, "attention.wk", Linear::K);
    let (vy, v) = proj(b, w.wv, Q::KV, "attention.wv", Linear::V);
    b.part = Part::AttentionCore;
    b.module = "attention.q_norm";
    let qn = rms_norm(b, q, w.qn, Rms::Torch);
    b.module = "attention.k_norm";
    let kn = rms_norm(b, k, w.kn, Rms::Torch);
    b.module = "attention";
    let (qr, kr) = match sh.cos {
        Some(c) => qwen3_rope(b, qn, kn, c),
        None => (qn, kn),
    };
    let qt = b.view(qr, heads(Q::A), "TransposeBackward0", false);
    let kt = b.view(kr, heads(Q::KV), "TransposeBackward0", false);
    let vt = b.view(v, heads(Q::KV), "TransposeBackward0", false);
    b.module = "attention.inner_attention";
    let o = sdpa_core(b, qt, kt, vt);
    let out = tp_out_proj(b, w, o);
    // The forward's locals (xq, xk, xv, output) go at its return.
    for t in [qy, ky, vy, q, k, qn, kn, qr, kr] {
        b.hold(t);
    }
    out
}

/// torchtitan 0.2.2's Qwen3 (`models/qwen3/model/model.py` `Qwen3Model`, dense): its Llama 3
/// ([`Llama3`]: `nn.RMSNorm`, no mask, no position ids, the same loss) with per-head q/k norms
/// ([`qwen3_attention`]) and RoPE as transformers writes it (`rotate_half`) against the
/// `rope_cache` buffer (`[max_seq_len, 2 × head_dim]` fp32: cos then sin, [`qwen3_rope`]).
pub struct Qwen3;
impl TitanModel for Qwen3 {
    /// `self.rope_cache`, as one `[s, d]` half (the blocks cut cos and sin from it).
    fn rope_shape(&self) -> Shape {
        rope_cache_shape()
    }
    /// `TransformerBlock.forward`: Llama 3's block with [`qwen3_attention`], and on an MoE
    /// layer (`moe_enabled`) torchtitan's `MoE` ([`moe`]) in place of `FeedForward`:
    /// `x = x + self.moe(self.ffn_norm(x))`.
    fn block(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind) -> Tid {
        let _ = spec;
        let aw = AttnW::new(b, p);
        let ffn = Ffn::new(b, p, kind, MoeW::new);
        // Under TP the dense block is Llama 3's ([`tp_mlp`]; MoE layers with TP are refused).
        let ffn = |b: &mut Builder, n: Tid| match ffn {
            Ffn::Dense(w) if sp_tp(b) => {
                let n = sp_all_gather(b, n);
                in_group(b, Kind::Dense, |b| tp_mlp(b, &w, n))
            }
            ffn => ffn.forward(b, n, |b, w, n| moe(b, &w, n, QWEN3_MOE, None)),
        };
        let attention = |b: &mut Builder, n: Tid| {
            let n = sp_all_gather(b, n);
            (qwen3_attention(b, &aw, n, sh), None)
        };
        decoder_layer(b, p, x, NORM, attention, ffn)
    }
}

/// DeepSeek-V3's `freqs_cis` buffer (`precompute_freqs_cis(args)`: `[max_seq_len, d_r / 2]`
/// complex64 over the rotary head `qk_rope_head_dim`; its bytes: fp32 `[s, d_r]`).
fn mla_freqs_shape() -> Shape {
    Shape::new(&[Dim::Q(Q::S), super::deepseek::DR], Split::None)
}

/// DeepSeek-V3's `apply_rotary_emb(x, freqs_cis)` (`models/deepseek_v3/model/model.py`) on one
/// tensor:
/// ```python
/// x = torch.view_as_complex(x.float().view(*x.shape[:-1], -1, 2))
/// y = torch.view_as_real(x * freqs_cis).flatten(3)
/// return y.to(dtype)
/// ```
/// The product keeps `freqs_cis` (the buffer); the fp32 copy (none in fp32) and the product live
/// until the return. `grad_copy`: the gradient reaches `view_as_real` as a narrowed view (q's
/// rotary part, cut from the `cat`'s gradient) and is copied (`grad.contiguous()`), unless a
/// cast made a new one (reduced precision: ToCopyBackward0).
fn mla_rope(b: &mut Builder, x: Tid, fc: Tid, grad_copy: bool) -> Tid {
    let xdt = b.t(x).dt;
    let x32 = b.to_copy(x, Dt::F32);
    let m = super::deepseek::complex_mul(b, x32, fc);
    let m = if grad_copy && (xdt == Dt::F32 || b.dtype(xdt) == b.dtype(Dt::F32)) {
        let shape = b.shape(m);
        b.view(m, shape, "ViewAsRealBackward0", true)
    } else {
        m
    };
    let y = b.to_copy(m, xdt);
    b.hold(x32);
    b.hold(m);
    y
}

/// DeepSeek-V3's MLA `Attention.forward` with `attn_type = "sdpa"` (`q_lora_rank = 0`: `wq`; else
/// `wq_a` → `q_norm` → `wq_b`):
/// ```python
/// q = self.wq(x).view(bsz, seqlen, -1, self.qk_head_dim)
/// q_nope, q_pe = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
/// q_pe = apply_rotary_emb(q_pe, freqs_cis)
/// q = torch.cat([q_nope, q_pe], dim=-1)
/// kv = self.wkv_a(x)
/// kv, k_pe = torch.split(kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
/// k_pe = apply_rotary_emb(k_pe.unsqueeze(2), freqs_cis)
/// kv = self.wkv_b(self.kv_norm(kv)).view(bsz, seqlen, -1, self.qk_nope_head_dim + self.v_head_dim)
/// k_nope, v = torch.split(kv, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
/// k = torch.cat([k_nope, k_pe.expand(-1, -1, self.n_heads, -1)], dim=-1)
/// output = self.inner_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=self.softmax_scale)
/// return self.wo(output.transpose(1, 2).contiguous().view(bsz, seqlen, -1))
/// ```
/// Unlike transformers' DeepSeek-V2 attention, q and k are concatenated in `[b, s, heads, d]`
/// and transposed as views, the latent's norm is `nn.RMSNorm` (on the `wkv_a` output's slice:
/// its saves hold that whole output) and no key is built in a `new_empty` buffer. The core is
/// SDPA's: on the CPU, whose fused kernels need d_v = d, the math path (q and k arrive as
/// transposed views of `[b, s, heads, d]` tensors, which `matmul` folds by a copy).
fn mla_attention(b: &mut Builder, w: &super::deepseek::MlaW, spec: &ModelSpec, x: Tid, sh: &Shared) -> Tid {
    use super::deepseek::{bhsw, bshw, lat, split2, A, D, DN, DR, DV};
    b.part = Part::AttentionInputs;
    let (q, q_lat) = match w.q_a {
        Some(wa) => {
            b.module = "attention.wq_a";
            let qa = proj_or(b, x, Some(wa), None, lat(X::MlaRq), Linear::Q);
            b.part = Part::Mla;
            b.module = "attention.q_norm";
            let qn = rms_norm(b, qa, w.q_a_norm, Rms::Torch);
            b.module = "attention.wq_b";
            (proj_or(b, qn, w.q_b, None, bshw(A, D), Linear::Q), Some(qa))
        }
        None => {
            b.module = "attention.wq";
            (proj_or(b, x, w.q, None, bshw(A, D), Linear::Q), None)
        }
    };
    b.module = "attention";
    b.part = Part::AttentionCore;
    let q4 = b.view(q, bshw(A, D), "ViewBackward0", false);
    let (q_nope, q_pe) = split2(b, q4, bshw(A, DN), bshw(A, DR));
    let q_rot = match sh.cos {
        Some(fc) => mla_rope(b, q_pe, fc, true),
        None => q_pe,
    };
    let qc = super::common::cat_promote(b, q_nope, q_rot, bshw(A, D));
    b.part = Part::AttentionInputs;
    b.module = "attention.wkv_a";
    let kv = proj_or(b, x, w.kv_a, None, lat(X::MlaKvA), Linear::K);
    b.module = "attention";
    b.part = Part::Mla;
    let (kv_nope, k_pe) = split2(b, kv, lat(X::MlaRkv), Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), DR], Split::None));
    b.part = Part::AttentionCore;
    let k_pe4 = b.view(k_pe, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::N(1), DR], Split::None), "UnsqueezeBackward0", false);
    let k_rot = match sh.cos {
        Some(fc) => mla_rope(b, k_pe4, fc, false),
        None => k_pe4,
    };
    b.part = Part::Mla;
    b.module = "attention.kv_norm";
    let kvn = rms_norm(b, kv_nope, w.kv_a_norm, Rms::Torch);
    b.module = "attention.wkv_b";
    let kvb_shape = bshw(A, Dim::X(X::MlaKvB));
    let kvb = proj_or(b, kvn, w.kv_b, None, kvb_shape, Linear::V);
    b.module = "attention";
    b.part = Part::AttentionCore;
    let kvb4 = b.view(kvb, kvb_shape, "ViewBackward0", false);
    let (k_nope, v) = split2(b, kvb4, bshw(A, DN), bshw(A, DV));
    // `k_pe.expand(-1, -1, n_heads, -1)`.
    let k_rot_e = super::deepseek::expand_heads(b, k_rot, bshw(A, DR));
    let k = super::common::cat_promote(b, k_nope, k_rot_e, bshw(A, D));
    let qt = b.view(qc, bhsw(A, D), "TransposeBackward0", false);
    let kt = b.view(k, bhsw(A, D), "TransposeBackward0", false);
    let vt = b.view(v, bhsw(A, DV), "TransposeBackward0", false);
    b.module = "attention.inner_attention";
    let o = if b.c.cuda || spec.v_head_dim == spec.head_dim {
        super::deepseek::flash_core(b, qt, kt, vt, None)
    } else {
        super::deepseek::sdpa_math(b, qt, kt, vt, None)
    };
    let out = out_proj(b, o, w.o, w.o_bias, "attention.wo");
    // The forward's locals (q and its views, kv's views, k, k_pe, output) go at its return.
    for t in [q, qc, kvb, k, k_rot, o] {
        b.hold(t);
    }
    if let Some(qa) = q_lat {
        b.hold(qa);
    }
    out
}

/// The parameters of a torchtitan `MoE` with shared experts (DeepSeek-V3's, Llama 4's) in
/// registration order: `experts` (w1, w2, w3), `router.gate`, then `shared_experts` (w1, w2, w3).
#[derive(Clone, Copy)]
pub struct SharedMoeW {
    moe: MoeW,
    shared: MlpW,
}

impl SharedMoeW {
    fn new(b: &mut Builder, p: &Params) -> SharedMoeW {
        let moe = MoeW::new(b, p);
        let shared = MlpW::shared(b, p);
        SharedMoeW { moe, shared }
    }
}

/// torchtitan 0.2.2's DeepSeek-V3 (`models/deepseek_v3/model/model.py` `DeepSeekV3Model`) in the
/// shape of its "16B" flavor, the DeepSeek-V2-Lite architecture (`torchtitan-deepseek_v3.json`):
/// MLA ([`mla_attention`]) with the RoPE head's `freqs_cis` buffer, the first `n_dense_layers`
/// blocks with Llama 3's `FeedForward`, the others torchtitan's `MoE` ([`moe`]: softmax scores
/// without `route_norm`, applied after the experts, plus the shared experts), `nn.RMSNorm`, the
/// same loss as its Llama 3.
pub struct DeepseekV3;
impl TitanModel for DeepseekV3 {
    /// `self.freqs_cis` over the rotary head.
    fn rope_shape(&self) -> Shape {
        mla_freqs_shape()
    }
    /// `TransformerBlock.forward`: `x = x + self.attention(self.attention_norm(x), freqs_cis, …)`,
    /// then `x + self.moe(self.ffn_norm(x))` on an MoE block, `x + self.feed_forward(…)` on a
    /// dense one.
    fn block(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind) -> Tid {
        let aw = super::deepseek::MlaW::new(b, p);
        let ffn = Ffn::new(b, p, kind, SharedMoeW::new);
        let ffn = |b: &mut Builder, n: Tid| ffn.forward(b, n, |b, w, n| moe(b, &w.moe, n, DEEPSEEK_MOE, Some(&w.shared)));
        let attention = |b: &mut Builder, n: Tid| (mla_attention(b, &aw, spec, n, sh), None);
        decoder_layer(b, p, x, NORM, attention, ffn)
    }
}

/// torchtitan 0.2.2's Llama 4 (`models/llama4/model/model.py` `Transformer`) as its 17bx16e and
/// 17bx128e flavors build it (`torchtitan-llama4.json`): Llama 3's attention ([`attention`]) with
/// RoPE in every block (no NoPE layers, no q/k norm, no chunked attention: those need its flex
/// path), `FeedForward` on the dense blocks and torchtitan's `MoE` ([`moe`]) with the default
/// `MoEArgs` on the others: sigmoid scores, top-1, no `route_norm`, the scores scaling the
/// experts' inputs (`score_before_experts`), one shared expert of the experts' auto-scaled width.
pub struct Llama4;
impl TitanModel for Llama4 {
    /// Llama 3's `freqs_cis`.
    fn rope_shape(&self) -> Shape {
        freqs_shape()
    }
    /// `TransformerBlock.forward`: `h = x + self.attention(self.attention_norm(x), …)`, then
    /// `h + self.moe(self.ffn_norm(h))` on an MoE block (`(layer_id + 1) %
    /// interleave_moe_layer_step == 0`), `h + self.feed_forward(self.ffn_norm(h))` otherwise.
    fn block(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind) -> Tid {
        let _ = spec;
        let aw = AttnW::new(b, p);
        let ffn = Ffn::new(b, p, kind, SharedMoeW::new);
        let ffn = |b: &mut Builder, n: Tid| ffn.forward(b, n, |b, w, n| moe(b, &w.moe, n, LLAMA4_MOE, Some(&w.shared)));
        decoder_layer(b, p, x, NORM, |b, n| attention(b, &aw, n, sh), ffn)
    }
}

/// torchtitan's `TOKEN_GROUP_ALIGN_SIZE_M` (`models/moe/utils.py`): each expert's rows of the
/// grouped GEMMs are padded to a multiple of 8 (bf16), and every expert gets at least 8.
pub const TOKEN_GROUP_ALIGN_SIZE_M: u64 = 8;

/// torchtitan's `MoE` parameters in registration order: `experts.w1` `[E, f_e, h]`,
/// `experts.w2` `[E, h, f_e]`, `experts.w3` `[E, f_e, h]` (three tensors where transformers fuses
/// w1 and w3 into `gate_up_proj`: half of it each), then `router.gate.weight` `[E, h]`.
#[derive(Clone, Copy)]
pub struct MoeW {
    w1: Option<Tid>,
    w2: Option<Tid>,
    w3: Option<Tid>,
    gate: Option<Tid>,
}

impl MoeW {
    fn new(b: &mut Builder, p: &Params) -> MoeW {
        let half =
            |b: &mut Builder| p.find("layers.*.mlp.experts.gate_up_proj").map(|(n, trains, expert)| p.make(b, n / 2, trains, expert));
        let w1 = half(b);
        let w2 = p.w(b, "layers.*.mlp.experts.down_proj");
        let w3 = half(b);
        let gate = p.w(b, "layers.*.mlp.router.weight");
        MoeW { w1, w2, w3, gate }
    }
}

/// `[E]`: one value per expert.
fn per_expert() -> Shape {
    Shape::new(&[Dim::X(X::E)], Split::None)
}

/// `[n_pad, last]`: the grouped GEMMs' rows ([`X::MoePadded`]).
fn padded(last: Dim) -> Shape {
    Shape::new(&[Dim::X(X::MoePadded), last], Split::None)
}

/// `torch.histc(selected_experts_indices.view(-1), bins=E, min=0, max=E)` (no gradient): int64
/// counts `[E]`. On the CPU, which has no int64 histogram, the measurement runs it on an fp32
/// copy and casts the counts back (`measure_frameworks.py` `_torchtitan_moe_on_cpu`).
fn histc(b: &mut Builder, idx: Tid) -> Tid {
    if b.c.cuda {
        return b.plain("histc", &[idx], per_expert(), Dt::I64);
    }
    let f = b.plain("_to_copy", &[idx], pairs(&[]), Dt::F32);
    let h = b.plain("histc", &[f], per_expert(), Dt::F32);
    b.plain("_to_copy", &[h], per_expert(), Dt::I64)
}

/// `a / d` out of place, `d` broadcast: DivBackward0 keeps both ([`Builder::div_backward`]).
fn div(b: &mut Builder, a: Tid, d: Tid) -> Tid {
    let (shape, dt, rg) = (b.shape(a), b.t(a).dt, b.rg(a) || b.rg(d));
    let out = b.out(shape, dt, rg);
    let bw = b.div_backward(a, d);
    b.op("div", "DivBackward0", &[a, d], &[out], &[S::In(0), S::In(1)], &bw)[0]
}

/// `TokenChoiceTopKRouter.forward` with `score_func = "softmax"`, `route_norm` (Qwen3's; not
/// DeepSeek-V3's 16B flavor: the gathered scores go to `route_scale` as they are) and the
/// `expert_bias` buffer (`load_balance_coeff` set, as shipped):
/// ```python
/// scores = self.gate(x)
/// scores = F.softmax(scores.to(torch.float32), dim=1)
/// scores_for_choice = scores + expert_bias
/// _, selected_experts_indices = torch.topk(scores_for_choice, k=self.top_k, dim=-1, sorted=False)
/// top_scores = scores.gather(dim=1, index=selected_experts_indices)
/// denominator = top_scores.sum(dim=-1, keepdim=True) + 1e-20
/// top_scores = top_scores / denominator
/// top_scores = top_scores * self.route_scale
/// num_tokens_per_expert = torch.histc(selected_experts_indices.view(-1), bins=E, min=0, max=E)
/// ```
/// The gate keeps its input (and its weight's bf16 cast under autocast), the softmax its fp32
/// result, the gather its int64 indices `[b·s, K]`, the division both inputs. topk's values `_`
/// are never used: its node (and the bias add's) dies with them, keeping nothing. Returns
/// (top_scores, indices).
fn router(b: &mut Builder, gate: Option<Tid>, x2: Tid, how: TitanMoe) -> (Tid, Tid) {
    let e = tokens(&[Dim::X(X::E)]);
    let k = tokens(&[Dim::X(X::K)]);
    b.module = "moe.router.gate";
    let logits = match gate {
        Some(w) => b.linear(x2, w, None, e),
        None => b.plain("mm", &[x2], e, Dt::Model),
    };
    b.module = "moe.router";
    let lf = b.to_copy(logits, Dt::F32);
    let scores = if how.sigmoid {
        b.unary("sigmoid", "SigmoidBackward0", lf, Keep::Output, "sigmoid_backward")
    } else {
        b.unary("_softmax", "SoftmaxBackward0", lf, Keep::Output, "_softmax_backward_data")
    };
    let bias = b.external(per_expert(), Dt::F32, Origin::Buffer, false);
    let choice = b.plain("add", &[scores, bias], e, Dt::F32);
    let outs = [b.out(k, Dt::F32, false), b.out(k, Dt::I64, false)];
    let r = b.plain_n("topk", &[choice], &outs);
    let (vals, idx) = (r[0], r[1]);
    let g = super::sigmoid_moe::gather(b, scores, idx);
    let normed = if how.route_norm {
        let sum = b.sum_dim(g, tokens(&[Dim::N(1)]));
        let den = b.add_scalar(sum);
        b.hold(den);
        div(b, g, den)
    } else {
        g
    };
    let top = b.mul_scalar(normed);
    let counts = histc(b, idx);
    for t in [scores, choice, vals, g, normed, counts] {
        b.hold(t);
    }
    (top, idx)
}

/// `torch._grouped_mm(x, w, offs=offsets)` into `shape`: GroupedMmBackward0 keeps `x`, `w` (a
/// bf16 copy unless the weight is bf16 already: then the parameter) and the offsets; backward the
/// weight's gradient, then the input's.
fn grouped_mm(b: &mut Builder, x: Tid, w: Option<Tid>, offs: Tid, shape: Shape) -> Tid {
    let Some(w) = w else { return b.plain("_grouped_mm", &[x, offs], shape, Dt::Bf16) };
    let (rx, rw) = (b.rg(x), b.rg(w));
    let out = b.out(shape, b.t(x).dt, rx || rw);
    let (xb, xd, wg, wd) = (b.bytes(x), b.t(x).dtype, b.grad_bytes(w), b.t(w).dtype);
    let mut bw: Vec<B> = Vec::with_capacity(4);
    if rw {
        bw.push(B::Alloc { bytes: wg, dtype: wd, op: "_grouped_mm" });
        bw.push(B::Grad { input: 1, temp: 0 });
    }
    if rx {
        bw.push(B::Alloc { bytes: xb, dtype: xd, op: "_grouped_mm" });
        bw.push(B::Grad { input: 0, temp: u8::from(rw) });
    }
    b.op("_grouped_mm", "GroupedMmBackward0", &[x, w, offs], &[out], &[S::In(0), S::In(1), S::In(2)], &bw)[0]
}

/// `buf[idx] = vals` in place on a buffer that needs no gradient (`new_empty`, `zeros`):
/// IndexPutBackward0 keeps the indices; `vals`' gradient is `grad.index(indices)`.
fn index_put(b: &mut Builder, buf: Tid, idx: Tid, vals: Tid) -> Tid {
    let rg = b.rg(vals);
    let out = Out { shape: b.shape(buf), dt: b.t(buf).dt, view_of: Some(buf), requires_grad: rg };
    let (vb, vd) = (b.bytes(vals), b.t(vals).dtype);
    let bw: &[B] = if rg { &[B::Alloc { bytes: vb, dtype: vd, op: "index" }, B::Grad { input: 2, temp: 0 }] } else { &[] };
    b.op("index_put_", "IndexPutBackward0", &[buf, idx, vals], &[out], if rg { &[S::In(1)] } else { &[] }, bw)[0]
}

/// `GroupedExperts.forward` with `use_grouped_mm` and no expert parallelism:
/// `indices_padding_wrapper(_run_experts_grouped_mm)` (`models/moe/utils.py`, `moe.py`):
/// ```python
/// # _permute
/// with torch.no_grad():
///     permuted_indices, num_tokens_per_expert, _ = generate_permute_indices(...)  # int32 [n_pad]
/// x = torch.vstack((x, x.new_zeros((x.shape[-1]))))                                 # [b·s·K + 1, h]
/// x = x[permuted_indices, :]                                                         # [n_pad, h]
/// # _run_experts_grouped_mm
/// offsets = torch.cumsum(num_tokens_per_expert, dim=0, dtype=torch.int32)
/// h = F.silu(torch._grouped_mm(x.bfloat16(), w1.bfloat16().transpose(-2, -1), offs=offsets))
/// h = h * torch._grouped_mm(x.bfloat16(), w3.bfloat16().transpose(-2, -1), offs=offsets)
/// out = torch._grouped_mm(h, w2.bfloat16().transpose(-2, -1), offs=offsets).type_as(x)
/// # _unpermute
/// out_unpermuted = out.new_empty(input_shape)
/// out_unpermuted[permuted_indices, :] = out
/// out = out_unpermuted[:-1]
/// ```
/// Kept: the int32 permutation `[n_pad]` (the index and the index_put), the offsets, each
/// `bfloat16()` of x (two copies unless x is bf16) and of the weights (copies unless bf16), silu's
/// input, the product's two inputs and w2's input. The CPU measurement runs
/// `generate_permute_indices(..., use_cpu=True)` (`fill_indices_cpu`: the same indices).
fn experts(b: &mut Builder, w: &MoeW, x: Tid, counts: Tid) -> Tid {
    b.module = "moe.experts";
    let xdt = b.t(x).dt;
    let perm = b.plain("full", &[counts], Shape::new(&[Dim::X(X::MoePadded)], Split::None), Dt::I32);
    let sizes = b.plain("_to_copy", &[counts], per_expert(), Dt::I32);
    let zrow = b.plain("new_zeros", &[x], Shape::new(&[Dim::Q(Q::H)], Split::None), xdt);
    let rg = b.rg(x);
    let cat = b.out(Shape::new(&[Dim::X(X::MoePairs1), Dim::Q(Q::H)], Split::None), xdt, rg);
    let bw: &[B] = if rg { &[B::Pass { input: 0, output: 0 }] } else { &[] };
    let xc = b.op("cat", "CatBackward0", &[x, zrow], &[cat], &[], bw)[0];
    let xp = b.index(xc, perm, padded(Dim::Q(Q::H)));
    let offs = b.plain("cumsum", &[sizes], per_expert(), Dt::I32);
    let cast = |b: &mut Builder, w: Option<Tid>| w.map(|w| b.to_copy(w, Dt::Bf16));
    let x1 = b.to_copy(xp, Dt::Bf16);
    let w1 = cast(b, w.w1);
    let g1 = grouped_mm(b, x1, w1, offs, padded(Dim::X(X::FE)));
    let a = b.unary("silu", "SiluBackward0", g1, Keep::Input, "silu_backward");
    let x3 = b.to_copy(xp, Dt::Bf16);
    let w3 = cast(b, w.w3);
    let g3 = grouped_mm(b, x3, w3, offs, padded(Dim::X(X::FE)));
    let h = b.mul(a, g3);
    let w2 = cast(b, w.w2);
    let o = grouped_mm(b, h, w2, offs, padded(Dim::Q(Q::H)));
    let ot = b.to_copy(o, xdt);
    let buf = b.plain("empty", &[ot], Shape::new(&[Dim::X(X::MoePairs1), Dim::Q(Q::H)], Split::None), b.t(ot).dt);
    let put = index_put(b, buf, perm, ot);
    let out = b.slice(put, pairs(&[Dim::Q(Q::H)]));
    for t in [perm, sizes, xp, offs, h, put] {
        b.hold(t);
    }
    out
}

/// torchtitan's `MoE.forward` (`models/moe/moe.py`, 0.2.2) as `how` sets it up ([`TitanMoe`]) and
/// with the `shared` experts' `FeedForward` if any; written out as its Qwen3 MoE runs it (no
/// shared expert, the scores applied after the experts, `score_before_experts = False`; Llama 4's
/// scaling of the experts' inputs and sum over the top-k are in the code below):
/// ```python
/// x = x.view(-1, dim)
/// top_scores, selected_experts_indices, num_tokens_per_expert = self.router(x, self.expert_bias)
/// with torch.no_grad(): self.tokens_per_expert.add_(num_tokens_per_expert)
/// # TokenReorderer
/// num_tokens_per_expert = torch.histc(selected_experts_indices.view(-1), ...)
/// token_indices_experts_sorted = torch.argsort(selected_experts_indices.view(-1), stable=True)
/// top_scores_experts_sorted = top_scores.view(-1)[token_indices_experts_sorted]   # unused
/// routed_input = x[token_indices_experts_sorted // self.router.top_k]
/// routed_output = self.experts(routed_input, num_tokens_per_expert)
/// routed_output_unsorted = torch.zeros((bs * slen * top_k, dim), dtype=routed_output.dtype)
/// routed_output_unsorted[token_indices_experts_sorted] = routed_output
/// routed_output_unsorted = routed_output_unsorted.reshape(-1, top_k, dim)
/// out_experts = torch.bmm(top_scores.reshape(-1, 1, top_k), routed_output_unsorted.float()).to(x.dtype).squeeze(1)
/// return out_experts.reshape(bs, slen, dim)
/// ```
/// Kept beyond the router ([`router`]) and the experts ([`experts`]): `tok_sorted // K` (int64
/// `[b·s·K]`, the gather of the routed input), the sorted indices (int64, the index_put), and the
/// bmm's inputs: the scores `[b·s, 1, K]` and the unsorted outputs `[b·s, K, h]`, fp32 (bf16
/// under autocast, which casts both).
fn moe(b: &mut Builder, w: &MoeW, x: Tid, how: TitanMoe, shared: Option<&MlpW>) -> Tid {
    b.part = Part::Moe;
    b.module = "moe";
    let x2 = b.view(x, b.shape(x), "ViewBackward0", false);
    let xdt = b.t(x2).dt;
    let (top, idx) = router(b, w.gate, x2, how);
    b.module = "moe.reorderer";
    let counts = histc(b, idx);
    let flat = b.view(idx, pairs(&[]), "", false);
    let outs = [b.out(pairs(&[]), Dt::I64, false), b.out(pairs(&[]), Dt::I64, false)];
    let sorted = b.plain_n("sort", &[flat], &outs)[1];
    let tv = b.view(top, pairs(&[]), "ViewBackward0", false);
    // `top_scores_experts_sorted`: read only when the scores go before the experts; else its
    // node dies, keeping indices that the index_put keeps too.
    let sorted_scores =
        if how.score_before { b.index(tv, sorted, pairs(&[])) } else { b.plain("index", &[tv, sorted], pairs(&[]), Dt::F32) };
    b.module = "moe";
    let tok = b.plain("floor_divide", &[sorted], pairs(&[]), Dt::I64);
    let routed_in = b.index(x2, tok, pairs(&[Dim::Q(Q::H)]));
    // `score_before_experts` (Llama 4's): `(routed_input.to(torch.float32) *
    // top_scores_experts_sorted.reshape(-1, 1)).to(x.dtype)`: the product keeps both factors.
    let expert_in = if how.score_before {
        let r32 = b.to_copy(routed_in, Dt::F32);
        let sc = b.view(sorted_scores, pairs(&[Dim::N(1)]), "ViewBackward0", false);
        let m = b.mul(r32, sc);
        b.hold(r32);
        b.to_copy(m, xdt)
    } else {
        routed_in
    };
    let routed_out = experts(b, w, expert_in, counts);
    // `out = self.shared_experts(x)`: the shared experts' `FeedForward` on the flattened input.
    let shared_out = shared.map(|sw| {
        let o = super::common::gated_mlp(b, sw, x2, &TITAN_SHARED_EXPERTS);
        b.part = Part::Moe;
        o
    });
    b.module = "moe";
    let zeros = b.plain("zeros", &[], pairs(&[Dim::Q(Q::H)]), b.t(routed_out).dt);
    let unsorted = index_put(b, zeros, sorted, routed_out);
    let y = if how.score_before {
        // `routed_output_unsorted.reshape(-1, top_k, dim).sum(dim=1)`.
        let u3 = b.view(unsorted, tokens(&[Dim::X(X::K), Dim::Q(Q::H)]), "ViewBackward0", false);
        b.sum_dim(u3, tokens(&[Dim::Q(Q::H)]))
    } else {
        let uf = b.to_copy(unsorted, Dt::F32);
        let ts = b.view(top, tokens(&[Dim::N(1), Dim::X(X::K)]), "ViewBackward0", false);
        let o = b.bmm(ts, uf, tokens(&[Dim::N(1), Dim::Q(Q::H)]));
        let oc = b.to_copy(o, xdt);
        b.view(oc, tokens(&[Dim::Q(Q::H)]), "SqueezeBackward1", false)
    };
    // `(out + out_experts).reshape(bs, slen, dim)`.
    let y = match shared_out {
        Some(o) => b.add(o, y),
        None => y,
    };
    for t in [x2, top, idx, counts, sorted, sorted_scores, routed_in, expert_in, routed_out, unsorted] {
        b.hold(t);
    }
    y
}

/// How a torchtitan model's `MoEArgs` set its `MoE` up (`models/moe/moe.py`): the router's score
/// function and `route_norm`, and whether the scores scale the experts' inputs
/// (`score_before_experts`) or their outputs.
#[derive(Clone, Copy, Debug)]
pub struct TitanMoe {
    /// `score_func = "sigmoid"` (Llama 4's), else softmax.
    pub sigmoid: bool,
    pub route_norm: bool,
    pub score_before: bool,
}

/// Qwen3's MoE args (its 30B-A3B preset): softmax, renormalised, scores after the experts.
const QWEN3_MOE: TitanMoe = TitanMoe { sigmoid: false, route_norm: true, score_before: false };
/// DeepSeek-V3's 16B flavor: softmax, not renormalised, scores after the experts.
const DEEPSEEK_MOE: TitanMoe = TitanMoe { sigmoid: false, route_norm: false, score_before: false };
/// Llama 4's flavors (`MoEArgs` defaults): sigmoid, not renormalised, scores before the experts.
const LLAMA4_MOE: TitanMoe = TitanMoe { sigmoid: true, route_norm: false, score_before: true };

/// torchtitan's shared experts (`MoE.shared_experts`: `FeedForward(dim, moe_inter_dim ×
/// num_shared_experts)`, `w2(F.silu(w1(x)) * w3(x))` on the `[b·s, h]` input).
const TITAN_SHARED_EXPERTS: super::common::Gated = super::common::Gated {
    modules: ["moe.shared_experts.w1", "moe.shared_experts", "moe.shared_experts.w3", "moe.shared_experts", "moe.shared_experts.w2"],
    width: Dim::X(X::FS),
    act: super::common::SILU,
};

/// torchtitan's RoPE buffer, registered by the model (`register_buffer(…, persistent=False)`) for
/// `max_seq_len` = `training.seq_len` (`update_from_config`), fp32 (FSDP2's `param_dtype` casts
/// parameters only):
/// - Llama 3: `freqs_cis = precompute_freqs_cis(dim // n_heads, max_seq_len, …)`, complex64
///   `[s, d/2]`: s × (d / 2) × [`COMPLEX64_BYTES`];
/// - Qwen3: `rope_cache = precompute_rope_cache(head_dim, max_seq_len, …)`, `cat([cos, sin])`
///   of `[s, d]` each: s × 2d × 4.
///
/// - Qwen3 MoE: that `rope_cache`, and in each MoE layer `expert_bias` and `tokens_per_expert`
///   (`models/moe/moe.py` `MoE.__init__`: `torch.zeros(num_experts, dtype=torch.float32)` each,
///   registered as buffers; `load_balance_coeff` is set as shipped): L_moe × 2 × E × 4;
/// - DeepSeek-V3 (the 16B flavor's shape, `family = deepseek_v2`): `freqs_cis` over the rotary
///   head, complex64 `[s, d_r / 2]`: s × (d_r / 2) × 8, and the MoE layers' two buffers.
///
/// `None` for another framework or family.
pub fn buffer_bytes(cfg: &Config) -> Option<Bytes> {
    if cfg.framework != Framework::Torchtitan {
        return None;
    }
    let rope = super::common::has_rope(&cfg.arch);
    let (s, d) = (cfg.seq as u128, cfg.arch.head_dim as u128);
    match cfg.arch.family {
        Family::Llama => Some(if rope { s * (d / 2) * COMPLEX64_BYTES } else { 0 }),
        Family::Qwen3 => Some(if rope { s * 2 * d * F32_BYTES } else { 0 }),
        Family::Qwen3Moe => {
            let layers = crate::estimator::params::stage_layers(cfg.arch.layers, cfg.pp).min(cfg.arch.moe_layers()) as u128;
            let rope_cache = if rope { s * 2 * d * F32_BYTES } else { 0 };
            Some(rope_cache + layers * MOE_BUFFERS * cfg.arch.experts as u128 * F32_BYTES)
        }
        Family::Llama4 => {
            let layers = crate::estimator::params::stage_layers(cfg.arch.layers, cfg.pp).min(cfg.arch.moe_layers()) as u128;
            Some(if rope { s * (d / 2) * COMPLEX64_BYTES } else { 0 } + layers * MOE_BUFFERS * cfg.arch.experts as u128 * F32_BYTES)
        }
        Family::DeepseekV2 => {
            let layers = crate::estimator::params::stage_layers(cfg.arch.layers, cfg.pp).min(cfg.arch.moe_layers()) as u128;
            let dr = cfg.arch.qk_rope_dim as u128;
            let freqs = if rope { s * (dr / 2) * COMPLEX64_BYTES } else { 0 };
            Some(freqs + layers * MOE_BUFFERS * cfg.arch.experts as u128 * F32_BYTES)
        }
        _ => None,
    }
}

/// Parameter tensors torchtitan's Qwen3 MoE (and DeepSeek-V3) has more of than the parameter groups count: its
/// `GroupedExperts` keeps `w1` and `w3` apart where the groups have transformers' fused
/// `gate_up_proj`, so 1 more per MoE layer of the stage (AdamW keeps one `step` counter per
/// tensor). 0 for another framework or family.
pub fn split_tensors(cfg: &Config, groups: &[crate::estimator::params::LocalGroup]) -> u64 {
    if cfg.framework != Framework::Torchtitan || !matches!(cfg.arch.family, Family::Qwen3Moe | Family::DeepseekV2 | Family::Llama4) {
        return 0;
    }
    groups
        .iter()
        .filter(|g| {
            g.group.name == "layers.*.mlp.experts.gate_up_proj" && g.role == crate::estimator::params::Role::Trainable && !g.adapter
        })
        .map(|g| g.group.count)
        .sum()
}

/// `self.output(h)`, then the trainer's loss (`train.py` `forward_backward_step`,
/// `components/loss.py` `cross_entropy_loss`):
/// ```python
/// loss_sum = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum", ignore_index=-100)
/// loss = loss_sum / global_valid_tokens          # (labels != -100).sum(), as a float tensor
/// del pred
/// ```
/// The fp32 copy of the logits is an argument of `cross_entropy` (it lives through it); the
/// labels are the batch's, used as they are (no shifted copy); `pred` lives to the loss.
///
/// With tensor parallelism torchtitan keeps the output projection's logits sharded over the
/// vocabulary (`parallelize.py`: `use_local_output=not loss_parallel`; `parallelism.
/// disable_loss_parallel` defaults to false) and runs the loss under `loss_parallel()`
/// ([`loss_parallel_log_softmax`], [`loss_parallel_backward`]).
///
/// `compiled` (`compile.enable` with `"loss"` in `compile.components`, 0.2.2's default):
/// `build_cross_entropy_loss` wraps `cross_entropy_loss` in `torch.compile`: the fp32 copy, the
/// log-softmax and the sum are one region ([`Builder::compile_region`]; its backward one fused
/// kernel, [`Builder::fuse_loss_backward`]); the division by the valid-token count stays eager.
///
/// Under pipeline parallelism (`pipelined`) the logits are the last stage's output, which
/// torch's schedule keeps for the micro-batch's backward (torch 2.15
/// `distributed/pipelining/stage.py forward_one_chunk`: `_forward_chunk_states[fwd_chunk_id]`
/// holds `output_tuple` until `backward_one_chunk` has run): alive to the end of the stage's
/// backward, not freed with `pred` (measured: the 4096-vocabulary logits, 1,048,576 B, alive at
/// the loss backward's peak, `tests/fixtures/pytorch/fsdp/pp.json`).
#[allow(clippy::too_many_arguments)] // the head's tensors and four switches of torchtitan's loss
pub fn head_and_loss(
    b: &mut Builder,
    xn: Tid,
    w: Option<Tid>,
    bias: Option<Tid>,
    vocab: Shape,
    loss_parallel: bool,
    compiled: bool,
    pipelined: bool,
) {
    let logits = super::common::head_logits(b, xn, w, bias, vocab);
    let loss_first = b.next_op();
    // The labels are the batch's token ids tensor (`batch_bytes`: one `[b, s]` int64 for both),
    // which the embedding already keeps: not a second activation (a model-state origin keeps it
    // out of the ledger; like the batch it is never freed).
    let labels = b.external(Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None), Dt::I64, Origin::Buffer, false);
    if loss_parallel && compiled {
        let sum = compiled_loss_parallel(b, logits, labels, vocab, loss_first);
        return valid_token_division(b, sum, labels, logits, pipelined);
    }
    let lf = b.to_copy(logits, Dt::F32);
    let lsm = if loss_parallel {
        loss_parallel_log_softmax(b, lf, vocab)
    } else {
        b.unary("_log_softmax", "LogSoftmaxBackward0", lf, super::super::blocks::Keep::Output, "_log_softmax_backward_data")
    };
    let lb = b.bytes(lsm);
    let out = [b.out(Shape::scalar(), Dt::F32, true), b.out(Shape::scalar(), Dt::F32, false)];
    let plain_backward = [B::Alloc { bytes: lb, dtype: DType::Fp32, op: "nll_loss_backward" }, B::Grad { input: 0, temp: 0 }];
    let parallel_backward = loss_parallel_backward(lb);
    let sum = b.op(
        "nll_loss_forward",
        "NllLossBackward0",
        &[lsm, labels],
        &out,
        // `nll_loss_backward(grad, self, target, weight, reduction, ignore_index, total_weight)`.
        // Compiled, the decomposed backward of `reduction="sum"` never reads `total_weight` (a
        // mean divides by it): the partitioner does not keep it (measured: 4 B less).
        if compiled { &[S::In(1)] } else { &[S::In(1), S::Out(1)] },
        if loss_parallel { &parallel_backward } else { &plain_backward },
    );
    b.hold(lf);
    if compiled {
        let end = b.next_op();
        b.fuse_loss_backward(loss_first, end, logits, b.bytes(labels) / 8, false);
        b.compile_region(loss_first, end, &[sum[0]]);
    }
    valid_token_division(b, sum[0], labels, logits, pipelined);
}

/// `loss_sum / global_valid_tokens` (eager, outside the compiled loss), then `del pred`: the
/// logits live to here (under pipeline parallelism to the backward's end, [`head_and_loss`]).
fn valid_token_division(b: &mut Builder, sum: Tid, labels: Tid, logits: Tid, pipelined: bool) {
    // global_valid_tokens: `ne`, `sum`, `.float()`.
    let bs = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None);
    let ne = b.plain("ne", &[labels], bs, Dt::Bool);
    let n = b.plain("sum", &[ne], Shape::scalar(), Dt::I64);
    let nf = b.plain("_to_copy", &[n], Shape::scalar(), Dt::F32);
    let r = b.loss_scalar("div", "DivBackward0", sum, Some(nf));
    if pipelined {
        b.hold_forever(logits);
    } else {
        b.hold(logits);
    }
    b.outputs(&[r]);
}

/// `aten._log_softmax` on vocabulary-sharded logits under `loss_parallel()`: torch 2.15
/// `torch/distributed/tensor/parallel/loss.py` `_log_softmax` (what `_log_softmax_handler` runs
/// on the local shard; autograd sees one `LogSoftmaxBackward0` that keeps the result):
/// ```python
/// x_max = funcol.all_reduce(torch.amax(x, dim, keepdim=True), "max")   # [N, 1]
/// shifted = x - x_max                                                  # [N, V/tp] fp32
/// shifted_sumexp = funcol.all_reduce(torch.sum(torch.exp(shifted), dim, keepdim=True), "sum")
/// result = shifted - torch.log(shifted_sumexp)                         # [N, V/tp] fp32
/// ```
/// Where the fused kernel holds its input and its output, this holds the input, `shifted` and
/// `exp(shifted)` at once, then the input, `shifted` and the result: one more fp32 `[b·s, V/tp]`
/// tensor at the loss's forward peak. The `[N, 1]` row statistics are small tensors of their own.
/// Read from the source; not measured (tensor parallelism on a CPU needs several ranks).
fn loss_parallel_log_softmax(b: &mut Builder, lf: Tid, vocab: Shape) -> Tid {
    let x_max = all_reduced_rows(b, "amax", lf);
    let shifted = b.plain("sub", &[lf, x_max], vocab, Dt::F32);
    let e = b.plain("exp", &[shifted], vocab, Dt::F32);
    let sumexp = all_reduced_rows(b, "sum", e);
    let lse = b.plain("log", &[sumexp], loss_rows(), Dt::F32);
    let shape = b.shape(lf);
    let out = b.out(shape, Dt::F32, true);
    // The gradient needs no allocation of this node: the loss's backward already folded the
    // log-softmax in ([`loss_parallel_backward`]) and `_log_softmax_backward_handler` returns
    // `grad_output.to(input_dtype)`, the same fp32 tensor.
    let r = b.op("_log_softmax", "LogSoftmaxBackward0", &[lf, lse], &[out], &[S::Out(0)], &[B::Pass { input: 0, output: 0 }])[0];
    b.hold(shifted);
    r
}

/// The loss's `[N, 1]` row statistics (`N = b·s`, the logits' whole sequence): fp32.
fn loss_rows() -> Shape {
    Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None)
}

/// A row reduction `name` (`amax`, `sum`) of the local vocabulary shard, then its all-reduce
/// over the TP group (`funcol.all_reduce`, `"max"` or `"sum"`): two `[N, 1]` fp32 tensors.
fn all_reduced_rows(b: &mut Builder, name: &'static str, x: Tid) -> Tid {
    let local = b.plain(name, &[x], loss_rows(), Dt::F32);
    b.plain("all_reduce", &[local], loss_rows(), Dt::F32)
}

/// `build_cross_entropy_loss`'s compiled `cross_entropy_loss` on vocabulary-sharded logits
/// (`compile.components` with "loss" and tensor parallelism: torchtitan 0.2.2
/// `components/loss.py`, `train.py` under `loss_parallel()`). Dynamo traces DTensor's
/// `loss_parallel` handlers ([`loss_parallel_log_softmax`]), so the region holds their two
/// all-reduces, which the partitioner never recomputes: where the plain compiled loss
/// recomputes its log-softmax from the logits, this one keeps the fp32 result `[N, V/tp]`
/// (`shifted - log(sumexp)`) and the ignore mask `[N, 1]` (bool). Inductor's forward writes one
/// fp32 `[N, V/tp]` buffer before the second all-reduce (the shifted logits, read again after
/// it) and the result after it, then frees the first; the backward is one kernel that writes
/// the logits' gradient in their dtype (as [`Builder::fuse_loss_backward`]). Measured:
/// `validation/measure_titan_tp.py` compiled records (`torchtitan-{llama3,qwen3}-tp.json`,
/// the loss region's saved `add` and `ne`; the forward's two `[N, V/tp]` fp32 allocations).
/// `N = b·s` rows, the logits' whole sequence. Returns the loss sum.
fn compiled_loss_parallel(b: &mut Builder, logits: Tid, labels: Tid, vocab: Shape, loss_first: u32) -> Tid {
    let x_max = all_reduced_rows(b, "amax", logits);
    let shifted = b.plain("sub", &[logits, x_max], vocab, Dt::F32);
    let sumexp = all_reduced_rows(b, "sum", shifted);
    let rows = loss_rows();
    let lse = b.plain("log", &[sumexp], rows, Dt::F32);
    let out = b.out(vocab, Dt::F32, true);
    let lsm =
        b.op("_log_softmax", "LogSoftmaxBackward0", &[logits, shifted, lse], &[out], &[S::Out(0)], &[B::Pass { input: 0, output: 0 }])[0];
    let mask = b.plain("ne", &[labels], rows, Dt::Bool);
    let out = [b.out(Shape::scalar(), Dt::F32, true), b.out(Shape::scalar(), Dt::F32, false)];
    let sum = b.op("nll_loss_forward", "NllLossBackward0", &[lsm, labels, mask], &out, &[S::In(2)], &[B::Pass { input: 0, output: 0 }]);
    let end = b.next_op();
    b.fuse_loss_backward(loss_first, end, logits, b.bytes(labels) / 8, false);
    sum[0]
}

/// `aten.nll_loss_backward` under `loss_parallel()` (torch 2.15 `loss.py`
/// `_nll_loss_and_log_softmax_backward`, which folds in the log-softmax's backward to spare an
/// all-gather): `grad_input = torch.zeros_like(x)`, the target's entries set to −1 in place, then
/// `(grad_input + torch.exp(x)) * grad_output`: three `[N, V/tp]` fp32 tensors alive at once
/// (`grad_input`, `exp(x)`, their sum), where the fused kernels allocate one here and one in the
/// log-softmax's backward. `lb`: the bytes of one `[N, V/tp]` fp32 tensor.
fn loss_parallel_backward(lb: u128) -> [B; 8] {
    let alloc = |op| B::Alloc { bytes: lb, dtype: DType::Fp32, op };
    [alloc("zeros_like"), alloc("exp"), alloc("add"), B::Free(0), B::Free(1), alloc("mul"), B::Free(2), B::Grad { input: 0, temp: 3 }]
}

#[cfg(test)]
mod tests {
    use crate::estimator::config::{Config, Framework};
    use crate::estimator::estimate;
    use crate::estimator::presets::preset;

    /// torchtitan's Llama keeps other tensors than transformers' (fp32 normalized inputs, no
    /// rotary tables, no shifted labels): the same model's activations differ, and its buffers
    /// hold `freqs_cis` for the training sequence; another family is refused, not approximated.
    #[test]
    fn torchtitan_llama_keeps_its_own_tensors_holds_freqs_cis_and_refuses_other_families() {
        let base =
            Config { model: "llama-3.1-8b".into(), arch: preset("llama-3.1-8b").expect("preset").spec, seq: 4096, ..Config::default() };
        let hf = estimate(&base).expect("hf estimates");
        let tt = estimate(&Config { framework: Framework::Torchtitan, ..base.clone() }).expect("torchtitan estimates");
        assert_ne!(tt.memory.activations, hf.memory.activations);
        assert_eq!(super::buffer_bytes(&Config { framework: Framework::Torchtitan, ..base.clone() }), Some(4096 * 64 * 8));
        assert_eq!(super::buffer_bytes(&base), None);
        let gemma = preset("gemma-2-9b").or_else(|| preset("gemma-7b")).expect("a gemma preset").spec;
        assert!(estimate(&Config { framework: Framework::Torchtitan, arch: gemma, ..base }).is_err());
    }

    /// Under torchtitan's sequence-parallel TP the embedding's gradient is the whole `[V, h]`
    /// table (DTensor has no row-sharded `embedding_dense_backward`): `tp` times the shard the
    /// rank holds, in the weight's dtype. Toy check: Llama 3.1 8B, `V·h = 128,256 · 4,096`
    /// fp32 = 2,101,346,304 B, against 1,050,673,152 B for its TP-2 shard.
    #[test]
    fn the_tensor_parallel_embedding_gradient_is_the_whole_table() {
        use crate::estimator::config::Precision;
        use crate::estimator::step::EventKind;
        let spec = preset("llama-3.1-8b").expect("preset").spec;
        let cfg = Config {
            model: "llama-3.1-8b".into(),
            arch: spec,
            framework: Framework::Torchtitan,
            precision: Precision::Fp32,
            seq: 256,
            tp: 2,
            gpus: 2,
            sp: true,
            ..Config::default()
        };
        let grad_of = |c: &Config| {
            let s = crate::estimator::step_stream(c).expect("estimated");
            s.events
                .iter()
                .filter(|e| e.kind == EventKind::Alloc && e.op == "embedding_dense_backward")
                .map(|e| e.bytes)
                .collect::<Vec<_>>()
        };
        let table = 128_256u128 * 4_096 * 4;
        assert_eq!(grad_of(&cfg), vec![table]);
        assert_eq!(grad_of(&Config { tp: 1, gpus: 1, sp: false, ..cfg }), vec![table]);
    }

    /// torchtitan's Qwen3 keeps its own tensors (no rotary tables or shifted labels; cos and sin
    /// cut from its buffer), holds `rope_cache` (`[s, 2 × head_dim]` fp32) for the training
    /// sequence, and refuses by name what was not measured: a tied output.
    #[test]
    fn torchtitan_qwen3_keeps_its_own_tensors_holds_rope_cache_and_refuses_tying() {
        let base = Config { model: "qwen3-8b".into(), arch: preset("qwen3-8b").expect("preset").spec, seq: 4096, ..Config::default() };
        let tt = Config { framework: Framework::Torchtitan, ..base.clone() };
        let hf = estimate(&base).expect("hf estimates");
        assert_ne!(estimate(&tt).expect("torchtitan estimates").memory.activations, hf.memory.activations);
        assert_eq!(super::buffer_bytes(&tt), Some(4096 * 2 * 128 * 4));
        let tied = Config { arch: preset("qwen3-0.6b").expect("preset").spec, ..tt };
        assert!(estimate(&tied).is_err_and(|e| e.to_string().contains("enable_weight_tying")));
    }

    /// torchtitan's Qwen3 MoE (Qwen3-30B-A3B) keeps its own tensors (the padded grouped-GEMM
    /// rows, bf16 copies, the bmm's fp32 inputs), holds `rope_cache` plus `expert_bias` and
    /// `tokens_per_expert` (fp32 `[E]` each per layer), counts w1 and w3 as two tensors, and
    /// refuses by name what was not measured: shared experts, dense layers among the MoE ones,
    /// expert or tensor parallelism, LoRA.
    #[test]
    fn torchtitan_qwen3_moe_keeps_its_own_tensors_holds_its_buffers_and_refuses_what_was_not_measured() {
        let spec = preset("qwen3-30b-a3b").expect("preset").spec;
        let base = Config { model: "qwen3-30b-a3b".into(), arch: spec.clone(), seq: 4096, ..Config::default() };
        let tt = Config { framework: Framework::Torchtitan, ..base.clone() };
        let hf = estimate(&base).expect("hf estimates");
        assert_ne!(estimate(&tt).expect("torchtitan estimates").memory.activations, hf.memory.activations);
        assert_eq!(super::buffer_bytes(&tt), Some(4096 * 2 * 128 * 4 + 48 * 2 * 128 * 4));
        let shared =
            Config { arch: crate::estimator::model::ModelSpec { shared_experts: 1, shared_ffn: 768, ..spec.clone() }, ..tt.clone() };
        assert!(estimate(&shared).is_err_and(|e| e.to_string().contains("shared experts")));
        let dense = Config {
            arch: crate::estimator::model::ModelSpec {
                moe_rule: crate::estimator::model::LayerRule::from_flags(&(0..48).map(|i| i > 0).collect::<Vec<bool>>()),
                ..spec
            },
            ..tt.clone()
        };
        assert!(estimate(&dense).is_err_and(|e| e.to_string().contains("every layer")));
        let ep = Config { gpus: 8, ep: 8, ..tt.clone() };
        assert!(estimate(&ep).is_err_and(|e| e.to_string().contains("expert or tensor parallelism")));
        let tp = Config { gpus: 2, tp: 2, ..tt.clone() };
        assert!(estimate(&tp).is_err_and(|e| e.to_string().contains("expert or tensor parallelism")));
        let lora = Config { finetune: crate::estimator::config::Finetune::Lora, ..tt };
        assert!(estimate(&lora).is_err_and(|e| e.to_string().contains("finetune=full")));
    }

    /// The two shape quantities of torchtitan's MoE: the grouped GEMMs' rows, b·s·K + 8·E rounded
    /// up to 8 (`_permute`'s `padded_max_len`), and the pairs plus the zero row, b·s·K + 1.
    #[test]
    fn torchtitan_moe_rows_are_the_pairs_padded_per_expert_and_the_pairs_plus_one() {
        let arch = crate::estimator::model::ModelSpec { experts: 4, top_k: 2, ..preset("qwen3-30b-a3b").expect("preset").spec };
        let cfg = Config { framework: Framework::Torchtitan, arch, batch: 2, seq: 63, ..Config::default() };
        let recipe = crate::estimator::precision::recipe(cfg.precision);
        let xv = crate::estimator::step::model::Setup::new(&cfg, &recipe, crate::estimator::params::Stage::Whole).xv;
        assert_eq!(xv[crate::estimator::step::ir::X::MoePadded as usize], (2 * 63 * 2 + 32_u64).div_ceil(8) * 8);
        assert_eq!(xv[crate::estimator::step::ir::X::MoePairs1 as usize], 2 * 63 * 2 + 1);
    }
}
