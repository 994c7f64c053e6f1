//! GLM-4.5 (`glm4_moe`; transformers 5.24 `models/glm4_moe/modeling_glm4_moe.py`): Llama's
//! pre-norm layer with biased q/k/v projections, an optional per-head q/k RMSNorm
//! (`use_qk_norm`), partial rotary embedding (`partial_rotary_factor`: only the first d_rot dims
//! of each head rotate, the rest pass through and are concatenated back), dense MLPs on the
//! first `first_k_dense_replace` layers, and the sigmoid-routed MoE block with shared experts
//! ([`super::sigmoid_moe`]) on the others.

use super::super::blocks::shapes::{heads, heads_bshd, tok};
use super::super::ir::{Builder, Dim, Group, Shape, Split, Tid, X};
use super::common::{rotary_dims, Kind, Params, Shared};
use super::llama::{eager_core_with, mlp, rms_norm, rope, sdpa_core_copy, AttnW, MlpW};
use super::modeling::Modeling;
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::Attention;
use crate::estimator::model::{Linear, ModelSpec, QkNorm};
use crate::estimator::step::part::Part;

/// `apply_rotary_pos_emb` of `modeling_glm4_moe.py`:
/// ```python
/// rotary_dim = cos.shape[-1]
/// q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
/// k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
/// q_embed = (q_rot * cos) + (rotate_half(q_rot) * sin)
/// k_embed = (k_rot * cos) + (rotate_half(k_rot) * sin)
/// q_embed = torch.cat([q_embed, q_pass], dim=-1)
/// k_embed = torch.cat([k_embed, k_pass], dim=-1)
/// ```
/// Both rotations come before both concatenations (Phi-3's interleaves them).
fn rope_partial(b: &mut Builder, spec: &ModelSpec, q: Tid, k: Tid, cos: Tid, sin: Tid) -> (Tid, Tid) {
    let rot = if rotary_dims(spec) == spec.head_dim { Dim::Q(Q::D) } else { Dim::X(X::DRot) };
    let split = |b: &mut Builder, x: Tid| {
        let full = b.shape(x);
        (b.slice(x, full.last(rot)), b.slice(x, full.last(Dim::N(0))))
    };
    let (qr, qp) = split(b, q);
    let (kr, kp) = split(b, k);
    let qe = rope(b, qr, cos, sin, Q::A);
    let ke = rope(b, kr, cos, sin, Q::KV);
    let qs = b.shape(q);
    let qc = super::deepseek::cat_promote(b, qe, qp, qs);
    let ks = b.shape(k);
    let kc = super::deepseek::cat_promote(b, ke, kp, ks);
    // The caller's q and k (and the function's arguments) are rebound only after it returns.
    b.hold(q);
    b.hold(k);
    (qc, kc)
}

