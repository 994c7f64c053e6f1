//! ZeRO/FSDP sharding: how many GPUs one shard of each kind of tensor spans, and the one place
//! weights, gradients, master weights and optimizer states are divided by it (Rajbhandari et al.
//! 2020, §5: P_os shards optimizer states from stage 1, P_g gradients from stage 2, P_p
//! parameters from stage 3; FSDP's FULL_SHARD/SHARD_GRAD_OP/HYBRID_SHARD map onto them).

use super::config::{Config, Zero};
use super::expr::{Expr, Sym};
use super::ledger::Bytes;
use super::model::Part;
use super::params::{LocalGroup, Role};
use super::precision::Recipe;

pub const PSI_T: Sym = Sym::new("Ψ", "T", "trainable parameters on this GPU");
pub const PSI_E: Sym = Sym::new("Ψ", "E", "routed-expert parameters on this GPU (sharded over N_e)");
pub const N_D: Sym = Sym::new("N", "d", "GPUs a ZeRO/FSDP shard spans");
pub const N_E: Sym = Sym::new("N", "e", "GPUs an expert shard spans (N_d / ep)");

/// ZeRO divisors of one GPU.
#[derive(Clone, Debug)]
pub struct Sharding {
    pub stage: u8,
    /// GPUs one shard spans (the data-parallel degree, or the `shard_group` under HYBRID_SHARD).
    pub n: u64,
    /// Expert shards span n / ep.
    pub n_expert: u64,
}

/// The ZeRO stage from which each role is sharded (Rajbhandari et al. 2020, §5): optimizer
/// states (and master weights) from stage 1, gradients from stage 2, parameters from stage 3.
pub const OPTIMIZER_STATES_FROM: u8 = 1;
pub const GRADIENTS_FROM: u8 = 2;
pub const PARAMETERS_FROM: u8 = 3;

impl Sharding {
    /// The shard group spans the data-parallel and the context-parallel ranks together: a
    /// context-parallel group holds the same parameters (each rank a slice of the sequence), and
    /// the frameworks shard over both — torchtitan's FSDP mesh is `fsdp = dp_shard × cp`
    /// (`distributed/parallel_dims.py`, v0.2.2), Megatron's distributed optimizer uses
    /// `get_data_parallel_group(with_context_parallel=True)`, DeepSpeed-Ulysses shards ZeRO over
    /// the sequence-data-parallel group. Under HYBRID_SHARD the group is `shard_group` as set.
    pub fn of(cfg: &Config) -> Sharding {
        let dp = cfg.dp().max(1) * cfg.cp.max(1);
        let n = if cfg.zero == Zero::HybridShard { cfg.shard_group.clamp(1, dp) } else { dp };
        Sharding { stage: cfg.zero.stage(), n, n_expert: (n / cfg.ep.max(1)).max(1) }
    }
    /// Whether a role sharded from `from_stage` on (see [`GRADIENTS_FROM`] …) is split over more
    /// than one GPU here: the one test every sharded term and the step's program ask.
    pub fn splits(&self, from_stage: u8) -> bool {
        self.stage >= from_stage && self.n > 1
    }
    /// How many GPUs share a role sharded from `from_stage` on: (dense tensors, routed experts);
    /// (1, 1) where it is not split ([`Sharding::splits`]).
    pub fn ways(&self, from_stage: u8) -> (u64, u64) {
        if self.splits(from_stage) {
            (self.n, self.n_expert)
        } else {
            (1, 1)
        }
    }
    /// The divisors for a role sharded from `from_stage` on.
    pub fn shards(&self, from_stage: u8) -> Shards {
        if self.splits(from_stage) {
            Shards { dense: Expr::var(N_D, self.n), expert: Expr::var(N_E, self.n_expert) }
        } else {
            Shards::none()
        }
    }
}

/// The divisors of ZeRO sharding for one role: dense tensors shard over `dense`, routed
/// experts over `expert` (the expert-data-parallel group).
#[derive(Clone, Debug)]
pub struct Shards {
    pub dense: Expr,
    pub expert: Expr,
}

