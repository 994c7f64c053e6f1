//! Framework overhead: memory no formula of the model explains but every run pays, and what makes
//! `nvidia-smi` show more than `torch.cuda.memory_allocated()`: the caching allocator's reserve
//! (simulated by allocator.rs), cuBLAS workspaces, the CUDA context and NCCL's buffers. Each default
//! is sourced and can be overridden (`cuda_ctx_mib`, `nccl_mib`, `frag_pct`, `alloc_conf`,
//! `prefetch_layers`).

use super::config::{Config, Kernels};
use super::expr::{Expr, Sym};
use super::gpu::MIB;
use super::gpu::{gpu, Gpu, ScaleUp, Vendor};
use super::ledger::{Bytes, Category, Row, RowId};
use super::model::Part;
use super::params::{LocalGroup, Role};
use super::precision::Recipe;
use super::sharding::{head_unit, Sharding};
use super::statics::NF4_ELEMENTS_PER_BYTE;
use std::borrow::Cow;

const CTX: Sym = Sym::new("C", "ctx", "CUDA context, MiB");
const NCCL: Sym = Sym::new("C", "nccl", "NCCL communicator buffers, MiB");
const MIB_SYM: Sym = Sym::new("MiB", "", "2²⁰ bytes");
const K_PRE: Sym = Sym::new("k", "pre", "unsharded layers in flight (computing + prefetched)");
const P_LAYER: Sym = Sym::new("P", "layer", "bytes of one decoder layer's parameters on this GPU");
const G_LAYER: Sym = Sym::new("G", "layer", "bytes of one decoder layer's gradients before reduce-scatter");
const FRAG: Sym = Sym::new("f", "frag", "reserve beyond allocated, percent (your guess)");
const PEAK: Sym = Sym::new("M", "dyn", "gradients, activations and working buffers allocated at the peak");

/// The CUDA context measured on an idle PyTorch process, by the GPU generation it was measured on:
/// what `nvidia-smi` shows before any tensor exists (the driver's per-process state and the kernel
/// images loaded lazily since CUDA 11.7). It depends on the CUDA and driver versions and on how many
/// kernels the run loads more than on the chip, so these are the closest measured figures, not laws.
pub struct ContextFigure {
    pub mib: u64,
    pub source: &'static str,
}

/// RTX 3090 (Ampere), torch 2.7.1 + CUDA 12.8, driver 610: a bare context held 256 MiB
/// (invoke-ai/InvokeAI issue #9413, 2026).
pub const CONTEXT_AMPERE: ContextFigure =
    ContextFigure { mib: 256, source: "RTX 3090, torch 2.7.1+cu128: 256 MiB (invoke-ai/InvokeAI #9413)" };
/// RTX 6000 Ada, torch 2.10 + CUDA 13.0: `torch.cuda.mem_get_info()` alone made 426 MiB appear in
/// `nvidia-smi` (unslothai/unsloth-zoo PR #1053, 2026) — the newest measurement we found; Hopper and
/// Blackwell are assumed to be alike (no public measurement found).
pub const CONTEXT_ADA_AND_NEWER: ContextFigure = ContextFigure {
    mib: 426,
    source: "RTX 6000 Ada, torch 2.10+cu130: 426 MiB (unslothai/unsloth-zoo #1053); Hopper/Blackwell assumed alike, unmeasured",
};
/// Older NVIDIA generations with lazy loading: "~300 MB" (pytorch/pytorch #107667), "around 400MB
/// if CUDA >= 11.7" (#109888); 287 MB in the lazy-loading PR (#86509). We take 300 MiB.
pub const CONTEXT_OLDER: ContextFigure = ContextFigure { mib: 300, source: "~300 MB with lazy loading (pytorch/pytorch #107667, #86509)" };
/// AMD (ROCm): no public measurement of an idle PyTorch process found; the Ada figure is assumed.
pub const CONTEXT_AMD: ContextFigure =
    ContextFigure { mib: 426, source: "ROCm: no public measurement found; assumed equal to the newest NVIDIA figure" };

