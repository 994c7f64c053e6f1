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
use super::mamba2::{gated_out, mixer_fused, mixer_scan, ssm_keys, write_ssm_keys, MambaW};
use super::modeling::{ConfigFile, Modeling};
use crate::estimator::config::Attention;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::ModelSpec;
use crate::estimator::model::Ssm;
use crate::estimator::part::Part;
use crate::estimator::preset_base::{llama, with_head_dim, Preset};
use serde_json::{Map, Value};

/// One decoder layer (`FalconH1DecoderLayer.forward`).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    // Parameters in registration order: feed_forward, mamba, self_attn, input_layernorm,
    // pre_ff_layernorm.
    let mw = MlpW::new(b, p);
    let sw = MambaW::new(b, p);
    let aw = AttnW::new(b, p);
    let mixers = |b: &mut Builder, n: Tid| {
        let mo = if b.c.cuda {
            mixer_fused(b, &sw, spec, n)
        } else {
            let (y, gate, locals) = mixer_scan(b, &sw, spec, n);
            gated_out(b, &sw, y, gate, locals)
        };
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
impl ConfigFile for FalconH1 {
    /// `configuration_falcon_h1.py` `FalconH1Config`: Llama's sizes, `mamba_d_ssm` (default:
    /// `mamba_expand` × hidden) = H·P, `mamba_d_head` "auto" = `mamba_d_ssm / mamba_n_heads`,
    /// biases by `attention_bias`, `mlp_bias`, `mamba_conv_bias`, `mamba_proj_bias` and
    /// `projectors_bias`, the gated norm by `mamba_rms_norm`.
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_like(
            f,
            fields::Dims {
                vocab: 128_000,
                hidden: 4096,
                layers: 32,
                heads: 32,
                kv_heads: Some(8),
                head_dim: None,
                ffn: 14_336,
                max_pos: 8192,
                tied: false,
            },
        )?;
        m.qkv_bias = f.flag("attention_bias", false)?;
        m.o_bias = m.qkv_bias;
        m.mlp_bias = f.flag("mlp_bias", false)?;
        let expand = f.uint_or("mamba_expand", 2)?;
        let inner = f.uint("mamba_d_ssm")?.unwrap_or(expand * m.hidden);
        let own = Ssm { out_bias: f.flag("projectors_bias", false)?, gated_norm: f.flag("mamba_rms_norm", false)?, mup: true, ..Ssm::NONE };
        m.ssm = ssm_keys(f, inner, "`mamba_d_ssm`", own)?;
        m.ssm_dtype = f.state_dtype("mamba_ssm_dtype")?;
        Ok(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let Some(act) = writer::act_name(s.act) else { return Vec::new() };
        let m = s.ssm;
        let mut w = writer::Writer::new("falcon_h1");
        writer::llama_sizes(&mut w, s);
        w.set("hidden_act", act)
            .set("intermediate_size", s.ffn)
            .set("attention_bias", s.qkv_bias)
            .set("mlp_bias", s.mlp_bias)
            .set("mamba_d_ssm", m.inner())
            .set("projectors_bias", m.out_bias)
            .set("mamba_rms_norm", m.gated_norm);
        write_ssm_keys(&mut w, &m);
        super::mamba2::write_ssm_dtype(&mut w, s);
        w.done().into_iter().collect()
    }
}

impl Modeling for FalconH1 {
    fn presets(&self) -> Vec<Preset> {
        // Falcon-H1-0.5B-Instruct: 36 layers of h 1024, 8 query / 2 KV heads of 64, SwiGLU 2048,
        // Mamba-2 of 24 heads × 64 with a 128-state, one group, chunk 128; untied.
        let spec = ModelSpec {
            family: Family::FalconH1,
            ssm: Ssm {
                heads: 24,
                head_dim: 64,
                state: 128,
                groups: 1,
                conv: 4,
                chunk: 128,
                conv_bias: true,
                in_bias: false,
                out_bias: false,
                gated_norm: false,
                mup: true,
            },
            ..with_head_dim(llama(32_784, 1024, 36, 8, 2, 2048, 16_384), 64)
        };
        vec![Preset::new(60, "falcon-h1-0.5b-instruct", "tiiuae/Falcon-H1-0.5B-Instruct", "Falcon-H1", spec)]
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        let _ = kind;
        layer(b, p, spec, x, sh, attn)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{decode_query, encode_query, Config};
    use crate::estimator::family::Family;
    use crate::estimator::presets::preset;
    use crate::estimator::validate::unmodelled_feature;

    /// The mixer's fields are keys of a link: a modified Falcon-H1 keeps them, and a link
    /// that puts them on a family without a Mamba-2 layer is refused by name, not estimated as
    /// that family.
    #[test]
    fn a_custom_falcon_h1_link_keeps_its_mixer_and_other_families_refuse_one() {
        let mut arch = preset("falcon-h1-0.5b-instruct").expect("the preset exists").spec;
        arch.ssm.state = 64;
        let cfg = Config { model: "custom".into(), arch: arch.clone(), ..Config::default() };
        let query = encode_query(&cfg);
        assert!(query.contains("ssm_state=64") && query.contains("family=falcon_h1"), "{query}");
        let back = decode_query(&query);
        assert_eq!((back.config.arch, back.errors.len()), (arch.clone(), 0), "{query}");
        assert_eq!(unmodelled_feature(&arch), None);
        let llama = crate::estimator::model::ModelSpec { family: Family::Llama, ..arch };
        assert!(unmodelled_feature(&llama).is_some_and(|f| f.contains("Mamba-2")));
    }
}
