//! Sliding-window attention on Llama's layer (`modeling_mistral.py`: Mistral passes
//! `config.sliding_window` to every layer) and the masks `masking_utils.py` builds for it:
//! `create_sliding_window_causal_mask` materializes a mask whenever the window is shorter than
//! the keys (`_ignore_causal_mask_sdpa`: `kv_length >= local_attention_size` forbids the
//! `is_causal` shortcut) — a bool `[1, 1, s, s_kv]` for SDPA, the additive `[b, 1, s, s_kv]` for
//! eager. With a mask, `sdpa_attention_forward` cannot use SDPA's GQA path: it repeats k and v to
//! `a` heads (`repeat_kv`), and `F.scaled_dot_product_attention` turns the bool mask into an
//! additive one in the query's dtype (`where`), which the CPU flash kernel keeps for backward.

use super::super::ir::{Builder, Dim, Dt, Out, Shape, Split, Tid, B, S};
use super::llama::{embedding, packed_detection, repeat_kv, rotary};
use super::{has_rope, Params, Shared};
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::Attention;
use crate::estimator::model::{LayerRule, ModelSpec, NormKind, WindowKind};
use crate::estimator::step::part::Part;

/// Whether `spec` slides a window on every layer (Mistral; Llama-like families only — Gemma,
/// Phi-3, the MoE families and the LayerNorm families have their own layers).
pub fn is(spec: &ModelSpec) -> bool {
    spec.window > 0
        && spec.window_kind == WindowKind::Sliding
        && spec.window_layers == LayerRule::All
        && spec.norm == NormKind::Rmsnorm
        && spec.experts == 0
        && !spec.fused_qkv
        && spec.kv_lora_rank == 0
}

/// Whether a sliding mask exists at `s_kv` keys for a window of `window` tokens
/// (`_ignore_causal_mask_sdpa`: the shortcut needs `kv_length < local_attention_size`).
pub fn masked(window: u64, s_kv: u64) -> bool {
    s_kv >= window
}

/// The shape and dtype of a sliding mask as the layers receive it: SDPA's bool `[1, 1, s, s_kv]`
/// (`sdpa_mask`), or eager's additive `[b, 1, s, s_kv]` in the residual dtype.
pub fn mask_shape(attn: Attention) -> (Shape, Dt) {
    match attn {
        Attention::Eager => (Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None), Dt::Resid),
        _ => (Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None), Dt::Bool),
    }
}

/// `create_sliding_window_causal_mask` once the window is shorter than the keys: the
/// packed-sequence check, then `sdpa_mask` with `sliding_window_causal_mask_function`
/// (`kv > q - window` and `kv <= q`, two bool `[1, 1, s, s_kv]` and their `bitwise_and`s);
/// eager converts the result to the additive mask (`where(mask, 0, min)`, `[b, 1, s, s_kv]`).
pub fn sliding_mask(b: &mut Builder, pos: Tid, attn: Attention) -> Tid {
    packed_detection(b, pos);
    let s1 = || Shape::new(&[Dim::Q(Q::S)], Split::None);
    let ss = || Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None);
    let ba = b.plain("arange", &[], Shape::new(&[Dim::Q(Q::B)], Split::None), Dt::I64);
    let ha = b.plain("arange", &[], Shape::new(&[Dim::N(1)], Split::None), Dt::I64);
    let kv0 = b.plain("arange", &[], s1(), Dt::I64);
    let kv = b.plain("add", &[kv0], s1(), Dt::I64);
    let q0 = b.plain("arange", &[], s1(), Dt::I64);
    let qi = b.plain("add", &[q0], s1(), Dt::I64);
    let one = b.plain("new_ones", &[], Shape::scalar(), Dt::Bool);
    let sub = b.plain("sub", &[qi], s1(), Dt::I64);
    let gt = b.plain("gt", &[kv, sub], ss(), Dt::Bool);
    let and1 = b.plain("bitwise_and", &[one, gt], ss(), Dt::Bool);
    let le = b.plain("le", &[kv, qi], ss(), Dt::Bool);
    let and2 = b.plain("bitwise_and", &[and1, le], ss(), Dt::Bool);
    for t in [ba, ha, kv, qi] {
        b.hold(t);
    }
    let m = if attn == Attention::Eager {
        let zero = b.plain("zeros", &[], Shape::scalar(), Dt::Resid);
        let min = b.plain("scalar_tensor", &[], Shape::scalar(), Dt::Resid);
        let (shape, dt) = mask_shape(attn);
        b.plain("where", &[and2, zero, min], shape, dt)
    } else {
        and2
    };
    b.p.tensors[m as usize].part = Some(Part::Checkpoints);
    m
}

