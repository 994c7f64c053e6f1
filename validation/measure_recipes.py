#!/usr/bin/env python3
"""Ground truth for issue 26's recipes (torch.compile, op-level selective checkpointing, every-N checkpointing, the
optimizer step in backward, activation offloading) on transformers 5.24's modeling code, on CPU.

Every record is one family × dtype (fp32, bf16) × attention (sdpa; eager where transformers refuses sdpa) × b2 s64 ×
recipe. What is measured and how (details in validation/README.md, "Recipes"; the per-layer rules in FINDINGS.md §15):

* ``compile=layer``: ``model.model.layers[i].compile()`` (torchtune's per-layer regions) and the loss function
  compiled (``model.loss_function = torch.compile(ForCausalLMLoss)``; torchtune compiles its loss). Inductor on the
  CPU. The saved tensors are read from the autograd graph after forward (no hooks at all: a TorchDispatchMode would make
  dynamo run eagerly): ``saved_tensors`` + ``_tensors_no_vc_check`` of every ``CompiledFunctionBackward`` node and the
  ``_saved_*`` of every eager node, each storage once, parameters and buffers excluded. Each compiled saved tensor is
  matched to the forward FX graph the partitioner returned (``min_cut_rematerialization_partition`` is wrapped, not
  changed) to name its producer op. The step's peak comes from ``torch.profiler`` memory events (every c10 CPU
  allocation and free), calibrated against the dispatch tracker on the same model run eagerly (``eager_reference``).
* ``recompute=op``: torchtitan 0.3.0's ``SelectiveAC`` policy (torchtitan/distributed/activation_checkpoint.py,
  ``_get_default_save_ops`` + ``SelectiveAC._wrap_block.wrapped_policy``, copied verbatim below) through
  ``torch.utils.checkpoint.checkpoint(use_reentrant=False, context_fn=..., early_stop=False)`` on every decoder layer.
  The CPU's SDPA kernel (``_scaled_dot_product_flash_attention_for_cpu``) is not in torchtitan's list (its CUDA
  counterparts are): ``recompute=op`` adds it (what a CUDA run saves), ``recompute=op-literal`` does not.
* ``recompute_every=2``: full checkpointing of every 2nd layer as torchtitan (v0.2.2 ``_apply_layer_sac``: the layer
  whose 1-based count is divisible by N, i.e. layers 1, 3, ...) and as transformers' ``every_n_layers`` (layers 0, 2,
  ...: ``recompute_every=2-hf``).
* ``optim_in_bwd``: torchtune's ``register_optim_in_bwd_hooks`` (one AdamW per parameter, ``step()`` +
  ``zero_grad()`` in a post-accumulate-grad hook).
* ``act_offload=torchtune`` / ``act_offload=save_on_cpu``: torchtune 0.6.1's ``OffloadActivations`` (streams on, stash
  5, 1,024 B, the output head under ``NoOpManager``) and ``torch.autograd.graph.save_on_cpu(pin_memory=True)``, ported
  to a CPU-only machine (see ``CpuOffloadActivations``): host copies are made outside the tracker's view (host memory),
  device copies made in backward are tracked (device memory).

Usage:  validation/.venv/bin/python validation/measure_recipes.py [--only SUBSTRING] [--recipes a,b] [--families a,b]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
import weakref
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import measure as M  # noqa: E402  (sets the env vars, imports torch/transformers)
import tracker as T  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from torch.utils._python_dispatch import _disable_current_modes  # noqa: E402

warnings.filterwarnings("ignore")

REPO = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "pytorch", "recipes")
GRID_DIR = os.path.join(REPO, "tests", "fixtures", "pytorch", "records")
B, S = 2, 64
DTYPES = ("fp32", "bf16")
RECIPES = ("compile=layer", "recompute=op", "recompute=op-literal", "recompute_every=2", "recompute_every=2-hf",
           "optim_in_bwd", "act_offload=torchtune", "act_offload=save_on_cpu")
EXTRA_RECIPES = ("compile=layer+recompute=op", "compile=layer+recompute=full",  # run with --recipes
                 "optim=paged_adamw8bit",  # needs bitsandbytes (a separate environment: validation/README.md)
                 "eager", "recompute=full",  # measure.py's grid record (ckpt0 / ckpt1) for the deep variants below
                 # activation offloading with transformers' full checkpointing (non-reentrant, every layer): the
                 # checkpoints' positional inputs packed by the outer hooks (written to --out offload_ckpt/)
                 "act_offload=torchtune+recompute=full", "act_offload=save_on_cpu+recompute=full",
                 "act_offload=torchtune+recompute=op", "act_offload=save_on_cpu+recompute=op",
                 # Transformer Engine's per-layer offloading around each decoder layer (Megatron's
                 # --cpu-offloading-num-layers), on `llama-gqa-L4` at --seq 2048 (its hidden states reach TE's 256K
                 # elements; written to --out te_offload/)
                 "act_offload_layers=1", "act_offload_layers=2", "act_offload_layers=3")

# Deep variants (recipe records only): with 2 layers and V = 1000 the loss dominates every eager step peak, so the
# recipes' backward transients (recomputation, brought-back tensors, freed gradients) never set the peak. With 8
# layers the activations dominate. Their eager anchors are measured here too ("eager", "recompute=full").
DEEP = {
    "llama-gqa-L8": ("llama", dict(M.LLAMA_LIKE, num_hidden_layers=8), "llama-gqa with 8 layers (recipe peaks)"),
    "llama-gqa-L4": ("llama", dict(M.LLAMA_LIKE, num_hidden_layers=4, max_position_embeddings=4096),
                     "llama-gqa with 4 layers and 4,096 positions (Transformer Engine's per-layer offloading)"),
    "qwen3-L4": ("qwen3", dict(M.LLAMA_LIKE, head_dim=M.D, num_hidden_layers=4, max_position_embeddings=4096),
                 "qwen3 with 4 layers and 4,096 positions (per-head q/k norms on the views; per-layer offloading)"),
    "qwen2-L4": ("qwen2", dict(M.LLAMA_LIKE, num_hidden_layers=4, max_position_embeddings=4096),
                 "qwen2 with 4 layers and 4,096 positions (q/k/v biases: addmm; per-layer offloading)"),
    "mistral-L4": ("mistral", dict(M.LLAMA_LIKE, head_dim=M.D, sliding_window=M.W, num_hidden_layers=4,
                                   max_position_embeddings=4096),
                   "mistral with 4 layers and 4,096 positions (sliding-window mask; per-layer offloading)"),
    "phi3-L4": ("phi3", dict(M.LLAMA_LIKE, original_max_position_embeddings=4096, pad_token_id=0, num_hidden_layers=4,
                             max_position_embeddings=4096),
                "phi3 with 4 layers and 4,096 positions (fused qkv_proj and gate_up_proj; per-layer offloading)"),
    "gemma2-L4": ("gemma2", dict(M.LLAMA_LIKE, head_dim=24, sliding_window=M.W, num_hidden_layers=4,
                                 max_position_embeddings=4096),
                  "gemma2 with 4 layers and 4,096 positions (soft-capping, 4 norms a layer; per-layer offloading)"),
    "mixtral-L8": ("mixtral", dict(M.LLAMA_LIKE, num_hidden_layers=8, head_dim=M.D, num_local_experts=4,
                                   num_experts_per_tok=2), "mixtral with 8 layers (recipe peaks)"),
}
for _k, _v in DEEP.items():
    M.FAMILIES.setdefault(_k, _v)

# ====================================================================================================================
# torchtitan 0.3.0's per-op selective AC policy (torchtitan/distributed/activation_checkpoint.py in the
# torchtitan-0.3.0-py3-none-any.whl wheel; the same file at v0.2.2 is pytorch/torchtitan@73a0e697 with a smaller list).
# Copied, minus torchtitan's Config plumbing; `force_recompute_mm_shapes_by_fqns` keeps its default
# ["moe.router.gate"] (torchtitan's own MoE module names; it matches no transformers module).
# ====================================================================================================================
from torch._functorch.partitioners import get_default_op_list  # noqa: E402
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts  # noqa: E402


def _get_default_save_ops() -> set:
    compute_ops = [
        torch.ops.aten._scaled_dot_product_cudnn_attention.default,
        torch.ops.aten._scaled_dot_product_attention_math.default,
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default,
        torch.ops.aten.max.default,
        torch._higher_order_ops.flex_attention,
        torch.ops.aten.linear.default,
        torch.ops.aten.topk.default,
        (torch._higher_order_ops, "inductor_compiled_code"),
        (torch.ops, "torch_attn._varlen_attn.default"),
    ]
    comm_ops = [
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        torch.ops._c10d_functional.all_to_all_single.default,
        (torch.ops, "deepep.dispatch.default"),
        (torch.ops, "deepep.combine.default"),
        (torch.ops, "hybridep.dispatch.default"),
        (torch.ops, "hybridep.combine.default"),
    ]

    def _resolve_ops(op_specs: list) -> dict:
        ops = {}
        for spec in op_specs:
            if isinstance(spec, tuple):
                obj, path = spec
                try:
                    for part in path.split("."):
                        obj = getattr(obj, part)
                    ops[obj] = CheckpointPolicy.MUST_SAVE
                except AttributeError:
                    pass
            else:
                ops[spec] = CheckpointPolicy.MUST_SAVE
        return ops

    aten_op_types = get_default_op_list()
    save_ops = {op.default for op in aten_op_types.compute_intensive_ops}
    save_ops.update(_resolve_ops(compute_ops))
    save_ops.update(_resolve_ops(comm_ops))
    return save_ops


CPU_SDPA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def torchtitan_sac_context_fn(module, base_fqn: str, save_ops: set, log: list | None,
                              force_recompute_fqns=("moe.router.gate",), allow_mutation=False):
    """SelectiveAC._wrap_block's context_fn for one block (torchtitan 0.3.0). `log` (ours) records every forward
    decision: (op, policy, mm index)."""
    mm_recompute_shapes = set()
    for module_fqn, submod in module.named_modules():
        fqn = f"{base_fqn}.{module_fqn}" if base_fqn else module_fqn
        if not any(f in fqn for f in force_recompute_fqns):
            continue
        if not isinstance(submod, torch.nn.Linear):
            raise ValueError(f"force_recompute_mm_shapes_by_fqns expected to match a nn.Linear, but got: {submod}")
        out_f, in_f = submod.weight.shape
        mm_recompute_shapes.add((in_f, out_f))
    mm_ops = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)

    def _get_custom_policy():
        meta = {"forward_mm_count": 0, "recompute_mm_count": 0}

        def wrapped_policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
            if (func == torch.ops.aten._to_copy.default and "cuda" in str(args[0].device) and "device" in kwargs
                    and str(kwargs["device"]) == "cpu"):
                return CheckpointPolicy.MUST_SAVE
            mode = "recompute" if ctx.is_recompute else "forward"
            mm_count_key = f"{mode}_mm_count"
            if func in mm_ops:
                weight_shape = args[1].shape
                if func == torch.ops.aten.linear.default:
                    weight_shape = torch.Size((weight_shape[1], weight_shape[0]))
                if weight_shape in mm_recompute_shapes:
                    return _logged(log, ctx, func, CheckpointPolicy.PREFER_RECOMPUTE, meta[mm_count_key])
                meta[mm_count_key] += 1
            if func in save_ops:
                if func in mm_ops and meta[mm_count_key] % 2 == 0:
                    return _logged(log, ctx, func, CheckpointPolicy.PREFER_RECOMPUTE, meta[mm_count_key])
                return _logged(log, ctx, func, CheckpointPolicy.MUST_SAVE, meta[mm_count_key])
            return _logged(log, ctx, func, CheckpointPolicy.PREFER_RECOMPUTE, meta[mm_count_key])

        return wrapped_policy

    # allow_mutation (ours, off = torchtitan): see measure_checkpoint_recipe
    return lambda: create_selective_checkpoint_contexts(_get_custom_policy(), allow_cache_entry_mutation=allow_mutation)


def _logged(log, ctx, func, policy, mm_count):
    if log is not None and not ctx.is_recompute:
        outs = []
        for t in torch.utils._pytree.tree_flatten(getattr(ctx, "op_output", None))[0]:
            if isinstance(t, torch.Tensor):
                outs.append([t.untyped_storage().nbytes(), M.dtype_name(t.dtype), list(t.shape)])
        log.append((str(func), policy == CheckpointPolicy.MUST_SAVE, mm_count, outs))
    return policy


# ====================================================================================================================
# common helpers
# ====================================================================================================================

def attn_for(family: str, refused: dict) -> str:
    return ATTN_OVERRIDE or ("eager" if "sdpa" in refused.get(family, {}) else "sdpa")


ATTN_OVERRIDE = None  # --attn


def decoder_layers(model):
    """The repeated decoder layers: the ModuleList of GradientCheckpointingLayers (model.model.layers,
    transformer.h, gpt_neox.layers, model.decoder.layers, ...)."""
    from transformers.modeling_layers import GradientCheckpointingLayer
    for _, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) and all(isinstance(x, GradientCheckpointingLayer) for x in m):
            return m
    raise SystemExit(f"{type(model).__name__}: no ModuleList of decoder layers")


def param_info(model):
    params = list(model.parameters())
    by_dtype: dict[str, int] = {}
    for p in params:
        k = M.dtype_name(p.dtype)
        by_dtype[k] = by_dtype.get(k, 0) + p.numel() * p.element_size()
    return {"parameter_tensors": len(params), "parameter_bytes": sum(by_dtype.values()),
            "parameter_bytes_by_dtype": dict(sorted(by_dtype.items()))}


def classify_preexisting(model, opt_state, ids):
    """Bytes alive before the step, by class: tracker.StepTracker.begin_step's scan of every tensor the garbage
    collector knows (no hooks, no dispatch mode), skipping the fake/meta tensors the compiler keeps."""
    params = list(model.parameters())
    classes = {"parameter": params, "gradient": [p.grad for p in params if p.grad is not None],
               "optimizer_state": opt_state, "buffer": list(model.buffers()), "batch": [ids]}
    gc.collect()
    pre: dict[int, tuple[str, int]] = {}

    def storage(t):
        try:
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


def grid_record(family: str, dtype: str, attn: str, ckpt: str = "ckpt0"):
    """The eager anchor: the grid record, or for the deep variants the recipe shard's "eager"/"recompute=full"."""
    for d, tag in ((GRID_DIR, ckpt), (DEFAULT_OUT, {"ckpt0": "eager", "ckpt1": "recompute=full"}[ckpt])):
        path = os.path.join(d, f"{family}.json")
        if not os.path.exists(path):
            continue
        rid = f"{family}/b{B}/s{S}/{dtype}/{attn}/{tag}"
        for r in json.load(open(path))["records"]:
            if r["id"] == rid:
                return r
    return None


