//! Llama and the families written like it (`modeling_llama.py`, and Mistral, Qwen2, Qwen3,
//! Mixtral …, which transformers generates from it with `# Copied from` / modular code):
//! pre-norm decoder layers of RMSNorm → attention with RoPE → residual → RMSNorm → gated MLP
//! (or a sparse MoE block) → residual.

use super::super::blocks::shapes::{heads, heads_bshd, tok, tok_tp};
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Group, Out, Shape, Split, Tid, B, S, X};
use super::common::{cos_shape, has_rope, rotary_dims, Kind, Params, Shared};
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::Attention;
use crate::estimator::model::{Linear, ModelSpec};
use crate::estimator::step::part::Part;

/// `LlamaRMSNorm.forward`:
/// ```python
/// input_dtype = hidden_states.dtype
/// hidden_states = hidden_states.to(torch.float32)
/// variance = hidden_states.pow(2).mean(-1, keepdim=True)
/// hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
/// return self.weight * hidden_states.to(input_dtype)
/// ```
/// Keeps the fp32 input (pow, mul), the rsqrt, and the normalized input in the input dtype
/// (the weight's gradient). `variance` and the fp32 product live until the return.
pub fn rms_norm(b: &mut Builder, x: Tid, w: Option<Tid>) -> Tid {
    let in_dt = b.t(x).dt;
    let x32 = b.to_copy(x, Dt::F32);
    let sq = b.pow(x32);
    let var = b.mean_last(sq);
    let ve = b.add_scalar(var);
    let r = b.rsqrt(ve);
    let n32 = b.mul(x32, r);
    let n = b.to_copy(n32, in_dt);
    let y = match w {
        Some(w) => b.mul(w, n),
        None => n,
    };
    b.hold(var);
    b.hold(n32);
    // The caller's argument lives until the module returns.
    b.hold(x);
    y
}

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

/// Phi-3's `apply_rotary_pos_emb`: `q_rot, q_pass = q[..., :d_rot], q[..., d_rot:]` (and the
/// same for k, both before any math), then `cat([rope(x_rot), x_pass], -1)` for q, then k — a
/// full copy even when every dim rotates (then `x_rot` is an alias and `x_pass` empty).
pub fn rope_cat(b: &mut Builder, q: Tid, k: Tid, cos: Tid, sin: Tid, rot: Dim) -> (Tid, Tid) {
    let partial = !matches!(rot, Dim::Q(Q::D));
    let split = |b: &mut Builder, x: Tid| {
        let full = b.shape(x);
        if partial {
            (b.slice(x, full.last(rot)), b.slice(x, full.last(Dim::N(0))))
        } else {
            (b.alias(x), b.slice(x, full.last(Dim::N(0))))
        }
    };
    let (qr, qp) = split(b, q);
    let (kr, kp) = split(b, k);
    let r = rope(b, qr, cos, sin, Q::A);
    let qs = b.shape(q);
    let qe = b.cat2(r, qp, qs);
    let r = rope(b, kr, cos, sin, Q::KV);
    let ks = b.shape(k);
    let ke = b.cat2(r, kp, ks);
    (qe, ke)
}

/// The attention's parameters, in registration order (`q_proj`, `k_proj`, `v_proj`, `o_proj`).
#[derive(Clone, Copy)]
pub struct AttnW {
    pub wq: Option<Tid>,
    pub bq: Option<Tid>,
    pub wk: Option<Tid>,
    pub bk: Option<Tid>,
    pub wv: Option<Tid>,
    pub bv: Option<Tid>,
    pub wo: Option<Tid>,
    pub bo: Option<Tid>,
    /// Per-head q/k norm weights (Qwen3, Gemma-3: `q_norm`, `k_norm`, registered after `o_proj`).
    pub qn: Option<Tid>,
    pub kn: Option<Tid>,
}

