//! The closed formulas the literature teaches (Korthikanti et al. 2022; the course's seed
//! material), evaluated for the same configuration, and why they differ from what the framework
//! keeps.

use super::super::config::{Attention, Config, Framework, Loss, Recompute};
use super::super::expr::{Expr, Sym};
use super::super::ledger::{Bytes, Category, Row, RowId};
use super::super::model::{Activation, MlpKind, NormKind};
use super::super::precision::{Dtype, FP32_BYTES};
use crate::estimator::ctx::{A, B, H, L};

/// The closed formulas the seed material teaches, for the same configuration, to set beside the
/// exact accounting.
pub fn textbook_rows(cfg: &Config) -> Vec<Row> {
    let spec = &cfg.arch;
    let (b, s, h, a) = (cfg.batch, cfg.seq, spec.hidden, spec.heads);
    let l = Expr::var(L, spec.layers);
    let vb = Expr::var(B.sym(), b);
    let vs = Expr::var(Sym::new("s", "", "sequence length"), s);
    let vh = Expr::var(H.sym(), h);
    let va = Expr::var(A.sym(), a);
    // Korthikanti et al. 2022, eq. (1): sbh(34 + 5as/h) bytes per layer (fp16, dropout on,
    // 4h MLP, no tensor parallelism) = 34·sbh + 5·as²b.
    let korthikanti = Expr::prod([
        l.clone(),
        Expr::sum([
            Expr::prod([Expr::num(34u8), vs.clone(), vb.clone(), vh.clone()]),
            Expr::prod([Expr::num(5u8), va.clone(), vs.clone(), vs.clone(), vb.clone()]),
        ]),
    ]);
    // The seed material: 2 bytes × (22·bsh + 2·bas²) per layer.
    let seed = Expr::prod([
        l,
        Expr::num(2u8),
        Expr::sum([Expr::prod([Expr::num(22u8), vb.clone(), vs.clone(), vh]), Expr::prod([Expr::num(2u8), vb, va, vs.clone(), vs])]),
    ]);
    vec![
        Row::new(RowId::TextbookKorthikanti, "Korthikanti et al.: sbh(34 + 5as/h) per layer", Category::Activations, korthikanti, "Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models, eq. (1)")
            .note("assumes fp16, dropout, a 4h GELU MLP with no gating, multi-head attention with scores materialized, and no loss"),
        Row::new(RowId::TextbookSeed, "Seed formula: 2 × (22·bsh + 2·bas²) per layer", Category::Activations, seed, "the course's seed material (bf16, materialized scores and probabilities)")
            .note("counts elements of a generic layer in bf16; ignores the fp32 copies real frameworks keep (norm upcasts, fp32 softmax) and the loss"),
    ]
}

/// Bytes eager attention keeps for its score matrices in one layer, as transformers' eager path
/// saves them: the fp32 softmax result and its cast to the compute dtype, (4 + p)·b·a·s² (only
/// 4·b·a·s² in fp32) — the s² term the benchmark materializes.
pub fn eager_score_bytes(batch: u64, heads: u64, seq: u64, compute_bytes: u64) -> Bytes {
    let per_element = FP32_BYTES + if compute_bytes == FP32_BYTES { 0 } else { compute_bytes };
    batch as u128 * heads as u128 * seq as u128 * seq as u128 * per_element as u128
}

