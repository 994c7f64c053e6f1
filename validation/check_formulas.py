#!/usr/bin/env python3
"""Evaluate the saved-tensor formulas of FINDINGS.md against tests/fixtures/pytorch/records.json.

For every record, the formulas give a list of terms (module pattern, description, bytes). The checker compares

* the total with the measured `saved_bytes` (this is what must be exact), and
* the per-module-pattern sums with the measured rows (a diagnostic: it tells which term is wrong when a total is off).

It prints, per family (main grid and extras separately), the number of records, the max relative error of the total,
and the number of records whose per-module breakdown differs. Exit status 1 if any total is off.

Usage:  python3 validation/check_formulas.py [records.json] [-v] [--explain RECORD_ID]
        -v                 print every record whose total or per-module breakdown differs
        --explain ID       print the formula terms and the measured rows of one record
(plain Python 3, no torch needed)
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "pytorch", "records.json")

F32, I64, I32 = 4, 8, 4


class Dims:
    """Symbols of FINDINGS.md, read from the record and its config.json."""

    def __init__(self, rec, cfg):
        self.b, self.s = rec["batch"], rec["seq"]
        self.T = self.b * self.s
        mt = cfg["model_type"]
        if mt == "gpt2":
            self.h, self.a, self.L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
            self.k = self.a
            self.d = self.h // self.a
            self.f = cfg["n_inner"] or 4 * self.h
        else:
            self.h, self.a, self.L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
            self.k = cfg.get("num_key_value_heads") or self.a
            self.d = cfg.get("head_dim") or self.h // self.a
            self.f = cfg["intermediate_size"]
        self.V = cfg["vocab_size"]
        self.E = cfg.get("num_local_experts")
        self.top_k = cfg.get("num_experts_per_tok")
        # p: bytes of the model's compute dtype (the dtype of parameters in pure fp32/bf16 records).
        self.p = {"fp32": 4, "bf16": 2, "amp-bf16": 2}[rec["dtype"]]
        self.amp = rec["dtype"] == "amp-bf16"
        self.attn = rec["attn"]
        self.ckpt = rec["checkpointing"]
        self.dropout = rec["dropout"]


class Terms:
    def __init__(self):
        self.items = []  # (module pattern, what, bytes, multiplicity)

    def add(self, module, what, nbytes, n=1):
        if nbytes:
            self.items.append((module, what, int(nbytes), n))

    def total(self):
        return sum(b * n for _, _, b, n in self.items)

    def by_module(self):
        out = defaultdict(int)
        for m, _, b, n in self.items:
            out[m] += b * n
        return dict(out)


# ----------------------------------------------------------------------------------------------------------------------
# Model ends (shared)
# ----------------------------------------------------------------------------------------------------------------------

def loss_terms(t: Terms, x: Dims, softcap_logits=False):
    """HF ForCausalLMLoss inside forward: logits.float() -> log_softmax (saves its fp32 result) -> nll_loss."""
    if softcap_logits:
        # gemma2 final_logit_softcapping: logits/c -> tanh (saves result, model dtype) -> *c
        t.add("(root)", "final-logit softcap tanh result [b,s,V] (model dtype)", x.p * x.T * x.V)
    t.add("(root)", "log_softmax result [b*s,V] fp32", F32 * x.T * x.V)
    # labels are padded to s+1 and sliced [...,1:]; .contiguous() is a no-op when b == 1, so the saved target then
    # keeps the whole padded storage.
    t.add("(root)", "nll target (int64)", I64 * (x.T if x.b > 1 else x.s + 1))
    t.add("(root)", "nll total_weight (fp32 scalar)", F32)


def rms_norm_terms(t: Terms, x: Dims, module, n=1, amp=False):
    """LlamaRMSNorm family: x.to(fp32); pow(2).mean; rsqrt; x*rsqrt; .to(in dtype); weight * (...)."""
    t.add(module, "input upcast to fp32 [b,s,h] (pow self; in fp32 models the residual stream itself)", F32 * x.T * x.h, n)
    t.add(module, "rsqrt(var+eps) [b,s,1] fp32", F32 * x.T, n)
    # weight * hidden.to(input_dtype) saves `other`: the normalised input in the input dtype (fp32 under autocast,
    # where the residual stream is fp32).
    t.add(module, "normalised x (before weight) [b,s,h], input dtype", (F32 if amp else x.p) * x.T * x.h, n)


def gemma_norm_terms(t: Terms, x: Dims, module, n=1):
    """Gemma2RMSNorm: out = _norm(x.float()) * (1 + weight.float()); out.type_as(x)."""
    t.add(module, "input upcast to fp32 [b,s,h]", F32 * x.T * x.h, n)
    t.add(module, "rsqrt [b,s,1] fp32", F32 * x.T, n)
    t.add(module, "1 + weight.float() [h] fp32", F32 * x.h, n)
    t.add(module, "normalised x fp32 [b,s,h]", F32 * x.T * x.h, n)


def rope_terms(t: Terms, x: Dims, module):
    """cos and sin [1,s,d] (position_ids is [1,s], so no batch), model dtype (fp32 under autocast); saved once by the
    first layer's q*cos / rotate_half(q)*sin and shared by all layers."""
    t.add(module, "RoPE cos+sin [1,s,d] x2", 2 * (F32 if x.amp else x.p) * x.s * x.d)


