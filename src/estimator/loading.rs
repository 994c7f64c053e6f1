//! Loading the model before the first step (`load`): the device allocations each loader makes,
//! its peak, and what the caching allocator still holds from it when the step starts
//! (validation/FINDINGS.md §12; `tests/fixtures/pytorch/loading`, checked by
//! `tests/lowbit_fixtures.rs`).
//!
//! - `from-pretrained` (transformers 5.24 `modeling_utils.py`): `caching_allocator_warmup`
//!   allocates one block of the parameter bytes the device will hold (`torch.empty(byte_count //
//!   2, dtype=float16)`; 0.5 B a weight for a 4-bit quantizer; capped at the card's memory less
//!   1.2 GiB) and frees it at once — its segment stays reserved — then each checkpoint tensor is
//!   one allocation of its final size (traced on fake CUDA: 6 of 6). Under DeepSpeed ZeRO-3
//!   transformers loads through `zero.Init` instead, and FSDP loads sharded: with parameter
//!   sharding `from-pretrained` is `zero-init` (zero=3) or `meta-sharded` (FSDP).
//! - `quantize-on-load` (bitsandbytes `Bnb4bitQuantize.convert` → `quantize_4bit`): per weight,
//!   in checkpoint order, its bf16 copy, the packed codes, the fp32 absmax, the quant state's
//!   tables, the centred absmax and the 8-bit absmax; the bf16 copy and both fp32 absmax freed.
//! - `meta-sharded` (FSDP2: `to_empty` of the local shards, then `set_model_state_dict(…,
//!   broadcast_from_rank0=True)`, one tensor at a time): each full tensor and its shard's copy.
//! - `zero-init` (DeepSpeed `zero.Init` + `_load_state_dict_into_zero3_model`): each module's
//!   parameters full-size as it is built and again while `GatheredParameters` loads it.

use super::allocator::AllocEvent;
use super::config::{Config, Load, QloraQuant, Zero};
use super::ledger::Bytes;
use super::model::Part;
use super::params::{LocalGroup, Role};
use super::sharding::Sharding;

/// `caching_allocator_warmup` leaves this much of the card free (`total − 1.2 GiB`).
pub const WARMUP_MARGIN: Bytes = 1_288_490_188;

/// One loading's device allocations.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// What the loader actually does (`from-pretrained` under sharding resolves to a sharded
    /// loader).
    pub kind: Load,
    /// The allocations and frees, ids from 0 up to `next` (the weights the step starts with are
    /// left allocated).
    pub events: Vec<AllocEvent>,
    pub next: u32,
    /// `max_memory_allocated()` over the loading.
    pub peak: Bytes,
    /// Allocated when it ends (the weights).
    pub end: Bytes,
    /// The warmup block (`from-pretrained`, `quantize-on-load`).
    pub warmup: Bytes,
    /// What the peak is, in words.
    pub at: String,
}

/// The loader `cfg` runs.
pub fn effective(cfg: &Config) -> Load {
    let sh = Sharding::of(cfg);
    match cfg.load {
        Load::FromPretrained if sh.splits(crate::estimator::sharding::PARAMETERS_FROM) => {
            if cfg.zero == Zero::Z3 {
                Load::ZeroInit
            } else {
                Load::MetaSharded
            }
        }
        l => l,
    }
}

