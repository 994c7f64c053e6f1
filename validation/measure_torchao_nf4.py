#!/usr/bin/env python3
"""torchtune's QLoRA: torchao's ``NF4Tensor`` base under torchtune's ``LoRALinear`` (no bitsandbytes).

torchtune 0.6.1 ``lora_llama3_1(..., quantize_base=True)`` (the builder behind ``qlora_llama3_1_*``) stores every
decoder linear as torchao's ``NF4Tensor`` (``to_nf4(weight)``, block_size 64, scaler_block_size 256): adapted ones in
``LoRALinear`` (``modules/peft/lora.py``), the others (k_proj under the YAML default) in ``FrozenNF4Linear``
(``modules/low_precision/nf4_linear.py``); both run ``linear_nf4`` (torchao 0.18
``quantization/quantize_/workflows/nf4/nf4_tensor.py``, imported by torchtune as ``torchao.dtypes.nf4tensor``:
aliased here), an autograd Function that saves the ``NF4Tensor`` and dequantizes it (``get_original_weight``) in
forward and again in backward. The LoRA recipe's loss and adapters as measure_frameworks.py's torchtune records
(``CEWithChunkedOutputLoss(8)``, adapters in the model's dtype, only ``lora_a``/``lora_b`` trainable:
``set_trainable_params``); the YAML's targets: q, v, output + MLP, rank 8, alpha 16, dropout 0.

The tiny Llama 3.1 is measure_frameworks.py's with hidden 128 and 4 kv heads (every quantized weight a multiple of
64·256 elements, which ``to_nf4`` asserts): q, k, v, o 128×128 (one scaler block: ``quantization_factor`` keeps its
256-element storage), MLP 128×256 (two). Then measure.py's machinery runs unchanged (saved tensors with the graph
walk; two tracked steps of AdamW over the adapters, with the self-checks), with the NF4 inner tensors
(``quantized_data``, ``quantized_scalers``, ``quantization_factor``, ``scaler_mean``, ``nf4``) classified as
``nf4`` before each step and counted by storage in the record's ``nf4`` block (``measure.py`` counts a wrapper
subclass's parameter as numel × element size: its ``parameter_bytes`` here is the bf16 size, not what is stored).

Writes tests/fixtures/pytorch/torchao_nf4/records.json (b2 s64, bf16, with and without checkpointing).

Usage: nice validation/.venv/bin/python validation/measure_torchao_nf4.py
(torch 2.15.0, torchtune 0.6.1, torchao 0.18.0).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torchao.quantization import NF4Tensor  # noqa: E402  (the real one, before measure_frameworks' stubs)

sys.modules["torchao.dtypes.nf4tensor"] = sys.modules[NF4Tensor.__module__]
import measure  # noqa: E402
import measure_frameworks as mf  # noqa: E402
import tracker as step_tracker  # noqa: E402
import torchao  # noqa: E402

mf.REAL_NF4 = True
OUT = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "pytorch", "torchao_nf4")
DIM, HEADS, KV_HEADS, FFN = 128, 4, 4, 256
LORA = dict(lora_attn_modules=["q_proj", "v_proj", "output_proj"], apply_lora_to_mlp=True,
            apply_lora_to_output=False, lora_rank=8, lora_alpha=16, lora_dropout=0.0)
INNER = ("quantized_data", "quantized_scalers", "quantization_factor", "scaler_mean", "nf4")
MODELS: list = []


def nf4_weights(model):
    return [p for p in model.parameters() if isinstance(p, NF4Tensor) or isinstance(getattr(p, "data", None), NF4Tensor)]


def inner_tensors(model):
    out = []
    for p in nf4_weights(model):
        t = p if isinstance(p, NF4Tensor) else p.data
        out.extend(getattr(t, a) for a in INNER)
    return out


class Nf4StepTracker(step_tracker.StepTracker):
    def begin_step(self, classes=None):
        extra = {"nf4": [t for m in MODELS for t in inner_tensors(m)]}
        super().begin_step({**extra, **dict(classes or {})})


step_tracker.StepTracker = Nf4StepTracker


def _plain(t):
    """An NF4Tensor stands for its `quantized_data` (a parameter storage: never counted as saved)."""
    return t.quantized_data if isinstance(t, NF4Tensor) else t


_orig_storage_ptrs = measure.storage_ptrs


def storage_ptrs(tensors):
    out = set()
    for t in tensors:
        if isinstance(t, NF4Tensor):
            out |= _orig_storage_ptrs([getattr(t, a) for a in INNER])
        else:
            out |= _orig_storage_ptrs([t])
    return out


measure.storage_ptrs = storage_ptrs
# The trackers key tensors by storage: an NF4Tensor (a wrapper without one) answers with its quantized data's.
NF4Tensor.untyped_storage = lambda self: self.quantized_data.untyped_storage()
_orig_add_event = measure.Capture._add_event
measure.Capture._add_event = lambda self, t, **kw: _orig_add_event(self, _plain(t), **kw)


def build(seq, tdtype):
    del seq
    mf._torchtune_modules()
    from torchtune.models.llama3_1._component_builders import lora_llama3_1
    from transformers import LlamaConfig
    m = mf._tune_model(lora_llama3_1, tdtype, vocab_size=mf.VOCAB, num_layers=mf.LAYERS, num_heads=HEADS,
                       num_kv_heads=KV_HEADS, embed_dim=DIM, max_seq_len=mf.TUNE_MAX_SEQ, intermediate_dim=FFN,
                       rope_base=500000, quantize_base=True, **LORA)
    # `set_trainable_params(model, get_adapter_params(model))`
    for n, p in m.named_parameters():
        p.requires_grad_(n.endswith("lora_a.weight") or n.endswith("lora_b.weight"))
    cfg = LlamaConfig(hidden_size=DIM, num_hidden_layers=mf.LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=FFN,
                      vocab_size=mf.VOCAB, rms_norm_eps=1e-5, max_position_embeddings=mf.TUNE_MAX_SEQ,
                      tie_word_embeddings=False, rope_theta=500000,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    lm = mf._tune_lm(m, cfg, tdtype, "LlamaForCausalLM")
    MODELS.clear()
    MODELS.append(lm)
    return lm


def layout(model):
    rows = {}
    for n, p in model.named_parameters():
        t = p if isinstance(p, NF4Tensor) else p.data
        if not isinstance(t, NF4Tensor):
            continue
        key = (tuple(t.shape), str(t.dtype).replace("torch.", ""))
        d = {a: getattr(t, a).untyped_storage().nbytes() for a in INNER}
        d.update(shape=list(t.shape), numel=t.numel(), dtype=key[1], block_size=t.block_size,
                 scaler_block_size=t.scaler_block_size, count=0)
        rows.setdefault(key, d)["count"] += 1
        rows[key].setdefault("modules", []).append(n)
    out = list(rows.values())
    for r in out:
        r["total_bytes"] = sum(r[a] for a in INNER)
        r["modules"] = sorted({".".join(x for x in m.split(".") if not x.isdigit()) for m in r["modules"]})
    return out


def main():
    torch.set_num_threads(1)
    measure.build_model = lambda family, dtype, attn, dropout, experts_impl: build(64, torch.bfloat16)
    os.makedirs(OUT, exist_ok=True)
    records, configs = [], {}
    for ckpt in (None, "non_reentrant"):
        t0 = time.time()
        spec = {"family": "torchtune-llama3-qlora", "batch": 2, "seq": 64, "dtype": "bf16", "attn": "sdpa",
                "checkpoint_mode": ckpt, "dropout": 0.0, "extra": False}
        rec, cfg, _, _ = measure.measure(spec)
        model = build(64, torch.bfloat16)
        lay = layout(model)
        trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        frozen = sum(p.numel() * p.element_size() for p in model.parameters()
                     if not p.requires_grad and not isinstance(p, NF4Tensor))
        rec["framework"] = "torchtune"
        rec["framework_version"] = "0.6.1"
        rec["config_key"] = "torchtune-llama3-qlora/bf16"
        rec["nf4"] = {"torchao": torchao.__version__, "lora": LORA, "layout": lay,
                      "nf4_bytes": sum(r["count"] * r["total_bytes"] for r in lay),
                      "tracked_nf4_bytes": rec["step"].get("preexisting", {}).get("nf4"),
                      "trainable_parameter_bytes": trainable, "frozen_unquantized_parameter_bytes": frozen}
        del model
        MODELS.clear()
        gc.collect()
        configs[rec["config_key"]] = dict(cfg, framework="torchtune")
        records.append(rec)
        st = rec["step"]
        print(f"{rec['id']}: saved {rec['saved_bytes']} step peak {st['measured_peak_bytes']} ({st['peak_phase']} "
              f"{st['peak_op']} {st['peak_module']}) checks {st['checks']} {time.time() - t0:.1f}s",
              file=sys.stderr, flush=True)
    doc = {"generated_by": "validation/measure_torchao_nf4.py (torchtune QLoRA on torchao NF4Tensor)",
           "torch": torch.__version__.split("+")[0], "torchtune": "0.6.1", "torchao": torchao.__version__,
           "device": "cpu", "seeds": {"model": measure.MODEL_SEED, "data": measure.DATA_SEED}, "configs": configs,
           "records": records}
    with open(os.path.join(OUT, "records.json"), "w") as f:
        f.write(measure.dump(doc))


if __name__ == "__main__":
    main()
