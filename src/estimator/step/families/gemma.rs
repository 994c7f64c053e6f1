//! Gemma-2 (`modeling_gemma2.py`): Gemma's RMSNorm (`x.float()` normalized, scaled by
//! `1 + weight.float()`, cast back), four norms per layer (around attention and MLP), the
//! embedding scaled by √h (a buffer), GeGLU (`gelu_pytorch_tanh`), tanh soft-capping of the
//! attention scores and of the final logits, and alternating sliding-window / full layers with
//! one materialized mask each. Gemma (`modeling_gemma.py`) is Llama's layer with Gemma's RMSNorm
//! and GeGLU ([`layer_gemma1`]); Gemma-3's text model (`modeling_gemma3.py`) is Gemma-2's layer
//! with per-head q/k norms, no soft-capping, SDPA masks on its sliding layers and a RoPE pair
//! per layer type (`positions`).

use super::super::blocks::Keep;
use super::super::ir::{Builder, Dt, Group, Shape, Tid};
use super::common::{cache_position, causal_mask, embed_then, gated_mlp, mask_shape, masked, rope_pair, sliding_window_mask_for};
use super::common::{AttnW, Gated, Kind, MlpW, Norm, Params, Rms, Shared, GELU_TANH, LAYER_NORM, LLAMA_MLP};
use super::llama::{attention_with, decoder_layer, HeadNorm};
use super::modeling::{ConfigFile, Modeling};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Dims, Ffn, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::ModelSpec;
use crate::estimator::model::{Activation, LayerRule, NormKind, QkNorm, WindowKind};
use crate::estimator::part::Part;
use crate::estimator::preset_base::{llama, Preset, VISION_NOT_COUNTED};
use serde_json::{Map, Value};

/// `GemmaRMSNorm` (`1 + weight`, [`Rms::Gemma`]), in the layers and after them.
const NORM: Norm = Norm::Rms(Rms::Gemma);

/// `Gemma2Attention.forward` (eager; transformers refuses sdpa for Gemma-2, the core below is
/// SDPA's when asked anyway) and `Gemma3Attention.forward`: Llama's projections and RoPE, with
/// `q_norm`/`k_norm` (Gemma's RMSNorm over `head_dim`) on the transposed `[b, heads, s, d]`
/// views before RoPE, no soft-capping (Llama's eager core), and on sliding layers whose window
/// is shorter than the keys SDPA with the bool mask (`llama::sdpa_masked`: k and v repeated).
/// `query_pre_attn_scalar` only sets the scale (a `mul` by a Python number in eager, SDPA's
/// `scale`): no tensor of its own.
fn attention(b: &mut Builder, w: &AttnW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    attention_with(b, w, spec, x, sh, attn, HeadNorm::Bhsd(Rms::Gemma))
}

/// `GemmaMLP` / `Gemma2MLP`: `down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))`.
fn mlp(b: &mut Builder, w: &MlpW, x: Tid) -> Tid {
    b.part = Part::Mlp;
    gated_mlp(b, w, x, &Gated { act: GELU_TANH, ..LLAMA_MLP })
}

/// `Gemma2DecoderLayer.forward` (`pre`; OLMo-2's layer has only the post-norms):
/// ```python
/// residual = hidden_states
/// hidden_states = self.input_layernorm(hidden_states)               # pre
/// hidden_states, _ = self.self_attn(hidden_states=hidden_states, …)
/// hidden_states = self.post_attention_layernorm(hidden_states)
/// hidden_states = residual + hidden_states
/// residual = hidden_states
/// hidden_states = self.pre_feedforward_layernorm(hidden_states)     # pre
/// hidden_states = self.mlp(hidden_states)
/// hidden_states = self.post_feedforward_layernorm(hidden_states)
/// hidden_states = residual + hidden_states
/// ```
/// The caller has registered the attention's and the MLP's parameters; the norms' come after.
pub fn post_norm_layer(
    b: &mut Builder,
    p: &Params,
    x: Tid,
    norm: Norm,
    pre: bool,
    attention: impl FnOnce(&mut Builder, Tid) -> (Tid, Option<Tid>),
    mlp: impl FnOnce(&mut Builder, Tid) -> Tid,
) -> Tid {
    b.group = Group::All;
    let names: &[&str] = if pre {
        &["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"]
    } else {
        &["post_attention_layernorm", "post_feedforward_layernorm"]
    };
    let nw: Vec<_> = names.iter().map(|_| norm.weights(b, p, LAYER_NORM)).collect();
    let mut i = 0;
    let mut run = |b: &mut Builder, x: Tid| {
        b.module = names[i];
        b.part = Part::Norms;
        i += 1;
        norm.run(b, x, nw[i - 1])
    };
    let n1 = if pre { run(b, x) } else { x };
    let (a, weights) = attention(b, n1);
    if pre {
        b.hold(n1);
    }
    let a2 = run(b, a);
    b.module = "";
    let h = b.add(x, a2);
    let n2 = if pre { run(b, h) } else { h };
    let m = mlp(b, n2);
    if pre {
        b.hold(n2);
    }
    let m2 = run(b, m);
    b.module = "";
    let y = b.add(h, m2);
    b.hold(h);
    if let Some(w) = weights {
        b.hold(w);
    }
    y
}

