//! accelerate configs (YAML, `accelerate config`'s file: `distributed_type`, `mixed_precision`,
//! `num_processes`, `fsdp_config`, `deepspeed_config`, `megatron_lm_config`), and the FSDP
//! options the Trainer and axolotl spell the same way (with or without the `fsdp_` prefix).

use super::report::{positive, FileState, Out};
use super::tree::{self, boolean, int, text};
use serde_json::Value;

pub fn read(root: &Value, st: &mut FileState) {
    let kind = root.get("distributed_type").and_then(text).unwrap_or_else(|| "NO".into()).to_ascii_uppercase();
    for (key, v) in tree::leaves(root) {
        let out = map(&key, v, root, &kind);
        st.record(&key, v, out);
    }
    if root.get("mixed_precision").is_none() && kind != "DEEPSPEED" {
        st.default("mixed_precision", vec![("precision", "fp32".into())], "accelerate's default is no mixed precision");
    }
}

fn map(key: &str, v: &Value, root: &Value, kind: &str) -> Out {
    let top = key.split('.').next().unwrap_or("");
    let sharded = kind == "FSDP" || kind == "DEEPSPEED" || kind == "MEGATRON_LM";
    match key {
        "distributed_type" => match kind {
            "NO" => Out::set(vec![("gpus", "1".into()), ("zero", "0".into())]),
            "MULTI_GPU" => Out::one("zero", "0").note("DDP"),
            "FSDP" => Out::ignored("read with fsdp_config").status_understood(),
            "DEEPSPEED" => Out::ignored("read with deepspeed_config (and the DeepSpeed file it names)").status_understood(),
            "MEGATRON_LM" => Out::one("framework", "megatron"),
            _ => Out::unmodelled("a device type trainmem does not model (it models CUDA GPUs)"),
        },
        "num_processes" => positive(v, "gpus"),
        "num_machines" => Out::ignored("num_processes counts every GPU of every machine"),
        "mixed_precision" => match text(v).map(|s| s.to_ascii_lowercase()).as_deref() {
            Some("bf16") if sharded => {
                Out::one("precision", "mixed-bf16").note("bf16 compute over fp32 (sharded) weights, fp32 optimizer states")
            }
            Some("fp16") if sharded => Out::one("precision", "mixed-fp16"),
            Some("bf16") => Out::one("precision", "amp-bf16").note("autocast over the model's fp32 weights"),
            Some("fp16") => Out::one("precision", "amp-fp16"),
            Some("no") => Out::one("precision", "fp32"),
            Some("fp8") => Out::one("precision", "amp-bf16")
                .approx("FP8 (Transformer Engine or torchao) under accelerate: not modelled; estimated as bf16 autocast"),
            _ => Out::invalid("expected no, fp16, bf16 or fp8"),
        },
        "deepspeed_config.zero_stage" => match int(v) {
            Some(s @ 0..=3) => Out::one("zero", s),
            _ => Out::invalid("expected 0, 1, 2 or 3"),
        },
        "deepspeed_config.offload_optimizer_device" => match text(v).as_deref() {
            Some("cpu") => Out::one("offload", offload_with(root, "deepspeed_config.offload_param_device")),
            Some("none") => Out::ignored("no offload"),
            Some("nvme") => Out::one("offload", "optimizer").approx("NVMe offload: the estimate counts host memory instead"),
            _ => Out::invalid("expected none, cpu or nvme"),
        },
        "deepspeed_config.offload_param_device" => match text(v).as_deref() {
            Some("cpu") => Out::one("offload", "optimizer+params"),
            Some("none") => Out::ignored("no offload"),
            Some("nvme") => Out::one("offload", "optimizer+params").approx("NVMe offload: the estimate counts host memory instead"),
            _ => Out::invalid("expected none, cpu or nvme"),
        },
        "deepspeed_config.gradient_accumulation_steps" => positive(v, "accum"),
        "deepspeed_config.deepspeed_config_file" => Out::ignored("give that file to the import too: its keys are read there"),
        "deepspeed_config.zero3_init_flag" | "deepspeed_config.zero3_save_16bit_model" | "deepspeed_config.gradient_clipping" => {
            Out::ignored("loading, saving or clipping: outside what the step stores")
        }
        "megatron_lm_config.megatron_lm_tp_degree" => positive(v, "tp"),
        "megatron_lm_config.megatron_lm_pp_degree" => positive(v, "pp"),
        "megatron_lm_config.megatron_lm_sequence_parallelism" => bool_key(v, "sp"),
        "megatron_lm_config.megatron_lm_recompute_activations" => match boolean(v) {
            Some(true) => Out::one("recompute", "selective"),
            Some(false) => Out::one("recompute", "none"),
            None => Out::invalid("expected true or false"),
        },
        "megatron_lm_config.megatron_lm_use_distributed_optimizer" => match boolean(v) {
            Some(true) => Out::one("zero", "1"),
            Some(false) => Out::one("zero", "0"),
            None => Out::invalid("expected true or false"),
        },
        "megatron_lm_config.megatron_lm_num_micro_batches" => positive(v, "accum"),
        "dynamo_config.dynamo_backend" => dynamo_backend(v, root),
        "dynamo_config.dynamo_use_regional_compilation" | "dynamo_config.dynamo_use_fullgraph" | "dynamo_config.dynamo_use_dynamic" => {
            Out::ignored("read with dynamo_backend").status_understood()
        }
        "dynamo_config.dynamo_mode" => match text(v).as_deref() {
            Some("default") | Some("max-autotune-no-cudagraphs") => Out::ignored("the kernels' choice: the same tensors are kept"),
            Some(_) => Out::unmodelled("CUDA graphs (reduce-overhead, max-autotune) keep their own memory pool: not modelled"),
            None => Out::invalid("expected default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs"),
        },
        _ if top == "fsdp_config" => fsdp(key.trim_start_matches("fsdp_config.").trim_start_matches("fsdp_"), v, root.get("fsdp_config")),
        _ => match top {
            "compute_environment"
            | "machine_rank"
            | "main_process_ip"
            | "main_process_port"
            | "main_training_function"
            | "rdzv_backend"
            | "same_network"
            | "use_cpu"
            | "debug"
            | "enable_cpu_affinity"
            | "downcast_bf16"
            | "gpu_ids"
            | "tpu_env"
            | "tpu_use_cluster"
            | "tpu_use_sudo"
            | "ipex_config"
            | "mpirun_config"
            | "dynamo_config" => Out::ignored("launching: no GPU memory"),
            "deepspeed_config" | "megatron_lm_config" => Out::unmodelled("an option trainmem does not model"),
            _ => Out::unknown(),
        },
    }
}

