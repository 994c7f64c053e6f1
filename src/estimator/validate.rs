//! Whether a configuration can be estimated: its parts fit together
//! ([`validate_consistency`], what a link or the form must satisfy) and its architecture uses
//! nothing the activation model does not cover yet ([`unmodelled_feature`]); every refusal names
//! the key at fault ([`EstimateError`]).

use super::config::{Config, Finetune, Offload, Zero};
use super::model::{self, ModelError};
use super::{allocator, gpu, step};

/// Why a configuration cannot be estimated; always names the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EstimateError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("`{key}` {reason}")]
    Invalid { key: &'static str, reason: String },
    /// The architecture uses something whose activation memory has not been measured and
    /// modelled yet: refused rather than approximated.
    #[error("the activation memory of {feature} is not modelled yet (no measured fixture); the parameter count is exact, the rest is refused rather than guessed")]
    Unmodelled { feature: &'static str },
}

impl EstimateError {
    /// The configuration key at fault.
    pub fn key(&self) -> &'static str {
        match self {
            EstimateError::Model(ModelError::Zero(k)) => k,
            EstimateError::Model(ModelError::Invalid { key, .. }) => key,
            EstimateError::Invalid { key, .. } => key,
            EstimateError::Unmodelled { .. } => "model",
        }
    }
}

pub fn invalid(key: &'static str, reason: impl Into<String>) -> EstimateError {
    EstimateError::Invalid { key, reason: reason.into() }
}

/// Checks that a configuration can be estimated: its parts fit together
/// ([`validate_consistency`]) and its architecture uses nothing the activation model does not
/// cover yet ([`unmodelled_feature`]).
pub fn validate(cfg: &Config) -> Result<(), EstimateError> {
    validate_consistency(cfg)?;
    match unmodelled_feature(&cfg.arch) {
        Some(feature) => Err(EstimateError::Unmodelled { feature }),
        None => Ok(()),
    }
}

/// Checks that the parts of a configuration fit together — what a share link or the inputs must
/// satisfy. An architecture whose activations are not modelled yet is still a valid configuration:
/// the link keeps it, and [`estimate`] says why it cannot estimate it.
pub fn validate_consistency(cfg: &Config) -> Result<(), EstimateError> {
    cfg.arch.validate()?;
    for (key, v) in [
        ("batch", cfg.batch),
        ("seq", cfg.seq),
        ("accum", cfg.accum),
        ("gpus", cfg.gpus),
        ("tp", cfg.tp),
        ("pp", cfg.pp),
        ("cp", cfg.cp),
        ("ep", cfg.ep),
        ("vpp", cfg.vpp),
        ("shard_group", cfg.shard_group),
    ] {
        if v == 0 {
            return Err(invalid(key, "must be at least 1"));
        }
    }
    let limits = [
        ("batch", cfg.batch, 1 << 20),
        ("seq", cfg.seq, 1 << 24),
        ("accum", cfg.accum, 1 << 20),
        ("gpus", cfg.gpus, 1 << 20),
        ("lora_rank", cfg.lora_rank, 1 << 16),
        ("cuda_ctx_mib", cfg.cuda_ctx_mib.unwrap_or(0), 1 << 20),
        ("frag_pct", cfg.frag_pct.unwrap_or(0), 1000),
        ("prefetch_layers", cfg.prefetch_layers, 1 << 10),
    ];
    for (key, v, max) in limits {
        if v > max {
            return Err(invalid(key, format!("{v} is beyond the supported {max}")));
        }
    }
    if cfg.nccl_mib.is_some_and(|m| m > 1 << 20) {
        return Err(invalid("nccl_mib", "is beyond the supported 1048576"));
    }
    if let Err(e) = allocator::AllocatorOptions::parse(&cfg.alloc_conf) {
        return Err(invalid("alloc_conf", e.to_string()));
    }
    // Blame the first model-parallel degree that stops dividing the GPU count.
    let mut mp = 1u64;
    for (key, v) in [("tp", cfg.tp), ("pp", cfg.pp), ("cp", cfg.cp)] {
        mp = mp.saturating_mul(v);
        if !cfg.gpus.is_multiple_of(mp) {
            return Err(invalid(key, format!("{v} does not fit the {} GPUs: tp × pp × cp = {mp} must divide them", cfg.gpus)));
        }
    }
    let dp = cfg.dp();
    if cfg.heads_per_tp_invalid() {
        return Err(invalid("tp", format!("{} attention heads do not split over {} GPUs", cfg.arch.heads, cfg.tp)));
    }
    if cfg.pp > cfg.arch.layers {
        return Err(invalid("pp", format!("{} pipeline stages exceed the {} layers", cfg.pp, cfg.arch.layers)));
    }
    if cfg.ep > 1 {
        if cfg.arch.experts == 0 {
            return Err(invalid("ep", "expert parallelism needs a mixture-of-experts model"));
        }
        if !cfg.arch.experts.is_multiple_of(cfg.ep) {
            return Err(invalid("ep", format!("{} experts do not split over {} GPUs", cfg.arch.experts, cfg.ep)));
        }
        if !dp.is_multiple_of(cfg.ep) {
            return Err(invalid("ep", format!("the data-parallel degree {dp} is not a multiple of ep = {}", cfg.ep)));
        }
    }
    if cfg.cp > cfg.seq {
        return Err(invalid("cp", format!("{} context-parallel GPUs exceed the {} tokens", cfg.cp, cfg.seq)));
    }
    if !(cfg.dropout.is_finite() && (0.0..1.0).contains(&cfg.dropout)) {
        return Err(invalid("dropout", "must be a probability in [0, 1)"));
    }
    if cfg.finetune != Finetune::Full && cfg.lora_rank == 0 {
        return Err(invalid("lora_rank", "must be at least 1 for LoRA"));
    }
    if cfg.finetune != Finetune::Full && cfg.lora_targets.0 == 0 {
        return Err(invalid("lora_targets", "names no module"));
    }
    if cfg.offload == Offload::OptimizerParams && cfg.zero.stage() < super::sharding::PARAMETERS_FROM {
        return Err(invalid("offload", "offloading parameters needs zero=3 (or FSDP full/hybrid sharding)"));
    }
    if cfg.gpu != "custom" && gpu::gpu(&cfg.gpu).is_none() {
        return Err(invalid("gpu", format!("unknown GPU '{}'", cfg.gpu)));
    }
    if cfg.gpu == "custom" && gpu::custom_bytes(cfg.gpu_gib) == 0 {
        return Err(invalid("gpu_gib", "must be a positive number of GiB"));
    }
    if cfg.vpp > 1 && (cfg.pp == 1 || !cfg.arch.layers.is_multiple_of(cfg.pp * cfg.vpp)) {
        return Err(invalid("vpp", format!("interleaving needs pp > 1 and layers divisible by pp × vpp = {}", cfg.pp * cfg.vpp)));
    }
    if cfg.zero == Zero::HybridShard && !dp.is_multiple_of(cfg.shard_group.min(dp)) {
        return Err(invalid("shard_group", format!("{} GPUs per group do not divide the data-parallel degree {dp}", cfg.shard_group)));
    }
    Ok(())
}

