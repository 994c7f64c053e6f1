//! The Hugging Face side: the Trainer's `TrainingArguments` (JSON), PEFT's
//! `adapter_config.json`, axolotl's YAML (which drives the Trainer) and litgpt's finetune YAML.
//!
//! Precision: transformers 5 loads a checkpoint in its own dtype (`dtype="auto"`: bf16 for
//! every preset), and the Trainer keeps the dtype the model was loaded in, so `bf16: true`
//! runs bf16 weights and optimizer states under autocast (`precision=bf16`); `fp16: true` needs
//! fp32 weights for its GradScaler (`amp-fp16`). Under DeepSpeed or FSDP the DeepSpeed or
//! accelerate file decides instead (it is read after this one).

use super::accelerate;
use super::models;
use super::report::{dropout, on_off, positive, FileState, Out};
use super::tree::{self, boolean, count, text};
use serde_json::Value;

/// The Trainer's `optim` names (and axolotl's `optimizer`) → trainmem's optimizer.
pub fn hf_optim(name: &str) -> Out {
    let n = name.trim().to_ascii_lowercase();
    match n.as_str() {
        "adamw_torch_fused" => Out::set(vec![("optim", "adamw".into()), ("optim_impl", "fused".into())]),
        "adamw_torch" | "adamw_hf" | "adamw_apex_fused" | "adamw_torch_xla" | "adamw_torch_npu_fused" => {
            Out::set(vec![("optim", "adamw".into()), ("optim_impl", "foreach".into())])
        }
        "paged_adamw_8bit" => Out::set(vec![("optim", "adam8bit".into()), ("optim_paged", "true".into())])
            .note("bitsandbytes' PagedAdamW8bit: states in unified memory"),
        "adamw_bnb_8bit" | "adamw_8bit" | "adamw_torch_8bit" | "adam8bit" | "bnb_8bit" | "ademamix_8bit" => Out::one("optim", "adam8bit"),
        "paged_adamw_32bit" | "paged_adamw" => Out::set(vec![("optim", "adamw".into()), ("optim_paged", "true".into())])
            .note("bitsandbytes' PagedAdamW: 32-bit states in unified memory"),
        "adamw_bnb" | "adamw_32bit" => Out::one("optim", "adamw").note("32-bit states"),
        "adafactor" => Out::one("optim", "adafactor"),
        "sgd" => Out::one("optim", "sgd"),
        "lion_32bit" | "paged_lion_32bit" => Out::one("optim", "lion"),
        "adamw_torch_4bit" => Out::one("optim", "adam8bit").approx("4-bit states: estimated as 8-bit (an upper bound)"),
        "lion_8bit" | "paged_lion_8bit" => Out::one("optim", "lion").approx("8-bit Lion: estimated with 32-bit states (an upper bound)"),
        _ => Out::unmodelled(format!("the optimizer {n} is not modelled: the estimate keeps optim as set")),
    }
}

/// `bf16`/`fp16` of the Trainer (and axolotl's `bf16: auto`).
fn half(key: &str, v: &Value, other_on: bool) -> Out {
    let on = match (boolean(v), text(v).as_deref()) {
        (Some(b), _) => b,
        (None, Some("auto")) => true,
        _ => return Out::invalid("expected true, false or auto"),
    };
    match (key, on) {
        (_, false) if other_on => Out::ignored("off"),
        ("bf16", true) => Out::one("precision", "bf16").note("bf16 weights (the checkpoint's dtype) under autocast; states in bf16"),
        ("fp16", true) => Out::one("precision", "amp-fp16"),
        _ => Out::ignored("off"),
    }
}

