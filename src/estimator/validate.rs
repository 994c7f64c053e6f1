//! Whether a configuration can be estimated: its parts fit together
//! ([`validate_consistency`], what a link or the form must satisfy) and its architecture uses
//! nothing the activation model does not cover yet ([`unmodelled_feature`]); every refusal names
//! the key at fault ([`EstimateError`]).

use super::config::{Config, Finetune, Framework, Offload, Recompute, Zero};
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
    if let Some(feature) = unmodelled_lora_dropout(cfg) {
        return Err(EstimateError::Unmodelled { feature });
    }
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
    if !(cfg.lora_dropout.is_finite() && (0.0..1.0).contains(&cfg.lora_dropout)) {
        return Err(invalid("lora_dropout", "must be a probability in [0, 1)"));
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
    if cfg.vpp > 1 && cfg.pp == 1 {
        return Err(invalid("vpp", "interleaving needs pp > 1"));
    }
    // torchtitan splits unevenly (`generate_llm_fqn_per_model_part`: the embedding and the head
    // weigh a layer each), so it needs a layer for each of the pp × vpp stages; Megatron-LM
    // divides the layers evenly between virtual stages.
    let stages = cfg.pp * cfg.vpp;
    if cfg.vpp > 1 && cfg.framework == Framework::Torchtitan && stages > cfg.arch.layers {
        return Err(invalid("vpp", format!("torchtitan's interleaving needs a layer for each of its pp × vpp = {stages} stages")));
    }
    if cfg.vpp > 1 && cfg.framework != Framework::Torchtitan && !cfg.arch.layers.is_multiple_of(stages) {
        return Err(invalid("vpp", format!("interleaving needs layers divisible by pp × vpp = {stages}")));
    }
    if cfg.zero == Zero::HybridShard && !dp.is_multiple_of(cfg.shard_group.min(dp)) {
        return Err(invalid("shard_group", format!("{} GPUs per group do not divide the data-parallel degree {dp}", cfg.shard_group)));
    }
    if let Some(reason) = framework_refusal(cfg) {
        return Err(invalid("framework", reason));
    }
    validate_recipes(cfg)?;
    recipes_fit(cfg)
}

/// The FP8, 4-bit and loading recipes (issue 27): each where its code runs.
fn validate_recipes(cfg: &Config) -> Result<(), EstimateError> {
    use super::config::{Fp8, Load, QloraQuant};
    let fp8 = cfg.fp8_recipe();
    if fp8 != Fp8::None && cfg.finetune == Finetune::Qlora {
        return Err(invalid("fp8", "does not apply to QLoRA: its 4-bit base runs bitsandbytes' or gptqmodel's kernels"));
    }
    if fp8 == Fp8::TeMxfp8 {
        let cc = gpu::gpu(&cfg.gpu).and_then(|g| g.compute_capability);
        if cfg.gpu != "custom" && !matches!(cc, Some((10, _))) {
            return Err(invalid("fp8", "te-mxfp8 runs on Blackwell B200/B300 only (compute capability 10.x: transformer_engine quantization.py _compute_mxfp8_support)"));
        }
    }
    if cfg.fp8_allgather && (fp8 != Fp8::TorchaoTensorwise || cfg.zero.stage() < 3) {
        return Err(invalid("fp8_allgather", "needs fp8=torchao-tensorwise under FSDP2 sharding (zero=3, full_shard or hybrid_shard): torchao asserts tensorwise scaling for it"));
    }
    if !cfg.fsdp_root_reshard && !super::sharding::tune_fsdp2(cfg) {
        return Err(invalid(
            "fsdp_root_reshard",
            "false is FSDP2's root kept gathered into backward, which the step follows under torchtune's distributed recipes (framework=torchtune, gpus > 1, zero=full_shard)",
        ));
    }
    if cfg.fp8_model_init {
        if !fp8.te() {
            return Err(invalid("fp8_model_init", "is Transformer Engine's: needs fp8=te-delayed, te-current or te-mxfp8"));
        }
        if super::precision::recipe(cfg.precision).master.is_none() {
            return Err(invalid(
                "fp8_model_init",
                "drops the 16-bit weights: it needs fp32 master weights in the optimizer (precision=mixed-*)",
            ));
        }
    }
    if cfg.load == Load::QuantizeOnLoad && (cfg.finetune != Finetune::Qlora || cfg.qlora_quant != QloraQuant::Nf4) {
        return Err(invalid("load", "quantize-on-load quantizes an NF4 base: it needs finetune=qlora with qlora_quant=nf4"));
    }
    if matches!(cfg.load, Load::MetaSharded | Load::ZeroInit) && cfg.zero.stage() < 3 {
        return Err(invalid(
            "load",
            "a sharded load (meta-sharded, zero-init) needs parameter sharding (zero=3, full_shard or hybrid_shard)",
        ));
    }
    Ok(())
}

/// The recipes of issue 26 against the rest: what their frameworks refuse, and what only the
/// transformers program (`framework = hf`) can express.
fn recipes_fit(cfg: &Config) -> Result<(), EstimateError> {
    // torchtune's recipes (`full_finetune_single_device.py` `__init__`): "Gradient accumulation
    // is not supported with optimizer in bwd".
    if cfg.optim_in_bwd && cfg.accum > 1 {
        return Err(invalid("optim_in_bwd", format!("steps each parameter as its gradient is made, so it cannot accumulate {} micro-batches (torchtune refuses it with gradient accumulation): set accum = 1", cfg.accum)));
    }
    if cfg.optim_in_bwd && cfg.offload != Offload::None {
        return Err(invalid(
            "optim_in_bwd",
            "with the optimizer offloaded to the host the step runs on the CPU after backward (ZeRO-Offload), not in backward's hooks",
        ));
    }
    if cfg.framework == Framework::Megatron {
        if cfg.compile {
            return Err(invalid("compile", "torch.compile's partition follows transformers' modeling code (framework = hf)"));
        }
        if cfg.recompute == Recompute::Op {
            return Err(invalid("recompute", "op-level selective checkpointing (torchtitan) wraps transformers' layers (framework = hf)"));
        }
    }
    if cfg.recompute_every > 0 && cfg.framework == Framework::Megatron {
        return Err(invalid(
            "recompute_every",
            "checkpoints every Nth transformers layer (framework = hf); Megatron's --recompute-num-layers is recompute = full",
        ));
    }
    if cfg.recompute_layers > 0 && cfg.framework != Framework::Megatron {
        return Err(invalid(
            "recompute_layers",
            "is Megatron's block method (framework = megatron); transformers' and torchtitan's partial checkpointing is recompute_every",
        ));
    }
    if cfg.recompute_layers > 0 && cfg.recompute != Recompute::Full {
        return Err(invalid("recompute_layers", "picks the layers recompute = full recomputes: set recompute = full"));
    }
    if cfg.recompute_every > 0 && cfg.recompute == Recompute::Selective {
        return Err(invalid("recompute_every", "with recompute = selective the checkpointed layers would nest Megatron's attention-core region inside a full one: choose recompute = none or op"));
    }
    if cfg.recompute_every > cfg.arch.layers {
        return Err(invalid("recompute_every", format!("{} exceeds the {} layers", cfg.recompute_every, cfg.arch.layers)));
    }
    if cfg.act_offload_layers > 0 {
        if let Some(e) = layer_offload_refusal(cfg) {
            return Err(e);
        }
    }
    if cfg.optim_paged && !matches!(cfg.optim, super::config::Optimizer::Adam8bit | super::config::Optimizer::Adamw) {
        return Err(invalid(
            "optim_paged",
            "bitsandbytes pages AdamW's states (PagedAdamW) and 8-bit Adam's (PagedAdamW8bit): set optim = adamw or adam8bit",
        ));
    }
    if !(cfg.host_ram_gib.is_finite() && cfg.host_ram_gib > 0.0) {
        return Err(invalid("host_ram_gib", "must be a positive number of GiB"));
    }
    lightning_refusal(cfg)?;
    not_modelled_yet(cfg)
}

/// litgpt's stack (`qlora_lightning`, `holds_prev_logits`) is built into the head and loss of
/// transformers' and litgpt's code with their plain cross-entropy: elsewhere the keys would
/// change nothing, so they are refused by name rather than silently ignored.
fn lightning_refusal(cfg: &Config) -> Result<(), EstimateError> {
    use super::config::{Finetune, Framework, Loss, QloraQuant};
    let elsewhere = cfg.loss == Loss::Chunked || matches!(cfg.framework, Framework::Torchtune | Framework::Torchtitan);
    if cfg.qlora_lightning && !(cfg.finetune == Finetune::Qlora && cfg.qlora_quant == QloraQuant::Nf4) {
        return Err(invalid(
            "qlora_lightning",
            "Lightning's bitsandbytes plugin quantizes an NF4 base: set finetune = qlora, qlora_quant = nf4",
        ));
    }
    for (on, key) in [(cfg.qlora_lightning, "qlora_lightning"), (cfg.holds_prev_logits, "holds_prev_logits")] {
        if on && elsewhere {
            return Err(invalid(
                key,
                "litgpt's loop and Lightning's 4-bit head are modelled with litgpt's or transformers' code and their plain cross-entropy (framework = litgpt or hf, loss = standard) only: not modelled yet here",
            ));
        }
    }
    Ok(())
}

