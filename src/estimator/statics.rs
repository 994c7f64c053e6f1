//! Static memory per GPU: weights, gradients, master weights and optimizer states — what lives
//! on the GPU for the whole run, whatever the batch — under ZeRO/FSDP sharding and offload.
//!
//! Reproduces the ZeRO paper's per-GPU model-state formulas (Rajbhandari et al. 2020, §5.1,
//! Figure 1) with Ψ parameters, N data-parallel GPUs and K optimizer bytes per parameter:
//! DDP (2 + 2 + K)Ψ; ZeRO-1 4Ψ + KΨ/N; ZeRO-2 2Ψ + (2 + K)Ψ/N; ZeRO-3 (4 + K)Ψ/N; and
//! Megatron's 18 and 6 + 12/d bytes per parameter (Korthikanti et al. 2022, §5).

use super::config::{Config, Offload, OptimImpl, Optimizer, Zero};
use super::expr::{Expr, Sym};
use super::ledger::{Category, Row, RowId};
use super::optimizer;
use super::params::{elements, tensor_count, LocalGroup, Role};
use super::precision::{Recipe, FP32_BYTES, FP8_WEIGHT_CACHE_BYTES};
use super::sharding::{sharded_elements, Sharding, Shards, PSI_T};

pub const PSI_F: Sym = Sym::new("Ψ", "F", "frozen parameters on this GPU");
pub const PSI_Q: Sym = Sym::new("Ψ", "Q", "NF4-quantized parameters on this GPU");
pub const N_Q: Sym = Sym::new("n", "Q", "quantized tensors");
pub const PSI_LIN: Sym = Sym::new("Ψ", "lin", "parameters of linear layers (fp8 GEMM weights)");
pub const B_W: Sym = Sym::new("b", "w", "bytes per weight");
pub const B_G: Sym = Sym::new("b", "g", "bytes per gradient");
pub const B_M: Sym = Sym::new("b", "m", "bytes per master weight (fp32)");

/// NF4 packs two 4-bit weights per byte (Dettmers et al. 2023, §3).
pub const NF4_ELEMENTS_PER_BYTE: u64 = 2;
/// One quantization constant per 64 weights, itself quantized to 8 bits (double quantization).
pub const NF4_BLOCK: u64 = 64;
/// The 8-bit constants are grouped in blocks of 256, each with an fp32 scale: 64 × 256.
pub const NF4_SECOND_LEVEL_BLOCK: u64 = 64 * 256;
/// Per quantized tensor, bitsandbytes keeps the 16-entry NF4 code table and an fp32 offset as
/// separate tensors (bitsandbytes/functional.py `QuantState`), each a 512-byte allocation.
pub const NF4_STATE_ALLOCATIONS: u64 = 2;
/// DeepSpeed's default `reduce_bucket_size` (5e8 elements; deepspeed/runtime/zero/config.py).
pub const ZERO_REDUCE_BUCKET_ELEMENTS: u64 = 500_000_000;

fn sharded(groups: &[LocalGroup], role: Role, sym: Sym, shards: &Shards) -> Expr {
    sharded_elements(groups, |g| g.role == role, sym, shards)
}

/// Ψ_R: trainable parameters that the model creates and keeps in fp32 whatever the recipe.
pub const PSI_R: Sym = Sym::new("Ψ", "R", "router weights kept in fp32 (DeepSeek-V2/V3, GLM-4.5)");
/// Ψ_T∖R: the other trainable parameters (those in the recipe's dtypes).
pub const PSI_T_REST: Sym = Sym::new("Ψ", "T∖R", "trainable parameters other than the fp32 router weights");
/// The router weight's tensor-table name.
const ROUTER_WEIGHT: &str = "layers.*.mlp.router.weight";

/// Whether a group is a router weight that the model keeps in fp32 (`router_fp32`: the
/// `torch.float32` weight of `DeepseekV3TopkRouter`, `DeepseekV2Moe.gate`, `Glm4MoeTopkRouter`,
/// listed in `_keep_in_fp32_modules_strict`, so `model.to(torch.bfloat16)` leaves it fp32).
fn fp32_kept(cfg: &Config, g: &LocalGroup) -> bool {
    cfg.arch.router_fp32 && g.role == Role::Trainable && g.group.name == ROUTER_WEIGHT
}

