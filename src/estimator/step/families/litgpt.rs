//! `framework = litgpt`: litgpt 0.5.13's own `GPT` (`litgpt/model.py`: `GPT`, `Block`,
//! `CausalSelfAttention`, `build_rope_cache` / `apply_rope`, `RMSNorm`, `LLaMAMLP`, `GemmaMLP`,
//! `GptNeoxMLP`), one model class parametrized by its `Config` (`litgpt/config.py`), trained as
//! `litgpt/finetune/full.py` trains it: Lightning Fabric's precision plugin around the model
//! call, then `chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])`
//! (`litgpt/utils.py`, `chunk_size=128`) and `fabric.backward(loss / accumulation)`. Its
//! activation checkpointing (`FSDPStrategy(activation_checkpointing_policy={Block})`:
//! `checkpoint_wrapper(checkpoint_impl=NO_REENTRANT)` on each `Block`) is the step's checkpoint
//! region.
//!
//! The configs followed, each measured in `tests/fixtures/pytorch/frameworks/litgpt-*.json`:
//! Llama 3 (`"Llama-3.1-8B"`), Mistral (`"Mistral-7B-v0.1"`: a sliding window on every layer),
//! Qwen2.5 (`"Qwen2.5-7B"`: `attn_bias`), Phi-3 (`"Phi-3-mini-4k-instruct"`: a sliding window on
//! every layer), Gemma (`"Gemma-2b"`: `scale_embeddings`, RMSNorm with `add_unit_offset`,
//! `GemmaMLP`) and Pythia (`"pythia-160m"`: LayerNorm, biases, `GptNeoxMLP`, partial rotary,
//! parallel residual). The block reads the shape from the [`ModelSpec`]:
//! - one fused `attn.qkv` linear (with a bias under `bias` or `attn_bias`),
//!   `split((q, k, v), dim=-1)` (SplitWithSizesBackward0: one `cat` of the three gradients),
//!   views and transposes;
//! - RoPE reads the model's `cos` and `sin` buffers (fp32, computed with `.float()` by
//!   `build_rope_cache`; `fit` rebuilds them for the data's longest sequence after Fabric's
//!   conversion, so they stay fp32) on `q[..., :rope_n_elem]` (a slice unless the whole head
//!   rotates): `rotated = cat((-x2, x1))`, `x * cos + rotated * sin` in fp32 (type promotion),
//!   cast back; then `cat((roped, x[..., n:]))` copies q and k;
//! - with `sliding_window_size` set, every layer of `sliding_window_indices` builds its own
//!   additive `[T, T]` window mask in q's dtype and SDPA keeps it (`is_causal=False`);
//! - its `RMSNorm` upcasts the input, squares it as `x * x`, and multiplies by
//!   `weight.float()` (Gemma: `(1 + weight).float()`) before casting back ([`Rms::Litgpt`],
//!   [`Rms::LitgptUnitOffset`]); LayerNorm is `torch.nn.LayerNorm`;
//! - `LLaMAMLP` computes `fc_1`, then `fc_2`, then `silu(·) * ·` (`GemmaMLP`: tanh GELU);
//!   `GptNeoxMLP` `proj(gelu(fc(x)))`; the block keeps its `attention_output` bound to the
//!   return;
//! - Fabric's bf16 precisions (`bf16-true`, `bf16-mixed`) convert the forward's output to fp32
//!   (`convert_output`): the loss reads fp32 logits, sliced, copied by `reshape` (b > 1), split
//!   in chunks of 128 rows, each with its own `cross_entropy(reduction="none")`.
//!
//! The SDPA core (`is_causal=True`, no mask) and `repeat_interleave`'s copy of k and v keep
//! what transformers' Llama keeps: they reuse its builders.

use super::super::blocks::shapes::{heads, heads_bshd, tok, tok_tp};
use super::super::blocks::Keep;
use super::super::ir::{Builder, DType, Dim, Dt, Origin, Shape, Split, Tid, B, S, X};
use super::common::{
    cos_shape, fused_qkv, has_rope, proj_or, rotary_dims, token_embedding, Kind, Norm, NormW, Params, Rms, Shared, LAYER_NORM,
};
use super::llama::{repeat_kv, sdpa_core_copy};
use super::modeling::Modeling;
use crate::estimator::config::{Attention, Config, Framework};
use crate::estimator::ctx::Q;
use crate::estimator::family::Family;
use crate::estimator::ledger::Bytes;
use crate::estimator::model::{Activation, LayerRule, Linear, MlpKind, ModelSpec, NormKind};
use crate::estimator::part::Part;

/// `chunked_cross_entropy`'s `chunk_size` (its default, which `finetune/full.py` and
/// `pretrain.py` keep): rows of the flattened logits per `cross_entropy` call.
pub const LOSS_CHUNK_ROWS: u64 = 128;

/// Bytes of one fp32 element (the `cos` and `sin` buffers).
const FP32_BYTES: u128 = 4;

/// The families whose litgpt configs are measured and followed (`tests/fixtures/pytorch/
/// frameworks/litgpt-*.json`); [`crate::estimator::validate`] refuses the others by name.
pub fn ships(family: Family) -> bool {
    matches!(family, Family::Llama | Family::Mistral | Family::Qwen2 | Family::Phi3 | Family::Gemma | Family::Gemma2 | Family::GptNeox)
}

/// Whether litgpt's config for this family is a Gemma (`scale_embeddings`; `"Gemma" in name`
/// gives its RMSNorm `add_unit_offset`).
fn gemma(spec: &ModelSpec) -> bool {
    matches!(spec.family, Family::Gemma | Family::Gemma2)
}

