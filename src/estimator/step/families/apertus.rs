//! Apertus (`models/apertus/modeling_apertus.py`, transformers 5.24): Llama's pre-norm layer
//! (`attention_layernorm`, `feedforward_layernorm`) with q/k norms over each head on the
//! transposed `[b, heads, s, d]` views (`ApertusAttention.forward`: `self.q_norm(query_states)`
//! after the transpose, Gemma-3's place, [`HeadNorm::Bhsd`]) and a plain MLP,
//! `down_proj(act_fn(up_proj(x)))`, whose activation is xIELU (`hidden_act: "xielu"`:
//! `ACT2CLS["xielu"](dtype=config.dtype)`, transformers `activations.py`
//! `XIELUActivation._xielu_python` on CPU).

use super::super::blocks::shapes::{tok, tok_tp};
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Tid, B, S};
use super::common::{activation, proj_or, AttnW, Kind, Norm, Params, Rms, Shared};
use super::llama::{attention_with, decoder_layer, HeadNorm};
use super::modeling::{ConfigFile, Modeling};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{Activation, Linear, MlpKind, ModelSpec, QkNorm};
use crate::estimator::part::Part;
use crate::estimator::preset_base::{llama, Preset};
use serde_json::{Map, Value};

/// The MLP's parameters in registration order: `up_proj`, `down_proj`, then xIELU's `alpha_p`
/// and `alpha_n`.
struct ApertusMlpW {
    up: Option<Tid>,
    down: Option<Tid>,
    alpha: Option<(Tid, Tid)>,
}

impl ApertusMlpW {
    fn new(b: &mut Builder, p: &Params) -> ApertusMlpW {
        let up = p.w(b, "layers.*.mlp.up_proj.weight");
        let down = p.w(b, "layers.*.mlp.down_proj.weight");
        let ap = p.w(b, "layers.*.mlp.act_fn.alpha_p");
        let an = p.w(b, "layers.*.mlp.act_fn.alpha_n");
        ApertusMlpW { up, down, alpha: ap.zip(an) }
    }
}

/// A 0-dim buffer of xIELU (`beta`, `eps`) in the model dtype: model state, not an activation,
/// and without a gradient.
fn buffer(b: &mut Builder, p: &Params) -> Tid {
    p.make(b, 1, false, false)
}

/// `a * c` for a 0-dim tensor `c` that needs no gradient (xIELU's `self.beta * x`): the result
/// keeps `a`'s dtype (a 0-dim operand does not promote); MulBackward0 keeps `c`.
fn mul_by_buffer(b: &mut Builder, c: Tid, a: Tid) -> Tid {
    let (shape, dt) = (b.shape(a), b.t(a).dt);
    b.mul_to(c, a, shape, dt)
}

/// `torch.min(x, eps)` (`minimum` with a 0-dim tensor): x's shape and dtype; MinimumBackward0
/// keeps both inputs and makes x's gradient as `where(x == eps, grad / 2, grad)
/// .masked_fill_(x > eps, 0)`.
fn minimum(b: &mut Builder, x: Tid, eps: Tid) -> Tid {
    let (shape, dt, rg, bytes, dtype) = (b.shape(x), b.t(x).dt, b.rg(x), b.bytes(x), b.t(x).dtype);
    let mask = b.bytes_of(&shape, Dt::Bool);
    let out = b.out(shape, dt, rg);
    let bool_ = b.dtype(Dt::Bool);
    let bw: &[B] = if rg {
        &[
            B::Alloc { bytes: mask, dtype: bool_, op: "eq" },
            B::Alloc { bytes, dtype, op: "div" },
            B::Alloc { bytes, dtype, op: "where" },
            B::Free(0),
            B::Free(1),
            B::Alloc { bytes: mask, dtype: bool_, op: "gt" },
            B::Free(3),
            B::Grad { input: 0, temp: 2 },
        ]
    } else {
        &[]
    };
    b.op("minimum", "MinimumBackward0", &[x, eps], &[out], &[S::In(0), S::In(1)], bw)[0]
}

