//! The activation ledger of one GPU: what autograd saves for backward, from the op-level
//! program of the step (transformers' code) or Megatron's profile (see the module doc of
//! `activations`).

use super::megatron;
use super::terms::Terms;
use crate::estimator::config::{Config, Kernels};
use crate::estimator::ctx::{Ctx, Values, L, L_DENSE, L_MOE, L_NOPE, L_ROPE, M};
use crate::estimator::expr::{Expr, Sym};
use crate::estimator::ledger::{Bytes, Category, Row, RowId};
use crate::estimator::params::Stage;
use crate::estimator::precision::Recipe;

use crate::estimator::part::Part;

/// What one GPU keeps for backward, and the numbers the step simulation needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Activations {
    /// The ledger row (children by part); bytes = saved at the end of the forward pass.
    pub row: Row,
    /// Saved bytes of one decoder layer of one micro-batch.
    pub per_layer: Bytes,
    /// Saved bytes outside the layers before the head (embedding, positions) for one micro-batch.
    pub embedding: Bytes,
    /// Saved bytes of the final norm, head input and loss for one micro-batch (last stage).
    pub head_and_loss: Bytes,
    /// Micro-batches whose activations are alive at once on this stage (pipeline schedule).
    pub in_flight_num: u64,
    pub in_flight_den: u64,
}

/// Sliding-window layers on this GPU.
pub const L_SLIDING: Sym = Sym::new("L", "sw", "sliding-window layers on this GPU");
/// Full-attention layers on this GPU (in a model that also has sliding-window layers).
pub const L_FULL: Sym = Sym::new("L", "full", "full-attention layers on this GPU");
/// Gated DeltaNet (linear-attention) layers on this GPU (Qwen3-Next, Qwen3.5).
pub const L_LINEAR: Sym = Sym::new("L", "lin", "gated DeltaNet (linear-attention) layers on this GPU");
/// Layers whose input needs a gradient: all but a first layer on a frozen embedding.
pub const L_GRAD: Sym = Sym::new("L", "grad", "layers whose input needs a gradient (all but the first on a frozen embedding)");

/// The activation ledger of one GPU of `stage` from the op-level program (`step`): every storage
/// the forward pass keeps for backward, once, by part; decoder layers counted per kind.
pub fn activations(cfg: &Config, recipe: &Recipe, stage: Stage, stage_layers: u64) -> Activations {
    let setup = crate::estimator::step::model::Setup::new(cfg, recipe, stage);
    let pieces = crate::estimator::step::fast::pieces(&setup);
    activations_of(&setup, &pieces, stage_layers)
}

