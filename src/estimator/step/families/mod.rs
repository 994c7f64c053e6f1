//! Decoder layers of the model families, built from the blocks of `blocks.rs` the way each
//! family's `modeling_*.py` calls them. A family is a function `layer(b, x, shared, kind) -> y`
//! (and, where it differs, its own embedding, final norm and head); [`layer`] picks it from the
//! architecture.
//!
//! Adding a family: write `families/<name>.rs` with its layer (and ends, if they differ) from
//! the shared pieces here, route it in [`layer`], and add its step logs to the fixture test.

pub mod deepseek;
pub mod falcon;
pub mod gemma;
pub mod glm4_moe;
pub mod gpt2;
pub mod gpt_oss;
pub mod llama;
pub mod llama4;
pub mod mistral;
pub mod moe;
pub mod neox;
pub mod olmo;
pub mod opt;
pub mod phi;
pub mod phi3;
pub mod qwen_moe;
pub mod sigmoid_moe;
pub mod smollm3;
pub mod stablelm;
pub mod starcoder2;

use super::ir::{Builder, DType, Dt, Origin, Shape, Split, Tid, X};
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::{Attention, Finetune};
use crate::estimator::model::{ModelSpec, NormKind, Positions};
use crate::estimator::params::{LocalGroup, Role};

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
    /// no cos/sin.
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
                3 | 4 => (i == 4) == (var.sliding && self.mask_local.is_some()),
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

/// Whether decoder layer `i` attends through a sliding window (Gemma-2: even layers).
pub fn sliding(spec: &ModelSpec, i: usize) -> bool {
    if gemma::is3(spec) {
        // Gemma-3: `layer_types` (the window rule the importer reads from it).
        spec.window_layers.contains(i as u64)
    } else {
        (gemma::two_masks(spec) && i.is_multiple_of(2)) || gpt_oss::sliding(spec, i) || llama4::chunked(spec, i)
    }
}

/// The model-level rotary tables the layers read: their shape and dtype, and whether there is
/// a sin beside the cos (Llama 4's complex `freqs_cis` is one fp32-sized `[s, d]` table).
pub fn rope_tables(spec: &ModelSpec) -> Option<(Shape, Dt, bool)> {
    if !has_rope(spec) {
        None
    } else if llama4::is(spec) {
        use super::ir::Dim;
        Some((Shape::new(&[Dim::Q(Q::S), Dim::Q(Q::D)], Split::None), Dt::F32, false))
    } else {
        Some((cos_shape(spec), cos_dt(spec), true))
    }
}

/// Whether eager attention materializes two masks (a sliding-window one beside the causal one).
pub fn two_masks(spec: &ModelSpec) -> bool {
    gemma::two_masks(spec) || gpt_oss::is(spec)
}

/// What sets one decoder layer's attention apart from another's of the same [`Kind`]: a
/// sliding-window mask, no rotary embedding (NoPE: SmolLM3's and Llama 4's `no_rope_layers`
/// entries that are 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Var {
    pub sliding: bool,
    pub nope: bool,
}

