//! Runs a [`Program`] forward and backward, allocation by allocation, the way PyTorch's eager
//! mode and autograd engine do:
//!
//! - **forward**: each op allocates its outputs (views share their base's storage); a storage
//!   is freed after the op where its last reader ran and the Python name holding it let go,
//!   unless an autograd node saved it (then it lives until that node has run);
//! - **checkpointing** (`torch.utils.checkpoint`, non-reentrant): inside a region the forward
//!   saves nothing; the region keeps its inputs and keyword arguments. In backward, just before
//!   the node of the region's last saving op, the region's forward runs again up to that op
//!   (`torch/utils/checkpoint.py`, `_checkpoint_hook` with early stop), now saving; what the
//!   re-run holds beyond that op is dropped at the stop. The region's holds are released once
//!   its first saving op's node has run (its last saved tensor unpacked);
//! - **backward**: nodes run in reverse forward order (the engine's ready queue orders by
//!   sequence number, `torch/csrc/autograd/engine.cpp`); each node runs its script (what its
//!   formula allocates, `tools/autograd/derivatives.yaml`), then drops its incoming gradients,
//!   then releases its saved tensors, then hands its gradients to its inputs' buffers. A second
//!   gradient for the same tensor is added out of place (`InputBuffer::accumulate`: under a
//!   `TorchDispatchMode`, as the validation tracker runs, `isTensorSubclassLike` is true and the
//!   in-place branch is never taken); without a tracker it is added in place when the old buffer
//!   is the only reference. A parameter's first gradient is stolen by AccumulateGrad
//!   (`accumulate_grad.h`, Case 1.1); later ones are added (Case 2.3, in place; out of place
//!   under the tracker).

use super::ir::{Compiled, DType, Origin, Program, Tid, B, FOREVER, FWD_END, MODEL, NO_OP};
use super::stream::{Cat, Phase};

/// Where an allocation happens (for events and the peak's label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    pub phase: Phase,
    pub layer: u16,
    pub module: &'static str,
    pub op: &'static str,
    pub node: &'static str,
}

/// Receives the allocations and frees of a run.
pub trait Sink {
    /// A new storage; returns its id.
    fn alloc(&mut self, bytes: u128, dtype: DType, cat: Cat, at: &At) -> u32;
    /// A storage freed.
    fn free(&mut self, id: u32, bytes: u128, cat: Cat, at: &At);
    /// A live storage changes category (a gradient handed to `AccumulateGrad` becomes the
    /// parameter's `.grad`).
    fn recat(&mut self, _id: u32, _bytes: u128, _from: Cat, _to: Cat) {}
}

/// How gradients are accumulated (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accumulate {
    /// Out of place, always (under the validation tracker's dispatch mode).
    OutOfPlace,
    /// In place when the buffer is the only reference (plain eager training).
    InPlace,
}

/// How FSDP2 keeps a gradient it does not reduce yet (torchtitan under pipeline parallelism,
/// [`crate::estimator::sharding::keeps_stage_gathered`]): with `reduce_dtype` fp32 and
/// `set_requires_gradient_sync(False)`, each unit's `post_backward` turns the parameters'
/// 16-bit `.grad` into an fp32 `unsharded_accumulated_grad` (torch 2.15
/// `distributed/fsdp/_fully_shard/_fsdp_param.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upcast {
    /// The step's first backward: `to_accumulated_grad_if_needed` —
    /// `unsharded_accumulated_grad = grad.to(fp32)`, kept to the step's end, the 16-bit
    /// gradient freed.
    Kept,
    /// A later backward, the accumulators resident: `accumulate_unsharded_grad_if_needed` —
    /// `unsharded_accumulated_grad += grad`, whose type promotion casts the 16-bit gradient to
    /// an fp32 temporary first (measured: 1,048,576 B for the 4096 × 64 embedding's,
    /// `tests/fixtures/pytorch/fsdp/pp.json`), freed with it.
    Added,
}

/// Bytes of one fp32 element: FSDP2's `reduce_dtype` under torchtitan's mixed precision.
const FP32_BYTES: u128 = 4;

/// The optimizer step inside backward (`optim_in_bwd`, torchtune 0.6.1
/// `training/memory.py` `register_optim_in_bwd_hooks`): each trainable parameter has its own
/// optimizer, stepped in a post-accumulate-grad hook once its gradient is complete, then
/// `zero_grad(set_to_none=True)` frees the gradient. AdamW's step on one parameter allocates
/// `temps` temporaries of `numel × state_bytes` (for-loop: `exp_avg_sq.sqrt()` and its division,
/// freed when the step returns; foreach: one; fused: none) — [`super::model::optimizer_events`]
/// for a single parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepHook {
    pub state_bytes: u64,
    pub temps: u8,
}

/// Activation offloading through saved-tensor hooks (`act_offload`, validation/FINDINGS.md
/// §15.5): which saved tensors move to pinned host memory in forward, and how backward brings
/// them back.
///
/// - **torchtune** 0.6.1 `training/_activation_offloading.py` `OffloadActivations`
///   (`use_streams=True`, `max_fwd_stash_size=5`, `min_offload_size=1024`): packs the model
///   call's saved tensors (not the output head's: `NoOpManager`; not the loss's: computed outside
///   the context). `pack_tensor` moves a tensor iff `numel·element_size ≥ 1024` and it is not an
///   `nn.Parameter` instance (a Linear's saved weight is `weight.t()`, a view: it moves; a norm's
///   weight is the Parameter: it stays). Each moved tensor's device original stays in the
///   `fwd_stash` until a later moved pack's id is 5 past its own (or backward's first hook
///   clears it). In backward a node unpacking a moved tensor copies it back (`.to("cuda")`, its
///   own size) unless the stash still has the original; the copies live until the next such
///   node has run (its hook deletes the previous node's), the last ones until backward ends.
/// - **save_on_cpu** (`torch.autograd.graph.save_on_cpu(pin_memory=True)`, torch 2.15
///   `autograd/graph.py`) around the whole model call with HF's loss: every saved tensor moves;
///   each node's unpacked copies live while it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offload {
    pub kind: crate::estimator::config::ActOffload,
    /// GPT-2's `Conv1D` (`addmm(bias, x, weight)` with `[in, out]` weights) saves the Parameter
    /// itself, not a `t()` view: torchtune keeps it.
    pub addmm_saves_parameter: bool,
    /// gpt-oss's experts (`_grouped_mm` with `[E, in, out]` weights) save the Parameter itself.
    pub grouped_mm_saves_parameter: bool,
}

/// torchtune's `min_offload_size`: smaller saved tensors stay on the device.
pub const MIN_OFFLOAD_BYTES: u128 = 1024;
/// torchtune's `max_fwd_stash_size`: a moved tensor's original is dropped from the stash when a
/// later moved pack's id is this far past its own.
pub const MAX_FWD_STASH: i64 = 5;

impl Offload {
    fn torchtune(&self) -> bool {
        self.kind == crate::estimator::config::ActOffload::Torchtune
    }
    /// Whether op `i`'s saved tensors go through the hooks at all: torchtune's context is the
    /// model call without the output head (`NoOpManager` around `lm_head`) and without the loss.
    pub fn packs(&self, p: &Program, i: usize) -> bool {
        if !self.torchtune() {
            return true;
        }
        let op = &p.ops[i];
        (i as u32) < p.loss_fn_from && !(op.module == "lm_head" || op.module.starts_with("lm_head."))
    }
    /// Whether the saved reference `s` of op `i` moves to the host (given that the op packs).
    pub fn moves(&self, p: &Program, i: usize, t: Tid) -> bool {
        if !self.torchtune() {
            return true;
        }
        let x = &p.tensors[t as usize];
        if x.bytes < MIN_OFFLOAD_BYTES {
            return false;
        }
        match x.origin {
            // The Parameter object itself (a norm's weight, GPT-2's Conv1D, gpt-oss's and Llama 4's
            // experts) stays; a Linear's `weight.t()` (and the MoE experts' transposed views) moves,
            // and so does a depthwise `nn.Conv1d`'s weight `[C, 1, K]` (Mamba-2's, the gated
            // DeltaNet's and KDA's short convolutions): ConvolutionBackward0 saves a view of it,
            // not the Parameter (measured: `parameter (view)`, offloaded).
            Origin::Param { .. } => match p.ops[i].name {
                "mm" | "convolution" => true,
                "addmm" => !self.addmm_saves_parameter,
                "_grouped_mm" => !self.grouped_mm_saves_parameter,
                _ => false,
            },
            _ => true,
        }
    }
}

/// The bytes a program's forward pass copies to the host under `off`: every moved save, each
/// at its own size (views of one storage are copied separately).
pub fn offloaded_bytes(p: &Program, off: &Offload) -> u128 {
    let mut total = 0;
    for (i, op) in p.ops.iter().enumerate() {
        if op.saved.1 + op.dead == 0 || !off.packs(p, i) || p.regions.iter().any(|r| (r.first as usize..r.end as usize).contains(&i)) {
            continue;
        }
        for s in p.saved(op).iter().chain(p.dead(op)) {
            if off.moves(p, i, s.t) {
                total += p.tensors[s.t as usize].bytes;
            }
        }
    }
    total + offloaded_checkpoint_inputs(p, off)
}

/// The bytes of the checkpoints' positional inputs a program's forward copies to the host: each
/// region's first [`super::ir::Region::inputs`] held tensors, packed by the outer hooks at the
/// checkpoint call (torch 2.15 `utils/checkpoint.py` `_checkpoint_without_reentrant_generator`:
/// `new_frame.save_inputs(*args)` before `with _checkpoint_hook(new_frame)`) and moved by the
/// same rule as any save ([`Offload::moves`]: torchtune's ≥ 1,024 B and not a Parameter;
/// `save_on_cpu`: all). What the region saves inside goes to the checkpoint's own frame hook:
/// never offloaded.
pub fn offloaded_checkpoint_inputs(p: &Program, off: &Offload) -> u128 {
    let mut total = 0;
    for r in &p.regions {
        let i = r.first as usize;
        if i >= p.ops.len() || !off.packs(p, i) {
            continue;
        }
        for s in r.held.iter().take(r.inputs as usize) {
            if off.moves(p, i, s.t) {
                total += p.tensors[s.t as usize].bytes;
            }
        }
    }
    total
}

/// A compiled region's brought-back copies (stream id, bytes) and checkpoint inputs (storages),
/// released when its whole backward has run ([`OffState::deferred`]).
type Deferred = (Vec<(u32, u128)>, Vec<usize>);

/// A run's offloading state (see [`Offload`]).
#[derive(Default)]
struct OffState {
    /// torchtune's `tensor_id` of the last pack.
    next_id: i64,
    /// Per save (index into `Program::saves`): whether it moved, and its pack id.
    moved: Vec<bool>,
    id: Vec<i64>,
    /// `fwd_stash`: (pack id, storage).
    stash: Vec<(i64, u32)>,
    /// `bwd_tensor_stash`: the copies brought back by the last node that unpacked a moved
    /// tensor (stream id, bytes).
    held: Vec<(u32, u128)>,
    /// Per checkpoint region, per positional input: the pack id of a moved input (0: kept on the
    /// device as a saved reference).
    region_ids: Vec<Vec<i64>>,
    /// The checkpoint inputs brought back by the last node that triggered a recomputation and
    /// whose copy no recomputed save references (torchtune's `bwd_tensor_stash`): storages.
    held_inputs: Vec<usize>,
    /// A compiled region's recomputation trigger: its copies and inputs brought back, whose hook
    /// runs once the region's whole backward has (one `CompiledFunctionBackward` node).
    deferred: Option<Deferred>,
    /// Host bytes alive now, at most, and copied in forward.
    host: u128,
    host_peak: u128,
    copied: u128,
}

