//! The `framework = megatron` profile: Megatron-LM's tensor list.

use super::super::config::{Attention, Recompute};
use super::super::expr::Expr;
use super::super::model::MlpKind;
use super::super::precision::BOOL_BYTES;
use super::terms::Terms;
use crate::estimator::ctx::{Ctx, A, B, D, E, F, F_E, H, KV, K_TOP, P, S, S_KV, V};
use crate::estimator::part::Part;

/// Megatron-LM's tensor list (Korthikanti et al. 2022, §4.1, generalized to GQA, gated MLPs and
/// flash attention), per layer:
/// - attention: 2sbh (QKV input) + 2sb(a+2k)d (Q, K, V) + [unfused: 2as²b scores + as²b mask +
///   2as²b dropout output | flash: 2sbad output + 4abs lse] + 2sbad (projection input) + sbh
///   (dropout mask);
/// - MLP: 2sbh + f-sized intermediates + sbh mask;
/// - two LayerNorm inputs: 2 × 2sbh.
pub fn megatron_terms(c: &Ctx, t: &mut Terms) {
    let spec = &c.cfg.arch;
    let dropout = c.cfg.dropout > 0.0;
    let full = c.cfg.recompute == Recompute::Full;
    let selective = c.cfg.recompute == Recompute::Selective;
    t.first.push((Part::Embedding, c.t(c.i64(), &[B, S])));
    if full {
        t.layer.push((Part::Checkpoints, c.sp_split(c.t(c.v(P), &[B, S, H]))));
    } else {
        for _ in 0..2 {
            t.layer.push((Part::Norms, c.sp_split(c.t(c.v(P), &[B, S, H]))));
        }
        t.layer.push((Part::AttentionInputs, c.sp_split(c.t(c.pl(), &[B, S, H]))));
        let qkv = Expr::prod([c.v(P), c.v(B), c.v(S), Expr::sum([c.v(A), Expr::prod([Expr::num(2u8), c.v(KV)])]), c.v(D)]);
        t.layer.push((Part::AttentionCore, c.tp_split(qkv)));
        if !selective {
            if c.cfg.attn == Attention::Eager {
                let scores = [B, A, S, S_KV];
                t.layer.push((Part::AttentionCore, c.tp_split(c.t(c.v(P), &scores))));
                if dropout {
                    t.layer.push((Part::AttentionCore, c.tp_split(c.t(Expr::konst("BOOL_BYTES", BOOL_BYTES), &scores))));
                    t.layer.push((Part::AttentionCore, c.tp_split(c.t(c.v(P), &scores))));
                }
            } else {
                t.layer.push((Part::AttentionCore, c.tp_split(c.t(c.fp32(), &[B, A, S]))));
            }
        }
        t.layer.push((Part::AttentionInputs, c.tp_split(c.t(c.pl(), &[B, S, A, D]))));
        t.dense_layer.push((Part::Mlp, c.sp_split(c.t(c.pl(), &[B, S, H]))));
        let f_elems: u8 = if spec.mlp == MlpKind::Gated { 3 } else { 2 };
        t.dense_layer.push((Part::Mlp, c.tp_split(Expr::prod([Expr::num(f_elems), c.v(P), c.v(B), c.v(S), c.v(F)]))));
        if dropout {
            for _ in 0..2 {
                t.layer.push((Part::Dropout, c.sp_split(c.t(Expr::konst("BOOL_BYTES", BOOL_BYTES), &[B, S, H]))));
            }
        }
        if spec.moe_layers() > 0 {
            moe_terms(c, &mut t.moe_layer);
        }
    }
    t.last.push((Part::Head, c.sp_split(c.t(c.v(P), &[B, S, H]))));
    t.last.push((Part::Head, c.t(c.pl(), &[B, S, H])));
    // Vocab-parallel cross-entropy keeps the fp32 logits shard.
    t.last.push((Part::Loss, c.tp_split(c.t(c.fp32(), &[B, S, V]))));
}

/// The MoE block's saved tensors (transformers' grouped_mm layout, FINDINGS.md §2.2): sizes
/// depend only on S = b·s·K token–expert pairs, not on the routing.
fn moe_terms(c: &Ctx, out: &mut Vec<(Part, Expr)>) {
    let spec = &c.cfg.arch;
    let e = Expr::var(E, spec.experts);
    let k = Expr::var(K_TOP, spec.top_k);
    let fe = Expr::var(F_E, spec.expert_ffn);
    let fp32 = c.fp32();
    let i64b = c.i64();
    let bs = || [c.v(B), c.v(S)];
    let pairs = |bytes: Expr, more: &[Expr]| {
        let mut v = vec![bytes];
        v.extend(bs());
        v.push(k.clone());
        v.extend(more.iter().cloned());
        Expr::prod(v)
    };
    // Router: fp32 softmax [T,E], top-k indices (int64) and values (fp32), their sum.
    out.push((Part::Moe, Expr::prod([fp32.clone(), c.v(B), c.v(S), e.clone()])));
    out.push((Part::Moe, pairs(i64b.clone(), &[])));
    out.push((Part::Moe, pairs(fp32.clone(), &[])));
    out.push((Part::Moe, c.t(fp32.clone(), &[B, S])));
    // Experts: 3 int64 index tensors, int32 offsets [E], gathered tokens, gate_up [S,2f_e],
    // act(gate), down input, fp32 routing weights, down output.
    let pe = if c.amp { c.pr() } else { c.v(P) };
    out.push((Part::Moe, pairs(Expr::prod([Expr::num(3u8), i64b]), &[])));
    out.push((Part::Moe, Expr::prod([Expr::konst("INT32_BYTES", 4u8), e])));
    out.push((Part::Moe, pairs(pe.clone(), &[c.v(H)])));
    out.push((Part::Moe, pairs(Expr::prod([Expr::num(2u8), pe.clone()]), std::slice::from_ref(&fe))));
    out.push((Part::Moe, pairs(pe.clone(), std::slice::from_ref(&fe))));
    out.push((Part::Moe, pairs(pe.clone(), &[fe])));
    out.push((Part::Moe, pairs(fp32, &[])));
    out.push((Part::Moe, pairs(pe, &[c.v(H)])));
}