pub fn read_trainer(root: &Value, st: &mut FileState) {
    let bf16 = root.get("bf16").and_then(boolean) == Some(true);
    let fp16 = root.get("fp16").and_then(boolean) == Some(true);
    let ds_inline = root.get("deepspeed").filter(|v| v.is_object());
    for (key, v) in tree::leaves(root) {
        if key.starts_with("deepspeed.") && ds_inline.is_some() {
            continue;
        }
        let out = match key.as_str() {
            "bf16" => half("bf16", v, fp16),
            "fp16" => half("fp16", v, bf16),
            "per_device_train_batch_size" | "train_batch_size" => positive(v, "batch"),
            "gradient_accumulation_steps" => positive(v, "accum"),
            "gradient_checkpointing" => checkpointing(v),
            "activation_checkpointing" => match boolean(v) {
                Some(true) => Out::one("recompute", "full").note("checkpointing applied by the distributed backend (FSDP)"),
                _ => Out::ignored("off (gradient_checkpointing decides)"),
            },
            "activation_checkpointing_kwargs" | "fsdp_config" if v.is_null() => Out::ignored("none"),
            "activation_checkpointing_kwargs" => Out::ignored("reentrant or not: the same tensors are kept"),
            "use_cache" => Out::ignored("the generation KV cache is not used while training"),
            "optim" => text(v).map_or_else(|| Out::invalid("expected an optimizer name"), |s| hf_optim(&s)),
            "deepspeed" if v.is_null() => Out::ignored("no DeepSpeed"),
            "deepspeed" => Out::ignored("give that DeepSpeed file to the import too: its keys are read there"),
            "fsdp" => fsdp_string(v),
            "torch_compile" => trainer_compile(v),
            "use_liger_kernel" => match boolean(v) {
                Some(true) => Out::one("loss", "chunked").approx("Liger's fused linear cross-entropy is modelled (loss=chunked); its RMSNorm, SwiGLU and RoPE kernels save differently and are not"),
                _ => Out::ignored("off"),
            },
            "half_precision_backend" | "tf32" | "bf16_full_eval" | "fp16_full_eval" | "fp16_opt_level" | "fp16_backend" => {
                Out::ignored("evaluation or backend choice: same stored bytes")
            }
            "gradient_checkpointing_kwargs" | "gradient_checkpointing_kwargs.use_reentrant" => Out::ignored("reentrant or not: the same tensors are kept"),
            k if k.starts_with("fsdp_config.") => accelerate::fsdp(k.trim_start_matches("fsdp_config.").trim_start_matches("fsdp_"), v, root.get("fsdp_config")),
            k => trainer_ignored(k),
        };
        st.record(&key, v, out);
    }
    if root.get("gradient_checkpointing").is_none() {
        st.default("gradient_checkpointing", vec![("recompute", "none".into())], "the Trainer's default is off");
    }
    if !bf16 && !fp16 && root.get("bf16").is_some() {
        st.default(
            "(dtype)",
            vec![("precision", "bf16".into())],
            "neither bf16 nor fp16: the Trainer keeps the loaded dtype, bf16 for a bf16 checkpoint under transformers 5 (dtype=\"auto\")",
        );
    }
    if let Some(ds) = ds_inline {
        let before = st.pairs.iter().rev().find(|(k, _)| *k == "precision").map(|(_, v)| v.clone());
        super::deepspeed::read(ds, st, "deepspeed.", before.as_deref());
    }
}

/// `torch_compile`: the Trainer compiles the whole model (`model = torch.compile(model)` in
/// `_wrap_model`, its graph breaks included) — `compile_regions = model`.
fn trainer_compile(v: &Value) -> Out {
    match boolean(v) {
        Some(true) => Out::set(vec![("compile", "true".into()), ("compile_regions", "model".into())]),
        Some(false) => Out::one("compile", "false"),
        None if v.is_null() => Out::ignored("eager PyTorch"),
        None => Out::invalid("expected true or false"),
    }
}

fn checkpointing(v: &Value) -> Out {
    match (boolean(v), text(v).as_deref()) {
        (Some(true), _) => Out::one("recompute", "full").note("every decoder layer keeps only its input"),
        (Some(false), _) => Out::one("recompute", "none"),
        (None, Some("offload")) => {
            Out::one("recompute", "full").approx("checkpointed layer inputs offloaded to the CPU: estimated on the GPU")
        }
        _ => Out::invalid("expected true or false"),
    }
}