impl AttnW {
    pub fn new(b: &mut Builder, p: &Params) -> AttnW {
        let wq = p.w(b, "layers.*.attn.q_proj.weight");
        let bq = p.w(b, "layers.*.attn.q_proj.bias");
        let wk = p.w(b, "layers.*.attn.k_proj.weight");
        let bk = p.w(b, "layers.*.attn.k_proj.bias");
        let wv = p.w(b, "layers.*.attn.v_proj.weight");
        let bv = p.w(b, "layers.*.attn.v_proj.bias");
        let wo = p.w(b, "layers.*.attn.o_proj.weight");
        let bo = p.w(b, "layers.*.attn.o_proj.bias");
        let qn = p.w(b, "layers.*.attn.q_norm.weight");
        let kn = p.w(b, "layers.*.attn.k_norm.weight");
        AttnW { wq, bq, wk, bk, wv, bv, wo, bo, qn, kn }
    }
}

/// The gated MLP's parameters (`gate_proj`, `up_proj`, `down_proj`).
#[derive(Clone, Copy)]
pub struct MlpW {
    pub wg: Option<Tid>,
    pub wu: Option<Tid>,
    pub wd: Option<Tid>,
}

impl MlpW {
    pub fn new(b: &mut Builder, p: &Params) -> MlpW {
        let wg = p.w(b, "layers.*.mlp.gate_proj.weight");
        let wu = p.w(b, "layers.*.mlp.up_proj.weight");
        let wd = p.w(b, "layers.*.mlp.down_proj.weight");
        MlpW { wg, wu, wd }
    }
}

/// The attention block (`LlamaAttention.forward` with the `sdpa` or `eager` interface): the
/// q, k, v projections and their head views, RoPE, the attention core, `o_proj`. Returns the
/// output and `attn_weights` (eager: the probabilities, which the caller's `_` holds until the
/// decoder layer returns).
pub fn attention(b: &mut Builder, w: &AttnW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let name = |s: &'static str| s;
    let AttnW { wq, bq, wk, bk, wv, bv, wo, bo, qn, kn } = *w;
    let eager = attn == Attention::Eager;
    let head_norm = spec.qk_norm == crate::estimator::model::QkNorm::Head;
    let proj = |b: &mut Builder,
                w: Option<Tid>,
                bias: Option<Tid>,
                h: Q,
                module: &'static str,
                norm: Option<(Option<Tid>, &'static str)>,
                clone_bw: bool,
                lin: Linear|
     -> Tid {
        b.module = module;
        b.part = Part::AttentionInputs;
        let y = match w {
            Some(w) => b.proj(x, w, bias, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(h), Dim::Q(Q::D)], Split::Tp), lin),
            None => x,
        };
        b.module = "self_attn";
        let mut v = b.view(y, heads_bshd(h), "ViewBackward0", clone_bw);
        if let Some((nw, module)) = norm {
            // q_norm / k_norm over head_dim on the [b, s, heads, d] view (Qwen3).
            b.module = module;
            b.part = Part::AttentionCore;
            v = rms_norm(b, v, nw);
            b.module = "self_attn";
        }
        b.view(v, heads(h), "TransposeBackward0", false)
    };
    // The gradients of q and k come back through RoPE in a layout `reshape` must copy; v's
    // (from SDPA, laid out like v) views, except after eager attention's bmm.
    let qnorm = head_norm.then_some((qn, "self_attn.q_norm"));
    let knorm = head_norm.then_some((kn, "self_attn.k_norm"));
    // A NoPE layer (no cos/sin in its view) hands q and k to the core as it hands v.
    let qk_clone = !super::common::nope_view(spec, sh) || eager;
    let q = proj(b, wq, bq, Q::A, name("self_attn.q_proj"), qnorm, qk_clone, Linear::Q);
    let k = proj(b, wk, bk, Q::KV, name("self_attn.k_proj"), knorm, qk_clone, Linear::K);
    // A mask under SDPA (a sliding window shorter than the keys, `mistral.rs`) repeats k and v:
    // v's gradient then comes back from a `sum`, laid out like eager's.
    let masked_sdpa = !eager && sh.mask.is_some();
    let v = proj(b, wv, bv, Q::KV, name("self_attn.v_proj"), None, eager || masked_sdpa, Linear::V);
    b.part = Part::AttentionCore;
    let (q, k) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) if has_rope(spec) && rotary_dims(spec) == spec.head_dim => {
            let qe = rope(b, q, cos, sin, Q::A);
            let ke = rope(b, k, cos, sin, Q::KV);
            b.hold(q);
            b.hold(k);
            (qe, ke)
        }
        _ => (q, k),
    };
    b.module = "self_attn";
    let (region, q, k, v) = selective_begin(b, q, k, v);
    let (o, weights) = match sh.mask {
        _ if eager => eager_core(b, spec, q, k, v, sh.mask),
        Some(m) => (sdpa_masked(b, q, k, v, m), None),
        None => (sdpa_core(b, q, k, v), None),
    };
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
    let s32 = b.to_copy(sa, Dt::F32);
    let pr = b.unary("_softmax", "SoftmaxBackward0", s32, Keep::Output, "_softmax_backward_data");
    let pc = b.to_copy(pr, b.t(q).dt);
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
    gated_mlp(b, w, x, SILU)
}

