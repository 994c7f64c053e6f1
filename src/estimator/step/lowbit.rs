//! Projections that do not run a plain `nn.Linear`: the FP8 recipes' linears (torchao
//! `Float8Linear`, Transformer Engine's `te.Linear`) and QLoRA's quantized base (bitsandbytes
//! `Linear4bit`, gptqmodel's `TorchQuantLinear`), each with what it allocates in forward, what
//! its autograd node saves, and what that node allocates in backward, in order
//! (validation/FINDINGS.md §10–§11; the torchao and bitsandbytes programs are checked window by
//! window against `tests/fixtures/pytorch/{fp8,qlora}` by `tests/lowbit_fixtures.rs`).
//!
//! Which linears: every projection of a decoder layer ([`Builder::proj`]); the embeddings, the
//! LM head, norms, the router and the attention core never come here, so they stay in the
//! recipe's 16-bit dtype.

use super::ir::{Builder, DType, Dim, Dt, Lora, Shape, Split, Tid, B, S};
use crate::estimator::config::{Config, Finetune, Fp8, QloraQuant};
use crate::estimator::ctx::Q;
use crate::estimator::model::Linear;

pub use super::ir::{Fp8Linear, LowBit, Quant4};

/// bitsandbytes' NF4 block (`blocksize=64`).
pub const NF4_BLOCK: u128 = 64;

/// An element count as a shape (`numel` elements, no split): the transients below are sized by
/// their numbers (they appear in the step, not in the ledger's formulas).
fn flat(n: u128) -> Shape {
    Shape::new(&[Dim::W(n as u64)], Split::None)
}

/// Builds a node's backward script: allocations numbered in order, frees by number.
struct Script {
    b: Vec<B>,
    n: u8,
}

impl Script {
    fn new() -> Script {
        Script { b: Vec::with_capacity(64), n: 0 }
    }
    fn alloc(&mut self, bytes: u128, dtype: DType, op: &'static str) -> u8 {
        self.b.push(B::Alloc { bytes, dtype, op });
        self.n += 1;
        self.n - 1
    }
    fn free(&mut self, t: Option<u8>) {
        if let Some(t) = t {
            self.b.push(B::Free(t));
        }
    }
}

/// A torchao scale: its elements and whether it is per row/column (axiswise) or one per tensor.
#[derive(Clone, Copy)]
struct Scale {
    elems: u128,
    axis: bool,
}

impl Scale {
    fn tensorwise() -> Scale {
        Scale { elems: 1, axis: false }
    }
    fn of(axis: bool, elems: u128) -> Scale {
        if axis {
            Scale { elems, axis }
        } else {
            Scale::tensorwise()
        }
    }
}

impl<'a> Builder<'a> {
    fn numel(&self, t: Tid) -> u128 {
        self.bytes(t) / self.t(t).dtype.bytes().max(1) as u128
    }

    fn tokens(&self) -> u128 {
        (self.c.n(Q::B) * self.c.n(Q::S)).max(1) as u128
    }

    // ------------------------------------------------------------------ torchao

    /// `tensor_to_scale` + `hp_tensor_and_scale_to_float8` of `src` as forward ops
    /// (torchao 0.18 `float8_scaling_utils.py`, `float8_utils.py amax_to_scale`): `abs`, `max`
    /// (`amax` per row), the scale in fp64 (`_to_copy`, `clamp`, `reciprocal`, `mul`), an fp32
    /// scale (rounded to a power of 2 for rowwise: `log2`, `floor`, `exp2`), then
    /// `x.to(fp32) * scale`, `clamp`, `.to(fp8)`: 9 bytes per element above the live set.
    /// Returns the FP8 tensor and its scale.
    fn fp8_cast_fwd(&mut self, src: Tid, hp: Shape, scale: Shape, rowwise: bool) -> (Tid, Tid) {
        let sdt = self.t(src).dt;
        let ab = self.plain("abs", &[src], hp, sdt);
        let am = self.plain(if rowwise { "amax" } else { "max" }, &[ab], scale, sdt);
        let c64 = self.plain("_to_copy", &[am], scale, Dt::F64);
        let cl = self.plain("clamp", &[c64], scale, Dt::F64);
        let rc = self.plain("reciprocal", &[cl], scale, Dt::F64);
        let mu = self.plain("mul", &[rc], scale, Dt::F64);
        self.hold(cl);
        let s32 = self.plain("_to_copy", &[mu], scale, Dt::F32);
        let sc = if rowwise {
            let lg = self.plain("log2", &[s32], scale, Dt::F32);
            let fl = self.plain("floor", &[lg], scale, Dt::F32);
            let ex = self.plain("exp2", &[fl], scale, Dt::F32);
            self.hold(s32);
            ex
        } else {
            s32
        };
        self.hold(c64);
        self.hold(am);
        let c32 = if self.t(src).dtype == DType::Fp32 { src } else { self.plain("_to_copy", &[src], hp, Dt::F32) };
        let m = self.plain("mul", &[c32, sc], hp, Dt::F32);
        let cl2 = self.plain("clamp", &[m], hp, Dt::F32);
        let q = self.plain("_to_copy", &[cl2], hp, Dt::Fp8);
        self.hold(m);
        (q, sc)
    }

