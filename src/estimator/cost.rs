//! The cost model: FLOPs, communication and an *estimated* step time for one configuration —
//! what the planner ([`super::plan`]) ranks fitting configurations by.
//!
//! Memory is exact where the estimator is; time is not. Nothing here was measured: it is the
//! standard analytical model of the literature (Megatron-LM's FLOPs accounting, ring-collective
//! volumes, the pipeline bubble) with the datasheet figures of [`super::gpu`] and a few named
//! assumptions ([`Assumptions`]). Its job is to order plans sensibly and to say what each knob
//! costs, not to predict a run to the second; every result carries [`StepCost::assumptions`] so
//! the UI can show what it rests on, and [`ESTIMATE_LABEL`] says what it is.
//!
//! # FLOPs
//! Per token and decoder layer, with `N` the matmul parameters a token passes through:
//! - forward matmuls `2N`, backward `4N` (input and weight gradients): the `6N` rule
//!   (Kaplan et al. 2020, §2.1; PaLM, Chowdhery et al. 2022, Appendix B);
//! - attention scores `QKᵀ` and `softmax·V`: `2·s·a·d` each forward, i.e. `4·s·a·d` forward and
//!   `12·s·a·d` forward + backward — PaLM's `12·L·H·Q·T` term, Korthikanti et al. 2022's
//!   `4·b·s²·h` per layer (§6) with `a·d = h`.
//!
//! For GPT-3's shapes this is exactly Korthikanti et al. 2022's model FLOPs
//! `72·B·s·L·h²·(1 + s/6h + V/12Lh)` (tested below). Causal masking is not discounted (the
//! convention of both papers, so MFU compares with theirs). Recomputation adds what it runs
//! again: full, each layer's whole forward — which gives Narayanan et al. 2021's eq. (3),
//! `96·B·s·L·h²·(1 + s/6h + V/16Lh)` (tested); selective, the attention core's forward,
//! `4·s·a·d` per token and layer. (Korthikanti et al. 2022 quote 2.7 % for GPT-3 175B, which is
//! the attention core's whole forward-and-backward share; only its forward runs again, 0.9 %.)
//!
//! # Communication
//! Per GPU and step, for each parallelism, the bytes its collectives move and their time over
//! the link the group spans (see [`group_link`]): ring all-reduce `2(g−1)/g·S/B`, all-gather and
//! reduce-scatter `(g−1)/g·S/B` (NCCL's "bus bandwidth", nccl-tests `doc/PERFORMANCE.md`).
//!
//! # Step time
//! `compute / efficiency + exposed communication + pipeline bubble + optimizer step + offload`,
//! where data-parallel and context-parallel traffic hides behind compute when
//! [`Assumptions::overlap`] is on (DDP buckets, ZeRO-3 prefetch, ring attention) and tensor-,
//! pipeline- and expert-parallel traffic is on the critical path.

use super::config::{Attention, Config, Finetune, Interconnect, LoraTargets, Offload, Optimizer, Precision, Recompute, Zero};
use super::gpu::{self, ScaleUp};
use super::model::{MlpKind, ModelSpec};
use super::precision::{recipe, Dtype};
use super::sharding::{Sharding, OPTIMIZER_STATES_FROM};
use serde::Serialize;

/// What every figure of this module is, in the words the UI and CLI show beside it.
pub const ESTIMATE_LABEL: &str = "estimate (analytical model, not measured)";

/// FLOPs of one multiply-add.
pub const FLOPS_PER_MAC: f64 = 2.0;
/// Forward + backward over forward for a trainable matmul: backward computes the input and the
/// weight gradient, each as costly as the forward (Kaplan et al. 2020, §2.1).
pub const TRAIN_PASSES: f64 = 3.0;
/// Backward over forward for a frozen matmul (LoRA's base): only the input gradient.
pub const FROZEN_TRAIN_PASSES: f64 = 2.0;
/// Matmuls of the attention core per layer and token: `QKᵀ` and `softmax·V`.
pub const ATTENTION_CORE_MATMULS: f64 = 2.0;

/// Default fraction of the dense peak that training's kernels sustain. An assumption: large
/// BF16 GEMMs reach 60–80 % of peak on A100/H100, while normalization, activation and
/// attention kernels run far lower; published end-to-end MFUs of well-tuned runs sit at
/// 38–52 % (Narayanan et al. 2021: 52 % on A100; Llama 3, Dubey et al. 2024, Table 4: 38–43 % on
/// H100) *including* communication and bubbles, which this model adds separately.
pub const DEFAULT_COMPUTE_EFFICIENCY: f64 = 0.6;
/// Default fraction of a link's per-direction bandwidth NCCL's ring collectives reach (an
/// assumption; nccl-tests report bus bandwidths of roughly 80 % of NVLink's and InfiniBand's
/// line rate for large messages).
pub const DEFAULT_LINK_EFFICIENCY: f64 = 0.8;
/// Default host throughput of a CPU optimizer step under offload, parameters per second per
/// GPU process (an assumption in the range of DeepSpeed's CPU-Adam, Ren et al. 2021 §5).
pub const DEFAULT_CPU_OPTIMIZER_PARAMS_PER_S: f64 = 1.0e9;
/// Default speed-up of a step's compute under `torch.compile`, as a fraction (compute time
/// divided by `1 + this`). An assumption, the low end of what PyTorch's team measured:
/// "torch.compile improves training MFU between 10% and 23% for various model sizes" (Team
/// PyTorch at IBM and Meta, "Maximizing Training Throughput Using PyTorch FSDP and
/// Torch.compile", pytorch.org blog, May 2024: FSDP with selective checkpointing, 7B–70B Llama
/// shapes on A100/H100). Inductor fuses the elementwise chains between the GEMMs (norms, RoPE,
/// SiLU·mul, residual adds) into one kernel each, which this model does not time on its own
/// (its `kernels` assumption): the speed-up stands in for those kernels' memory traffic and
/// launches. Only compute is scaled; the FLOPs (and MFU's numerator) are the same.
pub const DEFAULT_COMPILE_SPEEDUP: f64 = 0.10;
/// Fraction of a micro-batch's compute its backward pass takes (backward = 2 × forward).
pub const BACKWARD_SHARE: f64 = 2.0 / 3.0;

/// Weight matrices of a gated MLP or expert (gate, up, down) and of a plain MLP (up, down).
pub const GATED_MLP_MATRICES: f64 = 3.0;
pub const PLAIN_MLP_MATRICES: f64 = 2.0;
/// Attention projections per width: Q and O are `h × a·d`, K and V are `h × k·d`.
pub const Q_AND_O: f64 = 2.0;
pub const K_AND_V: f64 = 2.0;
/// A ring all-reduce is a reduce-scatter and an all-gather: twice the volume of either.
pub const ALL_REDUCE_PHASES: f64 = 2.0;
/// ZeRO-3/FSDP gather each layer's parameters twice per micro-batch: forward and backward.
pub const ZERO3_GATHERS_PER_MICRO_BATCH: f64 = 2.0;
/// Tensor-parallel collectives per layer and micro-batch: two forward (after attention and
/// after the MLP), two backward; full recomputation repeats the two forward ones.
pub const TP_COLLECTIVES_PER_LAYER: f64 = 4.0;
pub const TP_COLLECTIVES_RECOMPUTED: f64 = 2.0;
/// Expert-parallel all-to-alls per MoE layer and micro-batch: dispatch and combine, forward and
/// backward; full recomputation repeats the forward pair.
pub const EP_ALL_TO_ALLS_PER_LAYER: f64 = 4.0;
pub const EP_ALL_TO_ALLS_RECOMPUTED: f64 = 2.0;
/// Ring attention's passes over the K/V ring per layer and micro-batch: one forward, and a
/// backward that moves K, V and their gradients (twice the forward volume).
pub const CP_RING_PASSES: f64 = 3.0;
/// Pipeline transfers per micro-batch and stage boundary: activations forward, gradients back.
pub const PP_TRANSFERS_PER_MICRO_BATCH: f64 = 2.0;
/// The optimizer reads and writes each state (and the master weights) once per step.
pub const READ_AND_WRITE: f64 = 2.0;

/// Gigabytes (10⁹ bytes): datasheets' unit for bandwidth.
pub const GB: f64 = 1.0e9;
/// Tera (10¹²): datasheets' unit for FLOP/s.
pub const TERA: f64 = 1.0e12;
/// Bits per byte, for line rates in Gb/s.
pub const BITS_PER_BYTE: f64 = 8.0;
/// Datasheets print link bandwidths for both directions together.
pub const DIRECTIONS: f64 = 2.0;

/// Why a configuration has no cost; always names the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CostError {
    #[error("`gpu` '{0}' is not in the catalog")]
    UnknownGpu(String),
    #[error("`gpu_tflops` must be given for a custom GPU: the cost model needs its dense 16-bit throughput")]
    MissingTflops,
    #[error("`gpu_hbm_gbs` must be given for a custom GPU: the cost model needs its memory bandwidth")]
    MissingHbm,
    #[error("`{key}` must be at least 1")]
    Zero { key: &'static str },
}