/// `MistralModel.forward` before the layers: Llama's, with the sliding-window mask in place of
/// the causal one (`create_sliding_window_causal_mask` when `config.sliding_window` is set).
pub fn embed(b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
    b.part = Part::Embedding;
    b.module = "model.embed_tokens";
    let emb_w = p.w(b, "embed_tokens.weight");
    let x0 = match emb_w {
        Some(w) => embedding(b, ids, w),
        None => b.plain("embedding", &[ids], super::super::blocks::shapes::tok(Q::H), Dt::Resid),
    };
    let mut sh = positions(b, spec, attn);
    sh.emb_w = if spec.tied { emb_w } else { None };
    sh.locals[0] = Some(x0);
    (x0, sh)
}

/// What `MistralModel.forward` computes after the embedding (also a later pipeline stage's
/// prologue): `position_ids`, the sliding-window mask (always for eager; for SDPA once the window
/// is shorter than the keys, else only its packed-sequence check), the rotary embedding.
pub fn positions(b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
    b.module = "model";
    b.part = Part::Embedding;
    let s1 = Shape::new(&[Dim::Q(Q::S)], Split::None);
    let ar = b.plain("arange", &[], s1, Dt::I64);
    let pos = b.plain("add", &[ar], s1, Dt::I64);
    b.p.tensors[pos as usize].part = Some(Part::Checkpoints);
    let mask = if attn == Attention::Eager || masked(spec.window, b.c.n(Q::S_KV)) {
        Some(sliding_mask(b, pos, attn))
    } else {
        super::llama::mask_only(b, pos, attn).1
    };
    let (cos, sin) = if has_rope(spec) {
        let (c, s) = rotary(b, spec, pos);
        (Some(c), Some(s))
    } else {
        (None, None)
    };
    Shared { cos, sin, pos: Some(pos), mask, mask_local: None, emb_w: None, locals: [None, None], cos_local: None, sin_local: None }
}