/// `Gemma2DecoderLayer.forward` / `Gemma3DecoderLayer.forward`: four norms
/// ([`post_norm_layer`]).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    let aw = AttnW::new(b, p);
    let mw = MlpW::new(b, p);
    post_norm_layer(b, p, x, NORM, true, |b, n| attention(b, &aw, spec, n, sh, attn), |b, n| mlp(b, &mw, n))
}

/// Gemma-2's final-logit soft-capping: `logits / cap`, `tanh`, `* cap` (keeps the tanh).
pub fn softcap_logits(b: &mut Builder, logits: Tid) -> Tid {
    let d = b.unary("div", "DivBackward1", logits, Keep::Nothing, "div");
    let t = b.unary("tanh", "TanhBackward0", d, Keep::Output, "tanh_backward");
    b.mul_scalar(t)
}

/// `GemmaDecoderLayer.forward` (`modeling_gemma.py`): Llama's pre-norm layer
/// ([`decoder_layer`]) with Gemma's RMSNorm and the GeGLU MLP (`gelu_pytorch_tanh`); the
/// attention is Llama's (`GemmaAttention`: no soft-capping, `head_dim` need not be h/a).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer_gemma1(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    // Registration order: self_attn, mlp, input_layernorm, post_attention_layernorm.
    let aw = AttnW::new(b, p);
    let mw = MlpW::new(b, p);
    decoder_layer(b, p, x, NORM, |b, n| super::llama::attention(b, &aw, spec, n, sh, attn), |b, n| mlp(b, &mw, n))
}

/// What `Gemma2Model.forward` (under eager attention) and `Gemma3TextModel.forward` compute
/// after the embedding (Gemma-3's also a later pipeline stage's prologue): `position_ids`, both
/// masks (`create_causal_mask`: for SDPA only its packed-sequence check;
/// `create_sliding_window_causal_mask`: a materialized mask once the window is shorter than the
/// keys, or always for eager), and the rotary embedding — with `local`, one RoPE pair per layer
/// type (`Gemma3RotaryEmbedding.forward` with the full layers' base and the sliding layers'
/// local base, each cast to the hidden states' dtype).
fn positions(b: &mut Builder, spec: &ModelSpec, attn: Attention, local: bool) -> Shared {
    let pos = cache_position(b);
    let mask = causal_mask(b, pos, attn);
    let mask_local = sliding_window_mask_for(b, pos, attn, spec.window);
    let (cos, sin) = rope_pair(b, spec, pos, true);
    let (cos_local, sin_local) = if local { rope_pair(b, spec, pos, true) } else { (None, None) };
    Shared { cos, sin, pos: Some(pos), mask, mask_local, cos_local, sin_local, ..Shared::default() }
}

/// Whether Gemma-3's sliding-window layers have a rotary pair of their own: with both sliding
/// and full layers (`Gemma3TextModel.forward` computes one pair per layer type in
/// `set(config.layer_types)`).
fn local_rope(spec: &ModelSpec) -> bool {
    let n = spec.window_layers.count(spec.layers);
    n > 0 && n < spec.layers
}

/// Gemma-2: GeGLU (tanh GELU), four RMSNorms per layer, explicit head_dim, tied 256K
/// vocabulary, tanh soft-capping of scores and logits.
const fn gemma2(hidden: u64, layers: u64, heads: u64, kv_heads: u64, head_dim: u64, ffn: u64) -> ModelSpec {
    let mut m = llama(256000, hidden, layers, heads, kv_heads, ffn, 8192);
    m.family = Family::Gemma2;
    m.head_dim = head_dim;
    m.act = Activation::GeluTanh;
    m.norm = NormKind::RmsnormGemma;
    m.layer_norms = 4;
    m.tied = true;
    m.softcap = true;
    m
}

/// Gemma-2 with its local layers: Gemma2Config's default `layer_types` slide a 4,096-token
/// window on the even layers.
fn gemma2_windowed(hidden: u64, layers: u64, heads: u64, kv_heads: u64, head_dim: u64, ffn: u64) -> ModelSpec {
    ModelSpec {
        window_layers: LayerRule::Every { step: 2, offset: 0 },
        window: 4096,
        ..gemma2(hidden, layers, heads, kv_heads, head_dim, ffn)
    }
}

