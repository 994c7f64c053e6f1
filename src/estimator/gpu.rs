//! GPU catalog: what each card offers a training run — the memory a process can use, and the
//! bandwidths and tensor throughput the planner's cost model ([`super::cost`]) needs.
//!
//! # Memory
//! Capacities are the "Total" of `nvidia-smi` (or `rocm-smi` for AMD) in MiB — what CUDA can hand
//! out, which is a little under the marketing figure in GB for some cards (an "80 GB" H100 reports
//! 81,559 MiB ≈ 85.5 × 10⁹ bytes; an "80 GB" A100 81,920 MiB). Where no public `nvidia-smi` or
//! `rocm-smi` line was found, the datasheet's capacity is used and [`MemorySource::Datasheet`] says
//! so; every other figure names the line it was read from ([`MemorySource::Observed`]).
//!
//! # Throughput and bandwidth
//! Every figure is the vendor's datasheet figure, with the document named in [`Gpu::source`].
//! Conventions, chosen so cards compare like for like:
//! - Tensor throughput is **dense** (datasheets print sparse figures with an asterisk; dense is
//!   half of those) and, for GeForce cards, the rate **with FP32 accumulation**, which is what
//!   mixed-precision training uses (GeForce cards run FP16-accumulate at twice that rate).
//! - Link bandwidths are the datasheet's **bidirectional** figures per GPU (NVIDIA's "900 GB/s
//!   NVLink" is 450 GB/s each way). The cost model halves them for the per-direction rate that
//!   ring collectives see.
//! - 0 means "not supported" (no FP8 before Ada/Hopper, no BF16 tensor cores before Ampere, no
//!   scale-up link on PCIe cards without a bridge).

use serde::Serialize;

pub const MIB: u128 = 1 << 20;
pub const GIB: u128 = 1 << 30;

/// Who makes the card (decides the driver tools and the collective library: NCCL or RCCL).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    Nvidia,
    Amd,
}

/// The architecture generation. NVIDIA's carry their CUDA compute capability, which issue 11's
/// overhead model needs (cuBLAS gets a 32 MiB workspace on compute capability exactly 9.0 and
/// 8,519,680 B elsewhere: `aten/src/ATen/cuda/CublasHandlePool.cpp`, `parseChosenWorkspaceSize`;
/// the CUDA context figure is chosen by generation: overhead.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arch {
    /// Compute capability 7.0 (V100).
    Volta,
    /// 7.5 (T4).
    Turing,
    /// 8.0 (A100) and 8.6 (GA102: A10G, RTX 3090).
    Ampere,
    /// 8.9 (L4, L40S, RTX 4090).
    AdaLovelace,
    /// 9.0 (H100, H200).
    Hopper,
    /// 10.0 (B200, GB200), 10.3 (B300), 12.0 (RTX 5090).
    Blackwell,
    /// AMD CDNA 3, `gfx942` (MI300X, MI325X).
    Cdna3,
    /// AMD CDNA 4, `gfx950` (MI350X, MI355X).
    Cdna4,
}

/// The GPU-to-GPU fabric inside a node (the "scale-up" link).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "generation")]
pub enum ScaleUp {
    /// NVLink of this generation through NVSwitch: every GPU reaches every other at full rate.
    NvLink(u8),
    /// An NVLink bridge between a pair of PCIe cards (reaches one peer only).
    NvLinkBridge(u8),
    /// AMD Infinity Fabric (xGMI) links, a full mesh between the 8 GPUs of a platform.
    InfinityFabric(u8),
    /// None: GPUs talk through PCIe (and the host).
    None,
}

/// The link between the GPU and its host (what CPU offload moves data over).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "generation")]
pub enum HostLink {
    /// PCI Express ×16 of this generation.
    Pcie(u8),
    /// NVLink-C2C to a Grace CPU (GB200).
    NvlinkC2c,
}

