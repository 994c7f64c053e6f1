//! GPT-2 (`modeling_gpt2.py`): LayerNorm, Conv1D projections (`addmm` with `[in, out]`
//! weights), a fused `c_attn` split into q, k, v, `gelu_new` written as tensor ops, learned
//! positions, a tied LM head.

use super::super::blocks::shapes::{heads, heads_bshd, scores, tok};
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Group, Shape, Split, Tid};
use super::common::Kind;
use super::common::{Params, Shared};
use super::llama;
use super::modeling::Modeling;
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::Attention;
use crate::estimator::model::{Linear, ModelSpec};
use crate::estimator::step::part::Part;

/// `NewGELUActivation.forward`, tensor op by tensor op:
/// `0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))`.
/// Keeps x (pow), `0.5·x`, `tanh(·)` and `1 + tanh(·)`.
pub fn gelu_new(b: &mut Builder, x: Tid) -> Tid {
    let half = b.mul_scalar(x);
    let cube = b.pow(x);
    let c3 = b.mul_scalar(cube);
    let inner = b.add(x, c3);
    let scaled = b.mul_scalar(inner);
    let th = b.unary("tanh", "TanhBackward0", scaled, Keep::Output, "tanh_backward");
    let one = b.add_scalar(th);
    let y = b.mul(half, one);
    b.hold(x);
    y
}

fn lin_shape(w: Dim) -> Shape {
    Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), w], Split::Tp)
}

/// `GPT2Attention.forward` (self-attention): `c_attn` → `split` → `view(…, -1, d).transpose`
/// (k and v first, then q), the attention core, `c_proj`. Returns the output and the eager
/// attention weights.
fn attention(b: &mut Builder, p: &Params, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let wqkv = p.w(b, "layers.*.attn.qkv_proj.weight");
    let bqkv = p.w(b, "layers.*.attn.qkv_proj.bias");
    let wo = p.w(b, "layers.*.attn.o_proj.weight");
    let bo = p.w(b, "layers.*.attn.o_proj.bias");
    let eager = attn == Attention::Eager;
    b.part = Part::AttentionInputs;
    b.module = "attn.c_attn";
    let qkv_shape = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Qkv, Dim::Q(Q::D)], Split::Tp);
    let qkv = match wqkv {
        Some(w) => b.proj(x, w, bqkv, qkv_shape, Linear::Qkv),
        None => x,
    };
    b.module = "attn";
    b.part = Part::AttentionCore;
    let one = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::A), Dim::Q(Q::D)], Split::Tp);
    let (q, k, v) = b.split3(qkv, one);
    // Eager's bmm gradients come back laid out [b, a, s, d]: the head views of q and v copy
    // them (k's arrives transposed twice); SDPA's CPU kernel returns them [b, s, a, d].
    let kt = {
        let kv = b.view(k, heads_bshd(Q::KV), "ViewBackward0", false);
        b.view(kv, heads(Q::KV), "TransposeBackward0", false)
    };
    let vt = {
        let vv = b.view(v, heads_bshd(Q::KV), "ViewBackward0", eager);
        b.view(vv, heads(Q::KV), "TransposeBackward0", false)
    };
    let qt = {
        let qv = b.view(q, heads_bshd(Q::A), "ViewBackward0", eager);
        b.view(qv, heads(Q::A), "TransposeBackward0", false)
    };
    let (region, qt, kt, vt) = llama::selective_begin(b, qt, kt, vt);
    let (o, weights) = if eager {
        // eager_attention_forward (GPT-2's): matmul copies q and kᵀ, softmax in the model dtype.
        let qc = b.fold(qt, heads(Q::A));
        let kc = b.fold(kt, heads(Q::A));
        let sc = b.bmm(qc, kc, scores());
        let sm = b.mul_scalar(sc);
        let sa = match sh.mask {
            Some(m) => b.add(sm, m),
            None => sm,
        };
        let pr = b.unary("_softmax", "SoftmaxBackward0", sa, Keep::Output, "_softmax_backward_data");
        let pr = b.dropout(pr);
        let vc = b.fold(vt, heads(Q::A));
        let o = b.bmm(pr, vc, heads(Q::A));
        let o = b.view(o, heads(Q::A), "UnsafeViewBackward0", true);
        let ot = b.view(o, heads_bshd(Q::A), "TransposeBackward0", false);
        let oc = b.copy(ot, heads_bshd(Q::A));
        (b.view(oc, one, "ViewBackward0", false), Some(pr))
    } else {
        (llama::sdpa_core(b, qt, kt, vt), None)
    };
    llama::selective_end(b, region);
    b.part = Part::AttentionInputs;
    b.module = "attn.c_proj";
    let out = match wo {
        Some(w) => b.proj(o, w, bo, tok(Q::H), Linear::O),
        None => o,
    };
    b.module = "attn.resid_dropout";
    b.part = Part::Dropout;
    let out = b.dropout(out);
    for t in [qt, kt, vt] {
        b.hold(t);
    }
    (out, weights)
}

