//! The step as a stream of events: every allocation and free of one training step, with its
//! phase, layer, module, aten op and autograd node ([`Stream`]), and the label that names a
//! place in it.

use super::ir::DType;
use crate::estimator::ledger::Bytes;
use serde::Serialize;

/// The phases of a step, as `validation/tracker.py` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The model call up to the LM head.
    Forward,
    /// From the LM head's return to the dropped output (logits, loss).
    Loss,
    Backward,
    /// Gradient reduction across data-parallel ranks (DDP buckets, ZeRO reduce-scatter).
    Reduction,
    Optimizer,
    ZeroGrad,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Loss => "loss",
            Phase::Backward => "backward",
            Phase::Reduction => "reduction",
            Phase::Optimizer => "optimizer",
            Phase::ZeroGrad => "zero_grad",
        }
    }
}

/// What an allocation is, for the ledger's categories.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cat {
    /// Saved for backward.
    Activations,
    /// A parameter's gradient.
    Gradients,
    /// Everything else: working buffers, activation gradients, temporaries.
    Transient,
    /// An FSDP unit's gathered parameters, unsharded gradient and reduce-scatter input
    /// (`ir::Unit`): transient, counted apart so that its own ledger row (`gathered_head`)
    /// and the working-memory row do not both count it.
    Gathered,
}

/// One allocation or free of the step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Event {
    /// `alloc` or `free`.
    pub kind: EventKind,
    /// The storage: allocations are numbered in order; a free names its allocation.
    pub id: u32,
    pub bytes: Bytes,
    pub dtype: DType,
    pub cat: Cat,
    pub phase: Phase,
    /// Decoder layer (0-based), or `None` outside the layers.
    pub layer: Option<u32>,
    /// Module path (`model.layers.3.mlp.down_proj`).
    pub module: &'static str,
    /// The aten op (forward) or the op inside a node's backward.
    pub op: &'static str,
    /// The autograd node running (backward).
    pub node: &'static str,
    /// Bytes allocated by the step's stream after this event.
    pub live: Bytes,
}

/// Allocation or free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Alloc,
    Free,
}

impl Event {
    /// Where the event happened, as the ledger and `trainmem step` name it ([`write_label`]):
    /// "layer 31 backward, `mlp.down_proj` mm in MmBackward0".
    pub fn label(&self) -> String {
        write_label(self.phase, self.layer, self.module, self.op, self.node)
    }
}

/// The step's stream and what it adds up to.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stream {
    /// Memory alive before the step and through it (weights, optimizer states, buffers, the
    /// batch, resident gradients, other micro-batches' activations), not in the events.
    pub resident: Bytes,
    pub events: Vec<Event>,
    /// Index of the event at the peak.
    pub peak_index: usize,
    /// `resident` + the largest `live`.
    pub peak: Bytes,
}

impl Stream {
    /// The event at the peak.
    pub fn peak_event(&self) -> Option<&Event> {
        self.events.get(self.peak_index)
    }
    /// The allocator events of the stream (for `allocator::replay`).
    pub fn alloc_events(&self) -> Vec<crate::estimator::allocator::AllocEvent> {
        use crate::estimator::allocator::AllocEvent;
        self.events
            .iter()
            .map(|e| match e.kind {
                EventKind::Alloc => AllocEvent::Alloc { id: e.id, bytes: e.bytes.min(u64::MAX as u128) as u64 },
                EventKind::Free => AllocEvent::Free { id: e.id },
            })
            .collect()
    }
    /// Live bytes at the end of each phase (after its last event).
    pub fn live_after(&self, phase: Phase) -> Option<Bytes> {
        self.events.iter().rev().find(|e| e.phase == phase).map(|e| e.live)
    }
}

/// Room a label needs beyond its module, op and node ("layer 125 ", the phase, the separators),
/// so that writing it never regrows the string.
const LABEL_FIXED_ROOM: usize = 64;

/// "layer 31 backward, `mlp.down_proj` mm in MmBackward0": where, the module, the op and its
/// node, written into one string (the estimate labels its peak on every call).
pub fn write_label(phase: Phase, layer: Option<u32>, module: &str, op: &str, node: &str) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(LABEL_FIXED_ROOM + module.len() + op.len() + node.len());
    if let Some(l) = layer {
        // Writing into a `String` cannot fail.
        let _ = write!(s, "layer {l} ");
    }
    s.push_str(phase.name());
    s.push_str(", ");
    if !module.is_empty() {
        s.push('`');
        s.push_str(module);
        s.push_str("` ");
    }
    s.push_str(op);
    if !node.is_empty() {
        s.push_str(" in ");
        s.push_str(node);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(phase: Phase, layer: Option<u32>, module: &'static str, op: &'static str, node: &'static str) -> Event {
        Event { kind: EventKind::Alloc, id: 0, bytes: 0, dtype: DType::Bf16, cat: Cat::Transient, phase, layer, module, op, node, live: 0 }
    }

    #[test]
    fn an_event_label_names_the_layer_the_phase_the_module_the_op_and_the_node() {
        let e = event(Phase::Backward, Some(31), "mlp.down_proj", "mm", "MmBackward0");
        assert_eq!(e.label(), "layer 31 backward, `mlp.down_proj` mm in MmBackward0");
    }

    #[test]
    fn an_event_label_leaves_out_what_the_event_does_not_have() {
        // Outside the layers, no module, no node: the phase and the op alone.
        assert_eq!(event(Phase::Optimizer, None, "", "_foreach_add", "").label(), "optimizer, _foreach_add");
        // Layer 0 is a layer: it is named.
        assert_eq!(event(Phase::Forward, Some(0), "self_attn.q_proj", "mm", "").label(), "layer 0 forward, `self_attn.q_proj` mm");
    }
}
