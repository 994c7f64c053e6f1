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

pub mod api;
mod compact;
#[cfg(feature = "gpu")]
mod gpu;
mod info;
#[cfg(feature = "gpu")]
mod kernels;
mod plan;
pub mod reference;
mod results;
mod shape;
#[cfg(feature = "gpu")]
mod sweep;
#[cfg(feature = "gpu")]
mod time;
#[cfg(feature = "gpu")]
mod verify;
#[cfg(all(feature = "gpu", target_arch = "wasm32"))]
pub mod web;

#[cfg(all(feature = "gpu", not(target_arch = "wasm32")))]
pub mod cli;

pub use compact::{decode_compact, encode_compact, DecodeError, SharedPoint, SharedResult, SharedTiming, MAX_LEN as COMPACT_MAX_LEN};
#[cfg(feature = "gpu")]
pub use gpu::{Bench, BenchOptions, MaterializedOutput};
pub use info::{AdapterSummary, CopyProbe, LimitsSummary, TimingMethod};
pub use plan::{
    check_fit, check_shape, fused_bytes, kernel_point, materialized_bytes, max_materializable_seq, seq_ladder, timestamp_bytes,
    CancelToken, Kernel, SweepOptions, SweepProgress, BLOCK, COPY_WG, FUSED_ROWS, FUSED_WORKGROUP_BYTES, MAX_HEAD_DIM, MAX_RUNS,
    QUERY_SIZE, TILE,
};
pub use results::{fit_loglog, median, KernelPoint, KernelSlopes, Slopes, StopReason, SweepPoint, SweepResult};
pub use shape::{AttentionShape, BenchError, Dtype};
#[cfg(feature = "gpu")]
pub use verify::{verify, verify_shapes, VerifyCase, VerifyReport, TOLERANCE, TOLERANCE_F16};
