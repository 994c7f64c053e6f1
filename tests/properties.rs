//! Invariants of the estimator over random configurations: totals add up, memory grows with
//! the model, the batch and the sequence, and sharding never adds bytes per GPU.

use proptest::prelude::*;
use trainmem::config::{decode_query, Attention, Config, Finetune, Optimizer, Precision, Recompute, Zero};
use trainmem::estimator::ledger::Bytes;
use trainmem::estimator::{estimate, flatten, presets::presets, Estimate};

fn est(c: &Config) -> Estimate {
    estimate(c).unwrap_or_else(|e| panic!("{e} for {}", trainmem::config::encode_query(c)))
}

/// The presets the estimator accepts: a preset whose architecture has a feature without a
/// measured fixture (see `estimator::unmodelled_feature`) is refused, not estimated.
fn preset_ids() -> Vec<&'static str> {
    presets().iter().filter(|p| trainmem::estimator::unmodelled_feature(&p.spec).is_none()).map(|p| p.id).collect()
}

prop_compose! {
    /// A valid single-GPU configuration of a random preset.
    fn any_config()(
        model in prop::sample::select(preset_ids()),
        batch in 1u64..8,
        seq_pow in 6u32..14,
        precision in prop::sample::select(vec![Precision::Fp32, Precision::Bf16, Precision::AmpBf16, Precision::MixedBf16, Precision::MixedBf16Fp32grad, Precision::MixedFp8]),
        optim in prop::sample::select(vec![Optimizer::Sgd, Optimizer::Momentum, Optimizer::Adamw, Optimizer::Adafactor, Optimizer::Lion, Optimizer::Adam8bit, Optimizer::Muon]),
        attn in prop::sample::select(vec![Attention::Eager, Attention::Sdpa, Attention::Flash]),
        recompute in prop::sample::select(vec![Recompute::None, Recompute::Selective, Recompute::Full]),
        finetune in prop::sample::select(vec![Finetune::Full, Finetune::Lora, Finetune::Qlora]),
    ) -> Config {
        let mut c = decode_query(&format!("model={model}")).config;
        c.batch = batch;
        c.seq = 1 << seq_pow;
        c.precision = precision;
        c.optim = optim;
        c.attn = attn;
        c.recompute = recompute;
        c.finetune = finetune;
        // FP8 GEMMs do not apply to QLoRA's 4-bit base (refused, naming `fp8`): its mixed
        // precision is bf16.
        if finetune == Finetune::Qlora && precision == Precision::MixedFp8 {
            c.precision = Precision::MixedBf16;
        }
        c
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_total_is_the_sum_of_the_rows_and_every_row_equals_its_formula(c in any_config()) {
        let e = est(&c);
        let sum: Bytes = e.components.iter().map(|r| r.bytes).sum();
        prop_assert_eq!(e.memory.total, sum);
        for r in flatten(&e.components) {
            prop_assert_eq!(r.bytes, r.expr.eval(), "{}", r.id);
            if !r.children.is_empty() {
                prop_assert_eq!(r.bytes, r.children.iter().map(|x| x.bytes).sum::<Bytes>(), "{}", r.id);
            }
        }
    }

    #[test]
    fn the_peak_never_exceeds_the_sum_of_components(c in any_config()) {
        let e = est(&c);
        prop_assert!(e.memory.peak <= e.memory.total, "peak {} > total {}", e.memory.peak, e.memory.total);
        prop_assert!(e.memory.peak >= e.memory.parameters + e.memory.optimizer_states);
    }

    #[test]
    fn activations_strictly_grow_with_batch_and_sequence(c in any_config()) {
        let base = est(&c).memory.activations;
        let more_batch = est(&Config { batch: c.batch + 1, ..c.clone() }).memory.activations;
        let more_seq = est(&Config { seq: c.seq * 2, ..c.clone() }).memory.activations;
        prop_assert!(more_batch > base);
        prop_assert!(more_seq > base);
    }

    /// From 256 tokens on. Below the head dim it can fail, and rightly: Phi-3's SDPA path keeps
    /// the whole fused QKV output plus a copy of its output (FINDINGS.md §2.3), 3·b·s·a·d more
    /// than eager, while eager's scores are only 6·b·a·s².
    #[test]
    // From 2k tokens on, where the s² scores dominate: at a few hundred tokens a fused kernel's
    // contiguous q/k/v copies and its log-sum-exp can outweigh eager's scores (Phi-3, fp32,
    // CUDA: 4.85 GB SDPA vs 4.78 GB eager at 256 tokens).
    fn eager_attention_keeps_at_least_as_much_as_sdpa(c in any_config(), seq_pow in 11u32..14) {
        let c = Config { seq: 1 << seq_pow, ..c };
        let eager = est(&Config { attn: Attention::Eager, ..c.clone() }).memory.activations;
        let sdpa = est(&Config { attn: Attention::Sdpa, ..c.clone() }).memory.activations;
        prop_assert!(eager >= sdpa);
    }

    #[test]
    fn full_recomputation_keeps_less_than_none(c in any_config()) {
        let full = est(&Config { recompute: Recompute::Full, ..c.clone() }).memory.activations;
        let none = est(&Config { recompute: Recompute::None, ..c.clone() }).memory.activations;
        prop_assert!(full < none);
    }

    #[test]
    fn per_gpu_activations_never_grow_with_tensor_or_context_parallelism(c in any_config(), sp in any::<bool>()) {
        let c = Config { sp, ..c };
        let one = est(&c).memory.activations;
        for tp in [2u64, 4, 8] {
            if c.arch.heads.is_multiple_of(tp) {
                let t = est(&Config { tp, gpus: tp, ..c.clone() }).memory.activations;
                prop_assert!(t <= one, "tp {}: {} > {}", tp, t, one);
            }
        }
        for cp in [2u64, 4] {
            let x = est(&Config { cp, gpus: cp, ..c.clone() }).memory.activations;
            prop_assert!(x <= one, "cp {}: {} > {}", cp, x, one);
        }
    }

    #[test]
    fn zero_stages_never_add_bytes_per_gpu(c in any_config(), gpus in prop::sample::select(vec![2u64, 8, 64])) {
        let c = Config { gpus, finetune: Finetune::Full, ..c };
        let states = |z: Zero| {
            let e = est(&Config { zero: z, ..c.clone() });
            e.memory.parameters + e.memory.gradients + e.memory.optimizer_states
        };
        let (ddp, z1, z2, z3) = (states(Zero::Ddp), states(Zero::Z1), states(Zero::Z2), states(Zero::Z3));
        prop_assert!(z3 <= z2 && z2 <= z1 && z1 <= ddp, "ddp {} z1 {} z2 {} z3 {}", ddp, z1, z2, z3);
    }

    #[test]
    fn more_gpus_never_add_model_states_per_gpu_under_zero_3(c in any_config()) {
        let states = |gpus: u64| {
            let e = est(&Config { gpus, zero: Zero::Z3, ..c.clone() });
            e.memory.parameters + e.memory.gradients + e.memory.optimizer_states
        };
        prop_assert!(states(16) <= states(8));
        prop_assert!(states(8) <= states(2));
    }

    #[test]
    fn parameters_grow_with_layers_and_hidden_size(c in any_config()) {
        let n = c.arch.counts().total;
        let mut deeper = c.arch.clone();
        deeper.layers += 1;
        prop_assert!(deeper.counts().total > n);
        let mut wider = c.arch.clone();
        wider.hidden += 64;
        prop_assert!(wider.counts().total > n);
        // What decides the fit grows: the step's peak, and what nvidia-smi shows. Not the sum
        // of the ledger's rows: its working-memory row is what is alive at the peak, so when a
        // layer more moves the peak from the loss's backward (the logits' gradients) into the
        // layers' (GPT-2, fp32, full recomputation, 1K tokens: 12 → 13 layers), that row
        // shrinks by more than the layer adds (sum 2.33 → 2.07 GB, peak 1.68 → 1.74 GB).
        let (deeper, base) = (est(&Config { arch: deeper, model: "custom".into(), ..c.clone() }).memory, est(&c).memory);
        prop_assert!(deeper.peak > base.peak, "peak {} → {}", base.peak, deeper.peak);
        prop_assert!(deeper.nvidia_smi >= base.nvidia_smi, "nvidia-smi {:?} → {:?}", base.nvidia_smi, deeper.nvidia_smi);
    }
}

#[test]
fn nothing_overflows_at_405b_parameters_on_16384_gpus_with_a_million_tokens() {
    let c = decode_query("model=llama-3.1-405b&gpus=16384&tp=8&pp=16&zero=1&seq=1m&attn=eager&batch=4").config;
    let e = est(&c);
    // Eager scores alone: 126/16 layers × 4 × 128/8 heads × (2^20)² × 6 B ≈ 8 × 10^14 per GPU.
    assert!(e.memory.activations > 100_000_000_000_000);
    assert!(e.cluster_total() > e.memory.peak * 16_000);
    assert_eq!(e.memory.total, e.components.iter().map(|r| r.bytes).sum::<Bytes>());
}

#[test]
fn gradient_accumulation_does_not_change_peak_activations() {
    let a = est(&Config::default());
    let b = est(&Config { accum: 8, ..Config::default() });
    assert_eq!(a.memory.activations, b.memory.activations);
    // ... but the gradients stay resident through the forward of later micro-batches.
    assert!(b.memory.peak >= a.memory.peak);
}
