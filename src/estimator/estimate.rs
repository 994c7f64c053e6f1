//! The ledger of one GPU for a configuration ([`estimate`], numbers only; [`explain`], with
//! every formula), the step simulated op by op beside it, and the caching allocator's reserve
//! ([`with_reserve`]).

use super::config::{self, Config, Finetune, Offload};
use super::ledger::{bytes_of, Bytes, Category, Row, RowId, Summary};
use super::model::Part;
use super::params::{self, local_groups, stages, Role, Stage};
use super::precision::{recipe, Recipe};
use super::step_stream::{after_forward_of, resident_of, stream_of, StreamAt};
use super::validate::{validate, EstimateError};
use super::{activations, expr, family, optimizer, overhead, reserve, sharding, statics, step, timeline};
use serde::Serialize;

/// How the cluster is cut.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Layout {
    pub gpus: u64,
    pub dp: u64,
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub ep: u64,
    /// GPUs one ZeRO/FSDP shard spans.
    pub shard: u64,
    /// The stage the ledger describes (the most loaded one).
    pub stage: Stage,
    /// Decoder layers on that stage.
    pub stage_layers: u64,
    /// Saved activations of the other micro-batches in flight on that stage (1F1B under
    /// pipeline parallelism; 0 without it), part of the activations row, and under torchtitan
    /// the received inputs its schedule keeps (the `pipeline_inputs` row).
    pub in_flight_activations: Bytes,
    /// Whether the ledger's step is the first backward of the step, not a later one: under
    /// torchtitan's FSDP2 with pipeline parallelism, where the first backward (every forward
    /// before it, the fp32 gradient accumulators still to make) peaks higher than the later
    /// ones (their accumulators resident, a micro-batch fewer in flight).
    pub first_backward: bool,
    /// Tokens per optimizer step over the whole job: batch × seq × accum × dp.
    pub tokens_per_step: u128,
}

/// The result for one configuration, per GPU (the most loaded one).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    pub model: String,
    pub parameter_count: u64,
    pub trainable_parameter_count: u64,
    /// Parameters a token uses (MoE: routed experts counted top_k times).
    pub active_parameter_count: u64,
    pub parameter_tensors: u64,
    pub breakdown: Vec<(Part, u64)>,
    pub layout: Layout,
    /// The ledger of one GPU.
    pub components: Vec<Row>,
    /// What lives in host memory per GPU process (offload, CPU-side optimizer counters).
    pub host: Vec<Row>,
    pub memory: Memory,
    /// GPU capacity the verdict compares with.
    pub capacity: Bytes,
    /// One simulated training step of this GPU.
    pub timeline: timeline::Timeline,
    /// The closed formulas of the literature for the same configuration (teaching view).
    pub textbook: Vec<Row>,
    pub warnings: Vec<String>,
}

/// Per-GPU bytes by category (`memory` in the CLI's JSON).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Memory {
    pub parameters: Bytes,
    pub gradients: Bytes,
    pub optimizer_states: Bytes,
    pub activations: Bytes,
    pub transient: Bytes,
    pub framework_overhead: Bytes,
    /// Sum of every ledger row, as if all were resident at once: each resident component at its
    /// largest (every gradient, every saved activation) and the working memory alive at the
    /// step's peak. An upper bound on `peak`, not a quantity that must grow with the model: a
    /// change that moves the peak (into the layers' backward from the loss's, say) can shrink
    /// the working-memory row by more than it adds elsewhere.
    pub total: Bytes,
    /// The most memory in use at any moment of the step (≤ `total`): what decides whether the
    /// run fits.
    pub peak: Bytes,
    /// Host memory per GPU process.
    pub host: Bytes,
    /// The coarse step event of the peak ("backward layer 32", "loss + LM head backward").
    pub peak_event: String,
    /// The op of the peak inside it: "layer 31 backward, `mlp.down_proj` mm in MmBackward0"
    /// (layers 0-based, modules relative to the layer).
    pub peak_op: String,
    /// Resident bytes + the step stream's largest live bytes: what
    /// `torch.cuda.max_memory_allocated()` reports (no context, NCCL or fragmentation).
    pub allocated_peak: Bytes,
    /// `torch.cuda.max_memory_reserved()` from replaying the step's stream through the caching
    /// allocator simulator (only where the stream is materialized: [`explain`], [`simulate`]).
    pub reserved_peak: Option<Bytes>,
    /// What nvidia-smi shows for the process at the step's peak: `step_reserved_peak` + the
    /// CUDA context + cuBLAS workspaces + NCCL buffers (only where the allocator was replayed).
    pub nvidia_smi: Option<Bytes>,
    /// `max_memory_reserved()` over the steps alone, with what the loading left reserved
    /// (`reserved_peak` is the whole run's, loading included).
    pub step_reserved_peak: Option<Bytes>,
    /// The loading's peak as the verdict compares it beside the step's: what nvidia-smi shows
    /// at its peak (the loading's reserved peak + the CUDA context, + NCCL's buffers for the
    /// sharded loaders) where the allocator was replayed, else its allocated peak + the same.
    pub load_peak: Bytes,
    /// `max_memory_allocated()` over the loading (`load`, see `loading.rs`).
    pub load_allocated_peak: Bytes,
    /// `max_memory_reserved()` over the loading alone (where the allocator was replayed).
    pub load_reserved_peak: Option<Bytes>,
    /// bitsandbytes' paged optimizer states (`optim_paged`) that do not fit beside the step:
    /// the driver keeps them in host memory ([`paged_evicted`]); not in `nvidia_smi`.
    pub paged_evicted: Bytes,
}

impl Memory {
    /// The peak, when the step was simulated.
    pub fn peak_opt(&self) -> Option<Bytes> {
        (self.peak > 0).then_some(self.peak)
    }
}

