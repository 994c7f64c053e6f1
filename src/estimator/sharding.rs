//! ZeRO/FSDP sharding: how many GPUs one shard of each kind of tensor spans, and the one place
//! weights, gradients, master weights and optimizer states are divided by it (Rajbhandari et al.
//! 2020, §5: P_os shards optimizer states from stage 1, P_g gradients from stage 2, P_p
//! parameters from stage 3; FSDP's FULL_SHARD/SHARD_GRAD_OP/HYBRID_SHARD map onto them).

use super::config::{Config, Zero};
use super::expr::{Expr, Sym};
use super::params::LocalGroup;

pub const PSI_T: Sym = Sym::new("Ψ", "T", "trainable parameters on this GPU");
pub const PSI_E: Sym = Sym::new("Ψ", "E", "routed-expert parameters on this GPU (sharded over N_e)");
pub const N_D: Sym = Sym::new("N", "d", "GPUs a ZeRO/FSDP shard spans");
pub const N_E: Sym = Sym::new("N", "e", "GPUs an expert shard spans (N_d / ep)");

/// ZeRO divisors of one GPU.
#[derive(Clone, Debug)]
pub struct Sharding {
    pub stage: u8,
    /// GPUs one shard spans (the data-parallel degree, or the `shard_group` under HYBRID_SHARD).
    pub n: u64,
    /// Expert shards span n / ep.
    pub n_expert: u64,
}

/// The ZeRO stage from which each role is sharded (Rajbhandari et al. 2020, §5): optimizer
/// states (and master weights) from stage 1, gradients from stage 2, parameters from stage 3.
pub const OPTIMIZER_STATES_FROM: u8 = 1;
pub const GRADIENTS_FROM: u8 = 2;
pub const PARAMETERS_FROM: u8 = 3;

impl Sharding {
    /// The shard group spans the data-parallel and the context-parallel ranks together: a
    /// context-parallel group holds the same parameters (each rank a slice of the sequence), and
    /// the frameworks shard over both — torchtitan's FSDP mesh is `fsdp = dp_shard × cp`
    /// (`distributed/parallel_dims.py`, v0.2.2), Megatron's distributed optimizer uses
    /// `get_data_parallel_group(with_context_parallel=True)`, DeepSpeed-Ulysses shards ZeRO over
    /// the sequence-data-parallel group. Under HYBRID_SHARD the group is `shard_group` as set.
    pub fn of(cfg: &Config) -> Sharding {
        let dp = cfg.dp().max(1) * cfg.cp.max(1);
        let n = if cfg.zero == Zero::HybridShard { cfg.shard_group.clamp(1, dp) } else { dp };
        Sharding { stage: cfg.zero.stage(), n, n_expert: (n / cfg.ep.max(1)).max(1) }
    }
    /// Whether a role sharded from `from_stage` on (see [`GRADIENTS_FROM`] …) is split over more
    /// than one GPU here: the one test every sharded term and the step's program ask.
    pub fn splits(&self, from_stage: u8) -> bool {
        self.stage >= from_stage && self.n > 1
    }
    /// How many GPUs share a role sharded from `from_stage` on: (dense tensors, routed experts);
    /// (1, 1) where it is not split ([`Sharding::splits`]).
    pub fn ways(&self, from_stage: u8) -> (u64, u64) {
        if self.splits(from_stage) {
            (self.n, self.n_expert)
        } else {
            (1, 1)
        }
    }
    /// The divisors for a role sharded from `from_stage` on.
    pub fn shards(&self, from_stage: u8) -> Shards {
        if self.splits(from_stage) {
            Shards { dense: Expr::var(N_D, self.n), expert: Expr::var(N_E, self.n_expert) }
        } else {
            Shards::none()
        }
    }
}

/// The divisors of ZeRO sharding for one role: dense tensors shard over `dense`, routed
/// experts over `expert` (the expert-data-parallel group).
#[derive(Clone, Debug)]
pub struct Shards {
    pub dense: Expr,
    pub expert: Expr,
}

impl Shards {
    pub fn none() -> Shards {
        Shards { dense: Expr::num(1u8), expert: Expr::num(1u8) }
    }
    fn same(&self) -> bool {
        self.dense.eval() == self.expert.eval()
    }
}

/// `⌈Ψ / N⌉` over the groups matching `pred`, split into a dense and an expert pool when they
/// shard differently. The one place weights, gradients, master weights and states are sharded.
pub fn sharded_elements(groups: &[LocalGroup], pred: impl Fn(&LocalGroup) -> bool, sym: Sym, shards: &Shards) -> Expr {
    let t = |g: &&LocalGroup| pred(g);
    let dense: u64 = groups.iter().filter(t).filter(|g| !g.expert || shards.same()).map(|g| g.group.total()).sum();
    let expert: u64 = groups.iter().filter(t).filter(|g| g.expert && !shards.same()).map(|g| g.group.total()).sum();
    let mut terms = vec![Expr::var(sym, dense).shard(shards.dense.clone())];
    if expert > 0 {
        terms.push(Expr::var(PSI_E, expert).shard(shards.expert.clone()));
    }
    Expr::sum(terms)
}
