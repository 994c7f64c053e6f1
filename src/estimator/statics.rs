//! Static memory per GPU: weights, gradients, master weights and optimizer states — what lives
//! on the GPU for the whole run, whatever the batch — under ZeRO/FSDP sharding and offload.
//!
//! Reproduces the ZeRO paper's per-GPU model-state formulas (Rajbhandari et al. 2020, §5.1,
//! Figure 1) with Ψ parameters, N data-parallel GPUs and K optimizer bytes per parameter:
//! DDP (2 + 2 + K)Ψ; ZeRO-1 4Ψ + KΨ/N; ZeRO-2 2Ψ + (2 + K)Ψ/N; ZeRO-3 (4 + K)Ψ/N; and
//! Megatron's 18 and 6 + 12/d bytes per parameter (Korthikanti et al. 2022, §5).

use super::config::{Config, Fp8, Offload, OptimImpl, Optimizer, QloraQuant, Zero};
use super::expr::{Expr, Sym};
use super::ledger::{Category, Row, RowId};
use super::model::{INDEXER_PREFIX, KDA_DT_BIAS};
use super::optimizer;
use super::params::{elements, tensor_count, LocalGroup, Role};
use super::precision::{Recipe, FP32_BYTES};
use super::sharding::{sharded_elements, Sharding, Shards, PSI_T};

pub const PSI_F: Sym = Sym::new("Ψ", "F", "frozen parameters on this GPU");
pub const PSI_Q: Sym = Sym::new("Ψ", "Q", "NF4-quantized parameters on this GPU");
pub const N_Q: Sym = Sym::new("n", "Q", "quantized tensors");
pub const PSI_LIN: Sym = Sym::new("Ψ", "lin", "parameters of linear layers (fp8 GEMM weights)");
pub const PSI_T_REST_LIN: Sym = Sym::new("Ψ", "T∖lin", "trainable parameters outside the FP8 GEMMs (embeddings, norms, LM head, router)");
pub const N_GEMM: Sym = Sym::new("n", "gemm", "FP8 GEMMs (Transformer Engine modules' GEMMs)");
pub const B_FP8: Sym = Sym::new("b", "fp8", "bytes per FP8 weight element (data, + transpose on Hopper/Ada, MXFP8 both layouts)");
/// Transformer Engine's `amax_history_len` default (`common/recipe/__init__.py DelayedScaling`).
pub const AMAX_HISTORY_LEN: u64 = 1024;
/// A `QuantState`'s own tensors beside the absmax: the fp32 offset (4 B), the NF4 code table
/// (16 fp32, 64 B) and the nested state's dynamic map (256 fp32, 1,024 B) — one copy per weight.
pub const NF4_STATE_CONSTANTS: u64 = 4 + 64 + 1024;
/// Without double quantization a `QuantState` holds the fp32 absmax (counted apart) and the
/// NF4 code table (16 fp32) only (bitsandbytes `functional.py` `quantize_4bit`,
/// `compress_statistics=False`).
pub const NF4_PLAIN_STATE_CONSTANTS: u64 = 64;
/// bitsandbytes' process-wide tables (measured: `library_constant` of the qlora records).
pub const BNB_CONSTANTS: u64 = 1420;
/// gptqmodel's usual quantization group (inputs per scale).
pub const GPTQ_GROUP: u64 = 128;
pub const B_W: Sym = Sym::new("b", "w", "bytes per weight");
pub const B_G: Sym = Sym::new("b", "g", "bytes per gradient");
pub const B_M: Sym = Sym::new("b", "m", "bytes per master weight (fp32)");

/// NF4 packs two 4-bit weights per byte (Dettmers et al. 2023, §3).
pub const NF4_ELEMENTS_PER_BYTE: u64 = 2;
/// One quantization constant per 64 weights, itself quantized to 8 bits (double quantization).
pub const NF4_BLOCK: u64 = 64;
/// The 8-bit constants are grouped in blocks of 256, each with an fp32 scale: 64 × 256.
pub const NF4_SECOND_LEVEL_BLOCK: u64 = 64 * 256;
/// torchao's `NF4Tensor` code table: 16 values in the weight's dtype (`from_tensor`'s `nf4`).
pub const TORCHAO_NF4_TABLE: u64 = 16;
/// torchtune's `to_nf4` defaults: scalers per 64 weights, quantization factors per 256 scalers.
pub const TORCHAO_NF4_BLOCK: u64 = 64;
pub const TORCHAO_NF4_SCALER_BLOCK: u64 = 256;

/// DeepSpeed's default `reduce_bucket_size` (5e8 elements; deepspeed/runtime/zero/config.py).
pub const ZERO_REDUCE_BUCKET_ELEMENTS: u64 = 500_000_000;

fn sharded(groups: &[LocalGroup], role: Role, sym: Sym, shards: &Shards) -> Expr {
    sharded_elements(groups, |g| g.role == role, sym, shards)
}

/// Ψ_R: trainable parameters that the model creates and keeps in fp32 whatever the recipe.
pub const PSI_R: Sym = Sym::new("Ψ", "R", "parameters kept in fp32: routers (DeepSeek-V2/V3, GLM-4.5), Kimi Linear's dt_bias");
/// Ψ_T∖R: the other trainable parameters (those in the recipe's dtypes).
pub const PSI_T_REST: Sym = Sym::new("Ψ", "T∖R", "trainable parameters other than the fp32 router weights");
/// The router weight's tensor-table name.
const ROUTER_WEIGHT: &str = "layers.*.mlp.router.weight";

