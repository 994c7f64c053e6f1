//! The attention-materialization benchmark (wgpu: WebGPU in the browser, Vulkan natively).
//!
//! It shows, on the user's own GPU, the cost the estimator predicts for attention
//! activations: eager attention writes the full score matrix `S = Q·Kᵀ/√d` (b·a·s² floats), so
//! its memory grows with s², while a fused, FlashAttention-style kernel never stores `S` and
//! its memory grows with s. Both kernels are timed over a sweep of sequence lengths, next to a
//! copy-bandwidth probe (the roofline of the memory-bound materialized path), and log-log fits
//! give the exponents.
//!
//! # Using it (the UI and the CLI do exactly this)
//!
//! ```no_run
//! # async fn demo() -> Result<(), trainmem::bench::BenchError> {
//! use trainmem::bench::{Bench, BenchOptions, SweepOptions};
//! use std::sync::atomic::AtomicBool;
//!
//! let bench = Bench::new(BenchOptions::default()).await?; // adapter, device, pipelines
//! println!("{}", bench.info().name);
//! let report = trainmem::bench::verify(&bench).await?; // GPU vs the CPU reference
//! assert!(report.passed);
//! let cancel = AtomicBool::new(false); // set it from elsewhere to stop between points
//! let result = bench
//!     .sweep(&SweepOptions::default(), &mut |p| println!("{}/{}", p.done, p.planned), &cancel)
//!     .await?;
//! println!("{}", result.to_csv());
//! let link_value = trainmem::bench::encode_compact(&result); // `?bench=<value>`
//! let shared = trainmem::bench::decode_compact(&link_value).expect("round-trips");
//! # let _ = shared; Ok(()) }
//! ```
//!
//! Natively, drive the futures with `pollster::block_on`; in the browser, with
//! `wasm_bindgen_futures::spawn_local`. Nothing here blocks on the web: every wait for the GPU
//! is a `map_async`/`on_submitted_work_done` callback feeding a `futures_channel::oneshot`.
//!
//! # Layout
//!
//! - [`Bench::new`] (setup: instance, adapter, device, pipelines) is apart from the work
//!   ([`Bench::sweep`], [`Bench::run_materialized`], [`Bench::run_fused`],
//!   [`Bench::copy_bandwidth`]), as in wgpu's compute examples.
//! - One WGSL kernel per file, included with `include_str!`: `scores.wgsl`, `softmax.wgsl`,
//!   `pv.wgsl` (the materialized path), `fused.wgsl`, `copy.wgsl`, and the `*_f16.wgsl`
//!   variants (f16 in memory, f32 arithmetic; [`Dtype::F16`], where the adapter has
//!   `shader-f16`). Each file opens with a comment listing its bindings and workgroup size.
//! - [`reference`](mod@reference): the CPU reference of `S` and of `softmax(S)·V`.
//! - Results ([`SweepResult`]) serialize with serde, export as CSV, and travel in links through
//!   [`encode_compact`] / [`decode_compact`] ([`SharedResult`]).
//!
//! # What the kernels are (and are not)
//!
//! The materialized path is what eager PyTorch does: three kernels, `S` written to memory,
//! softmaxed in place, read back for `P·V`. The fused kernel is FlashAttention's algorithm
//! (16×16 query/key tiles, online softmax), written plainly for portability: it demonstrates
//! the linear memory, not FlashAttention's speed; on some GPUs it may be slower than the
//! materialized path at short sequences. Both are timed the same way; both are O(s²) in time.
//!
//! # Limits
//!
//! No buffer is ever requested beyond the device's `max_buffer_size` /
//! `max_storage_buffer_binding_size` (checked before creation), beyond the sweep's memory cap,
//! or beyond what the kernels' 32-bit indices address; dispatch sizes are checked against
//! `max_compute_workgroups_per_dimension`. Device loss, validation and out-of-memory errors
//! come back as [`BenchError`] values, never as panics.

mod compact;
mod gpu;
mod kernels;
pub mod reference;
mod results;
mod sweep;
mod time;
mod verify;

#[cfg(not(target_arch = "wasm32"))]
pub mod cli;

pub use compact::{decode_compact, encode_compact, DecodeError, SharedPoint, SharedResult, SharedTiming, MAX_LEN as COMPACT_MAX_LEN};
pub use gpu::{AdapterSummary, Bench, BenchOptions, CopyProbe, LimitsSummary, MaterializedOutput};
pub use results::{fit_loglog, KernelPoint, KernelSlopes, Slopes, StopReason, SweepPoint, SweepResult, TimingMethod};
pub use sweep::{fused_bytes, materialized_bytes, max_materializable_seq, seq_ladder, CancelToken, SweepOptions, SweepProgress, MAX_RUNS};
pub use verify::{verify, verify_shapes, VerifyCase, VerifyReport, TOLERANCE, TOLERANCE_F16};

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
