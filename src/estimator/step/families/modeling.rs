//! [`Modeling`] and [`ConfigFile`]: everything of a family — how its `config.json` reads into a
//! [`ModelSpec`] and is written back ([`ConfigFile`]), its presets, and the pieces of its modeling
//! code the step is built from ([`Modeling`]):
//! the model's forward before the layers (the prologue), a decoder layer, the final norm, and
//! what those hand each other (masks, rotary tables, which layers slide a window). Every method
//! of the step defaults to Llama's (`modeling_llama.py`); a family overrides only what its own
//! modeling file does differently.

use super::super::ir::{Builder, Dt, Shape, Tid};
use super::common::{cos_shape, embed_then, final_norm, has_rope, mask_shape, received, Kind, Norm, Params, Rms, Shared};
use super::llama;
use crate::estimator::config::Attention;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::ModelSpec;
use crate::estimator::preset_base::{default_spec, llama as llama_spec, tied, with_head_dim, Preset};
use serde_json::{Map, Value};

/// A family's `config.json`: how it reads into a [`ModelSpec`] and is written back — the
/// importer's and the exporter's side of the family ([`crate::estimator::hf`],
/// [`crate::estimator::hf_export`]), apart from [`Modeling`] so that what only estimates (the
/// page's first screen) does not carry every family's reader and writer.
pub trait ConfigFile: Sync {
    /// The model of a `config.json` of model type `t` (the family's own or one of its
    /// [`Modeling::aliases`]), read with the keys and class defaults of its transformers
    /// `configuration_<type>.py` ([`Fields`] says which sizes took a default); what the import
    /// assumes or leaves out goes to `notes`, one sentence each. The importer sets the spec's
    /// family afterwards.
    fn import(&self, t: &str, f: &Fields, notes: &mut Vec<String>) -> Result<ModelSpec, HfError>;

    /// Other `model_type`s read as this family (Kimi K2's `kimi_k2` is DeepSeek-V3's).
    fn aliases(&self) -> &'static [&'static str] {
        &[]
    }

    /// Multimodal wrappers (`model_type` of a checkpoint with a `text_config` beside a vision
    /// tower) whose language model is this family's; their `text_config` is imported as one.
    fn wrappers(&self) -> &'static [&'static str] {
        &[]
    }

    /// The `config.json` files of the family's model type that may build `spec` exactly, to be
    /// tried in order: `estimator::hf_export` accepts the first that reads back into `spec`
    /// (every key the class reads, and only those; empty when no file can express `spec`).
    fn export(&self, spec: &ModelSpec) -> Vec<Map<String, Value>>;
}

/// One family's code: its presets and its modeling code as the step program builds it (see the
/// module doc); its `config.json` is its [`ConfigFile`].
pub trait Modeling: Sync {
    /// The family's presets: real checkpoints, each pinned to its exact count (the picker lists
    /// every family's by [`Preset::order`]).
    fn presets(&self) -> Vec<Preset> {
        Vec::new()
    }

