#!/usr/bin/env python3
"""torch.compile on torchtune 0.6.1's own Llama 3 with its `CEWithChunkedOutputLoss`, as torchtune's recipes apply it
(`compile: True`), on CPU: the estimator's `framework = torchtune`, `loss = chunked`, `compile = true`.

What torchtune does (0.6.1, recipes/full_finetune_single_device.py `_setup_model` and `setup`):

* `training.compile_model(model)` (training/_compile.py): `m.compile(backend="inductor")` on every
  `TransformerSelfAttentionLayer`, in `reversed(list(model.modules()))` order; *then*
  `training.set_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})` where
  `enable_activation_checkpointing` is set: torch's `checkpoint_wrapper` (non-reentrant) around each compiled layer,
  so the checkpoint is outside the compiled region (torchtitan's is inside: validation/measure_titan_compile.py).
* `training.compile_loss(loss_fn)`: for `CEWithChunkedOutputLoss` only `loss.compute_cross_entropy` is compiled
  (`F.cross_entropy(logits.float(), labels, ignore_index, reduction="sum")`); `forward` stays eager: it reshapes each
  of the model's `num_output_chunks` (8) logits chunks to (tokens, vocab), sums `compute_cross_entropy` per chunk (one
  compiled region, the same graph, called 8 times) and divides by the valid-token count.

The tiny model and the recipe's loss step are validation/measure_frameworks.py's `build_torchtune_llama3`
(`TorchtuneLM`). The measurement is measure_recipes.py's `measure_compile` machinery (saved tensors read from the
autograd graph after a compiled forward; the step's peak from torch.profiler memory events), each record in a fresh
interpreter. Under checkpointing, the nodes inside a checkpointed layer hold the checkpoint's holders, not tensors:
they are not read (reading them would recompute the layer); the checkpoint's saved inputs are read from its
`_NoopSaveInputs` node as any other node.

Writes tests/fixtures/pytorch/frameworks/torchtune-llama3-compile.json ({configs, records}) and each profiled step's
allocation trace under tests/fixtures/pytorch/frameworks/steps/.

With `--lora`: torchtune's LoRA (`lora_llama3_1`, `LoRALinear` on q and v, rank 8, adapters in the model dtype, only
the adapters trainable), bf16, in tests/fixtures/pytorch/frameworks/torchtune-llama3-lora-compile.json (estimated:
tests/framework_fixtures.rs); `--lora-all` puts the adapters on q, k, v, output_proj and the MLP instead (the 8B
single-device YAML's q, v, output_proj and MLP plus k), records tagged `lora-r8-all`. `--lora --ce`: the q, v LoRA
with `torch.nn.CrossEntropyLoss` compiled whole (the logits unchunked), bf16, in
tests/fixtures/pytorch/frameworks/torchtune-llama3-lora-ce-compile.json.

With `--qlora`: torchtune's QLoRA (`lora_llama3_1(quantize_base=True)`, LoRA on q and v, every decoder linear an
`NF4Tensor`) at validation/measure_torchao_nf4.py's shapes (hidden 128, 4 kv heads: `to_nf4` needs multiples of
64·256 elements), bf16, recompute none and full, measured by that script's `measure_compiled` (the NF4 inner tensors
classified as `nf4`), in tests/fixtures/pytorch/frameworks/torchtune-llama3-qlora-compile.json.

Usage:  nice validation/.venv/bin/python validation/measure_tune_compile.py [--only SUBSTRING] [--lora --only bf16]
        [--lora --ce --only bf16] [--qlora]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import measure_recipes as R  # noqa: E402  (imports measure, torch)
import measure_frameworks as F  # noqa: E402
import torch  # noqa: E402

M = R.M
OUT = F.OUT
RECOMPUTES = ("none", "full")
DTYPES = ("fp32", "bf16")


class _InsideCheckpoint(Exception):
    pass


READING = {"on": False}
FRAME_INPUTS: list = []  # (autograd sequence number, argument index, weakref) per checkpoint frame input


def guard_checkpoint_unpack():
    """While the graph is read, a checkpoint's unpack hook raises instead of recomputing the layer."""
    import torch.utils.checkpoint as C
    if getattr(C._checkpoint_hook.__init__, "_guard", False):
        return
    orig = C._checkpoint_hook.__init__

    def init(self, frame):
        orig(self, frame)
        unpack = self.unpack_hook

        def guarded(holder):
            if READING["on"]:
                raise _InsideCheckpoint()
            return unpack(holder)
        self.unpack_hook = guarded
    init._guard = True
    C._checkpoint_hook.__init__ = init
    orig_nst = R.node_saved_tensors

    def node_saved_tensors(node):
        READING["on"] = True
        try:
            return orig_nst(node)
        except _InsideCheckpoint:
            R.UNREAD_NODES.add(node)
            return [], 0
        finally:
            READING["on"] = False
    R.node_saved_tensors = node_saved_tensors
    # The checkpoint frame's saved inputs (`_CheckpointFrame.save_inputs`: SavedTensors held by the frame, on no graph
    # node) and its CPU RNG state (`preserve_rng_state`: `torch.get_rng_state()`, a 5056-byte uint8 tensor, host
    # memory on a GPU), recorded as the forward makes them.
    orig_save = C._CheckpointFrame.save_inputs

    def save_inputs(self, *args):
        seq = torch._C._autograd._get_sequence_nr()
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                FRAME_INPUTS.append((seq, i, weakref.ref(a)))
        return orig_save(self, *args)
    C._CheckpointFrame.save_inputs = save_inputs
    orig_cs = R.compiled_saved

    def compiled_saved(model, ids, ranges, amp=False):
        FRAME_INPUTS.clear()
        entries, logits_info, loss, extra = orig_cs(model, ids, ranges, amp)
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        seen = {e.get("ptr") for e in entries}
        n = 0
        for seq, i, ref in FRAME_INPUTS:
            t = ref()
            if t is None:
                continue
            st = t.untyped_storage()
            if st.data_ptr() in params or st.data_ptr() in seen:
                continue
            seen.add(st.data_ptr())
            n += 1
            entries.append({"module": ranges.module_of(seq) or "model.layers", "op": "CheckpointFrame",
                            "attr": f"saved_args[{i}]", "dtype": M.dtype_name(t.dtype), "shape": list(t.shape),
                            "bytes": st.nbytes(), "seq": seq})
        entries.sort(key=lambda e: e["seq"])
        extra["checkpoint_frame_inputs"] = n
        return entries, logits_info, loss, extra
    R.compiled_saved = compiled_saved