/// A gradient buffer.
#[derive(Clone, Copy, Debug)]
struct GBuf {
    id: u32,
    bytes: u128,
    refs: u16,
    cat: Cat,
}

const NONE: u32 = u32::MAX;

/// Which part of an op's node [`Run::node`] runs ([`super::ir::FusedBackward`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// All of it.
    Whole,
    /// A matmul's input gradient, its incoming gradient and saves kept.
    Inputs,
    /// That matmul's weight gradient, then its incoming gradient and saves released.
    Weights,
    /// The formula, its incoming gradient and saves kept (a fused kernel's head).
    Script,
    /// The head's incoming gradient and saves released.
    Release,
    /// Nothing but the recomputation trigger: a cast inside a fused kernel, whose incoming
    /// gradient the kernel reads as it is (released with [`Part::Release`]).
    Read,
}

/// A run of one program.
pub struct Run<'p, S: Sink> {
    pub p: &'p Program,
    pub sink: S,
    accumulate: Accumulate,
    backward: bool,
    /// Gradients exist before this micro-batch (accumulation): AccumulateGrad adds in place.
    resident_grads: bool,
    /// FSDP2's fp32 accumulation of unreduced gradients ([`Upcast`]).
    upcast: Option<Upcast>,
    /// Inputs whose freeing this run decides instead of their origin ([`Run::set_input`]).
    inputs: Vec<(u32, bool, bool)>,
    b: Buffers,
    /// `optim_in_bwd`: the hook, and per parameter the gradient deliveries still to come
    /// (a parameter whose count is `u16::MAX` is stepped by another program: a tied head).
    hook: Option<StepHook>,
    remaining: Vec<u16>,
    off: Option<Offload>,
    os: OffState,
    /// Transformer Engine's per-layer offloading ([`super::te_offload`]).
    te: Option<Box<TeRun>>,
    /// Per FSDP unit of the program ([`super::ir::Unit`]): the stream ids of its gathered
    /// parameters and of its unsharded gradient while alive.
    units: Vec<[u32; 3]>,
    /// Per FSDP unit: the unit before it in forward order ([`Unit::flat`]: what its backward
    /// prefetches), or `NONE`.
    prev_unit: Vec<u32>,
    /// Which units act at each op ([`UnitIndex`]).
    unit_at: UnitIndex,
    /// In forward, the flat all-gather output whose free FSDP2 defers to the next all-gather
    /// (stream id and bytes), or `NONE`.
    pending_flat: (u32, u128),
    /// How many gradients each unit's `grad_param` has received ([`Unit::grad_param`]).
    unit_arrivals: Vec<u8>,
    /// [`Run::node`]'s scratch: its temporaries and the gradients it delivers.
    temps: Vec<u32>,
    deliver: Vec<(Tid, u32)>,
    /// While a [`super::ir::FusedBackward`]'s late matmuls run: the head's output, whose
    /// gradient parts its kernel reads apart (not summed first), and those held parts.
    fusing: Option<Tid>,
    fused_grads: Vec<u32>,
}

/// A run's per-layer offloading state ([`super::te_offload`]): the layers' groups, the layer
/// whose forward runs, the layer whose backward runs.
struct TeRun {
    lo: super::te_offload::LayerOffload,
    producer: Vec<u32>,
    groups: Vec<TeGroup>,
    fwd_layer: u16,
    bwd_layer: u16,
}

/// One offloaded layer: the storages its pushed saves hold on the device until released (one
/// reference each), the tensors it copies to the host (`_deduplicate_tensors`: each once; see
/// [`super::te_offload::LayerOffload::unit`]), and the device copies its reload made.
#[derive(Default)]
struct TeGroup {
    held: Vec<usize>,
    units: Vec<Tid>,
    reloaded: Vec<(u32, u128)>,
    host: u128,
}

/// The bytes of a unit's slot in [`Run::units`]: its gathered parameters, its gradient.
const UNIT_PARAMS: usize = 0;
const UNIT_GRAD: usize = 1;
/// A unit's flat all-gather output, in backward while prefetched ([`Unit::flat`]).
const UNIT_FLAT: usize = 2;

/// The buffers of a [`Run`], kept between runs on this thread ([`Run::recycle`]): the
/// piecewise peak runs four small programs per estimate, and allocating some twenty vectors for
/// each cost more than running them.
#[derive(Default)]
struct Buffers {
    // Storages (indexed by base tensor).
    alive: Vec<bool>,
    sid: Vec<u32>,
    saves: Vec<u16>,
    fwd_over: Vec<bool>,
    end: Vec<u32>,
    cat: Vec<Cat>,
    // Gradients.
    grad: Vec<u32>,
    bufs: Vec<GBuf>,
    /// Parameter gradients held (AccumulateGrad), by parameter tensor.
    pgrad: Vec<u32>,
    /// Frees after each forward op (storage ids), CSR.
    frees_at: Vec<u32>,
    frees: Vec<Tid>,
    /// Region of each op, or NONE.
    region_of: Vec<u32>,
    /// Per region: its first and last saving ops (NONE when it saves nothing).
    region_first_save: Vec<u32>,
    region_last_save: Vec<u32>,
    recomputed: Vec<bool>,
    injected: Vec<u32>,
    /// Ops whose node never ran in backward but saved tensors (freed with the graph).
    skipped: Vec<usize>,
    /// Storages held until the forward pass ends.
    fwd_end: Vec<bool>,
    /// The free lists' fill counters while [`Run::new`] builds them.
    counts: Vec<u32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Option<Buffers>> = const { std::cell::RefCell::new(None) };
}

/// Which FSDP units act at each op, so that a run looks at those alone (a 70B model has some
/// ninety units and some ten thousand ops): those starting there (gathered in forward,
/// resharded after backward), resharded after forward there, whose range covers it (gathered
/// again in backward: inner ones, starting later, first), whose gradient its node makes.
#[derive(Default)]
struct UnitIndex {
    starts: OpLists,
    resharded: OpLists,
    cover: OpLists,
    grads: OpLists,
    /// The last forward op of any unit resharded after forward (`NO_OP`: none).
    last_fwd: u32,
}

/// Lists of unit indices by op, compressed (`items[offsets[i]..offsets[i + 1]]`: op `i`'s).
#[derive(Default)]
struct OpLists {
    offsets: Vec<u32>,
    items: Vec<u32>,
}

impl OpLists {
    /// From `(op, unit)` pairs, each op's units in the order given; ops past `n` dropped.
    fn new(n: usize, pairs: &[(usize, u32)]) -> OpLists {
        let mut offsets = vec![0u32; n + 2];
        for &(i, _) in pairs.iter().filter(|p| p.0 <= n) {
            offsets[i + 1] += 1;
        }
        for i in 0..=n {
            offsets[i + 1] += offsets[i];
        }
        let mut fill = offsets.clone();
        let mut items = vec![0u32; offsets[n + 1] as usize];
        for &(i, k) in pairs.iter().filter(|p| p.0 <= n) {
            items[fill[i] as usize] = k;
            fill[i] += 1;
        }
        OpLists { offsets, items }
    }

    /// The positions in `items` of op `i`'s units.
    fn range(&self, i: usize) -> std::ops::Range<usize> {
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&a), Some(&b)) => a as usize..b as usize,
            _ => 0..0,
        }
    }
}

impl UnitIndex {
    fn new(units: &[super::ir::Unit], n: usize) -> UnitIndex {
        if units.is_empty() {
            return UnitIndex { last_fwd: NO_OP, ..UnitIndex::default() };
        }
        let idx = |k: usize| k as u32;
        let starts: Vec<(usize, u32)> = units.iter().enumerate().map(|(k, u)| (u.first as usize, idx(k))).collect();
        let resharded: Vec<(usize, u32)> =
            units.iter().enumerate().filter(|(_, u)| u.fwd_last != NO_OP).map(|(k, u)| (u.fwd_last as usize + 1, idx(k))).collect();
        let grads: Vec<(usize, u32)> =
            units.iter().enumerate().filter(|(_, u)| u.grad_op != NO_OP).map(|(k, u)| (u.grad_op as usize, idx(k))).collect();
        let mut inner: Vec<usize> = (0..units.len()).collect();
        inner.sort_by_key(|&k| std::cmp::Reverse(units[k].first));
        let mut cover = Vec::new();
        for k in inner.into_iter().filter(|&k| units[k].fwd_last != NO_OP) {
            let u = &units[k];
            cover.extend((u.first as usize..=(u.fwd_last as usize).min(n)).map(|i| (i, idx(k))));
        }
        // Each op's covering units, inner first: stable by op.
        cover.sort_by_key(|&(i, _)| i);
        UnitIndex {
            starts: OpLists::new(n, &starts),
            resharded: OpLists::new(n, &resharded),
            cover: OpLists::new(n, &cover),
            grads: OpLists::new(n, &grads),
            last_fwd: units.iter().filter(|u| u.fwd_last != NO_OP).map(|u| u.fwd_last).max().unwrap_or(NO_OP),
        }
    }
}

/// For each FSDP unit, the unit whose `post_forward` comes just before its own (the units
/// resharded after forward, in the order of their last forward op), or `NONE`: what its
/// backward prefetches ([`Unit::flat`]).
fn forward_predecessors(units: &[super::ir::Unit]) -> Vec<u32> {
    let mut order: Vec<usize> = (0..units.len()).filter(|&k| units[k].fwd_last != NO_OP).collect();
    // Of two units ending at one op, the inner one (starting later) finishes first.
    order.sort_by_key(|&k| (units[k].fwd_last, std::cmp::Reverse(units[k].first)));
    let mut prev = vec![NONE; units.len()];
    for w in order.windows(2) {
        prev[w[1]] = w[0] as u32;
    }
    prev
}

/// `v` emptied, then `n` copies of `x`.
fn filled<T: Clone>(mut v: Vec<T>, n: usize, x: T) -> Vec<T> {
    v.clear();
    v.resize(n, x);
    v
}

