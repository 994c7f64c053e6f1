#!/usr/bin/env python3
"""PyTorch validation harness for trainmem.

Builds scaled-down Hugging Face causal-LM architectures from configs (random weights, fixed seeds, CPU), runs one
training step and measures, byte by byte:

* parameters, gradients, AdamW / SGD(momentum) optimizer state (after a real ``.step()``);
* every storage saved for backward during the forward pass (loss included), deduplicated by storage, parameters
  excluded, each attributed to the module that was executing and to the autograd node/attribute that holds it;
* under activation checkpointing, also the tensors the checkpoint keeps alive outside autograd's saved-tensor
  mechanism (the layer kwargs held by the recompute closure), see README.md.

Writes tests/fixtures/pytorch/records.json (deterministic: running twice gives byte-identical output).

Usage:  validation/.venv/bin/python validation/measure.py [--out PATH] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import re
import sys
import warnings
import weakref
from functools import partial

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from transformers.modeling_layers import GradientCheckpointingLayer  # noqa: E402

warnings.filterwarnings("ignore")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "pytorch", "records.json")

MODEL_SEED = 1234
DATA_SEED = 42

# --------------------------------------------------------------------------------------------------------------------
# Scaled-down shapes. Common: hidden 64, 2 layers, 4 heads of head_dim 16, intermediate 176 (= 2.75 * 64, not a
# multiple of 64), vocab 1000, max positions 512.
# --------------------------------------------------------------------------------------------------------------------
H, L, A, KV, F, V, P = 64, 2, 4, 2, 176, 1000, 512

FAMILIES: dict[str, tuple[str, dict]] = {
    "gpt2": ("gpt2", dict(n_embd=H, n_layer=L, n_head=A, n_inner=F, vocab_size=V, n_positions=P)),
    "llama-gqa": ("llama", dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, num_key_value_heads=KV,
                                intermediate_size=F, vocab_size=V, max_position_embeddings=P)),
    "llama-mha": ("llama", dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, num_key_value_heads=A,
                                intermediate_size=F, vocab_size=V, max_position_embeddings=P)),
    "qwen2": ("qwen2", dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, num_key_value_heads=KV,
                            intermediate_size=F, vocab_size=V, max_position_embeddings=P)),
    "mistral": ("mistral", dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, num_key_value_heads=KV,
                                intermediate_size=F, vocab_size=V, max_position_embeddings=P, head_dim=H // A)),
    "mixtral": ("mixtral", dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, num_key_value_heads=KV,
                                intermediate_size=F, vocab_size=V, max_position_embeddings=P, head_dim=H // A,
                                num_local_experts=4, num_experts_per_tok=2)),
    # gemma2: head_dim 24 != 64/4, sliding_window 128 (< 256, so s=256 really uses the sliding mask on the
    # sliding layers), soft-capping, 4 norms per layer and sqrt(h) embedding scaling all left at their defaults.
    "gemma2": ("gemma2", dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, num_key_value_heads=KV,
                              head_dim=24, intermediate_size=F, vocab_size=V, max_position_embeddings=P,
                              sliding_window=128)),
    # phi3: fused qkv_proj and gate_up_proj; GQA (kv 2) like phi3-medium.
    "phi3": ("phi3", dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, num_key_value_heads=KV,
                          intermediate_size=F, vocab_size=V, max_position_embeddings=P,
                          original_max_position_embeddings=P, pad_token_id=0)),
}

BATCHES = (1, 2)
SEQS = (64, 128, 256)
DTYPES = ("fp32", "bf16")
ATTNS = ("eager", "sdpa")
CKPTS = (False, True)
# Gemma2ForCausalLM has `_supports_sdpa = False` in transformers 5.24 ("sdpa does not support softcapping"):
# from_config(attn_implementation="sdpa") raises, so the grid has no gemma2/sdpa records.
NO_SDPA = {"gemma2"}

TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "amp-bf16": torch.float32}
DTYPE_NAME = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.int64: "int64",
              torch.int32: "int32", torch.bool: "bool", torch.uint8: "uint8", torch.float64: "float64",
              torch.int8: "int8"}


def dtype_name(dt: torch.dtype) -> str:
    return DTYPE_NAME.get(dt, str(dt).replace("torch.", ""))


def is_dropout_key(key: str) -> bool:
    return "dropout" in key or "pdrop" in key


# --------------------------------------------------------------------------------------------------------------------
# Model construction
# --------------------------------------------------------------------------------------------------------------------

def build_config(family: str, dropout: float):
    model_type, kwargs = FAMILIES[family]
    config = AutoConfig.for_model(model_type, **copy.deepcopy(kwargs))
    for key, value in config.to_dict().items():
        if is_dropout_key(key) and isinstance(value, float) and not isinstance(value, bool):
            setattr(config, key, dropout)
    return config


def build_model(family: str, dtype: str, attn: str, dropout: float, experts_impl: str | None):
    config = build_config(family, dropout)
    torch.manual_seed(MODEL_SEED)
    extra = {}
    if experts_impl is not None:
        extra["experts_implementation"] = experts_impl
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32, **extra)
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    # What save_pretrained sets before writing config.json: the parameters' dtype and the architecture class.
    model.config.dtype = next(model.parameters()).dtype
    model.config.architectures = [model.__class__.__name__]
    return model


def config_dict(model) -> dict:
    d = model.config.to_dict()
    # Make sure it is JSON-serialisable and canonical.
    return json.loads(json.dumps(d, sort_keys=True, default=str))


# --------------------------------------------------------------------------------------------------------------------
# Saved-tensor capture
# --------------------------------------------------------------------------------------------------------------------

class StorageTracker(TorchDispatchMode):
    """--verify: remembers (weakly) every storage an aten op outputs during forward."""

    def __init__(self):
        super().__init__()
        self.seen: dict[int, tuple] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                if st.data_ptr() not in self.seen or self.seen[st.data_ptr()][0].expired():
                    self.seen[st.data_ptr()] = (StorageWeakRef(st), st.nbytes())
        return out

    def alive(self, exclude):
        gc.collect()
        return {p: n for p, (ref, n) in self.seen.items() if not ref.expired() and p not in exclude}


class Packed:
    """What our pack hook returns instead of the tensor: lets the unpack hook tell which pack event it is."""

    __slots__ = ("t", "idx", "__weakref__")

    def __init__(self, t, idx):
        self.t = t
        self.idx = idx


def iter_tensors(obj, path):
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, (tuple, list)):
        for i, o in enumerate(obj):
            yield from iter_tensors(o, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            yield from iter_tensors(obj[k], f"{path}.{k}")


class Capture:
    def __init__(self, model):
        self.model = model
        self.names = {id(m): n for n, m in model.named_modules()}
        self.stack: list[str] = []
        self.events: list[dict] = []  # pack events and checkpoint-closure tensors, in forward order
        self.refs: list = []  # weakref per event (to the Packed object, or to the closure tensor)
        self.unpacked: list[int] = []
        self.active = False
        self.ckpt_ranges: list[list[int]] = []  # autograd sequence-number ranges of checkpointed regions
        self.in_ckpt_call: str | None = None
        self.handles = []
        for m in model.modules():
            self.handles.append(m.register_forward_pre_hook(self._pre))
            self.handles.append(m.register_forward_hook(self._post, always_call=True))
            if isinstance(m, GradientCheckpointingLayer) and getattr(m, "gradient_checkpointing", False):
                m._gradient_checkpointing_func = self._wrap_ckpt(m._gradient_checkpointing_func, self.names[id(m)])

    def remove(self):
        for h in self.handles:
            h.remove()

    # module stack -------------------------------------------------------------------------------------------------
    def _pre(self, module, args):
        if not self.active:
            return
        self.stack.append(self.names[id(module)])
        if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing:
            self.ckpt_ranges.append([torch._C._autograd._get_sequence_nr(), None])

    def _post(self, module, args, out):
        if not self.active:
            return
        self.stack.pop()
        if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing:
            self.ckpt_ranges[-1][1] = torch._C._autograd._get_sequence_nr()

    def current_module(self):
        return self.stack[-1] if self.stack else ""

    # checkpoint closure -------------------------------------------------------------------------------------------
    def _wrap_ckpt(self, orig, layer_name):
        def wrapped(fn, *args):
            # `fn` is partial(forward, layer, **kwargs): the kwargs tensors are held by the recompute closure of the
            # checkpoint frame until backward, invisibly to saved_tensors_hooks. Record them (weakly).
            if self.active:
                for path, t in iter_tensors(dict(getattr(fn, "keywords", {}) or {}), "kwargs"):
                    self._add_event(t, kind="closure", module=layer_name, op="CheckpointClosure", attr=path,
                                    ref=weakref.ref(t))
            prev = self.in_ckpt_call
            self.in_ckpt_call = layer_name
            try:
                return orig(fn, *args)
            finally:
                self.in_ckpt_call = prev
        return wrapped

    # saved tensors hooks ------------------------------------------------------------------------------------------
    def _add_event(self, t, kind, module, op, attr, ref):
        st = t.untyped_storage()
        self.events.append(dict(idx=len(self.events), kind=kind, ptr=st.data_ptr(), nbytes=st.nbytes(),
                                shape=list(t.shape), dtype=dtype_name(t.dtype), device=t.device.type,
                                module=module, op=op, attr=attr))
        self.refs.append(ref)

    def pack(self, t):
        p = Packed(t, len(self.events))
        op = attr = None
        if self.in_ckpt_call is not None:
            # Only the checkpoint frame's save_inputs() reaches our hook inside a non-reentrant checkpoint call
            # (everything else inside is packed by the checkpoint's own, innermost, hook).
            op, attr = "CheckpointFrame", "saved_args"
        self._add_event(t, kind="packed", module=self.current_module(), op=op, attr=attr, ref=weakref.ref(p))
        return p

    def unpack(self, p):
        self.unpacked.append(p.idx)
        return p.t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    # graph walk ---------------------------------------------------------------------------------------------------
    def attribute(self, root):
        """Walk the autograd graph from `root` and attribute every pack event to (node name, attribute)."""
        ranges = [(a, b) for a, b in self.ckpt_ranges]
        seen = set()
        todo = [root]
        found: dict[int, tuple] = {}
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            try:
                seq = node._sequence_nr()
            except Exception:
                seq = -1
            inside = any(a <= seq < b for a, b in ranges)
            if not inside:  # never unpack inside a non-reentrant checkpoint region (it would trigger recompute)
                attrs = [a for a in dir(node) if a.startswith("_saved_")]
                if hasattr(node, "saved_tensors") and not attrs:
                    attrs = ["saved_tensors"]
                for a in attrs:
                    self.unpacked = []
                    try:
                        getattr(node, a)
                    except Exception:
                        continue
                    for idx in self.unpacked:
                        cand = (seq, node.name(), a)
                        if idx not in found or cand < found[idx]:
                            found[idx] = cand
            for nxt, _ in node.next_functions:
                if nxt is not None and nxt not in seen:
                    todo.append(nxt)
        for idx, (_, name, a) in found.items():
            self.events[idx]["op"] = name
            self.events[idx]["attr"] = a


LAYER_RE = re.compile(r"\.\d+(?=\.|$)")


def module_pattern(name: str) -> str:
    return LAYER_RE.sub(".*", name) if name else "(root)"


def storage_ptrs(tensors):
    return {t.untyped_storage().data_ptr() for t in tensors}


# --------------------------------------------------------------------------------------------------------------------
# One measurement
# --------------------------------------------------------------------------------------------------------------------

def measure(spec: dict, verify: bool = False) -> tuple[dict, dict, dict | None]:
    family, b, s, dtype, attn = spec["family"], spec["batch"], spec["seq"], spec["dtype"], spec["attn"]
    ckpt_mode = spec["checkpoint_mode"]
    dropout = spec["dropout"]
    model = build_model(family, dtype, attn, dropout, spec.get("experts_implementation"))
    if ckpt_mode is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": ckpt_mode == "reentrant"})
    cfg = config_dict(model)

    params = list(model.parameters())
    param_ptrs = storage_ptrs(params)
    # Tied weights share a storage; parameters() already yields them once.
    parameter_count = sum(p.numel() for p in params)
    parameter_bytes = sum(p.numel() * p.element_size() for p in params)

    gen = torch.Generator().manual_seed(DATA_SEED)
    input_ids = torch.randint(0, model.config.vocab_size, (b, s), generator=gen)

    routing = []
    route_handles = []
    if family == "mixtral":
        for name, m in model.named_modules():
            if m.__class__.__name__.endswith("TopKRouter"):
                def hook(mod, args, out, _n=name):
                    idx = out[2]
                    routing.append(torch.bincount(idx.reshape(-1), minlength=mod.num_experts).tolist())
                route_handles.append(m.register_forward_hook(hook))

    cap = Capture(model)
    torch.manual_seed(DATA_SEED)  # dropout masks (extras)
    tracker = StorageTracker() if verify else contextlib.nullcontext()
    cap.active = True
    with cap.hooks(), tracker:
        if dtype == "amp-bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(input_ids=input_ids, labels=input_ids, use_cache=False)
        else:
            out = model(input_ids=input_ids, labels=input_ids, use_cache=False)
    cap.active = False
    for h in route_handles:
        h.remove()
    loss = out.loss
    logits = out.logits
    gc.collect()

    cap.attribute(loss.grad_fn)

    # Live events only (a pack whose graph was freed during forward is not retained).
    storages: dict[int, dict] = {}
    saved_param = set()
    n_saved_tensors = 0
    n_freed = 0
    for ev, ref in zip(cap.events, cap.refs):
        if ref() is None:
            n_freed += 1
            continue
        if ev["kind"] == "packed":
            n_saved_tensors += 1
        if ev["ptr"] in param_ptrs:
            saved_param.add(ev["ptr"])
            continue
        if ev["ptr"] not in storages:
            storages[ev["ptr"]] = ev
    saved_bytes = sum(ev["nbytes"] for ev in storages.values())
    closure_bytes = sum(ev["nbytes"] for ev in storages.values() if ev["kind"] == "closure")
    unattributed = [ev for ev in storages.values() if ev["op"] is None]

    rows: dict[tuple, dict] = {}
    for ev in sorted(storages.values(), key=lambda e: e["idx"]):
        key = (module_pattern(ev["module"]), ev["op"] or "?", ev["attr"] or "?", ev["dtype"], tuple(ev["shape"]),
               ev["nbytes"])
        if key in rows:
            rows[key]["count"] += 1
        else:
            rows[key] = {"module": key[0], "op": key[1], "attr": key[2], "dtype": key[3], "shape": list(key[4]),
                         "bytes": key[5], "count": 1}

    verification = None
    if verify:
        # Independent check: every storage created by an aten op during forward that is still alive now, minus
        # parameters, the inputs and what we hold ourselves (loss, logits unless saved), must be exactly the set of
        # storages the hooks + closure scan reported.
        # input_ids (= labels) is created before forward, so the scan cannot see it; it is legitimately saved (by
        # the embedding backward) and is reported.
        ids_ptr = input_ids.untyped_storage().data_ptr()
        held = {loss.untyped_storage().data_ptr(), ids_ptr}
        if logits.untyped_storage().data_ptr() not in storages:
            held.add(logits.untyped_storage().data_ptr())
        alive = tracker.alive(exclude=param_ptrs | held)
        missing = {p: n for p, n in alive.items() if p not in storages}
        extra_ = {p: storages[p]["nbytes"] for p in storages if p not in alive and p in tracker.seen and p != ids_ptr}
        if ids_ptr in storages:
            alive[ids_ptr] = storages[ids_ptr]["nbytes"]
        # Storages the scan never saw: input_ids, and tensors made by torch.tensor(...) (gemma2's sqrt(h) normalizer),
        # which does not go through an aten op the dispatch mode sees. They are alive (a Packed object holds them).
        for p in storages:
            if p not in tracker.seen:
                alive[p] = storages[p]["nbytes"]
        verification = {"alive_bytes": sum(alive.values()), "not_reported": missing, "reported_not_alive": extra_}
    logits_ptr = logits.untyped_storage().data_ptr()
    logits_info = {"bytes": logits.untyped_storage().nbytes(), "dtype": dtype_name(logits.dtype),
                   "shape": list(logits.shape), "is_saved": logits_ptr in storages}
    del out, logits

    # ---------------------------------------------------------------- backward, gradients
    loss.backward()
    del loss
    cap.remove()
    grads = [p.grad for p in params if p.grad is not None]
    gradient_bytes = sum(g.numel() * g.element_size() for g in grads)
    grad_dtypes = sorted({dtype_name(g.dtype) for g in grads})

    # ---------------------------------------------------------------- optimizers
    adamw = torch.optim.AdamW(params)
    adamw.step()
    a_state = a_step = 0
    a_dtypes, a_step_dev, a_step_dtypes, a_keys = set(), set(), set(), set()
    for st in adamw.state.values():
        for k, v in st.items():
            if not isinstance(v, torch.Tensor):
                continue
            a_keys.add(k)
            nb = v.numel() * v.element_size()
            if k == "step":
                a_step += nb
                a_step_dev.add(v.device.type)
                a_step_dtypes.add(dtype_name(v.dtype))
            else:
                a_state += nb
                a_dtypes.add(dtype_name(v.dtype))
    del adamw
    sgd = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    sgd.step()
    s_state, s_dtypes, s_keys = 0, set(), set()
    for st in sgd.state.values():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                s_keys.add(k)
                s_state += v.numel() * v.element_size()
                s_dtypes.add(dtype_name(v.dtype))
    del sgd

    ck = "ckpt1" if ckpt_mode == "non_reentrant" else ("ckpt-reentrant" if ckpt_mode == "reentrant" else "ckpt0")
    rid = f"{family}/b{b}/s{s}/{dtype}/{attn}/{ck}"
    if dropout:
        rid += f"/dropout{dropout}"
    if spec.get("experts_implementation"):
        rid += f"/experts-{spec['experts_implementation']}"

    record = {
        "id": rid,
        "family": family,
        "model_type": cfg["model_type"],
        "config_key": None,  # filled by caller
        "batch": b,
        "seq": s,
        "dtype": dtype,
        "attn": attn,
        "checkpointing": ckpt_mode is not None,
        "checkpoint_mode": ckpt_mode,
        "dropout": dropout,
        "extra": spec["extra"],
        "parameter_count": parameter_count,
        "parameter_tensors": len(params),
        "parameter_bytes": parameter_bytes,
        "gradient_bytes": gradient_bytes,
        "gradient_dtype": "/".join(grad_dtypes),
        "adamw": {"state_bytes": a_state, "state_dtype": "/".join(sorted(a_dtypes)),
                  "state_keys": sorted(a_keys), "step_bytes": a_step,
                  "step_dtype": "/".join(sorted(a_step_dtypes)), "step_device": "/".join(sorted(a_step_dev))},
        "sgd_momentum": {"state_bytes": s_state, "state_dtype": "/".join(sorted(s_dtypes)),
                         "state_keys": sorted(s_keys)},
        "saved_bytes": saved_bytes,
        "saved_storages": len(storages),
        "saved_tensors": n_saved_tensors,
        "saved_parameter_storages": len(saved_param),
        "saved_tensors_freed_during_forward": n_freed,
        "checkpoint_closure_bytes": closure_bytes,
        "logits": logits_info,
        "saved": list(rows.values()),
    }
    if family == "mixtral":
        record["experts_implementation"] = model.config._experts_implementation
        record["moe_tokens_per_expert"] = routing
    if unattributed:
        record["unattributed_storages"] = len(unattributed)

    del params, grads, model, cap
    gc.collect()
    return record, cfg, verification


def grid():
    for family in FAMILIES:
        for b in BATCHES:
            for s in SEQS:
                for dtype in DTYPES:
                    for attn in ATTNS:
                        if family in NO_SDPA and attn == "sdpa":
                            continue
                        for ck in CKPTS:
                            yield dict(family=family, batch=b, seq=s, dtype=dtype, attn=attn,
                                       checkpoint_mode="non_reentrant" if ck else None, dropout=0.0, extra=False)


def extras():
    """Extra records (flagged "extra": true): autocast, dropout on CPU, reentrant checkpointing, eager MoE experts."""
    # autocast bf16 over an fp32 model: bf16 weight copies kept for backward.
    for family in ("llama-gqa", "gpt2", "mixtral"):
        for attn in ATTNS:
            for ck in (None, "non_reentrant"):
                yield dict(family=family, batch=2, seq=64, dtype="amp-bf16", attn=attn, checkpoint_mode=ck,
                           dropout=0.0, extra=True)
    # dropout 0.1: what CPU keeps for dropout (CUDA keeps a 1-byte bool mask).
    for family in ("gpt2", "llama-gqa", "phi3"):
        for dtype in DTYPES:
            for attn in ATTNS:
                yield dict(family=family, batch=2, seq=64, dtype=dtype, attn=attn, checkpoint_mode=None,
                           dropout=0.1, extra=True)
    # reentrant checkpointing, for comparison with the HF default (non-reentrant).
    for family in ("llama-gqa", "gpt2"):
        for attn in ATTNS:
            yield dict(family=family, batch=2, seq=64, dtype="bf16", attn=attn, checkpoint_mode="reentrant",
                       dropout=0.0, extra=True)
    # MoE experts through the per-expert python loop (routing-dependent) instead of the grouped_mm default.
    for dtype in DTYPES:
        for s in (64, 128):
            yield dict(family="mixtral", batch=2, seq=s, dtype=dtype, attn="sdpa", checkpoint_mode=None,
                       dropout=0.0, extra=True, experts_implementation="eager")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--only", default=None, help="only run specs whose id-ish string contains this")
    ap.add_argument("--no-extras", action="store_true")
    ap.add_argument("--verify", action="store_true",
                    help="cross-check every record with an independent liveness scan (slower; output unchanged)")
    args = ap.parse_args()

    # One intra-op thread: fast enough for these tiny shapes, immune to OpenMP spin-waiting when the machine is busy,
    # and it removes thread-count-dependent float reductions (mixtral's routing depends on float values).
    torch.set_num_threads(1)
    specs = list(grid()) + ([] if args.no_extras else list(extras()))
    # Import every model class once, then move the (large) import-time heap out of the collector's way: the
    # gc.collect() calls per record (needed to see which saved tensors really stay alive) become cheap.
    for family in FAMILIES:
        AutoModelForCausalLM.from_config(build_config(family, 0.0))
    gc.collect()
    gc.freeze()
    configs: dict[str, dict] = {}
    records = []
    n_verify_fail = 0
    for i, spec in enumerate(specs):
        tag = f"{spec['family']}/b{spec['batch']}/s{spec['seq']}/{spec['dtype']}/{spec['attn']}/{spec['checkpoint_mode']}/{spec['dropout']}/{spec.get('experts_implementation')}"
        if args.only and args.only not in tag:
            continue
        rec, cfg, ver = measure(spec, verify=args.verify)
        if ver is not None:
            if ver["not_reported"] or ver["reported_not_alive"]:
                n_verify_fail += 1
                print(f"VERIFY FAIL {rec['id']}: alive but not reported {ver['not_reported']}; "
                      f"reported but not alive {ver['reported_not_alive']}", file=sys.stderr)
            elif ver["alive_bytes"] != rec["saved_bytes"]:
                n_verify_fail += 1
                print(f"VERIFY FAIL {rec['id']}: alive {ver['alive_bytes']} != saved {rec['saved_bytes']}",
                      file=sys.stderr)
        key = f"{spec['family']}/{cfg.get('dtype')}" + (f"/dropout{spec['dropout']}" if spec["dropout"] else "")
        if key in configs and configs[key] != cfg:
            raise SystemExit(f"two different configs for config key {key}")
        configs[key] = cfg
        rec["config_key"] = key
        records.append(rec)
        print(f"[{i + 1}/{len(specs)}] {rec['id']}: saved {rec['saved_bytes']} B in {rec['saved_storages']} storages"
              + (f"  UNATTRIBUTED {rec['unattributed_storages']}" if rec.get("unattributed_storages") else ""),
              file=sys.stderr, flush=True)

    doc = {
        "generated_by": "validation/measure.py (trainmem PyTorch validation harness; see validation/README.md)",
        "torch": torch.__version__.split("+")[0],
        "transformers": transformers.__version__,
        "device": "cpu",
        "seeds": {"model": MODEL_SEED, "data": DATA_SEED},
        "configs": configs,
        "records": records,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(dump(doc))
    print(f"wrote {len(records)} records to {args.out}", file=sys.stderr)
    if args.verify:
        print(f"verify: {len(records) - n_verify_fail}/{len(records)} records: the liveness scan finds exactly the "
              f"reported storages", file=sys.stderr)
    gc.unfreeze()
    if n_verify_fail:
        sys.exit(1)


def dump(doc) -> str:
    """Compact but diff-friendly JSON: one record per line block, one saved row per line."""
    out = ["{"]
    head = [k for k in doc if k not in ("configs", "records")]
    for k in head:
        out.append(f" {json.dumps(k)}: {json.dumps(doc[k], sort_keys=True)},")
    out.append(' "configs": {')
    items = list(doc["configs"].items())
    for j, (k, v) in enumerate(items):
        out.append(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" + ("," if j + 1 < len(items) else ""))
    out.append(" },")
    out.append(' "records": [')
    recs = doc["records"]
    for j, r in enumerate(recs):
        r = dict(r)
        saved = r.pop("saved")
        body = json.dumps(r)
        lines = ["  " + body[:-1] + ', "saved": [']
        for i, row in enumerate(saved):
            lines.append("    " + json.dumps(row) + ("," if i + 1 < len(saved) else ""))
        lines.append("  ]}" + ("," if j + 1 < len(recs) else ""))
        out.extend(lines)
    out.append(" ]")
    out.append("}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
