//! Optimizer states: what each optimizer keeps per trainable parameter, and its step's
//! temporaries.

use super::config::{Config, Kernels, Offload, OptimImpl, Optimizer};
use super::expr::{Expr, Sym};
use super::ledger::{Category, Row, RowId};
use super::model::Part;
use super::params::{LocalGroup, Role};
use super::precision::{Recipe, FP32_BYTES};
use super::sharding::{sharded_elements, Shards, PSI_T};

/// Adam and AdamW keep two moments per parameter: `exp_avg` (m) and `exp_avg_sq` (v)
/// (Kingma & Ba 2015; torch/optim/adamw.py).
pub const ADAM_STATES: u64 = 2;
/// SGD with momentum keeps one `momentum_buffer` (torch/optim/sgd.py).
pub const MOMENTUM_STATES: u64 = 1;
/// Lion keeps one `exp_avg` (Chen et al. 2023, Algorithm 2).
pub const LION_STATES: u64 = 1;
/// Muon keeps one momentum buffer per hidden matrix (Jordan et al. 2024).
pub const MUON_STATES: u64 = 1;
/// bitsandbytes quantizes 8-bit optimizer states in blocks of 256 elements, one fp32 absmax
/// per block (bitsandbytes/optim/optimizer.py, `Optimizer2State.init_state`).
pub const ADAM8BIT_BLOCK: u64 = 256;
/// bitsandbytes keeps tensors smaller than `min_8bit_size = 4096` elements in 32-bit states.
pub const ADAM8BIT_MIN_SIZE: u64 = 4096;
/// One byte per 8-bit state element.
pub const ADAM8BIT_STATE_BYTES: u64 = 1;
/// The dynamic quantization maps of an 8-bit optimizer: `qmap1` and `qmap2`, 256 fp32 entries
/// each, one pair shared by the optimizer's 8-bit parameters (bitsandbytes 0.50.2
/// `Optimizer2State.init_state`, `self.name2qmap["dynamic"]`; measured in the
/// `optim=paged_adamw8bit` records' `optimizer_state_bytes_by_key`, FINDINGS §15.6).
pub const ADAM8BIT_QMAP_BYTES: u64 = 2 * 256 * 4;
/// Elements from which bitsandbytes' paged optimizers put a parameter's states in CUDA unified
/// memory (`Optimizer8bit.get_state_buffer`: `if not self.is_paged or A.numel() < 1e5`).
pub const PAGED_MIN_ELEMENTS: u64 = 100_000;

/// Whether bitsandbytes pages this configuration's optimizer states into CUDA unified memory:
/// `optim_paged` on a GPU with the states kept there. On a CPU `get_state_buffer` falls back
/// to plain `zeros_like` ("Paged optimizers are not supported on CPU"), and offloaded states
/// are host tensors already (bitsandbytes 0.50.2 `Optimizer8bit.get_state_buffer`).
pub fn paged(cfg: &Config) -> bool {
    cfg.optim_paged && cfg.kernels != Kernels::Cpu && cfg.offload == Offload::None
}

/// Whether a trainable tensor's `state1`/`state2` are paged (when [`paged`]): 10⁵ elements or
/// more. The threshold reads the tensor as the model defines it (an FSDP shard's own `numel`
/// is smaller: a tensor near 10⁵·N elements may page on fewer GPUs than this counts).
fn pages(g: &LocalGroup) -> bool {
    g.role == Role::Trainable && g.group.elements_per_tensor() >= PAGED_MIN_ELEMENTS
}

/// Whether `optim` is one of bitsandbytes' (its 8-bit Adam, or AdamW under `optim_paged`):
/// each parameter is stepped by one in-place kernel (`optimizer_update_32bit`,
/// `optimizer_update_8bit_blockwise`) — no temporaries — and its `step` is a Python int, not
/// a tensor (bitsandbytes 0.50.2 `Optimizer2State.update_step`, `init_state`).
pub fn bitsandbytes(cfg: &Config) -> bool {
    cfg.optim == Optimizer::Adam8bit || cfg.optim_paged
}

