//! FSDP2's units against what PyTorch did on two CPU ranks (`tests/fixtures/pytorch/fsdp/
//! units.json`, `validation/measure_fsdp.py`, `validation/FINDINGS.md` §13.1): torchtitan 0.2.2's
//! own Llama 3 at a tiny size (dim 64, 2 layers, 4 heads with 2 key/value heads, vocabulary 4096,
//! so that the LM head is four decoder layers' worth of parameters), wrapped four ways —
//! torchtitan's `apply_fsdp`, a root left at its default, a root resharded after forward, and
//! late-2024 torchtitan's layout — and its second step profiled on rank 0.
//!
//! What the estimator takes from them: a decoder layer's unit, gathered in bf16, is the
//! `P_layer` of the "ZeRO-3/FSDP unsharded layers in flight" row, and the model's parameters are
//! the units' sum; torchtitan's `[norm, output]` unit, kept gathered through the loss, is in the
//! step's stream (row `gathered_head`), alive at the loss backward's peak. Not yet (FINDINGS
//! §13.1): a root kept gathered from the first forward to the end of backward (other layouts).
//!
//! Under `CI=1` a missing fixture fails instead of skipping.

mod common;

use serde_json::Value;
use trainmem::config::decode_query;
use trainmem::estimator::estimate;
use trainmem::estimator::ledger::RowId;

/// The configuration each record measured, as a share link: torchtitan's Llama 3 code, FSDP2
/// over 2 ranks, parameters gathered in bf16.
const QUERY: &str = "model=custom&family=llama&vocab=4096&hidden=64&layers=2&heads=4&kv_heads=2&head_dim=16&ffn=256\
                     &tied=false&max_pos=128&framework=torchtitan&zero=full_shard&gpus=2&batch=2&seq=64&precision=mixed-bf16";

/// Bytes of a bf16 element.
const BF16_BYTES: u64 = 2;

fn records() -> Vec<Value> {
    common::fixture_records("fsdp/units.json")
}

/// The unsharded bf16 bytes of the unit named `name` in `record`.
fn unit_bytes(record: &Value, name: &str) -> u64 {
    record["units"]
        .as_array()
        .and_then(|units| units.iter().find(|u| u["unit"] == name))
        .and_then(|u| u["unsharded_bf16_bytes"].as_u64())
        .unwrap_or_else(|| panic!("{}: no unit {name}", record["id"]))
}

fn record<'a>(records: &'a [Value], layout: &str) -> &'a Value {
    records.iter().find(|r| r["layout"] == layout).unwrap_or_else(|| panic!("no {layout} record"))
}

fn peak(r: &Value) -> u64 {
    r["step_peak_bytes"].as_u64().expect("step_peak_bytes")
}

#[test]
fn a_decoder_layers_unit_is_the_gathered_layer_the_estimate_counts_and_the_units_sum_to_the_model() {
    let records = records();
    if records.is_empty() {
        return;
    }
    let cfg = decode_query(QUERY);
    assert_eq!(cfg.errors, vec![]);
    let cfg = cfg.config;
    let e = estimate(&cfg).expect("the tiny torchtitan Llama estimates");
    let row = e.components.iter().find(|c| c.id == RowId::GatheredLayers).expect("FSDP gathers layers");
    for r in &records {
        // 61,568 parameters a layer (q 64×64, k and v 32×64, o 64×64, three 256×64 MLP
        // matrices, two norms of 64): 123,136 B in bf16.
        let layer = unit_bytes(r, "layers.0");
        assert_eq!(layer, 61_568 * BF16_BYTES, "{}", r["id"]);
        // The row: prefetch_layers (2) gathered layers plus one layer's bf16 gradient.
        assert_eq!(row.bytes as u64, cfg.prefetch_layers * layer + layer, "{}", r["id"]);
        let numel: u64 = r["units"].as_array().expect("units").iter().filter_map(|u| u["numel"].as_u64()).sum();
        assert_eq!(numel, cfg.arch.counts().total, "{}", r["id"]);
    }
}