/// The model's named assumptions, which a caller may change (the UI shows them).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Assumptions {
    /// Fraction of the dense tensor peak the step's kernels sustain.
    pub compute_efficiency: f64,
    /// Fraction of a link's per-direction bandwidth collectives reach.
    pub link_efficiency: f64,
    /// Data-parallel, ZeRO/FSDP and context-parallel traffic hides behind compute.
    pub overlap: bool,
    /// CPU optimizer throughput under offload, parameters per second per GPU process.
    pub cpu_optimizer_params_per_s: f64,
    /// Compute speed-up of `compile = true` (see [`DEFAULT_COMPILE_SPEEDUP`]).
    pub compile_speedup: f64,
}

impl Default for Assumptions {
    fn default() -> Self {
        Assumptions {
            compute_efficiency: DEFAULT_COMPUTE_EFFICIENCY,
            link_efficiency: DEFAULT_LINK_EFFICIENCY,
            overlap: true,
            cpu_optimizer_params_per_s: DEFAULT_CPU_OPTIMIZER_PARAMS_PER_S,
            compile_speedup: DEFAULT_COMPILE_SPEEDUP,
        }
    }
}

/// One assumption as the UI lists it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Assumption {
    pub id: &'static str,
    pub text: String,
}

// ---------------------------------------------------------------------------------------------
// Hardware
// ---------------------------------------------------------------------------------------------

/// The figures of the configured GPU and cluster the model uses.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hardware {
    pub gpu: String,
    /// Dense 16-bit tensor TFLOP/s (BF16, or FP16 on cards without BF16).
    pub tflops16: f64,
    pub fp8_tflops: f64,
    pub fp32_tflops: f64,
    /// Whether BF16 runs on tensor cores.
    pub bf16: bool,
    pub hbm_gbs: f64,
    pub scale_up: ScaleUp,
    /// Bidirectional, as the datasheet prints it.
    pub scale_up_gbs: f64,
    /// Bidirectional.
    pub host_gbs: f64,
    pub gpus_per_node: u64,
    pub interconnect: Interconnect,
}

/// The configured GPU's figures (the catalog's, or the `gpu_*` keys of a custom GPU).
pub fn hardware(cfg: &Config) -> Result<Hardware, CostError> {
    if cfg.gpus_per_node == 0 {
        return Err(CostError::Zero { key: "gpus_per_node" });
    }
    if cfg.gpu == "custom" {
        if !cfg.gpu_tflops.is_finite() || cfg.gpu_tflops <= 0.0 {
            return Err(CostError::MissingTflops);
        }
        if !cfg.gpu_hbm_gbs.is_finite() || cfg.gpu_hbm_gbs <= 0.0 {
            return Err(CostError::MissingHbm);
        }
        let scale_up = if cfg.gpu_link_gbs > 0.0 { ScaleUp::NvLink(0) } else { ScaleUp::None };
        return Ok(Hardware {
            gpu: "custom".into(),
            tflops16: cfg.gpu_tflops,
            fp8_tflops: cfg.gpu_fp8_tflops,
            fp32_tflops: cfg.gpu_tflops / FP32_TO_TENSOR16_CUSTOM,
            bf16: true,
            hbm_gbs: cfg.gpu_hbm_gbs,
            scale_up,
            scale_up_gbs: cfg.gpu_link_gbs,
            host_gbs: if cfg.gpu_host_gbs > 0.0 { cfg.gpu_host_gbs } else { gpu::pcie_x16_gbs(5) },
            gpus_per_node: cfg.gpus_per_node,
            interconnect: cfg.interconnect,
        });
    }
    let g = gpu::gpu(&cfg.gpu).ok_or_else(|| CostError::UnknownGpu(cfg.gpu.clone()))?;
    Ok(Hardware {
        gpu: g.id.to_string(),
        tflops16: g.tensor16_tflops(),
        fp8_tflops: g.fp8_tflops,
        fp32_tflops: g.fp32_tflops,
        bf16: g.bf16_tflops > 0.0,
        hbm_gbs: g.hbm_gbs,
        scale_up: g.scale_up,
        scale_up_gbs: g.scale_up_gbs,
        host_gbs: g.host_gbs,
        gpus_per_node: cfg.gpus_per_node,
        interconnect: cfg.interconnect,
    })
}

/// A custom GPU's FP32 rate is taken as its 16-bit tensor rate over this (Hopper's ratio:
/// 989 / 67 ≈ 15), for FP32 recipes only.
pub const FP32_TO_TENSOR16_CUSTOM: f64 = 15.0;

/// Line rate per GPU of each interconnect class, GB/s per direction — assumptions named after
/// the reference systems that have them:
/// - `ib-xdr`: one ConnectX-8 800 Gb/s NIC per GPU (NVIDIA GB300 NVL72 / HGX B300 specs);
/// - `ib-ndr`: one ConnectX-7 400 Gb/s NIC per GPU (NVIDIA DGX H100 user guide: eight
///   single-port ConnectX-7 for the compute fabric);
/// - `ib-hdr`: one ConnectX-6 200 Gb/s NIC per GPU (NVIDIA DGX A100 user guide);
/// - `roce-400`: one 400 GbE NIC per GPU, RoCE v2;
/// - `eth-100` / `eth-25`: one 100 / 25 GbE port per node, shared by its GPUs.
pub fn interconnect_gbs(ic: Interconnect, gpus_per_node: u64) -> f64 {
    let per_gpu_gbit = |gbit: f64| gbit / BITS_PER_BYTE;
    let per_node_gbit = |gbit: f64| gbit / BITS_PER_BYTE / gpus_per_node.max(1) as f64;
    match ic {
        Interconnect::IbXdr => per_gpu_gbit(800.0),
        Interconnect::IbNdr => per_gpu_gbit(400.0),
        Interconnect::IbHdr => per_gpu_gbit(200.0),
        Interconnect::Roce400 => per_gpu_gbit(400.0),
        Interconnect::Eth100 => per_node_gbit(100.0),
        Interconnect::Eth25 => per_node_gbit(25.0),
    }
}

/// Which fabric a communication group runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkClass {
    /// NVLink / Infinity Fabric inside the node.
    ScaleUp,
    /// PCIe peer-to-peer inside the node (cards without a scale-up link).
    Pcie,
    /// The network between nodes.
    Network,
    /// No communication (a group of one).
    Local,
}

/// The link a group of `size` GPUs at rank `stride` spans, and its effective per-direction
/// bandwidth, GB/s. Ranks are laid out Megatron's way — tensor-parallel innermost, then context,
/// expert and data parallel, pipeline outermost — so a group spans `stride × size` consecutive
/// ranks and stays inside the node when that is at most `gpus_per_node`. Across nodes, each
/// GPU's ring traffic goes through its own NIC (NCCL opens one ring per NIC), so the group runs
/// at the per-GPU network rate, never faster than inside the node.
pub fn group_link(hw: &Hardware, a: &Assumptions, stride: u64, size: u64) -> (LinkClass, f64) {
    if size <= 1 {
        return (LinkClass::Local, f64::INFINITY);
    }
    let pcie = hw.host_gbs / DIRECTIONS;
    let intra = match hw.scale_up {
        ScaleUp::NvLink(_) | ScaleUp::InfinityFabric(_) => (LinkClass::ScaleUp, hw.scale_up_gbs / DIRECTIONS),
        // A bridge joins a pair of cards; a larger group falls back to PCIe.
        ScaleUp::NvLinkBridge(_) if size == 2 && stride == 1 => (LinkClass::ScaleUp, hw.scale_up_gbs / DIRECTIONS),
        _ => (LinkClass::Pcie, pcie),
    };
    let span = stride.saturating_mul(size);
    let (class, gbs) = if span <= hw.gpus_per_node {
        intra
    } else {
        (LinkClass::Network, interconnect_gbs(hw.interconnect, hw.gpus_per_node).min(intra.1))
    };
    (class, gbs * a.link_efficiency)
}

// ---------------------------------------------------------------------------------------------
// FLOPs
// ---------------------------------------------------------------------------------------------

/// Matmul parameters of one model, split the way the FLOPs formulas need them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MatmulParams {
    /// All decoder layers' matmul weights a token passes through (MoE: router, `top_k` routed
    /// experts and the shared experts; not the experts it skips).
    pub layers_active: f64,
    /// LM head (and OPT's output projection): `V·h` even when tied to the embedding, whose
    /// lookup is no matmul.
    pub head: f64,
    /// Input projection (OPT-350m's `project_in`).
    pub input: f64,
}

impl MatmulParams {
    /// `N` of the `6N` rule: every matmul weight a token uses.
    pub fn active(&self) -> f64 {
        self.layers_active + self.head + self.input
    }
}

