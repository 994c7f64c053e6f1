//! Llama and the families written like it (`modeling_llama.py`, and Mistral, Qwen2, Qwen3,
//! Mixtral …, which transformers generates from it with `# Copied from` / modular code):
//! pre-norm decoder layers of RMSNorm → attention with RoPE → residual → RMSNorm → gated MLP
//! (or a sparse MoE block) → residual.
//!
//! What other families reuse of it lives here, with parameters where they differ: the
//! attention ([`attention_with`]: where the q/k norms sit), RoPE ([`rope`], [`rope_qk`]) and the
//! partial RoPEs ([`rope_partial`]), the attention core ([`attend`], [`attend_out`], [`Core`]),
//! and the decoder layer ([`decoder_layer`], [`decoder_layer_with`] and [`Residual`]: Llama 4's
//! named attention output, Phi-3's residual dropouts, an MoE block's `_`), with its
//! feed-forward block ([`Ffn`]).

use super::super::blocks::shapes::{heads, heads_bshd};
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Group, Shape, Split, Tid, X};
use super::common::{
    cache_position, cat_promote, causal_mask, dropout, gated_mlp, has_rope, head_proj, nope_view, out_proj, rms_norm, rope_pair,
    rotary_dims,
};
use super::common::{AttnW, Kind, MlpW, Norm, Params, Rms, Shared, LAYER_NORM, LLAMA_MLP};
use super::moe::{MoeW, Topk};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::model::{Linear, ModelSpec, QkNorm};
use crate::estimator::part::Part;

/// `apply_rotary_pos_emb(q, k, cos, sin)` on one of them:
/// `x_embed = (x * cos) + (rotate_half(x) * sin)`, `rotate_half(x) = cat((-x2, x1), -1)`.
/// Keeps nothing new (cos and sin are the model's).
pub fn rope(b: &mut Builder, x: Tid, cos: Tid, sin: Tid, kv: Q) -> Tid {
    let _ = kv;
    let full = b.shape(x);
    let n = full.n as usize;
    let half = match full.dims[n - 1] {
        Dim::Q(q) => Dim::Half(q),
        Dim::X(x) => Dim::HalfX(x),
        d => d,
    };
    let m1 = b.mul(x, cos);
    let x1 = b.slice_last(x, half);
    let x2 = b.slice_last(x, half);
    let ng = b.unary("neg", "NegBackward0", x2, Keep::Nothing, "neg");
    let ct = b.cat2(ng, x1, full);
    let m2 = b.mul(ct, sin);
    b.add(m1, m2)
}

/// How a family writes its partial rotary embedding (see [`rope_partial`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct PartialRope {
    /// q is rotated and joined before k is (Phi-3's `apply_rotary_pos_emb`); else both are
    /// rotated, then both joined (Phi's, GPT-NeoX's, GLM-4.5's).
    pub q_first: bool,
    /// A slice over every dim stays a slice (GLM-4.5's); else it is an alias.
    pub slice_full: bool,
    /// `torch.cat` promotes the pass-through part to the rotated part's dtype (GLM-4.5's: under
    /// autocast, RoPE's product with the tables is wider than the projection).
    pub promote: bool,
    /// The rotated and passed parts stay bound until the attention returns (Phi's
    /// `query_rot`, `query_pass`); GPT-NeoX's `apply_rotary_pos_emb` rebinds them at once.
    pub named: bool,
}