class SeqRanges:
    """Autograd sequence-number ranges per module, for attributing graph nodes to modules without a dispatch mode.
    Modules inside `opaque` (compiled layers) get no hooks (dynamo would trace them); the opaque modules themselves are
    timed by swapping their class for a subclass whose __call__ records the range (outside the compiled _call_impl)."""

    _subclasses: dict = {}

    def __init__(self, model, opaque=()):
        self.names = {id(m): n for n, m in model.named_modules()}
        self.ranges: list[tuple[int, int, int, str]] = []
        self.stack: list = []
        self.handles = []
        self.active = False
        inside = set()
        for m in opaque:
            for sub in m.modules():
                inside.add(id(sub))
        for m in model.modules():
            if id(m) in inside:
                continue
            self.handles.append(m.register_forward_pre_hook(self._pre))
            self.handles.append(m.register_forward_hook(self._post, always_call=True))
        for m in opaque:
            self._swap(m)

    def _swap(self, m):
        cls = type(m)
        sub = SeqRanges._subclasses.get(cls)
        if sub is None:
            def __call__(self_, *args, **kwargs):
                rec = getattr(self_, "_seq_recorder", None)
                if rec is not None and rec.active:
                    rec._pre(self_, args)
                    try:
                        return torch.nn.Module.__call__(self_, *args, **kwargs)
                    finally:
                        rec._post(self_, args, None)
                return torch.nn.Module.__call__(self_, *args, **kwargs)
            sub = type(cls.__name__, (cls,), {"__call__": __call__})
            SeqRanges._subclasses[cls] = sub
        m.__class__ = sub
        m._seq_recorder = self

    def _pre(self, module, args):
        if self.active:
            self.stack.append([torch._C._autograd._get_sequence_nr(), len(self.stack), self.names.get(id(module), "")])

    def _post(self, module, args, out):
        if self.active and self.stack:
            start, depth, name = self.stack.pop()
            end = torch._C._autograd._get_sequence_nr()
            if end > start:
                self.ranges.append((start, end, depth, name))

    def module_of(self, seq: int) -> str:
        best = (-1, "")
        for start, end, depth, name in self.ranges:
            if start <= seq < end and depth > best[0]:
                best = (depth, name)
        return best[1]

    def remove(self):
        for h in self.handles:
            h.remove()


def walk_graph(root):
    seen, todo, out = set(), [root], []
    while todo:
        n = todo.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        out.append(n)
        for nxt, _ in n.next_functions:
            if nxt is not None and nxt not in seen:
                todo.append(nxt)
    return out


def node_saved_tensors(node):
    """[(attr, tensor)] of one autograd node, read without hooks."""
    res = []
    name = node.name()
    if name == "CompiledFunctionBackward":
        for i, t in enumerate(node.saved_tensors):
            res.append((f"saved_tensors[{i}]", t))
        n_vc = len(res)
        for i, t in enumerate(getattr(node, "_tensors_no_vc_check", []) or []):
            res.append((f"_tensors_no_vc_check[{i}]", t))
        return res, n_vc
    attrs = [a for a in dir(node) if a.startswith("_saved_")]
    if hasattr(node, "saved_tensors") and not attrs:
        try:
            for i, t in enumerate(node.saved_tensors):
                res.append((f"saved_tensors[{i}]", t))
        except RuntimeError:
            pass
        return res, len(res)
    for a in attrs:
        try:
            v = getattr(node, a)
        except Exception:
            continue
        for path, t in M.iter_tensors(v, a):
            res.append((path, t))
    return res, len(res)


def aggregate_rows(entries):
    """entries: dicts with module, op, attr, dtype, shape, bytes (+ optional extra keys) in order -> rows like the
    grid's (module pattern, layer indices, count)."""
    rows: dict[tuple, dict] = {}
    extra_keys = ("producer",)
    for ev in entries:
        key = (M.module_pattern(ev["module"]), ev["op"], ev["attr"], ev["dtype"], tuple(ev["shape"]), ev["bytes"],
               *(ev.get(k) for k in extra_keys))
        layer = M.layer_index(ev["module"])
        if key in rows:
            rows[key]["count"] += 1
            if layer is not None and layer not in rows[key]["layers"]:
                rows[key]["layers"].append(layer)
        else:
            r = {"module": key[0], "op": key[1], "attr": key[2], "dtype": key[3], "shape": list(key[4]),
                 "bytes": key[5]}
            for k in extra_keys:
                if ev.get(k) is not None:
                    r[k] = ev[k]
            r["count"] = 1
            r["layers"] = [] if layer is None else [layer]
            rows[key] = r
    for r in rows.values():
        if not r["layers"]:
            del r["layers"]
    return list(rows.values())


# ====================================================================================================================
# the profiler's view of a step (compiled code runs compiled only without a dispatch mode)
# ====================================================================================================================

def profiled_call(fn):
    """Run fn() under torch.profiler with memory events; return (result, allocation events, phase ranges, marks).
    Each event is (time, +/-bytes, innermost op names, is_workspace): an allocation freed before the aten op that
    made it returns (and that free) is a kernel's internal workspace — invisible to a dispatch-level tracker, which
    counts tensors that ops return; the summaries give the peak with and without them. So is an allocation made
    anywhere inside `aten::_scaled_mm` and freed before it returns: the CPU kernel (torch 2.15) upcasts both FP8
    operands to scaled fp32 copies, multiplies them with `aten::mm` into an fp32 product and casts it to the output
    dtype — temporaries of the CPU implementation, which a GPU's single cuBLASLt call does not make (and a
    dispatch-level tracker, as measure_fp8.py's, does not see)."""
    from torch.profiler import ProfilerActivity, profile
    from torch._C._profiler import _EventType
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        result = fn()
    raw, phases, marks = [], {}, {}

    def walk(e, stack, op, smm=None):
        if e.tag == _EventType.Allocation:
            ex = e.extra_fields
            if ex.device.type == "cpu":
                raw.append([e.start_time_ns, ex.alloc_size, tuple(stack[-4:]), ex.ptr, op, False, smm])
        elif e.tag in (_EventType.TorchOp,) and e.name.startswith("phase:"):
            phases[e.name[6:]] = (e.start_time_ns, e.end_time_ns)
        elif e.tag in (_EventType.TorchOp,) and e.name.startswith("mark:"):
            marks[e.name[5:]] = e.start_time_ns
        is_op = e.tag == _EventType.TorchOp and not e.name.startswith(("phase:", "mark:"))
        if smm is None and is_op and e.name == "aten::_scaled_mm":
            smm = (e.start_time_ns, e.end_time_ns)
        for c in e.children:
            walk(c, stack + ([e.name] if is_op else []),
                 (e.start_time_ns, e.end_time_ns) if is_op and e.name.startswith("aten::") else op, smm)
    for r in prof.profiler.kineto_results.experimental_event_tree():
        walk(r, [], None)
    raw.sort(key=lambda x: x[0])
    open_allocs: dict[int, list] = {}
    for ev in raw:
        t, sz, _, ptr, op, _, _ = ev
        if sz > 0:
            open_allocs[ptr] = ev
        else:
            a = open_allocs.pop(ptr, None)
            if a is not None and ((a[4] is not None and t <= a[4][1]) or (a[6] is not None and t <= a[6][1])):
                a[5] = True
                ev[5] = True
    evs = [(t, sz, stack, ws) for t, sz, stack, _, _, ws, _ in raw]
    return result, evs, phases, marks


def summarize_profile(evs, phases, marks=None):
    order = sorted(phases.items(), key=lambda kv: kv[1][0])

    def phase_of(t):
        cur = None
        for name, (a, b) in order:
            if t >= a:
                cur = name
        return cur
    out = {}
    for tag, keep in (("", lambda ws: True), ("tensors_", lambda ws: not ws)):
        live = peak = 0
        at = None
        peak_of_phase: dict[str, int] = {}
        end_of_phase: dict[str, int] = {}
        n_alloc = n_free = 0
        for t, sz, stack, ws in evs:
            if not keep(ws):
                continue
            live += sz
            ph = phase_of(t)
            if sz > 0:
                n_alloc += 1
            else:
                n_free += 1
            if live > peak:
                peak = live
                at = (ph, list(stack), sz)
            if ph is not None:
                peak_of_phase[ph] = max(peak_of_phase.get(ph, 0), live)
                end_of_phase[ph] = live
        if tag == "":
            out.update({"peak_live_bytes": peak, "peak_phase": at[0] if at else None,
                        "peak_stack": at[1] if at else None, "peak_alloc_bytes": at[2] if at else None,
                        "peak_of_phase": peak_of_phase, "live_end_of_phase": end_of_phase, "allocations": n_alloc,
                        "frees": n_free, "net_bytes": live})
        else:
            out.update({"tensors_peak_live_bytes": peak, "tensors_peak_phase": at[0] if at else None,
                        "tensors_peak_stack": at[1] if at else None,
                        "tensors_peak_of_phase": peak_of_phase})
    out["workspace_allocations"] = sum(1 for e in evs if e[3] and e[1] > 0)
    out["workspace_max_bytes"] = max([e[1] for e in evs if e[3] and e[1] > 0], default=0)
    if marks:
        for k, t in marks.items():
            out[k] = sum(sz for tt, sz, _, _ in evs if tt <= t)
    return out


def run_step_profiled(model, opt, ids, autocast=None, loss_hook_module=None, optim_in_bwd=False):
    """One training step with record_function phases, under the profiler. Returns the summary."""
    from torch.profiler import record_function

    def fn():
        with record_function("phase:forward"):
            out = model(input_ids=ids, labels=ids, use_cache=False)
            loss = out.loss
            with record_function("mark:live_after_forward"):
                pass
            del out
        with record_function("phase:backward"):
            loss.backward()
            del loss
        if not optim_in_bwd:
            with record_function("phase:optimizer"):
                opt.step()
            with record_function("phase:zero_grad"):
                opt.zero_grad(set_to_none=True)
        return None
    _, evs, phases, marks = profiled_call(fn)
    summary = summarize_profile(evs, phases, marks)
    # the allocation trace of the step, compact: [bytes (+ alloc / - free), phase index, innermost op index]
    order = [k for k, _ in sorted(phases.items(), key=lambda kv: kv[1][0])]
    ops: dict[str, int] = {}
    rows = []
    for t, sz, stack, ws in evs:
        ph = None
        for i, name in enumerate(order):
            if t >= phases[name][0]:
                ph = i
        top = stack[-1] if stack else ""
        rows.append([sz, ph, ops.setdefault(top, len(ops)), int(ws)])
    summary["_trace"] = {"phases": order, "ops": list(ops), "fields": ["bytes", "phase", "op", "workspace"],
                         "events": rows}
    return summary, evs


# ====================================================================================================================
# compile=layer
# ====================================================================================================================

GRAPHS: dict[int, dict] = {}
UNREAD_NODES: set = set()  # autograd nodes inside a checkpoint whose saved tensors were not read
PROFILE_LOG: dict = {}  # the profiled step's allocation trace of the last compiled record


def install_partition_spy():
    # No cache hits: a hit from AOTAutograd's or Inductor's on-disk caches skips the partitioner (nothing to read).
    import torch._functorch.config
    import torch._inductor.config
    torch._functorch.config.enable_autograd_cache = False
    torch._inductor.config.fx_graph_cache = False
    torch._inductor.config.fx_graph_remote_cache = False
    import torch._inductor.compile_fx as CF
    from torch._functorch._aot_autograd import logging_utils as LU
    if getattr(CF.min_cut_rematerialization_partition, "_spy", False):
        return
    orig = CF.min_cut_rematerialization_partition

    def spy(joint_module, inputs, **kw):
        fw, bw = orig(joint_module, inputs, **kw)
        try:
            aot_id = int(LU.graph_being_compiled[0].split("_")[0])
        except Exception:
            aot_id = -1 - len(GRAPHS)
        GRAPHS[aot_id] = {"fw": fw, "bw": bw, "joint": joint_module, "num_fwd_outputs": kw.get("num_fwd_outputs")}
        return fw, bw
    spy._spy = True
    CF.min_cut_rematerialization_partition = spy


