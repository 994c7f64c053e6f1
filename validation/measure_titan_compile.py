#!/usr/bin/env python3
"""torch.compile on torchtitan 0.2.2's own Llama 3 and dense Qwen3, as torchtitan applies it (`compile.enable = true`,
`compile.components = ["model", "loss"]`, its default, or `["model"]`), on CPU: the estimator's
`framework = torchtitan`, `compile = true`, `compile_regions = layer` (blocks and loss) or `block` (blocks alone).

What torchtitan does (0.2.2):

* `parallelize_llama` / `parallelize_qwen3`: `apply_ac` first (distributed/activation_checkpoint.py: every
  TransformerBlock wrapped in `ptd_checkpoint_wrapper`; `mode = "full"`, or `"selective"` with
  `selective_ac_option = "op"` and the model's `_op_sac_save_list`), then `apply_compile`: each block (its checkpoint
  wrapper inside) replaced by `torch.compile(block, backend="inductor", fullgraph=True)` (models/llama3/infra/
  parallelize.py for Llama 3; models/llama4/infra/parallelize.py's, whose dense branch is the same, for Qwen3).
* components/loss.py `build_cross_entropy_loss`: `cross_entropy_loss` compiled (`torch.compile(loss_fn)`, "loss" in
  `compile.components`); train.py divides its sum by the valid-token count eagerly.

Everything here is torchtitan's own code (`apply_ac`, `apply_compile`, `cross_entropy_loss`, the save list), called
on the tiny models validation/measure_frameworks.py builds. On a CPU the save list gets the CPU's SDPA kernel
(`_scaled_dot_product_flash_attention_for_cpu`), the counterpart of the CUDA kernels it names (what a GPU run saves;
measure_recipes.py's `recompute=op` does the same).

The measurement is measure_recipes.py's `measure_compile` (saved tensors read from the autograd graph after a compiled
forward: `CompiledFunctionBackward` nodes' saved tensors plus eager nodes' `_saved_*`; the step's peak from
torch.profiler memory events), each record in a fresh interpreter.

Writes tests/fixtures/pytorch/frameworks/torchtitan-<family>-compile.json ({configs, records}) and the profiled
step's allocation trace under tests/fixtures/pytorch/frameworks/steps/.

Records are named by the estimator's keys: `compile=layer` is torchtitan's default components (each block and the
loss), `compile=block` the blocks alone (`--components model`, the loss eager), each `+recompute=full|op` where AC is on.

Float8 (`--fp8 tensorwise|rowwise`, `quantize.linear.float8.recipe_name`): torchtitan's `Float8LinearConverter.convert`
(components/quantization/float8.py) is `convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(
recipe), module_filter_fn=partial(module_filter_fn, filter_fqns=[]))` (components/quantization/utils.py: every
nn.Linear whose two dims are multiples of 16 and whose fqn matches no `filter_fqns`, empty by default); train.py runs
it on the built model before `parallelize_*` (so before apply_ac and apply_compile), and for rowwise sets
`torch._inductor.config.emulate_precision_casts = True`. The converter itself is not called: its constructor refuses
without an SM89 GPU when the model is compiled (`has_cuda_capability(8, 9)`); what it calls is called here, the same
way. torch 2.15 runs `_scaled_mm` on the CPU, and Inductor compiles Float8Linear's casts (the CPU backend's C++
kernels) — the blocks are Inductor's, as on a GPU. Records get `+fp8=<recipe>` in their tag and are written to
torchtitan-<family>-compile-fp8.json; `eager_reference` there is the unconverted model's eager step.

Usage:  nice validation/.venv/bin/python validation/measure_titan_compile.py [--only SUBSTRING] [--components model]
            [--fp8 tensorwise|rowwise]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import measure_recipes as R  # noqa: E402  (imports measure, torch)
import measure_frameworks as F  # noqa: E402
import torch  # noqa: E402

M = R.M
OUT = F.OUT
FAMILIES = {"llama3": F.build_torchtitan_llama3, "qwen3": F.build_torchtitan_qwen3}
RECOMPUTES = ("none", "full", "op")
DTYPES = ("fp32", "bf16")


def build(fam: str, dtype: str):
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    return FAMILIES[fam](R.S, tdtype)


def titan_float8(lm, recipe: str):
    """torchtitan 0.2.2's `Float8LinearConverter` (`recipe_name = recipe`, `filter_fqns = []`) on the built model,
    as train.py runs it before `parallelize_*`. Returns the converted and the kept linears' fqns."""
    from functools import partial
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear
    from torchtitan.components.quantization.utils import module_filter_fn
    if recipe == "rowwise":  # Float8LinearConverter.__init__ (pytorch/pytorch#150859)
        torch._inductor.config.emulate_precision_casts = True
    convert_to_float8_training(lm.model, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=partial(module_filter_fn, filter_fqns=[]))
    conv = [n for n, m in lm.model.named_modules() if isinstance(m, Float8Linear)]
    kept = [n for n, m in lm.model.named_modules() if type(m) is torch.nn.Linear]
    return {"recipe": recipe, "converter": "torchtitan 0.2.2 Float8LinearConverter.convert (filter_fqns=[])",
            "converted": conv, "kept": kept}


