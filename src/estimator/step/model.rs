//! A pipeline stage's step: the model-level program (embedding, layers, final norm, LM head,
//! loss), what is resident beside it, and the phases after backward — gradient reduction, the
//! optimizer step with its temporaries, `zero_grad(set_to_none=True)`.

use super::families::{self, Kind, Params, Shared};
use super::ir::{Builder, DType, Dim, Dt, Fragment, Origin, Program, Save, Shape, Split, Tid, B, MODEL, S, X};
use super::run::{Accumulate, At, Run, Sink, NO_LAYER};
use super::stream::{Cat, Event, EventKind, Phase, Stream};
use crate::estimator::config::{Attention, Config, Kernels, Loss, OptimImpl, Optimizer, Recompute};
use crate::estimator::ctx::{Ctx, Values, Q};
use crate::estimator::ledger::Bytes;
use crate::estimator::params::{local_groups, stage_layers, virtual_stage_layers, LocalGroup, Role, Stage};
use crate::estimator::part::Part;
use crate::estimator::precision::Recipe;
use crate::estimator::sharding::Sharding;

/// Everything a stage's programs are built from.
pub struct Setup<'a> {
    pub cfg: &'a Config,
    pub recipe: Recipe,
    pub stage: Stage,
    pub ctx: Ctx<'a>,
    pub xv: [u64; X::COUNT],
    pub groups: Vec<LocalGroup>,
    /// The kind of each decoder layer on this stage, in order.
    pub kinds: Vec<Kind>,
    /// The variant (sliding window, NoPE) of each decoder layer on this stage, in order: looked
    /// up once here, since the pieces and the activation ledger ask for each layer's several
    /// times per estimate.
    vars: Vec<families::Var>,
    pub compute: DType,
    pub resid: DType,
    pub lin: DType,
    pub accumulate: Accumulate,
    /// The simulated micro-batch is the step's first backward under torchtitan's FSDP2 with
    /// pipeline parallelism ([`crate::estimator::sharding::keeps_stage_gathered`]): it makes the
    /// fp32 gradient accumulators, none are resident, and every micro-batch's forward ran
    /// before it ([`Setup::first_backward`]).
    pub first_backward: bool,
}

/// The model index of a stage's first decoder layer and the kind of each of its layers: MoE
/// layers where the model's rule puts them (Llama 4's `interleave_moe_layer_step`: by their
/// index), else the stage's dense layers first and its share of MoE layers after them.
pub fn stage_kinds(cfg: &Config, stage: Stage) -> (usize, Vec<Kind>) {
    let spec = &cfg.arch;
    let layers = stage_layers(spec.layers, cfg.pp);
    let moe_here = layers.min(spec.moe_layers());
    let first = first_layer_of(stage, spec.layers, layers as usize);
    let kinds = if spec.moe_rule != crate::estimator::model::LayerRule::All {
        (0..layers).map(|i| if spec.is_moe_layer(first as u64 + i) { Kind::Moe } else { Kind::Dense }).collect()
    } else {
        (0..layers).map(|i| if i < layers - moe_here { Kind::Dense } else { Kind::Moe }).collect()
    };
    (first, kinds)
}

/// The model index of the first of a stage's `stage_layers` decoder layers, in a model of
/// `layers`.
fn first_layer_of(stage: Stage, layers: u64, stage_layers: usize) -> usize {
    match stage {
        Stage::Whole | Stage::First => 0,
        Stage::Middle => stage_layers,
        Stage::Last => (layers as usize).saturating_sub(stage_layers),
    }
}

impl<'a> Setup<'a> {
    pub fn new(cfg: &'a Config, recipe: &Recipe, stage: Stage) -> Setup<'a> {
        let spec = &cfg.arch;
        let amp = recipe.autocast_weight_copy;
        let values = Values::of(cfg, recipe);
        let ctx = Ctx::new(cfg, values, amp, cfg.kernels == Kernels::Cuda);
        let mut xv = [0u64; X::COUNT];
        xv[X::DRot as usize] = families::common::rotary_dims(spec);
        xv[X::E as usize] = spec.experts;
        xv[X::K as usize] = spec.top_k;
        xv[X::FE as usize] = spec.expert_ffn;
        xv[X::FS as usize] = spec.shared_ffn * spec.shared_experts;
        xv[X::R as usize] = cfg.lora_rank;
        xv[X::EProj as usize] = spec.embed_proj;
        xv[X::Pos as usize] = spec.max_pos + spec.pos_offset;
        let rows = (cfg.batch * values_s(cfg)).div_ceil(spec.vocab.div_ceil(spec.hidden.max(1)).max(1));
        xv[X::Chunk as usize] = rows;
        xv[X::OutChunk as usize] = families::torchtune::chunk_tokens(values_s(cfg)).0;
        xv[X::MlaRq as usize] = spec.q_lora_rank;
        xv[X::MlaRkv as usize] = spec.kv_lora_rank;
        xv[X::MlaNope as usize] = spec.qk_nope_dim();
        xv[X::MlaV as usize] = spec.v_head_dim;
        xv[X::MlaKvA as usize] = spec.kv_lora_rank + spec.qk_rope_dim;
        xv[X::MlaKvB as usize] = spec.qk_nope_dim() + spec.v_head_dim;
        let x = spec.dsa;
        if x.heads > 0 {
            xv[X::IdxHeads as usize] = x.heads;
            xv[X::IdxHeadDim as usize] = x.head_dim;
            xv[X::IdxQ as usize] = x.heads * x.head_dim;
            xv[X::IdxTopk as usize] = x.topk.min(values_s(cfg));
        }
        let m = spec.ssm;
        if m.heads > 0 {
            let s = values_s(cfg);
            let chunks = s.div_ceil(m.chunk.max(1));
            xv[X::SsmHeads as usize] = m.heads;
            xv[X::SsmHeadDim as usize] = m.head_dim;
            xv[X::SsmState as usize] = m.state;
            xv[X::SsmInner as usize] = m.inner();
            xv[X::SsmConvDim as usize] = m.conv_dim();
            xv[X::SsmIn as usize] = m.in_width();
            xv[X::SsmGroupState as usize] = m.groups * m.state;
            xv[X::SsmChunk as usize] = m.chunk;
            xv[X::SsmChunks as usize] = chunks;
            xv[X::SsmChunks1 as usize] = chunks + 1;
            xv[X::SsmPadded as usize] = chunks * m.chunk;
            xv[X::SsmConvLen as usize] = s + m.conv.saturating_sub(1);
        }
        let g = spec.gdn;
        if g.k_heads > 0 {
            let s = values_s(cfg);
            let c = crate::estimator::model::Gdn::CHUNK;
            let chunks = s.div_ceil(c);
            xv[X::GdnKHeads as usize] = g.k_heads;
            xv[X::GdnVHeads as usize] = g.v_heads;
            xv[X::GdnKDim as usize] = g.k_dim;
            xv[X::GdnVDim as usize] = g.v_dim;
            xv[X::GdnKeyWidth as usize] = g.key_width();
            xv[X::GdnValueWidth as usize] = g.value_width();
            xv[X::GdnConvDim as usize] = g.conv_dim();
            xv[X::GdnQkvz as usize] = 2 * g.key_width() + 2 * g.value_width();
            xv[X::GdnBa as usize] = 2 * g.v_heads;
            xv[X::GdnChunk as usize] = c;
            xv[X::GdnChunks as usize] = chunks;
            xv[X::GdnPadded as usize] = chunks * c;
            xv[X::GdnConvLen as usize] = s + g.conv.saturating_sub(1);
        }
        if spec.experts > 0 {
            let pairs = cfg.batch * values_s(cfg) * spec.top_k;
            let align = families::torchtitan::TOKEN_GROUP_ALIGN_SIZE_M;
            xv[X::MoePadded as usize] = (pairs + align * spec.experts).div_ceil(align) * align;
            xv[X::MoePairs1 as usize] = pairs + 1;
        }
        let (first, kinds) = stage_kinds(cfg, stage);
        let resid = if amp { DType::of(recipe.weight) } else { DType::of(recipe.compute) };
        let vars = (0..kinds.len())
            .map(|i| families::Var { every_nth: checkpointed_alone(cfg, first + i, i), ..families::var(spec, first + i) })
            .collect();
        Setup {
            cfg,
            recipe: *recipe,
            stage,
            ctx,
            xv,
            groups: local_groups(cfg, stage),
            kinds,
            vars,
            compute: DType::of(recipe.compute),
            resid,
            lin: if crate::estimator::ctx::linear_inputs_fp8(cfg, recipe) { DType::Fp8 } else { DType::of(recipe.compute) },
            accumulate: if cfg.kernels == Kernels::Cpu { Accumulate::OutOfPlace } else { Accumulate::InPlace },
            first_backward: false,
        }
    }

    /// This setup simulating the step's first backward instead of a later one (see
    /// [`Setup::first_backward`]); only under torchtitan's FSDP2 with pipeline parallelism and
    /// several micro-batches does it differ.
    pub fn first_backward(mut self, first: bool) -> Setup<'a> {
        self.first_backward = first;
        self
    }

    /// How this setup's runs treat parameter gradients ([`grad_mode`]).
    pub fn grad_mode(&self) -> GradMode {
        grad_mode(self.cfg, self.first_backward)
    }