/// `dynamo_config.dynamo_backend`: accelerate 1.15's `Accelerator.prepare_model` (and, under
/// DeepSpeed, `engine.compile()`) compiles the whole model with `torch.compile` — trainmem's
/// `compile_regions = model`, as the Trainer's `torch_compile` does. With
/// `dynamo_use_regional_compilation` it compiles each repeated block and, apart, the other
/// children (`utils/other.py compile_regions`), leaving the causal-LM forward and its loss eager:
/// none of trainmem's regions. Backends other than Inductor partition differently.
fn dynamo_backend(v: &Value, root: &Value) -> Out {
    let regional = tree::get(root, "dynamo_config.dynamo_use_regional_compilation").and_then(boolean) == Some(true);
    match text(v).map(|s| s.to_ascii_uppercase()).as_deref() {
        Some("NO") => Out::ignored("eager PyTorch"),
        Some("INDUCTOR") if !regional => Out::set(vec![("compile", "true".into()), ("compile_regions", "model".into())])
            .note("accelerate compiles the whole model (its graph breaks included), as the Trainer's torch_compile does"),
        Some("INDUCTOR") => Out::unmodelled(
            "regional compilation compiles each decoder layer and, apart, the final norm and LM head, and leaves the loss eager: not one of trainmem's compile_regions",
        ),
        Some(_) => Out::unmodelled("a torch.compile backend other than Inductor: only Inductor's partitioner is modelled"),
        None => Out::invalid("expected a dynamo backend name (NO, INDUCTOR, …)"),
    }
}

