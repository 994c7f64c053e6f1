//! Sliding-window attention on Llama's layer (`modeling_mistral.py`: Mistral passes
//! `config.sliding_window` to every layer) and the masks `masking_utils.py` builds for it:
//! `create_sliding_window_causal_mask` materializes a mask whenever the window is shorter than
//! the keys (`_ignore_causal_mask_sdpa`: `kv_length >= local_attention_size` forbids the
//! `is_causal` shortcut) — a bool `[1, 1, s, s_kv]` for SDPA, the additive `[b, 1, s, s_kv]` for
//! eager. With a mask, `sdpa_attention_forward` cannot use SDPA's GQA path: it repeats k and v to
//! `a` heads (`repeat_kv`; `llama::sdpa_masked`), and `F.scaled_dot_product_attention` turns the bool mask into an
//! additive one in the query's dtype (`where`), which the CPU flash kernel keeps for backward.

use super::super::ir::{Builder, Dt, Shape};
use super::common::{cache_position, mask_shape, masked, rope_pair, sliding_window_mask_for, Shared};
use super::modeling::{ConfigFile, Modeling};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Ffn, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{LayerRule, ModelSpec, NormKind, WindowKind};
use crate::estimator::preset_base::{llama, Preset, VISION_NOT_COUNTED};
use serde_json::{Map, Value};

/// Whether the window is set: on every layer (`config.sliding_window` not null). Without one
/// Mistral runs Llama's code.
pub fn slides(spec: &ModelSpec) -> bool {
    spec.window > 0
        && spec.window_kind == WindowKind::Sliding
        && spec.window_layers == LayerRule::All
        && spec.norm == NormKind::Rmsnorm
        && spec.experts == 0
        && !spec.fused_qkv
        && spec.kv_lora_rank == 0
}

/// Mistral (`modeling_mistral.py`): Llama's layers, with the sliding-window mask once
/// `config.sliding_window` is set.
pub struct Mistral;
impl ConfigFile for Mistral {
    /// `MistralConfig`: Llama's keys, 131,072 positions and a 4,096-token `sliding_window` on
    /// every layer by default (null: none).
    fn import(&self, t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_keys(f, Ffn::Required, false, 131_072)?;
        fields::window_on_every_layer(&mut m, f, t, Some(4096))?;
        fields::with_heads(m)
    }
    fn wrappers(&self) -> &'static [&'static str] {
        &["mistral3"]
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::llama_base("mistral", s, "hidden_act") else { return Vec::new() };
        w.set("intermediate_size", s.ffn).set("sliding_window", writer::every_layer_window(s));
        w.done().into_iter().collect()
    }
}

impl Modeling for Mistral {
    fn presets(&self) -> Vec<Preset> {
        // Mistral-7B-v0.1: Llama with GQA and a 4,096-token sliding window on every layer.
        let mistral_7b = ModelSpec {
            family: Family::Mistral,
            window_layers: LayerRule::All,
            window: 4096,
            ..llama(32000, 4096, 32, 32, 8, 14336, 32768)
        };
        let small = ModelSpec { family: Family::Mistral, head_dim: 128, ..llama(131_072, 5120, 40, 32, 8, 32_768, 131_072) };
        vec![
            Preset::new(12, "mistral-7b-v0.1", "mistralai/Mistral-7B-v0.1", "Mistral", mistral_7b),
            Preset::new(37, "mistral-small-3.1-24b-instruct-2503", "mistralai/Mistral-Small-3.1-24B-Instruct-2503", "Mistral", small)
                .with_notes(VISION_NOT_COUNTED),
        ]
    }
    /// What `MistralModel.forward` computes after the embedding (also a later pipeline stage's
    /// prologue): `position_ids`, the sliding-window mask in place of the causal one
    /// (`create_sliding_window_causal_mask` when `config.sliding_window` is set: always for
    /// eager; for SDPA once the window is shorter than the keys, else only its packed-sequence
    /// check), the rotary embedding.
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        if !slides(spec) {
            return super::llama::positions(b, spec, attn);
        }
        let pos = cache_position(b);
        let mask = sliding_window_mask_for(b, pos, attn, spec.window);
        let (cos, sin) = rope_pair(b, spec, pos, true);
        Shared { cos, sin, pos: Some(pos), mask, ..Shared::default() }
    }
    /// Eager's mask, and SDPA's once the window is shorter than the keys.
    fn mask_shapes(&self, b: &Builder, spec: &ModelSpec, attn: Attention) -> [Option<(Shape, Dt)>; 2] {
        if super::common::graph_mask(b) {
            // A compiled whole model builds the (additive) mask in its graph, window or not.
            return [Some(mask_shape(Attention::Eager)), None];
        }
        let mask = attn == Attention::Eager || (slides(spec) && masked(spec.window, b.c.n(Q::S_KV)));
        [mask.then(|| mask_shape(attn)), None]
    }
}

