//! Granite 4.0-H (`models/granitemoehybrid/modeling_granitemoehybrid.py`, transformers 5.24):
//! each decoder layer (`GraniteMoeHybridDecoderLayer.forward`) runs either the Mamba-2 mixer
//! (`GraniteMoeHybridMambaLayer`, [`super::mamba2`], with its gated RMSNorm) or NoPE GQA
//! attention (`GraniteMoeHybridAttention`: Llama's without RoPE, `attention_multiplier` as the
//! softmax scale), chosen per layer by `layer_types` ("mamba" / "attention", which transformers
//! 5 reads as "linear_attention" / "full_attention"); then `post_attention_layernorm`, the
//! experts (`GraniteMoeHybridMoE`: a top-k-then-softmax router, `grouped_mm` experts) beside
//! the shared MLP (`GraniteMoeHybridMLP`, a fused `input_linear` chunked into SwiGLU's halves).
//! Granite's multipliers are Python floats, each a `mul` or `div` that saves nothing:
//! `embedding_multiplier` on the embedding, `residual_multiplier` on both branches before
//! their residual adds, `logits_scaling` dividing the logits.
//!
//! The mixer runs transformers' torch path on a CPU ([`mixer_scan`], then
//! [`gated_norm_out`]); with `kernels = cuda` the fused `mamba_split_conv1d_scan_combined`
//! ([`mixer_fused`], as Falcon-H1's).

use super::super::blocks::shapes::tok;
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Group, Shape, Split, Tid, X};
use super::common::{proj_or, tied, token_embedding, tokens, AttnW, Kind, Norm, Params, Rms, Shared, LAYER_NORM};
use super::llama::{attention, in_group};
use super::mamba2::{gated_norm_out, mixer_fused, mixer_scan, ssm_keys, write_ssm_keys, MambaW};
use super::modeling::{ConfigFile, Modeling};
use super::moe::{experts, MoeW};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{LayerRule, Linear, ModelSpec, Positions, Router, Ssm};
use crate::estimator::part::Part;
use crate::estimator::preset_base::{llama, Preset};
use serde_json::{Map, Value};

/// `GraniteMoeHybridRMSNorm`: Llama's.
const NORM: Norm = Norm::Rms(Rms::Llama);

/// `GraniteMoeHybridTopKGating.forward`:
/// ```python
/// logits = F.linear(hidden_states, self.weight).float()
/// top_k_logits, top_k_indices = logits.topk(self.top_k, dim=1)
/// top_k_gates = torch.softmax(top_k_logits, dim=1).type_as(hidden_states)
/// ```
/// The softmax keeps its fp32 output; the gates are in the block input's dtype (fp32 under
/// autocast). Returns (the fp32 logits, the gates, the indices).
fn router(b: &mut Builder, w: Option<Tid>, x2: Tid) -> (Tid, Tid, Tid) {
    b.module = "mlp.router";
    let logits = match w {
        Some(w) => b.linear(x2, w, None, tokens(&[Dim::X(X::E)])),
        None => b.plain("mm", &[x2], tokens(&[Dim::X(X::E)]), Dt::Model),
    };
    let lf = b.to_copy(logits, Dt::F32);
    let (vals, idx) = b.topk(lf, tokens(&[Dim::X(X::K)]));
    let probs = b.unary("_softmax", "SoftmaxBackward0", vals, Keep::Output, "_softmax_backward_data");
    let xdt = b.t(x2).dt;
    let gates = b.to_copy(probs, xdt);
    b.hold(probs);
    (lf, gates, idx)
}

/// `GraniteMoeHybridMoE.forward`: `layer_input.reshape(-1, h)`, the router, the experts
/// (`grouped_mm_experts_forward`, [`experts`]), the output viewed `[b, s, h]`; the router's
/// logits and the routing live until it returns.
fn moe(b: &mut Builder, w: &MoeW, x: Tid) -> Tid {
    b.part = Part::Moe;
    b.module = "mlp";
    let x2 = b.view(x, b.shape(x), "ViewBackward0", false);
    let (logits, gates, idx) = router(b, w.router, x2);
    let out = experts(b, w, x2, gates, idx);
    b.module = "mlp";
    for t in [logits, gates, idx, x2] {
        b.hold(t);
    }
    out
}

/// The shared MLP's weights (`shared_mlp.input_linear` [2F, h], `output_linear` [h, F]): the
/// MoE block's shared expert, or the layer's only MLP when the model has no experts.
struct SharedMlpW {
    input: Option<Tid>,
    output: Option<Tid>,
    width: Dim,
    part: Part,
}

