#!/usr/bin/env python3
"""QLoRA on bitsandbytes' CPU backend: what ``Linear4bit`` keeps, and what it allocates to dequantize (issue 27).

bitsandbytes 0.50.2 runs 4-bit NF4 layers on the CPU (its ``cpu`` backend: C kernels for ``dequantize_4bit`` and
``dequantize_blockwise``, the ``default`` Python implementation of ``gemm_4bit``). This script builds the real
QLoRA recipe on the tiny llama-gqa and qwen3 configs of measure.py:

1. a bf16 checkpoint of the tiny model is written with ``save_pretrained`` to a temporary directory;
2. ``AutoModelForCausalLM.from_pretrained(dir, quantization_config=BitsAndBytesConfig(load_in_4bit=True,
   bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=DQ, bnb_4bit_compute_dtype=bfloat16,
   bnb_4bit_quant_storage=STORAGE), dtype=bfloat16, device_map="cpu")`` (load, then quantize);
3. ``peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=CKPT)`` (casts every non-4-bit
   parameter to fp32, freezes everything; with CKPT: ``enable_input_require_grads`` + non-reentrant checkpointing);
4. ``get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0))``
   (adapters in fp32: peft's ``autocast_adapter_dtype=True``).

Then measure.py's machinery runs unchanged (saved tensors with the graph walk; two tracked steps of AdamW over the
LoRA parameters, with the self-checks), with two changes to the step tracker:

* the quant states (packed-weight constants: ``absmax``, nested ``state2.absmax``, ``code`` tables, ``offset``) are
  neither parameters nor buffers: they are classified as ``quant_state`` before the step (``quant_state_bytes``);
* ``bitsandbytes::gemm_4bit`` (one custom op) is run through its default implementation with the tracker active,
  so its inner allocations — the fp32 absmax dequantized from the 8-bit nested absmax, ``+ offset``, the
  dequantized weight ``[N, K]`` in the compute dtype, and the linear's output — are seen one by one. That default
  implementation is what CUDA runs too whenever it does not pick its fused kernel
  (``backends/cuda/ops.py _dequant_linear_fallback``: always for more than 1,536 tokens, see README.md).

Per record, ``qlora`` holds the quantization settings, the 4-bit layout of every quantized weight (packed bytes,
absmax, nested absmax, code, offset) and, for the linears of layer 0, the allocations of the base layer's forward
call and of the ``MatMul4Bit`` backward node in step 2 (as measure_fp8.py does).

Writes tests/fixtures/pytorch/qlora/records.json and qlora/steps/<id>.json (b2 s64).

Usage: validation/.venv27/bin/python validation/measure_qlora.py [--only SUBSTRING] [--out DIR]
(torch 2.15.0, transformers 5.24.0, bitsandbytes 0.50.2, peft 0.21.2, accelerate 1.15.0).
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

logging.disable(logging.WARNING)

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import tracker as step_tracker  # noqa: E402

import bitsandbytes as bnb  # noqa: E402
import peft  # noqa: E402
from bitsandbytes.backends.default.ops import _gemm_4bit_default_impl  # noqa: E402
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

OUT = os.path.join(measure.DEFAULT_OUT, "qlora")
FAMILIES = ("llama-gqa", "qwen3")
CURRENT: dict = {}
CKPT_DIRS: dict = {}
LORA = dict(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")


def checkpoint_dir(family: str) -> str:
    """A bf16 checkpoint of the tiny model (the same weights as measure.py's bf16 build), written once."""
    if family not in CKPT_DIRS:
        model = _orig_build_model(family, "bf16", "sdpa", 0.0, None)
        d = tempfile.mkdtemp(prefix=f"m27-{family}-")
        model.save_pretrained(d)
        CKPT_DIRS[family] = d
        del model
        gc.collect()
    return CKPT_DIRS[family]


def quant_config(spec):
    storage = torch.bfloat16 if spec["storage"] == "bf16" else torch.uint8
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_use_double_quant=spec["double_quant"],
                              bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=storage)


_orig_build_model = measure.build_model


def build_qlora(family, dtype, attn, dropout, experts_impl):
    spec = CURRENT
    d = checkpoint_dir(family)
    torch.manual_seed(measure.MODEL_SEED)
    model = AutoModelForCausalLM.from_pretrained(d, quantization_config=quant_config(spec), dtype=torch.bfloat16,
                                                 device_map="cpu", attn_implementation=attn)
    if spec["prepare"]:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=spec["checkpoint_mode"] is not None)
    torch.manual_seed(measure.MODEL_SEED)
    model = get_peft_model(model, LoraConfig(**LORA))
    model.train()
    WINDOWS.attach(model)
    return model