/// Whether a group is a parameter that the model keeps in fp32: a router weight (`router_fp32`:
/// the `torch.float32` weight of `DeepseekV3TopkRouter`, `DeepseekV2Moe.gate`,
/// `Glm4MoeTopkRouter`) or Kimi Linear's forget-gate `dt_bias`, both listed in
/// `_keep_in_fp32_modules_strict`, so `model.to(torch.bfloat16)` leaves them fp32. Not on
/// torchtitan's own code, whose router gate is an `nn.Linear` in the model's dtype
/// (`models/moe/moe.py` `TokenChoiceTopKRouter`).
fn fp32_kept(cfg: &Config, g: &LocalGroup) -> bool {
    let name = g.group.name;
    let router = cfg.arch.router_fp32 && cfg.framework != super::config::Framework::Torchtitan;
    g.role == Role::Trainable && ((router && name == ROUTER_WEIGHT) || name == KDA_DT_BIAS)
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
    let layout = optimizer::StateLayout::of(cfg);
    if cfg.optim_paged && cfg.optim == Optimizer::Adamw {
        // bitsandbytes' 32-bit optimizer keeps fp32 states whatever the parameters' dtype.
        let fp32 = Recipe { state: super::precision::Dtype::Fp32, ..*recipe };
        let row = optimizer::optimizer_state_bytes(cfg.optim, &fp32, groups, shards, layout);
        return if layout.paged {
            row
        } else {
            // `kernels = cpu` (bitsandbytes' CPU fallback allocates with `zeros_like`) or
            // states offloaded to the host: nothing is paged, the states stay fp32.
            row.note("bitsandbytes' 32-bit states (fp32); none paged here (no unified memory on a CPU, or the states already on the host)")
        };
    }
    let all = optimizer::optimizer_state_bytes(cfg.optim, recipe, groups, shards, layout);
    let plain = recipe.master.is_none() && recipe.state == recipe.weight && recipe.state.bytes() < FP32_BYTES;
    if !plain || elements(groups, |g| fp32_kept(cfg, g)) == 0 {
        return all;
    }
    let (kept, rest): (Vec<LocalGroup>, Vec<LocalGroup>) = groups.iter().cloned().partition(|g| fp32_kept(cfg, g));
    let fp32 = Recipe { state: super::precision::Dtype::Fp32, ..*recipe };
    let a = optimizer::optimizer_state_bytes(cfg.optim, recipe, &rest, shards, layout);
    let k = optimizer::optimizer_state_bytes(cfg.optim, &fp32, &kept, shards, layout);
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
    // Without adapters or a quantized base the only frozen tensors are DeepSeek-V3.2's indexer.
    let fine_tuned = groups.iter().any(|g| g.adapter || g.role == Role::Quantized);
    let (label, source) = if fine_tuned || groups.iter().any(|g| g.role == Role::Frozen && !g.group.name.starts_with(INDEXER_PREFIX)) {
        ("Frozen base weights", "Hu et al. 2021 (LoRA), §4: the pre-trained weights are frozen")
    } else {
        (
            "Weights without gradients",
            "transformers 5.24 modeling_deepseek_v32.py: DeepseekV32Indexer.forward runs under torch.no_grad(), so the indexer's parameters get no gradient",
        )
    };
    Some(
        Row::new(RowId::FrozenWeights, label, Category::Parameters, e, source)
            .note(format!("{} weights; no gradients or optimizer states", recipe.weight.name())),
    )
}

/// The 4-bit base of QLoRA (`qlora_quant`), per tensor of `n` elements:
///
/// - NF4 (bitsandbytes 0.50.2 `quantize_4bit`, blocksize 64, double quantization;
///   validation/FINDINGS.md §11.1, rules Q1–Q2 on 36 records): ⌈n/2⌉ packed codes, ⌈n/64⌉
///   8-bit absmax, 4·⌈n/16,384⌉ fp32 second-level absmax, a 4-byte offset, and each
///   `QuantState`'s own code tables (16 fp32 NF4 values, 256 fp32 of the dynamic map), plus
///   1,420 B of bitsandbytes' process-wide constants. Under ZeRO-3/FSDP the packed bytes are
///   stored as bf16 (`bnb_4bit_quant_storage`) and sharded with the other parameters; the
///   quant state stays whole on every rank (§11.2).
/// - GPTQ/AWQ int4 (gptqmodel `BaseQuantLinear`, group 128; §11.3), per `[N, K]` weight:
///   `qweight` K·N/2, `qzeros` ⌈K/128⌉·N/2, fp16 `scales` 2·⌈K/128⌉·N, int32 `g_idx` 4·K.
pub fn quantized_weight_bytes(cfg: &Config, groups: &[LocalGroup], sh: &Sharding) -> Option<Row> {
    quantized_rows(cfg, groups, sh, None)
}