impl Shards {
    pub fn none() -> Shards {
        Shards { dense: Expr::num(1u8), expert: Expr::num(1u8) }
    }
    fn same(&self) -> bool {
        self.dense.eval() == self.expert.eval()
    }
}

/// `⌈Ψ / N⌉` over the groups matching `pred`, split into a dense and an expert pool when they
/// shard differently. The one place weights, gradients, master weights and states are sharded.
pub fn sharded_elements(groups: &[LocalGroup], pred: impl Fn(&LocalGroup) -> bool, sym: Sym, shards: &Shards) -> Expr {
    let t = |g: &&LocalGroup| pred(g);
    let dense: u64 = groups.iter().filter(t).filter(|g| !g.expert || shards.same()).map(|g| g.group.total()).sum();
    let expert: u64 = groups.iter().filter(t).filter(|g| g.expert && !shards.same()).map(|g| g.group.total()).sum();
    let mut terms = vec![Expr::var(sym, dense).shard(shards.dense.clone())];
    if expert > 0 {
        terms.push(Expr::var(PSI_E, expert).shard(shards.expert.clone()));
    }
    Expr::sum(terms)
}

/// The reduce dtype of torchtitan's FSDP2 `MixedPrecisionPolicy`: fp32, 4 B an element
/// (torchtitan 0.2.2 `config/job_config.py`: `mixed_precision_reduce: Literal["float32"]`).
pub const TORCHTITAN_REDUCE_BYTES: u64 = 4;

/// FSDP2's `[norm, output]` unit as torchtitan 0.2.2 wraps it, on a stage with the head: what
/// it holds beyond the sharded parameters and gradients (validation/FINDINGS.md §13.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadUnit {
    /// U: the unsharded final norm and output weight in the parameter dtype — all-gathered
    /// before the final norm's forward, kept through the loss (`reshard_after_forward=False`)
    /// to the unit's `post_backward_reshard`, after the final norm's backward.
    pub params: Bytes,
    /// G: the output weight's unsharded gradient in the parameter dtype — made by the head's
    /// backward `mm`, freed by the unit's `post_backward_reduce` once copied into its input.
    pub grad: Bytes,
    /// R: that reduce's fp32 reduce-scatter input, every trainable tensor of the unit padded
    /// on dim 0 to a multiple of the shard group.
    pub reduce_input: Bytes,
}

/// Whether FSDP2 wraps `[model.norm, model.output]` as one unit kept gathered after forward:
/// `framework = torchtitan` (0.2.2 `models/llama3/infra/parallelize.py apply_fsdp`:
/// `fully_shard([model.norm, model.output], reshard_after_forward=reshard_after_forward_policy
/// == "always")`, the policy `default`) under FSDP's full or hybrid sharding (torchtitan's
/// HSDP runs the same `apply_fsdp` on a 2-D mesh) with the parameters split.
///
/// Under pipeline parallelism the unit is kept gathered with the rest of the stage
/// ([`keeps_stage_gathered`]): no unit of its own then.
pub fn has_head_unit(cfg: &Config) -> bool {
    titan_fsdp2(cfg) && cfg.pp <= 1
}

/// torchtitan's FSDP2 (`apply_fsdp`) with the parameters split: `framework = torchtitan` under
/// FSDP's full or hybrid sharding.
fn titan_fsdp2(cfg: &Config) -> bool {
    use super::config::{Framework, Zero};
    cfg.framework == Framework::Torchtitan
        && matches!(cfg.zero, Zero::FullShard | Zero::HybridShard)
        && Sharding::of(cfg).splits(PARAMETERS_FROM)
}