/// [`activations`] from the stage's programs already built (the estimate builds them once for
/// the ledger and the peak).
pub fn activations_of(
    setup: &crate::estimator::step::model::Setup,
    pieces: &crate::estimator::step::fast::Pieces,
    stage_layers: u64,
) -> Activations {
    use crate::estimator::step::families::Kind;
    use crate::estimator::step::ir::Group;
    use crate::estimator::step::ledger::kept;
    let (cfg, recipe, stage) = (setup.cfg, &setup.recipe, setup.stage);
    let spec = &cfg.arch;
    let b = setup.sizer();
    let has_moe = spec.moe_layers() > 0;
    // Terms by part: per layer group, the model's first end, and its last end.
    let mut t = Terms::default();
    let group_of = |g: Group, kind: Kind| -> Group {
        match (g, has_moe, kind) {
            (Group::All, _, _) => Group::All,
            (Group::Rope, _, _) => Group::Rope,
            (Group::Nope, _, _) => Group::Nope,
            (_, false, _) => Group::All,
            (_, true, Kind::Moe) => Group::Moe,
            (_, true, Kind::Dense) => Group::Dense,
        }
    };
    // One program per distinct (kind, attention type) of the stage's layers.
    let mut variants: Vec<(Kind, crate::estimator::step::families::Var)> = Vec::new();
    for (i, &k) in setup.kinds.iter().enumerate() {
        let v = (k, setup.var(i));
        if !variants.contains(&v) {
            variants.push(v);
        }
    }
    let mut kinds_done: Vec<Kind> = Vec::new();
    // Terms of RoPE-only and NoPE-only groups: taken from the first layer of each.
    let (mut rope_done, mut nope_done) = (false, false);
    for i in 0..setup.kinds.len() {
        if setup.var(i).nope {
            t.n_nope += 1;
        } else {
            t.n_rope += 1;
        }
    }
    let shared_saved = pieces.kept_slots();
    for (vi, &(kind, var)) in variants.iter().enumerate() {
        let layer = pieces.variant(kind, var).expect("every variant of the stage has its program");
        let prog = &layer.prog;
        let (take_rope, take_nope) = (!var.nope && !rope_done, var.nope && !nope_done);
        // A gated DeltaNet layer reads no rotary tables: the first attention layer's count.
        rope_done |= !var.nope && (!var.linear || layer.saved.iter().any(|k| k.group == Group::Rope));
        nope_done |= var.nope;
        // Sizes are the same across attention types (a mask differs, not what is saved), except
        // the RoPE-only and NoPE-only groups.
        let kind_done = kinds_done.contains(&kind);
        if kind_done && !take_rope && !take_nope {
            continue;
        }
        kinds_done.push(kind);
        for &k in &layer.saved {
            if k.elsewhere {
                continue;
            }
            let x = &prog.tensors[k.t as usize];
            let e = b.expr_of(&x.shape, x.dt);
            match group_of(k.group, kind) {
                // Terms common to every layer: counted once, from the first kind.
                Group::All if vi == 0 => t.layer.push((k.part, e)),
                Group::All => {}
                Group::Moe if !kind_done => t.moe_layer.push((k.part, e)),
                Group::Dense if !kind_done => t.dense_layer.push((k.part, e)),
                Group::Moe | Group::Dense => {}
                Group::Rope if take_rope => t.rope_layer.push((k.part, e)),
                Group::Nope if take_nope => t.nope_layer.push((k.part, e)),
                Group::Rope | Group::Nope => {}
            }
        }
    }
    // Where a kind's attention types keep different tensors, what only one keeps counts for its
    // layers only.
    split_by_attention(setup, pieces, &b, &variants, has_moe, &mut t);
    first_without_grad(setup, pieces, &b, has_moe, &mut t);
    if cfg.recompute_every > 0 {
        by_variant(setup, pieces, &b, &variants, &mut t);
    }
    let (pro, psh) = (&pieces.pro, &pieces.psh);
    if stage.has_embedding() {
        for k in kept(pro) {
            let x = &pro.tensors[k.t as usize];
            t.first.push((k.part, b.expr_of(&x.shape, x.dt)));
        }
    }
    for (slot, tid) in psh.slots().into_iter().enumerate() {
        if let Some(tid) = tid.filter(|_| shared_saved & (1 << slot) != 0) {
            let x = &pro.tensors[tid as usize];
            // A model buffer the layers read (torchtitan's `freqs_cis`) is model state.
            if x.origin == crate::estimator::step::ir::Origin::Buffer {
                continue;
            }
            let part = x.part.unwrap_or(Part::Embedding);
            t.first.push((part, b.expr_of(&x.shape, x.dt)));
        }
    }
    if let Some((epi, _)) = &pieces.epi {
        for k in kept(epi) {
            let x = &epi.tensors[k.t as usize];
            t.last.push((k.part, b.expr_of(&x.shape, x.dt)));
        }
    }
    assemble(cfg, recipe, stage, stage_layers, t, setup.ctx.cuda, setup.first_backward)
}

/// Layers fully checkpointed as one of every `recompute_every` on this GPU.
pub const L_EVERY: Sym = Sym::new("L", "ckpt", "layers fully checkpointed (one of every recompute_every) on this GPU");
/// The other layers on this GPU when one of every `recompute_every` is checkpointed.
pub const L_KEPT: Sym = Sym::new("L", "kept", "layers not fully checkpointed (recompute_every) on this GPU");

/// With `recompute_every = N` one layer in N keeps only its input (torchtitan's
/// `selective_ac_option = "N"`): the layers no longer share their terms, so each variant's
/// terms count for its own layers (`L_ckpt`, `L_kept`), whatever their group, in place of the
/// per-group terms [`activations_of`] collected.
fn by_variant(
    setup: &crate::estimator::step::model::Setup,
    pieces: &crate::estimator::step::fast::Pieces,
    b: &crate::estimator::step::ir::Builder,
    variants: &[(crate::estimator::step::families::Kind, crate::estimator::step::families::Var)],
    t: &mut Terms,
) {
    t.layer.clear();
    t.moe_layer.clear();
    t.dense_layer.clear();
    t.rope_layer.clear();
    t.nope_layer.clear();
    t.by_attention.clear();
    for &(kind, var) in variants {
        let Some(l) = pieces.variant(kind, var) else { continue };
        let n = (0..setup.kinds.len()).filter(|&i| setup.kinds[i] == kind && setup.var(i) == var).count() as u64;
        let sym = if var.every_nth { L_EVERY } else { L_KEPT };
        let terms = l.saved.iter().filter(|k| !k.elsewhere).map(|k| {
            let x = &l.prog.tensors[k.t as usize];
            (k.part, b.expr_of(&x.shape, x.dt))
        });
        match t.by_attention.iter_mut().find(|(y, m, _)| *y == sym && *m == n) {
            Some((_, _, v)) => v.extend(terms),
            None => t.by_attention.push((sym, n, terms.collect())),
        }
    }
}