/// [`quantized_weight_bytes`], or with `packed` only the NF4 codes (`Some(true)`: the
/// `Params4bit` parameters, which FSDP's parameter offload moves to the host) or only the rest
/// (`Some(false)`: the quant states, which stay on the GPU).
fn quantized_rows(cfg: &Config, groups: &[LocalGroup], sh: &Sharding, packed_only: Option<bool>) -> Option<Row> {
    let q = elements(groups, |g| g.role == Role::Quantized);
    if q == 0 {
        return None;
    }
    let shards = sh.shards(3);
    let quantized = groups.iter().filter(|g| g.role == Role::Quantized);
    let num = |v: u64| Expr::num(v);
    let (e, source, note) = match cfg.qlora_quant {
        QloraQuant::Nf4 => {
            let packed = Expr::sum(quantized.clone().map(|g| {
                Expr::prod([
                    Expr::var(N_Q, g.group.tensor_count()),
                    num(g.group.numel()).ceil_div(Expr::konst("NF4_ELEMENTS_PER_BYTE", NF4_ELEMENTS_PER_BYTE)),
                ])
            }))
            .shard(shards.dense.clone());
            let state = Expr::sum(quantized.map(|g| {
                let n = || num(g.group.numel());
                let per_weight = if cfg.qlora_double_quant {
                    Expr::sum([
                        n().ceil_div(Expr::konst("NF4_BLOCK", NF4_BLOCK)),
                        Expr::prod([
                            Expr::konst("FP32_BYTES", FP32_BYTES),
                            n().ceil_div(Expr::konst("NF4_SECOND_LEVEL_BLOCK", NF4_SECOND_LEVEL_BLOCK)),
                        ]),
                        Expr::konst("NF4_STATE_CONSTANTS", NF4_STATE_CONSTANTS),
                    ])
                } else {
                    Expr::sum([
                        Expr::prod([Expr::konst("FP32_BYTES", FP32_BYTES), n().ceil_div(Expr::konst("NF4_BLOCK", NF4_BLOCK))]),
                        Expr::konst("NF4_PLAIN_STATE_CONSTANTS", NF4_PLAIN_STATE_CONSTANTS),
                    ])
                };
                Expr::prod([Expr::var(N_Q, g.group.tensor_count()), per_weight])
            }));
            let parts = match packed_only {
                None => vec![packed, state, Expr::konst("BNB_CONSTANTS", BNB_CONSTANTS)],
                Some(true) => vec![packed],
                Some(false) => vec![state, Expr::konst("BNB_CONSTANTS", BNB_CONSTANTS)],
            };
            (
                Expr::sum(parts),
                "Dettmers et al. 2023 (QLoRA), §3; bitsandbytes 0.50.2 functional.py quantize_4bit, QuantState (validation/FINDINGS.md §11.1–11.2)",
                if cfg.qlora_double_quant {
                    "4-bit NF4 codes (sharded under ZeRO-3/FSDP as bf16 storage), 8-bit absmax per 64, fp32 per 16,384, and each weight's quant state (offset 4 B, code tables 1,088 B; not sharded); embeddings, norms and the LM head stay unquantized"
                } else {
                    "4-bit NF4 codes (sharded under ZeRO-3/FSDP as bf16 storage), fp32 absmax per 64 (no double quantization) and each weight's 64-byte code table (not sharded); embeddings, norms and the LM head stay unquantized"
                },
            )
        }
        QloraQuant::TorchaoNf4 => (
            torchao_nf4_bytes(cfg, quantized, &shards.dense),
            "torchao 0.18 quantization/quantize_/workflows/nf4/nf4_tensor.py NF4Tensor.from_tensor, fsdp_pre_all_gather (torchtune 0.6.1 modules/peft/lora.py LoRALinear(quantize_base=True)); measured: tests/fixtures/pytorch/torchao_nf4",
            "4-bit codes, int8 scalers per 64, a factor per 256 scalers in the weight's dtype (sharded with the codes under FSDP2), its mean and the 16-value code table (whole on every rank); embeddings, norms and the output projection stay unquantized",
        ),
        QloraQuant::Gptq => {
            let per = Expr::sum(quantized.map(|g| {
                let (out, inp) = match g.group.shape.as_slice() {
                    [.., o, i] => (*o, *i),
                    _ => (g.group.numel(), 1),
                };
                let groups_k = || num(inp).ceil_div(Expr::konst("GPTQ_GROUP", GPTQ_GROUP));
                Expr::prod([
                    Expr::var(N_Q, g.group.tensor_count()),
                    Expr::sum([
                        Expr::prod([num(inp), num(out)]).ceil_div(Expr::num(2u8)),
                        Expr::prod([groups_k(), num(out)]).ceil_div(Expr::num(2u8)),
                        Expr::prod([Expr::konst("FP16_BYTES", 2u8), groups_k(), num(out)]),
                        Expr::prod([Expr::konst("INT32_BYTES", 4u8), num(inp)]),
                    ]),
                ])
            }));
            (
                per.shard(shards.dense.clone()),
                "gptqmodel qlinear/__init__.py BaseQuantLinear (ModelCloud/GPTQModel @ 011c00a6; validation/FINDINGS.md §11.3)",
                "int4 qweight, qzeros, fp16 scales per group of 128 inputs, int32 g_idx (act-order): ≈ 0.52 B per weight; buffers, not parameters",
            )
        }
    };
    let label = match (cfg.qlora_quant, packed_only) {
        (QloraQuant::Nf4, None) => "NF4-quantized base weights",
        (QloraQuant::Nf4, Some(true)) => "NF4 codes of the base (offloaded)",
        (QloraQuant::Nf4, Some(false)) => "NF4 quant states of the base",
        (QloraQuant::Gptq, _) => "int4 GPTQ/AWQ base weights",
        (QloraQuant::TorchaoNf4, _) => "NF4Tensor base weights (torchao)",
    };
    Some(Row::new(RowId::QuantizedWeights, label, Category::Parameters, e, source).note(note))
}

