//! `export`: a configuration as the file a framework runs, with only the keys memory depends
//! on, each commented with the trainmem key it comes from. Everything else (paths, data,
//! schedule, logging) is left to the user. Importing the file gives the configuration back
//! (for what the format can say; what it cannot is said in a comment).

use super::models;
use crate::config::{Config, Finetune, LoraTargets, Offload, OptimImpl, Optimizer, Precision, Recompute, Zero};
use crate::estimator::names::Named;

/// The formats `export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    /// A torchtune YAML override (torchtune 0.6).
    Torchtune,
    /// A torchtitan job config (TOML, torchtitan 0.2).
    Torchtitan,
    /// An accelerate config and the DeepSpeed config it names.
    AccelerateDeepspeed,
    /// Megatron-LM arguments (a bash array and the torchrun line).
    Megatron,
}

impl ExportFormat {
    pub const ALL: [ExportFormat; 4] =
        [ExportFormat::Torchtune, ExportFormat::Torchtitan, ExportFormat::AccelerateDeepspeed, ExportFormat::Megatron];

    pub fn name(self) -> &'static str {
        match self {
            ExportFormat::Torchtune => "torchtune",
            ExportFormat::Torchtitan => "torchtitan",
            ExportFormat::AccelerateDeepspeed => "accelerate-deepspeed",
            ExportFormat::Megatron => "megatron",
        }
    }

    pub fn parse(s: &str) -> Option<ExportFormat> {
        ExportFormat::ALL.into_iter().find(|f| f.name() == s.trim().to_ascii_lowercase())
    }
}

/// One written file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportFile {
    pub name: String,
    pub text: String,
}

/// The files of `format` for `cfg` (two for accelerate + DeepSpeed, one otherwise).
pub fn export_files(cfg: &Config, format: ExportFormat) -> Vec<ExportFile> {
    match format {
        ExportFormat::Torchtune => vec![ExportFile { name: "trainmem_torchtune.yaml".into(), text: torchtune(cfg) }],
        ExportFormat::Torchtitan => vec![ExportFile { name: "trainmem_torchtitan.toml".into(), text: torchtitan(cfg) }],
        ExportFormat::AccelerateDeepspeed => {
            vec![
                ExportFile { name: "accelerate_config.yaml".into(), text: accelerate(cfg) },
                ExportFile { name: "ds_config.json".into(), text: ds_config(cfg) },
            ]
        }
        ExportFormat::Megatron => vec![ExportFile { name: "trainmem_megatron.sh".into(), text: megatron(cfg) }],
    }
}

/// The file of `format` for `cfg`; a pair of files is written one after the other, each
/// under a `==> name <==` line.
pub fn export(cfg: &Config, format: ExportFormat) -> String {
    let files = export_files(cfg, format);
    if files.len() == 1 {
        return files.into_iter().next().map(|f| f.text).unwrap_or_default();
    }
    files.iter().map(|f| format!("==> {} <==\n{}", f.name, f.text)).collect::<Vec<_>>().join("\n")
}

fn header(cfg: &Config, what: &str) -> String {
    format!(
        "# Written by trainmem for {} ({what}): only the keys GPU memory depends on, each with the\n# trainmem key it comes from. Paths, data, schedule and logging are yours to add.\n# trainmem: ?{}\n",
        cfg.display_name(),
        crate::config::encode_query(cfg)
    )
}

fn lora_lists(t: LoraTargets) -> (Vec<&'static str>, bool) {
    let mut attn = Vec::new();
    for (bit, name) in [(LoraTargets::Q, "q_proj"), (LoraTargets::K, "k_proj"), (LoraTargets::V, "v_proj"), (LoraTargets::O, "output_proj")]
    {
        if t.has(bit) {
            attn.push(name);
        }
    }
    (attn, t.has(LoraTargets::GATE) || t.has(LoraTargets::UP) || t.has(LoraTargets::DOWN))
}

