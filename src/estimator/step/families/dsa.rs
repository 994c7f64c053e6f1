//! DeepSeek Sparse Attention's lightning indexer (transformers 5.24
//! `models/deepseek_v32/modeling_deepseek_v32.py`, `DeepseekV32Indexer`) and the mask its top-k
//! makes: the pieces [`super::deepseek`]'s MLA calls when a spec has DSA, apart from the
//! `deepseek_v32` family file ([`super::deepseek_v32`]), which builds on `deepseek`'s layer — so
//! that neither family file imports the other.

use super::common::{Params, Shared};
use crate::estimator::ctx::Q;
use crate::estimator::part::Part;
use crate::estimator::step::ir::{Builder, Dim, Dt, Shape, Split, Tid, X};

const B: Dim = Dim::Q(Q::B);
const S: Dim = Dim::Q(Q::S);
const SK: Dim = Dim::Q(Q::S_KV);
const HI: Dim = Dim::X(X::IdxHeads);
const DI: Dim = Dim::X(X::IdxHeadDim);
const DR: Dim = Dim::X(X::DRot);
const DR2: Dim = Dim::HalfX(X::DRot);
const TOPK: Dim = Dim::X(X::IdxTopk);

fn shape(ds: &[Dim]) -> Shape {
    Shape::new(ds, Split::None)
}

/// The indexer's parameters (`DeepseekV32Indexer.__init__`, registration order).
#[derive(Clone, Copy, Default)]
pub struct IndexerW {
    pub wq_b: Option<Tid>,
    pub wk: Option<Tid>,
    pub k_norm: Option<Tid>,
    pub k_norm_bias: Option<Tid>,
    pub weights_proj: Option<Tid>,
}

impl IndexerW {
    pub fn new(b: &mut Builder, p: &Params) -> IndexerW {
        IndexerW {
            wq_b: p.w(b, "layers.*.attn.indexer.wq_b.weight"),
            wk: p.w(b, "layers.*.attn.indexer.wk.weight"),
            k_norm: p.w(b, "layers.*.attn.indexer.k_norm.weight"),
            k_norm_bias: p.w(b, "layers.*.attn.indexer.k_norm.bias"),
            weights_proj: p.w(b, "layers.*.attn.indexer.weights_proj.weight"),
        }
    }
}

/// A linear of the indexer, under `no_grad`: one `mm`; under autocast its input is cast to the
/// compute dtype and its weight's cast cached until the forward ends (autocast caches the casts
/// of leaf fp32 tensors that require a gradient, which parameters do under `no_grad` too:
/// `aten/src/ATen/autocast_mode.cpp`, `cached_cast`).
fn linear(b: &mut Builder, x: Tid, w: Option<Tid>, out: Shape) -> Tid {
    let x = b.autocast_in(x);
    let w = match w {
        Some(w) if b.autocast => Some(b.cast_weight(w)),
        w => w,
    };
    let dt = b.t(x).dt;
    match w {
        Some(w) => b.plain("mm", &[x, w], out, dt),
        None => b.plain("mm", &[x], out, dt),
    }
}

/// `nn.LayerNorm(d_i)` under `no_grad`: `native_layer_norm`'s output and its mean and rstd
/// `[b, s, 1]` (dropped at once); under autocast it runs in fp32 (its input cast first).
fn layer_norm(b: &mut Builder, x: Tid, w: Option<Tid>, bias: Option<Tid>) -> Tid {
    let x = if b.autocast { b.to_copy(x, Dt::F32) } else { x };
    let dt = b.t(x).dt;
    let mut ins = vec![x];
    ins.extend(w);
    ins.extend(bias);
    let outs =
        [b.out(shape(&[B, S, DI]), dt, false), b.out(shape(&[B, S, Dim::N(1)]), dt, false), b.out(shape(&[B, S, Dim::N(1)]), dt, false)];
    b.plain_n("native_layer_norm", &ins, &outs)[0]
}

