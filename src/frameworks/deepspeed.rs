//! DeepSpeed configs (JSON; `deepspeed/runtime/config.py`). `"auto"` values are filled in by
//! the Trainer or accelerate from their own arguments: give that file too and they combine.
//! DeepSpeed keeps fp32 master weights and optimizer states beside bf16/fp16 weights and
//! gradients (`mixed-bf16`/`mixed-fp16`), and its fused Adam (`optim_impl=fused`).

use super::report::{positive, FileState, Out};
use super::tree::{self, boolean, count, int, text};
use serde_json::Value;

/// Reads a DeepSpeed config; `prefix` is where it sits in another file (`deepspeed.` in a
/// Trainer JSON that holds it inline), empty for a file of its own.
pub fn read(root: &Value, st: &mut FileState, prefix: &str, precision_before: Option<&str>) {
    for (key, v) in tree::leaves(root) {
        let out = if is_auto(v) { auto(&key, precision_before) } else { map(&key, v, root) };
        st.record(&format!("{prefix}{key}"), v, out);
    }
    if root.get("zero_optimization").is_none() {
        st.default("zero_optimization.stage", vec![("zero", "0".into())], "DeepSpeed's default stage is 0");
    }
    let explicit = ["bf16", "bfloat16", "fp16"].iter().any(|k| root.get(k).is_some());
    if !explicit {
        st.default("bf16.enabled", vec![("precision", "fp32".into())], "neither bf16 nor fp16 is enabled: DeepSpeed trains in fp32");
    }
}

fn is_auto(v: &Value) -> bool {
    v.as_str().is_some_and(|s| s.trim() == "auto")
}

/// An `"auto"` value: the Trainer's own argument decides; only precision needs the other file.
fn auto(key: &str, precision_before: Option<&str>) -> Out {
    match key {
        "bf16.enabled" | "bfloat16.enabled" => match precision_before {
            Some("bf16" | "amp-bf16" | "mixed-bf16") => Out::one("precision", "mixed-bf16").note("auto: the Trainer's bf16"),
            _ => Out::ignored("auto: the Trainer's --bf16 decides (give its arguments too)"),
        },
        "fp16.enabled" => match precision_before {
            Some("amp-fp16" | "fp16" | "mixed-fp16") => Out::one("precision", "mixed-fp16").note("auto: the Trainer's fp16"),
            _ => Out::ignored("auto: the Trainer's --fp16 decides (give its arguments too)"),
        },
        "train_micro_batch_size_per_gpu" => Out::ignored("auto: the Trainer's per_device_train_batch_size (give its arguments too)"),
        "gradient_accumulation_steps" => Out::ignored("auto: the Trainer's gradient_accumulation_steps"),
        _ => Out::ignored("auto: filled in from the Trainer's arguments; no memory of its own"),
    }
}

