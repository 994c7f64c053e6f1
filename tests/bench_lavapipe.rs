//! The wgpu benchmark on a real adapter: Mesa's lavapipe (Vulkan on the CPU) where there is no
//! GPU. These tests FAIL when no adapter is found: install `mesa-vulkan-drivers` and set
//! `WGPU_BACKEND=vulkan` (scripts/test.sh does).

#![cfg(not(target_arch = "wasm32"))]

use std::cell::Cell;
use std::sync::atomic::AtomicBool;
use trainmem::bench::{
    decode_compact, encode_compact, fit_loglog, fused_bytes, materialized_bytes, reference, seq_ladder, verify, AttentionShape, Bench,
    BenchError, BenchOptions, Dtype, SharedResult, StopReason, SweepOptions, SweepProgress, SweepResult, TimingMethod,
};

fn bench_with(options: BenchOptions) -> Bench {
    match pollster::block_on(Bench::new(options)) {
        Ok(b) => b,
        Err(e) => panic!(
            "the benchmark tests need a GPU adapter. Without a GPU, install Mesa's lavapipe \
             (apt-get install mesa-vulkan-drivers) and set WGPU_BACKEND=vulkan. Error: {e}"
        ),
    }
}

fn bench() -> Bench {
    bench_with(BenchOptions::default())
}

/// A sweep small enough for lavapipe: one head, short sequences, three timed runs.
fn small(head_dim: u32, min_seq: u32, max_seq: u32) -> SweepOptions {
    SweepOptions {
        batch: 1,
        heads: 1,
        head_dim,
        min_seq,
        max_seq,
        mem_cap_bytes: 256 << 20,
        budget_ms: 120_000.0,
        warmup: 1,
        runs: 3,
        copy_probe_bytes: 1 << 20,
        seed: 7,
        dtype: Dtype::F32,
    }
}

fn sweep(b: &Bench, opts: &SweepOptions) -> SweepResult {
    pollster::block_on(b.sweep(opts, &mut |_| {}, &())).expect("the sweep runs")
}

fn timestamp_bytes(b: &Bench, runs: u32) -> u64 {
    if b.info().timestamps {
        2 * 2 * runs as u64 * 8
    } else {
        0
    }
}

const SHAPES: [AttentionShape; 3] = [
    AttentionShape { batch: 1, heads: 2, seq: 37, head_dim: 64 },
    AttentionShape { batch: 1, heads: 1, seq: 100, head_dim: 128 },
    AttentionShape { batch: 2, heads: 1, seq: 17, head_dim: 16 },
];

#[test]
fn fused_attention_matches_the_cpu_reference() {
    let b = bench();
    for (i, shape) in SHAPES.into_iter().enumerate() {
        let (q, k, v) = reference::random_qkv(shape, i as u64);
        let got = pollster::block_on(b.run_fused(shape, Dtype::F32, &q, &k, &v)).expect("the fused kernel runs");
        let err = reference::max_abs_diff(&got, &reference::attention(shape, &q, &k, &v));
        assert!(err < 1e-4, "{shape}: max abs error {err}");
    }
}

#[test]
fn materialized_attention_matches_the_cpu_reference() {
    let b = bench();
    for (i, shape) in SHAPES.into_iter().enumerate() {
        let (q, k, v) = reference::random_qkv(shape, 10 + i as u64);
        let got = pollster::block_on(b.run_materialized(shape, Dtype::F32, &q, &k, &v)).expect("the materialized path runs");
        let err = reference::max_abs_diff(&got.out, &reference::attention(shape, &q, &k, &v));
        assert!(err < 1e-4, "{shape}: max abs error {err}");
    }
}

#[test]
fn the_materialized_scores_equal_q_k_transposed_over_root_d() {
    let b = bench();
    for (i, shape) in SHAPES.into_iter().enumerate() {
        let (q, k, v) = reference::random_qkv(shape, 20 + i as u64);
        let got = pollster::block_on(b.run_materialized(shape, Dtype::F32, &q, &k, &v)).expect("the materialized path runs");
        assert_eq!(got.scores.len() as u64, shape.score_elems());
        let err = reference::max_abs_diff(&got.scores, &reference::scores(shape, &q, &k));
        assert!(err < 1e-4, "{shape}: max abs error {err}");
    }
}

