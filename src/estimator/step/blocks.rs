//! The aten ops the modeling code dispatches, each with what it allocates in forward, what its
//! autograd node saves, and what that node allocates in backward and in which order.
//!
//! The backward scripts follow `tools/autograd/derivatives.yaml` and
//! `torch/csrc/autograd/FunctionsManual.cpp` (torch 2.15), checked allocation by allocation
//! against the step logs of `validation/tracker.py`:
//!
//! - `mul` (MulBackward0): `other`'s gradient first (`grad * self`), then `self`'s
//!   (`grad * other`); a broadcast input's gradient is the full-size product, reduced by
//!   `sum_to` in the engine's `validate_outputs` (input order), the full temporary freed.
//! - `mm` (MmBackward0): `mat2` (the weight) first, then `mat1` (the input); `addmm`
//!   (AddmmBackward0): the input, the weight, then the bias's `sum`.
//! - `pow(x, n)` (PowBackward0): `self.pow(n - 1)`, `n * …`, `grad * …` — three temporaries.
//! - `rsqrt` (RsqrtBackward0): `result.pow(3)`, `-0.5 * …`, `grad * …` on the result's shape.
//! - `mean(dim, keepdim)` (MeanBackward1): `grad.expand(…) / n`, one full-size `div`.
//! - `_to_copy` (ToCopyBackward0): a copy back to the input dtype.
//! - views: no allocation, unless the incoming gradient is not contiguous and `reshape` copies
//!   (ViewBackward0 `clone`); `slice` (SliceBackward0) allocates the full input (`slice_backward`,
//!   zeros + copy); `expand` (ExpandBackward0) sums back to the input shape; `split`
//!   (SplitBackward0) concatenates its outputs' gradients (`cat`); `cat` (CatBackward0) hands out
//!   narrowed views.
//! - `_scaled_dot_product_flash_attention_for_cpu` saves q, k, v, output and log-sum-exp; its
//!   backward allocates dq, dk, dv (each laid out like its input).

use super::ir::{Builder, DType, Dim, Dt, Out, Shape, Split, Tid, B, S};
use crate::estimator::ctx::Q;
use crate::estimator::part::Part;

/// Whether PEFT's `target_modules` covers a linear.
pub fn targeted(lin: crate::estimator::model::Linear, t: u8) -> bool {
    use crate::estimator::config::LoraTargets as T;
    use crate::estimator::model::Linear as L;
    let has = |bit: u8| t & bit != 0;
    match lin {
        L::Q => has(T::Q),
        L::K => has(T::K),
        L::V => has(T::V),
        L::Qkv => has(T::Q) || has(T::K) || has(T::V),
        L::O => has(T::O),
        L::Gate => has(T::GATE),
        L::Up => has(T::UP),
        L::GateUp => has(T::GATE) || has(T::UP),
        L::Down => has(T::DOWN),
    }
}

/// Which of its tensors a unary op's node saves.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    Nothing,
    Input,
    Output,
}

impl<'a> Builder<'a> {
    // ------------------------------------------------------------------ collectives

