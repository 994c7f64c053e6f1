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
    c.bench_function("decode query", |b| b.iter(|| decode_query(black_box("model=llama-3.1-70b&seq=8192&zero=3&gpus=8&attn=eager"))));
}

criterion_group!(benches, bench_estimate);
criterion_main!(benches);
