//! "Verify on your GPU": a self-contained PyTorch script that trains the configured model for
//! three steps and prints what it measured beside what trainmem predicts, and the comparison of
//! its JSON output with a fresh estimate (`trainmem compare`).
//!
//! # The script
//!
//! [`verify_script`] renders `template.py` with the configuration filled in: the model's
//! `config.json` (exported by [`crate::estimator::hf_export`], exactly the configured
//! architecture), the recipe (parameter dtype, autocast, loss scaler, master weights), the
//! optimizer and its torch implementation (`fused=True`, `foreach=True` or the single-tensor
//! loop), the attention implementation, checkpointing, activation offloading, dropout,
//! micro-batch, sequence length and gradient-accumulation steps, and trainmem's predictions for
//! both `kernels=cuda` and `kernels=cpu`. It needs `torch` and `transformers` (on a GPU also `accelerate`, which
//! `from_pretrained(device_map=…)` needs, and `torchao` for FP8). Nothing is downloaded.
//!
//! # Loading (`load = from-pretrained`, the default)
//!
//! The model is built with random weights on the CPU (`AutoConfig.for_model` +
//! `AutoModelForCausalLM.from_config`, in the configured dtype), saved with `save_pretrained`
//! (safetensors) to a temporary directory, freed, and loaded as a user loads a checkpoint:
//! `from_pretrained(tmp, dtype=…, device_map=<device>)` (transformers 5.24: its
//! `caching_allocator_warmup` reserves one block of the parameter bytes, then each tensor is one
//! allocation — `src/estimator/loading.rs`). On CUDA the loading is measured on its own
//! (`reset_peak_memory_stats()` before it): `load_peak` = `max_memory_allocated()`, predicted by
//! `memory.load_allocated_peak`, and `load_reserved` = `max_memory_reserved()`, predicted by
//! `memory.load_reserved_peak` (`memory.load_peak`, the verdict's loading figure, adds the CUDA
//! context, which the script does not measure over the load). Then `torch.cuda.empty_cache()`
//! iff `empty_cache = true`, the peak statistics are reset and the steps run. On the CPU the
//! model still loads through `from_pretrained` (without `device_map` where accelerate is not
//! installed: the weights land on the CPU either way), so the CPU tests exercise the same path;
//! the loading fields are `null` there (no caching allocator) and a note says so.
//!
//! # The step
//!
//! On CUDA it measures, per step: `memory_allocated()` right after the model call (the output and
//! the loss still held), the peaks of forward, backward and optimizer step
//! (`reset_peak_memory_stats()` between phases), the peak of the whole step, the step's largest
//! `max_memory_reserved()` (`step_reserved_peak`: what the loading left reserved included,
//! `memory.step_reserved_peak`), and what nvidia-smi shows (pynvml's figure for this process,
//! else for the device, else `torch.cuda.mem_get_info()` total − free; the JSON says which);
//! `reserved_peak` is the whole run's, loading and steps (`memory.reserved_peak`). On CPU the
//! dispatch-level tracker of `validation/tracker.py` (embedded verbatim at build time)
//! gives the same fields from live storages (views of one storage counted once) plus the storages
//! alive before the step (parameters, optimizer states, buffers, the batch); reserved memory and
//! nvidia-smi do not apply there and are `null`. The third step is the steady state compared.
//!
//! # FP8 (`fp8 = torchao-tensorwise | torchao-rowwise`)
//!
//! After loading, torchao's `convert_to_float8_training` (torchao [`TORCHAO_VERSION`], the
//! release `src/estimator/step/lowbit.rs` follows) with
//! `Float8LinearConfig.from_recipe_name("tensorwise" | "rowwise")` and
//! `force_recompute_fp8_weight_in_bwd` from `fp8_recompute_weight`, its `module_filter_fn`
//! taking exactly the linears trainmem runs in FP8 ([`fp8_linears`]: the projections of each
//! decoder layer whose step program runs `_scaled_mm`, both dims multiples of 16; the
//! embeddings, the LM head, norms, routers and any other linear stay in the recipe's dtype).
//! The script refuses at run time, naming the key, where one of those is not a `torch.nn.Linear`
//! in transformers' model (GPT-2's `Conv1D`: torchao would not convert it), off CUDA (the CPU
//! tracker does not see inside torchao's `Float8TrainingTensor`; `validation/measure_fp8.py`
//! measures FP8 on the CPU with a subclass-aware tracker), without torchao, and below compute
//! capability 8.9 (`torch._scaled_mm` has no FP8 GEMM there); another torchao version is noted.
//!
//! # What the script refuses
//!
//! It runs one process on one device with plain PyTorch and transformers, so these are refused
//! by [`reproducible`] with an error naming the key rather than approximated: more than one GPU
//! (`gpus`, `tp`, `pp`, `cp`, `ep`), ZeRO/FSDP sharding (`zero`), CPU offload (`offload`), LoRA
//! and QLoRA (`finetune`: trainmem's adapter layout would have to be rebuilt module by module
//! with peft, and QLoRA needs bitsandbytes on CUDA; not done yet), optimizers torch does not ship
//! (`optim` = lion, adam8bit, muon), Adafactor with `optim_impl=fused` (torch has no fused
//! Adafactor), a multi-tensor `foreach` step with master weights (`optim_impl`, see below),
//! Megatron's selective recomputation
//! (`recompute=selective`), Megatron's modules (`framework=megatron`) and fused/chunked
//! cross-entropy (`loss=chunked`) and the step in backward with a loss scaler (`optim_in_bwd` with `amp-fp16`; with master
//! weights, and compile regions other than a layer, the estimate refuses first). Issue 27's
//! recipes that need several processes — the sharded loaders (`load` = `meta-sharded`, FSDP2's
//! meta-device init and sharded load; `zero-init`, DeepSpeed's `zero.Init`) and FSDP2's FP8
//! all-gather (`fp8_allgather`) — and Transformer Engine's FP8 (`fp8` = `te-delayed`,
//! `te-current`, `te-mxfp8`; `fp8_model_init`; `precision=mixed-fp8`, which stands for
//! `te-delayed`: transformers' models use `torch.nn.Linear`, and replacing them with `te.Linear`
//! is not reproduced) are refused by their keys; `load = quantize-on-load` needs QLoRA's
//! bitsandbytes base, refused with `finetune`. FlashAttention-2 (`attn=flash`) is generated, and
//! the script refuses at run time when `flash_attn` or CUDA is missing; `compile = true` is
//! refused at run time on the CPU, where the dispatch tracker would make torch.compile run its
//! regions eagerly.
//!
//! Issue 26's recipes are applied as validation/measure_recipes.py applies them: `recompute=op`
//! wraps every decoder layer in `torch.utils.checkpoint` (non-reentrant, no early stop) under
//! torchtitan 0.3.0's `SelectiveAC` policy (`_get_default_save_ops`, every second matmul
//! recomputed; the CPU's SDPA kernel in the list with `sac_cpu_sdpa`); `recompute_every = N`
//! checkpoints the layers whose 1-based count N divides (torchtitan v0.2.2 `_apply_layer_sac`),
//! or layers 0, N, 2N, … with early stop (`recompute_every_first`, transformers'
//! `every_n_layers`); `optim_in_bwd` builds one optimizer per parameter, stepped and zeroed in its
//! post-accumulate-grad hook (torchtune 0.6.1 `register_optim_in_bwd_hooks`); `compile` compiles
//! each decoder layer (`layer.compile()`) and the loss function (torchtune's regions).
//!
//! # Activation offloading (`act_offload = torchtune | save_on_cpu`)
//!
//! As `validation/measure_recipes.py` (`measure_offload`) applies it. `torchtune`: torchtune
//! 0.6.1's `training/_activation_offloading.py` `OffloadActivations` (pinned, streams on,
//! `max_fwd_stash_size = 5`, `min_offload_size = 1024`) around the model call only, the output
//! head under a `NoOpManager` (a forward pre-hook enters it, a forward hook leaves it, as
//! `get_act_offloading_ctx_manager`), the loss (`model.loss_function` on the logits) outside, as
//! torchtune's recipes run it; on CUDA torchtune's own class where torchtune imports (it needs
//! torchao), else the script's copy of it (cited, line for line, less its psutil warning, NF4 path
//! and logger: the script needs only torch and transformers). `save_on_cpu`:
//! `torch.autograd.graph.save_on_cpu(pin_memory=True)` around the model call, transformers' loss
//! inside. One context per forward pass (torchtune keeps one for the run: the same where backward
//! unpacks every tensor it packed). On the CPU both run as measure_recipes.py's ports
//! (`CpuOffloadActivations`, `CpuSaveOnCpu`): streams and events are no-ops, the "pinned" host
//! copy is made with every dispatch mode off (outside the tracker's view: host memory), the copy
//! back to the device is a tracked allocation. The host bytes are counted at the pack hook (each
//! host copy's storage, + at the copy, − when freed): `host_offloaded` is what the last forward
//! pass copied, predicted by the estimate's `offloaded_activations` host row (in `memory.host`,
//! beside anything else on the host); it is `null` without offloading. The estimate refuses
//! offloading with activation checkpointing, and so the script does too.
//!
//! `act_offload_layers = n` (Transformer Engine's per-layer offloading, Megatron's
//! `--cpu-offloading-num-layers`): the script's copy of Transformer Engine 2.20.2's context
//! (`te_layer_offload`, as `validation/measure_recipes.py` `CpuTeLayerOffload` ports it) around
//! each decoder layer, its synchronization function on the layer's output, as Megatron-Core's
//! `TransformerBlock` applies it; `host_offloaded` counts its host copies. The estimate accepts it
//! around transformers' layers with eager attention only (with SDPA Transformer Engine's
//! `start_offload` raises), and so the script does too.
//!
//! # Recipes
//!
//! `fp32`, `bf16`, `fp16`: the model built in that dtype, torch's optimizer on its parameters
//! (`fp16` runs without a loss scaler: torch's `GradScaler` refuses fp16 gradients).
//! `amp-bf16`, `amp-fp16`: an fp32 model under `torch.autocast`, with `GradScaler` for fp16.
//! `mixed-bf16`, `mixed-fp16`: bf16/fp16 weights and gradients, fp32 master weights and optimizer
//! states; the script casts one gradient at a time to fp32 and steps that tensor's master
//! (`fused` or the for-loop; at most one fp32 gradient of the largest tensor beyond the ledger,
//! which the JSON notes say). `mixed-bf16-fp32grad`: gradients accumulate into fp32 main grads
//! (a post-accumulate-grad hook per parameter, as Megatron's `main_grad`), one optimizer steps
//! the fp32 masters.
//!
//! # The JSON (schema `trainmem-verify`, version 2)
//!
//! `schema`, `version`; `generated_by`; `query` (the configuration as the share link's query);
//! `model`, `model_type`, `hf_config`; `kernels` (`cuda` or `cpu`: which predictions apply);
//! `device` {`type`, `name`, `total_bytes`, `compute_capability`}; `versions` {`python`,
//! `torch`, `transformers`, `cuda`, `torchao`}; `method` {`allocated`, `nvidia_smi`,
//! `alloc_conf`, `load`}; `parameter_count` {`built`, `trainmem`}; `load` (the loading's record:
//! `device_map`, `empty_cache`, its peaks, what was allocated and reserved after it); `fp8` (the
//! linears converted, or `null`); `steps` (one object per step with every field and where the
//! peak was); `steady_step`; `fields`: for each of [`FIELDS`] {`measured`, `predicted`} in
//! bytes (`null` where it does not apply; [`CUDA_ONLY`] on the CPU, [`OFFLOAD_ONLY`] without
//! `act_offload`); `act_offload` ({`kind`, `implementation`, `torchtune`} or `null`); `notes`.
//! Version 1 (before issue 27) built the model in place and had no loading fields; `trainmem
//! compare` still reads it. `host_offloaded` came later within version 2: a record without it
//! reads as not measured.