/// torchao's `NF4Tensor` of each quantized weight of `n` elements in dtype `e` bytes (torchao 0.18
/// `quantization/quantize_/workflows/nf4/nf4_tensor.py`, `NF4Tensor.from_tensor` with torchtune's
/// `to_nf4` defaults, block 64 and scaler block 256, which it asserts divide `n`):
/// `quantized_data` n/2 B (uint8, two codes a byte), `quantized_scalers` n/64 B (int8),
/// `quantization_factor` n/16,384 elements in e — `double_quantize_scalers` slices it from an
/// expanded `[n/16,384, 256]` tensor and `.contiguous()` copies it only when there is more than one
/// scaler block, so a weight of exactly 16,384 elements keeps all 256 (512 B in bf16) —,
/// `scaler_mean` one e and the `nf4` table 16·e. FSDP2 shards the first three
/// (`_INNER_TENSOR_NAMES_FOR_SHARDING`, `fsdp_pre_all_gather`) and keeps the mean and the table
/// whole on every rank. Measured exact: 8,994 B a bf16 weight of 16,384, 16,934 of 32,768.
fn torchao_nf4_bytes<'g>(cfg: &Config, quantized: impl Iterator<Item = &'g LocalGroup> + Clone, shard: &Expr) -> Expr {
    let e = super::precision::recipe(cfg.precision).weight.bytes();
    let num = |v: u64| Expr::num(v);
    let dense = Expr::sum(quantized.clone().map(|g| {
        let n = g.group.numel();
        let factors = torchao_nf4_factors(n);
        Expr::prod([
            Expr::var(N_Q, g.group.tensor_count()),
            Expr::sum([
                num(n).ceil_div(Expr::konst("NF4_ELEMENTS_PER_BYTE", NF4_ELEMENTS_PER_BYTE)),
                num(n).ceil_div(Expr::konst("TORCHAO_NF4_BLOCK", TORCHAO_NF4_BLOCK)),
                Expr::prod([num(factors), num(e)]),
            ]),
        ])
    }))
    .shard(shard.clone());
    let whole = Expr::sum(quantized.map(|g| {
        Expr::prod([
            Expr::var(N_Q, g.group.tensor_count()),
            Expr::prod([Expr::sum([Expr::num(1u8), Expr::konst("TORCHAO_NF4_TABLE", TORCHAO_NF4_TABLE)]), num(e)]),
        ])
    }));
    Expr::sum([dense, whole])
}

/// Elements of an `NF4Tensor`'s `quantization_factor` for a weight of `n` elements: one a scaler
/// block of 64 × 256 elements, but all 256 of the expanded tensor when there is one block
/// (`double_quantize_scalers` copies the slice `.contiguous()` only for more than one; see
/// [`torchao_nf4_bytes`]).
fn torchao_nf4_factors(n: u64) -> u64 {
    let scaler_blocks = n.div_ceil(TORCHAO_NF4_BLOCK * TORCHAO_NF4_SCALER_BLOCK);
    if scaler_blocks == 1 {
        TORCHAO_NF4_SCALER_BLOCK
    } else {
        scaler_blocks
    }
}

/// Bytes FSDP2 all-gathers for one torchao `NF4Tensor` weight of `n` elements whose dtype has
/// `e` bytes: the inner tensors it shards (`_INNER_TENSOR_NAMES_FOR_SHARDING`, returned by
/// `fsdp_pre_all_gather`: torchao 0.18 `quantization/quantize_/workflows/nf4/nf4_tensor.py`) —
/// `quantized_data` n/2 B, `quantized_scalers` n/64 B, `quantization_factor` in e — gathered
/// into FSDP2's flat buffer and copied out into one tensor each (`fsdp_post_all_gather` wraps
/// them in a new `NF4Tensor` without copying). The mean and the 16-value table are not gathered:
/// every rank holds them whole. Toy value: a bf16 256 × 256 weight (65,536 elements) gathers
/// 32,768 + 1,024 + 4 · 2 = 33,800 B. Measured on two CPU ranks
/// (tests/fixtures/pytorch/fsdp/tune.json, the QLoRA records): 370,760 B a layer of the test
/// model, flat output and copy-outs alike.
pub fn torchao_nf4_gathered_bytes(n: u64, e: u64) -> u128 {
    (n.div_ceil(NF4_ELEMENTS_PER_BYTE) + n.div_ceil(TORCHAO_NF4_BLOCK) + torchao_nf4_factors(n) * e) as u128
}

/// Whether a linear weight group runs its GEMM in FP8: both of its matrix dims multiples of 16
/// (torchao's `_auto_filter_for_recipe`, TE's alignment), not an adapter, not quantized.
fn fp8_linear(g: &LocalGroup) -> bool {
    !g.adapter && g.group.linear.is_some() && g.role != Role::Quantized && g.group.shape.iter().rev().take(2).all(|d| d % 16 == 0)
}