def _target_name(n) -> str:
    if n.op == "placeholder":
        return "input"
    t = n.target
    if hasattr(t, "overloadpacket"):
        return str(t.overloadpacket.__name__) if hasattr(t.overloadpacket, "__name__") else str(t)
    if hasattr(t, "__name__"):
        return t.__name__
    return str(t)


def _val_bytes(v) -> int:
    if isinstance(v, torch.Tensor):
        return v.numel() * v.element_size()
    return 0


def graph_analysis(g: dict):
    """Saved values of a partitioned region (fw outputs past the user outputs) with their producers, and the forward
    values the backward needs that the partitioner chose to recompute."""
    fw = g["fw"].graph
    outs = list(fw.find_nodes(op="output")[0].args[0])
    nfo = g["num_fwd_outputs"]
    saved_nodes = [n for n in outs[nfo:] if isinstance(n, torch.fx.Node) and isinstance(n.meta.get("val"),
                                                                                          torch.Tensor)]
    # forward inputs that are primals (parameters are primals too; tangents are not in fw)
    saved = []
    for n in saved_nodes:
        v = n.meta["val"]
        src = n
        chain = []
        while src.op == "call_function" and _target_name(src) in ("view", "reshape", "permute", "_unsafe_view",
                                                                   "transpose", "t", "expand", "slice",
                                                                   "unsqueeze", "squeeze", "alias", "select",
                                                                   "as_strided") and src.args:
            chain.append(_target_name(src))
            src = src.args[0]
        saved.append({"name": n.name, "producer": _target_name(src), "via": chain[::-1] or None,
                      "dtype": M.dtype_name(v.dtype), "shape": list(v.shape)})
    # recomputed: nodes of the backward graph that compute forward ops (no tangent in their ancestry)
    bw = g["bw"].graph
    tangent_dep = set()
    recomputed = []
    for n in bw.nodes:
        if n.op == "placeholder":
            if n.name.startswith("tangents"):
                tangent_dep.add(n)
            continue
        if n.op != "call_function":
            continue
        if any(isinstance(a, torch.fx.Node) and a in tangent_dep for a in n.all_input_nodes):
            tangent_dep.add(n)
            continue
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor) and _target_name(n) not in ("view", "reshape", "permute", "_unsafe_view",
                                                                   "t", "expand", "unsqueeze", "squeeze", "slice",
                                                                   "alias", "select", "transpose", "as_strided"):
            recomputed.append({"name": n.name, "op": _target_name(n), "dtype": M.dtype_name(v.dtype),
                               "shape": list(v.shape)})
    return saved, recomputed


def compile_layers(model, loss=True):
    for layer in decoder_layers(model):
        layer.compile()
    if loss:
        from transformers.loss.loss_utils import ForCausalLMLoss
        model.loss_function = torch.compile(ForCausalLMLoss)


