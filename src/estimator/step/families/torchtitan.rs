//! `framework = torchtitan`: torchtitan 0.2.2's own Llama 3 (and its Qwen3, [`Qwen3`])
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
//! The attention's core (`ScaledDotProductAttentionWrapper`: SDPA with `is_causal=True`,
//! `enable_gqa`), `transpose(1, 2).contiguous()`, the projections and `FeedForward`
//! (`w2(F.silu(w1(x)) * w3(x))`) save what transformers' Llama saves: they reuse its builders.

use super::super::blocks::shapes::{heads, heads_bshd};
use super::super::ir::{Builder, DType, Dim, Dt, Origin, Shape, Split, Tid, B, S};
use super::common::rms_norm;
use super::common::{head_proj, out_proj, token_embedding, AttnW, Kind, MlpW, Norm, Params, Rms, Shared};
use super::llama::{decoder_layer, mlp, rope as rope_half, sdpa_core};
use super::llama4;
use super::modeling::Modeling;
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::{Attention, Config, Framework};
use crate::estimator::family::Family;
use crate::estimator::ledger::Bytes;
use crate::estimator::model::{Linear, ModelSpec};
use crate::estimator::step::part::Part;

/// Bytes of one complex64 element (`freqs_cis`): two fp32.
const COMPLEX64_BYTES: u128 = 8;

/// Bytes of one fp32 element (Qwen3's `rope_cache`).
const F32_BYTES: u128 = 4;

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
    let out = out_proj(b, o, w.wo, w.bo, "attention.wo");
    // The forward's locals (xq, xk, xv, output) go at its return.
    for t in [qy, ky, vy, q, k] {
        b.hold(t);
    }
    (out, None)
}

/// `TransformerBlock.forward`:
/// ```python
/// h = x + self.attention(self.attention_norm(x), freqs_cis, attention_masks, positions)
/// out = h + self.feed_forward(self.ffn_norm(h))
/// ```
/// transformers' pre-norm layer with `nn.RMSNorm` ([`decoder_layer`]); dense layers only.
fn layer(b: &mut Builder, p: &Params, x: Tid, sh: &Shared) -> Tid {
    let aw = AttnW::new(b, p);
    let mw = MlpW::new(b, p);
    decoder_layer(b, p, x, NORM, |b, n| attention(b, &aw, n, sh), |b, n| mlp(b, &mw, n))
}

/// torchtitan 0.2.2's Llama 3 (`Transformer`, see the module doc).
pub struct Llama3;
impl Modeling for Llama3 {
    /// `Transformer.forward` before the layers: `h = self.tok_embeddings(tokens)`; the layers
    /// read `self.freqs_cis` (a buffer, [`freqs_cis`]).
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        let (x0, _) = token_embedding(b, p, ids, "tok_embeddings");
        b.module = "";
        (x0, self.positions(b, spec, attn))
    }
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        let _ = attn;
        Shared { cos: freqs_cis(b, spec), ..Shared::default() }
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        let _ = (spec, kind, attn);
        layer(b, p, x, sh)
    }
    fn norm(&self) -> Norm {
        NORM
    }
    /// `h` is rebound by every layer: the embedding's output goes with the first layer's saves.
    fn x0_is_local(&self) -> bool {
        false
    }
    /// The `freqs_cis` buffer `[s, d/2]` complex64, no sin.
    fn rope_tables(&self, spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
        super::common::has_rope(spec).then(|| (freqs_shape(), Dt::F32, false))
    }
    /// The framework's own model code: SDPA with `is_causal=True` (no mask), RoPE tables as
    /// registered buffers, positions of its own ([`Modeling::framework_code`]).
    fn framework_code(&self) -> bool {
        true
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
    let sin = b.to_copy(cache, dt);
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
    let out = out_proj(b, o, w.wo, w.bo, "attention.wo");
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
impl Modeling for Qwen3 {
    /// `Qwen3Model.forward` before the layers: `h = self.tok_embeddings(tokens)`; the layers read
    /// `self.rope_cache` (a buffer).
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        let (x0, _) = token_embedding(b, p, ids, "tok_embeddings");
        b.module = "";
        (x0, self.positions(b, spec, attn))
    }
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        let _ = attn;
        let cos = super::common::has_rope(spec).then(|| b.external(rope_cache_shape(), Dt::F32, Origin::Buffer, false));
        Shared { cos, ..Shared::default() }
    }
    /// `TransformerBlock.forward` (dense): Llama 3's block with [`qwen3_attention`].
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        let _ = (spec, kind, attn);
        let aw = AttnW::new(b, p);
        let mw = MlpW::new(b, p);
        decoder_layer(b, p, x, NORM, |b, n| (qwen3_attention(b, &aw, n, sh), None), |b, n| mlp(b, &mw, n))
    }
    fn norm(&self) -> Norm {
        NORM
    }
    fn x0_is_local(&self) -> bool {
        false
    }
    /// The `rope_cache` buffer, as one `[s, d]` half (the layers cut cos and sin from it).
    fn rope_tables(&self, spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
        super::common::has_rope(spec).then(|| (rope_cache_shape(), Dt::F32, false))
    }
    /// The framework's own model code: SDPA with `is_causal=True` (no mask), RoPE tables as
    /// registered buffers, positions of its own ([`Modeling::framework_code`]).
    fn framework_code(&self) -> bool {
        true
    }
}

