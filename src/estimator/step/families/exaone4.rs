//! EXAONE 4 (`models/exaone4/modeling_exaone4.py`, transformers 5.24): OLMo-2's post-norm
//! layout with Llama's RMSNorm (`Exaone4RMSNorm`: the normalized input cast back, then the
//! weight), q/k norms over each head on the transposed `[b, heads, s, d]` views (Gemma-3's
//! place, [`HeadNorm::Bhsd`]), and hybrid attention: the layers `layer_types` names
//! `sliding_attention` slide a window and rotate q and k; the others attend globally without
//! RoPE (`Exaone4Attention.forward`: `if self.sliding_window is None or self.is_sliding:
//! apply_rotary_pos_emb(…)`). The model computes one rotary pair, cast to the hidden states'
//! dtype, and one mask per layer type (`create_causal_mask`, `create_sliding_window_causal_mask`).

use super::super::ir::{Builder, Dt, Shape, Tid};
use super::common::{cache_position, causal_mask, mask_shape, masked, rope_pair, sliding_window_mask_for};
use super::common::{AttnW, Kind, MlpW, Norm, Params, Rms, Shared};
use super::llama::{attention_with, mlp, HeadNorm};
use super::modeling::{ConfigFile, Modeling};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{Activation, LayerRule, ModelSpec, QkNorm, WindowKind};
use crate::estimator::preset_base::{llama, Preset};
use serde_json::{Map, Value};

/// `Exaone4RMSNorm` (Llama's: `self.weight * hidden_states.to(input_dtype)`).
const NORM: Norm = Norm::Rms(Rms::Llama);

/// `Exaone4Config`'s default `sliding_window` (4,096 tokens).
const DEFAULT_WINDOW: u64 = 4096;

/// `Exaone4Config`'s default `sliding_window_pattern`: three sliding layers, then a full one.
const DEFAULT_PATTERN: u64 = 4;

/// `Exaone4DecoderLayer.forward`: OLMo-2's layer ([`super::gemma::post_norm_layer`] without
/// pre-norms), Llama's RMSNorm, the attention with per-head q/k norms after the transpose:
/// ```python
/// hidden_states = residual + self.post_attention_layernorm(self.self_attn(hidden_states))
/// hidden_states = residual + self.post_feedforward_layernorm(self.mlp(hidden_states))
/// ```
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    // Registration order: self_attn (q, k, v, o, q_norm, k_norm), mlp, post_attention_layernorm,
    // post_feedforward_layernorm.
    let aw = AttnW::new(b, p);
    let mw = MlpW::new(b, p);
    super::gemma::post_norm_layer(
        b,
        p,
        x,
        NORM,
        false,
        |b, n| attention_with(b, &aw, spec, n, sh, attn, HeadNorm::Bhsd(Rms::Llama)),
        |b, n| mlp(b, &mw, n),
    )
}

/// `Exaone4Model.forward` after the embedding: `position_ids`, the full mask and, when a layer
/// slides, the sliding one, and one rotary pair (`Exaone4RotaryEmbedding.forward`, cast to the
/// hidden states' dtype) which the NoPE layers do not read.
fn positions(b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
    let pos = cache_position(b);
    let mask = causal_mask(b, pos, attn);
    let windowed = spec.window_layers.count(spec.layers) > 0;
    let mask_local = if windowed { sliding_window_mask_for(b, pos, attn, spec.window) } else { None };
    let (cos, sin) = rope_pair(b, spec, pos, true);
    Shared { cos, sin, pos: Some(pos), mask, mask_local, ..Shared::default() }
}

/// The layers without RoPE: with a `sliding_window`, every layer `layer_types` does not name
/// `sliding_attention`; without one, none.
fn nope_layers(windowed: bool, window_layers: &LayerRule, layers: u64) -> LayerRule {
    if !windowed {
        return LayerRule::None;
    }
    LayerRule::from_flags(&(0..layers).map(|i| !window_layers.contains(i)).collect::<Vec<_>>())
}

/// EXAONE 4's size defaults and layout on `llama`'s sizes.
fn exaone4(m: ModelSpec, window: u64, window_layers: LayerRule) -> ModelSpec {
    let nope_layers = nope_layers(window > 0, &window_layers, m.layers);
    ModelSpec { family: Family::Exaone4, qk_norm: QkNorm::Head, window, window_layers, nope_layers, ..m }
}