impl Estimate {
    /// The stage this ledger describes, with its in-flight activations: what the step's stream
    /// and the caching allocator's replay simulate ([`StreamAt`]).
    pub fn stream_at(&self) -> StreamAt {
        StreamAt { stage: self.layout.stage, in_flight: self.layout.in_flight_activations, first_backward: self.layout.first_backward }
    }
    /// What decides whether the run fits: the larger of the step's figure — nvidia-smi where
    /// the caching allocator was replayed ([`explain`], [`with_reserve`]), else the allocated
    /// peak with what lives outside the allocator — and the loading's (`memory.load_peak`).
    pub fn deciding_peak(&self) -> Bytes {
        self.step_deciding().max(self.memory.load_peak)
    }
    /// The step's figure of [`Estimate::deciding_peak`], with bitsandbytes' paged states only
    /// as far as they fit ([`paged_evicted`]).
    pub fn step_deciding(&self) -> Bytes {
        // The pages that do not fit are left out of both figures (`paged_evicted`).
        self.memory.nvidia_smi.unwrap_or(self.memory.peak)
    }
    /// bitsandbytes' paged optimizer states (`optim_paged`), in CUDA unified memory.
    pub fn paged_states(&self) -> Bytes {
        bytes_of(&self.components, RowId::PagedOptimizerStates)
    }
    /// Whether the loading, not the step, decides.
    pub fn loading_decides(&self) -> bool {
        self.memory.load_peak > self.step_deciding()
    }
    /// Headroom on the GPU at the step's peak (negative: bytes missing).
    pub fn headroom(&self) -> i128 {
        clamp_i128(self.capacity) - clamp_i128(self.deciding_peak())
    }
    /// Whether the step's peak fits on the GPU.
    pub fn fits(&self) -> bool {
        self.deciding_peak() <= self.capacity
    }
    /// The whole job's GPU memory at the peak if every GPU held as much as the most loaded one.
    pub fn cluster_total(&self) -> Bytes {
        self.memory.peak.saturating_mul(self.layout.gpus as u128)
    }
    pub fn row(&self, id: RowId) -> Option<&Row> {
        self.components.iter().find(|r| r.id == id)
    }
}

/// The device memory of a figure `full` that counts `paged` bytes of unified memory, on a GPU
/// of `capacity`: the driver keeps managed pages resident while there is room and evicts them
/// to the host when other allocations need it (CUDA Programming Guide, "Unified Memory":
/// oversubscription), so they fill at most what the rest leaves free. Toy values: 30 GB with
/// 10 GB paged on a 24 GB card → 24 (4 GB evicted); 12 with 10 paged → 12; 36 with 10 paged
/// → 26 (the rest alone does not fit).
pub fn paged_evicted(full: Bytes, paged: Bytes, capacity: Bytes) -> Bytes {
    full.min(capacity.max(full.saturating_sub(paged)))
}

/// The warning for `evicted` bytes of `paged` bitsandbytes states kept on the host
/// ([`paged_evicted`]), wherever the figures leave them out: after the allocator's replay, or
/// on the ledger's own peak where the replay does not run (`frag_pct`).
fn paged_warning(evicted: Bytes, paged: Bytes) -> String {
    format!(
        "{:.2} GB of the {:.2} GB of paged optimizer states do not fit beside the step: the driver keeps them in host memory and pages them in at every step (slower, not an out-of-memory error)",
        evicted as f64 / 1e9,
        paged as f64 / 1e9
    )
}

fn clamp_i128(b: Bytes) -> i128 {
    i128::try_from(b).unwrap_or(i128::MAX)
}

/// Capacity of the configured GPU (in `gpu.rs`, where the allocator replay reads it too).
pub use super::gpu::capacity;

/// One stage's ledger, host rows and simulated step.
struct StageResult {
    rows: Vec<Row>,
    host: Vec<Row>,
    timeline: timeline::Timeline,
    /// Where in the step the peak is; written out ("layer 31 backward, `mlp.down_proj` …") for
    /// the most loaded stage only ([`StageResult::labelled`]).
    peak_at: Option<step::run::At>,
    /// Where the simulated peak of the working-memory row is (its note names it).
    work_at: Option<step::run::At>,
    /// Resident bytes + the stream's largest live bytes (what `max_memory_allocated` counts).
    allocated_peak: Bytes,
    /// The loading's allocated peak on this stage.
    load_allocated_peak: Bytes,
    /// Other micro-batches' saved activations on this stage.
    in_flight: Bytes,
    /// Whether this is the step's first backward ([`Layout::first_backward`]).
    first_backward: bool,
}

const WORK: expr::Sym =
    expr::Sym::new("M", "work", "bytes alive at the step's peak beyond the saved activations and gradients (simulated)");

/// What is alive at the step's peak beyond the rows for the saved activations and gradients
/// (from the simulated step, `step::fast`): the transient buffers then (gradients of
/// activations, the loss's logits and their gradients, a recomputed layer's tensors, autocast
/// copies, optimizer temporaries), and any activations or gradients beyond their rows (a
/// checkpointed layer re-materialized, unsharded gradients before their reduction).
///
/// Its note, which names the op of that peak, is written by [`working_note`] once the most
/// loaded stage is known: under pipeline parallelism the other stages' rows are dropped.
fn working_row(fast: &step::fast::Fast, rows: &[Row]) -> Option<Row> {
    let row = |id: RowId| -> Bytes { rows.iter().filter(|r| r.id == id).map(|r| r.bytes).sum() };
    let [acts, grads, transient] = fast.cats;
    // An FSDP unit alive at the peak has its own row (`gathered_head`).
    let transient = transient.saturating_sub(fast.gathered);
    let bytes = transient + acts.saturating_sub(row(RowId::Activations)) + grads.saturating_sub(row(RowId::Gradients));
    let r = Row::new(
        RowId::StepWorking,
        "Working memory at the step's peak",
        Category::Transient,
        expr::Expr::var(WORK, bytes),
        "the step simulated op by op (transformers modeling code, torch autograd; see step/)",
    );
    (r.bytes > 0).then_some(r)
}

/// The note of [`working_row`]: where its peak is (`at`, the simulated step's peak op).
fn working_note(at: Option<step::run::At>) -> String {
    let at = at.map(|a| step::label(&a)).unwrap_or_default();
    format!("alive at the peak ({at}) beside the saved activations and the gradients")
}

impl StageResult {
    /// The ledger of the most loaded stage, its labels written out: the working-memory row's
    /// note and the peak's op (formatting them for every stage cost more than the stage's rows).
    fn labelled(mut self) -> (StageResult, String) {
        if let Some(r) = self.rows.iter_mut().find(|r| r.id == RowId::StepWorking) {
            r.note = working_note(self.work_at).into();
        }
        let peak_label = self.peak_at.map(|a| step::label(&a)).unwrap_or_default();
        (self, peak_label)
    }
}

