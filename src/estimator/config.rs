//! The one configuration every part of trainmem reads: the URL query encodes it, the CLI parses
//! it, the UI edits it, and [`crate::estimator::estimate`] reads it. Its key names and value
//! spellings are defined by the codec in [`crate::config`]; the types and defaults live here so
//! the estimator depends on nothing else of ours.

use super::model::ModelSpec;
use super::preset_base::{default_spec, DEFAULT_PRESET};
use serde::{Deserialize, Serialize};

/// Data types of the precision recipe (`precision`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    /// Weights, gradients and optimizer states all fp32.
    Fp32,
    /// Pure bf16: `model.to(torch.bfloat16)`; torch's optimizers keep states in bf16 too.
    Bf16,
    /// Pure fp16, likewise (with a loss scaler).
    Fp16,
    /// fp32 weights, gradients and states; bf16 compute under `torch.autocast`.
    AmpBf16,
    /// fp32 weights, gradients and states; fp16 autocast with `GradScaler`.
    AmpFp16,
    /// bf16 weights and gradients, fp32 master weights and moments: 16 B/param with Adam
    /// (DeepSpeed, the ZeRO paper's K = 12).
    MixedBf16,
    /// The same with fp16 weights and gradients (ZeRO paper's original setting).
    MixedFp16,
    /// Megatron-LM: bf16 weights, fp32 main gradients, fp32 master and moments: 18 B/param.
    MixedBf16Fp32grad,
    /// Megatron-LM with Transformer Engine FP8 GEMMs: the bf16/fp32 layout above plus fp8
    /// copies of the weights (and their transposes on Hopper).
    MixedFp8,
}

/// Optimizer (`optim`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Optimizer {
    Sgd,
    Momentum,
    Adamw,
    Adafactor,
    Lion,
    Adam8bit,
    Muon,
}

/// How PyTorch's optimizer runs its step (`optim_impl`); changes temporaries and where
/// AdamW's `step` counters live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimImpl {
    /// `foreach=True`, torch's CUDA default: one op over all tensors, temporaries as big as a
    /// state (what `model.to(bf16)` + `torch.optim.AdamW()` gets).
    Foreach,
    /// `fused=True` (and the fused optimizers of DeepSpeed, Megatron and apex that mixed
    /// precision runs use): one kernel, no temporaries, `step` on the GPU. The default.
    Fused,
    /// `foreach=False`: one tensor at a time.
    Forloop,
}

/// Fine-tuning method (`finetune`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Finetune {
    Full,
    /// Low-rank adapters on a frozen base in the recipe's weight dtype (Hu et al. 2021).
    Lora,
    /// Adapters on an NF4-quantized frozen base (Dettmers et al. 2023).
    Qlora,
}

/// The dtype of the LoRA adapters on a 16-bit base (`lora_dtype`): who made them decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LoraDtype {
    /// peft's: `get_peft_model(autocast_adapter_dtype=True)` (peft 0.21 `tuners_utils.py
    /// _cast_adapter_dtype`) makes bf16/fp16 adapters fp32, and every adapted `Linear.forward`
    /// casts its input to fp32 (`_cast_input_dtype`) and the sum back (`result.to(dtype)`).
    /// Without a master copy only: a mixed-precision engine (DeepSpeed's bf16) casts the whole
    /// wrapped model, adapters included. The default (transformers + peft is the common path).
    #[default]
    Fp32,
    /// The base's dtype: torchtune 0.6 `LoRALinear` and litgpt 0.5 `LoRALinear` build their
    /// adapters with the model and add `lora_B(lora_A(x))` in x's dtype (peft with
    /// `autocast_adapter_dtype=False` too).
    Model,
}

/// Which linears get LoRA adapters (`lora_targets`), a set of q, k, v, o, gate, up, down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoraTargets(pub u8);