/// An activation as the gated MLP runs it: (aten op, autograd node, its backward op).
pub type Act = (&'static str, &'static str, &'static str);
/// `F.silu`.
pub const SILU: Act = ("silu", "SiluBackward0", "silu_backward");
/// `gelu_pytorch_tanh` (Gemma's `hidden_activation`).
pub const GELU_TANH: Act = ("gelu", "GeluBackward0", "gelu_backward");

/// `down_proj(act(gate_proj(x)) * up_proj(x))` (`LlamaMLP`, `Gemma2MLP`, …): the activation keeps
/// its input, the product keeps both factors.
pub fn gated_mlp(b: &mut Builder, w: &MlpW, x: Tid, act: Act) -> Tid {
    let MlpW { wg, wu, wd } = *w;
    b.part = Part::Mlp;
    let f = || tok_tp(Dim::Q(Q::F));
    b.module = "mlp.gate_proj";
    let g = match wg {
        Some(w) => b.proj(x, w, None, f(), Linear::Gate),
        None => x,
    };
    b.module = "mlp.act_fn";
    let (op, node, back) = act;
    let a = b.unary(op, node, g, Keep::Input, back);
    b.module = "mlp.up_proj";
    let u = match wu {
        Some(w) => b.proj(x, w, None, f(), Linear::Up),
        None => x,
    };
    b.module = "mlp";
    let m = b.mul(a, u);
    b.module = "mlp.down_proj";
    match wd {
        Some(w) => b.proj(m, w, None, tok(Q::H), Linear::Down),
        None => m,
    }
}

/// One decoder layer (`LlamaDecoderLayer.forward`).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    b.group = Group::All;
    // Parameters in registration order: self_attn, mlp, input_layernorm, post_attention_layernorm.
    let aw = AttnW::new(b, p);
    let ffn = match kind {
        Kind::Moe => Ffn::Moe(super::moe::MoeW::new(b, p)),
        Kind::Dense => Ffn::Dense(MlpW::new(b, p)),
    };
    let norms = norm_weights(b, p, spec);
    b.module = "input_layernorm";
    b.part = Part::Norms;
    let n1 = rms_norm(b, x, norms[0]);
    let (a, weights) = attention(b, &aw, spec, n1, sh, attn);
    b.hold(n1);
    b.module = "";
    b.part = Part::Norms;
    let h = b.add(x, a);
    b.module = "post_attention_layernorm";
    let n2 = rms_norm(b, h, norms[1]);
    b.group = if kind == Kind::Moe { Group::Moe } else { Group::Dense };
    let m = match ffn {
        Ffn::Dense(mw) => mlp(b, &mw, n2),
        Ffn::Moe(w) => super::moe::sparse_block(b, &w, n2, true),
    };
    b.group = Group::All;
    b.hold(n2);
    b.module = "";
    let y = b.add(h, m);
    b.hold(h);
    if let Some(w) = weights {
        b.hold(w);
    }
    y
}

