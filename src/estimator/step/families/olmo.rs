//! OLMo (`modeling_olmo.py`): Llama's layer with a LayerNorm without parameters computed in
//! fp32 (`OlmoLayerNorm`), RoPE whose cos/sin stay fp32 (`OlmoRotaryEmbedding.forward` returns
//! them uncast, `apply_rotary_pos_emb` casts q and k back), and, with `clip_qkv`, the q, k, v
//! projections clamped in place. OLMo-2 (`modeling_olmo2.py`) keeps the fp32 RoPE and moves the
//! norms after the sub-layers (`Olmo2RMSNorm`: the weight multiplies the fp32 normalized input),
//! with q/k norms over all heads.

use super::super::blocks::shapes::{heads, heads_bshd, tok};
use super::super::ir::{Builder, DType, Dim, Dt, Group, Shape, Split, Tid, B, S};
use super::common::{cos_shape, Params, Shared};
use super::common::{has_rope, received, Kind};
use super::llama::{eager_core, embedding, positions_and_mask, rope, sdpa_core, selective_begin, selective_end, AttnW, MlpW};
use super::modeling::Modeling;
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::Attention;
use crate::estimator::family::Family;
use crate::estimator::model::{Linear, ModelSpec, QkNorm};
use crate::estimator::step::part::Part;

/// `Olmo2RMSNorm.forward`:
/// ```python
/// hidden_states = hidden_states.to(torch.float32)
/// variance = hidden_states.pow(2).mean(-1, keepdim=True)
/// hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
/// return (self.weight * hidden_states).to(input_dtype)
/// ```
/// Llama's, but the weight multiplies the fp32 normalized input (the product is fp32, kept by
/// the weight's gradient) before the cast back.
pub fn rms_norm2(b: &mut Builder, x: Tid, w: Option<Tid>) -> Tid {
    let in_dt = b.t(x).dt;
    let x32 = b.to_copy(x, Dt::F32);
    let sq = b.pow(x32);
    let var = mean_rows(b, sq);
    let ve = b.add_scalar(var);
    let r = b.rsqrt(ve);
    let n32 = b.mul(x32, r);
    let o = match w {
        Some(w) => weight_mul(b, w, n32),
        None => n32,
    };
    let y = b.to_copy(o, in_dt);
    b.hold(var);
    b.hold(n32);
    b.hold(x);
    y
}

/// `self.weight * hidden_states` with a bf16 weight `[w]` and an fp32 `[…, w]` input: the
/// product is fp32; MulBackward0 keeps both, makes the input's gradient (`grad * weight`), then
/// the weight's (`grad * input`, full size), which the engine sums to `[w]` in fp32 and casts to
/// the weight's dtype (`validate_outputs`: `sum_to`, then `_to_copy`), freeing each step's
/// predecessor. With a weight of the input's dtype it is [`Builder::mul`].
fn weight_mul(b: &mut Builder, w: Tid, x: Tid) -> Tid {
    let (wd, xd) = (b.t(w).dtype, b.t(x).dtype);
    if wd == xd || !b.rg(w) || !b.rg(x) {
        return b.mul(w, x);
    }
    let (shape, dt, full) = (b.shape(x), b.t(x).dt, b.bytes(x));
    let summed = b.grad_bytes(w) / wd.bytes().max(1) as u128 * xd.bytes() as u128;
    let out = b.out(shape, dt, true);
    let bw = [
        B::Alloc { bytes: full, dtype: xd, op: "mul" },
        B::Alloc { bytes: full, dtype: xd, op: "mul" },
        B::Apply,
        B::Alloc { bytes: summed, dtype: xd, op: "sum" },
        B::Free(1),
        B::Alloc { bytes: b.grad_bytes(w), dtype: wd, op: "_to_copy" },
        B::Free(2),
        B::Grad { input: 0, temp: 3 },
        B::Grad { input: 1, temp: 0 },
    ];
    b.op("mul", "MulBackward0", &[w, x], &[out], &[S::In(0), S::In(1)], &bw)[0]
}

