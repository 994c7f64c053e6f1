//! Precision recipes: how many bytes each parameter costs in each role.

use super::config::Precision;
use serde::Serialize;

pub const FP32_BYTES: u64 = 4;
pub const BF16_BYTES: u64 = 2;
pub const FP16_BYTES: u64 = 2;
pub const FP8_BYTES: u64 = 1;
/// Token ids and labels are `torch.long`.
pub const INT64_BYTES: u64 = 8;
/// A CUDA `torch.bool` mask element (dropout's mask on CUDA).
pub const BOOL_BYTES: u64 = 1;

/// Transformer Engine keeps an fp8 copy of each weight for the forward GEMM and, on Hopper, a
/// transposed fp8 copy for the backward GEMMs (`Float8Tensor` row-wise + column-wise data,
/// transformer_engine/pytorch/module/linear.py): 1 + 1 bytes per parameter.
pub const FP8_WEIGHT_CACHE_BYTES: u64 = 2;

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Fp32,
    Bf16,
    Fp16,
    Fp8,
}

impl Dtype {
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Fp32 => FP32_BYTES,
            Dtype::Bf16 => BF16_BYTES,
            Dtype::Fp16 => FP16_BYTES,
            Dtype::Fp8 => FP8_BYTES,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Fp32 => "fp32",
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
            Dtype::Fp8 => "fp8",
        }
    }
}

/// Bytes per parameter of a recipe, by role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Recipe {
    /// The weights the model computes with.
    pub weight: Dtype,
    /// `param.grad` (or Megatron's main-grad buffer).
    pub grad: Dtype,
    /// fp32 master copy held by the optimizer; `None` when the weights are the master.
    pub master: Option<Dtype>,
    /// Optimizer states (moments) live in this type: the parameter's own type in plain
    /// PyTorch, fp32 next to a master copy.
    pub state: Dtype,
    /// Activations are produced in this type.
    pub compute: Dtype,
    /// `torch.autocast` casts each fp32 weight to the compute type once per forward and keeps
    /// the cast for backward (the autocast weight cache, aten/src/ATen/autocast_mode.cpp).
    pub autocast_weight_copy: bool,
    /// Transformer Engine fp8 weight copies (see [`FP8_WEIGHT_CACHE_BYTES`]).
    pub fp8_weight_cache: bool,
    /// Where the recipe comes from.
    pub source: &'static str,
}

impl Recipe {
    /// Bytes per trainable parameter for weights + gradients + master (no optimizer states).
    pub fn bytes_before_states(&self) -> u64 {
        self.weight.bytes() + self.grad.bytes() + self.master.map_or(0, Dtype::bytes)
    }
}

/// The recipe of a `precision` value.
pub fn recipe(p: Precision) -> Recipe {
    use Dtype::*;
    let r = |weight, grad, master, state, compute, source| Recipe {
        weight,
        grad,
        master,
        state,
        compute,
        autocast_weight_copy: false,
        fp8_weight_cache: false,
        source,
    };
    match p {
        Precision::Fp32 => r(Fp32, Fp32, None, Fp32, Fp32, "plain PyTorch fp32 training"),
        Precision::Bf16 => r(
            Bf16,
            Bf16,
            None,
            Bf16,
            Bf16,
            "model.to(torch.bfloat16); torch.optim keeps states in the parameter dtype (torch/optim/adamw.py)",
        ),
        Precision::Fp16 => r(Fp16, Fp16, None, Fp16, Fp16, "model.half() with torch.optim"),
        Precision::AmpBf16 => Recipe {
            autocast_weight_copy: true,
            ..r(Fp32, Fp32, None, Fp32, Bf16, "torch.autocast(dtype=torch.bfloat16) over an fp32 model (PyTorch AMP docs)")
        },
        Precision::AmpFp16 => Recipe {
            autocast_weight_copy: true,
            ..r(Fp32, Fp32, None, Fp32, Fp16, "torch.autocast(dtype=torch.float16) + GradScaler (PyTorch AMP docs)")
        },
        Precision::MixedBf16 => {
            r(Bf16, Bf16, Some(Fp32), Fp32, Bf16, "Rajbhandari et al. 2020 (ZeRO), §3: 2 + 2 + K bytes/param, K = 12 for Adam")
        }
        Precision::MixedFp16 => r(Fp16, Fp16, Some(Fp32), Fp32, Fp16, "Micikevicius et al. 2018; ZeRO §3 (2 + 2 + K)Ψ"),
        Precision::MixedBf16Fp32grad => r(
            Bf16,
            Fp32,
            Some(Fp32),
            Fp32,
            Bf16,
            "Megatron-LM: 18 bytes/param (Korthikanti et al. 2022 §5; megatron/training/theoretical_memory_usage.py)",
        ),
        Precision::MixedFp8 => Recipe {
            fp8_weight_cache: true,
            ..r(Bf16, Fp32, Some(Fp32), Fp32, Bf16, "Megatron-LM + Transformer Engine fp8 (delayed scaling); GEMM inputs saved in fp8")
        },
    }
}

/// The recipe of the trainable parameters of `cfg`: `recipe` itself, except that peft
/// (`lora_dtype = fp32`) gives a LoRA or QLoRA model's adapters fp32 weights where the base
/// runs in a 16-bit dtype without a master copy (`get_peft_model(autocast_adapter_dtype=True)`,
/// peft 0.21 `tuners_utils.py _cast_adapter_dtype`; measured: tests/fixtures/pytorch/qlora and
/// lora, 74,752 B of fp32 adapters on the bf16 base), so their gradients and optimizer states
/// are fp32 too. torchtune's and litgpt's adapters (`lora_dtype = model`) keep the recipe.
pub fn trainable_recipe(cfg: &super::config::Config, recipe: &Recipe) -> Recipe {
    use super::config::{Finetune, LoraDtype};
    let adapters_fp32 = cfg.finetune != Finetune::Full
        && cfg.lora_dtype == LoraDtype::Fp32
        && recipe.master.is_none()
        && recipe.weight.bytes() < FP32_BYTES;
    if adapters_fp32 {
        Recipe { weight: Dtype::Fp32, grad: Dtype::Fp32, state: Dtype::Fp32, ..*recipe }
    } else {
        *recipe
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_precision_with_adam_costs_sixteen_bytes_per_parameter() {
        // 2 (bf16 weight) + 2 (bf16 grad) + 4 (fp32 master) + 2 × 4 (fp32 m, v) = 16.
        let r = recipe(Precision::MixedBf16);
        assert_eq!(r.bytes_before_states() + 2 * r.state.bytes(), 16);
    }

    #[test]
    fn megatrons_recipe_costs_eighteen_bytes_per_parameter() {
        let r = recipe(Precision::MixedBf16Fp32grad);
        assert_eq!(r.bytes_before_states() + 2 * r.state.bytes(), 18);
    }

    #[test]
    fn pure_bf16_keeps_adam_states_in_bf16() {
        let r = recipe(Precision::Bf16);
        assert_eq!(r.bytes_before_states() + 2 * r.state.bytes(), 8);
    }

    #[test]
    fn only_autocast_recipes_keep_weight_casts() {
        assert!(recipe(Precision::AmpBf16).autocast_weight_copy);
        assert!(!recipe(Precision::MixedBf16).autocast_weight_copy);
    }
}