/// The `framework = megatron` profile's ledger (Megatron-LM's tensor list, [`megatron`]).
pub fn megatron_activations(cfg: &Config, recipe: &Recipe, stage: Stage, stage_layers: u64) -> Activations {
    let amp = recipe.autocast_weight_copy;
    let values = Values::of(cfg, recipe);
    let cuda = cfg.kernels == Kernels::Cuda;
    let mut t = Terms::default();
    megatron::megatron_terms(&Ctx::new(cfg, values, amp, cuda), &mut t);
    if cfg.recompute == crate::estimator::config::Recompute::Full && cfg.recompute_layers > 0 {
        let none = Config { recompute: crate::estimator::config::Recompute::None, ..cfg.clone() };
        let mut kept = Terms::default();
        megatron::megatron_terms(&Ctx::new(&none, values, amp, cuda), &mut kept);
        block_terms(cfg, stage, &mut t, kept);
    }
    assemble(cfg, recipe, stage, stage_layers, t, cuda, false)
}

/// The layers Megatron's block method recomputes on this GPU (`recompute_layers`).
pub const L_BLOCK: Sym = Sym::new("L", "ckpt", "layers recomputed (the first recompute_layers of each virtual stage) on this GPU");
/// The other layers on this GPU under Megatron's block method, of either kind or only dense
/// or only MoE ones.
pub const L_BLOCK_KEPT: Sym = Sym::new("L", "kept", "layers not recomputed (recompute_layers) on this GPU");
pub const L_BLOCK_KEPT_DENSE: Sym = Sym::new("L", "kept,dense", "dense-MLP layers not recomputed (recompute_layers) on this GPU");
pub const L_BLOCK_KEPT_MOE: Sym = Sym::new("L", "kept,moe", "MoE layers not recomputed (recompute_layers) on this GPU");

/// Megatron's block method (`recompute = full`, `recompute_layers = N`): the layers it
/// recomputes keep their input only (`t`'s full-recomputation terms, `L_ckpt` of them), the
/// others what `recompute = none` keeps (`kept`'s terms: those of every layer for `L_kept`,
/// the dense and MoE MLPs' for the kept layers of their kind), the layers placed as the step
/// program places them ([`checkpointed_alone_counts`](crate::estimator::step::model::checkpointed_alone_counts)).
fn block_terms(cfg: &Config, stage: Stage, t: &mut Terms, kept: Terms) {
    let (ckpt, dense, moe) = crate::estimator::step::model::checkpointed_alone_counts(cfg, stage);
    let recomputed = std::mem::take(&mut t.layer);
    let Terms { layer, dense_layer, moe_layer, .. } = kept;
    // Without MoE layers the dense MLP's terms are every kept layer's.
    let (every_kept, dense_kept) =
        if cfg.arch.moe_layers() > 0 { (layer, dense_layer) } else { (layer.into_iter().chain(dense_layer).collect(), Vec::new()) };
    let groups = [
        (L_BLOCK, ckpt, recomputed),
        (L_BLOCK_KEPT, dense + moe, every_kept),
        (L_BLOCK_KEPT_DENSE, dense, dense_kept),
        (L_BLOCK_KEPT_MOE, moe, moe_layer),
    ];
    t.by_attention.extend(groups.into_iter().filter(|(_, n, v)| *n > 0 && !v.is_empty()));
}