/// litgpt's norm class for the config: `torch.nn.LayerNorm`, or its `RMSNorm` (with
/// `add_unit_offset` for a Gemma).
fn norm_of(spec: &ModelSpec) -> Norm {
    if spec.norm == NormKind::Layernorm {
        Norm::LayerNorm
    } else if gemma(spec) {
        Norm::Rms(Rms::LitgptUnitOffset)
    } else {
        Norm::Rms(Rms::Litgpt)
    }
}

/// `self.cos[:T]` / `self.sin[:T]` as the layers read them: fp32 `[s, rope_n_elem]` (the
/// buffer holds exactly the sequence, see [`buffer_bytes`]).
fn table_shape(spec: &ModelSpec) -> Shape {
    cos_shape(spec)
}

/// `apply_rope(x, cos, sin)` on q or k (or their first `rope_n_elem` dims) laid out
/// `[b, heads, s, d]`:
/// ```python
/// head_size_half = x.size(-1) // 2
/// x1 = x[..., :head_size_half]
/// x2 = x[..., head_size_half:]
/// rotated = torch.cat((-x2, x1), dim=-1)
/// roped = (x * cos) + (rotated * sin)     # cos, sin: fp32 buffers, the products fp32
/// return roped.to(dtype=x.dtype)
/// ```
/// The tables need no gradient: each product keeps only its table (a buffer). `rotated` is a
/// local until the return.
fn apply_rope(b: &mut Builder, x: Tid, cos: Tid, sin: Tid, partial: bool) -> Tid {
    super::common::rope_rotated_halves(b, x, cos, sin, if partial { Dim::HalfX(X::DRot) } else { Dim::Half(Q::D) })
}

/// `torch.cat((x_roped, x[..., rope_n_elem:]), dim=-1)`: the pass-through part is a slice
/// (SliceBackward0 allocates the whole input in backward; empty when the whole head rotates);
/// the `cat` copies.
fn join(b: &mut Builder, roped: Tid, x: Tid) -> Tid {
    let full = b.shape(x);
    let pass = b.slice(x, full.last(Dim::N(0)));
    b.cat2(roped, pass, full)
}

/// `qkv.split((query_size, key_size, value_size), dim=-1)`: three views; SplitWithSizesBackward0
/// concatenates their gradients (one `cat` of the fused output's size).
fn split_qkv(b: &mut Builder, qkv: Tid) -> (Tid, Tid, Tid) {
    let (rg, bytes, dtype) = (b.rg(qkv), b.bytes(qkv), b.t(qkv).dtype);
    let o = [b.view_out(qkv, heads_bshd(Q::A)), b.view_out(qkv, heads_bshd(Q::KV)), b.view_out(qkv, heads_bshd(Q::KV))];
    let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "cat" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    let r = b.op("split_with_sizes", "SplitWithSizesBackward0", &[qkv], &o, &[], bw);
    (r[0], r[1], r[2])
}

/// Whether this layer applies litgpt's sliding window (`CausalSelfAttention.__init__`:
/// `sliding_window_size is not None and sliding_window_indices[block_idx]`): every layer when
/// the window covers them all (Mistral's and Phi-3's configs), else the layers the spec marks.
fn windowed(spec: &ModelSpec, sh: &Shared) -> bool {
    spec.window > 0 && (spec.window_layers == LayerRule::All || sh.sliding)
}

/// The window mask `CausalSelfAttention.forward` builds on a windowed layer (no KV cache):
/// ```python
/// if mask is None:
///     mask = torch.ones(T, T, dtype=q.dtype, device=q.device).triu(diagonal=1)
///     mask.masked_fill_(mask.bool(), float("-inf"))
///     mask = mask.view(1, 1, *mask.shape)
/// sliding_window_mask = torch.full((T, T), float("-inf"), dtype=q.dtype, device=q.device)
/// for i in range(T):
///     window_start = max(0, i - self.config.sliding_window_size + 1)
///     sliding_window_mask[i, window_start : i + 1] = 0.0
/// mask = sliding_window_mask.view(1, 1, T, T)
/// ```
/// `[T, T]` in q's dtype: the `ones` die into `triu`, the bool copy after the in-place fill;
/// the causal mask lives until `mask` is rebound to the window's.
fn window_mask(b: &mut Builder, dt: Dt) -> Tid {
    let tt = || Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::S)], Split::None);
    let ones = b.plain("ones", &[], tt(), dt);
    let causal = b.plain("triu", &[ones], tt(), dt);
    b.plain("_to_copy", &[causal], tt(), Dt::Bool);
    let window = b.plain("full", &[], tt(), dt);
    b.hold(causal);
    window
}

/// `F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)` on CPU with
/// litgpt's additive window mask (k and v already repeated to `a` heads): the CPU flash kernel
/// keeps q, k, v, the mask, the output and the log-sum-exp; then `y.transpose(1, 2)` and the
/// caller's `reshape`, which copies (q came from RoPE's `cat`).
fn sdpa_window(b: &mut Builder, q: Tid, k: Tid, v: Tid, mask: Tid) -> Tid {
    let (q, k, v) = (b.autocast_in(q), b.autocast_in(k), b.autocast_in(v));
    let r = super::common::cpu_flash_sdpa(b, q, k, v, mask);
    let ot = b.view(r[0], heads_bshd(Q::A), "TransposeBackward0", false);
    let ot = b.copy(ot, heads_bshd(Q::A));
    b.view(ot, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::A), Dim::Q(Q::D)], Split::Tp), "ViewBackward0", false)
}