/// A partial rotary embedding (Phi's attention, GPT-NeoX's, Phi-3's and GLM-4.5's
/// `apply_rotary_pos_emb`):
/// ```python
/// q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
/// k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
/// q_embed = (q_rot * cos) + (rotate_half(q_rot) * sin)      # [`rope`]; k_embed alike
/// q_embed = torch.cat([q_embed, q_pass], dim=-1)            # k_embed alike
/// ```
/// All four slices first, then the rotations and the concatenations in the order `how` says —
/// a full copy even when every dim rotates (`x_pass` is then empty). Returns the new q and k.
pub fn rope_partial(b: &mut Builder, spec: &ModelSpec, q: Tid, k: Tid, cos: Tid, sin: Tid, how: PartialRope) -> (Tid, Tid) {
    let rot = if rotary_dims(spec) == spec.head_dim { Dim::Q(Q::D) } else { Dim::X(X::DRot) };
    let alias = !how.slice_full && rot == Dim::Q(Q::D);
    let split = |b: &mut Builder, x: Tid| {
        let full = b.shape(x);
        let r = if alias { b.alias(x) } else { b.slice(x, full.last(rot)) };
        (r, b.slice(x, full.last(Dim::N(0))))
    };
    let cat = |b: &mut Builder, r: Tid, pass: Tid, x: Tid| {
        let shape = b.shape(x);
        if how.promote {
            cat_promote(b, r, pass, shape)
        } else {
            b.cat2(r, pass, shape)
        }
    };
    let (qr, qp) = split(b, q);
    let (kr, kp) = split(b, k);
    if how.q_first {
        let r = rope(b, qr, cos, sin, Q::A);
        let qe = cat(b, r, qp, q);
        let r = rope(b, kr, cos, sin, Q::KV);
        return (qe, cat(b, r, kp, k));
    }
    let qr = rope(b, qr, cos, sin, Q::A);
    let kr = rope(b, kr, cos, sin, Q::KV);
    let qe = cat(b, qr, qp, q);
    let ke = cat(b, kr, kp, k);
    if how.named {
        for t in [qr, kr, qp, kp] {
            b.hold(t);
        }
    }
    (qe, ke)
}

/// The attention block (`LlamaAttention.forward` with the `sdpa` or `eager` interface): the
/// q, k, v projections and their head views (Qwen3's per-head q/k norms on the `[b, s, heads,
/// d]` views), RoPE, the attention core, `o_proj`. Returns the output and `attn_weights` (eager:
/// the probabilities, which the caller's `_` holds until the decoder layer returns).
pub fn attention(b: &mut Builder, w: &AttnW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    attention_with(b, w, spec, x, sh, attn, HeadNorm::Bshd(Rms::Llama))
}

/// Where an attention normalizes q and k per head (`q_norm`, `k_norm` over `head_dim`, when the
/// spec has per-head q/k norms), and with which RMSNorm.
#[derive(Clone, Copy, Debug)]
pub enum HeadNorm {
    /// On each projection's `[b, s, heads, d]` view, before its transpose (Qwen3:
    /// `self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)`).
    Bshd(Rms),
    /// On the transposed `[b, heads, s, d]` q and k, after all three projections (Gemma-3:
    /// `query_states = self.q_norm(query_states)`); RoPE then runs in `k_norm`'s module.
    Bhsd(Rms),
}