impl LoraTargets {
    pub const Q: u8 = 1;
    pub const K: u8 = 2;
    pub const V: u8 = 4;
    pub const O: u8 = 8;
    pub const GATE: u8 = 16;
    pub const UP: u8 = 32;
    pub const DOWN: u8 = 64;
    pub const ALL: LoraTargets = LoraTargets(127);
    pub const NAMES: [(&'static str, u8); 7] =
        [("q", Self::Q), ("k", Self::K), ("v", Self::V), ("o", Self::O), ("gate", Self::GATE), ("up", Self::UP), ("down", Self::DOWN)];
    pub fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }
}

/// Attention implementation (`attn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Attention {
    /// Scores and probabilities materialized: b·a·s² elements per layer.
    Eager,
    /// `F.scaled_dot_product_attention` (flash or memory-efficient kernel).
    Sdpa,
    /// `flash_attn` (FlashAttention-2).
    Flash,
}

/// Activation recomputation (`recompute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Recompute {
    None,
    /// Megatron's selective recomputation: the attention core is recomputed.
    Selective,
    /// Every layer keeps only its input; one layer is recomputed at a time.
    Full,
    /// torchtitan's per-op selective checkpointing (`ac_config.mode = "selective"`,
    /// `selective_ac_option = "op"`): each layer keeps the outputs of every second `mm`, of
    /// addmm, bmm, SDPA, `max` and `topk` (`torch.utils.checkpoint` with
    /// `create_selective_checkpoint_contexts`) and recomputes the rest.
    Op,
}

/// What `torch.compile` compiles as one graph (`compile_regions`): AOTAutograd's partitioner
/// decides per region what crosses from forward to backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum CompileRegions {
    /// Each decoder layer and the loss (torchtune's `compile: True`; torchtitan 0.2.2's
    /// `compile.enable` with its default `compile.components = ["model", "loss"]`).
    #[default]
    Layer,
    /// Each `TransformerBlock`, the loss left eager (torchtitan's `compile.components =
    /// ["model"]`, and its compile before it compiled the loss): `framework = torchtitan` only.
    Block,
    /// The whole model at once (Trainer's `torch_compile`), with its graph breaks.
    Model,
}

/// Activation offloading through saved-tensor hooks (`act_offload`, validation/FINDINGS.md
/// §15.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ActOffload {
    /// Saved tensors stay on the device.
    #[default]
    None,
    /// torchtune 0.6.1 `training/_activation_offloading.py` `OffloadActivations` (streams on,
    /// `max_fwd_stash_size = 5`, `min_offload_size = 1024`, pinned): the model call runs under
    /// it, the output head under a `NoOpManager`, the loss outside.
    Torchtune,
    /// `torch.autograd.graph.save_on_cpu(pin_memory=True)` around the model call (HF's loss
    /// inside): every saved tensor, any size, parameters' views included.
    SaveOnCpu,
}

impl ActOffload {
    /// Whether saved tensors are offloaded at all.
    pub fn on(self) -> bool {
        self != ActOffload::None
    }
}

/// Reads `act_offload` as written now (`"torchtune"`, `"save_on_cpu"`, `"none"`) or as the
/// boolean it was (`true`: torchtune's).
impl<'de> Deserialize<'de> for ActOffload {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Flag(bool),
            Name(String),
        }
        match Repr::deserialize(d)? {
            Repr::Flag(true) => Ok(ActOffload::Torchtune),
            Repr::Flag(false) => Ok(ActOffload::None),
            Repr::Name(n) => match n.as_str() {
                "none" => Ok(ActOffload::None),
                "torchtune" => Ok(ActOffload::Torchtune),
                "save_on_cpu" => Ok(ActOffload::SaveOnCpu),
                other => Err(serde::de::Error::custom(format!("unknown act_offload {other:?}: expected none, torchtune or save_on_cpu"))),
            },
        }
    }
}

/// The loss's implementation (`loss`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Loss {
    /// HF's `ForCausalLMLoss`: full logits, upcast to fp32, log-softmax kept for backward.
    Standard,
    /// Fused/chunked cross-entropy (Liger, cut-cross-entropy): logits never materialized whole.
    Chunked,
}

/// Data-parallel sharding (`zero`): DeepSpeed ZeRO stages and their PyTorch FSDP twins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Zero {
    /// Plain DDP: everything replicated.
    Ddp,
    /// Optimizer states (and master weights) sharded.
    Z1,
    /// + gradients sharded.
    Z2,
    /// + parameters sharded.
    Z3,
    /// FSDP `FULL_SHARD` (≈ ZeRO-3).
    FullShard,
    /// FSDP `SHARD_GRAD_OP` (≈ ZeRO-2).
    ShardGradOp,
    /// FSDP `HYBRID_SHARD`: ZeRO-3 inside groups of `shard_group` GPUs, replicated across them.
    HybridShard,
}