/// `CausalSelfAttention.scaled_dot_product_attention` with `attention_logit_softcapping` (litgpt's
/// Gemma 2 configs; SDPA cannot soft-cap):
/// ```python
/// scores = q @ k.mT * scale
/// scores = do_softcapping(scores, self.config.attention_logit_softcapping)   # tanh(x / t) * t
/// if mask is None:
///     mask = torch.ones(q.size(2), q.size(2), dtype=q.dtype, device=q.device).triu(diagonal=1)
///     mask.masked_fill_(mask.bool(), torch.finfo(q.dtype).min)
/// scores = scores + mask
/// scores = F.softmax(scores, dim=-1, dtype=torch.float).to(dtype=q.dtype)
/// y = scores @ v
/// return y.transpose(1, 2)
/// ```
/// q (RoPE's `cat`) and k, v (repeated) are contiguous `[b, a, s, d]`: matmul views them and
/// keeps them; the tanh keeps its output, the softmax its fp32 output, the second matmul the
/// scores cast back and v. `mask` is the window's on a windowed layer, else made here (the
/// function's local until it returns). The caller's `reshape` copies the transposed output.
fn softcap_core(b: &mut Builder, q: Tid, k: Tid, v: Tid, window: Option<Tid>) -> Tid {
    let qdt = b.t(q).dt;
    let sc = b.bmm(q, k, super::super::blocks::shapes::scores());
    let sm = b.mul_scalar(sc);
    let dv = b.unary("div", "DivBackward1", sm, Keep::Nothing, "div");
    let th = b.unary("tanh", "TanhBackward0", dv, Keep::Output, "tanh_backward");
    let cap = b.mul_scalar(th);
    let mask = match window {
        Some(m) => m,
        None => {
            let tt = || Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::S)], Split::None);
            let dt = b.t(cap).dt;
            let ones = b.plain("ones", &[], tt(), dt);
            let causal = b.plain("triu", &[ones], tt(), dt);
            b.plain("_to_copy", &[causal], tt(), Dt::Bool);
            causal
        }
    };
    let sa = b.add(cap, mask);
    let s32 = b.to_copy(sa, Dt::F32);
    let pr = b.unary("_softmax", "SoftmaxBackward0", s32, Keep::Output, "_softmax_backward_data");
    let pc = b.to_copy(pr, qdt);
    let o = b.bmm(pc, v, heads(Q::A));
    b.hold(mask);
    let o = b.view(o, heads(Q::A), "UnsafeViewBackward0", true);
    let ot = b.view(o, heads_bshd(Q::A), "TransposeBackward0", false);
    let oc = b.copy(ot, heads_bshd(Q::A));
    b.view(oc, Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::A), Dim::Q(Q::D)], Split::Tp), "ViewBackward0", false)
}

/// The attention's parameters, in registration order: `attn.qkv` (weight, bias), `attn.proj`
/// (weight, bias).
struct AttnW {
    qkv: (Option<Tid>, Option<Tid>),
    proj: (Option<Tid>, Option<Tid>),
}

/// `CausalSelfAttention.forward` (no KV cache, no q/k norms, no logit soft-capping):
/// ```python
/// qkv = self.qkv(x)
/// q, k, v = qkv.split((query_size, key_size, value_size), dim=-1)
/// q = q.view(B, T, n_head, head_size); k = k.view(…); v = v.view(…)
/// q = q.transpose(1, 2); k = k.transpose(1, 2); v = v.transpose(1, 2)
/// q_roped = apply_rope(q[..., :rope_n_elem], cos, sin)
/// k_roped = apply_rope(k[..., :rope_n_elem], cos, sin)
/// q = torch.cat((q_roped, q[..., rope_n_elem:]), dim=-1)
/// k = torch.cat((k_roped, k[..., rope_n_elem:]), dim=-1)
/// if n_query_groups != n_head:
///     k = k.repeat_interleave(q_per_kv, dim=1); v = v.repeat_interleave(q_per_kv, dim=1)
/// if self.apply_sliding_window_attention: mask = …      # see `window_mask`
/// y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=scale, is_causal=mask is None)
/// y = y.transpose(1, 2).reshape(B, T, head_size * n_head)
/// return self.proj(y)
/// ```
/// `q[..., :rope_n_elem]` over the whole head is `q` itself (Python indexing returns the tensor
/// for a full slice); a partial rotary (Pythia) slices. q and k come back from RoPE's `cat`
/// contiguous `[b, heads, s, d]`: their gradients reach the `[b, s, heads, d]` views
/// transposed, and the views' `reshape` copies them; v's does too when `repeat_interleave`
/// copied it. `qkv` and `q_roped`, `k_roped` are locals until the return.
fn attention(b: &mut Builder, spec: &ModelSpec, w: &AttnW, x: Tid, sh: &Shared) -> Tid {
    let qkv = fused_qkv(b, x, w.qkv, ["attn.qkv", "attn"], proj_or);
    let (q, k, v) = split_qkv(b, qkv);
    let gqa = b.c.n(Q::KV) != b.c.n(Q::A);
    let qv = b.view(q, heads_bshd(Q::A), "ViewBackward0", true);
    let kv = b.view(k, heads_bshd(Q::KV), "ViewBackward0", true);
    let vv = b.view(v, heads_bshd(Q::KV), "ViewBackward0", gqa);
    let qt = b.view(qv, heads(Q::A), "TransposeBackward0", false);
    let kt = b.view(kv, heads(Q::KV), "TransposeBackward0", false);
    let vt = b.view(vv, heads(Q::KV), "TransposeBackward0", false);
    let partial = rotary_dims(spec) != spec.head_dim;
    let (qe, ke) = match (sh.cos, sh.sin) {
        (Some(cos), Some(sin)) => {
            let part = |b: &mut Builder, x: Tid| {
                if partial {
                    let full = b.shape(x);
                    b.slice(x, full.last(Dim::X(X::DRot)))
                } else {
                    x
                }
            };
            let qs = part(b, qt);
            let qr = apply_rope(b, qs, cos, sin, partial);
            let ks = part(b, kt);
            let kr = apply_rope(b, ks, cos, sin, partial);
            let qe = join(b, qr, qt);
            let ke = join(b, kr, kt);
            b.hold(qr);
            b.hold(kr);
            (qe, ke)
        }
        _ => (qt, kt),
    };
    b.part = Part::AttentionCore;
    let (kr, vr) = if gqa { (repeat_kv(b, ke), repeat_kv(b, vt)) } else { (ke, vt) };
    let window = windowed(spec, sh).then(|| {
        let dt = b.t(qe).dt;
        window_mask(b, dt)
    });
    let o = match window {
        _ if spec.softcap => softcap_core(b, qe, kr, vr, window),
        Some(mask) => sdpa_window(b, qe, kr, vr, mask),
        None => sdpa_core_copy(b, qe, kr, vr, sh.cos.is_some()),
    };
    b.part = Part::AttentionInputs;
    b.module = "attn.proj";
    let out = proj_or(b, o, w.proj.0, w.proj.1, tok(Q::H), Linear::O);
    b.hold(qkv);
    // `mask` is the forward's local until it returns.
    if let Some(m) = window {
        b.hold(m);
    }
    out
}

