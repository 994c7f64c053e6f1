#!/usr/bin/env python3
"""FSDP2's float8 all-gather under torchtitan's compile, on two CPU ranks over gloo: the estimator's
`framework = torchtitan`, `compile = true`, `fp8 = torchao-tensorwise`, `fp8_allgather = true`, `zero = full_shard`.

What torchtitan 0.2.2 does, and what is called here, in its order (models/llama3/infra/parallelize.py
`parallelize_llama`, components/quantization/float8.py `Float8LinearConverter`):

* the converter on the built model (fp32 parameters): `convert_to_float8_training(model, config=Float8LinearConfig(
  enable_fsdp_float8_all_gather=True), module_filter_fn=...)` (tensorwise, its non-recipe branch, which is the one
  that takes `enable_fsdp_float8_all_gather`; the filter as measure_titan_compile.py's: every linear whose dims are
  multiples of 16, the tiny LM head's 1000 outputs are not);
* `apply_ac` (recompute none, full or op), then `apply_compile` (each TransformerBlock, `fullgraph=True`), the loss
  compiled (`compile.components = ["model", "loss"]`): measure_titan_compile.py's `titan_parallelize`;
* `apply_fsdp` (param_dtype bf16, reduce_dtype fp32, policy "default": blocks and tok_embeddings resharded after
  forward, [norm, output] not, then the root) — torchtitan's own function;
* `precompute_float8_dynamic_scale_for_fsdp` after each optimizer step when `precompute_float8_dynamic_scale_for_fsdp`
  is set (the converter's `post_optimizer_hook`, registered by train.py as an optimizer step post hook): the
  `+precompute` records;
* AdamW foreach (torchtitan's `build_optimizers`: `foreach = not fused`).

The model is measure_frameworks.py's tiny torchtitan Llama 3 (dim 64, 2 layers, vocab 1000: the
torchtitan-llama3-compile-fp8.json records' model), b2 s64. The measurement is measure_titan_compile.py's on each
rank (measure_recipes.py `compile_then_read_saved`: saved tensors read from the autograd graph after a compiled
forward; `profiled_compiled_step`: the step's peak from torch.profiler memory events), rank 0 written. A saved tensor
whose storage is an FSDP unsharded parameter (the float8 weight FSDP2 all-gathered: resized to 0 bytes after
forward, all-gathered again in backward) is a parameter storage (`saved_parameter_storages`, with the local shards),
not counted in saved bytes; any other 0-byte storage is left out too and counted in `saved_fsdp_storages` (0 in
every record);
the pre-existing parameters are the ranks' local shards.

Two adaptations to gloo (as measure_fp8.py --fsdp2 and measure_fsdp.py): float8 buffers are all-gathered as uint8
views (gloo has no float8 dtype), and the reduce-scatter's PREMUL_SUM (torchtitan's `disable_fsdp_gradient_division`
factor 1.0) is handed SUM (same buffers). Every collective's buffers are recorded (`calls`, step 2).

Writes tests/fixtures/pytorch/frameworks/torchtitan-llama3-fsdp2-compile-fp8.json ({configs, records}).

Usage:  nice validation/.venv/bin/python validation/measure_titan_fsdp_fp8.py [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import measure_titan_compile as TC  # noqa: E402
import torch  # noqa: E402

R, M, F = TC.R, TC.M, TC.F
WORLD = 2
CASES = [(rc, pre) for rc in ("none", "full", "op") for pre in (False, True)]
NAME = "torchtitan-llama3-fsdp2-compile-fp8"


class _Local:
    """The model as the pre-existing scan sees it: its parameters are the ranks' local shards."""

    def __init__(self, model):
        self.m = model

    def parameters(self):
        # a float8 weight's shard is torchao's WeightWithDynamicFloat8CastTensor around the plain `_tensor`
        out = []
        for p in self.m.parameters():
            t = getattr(p, "_local_tensor", p)
            out.append(getattr(t, "_tensor", t))
        return out

    def buffers(self):
        return self.m.buffers()


class _Gathered(_Local):
    """The model as compiled_saved reads it: called as the model, its parameters the local shards and every FSDP
    unsharded parameter (a float8 one's `_data`), so that a saved tensor on any of them counts as a parameter."""

    def __call__(self, *a, **kw):
        return self.m(*a, **kw)

    def parameters(self):
        out = list(super().parameters())
        for mod in self.m.modules():
            if getattr(mod, "_get_fsdp_state", None) is None:
                continue
            pg = mod._get_fsdp_state()._fsdp_param_group
            for fp in (pg.fsdp_params if pg is not None else []):
                t = getattr(fp, "_unsharded_param", None)
                if t is None:
                    continue
                t = getattr(t, "_data", t)
                try:
                    t.untyped_storage().data_ptr()
                except (RuntimeError, NotImplementedError, TypeError):
                    continue
                out.append(t)
        return out


