//! The estimator's front door: [`analyse`] a configuration — its parameters, the ledger of the
//! most loaded GPU, the step's peak, the caching allocator's reserve, what nvidia-smi will show
//! and the verdict — the way the page, the CLI, the planner, the one-click answers, the sweeps
//! and the course all see it. [`Analysis::explain`] adds every row's formula.
//!
//! One figure decides: nvidia-smi's total (the step replayed through the caching allocator,
//! plus the CUDA context, cuBLAS workspaces and NCCL buffers) against the GPU's usable
//! capacity ([`Estimate::fits`]); where no allocator is replayed (`frag_pct` set, or
//! `kernels = cpu`), the step's peak with what lives outside the allocator. Loading the model
//! comes first (`load`): its peak stands beside the step's, and the larger decides.

use super::config::Config;
use super::estimate::{attach_reserve, estimate, replays_allocator, with_formulas, Estimate};
use super::ledger::Bytes;
use super::reserve::{reserved, Reserved};
use super::validate::EstimateError;
use serde::Serialize;

/// Below this share of the capacity left free, a configuration that fits is called tight
/// (percent): what a run allocates beside the step — a longer batch from the data loader, the
/// loader's pinned buffers, a profiler — can tip it over.
pub const TIGHT_PCT: f64 = 2.0;

/// Whether a configuration fits, by the one figure that decides (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Verdict {
    pub fits: bool,
    /// The figure compared with the capacity ([`Estimate::deciding_peak`]).
    pub deciding: Bytes,
    /// The GPU's usable memory.
    pub capacity: Bytes,
    /// `capacity − deciding` (negative: bytes missing).
    pub headroom: i128,
    /// Fits with less than [`TIGHT_PCT`] of the capacity free.
    pub tight: bool,
    /// The step's figure and the loading's, shown side by side; `deciding` is the larger.
    pub step: Bytes,
    pub load: Bytes,
}

impl Verdict {
    /// The verdict of an estimate whose allocator was replayed ([`analyse`]).
    pub fn of(e: &Estimate) -> Verdict {
        let headroom = e.headroom();
        let fits = e.fits();
        Verdict {
            fits,
            deciding: e.deciding_peak(),
            capacity: e.capacity,
            headroom,
            tight: fits && headroom_pct(headroom, e.capacity) < TIGHT_PCT,
            step: e.step_deciding(),
            load: e.memory.load_peak,
        }
    }
}

/// `headroom` as a share of `capacity`, percent (0 for a capacity of 0).
pub fn headroom_pct(headroom: i128, capacity: Bytes) -> f64 {
    if capacity == 0 {
        0.0
    } else {
        100.0 * headroom as f64 / capacity as f64
    }
}

/// One configuration, analysed (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Analysis {
    /// What was analysed.
    pub config: Config,
    /// The numbers, with the caching allocator replayed (each row's formula folded to its
    /// value; [`Analysis::explain`] builds them in full).
    pub estimate: Estimate,
    pub verdict: Verdict,
    /// The caching allocator's replay (where it runs: [`replays_allocator`]).
    pub reserved: Option<Reserved>,
}

impl Analysis {
    /// The same estimate with every row's formula, symbols and source built in full: what an
    /// opened ledger row and `trainmem estimate --json` show. Its bytes equal
    /// [`Analysis::estimate`]'s (both run the same term functions).
    pub fn explain(&self) -> Result<Estimate, EstimateError> {
        let e = with_formulas(&self.config)?;
        Ok(match &self.reserved {
            Some(r) => attach_reserve(e, r),
            None => e,
        })
    }
}

/// Analyses `cfg`: every term of the ledger, the step simulated op by op, the caching
/// allocator replayed, and the verdict on the deciding figure.
pub fn analyse(cfg: &Config) -> Result<Analysis, EstimateError> {
    let e = estimate(cfg)?;
    let reserved = if replays_allocator(cfg) { Some(reserved(cfg, e.stream_at())?) } else { None };
    let e = match &reserved {
        Some(r) => attach_reserve(e, r),
        None => e,
    };
    Ok(Analysis { config: cfg.clone(), verdict: Verdict::of(&e), estimate: e, reserved })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_configuration_is_decided_on_nvidia_smi_and_does_not_fit_an_h100() {
        // Llama-3.1-8B, mixed bf16 AdamW on one H100: 16 bytes a parameter of model states alone
        // (128 GB) exceed the card's 85.5 GB.
        let a = analyse(&Config::default()).expect("the default configuration is valid");
        assert_eq!(Some(a.verdict.deciding), a.estimate.memory.nvidia_smi);
        assert!(!a.verdict.fits && !a.verdict.tight);
        assert_eq!(a.verdict.headroom, a.estimate.capacity as i128 - a.verdict.deciding as i128);
        assert!(a.verdict.deciding >= a.estimate.memory.peak, "nvidia-smi shows at least the peak in use");
    }

    #[test]
    fn explain_gives_the_analysis_bytes_with_formulas() {
        let cfg = Config { seq: 1024, gpus: 8, zero: crate::estimator::config::Zero::Z3, ..Config::default() };
        let a = analyse(&cfg).expect("valid");
        let e = a.explain().expect("valid");
        assert_eq!(e.memory, a.estimate.memory);
        assert_eq!(
            e.components.iter().map(|r| r.bytes).collect::<Vec<_>>(),
            a.estimate.components.iter().map(|r| r.bytes).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_fit_with_under_two_percent_free_is_tight() {
        let e = |deciding: Bytes| Verdict {
            fits: true,
            deciding,
            capacity: 1000,
            headroom: 1000 - deciding as i128,
            tight: false,
            step: deciding,
            load: 0,
        };
        assert!(headroom_pct(e(985).headroom, 1000) < TIGHT_PCT);
        assert!(headroom_pct(e(970).headroom, 1000) >= TIGHT_PCT);
        assert_eq!(headroom_pct(5, 0), 0.0);
    }
}