/// Where a card's memory figure comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "detail")]
pub enum MemorySource {
    /// Read from a public `nvidia-smi` or `rocm-smi` output (the line is quoted).
    Observed(&'static str),
    /// No public driver output found: the datasheet's capacity, taken as GiB the way
    /// `rocm-smi` reports the MI300X's "192 GB" as 192 GiB.
    Datasheet,
}

/// One GPU model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Gpu {
    pub id: &'static str,
    pub name: &'static str,
    /// Other ids that resolve to this card (`h100` and `h100-sxm` for `h100-80gb`).
    pub aliases: &'static [&'static str],
    pub vendor: Vendor,
    pub arch: Arch,
    /// CUDA compute capability (major, minor); `None` for AMD.
    pub compute_capability: Option<(u8, u8)>,
    /// The compiler target: `sm_90`, `gfx942`, …
    pub target: &'static str,
    /// Memory the driver reports, MiB.
    pub mib: u64,
    pub mib_source: MemorySource,
    /// Peak memory (HBM or GDDR) bandwidth, GB/s (10⁹ bytes per second).
    pub hbm_gbs: f64,
    /// Dense BF16 tensor throughput with FP32 accumulation, TFLOP/s; 0 when the tensor cores
    /// have no BF16 (V100, T4: [`Gpu::fp16_tflops`] is their 16-bit rate).
    pub bf16_tflops: f64,
    /// Dense FP16 tensor throughput with FP32 accumulation, TFLOP/s.
    pub fp16_tflops: f64,
    /// Dense FP8 tensor throughput, TFLOP/s; 0 when unsupported.
    pub fp8_tflops: f64,
    /// FP32 throughput without tensor cores, TFLOP/s (what FP32 training runs at).
    pub fp32_tflops: f64,
    pub scale_up: ScaleUp,
    /// Scale-up bandwidth per GPU, GB/s, bidirectional as the datasheet prints it; 0 without one.
    pub scale_up_gbs: f64,
    pub host_link: HostLink,
    /// Host-link bandwidth, GB/s, bidirectional (PCIe 4.0 ×16: 64 GB/s).
    pub host_gbs: f64,
    /// The datasheet (or whitepaper) every throughput and bandwidth figure comes from.
    pub source: &'static str,
    /// What the figures do not say (an estimated value, a variant without its own datasheet).
    pub note: &'static str,
}

impl Gpu {
    pub fn bytes(&self) -> u128 {
        self.mib as u128 * MIB
    }
    /// The 16-bit tensor rate training in BF16 (or FP16 on cards without BF16) runs at, TFLOP/s.
    pub fn tensor16_tflops(&self) -> f64 {
        if self.bf16_tflops > 0.0 {
            self.bf16_tflops
        } else {
            self.fp16_tflops
        }
    }
    /// Whether `id` names this card (its id or an alias, case-insensitive).
    pub fn answers_to(&self, id: &str) -> bool {
        self.id.eq_ignore_ascii_case(id) || self.aliases.iter().any(|a| a.eq_ignore_ascii_case(id))
    }
}

/// PCI Express ×16 bandwidth per generation, GB/s bidirectional (PCI-SIG: 8, 16, 32, 64 GT/s per
/// lane for generations 3–6, 128b/130b encoding; NVIDIA's datasheets print 32, 64, 128 GB/s).
pub const fn pcie_x16_gbs(generation: u8) -> f64 {
    match generation {
        3 => 32.0,
        4 => 64.0,
        5 => 128.0,
        6 => 256.0,
        _ => 0.0,
    }
}

const H100_DATASHEET: &str = "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com, 2023): SXM and PCIe columns; sparse figures halved";

