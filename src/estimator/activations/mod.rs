//! Activation memory: the tensors autograd saves for backward, tensor by tensor, for the code the
//! user actually runs.
//!
//! By default this follows Hugging Face transformers' module code (5.x): what
//! `torch.autograd.graph.saved_tensors_hooks` sees at the end of the forward pass, the loss
//! included, each storage counted once. The tensors come from the op-level program of the step
//! (`step`: one builder per decoder-layer family, the same program that gives the step's event
//! stream and its peak), folded into formulas by ledger part; measured to the byte in the
//! validation harness (`validation/FINDINGS.md`). The `framework = megatron` profile follows
//! Korthikanti et al. 2022, §4.1 instead.
//!
//! Symbols ([`crate::estimator::ctx::Q`]): b micro-batch, s tokens per sequence on this GPU (s / cp), h hidden, a
//! heads, k key/value heads, d head dim, f MLP intermediate, V vocabulary, L layers on this GPU,
//! p bytes per compute element (2 in bf16), p_r bytes of the residual stream (4 under autocast),
//! E experts, K experts per token, r LoRA rank, t tensor-parallel degree.
//!
//! Layout: [`activations`] reads the kept tensors of the step's programs (`step::ledger`);
//! [`megatron`] is the other profile; [`textbook`] the closed formulas of the literature for
//! comparison; the symbols are [`crate::estimator::ctx`]'s (shared with `step`).

pub mod megatron;
pub mod saved;
pub mod terms;
pub mod textbook;

pub use crate::estimator::part::Part;
pub use saved::*;
pub use terms::{PartTerms, Terms};
pub use textbook::{eager_score_bytes, textbook_differences, textbook_rows};