/// A layer's feed-forward parameters.
enum Ffn {
    Dense(MlpW),
    Moe(super::moe::MoeW),
}

/// The layer's norm weights (registered after the attention and MLP in Llama).
fn norm_weights(b: &mut Builder, p: &Params, spec: &ModelSpec) -> [Option<Tid>; 2] {
    let _ = spec;
    [p.w(b, "layers.*.norm.weight"), p.w(b, "layers.*.norm.weight")]
}

/// `LlamaModel.forward` before the layers: the token embedding, `cache_position` /
/// `position_ids`, the causal-mask preparation (`create_causal_mask`) and the rotary embedding.
pub fn embed(b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
    let (x0, emb_w) = token_embedding(b, p, ids);
    model_inputs(b, spec, attn, x0, emb_w, None)
}

/// `model.embed_tokens` on the token ids: the residual stream's first tensor and the embedding
/// weight (the head's too when tied).
pub fn token_embedding(b: &mut Builder, p: &Params, ids: Tid) -> (Tid, Option<Tid>) {
    b.part = Part::Embedding;
    b.module = "model.embed_tokens";
    let emb_w = p.w(b, "embed_tokens.weight");
    let x0 = match emb_w {
        Some(w) => embedding(b, ids, w),
        None => b.plain("embedding", &[ids], tok(Q::H), Dt::Resid),
    };
    (x0, emb_w)
}

/// A pair of masks a model builds from its positions instead of Llama's one (Gemma-2's full
/// and sliding-window masks under eager attention): `(full, local)`.
pub type TwoMasks = fn(&mut Builder, Tid) -> (Tid, Tid);

/// The rest of the model's forward before the layers, after the embedding `x0`: positions, the
/// causal mask (or `two_masks`' pair) and the rotary tables, as the layers receive them.
pub fn model_inputs(
    b: &mut Builder,
    spec: &ModelSpec,
    attn: Attention,
    x0: Tid,
    emb_w: Option<Tid>,
    two_masks: Option<TwoMasks>,
) -> (Tid, Shared) {
    b.module = "model";
    let (pos, mask, mask_local) = match two_masks {
        Some(masks) => {
            let s1 = Shape::new(&[Dim::Q(Q::S)], Split::None);
            let ar = b.plain("arange", &[], s1, Dt::I64);
            let pos = b.plain("add", &[ar], s1, Dt::I64);
            b.p.tensors[pos as usize].part = Some(Part::Checkpoints);
            let (full, local) = masks(b, pos);
            (pos, Some(full), Some(local))
        }
        None => {
            let (pos, mask) = positions_and_mask(b, attn);
            (pos, mask, None)
        }
    };
    let (cos, sin) = if has_rope(spec) {
        let (c, s) = rotary(b, spec, pos);
        (Some(c), Some(s))
    } else {
        (None, None)
    };
    (
        x0,
        Shared {
            cos,
            sin,
            pos: Some(pos),
            mask,
            mask_local,
            emb_w: if spec.tied { emb_w } else { None },
            locals: [Some(x0), None],
            cos_local: None,
            sin_local: None,
        },
    )
}