fn torchtune(cfg: &Config) -> String {
    let mut s = header(cfg, "torchtune 0.6, merge into your recipe config");
    let lora = cfg.finetune != Finetune::Full;
    match models::torchtune_export(&cfg.model) {
        Some(component) => {
            let component = if lora {
                let (module, builder) = component.rsplit_once('.').unwrap_or(("", &component));
                format!("{module}.lora_{builder}")
            } else {
                component
            };
            s += &format!("model:\n  _component_: {component}  # model={}, finetune={}\n", cfg.model, fin(cfg.finetune));
        }
        None => s += &format!("model:\n  # model={}: torchtune has no builder for it; name yours here\n", cfg.model),
    }
    if lora {
        let (attn, mlp) = lora_lists(cfg.lora_targets);
        s += &format!("  lora_attn_modules: [{}]  # lora_targets\n", attn.iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join(", "));
        s += &format!("  apply_lora_to_mlp: {}  # lora_targets gate,up,down\n", if mlp { "True" } else { "False" });
        s += "  apply_lora_to_output: False  # no adapter on the LM head\n";
        s += &format!("  lora_rank: {}  # lora_rank\n", cfg.lora_rank);
        s += &format!("  lora_dropout: {}  # lora_dropout\n", cfg.lora_dropout);
        if cfg.lora_dtype != crate::config::LoraDtype::Model {
            s += "  # lora_dtype=fp32 (peft's fp32 adapters): torchtune's LoRALinear runs its adapters in the model's dtype (lora_dtype=model)\n";
        }
        if cfg.finetune == Finetune::Qlora {
            s += "  quantize_base: True  # finetune=qlora: NF4 base\n";
        }
    }
    s += &format!("tokenizer:\n  max_seq_len: {}  # seq: pack (dataset.packed: True) or truncate to it\n", cfg.seq);
    s += &format!("batch_size: {}  # batch, per GPU\n", cfg.batch);
    s += &format!("gradient_accumulation_steps: {}  # accum\n", cfg.accum);
    let dtype = match cfg.precision {
        Precision::Fp32 => "fp32".to_string(),
        Precision::Bf16 => "bf16".to_string(),
        other => format!("bf16  # precision={}: torchtune trains in bf16 or fp32 only", other_name(other)),
    };
    s += &format!("dtype: {dtype}{}\n", if dtype.contains('#') { "" } else { "  # precision" });
    let (component, extra) = match cfg.optim {
        Optimizer::Adam8bit if cfg.optim_paged => ("bitsandbytes.optim.PagedAdamW8bit  # optim_paged=true".to_string(), String::new()),
        Optimizer::Adam8bit => ("bitsandbytes.optim.AdamW8bit".to_string(), String::new()),
        Optimizer::Adamw if cfg.optim_paged => ("bitsandbytes.optim.PagedAdamW  # optim_paged=true".to_string(), String::new()),
        Optimizer::Sgd => ("torch.optim.SGD".to_string(), String::new()),
        Optimizer::Momentum => ("torch.optim.SGD".to_string(), "  momentum: 0.9\n".to_string()),
        Optimizer::Adamw => ("torch.optim.AdamW".to_string(), String::new()),
        other => (format!("torch.optim.AdamW  # optim={other:?}: no torchtune equivalent"), String::new()),
    };
    s += &format!("optimizer:\n  _component_: {component}  # optim\n{extra}");
    match cfg.optim_impl {
        OptimImpl::Fused if matches!(cfg.optim, Optimizer::Adamw | Optimizer::Sgd | Optimizer::Momentum) => {
            s += "  fused: True  # optim_impl=fused\n"
        }
        OptimImpl::Forloop => s += "  foreach: False  # optim_impl=forloop\n",
        _ => {}
    }
    let loss = if cfg.loss == crate::config::Loss::Chunked {
        "torchtune.modules.loss.CEWithChunkedOutputLoss"
    } else {
        "torch.nn.CrossEntropyLoss"
    };
    s += &format!("loss:\n  _component_: {loss}  # loss\n");
    s += &format!(
        "enable_activation_checkpointing: {}  # recompute={}{}\n",
        if cfg.recompute == Recompute::None { "False" } else { "True" },
        cfg.recompute.name(),
        if cfg.recompute == Recompute::Selective { " (torchtune checkpoints whole layers)" } else { "" }
    );
    if cfg.recompute_every > 0 {
        s += &every_nth_comment(cfg, "torchtune checkpoints every layer or none (enable_activation_checkpointing)");
    }
    s += &block_comment(cfg, "torchtune checkpoints every layer or none");
    if cfg.optim_in_bwd {
        s += "optimizer_in_bwd: True  # optim_in_bwd\n";
    }
    if cfg.act_offload.on() {
        s += &format!(
            "enable_activation_offloading: True  # act_offload={}{}\n",
            crate::config::get(cfg, "act_offload").unwrap_or_default(),
            if cfg.act_offload == crate::config::ActOffload::SaveOnCpu {
                " (torchtune offloads with its own OffloadActivations)"
            } else {
                ""
            }
        );
    }
    if cfg.compile {
        s += &format!(
            "compile: True  # compile=true{}\n",
            if cfg.compile_regions == crate::config::CompileRegions::Layer { "" } else { " (torchtune compiles each layer and the loss)" }
        );
    }
    if cfg.gpus > 1 {
        s += &format!(
            "# gpus={}: run the distributed recipe, e.g. tune run --nproc_per_node {} full_finetune_distributed\n",
            cfg.gpus,
            cfg.gpus.min(cfg.gpus_per_node)
        );
        s += &format!(
            "fsdp_reshard_after_forward: {}  # zero={}\n",
            if cfg.zero == Zero::ShardGradOp { "False" } else { "True" },
            cfg.zero.name()
        );
        s += &format!(
            "fsdp_cpu_offload: {}  # offload={}\n",
            if cfg.offload == Offload::None { "False" } else { "True" },
            cfg.offload.name()
        );
        if cfg.tp > 1 {
            s += &format!("tensor_parallel_dim: {}  # tp\n", cfg.tp);
        }
    }
    s
}

