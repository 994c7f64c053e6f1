//! What the caching allocator reserves for the step: the step's event stream (see [`step`])
//! replayed through the simulator of PyTorch's `CUDACachingAllocator` ([`allocator`]).
//!
//! `torch.cuda.max_memory_reserved()` is not the allocated peak plus a percentage: every request
//! is rounded (512 B), small ones share 2 MiB segments, requests under 10 MiB take a 20 MiB
//! segment, larger ones are rounded to 2 MiB, and freed blocks stay cached in their segments, so
//! what the step reserves depends on the order and sizes of its allocations. This module feeds
//! the allocator what a training process asks for, in order:
//!
//! 1. the model's parameters, one allocation per tensor as `model.to("cuda")` makes them
//!    (`nn.Module._apply`), and what the recipe keeps beside them (fp32 master weights, ZeRO and
//!    FSDP flat shards) as one flat buffer, as DeepSpeed's `stage_1_and_2.py` and FSDP's
//!    `FlatParamHandle` allocate them; buffers and the batch;
//! 2. step 1: the stream; the optimizer's states are created lazily at its first `step()`
//!    (`torch/optim/adam.py`, `_init_group`: `zeros_like` per parameter and state), so they are
//!    allocated right before the first optimizer event;
//! 3. step 2 (the steady state): the stream again, into the cache step 1 left.
//!
//! `max_memory_reserved` over both steps is the figure nvidia-smi shows for the process, plus
//! what lives outside the allocator (CUDA context, cuBLAS workspaces, NCCL buffers).

use super::allocator::{self, AllocEvent, AllocatorOptions};
use super::config::{Config, Optimizer};
use super::ledger::Bytes;
use super::step::{self, EventKind, Phase, Stream};

use super::step_stream::{StepParts, StreamAt};
use super::validate::EstimateError;

/// What replaying the loading and the step through the caching allocator gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reserved {
    /// `torch.cuda.max_memory_reserved()` over the whole run: the loading and the first two
    /// steps.
    pub reserved_peak: Bytes,
    /// `max_memory_reserved()` over the steps alone, with what the loading left reserved (what
    /// `reset_peak_memory_stats()` after loading, then the steps, would show).
    pub step_reserved_peak: Bytes,
    /// `max_memory_reserved()` over the loading alone.
    pub load_reserved_peak: Bytes,
    /// `torch.cuda.max_memory_allocated()` as the allocator counts it (requests rounded to 512 B).
    pub allocated_peak: Bytes,
    /// Where in the step reserved memory reached its peak ("layer 3 backward, …"), or what
    /// resident allocation it was ("parameters", "optimizer states").
    pub at: String,
    /// Events replayed (resident allocations and two steps).
    pub events: usize,
}

/// Optimizer states kept per trainable parameter element-wise (one tensor each): AdamW's and
/// 8-bit Adam's `exp_avg` and `exp_avg_sq`, momentum's, Lion's and Muon's momentum buffer.
fn states_per_parameter(optim: Optimizer) -> u128 {
    match optim {
        Optimizer::Adamw | Optimizer::Adam8bit => 2,
        Optimizer::Momentum | Optimizer::Lion | Optimizer::Muon => 1,
        Optimizer::Sgd | Optimizer::Adafactor => 0,
    }
}

/// Splits `total` into the per-tensor allocations `parts` (each `part × per_unit`) when they add
/// up to it exactly, else keeps it as one flat allocation; what the parts leave over is one
/// more allocation (a flat buffer beside the per-tensor ones).
fn per_tensor_or_flat(total: Bytes, parts: &[u128], per_unit: u128, out: &mut Vec<Bytes>) {
    let sum: u128 = parts.iter().map(|p| p * per_unit).sum();
    if per_unit > 0 && sum > 0 && sum <= total {
        out.extend(parts.iter().map(|p| p * per_unit).filter(|&b| b > 0));
        if total > sum {
            out.push(total - sum);
        }
    } else if total > 0 {
        out.push(total);
    }
}

