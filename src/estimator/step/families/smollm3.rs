//! SmolLM3 (`modeling_smollm3.py`): Llama's decoder layer with NoPE layers — layers whose
//! `config.no_rope_layers[layer_idx]` is 0 skip `apply_rotary_pos_emb` (`SmolLM3Attention`:
//! `self.use_rope = config.no_rope_layers[layer_idx]`, `if self.use_rope: …`); by default every
//! `no_rope_layer_interval`-th layer (`configuration_smollm3.py`). Everything else is Llama's
//! ([`super::llama::layer`]).
//!
//! What a NoPE layer changes in the step: its view of the model's tensors has no cos/sin
//! ([`super::Shared::view`]), so the attention core receives q and k as the transposed views of
//! `q_proj`/`k_proj`'s outputs. SDPA's CPU flash backward lays dq and dk out like q and k, so their
//! `view` backward needs no copy (as for v); eager attention's `matmul` copies them (`fold`) and
//! their gradients come back transposed: `ViewBackward0` clones, as for v. Saved bytes are those of
//! a RoPE layer: the core keeps q and k either way (RoPE's `mul`s keep only the shared cos/sin).

use super::{has_rope, Shared};
use crate::estimator::model::ModelSpec;

/// Whether decoder layer `i` (its index in the model) has no rotary embedding.
pub fn nope(spec: &ModelSpec, i: usize) -> bool {
    has_rope(spec) && spec.nope_layers.contains(i as u64)
}

/// Whether a layer's view of the shared tensors is a NoPE layer's: the model computes cos/sin
/// but this layer does not read them.
pub fn nope_view(spec: &ModelSpec, sh: &Shared) -> bool {
    has_rope(spec) && sh.cos.is_none()
}