def ckpt_terms(t: Terms, x: Dims, layer_module, *, closure_rope=True, eager_mask=0, mask_positional=False,
               embed_dtype_bytes=None):
    """Non-reentrant checkpoint of every decoder layer: the layer's positional input (hidden_states) saved by the
    checkpoint frame, plus kwargs held by the recompute closure (shared by all layers: one storage each)."""
    hb = embed_dtype_bytes or (F32 if x.amp else x.p)
    t.add(layer_module, "layer input hidden_states [b,s,h] (checkpoint frame saved_args), per layer", hb * x.T * x.h,
          x.L)
    mask_bytes = (F32 if x.amp else x.p) * x.b * x.s * x.s
    if closure_rope:
        t.add(layer_module, "closure: position_embeddings cos+sin [1,s,d]", 2 * (F32 if x.amp else x.p) * x.s * x.d)
        t.add(layer_module, "closure: position_ids [1,s] int64", I64 * x.s)
    if x.attn == "eager" and eager_mask:
        t.add(layer_module, "attention mask [b,1,s,s] additive, model dtype" +
              (" (positional arg)" if mask_positional else " (closure)"), mask_bytes, eager_mask)


# ----------------------------------------------------------------------------------------------------------------------
# Families
# ----------------------------------------------------------------------------------------------------------------------

