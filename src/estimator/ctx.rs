//! The context every activation term is written in: the configuration's quantities as typed
//! symbols bound to their values, and the helpers that turn `bytes × symbols` into a formula.

use super::config::Config;
use super::expr::{Expr, Sym};
use super::precision::{Dtype, Recipe, BF16_BYTES, BOOL_BYTES, FP32_BYTES, INT64_BYTES};

/// The quantities the activation formulas are written in. Each is bound to one value of the
/// configuration by [`Ctx::v`]; a typed symbol cannot be bound to the wrong number. The names
/// are the formulas' own (`b`, `s`, `h`, …), hence the upper-case variants.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Q {
    /// Micro-batch size.
    B,
    /// Tokens of a sequence on this GPU (seq / cp).
    S,
    /// Tokens attended to (the whole sequence).
    S_KV,
    /// Hidden size.
    H,
    /// Attention (query) heads.
    A,
    /// Key/value heads.
    KV,
    /// Head dim.
    D,
    /// Dense MLP intermediate size.
    F,
    /// Vocabulary size.
    V,
    /// Bytes per activation element (the compute dtype).
    P,
    /// Bytes per residual-stream element (the model dtype; fp32 under autocast).
    P_RES,
    /// Bytes per saved GEMM input (fp8 under Transformer Engine).
    P_LIN,
    /// Tensor-parallel degree.
    T_TP,
}

impl Q {
    const COUNT: usize = 13;

    /// The symbol a formula shows for this quantity.
    pub const fn sym(self) -> Sym {
        match self {
            Q::B => Sym::new("b", "", "micro-batch size"),
            Q::S => Sym::new("s", "", "tokens of a sequence on this GPU (seq / cp)"),
            Q::S_KV => Sym::new("s", "kv", "tokens attended to (the whole sequence)"),
            Q::H => Sym::new("h", "", "hidden size"),
            Q::A => Sym::new("a", "", "attention heads"),
            Q::KV => Sym::new("k", "", "key/value heads"),
            Q::D => Sym::new("d", "", "head dim"),
            Q::F => Sym::new("f", "", "MLP intermediate size"),
            Q::V => Sym::new("V", "", "vocabulary size"),
            Q::P => Sym::new("p", "", "bytes per activation element (compute dtype)"),
            Q::P_RES => Sym::new("p", "r", "bytes per residual-stream element (model dtype)"),
            Q::P_LIN => Sym::new("p", "lin", "bytes per saved GEMM input (fp8 under Transformer Engine)"),
            Q::T_TP => Sym::new("t", "", "tensor-parallel degree"),
        }
    }
}

pub use Q::*;

/// Rotary dims per head, when only part of each head is rotated.
pub const D_ROT: Sym = Sym::new("d", "rot", "rotary dims per head");
/// Intermediate size of one routed expert.
pub const F_E: Sym = Sym::new("f", "e", "expert intermediate size");
/// Intermediate size of all shared experts together.
pub const F_S: Sym = Sym::new("f", "s", "shared-expert intermediate size (all shared experts)");
/// Routed experts per MoE layer.
pub const E: Sym = Sym::new("E", "", "experts per MoE layer");
/// Experts each token is routed to.
pub const K_TOP: Sym = Sym::new("K", "", "experts per token (top-k)");
/// LoRA rank.
pub const R: Sym = Sym::new("r", "", "LoRA rank");
/// Decoder layers on this GPU.
pub const L: Sym = Sym::new("L", "", "decoder layers on this GPU");
/// MoE layers on this GPU.
pub const L_MOE: Sym = Sym::new("L", "moe", "MoE layers on this GPU");
/// Dense-MLP layers on this GPU.
pub const L_DENSE: Sym = Sym::new("L", "dense", "dense-MLP layers on this GPU");
/// Layers with rotary embedding on this GPU (in a model that also has NoPE layers).
pub const L_ROPE: Sym = Sym::new("L", "rope", "layers with rotary embedding on this GPU");
/// NoPE layers (no rotary embedding) on this GPU.
pub const L_NOPE: Sym = Sym::new("L", "nope", "NoPE layers on this GPU");
/// Micro-batches whose activations are alive at once on this pipeline stage.
pub const M: Sym = Sym::new("m", "", "micro-batches in flight on this pipeline stage");

/// Per-term context: the configuration, its quantities' values, and the recipe's switches.
pub struct Ctx<'a> {
    pub cfg: &'a Config,
    values: [u64; Q::COUNT],
    /// Autocast: bf16 copies of weights and GEMM inputs beside an fp32 residual stream.
    pub amp: bool,
    /// CUDA kernels (rather than PyTorch's CPU kernels) decide what is saved.
    pub cuda: bool,
}

/// The values of the quantities, by name.
#[derive(Clone, Copy)]
pub struct Values {
    pub b: u64,
    pub s: u64,
    pub s_kv: u64,
    pub h: u64,
    pub a: u64,
    pub k: u64,
    pub d: u64,
    pub f: u64,
    pub v: u64,
    pub p: u64,
    pub p_res: u64,
    pub p_lin: u64,
    pub tp: u64,
}

/// Whether the linears save their inputs in FP8: Transformer Engine's recipes, or a recipe that
/// caches FP8 weights (the formulas' `p_lin`, the step program's linear dtype).
pub fn linear_inputs_fp8(cfg: &Config, recipe: &Recipe) -> bool {
    recipe.fp8_weight_cache || cfg.fp8_recipe().te()
}