    /// A builder for one of this stage's programs.
    pub fn builder(&self) -> Builder<'_> {
        self.builder_of(Program::default())
    }

    /// A builder that only sizes tensors (`bytes_of`, `expr_of`) with this stage's symbols and
    /// switches: it reserves no room for a program (sizing on the numeric path runs several
    /// times per estimate).
    pub fn sizer(&self) -> Builder<'_> {
        self.builder_of(Program::empty())
    }

    fn builder_of(&self, p: Program) -> Builder<'_> {
        let mut b = Builder::with_program(&self.ctx, self.compute, self.resid, self.lin, self.xv, p);
        b.autocast = self.recipe.autocast_weight_copy;
        b.dropout = self.cfg.dropout > 0.0;
        b.selective = self.cfg.recompute == Recompute::Selective;
        b.dead_graphs = self.cfg.act_offload.on();
        if self.cfg.finetune != crate::estimator::config::Finetune::Full {
            let adapters = crate::estimator::precision::trainable_recipe(self.cfg, &self.recipe);
            b.lora = Some(super::ir::Lora {
                targets: self.cfg.lora_targets.0,
                rank: self.cfg.lora_rank,
                weight: DType::of(adapters.weight),
                grad_elem: adapters.grad.bytes(),
                dropout: self.cfg.lora_dropout > 0.0,
                cast_input: self.cfg.lora_dtype == crate::estimator::config::LoraDtype::Fp32,
            });
        }
        b.lowbit = super::lowbit::of(self.cfg);
        b
    }

    /// The unit [`optimizer_params`] counts in: the trainable parameters' weight dtype.
    pub fn optimizer_weight(&self) -> DType {
        DType::of(crate::estimator::precision::trainable_recipe(self.cfg, &self.recipe).weight)
    }

    pub fn params(&self) -> Params<'_> {
        let sh = Sharding::of(self.cfg);
        // torchtitan's FSDP2 under pipeline parallelism reduce-scatters nothing before the last
        // micro-batch: each backward makes its gradients whole.
        let (shards, expert_shards) = if crate::estimator::sharding::keeps_stage_gathered(self.cfg) {
            (1, 1)
        } else {
            sh.ways(crate::estimator::sharding::GRADIENTS_FROM)
        };
        Params { groups: &self.groups, weight: DType::of(self.recipe.weight), grad_elem: self.recipe.grad.bytes(), shards, expert_shards }
    }

    /// Whether this stage's layer `i` is a sliding-window layer (by its index in the model).
    pub fn sliding(&self, i: usize) -> bool {
        let first = self.first_layer();
        let spec = &self.cfg.arch;
        families::modeling_for(self.cfg.framework, spec.family).sliding(spec, first + i)
    }

    /// This stage's layer `i`'s variant (sliding window, NoPE) by its index in the model.
    pub fn var(&self, i: usize) -> families::Var {
        self.vars[i]
    }

    /// The optimizer step inside backward (`optim_in_bwd`), as [`optimizer_events`] steps one
    /// AdamW parameter: for-loop two temporaries, foreach one, fused none.
    /// Activation offloading's hooks for this configuration ([`super::run::Offload`]).
    pub fn offload(&self) -> Option<super::run::Offload> {
        use crate::estimator::family::Family;
        let fam = self.cfg.arch.family;
        self.cfg.act_offload.on().then_some(super::run::Offload {
            kind: self.cfg.act_offload,
            addmm_saves_parameter: fam == Family::Gpt2,
            grouped_mm_saves_parameter: fam == Family::GptOss,
        })
    }

    /// Transformer Engine's per-layer offloading of the first `act_offload_layers` layers
    /// ([`super::te_offload`]): around transformers' layers a non-contiguous saved tensor stays;
    /// Megatron's own modules mark the views they save (every large activation goes).
    pub fn layer_offload(&self) -> Option<super::te_offload::LayerOffload> {
        let n = self.cfg.act_offload_layers;
        (n > 0).then(|| super::te_offload::LayerOffload {
            n: n.min(u64::from(u16::MAX - 1)) as u16,
            layers: self.cfg.arch.layers.min(u64::from(u16::MAX - 1)) as u16,
            contiguous_only: self.cfg.framework != crate::estimator::config::Framework::Megatron,
        })
    }

    pub fn step_hook(&self) -> Option<super::run::StepHook> {
        if !self.cfg.optim_in_bwd {
            return None;
        }
        let state_bytes = if self.recipe.master.is_some() { 4 } else { self.recipe.state.bytes() };
        let temps = match crate::estimator::optimizer::step_impl(self.cfg) {
            OptimImpl::Forloop => 2,
            OptimImpl::Foreach => 1,
            OptimImpl::Fused => 0,
        };
        Some(super::run::StepHook { state_bytes, temps })
    }

    /// The model index of this stage's first layer.
    pub fn first_layer(&self) -> usize {
        first_layer_of(self.stage, self.cfg.arch.layers, self.kinds.len())
    }

    /// How a layer of variant `var` is checkpointed: full (`recompute = full`: transformers'
    /// `GradientCheckpointingLayer`, early stop; one of every `recompute_every`: torchtitan's
    /// `ptd_checkpoint_wrapper`, no early stop), by op (torchtitan's SAC) or not at all.
    fn ckpt(&self, var: families::Var) -> Option<(bool, Option<super::sac::Policy>)> {
        if var.every_nth {
            // torchtitan's `ptd_checkpoint_wrapper(early_stop=False)`; transformers' wrapper
            // keeps `torch.utils.checkpoint`'s early stop, and Megatron's block method
            // checkpoints its layers as its full recomputation does.
            return Some((self.cfg.recompute_every_first || self.cfg.recompute_layers > 0, None));
        }
        match self.cfg.recompute {
            // Megatron's block method: the layers past the first N of their virtual stage.
            Recompute::Full if self.cfg.recompute_layers > 0 => None,
            Recompute::Full => Some((true, None)),
            Recompute::Op => Some((
                false,
                Some(super::sac::Policy {
                    attention_saved: self.cfg.kernels != Kernels::Cpu || self.cfg.sac_cpu_sdpa,
                    titan_022: self.cfg.framework == crate::estimator::config::Framework::Torchtitan,
                }),
            )),
            Recompute::None | Recompute::Selective => None,
        }
    }

    /// The whole stage as one program: what [`simulate_stage`] runs.
    pub fn whole(&self) -> Program {
        self.whole_with(true)
    }

    /// [`Setup::whole`], its later layers copied from the first of their kind and variant
    /// after the stage's first layer (`copy`) or each built.
    fn whole_with(&self, copy: bool) -> Program {
        let mut b = self.builder();
        let p = self.params();
        let spec = &self.cfg.arch;
        let (x0, sh) = self.begin(&mut b, &p);
        let mut x = x0;
        let before_layers = b.p.lengths();
        // One layer of each kind and variant after the first is kept (where it can be) and
        // copied as the later ones: the same ops on the same shapes, moved.
        let mut kept: Vec<((Kind, families::Var), Option<Fragment>)> = Vec::new();
        for (i, &kind) in self.kinds.iter().enumerate() {
            b.layer = i as u16;
            let var = self.var(i);
            let key = (kind, var);
            let template = kept.iter().find(|(k, _)| *k == key).filter(|_| copy);
            let copied = template.and_then(|(_, f)| f.as_ref()).and_then(|f| b.copy_layer(f, x));
            x = match copied {
                Some(y) => y,
                None if copy && i > 0 && template.is_none() => {
                    let view = sh.view(var);
                    let (y, f) = b.layer_kept(x, before_layers.tensors, |b| self.one_layer(b, &p, x, &view, kind, var));
                    kept.push((key, f));
                    y
                }
                None => self.one_layer(&mut b, &p, x, &sh.view(var), kind, var),
            };
            if i == 0 {
                // The other layers (and about one more for the epilogue), sized by the first.
                b.p.reserve_repeats(before_layers, self.kinds.len());
            }
        }
        b.layer = MODEL;
        self.end(&mut b, &p, x, x0, &sh, spec);
        b.p
    }

    /// The stage's prologue on its own: its outputs (the first hidden state and the shared
    /// tensors) stay alive for the caller.
    pub fn prologue(&self) -> (Program, Tid, Shared) {
        let mut b = self.builder();
        let p = self.params();
        let (x0, sh) = self.begin(&mut b, &p);
        b.outputs(&[x0]);
        for t in sh.all().chain(sh.locals.into_iter().flatten()) {
            b.hold_forever(t);
        }
        (b.p, x0, sh)
    }

    /// The shared tensors as inputs of a standalone program (same shapes and dtypes as the
    /// prologue makes them), slot by slot; `free`: the slots this program's backward may free.
    fn shared_inputs(&self, b: &mut Builder, free: u8) -> Shared {
        let spec = &self.cfg.arch;
        let mk = |b: &mut Builder, slot: usize, shape: Shape, dt: Dt, part: Part| {
            let t = b.external(shape, dt, Origin::Input { free_fwd: false, free_bwd: free & (1 << slot) != 0 }, false);
            b.p.tensors[t as usize].elsewhere = true;
            b.p.tensors[t as usize].part = Some(part);
            t
        };
        let code = families::modeling_for(self.cfg.framework, spec.family);
        let (cos, sin) = match code.rope_tables(spec) {
            // Model buffers (torchtitan's `freqs_cis`, torchtune's `cache`; litgpt's `cos` and `sin`),
            // and a compiled whole model's own tables (`common::rotary_tables`).
            Some((shape, dt, two)) if code.rope_table_is_buffer() || self.cfg.compiles_whole_model() => {
                (Some(b.external(shape, dt, Origin::Buffer, false)), two.then(|| b.external(shape, dt, Origin::Buffer, false)))
            }
            Some((shape, dt, two)) => {
                let c = mk(b, 0, shape, dt, Part::Embedding);
                let s = two.then(|| mk(b, 1, shape, dt, Part::Embedding));
                (Some(c), s)
            }
            None => (None, None),
        };
        let pos = code.shares_positions().then(|| mk(b, 2, Shape::new(&[Dim::Q(Q::S)], Split::None), Dt::I64, Part::Checkpoints));
        let [m, l] = code.mask_shapes(b, spec, self.cfg.attn);
        let mask = m.map(|(shape, dt)| mk(b, 3, shape, dt, Part::Checkpoints));
        let mask_local = l.map(|(shape, dt)| mk(b, 4, shape, dt, Part::Checkpoints));
        let (cos_local, sin_local) = if code.local_rope(spec) {
            // The sliding layers' own pair: Llama's shape, in the dtype of the family's tables
            // (Gemma-3: the residual dtype; OLMo 3: fp32, `Olmo3RotaryEmbedding.forward` does
            // not cast them — as the whole program's prologue makes them).
            let dt = code.rope_tables(spec).map_or(Dt::Resid, |(_, dt, _)| dt);
            let c = mk(b, 5, families::common::cos_shape(spec), dt, Part::Embedding);
            let s = mk(b, 6, families::common::cos_shape(spec), dt, Part::Embedding);
            (Some(c), Some(s))
        } else {
            (None, None)
        };
        Shared { cos, sin, pos, mask, mask_local, emb_w: None, locals: [None, None], cos_local, sin_local, linear: false, sliding: false }
    }

    /// One decoder layer of `kind` on its own: its input `x` (the model scope's own when
    /// `pinned`), the shared tensors (the global slots, freed by this layer's backward where
    /// `free` says: it is their first user), its view of them (`var`).
    pub fn layer_alone(&self, kind: Kind, var: families::Var, free: u8, pinned: bool) -> (Program, Tid, Shared) {
        self.layer_alone_with(kind, var, free, pinned, true)
    }

    /// [`Setup::layer_alone`] with an input that needs a gradient (`grad`) or not (the first
    /// layer on a frozen embedding, [`Setup::first_input_grad`]).
    pub fn layer_alone_with(&self, kind: Kind, var: families::Var, free: u8, pinned: bool, grad: bool) -> (Program, Tid, Shared) {
        let mut b = self.builder();
        let p = self.params();
        let x = families::common::input(&mut b, !pinned, true);
        b.p.tensors[x as usize].requires_grad = grad;
        let sh = self.shared_inputs(&mut b, free);
        b.layer = 0;
        let y = self.one_layer(&mut b, &p, x, &sh.view(var), kind, var);
        b.outputs(&[y]);
        (b.p, x, sh)
    }

    /// Whether this stage's first layer's input needs a gradient: not when it comes from a frozen
    /// embedding (LoRA, QLoRA), unless checkpointing made peft and transformers call
    /// `enable_input_require_grads()` (`prepare_model_for_kbit_training(use_gradient_checkpointing
    /// =True)`, `PreTrainedModel.gradient_checkpointing_enable` on a PEFT model). Measured: the
    /// qlora records' first layer keeps nothing before its first adapter without checkpointing.
    pub fn first_input_grad(&self) -> bool {
        !self.stage.has_embedding()
            || self.cfg.finetune == crate::estimator::config::Finetune::Full
            || self.cfg.recompute == Recompute::Full
            || self.cfg.recompute_every > 0
    }

    /// Whether this stage's first layer's input is held by the model's forward (its local).
    pub fn first_pinned(&self) -> bool {
        self.stage.has_embedding() && families::modeling_for(self.cfg.framework, self.cfg.arch.family).x0_is_local()
    }

    /// The stage's epilogue on its own (last stage: final norm, head, loss), with the
    /// model-level tensors the model's forward lets go at its end (`ends`: sizes and dtypes of
    /// those nobody saved).
    pub fn epilogue(&self, ends: &[(Shape, Dt)]) -> (Program, Tid) {
        let mut b = self.builder();
        let p = self.params();
        let spec = &self.cfg.arch;
        let x = families::common::input(&mut b, true, true);
        let ends: Vec<Tid> =
            ends.iter().map(|&(sh, dt)| b.external(sh, dt, Origin::Input { free_fwd: true, free_bwd: false }, false)).collect();
        let head_w = if spec.tied { p.w(&mut b, "embed_tokens.weight") } else { None };
        let sh = Shared {
            cos: None,
            sin: None,
            pos: None,
            mask: None,
            mask_local: None,
            emb_w: head_w,
            locals: [None, None],
            cos_local: None,
            sin_local: None,
            linear: false,
            sliding: false,
        };
        b.layer = MODEL;
        let unit_first = b.next_op();
        let xn = if spec.final_norm { families::modeling_for(self.cfg.framework, spec.family).final_norm(&mut b, &p, spec, x) } else { x };
        b.hold(x);
        for &t in &ends {
            b.hold(t);
        }
        self.head_and_loss(&mut b, &p, x, xn, &sh);
        self.compile_final_norm_and_head(&mut b, unit_first);
        self.head_unit(&mut b, unit_first);
        // The caller's `hidden_states` holds the final norm's output through the loss
        // ([`Self::holds_final_norm_output`]).
        if self.holds_final_norm_output() {
            b.hold(xn);
        }
        (b.p, x)
    }

    /// The model's forward before the layers (embedding or the received activation, positions,
    /// mask, rotary embedding).
    fn begin(&self, b: &mut Builder, p: &Params) -> (Tid, Shared) {
        let spec = &self.cfg.arch;
        b.layer = MODEL;
        let code = families::modeling_for(self.cfg.framework, spec.family);
        if self.stage.has_embedding() {
            let ids = b.external(Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None), Dt::I64, Origin::Batch, false);
            let (x0, sh) = code.embed(b, p, spec, ids, self.cfg.attn);
            // `enable_input_require_grads()`: a forward hook makes the frozen embedding's output
            // require a gradient ([`Setup::first_input_grad`]).
            if self.first_input_grad() {
                b.p.tensors[x0 as usize].requires_grad = true;
            }
            (x0, sh)
        } else {
            // A later pipeline stage receives its input (and computes its own positions).
            code.receive(b, p, spec, self.cfg.attn)
        }
    }

    /// One decoder layer, checkpointed under full recomputation.
    fn one_layer(&self, b: &mut Builder, p: &Params, x: Tid, sh: &Shared, kind: Kind, var: families::Var) -> Tid {
        let region = self.ckpt(var).map(|(early_stop, sac)| {
            let mut held = vec![Save { t: x, part: Part::Checkpoints, group: super::ir::Group::All }];
            for t in sh.all() {
                held.push(Save { t, part: Part::Checkpoints, group: super::ir::Group::All });
            }
            let r = b.begin_checkpoint_as(held, early_stop, sac);
            // The layer's hidden state is its one positional argument (transformers'
            // `decoder_layer(hidden_states, attention_mask=..., position_embeddings=..., ...)`,
            // `GradientCheckpointingLayer`: `checkpoint(partial(forward, self, **kwargs), *args)`;
            // torchtune's `layer(h, mask=mask, input_pos=input_pos)` through `checkpoint_wrapper`).
            b.p.regions[r].inputs = 1;
            r
        });
        let spec = &self.cfg.arch;
        let first = b.next_op();
        let y = families::modeling_for(self.cfg.framework, spec.family).layer(b, p, spec, x, sh, kind, self.cfg.attn);
        if let Some(r) = region {
            b.end_checkpoint(r);
        }
        // Compiled: the partitioner follows the checkpoint's tags (FINDINGS §15.1). torchtune
        // wraps each compiled layer in its checkpoint (`compile_model`, then
        // `set_activation_checkpointing`): the eager re-run calls the compiled forward, and the
        // compiled backward's kernels are scheduled apart from its recomputation.
        let ckpt_inside = self.cfg.framework != crate::estimator::config::Framework::Torchtune;
        match region {
            Some(r) if self.compiled_layers() => b.compile_checkpointed_region(r, &[y], ckpt_inside),
            None if self.compiled_layers() => b.compile_region(first, b.next_op(), &[y]),
            _ => {}
        }
        if self.compiled_layers() {
            b.fuse_layer_backward(first, b.next_op(), region.is_some() && ckpt_inside);
        }
        b.hold(x);
        y
    }

    /// The model's forward after the layers: the final norm, the LM head and the loss on the
    /// last stage; on the others the output is sent on.
    fn end(&self, b: &mut Builder, p: &Params, x: Tid, x0: Tid, sh: &Shared, spec: &crate::estimator::model::ModelSpec) {
        b.layer = MODEL;
        if self.stage.has_head() {
            let unit_first = b.next_op();
            let xn = if spec.final_norm { families::modeling_for(self.cfg.framework, spec.family).final_norm(b, p, spec, x) } else { x };
            b.hold(x);
            // `LlamaModel.forward` returns: its locals go.
            for t in sh.locals.into_iter().flatten() {
                b.hold(t);
            }
            let _ = x0;
            for t in sh.all() {
                b.hold(t);
            }
            self.head_and_loss(b, p, x, xn, sh);
            self.compile_final_norm_and_head(b, unit_first);
            self.head_unit(b, unit_first);
            if self.stage.has_embedding() {
                self.root_unit(b);
                self.end_units(b);
                self.layer_units(b);
            }
            // `hidden_states = outputs.last_hidden_state` (`*ForCausalLM.forward`) names the final
            // norm's output until the loss is computed: under autocast the head keeps only its
            // bf16 cast, and the fp32 output still lives through the loss. (torchtune's
            // `unembed` returns the chunks' logits: its `h` goes before the loss.)
            if self.holds_final_norm_output() {
                b.hold(xn);
            }
        } else {
            // The output is sent to the next stage and freed; its gradient comes back.
            for t in sh.locals.into_iter().flatten() {
                b.hold(t);
            }
            let _ = x0;
            for t in sh.all() {
                b.hold(t);
            }
            b.p.outputs.push(x);
        }
    }

    /// Whether the final norm's output lives through the loss: transformers' `*ForCausalLM`
    /// names it (`hidden_states = outputs.last_hidden_state`) until the loss is computed;
    /// torchtune's `unembed` returns the chunks' logits, litgpt's `GPT.forward` and torchtitan's
    /// `Transformer.forward` (0.2.2, `h = self.norm(h)`, `output = self.output(h)`) return the
    /// logits, so their `h` goes when the model returns, before the loss (under sequence
    /// parallelism nothing saves the norm's shard: the head keeps its all-gathered copy;
    /// measured, `torchtitan-llama3-tp.json`'s compiled records, whose step peaks in the loss's
    /// forward).
    fn holds_final_norm_output(&self) -> bool {
        use crate::estimator::config::Framework;
        !matches!(self.cfg.framework, Framework::Torchtune | Framework::Litgpt | Framework::Torchtitan)
    }

    /// `lm_head` and `ForCausalLMLoss` (`loss_utils.py`):
    /// ```python
    /// logits = logits.float()
    /// labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
    /// shift_labels = labels[..., 1:].contiguous()
    /// loss = F.cross_entropy(logits.view(-1, V), shift_labels.view(-1), reduction="mean")
    /// ```
    fn head_and_loss(&self, b: &mut Builder, p: &Params, x: Tid, xn: Tid, sh: &Shared) {
        let spec = &self.cfg.arch;
        b.module = "lm_head";
        b.part = Part::Head;
        let w = p.w(b, "lm_head.weight").or(sh.emb_w).or_else(|| p.w(b, "embed_tokens.weight"));
        let bias = p.w(b, "lm_head.bias");
        let vocab = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::V)], Split::Tp);
        // Under sequence parallelism the head's input is all-gathered first (its backward
        // reduce-scatters): the head keeps the whole sequence.
        let xn = if self.cfg.sp && self.cfg.tp > 1 { b.sequence_all_gather(xn) } else { xn };
        // torchtune's `CEWithChunkedOutputLoss` (its `loss = chunked`), not Liger's fused loss.
        if self.cfg.framework == crate::estimator::config::Framework::Torchtune {
            families::torchtune::head_and_loss(b, x, xn, w, bias, self.compiled_loss(), self.cfg.kernels == Kernels::Cpu);
            return;
        }
        if self.cfg.loss == Loss::Chunked {
            self.chunked_loss(b, xn, w);
            return;
        }
        if self.cfg.framework == crate::estimator::config::Framework::Torchtitan {
            families::torchtitan::head_and_loss(b, xn, w, bias, vocab, self.cfg.tp > 1, self.compiled_loss(), self.cfg.pp > 1);
            return;
        }
        // litgpt's `GPT` returns the logits; Fabric converts them to fp32 and `finetune/full.py`
        // runs `chunked_cross_entropy` on them.
        let prev = self.previous_micro_batch(b);
        if self.cfg.framework == crate::estimator::config::Framework::Litgpt {
            families::litgpt::head_and_loss(b, xn, w, bias, vocab, spec.softcap, prev);
            return;
        }
        let logits = match (w, self.head_quant(b)) {
            (Some(w), Some(q)) => {
                let l = b.linear4bit(xn, w, bias, vocab, q);
                families::common::head_done(b);
                l
            }
            _ => families::common::head_logits(b, xn, w, bias, vocab),
        };
        let logits = if spec.softcap { families::gemma::softcap_logits(b, logits) } else { logits };
        let logits = families::modeling_for(self.cfg.framework, spec.family).logits(b, logits);
        if spec.softcap && self.compiled_layers() {
            // Measured only in the compiled runs (FINDINGS §15.1, gemma2): the eager
            // soft-capping keeps two float64 0-dim scalars (16 B) beside its tanh result.
            let f64s = [b.out(Shape::scalar(), Dt::F64, false), b.out(Shape::scalar(), Dt::F64, false)];
            b.op("scalar_tensor", "", &[logits], &f64s, &[S::Out(0), S::Out(1)], &[]);
        }
        b.p.loss_fn_from = b.next_op();
        let loss_first = b.p.loss_fn_from;
        let lf = b.to_copy(logits, Dt::F32);
        // The loop's name for the previous output is rebound now: its graph goes.
        for t in prev {
            b.hold(t);
        }
        let labels = b.external(Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None), Dt::I64, Origin::Batch, false);
        let pad = b.plain("constant_pad_nd", &[labels], Shape::new(&[Dim::Q(Q::B), Dim::Plus1(Q::S)], Split::None), Dt::I64);
        let bs = Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None);
        // For b = 1 the shifted slice is already contiguous: no copy, the padded storage stays.
        let target = if self.cfg.batch > 1 { b.plain("clone", &[pad], bs, Dt::I64) } else { b.view(pad, bs, "", false) };
        let lsm = b.unary("_log_softmax", "LogSoftmaxBackward0", lf, super::blocks::Keep::Output, "_log_softmax_backward_data");
        let lb = b.bytes(lsm);
        let out = [b.out(Shape::scalar(), Dt::F32, true), b.out(Shape::scalar(), Dt::F32, false)];
        let r = b.op(
            "nll_loss_forward",
            "NllLossBackward0",
            &[lsm, target],
            &out,
            // `nll_loss_backward(grad, self, target, weight, reduction, ignore_index,
            // total_weight)`: `self` (the log-softmax, also LogSoftmaxBackward0's: one storage,
            // its own copy under `save_on_cpu`), the target and the total weight.
            &[S::In(0), S::In(1), S::Out(1)],
            &[B::Alloc { bytes: lb, dtype: DType::Fp32, op: "nll_loss_backward" }, B::Grad { input: 0, temp: 0 }],
        );
        // The loss function's locals and the caller's output go once the loss is computed.
        b.hold(lf);
        b.hold(pad);
        b.hold(logits);
        b.outputs(&[r[0]]);
        if self.compiled_loss() {
            let end = b.next_op();
            b.fuse_loss_backward(loss_first, end, logits, b.bytes(target) / 8, self.cfg.compiles_whole_model());
            b.compile_region(loss_first, end, &[r[0]]);
        }
    }

    /// The LM head's 4-bit base, when Lightning's plugin quantized it (`qlora_lightning`,
    /// [`crate::estimator::params::lightning_head`]).
    fn head_quant(&self, b: &Builder) -> Option<super::ir::Quant4> {
        let quantized = self.groups.iter().any(|g| g.role == Role::Quantized && g.group.part == crate::estimator::model::Part::LmHead);
        b.lowbit.quant.filter(|_| quantized)
    }

    /// What the previous micro-batch still holds while this one's forward runs
    /// (`holds_prev_logits`): litgpt's `fit` (`finetune/lora.py`, litgpt fd71063 of
    /// 2024-07-24) binds the model's output to `logits` and rebinds it only when the next
    /// `model(...)` returns, so the previous output and its autograd graph live through the
    /// next forward. Of that graph only what autograd does not release after backward stays:
    /// bitsandbytes 0.42.0's `MatMul4Bit.forward` keeps `ctx.tensors = (A, B)` as a plain
    /// attribute (not `save_for_backward`), so with `bnb_keeps_input` every 4-bit linear's
    /// bf16 input stays — one per distinct input a decoder layer feeds its 4-bit linears
    /// (q/k/v's, o's, gate/up's, down's: the input widths h, a·d, h, f for a Llama layer) and
    /// the LM head's (h) when it is 4-bit. Returns the previous fp32 logits `[b, s, V]`
    /// (Fabric's `convert_output`) and the kept inputs `[b, s, Σ widths]` in bf16, allocated
    /// here (at the LM head: the forward's activations only grow until there) and freed when
    /// this micro-batch's fp32 logits exist.
    ///
    /// Toy: 2 layers of h = 8, a·d = 8, f = 16, an untied 4-bit head, b·s = 4: kept
    /// 4 · (2 · (8 + 8 + 8 + 16) + 8) · 2 = 704 B; with V = 32 the logits 4 · 32 · 4 = 512 B.
    fn previous_micro_batch(&self, b: &mut Builder) -> Vec<Tid> {
        if !self.cfg.holds_prev_logits {
            return Vec::new();
        }
        let part = b.part;
        b.part = Part::Loss;
        let logits = b.plain("previous logits (fp32)", &[], Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::V)], Split::Tp), Dt::F32);
        let widths = if self.cfg.bnb_keeps_input { kept_4bit_input_widths(&self.groups) } else { 0 };
        let kept = (widths > 0).then(|| {
            b.plain("previous MatMul4Bit inputs", &[], Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::W(widths)], Split::None), Dt::Bf16)
        });
        b.part = part;
        [Some(logits), kept].into_iter().flatten().collect()
    }

    /// FSDP2's `[norm, output]` unit (`sharding::head_unit`, torchtitan), whose ops start at
    /// `first` (the final norm's): gathered before it, its unsharded gradient made by the
    /// head's backward — the `lm_head` op whose node hands a trainable parameter its gradient,
    /// the last such in forward order (its node runs first).
    fn head_unit(&self, b: &mut Builder, first: u32) {
        let Some(u) = crate::estimator::sharding::head_unit(self.cfg, &self.recipe, &self.groups) else { return };
        let p = &b.p;
        let grad_op = (first as usize..p.ops.len())
            .rev()
            .find(|&i| {
                let op = &p.ops[i];
                let ins = p.ins(op);
                op.module == "lm_head"
                    && p.bw(op).iter().any(|st| {
                        matches!(*st, B::Grad { input, .. } if matches!(p.tensors[ins[input as usize] as usize].origin, Origin::Param { grad_bytes } if grad_bytes > 0))
                    })
            })
            .map_or(super::ir::NO_OP, |i| i as u32);
        b.p.units.push(super::ir::Unit {
            first,
            grad_op,
            params: u.params,
            param_dtype: DType::of(self.recipe.weight),
            grad: u.grad,
            reduce_input: u.reduce_input,
            fwd_last: super::ir::NO_OP,
            grad_param: super::ir::NO_OP,
            flat: 0,
            group: HEAD_GROUP,
            shard_grad: 0,
        });
    }

    /// FSDP2's root unit holding the embedding, the final norm and the output projection
    /// (`sharding::root_unit_bytes`, torchtune's distributed LoRA), in the whole program: gathered
    /// before its first op, resharded after the last op before the loss, gathered again when
    /// backward reaches the head, resharded when backward ends (after the embedding's, op 0's).
    /// Under `fsdp_root_reshard = false` (torch ≤ 2.7, which clamps the root to no reshard
    /// after forward) it stays gathered from its forward to the end of backward instead.
    /// It holds no trainable gradient (the adapters live in the layers' units).
    fn root_unit(&self, b: &mut Builder) {
        let Some(params) = crate::estimator::sharding::root_unit_bytes(self.cfg, &self.recipe, &self.groups) else { return };
        let fwd_last = b.p.loss_from.checked_sub(1).filter(|_| b.p.loss_from != u32::MAX);
        let Some(fwd_last) = fwd_last else { return };
        let fwd_last = if self.cfg.fsdp_root_reshard { fwd_last } else { super::ir::NO_OP };
        b.p.units.push(super::ir::Unit {
            first: 0,
            grad_op: super::ir::NO_OP,
            params,
            param_dtype: DType::of(self.recipe.weight),
            grad: 0,
            reduce_input: 0,
            fwd_last,
            grad_param: super::ir::NO_OP,
            flat: params,
            group: ROOT_GROUP,
            shard_grad: crate::estimator::sharding::root_grad_shard(self.cfg, &self.recipe, &self.groups),
        });
    }

    /// The full fine-tune's embedding and output units (`sharding::own_end_units`), in the whole
    /// program: one unit for each op that reads the weight (the embedding's lookup, each output
    /// chunk's matmul), gathered before it and resharded after it in forward, gathered again for
    /// its backward and resharded after it; the gradient, accumulated over the calls, held by the
    /// unit of the first call in forward (the last in backward), reduced after it.
    fn end_units(&self, b: &mut Builder) {
        use crate::estimator::sharding::end_unit;
        let loss_from = b.p.loss_from.min(b.p.ops.len() as u32);
        use crate::estimator::model::Part as Group;
        for part in [Group::Embedding, Group::LmHead] {
            let Some((params, grad, reduce)) = end_unit(self.cfg, &self.recipe, &self.groups, part) else { continue };
            // The weight: the parameter of exactly U bytes the ops before the loss read.
            let p = &b.p;
            let is_w = |t: Tid| matches!(p.tensors[t as usize].origin, Origin::Param { .. }) && p.tensors[t as usize].bytes == params;
            let calls: Vec<(u32, Tid)> = (0..loss_from)
                .filter_map(|i| {
                    let op = &p.ops[i as usize];
                    // The embedding's weight and an untied output's are the same size: the
                    // embedding's calls are its module's, the output's the model-level rest.
                    let module_ok = match part {
                        Group::Embedding => op.module == "tok_embeddings",
                        _ => op.layer == MODEL && op.module != "tok_embeddings",
                    };
                    p.ins(op).iter().copied().find(|&t| module_ok && is_w(t)).map(|t| (i, t))
                })
                .collect();
            let Some(&(first_call, w)) = calls.first() else { continue };
            // Each call's backward makes the weight's gradient unsharded (FSDP2 reduce-scatters
            // after the last): its temporary is the whole weight's, not a shard's.
            if grad > 0 {
                b.p.tensors[w as usize].origin = Origin::Param { grad_bytes: grad };
                for &(i, _) in &calls {
                    unshard_weight_grad(&mut b.p, i as usize, w, grad);
                }
            }
            let units: Vec<super::ir::Unit> = calls
                .iter()
                .map(|&(i, _)| {
                    let keeps = i == first_call;
                    super::ir::Unit {
                        first: i,
                        grad_op: super::ir::NO_OP,
                        params,
                        param_dtype: DType::of(self.recipe.weight),
                        grad: if keeps { grad } else { 0 },
                        reduce_input: if keeps { reduce } else { 0 },
                        fwd_last: i,
                        grad_param: if keeps && grad > 0 { w } else { super::ir::NO_OP },
                        flat: params,
                        group: if part == Group::Embedding { EMBEDDING_GROUP } else { HEAD_GROUP },
                        shard_grad: if keeps { crate::estimator::sharding::grad_shard(self.cfg, grad) } else { 0 },
                    }
                })
                .collect();
            b.p.units.extend(units);
        }
    }

    /// torchtune's distributed recipes (`sharding::tune_fsdp2`), in the whole program: each
    /// decoder layer an FSDP2 unit (`training.shard_model` wraps every `TransformerSelfAttentionLayer`,
    /// `reshard_after_forward=True`), its parameters — every parameter its forward ops read, the
    /// adapters and norms with the base — all-gathered in the parameter dtype before its first
    /// op, resharded after its last, gathered again when backward reaches it (before its
    /// checkpointed forward is recomputed) and resharded after its backward. Its gradient stays
    /// the per-parameter temporary it was. Measured (tests/fixtures/pytorch/fsdp/tune.json): the
    /// `layers.k` units of 123,136 B (full) and 126,720 B (LoRA on q and v, rank 8).
    fn layer_units(&self, b: &mut Builder) {
        if !crate::estimator::sharding::tune_fsdp2(self.cfg) {
            return;
        }
        let p = &b.p;
        let loss_from = p.loss_from.min(p.ops.len() as u32) as usize;
        // torchao's `NF4Tensor` bases (the weight of each `LinearNF4Backward`): FSDP2 gathers
        // their codes, scalers and factors, not the dequantized size the program gives them.
        let e = DType::of(self.recipe.weight).bytes();
        let mut nf4: Vec<Tid> = p.ops[..loss_from].iter().filter(|op| op.node == "LinearNF4Backward").map(|op| p.ins(op)[1]).collect();
        nf4.sort_unstable();
        let gathered = |t: Tid| {
            let bytes = p.tensors[t as usize].bytes;
            if nf4.binary_search(&t).is_ok() {
                crate::estimator::statics::torchao_nf4_gathered_bytes((bytes / e as u128) as u64, e)
            } else {
                bytes
            }
        };
        // Per layer: its first and last forward op, and the parameters they read (each once).
        let mut spans: Vec<(u32, u32, Vec<Tid>)> = Vec::new();
        for (i, op) in p.ops[..loss_from].iter().enumerate() {
            if op.layer == MODEL {
                continue;
            }
            let k = op.layer as usize;
            if spans.len() <= k {
                spans.resize(k + 1, (u32::MAX, 0, Vec::new()));
            }
            let span = &mut spans[k];
            span.0 = span.0.min(i as u32);
            span.1 = span.1.max(i as u32);
            for &t in p.ins(op) {
                if matches!(p.tensors[t as usize].origin, Origin::Param { .. }) && !span.2.contains(&t) {
                    span.2.push(t);
                }
            }
        }
        // Every layer's shard is the same (torchtune's layers are alike).
        let shard_grad = crate::estimator::sharding::layer_grad_shard(self.cfg, &self.recipe, &self.groups);
        let units: Vec<super::ir::Unit> = spans
            .iter()
            .enumerate()
            .filter(|(_, s)| s.0 != u32::MAX)
            .map(|(k, (first, last, params))| {
                let bytes: u128 = params.iter().map(|&t| gathered(t)).sum();
                super::ir::Unit {
                    first: *first,
                    grad_op: super::ir::NO_OP,
                    params: bytes,
                    param_dtype: DType::of(self.recipe.weight),
                    grad: 0,
                    reduce_input: 0,
                    fwd_last: *last,
                    grad_param: super::ir::NO_OP,
                    flat: bytes,
                    group: k as u32,
                    shard_grad,
                }
            })
            .collect();
        b.p.units.extend(units);
    }

    /// `compile = true` with `compile_regions = layer`: each decoder layer and the loss are
    /// compiled regions ([`super::compile`]). Under `framework = torchtitan` that is torchtitan
    /// 0.2.2's default (`compile.components = ["model", "loss"]`: `apply_compile` compiles each
    /// `TransformerBlock`, its checkpoint wrapper inside, and `build_cross_entropy_loss` the
    /// loss); `compile_regions = block` compiles the blocks alone (`components = ["model"]`, the
    /// loss eager: torchtitan before it compiled its loss).
    ///
    /// `compile_regions = model` (the Trainer's `torch.compile(model)`, one graph): partitioned
    /// here as the layer regions, the loss's and one for the final norm and the head
    /// ([`Self::compile_final_norm_and_head`]), with the graph's causal mask built and passed to
    /// SDPA (`families::common::graph_mask`) — FINDINGS §15.1.z.
    fn compiled_layers(&self) -> bool {
        use crate::estimator::config::{CompileRegions, Framework};
        self.cfg.compile
            && match self.cfg.compile_regions {
                CompileRegions::Layer | CompileRegions::Model => true,
                CompileRegions::Block => self.cfg.framework == Framework::Torchtitan,
            }
    }

    /// The loss compiled as its own region (`compile = true`, `compile_regions = layer`, and
    /// inside the whole graph with `model`).
    fn compiled_loss(&self) -> bool {
        use crate::estimator::config::CompileRegions;
        self.cfg.compile && matches!(self.cfg.compile_regions, CompileRegions::Layer | CompileRegions::Model)
    }

    /// The whole model one graph (`compile_regions = model`): the final norm and the LM head
    /// (ops `first` up to the loss) are partitioned too — the norm's normalized output is
    /// recomputed from its input and rstd, only the head's input crosses (measured:
    /// `recipes/llama-gqa.json` `compile=model`, FINDINGS §15.1.z).
    fn compile_final_norm_and_head(&self, b: &mut Builder, first: u32) {
        if !self.cfg.compiles_whole_model() {
            return;
        }
        let end = b.p.loss_fn_from;
        if end == u32::MAX || end <= first {
            return;
        }
        let logits = b.p.outs(&b.p.ops[end as usize - 1]).first().copied();
        if let Some(logits) = logits {
            b.compile_region(first, end, &[logits]);
        }
    }

    /// Fused linear cross-entropy (Liger): per chunk of rows, fp32 logits and their gradient
    /// exist briefly; the input's gradient is computed in forward and kept.
    fn chunked_loss(&self, b: &mut Builder, xn: Tid, w: Option<Tid>) {
        b.p.loss_from = b.next_op();
        b.module = "(root)";
        b.part = Part::Loss;
        let labels = b.external(Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None), Dt::I64, Origin::Batch, false);
        let chunk = Shape::new(&[Dim::X(X::Chunk), Dim::Q(Q::V)], Split::Tp);
        let logits = b.plain("mm", &[xn], chunk, Dt::F32);
        let grad = b.plain("_log_softmax_backward_data", &[logits], chunk, Dt::F32);
        b.hold(logits);
        let _ = grad;
        let gi = b.out(Shape::tok(Q::H), Dt::Model, false);
        let loss = b.out(Shape::scalar(), Dt::F32, true);
        let xb = b.bytes(xn);
        let xd = b.t(xn).dtype;
        let mut ins = vec![xn, labels];
        if let Some(w) = w {
            ins.push(w);
        }
        let wg = w.map_or(0, |w| b.grad_bytes(w));
        let mut bw = vec![B::Alloc { bytes: xb, dtype: xd, op: "mul" }, B::Grad { input: 0, temp: 0 }];
        if w.is_some_and(|w| b.rg(w)) {
            bw.push(B::Alloc { bytes: wg, dtype: b.t(w.unwrap_or(xn)).dtype, op: "mm" });
            bw.push(B::Grad { input: 2, temp: 1 });
        }
        let r = b.op(
            "fused_linear_cross_entropy",
            "LigerFusedLinearCrossEntropyFunctionBackward",
            &ins,
            &[gi, loss],
            &[S::Out(0), S::In(1)],
            &bw,
        );
        b.outputs(&[r[1]]);
    }
}

