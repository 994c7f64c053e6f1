//! torchtune's distributed recipes against what PyTorch did on two CPU ranks
//! (`tests/fixtures/pytorch/fsdp/tune.json`, `validation/measure_tune_fsdp.py`,
//! `validation/FINDINGS.md` §13.3): torchtune 0.6.1's own Llama 3.1 (dim 64, 2 layers, 4 heads
//! with 2 key/value heads, vocabulary 4096) in bf16, prepared as `full_finetune_distributed.py`
//! (`custom_sharded_layers: ['tok_embeddings', 'output']`) and `lora_finetune_distributed.py`
//! (LoRA on q and v, the root holding embedding, norm and output) prepare it — checkpointed or
//! not, compiled or not — sharded by torchtune's own `training.shard_model`; and its QLoRA
//! (torchao's `NF4Tensor` bases, LoRA on every decoder linear, `torch.nn.CrossEntropyLoss` as
//! `405B_qlora.yaml` had it; hidden 256, ffn 512) eager, checkpointed, and compiled. The lowest
//! peak of steps 2 to 4 on rank 0.
//!
//! What the estimator takes from them: `framework = torchtune` on several GPUs is its own code
//! under FSDP2 (`zero = full_shard`) with every unit in the step's stream: each decoder layer
//! (gathered for its forward and again for its backward, the layer before it prefetched then;
//! in forward each all-gather's flat output kept to the next unit's all-gather, as FSDP2 defers
//! its free), the LoRA configs' root (embedding, norm and output: resharded after the head,
//! gathered again from the head's backward to the end of backward), the full configs' output
//! unit (gathered around each of the 8 chunk matmuls, the gradient accumulated over them) and
//! embedding unit. The LoRA records, eager and compiled, land within half a percent of the peak
//! without kernel workspaces (`tensors_measured_peak_bytes`, the dispatch tracker's convention:
//! the CPU `bmm`'s scratch left out); the full fine-tunes, eager and compiled, are over by
//! exactly the sharded gradients the estimate keeps resident and FSDP2 frees at
//! `zero_grad(set_to_none=True)` — the bookkeeping every `zero = full_shard` estimate carries
//! (FINDINGS §15.1).
//!
//! Under `CI=1` a missing fixture fails instead of skipping.

mod common;

use serde_json::Value;
use trainmem::config::{decode_query, Config};
use trainmem::estimator::estimate;
use trainmem::estimator::ledger::RowId;

/// The configuration each record measured, as a share link: torchtune's Llama 3.1 code, FSDP2
/// over 2 ranks, pure bf16, its chunked loss, AdamW foreach, on the CPU (no caching allocator,
/// no CUDA context or NCCL buffers).
const QUERY: &str = "model=custom&family=llama&vocab=4096&hidden=64&layers=2&heads=4&kv_heads=2&head_dim=16&ffn=256\
                     &tied=false&max_pos=128&framework=torchtune&zero=full_shard&gpus=2&batch=2&seq=64&precision=bf16\
                     &loss=chunked&optim=adamw&optim_impl=foreach&attn=sdpa&kernels=cpu&cuda_ctx_mib=0&nccl_mib=0";

/// How far an estimated peak may be from the measured one: the harness's 0.5 %.
const TOLERANCE: f64 = 0.005;

/// Bytes of a bf16 element.
const BF16_BYTES: u64 = 2;

fn records() -> Vec<Value> {
    common::fixture_records("fsdp/tune.json")
}

fn u(r: &Value, key: &str) -> u64 {
    r[key].as_u64().unwrap_or_else(|| panic!("{}: no {key}", r["id"]))
}

/// The QLoRA records' model and recipe: hidden 256 and ffn 512 (every NF4 weight's shard holds
/// whole scaler blocks), torchao's NF4 base under LoRA on q, k, v, o and the MLP (rank 8), and
/// `torch.nn.CrossEntropyLoss` — `llama3_1/405B_qlora.yaml` as the README's run of 2024-09-24 had it.
const QLORA: &str = "&hidden=256&head_dim=64&ffn=512&finetune=qlora&qlora_quant=torchao-nf4\
                     &lora_targets=q,k,v,o,gate,up,down&lora_rank=8&lora_dtype=model&loss=standard";