/// The Trainer's `fsdp` string (`"full_shard auto_wrap offload"`) or list.
fn fsdp_string(v: &Value) -> Out {
    let words: Vec<String> = match v {
        Value::String(s) => s.split_whitespace().map(str::to_ascii_lowercase).collect(),
        Value::Array(a) => a.iter().filter_map(text).map(|s| s.to_ascii_lowercase()).collect(),
        Value::Bool(false) | Value::Null => return Out::ignored("no FSDP"),
        _ => return Out::invalid("expected FSDP options such as \"full_shard auto_wrap\""),
    };
    let mut pairs = Vec::new();
    for w in &words {
        match w.as_str() {
            "full_shard" => pairs.push(("zero", "full_shard".to_string())),
            "shard_grad_op" => pairs.push(("zero", "shard_grad_op".to_string())),
            "hybrid_shard" | "hybrid_shard_zero2" => pairs.push(("zero", "hybrid_shard".to_string())),
            "no_shard" => pairs.push(("zero", "0".to_string())),
            "offload" => pairs.push(("offload", "optimizer+params".to_string())),
            "auto_wrap" => {}
            other => return Out::invalid(format!("unknown FSDP option {other}")),
        }
    }
    if pairs.is_empty() {
        Out::ignored("no FSDP")
    } else {
        Out::set(pairs)
    }
}

fn trainer_ignored(key: &str) -> Out {
    let leaf = key.split('.').next().unwrap_or(key);
    const BOOKKEEPING: &[&str] = &[
        "output_dir",
        "overwrite_output_dir",
        "do_train",
        "do_eval",
        "do_predict",
        "logging_dir",
        "logging_strategy",
        "logging_first_step",
        "logging_steps",
        "logging_nan_inf_filter",
        "save_strategy",
        "save_steps",
        "save_total_limit",
        "save_safetensors",
        "save_on_each_node",
        "save_only_model",
        "seed",
        "data_seed",
        "report_to",
        "run_name",
        "push_to_hub",
        "hub_model_id",
        "hub_strategy",
        "hub_token",
        "hub_private_repo",
        "hub_always_push",
        "resume_from_checkpoint",
        "disable_tqdm",
        "remove_unused_columns",
        "label_names",
        "load_best_model_at_end",
        "metric_for_best_model",
        "greater_is_better",
        "ignore_data_skip",
        "local_rank",
        "log_level",
        "log_level_replica",
        "log_on_each_node",
        "prediction_loss_only",
        "dataloader_drop_last",
        "dataloader_num_workers",
        "dataloader_pin_memory",
        "dataloader_persistent_workers",
        "dataloader_prefetch_factor",
        "past_index",
        "jit_mode_eval",
        "use_cpu",
        "use_ipex",
        "restore_callback_states_from_checkpoint",
        "include_inputs_for_metrics",
        "include_for_metrics",
        "eval_do_concat_batches",
        "full_determinism",
        "ray_scope",
        "ddp_timeout",
        "ddp_backend",
        "ddp_find_unused_parameters",
        "ddp_bucket_cap_mb",
        "ddp_broadcast_buffers",
        "skip_memory_metrics",
        "use_legacy_prediction_loop",
        "torchdynamo",
        "accelerator_config",
        "dispatch_batches",
        "split_batches",
        "include_tokens_per_second",
        "include_num_input_tokens_seen",
        "batch_eval_metrics",
        "eval_on_start",
        "use_liger",
        "eval_use_gather_object",
        "average_tokens_across_devices",
        "tpu_num_cores",
        "tpu_metrics_debug",
        "debug",
        "mp_parameters",
        "group_by_length",
        "length_column_name",
        "auto_find_batch_size",
        "torch_empty_cache_steps",
        "optim_target_modules",
        "use_mps_device",
        "hub_revision",
        "liger_kernel_config",
        "project",
        "trackio_space_id",
        "parallelism_config",
        "enable_jit_checkpoint",
        "torch_compile_backend",
        "torch_compile_mode",
        "_n_gpu",
        "trackio_bucket_id",
        "trackio_static_space_id",
        "train_sampling_strategy",
        "dataloader_in_order",
        "dataloader_multiprocessing_context",
        "ddp_static_graph",
        "n_gpu",
        "local_process_index",
        "process_index",
        "world_size",
        "no_cuda",
        "evaluation_strategy",
    ];
    const HYPER: &[&str] = &[
        "learning_rate",
        "weight_decay",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "max_grad_norm",
        "num_train_epochs",
        "max_steps",
        "lr_scheduler_type",
        "lr_scheduler_kwargs",
        "warmup_ratio",
        "warmup_steps",
        "label_smoothing_factor",
        "neftune_noise_alpha",
        "optim_args",
        "adafactor",
        "embedding_learning_rate",
    ];
    if HYPER.contains(&leaf) {
        Out::ignored("hyperparameter or schedule: no memory")
    } else if BOOKKEEPING.contains(&leaf) {
        Out::ignored("logging, saving, data loading or launching: no GPU memory in the step")
    } else if leaf.starts_with("eval")
        || leaf.starts_with("per_device_eval")
        || leaf.starts_with("eval_")
        || leaf == "per_gpu_eval_batch_size"
    {
        Out::ignored("evaluation runs without gradients: the training step's peak decides")
    } else {
        Out::unknown()
    }
}