/// `a - b` of one shape (SubBackward0: `a`'s gradient passes, `b`'s is `-grad`).
fn sub(b: &mut Builder, x: Tid, y: Tid) -> Tid {
    let (shape, dt, bytes, dtype) = (b.shape(x), b.promote(x, y, x), b.bytes(y), b.t(y).dtype);
    let (rx, ry) = (b.rg(x), b.rg(y));
    let out = b.out(shape, dt, rx || ry);
    let mut bw: Vec<B> = Vec::with_capacity(3);
    if rx {
        bw.push(B::Pass { input: 0, output: 0 });
    }
    if ry {
        bw.push(B::Alloc { bytes, dtype, op: "neg" });
        bw.push(B::Grad { input: 1, temp: 0 });
    }
    b.op("sub", "SubBackward0", &[x, y], &[out], &[], &bw)[0]
}

/// `torch.where(cond, a, c)` of one shape: WhereBackward0 keeps the condition; backward
/// `where(cond, grad, 0)` for `a`, then `where(cond, 0, grad)` for `c`.
fn where_(b: &mut Builder, cond: Tid, a: Tid, c: Tid) -> Tid {
    let (shape, dt) = (b.shape(a), b.promote(a, c, a));
    let (ra, rc) = (b.rg(a), b.rg(c));
    let out = b.out(shape, dt, ra || rc);
    let mut bw: Vec<B> = Vec::with_capacity(4);
    let mut temps = 0u8;
    for (input, t, rg) in [(1u8, a, ra), (2u8, c, rc)] {
        if rg {
            bw.push(B::Alloc { bytes: b.bytes(t), dtype: b.t(t).dtype, op: "where" });
            bw.push(B::Grad { input, temp: temps });
            temps += 1;
        }
    }
    b.op("where", "WhereBackward0", &[cond, a, c], &[out], &[S::In(0)], &bw)[0]
}

/// `XIELUActivation._xielu_python(x)` (transformers 5.24 `activations.py`), tensor op by tensor
/// op, with `alpha_p`, `alpha_n` (`[1]` parameters) and the 0-dim buffers `beta`, `eps`:
/// ```python
/// alpha_p = softplus(self.alpha_p)
/// alpha_n = self.beta + softplus(self.alpha_n)
/// return torch.where(x > 0, alpha_p * x * x + self.beta * x,
///                    (torch.expm1(torch.min(x, self.eps)) - x) * alpha_n + self.beta * x)
/// ```
/// Keeps x, `alpha_p · x`, `expm1(·)` (its result), `expm1(·) − x`, the bool condition and the
/// two `[1]` scalars; a `[1]` parameter in a wider dtype than x (fp32 under autocast) makes the
/// products with it, and what adds them, that dtype.
fn xielu(b: &mut Builder, p: &Params, x: Tid, alpha_p: Tid, alpha_n: Tid) -> Tid {
    let beta = buffer(b, p);
    let eps = buffer(b, p);
    let ap = b.unary("softplus", "SoftplusBackward0", alpha_p, Keep::Input, "softplus_backward");
    let sn = b.unary("softplus", "SoftplusBackward0", alpha_n, Keep::Input, "softplus_backward");
    let an = b.add(beta, sn);
    let cond = b.plain("gt", &[x], b.shape(x), Dt::Bool);
    let t1 = b.mul(ap, x);
    let t2 = b.mul(t1, x);
    let t3 = mul_by_buffer(b, beta, x);
    let pos = b.add(t2, t3);
    let m = minimum(b, x, eps);
    let e = b.unary("expm1", "Expm1Backward0", m, Keep::Output, "mul");
    let d = sub(b, e, x);
    let n = b.mul(d, an);
    let t5 = mul_by_buffer(b, beta, x);
    let neg = b.add(n, t5);
    let y = where_(b, cond, pos, neg);
    b.hold(ap);
    b.hold(an);
    y
}

/// `ApertusMLP.forward`: `down_proj(act_fn(up_proj(x)))`, xIELU or the activation
/// `hidden_act` names.
fn mlp(b: &mut Builder, p: &Params, spec: &ModelSpec, w: &ApertusMlpW, x: Tid) -> Tid {
    b.part = Part::Mlp;
    b.module = "mlp.up_proj";
    let h = proj_or(b, x, w.up, None, tok_tp(Dim::Q(Q::F)), Linear::Up);
    b.module = "mlp.act_fn";
    let a = match w.alpha {
        Some((ap, an)) if spec.act == Activation::Xielu => xielu(b, p, h, ap, an),
        _ => activation(b, spec.act, h),
    };
    b.module = "mlp.down_proj";
    proj_or(b, a, w.down, None, tok(Q::H), Linear::Down)
}

