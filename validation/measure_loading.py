#!/usr/bin/env python3
"""Model loading (issue 27): the allocation sequence of transformers' ``from_pretrained``, for the allocator simulator.

A tiny checkpoint is written with ``save_pretrained`` (the tiny configs of measure.py; bf16 or fp32 on disk), then
loaded with ``AutoModelForCausalLM.from_pretrained(dir, dtype=bfloat16, device_map=DEVICE[, quantization_config])``
under a ``TorchDispatchMode`` that records every storage an aten op creates (bytes, dtype, shape, device, op, and the
checkpoint key being materialised) and, through a weak reference on the storage, the moment it is freed. Two
devices:

* ``cpu`` — measured: the real CPU run;
* ``cuda-fake`` — traced: the same call with ``device_map="cuda"`` under ``FakeTensorMode`` (fake CUDA tensors, no
  GPU). Two adaptations, both outside the code path being traced: safetensors builds its host tensor (``tensor[...]``
  in ``core_model_loading._materialize_copy``) outside the fake mode (it is host memory, and safetensors' storage
  tricks do not run on fake tensors), and ``torch.cuda.mem_get_info`` / ``memory_reserved`` / ``memory_allocated``
  report a fresh 141 GiB device so that ``caching_allocator_warmup`` runs as it would on an empty H200.

Loading runs synchronously (``HF_DEACTIVATE_ASYNC_LOAD=1``: transformers' 4 loader threads would run outside the
thread-local dispatch mode; the bytes are the same, only the order of the parameter copies differs — see README.md).
On-the-fly quantization (bitsandbytes NF4) is always synchronous in transformers.

Scenarios per family (llama-gqa, qwen3, gpt2 with its tied lm_head):
  bf16 checkpoint -> bf16, fp32 checkpoint -> bf16, and (cpu only: bitsandbytes has no fake-tensor path for
  ``Params4bit``'s quantization) bf16 checkpoint -> NF4 (double quant, uint8 storage) = load-then-quantize.

Writes tests/fixtures/pytorch/loading/records.json: per scenario a summary (device bytes alive at the end, the
loading peak, the warmup allocation) and the full event list.

Usage: validation/.venv27/bin/python validation/measure_loading.py [--out DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import warnings
import weakref

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = "1"
warnings.filterwarnings("ignore")
import logging  # noqa: E402

logging.disable(logging.WARNING)

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402

import transformers  # noqa: E402
import transformers.core_model_loading as cml  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

OUT = os.path.join(measure.DEFAULT_OUT, "loading")
FAMILIES = ("llama-gqa", "qwen3", "gpt2")
FAKE_TOTAL = 141 * 1024 ** 3
LABEL = {"key": ""}


class LoadRecorder(TorchDispatchMode):
    """Every storage an aten op creates, keyed by the StorageImpl (fake tensors all have data_ptr 0)."""

    def __init__(self):
        super().__init__()
        self.events: list = []
        self.live: dict = {}

    def _free(self, key, idx):
        if self.live.pop(key, None) is not None:
            self.events.append(["f", idx])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            st = t.untyped_storage()
            key = st._cdata
            if key in self.live or st.nbytes() == 0:
                continue
            idx = len(self.events)
            self.events.append(["a", st.nbytes(), measure.dtype_name(t.dtype), list(t.shape), t.device.type,
                                func.overloadpacket.__name__, LABEL["key"]])
            me = weakref.ref(self)
            self.live[key] = weakref.ref(st, lambda _r, _k=key, _i=idx: me() and me()._free(_k, _i))
        return out


def _label(cls):
    orig = cls.convert

    def convert(self, first_param_name, *a, **kw):
        LABEL["key"] = first_param_name
        try:
            return orig(self, first_param_name, *a, **kw)
        finally:
            LABEL["key"] = "(after)"
    cls.convert = convert


_label(cml.WeightRenaming)
_label(cml.WeightConverter)
_orig_materialize = cml._materialize_copy


def _materialize_host_outside_fake(tensor, device=None, dtype=None):
    # safetensors' slice -> host tensor: real host memory, built outside the fake mode; the device copy is traced
    with _disable_current_modes():
        tensor = tensor[...]
    if dtype is not None or device is not None:
        tensor = tensor.to(device=device, dtype=dtype)
    return tensor


def fresh_device_queries():
    torch.cuda.mem_get_info = lambda device=None: (FAKE_TOTAL, FAKE_TOTAL)
    torch.cuda.memory_reserved = lambda device=None: 0
    torch.cuda.memory_allocated = lambda device=None: 0
    torch.cuda.current_device = lambda: 0


def save_checkpoint(family: str, dtype: str) -> str:
    model = measure.build_model(family, "bf16" if dtype == "bf16" else "fp32", "sdpa", 0.0, None)
    d = tempfile.mkdtemp(prefix=f"m27-load-{family}-")
    model.save_pretrained(d)
    del model
    gc.collect()
    return d


def summarize(events, device: str, model) -> dict:
    live = peak = 0
    sizes = {}
    peak_at = None
    warmup = None
    for i, e in enumerate(events):
        if e[0] == "a":
            if e[4] != device:
                continue
            sizes[i] = e[1]
            live += e[1]
            if e[5] == "empty" and e[2] == "float16" and warmup is None:
                warmup = e[1]
            if live > peak:
                peak, peak_at = live, i
        elif e[1] in sizes:
            live -= sizes.pop(e[1])
    params = list(model.parameters())
    p_bytes = sum(p.untyped_storage().nbytes() for p in {p.untyped_storage()._cdata: p for p in params}.values())
    b_bytes = sum(b.untyped_storage().nbytes() for b in model.buffers())
    return {"device_bytes_alive_at_end": live, "device_peak_bytes": peak, "peak_event": peak_at,
            "warmup_bytes": warmup, "device_allocations": sum(1 for e in events if e[0] == "a" and e[4] == device),
            "host_allocations": sum(1 for e in events if e[0] == "a" and e[4] == "cpu"),
            "parameter_storage_bytes": p_bytes, "buffer_bytes": b_bytes}


def run(family: str, ckpt_dtype: str, device: str, quant: str | None):
    d = save_checkpoint(family, ckpt_dtype)
    kw = dict(dtype=torch.bfloat16, attn_implementation="sdpa")
    if quant == "nf4":
        from transformers import BitsAndBytesConfig
        kw["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                       bnb_4bit_use_double_quant=True,
                                                       bnb_4bit_compute_dtype=torch.bfloat16,
                                                       bnb_4bit_quant_storage=torch.uint8)
    rec = LoadRecorder()
    try:
        if device == "cpu":
            cml._materialize_copy = _orig_materialize
            with rec:
                model = AutoModelForCausalLM.from_pretrained(d, device_map="cpu", **kw)
            dev = "cpu"
        else:
            cml._materialize_copy = _materialize_host_outside_fake
            with FakeTensorMode(allow_non_fake_inputs=True), rec:
                model = AutoModelForCausalLM.from_pretrained(d, device_map="cuda", **kw)
            dev = "cuda"
        events = [list(e) for e in rec.events]  # the sequence up to the end of from_pretrained
        traced_keys = set(rec.live)
        rec.live = {}  # later frees (the model's deletion) are not part of loading
        summ = summarize(events, dev, model)
        # params whose storage no traced op created: on the CPU these alias the safetensors file (mmap, page cache)
        untraced = [n for n, p in model.named_parameters() if p.untyped_storage()._cdata not in traced_keys]
        summ["parameters_not_created_by_a_traced_op"] = len(untraced)
        summ["parameters"] = len(list(model.named_parameters()))
        summ["parameter_dtypes"] = sorted({measure.dtype_name(p.dtype) for p in model.parameters()})
        del model
    finally:
        shutil.rmtree(d, ignore_errors=True)
        cml._materialize_copy = _orig_materialize
    gc.collect()
    return summ, events


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    fresh_device_queries()
    records = []
    for family in FAMILIES:
        for device in ("cpu", "cuda-fake"):
            for ckpt, quant in (("bf16", None), ("fp32", None), ("bf16", "nf4")):
                if quant and device != "cpu":
                    continue
                rid = f"{family}/{device}/ckpt-{ckpt}/load-{quant or 'bf16'}"
                summ, events = run(family, ckpt, device, quant)
                print(rid, {k: v for k, v in summ.items() if k != "peak_event"}, file=sys.stderr, flush=True)
                records.append({"id": rid, "family": family, "device": device, "checkpoint_dtype": ckpt,
                                "load": "quantize-on-load-nf4" if quant else "from-pretrained",
                                "summary": summ, "event_fields": {
                                    "a": ["a", "bytes", "dtype", "shape", "device", "op", "checkpoint_key"],
                                    "f": ["f", "alloc_event_index"]},
                                "events": events})
    os.makedirs(args.out, exist_ok=True)
    out = ["{", f' "generated_by": "validation/measure_loading.py (issue 27; see validation/README.md, '
           f'FINDINGS.md §12)",', f' "torch": {json.dumps(torch.__version__.split("+")[0])},',
           f' "transformers": {json.dumps(transformers.__version__)},', ' "records": [']
    for j, r in enumerate(records):
        evs = r.pop("events")
        out.append("  " + json.dumps(r)[:-1] + ', "events": [')
        out.extend("    " + json.dumps(e) + ("," if i + 1 < len(evs) else "") for i, e in enumerate(evs))
        out.append("  ]}" + ("," if j + 1 < len(records) else ""))
    out += [" ]", "}"]
    with open(os.path.join(args.out, "records.json"), "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