/// The catalog, in the order the picker lists it.
pub const GPUS: &[Gpu] = &[
    Gpu {
        id: "h100-80gb",
        name: "NVIDIA H100 80 GB (SXM)",
        aliases: &["h100", "h100-sxm", "h100-sxm5"],
        vendor: Vendor::Nvidia,
        arch: Arch::Hopper,
        compute_capability: Some((9, 0)),
        target: "sm_90",
        mib: 81_559,
        mib_source: MemorySource::Observed("NVIDIA H100 80GB HBM3 … 0MiB / 81559MiB"),
        hbm_gbs: 3_350.0,
        bf16_tflops: 989.4,
        fp16_tflops: 989.4,
        fp8_tflops: 1_978.9,
        fp32_tflops: 67.0,
        scale_up: ScaleUp::NvLink(4),
        scale_up_gbs: 900.0,
        host_link: HostLink::Pcie(5),
        host_gbs: 128.0,
        source: H100_DATASHEET,
        note: "",
    },
    Gpu {
        id: "h100-pcie",
        name: "NVIDIA H100 80 GB PCIe",
        aliases: &["h100-pcie-80gb"],
        vendor: Vendor::Nvidia,
        arch: Arch::Hopper,
        compute_capability: Some((9, 0)),
        target: "sm_90",
        mib: 81_559,
        mib_source: MemorySource::Observed("NVIDIA H100 PCIe … 1MiB / 81559MiB"),
        hbm_gbs: 2_000.0,
        bf16_tflops: 756.0,
        fp16_tflops: 756.0,
        fp8_tflops: 1_513.0,
        fp32_tflops: 51.0,
        scale_up: ScaleUp::NvLinkBridge(4),
        scale_up_gbs: 600.0,
        host_link: HostLink::Pcie(5),
        host_gbs: 128.0,
        source: H100_DATASHEET,
        note: "NVLink only as a bridge between pairs of cards; larger groups go through PCIe",
    },
    Gpu {
        id: "h200",
        name: "NVIDIA H200 141 GB",
        aliases: &["h200-sxm", "h200-141gb"],
        vendor: Vendor::Nvidia,
        arch: Arch::Hopper,
        compute_capability: Some((9, 0)),
        target: "sm_90",
        mib: 143_771,
        mib_source: MemorySource::Observed("NVIDIA H200 … 0MiB / 143771MiB"),
        hbm_gbs: 4_800.0,
        bf16_tflops: 989.4,
        fp16_tflops: 989.4,
        fp8_tflops: 1_978.9,
        fp32_tflops: 67.0,
        scale_up: ScaleUp::NvLink(4),
        scale_up_gbs: 900.0,
        host_link: HostLink::Pcie(5),
        host_gbs: 128.0,
        source: "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com, 2024): H200 SXM column; sparse figures halved",
        note: "",
    },
    Gpu {
        id: "b200",
        name: "NVIDIA B200 180 GB",
        aliases: &["b200-sxm", "hgx-b200"],
        vendor: Vendor::Nvidia,
        arch: Arch::Blackwell,
        compute_capability: Some((10, 0)),
        target: "sm_100",
        mib: 183_359,
        mib_source: MemorySource::Observed("NVIDIA B200 … 0MiB / 183359MiB"),
        hbm_gbs: 7_700.0,
        bf16_tflops: 2_250.0,
        fp16_tflops: 2_250.0,
        fp8_tflops: 4_500.0,
        fp32_tflops: 75.0,
        scale_up: ScaleUp::NvLink(5),
        scale_up_gbs: 1_800.0,
        host_link: HostLink::Pcie(5),
        host_gbs: 128.0,
        source: "NVIDIA HGX B200 datasheet (nvidia.com, 2025): 8-GPU totals ÷ 8 (HBM 62 TB/s, FP8 72 PFLOPS and BF16 36 PFLOPS sparse); NVLink 5 1.8 TB/s per GPU",
        note: "",
    },
    Gpu {
        id: "b300",
        name: "NVIDIA B300 (Blackwell Ultra) 288 GB",
        aliases: &["b300-sxm", "hgx-b300"],
        vendor: Vendor::Nvidia,
        arch: Arch::Blackwell,
        compute_capability: Some((10, 3)),
        target: "sm_103",
        mib: 275_040,
        mib_source: MemorySource::Observed("NVIDIA B300 SXM6 AC … 0MiB / 275040MiB"),
        hbm_gbs: 8_000.0,
        bf16_tflops: 2_250.0,
        fp16_tflops: 2_250.0,
        fp8_tflops: 4_500.0,
        fp32_tflops: 75.0,
        scale_up: ScaleUp::NvLink(5),
        scale_up_gbs: 1_800.0,
        host_link: HostLink::Pcie(6),
        host_gbs: 256.0,
        source: "NVIDIA HGX B300 datasheet (nvidia.com, 2025): 8-GPU totals ÷ 8, sparse figures halved; NVLink 5 1.8 TB/s per GPU; PCIe Gen6",
        note: "Blackwell Ultra raises dense FP4, not BF16 or FP8, over B200",
    },
    Gpu {
        id: "gb200",
        name: "NVIDIA GB200 (one Blackwell GPU of the superchip) 186 GB",
        aliases: &["gb200-nvl72"],
        vendor: Vendor::Nvidia,
        arch: Arch::Blackwell,
        compute_capability: Some((10, 0)),
        target: "sm_100",
        mib: 189_471,
        mib_source: MemorySource::Observed("NVIDIA GB200 … 0MiB / 189471MiB"),
        hbm_gbs: 8_000.0,
        bf16_tflops: 2_500.0,
        fp16_tflops: 2_500.0,
        fp8_tflops: 5_000.0,
        fp32_tflops: 80.0,
        scale_up: ScaleUp::NvLink(5),
        scale_up_gbs: 1_800.0,
        host_link: HostLink::NvlinkC2c,
        host_gbs: 900.0,
        source: "NVIDIA GB200 NVL72 datasheet (nvidia.com, 2024): per superchip (2 GPUs) 10 PFLOPS BF16 and 20 PFLOPS FP8 sparse, 372 GB HBM3e at 16 TB/s; NVLink-C2C 900 GB/s to Grace",
        note: "set gpus_per_node = 72: the NVL72 rack is one NVLink domain",
    },
    Gpu {
        id: "a100-80gb",
        name: "NVIDIA A100 80 GB",
        aliases: &["a100", "a100-sxm-80gb", "a100-sxm4-80gb"],
        vendor: Vendor::Nvidia,
        arch: Arch::Ampere,
        compute_capability: Some((8, 0)),
        target: "sm_80",
        mib: 81_920,
        mib_source: MemorySource::Observed("NVIDIA A100-SXM4-80GB … 81920MiB"),
        hbm_gbs: 2_039.0,
        bf16_tflops: 312.0,
        fp16_tflops: 312.0,
        fp8_tflops: 0.0,
        fp32_tflops: 19.5,
        scale_up: ScaleUp::NvLink(3),
        scale_up_gbs: 600.0,
        host_link: HostLink::Pcie(4),
        host_gbs: 64.0,
        source: "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com, 2021): A100 80GB SXM column; sparse figures halved",
        note: "",
    },
    Gpu {
        id: "a100-40gb",
        name: "NVIDIA A100 40 GB",
        aliases: &["a100-sxm-40gb", "a100-sxm4-40gb"],
        vendor: Vendor::Nvidia,
        arch: Arch::Ampere,
        compute_capability: Some((8, 0)),
        target: "sm_80",
        mib: 40_960,
        mib_source: MemorySource::Observed("NVIDIA A100-SXM4-40GB … 40960MiB"),
        hbm_gbs: 1_555.0,
        bf16_tflops: 312.0,
        fp16_tflops: 312.0,
        fp8_tflops: 0.0,
        fp32_tflops: 19.5,
        scale_up: ScaleUp::NvLink(3),
        scale_up_gbs: 600.0,
        host_link: HostLink::Pcie(4),
        host_gbs: 64.0,
        source: "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com, 2021): A100 40GB SXM column; sparse figures halved",
        note: "",
    },
    Gpu {
        id: "l40s",
        name: "NVIDIA L40S 48 GB",
        aliases: &[],
        vendor: Vendor::Nvidia,
        arch: Arch::AdaLovelace,
        compute_capability: Some((8, 9)),
        target: "sm_89",
        mib: 46_068,
        mib_source: MemorySource::Observed("NVIDIA L40S … 46068MiB"),
        hbm_gbs: 864.0,
        bf16_tflops: 362.05,
        fp16_tflops: 362.05,
        fp8_tflops: 733.0,
        fp32_tflops: 91.6,
        scale_up: ScaleUp::None,
        scale_up_gbs: 0.0,
        host_link: HostLink::Pcie(4),
        host_gbs: 64.0,
        source: "NVIDIA L40S GPU datasheet (nvidia.com, 2023): sparse figures halved",
        note: "no NVLink: GPUs talk through PCIe",
    },
    Gpu {
        id: "l4",
        name: "NVIDIA L4 24 GB",
        aliases: &[],
        vendor: Vendor::Nvidia,
        arch: Arch::AdaLovelace,
        compute_capability: Some((8, 9)),
        target: "sm_89",
        mib: 23_034,
        mib_source: MemorySource::Observed("NVIDIA L4 … 0MiB / 23034MiB"),
        hbm_gbs: 300.0,
        bf16_tflops: 121.0,
        fp16_tflops: 121.0,
        fp8_tflops: 242.5,
        fp32_tflops: 30.3,
        scale_up: ScaleUp::None,
        scale_up_gbs: 0.0,
        host_link: HostLink::Pcie(4),
        host_gbs: 64.0,
        source: "NVIDIA L4 Tensor Core GPU datasheet (nvidia.com, 2023): sparse figures halved",
        note: "no NVLink: GPUs talk through PCIe",
    },
    Gpu {
        id: "a10g",
        name: "NVIDIA A10G 24 GB (AWS G5)",
        aliases: &["a10", "a10-24gb"],
        vendor: Vendor::Nvidia,
        arch: Arch::Ampere,
        compute_capability: Some((8, 6)),
        target: "sm_86",
        mib: 23_028,
        mib_source: MemorySource::Observed("NVIDIA A10G … 0MiB / 23028MiB"),
        hbm_gbs: 600.0,
        bf16_tflops: 125.0,
        fp16_tflops: 125.0,
        fp8_tflops: 0.0,
        fp32_tflops: 31.2,
        scale_up: ScaleUp::None,
        scale_up_gbs: 0.0,
        host_link: HostLink::Pcie(4),
        host_gbs: 64.0,
        source: "NVIDIA A10 Tensor Core GPU datasheet (nvidia.com, 2021): sparse figures halved",
        note: "NVIDIA publishes no A10G datasheet; memory and bandwidth equal the A10's, tensor throughput is the A10's and an upper bound (AWS's variant trades tensor rate for CUDA-core rate)",
    },
    Gpu {
        id: "t4",
        name: "NVIDIA T4 16 GB",
        aliases: &["tesla-t4"],
        vendor: Vendor::Nvidia,
        arch: Arch::Turing,
        compute_capability: Some((7, 5)),
        target: "sm_75",
        mib: 15_360,
        mib_source: MemorySource::Observed("Tesla T4 … 2MiB / 15360MiB"),
        hbm_gbs: 320.0,
        bf16_tflops: 0.0,
        fp16_tflops: 65.0,
        fp8_tflops: 0.0,
        fp32_tflops: 8.1,
        scale_up: ScaleUp::None,
        scale_up_gbs: 0.0,
        host_link: HostLink::Pcie(3),
        host_gbs: 32.0,
        source: "NVIDIA T4 Tensor Core GPU datasheet (nvidia.com, 2019): mixed-precision FP16/FP32 65 TFLOPS",
        note: "no BF16 tensor cores: BF16 training runs without them; older drivers report 15,109 MiB with ECC on",
    },
    Gpu {
        id: "v100",
        name: "NVIDIA V100 32 GB (SXM2)",
        aliases: &["v100-32gb", "v100-sxm2-32gb"],
        vendor: Vendor::Nvidia,
        arch: Arch::Volta,
        compute_capability: Some((7, 0)),
        target: "sm_70",
        mib: 32_768,
        mib_source: MemorySource::Observed("Tesla V100-SXM2-32GB … 1MiB / 32768MiB"),
        hbm_gbs: 900.0,
        bf16_tflops: 0.0,
        fp16_tflops: 125.0,
        fp8_tflops: 0.0,
        fp32_tflops: 15.7,
        scale_up: ScaleUp::NvLink(2),
        scale_up_gbs: 300.0,
        host_link: HostLink::Pcie(3),
        host_gbs: 32.0,
        source: "NVIDIA Tesla V100 GPU datasheet (nvidia.com, 2020): V100 SXM2 column, tensor performance 125 TFLOPS",
        note: "no BF16 tensor cores: BF16 training runs without them",
    },
    Gpu {
        id: "rtx-3090",
        name: "NVIDIA GeForce RTX 3090 24 GB",
        aliases: &["3090"],
        vendor: Vendor::Nvidia,
        arch: Arch::Ampere,
        compute_capability: Some((8, 6)),
        target: "sm_86",
        mib: 24_576,
        mib_source: MemorySource::Observed("NVIDIA GeForce RTX 3090 … 24576MiB"),
        hbm_gbs: 936.0,
        bf16_tflops: 35.6,
        fp16_tflops: 35.6,
        fp8_tflops: 0.0,
        fp32_tflops: 35.6,
        scale_up: ScaleUp::NvLinkBridge(3),
        scale_up_gbs: 112.5,
        host_link: HostLink::Pcie(4),
        host_gbs: 64.0,
        source: "NVIDIA Ampere GA102 GPU Architecture whitepaper, Appendix A (GeForce RTX 3090): peak FP16/BF16 tensor TFLOPS with FP32 accumulate, dense",
        note: "FP16-accumulate runs at twice the rate; NVLink only as a bridge between two cards",
    },
    Gpu {
        id: "rtx-4090",
        name: "NVIDIA GeForce RTX 4090 24 GB",
        aliases: &["4090"],
        vendor: Vendor::Nvidia,
        arch: Arch::AdaLovelace,
        compute_capability: Some((8, 9)),
        target: "sm_89",
        mib: 24_564,
        mib_source: MemorySource::Observed("NVIDIA GeForce RTX 4090 … 24564MiB"),
        hbm_gbs: 1_008.0,
        bf16_tflops: 165.2,
        fp16_tflops: 165.2,
        fp8_tflops: 330.3,
        fp32_tflops: 82.6,
        scale_up: ScaleUp::None,
        scale_up_gbs: 0.0,
        host_link: HostLink::Pcie(4),
        host_gbs: 64.0,
        source: "NVIDIA Ada GPU Architecture whitepaper, Appendix (GeForce RTX 4090): peak BF16 and FP8 tensor TFLOPS with FP32 accumulate, dense",
        note: "no NVLink: GPUs talk through PCIe",
    },
    Gpu {
        id: "rtx-5090",
        name: "NVIDIA GeForce RTX 5090 32 GB",
        aliases: &["5090"],
        vendor: Vendor::Nvidia,
        arch: Arch::Blackwell,
        compute_capability: Some((12, 0)),
        target: "sm_120",
        mib: 32_607,
        mib_source: MemorySource::Observed("NVIDIA GeForce RTX 5090 … 2642MiB / 32607MiB"),
        hbm_gbs: 1_792.0,
        bf16_tflops: 209.5,
        fp16_tflops: 209.5,
        fp8_tflops: 419.0,
        fp32_tflops: 104.8,
        scale_up: ScaleUp::None,
        scale_up_gbs: 0.0,
        host_link: HostLink::Pcie(5),
        host_gbs: 128.0,
        source: "NVIDIA RTX Blackwell GPU Architecture whitepaper, Appendix (GeForce RTX 5090): peak FP16/BF16 and FP8 tensor TFLOPS with FP32 accumulate, dense",
        note: "no NVLink: GPUs talk through PCIe",
    },
    Gpu {
        id: "mi300x",
        name: "AMD Instinct MI300X 192 GB",
        aliases: &[],
        vendor: Vendor::Amd,
        arch: Arch::Cdna3,
        compute_capability: None,
        target: "gfx942",
        mib: 196_608,
        mib_source: MemorySource::Observed("rocm-smi: VRAM Total Memory (B): 206158430208"),
        hbm_gbs: 5_300.0,
        bf16_tflops: 1_307.4,
        fp16_tflops: 1_307.4,
        fp8_tflops: 2_614.9,
        fp32_tflops: 163.4,
        scale_up: ScaleUp::InfinityFabric(4),
        scale_up_gbs: 896.0,
        host_link: HostLink::Pcie(5),
        host_gbs: 128.0,
        source: "AMD Instinct MI300X accelerator data sheet (amd.com, 2023): peak dense FP16/BF16 and FP8 matrix; 7 Infinity Fabric links × 128 GB/s",
        note: "Infinity Fabric is a full mesh of the platform's 8 GPUs, not a switch",
    },
    Gpu {
        id: "mi325x",
        name: "AMD Instinct MI325X 256 GB",
        aliases: &[],
        vendor: Vendor::Amd,
        arch: Arch::Cdna3,
        compute_capability: None,
        target: "gfx942",
        mib: 262_144,
        mib_source: MemorySource::Datasheet,
        hbm_gbs: 6_000.0,
        bf16_tflops: 1_307.4,
        fp16_tflops: 1_307.4,
        fp8_tflops: 2_614.9,
        fp32_tflops: 163.4,
        scale_up: ScaleUp::InfinityFabric(4),
        scale_up_gbs: 896.0,
        host_link: HostLink::Pcie(5),
        host_gbs: 128.0,
        source: "AMD Instinct MI325X accelerator data sheet (amd.com, 2024): 256 GB HBM3E at 6 TB/s; peak dense FP16/BF16 and FP8 matrix as MI300X; 7 Infinity Fabric links × 128 GB/s",
        note: "memory is the datasheet's 256 GB taken as 256 GiB (no public rocm-smi total found)",
    },
    Gpu {
        id: "mi355x",
        name: "AMD Instinct MI355X 288 GB",
        aliases: &[],
        vendor: Vendor::Amd,
        arch: Arch::Cdna4,
        compute_capability: None,
        target: "gfx950",
        mib: 294_896,
        mib_source: MemorySource::Observed("rocm-smi: VRAM Total Memory (B) 309220868096"),
        hbm_gbs: 8_000.0,
        bf16_tflops: 2_516.6,
        fp16_tflops: 2_516.6,
        fp8_tflops: 5_033.2,
        fp32_tflops: 157.3,
        scale_up: ScaleUp::InfinityFabric(4),
        scale_up_gbs: 1_075.2,
        host_link: HostLink::Pcie(5),
        host_gbs: 128.0,
        source: "AMD Instinct MI355X accelerator data sheet (amd.com, 2025): 288 GB HBM3E at 8 TB/s, peak dense FP16/BF16 2.5 PFLOPS and FP8 5.0 PFLOPS; 7 Infinity Fabric links × 153.6 GB/s",
        note: "Infinity Fabric is a full mesh of the platform's 8 GPUs, not a switch",
    },
];