/// Issue 26's recipes whose keys exist but whose transformation of the step is not modelled
/// yet: refused by name (never estimated as something else). The records that will check them
/// are in `tests/fixtures/pytorch/recipes/` (validation/FINDINGS.md §15).
fn not_modelled_yet(cfg: &Config) -> Result<(), EstimateError> {
    let master = super::precision::recipe(cfg.precision).master.is_some();
    let offload_ckpt = cfg.act_offload.on() && (cfg.recompute != Recompute::None || cfg.recompute_every > 0);
    let pending: [(bool, &str, &str); 13] = [
        (
            cfg.optim_in_bwd && master,
            "optim_in_bwd",
            "the optimizer step in backward with fp32 master weights (torchtune trains in pure bf16)",
        ),
        (
            cfg.optim_in_bwd && !matches!(cfg.optim, super::config::Optimizer::Adamw | super::config::Optimizer::Adam8bit),
            "optim_in_bwd",
            "the optimizer step in backward with an optimizer other than AdamW or bitsandbytes' 8-bit Adam",
        ),
        (
            cfg.optim_in_bwd && cfg.dp() > 1,
            "optim_in_bwd",
            "the optimizer step in backward with data parallelism (gradients reduced in the hook)",
        ),
        (
            cfg.compiles_whole_model()
                && (cfg.framework != Framework::Hf
                    || !matches!(
                        cfg.arch.family,
                        super::family::Family::Llama | super::family::Family::Qwen2 | super::family::Family::Qwen3 | super::family::Family::Mistral
                    )
                    || cfg.recompute != Recompute::None
                    || cfg.recompute_every > 0
                    || cfg.finetune != super::config::Finetune::Full
                    || super::precision::recipe(cfg.precision).autocast_weight_copy
                    || cfg.fp8 != super::config::Fp8::None
                    || cfg.act_offload.on()),
            "compile_regions",
            "torch.compile of the whole model beyond transformers' Llama, Qwen2, Qwen3 and Mistral, full fine-tune, no checkpointing, offloading, autocast or float8 (measured so, recipes/{llama-gqa,qwen2,qwen3,mistral}.json `compile=model`: the graph builds the causal mask, so SDPA repeats k and v, and the logits' zero tangent is allocated at the start of backward; compile_regions = layer covers more: FINDINGS §15.1)",
        ),
        (
            cfg.compile && cfg.compile_regions == super::config::CompileRegions::Block && cfg.framework != Framework::Torchtitan,
            "compile_regions",
            "torch.compile of torchtitan's blocks outside torchtitan's own code (compile_regions = block means framework = torchtitan; transformers' layers are compile_regions = layer)",
        ),
        (
            cfg.compile && cfg.act_offload.on() && !(cfg.framework == Framework::Torchtune && cfg.recompute == Recompute::Full),
            "act_offload",
            "activation offloading of a compiled step's saved tensors (modelled: torchtune's compiled layers inside their checkpoints, recompute = full, where the hooks pack only the checkpoints' inputs)",
        ),
        (
            offload_ckpt && (!matches!(cfg.recompute, Recompute::Full | Recompute::Op) || cfg.recompute_every > 0),
            "act_offload",
            "activation offloading with Megatron's selective recomputation or checkpointing every N layers",
        ),
        (
            offload_ckpt && !OFFLOAD_CKPT_CHECKED.contains(&cfg.arch.family),
            "act_offload",
            "activation offloading with full checkpointing of a family not measured so (FINDINGS §15.5.1: the checkpoints' positional inputs packed)",
        ),
        (
            offload_ckpt && cfg.recompute == Recompute::Op && cfg.arch.family != super::family::Family::Llama,
            "act_offload",
            "activation offloading with op-level selective checkpointing of a family other than Llama (measured: llama, FINDINGS §15.5.1)",
        ),
        (
            cfg.act_offload.on() && cfg.framework == Framework::Torchtune && cfg.arch.family != super::family::Family::Llama,
            "act_offload",
            "activation offloading on torchtune's own code for a model other than its Llama (measured: llama3)",
        ),
        (cfg.act_offload.on() && cfg.pp > 1, "act_offload", "activation offloading with pipeline parallelism"),
        (
            cfg.act_offload.on() && !matches!(cfg.framework, Framework::Hf | Framework::Torchtune),
            "act_offload",
            "activation offloading outside transformers' and torchtune's modeling code (framework = hf | torchtune)",
        ),
        (
            cfg.act_offload.on() && cfg.loss == super::config::Loss::Chunked && cfg.framework != Framework::Torchtune,
            "act_offload",
            "activation offloading with a fused chunked loss (Liger's; torchtune's CEWithChunkedOutputLoss is modelled)",
        ),
    ];
    if let Some(&(_, key, what)) = pending.iter().find(|p| p.0) {
        return Err(invalid(key, format!("{what} is not modelled yet")));
    }
    // Transformer Engine's linears are opaque custom ops to AOTAutograd (their GEMM and casts
    // are kernels it can neither trace into nor recompute), and the pair is not measured: the
    // CPU cannot run TE. Estimating it through the partitioner's rules for traced ops kept or
    // dropped the feed-forward's GEMM outputs by a size comparison (Llama 2 7B, TP 4, 2K
    // tokens: 2.16 GB of them at micro-batch 3, none from 4 on — the peak fell as the batch
    // grew), so it is refused by name.
    if cfg.compile && cfg.fp8_recipe().te() {
        return Err(invalid(
            "compile",
            "torch.compile of Transformer Engine's FP8 linears (opaque custom ops to the partitioner; TE does not run on a CPU, so the pair is not measured) is not modelled yet",
        ));
    }
    if cfg.compile && (cfg.recompute_every > 0 || !matches!(cfg.recompute, Recompute::None | Recompute::Full | Recompute::Op)) {
        return Err(invalid(
            "compile",
            "torch.compile of layers checkpointed every N layers or by Megatron's selective recomputation (the partitioner follows the checkpoint's tags) is not modelled yet",
        ));
    }
    if cfg.compile && cfg.recompute != Recompute::None && !COMPILE_CKPT_CHECKED.contains(&cfg.arch.family) {
        return Err(invalid(
            "compile",
            format!(
                "torch.compile of {:?}'s checkpointed layers (the partitioner follows the checkpoint's tags; FINDINGS §15.1) is not modelled yet",
                cfg.arch.family
            ),
        ));
    }
    if cfg.compile && cfg.framework == Framework::Torchtitan && !TITAN_COMPILE_CHECKED.contains(&cfg.arch.family) {
        return Err(invalid(
            "compile",
            format!(
                "torch.compile of torchtitan's {:?} blocks (only its Llama 3 and dense Qwen3 are measured compiled: FINDINGS §15.1) is not modelled yet",
                cfg.arch.family
            ),
        ));
    }
    if cfg.compile && cfg.framework == Framework::Torchtitan {
        // torch.compile on torchtitan's own blocks: measured in fp32 and bf16 without tensor
        // parallelism (FINDINGS §15.1); each of these is refused by name.
        let titan_compile_pending: [(bool, &str); 3] = [
            (
                match cfg.fp8_recipe() {
                    super::config::Fp8::None | super::config::Fp8::TorchaoTensorwise => false,
                    super::config::Fp8::TorchaoRowwise => cfg.recompute == Recompute::Full,
                    _ => true,
                },
                "torch.compile of torchtitan's blocks with float8 recipes other than tensorwise and rowwise, or rowwise under full checkpointing (rowwise `layer+full`: measured, `torchtitan-{llama3,qwen3}-compile-fp8.json`; the compiled re-run keeps Llama 3's fp32 RoPE product and the per-row scales, bf16 peak 0.83 % under; FINDINGS §15.1)",
            ),
            (
                super::precision::recipe(cfg.precision).autocast_weight_copy,
                "torch.compile of torchtitan's blocks under autocast (torchtitan's `maybe_enable_amp` without FSDP; measured compiled in fp32 and bf16 only)",
            ),
            // torchtitan's TP (`apply_tp`, SP, loss_parallel) is measured eager and compiled
            // (torchtitan-{llama3,qwen3}-tp.json, torchtitan-llama3-tp-fp8.json for float8
            // tensorwise; compiled, the harness hands the first block the embedding's waited
            // output, FINDINGS §15.1.y) and followed; rowwise float8 with TP is not measured,
            // nor FSDP2's float8 all-gather with TP (measured without TP on 2 ranks:
            // torchtitan-llama3-fsdp2-compile-fp8.json, recompute none, op and full).
            (
                cfg.tp > 1
                    && (cfg.fp8_allgather
                        || !matches!(cfg.fp8_recipe(), super::config::Fp8::None | super::config::Fp8::TorchaoTensorwise)),
                "torch.compile of torchtitan's blocks with tensor parallelism and float8 other than tensorwise, or with FSDP2's float8 all-gather (compiled TP is measured in fp32, bf16 and float8 tensorwise: torchtitan-{llama3,qwen3}-tp.json, torchtitan-llama3-tp-fp8.json; the float8 all-gather without TP: torchtitan-llama3-fsdp2-compile-fp8.json)",
            ),
        ];
        if let Some(&(_, what)) = titan_compile_pending.iter().find(|p| p.0) {
            return Err(invalid("compile", format!("{what} is not modelled yet")));
        }
    }
    if cfg.compile && cfg.framework == Framework::Torchtune {
        // torch.compile as torchtune 0.6.1's recipes apply it (`compile_model`, then the
        // checkpoint wrappers, then `compile_loss` on `CEWithChunkedOutputLoss`): measured on its
        // Llama 3 in fp32 and bf16, recompute none and full (tests/fixtures/pytorch/frameworks/
        // torchtune-llama3-compile.json: saved bytes exact, step peaks within 12 B; FINDINGS
        // §15.1); the rest by name. Its QLoRA compiled in bf16 (tests/fixtures/pytorch/frameworks/
        // torchtune-llama3-qlora-compile.json: on q and v, recompute none and full; torchao_nf4/
        // compile.json: on q, v, output and the MLP, recompute none and full: saved bytes exact,
        // peaks 40 to 104 B under, 5,152 B under with full checkpointing) and its LoRA in bf16
        // (torchtune-llama3-lora-compile.json: on q and v and on every linear, recompute none and
        // full: saved bytes exact, peaks 120 B under to 976 B above) are estimated — the re-run
        // of a checkpointed compiled layer keeps the uncheckpointed cut (LoRA's sums), and the
        // SiLU·mul backward kernel reads `w2`'s two input gradients apart (`ir::FusedBackward`,
        // FINDINGS §15.1 "torchtune's compiled LoRA and QLoRA with checkpointing"). Dropout and
        // fp32 LoRA are not measured compiled: refused.
        if cfg.arch.family != super::family::Family::Llama {
            return Err(invalid(
                "compile",
                format!(
                    "torch.compile of torchtune's {:?} layers (only its Llama is measured compiled: tests/fixtures/pytorch/frameworks/torchtune-llama3-compile.json) is not modelled yet",
                    cfg.arch.family
                ),
            ));
        }
        let mlp = super::config::LoraTargets::GATE | super::config::LoraTargets::UP | super::config::LoraTargets::DOWN;
        let partial_mlp = cfg.lora_targets.0 & mlp != 0 && cfg.lora_targets.0 & mlp != mlp;
        let tune_compile_pending: [(bool, &str); 4] = [
            (
                cfg.precision == super::config::Precision::AmpBf16,
                "torch.compile of torchtune's layers under bf16 autocast (precision = amp-bf16; measured compiled in fp32 and bf16 only)",
            ),
            (
                cfg.finetune != super::config::Finetune::Full && cfg.recompute != Recompute::None && partial_mlp,
                "torch.compile of torchtune's checkpointed layers with adapters on part of the MLP (torchtune's builders put them on w1, w2 and w3 together, `apply_lora_to_mlp`: measured so, the SiLU·mul backward kernel reading w2's two input gradients apart)",
            ),
            (
                cfg.finetune == super::config::Finetune::Qlora && cfg.lora_dropout > 0.0,
                "torch.compile of torchtune's QLoRA beyond what torchtune-llama3-qlora-compile.json and torchao_nf4/compile.json measured (bf16, no dropout: lora_dropout > 0 adds a dropout mask per adapter input inside the compiled layers, not measured)",
            ),
            (
                cfg.finetune == super::config::Finetune::Lora
                    && (cfg.lora_dropout > 0.0
                        || cfg.precision != super::config::Precision::Bf16),
                "torch.compile of torchtune's LoRA beyond what torchtune-llama3-lora-compile.json measured (bf16, no dropout: fp32 adapters and lora_dropout > 0 inside the compiled layers are not measured)",
            ),
        ];
        if let Some(&(_, what)) = tune_compile_pending.iter().find(|p| p.0) {
            return Err(invalid("compile", format!("{what} is not modelled yet")));
        }
    }
    // A quantized base inside compiled, checkpointed layers: its dequantization's place in the
    // compiled backward (held from the re-run, or made again before each matmul's input
    // gradient) is measured in torchtune's order only (the checkpoint outside the compiled
    // layer: tests/fixtures/pytorch/frameworks/torchtune-llama3-qlora-compile.json, above), not
    // with the checkpoint inside the compiled region as transformers' and torchtitan's code run it.
    if cfg.compile
        && cfg.recompute != Recompute::None
        && cfg.finetune == super::config::Finetune::Qlora
        && cfg.framework != Framework::Torchtune
    {
        return Err(invalid(
            "compile",
            "torch.compile of checkpointed layers with a 4-bit base (where the compiled backward dequantizes the base weights is not measured) is not modelled yet",
        ));
    }
    if cfg.compile && cfg.loss == super::config::Loss::Chunked && cfg.framework != Framework::Torchtune {
        return Err(invalid(
            "compile",
            "torch.compile with Liger's fused chunked loss (loss = chunked outside framework = torchtune; torchtune's CEWithChunkedOutputLoss is modelled compiled) is not modelled yet",
        ));
    }
    if cfg.compile && !matches!(cfg.framework, Framework::Hf | Framework::Torchtitan | Framework::Torchtune) {
        return Err(invalid(
            "compile",
            format!(
                "torch.compile of {:?}'s modeling code (compile is measured in transformers', torchtitan's and torchtune's) is not modelled yet",
                cfg.framework
            ),
        ));
    }
    if cfg.compile && !COMPILE_CHECKED.contains(&cfg.arch.family) {
        return Err(invalid(
            "compile",
            format!("torch.compile's partition of {:?}'s layers (FINDINGS §15.1) is not modelled yet", cfg.arch.family),
        ));
    }
    Ok(())
}

