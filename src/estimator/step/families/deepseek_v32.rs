//! DeepSeek-V3.2 (`deepseek_v32`, transformers 5.24
//! `models/deepseek_v32/modeling_deepseek_v32.py`): DeepSeek-V3's layer ([`super::deepseek`]:
//! MLA, dense MLPs on the first `first_k_dense_replace` layers, the sigmoid-routed MoE after)
//! with DeepSeek Sparse Attention (DSA): a lightning indexer per layer
//! (`DeepseekV32Indexer`) scores every key for every query and keeps the top
//! `index_topk`; the eager and SDPA paths fold the keys it drops into the attention mask.
//!
//! The indexer's forward is `@torch.no_grad()`: it saves nothing, its parameters never get a
//! gradient (so no gradient and no optimizer state: [`crate::estimator::model::Dsa`]), and what
//! it costs is transients — the largest of the layer's forward, growing with s²: the key
//! broadcast over the queries (`[b, s, d_i, s]` fp32) and the per-head scores
//! (`[b, s, H_i, s]` fp32). The model always builds its causal mask
//! (`allow_is_causal_skip=False`), so SDPA gets a mask and runs its math path on CPU.

use super::common::{additive_mask, cache_position, mask_shape, packed_detection, rope_pair, sdpa_mask, set_part};
use super::common::{Kind, Params, Shared};
use super::modeling::{ConfigFile, Modeling};
use crate::estimator::config::Attention;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{Fields, HfError};
use crate::estimator::model::{Dsa, ModelSpec};
use crate::estimator::part::Part;
use crate::estimator::preset_base::{Preset, FP8_CHECKPOINT};
use crate::estimator::step::ir::{Builder, Dt, Shape, Tid};
use serde_json::{Map, Value};

/// `DeepseekV32Model.forward` after the embedding: Llama's positions and rotary tables, and
/// the causal mask always materialized (`allow_is_causal_skip=False`: the indexer needs it) —
/// SDPA's bool `[1, 1, s, s_kv]`, or eager's additive `[b, 1, s, s_kv]` — kept by the layers.
fn positions(b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
    let pos = cache_position(b);
    packed_detection(b, pos);
    let m = sdpa_mask(b, false);
    let mask = if attn == Attention::Eager { additive_mask(b, m) } else { set_part(b, m, Part::Checkpoints) };
    let (cos, sin) = rope_pair(b, spec, pos, true);
    Shared { cos, sin, pos: Some(pos), mask: Some(mask), ..Shared::default() }
}

/// `DeepseekV32Config` (configuration_deepseek_v32.py): DeepSeek-V3's keys and defaults
/// ([`super::deepseek`]'s import) and the indexer's `index_n_heads` (64), `index_head_dim`
/// (128), `index_topk` (2048); `mlp_layer_types` (when given) must be `first_k_dense_replace`
/// dense layers then sparse ones.
fn import(t: &str, f: &Fields, notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
    let mut m = super::deepseek::import(t, f, notes)?;
    if m.q_lora_rank == 0 {
        return Err(HfError::Field {
            key: "q_lora_rank",
            reason: "null: DeepseekV32Attention feeds the query latent (q_a_layernorm's output) to its indexer, so \
                     transformers builds DeepSeek-V3.2 only with a query LoRA rank"
                .into(),
        });
    }
    m.dsa = Dsa { heads: f.size("index_n_heads", 64)?, head_dim: f.size("index_head_dim", 128)?, topk: f.size("index_topk", 2048)? };
    if m.dsa.head_dim < m.qk_rope_dim {
        return Err(HfError::Field {
            key: "index_head_dim",
            reason: format!(
                "{} is smaller than qk_rope_head_dim {}: the indexer rotates its first d_r dims",
                m.dsa.head_dim, m.qk_rope_dim
            ),
        });
    }
    if let Some(Value::Array(kinds)) = f.get("mlp_layer_types") {
        let dense = kinds.iter().take_while(|k| k.as_str() == Some("dense")).count() as u64;
        let layered = kinds.len() as u64 == m.layers && kinds.iter().skip(dense as usize).all(|k| k.as_str() == Some("sparse"));
        if !layered {
            return Err(HfError::Field {
                key: "mlp_layer_types",
                reason: "only dense layers followed by sparse (MoE) ones, one entry a layer, are modelled".into(),
            });
        }
        m.dense_layers = dense;
    }
    Ok(m)
}

/// DeepSeek-V3.2 (and V3.2-Exp, the same architecture): DeepSeek-V3's with the indexer of 64
/// heads of 128 keeping 2,048 keys. 671,877,929,216 parameters (transformers 5.24 on the meta
/// device: DeepSeek-V3's 671,026,404,352 and 13,959,424 a layer of indexer).
fn deepseek_v32() -> ModelSpec {
    let mut m = super::deepseek::deepseek_v3(129_280, 128, 256, 3, 8, 4, 163_840);
    m.family = Family::DeepseekV32;
    m.dsa = Dsa { heads: 64, head_dim: 128, topk: 2048 };
    m
}

/// DeepSeek-V3.2 (`modeling_deepseek_v32.py`).
pub struct DeepseekV32;
impl ConfigFile for DeepseekV32 {
    fn import(&self, t: &str, f: &Fields, notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        import(t, f, notes)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        super::deepseek::config("deepseek_v32", s)
            .map(|mut c| {
                c.insert("index_n_heads".into(), s.dsa.heads.into());
                c.insert("index_head_dim".into(), s.dsa.head_dim.into());
                c.insert("index_topk".into(), s.dsa.topk.into());
                c
            })
            .into_iter()
            .collect()
    }
}

impl Modeling for DeepseekV32 {
    fn presets(&self) -> Vec<Preset> {
        vec![Preset::new(41, "deepseek-v3.2", "deepseek-ai/DeepSeek-V3.2", "DeepSeek", deepseek_v32()).with_notes(&[
            "the checkpoint's multi-token-prediction layer (num_nextn_predict_layers 1) is not built by transformers' DeepseekV32ForCausalLM and is not counted",
            FP8_CHECKPOINT,
        ])]
    }
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        positions(b, spec, attn)
    }
    /// The causal mask the layers always receive.
    fn mask_shapes(&self, b: &Builder, spec: &ModelSpec, attn: Attention) -> [Option<(Shape, Dt)>; 2] {
        let _ = (b, spec);
        [Some(mask_shape(attn)), None]
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        super::deepseek::layer(b, p, spec, x, sh, kind, attn, super::sigmoid_moe::router_normalized)
    }
}