def titan_parallelize(lm, fam: str, recompute: str, components: tuple):
    """torchtitan's `apply_ac` (mode full, or selective op with the model's save list) then its `apply_compile`
    (per TransformerBlock), then the loss as `build_cross_entropy_loss` leaves it (compiled when "loss" is in
    `compile.components`)."""
    from torchtitan.config.job_config import ActivationCheckpoint, Compile
    from torchtitan.distributed.activation_checkpoint import apply_ac
    from torchtitan.components.loss import cross_entropy_loss
    model = lm.model
    # The model packages' __init__ (train specs: datasets, tokenizers) are not entered: each parallelize module is
    # imported under a bare package (measure_frameworks.py `bare_packages`).
    F.bare_packages("llama3", "llama4", "qwen3")
    if fam == "llama3":
        from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list, apply_compile
        compile_blocks = lambda m, c: apply_compile(m, c)  # noqa: E731
    else:
        from torchtitan.models.qwen3.infra.parallelize import _op_sac_save_list
        from torchtitan.models.llama4.infra.parallelize import apply_compile
        compile_blocks = lambda m, c: apply_compile(m, c, False)  # noqa: E731  (ep_enabled=False)
    if recompute != "none":
        ac = ActivationCheckpoint(mode="full") if recompute == "full" else \
            ActivationCheckpoint(mode="selective", selective_ac_option="op")
        apply_ac(model, ac, model_compile_enabled=True, op_sac_save_list=set(_op_sac_save_list) | {R.CPU_SDPA})
    compile_blocks(model, Compile(enable=True))
    if "loss" in components:
        lm.loss_fn = F.titan_loss(torch.compile(cross_entropy_loss, backend="inductor"))
    lm._blocks = model.layers
    return list(model.layers.values())