/// Families whose blocks torchtitan 0.2.2's own code compiles (`framework = torchtitan`,
/// `compile = true`, `compile_regions = block` or `layer`: `apply_ac` then `apply_compile` per
/// `TransformerBlock`, the loss compiled by `build_cross_entropy_loss`) as the step program
/// does, on every record of `tests/fixtures/pytorch/frameworks/torchtitan-*-compile.json`
/// (`validation/measure_titan_compile.py`: b2 s64, fp32 and bf16, recompute none, op and full:
/// saved bytes and step peaks exact). With full checkpointing and the loss compiled the step
/// peaks inside a block's compiled backward, which the step program follows (the re-run's
/// kernels keep the norms' rstd and o_proj's output; Inductor fuses `act(gate)·up` into its own
/// backward kernel before `w2`'s weight gradient, six `[b·s, ffn]` buffers alive at once:
/// [`super::step::ir::FusedBackward`]). torchtitan's Qwen3 MoE (its `apply_compile` compiles each block's submodules apart, the experts eager) is not
/// measured compiled and is refused by name. Float8 (torchtitan's converter, torchao
/// `Float8Linear`) compiled: tensorwise on `torchtitan-{llama3,qwen3}-compile-fp8.json` (saved
/// bytes exact, peaks within 0.35 %); rowwise without and with op SAC on the same shards (saved
/// bytes exact — in fp32 the bf16 `_scaled_mm` outputs cross — and peaks within 4 B, the
/// compiled loss's; Inductor's fused backward: `lowbit.rs` `compiled_rowwise`), rowwise with
/// full checkpointing refused. FSDP2's float8 all-gather (tensorwise, on 2 CPU ranks:
/// `torchtitan-llama3-fsdp2-compile-fp8.json`, recompute none, op and full): saved bytes exact
/// without checkpointing (the feed-forward weights' e4m3 transposed copies, `lowbit.rs`
/// `gathered_transpose_kept`), 28–36 B a block under with it (the gathered scales); the step
/// peak carries the FSDP2 bookkeeping every `zero = full_shard` estimate carries (FINDINGS
/// §15.1, "FSDP2 float8 all-gather, compiled").
const TITAN_COMPILE_CHECKED: &[super::family::Family] = &[super::family::Family::Llama, super::family::Family::Qwen3];

