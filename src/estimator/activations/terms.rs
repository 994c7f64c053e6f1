//! The formulas of the saved tensors, accumulated by ledger part: for one decoder layer of each
//! kind and for the model's ends (what the HF and Megatron profiles both fill).

use crate::estimator::expr::{Expr, Sym};
use crate::estimator::part::Part;

/// Accumulates terms by part, for one decoder layer and for the model's ends.
#[derive(Default)]
pub struct Terms {
    pub layer: Vec<(Part, Expr)>,
    pub moe_layer: Vec<(Part, Expr)>,
    pub dense_layer: Vec<(Part, Expr)>,
    /// Terms only layers with rotary embedding keep, and only NoPE layers (Llama 4), with
    /// their layer counts on this stage.
    pub rope_layer: Vec<(Part, Expr)>,
    pub nope_layer: Vec<(Part, Expr)>,
    pub n_rope: u64,
    pub n_nope: u64,
    pub first: Vec<(Part, Expr)>,
    pub last: Vec<(Part, Expr)>,
    /// What only the layers of one attention type keep (Gemma-3's sliding layers: SDPA's mask
    /// and the repeated k and v; its full layers: k and v at `k` heads), with the symbol and
    /// the number of those layers on the stage.
    pub by_attention: Vec<(Sym, u64, PartTerms)>,
}

/// Formulas by part.
pub type PartTerms = Vec<(Part, Expr)>;
