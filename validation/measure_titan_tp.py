#!/usr/bin/env python3
"""torchtitan 0.2.2's Llama 3 under its own tensor parallelism (`apply_tp`: sequence parallel, `loss_parallel`), eager
and with its blocks compiled, on CPU, as rank 0 of a 2-rank TP mesh in one process: torch's fake process group
(`torch.testing._internal.distributed.fake_pg`: collectives return right-shaped buffers without communicating; torch's
test_dtensor_compile runs DTensor under torch.compile on it). The estimator's `framework = torchtitan`, `tp = 2`,
`sp = true`, `compile = false | true` (`compile_regions = layer`).

What torchtitan does (0.2.2, models/llama3/infra/parallelize.py `parallelize_llama`):

* `apply_tp(model, tp_mesh, loss_parallel=True, enable_float8_tensorwise_tp=False)`: `tok_embeddings`
  RowwiseParallel (input Replicate, output Shard(1)), `norm` SequenceParallel, `output` ColwiseParallel (input Shard(1),
  output Shard(-1), `use_local_output=False`: the logits stay a vocabulary-sharded DTensor); in every block
  `attention_norm`/`ffn_norm` SequenceParallel, `attention`/`feed_forward` PrepareModuleInput (Shard(1) → Replicate:
  the all-gather), wq/wk/wv/w1/w3 ColwiseParallel, wo/w2 RowwiseParallel(output Shard(1): the reduce-scatter).
* then `apply_ac` (none, full, or op with `_op_sac_save_list` + the CPU SDPA kernel), then `apply_compile` per block
  (compiled records), and the loss compiled (`build_cross_entropy_loss`, "loss" in `compile.components`).
* train.py runs forward, loss and backward inside `train_context()` = `loss_parallel()` (`dist_utils.
  get_train_context`); here the whole step runs inside it (the optimizer runs none of the ops it changes).

The measurement is measure_titan_compile.py's (saved tensors from the autograd graph after a forward — compiled
functions' saved tensors and eager nodes' `_saved_*` — and the step's peak from torch.profiler memory events), with
DTensors read as their rank-0 local tensors (`_local_tensor`: parameters, gradients, AdamW states, saved tensors).

Eager records with activation checkpointing cannot have their saved tensors read from the graph (reading one unpacks
it: full AC recomputes the block, op SAC then refuses the real backward): their saved bytes are the profiled step's
live bytes after the forward less the checkpoints' CPU RNG states, the loss and the logits, plus the batch's ids the
embedding saves (measure_tune_compile.py's way).

Compiled (`--only compile`; `TITAN_TP_COMPONENTS=model` leaves the loss eager: `compile_regions = block`), the first
block's input is the embedding's pending reduce-scatter (RowwiseParallel's `_prepare_output_fn` redistributes with `async_op=True`, then `to_local()`: an
`AsyncCollectiveTensor`), which AOTAutograd swaps for its inner tensor (`_functorch/_aot_autograd/frontend_utils.py`
`_resolve_input_async_collectives`, `subclass_codegen.py` `_maybe_wait_async_collective_tensor` → `trigger_wait()`);
in the backward the embedding's `Redistribute.backward` then gets a plain tensor (`_ToTorchTensorBackward` gets None)
and fails: `AttributeError: 'Tensor' object has no attribute '_local_tensor'` (torch/distributed/tensor/
_redistribute.py, `NestedRedistribute.forward`). Nothing of the fake process group is involved (FINDINGS §15.1.y).
So the compiled records hand the first block the embedding's output waited and cloned (`wait_embedding_output`: the
same bytes alive from the first block on; the clone briefly beside the gathered output inside the embedding's hook).

`--fp8 tensorwise`: torchtitan's `Float8LinearConverter` first (measure_titan_compile.titan_float8), then `apply_tp`
with `enable_float8_tensorwise_tp=True` (torchao's Float8ColwiseParallel, Float8RowwiseParallel,
PrepareFloat8ModuleInput: the blocks' inputs cast to float8 before the all-gather); saved `Float8TrainingTensor`s are
read as their `_data` and `_scale` storages. Writes torchtitan-llama3-tp-fp8.json.

`--family qwen3`: torchtitan's dense Qwen3 (measure_titan_compile.py's build) under `apply_non_moe_tp`
(models/qwen3/infra/parallelize.py, what `parallelize_qwen3` calls; no async TP, no CP): Llama 3's plan, with wq/wk/wv
`ColwiseParallel(use_local_output=False)` (q/k/v stay head-sharded DTensors through q_norm/k_norm, RoPE and SDPA) and
q_norm/k_norm `SequenceParallel(sequence_dim=2)`. torch 2.15's DTensor has no sharding strategy for the CPU SDPA kernel
that path reaches: `register_cpu_sdpa_sharding` registers the CUDA flash kernel's. Writes torchtitan-qwen3-tp.json.

Writes tests/fixtures/pytorch/frameworks/torchtitan-llama3-tp.json.

Usage:  nice validation/.venv/bin/python validation/measure_titan_tp.py [--family qwen3] [--only SUBSTRING]
        (default: llama3, eager)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import measure_recipes as R  # noqa: E402  (imports measure, torch)
import measure_frameworks as F  # noqa: E402
import measure_titan_compile as C  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

M = R.M
OUT = F.OUT
TP = 2
MODES = ("eager", "compile")
RECOMPUTES = ("none", "full", "op")
DTYPES = ("fp32", "bf16")
EAGER_CHECKPOINT = False  # set by measure_titan_tp for eager records with activation checkpointing
# torchtitan's compile.components (`--only compile`; `TITAN_TP_COMPONENTS=model` leaves the loss eager)
COMPONENTS = tuple(os.environ.get("TITAN_TP_COMPONENTS", "model,loss").split(","))


def loc(t):
    """A DTensor's rank-0 local tensor (what the rank holds), a functional collective's pending result
    (`AsyncCollectiveTensor`) its buffer; any other tensor as it is."""
    from torch.distributed.tensor import DTensor
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    while isinstance(t, (DTensor, AsyncCollectiveTensor)):
        t = t._local_tensor if isinstance(t, DTensor) else t.elem
    return t


def inner(t, path=""):
    """A saved tensor's storages: a wrapper subclass's (`Float8TrainingTensor`: `_data`, `_scale`) through
    `__tensor_flatten__`, recursively; a plain tensor as it is."""
    t = loc(t)
    if type(t) is torch.Tensor or isinstance(t, torch.nn.Parameter) or not hasattr(t, "__tensor_flatten__"):
        return [(path, t)]
    names, _ = t.__tensor_flatten__()
    return [x for n in names for x in inner(getattr(t, n), f"{path}.{n}")]


def classify_preexisting(model, opt_state, ids):
    """measure_recipes.classify_preexisting with DTensors read as their local tensors."""
    params = [loc(p) for p in model.parameters()]
    classes = {"parameter": params, "optimizer_state": [loc(t) for t in opt_state],
               "buffer": [loc(b) for b in model.buffers()], "batch": [ids]}
    gc.collect()
    pre: dict[int, tuple[str, int]] = {}

    def storage(t):
        try:
            t = loc(t)
            if t.device.type != "cpu":
                return None
            st = t.untyped_storage()
            return st if st.nbytes() > 0 and st.data_ptr() != 0 else None
        except (RuntimeError, NotImplementedError, TypeError):
            return None
    for cls, tensors in classes.items():
        for t in tensors:
            st = storage(t)
            if st is not None and st.data_ptr() not in pre:
                pre[st.data_ptr()] = (cls, st.nbytes())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor) and not isinstance(obj, torch._subclasses.FakeTensor):
                st = storage(obj)
                if st is not None and st.data_ptr() not in pre:
                    pre[st.data_ptr()] = ("other", st.nbytes())
    out: dict[str, int] = {}
    for cls, n in pre.values():
        out[cls] = out.get(cls, 0) + n
    return out


def compiled_saved(model, ids, ranges, amp=False):
    """measure_recipes.compiled_saved with DTensors read as their local tensors (saved tensors, parameters, logits,
    loss)."""
    ranges.active = True
    ranges.ranges = []
    out = model(input_ids=ids, labels=ids, use_cache=False)
    ranges.active = False
    loss, logits = out.loss, out.logits
    del out
    gc.collect()
    if EAGER_CHECKPOINT:
        # Reading a saved tensor inside an eager checkpoint unpacks it: full AC recomputes the block, op SAC refuses
        # the backward that follows ("backward an extra time"). The saved bytes come from the profiled step instead
        # (`saved_from_profile`).
        lg = loc(logits)
        info = {"bytes": lg.untyped_storage().nbytes(), "dtype": M.dtype_name(lg.dtype), "shape": list(lg.shape),
                "is_saved": False}
        extra = {"saved_parameter_storages": None, "saved_buffer_storages": None, "ids_saved_bytes": 0,
                 "loss_bytes": loc(loss).untyped_storage().nbytes(), "regions": {}}
        del logits, lg
        return [], info, loss, extra
    params = {loc(p).untyped_storage().data_ptr() for p in model.parameters()}
    bufs = {loc(b).untyped_storage().data_ptr() for b in model.buffers()}
    found: dict[int, dict] = {}
    regions = {}
    n_param = n_buf = 0
    for node in sorted(R.walk_graph(loss.grad_fn), key=lambda n: n._sequence_nr()):
        seq = node._sequence_nr()
        tensors, _ = R.node_saved_tensors(node)
        tensors = [(a + path, x) for a, t in tensors for path, x in inner(loc(t))]
        producers = None
        if node.name() == "CompiledFunctionBackward":
            aot_id = type(node)._forward_cls._aot_id
            g = R.GRAPHS.get(aot_id)
            if g is not None:
                if "analysis" not in g:
                    g["analysis"] = R.graph_analysis(g)
                producers = g["analysis"][0]
                if len(producers) != len(tensors):
                    producers = None  # subclass (DTensor) inputs: the runtime list is the unwrapped one
            regions.setdefault(aot_id, {"module": M.module_pattern(ranges.module_of(seq)), "nodes": 0})
            regions[aot_id]["nodes"] += 1
        for i, (attr, t) in enumerate(tensors):
            try:
                st = t.untyped_storage()
                st.data_ptr()
            except RuntimeError as e:
                raise SystemExit(f"{node.name()} {attr}: {type(t).__name__} {e}")
            ptr = st.data_ptr()
            if ptr in params:
                n_param += 1
                continue
            if ptr in bufs:
                n_buf += 1
                continue
            if ptr in found:
                continue
            ev = {"module": ranges.module_of(seq), "op": node.name(), "attr": attr, "dtype": M.dtype_name(t.dtype),
                  "shape": list(t.shape), "bytes": st.nbytes(), "seq": seq}
            if producers is not None:
                p = producers[i]
                ev["producer"] = p["producer"] + ("" if not p["via"] else "/" + ".".join(p["via"]))
            found[ptr] = ev
    lg = loc(logits)
    lg_ptr = lg.untyped_storage().data_ptr()
    logits_info = {"bytes": lg.untyped_storage().nbytes(), "dtype": M.dtype_name(lg.dtype),
                   "shape": list(lg.shape), "is_saved": lg_ptr in found}
    ids_ptr = ids.untyped_storage().data_ptr()
    entries = sorted(found.values(), key=lambda e: e["seq"])
    extra = {"saved_parameter_storages": n_param, "saved_buffer_storages": n_buf,
             "ids_saved_bytes": found[ids_ptr]["bytes"] if ids_ptr in found else 0,
             "loss_bytes": loc(loss).untyped_storage().nbytes(), "regions": regions}
    del logits, lg
    return entries, logits_info, loss, extra


def param_info(model):
    """measure_recipes.param_info over the rank's local shards."""
    params = [loc(p) for p in model.parameters()]
    by_dtype: dict[str, int] = {}
    for p in params:
        k = M.dtype_name(p.dtype)
        by_dtype[k] = by_dtype.get(k, 0) + p.numel() * p.element_size()
    return {"parameter_tensors": len(params), "parameter_bytes": sum(by_dtype.values()),
            "parameter_bytes_by_dtype": dict(sorted(by_dtype.items()))}


