#!/usr/bin/env python3
"""Check the issue-27 rules of FINDINGS.md §10–§12 against every record of tests/fixtures/pytorch/{fp8,qlora,loading}.

No torch needed. For each rule it prints how many records (or windows) it was checked on and how many are off; exit
status 1 if any is off.

* fp8 (torchao 0.18 Float8Linear, eager): saved tensors, parameters, gradients and optimizer states equal the bf16
  baseline's; every linear's forward call and backward node is an *allocation program* (``fp8_forward`` /
  ``fp8_backward`` below) whose replay gives the window's transient peak, the bytes it leaves alive, the number and
  total of its allocations, and — for the b2 s64 records, which store them — the exact list of allocations;
  FSDP2 float8 all-gather: 1 byte per float8 weight element + the unsharded bytes of the rest, in one uint8 buffer.
* qlora (bitsandbytes 0.50.2 NF4 + peft LoRA): the 4-bit layout (packed bytes, absmax, nested absmax, code tables),
  the quant-state bytes, the fp32 upcast of prepare_model_for_kbit_training, and the allocation program of a
  Linear4bit forward call and of its MatMul4Bit backward node.
* loading (transformers 5.24 from_pretrained): on fake CUDA the warmup allocation equals the unique parameter bytes
  and is freed before any parameter; every parameter is one allocation of its final size; no device transient.
"""

from __future__ import annotations

import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "pytorch")

RESULTS: dict[str, list[int]] = {}
EXAMPLES: dict[str, list[str]] = {}


def check(rule: str, ok: bool, what: str = ""):
    r = RESULTS.setdefault(rule, [0, 0])
    r[0] += 1
    if not ok:
        r[1] += 1
        EXAMPLES.setdefault(rule, [])
        if len(EXAMPLES[rule]) < 3:
            EXAMPLES[rule].append(what)


# ----------------------------------------------------------------------------------------------------------------------
# Allocation programs
# ----------------------------------------------------------------------------------------------------------------------