#[test]
fn the_units_beyond_the_decoder_layers_are_what_the_layouts_peaks_differ_by() {
    let records = records();
    if records.is_empty() {
        return;
    }
    assert_eq!(records.len(), 4, "four layouts");
    // Every layout peaks in the loss's backward, where no decoder layer is gathered.
    for r in &records {
        assert_eq!(r["peak_at"]["op"], "aten::_log_softmax_backward_data", "{}", r["id"]);
    }
    let head = unit_bytes(record(&records, "torchtitan"), "norm, output");
    // [norm, output]: the 4096 × 64 head and the 64-wide norm, 524,416 B in bf16.
    assert_eq!(head, (4096 * 64 + 64) * BF16_BYTES);
    let none = peak(record(&records, "root-reshard"));
    // torchtitan keeps [norm, output] gathered through the loss: exactly that unit above a
    // layout that keeps nothing gathered there.
    assert_eq!(peak(record(&records, "torchtitan")) - none, head);
    // A root left at its default keeps embedding, norm and head gathered.
    let root = unit_bytes(record(&records, "root-default"), "<root>");
    assert_eq!(root, (2 * 4096 * 64 + 64) * BF16_BYTES);
    assert_eq!(peak(record(&records, "root-default")) - none, root);
    // Late-2024 torchtitan: the root and the last decoder layer (not resharded after forward).
    let late = record(&records, "titan-2412");
    assert_eq!(peak(late) - none, unit_bytes(late, "<root>") + unit_bytes(late, "layers.1"));
}

#[test]
fn the_estimate_keeps_torchtitans_norm_output_unit_gathered_at_its_loss_backward_peak() {
    let records = records();
    if records.is_empty() {
        return;
    }
    let titan = record(&records, "torchtitan");
    let head = unit_bytes(titan, "norm, output");
    let cfg = decode_query(QUERY).config;
    let e = estimate(&cfg).expect("the tiny torchtitan Llama estimates");
    // The stream the allocator replays: at its peak, the loss backward's log-softmax gradient
    // as measured, the unit's gathered parameters are alive, and nothing else of it.
    let s = trainmem::estimator::step_stream(&cfg).expect("stream");
    let at = s.peak_event().expect("a peak");
    assert_eq!(at.op, "_log_softmax_backward_data", "{}", at.label());
    assert_eq!(common::gathered_live(&s)[s.peak_index], head as u128);
    // Its lifetime: gathered before the final norm's forward, resharded after its backward;
    // the output's unsharded bf16 gradient (the measured 524,288 B) and the fp32 reduce-scatter
    // input (1,048,832 B) alive at the unit's reduce.
    let gathered = |op: &str| s.events.iter().find(|ev| ev.op == op).map(|ev| ev.bytes);
    assert_eq!(gathered("FSDP::all_gather_copy_out"), Some(head as u128));
    assert_eq!(gathered("FSDP::post_backward_reduce"), Some(1_048_832));
    assert_eq!(common::gathered_live(&s).iter().max().copied(), Some(4096 * 64 * BF16_BYTES as u128 + 1_048_832));
    assert_eq!(*common::gathered_live(&s).last().expect("events"), 0);
    // Its ledger row: the most of it alive at once (gradient + reduce-scatter input).
    let row = e.row(RowId::GatheredHead).expect("torchtitan's [norm, output] unit has its row");
    assert_eq!(row.bytes, 4096 * 64 * BF16_BYTES as u128 + 1_048_832);
    // DeepSpeed ZeRO-3 has no such unit.
    let z3 = estimate(&decode_query(&QUERY.replace("zero=full_shard", "zero=z3")).config).expect("z3");
    assert!(z3.row(RowId::GatheredHead).is_none());
    // Without the unit's allocations the stream peaks that unit lower, in the same place: the
    // measured torchtitan layout against the one that keeps nothing gathered there.
    let g = common::gathered_live(&s);
    let without = s.events.iter().zip(&g).map(|(ev, g)| ev.live - g).max().unwrap_or(0);
    assert_eq!(s.peak - s.resident - without, head as u128);
    // The estimate's allocated peak is that stream's.
    assert_eq!(e.memory.allocated_peak, s.peak);
    assert_eq!(peak(titan) - peak(record(&records, "root-reshard")), head);
}
