//! Phi-3 (`modeling_phi3.py`): Llama's layer with a fused `qkv_proj` sliced into q, k, v, a
//! RoPE that concatenates the rotated and passed-through dims, and a fused `gate_up_proj`
//! chunked into the gated MLP's halves.

use super::super::blocks::shapes::{heads, heads_bshd, tok};
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Group, Shape, Split, Tid, X};
use super::common::{rotary_dims, Kind, Params, Shared};
use super::llama::{eager_core_with, rms_norm, rope_cat, sdpa_core_copy};
use super::modeling::Modeling;
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::Attention;
use crate::estimator::model::{Linear, ModelSpec};
use crate::estimator::step::part::Part;

fn heads4(h: Q) -> Shape {
    Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(h), Dim::Q(Q::D)], Split::Tp)
}

/// `Phi3Attention.forward`.
fn attention(b: &mut Builder, w: [Option<Tid>; 2], spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let [wo, wqkv] = w;
    let eager = attn == Attention::Eager;
    b.part = Part::AttentionInputs;
    b.module = "self_attn.qkv_proj";
    let qkv_shape = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Qkv, Dim::Q(Q::D)], Split::Tp);
    let qkv = match wqkv {
        Some(w) => b.proj(x, w, None, qkv_shape, Linear::Qkv),
        None => x,
    };
    b.module = "self_attn";
    b.part = Part::AttentionCore;
    let q = b.slice(qkv, heads4(Q::A));
    let k = b.slice(qkv, heads4(Q::KV));
    let v = b.slice(qkv, heads4(Q::KV));
    let t = |b: &mut Builder, x: Tid, h: Q, clone_bw: bool| {
        let xv = b.view(x, heads_bshd(h), "ViewBackward0", clone_bw);
        b.view(xv, heads(h), "TransposeBackward0", false)
    };
    let qt = t(b, q, Q::A, true);
    let kt = t(b, k, Q::KV, true);
    let vt = t(b, v, Q::KV, eager);
    let rot = if rotary_dims(spec) == spec.head_dim { Dim::Q(Q::D) } else { Dim::X(X::DRot) };
    let (qe, ke) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) => rope_cat(b, qt, kt, cos, sin, rot),
        _ => (qt, kt),
    };
    // RoPE's `cat` leaves q and k contiguous [b, heads, s, d].
    let (o, weights) =
        if eager { eager_core_with(b, spec, qe, ke, vt, sh.mask, true) } else { (sdpa_core_copy(b, qe, ke, vt, true), None) };
    b.part = Part::AttentionInputs;
    b.module = "self_attn.o_proj";
    let out = match wo {
        Some(w) => b.proj(o, w, None, tok(Q::H), Linear::O),
        None => o,
    };
    for t in [qe, ke, vt, qkv] {
        b.hold(t);
    }
    (out, weights)
}

/// `Phi3MLP.forward`: `gate, up = gate_up_proj(x).chunk(2, -1)`,
/// `down_proj(up * activation_fn(gate))`.
fn mlp(b: &mut Builder, w: [Option<Tid>; 2], x: Tid) -> Tid {
    let [wgu, wd] = w;
    b.part = Part::Mlp;
    b.module = "mlp.gate_up_proj";
    let gu = match wgu {
        Some(w) => b.proj(x, w, None, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::N(2), Dim::Q(Q::F)], Split::Tp), Linear::GateUp),
        None => x,
    };
    b.module = "mlp";
    let (g, u) = b.chunk2(gu, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::F)], Split::Tp));
    b.module = "mlp.activation_fn";
    let a = b.unary("silu", "SiluBackward0", g, Keep::Input, "silu_backward");
    b.module = "mlp";
    let m = b.mul(u, a);
    b.module = "mlp.down_proj";
    let y = match wd {
        Some(w) => b.proj(m, w, None, tok(Q::H), Linear::Down),
        None => m,
    };
    // `gate` (a view of gate_up's output) is a local to the return.
    b.hold(g);
    y
}

/// `Phi3DecoderLayer.forward` (Llama's, with no-op residual dropouts).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    let _ = kind;
    b.group = Group::All;
    // Registration order: self_attn (o_proj, then qkv_proj), mlp (gate_up_proj, down_proj),
    // input_layernorm, post_attention_layernorm.
    let aw = [p.w(b, "layers.*.attn.o_proj.weight"), p.w(b, "layers.*.attn.qkv_proj.weight")];
    let mw = [p.w(b, "layers.*.mlp.gate_up_proj.weight"), p.w(b, "layers.*.mlp.down_proj.weight")];
    let n1w = p.w(b, "layers.*.norm.weight");
    let n2w = p.w(b, "layers.*.norm.weight");
    b.module = "input_layernorm";
    b.part = Part::Norms;
    let n1 = rms_norm(b, x, n1w);
    let (a, weights) = attention(b, aw, spec, n1, sh, attn);
    b.hold(n1);
    b.module = "resid_attn_dropout";
    b.part = Part::Dropout;
    let a = b.dropout(a);
    b.module = "";
    let h = b.add(x, a);
    b.module = "post_attention_layernorm";
    b.part = Part::Norms;
    let n2 = rms_norm(b, h, n2w);
    let m = mlp(b, mw, n2);
    b.hold(n2);
    b.module = "resid_mlp_dropout";
    b.part = Part::Dropout;
    let m = b.dropout(m);
    b.module = "";
    let y = b.add(h, m);
    b.hold(h);
    if let Some(w) = weights {
        b.hold(w);
    }
    y
}

/// Phi-3 (`modeling_phi3.py`, also Phi-4): Llama with fused `qkv_proj` and `gate_up_proj`,
/// partial RoPE by slicing, and residual dropout.
pub struct Phi3;
impl Modeling for Phi3 {
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
}
