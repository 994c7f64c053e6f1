//! [`Modeling`]: the pieces of a family's modeling code the step is built from — the model's
//! forward before the layers (the prologue), a decoder layer, the final norm, and what those
//! hand each other (masks, rotary tables, which layers slide a window). Every method defaults
//! to Llama's (`modeling_llama.py`); a family overrides only what its own modeling file does
//! differently.

use super::super::ir::{Builder, Dt, Shape, Tid};
use super::common::{cos_shape, embed_then, final_norm, has_rope, mask_shape, received, Kind, Norm, Params, Rms, Shared};
use super::llama;
use crate::estimator::config::Attention;
use crate::estimator::model::ModelSpec;

/// One family's modeling code, as the step program builds it (see the module doc).
pub trait Modeling: Sync {
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
        [(attn == Attention::Eager).then(|| mask_shape(attn)), None]
    }

    /// Whether the layers receive `position_ids` (GPT-2's do not).
    fn shares_positions(&self) -> bool {
        true
    }

    /// Whether the embedding is scaled by a 0-dim buffer in the model dtype (Gemma's
    /// `embed_scale`).
    fn embed_scale_buffer(&self) -> bool {
        false
    }

    /// Whether this family's code builds exactly `spec`'s layout, features the estimator refuses
    /// elsewhere included (gpt-oss's sinks, Llama 4's experts): such a spec is accepted as it is.
    fn builds_own_layout(&self, spec: &ModelSpec) -> bool {
        let _ = spec;
        false
    }
}

/// Llama (`modeling_llama.py`): every default; also the code of Mixtral, Qwen2, Qwen3 and
/// SmolLM3, which transformers generates from Llama's (their differences are in the spec: MoE
/// layers, biases, q/k norms, NoPE layers).
pub struct Llama;
impl Modeling for Llama {}

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
