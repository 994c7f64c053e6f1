//! Qwen2-MoE and Qwen3-MoE (`modeling_qwen2_moe.py`, `modeling_qwen3_moe.py`): Llama's decoder
//! layer (Qwen3-MoE with its per-head q/k norms) whose sparse layers route through
//! `Qwen*TopKRouter` — Mixtral's router, but its top-k weights are renormalised only when
//! `norm_topk_prob` and then cast back to the logits' dtype — and, in Qwen2-MoE, a shared expert
//! gated by a sigmoid (`shared_expert_gate`, a h → 1 linear).

use super::super::blocks::shapes::{tok, tok_tp};
use super::super::blocks::Keep;
use super::super::ir::{Builder, Dim, Dt, Group, Shape, Split, Tid, X};
use super::common::received;
use super::common::{Kind, Params, Shared};
use super::llama::{attention, rms_norm, AttnW, MlpW};
use super::modeling::Modeling;
use super::moe::{experts, MoeW};
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::Attention;
use crate::estimator::model::{Linear, ModelSpec};
use crate::estimator::step::part::Part;

/// Whether the router renormalises its top-k weights (`norm_topk_prob`): Qwen3-MoE's checkpoints
/// set it, Qwen2-MoE's (Qwen1.5-MoE-A2.7B, the configuration default) do not — as
/// `hf_export` writes them.
fn norm_topk(spec: &ModelSpec) -> bool {
    !spec.shared_gate
}

/// `[b, s, extra…]`: one row per token.
fn tokens(extra: &[Dim]) -> Shape {
    let mut d = vec![Dim::Q(Q::B), Dim::Q(Q::S)];
    d.extend_from_slice(extra);
    Shape::new(&d, Split::None)
}

/// `Qwen2MoeTopKRouter.forward` (= `Qwen3MoeTopKRouter.forward`):
/// ```python
/// router_logits = F.linear(hidden_states, self.weight)
/// router_probs = softmax(router_logits, dtype=torch.float, dim=-1)
/// router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
/// if self.norm_topk_prob:
///     router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
/// router_top_value = router_top_value.to(router_logits.dtype)
/// ```
/// The softmax keeps its fp32 result; the returned weights are in the logits' dtype (the
/// compute dtype: bf16 in bf16 models and under autocast, whose `linear` returns bf16).
/// Returns (logits, weights, indices).
pub fn router(b: &mut Builder, w: Option<Tid>, x2: Tid, normalize: bool) -> (Tid, Tid, Tid) {
    b.module = "mlp.gate";
    let logits = match w {
        Some(w) => b.linear(x2, w, None, tokens(&[Dim::X(X::E)])),
        None => b.plain("mm", &[x2], tokens(&[Dim::X(X::E)]), Dt::Model),
    };
    let lf = b.to_copy(logits, Dt::F32);
    let probs = b.unary("_softmax", "SoftmaxBackward0", lf, Keep::Output, "_softmax_backward_data");
    let (vals, idx) = b.topk(probs, tokens(&[Dim::X(X::K)]));
    let top = if normalize {
        let sum = b.sum_dim(vals, tokens(&[]));
        b.div_(vals, sum)
    } else {
        vals
    };
    let ldt = b.t(logits).dt;
    let weights = b.to_copy(top, ldt);
    b.hold(probs);
    b.hold(top);
    (logits, weights, idx)
}

/// The shared expert's parameters (`shared_expert.{gate,up,down}_proj`, then
/// `shared_expert_gate`), registered after the router and the experts.
#[derive(Clone, Copy)]
pub struct SharedW {
    pub wg: Option<Tid>,
    pub wu: Option<Tid>,
    pub wd: Option<Tid>,
    pub gate: Option<Tid>,
}

impl SharedW {
    pub fn new(b: &mut Builder, p: &Params) -> SharedW {
        SharedW {
            wg: p.w(b, "layers.*.mlp.shared_expert.gate_proj.weight"),
            wu: p.w(b, "layers.*.mlp.shared_expert.up_proj.weight"),
            wd: p.w(b, "layers.*.mlp.shared_expert.down_proj.weight"),
            gate: p.w(b, "layers.*.mlp.shared_expert_gate.weight"),
        }
    }
}