measure.build_model = build_qlora


def quant_states(model):
    out = []
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            out.append((m, m.weight.quant_state))
    return out


def quant_state_tensors(model) -> list:
    ts = []
    for _, qs in quant_states(model):
        for t in (qs.absmax, qs.code, getattr(qs, "offset", None)):
            if isinstance(t, torch.Tensor):
                ts.append(t)
        if qs.nested:
            ts += [qs.state2.absmax, qs.state2.code]
    return ts


LIBRARY: list = []


def library_constants() -> list:
    """bitsandbytes creates module-level constants on first use (the NF4 / dynamic code tables, quantization bounds,
    a few scalars, ~1.4 KB on the CPU). Exercise every path once before any model exists and keep what survives:
    those tensors are classified ``library_constant`` before each step."""
    w = torch.randn(64, 64, dtype=torch.bfloat16)
    for dq in (True, False):
        for storage in (torch.uint8, torch.bfloat16):
            p = bnb.nn.Params4bit(w.clone(), requires_grad=False, compress_statistics=dq, quant_type="nf4",
                                  quant_storage=storage).to("cpu")
            x = torch.randn(2, 64, dtype=torch.bfloat16, requires_grad=True)
            y = bnb.matmul_4bit(x, p.t(), quant_state=p.quant_state)
            y.float().sum().backward()
            _gemm_4bit_default_impl(x.detach(), p.view(-1, 1), p.quant_state.shape, p.quant_state.absmax,
                                    p.quant_state.blocksize, "nf4")
            del p, x, y
    del w
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [t for t in gc.get_objects() if isinstance(t, torch.Tensor) and t.device.type == "cpu"]


class Windows:
    """Forward call of each Linear4bit base layer of layer 0 and its MatMul4Bit backward node (step 2)."""

    def __init__(self):
        self.tracker = None
        self.rows: list[dict] = []
        self.handles = []
        self._cur = None

    def attach(self, model):
        for h in self.handles:
            h.remove()
        self.handles, self.rows = [], []
        for name, m in model.named_modules():
            if ".layers.0." in name and (isinstance(m, bnb.nn.Linear4bit) or name.endswith(("lora_A.default",
                                                                                          "lora_B.default"))):
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
        w["peak"], w["exit_live"], w["exit_event"] = tr.win_peak, tr.live_bytes, len(tr.events)

    def _pre(self, name):
        tr = self.tracker
        self._cur = self._open(name, "forward" if tr is not None and tr.current_phase == "forward" else "recompute")

    def _post(self, name, out):
        self._close(self._cur)
        tr = self.tracker
        if tr is None or tr.current_phase != "forward" or out.grad_fn is None:
            return
        node = out.grad_fn
        # Linear4bit returns matmul_4bit(...).to(input dtype): the window is the MatMul4Bit node under the cast
        while any(k in node.name() for k in ("View", "ToCopy")) and node.next_functions and \
                node.next_functions[0][0] is not None:
            node = node.next_functions[0][0]
        box = {}
        node.register_prehook(lambda g, _b=box, _n=name: _b.__setitem__("w", self._open(_n, "backward")) or None)
        node.register_hook(lambda gi, go, _b=box: self._close(_b.get("w")) or None)


WINDOWS = Windows()
GEMM_4BIT = torch.ops.bitsandbytes.gemm_4bit.default