/// Where an optimizer's states are laid out beyond their formula.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateLayout {
    /// bitsandbytes pages the `state1`/`state2` of tensors of ≥ 10⁵ elements
    /// ([`paged_state_bytes`]): left out of the allocator's states (8-bit Adam's absmax stays).
    pub paged: bool,
    /// Each trainable tensor has its own optimizer (torchtune's optimizer in backward,
    /// `{p: optimizer([p])}`): 8-bit Adam's quantization maps are per optimizer
    /// (`self.name2qmap`), so one pair per 8-bit tensor instead of one in all.
    pub optimizer_per_parameter: bool,
}

impl StateLayout {
    /// The layout of `cfg`'s states.
    pub fn of(cfg: &Config) -> StateLayout {
        StateLayout { paged: paged(cfg), optimizer_per_parameter: cfg.optim_in_bwd }
    }
}

/// How `cfg`'s optimizer steps, as far as its temporaries go: bitsandbytes' kernels
/// ([`bitsandbytes`]) update in place like torch's `fused` ones, whatever `optim_impl` says.
pub fn step_impl(cfg: &Config) -> OptimImpl {
    if bitsandbytes(cfg) {
        OptimImpl::Fused
    } else {
        cfg.optim_impl
    }
}

const PSI_PG: Sym = Sym::new("Ψ", "pg", "elements of trainable tensors of ≥ 10⁵ (paged states)");

/// bitsandbytes' paged optimizer states: `2 · Ψ_pg · b_pg` in CUDA unified memory, outside
/// PyTorch's caching allocator.
///
/// `get_state_buffer` gives each trainable tensor of ≥ 10⁵ elements its `state1` and `state2`
/// from `F.get_paged` → `cudaMallocManaged(…, cudaMemAttachHost)`, wrapped as a tensor the
/// allocator never sees; `prefetch_state` moves them to the GPU before each update
/// (`cudaMemPrefetchAsync`), where they stay while there is room and from where the driver
/// evicts them to host memory under pressure (bitsandbytes 0.50.2 `optim/optimizer.py`,
/// `functional.py` `get_paged`; Dettmers et al. 2023, QLoRA §3 "Paged Optimizers").
///
/// Dtype: uint8 (1 B) for `PagedAdamW8bit` — its fp32 `absmax` blocks and `qmap`s are ordinary
/// allocations, counted with the other states — and fp32 (4 B) for the 32-bit `PagedAdamW`,
/// whatever the parameters' dtype (`Optimizer2State.init_state`, `optim_bits = 32`).
pub fn paged_state_bytes(optim: Optimizer, groups: &[LocalGroup], shards: &Shards) -> Option<Row> {
    let b = match optim {
        Optimizer::Adam8bit => Expr::konst("ADAM8BIT_STATE_BYTES", ADAM8BIT_STATE_BYTES),
        Optimizer::Adamw => Expr::konst("FP32_BYTES", FP32_BYTES),
        _ => return None,
    };
    let e = Expr::prod([Expr::konst("ADAM_STATES", ADAM_STATES), trainable_sharded(groups, pages, PSI_PG, shards), b]);
    (e.eval() > 0).then(|| {
        Row::new(
            RowId::PagedOptimizerStates,
            "Paged optimizer states (unified memory)",
            Category::OptimizerStates,
            e,
            "bitsandbytes 0.50.2 optim/optimizer.py, Optimizer8bit.get_state_buffer: F.get_paged (cudaMallocManaged) for tensors of ≥ 10⁵ elements",
        )
        .note(
            "outside PyTorch's allocator (not in max_memory_allocated/reserved); resident while there is room, evicted to host memory by the driver when the GPU runs short (the step slows, it does not fail)",
        )
    })
}
/// PyTorch's optimizers keep `step` as a 0-dim fp32 tensor per parameter tensor
/// (`_get_scalar_dtype()`), on the CPU unless `fused` or `capturable`.
pub const STEP_BYTES: u64 = FP32_BYTES;
/// The CUDA caching allocator rounds every allocation up to 512 bytes (`kMinBlockSize`,
/// c10/cuda/CUDACachingAllocator.cpp), so a 4-byte `step` on the GPU takes 512.
pub const ALLOCATOR_MIN_BLOCK: u64 = 512;
/// `_multi_tensor_adamw` allocates `exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)`: one
/// temporary as large as a moment for every parameter at once (torch/optim/adamw.py).
pub const FOREACH_ADAM_TEMPORARIES: u64 = 1;