/// The pinned host memory activation offloading fills (`act_offload`, validation/FINDINGS.md
/// §15.5): every saved tensor the forward pass moves, each at its own size (views of one storage
/// are copied separately; `empty_like` of a view), all alive when backward starts but those of
/// autograd nodes that die in forward (a router's top-k choice, the gated DeltaNet's last state
/// update: packed when created; `save_on_cpu`'s copy dies with the node, torchtune's tracker keeps
/// it):
///
/// `H_off = H_emb + Σ_kinds L_kind · H_layer(kind) + H_head`
///
/// where each `H` sums `numel · element_size` over the piece's moved saves — torchtune 0.6.1
/// `OffloadActivations.pack_tensor`: those of at least `min_offload_size` = 1,024 B that are not
/// `nn.Parameter` instances, outside the output head (`NoOpManager`) and the loss (outside the
/// context); `torch.autograd.graph.save_on_cpu`: every saved tensor, head and loss included.
/// Pinned (page-locked) memory, per GPU process. Checked exactly against the recipe records'
/// `host_bytes_copied_in_forward`.
fn offloaded_activations_row(setup: &step::model::Setup, pieces: &step::fast::Pieces) -> Option<Row> {
    use crate::estimator::expr::{Expr, Sym};
    if let Some(lo) = setup.layer_offload() {
        return layer_offloaded_row(&lo, pieces);
    }
    let off = setup.offload()?;
    let count = |p: &step::ir::Program| step::run::offloaded_bytes(p, &off);
    let mut terms = vec![Expr::var(Sym::new("H", "emb", "host bytes the model's start offloads"), count(&pieces.pro))];
    let mut done: Vec<(step::families::Kind, step::families::Var, bool)> = Vec::new();
    for k in &pieces.keys {
        if done.contains(&(k.kind, k.var, k.grad)) {
            continue;
        }
        done.push((k.kind, k.var, k.grad));
        let n = pieces.keys.iter().filter(|j| (j.kind, j.var, j.grad) == (k.kind, k.var, k.grad)).count();
        let per = count(&pieces.layer(k).prog);
        terms.push(Expr::prod([
            Expr::var(Sym::new("L", "", "decoder layers of this kind on the stage"), n as u128),
            Expr::var(Sym::new("H", "layer", "host bytes one decoder layer offloads"), per),
        ]));
    }
    if let Some((e, _)) = &pieces.epi {
        terms.push(Expr::var(Sym::new("H", "head", "host bytes the final norm, head and loss offload"), count(e)));
    }
    let source = match setup.cfg.act_offload {
        config::ActOffload::SaveOnCpu => "torch 2.15 autograd/graph.py save_on_cpu(pin_memory=True)",
        _ => "torchtune 0.6.1 training/_activation_offloading.py OffloadActivations.pack_tensor",
    };
    Some(offloaded_activations(
        Expr::sum(terms),
        source,
        "each moved saved tensor at its own size, all alive when backward starts; brought back node by node in backward",
    ))
}

/// The host row of offloaded activations (`offloaded_activations`): pinned host memory, per GPU
/// process, with the formula, source and note of the hooks that fill it.
fn offloaded_activations(expr: crate::estimator::expr::Expr, source: &'static str, note: &'static str) -> Row {
    Row::new(RowId::OffloadedActivations, "Offloaded activations (pinned host memory)", Category::Activations, expr, source).note(note)
}

/// The pinned host memory Transformer Engine's per-layer offloading fills
/// (`act_offload_layers = n`, [`step::te_offload`]): the first `n` layers' pushed saves, each
/// base once, all copied by the time the forward pass ends (layer `n − 1`'s as layer `n`
/// enters) and alive until each layer's backward is over:
///
/// `H_off = Σ_{i < n} H_layer(i)`
///
/// where `H_layer` sums `numel · element_size` over the layer's saved tensors of at least 256 K
/// elements that are not parameters (and, around transformers' layers, are contiguous), a view
/// with as many elements as its base counted as the base, each base once — Transformer Engine
/// 2.20.2 `pytorch/cpu_offload.py` (`_check_if_offload`, `_switch_to_base_tensors`,
/// `_deduplicate_tensors`). Pinned memory, per GPU process; checked against the records'
/// `host_bytes_copied_in_forward` (`recipes/*-L4.json`).
fn layer_offloaded_row(lo: &step::te_offload::LayerOffload, pieces: &step::fast::Pieces) -> Option<Row> {
    use crate::estimator::expr::{Expr, Sym};
    let mut per: Vec<(step::fast::Key, u128, u128)> = Vec::new();
    for k in pieces.keys.iter().take(lo.n as usize) {
        match per.iter_mut().find(|(j, ..)| j == k) {
            Some(e) => e.1 += 1,
            None => {
                let bytes = step::te_offload::layer_host_bytes(&pieces.layer(k).prog, lo, |op| op.layer != step::ir::MODEL);
                per.push((*k, 1, bytes));
            }
        }
    }
    let terms = per.iter().map(|&(_, n, bytes)| {
        Expr::prod([
            Expr::var(Sym::new("n", "", "offloaded decoder layers of this kind (act_offload_layers)"), n),
            Expr::var(Sym::new("H", "layer", "host bytes one decoder layer offloads"), bytes),
        ])
    });
    Some(offloaded_activations(
        Expr::sum(terms),
        "Transformer Engine 2.20.2 pytorch/cpu_offload.py get_cpu_offload_context (DefaultOffloadSynchronizer), as Megatron-Core's TransformerBlock applies it",
        "the first n layers' large saved tensors, each base once; copied as the next layer enters, released from the device L − n layers later, reloaded in backward",
    ))
}

const N_KEPT: expr::Sym = expr::Sym::new("n", "kept", "micro-batches done whose received input the schedule still holds");
const X_STAGE: expr::Sym = expr::Sym::new("X", "stage", "one micro-batch's stage input, as received");

/// The stage inputs torch's pipeline schedule keeps after their micro-batch's backward, on a
/// stage that receives them (torchtitan under pipeline parallelism): `n_kept × X_stage`, with
/// `n_kept = accum − m` (the micro-batches done; `m` whose activations the ledger counts, the
/// simulated one included) and `X_stage = b × s/cp × h × b_c` (÷ tp under sequence
/// parallelism: the residual stream torchtitan sends between stages is sequence-sharded). torch
/// 2.15 `distributed/pipelining/stage.py`: each micro-batch's received activation lives in the
/// stage's forward-chunk state and receive buffers until the schedule's step ends (measured on
/// the last of two stages: every micro-batch's 16,384-B input alive at the peak of the fourth,
/// freed after the last reduce; `tests/fixtures/pytorch/fsdp/pp.json`).
fn pipeline_inputs_row(cfg: &Config, recipe: &Recipe, stage: Stage, counted: u64) -> Option<Row> {
    if cfg.framework != config::Framework::Torchtitan || cfg.pp <= 1 || stage.has_embedding() {
        return None;
    }
    let kept = cfg.accum.saturating_sub(counted.max(1));
    if kept == 0 {
        return None;
    }
    let split = if cfg.sp && cfg.tp > 1 { cfg.tp } else { 1 } as u128;
    let x =
        (cfg.batch as u128 * (cfg.seq / cfg.cp.max(1)) as u128 * cfg.arch.hidden as u128 * recipe.compute.bytes() as u128).div_ceil(split);
    Some(
        Row::new(
            RowId::PipelineInputs,
            "Received stage inputs kept by the schedule",
            Category::Activations,
            expr::Expr::prod([expr::Expr::var(N_KEPT, kept), expr::Expr::var(X_STAGE, x)]),
            "torch 2.15 distributed/pipelining/stage.py (forward-chunk state, receive buffers), as torchtitan 0.2.2 drives it",
        )
        .note("each finished micro-batch's received activation, held until the schedule's step ends"),
    )
}

