//! One training step as a sequence of coarse events — embedding, each layer forward, the loss,
//! each layer backward, the optimizer — each with the most memory in use during it, for the
//! charts. Derived from the op-level step (`step`): each event is the maximum of one piece of the
//! event stream, plus what is resident beside the stream (weights, optimizer states) and the
//! memory outside the caching allocator (CUDA context, NCCL, and the fragmentation override).

use super::ledger::{Bytes, Category};
use super::step::fast::{Coarse, Piece};
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

/// What the step holds beside its stream, and the memory outside PyTorch's allocator.
#[derive(Clone, Debug, Default)]
pub struct Beside {
    /// Resident bytes by category (parameters, gradients, optimizer states, activations of other
    /// micro-batches, transient: buffers and the batch).
    pub resident: [Bytes; 5],
    /// CUDA context and NCCL buffers.
    pub outside_allocator: Bytes,
    /// Fragmentation override, percent of the dynamic allocations (0: none).
    pub frag_pct: u64,
    /// ZeRO-3/FSDP unsharded layers in flight around each layer's forward and backward.
    pub gathered: Bytes,
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
/// The index of what lives outside the allocator (and fragmentation) in an event's `by_category`.
pub const OVERHEAD: usize = 5;

/// Percent: what a `frag_pct` override is a share of.
const PERCENT: u128 = 100;

/// The fragmentation override's bytes at one event: ⌈dynamic × frag_pct / 100⌉ of the bytes
/// allocated and freed during the step. Without an override (the usual case) it is 0, and the
/// `u128` division every event would pay is skipped.
fn fragmentation_bytes(dynamic: Bytes, frag_pct: u64) -> Bytes {
    if frag_pct == 0 {
        0
    } else {
        (dynamic * frag_pct as u128).div_ceil(PERCENT)
    }
}

/// The coarse timeline of a step from its segments (each the most memory alive in one piece of
/// the stream, split into activations, gradients and transient bytes): one event per segment,
/// with the resident bytes and the memory outside the allocator added.
pub fn derive(segments: &[Coarse], x: &Beside) -> Timeline {
    debug_assert_eq!(Category::ALL[ACTS], Category::Activations);
    let events: Vec<Event> = segments
        .iter()
        .map(|s| {
            let (kind, layer) = match s.piece {
                Piece::Start => (EventKind::Start, 0),
                Piece::Embedding => (EventKind::Embedding, 0),
                Piece::ForwardLayer(i) => (EventKind::ForwardLayer, i + 1),
                Piece::LossForward => (EventKind::LossForward, 0),
                Piece::LossBackward => (EventKind::LossBackward, 0),
                Piece::BackwardLayer(i) => (EventKind::BackwardLayer, i + 1),
                Piece::EmbeddingBackward => (EventKind::EmbeddingBackward, 0),
                Piece::Reduction => (EventKind::GradientReduction, 0),
                Piece::Optimizer => (EventKind::OptimizerStep, 0),
                Piece::End => (EventKind::End, 0),
            };
            let pos = |v: i128| v.max(0) as Bytes;
            let mut c = [0u128; 6];
            c[PARAMS] = x.resident[0];
            c[GRADS] = x.resident[1] + pos(s.cats[1]);
            c[OPTIM] = x.resident[2];
            c[ACTS] = x.resident[3] + pos(s.cats[0]);
            let gathered = if matches!(s.piece, Piece::ForwardLayer(_) | Piece::BackwardLayer(_)) { x.gathered } else { 0 };
            c[TRANSIENT] = x.resident[4] + pos(s.cats[2]) + gathered;
            // The fragmentation override grows with what is allocated and freed during the step.
            let dynamic: Bytes = c[GRADS] + c[ACTS] + c[TRANSIENT];
            c[OVERHEAD] = x.outside_allocator + fragmentation_bytes(dynamic, x.frag_pct);
            Event { kind, layer, by_category: c, bytes: c.iter().sum() }
        })
        .collect();
    let peak = events.iter().enumerate().max_by_key(|(i, e)| (e.bytes, std::cmp::Reverse(*i))).map_or(0, |(i, _)| i);
    Timeline { events, peak }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::config::Config;
    use crate::estimator::estimate;

    #[test]
    fn activations_grow_through_forward_and_shrink_through_backward() {
        let e = estimate(&Config::default()).expect("valid");
        let t = &e.timeline;
        let fwd: Vec<Bytes> = t.events.iter().filter(|e| e.kind == EventKind::ForwardLayer).map(|e| e.by_category[ACTS]).collect();
        assert!(fwd.windows(2).all(|w| w[0] < w[1]));
        let bwd: Vec<Bytes> = t.events.iter().filter(|e| e.kind == EventKind::BackwardLayer).map(|e| e.by_category[ACTS]).collect();
        assert!(bwd.windows(2).all(|w| w[0] > w[1]));
        assert_eq!(t.events.last().map(|e| e.by_category[ACTS]), Some(0));
    }

    #[test]
    fn every_event_adds_up_its_categories() {
        let e = estimate(&Config { frag_pct: Some(10), ..Config::default() }).expect("valid");
        for ev in &e.timeline.events {
            assert_eq!(ev.bytes, ev.by_category.iter().sum::<Bytes>());
        }
    }

    #[test]
    fn accumulated_gradients_stay_resident_through_forward() {
        let e = estimate(&Config { accum: 4, ..Config::default() }).expect("valid");
        let start = &e.timeline.events[0];
        let grads = e.row(crate::estimator::ledger::RowId::Gradients).map_or(0, |r| r.bytes);
        assert!(grads > 0);
        assert_eq!(start.by_category[GRADS], grads);
    }

    #[test]
    fn the_default_peak_is_in_the_loss_backward() {
        // Llama-3.1-8B at 4k: the fp32 log-softmax and its two gradients (3 × 4 × 4096 ×
        // 128,256 B ≈ 6.3 GB) top every layer's backward.
        let e = estimate(&Config::default()).expect("valid");
        assert_eq!(e.timeline.peak_event().map(|e| e.kind), Some(EventKind::LossBackward));
    }
}
