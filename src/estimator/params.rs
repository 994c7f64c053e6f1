//! The parameter tensors one GPU holds: the model's tensor table, cut to the GPU's pipeline
//! stage, rewritten by the fine-tuning method (frozen base, LoRA adapters, NF4 base) and split by
//! tensor and expert parallelism. ZeRO/FSDP sharding comes later, per role, in `statics`.

use super::config::{Config, Finetune, LoraTargets};
use super::model::{Linear, ModelSpec, Part, Split, TensorGroup, INDEXER_PREFIX};
use serde::Serialize;

/// What a tensor costs and whether it learns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Has gradients and optimizer states.
    Trainable,
    /// Frozen, in the recipe's weight dtype (LoRA's base, QLoRA's non-quantized tensors, and
    /// under any method DeepSeek-V3.2's indexer, whose forward runs under `torch.no_grad()`).
    Frozen,
    /// Frozen and NF4-quantized (QLoRA's base linears).
    Quantized,
}

/// One group of identical tensors on this GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LocalGroup {
    pub group: TensorGroup,
    pub role: Role,
    /// Routed-expert tensors shard over the expert-data-parallel group.
    pub expert: bool,
    /// A LoRA adapter matrix (A or B).
    pub adapter: bool,
}

/// Which pipeline stage a GPU runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// No pipeline parallelism: the whole model.
    Whole,
    /// First stage: embeddings and the first layers.
    First,
    /// A stage in the middle: layers only.
    Middle,
    /// Last stage: the last layers, final norm, LM head and loss.
    Last,
}

impl Stage {
    pub fn label(self) -> &'static str {
        match self {
            Stage::Whole => "whole model",
            Stage::First => "first pipeline stage",
            Stage::Middle => "middle pipeline stage",
            Stage::Last => "last pipeline stage",
        }
    }
    pub fn has_embedding(self) -> bool {
        matches!(self, Stage::Whole | Stage::First)
    }
    pub fn has_head(self) -> bool {
        matches!(self, Stage::Whole | Stage::Last)
    }
}

/// The distinct stages of a `pp`-way pipeline.
pub fn stages(pp: u64) -> &'static [Stage] {
    match pp {
        0 | 1 => &[Stage::Whole],
        2 => &[Stage::First, Stage::Last],
        _ => &[Stage::First, Stage::Middle, Stage::Last],
    }
}

/// Decoder layers on the most loaded stage: ⌈L / pp⌉ (Megatron requires L divisible by pp;
/// uneven splits put the remainder on the first stages).
pub fn stage_layers(layers: u64, pp: u64) -> u64 {
    layers.div_ceil(pp.max(1))
}

/// Decoder layers of one virtual pipeline stage (a model chunk under interleaving, each a
/// `TransformerBlock` of its own in Megatron): the most loaded stage's ⌈L / pp⌉ over `vpp`
/// (Megatron's interleaving requires L divisible by pp × vpp, `validate`; torchtitan's uneven
/// split gives the rank's chunks a layer more or less), at least 1. Toy: L 32, pp 2, vpp 2 → 8;
/// L 30, pp 4 → 8 (the first stages take the remainder).
pub fn virtual_stage_layers(layers: u64, pp: u64, vpp: u64) -> u64 {
    (stage_layers(layers, pp) / vpp.max(1)).max(1)
}

/// The model restricted to one pipeline stage's layers: `L` becomes the stage's layer count,
/// MoE layers first (the heaviest case).
fn stage_spec(spec: &ModelSpec, layers: u64) -> ModelSpec {
    let mut s = spec.clone();
    let moe_here = spec.moe_layers().min(layers);
    s.layers = layers;
    s.dense_layers = if spec.experts > 0 { layers - moe_here } else { 0 };
    // The stage's MoE layers are counted, not placed: its last `moe_here` layers (an
    // interleaving rule such as Llama 4's would otherwise drop those below `dense_layers`).
    s.moe_rule = crate::estimator::model::LayerRule::All;
    s
}

fn on_stage(g: &TensorGroup, stage: Stage, tied: bool) -> bool {
    match g.part {
        p if p.per_layer() => true,
        Part::Embedding => stage.has_embedding() || (tied && stage == Stage::Last),
        Part::PositionEmbedding => stage.has_embedding(),
        Part::Projection => {
            if g.name.starts_with("project_in") {
                stage.has_embedding()
            } else {
                stage.has_head()
            }
        }
        Part::FinalNorm | Part::LmHead => stage.has_head(),
        _ => true,
    }
}