/// The measured context figure closest to this GPU (a custom GPU: the newest figure).
pub fn context_figure(gpu: Option<&Gpu>) -> ContextFigure {
    match gpu.map(|g| (g.vendor, g.compute_capability)) {
        None => CONTEXT_ADA_AND_NEWER,
        Some((Vendor::Amd, _)) | Some((_, None)) => CONTEXT_AMD,
        Some((_, Some(cc))) if cc >= (8, 9) => CONTEXT_ADA_AND_NEWER,
        Some((_, Some((8, _)))) => CONTEXT_AMPERE,
        Some(_) => CONTEXT_OLDER,
    }
}

/// The configured GPU from the catalog (`None` for `gpu=custom`).
pub fn configured_gpu(cfg: &Config) -> Option<Gpu> {
    gpu(&cfg.gpu)
}

/// Whether the GPUs talk over NVLink/Infinity Fabric (NCCL opens more channels there).
pub fn has_scale_up_link(cfg: &Config) -> bool {
    match configured_gpu(cfg) {
        Some(g) => g.scale_up != ScaleUp::None,
        None => cfg.gpu_link_gbs > 0.0,
    }
}

/// The CUDA context: outside PyTorch's allocator, but taken from the card (`nvidia-smi` counts it,
/// `torch.cuda.memory_reserved()` does not). `cuda_ctx_mib` overrides the measured figure.
pub fn cuda_context_bytes(cfg: &Config) -> Row {
    let fig = context_figure(configured_gpu(cfg).as_ref());
    let (mib, source, note) = match cfg.cuda_ctx_mib {
        Some(mib) => (mib, "cuda_ctx_mib (set by the user)", Cow::Borrowed("your figure; outside PyTorch's allocator")),
        None => (
            fig.mib,
            "measured figures by GPU generation; see overhead.rs ContextFigure",
            Cow::Owned(format!(
                "{}; outside PyTorch's allocator — set cuda_ctx_mib to what nvidia-smi shows for an idle process",
                fig.source
            )),
        ),
    };
    let e = Expr::prod([Expr::var(CTX, mib), Expr::var(MIB_SYM, MIB)]);
    Row::new(RowId::CudaContext, "CUDA context", Category::FrameworkOverhead, e, source).note(note)
}

/// cuBLAS's workspace when `CUBLAS_WORKSPACE_CONFIG` is unset: `:4096:2:16:8`, two 4 MiB and eight
/// 16 KiB chunks = 8,519,680 B (aten/src/ATen/cuda/CublasHandlePool.cpp,
/// `parseChosenWorkspaceSize`).
pub const CUBLAS_WORKSPACE_BYTES: u64 = 4096 * 1024 * 2 + 16 * 1024 * 8;
/// … and on compute capability exactly 9.0 (H100, H200): `4096 * 8 * 1024` = 32 MiB (same function:
/// `sm90 = major == 9 && minor == 0`; Blackwell gets the default above).
pub const CUBLAS_WORKSPACE_SM90_BYTES: u64 = 4096 * 8 * 1024;
/// cuBLASLt's own workspace: 1,024 KiB unless `CUBLASLT_WORKSPACE_SIZE` says otherwise
/// (`parseCUDABlasLtWorkspaceSize`, "default size in KiB according to #73328"); allocated
/// separately by `getCUDABlasLtWorkspace` unless `TORCH_CUBLASLT_UNIFIED_WORKSPACE=1`.
pub const CUBLASLT_WORKSPACE_BYTES: u64 = 1024 * 1024;
/// Threads that issue GEMMs in a training step: the Python thread (forward, optimizer) and
/// autograd's device thread (backward). Each reserves its own cuBLAS handle from the per-thread
/// `DeviceThreadHandlePool`, and workspaces are keyed by (handle, stream): two of each.
pub const CUBLAS_HANDLES_PER_STEP: u64 = 2;

/// One cuBLAS workspace on a GPU of this compute capability (allocated through the caching
/// allocator, so it is inside `memory_reserved`, and never freed).
pub fn cublas_workspace_bytes(compute_capability: Option<(u8, u8)>) -> u64 {
    if compute_capability == Some((9, 0)) {
        CUBLAS_WORKSPACE_SM90_BYTES
    } else {
        CUBLAS_WORKSPACE_BYTES
    }
}