/// Gemma 3's text model as the 4B–27B checkpoints have it: Gemma-2's layout plus q/k norms,
/// 262,208 vocabulary, 131,072 positions, no soft-capping, five layers with a 1,024-token sliding
/// window for every full one (1B differs in vocabulary, positions and window).
fn gemma3(hidden: u64, layers: u64, heads: u64, kv_heads: u64, head_dim: u64, ffn: u64) -> ModelSpec {
    let mut m = gemma2(hidden, layers, heads, kv_heads, head_dim, ffn);
    m.family = Family::Gemma3;
    m.vocab = 262_208;
    m.max_pos = 131_072;
    m.softcap = false;
    m.qk_norm = QkNorm::Head;
    ModelSpec { window_layers: LayerRule::AllBut { step: 6, offset: 5 }, window: 1024, ..m }
}

/// Gemma's and Gemma 2's shared keys: Llama's, Gemma's RMSNorm, a tied head and 8,192
/// positions by default.
fn gemma_keys(f: &Fields) -> Result<ModelSpec, HfError> {
    let mut m = fields::llama_keys(f, Ffn::Required, true, 8192)?;
    m.norm = NormKind::RmsnormGemma;
    Ok(m)
}

/// The activation: `hidden_activation`, else `hidden_act`, the tanh GELU by default.
fn activation(f: &Fields) -> Result<Activation, HfError> {
    f.activation(&["hidden_activation", "hidden_act"], Activation::GeluTanh)
}

/// Soft-capping is on when either cap is set.
fn softcap(f: &Fields) -> Result<bool, HfError> {
    Ok(f.float("attn_logit_softcapping")?.is_some() || f.float("final_logit_softcapping")?.is_some())
}

/// Gemma (`modeling_gemma.py`): Llama's layout with Gemma's RMSNorm (`1 + weight`), GeGLU and
/// the embedding scaled by √h.
pub struct Gemma;
impl ConfigFile for Gemma {
    /// `GemmaConfig`: Llama's keys with Gemma's norm and activation.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = gemma_keys(f)?;
        m.act = activation(f)?;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::llama_base("gemma", s, "hidden_act") else { return Vec::new() };
        w.set("intermediate_size", s.ffn).set("attention_bias", s.qkv_bias);
        w.done().into_iter().collect()
    }
}

impl Modeling for Gemma {
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer_gemma1(b, p, spec, x, sh, attn)
    }
    fn norm(&self) -> Norm {
        NORM
    }
    fn embed_scale_buffer(&self) -> bool {
        true
    }
}

/// Gemma-2 (`modeling_gemma2.py`): four norms per layer, soft-capping, sliding-window attention
/// on the even layers, and under eager attention a full and a sliding-window mask.
pub struct Gemma2;
impl ConfigFile for Gemma2 {
    /// `Gemma2Config`: Gemma's keys, four norms a layer, soft-capping, and `layer_types`
    /// (default: a 4,096-token window on the even layers).
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = gemma_keys(f)?;
        m.layer_norms = 4;
        m.softcap = softcap(f)?;
        m.act = activation(f)?;
        // Gemma2Config: layer_types default sliding where (i + 1) % 2 != 0 (even layers).
        fields::set_window(&mut m, f, "sliding_window", Some(4096), (LayerRule::Every { step: 2, offset: 0 }, WindowKind::Sliding))?;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::llama_base("gemma2", s, "hidden_activation") else { return Vec::new() };
        w.set("intermediate_size", s.ffn)
            .set("attention_bias", s.qkv_bias)
            .set("sliding_window", writer::window_or_null(s))
            .set("layer_types", writer::layer_types(s, "sliding_attention"));
        writer::softcaps(&mut w, s);
        w.done().into_iter().collect()
    }
}

impl Modeling for Gemma2 {
    fn presets(&self) -> Vec<Preset> {
        let p = |order, id, checkpoint, spec| Preset::new(order, id, checkpoint, "Gemma 2", spec);
        vec![
            p(17, "gemma-2-2b", "google/gemma-2-2b", gemma2_windowed(2304, 26, 8, 4, 256, 9216)),
            p(18, "gemma-2-9b", "google/gemma-2-9b", gemma2_windowed(3584, 42, 16, 8, 256, 14336)),
            p(19, "gemma-2-27b", "google/gemma-2-27b", gemma2_windowed(4608, 46, 32, 16, 128, 36864)),
        ]
    }
    /// `Gemma2Model.forward` before the layers: Llama's, with the embedding scaled by √h and
    /// [`Self::positions`].
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        embed_then(b, p, spec, ids, true, |b| self.positions(b, spec, attn))
    }
    /// What `Gemma2Model.forward` computes for the layers, after the embedding or on a stage
    /// that receives its hidden states: Llama's, and under eager attention a full and a
    /// sliding-window mask (the sliding layers read the second).
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        match attn {
            Attention::Eager => positions(b, spec, attn, false),
            _ => super::llama::positions(b, spec, attn),
        }
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
    fn norm(&self) -> Norm {
        NORM
    }
    /// Gemma2Config's `layer_types`: sliding where `(i + 1) % 2 != 0`, the even layers.
    fn sliding(&self, _spec: &ModelSpec, i: usize) -> bool {
        i.is_multiple_of(2)
    }
    fn mask_shapes(&self, _b: &Builder, _spec: &ModelSpec, attn: Attention) -> [Option<(Shape, Dt)>; 2] {
        let eager = attn == Attention::Eager;
        [eager.then(|| mask_shape(attn)), eager.then(|| mask_shape(attn))]
    }
    fn embed_scale_buffer(&self) -> bool {
        true
    }
}

