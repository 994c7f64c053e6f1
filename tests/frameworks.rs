//! Framework config files: every recipe preset re-imports from its own source file to the same
//! configuration, every format round-trips import → export → import, and a seeded mutator over
//! the fixture files finds no panic and no error that does not name its key or line.
//!
//! The normal run mutates 100,000 files; `TRAINMEM_FRAMEWORK_FUZZ_CASES` changes the count.

use std::path::{Path, PathBuf};
use trainmem::config::{self, decode_query, encode_query, Config, RECIPES};
use trainmem::frameworks::{export, export_files, import, ExportFormat, Format, ImportError, Status};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/frameworks")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(fixtures().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every fixture a format reads, with its format.
fn all_fixtures() -> Vec<(String, Format)> {
    let mut out = Vec::new();
    for r in RECIPES {
        for f in r.fixtures {
            if !out.iter().any(|(n, _): &(String, Format)| n == f) {
                let imp = import(&[(f, &read(f))]).unwrap_or_else(|e| panic!("{e}"));
                out.push((f.to_string(), imp.formats[0].1));
            }
        }
    }
    for extra in ["accelerate/deepspeed.yaml", "accelerate/zero_stage2_config.json", "megatron_bridge/llama32_1b_pretrain.yaml"] {
        let imp = import(&[(extra, &read(extra))]).unwrap_or_else(|e| panic!("{e}"));
        out.push((extra.to_string(), imp.formats[0].1));
    }
    out
}

#[test]
fn each_recipe_reimports_from_its_own_source_files_to_the_same_configuration() {
    assert!(RECIPES.len() >= 12, "{} recipes", RECIPES.len());
    let frameworks: std::collections::BTreeSet<&str> = RECIPES.iter().map(|r| r.framework).collect();
    assert!(frameworks.len() >= 7, "{frameworks:?}");
    for r in RECIPES {
        let texts: Vec<(String, String)> = r.fixtures.iter().map(|f| (f.to_string(), read(f))).collect();
        let files: Vec<(&str, &str)> = texts.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect();
        let imp = import(&files).unwrap_or_else(|e| panic!("{}: {e}", r.id));
        assert_eq!(imp.errors, Vec::<ImportError>::new(), "{}", r.id);
        let got: Vec<(&str, &str)> = imp.pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, r.pairs.to_vec(), "{}: the recipe's keys are not what its file gives", r.id);
        let chosen = decode_query(&format!("recipe={}", r.id));
        assert_eq!(chosen.errors, vec![], "{}", r.id);
        assert_eq!(chosen.config, imp.config, "{}", r.id);
        assert!(config::matching_recipe(&imp.config).map(|m| m.id).is_some(), "{}", r.id);
    }
}

#[test]
fn a_recipe_applies_first_and_any_key_after_it_changes_it() {
    let d = decode_query("batch=4&recipe=torchtitan-llama3-8b&gpus=64");
    assert_eq!(d.errors, vec![]);
    assert_eq!((d.config.batch, d.config.gpus, d.config.seq), (4, 64, 8192));
    // The link spells the configuration out, and reproduces it.
    assert_eq!(decode_query(&encode_query(&d.config)).config, d.config);
    // Changing the model keeps the rest of the recipe.
    let d = decode_query("recipe=torchtune-llama3.1-8b-lora-single-device&model=qwen2.5-7b");
    assert_eq!((d.config.model.as_str(), d.config.lora_rank), ("qwen2.5-7b", 8));
    assert!(decode_query("recipe=no-such-recipe").errors.iter().any(|e| e.key == "recipe"));
}