/// A weights or gradients row with the fp32-kept router split out when the recipe's type per
/// element `b` is narrower: ⌈Ψ_T∖R / N⌉ × b + ⌈Ψ_R / N⌉ × FP32_BYTES (PyTorch makes a
/// parameter's gradient in the parameter's dtype).
fn with_fp32_kept(row: Row, cfg: &Config, groups: &[LocalGroup], shards: &Shards, b: u64, b_sym: Sym) -> Row {
    if b >= FP32_BYTES || elements(groups, |g| fp32_kept(cfg, g)) == 0 {
        return row;
    }
    let rest = sharded_elements(groups, |g| g.role == Role::Trainable && !fp32_kept(cfg, g), PSI_T_REST, shards);
    let kept = sharded_elements(groups, |g| fp32_kept(cfg, g), PSI_R, shards);
    let e = Expr::sum([Expr::prod([rest, Expr::var(b_sym, b)]), Expr::prod([kept, Expr::konst("FP32_BYTES", FP32_BYTES)])]);
    let mut r = Row::new(row.id, row.label, row.category, e, row.source).note(format!("{}; the router weights stay fp32", row.note));
    r.children = row.children;
    r
}

/// Optimizer states, with those of the fp32-kept router in fp32 when the states live in the
/// parameters' own dtype (plain PyTorch: `torch.zeros_like(p)`, torch/optim/adamw.py
/// `_init_group`): the states of the other parameters plus the router's at FP32_BYTES.
fn fp32_kept_states(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup], shards: &Shards) -> Row {
    let all = optimizer::optimizer_state_bytes(cfg.optim, recipe, groups, shards);
    let plain = recipe.master.is_none() && recipe.state == recipe.weight && recipe.state.bytes() < FP32_BYTES;
    if !plain || elements(groups, |g| fp32_kept(cfg, g)) == 0 {
        return all;
    }
    let (kept, rest): (Vec<LocalGroup>, Vec<LocalGroup>) = groups.iter().cloned().partition(|g| fp32_kept(cfg, g));
    let fp32 = Recipe { state: super::precision::Dtype::Fp32, ..*recipe };
    let a = optimizer::optimizer_state_bytes(cfg.optim, recipe, &rest, shards);
    let k = optimizer::optimizer_state_bytes(cfg.optim, &fp32, &kept, shards);
    Row::new(all.id, all.label, all.category, Expr::sum([a.expr, k.expr]), all.source)
        .note("the router weights' states are fp32, like the weights")
}

/// Trainable weights: ⌈Ψ_T / N⌉ × b_w, sharded from ZeRO-3 on.
/// Dtype: the recipe's weight type (bf16 in mixed precision, fp32 in fp32 and AMP).
pub fn trainable_weight_bytes(recipe: &Recipe, groups: &[LocalGroup], sh: &Sharding) -> Row {
    let e = Expr::prod([sharded(groups, Role::Trainable, PSI_T, &sh.shards(3)), Expr::var(B_W, recipe.weight.bytes())]);
    Row::new(
        RowId::Weights,
        "Trainable weights",
        Category::Parameters,
        e,
        "Rajbhandari et al. 2020 (ZeRO), §3: 2Ψ fp16/bf16 parameters; ZeRO-3 shards them (P_os+g+p)",
    )
    .note(format!("{} weights", recipe.weight.name()))
}

/// Frozen weights of LoRA's base (and QLoRA's non-quantized tensors): ⌈Ψ_F / N⌉ × b_w, no
/// gradients, no optimizer states.
pub fn frozen_weight_bytes(recipe: &Recipe, groups: &[LocalGroup], sh: &Sharding) -> Option<Row> {
    if elements(groups, |g| g.role == Role::Frozen) == 0 {
        return None;
    }
    let e = Expr::prod([sharded(groups, Role::Frozen, PSI_F, &sh.shards(3)), Expr::var(B_W, recipe.weight.bytes())]);
    Some(
        Row::new(
            RowId::FrozenWeights,
            "Frozen base weights",
            Category::Parameters,
            e,
            "Hu et al. 2021 (LoRA), §4: the pre-trained weights are frozen",
        )
        .note(format!("{} weights; no gradients or optimizer states", recipe.weight.name())),
    )
}

