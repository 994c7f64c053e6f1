//! The dense MLP's saved intermediates: gated (SwiGLU/GeGLU) and plain (GELU, gelu_new, ReLU)
//! feed-forward blocks, and the shared experts of MoE layers, which are the same block.

use super::super::expr::Expr;
use super::super::model::{Activation, MlpKind};
use super::ctx::{Ctx, B, P, S};
use super::{Part, Saves};

/// MLP intermediates of width `fw` (f, or the shared experts' f_s).
pub fn mlp_terms(c: &Ctx, sv: &Saves, out: &mut Vec<(Part, Expr)>, fw: Expr, part: Part) {
    let spec = &c.cfg.arch;
    let p = if c.amp { c.bf16() } else { c.v(P) };
    let term = |bytes: Expr| c.tp_split(Expr::prod([bytes, c.v(B), c.v(S), fw.clone()]));
    match (spec.mlp, spec.act) {
        (MlpKind::Gated, _) => {
            // act(gate) keeps gate; act(gate) · up keeps both factors; down keeps the product.
            if spec.fused_gate_up {
                // The activation keeps a view of the fused [b,s,2f] output: its whole storage.
                out.push((part, term(Expr::prod([Expr::num(2u8), p.clone()]))));
            } else {
                out.push((part, term(p.clone())));
                out.push((part, term(p.clone())));
            }
            out.push((part, term(p.clone())));
            if sv.down_in {
                out.push((part, term(c.pl())));
            }
        }
        (MlpKind::Plain, Activation::GeluNew) => {
            // gelu_new as Python ops keeps x, tanh(·), 0.5·x and 1 + tanh(·).
            out.push((part, term(Expr::prod([Expr::num(4u8), p.clone()]))));
            if sv.down_in {
                out.push((part, term(c.pl())));
            }
        }
        (MlpKind::Plain, Activation::Relu) => {
            // ReLU keeps its output, which is also fc2's input.
            out.push((part, term(p.clone())));
        }
        (MlpKind::Plain, _) => {
            // GELU/SiLU keep their input; fc2 keeps the activation's output.
            out.push((part, term(p.clone())));
            if sv.down_in {
                out.push((part, term(c.pl())));
            }
        }
    }
}
