//! OPT (`modeling_opt.py`): pre-LN decoder layers (`do_layer_norm_before`) of LayerNorm →
//! attention with biased `q_proj`/`k_proj`/`v_proj`/`out_proj` (queries scaled by `d^-½`
//! right after their projection) → residual → LayerNorm → `fc1` → ReLU → `fc2` → residual, on
//! token rows flattened to `[b·s, h]`; learned positions with an offset of 2 rows, computed from
//! a cumulative sum of an all-ones attention mask; a tied LM head.

use super::super::blocks::shapes::tok;
use super::super::ir::{Builder, Dim, Dt, Group, Shape, Split, Tid};
use super::common::{
    additive_mask, dropout, final_norm, head_proj, lookup, out_proj, plain_mlp, plain_mlp_w, sdpa_mask, set_part, tied, to_heads,
};
use super::common::{AttnW, Kind, Norm, Params, Shared, LAYER_NORM};
use super::llama;
use super::modeling::{ConfigFile, Modeling};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{Activation, Linear, MlpKind, ModelSpec, NormKind, Positions};
use crate::estimator::part::Part;
use serde_json::{Map, Value};

/// Extra rows of OPT's learned position table: `OPTLearnedPositionalEmbedding.offset`.
pub const POSITION_OFFSET: u64 = 2;

/// `OPTAttention.forward`:
/// ```python
/// query_states = self.q_proj(hidden_states) * self.scaling
/// query_states = query_states.view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2)
/// key_states = self.k_proj(hidden_states); value_states = self.v_proj(hidden_states)
/// key_states = key_states.view(…).transpose(1, 2); value_states = value_states.view(…).transpose(1, 2)
/// attn_output, attn_weights = attention_interface(…, scaling=1.0)
/// attn_output = self.out_proj(attn_output.reshape(bsz, tgt_len, -1).contiguous())
/// ```
/// The scaled queries (MulBackward1 keeps nothing) free `q_proj`'s output at once. Returns the
/// output and the eager attention weights.
fn attention(b: &mut Builder, w: &AttnW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let eager = attn == Attention::Eager;
    // OPT has as many k and v heads as queries.
    let q = head_proj(b, x, w.wq, w.bq, Q::A, "self_attn.q_proj", Linear::Q);
    b.module = "self_attn";
    b.part = Part::AttentionCore;
    let q = b.mul_scalar(q);
    let k = head_proj(b, x, w.wk, w.bk, Q::A, "self_attn.k_proj", Linear::K);
    let v = head_proj(b, x, w.wv, w.bv, Q::A, "self_attn.v_proj", Linear::V);
    b.module = "self_attn";
    b.part = Part::AttentionCore;
    // Eager's bmm gradients come back laid out [b, a, s, d] (k's [b, a, d, s]): the head views
    // of q and v copy them, and `k_proj`'s `_unsafe_view` back to [b, s, h] copies k's (the
    // same bytes at the same moment; counted here). SDPA's CPU kernel returns them like its
    // inputs.
    let qt = to_heads(b, q, Q::A, eager);
    let kt = to_heads(b, k, Q::KV, eager);
    let vt = to_heads(b, v, Q::KV, eager);
    let (o, weights, _) = llama::attend(b, spec, [qt, kt, vt], sh.mask, attn, llama::Core::LLAMA);
    let out = out_proj(b, o, w.wo, w.bo, "self_attn.out_proj");
    for t in [q, k, v] {
        b.hold(t);
    }
    (out, weights)
}

