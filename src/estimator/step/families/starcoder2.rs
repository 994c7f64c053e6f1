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

use super::super::blocks::shapes::{heads, heads_bshd, tok, tok_tp};
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Group, Shape, Split, Tid};
use super::common::Kind;
use super::common::{has_rope, rotary_dims, Params, Shared};
use super::llama;
use super::modeling::Modeling;
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::Attention;
use crate::estimator::model::{Activation, Linear, ModelSpec};
use crate::estimator::step::part::Part;

/// Whether the sliding window materializes SDPA's mask at this sequence length
/// (`_ignore_causal_mask_sdpa`: a local attention size no longer than the keys).
pub fn window_mask(b: &Builder, spec: &ModelSpec) -> bool {
    spec.window > 0 && spec.window_layers.count(spec.layers) > 0 && b.c.n(Q::S_KV) >= spec.window
}

/// `Starcoder2Attention.forward`: Llama's (q, k, v projections with biases, RoPE on the
/// `[b, s, heads, d]` views), the attention core, `o_proj`, then `residual_dropout`.
fn attention(b: &mut Builder, w: &llama::AttnW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let eager = attn == Attention::Eager;
    let masked = !eager && window_mask(b, spec);
    let gqa = b.c.n(Q::KV) != b.c.n(Q::A);
    let proj = |b: &mut Builder, w: Option<Tid>, bias: Option<Tid>, h: Q, module: &'static str, clone_bw: bool, lin: Linear| {
        b.module = module;
        b.part = Part::AttentionInputs;
        let y = match w {
            Some(w) => b.proj(x, w, bias, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(h), Dim::Q(Q::D)], Split::Tp), lin),
            None => x,
        };
        b.module = "self_attn";
        let v = b.view(y, heads_bshd(h), "ViewBackward0", clone_bw);
        b.view(v, heads(h), "TransposeBackward0", false)
    };
    // q's and k's gradients come back through RoPE laid out [b, heads, s, d]: their views copy.
    // v's arrives like v from SDPA's kernel, but [b, heads, s, d] from eager's bmm or from the
    // sum over repeated heads.
    let q = proj(b, w.wq, w.bq, Q::A, "self_attn.q_proj", true, Linear::Q);
    let k = proj(b, w.wk, w.bk, Q::KV, "self_attn.k_proj", true, Linear::K);
    let v = proj(b, w.wv, w.bv, Q::KV, "self_attn.v_proj", eager || (masked && gqa), Linear::V);
    b.part = Part::AttentionCore;
    let (q, k) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) if has_rope(spec) && rotary_dims(spec) == spec.head_dim => {
            let qe = llama::rope(b, q, cos, sin, Q::A);
            let ke = llama::rope(b, k, cos, sin, Q::KV);
            b.hold(q);
            b.hold(k);
            (qe, ke)
        }
        _ => (q, k),
    };
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
    b.part = Part::AttentionInputs;
    b.module = "self_attn.o_proj";
    let out = match w.wo {
        Some(wo) => b.proj(o, wo, w.bo, tok(Q::H), Linear::O),
        None => o,
    };
    b.hold(q);
    b.hold(k);
    b.hold(v);
    b.module = "self_attn";
    b.part = Part::Dropout;
    (b.dropout(out), weights)
}

fn mask_shape() -> Shape {
    Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None)
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
    let [wfc, bfc, wpr, bpr] = w;
    b.part = Part::Mlp;
    b.module = "mlp.c_fc";
    let h = match wfc {
        Some(w) => b.proj(x, w, bfc, tok_tp(Dim::Q(Q::F)), Linear::Up),
        None => x,
    };
    b.module = "mlp.act";
    let a = match spec.act {
        Activation::GeluNew => super::gpt2::gelu_new(b, h),
        Activation::Relu => b.unary("relu", "ReluBackward0", h, Keep::Output, "threshold_backward"),
        _ => b.unary("gelu", "GeluBackward0", h, Keep::Input, "gelu_backward"),
    };
    b.module = "mlp.c_proj";
    let y = match wpr {
        Some(w) => b.proj(a, w, bpr, tok(Q::H), Linear::Down),
        None => a,
    };
    b.module = "mlp";
    b.part = Part::Dropout;
    b.dropout(y)
}

/// `Starcoder2DecoderLayer.forward`: `input_layernorm` → attention → residual →
/// `post_attention_layernorm` → MLP → residual.
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    b.group = Group::All;
    // Registration order: self_attn (q, k, v, o), mlp (c_fc, c_proj), input_layernorm,
    // post_attention_layernorm.
    let aw = llama::AttnW::new(b, p);
    let mw = [
        p.w(b, "layers.*.mlp.up_proj.weight"),
        p.w(b, "layers.*.mlp.up_proj.bias"),
        p.w(b, "layers.*.mlp.down_proj.weight"),
        p.w(b, "layers.*.mlp.down_proj.bias"),
    ];
    let ln1 = (p.w(b, "layers.*.norm.weight"), p.w(b, "layers.*.norm.bias"));
    let ln2 = (p.w(b, "layers.*.norm.weight"), p.w(b, "layers.*.norm.bias"));
    b.module = "input_layernorm";
    b.part = Part::Norms;
    let n1 = b.layer_norm(x, ln1.0, ln1.1);
    let (a, weights) = attention(b, &aw, spec, n1, sh, attn);
    b.hold(n1);
    b.module = "";
    b.part = Part::Norms;
    let h = b.add(x, a);
    b.module = "post_attention_layernorm";
    let n2 = b.layer_norm(h, ln2.0, ln2.1);
    let m = mlp(b, mw, spec, n2);
    b.hold(n2);
    b.module = "";
    b.part = Part::Norms;
    let y = b.add(h, m);
    b.hold(h);
    if let Some(w) = weights {
        b.hold(w);
    }
    y
}