/// `sdpa_attention_forward` with a mask:
/// ```python
/// key = repeat_kv(key, module.num_key_value_groups)
/// value = repeat_kv(value, module.num_key_value_groups)
/// attn_output = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, is_causal=False)
/// ```
/// SDPA converts the bool mask to an additive one in q's dtype (`where` of two scalars,
/// `[b, 1, s, s_kv]`) and the CPU flash kernel keeps it with q, k, v, the output and the
/// log-sum-exp; its backward allocates dq, dk, dv (k and v at `a` heads, summed back to `k` heads
/// by `repeat_kv`'s ExpandBackward0). Returns `[b, s, a, d]` as the caller reshapes it.
pub fn sdpa_masked(b: &mut Builder, q: Tid, k: Tid, v: Tid, mask: Tid) -> Tid {
    // With dropout CPU SDPA runs its math path, as without a mask (`llama::sdpa_core`; the
    // mask's addition to the scores is not modelled there: no fixture measures it).
    if b.dropout && !b.c.cuda {
        return super::llama::sdpa_math(b, q, k, v);
    }
    let gqa = b.c.n(Q::KV) != b.c.n(Q::A);
    let (k, v) = if gqa { (repeat_kv(b, k), repeat_kv(b, v)) } else { (k, v) };
    let (q, k, v) = (b.autocast_in(q), b.autocast_in(k), b.autocast_in(v));
    let qdt = b.t(q).dt;
    let z = b.plain("scalar_tensor", &[], Shape::scalar(), qdt);
    let mn = b.plain("scalar_tensor", &[], Shape::scalar(), qdt);
    let am = b.plain("where", &[mask, z, mn], Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None), qdt);
    let rg = b.rg(q) || b.rg(k) || b.rg(v);
    let o: Out = b.out(b.shape(q), qdt, rg);
    let lse = b.out(Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::A), Dim::Q(Q::S)], Split::Tp), Dt::F32, false);
    let mut bw: Vec<B> = Vec::with_capacity(6);
    let mut temps = 0u8;
    let mut grads: Vec<(u8, u8)> = Vec::new();
    for (i, t) in [q, k, v].into_iter().enumerate() {
        if b.rg(t) {
            bw.push(B::Alloc { bytes: b.bytes(t), dtype: b.t(t).dtype, op: "_scaled_dot_product_flash_attention_for_cpu_backward" });
            grads.push((i as u8, temps));
            temps += 1;
        }
    }
    for (input, temp) in grads {
        bw.push(B::Grad { input, temp });
    }
    let r = b.op(
        "_scaled_dot_product_flash_attention_for_cpu",
        "ScaledDotProductFlashAttentionForCpuBackward0",
        &[q, k, v, am],
        &[o, lse],
        &[S::In(0), S::In(1), S::In(2), S::In(3), S::Out(0), S::Out(1)],
        &bw,
    );
    let ot = b.view(r[0], super::super::blocks::shapes::heads_bshd(Q::A), "TransposeBackward0", false);
    b.view(ot, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::A), Dim::Q(Q::D)], Split::Tp), "ViewBackward0", false)
}

#[cfg(test)]
mod tests {
    use crate::estimator::config::{Attention, Config, Kernels, OptimImpl, Precision, Recompute};
    use crate::estimator::expr::numbers_only;
    use crate::estimator::hf::import_value;
    use crate::estimator::params::stages;
    use crate::estimator::precision::recipe;
    use crate::estimator::step::fast;
    use crate::estimator::step::model::{simulate_stage, Setup};