/// `OPTDecoderLayer.forward` with `do_layer_norm_before` (every OPT but 350m):
/// ```python
/// residual = hidden_states
/// hidden_states = self.self_attn_layer_norm(hidden_states)
/// hidden_states, _ = self.self_attn(hidden_states=hidden_states, …)
/// hidden_states = residual + dropout(hidden_states)
/// hidden_states = hidden_states.reshape(-1, hidden_states.size(-1)); residual = hidden_states
/// hidden_states = self.fc2(self.activation_fn(self.fc1(self.final_layer_norm(hidden_states))))
/// hidden_states = (residual + dropout(hidden_states)).view(hidden_states_shape)
/// ```
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    b.group = Group::All;
    // Registration order: self_attn (k, v, q, out_proj), self_attn_layer_norm, fc1, fc2,
    // final_layer_norm.
    let aw = AttnW::new(b, p);
    let ln1 = Norm::LayerNorm.weights(b, p, LAYER_NORM);
    let fc = plain_mlp_w(b, p);
    let ln2 = Norm::LayerNorm.weights(b, p, LAYER_NORM);
    let n1 = Norm::LayerNorm.call(b, "self_attn_layer_norm", x, ln1);
    let (a, weights) = attention(b, &aw, spec, n1, sh, attn);
    b.hold(n1);
    let a = dropout(b, "", a);
    let h = b.add(x, a);
    let n2 = Norm::LayerNorm.call(b, "final_layer_norm", h, ln2);
    let m = plain_mlp(b, fc, n2, spec.act, ["fc1", "activation_fn", "fc2"]);
    let m = dropout(b, "", m);
    let y = b.add(h, m);
    for t in [n2, h].into_iter().chain(weights) {
        b.hold(t);
    }
    y
}

/// OPT (`modeling_opt.py`): learned positions with an offset of 2, pre-LayerNorm layers with a
/// ReLU MLP, `final_layer_norm`.
pub struct Opt;
impl ConfigFile for Opt {
    /// `OPTConfig`: `ffn_dim`, `activation_function` (ReLU), LayerNorm per `layer_norm_elementwise_affine`/`enable_bias`, learned positions with 2 extra rows, `word_embed_proj_dim`, post-norm (`do_layer_norm_before: false`) without a final norm.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::with_plain_sizes(f)?;
        m.kv_heads = m.heads;
        m.head_dim = m.hidden / m.heads.max(1);
        m.ffn = f.required(&["ffn_dim"])?;
        m.mlp = MlpKind::Plain;
        m.act = f.activation(&["activation_function"], Activation::Relu)?;
        let affine = f.flag("layer_norm_elementwise_affine", true)?;
        let bias = f.flag("enable_bias", true)?;
        m.norm = match (affine, bias) {
            (false, _) => NormKind::Nonparametric,
            (true, true) => NormKind::Layernorm,
            (true, false) => NormKind::LayernormNoBias,
        };
        m.qkv_bias = bias;
        m.o_bias = bias;
        m.mlp_bias = bias;
        m.tied = f.flag("tie_word_embeddings", true)?;
        m.positions = Positions::Learned;
        m.max_pos = f.uint_or("max_position_embeddings", 2048)?;
        // OPTLearnedPositionalEmbedding keeps 2 extra rows (modeling_opt.py, offset = 2).
        m.pos_offset = 2;
        m.rotary_pct = 0;
        let proj = f.uint_or("word_embed_proj_dim", m.hidden)?;
        m.embed_proj = if proj != m.hidden { proj } else { 0 };
        // Post-norm OPT (350m) removes the decoder's final layer norm.
        m.final_norm = f.flag("do_layer_norm_before", true)? && !f.flag("_remove_final_layer_norm", false)?;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(act) = writer::act_name(s.act) else { return Vec::new() };
        let (affine, bias) = match s.norm {
            NormKind::Nonparametric => (false, s.qkv_bias),
            NormKind::Layernorm => (true, true),
            NormKind::LayernormNoBias => (true, false),
            NormKind::Rmsnorm | NormKind::RmsnormGemma => return Vec::new(),
        };
        writer::Writer::new("opt")
            .set("vocab_size", s.vocab)
            .set("hidden_size", s.hidden)
            .set("num_hidden_layers", s.layers)
            .set("num_attention_heads", s.heads)
            .set("ffn_dim", s.ffn)
            .set("activation_function", act)
            .set("layer_norm_elementwise_affine", affine)
            .set("enable_bias", bias)
            .set("tie_word_embeddings", s.tied)
            .set("max_position_embeddings", s.max_pos)
            .set("word_embed_proj_dim", if s.embed_proj > 0 { s.embed_proj } else { s.hidden })
            // Pre-norm OPT has a final layer norm; post-norm OPT (350m) has none.
            .set("do_layer_norm_before", s.final_norm)
            .done()
            .into_iter()
            .collect()
    }
}