impl<'p, S: Sink> Run<'p, S> {
    pub fn new(p: &'p Program, sink: S, accumulate: Accumulate) -> Self {
        let sc = SCRATCH.with(|c| c.borrow_mut().take()).unwrap_or_default();
        let n = p.tensors.len();
        let nops = p.ops.len();
        let mut end = filled(sc.end, n, 0u32);
        let mut fwd_end = filled(sc.fwd_end, n, false);
        for t in &p.tensors {
            let b = t.base as usize;
            if t.hold == FWD_END {
                fwd_end[b] = true;
            }
            end[b] = end[b].max(if t.hold == FWD_END { FOREVER } else { t.hold.max(t.last_use) });
        }
        let mut region_of = filled(sc.region_of, nops, NONE);
        let mut region_first_save = filled(sc.region_first_save, p.regions.len(), NONE);
        let mut region_last_save = filled(sc.region_last_save, p.regions.len(), NONE);
        for (r, reg) in p.regions.iter().enumerate() {
            for i in reg.first..reg.end {
                region_of[i as usize] = r as u32;
                if p.ops[i as usize].saved.1 > 0 {
                    if region_first_save[r] == NONE {
                        region_first_save[r] = i;
                    }
                    region_last_save[r] = i;
                }
            }
        }
        // Which storages are activations (kept for backward) in the forward pass.
        let mut cat = filled(sc.cat, n, Cat::Transient);
        for (i, op) in p.ops.iter().enumerate() {
            if region_of[i] == NONE {
                for s in p.saved(op) {
                    cat[p.tensors[s.t as usize].base as usize] = Cat::Activations;
                }
            }
        }
        for reg in &p.regions {
            for s in reg.held.iter().chain(&reg.cached) {
                cat[p.tensors[s.t as usize].base as usize] = Cat::Activations;
            }
        }
        // Free lists per op (CSR: `frees_at[i]..frees_at[i + 1]` are freed after op i).
        let mut counts = filled(sc.counts, nops + 1, 0u32);
        for (b, &e) in end.iter().enumerate() {
            if p.tensors[b].base as usize == b && e != FOREVER && (e as usize) < nops {
                counts[e as usize] += 1;
            }
        }
        let mut frees_at = filled(sc.frees_at, nops + 1, 0u32);
        for i in 0..nops {
            frees_at[i + 1] = frees_at[i] + counts[i];
        }
        // `counts` becomes each op's next free slot.
        counts[..=nops].copy_from_slice(&frees_at);
        let mut frees = filled(sc.frees, frees_at[nops] as usize, 0 as Tid);
        for (b, &e) in end.iter().enumerate() {
            if p.tensors[b].base as usize == b && e != FOREVER && (e as usize) < nops {
                frees[counts[e as usize] as usize] = b as Tid;
                counts[e as usize] += 1;
            }
        }
        let mut alive = filled(sc.alive, n, false);
        for (i, t) in p.tensors.iter().enumerate() {
            if t.base as usize == i && t.origin != Origin::Op {
                alive[i] = true;
            }
        }
        let mut bufs = sc.bufs;
        bufs.clear();
        let mut injected = sc.injected;
        injected.clear();
        let mut skipped = sc.skipped;
        skipped.clear();
        let b = Buffers {
            alive,
            sid: filled(sc.sid, n, NONE),
            saves: filled(sc.saves, n, 0),
            fwd_over: filled(sc.fwd_over, n, false),
            end,
            cat,
            grad: filled(sc.grad, n, NONE),
            bufs,
            pgrad: filled(sc.pgrad, n, NONE),
            frees_at,
            frees,
            region_of,
            region_first_save,
            region_last_save,
            recomputed: filled(sc.recomputed, p.regions.len(), false),
            injected,
            skipped,
            fwd_end,
            counts,
        };
        Run {
            p,
            sink,
            accumulate,
            backward: false,
            resident_grads: false,
            upcast: None,
            inputs: Vec::new(),
            b,
            hook: None,
            remaining: Vec::new(),
            off: None,
            os: OffState::default(),
            te: None,
            units: vec![[NONE; 3]; p.units.len()],
            prev_unit: forward_predecessors(&p.units),
            unit_at: UnitIndex::new(&p.units, p.ops.len()),
            pending_flat: (NONE, 0),
            unit_arrivals: vec![0; p.units.len()],
            temps: Vec::with_capacity(8),
            deliver: Vec::with_capacity(8),
            fusing: None,
            fused_grads: Vec::new(),
        }
    }

    /// FSDP2's pre-forward of the units that start at op `i`: their parameters all-gathered
    /// (`FSDP::all_gather_copy_out`, the parameter dtype).
    fn gather_units(&mut self, i: usize, at: &At) {
        for j in self.unit_at.starts.range(i) {
            let k = self.unit_at.starts.items[j] as usize;
            let u = self.p.units[k];
            if self.units[k][UNIT_PARAMS] == NONE {
                if u.flat > 0 {
                    // The flat output, then the previous unit's deferred one goes.
                    let flat = self.sink.alloc(u.flat, u.param_dtype, Cat::Gathered, &At { op: "FSDP::all_gather", ..*at });
                    self.release_pending_flat(&At { op: "FSDP::pre_forward", ..*at });
                    self.pending_flat = (flat, u.flat);
                }
                let a = At { op: "FSDP::all_gather_copy_out", ..*at };
                self.units[k][UNIT_PARAMS] = self.sink.alloc(u.params, u.param_dtype, Cat::Gathered, &a);
            }
        }
    }

    /// The deferred flat all-gather output of forward goes ([`Unit::flat`]).
    fn release_pending_flat(&mut self, at: &At) {
        let (id, bytes) = std::mem::replace(&mut self.pending_flat, (NONE, 0));
        if id != NONE {
            self.sink.free(id, bytes, Cat::Gathered, at);
        }
    }

    /// FSDP2's `post_forward` of the units resharded after forward whose last forward op is
    /// the one before op `i` (`Unit::fwd_last`): their gathered parameters go.
    fn reshard_units_after_forward(&mut self, i: usize, at: &At) {
        for j in self.unit_at.resharded.range(i) {
            let k = self.unit_at.resharded.items[j] as usize;
            self.release_unit_params(k, &At { op: "FSDP::post_forward", ..*at });
            // The model's forward ends with the last unit's: the deferred output goes.
            if self.p.units[k].fwd_last == self.unit_at.last_fwd {
                self.release_pending_flat(&At { op: "FSDP::post_forward", ..*at });
            }
        }
    }

    /// FSDP2's `pre_backward` of a unit resharded after forward: backward reaching one of its
    /// ops (op `i`, at or before `Unit::fwd_last`) all-gathers its parameters again.
    fn regather_units(&mut self, i: usize, at: &At) {
        // Inner units first: their pre-backward hooks are on the op's own outputs.
        for j in self.unit_at.cover.range(i) {
            let k = self.unit_at.cover.items[j] as usize;
            let u = self.p.units[k];
            if self.units[k][UNIT_PARAMS] == NONE {
                // Its flat output (prefetched, or all-gathered now), the copy-out, the flat
                // output freed; then the unit before it in forward order is prefetched.
                let flat = std::mem::replace(&mut self.units[k][UNIT_FLAT], NONE);
                let flat = if flat == NONE && u.flat > 0 {
                    self.sink.alloc(u.flat, u.param_dtype, Cat::Gathered, &At { op: "FSDP::all_gather", ..*at })
                } else {
                    flat
                };
                let a = At { op: "FSDP::all_gather_copy_out", ..*at };
                self.units[k][UNIT_PARAMS] = self.sink.alloc(u.params, u.param_dtype, Cat::Gathered, &a);
                if flat != NONE {
                    self.sink.free(flat, u.flat, Cat::Gathered, &At { op: "FSDP::pre_backward", ..*at });
                }
                self.prefetch_before(k, at);
            }
        }
    }

    /// FSDP2's backward prefetch (`FSDPParamGroup._backward_prefetch`, torch 2.15): once unit
    /// `k`'s copy-out is done, the unit whose `post_forward` came just before its own is
    /// all-gathered ahead — its flat output allocated, copied out at its own `pre_backward` —
    /// unless it holds the same parameters (one group) or is gathered already.
    fn prefetch_before(&mut self, k: usize, at: &At) {
        let t = self.prev_unit[k];
        if t == NONE {
            return;
        }
        let (t, u) = (t as usize, self.p.units[t as usize]);
        let same_group = self.p.units.iter().enumerate().any(|(j, v)| v.group == u.group && self.units[j][UNIT_PARAMS] != NONE);
        if u.flat == 0 || same_group || self.units[t][UNIT_FLAT] != NONE {
            return;
        }
        self.units[t][UNIT_FLAT] = self.sink.alloc(u.flat, u.param_dtype, Cat::Gathered, &At { op: "FSDP::all_gather", ..*at });
    }

    /// The node of op `i` makes a unit's unsharded gradient (`grad`, parameter dtype), which
    /// AccumulateGrad keeps on the unsharded parameter until the unit's reduce.
    fn unsharded_grads(&mut self, i: usize, at: &At) {
        for j in self.unit_at.grads.range(i) {
            let k = self.unit_at.grads.items[j] as usize;
            let u = self.p.units[k];
            if u.grad > 0 && self.units[k][UNIT_GRAD] == NONE {
                self.units[k][UNIT_GRAD] = self.sink.alloc(u.grad, u.param_dtype, Cat::Gathered, at);
            }
        }
    }

    /// FSDP2's `post_backward` of the units that start at op `i`, once backward has passed it:
    /// `post_backward_reshard` frees the gathered parameters, then `foreach_reduce` allocates
    /// the fp32 reduce-scatter input, copies the unsharded gradient in and frees it; the input
    /// goes once the reduce-scatter is waited on (FSDP2 keeps it to the next unit's reduce;
    /// here it goes with this one). The sharded gradient is the resident one, or, under
    /// torchtune's recipes ([`Unit::shard_grad`]), the reduce-scatter's output made here.
    fn post_backward_units(&mut self, i: usize, at: &At) {
        for j in self.unit_at.starts.range(i) {
            let k = self.unit_at.starts.items[j] as usize;
            let u = self.p.units[k];
            self.release_unit_params(k, &At { op: "FSDP::post_backward_reshard", ..*at });
            let a = At { op: "FSDP::post_backward_reduce", ..*at };
            let input = (u.reduce_input > 0).then(|| self.sink.alloc(u.reduce_input, DType::Fp32, Cat::Gathered, &a));
            self.release_unit_grad(k, &a);
            if u.shard_grad > 0 {
                // The reduce-scatter's output: the sharded gradient, kept past backward.
                let _kept = self.sink.alloc(u.shard_grad, u.param_dtype, Cat::Gradients, &a);
            }
            if let Some(id) = input {
                self.sink.free(id, u.reduce_input, Cat::Gathered, &a);
            }
        }
    }

    /// Gradient buffer `g` of unit `k`'s parameter arrives ([`Unit::grad_param`]), as
    /// `AccumulateGrad` takes it (torch 2.15 `torch/csrc/autograd/functions/accumulate_grad.h`
    /// `accumulateGrad`): the first is stolen as the unsharded gradient; the second is added out
    /// of place (`grad + new`: the stolen first one is still referenced), the sum replacing it;
    /// later ones in place. Measured on the output unit's 8 chunks (tune.json, `full`): its
    /// gradient from the last chunk's backward to the unit's reduce, one `add` of its size at
    /// the second.
    fn accumulate_unit_grad(&mut self, k: usize, g: u32, at: &At) {
        let u = self.p.units[k];
        self.unit_arrivals[k] = self.unit_arrivals[k].saturating_add(1);
        match self.unit_arrivals[k] {
            1 => {
                self.unref(g, at);
                self.units[k][UNIT_GRAD] = self.sink.alloc(u.grad, u.param_dtype, Cat::Gathered, at);
            }
            2 => {
                let a = At { op: "add", ..*at };
                let sum = self.sink.alloc(u.grad, u.param_dtype, Cat::Gathered, &a);
                self.unref(g, at);
                self.release_unit_grad(k, &a);
                self.units[k][UNIT_GRAD] = sum;
            }
            _ => self.unref(g, at),
        }
    }

