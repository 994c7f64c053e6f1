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


def bare_packages(*names: str):
    """Register `torchtitan.models.<name>` for each name as a bare package (its `__path__` only): the packages'
    `__init__` (train specs: datasets, tokenizers, torchdata) are not modeling code and are not entered; their model
    and `infra/parallelize.py` modules then import as they are."""
    import torchtitan
    root = Path(torchtitan.__file__).parent
    for name in names:
        pkg = types.ModuleType(f"torchtitan.models.{name}")
        pkg.__path__ = [str(root / "models" / name)]
        sys.modules.setdefault(pkg.__name__, pkg)


def _torchtitan_bare(name: str, args_class: str):
    """torchtitan.models.<name>.model.model (0.2.2), imported as `_torchtitan_llama3` imports Llama 3's: the package's
    __init__ (train spec, parallelize, datasets) is not entered; protocols/train_spec.py is replaced by what the model
    uses of it (`ModelProtocol`, and `BaseModelArgs` for args.py). Returns (model module, its args class, the loss)."""
    import importlib
    bare_packages(name)
    import torchtitan.protocols.model as protocol_model
    spec = sys.modules.get("torchtitan.protocols.train_spec") or types.ModuleType("torchtitan.protocols.train_spec")
    spec.ModelProtocol = protocol_model.ModelProtocol
    spec.BaseModelArgs = protocol_model.BaseModelArgs
    sys.modules.setdefault(spec.__name__, spec)
    titan_model = importlib.import_module(f"torchtitan.models.{name}.model.model")
    args = getattr(importlib.import_module(f"torchtitan.models.{name}.model.args"), args_class)
    from torchtitan.components.loss import cross_entropy_loss
    return titan_model, args, cross_entropy_loss


