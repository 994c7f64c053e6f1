//! torchtune recipe configs (YAML; torchtune 0.6): `model._component_` builds the model,
//! `batch_size`, `dtype`, `optimizer`, `loss`, `enable_activation_checkpointing` … set the
//! run. Which recipe runs the config (`tune run full_finetune_single_device` or
//! `full_finetune_distributed`) is not in the file: keys only the distributed recipes read
//! (`custom_sharded_layers`, `fsdp_*`, `tensor_parallel_*`, `data_parallel_*`) mark it as
//! distributed, which shards with FSDP2 over every GPU (on torchtune's own code where that is
//! measured: without a 4-bit base; compiled, a full fine-tune or a Llama LoRA).

use super::models::{self, Tuning};
use super::report::{dropout, on_off, positive, FileState, Out};
use super::tree::{self, boolean, count, text};
use serde_json::Value;

/// Keys only the distributed recipes read.
const DISTRIBUTED: &[&str] = &[
    "custom_sharded_layers",
    "fsdp_cpu_offload",
    "fsdp_reshard_after_forward",
    "tensor_parallel_dim",
    "tensor_parallel_plan",
    "data_parallel_shard_dim",
    "data_parallel_replicate_dim",
];

/// Model sizes torchtune ships only with its distributed recipes (torchtune 0.6.1
/// `recipes/configs/llama3_1/70B_*.yaml`, `405B_*.yaml`, `llama3_3/70B_*.yaml`,
/// `qwen2_5/72B_*.yaml`: `tune run --nproc_per_node 8 …_distributed`), whose configs need not
/// carry a key only the distributed recipes read (`70B_lora.yaml` has none).
const DISTRIBUTED_SIZES: &[&str] = &["_70b", "_72b", "_405b"];

pub fn read(root: &Value, st: &mut FileState) {
    let builder = tree::get(root, "model._component_").and_then(text).unwrap_or_default();
    let distributed = DISTRIBUTED.iter().any(|k| root.get(k).is_some()) || DISTRIBUTED_SIZES.iter().any(|s| builder.ends_with(s));
    let mut lora_bits: Option<(Vec<&str>, bool)> = None;
    for (key, v) in tree::leaves(root) {
        let out = map(&key, v, root, distributed, &mut lora_bits);
        st.record(&key, v, out);
    }
    if let Some((attn, mlp)) = lora_bits {
        let mut parts: Vec<&str> = attn;
        if mlp {
            parts.extend(["gate", "up", "down"]);
        }
        if !parts.is_empty() {
            st.pairs.push(("lora_targets", parts.join(",")));
        }
    }
    if distributed && !st.has("zero") {
        st.default(
            "(recipe)",
            vec![("zero", "full_shard".into())],
            "keys only the distributed recipes read: FSDP2 shards every parameter over all GPUs",
        );
    }
    for (key, pairs, note) in [
        ("dtype", vec![("precision", "bf16".to_string())], "the recipes' default dtype is bf16"),
        ("gradient_accumulation_steps", vec![("accum", "1".into())], "the recipes' default"),
        ("enable_activation_checkpointing", vec![("recompute", "none".into())], "the recipes' default is off"),
    ] {
        if root.get(key).is_none() {
            st.default(key, pairs, note);
        }
    }
    if root.get("model").is_some() && !st.has("attn") {
        let mut code = vec![("attn", "sdpa".into())];
        let mut why = "torchtune's attention calls F.scaled_dot_product_attention (flex attention when packed)".to_string();
        // The distributed recipes run torchtune's own code under its FSDP2 (measured: full,
        // LoRA and Llama 3.1's QLoRA, eager and compiled, tests/fixtures/pytorch/fsdp/tune.json),
        // as the single-device ones do.
        if let Some(family) = own_code(&builder).filter(|_| own_base(root, &builder)) {
            code.push(("framework", "torchtune".into()));
            why.push_str(&format!("; the step follows torchtune's own {family} code (framework=torchtune)"));
        }
        st.default("(model code)", code, &why);
    }
}

