#!/usr/bin/env python3
"""FP8 training (torchao Float8Linear) on CPU: what each linear allocates, keeps and frees (issue 27).

torch 2.15's ``torch._scaled_mm`` runs on the CPU (float8_e4m3fn / e5m2 in, bf16 out, tensorwise and rowwise
scales), so torchao 0.18's ``convert_to_float8_training`` trains a model here. This script measures, on the tiny
llama-gqa and qwen3 configs of measure.py (pure bf16, sdpa), every recipe torchao 0.18 ships:

* ``none`` (the bf16 baseline, identical to the records/ grid), ``tensorwise``, ``rowwise``, ``rowwise_with_gw_hp``;
* ``force_recompute_fp8_weight_in_bwd`` on/off (``-recompute``) for tensorwise and rowwise;
* activation checkpointing off/on; micro-batch {1, 2} x seq {64, 128};
* ``recompute=op`` (``ckpt-op`` records, for ``none``, ``tensorwise`` and ``rowwise``): torchtitan's per-op
  selective checkpointing around each decoder layer, exactly as measure_recipes.py applies it (its
  ``checkpoint_setup``: ``torchtitan_sac_context_fn`` over ``_get_default_save_ops()`` plus the CPU SDPA kernel, the
  ``recompute=op`` recipe) and measured by its ``measure_checkpoint_recipe`` (the saved tensors with the SAC cache,
  the tracked step), on the converted model. ``sac_ops`` lists, per layer, every op the policy was called with in the
  forward, its decision and its outputs: a ``Float8Linear`` shows up as ``max.default`` (the amaxes) and
  ``mm.default`` (an mm slot of the parity count), never ``_scaled_mm``.

It re-uses measure.py's whole machinery (saved-tensor capture with the graph walk, the two tracked steps of
tracker.py and their self-checks) with two changes:

* the model is converted after it is built (``measure.build_model`` is wrapped): every ``nn.Linear`` except
  ``lm_head`` becomes a ``Float8Linear`` (torchtitan's default ``filter_fqns=["output"]``; the tiny lm_head's 1000
  outputs are not a multiple of 16 either);
* the step tracker is made subclass-aware: an op with a tensor-subclass argument (torchao's ``Float8TrainingTensor``)
  is handed back to the subclass (``NotImplemented``), whose own aten calls on the plain ``_data`` / ``_scale``
  tensors come back through the mode. So the casts' fp32 temporaries, the fp8 copies, the scales, the
  ``.t().contiguous()`` re-layouts inside ``mm`` and ``_scaled_mm``'s output are all seen as separate allocations.

Per record, besides measure.py's fields, ``fp8`` holds the recipe, the cast configs, the converted and the
bf16-kept modules and, for every linear of layer 0 (all layers are alike), its forward call (and checkpoint
recomputation) and its backward node in step 2: the window's transient peak over the live bytes at its start, the
bytes it leaves alive, and (b2 s64 records) every allocation [op, dtype, shape, bytes, freed], freed = ``in-window``
or the phase of the free.

Writes tests/fixtures/pytorch/fp8/records.json and fp8/steps/<id>.json (the full event log of step 2 for b2 s64).

Usage: validation/.venv27/bin/python validation/measure_fp8.py [--only SUBSTRING] [--out DIR]
(the venv needs torch 2.15.0, transformers 5.24.0 and ``pip install --no-deps torchao==0.18.0``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import logging  # noqa: E402

logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
logging.getLogger().setLevel(logging.ERROR)  # torchao warns (root logger) that force_recompute is deprecated

import torch  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import tracker as step_tracker  # noqa: E402

import measure_recipes as recipes  # noqa: E402  (torchtitan's SelectiveAC policy and its measurement)
import torchao  # noqa: E402
from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # noqa: E402
from torchao.float8.float8_linear import Float8Linear  # noqa: E402

OUT = os.path.join(measure.DEFAULT_OUT, "fp8")
FAMILIES = ("llama-gqa", "qwen3")
RECIPES = ("none", "tensorwise", "tensorwise-recompute", "rowwise", "rowwise-recompute", "rowwise_with_gw_hp")
OP_RECIPES = ("none", "tensorwise", "rowwise")  # measured under recompute=op too
CKPT_TAGS = {None: "ckpt0", "non_reentrant": "ckpt1", "op": "ckpt-op"}
FILTER = "lm_head"  # kept in bf16 (torchtitan: filter_fqns=["output"])

CURRENT: dict = {}


def fp8_config(recipe: str):
    if recipe == "none":
        return None
    name, _, rec = recipe.partition("-")
    cfg = Float8LinearConfig.from_recipe_name(name)
    if rec == "recompute":
        import dataclasses
        cfg = dataclasses.replace(cfg, force_recompute_fp8_weight_in_bwd=True)
    return cfg


_orig_build_model = measure.build_model


def build_model_fp8(family, dtype, attn, dropout, experts_impl):
    model = _orig_build_model(family, dtype, attn, dropout, experts_impl)
    cfg = fp8_config(CURRENT["recipe"])
    if cfg is not None:
        convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn.split(".")[-1] != FILTER, config=cfg)
    WINDOWS.attach(model)
    return model


measure.build_model = build_model_fp8


def _is_subclass(t) -> bool:
    return isinstance(t, torch.Tensor) and type(t) not in (torch.Tensor, torch.nn.Parameter)


class Windows:
    """Forward-call and backward-node windows of the Float8Linear modules of layer 0 in the tracked steps."""

    def __init__(self):
        self.tracker = None
        self.rows: list[dict] = []
        self.handles = []

    def attach(self, model):
        for h in self.handles:
            h.remove()
        self.handles = []
        self.rows = []
        for name, m in model.named_modules():
            if isinstance(m, (Float8Linear, torch.nn.Linear)) and ".layers.0." in name:
                self.handles.append(m.register_forward_pre_hook(lambda mod, a, _n=name: self._pre(_n)))
                self.handles.append(m.register_forward_hook(lambda mod, a, o, _n=name: self._post(_n, o)))

    def _open(self, name, kind):
        tr = self.tracker
        if tr is None or tr.current_phase == "idle":
            return None
        w = {"module": name, "kind": kind, "phase": tr.current_phase, "gen": tr._generation,
             "entry_live": tr.live_bytes, "entry_event": len(tr.events)}
        tr.win_peak = tr.live_bytes
        self.rows.append(w)
        return w

    def _close(self, w):
        tr = self.tracker
        if w is None or tr is None or w["gen"] != tr._generation:
            return
        w["peak"] = tr.win_peak
        w["exit_live"] = tr.live_bytes
        w["exit_event"] = len(tr.events)

    def _pre(self, name):
        tr = self.tracker
        kind = "forward" if tr is not None and tr.current_phase == "forward" else "recompute"
        self._cur = self._open(name, kind)

    def _post(self, name, out):
        self._close(self._cur)
        tr = self.tracker
        if tr is None or tr.current_phase != "forward" or out.grad_fn is None:
            return
        node = out.grad_fn
        while "View" in node.name() and node.next_functions and node.next_functions[0][0] is not None:
            node = node.next_functions[0][0]  # plain nn.Linear (baseline): the MmBackward0 under the view
        box = {}
        node.register_prehook(lambda g, _b=box, _n=name: _b.__setitem__("w", self._open(_n, "backward")) or None)
        node.register_hook(lambda gi, go, _b=box: self._close(_b.get("w")) or None)


WINDOWS = Windows()


class Fp8StepTracker(step_tracker.StepTracker):
    """StepTracker that lets tensor subclasses unwrap themselves (their inner aten ops come back through the mode)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.win_peak = 0
        WINDOWS.tracker = self

    def _alloc(self, st, t, op, module, node):
        super()._alloc(st, t, op, module, node)
        if self.live_bytes > self.win_peak:
            self.win_peak = self.live_bytes

    def begin_step(self, classes=None):
        super().begin_step(classes)
        self.win_peak = 0
        WINDOWS.rows = [w for w in WINDOWS.rows if w["gen"] == self._generation]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(_is_subclass(t) for t in tree_flatten((args, kwargs or {}))[0]):
            return NotImplemented
        return super().__torch_dispatch__(func, types, args, kwargs)


