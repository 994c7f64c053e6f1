//! The CUDA kernels a gated DeltaNet layer runs on a GPU with `flash-linear-attention` and
//! `causal-conv1d` installed (`kernels = cuda`), in place of the torch fallbacks that
//! [`super::qwen3_next`] builds op by op for a CPU (which the fixtures measure).
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
use crate::estimator::activations::ctx::Q;

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

/// The gradients of the `(input index, tensor)` pairs that require one, allocated by `op` in
/// backward, in order.
fn input_grads(b: &Builder, ins: &[(u8, Tid)], op: &'static str) -> Vec<B> {
    let mut bw = Vec::new();
    let mut k = 0u8;
    for &(i, t) in ins {
        if b.rg(t) {
            bw.push(B::Alloc { bytes: b.grad_bytes(t), dtype: b.t(t).dtype, op });
            bw.push(B::Grad { input: i, temp: k });
            k += 1;
        }
    }
    bw
}

/// `causal_conv1d_fn(x, weight, activation="silu")` on `x` `[B, c, T]` (the projections'
/// output, transposed): `CausalConv1dFn.forward` (causal_conv1d_interface.py) saves only `x` and
/// the parameters — the convolution's output and its SiLU are recomputed by
/// `causal_conv1d_bwd_function` — and returns `silu(conv(x))` `[B, c, T]` in `x`'s dtype (no
/// padding, no slice). The weight is passed as it is stored (not an autocast op, so no bf16
/// copy under autocast). Backward allocates the gradients of `x` and of the weight.
///
/// Toy (the Qwen3.5 records' tiny layer: b 2, s 64, Hk 2 × dk 16, Hv 4 × dv 24, so
/// c = 2·2·16 + 4·24 = 160, bf16): saves 2·160·64·2 = 40,960 B (x), where the fallback keeps x
/// and the padded conv output.
pub fn causal_conv1d(b: &mut Builder, x: Tid, weight: Tid) -> Tid {
    let c = Dim::X(X::GdnConvDim);
    let rg = b.rg(x) || b.rg(weight);
    let out = b.out(shape(&[BD, c, SD]), b.t(x).dt, rg);
    let bw = input_grads(b, &[(0, x), (1, weight)], "causal_conv1d_bwd");
    b.op("causal_conv1d_fwd", "CausalConv1dFnBackward", &[x, weight], &[out], &[S::In(0)], &bw)[0]
}