impl Zero {
    /// The equivalent ZeRO stage (0–3).
    pub fn stage(self) -> u8 {
        match self {
            Zero::Ddp => 0,
            Zero::Z1 => 1,
            Zero::Z2 | Zero::ShardGradOp => 2,
            Zero::Z3 | Zero::FullShard | Zero::HybridShard => 3,
        }
    }
}

/// CPU offload (`offload`), DeepSpeed ZeRO-Offload / ZeRO-Infinity style.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Offload {
    None,
    /// Master weights, optimizer states and the fp32 gradient partition live in host memory.
    Optimizer,
    /// Also the parameters (ZeRO-3 only).
    OptimizerParams,
}

/// Whose code the activation accounting follows (`framework`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Framework {
    /// Hugging Face transformers' module code (what most fine-tuning runs use).
    Hf,
    /// Megatron-LM's tensor list (Korthikanti et al. 2022).
    Megatron,
    /// torchtitan 0.2.2's own modeling code (`torchtitan/models/llama3/model/model.py`: Llama 3;
    /// `models/qwen3/model/model.py`: Qwen3, dense),
    /// its loss (`components/loss.py`) and full activation checkpointing
    /// (`distributed/activation_checkpoint.py`); the step program follows it
    /// (`step/families/torchtitan.rs`).
    Torchtitan,
    /// torchtune 0.6.1's own modeling code (`torchtune/models/llama3_1/_component_builders.py`:
    /// Llama 3 / 3.1 / 3.2) and `full_finetune_single_device.py`'s loss step
    /// (`CEWithChunkedOutputLoss`, 8 output chunks); the step program follows it
    /// (`step/families/torchtune.rs`). On several GPUs, its distributed recipes' FSDP2
    /// (`training.shard_model`, `zero = full_shard`).
    Torchtune,
    /// litgpt 0.5.13's own `GPT` (`litgpt/model.py`) with its Llama 3 / 3.1 configs, under
    /// Lightning Fabric's precisions and `finetune/full.py`'s loss step
    /// (`chunked_cross_entropy`, 128 rows a chunk); the step program follows it
    /// (`step/families/litgpt.rs`).
    Litgpt,
}

/// Whose kernels decide what is saved (`kernels`): CUDA (what training runs on) or PyTorch's
/// CPU kernels, which the validation fixtures were measured with. They differ in LayerNorm
/// statistics (fp32 on CUDA, the input dtype on CPU), dropout masks (1-byte bool on CUDA, the
/// input dtype on CPU) and SDPA with dropout (CPU falls back to the math kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kernels {
    Cuda,
    Cpu,
}

/// The network between nodes (`interconnect`): the class of NIC each GPU (or node) has. The
/// bandwidth each class stands for is an assumption of the cost model, named and sourced in
/// [`crate::estimator::cost::interconnect_gbs`]; memory does not depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Interconnect {
    /// InfiniBand XDR, one 800 Gb/s NIC per GPU (ConnectX-8: HGX B300, GB300 NVL72).
    IbXdr,
    /// InfiniBand NDR, one 400 Gb/s NIC per GPU (ConnectX-7: DGX H100, H200, B200).
    IbNdr,
    /// InfiniBand HDR, one 200 Gb/s NIC per GPU (ConnectX-6: DGX A100).
    IbHdr,
    /// RoCE v2 over 400 GbE, one NIC per GPU (Spectrum-X and most cloud H100 clusters).
    Roce400,
    /// 100 GbE per node, shared by its GPUs (commodity clusters).
    Eth100,
    /// 25 GbE per node, shared by its GPUs (a rack of workstations).
    Eth25,
}

