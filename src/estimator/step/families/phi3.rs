//! Phi-3 (`modeling_phi3.py`): Llama's layer with a fused `qkv_proj` sliced into q, k, v, a
//! RoPE that concatenates the rotated and passed-through dims, and a fused `gate_up_proj`
//! chunked into the gated MLP's halves.

use super::super::blocks::shapes::{heads_bshd, tok, tok_tp};
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Shape, Split, Tid};
use super::common::{fused_qkv, proj_or, to_heads, Kind, Norm, Params, Rms, Shared};
use super::llama::{attend_out, decoder_layer_with, rope_partial, Core, PartialRope, Residual};
use super::modeling::{ConfigFile, Modeling};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Ffn, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::LayerRule;
use crate::estimator::model::{Linear, ModelSpec};
use crate::estimator::part::Part;
use crate::estimator::preset_base::{llama, Preset};
use serde_json::{Map, Value};

/// `Phi3Attention.forward`.
fn attention(b: &mut Builder, w: [Option<Tid>; 2], spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let [wo, wqkv] = w;
    let eager = attn == Attention::Eager;
    let qkv = fused_qkv(b, x, (wqkv, None), ["self_attn.qkv_proj", "self_attn"], proj_or);
    let q = b.slice(qkv, heads_bshd(Q::A));
    let k = b.slice(qkv, heads_bshd(Q::KV));
    let v = b.slice(qkv, heads_bshd(Q::KV));
    let qt = to_heads(b, q, Q::A, true);
    let kt = to_heads(b, k, Q::KV, true);
    let vt = to_heads(b, v, Q::KV, eager);
    let (qe, ke) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) => rope_partial(b, spec, qt, kt, cos, sin, PartialRope { q_first: true, ..PartialRope::default() }),
        _ => (qt, kt),
    };
    // RoPE's `cat` leaves q and k contiguous [b, heads, s, d].
    let (out, weights) = attend_out(b, spec, [qe, ke, vt], sh, attn, Core { selective: false, ..Core::CONTIGUOUS }, (wo, None));
    b.hold(qkv);
    (out, weights)
}

/// `Phi3MLP.forward`: `gate, up = gate_up_proj(x).chunk(2, -1)`,
/// `down_proj(up * activation_fn(gate))`.
fn mlp(b: &mut Builder, w: [Option<Tid>; 2], x: Tid) -> Tid {
    let [wgu, wd] = w;
    b.part = Part::Mlp;
    b.module = "mlp.gate_up_proj";
    let gu = proj_or(b, x, wgu, None, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::N(2), Dim::Q(Q::F)], Split::Tp), Linear::GateUp);
    b.module = "mlp";
    let (g, u) = b.chunk2(gu, tok_tp(Dim::Q(Q::F)));
    b.module = "mlp.activation_fn";
    let a = b.unary("silu", "SiluBackward0", g, Keep::Input, "silu_backward");
    b.module = "mlp";
    let m = b.mul(u, a);
    b.module = "mlp.down_proj";
    let y = proj_or(b, m, wd, None, tok(Q::H), Linear::Down);
    // `gate` (a view of gate_up's output) is a local to the return.
    b.hold(g);
    y
}

/// `Phi3DecoderLayer.forward`: Llama's ([`decoder_layer_with`]) with residual dropouts
/// (`resid_attn_dropout`, `resid_mlp_dropout`; no-ops at p = 0).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    // Registration order: self_attn (o_proj, then qkv_proj), mlp (gate_up_proj, down_proj),
    // input_layernorm, post_attention_layernorm.
    let aw = [p.w(b, "layers.*.attn.o_proj.weight"), p.w(b, "layers.*.attn.qkv_proj.weight")];
    let mw = [p.w(b, "layers.*.mlp.gate_up_proj.weight"), p.w(b, "layers.*.mlp.down_proj.weight")];
    let how = Residual { dropouts: Some(["resid_attn_dropout", "resid_mlp_dropout"]), ..Residual::default() };
    let attention = |b: &mut Builder, n: Tid| attention(b, aw, spec, n, sh, attn);
    decoder_layer_with(b, p, x, Norm::Rms(Rms::Llama), how, attention, |b, n| (mlp(b, mw, n), None))
}

/// Phi-3 (`modeling_phi3.py`, also Phi-4): Llama with fused `qkv_proj` and `gate_up_proj`,
/// partial RoPE by slicing, and residual dropout.
pub struct Phi3;
impl ConfigFile for Phi3 {
    /// `Phi3Config`: Llama's keys, fused q/k/v and gate/up, residual dropout,
    /// `partial_rotary_factor`, `sliding_window` on every layer (null: none), 4,096 positions.
    fn import(&self, t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_keys(f, Ffn::Required, false, 4096)?;
        m.resid_dropout = true;
        m.fused_qkv = true;
        m.fused_gate_up = true;
        m.rotary_pct = f.rotary_pct(1.0)?;
        fields::window_on_every_layer(&mut m, f, t, None)?;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(mut w) = writer::llama_base("phi3", s, "hidden_act") else { return Vec::new() };
        w.set("intermediate_size", s.ffn)
            .set("partial_rotary_factor", writer::rotary_fraction(s))
            .set("sliding_window", writer::every_layer_window(s));
        w.done().into_iter().collect()
    }
}

impl Modeling for Phi3 {
    fn presets(&self) -> Vec<Preset> {
        let fused = |mut m: ModelSpec| {
            m.family = Family::Phi3;
            m.fused_qkv = true;
            m.fused_gate_up = true;
            m.resid_dropout = true;
            m
        };
        // Phi-3-mini-4k: a 2,047-token sliding window on every layer (`sliding_window` in its
        // config.json, passed to every layer by modeling_phi3.py).
        let mini = ModelSpec { window_layers: LayerRule::All, window: 2047, ..fused(llama(32064, 3072, 32, 32, 32, 8192, 4096)) };
        // Phi-4: Phi-3's fused layout at 14B, GQA 40/10, 100,352 vocabulary, untied.
        let phi4 = fused(llama(100_352, 5120, 40, 40, 10, 17_920, 16_384));
        vec![
            Preset::new(20, "phi-3-mini-4k-instruct", "microsoft/Phi-3-mini-4k-instruct", "Phi-3", mini),
            Preset::new(21, "phi-4", "microsoft/phi-4", "Phi-4", phi4),
        ]
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
}