/// Matmul weights per token: attention `h·(2·a·d + 2·k·d)` per layer; a dense MLP `3·h·f`
/// (gated) or `2·h·f` (plain); an MoE layer's router `h·E`, `top_k` gated experts `3·h·f_e` and
/// its shared experts; the LM head `V·h`. Biases and norms are elementwise and not counted.
pub fn matmul_params(m: &ModelSpec) -> MatmulParams {
    let h = m.hidden as f64;
    let mlp_matrices = |kind: MlpKind| if kind == MlpKind::Gated { GATED_MLP_MATRICES } else { PLAIN_MLP_MATRICES };
    let attention = h * (Q_AND_O * m.q_width() as f64 + K_AND_V * m.kv_width() as f64);
    let dense_mlp = mlp_matrices(m.mlp) * h * m.ffn as f64;
    let moe = if m.experts > 0 {
        // Routed experts are always gate/up/down (model.rs pushes all three).
        let routed = m.top_k.min(m.experts) as f64 * GATED_MLP_MATRICES * h * m.expert_ffn as f64;
        let shared = m.shared_experts as f64 * mlp_matrices(m.mlp) * h * m.shared_ffn as f64;
        let gate = if m.shared_gate { h } else { 0.0 };
        h * m.experts as f64 + routed + shared + gate
    } else {
        0.0
    };
    let layers_active = m.layers as f64 * attention + m.dense_mlp_layers() as f64 * dense_mlp + m.moe_layers() as f64 * moe;
    let ew = m.embed_width() as f64;
    let (input, output) = if m.embed_proj > 0 { (h * ew, ew * h) } else { (0.0, 0.0) };
    MatmulParams { layers_active, head: m.vocab as f64 * ew + output, input }
}

/// LoRA adapter weights a token passes through: `r·(in + out)` for each targeted linear
/// (Hu et al. 2021), counting `top_k` experts of an MoE layer.
pub fn lora_params(m: &ModelSpec, rank: u64, targets: LoraTargets) -> f64 {
    let r = rank as f64;
    let (h, q, kv) = (m.hidden as f64, m.q_width() as f64, m.kv_width() as f64);
    let t = |bit: u8| targets.has(bit);
    let mut attention = 0.0;
    if t(LoraTargets::Q) {
        attention += r * (h + q);
    }
    if t(LoraTargets::K) {
        attention += r * (h + kv);
    }
    if t(LoraTargets::V) {
        attention += r * (h + kv);
    }
    if t(LoraTargets::O) {
        attention += r * (q + h);
    }
    let mlp = |f: f64, gated: bool| {
        let mut p = 0.0;
        if gated && t(LoraTargets::GATE) {
            p += r * (h + f);
        }
        if t(LoraTargets::UP) {
            p += r * (h + f);
        }
        if t(LoraTargets::DOWN) {
            p += r * (f + h);
        }
        p
    };
    let gated = m.mlp == MlpKind::Gated;
    let moe = if m.experts > 0 {
        m.top_k.min(m.experts) as f64 * mlp(m.expert_ffn as f64, true) + m.shared_experts as f64 * mlp(m.shared_ffn as f64, gated)
    } else {
        0.0
    };
    m.layers as f64 * attention + m.dense_mlp_layers() as f64 * mlp(m.ffn as f64, gated) + m.moe_layers() as f64 * moe
}

/// Attention-core FLOPs of one token's forward pass: `QKᵀ` and `softmax·V`, `2·s·a·d` each, in
/// every layer — `4·L·s·a·d` (Korthikanti et al. 2022 §6: `4·b·s²·h` per layer and
/// micro-batch; PaLM Appendix B: a third of `12·L·H·Q·T`).
pub fn attention_forward_flops_per_token(m: &ModelSpec, seq: u64) -> f64 {
    ATTENTION_CORE_MATMULS * FLOPS_PER_MAC * m.layers as f64 * seq as f64 * m.q_width() as f64
}

/// Model FLOPs per token of a training step, forward and backward, no recomputation:
/// `6·N + 12·L·s·a·d` (PaLM, Chowdhery et al. 2022, Appendix B: `6N + 12·L·H·Q·T`).
pub fn model_flops_per_token(m: &ModelSpec, seq: u64) -> f64 {
    FLOPS_PER_MAC * TRAIN_PASSES * matmul_params(m).active() + TRAIN_PASSES * attention_forward_flops_per_token(m, seq)
}

/// FLOPs of one optimizer step, whole job.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Flops {
    /// Forward + backward without recomputation: `6N + 12·L·s·a·d` per token for full training
    /// (the numerator of MFU). With LoRA/QLoRA the frozen base computes no weight gradients:
    /// `4N + 12·L·s·a·d + 6·N_lora`.
    pub model: f64,
    /// What recomputation runs again (selective: the attention core's forward; full: each
    /// layer's forward).
    pub recompute: f64,
    /// `model + recompute`: what the GPUs execute.
    pub executed: f64,
    /// The matmul part of `executed` (runs at FP8 under `mixed-fp8`); the rest is attention.
    pub matmul: f64,
    /// Tokens per step: micro-batch × sequence × accumulation × data-parallel degree.
    pub tokens: f64,
}

/// Share of a layer's matmul FLOPs that `recompute = op` runs again: torchtitan 0.3.0's
/// `SelectiveAC` (`torchtitan/distributed/activation_checkpoint.py`, `wrapped_policy`) recomputes
/// the even-numbered mm of each block (k, o, up projections of a Llama layer: 3 of 7, about half
/// of its matmul FLOPs).
pub const OP_SAC_MATMULS_RECOMPUTED: f64 = 0.5;

/// The recompute FLOPs per token with every `recompute_every`-th layer fully checkpointed: those
/// layers recompute their whole forward (`full`), the others what `recompute` says.
///
/// Under Megatron's block method (`recompute = full`, `recompute_layers`) only the layers it
/// picks on a stage run their forward again, the others nothing: the full recomputation's FLOPs
/// times their share (Megatron-LM `megatron/core/recompute.py` `checkpointed_forward`).
fn every_nth_recompute(cfg: &Config, matmul_re: f64, attention_re: f64, full_matmul: f64, attention_fwd: f64) -> (f64, f64) {
    if cfg.recompute == Recompute::Full && cfg.recompute_layers > 0 {
        let stage = super::params::stages(cfg.pp)[0];
        let (ckpt, dense, moe) = super::step::model::checkpointed_alone_counts(cfg, stage);
        let share = ckpt as f64 / (ckpt + dense + moe).max(1) as f64;
        return (matmul_re * share, attention_re * share);
    }
    let n = cfg.recompute_every;
    if n == 0 || cfg.recompute == Recompute::Full {
        return (matmul_re, attention_re);
    }
    let layers = cfg.arch.layers.max(1) as f64;
    let share = (cfg.arch.layers / n) as f64 / layers;
    (matmul_re * (1.0 - share) + full_matmul * share, attention_re * (1.0 - share) + attention_fwd * share)
}

/// The step's FLOPs (see the module docs for the formulas).
pub fn step_flops(cfg: &Config) -> Flops {
    step_flops_with(cfg, &matmul_params(&cfg.arch))
}

/// [`step_flops`] with the model's matmul parameters already counted.
pub fn step_flops_with(cfg: &Config, p: &MatmulParams) -> Flops {
    let m = &cfg.arch;
    let tokens = cfg.batch as f64 * cfg.seq as f64 * cfg.accum as f64 * cfg.dp().max(1) as f64;
    let attention_fwd = attention_forward_flops_per_token(m, cfg.seq);
    let lora = if cfg.finetune == Finetune::Full { 0.0 } else { lora_params(m, cfg.lora_rank, cfg.lora_targets) };
    let base_passes = if cfg.finetune == Finetune::Full { TRAIN_PASSES } else { FROZEN_TRAIN_PASSES };
    let matmul_model = FLOPS_PER_MAC * (base_passes * p.active() + TRAIN_PASSES * lora);
    let attention_model = TRAIN_PASSES * attention_fwd;
    let (matmul_re, attention_re) = match cfg.recompute {
        Recompute::None => (0.0, 0.0),
        Recompute::Selective => (0.0, attention_fwd),
        // Each layer's forward again; the LM head and loss are not recomputed.
        Recompute::Full => (FLOPS_PER_MAC * (p.layers_active + lora), attention_fwd),
        // torchtitan's op-level SAC saves every odd-numbered mm and the attention kernel's
        // outputs: about half of each layer's matmuls run again, attention does not.
        Recompute::Op => (OP_SAC_MATMULS_RECOMPUTED * FLOPS_PER_MAC * (p.layers_active + lora), 0.0),
    };
    // recompute_every = N: every Nth layer is fully checkpointed, the others as `recompute` says.
    let (matmul_re, attention_re) =
        every_nth_recompute(cfg, matmul_re, attention_re, FLOPS_PER_MAC * (p.layers_active + lora), attention_fwd);
    let model = (matmul_model + attention_model) * tokens;
    let recompute = (matmul_re + attention_re) * tokens;
    Flops { model, recompute, executed: model + recompute, matmul: (matmul_model + matmul_re) * tokens, tokens }
}

// ---------------------------------------------------------------------------------------------
// Communication
// ---------------------------------------------------------------------------------------------

/// Which parallelism a transfer belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Parallelism {
    Data,
    Tensor,
    Pipeline,
    Context,
    Expert,
    Offload,
}

/// One kind of transfer of a step, on one GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CommTerm {
    pub id: &'static str,
    pub label: &'static str,
    pub parallelism: Parallelism,
    pub collective: &'static str,
    /// Bytes this GPU's collectives process per step (the buffer size `S` of each call, summed).
    pub bytes: f64,
    /// GPUs in the group.
    pub group: u64,
    pub link: LinkClass,
    /// Effective per-direction bandwidth, GB/s.
    pub gbs: f64,
    /// Time on the wire, seconds.
    pub seconds: f64,
    /// Whether it hides behind compute (when [`Assumptions::overlap`] is on).
    pub overlappable: bool,
    pub formula: &'static str,
    pub source: &'static str,
}

