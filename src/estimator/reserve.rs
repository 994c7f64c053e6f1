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
use super::EstimateError;

/// What replaying the step through the caching allocator gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reserved {
    /// `torch.cuda.max_memory_reserved()` over the first two steps.
    pub reserved_peak: Bytes,
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

/// Replays `cfg`'s step (two steps, after the resident allocations) through the caching
/// allocator with the configuration's `alloc_conf`.
pub fn reserved(cfg: &Config) -> Result<Reserved, EstimateError> {
    let opts = AllocatorOptions::parse(&cfg.alloc_conf).map_err(|e| super::invalid("alloc_conf", e.to_string()))?;
    let stream = super::step_stream(cfg)?;
    let (params, trainable) = super::step_param_bytes(cfg);
    Ok(replay_stream(cfg, &stream, &params, &trainable, &opts))
}

/// The replay of [`reserved`], from a stream already simulated and the program's parameter
/// tensors (`params`: bytes of every parameter tensor; `trainable`: elements of each trainable
/// one).
pub fn replay_stream(cfg: &Config, stream: &Stream, params: &[u128], trainable: &[u128], opts: &AllocatorOptions) -> Reserved {
    let r = super::resident_parts(cfg);
    // Resident allocations, in the order a training script makes them.
    let mut weights = Vec::new();
    per_tensor_or_flat(r.weights, params, 1, &mut weights);
    let mut other = Vec::new();
    for b in [r.buffers, r.batch, r.gradients, r.activations] {
        if b > 0 {
            other.push(b);
        }
    }
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

    let mut events: Vec<AllocEvent> = Vec::new();
    let mut labels: Vec<&str> = Vec::new();
    let mut next = 0u32;
    let mut alloc = |events: &mut Vec<AllocEvent>, labels: &mut Vec<&str>, bytes: Bytes, what: &'static str| {
        events.push(AllocEvent::Alloc { id: next, bytes: bytes.min(u64::MAX as u128) as u64 });
        labels.push(what);
        next += 1;
    };
    for &b in &weights {
        alloc(&mut events, &mut labels, b, "parameters");
    }
    for &b in &other {
        alloc(&mut events, &mut labels, b, "buffers, batch and resident gradients");
    }
    // Two steps: the optimizer states appear in the first one.
    let base_ids = [next, next + stream.events.iter().map(|e| e.id + 1).max().unwrap_or(0) + states.len() as u32];
    let mut stream_at: Vec<Option<usize>> = vec![None; events.len()];
    for (step_no, &base) in base_ids.iter().enumerate() {
        let first_opt = stream.events.iter().position(|e| e.phase == Phase::Optimizer || e.phase == Phase::ZeroGrad);
        let mut live: Vec<u32> = Vec::new();
        for (i, e) in stream.events.iter().enumerate() {
            if step_no == 0 && Some(i) == first_opt {
                let mut id = base + stream.events.iter().map(|e| e.id + 1).max().unwrap_or(0);
                for &b in &states {
                    events.push(AllocEvent::Alloc { id, bytes: b.min(u64::MAX as u128) as u64 });
                    labels.push("optimizer states");
                    stream_at.push(None);
                    id += 1;
                }
            }
            match e.kind {
                EventKind::Alloc => {
                    events.push(AllocEvent::Alloc { id: base + e.id, bytes: e.bytes.min(u64::MAX as u128) as u64 });
                    live.push(base + e.id);
                }
                EventKind::Free => {
                    events.push(AllocEvent::Free { id: base + e.id });
                    if let Some(p) = live.iter().rposition(|&x| x == base + e.id) {
                        live.swap_remove(p);
                    }
                }
            }
            labels.push("");
            stream_at.push(Some(i));
        }
        if step_no == 0 && first_opt.is_none() {
            let mut id = base + stream.events.iter().map(|e| e.id + 1).max().unwrap_or(0);
            for &b in &states {
                events.push(AllocEvent::Alloc { id, bytes: b.min(u64::MAX as u128) as u64 });
                labels.push("optimizer states");
                stream_at.push(None);
                id += 1;
            }
        }
        // Whatever a step leaves allocated is released before the next (the stream frees all
        // it allocates; this keeps a replay valid if it did not).
        for id in live {
            events.push(AllocEvent::Free { id });
            labels.push("");
            stream_at.push(None);
        }
    }
    let n = events.len();
    match allocator::replay(&events, opts) {
        Ok(rep) => {
            let i = rep.peak_reserved_at.min(n.saturating_sub(1));
            let at = match stream_at.get(i).copied().flatten() {
                Some(si) => stream.events.get(si).map(step::Event::label).unwrap_or_default(),
                None => labels.get(i).map(|s| s.to_string()).unwrap_or_default(),
            };
            Reserved { reserved_peak: rep.peak_reserved as Bytes, allocated_peak: rep.peak_allocated as Bytes, at, events: n }
        }
        // The events are well formed by construction; should the replay still refuse them, the
        // allocated bytes stand in (no reserve is claimed).
        Err(_) => Reserved { reserved_peak: stream.peak, allocated_peak: stream.peak, at: String::new(), events: n },
    }
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
        let r = reserved(&cfg).expect("the default configuration is valid");
        assert!(r.reserved_peak >= r.allocated_peak, "{r:?}");
        assert!(r.events > 1000, "{r:?}");
        assert!(!r.at.is_empty());
        println!("{r:?}");
    }

    #[test]
    fn expandable_segments_reserve_no_more_than_fixed_segments() {
        // Expandable segments map 2 MiB pages on demand instead of whole 20 MiB segments.
        let cfg = Config { seq: 1024, ..Config::default() };
        let fixed = reserved(&cfg).expect("valid");
        let exp = reserved(&Config { alloc_conf: "expandable_segments:True".into(), ..cfg }).expect("valid");
        assert!(exp.reserved_peak <= fixed.reserved_peak, "fixed {fixed:?} expandable {exp:?}");
        // Both hold at least what they allocate.
        assert!(exp.reserved_peak >= exp.allocated_peak);
    }
}
