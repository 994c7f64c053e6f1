//! What every family's code shares: the kinds and variants of decoder layers, the model-level
//! tensors the layers read ([`Shared`]), one GPU's parameters ([`Params`]), the helpers about
//! positions, and the modules and functions the families' modeling files all call, each once,
//! with parameters where the families differ:
//! - the shapes of token rows and token–expert pairs ([`tokens`], [`pairs`]);
//! - ops several families' code dispatches as such ([`dropout`], [`cat_promote`], [`sub`],
//!   [`clamp_backward`]);
//! - the embedding blocks ([`token_embedding`], [`lookup`], [`embed_then`]);
//! - the positions and the masks `masking_utils.py` builds ([`cache_position`],
//!   [`causal_mask`], [`sliding_window_mask`], their parts [`sdpa_mask`], [`additive_mask`]);
//! - the rotary tables ([`rope_pair`], [`rotary_tables`], [`rotary_polar`]) and the rotation of
//!   two halves ([`rotate_halves`]; Llama's `rotate_half` is `llama::rope`);
//! - the norms: the RMSNorm forms ([`rms_norm`], [`Rms`]), OLMo's fp32 LayerNorm, the norm
//!   modules of the layers and the final norm ([`Norm`], [`final_norm`]);
//! - the attention's input and output projections ([`AttnW`], [`qkv`], [`fused_qkv`],
//!   [`out_proj`]);
//! - the MLPs: the gated MLP ([`MlpW`], [`gated_mlp`]) and the plain `fc1` → act → `fc2`
//!   ([`plain_mlp`], [`activation`]).
//!
//! The decoder layers' residual structures are `llama::decoder_layer` (pre-norm) and
//! `gemma::post_norm_layer`; the MoE blocks are in `moe.rs` and `sigmoid_moe.rs`.

use super::super::blocks::shapes::{heads, heads_bshd, tok, tok_tp};
use super::super::blocks::Keep;
use super::super::ir::{Builder, DType, Dim, Dt, Origin, Shape, Split, Tid, B, S, X};
use crate::estimator::config::Attention;
use crate::estimator::ctx::Q;
use crate::estimator::model::{Activation, Linear, ModelSpec, NormKind, Positions};
use crate::estimator::params::{LocalGroup, Role};
use crate::estimator::part::Part;

/// The kind of a decoder layer: what its feed-forward block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Dense,
    Moe,
}

/// Model-level tensors every layer reads (created by the model's forward before the layers).
#[derive(Clone, Copy, Debug, Default)]
pub struct Shared {
    /// RoPE cos and sin `[1, s, d_rot]` (or none).
    pub cos: Option<Tid>,
    pub sin: Option<Tid>,
    /// `cache_position` / `position_ids` `[s]` int64.
    pub pos: Option<Tid>,
    /// Eager attention's additive mask `[b, 1, s, s_kv]` (the full-attention layers').
    pub mask: Option<Tid>,
    /// The sliding-window layers' mask (Gemma-2/3); a layer's view puts it in `mask`.
    pub mask_local: Option<Tid>,
    /// The token embedding's weight (the LM head's, when tied).
    pub emb_w: Option<Tid>,
    /// Locals of the model's forward held until it returns, not passed to the layers
    /// (Llama's `inputs_embeds`, which is also the first layer's input; GPT-2's token and
    /// position embeddings).
    pub locals: [Option<Tid>; 2],
    /// The sliding-window layers' own RoPE cos and sin (Gemma-3's local base,
    /// `rope_parameters["sliding_attention"]`); a layer's view puts them in `cos` and `sin`.
    pub cos_local: Option<Tid>,
    pub sin_local: Option<Tid>,
    /// A layer's view: its mixer is the gated DeltaNet (Qwen3-Next's `linear_attention` layers).
    pub linear: bool,
    /// A layer's view: it attends through a sliding window (torchtune's Gemma 2 builds its mask
    /// in the layer).
    pub sliding: bool,
}

/// The shared tensors' slots, in a fixed order.
pub const NSLOTS: usize = 7;

impl Shared {
    /// Every shared tensor, slot by slot (cos, sin, pos, mask, mask_local, cos_local,
    /// sin_local).
    pub fn slots(&self) -> [Option<Tid>; NSLOTS] {
        [self.cos, self.sin, self.pos, self.mask, self.mask_local, self.cos_local, self.sin_local]
    }
    pub fn all(&self) -> impl Iterator<Item = Tid> {
        self.slots().into_iter().flatten()
    }
    /// What a layer reads: a sliding-window layer's mask is the local one; a NoPE layer reads
    /// no cos/sin; a linear-attention layer no mask.
    pub fn view(&self, var: Var) -> Shared {
        let mut v = *self;
        if var.sliding && self.mask_local.is_some() {
            v.mask = self.mask_local;
        }
        if var.sliding && self.cos_local.is_some() {
            v.cos = self.cos_local;
            v.sin = self.sin_local;
        }
        v.mask_local = None;
        v.cos_local = None;
        v.sin_local = None;
        v.linear = var.linear;
        v.sliding = var.sliding;
        if var.linear {
            // A linear-attention layer reads no causal mask: Qwen3-Next's `linear_attn_mask` and
            // Granite 4.0-H's `mamba_mask` are None without padding.
            v.mask = None;
        }
        if var.nope {
            v.cos = None;
            v.sin = None;
        }
        v
    }
    /// The global slots a layer's view reads (bit per slot).
    pub fn used(&self, var: Var) -> u8 {
        let mut bits = 0u8;
        let local_rope = var.sliding && self.cos_local.is_some();
        for (i, t) in self.slots().into_iter().enumerate() {
            let reads = match i {
                3 | 4 => !var.linear && (i == 4) == (var.sliding && self.mask_local.is_some()),
                0 | 1 => !local_rope && !var.nope,
                5 | 6 => local_rope && !var.nope,
                _ => true,
            };
            if t.is_some() && reads {
                bits |= 1 << i;
            }
        }
        bits
    }
}

/// What sets one decoder layer's attention apart from another's of the same [`Kind`]: a
/// sliding-window mask, no rotary embedding (NoPE: SmolLM3's and Llama 4's `no_rope_layers`
/// entries that are 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Var {
    pub sliding: bool,
    pub nope: bool,
    /// Fully checkpointed on its own, whatever `recompute` says of the others: one of every
    /// `recompute_every` layers (torchtitan's `selective_ac_option = "N"`), or one of the first
    /// `recompute_layers` of its virtual stage (Megatron's block method, the others then kept
    /// whole): `step::model::checkpointed_alone`.
    pub every_nth: bool,
    /// A linear-attention layer (`layer_types` "linear_attention"): a gated DeltaNet (Qwen3-Next,
    /// Qwen3.5) or a Mamba-2 mixer in place of attention (Granite 4.0-H).
    pub linear: bool,
}

/// The parameters of one GPU's stage, looked up by their tensor-table name.
pub struct Params<'g> {
    pub groups: &'g [LocalGroup],
    pub weight: DType,
    /// Bytes per gradient element.
    pub grad_elem: u64,
    /// Shards of gradients (ZeRO-2 and up) for dense and expert tensors.
    pub shards: u64,
    pub expert_shards: u64,
}

impl Params<'_> {
    /// Elements of one instance of `name` and whether it trains.
    pub fn find(&self, name: &str) -> Option<(u64, bool, bool)> {
        self.groups.iter().find(|g| g.group.name == name && !g.adapter).map(|g| (g.group.numel(), g.role == Role::Trainable, g.expert))
    }

    /// A parameter tensor for `name` in the program (none when the model has no such tensor).
    pub fn w(&self, b: &mut Builder, name: &str) -> Option<Tid> {
        let (numel, trains, expert) = self.find(name)?;
        Some(self.make(b, numel, trains, expert))
    }

    /// A parameter of `numel` elements.
    pub fn make(&self, b: &mut Builder, numel: u64, trains: bool, expert: bool) -> Tid {
        let bytes = numel as u128 * self.weight.bytes() as u128;
        let shards = if expert { self.expert_shards } else { self.shards } as u128;
        let grad = if trains { (numel as u128).div_ceil(shards.max(1)) * self.grad_elem as u128 } else { 0 };
        b.param(bytes, self.weight, grad)
    }
}