/// Layers of one kind whose attention types keep different tensors (Gemma-3's sliding layers:
/// SDPA's mask and k, v repeated to `a` heads; its full layers: k and v at `k` heads): the loop
/// of [`activations`] counted the first type's terms for every layer of the kind; what only one
/// type keeps moves to [`Terms::by_attention`], counted for that type's layers (`L_sw`,
/// `L_full`). Terms of every kind (`Group::All`) are the first kind's, as in that loop. Only
/// variants alike but for the window are compared: what RoPE-only and NoPE-only layers keep is
/// counted by its own groups (`Group::Rope`, `Group::Nope`, [`Terms::rope_layer`]).
fn split_by_attention(
    setup: &crate::estimator::step::model::Setup,
    pieces: &crate::estimator::step::fast::Pieces,
    b: &crate::estimator::step::ir::Builder,
    variants: &[(crate::estimator::step::families::Kind, crate::estimator::step::families::Var)],
    has_moe: bool,
    t: &mut Terms,
) {
    use crate::estimator::step::families::{Kind, Var};
    use crate::estimator::step::ir::Group;
    type Term = (Part, Group, u128, Expr);
    let group_of = |g: Group, kind: Kind| match (g, has_moe, kind) {
        (Group::All, _, _) | (_, false, _) => Group::All,
        (_, true, Kind::Moe) => Group::Moe,
        (_, true, Kind::Dense) => Group::Dense,
    };
    let terms_of = |kind: Kind, var: Var| -> Vec<Term> {
        let Some(l) = pieces.variant(kind, var) else { return Vec::new() };
        let prog = &l.prog;
        l.saved
            .iter()
            .filter(|k| !k.elsewhere && !matches!(k.group, Group::Rope | Group::Nope))
            .map(|k| {
                let x = &prog.tensors[k.t as usize];
                (k.part, group_of(k.group, kind), x.bytes, b.expr_of(&x.shape, x.dt))
            })
            .collect()
    };
    // Layers of one attention type on this stage (of one kind, or of any kind).
    let count = |kind: Option<Kind>, var: Var| -> u64 {
        (0..setup.kinds.len()).filter(|&i| kind.is_none_or(|k| setup.kinds[i] == k) && setup.var(i) == var).count() as u64
    };
    for (vi, &(kind, var)) in variants.iter().enumerate() {
        let first_of_kind = !variants[..vi].iter().any(|(k, _)| *k == kind);
        // The other attention type with the same RoPE, else with the other (EXAONE 4: its
        // sliding layers rotate, its full ones are NoPE; what RoPE keeps is in the Rope/Nope
        // groups, left out of these terms).
        let other_type = |same_rope: bool| {
            variants
                .iter()
                .find(|(k, v)| *k == kind && (v.sliding != var.sliding || v.linear != var.linear) && (!same_rope || v.nope == var.nope))
        };
        // Kimi Linear: the first layer's kind has one attention type only (its dense layer is
        // KDA); its terms common to every layer pair with the other type's, in another kind.
        let across = if vi == 0 { variants.iter().find(|(_, v)| v.sliding != var.sliding || v.linear != var.linear) } else { None };
        let (other_kind, other, all_only) = match other_type(true).or_else(|| other_type(false)) {
            Some(&(_, other)) => (kind, other, false),
            None => match across {
                Some(&(k, other)) => (k, other, true),
                None => continue,
            },
        };
        if !first_of_kind {
            continue;
        }
        let only_all = |v: Vec<Term>| -> Vec<Term> { v.into_iter().filter(|t| !all_only || t.1 == Group::All).collect() };
        let here = only_all(terms_of(kind, var));
        let mut only_there = only_all(terms_of(other_kind, other));
        let mut only_here = Vec::new();
        for term in here {
            match only_there.iter().position(|o| o.0 == term.0 && o.1 == term.1 && o.2 == term.2) {
                Some(j) => {
                    only_there.remove(j);
                }
                None => only_here.push(term),
            }
        }
        // The loop counted `here` for every layer of the kind: take its own terms back.
        for (part, group, _, e) in &only_here {
            let list = match group {
                Group::All if vi == 0 => &mut t.layer,
                Group::All => continue,
                Group::Moe => &mut t.moe_layer,
                Group::Dense => &mut t.dense_layer,
                Group::Rope | Group::Nope => continue,
            };
            if let Some(j) = list.iter().position(|(p, x)| p == part && x == e) {
                list.remove(j);
            }
        }
        for (s, list) in [(var, only_here), (other, only_there)] {
            let sym = if s.linear {
                L_LINEAR
            } else if s.sliding {
                L_SLIDING
            } else {
                L_FULL
            };
            for (part, group, _, e) in list {
                let n = match group {
                    Group::All if vi == 0 => count(None, s),
                    Group::All => continue,
                    _ => count(Some(kind), s),
                };
                match t.by_attention.iter_mut().find(|(y, m, _)| *y == sym && *m == n) {
                    Some((_, _, v)) => v.push((part, e)),
                    None => t.by_attention.push((sym, n, vec![(part, e)])),
                }
            }
        }
    }
}

/// A first layer on a frozen embedding (LoRA, QLoRA without checkpointing) keeps nothing that
/// only its input's gradient needs (its input norm, before the first adapter): what only the
/// other layers of its kind keep moves from the per-layer terms to [`Terms::by_attention`],
/// counted for those layers (`L_grad`).
fn first_without_grad(
    setup: &crate::estimator::step::model::Setup,
    pieces: &crate::estimator::step::fast::Pieces,
    b: &crate::estimator::step::ir::Builder,
    has_moe: bool,
    t: &mut Terms,
) {
    use crate::estimator::step::families::Kind;
    use crate::estimator::step::ir::Group;
    let Some(first) = pieces.first_without_grad() else { return };
    let Some(normal) = pieces.variant(first.kind, first.var).filter(|l| l.grad) else { return };
    let mut theirs: Vec<(Part, Group, u128)> =
        first.saved.iter().filter(|k| !k.elsewhere).map(|k| (k.part, k.group, first.prog.tensors[k.t as usize].bytes)).collect();
    let kind_layers = setup.kinds.iter().filter(|&&k| k == first.kind).count() as u64;
    for k in normal.saved.iter().filter(|k| !k.elsewhere) {
        let x = &normal.prog.tensors[k.t as usize];
        if let Some(j) = theirs.iter().position(|o| *o == (k.part, k.group, x.bytes)) {
            theirs.remove(j);
            continue;
        }
        let e = b.expr_of(&x.shape, x.dt);
        let (list, n) = match (k.group, has_moe, first.kind) {
            (Group::All, _, _) | (_, false, _) => (&mut t.layer, setup.kinds.len() as u64 - 1),
            (_, true, Kind::Moe) => (&mut t.moe_layer, kind_layers - 1),
            (_, true, Kind::Dense) => (&mut t.dense_layer, kind_layers - 1),
        };
        let Some(j) = list.iter().position(|(p, y)| *p == k.part && *y == e) else { continue };
        list.remove(j);
        match t.by_attention.iter_mut().find(|(y, m, _)| *y == L_GRAD && *m == n) {
            Some((_, _, v)) => v.push((k.part, e)),
            None => t.by_attention.push((L_GRAD, n, vec![(k.part, e)])),
        }
    }
}

