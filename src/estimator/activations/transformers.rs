//! A Hugging Face transformers model, end to end: the embedding and positions, the decoder
//! layers (or, under full recomputation, only what each checkpoint keeps), the final norm, the
//! LM head's input and the loss (FINDINGS.md §1).

use super::super::config::{Attention, Loss, Recompute};
use super::super::expr::{Expr, Sym};
use super::super::model::{NormKind, Positions};
use super::super::precision::FP32_BYTES;
use super::ctx::{Ctx, B, D, D_ROT, H, P, S, S_KV, V};
use super::{layer, norms, Part, Saves, Terms};

/// Every tensor the model keeps for backward, by where it lives (first stage, each layer, last
/// stage).
pub fn transformers_terms(c: &Ctx, sv: &Saves, t: &mut Terms) {
    embedding_terms(c, sv, t);
    if c.cfg.recompute == Recompute::Full {
        checkpoint_terms(c, t);
    } else {
        layer::layer_terms(c, sv, t);
    }
    head_and_loss_terms(c, sv, t);
}

/// The first stage: token ids (the embedding's backward gathers by them), RoPE's cos/sin or the
/// learned positions' ids, Gemma's scale, the embedding dropout mask and OPT's projection input.
fn embedding_terms(c: &Ctx, sv: &Saves, t: &mut Terms) {
    let spec = &c.cfg.arch;
    let dropout = c.cfg.dropout > 0.0;
    if sv.embedding {
        t.first.push((Part::Embedding, c.t(c.i64(), &[B, S])));
    }
    if spec.norm == NormKind::RmsnormGemma {
        // Gemma scales the embedding by a 0-dim sqrt(h) tensor in the model dtype.
        t.first.push((Part::Embedding, c.pr()));
    }
    match spec.positions {
        Positions::Rope => {
            // cos and sin [1, s, d_rot], shared by every layer (position_ids has no batch).
            let d_rot = (spec.head_dim * spec.rotary_pct).div_ceil(100).max(1);
            let d_sym = if d_rot == spec.head_dim { c.v(D) } else { Expr::var(D_ROT, d_rot) };
            t.first.push((Part::Embedding, Expr::prod([Expr::num(2u8), c.pr(), c.v(S), d_sym])));
        }
        Positions::Learned => {
            // GPT-2's wpe keeps position_ids [1, s]; OPT's positions come from the mask, [b, s].
            let e = if spec.pos_offset > 0 { c.t(c.i64(), &[B, S]) } else { c.t(c.i64(), &[S]) };
            t.first.push((Part::Embedding, e));
        }
        Positions::None => {}
    }
    if dropout && spec.embed_dropout {
        t.first.push((Part::Dropout, c.sp_split(c.t(c.dropout_mask(), &[B, S, H]))));
    }
    if spec.embed_proj > 0 && sv.embedding {
        t.first.push((
            Part::Embedding,
            Expr::prod([c.pr(), c.v(B), c.v(S), Expr::var(Sym::new("e", "", "OPT word_embed_proj_dim"), spec.embed_proj)]),
        ));
    }
}

/// Full recomputation (torch.utils.checkpoint, non-reentrant): each checkpointed layer keeps its
/// input, and the recompute closures keep the layer kwargs once — position ids, and in eager the
/// additive [b, 1, s, s_kv] mask (two for Gemma-2's sliding and full layers) (FINDINGS.md §4).
fn checkpoint_terms(c: &Ctx, t: &mut Terms) {
    let spec = &c.cfg.arch;
    let eager = c.cfg.attn == Attention::Eager;
    // Each checkpointed layer keeps its input; the recompute closure keeps the kwargs once.
    t.layer.push((Part::Checkpoints, c.sp_split(c.t(c.pr(), &[B, S, H]))));
    if spec.positions == Positions::Rope {
        t.first.push((Part::Checkpoints, c.t(c.i64(), &[S])));
    }
    if eager {
        let masks: u8 = if spec.norm == NormKind::RmsnormGemma && spec.layer_norms == 4 { 2 } else { 1 };
        t.first.push((Part::Checkpoints, Expr::prod([Expr::num(masks), c.pr(), c.v(B), c.v(S), c.v(S_KV)])));
    }
}

/// The last stage: the final norm, the LM head's input, autocast's copy of the head weight,
/// Gemma-2's final soft-capping and the loss (fp32 log-softmax, targets).
fn head_and_loss_terms(c: &Ctx, sv: &Saves, t: &mut Terms) {
    let spec = &c.cfg.arch;
    if spec.final_norm {
        for e in norms::norm_terms(c, spec.norm, sv.norm_weight, H) {
            t.last.push((Part::Head, c.sp_split(e)));
        }
    }
    if sv.head {
        if spec.embed_proj > 0 {
            t.last.push((Part::Head, c.t(c.pr(), &[B, S, H])));
        }
        let width = if spec.embed_proj > 0 { Expr::var(Sym::new("e", "", "OPT word_embed_proj_dim"), spec.embed_proj) } else { c.v(H) };
        let p = if c.amp { Expr::konst("BF16_BYTES", 2u8) } else { c.pl() };
        t.last.push((Part::Head, Expr::prod([p, c.v(B), c.v(S), width])));
    }
    if c.amp {
        // The lm_head's (or tied embedding's) weight cast once to bf16.
        t.last.push((Part::Autocast, c.tp_split(Expr::prod([Expr::konst("BF16_BYTES", 2u8), c.v(V), c.v(H)]))));
    }
    if spec.softcap {
        // Gemma-2's final-logit soft-capping keeps tanh(logits / cap) in the model dtype.
        t.last.push((Part::Loss, c.tp_split(c.t(c.v(P), &[B, S, V]))));
    }
    match c.cfg.loss {
        Loss::Standard => {
            t.last.push((Part::Loss, c.tp_split(c.t(c.fp32(), &[B, S, V]))));
            // Labels are padded to s + 1 and sliced; for b = 1 the slice is already contiguous,
            // so the whole padded storage is kept.
            let target = if c.n(B) == 1 { Expr::prod([c.i64(), Expr::sum([c.v(S), Expr::num(1u8)])]) } else { c.t(c.i64(), &[B, S]) };
            t.last.push((Part::Loss, target));
            t.last.push((Part::Loss, Expr::konst("NLL_TOTAL_WEIGHT_BYTES", FP32_BYTES)));
        }
        Loss::Chunked => {
            // Fused linear cross-entropy computes the input gradient during forward and keeps it.
            t.last.push((Part::Loss, c.t(c.v(P), &[B, S, H])));
            t.last.push((Part::Loss, c.t(c.i64(), &[B, S])));
        }
    }
}
