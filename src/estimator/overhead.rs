//! Framework overhead: memory no formula of the model explains but every run pays. Each is a
//! named assumption with a default the user can change (`cuda_ctx_mib`, `nccl_mib`,
//! `frag_pct`, `prefetch_layers`).

use super::config::Config;
use super::expr::{Expr, Sym};
use super::gpu::MIB;
use super::ledger::{Bytes, Category, Row};
use super::model::Part;
use super::params::{LocalGroup, Role};
use super::precision::Recipe;
use super::sharding::Sharding;
use super::statics::NF4_ELEMENTS_PER_BYTE;

/// NCCL buffers when `nccl_mib` is automatic and more than one GPU talks: NCCL allocates
/// `NCCL_BUFFSIZE` = 4 MiB per channel per peer and protocol (docs.nvidia.com/deeplearning/nccl,
/// "Environment Variables"); with the 16–32 channels NVLink systems open for ring and tree
/// algorithms, communicators commonly hold a few hundred MiB. 512 MiB is our assumption.
pub const NCCL_DEFAULT_MIB: u64 = 512;

const CTX: Sym = Sym::new("C", "ctx", "CUDA context and library workspaces, MiB");
const NCCL: Sym = Sym::new("C", "nccl", "NCCL communicator buffers, MiB");
const MIB_SYM: Sym = Sym::new("MiB", "", "2²⁰ bytes");
const K_PRE: Sym = Sym::new("k", "pre", "unsharded layers in flight (computing + prefetched)");
const P_LAYER: Sym = Sym::new("P", "layer", "bytes of one decoder layer's parameters on this GPU");
const G_LAYER: Sym = Sym::new("G", "layer", "bytes of one decoder layer's gradients before reduce-scatter");
const FRAG: Sym = Sym::new("f", "frag", "allocator fragmentation, percent");
const PEAK: Sym = Sym::new("M", "dyn", "gradients, activations and working buffers allocated at the peak");

/// CUDA context: the driver's per-process state, kernel images (lazily loaded since CUDA 11.7),
/// and cuBLAS/cuDNN workspaces — not visible to `torch.cuda.memory_allocated()` but taken from
/// the card. 512 MiB is our default (≈ what `nvidia-smi` shows for an idle PyTorch process on
/// H100 with CUDA 12); set `cuda_ctx_mib` to what your process shows.
pub fn cuda_context_bytes(cfg: &Config) -> Row {
    let e = Expr::prod([Expr::var(CTX, cfg.cuda_ctx_mib), Expr::var(MIB_SYM, MIB)]);
    Row::new(
        "cuda_context",
        "CUDA context + workspaces",
        Category::FrameworkOverhead,
        e,
        "assumption (cuda_ctx_mib); CUDA C++ Programming Guide, lazy loading",
    )
    .note("outside PyTorch's allocator; measure it with nvidia-smi on an idle process")
}

/// NCCL's communicator buffers (only with more than one GPU).
pub fn nccl_buffer_bytes(cfg: &Config) -> Option<Row> {
    let mib = cfg.nccl_mib.unwrap_or(if cfg.gpus > 1 { NCCL_DEFAULT_MIB } else { 0 });
    if mib == 0 {
        return None;
    }
    let e = Expr::prod([Expr::var(NCCL, mib), Expr::var(MIB_SYM, MIB)]);
    Some(
        Row::new(
            "nccl_buffers",
            "NCCL buffers",
            Category::FrameworkOverhead,
            e,
            "assumption (nccl_mib); NCCL docs: NCCL_BUFFSIZE = 4 MiB per channel and peer",
        )
        .note("outside PyTorch's allocator"),
    )
}

/// Bytes of one decoder layer's parameters on this GPU, unsharded (what ZeRO-3/FSDP gathers).
pub fn layer_parameter_bytes(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup]) -> Bytes {
    layer_elements(cfg, groups, |_| true)
        .map(|(g, numel)| match g.role {
            Role::Quantized => numel.div_ceil(NF4_ELEMENTS_PER_BYTE as u128),
            _ => numel * recipe.weight.bytes() as u128,
        })
        .sum()
}

