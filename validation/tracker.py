#!/usr/bin/env python3
"""A dispatch-level tracker of live storages over whole training steps (trainmem's ground truth for the step).

Self-contained (imports only torch and the standard library) so that it can be pasted into a generated
"verify on your GPU" script; runs on CPU and CUDA alike.

What it measures
----------------
* Every storage that an aten op (as seen by a ``TorchDispatchMode``, i.e. below autograd, after composite ops are
  decomposed) outputs during a step is an **allocation**: its storage's full ``nbytes`` (views of one storage count
  once), dtype, shape of the first tensor seen on it, the aten op, the module on top of the module stack, the phase,
  and in backward the autograd node being evaluated.
* A storage that an op *reads* but that was neither alive before the step nor output by a traced op (tensors made by
  ``torch.tensor(...)`` from Python data, e.g. AdamW's ``step`` counters at the first step) is recorded as an
  allocation when first read (``op`` = ``<untraced:CONSUMER>``).
* **Frees** are exact: each tracked storage carries a ``weakref`` to its (preserved) Python storage object, whose
  callback fires when the C++ ``StorageImpl`` is released. A free is attributed to the phase, and to the last op
  dispatched before it (``after_op``).
* ``live`` = Σ nbytes of tracked storages (allocated during the step and not yet freed); ``peak`` = its maximum,
  evaluated after every allocation. Storages alive when the step starts (parameters, buffers, gradients, optimizer
  states, the batch, anything else the caller holds) are classified once, by a scan of every tensor the garbage
  collector knows, and are not part of ``live``.
* Not visible at dispatch granularity: memory a kernel allocates and frees internally (workspaces, the temporaries
  of a composite-explicit kernel), and allocator rounding/caching (``memory_allocated`` on CUDA rounds each block up
  to 512 bytes; see trainmem's allocator simulator).

Phases: ``forward`` (the model call) → ``loss`` (everything after the output-embedding module (lm_head) returns,
until the caller has taken the loss and dropped the model output) → ``backward`` → ``optimizer`` (``.step()``) →
``zero_grad``. The caller marks phases with ``tracker.phase(name)``; the switch to ``loss`` happens automatically
in the post-forward hook of ``loss_after_module``.

Module attribution: forward/recompute ops get the module on top of a stack kept by forward pre/post hooks on every
module of the model. Backward ops get the module whose forward created the autograd node being evaluated
(``torch._C._current_autograd_node()``; modules are mapped to the ranges of autograd sequence numbers they created in
the forward). Optimizer ops get the name of the parameter they update.

Usage::

    tracker = StepTracker(model, loss_after_module=model.get_output_embeddings())
    result = track_training_steps(model, optimizer, make_batch, steps=2, tracker=tracker)
    result["steps"][1]   # steady state: the second step

Run ``python tracker.py`` for a small self-test on a tiny model (needs transformers).
"""

from __future__ import annotations

import contextlib
import gc
import warnings
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

PHASES = ("forward", "loss", "backward", "optimizer", "zero_grad")


def _dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def _storage_of(t):
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse, nested, ... tensors without a plain storage
        return None