fn torchtitan(cfg: &Config) -> String {
    let mut s = header(cfg, "a torchtitan 0.2 job config (TOML); add [job], [training] dataset, [checkpoint], …");
    // The allocator's settings are the launcher's (run_train.sh), which the file cannot carry.
    let launcher = super::torchtitan::LAUNCHER_ALLOC_CONF;
    if cfg.alloc_conf == launcher {
        s += &format!("# alloc_conf={launcher}: as run_train.sh launches (PYTORCH_ALLOC_CONF)\n");
    } else {
        s += &format!(
            "# alloc_conf={}: run_train.sh sets PYTORCH_ALLOC_CONF=\"{launcher}\"; launch with PYTORCH_ALLOC_CONF=\"{}\" for this estimate\n",
            if cfg.alloc_conf.is_empty() { "(none)" } else { &cfg.alloc_conf },
            cfg.alloc_conf
        );
    }
    match models::TORCHTITAN.iter().find(|(_, _, id)| *id == cfg.model) {
        Some((name, flavor, _)) => s += &format!("\n[model]\nname = \"{name}\"  # model={}\nflavor = \"{flavor}\"\n", cfg.model),
        None => s += &format!("\n[model]\n# model={}: torchtitan has no flavor for it; name yours here\n", cfg.model),
    }
    let mp = cfg.tp * cfg.pp * cfg.cp;
    let dp = (cfg.gpus / mp.max(1)).max(1);
    s += "\n[training]\n";
    if cfg.pp > 1 {
        // torchtitan runs the local batch as local ÷ pipeline_parallel_microbatch_size
        // micro-batches: one schedule step of `accum` micro-batches per optimizer step.
        s += &format!("local_batch_size = {}  # batch × accum ({}): the pipeline's micro-batches\n", cfg.batch * cfg.accum, cfg.accum);
        s += &format!("seq_len = {}  # seq\n", cfg.seq);
        s += &format!("global_batch_size = {}  # local batch × data-parallel size ({dp})\n", cfg.batch * dp * cfg.accum);
    } else {
        s += &format!("local_batch_size = {}  # batch\n", cfg.batch);
        s += &format!("seq_len = {}  # seq\n", cfg.seq);
        s += &format!("global_batch_size = {}  # batch × data-parallel size ({dp}) × accum ({})\n", cfg.batch * dp * cfg.accum, cfg.accum);
    }
    let mp_param = match cfg.precision {
        Precision::Fp32 => "\"float32\"  # precision=fp32".to_string(),
        Precision::MixedBf16 => "\"bfloat16\"  # precision=mixed-bf16: bf16 compute over fp32 shards".to_string(),
        other => format!("\"bfloat16\"  # precision={}: torchtitan's FSDP2 keeps fp32 shards and gathers bf16", other_name(other)),
    };
    s += &format!("mixed_precision_param = {mp_param}\n");
    if cfg.offload != Offload::None {
        s += &format!("enable_cpu_offload = true  # offload={}\n", cfg.offload.name());
    }
    s += "\n[optimizer]\n";
    s += &format!(
        "name = \"AdamW\"  # optim{}\n",
        if cfg.optim == Optimizer::Adamw { String::new() } else { format!("={:?}: torchtitan ships AdamW", cfg.optim) }
    );
    let imp = match cfg.optim_impl {
        OptimImpl::Fused => "fused",
        OptimImpl::Foreach => "foreach",
        OptimImpl::Forloop => "for-loop",
    };
    s += &format!("implementation = \"{imp}\"  # optim_impl\n");
    if cfg.optim_in_bwd {
        s += "early_step_in_backward = true  # optim_in_bwd\n";
    }
    s += "\n[parallelism]\n";
    let (replicate, shard, note) = match cfg.zero {
        Zero::Ddp => (dp, 1, "zero=0: replicated (DDP)".to_string()),
        Zero::HybridShard => (
            dp / cfg.shard_group.clamp(1, dp),
            cfg.shard_group.clamp(1, dp),
            "zero=hybrid_shard: FSDP2 inside groups of shard_group".to_string(),
        ),
        z => (1, dp, format!("zero={}: FSDP2 over the data-parallel GPUs", z.name())),
    };
    s += &format!("data_parallel_replicate_degree = {replicate}\ndata_parallel_shard_degree = {shard}  # {note}\n");
    if cfg.zero == Zero::ShardGradOp {
        s += "fsdp_reshard_after_forward = \"never\"  # zero=shard_grad_op\n";
    }
    s += &format!("tensor_parallel_degree = {}  # tp (torchtitan's TP always shards the sequence: sp)\n", cfg.tp);
    s += &format!("pipeline_parallel_degree = {}  # pp\n", cfg.pp);
    if cfg.pp > 1 {
        s += &format!("pipeline_parallel_microbatch_size = {}  # batch\n", cfg.batch);
        match cfg.vpp {
            1 => s += "pipeline_parallel_schedule = \"1F1B\"  # vpp=1\n",
            2 => s += "pipeline_parallel_schedule = \"Interleaved1F1B\"  # vpp=2: torchtitan's two stages per rank\n",
            v => s += &format!(
                "pipeline_parallel_schedule = \"Interleaved1F1B\"  # vpp={v}: set pipeline_parallel_layers_per_stage for {v} stages per rank (torchtitan's default is 2)\n"
            ),
        }
    }
    s += &format!("context_parallel_degree = {}  # cp\n", cfg.cp);
    if cfg.ep > 1 {
        s += &format!("expert_parallel_degree = {}  # ep\n", cfg.ep);
    }
    s += "\n[activation_checkpoint]\n";
    s += &match cfg.recompute {
        Recompute::None if cfg.recompute_every > 1 => format!(
            "mode = \"selective\"\nselective_ac_option = \"{}\"  # recompute_every={}{}\n",
            cfg.recompute_every,
            cfg.recompute_every,
            if cfg.recompute_every_first { " (torchtitan checkpoints blocks N-1, 2N-1, …, not 0, N, …)" } else { "" }
        ),
        Recompute::None => "mode = \"none\"  # recompute=none\n".to_string(),
        Recompute::Full => "mode = \"full\"  # recompute=full\n".to_string(),
        Recompute::Op => "mode = \"selective\"\nselective_ac_option = \"op\"  # recompute=op\n".to_string(),
        Recompute::Selective => {
            "mode = \"none\"  # recompute=selective (Megatron's) has no torchtitan equivalent: op-level SAC is mode = \"selective\"\n"
                .to_string()
        }
    };
    s += &block_comment(cfg, "torchtitan's full mode checkpoints every block");
    if cfg.compile {
        let (components, note) = match cfg.compile_regions {
            crate::config::CompileRegions::Layer => {
                ("[\"model\", \"loss\"]", "compile=true, compile_regions=layer: each block and the loss")
            }
            crate::config::CompileRegions::Block => ("[\"model\"]", "compile=true, compile_regions=block"),
            crate::config::CompileRegions::Model => {
                ("[\"model\", \"loss\"]", "compile=true, compile_regions=model: torchtitan compiles per block")
            }
        };
        s += &format!("\n[compile]\nenable = true  # {note}\ncomponents = {components}\n");
    }
    match cfg.fp8 {
        crate::config::Fp8::TorchaoTensorwise | crate::config::Fp8::TorchaoRowwise => {
            let rowwise = cfg.fp8 == crate::config::Fp8::TorchaoRowwise;
            // The converters list belongs to [model], written first: a TOML table cannot be
            // reopened, so it is named by its dotted key here.
            s = s.replacen("\n[training]\n", "converters = [\"quantize.linear.float8\"]  # fp8 (torchao Float8Linear)\n\n[training]\n", 1);
            s += "\n[quantize.linear.float8]\n";
            if rowwise {
                s += "recipe_name = \"rowwise\"  # fp8=torchao-rowwise\n";
            } else {
                s += &format!(
                    "enable_fsdp_float8_all_gather = {}  # fp8_allgather\nprecompute_float8_dynamic_scale_for_fsdp = {}\n",
                    cfg.fp8_allgather, cfg.fp8_allgather
                );
            }
            s += "filter_fqns = [\"output\"]  # the output projection stays in bf16, as trainmem assumes\n";
        }
        crate::config::Fp8::None => {}
        _ => {
            s += &format!(
                "# fp8={}: Transformer Engine recipes have no torchtitan converter\n",
                crate::config::get(cfg, "fp8").unwrap_or_default()
            )
        }
    }
    s
}