def llama_like(rec, x: Dims, *, fused_qkv=False, fused_gate_up=False, moe=False):
    """llama (GQA/MHA), qwen2, mistral, mixtral (moe=True), phi3 (fused_qkv, fused_gate_up)."""
    t = Terms()
    p, T, h, a, k, d, f, s, b, L, V = x.p, x.T, x.h, x.a, x.k, x.d, x.f, x.s, x.b, x.L, x.V
    amp = x.amp
    t.add("model.embed_tokens", "input_ids (embedding indices) int64", I64 * T)
    if x.ckpt:
        ckpt_terms(t, x, "model.layers.*", eager_mask=1)
    else:
        lay = "model.layers.*"
        qkv_mod = lay + (".self_attn.qkv_proj" if fused_qkv else ".self_attn.q_proj")
        rms_norm_terms(t, x, lay + ".input_layernorm", L, amp=amp)
        if amp:
            # autocast casts the (fp32) input separately for each linear, and keeps bf16 copies of the weights
            nproj = 1 if fused_qkv else 3
            if fused_qkv:
                t.add(qkv_mod, "bf16 cast of qkv_proj input [b,s,h]", 2 * T * h, L)
                t.add(qkv_mod, "bf16 weight copy qkv", 2 * h * (a + 2 * k) * d, L)
            else:
                for nm, out in (("q_proj", a * d), ("k_proj", k * d), ("v_proj", k * d)):
                    t.add(lay + ".self_attn." + nm, f"bf16 cast of {nm} input [b,s,h]", 2 * T * h, L)
                    t.add(lay + ".self_attn." + nm, f"bf16 weight copy {nm}", 2 * h * out, L)
        else:
            t.add(qkv_mod, "norm output = q/k/v projection input [b,s,h]", p * T * h, L)
        rope_terms(t, x, lay + ".self_attn")
        attn_terms(t, x, lay + ".self_attn", fused_qkv=fused_qkv)
        if amp:
            t.add(lay + ".self_attn.o_proj", "bf16 weight copy o_proj", 2 * a * d * h, L)
        rms_norm_terms(t, x, lay + ".post_attention_layernorm", L, amp=amp)
        if moe:
            moe_terms(t, x, lay + ".mlp", rec)
        elif fused_gate_up:
            t.add(lay + ".mlp.gate_up_proj", "norm output = gate_up_proj input [b,s,h]", p * T * h, L)
            t.add(lay + ".mlp.activation_fn", "gate_up output [b,s,2f] (silu saves the gate view; up is a view too)",
                  p * T * 2 * f, L)
            t.add(lay + ".mlp", "silu(gate) [b,s,f]", p * T * f, L)
            t.add(lay + ".mlp.down_proj", "up*silu(gate) = down_proj input [b,s,f]", p * T * f, L)
        else:
            if amp:
                t.add(lay + ".mlp.gate_proj", "bf16 cast of gate_proj input [b,s,h]", 2 * T * h, L)
                t.add(lay + ".mlp.gate_proj", "bf16 weight copy gate_proj", 2 * h * f, L)
                t.add(lay + ".mlp.up_proj", "bf16 cast of up_proj input [b,s,h]", 2 * T * h, L)
                t.add(lay + ".mlp.up_proj", "bf16 weight copy up_proj", 2 * h * f, L)
                t.add(lay + ".mlp.down_proj", "bf16 weight copy down_proj", 2 * h * f, L)
            else:
                t.add(lay + ".mlp.gate_proj", "norm output = gate/up input [b,s,h]", p * T * h, L)
            t.add(lay + ".mlp.act_fn", "gate_proj output (silu input) [b,s,f]", p * T * f, L)
            t.add(lay + ".mlp", "silu(gate) [b,s,f]", p * T * f, L)
            t.add(lay + ".mlp", "up_proj output [b,s,f]", p * T * f, L)
            t.add(lay + ".mlp.down_proj", "silu(gate)*up = down_proj input [b,s,f]", p * T * f, L)
        if x.dropout and fused_qkv:  # phi3 has residual dropouts (resid_pdrop); llama-likes have none
            t.add(lay + ".resid_attn_dropout", "residual dropout mask [b,s,h] (CPU: model dtype)", p * T * h, L)
            t.add(lay + ".resid_mlp_dropout", "residual dropout mask [b,s,h] (CPU: model dtype)", p * T * h, L)
    rms_norm_terms(t, x, "model.norm", amp=amp)
    if amp:
        t.add("lm_head", "bf16 cast of lm_head input [b,s,h]", 2 * T * h)
        t.add("lm_head", "bf16 weight copy lm_head [V,h]", 2 * V * h)
    else:
        t.add("lm_head", "final norm output = lm_head input [b,s,h]", p * T * h)
    loss_terms(t, x)
    return t


