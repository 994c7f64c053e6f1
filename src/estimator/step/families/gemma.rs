//! Gemma-2 (`modeling_gemma2.py`): Gemma's RMSNorm (`x.float()` normalized, scaled by
//! `1 + weight.float()`, cast back), four norms per layer (around attention and MLP), the
//! embedding scaled by √h (a buffer), GeGLU (`gelu_pytorch_tanh`), tanh soft-capping of the
//! attention scores and of the final logits, and alternating sliding-window / full layers with
//! one materialized mask each. Gemma (`modeling_gemma.py`) is Llama's layer with Gemma's RMSNorm
//! and GeGLU ([`layer_gemma1`]); Gemma-3's text model (`modeling_gemma3.py`) is Gemma-2's layer
//! with per-head q/k norms, no soft-capping, SDPA masks on its sliding layers and a RoPE pair
//! per layer type ([`embed3`]).

use super::super::blocks::shapes::{heads, heads_bshd, tok};
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Group, Shape, Split, Tid};
use super::common::{mask_shape, masked, received};
use super::common::{Kind, Params, Shared};
use super::llama::{rope, AttnW, MlpW};
use super::modeling::Modeling;
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::Attention;
use crate::estimator::family::Family;
use crate::estimator::model::{Linear, ModelSpec};
use crate::estimator::step::part::Part;

/// `Gemma2RMSNorm.forward`:
/// ```python
/// output = self._norm(x.float())   # x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
/// output = output * (1.0 + self.weight.float())
/// return output.type_as(x)
/// ```
/// Keeps the fp32 input, the rsqrt, the normalized fp32 input and `1 + weight` (fp32 `[h]`).
pub fn rms_norm(b: &mut Builder, x: Tid, w: Option<Tid>) -> Tid {
    let in_dt = b.t(x).dt;
    let x32 = b.to_copy(x, Dt::F32);
    let sq = b.pow(x32);
    let var = b.mean_last(sq);
    let ve = b.add_scalar(var);
    let r = b.rsqrt(ve);
    let n32 = b.mul(x32, r);
    let o = match w {
        Some(w) => {
            let wf = b.to_copy(w, Dt::F32);
            let w1 = b.add_scalar(wf);
            b.mul(n32, w1)
        }
        None => n32,
    };
    let y = b.to_copy(o, in_dt);
    b.hold(x);
    y
}

/// `Gemma2Attention.forward` (eager; transformers refuses sdpa for Gemma-2, the core below is
/// SDPA's when asked anyway) and `Gemma3Attention.forward`: the same projections and RoPE, with
/// `q_norm`/`k_norm` (Gemma's RMSNorm over `head_dim`) on the transposed `[b, heads, s, d]`
/// views before RoPE, no soft-capping (Llama's eager core), and on sliding layers whose window
/// is shorter than the keys SDPA with the bool mask (`llama::sdpa_masked`: k and v repeated).
/// `query_pre_attn_scalar` only sets the scale (a `mul` by a Python number in eager, SDPA's
/// `scale`): no tensor of its own.
fn attention(b: &mut Builder, w: &AttnW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let AttnW { wq, bq, wk, bk, wv, bv, wo, bo, qn, kn } = *w;
    let eager = attn == Attention::Eager;
    let gemma3 = spec.family == Family::Gemma3;
    let masked_sdpa = !eager && sh.mask.is_some();
    let proj = |b: &mut Builder, w: Option<Tid>, bias: Option<Tid>, h: Q, module: &'static str, clone_bw: bool, lin: Linear| -> Tid {
        b.module = module;
        b.part = Part::AttentionInputs;
        let y = match w {
            Some(w) => b.proj(x, w, bias, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(h), Dim::Q(Q::D)], Split::Tp), lin),
            None => x,
        };
        b.module = "self_attn";
        let v = b.view(y, heads_bshd(h), "ViewBackward0", clone_bw);
        b.view(v, heads(h), "TransposeBackward0", false)
    };
    let q = proj(b, wq, bq, Q::A, "self_attn.q_proj", true, Linear::Q);
    let k = proj(b, wk, bk, Q::KV, "self_attn.k_proj", true, Linear::K);
    let v = proj(b, wv, bv, Q::KV, "self_attn.v_proj", eager || masked_sdpa, Linear::V);
    b.part = Part::AttentionCore;
    let (q, k) = if gemma3 {
        b.module = "self_attn.q_norm";
        let qn_out = rms_norm(b, q, qn);
        b.module = "self_attn.k_norm";
        let kn_out = rms_norm(b, k, kn);
        (qn_out, kn_out)
    } else {
        (q, k)
    };
    let (q, k) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) => {
            let qe = rope(b, q, cos, sin, Q::A);
            let ke = rope(b, k, cos, sin, Q::KV);
            b.hold(q);
            b.hold(k);
            (qe, ke)
        }
        _ => (q, k),
    };
    b.module = "self_attn";
    let (region, q, k, v) = super::llama::selective_begin(b, q, k, v);
    let (o, weights) = match sh.mask {
        _ if eager => super::llama::eager_core(b, spec, q, k, v, sh.mask),
        Some(m) => (super::llama::sdpa_masked(b, q, k, v, m), None),
        None => (super::llama::sdpa_core(b, q, k, v), None),
    };
    super::llama::selective_end(b, region);
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

