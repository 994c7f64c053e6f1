//! The one configuration every part of trainmem reads: the URL query encodes it, the CLI parses
//! it, the UI edits it, and [`crate::estimator::estimate`] reads it. Its key names and value
//! spellings are defined by the codec in [`crate::config`]; the types and defaults live here so
//! the estimator depends on nothing else of ours.

use super::model::ModelSpec;
use super::presets::{default_spec, DEFAULT_PRESET};
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
    pub serve: super::serve::settings::Serving,
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
            serve: super::serve::settings::Serving::default(),
        }
    }
}

impl Config {
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
