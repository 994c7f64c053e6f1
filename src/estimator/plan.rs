//! The planner: every configuration of a space that fits, ranked by the cost model; the Pareto
//! frontier of memory headroom against estimated step time; why the best plan sets each knob
//! where it does; and, for a configuration that does not fit, the cheapest single changes that
//! make it fit.
//!
//! # Exact, with safe pruning
//! Whether a configuration fits is decided by [`estimate`] and nothing else (through [`fits`],
//! the one function to change when the verdict moves to reserved memory). The search skips an
//! estimate only when a *verified* monotonicity proves the configuration cannot fit. It uses
//! exactly these properties of [`measure`] (the memory the verdict compares), each checked by
//! property tests in `tests/plan.rs` over random presets and knobs (the recipe knobs — compile,
//! every-Nth-layer checkpointing, activation offloading — included):
//!
//! - **M1, micro-batch**: with everything else fixed (accumulation included), memory never
//!   decreases when the micro-batch grows.
//! - **M2, accumulation**: with everything else fixed, memory never decreases when the
//!   accumulation steps grow (gradients stay resident; pipelines hold more micro-batches).
//! - **C, sharding and saving chains**: memory never increases one step down each chain of
//!   [`memory_chain_below`]: ZeRO 0 → 1, FSDP `HYBRID_SHARD` → `FULL_SHARD`, offload none →
//!   optimizer → optimizer + parameters, attention eager → SDPA = flash from
//!   [`EAGER_CHAIN_MIN_SEQ`] tokens on (SDPA and flash each below the other: the same memory).
//!
//! What is *not* used, because the estimator breaks it: `HYBRID_SHARD` → DeepSpeed ZeRO-3 (the
//! property test found GPT-2 on 2 × 2 GPUs where ZeRO-3's 500 M-element reduce bucket outweighs
//! what it shards beyond hybrid sharding; FSDP has no such bucket), ZeRO-2 → ZeRO-3 (ZeRO-3 adds
//! gathered layers and prefetch buffers: for small models on few GPUs it holds more), ZeRO-1 →
//! ZeRO-2 / `SHARD_GRAD_OP` (the gradient shard is resident through the whole step, while
//! ZeRO-1's full gradients only build up during backward: GPT-2 at 128 tokens on 2 GPUs peaks
//! higher at the LM head's backward under ZeRO-2 than at the embedding's under ZeRO-1),
//! no recomputation → selective (the recomputed attention core is re-materialized in backward
//! beside the tensors selective recomputation still keeps: Mixtral-8x7B with eager attention
//! at 2,048 tokens and cp = 2 peaks 4 MiB higher), sequence parallelism off → on (the
//! all-gathered sequence before the LM head and the reduce-scatter of its gradient: Qwen3-235B
//! at 128 tokens with tp = 2, eager attention and full recomputation peaks 96 MB higher) and
//! selective → full recomputation (full recomputation re-materializes a layer at a time, which
//! can exceed what selective keeps for short sequences).
//!
//! Rule C also applies point by point: a configuration whose chain neighbour below (same
//! micro-batch and accumulation) does not fit does not fit either. And when that neighbour fits
//! and the cost model says it is at least as fast, the configuration is *dominated* — the
//! neighbour has at least its headroom (C) and no longer a step — and, unless
//! [`PlanRequest::skip_dominated`] is off, it is not estimated.
//!
//! The target fixes the global batch `G` (sequences), so a micro-batch `b` comes with
//! `accum = G / (b·dp)`. When `(b, accum)` does not fit, the search estimates the same
//! configuration at `accum = 1` (the *probe*). If that does not fit either, no larger `b` fits:
//! `mem(b', a') ≥ mem(b', 1)` (M2) `≥ mem(b, 1)` (M1) `> capacity`. A failed probe also prunes
//! the same micro-batches of every configuration above it in a chain (C). Pruned configurations
//! are therefore *proven* not to fit — never merely "probably worse"; the integration tests
//! check this against brute force.
//!
//! # Ranking
//! Fitting configurations are ranked by [`cost::step_cost`]'s estimated step time (fastest
//! first; equal times by more headroom). The frontier keeps each configuration no other beats
//! on both step time and headroom. Both are *estimates*: see [`cost`] for the model and its
//! assumptions, which every result carries.
//!
//! # Slices, progress, cancel
//! [`Search`] is a stepper: [`Search::step`] runs at most a given number of estimates and
//! returns [`Progress`], so a UI can run it in slices between frames (or in a worker) and stop
//! whenever it likes; [`Search::result`] ranks what has been found so far.

use super::analyse::{analyse, headroom_pct, Analysis};
use super::config::{ActOffload, Attention, Config, Finetune, Framework, Loss, Offload, OptimImpl, Optimizer, Recompute, Zero};
use super::cost::{self, Assumption, Assumptions, CostError, Hardware, ModelFigures, StepCost};
use super::estimate::{by_category, estimate, Estimate};
use super::ledger::{Bytes, Category};
use super::names::Named;
use super::params::virtual_stage_layers;
use super::units::format_bytes;
use super::validate::{validate, EstimateError};
use serde::Serialize;
use std::collections::HashMap;

/// Largest micro-batch the default space tries.
pub const MAX_MICRO_BATCH: u64 = 64;
/// Largest pipeline degree the default space tries.
pub const MAX_DEFAULT_PP: u64 = 16;
/// Largest context-parallel degree the default space tries (for sequences of at least
/// [`CP_MIN_SEQ`] tokens).
pub const MAX_DEFAULT_CP: u64 = 4;
/// Sequences from this length on get context parallelism in the default space.
pub const CP_MIN_SEQ: u64 = 8192;
/// Plans a result lists by default.
pub const DEFAULT_KEEP: usize = 20;
/// Changes [`cheapest_fixes`] returns by default.
pub const DEFAULT_FIXES: usize = 3;
/// The every-Nth-layer checkpointing the default space tries beside none: every 2nd layer
/// (torchtitan's `selective_ac_option = "2"`), half the layers' activations for half of full
/// recomputation's extra forward.
pub const EVERY_NTH_DEFAULT: u64 = 2;

/// Half the layers: the per-layer activation offloading (`act_offload_layers`) the
/// cheapest-change list offers on Megatron and the Plan panel's offloading knob opens, and the
/// layers of each virtual stage Megatron's block method recomputes in that list
/// (`recompute_layers`).
pub fn half_the_layers(layers: u64) -> u64 {
    layers / 2
}

/// Whether an estimate's step peak in use fits its GPU: what the search prunes on. It is
/// necessary for the verdict ([`Verdict`]: nvidia-smi never shows less than the peak in use), and
/// fast; every plan and fix the planner reports is then decided by [`analyse`] itself.
pub fn peak_fits(e: &Estimate) -> bool {
    e.memory.peak <= e.capacity
}

/// Why a plan cannot be made; always names the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("`global_batch` must be at least one sequence")]
    EmptyBatch,
    #[error("`global_batch_tokens` = {tokens} is not a multiple of `seq` = {seq}")]
    TokensNotMultipleOfSeq { tokens: u64, seq: u64 },
    #[error("`{key}` allows no value in the search space")]
    EmptySpace { key: &'static str },
    #[error(transparent)]
    Estimate(#[from] EstimateError),
    #[error(transparent)]
    Cost(#[from] CostError),
}

impl PlanError {
    /// The key at fault.
    pub fn key(&self) -> &'static str {
        match self {
            PlanError::EmptyBatch => "global_batch",
            PlanError::TokensNotMultipleOfSeq { .. } => "global_batch_tokens",
            PlanError::EmptySpace { key } => key,
            PlanError::Estimate(e) => e.key(),
            PlanError::Cost(CostError::UnknownGpu(_)) => "gpu",
            PlanError::Cost(CostError::MissingTflops) => "gpu_tflops",
            PlanError::Cost(CostError::MissingHbm) => "gpu_hbm_gbs",
            PlanError::Cost(CostError::Zero { key }) => key,
        }
    }
}

/// The target's global batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GlobalBatch {
    /// Tokens per optimizer step (a multiple of the sequence length).
    Tokens(u64),
    /// Sequences per optimizer step.
    Sequences(u64),
}

impl GlobalBatch {
    /// Sequences per step for sequences of `seq` tokens.
    pub fn sequences(self, seq: u64) -> Result<u64, PlanError> {
        let n = match self {
            GlobalBatch::Sequences(n) => n,
            GlobalBatch::Tokens(t) => {
                if seq == 0 || t % seq != 0 {
                    return Err(PlanError::TokensNotMultipleOfSeq { tokens: t, seq });
                }
                t / seq
            }
        };
        if n == 0 {
            return Err(PlanError::EmptyBatch);
        }
        Ok(n)
    }
}

/// Every knob the planner turns, by the configuration key that spells its values, in the order
/// of [`Space`]'s and [`Knobs`]' fields: what `trainmem plan --try-KNOB` accepts
/// ([`Space::set_from`]), the plans' CSV columns (the accumulation steps beside the
/// micro-batch: [`csv_header`]) and [`Space::tried`] name.
pub const KNOBS: [&str; 19] = [
    "batch",
    "zero",
    "recompute",
    "attn",
    "optim",
    "optim_impl",
    "offload",
    "tp",
    "pp",
    "vpp",
    "cp",
    "ep",
    "sp",
    "finetune",
    "compile",
    "recompute_every",
    "recompute_layers",
    "act_offload",
    "act_offload_layers",
];

/// The values each knob may take. Empty `batch` means every micro-batch up to
/// [`MAX_MICRO_BATCH`] that divides the global batch.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Space {
    pub batch: Vec<u64>,
    pub zero: Vec<Zero>,
    pub recompute: Vec<Recompute>,
    pub attn: Vec<Attention>,
    pub optim: Vec<Optimizer>,
    pub optim_impl: Vec<OptimImpl>,
    pub offload: Vec<Offload>,
    pub tp: Vec<u64>,
    pub pp: Vec<u64>,
    pub vpp: Vec<u64>,
    pub cp: Vec<u64>,
    pub ep: Vec<u64>,
    pub sp: Vec<bool>,
    pub finetune: Vec<Finetune>,
    /// `compile`: torch.compile over the configured `compile_regions`.
    pub compile: Vec<bool>,
    /// `recompute_every`: full checkpointing of every Nth layer (0: off).
    pub recompute_every: Vec<u64>,
    /// `recompute_layers`: Megatron's block method, full recomputation of the first N layers of
    /// each (virtual) pipeline stage (0: every layer); tried with `recompute = full` only, and
    /// only where N is fewer than the stage's layers.
    pub recompute_layers: Vec<u64>,
    /// `act_offload`: saved-tensor hooks that move activations to pinned host memory.
    pub act_offload: Vec<ActOffload>,
    /// `act_offload_layers`: Transformer Engine's per-layer offloading of the first N layers.
    pub act_offload_layers: Vec<u64>,
}

impl Space {
    /// This space with `knob` (one of [`KNOBS`]) open to every value the planner offers for it
    /// beyond the default space, the base's own value first: the optimizer and the parameters
    /// offloaded to the host or not (`offload`), torchtune's activation offloading — on
    /// Megatron's profile Transformer Engine's per-layer offloading of half the layers instead
    /// (`act_offload`, `act_offload_layers`) —, AdamW or 8-bit Adam, fused or foreach (`optim`,
    /// `optim_impl`), full fine-tuning, LoRA or QLoRA (`finetune`), every attention kernel
    /// (`attn`). Any other knob is left as it is. The page's checkboxes and the widening of a
    /// search that found nothing ([`widen`]) open knobs through it.
    pub fn opened(mut self, base: &Config, knob: &str) -> Space {
        /// `values`, with the base's own value first where they leave it out.
        fn with<T: PartialEq + Copy>(own: T, values: &[T]) -> Vec<T> {
            std::iter::once(own).chain(values.iter().copied().filter(|v| *v != own)).collect()
        }
        match knob {
            "offload" => self.offload = with(base.offload, &[Offload::None, Offload::Optimizer, Offload::OptimizerParams]),
            // Megatron's profile offloads per layer (Transformer Engine's), the others through
            // saved-tensor hooks (torchtune's): the validator refuses each on the other's side.
            "act_offload" | "act_offload_layers" if base.framework == Framework::Megatron => {
                self.act_offload_layers = with(base.act_offload_layers, &[0, half_the_layers(base.arch.layers)]);
            }
            "act_offload" | "act_offload_layers" => self.act_offload = with(base.act_offload, &[ActOffload::None, ActOffload::Torchtune]),
            "optim" | "optim_impl" => {
                self.optim = with(base.optim, &[Optimizer::Adamw, Optimizer::Adam8bit]);
                self.optim_impl = with(base.optim_impl, &[OptimImpl::Fused, OptimImpl::Foreach]);
            }
            "finetune" => self.finetune = with(base.finetune, &[Finetune::Full, Finetune::Lora, Finetune::Qlora]),
            "attn" => self.attn = with(base.attn, &[Attention::Eager, Attention::Sdpa, Attention::Flash]),
            _ => {}
        }
        self
    }

    /// Only what `base` sets (every valid micro-batch).
    pub fn fixed(base: &Config) -> Space {
        Space {
            batch: Vec::new(),
            zero: vec![base.zero],
            recompute: vec![base.recompute],
            attn: vec![base.attn],
            optim: vec![base.optim],
            optim_impl: vec![base.optim_impl],
            offload: vec![base.offload],
            tp: vec![base.tp],
            pp: vec![base.pp],
            vpp: vec![base.vpp],
            cp: vec![base.cp],
            ep: vec![base.ep],
            sp: vec![base.sp],
            finetune: vec![base.finetune],
            compile: vec![base.compile],
            recompute_every: vec![base.recompute_every],
            recompute_layers: vec![base.recompute_layers],
            act_offload: vec![base.act_offload],
            act_offload_layers: vec![base.act_offload_layers],
        }
    }