const WS: Sym = Sym::new("W", "blas", "one cuBLAS workspace + one cuBLASLt workspace");
const HANDLES: Sym = Sym::new("n", "h", "cuBLAS handles issuing GEMMs (the Python thread, autograd's device thread)");

/// cuBLAS and cuBLASLt workspaces under `kernels=cuda`: n_h × (W_cuBLAS + W_cuBLASLt). Allocated
/// through the caching allocator at the first GEMM of each thread and never freed, so they are
/// inside `memory_allocated` and `memory_reserved`.
pub fn blas_workspace_bytes(cfg: &Config) -> Option<Row> {
    if cfg.kernels != Kernels::Cuda {
        return None;
    }
    let cc = configured_gpu(cfg).and_then(|g| g.compute_capability);
    let one = cublas_workspace_bytes(cc) + CUBLASLT_WORKSPACE_BYTES;
    let e = Expr::prod([Expr::var(HANDLES, CUBLAS_HANDLES_PER_STEP), Expr::var(WS, one)]);
    Some(
        Row::new(RowId::BlasWorkspaces,
            "cuBLAS / cuBLASLt workspaces",
            Category::FrameworkOverhead,
            e,
            "aten/src/ATen/cuda/CublasHandlePool.cpp: getChosenWorkspaceSize (8,519,680 B; 32 MiB on sm_90), getCUDABlasLtWorkspace (1 MiB)",
        )
        .note("per (cuBLAS handle, stream): the forward/optimizer thread and autograd's backward thread each hold one"),
    )
}

/// NCCL's buffers per peer connection and channel, by protocol (NCCL `src/include/device.h` and
/// `src/init.cc`): Simple = `NCCL_BUFFSIZE` 4 MiB, LL = 524,288 B, LL128 = 4,915,200 B.
pub const NCCL_SIMPLE_BYTES: u64 = 4 * 1024 * 1024;
pub const NCCL_LL_BYTES: u64 = 524_288;
pub const NCCL_LL128_BYTES: u64 = 4_915_200;
/// Peers a rank keeps buffers for on each channel of a ring: the one it receives from and the one
/// it sends to.
pub const NCCL_RING_PEERS: u64 = 2;
/// Channels NCCL opens for a communicator on an NVLink/NVSwitch node (16) and over PCIe (2): our
/// assumption from NCCL's topology search defaults (`NCCL_MIN_NCHANNELS`/`NCCL_MAX_NCHANNELS`);
/// `nccl_mib` overrides the whole row.
pub const NCCL_CHANNELS_NVLINK: u64 = 16;
pub const NCCL_CHANNELS_PCIE: u64 = 2;

const COMMS: Sym = Sym::new("n", "comm", "NCCL communicators this GPU is in (data, tensor, pipeline, context, expert groups)");
const CHANNELS: Sym = Sym::new("n", "ch", "channels per communicator");
const PEERS: Sym = Sym::new("n", "peer", "peers per channel (ring: previous and next)");
const PROTO: Sym = Sym::new("B", "proto", "bytes per peer and channel: Simple + LL + LL128 buffers");

/// The process groups a GPU communicates in, each its own NCCL communicator.
pub fn nccl_communicators(cfg: &Config) -> u64 {
    [cfg.dp() > 1, cfg.tp > 1, cfg.pp > 1, cfg.cp > 1, cfg.ep > 1].iter().filter(|&&b| b).count() as u64
}