/// Families whose activation offloading under full checkpointing is measured
/// (tests/fixtures/pytorch/offload_ckpt/, validation/measure_recipes.py `measure_offload` with
/// `+recompute=full`, validation/measure_tune_offload.py): the layer's one positional input is
/// what the outer hooks pack.
const OFFLOAD_CKPT_CHECKED: &[super::family::Family] = {
    use super::family::Family::*;
    &[Llama, Mistral, Mixtral, Qwen2, Qwen3, Gemma2, Phi3, Gpt2, Olmo2]
};

/// Families whose compiled and checkpointed layers (`compile_regions = layer` with `recompute =
/// full` or `op`: the partitioner follows the checkpoint's tags,
/// [`super::step::compile`]'s `compile_checkpointed_region`) the step program matches on every
/// `compile=layer+recompute=full|op` record of `tests/fixtures/pytorch/recipes/`: saved bytes to
/// the byte, the step's peak within the records' tolerance (b2 s64, fp32 and bf16). GLM-4.5
/// (sigmoid router, shared expert) is exact on its 4 records (peaks within 0.001 %). Every other
/// family is refused by name: the rule is generic, but its MoE routing and attention variants are
/// unchecked under the tags. Gemma 2, measured, stays refused: saved bytes exact on its 4 records,
/// but its bf16 `recompute = full` step peaks inside a layer's compiled backward (the eager
/// soft-capped attention recomputed there), 86,004 B (−4.2 %) above the estimate; so does Mixtral:
/// saved bytes exact on its 4 records (and the 8-layer variant's 4), but with full checkpointing
/// its step peaks inside a layer's compiled backward (the experts recomputed there), where the
/// estimate is 0.48 % / 0.86 % (fp32 / bf16) under it, and under its bf16 op record by 0.17 %.
/// Llama 4 likewise: saved bytes exact on its 4 records, its step peaks inside a layer's compiled
/// backward, where the estimate is 16,384 B (−0.57 %) under its bf16 full record and 39,660 B
/// (+0.66 %) over its fp32 op record (fp32 full −12 B, bf16 op +0.13 %). DeepSeek-V2: saved bytes
/// exact on its 2 full records, its bf16 step 25,480 B (−0.97 %) above the estimate inside a
/// layer's compiled backward (fp32 −8 B); with op checkpointing torch 2.15's partitioner fails on
/// its layer ("failed to partition the joint forward-backward graph": the greedy router's `topk`
/// is MUST_SAVE while the `getitem` of its values carries the `topk_weights *
/// routed_scaling_factor` line's PREFER_RECOMPUTE tag: with the records' factor 1.0 the
/// multiplication is not in the graph; with 2.0 the same fp32 record compiles), so there is no
/// op record.
const COMPILE_CKPT_CHECKED: &[super::family::Family] = &[
    super::family::Family::Llama,
    super::family::Family::Qwen3,
    super::family::Family::Mistral,
    super::family::Family::Phi3,
    super::family::Family::Olmo2,
    super::family::Family::Gpt2,
    super::family::Family::Qwen3Moe,
    super::family::Family::Glm4Moe,
];

/// Families whose compiled layers (`compile_regions = layer`) the step program's partition
/// ([`super::step::compile`]) matches on every record of `tests/fixtures/pytorch/recipes/`: saved
/// bytes to the byte, the step's peak within the records' tolerance (fp32 and bf16, s = 64, and
/// s = 128 where measured; in bf16 under by at most the CPU mm's packing workspace). Qwen2 (q/k/v
/// biases: `addmm`), SmolLM3 (NoPE layers), Gemma 3 (sliding and global layers, q/k norms, the
/// (1 + w) norm), StarCoder2 (LayerNorm, biases, GELU MLP), Gemma (GELU-tanh, the (1 + w) norm),
/// StableLM (a quarter of each head rotated, LayerNorm), OPT (learned positions, LayerNorm, biases,
/// ReLU), Falcon (measured with `new_decoder_architecture`: two LayerNorms of one input, parallel
/// attention and MLP, fused qkv, GQA) follow the generic rule unchanged, OLMo (a LayerNorm without
/// parameters: x̂ and rstd saved in fp32, not the layer input) once the rule reads such a norm's
/// backward in x̂, GPT-NeoX (parallel attention and MLP, their two LayerNorms of one input sharing
/// mean and rstd) once the rule merges such statistics; Phi (half of each head rotated, parallel
/// attention and MLP, LayerNorm, biases) and GPT-NeoX are checked on their fp32 records only (their
/// bf16 runs failed in Inductor's C++ build).
///
/// Every other family is refused by name. Measured compiled and not matched (their residuals on
/// b2 s64 fp32 / bf16, saved bytes): falcon_h1 (−4.3 % / −0.4 %: the Mamba-2 mixer's partition),
/// granitemoehybrid (−5.4 % / −0.9 %: the Mamba-2 mixer beside the top-k router), kimi_linear
/// (−60 % / −63 %: the KDA chunk loop's in-place row updates, functionalized to `select_scatter`
/// and `clone` copies of whole chunk matrices, which its compiled layers keep), qwen3_next
/// (−7.0 % / −9.9 %; peaks −3.2 % / −5.2 %) and qwen3_5_text (−9.7 % / −12.4 %; peaks −4.5 % /
/// −6.5 %): the gated DeltaNet chunk loop, whose compiled layers keep the causal conv's output,
/// a `select_scatter` copy and a second `[b, heads, 1, s, s]` decay product the rule does not
/// (qwen3_5_moe_text not measured compiled). Qwen2-MoE (softmax router without
/// renormalization, shared expert with its sigmoid gate) is exact since the partition keeps, at
/// equal bytes, the value nearer the backward (its bf16 gathered routing weights). GLM-4.5
/// (sigmoid router with its fp32 bias, shared expert), DeepSeek-V2 (MLA, softmax router) and
/// Llama 4 (chunked and NoPE layers, q/k L2 norm, the sigmoid-scaled repeated input of its bmm
/// experts: `repeat` kept, [`super::step::compile`]) are exact on their b2 s64 fp32 and bf16
/// records.
const COMPILE_CHECKED: &[super::family::Family] = &[
    super::family::Family::Llama,
    super::family::Family::Mistral,
    super::family::Family::Qwen3,
    super::family::Family::Olmo2,
    super::family::Family::Olmo3,
    super::family::Family::Gpt2,
    super::family::Family::Qwen3Moe,
    super::family::Family::Mixtral,
    super::family::Family::Gemma2,
    super::family::Family::Phi3,
    super::family::Family::SeedOss,
    super::family::Family::Exaone4,
    super::family::Family::Apertus,
    super::family::Family::DeepseekV3,
    super::family::Family::DeepseekV32,
    super::family::Family::GptOss,
    super::family::Family::MinimaxM2,
    super::family::Family::Qwen2,
    super::family::Family::Smollm3,
    super::family::Family::Gemma3,
    super::family::Family::Starcoder2,
    super::family::Family::Gemma,
    super::family::Family::Phi,
    super::family::Family::Stablelm,
    super::family::Family::Olmo,
    super::family::Family::GptNeox,
    super::family::Family::Opt,
    super::family::Family::Falcon,
    super::family::Family::Qwen2Moe,
    super::family::Family::Glm4Moe,
    super::family::Family::DeepseekV2,
    super::family::Family::Llama4,
];

