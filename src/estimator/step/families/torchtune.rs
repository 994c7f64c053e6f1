//! `framework = torchtune`: torchtune 0.6.1's own Llama 3 / 3.1 / 3.2
//! (`torchtune/models/llama3_1/_component_builders.py` `llama3_1`: `TransformerDecoder`,
//! `TransformerSelfAttentionLayer`, `MultiHeadAttention`, `RMSNorm`, `Llama3ScaledRoPE`,
//! `FeedForward`) and `recipes/full_finetune_single_device.py`'s loss step
//! (`CEWithChunkedOutputLoss(num_output_chunks=8)`, `modules/loss/ce_chunked_output_loss.py`).
//! Its activation checkpointing (`training.set_activation_checkpointing`: torch's
//! `apply_activation_checkpointing` on each `TransformerSelfAttentionLayer`, non-reentrant) is
//! the step's checkpoint region.
//!
//! Where it differs from transformers' `modeling_llama.py`, each measured in
//! `tests/fixtures/pytorch/frameworks/torchtune-llama3.json`:
//! - `RMSNorm.forward` is `F.rms_norm(x.float(), …, weight=self.scale).to(x.dtype)`: what
//!   `nn.RMSNorm` keeps ([`Rms::Torch`]: the fp32 input, the rsqrt, the fp32 normalized input);
//! - RoPE (`Llama3ScaledRoPE.forward`) runs in fp32 on interleaved pairs against the `cache`
//!   buffer: four products, a difference, a sum, `stack`, `type_as` ([`rope`]); it keeps nothing
//!   but the buffer;
//! - `MultiHeadAttention` repeats k and v to the query heads (`unsqueeze(2).expand(…)
//!   .flatten(1, 2)`: a copy, what SDPA keeps) and calls SDPA with `is_causal=True`: no mask;
//! - the output projection runs on 8 chunks of the sequence (`chunked_output`) and the loss
//!   upcasts one chunk at a time; labels are shifted by `hstack` with the recipe's
//!   `ignore_labels_cache`, and backward runs on `loss * current_num_tokens`.
//!
//! Projections, the SDPA core and `FeedForward` (`w2(silu(w1(x)) * w3(x))`) keep what
//! transformers' Llama keeps: they reuse its builders.
//!
//! The other families torchtune ships run the same decoder with what their builders change
//! ([`Decoder`]; each measured in `tests/fixtures/pytorch/frameworks/torchtune-<family>.json`):
//! Llama 2 and Mistral (`RotaryPositionalEmbeddings`: the same interleaved forward), Llama 3.2
//! (`TiedLinear`), Qwen2 / Qwen2.5 (q/k/v biases, `Qwen2RotaryPositionalEmbeddings`: [`rope_halves`]),
//! Phi-3 (separate q/k/v and gate/up: [`split_weights`]; `Phi3RotaryPositionalEmbeddings`), Gemma
//! (`GemmaNormEmbeddings`, `GemmaRMSNorm`, GeGLU, tied) and Gemma 2 (its own `Gemma2Attention` and
//! four norms a layer, below; `Gemma2FinalNorm`). torchtune 0.6.1 has no Qwen3.

use super::super::blocks::shapes::{heads, heads_bshd};
use super::super::blocks::Keep;
use super::super::ir::{Builder, DType, Dim, Dt, Origin, Shape, Split, Tid, B, S, X};
use super::common::{gated_mlp, head_proj, out_proj, sub, token_embedding, Act, AttnW, Gated, Kind, MlpW, Norm, Params, Rms, Shared};
use super::common::{GELU_TANH, LLAMA_MLP, SILU};
use super::llama::{decoder_layer_with, repeat_kv, sdpa_core, Residual};
use super::modeling::Modeling;
use crate::estimator::config::{Attention, Config, Framework};
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::ledger::Bytes;
use crate::estimator::model::{Linear, ModelSpec};
use crate::estimator::part::Part;

/// `CEWithChunkedOutputLoss(num_output_chunks=8)`, as every torchtune Llama 3 config sets it
/// (`model.set_num_output_chunks(self._loss_fn.num_output_chunks)` in the recipe).
pub const OUTPUT_CHUNKS: u64 = 8;

/// Bytes of one fp32 element (RoPE's `theta` and `cache`).
const FP32_BYTES: u128 = 4;

/// Bytes of one int64 element (the recipe's `ignore_labels_cache`).
const INT64_BYTES: u128 = 8;

/// torchtune's `RMSNorm` (`F.rms_norm` on the fp32 input), in the layers and after them.
const NORM: Norm = Norm::Rms(Rms::Torch);

/// The RoPE `cache` as the layers read it (`self.cache[:seq_len]`, `[s, d/2, 2]` fp32: the
/// bytes of `[s, d]`).
fn cache_shape() -> Shape {
    Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::D)], Split::None)
}

/// `Llama3ScaledRoPE.forward` on q or k laid out `[b, s, heads, d]`:
/// ```python
/// xshaped = x.float().reshape(*x.shape[:-1], -1, 2)
/// x_out = torch.stack([xshaped[..., 0] * rope_cache[..., 0] - xshaped[..., 1] * rope_cache[..., 1],
///                      xshaped[..., 1] * rope_cache[..., 0] + xshaped[..., 0] * rope_cache[..., 1]], -1)
/// return x_out.flatten(3).type_as(x)
/// ```
/// The cache needs no gradient: each product keeps only the cache (a buffer); the selects'
/// backward (`select_backward`) allocates the whole fp32 input. `xshaped` and `x_out` are the
/// function's locals.
pub(super) fn rope(b: &mut Builder, x: Tid, cache: Tid) -> Tid {
    let dt = b.t(x).dt;
    let x32 = b.to_copy(x, Dt::F32);
    let half = b.shape(x32).last(Dim::Half(Q::D));
    let x0 = b.slice(x32, half);
    let x1 = b.slice(x32, half);
    // `rope_cache[..., 0]` and `rope_cache[..., 1]`: views of half the cache, which each
    // product saves (packed at their own size under offloading: 2 · s · d/2 bytes each).
    let half_cache = Shape::new(&[Dim::Q(Q::S), Dim::Half(Q::D)], Split::None);
    let (c0, c1) = (b.view(cache, half_cache, "", false), b.view(cache, half_cache, "", false));
    let a = b.mul(x0, c0);
    let c = b.mul(x1, c1);
    let re = sub(b, a, c);
    let d = b.mul(x1, c0);
    let e = b.mul(x0, c1);
    let im = b.add(d, e);
    let full = b.shape(x32);
    let st = b.cat2(re, im, full);
    let out = b.to_copy(st, dt);
    b.hold(x32);
    b.hold(st);
    out
}

