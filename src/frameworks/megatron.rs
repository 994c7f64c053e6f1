//! Megatron: Megatron-LM's command-line arguments (`pretrain_gpt.py --tensor-model-parallel-size
//! …`, with `torchrun --nproc_per_node N --nnodes M` for the GPU count), Megatron-Bridge's
//! `ConfigContainer` as YAML (`model:`, `train:`, `ddp:`, `optimizer:`, `mixed_precision:`), and
//! NeMo 1.x's Megatron GPT YAML (`trainer:` and `model:`). All run Megatron Core
//! (`framework=megatron`): bf16 weights with fp32 main gradients and an fp32 optimizer
//! (`mixed-bf16-fp32grad`; `mixed-bf16` with bf16 gradient reduction), the distributed
//! optimizer as ZeRO-1, Transformer Engine's fused attention (`attn=flash`).

use super::models;
use super::report::{positive, FileState, Out};
use super::tree::{self, boolean, count, int, text, SyntaxError};
use serde_json::Value;

/// The model's shapes, as far as the file gives them.
#[derive(Default)]
struct Shapes {
    vocab: Option<u64>,
    hidden: Option<u64>,
    layers: Option<u64>,
    heads: Option<u64>,
    kv_heads: Option<u64>,
    ffn: Option<u64>,
}

impl Shapes {
    fn any(&self) -> bool {
        self.hidden.is_some() || self.layers.is_some()
    }
    /// The preset of these shapes (`None`: no preset has them, or some are missing).
    fn preset(&self) -> Option<&'static str> {
        let heads = self.heads?;
        models::by_shape(self.vocab?, self.hidden?, self.layers?, heads, self.kv_heads.unwrap_or(heads), self.ffn?)
    }
}

/// The global batch's accumulation steps: global / (micro-batch × data-parallel degree).
fn accum(global: u64, micro: u64, gpus: u64, model_parallel: u64) -> Option<u64> {
    let dp = (gpus / model_parallel.max(1)).max(1);
    let per = micro.max(1) * dp;
    (global > 0 && global.is_multiple_of(per)).then_some(global / per)
}

// ---------------------------------------------------------------------------------------------
// Megatron-LM's command line.

/// Flags that take no value.
const SWITCHES: &[&str] = &[
    "--sequence-parallel",
    "--use-distributed-optimizer",
    "--bf16",
    "--fp16",
    "--swiglu",
    "--group-query-attention",
    "--untie-embeddings-and-output-weights",
    "--disable-bias-linear",
    "--use-flash-attn",
    "--recompute-activations",
    "--cross-entropy-loss-fusion",
    "--fp8-param-gather",
    "--grad-reduce-in-bf16",
    "--use-mcore-models",
    "--apply-layernorm-1p",
    "--overlap-grad-reduce",
    "--overlap-param-gather",
    "--manual-gc",
    "--mock-data",
    "--log-throughput",
    "--profile",
    "--calculate-per-token-loss",
    "--no-create-attention-mask-in-dataloader",
    "--no-mmap-bin-files",
    "--use-torch-fsdp2",
    "--use-precision-aware-optimizer",
    "--optimizer-cpu-offload",
    "--use-cpu-initialization",
    "--no-masked-softmax-fusion",
    "--no-bias-gelu-fusion",
    "--no-bias-swiglu-fusion",
    "--no-gradient-accumulation-fusion",
    "--tp-comm-overlap",
    "--moe-grouped-gemm",
    "--use-megatron-fsdp",
    "--accumulate-allreduce-grads-in-fp32",
    "--no-rope-fusion",
    "--qk-layernorm",
    "--add-qkv-bias",
    "--fp8-wgrad",
    "--no-load-optim",
    "--no-load-rng",
    "--finetune",
    "--use-checkpoint-args",
    "--distributed-backend-nccl",
    "--log-params-norm",
    "--log-num-zeros-in-grad",
    "--no-async-tensor-model-parallel-allreduce",
    "--empty-unused-memory-level-0",
    "--no-check-for-nan-in-loss-and-grad",
    "--ckpt-fully-parallel-save",
    "--async-save",
    "--use-dist-ckpt",
];