/// The MLP's parameters in registration order: `fc_1`, `fc_2`, `proj` (`LLaMAMLP`,
/// `GemmaMLP`) or `fc`, `proj` (`GptNeoxMLP`), each weight then bias.
struct MlpW {
    fc_1: (Option<Tid>, Option<Tid>),
    fc_2: (Option<Tid>, Option<Tid>),
    proj: (Option<Tid>, Option<Tid>),
}

/// A fused parameter's half (`gate_up_proj` is `fc_1` and `fc_2` in litgpt).
fn half_of(b: &mut Builder, p: &Params, name: &str) -> Option<Tid> {
    p.find(name).map(|(n, t, e)| p.make(b, n / 2, t, e))
}

impl MlpW {
    fn new(b: &mut Builder, p: &Params, spec: &ModelSpec) -> MlpW {
        let none = (None, None);
        if spec.mlp == MlpKind::Plain {
            let fc_1 = (p.w(b, "layers.*.mlp.up_proj.weight"), p.w(b, "layers.*.mlp.up_proj.bias"));
            let proj = (p.w(b, "layers.*.mlp.down_proj.weight"), p.w(b, "layers.*.mlp.down_proj.bias"));
            return MlpW { fc_1, fc_2: none, proj };
        }
        let (fc_1, fc_2) = if spec.fused_gate_up {
            let a = (half_of(b, p, "layers.*.mlp.gate_up_proj.weight"), half_of(b, p, "layers.*.mlp.gate_up_proj.bias"));
            let c = (half_of(b, p, "layers.*.mlp.gate_up_proj.weight"), half_of(b, p, "layers.*.mlp.gate_up_proj.bias"));
            (a, c)
        } else {
            let a = (p.w(b, "layers.*.mlp.gate_proj.weight"), p.w(b, "layers.*.mlp.gate_proj.bias"));
            let c = (p.w(b, "layers.*.mlp.up_proj.weight"), p.w(b, "layers.*.mlp.up_proj.bias"));
            (a, c)
        };
        let proj = (p.w(b, "layers.*.mlp.down_proj.weight"), p.w(b, "layers.*.mlp.down_proj.bias"));
        MlpW { fc_1, fc_2, proj }
    }
}

/// The MLP's activation: `F.silu` (`LLaMAMLP`) or `F.gelu(·, approximate=…)` (`GemmaMLP`:
/// "tanh", `GptNeoxMLP`: "none"); each keeps its input.
fn act(b: &mut Builder, spec: &ModelSpec, x: Tid) -> Tid {
    if spec.act == Activation::Silu {
        b.unary("silu", "SiluBackward0", x, Keep::Input, "silu_backward")
    } else {
        b.unary("gelu", "GeluBackward0", x, Keep::Input, "gelu_backward")
    }
}

/// `LLaMAMLP.forward` / `GemmaMLP.forward`:
/// ```python
/// x_fc_1 = self.fc_1(x)
/// x_fc_2 = self.fc_2(x)
/// x = F.silu(x_fc_1) * x_fc_2          # GemmaMLP: F.gelu(x_fc_1, approximate="tanh")
/// return self.proj(x)
/// ```
/// `GptNeoxMLP.forward`: `self.proj(F.gelu(self.fc(x), approximate="none"))`.
/// `x_fc_1` and `x_fc_2` are locals until the return (both saved anyway).
fn mlp(b: &mut Builder, spec: &ModelSpec, w: &MlpW, x: Tid) -> Tid {
    b.part = Part::Mlp;
    let f = || tok_tp(Dim::Q(Q::F));
    if spec.mlp == MlpKind::Plain {
        b.module = "mlp.fc";
        let u = proj_or(b, x, w.fc_1.0, w.fc_1.1, f(), Linear::Up);
        b.module = "mlp";
        let a = act(b, spec, u);
        b.module = "mlp.proj";
        return proj_or(b, a, w.proj.0, w.proj.1, tok(Q::H), Linear::Down);
    }
    b.module = "mlp.fc_1";
    let g = proj_or(b, x, w.fc_1.0, w.fc_1.1, f(), Linear::Gate);
    b.module = "mlp.fc_2";
    let u = proj_or(b, x, w.fc_2.0, w.fc_2.1, f(), Linear::Up);
    b.module = "mlp";
    let a = act(b, spec, g);
    let m = b.mul(a, u);
    b.module = "mlp.proj";
    proj_or(b, m, w.proj.0, w.proj.1, tok(Q::H), Linear::Down)
}

