//! StableLM (`modeling_stablelm.py`): biased LayerNorms, q/k/v projections (biased when
//! `use_qkv_bias`), an optional per-head LayerNorm on q and k (`qk_layernorm`:
//! `StableLmLayerNormPerHead`, one bias-free `nn.LayerNorm(d)` per head), partial RoPE by slices
//! and `cat` (Phi's), a bias-free `o_proj`, Llama's gated MLP, and either the sequential
//! residual or the parallel one (`use_parallel_residual`: attention and MLP both read
//! `input_layernorm`'s output).

use super::super::ir::{Builder, Dim, Group, Shape, Split, Tid, B};
use super::common::{dropout, qkv, AttnW, Kind, MlpW, Norm, Params, Shared, LAYER_NORM};
use super::modeling::{ConfigFile, Modeling};
use super::{llama, phi};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{Activation, MlpKind, ModelSpec, NormKind, QkNorm};
use crate::estimator::part::Part;
use serde_json::{Map, Value};

/// `StableLmLayerNormPerHead.forward`:
/// ```python
/// states_per_heads = torch.split(hidden_states, 1, dim=1)
/// return torch.cat([norm(hidden_states) for norm, hidden_states in zip(self.norms, states_per_heads)], dim=1)
/// ```
/// on `x` `[b, heads, s, d]`: one view per head (SplitBackward0 concatenates their gradients),
/// a LayerNorm each (keeping its input view, mean and rstd `[b, 1, s, 1]` — fp32 under autocast,
/// where the weights are fp32 and q, k bf16), and the `cat` of
/// their outputs (CatBackward0 hands out narrowed views). `h`: the heads (a or k).
fn per_head_norm(b: &mut Builder, p: &Params, name: &str, x: Tid, h: Q) -> Tid {
    // The heads on this GPU (tensor parallelism splits them), each a whole `[b, 1, s, d]`.
    let all = b.c.n(h).max(1);
    let n = all.div_ceil(b.c.n(Q::T_TP).max(1));
    let (numel, trains, expert) = p.find(name).unwrap_or((0, false, false));
    let ws: Vec<Option<Tid>> = (0..n).map(|_| (numel > 0).then(|| p.make(b, numel / all, trains, expert))).collect();
    let one = Shape::new(&[Dim::Q(Q::B), Dim::N(1), Dim::Q(Q::S), Dim::Q(Q::D)], Split::None);
    let (rg, bytes, dtype) = (b.rg(x), b.bytes(x), b.t(x).dtype);
    let outs: Vec<_> = (0..n).map(|_| b.view_out(x, one)).collect();
    let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "cat" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    b.op("split", "SplitBackward0", &[x], &outs, &[], bw);
    let op = b.p.ops.last().expect("the split was just emitted");
    let parts: Vec<Tid> = b.p.outs(op).to_vec();
    let normed: Vec<Tid> = parts.iter().zip(&ws).map(|(&t, &w)| b.layer_norm_mixed(t, w, None)).collect();
    let full = b.shape(x);
    let dt = b.t(normed[0]).dt;
    let rg = normed.iter().any(|&t| b.rg(t));
    let out = b.out(full, dt, rg);
    let bw: Vec<B> = (0..normed.len()).map(|i| B::Pass { input: i as u8, output: 0 }).collect();
    b.op("cat", "CatBackward0", &normed, &[out], &[], if rg { &bw } else { &[] })[0]
}

/// `StableLmAttention.forward`: q, k, v projections and their `[b, heads, s, d]` views, the
/// per-head q/k norms, Phi's partial RoPE (`query_rot`, `key_rot` bound until the return),
/// the attention core, `o_proj` on `attn_output.reshape(b, s, -1)`.
fn attention(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let w = AttnW::new(b, p);
    // q's and k's gradients come back from a `cat` laid out [b, heads, s, d]: their views copy;
    // v's too after eager's bmm, not from SDPA's kernel.
    let (q, k, v) = qkv(b, &w, x, [true, true, attn == Attention::Eager]);
    b.part = Part::AttentionCore;
    let (q, k) = if spec.qk_norm == QkNorm::PerHead {
        b.module = "self_attn.q_layernorm";
        let qn = per_head_norm(b, p, "layers.*.attn.q_layernorm.norms.*.weight", q, Q::A);
        b.module = "self_attn.k_layernorm";
        let kn = per_head_norm(b, p, "layers.*.attn.k_layernorm.norms.*.weight", k, Q::KV);
        (qn, kn)
    } else {
        (q, k)
    };
    phi::attention_out(b, spec, [q, k, v], sh, attn, (w.wo, w.bo), "self_attn.o_proj", false)
}

