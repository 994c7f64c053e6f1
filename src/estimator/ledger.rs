//! The ledger: one row per memory component, each with its bytes, its formula and its source.

use super::expr::{Expr, Sym};
use super::part::Part;
use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};
use std::borrow::Cow;

/// Bytes. `u128` so that no realistic cluster-wide figure overflows.
pub type Bytes = u128;

/// The summary bucket a row is counted in (`memory.*` in the CLI's JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameters,
    Gradients,
    OptimizerStates,
    Activations,
    /// Working memory that exists only around the peak (backward's temporaries, the
    /// optimizer step's temporaries).
    Transient,
    FrameworkOverhead,
}

impl Category {
    pub const ALL: [Category; 6] = [
        Category::Parameters,
        Category::Gradients,
        Category::OptimizerStates,
        Category::Activations,
        Category::Transient,
        Category::FrameworkOverhead,
    ];
    pub fn label(self) -> &'static str {
        match self {
            Category::Parameters => "Parameters",
            Category::Gradients => "Gradients",
            Category::OptimizerStates => "Optimizer states",
            Category::Activations => "Activations",
            Category::Transient => "Transient buffers",
            Category::FrameworkOverhead => "Framework overhead",
        }
    }
}

/// What a ledger row is: the identity the page, the charts, the exercises, the CLI and the
/// allocator's rules look a row up by (its `name` in the JSON, [`RowId::as_str`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RowId {
    Weights,
    FrozenWeights,
    QuantizedWeights,
    MasterWeights,
    Gradients,
    OffloadFp32Gradients,
    /// Saved activations offloaded to pinned host memory (`act_offload`).
    OffloadedActivations,
    OptimizerStates,
    /// bitsandbytes' paged states, in CUDA unified memory (`optim_paged`).
    PagedOptimizerStates,
    OptimizerStepTemporaries,
    OptimizerStepCounters,
    Fp8WeightCache,
    Fp8AmaxHistory,
    GatheredLayers,
    /// FSDP2's `[norm, output]` unit kept gathered (torchtitan).
    GatheredHead,
    /// FSDP2's root unit holding the embedding, norm and output, gathered again in backward
    /// (torchtune's distributed LoRA).
    GatheredRoot,
    /// FSDP2's output (and embedding) units of their own, gathered around each call
    /// (torchtune's distributed full fine-tune).
    GatheredEnds,
    /// A pipeline stage's parameters kept gathered through the step (torchtitan's FSDP2 under
    /// pipeline parallelism).
    GatheredStage,
    DdpBuckets,
    ZeroReduceBucket,
    /// The received stage inputs torch's pipeline schedule keeps to the step's end
    /// (torchtitan under pipeline parallelism).
    PipelineInputs,
    /// The saved activations, and their sub-rows by part.
    Activations,
    Activation(Part),
    StepWorking,
    CudaContext,
    NcclBuffers,
    BlasWorkspaces,
    AllocatorReserve,
    TextbookKorthikanti,
    TextbookSeed,
}

impl RowId {
    /// Every row the ledger can have, in no particular order.
    pub const ALL: [RowId; 42] = [
        RowId::Weights,
        RowId::FrozenWeights,
        RowId::QuantizedWeights,
        RowId::MasterWeights,
        RowId::Gradients,
        RowId::OffloadFp32Gradients,
        RowId::OffloadedActivations,
        RowId::OptimizerStates,
        RowId::PagedOptimizerStates,
        RowId::OptimizerStepTemporaries,
        RowId::OptimizerStepCounters,
        RowId::Fp8WeightCache,
        RowId::Fp8AmaxHistory,
        RowId::GatheredLayers,
        RowId::GatheredHead,
        RowId::GatheredRoot,
        RowId::GatheredEnds,
        RowId::GatheredStage,
        RowId::DdpBuckets,
        RowId::ZeroReduceBucket,
        RowId::PipelineInputs,
        RowId::Activations,
        RowId::Activation(Part::Embedding),
        RowId::Activation(Part::Norms),
        RowId::Activation(Part::AttentionInputs),
        RowId::Activation(Part::AttentionCore),
        RowId::Activation(Part::Mla),
        RowId::Activation(Part::Mlp),
        RowId::Activation(Part::Moe),
        RowId::Activation(Part::Lora),
        RowId::Activation(Part::Dropout),
        RowId::Activation(Part::Checkpoints),
        RowId::Activation(Part::Autocast),
        RowId::Activation(Part::Head),
        RowId::Activation(Part::Loss),
        RowId::StepWorking,
        RowId::CudaContext,
        RowId::NcclBuffers,
        RowId::BlasWorkspaces,
        RowId::AllocatorReserve,
        RowId::TextbookKorthikanti,
        RowId::TextbookSeed,
    ];

