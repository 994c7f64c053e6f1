//! Transformer Engine's per-layer activation offloading (`act_offload_layers = n`): which saved
//! tensors of a decoder layer go to pinned host memory, and when they leave and come back.
//!
//! Megatron-Core's `TransformerBlock` (`megatron/core/transformer/transformer_block.py`, main
//! at d98e8a6) runs each layer as `with self.offload_context: hidden_states = layer(...)` and
//! then `hidden_states = self.group_prefetch_offload_commit_async(hidden_states)`, the pair
//! `get_cpu_offload_context(enabled, num_layers=n, model_layers=L, ...)` returns
//! (`--cpu-offloading --cpu-offloading-num-layers n`). The context is Transformer Engine
//! 2.20.2's (`transformer_engine/pytorch/cpu_offload.py`, `DefaultOffloadSynchronizer`):
//!
//! - **What is pushed** (`OffloadableLayerState._check_if_offload`): in layers `0..n` only, a
//!   saved tensor of at least 256 K elements (`numel() >= 256 * 1024`) that is not an
//!   `nn.Parameter`, and contiguous — a non-contiguous one is skipped with a warning unless its
//!   module marked it `offload_base_tensor` (Transformer Engine's own attention marks q, k, v;
//!   its linears mark their weights `_TE_do_not_offload`). Everything else stays a saved
//!   reference on the device.
//! - **What is copied** (`TensorGroupProcessor.tensor_group_process_before_offload`): a pushed
//!   view with as many elements as its base is replaced by the base, then the group is
//!   deduplicated by tensor identity — so the three projections' views of one normed input are
//!   one host copy. Each copy is `torch.empty_like(t, device="cpu", pin_memory=True)`.
//! - **When** (`_init_offload_synchronization_dicts`, `fwd_step`, `bwd_step`): layer `i < n`'s
//!   copies start when layer `i + 1` enters; the group lets go of its device tensors when layer
//!   `L − n + i` enters (`release_activation_forward_gpu_memory`), so at most `L − n` layers'
//!   pushed tensors are on the device in forward. In backward, before the node of layer `k`'s
//!   output runs (a pre-hook on its `grad_fn`), the previous layer's state is released
//!   (`release_all_memory`: its reloaded copies and host buffers) and the layer `i` with
//!   `k = L − 1 − n + i` is reloaded: one device buffer per host copy (`torch.empty_like(t,
//!   device="cuda")`), alive until the backward of layer `i − 1` starts (layer 0's: until
//!   backward ends, `finish_part_of_bwd`).
//!
//! Measured on the CPU through a line-for-line port (`validation/measure_recipes.py`
//! `CpuTeLayerOffload`, around transformers' decoder layers: `recipes/*-L4.json`,
//! eager attention): the pushed tensors, the host bytes and the step's peak.

use super::ir::{Op, Origin, Program, Tid, MODEL};

/// `OffloadableLayerState._check_if_offload`: "Only offload tensors with at least 256k
/// elements (~1MB for float32)".
pub const MIN_NUMEL: u128 = 256 * 1024;

/// The offloading of the first `n` of `layers` decoder layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerOffload {
    pub n: u16,
    pub layers: u16,
    /// A non-contiguous saved tensor stays on the device (transformers' modules, which mark
    /// nothing); `false`: every large activation goes, as Transformer Engine's own modules mark
    /// the views they save (`start_offload(q, k, v, offload_base_tensor=True)`) — Megatron.
    pub contiguous_only: bool,
}

impl LayerOffload {
    /// Whether layer `l` is offloaded.
    pub fn offloads(&self, l: u16) -> bool {
        l != MODEL && l < self.n
    }

    /// The layer whose group is released when layer `l` enters (`finish_offload_map`).
    pub fn released_at(&self, l: u16) -> Option<u16> {
        let i = l.checked_sub(self.layers - self.n)?;
        (i < self.n).then_some(i)
    }

    /// The layer reloaded when the backward of layer `l` starts (`start_reload_map`).
    pub fn reloaded_at(&self, l: u16) -> Option<u16> {
        let i = (l + 1).checked_sub(self.layers - self.n)?;
        (i < self.n).then_some(i)
    }

    /// Whether saved tensor `t` of op `op` is pushed by the layer's hooks (see the module doc),
    /// given `producer`: the op that made each tensor ([`producers`]).
    pub fn pushes(&self, p: &Program, producer: &[u32], op: &Op, t: Tid) -> bool {
        let x = &p.tensors[t as usize];
        let numel = x.bytes / u128::from(x.dtype.bytes().max(1));
        // A Parameter, and a Linear's `weight.t()` (a view of one: not contiguous), stay.
        if numel < MIN_NUMEL || !matches!(x.origin, Origin::Op | Origin::Input { .. }) {
            return false;
        }
        !self.contiguous_only || (contiguous(p, producer, t) && !transposed_operand(p, op, t))
    }

    /// The tensor whose host copy saved tensor `t` becomes (its bytes, its dtype): its base when
    /// it has as many elements (`_switch_to_base_tensors`), else itself.
    pub fn unit(p: &Program, t: Tid) -> Tid {
        let x = &p.tensors[t as usize];
        if p.tensors[x.base as usize].bytes == x.bytes {
            x.base
        } else {
            t
        }
    }
}

/// The op that made each tensor (`u32::MAX`: made before the program).
pub fn producers(p: &Program) -> Vec<u32> {
    let mut v = vec![u32::MAX; p.tensors.len()];
    for (i, op) in p.ops.iter().enumerate() {
        for &t in p.outs(op) {
            v[t as usize] = i as u32;
        }
    }
    v
}