pub mod compare;
pub mod serve;

use crate::config::{
    self, ActOffload, Attention, Config, Finetune, Fp8, Framework, Kernels, Load, Loss, Offload, OptimImpl, Optimizer, Precision,
    Recompute, Zero,
};
use crate::estimator::hf_export::{self, ExportError};
use crate::estimator::ledger::Bytes;
use crate::estimator::{self, EstimateError};
use serde::Serialize;
use serde_json::{json, Value};

/// The script's template (placeholders `__NAME__`, filled by [`verify_script`]).
const TEMPLATE: &str = include_str!("template.py");
/// `validation/tracker.py` itself, embedded at build time (the script and the fixtures measure
/// with the same tracker; no copy to keep in sync).
pub const TRACKER: &str = include_str!("../../validation/tracker.py");
/// Where [`TRACKER`] was copied from: the measure branch's commit that last changed it.
pub const TRACKER_COMMIT: &str = "ae262ace6ac82733293719f880aa29271486a72e";
/// The version of the script's JSON document.
pub const SCHEMA_VERSION: u64 = 2;
/// The `schema` field of the script's JSON document.
pub const SCHEMA: &str = "trainmem-verify";
/// The fields measured and predicted, in the order they are printed: the loading's, then the
/// step's, then the whole run's.
pub const FIELDS: [&str; 11] = [
    "load_peak",
    "load_reserved",
    "after_forward",
    "forward_peak",
    "backward_peak",
    "step_peak",
    "peak",
    "step_reserved_peak",
    "reserved_peak",
    "nvidia_smi",
    "host_offloaded",
];
/// The fields that apply to the caching allocator only: `null` on the CPU.
pub const CUDA_ONLY: [&str; 5] = ["load_peak", "load_reserved", "step_reserved_peak", "reserved_peak", "nvidia_smi"];
/// The fields that apply to activation offloading only (`act_offload`): `null` without it.
pub const OFFLOAD_ONLY: [&str; 1] = ["host_offloaded"];
/// The torchao release whose `Float8Linear` trainmem follows (`fp8 = torchao-*`, see
/// `src/estimator/step/lowbit.rs`); the script notes another.
pub const TORCHAO_VERSION: &str = "0.18.0";