    /// The model's forward before the decoder layers on the first pipeline stage, from the
    /// token ids: the first hidden state and the model-level tensors the layers read.
    ///
    /// Llama (`LlamaModel.forward`): the token embedding (scaled by the `embed_scale` buffer
    /// where [`Modeling::embed_scale_buffer`]), then [`Modeling::positions`].
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        embed_then(b, p, spec, ids, self.embed_scale_buffer(), |b| self.positions(b, spec, attn))
    }

    /// A later pipeline stage's prologue: the activation it receives, then
    /// [`Modeling::positions`].
    fn receive(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, attn: Attention) -> (Tid, Shared) {
        let _ = p;
        let x0 = received(b);
        (x0, self.positions(b, spec, attn))
    }

    /// What the model's forward computes after the embedding, for the layers (Llama:
    /// `cache_position` / `position_ids`, `create_causal_mask` and the rotary embedding).
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        llama::positions(b, spec, attn)
    }

    /// One decoder layer on `x` (`LlamaDecoderLayer.forward`); returns its output.
    #[allow(clippy::too_many_arguments)] // the trait's one entry point: builder, parameters, spec, input, shared tensors, kind, attention
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        llama::layer(b, p, spec, x, sh, kind, attn)
    }

    /// The family's norm module (Llama: `LlamaRMSNorm`), in its layers and after them.
    fn norm(&self) -> Norm {
        Norm::Rms(Rms::Llama)
    }

    /// The norm after the last layer (`model.norm`, [`Modeling::norm`]).
    fn final_norm(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid) -> Tid {
        let _ = spec;
        final_norm(b, p, "model.norm", self.norm(), x)
    }

    /// Whether the first layer's input is one of the model forward's locals, held until the model
    /// returns (Llama's `hidden_states = inputs_embeds`).
    fn x0_is_local(&self) -> bool {
        true
    }

    /// Whether decoder layer `i` attends through a local window (Llama: none does).
    fn sliding(&self, spec: &ModelSpec, i: usize) -> bool {
        let _ = (spec, i);
        false
    }

    /// The model-level rotary tables the layers read: their shape and dtype, and whether a sin
    /// comes beside the cos (Llama: cos and sin `[1, s, d_rot]` in the residual dtype).
    fn rope_tables(&self, spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
        has_rope(spec).then(|| (cos_shape(spec), Dt::Resid, true))
    }

    /// Whether the rotary table the layers read is a model buffer (model state, not an
    /// activation: torchtitan's `freqs_cis`) rather than computed by each forward.
    fn rope_table_is_buffer(&self) -> bool {
        self.framework_code()
    }

    /// Whether this is a training framework's own model code (torchtitan, torchtune, litgpt)
    /// rather than transformers': their attention calls SDPA with `is_causal=True` (no mask is
    /// built), their RoPE tables are registered buffers, and the layers compute no shared
    /// `position_ids` — the defaults of [`Modeling::mask_shapes`],
    /// [`Modeling::rope_table_is_buffer`] and [`Modeling::shares_positions`] follow it.
    fn framework_code(&self) -> bool {
        false
    }

    /// Whether the sliding-window layers have a rotary pair of their own (`Shared::cos_local`).
    fn local_rope(&self, spec: &ModelSpec) -> bool {
        let _ = spec;
        false
    }

    /// The shapes and dtypes of the masks the layers receive (`Shared::mask`,
    /// `Shared::mask_local`). Llama: eager attention's additive causal mask; SDPA runs causal
    /// without one.
    fn mask_shapes(&self, b: &Builder, spec: &ModelSpec, attn: Attention) -> [Option<(Shape, Dt)>; 2] {
        let _ = (b, spec);
        if self.framework_code() {
            return [None, None];
        }
        if super::common::graph_mask(b) {
            return [Some(mask_shape(Attention::Eager)), None];
        }
        [(attn == Attention::Eager).then(|| mask_shape(attn)), None]
    }

    /// Whether the layers receive `position_ids` (GPT-2's do not).
    fn shares_positions(&self) -> bool {
        !self.framework_code()
    }

    /// Whether the embedding is scaled by a 0-dim buffer in the model dtype (Gemma's
    /// `embed_scale`).
    fn embed_scale_buffer(&self) -> bool {
        false
    }

    /// Whether a sigmoid router's `e_score_correction_bias` buffer is fp32 whatever the model
    /// dtype (DeepSeek-V3's and GLM-4.5's routers create it with `dtype=torch.float32`).
    fn router_bias_fp32(&self) -> bool {
        true
    }

    /// The logits the loss reads, from the LM head's output (Llama: as they are; Granite divides
    /// them by `logits_scaling`).
    fn logits(&self, b: &mut Builder, logits: Tid) -> Tid {
        let _ = b;
        logits
    }

    /// Whether this family's code builds exactly `spec`'s layout, features the estimator refuses
    /// elsewhere included (gpt-oss's sinks, Llama 4's experts): such a spec is accepted as it is.
    fn builds_own_layout(&self, spec: &ModelSpec) -> bool {
        let _ = spec;
        false
    }

    /// Whether the model registers its output head before everything else (litgpt's
    /// `GPT.__init__`: `lm_head`, then `transformer`), so that the optimizer, which steps the
    /// parameters in registration order, steps it first. The programs build the head last.
    fn head_registered_first(&self) -> bool {
        false
    }
}