/// Whether each pipeline stage keeps all its parameters gathered through the step and its
/// gradients unsharded until the last micro-batch: torchtitan's FSDP2 under pipeline
/// parallelism ([`titan_fsdp2`] with `pp > 1`).
///
/// - torchtitan 0.2.2 `models/llama3/infra/parallelize.py apply_fsdp`: the policy `default`
///   means `reshard_after_forward = not pp_enabled` for the embedding and every block, the
///   `[norm, output]` unit is never resharded after forward, then the root.
/// - torch 2.15 `distributed/pipelining/stage.py backward_maybe_with_nosync`: every
///   micro-batch's backward runs with `set_reshard_after_backward(False)` and
///   `set_requires_gradient_sync(False)`; `perform_reduce_grad` reduce-scatters and reshards
///   once, after the last.
/// - torch 2.15 `distributed/fsdp/_fully_shard/_fsdp_param.py`: an unreduced gradient becomes
///   an fp32 `unsharded_accumulated_grad` (`reduce_dtype`), later ones added into it.
///
/// So a stage holds, from its first micro-batch's forward to its last one's backward, every
/// parameter unsharded in the parameter dtype ([`super::statics::kept_stage_parameter_bytes`])
/// and, from its first backward on, an fp32 gradient per trainable element
/// ([`super::statics::unsharded_accumulator_bytes`]). Measured on four CPU ranks
/// (`tests/fixtures/pytorch/fsdp/pp.json`, validation/measure_fsdp_pp.py).
pub fn keeps_stage_gathered(cfg: &Config) -> bool {
    titan_fsdp2(cfg) && cfg.pp > 1
}

/// Whether the simulated backward finds the stage's fp32 gradient accumulators resident
/// ([`keeps_stage_gathered`]): a later backward of several micro-batches, not the step's first
/// (`first_backward`) nor its only one, which make them as they go. The one rule the ledger's
/// accumulator row, the stream's gradient mode and the micro-batches in flight follow.
pub fn accumulators_resident(cfg: &Config, first_backward: bool) -> bool {
    keeps_stage_gathered(cfg) && cfg.accum > 1 && !first_backward
}

/// Whether FSDP2's root unit holds the embedding, the final norm and the output projection
/// and is gathered again in backward: torchtune's distributed LoRA recipe as its configs ship
/// it (`framework = torchtune`, a LoRA or QLoRA fine-tune, the parameters split).
///
/// - torchtune 0.6.1 `training/_distributed.py shard_model`: each `layers.i` a unit, the
///   `custom_sharded_layers` each a unit, then `fully_shard(model, reshard_after_forward=True)`,
///   the root holding what is left; `recipes/configs/*/..._lora.yaml` leave
///   `custom_sharded_layers` commented out (the `*_full.yaml` distributed configs set
///   `['tok_embeddings', 'output']`, units of their own: [`own_end_units`]).
/// - torch 2.15 `distributed/fsdp/_fully_shard/_fsdp_state.py`: the root keeps an explicit
///   `reshard_after_forward=True`, so it is resharded when the model's forward returns, gathered
///   again by its pre-backward (a hook on the model's outputs, the logits) right after the loss
///   backward, and resharded by `post_backward` at the very end of backward.
///
/// Measured on two CPU ranks (`tests/fixtures/pytorch/fsdp/tune.json`, the `lora` records):
/// the root's 1,048,704 B gathered from the logits' gradient to the end of backward.
pub fn keeps_ends_in_root(cfg: &Config) -> bool {
    use super::config::{Finetune, Framework};
    cfg.framework == Framework::Torchtune && cfg.finetune != Finetune::Full && Sharding::of(cfg).splits(PARAMETERS_FROM)
}

/// torchtune's distributed recipes' FSDP2 (`training.shard_model`): `framework = torchtune` with
/// the parameters split. Its units beyond the decoder layers are in the step's stream: the root
/// ([`keeps_ends_in_root`], or the final norm alone) and, for the full fine-tune,
/// [`own_end_units`]; the stage runs as one program (they span the pieces).
pub fn tune_fsdp2(cfg: &Config) -> bool {
    cfg.framework == super::config::Framework::Torchtune && Sharding::of(cfg).splits(PARAMETERS_FROM)
}

