//! The sweep over sequence lengths on an opened GPU: [`Bench::sweep`] runs the plan of
//! [`super::plan`] point by point, with progress, cancellation and a time budget.

use super::gpu::Bench;
use super::info::TimingMethod;
use super::plan::{
    check_fit, fused_bytes, kernel_point, materialized_bytes, max_materializable_seq, seq_ladder, timestamp_bytes, CancelToken, Kernel,
    SweepOptions, SweepProgress,
};
use super::results::{Slopes, StopReason, SweepPoint, SweepResult};
use super::shape::{BenchError, Dtype};
use super::time::now_ms;

impl Bench {
    /// Sweeps seq over [`seq_ladder`]`(min_seq, max_seq)`: at each point, the materialized
    /// path (while it fits the device's limits and the memory cap) and the fused kernel
    /// (likewise; it usually goes further), each warmed up and timed `runs` times. A copy-
    /// bandwidth probe runs first. Stops at `max_seq`, when neither kernel fits, when the time
    /// budget would be exceeded, or when `cancel` is set; a stopped sweep still returns what it
    /// measured (see [`SweepResult::stop`]). `progress` is called before the first point and
    /// after each.
    pub async fn sweep(
        &self,
        opts: &SweepOptions,
        progress: &mut dyn FnMut(SweepProgress),
        cancel: &dyn CancelToken,
    ) -> Result<SweepResult, BenchError> {
        opts.validate()?;
        self.check()?;
        if opts.dtype == Dtype::F16 && !self.info().f16 {
            return Err(BenchError::Unsupported("f16 needs the adapter's shader-f16 feature, which this one lacks".into()));
        }
        let t0 = now_ms();
        let info = self.info().clone();
        let limits = &info.limits;
        let runs = opts.runs;
        let fits = |kernel: Kernel, s: u32| -> Result<(), StopReason> {
            let shape = opts.shape(s);
            check_fit(kernel, shape, opts.dtype, limits).map_err(|_| StopReason::AdapterLimit)?;
            let own = match kernel {
                Kernel::Materialized => materialized_bytes(shape, opts.dtype),
                Kernel::Fused => fused_bytes(shape, opts.dtype),
            };
            if own + timestamp_bytes(info.timestamps, runs) > opts.mem_cap_bytes {
                return Err(StopReason::MemoryCap);
            }
            Ok(())
        };
        let ladder = seq_ladder(opts.min_seq, opts.max_seq);
        let planned = ladder.iter().filter(|&&s| fits(Kernel::Materialized, s).is_ok() || fits(Kernel::Fused, s).is_ok()).count() as u32;
        progress(SweepProgress { done: 0, planned, seq: None, elapsed_ms: 0.0 });

        let copy = if opts.copy_probe_bytes > 0 && !cancel.is_cancelled() {
            let bytes = opts.copy_probe_bytes.min(opts.mem_cap_bytes / 2);
            if bytes >= 16 {
                Some(self.copy_bandwidth(bytes, runs).await?)
            } else {
                None
            }
        } else {
            None
        };
        let copy_gbps = copy.as_ref().map(|c| c.gb_per_s);

        let mut points: Vec<SweepPoint> = Vec::new();
        let mut mat_stop: Option<StopReason> = None;
        let mut fused_stop: Option<StopReason> = None;
        let mut stop: Option<StopReason> = None;
        // (seq, wall ms the kernel's whole measurement took) of each kernel's last point.
        let mut last_cost: [Option<(u32, f64)>; 2] = [None, None];
        let mut wall_clock_used = false;

        'points: for &s in &ladder {
            if cancel.is_cancelled() {
                stop = Some(StopReason::Cancelled);
                break;
            }
            self.check()?;
            if mat_stop.is_none() {
                mat_stop = fits(Kernel::Materialized, s).err();
            }
            if fused_stop.is_none() {
                fused_stop = fits(Kernel::Fused, s).err();
            }
            if mat_stop.is_some() && fused_stop.is_some() {
                stop = fused_stop;
                break;
            }
            let active: Vec<Kernel> = [(Kernel::Materialized, mat_stop), (Kernel::Fused, fused_stop)]
                .into_iter()
                .filter(|(_, st)| st.is_none())
                .map(|(k, _)| k)
                .collect();
            // Time cost grows as s² for both kernels: scale each kernel's last cost.
            let predicted: f64 =
                active.iter().map(|&k| last_cost[k as usize].map(|(s0, c)| c * (s as f64 / s0 as f64).powi(2)).unwrap_or(0.0)).sum();
            let elapsed = now_ms() - t0;
            if !points.is_empty() && elapsed + predicted > opts.budget_ms {
                stop = Some(StopReason::TimeBudget);
                break;
            }
            let shape = opts.shape(s);
            let mut point = SweepPoint { seq: s, score_bytes: shape.score_elems() * opts.dtype.bytes(), materialized: None, fused: None };
            for (i, &kernel) in active.iter().enumerate() {
                if i > 0 && cancel.is_cancelled() {
                    points.push(point);
                    stop = Some(StopReason::Cancelled);
                    break 'points;
                }
                let c0 = now_ms();
                let timed = match self.measure(kernel, shape, opts.dtype, opts.warmup, runs, opts.seed ^ (s as u64) << 8).await {
                    Ok(t) => t,
                    // The device's limits allowed the buffers but its memory did not: this
                    // kernel stops here, the sweep goes on with the other.
                    Err(BenchError::OutOfMemory(_)) => {
                        match kernel {
                            Kernel::Materialized => mat_stop = Some(StopReason::OutOfMemory),
                            Kernel::Fused => fused_stop = Some(StopReason::OutOfMemory),
                        }
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                last_cost[kernel as usize] = Some((s, now_ms() - c0));
                wall_clock_used |= timed.method == TimingMethod::WallClock;
                let kp = kernel_point(kernel, shape, opts.dtype, &timed.times_ms, timed.method, timed.bytes_allocated, copy_gbps);
                match kernel {
                    Kernel::Materialized => point.materialized = Some(kp),
                    Kernel::Fused => point.fused = Some(kp),
                }
            }
            if point.materialized.is_none() && point.fused.is_none() {
                stop = fused_stop.or(mat_stop);
                break;
            }
            points.push(point);
            progress(SweepProgress { done: points.len() as u32, planned, seq: Some(s), elapsed_ms: now_ms() - t0 });
        }

        let stop = stop.unwrap_or(StopReason::MaxSeq);
        let mut result = SweepResult {
            batch: opts.batch,
            heads: opts.heads,
            head_dim: opts.head_dim,
            dtype: opts.dtype,
            timing: if wall_clock_used || !info.timestamps { TimingMethod::WallClock } else { TimingMethod::GpuTimestamps },
            copy,
            largest_materialized_seq: points.iter().filter(|p| p.materialized.is_some()).map(|p| p.seq).max(),
            materializable_seq_limit: max_materializable_seq(opts.shape(1), opts.dtype, limits),
            materialized_stop: mat_stop.unwrap_or(stop),
            stop,
            elapsed_ms: now_ms() - t0,
            points,
            slopes: Slopes::default(),
            adapter: info,
        };
        result.slopes = Slopes::fit(&result.series(false), &result.series(true), opts.shape(1).bh() * opts.dtype.bytes());
        Ok(result)
    }
}