/// The record's share link: its layout (LoRA on q and v, rank 8; QLoRA as [`QLORA`]),
/// checkpointing and compile.
fn query(r: &Value) -> String {
    let mut q = QUERY.to_string();
    if r["layout"] == "lora" {
        q.push_str("&finetune=lora&lora_targets=q,v&lora_rank=8&lora_dtype=model");
    }
    if r["layout"] == "qlora" {
        q.push_str(QLORA);
    }
    if r["activation_checkpointing"] == true {
        q.push_str("&recompute=full");
    }
    if r["compile"] == true {
        q.push_str("&compile=true&compile_regions=layer");
    }
    q
}

/// The estimated allocated peak within [`TOLERANCE`] of the record's peak without kernel
/// workspaces (`tensors_measured_peak_bytes`, the dispatch tracker's convention).
fn assert_peak_as_measured(r: &Value, e: &trainmem::estimator::Estimate) {
    let (est, measured) = (e.memory.allocated_peak as f64, u(r, "tensors_measured_peak_bytes") as f64);
    assert!((est / measured - 1.0).abs() <= TOLERANCE, "{}: estimated {est} vs measured {measured}", r["id"]);
}

/// The record's configuration, read without an error.
fn config(r: &Value) -> Config {
    let d = decode_query(&query(r));
    assert_eq!(d.errors, vec![], "{}", r["id"]);
    d.config
}

fn eager<'a>(records: &'a [Value], layout: &'a str) -> impl Iterator<Item = &'a Value> {
    records.iter().filter(move |r| r["layout"] == layout && r["compile"] == false)
}

#[test]
fn torchtunes_distributed_lora_peaks_as_pytorch_measured_within_half_a_percent() {
    let records = records();
    if records.is_empty() {
        return;
    }
    assert_eq!(eager(&records, "lora").count(), 2, "with and without checkpointing");
    for r in eager(&records, "lora") {
        let e = estimate(&config(r)).expect("torchtune's distributed LoRA estimates");
        assert_peak_as_measured(r, &e);
        // The sharded bf16 parameters, frozen base and adapters, are what the rank held.
        let weights = e.row(RowId::Weights).map_or(0, |r| r.bytes) + e.row(RowId::FrozenWeights).map_or(0, |r| r.bytes);
        assert_eq!(weights, u(r, "params_bytes") as u128, "{}", r["id"]);
        // Both peak in the loss's forward (the fp32 log-softmax of a chunk), as measured.
        assert_eq!(r["peak_at"]["op"], "aten::nll_loss_forward", "{}", r["id"]);
        // The adapters' gradient shards (1,792 B a layer), made by each layer's reduce and freed
        // by `zero_grad`, are the gradients row.
        assert_eq!(measured_shards(r), e.row(RowId::Gradients).expect("a gradients row").bytes, "{}", r["id"]);
    }
}

#[test]
fn torchtunes_distributed_qlora_on_nf4_bases_peaks_as_measured_eager_checkpointed_or_compiled() {
    use trainmem::estimator::step::Phase;
    let records = records();
    if records.is_empty() {
        return;
    }
    let qlora: Vec<&Value> = records.iter().filter(|r| r["layout"] == "qlora").collect();
    assert_eq!(qlora.len(), 3, "eager, checkpointed, checkpointed and compiled");
    for r in qlora {
        let cfg = config(r);
        let e = estimate(&cfg).expect("torchtune's distributed QLoRA estimates");
        assert_peak_as_measured(r, &e);
        // What the rank holds before the step: the adapters', the bf16 root's and norms' shards
        // and the NF4 bases' (codes, scalers and factors sharded, mean and table whole):
        // 2,468,644 B, to the byte.
        let held: u128 =
            [RowId::Weights, RowId::FrozenWeights, RowId::QuantizedWeights].iter().map(|&id| e.row(id).map_or(0, |r| r.bytes)).sum();
        assert_eq!(held, u(r, "params_bytes") as u128, "{}", r["id"]);
        assert_eq!(measured_shards(r), e.row(RowId::Gradients).expect("a gradients row").bytes, "{}", r["id"]);
        // Both peak when the root (embedding, norm, output: 4,194,816 B in bf16) is gathered
        // again for the head's backward, beside the fp32 logits' gradient.
        assert_eq!((r["peak_at"]["phase"].as_str(), r["peak_at"]["fsdp"].as_str()), (Some("backward"), Some("FSDP::all_gather")));
        let s = trainmem::estimator::step_stream(&cfg).expect("stream");
        let at = s.peak_event().expect("a peak");
        assert_eq!((at.phase, at.op), (Phase::Backward, "FSDP::all_gather_copy_out"), "{}", at.label());
    }
}