/// Estimates one stage's ledger and simulates its step: the later backward, and under
/// torchtitan's FSDP2 with pipeline parallelism and several micro-batches also the first
/// ([`Layout::first_backward`]), the higher of the two.
fn stage_result(
    cfg: &Config,
    recipe: &Recipe,
    stage: Stage,
    built: &mut Vec<std::rc::Rc<step::fast::LayerProg>>,
    runs: &mut Vec<step::fast::LayerRun>,
) -> StageResult {
    let later = stage_ledger(cfg, recipe, stage, false, built, runs);
    // The first backward can only be higher with more micro-batches in flight than the later
    // one: with as many, every byte it holds the later one holds too (the accumulators whole).
    let more_in_flight = activations::micro_batches_in_flight(cfg, stage, true) > activations::micro_batches_in_flight(cfg, stage, false);
    if !(sharding::accumulators_resident(cfg, false) && more_in_flight) {
        return later;
    }
    let first = stage_ledger(cfg, recipe, stage, true, built, runs);
    if first.timeline.peak_bytes() > later.timeline.peak_bytes() {
        first
    } else {
        later
    }
}

/// Estimates one stage's ledger and simulates its step (`first_backward`: the step's first
/// backward under torchtitan's FSDP2 with pipeline parallelism, whose fp32 gradient
/// accumulators it makes: no row for them, [`statics::unsharded_accumulator_bytes`]).
fn stage_ledger(
    cfg: &Config,
    recipe: &Recipe,
    stage: Stage,
    first_backward: bool,
    built: &mut Vec<std::rc::Rc<step::fast::LayerProg>>,
    runs: &mut Vec<step::fast::LayerRun>,
) -> StageResult {
    // The stage's programs, built once for the activation ledger and the peak.
    let setup = step::model::Setup::new(cfg, recipe, stage).first_backward(first_backward);
    let pieces = step::fast::pieces_with(&setup, built);
    let groups = &setup.groups;
    let (mut rows, mut host) = statics::static_rows(cfg, recipe, groups, first_backward);
    host.extend(offloaded_activations_row(&setup, &pieces));
    let layers = params::stage_layers(cfg.arch.layers, cfg.pp);
    let activations::Activations { row: acts_row, per_layer, embedding, head_and_loss, in_flight_num, in_flight_den } =
        if cfg.framework != config::Framework::Megatron {
            activations::activations_of(&setup, &pieces, layers)
        } else {
            activations::megatron_activations(cfg, recipe, stage, layers)
        };
    let acts_bytes = acts_row.bytes;
    rows.push(acts_row);
    let received = pipeline_inputs_row(cfg, recipe, stage, in_flight_num.div_ceil(in_flight_den.max(1)));
    let received_bytes = received.as_ref().map_or(0, |r| r.bytes);
    rows.extend(received);
    let gathered = overhead::gathered_layer_bytes(cfg, recipe, groups);
    let gathered_bytes = gathered.as_ref().map_or(0, |r| r.bytes);
    rows.extend(gathered);
    rows.extend(overhead::head_unit_row(cfg, recipe, groups).filter(|_| stage.has_head()));
    rows.extend(overhead::root_unit_row(cfg, recipe, groups).filter(|_| stage.has_head() && stage.has_embedding()));
    rows.extend(overhead::end_units_row(cfg, recipe, groups).filter(|_| stage.has_head() && stage.has_embedding()));
    let sh = sharding::Sharding::of(cfg);
    let temps = optimizer::step_temporary_bytes(
        cfg.optim,
        optimizer::step_impl(cfg),
        &super::precision::trainable_recipe(cfg, recipe),
        groups,
        &sh.shards(1),
    )
    .filter(|_| cfg.offload == Offload::None);
    let temp_bytes = temps.as_ref().map_or(0, |r| r.bytes);
    rows.extend(temps);
    let ctx = overhead::cuda_context_bytes(cfg);
    let nccl = overhead::nccl_buffer_bytes(cfg);
    let blas = overhead::blas_workspace_bytes(cfg);
    let paged = bytes_of(&rows, RowId::PagedOptimizerStates);
    let outside = ctx.bytes + nccl.as_ref().map_or(0, |r| r.bytes) + blas.as_ref().map_or(0, |r| r.bytes) + paged;

    // The step, op by op (see `step`): its peak above what is resident, piece by piece.
    let other_micro = acts_bytes.saturating_sub(embedding + per_layer * layers as u128 + head_and_loss) + received_bytes;
    let resident = resident_of(cfg, &rows, &host, stage, other_micro);
    let other_temp = if cfg.optim == config::Optimizer::Adamw { 0 } else { temp_bytes };
    let fast = step::fast::stage_with(&setup, &pieces, other_temp, runs);
    let beside = timeline::Beside {
        resident: [resident.weights, resident.gradients, resident.optimizer, resident.activations, resident.buffers + resident.batch],
        outside_allocator: outside,
        frag_pct: cfg.frag_pct.unwrap_or(0),
        // Under torchtune's distributed recipes the layers' units are in the stream.
        gathered: if sharding::tune_fsdp2(cfg) { 0 } else { gathered_bytes },
    };
    let tl = timeline::derive(&fast.segments, &beside);
    rows.extend(working_row(&fast, &rows));
    let peak_at = fast.segments.get(tl.peak).and_then(|c| c.at);
    let peak_dynamic: Bytes = tl.peak_event().map_or(0, |e| e.by_category[1] + e.by_category[3] + e.by_category[4]);
    rows.push(ctx);
    rows.extend(nccl);
    rows.extend(blas);
    if let Some(pct) = cfg.frag_pct {
        rows.push(overhead::reserve_guess_bytes(pct, peak_dynamic));
    }
    let allocated_peak = resident.total() + fast.peak;
    let load_allocated_peak = super::loading::peak(cfg, resident.weights, groups, capacity(cfg));
    StageResult {
        rows,
        host,
        timeline: tl,
        peak_at,
        work_at: fast.at,
        allocated_peak,
        load_allocated_peak,
        in_flight: other_micro,
        first_backward,
    }
}

/// The ledger of the most loaded GPU for `cfg`, as numbers: every row's bytes, the peak and
/// the verdict, with each row's `expr` folded to its value (see [`expr::numbers_only`]). This is
/// the path the UI recomputes on every input and the planner runs for every candidate; open a
/// row's formula with [`explain`].
pub fn estimate(cfg: &Config) -> Result<Estimate, EstimateError> {
    expr::numbers_only(|| ledger_of(cfg))
}

