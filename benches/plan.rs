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
    let mut g = c.benchmark_group("plan");
    g.sample_size(10);
    g.bench_function("search 1e5 configurations (llama-3.1-8b, 64 GPUs)", |b| {
        b.iter(|| {
            let mut s = Search::new(black_box(req.clone())).expect("valid request");
            while !s.step(u64::MAX).done {}
            black_box(s.progress())
        })
    });
    g.bench_function("search 1e5 configurations + ranked result", |b| b.iter(|| black_box(Search::new(req.clone()).expect("valid").run())));
    g.finish();
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