/// Micro-batches whose saved activations a stage holds at the simulated backward, that one
/// included (before interleaving, [`chunks_in_flight`]): 1F1B's rank `r` runs `min(m, p − r)`
/// forwards before its first backward (torch 2.15 `distributed/pipelining/schedules.py`
/// `Schedule1F1B`: "first stage `num_stages` warmups", `warmup_chunks = min(n_microbatches,
/// num_stages - stage_index)`), so the first stage keeps min(p, m), a middle one (the rank
/// halfway, [`rank_of`]) min(⌈p/2⌉, m), the last one. Under torchtitan's FSDP2 a later backward is
/// simulated, whose fp32 gradient accumulators are resident
/// ([`crate::estimator::sharding::accumulators_resident`]): one micro-batch fewer is in flight
/// then where every forward ran before the first backward (m ≤ p − r); the step's first
/// backward (`first_backward`) has them all.
pub fn micro_batches_in_flight(cfg: &Config, stage: Stage, first_backward: bool) -> u64 {
    match stage {
        Stage::Whole | Stage::Last => 1,
        Stage::First | Stage::Middle => {
            let later = crate::estimator::sharding::accumulators_resident(cfg, first_backward);
            let ahead = cfg.pp.saturating_sub(rank_of(cfg, stage)).max(1);
            ahead.min(if later { cfg.accum - 1 } else { cfg.accum }).max(1)
        }
    }
}

/// The pipeline rank a stage kind stands for: the first (0), the last (p − 1), and for a middle
/// stage the rank halfway (⌊p/2⌋).
fn rank_of(cfg: &Config, stage: Stage) -> u64 {
    match stage {
        Stage::Whole | Stage::First => 0,
        Stage::Middle => cfg.pp / 2,
        Stage::Last => cfg.pp.saturating_sub(1),
    }
}

/// Model chunks (one virtual stage of one micro-batch each, 1/v of the stage's layers) whose
/// saved activations a rank holds at the simulated backward under interleaved 1F1B: the `v`
/// chunks of the micro-batch the step simulation runs, and beside them the most chunks of other
/// micro-batches in flight at any backward of the step (at the step's first backward alone for
/// `first_backward`, at the others for a later one, [`crate::estimator::sharding::accumulators_resident`]).
///
/// The rank's order is torch's, replayed: a warm-up of `W = min((v − 1) × g + 2 (p − 1 − r), m × v)`
/// forwards (`g` the micro-batches per round, `m / max(1, ⌊m / p⌋)`), forward `i` on local chunk
/// `⌊i / g⌋ mod v`; then one forward and one backward a step, backward `i` on local chunk
/// `v − 1 − ⌊(i − W) / g⌋ mod v`; then the remaining backwards. At the backward of chunk `j` of
/// micro-batch `k` its chunks `0..=j` are in flight as the simulation's own; the rest are the
/// others. The simulation holds one count of others through its whole backward, so the figure is
/// exact for the backward that holds the most and above the truth for the rest.
///
/// torch 2.15 `distributed/pipelining/schedules.py` `ScheduleInterleaved1F1B`
/// (`number_of_rounds = max(1, n_microbatches // pp_group_size)`, `microbatches_per_round`,
/// `_calculate_single_rank_operations`' `forward_stage_index` / `backward_stage_index`),
/// `_get_warmup_ops` (`multiply_factor = 2`), `_get_1f1b_rank_ops`; Megatron-LM's
/// `forward_backward_pipelining_with_interleaving` has the same warm-up (`(pp − rank − 1) × 2 +
/// (chunks − 1) × microbatch_group_size_per_vp_stage`, all of them when m = p). Korthikanti et
/// al. 2022 §4.2.3's factor `1 + (p − 1)/(p·v)` on the first stage's `p` micro-batches is the
/// warm-up's `W + 1` chunks for many micro-batches; with few (torchtitan's `n_microbatches = pp`
/// of 2024) every forward runs before the first backward, and the factor overstates.
///
/// Toy: p 2, v 2, m 4 on rank 0 (g 2, W 4): forwards of chunks 0, 0, 1, 1 (4 in flight); then
/// F(0, mb 2) B(1, mb 0): 5 in flight, 2 its own, 3 others; F(0, 3) B(1, 1): 3 others; F(1, 2)
/// B(0, 0): 5 in flight, 1 its own, 4 others; … → first backward 2 + 3 = 5 chunks, later 2 + 4 = 6.
/// Measured (`tests/fixtures/pytorch/fsdp/pp_interleaved.json`): within +0.8 to +4.4 % of each
/// rank's allocated peak, never below it.
pub fn chunks_in_flight(cfg: &Config, stage: Stage, first_backward: bool) -> u64 {
    let (p, v, m) = (cfg.pp.max(1), cfg.vpp.max(1), cfg.accum.max(1));
    let per_round = m / (m / p).max(1);
    let all = m * v;
    let rank = rank_of(cfg, stage).min(p - 1);
    let warmup = ((v - 1) * per_round + 2 * (p - 1 - rank)).min(all);
    // Where a later backward finds the accumulators resident (torchtitan's FSDP2), the first
    // backward and the later ones are simulated apart; elsewhere one stands for every backward.
    let split = crate::estimator::sharding::accumulators_resident(cfg, false);
    let counts = |nth: u64| !split || (nth == 0) == first_backward;
    let (mut in_flight, mut others) = (warmup, 0u64);
    for (nth, op) in (warmup..all + warmup).enumerate() {
        if op < all {
            in_flight += 1; // the step's forward
        }
        let chunk = v - 1 - ((op - warmup) / per_round) % v;
        if counts(nth as u64) {
            others = others.max(in_flight.saturating_sub(chunk + 1));
        }
        in_flight = in_flight.saturating_sub(1);
    }
    v + others
}