fn targeted(linear: Linear, t: LoraTargets) -> bool {
    use LoraTargets as T;
    match linear {
        Linear::Q => t.has(T::Q),
        Linear::K => t.has(T::K),
        Linear::V => t.has(T::V),
        Linear::Qkv => t.has(T::Q) || t.has(T::K) || t.has(T::V),
        Linear::O => t.has(T::O),
        Linear::Gate => t.has(T::GATE),
        Linear::Up => t.has(T::UP),
        Linear::GateUp => t.has(T::GATE) || t.has(T::UP),
        Linear::Down => t.has(T::DOWN),
    }
}

/// LoRA's two adapter matrices for a targeted linear of shape `[out, in]` (or `[E, out, in]`):
/// A is `[r, in]`, B is `[out, r]` — r·(in + out) parameters (Hu et al. 2021, §4.1).
fn lora_adapters(base: &TensorGroup, rank: u64) -> [TensorGroup; 2] {
    let (lead, out, inp): (Vec<u64>, u64, u64) = match base.shape.as_slice() {
        [e, o, i] => (vec![*e], *o, *i),
        [o, i] => (vec![], *o, *i),
        _ => (vec![], 0, 0),
    };
    let shape = |a: u64, b: u64| {
        let mut v = lead.clone();
        v.extend([a, b]);
        v
    };
    // Under tensor parallelism A of a row-parallel linear is split with its input, B of a
    // column-parallel linear with its output; the other factor is small and replicated.
    let (split_a, split_b) = match base.split {
        Split::Row => (Split::Row, Split::Replicated),
        _ => (Split::Replicated, Split::Column),
    };
    [
        TensorGroup { name: "lora_A", shape: shape(rank, inp), split: split_a, linear: None, ..base.clone() },
        TensorGroup { name: "lora_B", shape: shape(out, rank), split: split_b, linear: None, ..base.clone() },
    ]
}

/// Splits one tensor for tensor parallelism (`tp`) and expert parallelism (`ep`).
fn localize(mut g: TensorGroup, tp: u64, ep: u64) -> TensorGroup {
    let n = g.shape.len();
    // For stacked experts the matrix dims are the last two.
    let (out_dim, in_dim) = if n >= 2 { (n - 2, n - 1) } else { (0, 0) };
    match g.split {
        Split::Column | Split::Vocab => g.shape[out_dim] = g.shape[out_dim].div_ceil(tp),
        Split::Row if n >= 2 => g.shape[in_dim] = g.shape[in_dim].div_ceil(tp),
        _ => {}
    }
    if g.part == Part::Experts && ep > 1 {
        if n == 3 {
            g.shape[0] = g.shape[0].div_ceil(ep);
        }
        g.tensors_per_instance = g.tensors_per_instance.div_ceil(ep);
    }
    g
}

/// The tensors one GPU of `stage` holds, with their roles.
pub fn local_groups(cfg: &Config, stage: Stage) -> Vec<LocalGroup> {
    let spec = stage_spec(&cfg.arch, stage_layers(cfg.arch.layers, cfg.pp));
    let mut out = Vec::with_capacity(48);
    for g in spec.tensors().into_iter().filter(|g| on_stage(g, stage, spec.tied && cfg.pp > 1)) {
        let expert = g.part == Part::Experts;
        let push = |out: &mut Vec<LocalGroup>, g: TensorGroup, role, adapter| {
            out.push(LocalGroup { group: localize(g, cfg.tp, cfg.ep), role, expert, adapter })
        };
        match (cfg.finetune, g.linear) {
            // DeepSeek-V3.2's indexer gets no gradient (`DeepseekV32Indexer.forward` is
            // `@torch.no_grad()`): no gradient, no optimizer state, no AdamW step counter.
            _ if g.name.starts_with(INDEXER_PREFIX) => push(&mut out, g, Role::Frozen, false),
            (Finetune::Full, _) => push(&mut out, g, Role::Trainable, false),
            (ft, Some(lin)) => {
                if targeted(lin, cfg.lora_targets) && cfg.lora_rank > 0 {
                    for a in lora_adapters(&g, cfg.lora_rank) {
                        push(&mut out, a, Role::Trainable, true);
                    }
                }
                let role = if ft == Finetune::Qlora { Role::Quantized } else { Role::Frozen };
                push(&mut out, g, role, false);
            }
            // Lightning's `BitsandbytesPrecision` makes every `nn.Linear` built under
            // `init_module` an `_NF4Linear`: litgpt's untied `lm_head` is 4-bit too.
            (Finetune::Qlora, None) if lightning_head(cfg, &g) => push(&mut out, g, Role::Quantized, false),
            (_, None) => push(&mut out, g, Role::Frozen, false),
        }
    }
    out
}

/// Whether `g` is an LM head that Lightning's bitsandbytes plugin quantizes (`qlora_lightning`
/// with an NF4 base; lightning 2.3.0.dev20240428 `fabric/plugins/precision/bitsandbytes.py`
/// `module_init_context`: `_ClassReplacementContextManager({"torch.nn.Linear": _NF4Linear})`).
pub fn lightning_head(cfg: &Config, g: &TensorGroup) -> bool {
    cfg.qlora_lightning && cfg.qlora_quant == crate::estimator::config::QloraQuant::Nf4 && g.part == Part::LmHead
}