LORA_ALL = {"on": False}
CE = {"on": False}  # --ce: torch.nn.CrossEntropyLoss


def build(tdtype, lora: bool):
    """measure_frameworks.build_torchtune_llama3, or with `lora` the recipe's `lora_llama3_1` at the same shapes (LoRA
    on q and v, rank 8, alpha 16, no dropout, adapters in the model dtype: `LoRALinear`) with
    `set_trainable_params(model, get_adapter_params(model))` as `lora_finetune_single_device.py` sets it."""
    lm = F.build_torchtune_llama3_ce(R.S, tdtype) if CE["on"] else F.build_torchtune_llama3(R.S, tdtype)
    if not lora:
        return lm
    from torchtune.modules.peft import get_adapter_params, set_trainable_params
    builder = F._torchtune_builder("llama3_1", "lora_llama3_1")
    attn = ["q_proj", "k_proj", "v_proj", "output_proj"] if LORA_ALL["on"] else ["q_proj", "v_proj"]
    m = F._tune_model(builder, tdtype, lora_attn_modules=attn, apply_lora_to_mlp=LORA_ALL["on"],
                      apply_lora_to_output=False, vocab_size=F.VOCAB, num_layers=F.LAYERS, num_heads=F.HEADS,
                      num_kv_heads=F.KV_HEADS, embed_dim=F.DIM, max_seq_len=F.TUNE_MAX_SEQ, intermediate_dim=256,
                      rope_base=500000, lora_rank=8, lora_alpha=16, lora_dropout=0.0)
    set_trainable_params(m, get_adapter_params(m))
    # The chunked loss's chunks; `torch.nn.CrossEntropyLoss` (`--ce`) takes the logits whole (0 chunks).
    m.set_num_output_chunks(getattr(lm.loss_fn, "num_output_chunks", 0))
    m.train()
    lm.model = m
    return lm


def tune_compile(lm, recompute: str):
    """torchtune's `compile_model`, then `set_activation_checkpointing` (recompute full), then `compile_loss`."""
    from torchtune.modules import TransformerSelfAttentionLayer
    for m in reversed(list(lm.model.modules())):
        if isinstance(m, TransformerSelfAttentionLayer):
            m.compile(backend="inductor")
    if recompute == "full":
        lm.gradient_checkpointing_enable()
    loss = lm.loss_fn
    if CE["on"]:
        # compile_loss: a loss other than the chunked one is compiled whole (`torch.compile(loss)`).
        lm.loss_fn = torch.compile(loss, backend="inductor")
    else:
        loss.compute_cross_entropy = torch.compile(loss.compute_cross_entropy, backend="inductor")
    return list(lm.model.layers)