/// One parameter tensor as a loader sees it.
#[derive(Clone, Copy, Debug)]
struct Tensor {
    /// Its bytes as the step holds it unsharded (a quantized weight: its packed codes).
    bytes: Bytes,
    /// A 4-bit NF4 weight of this many elements.
    nf4: Option<u128>,
    /// Its order in the checkpoint (layer, then position in the layer).
    order: (u64, u8, &'static str),
}

/// The position of a tensor in a decoder layer's checkpoint keys (sorted as transformers'
/// names sort: `input_layernorm`, `mlp.*`, `post_attention_layernorm`, `self_attn.*`).
fn in_layer(part: Part, first_norm: bool) -> u8 {
    match part {
        Part::Norms if first_norm => 0,
        Part::Mlp | Part::Experts | Part::Router | Part::SharedExperts => 1,
        Part::Norms => 2,
        _ => 3,
    }
}

/// The position of a tensor in a GPT-2 block's checkpoint keys (`attn.*` < `ln_1` < `ln_2` <
/// `mlp.*`).
fn in_gpt2_layer(part: Part, first_norm: bool) -> u8 {
    match part {
        Part::Norms if first_norm => 1,
        Part::Norms => 2,
        Part::Mlp => 3,
        _ => 0,
    }
}

/// The model's parameter tensors in checkpoint order: the LM head, the embeddings, each layer's
/// tensors, the final norm (transformers' keys in natural order: `lm_head` < `model.*`). GPT-2's
/// keys put the blocks first (`transformer.h.*` < `transformer.ln_f` < `transformer.wpe` <
/// `transformer.wte`; measured, `tests/fixtures/pytorch/loading`).
fn tensors(cfg: &Config, groups: &[LocalGroup], weight: u64) -> Vec<Tensor> {
    let layers = cfg.arch.layers.max(1);
    let gpt2 = cfg.arch.family == super::family::Family::Gpt2;
    let mut out = Vec::new();
    for g in groups.iter().filter(|g| !g.adapter) {
        let per_tensor = (g.group.numel() / g.group.tensors_per_instance.max(1)) as u128;
        let (bytes, nf4) = match g.role {
            Role::Quantized if cfg.qlora_quant == QloraQuant::Nf4 => (per_tensor.div_ceil(2), Some(per_tensor)),
            Role::Quantized => (per_tensor.div_ceil(2), None),
            _ => (per_tensor * weight as u128, None),
        };
        let n = g.group.tensor_count();
        if g.group.part.per_layer() {
            let per_layer = n.div_ceil(layers).max(1);
            for i in 0..n {
                let layer = i / per_layer;
                let first_norm = i % per_layer == 0;
                let pos = if gpt2 { in_gpt2_layer(g.group.part, first_norm) } else { in_layer(g.group.part, first_norm) };
                out.push(Tensor { bytes, nf4, order: (1 + layer, pos, g.group.name) });
            }
        } else {
            let order = match g.group.part {
                Part::LmHead => (0, 0, g.group.name),
                Part::FinalNorm => (u64::MAX, 0, g.group.name),
                _ if gpt2 => (u64::MAX, 1, g.group.name),
                _ => (0, 1, g.group.name),
            };
            for _ in 0..n {
                out.push(Tensor { bytes, nf4, order });
            }
        }
    }
    out.sort_by_key(|t| t.order);
    out
}

/// Builds the events, tracking the allocated bytes.
struct Events {
    ev: Vec<AllocEvent>,
    next: u32,
    live: Bytes,
    peak: Bytes,
    at: String,
    sizes: Vec<Bytes>,
}

impl Events {
    fn new(next: u32) -> Events {
        Events { ev: Vec::new(), next, live: 0, peak: 0, at: String::new(), sizes: Vec::new() }
    }
    fn alloc_id(&mut self, id: u32, bytes: Bytes, what: &str) {
        self.ev.push(AllocEvent::Alloc { id, bytes: bytes.min(u64::MAX as u128) as u64 });
        if self.sizes.len() <= id as usize {
            self.sizes.resize(id as usize + 1, 0);
        }
        self.sizes[id as usize] = bytes;
        self.live += bytes;
        if self.live > self.peak {
            self.peak = self.live;
            self.at = what.to_string();
        }
    }
    fn alloc(&mut self, bytes: Bytes, what: &str) -> u32 {
        let id = self.next;
        self.next += 1;
        self.alloc_id(id, bytes, what);
        id
    }
    fn free(&mut self, id: u32) {
        self.ev.push(AllocEvent::Free { id });
        self.live -= self.sizes.get(id as usize).copied().unwrap_or(0);
    }
}

/// `cfg`'s loading, ending with `weights` allocated under ids `0..weights.len()` (the resident
/// parameter allocations the step's replay starts from), on a card of `capacity` bytes (0:
/// unknown). `groups`: the stage's parameter tensors.
pub fn plan(cfg: &Config, weights: &[Bytes], groups: &[LocalGroup], capacity: Bytes) -> Plan {
    let kind = effective(cfg);
    let n = weights.len() as u32;
    let total: Bytes = weights.iter().sum();
    let weight = super::precision::recipe(cfg.precision).weight.bytes();
    let mut e = Events::new(n);
    let keep_all = |e: &mut Events| {
        for (i, &w) in weights.iter().enumerate() {
            e.alloc_id(i as u32, w, "the weights");
        }
    };
    let cap = |w: Bytes| if capacity > WARMUP_MARGIN { w.min(capacity - WARMUP_MARGIN) } else { w };
    let mut warmup = 0;
    match kind {
        Load::FromPretrained => {
            warmup = cap(total);
            let id = e.alloc(warmup, "caching_allocator_warmup");
            e.free(id);
            keep_all(&mut e);
        }
        Load::QuantizeOnLoad => {
            let ts = tensors(cfg, groups, weight);
            // The warmup counts 0.5 B a 4-bit weight (`param_element_size`).
            warmup = cap(ts.iter().map(|t| t.bytes).sum());
            let id = e.alloc(warmup, "caching_allocator_warmup");
            e.free(id);
            // bitsandbytes' process-wide tables, made by the first quantization.
            e.alloc(super::statics::BNB_CONSTANTS as u128, "bitsandbytes' constants");
            let mut kept: Bytes = super::statics::BNB_CONSTANTS as u128;
            for t in &ts {
                match t.nf4 {
                    Some(numel) if !cfg.qlora_double_quant => {
                        // `quantize_4bit` without double quantization: the bf16 weight, packed
                        // codes, the fp32 absmax and the NF4 code table; the bf16 weight goes.
                        let nb = numel.div_ceil(super::step::lowbit::NF4_BLOCK);
                        let what = "quantizing a weight: its bf16 copy and fp32 absmax";
                        let w16 = e.alloc(2 * numel, what);
                        e.alloc(t.bytes, what);
                        e.alloc(4 * nb, what);
                        e.alloc(64, what);
                        e.free(w16);
                        kept += t.bytes + 4 * nb + 64;
                    }
                    Some(numel) => {
                        // `Params4bit._quantize` → `quantize_4bit` with double quantization:
                        // the bf16 weight, packed codes, fp32 absmax, the NF4 code table, the
                        // offset (`absmax.mean()`), the centred absmax, its 8-bit codes and fp32
                        // scales, the dynamic map; then the bf16 weight and both fp32 absmax go.
                        let nb = numel.div_ceil(super::step::lowbit::NF4_BLOCK);
                        let what = "quantizing a weight: its bf16 copy and two fp32 absmax";
                        let w16 = e.alloc(2 * numel, what);
                        e.alloc(t.bytes, what);
                        let absmax = e.alloc(4 * nb, what);
                        e.alloc(64, what);
                        e.alloc(4, what);
                        let centred = e.alloc(4 * nb, what);
                        e.alloc(nb, what);
                        e.alloc(4 * nb.div_ceil(256), what);
                        e.alloc(1024, what);
                        e.free(absmax);
                        e.free(centred);
                        e.free(w16);
                        kept += t.bytes + 64 + 4 + nb + 4 * nb.div_ceil(256) + 1024;
                    }
                    None => {
                        e.alloc(t.bytes, "the weights");
                        kept += t.bytes;
                    }
                }
            }
            // The adapters (`get_peft_model`, after loading) and whatever else the weights row
            // holds. These allocations stand for the step replay's resident weights, which it
            // then does not allocate again ([`replaces_weights`]).
            if total > kept {
                e.alloc(total - kept, "the adapters");
            }
        }
        Load::MetaSharded | Load::ZeroInit => {
            let sh = Sharding::of(cfg);
            let world = sh.n.max(1) as u128;
            keep_all(&mut e);
            let ts = tensors(cfg, groups, weight);
            let passes = if kind == Load::ZeroInit { 2 } else { 1 };
            for _ in 0..passes {
                for t in &ts {
                    let what = if kind == Load::ZeroInit {
                        "the largest module gathered full-size (zero.Init, GatheredParameters)"
                    } else {
                        "the largest tensor broadcast full-size with its shard's copy"
                    };
                    let full = e.alloc(t.bytes, what);
                    let shard = (kind == Load::MetaSharded).then(|| e.alloc(t.bytes.div_ceil(world), what));
                    e.free(full);
                    if let Some(s) = shard {
                        e.free(s);
                    }
                }
            }
        }
    }
    let end = e.live;
    Plan { kind, events: e.ev, next: e.next, peak: e.peak, end, warmup, at: e.at }
}

/// The loading's allocated peak on a stage whose parameter rows hold `weights` bytes (what
/// [`plan`] peaks at, without building its events where the peak has a closed form).
pub fn peak(cfg: &Config, weights: Bytes, groups: &[LocalGroup], capacity: Bytes) -> Bytes {
    match effective(cfg) {
        // The warmup block never exceeds the weights.
        Load::FromPretrained => weights,
        Load::QuantizeOnLoad => plan(cfg, &[weights], groups, capacity).peak,
        kind => {
            let weight = super::precision::recipe(cfg.precision).weight.bytes();
            let world = Sharding::of(cfg).n.max(1) as u128;
            let largest = groups
                .iter()
                .filter(|g| !g.adapter)
                .map(|g| match g.role {
                    Role::Quantized => ((g.group.numel() / g.group.tensors_per_instance.max(1)) as u128).div_ceil(2),
                    _ => (g.group.numel() / g.group.tensors_per_instance.max(1)) as u128 * weight as u128,
                })
                .max()
                .unwrap_or(0);
            let extra = if kind == Load::MetaSharded { largest + largest.div_ceil(world) } else { largest };
            weights + extra
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::config::Finetune;
    use crate::estimator::params::{local_groups, Stage};

    #[test]
    fn from_pretrained_reserves_one_block_of_the_weights_first() {
        let cfg = Config::default();
        let p = plan(&cfg, &[100, 200], &[], 0);
        assert_eq!(p.warmup, 300);
        assert_eq!((p.peak, p.end), (300, 300));
        assert_eq!(p.events[1], AllocEvent::Free { id: 2 });
    }

    #[test]
    fn under_sharding_from_pretrained_loads_as_the_sharded_loaders_do() {
        let z3 = Config { gpus: 8, zero: Zero::Z3, ..Config::default() };
        assert_eq!(effective(&z3), Load::ZeroInit);
        let fsdp = Config { gpus: 8, zero: Zero::FullShard, ..Config::default() };
        assert_eq!(effective(&fsdp), Load::MetaSharded);
        assert_eq!(effective(&Config { gpus: 8, zero: Zero::Z2, ..Config::default() }), Load::FromPretrained);
    }

    #[test]
    fn quantize_on_load_peaks_with_a_weights_bf16_copy_and_its_absmax_pair() {
        let cfg = Config { finetune: Finetune::Qlora, load: Load::QuantizeOnLoad, ..Config::default() };
        let groups = local_groups(&cfg, Stage::Whole);
        let p = plan(&cfg, &[0], &groups, 0);
        // Llama-3.1-8B's largest quantized weights: 14,336 × 4,096 (gate, up, down).
        let n = 14_336u128 * 4096;
        assert!(p.peak > p.end && p.peak - p.end <= 2 * n + 8 * n.div_ceil(64), "{} {}", p.peak, p.end);
    }
}