/// `MultiHeadAttention.forward` (self-attention, no KV cache, no q/k norms):
/// ```python
/// q = self.q_proj(x).view(b, s_x, self.num_kv_heads * q_per_kv, self.head_dim)
/// q = self.pos_embeddings(q, input_pos=input_pos).transpose(1, 2)
/// k = self.k_proj(y).view(b, s_y, -1, self.head_dim); v = self.v_proj(y).view(…)
/// k = self.pos_embeddings(k, input_pos=input_pos).transpose(1, 2); v = v.transpose(1, 2)
/// if self.num_heads != self.num_kv_heads:
///     k = k.unsqueeze(2).expand(expand_shape).flatten(1, 2)      # v alike
/// output = self._attention_call(q, k, v, mask=None, dropout_p=0.0, is_causal=True)
/// return self.output_proj(output.transpose(1, 2).contiguous().view(b, s_x, -1))
/// ```
fn attention(b: &mut Builder, w: &AttnW, x: Tid, sh: &Shared, pe: Rope) -> (Tid, Option<Tid>) {
    let qy = head_proj(b, x, w.wq, w.bq, Q::A, "attn.q_proj", Linear::Q);
    b.module = "attn";
    let q = b.view(qy, heads_bshd(Q::A), "ViewBackward0", false);
    let q = match sh.cos {
        Some(c) => pe.apply(b, q, c, sh.sin),
        None => q,
    };
    let qt = b.view(q, heads(Q::A), "TransposeBackward0", false);
    let ky = head_proj(b, x, w.wk, w.bk, Q::KV, "attn.k_proj", Linear::K);
    let vy = head_proj(b, x, w.wv, w.bv, Q::KV, "attn.v_proj", Linear::V);
    b.module = "attn";
    let k = b.view(ky, heads_bshd(Q::KV), "ViewBackward0", false);
    let v = b.view(vy, heads_bshd(Q::KV), "ViewBackward0", false);
    let k = match sh.cos {
        Some(c) => pe.apply(b, k, c, sh.sin),
        None => k,
    };
    let kt = b.view(k, heads(Q::KV), "TransposeBackward0", false);
    let vt = b.view(v, heads(Q::KV), "TransposeBackward0", false);
    b.part = Part::AttentionCore;
    let (kr, vr) = if b.c.n(Q::KV) != b.c.n(Q::A) { (repeat_kv(b, kt), repeat_kv(b, vt)) } else { (kt, vt) };
    let o = sdpa_core(b, qt, kr, vr);
    let out = out_proj(b, o, w.wo, w.bo, "attn.output_proj");
    (out, None)
}

/// `TransformerSelfAttentionLayer.forward`:
/// ```python
/// h = self.sa_norm(x)
/// attn_out = self.attn(h, h, mask=mask, input_pos=input_pos)
/// h = self.sa_scale(attn_out) + x                 # Identity
/// mlp_out = self.mlp(self.mlp_norm(h))
/// return h + self.mlp_scale(mlp_out)
/// ```
fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, code: &Decoder) -> Tid {
    let (aw, mw) = if spec.fused_qkv || spec.fused_gate_up { split_weights(b, p, spec) } else { (AttnW::new(b, p), MlpW::new(b, p)) };
    let pe = code.rope;
    let ffn = |b: &mut Builder, n: Tid| {
        b.part = Part::Mlp;
        gated_mlp(b, &mw, n, &Gated { act: code.act, ..LLAMA_MLP })
    };
    // `attn_out` is a name of its own: it lives to the return, and `h` (the norm's output) is
    // rebound at the residual add (measured: a checkpointed layer's re-run frees `attn_out`
    // only as its frame unwinds, tests/fixtures/pytorch/frameworks/steps/
    // torchtune-llama3-qlora__…__ckpt1__qlora-r8-qv.json).
    let how = Residual { attention_states: true, ..Residual::default() };
    decoder_layer_with(b, p, x, code.norm, how, |b, n| attention(b, &aw, n, sh, pe), |b, n| (ffn(b, n), None))
}

/// The layer's weights where transformers fuses what torchtune keeps apart: torchtune's `phi3`
/// builds `q_proj`, `k_proj`, `v_proj` and `FeedForward`'s `w1`, `w3` as separate linears
/// (`phi3/_convert_weights.py` splits `qkv_proj` and `gate_up_proj` on load): one parameter
/// each, of (a · d) × h, (k · d) × h twice, and f × h twice elements, in registration order
/// (q, k, v, output; gate, down, up).
pub(super) fn split_weights(b: &mut Builder, p: &Params, spec: &ModelSpec) -> (AttnW, MlpW) {
    let h = spec.hidden;
    let trains = |name: &str| p.find(name).is_none_or(|(_, t, _)| t);
    let aw = if spec.fused_qkv {
        let t = trains("layers.*.attn.qkv_proj.weight");
        let wq = Some(p.make(b, spec.heads * spec.head_dim * h, t, false));
        let wk = Some(p.make(b, spec.kv_heads * spec.head_dim * h, t, false));
        let wv = Some(p.make(b, spec.kv_heads * spec.head_dim * h, t, false));
        let wo = p.w(b, "layers.*.attn.o_proj.weight");
        AttnW { wq, bq: None, wk, bk: None, wv, bv: None, wo, bo: None, qn: None, kn: None }
    } else {
        AttnW::new(b, p)
    };
    let mw = if spec.fused_gate_up {
        let t = trains("layers.*.mlp.gate_up_proj.weight");
        let wg = Some(p.make(b, spec.ffn * h, t, false));
        let wd = p.w(b, "layers.*.mlp.down_proj.weight");
        let wu = Some(p.make(b, spec.ffn * h, t, false));
        MlpW { wg, wu, wd }
    } else {
        MlpW::new(b, p)
    };
    (aw, mw)
}

/// The rotary embedding a torchtune builder gives its attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rope {
    /// `RotaryPositionalEmbeddings` (Llama 2 / 3, Mistral) and `Llama3ScaledRoPE` (Llama 3.1 /
    /// 3.2): the same `forward` on interleaved pairs against a `[P, d/2, 2]` cache ([`rope`]).
    Interleaved,
    /// `Qwen2RotaryPositionalEmbeddings` (Qwen2, Qwen2.5): rotate-half against a `[P, 2d]`
    /// cache of cos then sin, cast to the input's dtype ([`rope_halves`]).
    Halves,
    /// `Phi3RotaryPositionalEmbeddings` (Phi-3): the same, without the cast: the products
    /// promote a bf16 input to fp32 and `type_as` casts the result back ([`rope_halves`]).
    HalvesFp32,
}

impl Rope {
    /// The embedding on `x`, reading the `cache` (Qwen2's, Phi-3's: its cos half, with `sin` its
    /// sin half).
    fn apply(self, b: &mut Builder, x: Tid, cache: Tid, sin: Option<Tid>) -> Tid {
        match (self, sin) {
            (Rope::Halves, Some(sin)) => rope_halves(b, x, cache, sin, true),
            (Rope::HalvesFp32, Some(sin)) => rope_halves(b, x, cache, sin, false),
            _ => rope(b, x, cache),
        }
    }

