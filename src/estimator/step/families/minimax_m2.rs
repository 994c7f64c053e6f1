//! MiniMax-M2 (`models/minimax_m2/modeling_minimax_m2.py`, transformers 5.24): Llama's
//! pre-norm layer whose attention normalizes q and k over the whole projections
//! (`self.q_norm(self.q_proj(hidden_states))`, `MiniMaxM2RMSNorm` is Llama's) before the head
//! views, rotates the first `rotary_dim` dims of each head (`apply_rotary_pos_emb`: slices,
//! rotation, `cat`, GLM-4.5's [`rope_partial`]), and whose every MLP is the sparse block
//! (`MiniMaxM2SparseMoeBlock`): a sigmoid router in the model dtype with the
//! `e_score_correction_bias` buffer for the choice only (`MiniMaxM2TopKRouter.forward`), the
//! routed experts of `grouped_mm_experts_forward` ([`super::moe::experts`]), no shared expert.

use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Tid, X};
use super::common::{head_proj, rms_norm, to_heads, tokens, AttnW, Kind, MlpW, Params, Rms, Shared};
use super::llama::{attend_out, rope_partial, Core, PartialRope};
use super::modeling::{ConfigFile, Modeling};
use super::moe::MoeW;
use super::sigmoid_moe::{gather, SigmoidMoeW};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::hf_fields::{self as fields, Fields, HfError};
use crate::estimator::hf_writer as writer;
use crate::estimator::model::{Linear, ModelSpec, QkNorm, Router};
use crate::estimator::part::Part;
use crate::estimator::preset_base::{llama, Preset, FP8_CHECKPOINT};
use serde_json::{Map, Value};

/// `MiniMaxM2Attention.forward`: q and k normalized over the whole projections, then q, k, v
/// viewed `[b, s, heads, d]` and transposed, the partial RoPE, the attention core (q and k
/// contiguous after the `cat`), `o_proj`.
fn attention(b: &mut Builder, w: &AttnW, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> (Tid, Option<Tid>) {
    let eager = attn == Attention::Eager;
    let norm = |b: &mut Builder, y: Tid, nw: Option<Tid>, module: &'static str| {
        if spec.qk_norm != QkNorm::Full {
            return y;
        }
        b.module = module;
        b.part = Part::AttentionCore;
        rms_norm(b, y, nw, Rms::LlamaRows)
    };
    let q = head_proj(b, x, w.wq, w.bq, Q::A, "self_attn.q_proj", Linear::Q);
    let q = norm(b, q, w.qn, "self_attn.q_norm");
    let k = head_proj(b, x, w.wk, w.bk, Q::KV, "self_attn.k_proj", Linear::K);
    let k = norm(b, k, w.kn, "self_attn.k_norm");
    let v = head_proj(b, x, w.wv, w.bv, Q::KV, "self_attn.v_proj", Linear::V);
    b.module = "self_attn";
    // The gradients of q and k come back through RoPE's `cat` in a layout the view's `reshape`
    // must copy; v's only after eager attention's bmm.
    let q = to_heads(b, q, Q::A, true);
    let k = to_heads(b, k, Q::KV, true);
    let v = to_heads(b, v, Q::KV, eager);
    b.part = Part::AttentionCore;
    let (q, k) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) => {
            let how = PartialRope { slice_full: true, promote: true, ..PartialRope::default() };
            let qk = rope_partial(b, spec, q, k, cos, sin, how);
            b.hold(q);
            b.hold(k);
            qk
        }
        _ => (q, k),
    };
    attend_out(b, spec, [q, k, v], sh, attn, Core { selective: false, ..Core::CONTIGUOUS }, (w.wo, w.bo))
}