def attn_terms(t: Terms, x: Dims, mod, fused_qkv=False):
    p, T, h, a, k, d, s, b, L = x.p, x.T, x.h, x.a, x.k, x.d, x.s, x.b, x.L
    o_mod = mod + ".o_proj"
    if x.attn == "sdpa" and not x.dropout:
        # CPU flash kernel (_scaled_dot_product_flash_attention_for_cpu) with enable_gqa=True (HF: no mask ->
        # use_gqa_in_sdpa): saves q [b,a,s,d], k,v [b,k,s,d] (not repeated), output [b,a,s,d], logsumexp [b,a,s] fp32.
        # The output is laid out [b,s,a,d], so transpose(1,2).contiguous() is a no-op: o_proj input = output.
        q_b = 2 if x.amp else p
        t.add(mod, "sdpa query (after RoPE) [b,a,s,d]", q_b * T * a * d, L)
        t.add(mod, "sdpa key (after RoPE) [b,k,s,d]", q_b * T * k * d, L)
        if fused_qkv:
            t.add(mod, "sdpa value = view of the fused qkv output: whole [b,s,(a+2k)d] storage", p * T * (a + 2 * k) * d,
                  L)
        else:
            t.add(mod, "sdpa value [b,k,s,d] (view of v_proj output)", q_b * T * k * d, L)
        t.add(mod, "sdpa output [b,a,s,d]", q_b * T * a * d, L)
        t.add(mod, "sdpa logsumexp [b,a,s] fp32", F32 * b * a * s, L)
        if fused_qkv:
            # phi3's RoPE supports partial rotary: torch.cat([rotated, q_pass], -1) returns q [b,a,s,d]-contiguous, the
            # CPU kernel's output follows q's layout, so transpose(1,2).contiguous() copies -> o_proj keeps its own
            # input.
            t.add(o_mod, "o_proj input [b,s,a*d] (separate copy, see above)", p * T * a * d, L)
        # llama-likes: q (RoPE of a [b,s,a,d]-laid-out view) and hence the output are laid out [b,s,a,d], so
        # transpose(1,2).contiguous() is a no-op and o_proj's saved input IS the sdpa output (no extra term).
        return
    if x.attn == "sdpa":
        # dropout_p > 0: CPU falls back to the math kernel, which upcasts bf16 to fp32 and repeats k/v to a heads.
        t.add(mod, "math sdpa: q*sqrt(scale) fp32 [b,a,s,d]", F32 * T * a * d, L)
        t.add(mod, "math sdpa: k*sqrt(scale) fp32 [b,a,s,d] (k repeated)", F32 * T * a * d, L)
        t.add(mod, "math sdpa: softmax fp32 [b,a,s,s]", F32 * b * a * s * s, L)
        t.add(mod, "math sdpa: dropout mask fp32 [b,a,s,s]", F32 * b * a * s * s, L)
        t.add(mod, "math sdpa: dropped attn fp32 [b,a,s,s]", F32 * b * a * s * s, L)
        t.add(mod, "math sdpa: v fp32 [b,a,s,d] (repeated)", F32 * T * a * d, L)
        t.add(o_mod, "o_proj input [b,s,a*d]", p * T * a * d, L)
        return
    # eager
    qk_b = 2 if x.amp else p
    t.add(mod, "q after RoPE [b,a,s,d] (matmul self)", qk_b * T * a * d, L)
    t.add(mod, "k after RoPE, repeated to a heads [b,a,s,d] (matmul other)", qk_b * T * a * d, L)
    t.add(mod, "softmax(dtype=fp32) result [b,a,s,s] fp32", F32 * b * a * s * s, L)
    if x.dropout:
        t.add(mod, "attention dropout mask [b,a,s,s] (CPU: same dtype as probs)", p * b * a * s * s, L)
        t.add(mod, "dropped probs [b,a,s,s] (model dtype)", p * b * a * s * s, L)
    elif x.amp:
        t.add(mod, "probs cast to bf16 by autocast for probs@v [b,a,s,s]", 2 * b * a * s * s, L)
    elif p != F32:
        t.add(mod, "probs .to(model dtype) [b,a,s,s] (probs@v self)", p * b * a * s * s, L)
    t.add(mod, "v repeated to a heads [b,a,s,d] (probs@v other; a copy even for MHA)", qk_b * T * a * d, L)
    t.add(o_mod, "o_proj input [b,s,a*d]", qk_b * T * a * d, L)