/// Why no script can be generated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VerifyError {
    /// The script cannot reproduce this part of the configuration in one process.
    #[error("`{key}` = {value}: {reason}")]
    Refused { key: &'static str, value: String, reason: &'static str },
    /// The configuration is not valid.
    #[error(transparent)]
    Estimate(#[from] EstimateError),
    /// No transformers class builds the architecture.
    #[error(transparent)]
    Export(#[from] ExportError),
}

impl VerifyError {
    /// The configuration key at fault.
    pub fn key(&self) -> &'static str {
        match self {
            VerifyError::Refused { key, .. } => key,
            VerifyError::Estimate(e) => e.key(),
            VerifyError::Export(_) => "model",
        }
    }
}

/// What trainmem predicts for the fields the script measures, bytes on one GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Predictions {
    /// `max_memory_allocated()` over `from_pretrained` (`memory.load_allocated_peak`;
    /// `kernels=cuda` only).
    pub load_peak: Option<Bytes>,
    /// `max_memory_reserved()` over `from_pretrained` (`memory.load_reserved_peak`;
    /// `kernels=cuda` only).
    pub load_reserved: Option<Bytes>,
    /// `memory_allocated()` right after the model call (output and loss held).
    pub after_forward: Bytes,
    /// The most allocated during the forward (model call and loss).
    pub forward_peak: Bytes,
    /// The most allocated during the backward.
    pub backward_peak: Bytes,
    /// The most allocated during the gradient reduction and the optimizer step.
    pub step_peak: Bytes,
    /// The most allocated at any moment of the step.
    pub peak: Bytes,
    /// `max_memory_reserved()` over the step, what the loading left reserved included
    /// (`memory.step_reserved_peak` + cuBLAS workspaces; `kernels=cuda` only).
    pub step_reserved_peak: Option<Bytes>,
    /// `max_memory_reserved()` over the whole run, loading and steps (`memory.reserved_peak` +
    /// cuBLAS workspaces; `kernels=cuda` only).
    pub reserved_peak: Option<Bytes>,
    /// What nvidia-smi shows for the process (`kernels=cuda` only).
    pub nvidia_smi: Option<Bytes>,
    /// The pinned host bytes activation offloading copies in one forward pass (the host row
    /// `offloaded_activations`, part of `memory.host`; `act_offload` only): every moved saved
    /// tensor at its own size, all alive when backward starts.
    pub host_offloaded: Option<Bytes>,
}

impl Predictions {
    /// The prediction of one of [`FIELDS`].
    pub fn get(&self, field: &str) -> Option<Bytes> {
        match field {
            "after_forward" => Some(self.after_forward),
            "forward_peak" => Some(self.forward_peak),
            "backward_peak" => Some(self.backward_peak),
            "step_peak" => Some(self.step_peak),
            "peak" => Some(self.peak),
            "load_peak" => self.load_peak,
            "load_reserved" => self.load_reserved,
            "step_reserved_peak" => self.step_reserved_peak,
            "reserved_peak" => self.reserved_peak,
            "nvidia_smi" => self.nvidia_smi,
            "host_offloaded" => self.host_offloaded,
            _ => None,
        }
    }
}