    /// torchao `Float8Linear.forward` (`float8_linear.py`, `matmul_with_hp_or_float8_args`): the
    /// input and the weight cast to FP8 (tensorwise or rowwise), `_scaled_mm` into the output;
    /// the node saves the 16-bit input and the weight itself, no FP8 tensor.
    pub fn torchao_linear(&mut self, x: Tid, w: Tid, bias: Option<Tid>, shape: Shape, f: Fp8Linear) -> Tid {
        let rowwise = f.recipe == Fp8::TorchaoRowwise;
        let (rx, rw) = (self.rg(x), self.rg(w));
        let t = self.tokens();
        let k = (self.numel(x) / t).max(1);
        let n = (self.numel(w) / k).max(1);
        let xshape = self.shape(x);
        // Row-wise: one scale per row of the input seen as [tokens, k] (a 4-D attention output,
        // [b, s, heads, head_dim] before its reshape, still has b·s rows).
        let (xq, xs) = self.fp8_cast_fwd(x, xshape, if rowwise { flat(self.numel(x) / k) } else { Shape::scalar() }, rowwise);
        let mut ins = vec![x, w, xq, xs];
        let ws = if f.allgathered {
            None
        } else {
            let (wq, ws) = self.fp8_cast_fwd(w, flat(k * n), if rowwise { flat(n) } else { Shape::scalar() }, rowwise);
            ins.extend([wq, ws]);
            Some(ws)
        };
        // addmm_float8_unwrapped: the reciprocals of both scales (the gathered weight's own scale
        // when all-gathered), taken inside `Float8TrainingTensor.__torch_dispatch__` for the
        // `aten.mm` a dispatch mode sees: under `recompute = op` a recomputation whose `mm` output
        // is cached never takes them (measured: tests/fixtures/pytorch/fp8 `ckpt-op` records,
        // layer-0 q/v/gate_proj recompute windows: no `reciprocal`, no `_scaled_mm`).
        self.in_dispatch = true;
        let ra = self.plain("reciprocal", &[xs], self.shape(xs), Dt::F32);
        let rb = match ws {
            Some(ws) => self.plain("reciprocal", &[ws], self.shape(ws), Dt::F32),
            None => self.plain("reciprocal", &[w], Shape::scalar(), Dt::F32),
        };
        self.in_dispatch = false;
        ins.extend([ra, rb]);
        if self.gathered_transpose_kept(f) {
            // The e4m3 transposed copy of the gathered weight that the compiled block keeps
            // for grad_input (`ins[6]`; [`Builder::gathered_transpose_kept`]).
            let wt = self.plain("clone", &[w], flat(k * n), Dt::Fp8);
            ins.push(wt);
        }
        let dt = self.t(x).dt;
        // Rowwise in fp32 (or fp16): `_scaled_mm` writes bf16 and the output is cast back
        // (`wide_rowwise_output`); the node's gradient stays in the input's dtype.
        let wide = self.wide_rowwise_output(rowwise, dt);
        let out = self.out(shape, if wide { Dt::Bf16 } else { dt }, rx || rw);
        // Compiled and fully checkpointed (torchtitan): the linear keeps its weight's e4m3 cast
        // from the re-run to its backward (`ins[4]`), not its 16-bit input; `wo`, whose input
        // SDPA writes (no kernel fuses its cast), keeps the input's cast too (`ins[2]`); the
        // feed-forward output projection keeps nothing its kernel recomputes (FINDINGS §15.1,
        // "Full AC, compiled"). Rowwise keeps only the weight (its forward casts scale along
        // other axes than the backward's: none crosses) and, compiled under any checkpointing,
        // takes Inductor's fused backward too (`compiled_rowwise`).
        let cf = self.compiled_full(f);
        let fused = cf || self.compiled_rowwise(f);
        let (is_w2, is_wo) = (fused && self.is_ffn_out(), cf && self.is_attn_out());
        let bw = if !(rx || rw) {
            Vec::new()
        } else if fused {
            self.compiled_full_backward(&shape, dt, t, k, n, is_w2, is_wo, rowwise)
        } else {
            self.torchao_backward(x, w, &shape, dt, f, t, k, n)
        };
        let saved: &[S] = if !(rx || rw) {
            &[]
        } else if cf && (is_w2 || rowwise) {
            &[S::In(1)]
        } else if is_wo {
            &[S::In(1), S::In(4), S::In(2)]
        } else if cf {
            &[S::In(1), S::In(4)]
        } else {
            &[S::In(0), S::In(1)]
        };
        let y = self.op("_scaled_mm", "matmul_with_hp_or_float8_argsBackward", &ins, &[out], saved, &bw)[0];
        // `output.to(orig_dtype)` inside the same autograd function: the fp32 gradient reaches
        // the node unchanged (no node of its own, nothing allocated in backward).
        let y = if wide {
            let o = self.out(shape, dt, rx || rw);
            self.op("_to_copy", "matmul_with_hp_or_float8_argsBackward", &[y], &[o], &[], &[B::Pass { input: 0, output: 0 }])[0]
        } else {
            y
        };
        match bias {
            Some(b) => self.add(y, b),
            None => y,
        }
    }

    /// Whether a rowwise float8 linear's forward `_scaled_mm` writes bf16 and casts its output
    /// back to the model's dtype: torchao 0.18 `float8_ops.py` `addmm_float8_unwrapped` ("work
    /// around torch._scaled_mm not having float32 output type": `output_dtype = torch.bfloat16`
    /// when the original dtype is fp32 or fp16 and the scaling is rowwise, then
    /// `output.to(orig_dtype)`), for the rowwise recipe (`config.py` `Float8LinearRecipeName.
    /// ROWWISE`: axiswise scaling of input, weight and grad_output). A compiled region keeps the
    /// bf16 `_scaled_mm` output where it keeps a matmul output and recomputes the cast (measured:
    /// torchtitan's fp32 compiled blocks, `_scaled_mm_3/4/5` saved in bfloat16,
    /// `frameworks/torchtitan-{llama3,qwen3}-compile-fp8.json`; FINDINGS §15.1 "Float8"). Not
    /// under op SAC: the policy caches the `mm` that `Float8TrainingTensor` dispatches, whose
    /// output is the cast-back fp32 tensor (measured: the fp32 `+op` rowwise records' saved
    /// bytes).
    fn wide_rowwise_output(&self, rowwise: bool, dt: Dt) -> bool {
        rowwise && self.dtype(dt) != DType::Bf16 && self.c.cfg.recompute != crate::estimator::config::Recompute::Op
    }

