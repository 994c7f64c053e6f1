//! Recipe presets (`recipe=`): every knob as a framework's shipped config sets it. Each names
//! the file and version it comes from; `tests/frameworks.rs` imports that file (committed under
//! `tests/fixtures/frameworks/`) and checks that it gives exactly these pairs. A recipe applies
//! before every other key of a link (like `model=`), so `?recipe=…&batch=4` is the recipe with
//! batch 4. Links spell a recipe's keys out (the `recipe` key reads back empty). It sets only the keys its file decides: the GPU type, the overhead assumptions and
//! — where the file names none — the model are left as they are.

use super::keys::KEYS;
use crate::estimator::config::Config;

/// One recipe preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recipe {
    pub id: &'static str,
    /// The framework whose config it is.
    pub framework: &'static str,
    pub title: &'static str,
    /// The repository, the version (tag) and the file.
    pub repo: &'static str,
    pub version: &'static str,
    pub path: &'static str,
    /// The committed copies under `tests/fixtures/frameworks/` the test imports (several for
    /// files that combine).
    pub fixtures: &'static [&'static str],
    /// The configuration keys it sets, in order.
    pub pairs: &'static [(&'static str, &'static str)],
}

/// Every recipe preset.
pub static RECIPES: &[Recipe] = &[
    Recipe {
        id: "torchtitan-llama3-8b",
        framework: "torchtitan",
        title: "Llama 3 8B pre-training (torchtitan's preset for 64 A100s)",
        repo: "pytorch/torchtitan",
        version: "v0.2.2",
        path: "torchtitan/models/llama3/train_configs/llama3_8b.toml",
        fixtures: &["torchtitan/llama3_8b.toml"],
        pairs: &[
            ("recompute", "none"),
            ("model", "llama-3.1-8b"),
            ("optim", "adamw"),
            ("cp", "1"),
            ("zero", "full_shard"),
            ("pp", "1"),
            ("tp", "1"),
            ("sp", "false"),
            ("batch", "1"),
            ("seq", "8192"),
            ("precision", "mixed-bf16"),
            ("optim_impl", "fused"),
            ("attn", "sdpa"),
            ("loss", "standard"),
        ],
    },
    Recipe {
        id: "torchtitan-llama3-70b",
        framework: "torchtitan",
        title: "Llama 3 70B pre-training",
        repo: "pytorch/torchtitan",
        version: "v0.2.2",
        path: "torchtitan/models/llama3/train_configs/llama3_70b.toml",
        fixtures: &["torchtitan/llama3_70b.toml"],
        pairs: &[
            ("recompute", "full"),
            ("model", "llama-3.1-70b"),
            ("optim", "adamw"),
            ("cp", "1"),
            ("zero", "full_shard"),
            ("pp", "1"),
            ("tp", "8"),
            ("sp", "true"),
            ("batch", "8"),
            ("seq", "8192"),
            ("precision", "mixed-bf16"),
            ("optim_impl", "fused"),
            ("attn", "sdpa"),
            ("loss", "standard"),
            ("gpus", "8"),
        ],
    },
    Recipe {
        id: "torchtitan-llama3-405b",
        framework: "torchtitan",
        title: "Llama 3 405B pre-training",
        repo: "pytorch/torchtitan",
        version: "v0.2.2",
        path: "torchtitan/models/llama3/train_configs/llama3_405b.toml",
        fixtures: &["torchtitan/llama3_405b.toml"],
        pairs: &[
            ("recompute", "full"),
            ("model", "llama-3.1-405b"),
            ("optim", "adamw"),
            ("cp", "1"),
            ("zero", "full_shard"),
            ("pp", "1"),
            ("tp", "8"),
            ("sp", "true"),
            ("batch", "2"),
            ("seq", "8192"),
            ("precision", "mixed-bf16"),
            ("optim_impl", "fused"),
            ("attn", "sdpa"),
            ("loss", "standard"),
            ("gpus", "8"),
        ],
    },
    Recipe {
        id: "torchtitan-qwen3-32b",
        framework: "torchtitan",
        title: "Qwen3 32B pre-training",
        repo: "pytorch/torchtitan",
        version: "v0.2.2",
        path: "torchtitan/models/qwen3/train_configs/qwen3_32b.toml",
        fixtures: &["torchtitan/qwen3_32b.toml"],
        pairs: &[
            ("recompute", "full"),
            ("model", "qwen3-32b"),
            ("optim", "adamw"),
            ("cp", "1"),
            ("zero", "full_shard"),
            ("tp", "1"),
            ("sp", "false"),
            ("batch", "2"),
            ("seq", "4096"),
            ("precision", "mixed-bf16"),
            ("optim_impl", "fused"),
            ("attn", "sdpa"),
            ("loss", "standard"),
        ],
    },
    Recipe {
        id: "torchtune-llama3.1-8b-full-single-device",
        framework: "torchtune",
        title: "Llama 3.1 8B full fine-tune on one GPU",
        repo: "pytorch/torchtune",
        version: "v0.6.1",
        path: "recipes/configs/llama3_1/8B_full_single_device.yaml",
        fixtures: &["torchtune/llama3_1_8B_full_single_device.yaml"],
        pairs: &[
            ("batch", "2"),
            ("precision", "bf16"),
            ("recompute", "full"),
            ("accum", "1"),
            ("loss", "chunked"),
            ("model", "llama-3.1-8b"),
            ("finetune", "full"),
            ("optim", "adam8bit"),
            ("attn", "sdpa"),
        ],
    },
    Recipe {
        id: "torchtune-llama3.1-8b-lora-single-device",
        framework: "torchtune",
        title: "Llama 3.1 8B LoRA on one GPU",
        repo: "pytorch/torchtune",
        version: "v0.6.1",
        path: "recipes/configs/llama3_1/8B_lora_single_device.yaml",
        fixtures: &["torchtune/llama3_1_8B_lora_single_device.yaml"],
        pairs: &[
            ("batch", "2"),
            ("precision", "bf16"),
            ("recompute", "full"),
            ("accum", "8"),
            ("loss", "chunked"),
            ("model", "llama-3.1-8b"),
            ("finetune", "lora"),
            ("lora_rank", "8"),
            ("optim", "adamw"),
            ("optim_impl", "fused"),
            ("lora_targets", "q,v,o,gate,up,down"),
            ("attn", "sdpa"),
        ],
    },
    Recipe {
        id: "torchtune-llama3.1-8b-qlora-single-device",
        framework: "torchtune",
        title: "Llama 3.1 8B QLoRA on one GPU",
        repo: "pytorch/torchtune",
        version: "v0.6.1",
        path: "recipes/configs/llama3_1/8B_qlora_single_device.yaml",
        fixtures: &["torchtune/llama3_1_8B_qlora_single_device.yaml"],
        pairs: &[
            ("batch", "2"),
            ("precision", "bf16"),
            ("recompute", "full"),
            ("accum", "8"),
            ("loss", "chunked"),
            ("model", "llama-3.1-8b"),
            ("finetune", "qlora"),
            ("lora_rank", "8"),
            ("optim", "adamw"),
            ("optim_impl", "fused"),
            ("lora_targets", "q,v,o,gate,up,down"),
            ("attn", "sdpa"),
        ],
    },
    Recipe {
        id: "torchtune-llama3.1-8b-full",
        framework: "torchtune",
        title: "Llama 3.1 8B full fine-tune, distributed (FSDP2)",
        repo: "pytorch/torchtune",
        version: "v0.6.1",
        path: "recipes/configs/llama3_1/8B_full.yaml",
        fixtures: &["torchtune/llama3_1_8B_full.yaml"],
        pairs: &[
            ("batch", "2"),
            ("precision", "bf16"),
            ("recompute", "full"),
            ("accum", "1"),
            ("loss", "chunked"),
            ("model", "llama-3.1-8b"),
            ("finetune", "full"),
            ("optim", "adamw"),
            ("optim_impl", "fused"),
            ("zero", "full_shard"),
            ("attn", "sdpa"),
        ],
    },
    Recipe {
        id: "torchtune-llama3.1-70b-lora",
        framework: "torchtune",
        title: "Llama 3.1 70B LoRA, distributed (FSDP2)",
        repo: "pytorch/torchtune",
        version: "v0.6.1",
        path: "recipes/configs/llama3_1/70B_lora.yaml",
        fixtures: &["torchtune/llama3_1_70B_lora.yaml"],
        pairs: &[
            ("batch", "2"),
            ("precision", "bf16"),
            ("recompute", "full"),
            ("accum", "1"),
            ("loss", "chunked"),
            ("model", "llama-3.1-70b"),
            ("finetune", "lora"),
            ("lora_rank", "16"),
            ("optim", "adamw"),
            ("optim_impl", "fused"),
            ("lora_targets", "q,v,o,gate,up,down"),
            ("attn", "sdpa"),
        ],
    },
    Recipe {
        id: "trainer-peft-lora",
        framework: "trainer",
        title: "Trainer + PEFT LoRA, every argument at its default",
        repo: "huggingface/transformers + huggingface/peft",
        version: "5.24.0 + 0.21.2",
        path: "TrainingArguments(output_dir=...).to_dict() + LoraConfig(task_type=\"CAUSAL_LM\").to_dict()",
        fixtures: &["trainer/training_args.json", "trainer/adapter_config.json"],
        pairs: &[
            ("accum", "1"),
            ("recompute", "none"),
            ("optim", "adamw"),
            ("optim_impl", "fused"),
            ("batch", "8"),
            ("precision", "bf16"),
            ("finetune", "lora"),
            ("lora_rank", "8"),
            ("lora_targets", "q,v"),
        ],
    },
    Recipe {
        id: "deepspeed-zero3",
        framework: "deepspeed",
        title: "DeepSpeed's ZeRO-3 example config (bf16)",
        repo: "deepspeedai/DeepSpeed",
        version: "v0.19.5",
        path: "examples/sdma_allgather/ds_config_zero3.json",
        fixtures: &["deepspeed/ds_config_zero3.json"],
        pairs: &[("precision", "mixed-bf16"), ("accum", "1"), ("optim", "adamw"), ("optim_impl", "fused"), ("batch", "1"), ("zero", "3")],
    },
    Recipe {
        id: "accelerate-deepspeed-zero3-offload",
        framework: "accelerate",
        title: "accelerate's ZeRO-3 CPU-offload DeepSpeed template (fp16)",
        repo: "huggingface/accelerate",
        version: "v1.14.0",
        path: "examples/deepspeed_config_templates/zero_stage3_offload_config.json",
        fixtures: &["accelerate/zero_stage3_offload_config.json"],
        pairs: &[
            ("precision", "mixed-fp16"),
            ("accum", "1"),
            ("optim", "adamw"),
            ("optim_impl", "fused"),
            ("offload", "optimizer+params"),
            ("zero", "3"),
        ],
    },
    Recipe {
        id: "accelerate-fsdp",
        framework: "accelerate",
        title: "accelerate's FSDP template (FULL_SHARD, bf16, 2 GPUs)",
        repo: "huggingface/accelerate",
        version: "v1.14.0",
        path: "examples/config_yaml_templates/fsdp.yaml",
        fixtures: &["accelerate/fsdp.yaml"],
        pairs: &[("prefetch_layers", "2"), ("zero", "full_shard"), ("precision", "mixed-bf16"), ("gpus", "2")],
    },
    Recipe {
        id: "axolotl-llama3-qlora",
        framework: "axolotl",
        title: "axolotl's Llama 3 8B QLoRA example",
        repo: "axolotl-ai-cloud/axolotl",
        version: "v0.18.0",
        path: "examples/llama-3/qlora.yml",
        fixtures: &["axolotl/llama-3-qlora.yml"],
        pairs: &[
            ("finetune", "qlora"),
            ("attn", "flash"),
            ("model", "llama-3.1-8b"),
            ("precision", "bf16"),
            ("accum", "4"),
            ("recompute", "full"),
            ("lora_rank", "32"),
            ("lora_targets", "all"),
            ("batch", "2"),
            ("optim", "adamw"),
            ("seq", "4096"),
        ],
    },
    Recipe {
        id: "axolotl-llama3-lora-8b",
        framework: "axolotl",
        title: "axolotl's Llama 3 8B LoRA example (8-bit base)",
        repo: "axolotl-ai-cloud/axolotl",
        version: "v0.18.0",
        path: "examples/llama-3/lora-8b.yml",
        fixtures: &["axolotl/llama-3-lora-8b.yml"],
        pairs: &[
            ("finetune", "lora"),
            ("attn", "flash"),
            ("model", "llama-3.1-8b"),
            ("precision", "bf16"),
            ("accum", "4"),
            ("recompute", "full"),
            ("lora_rank", "32"),
            ("lora_targets", "all"),
            ("batch", "2"),
            ("optim", "adam8bit"),
            ("seq", "4096"),
        ],
    },
    Recipe {
        id: "axolotl-llama3-fft-8b",
        framework: "axolotl",
        title: "axolotl's Llama 3.1 8B full fine-tune example",
        repo: "axolotl-ai-cloud/axolotl",
        version: "v0.18.0",
        path: "examples/llama-3/fft-8b.yaml",
        fixtures: &["axolotl/llama-3-fft-8b.yaml"],
        pairs: &[
            ("attn", "flash"),
            ("model", "llama-3.1-8b"),
            ("precision", "bf16"),
            ("accum", "8"),
            ("recompute", "full"),
            ("batch", "1"),
            ("optim", "adam8bit"),
            ("seq", "8192"),
            ("finetune", "full"),
        ],
    },
    Recipe {
        id: "litgpt-llama3.1-8b-full",
        framework: "litgpt",
        title: "litgpt's Llama 3.1 8B full fine-tune (4 GPUs)",
        repo: "Lightning-AI/litgpt",
        version: "v0.5.13",
        path: "config_hub/finetune/llama-3.1-8b/full.yaml",
        fixtures: &["litgpt/llama-3.1-8b-full.yaml"],
        pairs: &[
            ("model", "llama-3.1-8b"),
            ("gpus", "4"),
            ("optim", "adamw"),
            ("optim_impl", "foreach"),
            ("precision", "bf16"),
            ("accum", "4"),
            ("seq", "512"),
            ("batch", "4"),
            ("finetune", "full"),
            ("zero", "full_shard"),
            ("recompute", "full"),
            ("attn", "sdpa"),
        ],
    },
    Recipe {
        id: "litgpt-llama3.1-8b-lora",
        framework: "litgpt",
        title: "litgpt's Llama 3.1 8B LoRA",
        repo: "Lightning-AI/litgpt",
        version: "v0.5.13",
        path: "config_hub/finetune/llama-3.1-8b/lora.yaml",
        fixtures: &["litgpt/llama-3.1-8b-lora.yaml"],
        pairs: &[
            ("model", "llama-3.1-8b"),
            ("gpus", "1"),
            ("lora_rank", "32"),
            ("optim", "adamw"),
            ("optim_impl", "foreach"),
            ("precision", "bf16"),
            ("accum", "8"),
            ("seq", "512"),
            ("batch", "1"),
            ("finetune", "lora"),
            ("lora_targets", "q,v"),
            ("zero", "0"),
            ("recompute", "none"),
            ("attn", "sdpa"),
        ],
    },
    Recipe {
        id: "litgpt-llama3.1-8b-qlora",
        framework: "litgpt",
        title: "litgpt's Llama 3.1 8B QLoRA",
        repo: "Lightning-AI/litgpt",
        version: "v0.5.13",
        path: "config_hub/finetune/llama-3.1-8b/qlora.yaml",
        fixtures: &["litgpt/llama-3.1-8b-qlora.yaml"],
        pairs: &[
            ("model", "llama-3.1-8b"),
            ("gpus", "1"),
            ("lora_rank", "32"),
            ("optim", "adamw"),
            ("optim_impl", "foreach"),
            ("precision", "bf16"),
            ("finetune", "qlora"),
            ("accum", "4"),
            ("seq", "512"),
            ("batch", "2"),
            ("lora_targets", "q,v"),
            ("zero", "0"),
            ("recompute", "none"),
            ("attn", "sdpa"),
        ],
    },
    Recipe {
        id: "megatron-bridge-llama3-8b",
        framework: "megatron-bridge",
        title: "Megatron-Bridge's Llama 3 8B pre-training recipe (2 H100s, CP 2)",
        repo: "NVIDIA-NeMo/Megatron-Bridge",
        version: "v0.6.0",
        path: "src/megatron/bridge/recipes/llama/h100/llama3.py (llama3_8b_pretrain_2gpu_h100_bf16_config)",
        fixtures: &["megatron_bridge/llama3_8b_pretrain_2gpu_h100_bf16.yaml"],
        pairs: &[
            ("precision", "mixed-bf16-fp32grad"),
            ("cp", "2"),
            ("pp", "1"),
            ("recompute", "none"),
            ("seq", "8192"),
            ("sp", "false"),
            ("tp", "1"),
            ("vpp", "1"),
            ("model", "llama-3.1-8b"),
            ("optim", "adamw"),
            ("optim_impl", "fused"),
            ("zero", "1"),
            ("accum", "512"),
            ("batch", "1"),
            ("framework", "megatron"),
            ("attn", "flash"),
            ("gpus", "2"),
        ],
    },
    Recipe {
        id: "megatron-lm-llama3-8b-fp8",
        framework: "megatron-lm",
        title: "Megatron-LM's Llama 3 8B FP8 example (8 H100s)",
        repo: "NVIDIA/Megatron-LM",
        version: "core_v0.19.0",
        path: "examples/llama/train_llama3_8b_h100_fp8.sh",
        fixtures: &["megatron_lm/train_llama3_8b_h100_fp8.args"],
        pairs: &[
            ("gpus", "8"),
            ("seq", "8192"),
            ("batch", "1"),
            ("accum", "16"),
            ("zero", "1"),
            ("precision", "mixed-fp8"),
            ("tp", "1"),
            ("cp", "1"),
            ("sp", "true"),
            ("model", "llama-3.1-8b"),
            ("framework", "megatron"),
            ("attn", "flash"),
            ("recompute", "none"),
            ("pp", "1"),
        ],
    },
];

