//! The CUDA kernels a gated DeltaNet layer runs on a GPU with `flash-linear-attention` and
//! `causal-conv1d` installed (`kernels = cuda`), in place of the torch fallbacks that
//! [`super::qwen3_next`] and [`super::kimi_linear`] build op by op for a CPU (which the fixtures
//! measure).
//!
//! transformers 5.24 (`modeling_qwen3_next.py` / `modeling_qwen3_5.py`,
//! `Qwen3NextGatedDeltaNet.forward`) calls `causal_conv1d_fn(x, weight, bias, activation="silu")`
//! and `chunk_gated_delta_rule(q, k, v, g, beta, initial_state=None, output_final_state=False,
//! use_qk_l2norm_in_kernel=True)` when `is_fast_path_available`; q and k stay at the key heads
//! (the kernel does grouped-value attention, no `repeat_interleave`). What each
//! `torch.autograd.Function` keeps is read from the sources (validation/README.md, "What the CUDA
//! kernels save": fla-org/flash-linear-attention @ bc3b101, Dao-AILab/causal-conv1d @ 0d2252d), not
//! measured: no GPU ran these here. Shapes: B batch, T tokens, Hk/Hv key/value heads, dk/dv their
//! dims, BT = 64 the chunk, NT = ⌈T / 64⌉ chunks.

use super::super::ir::{Builder, Dim, Dt, Shape, Split, Tid, B, S, X};
use crate::estimator::ctx::Q;

fn shape(ds: &[Dim]) -> Shape {
    Shape::new(ds, Split::None)
}
const BD: Dim = Dim::Q(Q::B);
const SD: Dim = Dim::Q(Q::S);
const HK: Dim = Dim::X(X::GdnKHeads);
const HV: Dim = Dim::X(X::GdnVHeads);
const DK: Dim = Dim::X(X::GdnKDim);
const DV: Dim = Dim::X(X::GdnVDim);
/// BT: `chunk_gated_delta_rule`'s chunk (`chunk_size = 64`), the last dim of its `A`.
const CH: Dim = Dim::X(X::GdnChunk);
/// NT: the chunks of a sequence.
const NC: Dim = Dim::X(X::GdnChunks);

/// `causal_conv1d_fn(x, weight, activation="silu")` on `x` `[B, c, T]` (the projections'
/// output, transposed; Kimi's KDA calls it the same way on its concatenated q, k, v): `CausalConv1dFn.forward` (causal_conv1d_interface.py) saves only `x` and
/// the parameters — the convolution's output and its SiLU are recomputed by
/// `causal_conv1d_bwd_function` — and returns `silu(conv(x))` `[B, c, T]` in `x`'s dtype (no
/// padding, no slice). The weight is passed as it is stored (not an autocast op, so no bf16
/// copy under autocast). Backward allocates the gradients of `x` and of the weight.
///
/// Toy (the Qwen3.5 records' tiny layer: b 2, s 64, Hk 2 × dk 16, Hv 4 × dv 24, so
/// c = 2·2·16 + 4·24 = 160, bf16): saves 2·160·64·2 = 40,960 B (x), where the fallback keeps x
/// and the padded conv output.
pub fn causal_conv1d(b: &mut Builder, x: Tid, weight: Tid) -> Tid {
    let rg = b.rg(x) || b.rg(weight);
    let out = b.out(b.shape(x), b.t(x).dt, rg);
    let bw = b.input_grads(&[(0, x), (1, weight)], "causal_conv1d_bwd", 0);
    b.op("causal_conv1d_fwd", "CausalConv1dFnBackward", &[x, weight], &[out], &[S::In(0)], &bw)[0]
}

/// Which of fla's chunked delta rules a layer calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// `chunk_gated_delta_rule`: one decay per head and token (Qwen3-Next, Qwen3.5).
    Gated,
    /// `chunk_kda`: one decay per key channel (Kimi Linear's KDA).
    Kda,
}

