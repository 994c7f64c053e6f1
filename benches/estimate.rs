//! `estimate()` speed: the UI recomputes the whole ledger on every input change, and the charts
//! run it once per sweep point, so it must stay in the microseconds.

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use trainmem::config::{decode_query, Config};
use trainmem::estimator::estimate;

fn bench_estimate(c: &mut Criterion) {
    let default = Config::default();
    c.bench_function("estimate llama-3.1-8b default", |b| b.iter(|| estimate(black_box(&default))));
    let big = decode_query("model=llama-3.1-405b&gpus=16384&tp=8&pp=16&zero=1&seq=1m&cp=16&attn=eager").config;
    c.bench_function("estimate llama-3.1-405b 16k gpus", |b| b.iter(|| estimate(black_box(&big))));
    let moe = decode_query("model=mixtral-8x7b-v0.1&gpus=64&ep=8&zero=3&finetune=qlora&optim=adam8bit").config;
    c.bench_function("estimate mixtral qlora", |b| b.iter(|| estimate(black_box(&moe))));
    // The full simulation (issue 11's target: ≤ 1 ms): Llama-3.1-405B, 128 layers, pp = 16 (the
    // most loaded stage's 8 layers, found once by the estimate), its whole event stream
    // materialized.
    let pp16 = decode_query("model=llama-3.1-405b&gpus=128&tp=8&pp=16&seq=8192").config;
    let pp16_at = trainmem::estimator::stream_at(&pp16).expect("a valid configuration");
    let default_at = trainmem::estimator::stream_at(&default).expect("a valid configuration");
    c.bench_function("step stream llama-3.1-405b pp16", |b| b.iter(|| trainmem::estimator::stream_of(black_box(&pp16), pp16_at)));
    c.bench_function("estimate llama-3.1-405b pp16", |b| b.iter(|| estimate(black_box(&pp16))));
    // Beside the numeric path, the full explained ledger (every row's formula, substitution and
    // source, and the caching allocator's replay): what opening the ledger and `--json` cost.
    c.bench_function("explain llama-3.1-8b default", |b| b.iter(|| trainmem::estimator::explain(black_box(&default))));
    c.bench_function("explain llama-3.1-405b pp16", |b| b.iter(|| trainmem::estimator::explain(black_box(&pp16))));
    c.bench_function("reserved (stream + allocator replay) llama-3.1-405b pp16", |b| {
        b.iter(|| trainmem::estimator::reserve::reserved(black_box(&pp16), pp16_at))
    });
    c.bench_function("reserved (stream + allocator replay) llama-3.1-8b default", |b| {
        b.iter(|| trainmem::estimator::reserve::reserved(black_box(&default), default_at))
    });
    // What the page's every input and each point of a chart sweep run: the estimate, then the
    // caching allocator's replay of the step (`estimator::analyse`, the one front door).
    c.bench_function("analyse llama-3.1-8b default", |b| b.iter(|| trainmem::estimator::analyse(black_box(&default))));
    c.bench_function("analyse llama-3.1-405b pp16", |b| b.iter(|| trainmem::estimator::analyse(black_box(&pp16))));
    c.bench_function("decode query", |b| b.iter(|| decode_query(black_box("model=llama-3.1-70b&seq=8192&zero=3&gpus=8&attn=eager"))));
}

criterion_group!(benches, bench_estimate);
criterion_main!(benches);