impl Modeling for Opt {
    /// `OPTDecoder.forward` before the layers:
    /// ```python
    /// inputs_embeds = self.embed_tokens(input_ids)
    /// position_attention_mask = torch.ones(b, s)                       # fp32
    /// position_ids = torch.cumsum(position_attention_mask, dim=1)
    /// position_ids = (position_ids * position_attention_mask - 1).long()
    /// causal_mask = create_causal_mask(…)                                # eager: [b, 1, s, s]
    /// pos_embeds = self.embed_positions(…, position_ids=position_ids)   # embedding(position_ids + 2)
    /// hidden_states = inputs_embeds + pos_embeds
    /// ```
    /// `inputs_embeds`, `pos_embeds`, `position_ids` and the ones mask stay bound until the decoder
    /// returns; the offset ids are kept by the position embedding's node.
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        b.part = Part::Embedding;
        b.module = "model.decoder.embed_tokens";
        let wte = p.w(b, "embed_tokens.weight");
        let wpe = p.w(b, "embed_positions.weight");
        let te = lookup(b, ids, wte, tok(Q::H));
        b.module = "model.decoder";
        let bs = || Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None);
        let ones = b.plain("ones", &[], bs(), Dt::F32);
        let cs = b.plain("cumsum", &[ones], bs(), Dt::F32);
        let m = b.plain("mul", &[cs, ones], bs(), Dt::F32);
        let sub = b.plain("sub", &[m], bs(), Dt::F32);
        let pos = b.plain("_to_copy", &[sub], bs(), Dt::I64);
        b.hold(cs);
        // `create_causal_mask` without position ids (no packed-sequence check).
        let mask = (attn == Attention::Eager).then(|| {
            let m = sdpa_mask(b, false);
            additive_mask(b, m)
        });
        b.module = "model.decoder.embed_positions";
        let off = b.plain("add", &[pos], bs(), Dt::I64);
        let pe = lookup(b, off, wpe, tok(Q::H));
        b.module = "model.decoder";
        let x0 = b.add(te, pe);
        for t in [pos, ones] {
            set_part(b, t, Part::Embedding);
        }
        // `position_ids` is passed to every layer (which ignores it); the all-ones
        // `position_attention_mask`, a local of the decoder's forward like the others, sits in the
        // one slot no OPT layer reads.
        (
            x0,
            Shared {
                pos: Some(pos),
                mask,
                mask_local: Some(ones),
                emb_w: tied(spec, wte),
                locals: [Some(te), Some(pe)],
                ..Shared::default()
            },
        )
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
    fn final_norm(&self, b: &mut Builder, p: &Params, _spec: &ModelSpec, x: Tid) -> Tid {
        final_norm(b, p, "model.decoder.final_layer_norm", Norm::LayerNorm, x)
    }
    fn x0_is_local(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::hf;
    use serde_json::json;

    fn spec(extra: serde_json::Value) -> ModelSpec {
        let mut v = json!({
            "model_type": "opt", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "ffn_dim": 176, "vocab_size": 1000, "max_position_embeddings": 512, "word_embed_proj_dim": 64
        });
        for (k, x) in extra.as_object().expect("an object") {
            v[k] = x.clone();
        }
        hf::import_value(&v).expect("an OPT config imports").spec
    }

    #[test]
    fn pre_layernorm_opt_has_its_own_layer_and_is_estimated() {
        let s = spec(json!({}));
        assert_eq!(s.pos_offset, POSITION_OFFSET);
        assert_eq!(crate::estimator::unmodelled_feature(&s), None);
    }

    #[test]
    fn opt_350m_post_layernorm_layout_is_refused_rather_than_approximated() {
        // OPT-350m: word_embed_proj_dim 512 against hidden 1024, do_layer_norm_before false.
        let s = spec(json!({"word_embed_proj_dim": 32, "do_layer_norm_before": false}));
        assert_eq!(crate::estimator::unmodelled_feature(&s), Some("OPT's post-LayerNorm layout (OPT-350m)"));
        let post = spec(json!({"do_layer_norm_before": false}));
        assert_eq!(crate::estimator::unmodelled_feature(&post), Some("OPT's post-LayerNorm layout (OPT-350m)"));
    }
}