/// Replays `cfg`'s loading and step (two steps, after the resident allocations) through the
/// caching allocator with the configuration's `alloc_conf`.
pub fn reserved(cfg: &Config, at: StreamAt) -> Result<Reserved, EstimateError> {
    let opts = AllocatorOptions::parse(&cfg.alloc_conf).map_err(|e| super::validate::invalid("alloc_conf", e.to_string()))?;
    let parts = super::step_stream::step_parts(cfg, at)?;
    let r = replay_parts(cfg, &parts, &opts);
    step::model::recycle(parts.stream.events);
    Ok(r)
}

/// The allocator's view of two steps: the events, and where each comes from, by position:
/// the resident tensors (parameters first), step 1 (the optimizer states created before its
/// event `states_at`), what step 1 left allocated freed, step 2, and what it left freed.
/// Positions stand in for a per-event table: the replay only ever asks where its peak was.
struct Built {
    events: Vec<AllocEvent>,
    /// Resident allocations, and how many of them are the loading's events (the parameters and
    /// the loader's transients; `empty_cache` after it included).
    resident: usize,
    weights: usize,
    /// Optimizer states, and the stream event of step 1 they are created before (the stream's
    /// length: after it).
    states: usize,
    states_at: usize,
    /// Events in the step's stream.
    stream: usize,
    /// Frees after each step of what it left allocated.
    leftover: usize,
    /// Index of the first event of step 2 (the steady state).
    step2: usize,
}

/// Where an event of [`Built`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// The stream's event of this index.
    Stream(usize),
    /// An allocation or free outside the stream, by what it is ("" for the frees of leftovers).
    Other(&'static str),
}

impl Built {
    /// Where event `i` comes from.
    fn origin(&self, i: usize) -> Origin {
        if i < self.weights {
            return Origin::Other("loading the model");
        }
        if i < self.resident {
            return Origin::Other("buffers, batch and resident gradients");
        }
        let mut j = i - self.resident;
        if j < self.states_at {
            return Origin::Stream(j);
        }
        j -= self.states_at;
        if j < self.states {
            return Origin::Other("optimizer states");
        }
        j -= self.states;
        let after_states = self.stream - self.states_at;
        if j < after_states {
            return Origin::Stream(self.states_at + j);
        }
        j -= after_states;
        if j < self.leftover {
            return Origin::Other("");
        }
        j -= self.leftover;
        if j < self.stream {
            Origin::Stream(j)
        } else {
            Origin::Other("")
        }
    }
}

/// Steps replayed: the first (which creates the optimizer states) and the steady state.
const STEPS_REPLAYED: usize = 2;

fn sized(b: Bytes) -> u64 {
    b.min(u64::MAX as u128) as u64
}