/// FP8 training recipe (`fp8`): which linears run their GEMMs in FP8, and what each recipe
/// allocates, keeps and frees (validation/FINDINGS.md §10). Embeddings, the LM head, norms, the
/// router and the attention core stay in the recipe's 16-bit dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Fp8 {
    /// No FP8 (unless `precision = mixed-fp8`, which stands for `te-delayed`).
    #[default]
    None,
    /// torchao 0.18 `Float8Linear`, dynamic tensorwise scales (torchtitan's default): saves the
    /// bf16 input as `nn.Linear` does; FP8 casts are transients of each GEMM.
    TorchaoTensorwise,
    /// torchao 0.18 `Float8Linear`, row-wise scales (power-of-2 rounded), e4m3 everywhere.
    TorchaoRowwise,
    /// Transformer Engine 2.20 delayed scaling: a 1,024-entry amax history per FP8 tensor.
    TeDelayed,
    /// Transformer Engine 2.20 current (per-tensor, just-in-time) scaling: no amax history.
    TeCurrent,
    /// Transformer Engine 2.20 MXFP8 (Blackwell): 1×32 E8M0 block scales, both layouts kept.
    TeMxfp8,
}

impl Fp8 {
    /// A torchao `Float8Linear` recipe.
    pub fn torchao(self) -> bool {
        matches!(self, Fp8::TorchaoTensorwise | Fp8::TorchaoRowwise)
    }
    /// A Transformer Engine recipe.
    pub fn te(self) -> bool {
        matches!(self, Fp8::TeDelayed | Fp8::TeCurrent | Fp8::TeMxfp8)
    }
}

/// How QLoRA's frozen base is quantized (`qlora_quant`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum QloraQuant {
    /// bitsandbytes NF4 `Linear4bit` (blocks of 64, double quantization, bf16 compute).
    #[default]
    Nf4,
    /// An int4 GPTQ/AWQ checkpoint (gptqmodel's packed `qweight`, `qzeros`, fp16 `scales`,
    /// `g_idx`; group 128), trained through its dequantizing torch kernel.
    Gptq,
    /// torchao's `NF4Tensor` (torchtune's QLoRA, `LoRALinear(quantize_base=True)`): blocks of
    /// 64, 8-bit scalers with a factor per 256 blocks in the weight's dtype; the whole tensor,
    /// scalers included, sharded by FSDP2; dequantized to the weight's dtype in forward and
    /// again in backward (`linear_nf4`).
    TorchaoNf4,
}

/// How the model is loaded before the first step (`load`): its peak, and what the caching
/// allocator still holds from it when the step starts (validation/FINDINGS.md §12).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Load {
    /// transformers' `from_pretrained(device_map=…)`: `caching_allocator_warmup` reserves one
    /// segment of the parameter bytes, then one allocation per parameter. Under DeepSpeed
    /// ZeRO-3 transformers itself loads through `zero.Init` (as `zero-init`), under FSDP
    /// sharded (as `meta-sharded`).
    #[default]
    FromPretrained,
    /// Load, then quantize each weight to NF4 on the GPU (bitsandbytes): its bf16 copy and
    /// absmax temporaries one weight at a time.
    QuantizeOnLoad,
    /// FSDP2: build on the meta device, `to_empty` the local shards, then a sharded (DCP) or
    /// broadcast load one full tensor at a time.
    MetaSharded,
    /// DeepSpeed `zero.Init`: partitioned as each module is built, loaded module by module
    /// under `GatheredParameters`.
    ZeroInit,
}

/// Byte unit for display (`unit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unit {
    /// 10⁹ bytes.
    Gb,
    /// 2³⁰ bytes.
    Gib,
}