impl SharedMlpW {
    fn new(b: &mut Builder, p: &Params, kind: Kind) -> SharedMlpW {
        if kind == Kind::Moe {
            let input = p.w(b, "layers.*.mlp.shared_expert.gate_up_proj.weight");
            let output = p.w(b, "layers.*.mlp.shared_expert.down_proj.weight");
            SharedMlpW { input, output, width: Dim::X(X::FS), part: Part::Moe }
        } else {
            let input = p.w(b, "layers.*.mlp.gate_up_proj.weight");
            let output = p.w(b, "layers.*.mlp.down_proj.weight");
            SharedMlpW { input, output, width: Dim::Q(Q::F), part: Part::Mlp }
        }
    }
}

/// `GraniteMoeHybridMLP.forward`:
/// ```python
/// hidden_states = self.input_linear(hidden_states)
/// chunked_hidden_states = hidden_states.chunk(2, dim=-1)
/// hidden_states = self.activation(chunked_hidden_states[0]) * chunked_hidden_states[1]
/// hidden_states = self.output_linear(hidden_states)
/// ```
/// SiLU keeps its input, the first chunk (a view of the whole `[b, s, 2F]` projection).
fn shared_mlp(b: &mut Builder, w: &SharedMlpW, x: Tid) -> Tid {
    b.part = w.part;
    b.module = "shared_mlp.input_linear";
    let two = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::N(2), w.width], Split::None);
    let gu = proj_or(b, x, w.input, None, two, Linear::GateUp);
    b.module = "shared_mlp";
    let (g, u) = b.chunk2(gu, tokens(&[w.width]));
    b.module = "shared_mlp.activation";
    let a = b.unary("silu", "SiluBackward0", g, Keep::Input, "silu_backward");
    b.module = "shared_mlp";
    let m = b.mul(a, u);
    b.module = "shared_mlp.output_linear";
    proj_or(b, m, w.output, None, tok(Q::H), Linear::Down)
}

/// `hidden_states = residual + hidden_states * self.residual_multiplier`: the branch's output
/// `branch` (still named `hidden_states`) lives through the add.
fn residual(b: &mut Builder, x: Tid, branch: Tid) -> Tid {
    b.module = "";
    b.part = Part::Norms;
    let scaled = b.mul_scalar(branch);
    let y = b.add(x, scaled);
    b.hold(branch);
    y
}

/// One decoder layer (`GraniteMoeHybridDecoderLayer.forward`): the input norm, the layer's
/// mixer (Mamba-2 on the `linear_layers`, else NoPE attention), the scaled residual, the post
/// norm, the experts plus the shared MLP (or the shared MLP alone without experts), the scaled
/// residual.
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    // Parameters in registration order: input_layernorm, post_attention_layernorm,
    // block_sparse_moe (router, experts), shared_mlp, then mamba or self_attn.
    b.group = Group::All;
    let w1 = NORM.weights(b, p, LAYER_NORM);
    let w2 = NORM.weights(b, p, LAYER_NORM);
    let mw = (kind == Kind::Moe).then(|| MoeW::new(b, p));
    let shw = SharedMlpW::new(b, p, kind);
    let mamba = sh.linear.then(|| MambaW::new(b, p));
    let aw = (!sh.linear).then(|| AttnW::new(b, p));
    b.module = "input_layernorm";
    b.part = Part::Norms;
    let n1 = NORM.run(b, x, w1);
    let (o, weights) = match (&mamba, &aw) {
        (Some(w), _) if b.c.cuda => (mixer_fused(b, w, spec, n1), None),
        (Some(w), _) => {
            let (y, gate, locals) = mixer_scan(b, w, spec, n1);
            (gated_norm_out(b, w, y, gate, spec.ssm.groups, locals), None)
        }
        (None, Some(w)) => attention(b, w, spec, n1, sh, attn),
        (None, None) => unreachable!("a layer has a mixer or attention"),
    };
    b.hold(n1);
    let h = residual(b, x, o);
    b.module = "post_attention_layernorm";
    let n2 = NORM.run(b, h, w2);
    let y = in_group(b, kind, |b| {
        let routed = mw.map(|w| moe(b, &w, n2));
        let shared = shared_mlp(b, &shw, n2);
        match routed {
            Some(r) => {
                b.module = "";
                let sum = b.add(r, shared);
                let y = residual(b, h, sum);
                b.hold(r);
                y
            }
            None => residual(b, h, shared),
        }
    });
    b.hold(n2);
    b.hold(h);
    if let Some(t) = weights {
        b.hold(t);
    }
    y
}

