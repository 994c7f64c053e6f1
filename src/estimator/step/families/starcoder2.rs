//! StarCoder2 (`modeling_starcoder2.py`): Llama's layer with biased LayerNorms
//! (`input_layernorm`, `post_attention_layernorm`), biased q/k/v/o projections, a plain MLP
//! `c_proj(act(c_fc(x)))` with `gelu_pytorch_tanh`, residual dropouts, and a sliding window
//! on every layer (`create_sliding_window_causal_mask`).
//!
//! The window changes what SDPA runs: once the sequence reaches the window
//! (`masking_utils._ignore_causal_mask_sdpa`: `kv_length >= local_attention_size`) the mask
//! is materialized as a bool `[1, 1, s, s_kv]`, so `sdpa_attention_forward` repeats k and v to
//! `a` heads itself (`use_gqa_in_sdpa` is false with a mask) and the CPU kernel converts the
//! bool mask to an additive one in q's dtype (`where`, `[b, 1, s, s_kv]`), which its node keeps.

use super::super::ir::{Builder, Dim, Dt, Shape, Split, Tid};
use super::common::{
    cache_position, dropout, out_proj, plain_mlp, plain_mlp_w, qkv, rope_pair, sliding_window_mask, tied, token_embedding,
};
use super::common::{AttnW, Kind, Norm, Params, Shared};
use super::llama;
use super::modeling::{ConfigFile, Modeling};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{Activation, LayerRule, MlpKind, ModelSpec, NormKind, WindowKind};
use crate::estimator::part::Part;
use serde_json::{Map, Value};

/// Whether the sliding window materializes SDPA's mask at this sequence length
/// (`_ignore_causal_mask_sdpa`: a local attention size no longer than the keys).
pub fn window_mask(b: &Builder, spec: &ModelSpec) -> bool {
    spec.window > 0 && spec.window_layers.count(spec.layers) > 0 && b.c.n(Q::S_KV) >= spec.window
}

/// `Starcoder2Attention.forward`: Llama's (q, k, v projections with biases, RoPE on the
/// `[b, s, heads, d]` views), the attention core, `o_proj`, then `residual_dropout`.
fn attention(b: &mut Builder, w: &AttnW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let eager = attn == Attention::Eager;
    let masked = !eager && window_mask(b, spec);
    let gqa = b.c.n(Q::KV) != b.c.n(Q::A);
    // q's and k's gradients come back through RoPE laid out [b, heads, s, d]: their views copy.
    // v's arrives like v from SDPA's kernel, but [b, heads, s, d] from eager's bmm or from the
    // sum over repeated heads.
    let (q, k, v) = qkv(b, w, x, [true, true, eager || (masked && gqa)]);
    b.part = Part::AttentionCore;
    let (q, k) = llama::rope_qk(b, q, k, llama::full_rope(spec, sh));
    b.module = "self_attn";
    let (region, q, k, v) = llama::selective_begin(b, q, k, v);
    let (o, weights) = if eager {
        llama::eager_core(b, spec, q, k, v, sh.mask)
    } else if let Some(mask) = sh.mask.filter(|_| masked && (!b.dropout || b.c.cuda)) {
        (sdpa_masked(b, q, k, v, mask), None)
    } else {
        (llama::sdpa_core(b, q, k, v), None)
    };
    llama::selective_end(b, region);
    let out = out_proj(b, o, w.wo, w.bo, "self_attn.o_proj");
    b.hold(q);
    b.hold(k);
    b.hold(v);
    (dropout(b, "self_attn", out), weights)
}

/// `sdpa_attention_forward` with a materialized bool mask: `repeat_kv` on k and v (a copy
/// each when heads are grouped), then `F.scaled_dot_product_attention(q, k, v, attn_mask)`.
/// The CPU flash kernel first turns the bool mask into an additive one
/// (`convert_boolean_attn_mask`: `where(mask, 0, -inf)`, `[b, 1, s, s_kv]` in q's dtype) and
/// keeps it with q, k, v, the output and the log-sum-exp; backward allocates dq, dk, dv.
pub fn sdpa_masked(b: &mut Builder, q: Tid, k: Tid, v: Tid, mask: Tid) -> Tid {
    let gqa = b.c.n(Q::KV) != b.c.n(Q::A);
    let (k, v) = if gqa { (llama::repeat_kv(b, k), llama::repeat_kv(b, v)) } else { (k, v) };
    llama::sdpa_bool_mask(b, q, k, v, mask, mask_build())
}

