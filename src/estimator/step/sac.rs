//! Selective activation checkpointing by op (`recompute = op`): torchtitan's policy, applied to
//! each decoder layer through `torch.utils.checkpoint`'s `create_selective_checkpoint_contexts`.
//!
//! Source: torchtitan 0.3.0, `torchtitan/distributed/activation_checkpoint.py`
//! (`_get_default_save_ops`, `SelectiveAC._wrap_block.wrapped_policy`): the outputs of the
//! ops in the save list are `MUST_SAVE` (cached in forward by torch 2.15's
//! `_CachingTorchDispatchMode`, handed back to the recomputation), every other op is
//! `PREFER_RECOMPUTE`. An `mm` / `linear` increments a per-block counter and only the
//! odd-numbered ones (1st, 3rd, …) are saved; `addmm`, `bmm`, `convolution`, the attention kernels, `max`
//! (full reduction: float8's amax) and `topk` are saved every time. `force_recompute_mm_shapes_by_fqns`
//! (default `["moe.router.gate"]`) names torchtitan's own MoE module and matches no transformers
//! module, so a router's mm takes a parity slot like any other (validation/FINDINGS.md §15.2).

/// Which kernels the policy may save: the save list names CUDA's SDPA kernels
/// (`_scaled_dot_product_flash_attention`, `_efficient_attention`, cuDNN) but not the CPU's
/// `_scaled_dot_product_flash_attention_for_cpu`, which a CPU run therefore recomputes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The attention kernel's outputs are saved (every CUDA kernel; not the CPU's).
    pub attention_saved: bool,
    /// torchtitan 0.2.2's own policy (`framework = torchtitan`, the version its model code is
    /// pinned at: `distributed/activation_checkpoint.py` `_apply_op_sac`): its
    /// `_op_sac_save_list` has no compute-intensive ops beyond `mm` (no `addmm`, `bmm`,
    /// `convolution` or `topk`: a MoE's score `bmm` and router `topk` are recomputed), and an
    /// `mm` whose right-hand side has a router gate's shape (`per_op_sac_force_recompute_mm_shapes_by_fqns`,
    /// default `["moe.router.gate"]`: torchtitan's own MoE module) is recomputed without taking
    /// a parity slot (measured: `torchtitan-deepseek_v3.json`'s `ckpt-op` records).
    pub titan_022: bool,
}

/// A selective-checkpoint region being built: its index and the block's mm counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Open {
    pub region: usize,
    pub policy: Policy,
    /// mm / linear ops seen in this block so far (`wrapped_policy`'s `meta["mm_count"]`).
    pub mm_count: u32,
}

/// torchtitan's `per_op_sac_force_recompute_mm_shapes_by_fqns` default: its MoE's router gate.
const ROUTER_GATE: &str = "moe.router.gate";

/// The op the step program names a torchao `Float8Linear`'s matmul by (`lowbit.rs`).
const FP8_LINEAR: &str = "_scaled_mm";

/// The CUDA and CPU names of the fused attention kernels as the step program emits them.
const ATTENTION_KERNELS_CPU: &str = "_scaled_dot_product_flash_attention_for_cpu";

impl Open {
    /// Whether the policy saves the outputs of op `name` with `outs` outputs (and counts it).
    pub fn saves(&mut self, name: &str, outs: usize, module: &str) -> bool {
        let titan = self.policy.titan_022;
        match name {
            "mm" | "linear" | FP8_LINEAR if titan && module.ends_with(ROUTER_GATE) => false,
            // torchao's `Float8Linear` calls `torch.mm` on `Float8TrainingTensor`s: a dispatch
            // mode sees `aten.mm.default` before the subclass turns it into `_scaled_mm`, so the
            // policy counts it as an mm (measured: torch 2.15 + torchao 0.18, the 24
            // `…/ckpt-op/fp8-*` records of tests/fixtures/pytorch/fp8/records.json, whose
            // `sac_ops` show one `mm` and, tensorwise, two `max` per `Float8Linear`, never
            // `_scaled_mm`; validation/FINDINGS.md §15.2).
            "mm" | "linear" | FP8_LINEAR => {
                self.mm_count += 1;
                // torchtitan: `if meta[mm_count_key] % 2 == 0: return PREFER_RECOMPUTE`.
                self.mm_count % 2 == 1
            }
            // `compute_intensive_ops` also lists `convolution` (the gated DeltaNet's and KDA's
            // causal conv1d: its output is cached, FINDINGS §15.2).
            "addmm" | "bmm" | "convolution" | "topk" => !titan,
            // torchtitan 0.2.2's `_op_sac_save_list` lists `_c10d_functional.reduce_scatter_tensor`:
            // under its tensor parallelism the row-parallel `wo`'s and `w2`'s reduce-scatters are
            // saved (measured: torchtitan-llama3-tp.json, FINDINGS §15.1.y).
            "reduce_scatter_tensor" => true,
            // `max.default` (a full reduction) is in the list, `max.dim` (values and indices) is not.
            "max" => outs == 1,
            ATTENTION_KERNELS_CPU => self.policy.attention_saved,
            "_scaled_dot_product_flash_attention" | "_scaled_dot_product_efficient_attention" | "_scaled_dot_product_cudnn_attention" => {
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_odd_numbered_mm_of_a_block_is_saved_and_every_even_one_recomputed() {
        let mut o = Open { region: 0, policy: Policy { attention_saved: true, titan_022: false }, mm_count: 0 };
        let saved: Vec<bool> = (0..7).map(|_| o.saves("mm", 1, "")).collect();
        assert_eq!(saved, [true, false, true, false, true, false, true]);
    }

    #[test]
    fn a_float8_linear_takes_an_mm_slot_of_the_parity_count() {
        // q (mm 1, saved), k (2, recomputed), v (3, saved): the same as three bf16 linears.
        let mut o = Open { region: 0, policy: Policy { attention_saved: true, titan_022: false }, mm_count: 0 };
        let saved: Vec<bool> = ["_scaled_mm", "mm", "_scaled_mm"].iter().map(|n| o.saves(n, 1, "")).collect();
        assert_eq!(saved, [true, false, true]);
    }

    #[test]
    fn torchtitans_own_policy_recomputes_the_router_gate_without_a_parity_slot_and_keeps_no_bmm_or_topk() {
        let mut o = Open { region: 0, policy: Policy { attention_saved: true, titan_022: true }, mm_count: 0 };
        // wq (1, saved), wkv_a (2), wkv_b (3, saved), wo (4), the router gate (not counted), the
        // shared experts' w1 (5, saved), w3 (6), w2 (7, saved).
        let mms = ["attention.wq", "attention.wkv_a", "attention.wkv_b", "attention.wo", "moe.router.gate", "w1", "w3", "w2"];
        let saved: Vec<bool> = mms.iter().map(|m| o.saves("mm", 1, m)).collect();
        assert_eq!(saved, [true, false, true, false, false, true, false, true]);
        assert!(!o.saves("bmm", 1, "moe") && !o.saves("topk", 2, "moe.router") && o.saves("max", 1, ""));
    }

    #[test]
    fn the_cpu_attention_kernel_is_saved_only_where_the_policy_says_so() {
        let mut cpu = Open { region: 0, policy: Policy { attention_saved: false, titan_022: false }, mm_count: 0 };
        assert!(!cpu.saves(ATTENTION_KERNELS_CPU, 2, ""));
        assert!(cpu.saves("addmm", 1, "") && cpu.saves("topk", 2, "") && !cpu.saves("max", 2, "") && !cpu.saves("_grouped_mm", 1, ""));
    }
}