    /// `matmul_with_hp_or_float8_args.backward`: grad_output cast (e5m2 tensorwise, e4m3
    /// rowwise), the weight cast again, its transposed `.contiguous()` copy, `_scaled_mm` into
    /// grad_input (rowwise: an fp32 post-scale of the output's size); then grad_output and the
    /// saved input cast again for grad_weight, both transposed copies, `_scaled_mm` into it.
    #[allow(clippy::too_many_arguments)]
    fn torchao_backward(&self, x: Tid, w: Tid, shape: &Shape, dt: Dt, f: Fp8Linear, t: u128, k: u128, n: u128) -> Vec<B> {
        let ax = f.recipe == Fp8::TorchaoRowwise;
        let (gd, xd, wd) = (self.dtype(dt), self.t(x).dtype, self.t(w).dtype);
        let g_elems = self.bytes_of(shape, dt) / gd.bytes().max(1) as u128;
        let t = if g_elems > 0 && n > 0 { g_elems / n } else { t };
        let mut s = Script::new();
        let cast = |s: &mut Script, elems: u128, d: DType, sc: Scale| -> [Option<u8>; 2] {
            let ab = s.alloc(elems * d.bytes() as u128, d, "abs");
            let am = s.alloc(sc.elems * d.bytes() as u128, d, if sc.axis { "amax" } else { "max" });
            s.free(Some(ab));
            let c64 = s.alloc(8 * sc.elems, DType::F64, "_to_copy");
            let cl = s.alloc(8 * sc.elems, DType::F64, "clamp");
            let rc = s.alloc(8 * sc.elems, DType::F64, "reciprocal");
            let mu = s.alloc(8 * sc.elems, DType::F64, "mul");
            s.free(Some(rc));
            s.free(Some(cl));
            let s32 = s.alloc(4 * sc.elems, DType::Fp32, "_to_copy");
            s.free(Some(mu));
            let scale = if ax {
                let lg = s.alloc(4 * sc.elems, DType::Fp32, "log2");
                let fl = s.alloc(4 * sc.elems, DType::Fp32, "floor");
                s.free(Some(lg));
                let ex = s.alloc(4 * sc.elems, DType::Fp32, "exp2");
                for h in [fl, s32, c64, am] {
                    s.free(Some(h));
                }
                ex
            } else {
                s.free(Some(c64));
                s.free(Some(am));
                s32
            };
            let c32 = (d != DType::Fp32).then(|| s.alloc(4 * elems, DType::Fp32, "_to_copy"));
            let m = s.alloc(4 * elems, DType::Fp32, "mul");
            s.free(c32);
            let cl2 = s.alloc(4 * elems, DType::Fp32, "clamp");
            let q = s.alloc(elems, DType::Fp8, "_to_copy");
            s.free(Some(cl2));
            s.free(Some(m));
            [Some(q), Some(scale)]
        };
        let scaled_mm = |s: &mut Script, a_rows: u128, a: Scale, b_cols: u128, b: Scale, out: u128| -> u8 {
            let (mut a, mut b) = (a, b);
            let mut extra = None;
            if !a.axis && b.axis {
                extra = Some(s.alloc(4 * a_rows, DType::Fp32, "repeat"));
                a = Scale { elems: a_rows, axis: true };
            } else if a.axis && !b.axis {
                extra = Some(s.alloc(4 * b_cols, DType::Fp32, "repeat"));
                b = Scale { elems: b_cols, axis: true };
            }
            let ra = s.alloc(4 * a.elems, DType::Fp32, "reciprocal");
            let rb = s.alloc(4 * b.elems, DType::Fp32, "reciprocal");
            let o = if a.axis && b.axis {
                // rowwise, use_fast_accum=False: an fp32 post-scale of the output's size.
                let post = s.alloc(4 * out, DType::Fp32, "mul");
                let o1 = s.alloc(4, DType::Fp32, "new_ones");
                s.free(Some(ra));
                let o2 = s.alloc(4, DType::Fp32, "new_ones");
                s.free(Some(rb));
                let o = s.alloc(2 * out, DType::Bf16, "_scaled_mm");
                // fp32 / fp16 training: `output.to(orig_dtype)` (torchao 0.18
                // `addmm_float8_unwrapped`: rowwise `_scaled_mm` has no fp32 output), the
                // gradient in grad_output's dtype, the bf16 output freed on return.
                let wide = (gd != DType::Bf16).then(|| s.alloc(gd.bytes() as u128 * out, gd, "_to_copy"));
                s.free(Some(o1));
                s.free(Some(o2));
                s.free(Some(post));
                match wide {
                    Some(c) => {
                        s.free(Some(o));
                        c
                    }
                    None => o,
                }
            } else {
                // Tensorwise: `_scaled_mm` writes the gradient in grad_output's original dtype
                // (torchao 0.18 `float8_ops.py` `addmm_float8_unwrapped`: `out_dtype =
                // a._orig_dtype`, fp32 in fp32 training — only the rowwise path falls back to a
                // bf16 output; measured: the compiled backward's `_scaled_mm(…,
                // out_dtype=torch.float32)` of torchtitan's fp32 float8 blocks).
                let o = if gd == DType::Fp32 {
                    s.alloc(4 * out, DType::Fp32, "_scaled_mm")
                } else {
                    s.alloc(2 * out, DType::Bf16, "_scaled_mm")
                };
                s.free(Some(ra));
                s.free(Some(rb));
                o
            };
            s.free(extra);
            o
        };
        let (rx, rw) = (self.rg(x), self.rg(w));
        let mut keep: Vec<Option<u8>> = Vec::new();
        let mut gi = None;
        let mut gw = None;
        // grad_input = grad_output @ weight.
        let [gq, gs] = cast(&mut s, t * n, gd, Scale::of(ax, t));
        keep.extend([gq, gs]);
        if rx || rw {
            let wgi = Scale::of(ax, k);
            if !f.allgathered {
                keep.extend(cast(&mut s, k * n, wd, wgi));
            }
            let wc = s.alloc(k * n, DType::Fp8, "contiguous");
            let o = scaled_mm(&mut s, t, Scale::of(ax, t), k, wgi, t * k);
            s.free(Some(wc));
            gi = Some(o);
        }
        // grad_weight = grad_outputᵀ @ input.
        if rw {
            // Compiled, tensorwise: the second cast of grad_output is the first one (the same
            // e5m2 cast of the same tensor, one value after the graph's CSE: torchtitan's
            // compiled blocks transpose and copy the grad_input cast's FP8 tensor for
            // grad_weight, `torchtitan-llama3-compile-fp8.json`'s backward graphs).
            if ax || !self.compiled_block() {
                keep.extend(cast(&mut s, t * n, gd, Scale::of(ax, n)));
            }
            keep.extend(cast(&mut s, t * k, xd, Scale::of(ax, k)));
            let ac = s.alloc(n * t, DType::Fp8, "contiguous");
            let bc = s.alloc(k * t, DType::Fp8, "contiguous");
            let o = scaled_mm(&mut s, n, Scale::of(ax, n), k, Scale::of(ax, k), n * k);
            s.free(Some(ac));
            s.free(Some(bc));
            gw = Some(o);
        }
        for h in keep {
            s.free(h);
        }
        if let (Some(o), true) = (gi, rx) {
            s.b.push(B::Grad { input: 0, temp: o });
        } else {
            s.free(gi);
        }
        if let Some(o) = gw {
            s.b.push(B::Grad { input: 1, temp: o });
        }
        s.b
    }

    /// Whether this float8 linear runs in torchtitan's compiled, fully checkpointed block
    /// (tensorwise or rowwise, without float8 all-gather): its backward is
    /// [`Builder::compiled_full_backward`], not torchao's eager casts, and its node keeps what
    /// the compiled re-run hands to it (rowwise: refused by `validate.rs` — Llama 3's bf16
    /// record 0.83 % under, FINDINGS §15.1 "Float8").
    fn compiled_full(&self, f: Fp8Linear) -> bool {
        use crate::estimator::config::{Framework, Recompute};
        self.compiled_block()
            && self.c.cfg.framework == Framework::Torchtitan
            && self.c.cfg.recompute == Recompute::Full
            && matches!(f.recipe, Fp8::TorchaoTensorwise | Fp8::TorchaoRowwise)
            && !f.allgathered
    }

    /// Whether this float8 linear is rowwise in torchtitan's compiled block (without float8
    /// all-gather), whatever the checkpointing: its backward is Inductor's, every cast of
    /// `matmul_with_hp_or_float8_args.backward` fused into the kernels around its `_scaled_mm`s
    /// ([`Builder::compiled_full_backward`]; torchao 0.18 `float8_linear.py`
    /// `matmul_with_hp_or_float8_args`, `float8_scaling_utils.py` `hp_tensor_to_float8_dynamic`
    /// with `config.py`'s `rowwise` recipe: axiswise scales, `round_scales_to_power_of_2`). The
    /// eager program's fp32 and fp64 temporaries and the fp32 post-scale of each output
    /// (`addmm_float8_unwrapped`, `use_fast_accum=False`) put the bf16 `+op` records 4.9 % over;
    /// measured: `TORCH_COMPILE_DEBUG=1` `output_code.py` of the blocks' backward, `layer+op` and
    /// `layer+full`, FINDINGS §15.1 "Float8"). Tensorwise keeps the eager casts outside full
    /// checkpointing (measured within 0.35 % so).
    fn compiled_rowwise(&self, f: Fp8Linear) -> bool {
        use crate::estimator::config::Framework;
        self.compiled_block() && self.c.cfg.framework == Framework::Torchtitan && f.recipe == Fp8::TorchaoRowwise && !f.allgathered
    }