/// `StableLmDecoderLayer.forward`:
/// ```python
/// residual = hidden_states
/// hidden_states = self.input_layernorm(hidden_states)
/// self_attn_output, _ = self.self_attn(hidden_states=hidden_states, …)
/// if self.use_parallel_residual:
///     mlp_output = self.dropout(self.mlp(hidden_states))
///     hidden_states = residual + self_attn_output + mlp_output
/// else:
///     residual = residual + self_attn_output
///     mlp_output = self.dropout(self.mlp(self.post_attention_layernorm(residual)))
///     hidden_states = residual + mlp_output
/// ```
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    b.group = Group::All;
    // Registration order: self_attn, mlp, input_layernorm, [post_attention_layernorm], dropout.
    let ln1 = Norm::LayerNorm.weights(b, p, LAYER_NORM);
    let n1 = Norm::LayerNorm.call(b, "input_layernorm", x, ln1);
    let (a, weights) = attention(b, p, spec, n1, sh, attn);
    let mw = MlpW::new(b, p);
    // The parallel residual's MLP reads `input_layernorm`'s output; the sequential one adds the
    // attention's output first, and normalizes that.
    let h = (!spec.parallel).then(|| {
        let ln2 = Norm::LayerNorm.weights(b, p, LAYER_NORM);
        b.module = "";
        b.part = Part::Norms;
        let h = b.add(x, a);
        (h, Norm::LayerNorm.call(b, "post_attention_layernorm", h, ln2))
    });
    let m = llama::mlp(b, &mw, h.map_or(n1, |h| h.1));
    if let Some((_, n2)) = h {
        b.hold(n2);
    }
    let m = dropout(b, "dropout", m);
    b.module = "";
    b.part = Part::Norms;
    let y = match h {
        Some((h, _)) => b.add(h, m),
        None => {
            let xa = b.add(x, a);
            b.add(xa, m)
        }
    };
    for t in h.map(|h| h.0).into_iter().chain([m, n1, a]).chain(weights) {
        b.hold(t);
    }
    y
}

/// StableLM (`modeling_stablelm.py`): LayerNorms, partial rotary, a gated MLP, optional
/// per-head q/k LayerNorms and parallel residuals.
pub struct Stablelm;
impl ConfigFile for Stablelm {
    /// `StableLmConfig`: LayerNorm, `use_qkv_bias`, partial RoPE, `use_parallel_residual`, per-head `qk_layernorm`.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::with_vocab(f)?;
        m.resid_dropout = true;
        m.hidden = f.required(&["hidden_size"])?;
        m.layers = f.required(&["num_hidden_layers"])?;
        m.heads = f.required(&["num_attention_heads"])?;
        m.kv_heads = f.uint_or("num_key_value_heads", m.heads)?;
        m.head_dim = m.hidden / m.heads.max(1);
        m.ffn = f.required(&["intermediate_size"])?;
        m.mlp = MlpKind::Gated;
        m.act = f.activation(&["hidden_act"], Activation::Silu)?;
        m.norm = NormKind::Layernorm;
        m.qkv_bias = f.flag("use_qkv_bias", false)?;
        m.tied = f.flag("tie_word_embeddings", false)?;
        m.max_pos = f.uint_or("max_position_embeddings", 4096)?;
        m.rotary_pct = f.rotary_pct(0.25)?;
        m.parallel = f.flag("use_parallel_residual", false)?;
        m.layer_norms = if m.parallel { 1 } else { 2 };
        if f.flag("qk_layernorm", false)? {
            m.qk_norm = QkNorm::PerHead;
        }
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::plain_base("stablelm", s, true) else { return Vec::new() };
        w.set("use_qkv_bias", s.qkv_bias)
            .set("partial_rotary_factor", writer::rotary_fraction(s))
            .set("use_parallel_residual", s.parallel)
            .set("qk_layernorm", s.qk_norm == QkNorm::PerHead)
            .done()
            .into_iter()
            .collect()
    }
}

impl Modeling for Stablelm {
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
    fn norm(&self) -> Norm {
        Norm::LayerNorm
    }
}