/// NF4 base of QLoRA with double quantization (Dettmers et al. 2023, §3; bitsandbytes
/// `quantize_4bit(compress_statistics=True, blocksize=64)`):
/// ⌈Ψ_Q/2⌉ 4-bit codes + ⌈Ψ_Q/64⌉ 8-bit block constants + 4 × ⌈Ψ_Q/16,384⌉ fp32 second-level
/// scales + two 512-byte state allocations per tensor — ≈ 4.127 bits per parameter.
pub fn quantized_weight_bytes(groups: &[LocalGroup], sh: &Sharding) -> Option<Row> {
    let q = elements(groups, |g| g.role == Role::Quantized);
    if q == 0 {
        return None;
    }
    let n = tensor_count(groups, |g| g.role == Role::Quantized);
    let shards = sh.shards(3);
    let psi = || Expr::var(PSI_Q, q).shard(shards.dense.clone());
    let e = Expr::sum([
        psi().ceil_div(Expr::konst("NF4_ELEMENTS_PER_BYTE", NF4_ELEMENTS_PER_BYTE)),
        psi().ceil_div(Expr::konst("NF4_BLOCK", NF4_BLOCK)),
        Expr::prod([Expr::konst("FP32_BYTES", FP32_BYTES), psi().ceil_div(Expr::konst("NF4_SECOND_LEVEL_BLOCK", NF4_SECOND_LEVEL_BLOCK))]),
        Expr::prod([
            Expr::var(N_Q, n),
            Expr::konst("NF4_STATE_ALLOCATIONS", NF4_STATE_ALLOCATIONS),
            Expr::konst("ALLOCATOR_MIN_BLOCK", optimizer::ALLOCATOR_MIN_BLOCK),
        ]),
    ]);
    Some(
        Row::new(RowId::QuantizedWeights, "NF4-quantized base weights", Category::Parameters, e, "Dettmers et al. 2023 (QLoRA), §3: NF4 + double quantization; bitsandbytes/functional.py")
            .note("4-bit NF4 codes, blocks of 64 with 8-bit constants, fp32 scales per 256 blocks; lm_head, embeddings and norms stay unquantized"),
    )
}

/// Transformer Engine's fp8 weight copies for the GEMMs: Ψ_lin × 2 B (row- and column-wise).
pub fn fp8_weight_cache_bytes(recipe: &Recipe, groups: &[LocalGroup]) -> Option<Row> {
    if !recipe.fp8_weight_cache {
        return None;
    }
    let lin = elements(groups, |g| g.group.linear.is_some() && !g.adapter);
    let e = Expr::prod([Expr::var(PSI_LIN, lin), Expr::konst("FP8_WEIGHT_CACHE_BYTES", FP8_WEIGHT_CACHE_BYTES)]);
    Some(Row::new(
        RowId::Fp8WeightCache,
        "fp8 weight copies",
        Category::Parameters,
        e,
        "transformer_engine/pytorch/module/linear.py: Float8Tensor weight cache (row-wise + column-wise on Hopper)",
    ))
}

/// Gradients: ⌈Ψ_T / N⌉ × b_g, sharded from ZeRO-2 on. Dtype: the recipe's gradient type
/// (fp32 for Megatron's main grads). Present from backward until the optimizer step (or the
/// whole step when accumulating gradients).
pub fn gradient_bytes(recipe: &Recipe, groups: &[LocalGroup], sh: &Sharding) -> Row {
    let e = Expr::prod([sharded(groups, Role::Trainable, PSI_T, &sh.shards(2)), Expr::var(B_G, recipe.grad.bytes())]);
    Row::new(
        RowId::Gradients,
        "Gradients",
        Category::Gradients,
        e,
        "Rajbhandari et al. 2020 (ZeRO), §3: 2Ψ gradients; ZeRO-2 shards them (P_os+g)",
    )
    .note(format!("{} gradients of the trainable parameters", recipe.grad.name()))
}