/// `MiniMaxM2TopKRouter.forward`:
/// ```python
/// hidden_states = hidden_states.reshape(-1, self.hidden_dim)
/// router_logits = F.linear(hidden_states.to(self.weight.dtype), self.weight)
/// routing_weights = nn.functional.sigmoid(router_logits.float())
/// scores_for_choice = routing_weights + e_score_correction_bias
/// _, top_k_index = torch.topk(scores_for_choice, self.top_k, dim=-1, sorted=False)
/// top_k_weights = routing_weights.gather(1, top_k_index)
/// top_k_weights /= top_k_weights.sum(dim=-1, keepdim=True)
/// ```
/// The logits in the model dtype (the `mm` keeps its input), their fp32 sigmoid (keeping its
/// result), the gather and the in-place normalisation are in the graph; the choice is not.
/// Returns (logits, weights, indices).
fn router(b: &mut Builder, _spec: &ModelSpec, w: Option<Tid>, x2: Tid) -> (Tid, Tid, Tid) {
    b.module = "mlp.gate";
    let e = || tokens(&[Dim::X(X::E)]);
    let dt = b.t(x2).dt;
    let logits = match w {
        Some(w) => b.linear(x2, w, None, e()),
        None => b.plain("mm", &[x2], e(), dt),
    };
    let l32 = b.to_copy(logits, Dt::F32);
    let scores = b.unary("sigmoid", "SigmoidBackward0", l32, Keep::Output, "sigmoid_backward");
    let choice = b.plain("add", &[scores], e(), Dt::F32);
    let top = [b.out(tokens(&[Dim::X(X::K)]), Dt::F32, false), b.out(tokens(&[Dim::X(X::K)]), Dt::I64, false)];
    let r = b.plain_n("topk", &[choice], &top);
    let (values, idx) = (r[0], r[1]);
    // The choice's TopkBackward0 dies with `values` but keeps the indices (a pack under
    // activation offloading).
    let rg = b.rg(scores);
    b.dead_save(idx, rg);
    let weights = gather(b, scores, idx);
    let sum = b.sum_dim(weights, tokens(&[Dim::N(1)]));
    let weights = b.div_(weights, sum);
    // The function's locals live until it returns.
    for t in [scores, choice, values] {
        b.hold(t);
    }
    (logits, weights, idx)
}

/// `MiniMaxM2DecoderLayer.forward`: Llama's layer ([`super::sigmoid_moe::layer`]'s) with the
/// sparse block on every layer, routed by [`router`].
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    let aw = AttnW::new(b, p);
    let new = |b: &mut Builder, p: &Params| {
        // Registration order: `gate` (the router, model dtype), then `experts`.
        let router = p.w(b, "layers.*.mlp.router.weight");
        let gate_up = p.w(b, "layers.*.mlp.experts.gate_up_proj");
        let down = p.w(b, "layers.*.mlp.experts.down_proj");
        SigmoidMoeW { experts: MoeW { router, gate_up, down }, shared: MlpW { wg: None, wu: None, wd: None } }
    };
    let ffn = super::llama::Ffn::new(b, p, kind, new);
    super::llama::decoder_layer(
        b,
        p,
        x,
        super::common::Norm::Rms(Rms::Llama),
        |b, n| attention(b, &aw, spec, n, sh, attn),
        |b, n| ffn.forward(b, n, |b, w, n| super::sigmoid_moe::block(b, spec, &w, n, router)),
    )
}

/// MiniMax-M2's layout on Llama's sizes: every layer MoE (`intermediate_size` per expert), the
/// sigmoid router in the model dtype, q/k norms over the whole projections.
fn minimax_m2(mut m: ModelSpec, experts: u64, top_k: u64, rotary_pct: u64) -> ModelSpec {
    m.family = Family::MinimaxM2;
    m.qk_norm = QkNorm::Full;
    m.rotary_pct = rotary_pct;
    m.experts = experts;
    m.top_k = top_k;
    m.expert_ffn = m.ffn;
    m.dense_layers = 0;
    m.fused_experts = true;
    m.router = Router::Sigmoid;
    m.router_fp32 = false;
    m.router_groups = 1;
    m.router_group_topk = 1;
    m
}

/// [`mtp_note`] of the MiniMax-M2.5 checkpoint's three modules (`num_mtp_modules` 3).
const M25_MTP_NOTE: &str =
    "the checkpoint's 3 multi-token-prediction modules (`num_mtp_modules`) are not built by transformers' MiniMaxM2ForCausalLM and are not counted";

/// The note of a checkpoint's MTP modules (`use_mtp`, `num_mtp_modules`), which
/// `MiniMaxM2ForCausalLM` does not build.
fn mtp_note(n: u64) -> String {
    format!(
        "the checkpoint's {n} multi-token-prediction module{} (`num_mtp_modules`) {} not built by transformers' MiniMaxM2ForCausalLM and {} not counted",
        if n == 1 { "" } else { "s" },
        if n == 1 { "is" } else { "are" },
        if n == 1 { "is" } else { "are" }
    )
}