    /// Whether the layers read the cache as two halves, cos and sin (`[s, d]` each of the
    /// `[P, 2d]` rows), rather than one `[s, d/2, 2]` table.
    fn halves(self) -> bool {
        self != Rope::Interleaved
    }

    /// Elements of the `cache` buffer per position and head-dim element (`[P, d/2, 2]`: 1;
    /// `[P, 2d]`: 2).
    fn cache_per_position(self) -> u128 {
        match self {
            Rope::Interleaved => 1,
            Rope::Halves | Rope::HalvesFp32 => 2,
        }
    }
}

/// `Qwen2RotaryPositionalEmbeddings.forward` (`torchtune/models/qwen2/_positional_embeddings.py`)
/// on q or k laid out `[b, s, heads, d]`:
/// ```python
/// rope_cache = self.cache[:seq_len].view(-1, seq_len, 1, head_dim * 2)
/// cos = rope_cache[..., :head_dim].to(x.dtype)
/// sin = rope_cache[..., head_dim:].to(x.dtype)
/// x1 = x[..., : x.shape[-1] // 2]; x2 = x[..., x.shape[-1] // 2 :]
/// rotated = torch.cat((-x2, x1), dim=-1)
/// x_out = (x * cos) + (rotated * sin)
/// return x_out.type_as(x)
/// ```
/// The cache is fp32: in fp32 `cos` and `sin` are views of the buffer (nothing kept); in bf16
/// each call copies them (`[s, d]` bf16 each), and the products keep those copies. `cos`, `sin`
/// and `rotated` are the function's locals.
///
/// `Phi3RotaryPositionalEmbeddings.forward` (`cast` false) is the same without the two
/// `.to(x.dtype)`: a bf16 `x` times the fp32 cache promotes each product (and the sum) to fp32,
/// the products keep only the buffer, and `type_as(x)` copies the result back to bf16.
/// `cos` and `sin` are the buffer's two halves as the layers read them (views of the buffer).
fn rope_halves(b: &mut Builder, x: Tid, cos: Tid, sin: Tid, cast: bool) -> Tid {
    let dt = b.t(x).dt;
    let cos = if cast { b.to_copy(cos, dt) } else { cos };
    let sin = if cast { b.to_copy(sin, dt) } else { sin };
    let out = super::common::rope_rotated_halves(b, x, cos, sin, Dim::Half(Q::D));
    b.hold(cos);
    b.hold(sin);
    out
}

/// torchtune 0.6.1's decoder (`TransformerDecoder` of `TransformerSelfAttentionLayer`s, see the
/// module doc) with the rotary embedding, norm, activation and embedding its builder picks:
/// `llama3_1` / `llama3_2` / `llama3` / `llama2` / `mistral` ([`LLAMA`]), `qwen2` ([`QWEN2`]),
/// `phi3` ([`PHI3`]) or `gemma` ([`GEMMA`]).
pub struct Decoder {
    pub rope: Rope,
    /// `RMSNorm` (`F.rms_norm` on `x.float()`) or Gemma's `GemmaRMSNorm`.
    pub norm: Norm,
    /// `FeedForward`'s activation: `F.silu`, or Gemma's `nn.GELU(approximate="tanh")`.
    pub act: Act,
    /// Gemma's `GemmaNormEmbeddings`: the embedding times √h.
    pub scaled_embedding: bool,
    /// Gemma 2's layer: `Gemma2Attention`, four norms (below), `Gemma2FinalNorm`.
    pub gemma2: bool,
}

/// Llama 2 / 3 / 3.1 / 3.2 and Mistral (`RotaryPositionalEmbeddings`, `Llama3ScaledRoPE`).
pub const LLAMA: Decoder = Decoder { rope: Rope::Interleaved, norm: NORM, act: SILU, scaled_embedding: false, gemma2: false };
/// Qwen2 and Qwen2.5 (`qwen2`: q/k/v biases, `Qwen2RotaryPositionalEmbeddings`).
pub const QWEN2: Decoder = Decoder { rope: Rope::Halves, ..LLAMA };
/// Phi-3 (`phi3`: q, k, v and gate, up apart, `Phi3RotaryPositionalEmbeddings`).
pub const PHI3: Decoder = Decoder { rope: Rope::HalvesFp32, ..LLAMA };
/// Gemma (`gemma`: `GemmaNormEmbeddings`, `GemmaRMSNorm` — `_norm(x.float()) * (1 + scale.float())`,
/// then `type_as(x)`, transformers' `GemmaRMSNorm` line for line ([`Rms::Gemma`]) —,
/// `RotaryPositionalEmbeddings`, GeGLU, `TiedLinear`).
pub const GEMMA: Decoder =
    Decoder { rope: Rope::Interleaved, norm: Norm::Rms(Rms::Gemma), act: GELU_TANH, scaled_embedding: true, gemma2: false };
/// Gemma 2 (`gemma2`: Gemma's embedding, norm and MLP, its own `Gemma2Attention`, four norms a
/// layer, `Gemma2FinalNorm`).
pub const GEMMA2: Decoder = Decoder { gemma2: true, ..GEMMA };

/// `GemmaNormEmbeddings.forward` after the lookup: `x * torch.tensor(self.embedding_dim**0.5,
/// dtype=x.dtype)`. The factor is a fresh 0-dim tensor each forward (not a buffer), which the
/// product keeps; on CUDA it is a CPU tensor (`torch.tensor` without a device), here it is
/// what the CPU records count: 2 or 4 bytes.
fn scale_embedding(b: &mut Builder, x: Tid) -> Tid {
    let dt = b.t(x).dt;
    let scale = b.plain("scalar_tensor", &[], Shape::scalar(), dt);
    b.mul(x, scale)
}

impl Modeling for Decoder {
    /// `TransformerDecoder.forward` before the layers: `h = self.tok_embeddings(tokens)`; the
    /// layers read the shared RoPE module's `cache` buffer. A tied output (`TiedLinear`) reads
    /// the embedding's weight.
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        let (x0, emb_w) = token_embedding(b, p, ids, "tok_embeddings");
        let x0 = if self.scaled_embedding { scale_embedding(b, x0) } else { x0 };
        b.module = "";
        (x0, Shared { emb_w: super::common::tied(spec, emb_w), ..self.positions(b, spec, attn) })
    }
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        let _ = attn;
        let rope = super::common::has_rope(spec);
        let cos = rope.then(|| b.external(cache_shape(), Dt::F32, Origin::Buffer, false));
        let sin = (rope && self.rope.halves()).then(|| b.external(cache_shape(), Dt::F32, Origin::Buffer, false));
        Shared { cos, sin, ..Shared::default() }
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        let _ = (kind, attn);
        if self.gemma2 {
            gemma2_layer(b, p, spec, x, sh, self)
        } else {
            layer(b, p, spec, x, sh, self)
        }
    }
    fn norm(&self) -> Norm {
        self.norm
    }
    /// `self.norm(h)`; Gemma 2's `Gemma2FinalNorm` soft-caps the norm's output (`TanhSoftCapping`:
    /// `/ cap`, `tanh`, `* cap`, keeping the tanh) before the output projection.
    fn final_norm(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid) -> Tid {
        let _ = spec;
        let n = super::common::final_norm(b, p, "norm", self.norm, x);
        if self.gemma2 {
            super::gemma::softcap_logits(b, n)
        } else {
            n
        }
    }
    /// `h` is rebound by every layer.
    fn x0_is_local(&self) -> bool {
        false
    }
    /// The RoPE `cache` buffer (Qwen2's and Phi-3's as its cos and sin halves).
    fn rope_tables(&self, spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
        super::common::has_rope(spec).then(|| (cache_shape(), Dt::F32, self.rope.halves()))
    }
    /// The framework's own model code: SDPA with `is_causal=True` (no mask), RoPE tables as
    /// registered buffers, positions of its own ([`Modeling::framework_code`]).
    fn framework_code(&self) -> bool {
        true
    }
}

