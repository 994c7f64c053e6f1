//! What the benchmark reports about the GPU it ran on: the adapter, the limits in force, how
//! runs were timed and the copy-bandwidth probe. Plain data (serde), shared by the benchmark
//! module that measures and the app that shows the results.

use serde::{Deserialize, Serialize};

/// How a run's time was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimingMethod {
    /// GPU timestamps at the start of the first pass and the end of the last (`TIMESTAMP_QUERY`).
    GpuTimestamps,
    /// Wall clock from `queue.submit` to the work-done callback (includes submission latency).
    WallClock,
}

impl TimingMethod {
    pub fn label(self) -> &'static str {
        match self {
            TimingMethod::GpuTimestamps => "gpu timestamps",
            TimingMethod::WallClock => "wall clock, submit to done",
        }
    }
}

/// The limits of the opened device that bound the benchmark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsSummary {
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroup_size_x: u32,
    pub max_compute_workgroup_size_y: u32,
    pub max_compute_workgroups_per_dimension: u32,
    pub max_storage_buffers_per_shader_stage: u32,
}

impl LimitsSummary {
    /// The largest storage buffer the device accepts.
    pub fn max_storage_bytes(&self) -> u64 {
        self.max_buffer_size.min(self.max_storage_buffer_binding_size)
    }
}

/// What the UI shows about the GPU: the adapter, its backend and the limits in force.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterSummary {
    /// The adapter's name, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"; may be empty on the web.
    pub name: String,
    /// "vulkan", "metal", "dx12", "gl", "webgpu".
    pub backend: String,
    /// "discrete gpu", "integrated gpu", "virtual gpu", "cpu", "other".
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub vendor: u32,
    pub device: u32,
    /// The limits of the opened device (after [`BenchOptions::max_buffer_bytes`]).
    pub limits: LimitsSummary,
    /// The adapter's features relevant here ("timestamp-query", "shader-f16", …).
    pub features: Vec<String>,
    /// Whether runs are timed with GPU timestamps (else the wall clock).
    pub timestamps: bool,
    /// Nanoseconds per timestamp tick.
    pub timestamp_period_ns: f64,
    /// Whether [`Dtype::F16`] runs are available (`shader-f16` enabled).
    pub f16: bool,
}

/// The copy-bandwidth probe's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyProbe {
    /// Bytes of the source (and of the destination) buffer.
    pub bytes: u64,
    pub median_ms: f64,
    /// `2 · bytes / median` (read plus write), in GB/s (10⁹ bytes per second).
    pub gb_per_s: f64,
    pub timing: TimingMethod,
}