/// What a framework's own modeling code does not have (or the estimator does not follow yet) for
/// this configuration: torchtitan 0.2.2's Llama 3 (`models/llama3/model/model.py`) is dense,
/// without biases, q/k norms or dropout, and attends through SDPA (`attn_type = "sdpa"`); its
/// Qwen3 (`models/qwen3/model/model.py`) is measured dense, untied, with its per-head q/k norms
/// (`tests/fixtures/pytorch/frameworks/torchtitan-qwen3.json`), and as a MoE
/// ([`torchtitan_moe_refusal`]); its DeepSeek-V3 in the 16B flavor's shape
/// ([`torchtitan_mla_refusal`]).
fn framework_refusal(cfg: &Config) -> Option<String> {
    use crate::estimator::config::Framework;
    use crate::estimator::family::Family;
    if cfg.framework == Framework::Torchtune {
        return torchtune_refusal(cfg);
    }
    if cfg.framework == Framework::Litgpt {
        return litgpt_refusal(cfg);
    }
    if cfg.framework != Framework::Torchtitan {
        return None;
    }
    let spec = &cfg.arch;
    let name = match spec.family {
        Family::Llama => "Llama 3",
        Family::Qwen3 => "Qwen3",
        Family::Qwen3Moe => return torchtitan_moe_refusal(cfg),
        Family::DeepseekV2 => return torchtitan_mla_refusal(cfg),
        Family::Llama4 => return torchtitan_llama4_refusal(cfg),
        Family::DeepseekV3 => {
            return Some(format!(
                "torchtitan's {:?} (its MoE: GroupedExperts, TokenChoiceTopKRouter, TokenReorderer) is not modelled yet",
                spec.family
            ))
        }
        other => {
            return Some(format!(
                "torchtitan ships Llama 3, Llama 4, Qwen3 and DeepSeek-V3 (followed: its 16B flavor's shape, deepseek_v2), not {other:?}"
            ))
        }
    };
    let qk_norm = if spec.family == Family::Qwen3 { model::QkNorm::Head } else { model::QkNorm::None };
    if spec.experts > 0 || spec.qk_norm != qk_norm || spec.qkv_bias || spec.o_bias || spec.mlp_bias {
        return Some(if spec.family == Family::Qwen3 {
            "torchtitan's Qwen3 is modelled dense (its MoE is not yet), with its per-head q/k norms and no biases".into()
        } else {
            "torchtitan's Llama 3 has no experts, biases or q/k norms".into()
        });
    }
    if spec.family == Family::Qwen3 && spec.tied {
        return Some("torchtitan's Qwen3 with enable_weight_tying (Qwen3 0.6B–4B) is not measured yet: untie the output".into());
    }
    if cfg.attn != crate::estimator::config::Attention::Sdpa {
        return Some(format!("torchtitan's {name} attends through SDPA (attn=sdpa)"));
    }
    if cfg.finetune != crate::estimator::config::Finetune::Full {
        return Some(format!("torchtitan 0.2.2 trains {name} in full (it ships no LoRA/QLoRA): finetune=full"));
    }
    if cfg.dropout > 0.0 {
        return Some(format!("torchtitan's {name} has no dropout"));
    }
    // Measured eager (tests/fixtures/pytorch/frameworks/torchtitan-llama3-tp-fp8.json): with
    // `enable_float8_tensorwise_tp` the linears receive inputs already cast to float8
    // (`PrepareFloat8ModuleInput` all-gathers them in float8) and save that float8 tensor and its
    // scale, where the step program's torchao linear saves the 16-bit input: saved bytes 18 % (fp32)
    // and 7.5 % (bf16) above the measured without checkpointing. With full or op checkpointing the
    // blocks' saves do not involve those inputs and the records match (saved bytes exact, resp.
    // 12 / 24 B over; peaks −0.14 to −0.23 %): estimated. Compiled the same (blocks alone or
    // with the loss: saved bytes 125 KB under without checkpointing, 44 to 56 B under with it —
    // 4-B weight scales —, peaks −0.15 to −0.24 %).
    if cfg.tp > 1 && cfg.recompute == Recompute::None && cfg.fp8_recipe() == super::config::Fp8::TorchaoTensorwise {
        return Some(format!(
            "torchtitan's float8 tensor parallelism for {name} without activation checkpointing (tensorwise: Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput, the linears' inputs all-gathered and saved in float8; measured eager and compiled, torchtitan-llama3-tp-fp8.json) is not modelled yet"
        ));
    }
    None
}

/// What `framework = torchtitan` does not follow (yet) in its Qwen3 MoE (`models/qwen3/model/
/// model.py` with `moe_enabled`, `models/moe/moe.py`): what `tests/fixtures/pytorch/frameworks/
/// torchtitan-qwen3_moe.json` measured — every layer's feed-forward a `MoE` with softmax scores
/// renormalised over the top k (`route_norm`), no shared expert, the scores applied after the
/// experts, grouped GEMMs without expert parallelism; per-head q/k norms, no biases, an untied
/// output, SDPA, no dropout. Everything else is refused by name.
fn torchtitan_moe_refusal(cfg: &Config) -> Option<String> {
    let spec = &cfg.arch;
    if spec.experts == 0 || spec.dense_mlp_layers() > 0 {
        return Some(
            "torchtitan's Qwen3 MoE is modelled with every layer's feed-forward a MoE (dense layers among them are not modelled yet)"
                .into(),
        );
    }
    if spec.shared_experts > 0 || spec.shared_gate {
        return Some("torchtitan's Qwen3 MoE with shared experts is not modelled yet".into());
    }
    if spec.qk_norm != model::QkNorm::Head || spec.qkv_bias || spec.o_bias || spec.mlp_bias {
        return Some("torchtitan's Qwen3 MoE has per-head q/k norms and no biases".into());
    }
    if spec.tied {
        return Some("torchtitan's Qwen3 MoE with enable_weight_tying is not measured yet: untie the output".into());
    }
    if cfg.ep > 1 || cfg.tp > 1 {
        return Some(
            "torchtitan's Qwen3 MoE with expert or tensor parallelism (its all-to-all dispatch, its MoE TP plan) is not modelled yet"
                .into(),
        );
    }
    if cfg.pp > 1 || cfg.cp > 1 {
        return Some("torchtitan's Qwen3 MoE under pipeline or context parallelism is not modelled yet".into());
    }
    if cfg.finetune != crate::estimator::config::Finetune::Full {
        return Some("torchtitan's Qwen3 MoE is modelled for full training only (finetune=full): its grouped experts take no LoRA".into());
    }
    if cfg.fp8_recipe() != crate::estimator::config::Fp8::None {
        return Some(
            "torchtitan's Qwen3 MoE with FP8 converters (Float8Linear, the MoE's grouped-GEMM converter) is not modelled yet".into(),
        );
    }
    if cfg.attn != crate::estimator::config::Attention::Sdpa {
        return Some("torchtitan's Qwen3 MoE attends through SDPA (attn=sdpa)".into());
    }
    if cfg.dropout > 0.0 {
        return Some("torchtitan's Qwen3 MoE has no dropout".into());
    }
    None
}

/// What torchtitan's DeepSeek-V3 (`models/deepseek_v3/model/model.py`) is followed for: its
/// "16B" flavor's shape, the DeepSeek-V2-Lite architecture (`family = deepseek_v2`, MLA without a
/// query low-rank, softmax routing without groups or `route_norm`, shared experts, dense first
/// layers), SDPA, eager, recompute none, full or op, in fp32, bf16 or bf16 autocast, without
/// expert, tensor, pipeline or context parallelism: what `tests/fixtures/pytorch/frameworks/torchtitan-deepseek_v3.json`
/// measured (`measure_frameworks.py` `build_torchtitan_deepseek_v3`). YaRN (a training sequence
/// beyond `original_seq_len`) changes `freqs_cis`' values and the softmax scale, no size. The 671B
/// flavor's sigmoid router with node-limited groups, its query low-rank and FP8 are refused by
/// name.
fn torchtitan_mla_refusal(cfg: &Config) -> Option<String> {
    let spec = &cfg.arch;
    let why = if !spec.is_mla() || spec.q_lora_rank > 0 {
        "torchtitan's DeepSeek-V3 with a query low-rank (q_lora_rank > 0: its 236B and 671B flavors) is not modelled yet: measured is its 16B flavor's MLA"
    } else if spec.experts == 0 || spec.shared_experts == 0 {
        "torchtitan's DeepSeek-V3 without routed or shared experts is not modelled yet"
    } else if spec.router != model::Router::Softmax || spec.router_groups > 1 || spec.router_bias {
        "torchtitan's DeepSeek-V3 with sigmoid or group-limited routing (its 671B flavor) is not modelled yet: measured is its 16B flavor's softmax router"
    } else if spec.qkv_bias || spec.o_bias || spec.mlp_bias || spec.qk_norm != model::QkNorm::None {
        "torchtitan's DeepSeek-V3 has no biases or q/k norms"
    } else if spec.tied {
        "torchtitan's DeepSeek-V3 never ties its output to the embedding: untie it"
    } else {
        return torchtitan_moe_run_refusal(cfg, "torchtitan's DeepSeek-V3", "; its flavors' \"flex\" is not modelled yet");
    };
    Some(why.into())
}