/// The torchtune program for `family`, where one is written (see `families::modeling_for`).
pub fn decoder(family: Family) -> Option<&'static Decoder> {
    match family {
        Family::Llama | Family::Mistral => Some(&LLAMA),
        Family::Qwen2 => Some(&QWEN2),
        Family::Phi3 => Some(&PHI3),
        Family::Gemma => Some(&GEMMA),
        Family::Gemma2 => Some(&GEMMA2),
        _ => None,
    }
}

/// torchtune's buffers: the one RoPE module every layer shares (`rope_init`: `theta` `[d/2]` and
/// `cache` — `[max_seq_len, d/2, 2]` in `RotaryPositionalEmbeddings` and `Llama3ScaledRoPE`,
/// `[max_seq_len, 2d]` in `Qwen2RotaryPositionalEmbeddings` —, fp32: computed with `.float()`,
/// so the recipe's `set_default_dtype(bf16)` leaves them fp32; `max_seq_len` is the model's,
/// `max_position_embeddings`) and the recipe's `ignore_labels_cache`
/// (`torch.full((batch_size, 1), ignore_index, device=self._device)`, int64):
/// (k · P · (d/2) · 2 + d/2) × 4 + b × 8, k = 1 (interleaved) or 2 (Qwen2). `None` for another
/// framework or family.
pub fn buffer_bytes(cfg: &Config) -> Option<Bytes> {
    let code = decoder(cfg.arch.family).filter(|_| cfg.framework == Framework::Torchtune)?;
    let half = (cfg.arch.head_dim / 2) as u128;
    let per = code.rope.cache_per_position();
    let rope = if super::common::has_rope(&cfg.arch) { (per * cfg.arch.max_pos as u128 * half * 2 + half) * FP32_BYTES } else { 0 };
    Some(rope * rope_modules(cfg) + cfg.batch as u128 * INT64_BYTES)
}

/// How many RoPE modules the builder makes: one, shared by every layer, in the full fine-tuning
/// builders and in `lora_llama3_1` / `lora_llama3_2`; one per layer in `lora_qwen2`
/// (`lora_qwen2_self_attention` builds its own `Qwen2RotaryPositionalEmbeddings`, torchtune
/// 0.6.1 `models/qwen2/_component_builders.py`; measured: tests/fixtures/pytorch/frameworks/
/// torchtune-qwen2-lora.json, 2 layers, two caches). `lora_llama2`, `lora_llama3`,
/// `lora_mistral`, `lora_phi3` and `lora_gemma` do as `lora_qwen2`: their LoRA is refused
/// (`validate.rs`, `torchtune_refusal`) but for Llama, which follows `lora_llama3_1`.
fn rope_modules(cfg: &Config) -> u128 {
    if cfg.finetune != crate::estimator::config::Finetune::Full && cfg.arch.family == Family::Qwen2 {
        cfg.arch.layers as u128
    } else {
        1
    }
}

/// The output chunks' token counts: `torch.chunk(h, 8, dim=1)` makes chunks of ⌈s/8⌉ tokens,
/// the last one what remains.
pub fn chunk_tokens(s: u64) -> (u64, u64, u64) {
    let c = s.div_ceil(OUTPUT_CHUNKS).max(1);
    let n = s.div_ceil(c);
    (c, n, s - (n - 1) * c)
}

/// `unembed` has returned, and `train()` / `_loss_step` begin: `TransformerDecoder.forward`
/// calls `self.unembed(h)`, whose `h = self.norm(h)` rebinds its own local, so the caller's `h`,
/// the last layer's output, lives until `unembed` returns the logits, and so does `xn`
/// (measured: both freed after the last output matmul, before the loss;
/// tests/fixtures/pytorch/frameworks/steps/torchtune-llama3__…__lora-r8-qv.json). Then
/// `current_num_tokens = (labels != ignore_index).sum()` and the shifted labels
/// `hstack((labels[..., 1:], ignore_labels_cache))`. The loss runs outside the offloading
/// context. The labels are the batch's token ids (`batch_bytes`), the cache a buffer
/// ([`buffer_bytes`]). Returns (the token count, the shifted labels).
fn loss_step_labels(b: &mut Builder, h: Tid, xn: Tid) -> (Tid, Tid) {
    b.hold(h);
    b.hold(xn);
    b.p.loss_from = b.next_op();
    b.p.loss_fn_from = b.p.loss_from;
    b.module = "loss_fn";
    b.part = Part::Loss;
    let bs = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None);
    let labels = b.external(bs, Dt::I64, Origin::Buffer, false);
    let ignore = b.external(Shape::new(&[Dim::Q(Q::B), Dim::N(1)], Split::None), Dt::I64, Origin::Buffer, false);
    let ne = b.plain("ne", &[labels], bs, Dt::Bool);
    let tokens = b.plain("sum", &[ne], Shape::scalar(), Dt::I64);
    let shifted = b.plain("cat", &[labels, ignore], bs, Dt::I64);
    (tokens, shifted)
}