/// The variant of decoder layer `i` (its index in the model).
pub fn var(spec: &ModelSpec, i: usize) -> Var {
    Var { sliding: sliding(spec, i), nope: smollm3::nope(spec, i) }
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

/// Builds one decoder layer of `spec`'s family on input `x`; returns its output.
pub fn layer(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid, sh: &Shared, kind: Kind, attn: Attention) -> Tid {
    // In wasm each family's `layer` is `#[inline(never)]`: WebAssembly compiles a function the first
    // time it runs, so a page estimating a Llama compiles the Llama builder, not all twenty.
    if gpt2::is(spec) {
        gpt2::layer(b, p, spec, x, sh, attn)
    } else if gpt_oss::is(spec) {
        gpt_oss::layer(b, p, spec, x, sh, kind, attn)
    } else if llama4::is(spec) {
        llama4::layer(b, p, spec, x, sh, kind, attn)
    } else if opt::is(spec) {
        opt::layer(b, p, spec, x, sh, attn)
    } else if phi3::is(spec) {
        phi3::layer(b, p, spec, x, sh, kind, attn)
    } else if gemma::two_masks(spec) {
        gemma::layer(b, p, spec, x, sh, kind, attn)
    } else if deepseek::is(spec) {
        deepseek::layer(b, p, spec, x, sh, kind, attn)
    } else if glm4_moe::is(spec) {
        glm4_moe::layer(b, p, spec, x, sh, kind, attn)
    } else if olmo::is(spec) {
        olmo::layer(b, p, spec, x, sh, attn)
    } else if olmo::is2(spec) {
        olmo::layer2(b, p, spec, x, sh, attn)
    } else if gemma::is(spec) && spec.experts == 0 {
        gemma::layer_gemma1(b, p, spec, x, sh, attn)
    } else if qwen_moe::is(spec) {
        qwen_moe::layer(b, p, spec, x, sh, kind, attn)
    } else if starcoder2::is(spec) {
        starcoder2::layer(b, p, spec, x, sh, attn)
    } else if phi::is(spec) {
        phi::layer(b, p, spec, x, sh, attn)
    } else if neox::is(spec) {
        neox::layer(b, p, spec, x, sh, attn)
    } else if stablelm::is(spec) {
        stablelm::layer(b, p, spec, x, sh, attn)
    } else if falcon::is(spec) {
        falcon::layer(b, p, spec, x, sh, attn)
    } else {
        llama::layer(b, p, spec, x, sh, kind, attn)
    }
}

/// The model's embedding block (token embedding, positions): returns the residual stream's
/// first tensor and the model-level tensors the layers read.
pub fn embed(b: &mut Builder, p: &Params, spec: &ModelSpec, ids: Tid, attn: Attention, ft: Finetune) -> (Tid, Shared) {
    let _ = ft;
    if gpt2::is(spec) {
        gpt2::embed(b, p, spec, ids, attn)
    } else if gpt_oss::is(spec) {
        gpt_oss::embed(b, p, spec, Some(ids), attn)
    } else if llama4::is(spec) {
        llama4::embed(b, p, spec, Some(ids), attn)
    } else if deepseek::is_v2(spec) {
        deepseek::embed_v2(b, p, spec, ids, attn)
    } else if gemma::is3(spec) {
        gemma::embed3(b, p, spec, ids, attn)
    } else if gemma::is(spec) {
        gemma::embed(b, p, spec, ids, attn)
    } else if mistral::is(spec) {
        mistral::embed(b, p, spec, ids, attn)
    } else if olmo::is_any(spec) {
        olmo::embed(b, p, spec, ids, attn)
    } else if qwen_moe::two_masks(spec) {
        qwen_moe::embed(b, p, spec, ids, attn)
    } else if opt::is(spec) {
        opt::embed(b, p, spec, ids, attn)
    } else if falcon::is(spec) {
        falcon::embed(b, p, spec, ids, attn)
    } else if starcoder2::is(spec) {
        starcoder2::embed(b, p, spec, ids, attn)
    } else if phi::is(spec) {
        phi::embed_with_dropout(b, p, spec, ids, attn, true)
    } else if neox::is(spec) {
        phi::embed_with_dropout(b, p, spec, ids, attn, false)
    } else {
        llama::embed(b, p, spec, ids, attn)
    }
}

/// A later pipeline stage's prologue: the received activation, then positions, masks and the
/// rotary tables as the model's forward makes them; `None` where Llama's does.
pub fn later_stage(b: &mut Builder, p: &Params, spec: &ModelSpec, attn: Attention) -> Option<(Tid, Shared)> {
    if gpt_oss::is(spec) {
        Some(gpt_oss::embed(b, p, spec, None, attn))
    } else if llama4::is(spec) {
        Some(llama4::embed(b, p, spec, None, attn))
    } else {
        None
    }
}

/// Whether the first layer's input is one of the model forward's locals (held until the model
/// returns): Llama's `hidden_states = inputs_embeds`; GPT-2's sum of embeddings is not.
pub fn x0_is_local(spec: &ModelSpec) -> bool {
    !gpt2::is(spec) && !opt::is(spec)
}

/// The final norm of the model (`model.norm`, `transformer.ln_f`), if it has one.
pub fn final_norm(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid) -> Tid {
    if gpt2::is(spec) {
        gpt2::final_norm(b, p, spec, x)
    } else if gpt_oss::is(spec) {
        gpt_oss::final_norm(b, p, x)
    } else if llama4::is(spec) {
        llama4::final_norm(b, p, x)
    } else if olmo::is_any(spec) {
        olmo::final_norm(b, p, spec, x)
    } else if opt::is(spec) {
        opt::final_norm(b, p, x)
    } else if starcoder2::is(spec) {
        starcoder2::final_layer_norm(b, p, "model.norm", x)
    } else if phi::is(spec) {
        starcoder2::final_layer_norm(b, p, "model.final_layernorm", x)
    } else if neox::is(spec) {
        starcoder2::final_layer_norm(b, p, "gpt_neox.final_layer_norm", x)
    } else if stablelm::is(spec) {
        starcoder2::final_layer_norm(b, p, "model.norm", x)
    } else if falcon::is(spec) {
        starcoder2::final_layer_norm(b, p, "transformer.ln_f", x)
    } else if gemma::is(spec) {
        gemma::final_norm(b, p, x)
    } else {
        llama::final_norm(b, p, x)
    }
}

/// Whether SDPA receives a materialized bool mask `[1, 1, s, s_kv]` from the model's forward
/// (a model-level tensor the layers read): StarCoder2 once its sliding window bites, Falcon
/// always (`allow_is_causal_skip=False`).
pub fn sdpa_bool_mask(b: &Builder, spec: &ModelSpec) -> bool {
    (starcoder2::is(spec) && starcoder2::window_mask(b, spec)) || falcon::is(spec)
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

/// The shape of the model-level cos/sin `[1, s, d_rot]`.
pub fn cos_shape(spec: &ModelSpec) -> Shape {
    use super::ir::Dim;
    // gpt-oss's rotary embedding does not repeat its frequencies: cos/sin are `[s, d/2]`.
    let d = if gpt_oss::is(spec) {
        Dim::Half(Q::D)
    } else if rotary_dims(spec) == spec.head_dim {
        Dim::Q(Q::D)
    } else {
        Dim::X(X::DRot)
    };
    Shape::new(&[Dim::Q(Q::S), d], Split::None)
}

/// Norm kinds that keep statistics in the input dtype on CPU.
pub fn layer_norm_like(n: NormKind) -> bool {
    matches!(n, NormKind::Layernorm | NormKind::LayernormNoBias)
}

/// The shapes and dtypes of the masks the layers receive (`Shared::mask`, `Shared::mask_local`):
/// eager's additive masks, and the bool masks SDPA gets ([`sdpa_bool_mask`], and where a sliding
/// window is shorter than the keys, `mistral.rs`). Llama 4's chunked mask `[b, s, s_kv]` is
/// additive in the residual dtype under eager and stays boolean under SDPA, which needs none
/// below one chunk ([`llama4::chunk_mask`]).
pub fn mask_shapes(b: &Builder, spec: &ModelSpec, attn: Attention) -> [Option<(Shape, Dt)>; 2] {
    use super::ir::Dim;
    let eager = attn == Attention::Eager;
    let s_kv = b.c.n(Q::S_KV);
    let sdpa_mask = sdpa_bool_mask(b, spec) || (mistral::is(spec) && mistral::masked(spec.window, s_kv));
    let mask = if eager || sdpa_mask { Some(mistral::mask_shape(attn)) } else { None };
    let local = if llama4::is(spec) {
        let dt = if eager { Dt::Resid } else { Dt::Bool };
        llama4::chunk_mask(spec, attn, s_kv).then(|| (Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(Q::S_KV)], Split::None), dt))
    } else {
        ((eager && two_masks(spec)) || (gemma::is3(spec) && mistral::masked(spec.window, s_kv))).then(|| mistral::mask_shape(attn))
    };
    [mask, local]
}