def measure_tune_compile(dtype: str, recompute: str, opts: dict, lora: bool = False):
    from torch._dynamo.utils import counters
    import gc
    family = "torchtune-llama3-ce" if CE["on"] else "torchtune-llama3"
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    torch._dynamo.reset()
    counters.clear()
    R.GRAPHS.clear()
    gc.collect()
    M.build_model = lambda f, d, a, dr, e: build(tdtype, lora)
    ref = R.eager_reference(family, dtype, "sdpa")
    R.install_partition_spy()
    guard_checkpoint_unpack()
    model = build(tdtype, lora)
    cfg = dict(M.config_dict(model), framework="torchtune")
    ids = M.make_ids(model, R.B, R.S)
    blocks = tune_compile(model, recompute)
    # The whole compiled loss module too (`--ce`): no hook inside it (dynamo would trace them).
    ranges = R.SeqRanges(model, opaque=blocks + ([model.loss_fn] if CE["on"] else []))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    entries, logits_info, extra, saved_bytes, compile_s, counters_1 = R.compile_then_read_saved(model, opt, ids, ranges)
    a_state, a_step = R.adamw_state_bytes(opt)
    step, regions, counters_2 = R.profiled_compiled_step(family, model, opt, ids, logits_info, extra, saved_bytes,
                                                         counters_1)
    pi = R.param_info(model)
    tag = "compile=layer" + (f"+recompute={recompute}" if recompute != "none" else "") + ((f"/lora-r8-{'all' if LORA_ALL['on'] else 'qv'}") if lora else "")
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    rec = {"id": f"{family}/b{R.B}/s{R.S}/{dtype}/sdpa/{tag}", "family": family, "model_type": cfg["model_type"],
           "config_key": f"{family}/{cfg.get('dtype')}", "batch": R.B, "seq": R.S, "dtype": dtype, "attn": "sdpa",
           **pi, "gradient_bytes": grads, "adamw": {"state_bytes": a_state, "step_bytes": a_step},
           "framework": "torchtune", "framework_version": "0.6.1", "checkpointing": recompute != "none",
           **({"loss": "torch.nn.CrossEntropyLoss"} if CE["on"] else {})}
    rec.update({"recipe": {"compile": True, "compile_regions": "layer", "compiled_loss": True, "recompute": recompute,
                           "loss": ("torch.nn.CrossEntropyLoss, compiled whole" if CE["on"] else
                                    "CEWithChunkedOutputLoss(num_output_chunks=8), compute_cross_entropy compiled"),
                           "applied_by": "torchtune 0.6.1 training.compile_model, set_activation_checkpointing, "
                                         "compile_loss"},
                **({"lora": {"builder": "lora_llama3_1",
                             "lora_attn_modules": (["q_proj", "k_proj", "v_proj", "output_proj"] if LORA_ALL["on"]
                                                   else ["q_proj", "v_proj"]),
                             **({"apply_lora_to_mlp": True, "apply_lora_to_output": False} if LORA_ALL["on"] else {}),
                             "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.0, "trainable": "get_adapter_params"}}
                   if lora else {}),
                "saved_bytes": saved_bytes, "saved_storages": len(entries), "logits": logits_info,
                "saved_parameter_storages": extra["saved_parameter_storages"],
                "saved_buffer_storages": extra["saved_buffer_storages"],
                "unread_checkpointed_nodes": extra.get("unread_nodes", 0),
                "checkpoint_frame_inputs": extra.get("checkpoint_frame_inputs", 0),
                # preserve_rng_state's `torch.get_rng_state()` per checkpointed layer, alive from its forward to its
                # recomputation (CPU memory; on a GPU host memory): the step's forward_unexplained check
                "checkpoint_rng_state_bytes": (torch.get_rng_state().numel() * len(blocks)
                                               if recompute != "none" else 0),
                "dynamo": counters_2,
                "regions": regions, "step": step, "step_method": "torch.profiler memory events (CPU allocator)",
                "eager_reference": ref, "compile_seconds": round(compile_s, 1), "saved": R.aggregate_rows(entries)})
    opts["cfg"] = cfg
    ranges.remove()
    return rec


def specs(only):
    for dtype in DTYPES:
        for rc in RECOMPUTES:
            key = f"{dtype}/{rc}"
            if only is None or only in key:
                yield dtype, rc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="substring of dtype/recompute")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--lora", action="store_true", help="torchtune's LoRALinear on q and v, r 8 (bf16 by default)")
    ap.add_argument("--lora-all", action="store_true", help="with --lora: on q, k, v, output_proj and the MLP")
    ap.add_argument("--qlora", action="store_true", help="torchtune's QLoRA (quantize_base=True) on q and v, bf16")
    ap.add_argument("--ce", action="store_true",
                    help="loss: torch.nn.CrossEntropyLoss (compiled whole) in place of the chunked loss; "
                         "torchtune-llama3-ce-compile.json")
    ap.add_argument("--child", nargs=3, metavar=("DTYPE", "RECOMPUTE", "OUT_JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    LORA_ALL["on"] = args.lora_all
    CE["on"] = args.ce
    torch.set_num_threads(1)
    if args.child and args.qlora:
        import measure_torchao_nf4 as N  # the real NF4Tensor and its trackers (no torchtune imported yet)
        dtype, rc, out_json = args.child
        N.LORA = dict(N.LORA, lora_attn_modules=["q_proj", "v_proj"], apply_lora_to_mlp=False)
        rec, cfg = N.measure_compiled("non_reentrant" if rc == "full" else None)
        rec["id"] += "/qlora-r8-qv"
        rec["recipe"]["recompute"] = rc
        rec["step"].setdefault("checks", {})  # measure_compiled's step has no self-checks
        # preserve_rng_state's `torch.get_rng_state()` per checkpointed layer (host memory on a GPU)
        rec["checkpoint_rng_state_bytes"] = torch.get_rng_state().numel() * F.LAYERS if rc == "full" else 0
        if rc == "full":
            # reading `saved_tensors` through the checkpoint recomputes: what forward kept is the step's
            # `live_after_forward` less the RNG states and the loss (4 B), as the --lora records' saved bytes are
            rec["saved_bytes"] = rec["step"]["live_after_forward"] - rec["checkpoint_rng_state_bytes"] - 4
            rec["saved_bytes_from"] = "live_after_forward - checkpoint_rng_state_bytes - 4 (the loss)"
        rec["lora"] = {"builder": "lora_llama3_1", "quantize_base": True, **N.LORA, "trainable": "get_adapter_params"}
        with open(out_json, "w") as f:
            json.dump({"record": rec, "cfg": dict(cfg, framework="torchtune")}, f)
        return
    if args.qlora:
        path = os.path.join(args.out, "torchtune-llama3-qlora-compile.json")
        n_fail = 0
        for rc in RECOMPUTES:
            if args.only and args.only not in f"bf16/{rc}":
                continue
            doc = json.load(open(path)) if os.path.exists(path) else {
                "generated_by": "validation/measure_tune_compile.py --qlora", "torch": torch.__version__.split("+")[0],
                "framework": "torchtune", "framework_version": "0.6.1", "family": "llama3", "device": "cpu",
                "configs": {}, "records": []}
            cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--qlora", "--child", "bf16", rc]
            n_fail += not R.run_child_into(cmd, path, doc, f"bf16/{rc}")
        sys.exit(1 if n_fail else 0)
    if args.child:
        dtype, rc, out_json = args.child
        opts: dict = {}
        rec = measure_tune_compile(dtype, rc, opts, args.lora)
        R.write_step_log(rec, args.out)
        with open(out_json, "w") as f:
            json.dump({"record": rec, "cfg": opts["cfg"]}, f)
        return
    n_fail = 0
    path = os.path.join(args.out, ("torchtune-llama3-lora-ce-compile.json" if args.ce else
                                   "torchtune-llama3-lora-compile.json") if args.lora else
                        "torchtune-llama3-ce-compile.json" if args.ce else "torchtune-llama3-compile.json")
    for dtype, rc in specs(args.only):
        doc = json.load(open(path)) if os.path.exists(path) else {
            "generated_by": "validation/measure_tune_compile.py", "torch": torch.__version__.split("+")[0],
            "framework": "torchtune", "framework_version": "0.6.1", "family": "llama3", "device": "cpu",
            "configs": {}, "records": []}
        cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out] + (["--lora"] if args.lora else []) \
            + (["--lora-all"] if args.lora_all else []) + (["--ce"] if args.ce else []) \
            + ["--child", dtype, rc]
        n_fail += not R.run_child_into(cmd, path, doc, f"{dtype}/{rc}")
    sys.exit(1 if n_fail else 0)


if __name__ == "__main__":
    main()
