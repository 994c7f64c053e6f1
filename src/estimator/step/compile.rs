//! `torch.compile` on a region of the step program (`compile = true`, `compile_regions = layer`:
//! torchtune compiles each decoder layer and the loss): what AOTAutograd's min-cut partitioner
//! keeps for backward, as a transformation of the region's eager saved set.
//!
//! Source: torch 2.15 `torch/_functorch/partitioners.py` (`min_cut_rematerialization_partition`,
//! `solve_min_cut`: `should_ban_recomputation`, `is_materialized_backwards`, `is_materialized`,
//! `get_node_weight`; `get_default_op_list`) with Inductor's defaults
//! (`ban_recompute_not_in_allowlist`, `ban_recompute_materialized_backward`,
//! `ban_recompute_reductions`, `ban_recompute_used_far_apart` on, `recompute_views` off,
//! `activation_memory_budget` 1.0); the rule as validation/FINDINGS.md §15.1 states it and
//! `validation/check_recipes.py` (`check_compile`) checks it. A value the eager backward reads
//! is saved when it is
//!
//! * (I) an input of the region (made before it: the layer's input, cos/sin, a mask, logits),
//! * (B) the output of an op outside `recomputable_ops` ([`not_recomputable`]: matmuls, SDPA,
//!   `topk`, `sort`, `cumsum`, the functional `index_put` of an in-place `inv[perm] = …`,
//!   Llama 4's `hidden_states.repeat(E, 1)`),
//! * (M) read by a backward node that cannot fuse ([`unfused_backward`]: a matmul's, a grouped
//!   matmul's or SDPA's backward reads its inputs; `index`'s and `gather`'s backward scatter
//!   with their indices — the MoE's `perm // K` and restoring permutation, int64); a float8
//!   linear's backward reads its 16-bit input through fusible casts only: not materialized
//!   ([`float8_linear`], [`Builder::float8_weight_scales`] for the weight scales that cross),
//! * (R) a reduction: an output more than 4× smaller than the node's tensor arguments together
//!   (norm statistics; a bool mask of an fp32 tensor, exactly 4×, is recomputed),
//! * (S) made by a recomputable op from a buffer alone and smaller than it (the min-cut weighs a
//!   buffer like any input: torchtitan's bf16 Qwen3 keeps the bf16 casts of its fp32
//!   `rope_cache`),
//!
//! and any other (pointwise, view, `index`) value is recomputed from its op's inputs, which
//! are then needed in turn — unless that costs the min-cut more than saving the value
//! ([`Builder::recompute_cost`], the partitioner's `1.1^dist` and ×2 weights: peft's adapter
//! sums, two matmul outputs for one value; measured: tests/fixtures/pytorch/lora/compile.json).
//! Whole-tensor casts of one tensor to one dtype are one value (the graph's CSE). A layer norm
//! without weight or bias whose output is saved anyway (a matmul's input: OLMo's fp32
//! `OlmoLayerNorm`) needs its output x̂ and rstd in backward, not its input and mean: the
//! decomposed backward is written in x̂. Two layer norms of one input (GPT-NeoX's parallel
//! attention and MLP) share their mean and rstd: the graph's CSE merges them. A softmax's
//! output the backward reads is weighed as the min-cut
//! weighs it ([`Builder::softmax_output_is_cheaper`]): kept (one node from the backward, ×2
//! where every forward reader fuses it) or recomputed from its input (four decomposed nodes
//! further, three for log-softmax) plus its row max and sum where those are banned as
//! reductions (more than 4 columns) — a router's fp32 probabilities feeding `topk` and
//! GPT-OSS's softmax over the top-k are kept, a bf16 router's matmul output is kept instead,
//! a loss's log-softmax is recomputed from the logits. At equal bytes the min-cut keeps the
//! value nearer the backward (`1.1^dist_from_bw`): a norm's `rsqrt`, not the mean it comes from
//! (what a checkpointed layer's re-run writes either way: [`Builder::of_reduction`]);
//! qwen2_moe's bf16 gathered routing weights, not the bf16 cast (nor the fp32 top-k values) they
//! are gathered from. In backward, Inductor's code frees each saved tensor after its last use: a kept
//! storage is released by the backward of the op that reads it last ([`Compiled`]).

use super::ir::{Builder, Compiled, DType, Dt, Op, Origin, Save, Tid, B};

/// Ops whose outputs the partitioner never recomputes (not in torch 2.15's
/// `get_default_op_list().recomputable_ops`; `constant_pad_nd` measured saved: the compiled
/// loss keeps the padded labels; `repeat` neither listed nor pointwise: Llama 4's MoE keeps its
/// `[E·b·s, h]` repeated input beside the routed input it scales, measured on
/// `llama4_text.json`'s compile records).
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
            | "index_put_"
            | "gather"
            | "scatter_"
            | "histc"
            | "max"
            | "constant_pad_nd"
            | "nll_loss_forward"
            | "repeat"
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

/// Ops whose backward reads a saved value through a node that cannot fuse, so the value is
/// materialized (`is_materialized_backwards`): the matmuls and attention ([`materializing`]),
/// and `index` / `gather`, whose backward scatters through `index_put` / `scatter_add` with the
/// saved indices (the MoE's `perm // K` token index, the restoring permutation).
fn unfused_backward(name: &str) -> bool {
    materializing(name) || matches!(name, "index" | "gather")
}

/// torchao's `Float8Linear` (`lowbit.rs` `torchao_linear`): a `_scaled_mm` whose node is
/// `matmul_with_hp_or_float8_args`'s, saving its 16-bit input first, then the weight.
fn float8_linear(op: &Op) -> bool {
    op.name == "_scaled_mm" && op.node == "matmul_with_hp_or_float8_argsBackward"
}

/// Ops that fuse with their neighbours once Inductor's decompositions have run (the
/// partitioner's `is_fusible`: in `recomputable_ops`); `nll_loss_forward` decomposes into
/// `gather`, `where` and a sum, all recomputable.
fn fusible(name: &str) -> bool {
    name == "nll_loss_forward" || !(not_recomputable(name) || materializing(name))
}

/// The partitioner's `get_node_weight` factor for a value `dist` nodes from the backward:
/// `1.1^dist` (`dist_from_bw`, at least 1), doubled when the value is not materialized in
/// forward (every reader fuses it: saving it costs a write of its own).
fn save_weight(bytes: u128, dist: i32, materialized: bool) -> f64 {
    let w = (bytes as f64 * 1.1f64.powi(dist.max(1))).trunc();
    if materialized {
        w
    } else {
        2.0 * w
    }
}

/// Nodes between a softmax's input and its output after Inductor's decomposition: `amax`,
/// `sub`, `exp`, `sum`, `div` (the output one node from the backward that reads it, the input
/// four); log-softmax's `shifted = x - amax`, `log(sum(exp(shifted)))`, `shifted - lse`: three.
fn softmax_depth(name: &str) -> i32 {
    if name == "_log_softmax" {
        3
    } else {
        4
    }
}

/// Softmax-like ops whose recomputation needs their row statistics (max and sum).
fn softmax_like(name: &str) -> bool {
    matches!(name, "_softmax" | "_log_softmax" | "_safe_softmax")
}

/// What [`Builder::recompute_cost`] reads of the partition in progress, per storage: the op
/// that made it in the region, its fate so far, whether the backward reads it directly,
/// whether a node whose backward cannot fuse saves it, whether a kernel writes it in forward.
struct Cut<'s> {
    producer: &'s [u32],
    fate: &'s [Option<Fate>],
    needed: &'s [bool],
    mat: &'s [bool],
    fwd_mat: &'s [bool],
}

/// Where a needed value comes from, as the rule classifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Saved,
    Recomputed,
}

/// The partitioner's decision for one region ([`Builder::decide`]), per storage.
struct Decision {
    producer: Vec<u32>,
    readers: Vec<Vec<u32>>,
    mat: Vec<bool>,
    fate: Vec<Option<Fate>>,
    kept: Vec<Save>,
    stats: Vec<(Tid, Save, u32)>,
    reader: Vec<u32>,
    /// The first of two whole-tensor casts of one tensor to one dtype, per the second (the
    /// graph's CSE), else `u32::MAX`.
    same: Vec<u32>,
}

impl<'a> Builder<'a> {
    /// Replaces the eager saved set of ops `first..end` (one compiled region) by what the
    /// partitioner keeps (see the module doc). The region's forward returns every kept tensor
    /// at once (its first op takes them all: [`Compiled::First`]); each is released after the
    /// backward of the op that reads it last — the op that saved it in eager or whose saved
    /// value is recomputed from it (the generated backward's `del` after a buffer's last use).
    /// The softmax statistics a recomputation needs are made by one op appended at the
    /// region's end.
    ///
    /// Inside the region's forward only kernel outputs are allocated: what is saved, what
    /// leaves the region (`outputs`), the outputs of ops that are not recomputable and the
    /// inputs of matmuls and attention; every other value lives inside a fused Inductor kernel
    /// and its storage is not allocated (its size set to 0).
    ///
    /// `ckpt`: the region is also a checkpoint region (`recompute = full | op` with
    /// `compile_regions = layer`, [`Builder::compile_checkpointed_region`]).
    pub fn compile_region(&mut self, first: u32, end: u32, outputs: &[Tid]) {
        self.partition(first, end, outputs, None, true);
    }