/// Elements of one decoder layer per group — the heaviest kind of layer: an MoE layer when
/// the model has one, a dense one otherwise.
fn layer_elements<'a>(
    cfg: &Config,
    groups: &'a [LocalGroup],
    pred: impl Fn(&LocalGroup) -> bool + 'a,
) -> impl Iterator<Item = (&'a LocalGroup, u128)> + 'a {
    let has_moe = cfg.arch.moe_layers() > 0;
    groups
        .iter()
        .filter(move |g| g.group.part.per_layer() && !(has_moe && g.group.part == Part::Mlp) && pred(g))
        .map(|g| (g, g.group.numel() as u128 * g.group.per_layer as u128))
}

/// ZeRO-3/FSDP all-gather the parameters of the layer about to compute (and prefetch the next):
/// k_pre × P_layer; in backward the layer's unsharded gradient waits for its reduce-scatter,
/// adding G_layer (deepspeed/runtime/zero/partitioned_param_coordinator.py; torch FSDP
/// `limit_all_gathers`).
pub fn gathered_layer_bytes(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup]) -> Option<Row> {
    let sh = Sharding::of(cfg);
    if sh.stage < 3 || sh.n <= 1 {
        return None;
    }
    let p = layer_parameter_bytes(cfg, recipe, groups);
    let trainable: u128 =
        layer_elements(cfg, groups, |g| g.role == Role::Trainable).map(|(_, n)| n).sum::<u128>() * recipe.grad.bytes() as u128;
    let e = Expr::sum([Expr::prod([Expr::var(K_PRE, cfg.prefetch_layers), Expr::var(P_LAYER, p)]), Expr::var(G_LAYER, trainable)]);
    Some(
        Row::new(
            "gathered_layers",
            "ZeRO-3/FSDP unsharded layers in flight",
            Category::Transient,
            e,
            "deepspeed/runtime/zero/partitioned_param_coordinator.py (prefetch); torch/distributed/fsdp (limit_all_gathers)",
        )
        .note("assumption (prefetch_layers): the layer computing plus the one prefetched"),
    )
}

/// The caching allocator reserves more than it hands out: blocks are rounded (512 B small,
/// 2 MiB large segments) and freed blocks of the wrong size cannot be reused, so
/// `memory_reserved` exceeds `memory_allocated` — commonly by 5–30 %
/// (c10/cuda/CUDACachingAllocator.cpp; PyTorch "CUDA semantics: memory management").
/// Modelled as f_frag % of the dynamic allocations at the peak (gradients, activations, working
/// buffers: what is allocated and freed every step); weights and optimizer states are allocated
/// once, in large blocks, and waste next to nothing. Default 10 %.
pub fn fragmentation_bytes(cfg: &Config, peak_dynamic: Bytes) -> Row {
    let e = Expr::prod([Expr::var(FRAG, cfg.frag_pct), Expr::var(PEAK, peak_dynamic)]).ceil_div(Expr::num(100u8));
    Row::new(
        "fragmentation",
        "Allocator fragmentation",
        Category::FrameworkOverhead,
        e,
        "assumption (frag_pct); c10/cuda/CUDACachingAllocator.cpp",
    )
    .note("reserved but unusable memory of PyTorch's caching allocator; expandable_segments:True lowers it")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_buffers_appear_only_with_more_than_one_gpu() {
        assert!(nccl_buffer_bytes(&Config::default()).is_none());
        let row = nccl_buffer_bytes(&Config { gpus: 8, ..Config::default() });
        assert_eq!(row.map(|r| r.bytes), Some(512 * MIB));
        let row = nccl_buffer_bytes(&Config { gpus: 8, nccl_mib: Some(0), ..Config::default() });
        assert!(row.is_none());
    }

    #[test]
    fn fragmentation_is_a_percentage_of_the_allocated_peak() {
        let cfg = Config { frag_pct: 10, ..Config::default() };
        assert_eq!(fragmentation_bytes(&cfg, 1000).bytes, 100);
        assert_eq!(fragmentation_bytes(&cfg, 1001).bytes, 101);
    }

    #[test]
    fn one_llama_3_1_8b_layer_weighs_436_mb_in_bf16() {
        use crate::estimator::params::{local_groups, Stage};
        use crate::estimator::precision::recipe;
        let cfg = Config::default();
        let g = local_groups(&cfg, Stage::Whole);
        // 218,112,000 parameters per layer × 2 B.
        assert_eq!(layer_parameter_bytes(&cfg, &recipe(cfg.precision), &g), 436_224_000);
    }
}