/// `x.mean(-1, keepdim=True)` over each row of a `[b, s, …]` tensor (a projection laid out
/// `[b, s, heads, d]` is one row of `heads·d` per token) → `[b, s, 1]`; MeanBackward1: one
/// full-size `div`.
fn mean_rows(b: &mut Builder, x: Tid) -> Tid {
    let (shape, dt, rg, bytes, dtype) = (b.shape(x), b.t(x).dt, b.rg(x), b.bytes(x), b.t(x).dtype);
    let d = shape.dims();
    let rows = Shape::new(&[d[0], d[1], Dim::N(1)], Split::None);
    let out = b.out(rows, dt, rg);
    let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "div" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    b.op("mean", "MeanBackward1", &[x], &[out], &[], bw)[0]
}

/// `Olmo2DecoderLayer.forward`: no pre-norms; the norms follow the sub-layers:
/// ```python
/// hidden_states = residual + self.post_attention_layernorm(self.self_attn(hidden_states))
/// hidden_states = residual + self.post_feedforward_layernorm(self.mlp(hidden_states))
/// ```
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer2(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    b.group = Group::All;
    // Registration order: self_attn (q, k, v, o, q_norm, k_norm), mlp, post_attention_layernorm,
    // post_feedforward_layernorm.
    let aw = AttnW::new(b, p);
    let mw = MlpW::new(b, p);
    let n1w = p.w(b, "layers.*.norm.weight");
    let n2w = p.w(b, "layers.*.norm.weight");
    let (a, weights) = attention(b, &aw, spec, x, sh, attn, false);
    b.module = "post_attention_layernorm";
    b.part = Part::Norms;
    let a2 = rms_norm2(b, a, n1w);
    b.module = "";
    let h = b.add(x, a2);
    let m = super::llama::mlp(b, &mw, h);
    b.module = "post_feedforward_layernorm";
    b.part = Part::Norms;
    let m2 = rms_norm2(b, m, n2w);
    b.module = "";
    let y = b.add(h, m2);
    b.hold(h);
    if let Some(w) = weights {
        b.hold(w);
    }
    y
}

/// `OlmoLayerNorm.forward`:
/// ```python
/// F.layer_norm(hidden_states.to(dtype=torch.float32), self.normalized_shape, None, None, eps=1e-5).to(orig_dtype)
/// ```
/// `native_layer_norm` keeps its fp32 input and fp32 mean and rstd `[b, s, 1]`.
pub fn layer_norm(b: &mut Builder, x: Tid) -> Tid {
    let in_dt = b.t(x).dt;
    let x32 = b.to_copy(x, Dt::F32);
    let n = b.layer_norm(x32, None, None);
    let y = b.to_copy(n, in_dt);
    b.hold(x);
    y
}

/// `OlmoRotaryEmbedding.forward`: Llama's, without the final cast (cos and sin `[1, s, d]`
/// fp32 in any recipe).
pub fn rotary(b: &mut Builder, spec: &ModelSpec, pos: Tid) -> (Tid, Tid) {
    b.module = "model.rotary_emb";
    let full = cos_shape(spec);
    let half = full.last(Dim::Half(Q::D));
    let pf = b.plain("_to_copy", &[pos], Shape::new(&[Dim::Q(Q::S)], Split::None), Dt::F32);
    let freqs = b.plain("mul", &[pf], half, Dt::F32);
    let emb = b.plain("cat", &[freqs], full, Dt::F32);
    let c = b.plain("cos", &[emb], full, Dt::F32);
    let cos = b.plain("mul", &[c], full, Dt::F32);
    let s = b.plain("sin", &[emb], full, Dt::F32);
    let sin = b.plain("mul", &[s], full, Dt::F32);
    b.hold(freqs);
    b.hold(emb);
    for t in [cos, sin] {
        b.p.tensors[t as usize].part = Some(Part::Embedding);
    }
    (cos, sin)
}

/// `OlmoModel.forward` before the layers: Llama's, with fp32 cos/sin.
pub fn embed(b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
    b.part = Part::Embedding;
    b.module = "model.embed_tokens";
    let emb_w = p.w(b, "embed_tokens.weight");
    let x0 = match emb_w {
        Some(w) => embedding(b, ids, w),
        None => b.plain("embedding", &[ids], tok(Q::H), Dt::Resid),
    };
    let mut sh = positions(b, spec, attn);
    sh.emb_w = if spec.tied { emb_w } else { None };
    sh.locals[0] = Some(x0);
    (x0, sh)
}