    /// A compiled region that is also checkpoint region `region` (torchtitan applies
    /// activation checkpointing, then compiles each block; transformers' `GradientCheckpointingLayer`
    /// wraps `forward`, so `layer.compile()` traces the checkpoint): dynamo traces
    /// `torch.utils.checkpoint` as the `tag_activation_checkpoint` higher-order op, and under
    /// AOTAutograd's trace `_CachingTorchDispatchMode` (torch 2.15 `torch/utils/checkpoint.py`)
    /// tags every node the region's ops make with the policy's decision: `PREFER_RECOMPUTE`
    /// for full checkpointing (`_always_prefer_recompute`, `torch/_higher_order_ops/wrap.py`),
    /// `MUST_SAVE` or `PREFER_RECOMPUTE` per op for selective checkpointing. The min-cut
    /// (`solve_min_cut`) then has no choice left: a `PREFER_RECOMPUTE` node gets an infinite
    /// edge to the sink (`must recompute: marked by checkpoint policy`) and is never banned
    /// (`ban_recomputation_if_allowed` returns early on `must_recompute`), a `MUST_SAVE` node is
    /// banned (`should_ban_recomputation`: "marked MUST_SAVE"), and the region's inputs are
    /// primals. So what crosses forward→backward is, walking up from every value the backward
    /// reads through the recomputed ops: the region inputs reached (the layer input, cos/sin,
    /// a mask) and the `MUST_SAVE` outputs reached — not every `MUST_SAVE` output, as eager
    /// selective checkpointing caches (a layer's last matmul, `down_proj`, feeds only the
    /// residual sum, whose backward reads nothing: not kept). Full checkpointing keeps the
    /// inputs alone.
    ///
    /// The checkpoint region's `held` and `cached` become that set; the ops keep their eager
    /// saves, which the backward's recomputation of the region makes again (the compiled
    /// backward re-runs the region's forward before its own backward), with the values Inductor
    /// fuses away not allocated, as in a compiled region's forward.
    ///
    /// `inside`: the checkpoint is traced inside the compiled region (torchtitan, transformers),
    /// so the compiled backward runs the re-run's kernels and its own together
    /// ([`super::ir::FusedBackward`]); not so when the checkpoint wraps the compiled region
    /// (torchtune).
    pub fn compile_checkpointed_region(&mut self, region: usize, outputs: &[Tid], inside: bool) {
        let (first, end) = (self.p.regions[region].first, self.p.regions[region].end);
        self.partition(first, end, outputs, Some(region), inside);
    }

