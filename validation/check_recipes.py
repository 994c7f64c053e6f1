#!/usr/bin/env python3
"""Evaluate the recipe rules of FINDINGS.md §15 against the recipe records (tests/fixtures/pytorch/recipes/).

Every recipe is checked as what the estimator will implement: a transformation of the eager step it already models
exactly. The eager anchor of each record is the grid record of the same family/dtype/attention at b2 s64
(tests/fixtures/pytorch/records/, itself matched to the byte by check_formulas.py), or, for compile, the formulas
below. For each record the rule's prediction is compared with the measurement; exit status 1 if any differs.

  compile=layer            saved bytes: per-family formulas of what AOTAutograd's min-cut partitioner keeps per
                           compiled decoder layer + the compiled loss (§15.1); every saved value's producer must be
                           one the rule allows (region input, non-recomputable op, matmul input, small reduction)
  recompute=op[-literal]   saved bytes = eager model ends + per layer: its input + the closure + the outputs of the
                           ops torchtitan's policy saves, predicted from the layer's op list (§15.2)
  recompute_every=2[-hf]   saved bytes = the eager ledger with the checkpointed layers' rows replaced by their
                           input, plus the kwargs their checkpoint closures hold (§15.3)
  optim_in_bwd             no gradient survives backward; forward identical to eager; peak rule (§15.4)
  act_offload=*            which tensors move (size / Parameter / head rules), host bytes = what moved (§15.5)

Usage:  python3 validation/check_recipes.py [-v] [--family NAME] [--recipe NAME] [--table]   (plain Python 3)
        --table   saved bytes / step peak of every b2 s64 record against its eager grid record (markdown)
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RECIPES = os.path.join(ROOT, "tests", "fixtures", "pytorch", "recipes")
GRID = os.path.join(ROOT, "tests", "fixtures", "pytorch", "records")


def load_dir(path):
    recs, cfgs = [], {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".json") and f != "index.json":
            d = json.load(open(os.path.join(path, f)))
            recs.extend(d["records"])
            cfgs.update(d["configs"])
    return recs, cfgs


def recipe_of(rec):
    return rec["id"].split("/", 5)[5]


def is_layer_module(m: str) -> bool:
    """A module pattern inside the decoder layers (the layer index is written `*`: model.layers.*.mlp, transformer.h.*,
    gpt_neox.layers.*, model.decoder.layers.*)."""
    return "*" in m.split(".")


def layer_count(cfg):
    return cfg.get("num_hidden_layers") or cfg.get("n_layer")


def hidden(cfg):
    return cfg.get("hidden_size") or cfg.get("n_embd")


def layer_types(cfg):
    """Attention kind per layer (sliding/full), as the models pick their masks."""
    L = layer_count(cfg)
    lt = cfg.get("layer_types")
    if lt:
        return list(lt)
    return ["full_attention"] * L


# ----------------------------------------------------------------------------------------------------------------------
# the eager ledger of a grid record, split per layer
# ----------------------------------------------------------------------------------------------------------------------

def squeezed(shape) -> tuple:
    """A shape without its size-1 dims."""
    return tuple(n for n in shape if n != 1)


class Ledger:
    """The rows of an eager grid record: model-level rows, position tensors (rows of layer modules whose dtype and size
    are those of the RoPE tables the checkpoint closures hold, with a leading 1 or the same shape less size-1 dims:
    cos/sin, saved once for the model by the first layer that uses them) and per-layer bytes (a row of count c over layers [i, j, ...] gives
    c / len(layers) storages to each)."""

    def __init__(self, rec, ckpt1_rec=None):
        self.model = 0
        self.position = 0
        self.per_layer = defaultdict(float)
        # the RoPE tables: the dtype and bytes of what the checkpoint closures hold as position_embeddings. A layer
        # saves them unsqueezed for the heads, shared by the batch ([1, 1, s, d] of a [1, s, d] table, or a view of
        # it: DeepSeek-V3's interleaved halves [1, 1, s, d/2] of the same storage) or, for Qwen3.5's M-RoPE tables,
        # per batch row ([b, 1, s, d] of [b, s, d]: the same shape without size-1 dims)
        closures = [r for r in (ckpt1_rec or {}).get("saved", [])
                    if r["op"] == "CheckpointClosure" and "position_embeddings" in r["attr"]]
        pos = {(r["dtype"], r["bytes"]) for r in closures}
        pos_shapes = {(r["dtype"], r["bytes"], squeezed(r["shape"])) for r in closures}
        for r in rec["saved"]:
            if not is_layer_module(r["module"]):
                self.model += r["bytes"] * r["count"]
            elif len(r["shape"]) >= 2 and ((r["shape"][0] == 1 and (r["dtype"], r["bytes"]) in pos)
                                           or (r["dtype"], r["bytes"], squeezed(r["shape"])) in pos_shapes):
                self.position += r["bytes"] * r["count"]
            else:
                ls = r.get("layers") or [0]
                for i in ls:
                    self.per_layer[i] += r["bytes"] * r["count"] / len(ls)
        self.total = rec["saved_bytes"]
        assert abs(self.model + self.position + sum(self.per_layer.values()) - self.total) < 1e-6


def closure_rows(ckpt1_rec):
    """The kwargs tensors a checkpointed layer's recompute closure holds (grid ckpt1 record), minus cos/sin (the
    position tensors, counted once with the ledger's `position`)."""
    out = []
    for r in ckpt1_rec["saved"]:
        if r["op"] == "CheckpointClosure" and "position_embeddings" not in r["attr"]:
            out.append(r)
        elif r["op"] == "CheckpointFrame" and r["shape"] and len(r["shape"]) == 4:
            out.append(r)  # gpt2 eager: the additive mask is a positional argument (saved by the frame)
    return out


