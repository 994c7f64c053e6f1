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


LORA = {"on": False}
# `--model llama3_2`: torchtune's `llama3_2` builder (the output tied to the embedding: `TiedLinear`, whose `linear`
# module carries the NoOpManager hooks in `get_act_offloading_ctx_manager`)
MODEL = {"name": "llama3"}


def build(tdtype):
    """measure_frameworks.py's `build_torchtune_llama3`, or with `--lora` measure_tune_compile.py's LoRA build
    (`lora_llama3_1`, LoRALinear on q and v, rank 8, adapters trainable)."""
    if LORA["on"]:
        import measure_tune_compile as TC
        lm = TC.build(tdtype, True)
    elif MODEL["name"] == "llama3_2":
        lm = F.build_torchtune_llama3_2(R.S, tdtype)
    else:
        lm = F.build_torchtune_llama3(R.S, tdtype)
    lm.tune_loss_step = types.MethodType(tune_loss_step, lm)
    if not isinstance(lm.model.output, torch.nn.Module):
        # TiedLinear: torchtune hooks its `linear` module (get_act_offloading_ctx_manager)
        lm.get_output_embeddings = lambda: lm.model.output.linear
    return lm


def _np_host_copy(t, contiguous=False, ledger=None):
    """measure_recipes.py `_host_copy` with the host buffer taken from numpy: torch.profiler records every c10 CPU
    allocation (the compiled step's peak comes from its memory events), and a pinned host buffer is not device
    memory. The same accounting (`ledger`); the buffer is dense, as `empty_like` of the dense tensors packed here."""
    import numpy as np
    from torch.utils._python_dispatch import _disable_current_modes
    n = t.numel() * t.element_size()
    with _disable_current_modes():
        h = torch.from_numpy(np.empty(n, dtype=np.uint8)).view(t.dtype).view(t.shape)
        h.copy_(t)
    if ledger is not None:
        ledger.host_bytes += n
        ledger.host_peak = max(ledger.host_peak, ledger.host_bytes)
        ledger.host_total += n
        R.weakref.finalize(h.untyped_storage(), R._host_freed, R.weakref.ref(ledger), n)
    return h