    /// The row's machine name (`weights`, `activations.attention_core`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            RowId::Weights => "weights",
            RowId::FrozenWeights => "frozen_weights",
            RowId::QuantizedWeights => "quantized_weights",
            RowId::MasterWeights => "master_weights",
            RowId::Gradients => "gradients",
            RowId::OffloadFp32Gradients => "offload_fp32_gradients",
            RowId::OffloadedActivations => "offloaded_activations",
            RowId::OptimizerStates => "optimizer_states",
            RowId::PagedOptimizerStates => "paged_optimizer_states",
            RowId::OptimizerStepTemporaries => "optimizer_step_temporaries",
            RowId::OptimizerStepCounters => "optimizer_step_counters",
            RowId::Fp8WeightCache => "fp8_weight_cache",
            RowId::Fp8AmaxHistory => "fp8_amax_history",
            RowId::GatheredLayers => "gathered_layers",
            RowId::GatheredHead => "gathered_head",
            RowId::GatheredRoot => "gathered_root",
            RowId::GatheredEnds => "gathered_ends",
            RowId::GatheredStage => "gathered_stage",
            RowId::DdpBuckets => "ddp_buckets",
            RowId::ZeroReduceBucket => "zero_reduce_bucket",
            RowId::PipelineInputs => "pipeline_inputs",
            RowId::Activations => "activations",
            RowId::Activation(p) => p.id(),
            RowId::StepWorking => "step_working",
            RowId::CudaContext => "cuda_context",
            RowId::NcclBuffers => "nccl_buffers",
            RowId::BlasWorkspaces => "blas_workspaces",
            RowId::AllocatorReserve => "allocator_reserve",
            RowId::TextbookKorthikanti => "textbook.korthikanti",
            RowId::TextbookSeed => "textbook.seed",
        }
    }

    /// The row of a machine name (as a link or an exercise spells it).
    pub fn parse(name: &str) -> Option<RowId> {
        RowId::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// Whether the row's memory lives outside the caching allocator: nvidia-smi adds it to what
    /// the allocator reserves (the CUDA context, cuBLAS workspaces, NCCL's buffers, and
    /// bitsandbytes' paged optimizer states, which `cudaMallocManaged` allocates).
    pub fn outside_allocator(self) -> bool {
        matches!(self, RowId::CudaContext | RowId::NcclBuffers | RowId::BlasWorkspaces | RowId::PagedOptimizerStates)
    }
}

impl std::fmt::Display for RowId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One component of memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// What the row is ([`RowId`]; its machine name is the JSON's `name`).
    pub id: RowId,
    pub label: Cow<'static, str>,
    pub category: Category,
    pub bytes: Bytes,
    /// The formula whose value is `bytes`.
    pub expr: Expr,
    /// Paper (table/section) or framework file the formula follows.
    pub source: &'static str,
    /// Dtype assumptions and caveats, in a sentence or two.
    pub note: Cow<'static, str>,
    /// Sub-rows whose bytes add up to this row's.
    pub children: Vec<Row>,
}

impl Row {
    /// A row whose bytes are its formula's value.
    pub fn new(id: RowId, label: impl Into<Cow<'static, str>>, category: Category, expr: Expr, source: &'static str) -> Row {
        Row { id, label: label.into(), category, bytes: expr.eval(), expr, source, note: Cow::Borrowed(""), children: Vec::new() }
    }
    pub fn note(mut self, note: impl Into<Cow<'static, str>>) -> Row {
        self.note = note.into();
        self
    }
    /// A row that is the sum of its children; its formula is the sum of theirs by symbol.
    pub fn parent(id: RowId, label: impl Into<Cow<'static, str>>, category: Category, children: Vec<Row>, source: &'static str) -> Row {
        let sym_terms = children
            .iter()
            .map(|c| Expr::var(Sym::new("M", c.id.as_str().rsplit('.').next().unwrap_or(c.id.as_str()), "a sub-row's bytes"), c.bytes));
        let expr = Expr::sum(sym_terms);
        Row { id, label: label.into(), category, bytes: expr.eval(), expr, source, note: Cow::Borrowed(""), children }
    }
}