fn map(key: &str, v: &Value, root: &Value) -> Out {
    let top = key.split('.').next().unwrap_or("");
    match key {
        "train_micro_batch_size_per_gpu" => positive(v, "batch"),
        "gradient_accumulation_steps" => positive(v, "accum"),
        "train_batch_size" => {
            let micro = root.get("train_micro_batch_size_per_gpu").and_then(count);
            let accum = root.get("gradient_accumulation_steps").and_then(count).unwrap_or(1);
            match (count(v), micro) {
                (Some(t), Some(m)) if m > 0 && accum > 0 && t % (m * accum) == 0 && t > 0 => {
                    Out::one("gpus", t / (m * accum)).note("train_batch_size = micro-batch × accumulation × GPUs")
                }
                (Some(_), _) => Out::ignored("the global batch: with the micro-batch and accumulation it gives the GPU count"),
                (None, _) => Out::invalid("expected a positive whole number"),
            }
        }
        "bf16.enabled" | "bfloat16.enabled" => match boolean(v) {
            Some(true) => Out::one("precision", "mixed-bf16"),
            Some(false) => Out::ignored("bf16 off"),
            None => Out::invalid("expected true, false or auto"),
        },
        "fp16.enabled" => match boolean(v) {
            Some(true) => Out::one("precision", "mixed-fp16"),
            Some(false) => Out::ignored("fp16 off"),
            None => Out::invalid("expected true, false or auto"),
        },
        "zero_optimization.stage" => match int(v) {
            Some(s @ 0..=3) => Out::one("zero", s),
            _ => Out::invalid("expected 0, 1, 2 or 3"),
        },
        "zero_optimization.offload_optimizer.device" => match text(v).as_deref() {
            Some("cpu") if params_offloaded(root) => Out::one("offload", "optimizer+params"),
            Some("cpu") => Out::one("offload", "optimizer"),
            Some("none") => Out::ignored("no offload"),
            Some("nvme") => Out::one("offload", "optimizer").approx("offloaded to NVMe: the estimate counts host memory instead"),
            _ => Out::invalid("expected cpu, nvme or none"),
        },
        "zero_optimization.offload_param.device" => match text(v).as_deref() {
            Some("cpu") => Out::one("offload", "optimizer+params"),
            Some("none") => Out::ignored("no offload"),
            Some("nvme") => Out::one("offload", "optimizer+params").approx("offloaded to NVMe: the estimate counts host memory instead"),
            _ => Out::invalid("expected cpu, nvme or none"),
        },
        "zero_optimization.offload_optimizer.pin_memory" | "zero_optimization.offload_param.pin_memory" => {
            Out::ignored("pinned host memory: no GPU memory")
        }
        "zero_optimization.stage3_max_live_parameters"
        | "zero_optimization.stage3_prefetch_bucket_size"
        | "zero_optimization.stage3_param_persistence_threshold"
        | "zero_optimization.stage3_max_reuse_distance"
        | "zero_optimization.reduce_bucket_size"
        | "zero_optimization.allgather_bucket_size"
        | "zero_optimization.sub_group_size"
        | "zero_optimization.contiguous_gradients"
        | "zero_optimization.model_persistence_threshold" => {
            Out::unmodelled("buffer sizes: the estimate holds prefetch_layers whole layers gathered and no separate buckets")
        }
        "zero_optimization.overlap_comm"
        | "zero_optimization.reduce_scatter"
        | "zero_optimization.allgather_partitions"
        | "zero_optimization.round_robin_gradients" => Out::ignored("how communication runs, not what is stored"),
        "zero_optimization.stage3_gather_16bit_weights_on_model_save" | "zero_optimization.gather_16bit_weights_on_model_save" => {
            Out::ignored("saving: outside the training step")
        }
        "optimizer.type" => match text(v).map(|s| s.to_ascii_lowercase()).as_deref() {
            Some("adam" | "adamw" | "fusedadam" | "cpuadam") => Out::set(vec![("optim", "adamw".into()), ("optim_impl", "fused".into())]),
            Some("lion") => Out::one("optim", "lion"),
            Some("sgd") => Out::one("optim", "momentum"),
            _ => Out::unmodelled("an optimizer trainmem does not know: the estimate keeps optim as set"),
        },
        "activation_checkpointing.partition_activations"
        | "activation_checkpointing.cpu_checkpointing"
        | "activation_checkpointing.contiguous_memory_optimization" => match boolean(v) {
            Some(true) => Out::unmodelled("DeepSpeed's activation checkpointing options (for Megatron-DeepSpeed): not modelled"),
            _ => Out::ignored("off"),
        },
        _ => match top {
            "optimizer" | "scheduler" => Out::ignored("hyperparameter or schedule: no memory"),
            "fp16" | "bf16" | "bfloat16" => Out::ignored("loss scaling: no stored state of size"),
            "gradient_clipping"
            | "steps_per_print"
            | "wall_clock_breakdown"
            | "prescale_gradients"
            | "gradient_predivide_factor"
            | "tensorboard"
            | "wandb"
            | "csv_monitor"
            | "comms_logger"
            | "flops_profiler"
            | "dump_state"
            | "zero_allow_untested_optimizer"
            | "memory_breakdown"
            | "communication_data_type"
            | "seed"
            | "checkpoint" => Out::ignored("logging, clipping or bookkeeping: no GPU memory"),
            "activation_checkpointing" => Out::ignored("used by Megatron-DeepSpeed only"),
            "zero_optimization" | "compile" | "data_efficiency" | "sparse_attention" | "pipeline" => {
                Out::unmodelled("a DeepSpeed feature trainmem does not model")
            }
            _ => Out::unknown(),
        },
    }
}

fn params_offloaded(root: &Value) -> bool {
    tree::get(root, "zero_optimization.offload_param.device").and_then(text).as_deref() == Some("cpu")
}