    /// Sequence parallelism's all-gather of a `[b, s/tp, h]` shard into the whole `[b, s, h]`
    /// sequence (Megatron's `gather_from_sequence_parallel_region`, DTensor's `Shard(1) →
    /// Replicate`): a new tensor in the shard's dtype; its backward reduce-scatters the
    /// gradient back into a shard-sized buffer.
    pub fn sequence_all_gather(&mut self, x: Tid) -> Tid {
        let (bytes, dtype, dt) = (self.bytes(x), self.t(x).dtype, self.t(x).dt);
        let out = self.out(Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::H)], Split::None), dt, true);
        self.op(
            "all_gather",
            "AllGatherBackward",
            &[x],
            &[out],
            &[],
            &[B::Alloc { bytes, dtype, op: "reduce_scatter" }, B::Grad { input: 0, temp: 0 }],
        )[0]
    }

    // ------------------------------------------------------------------ elementwise

    /// `x.to(dt)`: `_to_copy`, or nothing when `x` already has that dtype.
    pub fn to_copy(&mut self, x: Tid, dt: Dt) -> Tid {
        if self.dtype(dt) == self.t(x).dtype {
            return x;
        }
        let (shape, rg, bytes, dtype) = (self.shape(x), self.rg(x), self.bytes(x), self.t(x).dtype);
        let out = self.out(shape, dt, rg);
        let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "_to_copy" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
        self.op("_to_copy", "ToCopyBackward0", &[x], &[out], &[], bw)[0]
    }

    /// A unary op whose output has the input's shape and dtype (`silu`, `tanh`, `neg`, …):
    /// its node keeps `keep` and allocates one `bw_op` tensor of the input's size.
    pub fn unary(&mut self, name: &'static str, node: &'static str, x: Tid, keep: Keep, bw_op: &'static str) -> Tid {
        let (shape, dt, rg, bytes, dtype) = (self.shape(x), self.t(x).dt, self.rg(x), self.bytes(x), self.t(x).dtype);
        let out = self.out(shape, dt, rg);
        let saved: &[S] = match keep {
            Keep::Nothing => &[],
            Keep::Input => &[S::In(0)],
            Keep::Output => &[S::Out(0)],
        };
        let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: bw_op }, B::Grad { input: 0, temp: 0 }] } else { &[] };
        self.op(name, node, &[x], &[out], saved, bw)[0]
    }

    /// `x * c` for a Python number `c` (MulBackward1: `grad * c`).
    pub fn mul_scalar(&mut self, x: Tid) -> Tid {
        self.unary("mul", "MulBackward1", x, Keep::Nothing, "mul")
    }

    /// `x + c` for a Python number (AddBackward1: the gradient passes through).
    pub fn add_scalar(&mut self, x: Tid) -> Tid {
        let (shape, dt, rg) = (self.shape(x), self.t(x).dt, self.rg(x));
        let out = self.out(shape, dt, rg);
        let bw: &[B] = if rg { &[B::Pass { input: 0, output: 0 }] } else { &[] };
        self.op("add", "AddBackward1", &[x], &[out], &[], bw)[0]
    }

    /// A 0-dim fp32 loss combined with a scalar (`loss / n`, `loss * n`): with `other` a tensor
    /// the node keeps it (`S::In(1)`); with a Python number (`None`) it keeps nothing. The
    /// backward allocates the loss's 4-B fp32 gradient.
    pub fn loss_scalar(&mut self, name: &'static str, node: &'static str, x: Tid, other: Option<Tid>) -> Tid {
        let out = self.out(Shape::scalar(), Dt::F32, true);
        let (ins, saved): (Vec<Tid>, &[S]) = match other {
            Some(o) => (vec![x, o], &[S::In(1)]),
            None => (vec![x], &[]),
        };
        self.op(name, node, &ins, &[out], saved, &[B::Alloc { bytes: 4, dtype: DType::Fp32, op: name }, B::Grad { input: 0, temp: 0 }])[0]
    }

    /// `x.pow(n)` for a Python exponent: keeps `x`; backward `x.pow(n-1)`, `n * ·`, `grad * ·`.
    pub fn pow(&mut self, x: Tid) -> Tid {
        self.elementwise_power(x, "pow", "PowBackward0", S::In(0))
    }

    /// `torch.rsqrt(x)`: keeps its result; backward `result.pow(3)`, `-0.5 * ·`, `grad * ·`.
    pub fn rsqrt(&mut self, x: Tid) -> Tid {
        self.elementwise_power(x, "rsqrt", "RsqrtBackward0", S::Out(0))
    }

    /// An element-wise power (`pow`, `rsqrt`): one output of `x`'s shape, saving `save`; its
    /// backward (PowBackward0, RsqrtBackward0) allocates a `pow`, then two `mul`s, frees the first
    /// two and hands the last on as the gradient.
    fn elementwise_power(&mut self, x: Tid, name: &'static str, node: &'static str, save: S) -> Tid {
        let (shape, dt, rg, bytes, dtype) = (self.shape(x), self.t(x).dt, self.rg(x), self.bytes(x), self.t(x).dtype);
        let out = self.out(shape, dt, rg);
        let bw: &[B] = if rg {
            &[
                B::Alloc { bytes, dtype, op: "pow" },
                B::Alloc { bytes, dtype, op: "mul" },
                B::Alloc { bytes, dtype, op: "mul" },
                B::Free(1),
                B::Free(0),
                B::Grad { input: 0, temp: 2 },
            ]
        } else {
            &[]
        };
        self.op(name, node, &[x], &[out], &[save], bw)[0]
    }

    /// `x.mean(-1, keepdim=True)` → `[…, 1]`; backward one full-size `div`.
    pub fn mean_last(&mut self, x: Tid) -> Tid {
        let (shape, dt, rg, bytes, dtype) = (self.shape(x), self.t(x).dt, self.rg(x), self.bytes(x), self.t(x).dtype);
        let out = self.out(shape.drop_last(), dt, rg);
        let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "div" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
        self.op("mean", "MeanBackward1", &[x], &[out], &[], bw)[0]
    }

    /// `a * b` with broadcasting; the output has the shape of the larger operand (or `shape`).
    /// MulBackward0 keeps `b` when `a` needs a gradient and `a` when `b` does.
    pub fn mul(&mut self, a: Tid, b: Tid) -> Tid {
        let full = if self.numel_bytes(a) >= self.numel_bytes(b) { a } else { b };
        let shape = self.shape(full);
        let dt = self.promote(a, b, full);
        self.mul_to(a, b, shape, dt)
    }

    /// The result dtype of a binary op (type promotion: the wider float wins).
    pub fn promote(&self, a: Tid, b: Tid, prefer: Tid) -> Dt {
        let (da, db) = (self.t(a).dtype, self.t(b).dtype);
        if da == db {
            self.t(prefer).dt
        } else if da.bytes() >= db.bytes() {
            self.t(a).dt
        } else {
            self.t(b).dt
        }
    }

    fn numel_bytes(&self, t: Tid) -> u128 {
        self.bytes(t) / self.t(t).dtype.bytes().max(1) as u128
    }

    /// `a * b` into an output of `shape` / `dt`.
    pub fn mul_to(&mut self, a: Tid, b: Tid, shape: Shape, dt: Dt) -> Tid {
        let (ra, rb) = (self.rg(a), self.rg(b));
        let out = self.out(shape, dt, ra || rb);
        let full = self.bytes_of(&shape, dt);
        let dtype = self.dtype(dt);
        // MulBackward0's saved variables in the generated node's order, `other_` before `self_`
        // (the order of their pack hooks: an offloading context's pack ids).
        let mut saved: [S; 2] = [S::In(0); 2];
        let mut ns = 0;
        if ra {
            saved[ns] = S::In(1);
            ns += 1;
        }
        if rb {
            saved[ns] = S::In(0);
            ns += 1;
        }
        let mut bw: [B; 10] = [B::Free(0); 10];
        let mut n = 0;
        let mut temps = 0u8;
        let (mut ta, mut tb) = (u8::MAX, u8::MAX);
        if rb {
            bw[n] = B::Alloc { bytes: full, dtype, op: "mul" };
            n += 1;
            tb = temps;
            temps += 1;
        }
        if ra {
            bw[n] = B::Alloc { bytes: full, dtype, op: "mul" };
            n += 1;
            ta = temps;
            temps += 1;
        }
        let full_numel = full / dtype.bytes().max(1) as u128;
        let mut applied = false;
        for (input, t, rg) in [(a, &mut ta, ra), (b, &mut tb, rb)] {
            if !rg {
                continue;
            }
            let g = self.t(input).dtype;
            let reduce = self.numel_bytes(input) < full_numel;
            // validate_outputs: a broadcast input's gradient is summed to its shape, one of
            // another dtype is cast to it (type promotion), the full temporary freed.
            if reduce || g != dtype {
                if !applied {
                    bw[n] = B::Apply;
                    n += 1;
                    applied = true;
                }
                bw[n] = B::Alloc { bytes: self.grad_bytes(input), dtype: g, op: if reduce { "sum" } else { "_to_copy" } };
                bw[n + 1] = B::Free(*t);
                n += 2;
                *t = temps;
                temps += 1;
            }
        }
        if ra {
            bw[n] = B::Grad { input: 0, temp: ta };
            n += 1;
        }
        if rb {
            bw[n] = B::Grad { input: 1, temp: tb };
            n += 1;
        }
        self.op("mul", "MulBackward0", &[a, b], &[out], &saved[..ns], &bw[..n])[0]
    }

    /// `a + b` (AddBackward0): the gradient passes to both; a broadcast operand gets its `sum`,
    /// and an operand narrower than the promoted result (bf16 + fp32 → fp32) a copy of the
    /// gradient in its own dtype — the autograd engine's `validate_outputs` casts a gradient
    /// to its input's dtype (torch 2.15 `torch/csrc/autograd/engine.cpp`).
    pub fn add(&mut self, a: Tid, b: Tid) -> Tid {
        let full = if self.numel_bytes(a) >= self.numel_bytes(b) { a } else { b };
        let (shape, dt) = (self.shape(full), self.promote(a, b, full));
        let (ra, rb) = (self.rg(a), self.rg(b));
        let out = self.out(shape, dt, ra || rb);
        let out_dtype = self.dtype(dt);
        let fb = self.numel_bytes(full);
        let mut bw: [B; 4] = [B::Free(0); 4];
        let mut n = 0;
        let mut temps = 0u8;
        for (i, input, rg) in [(0u8, a, ra), (1u8, b, rb)] {
            if !rg {
                continue;
            }
            if self.numel_bytes(input) < fb || self.t(input).dtype != out_dtype {
                let g = self.t(input).dtype;
                let op = if self.numel_bytes(input) < fb { "sum" } else { "_to_copy" };
                bw[n] = B::Alloc { bytes: self.grad_bytes(input), dtype: g, op };
                bw[n + 1] = B::Grad { input: i, temp: temps };
                temps += 1;
                n += 2;
            } else {
                bw[n] = B::Pass { input: i, output: 0 };
                n += 1;
            }
        }
        self.op("add", "AddBackward0", &[a, b], &[out], &[], &bw[..n])[0]
    }

    // ------------------------------------------------------------------ linear layers

    /// `F.linear(x, w, bias)` on a `[b, s, in]` input: `mm` (or `addmm` with a bias) into
    /// `[b, s, out]` of `shape`. The node keeps `x` when the weight learns; MmBackward0 makes
    /// the weight's gradient, then the input's; AddmmBackward0 the input's, the weight's, then
    /// the bias's `sum`.
    pub fn linear(&mut self, x: Tid, w: Tid, bias: Option<Tid>, shape: Shape) -> Tid {
        // Under autocast, `linear` casts its input and its weight (and bias) to the compute
        // dtype; the weight's cast is cached until the autocast context exits
        // (`aten/src/ATen/autocast_mode.cpp`, `cached_cast`).
        let (x, w, bias) = if self.autocast { self.autocast_linear(x, w, bias) } else { (x, w, bias) };
        let rx = self.rg(x);
        let rw = self.rg(w);
        let dt = self.t(x).dt;
        let out = self.out(shape, dt, rx || rw || bias.is_some_and(|b| self.rg(b)));
        let xb = self.bytes(x);
        let xd = self.t(x).dtype;
        let wg = self.grad_bytes(w);
        let wd = self.t(w).dtype;
        // MmBackward0 keeps `self` (the input) for the weight's gradient and `mat2` (the weight,
        // a parameter unless autocast cast it) for the input's.
        let saved: &[S] = match (rw, rx) {
            (true, true) => &[S::In(0), S::In(1)],
            (true, false) => &[S::In(0)],
            (false, true) => &[S::In(1)],
            (false, false) => &[],
        };
        match bias {
            None => {
                let mut bw: [B; 4] = [B::Free(0); 4];
                let mut n = 0;
                let mut temps = 0;
                if rw {
                    bw[n] = B::Alloc { bytes: wg, dtype: wd, op: "mm" };
                    bw[n + 1] = B::Grad { input: 1, temp: temps };
                    temps += 1;
                    n += 2;
                }
                if rx {
                    bw[n] = B::Alloc { bytes: xb, dtype: xd, op: "mm" };
                    bw[n + 1] = B::Grad { input: 0, temp: temps };
                    n += 2;
                }
                self.op("mm", "MmBackward0", &[x, w], &[out], saved, &bw[..n])[0]
            }
            Some(bb) => {
                let rb = self.rg(bb);
                let bg = self.grad_bytes(bb);
                let bd = self.t(bb).dtype;
                let mut bw: [B; 7] = [B::Free(0); 7];
                let mut n = 0;
                let mut temps = 0;
                if rx {
                    bw[n] = B::Alloc { bytes: xb, dtype: xd, op: "mm" };
                    bw[n + 1] = B::Grad { input: 0, temp: temps };
                    temps += 1;
                    n += 2;
                }
                if rw {
                    bw[n] = B::Alloc { bytes: wg, dtype: wd, op: "mm" };
                    bw[n + 1] = B::Grad { input: 1, temp: temps };
                    temps += 1;
                    n += 2;
                }
                if rb {
                    // The bias's gradient is `grad` itself, summed to its shape by the engine.
                    bw[n] = B::Apply;
                    bw[n + 1] = B::Alloc { bytes: bg, dtype: bd, op: "sum" };
                    bw[n + 2] = B::Grad { input: 2, temp: temps };
                    n += 3;
                }
                self.op("addmm", "AddmmBackward0", &[x, w, bb], &[out], saved, &bw[..n])[0]
            }
        }
    }

    fn autocast_linear(&mut self, x: Tid, w: Tid, bias: Option<Tid>) -> (Tid, Tid, Option<Tid>) {
        let part = self.part;
        let x = self.to_copy(x, Dt::Model);
        self.part = Part::Autocast;
        let w = self.cast_weight(w);
        let bias = bias.map(|b| self.cast_weight(b));
        self.part = part;
        (x, w, bias)
    }

    /// A parameter cast to the compute dtype by autocast: cached until the autocast context
    /// exits when the parameter learns — `cached_cast` caches only a leaf that requires grad
    /// (torch 2.15 `aten/src/ATen/autocast_mode.cpp`, `can_try_cache`) — so a frozen weight's
    /// cast (a LoRA base) lives only as long as its op keeps it (measured:
    /// tests/fixtures/pytorch/lora, amp-bf16 with checkpointing: each base weight's bf16 cast
    /// freed right after its `mm`).
    pub fn cast_weight(&mut self, w: Tid) -> Tid {
        if self.t(w).dtype == self.compute {
            return w;
        }
        let c = self.to_copy(w, Dt::Model);
        if self.rg(w) {
            self.hold_forward(c);
        }
        c
    }

    /// An autocast op's input: cast to the compute dtype.
    pub fn autocast_in(&mut self, x: Tid) -> Tid {
        if self.autocast {
            self.to_copy(x, Dt::Model)
        } else {
            x
        }
    }

    /// A projection of the modeling code (`q_proj`, `down_proj`, …): `linear` (or the FP8
    /// recipe's linear, QLoRA's quantized base: `lowbit.rs`), with a LoRA adapter when it is
    /// targeted. peft 0.21 (`peft/tuners/lora/layer.py`, `Linear.forward`):
    /// `x = x.to(lora_A.weight.dtype)` (`_cast_input_dtype`, a copy only when the dtypes
    /// differ: each adapter its own), `result = base_layer(x) + lora_B(lora_A(dropout(x))) *
    /// scaling`, then `result.to(result's dtype)`. On a bf16 base with peft's fp32 adapters
    /// (`lora_dtype = fp32`) that is, per adapted linear, an fp32 copy of the input kept by
    /// `lora_A` (4 B an input element where the shared bf16 input cost nothing), `lora_A`'s fp32
    /// output `[b, s, r]` kept by `lora_B`, and an fp32 sum cast back to bf16 (transient);
    /// backward casts the gradients back (`ToCopyBackward0`, the engine's cast of the base's
    /// gradient). torchtune's and litgpt's `LoRALinear` (`lora_dtype = model`) add
    /// `lora_B(lora_A(dropout(x))) * scaling` in x's dtype: no cast. `lora_A` keeps x (the
    /// frozen base keeps nothing), `lora_B` keeps `lora_A`'s output.
    /// torchtune's `LoRALinear(quantize_base=True)` (torchao's NF4 base, `linear_nf4`) adds its
    /// adapters the same way, in x's dtype.
    pub fn proj(&mut self, x: Tid, w: Tid, bias: Option<Tid>, shape: Shape, lin: crate::estimator::model::Linear) -> Tid {
        let quant = self.lowbit.quant.filter(|_| !self.rg(w));
        let base = match quant {
            Some(q) if q.kind == crate::estimator::config::QloraQuant::TorchaoNf4 => self.linear_nf4(x, w, bias, shape, lin),
            Some(q) => return self.quantized_proj(x, w, bias, shape, lin, q),
            None => self.base_linear(x, w, bias, shape),
        };
        let Some(l) = self.lora.filter(|l| targeted(lin, l.targets)) else { return base };
        let expected = self.t(base).dt;
        // torchtune 0.6.1 `LoRALinear.forward`: `out + (alpha / rank) * lora_b(lora_a(x))`, no cast.
        let cast = l.cast_input && quant.is_none();
        let xa = if cast { self.to_copy(x, l.dt()) } else { x };
        let bb = self.lora_branch(x, xa, shape, l);
        let sc = self.mul_scalar(bb);
        let sum = self.add(base, sc);
        if cast {
            self.to_copy(sum, expected)
        } else {
            sum
        }
    }

    /// Gradient bytes of a parameter (0 when frozen).
    pub fn grad_bytes(&self, w: Tid) -> u128 {
        match self.t(w).origin {
            super::ir::Origin::Param { grad_bytes } => grad_bytes,
            _ => self.bytes(w),
        }
    }

    /// A fused node's backward, one gradient per input that needs one: for each
    /// `(input index, tensor)` of `ins` that requires grad, allocate a tensor of its gradient's
    /// size (labelled `op`) and make it that input's gradient. Temporaries are numbered from
    /// `first` (the node's earlier `Alloc`s take `0..first`).
    pub fn input_grads(&self, ins: &[(u8, Tid)], op: &'static str, first: u8) -> Vec<B> {
        let mut bw = Vec::with_capacity(2 * ins.len());
        let mut temp = first;
        for &(input, t) in ins {
            if self.rg(t) {
                bw.push(B::Alloc { bytes: self.grad_bytes(t), dtype: self.t(t).dtype, op });
                bw.push(B::Grad { input, temp });
                temp += 1;
            }
        }
        bw
    }

    // ------------------------------------------------------------------ views

    /// A view (`view`, `reshape` of a contiguous tensor, `transpose`, `unsqueeze`): no
    /// allocation; in backward the gradient passes, or is copied when `clone_bw` (it arrives
    /// laid out so that `reshape` cannot view it: ViewBackward0 `clone`).
    pub fn view(&mut self, x: Tid, shape: Shape, node: &'static str, clone_bw: bool) -> Tid {
        let out = self.view_out(x, shape);
        let (bytes, dtype) = (self.bytes(x), self.t(x).dtype);
        let bw: &[B] = if !self.rg(x) {
            &[]
        } else if clone_bw {
            &[B::Alloc { bytes, dtype, op: "clone" }, B::Grad { input: 0, temp: 0 }]
        } else {
            &[B::Pass { input: 0, output: 0 }]
        };
        self.op("view", node, &[x], &[out], &[], bw)[0]
    }

    /// `x[..., a:b]` on the last dim: a view; SliceBackward0 allocates the full input.
    pub fn slice_last(&mut self, x: Tid, last: Dim) -> Tid {
        let shape = self.shape(x).last(last);
        let out = self.view_out(x, shape);
        let (bytes, dtype) = (self.bytes(x), self.t(x).dtype);
        let bw: &[B] = if self.rg(x) { &[B::Alloc { bytes, dtype, op: "slice_backward" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
        self.op("slice", "SliceBackward0", &[x], &[out], &[], bw)[0]
    }

    /// A slice of `x` (`x[..., a:b]` on any dim) with `shape`: a view; SliceBackward0
    /// allocates the full input (`slice_backward`: zeros, then the gradient copied in).
    pub fn slice(&mut self, x: Tid, shape: Shape) -> Tid {
        let out = self.view_out(x, shape);
        let (bytes, dtype) = (self.bytes(x), self.t(x).dtype);
        let bw: &[B] = if self.rg(x) { &[B::Alloc { bytes, dtype, op: "slice_backward" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
        self.op("slice", "SliceBackward0", &[x], &[out], &[], bw)[0]
    }

    /// A slice covering the whole tensor: `slice` returns an alias (AliasBackward0 passes).
    pub fn alias(&mut self, x: Tid) -> Tid {
        let shape = self.shape(x);
        self.view(x, shape, "AliasBackward0", false)
    }

    /// `torch.cat((a, b), -1)` into `shape`: CatBackward0 hands each input a narrowed view.
    pub fn cat2(&mut self, a: Tid, b: Tid, shape: Shape) -> Tid {
        let dt = self.t(a).dt;
        let rg = self.rg(a) || self.rg(b);
        let out = self.out(shape, dt, rg);
        let bw: &[B] = &[B::Pass { input: 0, output: 0 }, B::Pass { input: 1, output: 0 }];
        self.op("cat", "CatBackward0", &[a, b], &[out], &[], if rg { bw } else { &[] })[0]
    }

    // ------------------------------------------------------------------ attention kernels

    /// `F.scaled_dot_product_attention` on CPU (and flash on CUDA): output `[b, a, s, d]` in
    /// q's layout and an fp32 log-sum-exp `[b, a, s]`; keeps q, k, v, output and lse; backward
    /// allocates dq, dk, dv.
    pub fn sdpa_flash(&mut self, q: Tid, k: Tid, v: Tid, name: &'static str, node: &'static str, bw_name: &'static str) -> (Tid, Tid) {
        let (q, k, v) = (self.autocast_in(q), self.autocast_in(k), self.autocast_in(v));
        let rg = self.rg(q) || self.rg(k) || self.rg(v);
        let o = self.out(self.shape(q), self.t(q).dt, rg);
        let lse_shape = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::A), Dim::Q(Q::S)], Split::Tp);
        let lse = self.out(lse_shape, Dt::F32, false);
        let mut bw: [B; 6] = [B::Free(0); 6];
        let mut n = 0;
        let mut temps = 0;
        for (i, t) in [q, k, v].into_iter().enumerate() {
            if self.rg(t) {
                bw[n] = B::Alloc { bytes: self.bytes(t), dtype: self.t(t).dtype, op: bw_name };
                n += 1;
            }
            let _ = i;
        }
        for (i, t) in [q, k, v].into_iter().enumerate() {
            if self.rg(t) {
                bw[n] = B::Grad { input: i as u8, temp: temps };
                temps += 1;
                n += 1;
            }
        }
        let r = self.op(name, node, &[q, k, v], &[o, lse], &[S::In(0), S::In(1), S::In(2), S::Out(0), S::Out(1)], &bw[..n]);
        (r[0], r[1])
    }

    /// `torch.bmm`-style matmul `a @ b` into `shape`; BmmBackward0 makes `b`'s gradient
    /// first, then `a`'s; it keeps `b` for `a`'s gradient and `a` for `b`'s.
    pub fn bmm(&mut self, a: Tid, b: Tid, shape: Shape) -> Tid {
        let (a, b) = (self.autocast_in(a), self.autocast_in(b));
        let (ra, rb) = (self.rg(a), self.rg(b));
        let dt = self.t(a).dt;
        let out = self.out(shape, dt, ra || rb);
        let mut saved: [S; 2] = [S::In(0); 2];
        let mut ns = 0;
        if ra {
            saved[ns] = S::In(1);
            ns += 1;
        }
        if rb {
            saved[ns] = S::In(0);
            ns += 1;
        }
        let mut bw: [B; 4] = [B::Free(0); 4];
        let mut n = 0;
        let mut temps = 0;
        if rb {
            bw[n] = B::Alloc { bytes: self.bytes(b), dtype: self.t(b).dtype, op: "bmm" };
            bw[n + 1] = B::Grad { input: 1, temp: temps };
            temps += 1;
            n += 2;
        }
        if ra {
            bw[n] = B::Alloc { bytes: self.bytes(a), dtype: self.t(a).dtype, op: "bmm" };
            bw[n + 1] = B::Grad { input: 0, temp: temps };
            n += 2;
        }
        self.op("bmm", "BmmBackward0", &[a, b], &[out], &saved[..ns], &bw[..n])[0]
    }

    /// A copy into a new layout (`.contiguous()`, `reshape` that copies, `clone`):
    /// CloneBackward0 passes the gradient.
    pub fn copy(&mut self, x: Tid, shape: Shape) -> Tid {
        let (dt, rg) = (self.t(x).dt, self.rg(x));
        let out = self.out(shape, dt, rg);
        let bw: &[B] = if rg { &[B::Pass { input: 0, output: 0 }] } else { &[] };
        self.op("clone", "CloneBackward0", &[x], &[out], &[], bw)[0]
    }

    /// `matmul`'s fold of a 4-d operand laid out `[b, s, heads, d]` into `[b·heads, s, d]` for
    /// `bmm` (`expand(...).reshape(...)`, ATen's `_matmul_impl`): a copy, except at b = 1 where the
    /// batch dim merges into the heads and `reshape` is a view (`ReshapeAliasBackward0`), so
    /// `bmm` saves a view of `x` itself.
    pub fn fold(&mut self, x: Tid, shape: Shape) -> Tid {
        if self.c.n(Q::B) == 1 {
            x
        } else {
            self.copy(x, shape)
        }
    }

    /// `x[idx]` along the first dim into `shape` (IndexBackward0 keeps the indices; backward
    /// `new_zeros` of the input and an out-of-place `index_put` with accumulation).
    pub fn index(&mut self, x: Tid, idx: Tid, shape: Shape) -> Tid {
        let (dt, rg, bytes, dtype) = (self.t(x).dt, self.rg(x), self.bytes(x), self.t(x).dtype);
        let out = self.out(shape, dt, rg);
        let bw: &[B] = if rg {
            &[
                B::Alloc { bytes, dtype, op: "new_zeros" },
                B::Alloc { bytes, dtype, op: "index_put" },
                B::Free(0),
                B::Grad { input: 0, temp: 1 },
            ]
        } else {
            &[]
        };
        self.op("index", "IndexBackward0", &[x, idx], &[out], if rg { &[S::In(1)] } else { &[] }, bw)[0]
    }

    /// A reduction over one dim into `shape` (`sum(dim)`): SumBackward1 expands the gradient
    /// back (a view).
    pub fn sum_dim(&mut self, x: Tid, shape: Shape) -> Tid {
        let (dt, rg) = (self.t(x).dt, self.rg(x));
        let out = self.out(shape, dt, rg);
        let bw: &[B] = if rg { &[B::Pass { input: 0, output: 0 }] } else { &[] };
        self.op("sum", "SumBackward1", &[x], &[out], &[], bw)[0]
    }

    /// `x.chunk(2, -1)`: two views; SplitBackward0 concatenates their gradients (`cat`).
    pub fn chunk2(&mut self, x: Tid, half: Shape) -> (Tid, Tid) {
        let (rg, bytes, dtype) = (self.rg(x), self.bytes(x), self.t(x).dtype);
        let o1 = self.view_out(x, half);
        let o2 = self.view_out(x, half);
        let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "cat" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
        let r = self.op("split", "SplitBackward0", &[x], &[o1, o2], &[], bw);
        (r[0], r[1])
    }

    /// `torch._grouped_mm(x, w, offs)` into `shape`: keeps the weight, the offsets and x;
    /// backward the weight's gradient, then the input's.
    pub fn grouped_mm(&mut self, x: Tid, w: Tid, offs: Tid, shape: Shape) -> Tid {
        let (rx, rw) = (self.rg(x), self.rg(w));
        let dt = self.t(x).dt;
        let out = self.out(shape, dt, rx || rw);
        let (xb, xd, wg, wd) = (self.bytes(x), self.t(x).dtype, self.grad_bytes(w), self.t(w).dtype);
        let mut bw: [B; 4] = [B::Free(0); 4];
        let mut n = 0;
        let mut temps = 0;
        if rw {
            bw[n] = B::Alloc { bytes: wg, dtype: wd, op: "_grouped_mm" };
            bw[n + 1] = B::Grad { input: 1, temp: temps };
            temps += 1;
            n += 2;
        }
        if rx {
            bw[n] = B::Alloc { bytes: xb, dtype: xd, op: "_grouped_mm" };
            bw[n + 1] = B::Grad { input: 0, temp: temps };
            n += 2;
        }
        // GroupedMmBackward0 keeps `mat2` (the weight: a Parameter or a view of one, no memory
        // of its own, but a pack under activation offloading) for the input's gradient, `offs`,
        // and `self` for the weight's, in the generated node's order of its saved variables.
        let saved: &[S] = match (rx, rw) {
            (true, true) => &[S::In(1), S::In(2), S::In(0)],
            (true, false) => &[S::In(1), S::In(2)],
            (false, true) => &[S::In(2), S::In(0)],
            (false, false) => &[S::In(2)],
        };
        self.op("_grouped_mm", "GroupedMmBackward0", &[x, w, offs], &[out], saved, &bw[..n])[0]
    }

    /// `torch.topk(x, k)`: values (with gradient) and int64 indices, both `shape`; TopkBackward0
    /// keeps the indices and scatters the gradient into `new_zeros` of the input.
    pub fn topk(&mut self, x: Tid, shape: Shape) -> (Tid, Tid) {
        let (dt, rg, bytes, dtype) = (self.t(x).dt, self.rg(x), self.bytes(x), self.t(x).dtype);
        let v = self.out(shape, dt, rg);
        let i = self.out(shape, Dt::I64, false);
        let bw: &[B] = if rg {
            &[
                B::Alloc { bytes, dtype, op: "new_zeros" },
                B::Alloc { bytes, dtype, op: "scatter" },
                B::Free(0),
                B::Grad { input: 0, temp: 1 },
            ]
        } else {
            &[]
        };
        let r = self.op("topk", "TopkBackward0", &[x], &[v, i], &[S::Out(1)], bw);
        (r[0], r[1])
    }

    /// `a /= b` in place (b broadcast): autograd first copies `a`'s old value (DivBackward0
    /// needs it); backward: `other`'s gradient `-grad * (self / other) / other` (four
    /// temporaries), then `self`'s `grad / other`, then `other`'s `sum`.
    pub fn div_(&mut self, a: Tid, b: Tid) -> Tid {
        let (shape, dt) = (self.shape(a), self.t(a).dt);
        let old = self.plain("clone", &[a], shape, dt);
        let out = self.view_out(a, shape);
        let bw = self.div_backward(a, b);
        self.op("div_", "DivBackward0", &[a, b, old], &[out], &[S::In(2), S::In(1)], &bw)[0]
    }

    /// DivBackward0's script for `a / b` with `b` broadcast: `other`'s gradient
    /// `-grad * (self / other) / other` (four temporaries of `a`'s size), then `self`'s
    /// `grad / other`, then `other`'s `sum` to its shape.
    pub fn div_backward(&self, a: Tid, b: Tid) -> [B; 13] {
        let (ab, ad, bb, bd) = (self.bytes(a), self.t(a).dtype, self.bytes(b), self.t(b).dtype);
        [
            B::Alloc { bytes: ab, dtype: ad, op: "div" },
            B::Alloc { bytes: ab, dtype: ad, op: "div" },
            B::Alloc { bytes: ab, dtype: ad, op: "neg" },
            B::Alloc { bytes: ab, dtype: ad, op: "mul" },
            B::Free(2),
            B::Free(1),
            B::Free(0),
            B::Alloc { bytes: ab, dtype: ad, op: "div" },
            B::Apply,
            B::Alloc { bytes: bb, dtype: bd, op: "sum" },
            B::Free(3),
            B::Grad { input: 0, temp: 4 },
            B::Grad { input: 1, temp: 5 },
        ]
    }

    /// `F.layer_norm(x, (h,), w, b)` → `native_layer_norm`: output, mean and rstd `[b, s, 1]`
    /// (the input dtype on CPU, fp32 on CUDA); keeps x, mean, rstd; NativeLayerNormBackward0
    /// allocates dx, then dw and db.
    pub fn layer_norm(&mut self, x: Tid, w: Option<Tid>, bias: Option<Tid>) -> Tid {
        let (shape, dt, rgx, xb, xd) = (self.shape(x), self.t(x).dt, self.rg(x), self.bytes(x), self.t(x).dtype);
        let stat_dt = if self.c.cuda { Dt::F32 } else { dt };
        let rg = rgx || w.is_some_and(|w| self.rg(w)) || bias.is_some_and(|b| self.rg(b));
        let outs = [self.out(shape, dt, rg), self.out(shape.drop_last(), stat_dt, false), self.out(shape.drop_last(), stat_dt, false)];
        let mut ins = vec![x];
        ins.extend(w);
        ins.extend(bias);
        let mut bw: Vec<B> = Vec::with_capacity(6);
        let mut temps = 0u8;
        if rgx {
            bw.push(B::Alloc { bytes: xb, dtype: xd, op: "native_layer_norm_backward" });
            bw.push(B::Grad { input: 0, temp: temps });
            temps += 1;
        }
        for (i, p) in [w, bias].into_iter().enumerate() {
            if let Some(p) = p {
                if self.rg(p) {
                    bw.push(B::Alloc { bytes: self.grad_bytes(p), dtype: self.t(p).dtype, op: "native_layer_norm_backward" });
                    bw.push(B::Grad { input: 1 + i as u8, temp: temps });
                    temps += 1;
                }
            }
        }
        // NativeLayerNormBackward0 also saves the weight and the bias (Parameters: no memory of
        // their own, but each a pack under activation offloading), in the generated node's
        // order of its saved variables: bias, input, result1 (mean), result2 (rstd), weight.
        let mut saved: Vec<S> = Vec::with_capacity(5);
        if bias.is_some() {
            saved.push(S::In(ins.len() as u8 - 1));
        }
        saved.extend([S::In(0), S::Out(1), S::Out(2)]);
        if w.is_some() {
            saved.push(S::In(1));
        }
        self.op("native_layer_norm", "NativeLayerNormBackward0", &ins, &outs, &saved, &bw)[0]
    }

    /// [`Builder::layer_norm`] with a weight of another dtype than its input (under autocast:
    /// a bf16 q or k normalized by an fp32 weight, StableLM's per-head norms). ATen's mixed-type
    /// CPU kernel (`layer_norm_kernel.cpp`, `LayerNormKernelImplInternal<T, param_t>`) keeps
    /// the output in the input dtype but mean and rstd in the weight's (fp32).
    pub fn layer_norm_mixed(&mut self, x: Tid, w: Option<Tid>, bias: Option<Tid>) -> Tid {
        let mixed = w.is_some_and(|w| self.t(w).dtype != self.t(x).dtype);
        let y = self.layer_norm(x, w, bias);
        if mixed && !self.c.cuda {
            let wd = w.map_or(Dt::F32, |w| self.t(w).dt);
            let op = self.p.ops.last().expect("the norm was just emitted").clone();
            let stats: Vec<Tid> = self.p.outs(&op)[1..].to_vec();
            for t in stats {
                let shape = self.p.tensors[t as usize].shape;
                let bytes = self.bytes_of(&shape, wd);
                let dtype = self.dtype(wd);
                let st = &mut self.p.tensors[t as usize];
                st.dt = wd;
                st.dtype = dtype;
                st.bytes = bytes;
            }
        }
        y
    }

    /// `tensor.split(size, dim=-1)` into three views of `shape`: SplitBackward0 concatenates
    /// their gradients (`cat`).
    pub fn split3(&mut self, x: Tid, shape: Shape) -> (Tid, Tid, Tid) {
        let (rg, bytes, dtype) = (self.rg(x), self.bytes(x), self.t(x).dtype);
        let o = [self.view_out(x, shape), self.view_out(x, shape), self.view_out(x, shape)];
        let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "cat" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
        let r = self.op("split", "SplitBackward0", &[x], &o, &[], bw);
        (r[0], r[1], r[2])
    }

    /// `F.dropout(x, p, training=True)` (a no-op when p = 0). CPU (`at::dropout`, not
    /// "fused-kernel acceptable"): `noise = empty_like(x).bernoulli_(1 - p).div_(1 - p)`, then
    /// `x * noise` — the noise, in x's dtype, is kept. CUDA (`native_dropout`): the output and a
    /// bool mask, kept by NativeDropoutBackward0.
    pub fn dropout(&mut self, x: Tid) -> Tid {
        if !self.dropout {
            return x;
        }
        self.dropout_op(x)
    }

    /// [`Builder::dropout`] whatever the model's `dropout` is (p > 0): an adapter's own
    /// `nn.Dropout` (`lora_dropout`).
    pub fn dropout_op(&mut self, x: Tid) -> Tid {
        let (shape, dt, rg, bytes, dtype) = (self.shape(x), self.t(x).dt, self.rg(x), self.bytes(x), self.t(x).dtype);
        if self.c.cuda {
            let outs = [self.out(shape, dt, rg), self.out(shape, Dt::Bool, false)];
            let bw: &[B] =
                if rg { &[B::Alloc { bytes, dtype, op: "native_dropout_backward" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
            self.op("native_dropout", "NativeDropoutBackward0", &[x], &outs, &[S::Out(1)], bw)[0]
        } else {
            let noise = self.plain("bernoulli_", &[x], shape, dt);
            self.mul(x, noise)
        }
    }

    /// An op without a gradient (index arithmetic, masks): allocates `shape` in `dt`.
    pub fn plain(&mut self, name: &'static str, ins: &[Tid], shape: Shape, dt: Dt) -> Tid {
        let out = self.out(shape, dt, false);
        self.op(name, "", ins, &[out], &[], &[])[0]
    }

    /// An op with several outputs and no gradient.
    pub fn plain_n(&mut self, name: &'static str, ins: &[Tid], outs: &[Out]) -> [Tid; 4] {
        self.op(name, "", ins, outs, &[], &[])
    }
}

/// Shapes the blocks use.
pub mod shapes {
    use crate::estimator::ctx::Q;
    use crate::estimator::step::ir::{Dim, Shape, Split};

    /// `[b, s, w]`, split like the residual stream.
    pub fn tok(w: Q) -> Shape {
        Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(w)], Split::Sp)
    }
    /// `[b, s, w]` inside the tensor-parallel region.
    pub fn tok_tp(w: Dim) -> Shape {
        Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), w], Split::Tp)
    }
    /// `[b, s, 1]` row statistics.
    pub fn rows() -> Shape {
        Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::N(1)], Split::Sp)
    }
    /// `[b, heads, s, d]`.
    pub fn heads(h: Q) -> Shape {
        Shape::new(&[Dim::Q(Q::B), Dim::Q(h), Dim::Q(Q::S), Dim::Q(Q::D)], Split::Tp)
    }
    /// `[b, s, heads, d]`.
    pub fn heads_bshd(h: Q) -> Shape {
        Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(h), Dim::Q(Q::D)], Split::Tp)
    }
    /// `[b, a, s, s_kv]` attention scores.
    pub fn scores() -> Shape {
        Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::A), Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::Tp)
    }
}