def adamw_state_bytes(opt):
    state = step = 0
    for st in opt.state.values():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                v = loc(v)
                if k == "step":
                    step += v.numel() * v.element_size()
                else:
                    state += v.numel() * v.element_size()
    return state, step


def register_cpu_sdpa_sharding():
    """torch 2.15's DTensor registers sharding strategies for the CUDA SDPA kernels (flash, efficient, cudnn:
    `_ops/_matrix_ops.py`) but none for the CPU one (`_scaled_dot_product_flash_attention_for_cpu` and its backward),
    which torchtitan's Qwen3 reaches on CPU: its `wq`/`wk`/`wv` keep DTensor outputs (`use_local_output=False`), so
    SDPA runs on head-sharded (`Shard(1)` of `[b, heads, s, d]`) DTensors. Registered here as the CUDA flash kernel's
    are: heads-sharded or batch-sharded, outputs like the inputs; the backward reuses the CUDA flash backward's
    strategy (the same six tensor inputs: grad_out, q, k, v, out, logsumexp)."""
    from torch.distributed.tensor._ops import _matrix_ops as mo
    from torch.distributed.tensor._ops.single_dim_strategy import (
        _ShardingPlaceholder as P, register_single_dim_strategy)
    aten = torch.ops.aten

    @register_single_dim_strategy(aten._scaled_dot_product_flash_attention_for_cpu.default)
    def _cpu_flash(op, args_schema, kwargs_schema):
        return [[P(d), P(d), P(d), P(d), P(d)] for d in (1, 0)]  # output, logsumexp, q, k, v

    register_single_dim_strategy(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)(
        mo.scaled_dot_product_flash_attention_backward_single_dim_strategy)


