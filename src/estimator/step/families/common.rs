//! What every family's code shares: the kinds and variants of decoder layers, the model-level
//! tensors the layers read ([`Shared`]), one GPU's parameters ([`Params`]), and the small
//! helpers about positions.

use super::super::ir::{Builder, DType, Dt, Origin, Shape, Split, Tid, X};
use crate::estimator::activations::ctx::Q;
use crate::estimator::config::Attention;
use crate::estimator::model::{ModelSpec, NormKind, Positions};
use crate::estimator::params::{LocalGroup, Role};
use crate::estimator::step::part::Part;

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

/// What sets one decoder layer's attention apart from another's of the same [`Kind`]: a
/// sliding-window mask, no rotary embedding (NoPE: SmolLM3's and Llama 4's `no_rope_layers`
/// entries that are 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Var {
    pub sliding: bool,
    pub nope: bool,
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
    use super::super::ir::Dim;
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
    use super::super::ir::Dim;
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

/// A final `nn.LayerNorm` with weight and bias (`model.norm` in StarCoder2 and StableLM,
/// `final_layernorm` in Phi, `final_layer_norm` in GPT-NeoX, `ln_f` in Falcon), named by its
/// module path.
pub fn final_layer_norm(b: &mut Builder, p: &Params, module: &'static str, x: Tid) -> Tid {
    b.module = module;
    b.part = Part::Head;
    let w = p.w(b, "norm.weight");
    let bias = p.w(b, "norm.bias");
    b.layer_norm(x, w, bias)
}
