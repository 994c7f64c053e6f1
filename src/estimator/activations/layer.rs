//! One decoder layer of Hugging Face transformers, block by block: norms, attention, the
//! residual dropout, the feed-forward block (dense MLP or mixture of experts), LoRA adapters and
//! autocast's weight copies. Each block is a function; [`layer_terms`] runs them in forward order.

use super::super::config::{Finetune, LoraTargets};
use super::super::expr::{Expr, Sym};
use super::super::model::{MlpKind, NormKind};
use super::ctx::{Ctx, B, F, F_S, H, K_TOP, P, R, S};
use super::{attention, mlp, moe, norms, Part, Saves, Terms};

/// Everything one decoder layer keeps, in forward order.
pub fn layer_terms(c: &Ctx, sv: &Saves, t: &mut Terms) {
    norm_layer_terms(c, sv, t);
    attention::projection_input_terms(c, sv, t);
    attention::qk_norm_terms(c, sv, t);
    attention::core_terms(c, sv, t);
    residual_dropout_terms(c, t);
    feed_forward_terms(c, sv, t);
    lora_terms(c, t);
    autocast_weight_terms(c, t);
}

/// The layer's norms. Pre-norm layers' norm outputs feed linears (counted as their inputs);
/// Gemma-2's post-norms and OLMo-2's feed the residual adds and keep nothing more.
fn norm_layer_terms(c: &Ctx, sv: &Saves, t: &mut Terms) {
    let spec = &c.cfg.arch;
    let shared_input = spec.parallel && spec.layer_norms == 2 && matches!(spec.norm, NormKind::Layernorm | NormKind::LayernormNoBias);
    for i in 0..spec.layer_norms {
        let mut terms = norms::norm_terms(c, spec.norm, sv.norm_weight, H);
        if shared_input && i == 1 {
            // NeoX/Falcon-40B: both LayerNorms read the same residual; its storage counts once.
            terms.remove(0);
        }
        for e in terms {
            t.layer.push((Part::Norms, c.sp_split(e)));
        }
    }
}

/// The dropout mask after the attention output (GPT-2, Phi, OPT, NeoX, Falcon, StarCoder2).
fn residual_dropout_terms(c: &Ctx, t: &mut Terms) {
    let spec = &c.cfg.arch;
    let dropout = c.cfg.dropout > 0.0;
    if dropout && spec.resid_dropout {
        t.layer.push((Part::Dropout, c.sp_split(c.t(c.dropout_mask(), &[B, S, H]))));
    }
}

/// The feed-forward block: the dense MLP on dense layers, the router, experts and shared experts
/// on MoE layers, each with the input its first linears keep.
fn feed_forward_terms(c: &Ctx, sv: &Saves, t: &mut Terms) {
    let spec = &c.cfg.arch;
    let dropout = c.cfg.dropout > 0.0;
    // The MLP (dense layers) or MoE block.
    let mlp_in = |t: &mut Vec<(Part, Expr)>, part: Part, n_in: u64| {
        if c.amp {
            t.push((part, c.sp_split(Expr::prod([Expr::num(n_in), c.bf16(), c.v(B), c.v(S), c.v(H)]))));
        } else {
            t.push((part, c.sp_split(c.t(c.pl(), &[B, S, H]))));
        }
    };
    let parallel_shared = spec.parallel && spec.layer_norms == 1;
    let dense = &mut t.dense_layer;
    if sv.mlp_in && !(parallel_shared && sv.qkv_in && !c.amp) {
        let n_in = if spec.mlp == MlpKind::Gated && !spec.fused_gate_up { 2 } else { 1 };
        mlp_in(dense, Part::Mlp, n_in);
    }
    mlp::mlp_terms(c, sv, dense, c.v(F), Part::Mlp);
    if dropout && spec.resid_dropout {
        t.dense_layer.push((Part::Dropout, c.sp_split(c.t(c.dropout_mask(), &[B, S, H]))));
    }
    if spec.moe_layers() > 0 {
        let moe = &mut t.moe_layer;
        // The router's input (the norm output) is kept: the router's matmul saves it.
        mlp_in(moe, Part::Moe, 1);
        moe::moe_terms(c, moe);
        if spec.shared_experts > 0 {
            mlp::mlp_terms(c, sv, moe, Expr::var(F_S, spec.shared_ffn * spec.shared_experts), Part::Moe);
            if spec.shared_gate {
                // sigmoid(gate(x)) [b,s,1] and the shared output [b,s,h] meet in a product.
                moe.push((Part::Moe, c.t(c.v(P), &[B, S])));
                moe.push((Part::Moe, c.t(c.v(P), &[B, S, H])));
            }
        }
        if dropout && spec.resid_dropout {
            moe.push((Part::Dropout, c.sp_split(c.t(c.dropout_mask(), &[B, S, H]))));
        }
    }
}

