//! `torch.compile` on a region of the step program (`compile = true`, `compile_regions = layer`:
//! torchtune compiles each decoder layer and the loss): what AOTAutograd's min-cut partitioner
//! keeps for backward, as a transformation of the region's eager saved set.
//!
//! Source: torch 2.15 `torch/_functorch/partitioners.py` (`min_cut_rematerialization_partition`,
//! `should_ban_recomputation`, `get_default_op_list`) with Inductor's defaults
//! (`ban_recompute_not_in_allowlist`, `ban_recompute_materialized_backward`,
//! `ban_recompute_reductions` on, `recompute_views` off, `activation_memory_budget` 1.0); the
//! rule as validation/FINDINGS.md §15.1 states it and `validation/check_recipes.py`
//! (`check_compile`) checks it. A value the eager backward reads is saved when it is
//!
//! * (I) an input of the region (made before it: the layer's input, cos/sin, a mask, logits),
//! * (B) the output of an op outside `recomputable_ops` ([`not_recomputable`]),
//! * (M) read by a node that cannot fuse (a matmul's or SDPA's backward: [`materializing`]),
//! * (R) a reduction's output ≥ 4× smaller than its input (norm statistics),
//!
//! and any other (pointwise, view) value is recomputed from its op's inputs, which are then
//! needed in turn. Softmax and log-softmax recomputed keep their row max and sum (R: two
//! `[rows, 1]` values in the input dtype). Equal-sized cuts (rsqrt vs the mean it comes from)
//! give the same bytes, so the ledger does not depend on the min-cut's tie-break there.

use super::ir::{Builder, DType, Dt, Op, Origin, Save, Tid, B};

/// Ops whose outputs the partitioner never recomputes (not in torch 2.15's
/// `get_default_op_list().recomputable_ops`; `constant_pad_nd` measured saved: the compiled
/// loss keeps the padded labels).
fn not_recomputable(name: &str) -> bool {
    matches!(
        name,
        "mm" | "addmm"
            | "bmm"
            | "linear"
            | "_grouped_mm"
            | "_scaled_mm"
            | "embedding"
            | "topk"
            | "sort"
            | "cumsum"
            | "index"
            | "index_put_"
            | "gather"
            | "scatter_"
            | "histc"
            | "max"
            | "constant_pad_nd"
            | "nll_loss_forward"
    ) || name.starts_with("_scaled_dot_product")
        || name.starts_with("_flash_attention")
        || name.starts_with("_efficient_attention")
}

/// Ops whose backward cannot be fused into a pointwise kernel: what they read in backward is
/// materialized (`is_materialized_backwards`), so it is saved rather than recomputed.
fn materializing(name: &str) -> bool {
    matches!(name, "mm" | "addmm" | "bmm" | "linear" | "_grouped_mm" | "_scaled_mm")
        || name.starts_with("_scaled_dot_product")
        || name.starts_with("_flash_attention")
        || name.starts_with("_efficient_attention")
}

/// Softmax-like ops whose recomputation needs their row statistics (max and sum).
fn softmax_like(name: &str) -> bool {
    matches!(name, "_softmax" | "_log_softmax" | "_safe_softmax")
}

/// Where a needed value comes from, as the rule classifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Saved,
    Recomputed,
}