#[test]
fn verify_passes_on_this_adapter() {
    let b = bench();
    let report = pollster::block_on(verify(&b)).expect("verify runs");
    assert!(report.passed, "{report:#?}");
    assert!(report.cases.iter().filter(|c| c.dtype == Dtype::F32).count() >= 3);
    assert_eq!(report.cases.iter().any(|c| c.dtype == Dtype::F16), b.info().f16);
}

#[test]
fn the_sweep_stops_at_max_seq_with_both_kernels_at_every_point() {
    let b = bench();
    let r = sweep(&b, &small(64, 16, 96));
    let seqs: Vec<u32> = r.points.iter().map(|p| p.seq).collect();
    assert_eq!(seqs, vec![16, 24, 32, 48, 64, 96]);
    assert!(r.points.iter().all(|p| p.materialized.is_some() && p.fused.is_some()));
    assert_eq!((r.stop, r.materialized_stop), (StopReason::MaxSeq, StopReason::MaxSeq));
    assert_eq!(r.largest_materialized_seq, Some(96));
    for p in &r.points {
        let shape = AttentionShape { batch: 1, heads: 1, seq: p.seq, head_dim: 64 };
        let (m, f) = (p.materialized.as_ref().unwrap(), p.fused.as_ref().unwrap());
        assert_eq!(p.score_bytes, shape.score_elems() * 4);
        assert_eq!(m.bytes_allocated, materialized_bytes(shape, Dtype::F32) + timestamp_bytes(&b, 3), "seq {}", p.seq);
        assert_eq!(f.bytes_allocated, fused_bytes(shape, Dtype::F32) + timestamp_bytes(&b, 3), "seq {}", p.seq);
        assert!(m.median_ms > 0.0 && f.median_ms > 0.0 && m.runs == 3);
        assert!(m.gb_per_s > 0.0 && m.gflop_per_s > 0.0 && m.fraction_of_copy.is_some_and(|x| x > 0.0));
    }
    assert!(r.copy.as_ref().is_some_and(|c| c.gb_per_s > 0.0));
}

#[test]
fn the_sweep_stops_the_materialized_path_at_the_memory_cap_and_goes_on_fused() {
    let b = bench();
    let ts = timestamp_bytes(&b, 3);
    let at = |s| AttentionShape { batch: 1, heads: 1, seq: s, head_dim: 8 };
    let cap = materialized_bytes(at(64), Dtype::F32) + ts + 1024;
    let opts = SweepOptions { mem_cap_bytes: cap, ..small(8, 16, 512) };
    let r = sweep(&b, &opts);
    assert_eq!(r.largest_materialized_seq, Some(64));
    assert_eq!(r.materialized_stop, StopReason::MemoryCap);
    // The fused kernel's memory is linear: it goes on as far as its own buffers fit the cap.
    let fused_last = seq_ladder(16, 512).into_iter().filter(|&s| fused_bytes(at(s), Dtype::F32) + ts <= cap).max().unwrap();
    assert!(fused_last > 64);
    assert_eq!(r.points.last().map(|p| p.seq), Some(fused_last));
    assert_eq!(r.stop, StopReason::MemoryCap);
    for p in &r.points {
        for k in [&p.materialized, &p.fused].into_iter().flatten() {
            assert!(k.bytes_allocated <= cap, "seq {}: {} bytes above the cap {cap}", p.seq, k.bytes_allocated);
        }
    }
}

#[test]
fn the_sweep_stops_at_artificially_small_adapter_limits() {
    // Buffers of at most 64 KiB: S = s² · 4 bytes fits up to s = 128.
    let b = bench_with(BenchOptions { max_buffer_bytes: Some(64 << 10), ..BenchOptions::default() });
    assert_eq!(b.info().limits.max_buffer_size, 64 << 10);
    assert_eq!(b.info().limits.max_storage_buffer_binding_size, 64 << 10);
    let r = sweep(&b, &small(8, 16, 512));
    assert_eq!(r.largest_materialized_seq, Some(128));
    assert_eq!(r.materialized_stop, StopReason::AdapterLimit);
    assert_eq!(r.materializable_seq_limit, 128);
    assert_eq!(r.points.last().map(|p| p.seq), Some(512), "the fused kernel needs only 16 KiB per buffer at 512");
    assert_eq!(r.stop, StopReason::MaxSeq);
    assert!(r.copy.as_ref().is_some_and(|c| c.bytes <= 64 << 10));
    // Asked directly for a shape beyond the limits, the bench refuses before touching the GPU.
    let shape = AttentionShape { batch: 1, heads: 1, seq: 256, head_dim: 8 };
    let (q, k, v) = reference::random_qkv(shape, 1);
    let err = pollster::block_on(b.run_materialized(shape, Dtype::F32, &q, &k, &v)).unwrap_err();
    assert!(matches!(err, BenchError::TooLarge(_)), "{err}");
    // And the device is still fine afterwards.
    assert!(pollster::block_on(b.run_fused(shape, Dtype::F32, &q, &k, &v)).is_ok());
}