def dynamo_counters():
    from torch._dynamo.utils import counters
    return {"unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "calls_captured": int(counters["stats"].get("calls_captured", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "graph_break_reasons": sorted(counters["graph_break"].keys())[:20]}


def compiled_saved(model, ids, ranges: SeqRanges, amp=False):
    """Forward once (compiled), then read every saved tensor from the autograd graph. Returns (entries, logits
    info, loss) with the graph still alive (the caller runs backward)."""
    ranges.active = True
    ranges.ranges = []
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp else contextlib.nullcontext()
    with ctx:
        out = model(input_ids=ids, labels=ids, use_cache=False)
    ranges.active = False
    loss, logits = out.loss, out.logits
    del out
    gc.collect()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    bufs = {b.untyped_storage().data_ptr() for b in model.buffers()}
    found: dict[int, dict] = {}
    regions = {}
    n_param = n_buf = 0
    nodes = walk_graph(loss.grad_fn)
    for node in sorted(nodes, key=lambda n: n._sequence_nr()):
        seq = node._sequence_nr()
        tensors, n_vc = node_saved_tensors(node)
        producers = None
        if node.name() == "CompiledFunctionBackward":
            aot_id = type(node)._forward_cls._aot_id
            g = GRAPHS.get(aot_id)
            # inside a checkpoint wrapped around a compiled region (torchtune's order: measure_tune_compile.py) the
            # node holds the checkpoint's holders, which are not read
            if g is not None and node not in UNREAD_NODES:
                if "analysis" not in g:
                    g["analysis"] = graph_analysis(g)
                producers = g["analysis"][0]
                if len(producers) != len(tensors):
                    raise SystemExit(f"aot graph {aot_id}: {len(producers)} saved values in the FX graph, "
                                     f"{len(tensors)} at runtime")
                for (attr, t), p in zip(tensors, producers):
                    if list(t.shape) != p["shape"] or M.dtype_name(t.dtype) != p["dtype"]:
                        raise SystemExit(f"aot graph {aot_id}: saved {attr} {list(t.shape)} {t.dtype} vs FX "
                                         f"{p['name']} {p['shape']} {p['dtype']}")
            regions.setdefault(aot_id, {"module": M.module_pattern(ranges.module_of(seq)), "nodes": 0})
            regions[aot_id]["nodes"] += 1
        for i, (attr, t) in enumerate(tensors):
            st = t.untyped_storage()
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
    lg_ptr = logits.untyped_storage().data_ptr()
    logits_info = {"bytes": logits.untyped_storage().nbytes(), "dtype": M.dtype_name(logits.dtype),
                   "shape": list(logits.shape), "is_saved": lg_ptr in found}
    ids_ptr = ids.untyped_storage().data_ptr()
    entries = sorted(found.values(), key=lambda e: e["seq"])
    extra = {"saved_parameter_storages": n_param, "saved_buffer_storages": n_buf,
             "ids_saved_bytes": found[ids_ptr]["bytes"] if ids_ptr in found else 0,
             "loss_bytes": loss.untyped_storage().nbytes(), "regions": regions,
             **({"unread_nodes": len(UNREAD_NODES)} if UNREAD_NODES else {})}
    del logits
    return entries, logits_info, loss, extra


def compile_then_read_saved(model, opt, ids, ranges: SeqRanges):
    """Step 1 (forward, backward, AdamW) compiles every region; then one more forward whose saved tensors are read from
    the autograd graph (``compiled_saved``), and its backward — no step: the states are those of step 1, like the
    grid's step 2. Returns (entries, logits_info, extra, saved_bytes, compile_seconds, dynamo counters after step 1).
    Shared by measure_lora_compile.py, measure_titan_compile.py and measure_torchao_nf4.py."""
    torch.manual_seed(M.DATA_SEED)
    t0 = time.time()
    one_step(model, opt, ids)
    compile_s = time.time() - t0
    counters_1 = dynamo_counters()
    entries, logits_info, loss, extra = compiled_saved(model, ids, ranges)
    saved_bytes = sum(e["bytes"] for e in entries)
    loss.backward()
    del loss
    opt.zero_grad(set_to_none=True)
    gc.collect()
    return entries, logits_info, extra, saved_bytes, compile_s, counters_1


def profiled_compiled_step(family, model, opt, ids, logits_info, extra, saved_bytes, counters_1):
    """After ``compile_then_read_saved``: the step profiled (no recompilation allowed), each compiled region's graphs
    and partition, and the step's record with its self-checks. Returns (step, regions, dynamo counters)."""
    state = T.optimizer_state_tensors(opt)
    pre = classify_preexisting(model, state, ids)
    del state
    prof, _ = run_step_profiled(model, opt, ids)
    PROFILE_LOG["trace"] = prof.pop("_trace")
    PROFILE_LOG["pre"] = pre
    counters_2 = dynamo_counters()
    if counters_2["unique_graphs"] != counters_1["unique_graphs"]:
        raise SystemExit(f"{family}: recompiled during the profiled step {counters_1} -> {counters_2}")
    lg = 0 if logits_info["is_saved"] else logits_info["bytes"]
    fwd_unexpl = prof["live_after_forward"] - (saved_bytes - extra["ids_saved_bytes"] + lg + extra["loss_bytes"])
    regions = []
    for aot_id, r in sorted(extra["regions"].items()):
        g = GRAPHS.get(aot_id, {})
        saved, recomputed = g.get("analysis", (None, None))
        regions.append({"aot_id": aot_id, "module": r["module"], "calls": r["nodes"],
                        "fw_graph_nodes": len(g["fw"].graph.nodes) if g else None,
                        "bw_graph_nodes": len(g["bw"].graph.nodes) if g else None,
                        "saved_values": saved, "recomputed_in_backward": recomputed})
    step = step_from_profile(prof, pre)
    step["checks"] = {"forward_unexplained": fwd_unexpl,
                      "backward_unexplained": prof["live_end_of_phase"].get("backward", 0) - param_info(model)[
                          "parameter_bytes"],
                      "end_of_step_net_bytes": prof["net_bytes"]}
    # tensors alive before the step that are none of parameters/states/buffers/batch: the compiled graphs' constants
    # (a `torch.tensor(...)` in the layer code becomes a constant of the compiled graph, e.g. gemma2's normalizer)
    step["compiled_constant_bytes"] = pre.get("other", 0)
    return step, regions, counters_2


def one_step(model, opt, ids):
    """One training step of a transformers model: forward with labels, backward, AdamW, zero_grad."""
    out = model(input_ids=ids, labels=ids, use_cache=False)
    loss = out.loss
    del out
    loss.backward()
    del loss
    opt.step()
    opt.zero_grad(set_to_none=True)


def measure_compile(family, dtype, attn, opts, recompute=None, scope="layer"):
    """compile=layer, optionally with checkpointing inside each compiled layer (torchtitan applies AC, then compiles
    each block: the checkpoint is traced by dynamo and the partitioner follows its policy tags). `scope="model"`:
    the whole model compiled, as the Trainer's `torch_compile=True` does (`Trainer._wrap_model`:
    `torch.compile(model)`; here `model.compile()`, the same graph): embedding, layers, head and the loss computed in
    `forward` from `labels`, one region unless dynamo breaks the graph."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    GRAPHS.clear()
    gc.collect()
    # eager reference first (the tracker's scan of live tensors must not meet the compiler's fake tensors)
    ref = eager_reference(family, dtype, attn)
    install_partition_spy()
    model = M.build_model(family, dtype, attn, 0.0, None)
    cfg = M.config_dict(model)
    ids = M.make_ids(model, B, S)
    layers = list(decoder_layers(model))
    if recompute == "full":
        # non-reentrant checkpoint of every layer (torchtitan FullAC: early_stop=False)
        from functools import partial
        from torch.utils.checkpoint import checkpoint
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for layer in layers:
            layer._gradient_checkpointing_func = partial(checkpoint, use_reentrant=False, preserve_rng_state=True,
                                                         determinism_check="default", early_stop=False)
    elif recompute == "op":
        from functools import partial
        from torch.utils.checkpoint import checkpoint
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        save_ops = _get_default_save_ops() | {CPU_SDPA}
        for i, layer in enumerate(layers):
            layer._gradient_checkpointing_func = partial(
                checkpoint, use_reentrant=False, preserve_rng_state=True, determinism_check="default",
                early_stop=False, context_fn=torchtitan_sac_context_fn(layer, f"layers.{i}", save_ops, None))
    # The whole model compiled: no hook inside it (dynamo would trace them and recompile when they flip on).
    ranges = SeqRanges(model, opaque=[model] if scope == "model" else layers)
    if scope == "model":
        model.compile()
    else:
        compile_layers(model)
    opt = torch.optim.AdamW(model.parameters())
    entries, logits_info, extra, saved_bytes, compile_s, counters_1 = compile_then_read_saved(model, opt, ids, ranges)
    step, regions, counters_2 = profiled_compiled_step(family, model, opt, ids, logits_info, extra, saved_bytes,
                                                       counters_1)
    # eager reference: the same model uncompiled, profiler vs tracker (how far the profiler's CPU allocations are
    # from the dispatch-level storages the grid's tracker counts)
    tag = f"compile={scope}" + (f"+recompute={recompute}" if recompute else "")
    rec = base_record(family, dtype, attn, model, cfg, tag)
    opts["cfg"] = cfg
    rec.update({"recipe": {"compile": True, "compile_regions": scope, "compiled_loss": True,
                           "recompute": recompute or "none",
                           **({"policy": "torchtitan 0.3.0 SelectiveAC (+ CPU SDPA)"} if recompute == "op" else {})},
                "saved_bytes": saved_bytes, "saved_storages": len(entries), "logits": logits_info,
                "saved_parameter_storages": extra["saved_parameter_storages"],
                "saved_buffer_storages": extra["saved_buffer_storages"],
                "dynamo": counters_2,
                "regions": regions, "step": step, "step_method": "torch.profiler memory events (CPU allocator)",
                "eager_reference": ref,
                "saved": aggregate_rows(entries)})
    opts.setdefault("timing", {})[rec["id"]] = compile_s
    ranges.remove()
    del model, opt
    torch._dynamo.reset()
    GRAPHS.clear()
    gc.collect()
    return rec


def step_from_profile(prof, pre):
    pre_total = sum(pre.values())
    return {"params_bytes": pre.get("parameter", 0), "optimizer_state_bytes": pre.get("optimizer_state", 0),
            "buffers_bytes": pre.get("buffer", 0), "batch_bytes": pre.get("batch", 0),
            "other_preexisting_bytes": pre.get("other", 0),
            "peak_live_bytes": prof["peak_live_bytes"], "measured_peak_bytes": pre_total + prof["peak_live_bytes"],
            "peak_phase": prof["peak_phase"], "peak_stack": prof["peak_stack"],
            "peak_alloc_bytes": prof["peak_alloc_bytes"],
            # without kernel-internal workspaces (the tracker's convention: what ops return)
            "tensors_peak_live_bytes": prof["tensors_peak_live_bytes"],
            "tensors_measured_peak_bytes": pre_total + prof["tensors_peak_live_bytes"],
            "tensors_peak_phase": prof["tensors_peak_phase"], "tensors_peak_stack": prof["tensors_peak_stack"],
            "workspace_allocations": prof["workspace_allocations"],
            "workspace_max_bytes": prof["workspace_max_bytes"],
            "live_after_forward": prof.get("live_after_forward"),
            "live_end_of_phase": prof["live_end_of_phase"], "peak_of_phase": prof["peak_of_phase"],
            "allocations": prof["allocations"], "frees": prof["frees"]}


def eager_reference(family, dtype, attn):
    """The grid's eager step on the same config, measured both ways: torch.profiler (as the compiled step) and the
    dispatch tracker (as the grid). Equal peaks mean the profiler counts what the tracker counts on this model."""
    model = M.build_model(family, dtype, attn, 0.0, None)
    ids = M.make_ids(model, B, S)
    opt = torch.optim.AdamW(model.parameters())
    torch.manual_seed(M.DATA_SEED)

    def plain():
        one_step(model, opt, ids)
    plain()
    gc.collect()
    state = T.optimizer_state_tensors(opt)
    pre = classify_preexisting(model, state, ids)
    del state
    prof, _ = run_step_profiled(model, opt, ids)
    prof.pop("_trace", None)
    tr = T.StepTracker(model, loss_after_module=model.get_output_embeddings())
    res = T.track_training_steps(model, opt, lambda s: {"input_ids": ids, "labels": ids}, steps=1, tracker=tr)
    tr.remove_hooks()
    s = res["steps"][0]
    out = {"profiler_peak_live_bytes": prof["peak_live_bytes"], "profiler_peak_phase": prof["peak_phase"],
           "profiler_tensors_peak_live_bytes": prof["tensors_peak_live_bytes"],
           "profiler_workspace_max_bytes": prof["workspace_max_bytes"],
           "profiler_peak_stack": prof["peak_stack"], "profiler_live_after_forward": prof["live_after_forward"],
           "tracker_peak_live_bytes": s["peak_live_bytes"], "tracker_peak_op": s["peak_op"],
           "tracker_live_after_forward": s["live_after_model_call"],
           "measured_peak_bytes": sum(pre.values()) + prof["peak_live_bytes"]}
    g = grid_record(family, dtype, attn)
    if g is not None:
        out["grid_id"] = g["id"]
        out["grid_saved_bytes"] = g["saved_bytes"]
        out["grid_measured_peak_bytes"] = g["step"]["measured_peak_bytes"]
    del model, opt, tr, res
    gc.collect()
    return out


def base_record(family, dtype, attn, model, cfg, recipe_tag):
    pi = param_info(model)
    return {"id": f"{family}/b{B}/s{S}/{dtype}/{attn}/{recipe_tag}", "family": family,
            "model_type": cfg["model_type"], "config_key": f"{family}/{cfg.get('dtype')}", "batch": B, "seq": S,
            "dtype": dtype, "attn": attn, **pi}


# ====================================================================================================================
# driver
# ====================================================================================================================

MEASURERS = {"compile=layer": measure_compile,
             "compile=layer+recompute=op": lambda f, d, a, o: measure_compile(f, d, a, o, recompute="op"),
             "compile=layer+recompute=full": lambda f, d, a, o: measure_compile(f, d, a, o, recompute="full"),
             "compile=model": lambda f, d, a, o: measure_compile(f, d, a, o, scope="model")}


def main():
    global S, B
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--only", default=None, help="substring of the record id")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--families", default=None)
    ap.add_argument("--seq", type=int, default=S, help="sequence length (default 64; the compile formulas are "
                    "also checked at 128)")
    ap.add_argument("--batch", type=int, default=B, help="batch size (default 2)")
    ap.add_argument("--attn", default=None, help="attention for every record (default: sdpa where transformers "
                    "accepts it, else eager)")
    ap.add_argument("--child", nargs=5, metavar=("FAMILY", "DTYPE", "ATTN", "RECIPE", "OUT_JSON"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    S = args.seq
    B = args.batch
    global ATTN_OVERRIDE
    ATTN_OVERRIDE = args.attn
    if args.child:
        family, dtype, attn, recipe, out_json = args.child
        opts: dict = {}
        rec = MEASURERS[recipe](family, dtype, attn, opts)
        if "trace" in PROFILE_LOG:
            write_step_log(rec, DEFAULT_OUT)
        with open(out_json, "w") as f:
            json.dump({"record": rec, "cfg": opts.get("cfg")}, f)
        return
    refused = {}
    for family in M.FAMILIES:
        why = M.attn_refusal(family)
        if why is not None:
            refused[family] = {"sdpa": why}
    families = args.families.split(",") if args.families else list(M.FAMILIES)
    recipes = args.recipes.split(",")
    os.makedirs(args.out, exist_ok=True)
    opts: dict = {}
    by_family: dict[str, tuple[dict, list]] = {}
    n_fail = 0
    t_start = time.time()
    for family in families:
        attn = attn_for(family, refused)
        for dtype in DTYPES:
            for recipe in recipes:
                rid = f"{family}/b{B}/s{S}/{dtype}/{attn}/{recipe}"
                if args.only and args.only not in rid:
                    continue
                t0 = time.time()
                try:
                    rec, cfg = measure_one(args, family, dtype, attn, recipe, opts)
                except (Exception, SystemExit) as e:  # noqa: BLE001 - one failing record must not stop the others
                    n_fail += 1
                    print(f"FAILED {rid}: {type(e).__name__}: {str(e)[-2000:]}", file=sys.stderr, flush=True)
                    continue
                configs, records = by_family.setdefault(family, ({}, []))
                if cfg is not None:
                    configs[rec["config_key"]] = cfg
                records.append(rec)
                bad = {k: v for k, v in rec["step"].get("checks", {}).items() if v not in (0, [], True, None)}
                if bad:
                    n_fail += 1
                    print(f"CHECK {rid}: {bad}", file=sys.stderr)
                st = rec["step"]
                print(f"{rid}: saved {rec['saved_bytes']} B; peak {st['measured_peak_bytes']} B "
                      f"({st.get('peak_phase')}) {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
        if family in by_family:  # each family's shard as soon as it is done (merged by id)
            configs, records = by_family.pop(family)
            write_shard(args.out, family, configs, records, refused)
            write_index(args.out, refused)
    print(f"done in {time.time() - t_start:.0f}s; {n_fail} records with a failed check", file=sys.stderr)
    if n_fail:
        sys.exit(1)


def measure_one(args, family, dtype, attn, recipe, opts):
    if recipe in MEASURERS:
        # torch.compile leaves objects behind (dynamo caches hold old modules' buffers, the graphs' constants): each
        # compiled record runs in a fresh interpreter so that nothing it leaves is counted as memory by the next one
        return run_child(family, dtype, attn, recipe)
    LAST_LOG.clear()
    rec = measure_eager_recipe(family, dtype, attn, recipe, opts)
    cfg = opts.pop("cfg", None)
    if "log" in LAST_LOG:
        log = {"id": rec["id"], "summary": {k: rec["step"].get(k) for k in (
            "peak_live_bytes", "measured_peak_bytes", "peak_phase", "peak_op", "peak_module", "peak_node")},
            **LAST_LOG.pop("log")}
        os.makedirs(os.path.join(args.out, "steps"), exist_ok=True)
        with open(os.path.join(args.out, "steps", M.step_log_name(rec["id"])), "w") as f:
            f.write(M.dump_log(log))
    return rec, cfg


def run_child(family, dtype, attn, recipe):
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rec.json")
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--seq", str(S), "--batch", str(B), "--child", family, dtype,
                            attn, recipe, out],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0 or not os.path.exists(out):
            tail = "\n".join(r.stdout.splitlines()[-30:])
            raise SystemExit(f"{family}/{dtype}/{attn}/{recipe}: child failed ({r.returncode}):\n{tail}")
        d = json.load(open(out))
    return d["record"], d["cfg"]


def write_shard(out_dir, family, configs, records, refused):
    path = os.path.join(out_dir, f"{family}.json")
    if os.path.exists(path):
        old = json.load(open(path))
        new_ids = {r["id"] for r in records}
        records = [r for r in old["records"] if r["id"] not in new_ids] + records
        configs = {**old["configs"], **configs}
    order = {r: i for i, r in enumerate(RECIPES + EXTRA_RECIPES)}
    records.sort(key=lambda r: (DTYPES.index(r["dtype"]), order.get(r["id"].split("/", 5)[5], 99), r["id"]))
    used = {r["config_key"] for r in records}
    configs = {k: configs[k] for k in sorted(configs) if k in used}
    model_type, _, features = M.FAMILIES[family]
    doc = {"generated_by": "validation/measure_recipes.py (issue 26 recipes; see validation/README.md)",
           "torch": torch.__version__.split("+")[0], "transformers": transformers.__version__, "device": "cpu",
           "seeds": {"model": M.MODEL_SEED, "data": M.DATA_SEED}, "family": family, "model_type": model_type,
           "features": features, "refused": refused.get(family, {}), "configs": configs, "records": records}
    with open(path, "w") as f:
        f.write(M.dump(doc))


def write_index(out_dir, refused):
    files = []
    total = 0
    for family in M.FAMILIES:
        path = os.path.join(out_dir, f"{family}.json")
        if not os.path.exists(path):
            continue
        doc = json.load(open(path))
        recs = doc["records"]
        total += len(recs)
        files.append({"family": family, "file": f"{family}.json", "records": len(recs),
                      "recipes": sorted({r["id"].split("/", 5)[5] for r in recs})})
    index = {"generated_by": "validation/measure_recipes.py", "torch": torch.__version__.split("+")[0],
             "transformers": transformers.__version__, "device": "cpu", "records": total, "families": files}
    with open(os.path.join(out_dir, "index.json"), "w") as f:
        f.write(json.dumps(index, indent=1) + "\n")


# ====================================================================================================================
# eager recipes: the dispatch tracker (validation/tracker.py) sees everything
# ====================================================================================================================

def tracked_steps(model, opt, ids, steps=2, forward=None, optimizer_phase=True, on_forward=None, state_fn=None,
                  log_events=False, before_step=None):
    """tracker.track_training_steps with a custom forward (``forward(model, ids) -> (loss, output)``), an optional
    optimizer phase (off for optimizer-in-backward) and an optimizer-state getter."""
    tr = T.StepTracker(model, loss_after_module=model.get_output_embeddings())
    params = list(model.parameters())
    results = []
    state_fn = state_fn or (lambda: T.optimizer_state_tensors(opt))
    for step in range(steps):
        if before_step is not None:
            before_step(step)
        grads = [p.grad for p in params if p.grad is not None]
        tr.begin_step({"parameter": params, "gradient": grads, "optimizer_state": state_fn(),
                       "buffer": list(model.buffers()), "batch": [ids]})
        del grads
        with tr:
            tr.phase("forward")
            loss, out = forward(model, ids)
            if tr.current_phase == "forward":
                tr.phase("loss")
            gc.collect()
            live_fwd = tr.live_bytes
            if on_forward is not None:
                on_forward(tr, out, loss, step)
            del out
            gc.collect()
            tr.phase("backward")
            loss.backward()
            del loss
            gc.collect()
            if optimizer_phase:
                tr.phase("optimizer")
                opt.step()
                gc.collect()
                tr.phase("zero_grad")
                opt.zero_grad(set_to_none=True)
            tr.end_step()
        s = tr.summary()
        s["live_after_model_call"] = live_fwd
        s["still_alive"] = [dict(ev) for ev in tr.live_storages()]
        s["events"] = tr.events
        if log_events:
            s["log"] = tr.compact_log()
        results.append(s)
    tr.remove_hooks()
    return results


def hf_forward(model, ids):
    out = model(input_ids=ids, labels=ids, use_cache=False)
    return out.loss, out


def step_summary(s2, s1, grads_bytes):
    pre = s2["preexisting_bytes"]
    end = s2["live_end_of_phase"]
    if "log" in s2:
        LAST_LOG["log"] = {"step": 2, "preexisting_bytes": pre, "peak_event": s2["peak_event"], **s2["log"]}
    return {"params_bytes": pre.get("parameter", 0), "optimizer_state_bytes": pre.get("optimizer_state", 0),
            "buffers_bytes": pre.get("buffer", 0), "batch_bytes": pre.get("batch", 0),
            "other_preexisting_bytes": pre.get("other", 0),
            "peak_live_bytes": s2["peak_live_bytes"], "measured_peak_bytes": sum(pre.values()) + s2["peak_live_bytes"],
            "peak_phase": s2["peak_phase"], "peak_op": s2["peak_op"], "peak_module": s2["peak_module"],
            "peak_node": s2["peak_node"], "live_after_forward": s2["live_after_model_call"],
            "live_after_output_dropped": end.get("loss"), "live_after_backward": end.get("backward"),
            "live_after_step": end.get("optimizer"), "live_after_zero_grad": end.get("zero_grad"),
            "peak_of_phase": s2["peak_of_phase"], "ops": s2["ops"],
            "first_step_peak_live_bytes": s1["peak_live_bytes"],
            "first_step_measured_peak_bytes": sum(s1["preexisting_bytes"].values()) + s1["peak_live_bytes"],
            "first_step_peak_phase": s1["peak_phase"], "first_step_peak_op": s1["peak_op"],
            "optimizer_impl": s2["optimizer_impl_ran"],
            "step_method": "validation/tracker.py (dispatch-level live storages)"}


def checkpoint_setup(model, recipe, sac_logs, allow_mutation=False):
    """Apply the recipe's checkpointing to the decoder layers; returns (checkpointed layer indices, kwargs note)."""
    from functools import partial
    from torch.utils.checkpoint import checkpoint
    layers = list(decoder_layers(model))
    if recipe in ("recompute=op", "recompute=op-literal"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        save_ops = _get_default_save_ops()
        if recipe == "recompute=op":
            save_ops = save_ops | {CPU_SDPA}
        for i, layer in enumerate(layers):
            log = []
            sac_logs.append((i, log))
            layer._gradient_checkpointing_func = partial(
                checkpoint, use_reentrant=False, preserve_rng_state=True, determinism_check="default",
                early_stop=False, context_fn=_recording_context_fn(
                    torchtitan_sac_context_fn(layer, f"layers.{i}", save_ops, log, allow_mutation=allow_mutation),
                    i, sac_logs))
        return list(range(len(layers)))
    if recipe == "recompute_every=2":
        # torchtitan v0.2.2 _apply_layer_sac: the block whose 1-based count is divisible by N is wrapped
        # (ptd_checkpoint_wrapper, use_reentrant=False, early_stop=False)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        done = []
        for i, layer in enumerate(layers):
            layer.gradient_checkpointing = (i + 1) % 2 == 0
            layer._gradient_checkpointing_func = partial(checkpoint, use_reentrant=False, preserve_rng_state=True,
                                                         determinism_check="default", early_stop=False)
            if layer.gradient_checkpointing:
                done.append(i)
        return done
    if recipe == "recompute_every=2-hf":
        model.activation_checkpointing_enable(every_n_layers=2)
        return [i for i, layer in enumerate(layers) if layer.gradient_checkpointing]
    return []


SAC_STORES: list = []
LAST_LOG: dict = {}  # the event log of the last tracked step 2 (written to <out>/steps/ by main)


def _recording_context_fn(context_fn, layer_idx, sac_logs):
    def fn():
        fwd, rec = context_fn()
        SAC_STORES.append((layer_idx, fwd.storage))
        return fwd, rec
    return fn


def _checkpoint_saved(family, dtype, attn, recipe, allow_mutation=False):
    """Saved bytes under a checkpointing recipe: measure.py's hooks + graph walk (checkpoint frames, closures,
    everything outside the checkpointed layers) + the SAC cache. Returns plain data only."""
    model = M.build_model(family, dtype, attn, 0.0, None)
    cfg = M.config_dict(model)
    sac_logs: list = []
    SAC_STORES.clear()
    ckpt_layers = checkpoint_setup(model, recipe, sac_logs, allow_mutation=allow_mutation)
    ids = M.make_ids(model, B, S)
    params = list(model.parameters())
    param_ptrs = M.storage_ptrs(params)
    buffer_ptrs = M.storage_ptrs(list(model.buffers()))
    cap = M.Capture(model)
    torch.manual_seed(M.DATA_SEED)
    cap.active = True
    mod_log: list = []
    orig_logged = globals()["_logged"]

    def logged_with_module(log, ctx, func, policy, mm_count):
        if log is not None and not ctx.is_recompute:
            mod_log.append((id(log), str(func), cap.current_module()))
        return orig_logged(log, ctx, func, policy, mm_count)
    globals()["_logged"] = logged_with_module
    try:
        with cap.hooks():
            out = model(input_ids=ids, labels=ids, use_cache=False)
    finally:
        globals()["_logged"] = orig_logged
    cap.active = False
    loss, logits = out.loss, out.logits
    gc.collect()
    cap.attribute(loss.grad_fn)
    storages: dict[int, dict] = {}
    for ev, ref in zip(cap.events, cap.refs):
        if ref() is None or (ev["kind"] == "packed" and ev["op"] is None):
            continue
        if ev["ptr"] in param_ptrs or ev["ptr"] in buffer_ptrs:
            continue
        storages.setdefault(ev["ptr"], ev)
    # the SAC cache (torch 2.15: storage[op][call index] = the op's outputs wrapped, or _RECOMPUTE), per layer; the
    # module of each call comes from the policy log (one policy call per dispatched op, in order)
    from torch.utils.checkpoint import _RECOMPUTE
    sac_entries = []
    logs_by_id = {id(log): i for i, log in sac_logs}
    calls: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for log_id, func, mod in mod_log:
        calls[logs_by_id[log_id]][func].append(mod)
    per_layer_mods: dict[int, list] = defaultdict(list)
    for log_id, func, mod in mod_log:
        per_layer_mods[logs_by_id[log_id]].append((func, mod))
    n_sac = 0
    for layer_idx, store in SAC_STORES:
        for key, by_idx in store.items():
            func = key[0] if isinstance(key, tuple) else key
            for k in sorted(by_idx):
                o = by_idx[k]
                if o is _RECOMPUTE:
                    continue
                mods_f = calls[layer_idx][str(func)]
                mod = mods_f[k] if k < len(mods_f) else f"model.layers.{layer_idx}"
                flat = torch.utils._pytree.tree_flatten(o)[0]
                for j, w in enumerate(flat):
                    t = getattr(w, "val", w)
                    if not isinstance(t, torch.Tensor):
                        continue
                    st = t.untyped_storage()
                    ptr = st.data_ptr()
                    n_sac += 1
                    if ptr in param_ptrs or ptr in buffer_ptrs or ptr in storages or st.nbytes() == 0:
                        continue
                    ev = {"idx": 10 ** 9 + len(sac_entries), "kind": "sac", "ptr": ptr, "nbytes": st.nbytes(),
                          "shape": list(t.shape), "dtype": M.dtype_name(t.dtype), "module": mod,
                          "op": "SACCache", "attr": f"{str(func).replace('aten.', '')}[{j}]"}
                    storages[ptr] = ev
                    sac_entries.append(ev)
    entries = [{"module": ev["module"], "op": ev["op"] or "?", "attr": ev["attr"] or "?", "dtype": ev["dtype"],
                "shape": ev["shape"], "bytes": ev["nbytes"]} for ev in sorted(storages.values(),
                                                                               key=lambda e: e["idx"])]
    saved_bytes = sum(ev["nbytes"] for ev in storages.values())
    ids_ptr = ids.untyped_storage().data_ptr()
    ids_saved = storages[ids_ptr]["nbytes"] if ids_ptr in storages else 0
    logits_info = {"bytes": logits.untyped_storage().nbytes(), "dtype": M.dtype_name(logits.dtype),
                   "shape": list(logits.shape), "is_saved": logits.untyped_storage().data_ptr() in storages}
    policy = None
    if sac_logs:
        # every op the policy saw in the forward, per layer: [op, saved?, mm count, module, [[storage bytes, dtype,
        # shape] of each tensor output]]
        policy = []
        for i, log in sac_logs:
            mods_i = per_layer_mods[i]
            policy.append([[func.replace("aten.", ""), saved, mm_count, M.module_pattern(mod), outs]
                           for (func, saved, mm_count, outs), (_, mod) in zip(log, mods_i)])
    del out, logits
    loss.backward()
    del loss
    cap.remove()
    for ref in cap.refs:
        obj = ref()
        if isinstance(obj, M.Packed):
            obj.t = None
    SAC_STORES.clear()
    return dict(cfg=cfg, ckpt_layers=ckpt_layers, entries=entries, saved_bytes=saved_bytes, ids_saved=ids_saved,
                logits_info=logits_info, policy=policy, n_storages=len(storages),
                sac_cache_bytes=sum(e["nbytes"] for e in sac_entries), n_sac=n_sac,
                closure_bytes=sum(e["nbytes"] for e in storages.values() if e["kind"] == "closure"))


def measure_checkpoint_recipe(family, dtype, attn, recipe, opts):
    """recompute=op / op-literal / recompute_every=2 / 2-hf: saved bytes and the tracked step."""
    # torchtitan's policy saves topk's outputs; models that modify them in place (mixtral's router:
    # `router_top_value /= router_top_value.sum(...)`) make the recompute raise "Tensor cached during selective
    # activation checkpoint has been mutated" in backward. The error is recorded and the recipe measured again with
    # create_selective_checkpoint_contexts(..., allow_cache_entry_mutation=True) (same tensors kept, no check).
    policy_error = None
    allow = False
    try:
        r = _checkpoint_saved(family, dtype, attn, recipe)
    except RuntimeError as e:
        if "mutated" not in str(e):
            raise
        policy_error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        SAC_STORES.clear()
        gc.collect()
        allow = True
        r = _checkpoint_saved(family, dtype, attn, recipe, allow_mutation=True)
    gc.collect()
    cfg, ckpt_layers, entries, saved_bytes = r["cfg"], r["ckpt_layers"], r["entries"], r["saved_bytes"]
    ids_saved, logits_info, policy = r["ids_saved"], r["logits_info"], r["policy"]
    opts["cfg"] = cfg
    # the step, tracked, on a fresh model
    model2 = M.build_model(family, dtype, attn, 0.0, None)
    ids = M.make_ids(model2, B, S)
    checkpoint_setup(model2, recipe, [], allow_mutation=allow)
    SAC_STORES.clear()
    opt = torch.optim.AdamW(model2.parameters())
    fwd = {}

    def on_forward(tr, out, loss, step):
        lg = out.logits
        fwd[step] = (tr.live_bytes, 0 if lg.untyped_storage().data_ptr() not in tr.live or logits_info["is_saved"]
                     else lg.untyped_storage().nbytes(), loss.untyped_storage().nbytes())
    torch.manual_seed(M.DATA_SEED)
    s1, s2 = tracked_steps(model2, opt, ids, forward=hf_forward, on_forward=on_forward, log_events=True)
    SAC_STORES.clear()
    pi = param_info(model2)
    step = step_summary(s2, s1, pi["parameter_bytes"])
    live_fwd, lg_b, loss_b = fwd[1]
    step["checks"] = {"forward_unexplained": live_fwd - (saved_bytes - ids_saved + lg_b + loss_b),
                      "backward_unexplained": s2["live_end_of_phase"].get("backward", 0) - pi["parameter_bytes"],
                      "end_of_step_alive": [f"{e['op']}@{e['module']} {e['bytes']}" for e in s2["still_alive"]],
                      "unclassified_preexisting": s2["preexisting_bytes"].get("other", 0)}
    rec = base_record(family, dtype, attn, model2, cfg, recipe)
    rc = {"recompute": "op" if recipe.startswith("recompute=op") else "full",
          "checkpointed_layers": ckpt_layers, "checkpoint": "torch.utils.checkpoint non-reentrant"}
    if recipe.startswith("recompute=op"):
        rc.update({"policy": "torchtitan 0.3.0 SelectiveAC", "cpu_sdpa_saved": recipe == "recompute=op",
                   "early_stop": False, "allow_cache_entry_mutation": allow})
        if policy_error:
            rc["torchtitan_as_is"] = policy_error
    elif recipe == "recompute_every=2":
        rc.update({"recompute_every": 2, "policy": "torchtitan v0.2.2 _apply_layer_sac (1-based count % N == 0)",
                   "early_stop": False})
    else:
        rc.update({"recompute_every": 2, "policy": "transformers 5.24 activation_checkpointing_enable("
                                                   "every_n_layers=2) (index % N == 0)", "early_stop": True})
    rec.update({"recipe": rc, "saved_bytes": saved_bytes, "saved_storages": r["n_storages"], "logits": logits_info,
                "sac_cache_bytes": r["sac_cache_bytes"], "sac_cached_tensors": r["n_sac"],
                "checkpoint_closure_bytes": r["closure_bytes"], "step": step})
    if policy is not None:
        rec["sac_ops"] = policy
    rec["saved"] = aggregate_rows(entries)
    del model2, opt
    gc.collect()
    return rec


class _StateView:
    """What tracker.optimizer_state_tensors needs from per-parameter optimizers: one `.state` mapping."""

    def __init__(self, optims):
        self.optims = optims

    @property
    def state(self):
        merged = {}
        for o in self.optims:
            merged.update(o.state)
        return merged


def measure_optim_in_bwd(family, dtype, attn, opts):
    """torchtune's optimizer_in_bwd (torchtune/training/memory.py register_optim_in_bwd_hooks, 0.6.1): one AdamW per
    parameter, stepped and zeroed (set_to_none) in the parameter's post-accumulate-grad hook."""
    model = M.build_model(family, dtype, attn, 0.0, None)
    cfg = M.config_dict(model)
    opts["cfg"] = cfg
    ids = M.make_ids(model, B, S)
    optim_dict = {p: torch.optim.AdamW([p]) for p in model.parameters()}

    def optim_step(param) -> None:
        optim_dict[param].step()
        optim_dict[param].zero_grad()
    handles = [p.register_post_accumulate_grad_hook(optim_step) for p in model.parameters() if p.requires_grad]
    view = _StateView(list(optim_dict.values()))
    fwd = {}

    def on_forward(tr, out, loss, step):
        fwd[step] = tr.live_bytes
    torch.manual_seed(M.DATA_SEED)
    s1, s2 = tracked_steps(model, view, ids, forward=hf_forward, optimizer_phase=False, on_forward=on_forward,
                           state_fn=lambda: T.optimizer_state_tensors(view), log_events=True)
    for h in handles:
        h.remove()
    pi = param_info(model)
    step = step_summary(s2, s1, pi["parameter_bytes"])
    g = grid_record(family, dtype, attn)
    # the optimizer's ops run inside backward: their module is the parameter being updated only in the optimizer
    # phase, so the tracker names the autograd node instead
    step["checks"] = {"backward_unexplained": s2["live_end_of_phase"].get("backward", 0),
                      "end_of_step_alive": [f"{e['op']}@{e['module']} {e['bytes']}" for e in s2["still_alive"]],
                      "unclassified_preexisting": s2["preexisting_bytes"].get("other", 0),
                      "forward_matches_grid": (g is None or fwd[1] == g["step"]["live_after_forward"])}
    # the same step with a plain AdamW (optimizer phase after backward), same shape: the comparison at shapes the
    # grid does not have
    del model, optim_dict, view
    gc.collect()
    model = M.build_model(family, dtype, attn, 0.0, None)
    opt = torch.optim.AdamW(model.parameters())
    torch.manual_seed(M.DATA_SEED)
    LAST = dict(LAST_LOG)
    p1, p2 = tracked_steps(model, opt, ids, forward=hf_forward)
    LAST_LOG.clear()
    LAST_LOG.update(LAST)
    plain = step_summary(p2, p1, 0)
    LAST_LOG.clear()
    LAST_LOG.update(LAST)
    rec = base_record(family, dtype, attn, model, cfg, "optim_in_bwd")
    rec["plain_adamw_step"] = {k: plain[k] for k in ("measured_peak_bytes", "peak_live_bytes", "peak_phase", "peak_op",
                                                     "peak_node", "live_after_forward", "live_after_backward",
                                                     "peak_of_phase")}
    rec.update({"recipe": {"optim_in_bwd": True, "optimizer": "torch.optim.AdamW per parameter (defaults)",
                           "hook": "register_post_accumulate_grad_hook: step(); zero_grad(set_to_none=True)"},
                "saved_bytes": g["saved_bytes"] if g else None,
                "saved_bytes_source": g["id"] if g else None,
                "grid_measured_peak_bytes": g["step"]["measured_peak_bytes"] if g else None,
                "step": step, "saved": []})
    del model, opt
    gc.collect()
    return rec


# --------------------------------------------------------------------------------------------------------------------
# activation offloading, ported to a machine without a GPU
# --------------------------------------------------------------------------------------------------------------------

class _NoStream:
    def wait_event(self, ev):
        pass

    def wait_stream(self, s):
        pass

    def record_event(self):
        return None


def _host_copy(t, contiguous=False, ledger=None):
    """The pinned host buffer: made with every dispatch mode off, so the tracker (device memory) does not see it.
    `ledger` (the context) counts the live host bytes exactly: + at the copy, - when the buffer is freed."""
    with _disable_current_modes():
        h = torch.empty(t.size(), dtype=t.dtype) if contiguous else torch.empty_like(t, device="cpu")
        h.copy_(t)
    if ledger is not None:
        n = h.untyped_storage().nbytes()
        ledger.host_bytes += n
        ledger.host_peak = max(ledger.host_peak, ledger.host_bytes)
        ledger.host_total += n
        weakref.finalize(h.untyped_storage(), _host_freed, weakref.ref(ledger), n)
    return h


def _host_freed(ledger_ref, n):
    ledger = ledger_ref()
    if ledger is not None:
        ledger.host_bytes -= n


def _device_copy(h):
    """`.to("cuda", non_blocking=True)` of a host buffer: the allocation is made under the tracker (device memory),
    the copy itself outside it (the host buffer is not device memory)."""
    d = torch.empty_strided(h.size(), h.stride(), dtype=h.dtype)
    with _disable_current_modes():
        d.copy_(h)
    return d


class CpuOffloadActivations(torch.autograd.graph.saved_tensors_hooks):
    """torchtune 0.6.1 torchtune/training/_activation_offloading.py OffloadActivations (use_pin_memory=True,
    use_streams=True, max_fwd_stash_size=5, min_offload_size=1024), line for line, with these substitutions for a
    machine without a GPU: CUDA streams and events are no-ops (every copy completes at once), the pinned host
    buffer is an ordinary CPU tensor made outside the tracker's view, `.to("cuda")` is a tracked allocation of the same
    size and strides, `record_stream` is a no-op. Every pack is logged (`self.log`)."""

    def __init__(self, use_streams=True, max_fwd_stash_size=5, min_offload_size=1024, where=None):
        self.use_streams = use_streams
        self.min_tensor_size_bytes = min_offload_size
        self.tracker = {}
        self.tensor_id = 0
        self.is_first_forward_call = True
        self.is_first_backward_call = True
        self.is_first_forward_pass = True
        self.s0 = _NoStream()
        self.where = where  # (tensor) -> dict: module/producer, for the log
        self.log: list = []
        self.host_bytes = 0
        self.host_peak = 0
        self.h2d_copies = 0
        self.stash_hits = 0
        self.host_total = 0
        if self.use_streams:
            self.s1 = _NoStream()
            self.fwd_stash = {}
            self.max_fwd_stash_size = max_fwd_stash_size
            self.bwd_tensor_stash = {}
            self.bwd_ev_stash = {}
            self.curr_graph_id = None
            self.curr_autograd_node = None

        def get_tensor_id() -> int:
            self.tensor_id += 1
            return self.tensor_id

        def get_num_bytes_tensor(x) -> int:
            return x.element_size() * x.nelement()

        def pack_tensor(activation):
            if self.is_first_forward_call:
                assert len(self.tracker) == 0, "backward pass should have cleared tracker of all tensors"
                self.is_first_forward_call = False
                self.is_first_backward_call = True
            num_bytes = get_num_bytes_tensor(activation)
            tensor_id = get_tensor_id()
            entry = {"id": tensor_id, "bytes": num_bytes, "storage_bytes": activation.untyped_storage().nbytes(),
                     "dtype": M.dtype_name(activation.dtype), "shape": list(activation.shape),
                     "is_parameter": isinstance(activation, torch.nn.Parameter)}
            if self.where is not None:
                entry.update(self.where(activation))
            if num_bytes >= self.min_tensor_size_bytes and (
                    not isinstance(activation, torch.nn.Parameter) and not isinstance(activation, torch.nn.Buffer)):
                if self.use_streams:
                    for id_ in [k for k in self.fwd_stash.keys()]:
                        if id_ <= tensor_id - self.max_fwd_stash_size:
                            _, ev = self.fwd_stash[id_]
                            self.s0.wait_event(ev)
                            del self.fwd_stash[id_]
                        else:
                            break
                    self.s1.wait_stream(self.s0)
                cpu_tensor = _host_copy(activation, ledger=self)
                self.tracker[tensor_id] = (cpu_tensor, True)
                if self.use_streams:
                    event = self.s1.record_event()
                    self.fwd_stash[tensor_id] = (activation, event)
                entry["decision"] = "offloaded"
            else:
                self.tracker[tensor_id] = (activation, False)
                entry["decision"] = "kept: < min_offload_size" if num_bytes < self.min_tensor_size_bytes else \
                    "kept: Parameter/Buffer"
            self.log.append(entry)
            return tensor_id

        def unpack_tensor_with_streams(unpack_tensor_id):
            if self.is_first_backward_call:
                self.curr_graph_id = torch._C._current_graph_task_id()

                def wait_and_del_remaining_references() -> None:
                    for id_ in [k for k in self.bwd_tensor_stash.keys()]:
                        event = self.bwd_ev_stash[id_]
                        self.s1.wait_event(event)
                        del self.bwd_tensor_stash[id_]
                torch.autograd.variable.Variable._execution_engine.queue_callback(wait_and_del_remaining_references)
                if self.is_first_forward_pass:
                    self.is_first_forward_pass = False
                self.is_first_backward_call = False
                self.is_first_forward_call = True
            assert unpack_tensor_id in self.tracker, f"untracked tensor with id {unpack_tensor_id}"
            maybe_gpu_tensor, modified = self.tracker[unpack_tensor_id]
            if modified:
                graph_id = torch._C._current_graph_task_id()
                node = torch._C._current_autograd_node()
                prev_node_ids = []
                if graph_id == self.curr_graph_id and self.curr_autograd_node != node:
                    self.curr_autograd_node = node
                    prev_node_ids = [id_ for id_ in self.bwd_tensor_stash.keys()]
                brought_back_from_cpu = True
                if unpack_tensor_id in self.fwd_stash:
                    maybe_gpu_tensor = self.fwd_stash[unpack_tensor_id][0]
                    brought_back_from_cpu = False
                    self.stash_hits += 1
                else:
                    host = maybe_gpu_tensor
                    maybe_gpu_tensor = _device_copy(host)
                    self.h2d_copies += 1
                    self.s0.wait_stream(self.s1)
                    self.bwd_tensor_stash[unpack_tensor_id] = maybe_gpu_tensor
                    storage_refcount = torch._C._storage_Use_Count(maybe_gpu_tensor.untyped_storage()._cdata)

                def hook(outputs, inputs):
                    if brought_back_from_cpu:
                        unpacked_tensor = self.bwd_tensor_stash[unpack_tensor_id]
                        if torch._C._storage_Use_Count(unpacked_tensor.untyped_storage()._cdata) > storage_refcount:
                            # unpacked_tensor.record_stream(self.s0): no-op here
                            del self.bwd_tensor_stash[unpack_tensor_id]
                        else:
                            event = self.s0.record_event()
                            self.bwd_ev_stash[unpack_tensor_id] = event
                    for id_ in [k for k in self.fwd_stash.keys()]:
                        _, ev = self.fwd_stash[id_]
                        self.s0.wait_event(ev)
                        del self.fwd_stash[id_]
                    for id_ in prev_node_ids:
                        event = self.bwd_ev_stash[id_]
                        self.s1.wait_event(event)
                        del self.bwd_tensor_stash[id_]
                    return outputs
                node.register_hook(hook)
            del self.tracker[unpack_tensor_id]
            return maybe_gpu_tensor

        super().__init__(pack_tensor, unpack_tensor_with_streams)


class CpuSaveOnCpu(torch.autograd.graph.saved_tensors_hooks):
    """torch.autograd.graph.save_on_cpu(pin_memory=True) (torch 2.15 autograd/graph.py): every saved tensor is copied
    to a new contiguous (pinned) host buffer of its size; unpack copies it back to the device (`.to(device)`). Same
    substitutions as CpuOffloadActivations."""

    def __init__(self, where=None):
        self.log: list = []
        self.host_bytes = 0
        self.host_peak = 0
        self.host_total = 0
        self.h2d_copies = 0

        def pack_to_cpu(tensor):
            entry = {"bytes": tensor.element_size() * tensor.nelement(),
                     "storage_bytes": tensor.untyped_storage().nbytes(), "dtype": M.dtype_name(tensor.dtype),
                     "shape": list(tensor.shape), "is_parameter": isinstance(tensor, torch.nn.Parameter),
                     "decision": "offloaded"}
            if where is not None:
                entry.update(where(tensor))
            self.log.append(entry)
            packed = _host_copy(tensor, contiguous=True, ledger=self)
            return (tensor.device, packed)

        def unpack_from_cpu(packed):
            device, tensor = packed
            self.h2d_copies += 1
            return _device_copy(tensor)

        super().__init__(pack_to_cpu, unpack_from_cpu)


# Transformer Engine 2.20.2's per-layer activation offloading (`act_offload_layers`), ported to a machine without a GPU
# --------------------------------------------------------------------------------------------------------------------

TE_MIN_NUMEL = 256 * 1024  # OffloadableLayerState._check_if_offload: "at least 256k elements"


class CpuTeLayerState:
    """transformer_engine 2.20.2 pytorch/cpu_offload.py OffloadableLayerState (retain_pinned_cpu_buffers=False) and
    TensorGroupProcessor, line for line, with the substitutions of CpuOffloadActivations: streams and events are no-ops
    (every copy completes at once), the pinned host buffer (`torch.empty_like(t, device="cpu", pin_memory=True)`) is
    an ordinary CPU tensor made outside the tracker's view, a reload (`torch.empty_like(t, device="cuda")`) is a
    tracked allocation, `t.device.type == "cuda"` reads "cpu"."""

    def __init__(self, ledger):
        self.ledger = ledger
        self.fwd = []  # fwd_gpu_tensor_group.tensor_list
        self.cpu = []  # cpu_tensor_group.tensor_list
        self.bwd = []  # bwd_gpu_tensor_group.tensor_list
        self.aux = {}
        self.state = "not_offloaded"

    def start_offload(self):
        assert self.state == "not_offloaded", self.state
        self.state = "offload_started"
        # tensor_group_process_before_offload: _switch_to_base_tensors, then _deduplicate_tensors
        views = []
        for i, t in enumerate(self.fwd):
            if getattr(t, "offload_base_tensor", False) or (t._base is not None and t._base.numel() == t.numel()):
                views.append((t.shape, t.stride(), t.storage_offset()))
                self.fwd[i] = t._base
            else:
                views.append(None)
        dedup, index, original = [], {}, []
        for t in self.fwd:
            if id(t) not in index:
                index[id(t)] = len(dedup)
                dedup.append(t)
            original.append(index[id(t)])
        self.fwd = dedup
        for i, t in enumerate(self.fwd):
            if not t.is_contiguous():
                raise ValueError(f"Tensor at index {i} must be contiguous for CPU offloading, but got non-contiguous "
                                 f"tensor with shape={t.shape}, stride={t.stride()}, dtype={t.dtype}")
            self.cpu.append(_host_copy(t, ledger=self.ledger))
            self.ledger.offloaded.append({"shape": list(t.shape), "dtype": M.dtype_name(t.dtype),
                                          "bytes": t.numel() * t.element_size()})
        self.aux = {"views": views, "original_tensor_ids": original}

    def release_activation_forward_gpu_memory(self):
        assert self.state == "offload_started", self.state
        self.state = "offload_finished"
        self.fwd = []

    def start_reload(self):
        assert self.state == "offload_finished", self.state
        self.state = "reload_started"
        bwd = [_device_copy(h) for h in self.cpu]
        bwd = [bwd[j] for j in self.aux["original_tensor_ids"]]  # _restore_tensor_duplicates
        self.bwd = [t.as_strided(*v) if v is not None else t for t, v in zip(bwd, self.aux["views"])]

    def push_tensor(self, t):
        assert self.state == "not_offloaded", self.state
        if self._check_if_offload(t):
            self.fwd.append(t)
            return len(self.fwd) - 1
        return t

    def pop_tensor(self, x):
        assert self.state in ("not_offloaded", "reload_started"), self.state
        if isinstance(x, torch.Tensor):
            return x
        if self.state == "not_offloaded":
            return self.fwd[x]
        return self.bwd[x]

    def release_all_memory(self):
        self.fwd = []
        self.cpu = []
        self.bwd = []
        self.state = "not_offloaded"

    def _check_if_offload(self, t):
        entry = {"shape": list(t.shape), "dtype": M.dtype_name(t.dtype), "numel": t.numel(),
                 "contiguous": t.is_contiguous(), "is_parameter": isinstance(t, torch.nn.Parameter),
                 "layer": self.ledger.num_of_fwds}
        self.ledger.log.append(entry)
        if t.numel() < TE_MIN_NUMEL:
            entry["decision"] = "kept: < 256K elements"
            return False
        if not isinstance(t, torch.nn.Parameter) and not getattr(t, "_TE_do_not_offload", False):
            if not t.is_contiguous() and not getattr(t, "offload_base_tensor", False):
                entry["decision"] = "kept: not contiguous"
                return False
            entry["decision"] = "pushed"
            return True
        entry["decision"] = "kept: Parameter"
        return False


class CpuTeLayerOffload:
    """transformer_engine 2.20.2 pytorch/cpu_offload.py `get_cpu_offload_context(enabled=True, num_layers=n,
    model_layers=L)` (DefaultOffloadSynchronizer and _CpuOffloadContext), line for line but for the CpuTeLayerState
    substitutions; applied as Megatron-Core's TransformerBlock applies it (`with self.offload_context: hidden_states =
    layer(...)`, then `hidden_states = self.group_prefetch_offload_commit_async(hidden_states)`) around each of
    transformers' decoder layers."""

    def __init__(self, n, num_layers):
        if n > num_layers - 1:
            raise ValueError("Cannot offload all layers without manual synchronization - last layer is not offloaded.")
        self.num_layers = num_layers
        self.log, self.offloaded = [], []
        self.host_bytes = self.host_peak = self.host_total = 0
        self.layer_states = {i: CpuTeLayerState(self) for i in range(num_layers)}
        self.num_of_fwds = None
        self.previous_bwd_layer_id = None
        self.current_layer_id = None
        self.offload_layer_map = {i: i < n for i in range(num_layers)}
        self.finish_offload_map = defaultdict(list)
        self.start_reload_map = defaultdict(list)
        for i in range(n):
            self.finish_offload_map[num_layers - n + i].append(i)
            self.start_reload_map[num_layers - 1 - n + i].append(i)
        self.inside = False
        self.current_layer = None

    # OffloadSynchronizer / DefaultOffloadSynchronizer
    def fwd_step(self):
        if self.num_of_fwds in (None, self.num_layers - 1):
            for s in self.layer_states.values():
                s.release_all_memory()
            self.num_of_fwds = 0
        else:
            self.num_of_fwds += 1
        self.current_layer_id = self.num_of_fwds
        if self.offload_layer_map.get(self.current_layer_id - 1, False):
            self.layer_states[self.current_layer_id - 1].start_offload()
        for layer in self.finish_offload_map[self.current_layer_id]:
            self.layer_states[layer].release_activation_forward_gpu_memory()
        return self.current_layer_id

    def bwd_step(self, layer_num):
        if self.previous_bwd_layer_id is not None:
            self.layer_states[self.previous_bwd_layer_id].release_all_memory()
        self.previous_bwd_layer_id = layer_num
        self.current_layer_id = layer_num
        for layer in self.start_reload_map[layer_num]:
            self.layer_states[layer].start_reload()

    def push_tensor(self, t):
        if not self.offload_layer_map.get(self.num_of_fwds, False):
            return t
        return self.layer_states[self.num_of_fwds].push_tensor(t)

    def pop_tensor(self, x):
        return self.layer_states[self.current_layer_id].pop_tensor(x)

    def finish_part_of_bwd(self):
        if self.previous_bwd_layer_id is not None:
            self.layer_states[self.previous_bwd_layer_id].release_all_memory()
        self.previous_bwd_layer_id = None

    # _CpuOffloadContext
    def __enter__(self):
        assert not self.inside
        self.inside = True
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.push_tensor, self.pop_tensor)
        self._hooks.__enter__()
        self.current_layer = self.fwd_step()
        return self

    def __exit__(self, *args):
        self._hooks.__exit__(*args)
        self.inside = False

    def synchronization_function(self, tensor):
        assert tensor.requires_grad and self.current_layer is not None and not self.inside
        cur = self.current_layer

        def hook(_):
            torch.autograd.variable.Variable._execution_engine.queue_callback(self.finish_part_of_bwd)
            self.bwd_step(cur)
        tensor.grad_fn.register_prehook(hook)
        return tensor


def measure_te_offload(family, dtype, attn, recipe, opts):
    n = int(recipe.split("=", 1)[1])
    model = M.build_model(family, dtype, attn, 0.0, None)
    cfg = M.config_dict(model)
    opts["cfg"] = cfg
    ids = M.make_ids(model, B, S)
    opt = torch.optim.AdamW(model.parameters())
    layers = list(decoder_layers(model))
    hooks: dict = {}
    originals = []
    for layer in layers:
        orig = layer.forward
        originals.append((layer, orig))

        def fwd(*a, _orig=orig, **k):
            ctx = hooks["ctx"]
            with ctx:
                out = _orig(*a, **k)
            return ctx.synchronization_function(out)
        layer.forward = fwd

    def forward(model, ids):
        # Megatron's TransformerBlock keeps one context for the run; its fwd_step resets every layer's state at the
        # first layer of each forward. One per step here (the states are empty between steps either way).
        hooks["ctx"] = CpuTeLayerOffload(n, len(layers))
        out = model(input_ids=ids, labels=ids, use_cache=False)
        return out.loss, out
    fwd_host = {}

    def on_forward(tr, out, loss, step):
        fwd_host[step] = (hooks["ctx"].host_bytes, hooks["ctx"].host_total)
    torch.manual_seed(M.DATA_SEED)
    s1, s2 = tracked_steps(model, opt, ids, forward=forward, on_forward=on_forward, log_events=True)
    for layer, orig in originals:
        layer.forward = orig
    ctx = hooks["ctx"]
    pi = param_info(model)
    step = step_summary(s2, s1, pi["parameter_bytes"])
    step["checks"] = {"backward_unexplained": s2["live_end_of_phase"].get("backward", 0) - pi["parameter_bytes"],
                      "end_of_step_alive": [f"{e['op']}@{e['module']} {e['bytes']}" for e in s2["still_alive"]],
                      "unclassified_preexisting": s2["preexisting_bytes"].get("other", 0),
                      "host_bytes_after_backward": ctx.host_bytes}
    step["host_bytes_after_forward"] = fwd_host[1][0]
    step["host_bytes_copied_in_forward"] = fwd_host[1][1]
    step["host_peak_bytes"] = ctx.host_peak
    rows: dict[tuple, dict] = {}
    for e in ctx.log:
        key = (e["layer"], e["decision"], e["dtype"], tuple(e["shape"]), e["contiguous"], e["is_parameter"])
        r = rows.setdefault(key, {"layer": key[0], "decision": key[1], "dtype": key[2], "shape": list(key[3]),
                                  "contiguous": key[4], "is_parameter": key[5], "count": 0})
        r["count"] += 1
    rec = base_record(family, dtype, attn, model, cfg, recipe)
    rec.update({"recipe": {"act_offload_layers": n, "num_layers": len(layers),
                           "code": "transformer_engine 2.20.2 pytorch/cpu_offload.py get_cpu_offload_context "
                                   "(DefaultOffloadSynchronizer), ported (CpuTeLayerOffload); around each decoder layer "
                                   "as Megatron-Core's TransformerBlock", "min_numel": TE_MIN_NUMEL},
                "saved_bytes": None, "step": step, "packed": list(rows.values()),
                "offloaded": ctx.offloaded, "offloaded_bytes": sum(e["bytes"] for e in ctx.offloaded), "saved": []})
    del model, opt
    gc.collect()
    return rec


def measure_offload(family, dtype, attn, recipe, opts):
    kind, _, ckpt = recipe.split("=", 1)[1].partition("+")
    model = M.build_model(family, dtype, attn, 0.0, None)
    if ckpt:
        # transformers' gradient checkpointing (GradientCheckpointingLayer: `checkpoint(partial(forward, self,
        # **kwargs), *args)`, non-reentrant): torch.utils.checkpoint's `_CheckpointFrame.save_inputs` makes the
        # positional tensors SavedVariables under the hooks active at the call (the offloading context), before the
        # checkpoint's own `_checkpoint_hook` is pushed; the recomputation unpacks them through the outer hook
        assert ckpt in ("recompute=full", "recompute=op"), recipe
        if ckpt == "recompute=op":
            # torchtitan's SelectiveAC with the CPU's SDPA kernel saved (`recompute=op`): checkpoint_setup
            checkpoint_setup(model, ckpt, [])
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    cfg = M.config_dict(model)
    opts["cfg"] = cfg
    ids = M.make_ids(model, B, S)
    opt = torch.optim.AdamW(model.parameters())
    param_ptrs = M.storage_ptrs(list(model.parameters()))
    state = {"tr": None}

    def where(t):
        tr = state["tr"]
        ptr = t.untyped_storage().data_ptr()
        if tr is None:
            return {}
        module = tr._stack[-1] if tr._stack else ""
        if ptr in param_ptrs:
            return {"module": module, "producer": "parameter (view)" if not isinstance(t, torch.nn.Parameter)
                    else "parameter"}
        if ptr in tr.preexisting:
            return {"module": module, "producer": tr.preexisting[ptr][0]}
        e = tr.live.get(ptr)
        return {"module": module, "producer": tr.events[e[0]]["op"] if e else "?"}
    hooks: dict = {}
    head = model.get_output_embeddings()

    if kind == "torchtune":
        # torchtune's recipes: `with self.activations_handling_ctx: logits = self._model(**batch)`, the loss
        # outside it; get_act_offloading_ctx_manager wraps the output head in a NoOpManager (pre/post hooks).
        def make_ctx():
            ctx = CpuOffloadActivations(where=where)
            noop = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
            hooks["ctx"] = ctx
            return ctx, noop
        noop_holder = {}
        h1 = head.register_forward_pre_hook(lambda *a: noop_holder["noop"].__enter__())
        h2 = head.register_forward_hook(lambda *a: noop_holder["noop"].__exit__(None, None, None), always_call=True)

        def forward(model, ids):
            ctx, noop = make_ctx()
            noop_holder["noop"] = noop
            if hasattr(model, "tune_loss_step"):
                # torchtune's own model (measure_tune_offload.py): `_loss_step` with the context around `self._model`
                return model.tune_loss_step(ids, ctx)
            with ctx:
                out = model(input_ids=ids, use_cache=False)
            loss = model.loss_function(out.logits, ids, vocab_size=model.config.vocab_size)
            return loss, out
    else:
        h1 = h2 = None

        def forward(model, ids):
            ctx = CpuSaveOnCpu(where=where)
            hooks["ctx"] = ctx
            with ctx:
                out = model(input_ids=ids, labels=ids, use_cache=False)
            return out.loss, out
    fwd = {}

    def on_forward(tr, out, loss, step):
        fwd[step] = {"live": tr.live_bytes, "host": hooks["ctx"].host_bytes, "host_total": hooks["ctx"].host_total}

    def before_step(step):
        prev = hooks.get("ctx")
        if prev is not None and getattr(prev, "tracker", None):
            # torchtune keeps one OffloadActivations for the whole run: its next forward would fail
            # `assert len(self.tracker) == 0, "backward pass should have cleared tracker of all tensors"` because
            # tensors packed by nodes that never run in backward (a dead subgraph) stay in its tracker. We record it
            # and measure with one context per step (as if the leftovers were dropped before the next step).
            hooks["as_is"] = (f"AssertionError: backward pass should have cleared tracker of all tensors "
                              f"({len(prev.tracker)} packed tensors of a dead subgraph never unpacked)")
            prev.tracker.clear()
        gc.collect()

    # the tracker object is needed inside `where`: wrap tracked_steps' StepTracker creation
    orig_cls = T.StepTracker

    class _Tr(orig_cls):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            state["tr"] = self
    T.StepTracker = _Tr
    try:
        torch.manual_seed(M.DATA_SEED)
        s1, s2 = tracked_steps(model, opt, ids, forward=forward, on_forward=on_forward, log_events=True,
                               before_step=before_step)
    finally:
        T.StepTracker = orig_cls
    for h in (h1, h2):
        if h is not None:
            h.remove()
    ctx = hooks["ctx"]
    pi = param_info(model)
    step = step_summary(s2, s1, pi["parameter_bytes"])
    g = grid_record(family, dtype, attn, "ckpt1" if ckpt == "recompute=full" else "ckpt0") if ckpt != "recompute=op" \
        else None
    step["checks"] = {"backward_unexplained": s2["live_end_of_phase"].get("backward", 0) - pi["parameter_bytes"],
                      "end_of_step_alive": [f"{e['op']}@{e['module']} {e['bytes']}" for e in s2["still_alive"]],
                      "unclassified_preexisting": s2["preexisting_bytes"].get("other", 0),
                      "host_bytes_after_backward": ctx.host_bytes if kind == "torchtune" else 0}
    step["host_bytes_after_forward"] = fwd[1]["host"]
    step["host_bytes_copied_in_forward"] = fwd[1]["host_total"]
    if kind == "torchtune":
        # entries packed but never unpacked (their host copies stay in OffloadActivations.tracker)
        left = set(ctx.tracker)
        step["never_unpacked"] = [{k: e.get(k) for k in ("module", "producer", "dtype", "shape", "bytes",
                                                          "decision")} for e in ctx.log if e["id"] in left]
        # the last step's leftovers: their tensors hold the dead subgraph's autograd nodes and, through them, the
        # parameters (qwen3_next's A_log): alive, they were counted as the next record's preexisting memory
        ctx.tracker.clear()
    step["host_peak_bytes"] = ctx.host_peak
    step["h2d_copies"] = ctx.h2d_copies
    step["unpacked_from_fwd_stash"] = getattr(ctx, "stash_hits", 0)
    rows: dict[tuple, dict] = {}
    for e in ctx.log:
        key = (M.module_pattern(e.get("module", "")), e.get("producer", "?"), e["decision"], e["dtype"],
               tuple(e["shape"]), e["bytes"], e["storage_bytes"])
        layer = M.layer_index(e.get("module", ""))
        r = rows.get(key)
        if r is None:
            r = rows[key] = {"module": key[0], "producer": key[1], "decision": key[2], "dtype": key[3],
                             "shape": list(key[4]), "bytes": key[5], "storage_bytes": key[6], "count": 0,
                             "layers": []}
        r["count"] += 1
        if layer is not None and layer not in r["layers"]:
            r["layers"].append(layer)
    for r in rows.values():
        if not r["layers"]:
            del r["layers"]
    moved = [e for e in ctx.log if e["decision"] == "offloaded"]
    rec = base_record(family, dtype, attn, model, cfg, recipe)
    if hooks.get("as_is"):
        step["checks"]["host_bytes_after_backward"] = 0  # the dead subgraph's copies: reported in never_unpacked
    rec.update({"recipe": {"act_offload": kind, **({"torchtune_as_is": hooks["as_is"]} if hooks.get("as_is") else {}),
                           **({"min_offload_size": 1024, "max_fwd_stash_size": 5, "use_streams": True,
                               "use_pin_memory": True, "output_head_noop": "lm_head",
                               "loss": "outside the offload context (torchtune recipes)"} if kind == "torchtune" else
                              {"pin_memory": True, "scope": "the model call, HF's loss inside"}),
                           **({"recompute": "full", "checkpoint": "transformers gradient_checkpointing_enable("
                               "use_reentrant=False): positional inputs saved under the outer hooks"}
                              if ckpt == "recompute=full" else {}),
                           **({"recompute": "op", "policy": "torchtitan 0.3.0 SelectiveAC (+ CPU SDPA)",
                               "early_stop": False, "checkpoint": "torch.utils.checkpoint non-reentrant, context_fn: "
                               "positional inputs saved under the outer hooks"} if ckpt == "recompute=op" else {})},
                "saved_bytes": g["saved_bytes"] if g else None, "saved_bytes_source": g["id"] if g else None,
                "grid_live_after_forward": g["step"]["live_after_forward"] if g else None,
                "grid_measured_peak_bytes": g["step"]["measured_peak_bytes"] if g else None,
                "packs": len(ctx.log), "offloaded_tensors": len(moved),
                "offloaded_bytes": sum(e["bytes"] for e in moved),
                "kept_bytes": sum(e["bytes"] for e in ctx.log if e["decision"] != "offloaded"),
                "step": step, "packed": list(rows.values()), "saved": []})
    del model, opt
    gc.collect()
    return rec


def measure_paged8bit(family, dtype, attn, opts):
    """bitsandbytes 0.50.2 PagedAdamW8bit (defaults: 8-bit blockwise states for parameters of >= min_8bit_size 4096
    elements, fp32 states below; paged = cudaMallocManaged only for states of >= 1e5 elements). On a CPU,
    Optimizer8bit.get_state_buffer falls back to ordinary tensors (it warns "Paged optimizers are not supported on
    CPU"): the state sizes and the step's temporaries of the CPU kernel are measured, the paging is not (see
    FINDINGS.md §15.6). Needs bitsandbytes importable (validation/README.md: the .venv26 environment)."""
    import bitsandbytes as bnb
    # tensors bitsandbytes creates at import (its CPU backend's 16-entry NF4/FP4 code tables): alive before every
    # step, not optimizer state
    gc.collect()
    lib_bytes = 0
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor) and not isinstance(o, torch._subclasses.FakeTensor) and o.device.type == "cpu":
            try:
                lib_bytes += o.untyped_storage().nbytes()
            except (RuntimeError, NotImplementedError):
                pass
    model = M.build_model(family, dtype, attn, 0.0, None)
    cfg = M.config_dict(model)
    opts["cfg"] = cfg
    ids = M.make_ids(model, B, S)
    opt = bnb.optim.PagedAdamW8bit(model.parameters())
    torch.manual_seed(M.DATA_SEED)
    s1, s2 = tracked_steps(model, opt, ids, forward=hf_forward, log_events=True)
    pi = param_info(model)
    step = step_summary(s2, s1, pi["parameter_bytes"])
    by_key: dict[str, int] = {}
    seen = set()
    n8 = n32 = 0
    would_page = 0
    for p_, st in opt.state.items():
        if st["state1"].dtype == torch.uint8:
            n8 += 1
        else:
            n32 += 1
        if p_.numel() >= 1e5:
            would_page += sum(st[k].untyped_storage().nbytes() for k in ("state1", "state2") if k in st)
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() not in seen:
                seen.add(v.untyped_storage().data_ptr())
                by_key[k] = by_key.get(k, 0) + v.untyped_storage().nbytes()
    step["checks"] = {"backward_unexplained": s2["live_end_of_phase"].get("backward", 0) - pi["parameter_bytes"],
                      "step_unexplained": s2["live_end_of_phase"].get("optimizer", 0) - pi["parameter_bytes"],
                      "end_of_step_alive": [f"{e['op']}@{e['module']} {e['bytes']}" for e in s2["still_alive"]],
                      "unclassified_preexisting": s2["preexisting_bytes"].get("other", 0) - lib_bytes,
                      "state_matches": sum(by_key.values()) == s2["preexisting_bytes"].get("optimizer_state", 0)}
    step["library_constant_bytes"] = lib_bytes
    g = grid_record(family, dtype, attn)
    rec = base_record(family, dtype, attn, model, cfg, "optim=paged_adamw8bit")
    rec.update({"recipe": {"optimizer": "bitsandbytes 0.50.2 PagedAdamW8bit (defaults)", "bitsandbytes": bnb.__version__,
                           "paged_on_this_machine": False},
                "optimizer_state_bytes_by_key": dict(sorted(by_key.items())),
                "params_8bit_states": n8, "params_fp32_states": n32,
                "parameter_numels": [p_.numel() for p_ in model.parameters()],
                "state_bytes_paged_on_cuda": would_page,
                "saved_bytes": g["saved_bytes"] if g else None, "saved_bytes_source": g["id"] if g else None,
                "grid_measured_peak_bytes": g["step"]["measured_peak_bytes"] if g else None,
                "grid_adamw_state_bytes": (g["adamw"]["state_bytes"] + g["adamw"]["step_bytes"]) if g else None,
                "step": step, "saved": []})
    del model, opt
    gc.collect()
    return rec


