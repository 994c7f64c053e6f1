#!/usr/bin/env python3
"""FSDP2's units beyond the decoder layers (validation/README.md "Against published GPU runs" item 5).

Two CPU ranks over gloo (as measure_fp8.py's ``--fsdp2`` records) train torchtitan 0.2.2's own Llama 3 model
(``torchtitan.models.llama3.model.model.Transformer``, imported as measure_frameworks.py imports it) at a tiny size
with a vocabulary large against the layers (dim 64, 2 layers, vocab 4096: the output weight is 4.3 decoder layers'
worth of parameters, as Llama 3 8B's 128K-vocabulary head is 2.4), fp32 parameters, ``MixedPrecisionPolicy(
param_dtype=bf16, reduce_dtype=fp32)``, AdamW, b2 s64, torchtitan's ``cross_entropy_loss``. Layouts:

* ``torchtitan``: torchtitan 0.2.2's ``apply_fsdp`` itself (llama3/infra/parallelize.py, policy "default", no PP):
  ``tok_embeddings`` a unit (resharded after forward), each block a unit (resharded), ``[norm, output]`` a unit NOT
  resharded after forward, then ``fully_shard(model)`` (a root without parameters of its own);
* ``root-default``: each block a unit, then ``fully_shard(model)`` with ``reshard_after_forward`` left unset (the root
  holds tok_embeddings, norm and output; FSDP2's ``_lazy_init`` turns the root's resharding after forward off);
* ``root-reshard``: the same with ``fully_shard(model, reshard_after_forward=True)`` explicitly (torchtitan 9dec370's
  explicit call of late 2024; torch 2.15 keeps the explicit ``True``);
* ``titan-2412``: torchtitan's layout of late 2024 (``parallelize_llama.py apply_fsdp``: each block resharded after
  forward except the last, ``reshard_after_forward = int(layer_id) < len(model.layers) - 1``, then ``fully_shard(model,
  reshard_after_forward=not pp_enabled)``) as the torch of that time ran it: its ``_lazy_init`` cleared the root's
  ``post_forward_mesh_info`` whatever was passed (the ``_auto_reshard_after_forward`` condition came later), which on
  torch 2.15 is the root with ``reshard_after_forward`` unset.

``python measure_fsdp.py LAYOUT ...`` measures some layouts and merges them into the fixture by id.

Step 2 of each run is profiled on rank 0 with ``torch.profiler`` (``profile_memory=True``): every CPU allocator
allocation and free (storage ``resize_`` included, which is how FSDP2 frees and re-allocates unsharded parameters),
each attributed to the innermost ``FSDP::...`` region (FSDP2's own ``record_function`` labels carry the unit's fqn)
and the phase (forward / loss / backward / optimizer / zero_grad). Each allocation is paired with its free by
address. ``live`` is the running sum from the start of step 2 (memory alive before it, parameters, states, is not
counted); ``peak`` its maximum, with the phase, the FSDP region and the aten op around it. The one adaptation to gloo:
torchtitan's ``disable_fsdp_gradient_division`` makes FSDP2 reduce-scatter with ``PREMUL_SUM`` (factor 1.0), which
gloo lacks; the call is handed ``SUM`` instead (same buffers, same bytes).

Writes tests/fixtures/pytorch/fsdp/units.json. Usage: nice validation/.venv/bin/python validation/measure_fsdp.py
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
OUT = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "pytorch", "fsdp")
DIM, LAYERS, HEADS, KV_HEADS, VOCAB, BATCH, SEQ = 64, 2, 4, 2, 4096, 2, 64
LAYOUTS = ("torchtitan", "root-default", "root-reshard", "titan-2412")


def build(layers=LAYERS):
    """torchtitan 0.2.2's Llama 3 at the tiny size (``layers`` decoder layers), initialised, in train mode; and its
    loss. measure_fsdp_pp.py builds its 4-layer model here too."""
    import measure_frameworks as mf
    titan_model, Args, ce = mf._torchtitan_llama3()
    args = Args(dim=DIM, n_layers=layers, n_heads=HEADS, n_kv_heads=KV_HEADS, vocab_size=VOCAB, max_seq_len=SEQ,
                rope_theta=500000)
    torch.manual_seed(0)
    m = titan_model.Transformer(args)
    with torch.no_grad():
        m.init_weights()
    m.train()
    return m, ce


def wrap(model, layout, mesh):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    if layout == "torchtitan":
        from torchtitan.models.llama3.infra.parallelize import apply_fsdp
        apply_fsdp(model, mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32, pp_enabled=False)
        return
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if layout == "titan-2412":  # the last block kept gathered after forward, the root's resharding off
        for i, block in enumerate(model.layers.values()):
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(model.layers) - 1)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        return
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    if layout == "root-default":
        fully_shard(model, mesh=mesh, mp_policy=mp)
    else:
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=True)


def units(model):
    """Every FSDP unit: fqn, its parameters' unsharded shapes, the bf16 unsharded and fp32 sharded bytes."""
    out = []
    for name, mod in model.named_modules():
        st = getattr(mod, "_get_fsdp_state", None)
        if st is None:
            continue
        pg = mod._get_fsdp_state()._fsdp_param_group
        if pg is None:
            out.append({"unit": name or "<root>", "parameters": [], "unsharded_bf16_bytes": 0})
            continue
        if any(u["unit"] == (pg._module_fqn or "<root>") for u in out):  # [norm, output]: one group, two modules
            continue
        params = [[fp._param_fqn, list(fp._orig_size)] for fp in pg.fsdp_params]
        n = sum(torch.Size(s).numel() for _, s in params)
        out.append({"unit": pg._module_fqn or "<root>", "parameters": params, "numel": n,
                    "unsharded_bf16_bytes": 2 * n, "reshard_after_forward": pg.post_forward_mesh_info is not None})
    return out