def _torchtitan_qwen3():
    """torchtitan.models.qwen3.model.model (0.2.2)."""
    return _torchtitan_bare("qwen3", "Qwen3ModelArgs")


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
        (ACConfig's default). With `ac_mode = "op"` (set by `main` for the `op` records): torchtitan's own
        `apply_ac` with `mode = "selective"`, `selective_ac_option = "op"` and the model's `_op_sac_save_list`
        (`titan_op_sac`), eager."""
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        if gradient_checkpointing_kwargs and gradient_checkpointing_kwargs.get("use_reentrant"):
            raise SystemExit("the frameworks checkpoint non-reentrantly")
        if getattr(self, "ac_mode", None) == "op":
            titan_op_sac(self.model, self.ac_family)
            return
        for name, block in list(self._blocks.named_children()):
            self._blocks.register_module(name, checkpoint_wrapper(block, preserve_rng_state=False))

    def forward(self, input_ids, labels=None, use_cache=False):
        del use_cache
        logits = self.model(input_ids)
        loss = self.loss_fn(logits, labels) if labels is not None else None
        return Output(loss=loss, logits=logits)


def titan_op_sac(model, family: str):
    """torchtitan 0.2.2's `apply_ac` (distributed/activation_checkpoint.py) with `mode = "selective"`,
    `selective_ac_option = "op"`, `model_compile_enabled = False` and the model's `_op_sac_save_list` (literal: the
    CPU's SDPA kernel is not in it, so a CPU run recomputes attention, as `recompute=op` with `kernels=cpu`). DeepSeek-V3's
    (models/deepseek_v3/infra/parallelize.py, lines 33-48) is written out here: importing that module pulls in the
    data loaders (torchdata, not installed). It is Llama 3's list with the EP all-to-all and without varlen."""
    from torchtitan.config.job_config import ActivationCheckpoint
    from torchtitan.distributed.activation_checkpoint import apply_ac
    if family != "deepseek_v3":
        # Llama 3's and Qwen3's lists (Qwen3 MoE is `Qwen3Model`): their parallelize modules import under bare
        # packages (qwen3's imports llama3's and llama4's).
        bare_packages("llama3", "llama4", "qwen3")
        if family == "llama3":
            from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list as save_list
        else:
            from torchtitan.models.qwen3.infra.parallelize import _op_sac_save_list as save_list
        apply_ac(model, ActivationCheckpoint(mode="selective", selective_ac_option="op"), model_compile_enabled=False,
                 op_sac_save_list=save_list)
        return
    aten = torch.ops.aten
    save_list = {
        aten.mm.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten._scaled_dot_product_attention_math.default,
        aten._scaled_dot_product_fused_attention_overrideable.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        torch.ops._c10d_functional.all_to_all_single.default,
        aten.max.default,
        torch._higher_order_ops.flex_attention,
        torch._higher_order_ops.inductor_compiled_code,
    }
    apply_ac(model, ActivationCheckpoint(mode="selective", selective_ac_option="op"), model_compile_enabled=False,
             op_sac_save_list=save_list)


def titan_loss(cross_entropy_loss):
    """train.py `forward_backward_step`: `loss_sum = self.loss_fn(pred, labels)` (components/loss.py
    `cross_entropy_loss`: `cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum")`), then
    `loss = loss_sum / global_valid_tokens` (local: `(labels != IGNORE_INDEX).sum()`, a float tensor)."""
    def loss(pred, labels):
        loss_sum = cross_entropy_loss(pred, labels)
        global_valid_tokens = (labels != -100).sum().float()
        return loss_sum / global_valid_tokens
    return loss


def _init_and_cast(m, tdtype):
    """`init_weights()` under `torch.no_grad()` as torchtitan's trainer calls it, then the parameters alone cast to the
    measured dtype, as FSDP2's `param_dtype` casts them: `Module.to(dtype)` would cast the buffers too (complex64
    `freqs_cis` → float32 drops its imaginary part; Qwen3's `rope_cache` stays fp32 in a run). Training mode."""
    with torch.no_grad():
        m.init_weights()
        for prm in m.parameters():
            prm.data = prm.data.to(tdtype)
    m.train()


def build_torchtitan_llama3(seq: int, tdtype):
    titan_model, Args, ce = _torchtitan_llama3()
    from transformers import LlamaConfig
    # job_config training.seq_len sets model_args.max_seq_len (args.py `update_from_config`): freqs_cis is
    # precomputed for exactly the training sequence.
    args = Args(dim=DIM, n_layers=LAYERS, n_heads=HEADS, n_kv_heads=KV_HEADS, vocab_size=VOCAB, max_seq_len=seq,
                rope_theta=500000)
    torch.manual_seed(measure.MODEL_SEED)
    m = titan_model.Transformer(args)
    _init_and_cast(m, tdtype)
    ffn = m.layers["0"].feed_forward.w1.out_features
    cfg = LlamaConfig(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=ffn, vocab_size=VOCAB,
                      rms_norm_eps=args.norm_eps, max_position_embeddings=seq, tie_word_embeddings=False,
                      rope_theta=args.rope_theta)
    cfg.dtype = tdtype
    cfg.architectures = ["LlamaForCausalLM"]
    lm = FrameworkLM(m, titan_loss(ce), cfg, m.output, m.layers)
    return lm


def build_torchtitan_qwen3(seq: int, tdtype):
    """torchtitan's `Qwen3Model`, dense (`moe_enabled=False`), untied, SDPA; `rope_cache` for `training.seq_len`."""
    titan_model, Args, ce = _torchtitan_qwen3()
    from transformers import Qwen3Config
    ffn = 256
    args = Args(dim=DIM, n_layers=LAYERS, n_heads=HEADS, n_kv_heads=KV_HEADS, head_dim=DIM // HEADS,
                hidden_dim=ffn, vocab_size=VOCAB, max_seq_len=seq, rope_theta=1000000, qk_norm=True)
    torch.manual_seed(measure.MODEL_SEED)
    m = titan_model.Qwen3Model(args)
    _init_and_cast(m, tdtype)
    cfg = Qwen3Config(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=ffn, vocab_size=VOCAB,
                      rms_norm_eps=args.norm_eps, max_position_embeddings=seq, tie_word_embeddings=False,
                      rope_theta=args.rope_theta)
    cfg.dtype = tdtype
    cfg.architectures = ["Qwen3ForCausalLM"]
    return FrameworkLM(m, titan_loss(ce), cfg, m.output, m.layers)

def _torchtitan_moe_on_cpu():
    """torchtitan 0.2.2's MoE (models/moe/) as shipped does not run on a CPU, in two places that are kernels, not
    modeling code: `torch.histc` on the int64 expert indices (`TokenChoiceTopKRouter`, `TokenReorderer`: CUDA has
    the kernel, the CPU has none: "histogram_cpu" not implemented for 'Long') runs on a float copy and is cast back
    (the same int64 counts CUDA returns; the copy is a transient `[b·s·top_k]` fp32 nobody saves); and
    `indices_padding_wrapper`'s `generate_permute_indices` (a Triton kernel) runs with `use_cpu=True`, torchtitan's
    own CPU implementation (`fill_indices_cpu`, same indices). `torch._grouped_mm` runs on the CPU as it is."""
    import functools
    if getattr(torch.histc, "_titan_cpu", False):
        return
    histc = torch.histc

    def histc_int(x, *a, **k):
        if x.is_floating_point():
            return histc(x, *a, **k)
        return histc(x.float(), *a, **k).to(x.dtype)
    histc_int._titan_cpu = True
    torch.histc = histc_int
    import torchtitan.models.moe.kernels as kernels
    import torchtitan.models.moe.utils as utils
    utils.generate_permute_indices = functools.partial(kernels.generate_permute_indices, use_cpu=True)


def build_torchtitan_qwen3_moe(seq: int, tdtype):
    """torchtitan's `Qwen3Model` with `moe_enabled=True` (every layer's feed-forward is torchtitan's `MoE`: models/moe/
    moe.py `TokenChoiceTopKRouter`, `TokenReorderer`, `GroupedExperts`), with the MoE args of its Qwen3 30B-A3B preset
    (softmax scores, route_norm, no shared expert, scores applied after the experts: `score_before_experts=False`)
    at 4 experts, top-2, `moe_inter_dim` 40, `use_grouped_mm` as shipped (True), load-balancing buffers as shipped
    (`expert_bias`, `tokens_per_expert`: fp32 `[E]` each per layer); run on the CPU by `_torchtitan_moe_on_cpu`."""
    titan_model, Args, ce = _torchtitan_qwen3()
    _torchtitan_moe_on_cpu()
    from torchtitan.models.moe import MoEArgs
    from transformers import Qwen3MoeConfig
    fe, experts, top_k = 40, 4, 2
    moe_args = MoEArgs(num_experts=experts, num_shared_experts=0, top_k=top_k, score_func="softmax", route_norm=True,
                       route_scale=1.0, score_before_experts=False)
    args = Args(dim=DIM, n_layers=LAYERS, n_heads=HEADS, n_kv_heads=KV_HEADS, head_dim=DIM // HEADS, hidden_dim=256,
                vocab_size=VOCAB, max_seq_len=seq, rope_theta=1000000, qk_norm=True, moe_enabled=True,
                moe_inter_dim=fe, moe_args=moe_args)
    torch.manual_seed(measure.MODEL_SEED)
    m = titan_model.Qwen3Model(args)
    _init_and_cast(m, tdtype)
    cfg = Qwen3MoeConfig(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                         num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=256,
                         moe_intermediate_size=fe, num_experts=experts, num_experts_per_tok=top_k,
                         norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=VOCAB,
                         rms_norm_eps=args.norm_eps, max_position_embeddings=seq, tie_word_embeddings=False,
                         rope_theta=args.rope_theta)
    cfg.dtype = tdtype
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    return FrameworkLM(m, titan_loss(ce), cfg, m.output, m.layers)

def _torchtitan_deepseek_v3():
    """torchtitan.models.deepseek_v3.model.model (0.2.2)."""
    return _torchtitan_bare("deepseek_v3", "DeepSeekV3ModelArgs")


def build_torchtitan_deepseek_v3(seq: int, tdtype):
    """torchtitan's `DeepSeekV3Model` in the shape of its "16B" flavor (the DeepSeek-V2-Lite architecture): MLA without
    a q low-rank (`q_lora_rank=0`: `wq`), `wkv_a` → `kv_norm` → `wkv_b`, a decoupled RoPE head (complex `freqs_cis`,
    no YaRN: `max_seq_len` = the training sequence ≤ `original_seq_len`); the first `n_dense_layers` = 1 layer a dense
    `FeedForward`, the others torchtitan's `MoE` with the flavor's MoE args (softmax scores, no route_norm, scores
    applied after the experts) and one shared expert (`num_shared_experts` × `moe_inter_dim`); `attn_type = "sdpa"`
    (the flavor ships "flex" with a block-causal mask; SDPA is torchtitan's other choice and the one measured here).
    Dims: 4 heads, kv_lora_rank 32, qk_nope 16, qk_rope 8, v_head 16, dense ffn 256, 4 experts of 40, top-2. Run on the
    CPU by `_torchtitan_moe_on_cpu`."""
    titan_model, Args, ce = _torchtitan_deepseek_v3()
    _torchtitan_moe_on_cpu()
    from torchtitan.models.moe import MoEArgs
    from transformers import DeepseekV2Config
    fe, experts, top_k, shared = 40, 4, 2, 1
    kv_rank, nope, rope, vdim, ffn = 32, 16, 8, 16, 256
    moe_args = MoEArgs(num_experts=experts, num_shared_experts=shared, top_k=top_k, score_func="softmax",
                       route_norm=False, route_scale=1.0, score_before_experts=False)
    args = Args(dim=DIM, inter_dim=ffn, moe_inter_dim=fe, n_layers=LAYERS, n_dense_layers=1, n_heads=HEADS,
                vocab_size=VOCAB, max_seq_len=seq, moe_args=moe_args, q_lora_rank=0, kv_lora_rank=kv_rank,
                qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=vdim, attn_type="sdpa",
                attn_mask_type="causal")
    # `update_from_config` (args.py) sets the EP backend from `parallelism.expert_parallel_comm_backend` (default
    # "standard"); its `use_grouped_mm = False` below SM90 is not applied: the grouped GEMM of an H100 run is measured.
    args.moe_impl = "standard"
    torch.manual_seed(measure.MODEL_SEED)
    m = titan_model.DeepSeekV3Model(args)
    _init_and_cast(m, tdtype)
    cfg = DeepseekV2Config(hidden_size=DIM, intermediate_size=ffn, moe_intermediate_size=fe, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, num_key_value_heads=HEADS, n_shared_experts=shared,
                           n_routed_experts=experts, num_experts_per_tok=top_k, first_k_dense_replace=1,
                           moe_layer_freq=1, q_lora_rank=None, kv_lora_rank=kv_rank, qk_nope_head_dim=nope,
                           qk_rope_head_dim=rope, v_head_dim=vdim, topk_method="greedy", norm_topk_prob=False,
                           routed_scaling_factor=1.0, n_group=1, topk_group=1, vocab_size=VOCAB,
                           rms_norm_eps=args.norm_eps, max_position_embeddings=seq, tie_word_embeddings=False,
                           rope_theta=args.rope_theta, rope_scaling=None, attention_bias=False)
    cfg.dtype = tdtype
    cfg.architectures = ["DeepseekV2ForCausalLM"]
    return FrameworkLM(m, titan_loss(ce), cfg, m.output, m.layers)

def build_torchtitan_llama4(seq: int, tdtype):
    """torchtitan's Llama 4 (`models/llama4/model/model.py` `Transformer`) as its 17bx16e / 17bx128e flavors build it:
    Llama 3's attention with RoPE in every layer (`every_n_layers_nope` unset, no q/k norm, no chunked attention: that
    needs flex), `FeedForward` on the dense blocks and torchtitan's `MoE` with the default `MoEArgs` on the others
    (sigmoid scores, top-1, no route_norm, one shared expert, **scores applied before the experts**:
    `score_before_experts=True`), the MoE hidden size auto-scaled (`auto_scale_hidden_dim`: 2/3 of 4·dim over top_k +
    shared, rounded up to `multiple_of`). Here `interleave_moe_layer_step = 2` (17bx128e's: block 0 dense, block 1 MoE),
    4 experts, `multiple_of` 16 (dense hidden 176, expert hidden 96), `attn_type = "sdpa"`. Run on the CPU by
    `_torchtitan_moe_on_cpu`."""
    titan_model, Args, ce = _torchtitan_bare("llama4", "TransformerModelArgs")
    _torchtitan_moe_on_cpu()
    from torchtitan.models.moe import MoEArgs
    from transformers import Llama4TextConfig
    experts, mult = 4, 16
    args = Args(dim=DIM, n_layers=LAYERS, n_heads=HEADS, n_kv_heads=KV_HEADS, vocab_size=VOCAB, multiple_of=mult,
                rope_theta=500000, max_seq_len=seq, moe_args=MoEArgs(num_experts=experts), interleave_moe_layer_step=2,
                attn_type="sdpa")
    torch.manual_seed(measure.MODEL_SEED)
    m = titan_model.Transformer(args)
    _init_and_cast(m, tdtype)
    moe_block = next(b for b in m.layers.values() if b.moe_enabled)
    dense_block = next(b for b in m.layers.values() if not b.moe_enabled)
    fe = moe_block.moe.experts.w1.shape[1]
    ffn = dense_block.feed_forward.w1.out_features
    cfg = Llama4TextConfig(hidden_size=DIM, intermediate_size=fe, intermediate_size_mlp=ffn, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS,
                           num_local_experts=experts, num_experts_per_tok=1, interleave_moe_layer_step=2,
                           moe_layers=[i for i, b in enumerate(m.layers.values()) if b.moe_enabled],
                           no_rope_layers=[1] * LAYERS, use_qk_norm=False, attention_chunk_size=None,
                           attn_temperature_tuning=False, vocab_size=VOCAB, rms_norm_eps=args.norm_eps,
                           max_position_embeddings=seq, tie_word_embeddings=False, rope_theta=args.rope_theta,
                           rope_scaling=None, attention_bias=False)
    cfg.dtype = tdtype
    cfg.architectures = ["Llama4ForCausalLM"]
    return FrameworkLM(m, titan_loss(ce), cfg, m.output, m.layers)

# ------------------------------------------------------------------------------------------------ torchtune 0.6.1

def _torchtune_modules():
    """torchtune 0.6.1's modeling code without the package's import-time baggage: torchtune/__init__.py imports
    torchao (a hard check) and then datasets/generation/models/... (datasets, tiktoken, ...); none of that is the
    Llama 3 model. The packages `torchtune`, `torchtune.models`, `torchtune.models.llama3(_1)` are entered by path
    without their __init__, and `torchao.*` plus `torchtune.modules.low_precision` (NF4 quantization, imported by
    torchtune.modules/__init__ and modules/peft for LoRA/QLoRA only) are permissive stubs: no torchao code runs in a
    full-finetune Llama 3 (validation/README.md)."""
    import importlib.abc
    import importlib.machinery
    import importlib.util

    class _Meta(type):
        def __getattr__(cls, n):
            return _Any

        def __call__(cls, *a, **k):  # decorators (`@implements([...])`) pass the function through
            if len(a) == 1 and callable(a[0]) and not k:
                return a[0]
            return _Any

    class _Any(metaclass=_Meta):
        pass

    class _Stub(types.ModuleType):
        def __getattr__(self, n):
            if n.startswith("__"):
                raise AttributeError(n)
            return _Any

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if REAL_NF4 and name.startswith("torchtune.modules.low_precision"):
                return None
            if name == "torchao" or name.startswith("torchao.") or name.startswith("torchtune.modules.low_precision"):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            m = _Stub(spec.name)
            m.__path__ = []
            return m

        def exec_module(self, module):
            pass

    if "torchtune" not in sys.modules:
        sys.meta_path.insert(0, _Finder())
        root = importlib.util.find_spec("torchtune").submodule_search_locations[0]
        for name in ["torchtune", "torchtune.models"] + [f"torchtune.models.{f}" for f in TUNE_PACKAGES]:
            pkg = types.ModuleType(name)
            pkg.__path__ = [os.path.join(root, *name.split(".")[1:])]
            sys.modules[name] = pkg
    from torchtune.models.llama3_1._component_builders import llama3_1
    from torchtune.modules import TransformerSelfAttentionLayer
    from torchtune.modules.loss import CEWithChunkedOutputLoss
    return llama3_1, TransformerSelfAttentionLayer, CEWithChunkedOutputLoss


# torchtune's QLoRA (validation/measure_torchao_nf4.py) runs torchao's real `NF4Tensor`: set before the first
# `_torchtune_modules()` call, it leaves `torchtune.modules.low_precision` unstubbed (FrozenNF4Linear) and the caller
# aliases `torchao.dtypes.nf4tensor` (torchtune 0.6.1's import path) to torchao 0.18's module.
REAL_NF4 = False

# The model packages whose component builders are measured (entered by path, without their __init__).
TUNE_PACKAGES = ["llama3", "llama3_1", "llama3_2", "llama2", "mistral", "qwen2", "phi3", "gemma", "gemma2"]


class TorchtuneLM(nn.Module):
    """torchtune's `TransformerDecoder` and `full_finetune_single_device.py`'s loss step behind transformers' calling
    convention. `ignore_labels_cache` is the recipe's `torch.full((batch_size, 1), ignore_index)` (a buffer here)."""

    def __init__(self, model, loss_fn, config, layer_cls, batch):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.config = config
        self._layer_cls = layer_cls
        self.register_buffer("ignore_labels_cache", torch.full((batch, 1), loss_fn.ignore_index), persistent=False)

    def get_output_embeddings(self):
        return self.model.output

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        """The recipe's `training.set_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})`
        (training/memory.py: torch's `apply_activation_checkpointing`, `checkpoint_wrapper` defaults: non-reentrant,
        preserve_rng_state=True)."""
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        if gradient_checkpointing_kwargs and gradient_checkpointing_kwargs.get("use_reentrant"):
            raise SystemExit("the frameworks checkpoint non-reentrantly")
        apply_activation_checkpointing(self.model, auto_wrap_policy=ModuleWrapPolicy({self._layer_cls}))

    def forward(self, input_ids, labels=None, use_cache=False):
        """`train()`: `current_num_tokens = (labels != ignore_index).sum()`; `_loss_step`: `logits = model(tokens)`
        (a list of `num_output_chunks` chunks), labels shifted by `hstack((labels[..., 1:], ignore_labels_cache))`,
        `loss = loss_fn(logits, labels)`, `del logits`; then `current_loss = loss * current_num_tokens` is what
        `backward()` runs on (`scale_grads(model, 1 / num_tokens)` before the step is not traced here)."""
        del use_cache
        if labels is None:
            return Output(loss=None, logits=self.model(input_ids))
        current_num_tokens = (labels != self.loss_fn.ignore_index).sum()
        logits = self.model(input_ids)
        shifted = torch.hstack((labels[..., 1:], self.ignore_labels_cache[: labels.shape[0]]))
        if not isinstance(logits, list):
            # A loss other than the chunked one (`loss: torch.nn.CrossEntropyLoss`): the model returned
            # `self.output(h).float()` whole, flattened as the recipe does.
            shifted = shifted.reshape(-1)
            logits = logits.reshape(-1, logits.size(-1))
        loss = self.loss_fn(logits, shifted)
        del logits
        # The harness reads `out.logits`; the recipe keeps none past the loss: an empty tensor stands in (0 bytes).
        return Output(loss=loss * current_num_tokens, logits=torch.empty(0))


def _torchtune_builder(package: str, name: str):
    """A component builder of torchtune 0.6.1 (`torchtune/models/<package>/_component_builders.py`), its package
    entered by path as `_torchtune_modules` does."""
    import importlib
    _torchtune_modules()
    return getattr(importlib.import_module(f"torchtune.models.{package}._component_builders"), name)


def _tune_model(builder, tdtype, **kw):
    """`builder(**kw)` as the recipe instantiates it: under `training.set_default_dtype(dtype)` (parameters in the
    training dtype; RoPE buffers are computed with `.float()` and stay fp32)."""
    torch.manual_seed(measure.MODEL_SEED)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(tdtype)
    try:
        return builder(**kw)
    finally:
        torch.set_default_dtype(prev)


def _tune_lm(m, cfg, tdtype, arch):
    """The model with the recipe's `CEWithChunkedOutputLoss(num_output_chunks=8)`, behind `TorchtuneLM`."""
    _, layer_cls, ce = _torchtune_modules()
    loss_fn = ce(num_output_chunks=8)
    m.set_num_output_chunks(loss_fn.num_output_chunks)
    m.train()
    cfg.dtype = tdtype
    cfg.architectures = [arch]
    return TorchtuneLM(m, loss_fn, cfg, layer_cls, 2)


def build_torchtune_qwen2(seq: int, tdtype):
    """torchtune's `qwen2` builder (Qwen2 and every Qwen2.5: `qwen2_5/_model_builders.py` calls it), tied as its
    0.5B / 1.5B (and Qwen2.5 3B) builders are: q/k/v with biases, `Qwen2RotaryPositionalEmbeddings`, `TiedLinear`."""
    from transformers import Qwen2Config
    del seq
    ffn = 256
    m = _tune_model(_torchtune_builder("qwen2", "qwen2"), tdtype, vocab_size=VOCAB, num_layers=LAYERS, num_heads=HEADS,
                    num_kv_heads=KV_HEADS, embed_dim=DIM, intermediate_dim=ffn, max_seq_len=TUNE_MAX_SEQ,
                    norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=True)
    cfg = Qwen2Config(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, intermediate_size=ffn, vocab_size=VOCAB, rms_norm_eps=1e-6,
                      max_position_embeddings=TUNE_MAX_SEQ, tie_word_embeddings=True, rope_theta=1_000_000.0,
                      use_sliding_window=False)
    return _tune_lm(m, cfg, tdtype, "Qwen2ForCausalLM")


def build_torchtune_mistral(seq: int, tdtype):
    """torchtune's `mistral` builder: Llama's layers with `RotaryPositionalEmbeddings` (no scaling) and no sliding
    window (its `MultiHeadAttention` is plain causal)."""
    from transformers import MistralConfig
    del seq
    ffn = 256
    m = _tune_model(_torchtune_builder("mistral", "mistral"), tdtype, vocab_size=VOCAB, num_layers=LAYERS,
                    num_heads=HEADS, num_kv_heads=KV_HEADS, embed_dim=DIM, intermediate_dim=ffn,
                    max_seq_len=TUNE_MAX_SEQ, norm_eps=1e-5, rope_base=10_000)
    cfg = MistralConfig(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                        num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=ffn, vocab_size=VOCAB,
                        rms_norm_eps=1e-5, max_position_embeddings=TUNE_MAX_SEQ, tie_word_embeddings=False,
                        rope_theta=10_000.0, sliding_window=None)
    return _tune_lm(m, cfg, tdtype, "MistralForCausalLM")


def build_torchtune_llama2(seq: int, tdtype):
    """torchtune's `llama2` builder: `RotaryPositionalEmbeddings` (base 10 000), untied."""
    from transformers import LlamaConfig
    del seq
    ffn = 256
    m = _tune_model(_torchtune_builder("llama2", "llama2"), tdtype, vocab_size=VOCAB, num_layers=LAYERS,
                    num_heads=HEADS, num_kv_heads=KV_HEADS, embed_dim=DIM, intermediate_dim=ffn,
                    max_seq_len=TUNE_MAX_SEQ, norm_eps=1e-5)
    cfg = LlamaConfig(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=ffn, vocab_size=VOCAB,
                      rms_norm_eps=1e-5, max_position_embeddings=TUNE_MAX_SEQ, tie_word_embeddings=False,
                      rope_theta=10_000.0)
    return _tune_lm(m, cfg, tdtype, "LlamaForCausalLM")


def build_torchtune_llama3_2(seq: int, tdtype):
    """torchtune's `llama3_2` builder as its 1B / 3B builders call it: `Llama3ScaledRoPE` (scale 32) and the output
    projection tied to the embedding (`TiedLinear`)."""
    from transformers import LlamaConfig
    del seq
    ffn = 256
    m = _tune_model(_torchtune_builder("llama3_2", "llama3_2"), tdtype, vocab_size=VOCAB, num_layers=LAYERS,
                    num_heads=HEADS, num_kv_heads=KV_HEADS, embed_dim=DIM, intermediate_dim=ffn,
                    max_seq_len=TUNE_MAX_SEQ, rope_base=500_000, scale_factor=32, tie_word_embeddings=True)
    cfg = LlamaConfig(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=ffn, vocab_size=VOCAB,
                      rms_norm_eps=1e-5, max_position_embeddings=TUNE_MAX_SEQ, tie_word_embeddings=True,
                      rope_theta=500000,
                      rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    return _tune_lm(m, cfg, tdtype, "LlamaForCausalLM")


def build_torchtune_phi3(seq: int, tdtype):
    """torchtune's `phi3` builder (Phi-3 mini): q, k, v and gate, up as separate linears (transformers fuses them in
    `qkv_proj` and `gate_up_proj`; torchtune's `phi3_hf_to_tune` splits them), `Phi3RotaryPositionalEmbeddings`
    (rotate-half against the fp32 cache without casting it: the products promote to fp32, `type_as` casts back),
    no sliding window, untied."""
    from transformers import Phi3Config
    del seq
    ffn = 256
    m = _tune_model(_torchtune_builder("phi3", "phi3"), tdtype, vocab_size=VOCAB, num_layers=LAYERS, num_heads=HEADS,
                    num_kv_heads=KV_HEADS, embed_dim=DIM, intermediate_dim=ffn, max_seq_len=TUNE_MAX_SEQ,
                    norm_eps=1e-5, rope_base=10_000)
    cfg = Phi3Config(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                     num_key_value_heads=KV_HEADS, intermediate_size=ffn, vocab_size=VOCAB, rms_norm_eps=1e-5,
                     max_position_embeddings=TUNE_MAX_SEQ, original_max_position_embeddings=TUNE_MAX_SEQ,
                     tie_word_embeddings=False, rope_theta=10_000.0, sliding_window=None, pad_token_id=None,
                     bos_token_id=None, eos_token_id=None)
    return _tune_lm(m, cfg, tdtype, "Phi3ForCausalLM")


def build_torchtune_gemma(seq: int, tdtype):
    """torchtune's `gemma` builder: `GemmaNormEmbeddings` (the embedding times `torch.tensor(√h, dtype=x.dtype)`, a
    fresh 0-dim tensor each forward, not a buffer), `GemmaRMSNorm`, `RotaryPositionalEmbeddings`, GeGLU
    (`nn.GELU(approximate="tanh")`), the output tied (`TiedLinear`)."""
    from transformers import GemmaConfig
    del seq
    ffn = 256
    m = _tune_model(_torchtune_builder("gemma", "gemma"), tdtype, vocab_size=VOCAB, num_layers=LAYERS, num_heads=HEADS,
                    head_dim=DIM // HEADS, num_kv_heads=KV_HEADS, embed_dim=DIM, intermediate_dim=ffn,
                    max_seq_len=TUNE_MAX_SEQ, norm_eps=1e-6, rope_base=10_000)
    cfg = GemmaConfig(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=ffn, vocab_size=VOCAB,
                      rms_norm_eps=1e-6, max_position_embeddings=TUNE_MAX_SEQ, tie_word_embeddings=True,
                      rope_theta=10_000.0, hidden_activation="gelu_pytorch_tanh", pad_token_id=None,
                      bos_token_id=None, eos_token_id=None)
    return _tune_lm(m, cfg, tdtype, "GemmaForCausalLM")


def build_torchtune_gemma2(seq: int, tdtype):
    """torchtune's `gemma2` builder: Gemma's embedding, norms and GeGLU, four `GemmaRMSNorm`s a layer (`sa_scale`,
    `mlp_scale` after attention and MLP), its own eager `Gemma2Attention` (scores soft-capped at 50, the causal mask
    built each forward, a 32-token sliding window on even layers: under the measured 64 tokens), `Gemma2FinalNorm`
    (the final norm soft-capped at 30 before the tied output)."""
    from transformers import Gemma2Config
    del seq
    ffn = 256
    m = _tune_model(_torchtune_builder("gemma2", "gemma2"), tdtype, vocab_size=VOCAB, num_layers=LAYERS,
                    num_heads=HEADS, head_dim=DIM // HEADS, num_kv_heads=KV_HEADS, embed_dim=DIM,
                    intermediate_dim=ffn, max_seq_len=TUNE_MAX_SEQ, norm_eps=1e-6, rope_base=10_000,
                    hidden_capping_value=50.0, final_capping_value=30.0, sliding_window_size=32,
                    query_pre_attn_scalar=DIM // HEADS)
    cfg = Gemma2Config(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                       num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=ffn, vocab_size=VOCAB,
                       rms_norm_eps=1e-6, max_position_embeddings=TUNE_MAX_SEQ, tie_word_embeddings=True,
                       rope_theta=10_000.0, hidden_activation="gelu_pytorch_tanh", sliding_window=32,
                       attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                       query_pre_attn_scalar=DIM // HEADS, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    return _tune_lm(m, cfg, tdtype, "Gemma2ForCausalLM")


# The Llama 3.1 8B config's max_seq_len is 131072; the tiny model's RoPE cache holds 2 × the measured sequence, so
# that the record shows the buffer follows max_seq_len (max_position_embeddings), not the batch's sequence.
TUNE_MAX_SEQ = 128


def build_torchtune_llama3_ce(seq: int, tdtype):
    """torchtune's Llama 3.1 with `loss: torch.nn.CrossEntropyLoss` in place of the configs' chunked loss (the
    recipe's `_loss_step` then flattens the fp32 logits `unembed` returns whole: `self.output(h).float()`). The
    `torchtune-llama3-ce` records."""
    lm = build_torchtune_llama3(seq, tdtype)
    lm.model.set_num_output_chunks(0)
    lm.loss_fn = nn.CrossEntropyLoss(ignore_index=-100)
    return lm


def build_torchtune_llama3(seq: int, tdtype):
    llama3_1, layer_cls, ce = _torchtune_modules()
    from transformers import LlamaConfig
    ffn = 256
    torch.manual_seed(measure.MODEL_SEED)
    # The recipe instantiates the model under `training.set_default_dtype(self._dtype)`: parameters in the training
    # dtype; RoPE's `theta` and `cache` are computed with `.float()` and stay fp32.
    prev = torch.get_default_dtype()
    torch.set_default_dtype(tdtype)
    try:
        m = llama3_1(vocab_size=VOCAB, num_layers=LAYERS, num_heads=HEADS, num_kv_heads=KV_HEADS, embed_dim=DIM,
                     max_seq_len=TUNE_MAX_SEQ, intermediate_dim=ffn, rope_base=500000)
    finally:
        torch.set_default_dtype(prev)
    loss_fn = ce(num_output_chunks=8)
    m.set_num_output_chunks(loss_fn.num_output_chunks)
    m.train()
    cfg = LlamaConfig(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=ffn, vocab_size=VOCAB,
                      rms_norm_eps=1e-5, max_position_embeddings=TUNE_MAX_SEQ, tie_word_embeddings=False,
                      rope_theta=500000,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    cfg.dtype = tdtype
    cfg.architectures = ["LlamaForCausalLM"]
    return TorchtuneLM(m, loss_fn, cfg, layer_cls, 2)


# ------------------------------------------------------------------------------------------------ litgpt 0.5.13

def _litgpt_modules():
    """litgpt 0.5.13's model.py and config.py, and utils.py's `chunked_cross_entropy`, without lightning:
    litgpt/__init__.py imports api.py (lightning), utils.py imports lightning at its top, and model.py imports
    `qkv_reassemble` from scripts/convert_hf_checkpoint.py (lightning again), which only
    `CausalSelfAttention._load_from_state_dict` calls for checkpoints of another layout (never run here). The
    package is entered by path without its __init__, that one module is a stub holding a `qkv_reassemble` that
    raises, and `chunked_cross_entropy` is compiled from utils.py's own source (its function definition alone,
    found with `ast`) in a namespace holding torch. lightning is not installed."""
    import ast
    import importlib.util
    if "litgpt.model" not in sys.modules:
        root = importlib.util.find_spec("litgpt").submodule_search_locations[0]
        for name in ["litgpt", "litgpt.scripts"]:
            pkg = types.ModuleType(name)
            pkg.__path__ = [os.path.join(root, *name.split(".")[1:])]
            sys.modules[name] = pkg
        conv = types.ModuleType("litgpt.scripts.convert_hf_checkpoint")

        def qkv_reassemble(*a, **k):
            raise SystemExit("qkv_reassemble (checkpoint conversion) is not part of the measured step")

        conv.qkv_reassemble = qkv_reassemble
        sys.modules[conv.__name__] = conv
    import litgpt.model as lit_model
    from litgpt.config import Config as LitConfig
    root = os.path.dirname(lit_model.__file__)
    with open(os.path.join(root, "utils.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "chunked_cross_entropy")
    ns = {"torch": torch}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), os.path.join(root, "utils.py"), "exec"), ns)
    return lit_model, LitConfig, ns["chunked_cross_entropy"]


class LitgptLM(nn.Module):
    """litgpt's `GPT` behind Lightning Fabric's `_FabricModule` and `finetune/full.py`'s loss step, behind
    transformers' calling convention. `precision` is Fabric's: "32-true" (fp32), "bf16-true" (HalfPrecision: the
    module converted with `.to(bfloat16)`, the forward under `torch.set_default_dtype(bfloat16)`, no autocast) or
    "bf16-mixed" (MixedPrecision: fp32 parameters, the forward under `torch.autocast(bfloat16)`, which the harness
    enters around the whole call; the loss runs outside it, as in Fabric). Both bf16 precisions convert the
    forward's floating outputs to the default dtype (`convert_output`: the logits `.to(float32)`)."""

    def __init__(self, model, loss_fn, config, block_cls, precision):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.config = config
        self._block_cls = block_cls
        self._precision = precision

    def get_output_embeddings(self):
        return self.model.lm_head

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        """litgpt's activation checkpointing: finetune/full.py and pretrain.py on several devices build
        `FSDPStrategy(activation_checkpointing_policy={Block})`, which Lightning applies with torch's
        `apply_activation_checkpointing` and `checkpoint_wrapper(checkpoint_impl=CheckpointImpl.NO_REENTRANT)` on
        each `Block` (preserve_rng_state=True). Here it is applied on one device, without FSDP."""
        from functools import partial
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
        if gradient_checkpointing_kwargs and gradient_checkpointing_kwargs.get("use_reentrant"):
            raise SystemExit("the frameworks checkpoint non-reentrantly")
        block = self._block_cls
        apply_activation_checkpointing(
            self.model, checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda m: isinstance(m, block))

    def forward(self, input_ids, labels=None, use_cache=False):
        """`_FabricModule.forward` (precision's forward context, then `convert_output`), then full.py's `fit`:
        `loss = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])` (chunk_size 128, the default) and
        `fabric.backward(loss / train.gradient_accumulation_iters(devices, num_nodes))` (one micro batch here: the
        division still runs). full.py's loop keeps `logits` bound until the next iteration's model call; the harness
        drops them after the loss (an empty tensor stands in), see docs/frameworks.md."""
        del use_cache
        if self._precision == "bf16-true":
            prev = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)
            try:
                logits = self.model(input_ids)
            finally:
                torch.set_default_dtype(prev)
        else:
            logits = self.model(input_ids)
        if self._precision != "32-true":
            logits = logits.to(torch.get_default_dtype())
        if labels is None:
            return Output(loss=None, logits=logits)
        with torch.autocast("cpu", enabled=False):
            loss = self.loss_fn(logits[..., :-1, :], labels[..., 1:])
            del logits
            loss = loss / LIT_GRAD_ACCUM
        return Output(loss=loss, logits=torch.empty(0))


# The tiny model's block_size (max_position_embeddings): 2 × the measured sequence. full.py's `fit` sets
# `model.max_seq_length = min(longest_seq_length, train.max_seq_length)`, which rebuilds the RoPE cache (fp32, after
# Fabric's conversion) for that length: the record's longest sequence is the measured one.
LIT_BLOCK_SIZE = 128
LIT_GRAD_ACCUM = 1


def _litgpt_gpt(checkpoint: str, seq: int, precision: str, **overrides):
    """litgpt's `GPT` from `Config.from_name(checkpoint, <the tiny shapes>, **overrides)`, made as Fabric makes it:
    `fabric.init_module()` (HalfPrecision creates the module under its dtype; the RoPE cache is computed with
    `.float()`, fp32), `fabric.setup` (the whole module converted, buffers included: `module.to(dtype)`), then
    full.py's `fit`: `model.max_seq_length = seq` rebuilds cos and sin, fp32, [seq, rope_n_elem]."""
    lit_model, LitConfig, chunked_ce = _litgpt_modules()
    shapes = dict(n_layer=LAYERS, n_embd=DIM, n_head=HEADS, n_query_groups=KV_HEADS, intermediate_size=LIT_FFN,
                  vocab_size=VOCAB, padded_vocab_size=VOCAB, block_size=LIT_BLOCK_SIZE)
    lc = LitConfig.from_name(checkpoint, **dict(shapes, **overrides))
    torch.manual_seed(measure.MODEL_SEED)
    prev = torch.get_default_dtype()
    if precision == "bf16-true":
        torch.set_default_dtype(torch.bfloat16)
    try:
        m = lit_model.GPT(lc)
    finally:
        torch.set_default_dtype(prev)
    if precision == "bf16-true":
        m = m.to(dtype=torch.bfloat16)
    m.max_seq_length = seq
    m.train()
    return lit_model, lc, chunked_ce, m


# The tiny models' MLP width (every litgpt builder).
LIT_FFN = 256


def _litgpt_lm(checkpoint: str, hf_cfg, seq: int, tdtype, precision: str, **overrides):
    """`_litgpt_gpt` behind `LitgptLM`, with `hf_cfg` (the transformers config of the same shapes) as its record's
    config.json."""
    lit_model, lc, chunked_ce, m = _litgpt_gpt(checkpoint, seq, precision, **overrides)
    hf_cfg.dtype = tdtype
    return LitgptLM(m, chunked_ce, hf_cfg, lit_model.Block, precision)


def build_litgpt_llama3(seq: int, tdtype, precision: str):
    from transformers import LlamaConfig
    cfg = LlamaConfig(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=LIT_FFN, vocab_size=VOCAB,
                      rms_norm_eps=1e-5, max_position_embeddings=LIT_BLOCK_SIZE, tie_word_embeddings=False,
                      rope_theta=500000,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    cfg.architectures = ["LlamaForCausalLM"]
    return _litgpt_lm("Llama-3.1-8B", cfg, seq, tdtype, precision)


def build_litgpt_mistral(seq: int, tdtype, precision: str):
    """litgpt's "Mistral-7B-v0.1": Llama's block (LLaMAMLP, RMSNorm, GQA, no biases) with `sliding_window_size=4096`
    on every layer (`sliding_window_indices` defaults to all ones): `CausalSelfAttention` then builds its own
    additive [T, T] window mask in q's dtype each layer and calls SDPA with it (`is_causal=False`)."""
    from transformers import MistralConfig
    cfg = MistralConfig(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                        num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=LIT_FFN,
                        vocab_size=VOCAB, rms_norm_eps=1e-5, max_position_embeddings=LIT_BLOCK_SIZE,
                        tie_word_embeddings=False, rope_theta=10_000.0, sliding_window=4096)
    cfg.architectures = ["MistralForCausalLM"]
    return _litgpt_lm("Mistral-7B-v0.1", cfg, seq, tdtype, precision)


def build_litgpt_qwen2_5(seq: int, tdtype, precision: str):
    """litgpt's "Qwen2.5-7B": Llama's block with `attn_bias=True` (the fused qkv has a bias, proj none); untied."""
    from transformers import Qwen2Config
    cfg = Qwen2Config(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, intermediate_size=LIT_FFN, vocab_size=VOCAB, rms_norm_eps=1e-6,
                      max_position_embeddings=LIT_BLOCK_SIZE, tie_word_embeddings=False, rope_theta=1_000_000.0,
                      use_sliding_window=False)
    cfg.architectures = ["Qwen2ForCausalLM"]
    return _litgpt_lm("Qwen2.5-7B", cfg, seq, tdtype, precision)


def build_litgpt_phi3(seq: int, tdtype, precision: str):
    """litgpt's "Phi-3-mini-4k-instruct": Llama's block (separate fc_1/fc_2, not HF's fused gate_up) with
    `sliding_window_size=2048` on every layer, as Mistral's."""
    from transformers import Phi3Config
    cfg = Phi3Config(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                     num_key_value_heads=KV_HEADS, intermediate_size=LIT_FFN, vocab_size=VOCAB, rms_norm_eps=1e-5,
                     max_position_embeddings=LIT_BLOCK_SIZE, original_max_position_embeddings=LIT_BLOCK_SIZE,
                     tie_word_embeddings=False, rope_theta=10_000.0, sliding_window=2048, pad_token_id=None,
                     bos_token_id=None, eos_token_id=None)
    cfg.architectures = ["Phi3ForCausalLM"]
    return _litgpt_lm("Phi-3-mini-4k-instruct", cfg, seq, tdtype, precision)


def build_litgpt_gemma(seq: int, tdtype, precision: str):
    """litgpt's "Gemma-2b": `scale_embeddings` (x * tensor(√n_embd, x.dtype)), RMSNorm with `add_unit_offset`
    ("Gemma" in the name: `1 + weight`), GemmaMLP (tanh GELU); litgpt never ties: lm_head is its own parameter."""
    from transformers import GemmaConfig
    cfg = GemmaConfig(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=LIT_FFN,
                      vocab_size=VOCAB, rms_norm_eps=1e-5, max_position_embeddings=LIT_BLOCK_SIZE,
                      tie_word_embeddings=False, rope_theta=10_000.0, hidden_activation="gelu_pytorch_tanh",
                      pad_token_id=None, bos_token_id=None, eos_token_id=None)
    cfg.architectures = ["GemmaForCausalLM"]
    return _litgpt_lm("Gemma-2b", cfg, seq, tdtype, precision)


def build_litgpt_gemma2(seq: int, tdtype, precision: str):
    """litgpt's "Gemma-2-2b": Gemma's, with post-attention and post-MLP norms, attention logit softcapping (its eager
    path: `q @ k.mT * scale`, tanh capping, an additive mask, fp32 softmax), a final logit softcapping, and a sliding
    window on the even layers (`sliding_window_indices` cut to the first n_layer: [1, 0]). Window 32 and
    `attention_scores_scalar` = head size, as torchtune's Gemma 2 record."""
    from transformers import Gemma2Config
    cfg = Gemma2Config(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                       num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=LIT_FFN,
                       vocab_size=VOCAB, rms_norm_eps=1e-5, max_position_embeddings=LIT_BLOCK_SIZE,
                       tie_word_embeddings=False, rope_theta=10_000.0, hidden_activation="gelu_pytorch_tanh",
                       sliding_window=32, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                       query_pre_attn_scalar=DIM // HEADS, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    cfg.architectures = ["Gemma2ForCausalLM"]
    return _litgpt_lm("Gemma-2-2b", cfg, seq, tdtype, precision, head_size=DIM // HEADS, sliding_window_size=32,
                      attention_scores_scalar=DIM // HEADS)


def build_litgpt_pythia(seq: int, tdtype, precision: str):
    """litgpt's "pythia-160m": LayerNorm, biases everywhere, GptNeoxMLP (exact GELU), a quarter of each head rotated
    (`rotary_percentage=0.25`), parallel residual with norm_2 of its own; multi-head (no GQA)."""
    from transformers import GPTNeoXConfig
    cfg = GPTNeoXConfig(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=LIT_FFN,
                        vocab_size=VOCAB, layer_norm_eps=1e-5, max_position_embeddings=LIT_BLOCK_SIZE,
                        tie_word_embeddings=False, rotary_pct=0.25, rotary_emb_base=10_000, use_parallel_residual=True,
                        hidden_act="gelu", attention_bias=True, pad_token_id=None, bos_token_id=None,
                        eos_token_id=None)
    cfg.architectures = ["GPTNeoXForCausalLM"]
    return _litgpt_lm("pythia-160m", cfg, seq, tdtype, precision, n_query_groups=HEADS)


def build_litgpt_mixtral(seq: int, tdtype, precision: str):
    """litgpt's "Mixtral-8x7B-v0.1": Llama's block with `LLaMAMoE` (a gate linear, top-2 of 4 experts here, softmax
    over the two in fp32, a Python loop over the experts indexing their tokens)."""
    from transformers import MixtralConfig
    cfg = MixtralConfig(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                        num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS, intermediate_size=LIT_FFN,
                        vocab_size=VOCAB, rms_norm_eps=1e-5, max_position_embeddings=LIT_BLOCK_SIZE,
                        tie_word_embeddings=False, rope_theta=1_000_000.0, num_local_experts=4,
                        num_experts_per_tok=2, sliding_window=None)
    cfg.architectures = ["MixtralForCausalLM"]
    return _litgpt_lm("Mixtral-8x7B-v0.1", cfg, seq, tdtype, precision, n_expert=4, n_expert_per_token=2)


FRAMEWORKS = {
    # (framework, family): (version, builder(seq, torch dtype), attentions it runs)
    ("torchtitan", "llama3"): ("0.2.2", build_torchtitan_llama3, ["sdpa"]),
    ("torchtitan", "qwen3"): ("0.2.2", build_torchtitan_qwen3, ["sdpa"]),
    ("torchtitan", "qwen3_moe"): ("0.2.2", build_torchtitan_qwen3_moe, ["sdpa"]),
    ("torchtitan", "deepseek_v3"): ("0.2.2", build_torchtitan_deepseek_v3, ["sdpa"]),
    ("torchtitan", "llama4"): ("0.2.2", build_torchtitan_llama4, ["sdpa"]),
    ("torchtune", "llama3"): ("0.6.1", build_torchtune_llama3, ["sdpa"]),
    ("torchtune", "llama3-ce"): ("0.6.1", build_torchtune_llama3_ce, ["sdpa"]),
    ("torchtune", "qwen2"): ("0.6.1", build_torchtune_qwen2, ["sdpa"]),
    ("torchtune", "mistral"): ("0.6.1", build_torchtune_mistral, ["sdpa"]),
    ("torchtune", "llama2"): ("0.6.1", build_torchtune_llama2, ["sdpa"]),
    ("torchtune", "llama3_2"): ("0.6.1", build_torchtune_llama3_2, ["sdpa"]),
    ("torchtune", "phi3"): ("0.6.1", build_torchtune_phi3, ["sdpa"]),
    ("torchtune", "gemma"): ("0.6.1", build_torchtune_gemma, ["sdpa"]),
    ("torchtune", "gemma2"): ("0.6.1", build_torchtune_gemma2, ["sdpa"]),
    ("litgpt", "llama3"): ("0.5.13", build_litgpt_llama3, ["sdpa"]),
    ("litgpt", "mistral"): ("0.5.13", build_litgpt_mistral, ["sdpa"]),
    ("litgpt", "qwen2_5"): ("0.5.13", build_litgpt_qwen2_5, ["sdpa"]),
    ("litgpt", "phi3"): ("0.5.13", build_litgpt_phi3, ["sdpa"]),
    ("litgpt", "gemma"): ("0.5.13", build_litgpt_gemma, ["sdpa"]),
    ("litgpt", "gemma2"): ("0.5.13", build_litgpt_gemma2, ["sdpa"]),
    ("litgpt", "pythia"): ("0.5.13", build_litgpt_pythia, ["sdpa"]),
    ("litgpt", "mixtral"): ("0.5.13", build_litgpt_mixtral, ["sdpa"]),
}

# Families measured with torchtitan's own op-level selective checkpointing too (eager: `titan_op_sac`).
OP_SAC = {("torchtitan", fam): ("op",) for fam in ("llama3", "qwen3", "qwen3_moe", "deepseek_v3", "llama4")}

# Fabric's precision for each measured dtype (litgpt's `--precision`).
LIT_PRECISION = {"fp32": "32-true", "bf16": "bf16-true", "amp-bf16": "bf16-mixed"}


# litgpt's loss splits the b·(s-1) shifted rows in chunks of 128: at b = 2, s = 64 one chunk (126 rows); s = 100 gives
# two (128 + 70), the chunked path itself.
EXTRA_SEQS = {"litgpt": [100]}


def specs(only: str | None):
    for (fw, fam), (_, _, attns) in FRAMEWORKS.items():
        for dtype in ("fp32", "bf16", "amp-bf16"):
            for attn in attns:
                for ckpt in (None, "non_reentrant") + OP_SAC.get((fw, fam), ()):
                    s = {"framework": fw, "family": fam, "batch": 2, "seq": 64, "dtype": dtype, "attn": attn,
                         "checkpoint_mode": ckpt, "dropout": 0.0, "extra": False}
                    if only is None or only in f"{fw}-{fam}/{dtype}/{attn}/{ckpt}":
                        yield s
        for seq in EXTRA_SEQS.get(fw, []):
            for dtype in ("fp32", "bf16"):
                s = {"framework": fw, "family": fam, "batch": 2, "seq": seq, "dtype": dtype, "attn": attns[0],
                     "checkpoint_mode": None, "dropout": 0.0, "extra": False}
                if only is None or only in f"{fw}-{fam}/{dtype}/{attns[0]}/None":
                    yield s


def measure_op(spec: dict):
    """A record under torchtitan's op-level SAC (`titan_op_sac`). measure.py's graph walk unpacks every saved
    tensor, which under selective checkpointing runs the recomputation and spends the cache the real backward
    needs ("Trying to backward an extra time"); so the record's model facts come from measure_saved without
    checkpointing, the step is tracked with it (measure_step, the same self-checks), and the saved bytes are what
    the forward left alive beside the model state: `live_after_forward` less the logits (not saved) and the 4 B
    fp32 loss, plus input_ids where the embedding saves them (as `forward_unexplained` balances them for every
    other record; by construction 0 here). No per-tensor list (`saved` is empty)."""
    record, cfg, _, ids_saved = measure.measure_saved(dict(spec, checkpoint_mode=None))
    gc.collect()
    step, log = measure.measure_step(spec, record, ids_saved, want_log=spec.get("log", False))
    logits = 0 if record["logits"]["is_saved"] else record["logits"]["bytes"]
    loss_bytes = 4
    saved = step["live_after_forward"] - logits - loss_bytes + ids_saved
    step["checks"]["forward_unexplained"] = step["live_after_forward"] - (saved - ids_saved + logits + loss_bytes)
    record.update(id=record["id"].replace("/ckpt0", "/ckpt-op"), checkpointing=True, checkpoint_mode="op",
                  saved_bytes=saved, saved=[], saved_method="live_after_forward - logits - loss + input_ids "
                  "(measure_frameworks.py measure_op)", recompute="op", step=step)
    for k in ("saved_storages", "saved_tensors"):
        record.pop(k, None)
    return record, cfg, None, log


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
        tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        if s["framework"] == "litgpt":
            return builder(s["seq"], tdtype, LIT_PRECISION[s["dtype"]])
        lm = builder(s["seq"], tdtype)
        if s["checkpoint_mode"] == "op":
            lm.ac_mode, lm.ac_family = "op", s["family"]
        return lm

    measure.build_model = build_model
    shards: dict[str, dict] = {}
    for spec in specs(args.only):
        t0 = time.time()
        current["spec"] = spec
        fw, fam = spec["framework"], spec["family"]
        name = f"{fw}-{fam}"
        spec = dict(spec, family=name)
        rec, cfg, _, _ = measure_op(spec) if spec["checkpoint_mode"] == "op" else measure.measure(spec)
        cfg = dict(cfg, framework=fw)
        rec["framework"] = fw
        rec["framework_version"] = FRAMEWORKS[(fw, fam)][0]
        if fam.endswith("-ce"):
            rec["loss"] = "torch.nn.CrossEntropyLoss"
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
        # The shard is rewritten after each record: a long run leaves what it measured so far.
        with open(os.path.join(args.out, f"{name}.json"), "w") as f:
            f.write(measure.dump(doc))
        gc.collect()


if __name__ == "__main__":
    main()