/// [`attention`] with the q/k norms `head_norm` (Gemma's `Gemma2Attention.forward` and
/// `Gemma3Attention.forward` are Llama's with Gemma-3's norms on the transposed views).
pub fn attention_with(
    b: &mut Builder,
    w: &AttnW,
    spec: &ModelSpec,
    x: Tid,
    sh: &Shared,
    attn: Attention,
    head_norm: HeadNorm,
) -> (Tid, Option<Tid>) {
    let eager = attn == Attention::Eager;
    let per_head = spec.qk_norm == QkNorm::Head;
    let (on_views, on_heads) = match head_norm {
        HeadNorm::Bshd(form) => (per_head.then_some(form), None),
        HeadNorm::Bhsd(form) => (None, per_head.then_some(form)),
    };
    let proj = |b: &mut Builder,
                (w, bias): (Option<Tid>, Option<Tid>),
                h: Q,
                module: &'static str,
                norm: Option<(Option<Tid>, &'static str)>,
                clone_bw: bool,
                lin: Linear| {
        let y = head_proj(b, x, w, bias, h, module, lin);
        b.module = "self_attn";
        let mut v = b.view(y, heads_bshd(h), "ViewBackward0", clone_bw);
        if let (Some(form), Some((nw, module))) = (on_views, norm) {
            b.module = module;
            b.part = Part::AttentionCore;
            v = rms_norm(b, v, nw, form);
            b.module = "self_attn";
        }
        b.view(v, heads(h), "TransposeBackward0", false)
    };
    // The gradients of q and k come back through RoPE in a layout `reshape` must copy; v's
    // (from SDPA, laid out like v) views, except after eager attention's bmm. A NoPE layer (no
    // cos/sin in its view) hands q and k to the core as it hands v.
    let qk_clone = !nope_view(spec, sh) || eager;
    let q = proj(b, (w.wq, w.bq), Q::A, "self_attn.q_proj", Some((w.qn, "self_attn.q_norm")), qk_clone, Linear::Q);
    let k = proj(b, (w.wk, w.bk), Q::KV, "self_attn.k_proj", Some((w.kn, "self_attn.k_norm")), qk_clone, Linear::K);
    // A mask under SDPA (a sliding window shorter than the keys, `mistral.rs`) repeats k and v:
    // v's gradient then comes back from a `sum`, laid out like eager's.
    let masked_sdpa = !eager && sh.mask.is_some();
    let v = proj(b, (w.wv, w.bv), Q::KV, "self_attn.v_proj", None, eager || masked_sdpa, Linear::V);
    b.part = Part::AttentionCore;
    let (q, k) = match on_heads {
        Some(form) => {
            b.module = "self_attn.q_norm";
            let qn = rms_norm(b, q, w.qn, form);
            b.module = "self_attn.k_norm";
            (qn, rms_norm(b, k, w.kn, form))
        }
        None => (q, k),
    };
    let (q, k) = rope_qk(b, q, k, full_rope(spec, sh));
    attend_out(b, spec, [q, k, v], sh, attn, Core::LLAMA, (w.wo, w.bo))
}

/// The layer's cos and sin where it rotates every dim of its heads (Llama's RoPE: none on a
/// NoPE layer).
pub fn full_rope(spec: &ModelSpec, sh: &Shared) -> Option<(Tid, Tid)> {
    sh.cos.zip(sh.sin).filter(|_| has_rope(spec) && rotary_dims(spec) == spec.head_dim)
}

/// `q, k = apply_rotary_pos_emb(q, k, cos, sin)` with the layer's tables: the rotated q and k;
/// the names bound to the projections' views are rebound after both.
pub fn rope_qk(b: &mut Builder, q: Tid, k: Tid, tables: Option<(Tid, Tid)>) -> (Tid, Tid) {
    let Some((cos, sin)) = tables else { return (q, k) };
    let qe = rope(b, q, cos, sin, Q::A);
    let ke = rope(b, k, cos, sin, Q::KV);
    b.hold(q);
    b.hold(k);
    (qe, ke)
}

/// `attention_interface(self, q, k, v, attention_mask, …)`: `eager_attention_forward`
/// ([`eager_core_as`]), or SDPA with the layer's mask ([`sdpa_masked`]: k and v repeated) or
/// causal ([`sdpa_core_copy`]) — as `how` says, and where it says so inside a
/// selective-recomputation region ([`selective_begin`]). Returns the output, `attn_weights`
/// and the q, k, v the core received (the forward's locals, held by the caller until it
/// returns).
pub fn attend(
    b: &mut Builder,
    spec: &ModelSpec,
    qkv: [Tid; 3],
    mask: Option<Tid>,
    attn: Attention,
    how: Core,
) -> (Tid, Option<Tid>, [Tid; 3]) {
    let [q, k, v] = qkv;
    let (region, q, k, v) = if how.selective { selective_begin(b, q, k, v) } else { (None, q, k, v) };
    let (o, weights) = match mask {
        _ if attn == Attention::Eager => eager_core_as(b, spec, [q, k, v], mask, how),
        Some(m) => (sdpa_masked(b, q, k, v, m), None),
        None => (sdpa_core_copy(b, q, k, v, how.contiguous), None),
    };
    selective_end(b, region);
    (o, weights, [q, k, v])
}

/// The attention's end from q, k, v, in `self_attn`: the core ([`attend`], as `how` says) and
/// `o_proj` (`wo`: weight, bias); the q, k, v the core received are the forward's locals.
#[allow(clippy::too_many_arguments)]
pub fn attend_out(
    b: &mut Builder,
    spec: &ModelSpec,
    qkv: [Tid; 3],
    sh: &Shared,
    attn: Attention,
    how: Core,
    wo: (Option<Tid>, Option<Tid>),
) -> (Tid, Option<Tid>) {
    b.module = "self_attn";
    let (o, weights, kept) = attend(b, spec, qkv, sh.mask, attn, how);
    let out = out_proj(b, o, wo.0, wo.1, "self_attn.o_proj");
    for t in kept {
        b.hold(t);
    }
    (out, weights)
}

/// How the attention core receives q and k and runs.
#[derive(Clone, Copy, Debug)]
pub struct Core {
    /// q and k are contiguous `[b, heads, s, d]` (a `cat`): matmul's reshapes view them, and
    /// SDPA's output, laid out like q, is copied by the caller's reshape.
    pub contiguous: bool,
    /// `eager_attention_forward`'s softmax runs in fp32 and is cast back to q's dtype (Llama's
    /// `softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)`); else in the
    /// scores' own dtype (Llama 4's and GPT-2's `softmax(attn_weights, dim=-1)`, which rebinds
    /// `attn_weights` itself).
    pub fp32: bool,
    /// Selective recomputation makes the core a checkpoint region (GLM-4.5's and Phi-3's code
    /// is built without one).
    pub selective: bool,
}

impl Core {
    /// Llama's: q and k as RoPE leaves them (transposed views), fp32 softmax.
    pub const LLAMA: Core = Core { contiguous: false, fp32: true, selective: true };
    /// q and k concatenated by a partial RoPE (Phi, GPT-NeoX, StableLM; GLM-4.5, Phi-3).
    pub const CONTIGUOUS: Core = Core { contiguous: true, fp32: true, selective: true };
}

/// Selective recomputation (Megatron's, Korthikanti et al. 2022 §5): the attention core
/// between q, k, v and its output is a checkpoint region that keeps q, k, v — in the compute
/// dtype, as Megatron's `CoreAttention` receives them (under autocast the casts the kernel would
/// make come first and are what the region keeps). Returns the region and the q, k, v to use.
pub fn selective_begin(b: &mut Builder, q: Tid, k: Tid, v: Tid) -> (Option<usize>, Tid, Tid, Tid) {
    use super::super::ir::Save;
    if !b.selective {
        return (None, q, k, v);
    }
    let (q, k, v) = (b.autocast_in(q), b.autocast_in(k), b.autocast_in(v));
    let g = b.group;
    let r = b.begin_checkpoint(vec![
        Save { t: q, part: Part::AttentionCore, group: g },
        Save { t: k, part: Part::AttentionCore, group: g },
        Save { t: v, part: Part::AttentionCore, group: g },
    ]);
    (Some(r), q, k, v)
}

pub fn selective_end(b: &mut Builder, region: Option<usize>) {
    if let Some(r) = region {
        b.end_checkpoint(r);
    }
}

/// `sdpa_attention_forward`: `F.scaled_dot_product_attention(q, k, v, is_causal=True,
/// enable_gqa=…)` then `transpose(1, 2).contiguous()` (a view: the CPU flash kernel returns its
/// output in `[b, s, a, d]` layout) and the reshape to `[b, s, a·d]`.
pub fn sdpa_core(b: &mut Builder, q: Tid, k: Tid, v: Tid) -> Tid {
    sdpa_core_copy(b, q, k, v, false)
}

/// [`sdpa_core`]; `copy_out`: q was contiguous `[b, a, s, d]` (a `cat`), so the output is too
/// and `transpose(1, 2).reshape(…)` copies it.
pub fn sdpa_core_copy(b: &mut Builder, q: Tid, k: Tid, v: Tid, copy_out: bool) -> Tid {
    if b.dropout && !b.c.cuda {
        return sdpa_math(b, q, k, v);
    }
    let (o, _lse) = b.sdpa_flash(
        q,
        k,
        v,
        "_scaled_dot_product_flash_attention_for_cpu",
        "ScaledDotProductFlashAttentionForCpuBackward0",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    );
    let ot = b.view(o, heads_bshd(Q::A), "TransposeBackward0", false);
    let ot = if copy_out { b.copy(ot, heads_bshd(Q::A)) } else { ot };
    b.view(ot, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::A), Dim::Q(Q::D)], Split::Tp), "ViewBackward0", false)
}

