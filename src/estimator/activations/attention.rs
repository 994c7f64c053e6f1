//! Attention: the projections' inputs, q/k norms, and the core — eager attention's materialized
//! scores, SDPA/FlashAttention's q, k, v, output and log-sum-exp, CPU SDPA's math fallback under
//! dropout, and what selective recomputation keeps.

use super::super::config::{Attention, Recompute};
use super::super::expr::Expr;
use super::super::model::{Positions, QkNorm};
use super::super::precision::FP32_BYTES;
use super::ctx::{Ctx, A, B, D, H, KV, P, S, S_KV};
use super::{Part, Saves, Terms};

/// The input of the q, k, v projections (they share it; under autocast each casts its own bf16
/// copy): p·b·s·h, or n_proj × 2·b·s·h under autocast.
pub fn projection_input_terms(c: &Ctx, sv: &Saves, t: &mut Terms) {
    let spec = &c.cfg.arch;
    let n_proj: u64 = if spec.fused_qkv { 1 } else { 3 };
    if sv.qkv_in {
        if c.amp {
            let e = Expr::prod([Expr::num(n_proj), c.bf16(), c.v(B), c.v(S), c.v(H)]);
            t.layer.push((Part::AttentionInputs, c.sp_split(e)));
        } else {
            t.layer.push((Part::AttentionInputs, c.sp_split(c.t(c.pl(), &[B, S, H]))));
        }
    }
}

/// q/k norms (Qwen3, Gemma-3 per head; OLMo-2 over all heads; StableLM per-head LayerNorms):
/// each keeps its fp32 input and statistics, and the normalised input when the weight learns.
pub fn qk_norm_terms(c: &Ctx, sv: &Saves, t: &mut Terms) {
    let spec = &c.cfg.arch;
    match spec.qk_norm {
        QkNorm::None => {}
        QkNorm::Head | QkNorm::Full | QkNorm::PerHead => {
            for heads in [A, KV] {
                let width = [B, S, heads, D];
                let stats = if spec.qk_norm == QkNorm::Full { vec![B, S] } else { vec![B, S, heads] };
                let mut e = vec![c.t(c.fp32(), &width), c.t(c.fp32(), &stats)];
                if sv.norm_weight {
                    e.push(c.t(c.v(P), &width));
                }
                for x in e {
                    t.layer.push((Part::AttentionCore, c.tp_split(x)));
                }
            }
        }
    }
}