step_tracker.StepTracker = Fp8StepTracker

# measure_step() keeps the last tracker's events only inside its summary; keep a handle on the tracker itself.
_orig_track = step_tracker.track_training_steps
LAST = {}


def track_and_keep(model, optimizer, make_batch, steps=2, tracker=None, **kw):
    res = _orig_track(model, optimizer, make_batch, steps=steps, tracker=tracker, **kw)
    LAST["tracker"] = tracker
    LAST["events"] = res["steps"][-1]["events"]
    LAST["windows"] = [dict(w) for w in WINDOWS.rows]
    return res


step_tracker.track_training_steps = track_and_keep


def summarize_windows(events, windows, with_allocs: bool):
    frees = {}
    for e in events:
        if e["ev"] == "free":
            frees[e["alloc"]] = e["phase"]
    out = []
    for w in windows:
        if "exit_event" not in w:
            continue
        allocs = []
        freed_in_window = {e["alloc"] for e in events[w["entry_event"]:w["exit_event"]] if e["ev"] == "free"}
        for i in range(w["entry_event"], w["exit_event"]):
            e = events[i]
            if e["ev"] != "alloc":
                continue
            allocs.append([e["op"], e["dtype"], e["shape"], e["bytes"],
                           "in-window" if i in freed_in_window else frees.get(i, "alive")])
        frees_prev = sum(e["bytes"] for e in events[w["entry_event"]:w["exit_event"]]
                         if e["ev"] == "free" and e["alloc"] < w["entry_event"])
        row = {"module": measure.module_pattern(w["module"]), "kind": w["kind"], "phase": w["phase"],
               "transient_peak": w["peak"] - w["entry_live"], "left_alive": w["exit_live"] - w["entry_live"],
               "freed_from_before": frees_prev, "n_allocs": len(allocs),
               "alloc_bytes": sum(a[3] for a in allocs)}
        if with_allocs:
            row["allocs"] = allocs  # [op, dtype, shape, bytes, freed: in-window | phase of the free | alive]
        out.append(row)
    return out