/// `nn.Embedding` on the token ids: keeps the ids; EmbeddingBackward0 allocates the weight's
/// gradient (`embedding_dense_backward`).
pub fn embedding(b: &mut Builder, ids: Tid, w: Tid) -> Tid {
    use super::super::ir::{B, S};
    let rg = b.rg(w);
    let out = b.out(tok(Q::H), Dt::Resid, rg);
    let g = b.grad_bytes(w);
    let bw: &[B] =
        if rg { &[B::Alloc { bytes: g, dtype: b.t(w).dtype, op: "embedding_dense_backward" }, B::Grad { input: 1, temp: 0 }] } else { &[] };
    b.op("embedding", "EmbeddingBackward0", &[ids, w], &[out], &[S::In(0)], bw)[0]
}

/// `cache_position = arange(s) + past`, `position_ids = cache_position[None]`, then
/// `create_causal_mask` ([`mask_only`]).
pub fn positions_and_mask(b: &mut Builder, attn: Attention) -> (Tid, Option<Tid>) {
    let s1 = Shape::new(&[Dim::Q(Q::S)], Split::None);
    let ar = b.plain("arange", &[], s1, Dt::I64);
    let pos = b.plain("add", &[ar], s1, Dt::I64);
    b.p.tensors[pos as usize].part = Some(Part::Checkpoints);
    mask_only(b, pos, attn)
}

/// `create_causal_mask`: packed-sequence detection (`find_packed_sequence_indices`), and for
/// eager attention the materialized additive mask `[b, 1, s, s_kv]` (`sdpa_mask` + `where`).
pub fn mask_only(b: &mut Builder, pos: Tid, attn: Attention) -> (Tid, Option<Tid>) {
    let s1 = || Shape::new(&[Dim::Q(Q::S)], Split::None);
    packed_detection(b, pos);
    let mask = if attn == Attention::Eager {
        let ba = b.plain("arange", &[], Shape::new(&[Dim::Q(Q::B)], Split::None), Dt::I64);
        let ha = b.plain("arange", &[], Shape::new(&[Dim::N(1)], Split::None), Dt::I64);
        let kv0 = b.plain("arange", &[], s1(), Dt::I64);
        let kv = b.plain("add", &[kv0], s1(), Dt::I64);
        let q0 = b.plain("arange", &[], s1(), Dt::I64);
        let qi = b.plain("add", &[q0], s1(), Dt::I64);
        let le = b.plain("le", &[kv, qi], Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None), Dt::Bool);
        b.hold(ba);
        b.hold(ha);
        b.hold(kv);
        b.hold(qi);
        let zero = b.plain("zeros", &[], Shape::scalar(), Dt::Resid);
        let min = b.plain("scalar_tensor", &[], Shape::scalar(), Dt::Resid);
        let m = b.plain("where", &[le, zero, min], Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None), Dt::Resid);
        b.p.tensors[m as usize].part = Some(Part::Checkpoints);
        Some(m)
    } else {
        None
    };
    (pos, mask)
}

/// `find_packed_sequence_indices(position_ids)`: a diff with a prepended column, `!= 1`,
/// `cumsum`, and the `all()` check — int64 temporaries of `[b, s]`.
pub fn packed_detection(b: &mut Builder, pos: Tid) {
    let bs = || Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None);
    // find_packed_sequence_indices(position_ids): diff with a prepended column, != 1, cumsum.
    let first = b.plain("sub", &[pos], Shape::new(&[Dim::Q(Q::B), Dim::N(1)], Split::None), Dt::I64);
    let cat = b.plain("cat", &[first, pos], Shape::new(&[Dim::Q(Q::B), Dim::Plus1(Q::S)], Split::None), Dt::I64);
    let diff = b.plain("sub", &[cat], bs(), Dt::I64);
    let ne = b.plain("ne", &[diff], bs(), Dt::Bool);
    let cs = b.plain("cumsum", &[ne], bs(), Dt::I64);
    let eq = b.plain("eq", &[cs], Shape::new(&[Dim::Q(Q::B)], Split::None), Dt::Bool);
    let _all = b.plain("all", &[eq], Shape::scalar(), Dt::Bool);
    b.hold(first);
    b.hold(diff);
    b.hold(cs);
}

