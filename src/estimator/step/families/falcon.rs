//! Falcon (`modeling_falcon.py`): a fused, bias-free `query_key_value` (`FalconLinear`:
//! `input @ weight.T`) split by `FalconAttention._split_heads`, RoPE, SDPA with the causal mask
//! always materialized (`create_causal_mask(…, allow_is_causal_skip=False)`), `dense`, and a
//! parallel block (the MLP reads `ln_mlp`'s output, or the shared `input_layernorm`'s) whose
//! outputs join the residual through `mlp_output += attention_output` and `dropout_add`; the
//! pre-2023 sequential layout (`parallel_attn=False`) runs `post_attention_layernorm` on the
//! attention residual. ALiBi (`alibi=True`) is not built here: its layers run the rotary path.
//!
//! The architecture flags are not kept by the importer; they follow from the spec:
//! - `new_decoder_architecture` (Falcon-40B/180B/11B: grouped q/k/v per kv head, `num_kv_heads`,
//!   1 or 2 norms): a parallel block with two norms, or with one norm and kv heads other than 1;
//! - otherwise the original layout: multi-query (`multi_query`, one kv head) or one k and v per
//!   head, parallel with one norm or sequential with two.

use super::super::blocks::shapes::{heads, heads_bshd, scores, tok};
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Group, Shape, Split, Tid, B, S};
use super::common::{
    cache_position, causal_mask, final_norm, fused_attn_w, fused_qkv, has_rope, mask_shape, packed_detection, plain_mlp_w, plain_mlp_with,
    rope_pair, sdpa_mask,
};
use super::common::{dropout, set_part, tied, token_embedding, Kind, Norm, NormW, Params, Shared, LAYER_NORM};
use super::modeling::{ConfigFile, Modeling};
use super::{llama, starcoder2};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{Activation, Linear, MlpKind, ModelSpec, NormKind, Positions};
use crate::estimator::part::Part;
use serde_json::{Map, Value};

/// `config.new_decoder_architecture`, as the spec shows it (see the module doc).
pub fn new_arch(spec: &ModelSpec) -> bool {
    spec.parallel && (spec.layer_norms == 2 || spec.kv_heads != 1)
}

/// `FalconLinear.forward`: `hidden_states = input @ self.weight.T` (an `mm` on the flattened
/// rows), then `hidden_states + self.bias` as a separate broadcast `add` when there is a bias.
fn falcon_linear(b: &mut Builder, x: Tid, w: Option<Tid>, bias: Option<Tid>, shape: Shape, lin: Linear) -> Tid {
    let Some(w) = w else { return x };
    let y = b.proj(x, w, None, shape, lin);
    match bias {
        Some(bb) => b.add(y, bb),
        None => y,
    }
}