def moe_terms(t: Terms, x: Dims, mod, rec):
    p, T, h, f, L, E, K = x.p, x.T, x.h, x.f, x.L, x.E, x.top_k
    S = T * K  # token-expert pairs
    g = mod + ".gate"
    if x.amp:
        t.add(g, "router: bf16 cast of input [b*s,h]", 2 * T * h, L)
        t.add(g, "router: bf16 weight copy [E,h]", 2 * E * h, L)
    else:
        t.add(g, "router input = norm output [b*s,h]", p * T * h, L)
    t.add(g, "router softmax(logits.float()) [b*s,E] fp32", F32 * T * E, L)
    t.add(g, "router topk indices [b*s,top_k] int64", I64 * T * K, L)
    t.add(g, "router top values (div self) [b*s,top_k] fp32", F32 * T * K, L)
    t.add(g, "router top values sum (div other) [b*s,1] fp32", F32 * T, L)
    ex = mod + ".experts"
    impl = rec.get("experts_implementation", "grouped_mm")
    # grouped_mm has no autocast policy: under autocast the experts run entirely in the fp32 of the weights.
    cp = F32 if x.amp else p
    if impl == "grouped_mm":
        t.add(ex, "3 index tensors (perm//top_k, perm, inv_perm) [S] int64", 3 * I64 * S, L)
        t.add(ex, "grouped_mm offsets [E] int32", I32 * E, L)
        t.add(ex, "hidden_states[perm] = up grouped_mm input [S,h]", cp * S * h, L)
        t.add(ex + ".act_fn", "gate_up output [S,2f] (silu saves the gate view)", cp * S * 2 * f, L)
        t.add(ex, "silu(gate) [S,f]", cp * S * f, L)
        t.add(ex, "silu(gate)*up = down grouped_mm input [S,f]", cp * S * f, L)
        t.add(ex, "routing weights [S,1] fp32", F32 * S, L)
        t.add(ex, "down output [S,h] (weighting mul self)", cp * S * h, L)
    else:  # eager: python loop over hit experts; every tensor is per expert, so the totals depend only on S
        t.add(ex, "torch.where(mask) -> (top_k_pos, token_idx) [n_e,2] int64", 2 * I64 * S, L)
        t.add(ex, "hidden_states[token_idx] [n_e,h]", p * S * h, L)
        t.add(ex + ".act_fn", "gate_up output [n_e,2f]", p * S * 2 * f, L)
        t.add(ex, "silu(gate) [n_e,f]", p * S * f, L)
        t.add(ex, "down input [n_e,f]", p * S * f, L)
        t.add(ex, "routing weight [n_e,1] fp32", F32 * S, L)
        t.add(ex, "down output [n_e,h]", p * S * h, L)
        t.add(ex, "index_add_ source [n_e,h]", p * S * h, L)


def gemma2(rec, x: Dims):
    t = Terms()
    p, T, h, a, k, d, f, s, b, L = x.p, x.T, x.h, x.a, x.k, x.d, x.f, x.s, x.b, x.L
    t.add("model.embed_tokens", "input_ids int64", I64 * T)
    t.add("model.embed_tokens", "normalizer sqrt(h) 0-dim tensor (model dtype)", p)
    if x.ckpt:
        # two masks (full and sliding) always exist, each [b,1,s,s]
        ckpt_terms(t, x, "model.layers.*", eager_mask=2)
    else:
        lay = "model.layers.*"
        gemma_norm_terms(t, x, lay + ".input_layernorm", L)
        t.add(lay + ".self_attn.q_proj", "norm output = q/k/v input [b,s,h]", p * T * h, L)
        rope_terms(t, x, lay + ".self_attn")
        m = lay + ".self_attn"
        t.add(m, "q after RoPE [b,a,s,d]", p * T * a * d, L)
        t.add(m, "k after RoPE repeated [b,a,s,d]", p * T * a * d, L)
        t.add(m, "attn-logit softcap tanh result [b,a,s,s] (model dtype)", p * b * a * s * s, L)
        t.add(m, "softmax(dtype=fp32) result [b,a,s,s] fp32", F32 * b * a * s * s, L)
        if p != F32:
            t.add(m, "probs .to(model dtype) [b,a,s,s]", p * b * a * s * s, L)
        t.add(m, "v repeated [b,a,s,d]", p * T * a * d, L)
        t.add(m + ".o_proj", "o_proj input [b,s,a*d]", p * T * a * d, L)
        gemma_norm_terms(t, x, lay + ".post_attention_layernorm", L)
        gemma_norm_terms(t, x, lay + ".pre_feedforward_layernorm", L)
        t.add(lay + ".mlp.gate_proj", "norm output = gate/up input [b,s,h]", p * T * h, L)
        t.add(lay + ".mlp.act_fn", "gate output (gelu_tanh input) [b,s,f]", p * T * f, L)
        t.add(lay + ".mlp", "gelu(gate) [b,s,f]", p * T * f, L)
        t.add(lay + ".mlp", "up output [b,s,f]", p * T * f, L)
        t.add(lay + ".mlp.down_proj", "down input [b,s,f]", p * T * f, L)
        gemma_norm_terms(t, x, lay + ".post_feedforward_layernorm", L)
    gemma_norm_terms(t, x, "model.norm")
    t.add("lm_head", "final norm output = lm_head input [b,s,h]", p * T * h)
    loss_terms(t, x, softcap_logits=True)
    return t


