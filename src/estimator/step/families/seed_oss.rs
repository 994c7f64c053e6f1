//! Seed-OSS (`models/seed_oss/modeling_seed_oss.py`, transformers 5.24): Llama's decoder layer
//! ([`super::llama`], every default of [`Modeling`]) with biases on q, k and v
//! (`attention_bias`), an unbiased o (`attention_out_bias`), and `residual_dropout` after the
//! attention's and the MLP's output projections — `F.dropout(p=0)` in the public checkpoints'
//! training, which keeps nothing; a non-zero one follows the configuration's `dropout`.

use super::modeling::{ConfigFile, Modeling};
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{Activation, ModelSpec};
use crate::estimator::preset_base::{llama, Preset};
use serde_json::{Map, Value};

/// Seed-OSS (`modeling_seed_oss.py`).
pub struct SeedOss;
impl ConfigFile for SeedOss {
    /// `SeedOssConfig` (configuration_seed_oss.py): every size defaults to the class's (absent
    /// sizes are said in the import's notes), `attention_bias` (true) on q, k and v,
    /// `attention_out_bias` (false) on o, `mlp_bias`, `head_dim` 128, 524,288 positions.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = llama(
            f.size("vocab_size", 155_136)?,
            f.size("hidden_size", 4096)?,
            f.size("num_hidden_layers", 64)?,
            f.size("num_attention_heads", 80)?,
            0,
            f.size("intermediate_size", 27_648)?,
            f.uint_or("max_position_embeddings", 524_288)?,
        );
        fields::check_layers(m.layers)?;
        m.kv_heads = f.uint_or("num_key_value_heads", 8)?;
        m.head_dim = f.size("head_dim", 128)?;
        m.act = f.activation(&["hidden_act"], Activation::Silu)?;
        m.tied = f.flag("tie_word_embeddings", false)?;
        m.qkv_bias = f.flag("attention_bias", true)?;
        m.o_bias = f.flag("attention_out_bias", false)?;
        m.mlp_bias = f.flag("mlp_bias", false)?;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::llama_base("seed_oss", s, "hidden_act") else { return Vec::new() };
        w.set("intermediate_size", s.ffn)
            .set("attention_bias", s.qkv_bias)
            .set("attention_out_bias", s.o_bias)
            .set("mlp_bias", s.mlp_bias)
            .set("attention_dropout", 0.0)
            .set("residual_dropout", 0.0);
        w.done().into_iter().collect()
    }
}

impl Modeling for SeedOss {
    /// Seed-OSS-36B-Instruct (its Base shares the architecture), from the checkpoint's
    /// `config.json` (`tests/fixtures/hf/seed-oss-36b-instruct.json`): `SeedOssConfig`'s
    /// defaults but `hidden_size` 5,120 (the class defaults 4,096). 36,151,104,512 parameters
    /// (transformers 5.24 on the meta device).
    fn presets(&self) -> Vec<Preset> {
        let mut m = llama(155_136, 5120, 64, 80, 8, 27_648, 524_288);
        m.family = Family::SeedOss;
        m.head_dim = 128;
        m.qkv_bias = true;
        vec![Preset::new(110, "seed-oss-36b-instruct", "ByteDance-Seed/Seed-OSS-36B-Instruct", "Seed-OSS", m)]
    }
}