/// `FalconAttention._split_heads` and the head layout of `forward` (ALiBi off):
/// ```python
/// # new_decoder_architecture
/// qkv = fused_qkv.view(batch, seq_len, -1, self.num_heads // self.num_kv_heads + 2, self.head_dim)
/// query = qkv[:, :, :, :-2]; key = qkv[:, :, :, [-2]]; value = qkv[:, :, :, [-1]]
/// key = torch.broadcast_to(key, query.shape); value = torch.broadcast_to(value, query.shape)
/// query, key, value = [x.flatten(2, 3) for x in (query, key, value)]
/// # multi_query
/// fused_qkv = fused_qkv.view(batch_size, seq_length, self.num_heads + 2, self.head_dim)
/// return fused_qkv[..., :-2, :], fused_qkv[..., [-2], :], fused_qkv[..., [-1], :]
/// # then
/// query_layer = query_layer.transpose(1, 2).reshape(batch_size, self.num_heads, query_length, self.head_dim)
/// ```
/// The list indices (`[-2]`, `[-1]`: two int64 `[1]`) copy k and v (IndexBackward0: `new_zeros`
/// and `index_put` of the whole projection in backward); q is a slice (SliceBackward0). In the
/// new layout `flatten` copies q (a strided slice) and the broadcast k and v once the kv heads
/// are grouped (ExpandBackward0 sums them back); they then carry `a` heads.
fn split_heads(b: &mut Builder, spec: &ModelSpec, fused: Tid) -> (Tid, Tid, Tid) {
    let idx = |b: &mut Builder| b.plain("lift_fresh", &[], Shape::new(&[Dim::N(1)], Split::None), Dt::I64);
    if new_arch(spec) {
        let grouped = b.c.n(Q::KV) != b.c.n(Q::A);
        let q = b.slice(fused, heads_bshd(Q::A));
        let ik = idx(b);
        let k = b.index(fused, ik, heads_bshd(Q::KV));
        let iv = idx(b);
        let v = b.index(fused, iv, heads_bshd(Q::KV));
        if !grouped {
            let t = |b: &mut Builder, x: Tid| b.view(x, heads(Q::A), "TransposeBackward0", false);
            return (t(b, q), t(b, k), t(b, v));
        }
        let qc = b.copy(q, heads_bshd(Q::A));
        let kc = llama::repeat_kv(b, k);
        let vc = llama::repeat_kv(b, v);
        let t = |b: &mut Builder, x: Tid| b.view(x, heads(Q::A), "TransposeBackward0", false);
        (t(b, qc), t(b, kc), t(b, vc))
    } else if spec.kv_heads == 1 {
        let q = b.slice(fused, heads_bshd(Q::A));
        let ik = idx(b);
        let k = b.index(fused, ik, heads_bshd(Q::KV));
        let iv = idx(b);
        let v = b.index(fused, iv, heads_bshd(Q::KV));
        let q = b.view(q, heads(Q::A), "TransposeBackward0", false);
        let k = b.view(k, heads(Q::KV), "TransposeBackward0", false);
        let v = b.view(v, heads(Q::KV), "TransposeBackward0", false);
        (q, k, v)
    } else {
        // `fused_qkv.view(b, s, a, 3, d)[..., i, :]`: selects (a full-size gradient each).
        let q = b.slice(fused, heads_bshd(Q::A));
        let k = b.slice(fused, heads_bshd(Q::A));
        let v = b.slice(fused, heads_bshd(Q::A));
        let t = |b: &mut Builder, x: Tid| b.view(x, heads(Q::A), "TransposeBackward0", false);
        (t(b, q), t(b, k), t(b, v))
    }
}

/// `FalconAttention.forward`'s eager branch (ALiBi off):
/// ```python
/// attention_scores = query_layer @ key_layer.transpose(-1, -2)
/// attention_scores /= math.sqrt(self.head_dim)
/// attention_scores = F.softmax(attention_scores + attention_mask, dim=-1, dtype=hidden_states.dtype)
/// attn_output = attention_scores @ value_layer
/// attn_output = attn_output.view(b, a, s, d).permute(0, 2, 1, 3).reshape(b, s, a·d)
/// ```
/// `matmul` copies q and k (broadcasting one kv head to `a`: an expand copy, summed back in
/// backward); the in-place division allocates nothing forward and its gradient (DivBackward0)
/// in backward; the softmax runs in the hidden states' dtype (the residual's) and keeps its
/// result; the output's reshape copies.
fn eager_core(b: &mut Builder, q: Tid, k: Tid, v: Tid, mask: Option<Tid>) -> (Tid, Tid) {
    let fold_or_repeat = |b: &mut Builder, x: Tid| {
        if b.shape(x).dims()[1] != Dim::Q(Q::A) && b.c.n(Q::KV) != b.c.n(Q::A) {
            // Autocast casts matmul's operands before matmul broadcasts them.
            let x = b.autocast_in(x);
            if b.c.n(Q::B) == 1 {
                expand_view(b, x)
            } else {
                llama::repeat_kv(b, x)
            }
        } else {
            b.fold(x, heads(Q::A))
        }
    };
    let qc = b.fold(q, heads(Q::A));
    let kc = fold_or_repeat(b, k);
    let sc = b.bmm(qc, kc, scores());
    let sd = div_scalar_(b, sc);
    let sa = match mask {
        Some(m) => b.add(sd, m),
        None => sd,
    };
    let s32 = b.to_copy(sa, Dt::Resid);
    let pr = b.unary("_softmax", "SoftmaxBackward0", s32, Keep::Output, "_softmax_backward_data");
    let vc = fold_or_repeat(b, v);
    let o = b.bmm(pr, vc, heads(Q::A));
    let o = b.view(o, heads(Q::A), "UnsafeViewBackward0", true);
    let ot = b.view(o, heads_bshd(Q::A), "PermuteBackward0", false);
    let oc = b.copy(ot, heads_bshd(Q::A));
    (b.view(oc, heads_bshd(Q::A), "ViewBackward0", false), pr)
}