    fn release_unit_params(&mut self, k: usize, at: &At) {
        let id = std::mem::replace(&mut self.units[k][UNIT_PARAMS], NONE);
        if id != NONE {
            self.sink.free(id, self.p.units[k].params, Cat::Gathered, at);
        }
    }

    fn release_unit_grad(&mut self, k: usize, at: &At) {
        let id = std::mem::replace(&mut self.units[k][UNIT_GRAD], NONE);
        if id != NONE {
            self.sink.free(id, self.p.units[k].grad, Cat::Gathered, at);
        }
    }

    /// Units whose post-backward never ran (no gradient reached them) are resharded when
    /// backward ends.
    fn release_units(&mut self, at: &At) {
        for k in 0..self.p.units.len() {
            self.release_unit_params(k, at);
            self.release_unit_grad(k, at);
            let flat = std::mem::replace(&mut self.units[k][UNIT_FLAT], NONE);
            if flat != NONE {
                self.sink.free(flat, self.p.units[k].flat, Cat::Gathered, at);
            }
        }
        self.release_pending_flat(at);
    }

    /// Offloads the first layers' saved tensors as Transformer Engine's per-layer context does
    /// ([`super::te_offload`]).
    pub fn layer_offload(&mut self, lo: super::te_offload::LayerOffload) {
        self.os.moved = vec![false; self.p.saves.len()];
        self.te = Some(Box::new(TeRun {
            lo,
            producer: super::te_offload::producers(self.p),
            groups: (0..lo.n).map(|_| TeGroup::default()).collect(),
            fwd_layer: MODEL,
            bwd_layer: MODEL,
        }));
    }

    /// `fwd_step` as layer `l` enters: layer `l − 1`'s host copies are made (`start_offload`),
    /// and the group of the layer `l − (L − n)` lets go of its device tensors.
    fn te_enter(&mut self, l: u16, at: &At) {
        let Some(te) = self.te.as_mut() else { return };
        if l == MODEL || l == te.fwd_layer {
            return;
        }
        te.fwd_layer = l;
        if l >= 1 && te.lo.offloads(l - 1) {
            let g = &mut te.groups[(l - 1) as usize];
            g.host = g.units.iter().map(|&u| self.p.tensors[u as usize].bytes).sum();
            self.os.host += g.host;
            self.os.copied += g.host;
            self.os.host_peak = self.os.host_peak.max(self.os.host);
        }
        if let Some(i) = te.lo.released_at(l) {
            for b in std::mem::take(&mut te.groups[i as usize].held) {
                self.b.saves[b] = self.b.saves[b].saturating_sub(1);
                self.try_free(b, at);
            }
        }
    }

    /// Op `i`'s saves (`k` into `Program::saves`; `dead`: a node that dies in forward) as the
    /// layer's hooks push them: a pushed one is the group's reference, not the node's.
    fn te_push(&mut self, i: usize, k: usize, dead: bool) {
        let p = self.p;
        let Some(te) = self.te.as_mut() else { return };
        let l = p.ops[i].layer;
        let t = p.saves[k].t;
        if !te.lo.offloads(l) || !te.lo.pushes(p, &te.producer, &p.ops[i], t) {
            return;
        }
        let b = p.tensors[t as usize].base as usize;
        if dead {
            self.b.saves[b] += 1;
        } else {
            self.os.moved[k] = true;
        }
        let g = &mut te.groups[l as usize];
        g.held.push(b);
        let u = super::te_offload::LayerOffload::unit(p, t);
        if !g.units.contains(&u) {
            g.units.push(u);
        }
    }

    /// `bwd_step` before the first node of layer `l` runs: the previous layer's state goes
    /// (`release_all_memory`), and the layer `l + 1 − (L − n)` is reloaded.
    fn te_backward_enters(&mut self, l: u16, at: &At) {
        let Some(te) = self.te.as_ref() else { return };
        if l == MODEL || l == te.bwd_layer {
            return;
        }
        self.te_release_bwd(at);
        let Some(te) = self.te.as_mut() else { return };
        te.bwd_layer = l;
        if let Some(i) = te.lo.reloaded_at(l) {
            let g = &mut te.groups[i as usize];
            let mut a = *at;
            a.op = "empty_like";
            for &u in &g.units {
                let x = &self.p.tensors[u as usize];
                let sid = self.sink.alloc(x.bytes, x.dtype, Cat::Activations, &a);
                g.reloaded.push((sid, x.bytes));
            }
        }
    }

    /// `release_all_memory` of the layer whose backward ran last (`finish_part_of_bwd` when
    /// backward ends): its reloaded copies and its host buffers.
    fn te_release_bwd(&mut self, at: &At) {
        let Some(te) = self.te.as_mut() else { return };
        let prev = te.bwd_layer;
        if !te.lo.offloads(prev) {
            return;
        }
        let g = &mut te.groups[prev as usize];
        for (sid, bytes) in std::mem::take(&mut g.reloaded) {
            self.sink.free(sid, bytes, Cat::Activations, at);
        }
        self.os.host = self.os.host.saturating_sub(std::mem::take(&mut g.host));
    }

    /// Offloads saved tensors as `off` says ([`Offload`]).
    pub fn offload(&mut self, off: Offload) {
        self.off = Some(off);
        self.os.moved = vec![false; self.p.saves.len()];
        self.os.id = vec![0; self.p.saves.len()];
        self.os.region_ids = self.p.regions.iter().map(|r| vec![0; r.inputs as usize]).collect();
    }

    /// Whether region `r`'s ops are a compiled region (torchtune's compiled layer inside its
    /// checkpoint): its backward is one node.
    fn region_compiled(&self, r: usize) -> bool {
        let reg = &self.p.regions[r];
        self.p.ops.get(reg.first as usize).is_some_and(|o| o.compiled != Compiled::No)
    }

    /// Whether region `r`'s `k`-th held tensor is a positional input moved to the host.
    fn input_moved(&self, r: usize, k: usize) -> bool {
        self.os.region_ids.get(r).and_then(|v| v.get(k)).is_some_and(|&id| id != 0)
    }

    /// Packs region `r`'s `k`-th positional input at the checkpoint call (`_CheckpointFrame.
    /// save_inputs` under the outer hooks, torch 2.15 `utils/checkpoint.py`): a pack id like
    /// any save; kept as a saved reference, or copied to the host ([`Run::copy_out`]: torchtune
    /// stashes the original, `save_on_cpu` lets forward free it).
    fn pack_input(&mut self, r: usize, k: usize, off: Offload, at: &At) {
        let p = self.p;
        let reg = &p.regions[r];
        let t = reg.held[k].t;
        let b = p.tensors[t as usize].base as usize;
        self.os.next_id += 1;
        let id = self.os.next_id;
        if !off.moves(p, reg.first as usize, t) {
            self.b.saves[b] += 1;
            return;
        }
        self.os.region_ids[r][k] = id;
        self.os.host += p.tensors[t as usize].bytes;
        self.copy_out(t, id, off, at);
    }

    /// The recomputation of region `r` unpacks its moved positional inputs (`frame.get_inputs()`
    /// in `_checkpoint_hook.unpack_hook`) through the outer hook, inside the node that triggers
    /// it: torchtune takes the original if the `fwd_stash` still has it, else it copies the host
    /// tensor back (`.to("cuda")`, its own size); `save_on_cpu` always copies. The copy stands
    /// for the input's storage again (the re-run reads and saves it as the forward did), one
    /// reference held by the hook. Returns whether any input was moved, and the storages
    /// brought back.
    fn unpack_inputs(&mut self, r: usize, copies: &mut Vec<(u32, u128)>, at: &At) -> (bool, Vec<usize>) {
        let p = self.p;
        let mut any = false;
        let mut back = Vec::new();
        for k in 0..p.regions[r].inputs as usize {
            if !self.input_moved(r, k) {
                continue;
            }
            any = true;
            let t = p.regions[r].held[k].t;
            let b = p.tensors[t as usize].base as usize;
            self.os.host = self.os.host.saturating_sub(p.tensors[t as usize].bytes);
            let id = self.os.region_ids[r][k];
            if self.off.is_some_and(|o| o.torchtune()) && self.os.stash.iter().any(|e| e.0 == id) {
                continue;
            }
            let mut a = *at;
            a.op = "_to_copy";
            if self.b.alive[b] {
                // Still held by someone else: the copy is a storage of its own, read by the
                // re-run in its place; it lives as the hook's (no recomputed save names it).
                let sid = self.sink.alloc(p.tensors[t as usize].bytes, p.tensors[t as usize].dtype, Cat::Activations, &a);
                copies.push((sid, p.tensors[t as usize].bytes));
                continue;
            }
            self.b.cat[b] = Cat::Activations;
            self.alloc_storage(b, &a);
            self.b.fwd_over[b] = true;
            self.b.saves[b] += 1;
            back.push(b);
        }
        (any, back)
    }

    /// Lets go of the hook's reference to brought-back checkpoint inputs (`save_on_cpu` after
    /// the recomputation: they were the re-run's arguments only; torchtune at its next hook): a
    /// copy lives on while a recomputed save references it.
    fn drop_unpacked_inputs(&mut self, back: &[usize], at: &At) {
        for &b in back {
            self.b.saves[b] = self.b.saves[b].saturating_sub(1);
            self.try_free(b, at);
        }
    }

    /// Host bytes: copied in forward, and the most alive at once.
    pub fn host_bytes(&self) -> (u128, u128) {
        (self.os.copied, self.os.host_peak)
    }

    /// Drops one stash entry: its original goes unless something else holds it.
    fn unstash(&mut self, b: u32, at: &At) {
        let b = b as usize;
        self.b.saves[b] = self.b.saves[b].saturating_sub(1);
        self.try_free(b, at);
    }

    /// Packs save `k` (index into `Program::saves`) of op `i`: kept on the device (a saved
    /// reference), or copied to the host (torchtune: its original stashed).
    fn pack(&mut self, i: usize, k: usize, off: Offload, at: &At) {
        let p = self.p;
        let t = p.saves[k].t;
        let b = p.tensors[t as usize].base as usize;
        self.os.next_id += 1;
        let id = self.os.next_id;
        if !off.moves(p, i, t) {
            self.b.saves[b] += 1;
            return;
        }
        self.os.moved[k] = true;
        self.os.id[k] = id;
        self.os.host += p.tensors[t as usize].bytes;
        self.copy_out(t, id, off, at);
    }