class QLoraStepTracker(step_tracker.StepTracker):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.win_peak = 0
        WINDOWS.tracker = self

    def _alloc(self, st, t, op, module, node):
        super()._alloc(st, t, op, module, node)
        if self.live_bytes > self.win_peak:
            self.win_peak = self.live_bytes

    def begin_step(self, classes=None):
        classes = dict(classes or {})
        # quant states first: the packed weights are parameters, their constants are not
        qs = {"quant_state": quant_state_tensors(self.model)} if self.model is not None else {}
        super().begin_step({**qs, "library_constant": LIBRARY, **classes})
        self.win_peak = 0
        WINDOWS.rows = [w for w in WINDOWS.rows if w["gen"] == self._generation]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is GEMM_4BIT and self.current_phase != "idle":
            with self:  # run the op's default (CPU) implementation op by op, under this tracker
                return _gemm_4bit_default_impl(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


step_tracker.StepTracker = QLoraStepTracker
_orig_track = step_tracker.track_training_steps
LAST = {}


def track_and_keep(model, optimizer, make_batch, steps=2, tracker=None, **kw):
    res = _orig_track(model, optimizer, make_batch, steps=steps, tracker=tracker, **kw)
    LAST["events"] = res["steps"][-1]["events"]
    LAST["pre"] = res["steps"][-1]["preexisting_bytes"]
    LAST["windows"] = [dict(w) for w in WINDOWS.rows]
    return res


step_tracker.track_training_steps = track_and_keep


def summarize_windows(events, windows, with_allocs):
    frees = {e["alloc"]: e["phase"] for e in events if e["ev"] == "free"}
    out = []
    for w in windows:
        if "exit_event" not in w:
            continue
        win = events[w["entry_event"]:w["exit_event"]]
        freed_in = {e["alloc"] for e in win if e["ev"] == "free"}
        allocs = [[e["op"], e["dtype"], e["shape"], e["bytes"],
                   "in-window" if w["entry_event"] + i in freed_in else frees.get(w["entry_event"] + i, "alive")]
                  for i, e in enumerate(win) if e["ev"] == "alloc"]
        row = {"module": measure.module_pattern(w["module"]), "kind": w["kind"], "phase": w["phase"],
               "transient_peak": w["peak"] - w["entry_live"], "left_alive": w["exit_live"] - w["entry_live"],
               "n_allocs": len(allocs), "alloc_bytes": sum(a[3] for a in allocs)}
        if with_allocs:
            row["allocs"] = allocs
        out.append(row)
    return out


def layout(model):
    rows = {}
    for name, m in model.named_modules():
        if not isinstance(m, bnb.nn.Linear4bit):
            continue
        w, qs = m.weight, m.weight.quant_state
        key = measure.module_pattern(name)
        r = {"module": key, "shape": list(qs.shape), "numel": int(torch.Size(qs.shape).numel()),
             "packed_dtype": measure.dtype_name(w.dtype), "packed_shape": list(w.shape),
             "packed_bytes": w.untyped_storage().nbytes(), "blocksize": qs.blocksize,
             "absmax_dtype": measure.dtype_name(qs.absmax.dtype), "absmax_shape": list(qs.absmax.shape),
             "absmax_bytes": qs.absmax.untyped_storage().nbytes(), "code_bytes": qs.code.untyped_storage().nbytes(),
             "compute_dtype": measure.dtype_name(m.compute_dtype), "nested": bool(qs.nested)}
        if qs.nested:
            r.update({"state2_blocksize": qs.state2.blocksize,
                      "state2_absmax_dtype": measure.dtype_name(qs.state2.absmax.dtype),
                      "state2_absmax_shape": list(qs.state2.absmax.shape),
                      "state2_absmax_bytes": qs.state2.absmax.untyped_storage().nbytes(),
                      "state2_code_bytes": qs.state2.code.untyped_storage().nbytes(),
                      "offset_bytes": qs.offset.untyped_storage().nbytes() if isinstance(qs.offset, torch.Tensor)
                      else 0})
        if key in rows:
            rows[key]["count"] += 1
        else:
            r["count"] = 1
            rows[key] = r
    # distinct storages of all quant-state tensors (code tables may be shared between layers)
    qs_ptrs = {}
    for t in quant_state_tensors(model):
        qs_ptrs[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return list(rows.values()), sum(qs_ptrs.values()), len(qs_ptrs)


def specs():
    for family in FAMILIES:
        for storage in ("uint8", "bf16"):
            for dq in (True, False):
                for b, s in ((2, 64), (1, 128)):
                    for ck in (None, "non_reentrant"):
                        yield dict(family=family, batch=b, seq=s, dtype="bf16", attn="sdpa", checkpoint_mode=ck,
                                   dropout=0.0, extra=False, storage=storage, double_quant=dq, prepare=True,
                                   log=(b == 2 and s == 64))
        # without prepare_model_for_kbit_training (norms, embeddings, lm_head stay bf16)
        for ck in (None, "non_reentrant"):
            yield dict(family=family, batch=2, seq=64, dtype="bf16", attn="sdpa", checkpoint_mode=ck, dropout=0.0,
                       extra=True, storage="uint8", double_quant=True, prepare=False, log=False)


def rid_of(spec) -> str:
    ck = "ckpt1" if spec["checkpoint_mode"] else "ckpt0"
    return (f"{spec['family']}/b{spec['batch']}/s{spec['seq']}/bf16/sdpa/{ck}/nf4-{spec['storage']}"
            f"{'-dq' if spec['double_quant'] else ''}{'' if spec['prepare'] else '-noprep'}")


def run_one(spec) -> dict:
    """One record, in this (fresh) process."""
    rid = rid_of(spec)
    CURRENT.clear()
    CURRENT.update(spec)
    try:
        rec, cfg, _, log = measure.measure(spec)
        rec["id"] = rid
        rec["extra"] = spec["extra"]
        model = build_qlora(spec["family"], "bf16", "sdpa", 0.0, None)
        lay, qs_bytes, qs_storages = layout(model)
        trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        frozen_by_dtype = {}
        for p in model.parameters():
            if not p.requires_grad:
                k = measure.dtype_name(p.dtype)
                frozen_by_dtype[k] = frozen_by_dtype.get(k, 0) + p.numel() * p.element_size()
        rec["qlora"] = {
            "quant_type": "nf4", "double_quant": spec["double_quant"], "quant_storage": spec["storage"],
            "compute_dtype": "bfloat16", "prepare_model_for_kbit_training": spec["prepare"], "lora": LORA,
            "bitsandbytes": bnb.__version__, "peft": peft.__version__,
            "trainable_parameter_bytes": trainable, "frozen_parameter_bytes_by_dtype": frozen_by_dtype,
            "quant_state_bytes": qs_bytes, "quant_state_storages": qs_storages,
            "quant_state_bytes_tracker": LAST["pre"].get("quant_state", 0),
            "library_constant_bytes": LAST["pre"].get("library_constant", 0),
            "layout": lay,
            "layer0_linears_step2": summarize_windows(LAST["events"], LAST["windows"], spec["log"]),
        }
    finally:
        for d in CKPT_DIRS.values():
            shutil.rmtree(d, ignore_errors=True)
    if log is not None:
        log["id"] = rid
    # the config as loaded names the temporary checkpoint directory: not part of the record
    cfg = dict(cfg, _name_or_path="(temporary save_pretrained directory)")
    key = f"{spec['family']}/nf4-{spec['storage']}{'-dq' if spec['double_quant'] else ''}"
    rec["config_key"] = key
    return {"rec": rec, "cfg": cfg, "key": key, "log": log}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--only", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one record id -> JSON file
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.one:
        LIBRARY.extend(library_constants())
        spec = next(s for s in specs() if rid_of(s) == args.one)
        with open(args.result, "w") as f:
            json.dump(run_one(spec), f)
        return
    # Each record runs in a fresh interpreter: something outside Python's reach (a C++-held reference) keeps one
    # fp32 parameter of a prepared model alive after the model is gone, which the next record's pre-existing scan
    # would (rightly) refuse as unclassified memory.
    os.makedirs(os.path.join(args.out, "steps"), exist_ok=True)
    records, configs, bad = [], {}, 0
    t_start = time.time()
    tmp = tempfile.mkdtemp(prefix="m27-qlora-")
    for spec in specs():
        rid = rid_of(spec)
        if args.only and args.only not in rid:
            continue
        t0 = time.time()
        res_path = os.path.join(tmp, "one.json")
        import subprocess
        subprocess.run([sys.executable, os.path.abspath(__file__), "--one", rid, "--result", res_path], check=True)
        res = json.load(open(res_path))
        rec, log = res["rec"], res["log"]
        configs[res["key"]] = res["cfg"]
        bad += not measure.keep_record(records, rec, log, rid, args.out, t0)
    shutil.rmtree(tmp, ignore_errors=True)
    order = {rid_of(s): i for i, s in enumerate(specs())}
    head = {"generated_by": "validation/measure_qlora.py (issue 27; see validation/README.md, FINDINGS.md §11)",
            "torch": torch.__version__.split("+")[0], "transformers": measure.transformers.__version__,
            "bitsandbytes": bnb.__version__, "peft": peft.__version__, "device": "cpu",
            "seeds": {"model": measure.MODEL_SEED, "data": measure.DATA_SEED}}
    sys.exit(measure.write_records(args.out, head, configs, records, order, args.only, t_start, bad))


if __name__ == "__main__":
    main()