/// The dtype of the model-level RoPE cos/sin: the residual stream's (`.to(x.dtype)`), fp32 in
/// OLMo (`OlmoRotaryEmbedding.forward` does not cast).
pub fn cos_dt(spec: &ModelSpec) -> Dt {
    if olmo::is_any(spec) {
        Dt::F32
    } else {
        Dt::Resid
    }
}

/// Whether the sliding-window layers have their own RoPE pair (`Shared::cos_local`): Gemma-3
/// with both sliding and full layers (`Gemma3TextModel.forward` computes one pair per layer
/// type in `set(config.layer_types)`).
pub fn local_rope(spec: &ModelSpec) -> bool {
    let n = spec.window_layers.count(spec.layers);
    gemma::is3(spec) && n > 0 && n < spec.layers
}

/// A later pipeline stage's prologue (it receives its input): the positions, masks and RoPE the
/// family's model forward computes after the embedding, as its `embed` makes them; `None` for
/// the families that use Llama's (`positions_and_mask` and `llama::rotary`).
pub fn positions(b: &mut Builder, spec: &ModelSpec, attn: Attention) -> Option<Shared> {
    if gemma::is3(spec) {
        Some(gemma::positions3(b, spec, attn))
    } else if mistral::is(spec) {
        Some(mistral::positions(b, spec, attn))
    } else if qwen_moe::two_masks(spec) {
        Some(qwen_moe::positions(b, spec, attn))
    } else if olmo::is_any(spec) {
        Some(olmo::positions(b, spec, attn))
    } else {
        None
    }
}