class StepTracker(TorchDispatchMode):
    """Live storages at dispatch granularity. Enter it (``with tracker:``) around one step at a time."""

    def __init__(self, model=None, loss_after_module=None, device: str | None = None):
        super().__init__()
        self.model = model
        # Only storages on this device type count (on a GPU, host tensors such as the profiler's record_function
        # handles or the checkpoint's CPU RNG state are not device memory). Default: the model's parameters' device.
        if device is None and model is not None:
            device = next(model.parameters()).device.type
        self.device = device
        self.other_device_allocs = 0
        self._loss_after = loss_after_module
        self._names = {}
        self._param_names = {}
        self._handles = []
        self._stack: list[str] = []
        self._ranges: list[tuple[int, int, int, str]] = []  # (seq_start, seq_end, depth, module) of this step
        self._open: list[list] = []
        self._range_cache: dict[int, str] = {}
        if model is not None:
            self._names = {id(m): (n or "(root)") for n, m in model.named_modules()}
            for n, p in model.named_parameters(remove_duplicate=False):
                self._param_names.setdefault(p.untyped_storage().data_ptr(), n)
            for m in model.modules():
                self._handles.append(m.register_forward_pre_hook(self._pre))
                self._handles.append(m.register_forward_hook(self._post, always_call=True))
        self._generation = 0
        self._reset_step()

    # ---------------------------------------------------------------------------------------------- bookkeeping
    def _reset_step(self):
        self._generation = getattr(self, "_generation", 0) + 1
        self.current_phase = "idle"
        self.live: dict[int, list] = {}  # data_ptr -> [alloc event index, nbytes, weakref]
        self.live_bytes = 0
        self.peak = 0
        self.peak_at: dict | None = None
        self.events: list[dict] = []  # allocations and frees in order (kept for the summary even without logging)
        self.n_ops = {p: 0 for p in PHASES}
        self.op_index = 0
        self.last_op = ""
        self.phase_end_live: dict[str, int] = {}
        self.phase_peak: dict[str, int] = {}
        self.preexisting: dict[int, tuple[str, int]] = {}
        self.optimizer_ops: set[str] = set()
        self.aliases = 0
        self.other_device_allocs = 0
        self._last_param = ""
        self._stack = []
        self._ranges = []
        self._open = []
        self._range_cache = {}

    def remove_hooks(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    def begin_step(self, classes: dict[str, list] | None = None):
        """Start a step: classify every storage alive now (``classes`` = name -> tensors, checked in order; any other
        tensor the garbage collector finds is ``other``)."""
        self._reset_step()
        gc.collect()
        pre: dict[int, tuple[str, int]] = {}
        for cls, tensors in (classes or {}).items():
            for t in tensors:
                st = _storage_of(t)
                if st is not None and st.nbytes() > 0 and self._counted(t) and st.data_ptr() not in pre:
                    pre[st.data_ptr()] = (cls, st.nbytes())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # isinstance() on deprecated lazy module attributes warns
            for obj in gc.get_objects():
                if isinstance(obj, torch.Tensor) and self._counted(obj):
                    st = _storage_of(obj)
                    if st is not None and st.nbytes() > 0 and st.data_ptr() not in pre:
                        pre[st.data_ptr()] = ("other", st.nbytes())
        self.preexisting = pre

    def preexisting_bytes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for cls, n in self.preexisting.values():
            out[cls] = out.get(cls, 0) + n
        return out

    def phase(self, name: str):
        """Switch to phase ``name`` (records the live bytes at the end of the previous phase)."""
        if self.current_phase != "idle":
            self.phase_end_live[self.current_phase] = self.live_bytes
        self.current_phase = name
        self.phase_peak.setdefault(name, self.live_bytes)

    def end_step(self):
        gc.collect()
        if self.current_phase != "idle":
            self.phase_end_live[self.current_phase] = self.live_bytes
        self.current_phase = "idle"

    # ---------------------------------------------------------------------------------------------- module stack
    def _pre(self, module, args):
        name = self._names.get(id(module), "?")
        self._stack.append(name)
        if self.current_phase in ("forward", "loss"):
            self._open.append([torch._C._autograd._get_sequence_nr(), len(self._stack), name])

    def _post(self, module, args, out):
        if self._stack:
            self._stack.pop()
        if self.current_phase in ("forward", "loss") and self._open:
            start, depth, name = self._open.pop()
            end = torch._C._autograd._get_sequence_nr()
            if end > start:
                self._ranges.append((start, end, depth, name))
        if self._loss_after is not None and module is self._loss_after and self.current_phase == "forward":
            self.phase("loss")

    def _module_of_node(self, node) -> str:
        try:
            seq = node._sequence_nr()
        except Exception:
            return ""
        hit = self._range_cache.get(seq)
        if hit is None:
            best = (-1, "")
            for start, end, depth, name in self._ranges:
                if start <= seq < end and depth > best[0]:
                    best = (depth, name)
            hit = best[1]
            self._range_cache[seq] = hit
        return hit

    def _where(self, args_flat):
        """(module, autograd node) of the op being dispatched."""
        node_name = ""
        if self.current_phase == "backward":
            node = torch._C._current_autograd_node()
            if node is not None:
                node_name = node.name()
            if self._stack:  # checkpoint recomputation runs module forwards inside backward
                return self._stack[-1], node_name
            return (self._module_of_node(node) if node is not None else ""), node_name
        if self.current_phase in ("optimizer", "zero_grad"):
            # the parameter being updated: one of the op's inputs, else the last one seen (AdamW's temporaries)
            for t in args_flat:
                st = _storage_of(t)
                if st is not None:
                    n = self._param_names.get(st.data_ptr())
                    if n is not None:
                        self._last_param = n
                        return n, ""
            return self._last_param, ""
        return (self._stack[-1] if self._stack else ""), ""

    # ---------------------------------------------------------------------------------------------- alloc / free
    def _free(self, ptr: int, idx: int, gen: int):
        entry = self.live.get(ptr)
        if gen != self._generation or entry is None or entry[0] != idx:
            return
        del self.live[ptr]
        self.live_bytes -= entry[1]
        self.events.append({"ev": "free", "alloc": idx, "bytes": entry[1], "phase": self.current_phase,
                            "after_op": self.last_op, "op_index": self.op_index})

    def _alloc(self, st, t, op, module, node):
        ptr = st.data_ptr()
        nbytes = st.nbytes()
        idx = len(self.events)
        gen = self._generation
        me = weakref.ref(self)

        def cb(_ref, _p=ptr, _i=idx, _g=gen):
            tracker = me()
            if tracker is not None:
                tracker._free(_p, _i, _g)
        ref = weakref.ref(st, cb)
        self.live[ptr] = [idx, nbytes, ref]
        self.live_bytes += nbytes
        ev = {"ev": "alloc", "bytes": nbytes, "dtype": _dtype_name(t.dtype), "shape": list(t.shape),
              "device": t.device.type, "op": op, "module": module, "node": node, "phase": self.current_phase,
              "op_index": self.op_index}
        self.events.append(ev)
        if self.live_bytes > self.peak:
            self.peak = self.live_bytes
            self.peak_at = ev
        if self.live_bytes > self.phase_peak.get(self.current_phase, 0):
            self.phase_peak[self.current_phase] = self.live_bytes

    def _counted(self, t) -> bool:
        return self.device is None or t.device.type == self.device

    def _known(self, st) -> bool:
        ptr = st.data_ptr()
        if ptr in self.preexisting:
            return True
        entry = self.live.get(ptr)
        if entry is None:
            return False
        if entry[2]() is not st:  # a different storage at the same address: an alias of tracked memory
            self.aliases += 1
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        args_flat = tree_flatten((args, kwargs))[0]
        out = func(*args, **kwargs)
        if self.current_phase == "idle":
            return out
        self.op_index += 1
        if self.current_phase in self.n_ops:
            self.n_ops[self.current_phase] += 1
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        opname = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else name
        self.last_op = opname
        if self.current_phase == "optimizer":
            self.optimizer_ops.add(opname)
            # remember the parameter being updated (AdamW's temporaries are computed from its states, not from it)
            for t in args_flat:
                st = _storage_of(t)
                if st is not None:
                    n = self._param_names.get(st.data_ptr())
                    if n is not None:
                        self._last_param = n
                        break
        where = None
        # inputs that nobody traced (torch.tensor(...) from Python data): allocated before this op
        for t in args_flat:
            st = _storage_of(t)
            if st is not None and st.nbytes() > 0 and self._counted(t) and not self._known(st):
                where = where or self._where(args_flat)
                self._alloc(st, t, f"<untraced:{opname}>", where[0], where[1])
        for t in tree_flatten(out)[0]:
            st = _storage_of(t)
            if st is None or st.nbytes() == 0:
                continue
            if not self._counted(t):
                self.other_device_allocs += 1
                continue
            ptr = st.data_ptr()
            if ptr in self.preexisting:
                continue
            entry = self.live.get(ptr)
            if entry is not None and entry[2]() is st:
                if entry[1] != st.nbytes():  # resized in place (out= ops): record as free + alloc
                    self._free(ptr, entry[0], self._generation)
                    where = where or self._where(args_flat)
                    self._alloc(st, t, opname, where[0], where[1])
                continue
            if entry is not None:
                self.aliases += 1
                continue
            where = where or self._where(args_flat)
            self._alloc(st, t, opname, where[0], where[1])
        return out

    # ---------------------------------------------------------------------------------------------- summaries
    def live_storages(self) -> list[dict]:
        """Allocation events of the storages still alive."""
        return [self.events[e[0]] for e in self.live.values()]

    def summary(self) -> dict:
        at = self.peak_at or {}
        impl = "single_tensor"
        if any(o.startswith("_fused_adam") for o in self.optimizer_ops):
            impl = "fused"
        elif any(o.startswith("_foreach_") for o in self.optimizer_ops):
            impl = "foreach"
        return {
            "peak_live_bytes": self.peak,
            "peak_phase": at.get("phase"),
            "peak_op": at.get("op"),
            "peak_module": at.get("module"),
            "peak_node": at.get("node") or None,
            "peak_event": self.events.index(at) if at else None,
            "live_end_of_phase": dict(self.phase_end_live),
            "peak_of_phase": dict(self.phase_peak),
            "ops": dict(self.n_ops),
            "optimizer_impl_ran": impl if self.n_ops.get("optimizer") else None,
            "preexisting_bytes": self.preexisting_bytes(),
            "aliases": self.aliases,
            "other_device_allocations": self.other_device_allocs,
        }

    def compact_log(self) -> dict:
        """The ordered event log with interned strings (see validation/README.md, "step event logs")."""
        tables: dict[str, list] = {"op": [], "module": [], "node": [], "dtype": [], "phase": list(PHASES)}
        index: dict[str, dict] = {k: {v: i for i, v in enumerate(vs)} for k, vs in tables.items()}

        def intern(kind, value):
            d = index[kind]
            if value not in d:
                d[value] = len(tables[kind])
                tables[kind].append(value)
            return d[value]

        rows = []
        for ev in self.events:
            if ev["ev"] == "alloc":
                rows.append(["a", ev["bytes"], intern("dtype", ev["dtype"]), ev["shape"], intern("op", ev["op"]),
                             intern("module", ev["module"]), intern("node", ev["node"]),
                             intern("phase", ev["phase"]), ev["op_index"]])
            else:
                rows.append(["f", ev["alloc"], intern("op", ev["after_op"]), intern("phase", ev["phase"]),
                             ev["op_index"]])
        return {"alloc_fields": ["a", "bytes", "dtype", "shape", "op", "module", "node", "phase", "op_index"],
                "free_fields": ["f", "alloc_event", "after_op", "phase", "op_index"],
                "strings": tables, "events": rows}


def resolved_adamw_impl(params) -> str:
    """What torch.optim.AdamW with default foreach/fused resolves to for these parameters."""
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach
        _, foreach = _default_to_fused_or_foreach(list(params), differentiable=False, use_fused=False)
    except Exception:  # private API moved: say so rather than guess
        return "unknown"
    return "foreach" if foreach else "single_tensor"


def optimizer_state_tensors(optimizer):
    return [v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]


def track_training_steps(model, optimizer, make_batch, steps: int = 2, tracker: StepTracker | None = None,
                         autocast_dtype=None, log_events: bool = False, on_forward=None) -> dict:
    """Run ``steps`` training steps (forward with labels, loss, backward, optimizer.step, zero_grad(set_to_none))
    under a StepTracker and return one summary per step.

    ``make_batch(step)`` returns the keyword arguments of the model call (e.g. ``input_ids``, ``labels``) and is
    called *before* the step starts (the batch is pre-existing memory, class ``batch``). ``on_forward(tracker)`` is
    called right after the model call returns (output still held), e.g. for a check."""
    tracker = tracker or StepTracker(model, loss_after_module=model.get_output_embeddings())
    params = [p for p in model.parameters()]
    results = []
    for step in range(steps):
        batch = make_batch(step)
        grads = [p.grad for p in params if p.grad is not None]
        tracker.begin_step({"parameter": params, "gradient": grads, "optimizer_state": optimizer_state_tensors(
            optimizer), "buffer": list(model.buffers()), "batch": [v for v in batch.values()
                                                                  if isinstance(v, torch.Tensor)]})
        del grads
        device = params[0].device.type
        cuda = device == "cuda"
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            cuda_before = torch.cuda.memory_allocated()
        with tracker:
            tracker.phase("forward")
            ctx = torch.autocast(device, dtype=autocast_dtype) if autocast_dtype is not None else \
                contextlib.nullcontext()
            with ctx:
                out = model(**batch, use_cache=False)
            if tracker.current_phase == "forward":
                tracker.phase("loss")
            loss = out.loss if hasattr(out, "loss") else out["loss"]
            gc.collect()
            live_after_model_call = tracker.live_bytes
            if on_forward is not None:
                on_forward(tracker, out)
            del out
            gc.collect()
            tracker.phase("backward")
            loss.backward()
            loss_value = float(loss.detach().float().item())
            del loss
            gc.collect()
            tracker.phase("optimizer")
            optimizer.step()
            gc.collect()
            tracker.phase("zero_grad")
            optimizer.zero_grad(set_to_none=True)
            tracker.end_step()
        s = tracker.summary()
        s["step"] = step + 1
        s["live_after_model_call"] = live_after_model_call
        s["loss"] = loss_value
        s["still_alive"] = [dict(ev) for ev in tracker.live_storages()]
        if cuda:
            torch.cuda.synchronize()
            s["cuda_max_allocated_minus_start"] = torch.cuda.max_memory_allocated() - cuda_before
            s["cuda_max_reserved"] = torch.cuda.max_memory_reserved()
        if log_events:
            s["log"] = tracker.compact_log()
        s["events"] = tracker.events
        results.append(s)
        del batch
    state = optimizer_state_tensors(optimizer)
    return {"steps": results, "optimizer_impl_resolved": resolved_adamw_impl(params),
            "optimizer_state_bytes": sum(t.untyped_storage().nbytes() for t in state)}


def _self_test():  # pragma: no cover - a demo; the harness (measure.py) runs the real checks
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=176, vocab_size=1000)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model.train()
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 1000, (2, 64))
    import time
    t0 = time.time()
    res = track_training_steps(model, opt, lambda step: {"input_ids": ids, "labels": ids})
    print(f"two steps tracked in {time.time() - t0:.2f} s")
    for s in res["steps"]:
        print({k: v for k, v in s.items() if k not in ("events", "still_alive", "log")})
    print("optimizer:", res["optimizer_impl_resolved"], "state bytes", res["optimizer_state_bytes"])


if __name__ == "__main__":
    _self_test()