/// `Block.forward` (no post-norms):
/// ```python
/// x_normed = self.norm_1(x)
/// attention_output = self.attn(x_normed, cos, sin, mask, input_pos, input_pos_maxp1)
/// attention_output = self.post_attention_norm(attention_output)   # Identity
/// if self.config.parallel_residual:
///     if not self.config.shared_attention_norm:
///         x_normed = self.norm_2(x)
///     x = attention_output + x
/// else:
///     x = attention_output + x
///     x_normed = self.norm_2(x)
/// return self.post_mlp_norm(self.mlp(x_normed)) + x
/// ```
/// Parameters in registration order: `norm_1`, `attn.qkv`, `attn.proj`, `norm_2`, `mlp.*`. The
/// fused `qkv` weight (and bias) is one parameter of the q, k and v projections' elements.
fn block(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared) -> Tid {
    let norm = norm_of(spec);
    let w1 = norm.weights(b, p, LAYER_NORM);
    let qkv = fused(b, p, "weight");
    let qkv_b = fused(b, p, "bias");
    let aw = AttnW { qkv: (qkv, qkv_b), proj: (p.w(b, "layers.*.attn.o_proj.weight"), p.w(b, "layers.*.attn.o_proj.bias")) };
    let post = spec.layer_norms == 4;
    let wpa: Option<NormW> = post.then(|| norm.weights(b, p, LAYER_NORM));
    let w2: NormW = norm.weights(b, p, LAYER_NORM);
    let mw = MlpW::new(b, p, spec);
    let wpm: Option<NormW> = post.then(|| norm.weights(b, p, LAYER_NORM));
    b.module = "norm_1";
    b.part = Part::Norms;
    let n1 = norm.run(b, x, w1);
    let a = attention(b, spec, &aw, n1, sh);
    b.module = "post_attention_norm";
    b.part = Part::Norms;
    let a = match wpa {
        Some(w) => norm.run(b, a, w),
        None => a,
    };
    b.module = "";
    let (h, n2) = if spec.parallel {
        b.module = "norm_2";
        let n2 = norm.run(b, x, w2);
        b.module = "";
        b.part = Part::Norms;
        (b.add(a, x), n2)
    } else {
        let h = b.add(a, x);
        b.module = "norm_2";
        (h, norm.run(b, h, w2))
    };
    let m = mlp(b, spec, &mw, n2);
    b.module = "post_mlp_norm";
    b.part = Part::Norms;
    let m = match wpm {
        Some(w) => norm.run(b, m, w),
        None => m,
    };
    b.module = "";
    let y = b.add(m, h);
    b.hold(a);
    b.hold(h);
    b.hold(n2);
    y
}

/// `attn.qkv.weight` (`bias`: `attn.qkv.bias`): `[(n_head + 2 · n_query_groups) · head_size,
/// n_embd]`, the elements of the q, k and v projections' weights (biases) in one parameter.
fn fused(b: &mut Builder, p: &Params, what: &str) -> Option<Tid> {
    let names = ["q_proj", "k_proj", "v_proj", "qkv_proj"].map(|m| format!("layers.*.attn.{m}.{what}"));
    let (mut numel, mut trains, mut expert, mut any) = (0, false, false, false);
    for (n, t, e) in names.iter().filter_map(|n| p.find(n)) {
        numel += n;
        trains |= t;
        expert |= e;
        any = true;
    }
    any.then(|| p.make(b, numel, trains, expert))
}