/// `matmul`'s broadcast of one kv head to `a` at b = 1: the expanded `[1, a, s, d]` folds to
/// `[a, s, d]` as a view (a zero stride), so nothing is copied; ExpandBackward0 sums the
/// gradient back to one head.
fn expand_view(b: &mut Builder, x: Tid) -> Tid {
    let (rg, bytes, dtype) = (b.rg(x), b.bytes(x), b.t(x).dtype);
    let out = b.view_out(x, heads(Q::A));
    let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "sum" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    b.op("expand", "ExpandBackward0", &[x], &[out], &[], bw)[0]
}

/// `x /= c` in place for a Python number: no allocation; DivBackward0 allocates `grad / c`.
fn div_scalar_(b: &mut Builder, x: Tid) -> Tid {
    let (shape, rg, bytes, dtype) = (b.shape(x), b.rg(x), b.bytes(x), b.t(x).dtype);
    let out = b.view_out(x, shape);
    let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "div" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    let saved: &[S] = &[];
    b.op("div_", "DivBackward0", &[x], &[out], saved, bw)[0]
}

/// `FalconAttention.forward` (ALiBi off): `query_key_value`, the head split, RoPE on q and k,
/// SDPA with the materialized bool mask (`is_causal` is false when a mask is given; no
/// `enable_gqa`, so k and v keep the heads the split gave them) or the eager branch, `dense`.
/// Returns the output and the eager probabilities.
fn attention(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let [wqkv, wo] = fused_attn_w(b, p);
    let eager = attn == Attention::Eager;
    let fused = fused_qkv(b, x, wqkv, ["self_attention.query_key_value", "self_attention"], falcon_linear);
    let (q, k, v) = split_heads(b, spec, fused);
    let (qe, ke) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) if has_rope(spec) => {
            let kv = if b.shape(k).dims()[1] == Dim::Q(Q::A) { Q::A } else { Q::KV };
            let qe = llama::rope(b, q, cos, sin, Q::A);
            let ke = llama::rope(b, k, cos, sin, kv);
            (qe, ke)
        }
        _ => (q, k),
    };
    // `query_layer`, `key_layer` rebind to the rotated tensors: the copies before go.
    b.hold(q);
    b.hold(k);
    let (region, qe, ke, v) = llama::selective_begin(b, qe, ke, v);
    let (o, weights) = if eager {
        let (o, pr) = eager_core(b, qe, ke, v, sh.mask);
        (o, Some(pr))
    } else {
        let o = match sh.mask {
            Some(m) if !b.dropout || b.c.cuda => llama::sdpa_bool_mask(b, qe, ke, v, m, starcoder2::mask_build()),
            _ => llama::sdpa_core(b, qe, ke, v),
        };
        (o, None)
    };
    llama::selective_end(b, region);
    b.part = Part::AttentionInputs;
    b.module = "self_attention.dense";
    let out = falcon_linear(b, o, wo.0, wo.1, tok(Q::H), Linear::O);
    for t in [fused, qe, ke, v] {
        b.hold(t);
    }
    (out, weights)
}

/// `FalconMLP.forward`: `dense_4h_to_h(act(dense_h_to_4h(x)))` (`get_activation("gelu")`:
/// `F.gelu`, keeping its input), on [`falcon_linear`]s.
fn mlp(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid) -> Tid {
    let w = plain_mlp_w(b, p);
    plain_mlp_with(b, w, x, spec.act, ["mlp.dense_h_to_4h", "mlp.act", "mlp.dense_4h_to_h"], falcon_linear)
}

/// `a += b` in place (AddBackward0: the gradient passes to both; no allocation).
fn add_(b: &mut Builder, a: Tid, x: Tid) -> Tid {
    let (shape, rg) = (b.shape(a), b.rg(a) || b.rg(x));
    let out = b.view_out(a, shape);
    let bw: &[B] = if rg { &[B::Pass { input: 0, output: 0 }, B::Pass { input: 1, output: 0 }] } else { &[] };
    b.op("add_", "AddBackward0", &[a, x], &[out], &[], bw)[0]
}