def closure_bytes(ckpt1_rec, cfg, ckpt_layers):
    """Closure tensors held by the checkpointed layers: position_ids (shared by every layer) and the masks of the
    layer kinds among them (a mask row's first layer tells its kind)."""
    kinds = layer_types(cfg)
    want = {kinds[i] for i in ckpt_layers}
    total = 0
    for r in closure_rows(ckpt1_rec):
        if "attention_mask" in r["attr"] or r["op"] == "CheckpointFrame":
            ls = r.get("layers") or [0]
            # count c over first-use layers: each storage belongs to the kind of its first layer
            per = r["count"] / len(ls)
            for i in ls:
                if kinds[i] in want:
                    total += r["bytes"] * per
        else:
            total += r["bytes"] * r["count"]
    return total


def frame_bytes(rec, cfg):
    p = 4 if rec["dtype"] == "fp32" else 2
    return p * rec["batch"] * rec["seq"] * hidden(cfg)


# ----------------------------------------------------------------------------------------------------------------------
# recompute_every=N
# ----------------------------------------------------------------------------------------------------------------------

def check_every(rec, cfg, g0, g1):
    ck = rec["recipe"]["checkpointed_layers"]
    L = layer_count(cfg)
    N = rec["recipe"]["recompute_every"]
    want = [i for i in range(L) if ((i + 1) % N == 0 if rec["recipe"]["policy"].startswith("torchtitan")
                                    else i % N == 0)]
    problems = []
    if ck != want:
        problems.append(f"checkpointed layers {ck} != rule {want}")
    led = Ledger(g0, g1)
    exp = led.model + led.position + sum(v for i, v in led.per_layer.items() if i not in ck)
    exp += len(ck) * frame_bytes(rec, cfg) + closure_bytes(g1, cfg, ck)
    return exp, problems


# ----------------------------------------------------------------------------------------------------------------------
# recompute=op: torchtitan 0.3.0's SelectiveAC policy
# ----------------------------------------------------------------------------------------------------------------------

# torch/_functorch/partitioners.py get_default_op_list().compute_intensive_ops (torch 2.15), as `.default` overloads
COMPUTE_INTENSIVE = {"mm.default", "convolution.default", "convolution_backward.default", "bmm.default",
                     "addmm.default", "_scaled_dot_product_flash_attention.default",
                     "_scaled_dot_product_efficient_attention.default", "_flash_attention_forward.default",
                     "_efficient_attention_forward.default", "upsample_bilinear2d.default", "_scaled_mm.default"}
# torchtitan/distributed/activation_checkpoint.py (0.3.0) _get_default_save_ops: compute_ops + comm_ops
TORCHTITAN_EXTRA = {"_scaled_dot_product_cudnn_attention.default", "_scaled_dot_product_attention_math.default",
                    "_scaled_dot_product_fused_attention_overrideable.default", "max.default", "linear.default",
                    "topk.default", "_c10d_functional.reduce_scatter_tensor.default",
                    "_c10d_functional.all_to_all_single.default"}
CPU_SDPA = "_scaled_dot_product_flash_attention_for_cpu.default"
MM_OPS = {"mm.default", "linear.default"}


def sac_rule(ops, cpu_sdpa_saved):
    """The policy, applied to one layer's dispatch-level op list: [(op, saved?)] and the cached bytes."""
    save = COMPUTE_INTENSIVE | TORCHTITAN_EXTRA | ({CPU_SDPA} if cpu_sdpa_saved else set())
    n_mm = 0
    out = []
    cached = 0
    for op, _, _, _, outs in ops:
        if op in MM_OPS:
            n_mm += 1  # (no module matches force_recompute_mm_shapes_by_fqns' default "moe.router.gate")
        s = op in save and not (op in MM_OPS and n_mm % 2 == 0)
        out.append(s)
        if s:
            cached += sum(o[0] for o in outs)
    return out, cached


def check_sac(rec, cfg, g0, g1):
    L = layer_count(cfg)
    problems = []
    cached = 0
    for i, ops in enumerate(rec["sac_ops"]):
        dec, c = sac_rule(ops, rec["recipe"]["cpu_sdpa_saved"])
        cached += c
        for (op, saved, _, mod, _), d in zip(ops, dec):
            if saved != d:
                problems.append(f"layer {i} {op} in {mod}: policy saved={saved}, rule {d}")
                break
    if cached != rec["sac_cache_bytes"]:
        problems.append(f"SAC cache {rec['sac_cache_bytes']} != rule {cached}")
    led = Ledger(g0, g1)
    exp = led.model + led.position + L * frame_bytes(rec, cfg) + closure_bytes(g1, cfg, list(range(L))) + cached
    return exp, problems