/// `Gemma2MLP`: `down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))`.
fn mlp(b: &mut Builder, w: &MlpW, x: Tid) -> Tid {
    super::llama::gated_mlp(b, w, x, super::llama::GELU_TANH)
}

/// `Gemma2DecoderLayer.forward`: `input_layernorm` → attention → `post_attention_layernorm` →
/// residual → `pre_feedforward_layernorm` → MLP → `post_feedforward_layernorm` → residual.
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    let _ = kind;
    b.group = Group::All;
    let aw = AttnW::new(b, p);
    let mw = MlpW::new(b, p);
    let nw: Vec<Option<Tid>> = (0..spec.layer_norms).map(|_| p.w(b, "layers.*.norm.weight")).collect();
    let norm = |b: &mut Builder, x: Tid, i: usize, module: &'static str| {
        b.module = module;
        b.part = Part::Norms;
        rms_norm(b, x, nw.get(i).copied().flatten())
    };
    let n1 = norm(b, x, 0, "input_layernorm");
    let (a, weights) = attention(b, &aw, spec, n1, sh, attn);
    b.hold(n1);
    let a2 = norm(b, a, 1, "post_attention_layernorm");
    b.module = "";
    let h = b.add(x, a2);
    let n2 = norm(b, h, 2, "pre_feedforward_layernorm");
    let m = mlp(b, &mw, n2);
    b.hold(n2);
    let m2 = norm(b, m, 3, "post_feedforward_layernorm");
    b.module = "";
    let y = b.add(h, m2);
    b.hold(h);
    if let Some(w) = weights {
        b.hold(w);
    }
    y
}

/// The embedding scaled by √h (`Gemma2ScaledWordEmbedding`: `embedding(ids) * embed_scale`,
/// a buffer cast to the weight's dtype).
/// `GemmaModel.forward` before the layers: Llama's, with the embedding scaled by √h inside the
/// embedding module and, for Gemma-2 under eager attention, a full and a sliding-window mask.
pub fn embed(b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
    let (x0, emb_w) = super::llama::token_embedding(b, p, ids);
    let x0 = scale_embedding(b, x0);
    let two: Option<super::llama::TwoMasks> = (spec.family == Family::Gemma2 && attn == Attention::Eager).then_some(masks);
    super::llama::model_inputs(b, spec, attn, x0, emb_w, two)
}

/// The final norm (`model.norm`): Gemma's RMSNorm.
pub fn final_norm(b: &mut Builder, p: &Params, x: Tid) -> Tid {
    b.module = "model.norm";
    b.part = Part::Head;
    let w = p.w(b, "norm.weight");
    rms_norm(b, x, w)
}

pub fn scale_embedding(b: &mut Builder, e: Tid) -> Tid {
    let scale = b.external(Shape::scalar(), Dt::Resid, super::super::ir::Origin::Buffer, false);
    b.mul(e, scale)
}

