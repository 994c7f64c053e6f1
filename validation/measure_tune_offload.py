#!/usr/bin/env python3
"""Activation offloading on torchtune 0.6.1's own Llama 3 (validation/measure_frameworks.py `build_torchtune_llama3`,
`CEWithChunkedOutputLoss` with 8 chunks), eager, as `full_finetune_single_device.py` runs it, on CPU:

* `_loss_step`: `with self.activations_handling_ctx: logits = self._model(**batch)`; the labels shifted and the chunked
  loss outside the context; `current_loss = loss * current_num_tokens` is what `backward()` runs on;
* `training.get_act_offloading_ctx_manager(model, True)`: `OffloadActivations()` (here measure_recipes.py's
  `CpuOffloadActivations`, its CPU port) and a `NoOpManager` around `model.output` (pre/post forward hooks);
* `enable_activation_checkpointing`: `training.set_activation_checkpointing(model, auto_wrap_policy=
  {TransformerSelfAttentionLayer})` (torch's `checkpoint_wrapper`, non-reentrant): each layer's positional input `x`
  is saved by `_CheckpointFrame.save_inputs` under the offloading hooks.

Measured by measure_recipes.py `measure_offload` (dispatch tracker; host copies outside its view). Writes
tests/fixtures/pytorch/offload_ckpt/torchtune-llama3.json.

Usage:  nice validation/.venv/bin/python validation/measure_tune_offload.py [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import measure_recipes as R  # noqa: E402  (imports measure, torch)
import measure_frameworks as F  # noqa: E402
import torch  # noqa: E402

M = R.M
OUT = os.path.join(R.REPO, "tests", "fixtures", "pytorch", "offload_ckpt")
RECIPES = ("act_offload=torchtune", "act_offload=torchtune+recompute=full")


def tune_loss_step(self, ids, ctx):
    """TorchtuneLM.forward with the offloading context around the model call only (torchtune's `_loss_step`)."""
    labels = ids
    current_num_tokens = (labels != self.loss_fn.ignore_index).sum()
    with ctx:
        logits = self.model(ids)
    shifted = torch.hstack((labels[..., 1:], self.ignore_labels_cache[: labels.shape[0]]))
    loss = self.loss_fn(logits, shifted)
    del logits
    return loss * current_num_tokens, F.Output(loss=None, logits=torch.empty(0))


def build(tdtype):
    lm = F.build_torchtune_llama3(R.S, tdtype)
    lm.tune_loss_step = types.MethodType(tune_loss_step, lm)
    return lm


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "torchtune-llama3.json")
    doc = json.load(open(path)) if os.path.exists(path) else {
        "generated_by": "validation/measure_tune_offload.py", "torch": torch.__version__.split("+")[0],
        "framework": "torchtune", "framework_version": "0.6.1", "family": "llama3", "device": "cpu",
        "configs": {}, "records": []}
    family = "torchtune-llama3"
    for dtype in R.DTYPES:
        for recipe in RECIPES:
            rid = f"{family}/b{R.B}/s{R.S}/{dtype}/sdpa/{recipe}"
            if args.only and args.only not in rid:
                continue
            tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
            M.build_model = lambda f, d, a, dr, e, _t=tdtype: build(_t)
            opts: dict = {}
            rec = R.measure_offload(family, dtype, "sdpa", recipe, opts)
            cfg = dict(opts["cfg"], framework="torchtune")
            rec["framework"] = "torchtune"
            rec["framework_version"] = "0.6.1"
            rec["recipe"]["loss"] = ("CEWithChunkedOutputLoss(num_output_chunks=8), eager, outside the offload "
                                     "context (full_finetune_single_device.py _loss_step)")
            if "recompute" in rec["recipe"]:
                rec["recipe"]["checkpoint"] = ("torchtune training.set_activation_checkpointing (checkpoint_wrapper, "
                                               "non-reentrant): positional input x saved under the outer hooks")
            rec["recipe"]["output_head_noop"] = "model.output"
            doc["configs"][rec["config_key"]] = cfg
            doc["records"] = [r for r in doc["records"] if r["id"] != rid] + [rec]
            st = rec["step"]
            print(f"{rid}: offloaded {rec['offloaded_bytes']} B; peak {st['measured_peak_bytes']} B "
                  f"({st.get('peak_phase')} {st.get('peak_op')})", file=sys.stderr, flush=True)
            with open(path, "w") as f:
                f.write(M.dump(doc))


if __name__ == "__main__":
    main()
