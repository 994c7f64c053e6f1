//! The storage formats of the KV cache and of served weights: bits per value, and the scales a
//! quantized format keeps beside its values. Every byte count is exact in integers: `n` values
//! take `⌈n · bits / 8⌉` bytes plus one scale per group of `group` values plus the per-tensor
//! scales.

use crate::estimator::serve_config::{KvDtype, WeightDtype};

/// Bits of one FP8 (e4m3) or INT8 value.
pub const BITS_8: u64 = 8;
/// Bits of one FP4 (e2m1) or INT4 value.
pub const BITS_4: u64 = 4;
/// Bytes of an FP32 scale.
pub const FP32_SCALE_BYTES: u64 = 4;
/// Bytes of an FP16 scale (AWQ/GPTQ group scales).
pub const FP16_SCALE_BYTES: u64 = 2;
/// Bytes of an FP8 e4m3 scale (NVFP4's block scales) or an E8M0 exponent (MXFP4's).
pub const BYTE_SCALE_BYTES: u64 = 1;
/// NVFP4's block: one e4m3 scale per 16 values (NVIDIA, "Introducing NVFP4", 2025; TensorRT
/// Model Optimizer `NVFP4QTensor`).
pub const NVFP4_BLOCK: u64 = 16;
/// MXFP4's block: one E8M0 scale per 32 values (OCP Microscaling Formats spec v1.0; gpt-oss's
/// `*_blocks` / `*_scales` tensors).
pub const MXFP4_BLOCK: u64 = 32;
/// AWQ's and GPTQ's usual quantization group (`group_size` 128 in their `quantization_config`).
pub const INT4_GROUP: u64 = 128;
/// DeepSeek-V3's FP8 block (`weight_block_size` [128, 128]): one FP32 scale per 128 × 128 tile.
pub const FP8_BLOCK: u64 = 128;

/// How the values of one tensor are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    /// Bits per value.
    pub bits: u64,
    /// Values sharing one group scale (0 = no group scales).
    pub group: u64,
    /// Bytes of one group scale.
    pub group_scale_bytes: u64,
    /// Bytes of the scales kept once per tensor (per layer's K and V for a KV cache).
    pub tensor_scale_bytes: u64,
    /// The name shown in formulas.
    pub name: &'static str,
}

impl Format {
    /// A plain format of `bytes` per value and no scales (fp32 = 4, bf16 = 2).
    pub const fn plain(bytes: u64, name: &'static str) -> Format {
        Format { bits: bytes * 8, group: 0, group_scale_bytes: 0, tensor_scale_bytes: 0, name }
    }

    /// Bytes of `n` values, their group scales included (per-tensor scales are not: they are
    /// counted once per tensor by the caller).
    pub fn bytes(&self, n: u64) -> u64 {
        let values = (n * self.bits).div_ceil(8);
        let scales = if self.group > 0 { n.div_ceil(self.group) * self.group_scale_bytes } else { 0 };
        values + scales
    }
}

/// bf16, 2 bytes.
pub const BF16: Format = Format::plain(2, "bf16");
/// fp16, 2 bytes.
pub const FP16: Format = Format::plain(2, "fp16");

impl KvDtype {
    /// The cache's format, `model` being the served model's 16-bit format (`auto`).
    pub fn format(self, model: Format) -> Format {
        match self {
            KvDtype::Auto => model,
            KvDtype::Bf16 => BF16,
            KvDtype::Fp16 => FP16,
            // One FP32 scale for K and one for V per layer (vLLM `k_scale`/`v_scale`,
            // transformers `Fp8QuantizedLayer`'s frozen per-tensor scale).
            KvDtype::Fp8 => Format { bits: BITS_8, group: 0, group_scale_bytes: 0, tensor_scale_bytes: FP32_SCALE_BYTES, name: "fp8" },
            KvDtype::Int8 => Format { bits: BITS_8, group: 0, group_scale_bytes: 0, tensor_scale_bytes: FP32_SCALE_BYTES, name: "int8" },
            KvDtype::Nvfp4 => Format {
                bits: BITS_4,
                group: NVFP4_BLOCK,
                group_scale_bytes: BYTE_SCALE_BYTES,
                tensor_scale_bytes: FP32_SCALE_BYTES,
                name: "nvfp4",
            },
        }
    }
}

impl WeightDtype {
    /// The 16-bit format of everything that is not quantized (and of activations).
    pub fn model_format(self) -> Format {
        if self == WeightDtype::Fp16 {
            FP16
        } else {
            BF16
        }
    }

    /// Whether the format quantizes the linear layers (embedding, norms, router and — unless
    /// tied — the LM head stay 16-bit, as every one of these checkpoint formats keeps them).
    pub fn quantized(self) -> bool {
        !matches!(self, WeightDtype::Auto | WeightDtype::Bf16 | WeightDtype::Fp16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_count_their_group_scales() {
        assert_eq!(BF16.bytes(10), 20);
        let fp4 = KvDtype::Nvfp4.format(BF16);
        // 32 values: 16 bytes of nibbles and 2 one-byte scales.
        assert_eq!(fp4.bytes(32), 18);
        // 17 values: 9 bytes (rounded up) and 2 scales.
        assert_eq!(fp4.bytes(17), 11);
        assert_eq!(KvDtype::Fp8.format(BF16).bytes(128), 128);
        assert_eq!(KvDtype::Auto.format(FP16), FP16);
    }

    #[test]
    fn only_the_quantized_weight_formats_say_so() {
        assert!(!WeightDtype::Auto.quantized());
        assert!(WeightDtype::Mxfp4.quantized());
        assert_eq!(WeightDtype::Fp16.model_format(), FP16);
    }
}