def worker(rank: int, world: int, port: int, recompute: str, precompute: bool, out_path: str, out_dir: str):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp
    from torchao.float8.float8_linear import Float8Linear
    from torchtitan.components.quantization.utils import module_filter_fn
    from functools import partial

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    calls, phase = [], {"step": 0}
    f8 = (torch.float8_e4m3fn, torch.float8_e5m2)
    ag, rs = dist.all_gather_single, dist.reduce_scatter_single

    def desc(t):
        return [M.dtype_name(t.dtype), list(t.shape), t.untyped_storage().nbytes()]

    def ag8(out, inp, *a, **kw):
        calls.append(["all_gather", phase["step"], desc(inp), desc(out)])
        if out.dtype in f8:
            return ag(out.view(torch.uint8), inp.view(torch.uint8), *a, **kw)
        return ag(out, inp, *a, **kw)

    def rs_(output, input, *a, **kw):
        calls.append(["reduce_scatter", phase["step"], desc(input), desc(output)])
        op = kw.get("op")
        if op is not None and op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):  # PREMUL_SUM(1.0): gloo has none
            kw["op"] = dist.ReduceOp.SUM
        return rs(output, input, *a, **kw)

    dist.all_gather_single, dist.reduce_scatter_single = ag8, rs_

    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    R.GRAPHS.clear()
    R.install_partition_spy()
    lm = TC.build("llama3", "fp32")  # fp32 masters, bf16 compute (mp_policy)
    cfg = dict(M.config_dict(lm), framework="torchtitan")
    ids = M.make_ids(lm, R.B, R.S)
    convert_to_float8_training(lm.model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True),
                               module_filter_fn=partial(module_filter_fn, filter_fqns=[]))
    conv = [n for n, m in lm.model.named_modules() if isinstance(m, Float8Linear)]
    kept = [n for n, m in lm.model.named_modules() if type(m) is torch.nn.Linear]
    blocks = TC.titan_parallelize(lm, "llama3", recompute, ("model", "loss"))
    from torchtitan.models.llama3.infra.parallelize import apply_fsdp
    mesh = init_device_mesh("cpu", (world,))
    apply_fsdp(lm.model, mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32, pp_enabled=False)
    ranges = R.SeqRanges(lm, opaque=blocks)
    opt = torch.optim.AdamW(lm.model.parameters(), foreach=True)
    if precompute:  # Float8LinearConverter.post_optimizer_hook, an optimizer step post hook
        opt.register_step_post_hook(lambda *a, **kw: precompute_float8_dynamic_scale_for_fsdp(lm.model))

    phase["step"] = 1
    local = _Local(lm)
    orig_cs = R.compiled_saved

    def compiled_saved(model, ids_, ranges_, amp=False):
        # the saved tensors whose storage FSDP2 freed after forward (resized to 0: an all-gather output) or that
        # are all-gather outputs are the unsharded parameters
        entries, logits_info, loss, extra = orig_cs(_Gathered(model), ids_, ranges_, amp)
        n0 = [e for e in entries if e["bytes"] == 0]
        extra["saved_fsdp_storages"] = len(n0)
        entries = [e for e in entries if e["bytes"] != 0]
        return entries, logits_info, loss, extra
    R.compiled_saved = compiled_saved
    entries, logits_info, extra, saved_bytes, compile_s, counters_1 = R.compile_then_read_saved(lm, opt, ids, ranges)
    saved_bytes = sum(e["bytes"] for e in entries)
    phase["step"] = 2
    # AdamW's states are DTensors (FSDP2): the scan and the record count their local shards
    R.T.optimizer_state_tensors = lambda o: [getattr(v, "_local_tensor", v) for st in o.state.values()
                                             for v in st.values() if isinstance(v, torch.Tensor)]
    orig_pi = R.param_info
    R.param_info = lambda model: orig_pi(local)
    orig_cp = R.classify_preexisting
    R.classify_preexisting = lambda model, state, ids_: orig_cp(local, state, ids_)
    step, regions, counters_2 = R.profiled_compiled_step("torchtitan-llama3", lm, opt, ids, logits_info, extra,
                                                         saved_bytes, counters_1)
    if rank == 0:
        pi = R.param_info(lm)
        a_state = sum(v.numel() * v.element_size() for st in opt.state.values() for k, v in st.items()
                      if isinstance(v, torch.Tensor) and k != "step" for v in [getattr(v, "_local_tensor", v)])
        a_step = sum(v.numel() * v.element_size() for st in opt.state.values() for k, v in st.items()
                     if isinstance(v, torch.Tensor) and k == "step")
        grads = sum(p.numel() * p.element_size() for p in local.parameters())
        tag = "compile=layer" + (f"+recompute={recompute}" if recompute != "none" else "") + \
            "+fp8=tensorwise+fp8_allgather" + ("+precompute" if precompute else "")
        rec = {"id": f"torchtitan-llama3/fsdp2-w{world}/b{R.B}/s{R.S}/mixed-bf16/sdpa/{tag}",
               "family": "torchtitan-llama3", "model_type": cfg["model_type"],
               "config_key": f"torchtitan-llama3/{cfg.get('dtype')}", "batch": R.B, "seq": R.S, "dtype": "mixed-bf16",
               "attn": "sdpa", "world_size": world, "zero": "full_shard", **pi, "gradient_bytes": grads,
               "adamw": {"state_bytes": a_state, "step_bytes": a_step, "foreach": True},
               "framework": "torchtitan", "framework_version": "0.2.2", "checkpointing": recompute != "none",
               "recipe": {"compile": True, "compile_regions": "layer", "components": ["model", "loss"],
                          "compiled_loss": True, "recompute": recompute, "fsdp": "torchtitan 0.2.2 apply_fsdp "
                          "(param_dtype bf16, reduce_dtype fp32, reshard policy default)",
                          "applied_by": "torchtitan 0.2.2 apply_ac + apply_compile + apply_fsdp, "
                                        "build_cross_entropy_loss"},
               "fp8": {"recipe": "tensorwise", "enable_fsdp_float8_all_gather": True,
                       "precompute_float8_dynamic_scale_for_fsdp": precompute,
                       "converter": "torchtitan 0.2.2 Float8LinearConverter (tensorwise branch) as called",
                       "converted": conv, "kept": kept},
               "saved_bytes": saved_bytes, "saved_storages": len(entries), "logits": logits_info,
               "saved_parameter_storages": extra["saved_parameter_storages"],
               "saved_fsdp_storages": extra.get("saved_fsdp_storages", 0),
               "saved_buffer_storages": extra["saved_buffer_storages"], "dynamo": counters_2,
               "regions": regions, "step": step, "step_method": "torch.profiler memory events (CPU allocator), rank 0",
               "calls": [c for c in calls if c[1] == 2], "compile_seconds": round(compile_s, 1),
               "saved": R.aggregate_rows(entries)}
        R.write_step_log(rec, out_dir)
        with open(out_path, "w") as f:
            json.dump({"record": rec, "cfg": cfg}, f)
    ranges.remove()
    gc.collect()
    dist.destroy_process_group()



