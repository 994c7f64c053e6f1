//! Working memory beside the saved tensors: what exists only around one op (eager attention's
//! raw scores, a layer's backward gradients, the loss's logits and their gradients).

use super::super::config::{Attention, Config, Loss, Recompute};
use super::super::expr::{Expr, Sym};
use super::super::params::Stage;
use super::super::precision::FP32_BYTES;
use super::ctx::{Ctx, A, B, D, F, F_E, H, KV, K_TOP, P, S, S_KV, V};

/// Working memory beyond what is saved, as formulas (for the transient rows and the step).
#[derive(Clone, Debug, PartialEq)]
pub struct Working {
    /// Unsaved intermediates inside one layer's forward (eager: raw scores and their fp32 upcast).
    pub layer_forward: Expr,
    /// Eager attention's additive mask, alive for the whole forward.
    pub mask_forward: Expr,
    /// Gradients of one layer's largest intermediates, alive at once in its backward.
    pub layer_backward: Expr,
    /// The saved tensors of one layer, re-materialized in its backward (full recomputation).
    pub recompute_layer: Expr,
    /// Logits and their fp32 copy while the loss runs forward.
    pub loss_forward: Expr,
    /// dL/dlog_probs and dL/dlogits (fp32) beside the saved log_probs in the loss's backward.
    pub loss_backward: Expr,
}

/// Estimates of the transient buffers around the saved ones:
/// - eager forward: the raw scores and their fp32 upcast before softmax, (p + 4)·b·a·s·s_kv,
///   and the additive mask p·b·s·s_kv (transformers' `create_causal_mask`);
/// - backward of a layer: the gradients of its largest intermediates alive at once (eager: dS
///   in fp32 and dP in p, plus dq, dk, dv; SDPA: FlashAttention's fp32 dq accumulator and dq,
///   dk, dv; MLP: three f-wide gradients) plus the incoming gradient p·b·s·h;
/// - loss forward: the logits (p) and their fp32 copy (`logits.float()`); loss backward:
///   dL/dlog_probs and dL/dlogits, both fp32 (torch log_softmax_backward).
pub fn working_memory(c: &Ctx, cfg: &Config) -> Working {
    let spec = &cfg.arch;
    let eager = cfg.attn == Attention::Eager;
    let p4 = || Expr::sum([c.v(P), c.fp32()]);
    let zero = Expr::zero;
    let layer_forward = if eager { c.tp_split(Expr::prod([p4(), c.v(B), c.v(A), c.v(S), c.v(S_KV)])) } else { zero() };
    let mask_forward = if eager { c.t(c.v(P), &[B, S, S_KV]) } else { zero() };
    let attn_bwd = if eager {
        Expr::sum([
            c.tp_split(Expr::prod([p4(), c.v(B), c.v(A), c.v(S), c.v(S_KV)])),
            c.tp_split(Expr::prod([Expr::num(3u8), c.v(P), c.v(B), c.v(S), c.v(A), c.v(D)])),
        ])
    } else {
        Expr::sum([
            c.tp_split(Expr::prod([p4(), c.v(B), c.v(S), c.v(A), c.v(D)])),
            c.tp_split(Expr::prod([Expr::num(2u8), c.v(P), c.v(B), c.v(S), c.v(KV), c.v(D)])),
        ])
    };
    let width = if spec.ffn >= spec.expert_ffn * spec.top_k {
        c.v(F)
    } else {
        Expr::prod([Expr::var(K_TOP, spec.top_k), Expr::var(F_E, spec.expert_ffn)])
    };
    let mlp_bwd = c.tp_split(Expr::prod([Expr::num(3u8), c.v(P), c.v(B), c.v(S), width]));
    let layer_backward = Expr::sum([Expr::max([attn_bwd, mlp_bwd]), c.t(c.v(P), &[B, S, H])]);
    let (loss_forward, loss_backward) = match cfg.loss {
        Loss::Standard => {
            let logits = c.tp_split(c.t(c.v(P), &[B, S, V]));
            let fwd = if c.n(P) == FP32_BYTES { logits } else { Expr::sum([logits, c.tp_split(c.t(c.fp32(), &[B, S, V]))]) };
            (fwd, c.tp_split(Expr::prod([Expr::num(2u8), c.fp32(), c.v(B), c.v(S), c.v(V)])))
        }
        Loss::Chunked => {
            // Liger's chunk: ⌈b·s / ⌈V/h⌉⌉ rows of fp32 logits and their gradient.
            let rows = (c.n(B) * c.n(S)).div_ceil(c.n(V).div_ceil(c.n(H).max(1)).max(1));
            let n = Sym::new("n", "chunk", "rows of a loss chunk: ⌈b·s / ⌈V/h⌉⌉ (Liger)");
            (c.tp_split(Expr::prod([Expr::num(2u8), c.fp32(), Expr::var(n, rows), c.v(V)])), zero())
        }
    };
    let recompute_layer = if cfg.recompute == Recompute::Full {
        let c2 = Config { recompute: Recompute::None, pp: 1, ..cfg.clone() };
        let r = super::super::precision::recipe(cfg.precision);
        let one = super::activations(&c2, &r, Stage::Whole, 1);
        Expr::var(Sym::new("A", "layer", "saved bytes of one layer, recomputed"), one.per_layer)
    } else {
        zero()
    };
    Working { layer_forward, mask_forward, layer_backward, recompute_layer, loss_forward, loss_backward }
}