def measure_grid_like(family, dtype, attn, recipe, opts):
    """measure.py's own record (saved tensors + tracked step) for the anchors of the deep variants."""
    spec = dict(family=family, batch=B, seq=S, dtype=dtype, attn=attn,
                checkpoint_mode=None if recipe == "eager" else "non_reentrant", dropout=0.0, extra=True, log=True)
    rec, cfg, _, log = M.measure(spec)
    rec["id"] = f"{family}/b{B}/s{S}/{dtype}/{attn}/{recipe}"
    rec["config_key"] = f"{family}/{cfg.get('dtype')}"
    rec["recipe"] = {"recompute": "none" if recipe == "eager" else "full",
                     "measured_by": "validation/measure.py measure() (the grid's code)"}
    opts["cfg"] = cfg
    if log is not None:
        log["id"] = rec["id"]
        LAST_LOG["log"] = {k: v for k, v in log.items() if k not in ("id", "summary")}
    return rec


def measure_eager_recipe(family, dtype, attn, recipe, opts):
    torch._dynamo.reset()
    gc.collect()
    if recipe in ("eager", "recompute=full"):
        return measure_grid_like(family, dtype, attn, recipe, opts)
    if recipe.startswith("recompute"):
        return measure_checkpoint_recipe(family, dtype, attn, recipe, opts)
    if recipe == "optim_in_bwd":
        return measure_optim_in_bwd(family, dtype, attn, opts)
    if recipe.startswith("act_offload_layers="):
        return measure_te_offload(family, dtype, attn, recipe, opts)
    if recipe.startswith("act_offload"):
        return measure_offload(family, dtype, attn, recipe, opts)
    if recipe == "optim=paged_adamw8bit":
        return measure_paged8bit(family, dtype, attn, opts)
    raise SystemExit(f"unknown recipe {recipe}")