# ----------------------------------------------------------------------------------------------------------------------
# compile=layer: what the min-cut partitioner saves per compiled decoder layer (+ the compiled loss)
# ----------------------------------------------------------------------------------------------------------------------
#
# The rule (torch/_functorch/partitioners.py at torch 2.15, min_cut_rematerialization_partition with Inductor's
# defaults; FINDINGS.md §15.1): a forward value the backward needs is SAVED when it is
#   (I) an input of the region (the layer's hidden_states, RoPE cos/sin, masks),
#   (B) the output of an op that may not be recomputed: not in get_default_op_list().recomputable_ops (mm, addmm, bmm,
#       SDPA, _grouped_mm, embedding, topk, sort, cumsum, index_put, ...),
#   (M) consumed in the backward by an op that cannot fuse (a matmul or SDPA backward reads it): "materialized in
#       backward" (should_ban_recomputation), e.g. every matmul's and SDPA's input,
#   (R) a reduction whose output is >= 4x smaller than its input (RMSNorm rstd, LayerNorm mean/rstd, softmax max/sum),
# and every other pointwise/view value is recomputed in the backward from those. Among equal-sized cuts the min-cut
# picks one (o_proj's output rather than the residual sum it feeds). Each term below names the case it falls under.

sys.path.insert(0, HERE)
import check_formulas as CFM  # noqa: E402


def C_loss(t, x, cb):
    """torch.compile(ForCausalLMLoss) (transformers/loss/loss_utils.py): (I) the logits it receives (cb x T x V, held
    to the end of its backward instead of the fp32 log-softmax), the padded labels [b, s+1] int64 (the slice is
    recomputed), (R) the row max and log-sum-exp [T,1] fp32, and the fp32 count of valid targets."""
    t.add("(root)", "compiled loss: logits (I)", cb * x.T * x.V)
    t.add("(root)", "compiled loss: padded labels [b,s+1] int64", 8 * x.b * (x.s + 1))
    t.add("(root)", "compiled loss: amax, log-sum-exp (R)", 4 * x.T, 2)
    t.add("(root)", "compiled loss: valid-target count", 4)


def C_llama_layer(t, x, n, *, hb, cb, qk_norm=None, fused_qkv=False, fused_mlp=False, kv_rep=False, mask=0,
                  rope=True, post_norms=False, cos_fp32=False):
    """One llama-like decoder layer (LlamaDecoderLayer and its copies), compiled."""
    T, h, a, k, d, f, b, s = x.T, x.h, x.a, x.k, x.d, x.f, x.b, x.s
    m = "model.layers.*"
    if not post_norms:
        t.add(m, "layer input hidden_states (I)", hb * T * h, n)
    else:  # olmo2: q/k/v read the residual stream directly; the input is saved once as the matmul input (I, M)
        t.add(m, "layer input = q/k/v matmul input (I, M)", hb * T * h, n)
    t.add(m, "RMSNorm rstd [T,1] fp32 x2 (R)", 4 * T, 2 * n)
    if not post_norms:
        t.add(m, "normed input of q/k/v and of gate/up (M)", cb * T * h, 2 * n)
    else:
        t.add(m, "post_attention_layernorm output + residual = MLP input (M)", cb * T * h, n)
    kv = a if kv_rep else k
    if qk_norm == "per_head":  # qwen3: q/k projections feed the norms (B), rstd per head (R)
        t.add(m, "q, k projections (B)", cb * T * (a + k) * d, n)
        t.add(m, "q_norm/k_norm rstd per head (R)", 4 * T * (a + k), n)
    elif qk_norm == "whole":  # olmo2: norms over the whole projections
        t.add(m, "q, k projections (B)", cb * T * (a + k) * d, n)
        t.add(m, "q_norm/k_norm rstd [T,1] (R)", 4 * T, 2 * n)
    if fused_qkv:
        t.add(m, "fused qkv output (B; v is a view of it)", cb * T * (a + 2 * k) * d, n)
    else:
        t.add(m, "v projection (B)", cb * T * kv * d, n)
    t.add(m, "SDPA query after RoPE (M)", cb * T * a * d, n)
    t.add(m, "SDPA key after RoPE (M)" + (" repeated to a heads" if kv_rep else ""), cb * T * kv * d, n)
    if mask:
        t.add(m, "SDPA mask converted to the query dtype [b,1,s,s] (M)", cb * b * s * s, n)
    t.add(m, "SDPA output (B, M: o_proj input)", cb * T * a * d, n)
    t.add(m, "SDPA logsumexp fp32 (B)", 4 * b * a * s, n)
    t.add(m, "o_proj output (B; the residual sum is recomputed from it)", cb * T * h, n)
    if fused_mlp:
        t.add(m, "gate_up output (B)", 2 * cb * T * f, n)
    else:
        t.add(m, "gate, up outputs (B)", cb * T * f, 2 * n)
    t.add(m, "act(gate)*up = down_proj input (M)", cb * T * f, n)
    if post_norms:
        t.add(m, "down_proj output (B; post_feedforward norm input)", cb * T * h, n)