/// NCCL's communicator buffers, outside PyTorch's allocator: communicators × channels × peers ×
/// (Simple + LL + LL128) (only with more than one GPU; `nccl_mib` overrides).
pub fn nccl_buffer_bytes(cfg: &Config) -> Option<Row> {
    let nvlink = has_scale_up_link(cfg);
    if let Some(mib) = cfg.nccl_mib {
        if mib == 0 {
            return None;
        }
        let e = Expr::prod([Expr::var(NCCL, mib), Expr::var(MIB_SYM, MIB)]);
        return Some(
            Row::new(RowId::NcclBuffers, "NCCL buffers", Category::FrameworkOverhead, e, "nccl_mib (set by the user)")
                .note("your figure; outside PyTorch's allocator"),
        );
    }
    let comms = nccl_communicators(cfg);
    if comms == 0 {
        return None;
    }
    let channels = if nvlink { NCCL_CHANNELS_NVLINK } else { NCCL_CHANNELS_PCIE };
    let proto = NCCL_SIMPLE_BYTES + NCCL_LL_BYTES + NCCL_LL128_BYTES;
    let e =
        Expr::prod([Expr::var(COMMS, comms), Expr::var(CHANNELS, channels), Expr::var(PEERS, NCCL_RING_PEERS), Expr::var(PROTO, proto)]);
    Some(
        Row::new(
            RowId::NcclBuffers,
            "NCCL buffers",
            Category::FrameworkOverhead,
            e,
            "NCCL src/init.cc, src/include/device.h: per channel and peer, Simple 4 MiB + LL 512 KiB + LL128 4.69 MiB",
        )
        .note("outside PyTorch's allocator; channel counts are NCCL's topology defaults (assumed); set nccl_mib to measure"),
    )
}

/// Bytes of one decoder layer's parameters on this GPU, unsharded (what ZeRO-3/FSDP gathers),
/// each group as FSDP all-gathers it ([`super::statics::gathered_bytes`]: the FP8 linears at 1
/// byte an element with `fp8_allgather`).
pub fn layer_parameter_bytes(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup]) -> Bytes {
    layer_elements(cfg, groups, |_| true).map(|(g, numel)| super::statics::gathered_bytes(cfg, recipe, g, numel)).sum()
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
    if !sh.splits(super::sharding::PARAMETERS_FROM) {
        return None;
    }
    let trainable: u128 =
        layer_elements(cfg, groups, |g| g.role == Role::Trainable).map(|(_, n)| n).sum::<u128>() * recipe.grad.bytes() as u128;
    if super::sharding::keeps_stage_gathered(cfg) {
        // The stage's parameters are all gathered already (their own row, `gathered_stage`):
        // what comes and goes is a layer's 16-bit gradients, until its unit's `post_backward`
        // adds them into the fp32 accumulators.
        return Some(
            Row::new(
                RowId::GatheredLayers,
                "FSDP2 layer gradients before accumulation",
                Category::Transient,
                Expr::var(G_LAYER, trainable),
                "torch 2.15 distributed/fsdp/_fully_shard/_fsdp_param_group.py post_backward (no reduce before the last micro-batch)",
            )
            .note("one layer's gradients in the parameter dtype until its unit's post_backward casts them into the fp32 accumulators"),
        );
    }
    let p = layer_parameter_bytes(cfg, recipe, groups);
    let mut terms = vec![Expr::prod([Expr::var(K_PRE, cfg.prefetch_layers), Expr::var(P_LAYER, p)]), Expr::var(G_LAYER, trainable)];
    let offload = cfg.offload == super::config::Offload::OptimizerParams;
    if offload {
        // With parameter offload each group in flight is first copied host-to-device as its
        // shard (`_fsdp_param.py all_gather_inputs`: `sharded_param_data.to(device)`, the
        // shard's dtype) and cast to the compute dtype (`_to_dtype_if_needed`) before the
        // all-gather (validation/FINDINGS.md §13).
        terms.push(Expr::prod([Expr::var(K_PRE, cfg.prefetch_layers), Expr::var(SHARD_COPY, layer_shard_copy_bytes(cfg, recipe, groups))]));
    }
    Some(
        Row::new(
            RowId::GatheredLayers,
            "ZeRO-3/FSDP unsharded layers in flight",
            Category::Transient,
            Expr::sum(terms),
            if offload {
                "deepspeed/runtime/zero/partitioned_param_coordinator.py (prefetch); torch/distributed/fsdp (limit_all_gathers); FSDP2 _fsdp_param.py (offload: H2D shard copies)"
            } else {
                "deepspeed/runtime/zero/partitioned_param_coordinator.py (prefetch); torch/distributed/fsdp (limit_all_gathers)"
            },
        )
        .note(if super::sharding::tune_fsdp2(cfg) {
            // `step::model::layer_units`: each layer's copy-out and flat all-gather output are
            // events of the stream, where the peak and the allocator replay see them.
            "in the step's stream under torchtune's recipes (each layer's copy-out, and the layer before it prefetched while it runs backward), where the peak sees them; this row is their most at once"
        } else if offload {
            "assumption (prefetch_layers): the layer computing plus the one prefetched, each with its shard copied from the host; the sharded parameters, gradients and optimizer states stay on the host"
        } else {
            "assumption (prefetch_layers): the layer computing plus the one prefetched"
        }),
    )
}

