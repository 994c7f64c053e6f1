"""Measure the KV cache transformers holds while it generates, per architecture (issue 29).

For every tiny configuration of `tests/fixtures/pytorch/records/*.json` whose `model_type` the
estimator accepts, build the model with random weights on the CPU (`from_config`, nothing
downloaded), prefill `batch` sequences of `prefill` tokens with `use_cache=True`, decode `decode`
more tokens one at a time, and record every tensor the cache holds, layer by layer: its shape,
dtype, logical bytes (numel x element size) and the bytes of the storage behind it (a view keeps
its whole storage alive: DynamicSlidingWindowLayer slices the concatenation it just made).

Hybrid layers (transformers 5.24 cache_utils.py `DYNAMIC_LAYER_TYPE_MAPPING`): a gated DeltaNet
layer of Qwen3-Next / Qwen3.5 (`linear_attention`) is a `LinearAttentionLayer` holding
`conv_states[0]` and `recurrent_states[0]` and no keys; a Falcon-H1 layer (`hybrid`) is a
`LinearAttentionAndFullAttentionLayer` holding both those states and keys/values; DeepSeek-V3.2's
`indexed_attention` is a `DynamicIndexedLayer` with its indexer keys besides. Every tensor
attribute is recorded, dictionaries of states included.

Caches measured:
- `DynamicCache(config=model.config)`: what `forward`/`generate()` create by default
  (`DynamicLayer` for full attention, `DynamicSlidingWindowLayer` for sliding and chunked layers);
- `QuantizedCache(backend="fp8", config=...)`: transformers' own FP8 cache (per-tensor scale,
  `Fp8QuantizedLayer`), only for models whose layers are all full attention (transformers
  refuses the others). The quanto and hqq backends need optimum-quanto / hqq, not installed here.

Usage: validation/.venv/bin/python validation/serve/measure_kv.py [OUT.json]
(torch 2.15.0, transformers 5.24.0; the CPU only.)
"""

import copy
import glob
import json
import os
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.cache_utils import DynamicCache, QuantizedCache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDS = os.path.join(ROOT, "tests", "fixtures", "pytorch", "records")

# model_types the estimator accepts (src/estimator/family.rs, Family::ALL). The records of
# Every model_type the estimator accepts, Granite 4.0-H and Kimi Linear included.
ACCEPTED = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3_text", "olmo", "olmo2", "phi", "phi3", "gpt2", "gpt_neox", "opt", "falcon", "stablelm",
    "starcoder2", "deepseek_v2", "deepseek_v3", "glm4_moe", "gpt_oss", "llama4_text", "smollm3",
    # Issue 25's families.
    "seed_oss", "olmo3", "falcon_h1", "deepseek_v32", "exaone4", "apertus", "minimax_m2",
    "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "granitemoehybrid", "kimi_linear",
}
# Families whose transformers code has no SDPA path (the records say so): eager attention.
EAGER = {"gemma2", "gpt_oss"}
BATCH = 2
# (prefill, decode): below and above the tiny configs' windows and chunks of 48 tokens.
SHAPES = [(1, 0), (30, 0), (30, 2), (100, 0), (100, 2)]


def tensors_of(obj, prefix, out):
    """Every tensor reachable from a cache layer's attributes (tuples of quantized states too)."""
    if isinstance(obj, torch.Tensor):
        out.append((prefix, obj))
    elif isinstance(obj, (tuple, list)):
        for i, x in enumerate(obj):
            tensors_of(x, f"{prefix}[{i}]", out)
    elif isinstance(obj, dict):
        # LinearAttentionLayer's `conv_states` / `recurrent_states`: {state_idx: tensor}.
        for k in sorted(obj):
            tensors_of(obj[k], f"{prefix}[{k}]", out)


