"""Records of the training frameworks' own modeling code (issue 28 item 1: `framework=torchtitan|torchtune|litgpt`).

The same measurement as measure.py (saved tensors with its Capture, the whole step with tracker.py's StepTracker),
on each framework's model class at a pinned version (validation/requirements-frameworks.txt), wrapped so that the
harness can call it like a transformers model: `wrapper(input_ids=..., labels=...)` runs the framework's forward and
its own loss function, inside the autocast its trainer enters where it does.

Writes tests/fixtures/pytorch/frameworks/<framework>-<family>.json ({configs, records} like measure.py's shards; each
config is the equivalent transformers config.json, plus `framework`), which tests/framework_fixtures.rs checks.

Usage:  nice validation/.venv/bin/python validation/measure_frameworks.py [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import types
from pathlib import Path

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure  # noqa: E402

OUT = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "pytorch", "frameworks")

# The tiny shapes of measure.py's grid: 2 layers, hidden 64, 4 heads of 16 (2 kv heads), vocab 1000.
DIM, LAYERS, HEADS, KV_HEADS, VOCAB = 64, 2, 4, 2, 1000


# ------------------------------------------------------------------------------------------------ torchtitan 0.2.2

def _torchtitan_llama3():
    """torchtitan.models.llama3.model.model (0.2.2). The package's __init__ (train spec: datasets, tokenizer,
    parallelize) and protocols/train_spec.py (dataloader → torchdata) are not modeling code: the model module is
    imported with those two replaced by what it uses of them (`ModelProtocol`, from protocols/model.py)."""
    import torchtitan
    root = Path(torchtitan.__file__).parent
    pkg = types.ModuleType("torchtitan.models.llama3")
    pkg.__path__ = [str(root / "models" / "llama3")]
    sys.modules.setdefault(pkg.__name__, pkg)
    import torchtitan.protocols.model as protocol_model
    spec = types.ModuleType("torchtitan.protocols.train_spec")
    spec.ModelProtocol = protocol_model.ModelProtocol
    sys.modules.setdefault(spec.__name__, spec)
    from torchtitan.models.llama3.model import model as titan_model
    from torchtitan.models.llama3.model.args import TransformerModelArgs
    from torchtitan.components.loss import cross_entropy_loss
    return titan_model, TransformerModelArgs, cross_entropy_loss


class Output(types.SimpleNamespace):
    pass


class FrameworkLM(nn.Module):
    """A framework's model and loss behind transformers' calling convention (what measure.py and tracker.py call)."""

    def __init__(self, model, loss_fn, config, output_module, blocks):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.config = config
        self._output = output_module
        self._blocks = blocks

    def get_output_embeddings(self):
        return self._output

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        """torchtitan's full activation checkpointing (distributed/activation_checkpoint.py `_apply_full_ac`):
        every transformer block wrapped in `ptd_checkpoint_wrapper` (non-reentrant), `preserve_rng_state=False`
        (ACConfig's default)."""
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        if gradient_checkpointing_kwargs and gradient_checkpointing_kwargs.get("use_reentrant"):
            raise SystemExit("the frameworks checkpoint non-reentrantly")
        for name, block in list(self._blocks.named_children()):
            self._blocks.register_module(name, checkpoint_wrapper(block, preserve_rng_state=False))

    def forward(self, input_ids, labels=None, use_cache=False):
        del use_cache
        logits = self.model(input_ids)
        loss = self.loss_fn(logits, labels) if labels is not None else None
        return Output(loss=loss, logits=logits)


def titan_loss(cross_entropy_loss):
    """train.py `forward_backward_step`: `loss_sum = self.loss_fn(pred, labels)` (components/loss.py
    `cross_entropy_loss`: `cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum")`), then
    `loss = loss_sum / global_valid_tokens` (local: `(labels != IGNORE_INDEX).sum()`, a float tensor)."""
    def loss(pred, labels):
        loss_sum = cross_entropy_loss(pred, labels)
        global_valid_tokens = (labels != -100).sum().float()
        return loss_sum / global_valid_tokens
    return loss


def build_torchtitan_llama3(seq: int, tdtype):
    titan_model, Args, ce = _torchtitan_llama3()
    from transformers import LlamaConfig
    # job_config training.seq_len sets model_args.max_seq_len (args.py `update_from_config`): freqs_cis is
    # precomputed for exactly the training sequence.
    args = Args(dim=DIM, n_layers=LAYERS, n_heads=HEADS, n_kv_heads=KV_HEADS, vocab_size=VOCAB, max_seq_len=seq,
                rope_theta=500000)
    torch.manual_seed(measure.MODEL_SEED)
    m = titan_model.Transformer(args)
    with torch.no_grad():  # the trainer initialises under torch.no_grad() too (train.py)
        m.init_weights()
    # Parameters only: `Module.to(dtype)` casts complex buffers too (complex64 → float32 drops freqs_cis's
    # imaginary part); FSDP2's `param_dtype` casts only parameters, freqs_cis stays complex64.
    with torch.no_grad():
        for prm in m.parameters():
            prm.data = prm.data.to(tdtype)
    m.train()
    ffn = m.layers["0"].feed_forward.w1.out_features
    cfg = LlamaConfig(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=ffn, vocab_size=VOCAB,
                      rms_norm_eps=args.norm_eps, max_position_embeddings=seq, tie_word_embeddings=False,
                      rope_theta=args.rope_theta)
    cfg.dtype = tdtype
    cfg.architectures = ["LlamaForCausalLM"]
    lm = FrameworkLM(m, titan_loss(ce), cfg, m.output, m.layers)
    return lm


FRAMEWORKS = {
    # (framework, family): (version, builder(seq, torch dtype), attentions it runs)
    ("torchtitan", "llama3"): ("0.2.2", build_torchtitan_llama3, ["sdpa"]),
}


def specs(only: str | None):
    for (fw, fam), (_, _, attns) in FRAMEWORKS.items():
        for dtype in ("fp32", "bf16", "amp-bf16"):
            for attn in attns:
                for ckpt in (None, "non_reentrant"):
                    s = {"framework": fw, "family": fam, "batch": 2, "seq": 64, "dtype": dtype, "attn": attn,
                         "checkpoint_mode": ckpt, "dropout": 0.0, "extra": False}
                    if only is None or only in f"{fw}-{fam}/{dtype}/{attn}/{ckpt}":
                        yield s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    current: dict = {}

    def build_model(family, dtype, attn, dropout, experts_impl):
        del family, attn, dropout, experts_impl
        s = current["spec"]
        _, builder, _ = FRAMEWORKS[(s["framework"], s["family"])]
        return builder(s["seq"], torch.bfloat16 if dtype == "bf16" else torch.float32)

    measure.build_model = build_model
    shards: dict[str, dict] = {}
    for spec in specs(args.only):
        t0 = time.time()
        current["spec"] = spec
        fw, fam = spec["framework"], spec["family"]
        name = f"{fw}-{fam}"
        spec = dict(spec, family=name)
        rec, cfg, _, _ = measure.measure(spec)
        cfg = dict(cfg, framework=fw)
        rec["framework"] = fw
        rec["framework_version"] = FRAMEWORKS[(fw, fam)][0]
        key = f"{name}/{cfg.get('dtype')}"
        rec["config_key"] = key
        doc = shards.setdefault(name, {"generated_by": "validation/measure_frameworks.py",
                                       "torch": torch.__version__.split("+")[0], "framework": fw,
                                       "framework_version": FRAMEWORKS[(fw, fam)][0], "family": fam,
                                       "device": "cpu", "configs": {}, "records": []})
        doc["configs"][key] = cfg
        doc["records"].append(rec)
        st = rec["step"]
        print(f"{rec['id']}: saved {rec['saved_bytes']} B; step peak {st['measured_peak_bytes']} B "
              f"({st['peak_phase']} {st['peak_op']} {st['peak_module']}) checks {st['checks']} "
              f"{time.time() - t0:.1f}s", file=sys.stderr, flush=True)
        gc.collect()
    for name, doc in shards.items():
        with open(os.path.join(args.out, f"{name}.json"), "w") as f:
            f.write(measure.dump(doc))


if __name__ == "__main__":
    main()