/// `FalconDecoderLayer.forward`:
/// ```python
/// residual = hidden_states
/// if new_decoder_architecture and num_ln_in_parallel_attn == 2:
///     attention_layernorm_out = self.ln_attn(hidden_states); mlp_layernorm_out = self.ln_mlp(hidden_states)
/// else:
///     attention_layernorm_out = self.input_layernorm(hidden_states)
/// attention_output, attn_weights = self.self_attention(attention_layernorm_out, …)
/// if not new_decoder_architecture:
///     if parallel_attn: mlp_layernorm_out = attention_layernorm_out
///     else:
///         residual = dropout_add(attention_output, residual, …)
///         mlp_layernorm_out = self.post_attention_layernorm(residual)
/// mlp_output = self.mlp(mlp_layernorm_out)
/// if new_decoder_architecture or parallel_attn: mlp_output += attention_output
/// output = dropout_add(mlp_output, residual, …)            # dropout(x) then residual + x
/// ```
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    b.group = Group::All;
    let two = spec.layer_norms >= 2;
    let ln1 = Norm::LayerNorm.weights(b, p, LAYER_NORM);
    let ln2 = if two { Norm::LayerNorm.weights(b, p, LAYER_NORM) } else { (None, None) };
    let ln = |b: &mut Builder, module: &'static str, x: Tid, w: NormW| Norm::LayerNorm.call(b, module, x, w);
    if spec.parallel {
        let n1 = ln(b, if two { "ln_attn" } else { "input_layernorm" }, x, ln1);
        let n2 = if two { ln(b, "ln_mlp", x, ln2) } else { n1 };
        let (a, weights) = attention(b, p, spec, n1, sh, attn);
        let m = mlp(b, p, spec, n2);
        b.module = "";
        let m = add_(b, m, a);
        let m = dropout(b, "", m);
        let y = b.add(x, m);
        for t in [n1, n2, a, m].into_iter().chain(weights) {
            b.hold(t);
        }
        y
    } else {
        let n1 = ln(b, "input_layernorm", x, ln1);
        let (a, weights) = attention(b, p, spec, n1, sh, attn);
        let a = dropout(b, "", a);
        let h = b.add(x, a);
        let n2 = ln(b, "post_attention_layernorm", h, ln2);
        let m = mlp(b, p, spec, n2);
        let m = dropout(b, "", m);
        let y = b.add(h, m);
        for t in [n1, n2, a, h, m].into_iter().chain(weights) {
            b.hold(t);
        }
        y
    }
}

/// Falcon (`modeling_falcon.py`): fused `query_key_value`, parallel attention and MLP under
/// one or two LayerNorms, and a bool mask SDPA always receives (`allow_is_causal_skip=False`).
pub struct Falcon;
impl ConfigFile for Falcon {
    /// `FalconConfig`: multi-query or MHA (original layout) or `num_kv_heads` (`new_decoder_architecture`), fused `query_key_value`, parallel attention, ALiBi or RoPE.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::with_vocab(f)?;
        m.resid_dropout = true;
        m.hidden = f.required(&["hidden_size"])?;
        m.layers = f.required(&["num_hidden_layers", "n_layer"])?;
        m.heads = f.required(&["num_attention_heads", "n_head"])?;
        m.head_dim = m.hidden / m.heads.max(1);
        let new_arch = f.flag("new_decoder_architecture", false)?;
        let multi_query = f.flag("multi_query", true)?;
        m.kv_heads = if new_arch {
            f.uint_or("num_kv_heads", m.heads)?
        } else if multi_query {
            1
        } else {
            m.heads
        };
        m.ffn = f.uint("ffn_hidden_size")?.unwrap_or(m.hidden.saturating_mul(4));
        m.mlp = MlpKind::Plain;
        m.act = f.activation(&["activation"], Activation::Gelu)?;
        m.norm = NormKind::Layernorm;
        let bias = f.flag("bias", false)?;
        m.qkv_bias = bias;
        m.o_bias = bias;
        m.mlp_bias = bias;
        m.tied = f.flag("tie_word_embeddings", true)?;
        m.max_pos = f.uint_or("max_position_embeddings", 2048)?;
        m.positions = if f.flag("alibi", false)? { Positions::None } else { Positions::Rope };
        let parallel = f.flag("parallel_attn", true)?;
        m.parallel = parallel || new_arch;
        m.layer_norms = if new_arch {
            f.uint_or("num_ln_in_parallel_attn", 2)?
        } else if parallel {
            1
        } else {
            2
        };
        m.fused_qkv = true;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(act) = writer::act_name(s.act) else { return Vec::new() };
        let base = |new_arch: bool| {
            let mut w = writer::Writer::new("falcon");
            w.set("vocab_size", s.vocab)
                .set("hidden_size", s.hidden)
                .set("num_hidden_layers", s.layers)
                .set("num_attention_heads", s.heads)
                .set("ffn_hidden_size", s.ffn)
                .set("activation", act)
                .set("bias", s.qkv_bias)
                .set("tie_word_embeddings", s.tied)
                .set("max_position_embeddings", s.max_pos)
                .set("alibi", s.positions == Positions::None)
                .set("new_decoder_architecture", new_arch);
            w
        };
        let mut old = base(false);
        old.set("multi_query", s.kv_heads == 1).set("parallel_attn", s.parallel);
        let mut new = base(true);
        new.set("num_kv_heads", s.kv_heads).set("num_ln_in_parallel_attn", s.layer_norms).set("parallel_attn", true);
        [old.done(), new.done()].into_iter().flatten().collect()
    }
}