/// fla's chunked delta rule with `use_qk_l2norm_in_kernel=True`, no initial state, the final
/// state discarded, on q, k `[B, T, Hk, dk]`, v `[B, T, Hv, dv]`, g (fp32) and beta
/// `[B, T, Hv]`; returns o `[B, T, Hv, dv]` in v's dtype.
///
/// [`Rule::Gated`]: `ChunkGatedDeltaRuleFunction.forward` (fla/ops/gated_delta_rule/chunk.py),
/// g `[B, T, Hv]`, saves (`ctx.save_for_backward`):
/// - q and k l2-normalised (new tensors, q's dtype) and their fp32 `rstd` `[B, T, Hk]`;
/// - v and beta (the caller's tensors);
/// - g's chunk-local cumsum `[B, T, Hv]` fp32 (new);
/// - A, the solved `(I + A)⁻¹` of each chunk, `[B, T, Hv, 64]` in k's dtype (new);
///
/// so a layer keeps `2·B·T·Hk·dk·p + 2·4·B·T·Hk + 4·B·T·Hv + 64·B·T·Hv·p` beyond v and beta.
/// The forward's w, u (`[B, T, Hv, dk|dv]`), per-chunk states h `[B, NT, Hv, dk, dv]` and
/// v_new are made and dropped inside the call; backward recomputes them
/// (`recompute_w_u_fwd`, `chunk_gated_delta_rule_fwd_h`) beside the inputs' gradients — modelled
/// as those four temporaries (k's dtype) live while the gradients are made.
///
/// [`Rule::Kda`]: `ChunkKDAFunction.forward` (fla/ops/kda/chunk.py), g the per-channel gate
/// `[B, T, H, K]` fp32 (Hk = Hv = H, dk = dv = K); it saves the same normalised q, k and rstd,
/// v, beta, g's chunk-local cumsum `[B, T, H, K]` fp32, **and g as passed** (`g_input`), and two
/// matrices `Aqk`, `Akk` `[B, T, H, 64]` in k's dtype (`chunk_kda_fwd_intra`); w, u, qg, kg,
/// v_new and h are set to None before it returns (`disable_recompute=False`) and recomputed in
/// backward — modelled as those six temporaries.
///
/// Toy (the Qwen3.5 records' layer, [`Rule::Gated`], bf16): q, k normalised
/// 2·(2·64·2·16·2) = 16,384 B, their rstd 2·(2·64·2·4) = 2,048 B, g's cumsum 2·64·4·4 = 2,048 B,
/// A 2·64·4·64·2 = 65,536 B: 86,016 B new.
pub fn chunk_delta_rule(b: &mut Builder, rule: Rule, q: Tid, k: Tid, v: Tid, g: Tid, beta: Tid) -> Tid {
    let (qdt, kdt) = (b.t(q).dt, b.t(k).dt);
    let tok = |last: &[Dim]| shape(&[&[BD, SD][..], last].concat());
    let gate = if rule == Rule::Kda { tok(&[HV, DK]) } else { tok(&[HV]) };
    // Made inside the call, kept by it (outputs of no-grad helpers here, as mamba2's fused node).
    let q_n = b.plain("l2norm_fwd", &[q], tok(&[HK, DK]), qdt);
    let q_rstd = b.plain("l2norm_fwd", &[q], tok(&[HK]), Dt::F32);
    let k_n = b.plain("l2norm_fwd", &[k], tok(&[HK, DK]), kdt);
    let k_rstd = b.plain("l2norm_fwd", &[k], tok(&[HK]), Dt::F32);
    let g_cum = b.plain("chunk_local_cumsum", &[g], gate, Dt::F32);
    let intra = if rule == Rule::Kda { "chunk_kda_fwd_intra" } else { "chunk_gated_delta_rule_fwd_intra" };
    let a = b.plain(intra, &[k_n, beta, g_cum], tok(&[HV, CH]), kdt);
    let a2 = (rule == Rule::Kda).then(|| b.plain(intra, &[q_n, k_n, g_cum], tok(&[HV, CH]), kdt));
    // The forward's own temporaries (dropped when the call returns), recomputed in backward:
    // w, u, h, v_new (and KDA's gated qg, kg).
    let mut temps = vec![tok(&[HV, DK]), tok(&[HV, DV]), shape(&[BD, NC, HV, DK, DV]), tok(&[HV, DV])];
    if rule == Rule::Kda {
        temps.extend([tok(&[HV, DK]), tok(&[HV, DK])]);
    }
    let made: Vec<Tid> = temps.iter().map(|s| b.plain("chunk_fwd_h", &[a], *s, kdt)).collect();
    let mut ins = vec![q, k, v, g, beta, q_n, q_rstd, k_n, k_rstd, g_cum, a];
    ins.extend(a2);
    ins.extend(made);
    // v, beta, the normalised q and k with their rstd, g's cumsum, A (and KDA's g and second A).
    let mut saved = vec![S::In(2), S::In(4), S::In(5), S::In(6), S::In(7), S::In(8), S::In(9), S::In(10)];
    if rule == Rule::Kda {
        saved.extend([S::In(3), S::In(11)]);
    }
    let rg = [q, k, v, g, beta].iter().any(|&t| b.rg(t));
    let out = b.out(tok(&[HV, DV]), b.t(v).dt, rg);
    let bw_op = if rule == Rule::Kda { "chunk_kda_bwd" } else { "chunk_gated_delta_rule_bwd" };
    let mut bw: Vec<B> = Vec::new();
    for s in &temps {
        bw.push(B::Alloc { bytes: b.bytes_of(s, kdt), dtype: b.dtype(kdt), op: bw_op });
    }
    let first = temps.len() as u8;
    bw.extend(b.input_grads(&[(0, q), (1, k), (2, v), (3, g), (4, beta)], bw_op, first));
    for t in 0..first {
        bw.push(B::Free(t));
    }
    let (name, node) = match rule {
        Rule::Gated => ("chunk_gated_delta_rule", "ChunkGatedDeltaRuleFunctionBackward"),
        Rule::Kda => ("chunk_kda", "ChunkKDAFunctionBackward"),
    };
    b.op(name, node, &ins, &[out], &saved, &bw)[0]
}