/// Why the textbook formulas differ from what the framework keeps, for this configuration.
pub fn textbook_differences(cfg: &Config) -> Vec<String> {
    let spec = &cfg.arch;
    let r = super::super::precision::recipe(cfg.precision);
    let mut out = Vec::new();
    if cfg.framework == Framework::Hf {
        match spec.norm {
            NormKind::Rmsnorm => out.push("each RMSNorm keeps an fp32 copy of its input (4·bsh) and an fp32 rsqrt besides the normalised input — the formulas count one 2-byte tensor per norm".to_string()),
            NormKind::RmsnormGemma => out.push("Gemma's RMSNorm keeps its input and its normalised output in fp32 (8·bsh per norm), four norms per layer".to_string()),
            _ => {}
        }
        if cfg.attn == Attention::Eager {
            if spec.softmax_fp32 || r.autocast_weight_copy {
                out.push("eager attention keeps the softmax in fp32 (4·bas²) and its cast to the compute dtype (2·bas²): 6·bas² per layer rather than the textbook's 4–5·bas²".to_string());
            }
            if spec.kv_heads < spec.heads {
                out.push(format!("eager attention repeats K and V to all {} heads (repeat_kv copies), so grouped-query attention saves no activation memory there", spec.heads));
            }
        } else {
            out.push("SDPA/FlashAttention keep no s² term: only Q, K, V, the output and an fp32 log-sum-exp per row — the 5as/h (or 2bas²) term vanishes".to_string());
            if spec.kv_heads < spec.heads {
                out.push(format!(
                    "SDPA keeps K and V at the {} key/value heads (enable_gqa), fewer bytes than the formulas' a heads",
                    spec.kv_heads
                ));
            }
        }
        if spec.mlp == MlpKind::Gated {
            out.push(format!("the gated MLP keeps four f-wide tensors (gate, act(gate), up, their product) with f = {}, not the 4h GELU MLP the formulas assume", spec.ffn));
        } else if spec.act == Activation::GeluNew {
            out.push("gelu_new is written as Python tensor ops, so autograd keeps x, tanh(·), 0.5·x and 1 + tanh(·): four f-wide tensors for the activation alone".to_string());
        }
        if cfg.loss == Loss::Standard {
            out.push(format!("the loss keeps fp32 log-probabilities of b·s·V = {} × {} × {} elements — absent from per-layer formulas, and large with big vocabularies", cfg.batch, cfg.seq, spec.vocab));
        }
        if cfg.dropout == 0.0 {
            out.push("with dropout 0 there are no dropout masks, which Korthikanti's 34 and 5 include".to_string());
        }
        if r.compute == Dtype::Fp32 {
            out.push("in fp32 every activation takes 4 bytes, twice the formulas' 2".to_string());
        }
        if r.autocast_weight_copy {
            out.push(
                "autocast keeps a bf16 copy of every GEMM weight for backward and casts each projection's input separately".to_string(),
            );
        }
        if cfg.recompute == Recompute::Full {
            out.push(
                "with full recomputation each layer keeps only its input; compare with the formulas' full-recompute 2·sbh".to_string(),
            );
        }
    } else {
        out.push(
            "the megatron profile follows Korthikanti et al.'s own tensor list, generalized to GQA, gated MLPs and flash attention"
                .to_string(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::config::Config;

    #[test]
    fn the_differences_name_what_llama_keeps_beyond_the_formulas() {
        let notes = textbook_differences(&Config::default()).join("\n");
        assert!(notes.contains("fp32 copy"), "{notes}");
        assert!(notes.contains("log-probabilities"), "{notes}");
        assert!(notes.contains("no s² term"), "{notes}");
    }

    #[test]
    fn eager_scores_cost_six_bytes_per_element_in_bf16_and_four_in_fp32() {
        assert_eq!(eager_score_bytes(1, 32, 1024, 2), 6 * 32 * 1024 * 1024);
        assert_eq!(eager_score_bytes(2, 1, 10, 4), 4 * 2 * 100);
    }

    #[test]
    fn the_textbook_formulas_evaluate_as_written() {
        let cfg = Config { batch: 1, seq: 2, ..Config::default() };
        let rows = textbook_rows(&cfg);
        // Korthikanti: 32 × (34·2·1·4096 + 5·32·2·2·1) = 32 × (278,528 + 640).
        assert_eq!(rows[0].bytes, 32 * (278_528 + 640));
        // Seed: 32 × 2 × (22·1·2·4096 + 2·1·32·2·2).
        assert_eq!(rows[1].bytes, 32 * 2 * (180_224 + 256));
    }
}