    /// Packs save `t` of op `i`'s node that dies in forward ([`Program::dead`]): a pack id like
    /// any other (torchtune's stash window counts it). A moved tensor is copied to the host
    /// (torchtune: its original stashed; its host copy stays in the tracker, which backward
    /// never empties of it — FINDINGS §15.5; `save_on_cpu`: the copy dies with the node). A
    /// kept one (torchtune, < 1 KiB) is the tensor itself in the tracker: it stays on the
    /// device through backward (`live_after_backward` = gradients + the kept tensors in
    /// `never_unpacked`).
    fn pack_dead(&mut self, i: usize, t: Tid, off: Offload, at: &At) {
        self.os.next_id += 1;
        let id = self.os.next_id;
        if !off.moves(self.p, i, t) {
            let b = self.p.tensors[t as usize].base as usize;
            self.b.saves[b] += 1;
            return;
        }
        if off.torchtune() {
            self.os.host += self.p.tensors[t as usize].bytes;
        }
        self.copy_out(t, id, off, at);
    }

    /// Tensor `t`, pack `id`, copied to the host: counted; under torchtune its device original
    /// enters the stash, whose oldest entries leave it.
    fn copy_out(&mut self, t: Tid, id: i64, off: Offload, at: &At) {
        let p = self.p;
        let b = p.tensors[t as usize].base as usize;
        self.os.copied += p.tensors[t as usize].bytes;
        self.os.host_peak = self.os.host_peak.max(self.os.host);
        if off.torchtune() {
            while let Some(&(old, ob)) = self.os.stash.first() {
                if old > id - MAX_FWD_STASH {
                    break;
                }
                self.os.stash.remove(0);
                self.unstash(ob, at);
            }
            self.os.stash.push((id, b as u32));
            self.b.saves[b] += 1;
        }
    }

    /// Brings op `i`'s moved tensors back for its node: a device copy each (its own size),
    /// unless torchtune's stash still holds the original. Returns whether any was moved (the
    /// node unpacks an offloaded tensor).
    fn unpack(&mut self, i: usize, copies: &mut Vec<(u32, u128)>, at: &At) -> bool {
        let p = self.p;
        let op = &p.ops[i];
        let mut any = false;
        for k in op.saved.0 as usize..op.saved.0 as usize + op.saved.1 as usize {
            if !self.os.moved[k] {
                continue;
            }
            any = true;
            let t = &p.tensors[p.saves[k].t as usize];
            self.os.host = self.os.host.saturating_sub(t.bytes);
            let id = self.os.id[k];
            if self.os.stash.iter().any(|e| e.0 == id) {
                continue;
            }
            let mut a = *at;
            a.op = "_to_copy";
            let sid = self.sink.alloc(t.bytes, t.dtype, Cat::Activations, &a);
            copies.push((sid, t.bytes));
        }
        any
    }

    /// torchtune's hook after a node that unpacked a moved tensor: the stash is emptied and the
    /// previous such node's copies go; this node's stay until the next one.
    ///
    /// A checkpoint input brought back (`inputs`) is checked first (torchtune's hook:
    /// `_storage_Use_Count(...) > storage_refcount`): if a recomputed save not yet unpacked
    /// references its storage (the checkpoint frame's `recomputed` holds it), the hook lets go of
    /// it at once and the storage lives as those saves say; else it stays until the next such node.
    fn after_unpack(&mut self, copies: Vec<(u32, u128)>, inputs: Vec<usize>, at: &At) {
        let mut kept = Vec::new();
        for b in inputs {
            if self.b.saves[b] > 1 {
                self.b.saves[b] -= 1;
            } else {
                kept.push(b);
            }
        }
        for (_, b) in std::mem::take(&mut self.os.stash) {
            self.unstash(b, at);
        }
        for (sid, bytes) in std::mem::replace(&mut self.os.held, copies) {
            self.sink.free(sid, bytes, Cat::Activations, at);
        }
        let previous = std::mem::replace(&mut self.os.held_inputs, kept);
        self.drop_unpacked_inputs(&previous, at);
    }

    /// Backward has ended: torchtune's queued callback deletes the last copies (and what the
    /// stash still holds).
    fn end_unpacks(&mut self, at: &At) {
        // [`Run::after_unpack`] of a node that brought nothing back.
        self.after_unpack(Vec::new(), Vec::new(), at);
    }

    /// Steps each parameter inside backward once its last gradient has arrived ([`StepHook`]);
    /// `elsewhere`: parameters another program steps (a tied head's weight, whose gradient the
    /// embedding's backward completes).
    pub fn step_in_backward(&mut self, hook: StepHook, elsewhere: &[Tid]) {
        let p = self.p;
        let mut remaining = vec![0u16; p.tensors.len()];
        for op in &p.ops {
            if op.node.is_empty() {
                continue;
            }
            let ins = p.ins(op);
            for st in p.bw(op) {
                let input = match *st {
                    B::Grad { input, .. } | B::Pass { input, .. } => input,
                    _ => continue,
                };
                let t = ins[input as usize] as usize;
                if matches!(p.tensors[t].origin, Origin::Param { grad_bytes } if grad_bytes > 0) && p.tensors[t].requires_grad {
                    remaining[t] = remaining[t].saturating_add(1);
                }
            }
        }
        for &t in elsewhere {
            remaining[t as usize] = u16::MAX;
        }
        self.remaining = remaining;
        self.hook = Some(hook);
    }

    /// The hook of parameter `t`, whose gradient buffer is complete: the optimizer's temporaries,
    /// then the gradient freed.
    fn step_param(&mut self, t: Tid, hook: StepHook, at: &At) {
        let x = &self.p.tensors[t as usize];
        let numel = x.bytes / x.dtype.bytes().max(1) as u128;
        let bytes = numel * hook.state_bytes as u128;
        let dtype = if hook.state_bytes == 4 { DType::Fp32 } else { x.dtype };
        let mut ids = [0u32; 2];
        let n = (hook.temps as usize).min(ids.len());
        for (k, id) in ids.iter_mut().enumerate().take(n) {
            let op = if k == 0 { "sqrt" } else { "div" };
            *id = self.sink.alloc(bytes, dtype, Cat::Transient, &At { op, node: "torch::autograd::AccumulateGrad", ..*at });
        }
        for &id in &ids[..n] {
            self.sink.free(id, bytes, Cat::Transient, at);
        }
        let g = self.b.pgrad[t as usize];
        if g != NONE {
            self.b.pgrad[t as usize] = NONE;
            self.unref(g, at);
        }
    }

    /// Hands this run's buffers to the next [`Run::new`] on this thread.
    pub fn recycle(self) {
        SCRATCH.with(|c| *c.borrow_mut() = Some(self.b));
    }

    /// Input `t` may be freed when its forward liveness ends (`free_fwd`) and when the last node
    /// that saved it has run (`free_bwd`), whatever its origin in the program says: one layer
    /// program serves every layer of its kind, whose callers let go of different inputs.
    pub fn set_input(&mut self, t: Tid, free_fwd: bool, free_bwd: bool) {
        let b = self.p.tensors[t as usize].base;
        self.inputs.push((b, free_fwd, free_bwd));
    }

    /// The forward pass is over: autocast's cache lets go of its casts (those nobody saved
    /// are freed).
    pub fn end_forward(&mut self) {
        let at = At { phase: Phase::Loss, layer: NO_LAYER, module: "", op: "", node: "" };
        for b in 0..self.p.tensors.len() {
            if self.b.fwd_end[b] && self.b.alive[b] {
                self.b.fwd_over[b] = true;
                self.try_free(b, &at);
            }
        }
    }

    /// Parameters already hold gradients (gradient accumulation, resident outside the stream):
    /// every new parameter gradient is added in place and freed.
    pub fn grads_resident(&mut self) {
        self.resident_grads = true;
    }

    /// Each parameter gradient is cast to fp32 as FSDP2 accumulates it ([`Upcast`]).
    pub fn upcast_gradients(&mut self, u: Upcast) {
        self.upcast = Some(u);
    }

    /// The category storage `t` is counted in while alive (a standalone program's inputs and
    /// outputs: what the neighbouring programs make of them).
    pub fn set_cat(&mut self, t: Tid, cat: Cat) {
        let b = self.p.tensors[t as usize].base as usize;
        self.b.cat[b] = cat;
    }

    /// Parameter `t` already holds a gradient allocated outside this program (a tied weight
    /// whose other use ran first).
    pub fn preexisting_grad(&mut self, t: Tid) {
        let bytes = match self.p.tensors[t as usize].origin {
            Origin::Param { grad_bytes } => grad_bytes,
            _ => 0,
        };
        self.b.bufs.push(GBuf { id: NONE, bytes, refs: 1, cat: Cat::Gradients });
        self.b.pgrad[t as usize] = (self.b.bufs.len() - 1) as u32;
    }

    fn at(&self, i: usize, phase: Phase, node: &'static str) -> At {
        let op = &self.p.ops[i];
        At { phase, layer: op.layer, module: op.module, op: op.name, node }
    }

    fn alloc_storage(&mut self, b: usize, at: &At) {
        let t = &self.p.tensors[b];
        let id = self.sink.alloc(t.bytes, t.dtype, self.b.cat[b], at);
        self.b.sid[b] = id;
        self.b.alive[b] = true;
    }

    fn free_storage(&mut self, b: usize, at: &At) {
        if !self.b.alive[b] {
            return;
        }
        self.b.alive[b] = false;
        let t = &self.p.tensors[b];
        if t.origin == Origin::Op {
            self.sink.free(self.b.sid[b], t.bytes, self.b.cat[b], at);
        } else {
            // An input: its bytes leave the caller's count.
            self.sink.free(NONE, t.bytes, self.b.cat[b], at);
        }
    }

    fn freeable(&self, b: usize) -> bool {
        match self.p.tensors[b].origin {
            Origin::Op => true,
            Origin::Input { free_fwd, free_bwd } => {
                let (free_fwd, free_bwd) = self.inputs.iter().find(|i| i.0 as usize == b).map_or((free_fwd, free_bwd), |&(_, f, g)| (f, g));
                if self.backward {
                    free_bwd
                } else {
                    free_fwd
                }
            }
            Origin::Param { .. } | Origin::Batch | Origin::Buffer => false,
        }
    }

    fn try_free(&mut self, b: usize, at: &At) {
        if self.b.alive[b] && self.b.fwd_over[b] && self.b.saves[b] == 0 && self.freeable(b) {
            self.free_storage(b, at);
        }
    }

