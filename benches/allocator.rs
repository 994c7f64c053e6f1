//! Caching-allocator replay speed: every estimate replays one training step's allocation stream
//! (≈ 10,000 events for a 126-layer model), so a replay must stay well under a millisecond.
//!
//! The stream is synthetic but shaped like a transformer step (bf16, micro-batch 1, 4k tokens,
//! hidden 8192, 64 heads, 8 KV heads, MLP 28672 — Llama-3.1-70B widths): per layer the forward keeps
//! the tensors autograd saves and frees its temporaries; the backward walks the layers in reverse,
//! allocating gradient temporaries and freeing each layer's saved tensors.

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use trainmem::estimator::allocator::{replay, AllocEvent, AllocatorOptions};

const TOKENS: u64 = 4096;
const HIDDEN: u64 = 8192;
const HEADS: u64 = 64;
const KV_HIDDEN: u64 = 1024;
const MLP: u64 = 28672;
const BF16: u64 = 2;
const FP32: u64 = 4;

/// One layer's forward tensors that autograd keeps until the backward, in bytes.
fn saved_per_layer() -> Vec<u64> {
    vec![
        TOKENS * HIDDEN * BF16,    // input to the attention norm
        TOKENS * FP32,             // norm's rstd
        TOKENS * HIDDEN * BF16,    // normed input (q projection input)
        TOKENS * HIDDEN * BF16,    // q
        TOKENS * KV_HIDDEN * BF16, // k
        TOKENS * KV_HIDDEN * BF16, // v
        TOKENS * HIDDEN * BF16,    // attention output
        TOKENS * HEADS * FP32,     // flash-attention logsumexp (1 MiB)
        TOKENS * HIDDEN * BF16,    // o-projection input
        TOKENS * HIDDEN * BF16,    // residual
        TOKENS * FP32,             // MLP norm rstd
        TOKENS * HIDDEN * BF16,    // normed MLP input
        TOKENS * MLP * BF16,       // gate
        TOKENS * MLP * BF16,       // up
        TOKENS * MLP * BF16,       // silu(gate) * up
    ]
}

/// One layer's short-lived forward temporaries.
fn forward_temporaries() -> Vec<u64> {
    vec![TOKENS * HIDDEN * FP32, TOKENS * MLP * BF16, TOKENS * HIDDEN * BF16, 8 << 20, 512, 4096]
}

/// One layer's backward temporaries (gradients of activations, recomputed pieces).
fn backward_temporaries() -> Vec<u64> {
    vec![
        TOKENS * HIDDEN * BF16,
        TOKENS * MLP * BF16,
        TOKENS * MLP * BF16,
        TOKENS * HIDDEN * FP32,
        TOKENS * HIDDEN * BF16,
        TOKENS * KV_HIDDEN * BF16,
        TOKENS * KV_HIDDEN * BF16,
        TOKENS * HIDDEN * BF16,
        TOKENS * HEADS * FP32,
        33 << 20,
        1024,
    ]
}

/// One layer's weight gradients (q, k, v, o, gate, up, down in bf16), kept until the optimizer.
fn weight_gradients() -> Vec<u64> {
    vec![
        HIDDEN * HIDDEN * BF16,
        HIDDEN * KV_HIDDEN * BF16,
        HIDDEN * KV_HIDDEN * BF16,
        HIDDEN * HIDDEN * BF16,
        HIDDEN * MLP * BF16,
        HIDDEN * MLP * BF16,
        HIDDEN * MLP * BF16,
    ]
}

/// A forward-then-backward event stream over `layers` layers, ending with the optimizer freeing
/// the weight gradients.
fn transformer_step(layers: u32) -> Vec<AllocEvent> {
    let saved = saved_per_layer();
    let fwd_tmp = forward_temporaries();
    let bwd_tmp = backward_temporaries();
    let wgrad = weight_gradients();
    let mut weight_grads = Vec::new();
    let mut events = Vec::new();
    let mut next_id = 0u32;
    let mut id = || {
        next_id += 1;
        next_id
    };
    let mut saved_ids: Vec<Vec<u32>> = Vec::new();
    for _ in 0..layers {
        let mut keep = Vec::new();
        for (k, &bytes) in saved.iter().enumerate() {
            let s = id();
            events.push(AllocEvent::Alloc { id: s, bytes });
            keep.push(s);
            if let Some(&t_bytes) = fwd_tmp.get(k % fwd_tmp.len()).filter(|_| k % 2 == 0) {
                let t = id();
                events.push(AllocEvent::Alloc { id: t, bytes: t_bytes });
                events.push(AllocEvent::Free { id: t });
            }
        }
        saved_ids.push(keep);
    }
    for keep in saved_ids.into_iter().rev() {
        let mut grads = Vec::new();
        for (k, &bytes) in bwd_tmp.iter().enumerate() {
            let g = id();
            events.push(AllocEvent::Alloc { id: g, bytes });
            grads.push(g);
            if k % 2 == 1 {
                if let Some(g) = grads.pop() {
                    events.push(AllocEvent::Free { id: g });
                }
            }
        }
        for s in keep.into_iter().rev() {
            events.push(AllocEvent::Free { id: s });
        }
        for g in grads {
            events.push(AllocEvent::Free { id: g });
        }
        for &bytes in &wgrad {
            let w = id();
            events.push(AllocEvent::Alloc { id: w, bytes });
            weight_grads.push(w);
        }
    }
    events.extend(weight_grads.into_iter().map(|id| AllocEvent::Free { id }));
    events
}

fn bench_replay(c: &mut Criterion) {
    let step = transformer_step(126);
    let default = AllocatorOptions::default();
    let expandable = AllocatorOptions { expandable_segments: true, ..Default::default() };
    let tuned: AllocatorOptions = "max_split_size_mb:128,roundup_power2_divisions:[64:8,>:1]".parse().expect("valid");
    let r = replay(&step, &default).expect("valid stream");
    eprintln!(
        "{} events; peak allocated {:.2} GiB, peak reserved {:.2} GiB",
        step.len(),
        r.peak_allocated as f64 / (1u64 << 30) as f64,
        r.peak_reserved as f64 / (1u64 << 30) as f64
    );
    let label = format!("replay {} events, 126 layers", step.len());
    c.bench_function(&format!("{label}, default"), |b| b.iter(|| replay(black_box(&step), black_box(&default))));
    c.bench_function(&format!("{label}, expandable_segments"), |b| b.iter(|| replay(black_box(&step), black_box(&expandable))));
    c.bench_function(&format!("{label}, max_split 128 + roundup"), |b| b.iter(|| replay(black_box(&step), black_box(&tuned))));
}

criterion_group!(benches, bench_replay);
criterion_main!(benches);