def describe(cache):
    layers = []
    for layer in cache.layers:
        found = []
        for name, value in sorted(vars(layer).items()):
            tensors_of(value, name, found)
        seen = set()
        rows = []
        for name, t in found:
            st = t.untyped_storage()
            key = (st.data_ptr(), st.nbytes())
            first = key not in seen and st.nbytes() > 0
            seen.add(key)
            rows.append({
                "name": name,
                "shape": list(t.shape),
                "dtype": str(t.dtype).replace("torch.", ""),
                "bytes": t.numel() * t.element_size(),
                "storage_bytes": st.nbytes() if first else 0,
            })
        layers.append({"class": type(layer).__name__, "tensors": rows})
    return layers


def run(model, cache, prefill, decode, vocab):
    g = torch.Generator().manual_seed(prefill * 31 + decode)
    ids = torch.randint(3, vocab, (BATCH, prefill), generator=g)
    with torch.no_grad():
        out = model(input_ids=ids, cache=cache, use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        for _ in range(decode):
            nxt = torch.randint(3, vocab, (BATCH, 1), generator=g)
            out = model(input_ids=nxt, cache=cache, use_cache=True)
            cache = getattr(out, "cache", None) or out.past_key_values
    return cache


def configs():
    for path in sorted(glob.glob(os.path.join(RECORDS, "*.json"))):
        if path.endswith("index.json"):
            continue
        doc = json.load(open(path))
        if doc["model_type"] not in ACCEPTED:
            continue
        for cid, cfg in doc["configs"].items():
            if "dropout" in cid:
                continue
            yield cid, cfg
            # Phi-3 passes `sliding_window` to every layer; the tiny record has none: add one.
            if doc["model_type"] == "phi3" and cid.endswith("phi3/bfloat16"):
                c = copy.deepcopy(cfg)
                c["sliding_window"] = 48
                yield cid.replace("phi3/", "phi3-sliding/"), c


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "fixtures", "serve", "transformers_kv.json")
    torch.manual_seed(0)
    records = []
    for cid, cfg_dict in configs():
        mt = cfg_dict["model_type"]
        dtype = getattr(torch, cfg_dict.get("dtype") or "float32")
        kwargs = {k: v for k, v in cfg_dict.items() if k not in ("model_type", "transformers_version")}
        config = AutoConfig.for_model(mt, **kwargs)
        attn = "eager" if mt in EAGER else "sdpa"
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn).eval()
        except ValueError:
            # A family without an SDPA path: its eager attention caches the same tensors.
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="eager").eval()
        vocab = config.vocab_size
        kinds = [("dynamic", lambda: DynamicCache(config=model.config))]
        try:
            QuantizedCache(backend="fp8", config=model.config)
            kinds.append(("fp8", lambda: QuantizedCache(backend="fp8", config=model.config)))
        except (ValueError, TypeError, NotImplementedError):
            # transformers refuses a quantized cache for windows and hybrid (state) layers.
            pass
        for kind, make in kinds:
            for prefill, decode in SHAPES:
                cache = run(model, make(), prefill, decode, vocab)
                layers = describe(cache)
                total = sum(t["bytes"] for l in layers for t in l["tensors"])
                storage = sum(t["storage_bytes"] for l in layers for t in l["tensors"])
                records.append({
                    "id": f"{cid}/{kind}/b{BATCH}/s{prefill}+{decode}",
                    "config": cid,
                    "model_type": mt,
                    "dtype": str(dtype).replace("torch.", ""),
                    "cache": kind,
                    "batch": BATCH,
                    "prefill": prefill,
                    "decode": decode,
                    "layers": layers,
                    "bytes": total,
                    "storage_bytes": storage,
                })
                print(records[-1]["id"], total, storage, flush=True)
    configs_out = {cid: cfg for cid, cfg in configs()}
    doc = {
        "generated_by": "validation/serve/measure_kv.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": "cpu",
        "note": "bytes: numel x element size of every tensor a cache layer holds; storage_bytes: the storages behind them, each counted once",
        "configs": configs_out,
        "records": records,
    }
    with open(out_path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(records)} records to {out_path}")


if __name__ == "__main__":
    main()