/// What torchtitan's Llama 4 (`models/llama4/model/model.py`) is followed for: its 17bx16e and
/// 17bx128e flavors' shape — RoPE in every block, no q/k norm, no chunked attention (its
/// `every_n_layers_nope` and flex paths are not measured), MoE blocks of sigmoid top-k routing with
/// one shared expert, dense blocks where `interleave_moe_layer_step` puts them — with SDPA, eager,
/// recompute none, full or op, without expert, tensor, pipeline or context parallelism: what
/// `tests/fixtures/pytorch/frameworks/torchtitan-llama4.json` measured
/// (`measure_frameworks.py` `build_torchtitan_llama4`). transformers' Llama 4 presets (Scout,
/// Maverick) describe Meta's checkpoints, with q/k L2 norms, NoPE layers and chunked attention:
/// refused by name here, estimated with `framework = hf`.
fn torchtitan_llama4_refusal(cfg: &Config) -> Option<String> {
    let spec = &cfg.arch;
    let why = if spec.qk_l2_norm || spec.qk_norm != model::QkNorm::None {
        "torchtitan's Llama 4 has no q/k norm (transformers' Llama 4 presets, Meta's checkpoints, have an L2 one: framework=hf)"
    } else if spec.nope_layers != model::LayerRule::None || spec.window_layers != model::LayerRule::None {
        "torchtitan's Llama 4 with NoPE layers or chunked attention (every_n_layers_nope, flex) is not modelled yet: its 17bx16e and 17bx128e flavors put RoPE in every block"
    } else if spec.experts == 0 || spec.shared_experts != 1 {
        "torchtitan's Llama 4 is measured with MoE blocks of one shared expert"
    } else if spec.qkv_bias || spec.o_bias || spec.mlp_bias || spec.tied {
        "torchtitan's Llama 4 has no biases and an untied output"
    } else {
        return torchtitan_moe_run_refusal(cfg, "torchtitan's Llama 4", "");
    };
    Some(why.into())
}

/// What torchtitan's DeepSeek-V3 and Llama 4 (`model`: the name the message gives) are measured
/// without, alike: expert, tensor, pipeline or context parallelism, LoRA, FP8 converters,
/// Megatron's selective or every-N checkpointing (none, full and op are measured), attention
/// other than SDPA (`attn_note`: what the message adds about the model's own choice), dropout.
fn torchtitan_moe_run_refusal(cfg: &Config, model: &str, attn_note: &str) -> Option<String> {
    use crate::estimator::config::{Finetune, Recompute};
    Some(if cfg.ep > 1 || cfg.tp > 1 {
        format!("{model} with expert or tensor parallelism (its all-to-all dispatch, its MoE TP plan) is not modelled yet")
    } else if cfg.pp > 1 || cfg.cp > 1 {
        format!("{model} under pipeline or context parallelism is not modelled yet")
    } else if cfg.finetune != Finetune::Full {
        format!("{model} trains in full (finetune=full)")
    } else if cfg.fp8_recipe() != crate::estimator::config::Fp8::None {
        format!("{model} with FP8 converters is not modelled yet")
    } else if !matches!(cfg.recompute, Recompute::None | Recompute::Full | Recompute::Op) || cfg.recompute_every > 0 {
        format!("{model} under Megatron's selective or every-N checkpointing is not modelled yet (measured: recompute none, full and op)")
    } else if cfg.attn != crate::estimator::config::Attention::Sdpa {
        format!("{model} is followed with attn_type = \"sdpa\" (attn=sdpa){attn_note}")
    } else if cfg.dropout > 0.0 {
        format!("{model} has no dropout")
    } else {
        return None;
    })
}

/// What `framework = torchtune` does not follow (yet): the step program is torchtune 0.6.1's
/// Llama 2 / 3 / 3.1 / 3.2, Mistral, Qwen2 / 2.5, Phi-3, Gemma and Gemma 2 (`llama2`, `llama3`,
/// `llama3_1`, `llama3_2`, `mistral`, `qwen2`, `phi3`, `gemma`, `gemma2`: dense, no q/k norms or
/// dropout, q/k/v biases in Qwen2 only, SDPA — Gemma 2's own eager attention under the same
/// `attn=sdpa` its records carry —, the output tied or not) trained as
/// `full_finetune_single_device.py` trains it (full fine-tuning in fp32, pure bf16 — and bf16
/// autocast, as measured — with its `CEWithChunkedOutputLoss`, each layer checkpointed or none),
/// on one device — and its LoRA (`LoRALinear`, adapters in the model's dtype, on Llama 3.1 / 3.2
/// and Qwen2 / 2.5 in fp32 or bf16; compiled on q and v in bf16) as `lora_finetune_single_device.py`
/// trains it —, and on several GPUs both in bf16 as `full_finetune_distributed.py` and
/// `lora_finetune_distributed.py` shard them (FSDP2 through `training.shard_model`, `zero =
/// full_shard`): what
/// `tests/fixtures/pytorch/frameworks/torchtune-*.json` measured. Everything
/// else (Qwen3 among it: not in torchtune 0.6.1) is refused by name, not estimated as something
/// else.
fn torchtune_refusal(cfg: &Config) -> Option<String> {
    use crate::estimator::config::{Attention, Finetune, Loss, Precision, Recompute};
    use crate::estimator::family::Family;
    let spec = &cfg.arch;
    if !matches!(spec.family, Family::Llama | Family::Mistral | Family::Qwen2 | Family::Phi3 | Family::Gemma | Family::Gemma2) {
        return Some(format!(
            "torchtune is modelled for Llama 2/3/3.1/3.2, Mistral, Qwen2/2.5, Phi-3, Gemma and Gemma 2 only, not {:?}{}",
            spec.family,
            // torchtune 0.6.1 (its last release, the pinned version) has no `torchtune.models.qwen3`.
            if spec.family == Family::Qwen3 { " (torchtune 0.6.1, the last release, ships no Qwen3 builder)" } else { "" }
        ));
    }
    if spec.family == Family::Phi3 && super::step::families::common::rotary_dims(spec) != spec.head_dim {
        return Some("torchtune's Phi-3 rotates every head dimension (no partial_rotary_factor)".into());
    }
    if spec.experts > 0 || spec.qk_norm != model::QkNorm::None || spec.o_bias || spec.mlp_bias {
        return Some("torchtune's Llama, Mistral, Qwen2, Phi-3 and Gemma (2) have no experts, output or MLP biases, or q/k norms".into());
    }
    if spec.qkv_bias != (spec.family == Family::Qwen2) {
        return Some("torchtune's q/k/v projections have biases in Qwen2 and in no Llama, Mistral, Phi-3 or Gemma (2)".into());
    }
    if cfg.attn != Attention::Sdpa {
        return Some("torchtune's MultiHeadAttention attends through SDPA (attn=sdpa)".into());
    }
    if cfg.dropout > 0.0 {
        return Some("torchtune's models are measured without dropout (attn_dropout = 0)".into());
    }
    if !matches!(cfg.precision, Precision::Fp32 | Precision::Bf16 | Precision::AmpBf16) {
        return Some("torchtune trains in fp32 or bf16 (precision=fp32, bf16 or amp-bf16 as measured)".into());
    }
    if cfg.tp > 1 || cfg.pp > 1 || cfg.cp > 1 || cfg.ep > 1 {
        return Some(
            "torchtune is modelled on one device and under its distributed recipes' FSDP2 (full_finetune_distributed.py, lora_finetune_distributed.py), without tensor, pipeline, context or expert parallelism".into(),
        );
    }
    // The distributed recipes (`full_finetune_distributed.py`, `lora_finetune_distributed.py`):
    // FSDP2 over every GPU as `training.shard_model` wraps the model, measured on two CPU ranks
    // (tests/fixtures/pytorch/fsdp/tune.json, validation/measure_tune_fsdp.py).
    if cfg.gpus > 1 {
        if cfg.zero != super::config::Zero::FullShard {
            return Some(
                "torchtune's distributed recipes shard every parameter with FSDP2 over all GPUs (training.shard_model: zero=full_shard)"
                    .into(),
            );
        }
        if cfg.precision != Precision::Bf16 {
            return Some("torchtune's distributed recipes are measured in bf16, the dtype their configs ship (precision=bf16)".into());
        }
        if cfg.finetune == Finetune::Full && spec.tied {
            // `TiedLinear` is no module: `custom_sharded_layers` shards the embedding alone, and
            // the head reads its weight outside any unit's calls (not measured).
            return Some("torchtune's distributed full fine-tune of a model with a tied output (TiedLinear reads the embedding unit's weight outside its calls) is not measured".into());
        }
    }
    // QLoRA on torchao's NF4Tensor is measured (tests/fixtures/pytorch/torchao_nf4); LoRA
    // (`LoRALinear` on a bf16 or fp32 base, adapters in the model's dtype) on torchtune's Llama 3.1
    // and Qwen2 in fp32 and bf16 (tests/fixtures/pytorch/frameworks/torchtune-{llama3,qwen2}-lora.json).
    if cfg.finetune == Finetune::Qlora && cfg.qlora_quant != super::config::QloraQuant::TorchaoNf4 {
        return Some("torchtune's QLoRA quantizes its base with torchao's NF4Tensor (qlora_quant=torchao-nf4)".into());
    }
    if cfg.finetune == Finetune::Qlora && spec.family != Family::Llama {
        // torchtune 0.6.1 ships no QLoRA builder for Qwen2/2.5; its Mistral, Phi-3 and Gemma ones
        // (`qlora_mistral_7b`, …) are not measured. Measured: `lora_llama3_1` and `lora_llama3_2`
        // with `quantize_base=True` (tests/fixtures/pytorch/frameworks/torchtune-llama3-qlora.json).
        return Some(format!(
            "torchtune's QLoRA is measured on its Llama 3.1 and 3.2 builders (qlora_llama3_1_*, qlora_llama3_2_*), not {:?}'s",
            spec.family
        ));
    }
    if cfg.finetune == Finetune::Qlora && cfg.precision != Precision::Bf16 {
        return Some("torchtune's QLoRA is measured in bf16 (precision=bf16: its NF4Tensor dequantizes to the model's dtype)".into());
    }
    if matches!(cfg.finetune, Finetune::Lora | Finetune::Qlora) {
        // `lora_llama3_1` / `lora_llama3_2` share one RoPE module, `lora_qwen2` builds one per layer
        // (`step/families/torchtune.rs`, `rope_modules`); the other families' LoRA builders are
        // not measured. Llama follows `lora_llama3_1` (`lora_llama2` and `lora_llama3` build a RoPE
        // per layer, as `lora_qwen2`: their caches are under-counted by L − 1).
        if !matches!(spec.family, Family::Llama | Family::Qwen2) {
            return Some(format!(
                "torchtune's LoRA is measured on its Llama 3.1 and Qwen2 builders (lora_llama3_1, lora_qwen2), not {:?}'s",
                spec.family
            ));
        }
        if cfg.lora_dtype != super::config::LoraDtype::Model {
            return Some("torchtune's LoRALinear builds its adapters in the model's dtype and adds them uncast (lora_dtype=model)".into());
        }
        if cfg.precision == Precision::AmpBf16 {
            return Some("torchtune's LoRA recipes are measured in fp32 and bf16, not under bf16 autocast (precision=amp-bf16)".into());
        }
    }
    // `loss=standard`: `torch.nn.CrossEntropyLoss` on torchtune's Llama, measured in the
    // single-device full fine-tune (torchtune-llama3-ce.json) and in the distributed QLoRA
    // (fsdp/tune.json, as `405B_qlora.yaml` shipped it); a single-device LoRA or QLoRA composes
    // the two (the loss reads only the logits). Not other families or Liger's loss.
    if cfg.loss != Loss::Chunked && (cfg.loss != Loss::Standard || spec.family != Family::Llama) {
        return Some(
            "torchtune is modelled with the CEWithChunkedOutputLoss its configs ship (loss=chunked), and with torch.nn.CrossEntropyLoss (loss=standard) on its Llama only".into(),
        );
    }
    if !matches!(cfg.recompute, Recompute::None | Recompute::Full) || cfg.recompute_every > 0 {
        return Some("torchtune checkpoints every layer or none (recompute=full or none)".into());
    }
    None
}