    /// What `trainmem plan` searches unless told otherwise: the sharding, recomputation,
    /// compilation and model-parallel layouts that do not change what is trained — ZeRO 0–3
    /// (and HSDP across nodes), recomputation none/selective/op/full and full checkpointing of
    /// every 2nd layer, `torch.compile` off and on (over the configured regions), tensor
    /// parallelism within a node, pipeline parallelism up to [`MAX_DEFAULT_PP`], context
    /// parallelism for long sequences, expert parallelism for MoE models, sequence parallelism
    /// with tensor parallelism. Optimizer, attention kernel, offload (of the optimizer and of
    /// activations: both take host memory) and fine-tuning method stay as configured.
    pub fn default_for(base: &Config) -> Space {
        let m = &base.arch;
        let pow2 = |max: u64| -> Vec<u64> { (0..).map(|i| 1u64 << i).take_while(|&v| v <= max).collect() };
        let node = base.gpus_per_node.max(1).min(base.gpus.max(1));
        let tp: Vec<u64> = pow2(node).into_iter().filter(|t| m.heads.is_multiple_of(*t)).collect();
        let pp: Vec<u64> = pow2(MAX_DEFAULT_PP.min(m.layers).min(base.gpus.max(1))).into_iter().collect();
        let cp = if base.seq >= CP_MIN_SEQ { pow2(MAX_DEFAULT_CP.min(base.gpus.max(1))) } else { vec![1] };
        let ep = if m.experts > 0 {
            pow2(m.experts.min(base.gpus.max(1))).into_iter().filter(|e| m.experts.is_multiple_of(*e)).collect()
        } else {
            vec![1]
        };
        let mut zero = vec![Zero::Ddp, Zero::Z1, Zero::Z2, Zero::Z3];
        if base.gpus > base.gpus_per_node {
            zero.push(Zero::HybridShard);
        }
        Space {
            batch: Vec::new(),
            zero,
            recompute: vec![Recompute::None, Recompute::Selective, Recompute::Op, Recompute::Full],
            attn: vec![base.attn],
            optim: vec![base.optim],
            optim_impl: vec![base.optim_impl],
            offload: vec![base.offload],
            tp,
            pp,
            vpp: vec![1],
            cp,
            ep,
            sp: vec![false, true],
            finetune: vec![base.finetune],
            compile: vec![false, true],
            recompute_every: if m.layers >= EVERY_NTH_DEFAULT { vec![0, EVERY_NTH_DEFAULT] } else { vec![0] },
            recompute_layers: block_method_tries(base),
            act_offload: vec![base.act_offload],
            act_offload_layers: vec![base.act_offload_layers],
        }
    }

    /// How many values the space tries for knob `key` (one of [`KNOBS`]; `None` for any other
    /// name). An empty micro-batch list means every valid micro-batch.
    pub fn tried(&self, key: &str) -> Option<usize> {
        Some(match key {
            "batch" => self.batch.len(),
            "zero" => self.zero.len(),
            "recompute" => self.recompute.len(),
            "attn" => self.attn.len(),
            "optim" => self.optim.len(),
            "optim_impl" => self.optim_impl.len(),
            "offload" => self.offload.len(),
            "tp" => self.tp.len(),
            "pp" => self.pp.len(),
            "vpp" => self.vpp.len(),
            "cp" => self.cp.len(),
            "ep" => self.ep.len(),
            "sp" => self.sp.len(),
            "finetune" => self.finetune.len(),
            "compile" => self.compile.len(),
            "recompute_every" => self.recompute_every.len(),
            "recompute_layers" => self.recompute_layers.len(),
            "act_offload" => self.act_offload.len(),
            "act_offload_layers" => self.act_offload_layers.len(),
            _ => return None,
        })
    }

    /// Knob `key`'s values as the CLI's `--try-KEY` and the URL spell them (`None` for a name
    /// that is not one of [`KNOBS`]; the empty micro-batch list, every valid micro-batch, is
    /// empty here too).
    pub fn spelled(&self, key: &str) -> Option<Vec<String>> {
        fn names<T: Named>(v: &[T]) -> Vec<String> {
            v.iter().map(|x| x.name().to_string()).collect()
        }
        fn numbers<T: ToString>(v: &[T]) -> Vec<String> {
            v.iter().map(T::to_string).collect()
        }
        Some(match key {
            "batch" => numbers(&self.batch),
            "zero" => names(&self.zero),
            "recompute" => names(&self.recompute),
            "attn" => names(&self.attn),
            "optim" => names(&self.optim),
            "optim_impl" => names(&self.optim_impl),
            "offload" => names(&self.offload),
            "tp" => numbers(&self.tp),
            "pp" => numbers(&self.pp),
            "vpp" => numbers(&self.vpp),
            "cp" => numbers(&self.cp),
            "ep" => numbers(&self.ep),
            "sp" => numbers(&self.sp),
            "finetune" => names(&self.finetune),
            "compile" => numbers(&self.compile),
            "recompute_every" => numbers(&self.recompute_every),
            "recompute_layers" => numbers(&self.recompute_layers),
            "act_offload" => names(&self.act_offload),
            "act_offload_layers" => numbers(&self.act_offload_layers),
            _ => return None,
        })
    }

    /// Sets knob `key`'s values to those of `values` — configurations that differ from the
    /// base in that key only, each read by the configuration's own parser (so a list takes
    /// the URL's spellings). Returns `false`, leaving the space as it was, when `key` is not
    /// one of [`KNOBS`].
    pub fn set_from(&mut self, key: &str, values: &[Config]) -> bool {
        macro_rules! take {
            ($field:ident) => {
                self.$field = values.iter().map(|c| c.$field).collect()
            };
        }
        match key {
            "batch" => take!(batch),
            "zero" => take!(zero),
            "recompute" => take!(recompute),
            "attn" => take!(attn),
            "optim" => take!(optim),
            "optim_impl" => take!(optim_impl),
            "offload" => take!(offload),
            "tp" => take!(tp),
            "pp" => take!(pp),
            "vpp" => take!(vpp),
            "cp" => take!(cp),
            "ep" => take!(ep),
            "sp" => take!(sp),
            "finetune" => take!(finetune),
            "compile" => take!(compile),
            "recompute_every" => take!(recompute_every),
            "recompute_layers" => take!(recompute_layers),
            "act_offload" => take!(act_offload),
            "act_offload_layers" => take!(act_offload_layers),
            _ => return false,
        }
        true
    }

    fn check(&self) -> Result<(), PlanError> {
        // The micro-batch's empty list means every valid one; any other empty list, no plan.
        match KNOBS.iter().find(|&&key| key != "batch" && self.tried(key) == Some(0)) {
            Some(&key) => Err(PlanError::EmptySpace { key }),
            None => Ok(()),
        }
    }
}

/// One point of the space: every knob the planner turns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Knobs {
    pub batch: u64,
    pub accum: u64,
    pub zero: Zero,
    pub recompute: Recompute,
    pub attn: Attention,
    pub optim: Optimizer,
    pub optim_impl: OptimImpl,
    pub offload: Offload,
    pub tp: u64,
    pub pp: u64,
    pub vpp: u64,
    pub cp: u64,
    pub ep: u64,
    pub sp: bool,
    pub finetune: Finetune,
    pub compile: bool,
    pub recompute_every: u64,
    pub recompute_layers: u64,
    pub act_offload: ActOffload,
    pub act_offload_layers: u64,
}

impl std::hash::Hash for Knobs {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // The configuration's enums are fieldless: their discriminants identify them.
        (
            self.batch,
            self.accum,
            self.tp,
            self.pp,
            self.vpp,
            self.cp,
            self.ep,
            self.recompute_every,
            self.recompute_layers,
            self.act_offload_layers,
        )
            .hash(state);
        [
            self.zero as u8,
            self.recompute as u8,
            self.attn as u8,
            self.optim as u8,
            self.optim_impl as u8,
            self.offload as u8,
            self.sp as u8,
            self.finetune as u8,
            self.compile as u8,
            self.act_offload as u8,
        ]
        .hash(state);
    }
}

impl Knobs {
    /// The knobs of a configuration.
    pub fn of(c: &Config) -> Knobs {
        Knobs {
            batch: c.batch,
            accum: c.accum,
            zero: c.zero,
            recompute: c.recompute,
            attn: c.attn,
            optim: c.optim,
            optim_impl: c.optim_impl,
            offload: c.offload,
            tp: c.tp,
            pp: c.pp,
            vpp: c.vpp,
            cp: c.cp,
            ep: c.ep,
            sp: c.sp,
            finetune: c.finetune,
            compile: c.compile,
            recompute_every: c.recompute_every,
            recompute_layers: c.recompute_layers,
            act_offload: c.act_offload,
            act_offload_layers: c.act_offload_layers,
        }
    }

    /// `base` with these knobs (hybrid sharding groups one node's GPUs).
    pub fn apply(&self, base: &Config) -> Config {
        let mut c = base.clone();
        self.apply_to(&mut c);
        c
    }

    fn apply_to(&self, c: &mut Config) {
        c.batch = self.batch;
        c.accum = self.accum;
        c.zero = self.zero;
        c.recompute = self.recompute;
        // Megatron's block method picks among the layers full recomputation recomputes: a plan
        // that recomputes otherwise has none to pick.
        c.recompute_layers = if self.recompute == Recompute::Full { self.recompute_layers } else { 0 };
        c.attn = self.attn;
        c.optim = self.optim;
        c.optim_impl = self.optim_impl;
        c.offload = self.offload;
        c.tp = self.tp;
        c.pp = self.pp;
        c.vpp = self.vpp;
        c.cp = self.cp;
        c.ep = self.ep;
        c.sp = self.sp;
        c.finetune = self.finetune;
        c.compile = self.compile;
        c.recompute_every = self.recompute_every;
        c.act_offload = self.act_offload;
        c.act_offload_layers = self.act_offload_layers;
        if self.zero == Zero::HybridShard {
            c.shard_group = c.gpus_per_node.max(1);
        }
    }

    /// Data-parallel degree on `gpus`.
    pub fn dp(&self, gpus: u64) -> u64 {
        gpus.checked_div(self.tp * self.pp * self.cp).unwrap_or(0)
    }
}

/// The knobs whose memory chains the search uses (rule C of the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChainKnob {
    Zero,
    Offload,
    Recompute,
    Attn,
    Sp,
}

/// The configurations one step down `knob`'s memory chain from `g`: configurations that, by the
/// verified property C, never need more memory than `g`.
///
/// `seq` is the sequence length: eager attention is above SDPA only from
/// [`EAGER_CHAIN_MIN_SEQ`] tokens on (below it, Phi-3's SDPA path keeps its fused QKV output
/// and a copy — more than eager's small score matrices).
pub fn memory_chain_below(knob: ChainKnob, g: &Knobs, seq: u64) -> Vec<Knobs> {
    chain_below(knob, g, seq).into_iter().flatten().collect()
}

/// Shortest sequence from which eager attention never needs less memory than SDPA or flash:
/// below a few thousand tokens a fused kernel's contiguous q/k/v copies and log-sum-exp can
/// outweigh eager's scores (Phi-3 in fp32 on CUDA keeps 4.85 GB under SDPA against 4.78 GB eager
/// at 256 tokens; tests/properties.rs checks eager ≥ SDPA from here on).
pub const EAGER_CHAIN_MIN_SEQ: u64 = 2048;

/// [`memory_chain_below`] without allocating (the search calls it for every configuration).
fn chain_below(knob: ChainKnob, g: &Knobs, seq: u64) -> [Option<Knobs>; 2] {
    let with = |f: &dyn Fn(&mut Knobs)| {
        let mut k = *g;
        f(&mut k);
        Some(k)
    };
    match knob {
        ChainKnob::Zero => match g.zero {
            Zero::Ddp => [with(&|k| k.zero = Zero::Z1), None],
            // HYBRID_SHARD shards within a node only: FULL_SHARD over every rank holds less.
            Zero::HybridShard => [with(&|k| k.zero = Zero::FullShard), None],
            _ => [None, None],
        },
        ChainKnob::Offload => match g.offload {
            Offload::None => [with(&|k| k.offload = Offload::Optimizer), None],
            Offload::Optimizer => [with(&|k| k.offload = Offload::OptimizerParams), None],
            Offload::OptimizerParams => [None, None],
        },
        // No recomputation step is safe: see the module docs.
        ChainKnob::Recompute => [None, None],
        ChainKnob::Attn => match g.attn {
            Attention::Eager if seq >= EAGER_CHAIN_MIN_SEQ => [with(&|k| k.attn = Attention::Sdpa), with(&|k| k.attn = Attention::Flash)],
            Attention::Eager => [None, None],
            // SDPA's fused kernels and flash-attn keep the same tensors: each is "below" the
            // other (a cycle is harmless: only configurations already settled are consulted).
            Attention::Sdpa => [with(&|k| k.attn = Attention::Flash), None],
            Attention::Flash => [with(&|k| k.attn = Attention::Sdpa), None],
        },
        // No step is safe: see the module docs.
        ChainKnob::Sp => [None, None],
    }
}

/// Every chain knob.
pub const CHAIN_KNOBS: [ChainKnob; 5] = [ChainKnob::Zero, ChainKnob::Offload, ChainKnob::Recompute, ChainKnob::Attn, ChainKnob::Sp];

/// Position of a value in the enumeration: lower-memory values of each chain come first, so a
/// group's chain neighbours are always searched before it.
fn zero_order(z: Zero) -> u8 {
    match z {
        Zero::Z3 => 0,
        Zero::FullShard => 1,
        Zero::HybridShard => 2,
        Zero::Z2 => 3,
        Zero::ShardGradOp => 4,
        Zero::Z1 => 5,
        Zero::Ddp => 6,
    }
}
fn offload_order(o: Offload) -> u8 {
    match o {
        Offload::OptimizerParams => 0,
        Offload::Optimizer => 1,
        Offload::None => 2,
    }
}
fn recompute_order(r: Recompute) -> u8 {
    match r {
        Recompute::Full => 0,
        Recompute::Op => 1,
        Recompute::Selective => 2,
        Recompute::None => 3,
    }
}
fn attn_order(a: Attention) -> u8 {
    match a {
        Attention::Flash => 0,
        Attention::Sdpa => 1,
        Attention::Eager => 2,
    }
}

fn sorted_dedup<T: Copy + PartialEq>(v: &[T], key: impl Fn(T) -> u8) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(v.len());
    for &x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out.sort_by_key(|&x| key(x));
    out
}

fn dedup_u64(v: &[u64]) -> Vec<u64> {
    let mut out = v.to_vec();
    out.sort_unstable();
    out.dedup();
    out
}

/// A planning request.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanRequest {
    /// The model, precision, GPU, GPU count, cluster and sequence length; the knobs of the
    /// space override the rest.
    pub base: Config,
    pub global_batch: GlobalBatch,
    pub space: Space,
    pub assumptions: Assumptions,
    /// Ranked plans to return (0: all).
    pub keep: usize,
    /// Skip configurations proven dominated instead of estimating them (see
    /// [`Progress::dominated`]); off lists every fitting configuration.
    pub skip_dominated: bool,
}

