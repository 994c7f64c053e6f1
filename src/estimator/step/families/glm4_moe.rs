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
use super::modeling::{ConfigFile, Modeling};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{Linear, ModelSpec, QkNorm, Router};
use crate::estimator::part::Part;
use crate::estimator::preset_base::{llama, Preset};
use serde_json::{Map, Value};

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

/// GLM-4.5-Air: 96 query / 8 KV heads of 128 with q/k/v biases, half-rotary, one dense layer of
/// 10,944, then 128 routed (top-8) + 1 shared expert of 1,408, sigmoid fp32 router.
const fn glm45_air() -> ModelSpec {
    let mut m = llama(151_552, 4096, 46, 96, 8, 10_944, 131_072);
    m.family = Family::Glm4Moe;
    m.head_dim = 128;
    m.qkv_bias = true;
    m.rotary_pct = 50;
    m.experts = 128;
    m.top_k = 8;
    m.expert_ffn = 1408;
    m.shared_experts = 1;
    m.shared_ffn = 1408;
    m.dense_layers = 1;
    m.fused_experts = true;
    m.router = Router::Sigmoid;
    m.router_fp32 = true;
    m.router_groups = 1;
    m.router_group_topk = 1;
    m
}

/// GLM-4.5 (`modeling_glm4_moe.py`): partial rotary on interleaved halves, q/k/v biases,
/// optional q/k norms, the sigmoid router of DeepSeek-V3.
pub struct Glm4Moe;
impl ConfigFile for Glm4Moe {
    /// GLM-4.5 (configuration_glm4_moe.py, modeling_glm4_moe.py): partial rotary, q/k/v biases,
    /// optional q/k RMSNorm over the head, `first_k_dense_replace` dense layers, then MoE with a
    /// shared expert and a sigmoid router with correction bias.
    fn import(&self, _t: &str, f: &Fields, notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_like(
            f,
            fields::Dims {
                vocab: 151_552,
                hidden: 4096,
                layers: 46,
                heads: 96,
                kv_heads: Some(8),
                head_dim: None,
                ffn: 10_944,
                max_pos: 131_072,
                tied: false,
            },
        )?;
        m.qkv_bias = f.flag("attention_bias", false)?;
        m.o_bias = false;
        if f.flag("use_qk_norm", false)? {
            m.qk_norm = QkNorm::Head;
        }
        m.rotary_pct = f.rotary_pct(0.5)?;
        m.experts = f.size_any(&["n_routed_experts", "num_local_experts"], 128)?;
        m.top_k = f.uint_or("num_experts_per_tok", 8)?;
        m.expert_ffn = f.size("moe_intermediate_size", 1408)?;
        m.shared_experts = f.uint_or("n_shared_experts", 1)?;
        m.shared_ffn = m.expert_ffn;
        m.dense_layers = f.uint_or("first_k_dense_replace", 1)?.min(m.layers);
        m.fused_experts = true;
        m.router = Router::Sigmoid;
        m.router_fp32 = true;
        m.router_groups = f.uint_or("n_group", 1)?;
        m.router_group_topk = f.uint_or("topk_group", 1)?;
        notes.extend(fields::mtp_note(f, "Glm4MoeForCausalLM")?);
        Ok(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(act) = writer::act_name(s.act) else { return Vec::new() };
        let mut w = writer::Writer::new("glm4_moe");
        writer::llama_sizes(&mut w, s);
        w.set("hidden_act", act)
            .set("intermediate_size", s.ffn)
            .set("attention_bias", s.qkv_bias)
            .set("use_qk_norm", s.qk_norm == QkNorm::Head)
            .set("partial_rotary_factor", writer::rotary_fraction(s))
            .set("n_routed_experts", s.experts)
            .set("num_experts_per_tok", s.top_k)
            .set("moe_intermediate_size", s.expert_ffn)
            .set("n_shared_experts", s.shared_experts)
            .set("first_k_dense_replace", s.dense_layers)
            .set("n_group", s.router_groups)
            .set("topk_group", s.router_group_topk)
            .done()
            .into_iter()
            .collect()
    }
}

impl Modeling for Glm4Moe {
    fn presets(&self) -> Vec<Preset> {
        vec![Preset::new(45, "glm-4.5-air", "zai-org/GLM-4.5-Air", "GLM-4.5", glm45_air()).with_notes(&[
            "the checkpoint's multi-token-prediction layer (num_nextn_predict_layers 1) is not built by transformers' Glm4MoeForCausalLM and is not counted",
        ])]
    }
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