def measure_compiled(dtype: str, opts: dict) -> dict:
    """torchtune's order (`compile_model`, then `set_activation_checkpointing`, then `compile_loss`:
    measure_tune_compile.py `tune_compile`), with `_loss_step`'s offloading context and the `NoOpManager` on
    `model.output`; the step profiled (torch.profiler memory events) after a first step that compiles."""
    import gc
    import measure_tune_compile as TC
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    gc.collect()
    R._host_copy = _np_host_copy
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    lm = build(tdtype)
    cfg = dict(M.config_dict(lm), framework="torchtune")
    ids = M.make_ids(lm, R.B, R.S)
    TC.tune_compile(lm, "full")
    hooks: dict = {}
    head = lm.get_output_embeddings()
    head.register_forward_pre_hook(lambda *a: hooks["noop"].__enter__())
    head.register_forward_hook(lambda *a: hooks["noop"].__exit__(None, None, None), always_call=True)

    def forward(input_ids, labels=None, use_cache=False):
        ctx = R.CpuOffloadActivations()
        hooks["ctx"] = ctx
        hooks["noop"] = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
        loss, out = lm.tune_loss_step(input_ids, ctx)
        return F.Output(loss=loss, logits=out.logits)
    lm.forward = forward
    opt = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad])
    torch.manual_seed(M.DATA_SEED)
    R.one_step(lm, opt, ids)
    counters_1 = R.dynamo_counters()
    gc.collect()
    extra = {"ids_saved_bytes": 0, "loss_bytes": 0, "regions": {}}
    step, _, counters_2 = R.profiled_compiled_step(f"torchtune-{MODEL['name']}", lm, opt, ids, {"is_saved": True, "bytes": 0},
                                                    extra, 0, counters_1)
    step["checks"].pop("forward_unexplained", None)
    # after backward the device holds the trainable parameters' gradients only (LoRA: the adapters')
    grads = sum(p.numel() * p.element_size() for p in lm.parameters() if p.requires_grad)
    step["checks"]["backward_unexplained"] = step["live_end_of_phase"].get("backward", 0) - grads
    ctx = hooks["ctx"]
    moved = [e for e in ctx.log if e["decision"] == "offloaded"]
    step["host_bytes_copied_in_forward"] = ctx.host_total
    step["host_peak_bytes"] = ctx.host_peak
    step["h2d_copies"] = ctx.h2d_copies
    step["unpacked_from_fwd_stash"] = ctx.stash_hits
    step["checks"]["host_bytes_after_backward"] = ctx.host_bytes
    pi = R.param_info(lm)
    family = f"torchtune-{MODEL['name']}"
    rid = (f"{family}/b{R.B}/s{R.S}/{dtype}/sdpa/compile=layer+recompute=full+act_offload=torchtune"
           + ("/lora-r8-qv" if LORA["on"] else ""))
    rec = {"id": rid, "family": family, "model_type": cfg["model_type"],
           "config_key": f"{family}/{cfg.get('dtype')}", "batch": R.B, "seq": R.S, "dtype": dtype,
           "attn": "sdpa", **pi, "framework": "torchtune", "framework_version": "0.6.1",
           "recipe": {"act_offload": "torchtune", "recompute": "full", "compile": True, "compile_regions": "layer",
                      "compiled_loss": True, "min_offload_size": 1024, "max_fwd_stash_size": 5, "use_streams": True,
                      "output_head_noop": "model.output",
                      "loss": "CEWithChunkedOutputLoss(num_output_chunks=8), compute_cross_entropy compiled, outside "
                              "the offload context",
                      "applied_by": "torchtune 0.6.1 training.compile_model, set_activation_checkpointing, "
                                    "compile_loss, get_act_offloading_ctx_manager"},
           **({"lora": {"builder": "lora_llama3_1", "lora_attn_modules": ["q_proj", "v_proj"], "lora_rank": 8,
                        "lora_alpha": 16, "lora_dropout": 0.0, "trainable": "get_adapter_params"}}
              if LORA["on"] else {}),
           "packs": len(ctx.log), "offloaded_tensors": len(moved), "offloaded_bytes": sum(e["bytes"] for e in moved),
           "kept_bytes": sum(e["bytes"] for e in ctx.log if e["decision"] != "offloaded"),
           "packed": [{k: e[k] for k in ("dtype", "shape", "bytes", "decision")} for e in ctx.log],
           # preserve_rng_state's `torch.get_rng_state()` per checkpointed layer, alive from its forward to its
           # recomputation (host memory on a GPU): in a peak the profiler measures in forward
           "checkpoint_rng_state_bytes": torch.get_rng_state().numel() * len(lm.model.layers),
           "dynamo": counters_2, "step": step, "step_method": "torch.profiler memory events (CPU allocator)",
           "saved_bytes": None, "saved": []}
    opts["cfg"] = cfg
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None)
    ap.add_argument("--compiled", action="store_true", help="compile=layer + recompute=full (torchtune's order)")
    ap.add_argument("--lora", action="store_true", help="torchtune's LoRALinear on q and v, r 8 (bf16)")
    ap.add_argument("--model", default="llama3", choices=("llama3", "llama3_2"))
    ap.add_argument("--child", nargs=2, metavar=("DTYPE", "OUT_JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    LORA["on"] = args.lora
    MODEL["name"] = args.model
    torch.set_num_threads(1)
    if args.child:
        dtype, out_json = args.child
        opts: dict = {}
        rec = measure_compiled(dtype, opts)
        with open(out_json, "w") as f:
            json.dump({"record": rec, "cfg": opts["cfg"]}, f)
        return
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"torchtune-{args.model}.json")
    if args.compiled:
        n_fail = 0
        for dtype in R.DTYPES:
            if args.only and args.only not in dtype:
                continue
            doc = json.load(open(path))
            n_fail += not R.run_child_into([sys.executable, os.path.abspath(__file__), "--model", args.model]
                                           + (["--lora"] if args.lora else [])
                                           + ["--child", dtype], path, doc,
                                           f"{dtype}/compiled")
        sys.exit(1 if n_fail else 0)
    doc = json.load(open(path)) if os.path.exists(path) else {
        "generated_by": "validation/measure_tune_offload.py", "torch": torch.__version__.split("+")[0],
        "framework": "torchtune", "framework_version": "0.6.1", "family": args.model, "device": "cpu",
        "configs": {}, "records": []}
    family = f"torchtune-{args.model}"
    for dtype in R.DTYPES:
        for recipe in RECIPES:
            rid = f"{family}/b{R.B}/s{R.S}/{dtype}/sdpa/{recipe}" + ("/lora-r8-qv" if args.lora else "")
            if args.only and args.only not in rid:
                continue
            tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
            M.build_model = lambda f, d, a, dr, e, _t=tdtype: build(_t)
            opts: dict = {}
            rec = R.measure_offload(family, dtype, "sdpa", recipe, opts)
            cfg = dict(opts["cfg"], framework="torchtune")
            rec["id"] = rid
            if args.lora:
                rec["lora"] = {"builder": "lora_llama3_1", "lora_attn_modules": ["q_proj", "v_proj"], "lora_rank": 8,
                               "lora_alpha": 16, "lora_dropout": 0.0, "trainable": "get_adapter_params"}
            rec["framework"] = "torchtune"
            rec["framework_version"] = "0.6.1"
            rec["recipe"]["loss"] = ("CEWithChunkedOutputLoss(num_output_chunks=8), eager, outside the offload "
                                     "context (full_finetune_single_device.py _loss_step)")
            if "recompute" in rec["recipe"]:
                rec["recipe"]["checkpoint"] = ("torchtune training.set_activation_checkpointing (checkpoint_wrapper, "
                                               "non-reentrant): positional input x saved under the outer hooks")
            rec["recipe"]["output_head_noop"] = "model.output"
            if "log" in R.LAST_LOG:  # the tracked step 2's event log, as measure_recipes.py writes its records'
                log = {"id": rid, "summary": {k: rec["step"].get(k) for k in (
                    "peak_live_bytes", "measured_peak_bytes", "peak_phase", "peak_op", "peak_module", "peak_node")},
                    **R.LAST_LOG.pop("log")}
                os.makedirs(os.path.join(OUT, "steps"), exist_ok=True)
                with open(os.path.join(OUT, "steps", M.step_log_name(rid)), "w") as f:
                    f.write(M.dump_log(log))
            doc["configs"][rec["config_key"]] = cfg
            doc["records"] = [r for r in doc["records"] if r["id"] != rid] + [rec]
            st = rec["step"]
            print(f"{rid}: offloaded {rec['offloaded_bytes']} B; peak {st['measured_peak_bytes']} B "
                  f"({st.get('peak_phase')} {st.get('peak_op')})", file=sys.stderr, flush=True)
            with open(path, "w") as f:
                f.write(M.dump(doc))


if __name__ == "__main__":
    main()
