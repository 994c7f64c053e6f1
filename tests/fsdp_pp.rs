//! torchtitan's FSDP2 under pipeline parallelism against what PyTorch did on four CPU ranks
//! (`tests/fixtures/pytorch/fsdp/pp.json`, `validation/measure_fsdp_pp.py`): torchtitan 0.2.2's
//! own Llama 3 (dim 64, 4 layers, vocabulary 4096) split into two stages as torchtitan splits
//! it, each wrapped by torchtitan's `apply_fsdp(pp_enabled=True)` over two ranks and driven by
//! torch's `PipelineStage` and `Schedule1F1B`, 2 and 4 micro-batches of 2 × 64 tokens; the
//! second step profiled on the first rank of each stage.
//!
//! What the estimator takes from them: each stage keeps all its parameters gathered in bf16
//! through the step (row `gathered_stage`), its gradients accumulate unsharded in fp32 until the
//! last micro-batch (the `gradients` row), each later micro-batch's gradient is cast to fp32 as
//! it is added, the last stage's logits live to the end of its backward, and a receiving stage
//! keeps every micro-batch's input to the step's end (`pipeline_inputs`).
//!
//! Under `CI=1` a missing fixture fails instead of skipping.

mod common;

use serde_json::Value;
use trainmem::config::decode_query;
use trainmem::estimator::ledger::RowId;
use trainmem::estimator::params::Stage;
use trainmem::estimator::{allocated_peaks_by_stage, estimate};

/// The configuration each record measured, as a share link without its `accum`: torchtitan's
/// Llama 3 code, FSDP2 over 2 ranks in each of 2 pipeline stages, mixed bf16, AdamW foreach, on
/// the CPU (no caching allocator, no CUDA context or NCCL buffers).
const QUERY: &str = "model=custom&family=llama&vocab=4096&hidden=64&layers=4&heads=4&kv_heads=2&head_dim=16&ffn=256\
                     &tied=false&max_pos=128&framework=torchtitan&zero=full_shard&gpus=4&pp=2&batch=2&seq=64\
                     &precision=mixed-bf16&optim=adamw&optim_impl=foreach&kernels=cpu&cuda_ctx_mib=0&nccl_mib=0";

/// How far an estimated stage peak may be from the measured one: the harness's 0.5 %.
const TOLERANCE: f64 = 0.005;

fn records() -> Vec<Value> {
    common::fixture_records("fsdp/pp.json")
}

fn u(r: &Value, key: &str) -> u64 {
    r[key].as_u64().unwrap_or_else(|| panic!("{}: no {key}", r["id"]))
}

fn config(micro_batches: u64) -> trainmem::config::Config {
    let d = decode_query(&format!("{QUERY}&accum={micro_batches}"));
    assert_eq!(d.errors, vec![]);
    d.config
}