const U_HEAD: Sym = Sym::new("U", "head", "the [norm, output] unit's unsharded parameters (parameter dtype)");
const G_HEAD: Sym = Sym::new("G", "head", "the output weight's unsharded gradient (parameter dtype)");
const R_HEAD: Sym = Sym::new("R", "head", "the unit's fp32 reduce-scatter input (padded)");

/// The ledger row of [`head_unit`]: the most of it alive at once, max(U + G, G + R) — U and G
/// through the head's backward, G and R at the unit's reduce (U is resharded just before).
/// Its bytes are in the step's stream (`step::run`, `ir::Unit`), so the peak, the allocator
/// replay and `step_reserved_peak` see them where they are alive; the working-memory row
/// leaves out what of them is alive at the peak.
pub fn head_unit_row(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup]) -> Option<Row> {
    let u = head_unit(cfg, recipe, groups)?;
    let (uu, gg, rr) = (Expr::var(U_HEAD, u.params), Expr::var(G_HEAD, u.grad), Expr::var(R_HEAD, u.reduce_input));
    let e = Expr::max([Expr::sum([uu, gg.clone()]), Expr::sum([gg, rr])]);
    Some(
        Row::new(
            RowId::GatheredHead,
            "FSDP2 [norm, output] unit, unsharded",
            Category::Transient,
            e,
            "torchtitan 0.2.2 models/llama3/infra/parallelize.py apply_fsdp (reshard_after_forward=False); torch 2.15 fsdp/_fully_shard/_fsdp_param_group.py post_backward, _fsdp_collectives.py foreach_reduce",
        )
        .note("parameters in the parameter dtype (bf16 under mixed precision), all-gathered before the final norm and kept to its backward; the head's unsharded gradient to the unit's fp32 reduce-scatter"),
    )
}

const U_ROOT: Sym = Sym::new("U", "root", "FSDP2's root unit unsharded: embedding, final norm and output in the parameter dtype");

/// FSDP2's root unit as torchtune's distributed recipes leave it: under LoRA
/// ([`crate::estimator::sharding::keeps_ends_in_root`]) U_root = (n_emb + n_norm + n_out) · b_w,
/// under the full fine-tune (its own end units) the final norm's n_norm · b_w
/// ([`crate::estimator::sharding::root_unit_bytes`]); gathered from the embedding to the head in
/// forward and from the head's backward to the end of backward, in the step's stream.
/// Toy (the `lora` records of tests/fixtures/pytorch/fsdp/tune.json): (2 · 4096 · 64 + 64) · 2
/// = 1,048,704 B, as measured.
pub fn root_unit_row(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup]) -> Option<Row> {
    let u = crate::estimator::sharding::root_unit_bytes(cfg, recipe, groups)?;
    Some(
        Row::new(
            RowId::GatheredRoot,
            if crate::estimator::sharding::keeps_ends_in_root(cfg) {
                "FSDP2 root unit (embedding, norm, output), unsharded"
            } else {
                "FSDP2 root unit (final norm), unsharded"
            },
            Category::Transient,
            Expr::var(U_ROOT, u),
            "torchtune 0.6.1 training/_distributed.py shard_model (fully_shard(model, reshard_after_forward=True)), recipes/configs/*/*_lora.yaml (no custom_sharded_layers); torch 2.15 fsdp/_fully_shard/_fsdp_state.py pre_backward, _fsdp_param_group.py post_backward",
        )
        .note(if cfg.fsdp_root_reshard {
            "in the parameter dtype; gathered in forward until the model returns, then again from the head's backward to the end of backward: beside every decoder layer's backward"
        } else {
            "in the parameter dtype; fsdp_root_reshard=false (torch ≤ 2.7 clamps the root to no reshard after forward): gathered from the model's forward to the end of backward, never gathered again"
        }),
    )
}