/// `_scaled_dot_product_attention_math`, what CPU SDPA runs with dropout: q, k, v upcast to
/// fp32 and scaled by √scale, k and v repeated to a heads (GQA), the scores, `_safe_softmax`,
/// dropout, the product with v, cast back; returns `[b, s, a·d]` as SDPA's caller reshapes it.
pub fn sdpa_math(b: &mut Builder, q: Tid, k: Tid, v: Tid) -> Tid {
    let out_dt = b.t(q).dt;
    let up = |b: &mut Builder, x: Tid| {
        let x32 = b.to_copy(x, Dt::F32);
        b.mul_scalar(x32)
    };
    let qs = up(b, q);
    let ks = up(b, k);
    let gqa = b.c.n(Q::KV) != b.c.n(Q::A);
    let kr = if gqa { repeat_kv(b, ks) } else { b.copy(ks, heads(Q::A)) };
    let v32 = b.to_copy(v, Dt::F32);
    let vr = if gqa { repeat_kv(b, v32) } else { b.copy(v32, heads(Q::A)) };
    let sc = b.bmm(qs, kr, scores_shape());
    let sm = b.unary("_safe_softmax", "SafeSoftmaxBackward0", sc, Keep::Output, "_softmax_backward_data");
    let sd = b.dropout(sm);
    let o = b.bmm(sd, vr, heads(Q::A));
    let o = b.to_copy(o, out_dt);
    let ot = b.view(o, heads_bshd(Q::A), "TransposeBackward0", false);
    let oc = b.copy(ot, heads_bshd(Q::A));
    b.view(oc, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::A), Dim::Q(Q::D)], Split::Tp), "ViewBackward0", false)
}

