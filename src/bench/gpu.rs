//! Setup (instance, adapter, device, pipelines) and the GPU work of one run: buffers, bind
//! groups, dispatches, timing, readback. Everything asynchronous goes through callbacks and
//! `futures_channel::oneshot`, so the same code runs under `pollster` natively and under
//! `wasm_bindgen_futures` in the browser.

use super::info::{AdapterSummary, CopyProbe, LimitsSummary, TimingMethod};
use super::kernels::{AttentionKernels, Kernels, Params};
use super::plan::{self, Kernel};
use super::reference;
use super::shape::{AttentionShape, BenchError, Dtype};
use super::time::now_ms;
use futures_channel::oneshot;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

/// How to open the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchOptions {
    /// Prefer the high-performance adapter (a discrete GPU) over the low-power one.
    pub high_performance: bool,
    /// Time with GPU timestamp queries where the adapter has `TIMESTAMP_QUERY`; otherwise (or
    /// when false) time from submit to completion on the wall clock.
    pub use_timestamps: bool,
    /// Open the device with `max_buffer_size` and `max_storage_buffer_binding_size` lowered to
    /// this many bytes: for tests of the limit handling, or to stay gentle on a shared GPU.
    pub max_buffer_bytes: Option<u64>,
    /// Enable `shader-f16` where the adapter has it, for [`Dtype::F16`] runs.
    pub use_f16: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions { high_performance: true, use_timestamps: true, max_buffer_bytes: None, use_f16: true }
    }
}

fn limits_summary(l: &wgpu::Limits) -> LimitsSummary {
    LimitsSummary {
        max_buffer_size: l.max_buffer_size,
        max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
        max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
        max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
        max_compute_workgroup_size_x: l.max_compute_workgroup_size_x,
        max_compute_workgroup_size_y: l.max_compute_workgroup_size_y,
        max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
        max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
    }
}

/// What the kernels need, or which need is unmet.
fn check_needs(limits: &LimitsSummary) -> Result<(), BenchError> {
    let needs: [(&str, u64, u64); 6] = [
        ("max_compute_invocations_per_workgroup", limits.max_compute_invocations_per_workgroup as u64, 256),
        ("max_compute_workgroup_size_x", limits.max_compute_workgroup_size_x as u64, plan::COPY_WG as u64),
        ("max_compute_workgroup_size_y", limits.max_compute_workgroup_size_y as u64, plan::TILE as u64),
        ("max_compute_workgroup_storage_size", limits.max_compute_workgroup_storage_size as u64, plan::FUSED_WORKGROUP_BYTES as u64),
        ("max_storage_buffers_per_shader_stage", limits.max_storage_buffers_per_shader_stage as u64, 4),
        ("max_compute_workgroups_per_dimension", limits.max_compute_workgroups_per_dimension as u64, 1),
    ];
    for (name, have, need) in needs {
        if have < need {
            return Err(BenchError::Unsupported(format!("{name} is {have}, the kernels need {need}")));
        }
    }
    Ok(())
}

/// What the scores kernel wrote (before the softmax) and the attention output, read back
/// (as f32 whatever the element type on the GPU).
#[derive(Debug, Clone, PartialEq)]
pub struct MaterializedOutput {
    /// `S = Q·Kᵀ/√d`, `[bh][s][s]`.
    pub scores: Vec<f32>,
    /// `O = softmax(S)·V`, `[bh][s][d]`.
    pub out: Vec<f32>,
}

/// The per-run timings of one kernel at one shape, and the bytes its buffers took.
pub(crate) struct Timed {
    pub times_ms: Vec<f64>,
    pub method: TimingMethod,
    pub bytes_allocated: u64,
}

#[derive(Default)]
struct DeviceState {
    lost: Option<String>,
    error: Option<BenchError>,
    waker: Option<Waker>,
}

fn lock(state: &Mutex<DeviceState>) -> MutexGuard<'_, DeviceState> {
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An opened GPU with the benchmark's pipelines: create once, run many sweeps.
pub struct Bench {
    device: wgpu::Device,
    queue: wgpu::Queue,
    kernels: Kernels,
    info: AdapterSummary,
    state: Arc<Mutex<DeviceState>>,
}

