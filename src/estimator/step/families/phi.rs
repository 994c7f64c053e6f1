//! Phi-1/1.5/2 (`modeling_phi.py`): a parallel block — one biased LayerNorm feeds both the
//! attention and the MLP, whose outputs join the residual in one line — with biased q/k/v
//! projections and `dense`, partial RoPE on the first `d_rot` dims of each head (sliced, rotated,
//! concatenated back), `fc1` → `gelu_new` → `fc2`, a final LayerNorm and a biased LM head.

use super::super::ir::{Builder, Group, Tid};
use super::common::{
    dropout, embed_then, final_norm, out_proj, plain_mlp, plain_mlp_w, qkv, AttnW, Kind, Norm, NormW, Params, Shared, LAYER_NORM,
};
use super::llama::{self, PartialRope};
use super::modeling::{ConfigFile, Modeling};
use crate::estimator::config::Attention;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{Activation, MlpKind, ModelSpec, NormKind, QkNorm};
use crate::estimator::part::Part;
use serde_json::{Map, Value};

/// `PhiAttention.forward`:
/// ```python
/// query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)   # k, v alike
/// query_rot, query_pass = query_states[..., :rotary_ndims], query_states[..., rotary_ndims:]
/// key_rot, key_pass = key_states[..., :rotary_ndims], key_states[..., rotary_ndims:]
/// query_rot, key_rot = apply_rotary_pos_emb(query_rot, key_rot, cos, sin)
/// query_states = torch.cat((query_rot, query_pass), dim=-1)   # then key_states
/// attn_output = self.dense(attention_interface(…).reshape(*input_shape, -1).contiguous())
/// ```
/// The concatenations leave q and k contiguous `[b, heads, s, d]` (SDPA's output then copies
/// in the reshape; eager's matmul views them). With `qk_layernorm`, a LayerNorm over `d` on
/// each of q and k before RoPE.
fn attention(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let w = AttnW::new(b, p);
    let qkn = (spec.qk_norm == QkNorm::Head).then(|| {
        let qn = Norm::LayerNorm.weights(b, p, ["layers.*.attn.q_norm.weight", "layers.*.attn.q_norm.bias"]);
        (qn, Norm::LayerNorm.weights(b, p, ["layers.*.attn.k_norm.weight", "layers.*.attn.k_norm.bias"]))
    });
    // q's and k's gradients come back from `cat` laid out [b, heads, s, d]: their views copy;
    // v's too after eager's bmm, not after SDPA's kernel.
    let (q, k, v) = qkv(b, &w, x, [true, true, attn == Attention::Eager]);
    b.part = Part::AttentionCore;
    let (q, k) = match qkn {
        Some((qn, kn)) => qk_layernorm(b, (q, qn), (k, kn), ["self_attn.q_layernorm", "self_attn.k_layernorm"]),
        None => (q, k),
    };
    attention_out(b, spec, [q, k, v], sh, attn, (w.wo, w.bo), "self_attn.dense", true)
}

/// `self.q_layernorm(query_states)`, `self.k_layernorm(key_states)` (`modules`): a LayerNorm over
/// `d` each, with weights of the input's dtype or (under autocast) fp32.
pub fn qk_layernorm(b: &mut Builder, q: (Tid, NormW), k: (Tid, NormW), modules: [&'static str; 2]) -> (Tid, Tid) {
    b.module = modules[0];
    let qn = b.layer_norm_mixed(q.0, q.1 .0, q.1 .1);
    b.module = modules[1];
    (qn, b.layer_norm_mixed(k.0, k.1 .0, k.1 .1))
}

/// The rest of Phi's attention (StableLM's too) from the `[b, heads, s, d]` q, k, v: the partial
/// RoPE ([`llama::rope_partial`], `query_rot`/`key_rot` bound until the return), the attention core on
/// the contiguous q and k, the output projection (`wo`, at `module`); the locals live to the
/// return — of v, the projection's view (`v_view`, Phi) or what the core received (StableLM).
#[allow(clippy::too_many_arguments)]
pub fn attention_out(
    b: &mut Builder,
    spec: &ModelSpec,
    [q, k, v]: [Tid; 3],
    sh: &Shared,
    attn: Attention,
    wo: (Option<Tid>, Option<Tid>),
    module: &'static str,
    v_view: bool,
) -> (Tid, Option<Tid>) {
    b.module = "self_attn";
    let (qe, ke) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) => llama::rope_partial(b, spec, q, k, cos, sin, PartialRope { named: true, ..PartialRope::default() }),
        _ => (q, k),
    };
    let (o, weights, [qe, ke, vt]) = llama::attend(b, spec, [qe, ke, v], sh.mask, attn, llama::Core::CONTIGUOUS);
    let out = out_proj(b, o, wo.0, wo.1, module);
    for t in [q, k, if v_view { v } else { vt }, qe, ke] {
        b.hold(t);
    }
    (out, weights)
}

