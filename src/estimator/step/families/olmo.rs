//! OLMo (`modeling_olmo.py`): Llama's layer with a LayerNorm without parameters computed in
//! fp32 (`OlmoLayerNorm`), RoPE whose cos/sin stay fp32 (`OlmoRotaryEmbedding.forward` returns
//! them uncast, `apply_rotary_pos_emb` casts q and k back), and, with `clip_qkv`, the q, k, v
//! projections clamped in place.

use super::super::blocks::shapes::{heads, heads_bshd, tok};
use super::super::ir::{Builder, DType, Dim, Dt, Group, Shape, Split, Tid, B, S};
use super::llama::{eager_core, embedding, positions_and_mask, rope, sdpa_core, selective_begin, selective_end, AttnW, MlpW};
use super::{cos_shape, Params, Shared};
use crate::estimator::activations::ctx::Q;
use crate::estimator::activations::Part;
use crate::estimator::config::Attention;
use crate::estimator::model::{Linear, ModelSpec, NormKind};

/// Whether `spec` is OLMo (its LayerNorm has no parameters).
pub fn is(spec: &ModelSpec) -> bool {
    spec.norm == NormKind::Nonparametric
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
    b.module = "model";
    let (pos, mask) = positions_and_mask(b, attn);
    let (cos, sin) = rotary(b, spec, pos);
    let sh = Shared {
        cos: Some(cos),
        sin: Some(sin),
        pos: Some(pos),
        mask,
        mask_local: None,
        emb_w: if spec.tied { emb_w } else { None },
        locals: [Some(x0), None],
    };
    (x0, sh)
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
    let proj = |b: &mut Builder, w: Option<Tid>, bias: Option<Tid>, h: Q, module: &'static str, lin: Linear| -> Tid {
        b.module = module;
        b.part = Part::AttentionInputs;
        let y = match w {
            Some(w) => b.proj(x, w, bias, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(h), Dim::Q(Q::D)], Split::Tp), lin),
            None => x,
        };
        y
    };
    let q = proj(b, wq, bq, Q::A, "self_attn.q_proj", Linear::Q);
    let k = proj(b, wk, bk, Q::KV, "self_attn.k_proj", Linear::K);
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

/// `OlmoDecoderLayer.forward`: Llama's pre-norm layer with [`layer_norm`] and [`attention`].
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

/// The final norm (`model.norm`, an [`OlmoLayerNorm`](layer_norm)).
pub fn final_norm(b: &mut Builder, x: Tid) -> Tid {
    b.module = "model.norm";
    b.part = Part::Head;
    layer_norm(b, x)
}
