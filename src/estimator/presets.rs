//! Built-in models: real checkpoints, each pinned in a test to its exact parameter count — the
//! count transformers 5.24 builds from the checkpoint's `config.json` (on the meta device), which
//! equals the published safetensors total for text-only checkpoints. For a multimodal checkpoint
//! the preset is its language model (the vision tower is not counted, and the preset's notes say
//! so). Ids are the checkpoint's Hugging Face name in lower case without its organisation.
//!
//! Figures come from each checkpoint's `config.json` (committed under `tests/fixtures/hf/`,
//! where the importer test reads them too and checks that the import equals the preset).
//!
//! Each family's presets are its `Modeling::presets` (`step/families/<family>.rs`), built from
//! the shared constructors of [`preset_base`](crate::estimator::preset_base); this file lists them all.

use super::family::Family;
use super::step::families::modeling;

pub use super::preset_base::{default_spec, Preset, DEFAULT_PRESET};

/// Every preset, in the order the picker lists them ([`Preset::order`]; every family's
/// `Modeling::presets`).
pub fn presets() -> Vec<Preset> {
    let mut all: Vec<Preset> = Family::ALL.iter().flat_map(|&(f, _, _)| modeling(f).presets()).collect();
    all.sort_by_key(|p| p.order);
    all
}

/// Looks a preset up by id (case-insensitive).
pub fn preset(id: &str) -> Option<Preset> {
    presets().into_iter().find(|p| p.id.eq_ignore_ascii_case(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_a_valid_model() {
        for p in presets() {
            assert_eq!(p.spec.validate(), Ok(()), "{}", p.id);
        }
    }

    #[test]
    fn llama_3_1_70b_has_83_9_million_qkv_parameters_per_layer_and_an_untied_head() {
        // q: 8192 × 8192 = 67,108,864; k and v: 8192 × (8 × 128) = 8,388,608 each.
        let p = preset("llama-3.1-70b").map(|p| p.spec);
        let spec = p.as_ref().map(|s| (s.q_width() + 2 * s.kv_width()) * s.hidden);
        assert_eq!(spec, Some(83_886_080));
        assert_eq!(p.map(|s| s.tied), Some(false));
    }

    #[test]
    fn mixtral_activates_about_13_billion_parameters_per_token() {
        let c = preset("mixtral-8x7b-v0.1").map(|p| p.spec.counts());
        // 46.70 B total; each token uses 2 of 8 experts: 46.70 B − 6 × 32 × 3 × 4096 × 14336.
        assert_eq!(c.map(|c| c.active), Some(46_702_792_704 - 6 * 32 * 3 * 4096 * 14336));
    }

    #[test]
    fn preset_lookup_ignores_case_and_rejects_unknown_ids() {
        assert!(preset("Llama-3.1-8B").is_some());
        assert!(preset("llama-9").is_none());
    }

    #[test]
    fn deepseek_v3_counts_671_billion_without_its_mtp_layer_and_says_so() {
        let p = preset("deepseek-v3").expect("preset");
        assert_eq!(p.spec.counts().total, 671_026_404_352);
        assert!(p.notes.iter().any(|n| n.contains("multi-token-prediction")));
        // 58 MoE layers after 3 dense ones; 8 of 256 routed experts per token.
        assert_eq!((p.spec.dense_mlp_layers(), p.spec.moe_layers()), (3, 58));
    }

    #[test]
    fn gpt_oss_activates_the_model_cards_figures_beside_its_embedding() {
        // OpenAI's model card: 3.61 B and 5.13 B active parameters, not counting the embedding
        // table (201,088 × 2,880 = 579,133,440).
        let embedding = 201_088 * 2880;
        let active = |id| preset(id).map(|p| p.spec.counts().active - embedding);
        assert_eq!(active("gpt-oss-20b"), Some(3_608_307_264));
        assert_eq!(active("gpt-oss-120b"), Some(5_132_849_472));
    }

    #[test]
    fn llama_4_maverick_alternates_dense_and_moe_layers_and_scout_is_all_moe() {
        let m = preset("llama-4-maverick-17b-128e-instruct").map(|p| (p.spec.dense_mlp_layers(), p.spec.moe_layers()));
        let s = preset("llama-4-scout-17b-16e-instruct").map(|p| (p.spec.dense_mlp_layers(), p.spec.moe_layers()));
        assert_eq!((m, s), (Some((24, 24)), Some((0, 48))));
    }

    #[test]
    fn multimodal_presets_say_their_vision_tower_is_not_counted() {
        for id in
            ["gemma-3-4b-it", "gemma-3-12b-it", "gemma-3-27b-it", "mistral-small-3.1-24b-instruct-2503", "llama-4-scout-17b-16e-instruct"]
        {
            let p = preset(id).unwrap_or_else(|| panic!("no preset {id}"));
            assert!(p.notes.iter().any(|n| n.contains("vision tower")), "{id}");
        }
    }
}