impl<'a> Builder<'a> {
    /// Replaces the eager saved set of ops `first..end` (one compiled region) by what the
    /// partitioner keeps (see the module doc): every save of the region is moved to its first
    /// op (a compiled region's backward is one node, `CompiledFunctionBackward`, that holds
    /// them all), and the softmax statistics a recomputation needs are made by one op
    /// appended at the region's end.
    ///
    /// Inside the region's forward only kernel outputs are allocated: what is saved, what
    /// leaves the region (`outputs`), the outputs of ops that are not recomputable and the
    /// inputs of matmuls and attention; every other value lives inside a fused Inductor kernel
    /// and its storage is not allocated (its size set to 0).
    pub fn compile_region(&mut self, first: u32, end: u32, outputs: &[Tid]) {
        if end <= first {
            return;
        }
        let (lo, hi) = (first as usize, end as usize);
        let n_t = self.p.tensors.len();
        // The op that made each storage inside the region.
        let mut producer = vec![u32::MAX; n_t];
        for (i, op) in self.p.ops[lo..hi].iter().enumerate() {
            for &t in self.p.outs(op) {
                let base = self.p.tensors[t as usize].base;
                if base == t {
                    producer[t as usize] = (lo + i) as u32;
                }
            }
        }
        // Storages a matmul / attention node saves in eager (M).
        let mut mat = vec![false; n_t];
        let mut needed: Vec<Save> = Vec::new();
        for op in &self.p.ops[lo..hi] {
            let m = materializing(op.name);
            for s in self.p.saved(op) {
                if m {
                    mat[self.p.tensors[s.t as usize].base as usize] = true;
                }
                needed.push(*s);
            }
        }
        let mut fate: Vec<Option<Fate>> = vec![None; n_t];
        let mut kept: Vec<Save> = Vec::new();
        let mut stats: Vec<(Tid, Save)> = Vec::new();
        let mut work: Vec<Save> = needed.into_iter().rev().collect();
        while let Some(s) = work.pop() {
            let base = self.p.tensors[s.t as usize].base;
            if fate[base as usize].is_some() {
                continue;
            }
            let x = &self.p.tensors[base as usize];
            if matches!(x.origin, Origin::Param { .. } | Origin::Buffer) {
                fate[base as usize] = Some(Fate::Recomputed);
                continue;
            }
            let at = producer[base as usize];
            let save = |fate: &mut Vec<Option<Fate>>, kept: &mut Vec<Save>| {
                fate[base as usize] = Some(Fate::Saved);
                kept.push(Save { t: base, part: s.part, group: s.group });
            };
            if at == u32::MAX {
                save(&mut fate, &mut kept); // (I)
                continue;
            }
            let op: &Op = &self.p.ops[at as usize];
            let ins = self.p.ins(op);
            let biggest = ins.iter().map(|&i| self.p.tensors[i as usize].bytes).max().unwrap_or(0);
            let reduction = x.bytes.saturating_mul(4) <= biggest && !op.name.starts_with("split");
            // A same-size layout copy (`clone`: the o_proj input of an SDPA output laid out
            // `[b, a, s, d]`) of a value saved anyway costs nothing to recompute: the min-cut
            // keeps the source (measured: phi3, `getitem` saved, the copy recomputed).
            let relayout = op.name == "clone" && ins.len() == 1 && {
                let src = self.p.tensors[ins[0] as usize].base as usize;
                let at = producer[src];
                self.p.tensors[src].bytes == x.bytes && at != u32::MAX && not_recomputable(self.p.ops[at as usize].name)
            };
            if !relayout && (not_recomputable(op.name) || mat[base as usize] || reduction) {
                save(&mut fate, &mut kept); // (B), (M), (R)
                continue;
            }
            fate[base as usize] = Some(Fate::Recomputed);
            if softmax_like(op.name) {
                stats.push((ins[0], s));
            }
            for &i in ins.iter().rev() {
                work.push(Save { t: i, part: s.part, group: s.group });
            }
        }
        // The softmax statistics: `[rows, 1]` max and sum in the input's dtype (fp32 here).
        for (input, s) in stats {
            let (shape, dt) = (self.shape(input).drop_last(), self.t(input).dt);
            let dt = if self.dtype(dt) == DType::Fp32 { dt } else { Dt::F32 };
            let outs = [self.out(shape, dt, false), self.out(shape, dt, false)];
            let r = self.op("amax_sum", "", &[input], &outs, &[], &[] as &[B]);
            kept.push(Save { t: r[0], part: s.part, group: s.group });
            kept.push(Save { t: r[1], part: s.part, group: s.group });
        }
        // Values fused away: made inside the region, not saved, not leaving it, not the output
        // of a non-recomputable op, not read by a matmul or attention in forward.
        let mut materialized = mat.clone();
        materialized.resize(self.p.tensors.len(), true);
        for op in &self.p.ops[lo..hi] {
            let m = materializing(op.name);
            for &t in self.p.ins(op) {
                if m {
                    materialized[self.p.tensors[t as usize].base as usize] = true;
                }
            }
        }
        for &t in outputs {
            materialized[self.p.tensors[t as usize].base as usize] = true;
        }
        for s in &kept {
            materialized[s.t as usize] = true;
        }
        for i in lo..hi {
            let keep_all = not_recomputable(self.p.ops[i].name);
            let outs: Vec<Tid> = self.p.outs(&self.p.ops[i]).to_vec();
            for t in outs {
                let x = &mut self.p.tensors[t as usize];
                if x.base == t && !keep_all && !materialized[t as usize] {
                    x.bytes = 0;
                }
            }
        }
        // Every op of the region loses its saves; its first differentiable op (whose node runs
        // last in the region's backward) takes the kept set.
        let holder = (lo..hi)
            .find(|&i| {
                let op = &self.p.ops[i];
                op.bw.1 > 0 && self.p.ins(op).iter().any(|&t| self.p.tensors[t as usize].requires_grad)
            })
            .unwrap_or(lo);
        let at = self.p.saves.len() as u32;
        let n = kept.len().min(u8::MAX as usize);
        self.p.saves.extend_from_slice(&kept[..n]);
        for op in &mut self.p.ops[lo..hi] {
            op.saved = (at, 0);
        }
        self.p.ops[holder].saved = (at, n as u8);
    }
}

