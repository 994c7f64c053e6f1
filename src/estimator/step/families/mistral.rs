//! Sliding-window attention on Llama's layer (`modeling_mistral.py`: Mistral passes
//! `config.sliding_window` to every layer) and the masks `masking_utils.py` builds for it:
//! `create_sliding_window_causal_mask` materializes a mask whenever the window is shorter than
//! the keys (`_ignore_causal_mask_sdpa`: `kv_length >= local_attention_size` forbids the
//! `is_causal` shortcut) — a bool `[1, 1, s, s_kv]` for SDPA, the additive `[b, 1, s, s_kv]` for
//! eager. With a mask, `sdpa_attention_forward` cannot use SDPA's GQA path: it repeats k and v to
//! `a` heads (`repeat_kv`; `llama::sdpa_masked`), and `F.scaled_dot_product_attention` turns the bool mask into an
//! additive one in the query's dtype (`where`), which the CPU flash kernel keeps for backward.

use super::super::ir::{Builder, Dim, Dt, Shape, Split, Tid};
use super::common::{has_rope, Params, Shared};
use super::common::{mask_shape, masked, received};
use super::llama::{embedding, packed_detection, rotary};
use super::modeling::Modeling;
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::Attention;
use crate::estimator::model::{LayerRule, ModelSpec, NormKind, WindowKind};
use crate::estimator::step::part::Part;

/// Whether the window is set: on every layer (`config.sliding_window` not null). Without one
/// Mistral runs Llama's code.
pub fn slides(spec: &ModelSpec) -> bool {
    spec.window > 0
        && spec.window_kind == WindowKind::Sliding
        && spec.window_layers == LayerRule::All
        && spec.norm == NormKind::Rmsnorm
        && spec.experts == 0
        && !spec.fused_qkv
        && spec.kv_lora_rank == 0
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

/// Mistral (`modeling_mistral.py`): Llama's layers, with the sliding-window mask once
/// `config.sliding_window` is set.
pub struct Mistral;
impl Modeling for Mistral {
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        if slides(spec) {
            embed(b, p, spec, ids, attn)
        } else {
            super::llama::embed(b, p, spec, ids, attn)
        }
    }
    fn receive(&self, b: &mut Builder, _p: &Params, spec: &ModelSpec, attn: Attention) -> (Tid, Shared) {
        let x0 = received(b);
        let sh = if slides(spec) { positions(b, spec, attn) } else { super::llama::positions(b, spec, attn) };
        (x0, sh)
    }
    /// Eager's mask, and SDPA's once the window is shorter than the keys.
    fn mask_shapes(&self, b: &Builder, spec: &ModelSpec, attn: Attention) -> [Option<(Shape, Dt)>; 2] {
        let mask = attn == Attention::Eager || (slides(spec) && masked(spec.window, b.c.n(Q::S_KV)));
        [mask.then(|| mask_shape(attn)), None]
    }
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

    /// Each toy config is read as its own family (the importer decides it from `model_type`).
    #[test]
    fn the_imported_toys_carry_their_families() {
        use crate::estimator::family::Family;
        for (name, json) in toys() {
            let spec = import_value(&json).expect("imports").spec;
            assert_eq!(Some(spec.family), Family::from_model_type(name), "{name}");
        }
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