/// Elements of the groups that satisfy `pred`.
pub fn elements(groups: &[LocalGroup], pred: impl Fn(&LocalGroup) -> bool) -> u64 {
    groups.iter().filter(|g| pred(g)).map(|g| g.group.total()).sum()
}

/// Parameter tensors of the groups that satisfy `pred`.
pub fn tensor_count(groups: &[LocalGroup], pred: impl Fn(&LocalGroup) -> bool) -> u64 {
    groups.iter().filter(|g| pred(g)).map(|g| g.group.tensor_count()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::presets::preset;

    fn cfg(model: &str) -> Config {
        let arch = preset(model).map(|p| p.spec).unwrap_or_else(|| Config::default().arch);
        Config { model: model.into(), arch, ..Config::default() }
    }

    #[test]
    fn the_whole_model_on_one_gpu_is_all_trainable_under_full_fine_tuning() {
        let c = cfg("llama-3.1-8b");
        let g = local_groups(&c, Stage::Whole);
        assert_eq!(elements(&g, |g| g.role == Role::Trainable), 8_030_261_248);
        assert_eq!(tensor_count(&g, |_| true), 291);
    }

    #[test]
    fn lora_of_rank_16_on_all_llama_linears_trains_41_9_million_parameters() {
        // Per layer: q 16·(4096+4096) + k 16·(4096+1024) + v the same + o 16·(4096+4096)
        //            + gate, up 16·(4096+14336) each + down 16·(14336+4096)
        //          = 131,072 + 81,920 + 81,920 + 131,072 + 3 × 294,912 = 1,310,720;
        // × 32 layers = 41,943,040.
        let c = Config { finetune: Finetune::Lora, lora_rank: 16, ..cfg("llama-3.1-8b") };
        let g = local_groups(&c, Stage::Whole);
        assert_eq!(elements(&g, |g| g.role == Role::Trainable), 41_943_040);
        assert_eq!(elements(&g, |g| g.role == Role::Frozen), 8_030_261_248);
    }

    #[test]
    fn qlora_quantizes_only_the_layer_linears() {
        let c = Config { finetune: Finetune::Qlora, ..cfg("llama-3.1-8b") };
        let g = local_groups(&c, Stage::Whole);
        // Frozen, not quantized: embedding + head 2 × 128,256 × 4096, norms 65 × 4096.
        assert_eq!(elements(&g, |g| g.role == Role::Frozen), 2 * 128_256 * 4096 + 65 * 4096);
    }

    #[test]
    fn tensor_parallelism_splits_matrices_but_not_norms() {
        let c = Config { tp: 8, gpus: 8, ..cfg("llama-3.1-8b") };
        let g = local_groups(&c, Stage::Whole);
        // Every matrix divides by 8 exactly; the 65 norm vectors of 4096 stay whole.
        let norms = 65 * 4096;
        assert_eq!(elements(&g, |_| true), (8_030_261_248 - norms) / 8 + norms);
    }

    #[test]
    fn a_virtual_stage_holds_the_most_loaded_stages_layers_over_vpp() {
        assert_eq!(virtual_stage_layers(32, 2, 2), 8);
        // Uneven: the first stages take the remainder, ⌈30/4⌉ = 8.
        assert_eq!(virtual_stage_layers(30, 4, 1), 8);
        assert_eq!(virtual_stage_layers(32, 1, 0), 32, "vpp 0 reads as 1");
        assert_eq!(virtual_stage_layers(2, 4, 1), 1, "never 0");
    }

    #[test]
    fn pipeline_stages_hold_their_own_ends_of_the_model() {
        let c = Config { pp: 4, gpus: 4, ..cfg("llama-3.1-8b") };
        let first = elements(&local_groups(&c, Stage::First), |_| true);
        let last = elements(&local_groups(&c, Stage::Last), |_| true);
        let middle = elements(&local_groups(&c, Stage::Middle), |_| true);
        let layer = 218_112_000; // (8,030,261,248 − 2 × 525,336,576 − 4096) / 32
        assert_eq!(middle, 8 * layer);
        assert_eq!(first, 8 * layer + 128_256 * 4096);
        assert_eq!(last, 8 * layer + 128_256 * 4096 + 4096);
    }

    #[test]
    fn expert_parallelism_divides_the_experts() {
        let c = Config { ep: 8, gpus: 8, ..cfg("mixtral-8x7b-v0.1") };
        let g = local_groups(&c, Stage::Whole);
        let experts = elements(&g, |g| g.expert);
        assert_eq!(experts, 32 * 3 * 4096 * 14336);
    }
}
