//! torchtitan job configs (TOML; the `train_configs/*.toml` layout of torchtitan 0.1–0.2.2,
//! `torchtitan/config/job_config.py`). torchtitan trains with FSDP2 (parameters sharded in fp32,
//! gathered in bf16: `mixed_precision_param`), SDPA attention, and selective activation
//! checkpointing of every 2nd block by default. Its recipes map onto trainmem's: op-level SAC
//! (`recompute=op`), every Nth block (`recompute_every`), `compile.enable` (`compile`),
//! the float8 converter (`fp8`, `fp8_allgather`) and the step in backward (`optim_in_bwd`); a
//! Llama 3 job runs torchtitan's own model code (`framework=torchtitan`). A key the file leaves out gets job_config.py's default.

use super::models;
use super::report::{positive, FileState, Out};
use super::tree::{self, boolean, count, int, text};
use serde_json::Value;

/// A key torchtitan's `job_config.py` defaults when the file leaves it out: the key, the older
/// name it may go by, the trainmem keys its default sets, and where the default comes from.
type KeyDefault = (&'static str, &'static str, Vec<(&'static str, String)>, &'static str);

/// The pipeline degree a torchtitan file sets (1 without pipeline parallelism).
fn pp_degree(root: &Value) -> i64 {
    tree::get(root, "parallelism.pipeline_parallel_degree")
        .or_else(|| tree::get(root, "experimental.pipeline_parallel_degree"))
        .and_then(int)
        .unwrap_or(1)
}

/// Under pipeline parallelism, the micro-batch and the micro-batches of a local batch `local`:
/// torchtitan 0.2.2 `distributed/pipeline_parallel.py` (`n_microbatches = local_batch_size //
/// pipeline_parallel_microbatch_size`, the micro-batch size 1 by default, `config/job_config.py`)
/// refuses a local batch the micro-batch does not divide. `None` without pipeline parallelism.
fn pipeline_micro_batches(root: &Value, local: &Value) -> Option<Result<(u64, u64), String>> {
    if pp_degree(root) <= 1 {
        return None;
    }
    let mbs = tree::get(root, "parallelism.pipeline_parallel_microbatch_size").and_then(count).unwrap_or(1);
    Some(match count(local) {
        Some(b) if b > 0 && mbs > 0 && b % mbs == 0 => Ok((mbs, b / mbs)),
        Some(b) if b > 0 && mbs > 0 => Err(format!("the local batch {b} is not a multiple of pipeline_parallel_microbatch_size {mbs}")),
        _ => Err("expected a positive whole number".into()),
    })
}

pub fn read(root: &Value, st: &mut FileState) {
    let g = |k: &str| tree::get(root, k);
    // The degrees decide sharding and the GPU count together.
    let degree = |k: &str, old: &str, default: i64| g(k).or_else(|| g(old)).and_then(int).unwrap_or(default);
    let shard = degree("parallelism.data_parallel_shard_degree", "training.data_parallel_shard_degree", -1);
    let replicate = degree("parallelism.data_parallel_replicate_degree", "training.data_parallel_replicate_degree", 1);
    let others = ["tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree"]
        .iter()
        .map(|k| degree(&format!("parallelism.{k}"), &format!("training.{k}"), 1).max(1))
        .product::<i64>();
    for (key, v) in tree::leaves(root) {
        let out = map(&key, v, root, shard, replicate, others);
        st.record(&key, v, out);
    }
    let defaults: [KeyDefault; 6] = [
        ("training.local_batch_size", "training.batch_size", vec![("batch", "8".into())], "job_config.py's default"),
        ("training.seq_len", "training.seq_len", vec![("seq", "2048".into())], "job_config.py's default"),
        (
            "training.mixed_precision_param",
            "training.mixed_precision_param",
            vec![("precision", "mixed-bf16".into())],
            "FSDP2 gathers parameters in bf16 and keeps the fp32 shards and optimizer states",
        ),
        ("optimizer.name", "optimizer.name", vec![("optim", "adamw".into())], "job_config.py's default"),
        ("optimizer.implementation", "optimizer.implementation", vec![("optim_impl", "fused".into())], "job_config.py's default"),
        (
            "parallelism.data_parallel_shard_degree",
            "training.data_parallel_shard_degree",
            vec![("zero", "full_shard".into())],
            "-1: FSDP2 over every GPU the other degrees leave",
        ),
    ];
    for (key, old, pairs, note) in defaults {
        if g(key).is_none() && g(old).is_none() {
            // Under pipeline parallelism the default local batch (8) runs as micro-batches.
            let local = Value::from(8);
            match (key, pipeline_micro_batches(root, &local)) {
                ("training.local_batch_size", Some(Ok((mbs, n)))) => st.default(
                    key,
                    vec![("batch", mbs.to_string()), ("accum", n.to_string())],
                    "job_config.py's default 8, run as micro-batches of pipeline_parallel_microbatch_size",
                ),
                _ => st.default(key, pairs, note),
            }
        }
    }
    if g("activation_checkpoint.mode").is_none() {
        st.default(
            "activation_checkpoint.mode",
            vec![("recompute", "none".into()), ("recompute_every", "2".into())],
            "selective with selective_ac_option \"2\" (job_config.py's default): every 2nd block checkpointed (blocks 1, 3, …)",
        );
    }
    // The caching allocator's settings come from the launcher, not the TOML.
    st.default(
        "(launcher)",
        vec![("alloc_conf", LAUNCHER_ALLOC_CONF.into())],
        "torchtitan's run_train.sh starts torchrun with PYTORCH_ALLOC_CONF=\"expandable_segments:True\" (since run_llama_train.sh, 2024-10-22, pytorch/torchtitan@a5e57e4a9)",
    );
    let mut code = vec![("attn", "sdpa".into()), ("loss", "standard".into())];
    let mut why = "torchtitan's attention is F.scaled_dot_product_attention; its loss is cross-entropy on fp32 logits".to_string();
    let name = g("model.name").and_then(text).unwrap_or_default();
    let flavor = g("model.flavor").and_then(text).unwrap_or_default();
    if own_code(&name, &flavor) {
        if name == "deepseek_v3" {
            why.push_str(" (DeepSeek-V3's 16B flavor attends with FlexAttention and a block-causal mask: estimated as SDPA's fused kernel, which keeps the same q, k, v, output and log-sum-exp)");
        }
        if name == "llama4" {
            code.extend(LLAMA4_SHAPE.iter().map(|&(k, v)| (k, v.to_string())));
            why.push_str(" (torchtitan's Llama 4 flavors put RoPE in every block, without q/k norm or chunked attention: qk_l2_norm=false, nope_layers=none, window_layers=none on Meta's preset)");
        }
        code.push(("framework", "torchtitan".into()));
        why.push_str(&format!("; the step follows torchtitan's own {name} model code (framework=torchtitan)"));
        // Where the estimator refuses this job on torchtitan's own code, blocks compiled without
        // checkpointing are estimated on transformers' modeling code (compiled there, where it
        // accepts that) rather than eager; checkpointed blocks keep torchtitan's code and run
        // eager, since what they keep is the checkpoint's, which follows torchtitan's code (op-level
        // SAC's save list, its every-N blocks).
        let no_ac = g("activation_checkpoint.mode").and_then(text).as_deref() == Some("none");
        if compiled(root).is_some() && no_ac {
            st.give_way(vec![("framework", "hf".into())], "estimated on transformers' modeling code (framework=hf)");
        }
    }
    st.default("(model code)", code, &why);
    if shard > 0 && replicate > 0 {
        st.default("(degrees)", vec![("gpus", (shard * replicate * others).to_string())], "the product of the parallel degrees");
    }
}

/// The caching allocator's configuration torchtitan's launcher sets (`run_train.sh`:
/// `PYTORCH_ALLOC_CONF="expandable_segments:True" torchrun …`; `PYTORCH_CUDA_ALLOC_CONF` in
/// `run_llama_train.sh` from pytorch/torchtitan@a5e57e4a9, 2024-10-22, on). Its benchmark runs
/// (`benchmarks/llama3_h100_202412_torchtitan.md`, torchtitan 9dec370) were launched with it.
pub const LAUNCHER_ALLOC_CONF: &str = "expandable_segments:True";

/// The `model.name`s whose torchtitan model code the estimator follows (`framework =
/// torchtitan`, `step/families/torchtitan.rs`); other models are estimated with transformers'
/// modeling code.
const OWN_CODE: &[&str] = &["llama3", "qwen3"];

/// Whether the estimator follows torchtitan's own code for this `model.name` and `model.flavor`:
/// [`OWN_CODE`], and DeepSeek-V3's 16B flavor (the DeepSeek-V2-Lite shape, measured:
/// `torchtitan-deepseek_v3.json`; its 236B and 671B flavors' query low-rank and routing are not).
fn own_code(name: &str, flavor: &str) -> bool {
    OWN_CODE.contains(&name)
        || (name == "deepseek_v3" && flavor.eq_ignore_ascii_case("16B"))
        || (name == "llama4" && LLAMA4_FLAVORS.iter().any(|f| f.eq_ignore_ascii_case(flavor)))
}

/// torchtitan's Llama 4 flavors whose shape the estimator follows on its own code
/// (`torchtitan-llama4.json`): `every_n_layers_nope` unset, so RoPE in every block, no q/k norm
/// and no chunked attention — where Meta's checkpoints (transformers' presets the flavors map to)
/// have all three. The import sets the preset's three keys back (`LLAMA4_SHAPE`).
const LLAMA4_FLAVORS: &[&str] = &["17bx16e", "17bx128e"];

/// What torchtitan's Llama 4 flavors leave out of transformers' Llama 4 preset.
const LLAMA4_SHAPE: [(&str, &str); 3] = [("qk_l2_norm", "false"), ("nope_layers", "none"), ("window_layers", "none")];

/// What `compile` compiles when it is on (`compile.enable`, or 0.1's `training.compile`):
/// `compile.components` (job_config.py's default `["model", "loss"]`). `None`: off.
fn compiled(root: &Value) -> Option<Vec<String>> {
    let on = tree::get(root, "compile.enable").or_else(|| tree::get(root, "training.compile")).and_then(boolean) == Some(true);
    if !on {
        return None;
    }
    let components = match tree::get(root, "compile.components").and_then(|v| v.as_array().cloned()) {
        Some(list) => list.iter().filter_map(text).collect(),
        None => vec!["model".to_string(), "loss".to_string()],
    };
    Some(components)
}

/// `compile.enable` (`training.compile` in 0.1): torchtitan compiles each `TransformerBlock`
/// (`apply_compile`, `fullgraph=True`) when `components` holds `"model"`, and its loss function
/// when it holds `"loss"` (`build_loss_fn`): with both, the regions are what `compile_regions =
/// layer` models (each layer and the loss); the blocks alone are `block`.
fn compile(v: &Value, root: &Value) -> Out {
    let Some(on) = boolean(v) else { return Out::invalid("expected true or false") };
    if !on {
        return Out::one("compile", "false");
    }
    // Whether the estimator models it with the rest of the job is its own judgement: where it
    // does not, the import estimates the blocks eager (`import::give_way`).
    let parts = compiled(root).unwrap_or_default();
    let (model, loss) = (parts.iter().any(|p| p == "model"), parts.iter().any(|p| p == "loss"));
    match (model, loss) {
        (true, true) => Out::set(vec![("compile", "true".into()), ("compile_regions", "layer".into())])
            .note("each TransformerBlock and the loss compiled (compile.components = [\"model\", \"loss\"])"),
        (true, false) => Out::set(vec![("compile", "true".into()), ("compile_regions", "block".into())])
            .note("each TransformerBlock compiled, the loss eager"),
        _ => Out::unmodelled("only the loss compiled: not modelled; estimated eager"),
    }
}

/// `model.converters`: torchtitan 0.2.2's model converters (`components/quantization/`,
/// registered as `quantize.linear.float8`, `quantize.linear.mx`, …; `float8` in 0.1). The
/// float8 one swaps `nn.Linear` for torchao's `Float8Linear` (`Float8LinearConverter`):
/// tensorwise scales unless `quantize.linear.float8.recipe_name` names a rowwise recipe, the FSDP2
/// float8 all-gather when `enable_fsdp_float8_all_gather` is set (tensorwise only) and parameters
/// are sharded.
fn converters(v: &Value, root: &Value, shard: i64) -> Out {
    let Some(list) = v.as_array() else { return Out::invalid("expected a list") };
    let names: Vec<String> = list.iter().filter_map(text).collect();
    if names.is_empty() {
        return Out::ignored("no converters");
    }
    let float8 = |k: &str| tree::get(root, &format!("quantize.linear.float8.{k}")).or_else(|| tree::get(root, &format!("float8.{k}")));
    let mut out = None;
    for n in &names {
        match n.as_str() {
            "float8" | "quantize.linear.float8" => {
                let recipe = float8("recipe_name").and_then(text);
                let mut pairs: Vec<(&'static str, String)> = Vec::new();
                let mut notes = Vec::new();
                match recipe.as_deref() {
                    None | Some("tensorwise") => {
                        pairs.push(("fp8", "torchao-tensorwise".into()));
                        let gather = recipe.is_none() && float8("enable_fsdp_float8_all_gather").and_then(boolean) == Some(true);
                        if gather && shard != 1 {
                            pairs.push(("fp8_allgather", "true".into()));
                        }
                    }
                    Some("rowwise") => pairs.push(("fp8", "torchao-rowwise".into())),
                    Some("rowwise_with_gw_hp") => {
                        pairs.push(("fp8", "torchao-rowwise".into()));
                        notes.push("rowwise_with_gw_hp keeps the weight gradient's GEMM in bf16: estimated as rowwise");
                    }
                    Some(_) => {
                        return Out::invalid("expected quantize.linear.float8.recipe_name tensorwise, rowwise or rowwise_with_gw_hp")
                    }
                }
                let filtered = float8("filter_fqns")
                    .and_then(|f| f.as_array().cloned())
                    .is_some_and(|f| f.iter().filter_map(text).any(|n| n == "output"));
                if !filtered {
                    notes.push("filter_fqns does not name \"output\": torchtitan converts the output projection too, the estimate keeps it in bf16");
                }
                let o = Out::set(pairs);
                out = Some(if notes.is_empty() { o } else { o.approx(notes.join("; ")) });
            }
            "quantize.linear.mx" | "mx" => return Out::unmodelled("torchao MX linears (mxfp8_cublas): not modelled; estimated in bf16"),
            _ => return Out::unmodelled(format!("the {n} converter: not modelled; estimated in bf16")),
        }
    }
    out.unwrap_or_else(|| Out::ignored("no converters"))
}

#[allow(clippy::too_many_arguments)]
fn map(key: &str, v: &Value, root: &Value, shard: i64, replicate: i64, others: i64) -> Out {
    let top = key.split('.').next().unwrap_or("");
    let _ = others;
    match key {
        "model.name" => {
            let flavor = tree::get(root, "model.flavor").and_then(text).unwrap_or_default();
            let Some(name) = text(v) else { return Out::invalid("expected a model name") };
            match models::TORCHTITAN.iter().find(|(n, f, _)| *n == name && f.eq_ignore_ascii_case(&flavor)) {
                Some((_, _, id)) => Out::one("model", id),
                None => Out::unmodelled(format!("no trainmem preset for {name} {flavor}: choose the model yourself")),
            }
        }
        "model.flavor" => Out::ignored("read with model.name"),
        "model.converters" => converters(v, root, shard),
        "model.hf_assets_path" | "model.tokenizer_path" | "model.print_after_conversion" => {
            Out::ignored("files and logging: no GPU memory")
        }
        "training.local_batch_size" | "training.batch_size" => match pipeline_micro_batches(root, v) {
            Some(Ok((mbs, n))) => Out::set(vec![("batch", mbs.to_string()), ("accum", n.to_string())]).note(
                "under pipeline parallelism the local batch runs as local ÷ pipeline_parallel_microbatch_size micro-batches (distributed/pipeline_parallel.py): batch = one micro-batch, accum = their count",
            ),
            Some(Err(e)) => Out::invalid(e),
            None => positive(v, "batch"),
        },
        "training.seq_len" => positive(v, "seq"),
        "training.global_batch_size" => match int(v) {
            Some(n) if n <= 0 && pp_degree(root) > 1 => Out::ignored("-1: one pipeline step per optimizer step (accum: its micro-batches)"),
            Some(n) if n <= 0 => Out::one("accum", 1).note("-1: one micro-batch per step"),
            Some(n) => {
                let local = tree::get(root, "training.local_batch_size").and_then(int).unwrap_or(8).max(1);
                let dp = shard.max(1) * replicate.max(1);
                if pp_degree(root) > 1 {
                    // Each accumulation step is one schedule step, reduced at its end.
                    if shard > 0 && n == local * dp {
                        Out::ignored("one pipeline step per optimizer step (accum: its micro-batches)")
                    } else {
                        Out::unmodelled("gradient accumulation over several pipeline steps: the estimate holds one schedule step's micro-batches (accum)")
                    }
                } else if shard > 0 && n % (local * dp) == 0 {
                    Out::one("accum", n / (local * dp))
                } else {
                    Out::unmodelled("gradient accumulation = global / (local × data-parallel degree), which depends on the GPU count: set accum yourself")
                }
            }
            None => Out::invalid("expected a whole number"),
        },
        "training.mixed_precision_param" => match text(v).as_deref() {
            Some("bfloat16") => Out::one("precision", "mixed-bf16"),
            Some("float32") => Out::one("precision", "fp32"),
            _ => Out::invalid("expected bfloat16 or float32"),
        },
        "training.mixed_precision_reduce" => Out::ignored("gradients reduce in fp32 into the fp32 shards (the estimate's layout)"),
        "training.dtype" => Out::ignored("the parameter dtype without FSDP; under FSDP mixed_precision_param decides"),
        "training.enable_cpu_offload" => match boolean(v) {
            Some(true) => Out::one("offload", "optimizer+params"),
            Some(false) => Out::ignored("no CPU offload"),
            None => Out::invalid("expected true or false"),
        },
        "training.compile" | "compile.enable" => compile(v, root),
        "compile.components" | "compile.backend" => Out::ignored("read with compile.enable"),
        "optimizer.name" => match text(v).as_deref() {
            Some("AdamW") | Some("Adam") => Out::one("optim", "adamw"),
            _ => Out::unmodelled("an optimizer trainmem does not know: the estimate keeps optim as set"),
        },
        "optimizer.implementation" => match text(v).as_deref() {
            Some("fused") => Out::one("optim_impl", "fused"),
            Some("foreach") => Out::one("optim_impl", "foreach"),
            Some("for-loop") => Out::one("optim_impl", "forloop"),
            _ => Out::invalid("expected fused, foreach or for-loop"),
        },
        "optimizer.early_step_in_backward" => match boolean(v) {
            Some(b) => {
                Out::one("optim_in_bwd", b).note(if b { "each parameter steps in its gradient hook (optimizer_in_backward)" } else { "" })
            }
            None => Out::invalid("expected true or false"),
        },
        "parallelism.data_parallel_shard_degree" | "training.data_parallel_shard_degree" => match int(v) {
            Some(-1) => Out::one("zero", if replicate > 1 { "hybrid_shard" } else { "full_shard" })
                .note("-1: FSDP2 over every GPU the other degrees leave; set gpus yourself"),
            Some(1) if replicate > 1 => Out::one("zero", "0").note("replicated only: DDP"),
            Some(1) => Out::one("zero", "0").note("no sharding"),
            Some(n) if n > 1 && replicate > 1 => Out::set(vec![("zero", "hybrid_shard".into()), ("shard_group", n.to_string())]),
            Some(n) if n > 1 => Out::one("zero", "full_shard"),
            _ => Out::invalid("expected -1 or a positive whole number"),
        },
        "parallelism.data_parallel_replicate_degree" | "training.data_parallel_replicate_degree" => match int(v) {
            Some(n) if n >= 1 => Out::ignored("read with data_parallel_shard_degree").status_understood(),
            _ => Out::invalid("expected a positive whole number"),
        },
        "parallelism.fsdp_reshard_after_forward" => match text(v).as_deref() {
            Some("never") => Out::one("zero", "shard_grad_op"),
            Some("default") => Out::ignored(
                "parameters are freed after forward (FULL_SHARD); under pipeline parallelism each stage stays gathered through the step, as the estimate keeps it",
            ),
            Some("always") => Out::ignored(
                "parameters are freed after forward (FULL_SHARD); under pipeline parallelism the estimate keeps each stage gathered as `default` does (resharding every micro-batch is not modelled apart)",
            ),
            _ => Out::invalid("expected default, always or never"),
        },
        "parallelism.tensor_parallel_degree" | "training.tensor_parallel_degree" => match int(v) {
            Some(1) => Out::set(vec![("tp", "1".into()), ("sp", "false".into())]),
            Some(n) if n > 1 => Out::set(vec![("tp", n.to_string()), ("sp", "true".into())])
                .note("torchtitan's TP plan shards norms and dropout over the sequence"),
            _ => Out::invalid("expected a positive whole number"),
        },
        "parallelism.pipeline_parallel_degree" | "experimental.pipeline_parallel_degree" => positive(v, "pp"),
        "parallelism.context_parallel_degree" | "experimental.context_parallel_degree" => positive(v, "cp"),
        "parallelism.expert_parallel_degree" => positive(v, "ep"),
        "parallelism.pipeline_parallel_schedule" => match text(v).as_deref() {
            Some("1F1B") => Out::one("vpp", 1),
            // torchtitan 0.2.2 distributed/pipeline_parallel.py pipeline_llm: a multi-stage
            // schedule without pipeline_parallel_layers_per_stage gets two stages per rank.
            Some("Interleaved1F1B") => Out::one("vpp", 2).note("two stages per rank, torchtitan's default for a multi-stage schedule"),
            Some("GPipe") => Out::ignored("the estimate's pipeline memory is 1F1B's"),
            _ => Out::unmodelled("a schedule other than 1F1B and Interleaved1F1B: the estimate keeps 1F1B with vpp as set"),
        },
        "parallelism.pipeline_parallel_microbatch_size" => match count(v) {
            Some(n) if n > 0 => Out::ignored("read with training.local_batch_size: batch = this, accum = local ÷ this").status_understood(),
            _ => Out::invalid("expected a positive whole number"),
        },
        "parallelism.disable_loss_parallel"
        | "parallelism.enable_async_tensor_parallel"
        | "parallelism.context_parallel_rotate_method"
        | "parallelism.context_parallel_load_balancer"
        | "parallelism.expert_tensor_parallel_degree"
        | "parallelism.pipeline_parallel_schedule_csv"
        | "parallelism.module_fqns_per_model_part"
        | "parallelism.pipeline_parallel_first_stage_less_layers"
        | "parallelism.pipeline_parallel_last_stage_less_layers"
        | "parallelism.pipeline_parallel_layers_per_stage"
        | "parallelism.expert_parallel_comm_backend"
        | "parallelism.pipeline_parallel_expert_parallel_overlap" => Out::unmodelled("a parallelism detail trainmem does not model"),
        "activation_checkpoint.mode" => {
            let option = tree::get(root, "activation_checkpoint.selective_ac_option").and_then(text).unwrap_or_else(|| "2".into());
            match text(v).as_deref() {
                Some("none") => Out::one("recompute", "none"),
                Some("full") => Out::one("recompute", "full"),
                Some("selective") if option == "1" => Out::one("recompute", "full").note("selective with option 1 checkpoints every layer"),
                Some("selective") if option == "op" => Out::one("recompute", "op")
                    .note("op-level selective checkpointing: torchtitan's save list (matmul outputs, every second mm, SDPA)"),
                Some("selective") => match option.trim().parse::<u64>() {
                    Ok(n) if n > 1 => Out::set(vec![("recompute", "none".into()), ("recompute_every", n.to_string())]).note(format!(
                        "every {n}th block checkpointed (blocks {}, {}, …)",
                        n - 1,
                        2 * n - 1
                    )),
                    _ => Out::invalid("expected selective_ac_option \"op\" or a whole number"),
                },
                Some("memory_budget") => {
                    Out::one("recompute", "none").approx("a memory budget for the compiler: not modelled; estimated without checkpointing")
                }
                _ => Out::invalid("expected none, selective, full or memory_budget"),
            }
        }
        "activation_checkpoint.selective_ac_option" => Out::ignored("read with activation_checkpoint.mode"),
        _ => match top {
            "job" | "profiling" | "metrics" | "checkpoint" | "validation" | "comm" | "fault_tolerance" | "memory_estimation" | "debug"
            | "experimental" => Out::ignored("bookkeeping, checkpoints or logging: no GPU memory in the step"),
            "lr_scheduler" => Out::ignored("schedule: no memory"),
            "optimizer" => Out::ignored("hyperparameter: no memory"),
            "quantize" | "float8" | "mx" => {
                let converters: Vec<String> = tree::get(root, "model.converters")
                    .and_then(|c| c.as_array().cloned())
                    .unwrap_or_default()
                    .iter()
                    .filter_map(text)
                    .collect();
                let float8 = converters.iter().any(|c| c == "float8" || c == "quantize.linear.float8");
                if float8 && (key.starts_with("quantize.linear.float8.") || key.starts_with("float8.")) {
                    Out::ignored("read with model.converters").status_understood()
                } else {
                    Out::ignored("read with model.converters, which does not ask for this converter")
                }
            }
            "activation_checkpoint" => Out::unmodelled("a checkpointing detail trainmem does not model"),
            "training" if is_data(key) => Out::ignored("data, steps or clipping: no stored state"),
            _ => Out::unknown(),
        },
    }
}

fn is_data(key: &str) -> bool {
    let leaf = key.rsplit('.').next().unwrap_or("");
    matches!(leaf, "dataset" | "dataset_path" | "steps" | "max_norm" | "gc_freq" | "gc_debug" | "seed" | "deterministic" | "warmup_steps")
        || key.starts_with("training.dataloader")
}
