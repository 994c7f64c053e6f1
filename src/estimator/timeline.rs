//! One training step as a sequence of events, with the memory in use after each — the analytic
//! twin of PyTorch's memory snapshot viewer (`torch.cuda.memory._record_memory_history`).
//!
//! Forward grows the saved activations layer by layer; the loss briefly holds the logits and
//! their fp32 copy; backward frees each layer's activations as its gradients appear; the
//! optimizer step adds its temporaries. Bytes here are what the caching allocator hands out, plus
//! fragmentation in proportion to the dynamic part (gradients, activations, working buffers) and
//! the memory outside the allocator (CUDA context, NCCL).

use super::ledger::{Bytes, Category};
use serde::Serialize;

/// What happens at an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Start,
    Embedding,
    ForwardLayer,
    LossForward,
    LossBackward,
    BackwardLayer,
    EmbeddingBackward,
    GradientReduction,
    OptimizerStep,
    End,
}

/// Memory after one event.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Event {
    pub kind: EventKind,
    /// 1-based decoder layer for layer events, 0 otherwise.
    pub layer: u32,
    /// Bytes in use, by ledger category (`Category::ALL` order).
    pub by_category: [Bytes; 6],
    /// Their sum.
    pub bytes: Bytes,
}

impl Event {
    /// A short description: "forward layer 12", "loss backward".
    pub fn label(&self) -> String {
        match self.kind {
            EventKind::Start => "step start".into(),
            EventKind::Embedding => "embedding forward".into(),
            EventKind::ForwardLayer => format!("forward layer {}", self.layer),
            EventKind::LossForward => "LM head + loss forward".into(),
            EventKind::LossBackward => "loss + LM head backward".into(),
            EventKind::BackwardLayer => format!("backward layer {}", self.layer),
            EventKind::EmbeddingBackward => "embedding backward".into(),
            EventKind::GradientReduction => "gradient reduction".into(),
            EventKind::OptimizerStep => "optimizer step".into(),
            EventKind::End => "step end".into(),
        }
    }
}

/// The inputs of the simulation, all per GPU.
#[derive(Clone, Debug, Default)]
pub struct StepInputs {
    /// Weights (all parameter rows) — resident throughout.
    pub weights: Bytes,
    /// Optimizer states and master weights on the GPU — resident throughout.
    pub optimizer: Bytes,
    /// Gradient buffers that exist throughout (DDP buckets, ZeRO reduce buckets).
    pub grad_buffers: Bytes,
    /// Parameter gradients of the head end, of one layer, and of the embedding end.
    pub grad_head: Bytes,
    pub grad_layer: Bytes,
    pub grad_embedding: Bytes,
    /// Gradients exist from the start (accumulating over micro-batches).
    pub grads_resident: bool,
    pub layers: u64,
    /// Saved activations of other micro-batches in flight (pipeline).
    pub other_micro_batches: Bytes,
    pub act_embedding: Bytes,
    pub act_layer: Bytes,
    pub act_head_and_loss: Bytes,
    pub layer_forward: Bytes,
    pub mask_forward: Bytes,
    pub layer_backward: Bytes,
    pub recompute_layer: Bytes,
    pub loss_forward: Bytes,
    pub loss_backward: Bytes,
    /// ZeRO-3/FSDP unsharded parameters (and gradients) in flight around each layer.
    pub gathered: Bytes,
    pub optimizer_temporaries: Bytes,
    /// Memory outside the allocator: CUDA context, NCCL.
    pub outside_allocator: Bytes,
    pub frag_pct: u64,
}

/// The simulated step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Timeline {
    pub events: Vec<Event>,
    /// Index of the event with the most memory in use.
    pub peak: usize,
}

impl Timeline {
    pub fn peak_event(&self) -> Option<&Event> {
        self.events.get(self.peak)
    }
    pub fn peak_bytes(&self) -> Bytes {
        self.peak_event().map_or(0, |e| e.bytes)
    }
}

const PARAMS: usize = 0;
const GRADS: usize = 1;
const OPTIM: usize = 2;
const ACTS: usize = 3;
const TRANSIENT: usize = 4;
const OVERHEAD: usize = 5;