/// The builders (`torchtune.models.<family>.<builder>`) whose torchtune model code the estimator
/// follows (`framework = torchtune`, `step/families/torchtune.rs`): full fine-tuning builders of
/// the families listed, by the module they live in, and the LoRA builders of Llama 3.1 / 3.2 and
/// Qwen2 / Qwen2.5 (`lora_llama3_1_8b`, `lora_qwen2_5_7b` …: torchtune's `LoRALinear`, measured
/// in tests/fixtures/pytorch/frameworks/torchtune-{llama3,qwen2}-lora.json) and QLoRA builders of
/// Llama 3.1 / 3.2 ([`QLORA_FAMILIES`]). Others (the other families' LoRA and QLoRA builders,
/// which build a RoPE module per layer) are estimated with transformers' modeling code.
fn own_code(component: &str) -> Option<&'static str> {
    const FAMILIES: &[(&str, &str)] = &[
        ("llama2", "Llama 2"),
        ("llama3", "Llama 3"),
        ("llama3_1", "Llama 3.1"),
        ("llama3_2", "Llama 3.2"),
        ("mistral", "Mistral"),
        ("qwen2", "Qwen2"),
        ("qwen2_5", "Qwen2.5"),
        ("phi3", "Phi-3"),
        ("gemma", "Gemma"),
        ("gemma2", "Gemma 2"),
    ];
    let mut parts = component.trim().rsplit('.');
    let builder = parts.next()?;
    let module = parts.next()?;
    if (builder.starts_with("qlora_") && !QLORA_FAMILIES.contains(&module))
        || (builder.starts_with("lora_") && !LORA_FAMILIES.contains(&module))
    {
        return None;
    }
    FAMILIES.iter().find(|(m, _)| *m == module).map(|(_, name)| *name)
}

/// The model modules whose LoRA builders run on torchtune's own code in the estimate.
const LORA_FAMILIES: &[&str] = &["llama3_1", "llama3_2", "qwen2", "qwen2_5"];

/// The model modules whose QLoRA builders (`qlora_llama3_1_8b`, `qlora_llama3_2_3b` …, or a
/// LoRA builder with `quantize_base: True`: `LoRALinear` / `FrozenNF4Linear` on torchao's
/// `NF4Tensor`) run on torchtune's own code in the estimate: measured eager in
/// tests/fixtures/pytorch/frameworks/torchtune-llama3-qlora.json.
const QLORA_FAMILIES: &[&str] = &["llama3_1", "llama3_2"];

/// Whether `component` is a builder of [`QLORA_FAMILIES`].
fn own_qlora(component: &str) -> bool {
    let mut parts = component.trim().rsplit('.');
    parts.next();
    parts.next().is_some_and(|m| QLORA_FAMILIES.contains(&m))
}

/// Whether the builder is a QLoRA one (`qlora_…`).
fn is_qlora(component: &str) -> bool {
    component.trim().rsplit('.').next().unwrap_or_default().starts_with("qlora_")
}

/// Whether the builder is a full fine-tuning one (not `lora_…` / `qlora_…`).
fn full_builder(component: &str) -> bool {
    let builder = component.trim().rsplit('.').next().unwrap_or_default();
    !builder.starts_with("lora_") && !builder.starts_with("qlora_")
}

