#!/usr/bin/env python3
"""torchtitan's FSDP2 under pipeline parallelism (validation/README.md "Against published GPU runs" item 5b).

Four CPU ranks over gloo, a 2 × 2 mesh (``pp`` 2 × ``dp_shard`` 2), train torchtitan 0.2.2's own Llama 3 model (as
measure_fsdp.py builds it: dim 64, vocabulary 4096, here 4 layers) split into two pipeline stages as torchtitan's
``distributed/pipeline_parallel.py pipeline_module_split`` splits it (a deep copy of the whole model per stage, the
modules of other stages deleted or set to ``None``: stage 0 ``tok_embeddings, layers.0, layers.1``, stage 1 ``layers.2,
layers.3, norm, output``), each stage wrapped by torchtitan 0.2.2's own ``apply_fsdp(..., pp_enabled=True)`` over its
``dp_shard`` group (policy "default": ``reshard_after_forward = not pp_enabled`` for the embedding and the blocks, the
``[norm, output]`` unit not resharded, the root) and driven by torch's ``PipelineStage`` and ``Schedule1F1B`` (the
schedule torchtitan defaults to), whose ``backward_maybe_with_nosync`` sets ``set_reshard_after_backward(False)`` and
``set_requires_gradient_sync(False)`` for every micro-batch and whose ``perform_reduce_grad`` reduce-scatters once after
the last (torch 2.15 ``distributed/pipelining/stage.py``). fp32 parameters, ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)``, AdamW foreach, micro-batch 2 × 64 tokens, torchtitan's ``cross_entropy_loss``.

Step 2 is profiled on rank 0 (stage 0) and rank 2 (stage 1) with ``torch.profiler`` (``profile_memory=True``), as
measure_fsdp.py does: every allocation is attributed to the innermost ``FSDP::`` region and aten op, ``live`` is the
running sum from the start of step 2; what was alive before it (the sharded fp32 parameters, AdamW's states and step
counters, the buffers, the local batch) is recorded beside it, ``measured_peak_bytes`` the sum. Records: 2 and
4 micro-batches (under 1F1B stage 0 runs 2 forwards before its first backward; with 4 micro-batches a forward comes
between the backwards).

``--interleaved``: torch's ``ScheduleInterleaved1F1B`` (torchtitan's "Interleaved1F1B"), two stages per rank as
torchtitan 0.2.2 defaults for a multi-stage schedule (``pipeline_parallel.py pipeline_llm``: ``stages_per_rank = 2``),
an 8-layer model split into 4 stages by torchtitan's own ``generate_llm_fqn_per_model_part(4, 8)`` (the embedding and
``[norm, output]`` weighted as one layer each: ``tok_embeddings, layers.0-1 | layers.2-4 | layers.5-6 | layers.7, norm,
output``; rank 0 holds stages 0 and 2, rank 1 stages 1 and 3: four layers each), each model part wrapped by
``apply_fsdp(pp_enabled=True)``, AdamW foreach per model part (torchtitan's ``OptimizersContainer``), the schedule built
as ``build_pipeline_schedule`` builds it (``scale_grads=False``); 2, 4 and 8 micro-batches (its warmup, torch 2.15
``schedules.py _get_warmup_ops``: ``min((stages per rank - 1) x micro-batches per round + 2 (pp - 1 - rank), micro-batches
x stages per rank)``). Writes tests/fixtures/pytorch/fsdp/pp_interleaved.json.

Writes tests/fixtures/pytorch/fsdp/pp.json. Usage: PYTHONPATH=<torchtitan 0.2.2 --no-deps target> nice
validation/.venv/bin/python validation/measure_fsdp_pp.py [--interleaved]
"""

from __future__ import annotations