/// The recipe called `id`.
pub fn recipe(id: &str) -> Option<&'static Recipe> {
    let id = id.trim().to_ascii_lowercase();
    RECIPES.iter().find(|r| r.id == id)
}

/// Sets every key of the recipe on `cfg`; the recipe is checked whole first, so a failure
/// leaves `cfg` unchanged.
pub fn apply(cfg: &mut Config, r: &Recipe) -> Result<(), String> {
    let mut next = cfg.clone();
    for (k, v) in r.pairs {
        let key = KEYS.iter().find(|key| key.name == *k).ok_or_else(|| format!("names an unknown key {k}"))?;
        (key.set)(&mut next, v).map_err(|e| format!("{k}={v}: {e}"))?;
    }
    *cfg = next;
    Ok(())
}

/// The first recipe whose every key has its value in `cfg` (for a page that shows which recipe
/// the configuration still is).
pub fn matching_recipe(cfg: &Config) -> Option<&'static Recipe> {
    RECIPES.iter().find(|r| {
        let mut c = cfg.clone();
        apply(&mut c, r).is_ok() && c == *cfg
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recipe_applies_cleanly_and_is_found_again() {
        for r in RECIPES {
            let mut c = Config::default();
            assert_eq!(apply(&mut c, r), Ok(()), "{}", r.id);
            assert!(crate::estimator::validate_consistency(&c).is_ok(), "{}", r.id);
            assert!(matching_recipe(&c).is_some(), "{}", r.id);
        }
    }

    #[test]
    fn no_recipe_matches_the_default_configuration() {
        assert_eq!(matching_recipe(&Config::default()), None);
    }

    #[test]
    fn recipe_ids_are_unique() {
        let mut ids: Vec<&str> = RECIPES.iter().map(|r| r.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), RECIPES.len());
    }
}
