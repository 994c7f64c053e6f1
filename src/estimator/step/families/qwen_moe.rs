//! Qwen2-MoE and Qwen3-MoE (`modeling_qwen2_moe.py`, `modeling_qwen3_moe.py`): Llama's decoder
//! layer (Qwen3-MoE with its per-head q/k norms) whose sparse layers route through
//! `Qwen*TopKRouter` — Mixtral's router, but its top-k weights are renormalised only when
//! `norm_topk_prob` and then cast back to the logits' dtype — and, in Qwen2-MoE, a shared expert
//! gated by a sigmoid (`shared_expert_gate`, a h → 1 linear); the block is
//! [`super::moe::sparse_block`].

use super::super::ir::{Builder, Tid};
use super::common::{cache_position, causal_mask, rope_pair, sliding_window_mask};
use super::common::{AttnW, Kind, Norm, Params, Rms, Shared};
use super::llama::{attention, decoder_layer, Ffn};
use super::modeling::{ConfigFile, Modeling};
use super::moe::{sparse_block, MoeW, SharedW, Topk};
use super::qwen::qwen3;
use crate::estimator::config::Attention;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer::{self as writer, Writer};
use crate::estimator::model::LayerRule;
use crate::estimator::model::ModelSpec;
use crate::estimator::model::QkNorm;
use crate::estimator::preset_base::Preset;
use serde_json::{Map, Value};

/// How the router ends: it renormalises its top-k weights only with `norm_topk_prob` —
/// Qwen3-MoE's checkpoints set it, Qwen2-MoE's (Qwen1.5-MoE-A2.7B, the configuration default)
/// do not, as `hf_export` writes them — and casts them to the logits' dtype.
fn topk(spec: &ModelSpec) -> Topk {
    Topk { normalize: !spec.shared_gate, cast: true }
}

/// One decoder layer (`Qwen2MoeDecoderLayer.forward` = `LlamaDecoderLayer.forward` with the
/// sparse block on MoE layers).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    // Parameters in registration order: self_attn, mlp (Qwen2-MoE: gate, experts,
    // shared_expert, shared_expert_gate; Qwen3-MoE: experts, gate), input_layernorm,
    // post_attention_layernorm.
    let aw = AttnW::new(b, p);
    let ffn = Ffn::new(b, p, kind, |b, p| {
        if spec.shared_gate {
            return (MoeW::new(b, p), Some(SharedW::new(b, p)));
        }
        // Qwen3MoeSparseMoeBlock.__init__ registers `experts` before `gate`.
        let gate_up = p.w(b, "layers.*.mlp.experts.gate_up_proj");
        let down = p.w(b, "layers.*.mlp.experts.down_proj");
        let router = p.w(b, "layers.*.mlp.router.weight");
        (MoeW { router, gate_up, down }, None)
    });
    let ffn = |b: &mut Builder, n: Tid| ffn.forward(b, n, |b, (w, sw), n| sparse_block(b, &w, sw.as_ref(), n, topk(spec)));
    decoder_layer(b, p, x, Norm::Rms(Rms::Llama), |b, n| attention(b, &aw, spec, n, sh, attn), ffn)
}

/// What `Qwen2MoeConfig` and `Qwen3MoeConfig` read alike: `num_experts` experts of
/// `moe_intermediate_size`, `num_experts_per_tok`; a layer is sparse unless listed in
/// `mlp_only_layers`, and only every `decoder_sparse_step`-th layer is
/// (modeling_qwen2_moe.py, `Qwen2MoeDecoderLayer`); the dense layers need `intermediate_size`.
fn moe_keys(m: &mut ModelSpec, f: &Fields) -> Result<(), HfError> {
    m.fused_experts = true;
    m.experts = f.required(&["num_local_experts", "num_experts"])?;
    m.top_k = f.required(&["num_experts_per_tok"])?;
    m.expert_ffn = f.required(&["moe_intermediate_size"])?;
    let step = f.uint_or("decoder_sparse_step", 1)?;
    let dense_only = f.list_len("mlp_only_layers")?;
    let sparse: Vec<bool> = (0..m.layers).map(|i| !dense_only.contains(&i) && step > 0 && (i + 1) % step == 0).collect();
    m.moe_rule = LayerRule::from_flags(&sparse);
    m.dense_layers = 0;
    if m.dense_mlp_layers() > 0 && m.ffn == 0 {
        return Err(HfError::Missing("intermediate_size"));
    }
    Ok(())
}