#[test]
fn the_sweep_stops_at_the_time_budget() {
    let b = bench();
    let r = sweep(&b, &SweepOptions { budget_ms: 0.0, ..small(64, 256, 4096) });
    assert_eq!(r.points.len(), 1, "the first point always runs");
    assert_eq!(r.stop, StopReason::TimeBudget);
    assert_eq!(r.materialized_stop, StopReason::TimeBudget);

    let budget = 1500.0;
    let r = sweep(&b, &SweepOptions { budget_ms: budget, ..small(64, 256, 16384) });
    assert_eq!(r.stop, StopReason::TimeBudget);
    assert!(r.points.len() < seq_ladder(256, 16384).len());
    assert!(r.elapsed_ms < 4.0 * budget, "the sweep took {} ms for a {budget} ms budget", r.elapsed_ms);
}

#[test]
fn a_cancelled_sweep_stops_between_points_and_keeps_what_it_measured() {
    let b = bench();
    let cancel = Cell::new(false);
    let mut progress = |p: SweepProgress| {
        if p.done == 2 {
            cancel.set(true);
        }
    };
    let r = pollster::block_on(b.sweep(&small(64, 16, 1024), &mut progress, &cancel)).expect("a cancelled sweep is not an error");
    assert_eq!(r.points.len(), 2);
    assert_eq!(r.stop, StopReason::Cancelled);

    let flag = AtomicBool::new(true);
    let r = pollster::block_on(b.sweep(&small(64, 16, 1024), &mut |_| {}, &flag)).unwrap();
    assert!(r.points.is_empty() && r.stop == StopReason::Cancelled);
}

#[test]
fn progress_is_reported_before_the_first_point_and_after_each() {
    let b = bench();
    let mut seen: Vec<SweepProgress> = Vec::new();
    let r = pollster::block_on(b.sweep(&small(64, 16, 64), &mut |p| seen.push(p), &())).unwrap();
    let done: Vec<u32> = seen.iter().map(|p| p.done).collect();
    assert_eq!(done, vec![0, 1, 2, 3, 4, 5]);
    assert!(seen.iter().all(|p| p.planned == 5));
    assert_eq!(seen.last().and_then(|p| p.seq), Some(64));
    assert_eq!(r.points.len(), 5);
}

#[test]
fn memory_slopes_are_two_for_the_scores_and_one_for_the_fused_kernel() {
    let b = bench();
    let r = sweep(&b, &small(64, 128, 768));
    let fused_mem = r.slopes.fused.memory.expect("fused memory slope");
    let mat_mem = r.slopes.materialized.memory.expect("materialized memory slope");
    assert!((fused_mem - 1.0).abs() < 0.02, "fused memory slope {fused_mem}");
    assert!(mat_mem > 1.4 && mat_mem < 2.0, "materialized memory slope {mat_mem}");
    let scores: Vec<(f64, f64)> = r.points.iter().map(|p| (p.seq as f64, p.score_bytes as f64)).collect();
    assert!((fit_loglog(&scores).unwrap() - 2.0).abs() < 1e-9);
    assert!((r.slopes.scores_memory.expect("scores memory slope") - 2.0).abs() < 1e-9);
    for (name, t) in [("materialized", r.slopes.materialized.time), ("fused", r.slopes.fused.time)] {
        let t = t.expect("time slope");
        assert!(t > 1.2 && t < 2.8, "{name} time slope {t}");
    }
}

