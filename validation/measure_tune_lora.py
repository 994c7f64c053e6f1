#!/usr/bin/env python3
"""torchtune 0.6.1's own LoRA, eager: `LoRALinear` (modules/peft/lora.py) in torchtune's own Llama 3.1 and Qwen2
(`lora_llama3_1`, `lora_qwen2`: the builders behind `llama3_1/8B_lora_single_device.yaml` and
`qwen2_5/*_lora_single_device.yaml`), trained as `recipes/lora_finetune_single_device.py` trains it: only the
adapters trainable (`set_trainable_params(model, get_adapter_params(model))`), `CEWithChunkedOutputLoss(8)`, each
`TransformerSelfAttentionLayer` checkpointed (`set_activation_checkpointing`) or none.

`LoRALinear.forward` (quantize_base False): `out = F.linear(x, self.weight, self.bias)`,
`lora_out = self.lora_a(self.dropout(x))`, `lora_out = (self.alpha / self.rank) * self.lora_b(lora_out)`,
`return out + lora_out`: the adapters are built under the recipe's default dtype (the model's), no casts.

The tiny models are validation/measure_frameworks.py's torchtune Llama 3.1 and Qwen2 (2 layers, hidden 64, 4 heads
of 16, 2 kv heads, FFN 256, vocab 1000, max_seq_len 128); measure.py's machinery measures each record (saved tensors
with the graph walk; two tracked steps of AdamW over the adapters, with the self-checks), each in a fresh
interpreter. Targets: `q,v` (`lora_attn_modules=["q_proj", "v_proj"]`, the 8B single-device YAML's) and `all`
(q, k, v, output_proj and the MLP: `apply_lora_to_mlp=True`), never the output (`apply_lora_to_output=False`);
rank 8, alpha 16, dropout 0.0 (one record at 0.05).

Writes tests/fixtures/pytorch/frameworks/torchtune-llama3-lora.json ({configs, records}; the Qwen2 records in
torchtune-qwen2-lora.json), which tests/framework_fixtures.rs checks.

With `--qlora`: torchtune's QLoRA (`qlora_llama3_1_*` / `qlora_llama3_2_*`: the same builders with
`quantize_base=True`): every decoder linear an `NF4Tensor` (`to_nf4`; adapted ones in `LoRALinear`, the others in
`FrozenNF4Linear`, the MLP's too: `llama3_mlp(quantize_base=True)`), the output projection a plain bf16 `nn.Linear`
(`lora_llama3_1`) or the embedding (`TiedLinear`, `lora_llama3_2`). `to_nf4` needs every weight a multiple of
64·256 elements: hidden 128 and 4 kv heads of 32 (validation/measure_torchao_nf4.py's shapes, whose NF4 machinery
runs here: real torchao NF4Tensor, inner tensors counted as `nf4`); adapters on q and v, bf16, recompute none and
full. Writes torchtune-llama3-qlora.json (estimated: tests/framework_fixtures.rs).

Usage:  nice validation/.venv/bin/python validation/measure_tune_lora.py [--only SUBSTRING] [--qlora]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import measure  # noqa: E402
import measure_frameworks as F  # noqa: E402

OUT = F.OUT
TARGETS = {"qv": (["q_proj", "v_proj"], False), "all": (["q_proj", "k_proj", "v_proj", "output_proj"], True)}
RANK, ALPHA = 8, 16


def build(family: str, tdtype, targets: str, lora_dropout: float):
    """The family's torchtune LoRA builder at measure_frameworks.py's shapes, only the adapters trainable."""
    F._torchtune_modules()  # the package entered by path, torchao stubbed (no NF4 here), before torchtune.modules.peft
    from torchtune.modules.peft import get_adapter_params, set_trainable_params
    attn, mlp = TARGETS[targets]
    lora = dict(lora_attn_modules=attn, apply_lora_to_mlp=mlp, apply_lora_to_output=False, lora_rank=RANK,
                lora_alpha=ALPHA, lora_dropout=lora_dropout)
    if family == "llama3":
        base = F.build_torchtune_llama3(64, tdtype)
        m = F._tune_model(F._torchtune_builder("llama3_1", "lora_llama3_1"), tdtype, vocab_size=F.VOCAB,
                          num_layers=F.LAYERS, num_heads=F.HEADS, num_kv_heads=F.KV_HEADS, embed_dim=F.DIM,
                          max_seq_len=F.TUNE_MAX_SEQ, intermediate_dim=256, rope_base=500000, **lora)
    elif family == "qwen2":
        base = F.build_torchtune_qwen2(64, tdtype)
        m = F._tune_model(F._torchtune_builder("qwen2", "lora_qwen2"), tdtype, vocab_size=F.VOCAB,
                          num_layers=F.LAYERS, num_heads=F.HEADS, num_kv_heads=F.KV_HEADS, embed_dim=F.DIM,
                          intermediate_dim=256, max_seq_len=F.TUNE_MAX_SEQ, norm_eps=1e-6, rope_base=1_000_000.0,
                          tie_word_embeddings=True, **lora)
    else:
        raise SystemExit(f"family {family}")
    set_trainable_params(m, get_adapter_params(m))
    m.set_num_output_chunks(base.loss_fn.num_output_chunks)
    m.train()
    base.model = m
    return base


QLORA_DIM, QLORA_KV = 128, 4


def build_qlora(family: str, targets: str):
    """`lora_llama3_1` / `lora_llama3_2` with `quantize_base=True` at measure_torchao_nf4.py's shapes, bf16, only
    the adapters trainable. Needs measure_torchao_nf4 imported first (the real NF4Tensor)."""
    import measure_torchao_nf4 as N
    from transformers import LlamaConfig
    tdtype = torch.bfloat16
    attn, mlp = TARGETS[targets]
    lora = dict(lora_attn_modules=attn, apply_lora_to_mlp=mlp, apply_lora_to_output=False, lora_rank=RANK,
                lora_alpha=ALPHA, lora_dropout=0.0)
    shape = dict(vocab_size=F.VOCAB, num_layers=F.LAYERS, num_heads=F.HEADS, num_kv_heads=QLORA_KV,
                 embed_dim=QLORA_DIM, max_seq_len=F.TUNE_MAX_SEQ, intermediate_dim=256, rope_base=500000,
                 quantize_base=True, **lora)
    if family == "llama3":
        m = F._tune_model(F._torchtune_builder("llama3_1", "lora_llama3_1"), tdtype, **shape)
        tied, factor = False, 8.0
    elif family == "llama3_2":
        m = F._tune_model(F._torchtune_builder("llama3_2", "lora_llama3_2"), tdtype, scale_factor=32,
                          tie_word_embeddings=True, **shape)
        tied, factor = True, 32.0
    else:
        raise SystemExit(f"family {family}")
    from torchtune.modules.peft import get_adapter_params, set_trainable_params
    set_trainable_params(m, get_adapter_params(m))
    cfg = LlamaConfig(hidden_size=QLORA_DIM, num_hidden_layers=F.LAYERS, num_attention_heads=F.HEADS,
                      num_key_value_heads=QLORA_KV, head_dim=QLORA_DIM // F.HEADS, intermediate_size=256,
                      vocab_size=F.VOCAB, rms_norm_eps=1e-5, max_position_embeddings=F.TUNE_MAX_SEQ,
                      tie_word_embeddings=tied, rope_theta=500000,
                      rope_scaling={"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    lm = F._tune_lm(m, cfg, tdtype, "LlamaForCausalLM")
    N.MODELS.clear()
    N.MODELS.append(lm)
    return lm


def qlora_specs(only):
    for fam in ("llama3", "llama3_2"):
        for ckpt in (None, "non_reentrant"):
            key = f"{fam}/qv/bf16/{ckpt}/qlora"
            if only is None or only in key:
                yield (fam, "qv", "bf16", ckpt, -1.0), key


def measure_tune(name, dtype, ckpt, tag):
    """measure.py's step on the torchtune model `measure.build_model` builds (b2 s64, SDPA, no dropout): the record
    with `/tag` on its id, torchtune named as its framework, its step log written under STEP_LOG=1 (as measure.py
    writes them); returns (record, cfg)."""
    spec = {"family": name, "batch": 2, "seq": 64, "dtype": dtype, "attn": "sdpa", "checkpoint_mode": ckpt,
            "dropout": 0.0, "extra": False, "log": bool(os.environ.get("STEP_LOG"))}
    rec, cfg, _, log = measure.measure(spec)
    rec["id"] += f"/{tag}"
    if log is not None:
        with open(os.path.join(OUT, "steps", measure.step_log_name(rec["id"])), "w") as f:
            f.write(measure.dump_log(log))
    rec["framework"] = "torchtune"
    rec["framework_version"] = "0.6.1"
    return rec, cfg


def qlora_child(fam, targets, ckpt, out_json):
    import measure_torchao_nf4 as N  # the real NF4Tensor and its trackers, before any torchtune import
    torch.set_num_threads(1)
    measure.build_model = lambda family, d, a, dr, e: build_qlora(fam, targets)
    name = f"torchtune-{fam}-qlora"
    rec, cfg = measure_tune(name, "bf16", ckpt, f"qlora-r{RANK}-{targets}")
    rec["config_key"] = f"{name}/bf16"
    model = build_qlora(fam, targets)
    lay = N.layout(model)
    attn, mlp = TARGETS[targets]
    rec["lora"] = {"builder": "lora_llama3_1" if fam == "llama3" else "lora_llama3_2", "quantize_base": True,
                   "lora_attn_modules": attn, "apply_lora_to_mlp": mlp, "apply_lora_to_output": False,
                   "lora_rank": RANK, "lora_alpha": ALPHA, "lora_dropout": 0.0, "trainable": "get_adapter_params",
                   "trainable_parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()
                                                    if p.requires_grad),
                   "frozen_unquantized_parameter_bytes": sum(
                       p.numel() * p.element_size() for p in model.parameters()
                       if not p.requires_grad and not isinstance(p, N.NF4Tensor)
                       and not isinstance(getattr(p, "data", None), N.NF4Tensor))}
    rec["nf4"] = {"torchao": N.torchao.__version__, "layout": lay,
                  "nf4_bytes": sum(r["count"] * r["total_bytes"] for r in lay),
                  "tracked_nf4_bytes": rec["step"].get("preexisting", {}).get("nf4")}
    with open(out_json, "w") as f:
        json.dump({"record": rec, "cfg": dict(cfg, framework="torchtune")}, f)


def specs(only):
    out = []
    for fam in ("llama3", "qwen2"):
        for targets in ("qv", "all"):
            for dtype in ("fp32", "bf16"):
                for ckpt in (None, "non_reentrant"):
                    if fam == "qwen2" and dtype == "fp32":
                        continue
                    out.append((fam, targets, dtype, ckpt, 0.0))
    out.append(("llama3", "all", "bf16", None, 0.05))
    for s in out:
        key = f"{s[0]}/{s[1]}/{s[2]}/{s[3]}/{s[4]}"
        if only is None or only in key:
            yield s, key


def child(fam, targets, dtype, ckpt, lora_dropout, out_json):
    torch.set_num_threads(1)
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    measure.build_model = lambda family, d, a, dr, e: build(fam, tdtype, targets, lora_dropout)
    name = f"torchtune-{fam}"
    tag = f"lora-r{RANK}-{targets}" + (f"-dropout{lora_dropout}" if lora_dropout else "")
    rec, cfg = measure_tune(name, dtype, ckpt, tag)
    attn, mlp = TARGETS[targets]
    rec["config_key"] = f"{name}/{cfg.get('dtype')}"
    model = build(fam, tdtype, targets, lora_dropout)
    rec["lora"] = {"builder": f"lora_{'llama3_1' if fam == 'llama3' else fam}", "lora_attn_modules": attn,
                   "apply_lora_to_mlp": mlp, "apply_lora_to_output": False, "lora_rank": RANK, "lora_alpha": ALPHA,
                   "lora_dropout": lora_dropout, "trainable": "get_adapter_params",
                   "trainable_parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()
                                                    if p.requires_grad),
                   "frozen_parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()
                                                 if not p.requires_grad)}
    with open(out_json, "w") as f:
        json.dump({"record": rec, "cfg": dict(cfg, framework="torchtune")}, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="substring of family/targets/dtype/checkpoint/dropout")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--qlora", action="store_true", help="torchtune's QLoRA builders (quantize_base=True)")
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        fam, targets, dtype, ckpt, p, out_json = args.child
        if float(p) < 0:
            return qlora_child(fam, targets, None if ckpt == "None" else ckpt, out_json)
        return child(fam, targets, dtype, None if ckpt == "None" else ckpt, float(p), out_json)
    n_fail = 0
    for (fam, targets, dtype, ckpt, p), key in (qlora_specs if args.qlora else specs)(args.only):
        path = os.path.join(args.out, "torchtune-llama3-qlora.json" if args.qlora else f"torchtune-{fam}-lora.json")
        doc = json.load(open(path)) if os.path.exists(path) else {
            "generated_by": "validation/measure_tune_lora.py" + (" --qlora" if args.qlora else ""), "torch": torch.__version__.split("+")[0],
            "framework": "torchtune", "framework_version": "0.6.1", "family": fam, "device": "cpu",
            "configs": {}, "records": []}
        t0 = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rec.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--child", fam, targets, dtype, str(ckpt), str(p), out]
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0 or not os.path.exists(out):
                print(f"FAILED {key}:\n{r.stdout[-4000:]}", file=sys.stderr, flush=True)
                n_fail += 1
                continue
            got = json.load(open(out))
        rec = got["record"]
        doc["configs"][rec["config_key"]] = got["cfg"]
        doc["records"] = sorted([x for x in doc["records"] if x["id"] != rec["id"]] + [rec], key=lambda x: x["id"])
        with open(path, "w") as f:
            f.write(measure.dump(doc))
        st = rec["step"]
        print(f"{rec['id']}: saved {rec['saved_bytes']} B; peak {st['measured_peak_bytes']} B ({st['peak_phase']} "
              f"{st['peak_op']}) checks {st['checks']} {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    sys.exit(1 if n_fail else 0)


if __name__ == "__main__":
    main()