/// The whole configuration of one estimate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// A preset id, or `custom` when `arch` is not exactly a preset.
    pub model: String,
    /// A display name for a custom or imported model (plain text, never markup).
    pub name: String,
    /// The architecture, always resolved.
    pub arch: ModelSpec,
    /// Micro-batch per GPU.
    pub batch: u64,
    /// Sequence length in tokens.
    pub seq: u64,
    /// Gradient-accumulation steps.
    pub accum: u64,
    pub precision: Precision,
    pub optim: Optimizer,
    pub optim_impl: OptimImpl,
    pub finetune: Finetune,
    pub lora_rank: u64,
    pub lora_targets: LoraTargets,
    /// Dropout probability on every adapter's input (peft `LoraConfig.lora_dropout`, litgpt
    /// `lora_dropout`, torchtune `model.lora_dropout`): 0 = `nn.Identity`, no dropout.
    pub lora_dropout: f64,
    /// The adapters' dtype on a 16-bit base: peft's fp32 or the model's ([`LoraDtype`]).
    #[serde(default)]
    pub lora_dtype: LoraDtype,
    pub attn: Attention,
    pub recompute: Recompute,
    /// Dropout probability on attention weights and residual branches.
    pub dropout: f64,
    pub loss: Loss,
    pub framework: Framework,
    pub kernels: Kernels,
    /// GPUs in the whole job.
    pub gpus: u64,
    pub zero: Zero,
    /// GPUs per sharding group under `hybrid_shard` (typically one node).
    pub shard_group: u64,
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Pipeline-parallel degree.
    pub pp: u64,
    /// Virtual pipeline stages per GPU (interleaved 1F1B); 1 = plain 1F1B.
    pub vpp: u64,
    /// Context-parallel degree (sequence split across GPUs for attention).
    pub cp: u64,
    /// Expert-parallel degree.
    pub ep: u64,
    /// Sequence parallelism alongside tensor parallelism (Korthikanti et al. 2022).
    pub sp: bool,
    pub offload: Offload,
    /// A GPU id from the catalog, or `custom` with `gpu_gib`.
    pub gpu: String,
    /// Capacity of a custom GPU, GiB.
    pub gpu_gib: f64,
    /// Dense 16-bit tensor throughput of a custom GPU, TFLOP/s (0 = unknown; the cost model
    /// needs it).
    pub gpu_tflops: f64,
    /// Dense FP8 tensor throughput of a custom GPU, TFLOP/s (0 = none).
    pub gpu_fp8_tflops: f64,
    /// Memory bandwidth of a custom GPU, GB/s (0 = unknown; the cost model needs it).
    pub gpu_hbm_gbs: f64,
    /// Scale-up link (NVLink, Infinity Fabric) of a custom GPU, GB/s per GPU, bidirectional as
    /// datasheets print it (0 = none: GPUs talk through the host link).
    pub gpu_link_gbs: f64,
    /// Host link (PCIe) of a custom GPU, GB/s, bidirectional (PCIe 5.0 ×16: 128).
    pub gpu_host_gbs: f64,
    /// GPUs that share one scale-up fabric: 8 in an HGX/DGX node, 72 in a GB200 NVL72 rack.
    /// Parallel groups inside it use the scale-up link; groups that span it, the interconnect.
    pub gpus_per_node: u64,
    /// The network between nodes.
    pub interconnect: Interconnect,
    /// The CUDA context per GPU, MiB; `None` = the measured figure for the GPU's generation
    /// (overhead.rs, `cuda_context_mib`).
    pub cuda_ctx_mib: Option<u64>,
    /// NCCL communicator buffers per GPU, MiB; `None` = automatic (0 on one GPU).
    pub nccl_mib: Option<u64>,
    /// A flat guess of the caching allocator's reserve beyond what is allocated, percent of the
    /// dynamic allocations at the peak; `None` = simulated (allocator.rs replays the step).
    pub frag_pct: Option<u64>,
    /// `PYTORCH_CUDA_ALLOC_CONF` for the simulated caching allocator (`expandable_segments:True`,
    /// `max_split_size_mb:…`, `roundup_power2_divisions:…`); empty = PyTorch's defaults.
    pub alloc_conf: String,
    /// Unsharded layers in flight under ZeRO-3/FSDP (the one computing + prefetched ones).
    pub prefetch_layers: u64,
    /// DDP `gradient_as_bucket_view=True` (no separate bucket copy of the gradients).
    pub bucket_view: bool,
    pub unit: Unit,
    /// Serving: the engine, context, concurrency and served dtypes (`mode=serve`).
    #[serde(default)]
    pub serve: super::serve_config::Serving,
    /// FP8 training recipe.
    #[serde(default)]
    pub fp8: Fp8,
    /// FSDP2 all-gathers the FP8 weights (torchao `enable_fsdp_float8_all_gather` with
    /// precomputed scales; tensorwise only).
    #[serde(default)]
    pub fp8_allgather: bool,
    /// `force_recompute_fp8_weight_in_bwd` (torchao: a no-op in 0.18) / Transformer Engine's
    /// FP8 weight re-quantized in backward instead of saved.
    #[serde(default)]
    pub fp8_recompute_weight: bool,
    /// Transformer Engine `fp8_model_init`: the parameters themselves are FP8, no 16-bit weights.
    #[serde(default)]
    pub fp8_model_init: bool,
    /// QLoRA's 4-bit base format.
    #[serde(default)]
    pub qlora_quant: QloraQuant,
    /// How the model is loaded before the step.
    #[serde(default)]
    pub load: Load,
    /// `torch.cuda.empty_cache()` after loading: what loading left cached is released.
    #[serde(default)]
    pub empty_cache: bool,
    /// `torch.compile` on the regions of `compile_regions` (issue 26).
    #[serde(default)]
    pub compile: bool,
    #[serde(default)]
    pub compile_regions: CompileRegions,
    /// Full checkpointing of every Nth decoder layer (layers N−1, 2N−1, …: torchtitan's
    /// `selective_ac_option = "N"`); the others as `recompute` says. 0: off.
    #[serde(default)]
    pub recompute_every: u64,
    /// transformers' choice of those layers (`activation_checkpointing_enable(every_n_layers=N)`:
    /// layers 0, N, 2N, …, recomputed with early stop) instead of torchtitan's.
    #[serde(default)]
    pub recompute_every_first: bool,
    /// With `recompute = full` on Megatron's modules: only the first N decoder layers of each
    /// pipeline stage (of each virtual stage under interleaving) are recomputed, the others keep
    /// everything — Megatron-Core's `recompute_method = "block"`, `recompute_num_layers = N`
    /// (`transformer_block.py` `_checkpointed_forward`). 0: every layer (the uniform method, one
    /// layer a chunk).
    #[serde(default)]
    pub recompute_layers: u64,
    /// `recompute = op` on `kernels = cpu`: the CPU's SDPA kernel
    /// (`_scaled_dot_product_flash_attention_for_cpu`) counted as in torchtitan's save list, as
    /// CUDA's kernels are — what the validation records call `recompute=op` (a GPU run's
    /// semantics on a CPU); off: the list as it is (`recompute=op-literal`).
    #[serde(default)]
    pub sac_cpu_sdpa: bool,
    /// Activation offloading through saved-tensor hooks: torchtune's `OffloadActivations`
    /// (saved tensors of at least 1,024 B that are not parameters go to pinned host memory in
    /// forward and come back in backward) or `torch.autograd.graph.save_on_cpu` (every saved
    /// tensor). See [`ActOffload`].
    #[serde(default)]
    pub act_offload: ActOffload,
    /// Megatron's per-layer activation offload (`--cpu-offloading-num-layers`): the saved
    /// tensors of the first N decoder layers go to pinned host memory. 0: off.
    #[serde(default)]
    pub act_offload_layers: u64,
    /// The optimizer step inside backward (torchtune's `optimizer_in_bwd`): each parameter is
    /// stepped and its gradient freed in a post-accumulate-grad hook.
    #[serde(default)]
    pub optim_in_bwd: bool,
    /// bitsandbytes' paged optimizers (`PagedAdamW8bit`, `PagedAdamW`): states of parameters of
    /// at least 10⁵ elements in CUDA unified memory, outside PyTorch's caching allocator.
    #[serde(default)]
    pub optim_paged: bool,
    /// bitsandbytes' NF4 double quantization (`bnb_4bit_use_double_quant`, Lightning's
    /// `bnb.nf4-dq`): the absmax of each 64 weights in 8 bits with an fp32 scale per 256 of
    /// them; without it one fp32 absmax per 64 weights (transformers' default, Lightning's and
    /// litgpt's `bnb.nf4`).
    #[serde(default = "default_true")]
    pub qlora_double_quant: bool,
    /// bitsandbytes before 0.43.2: `MatMul4Bit` keeps each 4-bit linear's input for backward
    /// (`ctx.tensors = (A, B)` whenever the input needs a gradient), which backward never
    /// reads; bitsandbytes#1270 (2024-07-16, "fix QLoRA mem bug: delete useless buffered
    /// activation") keeps `(None, B)`. litgpt pinned 0.42.0 until 2024-12.
    #[serde(default)]
    pub bnb_keeps_input: bool,
    /// QLoRA through Lightning Fabric's `BitsandbytesPrecision` (litgpt's `quantize:
    /// bnb.nf4…`; lightning 2.3.0.dev20240428 `fabric/plugins/precision/bitsandbytes.py`):
    /// `module_init_context` replaces `torch.nn.Linear` by `_NF4Linear` for everything made
    /// under `init_module`, so an untied LM head is 4-bit too, and `_Linear4bit.quantize`
    /// quantizes `weight.to(torch.half)`, so the quant state's dtype is fp16 and each
    /// `dequantize_4bit` writes fp16 that `MatMul4Bit` then copies to the compute dtype.
    #[serde(default)]
    pub qlora_lightning: bool,
    /// The training loop keeps the last micro-batch's output until the next forward returns
    /// (litgpt `finetune/lora.py` `fit`: `logits = model(input_ids, lm_head_chunk_size=128)`
    /// rebinds the name only then): its fp32 logits, and under `bnb_keeps_input` the 4-bit
    /// linears' inputs its autograd graph still holds (`MatMul4Bit`'s `ctx.tensors`, an
    /// attribute autograd does not release after backward), stay allocated through the next
    /// forward.
    #[serde(default)]
    pub holds_prev_logits: bool,
    /// FSDP2 reshards the root unit after forward when the framework asks for it
    /// (`fully_shard(model, reshard_after_forward=True)`, as torchtune's `shard_model` does):
    /// torch ≥ 2.8. Before (torch ≤ 2.7, pytorch#154704, 2025-06), `FSDPState._lazy_init`
    /// clamped the root to `post_forward_mesh_info = None` whatever was passed, so the root's
    /// parameters stay gathered from its forward into the backward and are not gathered again
    /// there. `false` is that older FSDP2 (the published runs of 2024).
    #[serde(default = "default_true")]
    pub fsdp_root_reshard: bool,
    /// Host RAM per node, GiB: what pinned host memory (offloaded activations) is checked
    /// against.
    #[serde(default = "default_host_ram_gib")]
    pub host_ram_gib: f64,
}

