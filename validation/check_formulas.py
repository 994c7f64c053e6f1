#!/usr/bin/env python3
"""Evaluate the saved-tensor formulas of FINDINGS.md against the measured records (tests/fixtures/pytorch/records/).

For every record, the formulas give a list of terms (module pattern, description, bytes, multiplicity). The checker
compares

* the total with the measured `saved_bytes` (this is what must be exact), and
* the per-module-pattern sums with the measured rows (a diagnostic: it tells which term is wrong when a total is off).

It prints, per family (main grid and extras separately), the number of records, the max relative error of the total,
and the number of records whose per-module breakdown differs. Exit status 1 if any total is off.

Usage:  python3 validation/check_formulas.py [records-dir-or-shard] [-v] [--explain RECORD_ID] [--family NAME]
        -v                 print every record whose total or per-module breakdown differs
        --explain ID       print the formula terms and the measured rows of one record
        --family NAME      only this family
(plain Python 3, no torch needed)

Every family function below cites the transformers 5.24 modeling file and function each term comes from
(`transformers/models/<type>/modeling_<type>.py`, `Class.forward` / `function`). Symbols: see FINDINGS.md.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "pytorch", "records")

F32, BF16, I64, I32, BOOL = 4, 2, 8, 4, 1


def load(path):
    """All records of a records directory (one shard per family) or of one shard file, with their configs."""
    if os.path.isdir(path):
        files = [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".json") and f != "index.json"]
    else:
        files = [path]
    doc = {"configs": {}, "records": []}
    for f in files:
        d = json.load(open(f))
        doc["configs"].update(d["configs"])
        doc["records"].extend(d["records"])
    return doc


class Dims:
    """Symbols of FINDINGS.md, read from the record and its config.json."""

    def __init__(self, rec, cfg):
        self.cfg = cfg
        self.b, self.s = rec["batch"], rec["seq"]
        self.T = self.b * self.s
        mt = self.mt = cfg["model_type"]
        g = cfg.get
        if mt == "gpt2":
            self.h, self.a, self.L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
            self.k = self.a
            self.f = cfg["n_inner"] or 4 * self.h
        else:
            self.h, self.a, self.L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
            self.k = g("num_key_value_heads") or g("num_kv_heads") or self.a
            self.f = g("intermediate_size") or g("ffn_dim") or g("ffn_hidden_size")
        if mt == "falcon":
            self.k = 1 if (g("multi_query") and not g("new_decoder_architecture")) else g("num_kv_heads")
        self.d = g("head_dim") or self.h // self.a
        if mt in ("deepseek_v2", "deepseek_v3", "deepseek_v32"):
            self.d = None  # MLA: see qk_nope/qk_rope/v_head_dim
        self.V = cfg["vocab_size"]
        rp = g("rope_parameters") or {}
        if isinstance(rp, dict) and "partial_rotary_factor" in rp:
            self.prf = rp["partial_rotary_factor"]
        else:
            self.prf = g("partial_rotary_factor") or 1.0
        # MoE symbols
        self.E = g("num_local_experts") or g("n_routed_experts") or g("num_experts")
        self.K = g("num_experts_per_tok") or g("num_experts_per_token")  # kimi_linear spells it ..._token
        self.fe = g("moe_intermediate_size")
        # p: bytes of the model dtype (parameters in fp32/bf16 records); under amp-bf16 the model is fp32 and the
        # residual stream fp32 (hb = 4) while autocast's matmuls produce bf16 (cb = 2).
        self.p = {"fp32": 4, "bf16": 2, "amp-bf16": 4}[rec["dtype"]]
        self.amp = rec["dtype"] == "amp-bf16"
        self.hb = self.p                  # residual-stream / norm-input dtype bytes
        self.cb = 2 if self.amp else self.p  # matmul-output dtype bytes
        self.attn = rec["attn"]
        self.ckpt = rec["checkpointing"]
        self.dropout = rec["dropout"]
        self.rec = rec


class Terms:
    def __init__(self):
        self.items = []  # (module pattern, what, bytes, multiplicity)

    def add(self, module, what, nbytes, n=1):
        if nbytes and n:
            self.items.append((module, what, int(nbytes), n))

    def total(self):
        return sum(b * n for _, _, b, n in self.items)

    def by_module(self):
        out = defaultdict(int)
        for m, _, b, n in self.items:
            out[m] += b * n
        return dict(out)


# ----------------------------------------------------------------------------------------------------------------------
# Building blocks (each cites where the saved tensors come from)
# ----------------------------------------------------------------------------------------------------------------------

def loss_terms(t: Terms, x: Dims, softcap=False):
    """transformers/loss/loss_utils.py ForCausalLMLoss: logits.float() -> cross_entropy = log_softmax (saves its fp32
    result) + nll_loss (saves target and total_weight). Labels are padded to s+1 and sliced [..., 1:];
    `.contiguous()` is a no-op when b == 1, so the saved target then keeps the whole padded storage.
    softcap: gemma2 `final_logit_softcapping` (logits / c -> tanh -> * c) in the lm_head output dtype."""
    if softcap:
        t.add("(root)", "final-logit softcap tanh result [b,s,V] (lm_head output dtype)", x.cb * x.T * x.V)
    t.add("(root)", "log_softmax result [b*s,V] fp32", F32 * x.T * x.V)
    t.add("(root)", "nll target (int64)", I64 * (x.T if x.b > 1 else x.s + 1))
    t.add("(root)", "nll total_weight (fp32 scalar)", F32)


def rms_terms(t: Terms, x: Dims, module, n, rows, width, in_bytes, kind="llama"):
    """One RMSNorm on `rows` x `width` elements whose input has `in_bytes` per element.
    llama  (LlamaRMSNorm.forward: x.to(fp32); pow(2).mean; rsqrt; x*rsqrt; weight * (...).to(input dtype)):
           fp32 input (pow self; the input itself when it is fp32) + fp32 rsqrt [rows] + normalised x in the input
           dtype (mul other).                                                   = 4E + 4R + in·E
    gemma  (GemmaRMSNorm/Gemma2RMSNorm/Gemma3RMSNorm: _norm(x.float()) * (1 + weight.float())):
           fp32 input + rsqrt + a fresh fp32 (1 + w) [width] + fp32 normalised x = 8E + 4R + 4W
    olmo2  (Olmo2RMSNorm.forward: (weight * x_normed_fp32).to(input dtype)): the product is fp32, so the saved
           normalised x is fp32                                                 = 8E + 4R
    l2     (Llama4TextL2Norm: _norm(x.float()).type_as(x), no weight): fp32 input + rsqrt = 4E + 4R
           (the mul x*rsqrt saves the same fp32 input and the rsqrt)."""
    E = rows * width
    t.add(module, f"{kind} norm: fp32 input (pow self) [{rows}x{width}]", F32 * E, n)
    t.add(module, f"{kind} norm: rsqrt [{rows}] fp32", F32 * rows, n)
    if kind == "llama":
        t.add(module, "llama norm: normalised x in the input dtype (mul other)", in_bytes * E, n)
    elif kind == "gemma":
        t.add(module, "gemma norm: 1 + weight.float() [W] fp32", F32 * width, n)
        t.add(module, "gemma norm: normalised x fp32 (mul self)", F32 * E, n)
    elif kind == "olmo2":
        t.add(module, "olmo2 norm: normalised x fp32 (weight * x: mul other)", F32 * E, n)
    elif kind == "l2":
        pass
    else:
        raise ValueError(kind)


def ln_terms(t: Terms, x: Dims, module, n, rows, width, in_bytes, save_input=True):
    """nn.LayerNorm / F.layer_norm -> aten native_layer_norm: saves its input and mean, rstd [rows]. On CPU mean and
    rstd are in the INPUT dtype (CUDA: fp32). save_input=False when the same input storage is already counted
    (parallel-residual layers feed one stream to two norms)."""
    if save_input:
        t.add(module, f"LayerNorm input [{rows}x{width}]", in_bytes * rows * width, n)
    t.add(module, "LayerNorm mean + rstd (CPU: input dtype)", 2 * in_bytes * rows, n)


def amp_weight(t: Terms, x: Dims, module, w_in, w_out, n, what=""):
    """Under autocast every nn.Linear / matmul on an fp32 weight keeps the bf16 copy of the weight for backward
    (autocast's weight-cast cache: one copy per weight per forward)."""
    if x.amp:
        t.add(module, f"autocast bf16 copy of weight [{w_in}x{w_out}] {what}", BF16 * w_in * w_out, n)


def amp_cast(t: Terms, x: Dims, module, rows, width, n, what="input"):
    """Under autocast a linear whose input is fp32 saves its own bf16 cast of that input (one per linear: q, k and v
    each keep one, the cast of activations is not cached)."""
    if x.amp:
        t.add(module, f"autocast bf16 cast of fp32 {what} [{rows}x{width}]", BF16 * rows * width, n)


def rope_terms(t: Terms, x: Dims, module, dim, pairs=1, dtype_bytes=None):
    """RoPE cos and sin [1,s,dim] (position_ids is [1,s]: no batch), saved once by the first RoPE layer's q*cos and
    rotate_half(q)*sin and shared by every layer; in the dtype of the hidden states (fp32 under autocast).
    `pairs` = number of distinct rotary embeddings (gemma3: one per layer type)."""
    nb = dtype_bytes or x.hb
    t.add(module, f"RoPE cos+sin [1,s,{dim}] x{pairs}", 2 * nb * x.s * dim, pairs)


def sdpa_terms(t: Terms, x: Dims, mod, n, *, a, kv, dq, dv=None, mask=False, o_copy=False, o_mod=None,
               value_storage=None, key_storage=None, repeat_on_mask=True):
    """torch.nn.functional.scaled_dot_product_attention on CPU (transformers/integrations/sdpa_attention.py
    sdpa_attention_forward) runs _scaled_dot_product_flash_attention_for_cpu, which saves query, key, value,
    output and an fp32 logsumexp [b,a,s]; with an attention mask also the mask, converted to the query dtype
    [b,1,s,s]. HF passes enable_gqa=True only when there is no mask (use_gqa_in_sdpa), otherwise K and V are
    repeat_kv'ed to all `a` heads first. Under autocast q/k/v are bf16 (cb)."""
    dv = dv or dq
    cb, T = x.cb, x.T
    kh = a if (mask and repeat_on_mask) else kv
    t.add(mod, f"sdpa query [b,{a},s,{dq}]", cb * T * a * dq, n)
    t.add(mod, f"sdpa key [b,{kh},s,{dq}]" + (" (repeat_kv: mask present)" if mask and kv < a else ""),
          key_storage if key_storage is not None else cb * T * kh * dq, n)
    if value_storage is not None and not (mask and repeat_on_mask and kv < a):
        t.add(mod, "sdpa value = view of a larger projection output (whole storage)", value_storage, n)
    else:
        t.add(mod, f"sdpa value [b,{kh},s,{dv}]", cb * T * kh * dv, n)
    t.add(mod, f"sdpa output [b,{a},s,{dv}]", cb * T * a * dv, n)
    t.add(mod, "sdpa logsumexp [b,a,s] fp32", F32 * x.b * a * x.s, n)
    if mask:
        t.add(mod, "sdpa attn_mask converted to the query dtype [b,1,s,s]", cb * x.b * x.s * x.s, n)
    if o_copy:
        t.add(o_mod, "o_proj input: a separate [b,s,a*dv] copy (q was [b,a,s,d]-contiguous, so was the output)",
              cb * T * a * dv, n)


def eager_terms(t: Terms, x: Dims, mod, n, *, a, dq, dv=None, softmax="fp32cast", o_mod=None, q_storage=None,
                softcap=False, sinks=False, kv_heads=None, v_storage=None):
    """The eager_attention_forward of the llama-likes: matmul(q, repeat_kv(k)^T) saves q and the repeated k,
    softmax(dtype=fp32) saves its fp32 result, `.to(q.dtype)` a copy when q is not fp32 (bf16 models; under
    autocast the probs@v matmul casts the fp32 probs to bf16 instead), probs@v saves the probs and v repeated to a
    heads (a copy even for MHA: matmul reshapes the transposed view), o_proj saves transpose(1,2).contiguous().
    softmax="native": softmax without dtype= (gpt2, falcon, llama4): saves its result in the scores' dtype, and under
    autocast probs@v saves a bf16 cast of it (fp32 scores -> cast)."""
    dv = dv or dq
    cb, T, b, s = x.cb, x.T, x.b, x.s
    t.add(mod, f"eager q [b,{a},s,{dq}] (matmul self)", q_storage if q_storage is not None else cb * T * a * dq, n)
    kh = kv_heads or a
    t.add(mod, f"eager k repeated to {kh} heads [b,{kh},s,{dq}] (matmul other)", cb * T * kh * dq, n)
    if softcap:
        t.add(mod, "attn-logit softcap tanh result [b,a,s,s] (scores dtype)", cb * b * a * s * s, n)
    if sinks:
        pass
    if softmax == "fp32cast":
        t.add(mod, "softmax(dtype=fp32) result [b,a,s,s] fp32", F32 * b * a * s * s, n)
        if cb != F32:
            t.add(mod, "probs cast to the matmul dtype [b,a,s,s]", cb * b * a * s * s, n)
    else:
        sb = x.hb if x.amp else x.p
        t.add(mod, "softmax result [b,a,s,s] (scores dtype)", (F32 if x.amp else x.p) * b * a * s * s, n)
        if x.amp:
            t.add(mod, "probs cast to bf16 by autocast for probs@v [b,a,s,s]", BF16 * b * a * s * s, n)
    if v_storage is not None:
        t.add(mod, "eager v: a view of a larger storage, saved whole (probs@v other)", v_storage, n)
    else:
        t.add(mod, f"eager v repeated to {kh} heads [b,{kh},s,{dv}] (probs@v other)", cb * T * kh * dv, n)
    t.add(o_mod, f"o_proj input [b,s,{a}*{dv}] (transpose(1,2).contiguous())", cb * T * a * dv, n)


def ckpt_terms(t: Terms, x: Dims, layer_module, *, L=None, rope_dims=(), eager_masks=0, sdpa_masks=0,
               mask_positional=False, position_ids=True, in_bytes=None, extra=(), rope_bytes=None,
               sdpa_mask_batched=False):
    """Non-reentrant checkpoint of every decoder layer (HF default, transformers/modeling_layers.py
    GradientCheckpointingLayer.__call__): each layer's positional input hidden_states is saved by the checkpoint
    frame (torch/utils/checkpoint.py _CheckpointFrame.save_inputs), and the keyword arguments live in the recompute
    closure until backward (one storage each, shared by all layers): RoPE cos/sin, position_ids, the masks.
    eager masks: additive [b,1,s,s] in the stream dtype; sdpa masks: bool [1,1,s,s] expanded (s^2 bytes)."""
    L = x.L if L is None else L
    hb = in_bytes or x.hb
    t.add(layer_module, "layer input hidden_states [b,s,h] (checkpoint frame saved_args), per layer", hb * x.T * x.h,
          L)
    for dim in rope_dims:
        t.add(layer_module, f"closure: position_embeddings cos+sin [1,s,{dim}]", 2 * (rope_bytes or x.hb) * x.s * dim)
    if position_ids:
        t.add(layer_module, "closure: position_ids [1,s] int64", I64 * x.s)
    if x.attn == "eager" and eager_masks:
        t.add(layer_module, "additive attention mask [b,1,s,s] (stream dtype)" +
              (" (positional arg)" if mask_positional else " (closure)"), x.hb * x.b * x.s * x.s, eager_masks)
    if x.attn == "sdpa" and sdpa_masks:
        if sdpa_mask_batched:  # llama4's chunked mask is materialised per batch row
            t.add(layer_module, "bool sdpa mask [b,1,s,s]", BOOL * x.b * x.s * x.s, sdpa_masks)
        else:
            t.add(layer_module, "bool sdpa mask [b,1,s,s] (expanded view of a [1,1,s,s] storage)", BOOL * x.s * x.s,
                  sdpa_masks)
    for mod, what, nbytes in extra:
        t.add(mod, what, nbytes)


# ----------------------------------------------------------------------------------------------------------------------
# Llama-like decoders: llama, qwen2, mistral, mixtral, phi3, qwen3, smollm3, olmo, olmo2, gemma, gemma2, gemma3_text
# ----------------------------------------------------------------------------------------------------------------------

def layer_types(x: Dims):
    """Per layer: 'sliding' when the layer uses a sliding-window mask, else 'full' (config.layer_types, or
    mistral/starcoder2's global sliding_window)."""
    cfg = x.cfg
    lt = cfg.get("layer_types")
    if lt:
        return ["sliding" if t.startswith("sliding") else ("chunked" if t.startswith("chunked") else "full")
                for t in lt[:x.L]]
    if cfg.get("sliding_window") and x.mt in ("mistral", "starcoder2"):
        return ["sliding"] * x.L
    return ["full"] * x.L


def masked(x: Dims, kind):
    """A sliding (or chunked) layer gets a real mask only when the sequence exceeds the window (else HF skips it)."""
    w = x.cfg.get("sliding_window") if kind == "sliding" else x.cfg.get("attention_chunk_size")
    return kind in ("sliding", "chunked") and w is not None and x.s > w


def llama_family(rec, x: Dims, *, norm="llama", fused_qkv=False, fused_gate_up=False, act="silu", qk_norm=None,
                 post_norms=False, pre_mlp="post_attention_layernorm", o_copy=False, rope_fp32=False,
                 clip_qkv=False, normalizer=False, attn_softcap=False, final_softcap=False, moe=None,
                 resid_dropout=False, rope_pairs=1, pre_norms=True, pre_attn="input_layernorm"):
    """llama/modeling_llama.py LlamaDecoderLayer.forward (+ LlamaAttention, LlamaMLP, LlamaRMSNorm) and the families
    that follow its layout; the keyword flags name where a family differs (see FINDINGS.md, one section each)."""
    t = Terms()
    p, T, h, a, k, d, f, s, b, L, V = x.p, x.T, x.h, x.a, x.k, x.d, x.f, x.s, x.b, x.L, x.V
    amp, cb, hb = x.amp, x.cb, x.hb
    lay = "model.layers.*"
    types = layer_types(x)
    n_sl = sum(1 for ty in types if masked(x, ty))
    n_full = L - n_sl
    t.add("model.embed_tokens", "input_ids (embedding indices) int64", I64 * T)
    # gemma/gemma2/gemma3 scale the embedding by sqrt(h) through an `embed_scale` buffer (…ScaledWordEmbedding):
    # `embed_scale.to(weight.dtype)` is the buffer itself (same dtype), model state like the parameters: not counted.
    rope_dim = int(d * x.prf)
    if x.ckpt:
        # one additive mask per distinct layer kind (create_causal_mask / create_sliding_window_causal_mask):
        # 2 with sliding and full layers (gemma2, gemma3_text, olmo3, exaone4), else 1
        eager_masks = len(set(types))
        ckpt_terms(t, x, lay, rope_dims=[rope_dim] * rope_pairs, eager_masks=eager_masks,
                   sdpa_masks=1 if n_sl else 0, rope_bytes=F32 if rope_fp32 else None)
    else:
        # ---- attention block
        if pre_norms and norm != "olmo2":
            if norm == "layernorm":  # olmo: OlmoLayerNorm = F.layer_norm(x.to(fp32)).to(orig dtype), no weight
                ln_terms(t, x, lay + ".input_layernorm", L, T, h, F32)
            else:
                rms_terms(t, x, lay + "." + pre_attn, L, T, h, hb, norm)
        qkv_mod = lay + (".self_attn.qkv_proj" if fused_qkv else ".self_attn.q_proj")
        # the norm output (olmo2: the residual stream itself) is the q/k/v input: one storage shared by q, k, v;
        # under autocast each linear casts its fp32 input separately.
        if amp:
            if fused_qkv:
                amp_cast(t, x, qkv_mod, T, h, L)
                amp_weight(t, x, qkv_mod, h, (a + 2 * k) * d, L)
            else:
                for nm, out in (("q_proj", a * d), ("k_proj", k * d), ("v_proj", k * d)):
                    amp_cast(t, x, lay + ".self_attn." + nm, T, h, L)
                    amp_weight(t, x, lay + ".self_attn." + nm, h, out, L)
        else:
            t.add(qkv_mod, "norm output = q/k/v projection input [b,s,h]", hb * T * h, L)
        att = lay + ".self_attn"
        if clip_qkv:  # olmo OlmoAttention.forward: q/k/v .clamp_(-clip, clip) -> ClampBackward1 saves its input
            t.add(att, "clamp input = q_proj output [b,s,a*d]", cb * T * a * d, L)
            t.add(att, "clamp input = k_proj, v_proj outputs [b,s,k*d] x2", cb * T * k * d, 2 * L)
        if qk_norm == "head":  # qwen3/gemma3: RMSNorm over head_dim of q [b,s,a,d] and k [b,s,k,d]
            kind = "gemma" if norm == "gemma" else "llama"
            rms_terms(t, x, att + ".q_norm", L, T * a, d, cb, kind)
            rms_terms(t, x, att + ".k_norm", L, T * k, d, cb, kind)
        elif qk_norm == "full":  # olmo2: RMSNorm over the whole projection a*d (and k*d)
            rms_terms(t, x, att + ".q_norm", L, T, a * d, cb, "olmo2")
            rms_terms(t, x, att + ".k_norm", L, T, k * d, cb, "olmo2")
        elif qk_norm == "full_llama":  # minimax_m2 (FlexOlmoAttention): llama-style RMSNorm over a*d and k*d
            rms_terms(t, x, att + ".q_norm", L, T, a * d, cb, "llama")
            rms_terms(t, x, att + ".k_norm", L, T, k * d, cb, "llama")
        rope_terms(t, x, att, rope_dim, pairs=rope_pairs, dtype_bytes=F32 if rope_fp32 else None)
        o_mod = att + ".o_proj"
        if x.attn == "sdpa" and not x.dropout:
            v_storage = cb * T * (a + 2 * k) * d if fused_qkv else None
            for nl, msk in ((n_sl, True), (n_full, False)):
                sdpa_terms(t, x, att, nl, a=a, kv=k, dq=d, mask=msk, o_copy=o_copy, o_mod=o_mod,
                           value_storage=v_storage)
        elif x.attn == "sdpa":
            # dropout_p > 0: CPU falls back to the math kernel, which upcasts to fp32 and repeats k/v to a heads.
            t.add(att, "math sdpa: q*sqrt(scale) fp32 [b,a,s,d]", F32 * T * a * d, L)
            t.add(att, "math sdpa: k*sqrt(scale) fp32 [b,a,s,d] (k repeated)", F32 * T * a * d, L)
            t.add(att, "math sdpa: softmax fp32 [b,a,s,s]", F32 * b * a * s * s, L)
            t.add(att, "math sdpa: dropout mask fp32 [b,a,s,s]", F32 * b * a * s * s, L)
            t.add(att, "math sdpa: dropped attn fp32 [b,a,s,s]", F32 * b * a * s * s, L)
            t.add(att, "math sdpa: v fp32 [b,a,s,d] (repeated)", F32 * T * a * d, L)
            t.add(o_mod, "o_proj input [b,s,a*d]", p * T * a * d, L)
        else:
            if x.dropout:
                t.add(att, "eager q", cb * T * a * d, L)
                t.add(att, "eager k repeated", cb * T * a * d, L)
                t.add(att, "softmax(dtype=fp32) result [b,a,s,s] fp32", F32 * b * a * s * s, L)
                t.add(att, "attention dropout mask [b,a,s,s] (CPU: same dtype as probs)", p * b * a * s * s, L)
                t.add(att, "dropped probs [b,a,s,s] (model dtype)", p * b * a * s * s, L)
                t.add(att, "eager v repeated", cb * T * a * d, L)
                t.add(o_mod, "o_proj input", cb * T * a * d, L)
            else:
                # MHA with a fused qkv (Phi-3-mini): repeat_kv is a no-op and v is a view of the fused output; at
                # b = 1 the probs@v matmul views it as [a,s,d] and saves the whole fused storage.
                v_whole = cb * T * (a + 2 * k) * d if (fused_qkv and k == a and b == 1) else None
                eager_terms(t, x, att, L, a=a, dq=d, o_mod=o_mod, softcap=attn_softcap, v_storage=v_whole)
        amp_weight(t, x, o_mod, a * d, h, L)
        if post_norms:  # gemma2/3 post_attention_layernorm, olmo2 post_attention_layernorm: on the o_proj output
            rms_terms(t, x, lay + ".post_attention_layernorm", L, T, h, cb, "olmo2" if norm == "olmo2" else norm)
        if resid_dropout:  # phi3 resid_attn_dropout / resid_mlp_dropout (CPU: a mask in the input dtype)
            t.add(lay + ".resid_attn_dropout", "residual dropout mask [b,s,h] (CPU: model dtype)", p * T * h, L)
            t.add(lay + ".resid_mlp_dropout", "residual dropout mask [b,s,h] (CPU: model dtype)", p * T * h, L)
        # ---- MLP block
        if pre_norms and norm != "olmo2":
            pm = lay + "." + pre_mlp
            if norm == "layernorm":
                ln_terms(t, x, pm, L, T, h, F32)
            else:
                rms_terms(t, x, pm, L, T, h, hb, norm)
        if moe is not None:
            moe(t, x, rec)
        elif fused_gate_up:
            m = lay + ".mlp"
            if amp:
                amp_cast(t, x, m + ".gate_up_proj", T, h, L)
            else:
                t.add(m + ".gate_up_proj", "norm output = gate_up_proj input [b,s,h]", hb * T * h, L)
            amp_weight(t, x, m + ".gate_up_proj", h, 2 * f, L)
            t.add(m + ".activation_fn", "gate_up output [b,s,2f] (silu saves the gate view; up is a view too)",
                  cb * T * 2 * f, L)
            t.add(m, "silu(gate) [b,s,f]", cb * T * f, L)
            t.add(m + ".down_proj", "up*silu(gate) = down_proj input [b,s,f]", cb * T * f, L)
            amp_weight(t, x, m + ".down_proj", f, h, L)
        else:
            swiglu_terms(t, x, lay + ".mlp", L, T, h, f, in_bytes=hb, act_mod=".act_fn")
        if post_norms:
            rms_terms(t, x, lay + ".post_feedforward_layernorm", L, T, h, cb, "olmo2" if norm == "olmo2" else norm)
    # ---- model end
    if norm == "layernorm":
        ln_terms(t, x, "model.norm", 1, T, h, F32)
    else:
        rms_terms(t, x, "model.norm", 1, T, h, hb, norm)
    lm_head_terms(t, x, "lm_head", in_bytes=hb)
    loss_terms(t, x, softcap=final_softcap)
    return t


def apertus_mlp(t: Terms, x: Dims, rec):
    """apertus/modeling_apertus.py ApertusMLP.forward: down_proj(act_fn(up_proj(x))), no gate; act_fn =
    transformers/activations.py XIELUActivation._xielu_python (no CUDA `xielu` package here):
        alpha_p = softplus(self.alpha_p); alpha_n = beta + softplus(self.alpha_n)      # [1] parameters
        where(x > 0, alpha_p * x * x + beta * x, (expm1(min(x, eps)) - x) * alpha_n + beta * x)
    beta and eps are 0-dim buffers (they do not promote); alpha_p, alpha_n are [1] parameters (they do: under
    autocast they are fp32 while x is bf16, so alpha_p * x and everything after the `* alpha_n` is fp32).
    Saved per layer: x (the up_proj output, `mul other`), alpha_p * x, expm1(min(x, eps)) - x, the expm1 result,
    the bool condition x > 0, the two [1] scalars, and the down_proj input (the where result; under autocast its bf16
    cast)."""
    T, h, f, L = x.T, x.h, x.f, x.L
    cb, hb = x.cb, x.hb
    e = F32 if x.amp else x.p  # dtype of alpha_p * x and of the [1] scalars
    m = "model.layers.*.mlp"
    if x.amp:
        amp_cast(t, x, m + ".up_proj", T, h, L)
    else:
        t.add(m + ".up_proj", "feedforward_layernorm output = up_proj input [b,s,h]", hb * T * h, L)
    amp_weight(t, x, m + ".up_proj", h, f, L)
    a = m + ".act_fn"
    t.add(a, "xielu: x = up_proj output [b,s,f]", cb * T * f, L)
    t.add(a, "xielu: alpha_p * x [b,s,f] (fp32 under autocast)", e * T * f, L)
    t.add(a, "xielu: expm1(min(x, eps)) - x [b,s,f]", cb * T * f, L)
    t.add(a, "xielu: expm1 result [b,s,f]", cb * T * f, L)
    t.add(a, "xielu: where condition x > 0 [b,s,f] bool", BOOL * T * f, L)
    t.add(a, "xielu: softplus(alpha_p), beta + softplus(alpha_n) [1] x2", 2 * e, L)
    t.add(m + ".down_proj", "xielu output = down_proj input [b,s,f] (under autocast: its bf16 cast)", cb * T * f, L)
    amp_weight(t, x, m + ".down_proj", f, h, L)


def swiglu_terms(t: Terms, x: Dims, m, n, rows, h, f, in_bytes, act_mod=".act_fn", input_saved=True,
                 first="gate_proj"):
    """LlamaMLP.forward: down_proj(act_fn(gate_proj(x)) * up_proj(x)) (GeGLU for gemma: act = gelu_tanh):
    gate/up input (one storage; under autocast a bf16 cast per linear), the act input (gate output), act(gate),
    up output, and the down_proj input, all in the matmul dtype."""
    cb = x.cb
    if x.amp and in_bytes == F32:
        amp_cast(t, x, m + ".gate_proj", rows, h, n)
        amp_cast(t, x, m + ".up_proj", rows, h, n)
    elif input_saved:  # labelled with the projection that runs first (falcon_h1: up_proj)
        t.add(m + "." + first, "gate/up input [rows,h] (one storage)", in_bytes * rows * h, n)
    amp_weight(t, x, m + ".gate_proj", h, f, n)
    amp_weight(t, x, m + ".up_proj", h, f, n)
    amp_weight(t, x, m + ".down_proj", f, h, n)
    t.add(m + act_mod, "gate_proj output = act input [rows,f]", cb * rows * f, n)
    t.add(m, "act(gate) [rows,f] (mul self)", cb * rows * f, n)
    t.add(m, "up_proj output [rows,f] (mul other)", cb * rows * f, n)
    t.add(m + ".down_proj", "act(gate)*up = down_proj input [rows,f]", cb * rows * f, n)


def lm_head_terms(t: Terms, x: Dims, mod, in_bytes):
    """The lm_head saves its input (the final norm output); under autocast a bf16 cast of it and a bf16 copy of the
    (possibly tied) embedding matrix [V,h]."""
    if x.amp:
        amp_cast(t, x, mod, x.T, x.h, 1, "lm_head input")
        amp_weight(t, x, mod, x.V, x.h, 1, "lm_head")
    else:
        t.add(mod, "final norm output = lm_head input [b,s,h]", in_bytes * x.T * x.h)


# ----------------------------------------------------------------------------------------------------------------------
# LayerNorm decoders: starcoder2, stablelm, phi, gpt_neox, opt, falcon
# ----------------------------------------------------------------------------------------------------------------------

def ln_stat_bytes(x: Dims, in_bytes):
    """CPU native_layer_norm keeps mean/rstd in the input dtype, except with fp32 parameters and a bf16 input (the
    mixed-type kernel under autocast): fp32."""
    return F32 if x.amp else in_bytes


def ln2(t: Terms, x: Dims, module, n, rows, width, in_bytes, save_input=True, groups=1):
    """LayerNorm with the dtype rule above; `groups` LayerNorms over slices of one input storage (stablelm's
    per-head q/k LayerNorm: one saved input storage, mean/rstd per head)."""
    if save_input:
        t.add(module, f"LayerNorm input [{rows}x{width * groups}]", in_bytes * rows * width * groups, n)
    t.add(module, f"LayerNorm mean + rstd [{rows}] x{groups} (CPU: input dtype; fp32 under autocast)",
          2 * ln_stat_bytes(x, in_bytes) * rows * groups, n)


def attn_core(t: Terms, x: Dims, att, n, *, a, kv, d, o_mod, o_copy, mask_layers=0, softmax="fp32cast",
              value_storage=None, eager_v_storage=None):
    """sdpa or eager attention for n layers, `mask_layers` of which get an explicit sdpa mask."""
    if x.attn == "sdpa":
        sdpa_terms(t, x, att, mask_layers, a=a, kv=kv, dq=d, mask=True, o_copy=o_copy, o_mod=o_mod,
                   value_storage=value_storage)
        sdpa_terms(t, x, att, n - mask_layers, a=a, kv=kv, dq=d, mask=False, o_copy=o_copy, o_mod=o_mod,
                   value_storage=value_storage)
    else:
        eager_terms(t, x, att, n, a=a, dq=d, o_mod=o_mod, softmax=softmax, v_storage=eager_v_storage)


def starcoder2(rec, x: Dims):
    """starcoder2/modeling_starcoder2.py: Starcoder2DecoderLayer (LayerNorm input_layernorm/post_attention_layernorm
    with bias), Starcoder2Attention (q/k/v/o with bias, full RoPE, sliding window), Starcoder2MLP (c_fc -> gelu_tanh
    -> c_proj; dropout p=0)."""
    t = Terms()
    T, h, a, k, d, f, L = x.T, x.h, x.a, x.k, x.d, x.f, x.L
    hb, cb = x.hb, x.cb
    lay = "model.layers.*"
    n_sl = sum(1 for ty in layer_types(x) if masked(x, ty))
    t.add("model.embed_tokens", "input_ids int64", I64 * T)
    if x.ckpt:
        ckpt_terms(t, x, lay, rope_dims=[d], eager_masks=1, sdpa_masks=1 if n_sl else 0)
    else:
        ln2(t, x, lay + ".input_layernorm", L, T, h, hb)
        att = lay + ".self_attn"
        if x.amp:
            for nm, out in (("q_proj", a * d), ("k_proj", k * d), ("v_proj", k * d)):
                amp_cast(t, x, att + "." + nm, T, h, L)
                amp_weight(t, x, att + "." + nm, h, out, L)
        else:
            t.add(att + ".q_proj", "LayerNorm output = q/k/v input [b,s,h]", hb * T * h, L)
        rope_terms(t, x, att, d)
        attn_core(t, x, att, L, a=a, kv=k, d=d, o_mod=att + ".o_proj", o_copy=False, mask_layers=n_sl)
        amp_weight(t, x, att + ".o_proj", a * d, h, L)
        ln2(t, x, lay + ".post_attention_layernorm", L, T, h, hb)
        gelu_mlp_terms(t, x, lay + ".mlp", L, T, h, f, ".c_fc", ".act", ".c_proj")
    ln2(t, x, "model.norm", 1, T, h, hb)
    lm_head_terms(t, x, "lm_head", hb)
    loss_terms(t, x)
    return t


def gelu_mlp_terms(t: Terms, x: Dims, m, n, rows, h, f, fc1, act, fc2, *, input_saved=True, gelu_new=False,
                   relu=False):
    """A two-matrix MLP fc1 -> act -> fc2: fc1 input (the norm output; under autocast its own bf16 cast), the act
    input (fc1 output; gelu/gelu_tanh save their input), the fc2 input (act output). gelu_new (phi, gpt2) is the
    python tanh formula and saves 4 [rows,f] tensors (x, tanh(...), 0.5*x, 1+tanh) of which the last product is the
    fc2 input as well; relu saves only its result, which is the fc2 input (opt)."""
    cb = x.cb
    if x.amp:
        amp_cast(t, x, m + fc1, rows, h, n, "fc1 input")
    elif input_saved:
        t.add(m + fc1, "fc1 input [rows,h]", x.hb * rows * h, n)
    amp_weight(t, x, m + fc1, h, f, n)
    amp_weight(t, x, m + fc2, f, h, n)
    if gelu_new:
        for what in ("x (fc1 output)", "tanh(...)", "0.5*x", "1+tanh"):
            t.add(m + act, f"gelu_new: {what} [rows,f]", cb * rows * f, n)
        t.add(m + fc2, "fc2 input [rows,f]", cb * rows * f, n)
    elif relu:
        t.add(m + act, "relu result = fc2 input [rows,f]", cb * rows * f, n)
    else:
        t.add(m + act, "fc1 output = gelu input [rows,f]", cb * rows * f, n)
        t.add(m + fc2, "gelu output = fc2 input [rows,f]", cb * rows * f, n)


def stablelm(rec, x: Dims):
    """stablelm/modeling_stablelm.py: StableLmDecoderLayer (LayerNorm; use_parallel_residual: the MLP reads the
    input_layernorm output and there is no post_attention_layernorm), StableLmAttention (partial RoPE on
    rotary_ndims = d * partial_rotary_factor dims, then torch.cat((rot, pass)) makes q, k [b,a,s,d]-contiguous, so the
    sdpa output is too and o_proj keeps its own copy; qk_layernorm: StableLmLayerNormPerHead = one LayerNorm per head
    over torch.split(q, 1, dim=1) views of the q/k projection), StableLmMLP (SwiGLU)."""
    t = Terms()
    T, h, a, k, d, f, L = x.T, x.h, x.a, x.k, x.d, x.f, x.L
    hb, cb = x.hb, x.cb
    cfg = x.cfg
    par, qkln = cfg.get("use_parallel_residual"), cfg.get("qk_layernorm")
    lay = "model.layers.*"
    rot = int(d * x.prf)
    # Qwen3.5's text rotary embedding is M-RoPE (Qwen3VLTextRotaryEmbedding, interleaved sections): text position
    # ids are expanded to [3, b, s], so cos/sin are [b, s, rot], not [1, s, rot]
    rope_b = b if x.mt in ("qwen3_5_text", "qwen3_5_moe_text") else 1
    t.add("model.embed_tokens", "input_ids int64", I64 * T)
    if x.ckpt:
        ckpt_terms(t, x, lay, rope_dims=[rot * rope_b], eager_masks=1)
    else:
        ln2(t, x, lay + ".input_layernorm", L, T, h, hb)
        att = lay + ".self_attn"
        if x.amp:
            for nm, out in (("q_proj", a * d), ("k_proj", k * d), ("v_proj", k * d)):
                amp_cast(t, x, att + "." + nm, T, h, L)
                amp_weight(t, x, att + "." + nm, h, out, L)
        else:
            t.add(att + ".q_proj", "LayerNorm output = q/k/v (and, parallel, MLP) input [b,s,h]", hb * T * h, L)
        if qkln:
            ln2(t, x, att + ".q_layernorm.norms.*", L, T, d, cb, groups=a)
            ln2(t, x, att + ".k_layernorm.norms.*", L, T, d, cb, groups=k)
        rope_terms(t, x, att, rot)
        attn_core(t, x, att, L, a=a, kv=k, d=d, o_mod=att + ".o_proj", o_copy=True)
        amp_weight(t, x, att + ".o_proj", a * d, h, L)
        if not par:
            ln2(t, x, lay + ".post_attention_layernorm", L, T, h, hb)
        swiglu_terms(t, x, lay + ".mlp", L, T, h, f, in_bytes=hb, input_saved=not par)
    ln2(t, x, "model.norm", 1, T, h, hb)
    lm_head_terms(t, x, "lm_head", hb)
    loss_terms(t, x)
    return t


def phi(rec, x: Dims):
    """phi/modeling_phi.py: PhiDecoderLayer (one LayerNorm whose output feeds attention and MLP in parallel),
    PhiAttention (q/k/v/dense with bias, partial RoPE with torch.cat -> dense keeps its own input copy), PhiMLP
    (fc1 -> gelu_new -> fc2), final_layernorm, lm_head with bias."""
    t = Terms()
    T, h, a, k, d, f, L = x.T, x.h, x.a, x.k, x.d, x.f, x.L
    hb, cb = x.hb, x.cb
    lay = "model.layers.*"
    rot = int(d * x.prf)
    # Qwen3.5's text rotary embedding is M-RoPE (Qwen3VLTextRotaryEmbedding, interleaved sections): text position
    # ids are expanded to [3, b, s], so cos/sin are [b, s, rot], not [1, s, rot]
    rope_b = b if x.mt in ("qwen3_5_text", "qwen3_5_moe_text") else 1
    t.add("model.embed_tokens", "input_ids int64", I64 * T)
    if x.ckpt:
        ckpt_terms(t, x, lay, rope_dims=[rot * rope_b], eager_masks=1)
    else:
        ln2(t, x, lay + ".input_layernorm", L, T, h, hb)
        att = lay + ".self_attn"
        if x.amp:
            for nm, out in (("q_proj", a * d), ("k_proj", k * d), ("v_proj", k * d)):
                amp_cast(t, x, att + "." + nm, T, h, L)
                amp_weight(t, x, att + "." + nm, h, out, L)
        else:
            t.add(att + ".q_proj", "LayerNorm output = q/k/v and fc1 input [b,s,h]", hb * T * h, L)
        rope_terms(t, x, att, rot)
        attn_core(t, x, att, L, a=a, kv=k, d=d, o_mod=att + ".dense", o_copy=True)
        amp_weight(t, x, att + ".dense", a * d, h, L)
        gelu_mlp_terms(t, x, lay + ".mlp", L, T, h, f, ".fc1", ".activation_fn", ".fc2", input_saved=False,
                       gelu_new=True)
    ln2(t, x, "model.final_layernorm", 1, T, h, hb)
    lm_head_terms(t, x, "lm_head", hb)
    loss_terms(t, x)
    return t


def gpt_neox(rec, x: Dims):
    """gpt_neox/modeling_gpt_neox.py: GPTNeoXLayer (use_parallel_residual: both LayerNorms read the layer input, one
    stored input), GPTNeoXAttention (fused query_key_value viewed [b,s,a,3d] -> q, k, v are views of it; partial
    RoPE with torch.cat -> q, k new [b,a,s,d]-contiguous tensors -> dense keeps its own input copy; sdpa's value is a
    view of the fused output: the whole [b,s,3h] storage; eager: v copied by the matmul), GPTNeoXMLP
    (dense_h_to_4h -> gelu -> dense_4h_to_h)."""
    t = Terms()
    T, h, a, d, f, L = x.T, x.h, x.a, x.h // x.a, x.f, x.L
    hb, cb = x.hb, x.cb
    par = x.cfg.get("use_parallel_residual")
    lay = "gpt_neox.layers.*"
    rot = int(d * x.prf)
    t.add("gpt_neox.embed_in", "input_ids int64", I64 * T)
    if x.ckpt:
        ckpt_terms(t, x, lay, rope_dims=[rot], eager_masks=1)
    else:
        ln2(t, x, lay + ".input_layernorm", L, T, h, hb)
        att = lay + ".attention"
        m = att + ".query_key_value"
        if x.amp:
            amp_cast(t, x, m, T, h, L)
        else:
            t.add(m, "LayerNorm output = query_key_value input [b,s,h]", hb * T * h, L)
        amp_weight(t, x, m, h, 3 * h, L)
        rope_terms(t, x, att, rot)
        # b = 1: matmul(probs, v) can view v ([1,a,s,d] strided into the fused output) as [a,s,d] without a copy,
        # so it saves the whole fused [b,s,3h] storage instead of a [b,a,s,d] copy.
        attn_core(t, x, att, L, a=a, kv=a, d=d, o_mod=att + ".dense", o_copy=True, value_storage=cb * T * 3 * h,
                  eager_v_storage=cb * T * 3 * h if x.b == 1 else None)
        amp_weight(t, x, att + ".dense", h, h, L)
        ln2(t, x, lay + ".post_attention_layernorm", L, T, h, hb, save_input=not par)
        gelu_mlp_terms(t, x, lay + ".mlp", L, T, h, f, ".dense_h_to_4h", ".act", ".dense_4h_to_h")
    ln2(t, x, "gpt_neox.final_layer_norm", 1, T, h, hb)
    lm_head_terms(t, x, "embed_out" if False else "lm_head", hb)
    loss_terms(t, x)
    return t


def opt(rec, x: Dims):
    """opt/modeling_opt.py: OPTDecoder (embed_tokens + OPTLearnedPositionalEmbedding: position ids from the
    attention mask's cumsum [b,s] int64 + offset 2), OPTDecoderLayer (do_layer_norm_before: self_attn_layer_norm,
    final_layer_norm on the [b*s,h] view; fc1 -> relu -> fc2), OPTAttention (q/k/v/out_proj with bias; q * scaling is
    folded into the kernel's scale)."""
    t = Terms()
    T, h, a, d, f, L = x.T, x.h, x.a, x.h // x.a, x.f, x.L
    hb, cb = x.hb, x.cb
    lay = "model.decoder.layers.*"
    t.add("model.decoder.embed_tokens", "input_ids int64", I64 * T)
    t.add("model.decoder.embed_positions", "position ids [b,s] int64 (cumsum of the attention mask)", I64 * T)
    if x.ckpt:
        ckpt_terms(t, x, lay, position_ids=False, eager_masks=1)
        t.add(lay, "closure: position_ids [b,s] int64", I64 * T)
    else:
        ln2(t, x, lay + ".self_attn_layer_norm", L, T, h, hb)
        att = lay + ".self_attn"
        if x.amp:
            for nm in ("q_proj", "k_proj", "v_proj"):
                amp_cast(t, x, att + "." + nm, T, h, L)
                amp_weight(t, x, att + "." + nm, h, h, L)
        else:
            t.add(att + ".q_proj", "LayerNorm output = q/k/v input [b,s,h]", hb * T * h, L)
        attn_core(t, x, att, L, a=a, kv=a, d=d, o_mod=att + ".out_proj", o_copy=False)
        amp_weight(t, x, att + ".out_proj", h, h, L)
        ln2(t, x, lay + ".final_layer_norm", L, T, h, hb)
        gelu_mlp_terms(t, x, lay, L, T, h, f, ".fc1", ".activation_fn", ".fc2", relu=True)
    ln2(t, x, "model.decoder.final_layer_norm", 1, T, h, hb)
    lm_head_terms(t, x, "lm_head", hb)
    loss_terms(t, x)
    return t


def falcon(rec, x: Dims):
    """falcon/modeling_falcon.py: FalconDecoderLayer (parallel attention + MLP; new_decoder_architecture with
    num_ln_in_parallel_attn=2: ln_attn and ln_mlp both read the layer input (one stored input), else one
    input_layernorm whose output feeds both), FalconAttention (fused query_key_value; _split_heads indexes
    qkv[..., [-2]] / [[-1]] (IndexBackward0 keeps two int64 [1] indices per layer); the new architecture broadcasts K
    and V to all `a` heads and copies them (flatten), multi_query keeps one head; sdpa always gets the mask (falcon
    builds one), so K/V are never GQA-shared in sdpa; eager softmax(dtype=hidden dtype): no fp32 upcast in bf16),
    FalconMLP (dense_h_to_4h -> gelu -> dense_4h_to_h)."""
    t = Terms()
    T, h, a, d, f, L = x.T, x.h, x.a, x.h // x.a, x.f, x.L
    hb, cb = x.hb, x.cb
    cfg = x.cfg
    new = cfg.get("new_decoder_architecture")
    two_ln = new and (cfg.get("num_ln_in_parallel_attn") in (None, 2))
    kvh = a if new else (1 if cfg.get("multi_query") else a)
    qkv_out = (2 * x.k + a) * d if new else ((h + 2 * d) if cfg.get("multi_query") else 3 * h)
    lay = "transformer.h.*"
    t.add("transformer.word_embeddings", "input_ids int64", I64 * T)
    if x.ckpt:
        ckpt_terms(t, x, lay, rope_dims=[d], eager_masks=1, sdpa_masks=1)
    else:
        att = lay + ".self_attention"
        if two_ln:
            ln2(t, x, lay + ".ln_attn", L, T, h, hb)
            ln2(t, x, lay + ".ln_mlp", L, T, h, hb, save_input=False)
        else:
            ln2(t, x, lay + ".input_layernorm", L, T, h, hb)
        m = att + ".query_key_value"
        if x.amp:
            amp_cast(t, x, m, T, h, L)
        else:
            t.add(m, "LayerNorm output = query_key_value input [b,s,h]", hb * T * h, L)
        amp_weight(t, x, m, h, qkv_out, L)
        t.add(att, "_split_heads list indices [-2], [-1]: int64 [1] x2", I64, 2 * L)
        rope_terms(t, x, att, d)
        if x.attn == "sdpa":
            sdpa_terms(t, x, att, L, a=a, kv=kvh, dq=d, mask=True, o_mod=att + ".dense", repeat_on_mask=False)
        else:
            # multi_query: matmul broadcasts K/V [b,1,...] to a heads and copies them, except for b = 1, where it
            # folds the batch into an mm and keeps the single head.
            eager_terms(t, x, att, L, a=a, dq=d, o_mod=att + ".dense", softmax="native",
                        kv_heads=1 if (kvh == 1 and x.b == 1) else a)
        amp_weight(t, x, att + ".dense", h, h, L)
        gelu_mlp_terms(t, x, lay + ".mlp", L, T, h, f, ".dense_h_to_4h", ".act", ".dense_4h_to_h",
                       input_saved=two_ln)
    ln2(t, x, "transformer.ln_f", 1, T, h, hb)
    lm_head_terms(t, x, "lm_head", hb)
    loss_terms(t, x)
    return t


# ----------------------------------------------------------------------------------------------------------------------
# Mixture of experts
# ----------------------------------------------------------------------------------------------------------------------

def grouped_experts_terms(t: Terms, x: Dims, ex, n, S, fe, in_bytes, *, rw_bytes, act_mod=".act_fn",
                          impl="grouped_mm", gate_kind="silu", bias=False):
    """transformers/integrations/moe.py grouped_mm_experts_forward (the default experts implementation): tokens
    sorted by expert (torch.sort), gathered with hidden_states[perm // top_k] (IndexBackward0 saves the index),
    sample weights gathered with [perm] and scattered back through the inverse permutation: 3 int64 [S] indices;
    int32 offsets [E]; the gathered input [S,h]; the gate_up output [S,2fe] (the activation saves the gate view:
    the whole storage); act(gate) [S,fe]; the down grouped_mm input [S,fe]; the routing weights [S,1]; the down
    output [S,h] (the weighting mul saves it). grouped_mm has no autocast rule and runs in the weights' dtype, after
    `input.to(weight.dtype)` (_grouped_mm): fp32 under autocast."""
    ep = F32 if x.amp else x.p  # experts' compute dtype = weight dtype
    E = x.E
    if impl == "grouped_mm":
        t.add(ex, "3 index tensors (perm//top_k, perm, inv_perm) [S] int64", 3 * I64 * S, n)
        t.add(ex, "grouped_mm offsets [E] int32", I32 * E, n)
        t.add(ex, "gathered tokens = up grouped_mm input [S,h]", ep * S * x.h, n)
        t.add(ex + act_mod, "gate_up output [S,2fe] (the activation saves the gate view)", ep * S * 2 * fe, n)
        t.add(ex, "act(gate) [S,fe]", ep * S * fe, n)
        t.add(ex, "act(gate)*up = down grouped_mm input [S,fe]", ep * S * fe, n)
        t.add(ex, "routing weights [S,1]", rw_bytes * S, n)
        t.add(ex, "down output [S,h] (weighting mul self)", ep * S * x.h, n)
    else:  # eager: python loop over hit experts; every tensor is per expert, so the totals depend only on S
        p = x.p
        t.add(ex, "torch.where(mask) -> (top_k_pos, token_idx) [n_e,2] int64", 2 * I64 * S, n)
        t.add(ex, "hidden_states[token_idx] [n_e,h]", p * S * x.h, n)
        t.add(ex + act_mod, "gate_up output [n_e,2fe]", p * S * 2 * fe, n)
        t.add(ex, "silu(gate) [n_e,fe]", p * S * fe, n)
        t.add(ex, "down input [n_e,fe]", p * S * fe, n)
        t.add(ex, "routing weight [n_e,1] fp32", F32 * S, n)
        t.add(ex, "down output [n_e,h]", p * S * x.h, n)
        t.add(ex, "index_add_ source [n_e,h]", p * S * x.h, n)


def mixtral_moe(t: Terms, x: Dims, rec):
    """mixtral/modeling_mixtral.py MixtralSparseMoeBlock.forward + MixtralTopKRouter.forward: router linear input
    (the norm output), softmax(logits.float()) [T,E] fp32, topk indices [T,K] int64, the top-k values and their sum
    (renormalised: DivBackward0 saves both, fp32), then the grouped experts with fp32 routing weights."""
    L, T, h, E, K = x.L, x.T, x.h, x.E, x.K
    S = T * K
    m = "model.layers.*.mlp"
    g = m + ".gate"
    if x.amp:
        amp_cast(t, x, g, T, h, L, "router input")
    else:
        t.add(g, "router input = norm output [b*s,h]", x.hb * T * h, L)
    amp_weight(t, x, g, h, E, L, "router")
    t.add(g, "router softmax(logits.float()) [b*s,E] fp32", F32 * T * E, L)
    t.add(g, "router topk indices [b*s,K] int64", I64 * T * K, L)
    t.add(g, "router top values (div self) [b*s,K] fp32", F32 * T * K, L)
    t.add(g, "router top values sum (div other) [b*s,1] fp32", F32 * T, L)
    impl = rec.get("experts_implementation", "grouped_mm")
    grouped_experts_terms(t, x, m + ".experts", L, S, x.f, x.hb, rw_bytes=F32, impl=impl)


def router_terms(t: Terms, x: Dims, g, n, *, kind, input_saved, norm_topk):
    """The router (`mlp.gate`) of a MoE layer on the [T,h] input. Returns the bytes per element of the routing
    weights the experts multiply by.
    softmax (qwen2_moe/qwen3_moe/qwen3_next Qwen*TopKRouter.forward): F.linear in the model dtype (autocast: a bf16
        input cast and weight copy), softmax(dtype=float) fp32 [T,E], topk indices [T,K] int64, with norm_topk_prob
        the fp32 top values and their sum (DivBackward0), then `.to(router_logits.dtype)`: routing weights in the
        matmul dtype.
    sigmoid (deepseek_v3 DeepseekV3TopkRouter / glm4_moe Glm4MoeTopkRouter): F.linear(x.float(), w.float()) with an
        fp32 weight (_keep_in_fp32_modules_strict) -> an fp32 copy of the input in bf16 models (the input itself in
        fp32 models; under autocast the linear is bf16 again: cast + weight copy and the whole router in bf16),
        sigmoid result [T,E], gather index [T,K] int64, norm_topk_prob: top values and sum (DivBackward0). The
        group-limited selection (n_group/topk_group) only produces indices: its graph is dead and frees itself.
    softmax_fp32 (deepseek_v2 DeepseekV2TopkRouter): the fp32 linear as above, softmax fp32 [T,E], greedy: topk
        indices; group_limited_greedy: plus masked_fill's bool mask [T,E]; no renormalisation (V2 default)."""
    T, h, E, K = x.T, x.h, x.E, x.K
    if kind == "softmax":
        if x.amp:
            amp_cast(t, x, g, T, h, n, "router input")
        elif input_saved:
            t.add(g, "router input = norm output [T,h]", x.hb * T * h, n)
        amp_weight(t, x, g, h, E, n, "router")
        t.add(g, "router softmax(dtype=float) [T,E] fp32", F32 * T * E, n)
        t.add(g, "router topk indices [T,K] int64", I64 * T * K, n)
        if norm_topk:
            t.add(g, "top values (div self) [T,K] fp32", F32 * T * K, n)
            t.add(g, "top values sum (div other) [T,1] fp32", F32 * T, n)
        return x.cb
    rb = BF16 if x.amp else F32  # router compute dtype
    if x.amp:
        amp_cast(t, x, g, T, h, n, "router input")
        amp_weight(t, x, g, h, E, n, "router")
    elif x.p != F32 or input_saved:
        t.add(g, "router input .float() [T,h] fp32 (a copy in bf16 models)", F32 * T * h, n)
    if kind == "sigmoid":
        t.add(g, "router sigmoid result [T,E]", rb * T * E, n)
        t.add(g, "gather index = topk indices [T,K] int64", I64 * T * K, n)
        if norm_topk:
            t.add(g, "top weights (div self) [T,K]", rb * T * K, n)
            t.add(g, "top weights sum + 1e-20 (div other) [T,1]", rb * T, n)
        return rb
    # softmax_fp32 (deepseek_v2): softmax(dtype=float32) keeps the scores and the routing weights fp32 even under
    # autocast
    t.add(g, "router softmax [T,E] fp32", F32 * T * E, n)
    if x.cfg.get("topk_method") == "group_limited_greedy":
        t.add(g, "masked_fill mask (groups not selected) [T,E] bool", BOOL * T * E, n)
    t.add(g, "router topk indices [T,K] int64", I64 * T * K, n)
    return F32


def moe_layers_terms(t: Terms, x: Dims, m, n, *, router, norm_topk, fe, shared_f=0, shared_gate=False,
                     shared_first=False, impl="grouped_mm"):
    """One MoE block on n layers: router, grouped experts, optional shared expert(s) (SwiGLU of width shared_f) and
    qwen2_moe/qwen3_next's sigmoid shared_expert_gate. Who saves the block input first decides the module label
    only; the bytes are the same."""
    T, h = x.T, x.h
    S = T * x.K
    if shared_first and shared_f:  # qwen2_moe/qwen3_next: shared_expert(hidden) runs before the router
        swiglu_terms(t, x, m + ".shared_expert", n, T, h, shared_f, in_bytes=x.hb)
        router_input_saved = False
    else:
        router_input_saved = True
    rw = router_terms(t, x, m + ".gate", n, kind=router, input_saved=router_input_saved, norm_topk=norm_topk)
    grouped_experts_terms(t, x, m + ".experts", n, S, fe, x.hb, rw_bytes=rw, impl=impl)
    if shared_f and not shared_first:  # deepseek/glm4: shared_experts(residuals) after the routed experts
        # the block input is stored once: by the router in fp32 models (x.float() is a no-op), else here
        swiglu_terms(t, x, m + ".shared_experts", n, T, h, shared_f, in_bytes=x.hb,
                     input_saved=(x.p != F32 or router != "sigmoid" and router != "softmax_fp32"))
    if shared_gate:  # Qwen2MoeSparseMoeBlock: F.sigmoid(shared_expert_gate(x)) * shared_expert_output
        amp_cast(t, x, m + ".shared_expert_gate", T, h, n, "gate input")
        amp_weight(t, x, m + ".shared_expert_gate", h, 1, n, "shared_expert_gate")
        t.add(m, "sigmoid(shared_expert_gate(x)) [T,1]", x.cb * T, n)
        t.add(m, "shared expert output (mul other) [T,h]", x.cb * T * h, n)


def moe_dense_split(x: Dims):
    """(dense layers, MoE layers) of a model with mlp_only_layers / first_k_dense_replace / decoder_sparse_step."""
    cfg = x.cfg
    if "first_k_dense_replace" in cfg:
        dense = min(cfg["first_k_dense_replace"], x.L)
    else:
        only = set(cfg.get("mlp_only_layers") or [])
        step = cfg.get("decoder_sparse_step") or 1
        dense = sum(1 for i in range(x.L) if i in only or (i + 1) % step != 0)
    return dense, x.L - dense


def qwen_moe_mlp(t: Terms, x: Dims, rec):
    """qwen2_moe/modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock (shared expert + sigmoid gate) and
    qwen3_moe/modeling_qwen3_moe.py Qwen3MoeSparseMoeBlock (no shared expert); dense layers (mlp_only_layers) are
    the LlamaMLP-shaped Qwen*MLP with intermediate_size."""
    dense, moe = moe_dense_split(x)
    m = "model.layers.*.mlp"
    swiglu_terms(t, x, m, dense, x.T, x.h, x.f, in_bytes=x.hb)
    shared = x.cfg.get("shared_expert_intermediate_size") or 0
    # Qwen3_5MoeTopKRouter.forward renormalises the top-k values unconditionally (its config has no norm_topk_prob)
    norm_topk = True if x.mt == "qwen3_5_moe_text" else x.cfg.get("norm_topk_prob")
    moe_layers_terms(t, x, m, moe, router="softmax", norm_topk=norm_topk, fe=x.fe,
                     shared_f=shared, shared_gate=bool(shared), shared_first=True)


def glm4_moe_mlp(t: Terms, x: Dims, rec):
    """glm4_moe/modeling_glm4_moe.py Glm4MoeDecoderLayer: layers < first_k_dense_replace use Glm4MoeMLP
    (intermediate_size), the others Glm4MoeMoE = Glm4MoeTopkRouter + experts + shared_experts
    (moe_intermediate_size * n_shared_experts)."""
    dense, moe = moe_dense_split(x)
    m = "model.layers.*.mlp"
    swiglu_terms(t, x, m, dense, x.T, x.h, x.f, in_bytes=x.hb)
    moe_layers_terms(t, x, m, moe, router="sigmoid", norm_topk=x.cfg.get("norm_topk_prob"), fe=x.fe,
                     shared_f=x.fe * x.cfg["n_shared_experts"])


# ----------------------------------------------------------------------------------------------------------------------
# DeepSeek V2/V3 (MLA)
# ----------------------------------------------------------------------------------------------------------------------

def deepseek(rec, x: Dims):
    """deepseek_v3/modeling_deepseek_v3.py and deepseek_v2/modeling_deepseek_v2.py.
    DeepseekV3Attention.forward / DeepseekV2Attention.forward (MLA): with q_lora_rank, q = q_b_proj(q_a_layernorm(
    q_a_proj(x))) (q_a_proj input = the norm output, shared with kv_a_proj_with_mqa; q_a_layernorm an RMSNorm over
    q_lora_rank; q_b_proj input its output), else q = q_proj(x); compressed = kv_a_proj_with_mqa(x) [T, r + dr];
    kv_a_layernorm on the kv_nope slice [T, r] (x.to(fp32) copies the slice in bf16 models; in fp32 models pow
    saves the slice itself, i.e. the whole [T, r + dr] storage); kv_b_proj input = its output [T, r]; expand_kv
    builds key_states [b,a,s,dn+dr] (new_empty + copy_) and value_states, a view of the kv_b_proj output
    [b,s,a,dn+dv]. RoPE: V3 interleaved (apply_rotary_pos_emb_interleave: cos/sin [1,s,dr] in the stream dtype),
    V2 complex (apply_rotary_emb: freqs_cis complex64 [1,s,dr/2], 8 bytes per element). query = cat(q_nope, q_rot).
    eager: the llama eager with dq = dn + dr, dv. sdpa: dq != dv, so the CPU flash kernel is not eligible and SDPA
    takes the math path, which computes in fp32 even for bf16 inputs: saves q*sqrt(scale) and k*sqrt(scale)
    [b*a,s,dq] fp32, the fp32 (safe) softmax [b,a,s,s] and v [b*a,s,dv] fp32, then o_proj its input.
    MoE: see router_terms (V3: sigmoid, V2: fp32 softmax), layers < first_k_dense_replace dense."""
    t = Terms()
    cfg = x.cfg
    T, h, a, s, b, L = x.T, x.h, x.a, x.s, x.b, x.L
    hb, cb = x.hb, x.cb
    ql, r = cfg.get("q_lora_rank"), cfg["kv_lora_rank"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    dq = dn + dr
    v3 = x.mt in ("deepseek_v3", "deepseek_v32")  # deepseek_v32 = V3's MLA/MoE + the no_grad DSA indexer
    v32 = x.mt == "deepseek_v32"
    lay = "model.layers.*"
    att = lay + ".self_attn"
    t.add("model.embed_tokens", "input_ids int64", I64 * T)
    rope_bytes = 2 * hb * s * dr if v3 else 8 * s * (dr // 2)
    if x.ckpt:
        # deepseek_v32 builds its causal mask even for sdpa (allow_is_causal_skip=False: the indexer needs it)
        ckpt_terms(t, x, lay, eager_masks=1, sdpa_masks=1 if v32 else 0,
                   extra=[(lay, "closure: position_embeddings (cos+sin [1,s,dr] / "
                                "freqs_cis complex64 [1,s,dr/2])", rope_bytes)])
    else:
        rms_terms(t, x, lay + ".input_layernorm", L, T, h, hb)
        first = att + (".q_a_proj" if ql else ".q_proj")
        if x.amp:
            amp_cast(t, x, first, T, h, L)
            amp_cast(t, x, att + ".kv_a_proj_with_mqa", T, h, L)
        else:
            t.add(first, "norm output = q_a_proj/q_proj and kv_a_proj_with_mqa input [T,h]", hb * T * h, L)
        if ql:
            amp_weight(t, x, att + ".q_a_proj", h, ql, L)
            rms_terms(t, x, att + ".q_a_layernorm", L, T, ql, cb)
            t.add(att + ".q_b_proj", "q_a_layernorm output = q_b_proj input [T,q_lora_rank]", cb * T * ql, L)
            amp_weight(t, x, att + ".q_b_proj", ql, a * dq, L)
        else:
            amp_weight(t, x, att + ".q_proj", h, a * dq, L)
        amp_weight(t, x, att + ".kv_a_proj_with_mqa", h, r + dr, L)
        kvn = att + ".kv_a_layernorm"
        if cb == F32:
            t.add(kvn, "kv_a_layernorm: fp32 input = the kv_nope slice: whole [T, r+dr] storage", F32 * T * (r + dr), L)
        else:
            t.add(kvn, "kv_a_layernorm: fp32 copy of the kv_nope slice [T,r]", F32 * T * r, L)
        t.add(kvn, "kv_a_layernorm: rsqrt [T] fp32", F32 * T, L)
        t.add(kvn, "kv_a_layernorm: normalised x in the input dtype [T,r]", cb * T * r, L)
        t.add(att + ".kv_b_proj", "kv_a_layernorm output = kv_b_proj input [T,r]", cb * T * r, L)
        amp_weight(t, x, att + ".kv_b_proj", r, a * (dn + dv), L)
        t.add(att, "RoPE: cos+sin [1,s,dr] (V3, stream dtype) / freqs_cis complex64 [1,s,dr/2] (V2)", rope_bytes)
        o_mod = att + ".o_proj"
        # b = 1: the bmm can view v ([1,a,s,dv] strided into the kv_b_proj output) as [a,s,dv], so it saves the
        # whole kv_b_proj output [T, a*(dn+dv)] instead of a [b*a,s,dv] copy (unless math sdpa converts it to fp32).
        v_whole = x.b == 1 and (x.attn == "eager" or cb == F32)
        if x.attn == "sdpa":
            t.add(att, "math sdpa: q*sqrt(scale) [b*a,s,dq] fp32", F32 * T * a * dq, L)
            t.add(att, "math sdpa: k*sqrt(scale) [b*a,dq,s] fp32", F32 * T * a * dq, L)
            t.add(att, "math sdpa: safe softmax [b,a,s,s] fp32", F32 * b * a * s * s, L)
            if v_whole:
                t.add(att, "math sdpa: v = the whole kv_b_proj output (b = 1 view)", F32 * T * a * (dn + dv), L)
            else:
                t.add(att, "math sdpa: v [b*a,s,dv] fp32", F32 * T * a * dv, L)
            t.add(o_mod, "o_proj input [T,a*dv]", cb * T * a * dv, L)
        else:
            eager_terms(t, x, att, L, a=a, dq=dq, dv=dv, o_mod=o_mod,
                        v_storage=cb * T * a * (dn + dv) if v_whole else None)
        amp_weight(t, x, o_mod, a * dv, h, L)
        rms_terms(t, x, lay + ".post_attention_layernorm", L, T, h, hb)
        dense, moe = moe_dense_split(x)
        m = lay + ".mlp"
        swiglu_terms(t, x, m, dense, T, h, x.f, in_bytes=hb)
        moe_layers_terms(t, x, m, moe, router="sigmoid" if v3 else "softmax_fp32",
                         norm_topk=cfg.get("norm_topk_prob"), fe=x.fe, shared_f=x.fe * cfg["n_shared_experts"])
    rms_terms(t, x, "model.norm", 1, T, h, hb)
    lm_head_terms(t, x, "lm_head", hb)
    loss_terms(t, x)
    return t


# ----------------------------------------------------------------------------------------------------------------------
# gpt-oss
# ----------------------------------------------------------------------------------------------------------------------

def gpt_oss(rec, x: Dims):
    """gpt_oss/modeling_gpt_oss.py. GptOssRMSNorm: (weight * x_fp32).to(dtype) -> the olmo2 norm (fp32 normalised x).
    GptOssAttention: q/k/v/o with bias, RoPE on the two halves (_apply_rotary_emb: cos/sin are [1,s,d/2], no cat of
    freqs), sliding (layer_types) and full layers (the additive masks are not saved by eager), eager_attention_forward
    with attention sinks: cat([scores, sinks]) -> [b,a,s,s+1], minus its max (MaxBackward0 keeps the argmax indices
    [b,a,s,1] int64), softmax in that dtype (bf16 in bf16 models, fp32 under autocast because the fp32 sinks promote
    the cat) saved [b,a,s,s+1], probs[..., :-1] a view of it (under autocast `.to(v.dtype)` makes the bf16 [b,a,s,s]
    copy that probs@v saves). transformers 5.24 refuses sdpa for gpt_oss (_supports_sdpa = False).
    GptOssTopKRouter: linear with bias (input = the norm output), topk indices [T,K], softmax over the top-k logits
    in their dtype [T,K] = the routing weights. GptOssExperts (grouped_mm, is_concatenated=False, has_bias):
    4 int64 [S] indices (perm//K, perm, inverse, and expert_ids_g gathering the biases), offsets, gathered input,
    gate_up [S,2fe] (clamp of the gate view saves the whole storage; up is a view too), sigmoid(alpha*gate) [S,fe],
    clamped gate [S,fe], up + 1 [S,fe], glu [S,fe], (up+1)*glu = down input [S,fe], routing weights [S,1], down
    output [S,h]: the clamped SwiGLU keeps 5 [S,fe] tensors where SwiGLU keeps 2."""
    t = Terms()
    T, h, a, k, d, s, b, L = x.T, x.h, x.a, x.k, x.d, x.s, x.b, x.L
    hb, cb = x.hb, x.cb
    fe, E, K = x.f, x.E, x.K  # gpt-oss intermediate_size is the expert width
    S = T * K
    lay = "model.layers.*"
    att = lay + ".self_attn"
    types = layer_types(x)
    t.add("model.embed_tokens", "input_ids int64", I64 * T)
    if x.ckpt:
        ckpt_terms(t, x, lay, rope_dims=[d // 2], eager_masks=2 if "sliding" in types else 1)
    else:
        rms_terms(t, x, lay + ".input_layernorm", L, T, h, hb, "olmo2")
        if x.amp:
            for nm, out in (("q_proj", a * d), ("k_proj", k * d), ("v_proj", k * d)):
                amp_cast(t, x, att + "." + nm, T, h, L)
                amp_weight(t, x, att + "." + nm, h, out, L)
        else:
            t.add(att + ".q_proj", "norm output = q/k/v input [b,s,h]", hb * T * h, L)
        rope_terms(t, x, att, d // 2)
        t.add(att, "eager q [b,a,s,d]", cb * T * a * d, L)
        t.add(att, "eager k repeated [b,a,s,d]", cb * T * a * d, L)
        t.add(att, "max(cat(scores, sinks)) indices [b,a,s,1] int64", I64 * b * a * s, L)
        sm = F32 if x.amp else x.p
        t.add(att, "softmax over [scores, sink] [b,a,s,s+1] (fp32 under autocast, else model dtype)",
              sm * b * a * s * (s + 1), L)
        if x.amp:
            t.add(att, "probs[..., :-1].to(bf16) [b,a,s,s] (probs@v self)", BF16 * b * a * s * s, L)
        t.add(att, "eager v repeated [b,a,s,d]", cb * T * a * d, L)
        t.add(att + ".o_proj", "o_proj input [b,s,a*d]", cb * T * a * d, L)
        amp_weight(t, x, att + ".o_proj", a * d, h, L)
        rms_terms(t, x, lay + ".post_attention_layernorm", L, T, h, hb, "olmo2")
        r = lay + ".mlp.router"
        if x.amp:
            amp_cast(t, x, r, T, h, L, "router input")
        else:
            t.add(r, "norm output = router input [T,h]", hb * T * h, L)
        amp_weight(t, x, r, h, E, L, "router")
        t.add(r, "router topk indices [T,K] int64", I64 * T * K, L)
        t.add(r, "softmax of the top-k logits = routing weights [T,K] (router dtype)", x.cb * T * K, L)
        ex = lay + ".mlp.experts"
        ep = F32 if x.amp else x.p
        t.add(ex, "4 index tensors (perm//K, perm, inverse, expert ids for the biases) [S] int64", 4 * I64 * S, L)
        t.add(ex, "grouped_mm offsets [E] int32", I32 * E, L)
        t.add(ex, "gathered tokens = up grouped_mm input [S,h]", ep * S * h, L)
        t.add(ex, "gate_up output [S,2fe] (clamp of the gate view)", ep * S * 2 * fe, L)
        for what in ("sigmoid(alpha*gate)", "clamped gate", "up + 1", "glu = gate*sigmoid",
                     "(up+1)*glu = down grouped_mm input"):
            t.add(ex, f"{what} [S,fe]", ep * S * fe, L)
        t.add(ex, "routing weights [S,1]", x.cb * S, L)
        t.add(ex, "down output + bias [S,h] (weighting mul self)", ep * S * h, L)
    rms_terms(t, x, "model.norm", 1, T, h, hb, "olmo2")
    lm_head_terms(t, x, "lm_head", hb)
    loss_terms(t, x)
    return t


# ----------------------------------------------------------------------------------------------------------------------
# Llama 4 (text)
# ----------------------------------------------------------------------------------------------------------------------

def llama4_text(rec, x: Dims):
    """llama4/modeling_llama4.py. Llama4TextRMSNorm: _norm(x.float()).type_as(x) * weight -> 4E + 4R + in*E like
    llama. Llama4TextAttention: RoPE layers (no_rope_layers[i] = 1) rotate q and k as complex numbers
    (apply_rotary_emb: freqs_cis complex64 [1,s,1,d/2] = 4*s*d bytes, once for the model) and then apply the
    weightless Llama4TextL2Norm to q and k (use_qk_norm: fp32 copy + rsqrt each); NoPE layers with
    attn_temperature_tuning scale q by an fp32 [1,s,1,1] per-position factor (saved once per NoPE layer). Chunked
    layers (RoPE layers when attention_chunk_size is set, layer_types 'chunked_attention') get a real mask when
    s > attention_chunk_size (sdpa: mask + K/V repeated to a heads), full layers none (sdpa: GQA). eager softmax has no
    dtype= (model dtype; fp32 under autocast plus the bf16 cast for probs@v). Feed-forward: layers in moe_layers
    (every interleave_moe_layer_step-th) use Llama4TextMoe: Llama4Router (a Linear: input = the norm output, shared
    with the shared expert) -> topk indices [T,K] -> scores scattered into [T,E] -> sigmoid(.float()) fp32 [T,E] ->
    routed_in = x.repeat(E,1) [E*T,h] * scores [E*T,1] (a copy of the transposed scores in the router dtype): EVERY
    expert processes EVERY token (dense compute, no dispatch); Llama4TextExperts bmm on [E,T,h]: input, gate_up
    [E,T,2fe] (silu saves the gate view), act(gate) [E,T,fe], down input [E,T,fe] (bmm autocasts: bf16 casts and
    weight copies under autocast); plus shared_expert (SwiGLU of width intermediate_size). Dense layers:
    Llama4TextMLP with intermediate_size_mlp."""
    t = Terms()
    cfg = x.cfg
    T, h, a, k, d, s, b, L, E, K = x.T, x.h, x.a, x.k, x.d, x.s, x.b, x.L, x.E, x.K
    hb, cb = x.hb, x.cb
    fe, fd = cfg["intermediate_size"], cfg["intermediate_size_mlp"]
    rope = [bool(v) for v in cfg["no_rope_layers"][:L]]
    types = layer_types(x)
    moe = set(cfg.get("moe_layers") or [])
    n_rope, n_nope = sum(rope), L - sum(rope)
    n_chunk_masked = sum(1 for ty in types if masked(x, ty))
    n_moe = sum(1 for i in range(L) if i in moe)
    n_dense = L - n_moe
    lay = "model.layers.*"
    att = lay + ".self_attn"
    ff = lay + ".feed_forward"
    t.add("model.embed_tokens", "input_ids int64", I64 * T)
    if x.ckpt:
        ckpt_terms(t, x, lay, eager_masks=2 if "chunked" in types and "full" in types else 1,
                   sdpa_masks=1 if n_chunk_masked else 0, sdpa_mask_batched=True,
                   extra=[(lay, "closure: freqs_cis complex64 [1,s,d/2]", 8 * s * d // 2)])
    else:
        rms_terms(t, x, lay + ".input_layernorm", L, T, h, hb)
        if x.amp:
            for nm, out in (("q_proj", a * d), ("k_proj", k * d), ("v_proj", k * d)):
                amp_cast(t, x, att + "." + nm, T, h, L)
                amp_weight(t, x, att + "." + nm, h, out, L)
        else:
            t.add(att + ".q_proj", "norm output = q/k/v input [b,s,h]", hb * T * h, L)
        if n_rope:
            t.add(att, "freqs_cis complex64 [1,s,1,d/2] (complex RoPE, once)", 8 * s * d // 2)
            if cfg.get("use_qk_norm"):
                rms_terms(t, x, att + ".qk_norm", n_rope, T * a, d, cb, "l2")
                rms_terms(t, x, att + ".qk_norm", n_rope, T * k, d, cb, "l2")
        if cfg.get("attn_temperature_tuning") and n_nope:
            t.add(att, "NoPE attention temperature scales [1,s,1,1] fp32 (per NoPE layer)", F32 * s, n_nope)
        if x.attn == "sdpa":
            sdpa_terms(t, x, att, n_chunk_masked, a=a, kv=k, dq=d, mask=True)
            sdpa_terms(t, x, att, L - n_chunk_masked, a=a, kv=k, dq=d, mask=False)
        else:
            eager_terms(t, x, att, L, a=a, dq=d, o_mod=att + ".o_proj", softmax="native")
        amp_weight(t, x, att + ".o_proj", a * d, h, L)
        rms_terms(t, x, lay + ".post_attention_layernorm", L, T, h, hb)
        swiglu_terms(t, x, ff, n_dense, T, h, fd, in_bytes=hb, act_mod=".activation_fn")
        if n_moe:
            r = ff + ".router"
            if x.amp:
                amp_cast(t, x, r, T, h, n_moe, "router input")
            else:
                t.add(r, "norm output = router (and shared expert) input [T,h]", hb * T * h, n_moe)
            amp_weight(t, x, r, h, E, n_moe, "router")
            t.add(r, "router topk indices [T,K] int64", I64 * T * K, n_moe)
            t.add(r, "sigmoid(scores.float()) [T,E] fp32", F32 * T * E, n_moe)
            t.add(ff, "scores transposed to [E*T,1] (router dtype copy)", cb * E * T, n_moe)
            t.add(ff, "routed_in = x.repeat(E,1) [E*T,h] (stream dtype)", hb * E * T * h, n_moe)
            ex = ff + ".experts"
            if x.amp:
                t.add(ex, "bf16 cast of routed_in*scores [E,T,h] (bmm input)", BF16 * E * T * h, n_moe)
                t.add(ex, "autocast bf16 copy of gate_up_proj [E,h,2fe]", BF16 * E * h * 2 * fe, n_moe)
                t.add(ex, "autocast bf16 copy of down_proj [E,fe,h]", BF16 * E * fe * h, n_moe)
            else:
                t.add(ex, "routed_in*scores = gate_up bmm input [E,T,h]", cb * E * T * h, n_moe)
            t.add(ex + ".act_fn", "gate_up output [E,T,2fe] (silu saves the gate view)", cb * E * T * 2 * fe, n_moe)
            t.add(ex, "act(gate) [E,T,fe]", cb * E * T * fe, n_moe)
            t.add(ex, "up*act(gate) = down bmm input [E,T,fe]", cb * E * T * fe, n_moe)
            swiglu_terms(t, x, ff + ".shared_expert", n_moe, T, h, fe, in_bytes=hb, act_mod=".activation_fn",
                         input_saved=False)
    rms_terms(t, x, "model.norm", 1, T, h, hb)
    lm_head_terms(t, x, "lm_head", hb)
    loss_terms(t, x)
    return t


# ----------------------------------------------------------------------------------------------------------------------
# Qwen3-Next (gated DeltaNet + gated attention)
# ----------------------------------------------------------------------------------------------------------------------

DELTANET_CHUNK = 64  # torch_chunk_gated_delta_rule(chunk_size=64)


def deltanet_terms(t: Terms, x: Dims, la, n_layers):
    """qwen3_next/modeling_qwen3_next.py Qwen3NextGatedDeltaNet.forward with the pure-torch fallbacks (no fla /
    causal-conv1d installed): causal_conv1d_fn and torch_chunk_gated_delta_rule (chunk C = 64, s padded to
    s_p = n*C). Symbols: Hk/Hv = linear_num_key/value_heads, dk/dv = linear_key/value_head_dim, cd = 2*Hk*dk + Hv*dv
    (conv channels), Kc = linear_conv_kernel_dim. Everything inside the kernel is fp32 (`.to(torch.float32)`).
    The recurrence over chunks: chunk 0 reads the zero initial state (which needs no gradient) and the last
    chunk's state update feeds only the discarded final state (its graph is dead and freed), so the per-chunk terms
    are n state matrices, and the decayed q/k and chunk decays only from n = 2 on.
    fp32 models without padding: `.to(float32, memory_format=contiguous_format)` returns the transposed input
    unchanged, so the chunk matmuls copy their operands: 4 extra [b,Hv,s,dk] copies and per-chunk copies of the
    decayed q/k instead of their whole storages."""
    cfg = x.cfg
    b, s, T, h = x.b, x.s, x.T, x.h
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, Kc = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    C = DELTANET_CHUNK
    n = -(-s // C)
    sp = n * C
    cd = 2 * Hk * dk + Hv * dv
    cb, hb = x.cb, x.hb
    N = n_layers
    split = x.mt in ("qwen3_5_text", "qwen3_5_moe_text")  # Qwen3_5GatedDeltaNet: 4 projections, not 2
    if split:
        projs = (("in_proj_qkv", cd), ("in_proj_z", Hv * dv), ("in_proj_b", Hv), ("in_proj_a", Hv))
    else:
        projs = (("in_proj_qkvz", 2 * Hk * dk + 2 * Hv * dv), ("in_proj_ba", 2 * Hv))
    if x.amp:
        for nm, out in projs:
            amp_cast(t, x, la + "." + nm, T, h, N)
            amp_weight(t, x, la + "." + nm, h, out, N)
    else:
        t.add(la + "." + projs[0][0], "norm output = the in_proj_* input [T,h]", hb * T * h, N)
    t.add(la, "conv1d input = cat(q,k,v) [b,cd,s]", cb * b * cd * s, N)
    if x.amp:
        t.add(la, "autocast bf16 copy of the conv1d weight [cd,1,Kc]", BF16 * cd * Kc, N)
    t.add(la, "conv1d output (padded, sliced [..., :s]) = silu input [b,cd,s+Kc-1]", cb * b * cd * (s + Kc - 1), N)
    t.add(la, "beta = sigmoid(b) [b,s,Hv]", cb * b * s * Hv, N)
    t.add(la, "exp(A_log) [Hv] fp32 and -exp(A_log) [Hv] fp32", 2 * F32 * Hv, N)
    t.add(la, "softplus input a.float()+dt_bias and output [b,s,Hv] fp32", 2 * F32 * b * s * Hv, N)
    f4 = F32 * b * Hv
    t.add(la, "l2norm inputs q, k (repeat_interleave'd to Hv heads) [b,Hv,s,dk] fp32 x2", 2 * f4 * s * dk, N)
    t.add(la, "l2norm rsqrt [b,Hv,s,1] fp32 x2", 2 * f4 * s, N)
    t.add(la, "beta padded [b,Hv,s_p] fp32", f4 * sp, N)
    t.add(la, "key, value padded [b,Hv,s_p,dk|dv] fp32", f4 * sp * (dk + dv), N)
    t.add(la, "strictly upper mask [C,C] bool", BOOL * C * C, N)
    f2 = BF16 * b * Hv
    if not x.amp:
        t.add(la, "pairwise decay exp, k_beta@k^T, q@k^T, ut_system, intra_chunk_attn [b,Hv,n,C,C] fp32 x5",
              5 * f4 * n * C * C, N)
        t.add(la, "k_beta, query [b,Hv,s_p,dk] fp32 x2", 2 * f4 * sp * dk, N)
    else:
        # autocast: every matmul casts its operands to bf16 (new copies) and returns bf16
        t.add(la, "pairwise decay exp, ut_system [b,Hv,n,C,C] fp32 x2 (intra is kept only as bf16 slice casts)",
              2 * f4 * n * C * C, N)
        t.add(la, "k_beta@k^T, q@k^T products [b,Hv,n,C,C] bf16 x2", 2 * f2 * n * C * C, N)
        t.add(la, "k_beta, query [b,Hv,s_p,dk] fp32 x2 (saved by the decay muls)", 2 * f4 * sp * dk, N)
        t.add(la, "bf16 casts of k_beta, query and twice of key [b,Hv,s_p,dk]", 4 * f2 * sp * dk, N)
    t.add(la, "cum_decay.exp() x2 (+ the key decay when n >= 2) [b,Hv,s_p] fp32",
          (2 + (n >= 2)) * f4 * sp, N)
    t.add(la, "solve_triangular results new_values, k_cumdecay [b,Hv,s_p,dv|dk] fp32", f4 * sp * (dv + dk), N)
    t.add(la, "chunk_decay [b,Hv,n] fp32 (n >= 2)", f4 * n if n >= 2 else 0, N)
    if x.amp:
        t.add(la, "chunk loop: bf16 casts of the state (2 per chunk) [b*Hv,dk,dv]", 2 * n * f2 * dk * dv, N)
        t.add(la, "chunk loop: fp32 states S_0..S_{n-2} (state-update mul)", (n - 1) * f4 * dk * dv, N)
        t.add(la, "chunk loop: bf16 casts of v_new (n for intra@v_new, n-1 for the updates) [b*Hv,C,dv]",
              (2 * n - 1) * f2 * C * dv, N)
        t.add(la, "chunk loop: bf16 casts of intra_chunk_attn slices [b*Hv,C,C]", n * f2 * C * C, N)
        t.add(la, "chunk loop: bf16 casts of k_cumdecay_i, query_i (i >= 1) and key_i (i <= n-2) [b*Hv,C,dk]",
              3 * (n - 1) * f2 * C * dk, N)
    else:
        t.add(la, "recurrent states S_0..S_{n-1} [b*Hv,dk,dv] fp32", n * f4 * dk * dv, N)
        t.add(la, "v_new per chunk [b*Hv,C,dv] fp32 x n", f4 * sp * dv, N)
        fp32_transposed = x.p == F32 and s % C == 0
        if fp32_transposed and (b > 1 or n > 1):
            t.add(la, "fp32, s % 64 == 0: matmul copies of key^T x2, of k_beta and query [b,Hv,s,dk]",
                  4 * f4 * s * dk, N)
        if fp32_transposed and b > 1:
            t.add(la, "decayed query, key: per-chunk copies for chunks 1..n-1 [b*Hv,C,dk] x2",
                  2 * f4 * (n - 1) * C * dk, N)
        elif n >= 2:
            t.add(la, "decayed query, key (read by chunks 1..n-1) [b,Hv,s_p,dk] fp32 x2", 2 * f4 * sp * dk, N)
    nrm = la + ".norm"
    R = T * Hv
    t.add(nrm, "gated norm: fp32 input, fp32 silu(z.float()) input and output [T*Hv,dv] x3", 3 * F32 * R * dv, N)
    t.add(nrm, "gated norm: rsqrt [T*Hv] fp32", F32 * R, N)
    t.add(nrm, "gated norm: normalised x in the kernel output dtype [T*Hv,dv]", cb * R * dv, N)
    t.add(nrm, "gated norm: weight * x (fp32 under autocast: fp32 weight) [T*Hv,dv]", x.p * R * dv, N)
    t.add(la + ".out_proj", "out_proj input [T,Hv*dv]", cb * T * Hv * dv, N)
    amp_weight(t, x, la + ".out_proj", Hv * dv, h, N)


def qwen3_next(rec, x: Dims):
    """qwen3_next/modeling_qwen3_next.py Qwen3NextDecoderLayer: layer_types 'linear_attention' (Qwen3NextGatedDeltaNet,
    see deltanet_terms) or 'full_attention' (Qwen3NextAttention: q_proj emits q and a gate [b,s,a,2d]; q_norm/k_norm
    are gemma-style (1+w) RMSNorms per head (in fp32 models q_norm's pow saves the whole q_proj output, of which q is
    a view); partial RoPE with cat -> [b,a,s,d]-contiguous q; attention output * sigmoid(gate) keeps the sigmoid
    result and the transposed output copy; o_proj input = the product); Qwen3NextRMSNorm = (1+w) gemma norm;
    Qwen3NextSparseMoeBlock on every layer (mlp_only_layers empty): shared expert + sigmoid shared_expert_gate +
    softmax router with norm_topk_prob."""
    t = Terms()
    cfg = x.cfg
    T, h, a, k, d, s, b, L = x.T, x.h, x.a, x.k, x.d, x.s, x.b, x.L
    hb, cb = x.hb, x.cb
    types = cfg["layer_types"][:L]
    n_lin = sum(1 for ty in types if ty == "linear_attention")
    n_att = L - n_lin
    lay = "model.layers.*"
    rot = int(d * x.prf)
    # Qwen3.5's text rotary embedding is M-RoPE (Qwen3VLTextRotaryEmbedding, interleaved sections): text position
    # ids are expanded to [3, b, s], so cos/sin are [b, s, rot], not [1, s, rot]
    rope_b = b if x.mt in ("qwen3_5_text", "qwen3_5_moe_text") else 1
    t.add("model.embed_tokens", "input_ids int64", I64 * T)
    if x.ckpt:
        ckpt_terms(t, x, lay, rope_dims=[rot * rope_b], eager_masks=1)
    else:
        rms_terms(t, x, lay + ".input_layernorm", L, T, h, hb, "gemma")
        deltanet_terms(t, x, lay + ".linear_attn", n_lin)
        att = lay + ".self_attn"
        if x.amp:
            for nm, out in (("q_proj", 2 * a * d), ("k_proj", k * d), ("v_proj", k * d)):
                amp_cast(t, x, att + "." + nm, T, h, n_att)
                amp_weight(t, x, att + "." + nm, h, out, n_att)
        else:
            t.add(att + ".q_proj", "norm output = q/k/v input [T,h]", hb * T * h, n_att)
        qn = att + ".q_norm"
        q_in = F32 * T * a * (2 * d if cb == F32 else d)
        t.add(qn, "q_norm fp32 input (fp32 models: the whole q_proj output [T,a,2d])", q_in, n_att)
        t.add(qn, "q_norm rsqrt, 1+w, normalised x fp32", F32 * T * a + F32 * d + F32 * T * a * d, n_att)
        rms_terms(t, x, att + ".k_norm", n_att, T * k, d, cb, "gemma")
        if n_att:
            rope_terms(t, x, att, rot * rope_b)
        o_mod = att + ".o_proj"
        if x.attn == "sdpa":
            sdpa_terms(t, x, att, n_att, a=a, kv=k, dq=d, o_copy=True, o_mod=att)
        else:
            eager_terms(t, x, att, n_att, a=a, dq=d, o_mod=att)
        t.add(att, "sigmoid(gate) [b,s,a*d]", cb * T * a * d, n_att)
        t.add(o_mod, "attn_output * sigmoid(gate) = o_proj input [T,a*d]", cb * T * a * d, n_att)
        amp_weight(t, x, o_mod, a * d, h, n_att)
        rms_terms(t, x, lay + ".post_attention_layernorm", L, T, h, hb, "gemma")
        if x.mt == "qwen3_5_text":  # Qwen3_5MLP (dense SwiGLU, intermediate_size) on every layer
            swiglu_terms(t, x, lay + ".mlp", L, T, h, x.f, in_bytes=hb)
        else:
            qwen_moe_mlp(t, x, rec)
    rms_terms(t, x, "model.norm", 1, T, h, hb, "gemma")
    lm_head_terms(t, x, "lm_head", hb)
    loss_terms(t, x)
    return t


# ----------------------------------------------------------------------------------------------------------------------
# Mamba-2 hybrids (issue 25): falcon_h1, granitemoehybrid
# ----------------------------------------------------------------------------------------------------------------------

def mamba2_terms(t: Terms, x: Dims, mm, n_layers, *, mup, out_mod=None):
    """The Mamba-2 mixer on transformers' torch path (no mamba_ssm / causal_conv1d installed):
    falcon_h1/modeling_falcon_h1.py FalconH1Mixer.forward (mup=True) and granitemoehybrid/modeling_granitemoehybrid.py
    GraniteMoeHybridMambaLayer.forward (mup=False), both calling causal_conv1d_fn (F.conv1d + silu) and
    mamba2_chunk_scan (the SSD "torch_forward": chunked scan with segment_sum). Symbols: H = mamba_n_heads,
    P = mamba_d_head, N = mamba_d_state, G = mamba_n_groups, d = H*P (mamba_d_ssm), cd = d + 2*G*N (conv channels),
    Din = d + cd + H (in_proj width), Kc = mamba_d_conv, C = mamba_chunk_size, n = ceil(s/C), sp = n*C (padded).
    Inside the scan everything is fp32 (`.float()`), except that under autocast every einsum runs as a bf16 bmm
    (e = 2), else e = 4. m = bytes of the in_proj output as the mixer uses it: falcon multiplies it by the fp32
    mup_vector buffer (fp32 under autocast), granite uses it as is (bf16 under autocast)."""
    cfg = x.cfg
    b, s, T, h, p = x.b, x.s, x.T, x.h, x.p
    H, P, N, G = cfg["mamba_n_heads"], cfg["mamba_d_head"], cfg["mamba_d_state"], cfg["mamba_n_groups"]
    Kc, C = cfg["mamba_d_conv"], cfg["mamba_chunk_size"]
    d = H * P
    cd = d + 2 * G * N
    Din = d + cd + H
    n = -(-s // C)
    sp = n * C
    amp, hb, cb = x.amp, x.hb, x.cb
    e = BF16 if amp else F32
    m = (F32 if mup else BF16) if amp else p
    NL = n_layers
    if amp:
        amp_cast(t, x, mm + ".in_proj", T, h, NL)
    else:
        t.add(mm + ".in_proj", "mixer input [T,h] (falcon: x * ssm_in_multiplier, a new tensor)", hb * T * h, NL)
    amp_weight(t, x, mm + ".in_proj", h, Din, NL)
    t.add(mm, "A = -exp(A_log.float()): exp result and A [H] fp32", 2 * F32 * H, NL)
    if amp:
        t.add(mm, "conv1d input: autocast's bf16 copy of the xBC slice [b,cd,s]", BF16 * b * cd * s, NL)
        if mup:
            t.add(mm, "silu(gate) input = the whole fp32 in_proj*mup_vector output [T,Din]", F32 * T * Din, NL)
    else:
        t.add(mm, "conv1d input = a view of the in_proj output: the whole [T,Din] storage", m * T * Din, NL)
    amp_weight(t, x, mm, cd, Kc, NL, "conv1d weight")
    cw = BF16 if amp else p
    t.add(mm, "conv1d output (padding Kc-1, sliced [:s]) = silu input [b,cd,s+Kc-1]", cw * b * cd * (s + Kc - 1), NL)
    t.add(mm, "dt + dt_bias (softplus input) and softplus output (clamp input) [b,s,H]", 2 * m * T * H, NL)
    if m == BF16:  # bf16 models, and granite under autocast (the conv output is cast back to the bf16 input dtype)
        t.add(mm, "x.float() copy [b,s,H,P] fp32 (x * dt self)", F32 * T * d, NL)
        t.add(mm, "dt[..., None].float() and dt.float() copies [b,s,H] fp32", 2 * F32 * T * H, NL)
    else:
        t.add(mm, "x = the fp32 silu output [b,cd,s] (fp32 model: .float() no-op; falcon under autocast: its "
                  ".to(fp32) copy)", F32 * b * cd * s, NL)
        t.add(mm, "dt.float() = the clamp output [b,s,H] fp32", F32 * T * H, NL)
    t.add(mm, "F.pad(x) for D_residual [b,sp,H,P] fp32 (a copy even when the pad is 0)", F32 * b * sp * d, NL)
    t.add(mm, "segment_sum masks ~tril [C,C] x2 and [n+1,n+1] x2 bool", 2 * C * C + 2 * (n + 1) ** 2, NL)
    t.add(mm, "L = exp(segment_sum(A)) [b,H,n,C,C] fp32", F32 * b * H * sp * C, NL)
    t.add(mm, "G = einsum(C, B): bmm operands B^T and C [b*n*H, C, N], and C again for C_times_states",
          3 * e * b * sp * H * N, NL)
    t.add(mm, "G (M = G * L self) [b,n,C,C,H]", e * b * sp * C * H, NL)
    t.add(mm, "Y_diag = einsum(M, x*dt): M copy [b*n*H,C,C] and x*dt chunks [b*n*H,C,P]", e * b * sp * (C * H + d), NL)
    t.add(mm, "exp(A_cumsum[-1:] - A_cumsum) and exp(A_cumsum) [b,H,n,C] fp32", 2 * F32 * b * H * sp, NL)
    t.add(mm, "B (padded, repeated to H heads) [b,n,C,H,N] fp32 (B_decay = B * decay self)", F32 * b * sp * H * N, NL)
    t.add(mm, "states = einsum(B_decay, x*dt): B_decay [b*n*H,C,N] and x^T [b*n*H,P,C]", e * b * sp * (H * N + d), NL)
    t.add(mm, "decay_chunk = exp(segment_sum(pad(A_cumsum[..., -1]))) [b,H,n+1,n+1] fp32", F32 * b * H * (n + 1) ** 2,
          NL)
    if amp:
        t.add(mm, "decay_chunk bf16 cast for the bmm [b*H,n+1,n+1]", BF16 * b * H * (n + 1) ** 2, NL)
    t.add(mm, "new_states = einsum(decay_chunk, states): states [b*H, n+1, P*N]", e * b * H * (n + 1) * P * N, NL)
    t.add(mm, "C_times_states = einsum(C, states[:, :-1]): states [b*n*H, N, P]", e * b * n * H * N * P, NL)
    t.add(mm, "C_times_states [b,n,C,H,P] (Y_off mul self)", e * b * sp * d, NL)
    t.add(out_mod or mm, "scan output (y + D_residual, padded storage) [b,sp,H,P] fp32 (gate mul / norm input)",
          F32 * b * sp * d, NL)
    return m, d


def falcon_h1(rec, x: Dims):
    """falcon_h1/modeling_falcon_h1.py FalconH1DecoderLayer.forward: input_layernorm (llama RMSNorm); the Mamba-2 mixer
    (mamba2_terms, then `scan_output * silu(gate)` and out_proj(scan_output.to(dtype))) and GQA attention run in
    parallel on the same normed input, each on its own scaled copy (`x * ssm_in_multiplier`,
    `x * attention_in_multiplier`: new tensors, saved by in_proj and q/k/v); pre_ff_layernorm; SwiGLU MLP with
    `act(gate_proj(x) * gate_multiplier)` (the silu input is the product, same bytes as llama's)."""
    t = Terms()
    T, h, a, k, d, f, L = x.T, x.h, x.a, x.k, x.d, x.f, x.L
    hb, cb, amp = x.hb, x.cb, x.amp
    lay = "model.layers.*"
    t.add("model.embed_tokens", "input_ids int64", I64 * T)
    if x.ckpt:
        ckpt_terms(t, x, lay, rope_dims=[d], eager_masks=1)
    else:
        rms_terms(t, x, lay + ".input_layernorm", L, T, h, hb)
        mm = lay + ".mamba"
        m, dm = mamba2_terms(t, x, mm, L, mup=True)
        t.add(mm, "silu(gate) [b,s,d] (gate mul other)", m * T * dm, L)
        if amp:
            amp_cast(t, x, mm + ".out_proj", T, dm, L)
        else:
            t.add(mm + ".out_proj", "out_proj input [T,d] (bf16: the .to(dtype) copy; fp32: the product)",
                  x.p * T * dm, L)
        amp_weight(t, x, mm + ".out_proj", dm, h, L)
        att = lay + ".self_attn"
        if amp:
            for nm, out in (("q_proj", a * d), ("k_proj", k * d), ("v_proj", k * d)):
                amp_cast(t, x, att + "." + nm, T, h, L)
                amp_weight(t, x, att + "." + nm, h, out, L)
        else:
            t.add(att + ".q_proj", "x * attention_in_multiplier = q/k/v input [T,h]", hb * T * h, L)
        rope_terms(t, x, att, d)
        if x.attn == "sdpa":
            sdpa_terms(t, x, att, L, a=a, kv=k, dq=d)
        else:
            eager_terms(t, x, att, L, a=a, dq=d, o_mod=att + ".o_proj")
        amp_weight(t, x, att + ".o_proj", a * d, h, L)
        rms_terms(t, x, lay + ".pre_ff_layernorm", L, T, h, hb)
        swiglu_terms(t, x, lay + ".feed_forward", L, T, h, f, in_bytes=hb, first="up_proj")
    rms_terms(t, x, "model.final_layernorm", 1, T, h, hb)
    lm_head_terms(t, x, "lm_head", hb)
    loss_terms(t, x)
    return t


def granitemoehybrid(rec, x: Dims):
    """granitemoehybrid/modeling_granitemoehybrid.py GraniteMoeHybridDecoderLayer.forward: input_layernorm; on
    "mamba" (linear_attention) layers GraniteMoeHybridMambaLayer (mamba2_terms without mup, then the gated
    GraniteMoeHybridRMSNormGated(scan_output, gate) in fp32 per group, then out_proj(scan_output.to(dtype))); on
    "attention" layers GQA attention without RoPE (position_embedding_type "nope"); residual * residual_multiplier;
    post_attention_layernorm; GraniteMoeHybridMoE (router: F.linear in the model dtype, .float(), top-k of the
    logits, softmax over the k values, .type_as(x)) + the shared GraniteMoeHybridMLP (input_linear h->2F, chunk,
    silu(first) * second, output_linear) on every layer."""
    t = Terms()
    cfg = x.cfg
    T, h, a, k, d, L, b = x.T, x.h, x.a, x.k, x.d, x.L, x.b
    hb, cb, amp = x.hb, x.cb, x.amp
    types = cfg["layer_types"][:L]
    n_m = sum(1 for ty in types if ty == "linear_attention")
    n_a = L - n_m
    lay = "model.layers.*"
    t.add("model.embed_tokens", "input_ids int64", I64 * T)
    rope = cfg.get("position_embedding_type") == "rope"
    if x.ckpt:
        # position_ids are not passed to the layers when there is no RoPE
        ckpt_terms(t, x, lay, rope_dims=[d] if rope else [], eager_masks=1, position_ids=rope)
    else:
        rms_terms(t, x, lay + ".input_layernorm", L, T, h, hb)
        mm = lay + ".mamba"
        G = cfg["mamba_n_groups"]
        nrm = mm + ".norm"
        m, dm = mamba2_terms(t, x, mm, n_m, mup=False, out_mod=nrm)
        if x.p != F32 or amp:
            t.add(nrm, "gated norm: gate.to(fp32) copy = silu input [b,s,d]", F32 * T * dm, n_m)
        t.add(nrm, "gated norm: silu(gate) [b,s,d] fp32 (mul other)", F32 * T * dm, n_m)
        t.add(nrm, "gated norm: x * silu(gate) [b,s,G,d/G] fp32 (pow self)", F32 * T * dm, n_m)
        t.add(nrm, "gated norm: rsqrt [b,s,G] fp32", F32 * T * G, n_m)
        t.add(nrm, "gated norm: normalised x fp32 (weight * x: mul other)", F32 * T * dm, n_m)
        if amp:
            amp_cast(t, x, mm + ".out_proj", T, dm, n_m)
        else:
            t.add(mm + ".out_proj", "out_proj input [T,d] (bf16: the .to(dtype) copy; fp32: the norm output)",
                  x.p * T * dm, n_m)
        amp_weight(t, x, mm + ".out_proj", dm, h, n_m)
        att = lay + ".self_attn"
        if amp:
            for nm, out in (("q_proj", a * d), ("k_proj", k * d), ("v_proj", k * d)):
                amp_cast(t, x, att + "." + nm, T, h, n_a)
                amp_weight(t, x, att + "." + nm, h, out, n_a)
        else:
            t.add(att + ".q_proj", "norm output = q/k/v input [T,h]", hb * T * h, n_a)
        if n_a and rope:
            rope_terms(t, x, att, d)
        if x.attn == "sdpa":
            sdpa_terms(t, x, att, n_a, a=a, kv=k, dq=d)
        else:
            eager_terms(t, x, att, n_a, a=a, dq=d, o_mod=att + ".o_proj")
        amp_weight(t, x, att + ".o_proj", a * d, h, n_a)
        rms_terms(t, x, lay + ".post_attention_layernorm", L, T, h, hb)
        moe = lay + ".block_sparse_moe"
        r = moe + ".router"
        E, K, S = x.E, x.K, T * x.K
        if amp:
            amp_cast(t, x, r, T, h, L, "router input")
            amp_cast(t, x, lay + ".shared_mlp.input_linear", T, h, L, "shared_mlp input")
        else:
            t.add(r, "post_attention_layernorm output = router and shared_mlp input [T,h]", hb * T * h, L)
        amp_weight(t, x, r, h, E, L, "router")
        t.add(r, "top-k indices of the fp32 logits [T,K] int64", I64 * T * K, L)
        t.add(r, "softmax over the top-k logits [T,K] fp32", F32 * T * K, L)
        # routing weights = softmax(...).type_as(router input): the stream dtype (fp32 under autocast)
        grouped_experts_terms(t, x, moe + ".experts", L, S, x.f, hb, rw_bytes=hb)
        sm = lay + ".shared_mlp"
        F2 = cfg["shared_intermediate_size"]
        amp_weight(t, x, sm + ".input_linear", h, 2 * F2, L)
        t.add(sm + ".activation", "input_linear output [T,2F] (silu saves the first chunk: the whole storage)",
              cb * T * 2 * F2, L)
        t.add(sm, "silu(first chunk) [T,F] (mul self)", cb * T * F2, L)
        t.add(sm + ".output_linear", "output_linear input [T,F]", cb * T * F2, L)
        amp_weight(t, x, sm + ".output_linear", F2, h, L)
    rms_terms(t, x, "model.norm", 1, T, h, hb)
    lm_head_terms(t, x, "lm_head", hb)
    loss_terms(t, x)
    return t


# ----------------------------------------------------------------------------------------------------------------------
# Kimi Linear (issue 25): KDA linear attention + NoPE MLA + MoE
# ----------------------------------------------------------------------------------------------------------------------

KDA_CHUNK = 64  # chunk_kimi_delta_attention(chunk_size=64)


def kda_terms(t: Terms, x: Dims, la, N):
    """kimi_linear/modeling_kimi_linear.py KimiLinearDeltaAttention.forward with the pure-torch fallbacks (no fla /
    causal-conv1d): causal_conv1d_fn on cat(q_proj, k_proj, v_proj) (silu), KimiLinearForgetGate (per-channel decay:
    -exp(A_log) * softplus(f_b_proj(f_a_proj(x)) + dt_bias), written as where(g > 20, g, log(1 + exp(g)))),
    beta = sigmoid(b_proj(x)), chunk_kimi_delta_attention (chunk C = 64, s padded to sp = n*C; everything fp32),
    the output gate g_b_proj(g_a_proj(x)) and KimiLinearRMSNormGated (fp32, sigmoid gate).
    Symbols: H = linear_num_heads, K = linear_head_dim (q, k and v share it), Kc = linear_conv_kernel_dim.
    The chunk kernel keeps, per layer: the fp32 decay mask exp(g_i - g_j) [b,H,n,C,C,K] and the
    k_beta*key*decay product of the same size (the two dominant terms: 8*b*H*sp*C*K bytes), every clone of the
    sequential row update (`for i in 1..C-1: row, sub = attn[..., i, :i], attn[..., :i, :i]`: sum of 4*b*H*n*(i + i^2)),
    per chunk the intra-chunk product [b,H,C,C,K], and one recurrent state [b,H,K,K] per chunk. The state update of
    the last chunk feeds only the discarded final state: that subgraph is dead and frees itself (not counted)."""
    cfg = x.cfg
    b, s, T, h = x.b, x.s, x.T, x.h
    H, K, Kc = cfg["linear_num_heads"], cfg["linear_head_dim"], cfg["linear_conv_kernel_dim"]
    HK = H * K
    C = KDA_CHUNK
    n = -(-s // C)
    sp = n * C
    p, cb, hb, amp = x.p, x.cb, x.hb, x.amp
    f4 = F32 * b * H
    if amp:
        for nm, out in (("q_proj", HK), ("k_proj", HK), ("v_proj", HK), ("forget_gate.f_a_proj", K),
                        ("b_proj", H), ("g_a_proj", K)):
            amp_cast(t, x, la + "." + nm, T, h, N)
            amp_weight(t, x, la + "." + nm, h, out, N)
    else:
        t.add(la + ".q_proj", "norm output = q/k/v, f_a, b, g_a projection input [T,h]", hb * T * h, N)
    t.add(la, "cat(q, k, v) = conv1d input [b,3HK,s]", cb * T * 3 * HK, N)
    if amp:
        t.add(la, "autocast bf16 copy of the conv1d weight [3HK,1,Kc]", BF16 * 3 * HK * Kc, N)
    t.add(la, "conv1d output (padded, sliced) = silu input [b,3HK,s+Kc-1]", cb * b * 3 * HK * (s + Kc - 1), N)
    fg = la + ".forget_gate"
    t.add(fg + ".f_b_proj", "f_a_proj output = f_b_proj input [T,K]", cb * T * K, N)
    amp_weight(t, x, fg + ".f_b_proj", K, HK, N)
    t.add(fg, "exp(A_log) and -exp(A_log) [H] fp32", 2 * F32 * H, N)
    t.add(fg, "exp(g), 1 + exp(g) (log input), softplus result [b,s,H,K] fp32 x3", 3 * F32 * T * HK, N)
    t.add(fg, "where condition g > 20 [b,s,H,K] bool", BOOL * T * HK, N)
    t.add(la, "beta = sigmoid(b_proj(x)) [b,s,H]", cb * T * H, N)
    t.add(la, "l2norm inputs q, k [b,H,s,K] fp32 x2 and sqrt results [b,H,s,1] x2", 2 * f4 * s * (K + 1), N)
    t.add(la, "padded beta [b,H,sp] fp32", f4 * sp, N)
    t.add(la, "padded value, key, scaled query, k_beta, exp(g) (for k_cumdecay) [b,H,sp,K] fp32 x5",
          5 * f4 * sp * K, N)
    t.add(la, "decay mask exp [b,H,n,C,C,K] fp32 and k_beta*key*decay product (same size)", 2 * f4 * sp * C * K, N)
    t.add(la, "masks: strict triu [C,C,1], triu [C,C], triu(1) [C,C] bool", 3 * C * C, N)
    t.add(la, "row-update clones: sum over i=1..C-1 of row [b,H,n,i] and sub [b,H,n,i,i] fp32",
          f4 * n * sum(i + i * i for i in range(1, C)), N)
    e = BF16 if amp else F32  # matmul operands (autocast casts them to bf16 and does not cache activation casts)
    if amp:
        t.add(la, "attn bf16 casts for attn @ v_beta and attn @ (k_beta*exp(g)) [b,H,n,C,C] x2",
              2 * BF16 * b * H * n * C * C, N)
    else:
        t.add(la, "attn (+eye) [b,H,n,C,C] fp32", f4 * n * C * C, N)
    t.add(la, "v_beta and k_beta*exp(g) [b,H,sp,K] (bmm mat2)", 2 * e * b * H * sp * K, N)
    t.add(la, "per chunk: exp(g_i) [b,H,C,K] fp32, intra-chunk product [b,H,C,C,K] fp32", n * f4 * C * K * (1 + C), N)
    t.add(la, "per chunk: attn_intra [b,H,C,C] and v_new [b,H,C,K] (bmm operands)", n * e * b * H * C * (C + K), N)
    if amp:  # bf16 casts of the states: one for chunk 0's two matmuls with S_0, two per later chunk
        t.add(la, "recurrent states: bf16 casts [b,H,K,K] x(2n-1) (bmm mat2)", (2 * n - 1) * e * b * H * K * K, N)
    else:
        t.add(la, "recurrent states S_0..S_{n-1} [b,H,K,K] fp32 (bmm mat2)", n * e * b * H * K * K, N)
    if n >= 2:
        t.add(la, "chunks 1..n-1: (q_i * exp(g_i)) [b,H,C,K] (bmm self)", (n - 1) * e * b * H * C * K, N)
        t.add(la, "k_cumdecay [b,H,sp,K] (bmm self, chunks 1..n-1)", e * b * H * sp * K, N)
        t.add(la, "state updates 0..n-2: exp(g_last) [b,H,K] and exp(g_last - g_i) [b,H,C,K] fp32",
              (n - 1) * f4 * K * (1 + C), N)
        t.add(la, "state updates 0..n-2: (k_i * decay)^T [b,H,K,C] (bmm self)", (n - 1) * e * b * H * C * K, N)
    t.add(la + ".g_b_proj", "g_a_proj output = g_b_proj input [T,K]", cb * T * K, N)
    amp_weight(t, x, la + ".g_b_proj", K, HK, N)
    on = la + ".o_norm"
    t.add(on, "gated norm: fp32 input, normalised x, sigmoid(gate.float()), weight*x [b,s,H,K] fp32 x4",
          4 * F32 * T * HK, N)
    t.add(on, "gated norm: rsqrt [b,s,H,1] fp32", F32 * T * H, N)
    if p != F32 and not amp:
        t.add(on, "gated norm: weight.to(fp32) [K] (a copy in bf16 models)", F32 * K, N)
    if amp:
        amp_cast(t, x, la + ".o_proj", T, HK, N)
    else:
        t.add(la + ".o_proj", "o_proj input [T,HK] (bf16: the .to(input dtype) copy)", p * T * HK, N)
    amp_weight(t, x, la + ".o_proj", HK, h, N)


def kimi_linear(rec, x: Dims):
    """kimi_linear/modeling_kimi_linear.py KimiLinearDecoderLayer.forward: input_layernorm; "linear_attention"
    layers KimiLinearDeltaAttention (kda_terms), "full_attention" layers KimiLinearAttention (DeepSeek-style MLA with
    NoPE: q_proj (q_lora_rank None), kv_a_proj_with_mqa -> kv_a_layernorm -> kv_b_proj -> expand_kv, no rotary
    embedding at all, the k_rot slice used as is); post_attention_layernorm; KimiLinearMLP on "dense" layers, else
    KimiLinearMoE (DeepSeek-V3-style fp32 sigmoid router with renormalisation, grouped_mm experts, shared_experts of
    width moe_intermediate_size * num_shared_experts)."""
    t = Terms()
    cfg = x.cfg
    T, h, a, s, b, L = x.T, x.h, x.a, x.s, x.b, x.L
    hb, cb, amp = x.hb, x.cb, x.amp
    types = cfg["layer_types"][:L]
    n_lin = sum(1 for ty in types if ty == "linear_attention")
    n_att = L - n_lin
    mlp_types = cfg["mlp_layer_types"][:L]
    n_dense = sum(1 for ty in mlp_types if ty == "dense")
    n_moe = L - n_dense
    lay = "model.layers.*"
    att = lay + ".self_attn"
    t.add("model.embed_tokens", "input_ids int64", I64 * T)
    if x.ckpt:
        ckpt_terms(t, x, lay, eager_masks=1 if n_att else 0)
    else:
        rms_terms(t, x, lay + ".input_layernorm", L, T, h, hb)
        kda_terms(t, x, att, n_lin)
        # MLA without RoPE (deepseek() without its rope term)
        r, dn, dr, dv = cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        dq = dn + dr
        if amp:
            amp_cast(t, x, att + ".q_proj", T, h, n_att)
            amp_cast(t, x, att + ".kv_a_proj_with_mqa", T, h, n_att)
        else:
            t.add(att + ".q_proj", "norm output = q_proj and kv_a_proj_with_mqa input [T,h]", hb * T * h, n_att)
        amp_weight(t, x, att + ".q_proj", h, a * dq, n_att)
        amp_weight(t, x, att + ".kv_a_proj_with_mqa", h, r + dr, n_att)
        kvn = att + ".kv_a_layernorm"
        if cb == F32:
            t.add(kvn, "kv_a_layernorm: fp32 input = the kv_nope slice: whole [T, r+dr] storage", F32 * T * (r + dr),
                  n_att)
        else:
            t.add(kvn, "kv_a_layernorm: fp32 copy of the kv_nope slice [T,r]", F32 * T * r, n_att)
        t.add(kvn, "kv_a_layernorm: rsqrt [T] fp32", F32 * T, n_att)
        t.add(kvn, "kv_a_layernorm: normalised x in the input dtype [T,r]", cb * T * r, n_att)
        t.add(att + ".kv_b_proj", "kv_a_layernorm output = kv_b_proj input [T,r]", cb * T * r, n_att)
        amp_weight(t, x, att + ".kv_b_proj", r, a * (dn + dv), n_att)
        o_mod = att + ".o_proj"
        v_whole = x.b == 1 and (x.attn == "eager" or cb == F32)
        if x.attn == "sdpa":
            t.add(att, "math sdpa: q*sqrt(scale) [b*a,s,dq] fp32", F32 * T * a * dq, n_att)
            t.add(att, "math sdpa: k*sqrt(scale) [b*a,dq,s] fp32", F32 * T * a * dq, n_att)
            t.add(att, "math sdpa: safe softmax [b,a,s,s] fp32", F32 * b * a * s * s, n_att)
            if v_whole:
                t.add(att, "math sdpa: v = the whole kv_b_proj output (b = 1 view)", F32 * T * a * (dn + dv), n_att)
            else:
                t.add(att, "math sdpa: v [b*a,s,dv] fp32", F32 * T * a * dv, n_att)
            t.add(o_mod, "o_proj input [T,a*dv]", cb * T * a * dv, n_att)
        else:
            eager_terms(t, x, att, n_att, a=a, dq=dq, dv=dv, o_mod=o_mod,
                        v_storage=cb * T * a * (dn + dv) if v_whole else None)
        amp_weight(t, x, o_mod, a * dv, h, n_att)
        rms_terms(t, x, lay + ".post_attention_layernorm", L, T, h, hb)
        m = lay + ".mlp"
        swiglu_terms(t, x, m, n_dense, T, h, x.f, in_bytes=hb)
        # KimiLinearConfig's attribute_map: num_shared_experts, moe_renormalize (= n_shared_experts, norm_topk_prob)
        moe_layers_terms(t, x, m, n_moe, router="sigmoid", norm_topk=cfg.get("moe_renormalize"), fe=x.fe,
                         shared_f=x.fe * cfg["num_shared_experts"])
    rms_terms(t, x, "model.norm", 1, T, h, hb)
    lm_head_terms(t, x, "lm_head", hb)
    loss_terms(t, x)
    return t


# ----------------------------------------------------------------------------------------------------------------------
# gpt2
# ----------------------------------------------------------------------------------------------------------------------

def gpt2(rec, x: Dims):
    t = Terms()
    p, T, h, a, d, f, s, b, L, V = x.p, x.T, x.h, x.a, x.h // x.a, x.f, x.s, x.b, x.L, x.V
    amp = x.amp
    hb = x.hb  # residual stream dtype
    t.add("transformer.wte", "input_ids int64", I64 * T)
    t.add("transformer.wpe", "position_ids [1,s] int64", I64 * s)
    if x.dropout:
        t.add("transformer.drop", "embedding dropout mask [b,s,h] (CPU: model dtype)", p * T * h)
    if x.ckpt:
        ckpt_terms(t, x, "transformer.h.*", position_ids=False, eager_masks=1, mask_positional=True)
    else:
        lay = "transformer.h.*"

        def ln(mod, n=L):
            # CPU native_layer_norm: mean and rstd in the *input* dtype (bf16 for a bf16 model).
            t.add(mod, "LayerNorm input [b,s,h]", hb * T * h, n)
            t.add(mod, "LayerNorm mean+rstd [b,s,1] x2 (CPU: input dtype)", 2 * hb * T, n)

        ln(lay + ".ln_1")
        t.add(lay + ".attn.c_attn", "c_attn input [b,s,h]", x.cb * T * h, L)
        if amp:
            t.add(lay + ".attn.c_attn", "bf16 weight copy c_attn [h,3h]", 2 * h * 3 * h, L)
            t.add(lay + ".attn.c_proj", "bf16 weight copy c_proj [h,h]", 2 * h * h, L)
            t.add(lay + ".mlp.c_fc", "bf16 weight copy c_fc [h,f]", 2 * h * f, L)
            t.add(lay + ".mlp.c_proj", "bf16 weight copy c_proj [f,h]", 2 * f * h, L)
        m = lay + ".attn"
        cp = x.cb
        if x.attn == "sdpa" and not x.dropout:
            t.add(m, "sdpa q,k,v = views of c_attn output: whole [b,s,3h] storage", cp * T * 3 * h, L)
            t.add(m, "sdpa output [b,a,s,d] (= c_proj input)", cp * T * h, L)
            t.add(m, "sdpa logsumexp [b,a,s] fp32", F32 * b * a * s, L)
        elif x.attn == "sdpa":
            t.add(m, "math sdpa: q*sqrt(scale) fp32", F32 * T * h, L)
            t.add(m, "math sdpa: k*sqrt(scale) fp32", F32 * T * h, L)
            t.add(m, "math sdpa: softmax fp32 [b,a,s,s]", F32 * b * a * s * s, L)
            t.add(m, "math sdpa: dropout mask fp32 [b,a,s,s]", F32 * b * a * s * s, L)
            t.add(m, "math sdpa: dropped attn fp32 [b,a,s,s]", F32 * b * a * s * s, L)
            t.add(m, "math sdpa: v fp32", F32 * T * h, L)
            t.add(m + ".c_proj", "c_proj input [b,s,h]", p * T * h, L)
        else:
            t.add(m, "q copy [b,a,s,d]", cp * T * h, L)
            t.add(m, "k^T copy [b,a,d,s]", cp * T * h, L)
            # gpt2 eager softmax has no dtype=fp32: probs in the matmul output dtype (fp32 under autocast: the
            # softmax autocast policy is fp32 on CPU)
            t.add(m, "softmax result [b,a,s,s] (model dtype; fp32 under autocast)", (F32 if amp else p) * b * a * s * s, L)
            if x.dropout:
                t.add(m, "attention dropout mask [b,a,s,s] (CPU: model dtype)", p * b * a * s * s, L)
                t.add(m, "dropped probs [b,a,s,s]", p * b * a * s * s, L)
            elif amp:
                t.add(m, "probs cast to bf16 by autocast [b,a,s,s]", 2 * b * a * s * s, L)
            t.add(m, "v copy [b,a,s,d]", cp * T * h, L)
            t.add(m + ".c_proj", "c_proj input (merged heads) [b,s,h]", cp * T * h, L)
        if x.dropout:
            t.add(m + ".resid_dropout", "residual dropout mask [b,s,h]", p * T * h, L)
        ln(lay + ".ln_2")
        t.add(lay + ".mlp.c_fc", "c_fc input [b,s,h]", cp * T * h, L)
        act = lay + ".mlp.act"
        if x.cfg.get("activation_function") == "gelu_pytorch_tanh":
            # issue 25 (gpt2-tanh): PytorchGELUTanh = F.gelu(x, approximate="tanh"), one aten op whose
            # GeluBackward0 keeps only its input (the c_fc output), in the matmul output dtype.
            t.add(act, "gelu(approximate=tanh): its input (c_fc output) [b,s,f]", cp * T * f, L)
        else:
            t.add(act, "gelu_new: x (c_fc output) [b,s,f]", cp * T * f, L)
            t.add(act, "gelu_new: tanh(...) [b,s,f]", cp * T * f, L)
            t.add(act, "gelu_new: 0.5*x [b,s,f]", cp * T * f, L)
            t.add(act, "gelu_new: 1+tanh [b,s,f]", cp * T * f, L)
        t.add(lay + ".mlp.c_proj", "c_proj input [b,s,f]", cp * T * f, L)
        if x.dropout:
            t.add(lay + ".mlp.dropout", "mlp dropout mask [b,s,h]", p * T * h, L)
    t.add("transformer.ln_f", "LayerNorm input [b,s,h]", hb * T * h)
    t.add("transformer.ln_f", "LayerNorm mean+rstd [b,s,1] x2 (CPU: input dtype)", 2 * hb * T)
    if amp:
        t.add("lm_head", "bf16 cast of lm_head input [b,s,h]", 2 * T * h)
        t.add("lm_head", "bf16 copy of the (tied) lm_head weight [V,h]", 2 * V * h)
    else:
        t.add("lm_head", "ln_f output = lm_head input [b,s,h]", p * T * h)
    loss_terms(t, x)
    return t


# ----------------------------------------------------------------------------------------------------------------------
# The table and the checker
# ----------------------------------------------------------------------------------------------------------------------

FAMILY_FN = {
    "gpt2": gpt2,
    "gpt2-tanh": gpt2,
    "seed_oss": llama_family,
    # minimax_m2: whole-projection llama-style q/k norms, partial RoPE (rotary_dim) ending in cat -> o-copy; the
    # MiniMaxM2TopKRouter saves the same bytes as mixtral's (sigmoid(logits.float()) fp32 [T,E] instead of the
    # softmax, the gather index instead of the topk indices, the renormalised fp32 weights), experts of width
    # intermediate_size
    "minimax_m2": lambda r, x: llama_family(r, x, qk_norm="full_llama", o_copy=True, moe=mixtral_moe),
    "apertus": lambda r, x: llama_family(r, x, qk_norm="head", pre_attn="attention_layernorm",
                                         pre_mlp="feedforward_layernorm", moe=apertus_mlp),
    # exaone4: no pre-norms, llama-style post-norms on the sub-layer outputs, per-head q/k norm; its NoPE full layers
    # change nothing here (cos/sin are saved once by the sliding layers that rotate)
    "exaone4": lambda r, x: llama_family(r, x, qk_norm="head", post_norms=True, pre_norms=False),
    "olmo3": lambda r, x: llama_family(r, x, norm="olmo2", qk_norm="full", post_norms=True, rope_fp32=True,
                                       rope_pairs=2),
    "llama-gqa": llama_family,
    "llama-mha": llama_family,
    "qwen2": llama_family,
    "mistral": llama_family,
    "mixtral": lambda r, x: llama_family(r, x, moe=mixtral_moe),
    "phi3": lambda r, x: llama_family(r, x, fused_qkv=True, fused_gate_up=True, o_copy=True,
                                      resid_dropout=bool(x.dropout)),
    "phi3-mha": lambda r, x: llama_family(r, x, fused_qkv=True, fused_gate_up=True, o_copy=True),
    "qwen3": lambda r, x: llama_family(r, x, qk_norm="head"),
    "smollm3": llama_family,
    "olmo": lambda r, x: llama_family(r, x, norm="layernorm", rope_fp32=True),
    "olmo-clip": lambda r, x: llama_family(r, x, norm="layernorm", rope_fp32=True, clip_qkv=True),
    "olmo2": lambda r, x: llama_family(r, x, norm="olmo2", qk_norm="full", post_norms=True, rope_fp32=True),
    "gemma": lambda r, x: llama_family(r, x, norm="gemma"),
    "gemma2": lambda r, x: llama_family(r, x, norm="gemma", post_norms=True, pre_mlp="pre_feedforward_layernorm",
                                        attn_softcap=True, final_softcap=True),
    "gemma3_text": lambda r, x: llama_family(r, x, norm="gemma", qk_norm="head", post_norms=True,
                                             pre_mlp="pre_feedforward_layernorm", rope_pairs=2),
    "qwen2_moe": lambda r, x: llama_family(r, x, moe=qwen_moe_mlp),
    "qwen3_moe": lambda r, x: llama_family(r, x, qk_norm="head", moe=qwen_moe_mlp),
    "glm4_moe": lambda r, x: llama_family(r, x, o_copy=True, moe=glm4_moe_mlp),
    "glm4_moe-qknorm": lambda r, x: llama_family(r, x, o_copy=True, qk_norm="head", moe=glm4_moe_mlp),
    "deepseek_v3": deepseek,
    "deepseek_v2": deepseek,
    "deepseek_v2-group": deepseek,
    "deepseek_v32": deepseek,
    "gpt_oss": gpt_oss,
    "llama4_text": llama4_text,
    "qwen3_next": qwen3_next,
    "falcon_h1": falcon_h1,
    "kimi_linear": kimi_linear,
    "granitemoehybrid": granitemoehybrid,
    "qwen3_5_text": qwen3_next,
    "qwen3_5_moe_text": qwen3_next,
    "starcoder2": starcoder2,
    "stablelm": stablelm,
    "stablelm-qkln-par": stablelm,
    "phi": phi,
    "gpt_neox": gpt_neox,
    "gpt_neox-seq": gpt_neox,
    "opt": opt,
    "falcon-new": falcon,
    "falcon-new-1ln": falcon,
    "falcon-old": falcon,
}


def expected(rec, cfg) -> Terms:
    x = Dims(rec, cfg)
    return FAMILY_FN[rec["family"]](rec, x)


def measured_by_module(rec):
    out = defaultdict(int)
    for row in rec["saved"]:
        out[row["module"]] += row["bytes"] * row["count"]
    return dict(out)


def explain(doc, rid):
    rec = next((r for r in doc["records"] if r["id"] == rid), None)
    if rec is None:
        raise SystemExit(f"no record {rid}")
    terms = expected(rec, doc["configs"][rec["config_key"]])
    print(f"{rid}: formula {terms.total()} B, measured {rec['saved_bytes']} B")
    mb, eb = measured_by_module(rec), terms.by_module()
    print("formula terms (bytes x multiplicity):")
    for m, what, b, n in terms.items:
        print(f"  {m:45s} {b:>10d} x{n:<3d} {what}")
    print("measured rows (storage bytes x count):")
    for r in rec["saved"]:
        print(f"  {r['module']:45s} {r['bytes']:>10d} x{r['count']:<3d} {r['op']}.{r['attr']} {r['dtype']} "
              f"{r['shape']} {r.get('layers', '')}")
    print("per module (formula vs measured):")
    for m in sorted(set(mb) | set(eb)):
        flag = "" if mb.get(m, 0) == eb.get(m, 0) else "   <-- differs"
        print(f"  {m:50s} {eb.get(m, 0):>10d} {mb.get(m, 0):>10d}{flag}")


def main():
    argv = sys.argv[1:]
    explain_id = family = None
    if "--explain" in argv:
        i = argv.index("--explain")
        explain_id = argv[i + 1]
        del argv[i:i + 2]
    if "--family" in argv:
        i = argv.index("--family")
        family = argv[i + 1]
        del argv[i:i + 2]
    args = [a for a in argv if not a.startswith("-")]
    verbose = "-v" in argv
    path = args[0] if args else DEFAULT
    doc = load(path)
    if explain_id:
        explain(doc, explain_id)
        return 0
    configs = doc["configs"]
    stats = {}
    bad = 0
    missing = defaultdict(int)
    n = 0
    for rec in doc["records"]:
        if family and rec["family"] != family:
            continue
        if rec["family"] not in FAMILY_FN:
            missing[rec["family"]] += 1
            continue
        n += 1
        cfg = configs[rec["config_key"]]
        terms = expected(rec, cfg)
        exp = terms.total()
        got = rec["saved_bytes"]
        rel = abs(exp - got) / got
        key = (rec["family"], rec["extra"])
        st = stats.setdefault(key, {"n": 0, "max_rel": 0.0, "module_mismatch": 0, "worst": None})
        st["n"] += 1
        if rel > st["max_rel"]:
            st["max_rel"], st["worst"] = rel, rec["id"]
        mb, eb = measured_by_module(rec), terms.by_module()
        mism = {m: (eb.get(m, 0), mb.get(m, 0)) for m in set(mb) | set(eb) if eb.get(m, 0) != mb.get(m, 0)}
        if mism:
            st["module_mismatch"] += 1
        if exp != got:
            bad += 1
        if (exp != got or mism) and verbose:
            print(f"{rec['id']}: expected {exp}, measured {got} (diff {exp - got})")
            for m, (e, g) in sorted(mism.items()):
                print(f"    {m:50s} formula {e:>10d}  measured {g:>10d}  diff {e - g:>+10d}")
    print(f"{'family':18s} {'set':6s} {'records':>7s} {'max rel err':>12s} {'module-level mismatches':>24s}")
    for (fam, extra), st in sorted(stats.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{fam:18s} {'extra' if extra else 'grid':6s} {st['n']:>7d} {st['max_rel']:>12.3e} "
              f"{st['module_mismatch']:>24d}" + (f"   worst: {st['worst']}" if st["max_rel"] else ""))
    for fam, cnt in sorted(missing.items()):
        print(f"{fam:18s} {'-':6s} {cnt:>7d}   NO FORMULA")
    print(f"{n} records checked, {bad} with a total that differs from the formula"
          + (f"; {sum(missing.values())} records of {len(missing)} families without a formula" if missing else ""))
    return 1 if bad or missing else 0


if __name__ == "__main__":
    sys.exit(main())