#[test]
fn results_travel_as_json_csv_and_a_compact_link_value() {
    let b = bench();
    let r = sweep(&b, &small(64, 16, 64));
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    for k in ["materialized", "fused"] {
        for m in ["time", "memory"] {
            assert!(json["slopes"][k][m].is_number(), "slopes.{k}.{m} in {}", json["slopes"]);
        }
    }
    assert_eq!(json["points"].as_array().unwrap().len(), r.points.len());
    assert!(json["adapter"]["limits"]["max_buffer_size"].is_u64());
    let back: SweepResult = serde_json::from_value(json).unwrap();
    assert_eq!(back.points.len(), r.points.len());

    let csv = r.to_csv();
    assert_eq!(csv.lines().count(), r.points.len() + 1);
    assert!(csv.lines().all(|l| l.split(',').count() == 11));

    let text = encode_compact(&r);
    assert!(text.len() < 500, "{text}");
    let shared = decode_compact(&text).expect("round-trips");
    assert_eq!(shared, SharedResult::from_result(&r));
    assert_eq!(shared.points.len(), r.points.len());
    assert!(decode_compact(&text.replace('.', "!")).is_err());
}

#[test]
fn without_timestamps_runs_are_timed_on_the_wall_clock() {
    let b = bench_with(BenchOptions { use_timestamps: false, ..BenchOptions::default() });
    assert!(!b.info().timestamps);
    let r = sweep(&b, &small(64, 64, 128));
    assert_eq!(r.timing, TimingMethod::WallClock);
    assert!(r
        .points
        .iter()
        .flat_map(|p| [&p.materialized, &p.fused])
        .flatten()
        .all(|k| k.median_ms > 0.0 && k.timing == TimingMethod::WallClock));
}

#[test]
fn timestamps_are_used_where_the_adapter_has_them() {
    let b = bench();
    let has = b.info().features.iter().any(|f| f == "timestamp-query");
    assert_eq!(b.info().timestamps, has);
    if has {
        let r = sweep(&b, &small(64, 64, 128));
        assert_eq!(r.timing, TimingMethod::GpuTimestamps, "timestamps were enabled but every run fell back to the wall clock");
        assert!(b.info().timestamp_period_ns > 0.0);
    }
}

#[test]
fn a_lost_device_is_an_error_not_a_panic() {
    let b = bench();
    b.lose_device();
    let err = pollster::block_on(b.sweep(&small(64, 16, 32), &mut |_| {}, &())).unwrap_err();
    assert!(matches!(err, BenchError::DeviceLost(_)), "{err}");
    let shape = AttentionShape { batch: 1, heads: 1, seq: 16, head_dim: 8 };
    let (q, k, v) = reference::random_qkv(shape, 1);
    let err = pollster::block_on(b.run_fused(shape, Dtype::F32, &q, &k, &v)).unwrap_err();
    assert!(matches!(err, BenchError::DeviceLost(_)), "{err}");
    assert!(err.to_string().starts_with("the gpu device was lost"));
}

#[test]
fn invalid_options_are_refused_before_any_gpu_work() {
    let b = bench();
    for opts in [SweepOptions { heads: 0, ..small(64, 16, 32) }, SweepOptions { head_dim: 256, ..small(64, 16, 32) }] {
        let err = pollster::block_on(b.sweep(&opts, &mut |_| {}, &())).unwrap_err();
        assert!(matches!(err, BenchError::InvalidOptions(_)), "{err}");
    }
    let shape = AttentionShape { batch: 1, heads: 1, seq: 16, head_dim: 8 };
    let err = pollster::block_on(b.run_fused(shape, Dtype::F32, &[0.0; 3], &[0.0; 3], &[0.0; 3])).unwrap_err();
    assert!(matches!(err, BenchError::InvalidOptions(_)), "{err}");
}

#[test]
fn the_cli_prints_a_table_or_json_with_slopes() {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut out = Vec::new();
    trainmem::bench::cli::run(&args(&["--max-seq", "384", "--heads", "1", "--json"]), &mut out).expect("bench --json runs");
    let json: serde_json::Value = serde_json::from_slice(&out).expect("bench --json prints JSON");
    assert!(json["slopes"]["materialized"]["time"].is_number() && json["slopes"]["fused"]["memory"].is_number());
    assert_eq!(json["points"].as_array().unwrap().len(), 2, "seq 256 and 384");

    let mut out = Vec::new();
    trainmem::bench::cli::run(&args(&["--max-seq", "256", "--heads", "1"]), &mut out).expect("bench runs");
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("adapter: ") && text.contains("copy bandwidth") && text.contains("log-log slopes"), "{text}");

    let err = trainmem::bench::cli::run(&args(&["--heads", "0"]), &mut Vec::new()).unwrap_err();
    assert!(err.contains("invalid benchmark options"), "{err}");
}