/// Gemma-3's text model (`modeling_gemma3.py`): Gemma-2's layout with per-head q/k norms, no
/// soft-capping, sliding layers from `layer_types` with a RoPE pair of their own.
pub struct Gemma3;
impl ConfigFile for Gemma3 {
    /// Gemma 3's text model (configuration_gemma3.py `Gemma3TextConfig`): Gemma RMSNorms, four
    /// per layer, q/k norms over the head, GeGLU, tied head, five sliding layers for every full
    /// one; absent sizes take the class's defaults.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_like(
            f,
            Dims {
                vocab: 262_208,
                hidden: 2304,
                layers: 26,
                heads: 8,
                kv_heads: Some(4),
                head_dim: Some(256),
                ffn: 9216,
                max_pos: 131_072,
                tied: true,
            },
        )?;
        m.norm = NormKind::RmsnormGemma;
        m.layer_norms = 4;
        m.qk_norm = QkNorm::Head;
        m.softcap = softcap(f)?;
        m.act = activation(f)?;
        let bias = f.flag("attention_bias", false)?;
        m.qkv_bias = bias;
        m.o_bias = bias;
        // Default layer_types: sliding where (i + 1) % sliding_window_pattern != 0 (pattern 6).
        let pattern = f.uint_or("sliding_window_pattern", 6)?;
        let rule = if pattern == 0 { LayerRule::None } else { LayerRule::AllBut { step: pattern, offset: pattern - 1 } };
        let rule = if pattern == 1 { LayerRule::None } else { rule };
        fields::set_window(&mut m, f, "sliding_window", Some(4096), (rule, WindowKind::Sliding))?;
        Ok(m)
    }
    fn wrappers(&self) -> &'static [&'static str] {
        &["gemma3"]
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let mut w = writer::Writer::new("gemma3_text");
        writer::llama_sizes(&mut w, s);
        let Some(act) = writer::act_name(s.act) else { return Vec::new() };
        w.set("intermediate_size", s.ffn)
            .set("hidden_activation", act)
            .set("attention_bias", s.qkv_bias)
            .set("sliding_window", writer::window_or_null(s))
            .set("layer_types", writer::layer_types(s, "sliding_attention"));
        writer::softcaps(&mut w, s);
        w.done().into_iter().collect()
    }
}

impl Modeling for Gemma3 {
    fn presets(&self) -> Vec<Preset> {
        let p = |order, id, checkpoint, spec| Preset::new(order, id, checkpoint, "Gemma 3", spec);
        vec![
            p(
                30,
                "gemma-3-1b-it",
                "google/gemma-3-1b-it",
                ModelSpec { vocab: 262_144, max_pos: 32_768, window: 512, ..gemma3(1152, 26, 4, 1, 256, 6912) },
            ),
            p(31, "gemma-3-4b-it", "google/gemma-3-4b-it", gemma3(2560, 34, 8, 4, 256, 10_240)).with_notes(VISION_NOT_COUNTED),
            p(32, "gemma-3-12b-it", "google/gemma-3-12b-it", gemma3(3840, 48, 16, 8, 256, 15_360)).with_notes(VISION_NOT_COUNTED),
            p(33, "gemma-3-27b-it", "google/gemma-3-27b-it", gemma3(5376, 62, 32, 16, 128, 21_504)).with_notes(VISION_NOT_COUNTED),
        ]
    }
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        positions(b, spec, attn, local_rope(spec))
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
    fn local_rope(&self, spec: &ModelSpec) -> bool {
        local_rope(spec)
    }
    /// Eager's two masks; under SDPA the sliding mask once the window is shorter than the keys.
    fn mask_shapes(&self, b: &Builder, spec: &ModelSpec, attn: Attention) -> [Option<(Shape, Dt)>; 2] {
        let eager = attn == Attention::Eager;
        let local = eager || masked(spec.window, b.c.n(Q::S_KV));
        [eager.then(|| mask_shape(attn)), local.then(|| mask_shape(attn))]
    }
    fn embed_scale_buffer(&self) -> bool {
        true
    }
}