/// Llama (`models/llama/`, transformers 5.24): every default of [`Modeling`]'s step. It lives
/// beside the trait whose defaults are its code (`llama.rs` holds that code, which the other
/// families call too).
pub struct Llama;
impl ConfigFile for Llama {
    /// `LlamaConfig` (configuration_llama.py): the sizes required, `attention_bias`,
    /// `mlp_bias`, 2,048 positions by default.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        fields::with_heads(fields::llama_keys(f, fields::Ffn::Required, false, 2048)?)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::llama_base("llama", s, "hidden_act") else { return Vec::new() };
        w.set("intermediate_size", s.ffn).set("attention_bias", s.qkv_bias).set("mlp_bias", s.mlp_bias);
        w.done().into_iter().collect()
    }
}

impl Modeling for Llama {
    fn presets(&self) -> Vec<Preset> {
        let p = |order, id, checkpoint, family, spec| Preset::new(order, id, checkpoint, family, spec);
        vec![
            p(4, "llama-2-7b", "meta-llama/Llama-2-7b-hf", "Llama 2", llama_spec(32000, 4096, 32, 32, 32, 11008, 4096)),
            p(5, "llama-2-13b", "meta-llama/Llama-2-13b-hf", "Llama 2", llama_spec(32000, 5120, 40, 40, 40, 13824, 4096)),
            p(6, "llama-2-70b", "meta-llama/Llama-2-70b-hf", "Llama 2", llama_spec(32000, 8192, 80, 64, 8, 28672, 4096)),
            p(7, "llama-3.1-8b", "meta-llama/Llama-3.1-8B", "Llama 3.1", default_spec()),
            p(8, "llama-3.1-70b", "meta-llama/Llama-3.1-70B", "Llama 3.1", llama_spec(128256, 8192, 80, 64, 8, 28672, 131072)),
            p(9, "llama-3.1-405b", "meta-llama/Llama-3.1-405B", "Llama 3.1", llama_spec(128256, 16384, 126, 128, 8, 53248, 131072)),
            p(
                10,
                "llama-3.2-1b",
                "meta-llama/Llama-3.2-1B",
                "Llama 3.2",
                with_head_dim(tied(llama_spec(128256, 2048, 16, 32, 8, 8192, 131072)), 64),
            ),
            p(
                11,
                "llama-3.2-3b",
                "meta-llama/Llama-3.2-3B",
                "Llama 3.2",
                with_head_dim(tied(llama_spec(128256, 3072, 28, 24, 8, 8192, 131072)), 128),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use crate::estimator::model::{LayerRule, ModelSpec, Router};
    use crate::estimator::presets::preset;
    use crate::estimator::step::families::modeling;
    use crate::estimator::unmodelled_feature;

    /// gpt-oss's and Llama 4's code builds exactly their presets' layouts (`gpt_oss::layout`,
    /// `llama4::layout`): the presets are accepted as they are, and a feature changed — sinks
    /// with another router, chunks on Llama 4's NoPE layers — is refused rather than
    /// approximated.
    #[test]
    fn the_families_that_build_their_own_layout_accept_their_presets_and_refuse_what_differs() {
        let own = |spec: &ModelSpec| modeling(spec.family).builds_own_layout(spec);
        let spec = |id: &str| preset(id).expect("the preset exists").spec;
        for id in ["gpt-oss-20b", "gpt-oss-120b", "llama-4-scout-17b-16e-instruct", "llama-4-maverick-17b-128e-instruct"] {
            assert!(own(&spec(id)), "{id}");
            assert!(unmodelled_feature(&spec(id)).is_none(), "{id} is accepted");
        }
        let changed = [
            ModelSpec { router: Router::Softmax, ..spec("gpt-oss-20b") },
            ModelSpec { window_layers: LayerRule::All, ..spec("llama-4-scout-17b-16e-instruct") },
        ];
        for s in changed {
            assert!(!own(&s), "{:?}", s.family);
            assert!(unmodelled_feature(&s).is_some(), "{:?}", s.family);
        }
    }
}