/// What trainmem predicts for the script's fields, from the step's op-level event stream of
/// `cfg` ([`estimator::step_stream`]): allocated bytes at an event = what is resident before the
/// step (parameters, optimizer states, buffers, the batch) + the stream's live bytes, plus the
/// cuBLAS/cuBLASLt workspaces, which the caching allocator hands out (`kernels=cuda` only).
///
/// - after forward: after the last event of the model call and its loss, the output and the
///   loss still held as the script holds them ([`estimator::after_forward_of`]);
/// - forward, backward and step peaks: the most allocated while those phases run — after each
///   of their events and at their start (the step = the gradient reduction, `optimizer.step()`
///   and `zero_grad`; a fused step that allocates nothing peaks where backward left off);
/// - peak: the most allocated at any event (`memory.allocated_peak` of the estimate);
/// - reserved and nvidia-smi (`kernels=cuda`): the loading and the step replayed through the
///   caching allocator ([`estimator::analyse`]): the step's reserved peak (what the loading
///   left reserved included) and the whole run's, each + the cuBLAS workspaces;
///   nvidia-smi = the step's reserved + CUDA context + cuBLAS workspaces + NCCL buffers — the
///   figure the verdict compares with the card;
/// - the loading (`kernels=cuda`): `max_memory_allocated()` and `max_memory_reserved()` over
///   `from_pretrained` (`memory.load_allocated_peak`, `memory.load_reserved_peak`; no GEMM has
///   run yet, so no cuBLAS workspace). `memory.load_peak`, the verdict's loading figure, is
///   nvidia-smi's (the CUDA context on top), which the script does not measure over the load;
/// - host offloaded (`act_offload`, either kernels): the host row `offloaded_activations` of
///   the estimate (`memory.host` holds it, with whatever else lives on the host): the pinned
///   bytes the hooks copy in one forward pass.
pub fn predictions(cfg: &Config) -> Result<Predictions, EstimateError> {
    use estimator::step::Phase as P;
    let stream = estimator::step_stream(cfg)?;
    let e = estimator::analyse(cfg)?.estimate;
    let cuda = cfg.kernels == Kernels::Cuda;
    let blas = if cuda { e.row(estimator::ledger::RowId::BlasWorkspaces).map_or(0, |r| r.bytes) } else { 0 };
    let at = |live: Bytes| stream.resident + live + blas;
    // The most allocated while a phase runs: after each of its events, and when it begins (the
    // level the previous event left: a fused optimizer step allocates nothing, so its peak is
    // what backward left — every gradient still alive until `zero_grad`).
    let max_in = |phases: &[P]| {
        let mut best: Option<Bytes> = None;
        let mut before: Bytes = 0;
        for ev in &stream.events {
            if phases.contains(&ev.phase) {
                let m = at(before).max(at(ev.live));
                best = Some(best.map_or(m, |b| b.max(m)));
            }
            before = ev.live;
        }
        best.unwrap_or(at(0))
    };
    // The same moment as `estimator::after_forward` (the output still held).
    let after_forward = estimator::after_forward_of(&stream) + blas;
    Ok(Predictions {
        after_forward,
        forward_peak: max_in(&[P::Forward, P::Loss]),
        backward_peak: max_in(&[P::Backward]),
        step_peak: max_in(&[P::Reduction, P::Optimizer, P::ZeroGrad]),
        peak: stream.events.iter().map(|ev| at(ev.live)).max().unwrap_or(at(0)),
        load_peak: cuda.then_some(e.memory.load_allocated_peak),
        load_reserved: if cuda { e.memory.load_reserved_peak } else { None },
        step_reserved_peak: if cuda { e.memory.step_reserved_peak.map(|r| r + blas) } else { None },
        reserved_peak: if cuda { e.memory.reserved_peak.map(|r| r + blas) } else { None },
        nvidia_smi: if cuda { e.memory.nvidia_smi } else { None },
        host_offloaded: (cfg.act_offload != ActOffload::None || cfg.act_offload_layers > 0)
            .then(|| e.host.iter().filter(|r| r.id == estimator::ledger::RowId::OffloadedActivations).map(|r| r.bytes).sum()),
    })
}

/// The configuration with `kernels` set.
fn with_kernels(cfg: &Config, kernels: Kernels) -> Config {
    Config { kernels, ..cfg.clone() }
}

/// Predictions for `cfg` on kernels `k`: `Ok(None)` when the estimate refuses an architecture it
/// does not model yet (the script still measures it).
pub fn predictions_for(cfg: &Config, kernels: Kernels) -> Result<Option<Predictions>, EstimateError> {
    let c = with_kernels(cfg, kernels);
    match predictions(&c) {
        Ok(p) => Ok(Some(p)),
        Err(EstimateError::Unmodelled { .. }) => Ok(None),
        Err(err) => Err(err),
    }
}

/// Checks that the script can reproduce `cfg` in one process on one device; the error names the
/// key (see the module doc for why each is refused).
pub fn reproducible(cfg: &Config) -> Result<(), VerifyError> {
    let refuse = |key: &'static str, reason: &'static str| Err(refusal(cfg, key, reason));
    const ONE_PROCESS: &str = "the script runs one process on one device; verify one GPU's share with gpus = 1";
    // Issue 27's recipes that need several processes or modules transformers' models do not
    // use, named before the parallel degrees that come with them.
    match cfg.load {
        Load::MetaSharded => {
            return refuse(
                "load",
                "FSDP2's meta-device init and sharded load run one process per GPU; the script runs one (it loads with from-pretrained)",
            )
        }
        Load::ZeroInit => {
            return refuse(
                "load",
                "DeepSpeed's zero.Init partitions the model over several processes; the script runs one (it loads with from-pretrained)",
            )
        }
        Load::FromPretrained | Load::QuantizeOnLoad => {}
    }
    if cfg.fp8_allgather {
        return refuse(
            "fp8_allgather",
            "the FP8 all-gather is FSDP2's, over several processes; the script runs one (verify fp8 without it)",
        );
    }
    if cfg.fp8_model_init {
        return refuse("fp8_model_init", NO_TE);
    }
    if cfg.fp8.te() {
        return refuse("fp8", NO_TE);
    }
    for (key, degree) in [("tp", cfg.tp), ("pp", cfg.pp), ("cp", cfg.cp), ("ep", cfg.ep), ("gpus", cfg.gpus)] {
        if degree > 1 {
            return refuse(key, ONE_PROCESS);
        }
    }
    if cfg.zero != Zero::Ddp {
        return refuse("zero", "the script runs plain PyTorch without DeepSpeed or FSDP sharding; use zero = 0");
    }
    if cfg.offload != Offload::None {
        return refuse("offload", "the script does not offload to the host (DeepSpeed's ZeRO-Offload is not plain PyTorch)");
    }
    if cfg.finetune != Finetune::Full {
        return refuse(
            "finetune",
            "the script does not build LoRA/QLoRA adapters yet (peft, and bitsandbytes on CUDA for QLoRA); verify the full fine-tune",
        );
    }
    match cfg.optim {
        Optimizer::Lion | Optimizer::Adam8bit | Optimizer::Muon => return refuse("optim", NO_SUCH_OPTIMIZER),
        Optimizer::Adafactor if cfg.optim_impl == OptimImpl::Fused => {
            return refuse("optim_impl", "torch.optim.Adafactor has no fused implementation; use foreach or forloop")
        }
        _ => {}
    }
    let master = matches!(cfg.precision, Precision::MixedBf16 | Precision::MixedFp16);
    if master && cfg.optim_impl == OptimImpl::Foreach {
        return refuse(
            "optim_impl",
            "with fp32 master weights the script steps one tensor at a time, so a multi-tensor foreach step cannot be reproduced; use fused or forloop",
        );
    }
    if cfg.load == Load::QuantizeOnLoad {
        return refuse(
            "load",
            "quantize-on-load quantizes QLoRA's NF4 base with bitsandbytes on CUDA, which the script does not build yet",
        );
    }
    if cfg.precision == Precision::MixedFp8 {
        return refuse("precision", NO_TE);
    }
    if cfg.recompute == Recompute::Selective {
        return refuse("recompute", "transformers has no selective recomputation (Megatron's); use none or full");
    }
    // The script runs transformers' modules: a prediction that follows another framework's own
    // model code (its CPU records: validation/measure_frameworks.py) would be compared with a
    // measurement of other code.
    match cfg.framework {
        Framework::Hf => {}
        Framework::Megatron => return refuse("framework", "the script runs transformers' modules; Megatron-LM's are not reproduced"),
        Framework::Torchtitan | Framework::Torchtune | Framework::Litgpt => {
            return refuse(
                "framework",
                "the script runs transformers' modules, not this framework's own model code (measured on the CPU by validation/measure_frameworks.py); verify transformers' with framework = hf",
            )
        }
    }
    // Issue 26's recipes: op-level checkpointing, every Nth layer, the step in backward and
    // per-layer compile are applied by the script. The estimate (checked first, in
    // `verify_script`) already refuses the step in backward with master weights and compile
    // regions other than a layer; a loss scaler is the script's own limit.
    if cfg.optim_in_bwd && cfg.precision == Precision::AmpFp16 {
        return refuse(
            "optim_in_bwd",
            "the script steps each parameter in its gradient hook (torchtune's optimizer_in_bwd), before a loss scaler could unscale it; use amp-bf16 or bf16",
        );
    }
    // Activation offloading (`act_offload` = torchtune | save_on_cpu, `act_offload_layers`:
    // Transformer Engine's per-layer context) is applied by the script.
    if cfg.optim_paged {
        return refuse("optim_paged", NO_SUCH_OPTIMIZER);
    }
    if cfg.loss == Loss::Chunked {
        return refuse("loss", "a fused/chunked cross-entropy (Liger, cut-cross-entropy) is not part of plain PyTorch");
    }
    Ok(())
}

