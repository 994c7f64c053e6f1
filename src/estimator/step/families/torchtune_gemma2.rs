//! `framework = torchtune`, Gemma 2: torchtune 0.6.1's `gemma2` builder
//! (`torchtune/models/gemma2/_component_builders.py`): its own `Gemma2Attention`
//! (`models/gemma2/_attention.py`: eager, q scaled in place, scores soft-capped, the causal and
//! sliding-window masks built in each forward) in a `TransformerSelfAttentionLayer` with four
//! `GemmaRMSNorm`s (`sa_norm`, `sa_scale`, `mlp_norm`, `mlp_scale`). The rest (embedding, RoPE,
//! GeGLU, `Gemma2FinalNorm`, the chunked loss) is [`super::torchtune`]'s. Measured in
//! `tests/fixtures/pytorch/frameworks/torchtune-gemma2.json`.

use super::super::blocks::shapes::{heads, heads_bshd};
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Shape, Split, Tid, B};
use super::common::{gated_mlp, head_proj, out_proj, AttnW, Gated, MlpW, Params, Shared, LLAMA_MLP};
use super::torchtune::{rope, split_weights, Decoder};
use crate::estimator::activations::ctx::Q;
use crate::estimator::model::{Linear, ModelSpec};
use crate::estimator::step::part::Part;

/// `Gemma2Attention.forward` (`torchtune/models/gemma2/_attention.py`; no KV cache, no mask
/// passed):
/// ```python
/// q = self.q_proj(x).view(b, s_x, a, d); q = self.pos_embeddings(q).transpose(1, 2)
/// k = self.k_proj(y); v = self.v_proj(y); k = k.view(b, s_y, -1, d); k = self.pos_embeddings(k)
/// k = k.view(b, s_y, kv, 1, d); v = v.view(…)
/// if a != kv: k = k.expand(b, s_y, kv, q_per_kv, d); v = v.expand(…)
/// k = k.reshape(b, s_y, -1, d).transpose(1, 2); v = v.reshape(…).transpose(1, 2)   # copies
/// q.mul_(self.scaling)
/// output = torch.matmul(q, k.transpose(2, 3))
/// mask = torch.tril(torch.ones(size=(s_x, s_x), dtype=torch.bool))
/// mask = torch.where(mask.logical_not(), -2.3819763e38, 0)                       # fp32 [s, s]
/// if self.sliding_window_size is not None:
///     all_ones = torch.ones_like(mask)
///     sliding_mask = torch.triu(all_ones, -w + 1) * torch.tril(all_ones, w - 1)
///     mask = torch.where(sliding_mask == 1, mask, -2.3819763e38)
/// output = output / cap; output = torch.tanh(output); output = output * cap
/// output = output + mask                                   # fp32: the mask promotes bf16 scores
/// output = F.softmax(output.float(), dim=-1).type_as(q)
/// output = torch.matmul(output, v)
/// return self.output_proj(output.transpose(1, 2).contiguous().view(b, s_x, -1))
/// ```
/// q is scaled in place (nothing allocated; its backward a scaled gradient); matmul copies the
/// transposed q, k and v to fold them (each a second copy of the repeated k and v).
fn attention(b: &mut Builder, w: &AttnW, x: Tid, sh: &Shared, sliding: bool) -> (Tid, Option<Tid>) {
    let qy = head_proj(b, x, w.wq, w.bq, Q::A, "attn.q_proj", Linear::Q);
    b.module = "attn";
    let q = b.view(qy, heads_bshd(Q::A), "ViewBackward0", false);
    let q = match sh.cos {
        Some(c) => rope(b, q, c),
        None => q,
    };
    let qt = b.view(q, heads(Q::A), "TransposeBackward0", false);
    let ky = head_proj(b, x, w.wk, w.bk, Q::KV, "attn.k_proj", Linear::K);
    let vy = head_proj(b, x, w.wv, w.bv, Q::KV, "attn.v_proj", Linear::V);
    b.module = "attn";
    let k = b.view(ky, heads_bshd(Q::KV), "ViewBackward0", false);
    let k = match sh.cos {
        Some(c) => rope(b, k, c),
        None => k,
    };
    let v = b.view(vy, heads_bshd(Q::KV), "ViewBackward0", false);
    b.part = Part::AttentionCore;
    let gqa = b.c.n(Q::KV) != b.c.n(Q::A);
    // `expand(…).reshape(b, s, a, d)`: a copy whose gradient is summed over the repeats.
    let repeat = |b: &mut Builder, t: Tid| -> Tid {
        if !gqa {
            return b.view(t, heads_bshd(Q::A), "ViewBackward0", false);
        }
        let (bytes, dtype, rg) = (b.bytes(t), b.t(t).dtype, b.rg(t));
        let out = b.out(heads_bshd(Q::A), b.t(t).dt, rg);
        let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "sum" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
        b.op("clone", "ExpandBackward0", &[t], &[out], &[], bw)[0]
    };
    let kr = repeat(b, k);
    let vr = repeat(b, v);
    let kt = b.view(kr, heads(Q::A), "TransposeBackward0", false);
    let vt = b.view(vr, heads(Q::A), "TransposeBackward0", false);
    // `q.mul_(self.scaling)`: in place, MulBackward1 scales the gradient.
    let (qb, qd) = (b.bytes(qt), b.t(qt).dtype);
    let qo = b.view_out(qt, heads(Q::A));
    let qs =
        b.op("mul_", "MulBackward1", &[qt], &[qo], &[], &[B::Alloc { bytes: qb, dtype: qd, op: "mul" }, B::Grad { input: 0, temp: 0 }])[0];
    let qc = b.fold(qs, heads(Q::A));
    let kc = b.fold(kt, heads(Q::A));
    let sc = b.bmm(qc, kc, super::super::blocks::shapes::scores());
    // The mask, built in each forward: bool, then fp32 `[s, s]` (no gradient).
    let ss = Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None);
    let ones = b.plain("ones", &[], ss, Dt::Bool);
    let tril = b.plain("tril", &[ones], ss, Dt::Bool);
    let not = b.plain("logical_not", &[tril], ss, Dt::Bool);
    let mut mask = b.plain("where", &[not], ss, Dt::F32);
    if sliding {
        let all = b.plain("ones_like", &[mask], ss, Dt::F32);
        let up = b.plain("triu", &[all], ss, Dt::F32);
        let lo = b.plain("tril", &[all], ss, Dt::F32);
        let sw = b.plain("mul", &[up, lo], ss, Dt::F32);
        let eq = b.plain("eq", &[sw], ss, Dt::Bool);
        mask = b.plain("where", &[eq, mask], ss, Dt::F32);
        b.hold(all);
        b.hold(sw);
    }
    let dv = b.unary("div", "DivBackward1", sc, Keep::Nothing, "div");
    let th = b.unary("tanh", "TanhBackward0", dv, Keep::Output, "tanh_backward");
    let cap = b.mul_scalar(th);
    let sa = b.add(cap, mask);
    let s32 = b.to_copy(sa, Dt::F32);
    let pr = b.unary("_softmax", "SoftmaxBackward0", s32, Keep::Output, "_softmax_backward_data");
    let pc = b.to_copy(pr, b.t(qt).dt);
    let vc = b.fold(vt, heads(Q::A));
    let o = b.bmm(pc, vc, heads(Q::A));
    let o = b.view(o, heads(Q::A), "UnsafeViewBackward0", true);
    let ot = b.view(o, heads_bshd(Q::A), "TransposeBackward0", false);
    let oc = b.copy(ot, heads_bshd(Q::A));
    // The function's locals go at its return: the repeated k and v, the mask.
    b.hold(kr);
    b.hold(vr);
    b.hold(mask);
    let out = out_proj(b, oc, w.wo, w.bo, "attn.output_proj");
    (out, None)
}