#[cfg(test)]
mod tests {
    use crate::estimator::config::{Attention, Config, Kernels, OptimImpl, Precision, Recompute};
    use crate::estimator::expr::numbers_only;
    use crate::estimator::hf::import_value;
    use crate::estimator::params::stages;
    use crate::estimator::precision::recipe;
    use crate::estimator::step::fast;
    use crate::estimator::step::model::{simulate_stage, Setup};

    /// Toy configs of the families ported with the sliding-window masks, the local RoPE pair,
    /// fp32 RoPE and the unused Qwen2-MoE mask — the validation fixtures' shapes (window 48),
    /// with 3 layers so that a 3-stage pipeline has a middle stage.
    fn toys() -> Vec<(&'static str, serde_json::Value)> {
        let base = serde_json::json!({"hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 3, "vocab_size": 1000, "max_position_embeddings": 512});
        let with = |extra: serde_json::Value| {
            let mut v = base.clone();
            for (k, x) in extra.as_object().expect("object") {
                v[k] = x.clone();
            }
            v
        };
        vec![
            ("mistral", with(serde_json::json!({"model_type": "mistral", "head_dim": 16, "sliding_window": 48}))),
            (
                "gemma3_text",
                with(serde_json::json!({"model_type": "gemma3_text", "head_dim": 24, "sliding_window": 48,
                    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]})),
            ),
            (
                "qwen2_moe",
                with(serde_json::json!({"model_type": "qwen2_moe", "moe_intermediate_size": 40, "num_experts": 4,
                    "num_experts_per_tok": 2, "shared_expert_intermediate_size": 88, "mlp_only_layers": [0]})),
            ),
            ("olmo", with(serde_json::json!({"model_type": "olmo", "clip_qkv": 8.0}))),
            ("olmo2", with(serde_json::json!({"model_type": "olmo2"}))),
            ("gemma", with(serde_json::json!({"model_type": "gemma", "head_dim": 24}))),
        ]
    }

    /// Each toy config is read as its own family (the importer decides it from `model_type`).
    #[test]
    fn the_imported_toys_carry_their_families() {
        use crate::estimator::family::Family;
        for (name, json) in toys() {
            let spec = import_value(&json).expect("imports").spec;
            assert_eq!(Some(spec.family), Family::from_model_type(name), "{name}");
        }
    }

    /// Every pipeline stage's piecewise peak (what `estimate` reports) equals the maximum of its
    /// materialized stream, for sequences shorter and longer than the window — so the later
    /// stages' prologues and the layers' shared inputs agree with the model's own.
    #[test]
    fn the_pieces_match_the_stream_on_every_stage_of_the_sliding_and_fp32_rope_families() {
        let mut bad = Vec::new();
        let mut n = 0;
        for (name, json) in toys() {
            let spec = import_value(&json).expect("imports").spec;
            for (prec, attn, rec) in [
                (Precision::Bf16, Attention::Sdpa, Recompute::None),
                (Precision::Fp32, Attention::Eager, Recompute::Full),
                (Precision::Bf16, Attention::Sdpa, Recompute::Full),
            ] {
                for seq in [32, 64] {
                    for pp in [1, 3] {
                        let cfg = Config {
                            model: "custom".into(),
                            arch: spec.clone(),
                            seq,
                            batch: 2,
                            precision: prec,
                            attn,
                            recompute: rec,
                            kernels: Kernels::Cpu,
                            optim_impl: OptimImpl::Forloop,
                            pp,
                            gpus: pp,
                            ..Config::default()
                        };
                        let r = recipe(cfg.precision);
                        for &stage in stages(pp) {
                            let (m, f) = numbers_only(|| {
                                let s = simulate_stage(&cfg, &r, stage, Default::default(), 0);
                                let m = s.events.iter().map(|e| e.live).max().unwrap_or(0);
                                (m, fast::stage(&Setup::new(&cfg, &r, stage), 0).peak)
                            });
                            n += 1;
                            if m != f {
                                bad.push(format!("{name} {prec:?} {attn:?} {rec:?} s={seq} pp={pp} {stage:?}: stream {m} vs pieces {f}"));
                            }
                        }
                    }
                }
            }
        }
        assert!(n >= 6 * 3 * 2 * 4);
        assert!(bad.is_empty(), "{} of {n} differ:\n{}", bad.len(), bad.join("\n"));
    }
}