    /// Whether the program's float8 linears take the compiled fully checkpointed backward
    /// ([`Builder::compiled_full_backward`]; the partition keeps the uncheckpointed cut's values
    /// around them: `compile.rs`).
    pub fn fp8_compiled_full(&self) -> bool {
        self.lowbit.fp8.is_some_and(|f| self.compiled_full(f))
    }

    /// Whether this float8 linear's weight arrives all-gathered in float8 (FSDP2's
    /// `enable_fsdp_float8_all_gather`) into torchtitan's compiled block without checkpointing,
    /// in the feed-forward (w1, w2, w3): the block then keeps, for grad_input's `_scaled_mm`
    /// (`grad_output @ W`, which wants `W` column-major), an e4m3 copy of the gathered weight
    /// transposed — `k·n` bytes, made in forward (`clone` of the permuted `_data`) and saved.
    /// The attention's gathered weights are saved as the parameters themselves (FSDP2's
    /// unsharded storages, freed after forward and gathered again) and transposed in backward.
    /// Measured on 2 CPU ranks (`validation/measure_titan_fsdp_fp8.py`,
    /// `torchtitan-llama3-fsdp2-compile-fp8.json`: `saved` rows `float8_e4m3fn` from
    /// `clone/permute`, 3 a layer; none under full or op checkpointing, where the re-run makes
    /// them); why the partitioner keeps these three and not the attention's four is not
    /// established (FINDINGS §15.1, "FSDP2 float8 all-gather, compiled").
    fn gathered_transpose_kept(&self, f: Fp8Linear) -> bool {
        use crate::estimator::config::{Framework, Recompute};
        f.allgathered
            && self.compiled_block()
            && self.c.cfg.framework == Framework::Torchtitan
            && self.c.cfg.recompute == Recompute::None
            && (self.is_ffn_out()
                || self.module.ends_with("gate_proj")
                || self.module.ends_with("up_proj")
                || self.module.ends_with(".w1")
                || self.module.ends_with(".w3"))
    }

    /// The feed-forward output projection (torchtitan's `w2`, here `mlp.down_proj`).
    fn is_ffn_out(&self) -> bool {
        self.module.ends_with("down_proj") || self.module.ends_with(".w2")
    }

    /// The attention output projection (torchtitan's `attention.wo`), fed by SDPA.
    fn is_attn_out(&self) -> bool {
        self.module.ends_with(".wo") || self.module.ends_with("o_proj")
    }

    /// The backward of a float8 linear (`y = x·Wᵀ`, `x` `[t, k]`, `W` `[n, k]`) in torchtitan's
    /// compiled block — tensorwise fully checkpointed, rowwise under any checkpointing
    /// ([`Builder::compiled_rowwise`]): what Inductor's compiled backward allocates (torch 2.15,
    /// torchao 0.18; `TORCH_COMPILE_DEBUG=1` `output_code.py` of the block's backward,
    /// `measure_titan_compile.py --fp8 tensorwise|rowwise --only …`; FINDINGS §15.1 "Full AC,
    /// compiled" and "Float8"). Every cast is one fused kernel writing only its FP8 output (no
    /// `abs`, fp32 or fp64 temporaries); the scales (4 B tensorwise, a `[rows]` fp32 and bf16
    /// amax rowwise) are not counted (48–64 B a block tensorwise, about 8 KB of Llama 3's b2 s64
    /// rowwise block).
    ///
    /// * grad_output cast to FP8 in both layouts, `2·t·n` B (the transposed one for grad_weight;
    ///   `w2`'s is the block tangent's, which the compiled backward holds on to `wo`'s
    ///   grad_weight: here freed with `w2`'s script and cast again by `wo`'s, the same bytes,
    ///   `t·n` less between the two);
    /// * its weight cast to e4m3, `k·n` B, freed after grad_input: `w2`'s, and rowwise every
    ///   linear's (the grad_input cast scales `weight_hp_t` along the other axis than the
    ///   forward's, so no cast crosses from the re-run); tensorwise the others hold theirs from
    ///   the re-run (`ins[4]`); rowwise, fully checkpointed, `w2`'s backward also holds the gate
    ///   and up projections' weight casts (`2·k·n`: they read parameters alone, and Inductor
    ///   computes them in the kernels before `w2`'s grad_input — measured `buf85`, `buf102` of
    ///   Llama 3's `layer+full` record; under op SAC one of them is made later);
    /// * grad_input `_scaled_mm`, `t·k·p` (`p` grad_output's bytes: fp32 in fp32 training;
    ///   rowwise writes bf16 and casts back, `addmm_float8_unwrapped`; its post-scale fuses into
    ///   the kernel that reads it);
    /// * `w2` only: the fused `…silu_silu_backward…` kernel, which reads `w1`'s and `w3`'s
    ///   outputs and `dh` and writes SiLU(`w1`) (`t·k·p`) and, tensorwise, its sigmoid (`t·k·4`,
    ///   both materialized: the `amax` reductions split the kernel into loops; freed before
    ///   grad_weight; rowwise's kernels keep no sigmoid), FP8 `d(w1 out)` in two layouts and
    ///   `d(w3 out)` (`3·t·k`) and the e4m3 `act·w3` transposed, `w2`'s grad_weight operand
    ///   (`t·k`); others: the input's e4m3 cast (`t·k`; tensorwise `wo`'s is held from the
    ///   re-run, `ins[2]`);
    /// * grad_weight `_scaled_mm`, `n·k·p` (rowwise: bf16, cast back in fp32 training).
    #[allow(clippy::too_many_arguments)]
    fn compiled_full_backward(&self, shape: &Shape, dt: Dt, t: u128, k: u128, n: u128, w2: bool, wo: bool, rowwise: bool) -> Vec<B> {
        let gd = self.dtype(dt);
        let g_elems = self.bytes_of(shape, dt) / gd.bytes().max(1) as u128;
        let t = if g_elems > 0 && n > 0 { g_elems / n } else { t };
        let p = gd.bytes() as u128;
        let mut s = Script::new();
        let g = s.alloc(t * n, DType::Fp8, "_to_copy");
        let gt = s.alloc(t * n, DType::Fp8, "clone");
        let full = self.c.cfg.recompute == crate::estimator::config::Recompute::Full;
        let ffn_casts: Vec<u8> =
            if w2 && rowwise && full { (0..2).map(|_| s.alloc(k * n, DType::Fp8, "_to_copy")).collect() } else { Vec::new() };
        let wq = (w2 || rowwise).then(|| s.alloc(k * n, DType::Fp8, "_to_copy"));
        // A gradient `_scaled_mm` of `elems` elements: rowwise in an fp32 / fp16 model writes bf16
        // and casts it back (`wide_rowwise_output`), the bf16 buffer freed after the cast.
        let scaled_mm = |s: &mut Script, elems: u128| {
            if rowwise && p != 2 {
                let o = s.alloc(elems * 2, DType::Bf16, "_scaled_mm");
                let c = s.alloc(elems * p, gd, "_to_copy");
                s.free(Some(o));
                c
            } else {
                s.alloc(elems * p, gd, "_scaled_mm")
            }
        };
        let gi = scaled_mm(&mut s, t * k);
        s.free(wq);
        s.free(Some(g));
        let mut grads_fp8 = Vec::new();
        let xq = if w2 {
            let silu = s.alloc(t * k * p, gd, "silu");
            let sig = (!rowwise).then(|| s.alloc(t * k * 4, DType::Fp32, "sigmoid"));
            for _ in 0..3 {
                grads_fp8.push(s.alloc(t * k, DType::Fp8, "silu_backward"));
            }
            let xq = s.alloc(t * k, DType::Fp8, "silu_backward");
            s.free(Some(silu));
            s.free(sig);
            Some(xq)
        } else if wo && !rowwise {
            None
        } else {
            Some(s.alloc(t * k, DType::Fp8, "_to_copy"))
        };
        let gw = scaled_mm(&mut s, n * k);
        s.free(xq);
        s.free(Some(gt));
        for h in grads_fp8.into_iter().chain(ffn_casts) {
            s.free(Some(h));
        }
        s.b.push(B::Grad { input: 0, temp: gi });
        s.b.push(B::Grad { input: 1, temp: gw });
        s.b
    }