def main():
    import torch.multiprocessing as mp
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="substring of recompute/precompute, e.g. full/precompute")
    ap.add_argument("--out", default=TC.OUT)
    args = ap.parse_args()
    path = os.path.join(args.out, f"{NAME}.json")
    doc = json.load(open(path)) if os.path.exists(path) else {
        "generated_by": "validation/measure_titan_fsdp_fp8.py", "torch": torch.__version__.split("+")[0],
        "torchao": __import__("torchao").__version__, "framework": "torchtitan", "framework_version": "0.2.2",
        "family": "llama3", "device": "cpu", "world_size": WORLD,
        "backend": "gloo (float8 buffers all-gathered as uint8 views; PREMUL_SUM reduce-scatter handed SUM)",
        "call_fields": ["collective", "step", "input [dtype, shape, bytes]", "output [dtype, shape, bytes]"],
        "configs": {}, "records": []}
    fails = 0
    for rc, pre in CASES:
        key = f"{rc}/{'precompute' if pre else 'dynamic'}"
        if args.only and args.only not in key:
            continue
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rec.json")
            try:
                mp.spawn(worker, args=(WORLD, port, rc, pre, out, args.out), nprocs=WORLD, join=True)
            except Exception as e:  # noqa: BLE001
                print(f"FAILED {key}: {e}", file=sys.stderr, flush=True)
                fails += 1
                continue
            got = json.load(open(out))
        rec = got["record"]
        doc["configs"][rec["config_key"]] = got["cfg"]
        doc["records"] = sorted([x for x in doc["records"] if x["id"] != rec["id"]] + [rec], key=lambda x: x["id"])
        with open(path, "w") as f:
            f.write(M.dump(doc))
        st = rec["step"]
        bad = {k: v for k, v in st["checks"].items() if v not in (0, None)}
        print(f"{rec['id']}: saved {rec['saved_bytes']} B ({rec['saved_fsdp_storages']} FSDP storages); peak "
              f"{st['measured_peak_bytes']} B ({st['peak_phase']}, {st['peak_stack'][-1:]}) checks {bad or 'ok'}",
              file=sys.stderr, flush=True)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