const NO_SUCH_OPTIMIZER: &str = "torch ships no such optimizer (lion-pytorch, bitsandbytes and Muon's code are not plain PyTorch)";
const NO_TE: &str = "Transformer Engine's FP8 runs te.Linear modules; transformers' models use torch.nn.Linear, and replacing them \
                     with te.Linear is not reproduced (the script applies torchao's fp8 = torchao-tensorwise or torchao-rowwise)";

/// The refusal of `key` with its current value.
fn refusal(cfg: &Config, key: &'static str, reason: &'static str) -> VerifyError {
    VerifyError::Refused { key, value: config::get(cfg, key).unwrap_or_default(), reason }
}

/// The linears trainmem runs as torchao `Float8Linear`s, per decoder layer (module paths
/// relative to the layer, transformers' names): the projections whose step program runs
/// `_scaled_mm` (`src/estimator/step/lowbit.rs`: every projection of a decoder layer with both
/// dims multiples of 16; embeddings, the LM head, norms, routers and the other linears stay in
/// 16 bits). Empty without a torchao recipe.
pub fn fp8_linears(cfg: &Config) -> Vec<Vec<&'static str>> {
    if !cfg.fp8_recipe().torchao() {
        return Vec::new();
    }
    let whole = Config { tp: 1, pp: 1, cp: 1, ep: 1, gpus: 1, ..cfg.clone() };
    let recipe = estimator::precision::recipe(whole.precision);
    let prog = estimator::step::model::Setup::new(&whole, &recipe, estimator::params::Stage::Whole).whole();
    let mut layers: Vec<Vec<&'static str>> = vec![Vec::new(); whole.arch.layers as usize];
    for op in prog.ops.iter().filter(|o| o.name == "_scaled_mm") {
        if let Some(l) = layers.get_mut(op.layer as usize) {
            if !l.contains(&op.module) {
                l.push(op.module);
            }
        }
    }
    layers
}

/// The script for `cfg` (see the module doc); the architecture is exported as its family's
/// model type.
pub fn verify_script(cfg: &Config) -> Result<String, VerifyError> {
    estimator::validate_consistency(cfg)?;
    reproducible(cfg)?;
    let exported = hf_export::export(&cfg.arch)?;
    let spec = spec_json(cfg, &exported)?;
    // JSON inside a Python raw triple-quoted string: a quote can only occur inside a JSON string,
    // where `\u0027` means the same.
    let spec_text = serde_json::to_string_pretty(&spec).unwrap_or_default().replace('\'', "\\u0027");
    let title: String =
        cfg.display_name().chars().map(|c| if c.is_control() || c == '"' || c == '\\' { '\'' } else { c }).take(120).collect();
    Ok(TEMPLATE
        .replace("__TRAINMEM_VERSION__", env!("CARGO_PKG_VERSION"))
        .replace("__TITLE__", &title)
        .replace("__QUERY__", &config::encode_query(cfg))
        .replace("__TRACKER_COMMIT__", TRACKER_COMMIT)
        .replace("__SPEC_JSON__", &spec_text)
        .replace("__TRACKER_SOURCE__", TRACKER))
}