/// Gradient-reduction buffers.
/// - DDP without `gradient_as_bucket_view`: the buckets are a second copy of every gradient
///   (torch/nn/parallel/distributed.py docs: "the saved memory size will be equal to the total
///   gradients size").
/// - DeepSpeed ZeRO 1–3: one reduce bucket of `reduce_bucket_size` = 5e8 elements at most.
///
/// FSDP reduces per unit (its unsharded gradient is counted with the gathered layers).
pub fn reduction_buffer_bytes(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup]) -> Option<Row> {
    let t = elements(groups, |g| g.role == Role::Trainable);
    let b_g = Expr::var(B_G, recipe.grad.bytes());
    match cfg.zero {
        Zero::Ddp if cfg.dp() > 1 && !cfg.bucket_view => Some(
            Row::new(
                RowId::DdpBuckets,
                "DDP gradient buckets",
                Category::Gradients,
                Expr::prod([Expr::var(PSI_T, t), b_g]),
                "torch/nn/parallel/distributed.py: gradient_as_bucket_view=False keeps bucket copies of all gradients",
            )
            .note("set bucket_view=true (gradient_as_bucket_view) to drop this copy"),
        ),
        Zero::Z1 | Zero::Z2 | Zero::Z3 if cfg.dp() > 1 => Some(Row::new(
            RowId::ZeroReduceBucket,
            "ZeRO reduce bucket",
            Category::Gradients,
            Expr::prod([Expr::min([Expr::var(PSI_T, t), Expr::konst("ZERO_REDUCE_BUCKET_ELEMENTS", ZERO_REDUCE_BUCKET_ELEMENTS)]), b_g]),
            "deepspeed/runtime/zero/config.py: reduce_bucket_size = 5e8 elements",
        )),
        _ => None,
    }
}

/// fp32 master weights: ⌈Ψ_T / N⌉ × 4 B, sharded from ZeRO-1 on (ZeRO §3: part of K).
pub fn master_weight_bytes(recipe: &Recipe, groups: &[LocalGroup], sh: &Sharding) -> Option<Row> {
    let m = recipe.master?;
    let e = Expr::prod([sharded(groups, Role::Trainable, PSI_T, &sh.shards(1)), Expr::var(B_M, m.bytes())]);
    Some(
        Row::new(
            RowId::MasterWeights,
            "Master weights (fp32)",
            Category::OptimizerStates,
            e,
            "Micikevicius et al. 2018 (Mixed Precision Training), §3.1; ZeRO §3: K = 12 includes the fp32 copy",
        )
        .note("the optimizer updates this fp32 copy and casts it back to the compute weights"),
    )
}