fn offload_with(root: &Value, param_key: &str) -> &'static str {
    if tree::get(root, param_key).and_then(text).as_deref() == Some("cpu") {
        "optimizer+params"
    } else {
        "optimizer"
    }
}

fn bool_key(v: &Value, key: &'static str) -> Out {
    match boolean(v) {
        Some(b) => Out::one(key, b),
        None => Out::invalid("expected true or false"),
    }
}

/// One FSDP option, named without `fsdp_` (`sharding_strategy`, `offload_params`,
/// `activation_checkpointing`, `reshard_after_forward`, `version`, …); `all` is the whole
/// FSDP table (to read `version` beside `reshard_after_forward`).
pub fn fsdp(name: &str, v: &Value, all: Option<&Value>) -> Out {
    let _ = all;
    match name {
        "sharding_strategy" => match text(v).map(|s| s.to_ascii_uppercase()).as_deref() {
            Some("FULL_SHARD" | "1") => Out::one("zero", "full_shard"),
            Some("SHARD_GRAD_OP" | "2") => Out::one("zero", "shard_grad_op"),
            Some("NO_SHARD" | "3") => Out::one("zero", "0"),
            Some("HYBRID_SHARD" | "4") => Out::one("zero", "hybrid_shard"),
            Some("HYBRID_SHARD_ZERO2" | "5") => {
                Out::one("zero", "hybrid_shard").approx("ZeRO-2 inside each node: estimated as HYBRID_SHARD (ZeRO-3 inside)")
            }
            _ => Out::invalid("expected FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or HYBRID_SHARD_ZERO2"),
        },
        "reshard_after_forward" => match boolean(v) {
            Some(true) => Out::one("zero", "full_shard"),
            Some(false) => Out::one("zero", "shard_grad_op"),
            None => fsdp("sharding_strategy", v, all),
        },
        "offload_params" => match boolean(v) {
            Some(true) => Out::one("offload", "optimizer+params"),
            Some(false) => Out::ignored("no offload"),
            None => Out::invalid("expected true or false"),
        },
        "activation_checkpointing" => match boolean(v) {
            Some(true) => Out::one("recompute", "full"),
            Some(false) => Out::ignored("no checkpointing by FSDP (the script may still checkpoint)"),
            None => Out::invalid("expected true or false"),
        },
        "backward_prefetch" => match text(v).map(|s| s.to_ascii_uppercase()).as_deref() {
            Some("NO_PREFETCH") => Out::one("prefetch_layers", 1),
            Some("BACKWARD_PRE" | "BACKWARD_POST") => Out::one("prefetch_layers", 2).note("the next layer is gathered while one computes"),
            _ => Out::invalid("expected BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH"),
        },
        "forward_prefetch" => match boolean(v) {
            Some(true) => Out::unmodelled("forward prefetch gathers one more layer during forward: not modelled"),
            _ => Out::ignored("off"),
        },
        "version" => match int(v) {
            Some(1 | 2) => Out::ignored("FSDP1 and FSDP2 store the same shards"),
            _ => Out::invalid("expected 1 or 2"),
        },
        "cpu_offload" => Out::ignored("read as offload_params"),
        "auto_wrap_policy"
        | "transformer_layer_cls_to_wrap"
        | "min_num_params"
        | "state_dict_type"
        | "sync_module_states"
        | "use_orig_params"
        | "cpu_ram_efficient_loading"
        | "limit_all_gathers"
        | "xla"
        | "xla_fsdp_grad_ckpt"
        | "xla_fsdp_v2"
        | "activation_cpu_offload" => {
            if name == "activation_cpu_offload" {
                on_off_unmodelled(v, "activations offloaded to the CPU: not modelled")
            } else {
                Out::ignored("wrapping, loading and saving: the estimate shards per decoder layer")
            }
        }
        _ => Out::unknown(),
    }
}

fn on_off_unmodelled(v: &Value, why: &str) -> Out {
    match boolean(v) {
        Some(true) => Out::unmodelled(why),
        _ => Out::ignored("off"),
    }
}