/// `apply_rotary_pos_emb` (Llama's half-split rotation) on `x` `[…, d_r]` with cos and sin
/// unsqueezed at dim 2: `x·cos`, `rotate_half(x)` (`neg` of the second half, `cat`), `·sin`,
/// the sum; each temporary dropped when the next op has used it.
fn rope(b: &mut Builder, x: Tid, cos: Tid, sin: Tid, heads: Dim) -> Tid {
    let full = shape(&[B, S, heads, DR]);
    let xc = b.mul(x, cos);
    let x2 = b.view(x, shape(&[B, S, heads, DR2]), "", false);
    let dt = b.t(x).dt;
    let neg = b.plain("neg", &[x2], shape(&[B, S, heads, DR2]), dt);
    let rot = b.plain("cat", &[neg, x], full, dt);
    let rs = b.mul(rot, sin);
    b.add(xc, rs)
}

/// `DeepseekV32Indexer.forward` (under `torch.no_grad()`) on the layer's normed input `x` and
/// the query latent `q_resid` (`q_a_layernorm`'s output):
/// ```python
/// q = self.wq_b(q_resid).view(b, s, H_i, d_i)
/// q_rot, q_pass = torch.split(q, [d_r, d_i - d_r], dim=-1)
/// k = self.k_norm(self.wk(hidden_states)).unsqueeze(2)
/// k_rot, k_pass = torch.split(k, [d_r, d_i - d_r], dim=-1)
/// q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
/// q = torch.cat([q_rot, q_pass], dim=-1); k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
/// scores = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * self.softmax_scale
/// scores = F.relu(scores)
/// weights = self.weights_proj(hidden_states.to(self.weights_proj.weight.dtype)).float() * H_i**-0.5
/// index_scores = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)
/// index_scores = index_scores.masked_fill(~attention_mask, -inf)   # bool mask (SDPA)
/// index_scores = index_scores + attention_mask                     # additive mask (eager)
/// return index_scores.topk(min(index_topk, s_kv), dim=-1).indices.to(torch.int32)
/// ```
/// The first matmul broadcasts the key over the queries: `matmul` expands it to
/// `[b, s, d_i, s_kv]` and copies it (`clone`), a transient as large as `s` keys per query.
/// Every local lives until the return. Returns the int32 indices `[b, s, k_i]`.
fn indexer(b: &mut Builder, w: &IndexerW, x: Tid, q_resid: Tid, sh: &Shared, mask: Tid) -> Tid {
    let grad = std::mem::replace(&mut b.no_grad, true);
    let (module, part) = (b.module, b.part);
    b.part = Part::AttentionCore;
    b.module = "self_attn.indexer.wq_b";
    let q = linear(b, q_resid, w.wq_b, shape(&[B, S, Dim::X(X::IdxQ)]));
    b.module = "self_attn.indexer.wk";
    let kw = linear(b, x, w.wk, shape(&[B, S, DI]));
    b.module = "self_attn.indexer.k_norm";
    let k = layer_norm(b, kw, w.k_norm, w.k_norm_bias);
    b.module = "self_attn.indexer";
    let q_rot = b.view(q, shape(&[B, S, HI, DR]), "", false);
    let k_rot = b.view(k, shape(&[B, S, Dim::N(1), DR]), "", false);
    let (qe, ke) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) => (rope(b, q_rot, cos, sin, HI), rope(b, k_rot, cos, sin, Dim::N(1))),
        _ => (q_rot, k_rot),
    };
    let qd = b.promote(qe, q, qe);
    let qc = b.plain("cat", &[qe, q], shape(&[B, S, HI, DI]), qd);
    let kd = b.promote(ke, k, ke);
    let kc = b.plain("cat", &[ke, k], shape(&[B, S, Dim::N(1), DI]), kd);
    // `q.float()`, `k.transpose(-1, -2).float()` (copies unless already fp32), then autocast's
    // casts of matmul's operands.
    let qf = b.to_copy(qc, Dt::F32);
    let kf = b.to_copy(kc, Dt::F32);
    let (qm, km) = (b.autocast_in(qf), b.autocast_in(kf));
    let mdt = b.t(qm).dt;
    // `tensor2.expand(b, s, d_i, s_kv).reshape(b·s, d_i, s_kv)` copies unless b = 1 (a unit
    // batch dim merges with the stride-0 query dim: a view).
    let kx = if b.c.n(Q::B) > 1 { b.plain("clone", &[km], shape(&[B, S, DI, SK]), mdt) } else { km };
    // The operands' copies go when matmul returns.
    let bmm = b.plain("bmm", &[qm, kx, km], shape(&[B, S, HI, SK]), mdt);
    let sc = b.plain("mul", &[bmm], shape(&[B, S, HI, SK]), mdt);
    let relu = b.plain("relu", &[sc], shape(&[B, S, HI, SK]), mdt);
    b.module = "self_attn.indexer.weights_proj";
    let wp = linear(b, x, w.weights_proj, shape(&[B, S, HI]));
    b.module = "self_attn.indexer";
    let wf = b.to_copy(wp, Dt::F32);
    let wts = b.plain("mul", &[wf], shape(&[B, S, HI]), Dt::F32);
    let wm = b.autocast_in(wts);
    let rdt = b.promote(wm, relu, relu);
    let idx = b.plain("bmm", &[wm, relu], shape(&[B, S, SK]), rdt);
    let scored = if b.t(mask).dt == Dt::Bool {
        let inv = b.plain("bitwise_not", &[mask], shape(&[B, S, SK]), Dt::Bool);
        b.plain("masked_fill", &[idx, inv], shape(&[B, S, SK]), rdt)
    } else {
        let dt = b.promote(idx, mask, idx);
        b.plain("add", &[idx, mask], shape(&[B, S, SK]), dt)
    };
    let sdt = b.t(scored).dt;
    let outs = [b.out(shape(&[B, S, TOPK]), sdt, false), b.out(shape(&[B, S, TOPK]), Dt::I64, false)];
    let r = b.plain_n("topk", &[scored], &outs);
    let top = b.plain("_to_copy", &[r[1]], shape(&[B, S, TOPK]), Dt::I32);
    for t in [qc, qe, q, kc, ke, k, relu, wts, scored] {
        b.hold(t);
    }
    b.module = module;
    b.part = part;
    b.no_grad = grad;
    top
}