/// The rows of the ledger from terms by part: each part is
/// `m × (L × layer + L_moe × moe + L_dense × dense + first) + last` (m: micro-batches in flight).
fn assemble(cfg: &Config, recipe: &Recipe, stage: Stage, stage_layers: u64, mut t: Terms, cuda: bool, first_backward: bool) -> Activations {
    let spec = &cfg.arch;
    let _ = (recipe, cuda);

    // Interleaving counts model chunks in flight, each 1/v of the stage ([`chunks_in_flight`]).
    let (num, den) = if cfg.vpp > 1 && cfg.pp > 1 {
        (chunks_in_flight(cfg, stage, first_backward), cfg.vpp)
    } else {
        (micro_batches_in_flight(cfg, stage, first_backward), 1)
    };

    let moe_layers = stage_layers.min(spec.moe_layers());
    let dense_layers = stage_layers - moe_layers;
    let l = Expr::var(L, stage_layers);
    let mut parts: Vec<Part> = t
        .layer
        .iter()
        .chain(&t.moe_layer)
        .chain(&t.dense_layer)
        .chain(&t.rope_layer)
        .chain(&t.nope_layer)
        .chain(&t.first)
        .chain(&t.last)
        .chain(t.by_attention.iter().flat_map(|(_, _, v)| v.iter()))
        .map(|(p, _)| *p)
        .collect();
    parts.sort();
    parts.dedup();
    // The numbers the step simulation needs, before the terms move into the rows.
    let eval = |v: &[(Part, Expr)]| -> Bytes { v.iter().map(|(_, e)| e.eval()).sum() };
    let per_moe = eval(&t.moe_layer);
    let per_dense = eval(&t.dense_layer);
    let (per_rope, per_nope) = (eval(&t.rope_layer), eval(&t.nope_layer));
    // Terms of one attention type's layers, spread over every layer (rounded up: never more
    // "other micro-batch" bytes than there are).
    let by_attention: Bytes = t.by_attention.iter().map(|(_, n, v)| *n as u128 * eval(v)).sum();
    let per_layer = eval(&t.layer)
        + if spec.moe_layers() > 0 { per_moe.max(per_dense) } else { per_dense }
        + if t.n_rope > 0 { per_rope } else { 0 }.max(if t.n_nope > 0 { per_nope } else { 0 })
        + by_attention.div_ceil(stage_layers.max(1) as u128);
    let (n_rope, n_nope) = (t.n_rope, t.n_nope);
    let embedding = if stage.has_embedding() { eval(&t.first) } else { 0 };
    let head_and_loss = if stage.has_head() { eval(&t.last) } else { 0 };
    // Moves one part's terms out of a list (no clones, and no vector of them either: the sum
    // takes them as they are extracted, which on the numeric path folds them without allocating;
    // estimate() runs per keystroke and per sweep point).
    let sum_of = |v: &mut Vec<(Part, Expr)>, p: Part| -> Option<Expr> {
        if !v.iter().any(|(q, _)| *q == p) {
            return None;
        }
        Some(Expr::sum_merged(v.extract_if(.., |(q, _)| *q == p).map(|(_, e)| e)))
    };
    let in_flight = |e: Expr| -> Expr {
        if num == 1 && den == 1 {
            e
        } else if den == 1 {
            Expr::prod([Expr::var(M, num), e])
        } else {
            Expr::prod([Expr::var(M, num), e]).ceil_div(Expr::num(den))
        }
    };
    let mut children = Vec::new();
    for p in parts {
        let mut terms = Vec::new();
        if let Some(e) = sum_of(&mut t.layer, p) {
            terms.push(Expr::prod([l.clone(), e]));
        }
        if moe_layers > 0 {
            if let Some(e) = sum_of(&mut t.moe_layer, p) {
                terms.push(Expr::prod([Expr::var(L_MOE, moe_layers), e]));
            }
        }
        if dense_layers > 0 {
            if let Some(e) = sum_of(&mut t.dense_layer, p) {
                let count = if spec.moe_layers() > 0 { Expr::var(L_DENSE, dense_layers) } else { l.clone() };
                terms.push(Expr::prod([count, e]));
            }
        }
        for (v, n, sym) in [(&mut t.rope_layer, n_rope, L_ROPE), (&mut t.nope_layer, n_nope, L_NOPE)] {
            if let Some(e) = sum_of(v, p) {
                if n > 0 {
                    terms.push(Expr::prod([Expr::var(sym, n), e]));
                }
            }
        }
        for (sym, n, v) in t.by_attention.iter_mut() {
            if *n > 0 {
                if let Some(e) = sum_of(v, p) {
                    terms.push(Expr::prod([Expr::var(*sym, *n), e]));
                }
            }
        }
        if stage.has_embedding() {
            if let Some(e) = sum_of(&mut t.first, p) {
                terms.push(e);
            }
        }
        let mut expr = if terms.is_empty() { None } else { Some(in_flight(Expr::sum(terms))) };
        if stage.has_head() {
            if let Some(e) = sum_of(&mut t.last, p) {
                expr = Some(match expr {
                    Some(x) => Expr::sum([x, e]),
                    None => e,
                });
            }
        }
        if let Some(e) = expr {
            let row = Row::new(RowId::Activation(p), p.label(), Category::Activations, e, p.source());
            if row.bytes > 0 {
                children.push(row);
            }
        }
    }
    let mut row = Row::parent(
        RowId::Activations,
        "Activations (saved for backward)",
        Category::Activations,
        children,
        "sum of the parts; each part's formula is its own",
    );
    row.note = "bytes of the tensors autograd keeps at the end of the forward pass, loss included, each storage once; gradient accumulation does not change them (one micro-batch is alive at a time)".into();
    Activations { row, per_layer, embedding, head_and_loss, in_flight_num: num, in_flight_den: den }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::config::{Attention, Framework, Kernels, Precision, Recompute};
    use crate::estimator::precision::recipe;

    fn acts(cfg: &Config) -> Activations {
        activations(cfg, &recipe(cfg.precision), Stage::Whole, cfg.arch.layers)
    }

    /// The worked example of FINDINGS.md: llama-gqa b2 s64 bf16 sdpa, T = 128, h = 64, a = 4,
    /// k = 2, d = 16, f = 176, V = 1000, 2 layers →
    /// layer = 65,536 + 1,024 + 4·16,384 + 32,768 + 16,384 + 2,048 + 180,224 = 363,520;
    /// ends = 1,024 + 4,096 + 49,664 + 16,384 + 512,000 + 1,024 + 4 = 584,196; total 1,311,236.
    #[test]
    fn the_findings_worked_example_comes_out_to_the_byte() {
        let mut cfg = Config { batch: 2, seq: 64, precision: Precision::Bf16, kernels: Kernels::Cpu, ..Config::default() };
        let a = &mut cfg.arch;
        (a.vocab, a.hidden, a.layers, a.heads, a.kv_heads, a.head_dim, a.ffn) = (1000, 64, 2, 4, 2, 16, 176);
        let x = acts(&cfg);
        assert_eq!(x.per_layer, 363_520);
        assert_eq!(x.row.bytes, 1_311_236);
    }

    #[test]
    fn eager_attention_keeps_quadratic_scores_that_sdpa_does_not() {
        let sdpa = acts(&Config::default()).row.bytes;
        let eager = acts(&Config { attn: Attention::Eager, ..Config::default() }).row.bytes;
        // 32 layers × (4 + 2) bytes × a·s² = 32 × 6 × 32 × 4096² more, minus sdpa's linear terms.
        assert!(eager > sdpa + 32 * 6 * 32 * 4096 * 4096 - 32 * 4 * 4096 * 4096);
    }

    #[test]
    fn full_recomputation_keeps_one_input_per_layer() {
        let cfg = Config { recompute: Recompute::Full, ..Config::default() };
        let x = acts(&cfg);
        let ckpt = x.row.children.iter().find(|r| r.id == RowId::Activation(Part::Checkpoints)).map(|r| r.bytes);
        // 32 layers × b·s·h × 2 B + position_ids 8·s.
        assert_eq!(ckpt, Some(32 * 4096 * 4096 * 2 + 8 * 4096));
    }

    #[test]
    fn megatrons_block_method_keeps_the_inputs_of_its_layers_and_everything_of_the_others() {
        // Llama 3.1 8B on Megatron's modules: with N of its L = 32 layers recomputed the row is
        // none's less N layers' difference between keeping everything and keeping the input,
        // A(N) = A_none − N/L · (A_none − A_full), to the byte (the ends are the same).
        let of = |recompute: Recompute, n: u64| {
            let cfg =
                Config { framework: Framework::Megatron, attn: Attention::Flash, recompute, recompute_layers: n, ..Config::default() };
            megatron_activations(&cfg, &recipe(cfg.precision), Stage::Whole, 32).row.bytes
        };
        let (none, full) = (of(Recompute::None, 0), of(Recompute::Full, 0));
        for n in [1, 4, 31] {
            assert_eq!(of(Recompute::Full, n), none - n as u128 * (none - full) / 32, "N = {n}");
        }
        // N beyond the stage's layers recomputes them all.
        assert_eq!(of(Recompute::Full, 32), full);
        assert_eq!(of(Recompute::Full, 40), full);
    }

    #[test]
    fn a_1f1b_rank_holds_the_forwards_it_runs_before_its_first_backward() {
        // p 4: rank 0 runs min(m, 4) forwards first, rank 2 (the middle) min(m, 2), rank 3 one.
        let of = |accum: u64, stage: Stage| micro_batches_in_flight(&Config { pp: 4, gpus: 4, accum, ..Config::default() }, stage, false);
        assert_eq!([of(8, Stage::First), of(8, Stage::Middle), of(8, Stage::Last)], [4, 2, 1]);
        // Two micro-batches: both forwards run before the middle rank's first backward too.
        assert_eq!([of(2, Stage::First), of(2, Stage::Middle), of(2, Stage::Last)], [2, 2, 1]);
    }

    #[test]
    fn interleaved_ranks_hold_the_chunks_torchs_schedule_leaves_in_flight() {
        let megatron = Config { framework: Framework::Megatron, pp: 8, vpp: 2, accum: 8, ..Config::default() };
        // m = p: every forward before the first backward, 16 chunks (8 stages' worth), where
        // Korthikanti's factor would say 8 × 23/16 = 11.5 stages (23 chunks).
        assert_eq!(chunks_in_flight(&megatron, Stage::First, false), 16);
        // m = 32 in 4 rounds of 8: a warm-up of 8 + 14 = 22, one forward more before the first
        // backward (23 in flight, 21 others beside its 2), then backwards of chunk 0 with 22 others.
        assert_eq!(chunks_in_flight(&Config { accum: 32, ..megatron.clone() }, Stage::First, false), 24);
        // The last rank warms up (v − 1) × g = 8 forwards: 9 in flight at its first backward, 7
        // others; at its first backward of chunk 0, 8 others.
        assert_eq!(chunks_in_flight(&Config { accum: 32, ..megatron.clone() }, Stage::Last, false), 10);
        // torchtitan's FSDP2 simulates the first backward apart: p 2, v 2, m 4 on rank 0 (the
        // doc's toy) has 3 others at the first, 4 at the later ones.
        let titan = Config {
            framework: Framework::Torchtitan,
            zero: crate::estimator::config::Zero::FullShard,
            gpus: 4,
            pp: 2,
            vpp: 2,
            accum: 4,
            ..Config::default()
        };
        assert!(crate::estimator::sharding::keeps_stage_gathered(&titan));
        assert_eq!(chunks_in_flight(&titan, Stage::First, true), 5);
        assert_eq!(chunks_in_flight(&titan, Stage::First, false), 6);
    }

    #[test]
    fn megatrons_block_method_counts_its_layers_in_each_virtual_stage() {
        // pp 2 × vpp 2 on 32 layers: each virtual stage has 8; N = 3 recomputes 3 of each, 6 of
        // the first stage's 16, and keeps everything of the other 10.
        let base = Config { framework: Framework::Megatron, attn: Attention::Flash, gpus: 2, pp: 2, accum: 4, ..Config::default() };
        let of = |recompute: Recompute, n: u64, vpp: u64| {
            let cfg = Config { recompute, recompute_layers: n, vpp, ..base.clone() };
            megatron_activations(&cfg, &recipe(cfg.precision), Stage::First, 16)
        };
        let (none, full) = (of(Recompute::None, 0, 2), of(Recompute::Full, 0, 2));
        let block = of(Recompute::Full, 3, 2);
        let per = |a: &Activations| a.row.bytes;
        // The same micro-batches in flight multiply every layer's bytes alike.
        assert_eq!(per(&block), per(&none) - 6 * (per(&none) - per(&full)) / 16);
        // Without interleaving the stage is one block: 3 of its 16.
        let one = of(Recompute::Full, 3, 1);
        let (none1, full1) = (of(Recompute::None, 0, 1), of(Recompute::Full, 0, 1));
        assert_eq!(per(&one), per(&none1) - 3 * (per(&none1) - per(&full1)) / 16);
    }

    #[test]
    fn the_loss_of_a_128k_vocabulary_is_a_large_share() {
        let x = acts(&Config::default());
        let loss = x.row.children.iter().find(|r| r.id == RowId::Activation(Part::Loss)).map_or(0, |r| r.bytes);
        // 4 B × 4096 × 128,256 fp32 log-probabilities ≈ 2.1 GB.
        assert!(loss >= 4 * 4096 * 128_256);
    }

    #[test]
    fn every_symbol_the_terms_use_is_bound_to_its_value() {
        let cfg = Config::default();
        let r = recipe(cfg.precision);
        let x = activations(&cfg, &r, Stage::Whole, 32);
        let mut unbound = Vec::new();
        for row in &x.row.children {
            for (s, v) in row.expr.symbols() {
                if v == 0 {
                    unbound.push(format!("{}_{} in {}", s.base, s.sub, row.id));
                }
            }
        }
        assert!(unbound.is_empty(), "{unbound:?}");
    }
}
