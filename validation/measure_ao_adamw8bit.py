#!/usr/bin/env python3
"""torchao's ``AdamW8bit`` step: what one parameter's compiled step allocates (validation/FINDINGS.md §15.6,
"torchao's AdamW8bit"; not modelled by the estimator, which takes bitsandbytes' ``AdamW8bit`` for ``optim=adam8bit``).

torchao 0.18 ``optim/adam.py``: the states are ``OptimState8bit`` (uint8 codes and an fp32 scale per 256 elements)
for tensors of at least 4,096 elements divisible by 256, and each parameter is stepped by
``torch.compile(single_param_adam, fullgraph=True, dynamic=False)``, which computes ``exp_avg.float().lerp(...)`` and
``exp_avg_sq.float().lerp(...)`` in fp32 and ``copy_``s them back into the 8-bit states.

One bf16 parameter of ``N`` elements with a gradient, two steps (the states made, the step compiled), then a third:
on the CPU under ``torch.profiler``'s memory events (the running sum over the step, and every allocation of at least
``N`` bytes), on CUDA with ``torch.cuda.max_memory_allocated`` around it. Prints one JSON line.

On the CPU (torch 2.15, Inductor's C++ backend), 2026-12-07: N = 4,194,304 → two allocations of 16,777,216 B (fp32,
the parameter's size) live together, a peak 33,685,504 B over the step's start (8.03 B an element). The CUDA figure
(Triton kernels, which may fuse the block quantization and keep neither buffer) is the one a model needs.

Usage: PYTHONPATH=<torchao 0.18 --no-deps target> nice validation/.venv/bin/python validation/measure_ao_adamw8bit.py
[--device cuda] [--numel N]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--numel", type=int, default=1 << 22)
    a = ap.parse_args()
    from torchao.optim import AdamW8bit

    torch.manual_seed(0)
    n = a.numel
    p = torch.nn.Parameter(torch.randn(n // 1024, 1024, dtype=torch.bfloat16, device=a.device))
    p.grad = torch.randn_like(p)
    opt = AdamW8bit([p])
    opt.step()  # the states
    opt.step()  # compiled

    def nbytes(t):
        inner = [getattr(t, k) for k in ("codes", "scale") if hasattr(t, k)]
        return sum(x.untyped_storage().nbytes() for x in inner) if inner else t.untyped_storage().nbytes()

    out = {"device": a.device, "numel": n, "torch": torch.__version__.split("+")[0],
           "param_bytes": p.untyped_storage().nbytes(),
           "state_bytes": {k: nbytes(v) for k, v in opt.state[p].items() if torch.is_tensor(v)}}
    if a.device == "cuda":
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        opt.step()
        torch.cuda.synchronize()
        out["step_peak_over_start"] = torch.cuda.max_memory_allocated() - start
    else:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            opt.step()
        trace = os.path.join(tempfile.mkdtemp(), "trace.json")
        prof.export_chrome_trace(trace)
        mem = sorted((e for e in json.load(open(trace))["traceEvents"] if e.get("name") == "[memory]"),
                     key=lambda e: e["ts"])
        live = peak = 0
        for e in mem:
            live += e["args"]["Bytes"]
            peak = max(peak, live)
        out["step_peak_over_start"] = peak
        out["allocations_of_numel_bytes_or_more"] = [e["args"]["Bytes"] for e in mem if e["args"]["Bytes"] >= n]
    out["bytes_per_element"] = round(out["step_peak_over_start"] / n, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