pub fn read_args(text: &str, st: &mut FileState) -> Result<(), SyntaxError> {
    let words = tree::split_words(text)?;
    // (flag, value, line), flags normalised to dashes.
    let mut flags: Vec<(String, Option<String>, usize)> = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let (w, line) = (&words[i].0, words[i].1);
        i += 1;
        let Some(name) = w.strip_prefix("--") else { continue };
        let (name, inline) = match name.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (name, None),
        };
        let flag = format!("--{}", name.replace('_', "-"));
        let value = if inline.is_some() || SWITCHES.contains(&flag.as_str()) {
            inline
        } else if i < words.len() && !words[i].0.starts_with("--") {
            i += 1;
            Some(words[i - 1].0.clone())
        } else {
            None
        };
        flags.retain(|(f, _, _)| *f != flag);
        flags.push((flag, value, line));
    }
    let get = |f: &str| flags.iter().find(|(n, _, _)| n == f).and_then(|(_, v, _)| v.clone());
    let has = |f: &str| flags.iter().any(|(n, _, _)| n == f);
    let num = |f: &str| get(f).and_then(|v| v.parse::<u64>().ok());
    let tp = num("--tensor-model-parallel-size").unwrap_or(1);
    let pp = num("--pipeline-model-parallel-size").unwrap_or(1);
    let cp = num("--context-parallel-size").unwrap_or(1);
    let gpus = match (num("--nproc-per-node"), num("--nnodes")) {
        (Some(n), m) => n * m.unwrap_or(1),
        _ => tp * pp * cp,
    };
    let shapes = Shapes {
        vocab: num("--vocab-size"),
        hidden: num("--hidden-size"),
        layers: num("--num-layers"),
        heads: num("--num-attention-heads"),
        kv_heads: if has("--group-query-attention") { num("--num-query-groups") } else { num("--num-attention-heads") },
        ffn: num("--ffn-hidden-size"),
    };
    let fp8 = has("--fp8-format") || has("--fp8");
    let bf16_grads = has("--grad-reduce-in-bf16");
    for (flag, value, line) in &flags {
        let v = value.clone().map_or(Value::Bool(true), Value::String);
        let out = arg(flag, &v, &get, &shapes, gpus, tp * pp * cp, fp8, bf16_grads);
        st.record_at(flag, Some(*line), &value.clone().unwrap_or_default(), out);
    }
    megatron_defaults(st, has("--bf16") || has("--fp16") || fp8, has("--use-distributed-optimizer"));
    if !has("--nproc-per-node") && !has("--nproc_per_node") {
        st.default(
            "(parallel sizes)",
            vec![("gpus", gpus.to_string())],
            "no torchrun --nproc_per_node: the least the model-parallel sizes need",
        );
    }
    if shapes.any() && shapes.preset().is_none() {
        shapes_to_pairs(&shapes, st);
    }
    Ok(())
}

fn megatron_defaults(st: &mut FileState, has_precision: bool, has_dist_opt: bool) {
    st.default(
        "(framework)",
        vec![("framework", "megatron".into()), ("attn", "flash".into())],
        "Megatron Core's activations, Transformer Engine's fused attention",
    );
    if !has_precision {
        st.default("--bf16", vec![("precision", "fp32".into())], "neither --bf16 nor --fp16: Megatron trains in fp32");
    }
    if !has_dist_opt {
        st.default("--use-distributed-optimizer", vec![("zero", "0".into())], "off: every data-parallel rank holds the whole optimizer");
    }
    for (k, v) in [("recompute", "none"), ("tp", "1"), ("pp", "1"), ("cp", "1"), ("sp", "false"), ("batch", "1")] {
        if !st.has(k) {
            st.default(&format!("({k})"), vec![(k, v.into())], "Megatron's default");
        }
    }
}

fn shapes_to_pairs(s: &Shapes, st: &mut FileState) {
    let mut pairs = Vec::new();
    for (k, v) in
        [("vocab", s.vocab), ("hidden", s.hidden), ("layers", s.layers), ("heads", s.heads), ("kv_heads", s.kv_heads), ("ffn", s.ffn)]
    {
        if let Some(v) = v {
            pairs.push((k, v.to_string()));
        }
    }
    st.default("(model shapes)", pairs, "no preset has these shapes: a custom model on the current preset's layout");
}