/// The attention mask of a DSA layer (`DeepseekV32Attention.forward`, eager and SDPA):
/// ```python
/// topk_indices = self.indexer(hidden_states, q_resid, position_embeddings, attention_mask[:, 0, :, :], ...)
/// index_mask = topk_indices.new_ones((b, s, s_kv), dtype=torch.bool).scatter(-1, topk_indices.long(), False).unsqueeze(1)
/// attention_mask = attention_mask & ~index_mask                               # bool (SDPA)
/// attention_mask = attention_mask.masked_fill(index_mask, torch.finfo(dtype).min)  # additive (eager)
/// ```
/// Returns the mask `[b, 1, s, s_kv]` and the locals that live until the attention returns
/// (the indices, the index mask, the mask).
pub fn sparse_mask(b: &mut Builder, w: &IndexerW, x: Tid, q_resid: Tid, sh: &Shared) -> Option<(Tid, [Tid; 3])> {
    let mask = sh.mask?;
    let top = indexer(b, w, x, q_resid, sh, mask);
    let ones = b.plain("new_ones", &[top], shape(&[B, S, SK]), Dt::Bool);
    let long = b.plain("_to_copy", &[top], shape(&[B, S, TOPK]), Dt::I64);
    let index_mask = b.plain("scatter", &[ones, long], shape(&[B, S, SK]), Dt::Bool);
    let (ms, mdt) = (b.shape(mask), b.t(mask).dt);
    let out = if mdt == Dt::Bool {
        let inv = b.plain("bitwise_not", &[index_mask], shape(&[B, S, SK]), Dt::Bool);
        b.plain("bitwise_and", &[mask, inv], shape(&[B, S, SK]), Dt::Bool)
    } else {
        b.plain("masked_fill", &[mask, index_mask], ms, mdt)
    };
    Some((out, [top, index_mask, out]))
}

/// A bool attention mask as SDPA takes it (`convert_boolean_attn_mask`): two scalars and
/// `where(mask, 0, -inf)` `[b, 1, s, s_kv]` in the query's dtype, before any kernel runs.
pub fn sdpa_float_mask(b: &mut Builder, mask: Tid, q: Tid) -> Tid {
    let dt = b.t(q).dt;
    let zero = b.plain("scalar_tensor", &[], Shape::scalar(), dt);
    let inf = b.plain("scalar_tensor", &[], Shape::scalar(), dt);
    b.plain("where", &[mask, zero, inf], shape(&[B, S, SK]), dt)
}