const U_OUT: Sym = Sym::new("U", "out", "the output weight unsharded (parameter dtype)");
const G_OUT: Sym = Sym::new("G", "out", "the output weight's unsharded gradient (parameter dtype)");
const R_OUT: Sym = Sym::new("R", "out", "its reduce-scatter input (parameter dtype, dim 0 padded)");

/// FSDP2's output unit as torchtune's distributed full fine-tune makes it
/// ([`crate::estimator::sharding::own_end_units`]; its embedding unit, the same size, holds less
/// at once): the most of it alive at once, max(U + 2·G, G + R) — the weight gathered for an output
/// chunk's backward, the gradient accumulated over the chunks and the out-of-place sum of the
/// second chunk's gradient beside it; then the reduce-scatter input beside the gradient. In the
/// step's stream, where it is placed op by op. Toy (tune.json, `full`): U = G = R = 524,288 B.
pub fn end_units_row(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup]) -> Option<Row> {
    let (u, g, r) = crate::estimator::sharding::end_unit(cfg, recipe, groups, Part::LmHead)?;
    let (uu, gg, rr) = (Expr::var(U_OUT, u), Expr::var(G_OUT, g), Expr::var(R_OUT, r));
    Some(
        Row::new(
            RowId::GatheredEnds,
            "FSDP2 output unit (per chunk), unsharded",
            Category::Transient,
            Expr::max([Expr::sum([uu, gg.clone(), gg.clone()]), Expr::sum([gg, rr])]),
            "torchtune 0.6.1 training/_distributed.py shard_model, recipes/configs/*/*_full.yaml custom_sharded_layers ['tok_embeddings', 'output'], modules/transformer.py chunked_output; torch 2.15 fsdp/_fully_shard/_fsdp_param_group.py pre_backward, post_backward; autograd accumulate_grad.h",
        )
        .note("gathered around each output chunk's matmul in forward and again for its backward; the gradient accumulated unsharded over the chunks (the second added out of place), reduce-scattered in the parameter dtype after the last"),
    )
}

/// One layer's shard as parameter offload brings it to the GPU before the all-gather: each
/// parameter's `⌈numel / n⌉` elements copied host-to-device in the dtype the host keeps
/// (`_fsdp_param.py all_gather_inputs`: `sharded_param_data.to(device)`), plus its cast to the
/// compute dtype where they differ (`_to_dtype_if_needed`): trainable parameters held as fp32
/// masters, b_m + b_w an element; frozen ones, b_w; 4-bit ones, their packed codes (½ B, no
/// cast). validation/FINDINGS.md §13.
fn layer_shard_copy_bytes(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup]) -> Bytes {
    let n = Sharding::of(cfg).n.max(1) as u128;
    let w = recipe.weight.bytes() as u128;
    layer_elements(cfg, groups, |_| true)
        .map(|(g, numel)| {
            let shard = numel.div_ceil(n);
            match g.role {
                Role::Quantized => shard.div_ceil(NF4_ELEMENTS_PER_BYTE as u128),
                Role::Trainable => shard * recipe.master.map_or(w, |m| m.bytes() as u128 + w),
                _ => shard * w,
            }
        })
        .sum()
}

const SHARD_COPY: Sym = Sym::new("S", "h2d", "one layer's shard copied from the host and cast (parameter offload)");

const RESERVE: Sym = Sym::new("R", "res", "reserved minus allocated when reserved memory peaks (simulated)");

/// The caching allocator's reserve beyond what is allocated, at the moment reserved memory peaks
/// (R_res = reserved − allocated then). Blocks are rounded (512 B; 2 MiB and 20 MiB segments),
/// freed blocks stay cached, and a request that fits no cached block takes a new segment, so
/// `memory_reserved` exceeds `memory_allocated` (c10/cuda/CUDACachingAllocator.cpp; replayed by
/// allocator.rs over the step's event stream with the configuration's `alloc_conf`).
pub fn reserve_simulated_bytes(reserved_peak: Bytes, allocated_then: Bytes) -> Row {
    let e = Expr::var(RESERVE, reserved_peak.saturating_sub(allocated_then));
    Row::new(
        RowId::AllocatorReserve,
        "Caching-allocator reserve (simulated)",
        Category::FrameworkOverhead,
        e,
        "c10/cuda/CUDACachingAllocator.cpp, replayed by estimator/allocator.rs over the step",
    )
    .note("reserved but not allocated when reserved memory peaks; expandable_segments:True (alloc_conf) lowers it")
}