const PSI_8: Sym = Sym::new("Ψ", "8", "elements of tensors of ≥ 4,096 (8-bit states)");
const PSI_S: Sym = Sym::new("Ψ", "small", "elements of tensors under 4,096 (32-bit states)");
const N_BLK: Sym = Sym::new("n", "blk", "256-element blocks, summed per tensor");
const S_F: Sym = Sym::new("S", "fact", "factored second-moment elements: rows + cols per matrix, size per vector");
const PSI_M: Sym = Sym::new("Ψ", "mat", "hidden-layer matrix elements (Muon)");
const PSI_A: Sym = Sym::new("Ψ", "adam", "embedding, head and vector elements (AdamW)");
const B_S: Sym = Sym::new("b", "s", "bytes per optimizer-state element");
const N_8: Sym = Sym::new("n", "8", "trainable tensors of ≥ 4,096 elements, each with its own optimizer (8-bit states)");
const N_T: Sym = Sym::new("n", "T", "trainable parameter tensors");

/// [`sharded_elements`] over the trainable groups matching `pred` (optimizer states exist only
/// for those).
fn trainable_sharded(groups: &[LocalGroup], pred: impl Fn(&LocalGroup) -> bool, sym: Sym, shards: &Shards) -> Expr {
    sharded_elements(groups, |g| g.role == Role::Trainable && pred(g), sym, shards)
}

fn is_hidden_matrix(g: &LocalGroup) -> bool {
    g.group.matrix_dims().is_some() && !matches!(g.group.part, Part::Embedding | Part::PositionEmbedding | Part::LmHead | Part::Projection)
}