/// Host RAM per node assumed when `host_ram_gib` is not given: 1 TiB (an 8-GPU HGX server has 1–2 TiB).
pub const DEFAULT_HOST_RAM_GIB: f64 = 1024.0;

fn default_true() -> bool {
    true
}

fn default_host_ram_gib() -> f64 {
    DEFAULT_HOST_RAM_GIB
}

impl Default for Config {
    /// A meaningful common case: Llama-3.1-8B, bf16 mixed precision with AdamW, 4,096 tokens,
    /// one H100 80 GB, FlashAttention via SDPA.
    fn default() -> Self {
        let arch = default_spec();
        Config {
            model: DEFAULT_PRESET.to_string(),
            name: String::new(),
            arch,
            batch: 1,
            seq: 4096,
            accum: 1,
            precision: Precision::MixedBf16,
            optim: Optimizer::Adamw,
            optim_impl: OptimImpl::Fused,
            finetune: Finetune::Full,
            lora_rank: 16,
            lora_targets: LoraTargets::ALL,
            lora_dropout: 0.0,
            lora_dtype: LoraDtype::Fp32,
            attn: Attention::Sdpa,
            recompute: Recompute::None,
            dropout: 0.0,
            loss: Loss::Standard,
            framework: Framework::Hf,
            kernels: Kernels::Cuda,
            gpus: 1,
            zero: Zero::Ddp,
            shard_group: 8,
            tp: 1,
            pp: 1,
            vpp: 1,
            cp: 1,
            ep: 1,
            sp: false,
            offload: Offload::None,
            gpu: "h100-80gb".to_string(),
            gpu_gib: 80.0,
            gpu_tflops: 0.0,
            gpu_fp8_tflops: 0.0,
            gpu_hbm_gbs: 0.0,
            gpu_link_gbs: 0.0,
            gpu_host_gbs: 128.0,
            gpus_per_node: 8,
            interconnect: Interconnect::IbNdr,
            cuda_ctx_mib: None,
            nccl_mib: None,
            frag_pct: None,
            alloc_conf: String::new(),
            prefetch_layers: 2,
            bucket_view: false,
            unit: Unit::Gb,
            serve: super::serve_config::Serving::default(),
            fp8: Fp8::None,
            fp8_allgather: false,
            fp8_recompute_weight: false,
            fp8_model_init: false,
            qlora_quant: QloraQuant::Nf4,
            load: Load::FromPretrained,
            empty_cache: false,
            compile: false,
            compile_regions: CompileRegions::Layer,
            recompute_every: 0,
            recompute_every_first: false,
            recompute_layers: 0,
            sac_cpu_sdpa: false,
            act_offload: ActOffload::None,
            act_offload_layers: 0,
            optim_in_bwd: false,
            optim_paged: false,
            qlora_double_quant: true,
            bnb_keeps_input: false,
            qlora_lightning: false,
            holds_prev_logits: false,
            fsdp_root_reshard: true,
            host_ram_gib: DEFAULT_HOST_RAM_GIB,
        }
    }
}

