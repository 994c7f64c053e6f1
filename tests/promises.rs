//! What the page promises, it keeps (issue 30): every fix, one-click answer and plan is decided by
//! the same verdict as the page (`estimator::analyse`: nvidia-smi against the usable capacity),
//! and its own share link, decoded and analysed afresh, shows that verdict and that headroom.

use trainmem::config::{decode_query, encode_query, Config, Finetune};
use trainmem::estimator::cost::Assumptions;
use trainmem::estimator::plan::{self, cheapest_fixes, GlobalBatch, PlanRequest};
use trainmem::estimator::{analyse, presets, sweep, Analysis};

/// Six cards from 24 GB to 141 GB.
const GPUS: [&str; 6] = ["rtx-4090", "a100-40gb", "l40s", "a100-80gb", "h100-80gb", "h200"];

/// The analysis a link shows: decoded without complaint, then analysed.
fn through_its_link(cfg: &Config) -> Analysis {
    let d = decode_query(&encode_query(cfg));
    assert!(d.errors.is_empty(), "{:?}", d.errors);
    assert_eq!(&d.config, cfg, "the link reproduces the configuration");
    analyse(&d.config).expect("a configuration the page offers can be analysed")
}

/// Whether two headrooms agree within 1 % of the capacity (they should be equal).
fn same_headroom(claimed: i128, shown: i128, capacity: u128) -> bool {
    (claimed - shown).unsigned_abs() * 100 <= capacity
}

#[test]
fn every_fix_offered_for_every_preset_fine_tuning_and_card_fits_by_its_own_link_with_the_headroom_it_claims() {
    let (mut configs, mut fixes_checked) = (0, 0);
    for p in presets::presets() {
        for finetune in [Finetune::Full, Finetune::Lora, Finetune::Qlora] {
            for gpu in GPUS {
                let cfg = Config { model: p.id.to_string(), arch: p.spec.clone(), finetune, gpu: gpu.to_string(), ..Config::default() };
                configs += 1;
                let Ok(fixes) = cheapest_fixes(&cfg, &Assumptions::default(), plan::DEFAULT_FIXES) else { continue };
                for f in fixes {
                    let shown = through_its_link(&f.config);
                    assert!(shown.verdict.fits, "{} {finetune:?} {gpu}: '{}' does not fit by its own link", p.id, f.sentence);
                    assert!(
                        same_headroom(f.headroom, shown.verdict.headroom, shown.verdict.capacity),
                        "{} {finetune:?} {gpu}: '{}' claims {} B, its link shows {} B",
                        p.id,
                        f.sentence,
                        f.headroom,
                        shown.verdict.headroom
                    );
                    fixes_checked += 1;
                }
            }
        }
    }
    assert_eq!(configs, presets::presets().len() * 18);
    assert!(fixes_checked > 100, "{fixes_checked} fixes checked");
}

#[test]
fn the_one_click_answers_fit_by_their_own_links_and_one_more_does_not() {
    for (id, gpu) in [("llama-3.1-8b", "h100-80gb"), ("qwen2.5-7b", "rtx-4090"), ("gpt2-xl", "a100-40gb"), ("mixtral-8x7b-v0.1", "h200")] {
        let p = presets::preset(id).expect("preset");
        let cfg = Config { model: p.id.to_string(), arch: p.spec, gpu: gpu.to_string(), finetune: Finetune::Lora, ..Config::default() };
        let a = sweep::answers(&cfg);
        if let Some(b) = a.max_batch {
            assert!(through_its_link(&Config { batch: b, ..cfg.clone() }).verdict.fits, "{id}: batch {b}");
            assert!(!analyse(&Config { batch: b + 1, ..cfg.clone() }).is_ok_and(|x| x.verdict.fits), "{id}: batch {} fits too", b + 1);
        }
        if let Some(s) = a.max_seq {
            assert!(through_its_link(&Config { seq: s, ..cfg.clone() }).verdict.fits, "{id}: seq {s}");
        }
        if let Some(g) = a.smallest_gpu {
            assert!(through_its_link(&Config { gpu: g.id.to_string(), ..cfg.clone() }).verdict.fits, "{id}: {}", g.id);
        }
    }
}

#[test]
fn every_plan_and_frontier_point_fits_by_its_own_link_with_its_memory_and_headroom() {
    let p = presets::preset("llama-3.1-8b").expect("preset");
    let base = Config { model: p.id.to_string(), arch: p.spec, gpus: 8, seq: 8192, ..Config::default() };
    let r = plan::plan(PlanRequest::new(base, GlobalBatch::Sequences(64))).expect("a plan");
    assert!(!r.plans.is_empty());
    for pl in r.plans.iter().chain(&r.frontier) {
        let shown = through_its_link(&pl.config);
        assert!(shown.verdict.fits, "plan {}", pl.rank);
        assert_eq!((pl.memory, pl.headroom), (shown.verdict.deciding, shown.verdict.headroom), "plan {}", pl.rank);
    }
    assert!(r.plans.windows(2).all(|w| w[0].rank < w[1].rank && w[0].step_s <= w[1].step_s));
}