/// Ring all-reduce time of an `bytes` buffer over `g` GPUs: `2(g−1)/g · S / B`.
pub fn all_reduce_seconds(bytes: f64, g: u64, gbs: f64) -> f64 {
    if g <= 1 {
        return 0.0;
    }
    ALL_REDUCE_PHASES * (g - 1) as f64 / g as f64 * bytes / (gbs * GB)
}

/// Ring all-gather (or reduce-scatter) time of an `bytes` buffer (the gathered size) over `g`
/// GPUs: `(g−1)/g · S / B`. All-to-all moves the same `(g−1)/g` of its buffer.
pub fn all_gather_seconds(bytes: f64, g: u64, gbs: f64) -> f64 {
    if g <= 1 {
        return 0.0;
    }
    (g - 1) as f64 / g as f64 * bytes / (gbs * GB)
}

/// The figures of one architecture the cost model needs, computed once (the planner costs
/// thousands of configurations of the same model).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ModelFigures {
    pub matmul: MatmulParams,
    /// Every parameter (matmuls, embeddings, norms, biases): the exact count.
    pub total: f64,
    /// Routed-expert parameters of all MoE layers.
    pub experts: f64,
}

impl ModelFigures {
    pub fn of(m: &ModelSpec) -> ModelFigures {
        let h = m.hidden as f64;
        let experts =
            if m.experts > 0 { m.moe_layers() as f64 * m.experts as f64 * GATED_MLP_MATRICES * h * m.expert_ffn as f64 } else { 0.0 };
        ModelFigures { matmul: matmul_params(m), total: m.counts().total as f64, experts }
    }
}

/// Parameters on one GPU after tensor, pipeline and expert parallelism, split as the
/// data-parallel collectives see them.
#[derive(Clone, Copy, Debug, PartialEq)]
struct LocalParams {
    /// Non-expert parameters (reduced over the data-parallel group).
    dense: f64,
    /// Routed-expert parameters (reduced over the expert-data-parallel group).
    expert: f64,
}

fn local_params(fig: &ModelFigures, cfg: &Config) -> LocalParams {
    let mp = (cfg.tp * cfg.pp).max(1) as f64;
    LocalParams { dense: (fig.total - fig.experts).max(0.0) / mp, expert: fig.experts / (mp * cfg.ep.max(1) as f64) }
}

/// Bytes per element a recipe moves for weights, gradients and activations.
fn dtype_bytes(d: Dtype) -> f64 {
    d.bytes() as f64
}

/// Trainable fraction of the parameters (LoRA trains only its adapters; they are what the
/// data-parallel group reduces).
fn trainable_fraction(cfg: &Config, fig: &ModelFigures) -> f64 {
    if cfg.finetune == Finetune::Full {
        return 1.0;
    }
    // Adapter weights of every layer (all experts carry adapters, not just the routed ones).
    let m = &cfg.arch;
    let per_token = lora_params(m, cfg.lora_rank, cfg.lora_targets);
    let all_experts = if m.experts > 0 && m.top_k > 0 { m.experts as f64 / m.top_k.min(m.experts) as f64 } else { 1.0 };
    (per_token * all_experts / fig.total.max(1.0)).min(1.0)
}

/// NF4 stores two weights per byte (Dettmers et al. 2023): what QLoRA's ZeRO-3 gathers move.
const NF4_BYTES: f64 = 0.5;