/// PEFT's `adapter_config.json` (`LoraConfig.to_dict()`).
pub fn read_peft(root: &Value, st: &mut FileState) {
    for (key, v) in tree::leaves(root) {
        let out = match key.as_str() {
            "peft_type" => match text(v).map(|s| s.to_ascii_uppercase()).as_deref() {
                Some("LORA") => Out::one("finetune", "lora"),
                _ => Out::unmodelled("an adapter type other than LoRA: not modelled"),
            },
            "r" => {
                count(v).filter(|n| *n > 0).map_or_else(|| Out::invalid("expected a positive whole number"), |n| Out::one("lora_rank", n))
            }
            "target_modules" => match v {
                Value::Null => Out::one("lora_targets", "q,v").note("null: PEFT's default for Llama-style models, q_proj and v_proj"),
                _ => targets(v),
            },
            "base_model_name_or_path" => match text(v).and_then(|s| models::by_repo(&s)) {
                Some((id, note)) => Out::one("model", id).note(note.unwrap_or("")),
                None if v.is_null() => Out::ignored("no base model named"),
                None => Out::unmodelled("no trainmem preset for this checkpoint: choose the model yourself (or import its config.json)"),
            },
            "lora_dropout" => dropout(v),
            "use_dora" => on_off(v, "DoRA's magnitude vectors and their activations are not modelled", "plain LoRA"),
            "modules_to_save" | "layers_to_transform" | "rank_pattern" | "alpha_pattern" | "trainable_token_indices" => match v {
                Value::Null => Out::ignored("none"),
                Value::Array(a) if a.is_empty() => Out::ignored("none"),
                Value::Object(m) if m.is_empty() => Out::ignored("none"),
                _ => Out::unmodelled("fully trained modules, layer subsets or per-module ranks: not modelled"),
            },
            k if k.starts_with("rank_pattern.") || k.starts_with("alpha_pattern.") => {
                Out::unmodelled("per-module ranks: not modelled (every adapter gets r)")
            }
            _ => peft_other(&key),
        };
        st.record(&key, v, out);
    }
}

/// LoRA target modules as PEFT, axolotl and the Trainer name them.
pub fn targets(v: &Value) -> Out {
    let names: Vec<String> = match v {
        Value::String(s) if s.trim() == "all-linear" => return Out::one("lora_targets", "all"),
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a.iter().filter_map(text).collect(),
        _ => return Out::invalid("expected a list of module names or all-linear"),
    };
    let mut parts: Vec<&str> = Vec::new();
    for n in &names {
        let short = n.rsplit('.').next().unwrap_or(n);
        let p = match short {
            "q_proj" | "q" => "q",
            "k_proj" | "k" => "k",
            "v_proj" | "v" => "v",
            "o_proj" | "o" | "out_proj" => "o",
            "gate_proj" | "w1" => "gate",
            "up_proj" | "w3" => "up",
            "down_proj" | "w2" => "down",
            _ => {
                return Out::invalid(format!(
                    "{short} is not a linear trainmem adapts (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)"
                ))
            }
        };
        if !parts.contains(&p) {
            parts.push(p);
        }
    }
    if parts.is_empty() {
        return Out::invalid("names no module");
    }
    Out::one("lora_targets", parts.join(","))
}