/// The recipe with `loss: torch.nn.CrossEntropyLoss` in place of the configs' chunked loss
/// (torchtune 0.6.1 `TransformerDecoder.unembed` with `num_output_chunks = 0`, then
/// `full_finetune_single_device.py` `_loss_step`):
/// ```python
/// output = self.output(h).float()              # [b, s, V] in the model dtype, then its fp32 copy
/// labels = torch.hstack((labels[..., 1:], self.ignore_labels_cache[: labels.shape[0]]))
/// labels = labels.reshape(-1); logits = logits.reshape(-1, logits.size(-1))
/// loss = self._loss_fn(logits, labels)         # log-softmax (fp32, kept) and nll, mean
/// del logits
/// (loss * current_num_tokens).backward()
/// ```
/// The model-dtype logits go as `unembed` returns (nothing saves them; under autocast the
/// weight and the input are cast first); the fp32 copy lives through the loss. `compiled`
/// (`compile: True`): `training.compile_loss` compiles the whole loss module, whose input is
/// the fp32 copy: one region ([`Builder::compile_region`]) that keeps it and recomputes the
/// log-softmax, its backward one kernel ([`Builder::fuse_loss_backward`]). Measured:
/// `tests/fixtures/pytorch/frameworks/torchtune-llama3-ce.json` (fp32, bf16, bf16 autocast;
/// checkpointing off and on).
fn plain_head_and_loss(b: &mut Builder, h: Tid, xn: Tid, w: Option<Tid>, bias: Option<Tid>, compiled: bool) {
    let vocab = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::V)], Split::Tp);
    let autocast = b.autocast;
    let (x, w, bias) = if autocast {
        let x = b.to_copy(xn, Dt::Model);
        let part = b.part;
        b.part = Part::Autocast;
        let (w, bias) = (w.map(|w| b.cast_weight(w)), bias.map(|x| b.cast_weight(x)));
        b.part = part;
        (x, w, bias)
    } else {
        (xn, w, bias)
    };
    b.autocast = false;
    let logits = match w {
        Some(w) => b.linear(x, w, bias, vocab),
        None => b.plain("mm", &[x], vocab, Dt::Model),
    };
    b.autocast = autocast;
    let lf = b.to_copy(logits, Dt::F32);
    let (tokens, shifted) = loss_step_labels(b, h, xn);
    let first = b.next_op();
    let lsm = b.unary("_log_softmax", "LogSoftmaxBackward0", lf, Keep::Output, "_log_softmax_backward_data");
    let lb = b.bytes(lsm);
    let out = [b.out(Shape::scalar(), Dt::F32, true), b.out(Shape::scalar(), Dt::F32, false)];
    let ce = b.op(
        "nll_loss_forward",
        "NllLossBackward0",
        &[lsm, shifted],
        &out,
        // `reduction="mean"` reads `total_weight` in backward, compiled or not.
        &[S::In(1), S::Out(1)],
        &[B::Alloc { bytes: lb, dtype: DType::Fp32, op: "nll_loss_backward" }, B::Grad { input: 0, temp: 0 }],
    )[0];
    if compiled {
        let end = b.next_op();
        b.fuse_loss_backward(first, end, lf, b.bytes(shifted) / INT64_BYTES, false);
        b.compile_region(first, end, &[ce]);
    }
    // `del logits`.
    b.hold(lf);
    b.hold(shifted);
    let r = b.loss_scalar("mul", "MulBackward0", ce, Some(tokens));
    b.outputs(&[r]);
}

/// `TransformerDecoder.chunked_output` on `xn` (the final norm's output of `h`), then the
/// recipe's loss step:
/// ```python
/// current_num_tokens = (batch["labels"] != ignore_index).sum()            # train()
/// logits = [self.output(chunk) for chunk in h.chunk(8, dim=1)]            # chunked_output
/// labels = torch.hstack((labels[..., 1:], self.ignore_labels_cache[: labels.shape[0]]))
/// total_elements = (labels != ignore_index).sum()                          # CEWithChunkedOutputLoss
/// labels = [c.reshape(-1) for c in labels.chunk(8, dim=1)]
/// logits = [c.reshape(-1, c.size(-1)) for c in logits]
/// total_loss = 0.0
/// for logits_chunk, labels_chunk in zip(logits, labels):
///     total_loss += F.cross_entropy(logits_chunk.float(), labels_chunk, reduction="sum")
/// loss = total_loss / total_elements
/// del logits
/// (loss * current_num_tokens).backward()
/// ```
/// A chunk of a `[b, s, h]` tensor is not contiguous for b > 1: `linear`'s reshape copies it
/// (the copy is what `mm` keeps; under autocast the cast to bf16 is that copy). The labels'
/// chunks are copied alike. The chunks' logits live until the loss is computed; the fp32 copy
/// of one chunk lives through its `cross_entropy`.
///
/// `compiled` (the recipe's `compile: True`): `training.compile_loss` (torchtune 0.6.1
/// `training/_compile.py`) compiles `CEWithChunkedOutputLoss.compute_cross_entropy` alone —
/// `F.cross_entropy(logits.float(), labels, ignore_index, reduction="sum")` — so each chunk's
/// fp32 copy, log-softmax and sum are one compiled region, the same graph called once per chunk
/// ([`Builder::compile_region`], its backward one fused kernel: [`Builder::fuse_loss_backward`]);
/// the chunking, the running sum and the division stay eager. Measured
/// (`tests/fixtures/pytorch/frameworks/torchtune-llama3-compile.json`): each chunk keeps its
/// logits (the region's input, in their dtype), its labels and the fp32 row max and
/// log-sum-exp, not the fp32 log-softmax eager keeps.
pub fn head_and_loss(b: &mut Builder, h: Tid, xn: Tid, w: Option<Tid>, bias: Option<Tid>, compiled: bool, cpu: bool) {
    if b.c.cfg.loss == crate::estimator::config::Loss::Standard {
        return plain_head_and_loss(b, h, xn, w, bias, compiled);
    }
    let cpu_copies = compiled && cpu;
    let batch = b.c.n(Q::B);
    let (_, n, last) = chunk_tokens(b.c.n(Q::S));
    let c = b.xv[X::OutChunk as usize];
    let len = |i: u64| if i + 1 == n && last != c { Dim::N(last as u32) } else { Dim::X(X::OutChunk) };
    let autocast = b.autocast;
    // Under autocast the output weight is cast once, at the first chunk, and the cast cached
    // (`cached_cast`) for the other seven; each chunk's input is cast (a contiguous copy).
    let mut cast: Option<(Option<Tid>, Option<Tid>)> = None;
    // A frozen output weight (LoRA, QLoRA) on a chunk that is not contiguous (b > 1): `matmul`
    // does not fold ([`frozen_head`]).
    let bmm = !autocast && batch > 1 && bias.is_none() && w.is_some_and(|w| !b.rg(w));
    let mut logits = Vec::with_capacity(n as usize);
    for i in 0..n {
        let shape = Shape::new(&[Dim::Q(Q::B), len(i), Dim::Q(Q::H)], Split::None);
        let ch = b.view(xn, shape, "SplitBackward0", false);
        let ch = if autocast {
            b.to_copy(ch, Dt::Model)
        } else if bmm {
            ch
        } else if batch > 1 {
            b.copy(ch, shape)
        } else {
            ch
        };
        let (w, bias) = match (autocast, cast) {
            (false, _) => (w, bias),
            (true, Some(c)) => c,
            (true, None) => {
                let part = b.part;
                b.part = Part::Autocast;
                let c = (w.map(|w| b.cast_weight(w)), bias.map(|x| b.cast_weight(x)));
                b.part = part;
                cast = Some(c);
                c
            }
        };
        let vocab = Shape::new(&[Dim::Q(Q::B), len(i), Dim::Q(Q::V)], Split::Tp);
        b.autocast = false;
        logits.push(match w {
            Some(w) if bmm => frozen_head(b, ch, w, vocab, cpu_copies),
            Some(w) => b.linear(ch, w, bias, vocab),
            None => b.plain("mm", &[ch], vocab, Dt::Model),
        });
        b.autocast = autocast;
    }
    let (tokens, shifted) = loss_step_labels(b, h, xn);
    let bs = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None);
    let ne = b.plain("ne", &[shifted], bs, Dt::Bool);
    let total = b.plain("sum", &[ne], Shape::scalar(), Dt::I64);
    let targets: Vec<Tid> = (0..n)
        .map(|i| {
            let shape = Shape::new(&[Dim::Q(Q::B), len(i)], Split::None);
            if batch > 1 {
                b.plain("clone", &[shifted], shape, Dt::I64)
            } else {
                b.view(shifted, shape, "", false)
            }
        })
        .collect();
    let mut sum: Option<Tid> = None;
    for (&lg, &target) in logits.iter().zip(&targets) {
        let first = b.next_op();
        let lf = b.to_copy(lg, Dt::F32);
        let lsm = b.unary("_log_softmax", "LogSoftmaxBackward0", lf, super::super::blocks::Keep::Output, "_log_softmax_backward_data");
        let lb = b.bytes(lsm);
        let out = [b.out(Shape::scalar(), Dt::F32, true), b.out(Shape::scalar(), Dt::F32, false)];
        let ce = b.op(
            "nll_loss_forward",
            "NllLossBackward0",
            &[lsm, target],
            &out,
            // Compiled, the decomposed backward of `reduction="sum"` never reads `total_weight`
            // (as torchtitan's compiled loss: [`super::torchtitan::head_and_loss`]).
            if compiled { &[S::In(1)] } else { &[S::In(1), S::Out(1)] },
            &[B::Alloc { bytes: lb, dtype: DType::Fp32, op: "nll_loss_backward" }, B::Grad { input: 0, temp: 0 }],
        )[0];
        b.hold(lf);
        if compiled {
            let end = b.next_op();
            b.fuse_loss_backward(first, end, lg, b.bytes(target) / INT64_BYTES, false);
            b.compile_region(first, end, &[ce]);
        }
        sum = Some(match sum {
            None => b.add_scalar(ce),
            Some(s) => b.add(s, ce),
        });
    }
    let Some(sum) = sum else { return };
    let loss = b.loss_scalar("div", "DivBackward0", sum, Some(total));
    for t in logits.into_iter().chain(targets).chain([shifted]) {
        b.hold(t);
    }
    let r = b.loss_scalar("mul", "MulBackward0", loss, Some(tokens));
    b.outputs(&[r]);
}

