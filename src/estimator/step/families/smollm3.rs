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

use super::modeling::Modeling;

/// SmolLM3 (`modeling_smollm3.py`): Llama's code; its NoPE layers are in the spec
/// (`nope_layers`), read by every family through `common::nope`.
pub struct Smollm3;
impl Modeling for Smollm3 {}

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
                (saved(Var { sliding: false, nope: false, every_nth: false }), saved(Var { sliding: false, nope: true, every_nth: false }))
            });
            assert!(rope.1, "{attn:?}: a RoPE layer reads cos");
            assert!(!nope_.1, "{attn:?}: a NoPE layer does not");
            assert_eq!(rope.0, nope_.0, "{attn:?}");
        }
    }
}
