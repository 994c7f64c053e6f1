//! GPT-2 (`modeling_gpt2.py`): LayerNorm, Conv1D projections (`addmm` with `[in, out]`
//! weights), a fused `c_attn` split into q, k, v, `activation_function` (`gelu_new` written as
//! tensor ops by default), learned
//! positions, a tied LM head.

use super::super::blocks::shapes::{heads_bshd, tok};
use super::super::ir::{Builder, Dim, Group, Shape, Split, Tid};
use super::common::{
    arange, causal_mask, dropout, final_norm, fused_attn_w, fused_qkv, lookup, out_proj, plain_mlp, plain_mlp_w, proj_or, tied, to_heads,
};
use super::common::{Kind, Norm, Params, Shared, LAYER_NORM};
use super::llama;
use super::modeling::{ConfigFile, Modeling};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{Activation, MlpKind, ModelSpec, NormKind, Positions};
use crate::estimator::part::Part;
use crate::estimator::preset_base::{self as base, Preset};
use serde_json::{Map, Value};

/// `GPT2Attention.forward` (self-attention): `c_attn` → `split` → `view(…, -1, d).transpose`
/// (k and v first, then q), the attention core, `c_proj`. Returns the output and the eager
/// attention weights.
fn attention(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let [wqkv, wo] = fused_attn_w(b, p);
    let eager = attn == Attention::Eager;
    let qkv = fused_qkv(b, x, wqkv, ["attn.c_attn", "attn"], proj_or);
    let (q, k, v) = b.split3(qkv, heads_bshd(Q::A));
    // Eager's bmm gradients come back laid out [b, a, s, d]: the head views of q and v copy
    // them (k's arrives transposed twice); SDPA's CPU kernel returns them [b, s, a, d].
    let kt = to_heads(b, k, Q::KV, false);
    let vt = to_heads(b, v, Q::KV, eager);
    let qt = to_heads(b, q, Q::A, eager);
    // `eager_attention_forward` (GPT-2's): matmul copies q and kᵀ, softmax in the model dtype.
    let how = llama::Core { fp32: false, ..llama::Core::LLAMA };
    let (o, weights, kept) = llama::attend(b, spec, [qt, kt, vt], sh.mask, attn, how);
    let out = out_proj(b, o, wo.0, wo.1, "attn.c_proj");
    let out = dropout(b, "attn.resid_dropout", out);
    for t in kept {
        b.hold(t);
    }
    (out, weights)
}

/// `GPT2MLP.forward`: `c_fc` → `ACT2FN[config.activation_function]` → `c_proj`, then
/// `dropout`. `gelu_new` (the default) is written as tensor ops and keeps four f-wide tensors;
/// `gelu_pytorch_tanh` is `F.gelu(x, approximate="tanh")`, one op that keeps its input
/// (transformers 5.24 `activations.py`, `NewGELUActivation` and `PytorchGELUTanh`).
fn mlp(b: &mut Builder, spec: &ModelSpec, w: [Option<Tid>; 4], x: Tid) -> Tid {
    let y = plain_mlp(b, w, x, spec.act, ["mlp.c_fc", "mlp.act", "mlp.c_proj"]);
    dropout(b, "mlp.dropout", y)
}

/// `GPT2Block.forward`: `ln_1` → attention → residual → `ln_2` → MLP → residual.
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    b.group = Group::All;
    // Registration order: ln_1, attn (c_attn, c_proj), ln_2, mlp (c_fc, c_proj).
    let ln1 = Norm::LayerNorm.weights(b, p, LAYER_NORM);
    // The attention's weights are created inside (registered right after ln_1).
    let n1 = Norm::LayerNorm.call(b, "ln_1", x, ln1);
    let (a, weights) = attention(b, p, spec, n1, sh, attn);
    let ln2 = Norm::LayerNorm.weights(b, p, LAYER_NORM);
    let mw = plain_mlp_w(b, p);
    b.module = "";
    let h = b.add(a, x);
    // `attn_output, _ = self.attn(hidden_states)` leaves `hidden_states` (ln_1's output) bound
    // until the residual add rebinds it; the same for ln_2's around the MLP.
    b.hold(n1);
    let n2 = Norm::LayerNorm.call(b, "ln_2", h, ln2);
    let m = mlp(b, spec, mw, n2);
    b.module = "";
    let y = b.add(h, m);
    // `attn_output` and `feed_forward_hidden_states` are the block's locals to its return.
    for t in [n2, h, a, m].into_iter().chain(weights) {
        b.hold(t);
    }
    y
}