/// The layers that run the Mamba-2 mixer: `layer_types` (`layers_block_type`) "mamba" or, as
/// transformers 5 rewrites it, "linear_attention"; the others ("attention", "full_attention")
/// run attention. Absent: every layer is a Mamba-2 layer (`GraniteMoeHybridConfig.layers_block_type`).
fn mamba_layers(f: &Fields, layers: u64) -> Result<LayerRule, HfError> {
    let key = if f.get("layer_types").is_some() { "layer_types" } else { "layers_block_type" };
    let Some(v) = f.get(key).filter(|v| !v.is_null()) else { return Ok(LayerRule::All) };
    let items = v.as_array().ok_or(HfError::Type { key, expected: "a list of layer types" })?;
    if items.len() as u64 != layers {
        return Err(HfError::Field { key, reason: format!("lists {} layers for {} num_hidden_layers", items.len(), layers) });
    }
    let mut flags = Vec::with_capacity(items.len());
    for item in items {
        flags.push(match item.as_str() {
            Some("mamba" | "linear_attention") => true,
            Some("attention" | "full_attention") => false,
            Some(other) => {
                return Err(HfError::Field { key, reason: format!("layer type `{other}` is not one of mamba and attention") });
            }
            None => return Err(HfError::Type { key, expected: "a list of layer types" }),
        });
    }
    Ok(LayerRule::from_flags(&flags))
}

/// Granite 4.0-H: Llama's model forward (NoPE: no rotary tables) around [`layer`], its
/// embedding times `embedding_multiplier` and its logits divided by `logits_scaling`.
pub struct GraniteMoeHybrid;
impl ConfigFile for GraniteMoeHybrid {
    /// `configuration_granitemoehybrid.py` `GraniteMoeHybridConfig`: Llama's sizes (head_dim
    /// h / a), `attention_bias` on q, k, v and o; `num_local_experts` experts of
    /// `intermediate_size`, `num_experts_per_tok`, the shared MLP of `shared_intermediate_size`
    /// (the only MLP when there are no experts); the Mamba-2 mixer of `mamba_n_heads` heads of
    /// `mamba_d_head` ("auto": `mamba_expand` × h / heads, which must be `mamba_expand` × h),
    /// `mamba_proj_bias` on `in_proj` and `out_proj`, always its gated norm.
    /// `position_embedding_type` "rope" is refused (not measured).
    fn import(&self, _t: &str, f: &Fields, _notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        let mut m = fields::llama_like(
            f,
            fields::Dims {
                vocab: 32_000,
                hidden: 4096,
                layers: 32,
                heads: 32,
                kv_heads: None,
                head_dim: None,
                ffn: 11_008,
                max_pos: 2048,
                tied: false,
            },
        )?;
        match f.string("position_embedding_type")? {
            None | Some("nope") => m.positions = Positions::None,
            Some(other) => {
                return Err(HfError::Field {
                    key: "position_embedding_type",
                    reason: format!("`{other}` is not modelled for Granite 4.0-H (NoPE attention is)"),
                })
            }
        }
        m.qkv_bias = f.flag("attention_bias", false)?;
        m.o_bias = m.qkv_bias;
        let experts = f.uint_or("num_local_experts", 8)?;
        let shared = f.size("shared_intermediate_size", 1024)?;
        m.fused_gate_up = true;
        if experts > 0 {
            m.experts = experts;
            m.top_k = f.uint_or("num_experts_per_tok", 2)?;
            m.expert_ffn = m.ffn;
            m.ffn = 0;
            m.shared_experts = 1;
            m.shared_ffn = shared;
            m.fused_experts = true;
            m.router = Router::TopkSoftmax;
        } else {
            m.ffn = shared;
        }
        let linear = mamba_layers(f, m.layers)?;
        if linear.count_in(0..m.layers) > 0 {
            let inner = f.uint_or("mamba_expand", 2)? * m.hidden;
            let own = Ssm { out_bias: f.flag("mamba_proj_bias", false)?, gated_norm: true, mup: false, ..Ssm::NONE };
            m.ssm = ssm_keys(f, inner, "`mamba_expand` × `hidden_size`", own)?;
            m.ssm_dtype = f.state_dtype("mamba_ssm_dtype")?;
            m.linear_layers = linear;
        }
        Ok(m)
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        let m = s.ssm;
        let moe = s.experts > 0;
        if s.positions != Positions::None || (m.heads > 0) == (s.linear_layers == LayerRule::None) || m.in_bias != m.out_bias {
            return Vec::new();
        }
        let Some(mut w) = writer::llama_base("granitemoehybrid", s, "hidden_act") else { return Vec::new() };
        let types: Vec<&str> = (0..s.layers).map(|i| if s.linear_layers.contains(i) { "mamba" } else { "attention" }).collect();
        w.set("intermediate_size", if moe { s.expert_ffn } else { 0 })
            .set("shared_intermediate_size", if moe { s.shared_ffn } else { s.ffn })
            .set("num_local_experts", s.experts)
            .set("num_experts_per_tok", if moe { s.top_k } else { 2 })
            .set("attention_bias", s.qkv_bias)
            .set("position_embedding_type", "nope")
            .set("layer_types", types);
        if m.heads > 0 {
            w.set("mamba_expand", m.inner() / s.hidden.max(1));
            write_ssm_keys(&mut w, &m);
            super::mamba2::write_ssm_dtype(&mut w, s);
        }
        w.done().into_iter().collect()
    }
}