/// EXAONE 4 (see the module doc).
pub struct Exaone4;
impl ConfigFile for Exaone4 {
    /// `Exaone4Config` (configuration_exaone4.py): every size defaults to the class's (102,400
    /// tokens, 4,096 wide, 32 layers of 32 heads, 16,384 MLP, 2,048 positions); no biases;
    /// `sliding_window` (4,096) on the layers `layer_types` names `sliding_attention` — by
    /// default all but every `sliding_window_pattern`-th (4), read only when `layer_types` is
    /// absent (the released files spell it `"LLLG"`) — and no RoPE on the others while a
    /// window is set.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = llama(
            f.size("vocab_size", 102_400)?,
            f.size("hidden_size", 4096)?,
            f.size("num_hidden_layers", 32)?,
            f.size("num_attention_heads", 32)?,
            0,
            f.size("intermediate_size", 16_384)?,
            f.uint_or("max_position_embeddings", 2048)?,
        );
        fields::check_layers(m.layers)?;
        m.kv_heads = f.uint_or("num_key_value_heads", m.heads)?;
        m.head_dim = f.size("head_dim", m.hidden / m.heads.max(1))?;
        m.act = f.activation(&["hidden_act"], Activation::Silu)?;
        m.tied = f.flag("tie_word_embeddings", false)?;
        let windowed = !f.is_null("sliding_window");
        let default = if f.layer_types(m.layers)?.is_some() || !windowed {
            LayerRule::None
        } else {
            let pattern = f.uint_or("sliding_window_pattern", DEFAULT_PATTERN)?;
            if pattern <= 1 {
                LayerRule::None
            } else {
                LayerRule::AllBut { step: pattern, offset: pattern - 1 }
            }
        };
        fields::set_window(&mut m, f, "sliding_window", Some(DEFAULT_WINDOW), (default, WindowKind::Sliding))?;
        let rule = if windowed { rule_of(f, m.layers, &m.window_layers)? } else { LayerRule::None };
        m.nope_layers = nope_layers(windowed, &rule, m.layers);
        m.qk_norm = QkNorm::Head;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let windowed = s.window > 0 && s.window_layers.count(s.layers) > 0;
        if s.qk_norm != QkNorm::Head || s.nope_layers != nope_layers(windowed, &s.window_layers, s.layers) {
            return Vec::new();
        }
        let Some(mut w) = writer::llama_base("exaone4", s, "hidden_act") else { return Vec::new() };
        w.set("intermediate_size", s.ffn)
            .set("sliding_window", writer::window_or_null(s))
            .set("layer_types", writer::layer_types(s, "sliding_attention"));
        w.done().into_iter().collect()
    }
}

impl Modeling for Exaone4 {
    /// EXAONE-4.0-32B (LGAI-EXAONE/EXAONE-4.0-32B), from its `config.json`
    /// (`tests/fixtures/hf/exaone-4.0-32b.json`): 102,400 tokens, 5,120 wide, 64 layers of 40
    /// query and 8 KV heads of 128, 27,392 MLP, a 4,096-token window on three of every four
    /// layers (the fourth global, without RoPE), 131,072 positions, untied.
    /// 32,003,216,384 parameters (transformers 5.24 on the meta device).
    fn presets(&self) -> Vec<Preset> {
        let mut m = llama(102_400, 5120, 64, 40, 8, 27_392, 131_072);
        m.head_dim = 128;
        let m = exaone4(m, DEFAULT_WINDOW, LayerRule::AllBut { step: 4, offset: 3 });
        vec![Preset::new(112, "exaone-4.0-32b", "LGAI-EXAONE/EXAONE-4.0-32B", "EXAONE 4.0", m)]
    }
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        positions(b, spec, attn)
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
    fn norm(&self) -> Norm {
        NORM
    }
    /// `layer_types` (the window rule the importer reads from it).
    fn sliding(&self, spec: &ModelSpec, i: usize) -> bool {
        spec.window_layers.contains(i as u64)
    }
    /// Eager's two masks; under SDPA the sliding mask once the window is shorter than the keys.
    fn mask_shapes(&self, b: &Builder, spec: &ModelSpec, attn: Attention) -> [Option<(Shape, Dt)>; 2] {
        let eager = attn == Attention::Eager;
        let windowed = spec.window_layers.count(spec.layers) > 0;
        let local = windowed && (eager || masked(spec.window, b.c.n(Q::S_KV)));
        [eager.then(|| mask_shape(attn)), local.then(|| mask_shape(attn))]
    }
}

/// The sliding layers as `Exaone4Attention` reads them (`layer_types`), whether or not a
/// window of 0 dropped them from the spec's window rule.
fn rule_of(f: &Fields, layers: u64, window_layers: &LayerRule) -> Result<LayerRule, HfError> {
    Ok(match f.layer_types(layers)? {
        Some((flags, _)) => LayerRule::from_flags(&flags),
        None => window_layers.clone(),
    })
}

#[cfg(test)]
mod tests {
    use crate::estimator::presets::preset;
    use crate::estimator::step::families::var;

    /// EXAONE-4.0-32B: layers 0–2 of every four slide a window and rotate; the fourth attends
    /// globally without RoPE.
    #[test]
    fn exaone_4_rotates_its_sliding_layers_and_leaves_its_global_layers_without_rope() {
        let spec = preset("exaone-4.0-32b").expect("the preset exists").spec;
        for i in 0..8 {
            let v = var(&spec, i);
            assert_eq!(v.sliding, i % 4 != 3, "layer {i}");
            assert_eq!(v.nope, i % 4 == 3, "layer {i}");
        }
    }
}