/// Every transfer of one GPU's step, with its time over the link its group spans.
pub fn communication(cfg: &Config, hw: &Hardware, a: &Assumptions, fig: &ModelFigures) -> Vec<CommTerm> {
    let m = &cfg.arch;
    let r = recipe(cfg.precision);
    let (tp, pp, cp, ep, vpp) = (cfg.tp.max(1), cfg.pp.max(1), cfg.cp.max(1), cfg.ep.max(1), cfg.vpp.max(1));
    let dp = cfg.dp().max(1);
    let accum = cfg.accum.max(1) as f64;
    let mut out = Vec::with_capacity(8);
    let act = dtype_bytes(r.compute);
    let weight = if cfg.finetune == Finetune::Qlora { NF4_BYTES } else { dtype_bytes(r.weight) };
    let grad = dtype_bytes(r.grad);
    let local = local_params(fig, cfg);
    let trainable = trainable_fraction(cfg, fig);

    // Data parallelism: gradients are reduced over data × context parallel ranks (Megatron keeps
    // parameters replicated across context-parallel ranks); experts over that group ÷ ep.
    let dp_group = dp * cp;
    let push_dp = |out: &mut Vec<CommTerm>,
                   id,
                   label,
                   collective,
                   bytes: f64,
                   group: u64,
                   stride: u64,
                   all_reduce: bool,
                   formula,
                   source,
                   overlappable| {
        if group <= 1 || bytes <= 0.0 {
            return;
        }
        let (link, gbs) = group_link(hw, a, stride, group);
        let seconds = if all_reduce { all_reduce_seconds(bytes, group, gbs) } else { all_gather_seconds(bytes, group, gbs) };
        out.push(CommTerm {
            id,
            label,
            parallelism: Parallelism::Data,
            collective,
            bytes,
            group,
            link,
            gbs,
            seconds,
            overlappable,
            formula,
            source,
        });
    };
    let ep_dp = (dp_group / ep).max(1);
    for (kind, params, group, stride) in [(0, local.dense, dp_group, tp), (1, local.expert, ep_dp, tp * ep)] {
        if params <= 0.0 {
            continue;
        }
        let psi_t = params * trainable;
        let expert = kind == 1;
        let (sg, rg) = match cfg.zero {
            Zero::HybridShard => {
                let s = cfg.shard_group.clamp(1, group);
                (s, (group / s).max(1))
            }
            _ => (group, 1),
        };
        match cfg.zero.stage() {
            0 => push_dp(
                &mut out,
                if expert { "dp_expert_allreduce" } else { "dp_allreduce" },
                if expert { "Expert gradient all-reduce" } else { "Gradient all-reduce (DDP)" },
                "all-reduce",
                psi_t * grad,
                group,
                stride,
                true,
                "2(N−1)/N · Ψ·b_g / B, once per step (no_sync while accumulating)",
                "PyTorch DDP (bucketed all-reduce during backward, DistributedDataParallel.no_sync); Li et al. 2020",
                true,
            ),
            1 | 2 => {
                let micro = if cfg.zero.stage() == 2 { accum } else { 1.0 };
                push_dp(
                    &mut out,
                    if expert { "dp_expert_reduce_scatter" } else { "dp_reduce_scatter" },
                    if cfg.zero.stage() == 2 { "Gradient reduce-scatter, every micro-batch (ZeRO-2)" } else { "Gradient reduce-scatter (ZeRO-1)" },
                    "reduce-scatter",
                    psi_t * grad * micro,
                    group,
                    stride,
                    false,
                    "(N−1)/N · Ψ·b_g / B (× micro-batches under ZeRO-2)",
                    "Rajbhandari et al. 2020 (ZeRO) §7.2.1: reduce-scatter + all-gather = DDP's 2Ψ; DeepSpeed stage 2 reduces every micro-step",
                    true,
                );
                push_dp(
                    &mut out,
                    if expert { "dp_expert_param_all_gather" } else { "dp_param_all_gather" },
                    "Updated-parameter all-gather after the optimizer step",
                    "all-gather",
                    psi_t * weight,
                    group,
                    stride,
                    false,
                    "(N−1)/N · Ψ·b_w / B, once per step",
                    "Rajbhandari et al. 2020 (ZeRO) §7.2.1",
                    false,
                );
            }
            _ => {
                push_dp(
                    &mut out,
                    if expert { "zero3_expert_all_gather" } else { "zero3_all_gather" },
                    "Parameter all-gathers, forward and backward, every micro-batch (ZeRO-3/FSDP)",
                    "all-gather",
                    ZERO3_GATHERS_PER_MICRO_BATCH * params * weight * accum,
                    sg,
                    stride,
                    false,
                    "2 × (N−1)/N · Ψ·b_w / B per micro-batch",
                    "Rajbhandari et al. 2020 (ZeRO) §7.2.2: 3Ψ per step, 1.5× DDP; PyTorch FSDP FULL_SHARD",
                    true,
                );
                push_dp(
                    &mut out,
                    if expert { "zero3_expert_reduce_scatter" } else { "zero3_reduce_scatter" },
                    "Gradient reduce-scatter, every micro-batch (ZeRO-3/FSDP)",
                    "reduce-scatter",
                    psi_t * grad * accum,
                    sg,
                    stride,
                    false,
                    "(N−1)/N · Ψ·b_g / B per micro-batch",
                    "Rajbhandari et al. 2020 (ZeRO) §7.2.2",
                    true,
                );
                if rg > 1 {
                    push_dp(
                        &mut out,
                        if expert { "hsdp_expert_allreduce" } else { "hsdp_allreduce" },
                        "Gradient-shard all-reduce across replicas (HYBRID_SHARD)",
                        "all-reduce",
                        psi_t * grad / sg as f64,
                        rg,
                        stride * sg,
                        true,
                        "2(R−1)/R · (Ψ·b_g / S) / B, once per step",
                        "PyTorch FSDP HYBRID_SHARD: FULL_SHARD inside the group, all-reduce across groups",
                        true,
                    );
                }
            }
        }
    }

    // Tensor parallelism: per layer and micro-batch, two all-reduces forward and two backward
    // of the b·s·h activations (Shoeybi et al. 2019 §3, Fig. 4); with sequence parallelism the
    // same volume as all-gathers and reduce-scatters (Korthikanti et al. 2022 §4.2.2). Full
    // recomputation repeats the forward ones.
    if tp > 1 {
        let layers = super::params::stage_layers(m.layers, pp) as f64;
        let calls = TP_COLLECTIVES_PER_LAYER + if cfg.recompute == Recompute::Full { TP_COLLECTIVES_RECOMPUTED } else { 0.0 };
        let s = cfg.batch as f64 * cfg.seq_per_gpu() as f64 * m.hidden as f64 * act;
        let (link, gbs) = group_link(hw, a, 1, tp);
        let bytes = calls * layers * accum * s;
        out.push(CommTerm {
            id: "tp_collectives",
            label: if cfg.sp { "Sequence-parallel all-gathers and reduce-scatters" } else { "Tensor-parallel activation all-reduces" },
            parallelism: Parallelism::Tensor,
            collective: if cfg.sp { "all-gather + reduce-scatter" } else { "all-reduce" },
            bytes,
            group: tp,
            link,
            gbs,
            seconds: all_reduce_seconds(bytes, tp, gbs),
            overlappable: false,
            formula: "4 (6 with full recompute) × L_stage × micro-batches × 2(t−1)/t · b·s·h·b_a / B",
            source: "Shoeybi et al. 2019 (Megatron-LM) §3; Korthikanti et al. 2022 §4.2.2 (sequence parallelism: same volume)",
        });
    }

    // Context parallelism: ring attention passes each rank's K and V around the ring, cp − 1
    // hops forward; backward passes K, V and their gradients (twice the forward volume).
    if cp > 1 {
        let layers = super::params::stage_layers(m.layers, pp) as f64;
        let chunk = K_AND_V * cfg.batch as f64 * cfg.seq_per_gpu() as f64 * (m.kv_width() / tp).max(1) as f64 * act;
        let bytes = CP_RING_PASSES * (cp - 1) as f64 * chunk * layers * accum;
        let (link, gbs) = group_link(hw, a, tp, cp);
        out.push(CommTerm {
            id: "cp_ring",
            label: "Context-parallel K/V ring exchange",
            parallelism: Parallelism::Context,
            collective: "send/recv ring",
            bytes,
            group: cp,
            link,
            gbs,
            seconds: bytes / (gbs * GB),
            overlappable: true,
            formula: "3 × (c−1) × 2·b·(s/c)·(k·d/t)·b_a per layer and micro-batch / B",
            source: "Liu et al. 2023 (Ring Attention); Megatron-LM context parallelism docs (P2P ring overlapped with attention)",
        });
    }

    // Pipeline parallelism: each micro-batch sends its activations forward and receives the
    // gradients back at every stage boundary — vpp times with interleaving.
    if pp > 1 {
        let mut s = cfg.batch as f64 * cfg.seq_per_gpu() as f64 * m.hidden as f64 * act;
        if cfg.sp {
            // Megatron's scatter-gather: each tensor-parallel rank sends its 1/t slice.
            s /= tp as f64;
        }
        let bytes = PP_TRANSFERS_PER_MICRO_BATCH * s * vpp as f64 * accum;
        let (link, gbs) = group_link(hw, a, tp * cp * dp, 2);
        out.push(CommTerm {
            id: "pp_p2p",
            label: "Pipeline activations and gradients between stages",
            parallelism: Parallelism::Pipeline,
            collective: "send/recv",
            bytes,
            group: pp,
            link,
            gbs,
            seconds: bytes / (gbs * GB),
            overlappable: false,
            formula: "2 × v × micro-batches × b·s·h·b_a / B",
            source: "Narayanan et al. 2021 §2.2, §4.1 (scatter/gather optimization)",
        });
    }

    // Expert parallelism: dispatch and combine all-to-alls forward, and again backward, in every
    // MoE layer (GShard, Lepikhin et al. 2020; DeepSpeed-MoE, Rajbhandari et al. 2022).
    if ep > 1 && m.moe_layers() > 0 {
        let layers = m.moe_layers() as f64 / pp as f64;
        let calls = EP_ALL_TO_ALLS_PER_LAYER + if cfg.recompute == Recompute::Full { EP_ALL_TO_ALLS_RECOMPUTED } else { 0.0 };
        let tokens = cfg.batch as f64 * cfg.seq_per_gpu() as f64;
        let bytes = calls * layers * accum * tokens * m.top_k as f64 * m.hidden as f64 * act;
        let (link, gbs) = group_link(hw, a, tp * cp, ep);
        out.push(CommTerm {
            id: "ep_all_to_all",
            label: "Expert-parallel token all-to-alls",
            parallelism: Parallelism::Expert,
            collective: "all-to-all",
            bytes,
            group: ep,
            link,
            gbs,
            seconds: all_gather_seconds(bytes, ep, gbs),
            overlappable: false,
            formula: "4 (6 with full recompute) × MoE layers × micro-batches × (e−1)/e · b·s·k·h·b_a / B",
            source: "Lepikhin et al. 2020 (GShard); Rajbhandari et al. 2022 (DeepSpeed-MoE)",
        });
    }

    // CPU offload: gradients down and updated weights up over the host link each step; with
    // parameter offload also the weights of every forward and backward.
    if cfg.offload != Offload::None {
        // Each GPU offloads and updates its shard of the optimizer's tensors.
        let shards = Sharding::of(cfg).ways(OPTIMIZER_STATES_FROM).0 as f64;
        let psi = (local.dense + local.expert) / shards;
        let mut bytes = psi * trainable * (grad + dtype_bytes(r.weight));
        if cfg.offload == Offload::OptimizerParams {
            bytes += ZERO3_GATHERS_PER_MICRO_BATCH * psi * weight * accum;
        }
        out.push(host_copy_term(
            hw,
            a,
            ("offload_pcie", "Offload traffic over the host link"),
            bytes,
            false,
            "Ψ_shard·(b_g + b_w) (+ 2·Ψ_shard·b_w per micro-batch with parameter offload) / B_host",
            "Ren et al. 2021 (ZeRO-Offload) §4; Rajbhandari et al. 2021 (ZeRO-Infinity)",
        ));
    }
    if let Some(t) = activation_offload_term(cfg, hw, a) {
        out.push(t);
    }
    out
}

/// Activation offloading's copies over the host link (`act_offload`, `act_offload_layers`): the
/// offloaded layers' saved activations go to pinned host memory in forward and come back in
/// backward, on a side stream that overlaps compute (torchtune 0.6.1 `OffloadActivations` with
/// `use_streams=True`; Transformer Engine 2.20.2 `cpu_offload.py`'s offload stream):
///
/// `bytes = 2 · n_off · M_layer` per micro-batch
///
/// where `M_layer` is one layer's saved activations by Korthikanti et al. 2022's per-layer terms
/// (`activations::megatron_activations`, the step program's exact bytes are in the estimate's
/// `offloaded_activations` host row) and `n_off` the layers offloaded: every layer of the stage
/// under torchtune's hooks, the first `act_offload_layers` under Transformer Engine's.
fn activation_offload_term(cfg: &Config, hw: &Hardware, a: &Assumptions) -> Option<CommTerm> {
    let layers = super::params::stage_layers(cfg.arch.layers, cfg.pp.max(1));
    let n = if cfg.act_offload.on() { layers } else { cfg.act_offload_layers.min(layers) };
    if n == 0 {
        return None;
    }
    let stage = if cfg.pp > 1 { super::params::Stage::First } else { super::params::Stage::Whole };
    let per_layer = super::activations::megatron_activations(cfg, &recipe(cfg.precision), stage, layers).per_layer as f64;
    let bytes = OFFLOAD_DIRECTIONS * n as f64 * per_layer * cfg.accum.max(1) as f64;
    Some(host_copy_term(
        hw,
        a,
        ("act_offload_pcie", "Activation offloading over the host link"),
        bytes,
        true,
        "2 × offloaded layers × M_layer per micro-batch / B_host (to the host in forward, back in backward, on a side stream)",
        "torchtune 0.6.1 training/_activation_offloading.py (use_streams); Transformer Engine 2.20.2 pytorch/cpu_offload.py; M_layer: Korthikanti et al. 2022",
    ))
}

