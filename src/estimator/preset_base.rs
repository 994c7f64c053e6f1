//! What the presets of every family are built from: the [`Preset`] type, the default
//! architecture ([`default_spec`], Llama-3.1-8B) and the Llama-style decoder the other families'
//! constructors start from ([`llama`]), and the notes several families' presets share. Each
//! family's presets are its `Modeling::presets` (in that family's module, beside its op-level program); the list over
//! every family is `estimator::presets`.

use crate::estimator::family::Family;
use crate::estimator::model::{Activation, LayerRule, MlpKind, ModelSpec, NormKind, Positions, QkNorm, Router, WindowKind};

/// A named preset.
#[derive(Clone, Debug, PartialEq)]
pub struct Preset {
    pub id: &'static str,
    /// The Hugging Face repository it describes.
    pub checkpoint: &'static str,
    pub family: &'static str,
    pub spec: ModelSpec,
    /// What the preset leaves out of the checkpoint or assumes about it, one sentence each (the
    /// same statements the importer makes for the checkpoint's config.json).
    pub notes: &'static [&'static str],
    /// Where the picker lists it: presets are listed by `order`, ascending (the presets from
    /// before 2026 in their historical order, 0–99; a family added later numbers its own from
    /// 100 on).
    pub order: u16,
}

impl Preset {
    /// A preset listed at `order`, without notes.
    pub fn new(order: u16, id: &'static str, checkpoint: &'static str, family: &'static str, spec: ModelSpec) -> Preset {
        Preset { id, checkpoint, family, spec, notes: &[], order }
    }
    /// The same preset with what it leaves out of its checkpoint or assumes about it.
    pub fn with_notes(self, notes: &'static [&'static str]) -> Preset {
        Preset { notes, ..self }
    }
}

/// The id used when a configuration names no model.
pub const DEFAULT_PRESET: &str = "llama-3.1-8b";

/// The architecture of [`DEFAULT_PRESET`], Llama-3.1-8B.
pub const fn default_spec() -> ModelSpec {
    llama(128256, 4096, 32, 32, 8, 14336, 131072)
}

/// Llama-style decoder: RMSNorm, SwiGLU, rotary, untied, no biases.
pub const fn llama(vocab: u64, hidden: u64, layers: u64, heads: u64, kv_heads: u64, ffn: u64, max_pos: u64) -> ModelSpec {
    ModelSpec {
        family: Family::Llama,
        vocab,
        hidden,
        layers,
        heads,
        kv_heads,
        // An importer may pass a file's 0 heads; `fields::with_heads` refuses it after.
        head_dim: match hidden.checked_div(heads) {
            Some(d) => d,
            None => 0,
        },
        ffn,
        mlp: MlpKind::Gated,
        act: Activation::Silu,
        norm: NormKind::Rmsnorm,
        layer_norms: 2,
        final_norm: true,
        qk_norm: QkNorm::None,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        head_bias: false,
        tied: false,
        positions: Positions::Rope,
        max_pos,
        pos_offset: 0,
        rotary_pct: 100,
        parallel: false,
        embed_proj: 0,
        experts: 0,
        top_k: 0,
        expert_ffn: 0,
        shared_experts: 0,
        shared_ffn: 0,
        shared_gate: false,
        dense_layers: 0,
        fused_qkv: false,
        fused_gate_up: false,
        fused_experts: false,
        softcap: false,
        softmax_fp32: true,
        resid_dropout: false,
        embed_dropout: false,
        q_lora_rank: 0,
        kv_lora_rank: 0,
        qk_rope_dim: 0,
        v_head_dim: 0,
        attn_sinks: false,
        qk_l2_norm: false,
        nope_layers: LayerRule::None,
        window_layers: LayerRule::None,
        window: 0,
        window_kind: WindowKind::Sliding,
        moe_rule: LayerRule::All,
        router: Router::Softmax,
        router_bias: false,
        router_fp32: false,
        router_groups: 0,
        router_group_topk: 0,
        expert_bias: false,
        experts_in_out: false,
        moe_all_experts: false,
        clip_qkv: false,
        ssm: crate::estimator::model::Ssm::NONE,
        ssm_dtype: crate::estimator::model::StateDtype::Auto,
        dsa: crate::estimator::model::Dsa::NONE,
        gdn: crate::estimator::model::Gdn::NONE,
        linear_layers: crate::estimator::model::LayerRule::None,
        attn_gate: false,
    }
}

pub const fn tied(mut m: ModelSpec) -> ModelSpec {
    m.tied = true;
    m
}

pub const fn with_head_dim(mut m: ModelSpec, head_dim: u64) -> ModelSpec {
    m.head_dim = head_dim;
    m
}

/// What the fp8 checkpoints' presets assume.
pub const FP8_CHECKPOINT: &str =
    "the checkpoint is stored in fp8 (128×128 blocks); trainmem assumes training from dequantized weights in the recipe's dtype";

/// What the multimodal presets leave out.
pub const VISION_NOT_COUNTED: &[&str] = &["the language model of a multimodal checkpoint: its vision tower and projector are not counted"];