/// What `framework = litgpt` does not follow (yet): the step program is litgpt 0.5.13's `GPT`
/// with a Llama 3 / 3.1 config (dense, no biases, q/k norms or dropout, SDPA, untied, rotary over
/// the whole head) trained as `finetune/full.py` trains it on one device (full fine-tuning under
/// Fabric's `32-true`, `bf16-true` or `bf16-mixed`, its `chunked_cross_entropy`, each `Block`
/// checkpointed or none, eager): what `tests/fixtures/pytorch/frameworks/litgpt-llama3.json`
/// measured. Everything else is refused by name, not estimated as something else.
fn litgpt_refusal(cfg: &Config) -> Option<String> {
    use crate::estimator::config::{Attention, Finetune, Loss, Precision, Recompute};
    use crate::estimator::family::Family;
    let spec = &cfg.arch;
    if spec.family == Family::Mixtral {
        return Some(format!(
            "litgpt's {} config (tests/fixtures/pytorch/frameworks/litgpt-*.json) is measured but not modelled yet",
            spec.family.label()
        ));
    }
    if !crate::estimator::step::families::litgpt::ships(spec.family) {
        return Some(format!(
            "litgpt is modelled for its Llama 3, Mistral, Qwen2.5, Phi-3, Gemma, Gemma 2 and Pythia configs only (yet), not {:?}",
            spec.family
        ));
    }
    if spec.experts > 0 || spec.qk_norm != model::QkNorm::None {
        return Some("litgpt's configs followed here have no experts or q/k norms".into());
    }
    // litgpt's `bias` puts one on every linear but lm_head; `attn_bias` on the fused qkv alone.
    let biases = (spec.qkv_bias, spec.o_bias, spec.mlp_bias);
    if !matches!(biases, (false, false, false) | (true, false, false) | (true, true, true)) {
        return Some("litgpt's Config has biases on every linear (bias) or on the fused qkv alone (attn_bias): not this mix".into());
    }
    if spec.tied {
        return Some("litgpt's GPT never ties lm_head to wte: untie the output (tie_word_embeddings = false)".into());
    }
    let gemma2 = spec.family == Family::Gemma2;
    if spec.layer_norms != if gemma2 { 4 } else { 2 }
        || !matches!(spec.norm, model::NormKind::Rmsnorm | model::NormKind::RmsnormGemma | model::NormKind::Layernorm)
    {
        return Some(
            "litgpt's Block is followed with norm_1 and norm_2 (RMSNorm or LayerNorm with a bias), and Gemma 2's post-attention and post-MLP norms".into(),
        );
    }
    let gated_ok = spec.mlp == model::MlpKind::Gated && matches!(spec.act, model::Activation::Silu | model::Activation::GeluTanh);
    let plain_ok = spec.mlp == model::MlpKind::Plain && spec.act == model::Activation::Gelu;
    if !(gated_ok || plain_ok) {
        return Some("litgpt's MLPs are LLaMAMLP (SiLU), GemmaMLP (tanh GELU) and GptNeoxMLP (GELU)".into());
    }
    if spec.window > 0 && spec.window_layers != model::LayerRule::All && !gemma2 {
        return Some(
            "litgpt's sliding window is followed on every layer (Mistral's and Phi-3's configs) or Gemma 2's even layers only".into(),
        );
    }
    if spec.softcap != gemma2 {
        return Some("litgpt's logit soft-capping is followed with Gemma 2's configs (attention and final) only".into());
    }
    if spec.window > 0 && spec.window_kind != model::WindowKind::Sliding {
        return Some("litgpt has no chunked attention".into());
    }
    if cfg.attn != Attention::Sdpa {
        return Some("litgpt's CausalSelfAttention attends through SDPA (attn=sdpa)".into());
    }
    if cfg.dropout > 0.0 {
        return Some("litgpt's GPT has no dropout".into());
    }
    if !matches!(cfg.precision, Precision::Fp32 | Precision::Bf16 | Precision::AmpBf16) {
        return Some("litgpt trains under Fabric's 32-true, bf16-true or bf16-mixed (precision=fp32, bf16 or amp-bf16)".into());
    }
    if cfg.seq > spec.max_pos {
        return Some(format!("litgpt refuses a sequence of {} beyond the model's block_size ({})", cfg.seq, spec.max_pos));
    }
    if cfg.precision == Precision::Bf16 && cfg.seq == spec.max_pos {
        return Some(
            "litgpt under bf16-true with seq = block_size keeps the RoPE cache Fabric converted to bf16 (fit does not rebuild it): not measured".into(),
        );
    }
    if cfg.finetune != Finetune::Full {
        return Some("litgpt's LoRA and adapter scripts (its own modules) are not modelled: finetune=full".into());
    }
    if cfg.loss != Loss::Standard {
        return Some("litgpt's loss is its chunked_cross_entropy (loss=standard selects it); a fused chunked loss is not litgpt's".into());
    }
    if !matches!(cfg.recompute, Recompute::None | Recompute::Full) || cfg.recompute_every > 0 {
        return Some("litgpt checkpoints every Block or none (recompute=full or none)".into());
    }
    if cfg.compile || cfg.act_offload.on() || cfg.optim_in_bwd {
        return Some("litgpt's finetune/full.py runs eager, without activation offloading or an optimizer step in backward".into());
    }
    if cfg.tp > 1 || cfg.pp > 1 || cfg.cp > 1 || cfg.ep > 1 || cfg.gpus > 1 {
        return Some("litgpt is modelled on one device (its FSDPStrategy is not): gpus = 1".into());
    }
    None
}

