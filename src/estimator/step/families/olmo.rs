//! OLMo (`modeling_olmo.py`): Llama's layer with a LayerNorm without parameters computed in
//! fp32 (`OlmoLayerNorm`), RoPE whose cos/sin stay fp32 (`OlmoRotaryEmbedding.forward` returns
//! them uncast, `apply_rotary_pos_emb` casts q and k back), and, with `clip_qkv`, the q, k, v
//! projections clamped in place. OLMo-2 (`modeling_olmo2.py`) keeps the fp32 RoPE and moves the
//! norms after the sub-layers (`Olmo2RMSNorm`: the weight multiplies the fp32 normalized input),
//! with q/k norms over all heads. OLMo 3 (`modeling_olmo3.py`) is OLMo-2's layer with sliding
//! windows on the layers `layer_types` names (three of every four by default), each layer type
//! with its own fp32 rotary pair and mask.

use super::super::ir::{Builder, Dt, Shape, Tid, S};
use super::common::{
    cache_position, causal_mask, clamp_backward, cos_shape, has_rope, head_proj, mask_shape, masked, rms_norm, rope_pair,
    sliding_window_mask_for, to_heads,
};
use super::common::{AttnW, Kind, MlpW, Norm, Params, Rms, Shared};
use super::llama::{attend_out, decoder_layer, mlp, rope, Core};
use super::modeling::{ConfigFile, Modeling};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Ffn, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{LayerRule, NormKind, WindowKind};
use crate::estimator::model::{Linear, ModelSpec, QkNorm};
use crate::estimator::part::Part;
use crate::estimator::preset_base::{llama, Preset};
use serde_json::{Map, Value};

/// `Olmo2RMSNorm` (the weight multiplies the fp32 normalized input, the mean over the token's
/// row: [`Rms::WeightFirst`]).
const OLMO2_RMS: Rms = Rms::WeightFirst { rows: true };

/// `Olmo2DecoderLayer.forward`: Gemma-2's layer without its pre-norms
/// ([`super::gemma::post_norm_layer`]): the norms follow the sub-layers:
/// ```python
/// hidden_states = residual + self.post_attention_layernorm(self.self_attn(hidden_states))
/// hidden_states = residual + self.post_feedforward_layernorm(self.mlp(hidden_states))
/// ```
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer2(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    // Registration order: self_attn (q, k, v, o, q_norm, k_norm), mlp, post_attention_layernorm,
    // post_feedforward_layernorm.
    let aw = AttnW::new(b, p);
    let mw = MlpW::new(b, p);
    super::gemma::post_norm_layer(
        b,
        p,
        x,
        Norm::Rms(OLMO2_RMS),
        false,
        |b, n| attention(b, &aw, spec, n, sh, attn, false),
        |b, n| mlp(b, &mw, n),
    )
}

/// `tensor.clamp_(min=-c, max=c)` in place: autograd first copies the input (`clone`, what
/// ClampBackward1 keeps: `clamp_backward` needs the values before the clamp); the result is
/// the input's storage. Backward: [`clamp_backward`] with both bounds.
fn clamp_(b: &mut Builder, x: Tid) -> Tid {
    let (shape, dt) = (b.shape(x), b.t(x).dt);
    let old = b.plain("clone", &[x], shape, dt);
    let out = b.view_out(x, shape);
    let bw = clamp_backward(b, x, true);
    b.op("clamp_", "ClampBackward1", &[x, old], &[out], &[S::In(1)], &bw)[0]
}

/// `OlmoAttention.forward`: the projections (clamped with `clip_qkv`), their head views, RoPE
/// on fp32 cos/sin — `q * cos` promotes to fp32, `apply_rotary_pos_emb` returns
/// `q_embed.to(q_type)` — and Llama's attention core and `o_proj`.
fn attention(b: &mut Builder, w: &AttnW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention, clip: bool) -> (Tid, Option<Tid>) {
    let eager = attn == Attention::Eager;
    // OLMo-2: `self.q_norm(self.q_proj(x))`, `self.k_norm(self.k_proj(x))` over all heads.
    let norm = |b: &mut Builder, y: Tid, nw: Option<Tid>, module: &'static str| {
        if spec.qk_norm != QkNorm::Full {
            return y;
        }
        b.module = module;
        b.part = Part::AttentionCore;
        rms_norm(b, y, nw, OLMO2_RMS)
    };
    let q = head_proj(b, x, w.wq, w.bq, Q::A, "self_attn.q_proj", Linear::Q);
    let q = norm(b, q, w.qn, "self_attn.q_norm");
    let k = head_proj(b, x, w.wk, w.bk, Q::KV, "self_attn.k_proj", Linear::K);
    let k = norm(b, k, w.kn, "self_attn.k_norm");
    let v = head_proj(b, x, w.wv, w.bv, Q::KV, "self_attn.v_proj", Linear::V);
    b.module = "self_attn";
    let (q, k, v) = if clip { (clamp_(b, q), clamp_(b, k), clamp_(b, v)) } else { (q, k, v) };
    // The gradients of q and k come back through RoPE's cast in a layout `reshape` must copy;
    // v's (from SDPA, laid out like v) views, except after eager attention's bmm.
    let q = to_heads(b, q, Q::A, true);
    let k = to_heads(b, k, Q::KV, true);
    let v = to_heads(b, v, Q::KV, eager);
    b.part = Part::AttentionCore;
    let (q, k) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) => {
            let (qt, kt) = (b.t(q).dt, b.t(k).dt);
            let q32 = rope(b, q, cos, sin, Q::A);
            let k32 = rope(b, k, cos, sin, Q::KV);
            let qe = b.to_copy(q32, qt);
            let ke = b.to_copy(k32, kt);
            // `return q_embed.to(q_type), k_embed.to(k_type)`: both fp32 locals live to the end.
            for t in [q32, k32, q, k] {
                b.hold(t);
            }
            (qe, ke)
        }
        _ => (q, k),
    };
    attend_out(b, spec, [q, k, v], sh, attn, Core::LLAMA, (w.wo, w.bo))
}