impl PlanRequest {
    /// A request over [`Space::default_for`] the base.
    pub fn new(base: Config, global_batch: GlobalBatch) -> PlanRequest {
        let space = Space::default_for(&base);
        PlanRequest { base, global_batch, space, assumptions: Assumptions::default(), keep: DEFAULT_KEEP, skip_dominated: true }
    }
}

/// A fitting configuration found by the search.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Point {
    pub knobs: Knobs,
    /// [`measure`] of its estimate.
    pub memory: Bytes,
    pub headroom: i128,
    /// Estimated step time, seconds.
    pub step_s: f64,
    pub tokens_per_s: f64,
    pub mfu: f64,
}

/// How far the search is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Progress {
    /// Configurations in the space (groups × their micro-batches).
    pub configurations: u64,
    /// Configurations settled so far (estimated, pruned or invalid).
    pub settled: u64,
    /// Estimated and fitting.
    pub fitting: u64,
    /// Estimated and not fitting.
    pub not_fitting: u64,
    /// Proven not to fit without an estimate of their own (rules M1, M2, C).
    pub pruned: u64,
    /// Of which by rule C (a configuration below them in a chain does not fit).
    pub pruned_by_chain: u64,
    /// Skipped as dominated (when [`PlanRequest::skip_dominated`]): a configuration below them
    /// in a chain — so with at least as much headroom, by rule C — fits and is estimated to be
    /// at least as fast. They may or may not fit; either way they cannot improve the ranking's
    /// best or the frontier.
    pub dominated: u64,
    /// Rejected by the estimator's validation (inconsistent layout) or the cost model.
    pub invalid: u64,
    /// Calls of `estimate()`, probes included.
    pub estimate_calls: u64,
    /// Of which probes (the same configuration at accumulation 1).
    pub probe_calls: u64,
    pub done: bool,
    pub cancelled: bool,
}

/// What a settled configuration tells the configurations above it in a chain.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Outcome {
    /// It does not fit: neither does anything above it (rule C).
    NoFit,
    /// A listed plan with at least its headroom and at most this estimated step time (itself,
    /// or the plan that dominates it).
    Covered { step_s: f64 },
}

/// One group of the space: the knobs but the micro-batch, and its candidate micro-batches.
#[derive(Clone, Debug)]
struct Group {
    knobs: Knobs,
    /// Candidate (micro-batch, accumulation) pairs, micro-batch ascending.
    batches: Vec<(u64, u64)>,
    /// Why the whole group is invalid, when it is.
    invalid: bool,
}

/// A resumable search (see the module docs).
pub struct Search {
    req: PlanRequest,
    global_seqs: u64,
    hw: Hardware,
    fig: ModelFigures,
    groups: Vec<Group>,
    gi: usize,
    bi: usize,
    /// Smallest micro-batch proven not to fit at accumulation 1, per group.
    fail_from: HashMap<Knobs, u64>,
    /// What is known of each settled configuration, for the chains above it.
    outcomes: HashMap<Knobs, Outcome>,
    points: Vec<Point>,
    progress: Progress,
    scratch: Config,
}

impl Search {
    /// Lays out the space; no estimate runs yet.
    pub fn new(req: PlanRequest) -> Result<Search, PlanError> {
        req.space.check()?;
        let global_seqs = req.global_batch.sequences(req.base.seq)?;
        let hw = cost::hardware(&req.base)?;
        let fig = ModelFigures::of(&req.base.arch);
        let groups = enumerate(&req, global_seqs);
        let configurations = groups.iter().map(|g| g.batches.len().max(1) as u64).sum();
        let scratch = req.base.clone();
        Ok(Search {
            req,
            global_seqs,
            hw,
            fig,
            groups,
            gi: 0,
            bi: 0,
            fail_from: HashMap::new(),
            outcomes: HashMap::new(),
            points: Vec::new(),
            progress: Progress { configurations, ..Progress::default() },
            scratch,
        })
    }

    /// The request.
    pub fn request(&self) -> &PlanRequest {
        &self.req
    }

    /// Sequences per optimizer step.
    pub fn global_sequences(&self) -> u64 {
        self.global_seqs
    }

    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// Stops the search; [`Search::result`] ranks what was found.
    pub fn cancel(&mut self) {
        if !self.progress.done {
            self.progress.cancelled = true;
            self.progress.done = true;
        }
    }

    /// Runs at most `max_estimates` calls of `estimate()` (at least one configuration is settled
    /// per call of `step` while any remain).
    pub fn step(&mut self, max_estimates: u64) -> Progress {
        let budget_end = self.progress.estimate_calls + max_estimates.max(1);
        while !self.progress.done && self.progress.estimate_calls < budget_end {
            if self.gi >= self.groups.len() {
                self.progress.done = true;
                break;
            }
            self.advance();
        }
        self.progress
    }

    /// Runs the whole search.
    pub fn run(mut self) -> PlanResult {
        while !self.progress.done {
            self.step(u64::MAX);
        }
        self.result()
    }

    /// Settles the next configuration (or the rest of a group).
    fn advance(&mut self) {
        let g = &self.groups[self.gi];
        if g.invalid || g.batches.is_empty() {
            self.progress.invalid += g.batches.len().max(1) as u64;
            self.progress.settled += g.batches.len().max(1) as u64;
            self.next_group();
            return;
        }
        let knobs = g.knobs;
        let (b, accum) = g.batches[self.bi];
        // Rule C: a group below this one in a chain failed at accumulation 1 from some
        // micro-batch on; this group's memory is at least as large.
        let inherited = self.inherited_fail_from(&knobs);
        if inherited.is_some_and(|f| b >= f) {
            self.fail_rest_of_group(knobs, b, true);
            return;
        }
        let k = Knobs { batch: b, accum, ..knobs };
        k.apply_to(&mut self.scratch);
        // Rule C at this very point: what is known of the configurations below it.
        let mut cover: Option<f64> = None;
        for knob in CHAIN_KNOBS {
            for below in chain_below(knob, &k, self.req.base.seq).into_iter().flatten() {
                match self.outcomes.get(&below) {
                    Some(Outcome::NoFit) => {
                        self.outcomes.insert(k, Outcome::NoFit);
                        self.progress.pruned += 1;
                        self.progress.pruned_by_chain += 1;
                        self.progress.settled += 1;
                        self.next_batch();
                        return;
                    }
                    Some(Outcome::Covered { step_s }) => cover = Some(cover.map_or(*step_s, |c: f64| c.min(*step_s))),
                    None => {}
                }
            }
        }
        if let (true, Some(best)) = (self.req.skip_dominated, cover) {
            let mine = cost::step_cost_with(&self.scratch, &self.req.assumptions, &self.hw, &self.fig).map(|c| c.step_s);
            if mine.is_ok_and(|t| best <= t) {
                self.outcomes.insert(k, Outcome::Covered { step_s: best });
                self.progress.dominated += 1;
                self.progress.settled += 1;
                self.next_batch();
                return;
            }
        }
        self.progress.estimate_calls += 1;
        let e = match estimate(&self.scratch) {
            Ok(e) => e,
            Err(_) => {
                self.progress.invalid += 1;
                self.progress.settled += 1;
                self.next_batch();
                return;
            }
        };
        if peak_fits(&e) {
            match cost::step_cost_with(&self.scratch, &self.req.assumptions, &self.hw, &self.fig) {
                Ok(c) => {
                    self.outcomes.insert(k, Outcome::Covered { step_s: c.step_s });
                    self.points.push(Point {
                        knobs: k,
                        memory: e.memory.peak,
                        headroom: e.capacity as i128 - e.memory.peak as i128,
                        step_s: c.step_s,
                        tokens_per_s: c.tokens_per_s,
                        mfu: c.mfu,
                    });
                    self.progress.fitting += 1;
                }
                Err(_) => self.progress.invalid += 1,
            }
            self.progress.settled += 1;
            self.next_batch();
            return;
        }
        self.outcomes.insert(k, Outcome::NoFit);
        self.progress.not_fitting += 1;
        self.progress.settled += 1;
        // The probe: the same configuration at accumulation 1 (rules M1, M2).
        let probe_fails = if accum == 1 {
            true
        } else {
            self.scratch.accum = 1;
            self.progress.estimate_calls += 1;
            self.progress.probe_calls += 1;
            estimate(&self.scratch).map(|p| !peak_fits(&p)).unwrap_or(false)
        };
        if probe_fails {
            // Everything from the next micro-batch on is proven not to fit.
            self.bi += 1;
            self.fail_rest_of_group(knobs, b, false);
        } else {
            self.next_batch();
        }
    }

    /// Records that `group` fails from micro-batch `b` on and settles the rest of it as pruned.
    fn fail_rest_of_group(&mut self, group: Knobs, b: u64, include_current: bool) {
        let entry = self.fail_from.entry(group).or_insert(b);
        *entry = (*entry).min(b);
        let g = &self.groups[self.gi];
        let from = if include_current { self.bi } else { self.bi.min(g.batches.len()) };
        let rest = (g.batches.len() - from) as u64;
        self.progress.pruned += rest;
        if include_current {
            self.progress.pruned_by_chain += rest;
        }
        self.progress.settled += rest;
        self.next_group();
    }

    fn inherited_fail_from(&mut self, g: &Knobs) -> Option<u64> {
        let mut best: Option<u64> = self.fail_from.get(g).copied();
        for knob in CHAIN_KNOBS {
            for below in chain_below(knob, g, self.req.base.seq).into_iter().flatten() {
                if let Some(&f) = self.fail_from.get(&below) {
                    best = Some(best.map_or(f, |x| x.min(f)));
                }
            }
        }
        if let Some(f) = best {
            // Remember it for the groups above this one.
            let e = self.fail_from.entry(*g).or_insert(f);
            *e = (*e).min(f);
        }
        best
    }

    fn next_batch(&mut self) {
        self.bi += 1;
        if self.bi >= self.groups[self.gi].batches.len() {
            self.next_group();
        }
    }

    fn next_group(&mut self) {
        self.gi += 1;
        self.bi = 0;
        if self.gi >= self.groups.len() {
            self.progress.done = true;
        }
    }

    /// Every fitting configuration found so far, in search order.
    pub fn points(&self) -> &[Point] {
        &self.points
    }

    /// The ranked plans and the frontier of what was found so far.
    pub fn result(&self) -> PlanResult {
        let mut ranked: Vec<Point> = self.points.clone();
        ranked.sort_by(rank_order);
        let keep = if self.req.keep == 0 { ranked.len() } else { self.req.keep.min(ranked.len()) };
        // The search decides on the step's peak in use (fast, and necessary); each plan it lists
        // is decided again by the verdict itself ([`analyse`]: nvidia-smi against the usable
        // capacity), with the headroom that verdict gives. One that no longer fits is left out
        // and counted.
        let mut decided: HashMap<Knobs, Option<Plan>> = HashMap::new();
        let decide =
            |decided: &mut HashMap<Knobs, Option<Plan>>, p: &Point| decided.entry(p.knobs).or_insert_with(|| self.plan_of(p)).clone();
        let mut plans: Vec<Plan> = Vec::with_capacity(keep);
        let mut dropped_by_reserve = 0u64;
        for p in &ranked {
            if plans.len() >= keep {
                break;
            }
            match decide(&mut decided, p) {
                Some(pl) => plans.push(pl),
                None => dropped_by_reserve += 1,
            }
        }
        plans.sort_by(|x, y| x.step_s.total_cmp(&y.step_s).then(y.headroom.cmp(&x.headroom)));
        for (i, pl) in plans.iter_mut().enumerate() {
            pl.rank = i + 1;
        }
        // The frontier on the decided headroom: the points' peak headroom is an upper bound of
        // it, so the frontier of the points decided so far (and of the others' bounds) is
        // decided point by point until every point on it is decided.
        let frontier = loop {
            let bounds: Vec<Point> = ranked
                .iter()
                .filter_map(|p| match decided.get(&p.knobs) {
                    Some(Some(pl)) => Some(Point { headroom: pl.headroom, memory: pl.memory, ..*p }),
                    Some(None) => None,
                    None => Some(*p),
                })
                .collect();
            let mut sorted = bounds;
            sorted.sort_by(rank_order);
            let front = pareto_frontier(&sorted);
            let undecided: Vec<Point> = front.iter().filter(|p| !decided.contains_key(&p.knobs)).copied().collect();
            if undecided.is_empty() {
                break front.iter().filter_map(|p| decided.get(&p.knobs).cloned().flatten()).collect::<Vec<Plan>>();
            }
            for p in &undecided {
                let pl = decide(&mut decided, p);
                if pl.is_none() {
                    dropped_by_reserve += 1;
                }
            }
        };
        let frontier: Vec<Plan> = frontier
            .into_iter()
            .map(|mut f| {
                f.rank = plans.iter().find(|q| q.knobs == f.knobs).map_or(0, |q| q.rank);
                f
            })
            .collect();
        let explanation = plans.first().map(|top| explain_choice(&self.req, self.global_seqs, &top.knobs)).unwrap_or_default();
        PlanResult {
            dropped_by_reserve,
            label: cost::ESTIMATE_LABEL,
            global_sequences: self.global_seqs,
            global_tokens: self.global_seqs * self.req.base.seq,
            progress: self.progress,
            pruning_rules: PRUNING_RULES.to_vec(),
            plans,
            frontier,
            explanation,
            assumptions: cost::assumptions(&self.space_base(), &self.req.assumptions, &self.hw),
        }
    }

    /// The base as the result's assumptions describe it: with `compile` on when the space
    /// compiles at all (so the compile speed-up the plans rest on is listed).
    fn space_base(&self) -> Config {
        let mut b = self.req.base.clone();
        b.compile = b.compile || self.req.space.compile.contains(&true);
        b
    }

    /// A point decided by the verdict ([`analyse`]): its plan, with the deciding figure as its
    /// memory and the verdict's headroom, or `None` when it does not fit after all.
    fn plan_of(&self, p: &Point) -> Option<Plan> {
        let config = p.knobs.apply(&self.req.base);
        let a = analyse(&config).ok()?;
        if !a.verdict.fits {
            return None;
        }
        let cost = cost::step_cost(&config, &self.req.assumptions).ok();
        let by_cat = by_category(&a.estimate).into_iter().map(|(c, b)| (c.label(), b)).collect();
        Some(Plan {
            rank: 0,
            knobs: p.knobs,
            memory: a.verdict.deciding,
            headroom: a.verdict.headroom,
            capacity: a.verdict.capacity,
            step_s: p.step_s,
            tokens_per_s: p.tokens_per_s,
            mfu: p.mfu,
            memory_by_category: by_cat,
            nvidia_smi: a.estimate.memory.nvidia_smi,
            fits_with_reserve: true,
            cost,
            config,
        })
    }
}