    /// Whether the decoder layer is a compiled region (`compile_regions = layer`, and
    /// torchtitan's `block`).
    fn compiled_block(&self) -> bool {
        use crate::estimator::config::{CompileRegions, Framework};
        let cfg = self.c.cfg;
        cfg.compile
            && (cfg.compile_regions == CompileRegions::Layer
                || (cfg.compile_regions == CompileRegions::Block && cfg.framework == Framework::Torchtitan))
    }

    // ------------------------------------------------------------------ Transformer Engine

    /// Bytes of a quantized `[m, k]` tensor with the usages TE gives it: FP8 data (1 B/element)
    /// and, where non-TN GEMMs are unsupported, its transpose; MXFP8 both layouts with their
    /// E8M0 1×32 scales padded to 128×4 (`mxfp8_tensor.py get_scale_shape`).
    pub fn te_quantized_bytes(recipe: Fp8, transpose: bool, m: u128, k: u128, both: bool) -> u128 {
        match recipe {
            Fp8::TeMxfp8 => {
                let row = m * k + m.div_ceil(128) * 128 * (k.div_ceil(32).div_ceil(4) * 4);
                let col = m * k + (m.div_ceil(32).div_ceil(4) * 4) * (k.div_ceil(128) * 128);
                if both {
                    row + col
                } else {
                    row
                }
            }
            _ => {
                let data = if both && transpose { 2 * m * k } else { m * k };
                data + 4
            }
        }
    }

    /// Transformer Engine `te.Linear` (`module/linear.py _linear_forward_impl`): the input
    /// quantized row- and column-wise, the weight quantized every forward (`base.py
    /// quantize_weight`, unless `fp8_model_init`), the GEMM into a 16-bit output; the row-wise
    /// input data is dropped after the GEMM, the column-wise input and the FP8 weight are saved.
    /// Backward (`_linear_backward`): grad_output quantized both ways, dgrad and wgrad in 16
    /// bits; the saved FP8 tensors go when the node returns.
    pub fn te_linear(&mut self, x: Tid, w: Tid, bias: Option<Tid>, shape: Shape, f: Fp8Linear) -> Tid {
        let (rx, rw) = (self.rg(x), self.rg(w));
        let t = self.tokens();
        let k = (self.numel(x) / t).max(1);
        let n = (self.numel(w) / k).max(1);
        let tr = f.te_transpose;
        let x_row = self.plain("quantize", &[x], flat(Builder::te_quantized_bytes(f.recipe, tr, t, k, false)), Dt::Fp8);
        // The column-wise input wgrad reads: its own copy (a transpose, MXFP8's column-wise
        // layout) or, where GEMMs read row-wise data in any layout, the row-wise data kept.
        let col = self.te_col_bytes(f.recipe, tr, t, k);
        let x_col = match (rw, col) {
            (false, _) => None,
            (true, 0) => Some(x_row),
            (true, c) => Some(self.plain("quantize", &[x], flat(c), Dt::Fp8)),
        };
        let mut ins = vec![x, w, x_row];
        let w8 = if f.te_model_init {
            None
        } else {
            let wb = Builder::te_quantized_bytes(f.recipe, tr, n, k, true);
            let w8 = self.plain("quantize", &[w], flat(wb), Dt::Fp8);
            ins.push(w8);
            Some(w8)
        };
        if let Some(c) = x_col.filter(|&c| c != x_row) {
            ins.push(c);
        }
        let dt = self.t(x).dt;
        let out = self.out(shape, dt, rx || rw);
        let gd = self.dtype(dt);
        let mut s = Script::new();
        if rx || rw {
            let gq = s.alloc(Builder::te_quantized_bytes(f.recipe, tr, t, n, true), DType::Fp8, "quantize");
            let wq = if f.te_recompute_weight && !f.te_model_init {
                Some(s.alloc(Builder::te_quantized_bytes(f.recipe, tr, n, k, true), DType::Fp8, "quantize"))
            } else {
                None
            };
            let gi = rx.then(|| s.alloc(t * k * gd.bytes() as u128, gd, "general_gemm"));
            s.free(wq);
            let gw = rw.then(|| s.alloc(self.grad_bytes(w), self.t(w).dtype, "general_gemm"));
            s.free(Some(gq));
            if let Some(o) = gi {
                s.b.push(B::Grad { input: 0, temp: o });
            }
            if let Some(o) = gw {
                s.b.push(B::Grad { input: 1, temp: o });
            }
        }
        // Saved: the column-wise input (index of x_col in `ins`) and the FP8 weight unless it is
        // re-quantized in backward.
        let mut saved: Vec<S> = Vec::new();
        if rx || rw {
            if let Some(c) = x_col {
                let i = ins.iter().position(|&t| t == c).unwrap_or(2);
                saved.push(S::In(i as u8));
            }
            if w8.is_some() && !f.te_recompute_weight {
                saved.push(S::In(3));
            }
        }
        let y = self.op("general_gemm", "_LinearBackward", &ins, &[out], &saved, &s.b)[0];
        match bias {
            Some(b) => self.add(y, b),
            None => y,
        }
    }

    /// The column-wise part of a quantized `[m, k]` input: its transpose (Hopper) or, where
    /// GEMMs read the row-wise data in any layout (Blackwell), the row-wise data kept; MXFP8's
    /// column-wise copy with its scales.
    fn te_col_bytes(&self, recipe: Fp8, transpose: bool, m: u128, k: u128) -> u128 {
        match recipe {
            Fp8::TeMxfp8 => m * k + (m.div_ceil(32).div_ceil(4) * 4) * (k.div_ceil(128) * 128),
            _ if transpose => m * k + 4,
            _ => 0,
        }
    }