#[test]
fn torchtunes_distributed_full_fine_tune_eager_or_compiled_peaks_as_measured_its_gradient_shards_made_by_each_units_reduce() {
    let records = records();
    if records.is_empty() {
        return;
    }
    let full: Vec<&Value> = records.iter().filter(|r| r["layout"] == "full").collect();
    assert_eq!(full.len(), 3, "eager with and without checkpointing, compiled with");
    for r in full {
        let cfg = config(r);
        let e = estimate(&cfg).expect("torchtune's distributed full fine-tune estimates");
        let grads = e.row(RowId::Gradients).expect("a gradients row").bytes;
        // Half of every bf16 parameter: 323,744 elements a rank, 647,488 B.
        assert_eq!(grads, u(r, "params_bytes") as u128, "{}: the gradient shards are the parameter shards' size", r["id"]);
        assert_peak_as_measured(r, &e);
        // Measured: the shards are allocated in backward by each unit's reduce and freed by
        // `zero_grad` (the output's 262,144 B, a layer's 61,568 B, the embedding's 262,144 B,
        // the norm's 64 B).
        assert_eq!(measured_shards(r), grads, "{}", r["id"]);
        // The estimate: none before the step, each made in backward, all there at its end.
        let s = trainmem::estimator::step_stream(&cfg).expect("stream");
        assert_eq!(made_shards(&s), grads, "{}", r["id"]);
    }
}

#[test]
fn compiled_the_full_fine_tune_peaks_in_the_output_units_backward_and_the_lora_in_the_heads_forward_beside_the_last_layers_flat_output() {
    use trainmem::estimator::step::Phase;
    let records = records();
    if records.is_empty() {
        return;
    }
    let compiled: Vec<&Value> = records.iter().filter(|r| r["compile"] == true && r["layout"] != "qlora").collect();
    assert_eq!(compiled.len(), 2, "full and LoRA, checkpointed");
    for r in &compiled {
        let cfg = config(r);
        let s = trainmem::estimator::step_stream(&cfg).expect("stream");
        let at = s.peak_event().expect("a peak");
        if r["layout"] == "full" {
            // Measured with the kernels' workspaces or without, the same peak: the second
            // chunk's gradient added out of place beside the accumulated one and the gathered
            // output weight; the estimate peaks there too.
            assert_eq!(u(r, "tensors_measured_peak_bytes"), u(r, "measured_peak_bytes"));
            assert_eq!(r["peak_at"]["phase"], "backward");
            let alive = r["peak_at"]["alive"].as_object().expect("what is alive at the peak");
            let gathered: u64 = alive.iter().filter(|(k, _)| k.contains("FSDP::all_gather_copy_out")).filter_map(|(_, v)| v.as_u64()).sum();
            // The output unit (4096 × 64 in bf16) and the root (the final norm's 64).
            assert_eq!(gathered, (4096 * 64 + 64) * BF16_BYTES, "{}", r["id"]);
            assert_eq!((at.phase, at.op), (Phase::Backward, "add"), "{}", at.label());
            assert_eq!(r["peak_at"]["op"], "aten::add");
        } else {
            // With the CPU `bmm`'s scratch (134,144 B, freed inside the call) the profiler peaks
            // in the head's backward; without it, as the estimate counts, in the head's forward:
            // the root gathered and the last layer's flat all-gather output, whose free FSDP2
            // defers to the end of the model's forward.
            assert!(u(r, "tensors_measured_peak_bytes") < u(r, "measured_peak_bytes"));
            let t = u(r, "tensors_peak_at");
            let allocs = r["allocations"].as_array().expect("allocations");
            let alive_at = |a: &&Value| {
                col(a, "t").as_u64().is_some_and(|a0| a0 <= t)
                    && col(a, "freed_t").as_u64().is_none_or(|f| f > t)
                    && col(a, "workspace") == false
            };
            let flat: u64 = allocs
                .iter()
                .filter(alive_at)
                .filter(|a| col(a, "fsdp") == "FSDP::all_gather (layers.1)")
                .filter_map(|a| col(a, "bytes").as_u64())
                .sum();
            assert_eq!(flat, 126_720, "layers.1's flat output, alive at the measured peak");
            assert!(allocs.iter().filter(alive_at).all(|a| col(a, "phase") == "forward"), "{}: a forward peak", r["id"]);
            assert_eq!(at.phase, Phase::Forward, "{}", at.label());
            let g = common::gathered_live(&s);
            assert_eq!(g[s.peak_index], (2 * 4096 * 64 + 64) * BF16_BYTES as u128 + 126_720, "{}", at.label());
            let e = estimate(&cfg).expect("torchtune's compiled distributed LoRA estimates");
            assert_peak_as_measured(r, &e);
        }
    }
}