/// `eager_attention_forward`:
/// ```python
/// key_states = repeat_kv(key, n_rep); value_states = repeat_kv(value, n_rep)
/// attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
/// attn_weights = attn_weights + causal_mask
/// attn_weights = softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
/// attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
/// ```
/// `matmul` copies q (RoPE's output is laid out `[b, s, a, d]`) and the repeated k, v;
/// `bmm` keeps its operands; softmax keeps its fp32 result; `.to(query.dtype)` keeps the cast.
pub fn eager_core(b: &mut Builder, spec: &ModelSpec, q: Tid, k: Tid, v: Tid, mask: Option<Tid>) -> (Tid, Option<Tid>) {
    eager_core_with(b, spec, q, k, v, mask, false)
}

/// [`eager_core`]; `contiguous`: q and k are contiguous `[b, heads, s, d]` (a `cat`), so
/// matmul's reshapes view them instead of copying.
pub fn eager_core_with(
    b: &mut Builder,
    spec: &ModelSpec,
    q: Tid,
    k: Tid,
    v: Tid,
    mask: Option<Tid>,
    contiguous: bool,
) -> (Tid, Option<Tid>) {
    eager_core_as(b, spec, [q, k, v], mask, Core { contiguous, ..Core::LLAMA })
}

/// [`eager_core_with`] as `how` says (q and k contiguous; the softmax's dtype).
pub fn eager_core_as(b: &mut Builder, spec: &ModelSpec, qkv: [Tid; 3], mask: Option<Tid>, how: Core) -> (Tid, Option<Tid>) {
    let [q, k, v] = qkv;
    let Core { contiguous, fp32, .. } = how;
    // With grouped heads, repeat_kv's expand + reshape copies k and v to a heads (held by the
    // function's locals); with n_rep = 1 it returns its input and matmul's reshapes copy them.
    let gqa = b.c.n(Q::KV) != b.c.n(Q::A);
    let (kr, vr) = if gqa { (Some(repeat_kv(b, k)), Some(repeat_kv(b, v))) } else { (None, None) };
    let qc = if contiguous { q } else { b.fold(q, heads(Q::A)) };
    let kc = match kr {
        Some(kr) => kr,
        None if contiguous => k,
        None => b.fold(k, heads(Q::A)),
    };
    let sc = b.bmm(qc, kc, scores_shape());
    let sm = b.mul_scalar(sc);
    // Gemma-2's attention soft-capping (`attn_logit_softcapping`): `scores / cap`, `tanh`,
    // `* cap`, before the mask (`modeling_gemma2.py`, `eager_attention_forward`).
    let sm = if spec.softcap {
        let dv = b.unary("div", "DivBackward1", sm, Keep::Nothing, "div");
        let th = b.unary("tanh", "TanhBackward0", dv, Keep::Output, "tanh_backward");
        b.mul_scalar(th)
    } else {
        sm
    };
    let sa = match mask {
        Some(m) => b.add(sm, m),
        None => sm,
    };
    let s32 = if fp32 { b.to_copy(sa, Dt::F32) } else { sa };
    let pr = b.unary("_softmax", "SoftmaxBackward0", s32, Keep::Output, "_softmax_backward_data");
    let pc = if fp32 { b.to_copy(pr, b.t(q).dt) } else { pr };
    // `attn_weights` names the masked scores until `softmax(…).to(query.dtype)` rebinds it.
    b.hold(sa);
    let pc = b.dropout(pc);
    let vc = match vr {
        Some(vr) => vr,
        None => b.fold(v, heads(Q::A)),
    };
    let o = b.bmm(pc, vc, heads(Q::A));
    // matmul's `_unsafe_view` back to [b, a, s, d]: its gradient arrives transposed (from the
    // `.contiguous()` copy below) and is copied by the reshape.
    let o = b.view(o, heads(Q::A), "UnsafeViewBackward0", true);
    let ot = b.view(o, heads_bshd(Q::A), "TransposeBackward0", false);
    let oc = b.copy(ot, heads_bshd(Q::A));
    // The function's locals (the repeated k and v) go at its return; `attn_weights` is returned.
    if let (Some(kr), Some(vr)) = (kr, vr) {
        b.hold(kr);
        b.hold(vr);
    }
    let out = b.view(oc, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::A), Dim::Q(Q::D)], Split::Tp), "ViewBackward0", false);
    (out, Some(pc))
}

