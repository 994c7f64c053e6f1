//! GPU catalog: the memory each card offers to a process, as the driver reports it.
//!
//! Capacities are the "Total" of `nvidia-smi` (or `rocm-smi` for AMD) in MiB — what CUDA can
//! hand out, which is a little under the marketing figure in GB for some cards (an "80 GB" H100
//! reports 81,559 MiB ≈ 85.5 × 10⁹ bytes; an "80 GB" A100 81,920 MiB).

use serde::Serialize;

pub const MIB: u128 = 1 << 20;
pub const GIB: u128 = 1 << 30;

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Gpu {
    pub id: &'static str,
    pub name: &'static str,
    /// Memory the driver reports, MiB.
    pub mib: u64,
    /// Dense bf16 tensor-core throughput, TFLOP/s (for the step-time hint in charts).
    pub bf16_tflops: u32,
}

impl Gpu {
    pub fn bytes(&self) -> u128 {
        self.mib as u128 * MIB
    }
}

/// The catalog, in the order the picker lists it.
pub const GPUS: &[Gpu] = &[
    Gpu { id: "h100-80gb", name: "NVIDIA H100 80 GB (SXM)", mib: 81_559, bf16_tflops: 989 },
    Gpu { id: "h200", name: "NVIDIA H200 141 GB", mib: 143_771, bf16_tflops: 989 },
    Gpu { id: "b200", name: "NVIDIA B200 180 GB", mib: 183_359, bf16_tflops: 2250 },
    Gpu { id: "a100-80gb", name: "NVIDIA A100 80 GB", mib: 81_920, bf16_tflops: 312 },
    Gpu { id: "a100-40gb", name: "NVIDIA A100 40 GB", mib: 40_960, bf16_tflops: 312 },
    Gpu { id: "l40s", name: "NVIDIA L40S 48 GB", mib: 46_068, bf16_tflops: 362 },
    Gpu { id: "rtx-4090", name: "NVIDIA GeForce RTX 4090 24 GB", mib: 24_564, bf16_tflops: 165 },
    Gpu { id: "rtx-3090", name: "NVIDIA GeForce RTX 3090 24 GB", mib: 24_576, bf16_tflops: 71 },
    Gpu { id: "mi300x", name: "AMD Instinct MI300X 192 GB", mib: 196_608, bf16_tflops: 1307 },
];

/// Looks a GPU up by id (case-insensitive).
pub fn gpu(id: &str) -> Option<Gpu> {
    GPUS.iter().copied().find(|g| g.id.eq_ignore_ascii_case(id))
}

/// Capacity of a custom GPU given in GiB (negative or non-finite values give 0).
pub fn custom_bytes(gib: f64) -> u128 {
    if gib.is_finite() && gib > 0.0 {
        (gib * GIB as f64) as u128
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_has_every_gpu_the_picker_promises() {
        for id in ["h100-80gb", "h200", "b200", "a100-80gb", "a100-40gb", "l40s", "rtx-4090", "rtx-3090", "mi300x"] {
            assert!(gpu(id).is_some(), "{id}");
        }
    }

    #[test]
    fn an_80_gb_a100_reports_exactly_80_gib() {
        assert_eq!(gpu("a100-80gb").map(|g| g.bytes()), Some(80 * GIB));
    }

    #[test]
    fn custom_capacity_rejects_nonsense_without_panicking() {
        assert_eq!(custom_bytes(-1.0), 0);
        assert_eq!(custom_bytes(f64::NAN), 0);
        assert_eq!(custom_bytes(24.0), 24 * GIB);
    }
}