#[test]
fn the_full_configs_output_unit_is_gathered_per_chunk_and_its_gradient_accumulated_as_measured() {
    use trainmem::estimator::step::{Cat, EventKind, Phase};
    let records = records();
    if records.is_empty() {
        return;
    }
    for r in eager(&records, "full") {
        let allocs = r["allocations"].as_array().expect("allocations");
        let count = |phase: &str, fsdp: &str| allocs.iter().filter(|a| col(a, "phase") == phase && col(a, "fsdp") == fsdp).count();
        // Measured: the output weight gathered for each of the 8 chunks, in forward and again in
        // backward; one out-of-place `add` of its gradient's size.
        assert_eq!(count("forward", "FSDP::all_gather_copy_out (output)"), 8, "{}", r["id"]);
        assert_eq!(count("backward", "FSDP::all_gather_copy_out (output)"), 8, "{}", r["id"]);
        let cfg = config(r);
        let s = trainmem::estimator::step_stream(&cfg).expect("stream");
        let gathers = |phase: Phase| copy_outs(&s, phase, |e| e.bytes == 4096 * 64 * 2);
        assert_eq!(gathers(Phase::Forward), 8 + 1, "{}: the 8 chunks and the embedding", r["id"]);
        assert_eq!(gathers(Phase::Backward), 8 + 1, "{}", r["id"]);
        let adds = s.events.iter().filter(|e| e.cat == Cat::Gathered && e.kind == EventKind::Alloc && e.op == "add").count();
        assert_eq!(adds, 1, "{}", r["id"]);
        // Nothing of them is left when the step ends.
        assert_eq!(*common::gathered_live(&s).last().expect("events"), 0);
        let e = estimate(&cfg).expect("estimates");
        // max(U + 2G, G + R), all 524,288 B here.
        assert_eq!(e.row(RowId::GatheredEnds).expect("the output unit's row").bytes, 3 * 524_288);
    }
}