/// The pruning rules, as the result lists them.
pub const PRUNING_RULES: [&str; 4] = [
    "M1: with all else fixed, memory never decreases as the micro-batch grows",
    "M2: with all else fixed, memory never decreases as gradient accumulation grows",
    "C: memory never increases down ZeRO 0→1, HYBRID_SHARD→FULL_SHARD, offload none→optimizer→optimizer+params, attention eager→sdpa=flash (from 2,048 tokens)",
    "D: a configuration is dominated when the one below it in a chain fits and is estimated to be at least as fast (it has at least as much headroom by C)",
];

/// Fastest first; equal times, more headroom first.
fn rank_order(a: &Point, b: &Point) -> std::cmp::Ordering {
    a.step_s.total_cmp(&b.step_s).then(b.headroom.cmp(&a.headroom))
}

/// The points no other point beats on both step time (lower) and headroom (higher), fastest
/// first. `ranked` must be in [`rank_order`].
pub fn pareto_frontier(ranked: &[Point]) -> Vec<Point> {
    let mut out: Vec<Point> = Vec::new();
    let mut best_headroom = i128::MIN;
    for p in ranked {
        if p.headroom > best_headroom {
            out.push(*p);
            best_headroom = p.headroom;
        }
    }
    out
}

/// Every group of the request's space, chain neighbours first (see [`zero_order`]).
fn enumerate(req: &PlanRequest, global_seqs: u64) -> Vec<Group> {
    let s = &req.space;
    let base = &req.base;
    let zero = sorted_dedup(&s.zero, zero_order);
    let offload = sorted_dedup(&s.offload, offload_order);
    let recompute = sorted_dedup(&s.recompute, recompute_order);
    let attn = sorted_dedup(&s.attn, attn_order);
    let sp = sorted_dedup(&s.sp, |v| if v { 0 } else { 1 });
    let optim = sorted_dedup(&s.optim, |o| o as u8);
    let optim_impl = sorted_dedup(&s.optim_impl, |o| o as u8);
    let finetune = sorted_dedup(&s.finetune, |f| f as u8);
    let recipes = recipe_combinations(s);
    let (tps, pps, vpps, cps, eps) = (dedup_u64(&s.tp), dedup_u64(&s.pp), dedup_u64(&s.vpp), dedup_u64(&s.cp), dedup_u64(&s.ep));
    let mut out = Vec::new();
    for &tp in &tps {
        for &pp in &pps {
            for &vpp in &vpps {
                for &cp in &cps {
                    for &ep in &eps {
                        let probe = Knobs {
                            batch: 1,
                            accum: 1,
                            zero: base.zero,
                            recompute: base.recompute,
                            attn: base.attn,
                            optim: base.optim,
                            optim_impl: base.optim_impl,
                            offload: base.offload,
                            tp,
                            pp,
                            vpp,
                            cp,
                            ep,
                            sp: false,
                            finetune: base.finetune,
                            compile: base.compile,
                            recompute_every: base.recompute_every,
                            recompute_layers: base.recompute_layers,
                            act_offload: base.act_offload,
                            act_offload_layers: base.act_offload_layers,
                        };
                        let dp = probe.dp(base.gpus);
                        let layout_ok = dp > 0 && validate(&Knobs { zero: Zero::Ddp, offload: Offload::None, ..probe }.apply(base)).is_ok();
                        let batches = if layout_ok { micro_batches(&s.batch, global_seqs, dp) } else { Vec::new() };
                        // With one data-parallel rank every ZeRO stage is the same configuration:
                        // keep one (the most sharded when parameter offload, which needs it, is
                        // allowed; else the least).
                        let zero_here: Vec<Zero> = if dp == 1 && zero.len() > 1 {
                            let pick = if offload.contains(&Offload::OptimizerParams) { zero.first() } else { zero.last() };
                            pick.copied().into_iter().collect()
                        } else {
                            zero.clone()
                        };
                        for &ft in &finetune {
                            for &o in &optim {
                                for &oi in &optim_impl {
                                    for &sp in &sp {
                                        if sp && tp == 1 {
                                            continue; // the same configuration as sp off
                                        }
                                        for &a in &attn {
                                            for (&r, &(compile, every, block, act_offload, act_layers)) in
                                                recompute.iter().flat_map(|r| recipes.iter().map(move |x| (r, x)))
                                            {
                                                if !every_is_its_own_plan(every, r) {
                                                    continue;
                                                }
                                                if !block_is_its_own_plan(block, r, base.arch.layers, pp, vpp) {
                                                    continue;
                                                }
                                                for &off in &offload {
                                                    for &z in &zero_here {
                                                        if z == Zero::HybridShard && base.gpus_per_node >= dp {
                                                            continue; // one group: FULL_SHARD
                                                        }
                                                        let knobs = Knobs {
                                                            batch: 0,
                                                            accum: 0,
                                                            zero: z,
                                                            recompute: r,
                                                            attn: a,
                                                            optim: o,
                                                            optim_impl: oi,
                                                            offload: off,
                                                            tp,
                                                            pp,
                                                            vpp,
                                                            cp,
                                                            ep,
                                                            sp,
                                                            finetune: ft,
                                                            compile,
                                                            recompute_every: every,
                                                            recompute_layers: block,
                                                            act_offload,
                                                            act_offload_layers: act_layers,
                                                        };
                                                        let invalid = !layout_ok
                                                            || batches.is_empty()
                                                            || validate(
                                                                &Knobs { batch: batches[0].0, accum: batches[0].1, ..knobs }.apply(base),
                                                            )
                                                            .is_err();
                                                        out.push(Group { knobs, batches: batches.clone(), invalid });
                                                    }
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Every combination of the recipe knobs (`compile`, `recompute_every`, `recompute_layers`,
/// `act_offload`, `act_offload_layers`) the space allows, the configured-off values first. None
/// of them is a memory chain: compiling can keep more (a region's saved inputs) or less, the
/// block method's layers are searched beside full recomputation rather than ordered against it,
/// and offloading moves memory to the host at a time cost the search does not prove monotone.
fn recipe_combinations(s: &Space) -> Vec<(bool, u64, u64, ActOffload, u64)> {
    let compile = sorted_dedup(&s.compile, |v| v as u8);
    let every = dedup_u64(&s.recompute_every);
    let block = dedup_u64(&s.recompute_layers);
    let act = sorted_dedup(&s.act_offload, |a| a as u8);
    let layers = dedup_u64(&s.act_offload_layers);
    let mut out = Vec::with_capacity(compile.len() * every.len() * block.len() * act.len() * layers.len());
    for &c in &compile {
        for &e in &every {
            for &b in &block {
                for &a in &act {
                    for &l in &layers {
                        out.push((c, e, b, a, l));
                    }
                }
            }
        }
    }
    out
}

/// Whether `recompute_every = n` under `recompute` is a plan of its own: 0 always; every Nth
/// layer checkpointed whole only where `recompute` does not checkpoint every layer already
/// (under full recomputation it is the plan with 0).
fn every_is_its_own_plan(n: u64, recompute: Recompute) -> bool {
    n == 0 || recompute != Recompute::Full
}

/// Whether `recompute_layers = n` under `recompute` on a model of `layers` split over `pp` ×
/// `vpp` is a plan of its own: 0 always; a count only under full recomputation (the block picks
/// among the layers it recomputes) and below a virtual stage's layers (at or above them it is
/// full recomputation of every layer, the plan with 0).
fn block_is_its_own_plan(n: u64, recompute: Recompute, layers: u64, pp: u64, vpp: u64) -> bool {
    n == 0 || (recompute == Recompute::Full && n < virtual_stage_layers(layers, pp, vpp))
}

/// The block-method layer counts the default space tries on Megatron (`recompute_layers`, with
/// full recomputation): every layer (0), and the first half and the first quarter of the
/// model's layers — of each stage, so on pipeline stages of fewer layers the half may be all
/// of them (then skipped as the same plan as 0) — and the base's own count where it sets one.
/// Off Megatron, 0 only (the key is Megatron's). Toy: 32 layers → 0, 16, 8; with
/// `recompute_layers = 4` set, 0, 16, 8, 4.
pub fn block_method_tries(base: &Config) -> Vec<u64> {
    if base.framework != Framework::Megatron {
        return vec![0];
    }
    let half = half_the_layers(base.arch.layers);
    let mut out = vec![0];
    for n in [half, half_the_layers(half), base.recompute_layers] {
        if n > 0 && !out.contains(&n) {
            out.push(n);
        }
    }
    out
}

/// The (micro-batch, accumulation) pairs that make `global_seqs` sequences on `dp` replicas:
/// `b · accum · dp = G`, `b` from `allowed` (or every divisor up to [`MAX_MICRO_BATCH`]).
pub fn micro_batches(allowed: &[u64], global_seqs: u64, dp: u64) -> Vec<(u64, u64)> {
    if dp == 0 || !global_seqs.is_multiple_of(dp) {
        return Vec::new();
    }
    let per_replica = global_seqs / dp;
    let mut bs: Vec<u64> = if allowed.is_empty() {
        (1..=MAX_MICRO_BATCH.min(per_replica)).filter(|b| per_replica.is_multiple_of(*b)).collect()
    } else {
        allowed.iter().copied().filter(|&b| b > 0 && per_replica.is_multiple_of(b)).collect()
    };
    bs.sort_unstable();
    bs.dedup();
    bs.into_iter().map(|b| (b, per_replica / b)).collect()
}

/// One ranked plan: its configuration (the share link is `config::encode_query(&plan.config)`),
/// its memory and its estimated cost.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// 1 = fastest estimated step.
    pub rank: usize,
    pub knobs: Knobs,
    /// Memory by [`measure`], bytes.
    pub memory: Bytes,
    pub headroom: i128,
    pub capacity: Bytes,
    /// Estimated step time, seconds.
    pub step_s: f64,
    pub tokens_per_s: f64,
    pub mfu: f64,
    /// The ledger's category totals (what the explanation compares).
    pub memory_by_category: Vec<(&'static str, Bytes)>,
    /// What nvidia-smi will show: the step replayed through the caching allocator (`None` under
    /// a `frag_pct` override or `kernels=cpu`).
    pub nvidia_smi: Option<Bytes>,
    /// Whether the plan fits by the verdict's own figure (nvidia-smi where simulated).
    pub fits_with_reserve: bool,
    /// The estimated step in full (FLOPs, each transfer, bubble, optimizer, assumptions).
    pub cost: Option<StepCost>,
    pub config: Config,
}

/// What the planner returns.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanResult {
    /// Plans the search found fitting by the allocated peak that the caching allocator's
    /// reserve pushes over the card (left out of `plans`).
    pub dropped_by_reserve: u64,
    /// What the step times are: [`cost::ESTIMATE_LABEL`].
    pub label: &'static str,
    pub global_sequences: u64,
    pub global_tokens: u64,
    pub progress: Progress,
    pub pruning_rules: Vec<&'static str>,
    /// Fastest first, at most `keep`.
    pub plans: Vec<Plan>,
    /// Headroom against step time: no plan of the space beats one of these on both.
    pub frontier: Vec<Plan>,
    /// Why the top plan sets each knob where it does.
    pub explanation: Vec<Reason>,
    pub assumptions: Vec<Assumption>,
}

/// The benchmark's request (`cargo bench --bench plan` natively, the page's test hook in the
/// browser: the same space on both): Llama-3.1-8B on 64 H100s at 4k tokens, 1,024 sequences
/// per step, with every sharding, recomputation, attention, optimizer, offload and layout knob
/// open — about 10⁵ configurations.
pub fn benchmark_request() -> PlanRequest {
    let arch = super::presets::preset("llama-3.1-8b").map(|p| p.spec).unwrap_or_else(|| Config::default().arch);
    let base = Config { model: "llama-3.1-8b".into(), arch, gpus: 64, seq: 4096, ..Config::default() };
    let space = Space {
        batch: Vec::new(),
        zero: vec![Zero::Ddp, Zero::Z1, Zero::Z2, Zero::Z3, Zero::HybridShard],
        recompute: vec![Recompute::None, Recompute::Selective, Recompute::Full],
        attn: vec![Attention::Eager, Attention::Sdpa, Attention::Flash],
        optim: vec![Optimizer::Adamw, Optimizer::Adam8bit],
        optim_impl: vec![OptimImpl::Fused, OptimImpl::Foreach],
        offload: vec![Offload::None, Offload::Optimizer, Offload::OptimizerParams],
        tp: vec![1, 2, 4, 8],
        pp: vec![1, 2, 4],
        vpp: vec![1],
        cp: vec![1, 2],
        ep: vec![1],
        sp: vec![false, true],
        finetune: vec![Finetune::Full],
        // The recipe knobs stay off: the benchmark's space is the one its history measured.
        compile: vec![false],
        recompute_every: vec![0],
        recompute_layers: vec![0],
        act_offload: vec![ActOffload::None],
        act_offload_layers: vec![0],
    };
    PlanRequest {
        base,
        global_batch: GlobalBatch::Sequences(1024),
        space,
        assumptions: Assumptions::default(),
        keep: DEFAULT_KEEP,
        skip_dominated: true,
    }
}

/// Runs a whole search.
pub fn plan(req: PlanRequest) -> Result<PlanResult, PlanError> {
    Ok(Search::new(req)?.run())
}

/// The knobs [`widen`] opens when nothing in a space fits, in this order: each takes memory off
/// the GPU and still trains every parameter, at a cost in step time or in the optimizer states'
/// precision — the optimizer states (and parameters) moved to the host, activations moved to
/// pinned host memory, Adam's states in 8 bits. LoRA and QLoRA would fit more, but train
/// something else: they are left to the user ([`Space::opened`] with `finetune`).
pub const WIDENINGS: [&str; 3] = ["offload", "act_offload", "optim"];

/// The space's keys a knob of [`WIDENINGS`] opens ([`Space::opened`]): itself and the key it
/// comes with (activation offloading's layer count, the optimizer's implementation).
pub fn widening_keys(knob: &str) -> &'static [&'static str] {
    match knob {
        "offload" => &["offload"],
        "act_offload" => &["act_offload", "act_offload_layers"],
        "optim" => &["optim", "optim_impl"],
        _ => &[],
    }
}

/// What a search that found nothing finds once the knobs of [`WIDENINGS`] it left closed are
/// opened, all at once: the knobs opened (in their order), the wider request and its result.
#[derive(Clone, Debug)]
pub struct Widened {
    pub knobs: Vec<&'static str>,
    pub request: PlanRequest,
    pub result: PlanResult,
}

impl Widened {
    /// Each key the knobs opened ([`widening_keys`]) that tries more than one value, with those
    /// values as the URL and the CLI's `--try-KEY` spell them: the JSON's `opened`, the CLI's
    /// flags that reproduce the search.
    pub fn opened(&self) -> Vec<(&'static str, Vec<String>)> {
        self.knobs
            .iter()
            .flat_map(|k| widening_keys(k).iter().copied())
            .filter_map(|key| self.request.space.spelled(key).filter(|v| v.len() > 1).map(|values| (key, values)))
            .collect()
    }
}

/// The search of `req` with the [`WIDENINGS`] its space left closed opened ([`Widened`]), for
/// when `req`'s own search found nothing; `None` where every one of them is open already (a
/// knob is open where it, or the key it comes with — `act_offload_layers`, `optim_impl` —,
/// tries more than one value). Toy: Llama 3.1 70B in full on 8 H100s at 8K tokens, 8 sequences
/// a step, fits nowhere in the default space (141 GB of sharded weights, gradients and states a
/// GPU before activations); with the optimizer offloaded it does.
pub fn widen(req: &PlanRequest) -> Result<Option<Widened>, PlanError> {
    let open = |key: &str| req.space.tried(key).is_some_and(|n| n > 1);
    let knobs: Vec<&'static str> = WIDENINGS.into_iter().filter(|&k| !widening_keys(k).iter().any(|key| open(key))).collect();
    if knobs.is_empty() {
        return Ok(None);
    }
    let mut wider = req.clone();
    wider.space = knobs.iter().fold(req.space.clone(), |s, k| s.opened(&req.base, k));
    let result = plan(wider.clone())?;
    Ok(Some(Widened { knobs, request: wider, result }))
}

// ---------------------------------------------------------------------------------------------
// Explain the choice
// ---------------------------------------------------------------------------------------------

/// Why one knob of the top plan is set where it is.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Reason {
    /// The configuration key (`zero`, `recompute`, `batch`, …).
    pub key: &'static str,
    /// The plan's value, as the URL spells it.
    pub value: String,
    /// The alternative it is compared with, if the space had one.
    pub alternative: Option<String>,
    pub sentence: String,
}

/// The knob values of `k` as the URL writes them.
fn knob_value(key: &str, k: &Knobs) -> String {
    match key {
        "batch" => k.batch.to_string(),
        "accum" => k.accum.to_string(),
        "zero" => k.zero.name().to_string(),
        "recompute" => k.recompute.name().to_string(),
        "attn" => k.attn.name().to_string(),
        "optim" => k.optim.name().to_string(),
        "optim_impl" => k.optim_impl.name().to_string(),
        "offload" => k.offload.name().to_string(),
        "tp" => k.tp.to_string(),
        "pp" => k.pp.to_string(),
        "vpp" => k.vpp.to_string(),
        "cp" => k.cp.to_string(),
        "ep" => k.ep.to_string(),
        "sp" => k.sp.to_string(),
        "finetune" => k.finetune.name().to_string(),
        "compile" => k.compile.to_string(),
        "recompute_every" => k.recompute_every.to_string(),
        "recompute_layers" => k.recompute_layers.to_string(),
        "act_offload" => k.act_offload.name().to_string(),
        "act_offload_layers" => k.act_offload_layers.to_string(),
        _ => String::new(),
    }
}

/// How a reader names a knob value ("ZeRO-3", "selective recompute").
fn describe(key: &str, k: &Knobs) -> String {
    match key {
        "batch" => format!("micro-batch {} × {} accumulation steps", k.batch, k.accum),
        "zero" => match k.zero {
            Zero::Ddp => "DDP (no sharding)".into(),
            Zero::Z1 => "ZeRO-1".into(),
            Zero::Z2 => "ZeRO-2".into(),
            Zero::Z3 => "ZeRO-3".into(),
            Zero::FullShard => "FSDP FULL_SHARD".into(),
            Zero::ShardGradOp => "FSDP SHARD_GRAD_OP".into(),
            Zero::HybridShard => "FSDP HYBRID_SHARD".into(),
        },
        "recompute" => match k.recompute {
            Recompute::None => "no recomputation".into(),
            Recompute::Selective => "selective recompute".into(),
            Recompute::Full => "full recompute".into(),
            Recompute::Op => "op-level selective checkpointing".into(),
        },
        "attn" => format!("{} attention", k.attn.name()),
        "offload" => match k.offload {
            Offload::None => "no offload".into(),
            Offload::Optimizer => "optimizer offload".into(),
            Offload::OptimizerParams => "optimizer and parameter offload".into(),
        },
        "sp" => {
            if k.sp {
                "sequence parallelism".into()
            } else {
                "no sequence parallelism".into()
            }
        }
        "tp" => format!("tensor parallelism {}", k.tp),
        "pp" => format!("pipeline parallelism {}", k.pp),
        "vpp" => format!("{} virtual stage{}", k.vpp, if k.vpp == 1 { "" } else { "s" }),
        "cp" => format!("context parallelism {}", k.cp),
        "ep" => format!("expert parallelism {}", k.ep),
        "optim" => match k.optim {
            Optimizer::Sgd => "SGD",
            Optimizer::Momentum => "SGD with momentum",
            Optimizer::Adamw => "AdamW",
            Optimizer::Adafactor => "Adafactor",
            Optimizer::Lion => "Lion",
            Optimizer::Adam8bit => "8-bit Adam",
            Optimizer::Muon => "Muon",
        }
        .into(),
        "optim_impl" => format!("{} optimizer step", k.optim_impl.name()),
        "finetune" => match k.finetune {
            Finetune::Full => "full fine-tuning",
            Finetune::Lora => "LoRA",
            Finetune::Qlora => "QLoRA",
        }
        .into(),
        "compile" => {
            if k.compile {
                "torch.compile".into()
            } else {
                "no torch.compile".into()
            }
        }
        "recompute_every" => match k.recompute_every {
            0 => "no every-Nth-layer checkpointing".into(),
            1 => "every layer fully checkpointed".into(),
            n => format!("every {} layer fully checkpointed", ordinal(n)),
        },
        "recompute_layers" => match k.recompute_layers {
            0 if k.recompute == Recompute::Full => "full recomputation of every layer".into(),
            0 => "no block recomputation".into(),
            1 => "full recomputation of the first layer of each pipeline stage".into(),
            n => format!("full recomputation of the first {n} layers of each pipeline stage"),
        },
        "act_offload" => match k.act_offload {
            ActOffload::None => "no activation offloading".into(),
            ActOffload::Torchtune => "torchtune's activation offloading".into(),
            ActOffload::SaveOnCpu => "save_on_cpu activation offloading".into(),
        },
        "act_offload_layers" => match k.act_offload_layers {
            0 => "no per-layer offloading".into(),
            1 => "the first layer's activations offloaded".into(),
            n => format!("the first {n} layers' activations offloaded"),
        },
        _ => String::new(),
    }
}

/// An English ordinal: 2nd, 3rd, 4th, 11th, 21st.
fn ordinal(n: u64) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, x) if x != 11 => "st",
        (2, x) if x != 12 => "nd",
        (3, x) if x != 13 => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// The alternatives of one knob the space allows (keeping the global batch).
fn alternatives(key: &'static str, req: &PlanRequest, global_seqs: u64, k: &Knobs) -> Vec<Knobs> {
    let s = &req.space;
    let with = |f: &dyn Fn(&mut Knobs)| {
        let mut x = *k;
        f(&mut x);
        x
    };
    let rebatch = |mut x: Knobs| -> Option<Knobs> {
        // A layout change moves the data-parallel degree: keep the micro-batch if it still
        // divides the global batch, else the nearest smaller one that does.
        let dp = x.dp(req.base.gpus);
        let pairs = micro_batches(&s.batch, global_seqs, dp);
        let (b, a) = pairs.iter().rev().find(|(b, _)| *b <= k.batch).or(pairs.first()).copied()?;
        x.batch = b;
        x.accum = a;
        Some(x)
    };
    let out: Vec<Knobs> = match key {
        "batch" => {
            let dp = k.dp(req.base.gpus);
            micro_batches(&s.batch, global_seqs, dp)
                .into_iter()
                .filter(|(b, _)| *b != k.batch)
                .map(|(b, a)| {
                    with(&|x| {
                        x.batch = b;
                        x.accum = a;
                    })
                })
                .collect()
        }
        "zero" => s.zero.iter().filter(|&&v| v != k.zero).map(|&v| with(&|x| x.zero = v)).collect(),
        "recompute" => s.recompute.iter().filter(|&&v| v != k.recompute).map(|&v| with(&|x| x.recompute = v)).collect(),
        "attn" => s.attn.iter().filter(|&&v| v != k.attn).map(|&v| with(&|x| x.attn = v)).collect(),
        "optim" => s.optim.iter().filter(|&&v| v != k.optim).map(|&v| with(&|x| x.optim = v)).collect(),
        "optim_impl" => s.optim_impl.iter().filter(|&&v| v != k.optim_impl).map(|&v| with(&|x| x.optim_impl = v)).collect(),
        "offload" => s.offload.iter().filter(|&&v| v != k.offload).map(|&v| with(&|x| x.offload = v)).collect(),
        "sp" => s.sp.iter().filter(|&&v| v != k.sp && k.tp > 1).map(|&v| with(&|x| x.sp = v)).collect(),
        "finetune" => s.finetune.iter().filter(|&&v| v != k.finetune).map(|&v| with(&|x| x.finetune = v)).collect(),
        "tp" => s.tp.iter().filter(|&&v| v != k.tp).filter_map(|&v| rebatch(with(&|x| x.tp = v))).collect(),
        "pp" => s.pp.iter().filter(|&&v| v != k.pp).filter_map(|&v| rebatch(with(&|x| x.pp = v))).collect(),
        "vpp" => s.vpp.iter().filter(|&&v| v != k.vpp).map(|&v| with(&|x| x.vpp = v)).collect(),
        "cp" => s.cp.iter().filter(|&&v| v != k.cp).filter_map(|&v| rebatch(with(&|x| x.cp = v))).collect(),
        "ep" => s.ep.iter().filter(|&&v| v != k.ep).map(|&v| with(&|x| x.ep = v)).collect(),
        "compile" => s.compile.iter().filter(|&&v| v != k.compile).map(|&v| with(&|x| x.compile = v)).collect(),
        "recompute_every" => s
            .recompute_every
            .iter()
            .filter(|&&v| v != k.recompute_every && every_is_its_own_plan(v, k.recompute))
            .map(|&v| with(&|x| x.recompute_every = v))
            .collect(),
        "recompute_layers" => s
            .recompute_layers
            .iter()
            .filter(|&&v| {
                v != k.recompute_layers
                    && k.recompute == Recompute::Full
                    && block_is_its_own_plan(v, k.recompute, req.base.arch.layers, k.pp, k.vpp)
            })
            .map(|&v| with(&|x| x.recompute_layers = v))
            .collect(),
        "act_offload" => s.act_offload.iter().filter(|&&v| v != k.act_offload).map(|&v| with(&|x| x.act_offload = v)).collect(),
        "act_offload_layers" => {
            s.act_offload_layers.iter().filter(|&&v| v != k.act_offload_layers).map(|&v| with(&|x| x.act_offload_layers = v)).collect()
        }
        _ => Vec::new(),
    };
    out.into_iter().filter(|x| !(x.sp && x.tp == 1)).collect()
}

/// Every knob the explanation covers, in the order it reads.
pub const EXPLAINED_KEYS: [&str; 19] = [
    "zero",
    "recompute",
    "recompute_every",
    "recompute_layers",
    "compile",
    "tp",
    "sp",
    "pp",
    "vpp",
    "cp",
    "ep",
    "batch",
    "offload",
    "act_offload",
    "act_offload_layers",
    "attn",
    "optim",
    "optim_impl",
    "finetune",
];

/// One sentence per knob of `top`: compared with the alternative the space offers that would be
/// faster (and does not fit), or, when none is faster, with the fastest one that is slower.
pub fn explain_choice(req: &PlanRequest, global_seqs: u64, top: &Knobs) -> Vec<Reason> {
    let a = &req.assumptions;
    let unit = req.base.unit;
    let chosen_cfg = top.apply(&req.base);
    let (Ok(chosen), Ok(chosen_cost)) = (analyse(&chosen_cfg), cost::step_cost(&chosen_cfg, a)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for key in EXPLAINED_KEYS {
        let alts = alternatives(key, req, global_seqs, top);
        let value = knob_value(key, top);
        if alts.is_empty() {
            if key == "batch" || key == "zero" || key == "recompute" {
                out.push(Reason {
                    key,
                    value,
                    alternative: None,
                    sentence: format!("{}: the only value the search allows.", describe(key, top)),
                });
            }
            continue;
        }
        // Evaluate every alternative.
        let mut evaluated: Vec<(Knobs, Analysis, StepCost)> = alts
            .iter()
            .filter_map(|k| {
                let c = k.apply(&req.base);
                Some((*k, analyse(&c).ok()?, cost::step_cost(&c, a).ok()?))
            })
            .collect();
        if evaluated.is_empty() {
            continue;
        }
        evaluated.sort_by(|x, y| x.2.step_s.total_cmp(&y.2.step_s));
        let faster = evaluated.iter().find(|(_, e, c)| c.step_s < chosen_cost.step_s && !e.verdict.fits);
        let pick =
            faster.or_else(|| evaluated.iter().find(|(_, e, c)| c.step_s >= chosen_cost.step_s && e.verdict.fits)).or(evaluated.first());
        let Some((alt, alt_e, alt_c)) = pick else { continue };
        let sentence = compare_sentence(key, top, &chosen, &chosen_cost, alt, alt_e, alt_c, unit);
        out.push(Reason { key, value, alternative: Some(knob_value(key, alt)), sentence });
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn compare_sentence(
    key: &str,
    top: &Knobs,
    chosen: &Analysis,
    chosen_cost: &StepCost,
    alt: &Knobs,
    alt_e: &Analysis,
    alt_c: &StepCost,
    unit: super::config::Unit,
) -> String {
    let head = format!("{} instead of {}", describe(key, top), describe(key, alt));
    // The memory category that moves most between the alternative and the plan.
    let cats_chosen = by_category(&chosen.estimate);
    let cats_alt = by_category(&alt_e.estimate);
    let moved = cats_chosen
        .iter()
        .zip(&cats_alt)
        .map(|((c, x), (_, y))| (*c, *y, *x))
        .max_by_key(|(_, y, x)| (*y as i128 - *x as i128).unsigned_abs());
    let mem = match moved {
        Some((c, from, to)) if from != to => {
            let verb = if to < from { "drop" } else { "grow" };
            format!("{} {verb} from {} to {} per GPU", category_phrase(c), format_bytes(from, unit), format_bytes(to, unit))
        }
        _ => "memory is the same".into(),
    };
    let alt_name = describe(key, alt);
    let missing = format_bytes((-alt_e.verdict.headroom).max(0) as u128, unit);
    let slower = 100.0 * (alt_c.step_s - chosen_cost.step_s) / chosen_cost.step_s;
    if !alt_e.verdict.fits && alt_c.step_s < chosen_cost.step_s {
        let dt = 100.0 * (chosen_cost.step_s - alt_c.step_s) / alt_c.step_s;
        format!(
            "{head}: {mem}; {alt_name} does not fit (needs {missing} more); costs {} estimated step time{}.",
            signed_pct(dt),
            comm_delta(chosen_cost, alt_c)
        )
    } else if !alt_e.verdict.fits {
        format!("{head}: {mem}; {alt_name} does not fit (needs {missing} more).")
    } else if slower.abs() < SAME_TIME_PCT {
        let more = if alt_e.verdict.headroom > chosen.verdict.headroom { "more" } else { "less" };
        format!("{head}: {mem}; {alt_name} would be as fast by the estimate, with {more} headroom.")
    } else {
        format!("{head}: {mem}; {alt_name} would be {:.1} % slower by the estimate.", slower)
    }
}

/// Step times closer than this (percent) read as "as fast".
const SAME_TIME_PCT: f64 = 0.05;

fn category_phrase(c: Category) -> String {
    c.label().to_lowercase()
}

fn signed_pct(v: f64) -> String {
    if v.abs() < 0.05 {
        "±0 %".into()
    } else {
        format!("{:+.1} %", v)
    }
}

/// The transfers the plan has that the alternative has not (or larger ones), in words.
fn comm_delta(chosen: &StepCost, alt: &StepCost) -> String {
    let mut extra: Vec<(&str, f64)> = Vec::new();
    for t in &chosen.comm {
        let before: f64 = alt.comm.iter().filter(|u| u.id == t.id).map(|u| u.bytes).sum();
        if t.bytes > before * 1.001 {
            extra.push((t.label, t.bytes - before));
        }
    }
    extra.sort_by(|a, b| b.1.total_cmp(&a.1));
    match extra.first() {
        Some((label, bytes)) => {
            format!(" ({}: +{} per GPU per step)", lowercase_first(label), format_bytes(*bytes as u128, super::config::Unit::Gb))
        }
        None => String::new(),
    }
}

fn lowercase_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// The cheapest single changes that make a configuration fit
// ---------------------------------------------------------------------------------------------

/// One single change of a configuration and what it does.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fix {
    /// The key it changes and its new value, as the URL spells them.
    pub key: &'static str,
    pub value: String,
    /// "selective recompute", "ZeRO-3", …
    pub label: String,
    pub fits: bool,
    pub headroom: i128,
    /// Estimated step time change, percent.
    pub step_time_pct: f64,
    /// Executed FLOPs change per step, percent.
    pub flops_pct: f64,
    /// Whether the change alters what is trained (optimizer, fine-tuning method), not only how.
    pub changes_training: bool,
    /// "selective recompute: fits, +4.1 GB headroom, +0.9 % step FLOPs, +1.2 % est. step time".
    pub sentence: String,
    pub config: Config,
}

/// The single changes [`cheapest_fixes`] tries on `cfg`, each labelled and flagged when it
/// changes what is trained. Layout changes keep the global batch (accumulation absorbs the
/// data-parallel degree).
pub fn candidate_changes(cfg: &Config) -> Vec<(&'static str, String, String, bool, Config)> {
    let mut out: Vec<(&'static str, String, String, bool, Config)> = Vec::new();
    let mut push = |key: &'static str, value: String, label: String, training: bool, c: Config| {
        if c != *cfg {
            out.push((key, value, label, training, c));
        }
    };
    for r in [Recompute::Selective, Recompute::Op, Recompute::Full] {
        if recompute_order(r) < recompute_order(cfg.recompute)
            && (r != Recompute::Op || cfg.framework == crate::estimator::config::Framework::Hf)
        {
            let k = Knobs { recompute: r, ..Knobs::of(cfg) };
            push("recompute", r.name().into(), describe("recompute", &k), false, Config { recompute: r, ..cfg.clone() });
        }
    }
    if cfg.attn == Attention::Eager {
        push("attn", "sdpa".into(), "SDPA attention".into(), false, Config { attn: Attention::Sdpa, ..cfg.clone() });
    }
    // Issue 26's recipes, where the framework's code has them (the estimate refuses the rest,
    // which drops them): full checkpointing of every 2nd layer, torch.compile, activation
    // offloading (torchtune's hooks; Transformer Engine's per-layer context on Megatron).
    use crate::estimator::config::{ActOffload, CompileRegions, Framework};
    if cfg.recompute == Recompute::None && cfg.recompute_every == 0 && cfg.framework != Framework::Megatron {
        push(
            "recompute_every",
            EVERY_NTH_DEFAULT.to_string(),
            "full checkpointing of every 2nd layer".into(),
            false,
            Config { recompute_every: EVERY_NTH_DEFAULT, ..cfg.clone() },
        );
    }
    // Megatron's block method: half of each virtual stage's layers recomputed (less extra
    // forward than all of them), or all of them where it recomputes some.
    if cfg.framework == Framework::Megatron {
        let per_stage = virtual_stage_layers(cfg.arch.layers, cfg.pp, cfg.vpp);
        if matches!(cfg.recompute, Recompute::None | Recompute::Selective) && per_stage > 1 {
            let n = half_the_layers(per_stage);
            push(
                "recompute_layers",
                n.to_string(),
                format!("full recomputation of the first {n} layers of each pipeline stage (Megatron's block method)"),
                false,
                Config { recompute: Recompute::Full, recompute_layers: n, ..cfg.clone() },
            );
        }
        if cfg.recompute == Recompute::Full && cfg.recompute_layers > 0 {
            push(
                "recompute_layers",
                "0".into(),
                "full recomputation of every layer".into(),
                false,
                Config { recompute_layers: 0, ..cfg.clone() },
            );
        }
    }
    if !cfg.compile && cfg.framework != Framework::Megatron {
        let regions = if cfg.framework == Framework::Torchtitan { CompileRegions::Block } else { CompileRegions::Layer };
        push("compile", "true".into(), "torch.compile".into(), false, Config { compile: true, compile_regions: regions, ..cfg.clone() });
    }
    if !cfg.act_offload.on() && cfg.act_offload_layers == 0 {
        if matches!(cfg.framework, Framework::Hf | Framework::Torchtune) {
            push(
                "act_offload",
                "torchtune".into(),
                "activation offloading (torchtune)".into(),
                false,
                Config { act_offload: ActOffload::Torchtune, ..cfg.clone() },
            );
        }
        if cfg.framework == Framework::Megatron && cfg.arch.layers > 1 {
            let n = half_the_layers(cfg.arch.layers);
            push(
                "act_offload_layers",
                n.to_string(),
                format!("per-layer activation offloading of {n} layers (Megatron)"),
                false,
                Config { act_offload_layers: n, ..cfg.clone() },
            );
        }
    }
    if cfg.dp() > 1 {
        for z in [Zero::Z1, Zero::Z2, Zero::Z3] {
            if z.stage() > cfg.zero.stage() {
                let k = Knobs { zero: z, ..Knobs::of(cfg) };
                push("zero", z.name().into(), describe("zero", &k), false, Config { zero: z, ..cfg.clone() });
            }
        }
    }
    if cfg.offload == Offload::None {
        push("offload", "optimizer".into(), "optimizer offload".into(), false, Config { offload: Offload::Optimizer, ..cfg.clone() });
    }
    if cfg.offload != Offload::OptimizerParams && cfg.zero.stage() >= super::sharding::PARAMETERS_FROM {
        push(
            "offload",
            "optimizer+params".into(),
            "optimizer and parameter offload".into(),
            false,
            Config { offload: Offload::OptimizerParams, ..cfg.clone() },
        );
    }
    if cfg.optim_impl != OptimImpl::Fused {
        push("optim_impl", "fused".into(), "fused optimizer step".into(), false, Config { optim_impl: OptimImpl::Fused, ..cfg.clone() });
    }
    if cfg.loss == Loss::Standard {
        push("loss", "chunked".into(), "chunked cross-entropy".into(), false, Config { loss: Loss::Chunked, ..cfg.clone() });
    }
    if cfg.batch > 1 {
        // Half the micro-batch, twice the accumulation: the same tokens per step.
        let b = cfg.batch / 2;
        let accum = cfg.accum * cfg.batch / b.max(1);
        if b * accum == cfg.batch * cfg.accum {
            push(
                "batch",
                b.to_string(),
                format!("micro-batch {b} × {accum} accumulation"),
                false,
                Config { batch: b, accum, ..cfg.clone() },
            );
        }
    }
    if cfg.tp > 1 && !cfg.sp {
        push("sp", "true".into(), "sequence parallelism".into(), false, Config { sp: true, ..cfg.clone() });
    }
    // Model parallelism ×2 on the same GPUs: data parallelism halves, accumulation doubles.
    let dp = cfg.dp();
    if dp >= 2 && dp.is_multiple_of(2) {
        let twice = |c: Config| Config { accum: cfg.accum * 2, ..c };
        if cfg.arch.heads.is_multiple_of(cfg.tp * 2) && cfg.tp * 2 <= cfg.gpus_per_node.max(1) {
            push(
                "tp",
                (cfg.tp * 2).to_string(),
                format!("tensor parallelism {}", cfg.tp * 2),
                false,
                twice(Config { tp: cfg.tp * 2, ..cfg.clone() }),
            );
        }
        if cfg.pp * 2 <= cfg.arch.layers {
            push(
                "pp",
                (cfg.pp * 2).to_string(),
                format!("pipeline parallelism {}", cfg.pp * 2),
                false,
                twice(Config { pp: cfg.pp * 2, ..cfg.clone() }),
            );
        }
        if cfg.cp * 2 <= cfg.seq {
            push(
                "cp",
                (cfg.cp * 2).to_string(),
                format!("context parallelism {}", cfg.cp * 2),
                false,
                twice(Config { cp: cfg.cp * 2, ..cfg.clone() }),
            );
        }
    }
    if cfg.arch.experts > 0 && cfg.arch.experts.is_multiple_of(cfg.ep * 2) && dp.is_multiple_of(cfg.ep * 2) {
        push("ep", (cfg.ep * 2).to_string(), format!("expert parallelism {}", cfg.ep * 2), false, Config { ep: cfg.ep * 2, ..cfg.clone() });
    }
    // Changes to what is trained come last in the ranking.
    if cfg.optim == Optimizer::Adamw {
        push("optim", "adam8bit".into(), "8-bit Adam".into(), true, Config { optim: Optimizer::Adam8bit, ..cfg.clone() });
    }
    match cfg.finetune {
        Finetune::Full => push("finetune", "lora".into(), "LoRA".into(), true, Config { finetune: Finetune::Lora, ..cfg.clone() }),
        Finetune::Lora => push("finetune", "qlora".into(), "QLoRA".into(), true, Config { finetune: Finetune::Qlora, ..cfg.clone() }),
        Finetune::Qlora => {}
    }
    out
}

/// The `n` cheapest single changes that make `cfg` fit, cheapest first: changes that keep what
/// is trained before those that alter it, then by estimated step time. Empty when `cfg` already
/// fits.
pub fn cheapest_fixes(cfg: &Config, a: &Assumptions, n: usize) -> Result<Vec<Fix>, PlanError> {
    if analyse(cfg)?.verdict.fits {
        return Ok(Vec::new());
    }
    changes_that_fit(cfg, a, n, 0.0)
}

/// The `n` cheapest single changes of `cfg` that fit with at least `min_free_pct` percent of the
/// capacity free, by the verdict itself ([`analyse`]: each fix's headroom is the one its own link
/// shows), cheapest first as [`cheapest_fixes`] orders them. What the page offers after a fix
/// that still does not fit, or fits with under [`super::analyse::TIGHT_PCT`] to spare.
pub fn changes_that_fit(cfg: &Config, a: &Assumptions, n: usize, min_free_pct: f64) -> Result<Vec<Fix>, PlanError> {
    let base_cost = cost::step_cost(cfg, a)?;
    let mut fixes: Vec<Fix> = candidate_changes(cfg)
        .into_iter()
        .filter_map(|(key, value, label, changes_training, c)| {
            // The step's peak in use first (fast): nvidia-smi never shows less.
            if !estimate(&c).ok().is_some_and(|e| peak_fits(&e)) {
                return None;
            }
            // Then the verdict itself: the fix promises what its own link will show.
            let v = analyse(&c).ok()?.verdict;
            if !v.fits || headroom_pct(v.headroom, v.capacity) < min_free_pct {
                return None;
            }
            let k = cost::step_cost(&c, a).ok()?;
            let step_time_pct = 100.0 * (k.step_s - base_cost.step_s) / base_cost.step_s;
            let flops_pct = 100.0 * (k.flops.executed - base_cost.flops.executed) / base_cost.flops.executed;
            let h = v.headroom;
            let sentence = format!(
                "{label}: fits, +{} headroom, {} step FLOPs, {} est. step time{}",
                format_bytes(h.max(0) as u128, cfg.unit),
                signed_pct(flops_pct),
                signed_pct(step_time_pct),
                if changes_training { " (changes what is trained)" } else { "" }
            );
            Some(Fix { key, value, label, fits: true, headroom: h, step_time_pct, flops_pct, changes_training, sentence, config: c })
        })
        .collect();
    fixes.sort_by(|x, y| {
        x.changes_training.cmp(&y.changes_training).then(x.step_time_pct.total_cmp(&y.step_time_pct)).then(y.headroom.cmp(&x.headroom))
    });
    fixes.truncate(n);
    Ok(fixes)
}

// ---------------------------------------------------------------------------------------------
// Export
// ---------------------------------------------------------------------------------------------

/// The leading columns of [`to_csv`], before the knobs.
const CSV_LEADING: [&str; 7] =
    ["rank", "frontier", "step_s_estimate", "tokens_per_s_estimate", "mfu_estimate", "memory_bytes", "headroom_bytes"];

/// The knob columns of [`to_csv`]: [`KNOBS`] with the accumulation steps after the micro-batch.
fn csv_knobs() -> impl Iterator<Item = &'static str> {
    std::iter::once(KNOBS[0]).chain(std::iter::once("accum")).chain(KNOBS[1..].iter().copied())
}

/// The header line of [`to_csv`]: the plan's rank, frontier flag, estimated step time,
/// throughput and MFU, memory and headroom in bytes, every knob, and the share query.
pub fn csv_header() -> String {
    CSV_LEADING.iter().copied().chain(csv_knobs()).chain(std::iter::once("query")).collect::<Vec<_>>().join(",")
}

/// The ranked plans as CSV, one row per plan (frontier plans flagged), with each plan's share
/// query from `query` (the caller's `config::encode_query`; the estimator does not depend on
/// the codec).
pub fn to_csv(result: &PlanResult, query: impl Fn(&Config) -> String) -> String {
    let mut s = csv_header();
    s.push('\n');
    let mut rows: Vec<&Plan> = result.plans.iter().collect();
    for f in &result.frontier {
        if !rows.iter().any(|p| p.knobs == f.knobs) {
            rows.push(f);
        }
    }
    for p in rows {
        let k = &p.knobs;
        let on_frontier = result.frontier.iter().any(|f| f.knobs == p.knobs);
        let leading = [
            p.rank.to_string(),
            on_frontier.to_string(),
            format!("{:.4}", p.step_s),
            format!("{:.0}", p.tokens_per_s),
            format!("{:.4}", p.mfu),
            p.memory.to_string(),
            p.headroom.to_string(),
        ];
        let fields: Vec<String> = leading
            .into_iter()
            .chain(csv_knobs().map(|key| knob_value(key, k)))
            .chain(std::iter::once(csv_field(&query(&p.config))))
            .collect();
        s.push_str(&fields.join(","));
        s.push('\n');
    }
    s
}

#[derive(Serialize)]
struct PlanJson<'a> {
    label: &'static str,
    model: String,
    gpu: &'a str,
    gpus: u64,
    gpus_per_node: u64,
    seq: u64,
    global_sequences: u64,
    global_tokens: u64,
    /// The base configuration as a share query.
    query: String,
    search_seconds: f64,
    progress: Progress,
    pruning_rules: &'a [&'static str],
    assumptions: &'a [cost::Assumption],
    explanation: &'a [Reason],
    plans: Vec<PlanRowJson<'a>>,
    frontier: Vec<PlanRowJson<'a>>,
    /// Where this search found nothing and the caller searched again with the knobs of
    /// [`WIDENINGS`] opened ([`widen`]): that search; `null` otherwise.
    widened: Option<WidenedJson<'a>>,
}

/// The widened search of a [`PlanJson`]: the knobs opened, each key they opened with the values
/// it tried (as the URL spells them), and the search's own progress, explanation and plans.
#[derive(Serialize)]
struct WidenedJson<'a> {
    knobs: &'a [&'static str],
    opened: Vec<OpenedJson>,
    search_seconds: f64,
    progress: Progress,
    explanation: &'a [Reason],
    plans: Vec<PlanRowJson<'a>>,
    frontier: Vec<PlanRowJson<'a>>,
}

/// A key the widened search opened and the values it tried (`--try-KEY v1,v2` on the CLI).
#[derive(Serialize)]
struct OpenedJson {
    key: &'static str,
    values: Vec<String>,
}

impl<'a> WidenedJson<'a> {
    fn of(w: &'a Widened, seconds: f64, query: &dyn Fn(&Config) -> String) -> Self {
        WidenedJson {
            knobs: &w.knobs,
            opened: w.opened().into_iter().map(|(key, values)| OpenedJson { key, values }).collect(),
            search_seconds: seconds,
            progress: w.result.progress,
            explanation: &w.result.explanation,
            plans: plan_rows(&w.result.plans, query),
            frontier: plan_rows(&w.result.frontier, query),
        }
    }
}

#[derive(Serialize)]
struct PlanRowJson<'a> {
    rank: usize,
    /// The plan as a share query (`?` + this reproduces it).
    query: String,
    fits: bool,
    step_s_estimate: f64,
    tokens_per_s_estimate: f64,
    mfu_estimate: f64,
    memory: u128,
    /// What nvidia-smi will show (the caching allocator simulated), bytes.
    nvidia_smi: Option<u128>,
    capacity: u128,
    headroom: i128,
    knobs: &'a Knobs,
    memory_by_category: &'a [(&'static str, u128)],
    cost: &'a Option<cost::StepCost>,
}

fn plan_rows<'a>(plans: &'a [Plan], query: &dyn Fn(&Config) -> String) -> Vec<PlanRowJson<'a>> {
    plans
        .iter()
        .map(|p| PlanRowJson {
            rank: p.rank,
            query: query(&p.config),
            fits: p.headroom >= 0,
            step_s_estimate: p.step_s,
            tokens_per_s_estimate: p.tokens_per_s,
            mfu_estimate: p.mfu,
            memory: p.memory,
            nvidia_smi: p.nvidia_smi,
            capacity: p.capacity,
            headroom: p.headroom,
            knobs: &p.knobs,
            memory_by_category: &p.memory_by_category,
            cost: &p.cost,
        })
        .collect()
}

/// The stable JSON document of `trainmem plan --json` and of the page's JSON export, with each
/// plan's share query from `query` (the caller's `config::encode_query`), and `widened`, the
/// search [`widen`] ran where this one found nothing, with its seconds (the page's panel shows
/// the widened search itself, its knobs checked, and passes `None`).
pub fn to_json(
    req: &PlanRequest,
    r: &PlanResult,
    seconds: f64,
    widened: Option<(&Widened, f64)>,
    query: impl Fn(&Config) -> String,
) -> String {
    let doc = PlanJson {
        label: r.label,
        model: req.base.display_name(),
        gpu: &req.base.gpu,
        gpus: req.base.gpus,
        gpus_per_node: req.base.gpus_per_node,
        seq: req.base.seq,
        global_sequences: r.global_sequences,
        global_tokens: r.global_tokens,
        query: query(&req.base),
        search_seconds: seconds,
        progress: r.progress,
        pruning_rules: &r.pruning_rules,
        assumptions: &r.assumptions,
        explanation: &r.explanation,
        plans: plan_rows(&r.plans, &query),
        frontier: plan_rows(&r.frontier, &query),
        widened: widened.map(|(w, s)| WidenedJson::of(w, s, &query)),
    };
    serde_json::to_string_pretty(&doc).unwrap_or_else(|err| format!("{{\"error\": \"{err}\"}}"))
}

fn csv_field(v: &str) -> String {
    if v.contains([',', '"', '\n']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_cheapest_changes_try_every_2nd_layer_compile_and_offloading_where_the_code_has_them() {
        let keys = |c: &Config| candidate_changes(c).into_iter().map(|x| x.0).collect::<Vec<_>>();
        let hf = keys(&Config::default());
        for k in ["recompute_every", "compile", "act_offload"] {
            assert!(hf.contains(&k), "{k} in {hf:?}");
        }
        assert!(!hf.contains(&"act_offload_layers"), "{hf:?}");
        let megatron = Config { framework: crate::estimator::config::Framework::Megatron, attn: Attention::Flash, ..Config::default() };
        let mk = keys(&megatron);
        assert!(mk.contains(&"act_offload_layers") && !mk.contains(&"compile") && !mk.contains(&"act_offload"), "{mk:?}");
        assert!(!hf.contains(&"recompute_layers"), "{hf:?}");
    }

    #[test]
    fn a_plan_keeps_megatrons_block_method_with_full_recomputation_and_drops_it_otherwise() {
        let base = Config {
            framework: crate::estimator::config::Framework::Megatron,
            attn: Attention::Flash,
            recompute: Recompute::Full,
            recompute_layers: 4,
            ..small("llama-3.2-1b", 8)
        };
        let r = plan(PlanRequest::new(base, GlobalBatch::Sequences(32))).expect("plan");
        let of =
            |rec: Recompute| r.plans.iter().filter(|p| p.knobs.recompute == rec).map(|p| p.config.recompute_layers).collect::<Vec<_>>();
        assert!(!of(Recompute::Full).is_empty() && of(Recompute::Full).iter().all(|&n| n == 4), "{:?}", of(Recompute::Full));
        let other = [of(Recompute::None), of(Recompute::Selective)].concat();
        assert!(!other.is_empty() && other.iter().all(|&n| n == 0), "{other:?}");
    }

    #[test]
    fn every_nth_layer_and_the_block_method_are_plans_of_their_own_only_where_they_change_what_is_recomputed() {
        // Every 2nd layer checkpointed whole: a plan beside none, op and selective, not beside
        // full (every layer is already).
        for r in [Recompute::None, Recompute::Selective, Recompute::Op] {
            assert!(every_is_its_own_plan(2, r), "{r:?}");
        }
        assert!(!every_is_its_own_plan(2, Recompute::Full));
        assert!(every_is_its_own_plan(0, Recompute::Full));
        // The block method: 32 layers over pp 2 are stages of 16; 8 of them is a plan, 16 is
        // every layer (the plan with 0), and without full recomputation no count is.
        assert!(block_is_its_own_plan(8, Recompute::Full, 32, 2, 1));
        assert!(!block_is_its_own_plan(16, Recompute::Full, 32, 2, 1));
        assert!(!block_is_its_own_plan(8, Recompute::None, 32, 2, 1));
        assert!(block_is_its_own_plan(0, Recompute::None, 32, 2, 1));
    }

    #[test]
    fn the_default_space_tries_the_block_method_on_megatron_only_with_the_bases_own_count() {
        let megatron = Config { framework: Framework::Megatron, attn: Attention::Flash, ..Config::default() };
        assert_eq!(block_method_tries(&megatron), [0, 16, 8], "Llama 3.1 8B's 32 layers");
        assert_eq!(block_method_tries(&Config { recompute: Recompute::Full, recompute_layers: 4, ..megatron.clone() }), [0, 16, 8, 4]);
        assert_eq!(block_method_tries(&Config { recompute: Recompute::Full, recompute_layers: 8, ..megatron.clone() }), [0, 16, 8]);
        assert_eq!(block_method_tries(&Config::default()), [0], "off Megatron");
        assert_eq!(Space::default_for(&megatron).tried("recompute_layers"), Some(3));
    }

    #[test]
    fn on_megatron_the_cheapest_changes_recompute_half_of_each_stage_or_every_layer() {
        let megatron = Config { framework: crate::estimator::config::Framework::Megatron, attn: Attention::Flash, ..Config::default() };
        let block = |c: &Config| candidate_changes(c).into_iter().filter(|x| x.0 == "recompute_layers").map(|x| x.4).collect::<Vec<_>>();
        // Llama 3.1 8B's 32 layers, no recomputation: the first 16 recomputed.
        let half = block(&megatron);
        assert_eq!(half.iter().map(|c| (c.recompute, c.recompute_layers)).collect::<Vec<_>>(), [(Recompute::Full, 16)]);
        assert!(half.iter().all(|c| validate(c).is_ok()));
        // Under pp 2 × vpp 2 a virtual stage has 8: 4 of each.
        let staged = Config { gpus: 2, pp: 2, vpp: 2, accum: 4, ..megatron.clone() };
        assert_eq!(block(&staged).first().map(|c| c.recompute_layers), Some(4));
        // 32 layers over pp 6: the first stages hold ⌈32/6⌉ = 6 (the program's count, not
        // ⌊32/6⌋ = 5), so 3 of each.
        let uneven = Config { gpus: 6, pp: 6, accum: 6, ..megatron.clone() };
        assert_eq!(block(&uneven).first().map(|c| c.recompute_layers), Some(3));
        assert_eq!(
            crate::estimator::step::model::checkpointed_alone_counts(&block(&uneven)[0], crate::estimator::params::Stage::First).0,
            3
        );
        // Recomputing some already: all of them.
        let some = Config { recompute: Recompute::Full, recompute_layers: 4, ..megatron };
        assert_eq!(block(&some).first().map(|c| (c.recompute, c.recompute_layers)), Some((Recompute::Full, 0)));
    }
    use super::*;
    use crate::estimator::presets::preset;

    fn small(model: &str, gpus: u64) -> Config {
        let arch = preset(model).map(|p| p.spec).expect("preset");
        Config { model: model.into(), arch, gpus, seq: 1024, ..Config::default() }
    }

    #[test]
    fn a_search_that_finds_nothing_is_widened_by_the_host_memory_knobs_it_left_closed_and_no_others() {
        // Llama 3.2 3B in full on one RTX 4090 (24 GB): 51 GB of weights, gradients and AdamW
        // states. Nothing of the default space fits.
        let base = Config { gpu: "rtx-4090".into(), ..small("llama-3.2-3b", 1) };
        let req = PlanRequest::new(base.clone(), GlobalBatch::Sequences(4));
        assert!(plan(req.clone()).expect("plan").plans.is_empty());
        let w = widen(&req).expect("widen").expect("knobs to open");
        assert_eq!(w.knobs, WIDENINGS);
        assert_eq!(w.request.space.offload, [Offload::None, Offload::Optimizer, Offload::OptimizerParams]);
        assert_eq!(w.request.space.finetune, [Finetune::Full], "LoRA would train something else");
        assert!(!w.result.plans.is_empty());
        assert!(w.result.plans.iter().all(|p| p.config.offload != Offload::None
            || p.config.optim == Optimizer::Adam8bit
            || p.config.act_offload != ActOffload::None));
        // Opened already: nothing to widen — also on Megatron's profile, where activation
        // offloading opens `act_offload_layers` and leaves `act_offload` at one value.
        let open = WIDENINGS.iter().fold(req.space.clone(), |s, k| s.opened(&base, k));
        assert!(widen(&PlanRequest { space: open, ..req }).expect("widen").is_none());
        let megatron = Config { framework: Framework::Megatron, attn: Attention::Flash, ..base.clone() };
        let open = WIDENINGS.iter().fold(Space::default_for(&megatron), |s, k| s.opened(&megatron, k));
        assert_eq!(open.act_offload, [ActOffload::None]);
        assert!(widen(&PlanRequest { space: open, ..PlanRequest::new(megatron, GlobalBatch::Sequences(4)) }).expect("widen").is_none());
    }

    #[test]
    fn an_opened_knob_keeps_the_bases_own_value_first_and_offloads_activations_as_the_profile_does() {
        let sgd = Config { optim: Optimizer::Sgd, act_offload: ActOffload::SaveOnCpu, ..small("llama-3.2-1b", 1) };
        let s = Space::fixed(&sgd).opened(&sgd, "optim").opened(&sgd, "act_offload");
        assert_eq!(s.optim, [Optimizer::Sgd, Optimizer::Adamw, Optimizer::Adam8bit]);
        assert_eq!(s.act_offload, [ActOffload::SaveOnCpu, ActOffload::None, ActOffload::Torchtune]);
        assert_eq!(s.act_offload_layers, [0]);
        // Megatron's profile: Transformer Engine's per-layer offloading (16 layers: 0 or 8).
        let megatron = Config { framework: Framework::Megatron, attn: Attention::Flash, ..small("llama-3.2-1b", 1) };
        let m = Space::fixed(&megatron).opened(&megatron, "act_offload");
        assert_eq!((m.act_offload, m.act_offload_layers), (vec![ActOffload::None], vec![0, 8]));
        // Every knob is spelled as `--try-KEY` reads it.
        for k in KNOBS {
            assert!(s.spelled(k).is_some(), "{k}");
        }
        assert_eq!(s.spelled("act_offload"), Some(vec!["save_on_cpu".into(), "none".into(), "torchtune".into()]));
    }

    #[test]
    fn global_batches_in_tokens_must_be_whole_sequences() {
        assert_eq!(GlobalBatch::Tokens(4 << 20).sequences(8192), Ok(512));
        assert_eq!(GlobalBatch::Tokens(1000).sequences(8192).map_err(|e| e.key()), Err("global_batch_tokens"));
        assert_eq!(GlobalBatch::Sequences(0).sequences(8192).map_err(|e| e.key()), Err("global_batch"));
    }

    #[test]
    fn micro_batches_multiply_out_to_the_global_batch() {
        // 64 sequences on 8 replicas: 8 per replica → b ∈ {1, 2, 4, 8}.
        assert_eq!(micro_batches(&[], 64, 8), vec![(1, 8), (2, 4), (4, 2), (8, 1)]);
        assert_eq!(micro_batches(&[3, 4], 64, 8), vec![(4, 2)]);
        assert!(micro_batches(&[], 64, 3).is_empty());
    }

    #[test]
    fn the_frontier_keeps_only_plans_nothing_beats_on_both_axes() {
        let k = Knobs::of(&Config::default());
        let p = |step_s: f64, headroom: i128| Point { knobs: k, memory: 0, headroom, step_s, tokens_per_s: 0.0, mfu: 0.0 };
        let mut pts = vec![p(1.0, 5), p(2.0, 3), p(2.0, 9), p(3.0, 7), p(4.0, 10)];
        pts.sort_by(rank_order);
        let f: Vec<(f64, i128)> = pareto_frontier(&pts).iter().map(|p| (p.step_s, p.headroom)).collect();
        assert_eq!(f, vec![(1.0, 5), (2.0, 9), (4.0, 10)]);
    }

    #[test]
    fn every_point_the_search_returns_fits_and_its_step_time_is_the_cost_models() {
        let base = small("qwen2.5-0.5b", 8);
        let req = PlanRequest::new(base, GlobalBatch::Sequences(64));
        let r = plan(req.clone()).expect("plan");
        assert!(r.progress.done && !r.progress.cancelled);
        assert!(!r.plans.is_empty());
        for p in r.plans.iter().chain(&r.frontier) {
            let a = analyse(&p.config).expect("valid");
            assert!(a.verdict.fits);
            assert_eq!((a.verdict.deciding, a.verdict.headroom), (p.memory, p.headroom));
            let c = cost::step_cost(&p.config, &req.assumptions).expect("cost");
            assert!((c.step_s - p.step_s).abs() <= 1e-12 * c.step_s);
            assert_eq!(p.config.batch * p.config.accum * p.config.dp(), 64);
        }
        assert!(r.plans.windows(2).all(|w| w[0].step_s <= w[1].step_s));
        assert_eq!(r.progress.settled, r.progress.configurations);
        let p = r.progress;
        assert_eq!(p.fitting + p.not_fitting + p.pruned + p.dominated + p.invalid, p.configurations);
    }

    #[test]
    fn stepping_in_slices_finds_what_one_run_finds() {
        let req = PlanRequest::new(small("qwen2.5-0.5b", 8), GlobalBatch::Sequences(32));
        let whole = plan(req.clone()).expect("plan");
        let mut s = Search::new(req).expect("search");
        let mut slices = 0;
        while !s.step(7).done {
            slices += 1;
            assert!(s.progress().settled <= s.progress().configurations);
        }
        assert!(slices > 1);
        assert_eq!(s.result().plans.iter().map(|p| p.knobs).collect::<Vec<_>>(), whole.plans.iter().map(|p| p.knobs).collect::<Vec<_>>());
    }

    #[test]
    fn cancelling_stops_the_search_and_keeps_what_it_found() {
        let req = PlanRequest::new(small("qwen2.5-0.5b", 8), GlobalBatch::Sequences(32));
        let mut s = Search::new(req).expect("search");
        s.step(3);
        s.cancel();
        let p = s.progress();
        assert!(p.done && p.cancelled && p.settled < p.configurations);
        assert!(s.result().plans.iter().all(|p| p.rank >= 1));
    }

    #[test]
    fn a_search_can_move_to_a_worker_thread() {
        fn send<T: Send + 'static>() {}
        send::<Search>();
        send::<PlanResult>();
    }

    #[test]
    fn an_empty_knob_names_its_key() {
        let mut req = PlanRequest::new(Config::default(), GlobalBatch::Sequences(8));
        req.space.zero.clear();
        assert_eq!(Search::new(req).err().map(|e| e.key()), Some("zero"));
    }

    #[test]
    fn chains_point_to_configurations_that_save_memory() {
        let k = Knobs {
            zero: Zero::Ddp,
            offload: Offload::None,
            recompute: Recompute::None,
            attn: Attention::Eager,
            sp: false,
            tp: 2,
            ..Knobs::of(&Config::default())
        };
        assert_eq!(memory_chain_below(ChainKnob::Zero, &k, 4096)[0].zero, Zero::Z1);
        assert_eq!(memory_chain_below(ChainKnob::Offload, &k, 4096)[0].offload, Offload::Optimizer);
        assert!(memory_chain_below(ChainKnob::Sp, &k, 4096).is_empty());
        // ZeRO-2, ZeRO-3 and recomputation are no chain steps (see the module docs).
        assert!(memory_chain_below(ChainKnob::Zero, &Knobs { zero: Zero::Z1, ..k }, 4096).is_empty());
        assert!(memory_chain_below(ChainKnob::Zero, &Knobs { zero: Zero::Z2, ..k }, 4096).is_empty());
        assert!(memory_chain_below(ChainKnob::Recompute, &k, 4096).is_empty());
        assert!(memory_chain_below(ChainKnob::Recompute, &Knobs { recompute: Recompute::Selective, ..k }, 4096).is_empty());
        // Eager attention is above SDPA only for sequences of 2,048 tokens and more.
        assert_eq!(memory_chain_below(ChainKnob::Attn, &k, 4096).len(), 2);
        assert!(memory_chain_below(ChainKnob::Attn, &k, 1024).is_empty());
    }

    #[test]
    fn a_configuration_that_fits_needs_no_fix() {
        assert_eq!(cheapest_fixes(&small("qwen2.5-0.5b", 1), &Assumptions::default(), 3), Ok(Vec::new()));
    }

    #[test]
    fn the_cheapest_fixes_each_fit_and_come_cheapest_first() {
        // Llama-3.1-8B at 16k tokens, ZeRO-3 on 8 H100s: the activations alone exceed the card
        // (the issue's 8k example sits within a few GB of the line, which moves with the overheads).
        let cfg = Config { seq: 16384, zero: Zero::Z3, gpus: 8, ..Config::default() };
        assert!(!analyse(&cfg).expect("valid").verdict.fits);
        let fixes = cheapest_fixes(&cfg, &Assumptions::default(), 3).expect("fixes");
        assert!(!fixes.is_empty());
        for f in &fixes {
            eprintln!("{}", f.sentence);
            let v = analyse(&f.config).expect("valid").verdict;
            assert!(v.fits, "{}", f.sentence);
            assert_eq!(v.headroom, f.headroom, "{}", f.sentence);
            assert!(f.sentence.starts_with(&f.label) && f.sentence.contains("fits"));
        }
        assert!(fixes.windows(2).all(|w| (w[0].changes_training, w[0].step_time_pct) <= (w[1].changes_training, w[1].step_time_pct)));
    }

    #[test]
    fn the_benchmark_request_spans_about_a_hundred_thousand_configurations() {
        let s = Search::new(benchmark_request()).expect("valid request");
        let n = s.progress().configurations;
        assert!((50_000..=200_000).contains(&n), "{n} configurations");
    }

    #[test]
    fn the_json_document_lists_each_plan_with_its_query_and_labels_the_estimates() {
        let req = PlanRequest::new(small("qwen2.5-0.5b", 8), GlobalBatch::Sequences(32));
        let r = plan(req.clone()).expect("plan");
        let doc: serde_json::Value = serde_json::from_str(&to_json(&req, &r, 0.5, None, |c| format!("batch={}", c.batch))).expect("json");
        assert_eq!(doc["label"], cost::ESTIMATE_LABEL);
        assert_eq!(doc["plans"].as_array().map(Vec::len), Some(r.plans.len()));
        assert_eq!(doc["plans"][0]["query"], format!("batch={}", r.plans[0].config.batch));
        assert_eq!(doc["plans"][0]["step_s_estimate"].as_f64(), Some(r.plans[0].step_s));
        assert_eq!(doc["search_seconds"].as_f64(), Some(0.5));
        assert!(doc["widened"].is_null(), "a search that found plans carries no widened one");
    }

    #[test]
    fn the_json_document_carries_the_widened_search_with_the_keys_it_opened_and_their_values() {
        // The 3B-on-a-4090 case above: nothing of the asked space fits, the widened one does.
        let req = PlanRequest::new(Config { gpu: "rtx-4090".into(), ..small("llama-3.2-3b", 1) }, GlobalBatch::Sequences(4));
        let r = plan(req.clone()).expect("plan");
        let w = widen(&req).expect("widen").expect("knobs to open");
        let doc: serde_json::Value =
            serde_json::from_str(&to_json(&req, &r, 0.5, Some((&w, 0.25)), |c| c.offload.name().to_string())).expect("json");
        assert_eq!(doc["plans"].as_array().map(Vec::len), Some(0));
        let wd = &doc["widened"];
        assert_eq!(wd["knobs"], serde_json::json!(["offload", "act_offload", "optim"]));
        assert_eq!(wd["opened"][0], serde_json::json!({"key": "offload", "values": ["none", "optimizer", "optimizer+params"]}));
        let keys: Vec<&str> = wd["opened"].as_array().expect("opened").iter().filter_map(|o| o["key"].as_str()).collect();
        assert!(keys.contains(&"act_offload") && keys.contains(&"optim"), "{keys:?}");
        assert_eq!(wd["search_seconds"].as_f64(), Some(0.25));
        assert_eq!(wd["plans"].as_array().map(Vec::len), Some(w.result.plans.len()));
        assert_eq!(wd["plans"][0]["query"], w.result.plans[0].config.offload.name());
        assert_eq!(wd["progress"]["configurations"].as_u64(), Some(w.result.progress.configurations));
    }

    #[test]
    fn csv_has_a_row_per_plan_with_its_query() {
        let r = plan(PlanRequest::new(small("qwen2.5-0.5b", 8), GlobalBatch::Sequences(32))).expect("plan");
        let csv = to_csv(&r, |c| format!("batch={}", c.batch));
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], csv_header());
        assert!(lines.len() > 1);
        assert!(lines[1..].iter().all(|l| l.split(',').count() == csv_header().split(',').count() && l.contains("batch=")));
    }

    #[test]
    fn the_csv_header_keeps_its_columns_with_the_accumulation_after_the_micro_batch() {
        // The columns spreadsheets and scripts read by name: a knob added to `KNOBS` adds one
        // here, in that order.
        assert_eq!(
            csv_header(),
            "rank,frontier,step_s_estimate,tokens_per_s_estimate,mfu_estimate,memory_bytes,headroom_bytes,batch,accum,zero,\
             recompute,attn,optim,optim_impl,offload,tp,pp,vpp,cp,ep,sp,finetune,compile,recompute_every,recompute_layers,act_offload,\
             act_offload_layers,query"
        );
    }

    #[test]
    fn every_knob_has_a_value_a_count_in_the_space_and_a_setter_and_no_other_name_does() {
        let base = small("qwen2.5-0.5b", 8);
        let k = Knobs::of(&base);
        let mut space = Space::fixed(&base);
        for key in KNOBS {
            assert!(!knob_value(key, &k).is_empty(), "{key} has no value");
            assert!(space.tried(key).is_some(), "{key} has no count");
            assert!(space.set_from(key, &[base.clone(), base.clone()]), "{key} has no setter");
            assert_eq!(space.tried(key), Some(2), "{key}: set_from sets that knob");
        }
        assert!(!knob_value("accum", &k).is_empty());
        assert_eq!(space.tried("gpus"), None);
        assert!(!space.set_from("gpus", std::slice::from_ref(&base)));
    }

    #[test]
    fn a_space_with_an_empty_knob_names_it_but_an_empty_micro_batch_list_means_every_one() {
        let base = small("qwen2.5-0.5b", 8);
        let mut space = Space::fixed(&base);
        assert!(space.batch.is_empty() && space.check().is_ok());
        space.set_from("act_offload_layers", &[]);
        assert!(matches!(space.check(), Err(PlanError::EmptySpace { key: "act_offload_layers" })));
    }
}