def cast_configs(model):
    for m in model.modules():
        if isinstance(m, Float8Linear):
            c = m.config
            return {"input": c.cast_config_input.short_str(), "weight": c.cast_config_weight.short_str(),
                    "grad_output": c.cast_config_grad_output.short_str(),
                    "input_for_grad_weight": c.cast_config_input_for_grad_weight.short_str(),
                    "weight_for_grad_input": c.cast_config_weight_for_grad_input.short_str(),
                    "grad_output_for_grad_weight": c.cast_config_grad_output_for_grad_weight.short_str(),
                    "round_scales_to_power_of_2": c.round_scales_to_power_of_2,
                    "force_recompute_fp8_weight_in_bwd": c.force_recompute_fp8_weight_in_bwd,
                    "use_fast_accum": [c.gemm_config_output.use_fast_accum, c.gemm_config_grad_input.use_fast_accum,
                                       c.gemm_config_grad_weight.use_fast_accum],
                    "enable_fsdp_float8_all_gather": c.enable_fsdp_float8_all_gather}
    return None


def specs():
    for family in FAMILIES:
        for recipe in RECIPES:
            for b in (1, 2):
                for s in (64, 128):
                    for ck in (None, "non_reentrant"):
                        yield dict(family=family, batch=b, seq=s, dtype="bf16", attn="sdpa", checkpoint_mode=ck,
                                   dropout=0.0, extra=False, recipe=recipe, log=(b == 2 and s == 64))
    # recompute=op after the rest (the older records keep their order in the file)
    for family in FAMILIES:
        for recipe in OP_RECIPES:
            for b in (1, 2):
                for s in (64, 128):
                    yield dict(family=family, batch=b, seq=s, dtype="bf16", attn="sdpa", checkpoint_mode="op",
                               dropout=0.0, extra=False, recipe=recipe, log=(b == 2 and s == 64))


def record_id(spec) -> str:
    return (f"{spec['family']}/b{spec['batch']}/s{spec['seq']}/bf16/sdpa/{CKPT_TAGS[spec['checkpoint_mode']]}"
            f"/fp8-{spec['recipe']}")


# recompute=op: measure_recipes.measure_checkpoint_recipe runs the step through its own tracked_steps (with this
# module's Fp8StepTracker, patched into tracker.py above); keep step 2's events, the layer-0 windows and what the
# optimizer and the gradients hold (the fields measure.py's records have).
_orig_tracked_steps = recipes.tracked_steps