def C_rms_llama(t, x, mod, hb):
    t.add(mod, "final norm (eager) rms_llama", 4 * x.T * x.h + 4 * x.T + hb * x.T * x.h)


def C_llama_like(rec, x, **kw):
    t = CFM.Terms()
    p = x.p
    mt = x.mt
    L = x.L
    t.add("model.embed_tokens", "input_ids (embedding)", 8 * x.T)
    r = int(x.d * x.prf)
    cosb = 4 if mt == "olmo2" else p
    t.add("model.layers.*", "RoPE cos/sin (I, once)", 2 * cosb * x.s * r)
    mask_layers = 0
    kv_rep = False
    if mt == "mistral" and x.s > x.cfg["sliding_window"]:
        mask_layers, kv_rep = L, True
    C_llama_layer(t, x, L, hb=p, cb=p, kv_rep=kv_rep, mask=mask_layers, **kw)
    if mt == "olmo2":
        t.add("model.norm", "final norm (eager) rms_olmo2", 8 * x.T * x.h + 4 * x.T)
    else:
        C_rms_llama(t, x, "model.norm", p)
    t.add("lm_head", "lm_head input (eager)", p * x.T * x.h)
    C_loss(t, x, p)
    return t


def C_gemma2(rec, x):
    """Gemma2DecoderLayer compiled (eager attention with soft-capping; 4 norms; GeGLU)."""
    t = CFM.Terms()
    T, h, a, k, d, f, b, s, p = x.T, x.h, x.a, x.k, x.d, x.f, x.b, x.s, x.p
    L, m = x.L, "model.layers.*"
    t.add("model.embed_tokens", "input_ids", 8 * T)
    t.add(m, "RoPE cos/sin (I, once)", 2 * p * s * d)
    t.add(m, "layer input (I)", p * T * h, L)
    t.add(m, "rstd of the 4 norms (R)", 4 * T, 4 * L)
    t.add(m, "normed input of q/k/v and of gate/up (M)", p * T * h, 2 * L)
    t.add(m, "q (M: scores bmm input), k and v repeated to a heads (M)", p * T * a * d, 3 * L)
    t.add(m, "scores bmm output (B)", p * b * a * s * s, L)
    if p == 4:
        t.add(m, "scaled scores (tanh input; tanh, mask, softmax recomputed)", 4 * b * a * s * s, L)
    else:
        t.add(m, "softmax max and sum [b,a,s,1] fp32 (R)", 4 * b * a * s, 2 * L)
        t.add(m, "probs cast to bf16 (M: probs@v input)", 2 * b * a * s * s, L)
    if not x.cfg.get("final_logit_softcapping"):
        pass
    t.add(m, "attention output transposed = o_proj input (M)", p * T * a * d, L)
    t.add(m, "o_proj output (B: post_attention_layernorm input)", p * T * h, L)
    t.add(m, "gate, up outputs (B), act(gate)*up (M)", p * T * f, 3 * L)
    t.add(m, "down_proj output (B: post_feedforward_layernorm input)", p * T * h, L)
    if p == 2:
        t.add(m, "the mask (I), additive [b,1,s,s] in bf16 (one per layer kind)", p * b * s * s, L)
    t.add("model.norm", "final norm (eager) rms_gemma", 8 * T * h + 4 * T + 4 * h)
    t.add("lm_head", "lm_head input (eager)", p * T * h)
    t.add("(root)", "final soft-capping (eager): tanh result + two float64 scalars", p * T * x.V + 16)
    C_loss(t, x, p)
    return t


def C_gpt2(rec, x):
    """GPT2Block compiled (Conv1D = addmm, LayerNorm, gelu_new, sdpa)."""
    t = CFM.Terms()
    T, h, a, f, b, s, p = x.T, x.h, x.a, x.f, x.b, x.s, x.p
    L, m = x.L, "transformer.h.*"
    t.add("transformer.wte", "input_ids", 8 * T)
    t.add("transformer.wpe", "position_ids [1,s]", 8 * s)
    t.add(m, "layer input (I)", p * T * h, L)
    t.add(m, "LayerNorm mean, rstd x2 (R; in the input dtype on CPU)", p * T, 4 * L)
    t.add(m, "fused c_attn output (B; q/k/v are views of it)", p * T * 3 * h, L)
    t.add(m, "SDPA output (B, M)", p * T * h, L)
    t.add(m, "SDPA logsumexp fp32 (B)", 4 * b * a * s, L)
    t.add(m, "attn c_proj output (B; residual recomputed)", p * T * h, L)
    t.add(m, "c_fc output (B)", p * T * f, L)
    t.add(m, "gelu_new output = mlp c_proj input (M)", p * T * f, L)
    t.add(m, "ln_1, ln_2 outputs = c_attn, c_fc inputs (M)", p * T * h, 2 * L)
    t.add("transformer.ln_f", "final LayerNorm (eager): input + mean/rstd", p * T * h + 2 * p * T)
    t.add("lm_head", "lm_head input (eager)", p * T * h)
    C_loss(t, x, p)
    return t


