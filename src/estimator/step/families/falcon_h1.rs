//! Falcon-H1 (`models/falcon_h1/modeling_falcon_h1.py`, transformers 5.24): every decoder layer
//! (`FalconH1DecoderLayer.forward`) runs the Mamba-2 mixer (`FalconH1Mixer`, [`super::mamba2`])
//! and Llama's GQA attention side by side on one input norm, each on its own scaled copy of it
//! (`hidden_states * ssm_in_multiplier`, `hidden_states * attention_in_multiplier`), sums their
//! scaled outputs into the residual, then `pre_ff_layernorm` and the SwiGLU `feed_forward`
//! (`up_proj(x) * act_fn(gate_proj(x) * gate_multiplier)`: the same saved bytes as Llama's).
//! The model's forward is Llama's (causal mask, rotary tables, `final_layernorm`).

use super::super::ir::{Builder, Tid};
use super::common::{AttnW, Kind, MlpW, Norm, Params, Rms, Shared};
use super::llama::{attention, decoder_layer, mlp};
use super::mamba2::{gated_out, mixer_scan, MambaW};
use super::modeling::Modeling;
use crate::estimator::config::Attention;
use crate::estimator::model::ModelSpec;
use crate::estimator::step::part::Part;

/// One decoder layer (`FalconH1DecoderLayer.forward`).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    // Parameters in registration order: feed_forward, mamba, self_attn, input_layernorm,
    // pre_ff_layernorm.
    let mw = MlpW::new(b, p);
    let sw = MambaW::new(b, p);
    let aw = AttnW::new(b, p);
    let mixers = |b: &mut Builder, n: Tid| {
        let (y, gate, locals) = mixer_scan(b, &sw, spec, n);
        let mo = gated_out(b, &sw, y, gate, locals);
        b.module = "mamba";
        let mo = b.mul_scalar(mo);
        b.module = "self_attn";
        b.part = Part::AttentionInputs;
        let xa = b.mul_scalar(n);
        let (ao, weights) = attention(b, &aw, spec, xa, sh, attn);
        b.module = "self_attn";
        let ao = b.mul_scalar(ao);
        b.module = "";
        (b.add(mo, ao), weights)
    };
    decoder_layer(b, p, x, Norm::Rms(Rms::Llama), mixers, |b, n| mlp(b, &mw, n))
}

/// Falcon-H1: Llama's model forward around [`layer`].
pub struct FalconH1;
impl Modeling for FalconH1 {
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        let _ = kind;
        layer(b, p, spec, x, sh, attn)
    }
}