impl Config {
    /// Whether the whole model compiles as one graph (`compile = true`, `compile_regions =
    /// model`: the Trainer's `torch.compile(model)`), which the mask, the final norm's region and
    /// the logits' tangent follow (validation/FINDINGS.md §15.1.z).
    pub fn compiles_whole_model(&self) -> bool {
        self.compile && self.compile_regions == CompileRegions::Model
    }

    /// Data-parallel degree: GPUs / (tp × pp × cp).
    pub fn dp(&self) -> u64 {
        self.gpus.checked_div(self.tp * self.pp * self.cp).unwrap_or(0)
    }

    /// Tokens of one sequence on one GPU: context parallelism splits each sequence over `cp`
    /// GPUs, each holding ⌈s / cp⌉ of its tokens (Megatron's `--context-parallel-size`; the
    /// keys and values of the others pass through in ring attention). The one place `seq` and
    /// `cp` are bound: the activation ledger, the step's program and the cost model read it.
    pub fn seq_per_gpu(&self) -> u64 {
        self.seq.div_ceil(self.cp.max(1))
    }

    /// The FP8 recipe this configuration runs: its `fp8` key, or Transformer Engine's delayed
    /// scaling for `precision = mixed-fp8` (which stands for `mixed-bf16-fp32grad` with
    /// `fp8 = te-delayed`).
    pub fn fp8_recipe(&self) -> Fp8 {
        if self.fp8 == Fp8::None && self.precision == Precision::MixedFp8 {
            Fp8::TeDelayed
        } else {
            self.fp8
        }
    }