impl Values {
    /// The quantities of `cfg` under `recipe`: the micro-batch, the tokens on this GPU
    /// ([`Config::seq_per_gpu`]) and the whole sequence the keys span, the model's sizes, and
    /// the element bytes — of compute (`p`), of the residual stream (`p_res`: the weights' dtype
    /// under autocast, whose weight copies leave the residual in fp32) and of the linears' inputs
    /// (`p_lin`: FP8 where Transformer Engine or a cached FP8 weight casts them).
    pub fn of(cfg: &Config, recipe: &Recipe) -> Values {
        let spec = &cfg.arch;
        let amp = recipe.autocast_weight_copy;
        Values {
            b: cfg.batch,
            s: cfg.seq_per_gpu(),
            s_kv: cfg.seq,
            h: spec.hidden,
            a: spec.heads,
            k: spec.kv_heads,
            d: spec.head_dim,
            f: spec.ffn,
            v: spec.vocab,
            p: recipe.compute.bytes(),
            p_res: if amp { recipe.weight.bytes() } else { recipe.compute.bytes() },
            p_lin: if linear_inputs_fp8(cfg, recipe) { Dtype::Fp8.bytes() } else { recipe.compute.bytes() },
            tp: cfg.tp,
        }
    }
}

impl<'a> Ctx<'a> {
    pub fn new(cfg: &'a Config, x: Values, amp: bool, cuda: bool) -> Ctx<'a> {
        let mut values = [0; Q::COUNT];
        for (q, v) in [
            (B, x.b),
            (S, x.s),
            (S_KV, x.s_kv),
            (H, x.h),
            (A, x.a),
            (KV, x.k),
            (D, x.d),
            (F, x.f),
            (V, x.v),
            (P, x.p),
            (P_RES, x.p_res),
            (P_LIN, x.p_lin),
            (T_TP, x.tp),
        ] {
            values[q as usize] = v;
        }
        Ctx { cfg, values, amp, cuda }
    }

    /// The value of a quantity.
    pub fn n(&self, q: Q) -> u64 {
        self.values[q as usize]
    }
    /// The quantity as a symbol bound to its value.
    pub fn v(&self, q: Q) -> Expr {
        Expr::var(q.sym(), self.n(q))
    }
    /// Bytes per residual-stream element: its own symbol only when it differs from p.
    pub fn pr(&self) -> Expr {
        if self.n(P_RES) == self.n(P) {
            self.v(P)
        } else {
            self.v(P_RES)
        }
    }
    /// Bytes per saved GEMM input.
    pub fn pl(&self) -> Expr {
        if self.n(P_LIN) == self.n(P) {
            self.v(P)
        } else {
            self.v(P_LIN)
        }
    }
    pub fn fp32(&self) -> Expr {
        Expr::konst("FP32_BYTES", FP32_BYTES)
    }
    pub fn i64(&self) -> Expr {
        Expr::konst("INT64_BYTES", INT64_BYTES)
    }
    pub fn bf16(&self) -> Expr {
        Expr::konst("BF16_BYTES", BF16_BYTES)
    }
    /// Bytes per element of a dropout mask: `native_dropout`'s bool mask on CUDA; on CPU
    /// `at::dropout` multiplies by a mask in the input dtype (validation/README.md, CPU vs CUDA).
    pub fn dropout_mask(&self) -> Expr {
        if self.cuda {
            Expr::konst("BOOL_BYTES", BOOL_BYTES)
        } else {
            self.v(P)
        }
    }
    /// Product of a byte size and quantities: `4 × b × s × h`.
    pub fn t(&self, bytes: Expr, qs: &[Q]) -> Expr {
        Expr::prod(std::iter::once(bytes).chain(qs.iter().map(|&q| self.v(q))))
    }
    /// Divides a tensor-parallel-region term by t.
    pub fn tp_split(&self, e: Expr) -> Expr {
        if self.n(T_TP) > 1 {
            e.ceil_div(self.v(T_TP))
        } else {
            e
        }
    }
    /// Divides a sequence-parallel-region term by t when sequence parallelism is on.
    pub fn sp_split(&self, e: Expr) -> Expr {
        if self.n(T_TP) > 1 && self.cfg.sp {
            e.ceil_div(self.v(T_TP))
        } else {
            e
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_quantity_binds_to_its_own_value() {
        let cfg = Config::default();
        let x = Values { b: 1, s: 2, s_kv: 3, h: 4, a: 5, k: 6, d: 7, f: 8, v: 9, p: 10, p_res: 11, p_lin: 12, tp: 13 };
        let c = Ctx::new(&cfg, x, false, true);
        let all = [B, S, S_KV, H, A, KV, D, F, V, P, P_RES, P_LIN, T_TP];
        let values: Vec<u64> = all.iter().map(|&q| c.n(q)).collect();
        assert_eq!(values, (1..=13).collect::<Vec<u64>>());
        // The symbol shown is the quantity's own: s and s_kv differ only by subscript.
        assert_eq!(c.v(S_KV).symbolic(), "s_kv");
        assert_eq!(c.t(Expr::num(4u8), &[B, S]).substituted(), "4 × 1 × 2");
    }
}