/// A bench with `shader-f16` (lavapipe has it; so do most GPUs).
fn f16_bench() -> Bench {
    let b = bench();
    assert!(b.info().f16, "the f16 tests need an adapter with shader-f16 (lavapipe has it); this one ({}) lacks it", b.info().name);
    b
}

#[test]
fn half_precision_kernels_match_the_cpu_reference_on_f16_inputs() {
    let b = f16_bench();
    for (i, shape) in SHAPES.into_iter().enumerate() {
        let (q, k, v) = reference::random_qkv(shape, 30 + i as u64);
        let (q, k, v) = (reference::round_to_f16(&q), reference::round_to_f16(&k), reference::round_to_f16(&v));
        let want_s = reference::scores(shape, &q, &k);
        let want_o = reference::attention(shape, &q, &k, &v);
        let mat = pollster::block_on(b.run_materialized(shape, Dtype::F16, &q, &k, &v)).expect("the f16 materialized path runs");
        let fused = pollster::block_on(b.run_fused(shape, Dtype::F16, &q, &k, &v)).expect("the f16 fused kernel runs");
        // S is stored in f16: within half an f16 ulp of |S| (≤ 2⁻¹¹·|S|).
        for (got, want) in mat.scores.iter().zip(&want_s) {
            assert!((got - want).abs() <= want.abs() * 2f32.powi(-11) + 1e-6, "{shape}: S {got} vs {want}");
        }
        for (name, out) in [("materialized", &mat.out), ("fused", &fused)] {
            let err = reference::max_abs_diff(out, &want_o);
            assert!(err < 4e-3, "{shape}: {name} max abs error {err}");
        }
        // And f16 is really stored: the output is not what f32 storage gives, bit for bit.
        let exact = pollster::block_on(b.run_fused(shape, Dtype::F32, &q, &k, &v)).unwrap();
        assert!(reference::max_abs_diff(&fused, &exact) > 0.0, "{shape}: f16 output identical to f32");
    }
}

#[test]
fn a_half_precision_sweep_halves_the_bytes() {
    let b = f16_bench();
    let r = sweep(&b, &SweepOptions { dtype: Dtype::F16, ..small(64, 64, 128) });
    assert_eq!(r.dtype, Dtype::F16);
    let ts = timestamp_bytes(&b, 3);
    for p in &r.points {
        let shape = AttentionShape { batch: 1, heads: 1, seq: p.seq, head_dim: 64 };
        assert_eq!(p.score_bytes, shape.score_elems() * 2);
        assert_eq!(p.materialized.as_ref().unwrap().bytes_allocated, materialized_bytes(shape, Dtype::F16) + ts);
        assert_eq!(p.fused.as_ref().unwrap().bytes_allocated, fused_bytes(shape, Dtype::F16) + ts);
        assert_eq!(2 * (materialized_bytes(shape, Dtype::F16) - 16), materialized_bytes(shape, Dtype::F32) - 16);
    }
    let shared = decode_compact(&encode_compact(&r)).unwrap();
    assert_eq!(shared.dtype, Dtype::F16);
}

#[test]
fn f16_is_refused_clearly_where_shader_f16_is_off() {
    let b = bench_with(BenchOptions { use_f16: false, ..BenchOptions::default() });
    assert!(!b.info().f16);
    let err = pollster::block_on(b.sweep(&SweepOptions { dtype: Dtype::F16, ..small(64, 16, 32) }, &mut |_| {}, &())).unwrap_err();
    assert!(matches!(err, BenchError::Unsupported(_)), "{err}");
    let shape = AttentionShape { batch: 1, heads: 1, seq: 16, head_dim: 8 };
    let (q, k, v) = reference::random_qkv(shape, 1);
    let err = pollster::block_on(b.run_fused(shape, Dtype::F16, &q, &k, &v)).unwrap_err();
    assert!(err.to_string().contains("shader-f16"), "{err}");
    let report = pollster::block_on(verify(&b)).unwrap();
    assert!(report.passed && report.cases.iter().all(|c| c.dtype == Dtype::F32));
}