def gpt2(rec, x: Dims):
    t = Terms()
    p, T, h, a, d, f, s, b, L, V = x.p, x.T, x.h, x.a, x.d, x.f, x.s, x.b, x.L, x.V
    amp = x.amp
    hb = F32 if amp else p  # residual stream dtype
    t.add("transformer.wte", "input_ids int64", I64 * T)
    t.add("transformer.wpe", "position_ids [1,s] int64", I64 * s)
    if x.dropout:
        t.add("transformer.drop", "embedding dropout mask [b,s,h] (CPU: model dtype)", p * T * h)
    if x.ckpt:
        ckpt_terms(t, x, "transformer.h.*", closure_rope=False, eager_mask=1, mask_positional=True)
    else:
        lay = "transformer.h.*"

        def ln(mod, n=L):
            # CPU native_layer_norm: mean and rstd in the *input* dtype (bf16 for a bf16 model).
            t.add(mod, "LayerNorm input [b,s,h]", hb * T * h, n)
            t.add(mod, "LayerNorm mean+rstd [b,s,1] x2 (CPU: input dtype)", 2 * hb * T, n)

        ln(lay + ".ln_1")
        t.add(lay + ".attn.c_attn", "c_attn input [b,s,h]", (2 if amp else p) * T * h, L)
        if amp:
            t.add(lay + ".attn.c_attn", "bf16 weight copy c_attn [h,3h]", 2 * h * 3 * h, L)
            t.add(lay + ".attn.c_proj", "bf16 weight copy c_proj [h,h]", 2 * h * h, L)
            t.add(lay + ".mlp.c_fc", "bf16 weight copy c_fc [h,f]", 2 * h * f, L)
            t.add(lay + ".mlp.c_proj", "bf16 weight copy c_proj [f,h]", 2 * f * h, L)
        m = lay + ".attn"
        cp = 2 if amp else p
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


FAMILY_FN = {
    "gpt2": gpt2,
    "llama-gqa": llama_like,
    "llama-mha": llama_like,
    "qwen2": llama_like,
    "mistral": llama_like,
    "mixtral": lambda r, x: llama_like(r, x, moe=True),
    "gemma2": gemma2,
    "phi3": lambda r, x: llama_like(r, x, fused_qkv=True, fused_gate_up=True),
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
    print("formula terms (bytes x multiplicity):")
    for m, what, b, n in terms.items:
        print(f"  {m:45s} {b:>10d} x{n:<3d} {what}")
    print("measured rows (storage bytes x count):")
    for r in rec["saved"]:
        print(f"  {r['module']:45s} {r['bytes']:>10d} x{r['count']:<3d} {r['op']}.{r['attr']} {r['dtype']} {r['shape']}")


def main():
    argv = sys.argv[1:]
    explain_id = None
    if "--explain" in argv:
        i = argv.index("--explain")
        explain_id = argv[i + 1]
        del argv[i:i + 2]
    args = [a for a in argv if not a.startswith("-")]
    verbose = "-v" in argv
    path = args[0] if args else DEFAULT
    doc = json.load(open(path))
    if explain_id:
        explain(doc, explain_id)
        return 0
    configs = doc["configs"]
    stats = {}
    bad = 0
    for rec in doc["records"]:
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
    print(f"{'family':12s} {'set':6s} {'records':>7s} {'max rel err':>12s} {'module-level mismatches':>24s}")
    for (fam, extra), st in sorted(stats.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{fam:12s} {'extra' if extra else 'grid':6s} {st['n']:>7d} {st['max_rel']:>12.3e} "
              f"{st['module_mismatch']:>24d}" + (f"   worst: {st['worst']}" if st["max_rel"] else ""))
    print(f"{len(doc['records'])} records, {bad} with a total that differs from the formula")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
