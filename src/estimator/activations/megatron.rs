//! The `framework = megatron` profile: Megatron-LM's tensor list.

use super::super::config::{Attention, Recompute};
use super::super::expr::Expr;
use super::super::model::MlpKind;
use super::super::precision::BOOL_BYTES;
use super::ctx::{Ctx, A, B, D, F, H, KV, P, S, S_KV, V};
use super::{moe, Part, Terms};

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
            moe::moe_terms(c, &mut t.moe_layer);
        }
    }
    t.last.push((Part::Head, c.sp_split(c.t(c.v(P), &[B, S, H]))));
    t.last.push((Part::Head, c.t(c.pl(), &[B, S, H])));
    // Vocab-parallel cross-entropy keeps the fp32 logits shard.
    t.last.push((Part::Loss, c.tp_split(c.t(c.fp32(), &[B, S, V]))));
}