fn scores_shape() -> Shape {
    super::super::blocks::shapes::scores()
}

/// `repeat_kv`: `x[:, :, None].expand(b, k, n_rep, s, d).reshape(b, a, s, d)` — a copy whose
/// gradient is summed back over the repeats (ExpandBackward0).
pub fn repeat_kv(b: &mut Builder, x: Tid) -> Tid {
    let (bytes, dtype, rg) = (b.bytes(x), b.t(x).dtype, b.rg(x));
    let e = b.view(x, heads(Q::KV), "UnsqueezeBackward0", false);
    let shape = heads(Q::A);
    let out = b.out(shape, b.t(x).dt, rg);
    use super::super::ir::B;
    let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "sum" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    b.op("clone", "ExpandBackward0", &[e], &[out], &[], bw)[0]
}

/// The gated MLP (`LlamaMLP`): `down_proj(act_fn(gate_proj(x)) * up_proj(x))`, SiLU.
pub fn mlp(b: &mut Builder, w: &MlpW, x: Tid) -> Tid {
    b.part = Part::Mlp;
    gated_mlp(b, w, x, &LLAMA_MLP)
}

/// One decoder layer (`LlamaDecoderLayer.forward`, [`decoder_layer`]): Llama's attention, and
/// the gated MLP or Mixtral's sparse block (`MixtralSparseMoeBlock`, renormalised top-k).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    // Parameters in registration order: self_attn, mlp, input_layernorm, post_attention_layernorm.
    let aw = AttnW::new(b, p);
    let ffn = Ffn::new(b, p, kind, MoeW::new);
    let mlp = |b: &mut Builder, n: Tid| ffn.forward(b, n, |b, w, n| super::moe::sparse_block(b, &w, None, n, Topk::MIXTRAL));
    decoder_layer(b, p, x, Norm::Rms(Rms::Llama), |b, n| attention(b, &aw, spec, n, sh, attn), mlp)
}

/// A decoder layer's feed-forward block: the gated MLP (`LlamaMLP`, [`mlp`]) on a dense layer,
/// a family's MoE block (`M`: its parameters) on an MoE layer.
pub enum Ffn<M> {
    Dense(MlpW),
    Moe(M),
}

impl<M> Ffn<M> {
    /// Registers the block's parameters for a layer of `kind` (`moe`: the MoE block's).
    pub fn new(b: &mut Builder, p: &Params, kind: Kind, moe: impl FnOnce(&mut Builder, &Params) -> M) -> Ffn<M> {
        match kind {
            Kind::Moe => Ffn::Moe(moe(b, p)),
            Kind::Dense => Ffn::Dense(MlpW::new(b, p)),
        }
    }

    /// The block on `x` ([`in_group`]): the gated MLP, or `moe` on the MoE block's parameters.
    pub fn forward(self, b: &mut Builder, x: Tid, moe: impl FnOnce(&mut Builder, M, Tid) -> Tid) -> Tid {
        let kind = self.kind();
        in_group(b, kind, |b| match self {
            Ffn::Dense(w) => mlp(b, &w, x),
            Ffn::Moe(w) => moe(b, w, x),
        })
    }

    /// The kind of layer the block is for.
    pub fn kind(&self) -> Kind {
        match self {
            Ffn::Dense(_) => Kind::Dense,
            Ffn::Moe(_) => Kind::Moe,
        }
    }
}

