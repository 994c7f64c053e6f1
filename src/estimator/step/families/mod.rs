//! Each model family, in one file per family (or a few close variants): its `config.json`
//! reading and writing ([`ConfigFile`]), its presets and its modeling code as the step program
//! builds it ([`Modeling`]) — for the step, the prologue before the layers, a decoder layer,
//! the final norm and what they hand each other — by overriding only what its
//! transformers `modeling_<type>.py` does differently from Llama's, which the trait's defaults
//! follow. What families share is written once and called with parameters where they differ:
//! the embeddings, masks, rotary tables, norms, projections and MLPs in `common.rs`; Llama's
//! attention, its core, the partial RoPEs and the pre-norm decoder layer (`decoder_layer`, the
//! feed-forward block `Ffn`) in `llama.rs`; the MoE blocks in `moe.rs` and `sigmoid_moe.rs`.
//! Llama's own `impl Modeling` is in `modeling.rs`, beside the trait whose defaults it is.
//!
//! The family of a model is decided once, when it is imported, picked as a preset or named by
//! a link's `family` key ([`Family`]); [`modeling()`] maps it to its code and [`config_file()`]
//! to its `config.json` (both made from one list of arms, `families!`). The two traits are
//! apart so that the page's first screen, which only estimates, carries no family's reader or
//! writer: those load with the panels that import and export.
//! Nothing here guesses a family from the architecture's numbers.
//!
//! Adding a family takes one new file and one arm here, and nothing else in `src/`:
//! 1. `families/<name>.rs` (or a variant beside a close family's): its `pub struct`, its
//!    `impl ConfigFile` and `impl Modeling`, citing the transformers 5.24 `modeling_<type>.py` it
//!    follows —
//!    - `import` ([`ConfigFile`]): its `configuration_<type>.py` keys and class defaults into a [`ModelSpec`]
//!      (with the shared readers of `estimator::hf_fields`), and `aliases`/`wrappers` for
//!      other model types read alike;
//!    - `presets`: its public checkpoints, named after them (built from
//!      `estimator::preset_base`);
//!    - `export` ([`ConfigFile`]): the `config.json` that builds a spec back (with `estimator::hf_writer`);
//!    - the step: only the methods whose code differs from Llama's defaults (often `layer`,
//!      `positions` and `norm`), built from the shared pieces;
//! 2. its variant in [`Family`] with its `model_type` and name in `Family::ALL`
//!    (`estimator/family.rs`), and its arm in `families!` here;
//! 3. in `tests/`: its presets' exact counts (`tests/presets.rs`), its checkpoint's
//!    `config.json` (`tests/fixtures/hf/`), and its measured records (`tests/fixtures/pytorch/`,
//!    see `validation/README.md`), which `tests/pytorch_fixtures.rs` and
//!    `tests/step_fixtures.rs` check.
//!
//! The importer (`estimator::hf`), the exporter (`estimator::hf_export`) and the preset list
//! (`estimator::presets`) go through [`config_file()`] and [`modeling()`] for every family in `Family::ALL`; they
//! need no change.
//!
//! [`ModelSpec`]: crate::estimator::model::ModelSpec

pub mod apertus;
pub mod common;
pub mod deepseek;
pub mod deepseek_v32;
pub mod dsa;
pub mod exaone4;
pub mod falcon;
pub mod falcon_h1;
pub mod fla;
pub mod gemma;
pub mod glm4_moe;
pub mod gpt2;
pub mod gpt_oss;
pub mod granitemoehybrid;
pub mod kimi_linear;
pub mod litgpt;
pub mod llama;
pub mod llama4;
pub mod mamba2;
pub mod minimax_m2;
pub mod mistral;
pub mod mixtral;
pub mod modeling;
pub mod moe;
pub mod neox;
pub mod olmo;
pub mod opt;
pub mod phi;
pub mod phi3;
pub mod qwen;
pub mod qwen3_next;
pub mod qwen_moe;
pub mod seed_oss;
pub mod sigmoid_moe;
pub mod smollm3;
pub mod stablelm;
pub mod starcoder2;
pub mod torchtitan;
pub mod torchtune;

pub use common::{Kind, Params, Shared, Var};
pub use modeling::{ConfigFile, Modeling};

use crate::estimator::config::Framework;
use crate::estimator::family::Family;