/// `create_causal_mask` and `create_sliding_window_causal_mask` for eager attention: two
/// materialized `[b, 1, s, s_kv]` masks (each after its own packed-sequence detection).
pub fn masks(b: &mut Builder, pos: Tid) -> (Tid, Tid) {
    let (_, full) = super::llama::mask_only(b, pos, Attention::Eager);
    super::llama::packed_detection(b, pos);
    let s1 = || Shape::new(&[Dim::Q(Q::S)], Split::None);
    let ba = b.plain("arange", &[], Shape::new(&[Dim::Q(Q::B)], Split::None), Dt::I64);
    let ha = b.plain("arange", &[], Shape::new(&[Dim::N(1)], Split::None), Dt::I64);
    let kv0 = b.plain("arange", &[], s1(), Dt::I64);
    let kv = b.plain("add", &[kv0], s1(), Dt::I64);
    let q0 = b.plain("arange", &[], s1(), Dt::I64);
    let qi = b.plain("add", &[q0], s1(), Dt::I64);
    let ss = || Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None);
    let one = b.plain("new_ones", &[], Shape::scalar(), Dt::Bool);
    let sub = b.plain("sub", &[qi], Shape::new(&[Dim::Q(Q::S)], Split::None), Dt::I64);
    let gt = b.plain("gt", &[kv, sub], ss(), Dt::Bool);
    let and1 = b.plain("bitwise_and", &[one, gt], ss(), Dt::Bool);
    let le = b.plain("le", &[kv, qi], ss(), Dt::Bool);
    let and2 = b.plain("bitwise_and", &[and1, le], ss(), Dt::Bool);
    for t in [ba, ha, kv, qi] {
        b.hold(t);
    }
    let zero = b.plain("zeros", &[], Shape::scalar(), Dt::Resid);
    let min = b.plain("scalar_tensor", &[], Shape::scalar(), Dt::Resid);
    let m = b.plain("where", &[and2, zero, min], Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None), Dt::Resid);
    b.p.tensors[m as usize].part = Some(Part::Checkpoints);
    (full.unwrap_or(m), m)
}

/// Gemma-2's final-logit soft-capping: `logits / cap`, `tanh`, `* cap` (keeps the tanh).
pub fn softcap_logits(b: &mut Builder, logits: Tid) -> Tid {
    let d = b.unary("div", "DivBackward1", logits, Keep::Nothing, "div");
    let t = b.unary("tanh", "TanhBackward0", d, Keep::Output, "tanh_backward");
    b.mul_scalar(t)
}

/// `GemmaDecoderLayer.forward` (`modeling_gemma.py`): Llama's pre-norm layer with Gemma's
/// RMSNorm ([`rms_norm`]) and the GeGLU MLP (`mlp`: `gelu_pytorch_tanh`); the attention is
/// Llama's (`GemmaAttention`: no soft-capping, `head_dim` need not be h/a).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer_gemma1(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    b.group = Group::All;
    // Registration order: self_attn, mlp, input_layernorm, post_attention_layernorm.
    let aw = AttnW::new(b, p);
    let mw = MlpW::new(b, p);
    let n1w = p.w(b, "layers.*.norm.weight");
    let n2w = p.w(b, "layers.*.norm.weight");
    b.module = "input_layernorm";
    b.part = Part::Norms;
    let n1 = rms_norm(b, x, n1w);
    let (a, weights) = super::llama::attention(b, &aw, spec, n1, sh, attn);
    b.hold(n1);
    b.module = "";
    b.part = Part::Norms;
    let h = b.add(x, a);
    b.module = "post_attention_layernorm";
    let n2 = rms_norm(b, h, n2w);
    let m = mlp(b, &mw, n2);
    b.hold(n2);
    b.module = "";
    let y = b.add(h, m);
    b.hold(h);
    if let Some(w) = weights {
        b.hold(w);
    }
    y
}

/// `Gemma3TextModel.forward` before the layers: the scaled embedding, then [`positions3`].
pub fn embed3(b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
    b.part = Part::Embedding;
    b.module = "model.embed_tokens";
    let emb_w = p.w(b, "embed_tokens.weight");
    let x0 = match emb_w {
        Some(w) => super::llama::embedding(b, ids, w),
        None => b.plain("embedding", &[ids], tok(Q::H), Dt::Resid),
    };
    let x0 = scale_embedding(b, x0);
    let mut sh = positions3(b, spec, attn);
    sh.emb_w = if spec.tied { emb_w } else { None };
    sh.locals[0] = Some(x0);
    (x0, sh)
}