import copy
import json
import os
import socket
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
OUT = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "pytorch", "fsdp")
DIM, LAYERS, HEADS, KV_HEADS, VOCAB, BATCH, SEQ = 64, 4, 4, 2, 4096, 2, 64
PP, DP = 2, 2
STAGES = [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3", "norm", "output"]]
I_LAYERS, I_STAGES_PER_RANK = 8, 2


def split(whole, keep):
    """torchtitan 0.2.2 pipeline_module_split's _build_stage_from_modules: a deep copy, other stages' modules gone."""
    model = copy.deepcopy(whole)
    keep = set(keep)
    for name, mod in list(model.named_children()):
        if isinstance(mod, torch.nn.ModuleDict):
            layers = {n.split(".", 1)[1] for n in keep if n.startswith(f"{name}.")}
            for k in list(mod.keys()):
                if k not in layers:
                    del mod[k]
        elif name not in keep:
            setattr(model, name, None)
    return model


def mesh_of(rank, world, port):
    """Joins the gloo group and returns the (pp, dp_shard) mesh. FSDP2's reduce-scatter with ``PREMUL_SUM`` (factor
    1.0: torchtitan's ``disable_fsdp_gradient_division``), which gloo lacks, is handed ``SUM`` (same buffers, same
    bytes), as measure_fsdp.py does."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rs = dist.reduce_scatter_single

    def rs_(output, input, *a, **kw):
        op = kw.get("op")
        if op is not None and op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            kw["op"] = dist.ReduceOp.SUM
        return rs(output, input, *a, **kw)

    dist.reduce_scatter_single = rs_
    return init_device_mesh("cpu", (PP, DP), mesh_dim_names=("pp", "dp_shard"))


def local_batch(micro):
    """The local batch of `micro` micro-batches (token ids and labels), the same on every rank."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH * micro, SEQ), generator=g)
    return ids, torch.randint(0, VOCAB, (BATCH * micro, SEQ), generator=g)


def titan_split():
    """torchtitan 0.2.2's own ``generate_llm_fqn_per_model_part`` (distributed/pipeline_parallel.py), its source taken
    from the installed file and run alone: importing the module pulls the data loader (torchdata), which no measured
    code needs."""
    import ast
    import importlib.util
    path = os.path.join(os.path.dirname(importlib.util.find_spec("torchtitan").origin), "distributed",
                        "pipeline_parallel.py")
    tree = ast.parse(open(path).read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "generate_llm_fqn_per_model_part")
    scope = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), scope)
    return scope["generate_llm_fqn_per_model_part"]