fn map(key: &str, v: &Value, root: &Value, distributed: bool, lora: &mut Option<(Vec<&'static str>, bool)>) -> Out {
    let top = key.split('.').next().unwrap_or("");
    match key {
        "model._component_" => {
            let Some(c) = text(v) else { return Out::invalid("expected a builder's dotted name") };
            match models::torchtune_builder(&c) {
                Some((id, tuning)) => {
                    let quantize = tree::get(root, "model.quantize_base").and_then(boolean) == Some(true);
                    let ft = match tuning {
                        Tuning::Qlora => "qlora",
                        Tuning::Lora if quantize => "qlora",
                        Tuning::Lora => "lora",
                        Tuning::Full => "full",
                    };
                    // torchtune 0.6 `modules/peft/lora.py LoRALinear`: the adapters are built with
                    // the model and run in its dtype (no fp32 copy of the input, unlike peft's).
                    let mut keys = vec![("model", id.into()), ("finetune", ft.into())];
                    if tuning != Tuning::Full {
                        keys.push(("lora_dtype", "model".into()));
                    }
                    // torchtune's QLoRA base is torchao's `NF4Tensor` (`LoRALinear(quantize_base=True)`
                    // calls `to_nf4`), not bitsandbytes.
                    if ft == "qlora" {
                        keys.push(("qlora_quant", "torchao-nf4".into()));
                    }
                    Out::set(keys)
                }
                None => Out::unmodelled("no trainmem preset for this builder: choose the model yourself"),
            }
        }
        "model.lora_rank" => {
            count(v).filter(|n| *n > 0).map_or_else(|| Out::invalid("expected a positive whole number"), |n| Out::one("lora_rank", n))
        }
        "model.lora_attn_modules" => {
            let Some(list) = v.as_array() else { return Out::invalid("expected a list of q_proj, k_proj, v_proj, output_proj") };
            let mut parts = Vec::new();
            for m in list {
                match m.as_str().map(str::trim) {
                    Some("q_proj") => parts.push("q"),
                    Some("k_proj") => parts.push("k"),
                    Some("v_proj") => parts.push("v"),
                    Some("output_proj") => parts.push("o"),
                    _ => return Out::invalid(format!("unknown module {} (q_proj, k_proj, v_proj, output_proj)", tree::show(m))),
                }
            }
            let entry = lora.get_or_insert((Vec::new(), false));
            entry.0 = parts.clone();
            Out::ignored("").note(format!("lora_targets gets {}", parts.join(","))).status_understood()
        }
        "model.apply_lora_to_mlp" => match boolean(v) {
            Some(b) => {
                lora.get_or_insert((Vec::new(), false)).1 = b;
                Out::ignored("").note(if b { "lora_targets gets gate,up,down" } else { "no adapters on the MLP" }).status_understood()
            }
            None => Out::invalid("expected true or false"),
        },
        "model.apply_lora_to_output" => match boolean(v) {
            Some(true) => Out::unmodelled("an adapter on the output projection: not counted"),
            Some(false) => Out::ignored("no adapter on the output projection"),
            None => Out::invalid("expected true or false"),
        },
        "model.quantize_base" => Out::ignored("read with model._component_ (QLoRA when true)"),
        "model.lora_alpha" => Out::ignored("a scale: no memory"),
        "model.lora_dropout" => dropout(v),
        "model.use_dora" => on_off(v, "DoRA's magnitude vectors and their activations are not modelled", "plain LoRA"),
        "batch_size" => positive(v, "batch"),
        "gradient_accumulation_steps" => positive(v, "accum"),
        "dtype" => match text(v).as_deref() {
            Some("bf16") => Out::one("precision", "bf16"),
            Some("fp32") => Out::one("precision", "fp32"),
            Some(other) => Out::invalid(format!("torchtune trains in bf16 or fp32, not {other}")),
            None => Out::invalid("expected bf16 or fp32"),
        },
        "optimizer._component_" => optimizer(v, root),
        "optimizer.fused" => match boolean(v) {
            Some(true) => Out::one("optim_impl", "fused"),
            Some(false) => Out::ignored("read with optimizer._component_"),
            None => Out::invalid("expected true or false"),
        },
        "optimizer.foreach" => Out::ignored("read with optimizer._component_"),
        "optimizer_in_bwd" => match boolean(v) {
            Some(b) => {
                Out::one("optim_in_bwd", b).note(if b { "each parameter steps and frees its gradient in its gradient hook" } else { "" })
            }
            None => Out::invalid("expected true or false"),
        },
        "loss._component_" => match text(v).as_deref().map(|s| s.rsplit('.').next().unwrap_or("")) {
            Some("CEWithChunkedOutputLoss") | Some("LinearCrossEntropyLoss") => Out::one("loss", "chunked"),
            Some("CrossEntropyLoss") => Out::one("loss", "standard"),
            _ => Out::unmodelled("a loss trainmem does not know: the estimate keeps loss as set"),
        },
        "enable_activation_checkpointing" => match boolean(v) {
            Some(true) => Out::one("recompute", "full").note("torchtune checkpoints every transformer layer"),
            Some(false) => Out::one("recompute", "none"),
            None => Out::invalid("expected true or false"),
        },
        "enable_activation_offloading" => match boolean(v) {
            Some(true) => Out::one("act_offload", "torchtune")
                .note("OffloadActivations: saved tensors of 1 KiB or more to pinned host memory, the output head on the device"),
            Some(false) => Out::one("act_offload", "none"),
            None => Out::invalid("expected true or false"),
        },
        "activation_offloading_use_streams" => Out::ignored(
            "streams change when copies happen, not what the step keeps at its peak (the estimate follows torchtune's default, streams on)",
        ),
        "compile" => match boolean(v) {
            // Measured on torchtune's own Llama (frameworks/torchtune-llama3-compile.json): each
            // layer compiled, then checkpointed, the chunked loss's per-chunk CE compiled.
            Some(true) if own_llama(root) || (distributed && own_lora_llama(root)) => Out::set(vec![("compile", "true".into()), ("compile_regions", "layer".into())])
                .note(
                    "torchtune compiles each decoder layer, checkpoints it, and compiles the loss (training.compile_model, compile_loss)",
                ),
            Some(true) if tree::get(root, "enable_activation_checkpointing").and_then(boolean) == Some(true) => Out::unmodelled(
                "torch.compile of checkpointed layers off torchtune's own single-device Llama full fine-tune: torchtune checkpoints each compiled layer from outside, transformers' modeling code (which the estimate follows here) inside its compiled region, and the two save different tensors: estimated eager",
            ),
            Some(true) => Out::set(vec![("compile", "true".into()), ("compile_regions", "layer".into())])
                .note("torchtune compiles each decoder layer and the loss (training.compile_model, compile_loss)"),
            Some(false) => Out::one("compile", "false"),
            None => Out::invalid("expected true or false"),
        },
        "tokenizer.max_seq_len" => match v {
            Value::Null => Out::unmodelled("null: each batch is as long as its longest sample; the estimate keeps seq as set"),
            _ => positive(v, "seq"),
        },
        "dataset.packed" => Out::ignored("packing fills each sequence to tokenizer.max_seq_len; memory follows seq"),
        "custom_sharded_layers" => Out::ignored("wraps the embedding and output as FSDP units of their own").note(if distributed {
            "marks the distributed recipe"
        } else {
            ""
        }),
        "fsdp_cpu_offload" => match boolean(v) {
            Some(true) => Out::one("offload", "optimizer+params"),
            Some(false) => Out::one("offload", "none"),
            None => Out::invalid("expected true or false"),
        },
        "fsdp_reshard_after_forward" => match boolean(v) {
            Some(true) => Out::one("zero", "full_shard"),
            Some(false) => Out::one("zero", "shard_grad_op"),
            None => Out::invalid("expected true or false"),
        },
        "tensor_parallel_dim" => positive(v, "tp"),
        "data_parallel_shard_dim" | "data_parallel_replicate_dim" | "tensor_parallel_plan._component_" => {
            Out::ignored("the data-parallel layout follows gpus, zero and tp")
        }
        "device" => Out::ignored("where the run happens"),
        "clip_grad_norm" => Out::ignored("clipping computes a norm: no stored state"),
        "log_peak_memory_stats"
        | "log_every_n_steps"
        | "output_dir"
        | "seed"
        | "shuffle"
        | "epochs"
        | "max_steps_per_epoch"
        | "resume_from_checkpoint"
        | "save_adapter_weights_only"
        | "low_cpu_ram"
        | "run_val_every_n_steps"
        | "log_level" => Out::ignored("bookkeeping: no GPU memory"),
        _ => match top {
            "optimizer" => Out::ignored("hyperparameter: no memory"),
            "lr_scheduler" => Out::ignored("schedule: no memory"),
            "tokenizer" | "dataset" | "checkpointer" | "metric_logger" | "profiler" | "collate_fn" | "dataset_val" => {
                Out::ignored("data, checkpoints, logging or profiling: no GPU memory in the step")
            }
            "model" => Out::unknown(),
            _ => Out::unknown(),
        },
    }
}

/// Whether the step follows torchtune's own Llama code (a full fine-tune of one of its Llama
/// builders, on one device or distributed: `framework = torchtune`), where its compile is
/// measured (its LoRA compiled is estimated in bf16 on one device as its records cover it, set by
/// hand: the import estimates a LoRA config eager).
fn own_llama(root: &Value) -> bool {
    let builder = tree::get(root, "model._component_").and_then(text).unwrap_or_default();
    full_builder(&builder) && own_code(&builder).is_some_and(|f| f.starts_with("Llama"))
}

/// Whether the step follows torchtune's own Llama LoRA or QLoRA code, where the distributed
/// recipe's compile is measured (tests/fixtures/pytorch/fsdp/tune.json: LoRA on a bf16 base,
/// QLoRA on torchao's NF4 base).
fn own_lora_llama(root: &Value) -> bool {
    let builder = tree::get(root, "model._component_").and_then(text).unwrap_or_default();
    // Not a full builder: a `lora_…` builder, or a `qlora_…` one of the families measured.
    !full_builder(&builder) && own_base(root, &builder) && own_code(&builder).is_some_and(|f| f.starts_with("Llama"))
}

/// Whether the step can follow torchtune's own code for the config's base: a 16-bit one, or a
/// 4-bit one — a LoRA builder with `quantize_base: True` is QLoRA, as a `qlora_…` builder is —
/// of [`QLORA_FAMILIES`] (measured); the other families' 4-bit bases run on transformers' code.
fn own_base(root: &Value, builder: &str) -> bool {
    let quantized = tree::get(root, "model.quantize_base").and_then(boolean) == Some(true) || is_qlora(builder);
    !quantized || own_qlora(builder)
}

fn optimizer(v: &Value, root: &Value) -> Out {
    let Some(c) = text(v) else { return Out::invalid("expected an optimizer's dotted name") };
    let fused = tree::get(root, "optimizer.fused").and_then(boolean) == Some(true);
    let foreach = tree::get(root, "optimizer.foreach").and_then(boolean);
    let torch_impl = if fused {
        "fused"
    } else if foreach == Some(false) {
        "forloop"
    } else {
        "foreach"
    };
    match c.as_str() {
        "torch.optim.AdamW" | "torch.optim.Adam" => Out::set(vec![("optim", "adamw".into()), ("optim_impl", torch_impl.into())]),
        "torch.optim.SGD" => {
            let momentum = tree::get(root, "optimizer.momentum").and_then(tree::float).unwrap_or(0.0) > 0.0;
            Out::set(vec![("optim", if momentum { "momentum" } else { "sgd" }.into()), ("optim_impl", torch_impl.into())])
        }
        "bitsandbytes.optim.PagedAdamW8bit" => Out::set(vec![("optim", "adam8bit".into()), ("optim_paged", "true".into())]),
        "bitsandbytes.optim.AdamW8bit" | "bitsandbytes.optim.Adam8bit" | "torchao.optim.AdamW8bit" => Out::one("optim", "adam8bit"),
        "bitsandbytes.optim.PagedAdamW" | "bitsandbytes.optim.PagedAdamW32bit" => {
            Out::set(vec![("optim", "adamw".into()), ("optim_paged", "true".into())])
        }
        "bitsandbytes.optim.AdamW" => Out::one("optim", "adamw"),
        "torchao.optim.AdamW4bit" => Out::one("optim", "adam8bit").approx("4-bit Adam states: estimated as 8-bit (an upper bound)"),
        "torchao.optim.CPUOffloadOptimizer" => {
            Out::one("offload", "optimizer").approx("torchao's CPU-offloaded optimizer: estimated as ZeRO-Offload of the optimizer")
        }
        _ => Out::unmodelled("an optimizer trainmem does not know: the estimate keeps optim as set"),
    }
}