def analyse(trace_path, tid):
    ev = json.load(open(trace_path))["traceEvents"]
    spans = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("user_annotation", "cpu_op")]
    mem = sorted((e for e in ev if e.get("name") == "[memory]"), key=lambda e: e["ts"])

    def innermost(ts, pred):
        best = None
        for s in spans:
            if pred(s["name"]) and s["ts"] <= ts <= s["ts"] + s["dur"]:
                if best is None or s["ts"] >= best["ts"]:
                    best = s
        return best

    def around(ts, pred):
        best = innermost(ts, pred)
        return best["name"] if best else None

    def aten_call(ts):
        best = innermost(ts, lambda n: n.startswith("aten::"))
        return (best["name"], best["ts"], best["dur"]) if best else None

    live = peak = 0
    peak_at = None
    allocs, opened = [], {}
    for t, e in enumerate(mem):
        a, ts = e["args"], e["ts"]
        live += a["Bytes"]
        ctx = {"phase": (around(ts, lambda n: n.startswith("phase:")) or "phase:?")[6:],
               "fsdp": around(ts, lambda n: n.startswith("FSDP::")),
               "op": around(ts, lambda n: n.startswith("aten::"))}
        if a["Bytes"] > 0:
            rec = {"t": t, "bytes": a["Bytes"], **ctx, "live_after": live, "freed": None, "call": aten_call(ts)}
            opened[a["Addr"]] = rec
            allocs.append(rec)
            if live > peak:
                peak, peak_at = live, dict(ctx, live=live, t=t)
        else:
            rec = opened.pop(a["Addr"], None)
            if rec is not None:
                rec["freed"] = dict(ctx, t=t)
                # A kernel's workspace: freed inside the very aten call that allocated it, before
                # it returns (the dispatch tracker's convention leaves these out: what ops return).
                rec["workspace"] = rec["call"] is not None and aten_call(ts) == rec["call"]
    at_peak = {}
    for rec in allocs:
        if rec["t"] <= peak_at["t"] and (rec["freed"] is None or rec["freed"]["t"] > peak_at["t"]):
            key = f'{rec["phase"]} | {rec["fsdp"] or rec["op"]}'
            at_peak[key] = at_peak.get(key, 0) + rec["bytes"]
    peak_at["alive"] = at_peak
    for rec in allocs:
        rec.pop("call", None)
        rec.setdefault("workspace", False)
    return allocs, peak, peak_at, live