#[test]
fn on_torch_before_2_8_the_root_stays_gathered_from_its_forward_into_backward_and_is_never_gathered_again() {
    use trainmem::estimator::step::{Cat, EventKind, Phase};
    // torch ≤ 2.7's FSDP2 clamps the root to no reshard after forward (`_lazy_init`:
    // `post_forward_mesh_info = None`, whatever `reshard_after_forward` says; pytorch#154704
    // made torch 2.8 respect it). The records are torch 2.15's, so this is the stream alone:
    // the LoRA configs' root (embedding, norm, output: 1,048,704 B here) gathered once.
    let root = (2 * 4096 * 64 + 64) * BF16_BYTES as u128;
    for extra in [
        "&finetune=lora&lora_targets=q,v&lora_rank=8&lora_dtype=model",
        "&finetune=lora&lora_targets=q,v&lora_rank=8&lora_dtype=model&recompute=full",
    ] {
        let now = decode_query(&format!("{QUERY}{extra}"));
        let old = decode_query(&format!("{QUERY}{extra}&fsdp_root_reshard=false"));
        assert_eq!((now.errors.clone(), old.errors.clone()), (vec![], vec![]));
        let (s_now, s_old) = (
            trainmem::estimator::step_stream(&now.config).expect("stream"),
            trainmem::estimator::step_stream(&old.config).expect("stream"),
        );
        let root_gathers = |s: &trainmem::estimator::step::Stream, phase: Phase| copy_outs(s, phase, |e| e.bytes == root);
        assert_eq!((root_gathers(&s_now, Phase::Forward), root_gathers(&s_now, Phase::Backward)), (1, 1), "{extra}");
        assert_eq!((root_gathers(&s_old, Phase::Forward), root_gathers(&s_old, Phase::Backward)), (1, 0), "{extra}");
        // Kept through the loss (never resharded after forward), freed at the end of backward.
        let freed = |s: &trainmem::estimator::step::Stream| {
            s.events
                .iter()
                .filter(|e| e.cat == Cat::Gathered && e.kind == EventKind::Free && e.bytes == root)
                .map(|e| e.phase)
                .collect::<Vec<_>>()
        };
        assert_eq!(freed(&s_old), vec![Phase::Forward, Phase::Backward], "{extra}: the flat output, then the copy at backward's end");
        assert!(freed(&s_now).contains(&Phase::Loss), "{extra}: torch 2.15 reshards the root when the model returns");
        assert_eq!(*common::gathered_live(&s_old).last().expect("events"), 0);
        // So the loss runs beside it (here the eager peak: the loss's fp32 log-softmax), where
        // torch 2.15 has it resharded.
        let at_loss = |s: &trainmem::estimator::step::Stream| {
            let g = common::gathered_live(s);
            s.events.iter().zip(&g).filter(|(e, _)| e.phase == Phase::Loss).map(|(_, &l)| l).min().expect("loss events")
        };
        assert!(at_loss(&s_old) >= root && at_loss(&s_now) < root, "{extra}");
    }
    // Where the step follows no FSDP2 root unit, `false` is refused by name.
    let hf = decode_query(&QUERY.replace("framework=torchtune", "framework=hf"));
    let cfg = trainmem::config::Config { fsdp_root_reshard: false, ..hf.config };
    let err = estimate(&cfg).expect_err("refused").to_string();
    assert!(err.contains("fsdp_root_reshard"), "{err}");
}

#[test]
fn the_lora_configs_root_is_gathered_beside_every_decoder_layers_backward_as_measured() {
    use trainmem::estimator::step::Phase;
    let records = records();
    if records.is_empty() {
        return;
    }
    for r in eager(&records, "lora") {
        // The root unit: embedding, final norm and output, (2 · 4096 · 64 + 64) · 2 B.
        let root = r["units"]
            .as_array()
            .and_then(|units| units.iter().find(|u| u["unit"] == "<root>"))
            .and_then(|u| u["unsharded_bf16_bytes"].as_u64())
            .expect("the root unit");
        assert_eq!(root, (2 * 4096 * 64 + 64) * BF16_BYTES);
        // Measured: gathered again in backward (`all_gather_copy_out` outside any layer's unit),
        // kept to the root's `post_backward_reshard` at the very end of backward.
        let again: u64 = r["allocations"]
            .as_array()
            .expect("allocations")
            .iter()
            .filter(|a| col(a, "phase") == "backward" && col(a, "fsdp") == "FSDP::all_gather_copy_out")
            .inspect(|a| assert_eq!(col(a, "freed_fsdp"), "FSDP::post_backward_reshard", "{}", r["id"]))
            .filter_map(|a| col(a, "bytes").as_u64())
            .sum();
        assert_eq!(again, root, "{}", r["id"]);
        let cfg = config(r);
        let e = estimate(&cfg).expect("estimates");
        assert_eq!(e.row(RowId::GatheredRoot).expect("the root's row").bytes, root as u128);
        // The stream: nothing gathered at its peak (the loss's forward, where the root was
        // resharded), the root beside every decoder layer's backward, nothing at the end.
        let s = trainmem::estimator::step_stream(&cfg).expect("stream");
        let g = common::gathered_live(&s);
        assert_eq!(g[s.peak_index], 0, "{}", r["id"]);
        assert!(g.iter().max().is_some_and(|&m| m >= root as u128));
        let layer_backward: Vec<u128> =
            s.events.iter().zip(&g).filter(|(ev, _)| ev.phase == Phase::Backward && ev.layer.is_some()).map(|(_, &g)| g).collect();
        assert!(!layer_backward.is_empty());
        assert!(layer_backward.iter().all(|&g| g >= root as u128), "{}", r["id"]);
        assert_eq!(*g.last().expect("events"), 0);
    }
}