/// The allocation sequence of [`reserved`]: resident tensors, step 1 (with the optimizer states
/// created at its first optimizer event), step 2.
fn build(cfg: &Config, parts: &StepParts) -> Built {
    let StepParts { stream, params, trainable, resident: r, groups } = parts;
    let mut weights = Vec::new();
    per_tensor_or_flat(r.weights, params, 1, &mut weights);
    // The loading first: it ends with the weights allocated (ids 0.. of `weights`, or its own
    // per-tensor allocations standing for them), then `empty_cache` if asked.
    let plan = super::loading::plan(cfg, &weights, groups, super::gpu::capacity(cfg));
    let others: Vec<Bytes> = [r.buffers, r.batch, r.gradients, r.activations].into_iter().filter(|&b| b > 0).collect();
    let k = states_per_parameter(cfg.optim);
    let numel: u128 = trainable.iter().sum();
    let mut states = Vec::new();
    if k > 0 && numel > 0 && r.optimizer.is_multiple_of(k * numel) {
        let per_element = r.optimizer / (k * numel);
        for &n in trainable {
            for _ in 0..k {
                states.push(n * per_element);
            }
        }
    } else if r.optimizer > 0 {
        states.push(r.optimizer);
    }
    let span = stream.events.iter().map(|e| e.id + 1).max().unwrap_or(0);
    // Which of the stream's ids are still allocated at its end (the same in both steps).
    let mut live = vec![false; span as usize];
    for e in &stream.events {
        live[e.id as usize] = e.kind == EventKind::Alloc;
    }
    let leftover: Vec<u32> = live.iter().enumerate().filter(|(_, &l)| l).map(|(i, _)| i as u32).collect();
    let n = stream.events.len();
    let states_at = stream.events.iter().position(|e| matches!(e.phase, Phase::Optimizer | Phase::ZeroGrad)).unwrap_or(n);

    // Every resident tensor and optimizer state once, each step's stream and its leftovers'
    // frees: sized up front, the list never grows.
    let load_events = plan.events.len() + usize::from(cfg.empty_cache);
    let resident = load_events + others.len();
    let capacity = resident + states.len() + STEPS_REPLAYED * (n + leftover.len());
    let mut events = Vec::with_capacity(capacity);
    events.extend_from_slice(&plan.events);
    if cfg.empty_cache {
        events.push(AllocEvent::EmptyCache);
    }
    let mut next = plan.next;
    for bytes in &others {
        events.push(AllocEvent::Alloc { id: next, bytes: sized(*bytes) });
        next += 1;
    }
    let mut step2 = 0;
    for step_no in 0..STEPS_REPLAYED {
        if step_no == 1 {
            step2 = events.len();
        }
        let base = next;
        next += span;
        let replay = |events: &mut Vec<AllocEvent>, range: &[step::Event]| {
            events.extend(range.iter().map(|e| match e.kind {
                EventKind::Alloc => AllocEvent::Alloc { id: base + e.id, bytes: sized(e.bytes) },
                EventKind::Free => AllocEvent::Free { id: base + e.id },
            }))
        };
        if step_no == 0 {
            replay(&mut events, &stream.events[..states_at]);
            for &bytes in &states {
                events.push(AllocEvent::Alloc { id: next, bytes: sized(bytes) });
                next += 1;
            }
            replay(&mut events, &stream.events[states_at..]);
        } else {
            replay(&mut events, &stream.events);
        }
        // Whatever a step leaves allocated is released before the next (the stream frees all
        // it allocates; this keeps the replay valid if it did not).
        events.extend(leftover.iter().map(|&id| AllocEvent::Free { id: base + id }));
    }
    Built { events, resident, weights: load_events, states: states.len(), states_at, stream: n, leftover: leftover.len(), step2 }
}

/// The replay of [`reserved`], from a step already simulated.
pub fn replay_parts(cfg: &Config, parts: &StepParts, opts: &AllocatorOptions) -> Reserved {
    let stream = &parts.stream;
    let b = build(cfg, parts);
    let n = b.events.len();
    // The loading alone: its own reserved peak (a few events).
    let load_reserved_peak = allocator::replay(&b.events[..b.weights], opts).map_or(0, |r| r.peak_reserved as Bytes);
    match allocator::replay(&b.events, opts) {
        Ok(rep) => {
            // Without `empty_cache` reserved memory only grows, so the steps' peak is the whole
            // run's unless the loading reached it; then the steps' own maximum is read off a
            // trace.
            let step_reserved_peak = if rep.peak_reserved_at >= b.weights {
                rep.peak_reserved as Bytes
            } else {
                allocator::replay_with(&b.events, opts, true)
                    .ok()
                    .and_then(|t| t.reserved_after.and_then(|v| v[b.weights..].iter().max().copied()))
                    .unwrap_or(rep.peak_reserved) as Bytes
            };
            Reserved {
                reserved_peak: rep.peak_reserved as Bytes,
                step_reserved_peak,
                load_reserved_peak,
                allocated_peak: rep.peak_allocated as Bytes,
                at: label_at(&b, stream, rep.peak_reserved_at),
                events: n,
            }
        }
        // The events are well formed by construction; should the replay still refuse them, the
        // allocated bytes stand in (no reserve is claimed).
        Err(_) => Reserved {
            reserved_peak: stream.peak,
            step_reserved_peak: stream.peak,
            load_reserved_peak,
            allocated_peak: stream.peak,
            at: String::new(),
            events: n,
        },
    }
}