/// A copy of `bytes` over the host link (one direction's share of its bandwidth, at the link
/// efficiency): what the optimizer's offload and activation offloading move.
fn host_copy_term(
    hw: &Hardware,
    a: &Assumptions,
    (id, label): (&'static str, &'static str),
    bytes: f64,
    overlappable: bool,
    formula: &'static str,
    source: &'static str,
) -> CommTerm {
    let host = hw.host_gbs / DIRECTIONS * a.link_efficiency;
    CommTerm {
        id,
        label,
        parallelism: Parallelism::Offload,
        collective: "copy",
        bytes,
        group: 1,
        link: LinkClass::Pcie,
        gbs: host,
        seconds: bytes / (host * GB),
        overlappable,
        formula,
        source,
    }
}

/// Offloaded activations cross the host link twice: out in forward, back in backward.
const OFFLOAD_DIRECTIONS: f64 = 2.0;

// ---------------------------------------------------------------------------------------------
// Step time
// ---------------------------------------------------------------------------------------------

/// The estimated cost of one optimizer step of one configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepCost {
    /// Always [`ESTIMATE_LABEL`].
    pub label: &'static str,
    pub flops: Flops,
    /// FLOPs one GPU executes per step.
    pub flops_per_gpu: f64,
    /// Dense peak the step's matmuls run at, TFLOP/s per GPU.
    pub peak_tflops: f64,
    pub compute_s: f64,
    pub comm: Vec<CommTerm>,
    /// Communication on the critical path.
    pub exposed_comm_s: f64,
    /// Idle fraction of the pipeline: `(p−1)/(v·m)` of the ideal time.
    pub bubble_fraction: f64,
    pub bubble_s: f64,
    /// The GPU optimizer step (memory-bound) or the CPU one under offload.
    pub optimizer_s: f64,
    pub step_s: f64,
    pub tokens_per_s: f64,
    /// Model FLOPs utilization: model FLOPs ÷ (GPUs × 16-bit dense peak × step time).
    pub mfu: f64,
    pub assumptions: Vec<Assumption>,
}

/// Bytes the optimizer reads and writes per trainable parameter in its step: it reads the
/// gradient, reads and writes the master (or the weight) and each state, and writes the weight.
fn optimizer_bytes_per_param(cfg: &Config) -> f64 {
    let r = recipe(cfg.precision);
    let states = match cfg.optim {
        Optimizer::Sgd => 0.0,
        Optimizer::Momentum | Optimizer::Lion | Optimizer::Muon => 1.0,
        Optimizer::Adamw => 2.0,
        // 8-bit moments: two one-byte states.
        Optimizer::Adam8bit => 2.0 / dtype_bytes(r.state),
        // Factored second moment: negligible next to the weights.
        Optimizer::Adafactor => 0.0,
    };
    let master = r.master.map_or(0.0, dtype_bytes);
    // Without a master copy the weight itself is read and written; with one, only written.
    let weight_passes = if master > 0.0 { 1.0 } else { READ_AND_WRITE };
    dtype_bytes(r.grad) + READ_AND_WRITE * (master + states * dtype_bytes(r.state)) + dtype_bytes(r.weight) * weight_passes
}

/// The dense rate the step's matmuls run at, TFLOP/s, and what it assumes.
fn matmul_rate(cfg: &Config, hw: &Hardware) -> (f64, Option<&'static str>) {
    match cfg.precision {
        Precision::Fp32 => (hw.fp32_tflops, Some("fp32 training runs without tensor cores (PyTorch's default: TF32 off for matmuls)")),
        Precision::MixedFp8 if hw.fp8_tflops > 0.0 => {
            (hw.fp8_tflops, Some("mixed-fp8: matmuls at the FP8 rate, attention at the 16-bit rate"))
        }
        Precision::MixedFp8 => (hw.tflops16, Some("this GPU has no FP8: mixed-fp8 estimated at the 16-bit rate")),
        Precision::Bf16 | Precision::AmpBf16 | Precision::MixedBf16 | Precision::MixedBf16Fp32grad if !hw.bf16 => {
            (hw.fp32_tflops, Some("this GPU has no BF16 tensor cores: BF16 estimated at its FP32 rate"))
        }
        _ => (hw.tflops16, None),
    }
}

/// The estimated step: compute, communication, bubble and optimizer (see the module docs),
/// with the assumptions it rests on.
pub fn step_cost(cfg: &Config, a: &Assumptions) -> Result<StepCost, CostError> {
    let hw = hardware(cfg)?;
    let mut c = step_cost_with(cfg, a, &hw, &ModelFigures::of(&cfg.arch))?;
    c.assumptions = assumptions(cfg, a, &hw);
    Ok(c)
}

/// [`step_cost`] for a caller that costs many configurations of one model on one cluster
/// (the planner): the hardware and model figures are computed once, and the assumptions are
/// left for [`assumptions`].
pub fn step_cost_with(cfg: &Config, a: &Assumptions, hw: &Hardware, fig: &ModelFigures) -> Result<StepCost, CostError> {
    for (key, v) in [("gpus", cfg.gpus), ("batch", cfg.batch), ("seq", cfg.seq), ("accum", cfg.accum)] {
        if v == 0 {
            return Err(CostError::Zero { key });
        }
    }
    let flops = step_flops_with(cfg, &fig.matmul);
    let gpus = cfg.gpus as f64;
    let flops_per_gpu = flops.executed / gpus;
    let rate = matmul_rate(cfg, hw).0;
    let attention_rate = if cfg.precision == Precision::Fp32 || !hw.bf16 && is_bf16(cfg.precision) { hw.fp32_tflops } else { hw.tflops16 };
    let eff = a.compute_efficiency.clamp(MIN_EFFICIENCY, 1.0);
    let compute_s = (flops.matmul / gpus / (rate * TERA) + (flops.executed - flops.matmul) / gpus / (attention_rate * TERA))
        / eff
        / compile_factor(cfg, a);

    let comm = communication(cfg, hw, a, fig);
    let accum = cfg.accum.max(1) as f64;
    let per_micro = compute_s / accum;
    // Overlap: traffic issued every micro-batch hides behind that micro-batch's compute; traffic
    // issued once per step (DDP, ZeRO-1 and HSDP reductions) behind the last micro-batch's
    // backward.
    let mut exposed = 0.0;
    let mut per_step_overlappable = 0.0;
    let mut per_micro_overlappable = 0.0;
    for t in &comm {
        if !(a.overlap && t.overlappable) {
            exposed += t.seconds;
        } else if once_per_step(cfg, t.id) {
            per_step_overlappable += t.seconds;
        } else {
            per_micro_overlappable += t.seconds / accum;
        }
    }
    exposed += accum * (per_micro_overlappable - per_micro).max(0.0);
    exposed += (per_step_overlappable - BACKWARD_SHARE * per_micro).max(0.0);

    // Pipeline bubble: (p − 1)/(v·m) of the ideal time (Narayanan et al. 2021 §2.2.1–2.2.2).
    let (pp, vpp) = (cfg.pp.max(1), cfg.vpp.max(1));
    let bubble_fraction = if pp > 1 { (pp - 1) as f64 / (vpp as f64 * accum) } else { 0.0 };
    let tp_s: f64 = comm.iter().filter(|t| t.parallelism == Parallelism::Tensor).map(|t| t.seconds).sum();
    let bubble_s = bubble_fraction * (compute_s + tp_s);

    // Optimizer step: memory-bound on the GPU, or the CPU's under offload.
    let lp = local_params(fig, cfg);
    let shards = Sharding::of(cfg).ways(OPTIMIZER_STATES_FROM).0 as f64;
    let trainable_local = (lp.dense + lp.expert) * trainable_fraction(cfg, fig) / shards;
    let optimizer_s = if cfg.offload == Offload::None {
        trainable_local * optimizer_bytes_per_param(cfg) / (hw.hbm_gbs * GB)
    } else {
        trainable_local / a.cpu_optimizer_params_per_s.max(1.0)
    };

    let step_s = compute_s + exposed + bubble_s + optimizer_s;
    let peak16 = if cfg.precision == Precision::Fp32 { hw.fp32_tflops } else { hw.tflops16 };
    let mfu = if step_s > 0.0 { flops.model / (gpus * peak16 * TERA * step_s) } else { 0.0 };
    Ok(StepCost {
        label: ESTIMATE_LABEL,
        flops,
        flops_per_gpu,
        peak_tflops: rate,
        compute_s,
        exposed_comm_s: exposed,
        comm,
        bubble_fraction,
        bubble_s,
        optimizer_s,
        step_s,
        tokens_per_s: if step_s > 0.0 { flops.tokens / step_s } else { 0.0 },
        mfu,
        assumptions: Vec::new(),
    })
}

/// What compute time is divided by: `1 + compile_speedup` under `compile = true`, else 1
/// (a negative speed-up is taken as none).
fn compile_factor(cfg: &Config, a: &Assumptions) -> f64 {
    if cfg.compile {
        1.0 + a.compile_speedup.max(0.0)
    } else {
        1.0
    }
}

/// Smallest compute efficiency the model accepts (keeps times finite).
const MIN_EFFICIENCY: f64 = 1e-3;

fn is_bf16(p: Precision) -> bool {
    matches!(p, Precision::Bf16 | Precision::AmpBf16 | Precision::MixedBf16 | Precision::MixedBf16Fp32grad | Precision::MixedFp8)
}

