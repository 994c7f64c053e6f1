//! Checks both kernels against the CPU reference on small shapes (the browser test calls
//! [`verify`] in the page; the native tests call it on lavapipe).

use super::gpu::Bench;
use super::reference::{self, max_abs_diff};
use super::shape::{AttentionShape, BenchError, Dtype};
use serde::{Deserialize, Serialize};

/// Largest absolute error accepted in f32, for S and for O (inputs are uniform in [-1, 1)).
pub const TOLERANCE: f64 = 1e-4;
/// Largest absolute error accepted in f16 (S and P rounded to 11 significant bits), against
/// the reference computed from the same f16-rounded inputs.
pub const TOLERANCE_F16: f64 = 4e-3;

/// One shape's errors against the CPU reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyCase {
    pub shape: AttentionShape,
    pub dtype: Dtype,
    /// [`TOLERANCE`] or [`TOLERANCE_F16`].
    pub tolerance: f64,
    /// Max |S_gpu − Q·Kᵀ/√d|.
    pub scores_max_abs_err: f64,
    /// Max |O_gpu − softmax(S)·V| of the materialized path.
    pub materialized_max_abs_err: f64,
    /// Max |O_gpu − softmax(S)·V| of the fused kernel.
    pub fused_max_abs_err: f64,
    pub passed: bool,
}

/// The result of [`verify`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// f32 cases, then f16 cases where the adapter has `shader-f16`.
    pub cases: Vec<VerifyCase>,
    /// Every case within the tolerance.
    pub passed: bool,
}

/// The shapes [`verify`] runs: sizes that are and are not multiples of the tiles (16, 64),
/// head_dim 64 and 128, batch and heads above 1.
pub fn verify_shapes() -> Vec<AttentionShape> {
    vec![
        AttentionShape { batch: 1, heads: 1, seq: 5, head_dim: 8 },
        AttentionShape { batch: 1, heads: 2, seq: 37, head_dim: 64 },
        AttentionShape { batch: 2, heads: 1, seq: 64, head_dim: 128 },
        AttentionShape { batch: 1, heads: 3, seq: 130, head_dim: 40 },
    ]
}

/// Runs both kernels on [`verify_shapes`] with random inputs and compares them with the CPU
/// reference, in f32 and (where the adapter has `shader-f16`) in f16. GPU failures are errors;
/// numerical mismatches are reported (`passed: false`).
pub async fn verify(bench: &Bench) -> Result<VerifyReport, BenchError> {
    let mut dtypes = vec![(Dtype::F32, TOLERANCE)];
    if bench.info().f16 {
        dtypes.push((Dtype::F16, TOLERANCE_F16));
    }
    let mut cases = Vec::new();
    for (dtype, tolerance) in dtypes {
        for (i, shape) in verify_shapes().into_iter().enumerate() {
            let (q, k, v) = reference::random_qkv(shape, 1000 + i as u64);
            // The reference sees what the GPU buffers hold.
            let (q, k, v) = match dtype {
                Dtype::F32 => (q, k, v),
                Dtype::F16 => (reference::round_to_f16(&q), reference::round_to_f16(&k), reference::round_to_f16(&v)),
            };
            let want_s = reference::scores(shape, &q, &k);
            let want_o = reference::attention(shape, &q, &k, &v);
            let mat = bench.run_materialized(shape, dtype, &q, &k, &v).await?;
            let fused = bench.run_fused(shape, dtype, &q, &k, &v).await?;
            let scores_max_abs_err = max_abs_diff(&mat.scores, &want_s);
            let materialized_max_abs_err = max_abs_diff(&mat.out, &want_o);
            let fused_max_abs_err = max_abs_diff(&fused, &want_o);
            let passed = [scores_max_abs_err, materialized_max_abs_err, fused_max_abs_err].iter().all(|e| *e <= tolerance);
            cases.push(VerifyCase { shape, dtype, tolerance, scores_max_abs_err, materialized_max_abs_err, fused_max_abs_err, passed });
        }
    }
    let passed = cases.iter().all(|c| c.passed);
    Ok(VerifyReport { cases, passed })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_shapes_cover_ragged_tiles_and_both_head_dims() {
        let shapes = verify_shapes();
        assert!(shapes.iter().any(|s| s.seq % 16 != 0));
        assert!(shapes.iter().any(|s| s.seq > 64 && s.seq % 64 != 0));
        assert!(shapes.iter().any(|s| s.head_dim == 64) && shapes.iter().any(|s| s.head_dim == 128));
        assert!(shapes.iter().any(|s| s.batch > 1) && shapes.iter().any(|s| s.heads > 1));
    }
}