def tensors_peak(allocs):
    """The step's peak of `allocs` (``analyse``'s) without kernel workspaces (``workspace``: freed inside the aten
    call that allocated them), as the dispatch tracker and the estimator count: (peak, its t)."""
    ev = []
    for a in allocs:
        if a["workspace"]:
            continue
        ev.append((a["t"], a["bytes"]))
        if a["freed"] is not None:
            ev.append((a["freed"]["t"], -a["bytes"]))
    live = peak = 0
    at = None
    for t, b in sorted(ev):
        live += b
        if live > peak:
            peak, at = live, t
    return peak, at


def alive_before(model, opt, *batch):
    """What is alive before a profiled step and outside its running sum: the (sharded) parameters, the optimizer's
    states (step counters included), the model's buffers and the batch tensors, by kind (bytes of each storage; a
    DTensor's local shard)."""
    def nbytes(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.untyped_storage().nbytes()

    return {"params_bytes": sum(nbytes(p) for p in model.parameters()),
            "optimizer_state_bytes": sum(nbytes(v) for st in opt.state.values() for v in st.values()
                                         if torch.is_tensor(v)),
            "buffers_bytes": sum(nbytes(b) for b in model.buffers()),
            "batch_bytes": sum(nbytes(t) for t in batch)}


def profiled(step, trace, keep):
    """Runs `step` under ``torch.profiler`` (memory events on); where `keep` (the rank that reports), its trace read by
    ``analyse``: (allocations, peak, where, live at the end). ``None`` elsewhere."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    if not keep:
        return None
    prof.export_chrome_trace(trace)
    out = analyse(trace, None)
    os.remove(trace)
    return out


def worker(rank, world, port, layout, out_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.profiler import ProfilerActivity, profile, record_function
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    calls, phase = [], {"p": "init", "step": 0}
    ag, rs = dist.all_gather_single, dist.reduce_scatter_single

    def desc(t):
        return [str(t.dtype).replace("torch.", ""), list(t.shape), t.untyped_storage().nbytes()]

    def ag_(out, inp, *a, **kw):
        calls.append(["all_gather", phase["step"], phase["p"], desc(inp), desc(out)])
        return ag(out, inp, *a, **kw)

    def rs_(output, input, *a, **kw):
        calls.append(["reduce_scatter", phase["step"], phase["p"], desc(input), desc(output)])
        op = kw.get("op")
        if op is not None and op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):  # PREMUL_SUM(1.0): gloo has none
            kw["op"] = dist.ReduceOp.SUM
        return rs(output, input, *a, **kw)

    dist.all_gather_single, dist.reduce_scatter_single = ag_, rs_
    model, ce = build()
    mesh = init_device_mesh("cpu", (world,))
    wrap(model, layout, mesh)
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    trace = out_path + f".trace{rank}.json"

    def step(n):
        phase["step"] = n
        with record_function("phase:forward"):
            phase["p"] = "forward"
            pred = model(ids)
        with record_function("phase:loss"):
            phase["p"] = "loss"
            loss = ce(pred, labels)
            del pred
        with record_function("phase:backward"):
            phase["p"] = "backward"
            loss.backward()
        with record_function("phase:optimizer"):
            phase["p"] = "optimizer"
            opt.step()
        with record_function("phase:zero_grad"):
            phase["p"] = "zero_grad"
            opt.zero_grad(set_to_none=True)

    step(1)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(2)
    if rank == 0:
        prof.export_chrome_trace(trace)
        allocs, peak, peak_at, end = analyse(trace, None)
        os.remove(trace)
        with open(out_path, "w") as f:
            json.dump({"units": units(model), "calls": [c for c in calls if c[1] == 2], "allocations": allocs,
                       "step_peak_bytes": peak, "peak_at": peak_at, "live_at_step_end": end}, f)
    dist.destroy_process_group()


def main():
    import torch.multiprocessing as mp
    import torchtitan
    doc = {"generated_by": "validation/measure_fsdp.py (validation/README.md published item 5; FINDINGS.md §13.1)",
           "torch": torch.__version__.split("+")[0], "torchtitan": torchtitan.__version__ if hasattr(
               torchtitan, "__version__") else "0.2.2", "device": "cpu", "world_size": 2, "backend": "gloo",
           "model": f"torchtitan 0.2.2 llama3 Transformer dim {DIM}, {LAYERS} layers, {HEADS} heads ({KV_HEADS} kv), "
                    f"vocab {VOCAB}; fp32 parameters, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), "
                    f"AdamW foreach, b{BATCH} s{SEQ}, torchtitan cross_entropy_loss; step 2 profiled on rank 0",
           "allocation_fields": "allocation_columns: t (index of the allocator event in the step); bytes; phase / fsdp "
                                "region / aten op at allocation; live_after (bytes allocated since step 2 began, "
                                "still alive); freed_*: t / phase / fsdp region / op at the free (null: alive at "
                                "step end). peak_at.alive: the bytes alive at the peak, by phase | FSDP region "
                                "(or aten op) of their allocation",
           "call_fields": ["collective", "step", "phase", "input [dtype, shape, bytes]", "output [dtype, shape, bytes]"],
           "records": []}
    only = sys.argv[1:] or LAYOUTS
    old = os.path.join(OUT, "units.json")
    if sys.argv[1:] and os.path.exists(old):
        doc["records"] = [r for r in json.load(open(old))["records"] if r["layout"] not in only]
    tmp = tempfile.mkdtemp(prefix="fsdp-units-")
    for layout in only:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        path = os.path.join(tmp, f"{layout}.json")
        mp.spawn(worker, args=(2, port, layout, path), nprocs=2, join=True)
        r = json.load(open(path))
        doc["records"].append({"id": f"llama3-titan/fsdp2-w2/b{BATCH}/s{SEQ}/{layout}", "layout": layout, **r})
        print(layout, "peak", r["step_peak_bytes"], r["peak_at"], file=sys.stderr)
    write(doc)


ALLOC_COLUMNS = ["t", "bytes", "phase", "fsdp", "op", "live_after", "freed_t", "freed_phase", "freed_fsdp", "freed_op",
                 "workspace"]


def compact(a):
    f = a["freed"] or {}
    return [a["t"], a["bytes"], a["phase"], a["fsdp"], a["op"], a["live_after"], f.get("t"), f.get("phase"),
            f.get("fsdp"), f.get("op"), a.get("workspace", False)]


def flat(x) -> bool:
    return not isinstance(x, dict) and (not isinstance(x, list) or all(flat(y) for y in x))


def write_fixture(doc, name):
    """Writes `doc` to tests/fixtures/pytorch/fsdp/`name`, each record's allocations as rows of ALLOC_COLUMNS."""
    doc["allocation_columns"] = ALLOC_COLUMNS
    for r in doc["records"]:
        r["allocations"] = [compact(a) if isinstance(a, dict) else a for a in r["allocations"]]
    with open(os.path.join(OUT, name), "w") as f:
        f.write(dumps(doc) + "\n")


def dumps(x, ind: int = 0) -> str:
    """JSON with one space of indent a level, a list without objects in it on one line."""
    pad, pad1 = " " * ind, " " * (ind + 1)
    if isinstance(x, dict):
        items = [f"{pad1}{json.dumps(k)}: {dumps(v, ind + 1)}" for k, v in x.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}" if items else "{}"
    if isinstance(x, list) and not flat(x):
        return "[\n" + ",\n".join(pad1 + dumps(v, ind + 1) for v in x) + "\n" + pad + "]"
    if isinstance(x, list) and x and all(isinstance(v, list) for v in x):  # rows: one a line
        return "[\n" + ",\n".join(pad1 + json.dumps(v) for v in x) + "\n" + pad + "]"
    return json.dumps(x)


def write(doc):
    """One allocation a line: [t, bytes, phase, fsdp, op, live_after, freed_t, freed_phase, freed_fsdp, freed_op]."""
    os.makedirs(OUT, exist_ok=True)
    write_fixture(doc, "units.json")


if __name__ == "__main__":
    main()