/// What `Gemma3TextModel.forward` computes after the embedding (also a later pipeline stage's
/// prologue): `position_ids`, both masks (`create_causal_mask`: for SDPA only its
/// packed-sequence check; `create_sliding_window_causal_mask`: a materialized mask once the
/// window is shorter than the keys, or always for eager), and one RoPE pair per layer type
/// (`Gemma3RotaryEmbedding.forward` with the full layers' base and the sliding layers' local
/// base, each cast to the hidden states' dtype).
pub fn positions3(b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
    b.module = "model";
    b.part = Part::Embedding;
    let s1 = Shape::new(&[Dim::Q(Q::S)], Split::None);
    let ar = b.plain("arange", &[], s1, Dt::I64);
    let pos = b.plain("add", &[ar], s1, Dt::I64);
    b.p.tensors[pos as usize].part = Some(Part::Checkpoints);
    let (mask, mask_local) = if attn == Attention::Eager {
        let (full, local) = masks(b, pos);
        (Some(full), Some(local))
    } else {
        super::llama::packed_detection(b, pos);
        let local = if super::common::masked(spec.window, b.c.n(Q::S_KV)) {
            Some(super::mistral::sliding_mask(b, pos, attn))
        } else {
            super::llama::packed_detection(b, pos);
            None
        };
        (None, local)
    };
    let (cos, sin) = super::llama::rotary(b, spec, pos);
    let (cos_local, sin_local) = if local_rope(spec) {
        let (c, s) = super::llama::rotary(b, spec, pos);
        (Some(c), Some(s))
    } else {
        (None, None)
    };
    Shared { cos: Some(cos), sin: Some(sin), pos: Some(pos), mask, mask_local, emb_w: None, locals: [None, None], cos_local, sin_local }
}

/// Whether Gemma-3's sliding-window layers have a rotary pair of their own: with both sliding
/// and full layers (`Gemma3TextModel.forward` computes one pair per layer type in
/// `set(config.layer_types)`).
fn local_rope(spec: &ModelSpec) -> bool {
    let n = spec.window_layers.count(spec.layers);
    n > 0 && n < spec.layers
}

/// Gemma (`modeling_gemma.py`): Llama's layout with Gemma's RMSNorm (`1 + weight`), GeGLU and
/// the embedding scaled by √h.
pub struct Gemma;
impl Modeling for Gemma {
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        embed(b, p, spec, ids, attn)
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer_gemma1(b, p, spec, x, sh, attn)
    }
    fn final_norm(&self, b: &mut Builder, p: &Params, _spec: &ModelSpec, x: Tid) -> Tid {
        final_norm(b, p, x)
    }
    fn embed_scale_buffer(&self) -> bool {
        true
    }
}

/// Gemma-2 (`modeling_gemma2.py`): four norms per layer, soft-capping, sliding-window attention
/// on the even layers, and under eager attention a full and a sliding-window mask.
pub struct Gemma2;
impl Modeling for Gemma2 {
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        embed(b, p, spec, ids, attn)
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
    fn final_norm(&self, b: &mut Builder, p: &Params, _spec: &ModelSpec, x: Tid) -> Tid {
        final_norm(b, p, x)
    }
    /// Gemma2Config's `layer_types`: sliding where `(i + 1) % 2 != 0`, the even layers.
    fn sliding(&self, _spec: &ModelSpec, i: usize) -> bool {
        i.is_multiple_of(2)
    }
    fn mask_shapes(&self, _b: &Builder, _spec: &ModelSpec, attn: Attention) -> [Option<(Shape, Dt)>; 2] {
        let eager = attn == Attention::Eager;
        [eager.then(|| mask_shape(attn)), eager.then(|| mask_shape(attn))]
    }
    fn embed_scale_buffer(&self) -> bool {
        true
    }
}

/// Gemma-3's text model (`modeling_gemma3.py`): Gemma-2's layout with per-head q/k norms, no
/// soft-capping, sliding layers from `layer_types` with a RoPE pair of their own.
pub struct Gemma3;
impl Modeling for Gemma3 {
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        embed3(b, p, spec, ids, attn)
    }
    fn receive(&self, b: &mut Builder, _p: &Params, spec: &ModelSpec, attn: Attention) -> (Tid, Shared) {
        let x0 = received(b);
        (x0, positions3(b, spec, attn))
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
    fn final_norm(&self, b: &mut Builder, p: &Params, _spec: &ModelSpec, x: Tid) -> Tid {
        final_norm(b, p, x)
    }
    /// `layer_types` (the window rule the importer reads from it).
    fn sliding(&self, spec: &ModelSpec, i: usize) -> bool {
        spec.window_layers.contains(i as u64)
    }
    fn local_rope(&self, spec: &ModelSpec) -> bool {
        local_rope(spec)
    }
    /// Eager's two masks; under SDPA the sliding mask once the window is shorter than the keys.
    fn mask_shapes(&self, b: &Builder, spec: &ModelSpec, attn: Attention) -> [Option<(Shape, Dt)>; 2] {
        let eager = attn == Attention::Eager;
        let local = eager || masked(spec.window, b.c.n(Q::S_KV));
        [eager.then(|| mask_shape(attn)), local.then(|| mask_shape(attn))]
    }
    fn embed_scale_buffer(&self) -> bool {
        true
    }
}
