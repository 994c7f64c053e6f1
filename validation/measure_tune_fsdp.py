#!/usr/bin/env python3
"""torchtune's distributed recipes: FSDP2 as torchtune 0.6.1 shards its own models (validation/README.md "Against
published GPU runs" item 5c).

Two CPU ranks over gloo (as measure_fsdp.py) train torchtune 0.6.1's own Llama 3.1 (the ``llama3_1`` and
``lora_llama3_1`` component builders, entered by path as measure_frameworks.py enters them) at a tiny size with a
vocabulary large against the layers (dim 64, 2 layers, 4 heads / 2 kv, vocab 4096, b2 s64), in pure bf16 as the
recipes' ``dtype: bf16`` trains (parameters built under ``training.set_default_dtype``, no ``MixedPrecisionPolicy``:
gradients and the reduce-scatter in bf16), with the configs' ``CEWithChunkedOutputLoss`` (8 chunks) and
``torch.optim.AdamW``. The model is prepared exactly as the recipes' ``_setup_model`` prepares it, with torchtune's
own functions:

* ``training.set_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})`` when
  ``enable_activation_checkpointing`` (records ``/ac``);
* ``training.shard_model(model, [partial(training.get_shard_conditions, names_to_match=custom_sharded_layers)],
  cpu_offload=False, reshard_after_forward=True)``: each ``layers.i`` a unit, the ``custom_sharded_layers`` each a
  unit, then ``fully_shard(model, reshard_after_forward=True)``, the root holding what is left.

Layouts (what torchtune 0.6.1's shipped configs set):

* ``full``: ``full_finetune_distributed.py`` with ``custom_sharded_layers: ['tok_embeddings', 'output']`` (every
  ``*_full.yaml`` distributed config of the Llama 3.x families): the root holds the final norm alone;
* ``lora``: ``lora_finetune_distributed.py`` (LoRA on q and v, rank 8, alpha 16; ``set_trainable_params`` on the
  adapters) without ``custom_sharded_layers`` (its ``*_lora.yaml`` configs leave it commented out): the root holds
  the embedding, the final norm and the output projection, gathered in forward, resharded after it, gathered again by
  its pre-backward after the loss backward and kept to the end of backward;
* ``qlora``: ``lora_finetune_distributed.py`` on ``llama3_1/405B_qlora.yaml`` as the README of 2024-09-24 ran it
  (30b8519e): ``lora_llama3_1(..., quantize_base=True)`` (the ``qlora_llama3_1_*`` builders: every decoder linear
  torchao 0.18's ``NF4Tensor``, imported where torchtune imports it as measure_torchao_nf4.py does), LoRA on q, k, v,
  output_proj and the MLP, the output an ``nn.Linear``, ``loss: torch.nn.CrossEntropyLoss`` (the model returns the
  whole fp32 logits, the recipe flattens them); hidden ``QLORA_DIM``, ffn ``QLORA_FFN`` (see there). FSDP2 shards
  each ``NF4Tensor`` through torchao's ``nf4_split`` and gathers it with ``fsdp_pre_all_gather``; ``params_bytes``
  counts each shard's inner tensors.

Steps 2 to 4 of each run are profiled on rank 0 with ``torch.profiler`` (``profile_memory=True``), the one with the
lowest peak kept (gloo's thread frees an all-gather's output late now and then), and read by
measure_fsdp.py's ``analyse`` (every allocation attributed to its FSDP region and aten op, ``live`` the running sum from
the start of step 2); what was alive before it (the sharded bf16 parameters, AdamW's states and step counters, the
buffers, the batch) is recorded beside it, ``measured_peak_bytes`` the sum. ``tensors_measured_peak_bytes`` is the
same without kernel workspaces (an allocation freed inside the aten call that made it: the CPU ``bmm``'s scratch),
the dispatch tracker's convention, which the estimate follows. The one adaptation to a CPU: none needed
(no ``PREMUL_SUM``: torchtune leaves FSDP2's gradient division on, ``AVG``).

Writes tests/fixtures/pytorch/fsdp/tune.json. Usage: PYTHONPATH=<torchtune 0.6.1 + psutil + omegaconf --no-deps
target, torchao 0.18 too for qlora> nice validation/.venv/bin/python validation/measure_tune_fsdp.py [full|lora|qlora]
(naming layouts re-measures those alone and keeps the other records)
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import warnings
from functools import partial

warnings.filterwarnings("ignore")
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
OUT = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "pytorch", "fsdp")
DIM, LAYERS, HEADS, KV_HEADS, FFN, VOCAB, BATCH, SEQ, MAX_SEQ = 64, 2, 4, 2, 256, 4096, 2, 64, 128
# The QLoRA layout's shape: every NF4 weight's half (FSDP2 shards dim 0 over two ranks) must hold whole scaler blocks
# of its quantization factors (torchao's `nf4_split` asserts each inner tensor divides): at block 64 and scaler
# block 256 a weight needs 2 × 64 × 256 elements, so k and v are 128 × 256 at the least.
QLORA_DIM, QLORA_FFN = 256, 512
RANK, ALPHA = 8, 16
WORLD = 2
# (layout, enable_activation_checkpointing, compile)
RUNS = (("full", False, False), ("full", True, False), ("lora", False, False), ("lora", True, False),
        ("full", True, True), ("lora", True, True), ("qlora", False, False), ("qlora", True, False),
        ("qlora", True, True))
CUSTOM_SHARDED = {"full": ["tok_embeddings", "output"], "lora": None, "qlora": None}
# The QLoRA layout is torchtune's `llama3_1/405B_qlora.yaml` at the commit whose README published its memory
# (30b8519e, 2024-09-24): `qlora_llama3_1_*` (`lora_llama3_1(..., quantize_base=True)`) with LoRA on q, k, v and
# output_proj and the MLP, the output projection a FrozenNF4Linear (`apply_lora_to_output: False`), and
# `loss: torch.nn.CrossEntropyLoss` (the model returns `self.output(h).float()` whole; the recipe flattens it).
QLORA_TARGETS = ["q_proj", "k_proj", "v_proj", "output_proj"]


def dims(layout):
    """(hidden, ffn) of a layout's model."""
    return (QLORA_DIM, QLORA_FFN) if layout == "qlora" else (DIM, FFN)