/// Every family's code, one arm each: `Family::X => the struct in its file`. The arms make both
/// maps — [`modeling`] (its presets and step) and [`config_file`] (its `config.json`) — so a new
/// family is still one file and one arm here.
macro_rules! families {
    ($($family:ident => $code:expr,)*) => {
        /// The modeling code of `family`.
        pub fn modeling(family: Family) -> &'static dyn Modeling {
            match family {
                $(Family::$family => &$code,)*
            }
        }

        /// How `family`'s `config.json` reads and is written (the importer's and exporter's
        /// side only; what estimates never reaches it).
        pub fn config_file(family: Family) -> &'static dyn ConfigFile {
            match family {
                $(Family::$family => &$code,)*
            }
        }
    };
}

families! {
    Llama => modeling::Llama,
    Mixtral => mixtral::Mixtral,
    Qwen2 => qwen::Qwen2,
    Qwen3 => qwen::Qwen3,
    Smollm3 => smollm3::Smollm3,
    Mistral => mistral::Mistral,
    Qwen2Moe => qwen_moe::Qwen2Moe,
    Qwen3Moe => qwen_moe::Qwen3Moe,
    Gemma => gemma::Gemma,
    Gemma2 => gemma::Gemma2,
    Gemma3 => gemma::Gemma3,
    Olmo => olmo::Olmo,
    Olmo2 => olmo::Olmo2,
    Phi => phi::Phi,
    Phi3 => phi3::Phi3,
    Gpt2 => gpt2::Gpt2,
    GptNeox => neox::GptNeox,
    Opt => opt::Opt,
    Falcon => falcon::Falcon,
    Stablelm => stablelm::Stablelm,
    Starcoder2 => starcoder2::Starcoder2,
    DeepseekV2 => deepseek::DeepseekV2,
    DeepseekV3 => deepseek::DeepseekV3,
    Glm4Moe => glm4_moe::Glm4Moe,
    GptOss => gpt_oss::GptOss,
    Llama4 => llama4::Llama4,
    SeedOss => seed_oss::SeedOss,
    Olmo3 => olmo::Olmo3,
    Qwen3Next => qwen3_next::Qwen3Next,
    Qwen35Text => qwen3_next::Qwen35 { moe: false },
    Qwen35MoeText => qwen3_next::Qwen35 { moe: true },
    FalconH1 => falcon_h1::FalconH1,
    DeepseekV32 => deepseek_v32::DeepseekV32,
    Exaone4 => exaone4::Exaone4,
    Apertus => apertus::Apertus,
    MinimaxM2 => minimax_m2::MinimaxM2,
    GraniteMoeHybrid => granitemoehybrid::GraniteMoeHybrid,
    KimiLinear => kimi_linear::KimiLinear,
}

/// The modeling code `framework` runs for `family`: a training framework's own model where it
/// ships one for the family (`framework = torchtitan`: its Llama 3, its Qwen3, dense and MoE, and
/// its DeepSeek-V3 in the DeepSeek-V2-Lite shape of its 16B flavor, its Llama 4),
/// else transformers'.
/// [`crate::estimator::validate`] refuses a framework with a family it does not ship.
pub fn modeling_for(framework: Framework, family: Family) -> &'static dyn Modeling {
    match (framework, family) {
        (Framework::Torchtitan, Family::Llama) => &torchtitan::Llama3,
        (Framework::Torchtitan, Family::Qwen3 | Family::Qwen3Moe) => &torchtitan::Qwen3,
        (Framework::Torchtitan, Family::DeepseekV2) => &torchtitan::DeepseekV3,
        (Framework::Torchtitan, Family::Llama4) => &torchtitan::Llama4,
        (Framework::Torchtune, _) => match torchtune::decoder(family) {
            Some(code) => code,
            None => modeling(family),
        },
        (Framework::Litgpt, f) if litgpt::ships(f) => &litgpt::Gpt,
        _ => modeling(family),
    }
}

/// The variant (sliding window, NoPE, linear attention: a gated DeltaNet or Mamba-2 mixer in
/// place of attention) of decoder layer `i` (its index in the model).
pub fn var(spec: &crate::estimator::model::ModelSpec, i: usize) -> Var {
    let linear = (spec.gdn.k_heads > 0 || spec.ssm.heads > 0) && spec.linear_layers.contains(i as u64);
    Var { sliding: modeling(spec.family).sliding(spec, i), nope: common::nope(spec, i), every_nth: false, linear }
}