def C_experts(t, x, m, n, cb, *, bias=False):
    """transformers/integrations/moe.py grouped_mm_experts_forward, compiled: the sort permutation, perm // K and
    the inverse permutation [S] int64 (B: sort/index_put), the per-expert offsets [E] int32 (B: cumsum), the gathered
    input [S,h] (B: index; M: grouped_mm input), gate_up [S,2fe] (B), act(gate)*up [S,fe] (M), the down output [S,h]
    (B; the routing-weight multiply's input). gpt_oss (biases, clamped SwiGLU): a second int64 [S] index and the
    bias adds' outputs in place of the grouped_mm outputs (same sizes)."""
    S, h, fe, E = x.T * x.K, x.h, x.fe or x.f, x.E
    t.add(m, "expert permutation, perm//K, inverse [S] int64 (B)", 8 * S, (4 if bias else 3) * n)
    t.add(m, "expert offsets [E] int32 (B)", 4 * E, n)
    t.add(m, "gathered input [S,h] (B, M)", cb * S * h, n)
    t.add(m, "gate_up [S,2fe] (B)", cb * S * 2 * fe, n)
    t.add(m, "act(gate)*up [S,fe] (M)", cb * S * fe, n)
    t.add(m, "down output [S,h] (B)", cb * S * h, n)