    /// Runs the forward pass.
    pub fn forward(&mut self) {
        let p = self.p;
        self.backward = false;
        for (i, op) in p.ops.iter().enumerate() {
            let phase = if (i as u32) >= p.loss_from { Phase::Loss } else { Phase::Forward };
            let at = self.at(i, phase, "");
            if self.te.is_some() {
                self.te_enter(op.layer, &at);
            }
            // A region starts: its inputs are kept.
            let r = self.b.region_of[i];
            if r != NONE && p.regions[r as usize].first == i as u32 {
                let reg = &p.regions[r as usize];
                // The positional inputs go through the outer offloading hooks, if any.
                let hooks = self.off.filter(|o| o.packs(p, i));
                // Selective checkpointing's cache is taken with them: counted before its
                // tensors exist, it keeps each one from its allocation on.
                for (k, s) in reg.held.iter().chain(&reg.cached).enumerate() {
                    match hooks {
                        Some(o) if k < reg.inputs as usize => self.pack_input(r as usize, k, o, &at),
                        _ => self.b.saves[p.tensors[s.t as usize].base as usize] += 1,
                    }
                }
            }
            if !p.units.is_empty() {
                self.reshard_units_after_forward(i, &at);
                self.gather_units(i, &at);
            }
            let hooked = self.off.filter(|o| self.b.region_of[i] == NONE && op.saved.1 > 0 && o.packs(p, i));
            let saves = op.saved.0 as usize..op.saved.0 as usize + op.saved.1 as usize;
            // An op's inputs are packed before it runs, its outputs after.
            // A node that dies in forward packs too (its saves after the live ones).
            let dead = self.off.filter(|o| self.b.region_of[i] == NONE && op.dead > 0 && o.packs(p, i));
            if let Some(o) = hooked {
                for k in saves.clone() {
                    if !p.outs(op).contains(&p.saves[k].t) {
                        self.pack(i, k, o, &at);
                    }
                }
            }
            if let Some(o) = dead {
                for s in p.dead(op) {
                    if !p.outs(op).contains(&s.t) {
                        self.pack_dead(i, s.t, o, &at);
                    }
                }
            }
            for &t in p.outs(op) {
                let b = p.tensors[t as usize].base as usize;
                if b == t as usize && p.tensors[b].origin == Origin::Op {
                    self.alloc_storage(b, &at);
                }
            }
            if let Some(o) = dead {
                for s in p.dead(op) {
                    if p.outs(op).contains(&s.t) {
                        self.pack_dead(i, s.t, o, &at);
                    }
                }
            }
            if let Some(o) = hooked {
                for k in saves {
                    if p.outs(op).contains(&p.saves[k].t) {
                        self.pack(i, k, o, &at);
                    }
                }
            } else if op.compiled == Compiled::First {
                // A compiled region's forward returns every saved tensor at once: each is kept
                // from its allocation on, whichever op of the region releases it in backward.
                let inside = p.ops[i + 1..].iter().take_while(|o| o.compiled == Compiled::Inside).count();
                for o in &p.ops[i..=i + inside] {
                    for s in p.saved(o) {
                        self.b.saves[p.tensors[s.t as usize].base as usize] += 1;
                    }
                }
            } else if self.b.region_of[i] == NONE && op.compiled == Compiled::No {
                for s in p.saved(op) {
                    self.b.saves[p.tensors[s.t as usize].base as usize] += 1;
                }
                if self.te.is_some() {
                    let first = op.saved.0 as usize;
                    for k in first..first + op.saved.1 as usize + op.dead as usize {
                        self.te_push(i, k, k >= first + op.saved.1 as usize);
                    }
                }
            }
            self.free_after(i, &at, false);
        }
    }

    /// Frees what forward code stops holding after op `i`.
    fn free_after(&mut self, i: usize, at: &At, recompute: bool) {
        let (a, z) = (self.b.frees_at[i] as usize, self.b.frees_at[i + 1] as usize);
        for k in a..z {
            let b = self.b.frees[k] as usize;
            if recompute && self.b.region_of[i] == NONE {
                continue;
            }
            self.b.fwd_over[b] = true;
            self.try_free(b, at);
        }
    }

    /// Re-runs region `r`'s forward up to its last saving op (checkpoint recomputation). The
    /// pack hook that completes the recomputation raises as soon as the last saved tensor is
    /// packed (`_StopRecomputationError`); an op's inputs are packed before it runs
    /// (`VariableType`: `grad_fn->self_ = SavedVariable(self)` precedes the redispatch), so a
    /// last op that saves only its inputs never runs again.
    fn recompute(&mut self, r: usize, node: &'static str) {
        let p = self.p;
        let reg = &p.regions[r];
        // A compiled region's re-run ends with the head of its fused feed-forward backward: what
        // comes after it is needed only by the late matmuls' weight gradients
        // ([`super::ir::FusedBackward`]).
        // A kernel after the re-run (torchtune's layout, `apart` false) leaves the re-run whole.
        let fused_head = reg.fused.first().filter(|g| g.apart).map(|g| g.head);
        let stop = match fused_head {
            Some(h) => h - 1,
            None if reg.early_stop => self.b.region_last_save[r],
            None => reg.end - 1,
        };
        let mut allocated: Vec<usize> = Vec::new();
        for i in reg.first..=stop {
            let i = i as usize;
            let op = &p.ops[i];
            let at = self.at(i, Phase::Backward, node);
            let outs = p.outs(op);
            let runs = !reg.early_stop || i as u32 != stop || fused_head.is_some() || p.saved(op).iter().any(|s| outs.contains(&s.t));
            if runs && !(op.in_dispatch && self.dispatch_cached(reg, i)) {
                for &t in outs {
                    let b = p.tensors[t as usize].base as usize;
                    if b == t as usize && p.tensors[b].origin == Origin::Op && !self.b.alive[b] {
                        self.b.fwd_over[b] = false;
                        self.b.cat[b] = if p.saved(op).iter().any(|s| p.tensors[s.t as usize].base as usize == b) {
                            Cat::Activations
                        } else {
                            Cat::Transient
                        };
                        allocated.push(b);
                        self.alloc_storage(b, &at);
                    }
                }
            }
            for s in p.saved(op) {
                let b = p.tensors[s.t as usize].base as usize;
                self.b.saves[b] += 1;
            }
            // A cached output is popped from the cache (`storage[func].pop(0)`): from here on
            // it lives as the re-run's own output.
            for s in &reg.cached {
                let b = p.tensors[s.t as usize].base as usize;
                if outs.iter().any(|&t| p.tensors[t as usize].base as usize == b) && !allocated.contains(&b) {
                    self.b.saves[b] = self.b.saves[b].saturating_sub(1);
                    self.b.fwd_over[b] = false;
                    allocated.push(b);
                }
            }
            if !runs {
                break;
            }
            // Liveness inside the region, as in forward (the region's own storages only).
            let (a, z) = (self.b.frees_at[i] as usize, self.b.frees_at[i + 1] as usize);
            for k in a..z {
                let b = self.b.frees[k] as usize;
                if allocated.contains(&b) {
                    self.b.fwd_over[b] = true;
                    let was = self.backward;
                    self.backward = false;
                    self.try_free(b, &at);
                    self.backward = was;
                }
            }
        }
        // The head and the late matmuls of a fused feed-forward backward did not run again, but
        // their backward reads what the re-run made (the gate and up outputs).
        for g in reg.fused.iter().filter(|g| g.apart) {
            for &m in std::iter::once(&g.head).chain(&g.late) {
                for s in p.saved(&p.ops[m as usize]) {
                    let b = p.tensors[s.t as usize].base as usize;
                    if self.b.alive[b] && p.tensors[b].origin == Origin::Op {
                        self.b.saves[b] += 1;
                    }
                }
            }
        }
        // Early stop: the re-run's frame unwinds; what it held and nobody saved goes.
        let at = self.at(stop as usize, Phase::Backward, node);
        for b in allocated {
            self.b.fwd_over[b] = true;
            if self.b.alive[b] && self.b.saves[b] == 0 {
                self.free_storage(b, &at);
            }
        }
        self.b.recomputed[r] = true;
    }

    /// Whether op `i` of region `reg`, run inside the next outer op's dispatch
    /// ([`super::ir::Op::in_dispatch`]), is skipped by the recomputation: that op's output is in
    /// the selective-checkpoint cache (`_CachingTorchDispatchMode` returns it without calling
    /// the op, so the subclass's `__torch_dispatch__` never runs).
    fn dispatch_cached(&self, reg: &super::ir::Region, i: usize) -> bool {
        let p = self.p;
        let Some(j) = (i + 1..reg.end as usize).find(|&j| !p.ops[j].in_dispatch) else { return false };
        p.outs(&p.ops[j]).iter().any(|&t| {
            let b = p.tensors[t as usize].base;
            reg.cached.iter().any(|s| p.tensors[s.t as usize].base == b)
        })
    }

    fn new_buf(&mut self, bytes: u128, dtype: DType, cat: Cat, at: &At) -> u32 {
        let id = self.sink.alloc(bytes, dtype, cat, at);
        self.b.bufs.push(GBuf { id, bytes, refs: 1, cat });
        (self.b.bufs.len() - 1) as u32
    }

    fn unref(&mut self, k: u32, at: &At) {
        let g = &mut self.b.bufs[k as usize];
        g.refs -= 1;
        if g.refs == 0 {
            let (id, bytes, cat) = (g.id, g.bytes, g.cat);
            self.sink.free(id, bytes, cat, at);
        }
    }

    /// Gives the program's outputs their incoming gradients: allocated here (`alloc`, the
    /// engine's `ones_like` for a loss) or already alive (a layer's output gradient, counted
    /// by the caller).
    pub fn inject(&mut self, alloc: bool) {
        let p = self.p;
        for &t in &p.outputs {
            let x = &p.tensors[t as usize];
            let at = At { phase: Phase::Backward, layer: NO_LAYER, module: "", op: "ones_like", node: "" };
            let k = if alloc {
                self.new_buf(x.bytes, x.dtype, Cat::Transient, &at)
            } else {
                self.b.bufs.push(GBuf { id: NONE, bytes: x.bytes, refs: 1, cat: Cat::Transient });
                (self.b.bufs.len() - 1) as u32
            };
            self.b.grad[t as usize] = k;
            // The engine holds the root gradient until backward ends.
            if alloc {
                self.b.bufs[k as usize].refs += 1;
                self.b.injected.push(k);
            }
        }
    }

    /// Gives the program's outputs the gradients a later pipeline stage sent: alive already
    /// (counted by the caller) and held by the caller's `backward(grad_tensors=…)` until
    /// backward ends, so never freed (nor reused in place) here.
    pub fn inject_held(&mut self) {
        let p = self.p;
        for &t in &p.outputs {
            let x = &p.tensors[t as usize];
            self.b.bufs.push(GBuf { id: NONE, bytes: x.bytes, refs: 2, cat: Cat::Transient });
            self.b.grad[t as usize] = (self.b.bufs.len() - 1) as u32;
        }
    }

