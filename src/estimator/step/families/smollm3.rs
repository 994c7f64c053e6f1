//! SmolLM3 (`modeling_smollm3.py`): Llama's decoder layer with NoPE layers — layers whose
//! `config.no_rope_layers[layer_idx]` is 0 skip `apply_rotary_pos_emb` (`SmolLM3Attention`:
//! `self.use_rope = config.no_rope_layers[layer_idx]`, `if self.use_rope: …`); by default every
//! `no_rope_layer_interval`-th layer (`configuration_smollm3.py`). Everything else is Llama's
//! ([`super::llama::layer`]).
//!
//! What a NoPE layer changes in the step: its view of the model's tensors has no cos/sin
//! ([`super::common::Shared::view`]), so the attention core receives q and k as the transposed views of
//! `q_proj`/`k_proj`'s outputs. SDPA's CPU flash backward lays dq and dk out like q and k, so their
//! `view` backward needs no copy (as for v); eager attention's `matmul` copies them (`fold`) and
//! their gradients come back transposed: `ViewBackward0` clones, as for v. Saved bytes are those of
//! a RoPE layer: the core keeps q and k either way (RoPE's `mul`s keep only the shared cos/sin).

use super::modeling::{ConfigFile, Modeling};
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{LayerRule, ModelSpec, WindowKind};
use crate::estimator::preset_base::{llama, tied, Preset};
use serde_json::{Map, Value};

/// SmolLM3 (`modeling_smollm3.py`): Llama's code; its NoPE layers are in the spec
/// (`nope_layers`), read by every family through `common::nope`.
pub struct Smollm3;
impl ConfigFile for Smollm3 {
    /// SmolLM3 (configuration_smollm3.py): Llama with NoPE on every `no_rope_layer_interval`-th
    /// layer, biases by `attention_bias`/`mlp_bias`, tied head by default.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_like(
            f,
            fields::Dims {
                vocab: 128_256,
                hidden: 2048,
                layers: 36,
                heads: 16,
                kv_heads: Some(4),
                head_dim: None,
                ffn: 11_008,
                max_pos: 32_768,
                tied: true,
            },
        )?;
        let bias = f.flag("attention_bias", false)?;
        m.qkv_bias = bias;
        m.o_bias = bias;
        m.mlp_bias = f.flag("mlp_bias", false)?;
        let rope = fields::rope_flags(f, m.layers as usize)?;
        m.nope_layers = LayerRule::from_flags(&rope.iter().map(|r| !r).collect::<Vec<_>>());
        // Default layer_types: sliding on the NoPE layers when use_sliding_window and sliding_window.
        let sliding = if f.flag("use_sliding_window", false)? { m.nope_layers.clone() } else { LayerRule::None };
        fields::set_window(&mut m, f, "sliding_window", None, (sliding, WindowKind::Sliding))?;
        Ok(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(act) = writer::act_name(s.act) else { return Vec::new() };
        let mut w = writer::Writer::new("smollm3");
        writer::llama_sizes(&mut w, s);
        let rope: Vec<u64> = (0..s.layers).map(|i| u64::from(!s.nope_layers.contains(i))).collect();
        let windowed = s.window_layers.count(s.layers) > 0;
        w.set("hidden_act", act)
            .set("intermediate_size", s.ffn)
            .set("attention_bias", s.qkv_bias)
            .set("mlp_bias", s.mlp_bias)
            .set("no_rope_layers", rope)
            .set("use_sliding_window", windowed)
            .set("sliding_window", writer::window_or_null(s))
            .set("layer_types", writer::layer_types(s, "sliding_attention"))
            .done()
            .into_iter()
            .collect()
    }
}

impl Modeling for Smollm3 {
    fn presets(&self) -> Vec<Preset> {
        // SmolLM3-3B: tied Llama with 16 query / 4 KV heads and every 4th layer NoPE.
        let spec = ModelSpec {
            family: Family::Smollm3,
            nope_layers: LayerRule::Every { step: 4, offset: 3 },
            ..tied(llama(128_256, 2048, 36, 16, 4, 11_008, 65_536))
        };
        vec![Preset::new(36, "smollm3-3b", "HuggingFaceTB/SmolLM3-3B", "SmolLM3", spec)]
    }
}

#[cfg(test)]
mod tests {
    use crate::estimator::config::{Attention, Config, Kernels, Precision};
    use crate::estimator::expr::numbers_only;
    use crate::estimator::model::ModelSpec;
    use crate::estimator::params::Stage;
    use crate::estimator::precision::recipe;
    use crate::estimator::presets::presets;
    use crate::estimator::step::families::common::nope;
    use crate::estimator::step::families::{Kind, Var};
    use crate::estimator::step::ledger::kept;
    use crate::estimator::step::model::Setup;

    #[test]
    fn every_fourth_layer_of_smollm3_3b_is_nope() {
        let spec = presets().into_iter().find(|p| p.id == "smollm3-3b").map(|p| p.spec).expect("the preset exists");
        let nopes: Vec<usize> = (0..8).filter(|&i| nope(&spec, i)).collect();
        assert_eq!(nopes, [3, 7]);
    }

    /// A NoPE layer reads no cos/sin and keeps as many bytes of its own as a RoPE layer (the
    /// attention core keeps q and k either way; RoPE's products keep only the model's cos/sin),
    /// for eager and sdpa.
    #[test]
    fn a_nope_layer_reads_no_cos_sin_and_keeps_what_a_rope_layer_keeps() {
        let spec = presets().into_iter().find(|p| p.id == "smollm3-3b").map(|p| p.spec).expect("the preset exists");
        for attn in [Attention::Eager, Attention::Sdpa] {
            let cfg = Config {
                model: "custom".into(),
                arch: ModelSpec { layers: 4, vocab: 512, ..spec.clone() },
                batch: 2,
                seq: 32,
                precision: Precision::Bf16,
                attn,
                kernels: Kernels::Cpu,
                ..Config::default()
            };
            let r = recipe(cfg.precision);
            let (rope, nope_) = numbers_only(|| {
                let setup = Setup::new(&cfg, &r, Stage::Whole);
                let saved = |var: Var| {
                    let (prog, _, sh) = setup.layer_alone(Kind::Dense, var, 0, false);
                    let reads_cos = prog.ops.iter().any(|op| sh.cos.is_some_and(|c| prog.ins(op).contains(&c)));
                    (kept(&prog).iter().filter(|k| !k.elsewhere).map(|k| prog.tensors[k.t as usize].bytes).sum::<u128>(), reads_cos)
                };
                (
                    saved(Var { sliding: false, nope: false, every_nth: false, linear: false }),
                    saved(Var { sliding: false, nope: true, every_nth: false, linear: false }),
                )
            });
            assert!(rope.1, "{attn:?}: a RoPE layer reads cos");
            assert!(!nope_.1, "{attn:?}: a NoPE layer does not");
            assert_eq!(rope.0, nope_.0, "{attn:?}");
        }
    }
}
