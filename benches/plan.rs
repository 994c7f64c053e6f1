//! Planner speed: a search over 10⁵ configurations (target: ≤ 1 s natively). The figure to
//! report is the time of one whole search, with how many `estimate()` calls it made (printed
//! once before measuring).

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use trainmem::config::{decode_query, Attention, Offload, OptimImpl, Optimizer, Recompute, Zero};
use trainmem::estimator::plan::{GlobalBatch, PlanRequest, Search, Space};

/// Llama-3.1-8B on 64 H100s at 4k tokens, 1,024 sequences per step, with every sharding,
/// recomputation, attention, optimizer, offload and layout knob open: 10⁵ configurations.
pub fn request() -> PlanRequest {
    let base = decode_query("model=llama-3.1-8b&gpus=64&seq=4096").config;
    let space = Space {
        batch: Vec::new(),
        zero: vec![Zero::Ddp, Zero::Z1, Zero::Z2, Zero::Z3, Zero::HybridShard],
        recompute: vec![Recompute::None, Recompute::Selective, Recompute::Full],
        attn: vec![Attention::Eager, Attention::Sdpa, Attention::Flash],
        optim: vec![Optimizer::Adamw, Optimizer::Adam8bit],
        optim_impl: vec![OptimImpl::Fused, OptimImpl::Foreach],
        offload: vec![Offload::None, Offload::Optimizer, Offload::OptimizerParams],
        tp: vec![1, 2, 4, 8],
        pp: vec![1, 2, 4],
        vpp: vec![1],
        cp: vec![1, 2],
        ep: vec![1],
        sp: vec![false, true],
        finetune: vec![trainmem::config::Finetune::Full],
    };
    PlanRequest { base, global_batch: GlobalBatch::Sequences(1024), space, assumptions: Default::default(), keep: 20, skip_dominated: true }
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