def interleaved_worker(rank, world, port, micro, out_path):
    """One rank of ``--interleaved``: its two model parts, each a ``PipelineStage`` under ``ScheduleInterleaved1F1B``."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B
    from torch.profiler import record_function
    import measure_fsdp as mfs
    mesh = mesh_of(rank, world, port)
    whole, ce = mfs.build(I_LAYERS)  # enters torchtitan's packages by path (measure_frameworks.py)
    from torchtitan.models.llama3.infra.parallelize import apply_fsdp
    pp_rank = mesh["pp"].get_local_rank()
    n_stages = PP * I_STAGES_PER_RANK
    fqns = titan_split()(n_stages, I_LAYERS)
    hidden = torch.empty(BATCH, SEQ, DIM, dtype=torch.bfloat16, requires_grad=True)
    tokens = torch.empty(BATCH, SEQ, dtype=torch.long)
    logits = torch.empty(BATCH, SEQ, VOCAB, dtype=torch.bfloat16)
    parts, stages = [], []
    for k in range(I_STAGES_PER_RANK):
        idx = pp_rank + k * PP  # torchtitan's "loop" style: rank r holds stages r, r + pp, ...
        part = split(whole, fqns[idx])
        apply_fsdp(part, mesh["dp_shard"], param_dtype=torch.bfloat16, reduce_dtype=torch.float32, pp_enabled=True)
        io = (tokens if idx == 0 else hidden, logits if idx == n_stages - 1 else hidden)
        stages.append(PipelineStage(part, idx, n_stages, torch.device("cpu"), input_args=io[0], output_args=io[1],
                                    group=mesh.get_group("pp")))
        parts.append(part)
    del whole
    sched = ScheduleInterleaved1F1B(stages, n_microbatches=micro, loss_fn=ce, scale_grads=False)
    opts = [torch.optim.AdamW(p.parameters(), foreach=True) for p in parts]
    ids, labels = local_batch(micro)
    trace = out_path + f".trace{rank}.json"

    def step():
        with record_function("phase:pipeline"):
            if pp_rank == 0:
                sched.step(ids, target=None, losses=None, return_outputs=False)
            else:  # holds the last stage
                sched.step(target=labels, losses=[], return_outputs=False)
        with record_function("phase:optimizer"):
            for o in opts:
                o.step()
        with record_function("phase:zero_grad"):
            for o in opts:
                o.zero_grad(set_to_none=True)

    step()

    class Parts(torch.nn.Module):  # alive_before and units over both model parts
        def __init__(self):
            super().__init__()
            self.parts = torch.nn.ModuleList(parts)

    both = Parts()

    class Opt:
        state = {k: v for o in opts for k, v in o.state.items()}

    before = mfs.alive_before(both, Opt, ids, labels)
    seen = mfs.profiled(step, trace, rank % DP == 0)
    if seen is not None:
        allocs, peak, peak_at, end = seen
        with open(out_path + f".{pp_rank}", "w") as f:
            json.dump({"pp_rank": pp_rank, "stages": [pp_rank + k * PP for k in range(I_STAGES_PER_RANK)],
                       "stage_modules": [fqns[pp_rank + k * PP] for k in range(I_STAGES_PER_RANK)],
                       "units": [u for p in parts for u in mfs.units(p)],
                       "stage_numel": sum(p.numel() for p in both.parameters()), **before,
                       "measured_peak_bytes": peak + sum(before.values()),
                       "allocations": allocs, "step_peak_bytes": peak, "peak_at": peak_at, "live_at_step_end": end}, f)
    dist.destroy_process_group()


def header(flag, schedule):
    """The fixture's fields every record shares."""
    return {"generated_by": f"validation/measure_fsdp_pp.py{flag} (validation/README.md published item 5b)",
            "torch": torch.__version__.split("+")[0], "torchtitan": "0.2.2", "device": "cpu", "world_size": PP * DP,
            "mesh": {"pp": PP, "dp_shard": DP}, "backend": "gloo", "schedule": schedule}


def interleaved_main():
    doc = {**header(" --interleaved", "ScheduleInterleaved1F1B"), "stages_per_rank": I_STAGES_PER_RANK,
           "model": f"torchtitan 0.2.2 llama3 Transformer dim {DIM}, {I_LAYERS} layers, {HEADS} heads ({KV_HEADS} kv), "
                    f"vocab {VOCAB}, split by generate_llm_fqn_per_model_part({PP * I_STAGES_PER_RANK}, {I_LAYERS}); "
                    f"fp32 parameters, apply_fsdp(pp_enabled=True) per model part with MixedPrecisionPolicy("
                    f"param_dtype=bf16, reduce_dtype=fp32), AdamW foreach per model part, micro-batch b{BATCH} s{SEQ}, "
                    f"torchtitan cross_entropy_loss; step 2 profiled on ranks 0 (pp rank 0) and 2 (pp rank 1)",
           "records": []}
    run_all(doc, interleaved_worker, (2, 4, 8), f"llama3-titan/fsdp2-pp{PP}x{I_STAGES_PER_RANK}-dp{DP}/b{BATCH}/s{SEQ}",
            "rank", "pp_interleaved.json")


