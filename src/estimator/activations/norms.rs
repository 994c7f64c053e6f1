//! What a norm layer keeps for backward: RMSNorm's fp32 upcast and rsqrt, Gemma's (1 + w)
//! scaling in fp32, LayerNorm's input and statistics (fp32 on CUDA, the input dtype on CPU), and
//! OLMo's parameter-free LayerNorm over an fp32 copy.

use super::super::expr::Expr;
use super::super::model::NormKind;
use super::super::precision::FP32_BYTES;
use super::ctx::{Ctx, B, Q, S};

/// The terms one norm keeps (per call).
pub fn norm_terms(c: &Ctx, kind: NormKind, saves_weight_input: bool, width: Q) -> Vec<Expr> {
    let tokens = [B, S, width];
    match kind {
        // x.to(fp32) (pow's input), rsqrt [b,s,1] fp32, and weight * x.to(dtype)'s `x` when the
        // weight learns.
        NormKind::Rmsnorm => {
            let mut v = vec![c.t(c.fp32(), &tokens), c.t(c.fp32(), &[B, S])];
            if saves_weight_input {
                v.push(c.t(c.pr(), &tokens));
            }
            v
        }
        // Gemma: x.float(), rsqrt, (1 + weight.float()) [h], normalised x in fp32.
        NormKind::RmsnormGemma => {
            let mut v = vec![c.t(c.fp32(), &tokens), c.t(c.fp32(), &[B, S]), c.t(c.fp32(), &[width])];
            if saves_weight_input {
                v.push(c.t(c.fp32(), &tokens));
            }
            v
        }
        // native_layer_norm keeps its input, mean and rstd (fp32 on CUDA; the input dtype on CPU).
        NormKind::Layernorm | NormKind::LayernormNoBias => {
            let stats = if c.cuda {
                c.t(Expr::konst("2 × FP32_BYTES", 2 * FP32_BYTES), &[B, S])
            } else {
                Expr::prod([Expr::num(2u8), c.t(c.pr(), &[B, S])])
            };
            vec![c.t(c.pr(), &tokens), stats]
        }
        // OLMo: F.layer_norm(x.to(fp32)) without parameters: the fp32 input, fp32 mean and rstd.
        NormKind::Nonparametric => vec![c.t(c.fp32(), &tokens), c.t(Expr::konst("2 × FP32_BYTES", 2 * FP32_BYTES), &[B, S])],
    }
}
