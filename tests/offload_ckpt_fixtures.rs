//! Activation offloading under full checkpointing against what PyTorch measured on the CPU:
//! every record of `tests/fixtures/pytorch/offload_ckpt/*.json` (validation/measure_recipes.py
//! `measure_offload` with `act_offload=torchtune|save_on_cpu+recompute=full` on transformers'
//! code; validation/measure_tune_offload.py on torchtune 0.6.1's Llama 3 with its chunked loss;
//! rules in validation/FINDINGS.md §15.5) is rebuilt from its own config.json and compared to
//! the byte: the host bytes the forward pass copies (`offloaded_bytes`, the host row
//! `offloaded_activations`) and the step's peak (`step.measured_peak_bytes`, the dispatch
//! tracker's convention; the compiled records' `tensors_measured_peak_bytes`, torch.profiler's
//! without kernel workspaces, within [`PROFILED_SLACK`]). Under `CI=1` a missing fixture
//! directory fails.

use serde_json::Value;
use std::path::PathBuf;
use trainmem::config::{Attention, Config, Framework, Kernels, Loss, OptimImpl, Optimizer, Precision, Recompute};
use trainmem::estimator::{estimate, hf};

mod common;

fn fixtures() -> PathBuf {
    common::pytorch_fixtures("offload_ckpt")
}

fn shards() -> Vec<Value> {
    common::json_shards(&fixtures()).into_iter().map(|(_, doc)| doc).collect()
}

fn set(c: &mut Config, key: &str, value: &str) {
    trainmem::config::set(c, key, value).unwrap_or_else(|e| panic!("{key}={value}: {e}"));
}

/// A record's configuration: its config.json, the tracker's settings, its recipe as keys.
fn config_of(doc: &Value, r: &Value) -> Config {
    let cfg_json = &doc["configs"][r["config_key"].as_str().expect("config_key")];
    let imported = hf::import_value(cfg_json).expect("its config.json imports");
    let mut c = Config::default();
    trainmem::config::apply_import(&mut c, &imported);
    if r["framework"] == "torchtune" {
        // torchtune's recipe loss is `CEWithChunkedOutputLoss` (`loss = chunked`).
        c.framework = Framework::Torchtune;
        c.loss = Loss::Chunked;
    }
    c.batch = r["batch"].as_u64().expect("batch");
    c.seq = r["seq"].as_u64().expect("seq");
    c.precision = match r["dtype"].as_str() {
        Some("fp32") => Precision::Fp32,
        Some("bf16") => Precision::Bf16,
        other => panic!("dtype {other:?}"),
    };
    c.attn = if r["attn"] == "eager" { Attention::Eager } else { Attention::Sdpa };
    c.recompute = match r["recipe"]["recompute"].as_str() {
        Some("full") => Recompute::Full,
        // torchtitan's SelectiveAC with the CPU's SDPA kernel saved (measure_recipes.py `recompute=op`).
        Some("op") => {
            c.sac_cpu_sdpa = true;
            Recompute::Op
        }
        _ => Recompute::None,
    };
    c.kernels = Kernels::Cpu;
    c.optim = Optimizer::Adamw;
    c.optim_impl = OptimImpl::Forloop;
    c.cuda_ctx_mib = Some(0);
    c.nccl_mib = Some(0);
    c.frag_pct = None;
    // torchtune's own LoRA (`LoRALinear` on q and v, adapters in the model's dtype).
    if let Some(l) = r.get("lora") {
        assert_eq!(l["lora_attn_modules"], serde_json::json!(["q_proj", "v_proj"]), "{}", r["id"]);
        set(&mut c, "finetune", "lora");
        set(&mut c, "lora_targets", "q,v");
        set(&mut c, "lora_dtype", "model");
        set(&mut c, "lora_rank", &l["lora_rank"].to_string());
        set(&mut c, "lora_dropout", &l["lora_dropout"].to_string());
    }
    if r["recipe"]["compile"] == true {
        set(&mut c, "compile", "true");
        set(&mut c, "compile_regions", "layer");
    }
    match r["recipe"]["act_offload"].as_str() {
        Some("torchtune") => set(&mut c, "act_offload", "true"),
        Some("save_on_cpu") => set(&mut c, "act_offload", "save_on_cpu"),
        other => panic!("act_offload {other:?}"),
    }
    c
}

/// Records the estimator refuses by name (measured, not reached): (id suffix, why). torchtune's
/// LoRA under offloading: host bytes exact, step peaks over by a stashed layer input
/// (+16,384 B with full AC, +65,536 B without, +6,232 B compiled).
const REFUSED: &[(&str, &str)] = &[];