/// `self.freqs_cis` as the layers read it (`reshape_for_broadcast`: a view of the buffer's first
/// `seqlen` rows): model state, not an activation.
fn freqs_cis(b: &mut Builder, spec: &ModelSpec) -> Option<Tid> {
    super::common::has_rope(spec).then(|| b.external(freqs_shape(), Dt::F32, Origin::Buffer, false))
}

/// torchtitan's RoPE buffer, registered by the model (`register_buffer(…, persistent=False)`) for
/// `max_seq_len` = `training.seq_len` (`update_from_config`), fp32 (FSDP2's `param_dtype` casts
/// parameters only):
/// - Llama 3: `freqs_cis = precompute_freqs_cis(dim // n_heads, max_seq_len, …)`, complex64
///   `[s, d/2]`: s × (d / 2) × [`COMPLEX64_BYTES`];
/// - Qwen3: `rope_cache = precompute_rope_cache(head_dim, max_seq_len, …)`, `cat([cos, sin])`
///   of `[s, d]` each: s × 2d × 4.
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
        _ => None,
    }
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
pub fn head_and_loss(b: &mut Builder, xn: Tid, w: Option<Tid>, bias: Option<Tid>, vocab: Shape) {
    let logits = match w {
        Some(w) => b.linear(xn, w, bias, vocab),
        None => b.plain("mm", &[xn], vocab, Dt::Model),
    };
    b.p.loss_from = b.next_op();
    b.module = "(root)";
    b.part = Part::Loss;
    let lf = b.to_copy(logits, Dt::F32);
    // The labels are the batch's token ids tensor (`batch_bytes`: one `[b, s]` int64 for both),
    // which the embedding already keeps: not a second activation (a model-state origin keeps it
    // out of the ledger; like the batch it is never freed).
    let labels = b.external(Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None), Dt::I64, Origin::Buffer, false);
    let lsm = b.unary("_log_softmax", "LogSoftmaxBackward0", lf, super::super::blocks::Keep::Output, "_log_softmax_backward_data");
    let lb = b.bytes(lsm);
    let out = [b.out(Shape::scalar(), Dt::F32, true), b.out(Shape::scalar(), Dt::F32, false)];
    let sum = b.op(
        "nll_loss_forward",
        "NllLossBackward0",
        &[lsm, labels],
        &out,
        &[S::In(1), S::Out(1)],
        &[B::Alloc { bytes: lb, dtype: DType::Fp32, op: "nll_loss_backward" }, B::Grad { input: 0, temp: 0 }],
    );
    b.hold(lf);
    // global_valid_tokens: `ne`, `sum`, `.float()`.
    let bs = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None);
    let ne = b.plain("ne", &[labels], bs, Dt::Bool);
    let n = b.plain("sum", &[ne], Shape::scalar(), Dt::I64);
    let nf = b.plain("_to_copy", &[n], Shape::scalar(), Dt::F32);
    let loss = b.out(Shape::scalar(), Dt::F32, true);
    let r = b.op(
        "div",
        "DivBackward0",
        &[sum[0], nf],
        &[loss],
        &[S::In(1)],
        &[B::Alloc { bytes: 4, dtype: DType::Fp32, op: "div" }, B::Grad { input: 0, temp: 0 }],
    );
    b.hold(logits);
    b.outputs(&[r[0]]);
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

    /// torchtitan's Qwen3 keeps its own tensors (no rotary tables or shifted labels; cos and sin
    /// cut from its buffer), holds `rope_cache` (`[s, 2 × head_dim]` fp32) for the training
    /// sequence, and refuses by name what was not measured: its MoE and a tied output.
    #[test]
    fn torchtitan_qwen3_keeps_its_own_tensors_holds_rope_cache_and_refuses_moe_and_tying() {
        let base = Config { model: "qwen3-8b".into(), arch: preset("qwen3-8b").expect("preset").spec, seq: 4096, ..Config::default() };
        let tt = Config { framework: Framework::Torchtitan, ..base.clone() };
        let hf = estimate(&base).expect("hf estimates");
        assert_ne!(estimate(&tt).expect("torchtitan estimates").memory.activations, hf.memory.activations);
        assert_eq!(super::buffer_bytes(&tt), Some(4096 * 2 * 128 * 4));
        let moe = Config { arch: preset("qwen3-30b-a3b").expect("preset").spec, ..tt.clone() };
        assert!(estimate(&moe).is_err_and(|e| e.to_string().contains("Qwen3")));
        let tied = Config { arch: preset("qwen3-0.6b").expect("preset").spec, ..tt };
        assert!(estimate(&tied).is_err_and(|e| e.to_string().contains("enable_weight_tying")));
    }
}