/// The output projection on one chunk when its weight is frozen (LoRA, QLoRA: the output gets no
/// adapter, `apply_lora_to_output = False`) and the chunk is not contiguous (b > 1): `F.linear`
/// calls `matmul(x, weight.t())`, whose `should_fold` (torch 2.15
/// `aten/src/ATen/native/LinearAlgebra.cpp`) folds a `[b, c, h]` input into `mm` only when the
/// weight requires grad or the fold copies nothing; here it does neither, so `matmul` expands the
/// weight to `[b, h, V]` (a view) and calls `bmm` (`UnsafeViewBackward0` over `BmmBackward0`,
/// which keeps the weight — a parameter — for the input's gradient, not the chunk). Its backward
/// allocates the chunk's gradient `[b, c, h]`. Measured: no chunk copy is kept
/// (tests/fixtures/pytorch/frameworks/torchtune-llama3-lora.json, torchtune-qwen2-lora.json).
///
/// `cpu_copies`: the CPU `bmm` makes both operands contiguous inside the kernel — the chunk
/// (`[b, c, h]`) and the expanded weight (`[b, h, V]`, b copies of it) — and frees them when it
/// returns; its backward copies the expanded weight again for the input's gradient. The compiled
/// records' profiler sees those allocations
/// (tests/fixtures/pytorch/frameworks/steps/torchtune-llama3__…__lora-r8-qv.json: 2,048 B and
/// 256,000 B per chunk, the compiled loss keeping too little for them to hide); the eager
/// records' dispatch tracker sees only `bmm`'s output, so the eager estimate leaves them out.
fn frozen_head(b: &mut Builder, x: Tid, w: Tid, vocab: Shape, cpu_copies: bool) -> Tid {
    let dt = b.t(x).dt;
    let (xb, xd) = (b.bytes(x), b.t(x).dtype);
    let batch = b.c.n(Q::B) as u128;
    let wb = b.bytes(w) * batch;
    let out = b.out(vocab, dt, b.rg(x));
    let bw: &[B] = match (b.rg(x), cpu_copies) {
        (false, _) => &[],
        (true, false) => &[B::Alloc { bytes: xb, dtype: xd, op: "bmm" }, B::Grad { input: 0, temp: 0 }],
        (true, true) => &[
            B::Alloc { bytes: xb, dtype: xd, op: "bmm" },
            B::Alloc { bytes: wb, dtype: xd, op: "bmm" },
            B::Free(1),
            B::Grad { input: 0, temp: 0 },
        ],
    };
    let y = b.op("bmm", "BmmBackward0", &[x, w], &[out], &[S::In(1)], bw)[0];
    // The kernel allocates its output, then the two copies (measured in that order).
    if cpu_copies {
        let xs = b.shape(x);
        let xc = b.plain("clone", &[x], xs, dt);
        let ws = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::H), Dim::Q(Q::V)], Split::Tp);
        let wc = b.plain("clone", &[w], ws, dt);
        b.hold(xc);
        b.hold(wc);
    }
    y
}

// ---------------------------------------------------------------------------------------- Gemma 2
// `framework = torchtune`, Gemma 2: torchtune 0.6.1's `gemma2` builder
// (`torchtune/models/gemma2/_component_builders.py`): its own `Gemma2Attention`
// (`models/gemma2/_attention.py`: eager, q scaled in place, scores soft-capped, the causal and
// sliding-window masks built in each forward) in a `TransformerSelfAttentionLayer` with four
// `GemmaRMSNorm`s (`sa_norm`, `sa_scale`, `mlp_norm`, `mlp_scale`). The rest (embedding, RoPE,
// GeGLU, `Gemma2FinalNorm`, the chunked loss) is this file's. Measured in
// `tests/fixtures/pytorch/frameworks/torchtune-gemma2.json`.

