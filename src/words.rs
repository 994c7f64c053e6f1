//! Words for what the page shows, shared by the panels so that each figure reads the same
//! wherever it appears:
//!
//! - [`verdict`]: the verdict's one line (what is trained, whether it fits, by how much), decided
//!   on the figure the verdict uses ([`Estimate::fits`], [`Estimate::headroom`]: nvidia-smi
//!   against the usable capacity) — the verdict panel, the compare cards and the snapshot all
//!   write it through here;
//! - [`choice_label`]: a human label for every enumerated value of the form (the id stays beside
//!   it in small type);
//! - [`gpu_short`], [`marketed_gb`], [`capacity_note`]: a GPU's marketed size beside the memory a
//!   process can use, and why the two differ;
//! - [`count_of`]: "1 GPU", "8 GPUs".

use crate::config::{Config, Finetune, Unit};
use crate::estimator::gpu::{Gpu, MemorySource, GIB};
use crate::estimator::ledger::Bytes;
use crate::estimator::units::format_bytes;
use crate::estimator::Estimate;

pub use crate::estimator::analyse::{headroom_pct, TIGHT_PCT};

/// What is trained, for the verdict: "Full fine-tuning", "LoRA (rank 16)".
pub fn trained(cfg: &Config) -> String {
    match cfg.finetune {
        Finetune::Full => "Full fine-tuning".into(),
        Finetune::Lora => format!("LoRA (rank {})", cfg.lora_rank),
        Finetune::Qlora => format!("QLoRA (4-bit base, rank {})", cfg.lora_rank),
    }
}

/// The verdict of an estimate in one line, and how it decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub fits: bool,
    /// Fits with less than [`TIGHT_PCT`] of the capacity to spare.
    pub tight: bool,
    /// Bytes free at the peak (negative: missing), on the deciding figure.
    pub headroom: i128,
    /// "Full fine-tuning fits on NVIDIA H100 80 GB (SXM): 12.3 GB headroom (nvidia-smi)".
    pub headline: String,
}

/// The verdict of `e` for `cfg` on `gpu` (its label), in `cfg`'s unit.
pub fn verdict(e: &Estimate, cfg: &Config, gpu: &str) -> Verdict {
    let fits = e.fits();
    let headroom = e.headroom();
    let basis = match (e.loading_decides(), e.memory.nvidia_smi.is_some()) {
        (true, true) => " (nvidia-smi while loading the model)",
        (true, false) => " (while loading the model)",
        (false, true) => " (nvidia-smi)",
        (false, false) => "",
    };
    let what = trained(cfg);
    let amount = format_bytes(headroom.unsigned_abs(), cfg.unit);
    let headline = if fits {
        format!("{what} fits on {gpu}: {amount} headroom{basis}")
    } else {
        format!("{what} does not fit on {gpu}: needs {amount} more{basis}")
    };
    let tight = crate::estimator::Verdict::of(e).tight;
    Verdict { fits, tight, headroom, headline }
}