    // ------------------------------------------------------------------ 4-bit bases

    /// bitsandbytes 0.50.2 `Linear4bit.forward` (`nn/modules.py`) → `matmul_4bit` →
    /// `MatMul4Bit` → `gemm_4bit`'s dequantizing path (`backends/default/ops.py`, on CUDA
    /// `_dequant_linear_fallback`): the input cast to the compute dtype (bf16), the nested
    /// absmax dequantized (`dequantize_blockwise`, `+ offset`), the weight dequantized to
    /// `[N, K]` bf16, `linear`, then the output cast back to the input's dtype. Nothing is saved;
    /// the backward dequantizes again and makes grad_input only. Before 0.43.2 (`keeps_input`,
    /// bitsandbytes 0.42.0 `autograd/_functions.py` `MatMul4Bit.forward`: `ctx.tensors = (A, B)`
    /// when `any(ctx.needs_input_grad[:2])`) the compute-dtype input is kept too, unread.
    /// Under Lightning's plugin (`fp16_state`, `qlora_lightning`) the quant state is fp16
    /// (`_Linear4bit.quantize`: `weight.contiguous().to(device, dtype=torch.half)`), so
    /// bitsandbytes 0.42.0's `F.dequantize_4bit(B, quant_state).to(A.dtype)` writes the
    /// weight in fp16 (2·n B) and copies it to bf16 (2·n B) before the fp16 one goes: 4·n B at
    /// once, in forward and again in backward.
    pub fn linear4bit(&mut self, x: Tid, w: Tid, bias: Option<Tid>, shape: Shape, q: Quant4) -> Tid {
        let in_dt = self.t(x).dt;
        let xin = self.to_copy(x, Dt::Bf16);
        let n_w = self.numel(w);
        let nb = n_w.div_ceil(NF4_BLOCK);
        let absmax = if q.double_quant {
            let ab = self.plain("dequantize_blockwise", &[w], flat(nb), Dt::F32);
            Some(self.plain("add", &[ab], flat(nb), Dt::F32))
        } else {
            None
        };
        let wd = if q.fp16_state {
            let w16 = self.plain("dequantize_4bit", &[w], flat(n_w), Dt::F16);
            self.plain("_to_copy", &[w16], flat(n_w), Dt::Bf16)
        } else {
            self.plain("dequantize_4bit", &[w], flat(n_w), Dt::Bf16)
        };
        let b16 = bias.map(|b| self.to_copy(b, Dt::Bf16));
        let mut ins = vec![xin, w, wd];
        ins.extend(absmax);
        ins.extend(b16);
        let rx = self.rg(xin);
        let out = self.out(shape, Dt::Bf16, rx);
        let mut s = Script::new();
        if rx {
            let ab = q.double_quant.then(|| s.alloc(4 * nb, DType::Fp32, "dequantize_blockwise"));
            let wd = if q.fp16_state {
                let w16 = s.alloc(2 * n_w, DType::Fp16, "dequantize_4bit");
                let wd = s.alloc(2 * n_w, DType::Bf16, "_to_copy");
                s.free(Some(w16));
                wd
            } else {
                s.alloc(2 * n_w, DType::Bf16, "dequantize_4bit")
            };
            s.free(ab);
            let gi = s.alloc(self.bytes(xin), DType::Bf16, "mm");
            s.free(Some(wd));
            s.b.push(B::Grad { input: 0, temp: gi });
        }
        let keeps: &[S] = if rx && q.keeps_input { &[S::In(0)] } else { &[] };
        let y = self.op("linear", "MatMul4BitBackward", &ins, &[out], keeps, &s.b)[0];
        let back = self.to_copy(y, in_dt);
        if xin != x {
            self.hold(xin);
        }
        back
    }

    /// torchao 0.18's `linear_nf4` (`quantization/quantize_/workflows/nf4/nf4_tensor.py
    /// LinearNF4`, torchtune 0.6.1's base of `LoRALinear(quantize_base=True)` and
    /// `FrozenNF4Linear`): forward `F.linear(x, weight.to(x.dtype))`, saving only the `NF4Tensor`
    /// (a parameter: nothing new); backward `grad_output @ weight.to(grad_output.dtype)`, the same
    /// dequantization again. `get_original_weight` on n elements in the weight's dtype e:
    /// `quantized_data >> 4` (uint8 n/2, freed) `.to(long)` (8·n/2), the same for `& 0b1111`,
    /// both looked up in the table (e·n/2 each), the scalers dequantized (`/ factor`, `+ mean`:
    /// e·n/64 twice, the first freed), each half scaled by `repeated.flatten()` (an e·n/2 copy,
    /// freed after the product e·n/2), then `torch.stack` (e·n) while every local is still alive:
    /// 8n + 3e·n + e·n/64 (14n + n/32 B in bf16) at the stack; the result (e·n) lives through the
    /// GEMM. Measured exact: tests/fixtures/pytorch/torchao_nf4. Compiled ([`Builder::nf4_fused`]):
    /// the dequantization is one kernel writing the weight (e·n); the weight is kept for
    /// backward ([`Builder::nf4_keeps_weight`]) or, for the down projection, written again there.
    pub fn linear_nf4(&mut self, x: Tid, w: Tid, bias: Option<Tid>, shape: Shape, lin: Linear) -> Tid {
        let wd = self.nf4_dequantize(w);
        let rx = self.rg(x);
        let out = self.out(shape, self.t(x).dt, rx);
        let mut s = Script::new();
        let keeps_weight = rx && self.nf4_keeps_weight(lin);
        if rx {
            // The input's gradient `grad_output @ weight`: the weight kept from forward, or
            // dequantized again here (one fused kernel compiled, `get_original_weight`'s
            // temporaries eager), freed once the matmul has run.
            let full = if keeps_weight { None } else { Some(self.nf4_backward_weight(&mut s, self.numel(w))) };
            let gi = s.alloc(self.bytes(x), self.t(x).dtype, "matmul");
            s.free(full);
            s.b.push(B::Grad { input: 0, temp: gi });
        }
        // `ctx.save_for_backward(weight)`: the `NF4Tensor` (a parameter, no new bytes) goes
        // through a checkpoint's pack hook like any saved tensor, so under `recompute = full`
        // the backward of a layer's last NF4 linear (a `FrozenNF4Linear` down projection) is
        // what unpacks first and re-runs the layer, before its own dequantization
        // (tests/fixtures/pytorch/frameworks/torchtune-llama3-qlora.json: peak at w2's `stack`
        // in `LinearNF4Backward`, the layer's re-run alive).
        let saved: &[S] = if keeps_weight {
            &[S::In(2)]
        } else if rx {
            &[S::In(1)]
        } else {
            &[]
        };
        let y = self.op("linear", "LinearNF4Backward", &[x, w, wd], &[out], saved, &s.b)[0];
        match bias {
            Some(b) => self.add(y, b),
            None => y,
        }
    }