/// `Gemma2Attention.forward` (`torchtune/models/gemma2/_attention.py`; no KV cache, no mask
/// passed):
/// ```python
/// q = self.q_proj(x).view(b, s_x, a, d); q = self.pos_embeddings(q).transpose(1, 2)
/// k = self.k_proj(y); v = self.v_proj(y); k = k.view(b, s_y, -1, d); k = self.pos_embeddings(k)
/// k = k.view(b, s_y, kv, 1, d); v = v.view(…)
/// if a != kv: k = k.expand(b, s_y, kv, q_per_kv, d); v = v.expand(…)
/// k = k.reshape(b, s_y, -1, d).transpose(1, 2); v = v.reshape(…).transpose(1, 2)   # copies
/// q.mul_(self.scaling)
/// output = torch.matmul(q, k.transpose(2, 3))
/// mask = torch.tril(torch.ones(size=(s_x, s_x), dtype=torch.bool))
/// mask = torch.where(mask.logical_not(), -2.3819763e38, 0)                       # fp32 [s, s]
/// if self.sliding_window_size is not None:
///     all_ones = torch.ones_like(mask)
///     sliding_mask = torch.triu(all_ones, -w + 1) * torch.tril(all_ones, w - 1)
///     mask = torch.where(sliding_mask == 1, mask, -2.3819763e38)
/// output = output / cap; output = torch.tanh(output); output = output * cap
/// output = output + mask                                   # fp32: the mask promotes bf16 scores
/// output = F.softmax(output.float(), dim=-1).type_as(q)
/// output = torch.matmul(output, v)
/// return self.output_proj(output.transpose(1, 2).contiguous().view(b, s_x, -1))
/// ```
/// q is scaled in place (nothing allocated; its backward a scaled gradient); matmul copies the
/// transposed q, k and v to fold them (each a second copy of the repeated k and v).
fn gemma2_attention(b: &mut Builder, w: &AttnW, x: Tid, sh: &Shared, sliding: bool) -> (Tid, Option<Tid>) {
    // `view(b, s, heads, d)`, then the positional embedding where the model has one.
    let heads_roped = |b: &mut Builder, y: Tid, n: Q| -> Tid {
        b.module = "attn";
        let t = b.view(y, heads_bshd(n), "ViewBackward0", false);
        match sh.cos {
            Some(c) => rope(b, t, c),
            None => t,
        }
    };
    let qy = head_proj(b, x, w.wq, w.bq, Q::A, "attn.q_proj", Linear::Q);
    let q = heads_roped(b, qy, Q::A);
    let qt = b.view(q, heads(Q::A), "TransposeBackward0", false);
    let ky = head_proj(b, x, w.wk, w.bk, Q::KV, "attn.k_proj", Linear::K);
    let vy = head_proj(b, x, w.wv, w.bv, Q::KV, "attn.v_proj", Linear::V);
    let k = heads_roped(b, ky, Q::KV);
    let v = b.view(vy, heads_bshd(Q::KV), "ViewBackward0", false);
    b.part = Part::AttentionCore;
    let gqa = b.c.n(Q::KV) != b.c.n(Q::A);
    // `expand(…).reshape(b, s, a, d)`: a copy whose gradient is summed over the repeats.
    let repeat = |b: &mut Builder, t: Tid| -> Tid {
        if !gqa {
            return b.view(t, heads_bshd(Q::A), "ViewBackward0", false);
        }
        let (bytes, dtype, rg) = (b.bytes(t), b.t(t).dtype, b.rg(t));
        let out = b.out(heads_bshd(Q::A), b.t(t).dt, rg);
        let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "sum" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
        b.op("clone", "ExpandBackward0", &[t], &[out], &[], bw)[0]
    };
    let kr = repeat(b, k);
    let vr = repeat(b, v);
    let kt = b.view(kr, heads(Q::A), "TransposeBackward0", false);
    let vt = b.view(vr, heads(Q::A), "TransposeBackward0", false);
    // `q.mul_(self.scaling)`: in place, MulBackward1 scales the gradient.
    let (qb, qd) = (b.bytes(qt), b.t(qt).dtype);
    let qo = b.view_out(qt, heads(Q::A));
    let qs =
        b.op("mul_", "MulBackward1", &[qt], &[qo], &[], &[B::Alloc { bytes: qb, dtype: qd, op: "mul" }, B::Grad { input: 0, temp: 0 }])[0];
    let qc = b.fold(qs, heads(Q::A));
    let kc = b.fold(kt, heads(Q::A));
    let sc = b.bmm(qc, kc, super::super::blocks::shapes::scores());
    // The mask, built in each forward: bool, then fp32 `[s, s]` (no gradient).
    let ss = Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None);
    let ones = b.plain("ones", &[], ss, Dt::Bool);
    let tril = b.plain("tril", &[ones], ss, Dt::Bool);
    let not = b.plain("logical_not", &[tril], ss, Dt::Bool);
    let mut mask = b.plain("where", &[not], ss, Dt::F32);
    if sliding {
        let all = b.plain("ones_like", &[mask], ss, Dt::F32);
        let up = b.plain("triu", &[all], ss, Dt::F32);
        let lo = b.plain("tril", &[all], ss, Dt::F32);
        let sw = b.plain("mul", &[up, lo], ss, Dt::F32);
        let eq = b.plain("eq", &[sw], ss, Dt::Bool);
        mask = b.plain("where", &[eq, mask], ss, Dt::F32);
        b.hold(all);
        b.hold(sw);
    }
    let dv = b.unary("div", "DivBackward1", sc, Keep::Nothing, "div");
    let th = b.unary("tanh", "TanhBackward0", dv, Keep::Output, "tanh_backward");
    let cap = b.mul_scalar(th);
    let sa = b.add(cap, mask);
    let s32 = b.to_copy(sa, Dt::F32);
    let pr = b.unary("_softmax", "SoftmaxBackward0", s32, Keep::Output, "_softmax_backward_data");
    let pc = b.to_copy(pr, b.t(qt).dt);
    let vc = b.fold(vt, heads(Q::A));
    let o = b.bmm(pc, vc, heads(Q::A));
    let o = b.view(o, heads(Q::A), "UnsafeViewBackward0", true);
    let ot = b.view(o, heads_bshd(Q::A), "TransposeBackward0", false);
    let oc = b.copy(ot, heads_bshd(Q::A));
    // The function's locals go at its return: the repeated k and v, the mask.
    b.hold(kr);
    b.hold(vr);
    b.hold(mask);
    let out = out_proj(b, oc, w.wo, w.bo, "attn.output_proj");
    (out, None)
}