/// A token tensor `[b, s, h]` given to a program by its caller.
pub fn input(b: &mut Builder, free_fwd: bool, free_bwd: bool) -> Tid {
    b.external(Shape::tok(Q::H), Dt::Resid, Origin::Input { free_fwd, free_bwd }, true)
}

/// Rotary dims per head.
pub fn rotary_dims(spec: &ModelSpec) -> u64 {
    if spec.is_mla() {
        // MLA rotates only the shared rotary part of each head (`qk_rope_head_dim`).
        return spec.qk_rope_dim.max(1);
    }
    (spec.head_dim * spec.rotary_pct).div_ceil(100).max(1)
}

/// Whether the model computes RoPE cos/sin.
pub fn has_rope(spec: &ModelSpec) -> bool {
    spec.positions == Positions::Rope
}

/// Norm kinds that keep statistics in the input dtype on CPU.
pub fn layer_norm_like(n: NormKind) -> bool {
    matches!(n, NormKind::Layernorm | NormKind::LayernormNoBias)
}

/// The shape of the model-level cos/sin `[1, s, d_rot]` of Llama's rotary embedding.
pub fn cos_shape(spec: &ModelSpec) -> Shape {
    let d = if rotary_dims(spec) == spec.head_dim { Dim::Q(Q::D) } else { Dim::X(X::DRot) };
    Shape::new(&[Dim::Q(Q::S), d], Split::None)
}

/// Whether decoder layer `i` (its index in the model) has no rotary embedding (NoPE: SmolLM3's
/// and Llama 4's `no_rope_layers` entries that are 0; see `smollm3.rs`).
pub fn nope(spec: &ModelSpec, i: usize) -> bool {
    has_rope(spec) && spec.nope_layers.contains(i as u64)
}

/// Whether a layer's view of the shared tensors is a NoPE layer's: the model computes cos/sin
/// but this layer does not read them.
pub fn nope_view(spec: &ModelSpec, sh: &Shared) -> bool {
    has_rope(spec) && sh.cos.is_none()
}

/// The shape and dtype of a mask as the layers receive it: SDPA's bool `[1, 1, s, s_kv]`
/// (`sdpa_mask`), or eager's additive `[b, 1, s, s_kv]` in the residual dtype (both counted
/// without their unit dims).
pub fn mask_shape(attn: Attention) -> (Shape, Dt) {
    match attn {
        Attention::Eager => (Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None), Dt::Resid),
        _ => (Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None), Dt::Bool),
    }
}

/// Whether a local window of `window` tokens materializes its mask at `s_kv` keys
/// (`_ignore_causal_mask_sdpa`: the `is_causal` shortcut needs `kv_length < local_attention_size`).
pub fn masked(window: u64, s_kv: u64) -> bool {
    s_kv >= window
}

/// A later pipeline stage's first tensor: the activation the stage before sends.
pub fn received(b: &mut Builder) -> Tid {
    b.module = "model";
    b.part = Part::Embedding;
    let out = b.out(Shape::tok(Q::H), Dt::Resid, true);
    b.op("recv", "", &[], &[out], &[], &[])[0]
}

/// Counts `t` under `part` wherever a node keeps it (a model-level tensor: the positions, the
/// masks, the rotary tables).
pub fn set_part(b: &mut Builder, t: Tid, part: Part) -> Tid {
    b.p.tensors[t as usize].part = Some(part);
    t
}

// ------------------------------------------------------------------ shapes

/// `[s]`: one entry per position.
pub fn seq() -> Shape {
    Shape::new(&[Dim::Q(Q::S)], Split::None)
}

/// `[b, s, extra…]`: one row per token.
pub fn tokens(extra: &[Dim]) -> Shape {
    let mut d = vec![Dim::Q(Q::B), Dim::Q(Q::S)];
    d.extend_from_slice(extra);
    Shape::new(&d, Split::None)
}

/// `[b, s, K, extra…]`: one row per token–expert pair.
pub fn pairs(extra: &[Dim]) -> Shape {
    let mut d = vec![Dim::Q(Q::B), Dim::Q(Q::S), Dim::X(X::K)];
    d.extend_from_slice(extra);
    Shape::new(&d, Split::None)
}

// ------------------------------------------------------------------ ops

/// `nn.Dropout` (the module at `module`, or `F.dropout` called there) on `x`: a no-op at p = 0.
pub fn dropout(b: &mut Builder, module: &'static str, x: Tid) -> Tid {
    b.module = module;
    b.part = Part::Dropout;
    b.dropout(x)
}

/// `torch.cat((a, b), -1)` with type promotion: under autocast RoPE's product with the fp32
/// cos/sin is fp32 while the pass-through part is bf16, and `cat` first copies the narrower
/// operand to the wider dtype (`_to_copy`; ToCopyBackward0 casts its gradient back).
pub fn cat_promote(b: &mut Builder, x: Tid, y: Tid, shape: Shape) -> Tid {
    let (dx, dy) = (b.t(x).dtype, b.t(y).dtype);
    let (x, y) = if dx.bytes() < dy.bytes() {
        let dt = b.t(y).dt;
        (b.to_copy(x, dt), y)
    } else if dy.bytes() < dx.bytes() {
        let dt = b.t(x).dt;
        (x, b.to_copy(y, dt))
    } else {
        (x, y)
    };
    let dt = b.t(x).dt;
    let rg = b.rg(x) || b.rg(y);
    let out = b.out(shape, dt, rg);
    let bw: &[B] = &[B::Pass { input: 0, output: 0 }, B::Pass { input: 1, output: 0 }];
    b.op("cat", "CatBackward0", &[x, y], &[out], &[], if rg { bw } else { &[] })[0]
}

/// `a - b` (SubBackward0): `other`'s gradient `-grad` (`neg`, summed to its shape when it was
/// broadcast), `self`'s the gradient itself.
pub fn sub(b: &mut Builder, a: Tid, o: Tid) -> Tid {
    let (shape, dt) = (b.shape(a), b.t(a).dt);
    let (ra, ro) = (b.rg(a), b.rg(o));
    let out = b.out(shape, dt, ra || ro);
    let (full, fd) = (b.bytes(a), b.t(a).dtype);
    let mut bw: Vec<B> = Vec::with_capacity(6);
    if ro {
        bw.push(B::Alloc { bytes: full, dtype: fd, op: "neg" });
        if b.bytes(o) < full {
            bw.push(B::Apply);
            bw.push(B::Alloc { bytes: b.grad_bytes(o), dtype: b.t(o).dtype, op: "sum" });
            bw.push(B::Free(0));
            bw.push(B::Grad { input: 1, temp: 1 });
        } else {
            bw.push(B::Grad { input: 1, temp: 0 });
        }
    }
    if ra {
        bw.push(B::Pass { input: 0, output: 0 });
    }
    b.op("sub", "SubBackward0", &[a, o], &[out], &[], &bw)[0]
}