    /// `get_original_weight` again in [`Builder::linear_nf4`]'s backward (`n` elements), into
    /// script `s`: the dequantized weight's temporary (its locals freed, the weight left).
    fn nf4_backward_weight(&self, s: &mut Script, n: u128) -> u8 {
        let e = self.dtype(Dt::Model).bytes() as u128;
        let dt = self.dtype(Dt::Model);
        if self.nf4_fused() {
            return s.alloc(e * n, dt, "dequantize (fused)");
        }
        let hi = s.alloc(n / 2, DType::Fp8, "__rshift__");
        let first = s.alloc(4 * n, DType::I64, "_to_copy");
        s.free(Some(hi));
        let lo = s.alloc(n / 2, DType::Fp8, "__and__");
        let second = s.alloc(4 * n, DType::I64, "_to_copy");
        s.free(Some(lo));
        let d1 = s.alloc(e * n / 2, dt, "index");
        let d2 = s.alloc(e * n / 2, dt, "index");
        let sc0 = s.alloc(e * (n / 64), dt, "div");
        let sc = s.alloc(e * (n / 64), dt, "add");
        s.free(Some(sc0));
        let r1 = s.alloc(e * n / 2, dt, "clone");
        let s1 = s.alloc(e * n / 2, dt, "mul");
        s.free(Some(r1));
        let r2 = s.alloc(e * n / 2, dt, "clone");
        let s2 = s.alloc(e * n / 2, dt, "mul");
        s.free(Some(r2));
        let full = s.alloc(e * n, dt, "stack");
        for t in [first, second, d1, d2, sc, s1, s2] {
            s.free(Some(t));
        }
        full
    }

    /// Whether the layer is compiled (`compile = true`, `compile_regions = layer`: torchtune's
    /// `training.compile_model` compiles each decoder layer): dynamo traces `LinearNF4` (an
    /// `autograd.Function`) and the `NF4Tensor` (a traceable wrapper subclass:
    /// `__tensor_flatten__`), so Inductor fuses `get_original_weight`'s pointwise ops and
    /// lookups into one kernel writing the dequantized weight that the matmul reads — in
    /// backward as in forward, where `compile.rs` already drops the values fused away.
    /// Measured (torch 2.15, torchtune 0.6.1, torchao 0.18, Inductor on the CPU:
    /// `tests/fixtures/pytorch/torchao_nf4/compile.json`, validation/measure_torchao_nf4.py
    /// --compile): no allocation of the compiled step has the size of the int64 codes (8·n/2,
    /// 131,072 B for a 256×128 weight; eager makes two per dequantization), in forward or in
    /// backward, with checkpointing or without. What eager does not do: the layer keeps most
    /// dequantized weights for backward ([`Builder::nf4_keeps_weight`]).
    fn nf4_fused(&self) -> bool {
        let cfg = self.c.cfg;
        cfg.compile && cfg.compile_regions == crate::estimator::config::CompileRegions::Layer
    }

    /// Whether the compiled layer keeps this linear's dequantized weight (e·n) from forward to
    /// backward rather than dequantizing it again there: the joint graph's CSE makes backward's
    /// `weight.to(dtype)` the forward's value, which the backward's matmul reads
    /// (`is_materialized_backwards`: not recomputed) — for every NF4 linear whose input needs
    /// a gradient but the layer's last, `w2` (down), whose dequantization the partitioner
    /// recomputes from the codes in backward. Measured (torch 2.15, torchao 0.18,
    /// `tests/fixtures/pytorch/torchao_nf4/compile.json`): the forward graphs save the `cat`
    /// (`stack`) of q, k, v, o, w1, w3 (layer 0: o, w1, w3 — its input needs no gradient) and
    /// recompute w2's `get_original_weight` in backward; why w2 differs is not traced.
    fn nf4_keeps_weight(&self, lin: Linear) -> bool {
        self.nf4_fused() && lin != Linear::Down
    }

    /// `NF4Tensor.get_original_weight` in forward (see [`Builder::linear_nf4`]): the weight in
    /// the model's dtype, its temporaries freed when it returns.
    fn nf4_dequantize(&mut self, w: Tid) -> Tid {
        let n = self.numel(w);
        let hi = self.plain("__rshift__", &[w], flat(n / 2), Dt::Fp8);
        let first = self.plain("_to_copy", &[hi], flat(n / 2), Dt::I64);
        let lo = self.plain("__and__", &[w], flat(n / 2), Dt::Fp8);
        let second = self.plain("_to_copy", &[lo], flat(n / 2), Dt::I64);
        let d1 = self.plain("index", &[first], flat(n / 2), Dt::Model);
        let d2 = self.plain("index", &[second], flat(n / 2), Dt::Model);
        let sc0 = self.plain("div", &[w], flat(n / 64), Dt::Model);
        let sc = self.plain("add", &[sc0], flat(n / 64), Dt::Model);
        let r1 = self.plain("clone", &[sc], flat(n / 2), Dt::Model);
        let s1 = self.plain("mul", &[d1, r1], flat(n / 2), Dt::Model);
        let r2 = self.plain("clone", &[sc], flat(n / 2), Dt::Model);
        let s2 = self.plain("mul", &[d2, r2], flat(n / 2), Dt::Model);
        self.plain("stack", &[s1, s2, first, second, d1, d2, sc], flat(n), Dt::Model)
    }