/// What `OlmoModel.forward` / `Olmo2Model.forward` compute after the embedding (also a later
/// pipeline stage's prologue): `position_ids`, the causal mask, fp32 cos/sin.
pub fn positions(b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
    b.module = "model";
    b.part = Part::Embedding;
    let (pos, mask) = positions_and_mask(b, attn);
    let (cos, sin) = rotary(b, spec, pos);
    Shared {
        cos: Some(cos),
        sin: Some(sin),
        pos: Some(pos),
        mask,
        mask_local: None,
        emb_w: None,
        locals: [None, None],
        cos_local: None,
        sin_local: None,
    }
}

/// `tensor.clamp_(min=-c, max=c)` in place: autograd first copies the input (`clone`, what
/// ClampBackward1 keeps: `clamp_backward` needs the values before the clamp); the result is
/// the input's storage. Backward (`clamp_backward`: `where((self >= min) & (self <= max),
/// grad, 0)`): a scalar zero, two bool masks of the input's numel (`gt`, `lt`), the `where`
/// gradient; the masks and the scalar are freed.
fn clamp_(b: &mut Builder, x: Tid) -> Tid {
    let (shape, dt, bytes, dtype, rg) = (b.shape(x), b.t(x).dt, b.bytes(x), b.t(x).dtype, b.rg(x));
    let old = b.plain("clone", &[x], shape, dt);
    let numel = bytes / dtype.bytes().max(1) as u128;
    let out = b.view_out(x, shape);
    let bw: &[B] = if rg {
        &[
            B::Alloc { bytes: dtype.bytes() as u128, dtype, op: "scalar_tensor" },
            B::Alloc { bytes: numel, dtype: DType::Bool, op: "gt" },
            B::Alloc { bytes: numel, dtype: DType::Bool, op: "lt" },
            B::Alloc { bytes, dtype, op: "where" },
            B::Free(2),
            B::Free(1),
            B::Free(0),
            B::Grad { input: 0, temp: 3 },
        ]
    } else {
        &[]
    };
    b.op("clamp_", "ClampBackward1", &[x, old], &[out], &[S::In(1)], bw)[0]
}

/// `OlmoAttention.forward`: the projections (clamped with `clip_qkv`), their head views, RoPE
/// on fp32 cos/sin — `q * cos` promotes to fp32, `apply_rotary_pos_emb` returns
/// `q_embed.to(q_type)` — and Llama's attention core and `o_proj`.
fn attention(b: &mut Builder, w: &AttnW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention, clip: bool) -> (Tid, Option<Tid>) {
    let AttnW { wq, bq, wk, bk, wv, bv, wo, bo, .. } = *w;
    let eager = attn == Attention::Eager;
    let AttnW { qn, kn, .. } = *w;
    let full_norm = spec.qk_norm == QkNorm::Full;
    let proj = |b: &mut Builder, w: Option<Tid>, bias: Option<Tid>, h: Q, module: &'static str, lin: Linear| -> Tid {
        b.module = module;
        b.part = Part::AttentionInputs;
        match w {
            Some(w) => b.proj(x, w, bias, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(h), Dim::Q(Q::D)], Split::Tp), lin),
            None => x,
        }
    };
    // OLMo-2: `self.q_norm(self.q_proj(x))`, `self.k_norm(self.k_proj(x))` over all heads.
    let norm = |b: &mut Builder, y: Tid, nw: Option<Tid>, module: &'static str| {
        if !full_norm {
            return y;
        }
        b.module = module;
        b.part = Part::AttentionCore;
        rms_norm2(b, y, nw)
    };
    let q = proj(b, wq, bq, Q::A, "self_attn.q_proj", Linear::Q);
    let q = norm(b, q, qn, "self_attn.q_norm");
    let k = proj(b, wk, bk, Q::KV, "self_attn.k_proj", Linear::K);
    let k = norm(b, k, kn, "self_attn.k_norm");
    let v = proj(b, wv, bv, Q::KV, "self_attn.v_proj", Linear::V);
    b.module = "self_attn";
    let (q, k, v) = if clip { (clamp_(b, q), clamp_(b, k), clamp_(b, v)) } else { (q, k, v) };
    // The gradients of q and k come back through RoPE's cast in a layout `reshape` must copy;
    // v's (from SDPA, laid out like v) views, except after eager attention's bmm.
    let view = |b: &mut Builder, y: Tid, h: Q, clone_bw: bool| {
        let v = b.view(y, heads_bshd(h), "ViewBackward0", clone_bw);
        b.view(v, heads(h), "TransposeBackward0", false)
    };
    let q = view(b, q, Q::A, true);
    let k = view(b, k, Q::KV, true);
    let v = view(b, v, Q::KV, eager);
    b.part = Part::AttentionCore;
    let (q, k) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) => {
            let (qt, kt) = (b.t(q).dt, b.t(k).dt);
            let qe = rope(b, q, cos, sin, Q::A);
            let ke = rope(b, k, cos, sin, Q::KV);
            let (q32, k32) = (qe, ke);
            let qe = b.to_copy(q32, qt);
            let ke = b.to_copy(k32, kt);
            // `return q_embed.to(q_type), k_embed.to(k_type)`: both fp32 locals live to the end.
            b.hold(q32);
            b.hold(k32);
            b.hold(q);
            b.hold(k);
            (qe, ke)
        }
        _ => (q, k),
    };
    b.module = "self_attn";
    let (region, q, k, v) = selective_begin(b, q, k, v);
    let (o, weights) = if eager { eager_core(b, spec, q, k, v, sh.mask) } else { (sdpa_core(b, q, k, v), None) };
    selective_end(b, region);
    b.part = Part::AttentionInputs;
    b.module = "self_attn.o_proj";
    let out = match wo {
        Some(w) => b.proj(o, w, bo, tok(Q::H), Linear::O),
        None => o,
    };
    b.hold(q);
    b.hold(k);
    b.hold(v);
    (out, weights)
}