/// ClampBackward1's script for an input `x` (`clamp_backward`:
/// `where((self >= min) & (self <= max), grad, 0)`): a scalar zero, a bool mask per bound (`both`
/// bounds, or `max` alone), the `where` gradient; the masks and the scalar are freed. Nothing
/// when `x` needs no gradient.
pub fn clamp_backward(b: &Builder, x: Tid, both: bool) -> Vec<B> {
    if !b.rg(x) {
        return Vec::new();
    }
    let (bytes, dtype) = (b.bytes(x), b.t(x).dtype);
    let numel = bytes / dtype.bytes().max(1) as u128;
    let masks: &[&'static str] = if both { &["gt", "lt"] } else { &["lt"] };
    let mut bw = vec![B::Alloc { bytes: dtype.bytes() as u128, dtype, op: "scalar_tensor" }];
    bw.extend(masks.iter().map(|&op| B::Alloc { bytes: numel, dtype: DType::Bool, op }));
    bw.push(B::Alloc { bytes, dtype, op: "where" });
    let grad = masks.len() as u8 + 1;
    bw.extend((0..grad).rev().map(B::Free));
    bw.push(B::Grad { input: 0, temp: grad });
    bw
}

// ------------------------------------------------------------------ embeddings

/// `nn.Embedding` on `ids` into `shape` (`F.embedding`): keeps the ids; EmbeddingBackward0
/// allocates the weight's gradient (`embedding_dense_backward`). Without a weight, the lookup
/// alone.
pub fn lookup(b: &mut Builder, ids: Tid, w: Option<Tid>, shape: Shape) -> Tid {
    let Some(w) = w else { return b.plain("embedding", &[ids], shape, Dt::Resid) };
    let g = b.grad_bytes(w);
    lookup_with_grad(b, ids, w, shape, g)
}

/// [`lookup`] with a weight whose gradient is `g` bytes rather than the weight's own size
/// (torchtitan's vocabulary-sharded embedding under TP, whose gradient is the whole table:
/// `families::torchtitan::tok_embeddings`).
pub fn lookup_with_grad(b: &mut Builder, ids: Tid, w: Tid, shape: Shape, g: u128) -> Tid {
    let rg = b.rg(w);
    let out = b.out(shape, Dt::Resid, rg);
    let bw: &[B] =
        if rg { &[B::Alloc { bytes: g, dtype: b.t(w).dtype, op: "embedding_dense_backward" }, B::Grad { input: 1, temp: 0 }] } else { &[] };
    b.op("embedding", "EmbeddingBackward0", &[ids, w], &[out], &[S::In(0)], bw)[0]
}

/// `self.embed_tokens(input_ids)` (the module at `module`) on the token ids: the residual
/// stream's first tensor and the embedding weight (the head's too when tied).
pub fn token_embedding(b: &mut Builder, p: &Params, ids: Tid, module: &'static str) -> (Tid, Option<Tid>) {
    b.part = Part::Embedding;
    b.module = module;
    let emb_w = p.w(b, "embed_tokens.weight");
    (lookup(b, ids, emb_w, tok(Q::H)), emb_w)
}

/// The embedding scaled by √h inside the embedding module (`Gemma2ScaledWordEmbedding`:
/// `embedding(ids) * self.embed_scale.to(self.weight.dtype)`, a 0-dim buffer).
pub fn scale_embedding(b: &mut Builder, e: Tid) -> Tid {
    let scale = b.external(Shape::scalar(), Dt::Resid, Origin::Buffer, false);
    b.mul(e, scale)
}

/// The embedding weight a tied LM head reads (none for an untied one).
pub fn tied(spec: &ModelSpec, emb_w: Option<Tid>) -> Option<Tid> {
    if spec.tied {
        emb_w
    } else {
        None
    }
}

/// The model's forward before the layers on the first pipeline stage, Llama's way
/// (`LlamaModel.forward`):
/// ```python
/// inputs_embeds = self.embed_tokens(input_ids)      # Gemma: times the embed_scale buffer
/// cache_position = …; position_ids = …; causal_mask = …; position_embeddings = …
/// hidden_states = inputs_embeds
/// ```
/// `after` builds what the forward computes from the positions (the layers' [`Shared`]
/// tensors; also a later stage's whole prologue), with the module set to `model`;
/// `inputs_embeds` stays bound until the model returns.
pub fn embed_then(
    b: &mut Builder,
    p: &Params,
    spec: &ModelSpec,
    ids: Tid,
    scaled: bool,
    after: impl FnOnce(&mut Builder) -> Shared,
) -> (Tid, Shared) {
    let (x0, emb_w) = token_embedding(b, p, ids, "model.embed_tokens");
    let x0 = if scaled { scale_embedding(b, x0) } else { x0 };
    b.module = "model";
    let sh = after(b);
    (x0, Shared { emb_w: tied(spec, emb_w), locals: [Some(x0), sh.locals[1]], ..sh })
}

// ------------------------------------------------------------------ positions and masks

/// `torch.arange(past, past + s)`: an int64 `[s]` (the `arange`, then the offset's `add`).
pub fn arange(b: &mut Builder) -> Tid {
    let ar = b.plain("arange", &[], seq(), Dt::I64);
    b.plain("add", &[ar], seq(), Dt::I64)
}

/// `cache_position` (`position_ids` is its view `[None]`): [`arange`], kept by the layers'
/// nodes (counted with the checkpoints).
pub fn cache_position(b: &mut Builder) -> Tid {
    let pos = arange(b);
    set_part(b, pos, Part::Checkpoints)
}

/// `find_packed_sequence_indices(position_ids)`: a diff with a prepended column, `!= 1`,
/// `cumsum`, and the `all()` check — int64 temporaries of `[b, s]`.
pub fn packed_detection(b: &mut Builder, pos: Tid) {
    let bs = || Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S)], Split::None);
    let first = b.plain("sub", &[pos], Shape::new(&[Dim::Q(Q::B), Dim::N(1)], Split::None), Dt::I64);
    let cat = b.plain("cat", &[first, pos], Shape::new(&[Dim::Q(Q::B), Dim::Plus1(Q::S)], Split::None), Dt::I64);
    let diff = b.plain("sub", &[cat], bs(), Dt::I64);
    let ne = b.plain("ne", &[diff], bs(), Dt::Bool);
    let cs = b.plain("cumsum", &[ne], bs(), Dt::I64);
    let eq = b.plain("eq", &[cs], Shape::new(&[Dim::Q(Q::B)], Split::None), Dt::Bool);
    let _all = b.plain("all", &[eq], Shape::scalar(), Dt::Bool);
    b.hold(first);
    b.hold(diff);
    b.hold(cs);
}

/// `sdpa_mask` (`masking_utils.py`) with `causal_mask_function`, or with
/// `sliding_window_causal_mask_function` when `window`: the batch, head, kv and query indices
/// (`arange`s; the kv and query ones offset by the past, an `add` each), then
/// ```python
/// causal = kv_idx <= q_idx                                         # le
/// window = (kv_idx > q_idx - sliding_window) & padding             # sub, gt, new_ones, bitwise_and
/// mask = window & causal                                           # bitwise_and
/// ```
/// a bool `[1, 1, s, s_kv]` (counted `[s, s_kv]`). The indices are the mask function's locals,
/// held until it returns.
pub fn sdpa_mask(b: &mut Builder, window: bool) -> Tid {
    let ss = || Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None);
    sdpa_mask_of(b, |b, kv, qi| {
        if !window {
            return b.plain("le", &[kv, qi], ss(), Dt::Bool);
        }
        let one = b.plain("new_ones", &[], Shape::scalar(), Dt::Bool);
        let sub = b.plain("sub", &[qi], seq(), Dt::I64);
        let gt = b.plain("gt", &[kv, sub], ss(), Dt::Bool);
        let and1 = b.plain("bitwise_and", &[one, gt], ss(), Dt::Bool);
        let le = b.plain("le", &[kv, qi], ss(), Dt::Bool);
        b.plain("bitwise_and", &[and1, le], ss(), Dt::Bool)
    })
}