#[test]
fn every_fixture_reports_every_key_and_none_is_unknown() {
    for (f, format) in all_fixtures() {
        let imp = import(&[(&f, &read(&f))]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(imp.formats[0].1, format);
        let unknown: Vec<&str> = imp.keys.iter().filter(|k| k.status == Status::Unknown).map(|k| k.key.as_str()).collect();
        assert_eq!(unknown, Vec::<&str>::new(), "{f}");
        for k in &imp.keys {
            if matches!(k.status, Status::Ignored | Status::Unmodelled) {
                assert!(!k.note.is_empty(), "{f}: {} has no reason", k.key);
            }
            if k.status == Status::Understood {
                assert!(!k.set.is_empty() || !k.note.is_empty(), "{f}: {} says nothing", k.key);
            }
        }
    }
}

#[test]
fn unmodelled_features_are_reported_never_silently_ignored() {
    let status = |f: &str, key: &str| {
        let imp = import(&[(f, &read(f))]).unwrap_or_else(|e| panic!("{e}"));
        imp.keys.iter().find(|k| k.key == key).map(|k| k.status)
    };
    assert_eq!(
        status("torchtitan/llama3_405b.toml", "compile.enable"),
        Some(Status::Unmodelled),
        "compile of fully checkpointed tensor-parallel blocks"
    );
    assert_eq!(status("torchtitan/llama3_405b.toml", "parallelism.enable_async_tensor_parallel"), Some(Status::Unmodelled));
    assert_eq!(status("megatron_lm/train_llama3_8b_h100_fp8.args", "--fp8-param-gather"), Some(Status::Unmodelled));
    assert_eq!(status("axolotl/llama-3-lora-8b.yml", "load_in_8bit"), Some(Status::Unmodelled));
}

#[test]
fn the_recipes_a_framework_file_turns_on_are_read_as_the_estimator_models_them() {
    let recipe_of = |f: &str| import(&[(f, &read(f))]).unwrap_or_else(|e| panic!("{e}")).config;
    // torchtitan's Llama 3 8B preset: op-level SAC on torchtitan's own model code.
    let c = recipe_of("torchtitan/llama3_8b.toml");
    assert_eq!((c.recompute, c.framework), (config::Recompute::Op, config::Framework::Torchtitan));
    // torchtitan's launcher runs the caching allocator with expandable segments.
    assert_eq!(c.alloc_conf, "expandable_segments:True");
    // A Qwen3 MoE flavor is a preset, on torchtitan's own MoE code (without expert parallelism).
    let toml = "[model]\nname = \"qwen3\"\nflavor = \"30B-A3B\"\n[activation_checkpoint]\nmode = \"full\"\n";
    let c = import(&[("job.toml", toml)]).expect("imports").config;
    assert_eq!((c.model.as_str(), c.framework), ("qwen3-30b-a3b", config::Framework::Torchtitan));
    // DeepSeek-V3's 16B flavor (the DeepSeek-V2-Lite shape) runs on torchtitan's own code, measured
    // (`torchtitan-deepseek_v3.json`), and estimates without expert parallelism; its 671B flavor
    // (query low-rank, sigmoid group-limited routing) is transformers' code.
    let toml = "[model]\nname = \"deepseek_v3\"\nflavor = \"16B\"\n[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"op\"\n[parallelism]\ndata_parallel_shard_degree = 8\n";
    let c = import(&[("job.toml", toml)]).expect("imports").config;
    assert_eq!((c.model.as_str(), c.framework, c.recompute), ("deepseek-v2-lite", config::Framework::Torchtitan, config::Recompute::Op));
    assert!(trainmem::estimator::estimate(&c).is_ok(), "and estimated");
    let c = import(&[("job.toml", &toml.replace("16B", "671B"))]).expect("imports").config;
    assert_eq!((c.model.as_str(), c.framework), ("deepseek-v3", config::Framework::Hf));
    // torchtitan's Llama 4 flavors: Meta's preset without its q/k norm, NoPE layers and chunked
    // attention (the flavors have none), on torchtitan's own code (`torchtitan-llama4.json`).
    let toml = "[model]\nname = \"llama4\"\nflavor = \"17bx16e\"\n[activation_checkpoint]\nmode = \"full\"\n[parallelism]\ndata_parallel_shard_degree = 8\n";
    let c = import(&[("job.toml", toml)]).expect("imports").config;
    // Meta's preset with three keys changed: a custom shape (the share link carries it).
    assert_eq!((format!("{:?}", c.arch.family), c.arch.experts, c.framework), ("Llama4".to_string(), 16, config::Framework::Torchtitan));
    assert!(!c.arch.qk_l2_norm && !c.arch.nope_layers.contains(3) && !c.arch.window_layers.contains(0), "{:?}", c.arch.nope_layers);
    assert!(trainmem::estimator::estimate(&c).is_ok(), "and estimated");
    // The 405B preset: the float8 converter with FSDP2's float8 all-gather; compile of its
    // fully checkpointed tensor-parallel blocks is reported, not estimated.
    let c = recipe_of("torchtitan/llama3_405b.toml");
    assert_eq!((c.fp8, c.fp8_allgather, c.compile), (config::Fp8::TorchaoTensorwise, true, false));
    // torchtune's single-device full fine-tune, on torchtune's own Llama 3.1 code: its paged 8-bit
    // AdamW stepped in backward is read and estimated as it runs.
    let f = "torchtune/llama3_1_8B_full_single_device.yaml";
    let imp = import(&[(f, &read(f))]).expect("imports");
    let c = &imp.config;
    assert_eq!(
        (c.optim_in_bwd, c.optim, c.optim_paged, c.framework),
        (true, config::Optimizer::Adam8bit, true, config::Framework::Torchtune)
    );
    for key in ["optimizer_in_bwd", "optimizer._component_"] {
        let k = imp.keys.iter().find(|k| k.key == key).expect("reported");
        assert_eq!(k.status, Status::Understood, "{key}: {}", k.note);
    }
    assert!(imp.errors.is_empty(), "{:?}", imp.errors);
    // The distributed recipe runs torchtune's own code under its FSDP2, compiled too, full
    // fine-tune or LoRA (measured: tests/fixtures/pytorch/fsdp/tune.json).
    let c = recipe_of("torchtune/llama3_1_8B_full.yaml");
    assert_eq!((c.framework, c.zero, c.compile), (config::Framework::Torchtune, config::Zero::FullShard, false));
    let compiled = read("torchtune/llama3_1_8B_full.yaml").replace("compile: False", "compile: True");
    assert_ne!(compiled, read("torchtune/llama3_1_8B_full.yaml"), "the fixture sets compile");
    let c = import(&[("c.yaml", &compiled)]).expect("imports").config;
    assert_eq!((c.framework, c.compile), (config::Framework::Torchtune, true));
    assert!(trainmem::estimator::estimate(&Config { gpus: 8, ..c }).is_ok(), "estimated on 8 GPUs");
    let lora = read("torchtune/llama3_1_70B_lora.yaml").replace("compile: False", "compile: True");
    let c = import(&[("l.yaml", &lora)]).expect("imports").config;
    assert_eq!((c.framework, c.compile, c.zero), (config::Framework::Torchtune, true, config::Zero::FullShard));
    assert!(trainmem::estimator::estimate(&Config { gpus: 8, ..c }).is_ok(), "estimated on 8 GPUs");
    // Its distributed QLoRA (the 70B LoRA config on `qlora_llama3_1_70b`, as the 405B QLoRA
    // config builds it) stays on torchtune's own code too, compiled: measured on two CPU ranks
    // (tests/fixtures/pytorch/fsdp/tune.json, the qlora records).
    let qlora = lora.replace("torchtune.models.llama3_1.lora_llama3_1_70b", "torchtune.models.llama3_1.qlora_llama3_1_70b");
    assert_ne!(qlora, lora, "the fixture names the LoRA builder");
    let c = import(&[("q.yaml", &qlora)]).expect("imports").config;
    assert_eq!(
        (c.framework, c.finetune, c.qlora_quant, c.compile),
        (config::Framework::Torchtune, config::Finetune::Qlora, config::QloraQuant::TorchaoNf4, true)
    );
    assert!(trainmem::estimator::estimate(&Config { gpus: 8, ..c }).is_ok(), "estimated on 8 GPUs");
    // Its single-device QLoRA (`qlora_llama3_1_8b`: LoRALinear / FrozenNF4Linear on torchao's
    // NF4Tensor) runs on torchtune's own Llama 3.1 code, measured eager and compiled
    // (tests/fixtures/pytorch/frameworks/torchtune-llama3-qlora*.json); a QLoRA builder of a family
    // whose QLoRA is not measured (Mistral) stays on transformers' code.
    let c = recipe_of("torchtune/llama3_1_8B_qlora_single_device.yaml");
    assert_eq!(
        (c.finetune, c.qlora_quant, c.framework),
        (config::Finetune::Qlora, config::QloraQuant::TorchaoNf4, config::Framework::Torchtune)
    );
    let mistral = read("torchtune/llama3_1_8B_qlora_single_device.yaml")
        .replace("torchtune.models.llama3_1.qlora_llama3_1_8b", "torchtune.models.mistral.qlora_mistral_7b");
    let imp = import(&[("q.yaml", &mistral)]).expect("imports");
    assert_eq!(imp.config.framework, config::Framework::Hf, "{:?}", imp.config.model);
    // A litgpt full fine-tune on one device runs litgpt's own GPT; its 4-device preset is
    // sharded and stays on transformers' code.
    let yaml = "checkpoint_dir: checkpoints/meta-llama/Meta-Llama-3.1-8B\nprecision: bf16-true\ndevices: 1\ntrain:\n  micro_batch_size: 1\n  max_seq_length: 2048\n";
    assert_eq!(import(&[("full.yaml", yaml)]).expect("imports").config.framework, config::Framework::Litgpt);
    assert_eq!(recipe_of("litgpt/llama-3.1-8b-full.yaml").framework, config::Framework::Hf);
    // Its QLoRA (`quantize: bnb.nf4`) runs through Lightning's BitsandbytesPrecision: the LM
    // head 4-bit too, quantized from fp16; `fit` keeps the last micro-batch's logits until the
    // next forward returns. A bf16 LoRA sets neither.
    let qlora = "checkpoint_dir: checkpoints/meta-llama/Llama-2-7b-hf\nprecision: bf16-true\nquantize: bnb.nf4\ndevices: 1\nlora_r: 32\n";
    let c = import(&[("qlora.yaml", qlora)]).expect("imports").config;
    assert_eq!((c.finetune, c.qlora_double_quant, c.qlora_lightning, c.holds_prev_logits), (config::Finetune::Qlora, false, true, true));
    let c = import(&[("lora.yaml", &qlora.replace("quantize: bnb.nf4\n", ""))]).expect("imports").config;
    assert_eq!((c.finetune, c.qlora_lightning, c.holds_prev_logits), (config::Finetune::Lora, false, false));
    // A torchtitan job in fp32 without checkpointing, compiled, with rowwise float8 and the step
    // in backward.
    let toml = "[model]\nname = \"llama3\"\nflavor = \"8B\"\nconverters = [\"quantize.linear.float8\"]\n[training]\nmixed_precision_param = \"float32\"\n[optimizer]\nearly_step_in_backward = true\n[activation_checkpoint]\nmode = \"none\"\n[compile]\nenable = true\n[quantize.linear.float8]\nrecipe_name = \"rowwise\"\nfilter_fqns = [\"output\"]\n";
    let imp = import(&[("job.toml", toml)]).expect("imports");
    let c = &imp.config;
    assert_eq!(
        (c.compile, c.compile_regions, c.fp8, c.optim_in_bwd),
        (true, config::CompileRegions::Layer, config::Fp8::TorchaoRowwise, true)
    );
    assert_eq!(c.framework, config::Framework::Torchtitan, "compiled with rowwise float8 unchecked: torchtitan's own code, measured so");
    assert!(trainmem::estimator::estimate(c).is_ok(), "and estimated");
    // With FSDP2's float8 all-gather (tensorwise), compiled: torchtitan's own code as well,
    // tensor parallelism aside.
    // (torchtitan's converter reads the all-gather only without a `recipe_name`.)
    let gathered = toml.replace("recipe_name = \"rowwise\"", "enable_fsdp_float8_all_gather = true");
    let c = import(&[("job.toml", &gathered)]).expect("imports").config;
    assert_eq!((c.framework, c.fp8, c.fp8_allgather), (config::Framework::Torchtitan, config::Fp8::TorchaoTensorwise, true));
    let tp = gathered.replace("[training]\n", "[parallelism]\ntensor_parallel_degree = 2\n[training]\n");
    let c = import(&[("job.toml", &tp)]).expect("imports").config;
    assert_eq!(c.framework, config::Framework::Hf, "float8 all-gather with tensor parallelism, compiled: transformers' code");
    // Compiled and checkpointed (op-level SAC): torchtitan's own code too; the blocks alone
    // (`components = ["model"]`) are `compile_regions = block`.
    let imp = import(&[(
        "job.toml",
        "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"op\"\n[compile]\nenable = true\ncomponents = [\"model\"]\n",
    )])
    .expect("imports");
    let c = &imp.config;
    assert_eq!(
        (c.compile, c.compile_regions, c.recompute, c.framework),
        (true, config::CompileRegions::Block, config::Recompute::Op, config::Framework::Torchtitan)
    );
    // Compiled and fully checkpointed (with and without tensorwise float8), and compiled with
    // tensorwise float8 under op-level SAC: torchtitan's own code, estimated (FINDINGS §15.1).
    for toml in [
        "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[activation_checkpoint]\nmode = \"full\"\n[compile]\nenable = true\n",
        "[model]\nname = \"llama3\"\nflavor = \"8B\"\nconverters = [\"quantize.linear.float8\"]\n[activation_checkpoint]\nmode = \"full\"\n[compile]\nenable = true\n",
        "[model]\nname = \"llama3\"\nflavor = \"8B\"\nconverters = [\"quantize.linear.float8\"]\n[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"op\"\n[compile]\nenable = true\n",
    ] {
        let imp = import(&[("job.toml", toml)]).expect("imports");
        let c = &imp.config;
        assert_eq!((c.compile, c.framework), (true, config::Framework::Torchtitan), "{toml}");
        trainmem::estimator::estimate(c).unwrap_or_else(|e| panic!("{toml}: {e}"));
    }
    // torchtune's single-device full fine-tune compiled with checkpointing and its chunked loss:
    // its own Llama code, compiled as its recipe compiles it, estimated.
    let f = "torchtune/llama3_1_8B_full_single_device.yaml";
    let yaml = read(f)
        .replace("compile: False", "compile: True")
        .replace("enable_activation_checkpointing: False", "enable_activation_checkpointing: True");
    let imp = import(&[(f, &yaml)]).expect("imports");
    let c = &imp.config;
    assert_eq!(
        (c.compile, c.compile_regions, c.framework, c.recompute, c.loss),
        (true, config::CompileRegions::Layer, config::Framework::Torchtune, config::Recompute::Full, config::Loss::Chunked)
    );
    trainmem::estimator::estimate(c).unwrap_or_else(|e| panic!("{f} compiled: {e}"));
    // every-Nth-block selective checkpointing.
    let imp = import(&[(
        "job.toml",
        "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"3\"\n",
    )])
    .expect("imports");
    assert_eq!((imp.config.recompute, imp.config.recompute_every, imp.config.recompute_every_first), (config::Recompute::None, 3, false));
    // A Trainer JSON with whole-model compile: on the default Llama, full fine-tune, estimated
    // as one graph (measured so); with gradient checkpointing, reported unmodelled with the
    // estimator's reason and estimated eager (not as layer regions the Trainer does not compile),
    // the checkpointing kept — not an error of the file.
    let imp = import(&[("args.json", r#"{"per_device_train_batch_size": 1, "optim": "adamw_torch_fused", "torch_compile": true}"#)])
        .expect("imports");
    let compile = imp.keys.iter().find(|k| k.key == "torch_compile").expect("reported");
    assert_eq!(compile.status, Status::Understood, "{}", compile.note);
    assert_eq!((imp.config.compile, imp.config.compile_regions), (true, config::CompileRegions::Model));
    trainmem::estimator::estimate(&imp.config).unwrap_or_else(|e| panic!("whole-model compile: {e}"));
    let imp = import(&[(
        "args.json",
        r#"{"per_device_train_batch_size": 1, "optim": "adamw_torch_fused", "torch_compile": true, "gradient_checkpointing": true}"#,
    )])
    .expect("imports");
    let compile = imp.keys.iter().find(|k| k.key == "torch_compile").expect("reported");
    assert_eq!(compile.status, Status::Unmodelled, "{}", compile.note);
    assert!(compile.note.contains("torch.compile of the whole model") && compile.note.contains("estimated eager"), "{}", compile.note);
    assert_eq!((imp.config.compile, imp.config.recompute), (false, config::Recompute::Full));
    assert!(imp.errors.is_empty(), "a valid file is not an error: {:?}", imp.errors);
}

/// The estimator alone judges what it models with what: the import asks it about the whole
/// configuration and, where it refuses, lets torch.compile give way before the recomputation,
/// float8 or parallelism the file also asks for (and, for torchtitan's blocks compiled without
/// checkpointing, lets torchtitan's own code give way before compile).
#[test]
fn where_the_estimator_refuses_a_compiled_job_compile_gives_way_and_the_rest_of_the_file_is_kept() {
    let status = |imp: &trainmem::frameworks::Imported, key: &str| {
        imp.keys.iter().find(|k| k.key == key).map(|k| (k.status, k.note.clone(), k.set.clone())).expect("reported")
    };
    // Rowwise float8 in fully checkpointed blocks, compiled: the estimator refuses compile there
    // (FINDINGS §15.1); the float8 recipe and full recomputation stay, the blocks run eager on
    // torchtitan's own code.
    let toml = "[model]\nname = \"llama3\"\nflavor = \"8B\"\nconverters = [\"quantize.linear.float8\"]\n[activation_checkpoint]\nmode = \"full\"\n[compile]\nenable = true\n[quantize.linear.float8]\nrecipe_name = \"rowwise\"\nfilter_fqns = [\"output\"]\n";
    let imp = import(&[("job.toml", toml)]).expect("imports");
    let c = &imp.config;
    assert_eq!(
        (c.compile, c.fp8, c.recompute, c.framework),
        (false, config::Fp8::TorchaoRowwise, config::Recompute::Full, config::Framework::Torchtitan)
    );
    let (st, note, set) = status(&imp, "compile.enable");
    assert_eq!(st, Status::Unmodelled);
    assert!(
        note.contains("rowwise under full checkpointing") && note.ends_with("estimated eager (trainmem keeps compile=false)"),
        "{note}"
    );
    assert_eq!(set, "", "the report no longer claims compile=true");
    assert!(imp.errors.is_empty(), "{:?}", imp.errors);
    trainmem::estimator::estimate(c).unwrap_or_else(|e| panic!("{e}"));
    // Blocks alone compiled (`components = ["model"]`, torchtitan's regions), without
    // checkpointing, tensorwise float8 under tensor parallelism: torchtitan's own code is refused
    // for the float8 TP, transformers' code has no block regions; so the code and then compile
    // give way — never the float8, the TP or the regions swapped for layers the job does not
    // compile.
    let toml = "[model]\nname = \"llama3\"\nflavor = \"8B\"\nconverters = [\"quantize.linear.float8\"]\n[activation_checkpoint]\nmode = \"none\"\n[parallelism]\ndata_parallel_shard_degree = 8\ntensor_parallel_degree = 2\n[compile]\nenable = true\ncomponents = [\"model\"]\n[quantize.linear.float8]\nfilter_fqns = [\"output\"]\n";
    let imp = import(&[("job.toml", toml)]).expect("imports");
    let c = &imp.config;
    assert_eq!((c.compile, c.fp8, c.tp, c.framework), (false, config::Fp8::TorchaoTensorwise, 2, config::Framework::Hf));
    let (st, note, set) = status(&imp, "(model code)");
    assert_eq!(st, Status::Unmodelled);
    assert!(
        note.contains("float8 tensor parallelism") && note.ends_with("estimated on transformers' modeling code (framework=hf)"),
        "{note}"
    );
    assert!(set.ends_with("framework=hf"), "{set}");
    assert_eq!(status(&imp, "compile.enable").0, Status::Unmodelled);
    trainmem::estimator::estimate(c).unwrap_or_else(|e| panic!("{e}"));
    // The same job with each block and the loss compiled (layer regions): transformers' code
    // compiles them, so only the code gives way and the job stays compiled.
    let imp = import(&[("job.toml", &toml.replace("components = [\"model\"]\n", ""))]).expect("imports");
    let c = &imp.config;
    assert_eq!((c.compile, c.compile_regions, c.framework), (true, config::CompileRegions::Layer, config::Framework::Hf));
    assert_eq!(status(&imp, "compile.enable").0, Status::Understood);
    trainmem::estimator::estimate(c).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_torchtitan_pipeline_job_runs_its_local_batch_as_micro_batches_and_estimates_fsdp2_kept_gathered() {
    // torchtitan 0.2.2: n_microbatches = local_batch_size // pipeline_parallel_microbatch_size.
    let toml = "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[training]\nlocal_batch_size = 8\nseq_len = 4096\n\
                [activation_checkpoint]\nmode = \"full\"\n[parallelism]\ndata_parallel_shard_degree = 4\n\
                pipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 2\n";
    let imp = import(&[("job.toml", toml)]).expect("imports");
    let c = &imp.config;
    assert_eq!((c.batch, c.accum, c.pp, c.gpus, c.zero), (2, 4, 2, 8, config::Zero::FullShard));
    assert!(imp.errors.is_empty(), "{:?}", imp.errors);
    let e = trainmem::estimator::estimate(c).expect("torchtitan's FSDP2 under PP estimates");
    assert!(e.components.iter().any(|r| r.id == trainmem::estimator::ledger::RowId::GatheredStage), "the stage kept gathered");
    // The micro-batch left at its default (1): the default local batch of 8 is 8 micro-batches.
    let bare = "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[parallelism]\npipeline_parallel_degree = 4\n";
    let c = import(&[("job.toml", bare)]).expect("imports").config;
    assert_eq!((c.batch, c.accum, c.pp), (1, 8, 4));
    // A local batch the micro-batch does not divide is an error naming the key.
    let odd = toml.replace("local_batch_size = 8", "local_batch_size = 7");
    let imp = import(&[("job.toml", &odd)]).expect("imports the rest");
    assert!(imp.errors.iter().any(|e| e.to_string().contains("local_batch_size")), "{:?}", imp.errors);
}

#[test]
fn a_trainer_json_and_its_deepspeed_json_combine_in_either_order() {
    let trainer = r#"{"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "fp16": true, "gradient_checkpointing": true, "optim": "adamw_torch"}"#;
    // accelerate's ZeRO-2 template with its fp16 and accumulation left to the Trainer.
    let ds = read("accelerate/zero_stage2_config.json")
        .replace("\"enabled\": true", "\"enabled\": \"auto\"")
        .replace("\"gradient_accumulation_steps\": 1", "\"gradient_accumulation_steps\": \"auto\"");
    let a = import(&[("args.json", trainer), ("ds.json", &ds)]).expect("imports");
    let b = import(&[("ds.json", &ds), ("args.json", trainer)]).expect("imports");
    assert_eq!(a.config, b.config);
    let c = &a.config;
    assert_eq!((c.batch, c.accum, c.zero, c.precision), (4, 2, config::Zero::Z2, config::Precision::MixedFp16));
    assert_eq!(c.recompute, config::Recompute::Full);
}

fn roundtrip_configs(format: ExportFormat) -> Vec<Config> {
    let q = |s: &str| {
        let d = decode_query(s);
        assert_eq!(d.errors, vec![], "{s}");
        d.config
    };
    match format {
        ExportFormat::Torchtune => vec![
            q("recipe=torchtune-llama3.1-8b-full-single-device"),
            q("recipe=torchtune-llama3.1-8b-lora-single-device&seq=2048&lora_dropout=0.05"),
            q("recipe=torchtune-llama3.1-8b-qlora-single-device&seq=4096&lora_rank=16&lora_targets=q,k,v,o"),
            // A distributed LoRA on torchtune's own Qwen2 code under its FSDP2.
            q("model=qwen2.5-7b&framework=torchtune&precision=bf16&finetune=lora&lora_dtype=model&lora_rank=32&lora_targets=all&recompute=full&batch=4&attn=sdpa&loss=chunked&optim_impl=foreach&gpus=8&zero=full_shard"),
        ],
        ExportFormat::Torchtitan => vec![
            q("recipe=torchtitan-llama3-8b&gpus=64"),
            q("recipe=torchtitan-llama3-405b&gpus=512"),
            q("model=llama-3.1-8b&framework=torchtitan&gpus=8&zero=full_shard&recompute=none&recompute_every=2&fp8=torchao-rowwise&alloc_conf=expandable_segments:True"),
            q("model=llama-3.1-8b&framework=torchtitan&gpus=1&precision=fp32&optim_in_bwd=true&compile=true&seq=2048&alloc_conf=expandable_segments:True"),
            q("recipe=torchtitan-llama3-70b&gpus=256&tp=8&accum=2&recompute=full"),
            q("model=qwen3-32b&framework=torchtitan&gpus=16&zero=hybrid_shard&shard_group=8&seq=4096&batch=2&recompute=none&optim_impl=foreach&alloc_conf=expandable_segments:True"),
            // Pipeline parallelism with FSDP2: the local batch as `accum` micro-batches of `batch`.
            q("model=llama-3.1-8b&framework=torchtitan&gpus=16&pp=4&zero=full_shard&batch=2&accum=8&recompute=full&alloc_conf=expandable_segments:True"),
            // Interleaved 1F1B: torchtitan's two stages per rank.
            q("model=llama-3.1-8b&framework=torchtitan&gpus=16&pp=4&vpp=2&zero=full_shard&batch=1&accum=8&recompute=full&alloc_conf=expandable_segments:True"),
        ],
        ExportFormat::AccelerateDeepspeed => vec![
            q("gpus=8&zero=3&batch=2&accum=4"),
            q("gpus=16&zero=2&precision=mixed-fp16&offload=optimizer"),
            q("gpus=4&zero=3&offload=optimizer%2Bparams&batch=1"),
            // accelerate's dynamo_backend: INDUCTOR compiles the whole model.
            q("gpus=8&zero=3&batch=2&compile=true&compile_regions=model"),
        ],
        ExportFormat::Megatron => vec![
            q("recipe=megatron-lm-llama3-8b-fp8&accum=1&precision=mixed-bf16-fp32grad"),
            q("model=llama-3.1-70b&framework=megatron&attn=flash&gpus=64&tp=8&pp=4&vpp=5&sp=true&zero=1&precision=mixed-bf16-fp32grad&recompute=selective&seq=8192&accum=16"),
            q("model=llama-3.1-8b&framework=megatron&attn=flash&gpus=8&tp=2&cp=2&sp=true&zero=1&precision=mixed-bf16&recompute=full&batch=2"),
            // Transformer Engine's per-layer offloading: --cpu-offloading-num-layers.
            q("model=llama-3.1-8b&framework=megatron&attn=flash&gpus=8&tp=2&sp=true&zero=1&precision=mixed-bf16&act_offload_layers=8&seq=8192"),
            // The block method: --recompute-method block --recompute-num-layers 3.
            q("model=llama-3.1-8b&framework=megatron&attn=flash&gpus=8&tp=2&pp=2&sp=true&zero=1&precision=mixed-bf16&recompute=full&recompute_layers=3&accum=4"),
        ],
    }
}

#[test]
fn every_export_format_round_trips_import_export_import() {
    for format in ExportFormat::ALL {
        for cfg in roundtrip_configs(format) {
            let files = export_files(&cfg, format);
            let texts: Vec<(&str, &str)> = files.iter().map(|f| (f.name.as_str(), f.text.as_str())).collect();
            let imp = import(&texts).unwrap_or_else(|e| panic!("{}: {e}\n{}", format.name(), export(&cfg, format)));
            // What the file fixes (the rest of the configuration is the script's business).
            let back = apply_over(&cfg, &imp);
            assert_eq!(imp.errors, vec![], "{}", format.name());
            assert_eq!(encode_query(&back), encode_query(&cfg), "{}:\n{}", format.name(), export(&cfg, format));
            // And again: export → import is a fixed point.
            let again = export_files(&back, format);
            assert_eq!(again, files, "{}", format.name());
        }
    }
}

/// `cfg` with an import applied on top.
fn apply_over(cfg: &Config, imp: &trainmem::frameworks::Imported) -> Config {
    trainmem::frameworks::apply(cfg, imp)
}

#[test]
fn accelerates_inductor_backend_compiles_the_whole_model_and_its_regional_compilation_is_named_unmodelled() {
    let yaml = |dynamo: &str| {
        format!("distributed_type: DEEPSPEED\nnum_processes: 8\ndeepspeed_config:\n  zero_stage: 3\ndynamo_config:\n{dynamo}")
    };
    let key = |imp: &trainmem::frameworks::Imported, k: &str| imp.keys.iter().find(|r| r.key == k).cloned().expect("reported");
    // accelerate 1.15 Accelerator.prepare_model: torch.compile(model) — one graph, as the Trainer's.
    let imp = import(&[("accelerate.yaml", &yaml("  dynamo_backend: INDUCTOR\n  dynamo_mode: default\n"))]).expect("imports");
    let k = key(&imp, "dynamo_config.dynamo_backend");
    assert_eq!((k.status, k.set.as_str()), (Status::Understood, "compile=true&compile_regions=model"), "{}", k.note);
    assert_eq!((imp.config.compile, imp.config.compile_regions), (true, config::CompileRegions::Model));
    assert_eq!(key(&imp, "dynamo_config.dynamo_mode").status, Status::Ignored);
    // Regional compilation leaves the loss eager: none of trainmem's regions, so nothing is set.
    let imp =
        import(&[("accelerate.yaml", &yaml("  dynamo_backend: INDUCTOR\n  dynamo_use_regional_compilation: true\n"))]).expect("imports");
    let k = key(&imp, "dynamo_config.dynamo_backend");
    assert_eq!(k.status, Status::Unmodelled);
    assert!(k.note.contains("loss eager"), "{}", k.note);
    assert!(!imp.config.compile);
    assert_eq!(key(&imp, "dynamo_config.dynamo_use_regional_compilation").status, Status::Understood);
    // Another backend, and CUDA graphs, are named too; none is an error of the file.
    let imp = import(&[("accelerate.yaml", &yaml("  dynamo_backend: AOT_EAGER\n  dynamo_mode: reduce-overhead\n"))]).expect("imports");
    assert_eq!(key(&imp, "dynamo_config.dynamo_backend").status, Status::Unmodelled);
    assert_eq!(key(&imp, "dynamo_config.dynamo_mode").status, Status::Unmodelled);
    assert!(imp.errors.is_empty(), "{:?}", imp.errors);
    let imp = import(&[("accelerate.yaml", &yaml("  dynamo_backend: NO\n"))]).expect("imports");
    assert_eq!(key(&imp, "dynamo_config.dynamo_backend").status, Status::Ignored);
    assert!(!imp.config.compile);
}

#[test]
fn every_nth_layer_checkpointing_is_said_in_a_comment_where_a_format_cannot_set_it() {
    let cfg = decode_query("gpus=8&zero=3&recompute_every=4").config;
    for (format, nearest) in [
        (ExportFormat::Torchtune, "enable_activation_checkpointing"),
        (ExportFormat::AccelerateDeepspeed, "torch.utils.checkpoint"),
        // 32 layers, one stage: 8 of them checkpointed, as every 4th.
        (ExportFormat::Megatron, "--recompute-method block --recompute-num-layers 8"),
    ] {
        let text = export(&cfg, format);
        let line = text
            .lines()
            .find(|l| l.contains("recompute_every=4") && !l.contains("trainmem: ?"))
            .unwrap_or_else(|| panic!("{}:\n{text}", format.name()));
        assert!(line.trim_start().starts_with('#') && line.contains(nearest), "{}: {line}", format.name());
    }
    // torchtitan says it with its own key.
    assert!(export(&cfg, ExportFormat::Torchtitan).contains("selective_ac_option = \"4\""));
}

#[test]
fn exports_carry_only_memory_keys_each_commented() {
    let cfg = decode_query("recipe=torchtune-llama3.1-8b-qlora-single-device").config;
    let yaml = export(&cfg, ExportFormat::Torchtune);
    for line in yaml.lines().filter(|l| !l.trim_start().starts_with('#') && l.contains(": ") && !l.trim_end().ends_with(':')) {
        assert!(line.contains('#'), "uncommented: {line}");
    }
    assert!(yaml.contains("quantize_base: True"));
    let pair = export(&decode_query("gpus=8&zero=3").config, ExportFormat::AccelerateDeepspeed);
    assert!(pair.contains("==> accelerate_config.yaml <==") && pair.contains("==> ds_config.json <=="));
}

// ---------------------------------------------------------------------------------------------
// Fuzz: a seeded mutator over the fixture files.

/// xorshift64*: a reproducible stream without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const HOSTILE: &[&str] = &[
    "-1",
    "0",
    "1e400",
    "NaN",
    ".inf",
    "null",
    "~",
    "true",
    "\"auto\"",
    "[]",
    "{}",
    "[1, [2]]",
    "99999999999999999999999",
    "'",
    "\"",
    "\\",
    "\t",
    "{{",
    "]]",
    "0x10",
    "8k",
    "full_shard",
    "bf16",
    "- a",
    "*anchor",
    "&a",
    "!!binary x",
    "%YAML 1.2",
    "---",
    "...",
    "\u{0}",
    "é✓",
    "=",
    ":",
    "[[x]]",
    "--",
];

fn mutate(text: &str, rng: &mut Rng) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let n = 1 + rng.below(3);
    for _ in 0..n {
        if lines.is_empty() {
            lines.push(String::new());
        }
        let i = rng.below(lines.len());
        match rng.below(9) {
            0 => {
                lines.remove(i);
            }
            1 => {
                let l = lines[i].clone();
                lines.insert(i, l);
            }
            2 => {
                // Replace a value (after ':' or '=' or a flag) with something hostile.
                let l = &lines[i];
                let cut = l.find([':', '=']).map(|p| p + 1).or_else(|| l.find(' ')).unwrap_or(l.len());
                let h = HOSTILE[rng.below(HOSTILE.len())];
                lines[i] = format!("{} {h}", &l[..cut]);
            }
            3 => {
                // Flip one character.
                let chars: Vec<char> = lines[i].chars().collect();
                if !chars.is_empty() {
                    let j = rng.below(chars.len());
                    let c = HOSTILE[rng.below(HOSTILE.len())].chars().next().unwrap_or('x');
                    lines[i] = chars[..j].iter().chain(std::iter::once(&c)).chain(chars[j + 1..].iter()).collect();
                }
            }
            4 => lines.truncate(i),
            5 => {
                // Re-indent.
                lines[i] = format!("{}{}", " ".repeat(rng.below(6)), lines[i].trim_start());
            }
            6 => {
                let j = rng.below(lines.len());
                lines.swap(i, j);
            }
            7 => {
                let h = HOSTILE[rng.below(HOSTILE.len())];
                lines.insert(i, h.to_string());
            }
            _ => {
                // Deep nesting.
                let depth = rng.below(200);
                lines.insert(i, format!("{}{}", "[".repeat(depth), "]".repeat(rng.below(depth + 1))));
            }
        }
    }
    lines.join("\n")
}

#[test]
fn a_hundred_thousand_mutated_files_never_panic_and_every_error_names_its_key_or_line() {
    let cases: usize = std::env::var("TRAINMEM_FRAMEWORK_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let sources: Vec<(String, String)> = all_fixtures().into_iter().map(|(f, _)| (f.clone(), read(&f))).collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut ok, mut refused, mut invalid) = (0usize, 0usize, 0usize);
    for case in 0..cases {
        let (name, text) = &sources[case % sources.len()];
        let mutated = mutate(text, &mut rng);
        match import(&[(name, &mutated)]) {
            Ok(imp) => {
                ok += 1;
                assert!(trainmem::estimator::validate_consistency(&imp.config).is_ok(), "case {case}: {name}");
                for e in &imp.errors {
                    invalid += 1;
                    let ImportError::Value { key, .. } = e else { panic!("case {case}: {e}") };
                    assert!(e.to_string().contains(&format!("`{key}`")), "case {case}: {e}");
                }
                assert_eq!(config::decode_query(&imp.query).config, imp.config, "case {case}: {name}");
            }
            Err(e) => {
                refused += 1;
                let msg = e.to_string();
                let names = match &e {
                    ImportError::Syntax { line, .. } => line.is_some() || msg.contains("near `"),
                    ImportError::Format { .. } => msg.contains('`') || msg.contains("empty"),
                    ImportError::Value { key, .. } => msg.contains(key.as_str()),
                    ImportError::NoFiles => false,
                };
                if !names {
                    std::fs::write(std::env::temp_dir().join("trainmem-fuzz-case.txt"), &mutated).ok();
                }
                assert!(names, "case {case} ({name}): the error names no key or line: {msg}");
                assert!(msg.starts_with(name.as_str()), "case {case}: {msg}");
            }
        }
    }
    eprintln!("{cases} mutated files: {ok} imported ({invalid} invalid keys reported), {refused} refused");
    assert!(ok > cases / 10 && refused > 0);
}

#[test]
#[ignore = "prints the recipe table's pairs from the fixtures"]
fn print_recipe_pairs() {
    for r in RECIPES {
        let texts: Vec<(String, String)> = r.fixtures.iter().map(|f| (f.to_string(), read(f))).collect();
        let files: Vec<(&str, &str)> = texts.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect();
        let imp = import(&files).unwrap_or_else(|e| panic!("{}: {e}", r.id));
        let pairs: Vec<String> = imp.pairs.iter().map(|(k, v)| format!("(\"{k}\", \"{v}\")")).collect();
        println!("PAIRS {} {}", r.id, pairs.join(", "));
        for e in &imp.errors {
            println!("ERR {} {e}", r.id);
        }
        for k in imp.keys.iter().filter(|k| k.status == Status::Unknown) {
            println!("UNKNOWN {} {}", r.id, k.key);
        }
    }
}

#[test]
fn megatrons_cpu_offloading_of_n_layers_reads_as_act_offload_layers_from_its_flags_and_bridges_yaml() {
    let args = "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 \\\n  --num-attention-heads 32 --group-query-attention --num-query-groups 8 --seq-length 8192 --micro-batch-size 1 --bf16 \\\n  --cpu-offloading --cpu-offloading-num-layers 6\n";
    let imp = import(&[("run.sh", args)]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(imp.config.act_offload_layers, 6, "{:?}", imp.keys);
    let yaml = "model:\n  num_layers: 32\n  cpu_offloading: true\n  cpu_offloading_num_layers: 4\nddp:\n  use_distributed_optimizer: true\ntrain:\n  micro_batch_size: 1\n";
    let imp = import(&[("bridge.yaml", yaml)]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(imp.config.act_offload_layers, 4, "{:?}", imp.keys);
    // Without cpu_offloading the block wraps nothing.
    let off = yaml.replace("cpu_offloading: true", "cpu_offloading: false");
    let imp = import(&[("bridge.yaml", off.as_str())]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(imp.config.act_offload_layers, 0, "{:?}", imp.keys);
}

#[test]
fn megatrons_block_recomputation_reads_as_recompute_layers_from_its_flags_and_bridges_yaml() {
    let args = |method: &str, n: u64| {
        format!(
            "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 \\\n  --num-attention-heads 32 --group-query-attention --num-query-groups 8 --seq-length 8192 --micro-batch-size 1 --bf16 \\\n  --recompute-granularity full --recompute-method {method} --recompute-num-layers {n}\n"
        )
    };
    let key = |imp: &trainmem::frameworks::Imported, k: &str| imp.keys.iter().find(|r| r.key == k).cloned().expect("reported");
    let imp = import(&[("run.sh", args("block", 6).as_str())]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((imp.config.recompute, imp.config.recompute_layers), (config::Recompute::Full, 6), "{:?}", imp.keys);
    // One layer a uniform chunk is per-layer recomputation; larger chunks are estimated so, and
    // the report says it is an approximation.
    let imp = import(&[("run.sh", args("uniform", 1).as_str())]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((imp.config.recompute, imp.config.recompute_layers), (config::Recompute::Full, 0));
    let imp = import(&[("run.sh", args("uniform", 4).as_str())]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((imp.config.recompute, imp.config.recompute_layers), (config::Recompute::Full, 0));
    assert!(key(&imp, "--recompute-granularity").note.contains("chunks"), "{:?}", key(&imp, "--recompute-granularity"));
    let yaml = "model:\n  num_layers: 32\n  recompute_granularity: full\n  recompute_method: block\n  recompute_num_layers: 2\nddp:\n  use_distributed_optimizer: true\ntrain:\n  micro_batch_size: 1\n";
    let imp = import(&[("bridge.yaml", yaml)]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((imp.config.recompute, imp.config.recompute_layers), (config::Recompute::Full, 2), "{:?}", imp.keys);
}
