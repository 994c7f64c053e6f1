#!/usr/bin/env python3
"""LoRA on a bf16 or fp32 base, with and without adapter dropout (``lora_dropout``): what peft keeps.

peft 0.21.2 runs every adapted linear as ``result = base_layer(x) + lora_B(lora_A(dropout(x))) * scaling``
(``peft/tuners/lora/layer.py Linear.forward``) with ONE ``nn.Dropout`` per adapted module (``nn.Identity`` when
``lora_dropout == 0``): with p > 0 each adapter makes its own dropped copy of its input, which ``lora_A`` keeps, and
the dropout keeps its mask (on the CPU ``at::dropout`` is not the fused kernel: ``noise = bernoulli_(1 - p) / (1 - p)``
in x's dtype, kept by the multiplication; CUDA's ``native_dropout`` keeps a bool mask).

The tiny llama-gqa and qwen3 configs of measure.py, built as measure.py builds them (``from_config`` in bf16 or fp32;
``amp-bf16``: the fp32 model under ``torch.autocast("cpu", bfloat16)``),
then ``get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=P))`` (adapters
fp32 on either base: peft's ``autocast_adapter_dtype=True``; on the bf16 base each adapter casts its input to fp32,
``_cast_input_dtype``). Then measure.py's machinery runs unchanged (saved tensors by the graph walk; two tracked steps
of AdamW over the adapters, with the self-checks).

Writes tests/fixtures/pytorch/lora/records.json and lora/steps/<id>.json (b2 s64).

Usage: nice validation/.venv/bin/python validation/measure_lora.py [--only SUBSTRING] [--out DIR]
(torch 2.15.0, transformers 5.24.0, peft 0.21.2, accelerate 1.15.0: requirements-frameworks.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
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

import peft  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402

# peft creates two module-level tensors at import (the `scale=torch.tensor(1)` defaults of
# `tuners/loha/layer.py HadaWeight.forward` and `HadaWeightCP.forward`, 16 B): classified `library_constant`
# before each step (as measure_qlora.py does with bitsandbytes' tables), recorded in `lora.library_constant_bytes`.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    LIBRARY = [t for t in __import__("gc").get_objects() if isinstance(t, torch.Tensor) and t.device.type == "cpu"]


class LoraStepTracker(step_tracker.StepTracker):
    def begin_step(self, classes=None):
        super().begin_step({"library_constant": LIBRARY, **dict(classes or {})})


step_tracker.StepTracker = LoraStepTracker
_orig_track = step_tracker.track_training_steps
LAST: dict = {}


def track_and_keep(model, optimizer, make_batch, steps=2, tracker=None, **kw):
    res = _orig_track(model, optimizer, make_batch, steps=steps, tracker=tracker, **kw)
    LAST["pre"] = res["steps"][-1]["preexisting_bytes"]
    return res


step_tracker.track_training_steps = track_and_keep

OUT = os.path.join(measure.DEFAULT_OUT, "lora")
FAMILIES = ("llama-gqa", "qwen3")
DROPOUTS = (0.0, 0.05)
CURRENT: dict = {}


def lora_config(p: float, targets="all-linear") -> dict:
    return dict(r=8, lora_alpha=16, target_modules=targets, lora_dropout=p, task_type="CAUSAL_LM")


_orig_build_model = measure.build_model


def build_lora(family, dtype, attn, dropout, experts_impl):
    model = _orig_build_model(family, dtype, attn, dropout, experts_impl)
    torch.manual_seed(measure.MODEL_SEED)
    model = get_peft_model(model, LoraConfig(**lora_config(CURRENT["lora_dropout"], CURRENT.get("targets", "all-linear"))))
    model.train()
    return model


measure.build_model = build_lora


def specs():
    for family in FAMILIES:
        for dtype in ("bf16", "fp32", "amp-bf16"):
            for p in DROPOUTS:
                for b, s in ((2, 64),):  # b1 s128 left out: 3-6 min a record on the shared CPUs
                    for ck in (None, "non_reentrant"):
                        yield dict(family=family, batch=b, seq=s, dtype=dtype, attn="sdpa", checkpoint_mode=ck,
                                   dropout=0.0, extra=False, lora_dropout=p, log=(b == 2 and s == 64))


def rid_of(spec) -> str:
    ck = "ckpt1" if spec["checkpoint_mode"] else "ckpt0"
    return (f"{spec['family']}/b{spec['batch']}/s{spec['seq']}/{spec['dtype']}/sdpa/{ck}/"
            f"lora-r8-all-p{spec['lora_dropout']:g}")


def run_one(spec) -> dict:
    rid = rid_of(spec)
    CURRENT.clear()
    CURRENT.update(spec)
    rec, cfg, _, log = measure.measure(spec)
    rec["id"] = rid
    rec["extra"] = spec["extra"]
    model = build_lora(spec["family"], spec["dtype"], "sdpa", 0.0, None)
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    n_dropout = sum(1 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    rec["lora"] = {"config": lora_config(spec["lora_dropout"]), "peft": peft.__version__,
                   "trainable_parameter_bytes": trainable, "dropout_modules": n_dropout,
                   "library_constant_bytes": LAST["pre"].get("library_constant", 0)}
    if log is not None:
        log["id"] = rid
    key = f"{spec['family']}/{spec['dtype']}"
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
        spec = next(s for s in specs() if rid_of(s) == args.one)
        with open(args.result, "w") as f:
            json.dump(run_one(spec), f)
        return
    # one fresh interpreter per record, as measure_qlora.py does
    os.makedirs(os.path.join(args.out, "steps"), exist_ok=True)
    records, configs, bad = [], {}, 0
    t_start = time.time()
    tmp = tempfile.mkdtemp(prefix="lora-")
    res_path = os.path.join(tmp, "one.json")
    for spec in specs():
        rid = rid_of(spec)
        if args.only and args.only not in rid:
            continue
        t0 = time.time()
        subprocess.run([sys.executable, os.path.abspath(__file__), "--one", rid, "--result", res_path], check=True)
        res = json.load(open(res_path))
        rec, log = res["rec"], res["log"]
        configs[res["key"]] = res["cfg"]
        bad += not measure.keep_record(records, rec, log, rid, args.out, t0)
    order = {rid_of(s): i for i, s in enumerate(specs())}
    head = {"generated_by": "validation/measure_lora.py (LoRA adapter dropout; see validation/README.md)",
            "torch": torch.__version__.split("+")[0], "transformers": measure.transformers.__version__,
            "peft": peft.__version__, "device": "cpu",
            "seeds": {"model": measure.MODEL_SEED, "data": measure.DATA_SEED}}
    sys.exit(measure.write_records(args.out, head, configs, records, order, args.only, t_start, bad))


if __name__ == "__main__":
    main()