/// FP8 GEMMs of one GPU's stage: each FP8 linear weight tensor of the decoder layers, counted
/// as Megatron fuses them (q, k, v in one GEMM, gate and up in one) under `framework =
/// megatron`, where routed experts are FP8 too (TE's `GroupedLinear`: one GEMM per local
/// expert); under HF code only `nn.Linear`s (not 3-D expert tensors).
pub fn fp8_gemms(cfg: &Config, groups: &[LocalGroup]) -> u64 {
    use super::model::Linear as L;
    let megatron = cfg.framework == super::config::Framework::Megatron;
    groups
        .iter()
        .filter(|g| fp8_linear(g) && (megatron || !g.expert))
        .filter(|g| !megatron || !matches!(g.group.linear, Some(L::K | L::V | L::Up)))
        .map(|g| g.group.tensor_count())
        .sum()
}

/// Elements of the FP8 GEMMs' weights on this GPU.
pub fn fp8_weight_elements(cfg: &Config, groups: &[LocalGroup]) -> u64 {
    let megatron = cfg.framework == super::config::Framework::Megatron;
    elements(groups, |g| fp8_linear(g) && (megatron || !g.expert))
}

/// Bytes per element of a Transformer Engine FP8 weight with row- and column-wise usage:
/// data + its transpose where non-TN GEMMs are unsupported (Hopper, Ada: 2), the data alone
/// on B200/B300 (1); MXFP8 both layouts (2) — its E8M0 scales (1 per 32 in each layout) are
/// the separate [`MXFP8_SCALE_DIVISOR`] term.
fn te_weight_bytes_per_element(cfg: &Config, fp8: Fp8) -> u64 {
    if fp8 == Fp8::TeMxfp8 || crate::estimator::step::lowbit::te_transposes(cfg) {
        2
    } else {
        1
    }
}

/// MXFP8 keeps one E8M0 scale byte per 32 elements in each of its two layouts: Ψ/16 bytes.
pub const MXFP8_SCALE_DIVISOR: u64 = 16;

/// The persistent memory of the FP8 recipe (`fp8`; validation/FINDINGS.md §10):
///
/// - Transformer Engine delayed scaling: per FP8 GEMM, `scale` fp32 `[3]` + `[2]` and
///   `amax_history` fp32 `[1024, 3]` + `[1024, 2]` (forward input/weight/output, backward
///   grad_output/grad_input; `quantization.py DelayedScalingRecipeState`): 20,500 B;
/// - Transformer Engine's FP8 weight copies kept across steps: Megatron passes
///   `is_first_microbatch`, so each module caches its FP8 weight (`_fp8_workspaces`) with its
///   transpose on Hopper (`fp8_weight_cache`). Without the cache (HF code) the copies live from
///   each layer's forward to its backward: the step counts them. With `fp8_model_init` the
///   parameters are those copies (the weights row).
///
/// torchao keeps nothing: its casts are transients of each GEMM (the step).
pub fn fp8_rows(cfg: &Config, groups: &[LocalGroup]) -> Vec<Row> {
    let fp8 = cfg.fp8_recipe();
    let mut rows = Vec::new();
    if fp8 == Fp8::TeDelayed {
        let n = fp8_gemms(cfg, groups);
        if n > 0 {
            let e = Expr::prod([
                Expr::var(N_GEMM, n),
                Expr::sum([Expr::prod([Expr::konst("AMAX_HISTORY_LEN", AMAX_HISTORY_LEN), Expr::num(5u8)]), Expr::num(5u8)]),
                Expr::konst("FP32_BYTES", FP32_BYTES),
            ]);
            rows.push(
                Row::new(
                    RowId::Fp8AmaxHistory,
                    "FP8 amax histories and scales",
                    Category::FrameworkOverhead,
                    e,
                    "transformer_engine 2.20.2 quantization.py DelayedScalingRecipeState; module/base.py set_meta_tensor (3 forward + 2 backward FP8 tensors per GEMM)",
                )
                .note("delayed scaling: amax_history_len = 1,024 per FP8 tensor, fp32, persistent (saved in the checkpoint's extra state)"),
            );
        }
    }
    if fp8.te() && cfg.framework == super::config::Framework::Megatron && !cfg.fp8_model_init {
        let lin = fp8_weight_elements(cfg, groups);
        let b = te_weight_bytes_per_element(cfg, fp8);
        let mut terms = vec![Expr::prod([Expr::var(PSI_LIN, lin), Expr::var(B_FP8, b)])];
        if fp8 == Fp8::TeMxfp8 {
            terms.push(Expr::var(PSI_LIN, lin).ceil_div(Expr::konst("MXFP8_SCALE_DIVISOR", MXFP8_SCALE_DIVISOR)));
        }
        rows.push(
            Row::new(
                RowId::Fp8WeightCache,
                "FP8 weight copies",
                Category::Parameters,
                Expr::sum(terms),
                "transformer_engine 2.20.2 module/base.py quantize_weight with is_first_microbatch (_fp8_workspaces); float8_tensor_storage.py update_usage",
            )
            .note(if fp8 == Fp8::TeMxfp8 {
                "MXFP8: row- and column-wise data with their 1×32 E8M0 scales, cached across micro-batches and steps"
            } else if b == 2 {
                "row-wise data + its transpose (this GPU runs no non-TN FP8 GEMM), cached across micro-batches and steps"
            } else {
                "row-wise data only (Blackwell reads it for every GEMM layout), cached across micro-batches and steps"
            }),
        );
    }
    rows
}