    /// Runs the backward pass: each op's node in reverse order, except where a compiled
    /// checkpointed region's kernels run apart from that order ([`super::ir::FusedBackward`]):
    /// there the matmul's input gradient comes first, then the head's kernel with its members'
    /// backward (their incoming gradients and saves released after all of them have run), then
    /// the matmul's weight gradient.
    pub fn backward(&mut self) {
        let p = self.p;
        self.backward = true;
        let mut skipped = std::mem::take(&mut self.b.skipped);
        // Ops a fused kernel already ran (empty unless a region has one).
        let mut done: Vec<bool> = if p.regions.iter().any(|r| !r.fused.is_empty()) { vec![false; p.ops.len()] } else { Vec::new() };
        for i in (0..p.ops.len()).rev() {
            if done.get(i).copied().unwrap_or(false) {
                continue;
            }
            let r = self.b.region_of[i];
            let group = if r == NONE { None } else { p.regions[r as usize].fused.iter().find(|g| g.late.last() == Some(&(i as u32))) };
            let Some(g) = group else {
                self.node(i, Part::Whole, &mut skipped);
                continue;
            };
            // The late matmuls' input gradients (the head's output gradient in parts, which its
            // kernel reads apart), the kernel, then their weight gradients.
            self.fusing = p.outs(&p.ops[g.head as usize]).first().map(|&t| p.tensors[t as usize].base);
            // A matmul without a weight gradient (a frozen base) runs whole: its incoming
            // gradient goes with its input gradient.
            for &m in g.late.iter().rev() {
                let part = if g.apart && self.weight_grad(m as usize) { Part::Inputs } else { Part::Whole };
                self.node(m as usize, part, &mut skipped);
            }
            let head = g.head as usize;
            let at_head = self.at(head, Phase::Backward, p.ops[head].node);
            // The casts after the head: the kernel reads their incoming gradients as they are.
            for &k in g.post.iter().rev() {
                self.node(k as usize, Part::Read, &mut skipped);
            }
            // The kernel writes the head's output and its casts where a late matmul's weight
            // gradient reads them (after the kernel: the checkpoint traced inside).
            for &k in std::iter::once(&g.head).chain(&g.post).filter(|_| g.apart) {
                let at = self.at(k as usize, Phase::Backward, p.ops[head].node);
                for &t in p.outs(&p.ops[k as usize]) {
                    let b = p.tensors[t as usize].base as usize;
                    let n = g
                        .late
                        .iter()
                        .map(|&m| p.saved(&p.ops[m as usize]).iter().filter(|s| p.tensors[s.t as usize].base as usize == b).count())
                        .sum::<usize>();
                    if n > 0 && !self.b.alive[b] && p.tensors[b].bytes > 0 {
                        self.make_saved(b, n as u16, Cat::Activations, &at);
                    }
                }
            }
            self.node(head, Part::Script, &mut skipped);
            for (k, &m) in g.members.iter().enumerate() {
                if !g.apart && k + 1 == g.members.len() {
                    self.write_in_place(m as usize, &at_head);
                }
                self.node(m as usize, Part::Script, &mut skipped);
            }
            self.node(head, Part::Release, &mut skipped);
            for &m in g.members.iter().chain(g.post.iter().rev()) {
                self.node(m as usize, Part::Release, &mut skipped);
            }
            self.fusing = None;
            for k in std::mem::take(&mut self.fused_grads) {
                self.unref(k, &self.at(head, Phase::Backward, p.ops[head].node));
            }
            for &m in g.late.iter().rev() {
                if g.apart && self.weight_grad(m as usize) {
                    self.late_weights(m as usize, &mut skipped);
                }
            }
            for &k in g.late.iter().chain(&g.members).chain(&g.post).chain(std::iter::once(&g.head)) {
                done[k as usize] = true;
            }
        }
        self.b.skipped = skipped;
        if self.off.is_some() {
            let at = At { phase: Phase::Backward, layer: NO_LAYER, module: "", op: "", node: "" };
            self.end_unpacks(&at);
        }
    }

    /// Before the last node of a kernel that reads the head's output gradient in parts
    /// (`FusedBackward::apart` false): its output is written in place into one of those parts,
    /// which dies in the kernel — released before that node allocates, where the part has the
    /// size of the node's first buffer (Inductor's `inplace_buffers`, `ir::FusedBackward`).
    fn write_in_place(&mut self, i: usize, at: &At) {
        let p = self.p;
        let first = p.bw(&p.ops[i]).iter().find_map(|st| match *st {
            B::Alloc { bytes, .. } if bytes > 0 => Some(bytes),
            _ => None,
        });
        let Some(bytes) = first else { return };
        if let Some(k) = self.fused_grads.iter().position(|&g| self.b.bufs[g as usize].bytes == bytes) {
            let g = self.fused_grads.remove(k);
            self.unref(g, at);
        }
    }

    /// Whether op `i`'s node makes a parameter's gradient.
    fn weight_grad(&self, i: usize) -> bool {
        let p = self.p;
        let ins = p.ins(&p.ops[i]);
        p.bw(&p.ops[i]).iter().any(|st| match *st {
            B::Grad { input, .. } => {
                let x = &p.tensors[ins[input as usize] as usize];
                x.requires_grad && matches!(x.origin, Origin::Param { .. })
            }
            _ => false,
        })
    }

    /// A late matmul's weight gradient ([`Part::Weights`]); a saved input the re-run never made
    /// (an adapter's `lora_A` output, which `lora_B`'s weight gradient reads) is recomputed
    /// first and freed with the node's saves.
    fn late_weights(&mut self, i: usize, skipped: &mut Vec<usize>) {
        let p = self.p;
        let at = self.at(i, Phase::Backward, p.ops[i].node);
        for s in p.saved(&p.ops[i]) {
            let b = p.tensors[s.t as usize].base as usize;
            if !self.b.alive[b] && p.tensors[b].origin == Origin::Op {
                self.make_saved(b, 1, Cat::Transient, &at);
            }
        }
        self.node(i, Part::Weights, skipped);
    }

    /// Allocates storage `b` in backward for the `n` saves that read it (a fused kernel's
    /// output, a late matmul's input made again), freed once the last of them is released.
    fn make_saved(&mut self, b: usize, n: u16, cat: Cat, at: &At) {
        self.b.cat[b] = cat;
        self.b.fwd_over[b] = true;
        self.b.saves[b] += n;
        self.alloc_storage(b, at);
    }

    /// Op `i`'s node, or the `part` of it that runs now (see [`Part`]).
    fn node(&mut self, i: usize, part: Part, skipped: &mut Vec<usize>) {
        let p = self.p;
        let op = &p.ops[i];
        let r = self.b.region_of[i];
        let outs = p.outs(op);
        let begins = matches!(part, Part::Whole | Part::Inputs | Part::Script | Part::Read);
        let ends = matches!(part, Part::Whole | Part::Weights | Part::Release);
        let has_grad = outs.iter().any(|&t| self.b.grad[t as usize] != NONE);
        let at = self.at(i, Phase::Backward, op.node);
        let mut copies: Vec<(u32, u128)> = Vec::new();
        let (mut inputs_moved, mut inputs_back) = (false, Vec::new());
        // FSDP2's `pre_backward` runs before the node: a checkpointed layer's parameters are
        // gathered before its forward is recomputed.
        if begins && has_grad && !op.node.is_empty() && !p.units.is_empty() {
            self.regather_units(i, &at);
        }
        if begins && r != NONE && !self.b.recomputed[r as usize] && self.b.region_last_save[r as usize] == i as u32 && has_grad {
            if self.off.is_some() {
                (inputs_moved, inputs_back) = self.unpack_inputs(r as usize, &mut copies, &at);
            }
            self.recompute(r as usize, op.node);
            if inputs_moved && !self.off.is_some_and(|o| o.torchtune()) {
                self.drop_unpacked_inputs(&std::mem::take(&mut inputs_back), &at);
                for (sid, bytes) in std::mem::take(&mut copies) {
                    self.sink.free(sid, bytes, Cat::Activations, &at);
                }
            }
        }
        let runs = !op.node.is_empty() && has_grad;
        if runs && begins && self.te.is_some() {
            self.te_backward_enters(op.layer, &at);
        }
        let mut temps = std::mem::take(&mut self.temps);
        let mut deliver = std::mem::take(&mut self.deliver);
        deliver.clear();
        temps.clear();
        let mut released = false;
        let unpacked = runs && part == Part::Whole && self.off.is_some() && self.unpack(i, &mut copies, &at);
        // (The units were gathered again before the node, above.)
        if runs && begins && !p.units.is_empty() {
            self.unsharded_grads(i, &at);
        }
        if runs {
            let ins = p.ins(op);
            let script = p.bw(op);
            // Inputs / Weights: the temporaries that become a parameter's gradient run in the
            // second part, the others in the first.
            let to_param = |k: usize| {
                script.iter().any(|st| match *st {
                    B::Grad { input, temp } => {
                        temp as usize == k && matches!(p.tensors[ins[input as usize] as usize].origin, Origin::Param { .. })
                    }
                    _ => false,
                })
            };
            if !matches!(part, Part::Release | Part::Read) {
                for (k, st) in script.iter().enumerate() {
                    match *st {
                        B::Alloc { bytes, dtype, op: name } => {
                            let n = temps.len();
                            let here = match part {
                                Part::Inputs => !to_param(n),
                                Part::Weights => to_param(n),
                                _ => true,
                            };
                            if !here {
                                temps.push(NONE);
                                continue;
                            }
                            // A temporary handed to a parameter is a gradient from the start.
                            let cat = self.temp_cat(script, k, ins, n as u8);
                            let mut a = at;
                            a.op = name;
                            let b = self.new_buf(bytes, dtype, cat, &a);
                            temps.push(b);
                        }
                        B::Free(t) => {
                            let b = temps[t as usize];
                            if b != NONE {
                                self.unref(b, &at);
                            }
                        }
                        B::Grad { input, temp } => {
                            if temps[temp as usize] != NONE {
                                deliver.push((ins[input as usize], temps[temp as usize]));
                            }
                        }
                        B::Pass { input, output } => {
                            let g = self.b.grad[outs[output as usize] as usize];
                            if g != NONE && part != Part::Weights {
                                self.b.bufs[g as usize].refs += 1;
                                deliver.push((ins[input as usize], g));
                            }
                        }
                        B::Apply => {
                            // Tensors unpacked from a checkpoint are the formula's locals.
                            if ends && r != NONE && self.b.recomputed[r as usize] {
                                self.release_saved(i, &at);
                                released = true;
                            }
                        }
                    }
                }
            }
            // save_on_cpu: the node's unpacked copies are its formula's locals.
            if unpacked && !self.off.is_some_and(|o| o.torchtune()) {
                for (sid, bytes) in std::mem::take(&mut copies) {
                    self.sink.free(sid, bytes, Cat::Activations, &at);
                }
            }
            if ends {
                // Incoming gradients go.
                for &t in outs {
                    let g = self.b.grad[t as usize];
                    if g != NONE {
                        self.b.grad[t as usize] = NONE;
                        self.unref(g, &at);
                    }
                }
                // Saved tensors go.
                if !released && (r == NONE || self.b.recomputed[r as usize]) {
                    self.release_saved(i, &at);
                }
            }
            if inputs_moved && self.off.is_some_and(|o| o.torchtune()) && self.region_compiled(r as usize) {
                // torchtune's order (a checkpoint around each compiled layer): the node that
                // unpacked the inputs is the layer's whole compiled backward; its hook runs after it.
                self.os.deferred = Some((std::mem::take(&mut copies), std::mem::take(&mut inputs_back)));
            } else if (unpacked || inputs_moved) && self.off.is_some_and(|o| o.torchtune()) {
                self.after_unpack(std::mem::take(&mut copies), std::mem::take(&mut inputs_back), &at);
            }
        } else if part == Part::Whole && op.saved.1 > 0 {
            skipped.push(i);
        }
        if ends {
            // The region's last holder is unpacked: its inputs and kwargs go.
            if r != NONE && self.b.region_first_save[r as usize] == i as u32 && self.b.recomputed[r as usize] {
                self.release_region(r as usize, &at);
                if let Some((copies, inputs)) = self.os.deferred.take() {
                    self.after_unpack(copies, inputs, &at);
                }
            }
        }
        // Gradients to the inputs' buffers.
        for &(t, g) in &deliver {
            self.give(t, g, &at);
        }
        if ends && !p.units.is_empty() {
            self.post_backward_units(i, &at);
        }
        self.temps = temps;
        self.deliver = deliver;
    }