def adamw_state_bytes(opt) -> tuple[int, int]:
    """AdamW's states as measure.py records them: (exp_avg + exp_avg_sq bytes, the `step` counters' bytes)."""
    state = step = 0
    for st in opt.state.values():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                if k == "step":
                    step += v.numel() * v.element_size()
                else:
                    state += v.numel() * v.element_size()
    return state, step


def write_step_log(rec: dict, out_dir: str) -> None:
    """Step 2's allocation trace of the record just measured (torch.profiler memory events, ``PROFILE_LOG``) as
    ``<out_dir>/steps/<id>.json``, next to the tracker's event logs."""
    d = os.path.join(out_dir, "steps")
    os.makedirs(d, exist_ok=True)
    log = {"id": rec["id"], "step": 2, "source": "torch.profiler memory events (c10 CPU allocator)",
           "preexisting_bytes": PROFILE_LOG["pre"],
           "summary": {k: rec["step"].get(k) for k in ("peak_live_bytes", "measured_peak_bytes", "peak_phase",
                                                       "peak_stack")},
           **PROFILE_LOG["trace"]}
    with open(os.path.join(d, M.step_log_name(rec["id"])), "w") as f:
        f.write(M.dump_log(log))


def run_child_into(cmd: list, out_doc_path: str, doc: dict, label: str) -> bool:
    """Run one record's child process (``cmd`` + a temporary result path it writes ``{record, cfg}`` to), merge the
    record into ``doc`` (replacing one with the same id, sorted by id), write ``doc`` to ``out_doc_path`` and print
    a one-line summary. Returns False (after printing the child's output tail) when the child failed."""
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rec.json")
        r = subprocess.run(cmd + [out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0 or not os.path.exists(out):
            print(f"FAILED {label}:\n{r.stdout[-4000:]}", file=sys.stderr, flush=True)
            return False
        got = json.load(open(out))
    rec = got["record"]
    doc["configs"][rec["config_key"]] = got["cfg"]
    doc["records"] = [x for x in doc["records"] if x["id"] != rec["id"]] + [rec]
    doc["records"].sort(key=lambda x: x["id"])
    with open(out_doc_path, "w") as f:
        f.write(M.dump(doc))
    st = rec["step"]
    bad = {k: v for k, v in st["checks"].items() if v not in (0, None)}
    print(f"{rec['id']}: saved {rec['saved_bytes']} B; peak {st['measured_peak_bytes']} B ({st['peak_phase']}) "
          f"tensors peak {st.get('tensors_measured_peak_bytes')} checks {bad or 'ok'} {time.time() - t0:.0f}s",
          file=sys.stderr, flush=True)
    return True


if __name__ == "__main__":
    main()