/// `OlmoDecoderLayer.forward`: Llama's pre-norm layer ([`decoder_layer`]) with
/// `OlmoLayerNorm`s and `attention`.
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    let aw = AttnW::new(b, p);
    let mw = MlpW::new(b, p);
    decoder_layer(b, p, x, Norm::LayerNormFp32, |b, n| attention(b, &aw, spec, n, sh, attn, spec.clip_qkv), |b, n| mlp(b, &mw, n))
}

/// `OlmoModel.forward` / `Olmo2Model.forward` after the embedding (also a later pipeline
/// stage's prologue): `position_ids`, the causal mask, and `OlmoRotaryEmbedding.forward`:
/// Llama's, without the final cast (cos and sin `[1, s, d]` fp32 in any recipe).
fn positions(b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
    let pos = cache_position(b);
    let mask = causal_mask(b, pos, attn);
    let (cos, sin) = rope_pair(b, spec, pos, false);
    Shared { cos, sin, pos: Some(pos), mask, ..Shared::default() }
}

/// `Olmo3Model.forward` after the embedding: `position_ids`, one mask per layer type
/// (`create_causal_mask`, `create_sliding_window_causal_mask`) and one fp32 rotary pair per
/// layer type (`self.rotary_emb(hidden_states, position_ids, layer_type)` for each of
/// `set(config.layer_types)`).
fn positions3(b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
    let pos = cache_position(b);
    let mask = causal_mask(b, pos, attn);
    let mask_local = sliding_window_mask_for(b, pos, attn, spec.window);
    let (cos, sin) = rope_pair(b, spec, pos, false);
    let (cos_local, sin_local) = if local_rope(spec) { rope_pair(b, spec, pos, false) } else { (None, None) };
    Shared { cos, sin, pos: Some(pos), mask, mask_local, cos_local, sin_local, ..Shared::default() }
}

/// Whether OLMo 3's sliding layers have a rotary pair of their own: with both sliding and full
/// layers (one pair per layer type).
fn local_rope(spec: &ModelSpec) -> bool {
    let n = spec.window_layers.count(spec.layers);
    n > 0 && n < spec.layers
}

/// OLMo (see the module doc).
pub struct Olmo;
impl ConfigFile for Olmo {
    /// `OlmoConfig`: Llama's keys, the parameterless LayerNorm, `clip_qkv` (a number: q, k and v
    /// are clamped; null: not).
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_keys(f, Ffn::Required, false, 2048)?;
        m.norm = NormKind::Nonparametric;
        m.clip_qkv = f.float("clip_qkv")?.is_some();
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        // Any value clamps (and keeps) the same tensors: OLMo-1.7-7B's.
        const OLMO_CLIP_QKV: f64 = 8.0;
        let Some(mut w) = writer::llama_base("olmo", s, "hidden_act") else { return Vec::new() };
        w.set("intermediate_size", s.ffn).set("attention_bias", s.qkv_bias);
        if s.clip_qkv {
            w.set("clip_qkv", OLMO_CLIP_QKV);
        }
        w.done().into_iter().collect()
    }
}

impl Modeling for Olmo {
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        positions(b, spec, attn)
    }
    /// `OlmoLayerNorm`: no parameters, computed in fp32.
    fn norm(&self) -> Norm {
        Norm::LayerNormFp32
    }
    /// cos and sin stay fp32 (`OlmoRotaryEmbedding.forward` does not cast them).
    fn rope_tables(&self, spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
        has_rope(spec).then(|| (cos_shape(spec), Dt::F32, true))
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
}