/// GPT-2 (`modeling_gpt2.py`): learned positions summed into the embedding, LayerNorm, fused
/// `Conv1D` attention, its own MLP and `ln_f`.
pub struct Gpt2;
impl ConfigFile for Gpt2 {
    /// GPT2Config (configuration_gpt2.py): `n_embd`, `n_layer`, `n_head`, `n_inner` (default 4h), `activation_function`, `n_positions`; learned positions, biases everywhere, fused `c_attn`.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::with_vocab(f)?;
        m.hidden = f.required(&["n_embd", "hidden_size"])?;
        m.layers = f.required(&["n_layer", "num_hidden_layers"])?;
        m.heads = f.required(&["n_head", "num_attention_heads"])?;
        m.kv_heads = m.heads;
        m.head_dim = m.hidden / m.heads.max(1);
        m.ffn = f.uint("n_inner")?.unwrap_or(m.hidden.saturating_mul(4));
        m.mlp = MlpKind::Plain;
        m.act = f.activation(&["activation_function"], Activation::GeluNew)?;
        m.norm = NormKind::Layernorm;
        m.qkv_bias = true;
        m.o_bias = true;
        m.mlp_bias = true;
        m.tied = f.flag("tie_word_embeddings", true)?;
        m.positions = Positions::Learned;
        m.max_pos = f.uint_or("n_positions", 1024)?;
        m.rotary_pct = 0;
        m.fused_qkv = true;
        m.softmax_fp32 = false;
        m.resid_dropout = true;
        m.embed_dropout = true;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(act) = writer::act_name(s.act) else { return Vec::new() };
        writer::Writer::new("gpt2")
            .set("vocab_size", s.vocab)
            .set("n_embd", s.hidden)
            .set("n_layer", s.layers)
            .set("n_head", s.heads)
            .set("n_inner", s.ffn)
            .set("activation_function", act)
            .set("n_positions", s.max_pos)
            .set("tie_word_embeddings", s.tied)
            .done()
            .into_iter()
            .collect()
    }
}

impl Modeling for Gpt2 {
    fn presets(&self) -> Vec<Preset> {
        // Learned positions, LayerNorm, `gelu_new` MLP of 4h, fused Conv1D QKV, all biases, tied
        // head, n_positions = 1024.
        let gpt2 = |hidden, layers, heads| {
            let mut m = base::llama(50257, hidden, layers, heads, heads, 4 * hidden, 1024);
            m.family = Family::Gpt2;
            m.mlp = MlpKind::Plain;
            m.act = Activation::GeluNew;
            m.norm = NormKind::Layernorm;
            m.qkv_bias = true;
            m.o_bias = true;
            m.mlp_bias = true;
            m.tied = true;
            m.positions = Positions::Learned;
            m.rotary_pct = 0;
            m.fused_qkv = true;
            m.softmax_fp32 = false;
            m.resid_dropout = true;
            m.embed_dropout = true;
            m
        };
        let p = |order, id, checkpoint, spec| Preset::new(order, id, checkpoint, "GPT-2", spec);
        vec![
            p(0, "gpt2", "openai-community/gpt2", gpt2(768, 12, 12)),
            p(1, "gpt2-medium", "openai-community/gpt2-medium", gpt2(1024, 24, 16)),
            p(2, "gpt2-large", "openai-community/gpt2-large", gpt2(1280, 36, 20)),
            p(3, "gpt2-xl", "openai-community/gpt2-xl", gpt2(1600, 48, 25)),
        ]
    }
    /// `GPT2Model.forward` before the blocks: `wte(input_ids) + wpe(position_ids)`, the mask.
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        b.part = Part::Embedding;
        b.module = "transformer.wte";
        let wte = p.w(b, "embed_tokens.weight");
        let wpe = p.w(b, "embed_positions.weight");
        let te = lookup(b, ids, wte, tok(Q::H));
        b.module = "transformer";
        let pos = arange(b);
        b.module = "transformer.wpe";
        let pe = lookup(b, pos, wpe, Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::H)], Split::Sp));
        b.module = "transformer";
        let x0 = b.add(te, pe);
        let x0 = dropout(b, "transformer.drop", x0);
        b.part = Part::Embedding;
        b.module = "transformer";
        let mask = causal_mask(b, pos, attn);
        (x0, Shared { mask, emb_w: tied(spec, wte), locals: [Some(te), Some(pe)], ..Shared::default() })
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
    fn final_norm(&self, b: &mut Builder, p: &Params, _spec: &ModelSpec, x: Tid) -> Tid {
        final_norm(b, p, "transformer.ln_f", Norm::LayerNorm, x)
    }
    /// `GPT2Model.forward` on a stage that receives its hidden states: the positions and the
    /// mask as [`Self::embed`] makes them. The blocks take no positions (GPT-2's learned ones are
    /// summed into the embedding, on the first stage), so no checkpoint holds them: they are a
    /// local of the model's forward, gone when it returns.
    fn positions(&self, b: &mut Builder, _spec: &ModelSpec, attn: Attention) -> Shared {
        b.module = "transformer";
        let pos = arange(b);
        let mask = causal_mask(b, pos, attn);
        Shared { mask, locals: [None, Some(pos)], ..Shared::default() }
    }
    fn x0_is_local(&self) -> bool {
        false
    }
    fn shares_positions(&self) -> bool {
        false
    }
}