/// The same estimate with every row's formula built in full (symbols, substitution, legend):
/// what the ledger shows when a row is opened, and what `--json` prints. Both paths run the same
/// term functions, so their bytes are equal (tested on every preset).
///
/// Unless `frag_pct` overrides it (or `kernels = cpu`, which has no caching allocator), the
/// step is also replayed through the caching allocator ([`with_reserve`]): the ledger gains the
/// simulated reserve row, and the verdict decides on the nvidia-smi figure.
pub fn explain(cfg: &Config) -> Result<Estimate, EstimateError> {
    let e = expr::with_formulas(|| ledger_of(cfg))?;
    with_reserve(cfg, e)
}

/// Whether the step is replayed through the caching allocator: not under a `frag_pct` override,
/// nor with `kernels = cpu` (no caching allocator).
pub fn replays_allocator(cfg: &Config) -> bool {
    cfg.frag_pct.is_none() && cfg.kernels != config::Kernels::Cpu
}

/// Adds the caching allocator's simulated reserve to an estimate of `cfg` (see [`reserve`]):
/// the row `R_res = max_memory_reserved − allocated peak`, `memory.reserved_peak`, and
/// `memory.nvidia_smi = reserved + CUDA context + cuBLAS workspaces + NCCL buffers`, which
/// [`Estimate::fits`] then decides on. Leaves the estimate as it is where the allocator is not
/// replayed ([`replays_allocator`]).
pub fn with_reserve(cfg: &Config, e: Estimate) -> Result<Estimate, EstimateError> {
    if !replays_allocator(cfg) || e.components.iter().any(|r| r.id == RowId::AllocatorReserve) {
        return Ok(e);
    }
    let at = e.stream_at();
    Ok(attach_reserve(e, &reserve::reserved(cfg, at)?))
}

/// The stage whose step is simulated op by op and replayed through the caching allocator: the
/// most loaded one, as [`estimate`] finds it (without pipeline parallelism, the whole model,
/// and no estimate is needed to say so).
pub fn stream_at(cfg: &Config) -> Result<StreamAt, EstimateError> {
    if cfg.pp <= 1 {
        validate(cfg)?;
        return Ok(StreamAt::WHOLE);
    }
    estimate(cfg).map(|e| e.stream_at())
}

/// The step of the most loaded GPU as an event stream (see [`step`]): [`stream_at`]'s stage.
pub fn step_stream(cfg: &Config) -> Result<step::Stream, EstimateError> {
    stream_of(cfg, stream_at(cfg)?)
}

/// What `torch.cuda.memory_allocated()` shows right after the forward pass and its loss, with
/// the model's output still held (`out = model(input_ids, labels=labels)`: transformers returns
/// the logits beside the loss): what is resident before the step (parameters, optimizer states,
/// buffers, the batch, resident gradients) + the step stream's live bytes after its last forward
/// or loss event + the logits, which the stream frees there (the tracker's reference run drops
/// the output). The verify script measures the same moment.
pub fn after_forward(cfg: &Config) -> Result<Bytes, EstimateError> {
    Ok(after_forward_of(&step_stream(cfg)?))
}

/// What lives outside the caching allocator while the model loads: the CUDA context, and NCCL's
/// buffers for the loaders that communicate (`meta-sharded` broadcasts, `zero-init` gathers);
/// cuBLAS's workspaces come with the first GEMM.
fn load_outside(cfg: &Config, rows: &[Row]) -> Bytes {
    let sharded = matches!(super::loading::effective(cfg), config::Load::MetaSharded | config::Load::ZeroInit);
    rows.iter().filter(|r| r.id == RowId::CudaContext || (sharded && r.id == RowId::NcclBuffers)).map(|r| r.bytes).sum()
}

/// [`with_reserve`] with the replay already run (`r`, of the same configuration).
pub fn attach_reserve(mut e: Estimate, r: &reserve::Reserved) -> Estimate {
    let reserved = r.step_reserved_peak.max(e.memory.allocated_peak);
    let row = expr::with_formulas(|| overhead::reserve_simulated_bytes(reserved, e.memory.allocated_peak));
    let row = if r.at.is_empty() {
        row
    } else {
        let n = format!("{}; reserved memory peaks at {}", row.note, r.at);
        row.note(n)
    };
    let outside: Bytes = e.components.iter().filter(|c| c.id.outside_allocator()).map(|c| c.bytes).sum();
    e.memory.framework_overhead += row.bytes;
    e.memory.total += row.bytes;
    e.components.push(row);
    // What the coarse timeline holds beyond the step's stream and the rows outside the
    // allocator (ZeRO-3's gathered layers in flight) is allocated too: it comes on top.
    let beyond_stream = (e.memory.peak + e.memory.paged_evicted).saturating_sub(e.memory.allocated_peak + outside);
    e.memory.reserved_peak = Some(r.reserved_peak.max(reserved));
    e.memory.step_reserved_peak = Some(reserved);
    let paged = e.paged_states();
    let full = reserved + outside + beyond_stream;
    let shown = paged_evicted(full, paged, e.capacity);
    if shown < full {
        e.warnings.push(paged_warning(full - shown, paged));
    }
    e.memory.nvidia_smi = Some(shown);
    // The peak in use leaves out what the replay finds evicted, not what the ledger guessed.
    e.memory.peak = e.memory.peak + e.memory.paged_evicted - (full - shown);
    e.memory.paged_evicted = full - shown;
    let load_reserved = r.load_reserved_peak.max(e.memory.load_allocated_peak);
    e.memory.load_reserved_peak = Some(load_reserved);
    e.memory.load_peak = load_reserved + (e.memory.load_peak - e.memory.load_allocated_peak);
    e
}

/// The ledger with every row's formula built in full, no reserve (what [`explain`] and
/// `Analysis::explain` add it to).
pub fn with_formulas(cfg: &Config) -> Result<Estimate, EstimateError> {
    expr::with_formulas(|| ledger_of(cfg))
}

/// Each pipeline stage's allocated peak (`torch.cuda.max_memory_allocated` on a GPU of that
/// stage), first to last (one entry, [`Stage::Whole`], without pipeline parallelism): what the
/// ledger's most loaded stage is chosen from, for a comparison stage by stage.
pub fn allocated_peaks_by_stage(cfg: &Config) -> Result<Vec<(Stage, Bytes)>, EstimateError> {
    validate(cfg)?;
    let recipe = recipe(cfg.precision);
    let (mut built, mut runs) = (Vec::new(), Vec::new());
    Ok(expr::numbers_only(|| {
        stages(cfg.pp).iter().map(|&stage| (stage, stage_result(cfg, &recipe, stage, &mut built, &mut runs).allocated_peak)).collect()
    }))
}