/// `LlamaDecoderLayer.forward` around a family's attention and MLP:
/// ```python
/// residual = hidden_states
/// hidden_states = self.input_layernorm(hidden_states)
/// hidden_states, _ = self.self_attn(hidden_states=hidden_states, …)
/// hidden_states = residual + hidden_states
/// residual = hidden_states
/// hidden_states = self.post_attention_layernorm(hidden_states)
/// hidden_states = self.mlp(hidden_states)
/// hidden_states = residual + hidden_states
/// ```
/// The caller has registered the attention's and the MLP's parameters (`self_attn`, then
/// `mlp`); the two norms' (`norm`) come after them. `attention` returns the output and
/// `attn_weights` (eager's probabilities, which `_` holds until the layer returns). The norms'
/// outputs are rebound by the sub-modules' calls; `residual` lives to the return.
pub fn decoder_layer(
    b: &mut Builder,
    p: &Params,
    x: Tid,
    norm: Norm,
    attention: impl FnOnce(&mut Builder, Tid) -> (Tid, Option<Tid>),
    mlp: impl FnOnce(&mut Builder, Tid) -> Tid,
) -> Tid {
    decoder_layer_with(b, p, x, norm, Residual::default(), attention, |b, n| (mlp(b, n), None))
}

/// Where a family's pre-norm decoder layer departs from `LlamaDecoderLayer.forward`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Residual {
    /// The attention's output has a name of its own (Llama 4's
    /// `attention_states, _ = self.self_attn(…)`; `hidden_states = residual + attention_states`):
    /// the norm's output lives through the residual add, the attention's to the return.
    pub attention_states: bool,
    /// Dropouts (their modules) on the attention's and the MLP's outputs before they join the
    /// residual (Phi-3's `resid_attn_dropout`, `resid_mlp_dropout`).
    pub dropouts: Option<[&'static str; 2]>,
}

/// [`decoder_layer`] with the departures `how`, and an MLP that may return a second value bound
/// to the layer's `_` (`hidden_states, _ = self.mlp(hidden_states)`: gpt-oss's router scores,
/// Llama 4's router logits): `_` is rebound there, letting the attention weights go, and the new
/// value lives to the return.
pub fn decoder_layer_with(
    b: &mut Builder,
    p: &Params,
    x: Tid,
    norm: Norm,
    how: Residual,
    attention: impl FnOnce(&mut Builder, Tid) -> (Tid, Option<Tid>),
    mlp: impl FnOnce(&mut Builder, Tid) -> (Tid, Option<Tid>),
) -> Tid {
    b.group = Group::All;
    let w1 = norm.weights(b, p, LAYER_NORM);
    let w2 = norm.weights(b, p, LAYER_NORM);
    let dropout = |b: &mut Builder, t: Tid, i: usize| match how.dropouts {
        Some(modules) => dropout(b, modules[i], t),
        None => t,
    };
    b.module = "input_layernorm";
    b.part = Part::Norms;
    let n1 = norm.run(b, x, w1);
    let (a, weights) = attention(b, n1);
    if !how.attention_states {
        b.hold(n1);
    }
    let ad = dropout(b, a, 0);
    b.module = "";
    b.part = Part::Norms;
    let h = b.add(x, ad);
    if how.attention_states {
        b.hold(n1);
    }
    b.module = "post_attention_layernorm";
    let n2 = norm.run(b, h, w2);
    let (m, rebound) = mlp(b, n2);
    b.hold(n2);
    let last = match rebound {
        Some(r) => {
            if let Some(w) = weights {
                b.hold(w);
            }
            Some(r)
        }
        None => weights,
    };
    let m = dropout(b, m, 1);
    b.module = "";
    let y = b.add(h, m);
    b.hold(h);
    if how.attention_states {
        b.hold(a);
    }
    if let Some(t) = last {
        b.hold(t);
    }
    y
}

/// Runs a layer's feed-forward block `f` in its kind's group (what its nodes keep is counted
/// for that kind of layer), then returns to the layer's.
pub fn in_group<T>(b: &mut Builder, kind: Kind, f: impl FnOnce(&mut Builder) -> T) -> T {
    b.group = if kind == Kind::Moe { Group::Moe } else { Group::Dense };
    let m = f(b);
    b.group = Group::All;
    m
}

/// What `LlamaModel.forward` computes after the embedding (also a later pipeline stage's
/// prologue): `cache_position` / `position_ids`, the causal mask (`create_causal_mask`) and the
/// rotary embedding (`LlamaRotaryEmbedding.forward`).
pub fn positions(b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
    let pos = cache_position(b);
    let mask = causal_mask(b, pos, attn);
    let (cos, sin) = rope_pair(b, spec, pos, true);
    Shared { cos, sin, pos: Some(pos), mask, ..Shared::default() }
}