/// Adapter dropout where the step program does not follow what runs: the experts' adapters of
/// a mixture-of-experts layer (`families/moe.rs lora_pairs`, one node per expert pair, no
/// `nn.Dropout`), and a compiled step (Inductor generates the masks from its own RNG offsets:
/// what it keeps is not measured). Refused by name rather than counted without the masks.
fn unmodelled_lora_dropout(cfg: &Config) -> Option<&'static str> {
    use crate::estimator::config::LoraTargets;
    let mlp = LoraTargets::GATE | LoraTargets::UP | LoraTargets::DOWN;
    let on = cfg.finetune != Finetune::Full && cfg.lora_dropout > 0.0;
    if on && cfg.arch.experts > 0 && cfg.lora_targets.0 & mlp != 0 {
        return Some("LoRA adapter dropout (lora_dropout > 0) on a mixture-of-experts model's expert adapters");
    }
    (on && cfg.compile).then_some("LoRA adapter dropout (lora_dropout > 0) in a compiled step (compile = true)")
}

/// The first architectural feature whose saved tensors the activation model does not cover yet.
/// Sliding windows are covered (they change masks, not saved shapes: measured on Gemma-2), and so
/// are dense and MoE layers in any order (counted per layer kind), NoPE layers (SmolLM3: measured),
/// gpt-oss's layout (sinks, its router and experts: measured) and Llama 4's (measured).
pub fn unmodelled_feature(spec: &model::ModelSpec) -> Option<&'static str> {
    use model::{Activation, Router, WindowKind};
    let moe = spec.experts > 0;
    // A Mamba-2 mixer is Falcon-H1's (beside attention) or Granite 4.0-H's (in its place).
    use crate::estimator::family::Family;
    if spec.ssm.heads > 0 && !matches!(spec.family, Family::FalconH1 | Family::GraniteMoeHybrid) {
        return Some("a Mamba-2 mixer outside Falcon-H1 and Granite 4.0-H");
    }
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
        (spec.act == Activation::Xielu && spec.family != crate::estimator::family::Family::Apertus, "the xIELU activation outside Apertus"),
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

/// The families whose layers were measured under Transformer Engine's per-layer offloading
/// around transformers' code (`recipes/{llama-gqa,qwen2,qwen3,mistral,phi3,gemma2}-L4.json`:
/// which saved tensors are contiguous is each family's code).
const TE_OFFLOAD_CHECKED: &[super::family::Family] = &[
    super::family::Family::Llama,
    super::family::Family::Qwen2,
    super::family::Family::Qwen3,
    super::family::Family::Mistral,
    super::family::Family::Phi3,
    super::family::Family::Gemma2,
];

/// Why `act_offload_layers` (Transformer Engine's per-layer offloading, `step::te_offload`)
/// cannot run or is not modelled for `cfg`, if so.
fn layer_offload_refusal(cfg: &Config) -> Option<EstimateError> {
    let n = cfg.act_offload_layers;
    // Transformer Engine 2.20.2 `get_cpu_offload_context`: "Cannot offload all layers without
    // manual synchronization - last layer is not offloaded"; Megatron-Core's
    // `TransformerConfig.__post_init__`: "CPU offloading can be done only for layers less than".
    if n >= cfg.arch.layers {
        return Some(invalid(
            "act_offload_layers",
            format!(
                "{n} of {} layers: Transformer Engine offloads at most all but the last layer (at most {})",
                cfg.arch.layers,
                cfg.arch.layers.saturating_sub(1)
            ),
        ));
    }
    // Megatron-Core's `TransformerConfig.__post_init__` (main at d98e8a6).
    if cfg.pp > 1 {
        return Some(invalid("act_offload_layers", "Megatron has no support for pipeline parallelism with CPU offloading: set pp = 1"));
    }
    if cfg.recompute != Recompute::None || cfg.recompute_every > 0 {
        return Some(invalid(
            "act_offload_layers",
            "Megatron's CPU offloading does not work when activation recomputation is enabled: set recompute = none",
        ));
    }
    if cfg.act_offload.on() {
        return Some(invalid(
            "act_offload_layers",
            "offloads by layer (Megatron) where act_offload already offloads every saved tensor (torchtune): choose one",
        ));
    }
    let pending = |what: &str| Some(invalid("act_offload_layers", format!("{what} is not modelled yet")));
    if cfg.compile {
        return pending("Transformer Engine's per-layer offloading of compiled layers");
    }
    match cfg.framework {
        Framework::Megatron => None,
        Framework::Hf => {
            // Measured (validation/measure_recipes.py, `CpuTeLayerOffload`): SDPA returns its
            // output in `[b, s, h, d]` layout, o_proj saves a contiguous view of it, and
            // `_switch_to_base_tensors` swaps that view for the non-contiguous output itself:
            // `start_offload` raises "Tensor at index … must be contiguous for CPU offloading"
            // as the second layer enters.
            if cfg.attn == super::config::Attention::Sdpa {
                return Some(invalid(
                    "act_offload_layers",
                    "Transformer Engine's offloading context around transformers' layers raises with SDPA (o_proj saves a view of SDPA's output, whose base is not contiguous: `start_offload` refuses it); set attn = eager, or framework = megatron for Megatron's own modules",
                ));
            }
            if cfg.attn != super::config::Attention::Eager {
                return pending("Transformer Engine's per-layer offloading around transformers' layers with flash-attn (what its kernel saves is not measured; measured: attn = eager)");
            }
            if !TE_OFFLOAD_CHECKED.contains(&cfg.arch.family) {
                return pending(
                    "Transformer Engine's per-layer offloading around transformers' layers of a family not measured so (measured: llama, qwen2, qwen3, mistral, phi3, gemma2)",
                );
            }
            None
        }
        _ => pending(
            "Transformer Engine's per-layer offloading around a framework's own layers (framework = hf with attn = eager, or megatron)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::config::{Finetune, Loss};

    #[test]
    fn torch_compile_of_transformer_engines_fp8_linears_is_refused_by_name() {
        use crate::estimator::config::{Fp8, Precision};
        // The property test's counterexample: the peak fell from micro-batch 3 to 4.
        for q in [Config { fp8: Fp8::TeDelayed, ..Config::default() }, Config { precision: Precision::MixedFp8, ..Config::default() }] {
            let e = validate(&Config { compile: true, tp: 4, gpus: 4, ..q.clone() }).expect_err("refused");
            assert_eq!(e.key(), "compile", "{e}");
            assert!(e.to_string().contains("Transformer Engine") && e.to_string().contains("not modelled yet"), "{e}");
            assert!(validate(&q).is_ok(), "eager stays estimated");
        }
        assert!(validate(&Config { compile: true, fp8: Fp8::TorchaoTensorwise, ..Config::default() }).is_ok());
    }

    #[test]
    fn litgpts_stack_keys_are_refused_by_name_where_they_would_change_nothing() {
        let qlora = Config { finetune: Finetune::Qlora, qlora_lightning: true, holds_prev_logits: true, ..Config::default() };
        assert!(validate(&qlora).is_ok(), "{:?}", validate(&qlora));
        // No 4-bit base for Lightning's plugin to quantize.
        let full = Config { finetune: Finetune::Full, holds_prev_logits: false, ..qlora.clone() };
        assert_eq!(validate(&full).map_err(|e| e.key()), Err("qlora_lightning"));
        // torchtune's chunked loss has no litgpt loop around it.
        let chunked = Config { qlora_lightning: false, loss: Loss::Chunked, ..qlora.clone() };
        assert_eq!(validate(&chunked).map_err(|e| e.key()), Err("holds_prev_logits"));
        let chunked = Config { holds_prev_logits: false, loss: Loss::Chunked, ..qlora };
        assert_eq!(validate(&chunked).map_err(|e| e.key()), Err("qlora_lightning"));
    }

    #[test]
    fn megatrons_block_method_is_refused_by_its_key_off_megatron_or_without_full_recomputation() {
        let block = Config { framework: Framework::Megatron, recompute: Recompute::Full, recompute_layers: 4, ..Config::default() };
        assert!(validate(&block).is_ok(), "{:?}", validate(&block));
        for cfg in [
            Config { framework: Framework::Hf, ..block.clone() },
            Config { framework: Framework::Torchtitan, ..block.clone() },
            Config { recompute: Recompute::Selective, ..block.clone() },
            Config { recompute: Recompute::None, ..block },
        ] {
            let e = validate(&cfg).expect_err("refused");
            assert_eq!(e.key(), "recompute_layers", "{e}");
        }
    }
}