def measure_titan_compile(fam: str, dtype: str, recompute: str, opts: dict, components=("model", "loss"),
                          fp8: str = "none"):
    """measure_recipes.measure_compile with torchtitan's parallelize in place of `compile_layers`."""
    from torch._dynamo.utils import counters
    import gc
    family = f"torchtitan-{fam}"
    torch._dynamo.reset()
    counters.clear()
    R.GRAPHS.clear()
    gc.collect()
    M.build_model = lambda f, d, a, dr, e: build(fam, d)  # eager_reference builds through measure.build_model
    ref = R.eager_reference(family, dtype, "sdpa")
    R.install_partition_spy()
    model = build(fam, dtype)
    cfg = dict(M.config_dict(model), framework="torchtitan")
    ids = M.make_ids(model, R.B, R.S)
    fp8_info = titan_float8(model, fp8) if fp8 != "none" else None
    if fp8_info:
        print(f"float8 {fp8}: converted {fp8_info['converted']}, kept {fp8_info['kept']}", file=sys.stderr)
    blocks = titan_parallelize(model, fam, recompute, components)
    ranges = R.SeqRanges(model, opaque=blocks)
    opt = torch.optim.AdamW(model.parameters())
    entries, logits_info, extra, saved_bytes, compile_s, counters_1 = R.compile_then_read_saved(model, opt, ids, ranges)
    a_state, a_step = R.adamw_state_bytes(opt)
    step, regions, counters_2 = R.profiled_compiled_step(family, model, opt, ids, logits_info, extra, saved_bytes,
                                                         counters_1)
    pi = R.param_info(model)
    # The estimator's keys: `compile_regions = layer` is torchtitan's default components (each block and the loss),
    # `block` the blocks alone (components = ["model"], the loss eager).
    regions_key = "layer" if "loss" in components else "block"
    tag = f"compile={regions_key}" + (f"+recompute={recompute}" if recompute != "none" else "") + \
        (f"+fp8={fp8}" if fp8 != "none" else "")
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    rec = {"id": f"{family}/b{R.B}/s{R.S}/{dtype}/sdpa/{tag}", "family": family, "model_type": cfg["model_type"],
           "config_key": f"{family}/{cfg.get('dtype')}", "batch": R.B, "seq": R.S, "dtype": dtype, "attn": "sdpa",
           **pi, "gradient_bytes": grads, "adamw": {"state_bytes": a_state, "step_bytes": a_step},
           "framework": "torchtitan", "framework_version": "0.2.2", "checkpointing": recompute != "none"}
    rec.update({"recipe": {"compile": True, "compile_regions": regions_key, "components": list(components),
                           "compiled_loss": "loss" in components, "recompute": recompute,
                           "applied_by": "torchtitan 0.2.2 apply_ac + apply_compile, build_cross_entropy_loss",
                           **({"policy": "torchtitan 0.2.2 _op_sac_save_list (+ CPU SDPA)"}
                              if recompute == "op" else {})},
                "saved_bytes": saved_bytes, "saved_storages": len(entries), "logits": logits_info,
                "saved_parameter_storages": extra["saved_parameter_storages"],
                "saved_buffer_storages": extra["saved_buffer_storages"], "dynamo": counters_2,
                "regions": regions, "step": step, "step_method": "torch.profiler memory events (CPU allocator)",
                **({"fp8": fp8_info, "eager_reference_model": "unconverted (nn.Linear)"} if fp8_info else {}),
                "eager_reference": ref, "compile_seconds": round(compile_s, 1), "saved": R.aggregate_rows(entries)})
    opts["cfg"] = cfg
    ranges.remove()
    return rec


def specs(only):
    for fam in FAMILIES:
        for dtype in DTYPES:
            for rc in RECOMPUTES:
                key = f"{fam}/{dtype}/{rc}"
                if only is None or only in key:
                    yield fam, dtype, rc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="substring of family/dtype/recompute")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--components", default="model,loss", help="torchtitan's compile.components (default model,loss)")
    ap.add_argument("--fp8", default="none", choices=("none", "tensorwise", "rowwise"),
                    help="torchtitan's quantize.linear.float8 recipe_name (default: no float8)")
    ap.add_argument("--child", nargs=4, metavar=("FAMILY", "DTYPE", "RECOMPUTE", "OUT_JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.child:
        fam, dtype, rc, out_json = args.child
        opts: dict = {}
        rec = measure_titan_compile(fam, dtype, rc, opts, tuple(args.components.split(",")), args.fp8)
        R.write_step_log(rec, args.out)
        with open(out_json, "w") as f:
            json.dump({"record": rec, "cfg": opts["cfg"]}, f)
        return
    n_fail = 0
    for fam, dtype, rc in specs(args.only):
        name = f"torchtitan-{fam}-compile" + ("-fp8" if args.fp8 != "none" else "")
        path = os.path.join(args.out, f"{name}.json")
        doc = json.load(open(path)) if os.path.exists(path) else {
            "generated_by": "validation/measure_titan_compile.py", "torch": torch.__version__.split("+")[0],
            "framework": "torchtitan", "framework_version": "0.2.2", "family": fam, "device": "cpu",
            **({"torchao": __import__("torchao").__version__} if args.fp8 != "none" else {}),
            "configs": {}, "records": []}
        cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--components", args.components,
               "--fp8", args.fp8, "--child", fam, dtype, rc]
        n_fail += not R.run_child_into(cmd, path, doc, f"{fam}/{dtype}/{rc}")
    sys.exit(1 if n_fail else 0)


if __name__ == "__main__":
    main()