fn accelerate(cfg: &Config) -> String {
    let mut s = header(cfg, "an accelerate config naming the DeepSpeed file beside it");
    s += "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n";
    s += &format!("num_processes: {}  # gpus\n", cfg.gpus);
    let nodes = cfg.gpus.div_ceil(cfg.gpus_per_node.max(1)).max(1);
    s += &format!("num_machines: {nodes}\n");
    s += "deepspeed_config:\n  deepspeed_config_file: ds_config.json  # batch, accum, precision, zero, offload\n";
    if cfg.compile {
        if cfg.compile_regions == crate::config::CompileRegions::Model {
            s += "dynamo_config:\n  dynamo_backend: INDUCTOR  # compile=true, compile_regions=model: accelerate compiles the whole model\n";
        } else {
            s += &format!(
                "# compile=true, compile_regions={}: accelerate compiles the whole model (dynamo_backend: INDUCTOR) or each block with the loss eager (dynamo_use_regional_compilation); compile the layers and the loss in the script instead\n",
                crate::config::get(cfg, "compile_regions").unwrap_or_default()
            );
        }
    }
    s += &format!(
        "# In the training script: model.gradient_checkpointing_enable() when recompute={} is not none;\n# attention {:?}, loss {:?} as the script chooses them.\n",
        cfg.recompute.name(),
        cfg.attn,
        cfg.loss
    );
    if cfg.recompute_every > 0 {
        s += &every_nth_comment(
            cfg,
            "transformers checkpoints every layer or none: wrap every Nth decoder layer in torch.utils.checkpoint in the script",
        );
    }
    s +=
        &block_comment(cfg, "transformers checkpoints every layer or none: wrap only those layers in torch.utils.checkpoint in the script");
    s
}