    /// gptqmodel's `TorchQuantLinear.forward` (`qlinear/torch.py`, the training path peft's
    /// GPTQ LoRA wraps): `dequantize_weight()` into an fp16 `[K, N]` weight (compiled: one
    /// kernel), `.to(x.dtype)`, then `torch.matmul(x, weights)`, whose node saves the
    /// dequantized weight until backward.
    pub fn gptq_linear(&mut self, x: Tid, w: Tid, shape: Shape) -> Tid {
        let n_w = self.numel(w);
        let w16 = self.plain("dequantize_weight", &[w], flat(n_w), Dt::F16);
        let xd = self.t(x).dt;
        let wx = if self.dtype(xd) == DType::Fp16 { w16 } else { self.plain("_to_copy", &[w16], flat(n_w), xd) };
        let rx = self.rg(x);
        let out = self.out(shape, xd, rx);
        let bw: &[B] =
            if rx { &[B::Alloc { bytes: self.bytes(x), dtype: self.t(x).dtype, op: "mm" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
        let saved: &[S] = if rx { &[S::In(1)] } else { &[] };
        self.op("mm", "MmBackward0", &[x, wx], &[out], saved, bw)[0]
    }
}

/// Whether Transformer Engine keeps transposed FP8 copies on the configuration's GPU: where
/// non-TN FP8 GEMMs are unsupported (`utils.py is_non_tn_fp8_gemm_supported`: compute capability
/// 10.0–11.x and ≥ 13.0 support them), i.e. Hopper, Ada and sm120; a custom card is taken for
/// a Hopper.
pub fn te_transposes(cfg: &Config) -> bool {
    let cc = crate::estimator::gpu::gpu(&cfg.gpu).and_then(|g| g.compute_capability);
    !matches!(cc, Some((10..=11, _)) | Some((13.., _)))
}

/// How `cfg`'s projections run.
pub fn of(cfg: &Config) -> LowBit {
    let recipe = cfg.fp8_recipe();
    let fp8 = (recipe != Fp8::None).then(|| Fp8Linear {
        recipe,
        allgathered: cfg.fp8_allgather && recipe == Fp8::TorchaoTensorwise && cfg.zero.stage() == 3,
        te_transpose: te_transposes(cfg),
        te_recompute_weight: cfg.fp8_recompute_weight,
        te_model_init: cfg.fp8_model_init && recipe.te(),
    });
    let quant = (cfg.finetune == Finetune::Qlora).then_some(Quant4 {
        kind: cfg.qlora_quant,
        double_quant: cfg.qlora_double_quant,
        keeps_input: cfg.bnb_keeps_input,
        fp16_state: cfg.qlora_lightning && cfg.qlora_quant == QloraQuant::Nf4,
    });
    LowBit { fp8, quant }
}

/// FP8 GEMMs need both dims multiples of 16 (torchao's `_auto_filter_for_recipe`, TE's
/// alignment assertion): other linears stay in 16 bits.
fn fp8_aligned(k: u128, n: u128) -> bool {
    k.is_multiple_of(16) && n.is_multiple_of(16)
}

impl<'a> Builder<'a> {
    /// The base GEMM of a projection: `nn.Linear`, or the FP8 recipe's linear.
    pub fn base_linear(&mut self, x: Tid, w: Tid, bias: Option<Tid>, shape: Shape) -> Tid {
        if let Some(f) = self.lowbit.fp8 {
            let k = (self.numel(x) / self.tokens()).max(1);
            let n = self.numel(w) / k;
            if fp8_aligned(k, n) {
                if f.recipe.torchao() {
                    return self.torchao_linear(x, w, bias, shape, f);
                }
                return self.te_linear(x, w, bias, shape, f);
            }
        }
        self.linear(x, w, bias, shape)
    }

    /// A LoRA adapter pair on input `xa` (the projection's input, or its copy in the adapters'
    /// dtype), sized by `x`: `lora_B(lora_A(xa))` into `shape`.
    pub fn lora_branch(&mut self, x: Tid, xa: Tid, shape: Shape, l: Lora) -> Tid {
        let tokens = self.tokens();
        let n_in = self.numel(x) / tokens;
        let n_out = self.bytes_of(&shape, Dt::Model) / self.dtype(Dt::Model).bytes().max(1) as u128 / tokens;
        let r = l.rank as u128;
        let a_w = self.param(r * n_in * l.weight.bytes() as u128, l.weight, r * n_in * l.grad_elem as u128);
        let b_w = self.param(n_out * r * l.weight.bytes() as u128, l.weight, n_out * r * l.grad_elem as u128);
        let module = self.module;
        let part = self.part;
        let xa = if l.dropout { self.lora_dropout(xa) } else { xa };
        self.module = "lora_A";
        let a = self.linear(xa, a_w, None, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::X(super::ir::X::R)], Split::None));
        self.module = "lora_B";
        self.part = crate::estimator::part::Part::Lora;
        let bb = self.linear(a, b_w, None, shape);
        self.part = part;
        self.module = module;
        bb
    }

    /// The adapter's own dropout on its input (`lora_dropout` = p > 0), before `lora_A`: peft
    /// 0.21 `tuners/lora/layer.py` `Linear.forward` runs `lora_B(lora_A(dropout(x)))` with one
    /// `nn.Dropout(p)` per adapted module (`bnb.py` / `gptq.py` the same, after the cast to the
    /// adapters' dtype); torchtune 0.6 `modules/peft/lora.py LoRALinear.forward` and litgpt 0.5
    /// `lora.py LoRALinear.forward` likewise. So every adapter makes its own dropped copy of its
    /// input — `b·s·n_in` elements in the input's (adapters') dtype, kept by `lora_A` in place of
    /// the input it would share with the base layer and its siblings — and the dropout keeps
    /// its mask: CUDA `native_dropout`, a bool `b·s·n_in` (1 B each); CPU `at::dropout`
    /// (not "fused-kernel acceptable"), the noise `bernoulli_(1 - p) / (1 - p)` in the input's
    /// dtype, kept by the multiplication (measured: tests/fixtures/pytorch/lora, p = 0.05).
    /// Per adapted linear: `b·s·n_in·(e + 1)` bytes on CUDA, `2·b·s·n_in·e` on the CPU
    /// (e = the input's element size), less the undropped input where nothing else keeps it
    /// (measured: llama-gqa fp32, b2 s64, all seven linears, +737,280 B saved at p = 0.05).
    /// Attributed to the LoRA row.
    fn lora_dropout(&mut self, x: Tid) -> Tid {
        let (module, part) = (self.module, self.part);
        self.module = "lora_dropout";
        self.part = crate::estimator::part::Part::Lora;
        let d = self.dropout_op(x);
        self.module = module;
        self.part = part;
        d
    }

    /// A projection on QLoRA's quantized base with its adapter as peft 0.21 runs it
    /// (`tuners/lora/bnb.py Linear4bit.forward`: the base's result cloned — "as per Tim Dettmers,
    /// for 4bit, we need to defensively clone here" — then, outside autocast, the input cast to
    /// the adapters' dtype, `lora_B(lora_A(x)) * scaling` cast back to the result's dtype and
    /// added; `tuners/lora/gptq.py QuantLinear.forward`: no clone, the cast before the scaling).
    /// bitsandbytes' NF4 and GPTQ bases; torchao's (torchtune's `LoRALinear`) takes
    /// [`Builder::proj`]'s adapter path on [`Builder::linear_nf4`].
    pub fn quantized_proj(
        &mut self,
        x: Tid,
        w: Tid,
        bias: Option<Tid>,
        shape: Shape,
        lin: crate::estimator::model::Linear,
        q: Quant4,
    ) -> Tid {
        let bnb = q.kind == QloraQuant::Nf4;
        let base = if bnb { self.linear4bit(x, w, bias, shape, q) } else { self.gptq_linear(x, w, shape) };
        let Some(l) = self.lora.filter(|l| super::blocks::targeted(lin, l.targets)) else { return base };
        let result = if bnb { self.copy(base, self.shape(base)) } else { base };
        let convert = !self.autocast;
        let expected = self.t(result).dt;
        let lora_dt = l.dt();
        let xa = if convert { self.to_copy(x, lora_dt) } else { x };
        let bb = self.lora_branch(x, xa, shape, l);
        let out = if bnb {
            let sc = self.mul_scalar(bb);
            if convert {
                self.to_copy(sc, expected)
            } else {
                sc
            }
        } else {
            let o = if convert { self.to_copy(bb, expected) } else { bb };
            self.mul_scalar(o)
        };
        self.add(result, out)
    }
}