def build(layout):
    """torchtune 0.6.1's Llama 3.1 (``llama3_1`` / ``lora_llama3_1`` on q and v) in bf16 and its chunked loss."""
    if layout == "qlora":  # torchao 0.18's NF4Tensor where torchtune 0.6.1 imports it (as measure_torchao_nf4.py)
        from torchao.quantization import NF4Tensor
        sys.modules["torchao.dtypes.nf4tensor"] = sys.modules[NF4Tensor.__module__]
    import measure_frameworks as F
    F.REAL_NF4 = layout == "qlora"
    F._torchtune_modules()
    from torchtune.modules.loss import CEWithChunkedOutputLoss
    dim, ffn = dims(layout)
    shape = dict(vocab_size=VOCAB, num_layers=LAYERS, num_heads=HEADS, num_kv_heads=KV_HEADS, embed_dim=dim,
                 max_seq_len=MAX_SEQ, intermediate_dim=ffn, rope_base=500000)
    if layout == "full":
        m = F._tune_model(F._torchtune_builder("llama3_1", "llama3_1"), torch.bfloat16, **shape)
    else:
        from torchtune.modules.peft import get_adapter_params, set_trainable_params
        q = layout == "qlora"
        m = F._tune_model(F._torchtune_builder("llama3_1", "lora_llama3_1"), torch.bfloat16,
                          lora_attn_modules=QLORA_TARGETS if q else ["q_proj", "v_proj"], apply_lora_to_mlp=q,
                          apply_lora_to_output=False, lora_rank=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                          quantize_base=q, **shape)
        set_trainable_params(m, get_adapter_params(m))
    if layout == "qlora":
        m.set_num_output_chunks(0)
        m.train()
        return m, torch.nn.CrossEntropyLoss(ignore_index=-100)
    loss = CEWithChunkedOutputLoss(num_output_chunks=8)
    m.set_num_output_chunks(loss.num_output_chunks)
    m.train()
    return m, loss


# Steps profiled after the first (see ``worker``).
PROFILED_STEPS = 3