/// `sdpa_mask` with the mask function `mask_fn` (on the kv and query indices): the batch,
/// head, kv and query indices, the function's ops, the indices held until `sdpa_mask` returns.
pub fn sdpa_mask_of(b: &mut Builder, mask_fn: impl FnOnce(&mut Builder, Tid, Tid) -> Tid) -> Tid {
    let ba = b.plain("arange", &[], Shape::new(&[Dim::Q(Q::B)], Split::None), Dt::I64);
    let ha = b.plain("arange", &[], Shape::new(&[Dim::N(1)], Split::None), Dt::I64);
    let kv = arange(b);
    let qi = arange(b);
    let m = mask_fn(b, kv, qi);
    for t in [ba, ha, kv, qi] {
        b.hold(t);
    }
    m
}

/// Eager attention's mask from SDPA's bool one: `torch.where(mask, 0, min_dtype)` (`zeros`,
/// `scalar_tensor`), an additive `[b, 1, s, s_kv]` in the residual dtype, kept by the layers.
pub fn additive_mask(b: &mut Builder, m: Tid) -> Tid {
    let zero = b.plain("zeros", &[], Shape::scalar(), Dt::Resid);
    let min = b.plain("scalar_tensor", &[], Shape::scalar(), Dt::Resid);
    let (shape, dt) = mask_shape(Attention::Eager);
    let w = b.plain("where", &[m, zero, min], shape, dt);
    // A checkpointed layer keeps it as a keyword argument (the checkpoints' row); a whole-model
    // graph ([`graph_mask`]) keeps it for SDPA's backward, which reads the mask: attention's.
    set_part(b, w, if graph_mask(b) { Part::AttentionCore } else { Part::Checkpoints })
}

/// Whether the causal mask is built inside a compiled graph (`compile_regions = model`): under
/// tracing `_ignore_causal_mask_sdpa` cannot skip it (transformers 5.24 `masking_utils.py`), so
/// `create_causal_mask` materializes the additive mask even for SDPA, which then repeats k and v
/// (`use_gqa_in_sdpa` is false with a mask). Measured: `recipes/llama-gqa.json` `compile=model`,
/// `where` `[b, 1, s, s]` saved once, k and v saved repeated (FINDINGS §15.1.z).
pub fn graph_mask(b: &Builder) -> bool {
    b.c.cfg.compiles_whole_model()
}

/// `create_causal_mask`: packed-sequence detection ([`packed_detection`]), and for eager
/// attention the materialized additive mask ([`sdpa_mask`], [`additive_mask`]); SDPA runs
/// causal without one.
pub fn causal_mask(b: &mut Builder, pos: Tid, attn: Attention) -> Option<Tid> {
    packed_detection(b, pos);
    (attn == Attention::Eager || graph_mask(b)).then(|| {
        let m = sdpa_mask(b, false);
        additive_mask(b, m)
    })
}

/// `create_sliding_window_causal_mask`, materialized: the packed-sequence check, then the
/// window's mask — bool for SDPA, additive for eager — kept by the layers.
pub fn sliding_window_mask(b: &mut Builder, pos: Tid, attn: Attention) -> Tid {
    packed_detection(b, pos);
    let m = sdpa_mask(b, true);
    // Built inside a compiled whole model ([`graph_mask`]): additive, as eager's (measured:
    // `recipes/mistral.json` `compile=model`, one `[b, 1, s, s]` mask of the model dtype saved).
    if attn == Attention::Eager || graph_mask(b) {
        additive_mask(b, m)
    } else {
        set_part(b, m, Part::Checkpoints)
    }
}

/// `create_sliding_window_causal_mask` for a window of `window` tokens: the mask whenever eager
/// attention runs or the window is shorter than the keys ([`masked`]); otherwise SDPA runs
/// causal and only the packed-sequence check is made.
pub fn sliding_window_mask_for(b: &mut Builder, pos: Tid, attn: Attention, window: u64) -> Option<Tid> {
    if attn == Attention::Eager || masked(window, b.c.n(Q::S_KV)) || graph_mask(b) {
        Some(sliding_window_mask(b, pos, attn))
    } else {
        packed_detection(b, pos);
        None
    }
}

// ------------------------------------------------------------------ rotary tables

/// A rotary embedding's `forward` (`model.rotary_emb`) on the positions:
/// ```python
/// freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
/// emb = torch.cat((freqs, freqs), dim=-1)                 # none in gpt-oss: emb = freqs
/// cos = emb.cos() * self.attention_scaling
/// sin = emb.sin() * self.attention_scaling
/// return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)     # OLMo: uncast, fp32
/// ```
/// `freqs` (a `mul` for one row of positions) of `half`; the `cat` of `full` when given;
/// `cast`: the tables are cast to the residual dtype. `freqs`, `emb` and the fp32 tables are
/// the forward's locals. Returns `(cos, sin)`, counted with the embedding.
///
/// Inside a compiled whole model ([`graph_mask`]: `compile_regions = model`) the tables are the
/// graph's own, made from the `inv_freq` buffer and an `iota` of the positions: the partitioner
/// keeps neither for backward but recomputes the chain there inside the rotary backward's
/// kernels (measured: `recipes/llama-gqa.json` `compile=model` lists `iota`, `mul`, `cos` and
/// `sin` among `recomputed_in_backward` and only `inv_freq` of them among the saved values;
/// saved bytes 8,192 B = fp32 cos and sin `[1, 64, 16]` under what the eager tables would add).
/// They are then model state as a buffer is ([`Origin::Buffer`]: not an activation, no
/// allocation of the step's) — what their kernels hold during the forward, two `[1, s, d_rot]`
/// tables, is left out.
pub fn rotary_tables(b: &mut Builder, pos: Tid, half: Shape, full: Option<Shape>, cast: bool) -> (Tid, Tid) {
    b.module = "model.rotary_emb";
    if graph_mask(b) {
        let (shape, dt) = (full.unwrap_or(half), if cast { Dt::Resid } else { Dt::F32 });
        return (b.external(shape, dt, Origin::Buffer, false), b.external(shape, dt, Origin::Buffer, false));
    }
    let pf = b.plain("_to_copy", &[pos], seq(), Dt::F32);
    let freqs = b.plain("mul", &[pf], half, Dt::F32);
    let (emb, shape) = match full {
        Some(full) => (b.plain("cat", &[freqs], full, Dt::F32), full),
        None => (freqs, half),
    };
    let c = b.plain("cos", &[emb], shape, Dt::F32);
    let cs = b.plain("mul", &[c], shape, Dt::F32);
    let s = b.plain("sin", &[emb], shape, Dt::F32);
    let ss = b.plain("mul", &[s], shape, Dt::F32);
    let (cos, sin) = if cast { (b.to_copy(cs, Dt::Resid), b.to_copy(ss, Dt::Resid)) } else { (cs, ss) };
    for t in [freqs, emb, cs, ss] {
        b.hold(t);
    }
    (set_part(b, cos, Part::Embedding), set_part(b, sin, Part::Embedding))
}

/// `LlamaRotaryEmbedding.forward` ([`rotary_tables`]: `cat`, cast) where the model has RoPE:
/// cos and sin `[1, s, d_rot]`.
pub fn rope_pair(b: &mut Builder, spec: &ModelSpec, pos: Tid, cast: bool) -> (Option<Tid>, Option<Tid>) {
    if !has_rope(spec) {
        return (None, None);
    }
    let full = cos_shape(spec);
    let half = if rotary_dims(spec) == spec.head_dim { full.last(Dim::Half(Q::D)) } else { full.last(Dim::HalfX(X::DRot)) };
    let (c, s) = rotary_tables(b, pos, half, Some(full), cast);
    (Some(c), Some(s))
}