impl Serialize for Row {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Row", 8)?;
        st.serialize_field("name", self.id.as_str())?;
        st.serialize_field("label", &self.label)?;
        st.serialize_field("category", &self.category)?;
        st.serialize_field("bytes", &self.bytes)?;
        st.serialize_field("formula", &self.expr.symbolic())?;
        st.serialize_field("substituted", &self.expr.substituted())?;
        st.serialize_field("source", self.source)?;
        st.serialize_field("note", &self.note)?;
        if !self.children.is_empty() {
            st.serialize_field("children", &self.children)?;
        }
        st.end()
    }
}

/// The bytes of the top-level rows `id` names in `rows` (0 where there is none).
pub fn bytes_of(rows: &[Row], id: RowId) -> Bytes {
    rows.iter().filter(|r| r.id == id).map(|r| r.bytes).sum()
}

/// Per-GPU bytes by category.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub parameters: Bytes,
    pub gradients: Bytes,
    pub optimizer_states: Bytes,
    pub activations: Bytes,
    pub transient: Bytes,
    pub framework_overhead: Bytes,
    /// Sum of every row.
    pub total: Bytes,
}

impl Summary {
    pub fn of(rows: &[Row]) -> Summary {
        let mut s = Summary::default();
        for r in rows {
            let slot = match r.category {
                Category::Parameters => &mut s.parameters,
                Category::Gradients => &mut s.gradients,
                Category::OptimizerStates => &mut s.optimizer_states,
                Category::Activations => &mut s.activations,
                Category::Transient => &mut s.transient,
                Category::FrameworkOverhead => &mut s.framework_overhead,
            };
            *slot = slot.saturating_add(r.bytes);
            s.total = s.total.saturating_add(r.bytes);
        }
        s
    }
    pub fn get(&self, c: Category) -> Bytes {
        match c {
            Category::Parameters => self.parameters,
            Category::Gradients => self.gradients,
            Category::OptimizerStates => self.optimizer_states,
            Category::Activations => self.activations,
            Category::Transient => self.transient,
            Category::FrameworkOverhead => self.framework_overhead,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parent_row_is_the_sum_of_its_children() {
        let a = Row::new(RowId::Weights, "A", Category::Activations, Expr::num(3u8), "");
        let b = Row::new(RowId::Gradients, "B", Category::Activations, Expr::num(4u8), "");
        let p = Row::parent(RowId::Activations, "P", Category::Activations, vec![a, b], "");
        assert_eq!(p.bytes, 7);
        assert_eq!(p.expr.symbolic(), "M_weights + M_gradients");
        // A sub-row's symbol is its name after the last dot.
        let c = Row::new(RowId::Activation(Part::Norms), "N", Category::Activations, Expr::num(1u8), "");
        assert_eq!(Row::parent(RowId::Activations, "X", Category::Activations, vec![c], "").expr.symbolic(), "M_norms");
    }

    #[test]
    fn bytes_of_a_row_id_is_its_rows_bytes_and_zero_without_one() {
        let rows = vec![
            Row::new(RowId::Weights, "W", Category::Parameters, Expr::num(10u8), ""),
            Row::new(RowId::Gradients, "G", Category::Gradients, Expr::num(5u8), ""),
        ];
        assert_eq!((bytes_of(&rows, RowId::Gradients), bytes_of(&rows, RowId::OptimizerStates)), (5, 0));
    }

    #[test]
    fn the_summary_total_adds_every_category() {
        let rows = vec![
            Row::new(RowId::Weights, "W", Category::Parameters, Expr::num(10u8), ""),
            Row::new(RowId::Gradients, "G", Category::Gradients, Expr::num(5u8), ""),
            Row::new(RowId::CudaContext, "O", Category::FrameworkOverhead, Expr::num(1u8), ""),
        ];
        let s = Summary::of(&rows);
        assert_eq!((s.parameters, s.gradients, s.framework_overhead, s.total), (10, 5, 1, 16));
    }

    #[test]
    fn every_row_reads_back_from_its_name_and_only_the_outside_rows_are_outside_the_allocator() {
        for r in RowId::ALL {
            assert_eq!(RowId::parse(r.as_str()), Some(r), "{r}");
        }
        let outside: Vec<&str> = RowId::ALL.into_iter().filter(|r| r.outside_allocator()).map(RowId::as_str).collect();
        assert_eq!(outside, ["paged_optimizer_states", "cuda_context", "nccl_buffers", "blas_workspaces"]);
        assert_eq!(RowId::parse("weight"), None);
    }
}