/// `GPT2MLP.forward`: `c_fc` → `gelu_new` → `c_proj`.
fn mlp(b: &mut Builder, w: [Option<Tid>; 4], x: Tid) -> Tid {
    let [wfc, bfc, wpr, bpr] = w;
    b.part = Part::Mlp;
    b.module = "mlp.c_fc";
    let h = match wfc {
        Some(w) => b.proj(x, w, bfc, lin_shape(Dim::Q(Q::F)), Linear::Up),
        None => x,
    };
    b.module = "mlp.act";
    let a = gelu_new(b, h);
    b.module = "mlp.c_proj";
    let y = match wpr {
        Some(w) => b.proj(a, w, bpr, tok(Q::H), Linear::Down),
        None => a,
    };
    b.module = "mlp.dropout";
    b.part = Part::Dropout;
    b.dropout(y)
}

/// `GPT2Block.forward`: `ln_1` → attention → residual → `ln_2` → MLP → residual.
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    let _ = spec;
    b.group = Group::All;
    // Registration order: ln_1, attn (c_attn, c_proj), ln_2, mlp (c_fc, c_proj).
    let ln1 = (p.w(b, "layers.*.norm.weight"), p.w(b, "layers.*.norm.bias"));
    b.module = "ln_1";
    b.part = Part::Norms;
    // The attention's weights are created inside (registered right after ln_1).
    let n1 = b.layer_norm(x, ln1.0, ln1.1);
    let (a, weights) = attention(b, p, n1, sh, attn);
    let ln2 = (p.w(b, "layers.*.norm.weight"), p.w(b, "layers.*.norm.bias"));
    let mw = [
        p.w(b, "layers.*.mlp.up_proj.weight"),
        p.w(b, "layers.*.mlp.up_proj.bias"),
        p.w(b, "layers.*.mlp.down_proj.weight"),
        p.w(b, "layers.*.mlp.down_proj.bias"),
    ];
    b.module = "";
    let h = b.add(a, x);
    // `attn_output, _ = self.attn(hidden_states)` leaves `hidden_states` (ln_1's output) bound
    // until the residual add rebinds it; the same for ln_2's around the MLP.
    b.hold(n1);
    b.module = "ln_2";
    b.part = Part::Norms;
    let n2 = b.layer_norm(h, ln2.0, ln2.1);
    let m = mlp(b, mw, n2);
    b.module = "";
    let y = b.add(h, m);
    b.hold(n2);
    // `attn_output` and `feed_forward_hidden_states` are the block's locals to its return.
    b.hold(h);
    b.hold(a);
    b.hold(m);
    if let Some(w) = weights {
        b.hold(w);
    }
    y
}

/// `GPT2Model.forward` before the blocks: `wte(input_ids) + wpe(position_ids)`, the mask.
pub fn embed(b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
    let _ = spec;
    b.part = Part::Embedding;
    b.module = "transformer.wte";
    let wte = p.w(b, "embed_tokens.weight");
    let wpe = p.w(b, "embed_positions.weight");
    let te = match wte {
        Some(w) => llama::embedding(b, ids, w),
        None => b.plain("embedding", &[ids], tok(Q::H), Dt::Resid),
    };
    b.module = "transformer";
    let s1 = Shape::new(&[Dim::Q(Q::S)], Split::None);
    let ar = b.plain("arange", &[], s1, Dt::I64);
    let pos = b.plain("add", &[ar], s1, Dt::I64);
    b.module = "transformer.wpe";
    let pe_shape = Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::H)], Split::Sp);
    let pe = match wpe {
        Some(w) => {
            use super::super::ir::{B, S};
            let rg = b.rg(w);
            let out = b.out(pe_shape, Dt::Resid, rg);
            let g = b.grad_bytes(w);
            let dtype = b.t(w).dtype;
            let bw: &[B] =
                if rg { &[B::Alloc { bytes: g, dtype, op: "embedding_dense_backward" }, B::Grad { input: 1, temp: 0 }] } else { &[] };
            b.op("embedding", "EmbeddingBackward0", &[pos, w], &[out], &[S::In(0)], bw)[0]
        }
        None => b.plain("embedding", &[pos], pe_shape, Dt::Resid),
    };
    b.module = "transformer";
    let x0 = b.add(te, pe);
    b.module = "transformer.drop";
    b.part = Part::Dropout;
    let x0 = b.dropout(x0);
    b.part = Part::Embedding;
    b.module = "transformer";
    let (_pos2, mask) = llama::mask_only(b, pos, attn);
    (
        x0,
        Shared {
            cos: None,
            sin: None,
            pos: None,
            mask,
            mask_local: None,
            emb_w: if spec.tied { wte } else { None },
            locals: [Some(te), Some(pe)],
            cos_local: None,
            sin_local: None,
        },
    )
}

/// `transformer.ln_f`.
pub fn final_norm(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid) -> Tid {
    let _ = spec;
    b.module = "transformer.ln_f";
    b.part = Part::Head;
    let w = p.w(b, "norm.weight");
    let bias = p.w(b, "norm.bias");
    b.layer_norm(x, w, bias)
}

/// GPT-2 (`modeling_gpt2.py`): learned positions summed into the embedding, LayerNorm, fused
/// `Conv1D` attention, its own MLP and `ln_f`.
pub struct Gpt2;
impl Modeling for Gpt2 {
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        embed(b, p, spec, ids, attn)
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
    fn final_norm(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid) -> Tid {
        final_norm(b, p, spec, x)
    }
    fn x0_is_local(&self) -> bool {
        false
    }
    fn shares_positions(&self) -> bool {
        false
    }
}