/// A flat guess instead of the simulation (`frag_pct` set): f % of the dynamic allocations at the
/// peak (gradients, activations, working buffers — what is allocated and freed every step).
pub fn reserve_guess_bytes(frag_pct: u64, peak_dynamic: Bytes) -> Row {
    let e = Expr::prod([Expr::var(FRAG, frag_pct), Expr::var(PEAK, peak_dynamic)]).ceil_div(Expr::num(100u8));
    Row::new(
        RowId::AllocatorReserve,
        "Caching-allocator reserve (your guess)",
        Category::FrameworkOverhead,
        e,
        "frag_pct (set by the user)",
    )
    .note("a flat percentage instead of the simulated allocator; set frag_pct=auto to simulate")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_buffers_appear_only_with_more_than_one_gpu() {
        assert!(nccl_buffer_bytes(&Config::default()).is_none());
        // 8 H100s in data parallel: one communicator × 16 NVLink channels × 2 ring peers ×
        // (4,194,304 + 524,288 + 4,915,200) B = 32 × 9,633,792 = 308,281,344 B (294 MiB).
        let row = nccl_buffer_bytes(&Config { gpus: 8, ..Config::default() });
        assert_eq!(row.map(|r| r.bytes), Some(308_281_344));
        // tp = 2 adds a second communicator.
        let row = nccl_buffer_bytes(&Config { gpus: 8, tp: 2, ..Config::default() });
        assert_eq!(row.map(|r| r.bytes), Some(2 * 308_281_344));
        let row = nccl_buffer_bytes(&Config { gpus: 8, nccl_mib: Some(0), ..Config::default() });
        assert!(row.is_none());
        let row = nccl_buffer_bytes(&Config { gpus: 8, nccl_mib: Some(100), ..Config::default() });
        assert_eq!(row.map(|r| r.bytes), Some(100 * MIB));
    }

    #[test]
    fn the_cublas_workspace_is_32_mib_only_on_compute_capability_9_0() {
        // :4096:2:16:8 = 2 × 4 MiB + 8 × 16 KiB = 8,388,608 + 131,072.
        assert_eq!(cublas_workspace_bytes(Some((8, 0))), 8_519_680);
        assert_eq!(cublas_workspace_bytes(Some((9, 0))), 32 << 20);
        assert_eq!(cublas_workspace_bytes(Some((10, 0))), 8_519_680);
        // On an H100: 2 handles × (32 MiB + 1 MiB) = 66 MiB.
        let row = blas_workspace_bytes(&Config::default());
        assert_eq!(row.map(|r| r.bytes), Some(2 * (33 << 20)));
        assert!(blas_workspace_bytes(&Config { kernels: Kernels::Cpu, ..Config::default() }).is_none());
    }

    #[test]
    fn the_context_is_the_measured_figure_of_the_nearest_generation_unless_set() {
        let h100 = cuda_context_bytes(&Config::default());
        assert_eq!(h100.bytes, 426 * MIB);
        let a100 = cuda_context_bytes(&Config { gpu: "a100-80gb".into(), ..Config::default() });
        assert_eq!(a100.bytes, 256 * MIB);
        let mine = cuda_context_bytes(&Config { cuda_ctx_mib: Some(500), ..Config::default() });
        assert_eq!(mine.bytes, 500 * MIB);
    }

    #[test]
    fn the_reserve_guess_is_a_percentage_of_the_allocated_peak() {
        assert_eq!(reserve_guess_bytes(10, 1000).bytes, 100);
        assert_eq!(reserve_guess_bytes(10, 1001).bytes, 101);
        assert_eq!(reserve_simulated_bytes(300, 200).bytes, 100);
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