def tracked_steps_and_keep(model, opt, ids, *a, **kw):
    res = _orig_tracked_steps(model, opt, ids, *a, **kw)
    LAST["events"] = res[-1]["events"]
    LAST["windows"] = [dict(w) for w in WINDOWS.rows]
    state, step = recipes.adamw_state_bytes(opt)
    LAST["adamw"] = {"state_bytes": state, "step_bytes": step}
    LAST["gradient_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return res


recipes.tracked_steps = tracked_steps_and_keep


def measure_op(spec):
    """One recompute=op record: measure_recipes' recipe measurement at this spec's batch and sequence."""
    recipes.B, recipes.S = spec["batch"], spec["seq"]
    recipes.LAST_LOG.clear()
    opts: dict = {}
    rec = recipes.measure_checkpoint_recipe(spec["family"], "bf16", "sdpa", "recompute=op", opts)
    rec.update({"checkpointing": True, "checkpoint_mode": "op", "gradient_bytes": LAST["gradient_bytes"],
                "adamw": LAST["adamw"]})
    log = None
    if spec["log"] and "log" in recipes.LAST_LOG:
        log = {"summary": {k: rec["step"].get(k) for k in ("peak_live_bytes", "measured_peak_bytes", "peak_phase",
                                                            "peak_op", "peak_module", "peak_node")},
               **recipes.LAST_LOG.pop("log")}
    recipes.LAST_LOG.clear()
    return rec, opts.pop("cfg"), log


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--only", default=None)
    ap.add_argument("--fsdp2", action="store_true", help="only the FSDP2 float8 all-gather records (2 CPU ranks)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.fsdp2:
        run_fsdp2(args.out)
        return
    os.makedirs(os.path.join(args.out, "steps"), exist_ok=True)
    records, configs, bad = [], {}, 0
    t_start = time.time()
    # as measure.py: import the model classes once, then move the import-time heap out of the collector's way
    for family in FAMILIES:
        with torch.device("meta"):
            measure.AutoModelForCausalLM.from_config(measure.build_config(family, 0.0))
    gc.collect()
    gc.freeze()
    for spec in specs():
        rid = record_id(spec)
        if args.only and args.only not in rid:
            continue
        CURRENT.clear()
        CURRENT.update(spec)
        t0 = time.time()
        if spec["checkpoint_mode"] == "op":
            rec, cfg, log = measure_op(spec)
        else:
            rec, cfg, _, log = measure.measure(spec)
        rec["id"] = rid
        # the module layout and cast configs of the converted model (a fresh build, not timed)
        model = build_model_fp8(spec["family"], "bf16", "sdpa", 0.0, None)
        conv = sorted({measure.module_pattern(n) for n, m in model.named_modules() if isinstance(m, Float8Linear)})
        kept = sorted({measure.module_pattern(n) for n, m in model.named_modules()
                       if type(m) in (torch.nn.Linear, torch.nn.Embedding) or "Norm" in type(m).__name__})
        rec["fp8"] = {"recipe": spec["recipe"], "torchao": torchao.__version__, "converted_linears": conv,
                      "kept_bf16": kept, "cast_configs": cast_configs(model),
                      "layer0_linears_step2": summarize_windows(LAST["events"], LAST["windows"],
                                                                         spec["log"])}
        del model
        WINDOWS.tracker = None
        LAST.clear()
        gc.collect()
        key = f"{spec['family']}/bfloat16"
        configs[key] = cfg
        rec["config_key"] = key
        if log is not None:
            log["id"] = rid
        bad += not measure.keep_record(records, rec, log, rid, args.out, t0)
    order = {record_id(s): i for i, s in enumerate(specs())}
    head = {"generated_by": "validation/measure_fp8.py (issue 27; see validation/README.md, FINDINGS.md §10)",
            "torch": torch.__version__.split("+")[0], "transformers": measure.transformers.__version__,
            "torchao": torchao.__version__, "device": "cpu", "seeds": {"model": measure.MODEL_SEED,
                                                                       "data": measure.DATA_SEED},
            "filter": f"every nn.Linear except {FILTER}"}
    sys.exit(measure.write_records(args.out, head, configs, records, order, args.only, t_start, bad))




# ----------------------------------------------------------------------------------------------------------------------
# FSDP2 with torchao's float8 all-gather (--fsdp2): two CPU ranks over gloo
# ----------------------------------------------------------------------------------------------------------------------
# gloo has no float8 dtypes ("Invalid scalar type"): the one adaptation is to hand FSDP2's all-gather the same bytes as
# uint8 views. Every call's input and output buffers are recorded (the all-gather input is the rank's shard as FSDP2
# builds it, the output the flat unsharded buffer of the whole parameter group), as are the reduce-scatters.

FSDP2_CASES = (("bf16-allgather", False, False), ("fp8-allgather", True, False), ("fp8-allgather-precompute", True, True))


def _fsdp2_worker(rank: int, world: int, port: int, family: str, case: str, out_path: str):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torchao.float8.fsdp_utils import precompute_float8_dynamic_scale_for_fsdp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    calls: list = []
    phase = {"p": "init", "step": 0}
    f8 = (torch.float8_e4m3fn, torch.float8_e5m2)
    ag, rs = dist.all_gather_single, dist.reduce_scatter_single

    def desc(t):
        return [measure.dtype_name(t.dtype), list(t.shape), t.untyped_storage().nbytes()]

    def ag8(out, inp, group=None, async_op=False):
        calls.append(["all_gather", phase["step"], phase["p"], desc(inp), desc(out)])
        if out.dtype in f8:
            return ag(out.view(torch.uint8), inp.view(torch.uint8), group=group, async_op=async_op)
        return ag(out, inp, group=group, async_op=async_op)

    def rs8(output, input, *a, **kw):
        calls.append(["reduce_scatter", phase["step"], phase["p"], desc(input), desc(output)])
        return rs(output, input, *a, **kw)

    dist.all_gather_single, dist.reduce_scatter_single = ag8, rs8
    _, fp8_ag, precompute = next(c for c in FSDP2_CASES if c[0] == case)
    model = _orig_build_model(family, "fp32", "sdpa", 0.0, None)  # fp32 masters, bf16 compute (mp_policy)
    cfg = Float8LinearConfig(enable_fsdp_float8_all_gather=fp8_ag)
    convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn.split(".")[-1] != FILTER, config=cfg)
    mesh = init_device_mesh("cpu", (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters())
    ids = measure.make_ids(model, 2, 64)
    sharded = {}
    for n, p in model.named_parameters():
        loc = p._local_tensor
        inner = getattr(loc, "_tensor", loc)
        sharded[measure.module_pattern(n)] = [type(loc).__name__, measure.dtype_name(inner.dtype), list(inner.shape)]
    for step in (1, 2):
        phase["step"] = step
        phase["p"] = "forward"
        out = model(input_ids=ids, labels=ids, use_cache=False)
        phase["p"] = "backward"
        out.loss.backward()
        phase["p"] = "optimizer"
        opt.step()
        opt.zero_grad(set_to_none=True)
        if precompute:
            phase["p"] = "precompute"
            precompute_float8_dynamic_scale_for_fsdp(model)
        del out
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"calls": [c for c in calls if c[1] == 2], "sharded_parameters": sharded}, f)
    dist.destroy_process_group()


