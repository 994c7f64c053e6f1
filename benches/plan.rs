//! Planner speed: a search over 10⁵ configurations (target: ≤ 1 s natively). The figure to
//! report is the time of one whole search, with how many `estimate()` calls it made (printed
//! once before measuring).

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use trainmem::estimator::plan::{benchmark_request, PlanRequest, Search};

/// Llama-3.1-8B on 64 H100s at 4k tokens, 1,024 sequences per step, with every sharding,
/// recomputation, attention, optimizer, offload and layout knob open: 10⁵ configurations (the
/// page's test hook searches the same request).
pub fn request() -> PlanRequest {
    benchmark_request()
}

fn bench_plan(c: &mut Criterion) {
    let req = request();
    let started = std::time::Instant::now();
    let mut s = Search::new(req.clone()).expect("valid request");
    while !s.step(u64::MAX).done {}
    let p = s.progress();
    eprintln!(
        "plan search: {} configurations, {} estimate() calls ({} probes), {} fit, {} do not, {} pruned ({} by chains), {} dominated, {} invalid; first run {:.3} s",
        p.configurations,
        p.estimate_calls,
        p.probe_calls,
        p.fitting,
        p.not_fitting,
        p.pruned,
        p.pruned_by_chain,
        p.dominated,
        p.invalid,
        started.elapsed().as_secs_f64()
    );
    // Where the time goes (printed once): laying out the space, and estimate() and the cost
    // model alone on every fitting configuration the search found.
    let t = std::time::Instant::now();
    let fresh = Search::new(req.clone()).expect("valid request");
    let layout_s = t.elapsed().as_secs_f64();
    drop(fresh);
    let configs: Vec<_> = s.points().iter().map(|q| q.knobs.apply(&req.base)).collect();
    let t = std::time::Instant::now();
    for cfg in &configs {
        black_box(trainmem::estimator::estimate(cfg).ok());
    }
    let est_s = t.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    for cfg in &configs {
        black_box(trainmem::estimator::cost::step_cost(cfg, &req.assumptions).ok());
    }
    let cost_s = t.elapsed().as_secs_f64();
    eprintln!(
        "where it goes: laying out the space {:.3} s; estimate() on the {} fitting configurations {:.3} s ({:.0} µs each); the cost model on them {:.3} s",
        layout_s,
        configs.len(),
        est_s,
        1e6 * est_s / configs.len().max(1) as f64,
        cost_s
    );
    let mut g = c.benchmark_group("plan");
    g.sample_size(10);
    g.bench_function("search 1e5 configurations (llama-3.1-8b, 64 GPUs)", |b| {
        b.iter(|| {
            let mut s = Search::new(black_box(req.clone())).expect("valid request");
            while !s.step(u64::MAX).done {}
            black_box(s.progress())
        })
    });
    // Where the search's time goes: one estimate() and one cost-model call on a configuration
    // of the space (the search makes `estimate_calls` of the first and about as many of the
    // second); the rest is enumeration and bookkeeping.
    let one = trainmem::estimator::plan::Knobs {
        batch: 1,
        accum: 8,
        zero: trainmem::config::Zero::Z3,
        tp: 2,
        sp: true,
        ..trainmem::estimator::plan::Knobs::of(&req.base)
    }
    .apply(&req.base);
    g.bench_function("one estimate() of a configuration of the space", |b| {
        b.iter(|| black_box(trainmem::estimator::estimate(black_box(&one))))
    });
    g.bench_function("one cost::step_cost() of a configuration of the space", |b| {
        b.iter(|| black_box(trainmem::estimator::cost::step_cost(black_box(&one), &req.assumptions)))
    });
    g.bench_function("search 1e5 configurations + ranked result", |b| b.iter(|| black_box(Search::new(req.clone()).expect("valid").run())));
    g.finish();
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