def worker(rank, world, port, micro, out_path):
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.profiler import record_function
    import measure_fsdp as mfs
    mesh = mesh_of(rank, world, port)
    whole, ce = mfs.build(LAYERS)
    stage_idx = mesh["pp"].get_local_rank()
    model = split(whole, STAGES[stage_idx])
    del whole
    from torchtitan.models.llama3.infra.parallelize import apply_fsdp
    apply_fsdp(model, mesh["dp_shard"], param_dtype=torch.bfloat16, reduce_dtype=torch.float32, pp_enabled=True)
    # The stage's input and output shapes given (bf16 hidden states between the stages, bf16 logits), as a trainer
    # that knows them may: gloo's object send of the inferred metadata deadlocks on this 2-D mesh.
    hidden = torch.empty(BATCH, SEQ, DIM, dtype=torch.bfloat16, requires_grad=True)
    tokens = torch.empty(BATCH, SEQ, dtype=torch.long)
    logits = torch.empty(BATCH, SEQ, VOCAB, dtype=torch.bfloat16)
    io = [(tokens, hidden), (hidden, logits)][stage_idx]
    stage = PipelineStage(model, stage_idx, PP, torch.device("cpu"), input_args=io[0], output_args=io[1],
                          group=mesh.get_group("pp"))
    sched = Schedule1F1B(stage, n_microbatches=micro, loss_fn=ce)  # on every stage: None turns backward off
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    ids, labels = local_batch(micro)
    trace = out_path + f".trace{rank}.json"

    def step():
        with record_function("phase:pipeline"):
            if stage_idx == 0:
                sched.step(ids, return_outputs=False)
            else:  # torchtitan 0.2.2 train.py: return_outputs=False (the last stage keeps no logits)
                sched.step(target=labels, losses=[], return_outputs=False)
        with record_function("phase:optimizer"):
            opt.step()
        with record_function("phase:zero_grad"):
            opt.zero_grad(set_to_none=True)

    step()

    # Alive before step 2 (not in the profile's running sum): the sharded fp32 parameters, AdamW's
    # states (step counters included), the model's buffers, and the whole local batch.
    before = mfs.alive_before(model, opt, ids, labels)
    seen = mfs.profiled(step, trace, rank % DP == 0)
    if seen is not None:
        allocs, peak, peak_at, end = seen
        stage_params = sum(p.numel() for p in model.parameters())  # DTensors: the unsharded numel
        with open(out_path + f".{stage_idx}", "w") as f:
            json.dump({"stage": stage_idx, "units": mfs.units(model), "stage_numel": stage_params, **before,
                       "measured_peak_bytes": peak + sum(before.values()),
                       "allocations": allocs, "step_peak_bytes": peak, "peak_at": peak_at, "live_at_step_end": end}, f)
    dist.destroy_process_group()


def main():
    doc = {**header("", "Schedule1F1B"),
           "model": f"torchtitan 0.2.2 llama3 Transformer dim {DIM}, {LAYERS} layers, {HEADS} heads ({KV_HEADS} kv), "
                    f"vocab {VOCAB}, split {STAGES}; fp32 parameters, apply_fsdp(pp_enabled=True) with "
                    f"MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), AdamW foreach, micro-batch b{BATCH} "
                    f"s{SEQ}, torchtitan cross_entropy_loss; step 2 profiled on ranks 0 (stage 0) and 2 (stage 1)",
           "records": []}
    run_all(doc, worker, (2, 4), f"llama3-titan/fsdp2-pp{PP}-dp{DP}/b{BATCH}/s{SEQ}", "stage", "pp.json")


def run_all(doc, fn, micro_batches, prefix, per, name):
    """Spawns the PP × DP ranks of `fn` once for each micro-batch count, adds each pipeline rank's record (id
    ``prefix/m<micro>/<per><rank>``) to `doc` and writes it as fixture `name`."""
    import torch.multiprocessing as mp
    import measure_fsdp as mfs
    tmp = tempfile.mkdtemp(prefix="fsdp-pp-")
    for micro in micro_batches:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        path = os.path.join(tmp, f"m{micro}.json")
        mp.spawn(fn, args=(PP * DP, port, micro, path), nprocs=PP * DP, join=True)
        for r in range(PP):
            rec = json.load(open(f"{path}.{r}"))
            doc["records"].append({"id": f"{prefix}/m{micro}/{per}{r}", "micro_batches": micro, **rec})
            print(micro, r, "peak", rec["step_peak_bytes"], json.dumps(rec["peak_at"], indent=1), file=sys.stderr)
    mfs.write_fixture(doc, name)


if __name__ == "__main__":
    interleaved_main() if "--interleaved" in sys.argv[1:] else main()
