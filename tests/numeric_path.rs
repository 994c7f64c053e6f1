//! One source, two paths: `estimate()` folds every formula to its number, `explain()` builds the
//! formulas in full — from the same term functions. Their bytes must agree everywhere.

use trainmem::config::decode_query;
use trainmem::estimator::expr::Expr;
use trainmem::estimator::ledger::Row;
use trainmem::estimator::{estimate, explain, flatten, presets, with_reserve};

/// Configurations that reach every kind of row: recipes, optimizers, sharding, offload,
/// adapters, recomputation, pipeline/tensor/context parallelism, eager attention, dropout.
const VARIANTS: &[&str] = &[
    "",
    "precision=mixed-bf16&zero=3&gpus=8",
    "precision=fp32&attn=eager&batch=2&seq=1024",
    "finetune=qlora&optim=adam8bit&recompute=full",
    "finetune=lora&lora_targets=q,v&precision=amp-bf16&dropout=0.1",
    "gpus=64&tp=4&pp=4&sp=1&zero=1&accum=8&recompute=selective",
    "gpus=16&cp=2&zero=2&optim=adafactor&offload=optimizer&seq=32768",
    "framework=megatron&precision=mixed-fp8&gpus=8&tp=8&optim=muon",
    "kernels=cpu&optim=lion&optim_impl=foreach&loss=chunked",
    "framework=litgpt&precision=bf16&recompute=full&batch=2",
];

fn rows(rows: &[Row]) -> Vec<(trainmem::estimator::ledger::RowId, u128)> {
    flatten(rows).into_iter().map(|r| (r.id, r.bytes)).collect()
}

#[test]
fn the_numeric_and_explained_paths_agree_to_the_byte_on_every_preset() {
    let mut checked = 0;
    let all = presets::presets();
    for p in &all {
        for v in VARIANTS {
            let q = format!("model={}&{v}", p.id);
            let cfg = decode_query(&q).config;
            // explain() also replays the step through the caching allocator: the same as adding
            // that replay to the numbers-only estimate.
            let (Ok(n), Ok(x)) = (estimate(&cfg).and_then(|e| with_reserve(&cfg, e)), explain(&cfg)) else {
                // A variant may not apply to every model (e.g. tp beyond the heads); both paths
                // must then refuse alike.
                assert_eq!(estimate(&cfg).err(), explain(&cfg).err(), "{q}");
                continue;
            };
            assert_eq!(rows(&n.components), rows(&x.components), "{q}");
            assert_eq!(rows(&n.host), rows(&x.host), "{q}");
            assert_eq!(n.memory, x.memory, "{q}");
            assert_eq!(n.timeline, x.timeline, "{q}");
            assert_eq!(rows(&n.textbook), rows(&x.textbook), "{q}");
            checked += 1;
        }
    }
    assert!(checked > all.len() * 5, "most variants apply ({checked} checked)");
}

#[test]
fn the_numeric_path_carries_bare_numbers_and_the_explained_path_carries_symbols() {
    let cfg = decode_query("model=llama-3.1-8b&zero=3&gpus=8").config;
    let n = estimate(&cfg).expect("valid");
    for r in flatten(&n.components) {
        assert_eq!(r.expr, Expr::Num(r.bytes), "{} is folded to its value", r.id);
    }
    let x = explain(&cfg).expect("valid");
    let weights = x.row(trainmem::estimator::ledger::RowId::Weights).expect("a weights row");
    assert_eq!(weights.expr.symbolic(), "⌈Ψ_T / N_d⌉ × b_w");
}