/// `Glm4MoeAttention.forward`: q/k/v projections (with biases under `attention_bias`) viewed
/// `[b, s, heads, d]`, q_norm/k_norm there when `use_qk_norm`, transposed, partial RoPE, the
/// attention core (q and k contiguous after the `cat`), `o_proj` (no bias).
fn attention(b: &mut Builder, w: &AttnW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let AttnW { wq, bq, wk, bk, wv, bv, wo, bo, qn, kn } = *w;
    let eager = attn == Attention::Eager;
    let head_norm = spec.qk_norm == QkNorm::Head;
    let proj = |b: &mut Builder, w: Option<Tid>, bias: Option<Tid>, h: Q, module: &'static str, clone_bw: bool, lin: Linear| -> Tid {
        b.module = module;
        b.part = Part::AttentionInputs;
        let y = match w {
            Some(w) => b.proj(x, w, bias, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(h), Dim::Q(Q::D)], Split::Tp), lin),
            None => x,
        };
        b.module = "self_attn";
        b.view(y, heads_bshd(h), "ViewBackward0", clone_bw)
    };
    // q, k, v projected and viewed first; then the norms (GLM's "main diff from Llama"); then
    // the transposes. The gradients of q and k come back through RoPE's `cat` in a layout the
    // view's `reshape` must copy; v's only after eager attention's bmm.
    let q = proj(b, wq, bq, Q::A, "self_attn.q_proj", true, Linear::Q);
    let k = proj(b, wk, bk, Q::KV, "self_attn.k_proj", true, Linear::K);
    let v = proj(b, wv, bv, Q::KV, "self_attn.v_proj", eager, Linear::V);
    let (q, k) = if head_norm {
        b.part = Part::AttentionCore;
        b.module = "self_attn.q_norm";
        let qn2 = rms_norm(b, q, qn);
        b.module = "self_attn.k_norm";
        let kn2 = rms_norm(b, k, kn);
        (qn2, kn2)
    } else {
        (q, k)
    };
    b.module = "self_attn";
    let q = b.view(q, heads(Q::A), "TransposeBackward0", false);
    let k = b.view(k, heads(Q::KV), "TransposeBackward0", false);
    let v = b.view(v, heads(Q::KV), "TransposeBackward0", false);
    b.part = Part::AttentionCore;
    b.module = "self_attn";
    let (q, k) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) => rope_partial(b, spec, q, k, cos, sin),
        _ => (q, k),
    };
    let (o, weights) = if eager { eager_core_with(b, spec, q, k, v, sh.mask, true) } else { (sdpa_core_copy(b, q, k, v, true), None) };
    b.part = Part::AttentionInputs;
    b.module = "self_attn.o_proj";
    let out = match wo {
        Some(w) => b.proj(o, w, bo, tok(Q::H), Linear::O),
        None => o,
    };
    for t in [q, k, v] {
        b.hold(t);
    }
    (out, weights)
}

/// `Glm4MoeDecoderLayer.forward` (Llama's): `h = x + attn(norm1(x))`, `y = h + mlp(norm2(h))`.
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    b.group = Group::All;
    // Registration order: self_attn, mlp, input_layernorm, post_attention_layernorm.
    let aw = AttnW::new(b, p);
    let ffn = match kind {
        Kind::Moe => Err(super::sigmoid_moe::SigmoidMoeW::new(b, p)),
        Kind::Dense => Ok(MlpW::new(b, p)),
    };
    let n1w = p.w(b, "layers.*.norm.weight");
    let n2w = p.w(b, "layers.*.norm.weight");
    b.module = "input_layernorm";
    b.part = Part::Norms;
    let n1 = rms_norm(b, x, n1w);
    let (a, weights) = attention(b, &aw, spec, n1, sh, attn);
    b.hold(n1);
    b.module = "";
    b.part = Part::Norms;
    let h = b.add(x, a);
    b.module = "post_attention_layernorm";
    let n2 = rms_norm(b, h, n2w);
    b.group = if kind == Kind::Moe { Group::Moe } else { Group::Dense };
    let m = match ffn {
        Ok(mw) => mlp(b, &mw, n2),
        Err(w) => super::sigmoid_moe::block(b, spec, &w, n2, spec_norm_topk(spec)),
    };
    b.group = Group::All;
    b.hold(n2);
    b.module = "";
    b.part = Part::Norms;
    let y = b.add(h, m);
    b.hold(h);
    if let Some(w) = weights {
        b.hold(w);
    }
    y
}

/// `norm_topk_prob`: the importer does not keep it; GLM-4.5 and DeepSeek-V3 checkpoints set it
/// (the configuration classes default to `True`).
fn spec_norm_topk(spec: &ModelSpec) -> bool {
    let _ = spec;
    true
}

/// GLM-4.5 (`modeling_glm4_moe.py`): partial rotary on interleaved halves, q/k/v biases,
/// optional q/k norms, the sigmoid router of DeepSeek-V3.
pub struct Glm4Moe;
impl Modeling for Glm4Moe {
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::presets::preset;

    #[test]
    fn glm_4_5_air_rotates_half_of_each_head() {
        let glm = preset("glm-4.5-air").expect("preset").spec;
        // Half of each head rotates: d_rot = 64 of d = 128.
        assert_eq!((rotary_dims(&glm), glm.head_dim), (64, 128));
    }
}