/// A complex rotary table (DeepSeek-V2's and Llama 4's `rotary_emb.forward`):
/// ```python
/// freqs = position_ids[..., None].float() * self.inv_freq
/// freqs_cis = torch.polar(torch.ones_like(freqs), freqs)
/// freqs_cis = freqs_cis * self.attention_scaling
/// ```
/// `freqs` of `half` (the forward's local); `freqs_cis` complex64, carried as fp32 of `full`
/// (the same bytes) whatever the model dtype.
pub fn rotary_polar(b: &mut Builder, pos: Tid, half: Shape, full: Shape) -> Tid {
    b.module = "model.rotary_emb";
    let pf = b.plain("_to_copy", &[pos], seq(), Dt::F32);
    let freqs = b.plain("mul", &[pf], half, Dt::F32);
    let ones = b.plain("ones_like", &[freqs], half, Dt::F32);
    let polar = b.plain("polar", &[ones, freqs], full, Dt::F32);
    let fc = b.plain("mul", &[polar], full, Dt::F32);
    b.hold(freqs);
    set_part(b, fc, Part::Embedding)
}

/// The rotation of a head's two halves `x1`, `x2` by the first halves of cos and sin
/// (gpt-oss's `_apply_rotary_emb` on `torch.chunk(x, 2, dim=-1)`, DeepSeek-V3's
/// `apply_rotary_pos_emb_interleave` on `x[..., 0::2]`, `x[..., 1::2]`):
/// ```python
/// first_ = first_half * cos - second_half * sin
/// second_ = second_half * cos + first_half * sin
/// return torch.cat((first_, second_), dim=-1)
/// ```
/// into `full`. The products keep only the shared cos/sin; the output is a contiguous `cat`.
pub fn rotate_halves(b: &mut Builder, x1: Tid, x2: Tid, cos: Tid, sin: Tid, full: Shape) -> Tid {
    let m1 = b.mul(x1, cos);
    let m2 = b.mul(x2, sin);
    let lo = sub(b, m1, m2);
    let m3 = b.mul(x2, cos);
    let m4 = b.mul(x1, sin);
    let hi = b.add(m3, m4);
    b.cat2(lo, hi, full)
}

/// The rotation by halves that torchtune 0.6.1 (`RotaryPositionalEmbeddings` in its halves
/// form, `Phi3RotaryPositionalEmbeddings`) and litgpt 0.5.13 (`model.py apply_rope`) write alike,
/// on the halves of `x`'s last dim (`half`: the head dim's, or the rotated part's):
/// ```python
/// x1 = x[..., : d // 2]; x2 = x[..., d // 2 :]
/// rotated = torch.cat((-x2, x1), dim=-1)
/// x_out = (x * cos) + (rotated * sin)
/// return x_out.to(x.dtype)
/// ```
/// `rotated` is a local until the return; the products keep `cos` and `sin` as given.
pub fn rope_rotated_halves(b: &mut Builder, x: Tid, cos: Tid, sin: Tid, half: Dim) -> Tid {
    let dt = b.t(x).dt;
    let full = b.shape(x);
    let half = full.last(half);
    let x1 = b.slice(x, half);
    let x2 = b.slice(x, half);
    let ng = b.unary("neg", "NegBackward0", x2, Keep::Nothing, "neg");
    let rotated = b.cat2(ng, x1, full);
    let m1 = b.mul(x, cos);
    let m2 = b.mul(rotated, sin);
    let sum = b.add(m1, m2);
    let out = b.to_copy(sum, dt);
    b.hold(rotated);
    out
}

// ------------------------------------------------------------------ norms

/// The forms of transformers' RMSNorms, which differ in where the weight multiplies and which
/// intermediates are the forward's locals (held until it returns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rms {
    /// `LlamaRMSNorm.forward` (and the classes copied from it: Mistral, Qwen, DeepSeek, GLM…):
    /// ```python
    /// input_dtype = hidden_states.dtype
    /// hidden_states = hidden_states.to(torch.float32)
    /// variance = hidden_states.pow(2).mean(-1, keepdim=True)
    /// hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    /// return self.weight * hidden_states.to(input_dtype)
    /// ```
    /// Keeps the fp32 input (pow, mul), the rsqrt, and the normalized input in the input dtype
    /// (the weight's gradient). `variance` and the fp32 product live until the return.
    Llama,
    /// [`Rms::Llama`] with the mean over all of a token's dims after `[b, s]`: a projection
    /// laid out `[b, s, heads, d]` normalized as one row (MiniMax-M2's `q_norm`, `k_norm` over
    /// the whole `q_proj`, `k_proj` outputs).
    LlamaRows,
    /// `GemmaRMSNorm.forward` (Gemma, Gemma-2, Gemma-3):
    /// ```python
    /// output = self._norm(x.float())   # x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    /// output = output * (1.0 + self.weight.float())
    /// return output.type_as(x)
    /// ```
    /// Keeps the fp32 input, the rsqrt, the normalized fp32 input and `1 + weight` (fp32
    /// `[h]`); `_norm`'s locals go at its return.
    Gemma,
    /// `Olmo2RMSNorm.forward`, `GptOssRMSNorm.forward`:
    /// ```python
    /// hidden_states = hidden_states.to(torch.float32)
    /// variance = hidden_states.pow(2).mean(-1, keepdim=True)
    /// hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    /// return (self.weight * hidden_states).to(input_dtype)  # main diff with Llama
    /// ```
    /// The weight multiplies the fp32 normalized input ([`weight_mul`]): the product is fp32,
    /// cast back after. `rows`: the mean runs over all of a token's dims after `[b, s]`
    /// (OLMo-2's `[b, s, 1]`, also over every head of a projection laid out
    /// `[b, s, heads, d]`); else over the last dim.
    WeightFirst { rows: bool },
    /// `Llama4TextRMSNorm.forward` (without a weight, `Llama4TextL2Norm.forward`):
    /// ```python
    /// output = self._norm(x.float()).type_as(x)   # x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
    /// return output * self.weight
    /// ```
    /// One expression: the mean and the sum die as soon as they are used. Keeps the fp32 input,
    /// the rsqrt, and the normalized input cast back (the weight's gradient).
    Llama4,
    /// `torch.nn.RMSNorm` (`F.rms_norm`; aten's composite `rms_norm` on CPU, torch 2.x), which
    /// torchtitan's models use:
    /// ```c++
    /// upcasted_input = input.to(opmath_t);
    /// rqrst_input = rsqrt(at::pow(upcasted_input, 2).mean(dims, true).add_(eps));
    /// result = upcasted_input.mul(rqrst_input);
    /// if (weight) result = result.mul(weight);
    /// return result.type_as(input);
    /// ```
    /// Keeps what [`Rms::WeightFirst`] keeps (the fp32 input, the rsqrt, the fp32 normalized
    /// input for the weight's gradient); C++ locals, nothing is held to the return.
    Torch,
    /// litgpt 0.5.13's `RMSNorm.forward` (`litgpt/model.py`, `add_unit_offset=False`):
    /// ```python
    /// dtype = x.dtype
    /// x = x.float()
    /// norm_x = torch.mean(x * x, dim=self.dim, keepdim=True)
    /// x_normed = x * torch.rsqrt(norm_x + self.eps)
    /// return (x_normed * weight.float()).to(dtype=dtype)
    /// ```
    /// The square is `x * x` (MulBackward0 keeps `x` twice: one storage), the weight is upcast
    /// (a copy for a bf16 weight, kept beside the fp32 normalized input); `x`, `norm_x` and
    /// `x_normed` are locals until the return.
    Litgpt,
    /// [`Rms::Litgpt`] with `add_unit_offset=True` (litgpt's Gemma configs: `"Gemma" in name`):
    /// `weight = 1 + self.weight` (a new `[h]` tensor in the weight's dtype, AddBackward1)
    /// before `weight.float()`; the product keeps the fp32 `[h]` it multiplies by.
    LitgptUnitOffset,
}