/// "1 GPU", "8 GPUs", "1 virtual stage".
pub fn count_of(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A human label for an enumerated value of the form (`None`: the id says it already, or the
/// key has no words here).
pub fn choice_label(key: &str, value: &str) -> Option<&'static str> {
    Some(match (key, value) {
        ("precision", "fp32") => "fp32 everything",
        ("precision", "bf16") => "bf16 everything, no master copy",
        ("precision", "fp16") => "fp16 everything, no master copy",
        ("precision", "amp-bf16") => "fp32 weights, bf16 autocast",
        ("precision", "amp-fp16") => "fp32 weights, fp16 autocast",
        ("precision", "mixed-bf16") => "bf16 weights + grads, fp32 master",
        ("precision", "mixed-fp16") => "fp16 weights + grads, fp32 master",
        ("precision", "mixed-bf16-fp32grad") => "bf16 weights, fp32 master + grads",
        ("precision", "mixed-fp8") => "fp8 matmuls, fp32 master + grads",
        ("optim", "sgd") => "SGD (no state)",
        ("optim", "momentum") => "SGD with momentum",
        ("optim", "adamw") => "AdamW",
        ("optim", "adafactor") => "Adafactor (factored moments)",
        ("optim", "lion") => "Lion (one moment)",
        ("optim", "adam8bit") => "8-bit Adam (bitsandbytes)",
        ("optim", "muon") => "Muon",
        ("lora_dtype", "fp32") => "fp32 adapters (peft)",
        ("lora_dtype", "model") => "model dtype (torchtune, litgpt)",
        ("optim_impl", "foreach") => "foreach (batched over tensors)",
        ("optim_impl", "fused") => "fused (one kernel)",
        ("optim_impl", "forloop") => "for-loop (tensor by tensor)",
        ("finetune", "full") => "full fine-tuning",
        ("finetune", "lora") => "LoRA adapters",
        ("finetune", "qlora") => "QLoRA (4-bit base)",
        ("attn", "eager") => "eager (scores kept)",
        ("attn", "sdpa") => "SDPA (PyTorch, fused)",
        ("attn", "flash") => "FlashAttention 2",
        ("recompute", "none") => "none (keep activations)",
        ("recompute", "selective") => "selective (attention)",
        ("recompute", "full") => "full (every layer)",
        ("recompute", "op") => "by op (torchtitan SAC)",
        ("act_offload", "none") => "off",
        ("act_offload", "torchtune") => "torchtune (≥ 1 KiB, not weights)",
        ("act_offload", "save_on_cpu") => "save_on_cpu (every saved tensor)",
        ("compile_regions", "layer") => "each layer + loss (torchtune)",
        ("compile_regions", "block") => "each block (torchtitan)",
        ("compile_regions", "model") => "whole model (Trainer)",
        ("loss", "standard") => "standard (whole logits)",
        ("loss", "chunked") => "chunked logits",
        ("framework", "hf") => "Hugging Face transformers",
        ("framework", "megatron") => "Megatron-LM",
        ("framework", "torchtune") => "torchtune 0.6.1 (its Llama 3)",
        ("framework", "torchtitan") => "torchtitan 0.2.2 (its Llama 3)",
        ("framework", "litgpt") => "litgpt 0.5.13 (its GPT, Llama 3)",
        ("kernels", "cuda") => "CUDA",
        ("kernels", "cpu") => "CPU (validation fixtures)",
        ("zero", "0") => "none (DDP, replicated)",
        ("zero", "1") => "ZeRO-1 (optimizer states)",
        ("zero", "2") => "ZeRO-2 (+ gradients)",
        ("zero", "3") => "ZeRO-3 (+ parameters)",
        ("zero", "full_shard") => "FSDP full shard",
        ("zero", "shard_grad_op") => "FSDP grads + states",
        ("zero", "hybrid_shard") => "FSDP hybrid (per group)",
        ("offload", "none") => "none",
        ("offload", "optimizer") => "optimizer states",
        ("offload", "optimizer+params") => "optimizer + parameters",
        ("interconnect", "ib-xdr") => "InfiniBand XDR, 800 Gb/s",
        ("interconnect", "ib-ndr") => "InfiniBand NDR, 400 Gb/s",
        ("interconnect", "ib-hdr") => "InfiniBand HDR, 200 Gb/s",
        ("interconnect", "roce-400") => "RoCE, 400 Gb/s a node",
        ("interconnect", "eth-100") => "Ethernet, 100 Gb/s a node",
        ("interconnect", "eth-25") => "Ethernet, 25 Gb/s a node",
        ("unit", "gb") => "GB (10⁹ bytes)",
        ("unit", "gib") => "GiB (2³⁰ bytes)",
        ("mode", "train") => "training (the step)",
        ("mode", "serve") => "serving (KV cache, engine)",
        ("engine", "vllm") => "vLLM",
        ("engine", "sglang") => "SGLang",
        ("engine", "trtllm") => "TensorRT-LLM",
        ("engine", "transformers") => "transformers generate()",
        ("kv_dtype", "auto") => "the model's dtype",
        ("kv_dtype", "bf16") => "bf16",
        ("kv_dtype", "fp16") => "fp16",
        ("kv_dtype", "fp8") => "fp8 (per-tensor scale)",
        ("kv_dtype", "int8") => "int8 (with scales)",
        ("kv_dtype", "nvfp4") => "NVFP4 (4-bit, block scales)",
        ("mamba_ssm_cache_dtype", "auto") => "the engine's default",
        ("mamba_ssm_cache_dtype", "float32") => "fp32",
        ("mamba_ssm_cache_dtype", "bfloat16") => "bf16",
        ("mamba_ssm_cache_dtype", "float16") => "fp16",
        ("mamba_ssm_dtype", "auto") => "none named",
        ("mamba_ssm_dtype", "float32") => "fp32",
        ("mamba_ssm_dtype", "bfloat16") => "bf16",
        ("mamba_ssm_dtype", "float16") => "fp16",
        ("weight_dtype", "auto") => "the checkpoint's dtype",
        ("weight_dtype", "bf16") => "bf16",
        ("weight_dtype", "fp16") => "fp16",
        ("weight_dtype", "fp8") => "fp8 (per-tensor scale)",
        ("weight_dtype", "fp8-block") => "fp8 (128×128 block scales)",
        ("weight_dtype", "int8") => "int8 (W8A8)",
        ("weight_dtype", "int4-awq") => "int4 AWQ",
        ("weight_dtype", "int4-gptq") => "int4 GPTQ",
        ("weight_dtype", "nvfp4") => "NVFP4 (4-bit, block scales)",
        ("weight_dtype", "mxfp4") => "MXFP4 (gpt-oss experts)",
        ("fp8", "none") => "none (16-bit GEMMs)",
        ("fp8", "torchao-tensorwise") => "torchao, per-tensor scales",
        ("fp8", "torchao-rowwise") => "torchao, per-row scales",
        ("fp8", "te-delayed") => "Transformer Engine, delayed",
        ("fp8", "te-current") => "Transformer Engine, current",
        ("fp8", "te-mxfp8") => "Transformer Engine, MXFP8",
        ("qlora_quant", "nf4") => "NF4 (bitsandbytes)",
        ("qlora_quant", "gptq") => "int4 GPTQ/AWQ",
        ("qlora_quant", "torchao-nf4") => "NF4Tensor (torchao, torchtune)",
        ("load", "from-pretrained") => "from_pretrained (device_map)",
        ("load", "quantize-on-load") => "load, then quantize (NF4)",
        ("load", "meta-sharded") => "meta device, sharded load",
        ("load", "zero-init") => "DeepSpeed zero.Init",
        ("family", t) => return crate::estimator::family::Family::from_model_type(t).map(|f| f.label()),
        ("recipe", id) => return crate::config::recipes::recipe(id).map(|r| r.title),
        ("mlp", "plain") => "plain (2 matrices)",
        ("mlp", "gated") => "gated (3: SwiGLU, GeGLU)",
        ("act", "silu") => "SiLU",
        ("act", "gelu") => "GELU",
        ("act", "gelu-tanh") => "GELU (tanh approx.)",
        ("act", "gelu-new") => "GELU (GPT-2's)",
        ("act", "relu") => "ReLU",
        ("act", "swiglu-clamped") => "SwiGLU, clamped",
        ("act", "xielu") => "xIELU (Apertus's)",
        ("norm", "layernorm") => "LayerNorm",
        ("norm", "layernorm-nobias") => "LayerNorm, no bias",
        ("norm", "rmsnorm") => "RMSNorm",
        ("norm", "rmsnorm-gemma") => "RMSNorm (1 + weight)",
        ("norm", "nonparametric") => "LayerNorm, no weights",
        ("qk_norm", "none") => "none",
        ("qk_norm", "head") => "one per head dim",
        ("qk_norm", "full") => "over all heads",
        ("qk_norm", "per-head") => "one per head",
        ("pos", "rope") => "RoPE",
        ("pos", "learned") => "learned table",
        ("pos", "none") => "none",
        ("window_kind", "sliding") => "sliding window",
        ("window_kind", "chunked") => "chunks",
        ("router", "softmax") => "softmax, then top-k",
        ("router", "topk-softmax") => "top-k, then softmax",
        ("router", "sigmoid") => "sigmoid, then top-k",
        ("router", "topk-sigmoid") => "top-k, then sigmoid",
        _ => return None,
    })
}

/// An option's text: the human label, else the id itself.
pub fn option_text(key: &str, value: &str) -> String {
    choice_label(key, value).map_or_else(|| value.to_string(), str::to_string)
}

/// The marketed size in the card's name, in GB as its maker prints it ("… 80 GB (SXM)" → 80).
pub fn marketed_gb(name: &str) -> Option<u32> {
    let words: Vec<&str> = name.split_whitespace().collect();
    words.windows(2).rev().find(|w| w[1] == "GB").and_then(|w| w[0].parse().ok())
}

/// The card's short name for its option: without the maker and the notes in brackets
/// ("NVIDIA H100 80 GB (SXM)" → "H100 80 GB"), so that no select cuts it off.
pub fn gpu_short(g: &Gpu) -> String {
    let mut s = g.name.strip_prefix("NVIDIA ").or_else(|| g.name.strip_prefix("AMD ")).unwrap_or(g.name).to_string();
    while let (Some(a), Some(b)) = (s.find(" ("), s.find(')')) {
        if b < a {
            break;
        }
        s.replace_range(a..=b, "");
    }
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The line under the GPU field: the card, its marketed size beside the memory a process can use
/// in the page's unit, and why they differ.
pub fn capacity_note(gpu: Option<&Gpu>, custom_gib: f64, unit: Unit) -> String {
    let Some(g) = gpu else {
        let bytes = (custom_gib * GIB as f64).round() as Bytes;
        return format!(
            "A custom card of {custom_gib} GiB: {} usable (the whole size; a real card's nvidia-smi total is a little less).",
            format_bytes(bytes, unit)
        );
    };
    let usable = format_bytes(g.bytes(), unit);
    let marketed = marketed_gb(g.name).map_or_else(String::new, |m| format!(", sold as {m} GB"));
    let source = match g.mib_source {
        MemorySource::Observed(_) => "nvidia-smi's total",
        MemorySource::Datasheet => "the datasheet's size (no nvidia-smi line found)",
    };
    format!(
        "{}{marketed}: {usable} usable — {source}, {} MiB. Makers count the size in binary units less what the driver and ECC keep, and GB = 10⁹ bytes reads larger than GiB = 2³⁰ (the unit switch).",
        g.name,
        crate::estimator::expr::group_digits(g.mib as u128)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KEYS;
    use crate::estimator::gpu::GPUS;

    #[test]
    fn every_enumerated_value_of_the_form_has_short_words() {
        for k in KEYS.iter() {
            let choices = (k.choices)();
            // The model, the card, the family and the recipe have names of their own.
            if choices.is_empty() || choices == ["false", "true"] || matches!(k.name, "model" | "gpu" | "family" | "recipe") {
                continue;
            }
            for c in choices {
                let label = choice_label(k.name, c).unwrap_or_else(|| panic!("{}={c} has no words", k.name));
                // Short enough for a select in the form's column on a phone (~300 px of text).
                assert!(label.chars().count() <= 34, "{}={c}: '{label}' is long", k.name);
            }
        }
    }

    #[test]
    fn every_card_has_a_marketed_size_and_a_short_name() {
        for g in GPUS {
            assert!(marketed_gb(g.name).is_some(), "{}", g.name);
            let short = gpu_short(g);
            assert!(short.chars().count() <= 24 && short.contains("GB"), "{short}");
        }
        let h100 = GPUS.iter().find(|g| g.id == "h100-80gb").unwrap();
        assert_eq!(gpu_short(h100), "H100 80 GB");
        assert_eq!(marketed_gb(h100.name), Some(80));
        let note = capacity_note(Some(h100), 0.0, Unit::Gib);
        assert!(note.contains("sold as 80 GB") && note.contains("79.65 GiB usable") && note.contains("81,559 MiB"), "{note}");
    }

    #[test]
    fn counts_agree_with_their_number() {
        assert_eq!(count_of(1, "GPU", "GPUs"), "1 GPU");
        assert_eq!(count_of(8, "GPU", "GPUs"), "8 GPUs");
    }
}