impl Modeling for Falcon {
    /// `FalconModel.forward` before the layers (ALiBi off): `word_embeddings`, `position_ids`,
    /// `create_causal_mask(…, allow_is_causal_skip=False)` — the packed-sequence check, then the
    /// bool mask `[1, 1, s, s_kv]` (`le` of the kv and q indices) for SDPA too, turned additive
    /// (`where`) for eager — and the rotary embedding.
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        let (x0, emb_w) = token_embedding(b, p, ids, "transformer.word_embeddings");
        b.module = "transformer";
        let pos = cache_position(b);
        let mask = if attn == Attention::Eager {
            causal_mask(b, pos, attn)
        } else {
            packed_detection(b, pos);
            let le = sdpa_mask(b, false);
            Some(set_part(b, le, Part::Checkpoints))
        };
        let (cos, sin) = rope_pair(b, spec, pos, true);
        (x0, Shared { cos, sin, pos: Some(pos), mask, emb_w: tied(spec, emb_w), locals: [Some(x0), None], ..Shared::default() })
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
    fn final_norm(&self, b: &mut Builder, p: &Params, _spec: &ModelSpec, x: Tid) -> Tid {
        final_norm(b, p, "transformer.ln_f", Norm::LayerNorm, x)
    }
    fn mask_shapes(&self, _b: &Builder, _spec: &ModelSpec, attn: Attention) -> [Option<(Shape, Dt)>; 2] {
        [Some(mask_shape(attn)), None]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::hf;
    use serde_json::json;

    fn spec(extra: serde_json::Value) -> ModelSpec {
        let mut v = json!({
            "model_type": "falcon", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 1000, "ffn_hidden_size": 176, "bias": false, "alibi": false
        });
        for (k, x) in extra.as_object().expect("an object") {
            v[k] = x.clone();
        }
        hf::import_value(&v).expect("a falcon config imports").spec
    }

    #[test]
    fn falcon_7b_is_the_multi_query_layout_and_40b_the_new_one() {
        // Falcon-7B: multi_query, parallel_attn, one norm per layer.
        let seven = spec(json!({"multi_query": true, "parallel_attn": true, "new_decoder_architecture": false}));
        assert_eq!(seven.family, crate::estimator::family::Family::Falcon);
        assert_eq!(seven.kv_heads, 1);
        assert!(!new_arch(&seven));
        // Falcon-40B: new_decoder_architecture, 2 kv heads here, two norms (ln_attn, ln_mlp).
        let forty = spec(json!({"new_decoder_architecture": true, "num_kv_heads": 2}));
        assert!(new_arch(&forty));
        // Falcon-11B: the new layout with one norm.
        let eleven = spec(json!({"new_decoder_architecture": true, "num_kv_heads": 2, "num_ln_in_parallel_attn": 1}));
        assert_eq!(eleven.layer_norms, 1);
        assert!(new_arch(&eleven));
    }

    #[test]
    fn the_sequential_layout_is_never_the_new_architecture() {
        let seq = spec(json!({"multi_query": false, "parallel_attn": false}));
        assert!(!seq.parallel && seq.layer_norms == 2);
        assert!(!new_arch(&seq));
    }

    #[test]
    fn alibi_falcon_is_refused_rather_than_estimated() {
        let alibi = spec(json!({"alibi": true}));
        assert_eq!(crate::estimator::unmodelled_feature(&alibi), Some("ALiBi position biases"));
        let rotary = spec(json!({}));
        assert_eq!(crate::estimator::unmodelled_feature(&rotary), None);
    }
}