/// An RMSNorm of `form` on `x`, with its weight `w` (none: unweighted). The caller's argument
/// lives until the module returns.
pub fn rms_norm(b: &mut Builder, x: Tid, w: Option<Tid>, form: Rms) -> Tid {
    let in_dt = b.t(x).dt;
    let x32 = b.to_copy(x, Dt::F32);
    let sq = if matches!(form, Rms::Litgpt | Rms::LitgptUnitOffset) { b.mul(x32, x32) } else { b.pow(x32) };
    let var = match form {
        Rms::WeightFirst { rows: true } | Rms::LlamaRows => mean_rows(b, sq),
        _ => b.mean_last(sq),
    };
    let ve = b.add_scalar(var);
    let r = b.rsqrt(ve);
    let n32 = b.mul(x32, r);
    let y = match form {
        Rms::Llama | Rms::LlamaRows => {
            let n = b.to_copy(n32, in_dt);
            let y = w.map_or(n, |w| b.mul(w, n));
            b.hold(var);
            b.hold(n32);
            y
        }
        Rms::Gemma => {
            let o = match w {
                Some(w) => {
                    let wf = b.to_copy(w, Dt::F32);
                    let w1 = b.add_scalar(wf);
                    b.mul(n32, w1)
                }
                None => n32,
            };
            b.to_copy(o, in_dt)
        }
        Rms::WeightFirst { .. } => {
            let o = w.map_or(n32, |w| weight_mul(b, w, n32));
            let y = b.to_copy(o, in_dt);
            // `hidden_states` names the normalized input until the return.
            for t in [var, n32, o] {
                b.hold(t);
            }
            y
        }
        Rms::Torch => {
            let o = w.map_or(n32, |w| weight_mul(b, w, n32));
            b.to_copy(o, in_dt)
        }
        Rms::Llama4 => {
            let o = b.to_copy(n32, in_dt);
            w.map_or(o, |w| b.mul(o, w))
        }
        Rms::Litgpt | Rms::LitgptUnitOffset => {
            let o = match w {
                Some(w) => {
                    let w = if form == Rms::LitgptUnitOffset { b.add_scalar(w) } else { w };
                    let wf = b.to_copy(w, Dt::F32);
                    b.mul(n32, wf)
                }
                None => n32,
            };
            let y = b.to_copy(o, in_dt);
            for t in [x32, var, n32] {
                b.hold(t);
            }
            y
        }
    };
    b.hold(x);
    y
}

/// `x.mean(-1, keepdim=True)` over each row of a `[b, s, …]` tensor (a projection laid out
/// `[b, s, heads, d]` is one row of `heads·d` per token) → `[b, s, 1]`; MeanBackward1: one
/// full-size `div`.
fn mean_rows(b: &mut Builder, x: Tid) -> Tid {
    let (shape, dt, rg, bytes, dtype) = (b.shape(x), b.t(x).dt, b.rg(x), b.bytes(x), b.t(x).dtype);
    let d = shape.dims();
    let rows = Shape::new(&[d[0], d[1], Dim::N(1)], Split::None);
    let out = b.out(rows, dt, rg);
    let bw: &[B] = if rg { &[B::Alloc { bytes, dtype, op: "div" }, B::Grad { input: 0, temp: 0 }] } else { &[] };
    b.op("mean", "MeanBackward1", &[x], &[out], &[], bw)[0]
}

/// `weight * x` for a `[w]` weight and an fp32 `[…, w]` input (type promotion: fp32 out).
/// MulBackward0: the input's gradient `grad * weight` (fp32), then the weight's `grad * x`
/// (fp32, full size); the engine's `validate_outputs` sums it to `[w]` (fp32) and, for a weight
/// of another dtype, casts the sum to it (`_to_copy`), freeing each step's predecessor.
pub fn weight_mul(b: &mut Builder, w: Tid, x: Tid) -> Tid {
    let (shape, dt) = (b.shape(x), b.t(x).dt);
    let (rw, rx) = (b.rg(w), b.rg(x));
    let out = b.out(shape, dt, rw || rx);
    let (full, fd) = (b.bytes(x), b.t(x).dtype);
    let (wd, wg) = (b.t(w).dtype, b.grad_bytes(w));
    // The weight's elements in the product's dtype (the sum before the cast).
    let wsum = wg / wd.bytes().max(1) as u128 * fd.bytes() as u128;
    let mut bw: Vec<B> = Vec::with_capacity(10);
    let mut saved: Vec<S> = Vec::with_capacity(2);
    if rx {
        saved.push(S::In(0));
    }
    if rw {
        saved.push(S::In(1));
    }
    let mut temps = 0u8;
    let tx = if rx {
        bw.push(B::Alloc { bytes: full, dtype: fd, op: "mul" });
        temps += 1;
        Some(temps - 1)
    } else {
        None
    };
    let tw = if rw {
        bw.push(B::Alloc { bytes: full, dtype: fd, op: "mul" });
        bw.push(B::Apply);
        bw.push(B::Alloc { bytes: wsum, dtype: fd, op: "sum" });
        bw.push(B::Free(temps));
        let mut t = temps + 1;
        if wd != fd {
            bw.push(B::Alloc { bytes: wg, dtype: wd, op: "_to_copy" });
            bw.push(B::Free(t));
            t += 1;
        }
        Some(t)
    } else {
        None
    };
    if let Some(t) = tw {
        bw.push(B::Grad { input: 0, temp: t });
    }
    if let Some(t) = tx {
        bw.push(B::Grad { input: 1, temp: t });
    }
    b.op("mul", "MulBackward0", &[w, x], &[out], &saved, &bw)[0]
}

/// `OlmoLayerNorm.forward`:
/// ```python
/// F.layer_norm(hidden_states.to(dtype=torch.float32), self.normalized_shape, None, None, eps=1e-5).to(orig_dtype)
/// ```
/// `native_layer_norm` keeps its fp32 input and fp32 mean and rstd `[b, s, 1]`.
pub fn layer_norm_fp32(b: &mut Builder, x: Tid) -> Tid {
    let in_dt = b.t(x).dt;
    let x32 = b.to_copy(x, Dt::F32);
    let n = b.layer_norm(x32, None, None);
    let y = b.to_copy(n, in_dt);
    b.hold(x);
    y
}

/// A norm module of a layer or of the model's end: its parameters and its forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    /// An RMSNorm with a weight (see [`Rms`]).
    Rms(Rms),
    /// `nn.LayerNorm` with weight and bias.
    LayerNorm,
    /// `OlmoLayerNorm` ([`layer_norm_fp32`]): no parameters.
    LayerNormFp32,
}

/// A norm module's parameters (weight, bias).
pub type NormW = (Option<Tid>, Option<Tid>);

/// The tensor-table names of a decoder layer's norms and of the final norm.
pub const LAYER_NORM: [&str; 2] = ["layers.*.norm.weight", "layers.*.norm.bias"];
pub const FINAL_NORM: [&str; 2] = ["norm.weight", "norm.bias"];

impl Norm {
    /// Registers the module's parameters (`names`: weight, bias).
    pub fn weights(self, b: &mut Builder, p: &Params, names: [&str; 2]) -> NormW {
        match self {
            Norm::Rms(_) => (p.w(b, names[0]), None),
            Norm::LayerNorm => (p.w(b, names[0]), p.w(b, names[1])),
            Norm::LayerNormFp32 => (None, None),
        }
    }

    /// The module at `module` on `x` (with its parameters `w`), counted with the norms.
    pub fn call(self, b: &mut Builder, module: &'static str, x: Tid, w: NormW) -> Tid {
        b.module = module;
        b.part = Part::Norms;
        self.run(b, x, w)
    }

    /// The module's forward on `x`.
    pub fn run(self, b: &mut Builder, x: Tid, w: NormW) -> Tid {
        match self {
            Norm::Rms(form) => rms_norm(b, x, w.0, form),
            Norm::LayerNorm => b.layer_norm(x, w.0, w.1),
            Norm::LayerNormFp32 => layer_norm_fp32(b, x),
        }
    }
}

