//! Mixture-of-experts blocks: the router's softmax and top-k, and the grouped_mm experts of
//! transformers 5, whose saved sizes depend on b·s·K token–expert pairs, not on the routing.

use super::super::expr::Expr;
use super::ctx::{Ctx, B, E, F_E, H, K_TOP, P, S};
use super::Part;

/// Mixtral-style MoE with grouped_mm experts (FINDINGS.md §2.2): sizes depend only on
/// S = b·s·K token–expert pairs, not on the routing.
pub fn moe_terms(c: &Ctx, out: &mut Vec<(Part, Expr)>) {
    let spec = &c.cfg.arch;
    let e = Expr::var(E, spec.experts);
    let k = Expr::var(K_TOP, spec.top_k);
    let fe = Expr::var(F_E, spec.expert_ffn);
    let fp32 = c.fp32();
    let i64b = c.i64();
    let bs = || [c.v(B), c.v(S)];
    let pairs = |bytes: Expr, more: &[Expr]| {
        let mut v = vec![bytes];
        v.extend(bs());
        v.push(k.clone());
        v.extend(more.iter().cloned());
        Expr::prod(v)
    };
    // Router: fp32 softmax [T,E], top-k indices (int64) and values (fp32), their sum.
    out.push((Part::Moe, Expr::prod([fp32.clone(), c.v(B), c.v(S), e.clone()])));
    out.push((Part::Moe, pairs(i64b.clone(), &[])));
    out.push((Part::Moe, pairs(fp32.clone(), &[])));
    out.push((Part::Moe, c.t(fp32.clone(), &[B, S])));
    // Experts: 3 int64 index tensors, int32 offsets [E], gathered tokens, gate_up [S,2f_e],
    // act(gate), down input, fp32 routing weights, down output.
    let pe = if c.amp { c.pr() } else { c.v(P) };
    out.push((Part::Moe, pairs(Expr::prod([Expr::num(3u8), i64b]), &[])));
    out.push((Part::Moe, Expr::prod([Expr::konst("INT32_BYTES", 4u8), e])));
    out.push((Part::Moe, pairs(pe.clone(), &[c.v(H)])));
    out.push((Part::Moe, pairs(Expr::prod([Expr::num(2u8), pe.clone()]), std::slice::from_ref(&fe))));
    out.push((Part::Moe, pairs(pe.clone(), std::slice::from_ref(&fe))));
    out.push((Part::Moe, pairs(pe.clone(), &[fe])));
    out.push((Part::Moe, pairs(fp32, &[])));
    out.push((Part::Moe, pairs(pe, &[c.v(H)])));
}