/// The attention core: what eager attention, SDPA/FlashAttention, CPU SDPA's math fallback
/// (dropout on CPU) or selective recomputation keep between the projections.
pub fn core_terms(c: &Ctx, sv: &Saves, t: &mut Terms) {
    let spec = &c.cfg.arch;
    let eager = c.cfg.attn == Attention::Eager;
    let dropout = c.cfg.dropout > 0.0;
    let selective = c.cfg.recompute == Recompute::Selective;
    let qc = |e| c.tp_split(e);
    let p_core = if c.amp { c.bf16() } else { c.v(P) };
    if selective {
        // The core is recomputed in backward: only its inputs q, k, v and its output stay.
        for heads in [A, KV, KV] {
            t.layer.push((Part::AttentionCore, qc(Expr::prod([p_core.clone(), c.v(B), c.v(S), c.v(heads), c.v(D)]))));
        }
        t.layer.push((Part::AttentionInputs, qc(c.t(p_core.clone(), &[B, S, A, D]))));
    } else if eager || (dropout && !c.cuda) {
        let math_fallback = !eager;
        if math_fallback {
            // CPU SDPA with dropout falls back to the math kernel: fp32 q, k, v at a heads, fp32
            // softmax, mask and dropped probabilities.
            for _ in 0..3 {
                t.layer.push((Part::AttentionCore, qc(c.t(c.fp32(), &[B, S, A, D]))));
            }
            for _ in 0..3 {
                t.layer.push((Part::AttentionCore, qc(c.t(c.fp32(), &[B, A, S, S_KV]))));
            }
        } else {
            // q, k repeated to a heads, v repeated (repeat_kv copies even for MHA).
            for _ in 0..3 {
                t.layer.push((Part::AttentionCore, qc(Expr::prod([p_core.clone(), c.v(B), c.v(S), c.v(A), c.v(D)]))));
            }
            eager_scores(c, t, spec.softcap, spec.softmax_fp32);
        }
        if sv.o_in {
            let p = if math_fallback { c.v(P) } else { p_core.clone() };
            t.layer.push((Part::AttentionInputs, qc(Expr::prod([p, c.v(B), c.v(S), c.v(A), c.v(D)]))));
        }
    } else {
        // SDPA / FlashAttention: q, k, v (k and v at k heads: enable_gqa), output, fp32 logsumexp.
        let rope = spec.positions == Positions::Rope;
        if spec.fused_qkv && !rope {
            // q, k, v are views of the fused output: its whole storage (GPT-2).
            let e = Expr::prod([p_core.clone(), c.v(B), c.v(S), Expr::sum([c.v(A), Expr::prod([Expr::num(2u8), c.v(KV)])]), c.v(D)]);
            t.layer.push((Part::AttentionCore, qc(e)));
        } else {
            t.layer.push((Part::AttentionCore, qc(Expr::prod([p_core.clone(), c.v(B), c.v(S), c.v(A), c.v(D)]))));
            t.layer.push((Part::AttentionCore, qc(Expr::prod([p_core.clone(), c.v(B), c.v(S), c.v(KV), c.v(D)]))));
            if spec.fused_qkv {
                // v is a view of the fused qkv output: the whole storage stays (Phi-3).
                let e = Expr::prod([p_core.clone(), c.v(B), c.v(S), Expr::sum([c.v(A), Expr::prod([Expr::num(2u8), c.v(KV)])]), c.v(D)]);
                t.layer.push((Part::AttentionCore, qc(e)));
            } else {
                t.layer.push((Part::AttentionCore, qc(Expr::prod([p_core.clone(), c.v(B), c.v(S), c.v(KV), c.v(D)]))));
            }
        }
        // The output; it is o_proj's input too unless RoPE's cat changed the layout (Phi-3).
        t.layer.push((Part::AttentionCore, qc(Expr::prod([p_core.clone(), c.v(B), c.v(S), c.v(A), c.v(D)]))));
        if spec.fused_qkv && rope && sv.o_in {
            t.layer.push((Part::AttentionInputs, qc(Expr::prod([p_core.clone(), c.v(B), c.v(S), c.v(A), c.v(D)]))));
        }
        t.layer.push((Part::AttentionCore, qc(c.t(c.fp32(), &[B, A, S]))));
    }
}

/// Bytes of eager attention's score matrices beyond Q/K/V.
pub fn eager_scores(c: &Ctx, t: &mut Terms, spec_softcap: bool, softmax_fp32: bool) {
    let scores = [B, A, S, S_KV];
    let mut push = |e: Expr| t.layer.push((Part::AttentionCore, c.tp_split(e)));
    if spec_softcap {
        // Gemma-2: tanh(scores / cap) keeps its result (model dtype).
        push(c.t(c.v(P), &scores));
    }
    let dropout = c.cfg.dropout > 0.0;
    if softmax_fp32 || c.amp {
        // softmax(dtype=fp32) keeps its fp32 result...
        push(c.t(c.fp32(), &scores));
        if dropout {
            // ... dropout keeps its mask and probs @ v keeps the dropped probabilities.
            let mask = c.dropout_mask();
            push(c.t(mask, &scores));
            push(c.t(c.v(P), &scores));
        } else if c.n(P) != FP32_BYTES {
            // ... and probs @ v keeps its cast to the compute dtype.
            push(c.t(c.v(P), &scores));
        }
    } else {
        // GPT-2: softmax in the model dtype.
        push(c.t(c.v(P), &scores));
        if dropout {
            let mask = c.dropout_mask();
            push(c.t(mask, &scores));
            push(c.t(c.v(P), &scores));
        }
    }
}