/// The norm after the last layer (at `module`; its parameters `norm.weight`, `norm.bias`).
pub fn final_norm(b: &mut Builder, p: &Params, module: &'static str, norm: Norm, x: Tid) -> Tid {
    b.module = module;
    b.part = Part::Head;
    let w = norm.weights(b, p, FINAL_NORM);
    norm.run(b, x, w)
}

// ------------------------------------------------------------------ attention projections

/// The attention's parameters, in registration order (`q_proj`, `k_proj`, `v_proj`, `o_proj`).
#[derive(Clone, Copy)]
pub struct AttnW {
    pub wq: Option<Tid>,
    pub bq: Option<Tid>,
    pub wk: Option<Tid>,
    pub bk: Option<Tid>,
    pub wv: Option<Tid>,
    pub bv: Option<Tid>,
    pub wo: Option<Tid>,
    pub bo: Option<Tid>,
    /// Per-head q/k norm weights (Qwen3, Gemma-3: `q_norm`, `k_norm`, registered after `o_proj`).
    pub qn: Option<Tid>,
    pub kn: Option<Tid>,
}

impl AttnW {
    pub fn new(b: &mut Builder, p: &Params) -> AttnW {
        let wq = p.w(b, "layers.*.attn.q_proj.weight");
        let bq = p.w(b, "layers.*.attn.q_proj.bias");
        let wk = p.w(b, "layers.*.attn.k_proj.weight");
        let bk = p.w(b, "layers.*.attn.k_proj.bias");
        let wv = p.w(b, "layers.*.attn.v_proj.weight");
        let bv = p.w(b, "layers.*.attn.v_proj.bias");
        let wo = p.w(b, "layers.*.attn.o_proj.weight");
        let bo = p.w(b, "layers.*.attn.o_proj.bias");
        let qn = p.w(b, "layers.*.attn.q_norm.weight");
        let kn = p.w(b, "layers.*.attn.k_norm.weight");
        AttnW { wq, bq, wk, bk, wv, bv, wo, bo, qn, kn }
    }
}

/// A linear layer as a family's modules run it: (builder, input, weight, bias, output shape,
/// which linear) → output.
pub type LinearFn = fn(&mut Builder, Tid, Option<Tid>, Option<Tid>, Shape, Linear) -> Tid;

/// `linear(x)` into `shape` where the weight exists; else `x` itself.
pub fn proj_or(b: &mut Builder, x: Tid, w: Option<Tid>, bias: Option<Tid>, shape: Shape, lin: Linear) -> Tid {
    match w {
        Some(w) => b.proj(x, w, bias, shape, lin),
        None => x,
    }
}

/// `self.{q,k,v}_proj(hidden_states)` (the module at `module`): `[b, s, heads, d]` for `h` heads.
pub fn head_proj(b: &mut Builder, x: Tid, w: Option<Tid>, bias: Option<Tid>, h: Q, module: &'static str, lin: Linear) -> Tid {
    b.module = module;
    b.part = Part::AttentionInputs;
    proj_or(b, x, w, bias, heads_bshd(h), lin)
}

/// `.view(hidden_shape).transpose(1, 2)`: `[b, heads, s, d]`. `clone_bw`: the gradient comes
/// back laid out so that the view's `reshape` copies it.
pub fn to_heads(b: &mut Builder, y: Tid, h: Q, clone_bw: bool) -> Tid {
    let v = b.view(y, heads_bshd(h), "ViewBackward0", clone_bw);
    b.view(v, heads(h), "TransposeBackward0", false)
}

/// ```python
/// query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)   # k, v alike
/// ```
/// q, k, v `[b, heads, s, d]`; `clone_bw`: for each, whether its view's backward copies (see
/// [`to_heads`]).
pub fn qkv(b: &mut Builder, w: &AttnW, x: Tid, clone_bw: [bool; 3]) -> (Tid, Tid, Tid) {
    let one = |b: &mut Builder, w: Option<Tid>, bias: Option<Tid>, h: Q, module: &'static str, clone: bool, lin: Linear| {
        let y = head_proj(b, x, w, bias, h, module, lin);
        b.module = "self_attn";
        to_heads(b, y, h, clone)
    };
    let q = one(b, w.wq, w.bq, Q::A, "self_attn.q_proj", clone_bw[0], Linear::Q);
    let k = one(b, w.wk, w.bk, Q::KV, "self_attn.k_proj", clone_bw[1], Linear::K);
    let v = one(b, w.wv, w.bv, Q::KV, "self_attn.v_proj", clone_bw[2], Linear::V);
    (q, k, v)
}

/// A fused attention's parameters in registration order: the q, k, v projection's and the
/// output projection's, weight and bias each (`qkv_proj`, `o_proj` in the tensor table).
pub fn fused_attn_w(b: &mut Builder, p: &Params) -> [(Option<Tid>, Option<Tid>); 2] {
    let qkv = (p.w(b, "layers.*.attn.qkv_proj.weight"), p.w(b, "layers.*.attn.qkv_proj.bias"));
    [qkv, (p.w(b, "layers.*.attn.o_proj.weight"), p.w(b, "layers.*.attn.o_proj.bias"))]
}

/// The `[b, s, a + 2k, d]` of a fused q, k, v projection.
pub fn qkv_shape() -> Shape {
    Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Qkv, Dim::Q(Q::D)], Split::Tp)
}