/// Trainable weights under Transformer Engine's `fp8_model_init`: the linear weights are FP8
/// tensors (data, transpose on Hopper, MXFP8 scales) and no 16-bit copy exists; the other
/// trainable parameters keep the recipe's dtype. The fp32 master copy stays in the optimizer.
fn fp8_model_init_weights(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup], sh: &Sharding) -> Row {
    let fp8 = cfg.fp8_recipe();
    let lin = elements(groups, |g| {
        g.role == Role::Trainable && fp8_linear(g) && (cfg.framework == super::config::Framework::Megatron || !g.expert)
    });
    let all = elements(groups, |g| g.role == Role::Trainable);
    let shards = sh.shards(3);
    let b = te_weight_bytes_per_element(cfg, fp8);
    let mut terms = vec![
        Expr::prod([Expr::var(PSI_LIN, lin).shard(shards.dense.clone()), Expr::var(B_FP8, b)]),
        Expr::prod([Expr::var(PSI_T_REST_LIN, all.saturating_sub(lin)).shard(shards.dense.clone()), Expr::var(B_W, recipe.weight.bytes())]),
    ];
    if fp8 == Fp8::TeMxfp8 {
        terms.push(Expr::var(PSI_LIN, lin).shard(shards.dense.clone()).ceil_div(Expr::konst("MXFP8_SCALE_DIVISOR", MXFP8_SCALE_DIVISOR)));
    }
    Row::new(
        RowId::Weights,
        "Trainable weights",
        Category::Parameters,
        Expr::sum(terms),
        "transformer_engine 2.20.2 quantization.py fp8_model_init / quantized_model_init; module/base.py reset_parameters",
    )
    .note("fp8_model_init: the linear weights are FP8 parameters (no 16-bit copy); the fp32 master weights stay in the optimizer")
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

/// The bytes of `numel` elements of group `g` unsharded, as FSDP all-gathers them: the
/// parameter dtype (`MixedPrecisionPolicy.param_dtype`, bf16 under mixed precision), NF4
/// tensors packed two to a byte (torchao's `NF4Tensor` with its scalers and factors:
/// [`torchao_nf4_gathered_bytes`]), and with FSDP2's float8 all-gather (`fp8_allgather`) the FP8
/// linears' weights at 1 byte an element (torchao `fsdp_utils.py
/// WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather`; measured on 2 CPU ranks: 92,416 →
/// 46,336 B a layer, validation/FINDINGS.md §10.2).
pub fn gathered_bytes(cfg: &Config, recipe: &Recipe, g: &LocalGroup, numel: u128) -> u128 {
    let fp8 = cfg.fp8_allgather && cfg.fp8_recipe() == Fp8::TorchaoTensorwise;
    match g.role {
        Role::Quantized if cfg.qlora_quant == QloraQuant::TorchaoNf4 => {
            let n = g.group.numel();
            numel / (n as u128).max(1) * torchao_nf4_gathered_bytes(n, recipe.weight.bytes())
        }
        Role::Quantized => numel.div_ceil(NF4_ELEMENTS_PER_BYTE as u128),
        Role::Trainable
            if fp8 && !g.adapter && !g.expert && g.group.linear.is_some() && g.group.shape.iter().rev().take(2).all(|d| d % 16 == 0) =>
        {
            numel
        }
        _ => numel * recipe.weight.bytes() as u128,
    }
}

const U_STAGE: Sym = Sym::new("U", "stage", "this stage's parameters, unsharded in the parameter dtype");
const PSI_STAGE: Sym = Sym::new("Ψ", "T,stage", "trainable parameters of this stage on this GPU, unsharded");
/// Bytes of FSDP2's `reduce_dtype` under torchtitan (fp32).
const B_RED: Sym = Sym::new("b", "red", "bytes per element of FSDP2's reduce dtype (fp32)");

/// A pipeline stage's parameters kept gathered through the step
/// ([`super::sharding::keeps_stage_gathered`]): `U_stage = Σ_groups gathered bytes` over every
/// parameter of the stage (embedding, decoder layers, final norm and head) as FSDP2
/// all-gathers it ([`gathered_bytes`]; tensor-parallel shards stay split). All-gathered unit by
/// unit in the first micro-batch's forward, resharded after the last one's backward; counted
/// through the step (in the optimizer step they are resharded: an over-count there, where the
/// backward's peak is higher). Measured (`tests/fixtures/pytorch/fsdp/pp.json`): 770,560 B on
/// each stage of the 4-layer test model (385,280 parameters in bf16), alive at both peaks.
pub fn kept_stage_parameter_bytes(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup]) -> Option<Row> {
    if !super::sharding::keeps_stage_gathered(cfg) {
        return None;
    }
    let bytes: u128 = groups.iter().map(|g| gathered_bytes(cfg, recipe, g, g.group.total() as u128)).sum();
    Some(
        Row::new(
            RowId::GatheredStage,
            "FSDP2 stage kept gathered (under PP)",
            Category::Parameters,
            Expr::var(U_STAGE, bytes),
            "torchtitan 0.2.2 models/llama3/infra/parallelize.py apply_fsdp (reshard_after_forward = not pp_enabled); torch 2.15 distributed/pipelining/stage.py backward_maybe_with_nosync (set_reshard_after_backward(False))",
        )
        .note("every parameter of the stage all-gathered in the parameter dtype at its first micro-batch's forward and kept to the last one's backward"),
    )
}

