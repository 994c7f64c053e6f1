//! GPT-NeoX / Pythia (`modeling_gpt_neox.py`): a fused `query_key_value` projection whose
//! output is laid out per head `[b, s, a, 3·d]` and chunked into q, k, v; partial RoPE
//! (`rotary_pct`) on the first `d_rot` dims of q and k; `dense`; two biased LayerNorms per
//! layer and either the parallel residual (`use_parallel_residual`, the default: attention and
//! MLP both read the layer's input) or the sequential one; `dense_h_to_4h` → GELU →
//! `dense_4h_to_h`; a final LayerNorm and an untied `embed_out` head.

use super::super::blocks::shapes::heads;
use super::super::ir::{Builder, Group, Tid};
use super::common::{
    dropout, final_norm, fused_attn_w, fused_qkv, out_proj, plain_mlp, plain_mlp_w, proj_or, qkv_shape, Kind, Norm, Params, Shared,
    LAYER_NORM,
};
use super::modeling::{ConfigFile, Modeling};
use super::{llama, phi};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{Activation, MlpKind, ModelSpec, NormKind};
use crate::estimator::part::Part;
use serde_json::{Map, Value};

/// `GPTNeoXAttention.forward`:
/// ```python
/// qkv = self.query_key_value(hidden_states).view(*input_shape, -1, 3 * head_size).transpose(1, 2)
/// query_states, key_states, value_states = qkv.chunk(3, dim=-1)
/// query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
/// attn_output = self.dense(attention_interface(…).reshape(*input_shape, -1).contiguous())
/// ```
/// v stays a view of the projection's output; RoPE's `cat` makes q and k contiguous
/// `[b, a, s, d]`, so SDPA's output is copied by the reshape and eager's matmul views q and k.
/// The chunks' gradients meet in one `cat` `[b, a, s, 3·d]` whose transpose the head view
/// copies back.
fn attention(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let [wqkv, wo] = fused_attn_w(b, p);
    let qkv = fused_qkv(b, x, wqkv, ["attention.query_key_value", "attention"], proj_or);
    let qkv_shape = qkv_shape();
    let per_head = b.view(qkv, qkv_shape, "ViewBackward0", true);
    let t = b.view(per_head, qkv_shape, "TransposeBackward0", false);
    let (q, k, v) = b.split3(t, heads(Q::A));
    let (qe, ke) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) => llama::rope_partial(b, spec, q, k, cos, sin, llama::PartialRope::default()),
        _ => (q, k),
    };
    let (o, weights, [qe, ke, _]) = llama::attend(b, spec, [qe, ke, v], sh.mask, attn, llama::Core::CONTIGUOUS);
    let out = out_proj(b, o, wo.0, wo.1, "attention.dense");
    b.hold(qkv);
    b.hold(qe);
    b.hold(ke);
    (out, weights)
}

/// `GPTNeoXMLP.forward`: `dense_4h_to_h(act(dense_h_to_4h(x)))`.
fn mlp(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid) -> Tid {
    let w = plain_mlp_w(b, p);
    plain_mlp(b, w, x, spec.act, ["mlp.dense_h_to_4h", "mlp.act", "mlp.dense_4h_to_h"])
}

/// `GPTNeoXLayer.forward`:
/// ```python
/// attn_output, _ = self.attention(self.input_layernorm(hidden_states), …)
/// attn_output = self.post_attention_dropout(attn_output)
/// if self.use_parallel_residual:
///     mlp_output = self.post_mlp_dropout(self.mlp(self.post_attention_layernorm(hidden_states)))
///     hidden_states = mlp_output + attn_output + hidden_states
/// else:
///     attn_output = attn_output + hidden_states
///     mlp_output = self.post_mlp_dropout(self.mlp(self.post_attention_layernorm(attn_output)))
///     hidden_states = mlp_output + attn_output
/// ```
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    b.group = Group::All;
    // Registration order: input_layernorm, post_attention_layernorm, attention, mlp.
    let ln1 = Norm::LayerNorm.weights(b, p, LAYER_NORM);
    let ln2 = Norm::LayerNorm.weights(b, p, LAYER_NORM);
    let n1 = Norm::LayerNorm.call(b, "input_layernorm", x, ln1);
    let (a, weights) = attention(b, p, spec, n1, sh, attn);
    b.hold(n1);
    let a = dropout(b, "post_attention_dropout", a);
    // The sequential residual adds the attention's output first, and normalizes that.
    let h = (!spec.parallel).then(|| {
        b.module = "";
        b.part = Part::Norms;
        b.add(a, x)
    });
    let n2 = Norm::LayerNorm.call(b, "post_attention_layernorm", h.unwrap_or(x), ln2);
    let m = mlp(b, p, spec, n2);
    b.hold(n2);
    let m = dropout(b, "post_mlp_dropout", m);
    b.module = "";
    b.part = Part::Norms;
    let y = match h {
        Some(h) => b.add(m, h),
        None => {
            let ma = b.add(m, a);
            b.add(ma, x)
        }
    };
    for t in h.into_iter().chain([m, a]).chain(weights) {
        b.hold(t);
    }
    y
}

/// GPT-NeoX (`modeling_gpt_neox.py`): fused `query_key_value`, partial rotary, parallel or
/// sequential residuals, `final_layer_norm`.
pub struct GptNeox;
impl ConfigFile for GptNeox {
    /// `GPTNeoXConfig`: fused `query_key_value`, `attention_bias`, partial RoPE (`rotary_pct`), parallel residual by default.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::with_plain_sizes(f)?;
        m.kv_heads = m.heads;
        m.head_dim = m.hidden / m.heads.max(1);
        m.ffn = f.required(&["intermediate_size"])?;
        m.mlp = MlpKind::Plain;
        m.act = f.activation(&["hidden_act"], Activation::Gelu)?;
        m.norm = NormKind::Layernorm;
        let bias = f.flag("attention_bias", true)?;
        m.qkv_bias = bias;
        m.o_bias = bias;
        m.mlp_bias = true;
        m.tied = f.flag("tie_word_embeddings", false)?;
        m.max_pos = f.uint_or("max_position_embeddings", 2048)?;
        m.rotary_pct = f.rotary_pct(0.25)?;
        m.parallel = f.flag("use_parallel_residual", true)?;
        m.fused_qkv = true;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::plain_base("gpt_neox", s, false) else { return Vec::new() };
        w.set("attention_bias", s.qkv_bias)
            .set("partial_rotary_factor", writer::rotary_fraction(s))
            .set("use_parallel_residual", s.parallel)
            .done()
            .into_iter()
            .collect()
    }
}

impl Modeling for GptNeox {
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        phi::embed_with_dropout(b, p, spec, ids, attn, false)
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
    fn final_norm(&self, b: &mut Builder, p: &Params, _spec: &ModelSpec, x: Tid) -> Tid {
        final_norm(b, p, "gpt_neox.final_layer_norm", Norm::LayerNorm, x)
    }
}