/// litgpt 0.5.13's `GPT` with one of the configs [`ships`] names (see the module doc).
pub struct Gpt;
impl Modeling for Gpt {
    /// `GPT.forward` before the blocks: `cos = self.cos[:T].unsqueeze(0)` (sin alike, views of
    /// the buffers), `x = self.transformer.wte(idx)`; a Gemma config (`scale_embeddings`) then
    /// `x = x * torch.tensor(n_embd**0.5, dtype=x.dtype)`: a fresh 0-dim tensor the product
    /// keeps (2 or 4 bytes).
    fn embed(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention) -> (Tid, Shared) {
        let sh = self.positions(b, spec, attn);
        let (x0, _) = token_embedding(b, p, ids, "transformer.wte");
        let x0 = if gemma(spec) {
            b.module = "";
            let dt = b.t(x0).dt;
            let scale = b.plain("scalar_tensor", &[], Shape::scalar(), dt);
            b.mul(x0, scale)
        } else {
            x0
        };
        b.module = "";
        (x0, sh)
    }
    fn positions(&self, b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Shared {
        let _ = attn;
        if !has_rope(spec) {
            return Shared::default();
        }
        let cos = b.external(table_shape(spec), Dt::F32, Origin::Buffer, false);
        let sin = b.external(table_shape(spec), Dt::F32, Origin::Buffer, false);
        Shared { cos: Some(cos), sin: Some(sin), ..Shared::default() }
    }
    fn layer(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
        let _ = (kind, attn);
        block(b, p, spec, x, sh)
    }
    fn norm(&self) -> Norm {
        Norm::Rms(Rms::Litgpt)
    }
    fn final_norm(&self, b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid) -> Tid {
        super::common::final_norm(b, p, "transformer.ln_f", norm_of(spec), x)
    }
    /// `x` is rebound by every block.
    fn x0_is_local(&self) -> bool {
        false
    }
    /// The `cos` and `sin` buffers, fp32.
    fn rope_tables(&self, spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
        has_rope(spec).then(|| (table_shape(spec), Dt::F32, true))
    }
    /// The framework's own model code: SDPA with `is_causal=True` (no mask) or its own window
    /// mask, RoPE tables as registered buffers, positions of its own
    /// ([`Modeling::framework_code`]).
    fn framework_code(&self) -> bool {
        true
    }
    /// `GPT.__init__` registers `lm_head` first, then `transformer` (`wte`, `h`, `ln_f`):
    /// the for-loop AdamW steps `wte` while `lm_head`'s `denom` is still bound (measured: the
    /// optimizer's peak is 3 × the embedding's size above the gradients, 2 × in torchtune's).
    fn head_registered_first(&self) -> bool {
        true
    }
}

/// litgpt's model buffers: `cos` and `sin` (`GPT.max_seq_length`'s setter, `build_rope_cache`:
/// `[max_seq_length, rope_n_elem]` each, fp32 — `torch.arange(…).float()`). `finetune/full.py`'s
/// `fit` sets `model.max_seq_length = min(longest_seq_length, train.max_seq_length)` after
/// `fabric.setup`, which rebuilds them for that length, in fp32 whatever the precision: the
/// training sequence stands for the data's longest. 2 × s × rope_n_elem × 4. `None` for another
/// framework or a family litgpt is not followed for.
pub fn buffer_bytes(cfg: &Config) -> Option<Bytes> {
    (cfg.framework == Framework::Litgpt && ships(cfg.arch.family)).then(|| {
        if has_rope(&cfg.arch) {
            2 * cfg.seq as u128 * rotary_dims(&cfg.arch) as u128 * FP32_BYTES
        } else {
            0
        }
    })
}

/// Trainable, non-adapter instances of parameter group `name` (its layers on this stage).
fn trainable_count(groups: &[crate::estimator::params::LocalGroup], name: &str) -> u64 {
    groups
        .iter()
        .filter(|g| g.group.name == name && g.role == crate::estimator::params::Role::Trainable && !g.adapter)
        .map(|g| g.group.count)
        .sum()
}

/// Parameter tensors litgpt has fewer of than the parameter groups (`q_proj`, `k_proj`,
/// `v_proj` apart) count: its fused `attn.qkv` is one tensor where the groups have three, so
/// 2 per layer of the stage for the weights and 2 for the biases (AdamW keeps one `step`
/// counter per tensor). 0 for another framework or family, or for groups already fused.
pub fn merged_tensors(cfg: &Config, groups: &[crate::estimator::params::LocalGroup]) -> u64 {
    if cfg.framework != Framework::Litgpt || !ships(cfg.arch.family) || cfg.arch.fused_qkv {
        return 0;
    }
    ["weight", "bias"]
        .iter()
        .map(|what| {
            let counts = ["q_proj", "k_proj", "v_proj"].map(|m| trainable_count(groups, &format!("layers.*.attn.{m}.{what}")));
            let layers = counts.iter().copied().max().unwrap_or(0);
            let fused = counts.iter().filter(|&&c| c > 0).count() as u64;
            layers * fused.saturating_sub(1)
        })
        .sum()
}

/// Parameter tensors litgpt has more of than the parameter groups count: its `LLaMAMLP` keeps
/// `fc_1` and `fc_2` apart where the groups have transformers' fused `gate_up_proj` (Phi-3):
/// 1 more per layer of the stage (2 with a bias). 0 for another framework or family.
pub fn split_tensors(cfg: &Config, groups: &[crate::estimator::params::LocalGroup]) -> u64 {
    if cfg.framework != Framework::Litgpt || !ships(cfg.arch.family) {
        return 0;
    }
    trainable_count(groups, "layers.*.mlp.gate_up_proj.weight") + trainable_count(groups, "layers.*.mlp.gate_up_proj.bias")
}

/// The loss chunks of `rows` flattened positions: (rows per chunk, chunks, rows of the last).
pub fn loss_chunks(rows: u64) -> (u64, u64, u64) {
    let n = rows.div_ceil(LOSS_CHUNK_ROWS).max(1);
    (LOSS_CHUNK_ROWS.min(rows), n, rows - (n - 1) * LOSS_CHUNK_ROWS.min(rows))
}

/// `lm_head`, Fabric's `convert_output`, then `finetune/full.py`'s loss step:
/// ```python
/// logits = model(input_ids)                    # _FabricModule: lm_head's output .to(float32)
/// loss = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])
/// # chunked_cross_entropy (utils.py), logits not a list:
/// logits = logits.reshape(-1, logits.size(-1)); targets = targets.reshape(-1)
/// logit_chunks = logits.split(chunk_size); target_chunks = targets.split(chunk_size)
/// loss_chunks = [F.cross_entropy(l, t, ignore_index=-100, reduction="none") for l, t in …]
/// non_masked_elems = (targets != ignore_index).sum()
/// return torch.cat(loss_chunks).sum() / non_masked_elems.maximum(torch.ones_like(non_masked_elems))
/// fabric.backward(loss / train.gradient_accumulation_iters(devices, num_nodes))
/// ```
/// For b > 1 the shifted slice is not contiguous: `reshape` copies the logits and the targets.
/// The caller's fp32 logits live through the loss (full.py's `logits` name, see
/// docs/frameworks.md for what outlives it).
/// `prev`: what the previous micro-batch holds until this forward returns
/// (`holds_prev_logits`), freed once the fp32 logits exist.
pub fn head_and_loss(b: &mut Builder, xn: Tid, w: Option<Tid>, bias: Option<Tid>, vocab: Shape, softcap: bool, prev: Vec<Tid>) {
    let logits = super::common::head_logits(b, xn, w, bias, vocab);
    // `GPT.forward`'s `clamp_head`: `do_softcapping(logits, final_logit_softcapping)` (Gemma 2).
    let logits = if softcap { super::gemma::softcap_logits(b, logits) } else { logits };
    // Fabric's autocast covers the model call only: the loss runs outside it.
    let autocast = b.autocast;
    b.autocast = false;
    let lf = b.to_copy(logits, Dt::F32);
    for t in prev {
        b.hold(t);
    }
    let (batch, s) = (b.c.n(Q::B), b.c.n(Q::S));
    let rows = batch * s.saturating_sub(1);
    let (c, n, last) = loss_chunks(rows);
    let shifted = b.slice(lf, Shape::new(&[Dim::Q(Q::B), Dim::N(s.saturating_sub(1) as u32), Dim::Q(Q::V)], Split::Tp));
    let flat_shape = Shape::new(&[Dim::N(rows as u32), Dim::Q(Q::V)], Split::Tp);
    let flat = if batch > 1 { b.copy(shifted, flat_shape) } else { b.view(shifted, flat_shape, "ViewBackward0", false) };
    let labels = b.external(Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None), Dt::I64, Origin::Batch, false);
    let tshape = Shape::new(&[Dim::N(rows as u32)], Split::None);
    let targets = if batch > 1 { b.plain("clone", &[labels], tshape, Dt::I64) } else { b.view(labels, tshape, "", false) };
    let len = |i: u64| if i + 1 == n { last } else { c };
    // `logits.split(chunk_size)`: one node, its gradient the `cat` of the chunks'.
    let first = b.p.tensors.len() as Tid;
    let outs: Vec<_> = (0..n).map(|i| b.view_out(flat, Shape::new(&[Dim::N(len(i) as u32), Dim::Q(Q::V)], Split::Tp))).collect();
    let (rg, fbytes, fdtype) = (b.rg(flat), b.bytes(flat), b.t(flat).dtype);
    let bw: &[B] = if rg { &[B::Alloc { bytes: fbytes, dtype: fdtype, op: "cat" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    b.op("split", "SplitBackward0", &[flat], &outs, &[], bw);
    let mut losses = Vec::with_capacity(n as usize);
    for i in 0..n {
        let chunk = first + i as Tid;
        let target = b.view(targets, Shape::new(&[Dim::N(len(i) as u32)], Split::None), "", false);
        let lsm = b.unary("_log_softmax", "LogSoftmaxBackward0", chunk, Keep::Output, "_log_softmax_backward_data");
        let lb = b.bytes(lsm);
        let out = [b.out(Shape::new(&[Dim::N(len(i) as u32)], Split::None), Dt::F32, true), b.out(Shape::scalar(), Dt::F32, false)];
        let r = b.op(
            "nll_loss_forward",
            "NllLossBackward0",
            &[lsm, target],
            &out,
            &[S::In(0), S::In(1), S::Out(1)],
            &[B::Alloc { bytes: lb, dtype: DType::Fp32, op: "nll_loss_backward" }, B::Grad { input: 0, temp: 0 }],
        );
        losses.push(r[0]);
    }
    // `non_masked_elems = (targets != ignore_index).sum()`, then the return expression.
    let ne = b.plain("ne", &[targets], tshape, Dt::Bool);
    let elems = b.plain("sum", &[ne], Shape::scalar(), Dt::I64);
    let all = cat_losses(b, &losses, rows);
    // `.sum()` (SumBackward0: the gradient expanded back, no allocation).
    let total = {
        let out = b.out(Shape::scalar(), Dt::F32, true);
        b.op("sum", "SumBackward0", &[all], &[out], &[], &[B::Pass { input: 0, output: 0 }])[0]
    };
    let ones = b.plain("ones_like", &[elems], Shape::scalar(), Dt::I64);
    let denom = b.plain("maximum", &[elems, ones], Shape::scalar(), Dt::I64);
    let loss = b.loss_scalar("div", "DivBackward0", total, Some(denom));
    // `chunked_cross_entropy` returns: its locals go; the caller's logits (and their slice) too.
    for t in [flat, targets, elems, lf, shifted].into_iter().chain(losses) {
        b.hold(t);
    }
    let r = b.loss_scalar("div", "DivBackward1", loss, None);
    b.outputs(&[r]);
    b.autocast = autocast;
}

/// The most inputs one node's backward script can address (`B::Pass { input: u8, .. }`).
const MAX_CAT_INPUTS: usize = 255;

/// `torch.cat(loss_chunks)` of the chunks' `[rows_i]` fp32 losses into `[rows]` (CatBackward0:
/// narrowed views of the gradient, no allocation). One tensor is still copied. Beyond
/// [`MAX_CAT_INPUTS`] chunks the cat is emitted in two levels: the groups' outputs are extra
/// `[≤ 255 · 128]` fp32 copies in forward (4 bytes a row, against the `[rows, V]` logits).
fn cat_losses(b: &mut Builder, losses: &[Tid], rows: u64) -> Tid {
    let shape = |n: u64| Shape::new(&[Dim::N(n as u32)], Split::None);
    if losses.len() == 1 {
        return b.copy(losses[0], shape(rows));
    }
    if losses.len() > MAX_CAT_INPUTS {
        let groups: Vec<Tid> = losses
            .chunks(MAX_CAT_INPUTS)
            .map(|g| {
                let n: u64 = g.iter().map(|&t| b.bytes(t) as u64 / 4).sum();
                cat_losses(b, g, n)
            })
            .collect();
        return cat_losses(b, &groups, rows);
    }
    let out = b.out(shape(rows), Dt::F32, true);
    let bw: Vec<B> = (0..losses.len()).map(|i| B::Pass { input: i as u8, output: 0 }).collect();
    b.op("cat", "CatBackward0", losses, &[out], &[], &bw)[0]
}

#[cfg(test)]
mod tests {
    use crate::estimator::config::{Config, Framework, Precision, Recompute};
    use crate::estimator::estimate;
    use crate::estimator::presets::preset;

    fn base() -> Config {
        Config {
            model: "llama-3.1-8b".into(),
            arch: preset("llama-3.1-8b").expect("preset").spec,
            seq: 4096,
            precision: Precision::Bf16,
            framework: Framework::Litgpt,
            ..Config::default()
        }
    }

    /// Mistral 7B v0.1's config sets a 4,096-token window on every layer: litgpt builds its
    /// `[s, s]` mask in each layer whatever the sequence, so it keeps more than Llama's shape.
    #[test]
    fn litgpt_mistral_keeps_a_window_mask_in_every_layer() {
        let mistral = preset("mistral-7b-v0.1").expect("preset").spec;
        let unwindowed =
            crate::estimator::model::ModelSpec { window: 0, window_layers: crate::estimator::model::LayerRule::None, ..mistral.clone() };
        let with = estimate(&Config { arch: mistral, ..base() }).expect("estimates");
        let without = estimate(&Config { arch: unwindowed, ..base() }).expect("estimates");
        // 32 layers × 4096² bf16 masks at least.
        assert!(with.memory.activations >= without.memory.activations + 32 * 4096 * 4096 * 2);
    }

    /// litgpt's GPT keeps other tensors than transformers' Llama (a fused qkv, fp32 RoPE
    /// products against its buffers, fp32 logits for the chunked loss) and holds its RoPE cache
    /// for the training sequence, in fp32.
    #[test]
    fn litgpt_llama_keeps_its_own_tensors_and_holds_an_fp32_rope_cache_for_the_sequence() {
        let lit = base();
        let hf = estimate(&Config { framework: Framework::Hf, ..lit.clone() }).expect("hf estimates");
        let own = estimate(&lit).expect("litgpt estimates");
        assert_ne!(own.memory.activations, hf.memory.activations);
        // cos and sin: 2 × 4096 positions × 128 dims × 4 bytes.
        assert_eq!(super::buffer_bytes(&lit), Some(2 * 4096 * 128 * 4));
        assert_eq!(super::buffer_bytes(&Config { framework: Framework::Hf, ..lit }), None);
    }

    /// A toy by hand: b = 2, s = 64 gives 126 shifted rows, one chunk of 126; b = 4, s = 4096
    /// gives 16,380 rows, 128 chunks, the last of 124 rows.
    #[test]
    fn the_loss_splits_the_shifted_rows_in_chunks_of_128() {
        assert_eq!(super::loss_chunks(2 * 63), (126, 1, 126));
        assert_eq!(super::loss_chunks(4 * 4095), (128, 128, 124));
        assert_eq!(super::loss_chunks(256), (128, 2, 128));
    }

    /// b = 8, s = 8,192: 65,528 rows in 512 chunks, more than one node's backward addresses: the
    /// loss cat runs in two levels and the estimate still comes out, the kept log-softmax being
    /// the whole shifted fp32 logits (65,528 × 128,256 × 4 bytes) and more.
    #[test]
    fn a_loss_of_hundreds_of_chunks_still_estimates() {
        let big = Config { batch: 8, seq: 8192, ..base() };
        let e = estimate(&big).expect("estimates");
        assert!(e.memory.activations > 65_528 * 128_256 * 4);
    }

    /// What litgpt's code does not have, or what was not measured (Mixtral's `LLaMAMoE`), is
    /// refused by name.
    #[test]
    fn litgpt_refuses_other_families_lora_and_selective_recomputation_by_name() {
        let gemma = preset("gemma-2-9b").or_else(|| preset("gemma-7b")).expect("a gemma preset").spec;
        let named = |c: Config| estimate(&c).is_err_and(|e| e.to_string().contains("litgpt"));
        // Gemma's published configs tie the output: litgpt never does.
        assert!(named(Config { arch: gemma, ..base() }));
        let mixtral = preset("mixtral-8x7b-v0.1").expect("a mixtral preset").spec;
        assert!(estimate(&Config { arch: mixtral, ..base() }).is_err_and(|e| e.to_string().contains("not modelled yet")));
        assert!(named(Config { recompute: Recompute::Selective, ..base() }));
        assert!(named(Config { precision: Precision::MixedBf16, ..base() }));
        assert!(named(Config { gpus: 8, ..base() }));
        // Its RoPE cache is built for at most block_size positions: a longer sequence is refused.
        let long = Config { seq: base().arch.max_pos + 1, ..base() };
        assert!(named(long));
    }
}
