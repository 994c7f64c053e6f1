//! Decoder layers of the model families, built from the blocks of `blocks.rs` the way each
//! family's `modeling_*.py` calls them. A family is a function `layer(b, x, shared, kind) -> y`
//! (and, where it differs, its own embedding, final norm and head); [`layer`] picks it from the
//! architecture.
//!
//! Adding a family: write `families/<name>.rs` with its layer (and ends, if they differ) from
//! the shared pieces here, route it in [`layer`], and add its step logs to the fixture test.

pub mod gpt2;
pub mod llama;
pub mod moe;
pub mod phi3;

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
#[derive(Clone, Copy, Debug)]
pub struct Shared {
    /// RoPE cos and sin `[1, s, d_rot]` (or none).
    pub cos: Option<Tid>,
    pub sin: Option<Tid>,
    /// `cache_position` / `position_ids` `[s]` int64.
    pub pos: Option<Tid>,
    /// Eager attention's additive mask `[b, 1, s, s_kv]`.
    pub mask: Option<Tid>,
    /// The token embedding's weight (the LM head's, when tied).
    pub emb_w: Option<Tid>,
    /// Locals of the model's forward held until it returns, not passed to the layers
    /// (Llama's `inputs_embeds`, which is also the first layer's input; GPT-2's token and
    /// position embeddings).
    pub locals: [Option<Tid>; 2],
}

impl Shared {
    pub fn all(&self) -> impl Iterator<Item = Tid> {
        [self.cos, self.sin, self.pos, self.mask].into_iter().flatten()
    }
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
    if gpt2::is(spec) {
        gpt2::layer(b, p, spec, x, sh, attn)
    } else if phi3::is(spec) {
        phi3::layer(b, p, spec, x, sh, kind, attn)
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
    } else {
        llama::embed(b, p, spec, ids, attn)
    }
}

/// Whether the first layer's input is one of the model forward's locals (held until the model
/// returns): Llama's `hidden_states = inputs_embeds`; GPT-2's sum of embeddings is not.
pub fn x0_is_local(spec: &ModelSpec) -> bool {
    !gpt2::is(spec)
}

/// The final norm of the model (`model.norm`, `transformer.ln_f`), if it has one.
pub fn final_norm(b: &mut Builder, p: &Params, spec: &ModelSpec, x: Tid) -> Tid {
    if gpt2::is(spec) {
        gpt2::final_norm(b, p, spec, x)
    } else {
        llama::final_norm(b, p, spec, x)
    }
}

/// A token tensor `[b, s, h]` given to a program by its caller.
pub fn input(b: &mut Builder, free_fwd: bool, free_bwd: bool) -> Tid {
    b.external(Shape::tok(Q::H), Dt::Resid, Origin::Input { free_fwd, free_bwd }, true)
}

/// Rotary dims per head.
pub fn rotary_dims(spec: &ModelSpec) -> u64 {
    (spec.head_dim * spec.rotary_pct).div_ceil(100).max(1)
}

/// Whether the model computes RoPE cos/sin.
pub fn has_rope(spec: &ModelSpec) -> bool {
    spec.positions == Positions::Rope
}

/// The shape of the model-level cos/sin `[1, s, d_rot]`.
pub fn cos_shape(spec: &ModelSpec) -> Shape {
    use super::ir::Dim;
    let d = if rotary_dims(spec) == spec.head_dim { Dim::Q(Q::D) } else { Dim::X(X::DRot) };
    Shape::new(&[Dim::Q(Q::S), d], Split::None)
}

/// Norm kinds that keep statistics in the input dtype on CPU.
pub fn layer_norm_like(n: NormKind) -> bool {
    matches!(n, NormKind::Layernorm | NormKind::LayernormNoBias)
}