def worker(rank, world, port, layout, ac, compiled, out_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.profiler import record_function
    import measure_fsdp as mfs
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model, loss_fn = build(layout)
    from torchtune import modules, training
    if compiled:  # the recipes compile first (each layer, `training.compile_model`), then checkpoint, then shard
        training.compile_model(model, verbose=False)
        training.compile_loss(loss_fn, verbose=False)  # the chunked loss's `compute_cross_entropy` alone
    if ac:
        training.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
    mesh = init_device_mesh("cpu", (world,))
    training.shard_model(model=model, shard_conditions=[partial(training.get_shard_conditions,
                                                                names_to_match=CUSTOM_SHARDED[layout])],
                         cpu_offload=False, reshard_after_forward=True, dp_mesh=mesh)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    trace = out_path + f".trace{rank}.json"

    def step():
        with record_function("phase:forward"):
            logits = model(ids)
        with record_function("phase:loss"):
            if isinstance(logits, list):
                loss = loss_fn(logits, labels)
            else:  # `loss: torch.nn.CrossEntropyLoss`: the recipe flattens the fp32 logits and the labels
                loss = loss_fn(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))
            del logits
        with record_function("phase:backward"):
            loss.backward()
        with record_function("phase:optimizer"):
            opt.step()
        with record_function("phase:zero_grad"):
            opt.zero_grad(set_to_none=True)

    step()

    before = mfs.alive_before(model, opt, ids, labels)
    if layout == "qlora":  # an NF4Tensor shard holds its inner tensors (codes, scalers, factors, mean, table)
        before["params_bytes"] = sum(nf4_bytes(p) for p in model.parameters())
    # gloo's worker thread sometimes drops its reference to an all-gather's flat output a little
    # after FSDP2 lets it go, so one profiled step can hold a buffer longer than the program does:
    # of PROFILED_STEPS steps, the one with the lowest peak is kept (the others, by as much as a
    # flat buffer, are that lateness).
    seen = [mfs.profiled(step, trace, rank == 0) for _ in range(PROFILED_STEPS)]
    if rank == 0:
        allocs, peak, peak_at, end = min(seen, key=lambda s: (s[1], mfs.tensors_peak(s[0])[0]))
        tensors, tensors_at = mfs.tensors_peak(allocs)
        with open(out_path, "w") as f:
            json.dump({"units": mfs.units(model), **before, "measured_peak_bytes": peak + sum(before.values()),
                       "tensors_measured_peak_bytes": tensors + sum(before.values()), "tensors_peak_at": tensors_at,
                       "allocations": allocs, "step_peak_bytes": peak, "peak_at": peak_at, "live_at_step_end": end}, f)
    dist.destroy_process_group()


def nf4_bytes(p):
    """Bytes a (sharded) parameter holds: a wrapper subclass's inner tensors' storages (an NF4Tensor's codes,
    scalers, factors, mean and table, as its ``__tensor_flatten__`` names them), else its own."""
    t = p.to_local() if hasattr(p, "to_local") else p
    if type(t) is not torch.Tensor and hasattr(t, "__tensor_flatten__"):
        return sum(getattr(t, a).untyped_storage().nbytes() for a in t.__tensor_flatten__()[0])
    return t.untyped_storage().nbytes()


def main():
    import torch.multiprocessing as mp
    import measure_fsdp as mfs
    only = set(sys.argv[1:])
    doc = {"generated_by": "validation/measure_tune_fsdp.py (validation/README.md published item 5c)",
           "torch": torch.__version__.split("+")[0], "torchtune": "0.6.1", "device": "cpu", "world_size": WORLD,
           "backend": "gloo",
           "model": f"torchtune 0.6.1 llama3_1 / lora_llama3_1 (q, v; rank {RANK}, alpha {ALPHA}) dim {DIM}, {LAYERS} "
                    f"layers, {HEADS} heads ({KV_HEADS} kv), ffn {FFN}, vocab {VOCAB}, bf16 parameters, "
                    f"training.shard_model (reshard_after_forward=True), CEWithChunkedOutputLoss(8), AdamW foreach, "
                    f"b{BATCH} s{SEQ}; steps 2 to 4 profiled on rank 0, the lowest peak kept",
           "records": []}
    tmp = tempfile.mkdtemp(prefix="tune-fsdp-")
    for layout, ac, compiled in RUNS:
        rid = f"llama3-tune/fsdp2-w{WORLD}/{layout}/b{BATCH}/s{SEQ}" + ("/ac" if ac else "") + ("/compile" if compiled else "")
        if only and layout not in only:
            continue
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        path = os.path.join(tmp, f"{layout}{int(ac)}{int(compiled)}.json")
        mp.spawn(worker, args=(WORLD, port, layout, ac, compiled, path), nprocs=WORLD, join=True)
        r = json.load(open(path))
        dim, ffn = dims(layout)
        doc["records"].append({"id": rid, "layout": layout, "hidden": dim, "ffn": ffn, "activation_checkpointing": ac, "compile": compiled,
                               "custom_sharded_layers": CUSTOM_SHARDED[layout], **r})
        print(rid, "peak", r["step_peak_bytes"], "measured", r["measured_peak_bytes"],
              json.dumps(r["peak_at"], indent=1), file=sys.stderr)
    if only:  # the layouts not re-measured keep their records
        path = os.path.join(OUT, "tune.json")
        kept = [r for r in json.load(open(path))["records"] if r["layout"] not in only] if os.path.exists(path) else []
        doc["records"] = sorted(kept + doc["records"], key=lambda r: [x[0] for x in RUNS].index(r["layout"]))
    mfs.write_fixture(doc, "tune.json")


if __name__ == "__main__":
    main()