/// `PhiMLP.forward`: `fc2(activation_fn(fc1(x)))`, with `gelu_new` or (any other
/// `hidden_act`) `F.gelu`.
fn mlp(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid) -> Tid {
    let w = plain_mlp_w(b, p);
    let act = if spec.act == Activation::GeluNew { Activation::GeluNew } else { Activation::Gelu };
    plain_mlp(b, w, x, act, ["mlp.fc1", "mlp.activation_fn", "mlp.fc2"])
}

/// `PhiDecoderLayer.forward`:
/// ```python
/// residual = hidden_states
/// hidden_states = self.input_layernorm(hidden_states)
/// attn_outputs, _ = self.self_attn(hidden_states, …)
/// attn_outputs = self.resid_dropout(attn_outputs)
/// feed_forward_hidden_states = self.resid_dropout(self.mlp(hidden_states))
/// hidden_states = attn_outputs + feed_forward_hidden_states + residual
/// ```
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    b.group = Group::All;
    // Registration order: self_attn, mlp, input_layernorm (created inside in that order).
    let ln = Norm::LayerNorm.weights(b, p, LAYER_NORM);
    let n = Norm::LayerNorm.call(b, "input_layernorm", x, ln);
    let (a, weights) = attention(b, p, spec, n, sh, attn);
    let a = dropout(b, "resid_dropout", a);
    let m = mlp(b, p, spec, n);
    let m = dropout(b, "resid_dropout", m);
    b.module = "";
    let am = b.add(a, m);
    let y = b.add(am, x);
    for t in [n, a, m].into_iter().chain(weights) {
        b.hold(t);
    }
    y
}

/// The model's prologue (Llama's: embedding, positions, mask, rotary) followed by the embedding
/// dropout the LayerNorm families apply before the first layer (a no-op at p = 0):
/// `PhiModel.forward`'s `inputs_embeds = self.embed_dropout(inputs_embeds)` (`rebind`: the
/// embedding's output is let go, the dropped-out tensor is the forward's local), GPT-NeoX's
/// `hidden_states = self.emb_dropout(inputs_embeds)` and StarCoder2's
/// `hidden_states = dropout(hidden_states, p=self.embedding_dropout)` (`inputs_embeds` stays bound).
pub fn embed_with_dropout(b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention, rebind: bool) -> (Tid, Shared) {
    let (x0, mut sh) = embed_then(b, p, spec, ids, false, |b| llama::positions(b, spec, attn));
    if !b.dropout {
        return (x0, sh);
    }
    b.layer = super::super::ir::MODEL;
    let x = dropout(b, "model.embed_dropout", x0);
    b.part = Part::Embedding;
    if rebind {
        sh.locals[0] = Some(x);
    }
    (x, sh)
}

/// Phi-1/2 (`modeling_phi.py`): one LayerNorm feeding parallel attention and MLP, partial
/// rotary, biases everywhere, embedding dropout, `final_layernorm`, a biased head.
pub struct Phi;
impl ConfigFile for Phi {
    /// `PhiConfig`: one LayerNorm per parallel block, biases everywhere, partial RoPE, `qk_layernorm`.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::with_plain_sizes(f)?;
        m.kv_heads = f.uint_or("num_key_value_heads", m.heads)?;
        m.head_dim = m.hidden / m.heads.max(1);
        m.ffn = f.required(&["intermediate_size"])?;
        m.mlp = MlpKind::Plain;
        m.act = f.activation(&["hidden_act"], Activation::GeluNew)?;
        m.norm = NormKind::Layernorm;
        m.layer_norms = 1;
        m.parallel = true;
        m.qkv_bias = true;
        m.o_bias = true;
        m.mlp_bias = true;
        m.head_bias = true;
        m.tied = f.flag("tie_word_embeddings", false)?;
        m.max_pos = f.uint_or("max_position_embeddings", 2048)?;
        m.rotary_pct = f.rotary_pct(0.5)?;
        if f.flag("qk_layernorm", false)? {
            m.qk_norm = QkNorm::Head;
        }
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::plain_base("phi", s, true) else { return Vec::new() };
        w.set("partial_rotary_factor", writer::rotary_fraction(s))
            .set("qk_layernorm", s.qk_norm == QkNorm::Head)
            .done()
            .into_iter()
            .collect()
    }
}

impl Modeling for Phi {
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        embed_with_dropout(b, p, spec, ids, attn, true)
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
    fn final_norm(&self, b: &mut Builder, p: &Params, _spec: &ModelSpec, x: Tid) -> Tid {
        final_norm(b, p, "model.final_layernorm", Norm::LayerNorm, x)
    }
}