/// LoRA: lora_B keeps lora_A's output (b·s·r) for each adapted linear (peft `LoraLayer`).
fn lora_terms(c: &Ctx, t: &mut Terms) {
    let spec = &c.cfg.arch;
    let lora = c.cfg.finetune != Finetune::Full;
    if lora {
        let targets = c.cfg.lora_targets;
        let count = |bits: &[u8]| bits.iter().filter(|&&b| targets.has(b)).count() as u64;
        let attn = if spec.fused_qkv {
            u64::from(count(&[LoraTargets::Q, LoraTargets::K, LoraTargets::V]) > 0)
        } else {
            count(&[LoraTargets::Q, LoraTargets::K, LoraTargets::V])
        } + count(&[LoraTargets::O]);
        let mlp = if spec.fused_gate_up {
            u64::from(count(&[LoraTargets::GATE, LoraTargets::UP]) > 0)
        } else {
            count(&[LoraTargets::GATE, LoraTargets::UP])
        } + count(&[LoraTargets::DOWN]);
        let r = Expr::var(R, c.cfg.lora_rank);
        if attn > 0 {
            t.layer.push((Part::Lora, Expr::prod([Expr::num(attn), c.v(P), c.v(B), c.v(S), r.clone()])));
        }
        if mlp > 0 {
            t.dense_layer.push((Part::Lora, Expr::prod([Expr::num(mlp), c.v(P), c.v(B), c.v(S), r.clone()])));
            if spec.moe_layers() > 0 {
                let k = Expr::var(K_TOP, spec.top_k);
                t.moe_layer.push((Part::Lora, Expr::prod([Expr::num(mlp), c.v(P), c.v(B), c.v(S), k, r])));
            }
        }
    }
}

/// Autocast's bf16 weight copies, per layer: every GEMM weight is cast once and the cast is saved
/// for backward (torch.autocast's weight cache; FINDINGS.md §5).
fn autocast_weight_terms(c: &Ctx, t: &mut Terms) {
    let spec = &c.cfg.arch;
    if c.amp {
        let (qw, kvw) = (spec.q_width(), spec.kv_width());
        let attn = spec.hidden * (qw + 2 * kvw) + qw * spec.hidden;
        let w = Sym::new("W", "attn", "GEMM weight elements of one layer's attention");
        t.layer.push((Part::Autocast, c.tp_split(Expr::prod([c.bf16(), Expr::var(w, attn)]))));
        let mats: u64 = if spec.mlp == MlpKind::Gated { 3 } else { 2 };
        let wm = Sym::new("W", "mlp", "GEMM weight elements of one layer's MLP");
        t.dense_layer.push((Part::Autocast, c.tp_split(Expr::prod([c.bf16(), Expr::var(wm, mats * spec.hidden * spec.ffn)]))));
        if spec.moe_layers() > 0 {
            // The router linear casts its weight; grouped_mm experts have no autocast policy.
            let wr = Sym::new("W", "router", "router weight elements");
            t.moe_layer.push((Part::Autocast, Expr::prod([c.bf16(), Expr::var(wr, spec.experts * spec.hidden)])));
        }
    }
}