/// `LlamaRotaryEmbedding.forward`: `freqs = inv_freq @ position_ids` (a `mul` for one
/// position row), `emb = cat(freqs, freqs)`, `cos = emb.cos() * attention_scaling`, the same for
/// sin, both cast to the hidden states' dtype. Returns `(cos, sin)` `[1, s, d_rot]`.
pub fn rotary(b: &mut Builder, spec: &ModelSpec, pos: Tid) -> (Tid, Tid) {
    b.module = "model.rotary_emb";
    let full = cos_shape(spec);
    let half = if rotary_dims(spec) == spec.head_dim { full.last(Dim::Half(Q::D)) } else { full.last(Dim::HalfX(X::DRot)) };
    let pf = b.plain("_to_copy", &[pos], Shape::new(&[Dim::Q(Q::S)], Split::None), Dt::F32);
    let freqs = b.plain("mul", &[pf], half, Dt::F32);
    let emb = b.plain("cat", &[freqs], full, Dt::F32);
    let c = b.plain("cos", &[emb], full, Dt::F32);
    let cs = b.plain("mul", &[c], full, Dt::F32);
    let s = b.plain("sin", &[emb], full, Dt::F32);
    let ss = b.plain("mul", &[s], full, Dt::F32);
    let cos = b.to_copy(cs, Dt::Resid);
    let sin = b.to_copy(ss, Dt::Resid);
    b.hold(freqs);
    b.hold(emb);
    b.hold(cs);
    b.hold(ss);
    for t in [cos, sin] {
        b.p.tensors[t as usize].part = Some(Part::Embedding);
    }
    (cos, sin)
}

/// What `LlamaModel.forward` computes after the embedding (also a later pipeline stage's
/// prologue): positions, the causal mask ([`positions_and_mask`]) and the rotary embedding.
pub fn positions(b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
    let (pos, mask) = positions_and_mask(b, attn);
    let (cos, sin) = if has_rope(spec) {
        let (c, s) = rotary(b, spec, pos);
        (Some(c), Some(s))
    } else {
        (None, None)
    };
    Shared { cos, sin, pos: Some(pos), mask, ..Shared::default() }
}

/// The final norm (`model.norm`).
pub fn final_norm(b: &mut Builder, p: &Params, x: Tid) -> Tid {
    b.module = "model.norm";
    b.part = Part::Head;
    let w = p.w(b, "norm.weight");
    rms_norm(b, x, w)
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
    let rg = b.rg(q) || b.rg(k) || b.rg(v);
    let o: Out = b.out(b.shape(q), qdt, rg);
    let lse = b.out(Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::A), Dim::Q(Q::S)], Split::Tp), Dt::F32, false);
    const BW: &str = "_scaled_dot_product_flash_attention_for_cpu_backward";
    let mut bw: Vec<B> = Vec::with_capacity(6);
    let mut grads: Vec<(u8, u8)> = Vec::with_capacity(3);
    for (i, t) in [q, k, v].into_iter().enumerate() {
        if b.rg(t) {
            grads.push((i as u8, bw.len() as u8));
            bw.push(B::Alloc { bytes: b.bytes(t), dtype: b.t(t).dtype, op: BW });
        }
    }
    bw.extend(grads.into_iter().map(|(input, temp)| B::Grad { input, temp }));
    let r = b.op(
        "_scaled_dot_product_flash_attention_for_cpu",
        "ScaledDotProductFlashAttentionForCpuBackward0",
        &[q, k, v, add],
        &[o, lse],
        &[S::In(0), S::In(1), S::In(2), S::In(3), S::Out(0), S::Out(1)],
        &bw,
    );
    if how.hold_kv {
        b.hold(k);
        b.hold(v);
    }
    let ot = b.view(r[0], heads_bshd(Q::A), "TransposeBackward0", false);
    b.view(ot, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::A), Dim::Q(Q::D)], Split::Tp), "ViewBackward0", false)
}