fn ledger_of(cfg: &Config) -> Result<Estimate, EstimateError> {
    validate(cfg)?;
    let recipe = recipe(cfg.precision);
    let counts = cfg.arch.counts();
    let mut best: Option<(Stage, StageResult)> = None;
    // Decoder-layer programs built for one stage, and their runs, serve the others.
    let (mut built, mut runs) = (Vec::new(), Vec::new());
    for &stage in stages(cfg.pp) {
        let r = stage_result(cfg, &recipe, stage, &mut built, &mut runs);
        if best.as_ref().is_none_or(|(_, b)| r.timeline.peak_bytes() > b.timeline.peak_bytes()) {
            best = Some((stage, r));
        }
    }
    let (stage, best) = best.unwrap_or((
        Stage::Whole,
        StageResult {
            rows: Vec::new(),
            host: Vec::new(),
            timeline: timeline::Timeline { events: Vec::new(), peak: 0 },
            peak_at: None,
            work_at: None,
            allocated_peak: 0,
            load_allocated_peak: 0,
            in_flight: 0,
            first_backward: false,
        },
    ));
    let (StageResult { rows: components, host, timeline, allocated_peak, load_allocated_peak, in_flight, first_backward, .. }, peak_label) =
        best.labelled();
    // Full fine-tuning trains every parameter; adapters are counted on the unsplit model.
    let trainable = if cfg.finetune == Finetune::Full {
        counts.total
    } else {
        let whole = Config { tp: 1, pp: 1, ep: 1, cp: 1, gpus: 1, ..cfg.clone() };
        params::elements(&local_groups(&whole, Stage::Whole), |g| g.role == Role::Trainable)
    };
    let s = Summary::of(&components);
    let memory = Memory {
        parameters: s.parameters,
        gradients: s.gradients,
        optimizer_states: s.optimizer_states,
        activations: s.activations,
        transient: s.transient,
        framework_overhead: s.framework_overhead,
        total: s.total,
        peak: timeline.peak_bytes(),
        host: host.iter().map(|r| r.bytes).sum(),
        peak_event: timeline.peak_event().map(timeline::Event::label).unwrap_or_default(),
        peak_op: peak_label,
        allocated_peak,
        reserved_peak: None,
        nvidia_smi: None,
        step_reserved_peak: None,
        load_peak: load_allocated_peak + load_outside(cfg, &components),
        load_allocated_peak,
        load_reserved_peak: None,
        paged_evicted: 0,
    };
    let paged = bytes_of(&components, RowId::PagedOptimizerStates);
    // The pages the driver evicts are not in use on the GPU at the peak.
    let evicted = memory.peak - paged_evicted(memory.peak, paged, capacity(cfg));
    let memory = Memory { paged_evicted: evicted, peak: memory.peak - evicted, ..memory };
    let dp = cfg.dp();
    let layout = Layout {
        gpus: cfg.gpus,
        dp,
        tp: cfg.tp,
        pp: cfg.pp,
        cp: cfg.cp,
        ep: cfg.ep,
        shard: sharding::Sharding::of(cfg).n,
        stage,
        stage_layers: params::stage_layers(cfg.arch.layers, cfg.pp),
        in_flight_activations: in_flight,
        first_backward,
        tokens_per_step: cfg.batch as u128 * cfg.seq as u128 * cfg.accum as u128 * dp as u128,
    };
    let mut warnings = Vec::new();
    // Where the allocator is replayed, `attach_reserve` decides the evicted pages (and warns).
    if memory.paged_evicted > 0 && !replays_allocator(cfg) {
        warnings.push(paged_warning(memory.paged_evicted, paged));
    }
    if cfg.sp && cfg.tp == 1 {
        warnings.push("sequence parallelism has no effect without tensor parallelism (tp = 1)".to_string());
    }
    if cfg.arch.softcap && cfg.attn == config::Attention::Sdpa && cfg.framework == config::Framework::Hf {
        warnings.push(
            "transformers 5 refuses sdpa for Gemma-2 (its soft-capping needs eager or flash attention); estimated as if it ran".to_string(),
        );
    }
    if cfg.arch.family == family::Family::GptOss && cfg.attn == config::Attention::Sdpa && cfg.framework == config::Framework::Hf {
        warnings.push(
            "transformers 5.24 runs gpt-oss with eager attention only (sinks); sdpa is estimated as a flash kernel keeping q, k, v, the output and the log-sum-exp (not measured)".to_string(),
        );
    }
    // Pinned host memory per node (offloaded activations and the other host rows, one set per
    // GPU process) against `host_ram_gib`.
    let host_bytes: Bytes = memory.host;
    let per_node = host_bytes.saturating_mul(cfg.gpus.clamp(1, cfg.gpus_per_node.max(1)) as u128);
    let ram = (cfg.host_ram_gib * (1u64 << 30) as f64) as u128;
    if host_bytes > 0 && per_node > ram {
        warnings.push(format!(
            "host memory per node ({} GiB: {} GiB per GPU process) exceeds host_ram_gib = {}",
            per_node >> 30,
            host_bytes >> 30,
            cfg.host_ram_gib
        ));
    }
    if cfg.seq > cfg.arch.max_pos && cfg.arch.max_pos > 0 {
        warnings.push(format!("seq = {} exceeds the model's max_position_embeddings = {}", cfg.seq, cfg.arch.max_pos));
    }
    Ok(Estimate {
        model: cfg.display_name(),
        parameter_count: counts.total,
        trainable_parameter_count: trainable,
        active_parameter_count: counts.active,
        parameter_tensors: counts.tensors,
        breakdown: counts.by_part,
        layout,
        components,
        host,
        memory,
        capacity: capacity(cfg),
        timeline,
        textbook: activations::textbook_rows(cfg),
        warnings,
    })
}

/// Every row of the ledger, depth first (parents before their children).
pub fn flatten(rows: &[Row]) -> Vec<&Row> {
    let mut out = Vec::new();
    fn walk<'a>(rows: &'a [Row], out: &mut Vec<&'a Row>) {
        for r in rows {
            out.push(r);
            walk(&r.children, out);
        }
    }
    walk(rows, &mut out);
    out
}