fn values_s(cfg: &Config) -> u64 {
    cfg.seq_per_gpu()
}

/// Collects the events of a run.
pub struct Collector {
    pub events: Vec<Event>,
    live: Bytes,
    next: u32,
    /// For frees: where each allocation came from.
    meta: Vec<(u16, &'static str)>,
}

impl Collector {
    pub fn new() -> Collector {
        Collector { events: Vec::new(), live: 0, next: 0, meta: Vec::new() }
    }

    /// A collector with room for `events` events (and as many allocations' origins), in the
    /// lists a replayed stream handed back on this thread ([`recycle`]) where there are some.
    pub fn with_capacity(events: usize) -> Collector {
        let (mut list, mut meta) = SPARE.with(|c| c.take());
        list.clear();
        list.reserve(events);
        meta.clear();
        meta.reserve(events);
        Collector { events: list, live: 0, next: 0, meta }
    }
}

/// A spare stream's event list and its metadata list, kept for the next step on this thread.
type Spare = (Vec<Event>, Vec<(u16, &'static str)>);

thread_local! {
    /// A stream's event list and its collector's origins, kept for the next [`Collector`] on
    /// this thread: freed, a stream's lists (a Llama-3.1-405B pp16 stage's ~270 KB) let glibc
    /// trim the heap, and the next step faulted them in again.
    static SPARE: std::cell::Cell<Spare> = const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

/// Hands a stream's event list, once read, to the next [`Collector`] on this thread.
pub fn recycle(events: Vec<Event>) {
    SPARE.with(|c| {
        let (_, meta) = c.take();
        c.set((events, meta));
    });
}

/// Hands a collector's origins to the next [`Collector`] on this thread.
fn recycle_meta(meta: Vec<(u16, &'static str)>) {
    SPARE.with(|c| {
        let (events, _) = c.take();
        c.set((events, meta));
    });
}

/// Events a tensor of a simulated program gives, about, in a step: its allocation and its free,
/// and its gradient's in backward (the presets' whole-stage programs give 3.4 per tensor on
/// average, at most 5.3). Sized for two, the collector regrew in every step: one copy of the
/// whole stream, ~5 % of a `reserved()` replay's instructions.
const EVENTS_PER_TENSOR: usize = 4;

/// [`super::ir::Unit::group`] of the units beyond the decoder layers (a layer's is its index).
const ROOT_GROUP: u32 = u32::MAX;
const HEAD_GROUP: u32 = u32::MAX - 1;
const EMBEDDING_GROUP: u32 = u32::MAX - 2;

impl Default for Collector {
    fn default() -> Self {
        Collector::new()
    }
}

fn layer_of(l: u16) -> Option<u32> {
    (l != NO_LAYER).then_some(l as u32)
}

impl Sink for Collector {
    fn alloc(&mut self, bytes: u128, dtype: DType, cat: Cat, at: &At) -> u32 {
        let id = self.next;
        self.next += 1;
        self.live += bytes;
        self.meta.push((at.layer, at.module));
        self.events.push(Event {
            kind: EventKind::Alloc,
            id,
            bytes,
            dtype,
            cat,
            phase: at.phase,
            layer: layer_of(at.layer),
            module: at.module,
            op: at.op,
            node: at.node,
            live: self.live,
        });
        id
    }
    fn free(&mut self, id: u32, bytes: u128, cat: Cat, at: &At) {
        if id == u32::MAX {
            return;
        }
        self.live = self.live.saturating_sub(bytes);
        let (layer, module) = self.meta.get(id as usize).copied().unwrap_or((NO_LAYER, ""));
        self.events.push(Event {
            kind: EventKind::Free,
            id,
            bytes,
            dtype: DType::Bool,
            cat,
            phase: at.phase,
            layer: layer_of(layer),
            module,
            op: at.op,
            node: at.node,
            live: self.live,
        });
    }
}

/// The trainable parameters of a program in registration order: (elements of the optimizer's
/// shard, bytes per state element).
pub fn optimizer_params(prog: &Program, weight: DType) -> Vec<u128> {
    // In units of the trainable recipe's weight ([`Setup::optimizer_weight`]: peft's fp32
    // adapters on a 16-bit QLoRA base): a parameter kept wider than it (an fp32 router in a
    // bf16 model) has states as wide as itself.
    prog.tensors
        .iter()
        .filter_map(|t| match t.origin {
            Origin::Param { grad_bytes } if grad_bytes > 0 => Some(t.bytes / weight.bytes().max(1) as u128),
            _ => None,
        })
        .collect()
}

/// [`optimizer_params`] of a whole model (embedding to head, `numels` built in that order) in
/// the order the model registered them: the head first where the modeling code registers it
/// first ([`families::modeling::Modeling::head_registered_first`]: litgpt's `GPT`).
pub fn registration_order(setup: &Setup, numels: &mut [u128]) {
    let spec = &setup.cfg.arch;
    let whole = setup.stage.has_embedding() && setup.stage.has_head();
    if whole && !spec.tied && families::modeling_for(setup.cfg.framework, spec.family).head_registered_first() {
        numels.rotate_right(1);
    }
}

/// The optimizer step's allocations after backward, per `optim` and `optim_impl`
/// (`torch/optim/adamw.py` → `adam.py`):
/// - for-loop (`_single_tensor_adam`): per parameter `exp_avg_sq.sqrt()` (temporary) and its
///   `/ bias_correction2_sqrt` (`denom`, kept by the Python name until the next parameter's
///   `denom` replaces it: freed one step late);
/// - foreach (`_multi_tensor_adam`): `torch._foreach_sqrt(exp_avg_sqs)` — one temporary per
///   parameter, all at once, freed at the end;
/// - fused: none. Other optimizers: `optimizer::step_temporary_bytes` as one temporary.
pub fn optimizer_events<S: Sink>(sink: &mut S, cfg: &Config, recipe: &Recipe, numels: &[u128], other_temp: Bytes) {
    let at = At { phase: Phase::Optimizer, layer: NO_LAYER, module: "", op: "", node: "" };
    if cfg.offload != crate::estimator::config::Offload::None {
        return;
    }
    let sh = Sharding::of(cfg);
    let shards = sh.ways(crate::estimator::sharding::OPTIMIZER_STATES_FROM).0 as u128;
    let recipe = &crate::estimator::precision::trainable_recipe(cfg, recipe);
    let state = if recipe.master.is_some() { 4 } else { recipe.state.bytes() as u128 };
    let dtype = if state == 4 { DType::Fp32 } else { DType::of(recipe.state) };
    let size = |n: u128| n.div_ceil(shards) * state;
    match (cfg.optim, crate::estimator::optimizer::step_impl(cfg)) {
        (Optimizer::Adamw, OptimImpl::Forloop) => {
            let mut prev: Option<(u32, u128)> = None;
            for &n in numels {
                let bytes = size(n);
                let s = sink.alloc(bytes, dtype, Cat::Transient, &At { op: "sqrt", ..at });
                let d = sink.alloc(bytes, dtype, Cat::Transient, &At { op: "div", ..at });
                sink.free(s, bytes, Cat::Transient, &at);
                if let Some((id, b)) = prev {
                    sink.free(id, b, Cat::Transient, &at);
                }
                prev = Some((d, bytes));
            }
            if let Some((id, b)) = prev {
                sink.free(id, b, Cat::Transient, &at);
            }
        }
        (Optimizer::Adamw, OptimImpl::Foreach) => {
            let ids: Vec<(u32, u128)> =
                numels.iter().map(|&n| (sink.alloc(size(n), dtype, Cat::Transient, &At { op: "_foreach_sqrt", ..at }), size(n))).collect();
            for (id, b) in ids {
                sink.free(id, b, Cat::Transient, &at);
            }
        }
        (Optimizer::Adamw, OptimImpl::Fused) => {}
        _ => {
            if other_temp > 0 {
                let id = sink.alloc(other_temp, dtype, Cat::Transient, &At { op: "step", ..at });
                sink.free(id, other_temp, Cat::Transient, &at);
            }
        }
    }
}

/// The largest extra the optimizer step holds above the gradients (what [`optimizer_events`]
/// peaks at), without emitting events.
pub fn optimizer_peak(cfg: &Config, recipe: &Recipe, numels: impl Iterator<Item = u128>, other_temp: Bytes) -> Bytes {
    let mut t = super::run::Tracker::default();
    let v: Vec<u128> = numels.collect();
    optimizer_events(&mut t, cfg, recipe, &v, other_temp);
    t.peak.max(0) as Bytes
}

/// Bytes resident through the step beside the stream (weights, optimizer states, buffers,
/// the batch, gradient buffers, resident gradients, other micro-batches' activations).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Resident {
    pub weights: Bytes,
    pub optimizer: Bytes,
    pub buffers: Bytes,
    pub batch: Bytes,
    /// DDP buckets, ZeRO reduce buckets; gradients themselves when they accumulate.
    pub gradients: Bytes,
    /// Activations of other micro-batches in flight on this stage.
    pub activations: Bytes,
}

impl Resident {
    pub fn total(&self) -> Bytes {
        self.weights + self.optimizer + self.buffers + self.batch + self.gradients + self.activations
    }
}

/// Model buffers (not parameters) on a stage: RoPE's `inv_freq` and `original_inv_freq`, fp32
/// (one pair per layer type in Gemma-3: `{layer_type}_inv_freq`, `Gemma3RotaryEmbedding`).
/// Gemma's embedding scale is a 0-dim buffer in the model dtype.
pub fn buffer_bytes(cfg: &Config) -> Bytes {
    let spec = &cfg.arch;
    if let Some(bytes) = families::torchtitan::buffer_bytes(cfg)
        .or_else(|| families::torchtune::buffer_bytes(cfg))
        .or_else(|| families::litgpt::buffer_bytes(cfg))
    {
        return bytes;
    }
    let code = families::modeling(spec.family);
    let pairs = if code.local_rope(spec) { 2 } else { 1 };
    let rope = if families::common::has_rope(spec) { pairs * 2 * (families::common::rotary_dims(spec) / 2) as u128 * 4 } else { 0 };
    let scale = if code.embed_scale_buffer() { crate::estimator::precision::recipe(cfg.precision).weight.bytes() as u128 } else { 0 };
    rope + scale + router_bias_buffer_bytes(cfg) + xielu_buffer_bytes(cfg)
}

/// xIELU's two 0-dim buffers (`beta`, `eps`: `register_buffer(..., torch.tensor(v, dtype=dtype))`
/// in `XIELUActivation.__init__`, transformers 5.24 `activations.py`), in the model dtype, in
/// every dense MLP of the (first) stage: 2 × weight bytes × L.
pub fn xielu_buffer_bytes(cfg: &Config) -> Bytes {
    let spec = &cfg.arch;
    if spec.act != crate::estimator::model::Activation::Xielu {
        return 0;
    }
    let layers = stage_layers(spec.layers, cfg.pp);
    let weight = crate::estimator::precision::recipe(cfg.precision).weight.bytes() as u128;
    XIELU_BUFFERS * weight * layers as u128
}

/// `beta` and `eps`: the buffers of one `XIELUActivation`.
const XIELU_BUFFERS: u128 = 2;

/// The sigmoid routers' `e_score_correction_bias` buffer, fp32 `[E]` in every MoE layer of the
/// (first) stage (modeling_deepseek_v3.py `DeepseekV3TopkRouter.__init__`, modeling_glm4_moe.py
/// `Glm4MoeTopkRouter.__init__`): E × FP32_BYTES × L_moe; in the model dtype where the family
/// creates it without a dtype (MiniMax-M2's `torch.zeros(num_local_experts)`).
pub fn router_bias_buffer_bytes(cfg: &Config) -> Bytes {
    let spec = &cfg.arch;
    if spec.router != crate::estimator::model::Router::Sigmoid || spec.experts == 0 {
        return 0;
    }
    let layers = stage_layers(spec.layers, cfg.pp);
    let elem = if families::modeling(spec.family).router_bias_fp32() {
        crate::estimator::precision::FP32_BYTES as u128
    } else {
        crate::estimator::precision::recipe(cfg.precision).weight.bytes() as u128
    };
    spec.moe_layers_in(0..layers) as u128 * spec.experts as u128 * elem
}

/// The batch on the GPU: `input_ids` `[b, s]` int64 (the labels are the same tensor).
pub fn batch_bytes(cfg: &Config, stage: Stage) -> Bytes {
    if stage.has_embedding() || stage.has_head() {
        cfg.batch as u128 * values_s(cfg) as u128 * 8
    } else {
        0
    }
}

/// Simulates one stage's step and returns its stream (steady state: the second step on).
pub fn simulate_stage(cfg: &Config, recipe: &Recipe, stage: Stage, resident: Resident, other_temp: Bytes) -> Stream {
    let setup = Setup::new(cfg, recipe, stage);
    let prog = setup.whole();
    simulate_program(cfg, recipe, &setup, &prog, resident, other_temp)
}

/// A stage's whole program run through forward and backward into `sink`, as the stage's setup
/// asks (gradients resident, the optimizer step in backward's hooks, activation offloading):
/// what [`simulate_program`] and the coarse whole-stage run of `fast.rs` both step through
/// before the optimizer.
pub fn forward_and_backward<'p, S: Sink>(setup: &Setup, prog: &'p Program, sink: S) -> Run<'p, S> {
    let mut run = Run::new(prog, sink, setup.accumulate);
    let grads = setup.grad_mode();
    if grads.resident {
        run.grads_resident();
    }
    if let Some(u) = grads.upcast {
        run.upcast_gradients(u);
    }
    if let Some(hook) = setup.step_hook() {
        run.step_in_backward(hook, &[]);
    }
    if let Some(off) = setup.offload() {
        run.offload(off);
    }
    if let Some(lo) = setup.layer_offload() {
        run.layer_offload(lo);
    }
    run.forward();
    run.end_forward();
    run.inject(true);
    run.backward();
    run.release_graph();
    run.finish_backward();
    run
}

/// [`simulate_stage`] of a stage's program already built (`setup.whole()`).
pub fn simulate_program(cfg: &Config, recipe: &Recipe, setup: &Setup, prog: &Program, resident: Resident, other_temp: Bytes) -> Stream {
    let run = forward_and_backward(setup, prog, Collector::with_capacity(EVENTS_PER_TENSOR * prog.tensors.len()));
    let grads = run.param_grad_ids();
    let mut sink = run.into_sink();
    // The step's first backward under torchtitan's FSDP2 with pipeline parallelism is not the
    // last: no optimizer step follows it.
    if !cfg.optim_in_bwd && !setup.first_backward {
        let mut numels = optimizer_params(prog, setup.optimizer_weight());
        registration_order(setup, &mut numels);
        optimizer_events(&mut sink, cfg, recipe, &numels, other_temp);
    }
    let at = At { phase: Phase::ZeroGrad, layer: NO_LAYER, module: "", op: "", node: "" };
    for (id, bytes) in grads {
        sink.free(id, bytes, Cat::Gradients, &at);
    }
    let res = resident.total();
    let (peak_index, live) =
        sink.events.iter().enumerate().fold((0, 0), |(bi, bl), (i, e)| if e.live > bl { (i, e.live) } else { (bi, bl) });
    recycle_meta(sink.meta);
    Stream { resident: res, events: sink.events, peak_index, peak: res + live }
}

/// How a run treats parameter gradients: resident outside the stream ([`resident_grads`]),
/// and cast to fp32 as FSDP2 accumulates them ([`grad_upcast`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GradMode {
    pub resident: bool,
    pub upcast: Option<super::run::Upcast>,
}

/// [`GradMode`] of `cfg` (`first_backward`: [`Setup::first_backward`]). Under torchtitan's
/// FSDP2 with pipeline parallelism ([`crate::estimator::sharding::keeps_stage_gathered`]) every
/// gradient is cast to fp32 as FSDP2 accumulates it unreduced ([`super::run::Upcast`]): added
/// into the resident accumulators by a later backward, kept as them by the first or only one.
pub fn grad_mode(cfg: &Config, first_backward: bool) -> GradMode {
    use super::run::Upcast;
    if !crate::estimator::sharding::keeps_stage_gathered(cfg) {
        return GradMode { resident: resident_grads(cfg), upcast: None };
    }
    let later = crate::estimator::sharding::accumulators_resident(cfg, first_backward);
    GradMode { resident: later, upcast: Some(if later { Upcast::Added } else { Upcast::Kept }) }
}

/// Whether the gradients are resident outside the stream (gradient accumulation, ZeRO-2/3
/// partitions): each new parameter gradient is then a temporary added into them.
pub fn resident_grads(cfg: &Config) -> bool {
    // torchtitan's FSDP2 under pipeline parallelism reduces nothing until the last micro-batch:
    // a later backward finds its fp32 accumulators resident ([`grad_mode`]).
    if crate::estimator::sharding::keeps_stage_gathered(cfg) {
        return crate::estimator::sharding::accumulators_resident(cfg, false);
    }
    // Gradient accumulation keeps the gradients of the micro-batches before; ZeRO-2/3 (FSDP)
    // reduce-scatter each gradient as its bucket fills and keep only their shard, resident.
    // With parameter offload each gradient is copied to the host once reduced and its GPU copy
    // dropped, on one GPU too (validation/FINDINGS.md §13): the resident gradients are the
    // host's.
    let sh = Sharding::of(cfg);
    let offloaded = cfg.offload == crate::estimator::config::Offload::OptimizerParams && sh.stage == 3;
    cfg.accum > 1 || sh.splits(crate::estimator::sharding::GRADIENTS_FROM) || offloaded
}

/// In op `i`'s backward script, the temporary that becomes parameter `w`'s gradient is `bytes`
/// large (the `Alloc` numbered as the `Grad` step handing it to `w` names it).
fn unshard_weight_grad(p: &mut Program, i: usize, w: Tid, bytes: u128) {
    let ins: Vec<Tid> = p.ins(&p.ops[i]).to_vec();
    let (start, len) = (p.ops[i].bw.0 as usize, p.ops[i].bw.1 as usize);
    let temps: Vec<u8> = p.script[start..start + len]
        .iter()
        .filter_map(|st| match *st {
            B::Grad { input, temp } if ins.get(input as usize) == Some(&w) => Some(temp),
            _ => None,
        })
        .collect();
    let mut k = 0u8;
    for st in &mut p.script[start..start + len] {
        if let B::Alloc { bytes: b, .. } = st {
            if temps.contains(&k) {
                *b = bytes;
            }
            k += 1;
        }
    }
}

/// Which trainable parameter tensors a program has (for tests).
pub fn trainable(prog: &Program) -> usize {
    prog.tensors.iter().filter(|t| matches!(t.origin, Origin::Param { grad_bytes } if grad_bytes > 0)).count()
}

/// Per token, the elements of the distinct inputs of the 4-bit linears in `groups` (what
/// bitsandbytes before 0.43.2 keeps, [`Setup::previous_micro_batch`]): a decoder layer's
/// q/k/v (or fused qkv) share one input, gate/up (or fused gate_up) another, o and down each
/// their own, each of its linear's input width; summed over the layers that have them, plus
/// the LM head's input width when it is 4-bit. Stacked experts are left out.
///
/// Toy: 2 layers with q, k, v, o of `[8, 8]`, gate, up `[16, 8]`, down `[8, 16]` and a 4-bit
/// head `[32, 8]`: 2 · (8 + 8 + 8 + 16) + 8 = 88.
pub fn kept_4bit_input_widths(groups: &[LocalGroup]) -> u64 {
    use crate::estimator::model::Linear;
    let mut class = [0u64; 4];
    let mut head = 0u64;
    for g in groups.iter().filter(|g| g.role == Role::Quantized && !g.expert && g.group.shape.len() == 2) {
        let width = g.group.shape[1];
        let Some(lin) = g.group.linear else {
            if g.group.part == crate::estimator::model::Part::LmHead {
                head = head.max(width);
            }
            continue;
        };
        let i = match lin {
            Linear::Q | Linear::K | Linear::V | Linear::Qkv => 0,
            Linear::O => 1,
            Linear::Gate | Linear::Up | Linear::GateUp => 2,
            Linear::Down => 3,
        };
        class[i] = class[i].max(g.group.count * width);
    }
    class.iter().sum::<u64>() + head
}

/// Role check helper for the groups (frozen or trainable).
pub fn trains(g: &LocalGroup) -> bool {
    g.role == Role::Trainable
}

/// Attention implementation helper.
pub fn eager(cfg: &Config) -> bool {
    cfg.attn == Attention::Eager
}

/// Whether model layer `i`, the `local`-th of its stage's layers, is fully checkpointed
/// while other layers are not: one of every `recompute_every` ([`every_nth`]), or, with
/// `recompute_layers = N` (Megatron's block method), one of the first N of its virtual stage —
/// Megatron-LM d98e8a6 (2026-08) `megatron/core/recompute.py` `checkpointed_forward`,
/// `recompute_method == 'block'`: `layer_idx < recompute_num_layers` over the
/// `num_layers_per_pipeline_rank = len(self.layers)` of each model chunk's `TransformerBlock`
/// (all of them when N is larger), a chunk here being [`virtual_stage_layers`] consecutive
/// layers of the stage's program (interleaving places a stage's chunks apart in the model;
/// their sizes are equal). Under FP8 Megatron moves the window past layers whose input needs no gradient; the
/// first stage's embedding output needs one, so nothing moves in full training.
pub fn checkpointed_alone(cfg: &Config, i: usize, local: usize) -> bool {
    if cfg.recompute_layers > 0 {
        let chunk = virtual_stage_layers(cfg.arch.layers, cfg.pp, cfg.vpp) as usize;
        return (local % chunk) < cfg.recompute_layers as usize;
    }
    every_nth(cfg, i)
}

/// The layers of `stage` that [`checkpointed_alone`] picks, and of the others how many are dense
/// and how many MoE ([`stage_kinds`]).
pub fn checkpointed_alone_counts(cfg: &Config, stage: Stage) -> (u64, u64, u64) {
    let (first, kinds) = stage_kinds(cfg, stage);
    kinds.iter().enumerate().fold((0, 0, 0), |(c, d, m), (i, k)| match (checkpointed_alone(cfg, first + i, i), k) {
        (true, _) => (c + 1, d, m),
        (false, Kind::Dense) => (c, d + 1, m),
        (false, Kind::Moe) => (c, d, m + 1),
    })
}

/// Whether model layer `i` is one of every `recompute_every` fully checkpointed: torchtitan
/// v0.2.2 `_apply_layer_sac` counts blocks from 1 and wraps the block when `count % N == 0`
/// (layers N−1, 2N−1, … by index); transformers 5.24 `_set_gradient_checkpointing` wraps
/// `layer_index % N == 0` (layers 0, N, 2N, …: `recompute_every_first`).
pub fn every_nth(cfg: &Config, i: usize) -> bool {
    let n = cfg.recompute_every as usize;
    let k = if cfg.recompute_every_first { i } else { i + 1 };
    n > 0 && k % n == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::config::{Finetune, Precision};
    use crate::estimator::params::stages;
    use crate::estimator::presets::presets;

    #[test]
    fn megatrons_block_method_picks_the_first_layers_of_each_virtual_stage() {
        // 16 layers on a stage of pp 2 × vpp 2: virtual stages of 8; N = 3 → 0, 1, 2, 8, 9, 10.
        let cfg = Config { recompute: Recompute::Full, recompute_layers: 3, pp: 2, vpp: 2, ..Config::default() };
        let picked: Vec<usize> = (0..16).filter(|&i| checkpointed_alone(&cfg, i, i)).collect();
        assert_eq!(picked, [0, 1, 2, 8, 9, 10]);
        assert_eq!(checkpointed_alone_counts(&cfg, Stage::First), (6, 10, 0));
        // Without it, recompute_every's rule (torchtitan's N−1, 2N−1, …).
        let every = Config { recompute_every: 3, ..Config::default() };
        assert_eq!((0..9).filter(|&i| checkpointed_alone(&every, i, i)).collect::<Vec<_>>(), [2, 5, 8]);
    }

    #[test]
    fn a_stage_whose_later_layers_are_copied_is_the_program_built_layer_by_layer_on_every_preset() {
        let mut n = 0;
        for p in presets() {
            let mut arch = p.spec.clone();
            // Enough layers for every preset's pattern of kinds and variants (Gemma-3's sliding
            // window every sixth, Llama 4's interleaved MoE) to repeat.
            arch.layers = arch.layers.min(14);
            arch.dense_layers = arch.dense_layers.min(2);
            arch.vocab = arch.vocab.min(4096);
            let base = Config { model: "custom".into(), arch, seq: 128, batch: 2, ..Config::default() };
            for cfg in [
                base.clone(),
                Config { recompute: Recompute::Full, attn: Attention::Eager, ..base.clone() },
                Config { recompute: Recompute::Selective, precision: Precision::MixedBf16, ..base.clone() },
                Config { finetune: Finetune::Lora, kernels: Kernels::Cpu, ..base.clone() },
                Config { pp: 2, gpus: 2, accum: 2, ..base.clone() },
            ] {
                let r = crate::estimator::precision::recipe(cfg.precision);
                for &stage in stages(cfg.pp) {
                    let setup = Setup::new(&cfg, &r, stage);
                    let (copied, built) = crate::estimator::expr::numbers_only(|| (setup.whole(), setup.whole_with(false)));
                    assert_eq!(format!("{copied:?}"), format!("{built:?}"), "{} {stage:?}", p.id);
                    n += 1;
                }
            }
        }
        assert!(n > 100, "{n}");
    }
}