/// The keys both MoE classes write: the experts, every layer sparse but the dense ones, and
/// `norm_topk_prob` as the measured checkpoints set it (Qwen3-MoE renormalises, Qwen2-MoE does
/// not).
fn moe_writer(t: &str, s: &ModelSpec) -> Option<Writer> {
    let mut w = writer::llama_base(t, s, "hidden_act")?;
    let dense: Vec<u64> = (0..s.layers).filter(|&i| !s.moe_rule.contains(i)).collect();
    w.set("intermediate_size", s.ffn)
        .set("use_sliding_window", false)
        .set("num_experts", s.experts)
        .set("num_experts_per_tok", s.top_k)
        .set("moe_intermediate_size", s.expert_ffn)
        .set("decoder_sparse_step", 1)
        .set("mlp_only_layers", dense)
        .set("norm_topk_prob", t == "qwen3_moe");
    Some(w)
}

/// Qwen2-MoE (`modeling_qwen2_moe.py`): Llama's layers with sparse blocks of softmax-then-top-k
/// experts beside a gated shared expert, and the unused sliding-window mask its model builds.
pub struct Qwen2Moe;
impl ConfigFile for Qwen2Moe {
    /// `Qwen2MoeConfig`: `qkv_bias` (default true), no o bias, the experts ([`moe_keys`]) and a
    /// shared expert of `shared_expert_intermediate_size` with its sigmoid gate.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_keys(f, fields::Ffn::Optional, false, 32_768)?;
        m.qkv_bias = f.flag("qkv_bias", true)?;
        m.o_bias = false;
        fields::no_qwen_sliding_window(f)?;
        moe_keys(&mut m, f)?;
        m.shared_experts = 1;
        m.shared_ffn = f.required(&["shared_expert_intermediate_size"])?;
        m.shared_gate = true;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = moe_writer("qwen2_moe", s) else { return Vec::new() };
        w.set("qkv_bias", s.qkv_bias).set("shared_expert_intermediate_size", s.shared_ffn);
        w.done().into_iter().collect()
    }
}

impl Modeling for Qwen2Moe {
    /// `Qwen2MoeModel.forward` after the embedding: Llama's, and the mask of the
    /// `sliding_attention` layers too (`create_sliding_window_causal_mask`, called whatever
    /// `layer_types` says), whose window `Qwen2MoeConfig.__post_init__` sets to 0 unless
    /// `use_sliding_window`: the mask is always materialized (bool for SDPA, additive for
    /// eager), held by `causal_mask_mapping` until the model returns, and read by no layer.
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        let pos = cache_position(b);
        let mask = causal_mask(b, pos, attn);
        let unused = sliding_window_mask(b, pos, attn);
        let (cos, sin) = rope_pair(b, spec, pos, true);
        Shared { cos, sin, pos: Some(pos), mask, locals: [None, Some(unused)], ..Shared::default() }
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
}

/// Qwen3-MoE (`modeling_qwen3_moe.py`): Qwen3's attention (per-head q/k norms) with sparse
/// blocks of softmax-then-top-k experts, renormalised.
pub struct Qwen3Moe;
impl ConfigFile for Qwen3Moe {
    /// `Qwen3MoeConfig`: Qwen3's attention keys and the experts ([`moe_keys`]).
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_keys(f, fields::Ffn::Optional, false, 32_768)?;
        m.qk_norm = QkNorm::Head;
        fields::no_qwen_sliding_window(f)?;
        moe_keys(&mut m, f)?;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = moe_writer("qwen3_moe", s) else { return Vec::new() };
        w.set("attention_bias", s.qkv_bias);
        w.done().into_iter().collect()
    }
}

impl Modeling for Qwen3Moe {
    fn presets(&self) -> Vec<Preset> {
        // Every layer sparse, fused experts, no shared expert.
        let moe = |hidden, layers, heads, kv_heads, ffn, expert_ffn| {
            let mut m = qwen3(hidden, layers, heads, ffn, false);
            m.family = Family::Qwen3Moe;
            m.kv_heads = kv_heads;
            m.experts = 128;
            m.top_k = 8;
            m.expert_ffn = expert_ffn;
            m.fused_experts = true;
            m
        };
        vec![
            Preset::new(28, "qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "Qwen3", moe(2048, 48, 32, 4, 6144, 768)),
            Preset::new(29, "qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", "Qwen3", moe(4096, 94, 64, 4, 12288, 1536)),
        ]
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
}