#[test]
fn each_decoder_layer_is_a_unit_gathered_for_its_forward_and_its_backward_the_one_before_it_prefetched() {
    use trainmem::estimator::step::{Cat, EventKind, Phase};
    let records = records();
    if records.is_empty() {
        return;
    }
    for r in &records {
        let unit = |name: &str| {
            r["units"]
                .as_array()
                .and_then(|units| units.iter().find(|u| u["unit"] == name))
                .and_then(|u| u["unsharded_bf16_bytes"].as_u64())
                .unwrap_or_else(|| panic!("{}: no unit {name}", r["id"])) as u128
        };
        let allocs = r["allocations"].as_array().expect("allocations");
        // Measured: each layer's flat all-gather output once in forward and once in backward,
        // layers.0's in backward allocated before layers.1's copy-out goes (prefetched).
        let flats = |phase: &str, k: u32| {
            allocs
                .iter()
                .filter(|a| col(a, "phase") == phase && col(a, "fsdp") == format!("FSDP::all_gather (layers.{k})").as_str())
                .collect::<Vec<_>>()
        };
        let first = |phase: &str, k: u32| flats(phase, k).first().map(|a| col(a, "t").as_u64().expect("t")).expect("a flat output");
        // A layer's flat all-gather output: its parameters in bf16, or under QLoRA the NF4
        // bases' codes, scalers and factors with the bf16 adapters and norms (370,760 B).
        let layer = flats("forward", 0).first().and_then(|a| col(a, "bytes").as_u64()).expect("layers.0 gathered") as u128;
        if r["layout"] == "qlora" {
            assert!(layer < unit("layers.0") / 3, "{}: NF4 gathered, not bf16", r["id"]);
        } else {
            assert_eq!(layer, unit("layers.0"), "{}", r["id"]);
        }
        assert_eq!(unit("layers.1"), unit("layers.0"));
        let reshard = allocs
            .iter()
            .filter(|a| col(a, "fsdp") == "FSDP::all_gather_copy_out (layers.1)" && col(a, "phase") == "backward")
            .filter_map(|a| col(a, "freed_t").as_u64())
            .min()
            .expect("layers.1 resharded after its backward");
        assert!(first("backward", 0) < reshard, "{}: layers.0 prefetched during layers.1's backward", r["id"]);
        // The estimate: the same units, gathered (copy-out) once in forward and once in
        // backward each, and during layer 1's backward that layer's copy with layer 0's flat
        // output beside it (and, for LoRA, the root).
        let cfg = config(r);
        let s = trainmem::estimator::step_stream(&cfg).expect("stream");
        for (phase, op) in [
            (Phase::Forward, "FSDP::all_gather_copy_out"),
            (Phase::Backward, "FSDP::all_gather_copy_out"),
            (Phase::Backward, "FSDP::all_gather"),
        ] {
            let n = s
                .events
                .iter()
                .filter(|e| e.cat == Cat::Gathered && e.kind == EventKind::Alloc && e.phase == phase && e.op == op && e.bytes == layer)
                .count();
            assert_eq!(n, 2, "{}: {phase:?} {op}", r["id"]);
        }
        let g = common::gathered_live(&s);
        let root = unit("<root>");
        // From layer 1's copy-out in backward to its reshard.
        let is = |e: &trainmem::estimator::step::Event, kind: EventKind, op: &str| {
            e.cat == Cat::Gathered && e.kind == kind && e.phase == Phase::Backward && e.layer == Some(1) && e.op == op && e.bytes == layer
        };
        let from = s.events.iter().position(|e| is(e, EventKind::Alloc, "FSDP::all_gather_copy_out")).expect("layer 1 gathered");
        let to = s.events.iter().position(|e| is(e, EventKind::Free, "FSDP::post_backward_reshard")).expect("layer 1 resharded");
        let in_layer_1 = &g[from..to];
        assert_eq!(in_layer_1.iter().max().copied(), Some(root + 2 * layer), "{}", r["id"]);
        assert_eq!(*g.last().expect("events"), 0, "{}: nothing gathered when the step ends", r["id"]);
    }
}

/// The measured gradient shards: allocated in backward (each unit's reduce), freed by
/// `zero_grad`.
fn measured_shards(r: &Value) -> u128 {
    let allocs = r["allocations"].as_array().expect("allocations");
    let shards = allocs.iter().filter(|a| col(a, "phase") == "backward" && col(a, "freed_phase") == "zero_grad");
    shards.filter_map(|a| col(a, "bytes").as_u64()).map(u128::from).sum()
}