/// The comment an export writes for `recompute_layers` (Megatron's block method) where its
/// format cannot say it; nothing without it.
fn block_comment(cfg: &Config, how: &str) -> String {
    if cfg.recompute_layers == 0 {
        return String::new();
    }
    format!(
        "# recompute_layers={}: only the first {} layers of each pipeline stage fully recomputed (Megatron's block method); {how}\n",
        cfg.recompute_layers, cfg.recompute_layers
    )
}

/// The comment an export writes for `recompute_every`, which its format cannot say.
fn every_nth_comment(cfg: &Config, how: &str) -> String {
    format!("# recompute_every={}: one decoder layer in every {} fully checkpointed; {how}\n", cfg.recompute_every, cfg.recompute_every)
}

fn ds_config(cfg: &Config) -> String {
    let stage = cfg.zero.stage();
    let mut zero = serde_json::json!({ "stage": stage });
    if cfg.offload != Offload::None {
        zero["offload_optimizer"] = serde_json::json!({ "device": "cpu", "pin_memory": true });
    }
    if cfg.offload == Offload::OptimizerParams {
        zero["offload_param"] = serde_json::json!({ "device": "cpu", "pin_memory": true });
    }
    let mut doc = serde_json::json!({
        "train_micro_batch_size_per_gpu": cfg.batch,
        "gradient_accumulation_steps": cfg.accum,
        "zero_optimization": zero,
    });
    match cfg.precision {
        Precision::MixedFp16 | Precision::AmpFp16 | Precision::Fp16 => doc["fp16"] = serde_json::json!({ "enabled": true }),
        Precision::Fp32 => {}
        _ => doc["bf16"] = serde_json::json!({ "enabled": true }),
    }
    if cfg.optim == Optimizer::Adamw {
        doc["optimizer"] = serde_json::json!({ "type": "AdamW", "params": { "lr": "auto", "weight_decay": "auto" } });
    }
    serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
}