/// PEFT's other fields: scales and initialisation (no memory), or unknown.
fn peft_other(key: &str) -> Out {
    const IGNORED: &[&str] = &[
        "lora_alpha",
        "bias",
        "task_type",
        "inference_mode",
        "init_lora_weights",
        "use_rslora",
        "fan_in_fan_out",
        "revision",
        "auto_mapping",
        "layers_pattern",
        "megatron_config",
        "megatron_core",
        "loftq_config",
        "eva_config",
        "corda_config",
        "use_qalora",
        "qalora_group_size",
        "layer_replication",
        "runtime_config",
        "lora_bias",
        "target_parameters",
        "exclude_modules",
        "peft_version",
        "alora_invocation_tokens",
        "arrow_config",
        "ensure_weight_tying",
    ];
    let top = key.split('.').next().unwrap_or(key);
    if IGNORED.contains(&top) || (top.ends_with("_config") && top == key) {
        Out::ignored("a scale, initialisation or bookkeeping: no memory")
    } else if top.starts_with("use_") && top == key {
        Out::ignored("a LoRA variant switched off")
    } else {
        Out::unknown()
    }
}

/// axolotl configs (YAML).
pub fn read_axolotl(root: &Value, st: &mut FileState) {
    let adapter = root.get("adapter").and_then(text).unwrap_or_default();
    let four_bit = root.get("load_in_4bit").and_then(boolean) == Some(true);
    for (key, v) in tree::leaves(root) {
        let out = match key.as_str() {
            "base_model" => base_model(v),
            "adapter" => match text(v).as_deref() {
                Some("qlora") => Out::one("finetune", "qlora"),
                Some("lora") if four_bit => Out::one("finetune", "qlora").note("with load_in_4bit"),
                Some("lora") => Out::one("finetune", "lora"),
                None if v.is_null() => Out::one("finetune", "full"),
                _ => Out::unmodelled("an adapter other than LoRA/QLoRA: not modelled"),
            },
            "load_in_4bit" => match boolean(v) {
                Some(true) if adapter.is_empty() => Out::unmodelled("a 4-bit base without adapters: not modelled"),
                Some(true) => Out::ignored("read with adapter (QLoRA)").status_understood(),
                _ => Out::ignored("off"),
            },
            "load_in_8bit" => on_off(v, "an 8-bit (LLM.int8) base: not modelled; estimated with a bf16 base", "off"),
            "lora_r" => {
                count(v).filter(|n| *n > 0).map_or_else(|| Out::invalid("expected a positive whole number"), |n| Out::one("lora_rank", n))
            }
            "lora_target_linear" => match boolean(v) {
                Some(true) => Out::one("lora_targets", "all"),
                Some(false) => Out::ignored("lora_target_modules decides"),
                None if v.is_null() => Out::ignored("lora_target_modules decides"),
                None => Out::invalid("expected true or false"),
            },
            "lora_target_modules" => targets(v),
            "lora_dropout" => dropout(v),
            "lora_modules_to_save" => match v {
                Value::Null => Out::ignored("none"),
                Value::Array(a) if a.is_empty() => Out::ignored("none"),
                _ => Out::unmodelled("fully trained embedding/head beside the adapters: not modelled"),
            },
            "sequence_len" => positive(v, "seq"),
            "micro_batch_size" => positive(v, "batch"),
            "gradient_accumulation_steps" => positive(v, "accum"),
            "bf16" | "bfloat16" => half("bf16", v, root.get("fp16").and_then(boolean) == Some(true)),
            "fp16" | "float16" => {
                half("fp16", v, root.get("bf16").is_some_and(|b| boolean(b) == Some(true) || text(b).as_deref() == Some("auto")))
            }
            "gradient_checkpointing" => checkpointing(v),
            "optimizer" => text(v).map_or_else(|| Out::invalid("expected an optimizer name"), |s| hf_optim(&s)),
            "flash_attention" => match boolean(v) {
                Some(true) => Out::one("attn", "flash"),
                _ => Out::ignored("off"),
            },
            "sdp_attention" => match boolean(v) {
                Some(true) => Out::one("attn", "sdpa"),
                _ => Out::ignored("off"),
            },
            "attn_implementation" => match text(v).as_deref() {
                Some("flash_attention_2" | "flash_attention_3") => Out::one("attn", "flash"),
                Some("sdpa") => Out::one("attn", "sdpa"),
                Some("eager") => Out::one("attn", "eager"),
                _ => Out::unmodelled("an attention kernel trainmem does not model; the estimate keeps attn as set"),
            },
            "liger_fused_linear_cross_entropy" | "cut_cross_entropy" => match boolean(v) {
                Some(true) => Out::one("loss", "chunked"),
                _ => Out::ignored("off"),
            },
            "liger_rms_norm" | "liger_glu_activation" | "liger_rope" | "liger_layer_norm" => {
                on_off(v, "a Liger kernel that saves different tensors: not modelled", "off")
            }
            "torch_compile" => trainer_compile(v),
            "deepspeed" => Out::ignored("give that DeepSpeed file to the import too: its keys are read there"),
            "fsdp" => fsdp_string(v),
            "fsdp_version" => accelerate::fsdp("version", v, None),
            "sample_packing" | "eval_sample_packing" | "pad_to_sequence_len" => {
                Out::ignored("packing or padding fills sequences to sequence_len; memory follows seq")
            }
            k if k.starts_with("fsdp_config.") => {
                accelerate::fsdp(k.trim_start_matches("fsdp_config.").trim_start_matches("fsdp_"), v, root.get("fsdp_config"))
            }
            k => axolotl_ignored(k),
        };
        st.record(&key, v, out);
    }
    if root.get("adapter").is_none() {
        st.default("adapter", vec![("finetune", "full".into())], "no adapter: full fine-tuning");
    }
    if root.get("gradient_checkpointing").is_none() {
        st.default("gradient_checkpointing", vec![("recompute", "none".into())], "axolotl's default is off");
    }
    if ["attn_implementation", "flash_attention", "sdp_attention"].iter().all(|k| root.get(k).is_none()) {
        st.default("attn_implementation", vec![("attn", "sdpa".into())], "transformers' default attention");
    }
}

