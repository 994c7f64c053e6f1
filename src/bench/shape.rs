//! The benchmark's vocabulary: the shape of one attention computation, the element type in
//! GPU memory, and everything that can go wrong. A leaf: it imports nothing of the benchmark.

use serde::{Deserialize, Serialize};

/// Everything that can go wrong with the benchmark. Messages are lowercase sentences.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BenchError {
    /// No adapter: no WebGPU in this browser, or no Vulkan/Metal/DX12 driver natively.
    #[error("no gpu adapter found (no webgpu in this browser, or natively no vulkan, metal or dx12 driver): {0}")]
    NoAdapter(String),
    /// The adapter was found but refused to open a device.
    #[error("the gpu refused to open a device: {0}")]
    RequestDevice(String),
    /// The adapter lacks a limit or feature the kernels need.
    #[error("this gpu cannot run the benchmark: {0}")]
    Unsupported(String),
    /// The device was lost (driver reset, tab backgrounded too long, destroyed).
    #[error("the gpu device was lost: {0}")]
    DeviceLost(String),
    /// The GPU reported running out of memory.
    #[error("the gpu ran out of memory: {0}")]
    OutOfMemory(String),
    /// wgpu reported a validation error (a bug in the benchmark, reported rather than panicking).
    #[error("gpu validation error: {0}")]
    Validation(String),
    /// wgpu reported an internal error.
    #[error("gpu internal error: {0}")]
    Internal(String),
    /// Mapping a buffer for reading failed.
    #[error("reading results back from the gpu failed: {0}")]
    Readback(String),
    /// The options or the shape are invalid (zero heads, head_dim above 128, …).
    #[error("invalid benchmark options: {0}")]
    InvalidOptions(String),
    /// A run was asked for a shape whose buffers or dispatches exceed the device's limits.
    #[error("{0}")]
    TooLarge(String),
}

/// Element type of Q, K, V, S (and P) and O in GPU memory. Arithmetic is f32 either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    #[default]
    F32,
    /// Needs the adapter's `shader-f16` feature ([`AdapterSummary::f16`]).
    F16,
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 => 2,
        }
    }

    /// "f32" or "f16".
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
        }
    }

    /// Reads "f32" or "f16".
    pub fn parse(s: &str) -> Option<Dtype> {
        match s {
            "f32" => Some(Dtype::F32),
            "f16" => Some(Dtype::F16),
            _ => None,
        }
    }
}

/// The shape of one attention computation: `batch × heads` independent heads of `seq` tokens
/// and `head_dim` channels (element type apart: see [`Dtype`]). Q, K, V and O are laid out `[batch·heads][seq][head_dim]`,
/// S and P `[batch·heads][seq][seq]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttentionShape {
    pub batch: u32,
    pub heads: u32,
    pub seq: u32,
    pub head_dim: u32,
}

impl AttentionShape {
    /// Independent heads: `batch · heads`.
    pub fn bh(&self) -> u64 {
        self.batch as u64 * self.heads as u64
    }
    /// Elements of each of Q, K, V, O.
    pub fn qkv_elems(&self) -> u64 {
        self.bh() * self.seq as u64 * self.head_dim as u64
    }
    /// Elements of S (and P): `b·a·s²`.
    pub fn score_elems(&self) -> u64 {
        self.bh() * self.seq as u64 * self.seq as u64
    }
    /// The softmax scale `1/√d`.
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
    /// Multiply-adds of QKᵀ and of P·V, counted as 2 FLOPs each: `4·b·a·s²·d`.
    pub fn matmul_flops(&self) -> f64 {
        4.0 * self.score_elems() as f64 * self.head_dim as f64
    }
}

impl std::fmt::Display for AttentionShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "batch {} × {} heads × seq {} × head_dim {}", self.batch, self.heads, self.seq, self.head_dim)
    }
}