fn megatron(cfg: &Config) -> String {
    let mut s = header(cfg, "Megatron-LM core_v0.19 arguments: add data, tokenizer, schedule and checkpoint flags");
    s += "MEMORY_ARGS=(\n";
    let a = &cfg.arch;
    s += &format!("    --num-layers {}  # model={}: its shapes\n", a.layers, cfg.model);
    s += &format!("    --hidden-size {}\n    --ffn-hidden-size {}\n    --num-attention-heads {}\n", a.hidden, a.ffn, a.heads);
    if a.kv_heads != a.heads {
        s += &format!("    --group-query-attention\n    --num-query-groups {}\n", a.kv_heads);
    }
    s += &format!("    --kv-channels {}\n    --vocab-size {}\n", a.head_dim, a.vocab);
    s += "    --swiglu\n    --normalization RMSNorm\n    --position-embedding-type rope\n    --disable-bias-linear\n";
    if !a.tied {
        s += "    --untie-embeddings-and-output-weights\n";
    }
    s += &format!("    --seq-length {}  # seq\n    --max-position-embeddings {}\n", cfg.seq, cfg.seq.max(a.max_pos.min(1 << 20)));
    s += &format!("    --micro-batch-size {}  # batch\n", cfg.batch);
    let dp = (cfg.gpus / (cfg.tp * cfg.pp * cfg.cp).max(1)).max(1);
    s += &format!("    --global-batch-size {}  # batch × data-parallel size ({dp}) × accum ({})\n", cfg.batch * dp * cfg.accum, cfg.accum);
    s += &format!(
        "    --tensor-model-parallel-size {}  # tp\n    --pipeline-model-parallel-size {}  # pp\n    --context-parallel-size {}  # cp\n",
        cfg.tp, cfg.pp, cfg.cp
    );
    if cfg.vpp > 1 {
        s += &format!("    --virtual-pipeline-model-parallel-size {}  # vpp\n", cfg.vpp);
    }
    if cfg.ep > 1 {
        s += &format!("    --expert-model-parallel-size {}  # ep\n", cfg.ep);
    }
    if cfg.sp {
        s += "    --sequence-parallel  # sp\n";
    }
    s += &match cfg.precision {
        Precision::MixedBf16Fp32grad => "    --bf16  # precision=mixed-bf16-fp32grad\n".to_string(),
        Precision::MixedBf16 => "    --bf16  # precision=mixed-bf16\n    --grad-reduce-in-bf16\n".to_string(),
        Precision::MixedFp8 => "    --bf16  # precision=mixed-fp8\n    --fp8-format hybrid\n".to_string(),
        Precision::MixedFp16 | Precision::AmpFp16 | Precision::Fp16 => "    --fp16  # precision\n".to_string(),
        Precision::Fp32 => "    # precision=fp32: no --bf16/--fp16\n".to_string(),
        other => format!("    --bf16  # precision={}: Megatron's nearest\n", other_name(other)),
    };
    match cfg.zero {
        Zero::Ddp => s += "    # zero=0: no --use-distributed-optimizer\n",
        Zero::Z1 => s += "    --use-distributed-optimizer  # zero=1\n",
        z => s += &format!("    --use-torch-fsdp2  # zero={}\n", z.name()),
    }
    if cfg.offload != Offload::None {
        s += &format!("    --optimizer-cpu-offload  # offload={}\n", cfg.offload.name());
    }
    match cfg.recompute {
        Recompute::None => s += "    # recompute=none\n",
        Recompute::Selective => s += "    --recompute-granularity selective  # recompute\n",
        Recompute::Full if cfg.recompute_layers > 0 => {
            s += &format!(
                "    --recompute-granularity full  # recompute\n    --recompute-method block\n    --recompute-num-layers {}  # recompute_layers\n",
                cfg.recompute_layers
            )
        }
        Recompute::Full => {
            s += "    --recompute-granularity full  # recompute\n    --recompute-method uniform\n    --recompute-num-layers 1\n"
        }
        Recompute::Op => s += "    # recompute=op: torchtitan's op-level SAC has no Megatron equivalent\n",
    }
    if cfg.recompute_every > 0 {
        s += &format!(
            "    {}",
            every_nth_comment(
                cfg,
                &format!(
                    "Megatron's nearest is --recompute-granularity full --recompute-method block --recompute-num-layers {} (as many layers of each stage, the first ones)",
                    cfg.arch.layers / cfg.pp.max(1) / cfg.recompute_every.max(1)
                )
            )
        );
    }
    if cfg.act_offload_layers > 0 {
        s += &format!("    --cpu-offloading-num-layers {}  # act_offload_layers (sets --cpu-offloading)\n", cfg.act_offload_layers);
    }
    s += &match cfg.optim {
        Optimizer::Adamw => "    --optimizer adam  # optim=adamw\n".to_string(),
        Optimizer::Momentum | Optimizer::Sgd => "    --optimizer sgd  # optim\n".to_string(),
        other => format!("    # optim={other:?}: no Megatron equivalent\n"),
    };
    if cfg.finetune != Finetune::Full {
        s += "    # finetune: Megatron-LM has no LoRA; use Megatron-Bridge's PEFT\n";
    }
    s += ")\n";
    let per_node = cfg.gpus.min(cfg.gpus_per_node.max(1));
    let nodes = cfg.gpus.div_ceil(per_node.max(1)).max(1);
    s += &format!("torchrun --nproc_per_node {per_node} --nnodes {nodes} pretrain_gpt.py \"${{MEMORY_ARGS[@]}}\"  # gpus={}\n", cfg.gpus);
    s
}

fn fin(f: Finetune) -> &'static str {
    match f {
        Finetune::Full => "full",
        Finetune::Lora => "lora",
        Finetune::Qlora => "qlora",
    }
}

fn other_name(p: Precision) -> String {
    crate::config::get(&Config { precision: p, ..Config::default() }, "precision").unwrap_or_default()
}