/// Everything of the static ledger for one GPU, in display order, and the host-memory rows of
/// what offload moves off the GPU.
pub fn static_rows(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup]) -> (Vec<Row>, Vec<Row>) {
    let sh = Sharding::of(cfg);
    let mut gpu = Vec::with_capacity(12);
    let mut host = Vec::new();
    let offload_params = cfg.offload == Offload::OptimizerParams && sh.stage == 3;
    let offload_opt = cfg.offload != Offload::None;

    let weights = with_fp32_kept(trainable_weight_bytes(recipe, groups, &sh), cfg, groups, &sh.shards(3), recipe.weight.bytes(), B_W);
    if offload_params {
        host.push(weights);
    } else {
        gpu.push(weights);
    }
    gpu.extend(frozen_weight_bytes(recipe, groups, &sh));
    gpu.extend(quantized_weight_bytes(groups, &sh));
    gpu.extend(fp8_weight_cache_bytes(recipe, groups));
    gpu.push(with_fp32_kept(gradient_bytes(recipe, groups, &sh), cfg, groups, &sh.shards(2), recipe.grad.bytes(), B_G));
    gpu.extend(reduction_buffer_bytes(cfg, recipe, groups));

    let opt_shards = sh.shards(1);
    let mut opt_rows: Vec<Row> = Vec::new();
    opt_rows.extend(master_weight_bytes(recipe, groups, &sh));
    if cfg.optim != Optimizer::Sgd {
        opt_rows.push(fp32_kept_states(cfg, recipe, groups, &opt_shards));
    }
    if offload_opt {
        // ZeRO-Offload keeps the fp32 gradient partition beside the optimizer on the host
        // (deepspeed/runtime/zero/stage_1_and_2.py, single_partition_of_fp32_groups[i].grad).
        let e = Expr::prod([sharded(groups, Role::Trainable, PSI_T, &sh.shards(1)), Expr::konst("FP32_BYTES", FP32_BYTES)]);
        host.push(Row::new(
            RowId::OffloadFp32Gradients,
            "fp32 gradient partition (offloaded)",
            Category::Gradients,
            e,
            "Ren et al. 2021 (ZeRO-Offload), §4.1",
        ));
        host.append(&mut opt_rows);
    } else {
        gpu.append(&mut opt_rows);
    }

    let n_t = tensor_count(groups, |g| g.role == Role::Trainable);
    if let Some((e, on_gpu)) = optimizer::step_counter_bytes(cfg.optim, if offload_opt { OptimImpl::Forloop } else { cfg.optim_impl }, n_t)
    {
        let row = Row::new(
            RowId::OptimizerStepCounters,
            "Optimizer step counters",
            Category::OptimizerStates,
            e,
            "torch/optim/adamw.py _init_group: state['step'] is an fp32 tensor per parameter, on the CPU unless fused/capturable",
        )
        .note(if on_gpu { "fused: on the GPU, one 512-byte allocation each" } else { "foreach/for-loop: kept on the CPU" });
        if on_gpu && !offload_opt {
            gpu.push(row);
        } else {
            host.push(row);
        }
    }
    (gpu, host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::config::{Precision, Zero};
    use crate::estimator::model::{Part, Split, TensorGroup};
    use crate::estimator::precision::recipe;

    /// A flat model of `psi` parameters — the seeds' "7B" is 7 × 10⁹ exactly.
    fn flat(psi: u64) -> Vec<LocalGroup> {
        vec![LocalGroup {
            group: TensorGroup {
                name: "w",
                shape: vec![psi],
                count: 1,
                tensors_per_instance: 1,
                part: Part::Attention,
                split: Split::Replicated,
                linear: None,
                per_layer: 1,
            },
            role: Role::Trainable,
            expert: false,
            adapter: false,
        }]
    }

    fn model_states(psi: u64, gpus: u64, zero: Zero, precision: Precision) -> u128 {
        let cfg = Config { gpus, zero, precision, ..Config::default() };
        let (rows, _) = static_rows(&cfg, &recipe(precision), &flat(psi));
        rows.iter()
            .filter(|r| matches!(r.id, RowId::Weights | RowId::Gradients | RowId::MasterWeights | RowId::OptimizerStates))
            .map(|r| r.bytes)
            .sum()
    }

    const B7: u64 = 7_000_000_000;

    #[test]
    fn seven_billion_parameters_with_mixed_bf16_adamw_need_112_gb() {
        assert_eq!(model_states(B7, 1, Zero::Ddp, Precision::MixedBf16), 112_000_000_000);
        assert_eq!(model_states(13_000_000_000, 1, Zero::Ddp, Precision::MixedBf16), 208_000_000_000);
        assert_eq!(model_states(70_000_000_000, 1, Zero::Ddp, Precision::MixedBf16), 1_120_000_000_000);
    }

    #[test]
    fn zero_3_over_8_gpus_leaves_14_gb_per_gpu_for_7b() {
        assert_eq!(model_states(B7, 8, Zero::Z3, Precision::MixedBf16), 14_000_000_000);
    }

    #[test]
    fn zero_stages_reproduce_the_papers_per_gpu_formulas() {
        // Ψ = 7.5e9, N = 64, K = 12 — the ZeRO paper's Figure 1 example:
        // DDP 120 GB, P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.9 GB.
        let psi: u64 = 7_500_000_000;
        let n: u128 = 64;
        let p = psi as u128;
        assert_eq!(model_states(psi, 64, Zero::Ddp, Precision::MixedBf16), 16 * p);
        assert_eq!(model_states(psi, 64, Zero::Z1, Precision::MixedBf16), 4 * p + 12 * p.div_ceil(n));
        assert_eq!(model_states(psi, 64, Zero::Z2, Precision::MixedBf16), 2 * p + 14 * p.div_ceil(n));
        assert_eq!(model_states(psi, 64, Zero::Z3, Precision::MixedBf16), 16 * p.div_ceil(n));
        assert_eq!(model_states(psi, 64, Zero::Z1, Precision::MixedBf16) / 100_000_000, 314);
    }

    #[test]
    fn megatron_costs_18_bytes_and_6_plus_12_over_d_with_a_distributed_optimizer() {
        let psi: u64 = 1_000_000;
        assert_eq!(model_states(psi, 1, Zero::Ddp, Precision::MixedBf16Fp32grad), 18_000_000);
        assert_eq!(model_states(psi, 8, Zero::Z1, Precision::MixedBf16Fp32grad), 6_000_000 + 12_000_000 / 8);
    }

    #[test]
    fn ddp_buckets_copy_every_gradient_unless_bucket_view_is_on() {
        let cfg = Config { gpus: 2, ..Config::default() };
        let (rows, _) = static_rows(&cfg, &recipe(cfg.precision), &flat(1000));
        assert_eq!(rows.iter().find(|r| r.id == RowId::DdpBuckets).map(|r| r.bytes), Some(2000));
        let cfg = Config { bucket_view: true, ..cfg };
        let (rows, _) = static_rows(&cfg, &recipe(cfg.precision), &flat(1000));
        assert!(rows.iter().all(|r| r.id != RowId::DdpBuckets));
    }

    #[test]
    fn offloading_the_optimizer_moves_master_states_and_fp32_gradients_to_the_host() {
        let cfg = Config { offload: Offload::Optimizer, ..Config::default() };
        let (gpu, host) = static_rows(&cfg, &recipe(cfg.precision), &flat(1000));
        assert!(gpu.iter().all(|r| r.id != RowId::MasterWeights && r.id != RowId::OptimizerStates));
        let host_bytes: u128 = host.iter().map(|r| r.bytes).sum();
        // master 4 + states 8 + fp32 grads 4 per parameter, + one 4-byte step counter.
        assert_eq!(host_bytes, 16_000 + 4);
    }

    #[test]
    fn qlora_costs_about_4_127_bits_per_parameter() {
        let mut g = flat(64 * 256 * 1000);
        g[0].role = Role::Quantized;
        let cfg = Config::default();
        let row = quantized_weight_bytes(&g, &Sharding::of(&cfg));
        let bits = row.map(|r| (r.bytes - 1024) as f64 * 8.0 / (64.0 * 256.0 * 1000.0));
        assert!(bits.is_some_and(|b| (b - 4.127).abs() < 0.001), "{bits:?}");
    }

    #[test]
    fn a_router_kept_in_fp32_costs_four_bytes_a_weight_in_pure_bf16() {
        // 1,000 bf16 weights and a 64-element router kept in fp32 (router_fp32): weights
        // 1,000 × 2 + 64 × 4 = 2,256; gradients the same; AdamW's two states in each tensor's
        // dtype 2 × 2,256 = 4,512. fp32 and AMP (fp32 weights) are unchanged.
        let mut groups = flat(1_000);
        let mut router = flat(64).remove(0);
        router.group.name = ROUTER_WEIGHT;
        groups.push(router);
        let mut cfg = Config { precision: Precision::Bf16, ..Config::default() };
        cfg.arch.router_fp32 = true;
        let (rows, _) = static_rows(&cfg, &recipe(Precision::Bf16), &groups);
        let row = |id: &str| rows.iter().filter(|r| r.id.as_str() == id).map(|r| r.bytes).sum::<u128>();
        assert_eq!((row("weights"), row("gradients"), row("optimizer_states")), (2_256, 2_256, 4_512));
        let cfg = Config { precision: Precision::AmpBf16, ..cfg };
        let (rows, _) = static_rows(&cfg, &recipe(Precision::AmpBf16), &groups);
        let row = |id: &str| rows.iter().filter(|r| r.id.as_str() == id).map(|r| r.bytes).sum::<u128>();
        assert_eq!((row("weights"), row("gradients")), (4_256, 4_256));
    }
}