/// `TransformerSelfAttentionLayer.forward` with Gemma 2's four norms:
/// ```python
/// h = self.sa_norm(x)
/// attn_out = self.attn(h, h, mask=mask, input_pos=input_pos)
/// h = self.sa_scale(attn_out) + x
/// mlp_out = self.mlp(self.mlp_norm(h))
/// return h + self.mlp_scale(mlp_out)
/// ```
/// The sliding window is on the even layers (`layer_idx % 2 == 0`), as transformers' Gemma 2
/// has it (the layer's view says which).
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, code: &Decoder) -> Tid {
    let (aw, mw) = if spec.fused_qkv || spec.fused_gate_up { split_weights(b, p, spec) } else { (AttnW::new(b, p), MlpW::new(b, p)) };
    let norm = code.norm;
    b.group = super::super::ir::Group::All;
    let nw: Vec<_> = (0..4).map(|_| norm.weights(b, p, super::common::LAYER_NORM)).collect();
    let run = |b: &mut Builder, i: usize, module: &'static str, x: Tid| {
        b.module = module;
        b.part = Part::Norms;
        norm.run(b, x, nw[i])
    };
    let h = run(b, 0, "sa_norm", x);
    let (a, _) = attention(b, &aw, h, sh, sh.sliding);
    let a2 = run(b, 1, "sa_scale", a);
    b.module = "";
    let h2 = b.add(a2, x);
    b.hold(h);
    let n2 = run(b, 2, "mlp_norm", h2);
    b.part = Part::Mlp;
    let m = gated_mlp(b, &mw, n2, &Gated { act: code.act, ..LLAMA_MLP });
    let m2 = run(b, 3, "mlp_scale", m);
    b.module = "";
    let y = b.add(h2, m2);
    b.hold(m);
    b.hold(h2);
    y
}
