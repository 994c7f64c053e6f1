//! OPT (`modeling_opt.py`): pre-LN decoder layers (`do_layer_norm_before`) of LayerNorm →
//! attention with biased `q_proj`/`k_proj`/`v_proj`/`out_proj` (queries scaled by `d^-½`
//! right after their projection) → residual → LayerNorm → `fc1` → ReLU → `fc2` → residual, on
//! token rows flattened to `[b·s, h]`; learned positions with an offset of 2 rows, computed from
//! a cumulative sum of an all-ones attention mask; a tied LM head.

use super::super::blocks::shapes::{heads, heads_bshd, tok};
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Group, Shape, Split, Tid};
use super::common::Kind;
use super::common::{Params, Shared};
use super::modeling::Modeling;
use super::{gpt2, llama};
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::Attention;
use crate::estimator::model::{Activation, Linear, ModelSpec};
use crate::estimator::step::part::Part;

/// Extra rows of OPT's learned position table: `OPTLearnedPositionalEmbedding.offset`.
pub const POSITION_OFFSET: u64 = 2;

fn heads4(h: Q) -> Shape {
    Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(h), Dim::Q(Q::D)], Split::Tp)
}

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
fn attention(b: &mut Builder, w: &llama::AttnW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let eager = attn == Attention::Eager;
    b.part = Part::AttentionInputs;
    let proj = |b: &mut Builder, w: Option<Tid>, bias: Option<Tid>, module: &'static str, lin: Linear| {
        b.module = module;
        match w {
            Some(w) => b.proj(x, w, bias, heads4(Q::A), lin),
            None => x,
        }
    };
    let q = proj(b, w.wq, w.bq, "self_attn.q_proj", Linear::Q);
    b.module = "self_attn";
    b.part = Part::AttentionCore;
    let q = b.mul_scalar(q);
    b.part = Part::AttentionInputs;
    let k = proj(b, w.wk, w.bk, "self_attn.k_proj", Linear::K);
    let v = proj(b, w.wv, w.bv, "self_attn.v_proj", Linear::V);
    b.module = "self_attn";
    b.part = Part::AttentionCore;
    // Eager's bmm gradients come back laid out [b, a, s, d] (k's [b, a, d, s]): the head views
    // of q and v copy them, and `k_proj`'s `_unsafe_view` back to [b, s, h] copies k's (the
    // same bytes at the same moment; counted here). SDPA's CPU kernel returns them like its
    // inputs.
    let t = |b: &mut Builder, x: Tid, h: Q, clone_bw: bool| {
        let xv = b.view(x, heads_bshd(h), "ViewBackward0", clone_bw);
        b.view(xv, heads(h), "TransposeBackward0", false)
    };
    let qt = t(b, q, Q::A, eager);
    let kt = t(b, k, Q::KV, eager);
    let vt = t(b, v, Q::KV, eager);
    let (region, qt, kt, vt) = llama::selective_begin(b, qt, kt, vt);
    let (o, weights) = if eager { llama::eager_core(b, spec, qt, kt, vt, sh.mask) } else { (llama::sdpa_core(b, qt, kt, vt), None) };
    llama::selective_end(b, region);
    b.part = Part::AttentionInputs;
    b.module = "self_attn.out_proj";
    let out = match w.wo {
        Some(wo) => b.proj(o, wo, w.bo, tok(Q::H), Linear::O),
        None => o,
    };
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
    let aw = llama::AttnW::new(b, p);
    let ln1 = (p.w(b, "layers.*.norm.weight"), p.w(b, "layers.*.norm.bias"));
    let fc1 = (p.w(b, "layers.*.mlp.up_proj.weight"), p.w(b, "layers.*.mlp.up_proj.bias"));
    let fc2 = (p.w(b, "layers.*.mlp.down_proj.weight"), p.w(b, "layers.*.mlp.down_proj.bias"));
    let ln2 = (p.w(b, "layers.*.norm.weight"), p.w(b, "layers.*.norm.bias"));
    b.module = "self_attn_layer_norm";
    b.part = Part::Norms;
    let n1 = b.layer_norm(x, ln1.0, ln1.1);
    let (a, weights) = attention(b, &aw, spec, n1, sh, attn);
    b.hold(n1);
    b.module = "";
    b.part = Part::Dropout;
    let a = b.dropout(a);
    b.part = Part::Norms;
    let h = b.add(x, a);
    b.module = "final_layer_norm";
    let n2 = b.layer_norm(h, ln2.0, ln2.1);
    b.part = Part::Mlp;
    b.module = "fc1";
    let f = match fc1.0 {
        Some(w) => b.proj(n2, w, fc1.1, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::F)], Split::Tp), Linear::Up),
        None => n2,
    };
    b.module = "activation_fn";
    let r = activation(b, spec, f);
    b.module = "fc2";
    let m = match fc2.0 {
        Some(w) => b.proj(r, w, fc2.1, tok(Q::H), Linear::Down),
        None => r,
    };
    b.module = "";
    b.part = Part::Dropout;
    let m = b.dropout(m);
    b.part = Part::Norms;
    let y = b.add(h, m);
    b.hold(n2);
    b.hold(h);
    if let Some(w) = weights {
        b.hold(w);
    }
    y
}