/// FSDP2's fp32 unsharded gradient accumulators on a pipeline stage
/// ([`super::sharding::keeps_stage_gathered`]): `Ψ_T,stage × b_red`, one fp32 element per
/// trainable element of the stage, unsharded (tensor-parallel shards stay split). Made by the
/// step's first backward (`to_accumulated_grad_if_needed`: `grad.to(reduce_dtype)`), added into
/// by the later ones, reduce-scattered and freed after the last (torch 2.15
/// `distributed/fsdp/_fully_shard/_fsdp_param.py`, `_fsdp_param_group.py post_backward`). They
/// stand in the gradients' place: the sharded fp32 gradients exist only from that reduce to
/// `zero_grad`, as the accumulators go. A row where the simulated backward finds them resident
/// ([`super::sharding::accumulators_resident`]); the step's first or only backward makes them in
/// the step ([`super::step::run::Upcast`]) and there is no row. Measured
/// (`tests/fixtures/pytorch/fsdp/pp.json`): 1,541,120 B on stage 0 of the 4-layer test model.
pub fn unsharded_accumulator_bytes(cfg: &Config, groups: &[LocalGroup], first_backward: bool) -> Option<Row> {
    if !super::sharding::accumulators_resident(cfg, first_backward) {
        return None;
    }
    let e = Expr::prod([
        Expr::var(PSI_STAGE, elements(groups, |g| g.role == Role::Trainable)),
        Expr::var(B_RED, super::sharding::TORCHTITAN_REDUCE_BYTES),
    ]);
    Some(
        Row::new(
            RowId::Gradients,
            "Gradients (fp32, unsharded until the last micro-batch)",
            Category::Gradients,
            e,
            "torch 2.15 distributed/fsdp/_fully_shard/_fsdp_param.py to_accumulated_grad_if_needed, accumulate_unsharded_grad_if_needed; distributed/pipelining/stage.py set_requires_gradient_sync(False)",
        )
        .note("FSDP2's unsharded_accumulated_grad: reduce-scattered once, after the last micro-batch's backward"),
    )
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
/// what offload moves off the GPU (`first_backward`: the simulated backward is the step's first,
/// [`unsharded_accumulator_bytes`]).
pub fn static_rows(cfg: &Config, recipe: &Recipe, groups: &[LocalGroup], first_backward: bool) -> (Vec<Row>, Vec<Row>) {
    let sh = Sharding::of(cfg);
    let mut gpu = Vec::with_capacity(12);
    let mut host = Vec::new();
    let offload_params = cfg.offload == Offload::OptimizerParams && sh.stage == 3;
    let offload_opt = cfg.offload != Offload::None;

    // The trainable parameters' own recipe (peft's fp32 adapters on a 16-bit QLoRA base).
    let frozen_recipe = recipe;
    let recipe = &super::precision::trainable_recipe(cfg, recipe);
    // Under torchtitan's FSDP2 with pipeline parallelism and mixed precision the sharded
    // parameters are the fp32 ones (the master-weights row) and the 16-bit copy is the stage
    // gathered whole (`gathered_stage`); no sharded gradient stands beside them to share this
    // row's bytes as it does elsewhere.
    let sharded_are_master = super::sharding::keeps_stage_gathered(cfg) && recipe.master.is_some();
    let weights = if cfg.fp8_model_init && cfg.fp8_recipe().te() {
        fp8_model_init_weights(cfg, recipe, groups, &sh)
    } else {
        with_fp32_kept(trainable_weight_bytes(recipe, groups, &sh), cfg, groups, &sh.shards(3), recipe.weight.bytes(), B_W)
    };
    match (sharded_are_master, offload_params) {
        (true, _) => {}
        (false, true) => host.push(weights),
        (false, false) => gpu.push(weights),
    }
    // Parameter offload (FSDP `CPUOffloadPolicy` / `CPUOffload(offload_params=True)`, ZeRO-3
    // `offload_param`): every sharded parameter — frozen and 4-bit ones too — and the sharded
    // gradients live on the host; only the layers in flight come to the GPU (the gathered
    // row), and GPTQ's packed tensors, which are buffers, stay (validation/FINDINGS.md §13).
    let frozen = frozen_weight_bytes(frozen_recipe, groups, &sh);
    if offload_params {
        host.extend(frozen);
        if cfg.qlora_quant == QloraQuant::Nf4 {
            host.extend(quantized_rows(cfg, groups, &sh, Some(true)));
            gpu.extend(quantized_rows(cfg, groups, &sh, Some(false)));
        } else {
            gpu.extend(quantized_weight_bytes(cfg, groups, &sh));
        }
    } else {
        gpu.extend(frozen);
        gpu.extend(quantized_weight_bytes(cfg, groups, &sh));
    }
    gpu.extend(fp8_rows(cfg, groups));
    gpu.extend(kept_stage_parameter_bytes(cfg, recipe, groups));
    let gradients = if super::sharding::keeps_stage_gathered(cfg) {
        unsharded_accumulator_bytes(cfg, groups, first_backward)
    } else {
        Some(with_fp32_kept(gradient_bytes(recipe, groups, &sh), cfg, groups, &sh.shards(2), recipe.grad.bytes(), B_G))
    };
    if offload_params {
        host.extend(gradients);
    } else {
        gpu.extend(gradients);
    }
    gpu.extend(reduction_buffer_bytes(cfg, recipe, groups));

    let opt_shards = sh.shards(1);
    let mut opt_rows: Vec<Row> = Vec::new();
    opt_rows.extend(master_weight_bytes(recipe, groups, &sh));
    if cfg.optim != Optimizer::Sgd {
        opt_rows.push(fp32_kept_states(cfg, recipe, groups, &opt_shards));
    }
    if optimizer::paged(cfg) {
        opt_rows.extend(optimizer::paged_state_bytes(cfg.optim, groups, &opt_shards));
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

    let n_t = (tensor_count(groups, |g| g.role == Role::Trainable)
        + super::step::families::torchtitan::split_tensors(cfg, groups)
        + super::step::families::litgpt::split_tensors(cfg, groups))
    .saturating_sub(super::step::families::litgpt::merged_tensors(cfg, groups));
    let counters = if optimizer::bitsandbytes(cfg) {
        None
    } else {
        optimizer::step_counter_bytes(cfg.optim, if offload_opt { OptimImpl::Forloop } else { cfg.optim_impl }, n_t)
    };
    if let Some((e, on_gpu)) = counters {
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
        let (rows, _) = static_rows(&cfg, &recipe(precision), &flat(psi), false);
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
        let (rows, _) = static_rows(&cfg, &recipe(cfg.precision), &flat(1000), false);
        assert_eq!(rows.iter().find(|r| r.id == RowId::DdpBuckets).map(|r| r.bytes), Some(2000));
        let cfg = Config { bucket_view: true, ..cfg };
        let (rows, _) = static_rows(&cfg, &recipe(cfg.precision), &flat(1000), false);
        assert!(rows.iter().all(|r| r.id != RowId::DdpBuckets));
    }

    #[test]
    fn offloading_the_optimizer_moves_master_states_and_fp32_gradients_to_the_host() {
        let cfg = Config { offload: Offload::Optimizer, ..Config::default() };
        let (gpu, host) = static_rows(&cfg, &recipe(cfg.precision), &flat(1000), false);
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
        let row = quantized_weight_bytes(&cfg, &g, &Sharding::of(&cfg));
        let bits = row.map(|r| (r.bytes - (NF4_STATE_CONSTANTS + BNB_CONSTANTS) as u128) as f64 * 8.0 / (64.0 * 256.0 * 1000.0));
        assert!(bits.is_some_and(|b| (b - 4.127).abs() < 0.001), "{bits:?}");
    }

    #[test]
    fn fsdp2_gathers_a_torchao_nf4_weight_as_its_codes_scalers_and_factors() {
        // A bf16 256 × 256 weight: 32,768 B of codes, 1,024 scalers, 4 factors of 2 B.
        assert_eq!(torchao_nf4_gathered_bytes(65_536, 2), 33_800);
        // One scaler block (16,384 elements): the factor tensor keeps all 256 elements.
        assert_eq!(torchao_nf4_gathered_bytes(16_384, 2), 8_192 + 256 + 512);
        // The measured layer of tests/fixtures/pytorch/fsdp/tune.json's QLoRA records: q and o
        // 256 × 256, k and v 128 × 256, gate, up and down 512 × 256 (all NF4), with the bf16
        // adapters (65,536 B) and norms (1,024 B): 370,760 B.
        let nf4: u128 = [65_536, 65_536, 32_768, 32_768, 131_072, 131_072, 131_072].iter().map(|&n| torchao_nf4_gathered_bytes(n, 2)).sum();
        assert_eq!(nf4 + 65_536 + 1_024, 370_760);
    }

    #[test]
    fn nf4_without_double_quantization_costs_4_5_bits_per_parameter() {
        // 4 bits of code and a 32-bit absmax per 64 weights: 4 + 32/64 = 4.5 bits.
        let mut g = flat(64 * 256 * 1000);
        g[0].role = Role::Quantized;
        let cfg = Config { qlora_double_quant: false, ..Config::default() };
        let row = quantized_weight_bytes(&cfg, &g, &Sharding::of(&cfg));
        let bits = row.map(|r| (r.bytes - (NF4_PLAIN_STATE_CONSTANTS + BNB_CONSTANTS) as u128) as f64 * 8.0 / (64.0 * 256.0 * 1000.0));
        assert_eq!(bits, Some(4.5));
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
        let (rows, _) = static_rows(&cfg, &recipe(Precision::Bf16), &groups, false);
        let row = |id: &str| rows.iter().filter(|r| r.id.as_str() == id).map(|r| r.bytes).sum::<u128>();
        assert_eq!((row("weights"), row("gradients"), row("optimizer_states")), (2_256, 2_256, 4_512));
        let cfg = Config { precision: Precision::AmpBf16, ..cfg };
        let (rows, _) = static_rows(&cfg, &recipe(Precision::AmpBf16), &groups, false);
        let row = |id: &str| rows.iter().filter(|r| r.id.as_str() == id).map(|r| r.bytes).sum::<u128>();
        assert_eq!((row("weights"), row("gradients")), (4_256, 4_256));
    }
}