impl std::fmt::Debug for Bench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bench").field("info", &self.info).finish_non_exhaustive()
    }
}

fn instance_descriptor() -> wgpu::InstanceDescriptor {
    // Natively this honours WGPU_BACKEND (e.g. `vulkan` for lavapipe); on the web there is
    // only the browser's WebGPU.
    #[allow(unused_mut)]
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    #[cfg(target_arch = "wasm32")]
    {
        desc.backends = wgpu::Backends::BROWSER_WEBGPU;
    }
    desc
}

fn backend_name(b: wgpu::Backend) -> String {
    match b {
        wgpu::Backend::BrowserWebGpu => "webgpu".into(),
        other => other.to_str().to_ascii_lowercase(),
    }
}

fn device_type_name(t: wgpu::DeviceType) -> String {
    match t {
        wgpu::DeviceType::DiscreteGpu => "discrete gpu",
        wgpu::DeviceType::IntegratedGpu => "integrated gpu",
        wgpu::DeviceType::VirtualGpu => "virtual gpu",
        wgpu::DeviceType::Cpu => "cpu",
        wgpu::DeviceType::Other => "other",
    }
    .into()
}

fn feature_names(f: wgpu::Features) -> Vec<String> {
    [
        (wgpu::Features::TIMESTAMP_QUERY, "timestamp-query"),
        (wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS, "timestamp-query-inside-encoders"),
        (wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES, "timestamp-query-inside-passes"),
        (wgpu::Features::SHADER_F16, "shader-f16"),
        (wgpu::Features::SUBGROUP, "subgroups"),
    ]
    .into_iter()
    .filter(|(flag, _)| f.contains(*flag))
    .map(|(_, name)| name.to_string())
    .collect()
}

/// Records one run into an encoder, with the timestamp query set and the index of the run's
/// first query where runs are timed on the GPU.
type Encode<'a> = dyn Fn(&mut wgpu::CommandEncoder, Option<(&wgpu::QuerySet, u32)>) + 'a;

fn ceil_div(a: u64, b: u64) -> u32 {
    a.div_ceil(b) as u32
}

fn timestamp_writes(ts: Option<(&wgpu::QuerySet, u32)>, begin: bool, end: bool) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
    ts.map(|(query_set, base)| wgpu::ComputePassTimestampWrites {
        query_set,
        beginning_of_pass_write_index: begin.then_some(base),
        end_of_pass_write_index: end.then_some(base + 1),
    })
}

/// The buffers every attention kernel reads: the params uniform and Q, K, V.
pub(crate) struct Inputs {
    params: wgpu::Buffer,
    q: wgpu::Buffer,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    dtype: Dtype,
    /// Bytes of O (as of each of Q, K, V).
    out_bytes: u64,
}

struct MaterializedSetup {
    dtype: Dtype,
    s: wgpu::Buffer,
    o: wgpu::Buffer,
    scores: wgpu::BindGroup,
    softmax: wgpu::BindGroup,
    pv: wgpu::BindGroup,
}

struct FusedSetup {
    dtype: Dtype,
    o: wgpu::Buffer,
    group: wgpu::BindGroup,
}

