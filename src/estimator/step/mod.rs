//! One training step, tensor by tensor: the op-level program of the model (`ir`, built by the
//! `families` from the `blocks` that mirror transformers' modeling code), run forward and
//! backward allocation by allocation (`run`), followed by the gradient reduction, the optimizer
//! step and `zero_grad` (`model`). The same program gives
//!
//! - the activation ledger (what is saved at the end of the forward pass, by part, as formulas),
//! - the event stream of the step ([`simulate`]), which the caching-allocator simulator replays
//!   into `memory.reserved_peak`,
//! - `memory.peak`, computed without materializing the stream ([`fast`]): identical layers are
//!   simulated once and their effect applied layer by layer, which equals the stream's maximum
//!   (tested on every preset).

pub mod blocks;
pub mod compile;
pub mod families;
pub mod fast;
pub mod ir;
pub mod ledger;
pub mod lowbit;
pub mod model;
pub mod run;
pub mod sac;
pub mod stream;
pub mod te_offload;

pub use model::simulate_stage;
pub use run::label;
pub use stream::{Cat, Event, EventKind, Phase, Stream};