#[allow(clippy::too_many_arguments)]
fn arg(
    flag: &str,
    v: &Value,
    get: &dyn Fn(&str) -> Option<String>,
    shapes: &Shapes,
    gpus: u64,
    mp: u64,
    fp8: bool,
    bf16_grads: bool,
) -> Out {
    let n = || get(flag).and_then(|s| s.parse::<u64>().ok());
    match flag {
        "--nproc-per-node" | "--nnodes" => match n() {
            Some(x) if x > 0 => Out::one("gpus", gpus).note("--nproc_per_node × --nnodes"),
            _ => Out::invalid("expected a positive whole number"),
        },
        "--tensor-model-parallel-size" => positive(v, "tp"),
        "--pipeline-model-parallel-size" => positive(v, "pp"),
        "--context-parallel-size" => positive(v, "cp"),
        "--expert-model-parallel-size" => positive(v, "ep"),
        "--virtual-pipeline-model-parallel-size" => positive(v, "vpp"),
        "--num-layers-per-virtual-pipeline-stage" => {
            let pp = get("--pipeline-model-parallel-size").and_then(|s| s.parse::<u64>().ok()).unwrap_or(1);
            match (n(), shapes.layers) {
                (Some(per), Some(layers)) if per > 0 && layers % (pp * per) == 0 => Out::one("vpp", layers / (pp * per)),
                _ => Out::invalid("needs --num-layers divisible by pipeline size × this"),
            }
        }
        "--sequence-parallel" => Out::one("sp", "true"),
        "--micro-batch-size" => positive(v, "batch"),
        "--global-batch-size" => {
            let micro = get("--micro-batch-size").and_then(|s| s.parse::<u64>().ok()).unwrap_or(1);
            match n().and_then(|g| accum(g, micro, gpus, mp)) {
                Some(a) => Out::one("accum", a).note("global / (micro-batch × data-parallel size)"),
                None => Out::invalid("not a multiple of micro-batch × data-parallel size"),
            }
        }
        "--seq-length" => positive(v, "seq"),
        "--bf16" if fp8 => Out::ignored("read with --fp8-format").status_understood(),
        "--bf16" if bf16_grads => {
            Out::one("precision", "mixed-bf16").note("bf16 weights, bf16 gradients (--grad-reduce-in-bf16), fp32 optimizer")
        }
        "--bf16" => Out::one("precision", "mixed-bf16-fp32grad"),
        "--fp16" => Out::one("precision", "mixed-fp16"),
        "--fp8-format" | "--fp8" => {
            let out = Out::one("precision", "mixed-fp8");
            if bf16_grads {
                out.approx("FP8 with bf16 gradients: estimated with fp32 main gradients (an upper bound)")
            } else {
                out
            }
        }
        "--grad-reduce-in-bf16" => Out::ignored("read with --bf16").status_understood(),
        "--use-distributed-optimizer" => {
            Out::one("zero", "1").note("the distributed optimizer shards fp32 master weights and moments: ZeRO-1")
        }
        "--use-torch-fsdp2" | "--use-megatron-fsdp" => Out::one("zero", "full_shard"),
        "--recompute-activations" => Out::one("recompute", "selective"),
        "--recompute-granularity" => match get(flag).as_deref() {
            Some("full") => {
                full_recompute(get("--recompute-method").as_deref(), get("--recompute-num-layers").and_then(|s| s.parse::<u64>().ok()))
            }
            Some("selective") => Out::one("recompute", "selective"),
            _ => Out::invalid("expected full or selective"),
        },
        "--recompute-method" | "--recompute-num-layers" => Out::ignored("read with --recompute-granularity").status_understood(),
        "--optimizer" => match get(flag).as_deref() {
            Some("adam") => Out::set(vec![("optim", "adamw".into()), ("optim_impl", "fused".into())]),
            Some("sgd") => Out::one("optim", "momentum"),
            _ => Out::unmodelled("an optimizer trainmem does not know: the estimate keeps optim as set"),
        },
        "--use-flash-attn" => Out::one("attn", "flash"),
        "--attention-backend" => match get(flag).as_deref() {
            Some("unfused") => Out::one("attn", "eager"),
            _ => Out::one("attn", "flash").note("fused/flash/auto: no s² scores kept"),
        },
        "--cross-entropy-loss-fusion" => {
            Out::unmodelled("the fused cross-entropy keeps less than the unfused loss the estimate counts (an upper bound)")
        }
        "--fp8-param-gather" => Out::unmodelled("fp8 parameters gathered without a bf16 copy: not modelled (an upper bound)"),
        "--use-precision-aware-optimizer" => Out::unmodelled("bf16/fp8 optimizer states: not modelled (the estimate keeps fp32)"),
        "--optimizer-cpu-offload" => Out::one("offload", "optimizer"),
        "--num-layers"
        | "--hidden-size"
        | "--ffn-hidden-size"
        | "--num-attention-heads"
        | "--num-query-groups"
        | "--vocab-size"
        | "--group-query-attention" => match shapes.preset() {
            Some(id) => Out::one("model", id).note("these shapes are the preset's"),
            None => Out::ignored("no preset has these shapes: set as a custom architecture").status_understood(),
        },
        "--kv-channels"
        | "--swiglu"
        | "--normalization"
        | "--untie-embeddings-and-output-weights"
        | "--disable-bias-linear"
        | "--position-embedding-type"
        | "--max-position-embeddings"
        | "--rotary-base"
        | "--rotary-percent"
        | "--apply-layernorm-1p"
        | "--use-mcore-models"
        | "--init-method-std" => Out::ignored("the architecture comes with the model (its shapes)"),
        "--attention-dropout" | "--hidden-dropout" => match get(flag).and_then(|s| s.parse::<f64>().ok()) {
            Some(0.0) => Out::ignored("no dropout"),
            Some(p) if (0.0..1.0).contains(&p) => Out::one("dropout", p),
            _ => Out::invalid("expected a probability"),
        },
        "--empty-unused-memory-level" => Out::ignored("empties the cache between steps: reserved memory only"),
        // Megatron-LM `arguments.py`: `cpu_offloading_num_layers > 0` sets `cpu_offloading`; the
        // block then wraps each layer in Transformer Engine's per-layer offloading context.
        "--cpu-offloading-num-layers" => match n() {
            Some(0) => Out::ignored("no layer offloaded"),
            Some(_) => {
                positive(v, "act_offload_layers").note("Transformer Engine's per-layer offloading of the first N layers' activations")
            }
            None => Out::invalid("expected a whole number"),
        },
        "--cpu-offloading" => match get("--cpu-offloading-num-layers").and_then(|s| s.parse::<u64>().ok()) {
            Some(x) if x > 0 => Out::ignored("read with --cpu-offloading-num-layers").status_understood(),
            _ => Out::ignored("no --cpu-offloading-num-layers: no layer offloaded"),
        },
        "--cpu-offloading-activations" | "--cpu-offloading-double-buffering" | "--cpu-offloading-retain-pinned-cpu-buffers" => {
            Out::ignored("Transformer Engine 2.20 offloads activations and ignores the rest (deprecated)")
        }
        "--cpu-offloading-weights" => Out::ignored("deprecated in Transformer Engine 2.20: offloading weights has no effect"),
        _ => {
            let lower = flag.trim_start_matches('-');
            const IGNORED_PREFIXES: &[&str] = &[
                "lr",
                "min-lr",
                "decoupled",
                "weight-decay",
                "adam",
                "clip-grad",
                "train-",
                "eval-",
                "log",
                "save",
                "load",
                "tensorboard",
                "wandb",
                "profile",
                "data-",
                "split",
                "tokenizer",
                "tiktoken",
                "num-workers",
                "mock-data",
                "seed",
                "exit-",
                "distributed-",
                "ckpt",
                "node-rank",
                "master-",
                "init-method",
                "manual-gc",
                "calculate-per-token-loss",
                "no-create-attention",
                "no-mmap",
                "overlap-",
                "use-mcore",
                "timing",
                "micro-batch-size",
                "no-load",
                "finetune",
                "async-save",
                "use-dist-ckpt",
                "use-checkpoint-args",
            ];
            if IGNORED_PREFIXES.iter().any(|p| lower.starts_with(p)) || lower.ends_with(".py") {
                Out::ignored("schedule, data, logging, checkpoints or launching: no GPU memory in the step")
            } else if lower.starts_with("fp8") || lower.starts_with("moe") || lower.starts_with("tp-comm") || lower.starts_with("recompute")
            {
                Out::unmodelled("a Megatron option trainmem does not model")
            } else {
                Out::unknown()
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Megatron-Bridge ConfigContainer YAML and NeMo 1.x Megatron GPT YAML.

pub fn read_bridge(root: &Value, st: &mut FileState) {
    let g = |k: &str| tree::get(root, k);
    let n = |k: &str| g(k).and_then(count);
    let nemo = root.get("trainer").is_some();
    let tp = n("model.tensor_model_parallel_size").unwrap_or(1).max(1);
    let pp = n("model.pipeline_model_parallel_size").unwrap_or(1).max(1);
    let cp = n("model.context_parallel_size").unwrap_or(1).max(1);
    let gpus = match (n("trainer.devices"), n("trainer.num_nodes")) {
        (Some(d), m) if d > 0 => d * m.unwrap_or(1).max(1),
        _ => tp * pp * cp,
    };
    let shapes = Shapes {
        vocab: n("model.vocab_size").or_else(|| n("model.padded_vocab_size")),
        hidden: n("model.hidden_size"),
        layers: n("model.num_layers"),
        heads: n("model.num_attention_heads"),
        kv_heads: n("model.num_query_groups").or_else(|| n("model.num_attention_heads")),
        ffn: n("model.ffn_hidden_size"),
    };
    let fp32_grads = g("ddp.grad_reduce_in_fp32").and_then(boolean).unwrap_or(true);
    for (key, v) in tree::leaves(root) {
        let out = bridge(&key, v, root, &shapes, gpus, tp * pp * cp, fp32_grads, nemo);
        st.record(&key, v, out);
    }
    if !st.has("precision") {
        st.default("mixed_precision", vec![("precision", "mixed-bf16-fp32grad".into())], "bf16_mixed, the recipes' default");
    }
    if !st.has("zero") {
        st.default("ddp.use_distributed_optimizer", vec![("zero", "1".into())], "the recipes' default: the distributed optimizer");
    }
    megatron_defaults(st, true, true);
    if n("trainer.devices").is_none() {
        st.default(
            "(parallel sizes)",
            vec![("gpus", gpus.to_string())],
            "the file names no GPU count: the least the model-parallel sizes need",
        );
    }
    if shapes.any() && shapes.preset().is_none() {
        shapes_to_pairs(&shapes, st);
    }
}

#[allow(clippy::too_many_arguments)]
fn bridge(key: &str, v: &Value, root: &Value, shapes: &Shapes, gpus: u64, mp: u64, fp32_grads: bool, nemo: bool) -> Out {
    let leaf = key.rsplit('.').next().unwrap_or(key);
    let top = key.split('.').next().unwrap_or("");
    match (top, leaf) {
        ("model", "tensor_model_parallel_size") => positive(v, "tp"),
        ("model", "pipeline_model_parallel_size") => positive(v, "pp"),
        ("model", "context_parallel_size") => positive(v, "cp"),
        ("model", "expert_model_parallel_size") => positive(v, "ep"),
        ("model", "virtual_pipeline_model_parallel_size") => match v {
            Value::Null => Out::one("vpp", 1),
            _ => positive(v, "vpp"),
        },
        ("model", "sequence_parallel") => match boolean(v) {
            Some(b) => Out::one("sp", b),
            None => Out::invalid("expected true or false"),
        },
        ("model" | "dataset", "seq_length" | "encoder_seq_length") => positive(v, "seq"),
        ("model" | "train", "micro_batch_size") => positive(v, "batch"),
        ("model" | "train", "global_batch_size") => {
            let micro = tree::get(root, &format!("{top}.micro_batch_size")).and_then(count).unwrap_or(1);
            match count(v).and_then(|g| accum(g, micro, gpus, mp)) {
                Some(a) => Out::one("accum", a).note("global / (micro-batch × data-parallel size)"),
                None => Out::invalid("not a multiple of micro-batch × data-parallel size"),
            }
        }
        ("model", "recompute_granularity" | "activations_checkpoint_granularity") => match text(v).as_deref() {
            None => Out::one("recompute", "none"),
            Some("full") => {
                let model = |a: &str, b: &str| tree::get(root, &format!("model.{a}")).or_else(|| tree::get(root, &format!("model.{b}")));
                full_recompute(
                    model("recompute_method", "activations_checkpoint_method").and_then(text).as_deref(),
                    model("recompute_num_layers", "activations_checkpoint_num_layers").and_then(count),
                )
            }
            Some("selective") => Out::one("recompute", "selective"),
            _ => Out::invalid("expected null, full or selective"),
        },
        ("model", "recompute_modules") => match v {
            Value::Null => Out::ignored("the default: the attention core"),
            Value::Array(a) if a.iter().all(|m| m.as_str() == Some("core_attn")) => {
                Out::ignored("the attention core (selective's default)")
            }
            _ => Out::unmodelled("recomputing modules other than the attention core: not modelled"),
        },
        ("model", "recompute_method" | "recompute_num_layers" | "activations_checkpoint_method" | "activations_checkpoint_num_layers") => {
            Out::ignored("read with recompute_granularity").status_understood()
        }
        ("model", "fp8") => match text(v).as_deref() {
            None => Out::ignored("no FP8"),
            Some(_) => Out::one("precision", "mixed-fp8"),
        },
        ("model", "cross_entropy_loss_fusion") => match boolean(v) {
            Some(true) => Out::unmodelled("the fused cross-entropy keeps less than the unfused loss the estimate counts (an upper bound)"),
            _ => Out::ignored("off"),
        },
        ("model", "fine_grained_activation_offloading") => match boolean(v) {
            Some(true) => Out::unmodelled("activations offloaded module by module: not modelled"),
            _ => Out::ignored("off"),
        },
        // Megatron-Core's TransformerBlock wraps each layer in Transformer Engine's per-layer
        // offloading context when `cpu_offloading` is set, for `cpu_offloading_num_layers` layers.
        ("model", "cpu_offloading") => match boolean(v) {
            Some(true) => Out::ignored("read with cpu_offloading_num_layers").status_understood(),
            Some(false) => Out::ignored("off"),
            None => Out::invalid("expected true or false"),
        },
        ("model", "cpu_offloading_num_layers") => match (tree::get(root, "model.cpu_offloading").and_then(boolean), count(v)) {
            (_, None) => Out::invalid("expected a whole number"),
            (Some(true), Some(n)) if n > 0 => {
                Out::one("act_offload_layers", n).note("Transformer Engine's per-layer offloading of the first N layers' activations")
            }
            _ => Out::ignored("cpu_offloading is off: no layer offloaded"),
        },
        (
            "model",
            "cpu_offloading_activations"
            | "cpu_offloading_weights"
            | "cpu_offloading_double_buffering"
            | "cpu_offloading_retain_pinned_cpu_buffers",
        ) => Out::ignored("Transformer Engine 2.20 offloads activations and ignores the rest (deprecated)"),
        ("model", "cuda_graph_impl") => match text(v).as_deref() {
            Some("none") | None => Out::ignored("no CUDA graphs"),
            _ => Out::unmodelled("CUDA graphs keep static buffers: not modelled"),
        },
        ("model", "attention_backend") => Out::ignored("Transformer Engine's fused/flash attention keeps no s² scores (attn=flash)"),
        (
            "model",
            "num_layers"
            | "hidden_size"
            | "ffn_hidden_size"
            | "num_attention_heads"
            | "num_query_groups"
            | "vocab_size"
            | "padded_vocab_size",
        ) => match shapes.preset() {
            Some(id) => Out::one("model", id).note("these shapes are the preset's"),
            None => Out::ignored("no preset has these shapes: set as a custom architecture").status_understood(),
        },
        ("model", "megatron_amp_O2") => Out::ignored("NeMo's bf16 parameters with fp32 main gradients: the layout the estimate uses"),
        ("ddp", "use_distributed_optimizer") | ("optimizer", "use_distributed_optimizer") => match boolean(v) {
            Some(true) => Out::one("zero", "1").note("the distributed optimizer: ZeRO-1"),
            Some(false) => Out::ignored("off").status_understood(),
            None => Out::invalid("expected true or false"),
        },
        ("ddp", "use_megatron_fsdp") => match boolean(v) {
            Some(true) => Out::one("zero", "3").note("Megatron FSDP (optim_grads_params)"),
            Some(false) => Out::ignored("off"),
            None => Out::invalid("expected true or false"),
        },
        ("ddp", "data_parallel_sharding_strategy") => {
            let fsdp = tree::get(root, "ddp.use_megatron_fsdp").and_then(boolean) == Some(true);
            if fsdp {
                match text(v).as_deref() {
                    Some("optim_grads_params") => Out::one("zero", "3"),
                    Some("optim_grads") => Out::one("zero", "2"),
                    Some("optim") => Out::one("zero", "1"),
                    _ => Out::ignored("no sharding"),
                }
            } else {
                Out::ignored("used by Megatron FSDP only (use_megatron_fsdp is off)")
            }
        }
        ("ddp", "grad_reduce_in_fp32") => match boolean(v) {
            Some(_) => Out::ignored("read with mixed_precision (fp32 or bf16 main gradients)").status_understood(),
            None => Out::invalid("expected true or false"),
        },
        ("ddp", _) => Out::ignored("how gradients are reduced and checked, not what is stored"),
        ("mixed_precision", _) | ("trainer", "precision") => {
            let recipe = text(v).unwrap_or_default().to_ascii_lowercase();
            if recipe.contains("fp8") || recipe.contains("fp4") {
                Out::one("precision", "mixed-fp8")
            } else if recipe.starts_with("bf16") || recipe == "bf16-mixed" || recipe == "bf16" {
                Out::one("precision", if fp32_grads { "mixed-bf16-fp32grad" } else { "mixed-bf16" })
            } else if recipe.contains("16") {
                Out::one("precision", "mixed-fp16")
            } else if recipe == "32" || recipe == "fp32" {
                Out::one("precision", "fp32")
            } else {
                Out::invalid("expected a mixed-precision recipe such as bf16_mixed")
            }
        }
        ("optimizer", "optimizer") => match text(v).as_deref() {
            Some("adam") => Out::set(vec![("optim", "adamw".into()), ("optim_impl", "fused".into())]),
            Some("sgd") => Out::one("optim", "momentum"),
            _ => Out::unmodelled("an optimizer trainmem does not know: the estimate keeps optim as set"),
        },
        ("optimizer", "use_precision_aware_optimizer") => match boolean(v) {
            Some(true) => Out::unmodelled("bf16/fp8 optimizer states: not modelled (the estimate keeps fp32)"),
            _ => Out::ignored("off"),
        },
        ("optimizer", "main_grads_dtype" | "main_params_dtype" | "exp_avg_dtype" | "exp_avg_sq_dtype") => match text(v).as_deref() {
            Some("torch.float32" | "float32" | "fp32") => Out::ignored("fp32: the estimate's layout"),
            _ => Out::unmodelled("a reduced-precision optimizer state: not modelled (the estimate keeps fp32)"),
        },
        ("optimizer", "optimizer_cpu_offload") => match boolean(v) {
            Some(true) => Out::one("offload", "optimizer"),
            _ => Out::ignored("off"),
        },
        ("optimizer", "bf16" | "fp16" | "params_dtype") => Out::ignored("read with mixed_precision"),
        ("optimizer", _) | ("scheduler", _) => Out::ignored("hyperparameter or schedule: no memory"),
        ("peft", "dim") => {
            count(v).filter(|n| *n > 0).map_or_else(|| Out::invalid("expected a positive whole number"), |n| Out::one("lora_rank", n))
        }
        ("peft", "target_modules") => {
            let all = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"];
            match v.as_array() {
                Some(a) if all.iter().all(|m| a.iter().any(|x| x.as_str() == Some(m))) => {
                    Out::set(vec![("finetune", "lora".into()), ("lora_targets", "all".into())])
                }
                Some(_) => Out::set(vec![("finetune", "lora".into())])
                    .approx("adapters on some of Megatron's fused linears: estimated on every linear"),
                None => Out::invalid("expected a list of Megatron linear names"),
            }
        }
        ("peft", _) => Out::ignored("a LoRA scale or dropout: no memory the estimate counts"),
        ("trainer", "devices" | "num_nodes") => match count(v) {
            Some(d) if d > 0 => Out::one("gpus", gpus).note("devices × num_nodes"),
            _ => Out::invalid("expected a positive whole number"),
        },
        ("trainer", _) => Out::ignored("steps, logging and launching: no GPU memory in the step"),
        ("model", _) if nemo && (key.starts_with("model.data") || key.starts_with("model.optim") || key.starts_with("model.tokenizer")) => {
            Out::ignored("data, optimizer hyperparameters or tokenizer: no GPU memory in the step")
        }
        (
            "model",
            "transformer_impl"
            | "pipeline_dtype"
            | "pipeline_model_parallel_layout"
            | "cuda_graph_scope"
            | "cuda_graph_warmup_steps"
            | "cross_entropy_fusion_impl"
            | "offload_modules"
            | "kv_channels"
            | "gated_linear_unit"
            | "normalization"
            | "share_embeddings_and_output_weights"
            | "position_embedding_type"
            | "rotary_base"
            | "rotary_percent"
            | "init_method_std"
            | "max_position_embeddings"
            | "add_bias_linear"
            | "bias_activation_fusion"
            | "masked_softmax_fusion"
            | "persist_layer_norm"
            | "bias_dropout_fusion"
            | "apply_rope_fusion"
            | "make_vocab_size_divisible_by"
            | "activation"
            | "bias"
            | "layernorm_epsilon",
        ) => Out::ignored("the architecture comes with the model; kernel choices keep the same tensors"),
        ("model", "hidden_dropout" | "attention_dropout") => match tree::float(v) {
            Some(0.0) => Out::ignored("no dropout"),
            Some(p) if (0.0..1.0).contains(&p) => Out::one("dropout", p),
            _ => Out::invalid("expected a probability"),
        },
        (
            "train"
            | "validation"
            | "checkpoint"
            | "logger"
            | "tokenizer"
            | "rng"
            | "dist"
            | "profiling"
            | "ft"
            | "straggler"
            | "nvrx_straggler"
            | "rerun_state_machine"
            | "inprocess_restart"
            | "comm_overlap"
            | "exp_manager"
            | "name"
            | "env_vars"
            | "dataset",
            _,
        ) => Out::ignored("steps, data, checkpoints or logging: no GPU memory in the step"),
        ("model", _) => Out::unknown(),
        _ => {
            let _ = int(v);
            Out::unknown()
        }
    }
}

/// `recompute_granularity = full` with its method and layer count (Megatron-Core
/// `TransformerConfig.recompute_method`, `recompute_num_layers`; `megatron/core/recompute.py`
/// `checkpointed_forward`): the block method recomputes only the first N layers of each
/// (virtual) pipeline stage (`recompute_layers = N`); the uniform method with one layer a chunk
/// is per-layer recomputation, with N > 1 it checkpoints chunks of N layers, which the estimate
/// counts per layer.
fn full_recompute(method: Option<&str>, layers: Option<u64>) -> Out {
    match (method, layers) {
        (Some("block"), Some(n)) if n > 0 => Out::set(vec![("recompute", "full".into()), ("recompute_layers", n.to_string())])
            .note("the block method: the first N layers of each pipeline stage recomputed, the others keep everything"),
        (Some("uniform"), Some(1)) | (None, _) => Out::one("recompute", "full"),
        (Some("uniform"), _) => Out::one("recompute", "full").approx(
            "uniform recomputation of N-layer chunks: estimated per layer (a chunk keeps one input, not N, and its backward re-runs N layers at once)",
        ),
        _ => Out::invalid("expected the block or uniform method with a positive number of layers"),
    }
}