    /// The display name: the preset id, the custom name, or "custom model".
    pub fn display_name(&self) -> String {
        if self.model != "custom" {
            self.model.clone()
        } else if !self.name.is_empty() {
            self.name.clone()
        } else {
            "custom model".to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_configuration_uses_the_default_preset() {
        let c = Config::default();
        assert_eq!(c.model, DEFAULT_PRESET);
        assert_eq!(Some(c.arch), crate::estimator::presets::preset(DEFAULT_PRESET).map(|p| p.spec));
    }

    #[test]
    fn mixed_fp8_precision_runs_transformer_engines_delayed_scaling_unless_fp8_names_another() {
        let mixed = Config { precision: Precision::MixedFp8, ..Config::default() };
        assert_eq!(mixed.fp8_recipe(), Fp8::TeDelayed);
        assert_eq!(Config { fp8: Fp8::TorchaoRowwise, ..mixed }.fp8_recipe(), Fp8::TorchaoRowwise);
        assert_eq!(Config::default().fp8_recipe(), Fp8::None);
    }

    #[test]
    fn zero_variants_map_to_their_stage() {
        assert_eq!(Zero::ShardGradOp.stage(), 2);
        assert_eq!(Zero::HybridShard.stage(), 3);
        assert_eq!(Zero::Ddp.stage(), 0);
    }

    #[test]
    fn data_parallel_degree_divides_out_model_parallelism() {
        let c = Config { gpus: 64, tp: 8, pp: 2, ..Config::default() };
        assert_eq!(c.dp(), 4);
    }
}