/// `ACT2FN[config.activation_function]`: ReLU (OPT's) keeps its result (ReluBackward0,
/// `threshold_backward`); others as GPT-2's `gelu_new` or `F.gelu`.
fn activation(b: &mut Builder, spec: &ModelSpec, x: Tid) -> Tid {
    match spec.act {
        Activation::GeluNew => gpt2::gelu_new(b, x),
        Activation::Relu => b.unary("relu", "ReluBackward0", x, Keep::Output, "threshold_backward"),
        _ => b.unary("gelu", "GeluBackward0", x, Keep::Input, "gelu_backward"),
    }
}

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
pub fn embed(b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
    b.part = Part::Embedding;
    b.module = "model.decoder.embed_tokens";
    let wte = p.w(b, "embed_tokens.weight");
    let wpe = p.w(b, "embed_positions.weight");
    let te = match wte {
        Some(w) => llama::embedding(b, ids, w),
        None => b.plain("embedding", &[ids], tok(Q::H), Dt::Resid),
    };
    b.module = "model.decoder";
    let bs = || Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None);
    let ones = b.plain("ones", &[], bs(), Dt::F32);
    let cs = b.plain("cumsum", &[ones], bs(), Dt::F32);
    let m = b.plain("mul", &[cs, ones], bs(), Dt::F32);
    let sub = b.plain("sub", &[m], bs(), Dt::F32);
    let pos = b.plain("_to_copy", &[sub], bs(), Dt::I64);
    b.hold(cs);
    let mask = if attn == Attention::Eager { eager_mask(b) } else { None };
    b.module = "model.decoder.embed_positions";
    let off = b.plain("add", &[pos], bs(), Dt::I64);
    let pe = match wpe {
        Some(w) => {
            use super::super::ir::{B, S};
            let rg = b.rg(w);
            let out = b.out(tok(Q::H), Dt::Resid, rg);
            let g = b.grad_bytes(w);
            let dtype = b.t(w).dtype;
            let bw: &[B] =
                if rg { &[B::Alloc { bytes: g, dtype, op: "embedding_dense_backward" }, B::Grad { input: 1, temp: 0 }] } else { &[] };
            b.op("embedding", "EmbeddingBackward0", &[off, w], &[out], &[S::In(0)], bw)[0]
        }
        None => b.plain("embedding", &[off], tok(Q::H), Dt::Resid),
    };
    b.module = "model.decoder";
    let x0 = b.add(te, pe);
    for t in [pos, ones] {
        b.p.tensors[t as usize].part = Some(Part::Embedding);
    }
    (
        x0,
        Shared {
            cos: None,
            sin: None,
            // `position_ids` is passed to every layer (which ignores it).
            pos: Some(pos),
            mask,
            // The all-ones `position_attention_mask`: a local of the decoder's forward like the
            // others, in the one slot no OPT layer reads.
            mask_local: Some(ones),
            emb_w: if spec.tied { wte } else { None },
            locals: [Some(te), Some(pe)],
            cos_local: None,
            sin_local: None,
        },
    )
}

/// `create_causal_mask` for eager attention without position ids (no packed-sequence check):
/// the batch, head, kv and query `arange`s, `le`, then `where(le, 0, min)` `[b, 1, s, s_kv]`.
fn eager_mask(b: &mut Builder) -> Option<Tid> {
    let s1 = || Shape::new(&[Dim::Q(Q::S)], Split::None);
    let ba = b.plain("arange", &[], Shape::new(&[Dim::Q(Q::B)], Split::None), Dt::I64);
    let ha = b.plain("arange", &[], Shape::new(&[Dim::N(1)], Split::None), Dt::I64);
    let kv0 = b.plain("arange", &[], s1(), Dt::I64);
    let kv = b.plain("add", &[kv0], s1(), Dt::I64);
    let q0 = b.plain("arange", &[], s1(), Dt::I64);
    let qi = b.plain("add", &[q0], s1(), Dt::I64);
    let le = b.plain("le", &[kv, qi], Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None), Dt::Bool);
    b.hold(ba);
    b.hold(ha);
    b.hold(kv);
    b.hold(qi);
    let zero = b.plain("zeros", &[], Shape::scalar(), Dt::Resid);
    let min = b.plain("scalar_tensor", &[], Shape::scalar(), Dt::Resid);
    let m = b.plain("where", &[le, zero, min], Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None), Dt::Resid);
    b.p.tensors[m as usize].part = Some(Part::Checkpoints);
    Some(m)
}

/// `model.decoder.final_layer_norm`.
pub fn final_norm(b: &mut Builder, p: &Params, x: Tid) -> Tid {
    b.module = "model.decoder.final_layer_norm";
    b.part = Part::Head;
    let w = p.w(b, "norm.weight");
    let bias = p.w(b, "norm.bias");
    b.layer_norm(x, w, bias)
}

/// OPT (`modeling_opt.py`): learned positions with an offset of 2, pre-LayerNorm layers with a
/// ReLU MLP, `final_layer_norm`.
pub struct Opt;
impl Modeling for Opt {
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        embed(b, p, spec, ids, attn)
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
    fn final_norm(&self, b: &mut Builder, p: &Params, _spec: &ModelSpec, x: Tid) -> Tid {
        final_norm(b, p, x)
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