/// `OlmoDecoderLayer.forward`: Llama's pre-norm layer with [`layer_norm`] and `attention`.
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    b.group = Group::All;
    let aw = AttnW::new(b, p);
    let mw = MlpW::new(b, p);
    b.module = "input_layernorm";
    b.part = Part::Norms;
    let n1 = layer_norm(b, x);
    let (a, weights) = attention(b, &aw, spec, n1, sh, attn, spec.clip_qkv);
    b.hold(n1);
    b.module = "";
    b.part = Part::Norms;
    let h = b.add(x, a);
    b.module = "post_attention_layernorm";
    let n2 = layer_norm(b, h);
    let m = super::llama::mlp(b, &mw, n2);
    b.hold(n2);
    b.module = "";
    let y = b.add(h, m);
    b.hold(h);
    if let Some(w) = weights {
        b.hold(w);
    }
    y
}

/// The final norm (`model.norm`: an [`OlmoLayerNorm`](layer_norm), OLMo-2's
/// [`Olmo2RMSNorm`](rms_norm2)).
pub fn final_norm(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid) -> Tid {
    b.module = "model.norm";
    b.part = Part::Head;
    if spec.family == Family::Olmo2 {
        let w = p.w(b, "norm.weight");
        rms_norm2(b, x, w)
    } else {
        layer_norm(b, x)
    }
}

/// OLMo (see the module doc).
pub struct Olmo;
impl Modeling for Olmo {
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        embed(b, p, spec, ids, attn)
    }
    fn receive(&self, b: &mut Builder, _p: &Params, spec: &ModelSpec, attn: Attention) -> (Tid, Shared) {
        let x0 = received(b);
        (x0, positions(b, spec, attn))
    }
    fn final_norm(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid) -> Tid {
        final_norm(b, p, spec, x)
    }
    /// cos and sin stay fp32 (`OlmoRotaryEmbedding.forward` does not cast them).
    fn rope_tables(&self, spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
        has_rope(spec).then(|| (cos_shape(spec), Dt::F32, true))
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
}

/// OLMo-2 (see the module doc).
pub struct Olmo2;
impl Modeling for Olmo2 {
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        embed(b, p, spec, ids, attn)
    }
    fn receive(&self, b: &mut Builder, _p: &Params, spec: &ModelSpec, attn: Attention) -> (Tid, Shared) {
        let x0 = received(b);
        (x0, positions(b, spec, attn))
    }
    fn final_norm(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid) -> Tid {
        final_norm(b, p, spec, x)
    }
    /// cos and sin stay fp32 (`OlmoRotaryEmbedding.forward` does not cast them).
    fn rope_tables(&self, spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
        has_rope(spec).then(|| (cos_shape(spec), Dt::F32, true))
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer2(b, p, spec, x, sh, attn)
    }
}