/// Optimizer-state bytes on this GPU.
///
/// | optimizer | state elements per trainable parameter | source |
/// |---|---|---|
/// | SGD | 0 | torch/optim/sgd.py |
/// | momentum | 1 | torch/optim/sgd.py |
/// | AdamW | 2 (m, v) | torch/optim/adamw.py |
/// | Adafactor | rows + cols per matrix, n per vector | Shazeer & Stern 2018, §3 |
/// | Lion | 1 | Chen et al. 2023 |
/// | 8-bit Adam | 2 × 1 B + fp32 absmax per 256; fp32 below 4,096 elements | bitsandbytes |
/// | Muon | 1 per hidden matrix element, 2 (AdamW) for the rest | Jordan et al. 2024 |
///
/// Dtype: the recipe's state type (the parameter's own dtype in plain PyTorch, fp32 beside a
/// master copy), except 8-bit Adam's quantized states.
///
/// `layout`: paged states are left out ([`paged_state_bytes`]); 8-bit Adam's maps are one
/// pair per optimizer ([`StateLayout`]).
pub fn optimizer_state_bytes(optim: Optimizer, recipe: &Recipe, groups: &[LocalGroup], shards: &Shards, layout: StateLayout) -> Row {
    let paged = layout.paged;
    let b_s = Expr::var(B_S, recipe.state.bytes());
    let on_device = |g: &LocalGroup| !(paged && pages(g));
    let all = |_: &LocalGroup| true;
    let (expr, source): (Expr, &'static str) = match optim {
        Optimizer::Sgd => (Expr::zero(), "torch/optim/sgd.py: plain SGD keeps no state"),
        Optimizer::Momentum => (
            Expr::prod([Expr::konst("MOMENTUM_STATES", MOMENTUM_STATES), trainable_sharded(groups, all, PSI_T, shards), b_s]),
            "torch/optim/sgd.py: momentum_buffer",
        ),
        Optimizer::Adamw => (
            Expr::prod([Expr::konst("ADAM_STATES", ADAM_STATES), trainable_sharded(groups, on_device, PSI_T, shards), b_s]),
            "Kingma & Ba 2015; torch/optim/adamw.py: exp_avg, exp_avg_sq",
        ),
        Optimizer::Lion => (
            Expr::prod([Expr::konst("LION_STATES", LION_STATES), trainable_sharded(groups, all, PSI_T, shards), b_s]),
            "Chen et al. 2023, Symbolic Discovery of Optimization Algorithms: exp_avg",
        ),
        Optimizer::Adafactor => {
            let factored: u64 = groups
                .iter()
                .filter(|g| g.role == Role::Trainable)
                .map(|g| match g.group.matrix_dims() {
                    Some((r, c, m)) => (r + c) * m * g.group.count,
                    None => g.group.total(),
                })
                .sum();
            (
                Expr::prod([Expr::var(S_F, factored).shard(shards.dense.clone()), b_s]),
                "Shazeer & Stern 2018 (Adafactor), §3: factored second moment; torch/optim/_adafactor.py (no first moment)",
            )
        }
        Optimizer::Adam8bit => {
            let big = |g: &LocalGroup| g.group.elements_per_tensor() >= ADAM8BIT_MIN_SIZE;
            let big_on_device = |g: &LocalGroup| big(g) && on_device(g);
            let small = |g: &LocalGroup| g.group.elements_per_tensor() < ADAM8BIT_MIN_SIZE;
            let blocks: u64 = groups
                .iter()
                .filter(|g| g.role == Role::Trainable && big(g))
                .map(|g| g.group.elements_per_tensor().div_ceil(ADAM8BIT_BLOCK) * g.group.tensor_count())
                .sum();
            let two = || Expr::konst("ADAM_STATES", ADAM_STATES);
            let quantized = Expr::prod([
                two(),
                Expr::sum([
                    Expr::prod([
                        trainable_sharded(groups, big_on_device, PSI_8, shards),
                        Expr::konst("ADAM8BIT_STATE_BYTES", ADAM8BIT_STATE_BYTES),
                    ]),
                    Expr::prod([Expr::var(N_BLK, blocks).shard(shards.dense.clone()), Expr::konst("FP32_BYTES", FP32_BYTES)]),
                ]),
            ]);
            let full = Expr::prod([two(), trainable_sharded(groups, small, PSI_S, shards), Expr::konst("FP32_BYTES", FP32_BYTES)]);
            let qmaps = match blocks {
                0 => Expr::zero(),
                _ if layout.optimizer_per_parameter => {
                    let n8: u64 = groups.iter().filter(|g| g.role == Role::Trainable && big(g)).map(|g| g.group.tensor_count()).sum();
                    Expr::prod([Expr::var(N_8, n8), Expr::konst("ADAM8BIT_QMAP_BYTES", ADAM8BIT_QMAP_BYTES)])
                }
                _ => Expr::konst("ADAM8BIT_QMAP_BYTES", ADAM8BIT_QMAP_BYTES),
            };
            (
                Expr::sum([quantized, full, qmaps]),
                "Dettmers et al. 2022 (8-bit Optimizers via Block-wise Quantization); bitsandbytes/optim/optimizer.py",
            )
        }
        Optimizer::Muon => {
            let muon = Expr::prod([
                Expr::konst("MUON_STATES", MUON_STATES),
                trainable_sharded(groups, is_hidden_matrix, PSI_M, shards),
                b_s.clone(),
            ]);
            let adam = Expr::prod([
                Expr::konst("ADAM_STATES", ADAM_STATES),
                trainable_sharded(groups, |g| !is_hidden_matrix(g), PSI_A, shards),
                b_s,
            ]);
            (Expr::sum([muon, adam]), "Jordan et al. 2024 (Muon): momentum for hidden matrices, AdamW for embeddings, head and vectors")
        }
    };
    let note = match optim {
        Optimizer::Adam8bit => {
            "states 8-bit (uint8) in blocks of 256 with an fp32 absmax each; tensors under 4,096 elements keep fp32 states".to_string()
                + if paged { "; the uint8 states of tensors of ≥ 10⁵ elements are paged (their own row)" } else { "" }
        }
        Optimizer::Adamw if paged => {
            "bitsandbytes' 32-bit states (fp32); those of tensors of ≥ 10⁵ elements are paged (their own row)".to_string()
        }
        _ => format!(
            "states in {} ({})",
            recipe.state.name(),
            if recipe.master.is_some() { "beside the fp32 master copy" } else { "the parameters' own dtype, as torch.optim keeps them" }
        ),
    };
    Row::new(RowId::OptimizerStates, "Optimizer states", Category::OptimizerStates, expr, source).note(note)
}