class Prog:
    """A sequence of allocations and frees; replay() gives (peak over start, bytes left, [allocations]). The peak is
    net of frees of storages from before the program (``fb``), as the records' transient peaks are; the bytes left
    are the program's own allocations still alive (the records' left_alive + freed_from_before)."""

    def __init__(self):
        self.ev = []
        self.n = 0

    def a(self, op, dtype, shape, nbytes=None):
        itemsize = {"bfloat16": 2, "float32": 4, "float64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1}[dtype]
        if nbytes is None:
            nbytes = itemsize * math.prod(shape)
        self.n += 1
        self.ev.append(("a", self.n, op, dtype, list(shape), nbytes))
        return self.n

    def f(self, *hs):
        for h in hs:
            if h is not None:
                self.ev.append(("f", h))

    def fb(self, nbytes):
        """Frees a storage allocated before the program (a selective-checkpoint cache entry the recomputation
        popped)."""
        self.ev.append(("fb", nbytes))

    def replay(self):
        live = peak = before = 0
        size, allocs = {}, []
        freed = set(e[1] for e in self.ev if e[0] == "f")
        for e in self.ev:
            if e[0] == "a":
                size[e[1]] = e[5]
                live += e[5]
                peak = max(peak, live)
                allocs.append([e[2], e[3], e[4], e[5], e[1] in freed])
            elif e[0] == "fb":
                live -= e[1]
                before += e[1]
            else:
                live -= size.pop(e[1])
        return peak, live + before, allocs


def amax_scale(p: Prog, hp_shape, scale_shape, pow2: bool, tensorwise: bool, sac: str | None = None):
    """tensor_to_scale: abs, max/amax, fp64 scale math, fp32 scale (rounded to a power of 2 when asked).
    Returns the handle of the fp32 scale that the Float8TrainingTensor keeps.

    ``sac`` (recompute=op, the ckpt-op records): the tensorwise amax is ``aten.max.default``, in torchtitan's save
    list: in the forward (``"forward"``) the SAC cache keeps it (never freed here); the recomputation
    (``"recompute"``) gets it from the cache instead of allocating it and frees it where the forward would have."""
    cached = tensorwise and sac is not None
    ab = p.a("abs", "bfloat16", hp_shape)
    am = None if cached and sac == "recompute" else p.a("max" if tensorwise else "amax", "bfloat16", scale_shape)
    if cached and sac == "forward":
        am_keep, am = am, None
    del_am = (lambda: p.fb(2 * math.prod(scale_shape))) if cached and sac == "recompute" else (lambda: None)
    p.f(ab)
    c64 = p.a("_to_copy", "float64", scale_shape)
    cl = p.a("clamp", "float64", scale_shape)
    rc = p.a("reciprocal", "float64", scale_shape)
    mu = p.a("mul", "float64", scale_shape)
    p.f(rc, cl)
    s32 = p.a("_to_copy", "float32", scale_shape)
    p.f(mu)
    if pow2:
        lg = p.a("log2", "float32", scale_shape)
        fl = p.a("floor", "float32", scale_shape)
        p.f(lg)
        ex = p.a("exp2", "float32", scale_shape)
        p.f(fl, s32, c64, am)
        del_am()
        return ex
    p.f(c64, am)
    del_am()
    return s32


def cast(p: Prog, hp_shape, scale_shape, fp8: str, pow2: bool, tensorwise: bool, sac: str | None = None):
    """hp_tensor_to_float8_dynamic: the scale, then fp32 copy * scale, clamp, to fp8. Returns (fp8, scale) handles."""
    sc = amax_scale(p, hp_shape, scale_shape, pow2, tensorwise, sac)
    c32 = p.a("_to_copy", "float32", hp_shape)
    mu = p.a("mul", "float32", hp_shape)
    p.f(c32)
    cl = p.a("clamp", "float32", hp_shape)
    q = p.a("_to_copy", fp8, hp_shape)
    p.f(cl, mu)
    return q, sc


RECIPES = {
    # (input, weight, grad_output, weight_for_grad_input, input_for_grad_weight, grad_output_for_grad_weight):
    # granularity "t" tensorwise / "a" axiswise / None disabled, and the fp8 dtype of grad_output
    "tensorwise": dict(i="t", w="t", go="t", w_gi="t", i_gw="t", go_gw="t", go_dtype="float8_e5m2", pow2=False),
    "rowwise": dict(i="a", w="a", go="a", w_gi="a", i_gw="a", go_gw="a", go_dtype="float8_e4m3fn", pow2=True),
    "rowwise_with_gw_hp": dict(i="a", w="a", go="a", w_gi="t", i_gw=None, go_gw=None, go_dtype="float8_e4m3fn",
                               pow2=True),
}


def scaled_mm(p: Prog, a_rows, a_scale, b_cols, b_scale, out_shape, fast_accum: bool):
    """addmm_float8_unwrapped (+ preprocess_addmm's scale repeat when the granularities differ)."""
    a_ax, b_ax = a_scale != [], b_scale != []
    extra = []
    if not a_ax and b_ax:  # tensorwise a, axiswise b: a_scale.repeat(rows).reshape(-1, 1)
        extra.append(p.a("repeat", "float32", [a_rows]))
        a_scale = [a_rows, 1]
    elif a_ax and not b_ax:
        extra.append(p.a("repeat", "float32", [b_cols]))
        b_scale = [1, b_cols]
    ra = p.a("reciprocal", "float32", a_scale)
    rb = p.a("reciprocal", "float32", b_scale)
    rowwise = a_scale == [a_rows, 1] and b_scale == [1, b_cols]
    if rowwise and not fast_accum:
        post = p.a("mul", "float32", out_shape)
        o1 = p.a("new_ones", "float32", [])
        p.f(ra)
        o2 = p.a("new_ones", "float32", [])
        p.f(rb)
        out = p.a("_scaled_mm", "bfloat16", out_shape)
        p.f(o1, o2, post)
        return out, extra
    out = p.a("_scaled_mm", "bfloat16", out_shape)
    p.f(ra, rb)
    return out, extra


def fp8_forward(recipe: str, lead, K: int, N: int, sac: str | None = None, mm_cached: bool = False):
    """Float8Linear.forward on an input of shape lead + [K] (weight [N, K], no bias). ``sac``: under recompute=op,
    the layer's forward ("forward") or its recomputation ("recompute"); ``mm_cached``: the policy saved this
    linear's ``aten.mm`` (odd mm count): the recomputation gets its output from the cache without dispatching it, so
    ``Float8TrainingTensor.__torch_dispatch__`` (the scale reciprocals, ``_scaled_mm``) never runs."""
    r = RECIPES[recipe]
    T = math.prod(lead)
    p = Prog()
    x_scale = [] if r["i"] == "t" else list(lead) + [1]
    xq, xs = cast(p, list(lead) + [K], x_scale, "float8_e4m3fn", r["pow2"], r["i"] == "t", sac)
    w_scale = [] if r["w"] == "t" else [1, N]
    wq, ws = cast(p, [K, N], w_scale, "float8_e4m3fn", r["pow2"], r["w"] == "t", sac)
    a_scale = [] if r["i"] == "t" else [T, 1]
    if sac == "recompute" and mm_cached:
        extra = []
    else:
        out, extra = scaled_mm(p, T, a_scale, N, w_scale, [T, N], fast_accum=True)
    p.f(*extra)
    p.f(wq, ws if r["w"] != "t" else None, xq, xs if r["i"] != "t" else None)
    if r["w"] == "t":
        p.f(ws)
    if r["i"] == "t":
        p.f(xs)
    return p


def fp8_backward(recipe: str, T: int, K: int, N: int):
    """matmul_with_hp_or_float8_args.backward for grad_output [T, N]: grad_input [T, K] and grad_weight."""
    r = RECIPES[recipe]
    p = Prog()
    go_scale = [] if r["go"] == "t" else [T, 1]
    gq, gs = cast(p, [T, N], go_scale, r["go_dtype"], r["pow2"], r["go"] == "t")
    wgi_scale = [] if r["w_gi"] == "t" else [K, 1]
    wq, ws = cast(p, [K, N], wgi_scale, "float8_e4m3fn", r["pow2"], r["w_gi"] == "t")
    wc = p.a("contiguous", "float8_e4m3fn", [K, N])  # b = w.t() is row-major: b.t().contiguous().t()
    b_scale = [] if r["w_gi"] == "t" else [1, K]
    gi, extra = scaled_mm(p, T, go_scale, K, b_scale, [T, K], fast_accum=False)
    p.f(wc, *extra)
    if r["i_gw"] is None:  # grad_weight in high precision
        gw = p.a("mm", "bfloat16", [N, K])
        keep = [gq, gs, wq, ws]
    else:
        go2_scale = [] if r["go_gw"] == "t" else [1, N]
        g2, g2s = cast(p, [T, N], go2_scale, r["go_dtype"], r["pow2"], r["go_gw"] == "t")
        x_scale = [] if r["i_gw"] == "t" else [1, K]
        xq, xs = cast(p, [T, K], x_scale, "float8_e4m3fn", r["pow2"], r["i_gw"] == "t")
        ac = p.a("contiguous", r["go_dtype"], [N, T])
        bc = p.a("contiguous", "float8_e4m3fn", [K, T])
        a_sc = [] if r["go_gw"] == "t" else [N, 1]
        gw, extra2 = scaled_mm(p, N, a_sc, K, x_scale, [N, K], fast_accum=False)
        p.f(ac, bc, *extra2)
        keep = [gq, gs, wq, ws, g2, g2s, xq, xs]
    p.f(*keep)
    return p


# ----------------------------------------------------------------------------------------------------------------------
# fp8
# ----------------------------------------------------------------------------------------------------------------------

LINEAR_DIMS = {  # (in K, out N) of the tiny llama-gqa / qwen3 (hidden 64, 4 heads x 16, 2 kv heads, intermediate 176)
    "q_proj": (64, 64), "k_proj": (64, 32), "v_proj": (64, 32), "o_proj": (64, 64),
    "gate_proj": (64, 176), "up_proj": (64, 176), "down_proj": (176, 64),
}


def check_fp8():
    path = os.path.join(FIX, "fp8", "records.json")
    if not os.path.exists(path):
        return
    doc = json.load(open(path))
    recs = {r["id"]: r for r in doc["records"]}
    for rid, r in recs.items():
        base_id, recipe = rid.rsplit("/", 1)
        recipe = recipe[len("fp8-"):]
        base = recs[base_id + "/fp8-none"]
        rec_name = recipe.replace("-recompute", "")
        op = r["checkpoint_mode"] == "op"
        mm_saved = {}
        if op:
            check_fp8_policy(rid, r, rec_name)
            # layer 0's policy decisions on each Float8Linear's aten.mm (torchtitan's parity count)
            mm_saved = {o[3].rsplit(".", 1)[-1]: o[1] for o in r["sac_ops"][0] if o[0] == "mm.default"}
        if recipe != "none":
            # recompute=op: the SAC cache also keeps every tensorwise amax (aten.max.default, in the save list;
            # rowwise's aten.amax is not): the input's and the weight's, 2 B each, per Float8Linear
            n_f8 = len(r["fp8"]["converted_linears"]) * doc["configs"][r["config_key"]]["num_hidden_layers"]
            amaxes = 2 * n_f8 if op and rec_name == "tensorwise" else 0
            extra = {"saved_bytes": 2 * amaxes, "saved_storages": amaxes}
            for k in ("saved_bytes", "saved_storages", "parameter_bytes", "gradient_bytes"):
                want = base[k] + extra.get(k, 0)
                check(f"fp8: {k} = the bf16 baseline's (+ the cached tensorwise amaxes under recompute=op)",
                      r[k] == want, f"{rid} {k} {r[k]} != {want}")
            check("fp8: saved rows = the bf16 baseline's (module, dtype, elements, bytes, count)",
                  _same_saved(r, base), rid)
            check("fp8: AdamW state = the bf16 baseline's", r["adamw"] == base["adamw"], rid)
            want = base["step"]["live_after_forward"] + 2 * amaxes
            check("fp8: step live after forward = the bf16 baseline's (+ the cached amaxes under recompute=op)",
                  r["step"]["live_after_forward"] == want, rid)
        if rec_name == "none":
            continue
        b, s = r["batch"], r["seq"]
        for w in r["fp8"]["layer0_linears_step2"]:
            name = w["module"].rsplit(".", 1)[-1]
            K, N = LINEAR_DIMS[name]
            if r["checkpointing"] and w["kind"] == "backward" and name == "down_proj":
                # the first backward node of a checkpointed layer also recomputes the whole layer: its window
                # contains the layer's recompute windows, which are checked on their own
                continue
            if w["kind"] in ("forward", "recompute"):
                sac = w["kind"] if op else None
                prog = fp8_forward(rec_name, [b, s], K, N, sac, mm_saved.get(name, False))
            else:
                prog = fp8_backward(rec_name, b * s, K, N)
            peak, left, allocs = prog.replay()
            tag = f"{rid} {name} {w['kind']}"
            check(f"fp8 {w['kind'] if w['kind'] != 'recompute' else 'forward'} window: transient peak",
                  peak == w["transient_peak"], f"{tag}: {peak} != {w['transient_peak']}")
            # under checkpointing a backward node also frees recomputed tensors made before it (freed_from_before)
            check(f"fp8 {w['kind'] if w['kind'] != 'recompute' else 'forward'} window: bytes left alive",
                  left == w["left_alive"] + w["freed_from_before"], f"{tag}: {left} != {w['left_alive']}")
            check("fp8 windows: number and bytes of allocations",
                  (len(allocs), sum(a[3] for a in allocs)) == (w["n_allocs"], w["alloc_bytes"]),
                  f"{tag}: {(len(allocs), sum(a[3] for a in allocs))} != {(w['n_allocs'], w['alloc_bytes'])}")
            if "allocs" in w:
                got = [[a[0], a[1], a[2], a[3]] for a in allocs]
                exp = [[a[0], a[1], [x for x in a[2]] if len(a[2]) != 3 else [a[2][0] * a[2][1], a[2][2]], a[3]]
                       for a in w["allocs"]]
                # lead dims of the input are flattened in the program ([b, s, K] -> [T, K] where the record has 3D)
                got2 = [[g[0], g[1], g[2] if len(g[2]) != 3 else [g[2][0] * g[2][1], g[2][2]], g[3]] for g in got]
                check("fp8 windows (b2 s64): the exact allocation list", got2 == exp, tag)
    # FSDP2 float8 all-gather
    path = os.path.join(FIX, "fp8", "fsdp2_allgather.json")
    if os.path.exists(path):
        doc = json.load(open(path))
        by = {r["id"]: r for r in doc["records"]}
        for rid, r in by.items():
            if r["case"] == "bf16-allgather":
                continue
            base = by[rid.replace(r["case"], "bf16-allgather")]
            ag = [c for c in r["calls"] if c[0] == "all_gather"]
            bg = [c for c in base["calls"] if c[0] == "all_gather"]
            world = doc["world_size"]
            for c, cb in zip(ag, bg):
                out_b, base_b = c[4][2], cb[4][2]
                if c[4][0] == "uint8":  # a layer: float8 weights (1 B/element) + its bf16 norms
                    lin = sum(LINEAR_DIMS[n][0] * LINEAR_DIMS[n][1] for n in LINEAR_DIMS)
                    norms = (base_b - 2 * lin)
                    check("fsdp2 fp8 all-gather: output = 1 B x float8 weights + 2 B x the rest",
                          out_b == lin + norms, f"{rid}: {out_b} vs {lin} + {norms}")
                else:
                    check("fsdp2 fp8 all-gather: groups without Float8Linear unchanged", out_b == base_b, rid)
                isz = {"uint8": 1, "bfloat16": 2, "float32": 4}[c[3][0]]
                # (the input is a view into the output buffer: its own bytes are elements x itemsize)
                check("fsdp2 all-gather: input = output / world size", math.prod(c[3][1]) * isz * world == out_b,
                      rid)
            rsc = [c for c in r["calls"] if c[0] == "reduce_scatter"]
            rsb = [c for c in base["calls"] if c[0] == "reduce_scatter"]
            check("fsdp2 fp8: reduce-scatters unchanged (fp32 reduce_dtype)", rsc == rsb, rid)


def _same_saved(r, base):
    # the same storages; Float8Linear saves the 3-D input where nn.Linear's mm saves its 2-D view; under
    # recompute=op, besides the cached amaxes (counted by the caller)
    key = lambda s: (s["module"], s["dtype"], math.prod(s["shape"]), s["bytes"], s["count"])  # noqa: E731
    rows = [x for x in r["saved"] if not x["attr"].startswith("max.default")]
    return sorted(map(key, rows)) == sorted(map(key, base["saved"]))


def check_fp8_policy(rid, r, rec_name):
    """recompute=op: what torchtitan's policy sees of each Float8Linear (sac_ops, every layer)."""
    for layer in r["sac_ops"]:
        ops = [o[0] for o in layer]
        check("fp8 recompute=op: the policy never sees _scaled_mm", not any("_scaled_mm" in o for o in ops), rid)
        by = {}
        for o in layer:
            m = o[3].rsplit(".", 1)[-1]
            if m in LINEAR_DIMS:
                by.setdefault(m, []).append(o)
        mms = [o for o in layer if o[0] == "mm.default"]
        check("fp8 recompute=op: one aten.mm per linear, saved at odd mm counts (q, v, gate, down)",
              len(mms) == len(LINEAR_DIMS) and all(o[1] == (o[2] % 2 == 1) for o in mms)
              and [o[3].rsplit(".", 1)[-1] for o in mms if o[1]] == ["q_proj", "v_proj", "gate_proj", "down_proj"],
              rid)
        if rec_name == "tensorwise":
            check("fp8 recompute=op (tensorwise): two aten.max.default per linear (input and weight amax), saved",
                  all(sum(1 for o in v if o[0] == "max.default" and o[1]) == 2 for v in by.values()), rid)
        elif rec_name == "rowwise":
            check("fp8 recompute=op (rowwise): the amaxes are aten.amax (not in the list), none saved",
                  not any(o[0].startswith("max") for o in layer)
                  and all(not o[1] for o in layer if o[0].startswith("amax")), rid)


# ----------------------------------------------------------------------------------------------------------------------
# qlora
# ----------------------------------------------------------------------------------------------------------------------

def linear4bit_forward(lead, K, N, in_fp32: bool, nested: bool, blocksize=64):
    """Linear4bit.forward (bnb 0.50.2): input cast to the compute dtype, gemm_4bit's default path
    (nested absmax -> fp32, + offset; dequantize_4bit -> [N, K] bf16; linear), output cast back to the input dtype."""
    p = Prog()
    T = math.prod(lead)
    xc = p.a("_to_copy", "bfloat16", list(lead) + [K]) if in_fp32 else None
    nb = N * K // blocksize
    ab = ab2 = None
    if nested:
        ab = p.a("dequantize_blockwise", "float32", [nb])
        ab2 = p.a("add", "float32", [nb])
        p.f(ab)
    wd = p.a("dequantize_4bit", "bfloat16", [N, K])
    out = p.a("linear", "bfloat16", list(lead) + [N])
    p.f(wd, ab2)
    if in_fp32:  # the bf16 copy of the input and the bf16 output live until the fp32 output exists
        o32 = p.a("_to_copy", "float32", list(lead) + [N])
        p.f(out, xc)
    return p


def linear4bit_backward(T, K, N, nested: bool, blocksize=64):
    """MatMul4Bit.backward: dequantize_4bit(B) again ([N, K] in the compute dtype), grad_A = grad_output @ W."""
    p = Prog()
    nb = N * K // blocksize
    ab = ab2 = None
    if nested:  # F.dequantize_4bit -> dequantize_blockwise(absmax) + offset, inside the functional API
        ab = p.a("dequantize_blockwise", "float32", [nb])
        ab2 = p.a("add", "float32", [nb])
        p.f(ab)
    wd = p.a("dequantize_4bit", "bfloat16", [N, K])
    p.f(ab2)
    gi = p.a("matmul", "bfloat16", [T, K])
    p.f(wd)
    return p


def check_qlora():
    path = os.path.join(FIX, "qlora", "records.json")
    if not os.path.exists(path):
        return
    doc = json.load(open(path))
    for r in doc["records"]:
        q = r["qlora"]
        storage = q["quant_storage"]
        elem = 2 if storage == "bf16" else 1
        total_qs = 0
        for lay in q["layout"]:
            n = lay["numel"]
            packed = (n + 1) // 2
            check("qlora layout: packed 4-bit bytes = ceil(n/2), stored as quant_storage elements",
                  lay["packed_bytes"] == packed and lay["packed_shape"] == [packed // elem, 1]
                  and lay["packed_dtype"] == ("bfloat16" if storage == "bf16" else "uint8"), lay["module"])
            nb = math.ceil(n / lay["blocksize"])
            if q["double_quant"]:
                check("qlora layout: double quant: 8-bit absmax (1 B/block) + fp32 absmax per 256 blocks + offset",
                      lay["absmax_bytes"] == nb and lay["absmax_dtype"] == "uint8"
                      and lay["state2_absmax_bytes"] == 4 * math.ceil(nb / 256) and lay["offset_bytes"] == 4
                      and lay["code_bytes"] == 64 and lay["state2_code_bytes"] == 1024, lay["module"])
                total_qs += lay["count"] * (nb + 4 * math.ceil(nb / 256) + 4 + 64 + 1024)
            else:
                check("qlora layout: no double quant: fp32 absmax (4 B/block)",
                      lay["absmax_bytes"] == 4 * nb and lay["absmax_dtype"] == "float32" and lay["code_bytes"] == 64,
                      lay["module"])
                total_qs += lay["count"] * (4 * nb + 64)
        check("qlora: quant-state bytes = Σ per weight (absmax, nested absmax, offset, code tables; none shared)",
              q["quant_state_bytes"] == total_qs == q["quant_state_bytes_tracker"],
              f"{r['id']}: {q['quant_state_bytes']} {total_qs} {q['quant_state_bytes_tracker']}")
        if q["prepare_model_for_kbit_training"]:
            packed_total = sum(l["packed_bytes"] * l["count"] for l in q["layout"])
            fz = q["frozen_parameter_bytes_by_dtype"]
            check("qlora: prepare_model_for_kbit_training casts every non-4-bit parameter to fp32 (the packed "
                  "weights keep their quant_storage dtype)",
                  fz.get("bfloat16" if storage == "bf16" else "uint8", 0) == packed_total and
                  set(fz) == {"float32", "bfloat16" if storage == "bf16" else "uint8"}, r["id"])
        check("qlora: gradients = the fp32 LoRA parameters only", r["gradient_bytes"] == q["trainable_parameter_bytes"],
              r["id"])
        check("qlora: AdamW state = 2 x the LoRA parameter bytes", r["adamw"]["state_bytes"] ==
              2 * q["trainable_parameter_bytes"], r["id"])
        b, s = r["batch"], r["seq"]
        for w in q["layer0_linears_step2"]:
            if not w["module"].endswith("base_layer"):
                continue
            name = w["module"].split(".")[-2]
            K, N = LINEAR_DIMS[name]
            # prepare_model_for_kbit_training makes the norms fp32, so every hidden state and every Linear4bit input
            # is fp32 (Linear4bit casts to bf16 and its output back to the input's dtype); without it all is bf16
            in_fp32 = q["prepare_model_for_kbit_training"]
            if w["kind"] in ("forward", "recompute"):
                prog = linear4bit_forward([b, s], K, N, in_fp32, q["double_quant"])
            else:
                prog = linear4bit_backward(b * s, K, N, q["double_quant"])
            peak, left, allocs = prog.replay()
            tag = f"{r['id']} {name} {w['kind']}"
            kind = "forward" if w["kind"] != "backward" else "backward"
            check(f"qlora Linear4bit {kind}: transient peak", peak == w["transient_peak"],
                  f"{tag}: {peak} != {w['transient_peak']}")
            check(f"qlora Linear4bit {kind}: bytes left alive", left == w["left_alive"],
                  f"{tag}: {left} != {w['left_alive']}")


# ----------------------------------------------------------------------------------------------------------------------
# loading
# ----------------------------------------------------------------------------------------------------------------------

def check_loading():
    path = os.path.join(FIX, "loading", "records.json")
    if not os.path.exists(path):
        return
    doc = json.load(open(path))
    for r in doc["records"]:
        s = r["summary"]
        if r["device"] == "cuda-fake":
            ev = r["events"]
            dev = [e for e in ev if e[0] == "a" and e[4] == "cuda"]
            check("loading (fake CUDA): warmup = unique parameter bytes, allocated first, freed before the weights",
                  dev[0][5] == "empty" and dev[0][1] == s["parameter_storage_bytes"] and ev[1] == ["f", 0], r["id"])
            params = [e for e in dev[1:] if e[5] == "_to_copy"]
            check("loading (fake CUDA): one device allocation per parameter, of its final size",
                  sum(e[1] for e in params) == s["parameter_storage_bytes"] and len(params) == s["parameters"], r["id"])
            check("loading (fake CUDA): peak = what stays (parameters + buffers)",
                  s["device_peak_bytes"] == s["device_bytes_alive_at_end"] == s["parameter_storage_bytes"] +
                  s["buffer_bytes"], r["id"])


def main():
    check_fp8()
    check_qlora()
    check_loading()
    bad = 0
    for rule, (n, off) in RESULTS.items():
        print(f"{'OK ' if not off else 'OFF'} {rule}: {n - off}/{n}")
        for ex in EXAMPLES.get(rule, []):
            print(f"      e.g. {ex}")
        bad += off
    print(f"{sum(n for n, _ in RESULTS.values())} checks, {bad} off")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