/// Whether a data-parallel transfer is issued once per step (rather than every micro-batch).
fn once_per_step(cfg: &Config, id: &str) -> bool {
    match id {
        "dp_allreduce" | "dp_expert_allreduce" | "hsdp_allreduce" | "hsdp_expert_allreduce" => true,
        "dp_reduce_scatter" | "dp_expert_reduce_scatter" => cfg.zero.stage() == 1,
        _ => false,
    }
}

/// What an estimate of `cfg` rests on, in sentences.
pub fn assumptions(cfg: &Config, a: &Assumptions, hw: &Hardware) -> Vec<Assumption> {
    let (rate, rate_note) = matmul_rate(cfg, hw);
    let mut out = vec![
        Assumption {
            id: "compute_efficiency",
            text: format!(
                "kernels sustain {:.0} % of the dense peak ({} TFLOP/s per GPU)",
                a.compute_efficiency.clamp(MIN_EFFICIENCY, 1.0) * 100.0,
                trim(rate)
            ),
        },
        Assumption {
            id: "link_efficiency",
            text: format!("collectives reach {:.0} % of each link's per-direction bandwidth", a.link_efficiency * 100.0),
        },
        Assumption {
            id: "overlap",
            text: if a.overlap {
                "data-parallel, ZeRO/FSDP and context-parallel traffic overlaps compute; tensor-, pipeline- and expert-parallel traffic does not".into()
            } else {
                "no communication overlaps compute".into()
            },
        },
        Assumption {
            id: "interconnect",
            text: format!(
                "{} GPUs per node share the scale-up link; across nodes each GPU gets {} GB/s per direction ({})",
                cfg.gpus_per_node,
                trim(interconnect_gbs(cfg.interconnect, cfg.gpus_per_node)),
                interconnect_name(cfg.interconnect)
            ),
        },
        Assumption { id: "causal", text: "attention FLOPs count the full s² (no causal discount), as Megatron and PaLM do".into() },
        Assumption {
            id: "kernels",
            text: "every kernel runs at the same efficiency; small matrices, norms and the loss are not slower than large GEMMs".into(),
        },
    ];
    if cfg.pp > 1 {
        out.push(Assumption {
            id: "pipeline_balance",
            text: "pipeline stages are balanced: the embedding's and LM head's stages do no more work than the others".into(),
        });
    }
    if cfg.attn == Attention::Eager {
        out.push(Assumption {
            id: "eager",
            text: "eager attention is costed like fused attention (same FLOPs; its extra memory traffic is not)".into(),
        });
    }
    if cfg.compile {
        out.push(Assumption {
            id: "compile",
            text: format!(
                "torch.compile runs the step's compute {:.0} % faster (fused elementwise kernels; PyTorch's FSDP + compile measurements: 10–23 % MFU)",
                a.compile_speedup.max(0.0) * 100.0
            ),
        });
    }
    if cfg.offload != Offload::None {
        out.push(Assumption {
            id: "cpu_optimizer",
            text: format!("the CPU optimizer steps {:.1e} parameters/s per GPU process", a.cpu_optimizer_params_per_s),
        });
    }
    if let Some(n) = rate_note {
        out.push(Assumption { id: "rate", text: n.to_string() });
    }
    out
}