fn base_model(v: &Value) -> Out {
    match text(v).and_then(|s| models::by_repo(&s)) {
        Some((id, note)) => Out::one("model", id).note(note.unwrap_or("")),
        None => Out::unmodelled("no trainmem preset for this checkpoint: choose the model yourself (or import its config.json)"),
    }
}

fn axolotl_ignored(key: &str) -> Out {
    let top = key.split('.').next().unwrap_or(key);
    const IGNORED: &[&str] = &[
        "base_model_config",
        "model_type",
        "tokenizer_type",
        "tokenizer_config",
        "trust_remote_code",
        "datasets",
        "test_datasets",
        "dataset_prepared_path",
        "val_set_size",
        "output_dir",
        "lora_model_dir",
        "lora_alpha",
        "lora_fan_in_fan_out",
        "wandb_project",
        "wandb_entity",
        "wandb_watch",
        "wandb_name",
        "wandb_log_model",
        "num_epochs",
        "max_steps",
        "lr_scheduler",
        "learning_rate",
        "tf32",
        "resume_from_checkpoint",
        "logging_steps",
        "warmup_ratio",
        "warmup_steps",
        "evals_per_epoch",
        "saves_per_epoch",
        "eval_steps",
        "save_steps",
        "weight_decay",
        "special_tokens",
        "tokens",
        "chat_template",
        "strict",
        "train_on_inputs",
        "group_by_length",
        "early_stopping_patience",
        "local_rank",
        "seed",
        "max_grad_norm",
        "hub_model_id",
        "dataset_processes",
        "shuffle_merged_datasets",
        "save_total_limit",
        "eval_max_new_tokens",
        "eval_table_size",
        "debug",
        "xformers_attention",
        "plugins",
        "gradient_checkpointing_kwargs",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "cosine_min_lr_ratio",
        "lr_quadratic_warmup",
        "loss_watchdog_threshold",
        "loss_watchdog_patience",
        "save_strategy",
        "eval_strategy",
        "special_tokens",
        "use_tensorboard",
        "dataloader_num_workers",
        "dataloader_pin_memory",
        "dataloader_prefetch_factor",
        "save_safetensors",
        "include_tokens_per_second",
        "auto_resume_from_checkpoints",
        "unfrozen_parameters",
        "rl",
        "chat_template_jinja",
    ];
    if IGNORED.contains(&top) {
        Out::ignored("data, logging, saving or a hyperparameter: no GPU memory in the step")
    } else {
        Out::unknown()
    }
}