/// Looks a GPU up by id or alias (case-insensitive).
pub fn gpu(id: &str) -> Option<Gpu> {
    GPUS.iter().copied().find(|g| g.answers_to(id))
}

/// Capacity of a custom GPU given in GiB (negative or non-finite values give 0).
pub fn custom_bytes(gib: f64) -> u128 {
    if gib.is_finite() && gib > 0.0 {
        (gib * GIB as f64) as u128
    } else {
        0
    }
}

/// Capacity of the configured GPU: the card's bytes, `gpu_gib` for a custom one (0: unknown).
pub fn capacity(cfg: &super::config::Config) -> u128 {
    if cfg.gpu == "custom" {
        custom_bytes(cfg.gpu_gib)
    } else {
        gpu(&cfg.gpu).map_or(0, |g| g.bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_has_every_gpu_the_issue_asks_for() {
        for id in [
            "h100-80gb",
            "h100-pcie",
            "h200",
            "b200",
            "b300",
            "gb200",
            "a100-80gb",
            "a100-40gb",
            "l40s",
            "l4",
            "a10g",
            "t4",
            "v100",
            "rtx-3090",
            "rtx-4090",
            "rtx-5090",
            "mi300x",
            "mi325x",
            "mi355x",
        ] {
            assert!(gpu(id).is_some(), "{id}");
        }
    }

    #[test]
    fn ids_and_aliases_are_unique_so_every_name_means_one_card() {
        let mut names: Vec<String> =
            GPUS.iter().flat_map(|g| std::iter::once(g.id).chain(g.aliases.iter().copied())).map(str::to_ascii_lowercase).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn aliases_resolve_to_their_card_whatever_the_case() {
        assert_eq!(gpu("H100-SXM").map(|g| g.id), Some("h100-80gb"));
        assert_eq!(gpu("h100").map(|g| g.id), Some("h100-80gb"));
        assert_eq!(gpu("A100").map(|g| g.id), Some("a100-80gb"));
        assert_eq!(gpu("tpu-v5"), None);
    }

    #[test]
    fn an_80_gb_a100_reports_exactly_80_gib() {
        assert_eq!(gpu("a100-80gb").map(|g| g.bytes()), Some(80 * GIB));
    }

    #[test]
    fn every_card_has_memory_bandwidth_a_16_bit_rate_and_a_named_source() {
        for g in GPUS {
            assert!(g.mib > 0 && g.hbm_gbs > 0.0 && g.tensor16_tflops() > 0.0 && g.fp32_tflops > 0.0, "{}", g.id);
            assert!(g.host_gbs > 0.0, "{}", g.id);
            assert!(g.source.contains("datasheet") || g.source.contains("data sheet") || g.source.contains("whitepaper"), "{}", g.id);
            assert_eq!(g.scale_up == ScaleUp::None, g.scale_up_gbs == 0.0, "{}", g.id);
            if let HostLink::Pcie(gen) = g.host_link {
                assert_eq!(g.host_gbs, pcie_x16_gbs(gen), "{}", g.id);
            }
        }
    }

    #[test]
    fn fp8_is_twice_bf16_wherever_a_card_has_both() {
        // Every datasheet of the catalog doubles the dense rate from 16 to 8 bits (the L40S's
        // prints 362.05 and 733, 2.02×); a typo in either column shows up here.
        for g in GPUS.iter().filter(|g| g.fp8_tflops > 0.0 && g.bf16_tflops > 0.0) {
            let ratio = g.fp8_tflops / g.bf16_tflops;
            assert!((ratio - 2.0).abs() < 0.03, "{}: {ratio}", g.id);
        }
    }

    #[test]
    fn nvidia_cards_carry_a_compute_capability_matching_their_target() {
        for g in GPUS {
            match (g.vendor, g.compute_capability) {
                (Vendor::Nvidia, Some((major, minor))) => assert_eq!(g.target, format!("sm_{major}{minor}"), "{}", g.id),
                (Vendor::Amd, None) => assert!(g.target.starts_with("gfx"), "{}", g.id),
                _ => panic!("{}: vendor and compute capability disagree", g.id),
            }
        }
    }

    #[test]
    fn cards_before_ampere_have_no_bf16_tensor_cores() {
        assert_eq!(gpu("v100").map(|g| (g.bf16_tflops, g.tensor16_tflops())), Some((0.0, 125.0)));
        assert_eq!(gpu("t4").map(|g| g.tensor16_tflops()), Some(65.0));
    }

    #[test]
    fn custom_capacity_rejects_nonsense_without_panicking() {
        assert_eq!(custom_bytes(-1.0), 0);
        assert_eq!(custom_bytes(f64::NAN), 0);
        assert_eq!(custom_bytes(24.0), 24 * GIB);
    }
}