/// OLMo-2 (see the module doc).
pub struct Olmo2;
impl ConfigFile for Olmo2 {
    /// `Olmo2Config`: Llama's keys and q/k norms over the whole projections.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_keys(f, Ffn::Required, false, 2048)?;
        m.qk_norm = QkNorm::Full;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::llama_base("olmo2", s, "hidden_act") else { return Vec::new() };
        w.set("intermediate_size", s.ffn).set("attention_bias", s.qkv_bias);
        w.done().into_iter().collect()
    }
}

impl Modeling for Olmo2 {
    fn presets(&self) -> Vec<Preset> {
        // Untied Llama with q/k RMSNorms over all heads, 100,352 vocabulary, 4,096 positions.
        let olmo2 = |hidden, layers, heads, ffn| ModelSpec {
            family: Family::Olmo2,
            qk_norm: QkNorm::Full,
            ..llama(100_352, hidden, layers, heads, heads, ffn, 4096)
        };
        vec![
            Preset::new(34, "olmo-2-1124-7b", "allenai/OLMo-2-1124-7B", "OLMo 2", olmo2(4096, 32, 32, 11_008)),
            Preset::new(35, "olmo-2-1124-13b", "allenai/OLMo-2-1124-13B", "OLMo 2", olmo2(5120, 40, 40, 13_824)),
        ]
    }
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        positions(b, spec, attn)
    }
    fn norm(&self) -> Norm {
        Norm::Rms(OLMO2_RMS)
    }
    /// cos and sin stay fp32 (`OlmoRotaryEmbedding.forward` does not cast them).
    fn rope_tables(&self, spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
        has_rope(spec).then(|| (cos_shape(spec), Dt::F32, true))
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer2(b, p, spec, x, sh, attn)
    }
}

/// OLMo 3 (see the module doc).
pub struct Olmo3;
impl ConfigFile for Olmo3 {
    /// `Olmo3Config` (configuration_olmo3.py): OLMo-2's layout; every size defaults to the
    /// class's; `sliding_window` (4,096) on the layers `layer_types` names as
    /// `sliding_attention`, by default all but every fourth.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = llama(
            f.size("vocab_size", 50_304)?,
            f.size("hidden_size", 4096)?,
            f.size("num_hidden_layers", 32)?,
            f.size("num_attention_heads", 32)?,
            0,
            f.size("intermediate_size", 11_008)?,
            f.uint_or("max_position_embeddings", 2048)?,
        );
        fields::check_layers(m.layers)?;
        m.family = Family::Olmo3;
        m.kv_heads = f.uint_or("num_key_value_heads", m.heads)?;
        m.act = f.activation(&["hidden_act"], crate::estimator::model::Activation::Silu)?;
        m.tied = f.flag("tie_word_embeddings", false)?;
        let bias = f.flag("attention_bias", false)?;
        m.qkv_bias = bias;
        m.o_bias = bias;
        m.qk_norm = QkNorm::Full;
        let default = (LayerRule::AllBut { step: 4, offset: 3 }, WindowKind::Sliding);
        fields::set_window(&mut m, f, "sliding_window", Some(4096), default)?;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::llama_base("olmo3", s, "hidden_act") else { return Vec::new() };
        w.set("intermediate_size", s.ffn).set("attention_bias", s.qkv_bias);
        if s.o_bias != s.qkv_bias || s.qk_norm != QkNorm::Full {
            return Vec::new();
        }
        let types: Vec<&str> =
            (0..s.layers).map(|i| if s.window_layers.contains(i) { "sliding_attention" } else { "full_attention" }).collect();
        w.set("layer_types", types).set("sliding_window", if s.window > 0 { Value::from(s.window) } else { Value::from(4096) });
        w.done().into_iter().collect()
    }
}

impl Modeling for Olmo3 {
    /// OLMo-3-1025-7B (allenai/Olmo-3-1025-7B), from its `config.json`
    /// (`tests/fixtures/hf/olmo-3-1025-7b.json`): 100,278 tokens, 4,096 wide, 32 layers of 32
    /// heads, 11,008 MLP, a 4,096-token window on three of every four layers, 65,536 positions.
    /// 7,298,011,136 parameters (transformers 5.24 on the meta device).
    fn presets(&self) -> Vec<Preset> {
        let m = ModelSpec {
            family: Family::Olmo3,
            qk_norm: QkNorm::Full,
            window_layers: LayerRule::AllBut { step: 4, offset: 3 },
            window: 4096,
            ..llama(100_278, 4096, 32, 32, 32, 11_008, 65_536)
        };
        vec![Preset::new(111, "olmo-3-1025-7b", "allenai/Olmo-3-1025-7B", "OLMo 3", m)]
    }
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        positions3(b, spec, attn)
    }
    fn norm(&self) -> Norm {
        Norm::Rms(OLMO2_RMS)
    }
    /// cos and sin stay fp32 (`Olmo3RotaryEmbedding.forward` does not cast them).
    fn rope_tables(&self, spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
        has_rope(spec).then(|| (cos_shape(spec), Dt::F32, true))
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer2(b, p, spec, x, sh, attn)
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
}