/// Records whose step peak the estimator does not reach yet: (id, residual), reported, not
/// failed. torchtune's tied Llama 3.2 compiled in fp32: one fp32 `[b, s, h]` (32,768 B) more is
/// alive in layer 0's backward than the estimate holds (its bf16 twin is exact to the byte; the
/// untied Llama 3's fp32 twin peaks in the optimizer step, where the two agree). Not diagnosed;
/// the estimate is the same whether the brought-back inputs' hook runs at the recomputation's
/// trigger or after the layer's whole compiled backward, and no compiled fp32 record without
/// offloading peaks in a layer's backward to tell the compile model's share from offloading's.
/// GPT-2 under `save_on_cpu` with full checkpointing: 512 B more alive at the loss than the
/// estimate holds, in fp32 and bf16 (−0.01 to −0.02 %; its torchtune twins exact). Found:
/// transformers 5.24's `GPT2Model.forward` passes `position_ids=position_ids` (`[1, s]` int64) to
/// each block, so the checkpoint's `partial` closure holds it; without offloading the wpe
/// embedding's saved indices keep it alive anyway, `save_on_cpu` moves those. The estimator's
/// GPT-2 layers take no positions (`shares_positions`): giving them the positions made these
/// exact but split the piecewise peak from the whole stream by 1 KiB (GPT-2, accum 4), left for later.
const PEAK_PENDING: &[(&str, &str)] = &[
    (
        "torchtune-llama3_2/b2/s64/fp32/sdpa/compile=layer+recompute=full+act_offload=torchtune",
        "-32,768 B in layer 0's compiled backward, not diagnosed",
    ),
    ("gpt2/b2/s64/fp32/sdpa/act_offload=save_on_cpu+recompute=full", "-512 B at the loss: position_ids held by the checkpoint closure"),
    ("gpt2/b2/s64/bf16/sdpa/act_offload=save_on_cpu+recompute=full", "-512 B at the loss: position_ids held by the checkpoint closure"),
];

/// Bytes a torch.profiler-measured (compiled) peak may differ by: the residual of the same
/// compiled records without offloading (tests/framework_fixtures.rs: −10 B bf16, −12 B fp32,
/// −40 B with LoRA on q and v), at the same place of the step.
const PROFILED_SLACK: u128 = 40;

#[test]
fn every_offload_record_with_checkpointing_has_its_host_bytes_and_step_peak_to_the_byte() {
    let docs = shards();
    if common::missing(docs.is_empty(), "records", &fixtures()) {
        return;
    }
    let mut failures = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        for r in doc["records"].as_array().into_iter().flatten() {
            let id = r["id"].as_str().unwrap_or_default();
            let cfg = config_of(doc, r);
            let refused = REFUSED.iter().find(|(suffix, _)| id.ends_with(suffix));
            let e = match (estimate(&cfg), refused) {
                (Ok(e), None) => e,
                (Err(err), Some((_, why))) if err.to_string().contains(why) && err.to_string().contains("not modelled yet") => {
                    println!("{id:70} refused by name: {err}");
                    continue;
                }
                (Ok(_), Some(_)) => {
                    failures.push(format!("{id}: estimated although listed as refused"));
                    continue;
                }
                (Err(err), _) => {
                    failures.push(format!("{id}: refused: {err}"));
                    continue;
                }
            };
            checked += 1;
            let host: u128 = e.host.iter().filter(|c| c.id.as_str() == "offloaded_activations").map(|c| c.bytes).sum();
            let want_host = u128::from(r["offloaded_bytes"].as_u64().expect("offloaded_bytes"));
            let copied = u128::from(r["step"]["host_bytes_copied_in_forward"].as_u64().expect("host_bytes_copied_in_forward"));
            assert_eq!(want_host, copied, "{id}: the record's own host figures agree");
            // The profiled (compiled) records: the peak without kernel workspaces, the tracker's convention.
            let step = &r["step"];
            let want_peak =
                step["tensors_measured_peak_bytes"].as_u64().or_else(|| step["measured_peak_bytes"].as_u64()).expect("a peak") as u128;
            // A checkpoint's `preserve_rng_state` CPU RNG state (5,056 B a checkpointed layer, alive
            // from its forward to its recomputation) is host memory on a GPU, not in the estimate:
            // out of a peak the profiler measured in forward (as tests/framework_fixtures.rs does).
            let rng = if step["tensors_peak_phase"] == "forward" { r["checkpoint_rng_state_bytes"].as_u64().unwrap_or(0) } else { 0 };
            let want_peak = want_peak - u128::from(rng);
            println!("{id:70} host {host:>8} / {want_host:>8}  peak {:>9} / {want_peak:>9} ({})", e.memory.peak, e.memory.peak_op);
            if host != want_host {
                failures.push(format!("{id}: host bytes {host} vs {want_host}"));
            }
            // The profiled records: within the residual their siblings without offloading carry.
            let slack = if step["tensors_measured_peak_bytes"].is_u64() { PROFILED_SLACK } else { 0 };
            let pending = PEAK_PENDING.iter().find(|(p, _)| *p == id);
            if let Some((_, why)) = pending.filter(|_| e.memory.peak.abs_diff(want_peak) > slack) {
                println!("pending: {id}: step peak {} vs {want_peak}: {why}", e.memory.peak);
            } else if pending.is_some() {
                failures.push(format!("{id}: step peak {} vs {want_peak} now within {slack} B: drop it from PEAK_PENDING", e.memory.peak));
            } else if e.memory.peak.abs_diff(want_peak) > slack {
                failures.push(format!("{id}: step peak {} vs {want_peak} at {}", e.memory.peak, e.memory.peak_op));
            }
        }
    }
    assert!(checked > 0, "no records estimated");
    assert!(failures.is_empty(), "{} off:\n{}", failures.len(), failures.join("\n"));
}