/// Bytes of the `step` counters PyTorch's optimizers keep per parameter tensor, and whether they
/// live on the GPU: only `fused` puts them there (torch/optim/adamw.py, `_init_group`).
pub fn step_counter_bytes(optim: Optimizer, imp: OptimImpl, trainable_tensors: u64) -> Option<(Expr, bool)> {
    let has_step_tensor = matches!(optim, Optimizer::Adamw | Optimizer::Adafactor);
    if !has_step_tensor || trainable_tensors == 0 {
        return None;
    }
    let n = Expr::var(N_T, trainable_tensors);
    Some(match imp {
        OptimImpl::Fused => (Expr::prod([n, Expr::konst("ALLOCATOR_MIN_BLOCK", ALLOCATOR_MIN_BLOCK)]), true),
        _ => (Expr::prod([n, Expr::konst("STEP_BYTES", STEP_BYTES)]), false),
    })
}

/// Largest single temporary of the optimizer step on this GPU.
///
/// - `foreach` AdamW: `torch._foreach_sqrt(exp_avg_sqs)` materializes one moment-sized copy of
///   the whole group (torch/optim/adamw.py `_multi_tensor_adamw`).
/// - `forloop`: the same, one tensor at a time (the largest tensor).
/// - `fused`: none.
/// - Muon: Newton–Schulz iterates on the largest matrix in bf16, X, A = XXᵀ, B = bA + cA²
///   (Jordan et al. 2024, `zeropower_via_newtonschulz5`): ≈ 3 bf16 copies.
pub fn step_temporary_bytes(optim: Optimizer, imp: OptimImpl, recipe: &Recipe, groups: &[LocalGroup], shards: &Shards) -> Option<Row> {
    let b_s = Expr::var(B_S, recipe.state.bytes());
    let largest = groups.iter().filter(|g| g.role == Role::Trainable).map(|g| g.group.elements_per_tensor()).max().unwrap_or(0);
    let n_max = Sym::new("n", "max", "elements of the largest trainable tensor");
    let (expr, source, label) = match (optim, imp) {
        (Optimizer::Adamw, OptimImpl::Foreach) => (
            Expr::prod([
                Expr::konst("FOREACH_ADAM_TEMPORARIES", FOREACH_ADAM_TEMPORARIES),
                trainable_sharded(groups, |_| true, PSI_T, shards),
                b_s,
            ]),
            "torch/optim/adamw.py, _multi_tensor_adamw: exp_avg_sq_sqrt = torch._foreach_sqrt(...)",
            "AdamW step temporaries (foreach)",
        ),
        (Optimizer::Adamw, OptimImpl::Forloop) => (
            Expr::prod([Expr::var(n_max, largest), b_s]),
            "torch/optim/adamw.py, _single_tensor_adamw: one denominator per tensor",
            "AdamW step temporary (for-loop)",
        ),
        (Optimizer::Muon, _) => {
            let matrix = groups
                .iter()
                .filter(|g| g.role == Role::Trainable && is_hidden_matrix(g))
                .map(|g| g.group.elements_per_tensor())
                .max()
                .unwrap_or(0);
            (
                Expr::prod([Expr::konst("NEWTON_SCHULZ_COPIES", 3u8), Expr::var(n_max, matrix), Expr::konst("BF16_BYTES", 2u8)]),
                "Jordan et al. 2024, zeropower_via_newtonschulz5: X, A = XXᵀ, B in bf16",
                "Muon Newton–Schulz temporaries",
            )
        }
        _ => return None,
    };
    Some(Row::new(RowId::OptimizerStepTemporaries, label, Category::Transient, expr, source))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::config::{Config, Precision};
    use crate::estimator::params::{local_groups, Stage};
    use crate::estimator::precision::recipe;

    fn toy_groups() -> Vec<LocalGroup> {
        // One 64×64 matrix (4,096 elements) and one 64-element vector.
        use crate::estimator::model::{Split, TensorGroup};
        let g = |shape: Vec<u64>, part| LocalGroup {
            group: TensorGroup {
                name: "t",
                shape,
                count: 1,
                tensors_per_instance: 1,
                part,
                split: Split::Replicated,
                linear: None,
                per_layer: 1,
            },
            role: Role::Trainable,
            expert: false,
            adapter: false,
        };
        vec![g(vec![64, 64], Part::Attention), g(vec![64], Part::Norms)]
    }

    /// A 400×250 matrix (10⁵ elements: paged), a 64×64 one (4,096: 8-bit, not paged) and a
    /// 64-element vector.
    fn paging_groups() -> Vec<LocalGroup> {
        let mut g = toy_groups();
        let mut big = g[0].clone();
        big.group.shape = vec![400, 250];
        g.push(big);
        g
    }

    #[test]
    fn paged_8bit_adam_pages_the_uint8_states_of_tensors_of_a_hundred_thousand_elements_and_keeps_their_absmax() {
        let r = recipe(Precision::Bf16);
        let paged = StateLayout { paged: true, optimizer_per_parameter: false };
        let row = optimizer_state_bytes(Optimizer::Adam8bit, &r, &paging_groups(), &Shards::none(), paged);
        // 8-bit: 2 × (4,096 × 1 B + (16 + 391) blocks × 4 B) = 11,448; the vector's fp32
        // states 2 × 64 × 4 = 512; the qmaps 2,048. The big matrix's uint8 states are paged.
        assert_eq!(row.bytes, 11_448 + 512 + 2_048);
        let moved = paged_state_bytes(Optimizer::Adam8bit, &paging_groups(), &Shards::none()).expect("a paged tensor");
        assert_eq!(moved.bytes, 2 * 100_000);
        assert!(moved.id.outside_allocator());
        // Not paged, the same states are all the allocator's.
        let all = optimizer_state_bytes(Optimizer::Adam8bit, &r, &paging_groups(), &Shards::none(), StateLayout::default());
        assert_eq!(all.bytes, row.bytes + moved.bytes);
    }

    #[test]
    fn paged_adamw_keeps_fp32_states_and_pages_only_the_large_tensors() {
        let fp32 = recipe(Precision::Fp32);
        let paged = StateLayout { paged: true, optimizer_per_parameter: false };
        let row = optimizer_state_bytes(Optimizer::Adamw, &fp32, &paging_groups(), &Shards::none(), paged);
        assert_eq!(row.bytes, 2 * (4_096 + 64) * 4);
        let moved = paged_state_bytes(Optimizer::Adamw, &paging_groups(), &Shards::none()).expect("a paged tensor");
        assert_eq!(moved.bytes, 2 * 100_000 * 4);
        // Nothing of 10⁵ elements: nothing paged.
        assert!(paged_state_bytes(Optimizer::Adamw, &toy_groups(), &Shards::none()).is_none());
    }

    #[test]
    fn an_8bit_adam_per_parameter_keeps_one_pair_of_quantization_maps_per_8bit_tensor() {
        let r = recipe(Precision::Bf16);
        let one = optimizer_state_bytes(Optimizer::Adam8bit, &r, &paging_groups(), &Shards::none(), StateLayout::default());
        let each = StateLayout { paged: false, optimizer_per_parameter: true };
        let per = optimizer_state_bytes(Optimizer::Adam8bit, &r, &paging_groups(), &Shards::none(), each);
        // Two 8-bit tensors (the vector keeps fp32 states and no map): one more pair.
        assert_eq!(per.bytes - one.bytes, ADAM8BIT_QMAP_BYTES as u128);
    }

    #[test]
    fn adamw_keeps_two_states_per_parameter_in_the_state_dtype() {
        let r = recipe(Precision::Bf16);
        let row = optimizer_state_bytes(Optimizer::Adamw, &r, &toy_groups(), &Shards::none(), StateLayout::default());
        // 2 × (4096 + 64) × 2 B = 16,640.
        assert_eq!(row.bytes, 16_640);
        assert_eq!(row.expr.symbolic(), "2 × Ψ_T × b_s");
    }

    #[test]
    fn adafactor_factors_matrices_into_rows_plus_columns() {
        let r = recipe(Precision::Fp32);
        let row = optimizer_state_bytes(Optimizer::Adafactor, &r, &toy_groups(), &Shards::none(), StateLayout::default());
        // (64 + 64) + 64 = 192 elements × 4 B.
        assert_eq!(row.bytes, 768);
    }

    #[test]
    fn eight_bit_adam_quantizes_only_tensors_of_at_least_4096_elements() {
        let r = recipe(Precision::Bf16);
        let row = optimizer_state_bytes(Optimizer::Adam8bit, &r, &toy_groups(), &Shards::none(), StateLayout::default());
        // Matrix: 2 × (4096 × 1 B + 16 blocks × 4 B) = 8,320; vector: 2 × 64 × 4 B = 512; the
        // two 256-entry fp32 quantization maps: 2,048.
        assert_eq!(row.bytes, 10_880);
    }

    #[test]
    fn muon_uses_momentum_for_matrices_and_adamw_for_vectors() {
        let r = recipe(Precision::Fp32);
        let row = optimizer_state_bytes(Optimizer::Muon, &r, &toy_groups(), &Shards::none(), StateLayout::default());
        // 4096 × 4 B + 2 × 64 × 4 B.
        assert_eq!(row.bytes, 16_384 + 512);
    }

    #[test]
    fn sgd_keeps_nothing_and_momentum_one_buffer() {
        let r = recipe(Precision::Fp32);
        assert_eq!(optimizer_state_bytes(Optimizer::Sgd, &r, &toy_groups(), &Shards::none(), StateLayout::default()).bytes, 0);
        assert_eq!(optimizer_state_bytes(Optimizer::Momentum, &r, &toy_groups(), &Shards::none(), StateLayout::default()).bytes, 4160 * 4);
    }

    #[test]
    fn sharding_divides_the_state_elements_rounding_up() {
        let r = recipe(Precision::Fp32);
        let shards = Shards { dense: Expr::num(3u8), expert: Expr::num(3u8) };
        let row = optimizer_state_bytes(Optimizer::Adamw, &r, &toy_groups(), &shards, StateLayout::default());
        // 2 × ⌈4160 / 3⌉ × 4 = 2 × 1387 × 4.
        assert_eq!(row.bytes, 2 * 1387 * 4);
    }

    #[test]
    fn fused_adamw_keeps_its_step_counters_on_the_gpu() {
        let c = Config::default();
        let g = local_groups(&c, Stage::Whole);
        let n = crate::estimator::params::tensor_count(&g, |g| g.role == Role::Trainable);
        assert_eq!(step_counter_bytes(Optimizer::Adamw, OptimImpl::Fused, n).map(|(e, dev)| (e.eval(), dev)), Some((291 * 512, true)));
        assert_eq!(step_counter_bytes(Optimizer::Adamw, OptimImpl::Foreach, n).map(|(e, dev)| (e.eval(), dev)), Some((291 * 4, false)));
    }
}