/// Starcoder2's (and Falcon's) additive mask: `[b, 1, s, s_kv]`, built by SDPA after autocast.
pub fn mask_build() -> llama::MaskBuild {
    let shape = Shape::new(&[Dim::Q(Q::B), Dim::N(1), Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None);
    llama::MaskBuild { shape, before_autocast: false, hold_kv: false }
}

/// `Starcoder2MLP.forward`: `c_proj(act(c_fc(x)))`, then `residual_dropout`. The tanh GELU
/// (`F.gelu(approximate="tanh")`, GeluBackward0) keeps its input.
fn mlp(b: &mut Builder, w: [Option<Tid>; 4], spec: &ModelSpec, x: Tid) -> Tid {
    let y = plain_mlp(b, w, x, spec.act, ["mlp.c_fc", "mlp.act", "mlp.c_proj"]);
    dropout(b, "mlp", y)
}

/// `Starcoder2DecoderLayer.forward`: Llama's ([`llama::decoder_layer`]) with LayerNorms.
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    // Registration order: self_attn (q, k, v, o), mlp (c_fc, c_proj), input_layernorm,
    // post_attention_layernorm.
    let aw = AttnW::new(b, p);
    let mw = plain_mlp_w(b, p);
    llama::decoder_layer(b, p, x, Norm::LayerNorm, |b, n| attention(b, &aw, spec, n, sh, attn), |b, n| mlp(b, mw, spec, n))
}

/// StarCoder2 (see the module doc).
pub struct Starcoder2;
impl ConfigFile for Starcoder2 {
    /// `Starcoder2Config`: LayerNorm, `use_bias`, a plain MLP, `sliding_window` on every layer (null: none).
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::with_plain_sizes(f)?;
        m.kv_heads = f.uint_or("num_key_value_heads", 2)?;
        m.head_dim = m.hidden / m.heads.max(1);
        m.ffn = f.required(&["intermediate_size"])?;
        m.mlp = MlpKind::Plain;
        m.act = f.activation(&["hidden_act"], Activation::GeluTanh)?;
        m.norm = NormKind::Layernorm;
        let bias = f.flag("use_bias", true)?;
        m.qkv_bias = bias;
        m.o_bias = bias;
        m.mlp_bias = bias;
        m.tied = f.flag("tie_word_embeddings", true)?;
        m.max_pos = f.uint_or("max_position_embeddings", 4096)?;
        // Starcoder2Attention passes `config.sliding_window` to every layer (null: none).
        fields::set_window(&mut m, f, "sliding_window", None, (LayerRule::All, WindowKind::Sliding))?;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::plain_base("starcoder2", s, true) else { return Vec::new() };
        w.set("use_bias", s.qkv_bias)
            // Every layer attends through `sliding_window` (null: none).
            .set("sliding_window", if s.window_layers == LayerRule::All && s.window > 0 { Value::from(s.window) } else { Value::Null })
            .done()
            .into_iter()
            .collect()
    }
}

impl Modeling for Starcoder2 {
    /// `Starcoder2Model.forward` before the layers: the token embedding (its dropout is a no-op
    /// at p = 0), `position_ids = arange(s)[None]`, the mask (`create_sliding_window_causal_mask`
    /// once the window bites, else `create_causal_mask`), the rotary embedding.
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        // Eager attention always gets the sliding mask (`eager_mask` never skips it); SDPA only once
        // the window bites.
        let windowed = spec.window > 0 && spec.window_layers.count(spec.layers) > 0;
        if !windowed || (attn != Attention::Eager && !window_mask(b, spec)) {
            return super::phi::embed_with_dropout(b, p, spec, ids, attn, false);
        }
        let (x0, emb_w) = token_embedding(b, p, ids, "model.embed_tokens");
        b.module = "model";
        let pos = cache_position(b);
        let mask = sliding_window_mask(b, pos, attn);
        let x = dropout(b, "model", x0);
        b.part = Part::Embedding;
        let (cos, sin) = rope_pair(b, spec, pos, true);
        // `inputs_embeds` stays bound until the model returns; the layers read the dropped-out copy.
        (x, Shared { cos, sin, pos: Some(pos), mask: Some(mask), emb_w: tied(spec, emb_w), locals: [Some(x0), None], ..Shared::default() })
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
    fn norm(&self) -> Norm {
        Norm::LayerNorm
    }
    /// Eager's mask; SDPA's bool mask once the window bites.
    fn mask_shapes(&self, b: &Builder, spec: &ModelSpec, attn: Attention) -> [Option<(Shape, Dt)>; 2] {
        let mask = attn == Attention::Eager || window_mask(b, spec);
        [mask.then(|| super::common::mask_shape(attn)), None]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::hf;
    use crate::estimator::model::LayerRule;
    use serde_json::json;

    fn spec(window: serde_json::Value) -> ModelSpec {
        hf::import_value(&json!({
            "model_type": "starcoder2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 1000, "sliding_window": window
        }))
        .expect("a starcoder2 config imports")
        .spec
    }

    #[test]
    fn the_sliding_window_reaches_every_layer_and_a_null_one_none() {
        let s = spec(json!(4096));
        assert_eq!((s.window, s.window_layers.clone()), (4096, LayerRule::All));
        let none = spec(json!(null));
        assert_eq!((none.window, none.window_layers), (0, LayerRule::None));
    }

    #[test]
    fn the_window_exports_as_it_was_imported() {
        let s = spec(json!(48));
        let exported = crate::estimator::hf_export::export(&s).expect("exports");
        assert_eq!(exported.model_type, "starcoder2");
        assert_eq!(exported.config["sliding_window"], json!(48));
    }
}