#[cfg(test)]
mod tests {
    use crate::config::{apply_import, Config};
    use crate::estimator::config::{Kernels, Precision};
    use crate::estimator::expr::numbers_only;
    use crate::estimator::params::Stage;
    use crate::estimator::precision::recipe;
    use crate::estimator::step::ir::Program;
    use crate::estimator::step::model::Setup;

    /// A records' tiny bf16 config of `family` at b 2, s 64, on `kernels`.
    fn program_of(family: &str, kernels: Kernels) -> Program {
        let path = format!("{}/tests/fixtures/pytorch/records/{family}.json", env!("CARGO_MANIFEST_DIR"));
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_default()).unwrap_or_default();
        let imported =
            crate::estimator::hf::import_value(&doc["configs"][format!("{family}/bfloat16")]).expect("the records' config imports");
        let mut c = Config::default();
        apply_import(&mut c, &imported);
        (c.batch, c.seq, c.precision, c.kernels) = (2, 64, Precision::Bf16, kernels);
        numbers_only(|| Setup::new(&c, &recipe(c.precision), Stage::Whole).whole())
    }

    /// The Qwen3.5 records' tiny config: one gated DeltaNet layer (Hk 2 × dk 16, Hv 4 × dv 24),
    /// one attention layer.
    fn program(kernels: Kernels) -> Program {
        program_of("qwen3_5_text", kernels)
    }

    /// Bytes of the tensors `op_name`'s nodes save that were made by one of `makers` (by any op
    /// when `makers` is empty).
    fn saved_made_by(p: &Program, op_name: &str, makers: &[&str]) -> u128 {
        p.ops
            .iter()
            .filter(|op| op.name == op_name)
            .flat_map(|op| p.saved(op))
            .map(|s| &p.tensors[s.t as usize])
            .filter(|t| makers.is_empty() || makers.contains(&t.op))
            .map(|t| t.bytes)
            .sum()
    }

    #[test]
    fn on_cuda_the_delta_rule_keeps_the_normalised_q_k_the_gate_cumsum_and_a_and_the_conv_its_input() {
        let p = program(Kernels::Cuda);
        let made = ["l2norm_fwd", "chunk_local_cumsum", "chunk_gated_delta_rule_fwd_intra"];
        assert_eq!(saved_made_by(&p, "chunk_gated_delta_rule", &made), 86_016);
        let conv = saved_made_by(&p, "causal_conv1d_fwd", &[]);
        assert_eq!(conv, 40_960);
        // None of the fallback's chunked ops run.
        assert!(!p.ops.iter().any(|op| op.name == "linalg_solve_triangular" || op.name == "repeat_interleave"));
    }

    #[test]
    fn on_a_cpu_the_torch_fallback_runs_instead() {
        let p = program(Kernels::Cpu);
        assert!(p.ops.iter().any(|op| op.name == "linalg_solve_triangular"));
        assert!(!p.ops.iter().any(|op| op.name == "chunk_gated_delta_rule" || op.name == "causal_conv1d_fwd"));
    }

    #[test]
    fn on_cuda_kimis_kda_keeps_the_normalised_q_k_the_per_channel_cumsum_and_two_matrices() {
        // Kimi Linear records' tiny config: two KDA layers of H 4 × K 16, b 2, s 64, bf16. Per
        // layer: q, k normalised 2·(2·64·4·16·2) = 32,768 B, rstd 2·(2·64·4·4) = 4,096 B, g's
        // cumsum 2·64·4·16·4 = 32,768 B, Aqk and Akk 2·(2·64·4·64·2) = 131,072 B: 200,704 B,
        // 401,408 B for the two; the conv keeps its input [2, 3·64, 64] bf16: 49,152 B a layer.
        let p = program_of("kimi_linear", Kernels::Cuda);
        let made = ["l2norm_fwd", "chunk_local_cumsum", "chunk_kda_fwd_intra"];
        assert_eq!(saved_made_by(&p, "chunk_kda", &made), 401_408);
        let conv = saved_made_by(&p, "causal_conv1d_fwd", &[]);
        assert_eq!(conv, 2 * 49_152);
        // g as passed is kept too (`g_input`, fp32 [2, 64, 4, 16] a layer).
        let g_input: u128 = p
            .ops
            .iter()
            .filter(|op| op.name == "chunk_kda")
            .map(|op| {
                p.saved(op)
                    .iter()
                    .map(|s| &p.tensors[s.t as usize])
                    .filter(|t| t.dt == crate::estimator::step::ir::Dt::F32 && t.bytes == 32_768)
                    .count() as u128
            })
            .sum();
        assert_eq!(g_input, 2 * 2, "g's cumsum and g itself, in each of the two layers");
    }
}