/// `Starcoder2Model.forward` before the layers: the token embedding (its dropout is a no-op
/// at p = 0), `position_ids = arange(s)[None]`, the mask (`create_sliding_window_causal_mask`
/// once the window bites, else `create_causal_mask`), the rotary embedding.
pub fn embed(b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
    // Eager attention always gets the sliding mask (`eager_mask` never skips it); SDPA only once
    // the window bites.
    let windowed = spec.window > 0 && spec.window_layers.count(spec.layers) > 0;
    if !windowed || (attn != Attention::Eager && !window_mask(b, spec)) {
        return super::phi::embed_with_dropout(b, p, spec, ids, attn, false);
    }
    b.part = Part::Embedding;
    b.module = "model.embed_tokens";
    let emb_w = p.w(b, "embed_tokens.weight");
    let x0 = match emb_w {
        Some(w) => llama::embedding(b, ids, w),
        None => b.plain("embedding", &[ids], tok(Q::H), Dt::Resid),
    };
    b.module = "model";
    let s1 = || Shape::new(&[Dim::Q(Q::S)], Split::None);
    let ar = b.plain("arange", &[], s1(), Dt::I64);
    let pos = b.plain("add", &[ar], s1(), Dt::I64);
    b.p.tensors[pos as usize].part = Some(Part::Checkpoints);
    llama::packed_detection(b, pos);
    let mask = sliding_mask(b, attn);
    b.module = "model";
    b.part = Part::Dropout;
    let x = b.dropout(x0);
    b.part = Part::Embedding;
    let (cos, sin) = if has_rope(spec) {
        let (c, s) = llama::rotary(b, spec, pos);
        (Some(c), Some(s))
    } else {
        (None, None)
    };
    // `inputs_embeds` stays bound until the model returns; the layers read the dropped-out copy.
    (
        x,
        Shared {
            cos,
            sin,
            pos: Some(pos),
            mask: Some(mask),
            mask_local: None,
            emb_w: if spec.tied { emb_w } else { None },
            locals: [Some(x0), None],
            cos_local: None,
            sin_local: None,
        },
    )
}

/// `create_sliding_window_causal_mask` → `sdpa_mask` with `sliding_window_causal_mask_function`:
/// the batch, head, kv and query `arange`s; the window term (`kv_idx > q_idx - window`: `sub`,
/// `gt`, and with the padding term `bitwise_and`), the causal term (`le`) and their `and` —
/// a bool `[1, 1, s, s_kv]` that SDPA receives; eager turns it into an additive
/// `[b, 1, s, s_kv]` in the residual dtype (`where(mask, 0, min)`).
fn sliding_mask(b: &mut Builder, attn: Attention) -> Tid {
    let s1 = || Shape::new(&[Dim::Q(Q::S)], Split::None);
    let ba = b.plain("arange", &[], Shape::new(&[Dim::Q(Q::B)], Split::None), Dt::I64);
    let ha = b.plain("arange", &[], Shape::new(&[Dim::N(1)], Split::None), Dt::I64);
    let kv0 = b.plain("arange", &[], s1(), Dt::I64);
    let kv = b.plain("add", &[kv0], s1(), Dt::I64);
    let q0 = b.plain("arange", &[], s1(), Dt::I64);
    let qi = b.plain("add", &[q0], s1(), Dt::I64);
    let one = b.plain("new_ones", &[], Shape::scalar(), Dt::Bool);
    let sub = b.plain("sub", &[qi], s1(), Dt::I64);
    let gt = b.plain("gt", &[kv, sub], mask_shape(), Dt::Bool);
    let win = b.plain("bitwise_and", &[one, gt], mask_shape(), Dt::Bool);
    let le = b.plain("le", &[kv, qi], mask_shape(), Dt::Bool);
    let m = b.plain("bitwise_and", &[win, le], mask_shape(), Dt::Bool);
    b.hold(ba);
    b.hold(ha);
    b.hold(kv);
    b.hold(qi);
    b.p.tensors[m as usize].part = Some(Part::Checkpoints);
    if attn != Attention::Eager {
        return m;
    }
    let zero = b.plain("zeros", &[], Shape::scalar(), Dt::Resid);
    let min = b.plain("scalar_tensor", &[], Shape::scalar(), Dt::Resid);
    let w = b.plain("where", &[m, zero, min], Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None), Dt::Resid);
    b.p.tensors[w as usize].part = Some(Part::Checkpoints);
    w
}

/// StarCoder2 (see the module doc).
pub struct Starcoder2;
impl Modeling for Starcoder2 {
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        embed(b, p, spec, ids, attn)
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
    fn final_norm(&self, b: &mut Builder, p: &Params, _spec: &ModelSpec, x: Tid) -> Tid {
        super::common::final_layer_norm(b, p, "model.norm", x)
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