/// Elementwise ops whose output takes the layout of their first full-shape operand
/// (TensorIterator's `reorder_dimensions`: the first operand whose strides differ decides; a
/// broadcast one has none to compare). `.to(dtype)` keeps the layout too (`preserve_format`).
const ELEMENTWISE: &[&str] =
    &["mul", "add", "sub", "div", "neg", "silu", "gelu", "tanh", "exp", "pow", "rsqrt", "sigmoid", "relu", "_to_copy"];

/// Whether tensor `t` is contiguous, following its views back to the tensor they view: a
/// transpose flips it (`[b, s, h, d] → [b, h, s, d]`: not contiguous; back: contiguous again),
/// a view, reshape or unsqueeze keeps it, a slice, split or expand is not; an elementwise op is laid
/// out like its first full-shape operand (RoPE's `q * cos + rotate_half(q) * sin` like the
/// transposed q: measured, `[b, h, s, d]` with `[b, s, h, d]` strides); SDPA's flash kernels
/// return their output in `[b, s, h, d]` layout (not contiguous as `[b, h, s, d]`); anything
/// else makes a new contiguous tensor.
pub fn contiguous(p: &Program, producer: &[u32], t: Tid) -> bool {
    // `through`: an elementwise op lies between `t` and the tensor reached — its output keeps a
    // permuted layout, but not gaps (TensorIterator lays out a non-dense input's result
    // contiguously: SiLU of Phi-3's gate chunk, measured).
    let (mut t, mut flipped, mut through) = (t, false, false);
    loop {
        let Some(op) = producer.get(t as usize).and_then(|&i| p.ops.get(i as usize)) else { return !flipped };
        let next = match (op.name, op.node) {
            ("view", "TransposeBackward0") => {
                flipped = !flipped;
                p.ins(op).first().copied()
            }
            ("view", _) => p.ins(op).first().copied(),
            // The programs' slices and splits cut the last dim (Phi-3's `chunk(2, dim=-1)` of its
            // fused gate/up output, its q/k/v slices): a view with gaps.
            ("slice" | "expand" | "split", _) => return through,
            (name, _)
                if name.starts_with("_scaled_dot_product_flash_attention")
                    || name.starts_with("_scaled_dot_product_efficient_attention") =>
            {
                return flipped
            }
            (name, _) if ELEMENTWISE.contains(&name) => {
                through = true;
                let shape = &p.tensors[t as usize].shape;
                p.ins(op).iter().copied().find(|&x| p.tensors[x as usize].shape == *shape)
            }
            _ => None,
        };
        match next {
            Some(x) => t = x,
            None => return !flipped,
        }
    }
}

/// Whether `t` is the second operand of a `bmm` that saves it transposed: eager attention's
/// `torch.matmul(query, key_states.transpose(2, 3))` saves the `[b·a, d, s]` view of the keys
/// (not contiguous), which the program writes as `bmm(q, k)` — its operands' last dims agree
/// (`d`), where `bmm(p, v)`'s do not.
fn transposed_operand(p: &Program, op: &Op, t: Tid) -> bool {
    let ins = p.ins(op);
    if op.name != "bmm" || ins.len() < 2 || ins[1] != t {
        return false;
    }
    let last = |x: Tid| {
        let s = &p.tensors[x as usize].shape;
        s.dims[(s.n as usize).saturating_sub(1)]
    };
    last(ins[0]) == last(ins[1])
}

/// The host bytes one decoder layer's program copies: its pushed saves (those of its live and
/// its dead nodes), each base once (`_deduplicate_tensors`). `in_layer`: which ops run inside
/// the layer's context.
pub fn layer_host_bytes(p: &Program, lo: &LayerOffload, in_layer: impl Fn(&Op) -> bool) -> u128 {
    let producer = producers(p);
    let mut seen: Vec<Tid> = Vec::new();
    let mut total = 0;
    for op in p.ops.iter().filter(|op| in_layer(op)) {
        for s in p.saved(op).iter().chain(p.dead(op)) {
            if lo.pushes(p, &producer, op, s.t) {
                let u = LayerOffload::unit(p, s.t);
                if !seen.contains(&u) {
                    seen.push(u);
                    total += p.tensors[u as usize].bytes;
                }
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lo(n: u16, layers: u16) -> LayerOffload {
        LayerOffload { n, layers, contiguous_only: true }
    }

    #[test]
    fn a_layer_is_released_when_the_layer_l_minus_n_after_it_enters() {
        // L = 4, n = 2: layer 0 goes when layer 2 enters, layer 1 when layer 3 does.
        let o = lo(2, 4);
        assert_eq!((0..4).map(|l| o.released_at(l)).collect::<Vec<_>>(), [None, None, Some(0), Some(1)]);
        // n = L − 1: each layer goes as the next one enters.
        let o = lo(3, 4);
        assert_eq!((0..4).map(|l| o.released_at(l)).collect::<Vec<_>>(), [None, Some(0), Some(1), Some(2)]);
    }

    #[test]
    fn a_layer_is_reloaded_when_the_backward_of_layer_l_minus_1_minus_n_after_it_starts() {
        // L = 4, n = 2: layer 1 comes back at layer 2's backward, layer 0 at layer 1's.
        let o = lo(2, 4);
        assert_eq!((0..4).map(|l| o.reloaded_at(l)).collect::<Vec<_>>(), [None, Some(0), Some(1), None]);
        // n = 1 of 4: layer 0 comes back at layer 2's backward.
        let o = lo(1, 4);
        assert_eq!((0..4).map(|l| o.reloaded_at(l)).collect::<Vec<_>>(), [None, None, Some(0), None]);
    }

    #[test]
    fn only_the_first_n_layers_offload_and_model_level_ops_never_do() {
        let o = lo(2, 4);
        assert!(o.offloads(0) && o.offloads(1) && !o.offloads(2) && !o.offloads(MODEL));
    }
}
