#!/usr/bin/env python3
"""peft LoRA under ``torch.compile`` (each decoder layer and the loss compiled, as measure_recipes.py's ``compile=layer``):
what the partitioner keeps of peft's adapters.

peft 0.21.2's ``Linear.forward`` casts each adapter's input to the adapters' dtype (fp32 on a bf16 base:
``autocast_adapter_dtype=True``) and the sum back; eager, every adapted linear keeps its own fp32 copy of its input
(tests/fixtures/pytorch/lora, exact). Compiled, the graph's common-subexpression elimination may merge the identical
casts of q, k and v's shared input, and the min-cut decides whether the fp32 copy or the bf16 input crosses to
backward. This script runs measure_recipes.py's ``measure_compile`` unchanged on the peft-wrapped tiny model
(measure_lora.py's ``build_lora``: r 8, all linears, no dropout), with the loss compiled on the wrapped model.

With ``recompute=full`` each decoder layer is also checkpointed inside its compiled region (measure_recipes.py's
``compile=layer+recompute=full``: non-reentrant, ``early_stop=False``, as torchtitan and torchtune's compiled AC run).

Writes tests/fixtures/pytorch/lora/compile.json (one record per family × dtype × checkpointing, b2 s64).

Usage: nice validation/.venv/bin/python validation/measure_lora_compile.py [--only SUBSTRING] [--one ID --result F]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import measure_lora as L  # noqa: E402  (patches measure.build_model with peft's wrapper)
import measure_recipes as R  # noqa: E402
import torch  # noqa: E402

OUT = os.path.join(L.OUT, "compile.json")
# (family, dtype, checkpointing, adapted linears): every linear, and q and v alone (torchtune's and the LoRA paper's
# default) under checkpointing
SPECS = [(f, d, rc, "all") for f in L.FAMILIES for d in ("bf16", "fp32") for rc in (None, "full")] + \
    [(f, d, "full", "qv") for f in L.FAMILIES for d in ("bf16", "fp32")]
TARGETS = {"all": "all-linear", "qv": ["q_proj", "v_proj"]}


def compile_layers(model, loss=True):
    """measure_recipes.compile_layers, with the loss set on the model peft wraps (its ``loss_function``)."""
    for layer in R.decoder_layers(model):
        layer.compile()
    if loss:
        from transformers.loss.loss_utils import ForCausalLMLoss
        model.get_base_model().loss_function = torch.compile(ForCausalLMLoss)


def rid(family, dtype, recompute=None, targets="all"):
    ckpt = f"+recompute={recompute}" if recompute else ""
    return f"{family}/b{R.B}/s{R.S}/{dtype}/sdpa/compile=layer{ckpt}/lora-r8-{targets}-p0"


def run_one(family, dtype, recompute=None, targets="all") -> dict:
    L.CURRENT.clear()
    L.CURRENT.update(lora_dropout=0.0, targets=TARGETS[targets])
    R.compile_layers = compile_layers
    opts: dict = {}
    rec = R.measure_compile(family, dtype, "sdpa", opts, recompute=recompute)
    rec["id"] = rid(family, dtype, recompute, targets)
    rec["lora"] = {"config": L.lora_config(0.0, TARGETS[targets]), "peft": L.peft.__version__}
    if recompute and "trace" in R.PROFILE_LOG:
        R.write_step_log(rec, L.OUT)
    return {"rec": rec, "cfg": opts["cfg"], "key": rec["config_key"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.one:
        spec = next(s for s in SPECS if rid(*s) == args.one)
        with open(args.result, "w") as f:
            json.dump(run_one(*spec), f)
        return
    records, configs = [], {}
    res_path = os.path.join(tempfile.mkdtemp(prefix="lora-compile-"), "one.json")
    for spec in SPECS:
        if args.only and args.only not in rid(*spec):
            continue
        subprocess.run([sys.executable, os.path.abspath(__file__), "--one", rid(*spec), "--result", res_path],
                       check=True)
        res = json.load(open(res_path))
        records.append(res["rec"])
        configs[res["key"]] = res["cfg"]
        st = res["rec"]["step"]
        print(f"{res['rec']['id']}: saved {res['rec']['saved_bytes']} peak {st.get('measured_peak_bytes')}",
              file=sys.stderr, flush=True)
    if args.only and os.path.exists(OUT):
        old = json.load(open(OUT))
        ids = {r["id"] for r in records}
        records = [r for r in old["records"] if r["id"] not in ids] + records
        configs = {**old["configs"], **configs}
    doc = {"generated_by": "validation/measure_lora_compile.py (peft LoRA under compile=layer; see validation/README.md)",
           "torch": torch.__version__.split("+")[0], "transformers": R.transformers.__version__,
           "peft": L.peft.__version__, "device": "cpu", "configs": configs, "records": records}
    with open(OUT, "w") as f:
        f.write(L.measure.dump(doc))


if __name__ == "__main__":
    main()