impl Modeling for GraniteMoeHybrid {
    fn presets(&self) -> Vec<Preset> {
        // Granite 4.0-H-Tiny (ibm-granite/granite-4.0-h-tiny): 40 layers of h 1536, attention
        // (12 query / 4 KV heads of 128, NoPE) on layers 5, 15, 25 and 35, Mamba-2 (48 heads of
        // 64, state 128, one group, chunk 256, conv 4 with bias) on the other 36; on every layer
        // 64 experts of 512, top 6, beside a shared MLP of 1024; 100,352 tokens, tied.
        // 6,939,037,248 parameters (transformers 5.24 on the meta device,
        // tests/fixtures/hf/expected.json): the embedding 154,140,672; per layer the two norms
        // 3,072, the router 98,304, the experts 150,994,944 and the shared MLP 4,718,592 (× 40 =
        // 6,232,596,480); per Mamba-2 layer 14,642,576 (× 36 = 527,132,736: in_proj 9,904,128,
        // conv1d 16,640, dt_bias, A_log and D 144, the gated norm 3,072, out_proj 4,718,592);
        // per attention layer 6,291,456 (× 4 = 25,165,824); the final norm 1,536.
        let mut m = llama(100_352, 1536, 40, 12, 4, 0, 131_072);
        m.family = Family::GraniteMoeHybrid;
        m.tied = true;
        m.positions = Positions::None;
        m.experts = 64;
        m.top_k = 6;
        m.expert_ffn = 512;
        m.shared_experts = 1;
        m.shared_ffn = 1024;
        m.fused_experts = true;
        m.fused_gate_up = true;
        m.router = Router::TopkSoftmax;
        m.linear_layers = LayerRule::AllBut { step: 10, offset: 5 };
        m.ssm = Ssm {
            heads: 48,
            head_dim: 64,
            state: 128,
            groups: 1,
            conv: 4,
            chunk: 256,
            conv_bias: true,
            in_bias: false,
            out_bias: false,
            gated_norm: true,
            mup: false,
        };
        vec![Preset::new(61, "granite-4.0-h-tiny", "ibm-granite/granite-4.0-h-tiny", "Granite 4.0-H", m)]
    }