/// litgpt `config_hub/finetune/*.yaml` (`litgpt finetune_lora|finetune_full --config …`).
pub fn read_litgpt(root: &Value, st: &mut FileState) {
    let devices = root.get("devices").and_then(count).unwrap_or(1).max(1) * root.get("num_nodes").and_then(count).unwrap_or(1).max(1);
    let lora = root.get("lora_r").is_some();
    let micro = tree::get(root, "train.micro_batch_size").and_then(count).unwrap_or(1).max(1);
    let mut targets: Vec<&str> = Vec::new();
    for (key, v) in tree::leaves(root) {
        let out = match key.as_str() {
            "checkpoint_dir" => base_model(v),
            "precision" => match text(v).as_deref() {
                Some("bf16-true") => Out::one("precision", "bf16"),
                Some("bf16-mixed") => Out::one("precision", "amp-bf16"),
                Some("16-true") => Out::one("precision", "fp16"),
                Some("16-mixed") => Out::one("precision", "amp-fp16"),
                Some("32-true" | "32") => Out::one("precision", "fp32"),
                _ => Out::invalid("expected bf16-true, bf16-mixed, 16-true, 16-mixed or 32-true"),
            },
            "quantize" => match text(v).as_deref() {
                // litgpt 0.5.13 `finetune/lora.py`: a bitsandbytes precision plugin makes the
                // optimizer `bnb.optim.PagedAdamW` (`utils.py` `instantiate_bnb_optimizer`, AdamW only).
                // Lightning's `BitsandbytesPrecision`: `nf4` quantizes without double quantization
                // (`_NF4Linear`: `compress_statistics=False`), `nf4-dq` with it; every
                // `nn.Linear` made under `init_module`, the LM head too, quantized from fp16
                // (`qlora_lightning`). `fit` keeps the last micro-batch's `logits` (and the
                // graph behind them) until the next forward returns (`holds_prev_logits`).
                Some(q @ ("bnb.nf4" | "bnb.nf4-dq")) if lora => Out::set(vec![
                    ("finetune", "qlora".into()),
                    ("qlora_double_quant", (q == "bnb.nf4-dq").to_string()),
                    ("optim", "adamw".into()),
                    ("optim_paged", "true".into()),
                    ("qlora_lightning", "true".into()),
                    ("holds_prev_logits", "true".into()),
                ])
                .note("the optimizer becomes bitsandbytes' PagedAdamW (instantiate_bnb_optimizer); the LM head is 4-bit too (Lightning's plugin)"),
                Some("bnb.fp4" | "bnb.fp4-dq") if lora => Out::set(vec![
                    ("finetune", "qlora".into()),
                    ("optim", "adamw".into()),
                    ("optim_paged", "true".into()),
                    ("qlora_lightning", "true".into()),
                    ("holds_prev_logits", "true".into()),
                ])
                .approx("FP4 base: estimated as NF4 (the same 4 bits per weight); the optimizer becomes bitsandbytes' PagedAdamW"),
                None if v.is_null() => Out::ignored("no quantization"),
                _ => Out::unmodelled("this quantized base is not modelled; estimated with a bf16 base"),
            },
            "devices" => match count(v) {
                Some(n) if n > 0 => {
                    Out::one("gpus", devices).note(if n > 1 { "more than one device: litgpt shards with FSDP" } else { "" })
                }
                _ => Out::unmodelled("devices other than a count (auto, a list): set gpus yourself"),
            },
            "num_nodes" => Out::ignored("read with devices (gpus = devices × num_nodes)").status_understood(),
            "lora_r" => {
                count(v).filter(|n| *n > 0).map_or_else(|| Out::invalid("expected a positive whole number"), |n| Out::one("lora_rank", n))
            }
            "lora_query" | "lora_key" | "lora_value" | "lora_projection" | "lora_mlp" => match boolean(v) {
                Some(b) => {
                    if b {
                        targets.extend(match key.as_str() {
                            "lora_query" => &["q"][..],
                            "lora_key" => &["k"][..],
                            "lora_value" => &["v"][..],
                            "lora_projection" => &["o"][..],
                            _ => &["gate", "up", "down"][..],
                        });
                    }
                    Out::ignored(if b { "an adapter here" } else { "no adapter here" }).status_understood()
                }
                None => Out::invalid("expected true or false"),
            },
            "lora_head" => on_off(v, "an adapter on the LM head: not counted", "no adapter on the head"),
            "lora_dropout" => dropout(v),
            "lora_alpha" => Out::ignored("a scale: no memory"),
            "train.micro_batch_size" => positive(v, "batch"),
            "train.global_batch_size" => match count(v) {
                Some(g) if g > 0 && g % (micro * devices) == 0 => {
                    Out::one("accum", g / (micro * devices)).note("global / (micro-batch × devices)")
                }
                Some(_) => Out::invalid("not a multiple of micro_batch_size × devices"),
                None => Out::invalid("expected a positive whole number"),
            },
            "train.max_seq_length" => match v {
                Value::Null => Out::unmodelled("null: each batch is as long as its longest sample; the estimate keeps seq as set"),
                _ => positive(v, "seq"),
            },
            "optimizer.class_path" | "optimizer" => match text(v).as_deref() {
                Some("torch.optim.AdamW" | "AdamW" | "torch.optim.Adam" | "Adam") => {
                    Out::set(vec![("optim", "adamw".into()), ("optim_impl", "foreach".into())])
                }
                Some("torch.optim.SGD" | "SGD") => Out::one("optim", "momentum"),
                _ => Out::unmodelled("an optimizer trainmem does not know: the estimate keeps optim as set"),
            },
            k if k.starts_with("optimizer.") => Out::ignored("hyperparameter: no memory"),
            k if k.starts_with("data") || k.starts_with("eval") || k.starts_with("train.") || k.starts_with("logger") => {
                Out::ignored("data, evaluation, logging or a schedule: no GPU memory in the step")
            }
            "out_dir" | "seed" | "resume" | "logger_name" | "access_token" | "initial_checkpoint_dir" => {
                Out::ignored("bookkeeping: no GPU memory")
            }
            _ => Out::unknown(),
        };
        st.record(&key, v, out);
    }
    if lora {
        if !st.has("finetune") {
            st.default("(script)", vec![("finetune", "lora".into())], "LoRA keys: `litgpt finetune_lora`");
        }
        let t = if targets.is_empty() { "q,v".to_string() } else { targets.join(",") };
        st.default("(lora_* flags)", vec![("lora_targets", t)], "the lora_query … lora_mlp flags together");
        st.default(
            "(LoRALinear)",
            vec![("lora_dtype", "model".into())],
            "litgpt's LoRALinear: adapters in the model's dtype, no fp32 copy of their input (lora.py)",
        );
    } else {
        st.default("(script)", vec![("finetune", "full".into())], "no LoRA keys: `litgpt finetune_full`");
    }
    let sharded = devices > 1;
    st.default(
        "(strategy)",
        vec![
            ("zero", if sharded { "full_shard" } else { "0" }.into()),
            ("recompute", if sharded && !lora { "full" } else { "none" }.into()),
        ],
        if sharded {
            "more than one device: FSDP (FULL_SHARD), checkpointing every block when fully fine-tuning"
        } else {
            "one device: no sharding, no checkpointing"
        },
    );
    // litgpt's own model code is modelled (framework=litgpt) for a full fine-tune on one device,
    // `finetune/full.py`'s loop; sharded or with adapters, transformers' code stands in.
    if !lora && !sharded {
        st.default(
            "(model code)",
            vec![("attn", "sdpa".into()), ("framework", "litgpt".into())],
            "litgpt's attention calls F.scaled_dot_product_attention; the step follows litgpt's own GPT and finetune/full.py's chunked loss (framework=litgpt)",
        );
    } else {
        st.default("(model code)", vec![("attn", "sdpa".into())], "litgpt's attention calls F.scaled_dot_product_attention");
    }
}