fn label_at(b: &Built, stream: &Stream, i: usize) -> String {
    let i = i.min(b.events.len().saturating_sub(1));
    match b.origin(i) {
        Origin::Stream(si) => stream.events.get(si).map(step::Event::label).unwrap_or_default(),
        Origin::Other(what) => what.to_string(),
    }
}

/// One point of the step's trace: the allocated bytes by what they are, and what the caching
/// allocator has reserved, after one event of the steady-state step.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TracePoint {
    /// The stream event (index into the step's events).
    pub event: usize,
    pub phase: Phase,
    /// Decoder layer (0-based), if inside one.
    pub layer: Option<u32>,
    /// "layer 31 backward, `mlp.down_proj` mm in MmBackward0".
    pub label: String,
    /// Resident before the step: weights, optimizer states, buffers, batch, resident gradients.
    pub weights: Bytes,
    pub optimizer: Bytes,
    /// Gradients resident through the step (accumulation, ZeRO-2/3 shards, DDP buckets).
    pub resident_gradients: Bytes,
    /// Buffers, the batch, other micro-batches' activations.
    pub other_resident: Bytes,
    /// The stream's live bytes by category.
    pub activations: Bytes,
    pub gradients: Bytes,
    pub transient: Bytes,
    /// `memory_reserved()` after the event (`None` under `kernels=cpu`: no caching allocator).
    pub reserved: Option<Bytes>,
}

impl TracePoint {
    /// `memory_allocated()` after the event.
    pub fn allocated(&self) -> Bytes {
        self.weights + self.optimizer + self.resident_gradients + self.other_resident + self.activations + self.gradients + self.transient
    }
}

/// The steady-state step, op by op, downsampled for a chart: each point is the event of largest
/// allocated memory within its stretch of events (so the peak is always a point), with the
/// largest reserved memory of that stretch.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StepTrace {
    pub points: Vec<TracePoint>,
    /// Events in the step's stream.
    pub events: usize,
    /// Index (into `points`) of the allocated peak.
    pub peak: usize,
    /// The reserved peak over both replayed steps and where it happened.
    pub reserved_peak: Option<Bytes>,
    pub reserved_at: String,
}

/// The steady-state step's stream with `memory_reserved()` after each of its events.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamReserved {
    pub stream: Stream,
    /// What is resident beside the stream (weights, optimizer states, buffers, batch, …).
    pub resident: super::step::model::Resident,
    /// Reserved bytes after each event of step 2, by stream index (`None` under `kernels=cpu`).
    pub reserved: Option<Vec<Bytes>>,
    /// The reserved peak over both replayed steps, and where it happened.
    pub reserved_peak: Option<Bytes>,
    pub reserved_at: String,
}

/// `cfg`'s step stream, replayed (under `kernels=cuda`) through the caching allocator with a
/// trace of reserved memory: what `trainmem step` exports and the timeline chart draws.
pub fn stream_with_reserved(cfg: &Config, at: StreamAt) -> Result<StreamReserved, EstimateError> {
    let opts = AllocatorOptions::parse(&cfg.alloc_conf).map_err(|e| super::validate::invalid("alloc_conf", e.to_string()))?;
    let parts = super::step_stream::step_parts(cfg, at)?;
    if cfg.kernels != super::config::Kernels::Cuda {
        return Ok(StreamReserved {
            resident: parts.resident,
            stream: parts.stream,
            reserved: None,
            reserved_peak: None,
            reserved_at: String::new(),
        });
    }
    let b = build(cfg, &parts);
    let (stream, resident) = (parts.stream, parts.resident);
    Ok(match allocator::replay_with(&b.events, &opts, true) {
        Ok(rep) => {
            let mut by_event = vec![0 as Bytes; stream.events.len()];
            if let Some(after) = rep.reserved_after.as_ref() {
                for (i, &res) in after.iter().enumerate().skip(b.step2) {
                    if let Origin::Stream(si) = b.origin(i) {
                        by_event[si] = res as Bytes;
                    }
                }
            }
            let at = label_at(&b, &stream, rep.peak_reserved_at);
            StreamReserved { reserved: Some(by_event), reserved_peak: Some(rep.peak_reserved as Bytes), reserved_at: at, stream, resident }
        }
        Err(_) => StreamReserved { stream, resident, reserved: None, reserved_peak: None, reserved_at: String::new() },
    })
}