/// `sdpa_attention_forward` with a mask:
/// ```python
/// key = repeat_kv(key, module.num_key_value_groups)
/// value = repeat_kv(value, module.num_key_value_groups)
/// attn_output = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, is_causal=False)
/// ```
/// See [`sdpa_bool_mask`]; Llama's additive mask is counted as `[b, s, s_kv]` (the tensor is
/// `[b, 1, s, s_kv]`: the same bytes, without the unit dim in the formula).
pub fn sdpa_masked(b: &mut Builder, q: Tid, k: Tid, v: Tid, mask: Tid) -> Tid {
    // With dropout CPU SDPA runs its math path, as without a mask (`llama::sdpa_core`; the
    // mask's addition to the scores is not modelled there: no fixture measures it).
    if b.dropout && !b.c.cuda {
        return sdpa_math(b, q, k, v);
    }
    let gqa = b.c.n(Q::KV) != b.c.n(Q::A);
    let (k, v) = if gqa { (repeat_kv(b, k), repeat_kv(b, v)) } else { (k, v) };
    if b.t(mask).dt != Dt::Bool {
        // An additive mask (the one a compiled whole model builds, `common::graph_mask`): SDPA
        // takes it as it is.
        return flash_sdpa_bsad(b, q, k, v, mask);
    }
    let shape = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None);
    sdpa_bool_mask(b, q, k, v, mask, MaskBuild { shape, before_autocast: false, hold_kv: false })
}

/// Where the families' modeling code differs around SDPA with a bool mask ([`sdpa_bool_mask`]).
#[derive(Clone, Copy, Debug)]
pub struct MaskBuild {
    /// The additive mask's shape as the ledger counts it.
    pub shape: Shape,
    /// The additive mask is built in the model dtype before autocast casts q, k and v (Llama 4
    /// calls `torch.where` itself); else SDPA builds it in q's dtype, after.
    pub before_autocast: bool,
    /// The caller's names still hold k and v after the call (Llama 4's repeated `key_states`
    /// and `value_states`).
    pub hold_kv: bool,
}

/// `F.scaled_dot_product_attention(q, k, v, attn_mask=mask)` on CPU with a bool mask, k and v
/// as given (already repeated to `a` heads where the caller repeats them). The bool mask is
/// turned additive (`convert_boolean_attn_mask`: `where(mask, 0, -inf)`, two `scalar_tensor`s)
/// and the CPU flash kernel keeps it with q, k, v, the output and the log-sum-exp; its backward
/// allocates dq, dk, dv (k and v at `a` heads, summed back to `k` heads by `repeat_kv`'s
/// ExpandBackward0). Returns `[b, s, a, d]` as the callers reshape it (a view: q, and so the
/// output, are laid out `[b, s, a, d]`). Llama, Gemma, Starcoder2, Falcon and Llama 4 differ
/// only in [`MaskBuild`].
pub fn sdpa_bool_mask(b: &mut Builder, q: Tid, k: Tid, v: Tid, mask: Tid, how: MaskBuild) -> Tid {
    let additive = |b: &mut Builder, dt: Dt| {
        let zero = b.plain("scalar_tensor", &[], Shape::scalar(), dt);
        let ninf = b.plain("scalar_tensor", &[], Shape::scalar(), dt);
        b.plain("where", &[mask, zero, ninf], how.shape, dt)
    };
    let early = how.before_autocast.then(|| additive(b, Dt::Model));
    let (q, k, v) = (b.autocast_in(q), b.autocast_in(k), b.autocast_in(v));
    let qdt = b.t(q).dt;
    let add = match early {
        Some(m) => m,
        None => additive(b, qdt),
    };
    let o = flash_sdpa_bsad(b, q, k, v, add);
    if how.hold_kv {
        b.hold(k);
        b.hold(v);
    }
    o
}

/// The CPU flash kernel with an additive mask ([`super::common::cpu_flash_sdpa`]), its output
/// returned `[b, s, a, d]` as the callers reshape it (a view: q, and so the output, are laid
/// out `[b, s, a, d]`).
fn flash_sdpa_bsad(b: &mut Builder, q: Tid, k: Tid, v: Tid, mask: Tid) -> Tid {
    let r = super::common::cpu_flash_sdpa(b, q, k, v, mask);
    let ot = b.view(r[0], heads_bshd(Q::A), "TransposeBackward0", false);
    b.view(ot, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::A), Dim::Q(Q::D)], Split::Tp), "ViewBackward0", false)
}