impl<'a> Builder<'a> {
    /// The compiled loss's backward (`torch.compile(ForCausalLMLoss)`, ops `first..end`, whose
    /// region input is `logits`): one fused Inductor kernel writes the logits' gradient in
    /// their dtype, beside one `[T]` fp32 buffer (the per-row scale, freed after the kernel) —
    /// no fp32 `[T, V]` gradient of the log-softmax or of the fp32 copy is allocated (measured:
    /// `recipes/steps/*compile=layer*`, the allocations inside `CompiledFunctionBackward` of the
    /// loss; validation/FINDINGS.md §15.1). The interior nodes pass the gradient on unchanged.
    pub fn fuse_loss_backward(&mut self, first: u32, end: u32, logits: Tid, rows: u128) {
        let (lb, ld) = (self.bytes(logits), self.t(logits).dtype);
        for i in first as usize..end as usize {
            let op = &self.p.ops[i];
            if op.bw.1 == 0 {
                continue;
            }
            let script: Vec<B> = if op.name == "nll_loss_forward" {
                vec![
                    B::Alloc { bytes: 4 * rows, dtype: DType::Fp32, op: "compiled_loss_backward" },
                    B::Alloc { bytes: lb, dtype: ld, op: "compiled_loss_backward" },
                    B::Free(0),
                    B::Grad { input: 0, temp: 1 },
                ]
            } else {
                vec![B::Pass { input: 0, output: 0 }]
            };
            let at = self.p.script.len() as u32;
            self.p.script.extend_from_slice(&script);
            self.p.ops[i].bw = (at, script.len() as u16);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::estimator::config::{CompileRegions, Config};
    use crate::estimator::estimate;

    #[test]
    fn a_compiled_llama_keeps_less_than_its_eager_step_and_the_other_regions_are_refused_by_name() {
        let eager = Config::default();
        let compiled = Config { compile: true, ..eager.clone() };
        let (e, c) = (estimate(&eager).expect("eager"), estimate(&compiled).expect("compiled"));
        assert!(c.memory.activations < e.memory.activations, "{} vs {}", c.memory.activations, e.memory.activations);
        assert!(c.memory.peak < e.memory.peak);
        for regions in [CompileRegions::Block, CompileRegions::Model] {
            let err = estimate(&Config { compile_regions: regions, ..compiled.clone() }).err().expect("refused").to_string();
            assert!(err.contains("not modelled yet"), "{err}");
        }
    }
}