/// [`StepTrace`] of `cfg` with at most `max_points` points.
pub fn step_trace(cfg: &Config, at: StreamAt, max_points: usize) -> Result<StepTrace, EstimateError> {
    let StreamReserved { stream, resident: r, reserved: reserved_by_event, reserved_peak, reserved_at } = stream_with_reserved(cfg, at)?;
    let other_resident = r.buffers + r.batch + r.activations;
    let (mut act, mut grad, mut tmp) = (0i128, 0i128, 0i128);
    let n = stream.events.len();
    let per = n.div_ceil(max_points.max(1)).max(1);
    let mut points: Vec<TracePoint> = Vec::new();
    let mut best: Option<TracePoint> = None;
    for (i, e) in stream.events.iter().enumerate() {
        let sign = if e.kind == EventKind::Alloc { 1 } else { -1 };
        let slot = match e.cat {
            step::Cat::Activations => &mut act,
            step::Cat::Gradients => &mut grad,
            step::Cat::Transient | step::Cat::Gathered => &mut tmp,
        };
        *slot += sign * e.bytes as i128;
        let reserved = reserved_by_event.as_ref().and_then(|v| v.get(i).copied());
        let p = TracePoint {
            event: i,
            phase: e.phase,
            layer: e.layer,
            label: String::new(),
            weights: r.weights,
            optimizer: r.optimizer,
            resident_gradients: r.gradients,
            other_resident,
            activations: act.max(0) as Bytes,
            gradients: grad.max(0) as Bytes,
            transient: tmp.max(0) as Bytes,
            reserved,
        };
        best = Some(match best.take() {
            Some(b) if b.allocated() >= p.allocated() => TracePoint { reserved: b.reserved.max(p.reserved), ..b },
            Some(b) => TracePoint { reserved: b.reserved.max(p.reserved), ..p },
            None => p,
        });
        if (i + 1) % per == 0 || i + 1 == n {
            if let Some(mut b) = best.take() {
                b.label = stream.events[b.event].label();
                points.push(b);
            }
        }
    }
    let peak = points.iter().enumerate().max_by_key(|(i, p)| (p.allocated(), std::cmp::Reverse(*i))).map_or(0, |(i, _)| i);
    Ok(StepTrace { points, events: n, peak, reserved_peak, reserved_at })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_that_add_up_are_allocated_one_by_one_and_the_rest_flat() {
        let mut out = Vec::new();
        // 3 + 5 = 8 elements of 2 B = 16 B of a 40 B total: two tensors and a 24 B flat buffer.
        per_tensor_or_flat(40, &[3, 5], 2, &mut out);
        assert_eq!(out, vec![6, 10, 24]);
        let mut out = Vec::new();
        // Tensors adding to more than the total (a shard of them): one flat buffer.
        per_tensor_or_flat(10, &[3, 5], 2, &mut out);
        assert_eq!(out, vec![10]);
    }

    #[test]
    fn the_reserved_peak_is_at_least_the_allocated_peak_of_the_default_configuration() {
        let cfg = Config::default();
        let r = reserved(&cfg, StreamAt::WHOLE).expect("the default configuration is valid");
        assert!(r.reserved_peak >= r.allocated_peak, "{r:?}");
        assert!(r.events > 1000, "{r:?}");
        assert!(!r.at.is_empty());
        println!("{r:?}");
    }

    #[test]
    fn the_trace_keeps_the_allocated_peak_and_reserved_never_below_allocated() {
        let cfg = Config { seq: 1024, ..Config::default() };
        let t = step_trace(&cfg, crate::estimator::stream_at(&cfg).expect("valid"), 200).expect("valid");
        assert!(t.points.len() <= 200 && t.points.len() > 100, "{}", t.points.len());
        // The trace's peak is the estimate's allocated peak: the downsampling keeps the maximum.
        let e = crate::estimator::estimate(&cfg).expect("valid");
        assert_eq!(t.points[t.peak].allocated(), e.memory.allocated_peak);
        assert!(!t.points[t.peak].label.is_empty());
        // In the steady state the allocator holds at least what is allocated.
        for p in &t.points {
            assert!(p.reserved.expect("cuda") >= p.allocated(), "{p:?}");
        }
        assert!(t.reserved_peak.expect("cuda") >= t.points[t.peak].allocated());
    }

    #[test]
    fn a_cpu_trace_has_no_reserved_memory() {
        let cfg = Config { kernels: crate::estimator::config::Kernels::Cpu, seq: 256, ..Config::default() };
        let t = step_trace(&cfg, crate::estimator::stream_at(&cfg).expect("valid"), 50).expect("valid");
        assert!(t.points.iter().all(|p| p.reserved.is_none()) && t.reserved_peak.is_none());
    }

    #[test]
    fn expandable_segments_reserve_no_more_than_fixed_segments() {
        // Expandable segments map 2 MiB pages on demand instead of whole 20 MiB segments.
        let cfg = Config { seq: 1024, ..Config::default() };
        let fixed = reserved(&cfg, StreamAt::WHOLE).expect("valid");
        let exp = reserved(&Config { alloc_conf: "expandable_segments:True".into(), ..cfg }, StreamAt::WHOLE).expect("valid");
        assert!(exp.reserved_peak <= fixed.reserved_peak, "fixed {fixed:?} expandable {exp:?}");
        // Both hold at least what they allocate.
        assert!(exp.reserved_peak >= exp.allocated_peak);
    }

    #[test]
    fn under_pipeline_parallelism_the_replay_runs_the_most_loaded_stage_with_its_micro_batches_in_flight() {
        use crate::estimator::params::Stage;
        let llama = crate::estimator::presets::preset("llama-3.1-8b").expect("a preset").spec;
        let amp = crate::estimator::config::Precision::AmpBf16;
        // PP 2 at 8K tokens: the last stage (the 128K-vocabulary loss) is the most loaded. PP 4
        // at 2K tokens with 8 micro-batches: the first (four micro-batches in flight under 1F1B).
        let last = Config { arch: llama.clone(), precision: amp, gpus: 2, pp: 2, seq: 8192, ..Config::default() };
        let first = Config { arch: llama, precision: amp, gpus: 4, pp: 4, seq: 2048, accum: 8, ..Config::default() };
        for (cfg, stage) in [(last, Stage::Last), (first, Stage::First)] {
            let e = crate::estimator::estimate(&cfg).expect("valid");
            let at = e.stream_at();
            assert_eq!(at.stage, stage);
            assert_eq!(at.in_flight > 0, stage == Stage::First, "{at:?}");
            let r = reserved(&cfg, at).expect("valid");
            // The replay allocates what the ledger does: the same peak, each request rounded up
            // to 512 B (well under 0.1 % of it).
            let ledger = e.memory.allocated_peak;
            assert!(
                r.allocated_peak >= ledger && r.allocated_peak - ledger < ledger / 1000,
                "{stage:?}: replay {} ledger {ledger}",
                r.allocated_peak
            );
            // So the reserve row is what the allocator keeps beyond it, not a replay of a lighter
            // stage that never reaches the ledger's peak (which read 0).
            let smi = crate::estimator::with_reserve(&cfg, e).expect("valid");
            let row = smi.components.iter().find(|c| c.id == crate::estimator::ledger::RowId::AllocatorReserve).expect("a reserve row");
            assert!(row.bytes > 0, "{stage:?}: {row:?}");
            assert_eq!(smi.memory.reserved_peak, Some(r.reserved_peak.max(ledger)));
        }
    }
}