/// The category totals (for charts).
pub fn by_category(e: &Estimate) -> Vec<(Category, Bytes)> {
    let s = Summary::of(&e.components);
    Category::ALL.iter().map(|&c| (c, s.get(c))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::config::{Precision, Zero};

    #[test]
    fn the_default_estimate_adds_up_to_its_rows() {
        let e = estimate(&Config::default()).expect("default config is valid");
        let sum: Bytes = e.components.iter().map(|r| r.bytes).sum();
        assert_eq!(e.memory.total, sum);
        assert_eq!(e.parameter_count, 8_030_261_248);
        assert_eq!(e.trainable_parameter_count, 8_030_261_248);
    }

    #[test]
    fn every_row_equals_its_formula() {
        let cfg = Config { gpus: 8, zero: Zero::Z3, ..Config::default() };
        let e = estimate(&cfg).expect("valid");
        for r in flatten(&e.components) {
            assert_eq!(r.bytes, r.expr.eval(), "{}", r.id);
        }
    }

    #[test]
    fn inconsistent_parallelism_names_the_key() {
        let err = estimate(&Config { gpus: 6, tp: 4, ..Config::default() }).err();
        assert_eq!(err.map(|e| e.key()), Some("tp"));
        let err = estimate(&Config { ep: 2, gpus: 2, ..Config::default() }).err();
        assert_eq!(err.map(|e| e.key()), Some("ep"));
        let err = estimate(&Config { offload: Offload::OptimizerParams, ..Config::default() }).err();
        assert_eq!(err.map(|e| e.key()), Some("offload"));
    }

    #[test]
    fn llama_3_1_8b_mixed_bf16_adamw_needs_16_bytes_per_parameter_of_model_states() {
        let e = estimate(&Config { precision: Precision::MixedBf16, ..Config::default() }).expect("valid");
        let states: Bytes = [RowId::Weights, RowId::Gradients, RowId::MasterWeights, RowId::OptimizerStates]
            .into_iter()
            .filter_map(|id| e.row(id))
            .map(|r| r.bytes)
            .sum();
        assert_eq!(states, 16 * 8_030_261_248);
    }

    #[test]
    fn paged_states_fill_only_what_the_rest_of_the_step_leaves_free() {
        const GB: Bytes = 1_000_000_000;
        // 30 GB with 10 GB paged on a 24 GB card: 4 GB of pages evicted, the card full.
        assert_eq!(paged_evicted(30 * GB, 10 * GB, 24 * GB), 24 * GB);
        // Room for every page: all resident.
        assert_eq!(paged_evicted(12 * GB, 10 * GB, 24 * GB), 12 * GB);
        // The rest alone (26 GB) does not fit: every page evicted, 2 GB still missing.
        assert_eq!(paged_evicted(36 * GB, 10 * GB, 24 * GB), 26 * GB);
        assert_eq!(paged_evicted(30 * GB, 0, 24 * GB), 30 * GB);
    }

    #[test]
    fn paged_8bit_adam_takes_its_large_states_out_of_the_allocated_peak_and_fits_by_evicting_them() {
        use crate::estimator::config::Optimizer;
        // Llama 3.1 8B, bf16, every parameter trained with bitsandbytes' 8-bit Adam stepped in
        // backward on a 24 GB card (torchtune's 8B_full_single_device): its uint8 states of
        // tensors of ≥ 10⁵ elements, 2 B a parameter, are paged.
        let base = Config {
            precision: Precision::Bf16,
            optim: Optimizer::Adam8bit,
            optim_in_bwd: true,
            batch: 1,
            seq: 512,
            recompute: crate::estimator::config::Recompute::Full,
            gpu: "rtx-4090".into(),
            ..Config::default()
        };
        let plain = explain(&base).expect("valid");
        let paged = explain(&Config { optim_paged: true, ..base.clone() }).expect("valid");
        let moved = paged.paged_states();
        // Every tensor of Llama 3.1 8B but the norms (4,096 elements) has ≥ 10⁵: 2 B each.
        let norms = (2 * 32 + 1) * 4096;
        assert_eq!(moved, 2 * (8_030_261_248 - norms));
        assert_eq!(plain.paged_states(), 0);
        assert_eq!(plain.memory.allocated_peak - paged.memory.allocated_peak, moved);
        assert!(!plain.fits(), "16 GB of bf16 weights and 16 GB of states do not fit a 24 GB card");
        // The rest fits; the driver evicts the pages that do not: nvidia-smi shows a full card.
        assert!(paged.fits());
        assert_eq!(paged.memory.nvidia_smi, Some(paged.capacity));
        assert!(paged.memory.paged_evicted > 0 && paged.memory.paged_evicted < moved);
        // The peak in use on the card leaves the evicted pages out too.
        assert!(paged.memory.peak <= paged.capacity, "{} > {}", paged.memory.peak, paged.capacity);
        assert!(paged.warnings.iter().any(|w| w.contains("paged optimizer states do not fit")), "{:?}", paged.warnings);
        // On a CPU (the validation harness) bitsandbytes does not page.
        let cpu = estimate(&Config { optim_paged: true, kernels: crate::estimator::config::Kernels::Cpu, ..base.clone() }).expect("valid");
        assert_eq!(cpu.paged_states(), 0);
        // bitsandbytes' PagedAdamW on a CPU: its states are fp32 (not the bf16 weights' dtype).
        let adamw = Config { optim: Optimizer::Adamw, optim_paged: true, kernels: crate::estimator::config::Kernels::Cpu, ..base.clone() };
        let states = estimate(&adamw).expect("valid").row(RowId::OptimizerStates).expect("states row").note.clone();
        assert!(states.starts_with("bitsandbytes' 32-bit states (fp32); none paged"), "{states}");
        // A `frag_pct` override skips the allocator's replay: the ledger's own peak leaves the
        // evicted pages out, and the same warning says so.
        let guessed = explain(&Config { optim_paged: true, frag_pct: Some(5), ..base }).expect("valid");
        assert!(guessed.memory.paged_evicted > 0);
        assert!(guessed.warnings.iter().any(|w| w.contains("paged optimizer states do not fit")), "{:?}", guessed.warnings);
    }

    #[test]
    fn bitsandbytes_before_0_43_2_keeps_each_4bit_linears_input_for_backward() {
        use crate::estimator::config::{Finetune, LoraTargets};
        // Llama 2 7B QLoRA on q and v, b1 s1024, bf16: from layer 0's attention output on, every
        // input of a 4-bit linear needs a gradient, and MatMul4Bit of 0.42 keeps it. Per later
        // layer: the norms' outputs (qkv's, shared; gate/up's, shared), o_proj's input and
        // down_proj's [T, 11008]: (3 × 4096 + 11008) × 2 B a token, and layer 0 keeps all but
        // its qkv input. `estimate` counts only what is new: tensors nothing else saves.
        let base = Config {
            model: "llama-2-7b".into(),
            finetune: Finetune::Qlora,
            lora_targets: LoraTargets(LoraTargets::Q | LoraTargets::V),
            precision: Precision::Bf16,
            batch: 1,
            seq: 1024,
            ..Config::default()
        };
        let now = estimate(&base).expect("valid");
        let old = estimate(&Config { bnb_keeps_input: true, ..base.clone() }).expect("valid");
        let kept = old.memory.activations - now.memory.activations;
        let per_token_layer: Bytes = (3 * 4096 + 11008) * 2;
        let upper = per_token_layer * 1024 * 32;
        assert!(kept > upper / 2 && kept <= upper, "kept {kept} of at most {upper}");
        assert!(old.memory.allocated_peak > now.memory.allocated_peak);
        // Over a bf16 base (plain LoRA) there is no 4-bit linear: the key changes nothing.
        let lora = Config { finetune: Finetune::Lora, ..base };
        assert_eq!(
            estimate(&Config { bnb_keeps_input: true, ..lora.clone() }).expect("valid").memory.activations,
            estimate(&lora).expect("valid").memory.activations
        );
    }

    /// Llama 2 7B QLoRA on q and v, b1 s1024, bf16, bitsandbytes 0.42.0 as litgpt of
    /// 2024-07-24 runs it (no double quantization, inputs kept).
    fn litgpt_qlora() -> Config {
        use crate::estimator::config::LoraTargets;
        Config {
            model: "llama-2-7b".into(),
            arch: crate::estimator::presets::preset("llama-2-7b").expect("preset").spec,
            finetune: Finetune::Qlora,
            lora_targets: LoraTargets(LoraTargets::Q | LoraTargets::V),
            precision: Precision::Bf16,
            batch: 1,
            seq: 1024,
            qlora_double_quant: false,
            bnb_keeps_input: true,
            ..Config::default()
        }
    }

    #[test]
    fn under_lightnings_bitsandbytes_plugin_the_lm_head_is_stored_in_nf4_too() {
        // The head [32,000, 4,096] = 131,072,000 weights: 262,144,000 B in bf16 leave the
        // frozen row; NF4 without double quantization adds 131,072,000 / 2 = 65,536,000 B of
        // codes, 4 × 131,072,000 / 64 = 8,192,000 B of fp32 absmax and its 64-byte code table.
        let plain = estimate(&litgpt_qlora()).expect("valid");
        let lightning = estimate(&Config { qlora_lightning: true, ..litgpt_qlora() }).expect("valid");
        let row = |e: &Estimate, id| bytes_of(&e.components, id) as i128;
        assert_eq!(row(&lightning, RowId::FrozenWeights) - row(&plain, RowId::FrozenWeights), -262_144_000);
        assert_eq!(row(&lightning, RowId::QuantizedWeights) - row(&plain, RowId::QuantizedWeights), 65_536_000 + 8_192_000 + 64);
    }

    #[test]
    fn under_lightnings_plugin_each_dequantization_is_fp16_then_copied_to_bf16() {
        // Lightning quantizes `weight.to(torch.half)`: bitsandbytes 0.42.0's
        // `dequantize_4bit(B, state).to(A.dtype)` writes the head's 131,072,000 weights in fp16
        // (262,144,000 B), then a bf16 copy of the same size, in forward and in backward.
        let s = crate::estimator::step_stream(&Config { qlora_lightning: true, ..litgpt_qlora() }).expect("valid");
        let head = |op: &str, dtype| {
            s.events
                .iter()
                .filter(|e| e.module == "lm_head" && e.op == op && e.dtype == dtype && e.kind == crate::estimator::step::EventKind::Alloc)
                .map(|e| e.bytes)
                .collect::<Vec<_>>()
        };
        use crate::estimator::step::ir::DType;
        assert_eq!(head("dequantize_4bit", DType::Fp16), vec![262_144_000, 262_144_000]);
        assert_eq!(head("_to_copy", DType::Bf16), vec![262_144_000, 262_144_000]);
        // Without the plugin the head stays a bf16 nn.Linear: nothing dequantized there.
        let plain = crate::estimator::step_stream(&litgpt_qlora()).expect("valid");
        assert!(!plain.events.iter().any(|e| e.module == "lm_head" && e.op == "dequantize_4bit"));
    }

    #[test]
    fn litgpts_loop_holds_the_previous_micro_batchs_kept_inputs_and_fp32_logits_through_the_next_forward() {
        // Per token: each of 32 layers keeps q/k/v's input (4,096), o's (4,096), gate/up's
        // (4,096) and down's (11,008); the 4-bit head its input (4,096): 32 × 23,296 + 4,096 =
        // 749,568 bf16 elements, × 1,024 tokens × 2 B = 1,535,115,264 B; the fp32 logits
        // 1,024 × 32,000 × 4 = 131,072,000 B.
        let cfg = Config { qlora_lightning: true, holds_prev_logits: true, ..litgpt_qlora() };
        let groups = local_groups(&cfg, Stage::Whole);
        assert_eq!(crate::estimator::step::model::kept_4bit_input_widths(&groups), 749_568);
        let s = crate::estimator::step_stream(&cfg).expect("valid");
        let idx = |op: &str, kind| s.events.iter().position(|e| e.op == op && e.kind == kind);
        use crate::estimator::step::EventKind::{Alloc, Free};
        let bytes = |op: &str| s.events.iter().find(|e| e.op == op && e.kind == Alloc).map(|e| e.bytes);
        assert_eq!(bytes("previous MatMul4Bit inputs"), Some(1_535_115_264));
        assert_eq!(bytes("previous logits (fp32)"), Some(131_072_000));
        // Both go once this micro-batch's fp32 logits exist, before the loss's log-softmax.
        let lsm = idx("_log_softmax", Alloc).expect("the loss");
        for op in ["previous MatMul4Bit inputs", "previous logits (fp32)"] {
            let (a, f) = (
                idx(op, Alloc).expect("allocated"),
                s.events.iter().position(|e| e.kind == Free && e.id == s.events[idx(op, Alloc).unwrap_or(0)].id),
            );
            assert!(f.is_some_and(|f| a < f && f < lsm), "{op}: {a} {f:?} {lsm}");
        }
        // Held at the head, they set the run's peak: above the step without them by at least
        // the kept inputs less what the loss and the head's backward add over the forward's end.
        let without = estimate(&Config { holds_prev_logits: false, ..cfg.clone() }).expect("valid");
        let with = estimate(&cfg).expect("valid");
        assert!(
            with.memory.allocated_peak > without.memory.allocated_peak + 1_000_000_000,
            "{} vs {}",
            with.memory.allocated_peak,
            without.memory.allocated_peak
        );
        // Without kept inputs (bitsandbytes 0.43.2 on) only the fp32 logits stay.
        let fixed = crate::estimator::step_stream(&Config { bnb_keeps_input: false, ..cfg }).expect("valid");
        assert!(!fixed.events.iter().any(|e| e.op == "previous MatMul4Bit inputs"));
        assert!(fixed.events.iter().any(|e| e.op == "previous logits (fp32)" && e.bytes == 131_072_000));
    }
}