    /// Toy configs of the families ported with the sliding-window masks, the local RoPE pair,
    /// fp32 RoPE and the unused Qwen2-MoE mask — the validation fixtures' shapes (window 48),
    /// with 3 layers so that a 3-stage pipeline has a middle stage.
    fn toys() -> Vec<(&'static str, serde_json::Value)> {
        let base = serde_json::json!({"hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 3, "vocab_size": 1000, "max_position_embeddings": 512});
        let with = |extra: serde_json::Value| {
            let mut v = base.clone();
            for (k, x) in extra.as_object().expect("object") {
                v[k] = x.clone();
            }
            v
        };
        vec![
            ("mistral", with(serde_json::json!({"model_type": "mistral", "head_dim": 16, "sliding_window": 48}))),
            (
                "gemma3_text",
                with(serde_json::json!({"model_type": "gemma3_text", "head_dim": 24, "sliding_window": 48,
                    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]})),
            ),
            (
                "qwen2_moe",
                with(serde_json::json!({"model_type": "qwen2_moe", "moe_intermediate_size": 40, "num_experts": 4,
                    "num_experts_per_tok": 2, "shared_expert_intermediate_size": 88, "mlp_only_layers": [0]})),
            ),
            ("olmo", with(serde_json::json!({"model_type": "olmo", "clip_qkv": 8.0}))),
            ("olmo2", with(serde_json::json!({"model_type": "olmo2"}))),
            ("gemma", with(serde_json::json!({"model_type": "gemma", "head_dim": 24}))),
        ]
    }

    /// Each toy config reaches its family's builder, and the neighbours do not (Mixtral is no
    /// Qwen-MoE, Gemma-2 no Gemma-3, Llama no Mistral).
    #[test]
    fn the_imported_families_route_to_their_own_builders() {
        use super::super::{gemma, olmo, qwen_moe};
        let spec = |name: &str| {
            let json = toys().into_iter().find(|(n, _)| *n == name).map(|(_, j)| j).expect("toy");
            import_value(&json).expect("imports").spec
        };
        assert!(super::is(&spec("mistral")));
        assert!(gemma::is3(&spec("gemma3_text")) && !super::is(&spec("gemma3_text")));
        assert!(qwen_moe::is(&spec("qwen2_moe")) && qwen_moe::two_masks(&spec("qwen2_moe")));
        assert!(olmo::is(&spec("olmo")) && spec("olmo").clip_qkv && olmo::is_any(&spec("olmo2")) && !olmo::is(&spec("olmo2")));
        assert!(gemma::is(&spec("gemma")) && !gemma::two_masks(&spec("gemma")));
        let mixtral = import_value(&serde_json::json!({"model_type": "mixtral", "vocab_size": 10, "hidden_size": 8,
            "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 6, "num_local_experts": 4,
            "num_experts_per_tok": 2}))
        .expect("imports")
        .spec;
        assert!(!qwen_moe::is(&mixtral) && !super::is(&mixtral));
        let gemma2 = import_value(&serde_json::json!({"model_type": "gemma2", "vocab_size": 10, "hidden_size": 8,
            "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 6, "head_dim": 4}))
        .expect("imports")
        .spec;
        assert!(gemma::two_masks(&gemma2) && !gemma::is3(&gemma2));
        let llama = import_value(&serde_json::json!({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
            "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 6}))
        .expect("imports")
        .spec;
        assert!(!super::is(&llama) && !qwen_moe::is(&llama) && !olmo::is_any(&llama) && !gemma::is(&llama));
    }

    /// Every pipeline stage's piecewise peak (what `estimate` reports) equals the maximum of its
    /// materialized stream, for sequences shorter and longer than the window — so the later
    /// stages' prologues and the layers' shared inputs agree with the model's own.
    #[test]
    fn the_pieces_match_the_stream_on_every_stage_of_the_sliding_and_fp32_rope_families() {
        let mut bad = Vec::new();
        let mut n = 0;
        for (name, json) in toys() {
            let spec = import_value(&json).expect("imports").spec;
            for (prec, attn, rec) in [
                (Precision::Bf16, Attention::Sdpa, Recompute::None),
                (Precision::Fp32, Attention::Eager, Recompute::Full),
                (Precision::Bf16, Attention::Sdpa, Recompute::Full),
            ] {
                for seq in [32, 64] {
                    for pp in [1, 3] {
                        let cfg = Config {
                            model: "custom".into(),
                            arch: spec.clone(),
                            seq,
                            batch: 2,
                            precision: prec,
                            attn,
                            recompute: rec,
                            kernels: Kernels::Cpu,
                            optim_impl: OptimImpl::Forloop,
                            pp,
                            gpus: pp,
                            ..Config::default()
                        };
                        let r = recipe(cfg.precision);
                        for &stage in stages(pp) {
                            let (m, f) = numbers_only(|| {
                                let s = simulate_stage(&cfg, &r, stage, Default::default(), 0);
                                let m = s.events.iter().map(|e| e.live).max().unwrap_or(0);
                                (m, fast::stage(&Setup::new(&cfg, &r, stage), 0).peak)
                            });
                            n += 1;
                            if m != f {
                                bad.push(format!("{name} {prec:?} {attn:?} {rec:?} s={seq} pp={pp} {stage:?}: stream {m} vs pieces {f}"));
                            }
                        }
                    }
                }
            }
        }
        assert!(n >= 6 * 3 * 2 * 4);
        assert!(bad.is_empty(), "{} of {n} differ:\n{}", bad.len(), bad.join("\n"));
    }
}