/// `chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)`
/// (fla/ops/gated_delta_rule/chunk.py `ChunkGatedDeltaRuleFunction.forward`) on q, k
/// `[B, T, Hk, dk]`, v `[B, T, Hv, dv]`, g `[B, T, Hv]` fp32 and beta `[B, T, Hv]`; returns o
/// `[B, T, Hv, dv]` in v's dtype. It saves (`ctx.save_for_backward`):
///
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
/// Toy (the same layer, bf16): q, k normalised 2·(2·64·2·16·2) = 16,384 B, their rstd
/// 2·(2·64·2·4) = 2,048 B, g's cumsum 2·64·4·4 = 2,048 B, A 2·64·4·64·2 = 65,536 B: 86,016 B
/// new.
pub fn chunk_gated_delta_rule(b: &mut Builder, q: Tid, k: Tid, v: Tid, g: Tid, beta: Tid) -> Tid {
    let (qdt, kdt) = (b.t(q).dt, b.t(k).dt);
    let tok = |last: &[Dim]| shape(&[&[BD, SD][..], last].concat());
    // Made inside the call, kept by it (outputs of no-grad helpers here, as mamba2's fused node).
    let q_n = b.plain("l2norm_fwd", &[q], tok(&[HK, DK]), qdt);
    let q_rstd = b.plain("l2norm_fwd", &[q], tok(&[HK]), Dt::F32);
    let k_n = b.plain("l2norm_fwd", &[k], tok(&[HK, DK]), kdt);
    let k_rstd = b.plain("l2norm_fwd", &[k], tok(&[HK]), Dt::F32);
    let g_cum = b.plain("chunk_local_cumsum", &[g], tok(&[HV]), Dt::F32);
    let a = b.plain("chunk_gated_delta_rule_fwd_intra", &[k_n, beta, g_cum], tok(&[HV, CH]), kdt);
    // The forward's own temporaries: w, u, h, v_new (dropped when the call returns).
    let w = b.plain("recompute_w_u_fwd", &[a], tok(&[HV, DK]), kdt);
    let u = b.plain("recompute_w_u_fwd", &[a], tok(&[HV, DV]), kdt);
    let h = b.plain("chunk_gated_delta_rule_fwd_h", &[w, u], shape(&[BD, NC, HV, DK, DV]), kdt);
    let v_new = b.plain("chunk_gated_delta_rule_fwd_h", &[w, u], tok(&[HV, DV]), kdt);
    let ins = [q, k, v, g, beta, q_n, q_rstd, k_n, k_rstd, g_cum, a, w, u, h, v_new];
    let saved = [S::In(2), S::In(4), S::In(5), S::In(6), S::In(7), S::In(8), S::In(9), S::In(10)];
    let rg = [q, k, v, g, beta].iter().any(|&t| b.rg(t));
    let out = b.out(tok(&[HV, DV]), b.t(v).dt, rg);
    // Backward: the recomputed w, u, h and v_new, then the inputs' gradients, then the
    // temporaries freed.
    let temps = [tok(&[HV, DK]), tok(&[HV, DV]), shape(&[BD, NC, HV, DK, DV]), tok(&[HV, DV])];
    let mut bw: Vec<B> = Vec::new();
    for s in &temps {
        bw.push(B::Alloc { bytes: b.bytes_of(s, kdt), dtype: b.dtype(kdt), op: "chunk_gated_delta_rule_bwd" });
    }
    let grads = input_grads(b, &[(0, q), (1, k), (2, v), (3, g), (4, beta)], "chunk_gated_delta_rule_bwd");
    let first = temps.len() as u8;
    for step in grads {
        bw.push(match step {
            B::Grad { input, temp } => B::Grad { input, temp: temp + first },
            other => other,
        });
    }
    for t in 0..first {
        bw.push(B::Free(t));
    }
    b.op("chunk_gated_delta_rule", "ChunkGatedDeltaRuleFunctionBackward", &ins, &[out], &saved, &bw)[0]
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

    /// The Qwen3.5 records' tiny bf16 config (one gated DeltaNet layer, one attention layer) at
    /// b 2, s 64, on `kernels`.
    fn program(kernels: Kernels) -> Program {
        let path = format!("{}/tests/fixtures/pytorch/records/qwen3_5_text.json", env!("CARGO_MANIFEST_DIR"));
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_default()).unwrap_or_default();
        let imported = crate::estimator::hf::import_value(&doc["configs"]["qwen3_5_text/bfloat16"]).expect("the records' config imports");
        let mut c = Config::default();
        apply_import(&mut c, &imported);
        (c.batch, c.seq, c.precision, c.kernels) = (2, 64, Precision::Bf16, kernels);
        numbers_only(|| Setup::new(&c, &recipe(c.precision), Stage::Whole).whole())
    }

    /// Bytes of the tensors `op_name`'s node saves that were made by one of `makers`.
    fn saved_made_by(p: &Program, op_name: &str, makers: &[&str]) -> u128 {
        p.ops
            .iter()
            .filter(|op| op.name == op_name)
            .flat_map(|op| p.saved(op))
            .map(|s| &p.tensors[s.t as usize])
            .filter(|t| makers.contains(&t.op))
            .map(|t| t.bytes)
            .sum()
    }

    #[test]
    fn on_cuda_the_delta_rule_keeps_the_normalised_q_k_the_gate_cumsum_and_a_and_the_conv_its_input() {
        let p = program(Kernels::Cuda);
        let made = ["l2norm_fwd", "chunk_local_cumsum", "chunk_gated_delta_rule_fwd_intra"];
        assert_eq!(saved_made_by(&p, "chunk_gated_delta_rule", &made), 86_016);
        let conv: u128 = p
            .ops
            .iter()
            .filter(|op| op.name == "causal_conv1d_fwd")
            .flat_map(|op| p.saved(op))
            .map(|s| p.tensors[s.t as usize].bytes)
            .sum();
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
}