#[test]
fn each_stages_allocated_peak_is_the_measured_one_within_half_a_percent() {
    let records = records();
    if records.is_empty() {
        return;
    }
    assert_eq!(records.len(), 4, "2 and 4 micro-batches, two stages each");
    let failures = stages_against_measured(&records, config, "stage", -TOLERANCE..=TOLERANCE);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Each record's estimated stage peak (`first_key` 0: the first stage, else the last) against
/// its measured peak, a line per record printed; the records outside `within` (relative).
fn stages_against_measured(
    records: &[Value],
    config_of: fn(u64) -> trainmem::config::Config,
    first_key: &str,
    within: std::ops::RangeInclusive<f64>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for r in records {
        let peaks = allocated_peaks_by_stage(&config_of(u(r, "micro_batches"))).expect("torchtitan's FSDP2 under PP estimates");
        let stage = if u(r, first_key) == 0 { Stage::First } else { Stage::Last };
        let est = peaks.iter().find(|(s, _)| *s == stage).map(|&(_, b)| b as f64).expect("the stage");
        let measured = u(r, "measured_peak_bytes") as f64;
        let rel = (est - measured) / measured;
        println!("{}: estimated {est} vs measured {measured} ({:+.3} %)", r["id"], rel * 100.0);
        if !within.contains(&rel) {
            failures.push(format!("{}: {est} vs {measured} ({:+.3} %)", r["id"], rel * 100.0));
        }
    }
    failures
}

/// Bytes alive at a record's peak that FSDP's all-gather copied out (the gathered parameters).
fn gathered_at_peak(r: &Value) -> u64 {
    let alive = r["peak_at"]["alive"].as_object().expect("alive");
    alive.iter().filter(|(k, _)| k.contains("FSDP::all_gather_copy_out")).filter_map(|(_, v)| v.as_u64()).sum()
}

#[test]
fn the_stage_is_gathered_whole_at_the_peak_and_its_gradients_accumulate_in_fp32() {
    let records = records();
    if records.is_empty() {
        return;
    }
    for r in &records {
        // Every parameter of the stage, in bf16, alive at the peak: 385,280 elements on stage 0
        // (the 4096 × 64 embedding and two layers of 61,568), 385,344 on stage 1.
        let numel = u(r, "stage_numel");
        assert_eq!(gathered_at_peak(r), 2 * numel, "{}", r["id"]);
    }
    // The estimate's rows are those bytes: the last stage is the most loaded here.
    let last = records.iter().find(|r| r["stage"] == 1).expect("stage 1");
    let e = estimate(&config(4)).expect("estimates");
    assert_eq!(e.layout.stage, Stage::Last);
    let row = |id: RowId| e.components.iter().find(|c| c.id == id).map(|c| c.bytes).unwrap_or_else(|| panic!("no {id:?} row"));
    let numel = u(last, "stage_numel") as u128;
    assert_eq!(row(RowId::GatheredStage), 2 * numel);
    // The fp32 accumulators: 4 B an element, the fp32 head gradient 1,048,576 B of them.
    assert_eq!(row(RowId::Gradients), 4 * numel);
    // The sharded fp32 parameters are the master-weights row; there is no 16-bit shard.
    assert!(e.components.iter().all(|c| c.id != RowId::Weights));
    assert_eq!(row(RowId::MasterWeights), u(last, "params_bytes") as u128);
    // Four micro-batches on the last of two stages: three finished inputs kept, 2 × 64 × 64 bf16.
    assert_eq!(row(RowId::PipelineInputs), 3 * 2 * 64 * 64 * 2);
}

#[test]
fn one_micro_batch_more_in_flight_on_the_first_stage_is_its_checkpoints_more() {
    let records = records();
    if records.is_empty() {
        return;
    }
    let peak = |m: u64| {
        let r = records.iter().find(|r| r["stage"] == 0 && u(r, "micro_batches") == m).expect("stage 0");
        u(r, "measured_peak_bytes") as i128
    };
    let est = |m: u64| {
        allocated_peaks_by_stage(&config(m))
            .expect("estimates")
            .iter()
            .find(|(s, _)| *s == Stage::First)
            .map(|&(_, b)| b as i128)
            .expect("first")
    };
    // Two micro-batches: the second backward (the peak, the accumulators full) has none other in
    // flight; four: one. Measured and estimated rise by the same one micro-batch's activations
    // (956,416 B measured; within the 0.5 % of the stage's peak).
    let (measured, estimated) = (peak(4) - peak(2) - 4096, est(4) - est(2));
    assert!(measured > 900_000, "{measured}");
    assert!((measured - estimated).abs() < 7_000, "measured +{measured}, estimated +{estimated}");
}

/// The interleaved records (`fsdp/pp_interleaved.json`, `measure_fsdp_pp.py --interleaved`):
/// torch's `ScheduleInterleaved1F1B` over two pipeline ranks of two stages each, an 8-layer
/// model split by torchtitan's own `generate_llm_fqn_per_model_part(4, 8)` (rank 0: the
/// embedding with layers 0–1 and layers 5–6; rank 1: layers 2–4 and layer 7 with the head).
fn interleaved_config(micro_batches: u64) -> trainmem::config::Config {
    let q = QUERY.replace("layers=4", "layers=8");
    let d = decode_query(&format!("{q}&vpp=2&accum={micro_batches}"));
    assert_eq!(d.errors, vec![]);
    d.config
}

/// How far above the measured peak an interleaved rank's estimate may be: the step simulation
/// runs the rank's chunks as one program and keeps the most other chunks any backward of the
/// step holds through all of its backward ([`trainmem::estimator::activations::chunks_in_flight`]),
/// so it is exact for the heaviest backward's own part and above the truth elsewhere.
const INTERLEAVED_ABOVE: f64 = 0.05;

#[test]
fn under_interleaved_1f1b_each_ranks_estimate_is_at_or_within_five_percent_above_its_measured_peak() {
    let records = common::fixture_records("fsdp/pp_interleaved.json");
    if records.is_empty() {
        return;
    }
    assert_eq!(records.len(), 6, "2, 4 and 8 micro-batches, two ranks each");
    let failures = stages_against_measured(&records, interleaved_config, "pp_rank", -TOLERANCE..=INTERLEAVED_ABOVE);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