def init_fake_pg():
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=TP)
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))


def wait_embedding_output(model):
    """Hands the first compiled block the embedding's reduce-scattered output as a plain tensor: the
    `AsyncCollectiveTensor` RowwiseParallel leaves is cloned (its dispatch waits, then `clone` copies; the clone
    replaces it, so from the first block on the same bytes are alive as without the hook, the clone briefly beside it
    inside the embedding's forward hook). Without it, torch 2.15's AOTAutograd unwraps the input itself and the
    embedding's backward fails (module docstring)."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    def waited(_mod, _inp, out):
        return out.clone() if isinstance(out, AsyncCollectiveTensor) else out
    model.tok_embeddings.register_forward_hook(waited)


def titan_tp(lm, mesh, mode: str, recompute: str, fp8: str = "none", fam: str = "llama3"):
    """torchtitan's `apply_tp` (llama3) or `apply_non_moe_tp` (qwen3; loss_parallel, no async TP, no CP), then
    `apply_ac` and, compiled, `apply_compile` and the compiled loss (measure_titan_compile.titan_parallelize)."""
    # The model packages' __init__ (train specs: datasets, tokenizers) are not entered: each parallelize module is
    # imported under a bare package (measure_frameworks.py `bare_packages`).
    F.bare_packages("llama3", "llama4", "qwen3")
    if fam == "llama3":
        from torchtitan.models.llama3.infra.parallelize import apply_tp, _op_sac_save_list
        apply_tp(lm.model, mesh, loss_parallel=True, enable_float8_tensorwise_tp=fp8 == "tensorwise")
    else:
        # parallelize_qwen3 calls apply_non_moe_tp(model, tp_mesh, loss_parallel, enable_float8_tensorwise_tp,
        # enable_async_tp, cp_enabled): as Llama 3's plan, but wq/wk/wv keep DTensor outputs
        # (use_local_output=False) and q_norm/k_norm are SequenceParallel(sequence_dim=2) over the local heads.
        from torchtitan.models.qwen3.infra.parallelize import apply_non_moe_tp, _op_sac_save_list
        register_cpu_sdpa_sharding()
        apply_non_moe_tp(lm.model, mesh, loss_parallel=True, enable_float8_tensorwise_tp=fp8 == "tensorwise",
                         enable_async_tp=False, cp_enabled=False)
    if mode == "compile":
        wait_embedding_output(lm.model)
        return C.titan_parallelize(lm, fam, recompute, COMPONENTS)
    if recompute != "none":
        from torchtitan.config.job_config import ActivationCheckpoint
        from torchtitan.distributed.activation_checkpoint import apply_ac
        ac = ActivationCheckpoint(mode="full") if recompute == "full" else \
            ActivationCheckpoint(mode="selective", selective_ac_option="op")
        apply_ac(lm.model, ac, model_compile_enabled=False, op_sac_save_list=set(_op_sac_save_list) | {R.CPU_SDPA})
    return []


def measure_titan_tp(mode: str, dtype: str, recompute: str, opts: dict, fp8: str = "none", fam: str = "llama3"):
    from torch._dynamo.utils import counters
    from torch.distributed.tensor.parallel import loss_parallel
    family = f"torchtitan-{fam}"
    mesh = init_fake_pg()
    torch._dynamo.reset()
    counters.clear()
    R.GRAPHS.clear()
    gc.collect()
    R.install_partition_spy()
    # the helpers measure_recipes' steps call, DTensor-aware
    R.classify_preexisting = classify_preexisting
    R.compiled_saved = compiled_saved
    R.param_info = param_info
    global EAGER_CHECKPOINT
    EAGER_CHECKPOINT = mode == "eager" and recompute != "none"
    model = C.build(fam, dtype)
    cfg = dict(M.config_dict(model), framework="torchtitan")
    ids = M.make_ids(model, R.B, R.S)
    # torchtitan's Float8LinearConverter runs before parallelize_llama (measure_titan_compile.titan_float8); with
    # tensorwise, apply_tp uses torchao's Float8ColwiseParallel / Float8RowwiseParallel / PrepareFloat8ModuleInput.
    fp8_info = C.titan_float8(model, fp8) if fp8 != "none" else None
    blocks = titan_tp(model, mesh, mode, recompute, fp8, fam)
    ranges = R.SeqRanges(model, opaque=blocks)
    opt = torch.optim.AdamW(model.parameters())
    with loss_parallel():
        entries, logits_info, extra, saved_bytes, compile_s, counters_1 = R.compile_then_read_saved(
            model, opt, ids, ranges)
        a_state, a_step = adamw_state_bytes(opt)
        step, regions, counters_2 = R.profiled_compiled_step(family, model, opt, ids, logits_info, extra,
                                                             saved_bytes, counters_1)
    rng = 0
    if EAGER_CHECKPOINT:
        # As measure_tune_compile.py: what the forward leaves alive, less the checkpoints' CPU RNG states
        # (`preserve_rng_state = True`, ActivationCheckpoint's default: host memory on a GPU), the loss and the
        # logits (alive at the mark, not saved: the log-softmax keeps its result).
        rng = torch.get_rng_state().numel() * len(model.model.layers)
        # The embedding saves the batch's ids themselves (`Replicate` DTensor of the same storage: the
        # uncheckpointed records read it from the graph), which were alive before the step: added back.
        saved_bytes = step["live_after_forward"] - rng - extra["loss_bytes"] - logits_info["bytes"] + \
            ids.untyped_storage().nbytes()
        step["checks"]["forward_unexplained"] = None  # the saved bytes are taken from it
    pi = param_info(model)
    regions = "layer" if "loss" in COMPONENTS else "block"
    tag = f"tp={TP}+sp" + (f"+compile={regions}" if mode == "compile" else "") + \
        (f"+recompute={recompute}" if recompute != "none" else "") + (f"+fp8={fp8}" if fp8 != "none" else "")
    grads = sum(loc(p).numel() * loc(p).element_size() for p in model.parameters() if p.requires_grad)
    rec = {"id": f"{family}/b{R.B}/s{R.S}/{dtype}/sdpa/{tag}", "family": family, "model_type": cfg["model_type"],
           "config_key": f"{family}/{cfg.get('dtype')}", "batch": R.B, "seq": R.S, "dtype": dtype, "attn": "sdpa",
           **pi, "gradient_bytes": grads, "adamw": {"state_bytes": a_state, "step_bytes": a_step},
           "framework": "torchtitan", "framework_version": "0.2.2", "checkpointing": recompute != "none",
           "parallel": {"tp": TP, "sp": True, "loss_parallel": True, "rank": 0,
                        "process_group": "fake (torch.testing._internal.distributed.fake_pg, world_size 2)",
                        "applied_by": "torchtitan 0.2.2 " + ("apply_tp" if fam == "llama3" else "apply_non_moe_tp") +
                        " (loss_parallel=True" + (", float8 tensorwise" if fp8 == "tensorwise" else ", no float8") +
                        ")"}}
    rec.update({"recipe": {"compile": mode == "compile", "compile_regions": regions if mode == "compile" else None,
                           "components": list(COMPONENTS) if mode == "compile" else [],
                           "compiled_loss": mode == "compile" and "loss" in COMPONENTS, "recompute": recompute,
                           "applied_by": "torchtitan 0.2.2 apply_tp, apply_ac" +
                           (" + apply_compile" if mode == "compile" else "") +
                           (", build_cross_entropy_loss" if mode == "compile" and "loss" in COMPONENTS else ""),
                           **({"policy": "torchtitan 0.2.2 _op_sac_save_list (+ CPU SDPA)"}
                              if recompute == "op" else {})},
                "saved_bytes": saved_bytes, "saved_storages": len(entries), "logits": logits_info,
                **({"saved_bytes_from": "live_after_forward - checkpoint_rng_state_bytes - loss - logits + ids",
                    "checkpoint_rng_state_bytes": rng} if EAGER_CHECKPOINT else {}),
                "saved_parameter_storages": extra["saved_parameter_storages"],
                "saved_buffer_storages": extra["saved_buffer_storages"], "dynamo": counters_2,
                "regions": regions, "step": step, "step_method": "torch.profiler memory events (CPU allocator)",
                **({"fp8": fp8_info} if fp8_info else {}),
                "compile_seconds": round(compile_s, 1), "saved": R.aggregate_rows(entries)})
    opts["cfg"] = cfg
    ranges.remove()
    return rec


def specs(only):
    for mode in MODES if only and only.startswith("compile") else ("eager",):
        for dtype in DTYPES:
            for rc in RECOMPUTES:
                key = f"{mode}/{dtype}/{rc}"
                if only is None or only in key:
                    yield mode, dtype, rc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="substring of mode/dtype/recompute (mode: eager, compile)")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--fp8", default="none", choices=("none", "tensorwise"),
                    help="torchtitan's quantize.linear.float8 recipe_name (tensorwise: float8 TP); torchtitan-llama3-tp-fp8.json")
    ap.add_argument("--family", default="llama3", choices=("llama3", "qwen3"),
                    help="torchtitan model: llama3 (apply_tp) or dense qwen3 (apply_non_moe_tp); torchtitan-qwen3-tp.json")
    ap.add_argument("--child", nargs=4, metavar=("MODE", "DTYPE", "RECOMPUTE", "OUT_JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.child:
        mode, dtype, rc, out_json = args.child
        opts: dict = {}
        rec = measure_titan_tp(mode, dtype, rc, opts, args.fp8, args.family)
        R.write_step_log(rec, args.out)
        with open(out_json, "w") as f:
            json.dump({"record": rec, "cfg": opts["cfg"]}, f)
        return
    n_fail = 0
    path = os.path.join(args.out, f"torchtitan-{args.family}-tp" + ("-fp8" if args.fp8 != "none" else "") + ".json")
    for mode, dtype, rc in specs(args.only):
        doc = json.load(open(path)) if os.path.exists(path) else {
            "generated_by": "validation/measure_titan_tp.py", "torch": torch.__version__.split("+")[0],
            "framework": "torchtitan", "framework_version": "0.2.2", "family": args.family, "device": "cpu",
            "configs": {}, "records": []}
        cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--fp8", args.fp8, "--family",
               args.family, "--child", mode, dtype, rc]
        n_fail += not R.run_child_into(cmd, path, doc, f"{mode}/{dtype}/{rc}")
    sys.exit(1 if n_fail else 0)


if __name__ == "__main__":
    main()