/// `Qwen2MoeMLP` as the shared expert: `down_proj(silu(gate_proj(x)) * up_proj(x))` of width f_s.
fn shared_mlp(b: &mut Builder, w: &SharedW, x: Tid) -> Tid {
    let f = || tok_tp(Dim::X(X::FS));
    b.module = "mlp.shared_expert.gate_proj";
    let g = match w.wg {
        Some(wg) => b.proj(x, wg, None, f(), Linear::Gate),
        None => b.plain("mm", &[x], f(), Dt::Model),
    };
    b.module = "mlp.shared_expert.act_fn";
    let a = b.unary("silu", "SiluBackward0", g, Keep::Input, "silu_backward");
    b.module = "mlp.shared_expert.up_proj";
    let u = match w.wu {
        Some(wu) => b.proj(x, wu, None, f(), Linear::Up),
        None => b.plain("mm", &[x], f(), Dt::Model),
    };
    b.module = "mlp.shared_expert";
    let m = b.mul(a, u);
    b.module = "mlp.shared_expert.down_proj";
    match w.wd {
        Some(wd) => b.proj(m, wd, None, tok(Q::H), Linear::Down),
        None => b.plain("mm", &[m], tok(Q::H), Dt::Model),
    }
}

/// `Qwen2MoeSparseMoeBlock.forward` / `Qwen3MoeSparseMoeBlock.forward`:
/// ```python
/// hidden_states_reshaped = hidden_states.view(-1, hidden_dim)
/// shared_expert_output = self.shared_expert(hidden_states_reshaped)          # Qwen2-MoE
/// _, routing_weights, selected_experts = self.gate(hidden_states_reshaped)
/// expert_output = self.experts(hidden_states_reshaped, selected_experts, routing_weights)
/// shared_expert_output = F.sigmoid(self.shared_expert_gate(hidden_states_reshaped)) * shared_expert_output
/// expert_output = expert_output + shared_expert_output
/// ```
/// The experts (`grouped_mm_experts_forward`) return the block input's dtype (fp32 under
/// autocast, where `grouped_mm` is not autocast); the gated shared output is the autocast
/// dtype, so the sum promotes and its backward casts the shared branch's gradient back.
pub fn sparse_block(b: &mut Builder, w: &MoeW, sw: Option<&SharedW>, x: Tid, normalize: bool) -> Tid {
    b.part = Part::Moe;
    b.module = "mlp";
    let x2 = b.view(x, b.shape(x), "ViewBackward0", false);
    let shared = sw.map(|sw| shared_mlp(b, sw, x2));
    let (logits, weights, idx) = router(b, w.router, x2, normalize);
    let out = experts(b, w, x2, weights, idx);
    b.module = "mlp";
    let y = match (sw, shared) {
        (Some(sw), Some(so)) => {
            b.module = "mlp.shared_expert_gate";
            let gl = match sw.gate {
                Some(gw) => b.linear(x2, gw, None, tokens(&[Dim::N(1)])),
                None => b.plain("mm", &[x2], tokens(&[Dim::N(1)]), Dt::Model),
            };
            b.module = "mlp";
            let sg = b.unary("sigmoid", "SigmoidBackward0", gl, Keep::Output, "sigmoid_backward");
            let gated = b.mul(sg, so);
            b.hold(so);
            add_promote(b, out, gated)
        }
        _ => out,
    };
    // `_, routing_weights, selected_experts = self.gate(...)`: the block's locals.
    for t in [logits, weights, idx, x2] {
        b.hold(t);
    }
    y
}

/// `a + b` where `b` may be of a narrower dtype (AddBackward0: the gradient passes to `a`; for
/// `b` the engine's `validate_outputs` casts it to `b`'s dtype, a `_to_copy`).
fn add_promote(b: &mut Builder, x: Tid, y: Tid) -> Tid {
    use super::super::ir::B;
    if b.t(x).dtype == b.t(y).dtype {
        return b.add(x, y);
    }
    let (shape, dt) = (b.shape(x), b.promote(x, y, x));
    let (rx, ry) = (b.rg(x), b.rg(y));
    let out = b.out(shape, dt, rx || ry);
    let (yb, yd) = (b.bytes(y), b.t(y).dtype);
    let mut bw: Vec<B> = Vec::with_capacity(4);
    if rx {
        bw.push(B::Pass { input: 0, output: 0 });
    }
    if ry {
        bw.push(B::Apply);
        bw.push(B::Alloc { bytes: yb, dtype: yd, op: "_to_copy" });
        bw.push(B::Grad { input: 1, temp: 0 });
    }
    b.op("add", "AddBackward0", &[x, y], &[out], &[], &bw)[0]
}