/// Whether the embedding and the output projection are FSDP2 units of their own: torchtune's
/// distributed full fine-tune as its configs ship it (`custom_sharded_layers: ['tok_embeddings',
/// 'output']` in every distributed `*_full.yaml` of torchtune 0.6.1), each gathered around each of
/// its calls in forward (`output` once per output chunk) and again for each call's backward, the
/// output weight's gradient accumulated unsharded over the chunks and reduce-scattered after the
/// last (measured: tests/fixtures/pytorch/fsdp/tune.json, the `full` records).
pub fn own_end_units(cfg: &Config) -> bool {
    tune_fsdp2(cfg) && cfg.finetune == super::config::Finetune::Full
}

/// One end unit of [`own_end_units`]: the weight of `part` (embedding or output) unsharded, U
/// = n · b_w; its unsharded gradient G = n · b_w (pure bf16: the parameter dtype); the
/// reduce-scatter input R = ⌈d0 / N⌉ · N · (n / d0) · b_w (no `MixedPrecisionPolicy`: reduced in
/// the parameter dtype, dim 0 padded to the shard group). Toy (vocabulary 4096, h 64, bf16, 2
/// ranks): U = G = R = 524,288 B, as measured.
pub fn end_unit(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup], part: Part) -> Option<(Bytes, Bytes, Bytes)> {
    if !own_end_units(cfg) {
        return None;
    }
    let n = Sharding::of(cfg).n.max(1) as u128;
    let w = recipe.weight.bytes() as u128;
    let g = groups.iter().find(|g| g.group.part == part && !g.adapter)?;
    let numel = g.group.numel() as u128 * g.group.count.max(1) as u128;
    let d0 = g.group.shape.first().copied().unwrap_or(1).max(1) as u128;
    let trains = g.role == Role::Trainable;
    let grad = if trains { numel * w } else { 0 };
    let reduce = if trains { d0.div_ceil(n) * n * (numel / d0) * w } else { 0 };
    Some((numel * w, grad, reduce))
}

/// Whether the sharded gradients come into being in the step (each unit's reduce-scatter
/// output, after its backward) rather than being resident from its start: torchtune's
/// distributed recipes ([`tune_fsdp2`]), which free them at `zero_grad(set_to_none=True)` after
/// each optimizer step — without gradient accumulation (where they carry the micro-batches'
/// sum) and without parameter offload (where they are copied to the host).
pub fn grads_made_in_step(cfg: &Config) -> bool {
    tune_fsdp2(cfg) && cfg.accum <= 1 && cfg.offload == super::config::Offload::None
}

/// The sharded gradient of a parameter whose unsharded gradient is `unsharded` bytes, on one
/// GPU of [`grads_made_in_step`]: ⌈unsharded / N⌉ (FSDP2's dim-0 shard; toy: a layer's
/// 123,136 B over 2 ranks → 61,568 B, as measured); 0 elsewhere (resident, [`Sharding`]).
pub fn grad_shard(cfg: &Config, unsharded: Bytes) -> Bytes {
    if !grads_made_in_step(cfg) {
        return 0;
    }
    unsharded.div_ceil(Sharding::of(cfg).n.max(1) as u128)
}

/// One decoder layer's sharded gradient under [`grads_made_in_step`]: Σ over its trainable
/// tensors (the adapters under LoRA) of ⌈n / N⌉ · b_g — FSDP2 shards each tensor on its own.
/// Toy (tune.json, full, 2 ranks): 61,568 B, as measured.
pub fn layer_grad_shard(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup]) -> Bytes {
    if !grads_made_in_step(cfg) {
        return 0;
    }
    let n = Sharding::of(cfg).n.max(1) as u128;
    groups
        .iter()
        .filter(|g| g.group.part.per_layer() && g.role == Role::Trainable)
        .map(|g| g.group.per_layer as u128 * (g.group.numel() as u128).div_ceil(n) * recipe.grad.bytes() as u128)
        .sum()
}