/// `TransformerSelfAttentionLayer.forward` with Gemma 2's four norms:
/// ```python
/// h = self.sa_norm(x)
/// attn_out = self.attn(h, h, mask=mask, input_pos=input_pos)
/// h = self.sa_scale(attn_out) + x
/// mlp_out = self.mlp(self.mlp_norm(h))
/// return h + self.mlp_scale(mlp_out)
/// ```
/// The sliding window is on the even layers (`layer_idx % 2 == 0`), as transformers' Gemma 2
/// has it (the layer's view says which).
pub fn gemma2_layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, code: &Decoder) -> Tid {
    let (aw, mw) = if spec.fused_qkv || spec.fused_gate_up { split_weights(b, p, spec) } else { (AttnW::new(b, p), MlpW::new(b, p)) };
    let norm = code.norm;
    b.group = super::super::ir::Group::All;
    let nw: Vec<_> = (0..4).map(|_| norm.weights(b, p, super::common::LAYER_NORM)).collect();
    let run = |b: &mut Builder, i: usize, module: &'static str, x: Tid| {
        b.module = module;
        b.part = Part::Norms;
        norm.run(b, x, nw[i])
    };
    let h = run(b, 0, "sa_norm", x);
    let (a, _) = gemma2_attention(b, &aw, h, sh, sh.sliding);
    let a2 = run(b, 1, "sa_scale", a);
    b.module = "";
    let h2 = b.add(a2, x);
    b.hold(h);
    let n2 = run(b, 2, "mlp_norm", h2);
    b.part = Part::Mlp;
    let m = gated_mlp(b, &mw, n2, &Gated { act: code.act, ..LLAMA_MLP });
    let m2 = run(b, 3, "mlp_scale", m);
    b.module = "";
    let y = b.add(h2, m2);
    b.hold(m);
    b.hold(h2);
    y
}

#[cfg(test)]
mod tests {
    use crate::estimator::config::{Config, Framework, Loss, Precision};
    use crate::estimator::estimate;
    use crate::estimator::presets::preset;

    /// torchtune's Llama keeps other tensors than transformers' (fp32 normalized inputs, no
    /// rotary tables, repeated k and v, chunked logits), holds its RoPE cache for the model's
    /// `max_position_embeddings` and the recipe's ignore labels; another family is refused.
    #[test]
    fn torchtune_llama_keeps_its_own_tensors_holds_its_rope_cache_and_refuses_other_families() {
        let base = Config {
            model: "llama-3.1-8b".into(),
            arch: preset("llama-3.1-8b").expect("preset").spec,
            seq: 4096,
            precision: Precision::Bf16,
            loss: Loss::Chunked,
            ..Config::default()
        };
        let hf = estimate(&base).expect("hf estimates");
        let tt = estimate(&Config { framework: Framework::Torchtune, ..base.clone() }).expect("torchtune estimates");
        assert_ne!(tt.memory.activations, hf.memory.activations);
        let p = base.arch.max_pos as u128;
        assert_eq!(
            super::buffer_bytes(&Config { framework: Framework::Torchtune, ..base.clone() }),
            Some((p * 64 * 2 + 64) * 4 + base.batch as u128 * 8)
        );
        assert_eq!(super::buffer_bytes(&base), None);
        assert_eq!(super::chunk_tokens(64), (8, 8, 8));
        assert_eq!(super::chunk_tokens(100), (13, 8, 9));
        let qwen3 = preset("qwen3-8b").expect("a qwen3 preset").spec;
        assert!(estimate(&Config { framework: Framework::Torchtune, arch: qwen3, ..base.clone() }).is_err());
        // Mixed precision with fp32 master weights is not how torchtune trains: refused by name.
        let mixed = estimate(&Config { framework: Framework::Torchtune, precision: Precision::MixedBf16, ..base.clone() });
        assert!(mixed.is_err_and(|e| e.to_string().contains("torchtune")));
        // Its plain (unchunked) cross-entropy is another program: on Llama's measured full
        // fine-tune the whole fp32 logits and their log-softmax are alive at once (the chunks,
        // one eighth at a time), so it peaks higher; other families are refused, not estimated
        // as this one.
        let plain = Config { framework: Framework::Torchtune, loss: Loss::Standard, ..base.clone() };
        assert!(estimate(&plain).expect("plain cross-entropy").memory.peak > tt.memory.peak);
        let mistral = preset("mistral-7b-v0.1").map(|p| p.spec);
        if let Some(mistral) = mistral {
            assert!(estimate(&Config { arch: mistral, ..plain }).is_err_and(|e| e.to_string().contains("loss=standard")));
        }
    }

    /// A preset's model on torchtune's own code as its single-device recipes run it: bf16, 2,048
    /// tokens, the chunked loss.
    fn tune_config(name: &str) -> Config {
        Config {
            model: name.into(),
            arch: preset(name).expect("preset").spec,
            seq: 2048,
            precision: Precision::Bf16,
            loss: Loss::Chunked,
            framework: Framework::Torchtune,
            ..Config::default()
        }
    }

    /// `lora_qwen2` builds a RoPE module in every layer's attention, `lora_llama3_1` shares one
    /// (measured: tests/fixtures/pytorch/frameworks/torchtune-{qwen2,llama3}-lora.json); the full
    /// fine-tuning builders share one; torchtune's LoRA on Mistral is refused by name.
    #[test]
    fn a_lora_qwen2_holds_a_rope_cache_per_layer_and_a_lora_llama_one() {
        use crate::estimator::config::{Finetune, LoraDtype};
        let tune = |name: &str, finetune: Finetune| Config { finetune, lora_dtype: LoraDtype::Model, ..tune_config(name) };
        let (full, lora) = (tune("qwen2.5-7b", Finetune::Full), tune("qwen2.5-7b", Finetune::Lora));
        let ignore = lora.batch as u128 * 8;
        let one = super::buffer_bytes(&full).expect("torchtune") - ignore;
        assert_eq!(super::buffer_bytes(&lora), Some(one * lora.arch.layers as u128 + ignore));
        let llama = tune("llama-3.1-8b", Finetune::Lora);
        assert_eq!(super::buffer_bytes(&llama), super::buffer_bytes(&tune("llama-3.1-8b", Finetune::Full)));
        assert!(estimate(&lora).is_ok() && estimate(&llama).is_ok());
        let mistral = estimate(&tune("mistral-7b-v0.1", Finetune::Lora));
        assert!(mistral.is_err_and(|e| e.to_string().contains("lora_qwen2")));
    }

    /// Every family torchtune 0.6.1 ships that has a preset (Gemma has none: its records are in
    /// `framework_fixtures`) estimates; Qwen2's `[P, 2d]` RoPE cache holds twice Llama's; Qwen3
    /// (not in torchtune 0.6.1) and Qwen3-MoE are refused by name.
    #[test]
    fn torchtune_estimates_each_family_it_ships_and_refuses_qwen3_by_name() {
        let tune = tune_config;
        for name in ["llama-3.2-1b", "mistral-7b-v0.1", "qwen2.5-0.5b", "qwen2.5-7b", "phi-3-mini-4k-instruct", "llama-2-7b", "gemma-2-9b"]
        {
            assert!(estimate(&tune(name)).is_ok(), "{name}");
        }
        let q = tune("qwen2.5-7b");
        let (p, half) = (q.arch.max_pos as u128, (q.arch.head_dim / 2) as u128);
        assert_eq!(super::buffer_bytes(&q), Some((2 * p * half * 2 + half) * 4 + q.batch as u128 * 8));
        for name in ["qwen3-8b", "qwen3-30b-a3b"] {
            let e = estimate(&tune(name));
            assert!(e.is_err_and(|e| e.to_string().contains("torchtune")), "{name}");
        }
    }
}