impl Bench {
    /// Opens the adapter (WebGPU in the browser; natively Vulkan/Metal/DX12, `WGPU_BACKEND`
    /// honoured), a device with the adapter's own limits (lowered by
    /// [`BenchOptions::max_buffer_bytes`]) and `TIMESTAMP_QUERY` where available, and compiles
    /// the kernels.
    pub async fn new(options: BenchOptions) -> Result<Bench, BenchError> {
        let instance = wgpu::Instance::new(instance_descriptor());
        let power_preference =
            if options.high_performance { wgpu::PowerPreference::HighPerformance } else { wgpu::PowerPreference::LowPower };
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions { power_preference, ..Default::default() })
            .await
            .map_err(|e| BenchError::NoAdapter(e.to_string().to_lowercase()))?;
        let adapter_info = adapter.get_info();
        let adapter_features = adapter.features();
        let mut limits = adapter.limits();
        if let Some(cap) = options.max_buffer_bytes {
            let cap = cap.max(4);
            limits.max_buffer_size = limits.max_buffer_size.min(cap);
            limits.max_storage_buffer_binding_size = limits.max_storage_buffer_binding_size.min(cap);
        }
        let summary = limits_summary(&limits);
        check_needs(&summary)?;
        let timestamps = options.use_timestamps && adapter_features.contains(wgpu::Features::TIMESTAMP_QUERY);
        let f16 = options.use_f16 && adapter_features.contains(wgpu::Features::SHADER_F16);
        let mut required_features = wgpu::Features::empty();
        if timestamps {
            required_features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        if f16 {
            required_features |= wgpu::Features::SHADER_F16;
        }
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("trainmem bench"),
                required_features,
                required_limits: limits,
                ..Default::default()
            })
            .await
            .map_err(|e| BenchError::RequestDevice(e.to_string()))?;

        let state = Arc::new(Mutex::new(DeviceState::default()));
        {
            let state = Arc::clone(&state);
            device.set_device_lost_callback(move |reason, message| {
                let mut st = lock(&state);
                let why = match reason {
                    wgpu::DeviceLostReason::Destroyed => "destroyed",
                    wgpu::DeviceLostReason::Unknown => "unknown reason",
                };
                st.lost = Some(if message.is_empty() { why.to_string() } else { format!("{why}: {message}") });
                if let Some(w) = st.waker.take() {
                    w.wake();
                }
            });
        }
        {
            let state = Arc::clone(&state);
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                let mut st = lock(&state);
                if st.error.is_none() {
                    st.error = Some(classify(e));
                }
            }));
        }

        let info = AdapterSummary {
            name: adapter_info.name.clone(),
            backend: backend_name(adapter_info.backend),
            device_type: device_type_name(adapter_info.device_type),
            driver: adapter_info.driver.clone(),
            driver_info: adapter_info.driver_info.clone(),
            vendor: adapter_info.vendor,
            device: adapter_info.device,
            limits: summary,
            features: feature_names(adapter_features),
            timestamps,
            timestamp_period_ns: if timestamps { queue.get_timestamp_period() as f64 } else { 0.0 },
            f16,
        };
        let scope = ErrorScope::push(&device);
        let kernels = Kernels::new(&device, f16);
        scope.pop().await.map_err(|e| match e {
            BenchError::Validation(m) => BenchError::Unsupported(format!("a kernel failed to compile: {m}")),
            other => other,
        })?;
        let bench = Bench { device, queue, kernels, info, state };
        bench.check()?;
        Ok(bench)
    }

    /// The adapter, its backend, features and the limits in force.
    pub fn info(&self) -> &AdapterSummary {
        &self.info
    }

    /// Destroys the device, as a driver reset would: every later call returns
    /// [`BenchError::DeviceLost`]. For tests of the loss handling (and to free the GPU early).
    pub fn lose_device(&self) {
        self.device.destroy();
        let _ = self.device.poll(wgpu::PollType::Poll);
    }

    /// Runs the materialized path (scores, softmax, P·V) once on the given Q, K, V
    /// (`[bh][s][d]` each, stored as `dtype` on the GPU) and reads back S (as the scores kernel
    /// wrote it) and O.
    pub async fn run_materialized(
        &self,
        shape: AttentionShape,
        dtype: Dtype,
        q: &[f32],
        k: &[f32],
        v: &[f32],
    ) -> Result<MaterializedOutput, BenchError> {
        self.check_run(Kernel::Materialized, shape, dtype, q, k, v)?;
        let mut alloc = 0;
        let scope = ErrorScope::push(&self.device);
        let inputs = self.inputs(shape, dtype, q, k, v, &mut alloc)?;
        let setup = self.materialized_setup(shape, &inputs, &mut alloc)?;
        let s_bytes = padded(shape.score_elems() * dtype.bytes());
        let o_bytes = padded(shape.qkv_elems() * dtype.bytes());
        let read_s = self.buffer("scores readback", s_bytes, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, &mut alloc)?;
        let read_o = self.buffer("out readback", o_bytes, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, &mut alloc)?;
        let mut enc = self.device.create_command_encoder(&Default::default());
        self.encode_materialized(&mut enc, shape, &setup, None, Some(&read_s));
        enc.copy_buffer_to_buffer(&setup.o, 0, &read_o, 0, o_bytes);
        self.queue.submit([enc.finish()]);
        scope.pop().await?;
        let scores = self.read_values(&read_s, dtype, shape.score_elems()).await?;
        let out = self.read_values(&read_o, dtype, shape.qkv_elems()).await?;
        Ok(MaterializedOutput { scores, out })
    }

    /// Runs the fused kernel once on the given Q, K, V (`[bh][s][d]` each, stored as `dtype`
    /// on the GPU) and reads back O.
    pub async fn run_fused(&self, shape: AttentionShape, dtype: Dtype, q: &[f32], k: &[f32], v: &[f32]) -> Result<Vec<f32>, BenchError> {
        self.check_run(Kernel::Fused, shape, dtype, q, k, v)?;
        let mut alloc = 0;
        let scope = ErrorScope::push(&self.device);
        let inputs = self.inputs(shape, dtype, q, k, v, &mut alloc)?;
        let setup = self.fused_setup(&inputs, &mut alloc)?;
        let o_bytes = padded(shape.qkv_elems() * dtype.bytes());
        let read_o = self.buffer("out readback", o_bytes, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, &mut alloc)?;
        let mut enc = self.device.create_command_encoder(&Default::default());
        self.encode_fused(&mut enc, shape, &setup, None);
        enc.copy_buffer_to_buffer(&setup.o, 0, &read_o, 0, o_bytes);
        self.queue.submit([enc.finish()]);
        scope.pop().await?;
        self.read_values(&read_o, dtype, shape.qkv_elems()).await
    }

    /// Measures copy bandwidth with `copy.wgsl` over a buffer of (about) `bytes` bytes, lowered
    /// to what the device allows: one warm-up, then the median of `runs` runs.
    pub async fn copy_bandwidth(&self, bytes: u64, runs: u32) -> Result<CopyProbe, BenchError> {
        let bytes = (bytes.min(self.info.limits.max_storage_bytes()) / 16 * 16).max(16);
        let runs = runs.clamp(1, plan::MAX_RUNS);
        let mut alloc = 0;
        let scope = ErrorScope::push(&self.device);
        let src = self.buffer("copy src", bytes, wgpu::BufferUsages::STORAGE, &mut alloc)?;
        let dst = self.buffer("copy dst", bytes, wgpu::BufferUsages::STORAGE, &mut alloc)?;
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("copy"),
            layout: &self.kernels.copy.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: src.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: dst.as_entire_binding() },
            ],
        });
        scope.pop().await?;
        let groups = ceil_div(bytes / 16, plan::COPY_WG as u64).clamp(1, self.info.limits.max_compute_workgroups_per_dimension);
        let encode = |enc: &mut wgpu::CommandEncoder, ts: Option<(&wgpu::QuerySet, u32)>| {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("copy"),
                timestamp_writes: timestamp_writes(ts, true, true),
            });
            pass.set_pipeline(&self.kernels.copy);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(groups, 1, 1);
        };
        let timed = self.time_runs(1, runs, &mut alloc, &encode).await?;
        let median_ms = super::results::median(&timed.times_ms);
        Ok(CopyProbe { bytes, median_ms, gb_per_s: 2.0 * bytes as f64 / (median_ms * 1e6), timing: timed.method })
    }

    /// Times `runs` runs (after `warmup`) of one kernel on random Q, K, V of `shape`.
    pub(crate) async fn measure(
        &self,
        kernel: Kernel,
        shape: AttentionShape,
        dtype: Dtype,
        warmup: u32,
        runs: u32,
        seed: u64,
    ) -> Result<Timed, BenchError> {
        self.kernels_for(dtype)?;
        plan::check_fit(kernel, shape, dtype, &self.info.limits).map_err(BenchError::TooLarge)?;
        let (q, k, v) = super::reference::random_qkv(shape, seed);
        let mut alloc = 0;
        let scope = ErrorScope::push(&self.device);
        let inputs = self.inputs(shape, dtype, &q, &k, &v, &mut alloc)?;
        drop((q, k, v));
        let timed = match kernel {
            Kernel::Materialized => {
                let setup = self.materialized_setup(shape, &inputs, &mut alloc)?;
                scope.pop().await?;
                let encode = |enc: &mut wgpu::CommandEncoder, ts: Option<(&wgpu::QuerySet, u32)>| {
                    self.encode_materialized(enc, shape, &setup, ts, None)
                };
                self.time_runs(warmup, runs, &mut alloc, &encode).await?
            }
            Kernel::Fused => {
                let setup = self.fused_setup(&inputs, &mut alloc)?;
                scope.pop().await?;
                let encode = |enc: &mut wgpu::CommandEncoder, ts: Option<(&wgpu::QuerySet, u32)>| self.encode_fused(enc, shape, &setup, ts);
                self.time_runs(warmup, runs, &mut alloc, &encode).await?
            }
        };
        Ok(timed)
    }

    /// Errors recorded by the device callbacks: loss first, then uncaptured errors.
    pub(crate) fn check(&self) -> Result<(), BenchError> {
        let mut st = lock(&self.state);
        if let Some(m) = &st.lost {
            return Err(BenchError::DeviceLost(m.clone()));
        }
        match st.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The pipelines for `dtype`, or why there are none.
    fn kernels_for(&self, dtype: Dtype) -> Result<&AttentionKernels, BenchError> {
        match dtype {
            Dtype::F32 => Ok(&self.kernels.f32),
            Dtype::F16 => self
                .kernels
                .f16
                .as_ref()
                .ok_or_else(|| BenchError::Unsupported("f16 needs the adapter's shader-f16 feature, which this one lacks".into())),
        }
    }

    fn check_run(&self, kernel: Kernel, shape: AttentionShape, dtype: Dtype, q: &[f32], k: &[f32], v: &[f32]) -> Result<(), BenchError> {
        self.check()?;
        plan::check_shape(shape).map_err(BenchError::InvalidOptions)?;
        self.kernels_for(dtype)?;
        let n = shape.qkv_elems();
        for (name, x) in [("q", q), ("k", k), ("v", v)] {
            if x.len() as u64 != n {
                return Err(BenchError::InvalidOptions(format!("{name} has {} elements, the shape needs {n}", x.len())));
            }
        }
        plan::check_fit(kernel, shape, dtype, &self.info.limits).map_err(BenchError::TooLarge)
    }

    /// Creates a buffer after checking it against the device's limits; adds its size to `alloc`.
    fn buffer(&self, label: &str, size: u64, usage: wgpu::BufferUsages, alloc: &mut u64) -> Result<wgpu::Buffer, BenchError> {
        let size = size.max(4).next_multiple_of(4);
        let limits = &self.info.limits;
        if size > limits.max_buffer_size {
            return Err(BenchError::TooLarge(format!("{label} needs {size} bytes, above max_buffer_size ({})", limits.max_buffer_size)));
        }
        if usage.contains(wgpu::BufferUsages::STORAGE) && size > limits.max_storage_buffer_binding_size {
            return Err(BenchError::TooLarge(format!(
                "{label} needs {size} bytes, above max_storage_buffer_binding_size ({})",
                limits.max_storage_buffer_binding_size
            )));
        }
        *alloc += size;
        Ok(self.device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation: false }))
    }

    fn inputs(&self, shape: AttentionShape, dtype: Dtype, q: &[f32], k: &[f32], v: &[f32], alloc: &mut u64) -> Result<Inputs, BenchError> {
        let params = Params { seq: shape.seq, head_dim: shape.head_dim, bh: shape.bh() as u32, scale: shape.scale() };
        let uniform = self.buffer("params", 16, wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST, alloc)?;
        self.queue.write_buffer(&uniform, 0, bytemuck::bytes_of(&params));
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        let bytes = shape.qkv_elems() * dtype.bytes();
        let mut make = |label: &str, data: &[f32]| -> Result<wgpu::Buffer, BenchError> {
            let b = self.buffer(label, bytes, usage, alloc)?;
            self.queue.write_buffer(&b, 0, &encode_values(data, dtype));
            Ok(b)
        };
        let (qb, kb, vb) = (make("q", q)?, make("k", k)?, make("v", v)?);
        Ok(Inputs { params: uniform, q: qb, k: kb, v: vb, dtype, out_bytes: bytes })
    }

    fn group(&self, label: &str, pipeline: &wgpu::ComputePipeline, buffers: &[&wgpu::Buffer]) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry> =
            buffers.iter().enumerate().map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() }).collect();
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        })
    }

    fn materialized_setup(&self, shape: AttentionShape, inputs: &Inputs, alloc: &mut u64) -> Result<MaterializedSetup, BenchError> {
        let dtype = inputs.dtype;
        let k = self.kernels_for(dtype)?;
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
        let s = self.buffer("scores", shape.score_elems() * dtype.bytes(), usage, alloc)?;
        let o = self.buffer("out", inputs.out_bytes, usage, alloc)?;
        Ok(MaterializedSetup {
            dtype,
            scores: self.group("scores", &k.scores, &[&inputs.params, &inputs.q, &inputs.k, &s]),
            softmax: self.group("softmax", &k.softmax, &[&inputs.params, &s]),
            pv: self.group("pv", &k.pv, &[&inputs.params, &s, &inputs.v, &o]),
            s,
            o,
        })
    }

    fn fused_setup(&self, inputs: &Inputs, alloc: &mut u64) -> Result<FusedSetup, BenchError> {
        let o = self.buffer("out", inputs.out_bytes, wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC, alloc)?;
        let group = self.group("fused", &self.kernels_for(inputs.dtype)?.fused, &[&inputs.params, &inputs.q, &inputs.k, &inputs.v, &o]);
        Ok(FusedSetup { dtype: inputs.dtype, o, group })
    }

    /// Scores, softmax and P·V as three compute passes (a timestamp at the start of the first
    /// and at the end of the last); optionally copies S aside before the softmax overwrites it.
    fn encode_materialized(
        &self,
        enc: &mut wgpu::CommandEncoder,
        shape: AttentionShape,
        setup: &MaterializedSetup,
        ts: Option<(&wgpu::QuerySet, u32)>,
        scores_copy: Option<&wgpu::Buffer>,
    ) {
        let (s, d, bh) = (shape.seq as u64, shape.head_dim as u64, shape.bh() as u32);
        let block = plan::BLOCK as u64;
        let k = if setup.dtype == Dtype::F16 { self.kernels.f16.as_ref().unwrap_or(&self.kernels.f32) } else { &self.kernels.f32 };
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("scores"),
                timestamp_writes: timestamp_writes(ts, true, false),
            });
            pass.set_pipeline(&k.scores);
            pass.set_bind_group(0, &setup.scores, &[]);
            pass.dispatch_workgroups(ceil_div(s, block), ceil_div(s, block), bh);
        }
        if let Some(dst) = scores_copy {
            enc.copy_buffer_to_buffer(&setup.s, 0, dst, 0, padded(shape.score_elems() * setup.dtype.bytes()));
        }
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("softmax"), timestamp_writes: None });
            pass.set_pipeline(&k.softmax);
            pass.set_bind_group(0, &setup.softmax, &[]);
            pass.dispatch_workgroups(shape.seq, bh, 1);
        }
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("pv"),
                timestamp_writes: timestamp_writes(ts, false, true),
            });
            pass.set_pipeline(&k.pv);
            pass.set_bind_group(0, &setup.pv, &[]);
            pass.dispatch_workgroups(ceil_div(d, block), ceil_div(s, block), bh);
        }
    }

    fn encode_fused(&self, enc: &mut wgpu::CommandEncoder, shape: AttentionShape, setup: &FusedSetup, ts: Option<(&wgpu::QuerySet, u32)>) {
        let mut pass = enc
            .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("fused"), timestamp_writes: timestamp_writes(ts, true, true) });
        let k = if setup.dtype == Dtype::F16 { self.kernels.f16.as_ref().unwrap_or(&self.kernels.f32) } else { &self.kernels.f32 };
        pass.set_pipeline(&k.fused);
        pass.set_bind_group(0, &setup.group, &[]);
        pass.dispatch_workgroups(ceil_div(shape.seq as u64, plan::FUSED_ROWS as u64), shape.bh() as u32, 1);
    }

    /// `warmup` untimed runs, then `runs` runs each submitted alone and awaited; GPU timestamps
    /// where enabled (validated: every run must have end > begin), else submit-to-done.
    async fn time_runs(&self, warmup: u32, runs: u32, alloc: &mut u64, encode: &Encode<'_>) -> Result<Timed, BenchError> {
        let runs = runs.clamp(1, plan::MAX_RUNS);
        let scope = ErrorScope::push(&self.device);
        let queries = if self.info.timestamps {
            let count = 2 * runs;
            let set = self.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count,
            });
            let bytes = count as u64 * wgpu::QUERY_SIZE as u64;
            let resolve = self.buffer("timestamps", bytes, wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC, alloc)?;
            let read = self.buffer("timestamps readback", bytes, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, alloc)?;
            Some((set, resolve, read, bytes))
        } else {
            None
        };
        scope.pop().await?;
        for _ in 0..warmup {
            let mut enc = self.device.create_command_encoder(&Default::default());
            encode(&mut enc, None);
            self.queue.submit([enc.finish()]);
            self.wait_idle().await?;
        }
        let mut wall = Vec::with_capacity(runs as usize);
        for r in 0..runs {
            let mut enc = self.device.create_command_encoder(&Default::default());
            encode(&mut enc, queries.as_ref().map(|(set, ..)| (set, 2 * r)));
            let cmd = enc.finish();
            let t0 = now_ms();
            self.queue.submit([cmd]);
            self.wait_idle().await?;
            wall.push(now_ms() - t0);
        }
        if let Some((set, resolve, read, bytes)) = &queries {
            let mut enc = self.device.create_command_encoder(&Default::default());
            enc.resolve_query_set(set, 0..2 * runs, resolve, 0);
            enc.copy_buffer_to_buffer(resolve, 0, read, 0, *bytes);
            self.queue.submit([enc.finish()]);
            let raw = self.read(read).await?;
            let ticks: Vec<u64> = raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
            let period = self.info.timestamp_period_ns;
            let gpu: Vec<f64> = ticks.chunks_exact(2).map(|p| p[1].wrapping_sub(p[0]) as f64 * period / 1e6).collect();
            let sane = gpu.len() == runs as usize
                && ticks.chunks_exact(2).all(|p| p[1] > p[0])
                && gpu.iter().zip(&wall).all(|(g, w)| g.is_finite() && *g <= w * 2.0 + 1.0);
            if sane {
                return Ok(Timed { times_ms: gpu, method: TimingMethod::GpuTimestamps, bytes_allocated: *alloc });
            }
        }
        Ok(Timed { times_ms: wall, method: TimingMethod::WallClock, bytes_allocated: *alloc })
    }

    /// Waits until the queue has run everything submitted so far.
    async fn wait_idle(&self) -> Result<(), BenchError> {
        let (tx, rx) = oneshot::channel::<()>();
        self.queue.on_submitted_work_done(move || {
            let _ = tx.send(());
        });
        self.poll()?;
        self.await_gpu(rx, "work-done").await?;
        self.check()
    }

    /// Blocks natively until the device is idle (callbacks fire); a no-op on the web.
    fn poll(&self) -> Result<(), BenchError> {
        match self.device.poll(wgpu::PollType::wait_indefinitely()) {
            Ok(_) => Ok(()),
            Err(e) => {
                self.check()?;
                Err(BenchError::Internal(e.to_string()))
            }
        }
    }

    /// Awaits a callback's channel, or the device's loss, whichever comes first.
    async fn await_gpu<T>(&self, mut rx: oneshot::Receiver<T>, what: &str) -> Result<T, BenchError> {
        std::future::poll_fn(|cx| match Pin::new(&mut rx).poll(cx) {
            Poll::Ready(Ok(v)) => Poll::Ready(Ok(v)),
            Poll::Ready(Err(_)) => Poll::Ready(Err(match self.check() {
                Err(e) => e,
                Ok(()) => BenchError::Readback(format!("the gpu dropped the {what} callback")),
            })),
            Poll::Pending => {
                let mut st = lock(&self.state);
                if let Some(m) = &st.lost {
                    return Poll::Ready(Err(BenchError::DeviceLost(m.clone())));
                }
                st.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }

    /// Maps a `MAP_READ` buffer and copies its bytes out.
    async fn read(&self, buffer: &wgpu::Buffer) -> Result<Vec<u8>, BenchError> {
        let (tx, rx) = oneshot::channel();
        buffer.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.poll()?;
        self.await_gpu(rx, "map").await?.map_err(|e| BenchError::Readback(e.to_string().to_lowercase()))?;
        let bytes = {
            let view = buffer.slice(..).get_mapped_range().map_err(|e| BenchError::Readback(e.to_string().to_lowercase()))?;
            view.to_vec()
        };
        buffer.unmap();
        self.check()?;
        Ok(bytes)
    }

    /// Reads `n` values of `dtype` back as f32.
    async fn read_values(&self, buffer: &wgpu::Buffer, dtype: Dtype, n: u64) -> Result<Vec<f32>, BenchError> {
        let bytes = self.read(buffer).await?;
        let mut out: Vec<f32> = match dtype {
            Dtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Dtype::F16 => bytes.chunks_exact(2).map(|c| reference::f16_bits_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect(),
        };
        out.truncate(n as usize);
        Ok(out)
    }
}

/// Buffer sizes and copies are multiples of 4 bytes (an odd count of f16 needs padding).
fn padded(bytes: u64) -> u64 {
    bytes.max(4).next_multiple_of(4)
}

/// The bytes of `data` as `dtype`, little-endian, padded to a multiple of 4.
fn encode_values(data: &[f32], dtype: Dtype) -> Vec<u8> {
    let mut bytes: Vec<u8> = match dtype {
        Dtype::F32 => data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::F16 => data.iter().flat_map(|&x| reference::f32_to_f16_bits(x).to_le_bytes()).collect(),
    };
    bytes.resize(padded(bytes.len() as u64) as usize, 0);
    bytes
}

fn classify(e: wgpu::Error) -> BenchError {
    match e {
        wgpu::Error::OutOfMemory { .. } => BenchError::OutOfMemory("out of memory".into()),
        wgpu::Error::Validation { description, .. } => BenchError::Validation(description),
        wgpu::Error::Internal { description, .. } => BenchError::Internal(description),
    }
}

/// Out-of-memory, internal and validation error scopes around a block of GPU calls.
///
/// Fields are declared innermost first, so that an early return (which drops the guards in
/// declaration order) pops them in the reverse of the order they were pushed.
struct ErrorScope {
    validation: wgpu::ErrorScopeGuard,
    internal: wgpu::ErrorScopeGuard,
    oom: wgpu::ErrorScopeGuard,
}

impl ErrorScope {
    fn push(device: &wgpu::Device) -> ErrorScope {
        ErrorScope {
            oom: device.push_error_scope(wgpu::ErrorFilter::OutOfMemory),
            internal: device.push_error_scope(wgpu::ErrorFilter::Internal),
            validation: device.push_error_scope(wgpu::ErrorFilter::Validation),
        }
    }

    /// Pops the scopes (innermost first) and reports the first error caught.
    async fn pop(self) -> Result<(), BenchError> {
        let validation = self.validation.pop();
        let internal = self.internal.pop();
        let oom = self.oom.pop();
        let (v, i, o) = (validation.await, internal.await, oom.await);
        match o.or(i).or(v) {
            Some(e) => Err(classify(e)),
            None => Ok(()),
        }
    }
}
