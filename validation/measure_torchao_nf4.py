#!/usr/bin/env python3
"""torchtune's QLoRA: torchao's ``NF4Tensor`` base under torchtune's ``LoRALinear`` (no bitsandbytes).

torchtune 0.6.1 ``lora_llama3_1(..., quantize_base=True)`` (the builder behind ``qlora_llama3_1_*``) stores every
decoder linear as torchao's ``NF4Tensor`` (``to_nf4(weight)``, block_size 64, scaler_block_size 256): adapted ones in
``LoRALinear`` (``modules/peft/lora.py``), the others (k_proj under the YAML default) in ``FrozenNF4Linear``
(``modules/low_precision/nf4_linear.py``); both run ``linear_nf4`` (torchao 0.18
``quantization/quantize_/workflows/nf4/nf4_tensor.py``, imported by torchtune as ``torchao.dtypes.nf4tensor``:
aliased here), an autograd Function that saves the ``NF4Tensor`` and dequantizes it (``get_original_weight``) in
forward and again in backward. The LoRA recipe's loss and adapters as measure_frameworks.py's torchtune records
(``CEWithChunkedOutputLoss(8)``, adapters in the model's dtype, only ``lora_a``/``lora_b`` trainable:
``set_trainable_params``); the YAML's targets: q, v, output + MLP, rank 8, alpha 16, dropout 0.

The tiny Llama 3.1 is measure_frameworks.py's with hidden 128 and 4 kv heads (every quantized weight a multiple of
64·256 elements, which ``to_nf4`` asserts): q, k, v, o 128×128 (one scaler block: ``quantization_factor`` keeps its
256-element storage), MLP 128×256 (two). Then measure.py's machinery runs unchanged (saved tensors with the graph
walk; two tracked steps of AdamW over the adapters, with the self-checks), with the NF4 inner tensors
(``quantized_data``, ``quantized_scalers``, ``quantization_factor``, ``scaler_mean``, ``nf4``) classified as
``nf4`` before each step and counted by storage in the record's ``nf4`` block (``measure.py`` counts a wrapper
subclass's parameter as numel × element size: its ``parameter_bytes`` here is the bf16 size, not what is stored).

Writes tests/fixtures/pytorch/torchao_nf4/records.json (b2 s64, bf16, with and without checkpointing).

``--compile`` (``--ckpt`` adds the checkpointed record): torchtune's ``compile=True`` instead, measured as
measure_recipes.py's ``measure_compile`` measures transformers' compiled layers (``measure_compiled`` below): each
``TransformerSelfAttentionLayer`` ``.compile()`` and the loss's ``compute_cross_entropy`` compiled, Inductor on the
CPU; saved tensors from the autograd graph (``CompiledFunctionBackward.saved_tensors``, each named by its producer in
the partitioner's forward graph), the step's peak and every allocation's size from torch.profiler memory events.
Writes tests/fixtures/pytorch/torchao_nf4/compile.json (about a minute a record on one core).

Usage: nice validation/.venv/bin/python validation/measure_torchao_nf4.py [--compile [--ckpt]]
(torch 2.15.0, torchtune 0.6.1, torchao 0.18.0).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torchao.quantization import NF4Tensor  # noqa: E402  (the real one, before measure_frameworks' stubs)

sys.modules["torchao.dtypes.nf4tensor"] = sys.modules[NF4Tensor.__module__]
import measure  # noqa: E402
import measure_frameworks as mf  # noqa: E402
import tracker as step_tracker  # noqa: E402
import torchao  # noqa: E402

mf.REAL_NF4 = True
OUT = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "pytorch", "torchao_nf4")
DIM, HEADS, KV_HEADS, FFN = 128, 4, 4, 256
LORA = dict(lora_attn_modules=["q_proj", "v_proj", "output_proj"], apply_lora_to_mlp=True,
            apply_lora_to_output=False, lora_rank=8, lora_alpha=16, lora_dropout=0.0)
INNER = ("quantized_data", "quantized_scalers", "quantization_factor", "scaler_mean", "nf4")
MODELS: list = []


def nf4_weights(model):
    return [p for p in model.parameters() if isinstance(p, NF4Tensor) or isinstance(getattr(p, "data", None), NF4Tensor)]


def inner_tensors(model):
    out = []
    for p in nf4_weights(model):
        t = p if isinstance(p, NF4Tensor) else p.data
        out.extend(getattr(t, a) for a in INNER)
    return out


class Nf4StepTracker(step_tracker.StepTracker):
    def begin_step(self, classes=None):
        extra = {"nf4": [t for m in MODELS for t in inner_tensors(m)]}
        super().begin_step({**extra, **dict(classes or {})})


step_tracker.StepTracker = Nf4StepTracker


def _plain(t):
    """An NF4Tensor stands for its `quantized_data` (a parameter storage: never counted as saved)."""
    return t.quantized_data if isinstance(t, NF4Tensor) else t


_orig_storage_ptrs = measure.storage_ptrs


def storage_ptrs(tensors):
    out = set()
    for t in tensors:
        if isinstance(t, NF4Tensor):
            out |= _orig_storage_ptrs([getattr(t, a) for a in INNER])
        else:
            out |= _orig_storage_ptrs([t])
    return out


measure.storage_ptrs = storage_ptrs
# The trackers key tensors by storage: an NF4Tensor (a wrapper without one) answers with its quantized data's.
NF4Tensor.untyped_storage = lambda self: self.quantized_data.untyped_storage()
_orig_add_event = measure.Capture._add_event
measure.Capture._add_event = lambda self, t, **kw: _orig_add_event(self, _plain(t), **kw)


def build(seq, tdtype):
    del seq
    mf._torchtune_modules()
    from torchtune.models.llama3_1._component_builders import lora_llama3_1
    from transformers import LlamaConfig
    m = mf._tune_model(lora_llama3_1, tdtype, vocab_size=mf.VOCAB, num_layers=mf.LAYERS, num_heads=HEADS,
                       num_kv_heads=KV_HEADS, embed_dim=DIM, max_seq_len=mf.TUNE_MAX_SEQ, intermediate_dim=FFN,
                       rope_base=500000, quantize_base=True, **LORA)
    # `set_trainable_params(model, get_adapter_params(model))`
    for n, p in m.named_parameters():
        p.requires_grad_(n.endswith("lora_a.weight") or n.endswith("lora_b.weight"))
    cfg = LlamaConfig(hidden_size=DIM, num_hidden_layers=mf.LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=FFN,
                      vocab_size=mf.VOCAB, rms_norm_eps=1e-5, max_position_embeddings=mf.TUNE_MAX_SEQ,
                      tie_word_embeddings=False, rope_theta=500000,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    lm = mf._tune_lm(m, cfg, tdtype, "LlamaForCausalLM")
    MODELS.clear()
    MODELS.append(lm)
    return lm


def layout(model):
    rows = {}
    for n, p in model.named_parameters():
        t = p if isinstance(p, NF4Tensor) else p.data
        if not isinstance(t, NF4Tensor):
            continue
        key = (tuple(t.shape), str(t.dtype).replace("torch.", ""))
        d = {a: getattr(t, a).untyped_storage().nbytes() for a in INNER}
        d.update(shape=list(t.shape), numel=t.numel(), dtype=key[1], block_size=t.block_size,
                 scaler_block_size=t.scaler_block_size, count=0)
        rows.setdefault(key, d)["count"] += 1
        rows[key].setdefault("modules", []).append(n)
    out = list(rows.values())
    for r in out:
        r["total_bytes"] = sum(r[a] for a in INNER)
        r["modules"] = sorted({".".join(x for x in m.split(".") if not x.isdigit()) for m in r["modules"]})
    return out


def measure_compiled(ckpt=None):
    """torchtune's `compile=True`: `training.compile_model` (each `TransformerSelfAttentionLayer` `.compile()`) and
    `training.compile_loss` (`CEWithChunkedOutputLoss.compute_cross_entropy = torch.compile(...)`), Inductor on the
    CPU; with `ckpt`, torchtune's `set_activation_checkpointing` after compiling (lora_finetune_single_device's order).
    measure_recipes.py's `measure_compile` machinery: saved tensors from the autograd graph after a compiled forward
    (`CompiledFunctionBackward.saved_tensors`, producers from the partitioner's forward graph), the step's peak from
    torch.profiler memory events. The NF4 inner tensors (flattened into the compiled graphs' inputs) are parameter
    storages: listed beside the buffers (`model.buffers`), never saved, and pre-existing as `buffer`, their bytes
    (`nf4_bytes`) moved to `nf4` in the record."""
    import measure_recipes as R
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    R.GRAPHS.clear()
    gc.collect()
    R.install_partition_spy()
    model = build(64, torch.bfloat16)
    cfg = measure.config_dict(model)
    ids = measure.make_ids(model, R.B, R.S)
    inner = inner_tensors(model)
    own_buffers = model.buffers
    model.buffers = lambda recurse=True: [*own_buffers(recurse), *inner]
    layers = list(model.model.layers)
    ranges = R.SeqRanges(model, opaque=layers)
    for m in reversed(layers):  # training.compile_model
        m.compile()
    model.loss_fn.compute_cross_entropy = torch.compile(model.loss_fn.compute_cross_entropy)  # compile_loss
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    entries, logits_info, extra, saved_bytes, compile_s, counters_1 = R.compile_then_read_saved(model, opt, ids, ranges)
    state = step_tracker.optimizer_state_tensors(opt)
    pre = R.classify_preexisting(model, state, ids)
    del state
    lay = layout(model)
    nf4_bytes = sum(r["count"] * r["total_bytes"] for r in lay)
    # classify_preexisting counts an NF4 weight's `quantized_data` as its parameter storage and the other inner
    # tensors as buffers (listed above): both moved to `nf4`, each storage once
    ws = [p if isinstance(p, NF4Tensor) else p.data for p in nf4_weights(model)]
    codes = {t.quantized_data.untyped_storage().data_ptr(): t.quantized_data.untyped_storage().nbytes() for t in ws}
    rest = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in inner}
    rest = {k: v for k, v in rest.items() if k not in codes}
    pre["parameter"] -= sum(codes.values())
    pre["buffer"] -= sum(rest.values())
    pre["nf4"] = sum(codes.values()) + sum(rest.values())
    prof, evs = R.run_step_profiled(model, opt, ids)
    trace = prof.pop("_trace")
    counters_2 = R.dynamo_counters()
    if counters_2["unique_graphs"] != counters_1["unique_graphs"]:
        raise SystemExit(f"recompiled during the profiled step {counters_1} -> {counters_2}")
    regions = []
    for aot_id, r in sorted(extra["regions"].items()):
        g = R.GRAPHS.get(aot_id, {})
        saved, recomputed = g.get("analysis", (None, None))
        fw_ops, bw_ops = {}, {}
        for key, ops in (("fw", fw_ops), ("bw", bw_ops)):
            for n in (g[key].graph.nodes if g else []):
                if n.op == "call_function":
                    ops[R._target_name(n)] = ops.get(R._target_name(n), 0) + 1
        regions.append({"aot_id": aot_id, "module": r["module"], "calls": r["nodes"],
                        "fw_graph_ops": dict(sorted(fw_ops.items())), "bw_graph_ops": dict(sorted(bw_ops.items())),
                        "saved_values": saved, "recomputed_in_backward": recomputed})
    step = R.step_from_profile(prof, pre)
    step["nf4_bytes"] = nf4_bytes
    step["compiled_constant_bytes"] = pre.get("other", 0)
    # the largest allocations of the step by innermost op (a dequantization intermediate would show here)
    by_op: dict = {}
    for sz, ph, op, ws in trace["events"]:
        if sz > 0:
            k = f"{trace['phases'][ph] if ph is not None else None}:{trace['ops'][op]}"
            cur = by_op.setdefault(k, {"allocations": 0, "bytes": 0, "max_bytes": 0})
            cur["allocations"] += 1
            cur["bytes"] += sz
            cur["max_bytes"] = max(cur["max_bytes"], sz)
    step["allocations_by_op"] = dict(sorted(by_op.items(), key=lambda kv: -kv[1]["max_bytes"]))
    # every allocation size of each phase, with its count: the bf16 weights are 32,768 B (128×128) and 65,536 B
    # (128×256); eager's int64 codes of a 128×256 weight would be 131,072 B, its bf16 halves 32,768 B
    sizes: dict = {}
    for sz, ph, op, ws in trace["events"]:
        if sz > 0:
            d = sizes.setdefault(trace["phases"][ph] if ph is not None else "none", {})
            d[str(sz)] = d.get(str(sz), 0) + 1
    step["allocation_sizes_by_phase"] = {k: dict(sorted(v.items(), key=lambda kv: -int(kv[0])))
                                         for k, v in sizes.items()}
    tag = "ckpt1" if ckpt else "ckpt0"
    rec = {"id": f"torchtune-llama3-qlora/b{R.B}/s{R.S}/bf16/sdpa/{tag}/compile=layer",
           "family": "torchtune-llama3-qlora", "config_key": "torchtune-llama3-qlora/bf16", "batch": R.B, "seq": R.S,
           "dtype": "bf16", "attn": "sdpa", "checkpointing": bool(ckpt), "checkpoint_mode": ckpt, "framework": "torchtune",
           "framework_version": "0.6.1",
           "recipe": {"compile": True, "compile_regions": "layer", "compiled_loss": True},
           # checkpointed: reading `saved_tensors` through the checkpoint's unpack hook recomputes the layer, so
           # what the graph lists is the recomputed forward's set (alive in the layer's backward), not what forward
           # kept; the step's `live_after_forward` is that
           "saved_bytes": None if ckpt else saved_bytes,
           "recomputed_saved_bytes" if ckpt else "graph_saved_bytes": saved_bytes,
           "saved_storages": len(entries), "logits": logits_info,
           "saved_parameter_storages": extra["saved_parameter_storages"],
           "saved_buffer_storages": extra["saved_buffer_storages"], "dynamo": counters_2, "compile_s": compile_s,
           "regions": regions, "step": step, "step_method": "torch.profiler memory events (CPU allocator)",
           "nf4": {"torchao": torchao.__version__, "lora": LORA, "nf4_bytes": nf4_bytes},
           "saved": R.aggregate_rows(entries)}
    ranges.remove()
    del model, opt
    torch._dynamo.reset()
    R.GRAPHS.clear()
    gc.collect()
    return rec, cfg


def main_compiled(ckpts):
    """Writes tests/fixtures/pytorch/torchao_nf4/compile.json."""
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    records, configs = [], {}
    for ckpt in ckpts:
        t0 = time.time()
        rec, cfg = measure_compiled(ckpt)
        configs[rec["config_key"]] = dict(cfg, framework="torchtune")
        records.append(rec)
        st = rec["step"]
        print(f"{rec['id']}: saved {rec['saved_bytes']} step peak {st['measured_peak_bytes']} tensors "
              f"{st['tensors_measured_peak_bytes']} ({st['peak_phase']} {st['peak_stack']}) dynamo {rec['dynamo']} "
              f"{time.time() - t0:.1f}s", file=sys.stderr, flush=True)
    doc = {"generated_by": "validation/measure_torchao_nf4.py --compile (torchtune QLoRA on torchao NF4Tensor, "
                           "compile=layer)",
           "torch": torch.__version__.split("+")[0], "torchtune": "0.6.1", "torchao": torchao.__version__,
           "device": "cpu", "seeds": {"model": measure.MODEL_SEED, "data": measure.DATA_SEED}, "configs": configs,
           "records": records}
    with open(os.path.join(OUT, "compile.json"), "w") as f:
        f.write(measure.dump(doc))


def main():
    if "--compile" in sys.argv:
        return main_compiled([None] + (["non_reentrant"] if "--ckpt" in sys.argv else []))
    torch.set_num_threads(1)
    measure.build_model = lambda family, dtype, attn, dropout, experts_impl: build(64, torch.bfloat16)
    os.makedirs(OUT, exist_ok=True)
    records, configs = [], {}
    for ckpt in (None, "non_reentrant"):
        t0 = time.time()
        spec = {"family": "torchtune-llama3-qlora", "batch": 2, "seq": 64, "dtype": "bf16", "attn": "sdpa",
                "checkpoint_mode": ckpt, "dropout": 0.0, "extra": False}
        rec, cfg, _, _ = measure.measure(spec)
        model = build(64, torch.bfloat16)
        lay = layout(model)
        trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        frozen = sum(p.numel() * p.element_size() for p in model.parameters()
                     if not p.requires_grad and not isinstance(p, NF4Tensor))
        rec["framework"] = "torchtune"
        rec["framework_version"] = "0.6.1"
        rec["config_key"] = "torchtune-llama3-qlora/bf16"
        rec["nf4"] = {"torchao": torchao.__version__, "lora": LORA, "layout": lay,
                      "nf4_bytes": sum(r["count"] * r["total_bytes"] for r in lay),
                      "tracked_nf4_bytes": rec["step"].get("preexisting", {}).get("nf4"),
                      "trainable_parameter_bytes": trainable, "frozen_unquantized_parameter_bytes": frozen}
        del model
        MODELS.clear()
        gc.collect()
        configs[rec["config_key"]] = dict(cfg, framework="torchtune")
        records.append(rec)
        st = rec["step"]
        print(f"{rec['id']}: saved {rec['saved_bytes']} step peak {st['measured_peak_bytes']} ({st['peak_phase']} "
              f"{st['peak_op']} {st['peak_module']}) checks {st['checks']} {time.time() - t0:.1f}s",
              file=sys.stderr, flush=True)
    doc = {"generated_by": "validation/measure_torchao_nf4.py (torchtune QLoRA on torchao NF4Tensor)",
           "torch": torch.__version__.split("+")[0], "torchtune": "0.6.1", "torchao": torchao.__version__,
           "device": "cpu", "seeds": {"model": measure.MODEL_SEED, "data": measure.DATA_SEED}, "configs": configs,
           "records": records}
    with open(os.path.join(OUT, "records.json"), "w") as f:
        f.write(measure.dump(doc))


if __name__ == "__main__":
    main()