/// `ApertusDecoderLayer.forward`: Llama's pre-norm layer ([`decoder_layer`]) with the
/// attention's per-head q/k norms after the transpose and [`mlp`].
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    // Registration order: self_attn (q, k, v, o, q_norm, k_norm), mlp (up, down, act_fn),
    // attention_layernorm, feedforward_layernorm.
    let aw = AttnW::new(b, p);
    let mw = ApertusMlpW::new(b, p);
    decoder_layer(
        b,
        p,
        x,
        Norm::Rms(Rms::Llama),
        |b, n| attention_with(b, &aw, spec, n, sh, attn, HeadNorm::Bhsd(Rms::Llama)),
        |b, n| mlp(b, p, spec, &mw, n),
    )
}

/// Apertus (see the module doc).
pub struct Apertus;
impl ConfigFile for Apertus {
    /// `ApertusConfig` (configuration_apertus.py): every size defaults to the class's (131,072
    /// tokens, 4,096 wide, 32 layers of 32 heads, 14,336 MLP, 65,536 positions), `hidden_act`
    /// `xielu`, `attention_bias` on all four projections, q/k norms over each head, untied.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = llama(
            f.size("vocab_size", 131_072)?,
            f.size("hidden_size", 4096)?,
            f.size("num_hidden_layers", 32)?,
            f.size("num_attention_heads", 32)?,
            0,
            f.size("intermediate_size", 14_336)?,
            f.uint_or("max_position_embeddings", 65_536)?,
        );
        fields::check_layers(m.layers)?;
        m.kv_heads = f.uint_or("num_key_value_heads", m.heads)?;
        m.head_dim = f.size("head_dim", m.hidden / m.heads.max(1))?;
        m.mlp = MlpKind::Plain;
        m.act = match f.string("hidden_act")? {
            None | Some("xielu") => Activation::Xielu,
            Some(_) => f.activation(&["hidden_act"], Activation::Xielu)?,
        };
        m.tied = f.flag("tie_word_embeddings", false)?;
        let bias = f.flag("attention_bias", false)?;
        m.qkv_bias = bias;
        m.o_bias = bias;
        m.qk_norm = QkNorm::Head;
        fields::with_heads(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        if s.mlp != MlpKind::Plain || s.qk_norm != QkNorm::Head || s.qkv_bias != s.o_bias || s.mlp_bias {
            return Vec::new();
        }
        let Some(mut w) = writer::llama_base("apertus", s, "hidden_act") else { return Vec::new() };
        w.set("intermediate_size", s.ffn).set("attention_bias", s.qkv_bias);
        w.done().into_iter().collect()
    }
}

impl Modeling for Apertus {
    /// Apertus-8B-2509 (swiss-ai/Apertus-8B-2509; its Instruct shares the architecture), from
    /// its `config.json` (`tests/fixtures/hf/apertus-8b-2509.json`): 131,072 tokens, 4,096
    /// wide, 32 layers of 32 query and 8 KV heads, a 21,504-wide xIELU MLP, 65,536 positions,
    /// untied. 8,053,338,176 parameters (transformers 5.24 on the meta device).
    fn presets(&self) -> Vec<Preset> {
        let m = ModelSpec {
            family: Family::Apertus,
            mlp: MlpKind::Plain,
            act: Activation::Xielu,
            qk_norm: QkNorm::Head,
            ..llama(131_072, 4096, 32, 32, 8, 21_504, 65_536)
        };
        vec![Preset::new(113, "apertus-8b-2509", "swiss-ai/Apertus-8B-2509", "Apertus", m)]
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, _kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, attn)
    }
}

#[cfg(test)]
mod tests {
    use crate::estimator::config::{Config, Precision};
    use crate::estimator::presets::preset;
    use crate::estimator::step::model::xielu_buffer_bytes;

    /// xIELU's `beta` and `eps` are 0-dim buffers in the model dtype, one pair per layer:
    /// Apertus-8B's 32 layers hold 32 × 2 × 2 = 128 bytes in bf16, 256 in fp32.
    #[test]
    fn apertus_keeps_two_scalar_buffers_per_layer_in_the_model_dtype() {
        let spec = preset("apertus-8b-2509").expect("the preset exists").spec;
        let cfg = |precision| Config { model: "apertus-8b-2509".into(), arch: spec.clone(), precision, ..Config::default() };
        assert_eq!(xielu_buffer_bytes(&cfg(Precision::Bf16)), 128);
        assert_eq!(xielu_buffer_bytes(&cfg(Precision::Fp32)), 256);
    }
}