/// Runs the step.
pub fn simulate(x: &StepInputs) -> Timeline {
    debug_assert_eq!(Category::ALL[ACTS], Category::Activations);
    let mut events: Vec<Event> = Vec::with_capacity(2 * x.layers as usize + 10);
    let grads_all = x.grad_head + x.grad_layer * x.layers as u128 + x.grad_embedding;
    let resident_grads = if x.grads_resident { grads_all } else { 0 };
    let mut push = |kind: EventKind, layer: u64, grads: Bytes, acts: Bytes, transient: Bytes| {
        let mut c = [0u128; 6];
        c[PARAMS] = x.weights;
        c[GRADS] = x.grad_buffers + grads.max(resident_grads);
        c[OPTIM] = x.optimizer;
        c[ACTS] = x.other_micro_batches + acts;
        c[TRANSIENT] = transient;
        // Fragmentation grows with what is allocated and freed during the step (activations,
        // gradients, working buffers), not with the weights and states allocated once.
        let dynamic: Bytes = c[GRADS] + c[ACTS] + c[TRANSIENT];
        c[OVERHEAD] = x.outside_allocator + (dynamic * x.frag_pct as u128).div_ceil(100);
        events.push(Event { kind, layer: layer as u32, by_category: c, bytes: c.iter().sum() });
    };
    let l = x.layers;
    push(EventKind::Start, 0, 0, 0, 0);
    push(EventKind::Embedding, 0, 0, x.act_embedding, x.mask_forward);
    for i in 1..=l {
        let acts = x.act_embedding + x.act_layer * i as u128;
        push(EventKind::ForwardLayer, i, 0, acts, x.mask_forward + x.layer_forward + x.gathered);
    }
    let forward_done = x.act_embedding + x.act_layer * l as u128 + x.act_head_and_loss;
    push(EventKind::LossForward, 0, 0, forward_done, x.loss_forward);
    push(EventKind::LossBackward, 0, x.grad_head, forward_done, x.loss_backward);
    for i in (1..=l).rev() {
        // Layer i's activations are still alive while its backward runs, then freed.
        let acts = x.act_embedding + x.act_layer * i as u128;
        let grads = x.grad_head + x.grad_layer * (l - i + 1) as u128;
        push(EventKind::BackwardLayer, i, grads, acts, x.layer_backward + x.recompute_layer + x.gathered);
    }
    push(EventKind::EmbeddingBackward, 0, grads_all, 0, 0);
    push(EventKind::GradientReduction, 0, grads_all, 0, 0);
    push(EventKind::OptimizerStep, 0, grads_all, 0, x.optimizer_temporaries);
    // zero_grad(set_to_none=True) frees the gradients unless they accumulate.
    push(EventKind::End, 0, 0, 0, 0);
    let peak = events.iter().enumerate().max_by_key(|(i, e)| (e.bytes, std::cmp::Reverse(*i))).map_or(0, |(i, _)| i);
    Timeline { events, peak }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> StepInputs {
        StepInputs {
            weights: 100,
            optimizer: 200,
            grad_layer: 10,
            grad_head: 5,
            grad_embedding: 5,
            layers: 4,
            act_embedding: 1,
            act_layer: 30,
            act_head_and_loss: 50,
            loss_forward: 20,
            loss_backward: 40,
            ..StepInputs::default()
        }
    }

    #[test]
    fn activations_grow_through_forward_and_shrink_through_backward() {
        let t = simulate(&toy());
        let acts: Vec<Bytes> = t.events.iter().map(|e| e.by_category[ACTS]).collect();
        let fwd: Vec<Bytes> = t.events.iter().filter(|e| e.kind == EventKind::ForwardLayer).map(|e| e.by_category[ACTS]).collect();
        assert!(fwd.windows(2).all(|w| w[0] < w[1]));
        let bwd: Vec<Bytes> = t.events.iter().filter(|e| e.kind == EventKind::BackwardLayer).map(|e| e.by_category[ACTS]).collect();
        assert!(bwd.windows(2).all(|w| w[0] > w[1]));
        assert_eq!(acts.last(), Some(&0));
    }

    #[test]
    fn the_peak_is_at_the_start_of_backward_for_a_large_loss() {
        // At loss backward: 100 + 200 + 5 (head grads) + 1 + 120 + 50 (acts) + 40 = 516.
        let t = simulate(&toy());
        let peak = t.peak_event().map(|e| (e.kind, e.bytes));
        assert_eq!(peak, Some((EventKind::LossBackward, 516)));
    }

    #[test]
    fn every_event_adds_up_its_categories() {
        let t = simulate(&StepInputs { frag_pct: 10, outside_allocator: 7, ..toy() });
        for e in &t.events {
            assert_eq!(e.bytes, e.by_category.iter().sum::<Bytes>());
        }
    }

    #[test]
    fn accumulated_gradients_stay_resident_through_forward() {
        let t = simulate(&StepInputs { grads_resident: true, ..toy() });
        let start = &t.events[0];
        assert_eq!(start.by_category[GRADS], 5 + 40 + 5);
    }
}