/// Everything the script reads from the configuration, as one JSON object.
fn spec_json(cfg: &Config, exported: &hf_export::Exported) -> Result<Value, VerifyError> {
    let (param_dtype, autocast, grad_scaler, master) = match cfg.precision {
        Precision::Fp32 => ("float32", None, false, None),
        Precision::Bf16 => ("bfloat16", None, false, None),
        Precision::Fp16 => ("float16", None, false, None),
        Precision::AmpBf16 => ("float32", Some("bfloat16"), false, None),
        Precision::AmpFp16 => ("float32", Some("float16"), true, None),
        Precision::MixedBf16 => ("bfloat16", None, false, Some("cast_at_step")),
        Precision::MixedFp16 => ("float16", None, false, Some("cast_at_step")),
        Precision::MixedBf16Fp32grad => ("bfloat16", None, false, Some("fp32_main_grad")),
        Precision::MixedFp8 => return Err(refusal(cfg, "precision", NO_TE)),
    };
    let optimizer = match cfg.optim {
        Optimizer::Adamw => "adamw",
        Optimizer::Sgd => "sgd",
        Optimizer::Momentum => "momentum",
        Optimizer::Adafactor => "adafactor",
        Optimizer::Lion | Optimizer::Adam8bit | Optimizer::Muon => return Err(refusal(cfg, "optim", NO_SUCH_OPTIMIZER)),
    };
    let attn = match cfg.attn {
        Attention::Eager => "eager",
        Attention::Sdpa => "sdpa",
        Attention::Flash => "flash_attention_2",
    };
    let mut notes: Vec<String> = Vec::new();
    if cfg.precision == Precision::Fp16 {
        notes.push(
            "precision=fp16 runs without a loss scaler (torch's GradScaler refuses fp16 gradients); a scaler holds a few scalars".into(),
        );
    }
    if master == Some("cast_at_step") {
        let largest = cfg.arch.tensors().iter().map(|t| t.elements_per_tensor()).max().unwrap_or(0);
        notes.push(format!(
            "master weights: the script casts one gradient at a time to fp32 before stepping its master, so the step holds up to one fp32 \
             gradient of the largest tensor ({largest} elements, {} bytes) beyond the recipe's ledger",
            largest * 4
        ));
    }
    if cfg.precision == Precision::MixedBf16Fp32grad {
        notes.push("fp32 main gradients are accumulated by a post-accumulate-grad hook per parameter: each bf16 gradient exists until its hook runs".into());
    }
    let mut predicted = serde_json::Map::new();
    for (name, k) in [("cuda", Kernels::Cuda), ("cpu", Kernels::Cpu)] {
        match predictions_for(cfg, k)? {
            Some(p) => {
                predicted.insert(name.into(), serde_json::to_value(&p).unwrap_or(Value::Null));
            }
            None => {
                predicted.insert(name.into(), Value::Null);
            }
        }
    }
    if let Err(EstimateError::Unmodelled { feature }) = estimator::validate(cfg) {
        notes.push(format!(
            "trainmem does not estimate this architecture yet ({feature} is not modelled): the script measures, and predictions are null"
        ));
    }
    if cfg.gpu != "custom" {
        if let Some(g) = estimator::gpu::gpu(&cfg.gpu) {
            notes.push(format!(
                "the CUDA predictions are for one {} ({}); on another GPU the CUDA context and cuBLAS workspace rows differ",
                g.name, cfg.gpu
            ));
        }
    }
    let fp8 = match cfg.fp8 {
        Fp8::TorchaoTensorwise | Fp8::TorchaoRowwise => json!({
            "recipe": if cfg.fp8 == Fp8::TorchaoRowwise { "rowwise" } else { "tensorwise" },
            "recompute_weight": cfg.fp8_recompute_weight,
            "torchao_version": TORCHAO_VERSION,
            "linears": fp8_linears(cfg),
        }),
        Fp8::None => Value::Null,
        Fp8::TeDelayed | Fp8::TeCurrent | Fp8::TeMxfp8 => return Err(refusal(cfg, "fp8", NO_TE)),
    };
    if cfg.empty_cache {
        notes.push("empty_cache = true: torch.cuda.empty_cache() runs after loading, before the first step".into());
    }
    let counts = cfg.arch.counts();
    Ok(json!({
        "trainmem_version": env!("CARGO_PKG_VERSION"),
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "query": config::encode_query(cfg),
        "model": cfg.display_name(),
        "model_type": exported.model_type,
        "hf_config": exported.config,
        "parameter_count": counts.total,
        "batch": cfg.batch,
        "seq": cfg.seq,
        "accum": cfg.accum,
        "recipe": {
            "precision": config::get(cfg, "precision"),
            "param_dtype": param_dtype,
            "autocast": autocast,
            "grad_scaler": grad_scaler,
            "master": master,
        },
        "optimizer": {"name": optimizer, "impl": config::get(cfg, "optim_impl")},
        "attn_implementation": attn,
        "checkpointing": {
            "kind": match cfg.recompute {
                Recompute::Full => "full",
                Recompute::Op => "op",
                Recompute::None | Recompute::Selective => "none",
            },
            "every": cfg.recompute_every,
            "every_first": cfg.recompute_every_first,
            "cpu_sdpa": cfg.sac_cpu_sdpa,
        },
        "compile": cfg.compile,
        "optim_in_bwd": cfg.optim_in_bwd,
        "act_offload": match cfg.act_offload {
            ActOffload::None => Value::Null,
            ActOffload::Torchtune => json!("torchtune"),
            ActOffload::SaveOnCpu => json!("save_on_cpu"),
        },
        "act_offload_layers": cfg.act_offload_layers,
        "dropout": cfg.dropout,
        "alloc_conf": cfg.alloc_conf,
        "load": {"kind": "from_pretrained", "empty_cache": cfg.empty_cache},
        "fp8": fp8,
        "tracker_commit": TRACKER_COMMIT,
        "predicted": predicted,
        "notes": notes,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Config {
        config::decode_query("model=gpt2&batch=2&seq=64&precision=fp32&kernels=cpu&layers=2").config
    }

    #[test]
    fn cpu_predictions_are_the_step_streams_allocated_bytes_without_anything_outside_the_allocator() {
        let cfg = tiny();
        let e = estimator::estimate(&cfg).expect("estimates");
        let p = predictions(&cfg).expect("predicts");
        // Under kernels=cpu the peak is the estimate's allocated peak: resident + the stream's
        // largest live bytes; no cuBLAS workspace, no reserve, no nvidia-smi.
        assert_eq!(p.peak, e.memory.allocated_peak);
        assert!(p.after_forward <= p.forward_peak && p.forward_peak <= p.peak && p.backward_peak <= p.peak);
        assert!(p.step_peak <= p.peak && p.step_peak > 0);
        assert_eq!((p.reserved_peak, p.nvidia_smi), (None, None));
        assert_eq!((p.load_peak, p.load_reserved, p.step_reserved_peak), (None, None, None));
    }

    #[test]
    fn a_fused_optimizer_steps_peak_is_what_backward_left_with_every_gradient_alive() {
        // fp32 with the fused AdamW: the step allocates nothing, so the most allocated during
        // `optimizer.step()` is the level backward ends at — weights, states and every gradient
        // (measured on the CPU: Llama 3.2 1B shapes, 4 layers, tied embedding, 8,095,303,064 B
        // = 2,023,825,408 weights + 4,047,650,968 states + 2,023,825,408 gradients + 1,280 B;
        // predicted 1,050,673,152 B lower — the embedding's gradient, freed first by zero_grad —
        // when only the phase's events were read).
        let cfg = config::decode_query(
            "model=custom&family=llama&hidden=2048&layers=4&head_dim=64&ffn=8192&tied=true&seq=128&precision=fp32&attn=eager&kernels=cpu",
        )
        .config;
        let stream = estimator::step_stream(&cfg).expect("simulates");
        let p = predictions(&cfg).expect("predicts");
        let end_of_backward =
            stream.events.iter().rev().find(|ev| ev.phase == estimator::step::Phase::Backward).map(|ev| ev.live).expect("backward");
        assert_eq!(p.step_peak, stream.resident + end_of_backward);
        let e = estimator::estimate(&cfg).expect("estimates");
        assert!(p.step_peak >= e.memory.parameters + e.memory.gradients + e.memory.optimizer_states);
    }

    #[test]
    fn cuda_predictions_keep_the_blas_workspaces_and_say_what_nvidia_smi_shows() {
        let cfg = Config { kernels: Kernels::Cuda, ..tiny() };
        let e = estimator::explain(&cfg).expect("estimates");
        let p = predictions(&cfg).expect("predicts");
        let blas = e.row(estimator::ledger::RowId::BlasWorkspaces).map_or(0, |r| r.bytes);
        assert!(blas > 0);
        // Allocated peak = the stream's peak + the cuBLAS workspaces the allocator hands out.
        assert_eq!(p.peak, e.memory.allocated_peak + blas);
        // Reserved holds at least what is allocated; nvidia-smi is the verdict's figure.
        assert!(p.reserved_peak.expect("simulated") >= p.peak);
        // The run's reserve holds the step's and the loading's; the loading allocates the weights.
        assert!(p.reserved_peak >= p.step_reserved_peak && p.step_reserved_peak >= Some(p.peak));
        assert!(p.reserved_peak >= p.load_reserved && p.load_reserved >= p.load_peak);
        assert_eq!(p.load_peak, Some(e.memory.load_allocated_peak));
        assert_eq!(p.nvidia_smi, e.memory.nvidia_smi);
        assert_eq!(p.nvidia_smi, Some(e.deciding_peak()));
    }

    #[test]
    fn the_step_in_backward_with_master_weights_or_a_loss_scaler_is_refused_by_its_key() {
        // The estimator or the script refuses it; either way the error names `optim_in_bwd`.
        for precision in [Precision::MixedBf16, Precision::MixedBf16Fp32grad, Precision::AmpFp16] {
            let cfg = Config { optim_in_bwd: true, precision, optim_impl: OptimImpl::Fused, ..tiny() };
            assert_eq!(verify_script(&cfg).err().as_ref().map(VerifyError::key), Some("optim_in_bwd"), "{precision:?}");
        }
    }

    #[test]
    fn the_recipes_checkpointing_reaches_the_script_as_the_records_apply_it() {
        let cfg = Config { recompute: Recompute::Op, recompute_every: 2, sac_cpu_sdpa: true, optim_in_bwd: true, ..tiny() };
        let script = verify_script(&cfg).unwrap_or_default();
        assert!(
            script.contains(r#""kind": "op""#) && script.contains(r#""every": 2"#) && script.contains(r#""cpu_sdpa": true"#),
            "{script}"
        );
        assert!(script.contains(r#""optim_in_bwd": true"#));
    }

    #[test]
    fn offloading_reaches_the_script_and_its_host_bytes_are_the_estimates_offloaded_row() {
        for (kind, name) in [(ActOffload::Torchtune, "torchtune"), (ActOffload::SaveOnCpu, "save_on_cpu")] {
            let cfg = Config { act_offload: kind, ..tiny() };
            let e = estimator::estimate(&cfg).expect("estimates");
            let row: Bytes = e.host.iter().filter(|r| r.id == estimator::ledger::RowId::OffloadedActivations).map(|r| r.bytes).sum();
            let p = predictions(&cfg).expect("predicts");
            assert!(row > 0 && p.host_offloaded == Some(row), "{name}");
            // The host total holds it (and whatever else lives on the host).
            assert!(e.memory.host >= row, "{name}");
            let script = verify_script(&cfg).expect("renders");
            assert!(script.contains(&format!(r#""act_offload": "{name}""#)), "{name}");
        }
        // Without offloading the field does not apply.
        assert_eq!(predictions(&tiny()).expect("predicts").host_offloaded, None);
        assert!(verify_script(&tiny()).unwrap_or_default().contains(r#""act_offload": null"#));
    }

    #[test]
    fn each_refusal_names_its_key() {
        let base = tiny();
        let cases: Vec<(&str, Config)> = vec![
            ("gpus", Config { gpus: 8, ..base.clone() }),
            ("tp", Config { gpus: 2, tp: 2, ..base.clone() }),
            ("zero", Config { zero: Zero::Z3, ..base.clone() }),
            ("offload", Config { offload: Offload::Optimizer, ..base.clone() }),
            ("finetune", Config { finetune: Finetune::Lora, ..base.clone() }),
            ("optim", Config { optim: Optimizer::Lion, ..base.clone() }),
            ("optim_impl", Config { optim: Optimizer::Adafactor, optim_impl: OptimImpl::Fused, ..base.clone() }),
            ("optim_impl", Config { precision: Precision::MixedBf16, optim_impl: OptimImpl::Foreach, ..base.clone() }),
            ("precision", Config { precision: Precision::MixedFp8, ..base.clone() }),
            // Issue 27: the loaders of several processes, FSDP2's FP8 all-gather, Transformer Engine.
            ("load", Config { load: Load::MetaSharded, gpus: 8, zero: Zero::FullShard, ..base.clone() }),
            ("load", Config { load: Load::ZeroInit, gpus: 8, zero: Zero::Z3, ..base.clone() }),
            ("finetune", Config { load: Load::QuantizeOnLoad, finetune: Finetune::Qlora, ..base.clone() }),
            ("fp8_allgather", Config { fp8: Fp8::TorchaoTensorwise, fp8_allgather: true, gpus: 8, zero: Zero::FullShard, ..base.clone() }),
            ("fp8", Config { fp8: Fp8::TeDelayed, ..base.clone() }),
            ("fp8", Config { fp8: Fp8::TeCurrent, precision: Precision::Bf16, ..base.clone() }),
            (
                "fp8_model_init",
                Config {
                    fp8: Fp8::TeDelayed,
                    fp8_model_init: true,
                    precision: Precision::MixedBf16,
                    optim_impl: OptimImpl::Fused,
                    ..base.clone()
                },
            ),
            ("recompute", Config { recompute: Recompute::Selective, ..base.clone() }),
            ("framework", Config { framework: Framework::Megatron, ..base.clone() }),
            ("loss", Config { loss: Loss::Chunked, ..base.clone() }),
        ];
        for (key, cfg) in cases {
            let err = verify_script(&cfg).err();
            assert_eq!(err.as_ref().map(VerifyError::key), Some(key), "{err:?}");
            let text = err.map(|e| e.to_string()).unwrap_or_default();
            assert!(text.starts_with(&format!("`{key}` = ")), "{text}");
        }
    }

    #[test]
    fn a_framework_s_own_model_code_is_refused_because_the_script_runs_transformers() {
        let llama = crate::config::decode_query("model=llama-3.2-1b&seq=128&batch=1").config;
        assert!(reproducible(&llama).is_ok());
        for fw in [Framework::Torchtitan, Framework::Torchtune, Framework::Litgpt] {
            let err = reproducible(&Config { framework: fw, ..llama.clone() }).err();
            assert_eq!(err.as_ref().map(VerifyError::key), Some("framework"), "{fw:?}");
            assert!(err.map(|e| e.to_string()).unwrap_or_default().contains("framework = hf"), "{fw:?}");
        }
    }

    #[test]
    fn transformer_engines_per_layer_offload_is_applied_with_eager_attention_and_refused_with_sdpa() {
        let eager =
            config::decode_query("model=llama-3.2-1b&layers=4&batch=1&seq=64&precision=fp32&kernels=cpu&attn=eager&act_offload_layers=2")
                .config;
        assert_eq!(eager.act_offload_layers, 2, "the query keeps the key");
        let script = verify_script(&eager).unwrap_or_default();
        assert!(script.contains(r#""act_offload_layers": 2"#), "the spec names the layers");
        assert!(script.contains("def te_layer_offload("), "the script carries the context");
        // With SDPA Transformer Engine's `start_offload` raises on o_proj's saved view: the
        // estimate refuses it by the key, and so does the script.
        let sdpa = Config { attn: config::Attention::Sdpa, ..eager };
        assert_eq!(verify_script(&sdpa).err().as_ref().map(VerifyError::key), Some("act_offload_layers"));
    }

    #[test]
    fn the_script_embeds_the_config_the_tracker_and_both_prediction_sets() {
        let s = verify_script(&tiny()).expect("renders");
        assert!(!s.contains("__SPEC_JSON__") && !s.contains("__TRACKER_SOURCE__") && !s.contains("__QUERY__"));
        assert!(s.contains("\"model_type\": \"gpt2\""));
        assert!(s.contains("class StepTracker(TorchDispatchMode)"));
        assert!(s.contains("\"cuda\": {") && s.contains("\"cpu\": {"));
    }

    #[test]
    fn the_torchao_recipes_name_exactly_the_projections_trainmem_runs_in_fp8() {
        let q = "model=llama-3.2-1b&vocab=1000&hidden=64&layers=2&heads=4&kv_heads=2&head_dim=16&ffn=176&max_pos=512&tied=false\
                 &batch=2&seq=64&precision=bf16&fp8=torchao-rowwise&fp8_recompute_weight=true";
        let cfg = config::decode_query(q).config;
        let layer = [
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ];
        assert_eq!(fp8_linears(&cfg), vec![layer.to_vec(), layer.to_vec()]);
        let s = verify_script(&cfg).expect("renders");
        assert!(s.contains(r#""recipe": "rowwise""#) && s.contains(r#""recompute_weight": true"#), "{s}");
        assert!(s.contains(&format!(r#""torchao_version": "{TORCHAO_VERSION}""#)));
        // Dims that are not multiples of 16 stay in bf16 (FP8 GEMMs' alignment): with 12-wide heads
        // k and v project 64 -> 24, and an FFN of 168 leaves the MLP out; q (64 -> 48) and o stay FP8.
        let odd = config::decode_query(&q.replace("ffn=176", "ffn=168").replace("head_dim=16", "head_dim=12")).config;
        assert_eq!(fp8_linears(&odd)[0], ["self_attn.q_proj", "self_attn.o_proj"]);
        // Layers copied from the first of their kind keep their modules and their own index.
        let four = config::decode_query(&q.replace("layers=2", "layers=4")).config;
        assert_eq!(fp8_linears(&four), vec![layer.to_vec(); 4]);
        // Without a torchao recipe there is nothing to convert.
        assert!(fp8_linears(&tiny()).is_empty());
        assert!(verify_script(&tiny()).unwrap_or_default().contains(r#""fp8": null"#));
    }

    #[test]
    fn the_tracker_fits_in_a_raw_triple_quoted_string() {
        assert!(!TRACKER.contains("'''") && !TRACKER.ends_with('\\'));
    }

    #[test]
    fn a_quote_in_a_custom_name_cannot_break_the_script() {
        let mut cfg = tiny();
        cfg.name = "it's ''' \"\"\" \\ odd".into();
        let s = verify_script(&cfg).expect("renders");
        // The embedded JSON holds no quote that could end its raw string …
        let spec = s.split("SPEC = json.loads(r'''").nth(1).and_then(|rest| rest.split("''')").next()).unwrap_or_default();
        assert!(spec.contains("it\\u0027s") && !spec.contains('\''), "{spec}");
        // … and the docstring's title neither a double quote nor a backslash.
        let title = s.lines().find(|l| l.starts_with("Generated by trainmem")).unwrap_or_default();
        assert!(title.ends_with("it's ''' ''' ' odd"), "{title}");
    }
}