def C_mixtral_like(rec, x, qk_norm=None):
    """mixtral (every layer MoE) / qwen3_moe (layer 0 dense, mlp_only_layers): llama attention + softmax router
    (router logits (B: mm), top-k values fp32 and indices (B: topk)) + grouped_mm experts."""
    t = CFM.Terms()
    p, T, h, a, k, d, E, K = x.p, x.T, x.h, x.a, x.k, x.d, x.E, x.K
    m = "model.layers.*"
    t.add("model.embed_tokens", "input_ids", 8 * T)
    t.add(m, "RoPE cos/sin (I, once)", 2 * p * x.s * d)
    dense = x.cfg.get("mlp_only_layers") or []
    n_moe = x.L - len(dense)
    # attention part of every layer: C_llama_layer without the MLP, then the MLP kinds
    tt = CFM.Terms()
    C_llama_layer(tt, x, x.L, hb=p, cb=p, qk_norm=qk_norm)
    for mod, what, b, n in tt.items:
        if what.startswith(("gate, up", "act(gate)")):
            t.add(mod, what + " (dense layers)", b, n * len(dense) // x.L)
        else:
            t.add(mod, what, b, n)
    t.add(m, "router logits [T,E] (B: mm)", p * T * E, n_moe)
    t.add(m, "top-k values fp32 [T,K] (B: topk)", 4 * T * K, n_moe)
    t.add(m, "top-k indices int64 [T,K] (B: topk)", 8 * T * K, n_moe)
    C_experts(t, x, m, n_moe, p)
    C_rms_llama(t, x, "model.norm", p)
    t.add("lm_head", "lm_head input (eager)", p * T * h)
    C_loss(t, x, p)
    return t


def C_deepseek_v3(rec, x):
    """DeepseekV3DecoderLayer compiled: MLA (q_lora, kv_lora, interleaved RoPE) through CPU math SDPA (dq != dv: the
    math path upcasts q, k, v to fp32 and keeps fp32 probabilities), layer 0 dense, layer 1 MoE with the fp32 sigmoid
    router (F.linear(x.float(), w.float())), grouped_mm experts and one shared expert."""
    t = CFM.Terms()
    g = x.cfg
    p, T, h, a, b, s = x.p, x.T, x.h, x.a, x.b, x.s
    ql, r, dr, dn, dv = g["q_lora_rank"], g["kv_lora_rank"], g["qk_rope_head_dim"], g["qk_nope_head_dim"], \
        g["v_head_dim"]
    dq = dn + dr
    L, m = x.L, "model.layers.*"
    n_dense = g.get("first_k_dense_replace", 0)
    n_moe = L - n_dense
    t.add("model.embed_tokens", "input_ids", 8 * T)
    t.add(m, "RoPE cos/sin [1,s,dr] (I, once)", 2 * p * s * dr)
    t.add(m, "layer input (I)", p * T * h, L)
    t.add(m, "rstd of input, q_a, kv_a, post-attention norms (R)", 4 * T, 4 * L)
    t.add(m, "normed input of q_a/kv_a (M)", p * T * h, L)
    t.add(m, "q_a_proj output (B)", p * T * ql, L)
    t.add(m, "q_a_layernorm output = q_b_proj input (M)", p * T * ql, L)
    t.add(m, "kv_a_proj output [T, r+dr] (B)", p * T * (r + dr), L)
    t.add(m, "kv_a_layernorm output = kv_b_proj input (M)", p * T * r, L)
    t.add(m, "math SDPA: probabilities fp32 [b,a,s,s] (M)", 4 * b * a * s * s, L)
    t.add(m, "math SDPA: v fp32 (M)", 4 * T * a * dv, L)
    t.add(m, "math SDPA: scaled q and k fp32 (M)", 4 * T * a * dq, 2 * L)
    t.add(m, "attention output = o_proj input (M)", p * T * a * dv, L)
    t.add(m, "o_proj output (B)", p * T * h, L)
    t.add(m, "post-attention normed = MLP input (M)", p * T * h, L)
    t.add(m, "dense MLP gate, up (B), act*up (M)", p * T * x.f, 3 * n_dense)
    t.add(m, "router input fp32 copy (bf16 models; M)", 4 * T * h if p == 2 else 0, n_moe)
    t.add(m, "router logits fp32 [T,E] (B: mm)", 4 * T * x.E, n_moe)
    t.add(m, "top-k indices int64 (B) + gathered weights fp32 (B: gather of the sigmoid scores)",
          8 * T * x.K + 4 * T * x.K, n_moe)
    C_experts(t, x, m, n_moe, p)
    fs = x.fe * g.get("n_shared_experts", 1)
    t.add(m, "shared expert gate, up (B), act*up (M)", p * T * fs, 3 * n_moe)
    C_rms_llama(t, x, "model.norm", p)
    t.add("lm_head", "lm_head input (eager)", p * T * h)
    C_loss(t, x, p)
    return t


def C_gpt_oss(rec, x):
    """GptOssDecoderLayer compiled (eager attention with sinks, every layer MoE, experts with biases)."""
    t = CFM.Terms()
    p, T, h, a, d, b, s, K = x.p, x.T, x.h, x.a, x.d, x.b, x.s, x.K
    L, m = x.L, "model.layers.*"
    S = T * K
    t.add("model.embed_tokens", "input_ids", 8 * T)
    t.add(m, "RoPE cos/sin [1,s,d/2] (I, once)", 2 * p * s * (d // 2))
    t.add(m, "layer input (I)", p * T * h, L)
    t.add(m, "rstd x2 (R)", 4 * T, 2 * L)
    t.add(m, "normed input of q/k/v and of the router/experts (M)", p * T * h, 2 * L)
    t.add(m, "q, k and v repeated to a heads (M: bmm inputs)", p * T * a * d, 3 * L)
    t.add(m, "max over [scores, sinks]: indices int64 [b,a,s,1] (B)", 8 * b * a * s, L)
    t.add(m, "probabilities over s+1 columns [b,a,s,s+1] (fp32: the scaled scores; bf16: the bf16 probs) (M)",
          p * b * a * s * (s + 1), L)
    t.add(m, "attention output = o_proj input (M)", p * T * a * d, L)
    t.add(m, "o_proj output (B: addmm)", p * T * h, L)
    t.add(m, "top-k indices int64 [T,K] (B)", 8 * T * K, L)
    t.add(m, "routing weights [T,K] (softmax of the top-k values, model dtype)", p * T * K, L)
    C_experts(t, x, m, L, p, bias=True)
    t.add("model.norm", "final norm (eager) rms_olmo2", 8 * T * h + 4 * T)
    t.add("lm_head", "lm_head input (eager)", p * T * h)
    C_loss(t, x, p)
    return t


COMPILE_FORMULAS = {
    "mixtral": lambda r, x: C_mixtral_like(r, x),
    "qwen3_moe": lambda r, x: C_mixtral_like(r, x, qk_norm="per_head"),
    "deepseek_v3": C_deepseek_v3,
    "gpt_oss": C_gpt_oss,
    "llama-gqa": lambda r, x: C_llama_like(r, x),
    "llama-mha": lambda r, x: C_llama_like(r, x),
    "qwen2": lambda r, x: C_llama_like(r, x),
    "mistral": lambda r, x: C_llama_like(r, x),
    "qwen3": lambda r, x: C_llama_like(r, x, qk_norm="per_head"),
    "phi3": lambda r, x: C_llama_like(r, x, fused_qkv=True, fused_mlp=True),
    "olmo2": lambda r, x: C_llama_like(r, x, qk_norm="whole", post_norms=True),
    "gemma2": C_gemma2,
    "gpt2": C_gpt2,
}


# ops whose outputs torchtitan's SAC policy may tag MUST_SAVE, as the compiled forward names them (the SDPA kernel's
# outputs come out through `getitem`)
SAC_SAVED_PRODUCERS = ("mm", "addmm", "bmm", "getitem", "topk", "max", "convolution")


def check_compile_ckpt(rec, compiled):
    """compile=layer+recompute=full|op (FINDINGS §15.1): the checkpoint's tags fix the cut. Every value a compiled
    layer keeps is a region input (full), or a region input or the output of an op the policy saves (op); and the
    model's ends are those of the plain compile=layer record at the same shape, so
    saved = compile=layer's saved − its layers' rows + this record's layers' rows."""
    full = rec["id"].endswith("recompute=full")
    problems = []

    def layer_rows(r):
        return [row for row in r["saved"] if row.get("op") == "CompiledFunctionBackward" and row["module"] != "(root)"]
    for row in layer_rows(rec):
        ok = row.get("producer") == "input" or (not full and row.get("producer", "").split("/")[0] in SAC_SAVED_PRODUCERS)
        if not ok:
            problems.append(f"{row['module']} keeps a {row.get('producer')} output {row['shape']}")
    if compiled is None:
        return None, problems  # (the deep variants: no plain compile=layer record)
    mine = sum(row["bytes"] * row.get("count", 1) for row in layer_rows(rec))
    theirs = sum(row["bytes"] * row.get("count", 1) for row in layer_rows(compiled))
    return compiled["saved_bytes"] - theirs + mine, problems


def check_compile(rec, cfg):
    fn = COMPILE_FORMULAS.get(rec["family"])
    if fn is None:
        return None, []
    x = CFM.Dims({**rec, "checkpointing": False, "dropout": 0.0}, cfg)
    t = fn(rec, x)
    problems = []
    return t.total(), problems


# ----------------------------------------------------------------------------------------------------------------------
# optim_in_bwd and activation offloading
# ----------------------------------------------------------------------------------------------------------------------

def check_optim_in_bwd(rec, g0):
    st = rec["step"]
    problems = []
    if st["live_after_backward"] != 0:
        problems.append(f"{st['live_after_backward']} B alive after backward (every gradient must be freed by its hook)")
    if "optimizer" in st["peak_of_phase"]:
        problems.append("an optimizer phase exists")
    if g0 is not None and st["live_after_forward"] != g0["step"]["live_after_forward"]:
        problems.append("forward differs from the eager grid record")
    plain = rec.get("plain_adamw_step") or (g0 and g0["step"])
    if plain is not None and st["measured_peak_bytes"] > plain["measured_peak_bytes"]:
        problems.append("peak above the plain AdamW step")
    # the forward/loss part of the step is the plain step's: the peak can only differ after backward starts
    if plain is not None and st["peak_of_phase"].get("loss") != plain["peak_of_phase"].get("loss"):
        problems.append("loss-phase peak differs from the plain step")
    return problems


def offload_rule(row, kind):
    """torchtune OffloadActivations.pack_tensor: move iff numel*element_size >= 1024 and the packed tensor is not an
    nn.Parameter/nn.Buffer instance (a weight's t() view is neither: it moves), outside the output head (NoOpManager
    around lm_head). save_on_cpu: every packed tensor moves."""
    if kind == "save_on_cpu":
        return "offloaded"
    if row["module"] == "lm_head" or row["module"].startswith("lm_head."):
        return None  # under the NoOpManager: not packed by OffloadActivations at all
    if row["bytes"] < 1024:
        return "kept: < min_offload_size"
    if row["producer"] == "parameter":
        return "kept: Parameter/Buffer"
    return "offloaded"


def check_offload(rec, cfg):
    kind = rec["recipe"]["act_offload"]
    st = rec["step"]
    problems = []
    moved = 0
    for r in rec["packed"]:
        want = offload_rule(r, kind)
        if want is None:
            problems.append(f"packed inside the output head: {r}")
        elif r["decision"] != want:
            problems.append(f"{r['module']} {r['producer']} {r['bytes']} B: {r['decision']} != rule {want}")
        if r["decision"] == "offloaded":
            moved += r["bytes"] * r["count"]
    copied = st.get("host_bytes_copied_in_forward", st["host_bytes_after_forward"])
    if moved != copied:
        problems.append(f"host bytes copied {copied} != moved {moved}")
    if st["host_bytes_after_forward"] > copied:
        problems.append("more host bytes alive than copied")
    if kind == "save_on_cpu":
        # everything moved: the device keeps only the output (logits, unless the loss saved them) and the loss
        p = 4 if rec["dtype"] == "fp32" else 2
        logits = p * rec["batch"] * rec["seq"] * cfg["vocab_size"]
        if st["live_after_forward"] != logits + 4:
            problems.append(f"device bytes after forward {st['live_after_forward']} != logits + loss {logits + 4}")
        if st["h2d_copies"] > rec["packs"]:
            problems.append("a packed tensor came back more than once")
        if st["h2d_copies"] < rec["packs"] and st.get("host_bytes_after_forward") == copied:
            problems.append("tensors never unpacked but their host copies were not freed (no dead subgraph)")
    # torchtune's pack_tensor stores a kept tensor itself in its tracker (`self.tracker[id] = (activation, False)`):
    # the kept ones of a dead subgraph (packed, never unpacked: Qwen3-Next/Qwen3.5's gated-delta chunk decays) stay
    # on the device after backward, beside the gradients
    dead_kept = sum(e["bytes"] for e in st.get("never_unpacked") or [] if e["decision"].startswith("kept"))
    if st["live_after_backward"] != rec["parameter_bytes"] + dead_kept:
        problems.append(f"after backward {st['live_after_backward']} B != gradients {rec['parameter_bytes']} B + "
                        f"kept tensors of a dead subgraph {dead_kept} B")
    return problems


def check_paged8bit(rec):
    """bitsandbytes 0.50.2 Optimizer2State.init_state (optim_bits 8, min_8bit_size 4096, blocksize 256): per parameter
    of n elements, n < 4096: fp32 state1 + state2 (8n B); else uint8 state1 + state2 (2n B) + fp32 absmax1 + absmax2
    [ceil(n/256)] (8·ceil(n/256) B); plus the two 256-entry fp32 quantization maps, shared (2 KiB)."""
    problems = []
    exp = 0
    any8 = False
    for n in rec["parameter_numels"]:
        if n < 4096:
            exp += 8 * n
        else:
            any8 = True
            exp += 2 * n + 8 * ((n + 255) // 256)
    exp += 2 * 256 * 4 if any8 else 0
    got = sum(rec["optimizer_state_bytes_by_key"].values())
    if got != exp:
        problems.append(f"state bytes {got} != rule {exp}")
    if rec["step"]["optimizer_state_bytes"] != got:
        problems.append("tracker's optimizer state != the optimizer's")
    paged = sum(2 * n for n in rec["parameter_numels"] if n >= 100000)
    if rec["state_bytes_paged_on_cuda"] != paged:
        problems.append("paged bytes != 2n over parameters of >= 1e5 elements")
    return problems


# ----------------------------------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------------------------------

def table(recs, gid):
    """Markdown: saved bytes and step peak of every recipe record as a change against the eager grid record."""
    cols = ["compile=layer", "recompute=op", "recompute=op-literal", "recompute_every=2", "recompute_every=2-hf",
            "optim_in_bwd", "act_offload=torchtune", "act_offload=save_on_cpu", "optim=paged_adamw8bit"]
    by = defaultdict(dict)
    for r in recs:
        if r["seq"] == 64:
            by[(r["family"], r["dtype"], r["attn"])][recipe_of(r)] = r
    print("| family | dtype | eager saved / peak (B) | " + " | ".join(cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for (fam, dt, attn), rs in sorted(by.items()):
        g = gid.get(f"{fam}/b2/s64/{dt}/{attn}/ckpt0")
        if g is None:
            continue
        gs, gp = g["saved_bytes"], g["step"]["measured_peak_bytes"]
        cells = []
        for c in cols:
            r = rs.get(c)
            if r is None:
                cells.append("")
                continue
            sv = r.get("saved_bytes")
            pk = r["step"]["measured_peak_bytes"]
            a = "=" if sv == gs else f"{100 * (sv - gs) / gs:+.0f}%"
            cells.append(f"{a} / {100 * (pk - gp) / gp:+.1f}%")
        print(f"| {fam} | {dt} | {gs} / {gp} | " + " | ".join(cells) + " |")


def main():
    args = sys.argv[1:]
    verbose = "-v" in args
    fam = args[args.index("--family") + 1] if "--family" in args else None
    only = args[args.index("--recipe") + 1] if "--recipe" in args else None
    recs, cfgs = load_dir(RECIPES)
    grid, gcfgs = load_dir(GRID)
    gid = {r["id"]: r for r in grid}
    rid_map = {r["id"]: r for r in recs}
    if "--table" in args:
        table(recs, gid)
        return
    stats = defaultdict(lambda: [0, 0])
    bad = 0
    for rec in recs:
        if fam and rec["family"] != fam:
            continue
        rcp = recipe_of(rec)
        if only and not rcp.startswith(only):
            continue
        cfg = cfgs[rec["config_key"]]
        base = f"{rec['family']}/b{rec['batch']}/s{rec['seq']}/{rec['dtype']}/{rec['attn']}"
        g0 = gid.get(base + "/ckpt0") or rid_map.get(base + "/eager")
        g1 = gid.get(base + "/ckpt1") or rid_map.get(base + "/recompute=full")
        if rcp in ("eager", "recompute=full"):
            continue  # the deep variants' anchors (measure.py's own records; check_formulas' domain)
        problems = []
        exp = None
        if rcp.startswith("recompute_every"):
            exp, problems = check_every(rec, cfg, g0, g1)
        elif rcp == "optim=paged_adamw8bit":
            problems = check_paged8bit(rec) if "parameter_numels" in rec else ["no parameter_numels: rule unchecked"]
        elif rcp.startswith("optim_in_bwd"):
            problems = check_optim_in_bwd(rec, g0)
        elif rcp.startswith("act_offload"):
            problems = check_offload(rec, cfg)
        elif rcp.startswith("compile=layer+recompute"):
            exp, problems = check_compile_ckpt(rec, rid_map.get(base + "/compile=layer"))
        elif rcp.startswith("compile"):
            exp, problems = check_compile(rec, cfg)
            if exp is None:
                continue
        elif rcp.startswith("recompute=op"):
            if "sac_ops" in rec:
                exp, problems = check_sac(rec, cfg, g0, g1)
            else:
                problems = ["no sac_ops: rule unchecked"]
        else:
            continue
        key = (rcp, rec["family"])
        stats[key][0] += 1
        if exp is not None and exp != rec["saved_bytes"]:
            problems.append(f"saved {rec['saved_bytes']} != rule {exp:.0f} ({rec['saved_bytes'] - exp:+.0f})")
        if problems:
            stats[key][1] += 1
            bad += 1
            if verbose:
                print(f"  {rec['id']}: " + "; ".join(problems))
    by_recipe = defaultdict(list)
    for (rcp, f), (n, nb) in sorted(stats.items()):
        by_recipe[rcp].append((f, n, nb))
    total = 0
    for rcp, rows in by_recipe.items():
        n = sum(r[1] for r in rows)
        nb = sum(r[2] for r in rows)
        total += n
        print(f"{rcp:24s} {n:4d} records, {nb} off   " + ", ".join(f"{f}{'' if not b else f' ({b} off)'}"
                                                             for f, _, b in rows))
    print(f"{total} records checked, {bad} off")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