    /// What the partitioner decides for ops `first..end` (see the module doc), without
    /// changing the program: each needed value's fate, the kept set, the op whose backward
    /// reads each kept storage last, and the softmax statistics a recomputation needs.
    fn decide(&self, first: u32, end: u32, outputs: &[Tid], ckpt: Option<usize>) -> Decision {
        let (lo, hi) = (first as usize, end as usize);
        let n_t = self.p.tensors.len();
        // The op that made each storage inside the region.
        let mut producer = vec![u32::MAX; n_t];
        // Each storage's forward readers inside the region.
        let mut readers: Vec<Vec<u32>> = vec![Vec::new(); n_t];
        for (i, op) in self.p.ops[lo..hi].iter().enumerate() {
            for &t in self.p.ins(op) {
                readers[self.p.tensors[t as usize].base as usize].push((lo + i) as u32);
            }
            for &t in self.p.outs(op) {
                let base = self.p.tensors[t as usize].base;
                if base == t {
                    producer[t as usize] = (lo + i) as u32;
                }
            }
            // A mutation the partitioner may not recompute (`inv[perm] = arange`, functionalized
            // to `index_put`) makes the value the backward reads.
            if op.name.ends_with('_') && not_recomputable(op.name) {
                if let Some(&t) = self.p.ins(op).first() {
                    producer[self.p.tensors[t as usize].base as usize] = (lo + i) as u32;
                }
            }
        }
        // Storages a node whose backward cannot fuse saves in eager (M).
        let mut mat = vec![false; n_t];
        let mut needed: Vec<Save> = Vec::new();
        // (op, storage) of every eager save: who reads what in backward.
        let mut reads: Vec<(u32, Tid)> = Vec::new();
        for op in &self.p.ops[lo..hi] {
            if unfused_backward(op.name) {
                // A float8 linear's backward reads its 16-bit input only through the casts
                // that feed its `_scaled_mm`s, which fuse: the input is not materialized.
                let skip = usize::from(float8_linear(op));
                for s in &self.p.saved(op)[skip..] {
                    mat[self.p.tensors[s.t as usize].base as usize] = true;
                }
            }
        }
        // The statistics of the first layer norm of each input: a second norm of the same
        // input (GPT-NeoX's parallel attention and MLP) computes the same mean and rstd after
        // the decomposition, which the graph's CSE merges (measured: one `getitem` and one
        // `rsqrt` per layer).
        let mut norm_stats: Vec<(Tid, Tid, Tid)> = Vec::new();
        // Whole-tensor casts of one tensor to one dtype (peft's `x.to(fp32)` in q, k and v's
        // adapters): the graph's CSE makes them one value.
        let mut casts: Vec<(Tid, DType, Tid)> = Vec::new();
        let mut same = vec![u32::MAX; n_t];
        for op in &self.p.ops[lo..hi] {
            if op.name == "_to_copy" {
                // A whole tensor's cast: torchtitan's Qwen3 casts the cos and sin halves of one
                // rotary cache, two values (their outputs half the cache's elements).
                let (x, y) = (self.p.ins(op)[0], self.p.outs(op)[0]);
                let (tx, ty) = (&self.p.tensors[x as usize], &self.p.tensors[y as usize]);
                let d = ty.dtype;
                let whole = tx.bytes / tx.dtype.bytes().max(1) as u128 == ty.bytes / d.bytes().max(1) as u128;
                match casts.iter().find(|c| c.0 == x && c.1 == d).filter(|_| whole) {
                    Some(&(_, _, first)) => same[y as usize] = first,
                    None => casts.push((x, d, y)),
                }
            }
        }
        // The float8 casts of one input (q, k and v's; the gate and up projections'): the same
        // `abs`, `max`, scale, FP8 copy and reciprocal, which the graph's CSE makes one value
        // each (`float8_linear`'s inputs 2, 3 and 6).
        let mut fp8_inputs: Vec<(Tid, [Tid; 3])> = Vec::new();
        let mut cse = vec![u32::MAX; n_t];
        for op in &self.p.ops[lo..hi] {
            let ins = self.p.ins(op);
            if !float8_linear(op) || ins.len() < 8 {
                continue;
            }
            let (x, cast) = (self.p.tensors[ins[0] as usize].base, [ins[2], ins[3], ins[6]]);
            match fp8_inputs.iter().find(|c| c.0 == x) {
                Some(&(_, first)) => {
                    for (t, f) in cast.into_iter().zip(first) {
                        cse[self.p.tensors[t as usize].base as usize] = self.p.tensors[f as usize].base;
                    }
                }
                None => fp8_inputs.push((x, cast)),
            }
        }
        for (i, op) in self.p.ops[lo..hi].iter().enumerate() {
            let shared = if op.name == "native_layer_norm" {
                let (x, outs) = (self.p.tensors[self.p.ins(op)[0] as usize].base, self.p.outs(op));
                match norm_stats.iter().find(|n| n.0 == x) {
                    Some(&(_, m, r)) => Some((outs[1], outs[2], m, r)),
                    None => {
                        norm_stats.push((x, outs[1], outs[2]));
                        None
                    }
                }
            } else {
                None
            };
            // A layer norm without weight or bias whose output a matmul saves anyway: its
            // output is x̂ itself, and the decomposed backward (`(dy − mean(dy) − x̂·mean(dy·x̂))
            // · rstd`) reads x̂ and rstd — not x and the mean (measured: OLMo's fp32
            // `OlmoLayerNorm`, `mul` and `div` saved, the layer input not).
            let plain_norm = op.name == "native_layer_norm" && self.p.ins(op).len() == 1 && {
                let y = self.p.outs(op)[0];
                mat[self.p.tensors[y as usize].base as usize]
            };
            let (x, mean) =
                if plain_norm { (self.p.tensors[self.p.ins(op)[0] as usize].base, self.p.outs(op)[1]) } else { (u32::MAX, u32::MAX) };
            let saves: Vec<Save> = self.p.saved(op).to_vec();
            for mut s in saves {
                if let Some((m, r, m0, r0)) = shared {
                    s.t = if s.t == m {
                        m0
                    } else if s.t == r {
                        r0
                    } else {
                        s.t
                    };
                }
                if same[self.p.tensors[s.t as usize].base as usize] != u32::MAX {
                    s.t = same[self.p.tensors[s.t as usize].base as usize];
                }
                let base = self.p.tensors[s.t as usize].base;
                if plain_norm && (base == x || s.t == mean) {
                    continue;
                }
                needed.push(s);
                reads.push(((lo + i) as u32, base));
            }
            if plain_norm {
                let y = self.p.outs(op)[0];
                let s = self.p.saved(op)[0];
                needed.push(Save { t: y, part: s.part, group: s.group });
                reads.push(((lo + i) as u32, self.p.tensors[y as usize].base));
            }
        }
        self.float8_weight_scales(lo, hi, ckpt, &producer, &mut needed, &mut reads, &mut mat);
        // Checkpointed: the outputs the policy tags `MUST_SAVE` (selective checkpointing's
        // cache; none under full checkpointing).
        let mut must_save = vec![false; n_t];
        if let Some(r) = ckpt {
            for s in &self.p.regions[r].cached {
                must_save[self.p.tensors[s.t as usize].base as usize] = true;
            }
            // Ops run inside a tensor subclass's `__torch_dispatch__` (torchao's
            // `Float8TrainingTensor` mm takes both scales' reciprocals before `_scaled_mm`) are
            // traced under the policy's decision for the outer op: tagged `MUST_SAVE` with a
            // cached `mm` (measured: torchtitan's op SAC with float8, compiled, keeps the
            // reciprocals of the saved projections, `torchtitan-llama3-compile-fp8.json`).
            let mut inner: Vec<usize> = Vec::new();
            for i in lo..hi {
                let op = &self.p.ops[i];
                if op.in_dispatch {
                    inner.push(i);
                    continue;
                }
                if self.p.outs(op).iter().any(|&t| must_save[self.p.tensors[t as usize].base as usize]) {
                    for &k in &inner {
                        for &t in self.p.outs(&self.p.ops[k]) {
                            must_save[self.p.tensors[t as usize].base as usize] = true;
                        }
                    }
                }
                inner.clear();
            }
        }
        // The storages the backward reads directly: saved whatever happens to the values
        // recomputed from them (the cost of a recomputation counts only the others).
        // Storages a kernel writes in forward (the partitioner's `is_materialized`): region
        // inputs and outputs, a non-fusible op's outputs, a matmul's or attention's inputs;
        // saving any other value costs a write of its own (`save_weight`'s ×2).
        let mut fwd_mat = vec![false; n_t];
        for (t, &p) in producer.iter().enumerate() {
            fwd_mat[t] = p == u32::MAX;
        }
        for op in &self.p.ops[lo..hi] {
            if !fusible(op.name) {
                for &t in self.p.outs(op) {
                    fwd_mat[self.p.tensors[t as usize].base as usize] = true;
                }
            }
            if materializing(op.name) {
                for &t in self.p.ins(op) {
                    fwd_mat[self.p.tensors[t as usize].base as usize] = true;
                }
            }
        }
        for &t in outputs {
            fwd_mat[self.p.tensors[t as usize].base as usize] = true;
        }
        let mut needed_base = vec![false; n_t];
        for s in &needed {
            needed_base[self.p.tensors[s.t as usize].base as usize] = true;
        }
        // An input as the work list reaches it: the first of its float8 casts' CSE twins.
        let cse_of = |i: Tid| match cse[self.p.tensors[i as usize].base as usize] {
            u32::MAX => i,
            first => first,
        };
        let mut fate: Vec<Option<Fate>> = vec![None; n_t];
        let mut kept: Vec<Save> = Vec::new();
        let mut stats: Vec<(Tid, Save, u32)> = Vec::new();
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
            if ckpt.is_some() {
                // Tagged by the checkpoint: saved if `MUST_SAVE`, else recomputed from its inputs.
                if must_save[base as usize] {
                    save(&mut fate, &mut kept);
                } else {
                    fate[base as usize] = Some(Fate::Recomputed);
                    for &i in self.p.ins(&self.p.ops[at as usize]).iter().rev() {
                        work.push(Save { t: cse_of(i), part: s.part, group: s.group });
                    }
                }
                continue;
            }
            let op: &Op = &self.p.ops[at as usize];
            let ins = self.p.ins(op);
            let args = if op.name == "index" { &ins[..1] } else { ins };
            let inputs: u128 = args.iter().map(|&i| self.p.tensors[i as usize].bytes).sum();
            let reduction = self.is_reduction(base, at);
            // A same-size layout copy (`clone`: the o_proj input of an SDPA output) that the
            // compiled graph does not have: q reached SDPA through a `cat` with an empty part
            // (every dim rotated), which Inductor's decomposition drops, so the output keeps
            // RoPE's `[b, s, a, d]` layout and the transpose is a view (measured: phi3, `getitem`
            // saved, no copy; MiniMax-M2's partial RoPE concatenates for real and keeps both).
            let relayout = op.name == "clone" && ins.len() == 1 && {
                let src = self.p.tensors[ins[0] as usize].base as usize;
                let at = producer[src];
                self.p.tensors[src].bytes == x.bytes
                    && at != u32::MAX
                    && not_recomputable(self.p.ops[at as usize].name)
                    && self.empty_cat_before(at, &producer)
            };
            let keep_output = softmax_like(op.name) && self.softmax_output_is_cheaper(base, at, &producer, &readers, &fate, &mat);
            // (S) A value made from a buffer alone that is smaller than the buffer it reads: the
            // min-cut weighs a buffer like any region input (a primal), so it keeps the smaller
            // cut. Measured: torchtitan's bf16 Qwen3 blocks keep `cos` and `sin`, the bf16 casts of
            // its fp32 `rope_cache` (2 × `[s, d]` bf16 where the cache is `[s, 2d]` fp32); in fp32
            // they are views and the cache itself crosses (model state, no activation). Not
            // under torchtitan's tensor parallelism: there the blocks' q and k are head-sharded
            // DTensors and the bf16 Qwen3 blocks keep the fp32 cache, recomputing the casts
            // (measured, `torchtitan-qwen3-tp.json`'s compiled bf16 record; why the min-cut
            // weighs them otherwise there is not established).
            let from_state = self.c.cfg.tp == 1
                && !args.is_empty()
                && args.iter().all(|&i| self.p.tensors[self.p.tensors[i as usize].base as usize].origin == Origin::Buffer)
                && x.bytes < inputs;
            // A pointwise value whose recomputation needs more bytes saved than itself: the
            // min-cut cuts at the value (peft's `base + lora_B(…) * scaling`, two matmul outputs
            // for one sum; its bf16 cast back, three halves for one). The value the backward
            // reads is one node from it (`dist_from_bw` 1), its inputs at least two: at equal
            // bytes the value is kept — a norm's `rsqrt`, not the mean it comes from; qwen2_moe's
            // bf16 gathered routing weights `w[perm]` (`index` of the bf16 cast of the fp32 top-k
            // values, which nothing else in backward reads), not the cast (measured:
            // `qwen2_moe.json`'s bf16 compile record, 512 B less than keeping the fp32 values).
            let dearer = !relayout
                && !not_recomputable(op.name)
                && !mat[base as usize]
                && !reduction
                && !keep_output
                && !from_state
                && self.recompute_cost(
                    at,
                    &Cut { producer: &producer, fate: &fate, needed: &needed_base, mat: &mat, fwd_mat: &fwd_mat },
                    2,
                ) > save_weight(x.bytes, 1, fwd_mat[base as usize]);
            if !relayout && (not_recomputable(op.name) || mat[base as usize] || reduction || keep_output || from_state || dearer) {
                save(&mut fate, &mut kept); // (B), (M), (R), (S)
                continue;
            }
            fate[base as usize] = Some(Fate::Recomputed);
            if softmax_like(op.name) && self.stats_banned(ins[0]) {
                stats.push((ins[0], s, at));
            }
            for &i in ins.iter().rev() {
                work.push(Save { t: cse_of(i), part: s.part, group: s.group });
            }
        }
        // Which op's backward reads each kept storage last (the smallest op index): the op that
        // saved it in eager, or whose saved value is recomputed from it.
        let mut reader: Vec<u32> = vec![u32::MAX; n_t];
        let mut seen: Vec<u32> = vec![u32::MAX; n_t];
        let mut stack: Vec<Tid> = Vec::new();
        for (k, &(i, base)) in reads.iter().enumerate() {
            stack.push(base);
            while let Some(t) = stack.pop() {
                if seen[t as usize] == k as u32 {
                    continue;
                }
                seen[t as usize] = k as u32;
                match fate[t as usize] {
                    Some(Fate::Saved) => reader[t as usize] = reader[t as usize].min(i),
                    Some(Fate::Recomputed) if producer[t as usize] != u32::MAX => {
                        for &x in self.p.ins(&self.p.ops[producer[t as usize] as usize]) {
                            stack.push(self.p.tensors[x as usize].base);
                        }
                    }
                    _ => {}
                }
            }
        }
        Decision { producer, readers, mat, fate, kept, stats, reader, same }
    }

    fn partition(&mut self, first: u32, end: u32, outputs: &[Tid], ckpt: Option<usize>, inside: bool) {
        if end <= first {
            return;
        }
        let (lo, hi) = (first as usize, end as usize);
        let n_t = self.p.tensors.len();
        let Decision { producer, readers, mat, fate, mut kept, stats, mut reader, same } = self.decide(first, end, outputs, ckpt);
        // Checkpointed: the compiled backward re-runs the region's forward as Inductor kernels,
        // and what those kernels write is what the region keeps when it is not checkpointed —
        // the norms' rstd (R), o_proj's output (B) beside the matmul inputs — each until the
        // backward that reads it last (measured: torchtitan's compiled fully checkpointed
        // blocks, `frameworks/steps/…compile=layer+recompute=full.json`, FINDINGS §15.1).
        // Float8 linears inside (torchao's casts, fused in the compiled backward: FINDINGS §15.1
        // "Float8") follow the checkpoint's tags alone under op SAC: the re-run's kernels below
        // are measured without them. Fully checkpointed (torchtitan), the re-run keeps the same
        // values around them as without float8 (the norms' rstd, `wo`'s output, Qwen3's q/k
        // norm inputs), the linears their weight casts (`lowbit.rs` `compiled_full_backward`).
        let f8 = self.p.ops[lo..hi].iter().any(float8_linear) && !self.fp8_compiled_full();
        let plain: Vec<Tid> = match ckpt {
            Some(_) if !f8 => {
                let d = self.decide(first, end, outputs, None);
                // Not what is made from model state alone — the casts of a buffer (S), which
                // the re-run's kernels recompute where they are read (measured: torchtitan's
                // bf16 Qwen3, whose `rope_cache` casts the uncheckpointed blocks keep), nor a
                // weight's cast or dequantization (not measured under checkpointing: left as the
                // eager re-run holds it).
                let of_state = |at: u32| {
                    let ins = self.p.ins(&self.p.ops[at as usize]);
                    !ins.is_empty()
                        && ins.iter().all(|&i| {
                            matches!(self.p.tensors[self.p.tensors[i as usize].base as usize].origin, Origin::Buffer | Origin::Param { .. })
                        })
                };
                // Only what a kernel must write: a non-fusible op's output or a reduction (a
                // pointwise value the uncheckpointed cut keeps, peft's `base + lora_B(…)·s`, is
                // recomputed inside the kernels that read it, from the matmul outputs it adds).
                // Not so where the checkpoint wraps the compiled region (torchtune, `!inside`):
                // the re-run calls the compiled forward, whose graph was partitioned without the
                // checkpoint, so it keeps the uncheckpointed cut — LoRA's sums `out + lora_out`
                // (w1's and w3's `[b·s, ffn]`, the attention residual `x + wo(…)`), not the two
                // matmul outputs each adds, which its kernels free after reading them. Measured:
                // torchao_nf4/compile.json's checkpointed record lists the re-run's saved set,
                // `recomputed_saved_bytes` = the uncheckpointed record's 1,665,040 B; the LoRA
                // step trace (`frameworks/steps/…recompute=full__lora-r8-all.json`) frees two of
                // the four `[b·s, ffn]` matmul outputs right after the kernel that writes the sums.
                let written = |s: &Save| {
                    let at = d.producer[s.t as usize];
                    !inside || !fusible(self.p.ops[at as usize].name) || self.is_reduction(s.t, at) || self.of_reduction(s.t, &d.producer)
                };
                d.kept
                    .iter()
                    .filter(|s| d.producer[s.t as usize] != u32::MAX && !of_state(d.producer[s.t as usize]) && written(s))
                    .map(|s| s.t)
                    .collect()
            }
            _ => Vec::new(),
        };
        // The softmax statistics: `[rows, 1]` max and sum in the input's dtype (fp32 here), read
        // by the softmax's backward.
        for (input, s, at) in stats {
            let (shape, dt) = (self.shape(input).drop_last(), self.t(input).dt);
            let dt = if self.dtype(dt) == DType::Fp32 { dt } else { Dt::F32 };
            let outs = [self.out(shape, dt, false), self.out(shape, dt, false)];
            let r = self.op("amax_sum", "", &[input], &outs, &[], &[] as &[B]);
            reader.resize(self.p.tensors.len(), u32::MAX);
            for t in [r[0], r[1]] {
                reader[t as usize] = at;
                kept.push(Save { t, part: s.part, group: s.group });
            }
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
        for &t in &plain {
            materialized[t as usize] = true;
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
        if let Some(r) = ckpt {
            // The checkpoint keeps what crosses: the inputs reached and the `MUST_SAVE` outputs
            // reached; the ops keep their saves for the recomputation.
            let saved: Vec<bool> = (0..n_t).map(|t| fate[t] == Some(Fate::Saved)).collect();
            let reg = &mut self.p.regions[r];
            let held_before: Vec<Tid> = reg.held.iter().map(|s| self.p.tensors[s.t as usize].base).collect();
            let cached_before: Vec<Tid> = reg.cached.iter().map(|s| self.p.tensors[s.t as usize].base).collect();
            reg.held.retain(|s| saved[self.p.tensors[s.t as usize].base as usize]);
            reg.cached.retain(|s| saved[self.p.tensors[s.t as usize].base as usize]);
            for s in kept {
                if producer[s.t as usize] == u32::MAX && !held_before.contains(&s.t) {
                    reg.held.push(Save { t: s.t, part: crate::estimator::part::Part::Checkpoints, group: s.group });
                } else if producer[s.t as usize] != u32::MAX && !cached_before.contains(&s.t) {
                    // Tagged `MUST_SAVE` inside a cached op's dispatch (its scales' reciprocals).
                    reg.cached.push(s);
                }
            }
            if f8 {
                return;
            }
            // The re-run's kernels make one cast of a tensor to a dtype (the graph's CSE): the
            // second is the first (peft's q, k, v — or gate and up — adapters' `x.to(fp32)`).
            for (t, &first) in same.iter().enumerate() {
                if first != u32::MAX {
                    self.p.tensors[t].bytes = 0;
                }
            }
            // What the backward reads of a value fused away (the residual sum `x + o`, peft's
            // `base + lora_B(…)·s`) the kernels recompute from the storages it is made of (o_proj's
            // output; the two matmul outputs): each is held by the op that saves the value, or
            // by its own last forward reader where that comes first (the re-run frees a storage
            // no op has saved yet after its last forward reader).
            let made = |t: Tid| producer.get(t as usize).is_some_and(|&at| at != u32::MAX);
            let mut holds: Vec<(usize, Save)> = Vec::new();
            for i in lo..hi {
                for sv in self.p.saved(&self.p.ops[i]) {
                    let b = self.p.tensors[sv.t as usize].base;
                    if !made(b) || self.p.tensors[b as usize].bytes > 0 {
                        continue;
                    }
                    let mut work = vec![b];
                    let mut seen: Vec<Tid> = Vec::new();
                    while let Some(t) = work.pop() {
                        let t = same.get(t as usize).copied().filter(|&f| f != u32::MAX).unwrap_or(t);
                        if seen.contains(&t) || !made(t) {
                            continue;
                        }
                        seen.push(t);
                        if self.p.tensors[t as usize].bytes > 0 {
                            let Some(&last) = readers[t as usize].iter().max() else { continue };
                            let at = i.min(last as usize);
                            let already = self.p.saved(&self.p.ops[at]).iter().any(|x| self.p.tensors[x.t as usize].base == t);
                            if !already && !holds.iter().any(|h| h.0 == at && h.1.t == t) {
                                holds.push((at, Save { t, part: sv.part, group: sv.group }));
                            }
                            continue;
                        }
                        let op = &self.p.ops[producer[t as usize] as usize];
                        work.extend(self.p.ins(op).iter().map(|&x| self.p.tensors[x as usize].base));
                    }
                }
            }
            for (at, sv) in holds {
                self.add_save(at, sv);
            }
            self.fuse_late_weight_grad(r, &producer, &readers, inside);
            return;
        }
        // Every op of the region loses its saves; its first differentiable op (whose node runs
        // last in the region's backward) takes the kept set.
        let holder = (lo..hi)
            .find(|&i| {
                let op = &self.p.ops[i];
                op.bw.1 > 0 && self.p.ins(op).iter().any(|&t| self.p.tensors[t as usize].requires_grad)
            })
            .unwrap_or(lo);
        // Inductor's backward frees each saved tensor after its last use (the generated code's
        // `del`): a kept storage goes with the backward of the op that reads it last — the
        // nearest op at or before it whose node runs, else the holder.
        let runs = |p: &super::ir::Program, i: usize| {
            let op = &p.ops[i];
            op.bw.1 > 0 && p.ins(op).iter().any(|&t| p.tensors[t as usize].requires_grad)
        };
        let mut by_op: Vec<Vec<Save>> = vec![Vec::new(); hi - lo];
        for s in kept {
            let r = reader[s.t as usize];
            let at = if r == u32::MAX { holder } else { (lo..=r as usize).rev().find(|&i| runs(&self.p, i)).unwrap_or(holder) };
            by_op[at - lo].push(s);
        }
        for (k, saves) in by_op.into_iter().enumerate() {
            let at = self.p.saves.len() as u32;
            let n = saves.len().min(u8::MAX as usize);
            self.p.saves.extend_from_slice(&saves[..n]);
            self.p.ops[lo + k].saved = (at, n as u8);
        }
        for (i, op) in self.p.ops[lo..].iter_mut().enumerate() {
            op.compiled = if i == 0 { Compiled::First } else { Compiled::Inside };
        }
    }
}

impl<'a> Builder<'a> {
    /// The backward of a compiled layer (ops `first..end`, after [`Builder::compile_region`] or
    /// [`Builder::compile_checkpointed_region`]): Inductor fuses the backward of pointwise ops as
    /// it fuses their forward, so a buffer a fusible op's eager backward formula allocates exists
    /// only where it becomes the gradient of a value the forward materialized (a matmul's output,
    /// a region input, a parameter): the gradients of the values fused away in forward, and the
    /// formulas' own temporaries (GELU-tanh's, the norms'), live inside a kernel. The matmuls',
    /// attention's and other unfusible ops' backward keep their allocations. Measured:
    /// `gpt2/b2/s64/fp32/sdpa/compile=layer+recompute=full` peaks in AdamW's step (3,338,900 B;
    /// its layers' compiled backward at most 953,224 B live, `recipes/steps/`), which the eager
    /// temporaries of `gelu_new`'s backward overshot by 4 % in layer 0's backward; no other
    /// compiled record's estimate moves.
    ///
    /// `through_sums`: a checkpointed layer, whose fused values are recomputed inside the
    /// backward's kernels (a sum `base + lora_B(…)·s` is not kept): the gradient of such a value
    /// that a sum or a view passes on unchanged to a materialized value (the base matmul's
    /// output) is that value's gradient, a kernel output.
    pub fn fuse_layer_backward(&mut self, first: u32, end: u32, through_sums: bool) {
        // Which zero-byte values pass their gradient on to a materialized one.
        let n_t = self.p.tensors.len();
        let mut lands = vec![false; n_t];
        if through_sums && !self.p.ops[first as usize..end as usize].iter().any(float8_linear) {
            // How many ops of the layer read each storage: a gradient that other readers add to
            // (GELU's input, read by its pow, add and mul) is summed inside the kernel.
            let mut reads = vec![0u32; n_t];
            for op in &self.p.ops[first as usize..end as usize] {
                for &t in self.p.ins(op) {
                    reads[self.p.tensors[t as usize].base as usize] += 1;
                }
            }
            for i in first as usize..end as usize {
                let op = &self.p.ops[i];
                if !fusible(op.name) {
                    continue;
                }
                let (ins, outs) = (self.p.ins(op), self.p.outs(op));
                for st in self.p.bw(op) {
                    if let B::Pass { input, output } = *st {
                        let (x, y) = (ins[input as usize], outs[output as usize]);
                        let bx = self.p.tensors[x as usize].base as usize;
                        let to = &self.p.tensors[bx];
                        if reads[bx] == 1 && (to.bytes > 0 || lands[bx] || matches!(to.origin, Origin::Param { .. })) {
                            lands[self.p.tensors[y as usize].base as usize] = true;
                        }
                    }
                }
            }
        }
        for i in first as usize..end as usize {
            let op = &self.p.ops[i];
            if !fusible(op.name) || op.bw.1 == 0 {
                continue;
            }
            let (at, n) = (op.bw.0 as usize, op.bw.1 as usize);
            let ins: Vec<Tid> = self.p.ins(op).to_vec();
            // Temporaries in allocation order; which become a materialized input's gradient.
            let mut temps: Vec<usize> = Vec::new();
            let mut keep: Vec<bool> = Vec::new();
            for k in at..at + n {
                match self.p.script[k] {
                    B::Alloc { .. } => {
                        temps.push(k);
                        keep.push(false);
                    }
                    B::Grad { input, temp } => {
                        let materialized = ins.get(input as usize).is_some_and(|&t| {
                            let x = &self.p.tensors[self.p.tensors[t as usize].base as usize];
                            x.bytes > 0 || matches!(x.origin, Origin::Param { .. }) || lands[self.p.tensors[t as usize].base as usize]
                        });
                        if let Some(kk) = keep.get_mut(temp as usize) {
                            *kk |= materialized;
                        }
                    }
                    _ => {}
                }
            }
            for (k, kept) in temps.into_iter().zip(keep) {
                if let B::Alloc { bytes, .. } = &mut self.p.script[k] {
                    if !kept {
                        *bytes = 0;
                    }
                }
            }
        }
    }
}

impl<'a> Builder<'a> {
    /// Finds checkpoint region `r`'s [`FusedBackward`]: a fusible op (`head`: act(gate)·up) whose
    /// output is read only by matmuls after it (`late`: `down_proj`, and a LoRA adapter's
    /// `lora_A`, `lora_B` on it), where every op after the head is such a matmul saving only
    /// parameters, the head's output or another late matmul's output, or a fusible op saving
    /// nothing the region makes (the adapter's scaling, the residual sum) — so the re-run never
    /// needs them before the backward; `members` are the fusible ops whose outputs live inside
    /// the head's kernel (fused away, read only by the head or other members).
    ///
    /// `inside` false (torchtune: the checkpoint wraps the compiled layer, whose re-run keeps
    /// the uncheckpointed cut, LoRA's `base + lora_B(…)·s` sums included): only a head whose
    /// output two late matmuls read (`w2` and its adapter's `lora_A`) makes a group — its kernel
    /// reads both input gradients apart; with one reader the eager node order holds (measured
    /// within 12 B on the plain and q,v records) — and the members go on through the saved
    /// sums, whose backward passes the gradient on, to the adapters' scaling, fused away.
    fn fuse_late_weight_grad(&mut self, r: usize, producer: &[u32], readers: &[Vec<u32>], inside: bool) {
        let p = &self.p;
        let (lo, hi) = (p.regions[r].first as usize, p.regions[r].end as usize);
        let region_made = |t: Tid| producer.get(t as usize).is_some_and(|&at| at != u32::MAX && (lo..hi).contains(&(at as usize)));
        let base = |t: Tid| p.tensors[t as usize].base;
        // The fusible ops from `x` on whose outputs only late matmuls (or other such ops) read
        // (peft's `p.to(fp32)` for `down`'s adapter), or None where a reader is neither.
        let post_of = |h: usize, x: Tid| -> Option<Vec<u32>> {
            let mut post: Vec<u32> = Vec::new();
            let mut work = vec![x];
            while let Some(t) = work.pop() {
                let rd = &readers[t as usize];
                if rd.is_empty() {
                    return None;
                }
                for &k in rd {
                    let op = &p.ops[k as usize];
                    if k as usize <= h {
                        return None;
                    }
                    if materializing(op.name) || post.contains(&k) {
                        continue;
                    }
                    if !fusible(op.name) || p.outs(op).len() != 1 {
                        return None;
                    }
                    post.push(k);
                    work.push(base(p.outs(op)[0]));
                }
            }
            post.sort_unstable();
            Some(post)
        };
        // The tail from `h + 1`: its matmuls, or None where an op there does not fit.
        let tail = |h: usize, x: Tid, post: &[u32]| -> Option<Vec<u32>> {
            let mut late: Vec<u32> = Vec::new();
            for j in h + 1..hi {
                let op = &p.ops[j];
                let made_by_tail = |t: Tid| producer.get(t as usize).is_some_and(|&at| late.contains(&at) || post.contains(&at));
                if materializing(op.name) {
                    let fits = p.saved(op).iter().all(|s| {
                        let b = base(s.t);
                        !region_made(b) || b == x || made_by_tail(b)
                    });
                    if !fits {
                        return None;
                    }
                    late.push(j as u32);
                } else if !fusible(op.name) || p.saved(op).iter().any(|s| region_made(base(s.t))) {
                    return None;
                }
            }
            Some(late)
        };
        // The first head whose tail fits: a cast after it (its `post`) would fit too.
        let found = (lo..hi).find_map(|h| {
            let op = &p.ops[h];
            let x = base(*p.outs(op).first()?);
            if !fusible(op.name) || op.bw.1 == 0 || p.tensors[x as usize].bytes == 0 {
                return None;
            }
            let post = post_of(h, x)?;
            tail(h, x, &post).filter(|l| !l.is_empty()).map(|l| (h, l, post))
        });
        let Some((head, late, post)) = found else { return };
        let x = base(p.outs(&p.ops[head])[0]);
        if !inside && late.iter().filter(|&&m| p.ins(&p.ops[m as usize]).iter().any(|&t| base(t) == x)).count() < 2 {
            return;
        }
        // A saved sum (torchtune's `out + lora_out`): a fusible op whose backward only passes
        // its gradient on (no buffer of its own).
        let sum = |op: &Op| p.bw(op).iter().all(|st| matches!(st, B::Pass { .. }));
        let mut members: Vec<u32> = Vec::new();
        let mut work: Vec<Tid> = p.ins(&p.ops[head]).iter().map(|&t| base(t)).collect();
        while let Some(t) = work.pop() {
            if !region_made(t) {
                continue;
            }
            let at = producer[t as usize];
            let op = &p.ops[at as usize];
            if p.tensors[t as usize].bytes > 0 && (inside || !fusible(op.name) || !sum(op)) {
                continue;
            }
            let within = |k: &u32| *k as usize == head || members.contains(k) || *k == at;
            if !fusible(op.name) || op.bw.1 == 0 || members.contains(&at) || !readers[t as usize].iter().all(within) {
                continue;
            }
            members.push(at);
            work.extend(p.ins(op).iter().map(|&t| base(t)));
        }
        members.sort_unstable_by(|a, b| b.cmp(a));
        self.p.regions[r].fused.push(super::ir::FusedBackward { late, head: head as u32, members, post, apart: inside });
    }

    /// Adds `s` to op `at`'s saves: its live saves, then `s`, then its dead saves, moved to the
    /// end of `Program::saves` (an op's saves are one contiguous run, the dead ones after).
    fn add_save(&mut self, at: usize, s: Save) {
        let op = &self.p.ops[at];
        let (a, n, dead) = (op.saved.0 as usize, op.saved.1 as usize, op.dead as usize);
        if n >= u8::MAX as usize {
            return;
        }
        let mut run: Vec<Save> = self.p.saves[a..a + n].to_vec();
        run.push(s);
        run.extend_from_slice(&self.p.saves[a + n..a + n + dead]);
        let at_saves = self.p.saves.len() as u32;
        self.p.saves.extend(run);
        self.p.ops[at].saved = (at_saves, (n + 1) as u8);
    }

    /// What a compiled region keeps of its float8 linears' weight casts (torchao 0.18
    /// `Float8Linear`, tensorwise, the weight cast in the region: ops `lo..hi`). The forward
    /// casts `weight.t()` (`hp_tensor_to_float8_dynamic`: `max(abs(w))`, the fp32 scale) and
    /// `matmul_with_hp_or_float8_args.backward` casts the same `weight_hp_t` again for
    /// grad_input: one value after the partitioner's CSE (torch 2.15
    /// `min_cut_rematerialization_partition`: `fx_graph_cse` with `partition_key`, which merges
    /// nodes only where both are ancestors of the backward's outputs) when the linear's output
    /// is one — when something the backward reads is computed from it (q, k, v, o and the
    /// feed-forward's gate and up projections; not the last projection of a residual branch,
    /// `w2`, whose output only joins the residual sum). The partitioner then keeps the weight's
    /// `max` (a reduction, in the weight's dtype) and the reciprocal of its fp32 scale, which
    /// the backward's `_scaled_mm` reads (M): `p + 4` bytes per such linear (measured:
    /// `torchtitan-llama3-compile-fp8.json`, `saved` rows `max` and `reciprocal`). The input's
    /// cast is not shared (the backward casts the input reshaped to 2-D for grad_weight), so no
    /// scale of the input crosses. Each kept value is added to the region's reads as the
    /// linear's own. Weights FSDP2 all-gathers in float8 arrive cast:
    /// [`Builder::gathered_float8_saves`] (`ckpt`, the region's checkpoint, decides there).
    #[allow(clippy::too_many_arguments)]
    fn float8_weight_scales(
        &self,
        lo: usize,
        hi: usize,
        ckpt: Option<usize>,
        producer: &[u32],
        needed: &mut Vec<Save>,
        reads: &mut Vec<(u32, Tid)>,
        mat: &mut [bool],
    ) {
        let Some(fp8) = self.lowbit.fp8.filter(|f| f.recipe == crate::estimator::config::Fp8::TorchaoTensorwise) else { return };
        if !self.p.ops[lo..hi].iter().any(float8_linear) {
            return;
        }
        if fp8.allgathered {
            self.gathered_float8_saves(lo, hi, ckpt, needed, reads, mat);
            return;
        }
        // Ancestors, inside the region, of what the backward reads.
        let mut dep = vec![false; self.p.tensors.len()];
        for s in needed.iter() {
            dep[self.p.tensors[s.t as usize].base as usize] = true;
        }
        for i in (lo..hi).rev() {
            let op = &self.p.ops[i];
            if self.p.outs(op).iter().any(|&t| dep[self.p.tensors[t as usize].base as usize]) {
                for &t in self.p.ins(op) {
                    dep[self.p.tensors[t as usize].base as usize] = true;
                }
            }
        }
        for i in lo..hi {
            let op = &self.p.ops[i];
            let ins = self.p.ins(op);
            // [x, w, x8, x scale, w8, w scale, 1/x scale, 1/w scale].
            if !float8_linear(op) || ins.len() < 8 || !self.p.outs(op).iter().any(|&t| dep[self.p.tensors[t as usize].base as usize]) {
                continue;
            }
            let Some(&first) = self.p.saved(op).first() else { continue };
            for t in [ins[5], ins[7]] {
                let base = self.p.tensors[t as usize].base;
                debug_assert!(producer[base as usize] != u32::MAX);
                needed.push(Save { t, part: first.part, group: first.group });
                reads.push((i as u32, base));
            }
            mat[self.p.tensors[ins[7] as usize].base as usize] = true;
        }
    }

    /// What a compiled block keeps of its float8 linears' weights when FSDP2 all-gathers them
    /// in float8 (`enable_fsdp_float8_all_gather`: each weight arrives as a
    /// `Float8TrainingTensor`, its e4m3 data and fp32 scale made by the all-gather, outside the
    /// region). Without checkpointing: every linear's reciprocal of its gathered scale (`ins[5]`,
    /// 4 B, a reduction of the weight in the program), w2's too — there is no cast for the
    /// partitioner's CSE to merge — and the feed-forward weights' e4m3 transposed copies
    /// (`ins[6]`, [`Builder::gathered_transpose_kept`]). Measured: 7 reciprocals and 3 copies a
    /// layer (`torchtitan-llama3-fsdp2-compile-fp8.json`, recompute none, saved bytes exact).
    /// Checkpointed (full or op) the blocks keep the gathered scales themselves as region inputs
    /// (7 a layer under full, 3 scales and 6 reciprocals under op): 4-byte scalars the program
    /// does not carry as tensors, left out (28 and 36 B a layer under, FINDINGS §15.1).
    fn gathered_float8_saves(
        &self,
        lo: usize,
        hi: usize,
        ckpt: Option<usize>,
        needed: &mut Vec<Save>,
        reads: &mut Vec<(u32, Tid)>,
        mat: &mut [bool],
    ) {
        if ckpt.is_some() {
            return;
        }
        for i in lo..hi {
            let op = &self.p.ops[i];
            let ins = self.p.ins(op);
            // [x, w, x8, x scale, 1/x scale, 1/w scale (, wᵀ e4m3)].
            if !float8_linear(op) || ins.len() < 6 {
                continue;
            }
            let Some(&first) = self.p.saved(op).first() else { continue };
            for &t in &ins[5..] {
                let base = self.p.tensors[t as usize].base;
                needed.push(Save { t, part: first.part, group: first.group });
                reads.push((i as u32, base));
                mat[base as usize] = true;
            }
        }
    }

    /// Whether the first input of op `at` (SDPA's q) was made by a `cat` with an empty part
    /// (one of its inputs is as large as its output: RoPE rotated every dim).
    fn empty_cat_before(&self, at: u32, producer: &[u32]) -> bool {
        let Some(&q) = self.p.ins(&self.p.ops[at as usize]).first() else { return false };
        let made = producer[self.p.tensors[q as usize].base as usize];
        made != u32::MAX && {
            let cat = &self.p.ops[made as usize];
            let whole = self.p.outs(cat).first().map(|&t| self.p.tensors[t as usize].bytes);
            cat.name == "cat" && self.p.ins(cat).iter().any(|&t| Some(self.p.tensors[t as usize].bytes) == whole)
        }
    }

    /// Whether a storage is materialized in forward (`is_materialized`): a region input, the
    /// single output of an op that does not fuse, or read by such an op.
    fn materialized_in_forward(&self, t: Tid, producer: &[u32], readers: &[Vec<u32>]) -> bool {
        let at = producer[t as usize];
        at == u32::MAX
            || (!fusible(self.p.ops[at as usize].name) && self.p.outs(&self.p.ops[at as usize]).len() == 1)
            || readers[t as usize].iter().any(|&r| !fusible(self.p.ops[r as usize].name))
    }

    /// The min-cut's price of recomputing the output of op `at` from its inputs rather than
    /// saving it (`depth` steps from the value the backward reads), each input at its own
    /// cheapest: a storage the rule saves (a region input, a non-recomputable op's output, a
    /// value a matmul reads, a reduction) its save weight, one saved already or read by the
    /// backward directly nothing, a pointwise value the smaller of its save weight and its own
    /// recomputation's price; every step away from the backward weighs 1.1× more
    /// (`get_node_weight`'s `1.1^dist_from_bw`). peft's `base + lora_B(…) * scaling` is kept
    /// (two matmul outputs for one sum), and of its bf16 residual `h` the value, not its fp32
    /// cast nor the matmuls it sums; a residual `x + o_proj(…)` whose `x` is kept anyway is
    /// recomputed, as before.
    fn recompute_cost(&self, at: u32, cut: &Cut, depth: i32) -> f64 {
        let mut seen: Vec<Tid> = Vec::new();
        self.p
            .ins(&self.p.ops[at as usize])
            .iter()
            .map(|&i| self.p.tensors[i as usize].base)
            .filter(|b| {
                let new = !seen.contains(b);
                seen.push(*b);
                new
            })
            .map(|b| self.value_cost(b, cut, depth))
            .sum()
    }

    /// [`Builder::recompute_cost`]'s price of one storage `depth` steps up from the value. A
    /// region input (a primal) is one step further from the backward than the value its
    /// reader makes: of torchtune's LoRA residual `h = x + output_proj(…)` in the first layer —
    /// `x` the frozen embedding's output, needed by nothing else — the partitioner keeps `h`, not
    /// `x` and the projection (measured: tests/fixtures/pytorch/frameworks/
    /// torchtune-llama3-lora-compile.json, `add` saved in layer 0; at equal weights the rule
    /// recomputed `h`, 16,384 B over).
    fn value_cost(&self, b: Tid, cut: &Cut, depth: i32) -> f64 {
        /// Pointwise chains longer than this are priced at the value itself.
        const MAX_DEPTH: i32 = 16;
        let t = &self.p.tensors[b as usize];
        if matches!(t.origin, Origin::Param { .. } | Origin::Buffer) || cut.fate[b as usize] == Some(Fate::Saved) || cut.needed[b as usize]
        {
            return 0.0;
        }
        let weight = save_weight(t.bytes, depth, cut.fwd_mat[b as usize]);
        let p = cut.producer[b as usize];
        if p == u32::MAX {
            return save_weight(t.bytes, depth + 1, cut.fwd_mat[b as usize]);
        }
        if depth >= MAX_DEPTH {
            return weight;
        }
        let name = self.p.ops[p as usize].name;
        if not_recomputable(name) || cut.mat[b as usize] || self.is_reduction(b, p) || softmax_like(name) {
            return weight;
        }
        self.recompute_cost(p, cut, depth + 1).min(weight)
    }

    /// Softmax's row statistics may not be recomputed (`ban_recompute_reductions`: a `[rows, 1]`
    /// result more than 4× smaller than its input) when a row has more than 4 columns.
    /// (R): storage `b`, made by op `at`, is more than 4× smaller than the op's tensor arguments
    /// together (`ban_recompute_reductions`; `input_tensors_size` sums the node's tensor
    /// arguments, and `index`'s indices come in a list, which it does not count) — a split's
    /// part is a view, not a reduction.
    fn is_reduction(&self, b: Tid, at: u32) -> bool {
        let op = &self.p.ops[at as usize];
        let ins = self.p.ins(op);
        let args = if op.name == "index" { &ins[..1] } else { ins };
        let inputs: u128 = args.iter().map(|&i| self.p.tensors[i as usize].bytes).sum();
        self.p.tensors[b as usize].bytes.saturating_mul(4) < inputs && !op.name.starts_with("split")
    }

    /// Storage `t` is a pointwise function of a reduction, no larger than it (a norm's
    /// `rsqrt(mean + eps)`): what the min-cut keeps at a tie in its place, the value nearer the
    /// backward (`1.1^dist_from_bw`), where the reduction itself would be kept otherwise.
    fn of_reduction(&self, t: Tid, producer: &[u32]) -> bool {
        let mut t = t;
        for _ in 0..4 {
            let at = producer[t as usize];
            if at == u32::MAX || !fusible(self.p.ops[at as usize].name) {
                return false;
            }
            let ins: Vec<Tid> = self
                .p
                .ins(&self.p.ops[at as usize])
                .iter()
                .map(|&i| self.p.tensors[i as usize].base)
                .filter(|&i| !matches!(self.p.tensors[i as usize].origin, Origin::Param { .. } | Origin::Buffer))
                .collect();
            let [i] = ins[..] else { return false };
            if self.p.tensors[i as usize].bytes < self.p.tensors[t as usize].bytes {
                return false;
            }
            let src = producer[i as usize];
            if src != u32::MAX && self.is_reduction(i, src) {
                return true;
            }
            t = i;
        }
        false
    }

    fn stats_banned(&self, input: Tid) -> bool {
        let stat = self.bytes_of(&self.shape(input).drop_last(), Dt::F32);
        stat.saturating_mul(4) < self.bytes(input)
    }

    /// The min-cut's choice for a softmax output the backward reads (`o`, made by op `at`):
    /// save it (one node from the backward) or recompute the softmax from the nearest value
    /// that is saved anyway or may not be recomputed (its input through casts and views, its
    /// depth counted in decomposed nodes), plus the row statistics where they are banned from
    /// recomputation. Weights as `get_node_weight` gives them ([`save_weight`]). A router's
    /// fp32 probabilities feeding `topk` are kept; from a bf16 router matmul the softmax is
    /// recomputed (half the bytes, four nodes further); a loss's log-softmax is recomputed from
    /// the logits. A chain through an op of several inputs (a mask added) is not weighed: the
    /// softmax is recomputed.
    fn softmax_output_is_cheaper(
        &self,
        o: Tid,
        at: u32,
        producer: &[u32],
        readers: &[Vec<u32>],
        fate: &[Option<Fate>],
        mat: &[bool],
    ) -> bool {
        let op = &self.p.ops[at as usize];
        let Some(&input) = self.p.ins(op).first() else { return false };
        let keep = save_weight(self.p.tensors[o as usize].bytes, 1, self.materialized_in_forward(o, producer, readers));
        let mut dist = softmax_depth(op.name);
        let mut t = self.p.tensors[input as usize].base;
        let source = loop {
            if fate[t as usize] == Some(Fate::Saved) {
                break 0.0;
            }
            let x = &self.p.tensors[t as usize];
            let made = producer[t as usize];
            if made == u32::MAX || !fusible(self.p.ops[made as usize].name) || mat[t as usize] {
                break save_weight(x.bytes, dist, self.materialized_in_forward(t, producer, readers));
            }
            let ins: Vec<Tid> = self
                .p
                .ins(&self.p.ops[made as usize])
                .iter()
                .copied()
                .filter(|&i| !matches!(self.p.tensors[i as usize].origin, Origin::Param { .. } | Origin::Buffer))
                .collect();
            if ins.len() != 1 {
                return false;
            }
            t = self.p.tensors[ins[0] as usize].base;
            dist += 1;
        };
        let stats = if self.stats_banned(input) {
            let stat = self.bytes_of(&self.shape(input).drop_last(), Dt::F32);
            save_weight(stat, softmax_depth(op.name), false) + save_weight(stat, 2, false)
        } else {
            0.0
        };
        keep < source + stats
    }

    /// The compiled loss's backward (`torch.compile(ForCausalLMLoss)`, ops `first..end`, whose
    /// region input is `logits`): one fused Inductor kernel writes the logits' gradient in
    /// their dtype, beside one `[T]` fp32 buffer (the per-row scale, freed after the kernel) —
    /// no fp32 `[T, V]` gradient of the log-softmax or of the fp32 copy is allocated (measured:
    /// `recipes/steps/*compile=layer*`, the allocations inside `CompiledFunctionBackward` of the
    /// loss; validation/FINDINGS.md §15.1). The interior nodes pass the gradient on unchanged.
    ///
    /// `tangent`: the whole model is one compiled graph (`compile_regions = model`), which also
    /// returns the logits (`CausalLMOutput.logits`), a differentiable output the loss's backward
    /// does not reach, so AOTAutograd materializes its tangent — zeros the size of the logits, in
    /// their dtype — before the compiled backward runs, alive through the loss's backward
    /// (measured: `recipes/steps/llama-gqa__…__compile=model.json`, an `aten::empty` of
    /// `[b, s, V]` fp32 outside the graph; FINDINGS §15.1.z).
    pub fn fuse_loss_backward(&mut self, first: u32, end: u32, logits: Tid, rows: u128, tangent: bool) {
        let (lb, ld) = (self.bytes(logits), self.t(logits).dtype);
        for i in first as usize..end as usize {
            let op = &self.p.ops[i];
            if op.bw.1 == 0 {
                continue;
            }
            let script: Vec<B> = if op.name == "nll_loss_forward" {
                // Temporaries: the tangent (when there is one), the row scale, the gradient.
                let t = u8::from(tangent);
                let mut s = Vec::with_capacity(6);
                if tangent {
                    s.push(B::Alloc { bytes: lb, dtype: ld, op: "zeros_like (logits tangent)" });
                }
                s.push(B::Alloc { bytes: 4 * rows, dtype: DType::Fp32, op: "compiled_loss_backward" });
                s.push(B::Alloc { bytes: lb, dtype: ld, op: "compiled_loss_backward" });
                s.push(B::Free(t));
                if tangent {
                    s.push(B::Free(0));
                }
                s.push(B::Grad { input: 0, temp: t + 1 });
                s
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
    use crate::estimator::config::{CompileRegions, Config, Recompute};
    use crate::estimator::estimate;
    use crate::estimator::presets::preset;

    #[test]
    fn a_compiled_llama_or_mixtral_keeps_less_than_its_eager_step_its_whole_graph_more_and_the_unmeasured_families_and_regions_are_refused_by_name(
    ) {
        let eager = Config::default();
        let compiled = Config { compile: true, ..eager.clone() };
        let (e, c) = (estimate(&eager).expect("eager"), estimate(&compiled).expect("compiled"));
        assert!(c.memory.activations < e.memory.activations, "{} vs {}", c.memory.activations, e.memory.activations);
        assert!(c.memory.peak < e.memory.peak);
        // Torchtitan's blocks are not transformers' layers: refused on its code.
        let err = estimate(&Config { compile_regions: CompileRegions::Block, ..compiled.clone() }).expect_err("refused").to_string();
        assert!(err.contains("not modelled yet"), "{err}");
        // The whole model one graph (measured on Llama): the graph's causal mask, k and v
        // repeated for SDPA and the logits' zero tangent make it keep and peak more than the
        // layer regions.
        let whole = estimate(&Config { compile_regions: CompileRegions::Model, ..compiled.clone() }).expect("Llama compiles whole");
        assert!(whole.memory.activations > c.memory.activations && whole.memory.peak > c.memory.peak);
        // An MoE measured compiled (the router's softmax, the grouped experts' routing indices).
        let of = |id: &str, compile: bool| Config {
            model: id.into(),
            arch: preset(id).expect("preset").spec,
            compile,
            seq: 512,
            ..Config::default()
        };
        let (e, c) =
            (estimate(&of("mixtral-8x7b-v0.1", false)).expect("eager"), estimate(&of("mixtral-8x7b-v0.1", true)).expect("compiled"));
        assert!(c.memory.activations < e.memory.activations, "{} vs {}", c.memory.activations, e.memory.activations);
        // The whole model one graph is measured on Llama alone.
        let err =
            estimate(&Config { compile_regions: CompileRegions::Model, ..of("mixtral-8x7b-v0.1", true) }).expect_err("refused").to_string();
        assert!(err.contains("whole model"), "{err}");
        // A family never measured compiled.
        let err = estimate(&of("qwen3-next-80b-a3b-thinking", true)).expect_err("refused").to_string();
        assert!(err.contains("not modelled yet") && err.contains("Qwen3Next"), "{err}");
    }

    /// The most `[b·s, ffn]` buffers of layer 0's backward alive at once (the step stream's
    /// allocations of exactly that size, in any dtype of the recipe).
    fn ffn_buffers_at_once(c: &Config) -> usize {
        use crate::estimator::step::{EventKind, Phase};
        let s = crate::estimator::step_stream(c).expect("estimated");
        let tokens = (c.batch * c.seq) as u128 * c.arch.ffn as u128;
        let sizes = [2 * tokens, 4 * tokens];
        let mut alive: Vec<u32> = Vec::new();
        let mut most = 0;
        for e in &s.events {
            if !sizes.contains(&e.bytes) || e.phase != Phase::Backward || e.layer != Some(0) {
                continue;
            }
            match e.kind {
                EventKind::Alloc => alive.push(e.id),
                _ => alive.retain(|&id| id != e.id),
            }
            most = most.max(alive.len());
        }
        most
    }

    /// Inductor's compiled backward of a fully checkpointed layer (FINDINGS §15.1,
    /// `ir::FusedBackward`): `act(gate)·up` is made in the kernel of its own backward, beside the
    /// recomputed gate and up outputs, `down`'s input gradient and both input gradients — six
    /// `[b·s, ffn]` buffers (where the eager node order held four and `w2`'s weight gradient). With
    /// peft LoRA on every linear the kernel also reads the adapters' outputs and writes their
    /// gradients: eleven (the CPU record's `cpp_fused_…_silu_backward` kernel).
    #[test]
    fn a_compiled_checkpointed_feed_forward_holds_six_ffn_buffers_at_once_and_eleven_with_lora_on_every_linear() {
        let base = Config { recompute: Recompute::Full, compile: true, batch: 1, seq: 512, ..Config::default() };
        assert_eq!(ffn_buffers_at_once(&base), 6);
        let lora = Config {
            finetune: crate::estimator::config::Finetune::Lora,
            lora_targets: crate::estimator::config::LoraTargets::ALL,
            precision: crate::estimator::config::Precision::Fp32,
            ..base.clone()
        };
        assert_eq!(ffn_buffers_at_once(&lora), 11);
    }

    /// torchtune's order (the checkpoint around each compiled layer) with its LoRA on every
    /// linear (FINDINGS §15.1, "torchtune's compiled LoRA and QLoRA with checkpointing"): the
    /// re-run keeps the saved gate and up sums, and the SiLU·mul backward kernel reads w2's two
    /// input gradients apart and writes four gradients, three as new buffers — seven at once
    /// (`frameworks/steps/…compile=layer+recompute=full__lora-r8-all.json`).
    #[test]
    fn torchtunes_compiled_checkpointed_feed_forward_with_lora_on_every_linear_holds_seven_ffn_buffers_at_once() {
        use crate::estimator::config::{Finetune, Framework, LoraDtype, LoraTargets, Loss, Precision};
        let c = Config {
            recompute: Recompute::Full,
            compile: true,
            batch: 1,
            seq: 512,
            framework: Framework::Torchtune,
            loss: Loss::Chunked,
            finetune: Finetune::Lora,
            lora_targets: LoraTargets::ALL,
            lora_dtype: LoraDtype::Model,
            precision: Precision::Bf16,
            ..Config::default()
        };
        assert_eq!(ffn_buffers_at_once(&c), 7);
        // When w2's adapter writes its input gradient (its `lora_A`'s, `[b·s, ffn]`), the re-run
        // holds the two sums and act(gate)·up — three, where the inside rule held five (the four
        // matmul outputs the sums add, and act(gate)·up).
        use crate::estimator::step::{EventKind, Phase};
        let s = crate::estimator::step_stream(&c).expect("estimated");
        let ffn = 2 * (c.batch * c.seq) as u128 * c.arch.ffn as u128;
        let mut alive: Vec<u32> = Vec::new();
        let mut at_adapter = None;
        for e in s.events.iter().filter(|e| e.bytes == ffn && e.phase == Phase::Backward && e.layer == Some(0)) {
            match e.kind {
                EventKind::Alloc if e.module == "lora_A" => {
                    at_adapter = Some(alive.len());
                    break;
                }
                EventKind::Alloc => alive.push(e.id),
                _ => alive.retain(|&id| id != e.id),
            }
        }
        assert_eq!(at_adapter, Some(3));
    }

    #[test]
    fn a_compiled_checkpointed_llama_keeps_less_than_eager_checkpointing_and_the_unmeasured_combinations_are_refused_by_name() {
        let of = |recompute: Recompute, compile: bool| Config { recompute, compile, ..Config::default() };
        let act = |c: &Config| estimate(c).expect("estimated").memory.activations;
        // Full: the layer inputs alone cross; op: the policy's saved matmuls the backward reaches
        // (not down_proj's output, which eager selective checkpointing caches).
        let (full, op) = (act(&of(Recompute::Full, true)), act(&of(Recompute::Op, true)));
        assert!(full < op, "{full} vs {op}");
        assert!(op < act(&of(Recompute::Op, false)));
        assert!(full <= act(&of(Recompute::Full, false)));
        // Every-N checkpointing and Megatron's selective recomputation under compile: not measured.
        let every = Config { recompute_every: 2, ..of(Recompute::None, true) };
        let selective = of(Recompute::Selective, true);
        for c in [every, selective] {
            let err = estimate(&c).expect_err("refused").to_string();
            assert!(err.contains("not modelled yet"), "{err}");
        }
        // A family measured compiled whose checkpointed layers are not matched (Llama 4: its
        // step peaks inside a compiled backward, FINDINGS §15.1).
        let id = "llama-4-scout-17b-16e-instruct";
        let l4 = Config { model: id.into(), arch: preset(id).expect("preset").spec, ..of(Recompute::Full, true) };
        let err = estimate(&l4).expect_err("refused").to_string();
        assert!(err.contains("checkpointed layers") && err.contains("Llama4"), "{err}");
    }
}
