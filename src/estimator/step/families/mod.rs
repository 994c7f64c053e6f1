//! Each model family's modeling code, as the step program builds it: one file per family (or a
//! few close variants), each implementing [`Modeling`] — the prologue before the layers, a
//! decoder layer, the final norm and what they hand each other — by overriding only what its
//! transformers `modeling_<type>.py` does differently from Llama's, which the trait's defaults
//! follow. What families share is written once and called with parameters where they differ:
//! the embeddings, masks, rotary tables, norms, projections and MLPs in `common.rs`; Llama's
//! attention, its core, the partial RoPEs and the pre-norm decoder layer (`decoder_layer`, the
//! feed-forward block `Ffn`) in `llama.rs`; the MoE blocks in `moe.rs` and `sigmoid_moe.rs`.
//!
//! The family of a model is decided once, when it is imported, picked as a preset or named by
//! a link's `family` key ([`crate::estimator::family::Family`]); [`modeling()`] maps it to its code.
//! Nothing here guesses a family from the architecture's numbers.
//!
//! Adding a family:
//! 1. `families/<name>.rs`: its `pub struct` and `impl Modeling` (only the methods that differ:
//!    often just `layer`, `positions` — what the forward computes after the embedding — and
//!    `norm`), the ops of what differs, built from the shared pieces, each citing the
//!    transformers 5.24 file and function it follows;
//! 2. its variant and `model_type` in `estimator/family.rs`, and its arm in [`modeling()`] here;
//! 3. its `config.json` reading in `estimator/hf.rs` and a preset in `estimator/presets.rs`
//!    (named after its public checkpoint);
//! 4. its measured records in `tests/fixtures/pytorch/` (see `validation/README.md`), which
//!    `tests/step_fixtures.rs` checks.

pub mod common;
pub mod deepseek;
pub mod falcon;
pub mod gemma;
pub mod glm4_moe;
pub mod gpt2;
pub mod gpt_oss;
pub mod llama;
pub mod llama4;
pub mod mistral;
pub mod modeling;
pub mod moe;
pub mod neox;
pub mod olmo;
pub mod opt;
pub mod phi;
pub mod phi3;
pub mod qwen_moe;
pub mod sigmoid_moe;
pub mod smollm3;
pub mod stablelm;
pub mod starcoder2;
pub mod torchtitan;

pub use common::{Kind, Params, Shared, Var};
pub use modeling::Modeling;

use crate::estimator::config::Framework;
use crate::estimator::family::Family;

/// The modeling code of `family`.
pub fn modeling(family: Family) -> &'static dyn Modeling {
    match family {
        Family::Llama | Family::Mixtral | Family::Qwen2 | Family::Qwen3 => &modeling::Llama,
        Family::Smollm3 => &smollm3::Smollm3,
        Family::Mistral => &mistral::Mistral,
        Family::Qwen2Moe => &qwen_moe::Qwen2Moe,
        Family::Qwen3Moe => &qwen_moe::Qwen3Moe,
        Family::Gemma => &gemma::Gemma,
        Family::Gemma2 => &gemma::Gemma2,
        Family::Gemma3 => &gemma::Gemma3,
        Family::Olmo => &olmo::Olmo,
        Family::Olmo2 => &olmo::Olmo2,
        Family::Phi => &phi::Phi,
        Family::Phi3 => &phi3::Phi3,
        Family::Gpt2 => &gpt2::Gpt2,
        Family::GptNeox => &neox::GptNeox,
        Family::Opt => &opt::Opt,
        Family::Falcon => &falcon::Falcon,
        Family::Stablelm => &stablelm::Stablelm,
        Family::Starcoder2 => &starcoder2::Starcoder2,
        Family::DeepseekV2 => &deepseek::DeepseekV2,
        Family::DeepseekV3 => &deepseek::DeepseekV3,
        Family::Glm4Moe => &glm4_moe::Glm4Moe,
        Family::GptOss => &gpt_oss::GptOss,
        Family::Llama4 => &llama4::Llama4,
    }
}

/// The modeling code `framework` runs for `family`: a training framework's own model where it
/// ships one for the family (`framework = torchtitan`: its Llama 3), else transformers'.
/// [`crate::estimator::validate`] refuses a framework with a family it does not ship.
pub fn modeling_for(framework: Framework, family: Family) -> &'static dyn Modeling {
    match (framework, family) {
        (Framework::Torchtitan, Family::Llama) => &torchtitan::Llama3,
        _ => modeling(family),
    }
}

/// The variant (sliding window, NoPE) of decoder layer `i` (its index in the model).
pub fn var(spec: &crate::estimator::model::ModelSpec, i: usize) -> Var {
    Var { sliding: modeling(spec.family).sliding(spec, i), nope: common::nope(spec, i) }
}