/// One decoder layer (`Qwen2MoeDecoderLayer.forward` = `LlamaDecoderLayer.forward` with the
/// sparse block on MoE layers).
#[cfg_attr(target_arch = "wasm32", inline(never))] // see `families::layer`
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    b.group = Group::All;
    // Parameters in registration order: self_attn, mlp (Qwen2-MoE: gate, experts,
    // shared_expert, shared_expert_gate; Qwen3-MoE: experts, gate), input_layernorm,
    // post_attention_layernorm.
    let aw = AttnW::new(b, p);
    let (dense, moe) = match kind {
        Kind::Moe => {
            let (mw, sw) = if spec.shared_gate {
                (MoeW::new(b, p), Some(SharedW::new(b, p)))
            } else {
                // Qwen3MoeSparseMoeBlock.__init__ registers `experts` before `gate`.
                let gate_up = p.w(b, "layers.*.mlp.experts.gate_up_proj");
                let down = p.w(b, "layers.*.mlp.experts.down_proj");
                let router = p.w(b, "layers.*.mlp.router.weight");
                (MoeW { router, gate_up, down }, None)
            };
            (None, Some((mw, sw)))
        }
        Kind::Dense => (Some(MlpW::new(b, p)), None),
    };
    let n1w = p.w(b, "layers.*.norm.weight");
    let n2w = p.w(b, "layers.*.norm.weight");
    b.module = "input_layernorm";
    b.part = Part::Norms;
    let n1 = rms_norm(b, x, n1w);
    let (a, weights) = attention(b, &aw, spec, n1, sh, attn);
    b.hold(n1);
    b.module = "";
    b.part = Part::Norms;
    let h = b.add(x, a);
    b.module = "post_attention_layernorm";
    let n2 = rms_norm(b, h, n2w);
    b.group = if kind == Kind::Moe { Group::Moe } else { Group::Dense };
    let m = match (dense, moe) {
        (Some(mw), _) => super::llama::mlp(b, &mw, n2),
        (_, Some((mw, sw))) => sparse_block(b, &mw, sw.as_ref(), n2, norm_topk(spec)),
        _ => n2,
    };
    b.group = Group::All;
    b.hold(n2);
    b.module = "";
    let y = b.add(h, m);
    b.hold(h);
    if let Some(w) = weights {
        b.hold(w);
    }
    y
}

/// `Qwen2MoeModel.forward` before the layers: Llama's, and the mask of the `sliding_attention`
/// layers too (`create_sliding_window_causal_mask`, called whatever `layer_types` says), whose
/// window `Qwen2MoeConfig.__post_init__` sets to 0 unless `use_sliding_window`: the mask is
/// always materialized (bool for SDPA, additive for eager), held by `causal_mask_mapping` until
/// the model returns, and read by no layer.
pub fn embed(b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
    b.part = Part::Embedding;
    b.module = "model.embed_tokens";
    let emb_w = p.w(b, "embed_tokens.weight");
    let x0 = match emb_w {
        Some(w) => super::llama::embedding(b, ids, w),
        None => b.plain("embedding", &[ids], tok(Q::H), Dt::Resid),
    };
    let mut sh = positions(b, spec, attn);
    sh.emb_w = if spec.tied { emb_w } else { None };
    sh.locals[0] = Some(x0);
    (x0, sh)
}

/// What `Qwen2MoeModel.forward` computes after the embedding (also a later pipeline stage's
/// prologue): `position_ids`, both masks (the sliding one, unused, a model-level local), RoPE.
pub fn positions(b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
    b.module = "model";
    b.part = Part::Embedding;
    let (pos, mask) = super::llama::positions_and_mask(b, attn);
    let unused = super::mistral::sliding_mask(b, pos, attn);
    let (cos, sin) = super::llama::rotary(b, spec, pos);
    Shared {
        cos: Some(cos),
        sin: Some(sin),
        pos: Some(pos),
        mask,
        mask_local: None,
        emb_w: None,
        locals: [None, Some(unused)],
        cos_local: None,
        sin_local: None,
    }
}

/// Qwen2-MoE (`modeling_qwen2_moe.py`): Llama's layers with sparse blocks of softmax-then-top-k
/// experts beside a gated shared expert, and the unused sliding-window mask its model builds.
pub struct Qwen2Moe;
impl Modeling for Qwen2Moe {
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        embed(b, p, spec, ids, attn)
    }
    fn receive(&self, b: &mut Builder, _p: &Params, spec: &ModelSpec, attn: Attention) -> (Tid, Shared) {
        let x0 = received(b);
        (x0, positions(b, spec, attn))
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
}

/// Qwen3-MoE (`modeling_qwen3_moe.py`): Qwen3's attention (per-head q/k norms) with sparse
/// blocks of softmax-then-top-k experts, renormalised.
pub struct Qwen3Moe;
impl Modeling for Qwen3Moe {
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        layer(b, p, spec, x, sh, kind, attn)
    }
}
