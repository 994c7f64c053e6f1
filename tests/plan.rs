//! The planner end to end: `trainmem plan` returns ranked plans that re-estimate as fitting;
//! the search finds exactly what brute force finds (so every configuration it pruned is proven
//! not to fit); and the monotonicity properties its pruning rests on hold.

use proptest::prelude::*;
use std::collections::HashSet;
use std::process::Command;
use trainmem::config::{
    decode_query, encode_query, ActOffload, Attention, Config, Finetune, Offload, OptimImpl, Optimizer, Precision, Recompute, Zero,
};
use trainmem::estimator::cost::step_cost;
use trainmem::estimator::plan::{self, memory_chain_below, peak_fits, ChainKnob, GlobalBatch, Knobs, PlanRequest, Search, Space};
use trainmem::estimator::presets::presets;
use trainmem::estimator::{analyse, estimate, Estimate};

fn trainmem(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_trainmem")).args(args).output().expect("the binary runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn planning_llama_3_1_70b_on_64_h100s_returns_ranked_plans_that_all_fit() {
    let (code, out, err) = trainmem(&[
        "plan",
        "--model",
        "llama-3.1-70b",
        "--gpu",
        "h100-80gb",
        "--gpus",
        "64",
        "--seq",
        "8192",
        "--global-batch-tokens",
        "4m",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["global_tokens"], 4u64 << 20);
    assert_eq!(v["global_sequences"], 512);
    assert!(v["label"].as_str().is_some_and(|l| l.contains("estimate")));
    let plans = v["plans"].as_array().expect("plans");
    assert!(!plans.is_empty());
    let mut last = 0.0;
    for (i, p) in plans.iter().enumerate() {
        assert_eq!(p["rank"], i as u64 + 1);
        let step = p["step_s_estimate"].as_f64().expect("step time");
        assert!(step >= last, "ranked by estimated step time");
        last = step;
        // The share link reproduces the plan, and the plan re-estimates as fitting.
        let d = decode_query(p["query"].as_str().expect("query"));
        assert!(d.errors.is_empty(), "{:?}", d.errors);
        // By the verdict's own figure: what nvidia-smi will show, the caching allocator
        // replayed, is on the card, and it is the plan's memory.
        let a = analyse(&d.config).expect("valid");
        assert!(a.verdict.fits, "{}", p["query"]);
        assert_eq!(a.verdict.deciding as u64, p["memory"].as_u64().expect("memory"));
        let smi = p["nvidia_smi"].as_u64().expect("simulated");
        assert_eq!(Some(u128::from(smi)), a.estimate.memory.nvidia_smi);
        assert_eq!(d.config.batch * d.config.accum * d.config.dp() * d.config.seq, 4 << 20);
        assert!(p["cost"]["comm"].is_array() && p["mfu_estimate"].as_f64().is_some_and(|m| m > 0.0 && m < 1.0));
    }
    // The frontier: no plan beats a frontier plan on both step time and headroom.
    let frontier = v["frontier"].as_array().expect("frontier");
    assert!(!frontier.is_empty());
    for f in frontier {
        let (fs, fh) = (f["step_s_estimate"].as_f64().expect("s"), f["headroom"].as_i64().expect("h"));
        for p in plans {
            let (ps, ph) = (p["step_s_estimate"].as_f64().expect("s"), p["headroom"].as_i64().expect("h"));
            assert!(!(ps <= fs && ph >= fh && (ps < fs || ph > fh)), "{} dominates {}", p["query"], f["query"]);
        }
    }
    let progress = &v["progress"];
    assert_eq!(
        progress["fitting"].as_u64().unwrap_or(0)
            + progress["not_fitting"].as_u64().unwrap_or(0)
            + progress["pruned"].as_u64().unwrap_or(0)
            + progress["invalid"].as_u64().unwrap_or(0)
            + progress["dominated"].as_u64().unwrap_or(0),
        progress["configurations"].as_u64().unwrap_or(u64::MAX)
    );
    assert!(!v["explanation"].as_array().expect("explanation").is_empty());
    assert!(v["assumptions"].as_array().is_some_and(|a| a.len() >= 4));
}

#[test]
fn plan_exports_csv_with_a_share_query_per_row() {
    let (code, out, err) = trainmem(&["plan", "--model", "qwen2.5-0.5b", "--gpus", "8", "--seq", "1024", "--global-batch", "64", "--csv"]);
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some(plan::csv_header().as_str()));
    let rows: Vec<&str> = lines.collect();
    assert!(!rows.is_empty());
    for r in rows {
        let query = r.rsplit(',').next().expect("query");
        assert!(analyse(&decode_query(query).config).expect("valid").verdict.fits, "{r}");
    }
}

#[test]
fn plan_fix_lists_the_cheapest_changes_that_make_it_fit() {
    // Llama-3.1-8B at 16k tokens with ZeRO-3 on 8 H100s does not fit (the 8k example sits
    // within a few GB of the line, which moves with the overhead model).
    let (code, out, err) =
        trainmem(&["plan", "--fix", "--model", "llama-3.1-8b", "--seq", "16384", "--zero", "3", "--gpus", "8", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let fixes = v.as_array().expect("fixes");
    assert!(!fixes.is_empty() && fixes.len() <= 3);
    for f in fixes {
        let v = analyse(&decode_query(f["query"].as_str().expect("query")).config).expect("valid").verdict;
        assert!(v.fits);
        assert_eq!(v.headroom as i64, f["headroom"].as_i64().expect("headroom"));
        assert!(f["sentence"].as_str().is_some_and(|s| s.contains("fits") && s.contains("headroom")));
    }
}

#[test]
fn plan_fix_says_when_no_single_change_fits_and_where_combinations_are_searched() {
    // Llama 3.1 70B in full on 8 H100s with FSDP at 8K: 141 GB of sharded states a GPU, and
    // activations more GPUs do not shrink — no single change of the list fits.
    let (code, out, err) = trainmem(&["plan", "--fix", "--model", "llama-3.1-70b", "--seq", "8192", "--zero", "full_shard", "--gpus", "8"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("no single change makes it fit: `trainmem plan` without --fix searches combinations"), "{out}");
}

#[test]
fn where_nothing_in_the_space_fits_plan_searches_again_with_the_host_memory_knobs_open_and_says_how() {
    // Llama 3.2 3B in full on one RTX 4090: 51 GB of weights, gradients and AdamW states before
    // any activation. Nothing of the default space fits; offloading the optimizer does.
    let (code, out, err) = trainmem(&[
        "plan",
        "--model",
        "llama-3.2-3b",
        "--gpu",
        "rtx-4090",
        "--gpus",
        "1",
        "--seq",
        "1024",
        "--global-batch",
        "4",
        "--top",
        "2",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("no configuration of the space fits"), "{out}");
    let flags = "--try-offload none,optimizer,optimizer+params --try-act-offload none,torchtune --try-optim adamw,adam8bit --try-optim-impl fused,foreach";
    assert!(out.contains(&format!("opened as well ({flags})")), "{out}");
    let query = out.lines().find_map(|l| l.strip_prefix("plan 1: ?")).expect("the wider search's plan 1");
    let cfg = decode_query(query).config;
    assert!(analyse(&cfg).expect("valid").verdict.fits, "{query}");
    assert_eq!(cfg.finetune, trainmem::estimator::config::Finetune::Full, "what is trained stays as it was");
    // The flags it names are the CLI's own: the same search, asked for, finds the same plan 1.
    let mut args =
        vec!["plan", "--model", "llama-3.2-3b", "--gpu", "rtx-4090", "--gpus", "1", "--seq", "1024", "--global-batch", "4", "--top", "2"];
    args.extend(flags.split(' '));
    let (code, again, err) = trainmem(&args);
    assert_eq!(code, 0, "{err}");
    assert_eq!(again.lines().find_map(|l| l.strip_prefix("plan 1: ?")), Some(query), "{again}");
}

#[test]
fn plan_json_carries_the_widened_search_where_nothing_fits_and_its_opened_values_reproduce_it() {
    // The same 3B-on-a-4090 case: `--json` holds no plan of its own, and the widened search,
    // the keys it opened, and plan 1 — the text output's plan 1.
    let base =
        ["plan", "--model", "llama-3.2-3b", "--gpu", "rtx-4090", "--gpus", "1", "--seq", "1024", "--global-batch", "4", "--top", "2"];
    let (code, out, err) = trainmem(&[&base[..], &["--json"]].concat());
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(doc["plans"].as_array().map(Vec::len), Some(0), "{out}");
    let w = &doc["widened"];
    assert_eq!(w["knobs"], serde_json::json!(["offload", "act_offload", "optim"]));
    let query = w["plans"][0]["query"].as_str().expect("the widened plan 1");
    assert!(w["plans"][0]["fits"].as_bool().expect("fits"));
    let (_, text, _) = trainmem(&base);
    assert_eq!(text.lines().find_map(|l| l.strip_prefix("plan 1: ?")), Some(query), "{text}");
    // Each opened key and its values, asked for with --try-KEY, is that same search.
    let mut args: Vec<String> = base.iter().map(|s| s.to_string()).collect();
    for o in w["opened"].as_array().expect("opened") {
        let key = o["key"].as_str().expect("key");
        let values: Vec<&str> = o["values"].as_array().expect("values").iter().filter_map(|v| v.as_str()).collect();
        args.push(format!("--try-{}", key.replace('_', "-")));
        args.push(values.join(","));
    }
    args.push("--json".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, again, err) = trainmem(&args);
    assert_eq!(code, 0, "{err}");
    let again: serde_json::Value = serde_json::from_str(&again).expect("json");
    assert_eq!(again["plans"][0]["query"].as_str(), Some(query));
    assert!(again["widened"].is_null(), "a search that found plans widens nothing");
    // The CSV stays the asked search's rows: the header alone here.
    let (code, csv, err) = trainmem(&[&base[..], &["--csv"]].concat());
    assert_eq!(code, 0, "{err}");
    assert_eq!(csv.lines().count(), 1, "{csv}");
}

#[test]
fn a_global_batch_that_is_not_whole_sequences_names_the_key() {
    let (code, _, err) = trainmem(&["plan", "--gpus", "8", "--seq", "3000", "--global-batch-tokens", "1m"]);
    assert_eq!(code, 1);
    assert!(err.contains("`global_batch_tokens`"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// The search against brute force
// ---------------------------------------------------------------------------------------------

/// A small model on a custom GPU whose capacity puts the fit boundary inside the space.
fn small_base(gib: f64) -> Config {
    let mut c = decode_query("model=qwen2.5-0.5b&gpus=8&seq=2048&gpu=custom&gpu_tflops=400&gpu_hbm_gbs=2000&gpu_link_gbs=600").config;
    c.gpu_gib = gib;
    c
}

fn small_space() -> Space {
    Space {
        batch: Vec::new(),
        zero: vec![Zero::Ddp, Zero::Z1, Zero::Z2, Zero::Z3, Zero::ShardGradOp],
        recompute: vec![Recompute::None, Recompute::Selective, Recompute::Full],
        attn: vec![Attention::Eager, Attention::Sdpa],
        optim: vec![Optimizer::Adamw],
        optim_impl: vec![OptimImpl::Fused],
        offload: vec![Offload::None, Offload::Optimizer],
        tp: vec![1, 2],
        pp: vec![1, 2],
        vpp: vec![1],
        cp: vec![1],
        ep: vec![1],
        sp: vec![false, true],
        finetune: vec![Finetune::Full],
        compile: vec![false, true],
        recompute_every: vec![0, 2],
        recompute_layers: vec![0],
        act_offload: vec![ActOffload::None],
        act_offload_layers: vec![0],
    }
}

/// Every configuration of the space, estimated one by one: `(knobs, fits)`.
fn brute_force(req: &PlanRequest, global_seqs: u64) -> Vec<(Knobs, bool)> {
    let s = &req.space;
    let mut out = Vec::new();
    for &tp in &s.tp {
        for &pp in &s.pp {
            for &sp in &s.sp {
                for &z in &s.zero {
                    for &r in &s.recompute {
                        for &a in &s.attn {
                            for &o in &s.offload {
                                for (&compile, &every) in s.compile.iter().flat_map(|c| s.recompute_every.iter().map(move |e| (c, e))) {
                                    let k0 = Knobs {
                                        tp,
                                        pp,
                                        sp,
                                        zero: z,
                                        recompute: r,
                                        attn: a,
                                        offload: o,
                                        compile,
                                        recompute_every: every,
                                        ..Knobs::of(&req.base)
                                    };
                                    for (b, accum) in plan::micro_batches(&s.batch, global_seqs, k0.dp(req.base.gpus)) {
                                        let k = Knobs { batch: b, accum, ..k0 };
                                        if let Ok(e) = estimate(&k.apply(&req.base)) {
                                            out.push((k, peak_fits(&e)));
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// `space` around `base` for `seqs` sequences a step, searched to its end with every point kept
/// (none skipped as dominated).
fn search_everything(base: &Config, space: Space, seqs: u64) -> (PlanRequest, Search) {
    let req = PlanRequest {
        base: base.clone(),
        global_batch: GlobalBatch::Sequences(seqs),
        space,
        assumptions: Default::default(),
        keep: 0,
        skip_dominated: false,
    };
    let mut search = Search::new(req.clone()).expect("search");
    while !search.step(50).done {}
    (req, search)
}

/// Two configurations are the same plan when they differ only in the ZeRO stage with one
/// data-parallel rank, in sequence parallelism without tensor parallelism, or in every-Nth-layer
/// checkpointing under full recomputation.
fn canonical(k: Knobs, gpus: u64) -> Knobs {
    let zero = if k.dp(gpus) == 1 { Zero::Ddp } else { k.zero };
    let sp = k.sp && k.tp > 1;
    let recompute_every = if k.recompute == Recompute::Full { 0 } else { k.recompute_every };
    Knobs { zero, sp, recompute_every, ..k }
}

#[test]
fn the_search_finds_exactly_the_configurations_brute_force_finds_to_fit() {
    // Capacities from "almost nothing fits" to "almost everything does".
    let (mut pruned_somewhere, mut pruned_by_chain) = (0, 0);
    let (mut compiled, mut every_2nd) = (0, 0);
    for gib in [3.0, 5.0, 7.0, 10.0, 16.0] {
        let base = small_base(gib);
        let (req, search) = search_everything(&base, small_space(), 32);
        let found: HashSet<String> = search.points().iter().map(|p| format!("{:?}", canonical(p.knobs, base.gpus))).collect();
        for p in search.points() {
            assert!(peak_fits(&estimate(&p.knobs.apply(&base)).expect("valid")));
        }
        let brute = brute_force(&req, 32);
        let truth: HashSet<String> = brute.iter().filter(|(_, f)| *f).map(|(k, _)| format!("{:?}", canonical(*k, base.gpus))).collect();
        // Nothing that fits was pruned, and nothing that does not fit was returned.
        let missed: Vec<&String> = truth.difference(&found).collect();
        assert!(missed.is_empty(), "{gib} GiB: the search missed {} fitting configurations, e.g. {:?}", missed.len(), missed.first());
        assert_eq!(found, truth, "{gib} GiB");
        let p = search.progress();
        assert_eq!(p.fitting as usize, search.points().len());
        assert!(p.estimate_calls as usize <= brute.len() * 2);
        pruned_somewhere += p.pruned;
        pruned_by_chain += p.pruned_by_chain;
        compiled += search.points().iter().filter(|p| p.knobs.compile).count();
        every_2nd += search.points().iter().filter(|p| p.knobs.recompute_every == 2).count();
    }
    assert!(pruned_somewhere > 0 && pruned_by_chain > 0, "the test must exercise both pruning rules");
    assert!(compiled > 0 && every_2nd > 0, "the space's compiled and every-2nd-layer configurations must be searched too");
}

#[test]
fn every_configuration_skipped_as_dominated_is_dominated_by_a_listed_plan() {
    for gib in [5.0, 10.0, 16.0] {
        let base = small_base(gib);
        let req = PlanRequest {
            base: base.clone(),
            global_batch: GlobalBatch::Sequences(32),
            space: small_space(),
            assumptions: Default::default(),
            keep: 0,
            skip_dominated: true,
        };
        let mut s = Search::new(req.clone()).expect("search");
        while !s.step(50).done {}
        assert!(s.progress().dominated > 0, "{gib} GiB: the test must exercise rule D");
        let listed: Vec<(f64, i128, String)> =
            s.points().iter().map(|p| (p.step_s, p.headroom, format!("{:?}", canonical(p.knobs, base.gpus)))).collect();
        for (k, fit) in brute_force(&req, 32) {
            if !fit {
                continue;
            }
            let c = k.apply(&base);
            let e = estimate(&c).expect("valid");
            let h = e.capacity as i128 - e.memory.peak as i128;
            let t = step_cost(&c, &req.assumptions).expect("cost").step_s;
            let key = format!("{:?}", canonical(k, base.gpus));
            assert!(
                listed.iter().any(|(lt, lh, lk)| *lk == key || (*lt <= t && *lh >= h)),
                "{gib} GiB: {} fits and is neither listed nor dominated by a listed plan",
                encode_query(&c)
            );
        }
    }
}

#[test]
fn chain_pruning_skips_estimates_brute_force_would_make() {
    // At 5 GiB most of the space does not fit: the search must make far fewer estimate() calls
    // than there are configurations.
    let base = small_base(5.0);
    let req = PlanRequest {
        base,
        global_batch: GlobalBatch::Sequences(32),
        space: small_space(),
        assumptions: Default::default(),
        keep: 0,
        skip_dominated: true,
    };
    let mut s = Search::new(req).expect("search");
    while !s.step(1000).done {}
    let p = s.progress();
    assert!(p.pruned > 0 && p.estimate_calls < p.configurations, "{p:?}");
}

// ---------------------------------------------------------------------------------------------
// The monotonicity the pruning relies on (module docs of estimator::plan)
// ---------------------------------------------------------------------------------------------

fn preset_ids() -> Vec<&'static str> {
    presets().iter().map(|p| p.id).collect()
}

prop_compose! {
    /// A random configuration of any preset with random parallelism and savings; may be invalid.
    fn any_knobs()(
        model in prop::sample::select(preset_ids()),
        dp in prop::sample::select(vec![1u64, 2, 4, 8]),
        tp in prop::sample::select(vec![1u64, 2, 4]),
        pp in prop::sample::select(vec![1u64, 2, 4]),
        cp in prop::sample::select(vec![1u64, 1, 2]),
        vpp in prop::sample::select(vec![1u64, 1, 2]),
        ep in prop::sample::select(vec![1u64, 1, 2, 4]),
        sp in any::<bool>(),
        batch in 1u64..6,
        accum in prop::sample::select(vec![1u64, 2, 3, 4, 8]),
        seq in prop::sample::select(vec![128u64, 512, 1024, 2048, 4096]),
        zero in prop::sample::select(vec![Zero::Ddp, Zero::Z1, Zero::Z2, Zero::Z3, Zero::FullShard, Zero::ShardGradOp, Zero::HybridShard]),
        recompute in prop::sample::select(vec![Recompute::None, Recompute::Selective, Recompute::Op, Recompute::Full]),
        attn in prop::sample::select(vec![Attention::Eager, Attention::Sdpa, Attention::Flash]),
        // The planner's recipe knobs, half the time off: compile, every 2nd / 3rd layer, offloading.
        recipe in 0usize..8,
        optim in prop::sample::select(vec![Optimizer::Adamw, Optimizer::Adam8bit, Optimizer::Sgd, Optimizer::Muon, Optimizer::Adafactor, Optimizer::Lion]),
        optim_impl in prop::sample::select(vec![OptimImpl::Fused, OptimImpl::Foreach, OptimImpl::Forloop]),
        offload in prop::sample::select(vec![Offload::None, Offload::Optimizer, Offload::OptimizerParams]),
        finetune in prop::sample::select(vec![Finetune::Full, Finetune::Lora, Finetune::Qlora]),
        precision in prop::sample::select(vec![Precision::MixedBf16, Precision::Bf16, Precision::MixedBf16Fp32grad, Precision::AmpBf16, Precision::MixedFp8, Precision::Fp32]),
        shard_group in prop::sample::select(vec![2u64, 4, 8]),
    ) -> Config {
        let mut c = decode_query(&format!("model={model}")).config;
        c.gpus = tp * pp * cp * dp; c.tp = tp; c.pp = pp; c.cp = cp; c.vpp = vpp; c.ep = ep; c.sp = sp;
        c.batch = batch; c.accum = accum; c.seq = seq; c.zero = zero; c.recompute = recompute;
        c.attn = attn; c.optim = optim; c.optim_impl = optim_impl; c.offload = offload;
        c.finetune = finetune; c.precision = precision; c.shard_group = shard_group;
        match recipe {
            4 => c.compile = true,
            5 => c.recompute_every = 2,
            6 => c.recompute_every = 3,
            7 => c.act_offload = ActOffload::Torchtune,
            _ => {}
        }
        // Steer away from what validation rejects, so most cases test something.
        if c.arch.experts == 0 || !c.arch.experts.is_multiple_of(c.ep) { c.ep = 1; }
        if !c.arch.heads.is_multiple_of(c.tp) { c.tp = 1; }
        if c.vpp > 1 && (c.pp == 1 || !c.arch.layers.is_multiple_of(c.pp * c.vpp)) { c.vpp = 1; }
        if c.offload == Offload::OptimizerParams && c.zero.stage() < 3 { c.offload = Offload::Optimizer; }
        c.gpus = c.tp * c.pp * c.cp * dp * c.ep;
        c
    }
}

fn memory(c: &Config) -> Option<u128> {
    estimate(c).ok().map(|e: Estimate| e.memory.peak)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// M1.
    #[test]
    fn memory_never_decreases_as_the_micro_batch_grows(c in any_knobs(), more in 1u64..4) {
        if let (Some(m0), Some(m1)) = (memory(&c), memory(&Config { batch: c.batch + more, ..c.clone() })) {
            prop_assert!(m1 >= m0, "{}: {} < {}", encode_query(&c), m1, m0);
        }
    }

    /// M2.
    #[test]
    fn memory_never_decreases_as_accumulation_grows(c in any_knobs(), more in 1u64..8) {
        if let (Some(m0), Some(m1)) = (memory(&c), memory(&Config { accum: c.accum + more, ..c.clone() })) {
            prop_assert!(m1 >= m0, "{}: {} < {}", encode_query(&c), m1, m0);
        }
    }

    /// Memory is also monotone in the sequence (the sweep helpers' boundary search relies on it).
    #[test]
    fn memory_never_decreases_as_the_sequence_grows(c in any_knobs(), more in 1u64..4096) {
        if let (Some(m0), Some(m1)) = (memory(&c), memory(&Config { seq: c.seq + more, ..c.clone() })) {
            prop_assert!(m1 >= m0, "{}: {} < {}", encode_query(&c), m1, m0);
        }
    }
}

proptest! {
    // Some chain violations are rare (selective → full recomputation breaks on about 1.5 % of
    // random configurations): many cases, so a wrong chain is caught.
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// C: one step down every chain never needs more memory.
    #[test]
    fn memory_never_increases_down_the_chains(c in any_knobs()) {
        let Some(m0) = memory(&c) else { return Ok(()) };
        let k = Knobs::of(&c);
        for knob in [ChainKnob::Zero, ChainKnob::Offload, ChainKnob::Recompute, ChainKnob::Attn, ChainKnob::Sp] {
            for below in memory_chain_below(knob, &k, c.seq) {
                let mut d = c.clone();
                // apply() sets HYBRID_SHARD's group to a node; keep the sampled one.
                let shard_group = d.shard_group;
                d = below.apply(&d);
                d.shard_group = shard_group;
                if let Some(m1) = memory(&d) {
                    prop_assert!(m1 <= m0, "{:?} from {}: {} > {}", knob, encode_query(&c), m1, m0);
                }
            }
        }
    }
}

/// What the pruning deliberately does not assume: the estimator breaks it, and rightly (see the
/// module docs of estimator::plan). Counterexamples found by sampling.
#[test]
fn zero_2_zero_3_and_full_recompute_are_no_chain_steps_because_they_can_cost_memory() {
    // ZeRO-3 gathers whole layers (and prefetches more): on Mixtral with tp = 8 and ep = 2 that
    // exceeds what it shards beyond ZeRO-2.
    let c = decode_query("model=mixtral-8x7b-v0.1&batch=2&seq=1024&accum=4&precision=amp-bf16&optim=adafactor&optim_impl=forloop&attn=eager&gpus=32&shard_group=4&tp=8&pp=2&ep=2&offload=optimizer").config;
    let z2 = memory(&Config { zero: Zero::Z2, ..c.clone() }).expect("valid");
    let z3 = memory(&Config { zero: Zero::Z3, ..c.clone() }).expect("valid");
    assert!(z3 > z2, "z2 {z2}, z3 {z3}");
    // ZeRO-2 keeps its gradient shard through the whole step; ZeRO-1's full gradients build up
    // during backward only, and GPT-2's step peaks early (at the LM head's backward).
    let c = decode_query("model=gpt2&seq=128&precision=amp-bf16&attn=eager&gpus=2&zero=1").config;
    let z1 = memory(&c).expect("valid");
    let z2 = memory(&Config { zero: Zero::Z2, ..c.clone() }).expect("valid");
    assert!(z2 > z1, "z1 {z1}, z2 {z2}");
    // Selective recomputation re-materializes the attention core in backward.
    let c = decode_query("model=mixtral-8x7b-v0.1&seq=2048&attn=eager&gpus=2&shard_group=2&cp=2").config;
    let none = memory(&c).expect("valid");
    let sel = memory(&Config { recompute: Recompute::Selective, ..c.clone() }).expect("valid");
    assert!(sel > none, "none {none}, selective {sel}");
    // Sequence parallelism all-gathers the sequence before the LM head.
    let c = decode_query("model=qwen3-235b-a22b&seq=128&precision=fp32&attn=eager&recompute=full&gpus=2&shard_group=2&tp=2").config;
    let off = memory(&c).expect("valid");
    let on = memory(&Config { sp: true, ..c.clone() }).expect("valid");
    assert!(on > off, "sp off {off}, on {on}");
    // Full recomputation re-materializes a whole layer in backward; at 128 tokens with eager
    // attention that exceeds what selective recomputation keeps. (Not under parameter offload:
    // there each gradient leaves for the host once reduced, validation/FINDINGS.md §13.)
    let c = decode_query(
        "model=qwen2.5-7b&batch=3&seq=128&precision=mixed-fp8&optim=adam8bit&attn=eager&gpus=8&zero=full_shard&tp=4&pp=2&offload=optimizer",
    )
    .config;
    let sel = memory(&Config { recompute: Recompute::Selective, ..c.clone() }).expect("valid");
    let full = memory(&Config { recompute: Recompute::Full, ..c.clone() }).expect("valid");
    assert!(full > sel, "selective {sel}, full {full}");
}

#[test]
fn the_planner_turns_compile_every_nth_checkpointing_and_activation_offloading() {
    // The default space compiles and checkpoints every 2nd layer; activation offloading is
    // opened with --try-act-offload (it takes host memory, as optimizer offload does).
    let (code, out, err) = trainmem(&[
        "plan",
        "--model",
        "llama-3.1-8b",
        "--gpus",
        "8",
        "--seq",
        "8192",
        "--global-batch",
        "64",
        "--try-act-offload",
        "none,torchtune",
        "--try-zero",
        "3",
        "--try-tp",
        "1",
        "--try-pp",
        "1,2",
        "--top",
        "0",
        "--csv",
    ]);
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (compile, every, act) = (col("compile"), col("recompute_every"), col("act_offload"));
    let rows: Vec<Vec<String>> = lines.map(|l| l.split(',').map(str::to_string).collect()).collect();
    let seen = |c: usize, v: &str| rows.iter().any(|r| r[c] == v);
    assert!(seen(compile, "true") && seen(compile, "false"), "compiled and eager plans");
    assert!(seen(every, "2"), "every-2nd-layer checkpointing");
    assert!(seen(act, "torchtune"), "torchtune's activation offloading");
    // Each is what its share link says, and fits by the verdict.
    for r in rows.iter().filter(|r| r[compile] == "true" || r[act] == "torchtune").take(20) {
        let c = decode_query(r.last().expect("query")).config;
        assert_eq!(c.compile, r[compile] == "true");
        assert_eq!(c.act_offload == ActOffload::Torchtune, r[act] == "torchtune");
        assert!(analyse(&c).expect("valid").verdict.fits);
    }
}

#[test]
fn a_compiled_plan_is_estimated_faster_by_the_compile_speed_up_alone() {
    let base = decode_query("model=llama-3.1-8b&gpus=8&seq=4096&zero=3").config;
    let compiled = Config { compile: true, ..base.clone() };
    let a = Default::default();
    let (eager, fast) = (step_cost(&base, &a).expect("cost"), step_cost(&compiled, &a).expect("cost"));
    // Same FLOPs, compute divided by 1 + 10 %.
    assert_eq!(eager.flops.executed, fast.flops.executed);
    let ratio = eager.compute_s / fast.compute_s;
    assert!((ratio - (1.0 + trainmem::estimator::cost::DEFAULT_COMPILE_SPEEDUP)).abs() < 1e-9, "{ratio}");
    assert!(fast.assumptions.iter().any(|x| x.id == "compile"));
    assert!(!eager.assumptions.iter().any(|x| x.id == "compile"));
}

/// Megatron's block method in the search: with full recomputation the planner tries the first N
/// layers of each pipeline stage for each N of the space that is fewer than a stage's layers (N
/// at or above them is full recomputation itself), and finds exactly the configurations brute
/// force finds to fit.
#[test]
fn on_megatron_the_search_tries_the_block_method_and_finds_what_brute_force_finds() {
    let mut found_block = 0;
    // b1 on one stage peaks at 15.3 GiB under full recomputation, 17.8 and 19.1 with the first 12
    // and 6 layers, 20.4 without: capacities around and between them.
    for gib in [14.0, 16.0, 18.5, 20.0, 24.0] {
        let mut base = decode_query(
            "model=qwen2.5-0.5b&framework=megatron&attn=flash&gpus=4&seq=4096&gpu=custom&gpu_tflops=400&gpu_hbm_gbs=2000&gpu_link_gbs=600",
        )
        .config;
        base.gpu_gib = gib;
        // Qwen2.5 0.5B's 24 layers: every layer, the first 12 or the first 6 of each stage.
        let tries = plan::block_method_tries(&base);
        assert_eq!(tries, [0, 12, 6]);
        let space = Space {
            recompute: vec![Recompute::None, Recompute::Full],
            recompute_layers: tries.clone(),
            pp: vec![1, 2],
            ..Space::fixed(&base)
        };
        let (_, search) = search_everything(&base, Space { batch: Vec::new(), ..space }, 16);
        let found: HashSet<String> = search.points().iter().map(|p| format!("{:?}", p.knobs)).collect();
        let mut truth = HashSet::new();
        for pp in [1u64, 2] {
            let stage = 24 / pp;
            for r in [Recompute::None, Recompute::Full] {
                for &n in &tries {
                    if n > 0 && (r != Recompute::Full || n >= stage) {
                        continue;
                    }
                    let k0 = Knobs { pp, recompute: r, recompute_layers: n, ..Knobs::of(&base) };
                    for (b, accum) in plan::micro_batches(&[], 16, k0.dp(base.gpus)) {
                        let k = Knobs { batch: b, accum, ..k0 };
                        if estimate(&k.apply(&base)).is_ok_and(|e| peak_fits(&e)) {
                            truth.insert(format!("{k:?}"));
                        }
                    }
                }
            }
        }
        assert_eq!(found, truth, "{gib} GiB");
        for p in search.points().iter().filter(|p| p.knobs.recompute_layers > 0) {
            assert_eq!(p.knobs.apply(&base).recompute_layers, p.knobs.recompute_layers, "the plan's configuration carries its block");
            found_block += 1;
        }
    }
    assert!(found_block > 0, "some block-method plans must fit in the capacities tried");
}

#[test]
fn a_megatron_plan_that_recomputes_every_layer_says_why_not_only_the_first_ones() {
    // Llama 3.1 8B at 16K tokens on 8 H100s without model parallelism: only full recomputation
    // of every layer fits (the first 16 or 8 of 32 keep 43 GB too much).
    let base = decode_query("model=llama-3.1-8b&framework=megatron&attn=flash&gpus=8&seq=16384&gpu=h100-80gb").config;
    let req = PlanRequest {
        base: base.clone(),
        global_batch: GlobalBatch::Sequences(64),
        space: Space {
            recompute: vec![Recompute::None, Recompute::Full],
            batch: vec![1],
            tp: vec![1],
            pp: vec![1],
            cp: vec![1],
            ..Space::default_for(&base)
        },
        assumptions: Default::default(),
        keep: 5,
        skip_dominated: true,
    };
    let result = plan::plan(req.clone()).expect("plans");
    let top = result.plans.first().expect("a plan fits");
    assert_eq!((top.knobs.recompute, top.knobs.recompute_layers), (Recompute::Full, 0));
    let why = plan::explain_choice(&req, 64, &top.knobs);
    let block = why.iter().find(|r| r.key == "recompute_layers").expect("the block method is explained");
    assert!(
        block.sentence.starts_with("full recomputation of every layer instead of full recomputation of the first")
            && block.sentence.contains("does not fit"),
        "{}",
        block.sentence
    );
}