    /// `GraniteMoeHybridModel.forward` before the layers: `inputs_embeds = self.embed_tokens(
    /// input_ids) * self.embedding_multiplier` (the embedding's output goes at the product),
    /// `cache_position`, the causal mask; no rotary tables (NoPE) and no `position_ids` for the
    /// layers: `cache_position` is a local of the model's forward.
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        let (e, emb_w) = token_embedding(b, p, ids, "model.embed_tokens");
        b.module = "model";
        let x0 = b.mul_scalar(e);
        let sh = self.positions(b, spec, attn);
        (x0, Shared { emb_w: tied(spec, emb_w), locals: [Some(x0), sh.locals[1]], ..sh })
    }

    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        let sh = super::llama::positions(b, spec, attn);
        Shared { pos: None, locals: [None, sh.pos], ..sh }
    }

    fn shares_positions(&self) -> bool {
        false
    }

    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }

    /// `logits = logits / self.config.logits_scaling` (`GraniteMoeHybridForCausalLM.forward`).
    fn logits(&self, b: &mut Builder, logits: Tid) -> Tid {
        b.unary("div", "DivBackward0", logits, Keep::Nothing, "div")
    }

    /// The layout [`GraniteMoeHybrid::import`] builds: the top-k-then-softmax router (model
    /// dtype, `.float()` logits), `[E, out, in]` experts without biases, one shared MLP.
    fn builds_own_layout(&self, spec: &ModelSpec) -> bool {
        let attention = spec.positions == Positions::None
            && !spec.fused_qkv
            && !spec.is_mla()
            && !spec.attn_sinks
            && !spec.qk_l2_norm
            && spec.window_layers.count(spec.layers) == 0
            && spec.act == crate::estimator::model::Activation::Silu
            && spec.gdn.k_heads == 0;
        attention
            && (spec.experts == 0
                || spec.router == Router::TopkSoftmax
                    && !spec.router_bias
                    && !spec.router_fp32
                    && spec.router_groups <= 1
                    && spec.fused_experts
                    && !spec.expert_bias
                    && !spec.experts_in_out
                    && !spec.moe_all_experts
                    && spec.shared_experts == 1
                    && !spec.shared_gate
                    && spec.dense_layers == 0
                    && spec.moe_rule == LayerRule::All)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::config::{Config, Kernels, Precision};
    use crate::estimator::expr::numbers_only;
    use crate::estimator::params::Stage;
    use crate::estimator::precision::recipe;
    use crate::estimator::presets::preset;
    use crate::estimator::step::ledger::kept;
    use crate::estimator::step::model::Setup;

    /// What the Mamba-2 layer of the measured toy Granite (h = 64; H = 8 heads of 16, G = 2,
    /// N = 24, chunk 32; E = 4, K = 2, f_e = 40, shared 176), fp32, b = 2, s = 64, keeps from
    /// each op (op name, bytes).
    fn mamba_layer_keeps(kernels: Kernels) -> Vec<(&'static str, u128)> {
        let mut arch = preset("granite-4.0-h-tiny").expect("the preset exists").spec;
        (arch.hidden, arch.heads, arch.kv_heads, arch.head_dim, arch.layers, arch.vocab) = (64, 4, 2, 16, 2, 1000);
        (arch.experts, arch.top_k, arch.expert_ffn, arch.shared_ffn) = (4, 2, 40, 176);
        arch.linear_layers = LayerRule::List(vec![0]);
        (arch.ssm.heads, arch.ssm.head_dim, arch.ssm.groups, arch.ssm.state, arch.ssm.chunk) = (8, 16, 2, 24, 32);
        let cfg = Config {
            model: "custom".into(),
            arch,
            batch: 2,
            seq: 64,
            precision: Precision::Fp32,
            attn: Attention::Sdpa,
            kernels,
            ..Config::default()
        };
        let r = recipe(cfg.precision);
        numbers_only(|| {
            let setup = Setup::new(&cfg, &r, Stage::Whole);
            let var = super::super::common::Var { sliding: false, nope: false, every_nth: false, linear: true };
            let (prog, _, _) = setup.layer_alone(Kind::Moe, var, 0, false);
            kept(&prog).iter().map(|k| (prog.tensors[k.t as usize].op, prog.tensors[k.t as usize].bytes)).collect()
        })
    }

    /// On a CPU the torch SSD scan keeps its `[b, H, n_c, C, C]` fp32 decay `L` (4·2·8·2·32·32 =
    /// 131,072 bytes); with `kernels = cuda` mamba_ssm's fused scan keeps in its place only the
    /// scan's output `out_x` (4·b·s·H·P = 65,536) and the gated norm's `rstd` (4·b·s·G = 1,024)
    /// beside `in_proj`'s output (4·b·s·D_in = 4·128·360 = 184,320).
    #[test]
    fn the_fused_cuda_scan_keeps_its_output_and_rstd_where_the_cpu_scan_keeps_its_chunks() {
        let cpu = mamba_layer_keeps(Kernels::Cpu);
        assert!(cpu.contains(&("exp", 131_072)), "{cpu:?}");
        assert!(cpu.iter().all(|&(op, _)| op != "_mamba_chunk_scan_combined_fwd"), "{cpu:?}");
        let cuda = mamba_layer_keeps(Kernels::Cuda);
        for want in [("_mamba_chunk_scan_combined_fwd", 65_536), ("_layer_norm_fwd", 1_024), ("mm", 184_320)] {
            assert!(cuda.contains(&want), "{want:?} in {cuda:?}");
        }
        assert!(!cuda.contains(&("exp", 131_072)), "{cuda:?}");
        assert!(cuda.iter().all(|&(op, _)| !matches!(op, "bmm" | "convolution" | "constant_pad_nd" | "masked_fill")), "{cuda:?}");
    }
}