    /// The graph is freed when backward ends: the saved tensors of nodes that never ran and
    /// the inputs held by checkpoint regions that never re-ran.
    pub fn release_graph(&mut self) {
        let p = self.p;
        let at = At { phase: Phase::Backward, layer: NO_LAYER, module: "", op: "", node: "" };
        self.te_release_bwd(&at);
        self.release_units(&at);
        for i in std::mem::take(&mut self.b.skipped) {
            let r = self.b.region_of[i];
            if r == NONE || self.b.recomputed[r as usize] {
                self.release_saved(i, &at);
            }
        }
        for r in 0..p.regions.len() {
            if !self.b.recomputed[r] {
                self.b.recomputed[r] = true;
                for s in &p.regions[r].cached {
                    let b = p.tensors[s.t as usize].base as usize;
                    self.b.saves[b] = self.b.saves[b].saturating_sub(1);
                    self.b.fwd_over[b] = true;
                    self.try_free(b, &at);
                }
                self.release_region(r, &at);
            }
        }
    }

    fn release_saved(&mut self, i: usize, at: &At) {
        let p = self.p;
        let first = p.ops[i].saved.0 as usize;
        for (k, s) in p.saved(&p.ops[i]).iter().enumerate() {
            // A moved tensor holds nothing on the device (its host copy goes with the node).
            if self.os.moved.get(first + k).copied().unwrap_or(false) {
                continue;
            }
            let b = p.tensors[s.t as usize].base as usize;
            self.b.saves[b] = self.b.saves[b].saturating_sub(1);
            self.try_free(b, at);
        }
    }

    fn release_region(&mut self, r: usize, at: &At) {
        let p = self.p;
        for (k, s) in p.regions[r].held.iter().enumerate() {
            // A moved input holds nothing on the device (its host copy went at the unpack).
            if self.input_moved(r, k) {
                continue;
            }
            let b = p.tensors[s.t as usize].base as usize;
            self.b.saves[b] = self.b.saves[b].saturating_sub(1);
            self.try_free(b, at);
        }
    }

    /// Ends backward: the engine drops the root gradient; the caller drops the loss and
    /// anything it held to the end.
    pub fn finish_backward(&mut self) {
        let at = At { phase: Phase::Backward, layer: NO_LAYER, module: "", op: "", node: "" };
        for k in std::mem::take(&mut self.b.injected) {
            self.unref(k, &at);
        }
        for b in 0..self.p.tensors.len() {
            if self.b.alive[b] && self.b.end[b] == FOREVER && self.p.tensors[b].origin == Origin::Op && self.b.saves[b] == 0 {
                self.free_storage(b, &at);
            }
        }
    }

    fn temp_cat(&self, script: &[B], from: usize, ins: &[Tid], temp: u8) -> Cat {
        for st in &script[from..] {
            if let B::Grad { input, temp: t } = *st {
                if t == temp {
                    return match self.p.tensors[ins[input as usize] as usize].origin {
                        Origin::Param { .. } => Cat::Gradients,
                        _ => Cat::Transient,
                    };
                }
            }
        }
        Cat::Transient
    }

    /// Hands gradient buffer `g` to tensor `t`.
    fn give(&mut self, t: Tid, g: u32, at: &At) {
        let x = &self.p.tensors[t as usize];
        if !x.requires_grad {
            self.unref(g, at);
            return;
        }
        match x.origin {
            Origin::Param { grad_bytes } => {
                let old = self.b.pgrad[t as usize];
                // FSDP2's fp32 copy of this 16-bit gradient ([`Upcast`]).
                let fp32 = grad_bytes / x.dtype.bytes().max(1) as u128 * FP32_BYTES;
                let upcast = self.upcast.filter(|_| x.dtype != DType::Fp32);
                let unit = self.p.units.iter().position(|u| u.grad_param == t);
                if let (true, Some(k)) = (self.resident_grads, unit) {
                    self.accumulate_unit_grad(k, g, at);
                } else if self.resident_grads {
                    if upcast == Some(Upcast::Added) {
                        let mut a = *at;
                        a.op = "add_";
                        let id = self.sink.alloc(fp32, DType::Fp32, Cat::Transient, &a);
                        self.sink.free(id, fp32, Cat::Transient, &a);
                    }
                    self.unref(g, at);
                } else if old == NONE && upcast == Some(Upcast::Kept) {
                    let mut a = *at;
                    a.op = "_to_copy";
                    let n = self.new_buf(fp32, DType::Fp32, Cat::Gradients, &a);
                    self.unref(g, at);
                    self.b.pgrad[t as usize] = n;
                } else if old == NONE {
                    // AccumulateGrad steals the first gradient.
                    let GBuf { id, bytes, cat, .. } = self.b.bufs[g as usize];
                    if cat != Cat::Gradients {
                        self.sink.recat(id, bytes, cat, Cat::Gradients);
                    }
                    self.b.bufs[g as usize].cat = Cat::Gradients;
                    self.b.pgrad[t as usize] = g;
                } else if self.accumulate == Accumulate::OutOfPlace {
                    let mut a = *at;
                    a.op = "add";
                    let n = self.new_buf(grad_bytes, x.dtype, Cat::Gradients, &a);
                    self.unref(old, at);
                    self.unref(g, at);
                    self.b.pgrad[t as usize] = n;
                } else {
                    self.unref(g, at);
                }
                if let Some(hook) = self.hook.filter(|_| !self.resident_grads) {
                    let left = &mut self.remaining[t as usize];
                    if *left != u16::MAX {
                        *left = left.saturating_sub(1);
                        if *left == 0 {
                            self.step_param(t, hook, at);
                        }
                    }
                }
            }
            _ => {
                let old = self.b.grad[t as usize];
                if old == NONE {
                    self.b.grad[t as usize] = g;
                } else if self.fusing == Some(x.base) {
                    // Read apart by the fused kernel: held until it has run.
                    self.fused_grads.push(g);
                } else if self.fusing.is_some() {
                    // Summed inside the fused kernel: one output buffer.
                    self.unref(g, at);
                } else if self.accumulate == Accumulate::InPlace && self.b.bufs[old as usize].refs == 1 {
                    self.unref(g, at);
                } else {
                    let mut a = *at;
                    a.op = "add";
                    let n = self.new_buf(x.bytes, x.dtype, Cat::Transient, &a);
                    self.unref(old, at);
                    self.unref(g, at);
                    self.b.grad[t as usize] = n;
                }
            }
        }
    }

    /// The gradient buffer of tensor `t` after backward (an input's gradient handed back).
    pub fn grad_of(&self, t: Tid) -> Option<u128> {
        let g = self.b.grad[t as usize];
        (g != NONE).then(|| self.b.bufs[g as usize].bytes)
    }

    /// Parameter gradients still held (bytes).
    pub fn param_grads(&self) -> u128 {
        self.b.pgrad.iter().filter(|&&g| g != NONE).map(|&g| self.b.bufs[g as usize].bytes).sum()
    }

    /// Whether a storage is alive now.
    pub fn is_alive(&self, t: Tid) -> bool {
        self.b.alive[self.p.tensors[t as usize].base as usize]
    }

    /// Stream ids of the parameter gradients held (for zero_grad).
    pub fn param_grad_ids(&self) -> Vec<(u32, u128)> {
        self.b.pgrad.iter().filter(|&&g| g != NONE).map(|&g| (self.b.bufs[g as usize].id, self.b.bufs[g as usize].bytes)).collect()
    }

    /// Storages saved at this moment (after forward: what backward will need).
    pub fn saved_storages(&self) -> impl Iterator<Item = Tid> + '_ {
        (0..self.p.tensors.len()).filter(move |&b| self.b.saves[b] > 0 && self.p.tensors[b].base as usize == b).map(|b| b as Tid)
    }

    /// The sink, back; the run's buffers go to the next [`Run::new`] on this thread (a whole
    /// stage's are the largest: freed, glibc hands them back to the system and the next step
    /// faults them in again).
    pub fn into_sink(self) -> S {
        SCRATCH.with(|c| *c.borrow_mut() = Some(self.b));
        self.sink
    }
}

/// Layer index of events outside any layer.
pub const NO_LAYER: u16 = super::ir::MODEL;

/// A sink that tracks live bytes relative to its start, and the maximum since its last mark.
#[derive(Clone, Copy, Debug)]
pub struct Tracker {
    pub live: i128,
    /// Live bytes by category (activations, gradients, transient).
    pub cats: [i128; 3],
    /// The largest `live` after an allocation since [`Tracker::mark`] (`i128::MIN`: none).
    pub peak: i128,
    pub at_peak: [i128; 3],
    pub peak_at: Option<At>,
    /// Live bytes of FSDP units ([`Cat::Gathered`], inside the transient count), now and at
    /// the peak.
    pub gathered: i128,
    pub gathered_at_peak: i128,
    next: u32,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker { live: 0, cats: [0; 3], peak: i128::MIN, at_peak: [0; 3], peak_at: None, gathered: 0, gathered_at_peak: 0, next: 0 }
    }
}

impl Tracker {
    /// Starts a new segment: returns the live bytes and categories at its start.
    pub fn mark(&mut self) -> (i128, [i128; 3]) {
        self.peak = i128::MIN;
        self.peak_at = None;
        (self.live, self.cats)
    }
}

pub(crate) fn ci(c: Cat) -> usize {
    match c {
        Cat::Activations => 0,
        Cat::Gradients => 1,
        Cat::Transient | Cat::Gathered => 2,
    }
}

impl Sink for Tracker {
    fn alloc(&mut self, bytes: u128, _dtype: DType, cat: Cat, at: &At) -> u32 {
        self.live += bytes as i128;
        self.cats[ci(cat)] += bytes as i128;
        if cat == Cat::Gathered {
            self.gathered += bytes as i128;
        }
        if self.live > self.peak {
            self.peak = self.live;
            self.at_peak = self.cats;
            self.gathered_at_peak = self.gathered;
            self.peak_at = Some(*at);
        }
        self.next += 1;
        self.next - 1
    }
    fn free(&mut self, _id: u32, bytes: u128, cat: Cat, _at: &At) {
        self.live -= bytes as i128;
        self.cats[ci(cat)] -= bytes as i128;
        if cat == Cat::Gathered {
            self.gathered -= bytes as i128;
        }
    }
    fn recat(&mut self, _id: u32, bytes: u128, from: Cat, to: Cat) {
        self.cats[ci(from)] -= bytes as i128;
        self.cats[ci(to)] += bytes as i128;
    }
}

/// "layer 31 backward, `mlp.down_proj` mm in MmBackward0" for a place in the step.
pub fn label(at: &At) -> String {
    let layer = (at.layer != NO_LAYER).then_some(u32::from(at.layer));
    super::stream::write_label(at.phase, layer, at.module, at.op, at.node)
}
