//! GLM-4.5 (`glm4_moe`; transformers 5.24 `models/glm4_moe/modeling_glm4_moe.py`): Llama's
//! pre-norm layer with biased q/k/v projections, an optional per-head q/k RMSNorm
//! (`use_qk_norm`), partial rotary embedding (`partial_rotary_factor`: only the first d_rot dims
//! of each head rotate, the rest pass through and are concatenated back), dense MLPs on the
//! first `first_k_dense_replace` layers, and the sigmoid-routed MoE block with shared experts
//! ([`super::sigmoid_moe`]) on the others.

use super::super::blocks::shapes::{heads, heads_bshd};
use super::super::ir::{Builder, Tid};
use super::common::{head_proj, rms_norm, AttnW, Kind, Params, Rms, Shared};
use super::llama::{attend_out, rope_partial, Core, PartialRope};
use super::modeling::Modeling;
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::Attention;
use crate::estimator::model::{Linear, ModelSpec, QkNorm};
use crate::estimator::step::part::Part;

/// `Glm4MoeAttention.forward`: q/k/v projections (with biases under `attention_bias`) viewed
/// `[b, s, heads, d]`, q_norm/k_norm there when `use_qk_norm`, transposed, partial RoPE, the
/// attention core (q and k contiguous after the `cat`), `o_proj` (no bias).
fn attention(b: &mut Builder, w: &AttnW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let eager = attn == Attention::Eager;
    let proj = |b: &mut Builder, w: Option<Tid>, bias: Option<Tid>, h: Q, module: &'static str, clone_bw: bool, lin: Linear| -> Tid {
        let y = head_proj(b, x, w, bias, h, module, lin);
        b.module = "self_attn";
        b.view(y, heads_bshd(h), "ViewBackward0", clone_bw)
    };
    // q, k, v projected and viewed first; then the norms (GLM's "main diff from Llama"); then
    // the transposes. The gradients of q and k come back through RoPE's `cat` in a layout the
    // view's `reshape` must copy; v's only after eager attention's bmm.
    let q = proj(b, w.wq, w.bq, Q::A, "self_attn.q_proj", true, Linear::Q);
    let k = proj(b, w.wk, w.bk, Q::KV, "self_attn.k_proj", true, Linear::K);
    let v = proj(b, w.wv, w.bv, Q::KV, "self_attn.v_proj", eager, Linear::V);
    let (q, k) = if spec.qk_norm == QkNorm::Head {
        b.part = Part::AttentionCore;
        b.module = "self_attn.q_norm";
        let qn = rms_norm(b, q, w.qn, Rms::Llama);
        b.module = "self_attn.k_norm";
        (qn, rms_norm(b, k, w.kn, Rms::Llama))
    } else {
        (q, k)
    };
    b.module = "self_attn";
    let q = b.view(q, heads(Q::A), "TransposeBackward0", false);
    let k = b.view(k, heads(Q::KV), "TransposeBackward0", false);
    let v = b.view(v, heads(Q::KV), "TransposeBackward0", false);
    b.part = Part::AttentionCore;
    let (q, k) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) => {
            // Both rotations before both concatenations; the caller's q and k are rebound only
            // after `apply_rotary_pos_emb` returns.
            let how = PartialRope { slice_full: true, promote: true, ..PartialRope::default() };
            let qk = rope_partial(b, spec, q, k, cos, sin, how);
            b.hold(q);
            b.hold(k);
            qk
        }
        _ => (q, k),
    };
    attend_out(b, spec, [q, k, v], sh, attn, Core { selective: false, ..Core::CONTIGUOUS }, (w.wo, w.bo))
}

/// `Glm4MoeDecoderLayer.forward` (Llama's, [`super::sigmoid_moe::layer`]).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    let aw = AttnW::new(b, p);
    super::sigmoid_moe::layer(b, p, spec, x, kind, |b, n| attention(b, &aw, spec, n, sh, attn), super::sigmoid_moe::router_normalized)
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
    use super::super::common::rotary_dims;
    use crate::estimator::presets::preset;

    #[test]
    fn glm_4_5_air_rotates_half_of_each_head() {
        let glm = preset("glm-4.5-air").expect("preset").spec;
        // Half of each head rotates: d_rot = 64 of d = 128.
        assert_eq!((rotary_dims(&glm), glm.head_dim), (64, 128));
    }
}