/// The first architectural feature whose saved tensors the activation model does not cover yet.
/// Sliding windows are covered (they change masks, not saved shapes: measured on Gemma-2), and so
/// are dense and MoE layers in any order (counted per layer kind), NoPE layers (SmolLM3: measured),
/// gpt-oss's layout (sinks, its router and experts: measured) and Llama 4's (measured).
pub fn unmodelled_feature(spec: &model::ModelSpec) -> Option<&'static str> {
    use model::{Activation, Router, WindowKind};
    let moe = spec.experts > 0;
    // A family whose code builds this exact layout (gpt-oss's sinks, biased router and experts,
    // clamped SwiGLU; Llama 4's chunked attention, NoPE temperature tuning, L2 q/k norm, complex
    // RoPE, all-experts MoE): its own layer is exact.
    if step::families::modeling(spec.family).builds_own_layout(spec) {
        return None;
    }
    [
        (
            spec.moe_all_experts || spec.qk_l2_norm,
            "Llama 4's text layers (every expert on every token beside a shared expert, weightless L2 q/k norm, complex RoPE, chunked attention, NoPE temperature tuning)",
        ),
        (spec.is_mla() && !matches!(spec.router, Router::Sigmoid | Router::Softmax), "multi-head latent attention (MLA) with this router"),
        (spec.attn_sinks, "attention sinks"),
        (spec.qk_l2_norm, "the L2 q/k norm"),
        (spec.window_kind == WindowKind::Chunked && spec.window_layers.count(spec.layers) > 0, "chunked attention"),
        (moe && !matches!(spec.router, Router::Softmax | Router::Sigmoid), "this router (not softmax-then-top-k)"),
        (moe && spec.router_bias, "this router (bias)"),
        (
            moe && spec.router == Router::Softmax && !spec.is_mla() && (spec.router_fp32 || spec.router_groups > 1),
            "this router (fp32 or group-limited softmax)",
        ),
        (moe && (spec.expert_bias || spec.experts_in_out || spec.moe_all_experts), "this expert layout"),
        (spec.act == Activation::SwigluClamped, "the clamped SwiGLU"),
        // Falcon's `alibi=True` (Falcon-RW): position biases added to the scores; no fixture.
        (spec.positions == model::Positions::None && spec.fused_qkv, "ALiBi position biases"),
        // OPT-350m: post-LayerNorm layers (`do_layer_norm_before=False`) and `project_in`/`out`.
        (
            spec.embed_proj > 0 || (spec.positions == model::Positions::Learned && spec.pos_offset > 0 && !spec.final_norm),
            "OPT's post-LayerNorm layout (OPT-350m)",
        ),
    ]
    .into_iter()
    .find_map(|(on, name)| on.then_some(name))
}

impl Config {
    fn heads_per_tp_invalid(&self) -> bool {
        self.tp > 1 && !self.arch.heads.is_multiple_of(self.tp)
    }
}