def run_fsdp2(out_dir: str):
    import socket
    import torch.multiprocessing as mp
    doc = {"generated_by": "validation/measure_fp8.py --fsdp2 (issue 27; FINDINGS.md §10.3)",
           "torch": torch.__version__.split("+")[0], "torchao": torchao.__version__, "device": "cpu",
           "world_size": 2, "backend": "gloo (float8 buffers all-gathered as uint8 views: gloo has no float8 dtype)",
           "model": "llama-gqa and qwen3 tiny, fp32 parameters, MixedPrecisionPolicy(param_dtype=bf16, "
                    "reduce_dtype=fp32), fully_shard per decoder layer + root, b2 s64, AdamW; step 2 recorded",
           "call_fields": ["collective", "step", "phase", "input [dtype, shape, bytes]", "output [dtype, shape, bytes]"],
           "records": []}
    tmp = tempfile.mkdtemp(prefix="m27-fsdp2-")
    for family in FAMILIES:
        for case, _, _ in FSDP2_CASES:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
            path = os.path.join(tmp, "r.json")
            mp.spawn(_fsdp2_worker, args=(2, port, family, case, path), nprocs=2, join=True)
            r = json.load(open(path))
            doc["records"].append({"id": f"{family}/fsdp2-w2/b2/s64/{case}", "family": family, "case": case, **r})
            ag = [c for c in r["calls"] if c[0] == "all_gather"]
            print(f"{family} {case}: {len(ag)} all-gathers, output bytes {[c[4][2] for c in ag]}", file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)
    with open(os.path.join(out_dir, "fsdp2_allgather.json"), "w") as f:
        f.write(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
