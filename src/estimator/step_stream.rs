//! The step of one pipeline stage as an event stream ([`stream_of`]), with what the caching
//! allocator's replay needs beside it ([`step_parts`]), and what is resident beside it
//! ([`resident_of`]).

use super::config::{self, Config};
use super::ledger::{bytes_of, Bytes, Category, Row, RowId};
use super::params::{local_groups, Stage};
use super::precision::recipe;
use super::validate::{validate, EstimateError};
use super::{expr, optimizer, sharding, statics, step};

/// What lives beside the step's stream on `stage`, from the ledger's rows: weights, optimizer
/// states (and, when the "device" is the CPU as in the validation harness, the step counters
/// kept on the host), buffers, the batch, gradient buffers, resident gradients (accumulation)
/// and other micro-batches' activations (`other_acts`).
pub fn resident_of(cfg: &Config, rows: &[Row], host: &[Row], stage: Stage, other_acts: Bytes) -> step::model::Resident {
    // What lives outside the caching allocator (bitsandbytes' paged states) is not resident in it.
    let sum = |cat: Category| -> Bytes { rows.iter().filter(|r| r.category == cat && !r.id.outside_allocator()).map(|r| r.bytes).sum() };
    let mut optimizer = sum(Category::OptimizerStates);
    if cfg.kernels == config::Kernels::Cpu {
        optimizer += bytes_of(host, RowId::OptimizerStepCounters);
    }
    let buckets: Bytes = rows.iter().filter(|r| matches!(r.id, RowId::DdpBuckets | RowId::ZeroReduceBucket)).map(|r| r.bytes).sum();
    // Under torchtune's recipes the shards come with each unit's reduce-scatter, in the stream.
    let grads = if step::model::resident_grads(cfg) && !sharding::grads_made_in_step(cfg) { bytes_of(rows, RowId::Gradients) } else { 0 };
    step::model::Resident {
        weights: sum(Category::Parameters),
        optimizer,
        buffers: step::model::buffer_bytes(cfg),
        batch: step::model::batch_bytes(cfg, stage),
        gradients: buckets + grads,
        activations: other_acts,
    }
}

/// Which GPU's step is simulated op by op: the stage the ledger describes (the most loaded one,
/// [`super::Layout::stage`]; the whole model without pipeline parallelism), with the
/// activations the other micro-batches in flight keep there under 1F1B
/// ([`super::Layout::in_flight_activations`]), resident beside the stream.
///
/// The caching allocator's replay ([`super::reserve`]) runs on this stream: replaying another
/// stage, or this one without its micro-batches in flight, would reserve less than the ledger's
/// allocated peak, and the reserve row would read 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamAt {
    pub stage: Stage,
    /// Bytes of the other micro-batches' saved activations on `stage`.
    pub in_flight: Bytes,
    /// The step's first backward rather than a later one ([`super::Layout::first_backward`]).
    pub first_backward: bool,
}

impl StreamAt {
    /// The whole model, nothing in flight: the only stage without pipeline parallelism.
    pub const WHOLE: StreamAt = StreamAt { stage: Stage::Whole, in_flight: 0, first_backward: false };
}

/// The step of one stage ([`StreamAt`]) and what the caching-allocator replay
/// ([`super::reserve`]) needs beside it, from one build of the stage's program.
pub struct StepParts {
    pub stream: step::Stream,
    /// The bytes of every parameter tensor, as the module holds it.
    pub params: Vec<u128>,
    /// The elements of each trainable parameter tensor (what the optimizer keeps states for).
    pub trainable: Vec<u128>,
    /// What is resident beside the stream: weights, optimizer states, buffers, batch, resident
    /// gradients, other micro-batches' activations.
    pub resident: step::model::Resident,
    /// The stage's parameter tensors (what the loading allocates).
    pub groups: Vec<super::params::LocalGroup>,
}

/// [`StepParts`] of `cfg` on the stage `at`.
pub fn step_parts(cfg: &Config, at: StreamAt) -> Result<StepParts, EstimateError> {
    validate(cfg)?;
    let recipe = recipe(cfg.precision);
    let stage = at.stage;
    let groups = local_groups(cfg, stage);
    let (rows, host) = statics::static_rows(cfg, &recipe, &groups, at.first_backward);
    let resident = resident_of(cfg, &rows, &host, stage, at.in_flight);
    let sh = sharding::Sharding::of(cfg);
    let adapters = super::precision::trainable_recipe(cfg, &recipe);
    let temp =
        optimizer::step_temporary_bytes(cfg.optim, optimizer::step_impl(cfg), &adapters, &groups, &sh.shards(1)).map_or(0, |r| r.bytes);
    Ok(expr::numbers_only(|| {
        let setup = step::model::Setup::new(cfg, &recipe, stage).first_backward(at.first_backward);
        let prog = setup.whole();
        let stream = step::model::simulate_program(cfg, &recipe, &setup, &prog, resident, temp);
        let params = prog.tensors.iter().filter(|t| matches!(t.origin, step::ir::Origin::Param { .. })).map(|t| t.bytes).collect();
        let trainable = step::model::optimizer_params(&prog, setup.optimizer_weight());
        StepParts { stream, params, trainable, resident, groups }
    }))
}

/// The step of the stage `at` as an event stream (see [`step`]); [`super::step_stream`] picks
/// the most loaded stage.
pub fn stream_of(cfg: &Config, at: StreamAt) -> Result<step::Stream, EstimateError> {
    step_parts(cfg, at).map(|p| p.stream)
}

/// [`super::after_forward`] of a stream already simulated.
pub fn after_forward_of(s: &step::Stream) -> Bytes {
    use step::{EventKind, Phase};
    let Some(last) = s.events.iter().rposition(|e| matches!(e.phase, Phase::Forward | Phase::Loss)) else {
        return s.resident;
    };
    // The frees that end the loss, after its last allocation: the logits are the LM head's.
    let output: Bytes = s.events[..=last]
        .iter()
        .rev()
        .take_while(|e| e.kind == EventKind::Free)
        .filter(|e| e.module.ends_with("lm_head"))
        .map(|e| e.bytes)
        .sum();
    s.resident + s.events[last].live + output
}