/// MiniMax-M2 (see the module doc).
pub struct MinimaxM2;
impl ConfigFile for MinimaxM2 {
    /// `MiniMaxM2Config` (configuration_minimax_m2.py): every size defaults to the class's
    /// (200,064 tokens, 3,072 wide, 62 layers of 48 query and 8 KV heads of 128, 256 experts of
    /// 1,536, top-8, 196,608 positions); the rotary fraction from `partial_rotary_factor`, else
    /// the legacy `rotary_dim` over `head_dim`, else whole heads. `router_jitter_noise` above 0
    /// (a training-time multiplication of the block's input) is refused.
    fn import(&self, _t: &str, f: &Fields, notes: &mut Vec<String>) -> Result<ModelSpec, HfError> {
        if f.flag("use_mtp", false)? {
            let n = f.uint_or("num_mtp_modules", 0)?;
            if n > 0 {
                notes.push(mtp_note(n));
            }
        }
        let mut m = llama(
            f.size("vocab_size", 200_064)?,
            f.size("hidden_size", 3072)?,
            f.size("num_hidden_layers", 62)?,
            f.size("num_attention_heads", 48)?,
            0,
            f.size("intermediate_size", 1536)?,
            f.uint_or("max_position_embeddings", 196_608)?,
        );
        fields::check_layers(m.layers)?;
        m.kv_heads = f.uint_or("num_key_value_heads", 8)?;
        m.head_dim = f.size("head_dim", 128)?;
        m.act = f.activation(&["hidden_act"], crate::estimator::model::Activation::Silu)?;
        m.tied = f.flag("tie_word_embeddings", false)?;
        if f.float("router_jitter_noise")?.is_some_and(|j| j > 0.0) {
            return Err(HfError::Model("MiniMax-M2's router jitter (`router_jitter_noise` > 0) is not modelled".into()));
        }
        let legacy = match f.uint("rotary_dim")? {
            Some(d) if m.head_dim > 0 && d <= m.head_dim => d as f64 / m.head_dim as f64,
            _ => 1.0,
        };
        let pct = f.rotary_pct(legacy)?;
        let experts = f.size_any(&["num_local_experts", "num_experts"], 256)?;
        let top_k = f.uint_or("num_experts_per_tok", 8)?;
        fields::with_heads(minimax_m2(m, experts, top_k, pct))
    }
    fn export(&self, s: &ModelSpec) -> Vec<Map<String, Value>> {
        if s.qk_norm != QkNorm::Full || s.experts == 0 || s.dense_layers > 0 || s.shared_experts > 0 || s.expert_ffn != s.ffn {
            return Vec::new();
        }
        let Some(mut w) = writer::llama_base("minimax_m2", s, "hidden_act") else { return Vec::new() };
        w.set("intermediate_size", s.ffn)
            .set("num_local_experts", s.experts)
            .set("num_experts_per_tok", s.top_k)
            .set("partial_rotary_factor", writer::rotary_fraction(s));
        w.done().into_iter().collect()
    }
}

impl Modeling for MinimaxM2 {
    /// MiniMax-M2.5 (MiniMaxAI/MiniMax-M2.5, MiniMax-M2's architecture and sizes), from its
    /// `config.json` (`tests/fixtures/hf/minimax-m2.5.json`): 200,064 tokens, 3,072 wide, 62
    /// layers of 48 query and 8 KV heads of 128 with half of each head rotating, 256 experts of
    /// 1,536 (top-8) on every layer, 196,608 positions, untied. 228,689,748,992 parameters
    /// (transformers 5.24 on the meta device; its multi-token-prediction modules are not built).
    fn presets(&self) -> Vec<Preset> {
        let mut m = llama(200_064, 3072, 62, 48, 8, 1536, 196_608);
        m.head_dim = 128;
        let m = minimax_m2(m, 256, 8, 50);
        vec![Preset::new(114, "minimax-m2.5", "MiniMaxAI/MiniMax-M2.5", "MiniMax-M2", m).with_notes(&[M25_MTP_NOTE, FP8_CHECKPOINT])]
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
    /// `e_score_correction_bias` is created by `torch.zeros(num_local_experts)`: the model dtype.
    fn router_bias_fp32(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use crate::estimator::config::{Config, Precision};
    use crate::estimator::presets::preset;
    use crate::estimator::step::model::router_bias_buffer_bytes;

    /// `e_score_correction_bias` is `torch.zeros(num_local_experts)` in the model dtype:
    /// MiniMax-M2.5's 62 layers × 256 experts hold 31,744 bytes in bf16, 63,488 in fp32.
    #[test]
    fn minimax_m2_keeps_its_correction_bias_in_the_model_dtype() {
        let spec = preset("minimax-m2.5").expect("the preset exists").spec;
        let cfg = |precision| Config { model: "minimax-m2.5".into(), arch: spec.clone(), precision, ..Config::default() };
        assert_eq!(router_bias_buffer_bytes(&cfg(Precision::Bf16)), 31_744);
        assert_eq!(router_bias_buffer_bytes(&cfg(Precision::Fp32)), 63_488);
    }
}