/// A fused q, k, v projection by `linear` (GPT-2's `c_attn`, GPT-NeoX's and Falcon's
/// `query_key_value`, Phi-3's `qkv_proj`: `modules[0]`) into [`qkv_shape`]; what follows is the
/// attention's core, in its module (`modules[1]`).
pub fn fused_qkv(b: &mut Builder, x: Tid, (w, bias): (Option<Tid>, Option<Tid>), modules: [&'static str; 2], linear: LinearFn) -> Tid {
    b.part = Part::AttentionInputs;
    b.module = modules[0];
    let qkv = linear(b, x, w, bias, qkv_shape(), Linear::Qkv);
    b.module = modules[1];
    b.part = Part::AttentionCore;
    qkv
}

/// The attention's output projection on `attn_output.reshape(b, s, -1)` (the module at
/// `module`: `o_proj`, `dense`, `out_proj`, `c_proj`).
pub fn out_proj(b: &mut Builder, o: Tid, w: Option<Tid>, bias: Option<Tid>, module: &'static str) -> Tid {
    b.part = Part::AttentionInputs;
    b.module = module;
    proj_or(b, o, w, bias, tok(Q::H), Linear::O)
}

// ------------------------------------------------------------------ MLPs

/// An activation as an MLP runs it: (aten op, autograd node, its backward op).
pub type Act = (&'static str, &'static str, &'static str);
/// `F.silu`.
pub const SILU: Act = ("silu", "SiluBackward0", "silu_backward");
/// `gelu_pytorch_tanh` (Gemma's `hidden_activation`).
pub const GELU_TANH: Act = ("gelu", "GeluBackward0", "gelu_backward");

/// A gated MLP's parameters (`gate_proj`, `up_proj`, `down_proj`).
#[derive(Clone, Copy)]
pub struct MlpW {
    pub wg: Option<Tid>,
    pub wu: Option<Tid>,
    pub wd: Option<Tid>,
}

impl MlpW {
    /// The layer's MLP (`mlp.{gate,up,down}_proj`).
    pub fn new(b: &mut Builder, p: &Params) -> MlpW {
        let wg = p.w(b, "layers.*.mlp.gate_proj.weight");
        let wu = p.w(b, "layers.*.mlp.up_proj.weight");
        let wd = p.w(b, "layers.*.mlp.down_proj.weight");
        MlpW { wg, wu, wd }
    }

    /// An MoE block's shared expert(s) (`mlp.shared_expert.{gate,up,down}_proj`).
    pub fn shared(b: &mut Builder, p: &Params) -> MlpW {
        let wg = p.w(b, "layers.*.mlp.shared_expert.gate_proj.weight");
        let wu = p.w(b, "layers.*.mlp.shared_expert.up_proj.weight");
        let wd = p.w(b, "layers.*.mlp.shared_expert.down_proj.weight");
        MlpW { wg, wu, wd }
    }
}

/// Where a gated MLP sits and what it runs: the modules of `gate_proj`, the activation,
/// `up_proj`, the product and `down_proj`; its width; its activation.
#[derive(Clone, Copy)]
pub struct Gated {
    pub modules: [&'static str; 5],
    pub width: Dim,
    pub act: Act,
}

/// `LlamaMLP` (`mlp`, f, SiLU).
pub const LLAMA_MLP: Gated =
    Gated { modules: ["mlp.gate_proj", "mlp.act_fn", "mlp.up_proj", "mlp", "mlp.down_proj"], width: Dim::Q(Q::F), act: SILU };

/// `down_proj(act(gate_proj(x)) * up_proj(x))` (`LlamaMLP`, `Gemma2MLP`, the MoE blocks'
/// shared experts, …): the activation keeps its input, the product keeps both factors.
pub fn gated_mlp(b: &mut Builder, w: &MlpW, x: Tid, how: &Gated) -> Tid {
    let MlpW { wg, wu, wd } = *w;
    let [gate, act, up, mul, down] = how.modules;
    let f = || tok_tp(how.width);
    b.module = gate;
    let g = proj_or(b, x, wg, None, f(), Linear::Gate);
    b.module = act;
    let (op, node, back) = how.act;
    let a = b.unary(op, node, g, Keep::Input, back);
    b.module = up;
    let u = proj_or(b, x, wu, None, f(), Linear::Up);
    b.module = mul;
    let m = b.mul(a, u);
    b.module = down;
    proj_or(b, m, wd, None, tok(Q::H), Linear::Down)
}

/// `ACT2FN[config.activation_function]` of a plain MLP: ReLU keeps its result (ReluBackward0,
/// `threshold_backward`), GPT-2's `gelu_new` is written as tensor ops ([`gelu_new`]), the
/// others `F.gelu`, keeping its input.
pub fn activation(b: &mut Builder, act: Activation, x: Tid) -> Tid {
    match act {
        Activation::GeluNew => gelu_new(b, x),
        Activation::Relu => b.unary("relu", "ReluBackward0", x, Keep::Output, "threshold_backward"),
        _ => b.unary("gelu", "GeluBackward0", x, Keep::Input, "gelu_backward"),
    }
}

/// `NewGELUActivation.forward`, tensor op by tensor op:
/// `0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))`.
/// Keeps x (pow), `0.5·x`, `tanh(·)` and `1 + tanh(·)`.
pub fn gelu_new(b: &mut Builder, x: Tid) -> Tid {
    let half = b.mul_scalar(x);
    let cube = b.pow(x);
    let c3 = b.mul_scalar(cube);
    let inner = b.add(x, c3);
    let scaled = b.mul_scalar(inner);
    let th = b.unary("tanh", "TanhBackward0", scaled, Keep::Output, "tanh_backward");
    let one = b.add_scalar(th);
    let y = b.mul(half, one);
    b.hold(x);
    y
}

/// The parameters of a plain MLP (`fc1` weight and bias, `fc2` weight and bias), registered in
/// that order under the tensor table's `up_proj` and `down_proj`.
pub fn plain_mlp_w(b: &mut Builder, p: &Params) -> [Option<Tid>; 4] {
    [
        p.w(b, "layers.*.mlp.up_proj.weight"),
        p.w(b, "layers.*.mlp.up_proj.bias"),
        p.w(b, "layers.*.mlp.down_proj.weight"),
        p.w(b, "layers.*.mlp.down_proj.bias"),
    ]
}

/// A plain MLP, `fc2(act(fc1(x)))` (`modules`: those of `fc1`, the activation, `fc2`; GPT-2's
/// `c_fc`/`c_proj`, GPT-NeoX's `dense_h_to_4h`/`dense_4h_to_h`, …), biased where `w` has biases.
pub fn plain_mlp(b: &mut Builder, w: [Option<Tid>; 4], x: Tid, act: Activation, modules: [&'static str; 3]) -> Tid {
    plain_mlp_with(b, w, x, act, modules, proj_or)
}

/// [`plain_mlp`] whose projections are `linear` (Falcon's `FalconLinear` adds its bias apart).
pub fn plain_mlp_with(b: &mut Builder, w: [Option<Tid>; 4], x: Tid, act: Activation, modules: [&'static str; 3], linear: LinearFn) -> Tid {
    let [w1, b1, w2, b2] = w;
    b.part = Part::Mlp;
    b.module = modules[0];
    let h = linear(b, x, w1, b1, tok_tp(Dim::Q(Q::F)), Linear::Up);
    b.module = modules[1];
    let a = activation(b, act, h);
    b.module = modules[2];
    linear(b, a, w2, b2, tok(Q::H), Linear::Down)
}

/// The LM head's logits (`lm_head(x)`: a linear with the head's weight, or an `mm` with the tied
/// embedding's), then the loss begins: its first op is the next one (`loss_from`), in the root
/// module's loss part. What every loss step — transformers', torchtitan's, litgpt's — starts with.
pub fn head_logits(b: &mut Builder, xn: Tid, w: Option<Tid>, bias: Option<Tid>, vocab: Shape) -> Tid {
    let logits = match w {
        Some(w) => b.linear(xn, w, bias, vocab),
        None => b.plain("mm", &[xn], vocab, Dt::Model),
    };
    head_done(b);
    logits
}

/// After the LM head's op: the loss's ops start here.
pub fn head_done(b: &mut Builder) {
    b.p.loss_from = b.next_op();
    b.module = "(root)";
    b.part = Part::Loss;
}

/// `_scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask)`, the kernel SDPA runs
/// on a CPU with a mask (torch 2.15 `aten/src/ATen/native/cpu/FlashAttentionKernel.cpp`): its
/// node keeps q, k, v, the mask, the output `[b, a, s, d]` in q's dtype and the fp32 log-sum-exp
/// `[b, a, s]`; its backward allocates a gradient for each of q, k, v that needs one, in its
/// dtype and size. Returns the op's outputs (`[0]` the attention output).
pub fn cpu_flash_sdpa(b: &mut Builder, q: Tid, k: Tid, v: Tid, mask: Tid) -> [Tid; 4] {
    let qdt = b.t(q).dt;
    let rg = b.rg(q) || b.rg(k) || b.rg(v);
    let o = b.out(b.shape(q), qdt, rg);
    let lse = b.out(Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::A), Dim::Q(Q::S)], Split::Tp), Dt::F32, false);
    const BW: &str = "_scaled_dot_product_flash_attention_for_cpu_backward";
    let mut bw: Vec<B> = Vec::with_capacity(6);
    let mut grads: Vec<(u8, u8)> = Vec::with_capacity(3);
    for (i, t) in [q, k, v].into_iter().enumerate() {
        if b.rg(t) {
            grads.push((i as u8, bw.len() as u8));
            bw.push(B::Alloc { bytes: b.bytes(t), dtype: b.t(t).dtype, op: BW });
        }
    }
    bw.extend(grads.into_iter().map(|(input, temp)| B::Grad { input, temp }));
    b.op(
        "_scaled_dot_product_flash_attention_for_cpu",
        "ScaledDotProductFlashAttentionForCpuBackward0",
        &[q, k, v, mask],
        &[o, lse],
        &[S::In(0), S::In(1), S::In(2), S::In(3), S::Out(0), S::Out(1)],
        &bw,
    )
}