/// The interconnect's spelling in the UI.
pub fn interconnect_name(ic: Interconnect) -> &'static str {
    match ic {
        Interconnect::IbXdr => "InfiniBand XDR, 800 Gb/s per GPU",
        Interconnect::IbNdr => "InfiniBand NDR, 400 Gb/s per GPU",
        Interconnect::IbHdr => "InfiniBand HDR, 200 Gb/s per GPU",
        Interconnect::Roce400 => "RoCE v2, 400 GbE per GPU",
        Interconnect::Eth100 => "100 GbE per node",
        Interconnect::Eth25 => "25 GbE per node",
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::model::{Activation, NormKind, Positions, QkNorm};

    /// A GPT-3-shaped toy: h = 64, L = 2, a = 4 heads of d = 16, plain 4h MLP, V = 100,
    /// learned positions, untied head, no biases counted by the FLOPs formulas.
    fn gpt_toy() -> ModelSpec {
        ModelSpec {
            vocab: 100,
            hidden: 64,
            layers: 2,
            heads: 4,
            kv_heads: 4,
            head_dim: 16,
            ffn: 256,
            mlp: MlpKind::Plain,
            act: Activation::Gelu,
            norm: NormKind::Layernorm,
            layer_norms: 2,
            final_norm: true,
            qk_norm: QkNorm::None,
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
            head_bias: false,
            tied: false,
            positions: Positions::Learned,
            max_pos: 128,
            pos_offset: 0,
            rotary_pct: 0,
            parallel: false,
            embed_proj: 0,
            experts: 0,
            top_k: 0,
            expert_ffn: 0,
            shared_experts: 0,
            shared_ffn: 0,
            shared_gate: false,
            dense_layers: 0,
            fused_qkv: false,
            fused_gate_up: false,
            fused_experts: false,
            softcap: false,
            softmax_fp32: true,
            resid_dropout: false,
            embed_dropout: false,
            ..crate::estimator::presets::default_spec()
        }
    }

    fn toy_cfg(batch: u64, seq: u64) -> Config {
        Config { model: "custom".into(), arch: gpt_toy(), batch, seq, ..Config::default() }
    }

    #[test]
    fn matmul_parameters_of_a_gpt_block_are_twelve_h_squared() {
        // Per layer: QKV 3h² + O h² + MLP 2·h·4h = 12h² = 12 × 4096 = 49,152; two layers 98,304.
        // Head V·h = 6,400. N = 104,704.
        let p = matmul_params(&gpt_toy());
        assert_eq!(p.layers_active, 98_304.0);
        assert_eq!(p.head, 6_400.0);
        assert_eq!(p.active(), 104_704.0);
    }

    #[test]
    fn flops_match_korthikanti_et_al_model_flops_for_gpt_shapes() {
        // Korthikanti et al. 2022 §6: model FLOPs per iteration = 72·B·s·L·h²·(1 + s/6h + V/12Lh).
        // B = 2, s = 32, L = 2, h = 64, V = 100:
        //   72 × 2 × 32 × 2 × 4096 = 37,748,736
        //   1 + 32/384 + 100/1536 = 1.1484375
        //   → 43,352,064 FLOPs.
        let f = step_flops(&toy_cfg(2, 32));
        assert_eq!(f.tokens, 64.0);
        assert_eq!(f.model, 43_352_064.0);
        let korthikanti = 72.0 * 2.0 * 32.0 * 2.0 * 64.0 * 64.0 * (1.0 + 32.0 / (6.0 * 64.0) + 100.0 / (12.0 * 2.0 * 64.0));
        assert!((f.model - korthikanti).abs() < 1e-6 * korthikanti);
        assert_eq!(f.recompute, 0.0);
    }

    #[test]
    fn without_the_attention_term_flops_are_six_n_t() {
        // 6·N·T: N = 104,704 matmul weights, T = 64 tokens → 40,206,336. The rest of the model
        // FLOPs is attention: 12·L·s·a·d·T = 12 × 2 × 32 × 64 × 64 = 3,145,728.
        let f = step_flops(&toy_cfg(2, 32));
        assert_eq!(6.0 * 104_704.0 * 64.0, 40_206_336.0);
        assert_eq!(f.model - 40_206_336.0, 3_145_728.0);
        assert_eq!(f.matmul, 40_206_336.0);
    }

    #[test]
    fn palms_formula_gives_the_same_flops_per_token() {
        // PaLM Appendix B: 6N + 12·L·H·Q·T with H·Q = a·d = 64, T = s = 32:
        // 6 × 104,704 + 12 × 2 × 64 × 32 = 628,224 + 49,152 = 677,376 per token.
        assert_eq!(model_flops_per_token(&gpt_toy(), 32), 677_376.0);
    }

    #[test]
    fn full_recompute_adds_one_forward_of_the_layers_as_megatron_counts_it() {
        // Narayanan et al. 2021 eq. (3), with full recomputation:
        // 96·B·s·L·h²·(1 + s/6h + V/16Lh) = 96 × 2 × 32 × 2 × 4096 × (1 + 1/12 + 100/2048)
        // = 50,331,648 × 1.1321614583… = 56,983,552.
        let f = step_flops(&Config { recompute: Recompute::Full, ..toy_cfg(2, 32) });
        assert_eq!(f.executed, 56_983_552.0);
    }

    #[test]
    fn megatrons_block_method_recomputes_only_its_layers_forward() {
        // 1 of the toy's 2 layers recomputed: half of full recomputation's extra FLOPs.
        let full = step_flops(&Config { recompute: Recompute::Full, ..toy_cfg(2, 32) });
        let block = step_flops(&Config { recompute: Recompute::Full, recompute_layers: 1, ..toy_cfg(2, 32) });
        assert_eq!(block.recompute, full.recompute / 2.0);
        assert_eq!(block.model, full.model);
    }

    #[test]
    fn selective_recompute_adds_the_attention_core_forward() {
        // Korthikanti et al. 2022 §5: recompute QKᵀ, softmax and ·V: 4·B·s²·h·L
        // = 4 × 2 × 1024 × 64 × 2 = 1,048,576 FLOPs, 2.4 % of the model FLOPs here.
        let f = step_flops(&Config { recompute: Recompute::Selective, ..toy_cfg(2, 32) });
        assert_eq!(f.recompute, 1_048_576.0);
    }

    #[test]
    fn gpt3_175b_selective_recompute_runs_a_third_of_korthikantis_attention_share_again() {
        // GPT-3 175B (h = 12288, a = 96, L = 96, s = 2048, V = 51200). Korthikanti et al. 2022
        // quote 2.7 % for selective recomputation: the attention core's whole share of the model
        // FLOPs, (s/6h) / (1 + s/6h + V/12Lh) = 0.02778 / 1.03212 = 2.69 %. What runs again is
        // only its forward, a third of that: 0.90 %.
        let arch = ModelSpec {
            vocab: 51_200,
            hidden: 12_288,
            layers: 96,
            heads: 96,
            kv_heads: 96,
            head_dim: 128,
            ffn: 4 * 12_288,
            max_pos: 2048,
            ..gpt_toy()
        };
        let f = step_flops(&Config { model: "custom".into(), arch, seq: 2048, recompute: Recompute::Selective, ..Config::default() });
        let pct = 100.0 * f.recompute / f.model;
        assert!((pct - 0.897).abs() < 0.005, "{pct}");
        assert!((3.0 * pct - 2.69).abs() < 0.01, "{pct}");
    }

    #[test]
    fn moe_flops_count_only_the_routed_experts_a_token_uses() {
        // 8 experts, top-2: per MoE layer router 8h + 2 × 3·h·f_e.
        let arch = ModelSpec { experts: 8, top_k: 2, expert_ffn: 32, mlp: MlpKind::Gated, ..gpt_toy() };
        let p = matmul_params(&arch);
        let h = 64.0;
        let attention = h * (2.0 * 64.0 + 2.0 * 64.0);
        assert_eq!(p.layers_active, 2.0 * (attention + 8.0 * h + 2.0 * 3.0 * h * 32.0));
    }

    #[test]
    fn lora_trains_without_the_bases_weight_gradients() {
        // Frozen base: forward 2N + backward input gradients 2N = 4N; adapters 6·N_lora.
        let full = step_flops(&toy_cfg(1, 32));
        let lora =
            step_flops(&Config { finetune: Finetune::Lora, lora_rank: 4, lora_targets: LoraTargets(LoraTargets::Q), ..toy_cfg(1, 32) });
        // N_lora = L × r × (h + a·d) = 2 × 4 × 128 = 1,024.
        let n = 104_704.0;
        let tokens = 32.0;
        assert_eq!(full.model - lora.model, tokens * (2.0 * n - 6.0 * 1_024.0));
    }

    #[test]
    fn ring_collectives_move_the_nccl_bus_volumes() {
        // 8 GPUs, 1 GB at 100 GB/s: all-reduce 2·7/8 × 10 ms = 17.5 ms; all-gather 8.75 ms.
        assert!((all_reduce_seconds(1e9, 8, 100.0) - 0.0175).abs() < 1e-12);
        assert!((all_gather_seconds(1e9, 8, 100.0) - 0.00875).abs() < 1e-12);
        assert_eq!(all_reduce_seconds(1e9, 1, 100.0), 0.0);
    }

    #[test]
    fn groups_inside_the_node_use_nvlink_and_spanning_groups_the_network() {
        let cfg = Config { gpus: 16, ..Config::default() };
        let hw = hardware(&cfg).expect("catalog gpu");
        let a = Assumptions::default();
        // H100: 900 GB/s bidirectional → 450 per direction × 0.8.
        assert_eq!(group_link(&hw, &a, 1, 8), (LinkClass::ScaleUp, 360.0));
        // NDR: 400 Gb/s = 50 GB/s × 0.8.
        assert_eq!(group_link(&hw, &a, 8, 2), (LinkClass::Network, 40.0));
        assert_eq!(group_link(&hw, &a, 1, 16).0, LinkClass::Network);
        assert_eq!(group_link(&hw, &a, 4, 1).0, LinkClass::Local);
    }

    #[test]
    fn zero3_moves_one_and_a_half_times_ddps_volume() {
        // ZeRO §7.2.2: 3Ψ against DDP's 2Ψ (same dtype for weights and gradients).
        let base = Config { gpus: 8, ..Config::default() };
        let hw = hardware(&base).expect("gpu");
        let a = Assumptions::default();
        let vol = |z: Zero| -> f64 {
            communication(&Config { zero: z, ..base.clone() }, &hw, &a, &ModelFigures::of(&base.arch))
                .iter()
                .map(|t| t.bytes * if t.collective == "all-reduce" { 2.0 } else { 1.0 })
                .sum()
        };
        let ratio = vol(Zero::Z3) / vol(Zero::Ddp);
        assert!((ratio - 1.5).abs() < 1e-9, "{ratio}");
        let z1 = vol(Zero::Z1) / vol(Zero::Ddp);
        assert!((z1 - 1.0).abs() < 1e-9, "{z1}");
    }

    #[test]
    fn the_pipeline_bubble_follows_narayanan_et_al() {
        // p = 4, m = 8: (p−1)/m = 3/8; interleaved with v = 2: 3/16.
        let arch = crate::estimator::presets::preset("llama-3.1-70b").map(|p| p.spec).expect("preset");
        let cfg = Config { model: "llama-3.1-70b".into(), arch, gpus: 4, pp: 4, accum: 8, ..Config::default() };
        let c = step_cost(&cfg, &Assumptions::default()).expect("cost");
        assert_eq!(c.bubble_fraction, 3.0 / 8.0);
        let c = step_cost(&Config { vpp: 2, ..cfg }, &Assumptions::default()).expect("cost");
        assert_eq!(c.bubble_fraction, 3.0 / 16.0);
    }

    #[test]
    fn one_h100_step_time_is_compute_at_the_assumed_efficiency_plus_the_optimizer() {
        // Llama-3.1-8B, 4,096 tokens on one H100: no communication; compute = executed FLOPs
        // / (989.4 TFLOP/s × 0.6).
        let cfg = Config::default();
        let c = step_cost(&cfg, &Assumptions::default()).expect("cost");
        assert!(c.comm.is_empty());
        let expect = c.flops.executed / (989.4e12 * 0.6);
        assert!((c.compute_s - expect).abs() < 1e-9 * expect);
        assert!((c.step_s - (c.compute_s + c.optimizer_s)).abs() < 1e-12);
        assert!(c.mfu > 0.5 && c.mfu < 0.6, "{}", c.mfu);
        assert_eq!(c.label, ESTIMATE_LABEL);
    }

    #[test]
    fn a_custom_gpu_without_throughput_names_the_key() {
        let cfg = Config { gpu: "custom".into(), gpu_gib: 80.0, ..Config::default() };
        assert_eq!(step_cost(&cfg, &Assumptions::default()).err().map(|e| e.to_string().starts_with("`gpu_tflops`")), Some(true));
        let cfg = Config { gpu_tflops: 500.0, ..cfg };
        assert_eq!(step_cost(&cfg, &Assumptions::default()).err(), Some(CostError::MissingHbm));
        let cfg = Config { gpu_hbm_gbs: 3000.0, ..cfg };
        assert!(step_cost(&cfg, &Assumptions::default()).is_ok());
    }

    #[test]
    fn offloading_the_optimizer_moves_its_step_to_the_cpu() {
        let cfg = Config { gpus: 8, zero: Zero::Z2, ..Config::default() };
        let on_gpu = step_cost(&cfg, &Assumptions::default()).expect("cost");
        let off = step_cost(&Config { offload: Offload::Optimizer, ..cfg }, &Assumptions::default()).expect("cost");
        assert!(off.optimizer_s > on_gpu.optimizer_s);
        assert!(off.comm.iter().any(|t| t.id == "offload_pcie"));
    }

    #[test]
    fn activation_offloading_crosses_the_host_link_twice_per_offloaded_layer_on_a_side_stream() {
        let cfg = Config::default();
        let plain = step_cost(&cfg, &Assumptions::default()).expect("cost");
        assert!(!plain.comm.iter().any(|t| t.id == "act_offload_pcie"));
        let term = |c: &Config| step_cost(c, &Assumptions::default()).expect("cost").comm.into_iter().find(|t| t.id == "act_offload_pcie");
        let all = term(&Config { act_offload: crate::estimator::config::ActOffload::Torchtune, ..cfg.clone() }).expect("torchtune's hooks");
        let two = term(&Config { act_offload_layers: 2, ..cfg.clone() }).expect("two layers");
        assert!(all.overlappable && two.overlappable);
        // Every layer against two of them: the bytes scale with the layers offloaded.
        let layers = cfg.arch.layers as f64;
        assert!((all.bytes / two.bytes - layers / 2.0).abs() < 1e-9, "{} vs {}", all.bytes, two.bytes);
    }

    #[test]
    fn interconnect_classes_are_per_gpu_or_shared_per_node() {
        assert_eq!(interconnect_gbs(Interconnect::IbNdr, 8), 50.0);
        assert_eq!(interconnect_gbs(Interconnect::IbXdr, 8), 100.0);
        assert_eq!(interconnect_gbs(Interconnect::Eth100, 8), 12.5 / 8.0);
    }
}