/// The root's sharded gradient under [`grads_made_in_step`]: the trainable final norm's (the
/// full fine-tune's root holds it alone; the LoRA root is frozen), ⌈n_norm · b_g / N⌉.
pub fn root_grad_shard(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup]) -> Bytes {
    groups
        .iter()
        .filter(|g| !g.adapter && g.role == Role::Trainable && g.group.part == Part::FinalNorm)
        .map(|g| grad_shard(cfg, g.group.numel() as u128 * g.group.count.max(1) as u128 * recipe.grad.bytes() as u128))
        .sum()
}

/// U_root of [`keeps_ends_in_root`]: the embedding, final norm and output projection of
/// `groups` unsharded in the parameter dtype, U = (n_emb + n_norm + n_out) · b_w (a tied output
/// counted once, as it is one parameter). Llama 3.1 70B in bf16: (2 · 128,256 · 8,192 + 8,192)
/// · 2 = 4,202,709,376 B. `None` where the root holds nothing of it.
///
/// Under [`own_end_units`] the root holds the final norm alone: U = n_norm · b_w.
pub fn root_unit_bytes(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup]) -> Option<Bytes> {
    if !tune_fsdp2(cfg) {
        return None;
    }
    let ends = keeps_ends_in_root(cfg);
    let w = recipe.weight.bytes() as u128;
    let bytes: u128 = groups
        .iter()
        .filter(|g| !g.adapter && (g.group.part == Part::FinalNorm || (ends && matches!(g.group.part, Part::Embedding | Part::LmHead))))
        .map(|g| g.group.numel() as u128 * g.group.count.max(1) as u128 * w)
        .sum();
    (bytes > 0).then_some(bytes)
}

/// [`HeadUnit`] of a stage whose tensors are `groups` (`None` without the unit or the head):
///
/// - U = (n_out + n_norm) · b_w,
/// - G = n_out · b_w (a trainable output weight; 0 when frozen or tied to the embedding, whose
///   own unit holds it),
/// - R = Σ_trainable ⌈d0 / n⌉ · n · (numel / d0) · 4,
///
/// with n_out, n_norm the output weight's and the final norm's elements on this GPU (the
/// output split over tensor parallelism by vocabulary, the norm replicated), b_w the parameter
/// dtype's bytes (`MixedPrecisionPolicy.param_dtype`: bf16 under mixed precision), n the shard
/// group, d0 a tensor's first dim. Sources: torch 2.15 `distributed/fsdp/_fully_shard/
/// _fsdp_param_group.py` (`post_backward`: reshard, then `foreach_reduce`), `_fsdp_collectives.py
/// foreach_reduce` (the reduce-scatter input in `reduce_dtype`, the unsharded gradients cleared
/// after the copy-in), `_fsdp_param.py` (dim-0 padding). Measured on 2 CPU ranks
/// (`tests/fixtures/pytorch/fsdp/units.json`): U = 524,416 B, G = 524,288 B, R = 1,048,832 B.
pub fn head_unit(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup]) -> Option<HeadUnit> {
    if !has_head_unit(cfg) {
        return None;
    }
    let n = Sharding::of(cfg).n.max(1) as u128;
    let w = recipe.weight.bytes() as u128;
    let ends = || groups.iter().filter(|g| matches!(g.group.part, Part::FinalNorm | Part::LmHead) && !g.adapter);
    ends().next()?;
    let numel = |g: &LocalGroup| g.group.numel() as u128 * g.group.count.max(1) as u128;
    let params = ends().map(|g| numel(g) * w).sum();
    let grad = ends().filter(|g| g.group.part == Part::LmHead && g.role == Role::Trainable).map(|g| numel(g) * w).sum();
    let padded = |g: &LocalGroup| {
        let d0 = g.group.shape.first().copied().unwrap_or(1).max(1) as u128;
        d0.div_ceil(n) * n * (numel(g) / d0)
    };
    let reduce_input = ends().filter(|g| g.role == Role::Trainable).map(|g| padded(g) * TORCHTITAN_REDUCE_BYTES as u128).sum();
    Some(HeadUnit { params, grad, reduce_input })
}