/// The estimate's gradient shards: made by the units' reduces in the stream.
fn made_shards(s: &trainmem::estimator::step::Stream) -> u128 {
    use trainmem::estimator::step::{Cat, EventKind};
    let made = s.events.iter().filter(|e| e.cat == Cat::Gradients && e.kind == EventKind::Alloc && e.op == "FSDP::post_backward_reduce");
    made.map(|e| e.bytes).sum()
}

/// How many FSDP copy-outs (gathered parameters) the stream allocates in `phase` that `keep`.
fn copy_outs(
    s: &trainmem::estimator::step::Stream,
    phase: trainmem::estimator::step::Phase,
    keep: impl Fn(&trainmem::estimator::step::Event) -> bool,
) -> usize {
    use trainmem::estimator::step::{Cat, EventKind};
    let gathered = s.events.iter().filter(|e| e.cat == Cat::Gathered && e.kind == EventKind::Alloc && e.phase == phase);
    gathered.filter(|e| e.op == "FSDP::all_gather_copy_out" && keep(e)).count()
}

/// Column `name` of an allocation row of the fixture.
fn col(a: &Value, name: &str) -> Value {
    a[fixture_columns().iter().position(|c| *c == name).expect("column")].clone()
}

/// The fixture's allocation columns.
fn fixture_columns() -> Vec<&'static str> {
    vec!["t", "bytes", "phase", "fsdp", "op", "live_after", "freed_t", "freed_phase", "freed_fsdp", "freed_op", "workspace"]
}

#[test]
fn a_distributed_full_fine_tune_of_a_tied_model_is_refused_by_name() {
    // torchtune's `TiedLinear` is no module: its head reads the embedding unit's weight outside
    // that unit's calls, which the records do not cover. Tied LoRA keeps both in the root.
    let tied = decode_query(&QUERY.replace("tied=false", "tied=true"));
    let err = tied.errors.iter().find(|e| e.key == "framework").expect("refused on framework");
    assert!(err.reason.contains("tied output"), "{}", err.reason);
    let lora =
        decode_query(&format!("{}&finetune=lora&lora_targets=q,v&lora_rank=8&lora_dtype=model", QUERY.replace("tied=false", "tied=true")));
    assert_eq!(lora.errors, vec![]);
}

#[test]
fn on_every_family_torchtune_distributes_each_layer_is_gathered_twice_the_shards_made_in_backward_and_nothing_left_gathered() {
    use trainmem::estimator::step::Phase;
    // torchtune's families at two layers, on 4 GPUs, full fine-tune and LoRA, eager and
    // checkpointed: the invariants of the units in the stream, whatever the layer holds.
    let mut checked = 0;
    for model in ["llama-3.1-8b", "llama-3.2-1b", "qwen2.5-7b", "mistral-7b-v0.1", "gemma-2-2b"] {
        for tail in [
            "",
            "&recompute=full",
            "&finetune=lora&lora_targets=q,v&lora_dtype=model",
            "&finetune=lora&lora_targets=q,v&lora_dtype=model&recompute=full",
        ] {
            let q = format!("model={model}&layers=2&framework=torchtune&zero=full_shard&gpus=4&batch=1&seq=128&precision=bf16&loss=chunked&optim=adamw{tail}");
            let d = decode_query(&q);
            if d.errors.iter().any(|e| e.key == "framework") {
                // Refused by name: a tied full fine-tune (Gemma 2), LoRA off Llama and Qwen2.
                continue;
            }
            checked += 1;
            assert_eq!(d.errors, vec![], "{q}");
            let s = trainmem::estimator::step_stream(&d.config).expect("stream");
            let copies = |phase: Phase| copy_outs(&s, phase, |e| e.layer.is_some());
            assert_eq!((copies(Phase::Forward), copies(Phase::Backward)), (2, 2), "{q}: each layer's copy-out once a pass");
            assert_eq!(*common::gathered_live(&s).last().expect("events"), 0, "{q}: nothing gathered at the end");
            let e = estimate(&d.config).expect("estimates");
            assert_eq!(
                made_shards(&s),
                e.row(RowId::Gradients).map_or(0, |r| r.bytes),
                "{q}: the shards, made in backward, are the gradients row"
            );
        }
    }
    assert_eq!(checked, 12, "configurations estimated");
}
