//! Exercises: a question about one configuration whose answer the calculator computes.
//!
//! The course material trainmem grew from ends with a self-check (the four categories and their
//! shares, 16Ψ for a 13B model, why the optimizer takes ~75 % of static memory, why Adam keeps
//! fp32 states, activation memory per layer, what `torch.cuda.memory_allocated` shows). Each
//! built-in exercise here is such a question with a configuration, a [`Target`] — the figure to
//! predict — and the ledger rows to reveal with their substituted formulas. The answer key is
//! always [`answer`]: the estimator's own numbers, never a typed-in figure, so the key stays right
//! when the model improves. Instructors write their own with `ask=` (see settings.rs), using the
//! same target syntax ([`Target::parse`]).

use crate::config::{decode_query, Config};
use crate::estimator::ledger::Category;
use crate::estimator::{analyse, flatten, Estimate, EstimateError};

/// A whole-step memory figure a question can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// Every row at its largest.
    Total,
    /// The step's peak (what decides whether it fits).
    Peak,
    Parameters,
    Gradients,
    OptimizerStates,
    Activations,
    /// Weights + gradients + optimizer states: the model states of the ZeRO paper.
    Static,
    /// What `torch.cuda.memory_allocated()` shows right after the forward pass: the resident
    /// model states and the activations kept for backward.
    AfterForward,
    /// The number of parameters (not bytes).
    ParameterCount,
}

impl Field {
    const ALL: [(Field, &'static str); 9] = [
        (Field::Total, "total"),
        (Field::Peak, "peak"),
        (Field::Parameters, "parameters"),
        (Field::Gradients, "gradients"),
        (Field::OptimizerStates, "optimizer_states"),
        (Field::Activations, "activations"),
        (Field::Static, "static"),
        (Field::AfterForward, "after_forward"),
        (Field::ParameterCount, "parameter_count"),
    ];
    pub fn name(self) -> &'static str {
        Field::ALL.iter().find(|(f, _)| *f == self).map_or("", |(_, n)| n)
    }
    fn parse(s: &str) -> Option<Field> {
        Field::ALL.iter().find(|(_, n)| *n == s).map(|(f, _)| *f)
    }
    fn value(self, e: &Estimate) -> u128 {
        let m = &e.memory;
        match self {
            Field::Total => m.total,
            Field::Peak => m.peak,
            Field::Parameters => m.parameters,
            Field::Gradients => m.gradients,
            Field::OptimizerStates => m.optimizer_states,
            Field::Activations => m.activations,
            Field::Static => m.parameters + m.gradients + m.optimizer_states,
            // An approximation for per-layer differences only; [`answer`] takes the figure itself
            // from the step's stream (`estimator::after_forward`).
            Field::AfterForward => m.parameters + m.optimizer_states + m.activations,
            Field::ParameterCount => e.parameter_count as u128,
        }
    }
}

/// The figure a question asks the learner to predict.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// The bytes of ledger rows, summed (`row:weights+gradients`).
    Rows(Vec<String>),
    /// A whole-step figure (`memory:peak`).
    Memory(Field),
    /// A part as a percentage of a whole, each a sum of rows or categories
    /// (`share:master_weights+optimizer_states/weights+gradients+master_weights+optimizer_states`).
    Share { part: Vec<String>, whole: Vec<String> },
    /// Bytes per parameter of some rows (`per_param:optimizer_states`).
    PerParameter(Vec<String>),
    /// How much a figure grows when the model gets one more decoder layer (`per_layer:activations`).
    PerLayer(Field),
    /// Which category is largest at the peak-deciding total (`dominant`).
    Dominant,
    /// How much some rows change from this configuration to the compared one (`diff:activations`).
    Difference(Vec<String>),
}

/// What the learner's guess is compared with.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Bytes(u128),
    Count(u128),
    Percent(f64),
    BytesPerParameter(f64),
    /// A category (choose one of [`Category::ALL`]).
    Category(Category),
}

/// Why an exercise has no answer for a configuration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExerciseError {
    #[error("the exercise's configuration cannot be estimated: {0}")]
    Estimate(#[from] EstimateError),
    #[error("`{0}` is not a row of this configuration's ledger")]
    UnknownRow(String),
    #[error("this exercise compares two configurations, but no second one was given (compare=)")]
    NoComparison,
}

fn ids(s: &str) -> Vec<String> {
    s.split('+').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect()
}

impl Target {
    /// Reads the `ask=` syntax; the error says what is wrong.
    pub fn parse(s: &str) -> Result<Target, String> {
        let (kind, rest) = s.split_once(':').unwrap_or((s, ""));
        let need = |v: Vec<String>| if v.is_empty() { Err(format!("`{kind}:` needs row names")) } else { Ok(v) };
        let field = |r: &str| {
            Field::parse(r).ok_or_else(|| format!("`{r}` is not one of total, peak, parameters, gradients, optimizer_states, activations, static, after_forward, parameter_count"))
        };
        match kind {
            "row" => Ok(Target::Rows(need(ids(rest))?)),
            "memory" => Ok(Target::Memory(field(rest)?)),
            "share" => {
                let (p, w) = rest.split_once('/').ok_or("`share:` needs part/whole")?;
                Ok(Target::Share { part: need(ids(p))?, whole: need(ids(w))? })
            }
            "per_param" => Ok(Target::PerParameter(need(ids(rest))?)),
            "per_layer" => Ok(Target::PerLayer(field(rest)?)),
            "dominant" => Ok(Target::Dominant),
            "diff" => Ok(Target::Difference(need(ids(rest))?)),
            _ => Err("must be row:, memory:, share:, per_param:, per_layer:, dominant or diff:".to_string()),
        }
    }

    /// The `ask=` spelling (inverse of [`Target::parse`]).
    pub fn spec(&self) -> String {
        match self {
            Target::Rows(r) => format!("row:{}", r.join("+")),
            Target::Memory(f) => format!("memory:{}", f.name()),
            Target::Share { part, whole } => format!("share:{}/{}", part.join("+"), whole.join("+")),
            Target::PerParameter(r) => format!("per_param:{}", r.join("+")),
            Target::PerLayer(f) => format!("per_layer:{}", f.name()),
            Target::Dominant => "dominant".to_string(),
            Target::Difference(r) => format!("diff:{}", r.join("+")),
        }
    }

    /// The ledger rows whose formulas the reveal shows.
    pub fn rows(&self) -> Vec<String> {
        match self {
            Target::Rows(r) | Target::PerParameter(r) | Target::Difference(r) => r.clone(),
            Target::Share { part, whole } => {
                let mut v = whole.clone();
                v.extend(part.iter().filter(|p| !whole.contains(p)).cloned());
                v
            }
            Target::Memory(_) | Target::PerLayer(_) | Target::Dominant => Vec::new(),
        }
    }
}

/// The bytes of a row (by id) or of a whole category (by its snake_case name).
fn bytes_of(e: &Estimate, id: &str) -> Result<u128, ExerciseError> {
    if let Some(r) = flatten(&e.components).into_iter().find(|r| r.id.as_str() == id) {
        return Ok(r.bytes);
    }
    Category::ALL
        .iter()
        .find(|c| category_name(**c) == id)
        .map(|&c| e.components.iter().filter(|r| r.category == c).map(|r| r.bytes).sum())
        .ok_or_else(|| ExerciseError::UnknownRow(id.to_string()))
}

fn sum(e: &Estimate, ids: &[String]) -> Result<u128, ExerciseError> {
    ids.iter().map(|id| bytes_of(e, id)).sum()
}

/// A category's name as links spell it.
pub fn category_name(c: Category) -> &'static str {
    match c {
        Category::Parameters => "parameters",
        Category::Gradients => "gradients",
        Category::OptimizerStates => "optimizer_states",
        Category::Activations => "activations",
        Category::Transient => "transient",
        Category::FrameworkOverhead => "framework_overhead",
    }
}

/// The answer key: the figure `target` names, computed by the estimator for `cfg` (and, for a
/// difference, the `compare` configuration).
pub fn answer(target: &Target, cfg: &Config, compare: Option<&Config>) -> Result<Answer, ExerciseError> {
    // The page's own figures: the ledger and the verdict as `analyse` gives them.
    let e = analyse(cfg)?.estimate;
    Ok(match target {
        Target::Rows(r) => Answer::Bytes(sum(&e, r)?),
        Target::Memory(Field::ParameterCount) => Answer::Count(Field::ParameterCount.value(&e)),
        // The step's own stream: resident states + what is live once forward and loss are done.
        Target::Memory(Field::AfterForward) => Answer::Bytes(crate::estimator::after_forward(cfg)?),
        Target::Memory(f) => Answer::Bytes(f.value(&e)),
        Target::Share { part, whole } => {
            let (p, w) = (sum(&e, part)?, sum(&e, whole)?);
            Answer::Percent(if w == 0 { 0.0 } else { p as f64 * 100.0 / w as f64 })
        }
        Target::PerParameter(r) => Answer::BytesPerParameter(sum(&e, r)? as f64 / e.parameter_count.max(1) as f64),
        Target::PerLayer(f) => {
            let mut more = cfg.clone();
            more.arch.layers += 1;
            let e2 = analyse(&more)?.estimate;
            Answer::Bytes(f.value(&e2).saturating_sub(f.value(&e)))
        }
        Target::Dominant => {
            let best = Category::ALL.iter().map(|&c| (c, bytes_of(&e, category_name(c)).unwrap_or(0))).max_by_key(|(_, b)| *b);
            Answer::Category(best.map_or(Category::Activations, |(c, _)| c))
        }
        Target::Difference(r) => {
            let other = analyse(compare.ok_or(ExerciseError::NoComparison)?)?.estimate;
            // A row the other configuration lacks (e.g. eager-only scores) counts as 0 there.
            let (a, b) = (sum(&e, r)?, sum(&other, r).unwrap_or(0));
            Answer::Bytes(a.abs_diff(b))
        }
    })
}

/// How a guess compares with the answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    pub correct: bool,
    /// Relative error of the guess, percent (0 for a category).
    pub error_pct: f64,
}

/// Checks a numeric guess (in the answer's unit: bytes, a count, percent, bytes per parameter)
/// within `tolerance_pct`, or a category guess by name.
pub fn check(answer: &Answer, guess: &str, tolerance_pct: f64) -> Option<Check> {
    let num = |want: f64| {
        let g: f64 = parse_number(guess)?;
        let err = if want == 0.0 {
            if g == 0.0 {
                0.0
            } else {
                100.0
            }
        } else {
            (g - want).abs() * 100.0 / want.abs()
        };
        Some(Check { correct: err <= tolerance_pct, error_pct: err })
    };
    match answer {
        Answer::Bytes(b) | Answer::Count(b) => num(*b as f64),
        Answer::Percent(p) | Answer::BytesPerParameter(p) => num(*p),
        Answer::Category(c) => {
            let g = guess.trim().to_ascii_lowercase().replace([' ', '-'], "_");
            Some(Check { correct: g == category_name(*c) || g == c.label().to_ascii_lowercase().replace(' ', "_"), error_pct: 0.0 })
        }
    }
}

/// An example of how to write a guess for `answer`, in its kind and, for bytes, in `unit`
/// ("e.g. 42 GB"): a figure at least three times away from the answer (or, for a percentage,
/// 25 points), so that the hint never gives the answer away nor lies near it.
pub fn example_guess(answer: &Answer, unit: crate::estimator::config::Unit) -> String {
    use crate::estimator::config::Unit;
    let far = |want: f64, candidates: &[f64]| {
        candidates.iter().copied().find(|c| want <= 0.0 || !(want / 3.0..=want * 3.0).contains(c)).unwrap_or(candidates[0])
    };
    match answer {
        Answer::Bytes(b) => {
            let (scale, sym) = match unit {
                Unit::Gb => (1e9, "GB"),
                Unit::Gib => (1_073_741_824.0, "GiB"),
            };
            let v = far(*b as f64 / scale, &[42.0, 640.0, 3.5, 9000.0]);
            format!("e.g. {v} {sym}")
        }
        Answer::Count(n) => {
            let v = far(*n as f64, &[3.2e9, 7.5e11, 1.2e8, 4.0e13]);
            format!("e.g. {v:e}")
        }
        Answer::Percent(p) => {
            let v = [35.0, 85.0, 5.0].into_iter().find(|c: &f64| (c - p).abs() >= 25.0).unwrap_or(35.0);
            format!("e.g. {v} %")
        }
        Answer::BytesPerParameter(p) => {
            let v = far(*p, &[3.0, 40.0, 0.5]);
            format!("e.g. {v} bytes per parameter")
        }
        Answer::Category(_) => "a category".into(),
    }
}

/// Reads a guess: digits with optional separators and an SI/binary suffix (`208 GB`, `1.5e9`,
/// `194 GiB`, `75 %`).
pub fn parse_number(s: &str) -> Option<f64> {
    let t = s.trim().replace([',', '_', ' ', '%'], "");
    let lower = t.to_ascii_lowercase();
    let units: [(&str, f64); 9] = [
        ("tib", (1u64 << 40) as f64),
        ("gib", (1u64 << 30) as f64),
        ("mib", (1u64 << 20) as f64),
        ("kib", 1024.0),
        ("tb", 1e12),
        ("gb", 1e9),
        ("mb", 1e6),
        ("kb", 1e3),
        ("b", 1.0),
    ];
    for (u, mult) in units {
        if let Some(n) = lower.strip_suffix(u) {
            return n.parse::<f64>().ok().filter(|v| v.is_finite()).map(|v| v * mult);
        }
    }
    lower.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// A built-in exercise.
#[derive(Clone, Debug, PartialEq)]
pub struct Exercise {
    /// Stable id (`step=`).
    pub id: &'static str,
    pub title: &'static str,
    pub question: &'static str,
    /// The configuration, as a share-link query.
    pub query: &'static str,
    /// A second configuration for comparisons.
    pub compare: Option<&'static str>,
    pub target: Target,
    pub tolerance_pct: f64,
    pub hint: &'static str,
    /// Why the answer is what it is — shown with the revealed rows.
    pub explanation: &'static str,
}

impl Exercise {
    pub fn config(&self) -> Config {
        decode_query(self.query).config
    }
    pub fn compare_config(&self) -> Option<Config> {
        self.compare.map(|q| decode_query(q).config)
    }
    /// The answer key, computed.
    pub fn answer(&self) -> Result<Answer, ExerciseError> {
        answer(&self.target, &self.config(), self.compare_config().as_ref())
    }
}

fn rows(r: &[&str]) -> Vec<String> {
    r.iter().map(|s| s.to_string()).collect()
}

/// The built-in set: the seed course's self-check, each answered by the calculator.
pub fn builtin() -> Vec<Exercise> {
    let model_states = ["weights", "gradients", "master_weights", "optimizer_states"];
    vec![
        Exercise {
            id: "four-categories",
            title: "The four categories",
            question: "Llama-3.1-8B, full fine-tuning in bf16 mixed precision with AdamW, 4,096 tokens: which category takes the most memory?",
            query: "model=llama-3.1-8b",
            compare: None,
            target: Target::Dominant,
            tolerance_pct: 0.0,
            hint: "Count bytes per parameter for the model states, then compare with the activations' b·s·h terms.",
            explanation: "With AdamW in mixed precision every parameter costs 16 bytes of model states (2 weight + 2 gradient + 4 master + 8 moments); the optimizer's 12 of them dominate unless the sequence is long.",
        },
        Exercise {
            id: "sixteen-psi",
            title: "16Ψ for a 13B model",
            question: "Llama-2-13B in bf16 mixed precision with AdamW: how many bytes do the weights, gradients, master weights and optimizer moments take together?",
            query: "model=llama-2-13b",
            compare: None,
            target: Target::Rows(rows(&model_states)),
            tolerance_pct: 2.0,
            hint: "Ψ is the parameter count; mixed precision with Adam costs 2 + 2 + 4 + 4 + 4 bytes per parameter.",
            explanation: "16 bytes per parameter (Rajbhandari et al. 2020, §3): 2Ψ bf16 weights, 2Ψ bf16 gradients, and 12Ψ for the fp32 master weights and Adam's two fp32 moments.",
        },
        Exercise {
            id: "optimizer-share",
            title: "Why the optimizer takes ~75 %",
            question: "Same model and recipe: what percentage of the model states are the optimizer's (master weights and moments)?",
            query: "model=llama-2-13b",
            compare: None,
            target: Target::Share { part: rows(&["master_weights", "optimizer_states"]), whole: rows(&model_states) },
            tolerance_pct: 2.0,
            hint: "Of the 16 bytes per parameter, which belong to the optimizer?",
            explanation: "12 of the 16 bytes per parameter are the optimizer's: 12/16 = 75 %. That is why ZeRO-1 (sharding only those) already saves most of the memory.",
        },
        Exercise {
            id: "adam-fp32",
            title: "Why Adam keeps fp32 states",
            question: "How many bytes per parameter do AdamW's two moments take in bf16 mixed precision?",
            query: "model=llama-2-13b",
            compare: None,
            target: Target::PerParameter(rows(&["optimizer_states"])),
            tolerance_pct: 1.0,
            hint: "Two moments, each in fp32.",
            explanation: "8 bytes: m and v in fp32. bf16 keeps 8 bits of mantissa, so an update smaller than 1/256 of a weight rounds away, and v's squares under- and overflow; mixed precision keeps the states (and a master copy of the weights) in fp32 so small updates accumulate.",
        },
        Exercise {
            id: "activations-per-layer",
            title: "Activation memory per layer",
            question: "Llama-3.1-8B at 4,096 tokens, batch 1, bf16 with SDPA: how many bytes of activations does one more decoder layer keep for backward?",
            query: "model=llama-3.1-8b",
            compare: None,
            target: Target::PerLayer(Field::Activations),
            tolerance_pct: 5.0,
            hint: "Count the b·s·h tensors of the norms, projections and MLP — RMSNorm keeps fp32 copies, and the gated MLP four f-wide tensors.",
            explanation: "Each layer keeps its norms' fp32 inputs, the projections' inputs, q, k, v and the attention output, and the MLP's gate, up, activation and product — about 34·b·s·h bytes in the textbook formula, more in transformers' code (see the ledger rows).",
        },
        Exercise {
            id: "dominant-32k",
            title: "Long sequences",
            question: "Llama-3.1-8B at 32,768 tokens with SDPA: which category dominates now, and why?",
            query: "model=llama-3.1-8b&seq=32768",
            compare: None,
            target: Target::Dominant,
            tolerance_pct: 0.0,
            hint: "Activations grow with b·s; the model states do not.",
            explanation: "Activations grow linearly with the tokens (and quadratically in eager attention); at 32k tokens they outgrow the 16 bytes per parameter of the model states.",
        },
        Exercise {
            id: "flash-removes",
            title: "What FlashAttention removes",
            question: "Llama-3.1-8B at 4,096 tokens: how many bytes of activations does eager attention keep that SDPA/FlashAttention does not?",
            query: "model=llama-3.1-8b&attn=eager",
            compare: Some("model=llama-3.1-8b&attn=sdpa"),
            target: Target::Difference(rows(&["activations"])),
            tolerance_pct: 5.0,
            hint: "Eager attention materializes b·a·s² scores per layer, in fp32 and again in bf16.",
            explanation: "The s² terms: eager attention keeps the fp32 softmax and its bf16 cast (6·b·a·s² bytes per layer) and K, V repeated to every head; FlashAttention keeps q, k, v, the output and an fp32 log-sum-exp per row.",
        },
        Exercise {
            id: "op-sac-saves",
            title: "What selective checkpointing by op keeps",
            question: "Llama-3.1-8B at 8,192 tokens with SDPA on a GPU: how many bytes of activations does torchtitan's per-op selective checkpointing (recompute=op) save against keeping everything?",
            query: "model=llama-3.1-8b&seq=8192",
            compare: Some("model=llama-3.1-8b&seq=8192&recompute=op"),
            target: Target::Difference(rows(&["activations"])),
            tolerance_pct: 5.0,
            hint: "The policy keeps the outputs of every second matmul of a layer (q, v, gate, down), the attention kernel's output and log-sum-exp, and the layer input; everything else is recomputed.",
            explanation: "Per layer, op SAC keeps the layer input, q_proj's, v_proj's, gate_proj's and down_proj's outputs and SDPA's output and log-sum-exp; the norms' fp32 copies and outputs, k, the RoPE'd q and k, up, SiLU's output and the products are recomputed in backward (torchtitan 0.3.0, activation_checkpoint.py).",
        },
        Exercise {
            id: "compile-saves",
            title: "What torch.compile keeps",
            question: "Llama-3.1-8B at 8,192 tokens with SDPA on a GPU: how many bytes of activations does torch.compile, each decoder layer and the loss compiled as a region (compile=true), save against eager?",
            query: "model=llama-3.1-8b&seq=8192",
            compare: Some("model=llama-3.1-8b&seq=8192&compile=true"),
            target: Target::Difference(rows(&["activations"])),
            tolerance_pct: 5.0,
            hint: "AOTAutograd's partitioner keeps what it cannot recompute cheaply — matmul and SDPA outputs, what a matmul or SDPA reads in backward, the norms' rstd — and recomputes every pointwise value in backward.",
            explanation: "Per layer the compiled region keeps its input, the norms' rstd and outputs (matmul inputs), v, q and k after RoPE, SDPA's output and log-sum-exp, o_proj's output, gate, up and act(gate)·up; the RMSNorms' fp32 input copies, SiLU's output, RoPE's intermediates and the casts are recomputed from those in backward. The compiled loss keeps the logits instead of an fp32 log-softmax (torch 2.15, torch/_functorch/partitioners.py, min_cut_rematerialization_partition; validation/FINDINGS.md §15.1).",
        },
        Exercise {
            id: "fp8-not-half",
            title: "Why FP8 did not halve memory",
            question: "Llama-3.1-8B at 8,192 tokens on 8 H100s with ZeRO-3: the linears switch from bf16 to Transformer Engine's FP8 with delayed scaling (fp8=te-delayed). By how many bytes do the activations saved for backward change?",
            query: "model=llama-3.1-8b&seq=8192&gpus=8&zero=3",
            compare: Some("model=llama-3.1-8b&seq=8192&gpus=8&zero=3&fp8=te-delayed"),
            target: Target::Difference(rows(&["activations"])),
            tolerance_pct: 5.0,
            hint: "FP8 changes what each linear saves, not the 16 bytes per parameter of weights, gradients, master weights and moments. What does a te.Linear save for backward on Hopper, and what do the ops around it still keep in bf16?",
            explanation: "They grow. Each te.Linear quantizes its gathered weight every forward into FP8 data plus a transpose (Hopper: 2 bytes per parameter, the whole layer even under ZeRO-3) and saves it for backward, and saves its input in FP8 — beside the bf16 tensors transformers' RMSNorm and SDPA still keep for their own backward. Only where nothing else keeps a linear's input (the MLP's down projection) does FP8 halve it. The weights, gradients, fp32 master weights and moments do not change at all (Transformer Engine 2.20.2, module/linear.py and module/base.py; validation/FINDINGS.md §10.3).",
        },
        Exercise {
            id: "recompute-some",
            title: "Recompute only some layers",
            question: "Llama-3.1-8B at 8,192 tokens on Megatron's modules with flash attention: instead of recomputing every layer, Megatron's block method recomputes only the first 8 of the 32 (recompute_layers=8). How many more bytes of activations does the step keep?",
            query: "model=llama-3.1-8b&seq=8192&framework=megatron&attn=flash&precision=mixed-bf16&recompute=full",
            compare: Some("model=llama-3.1-8b&seq=8192&framework=megatron&attn=flash&precision=mixed-bf16&recompute=full&recompute_layers=8"),
            target: Target::Difference(rows(&["activations"])),
            tolerance_pct: 5.0,
            hint: "A recomputed layer keeps only its input; a layer that is not keeps every tensor its backward reads. How many layers stop being recomputed, and what does one of them keep at b·s = 8,192 tokens?",
            explanation: "24 layers stop being recomputed: each now keeps, besides its input, the norms' outputs, q, k and v, flash attention's output and log-sum-exp, the MLP's input and its three f-wide tensors — 24 × (what a layer keeps − its input). In exchange those 24 layers skip the second forward in backward: the step recomputes a quarter of what full recomputation does (Megatron-LM megatron/core/recompute.py checkpointed_forward, recompute_method = block).",
        },
        Exercise {
            id: "verify-allocated",
            title: "Verify with memory_allocated",
            question: "GPT-2 (124M) in fp32 with AdamW, batch 8 at 1,024 tokens: what will torch.cuda.memory_allocated() report right after the forward pass of a steady-state step?",
            query: "model=gpt2&precision=fp32&batch=8&seq=1024",
            compare: None,
            target: Target::Memory(Field::AfterForward),
            tolerance_pct: 5.0,
            hint: "Weights and optimizer states stay resident; gradients were freed by zero_grad(set_to_none=True); add what forward saved.",
            explanation: "Resident model states (weights and AdamW's moments) plus every activation saved for backward. Check it: call torch.cuda.memory_allocated() after the forward pass, or run `trainmem verify-script` for the same configuration.",
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::estimate;

    #[test]
    fn the_guess_example_is_far_from_the_answer_and_in_its_unit() {
        use crate::estimator::config::Unit;
        // The docs' 16Ψ exercise (llama-2-13b): 208.3 GB; the old fixed hint read "208 GB".
        let sixteen_psi = Answer::Bytes(208_300_000_000);
        for unit in [Unit::Gb, Unit::Gib] {
            let e = example_guess(&sixteen_psi, unit);
            assert!(!e.contains("208") && !e.contains("194"), "{e}");
            assert!(e.ends_with(if unit == Unit::Gb { " GB" } else { " GiB" }), "{e}");
        }
        let builtin = builtin();
        let answers = builtin.iter().filter_map(|ex| ex.answer().ok()).chain([
            sixteen_psi,
            Answer::Bytes(42_000_000_000),
            Answer::Count(8_030_261_248),
            Answer::Percent(35.0),
            Answer::BytesPerParameter(16.0),
        ]);
        for a in answers {
            if matches!(a, Answer::Category(_)) {
                continue;
            }
            let e = example_guess(&a, Unit::Gb);
            let written = e.trim_start_matches("e.g. ").trim_end_matches(" bytes per parameter");
            let c = check(&a, written, 50.0).expect("the example reads as a guess");
            assert!(!c.correct, "{a:?}: the example {e} lies within 50 % of the answer");
        }
    }

    #[test]
    fn every_builtin_exercise_has_a_computed_answer() {
        for ex in builtin() {
            let a = ex.answer().unwrap_or_else(|e| panic!("{}: {e}", ex.id));
            // The key is computed, so a guess of exactly the key is right and one 50 % off is not.
            let exact = match &a {
                Answer::Bytes(b) | Answer::Count(b) => b.to_string(),
                Answer::Percent(p) | Answer::BytesPerParameter(p) => p.to_string(),
                Answer::Category(c) => category_name(*c).to_string(),
            };
            assert!(check(&a, &exact, ex.tolerance_pct).is_some_and(|c| c.correct), "{}: {a:?}", ex.id);
            if let Answer::Bytes(b) = a {
                assert!(!check(&a, &(b as f64 * 1.5).to_string(), ex.tolerance_pct).is_some_and(|c| c.correct));
            }
        }
    }

    #[test]
    fn sixteen_psi_is_sixteen_bytes_per_parameter_of_llama_2_13b() {
        let ex = builtin().into_iter().find(|e| e.id == "sixteen-psi").expect("exists");
        // Ψ = 13,015,864,320 (the checkpoint's count); 16 × Ψ = 208,253,829,120 B.
        assert_eq!(ex.answer(), Ok(Answer::Bytes(16 * 13_015_864_320)));
    }

    #[test]
    fn the_optimizer_takes_three_quarters_of_the_model_states() {
        let ex = builtin().into_iter().find(|e| e.id == "optimizer-share").expect("exists");
        assert_eq!(ex.answer(), Ok(Answer::Percent(75.0)));
        let adam = builtin().into_iter().find(|e| e.id == "adam-fp32").expect("exists");
        assert_eq!(adam.answer(), Ok(Answer::BytesPerParameter(8.0)));
    }

    #[test]
    fn long_sequences_make_activations_dominate() {
        let short = builtin().into_iter().find(|e| e.id == "four-categories").expect("exists");
        assert_eq!(short.answer(), Ok(Answer::Category(Category::OptimizerStates)));
        let long = builtin().into_iter().find(|e| e.id == "dominant-32k").expect("exists");
        assert_eq!(long.answer(), Ok(Answer::Category(Category::Activations)));
    }

    #[test]
    fn compiling_keeps_less_and_fp8_on_hopper_keeps_more() {
        let acts = |q: &str| estimate(&decode_query(q).config).expect("estimates").memory.activations;
        let compile = builtin().into_iter().find(|e| e.id == "compile-saves").expect("exists");
        let fp8 = builtin().into_iter().find(|e| e.id == "fp8-not-half").expect("exists");
        // The compiled layers keep less than eager…
        assert!(acts(compile.compare.expect("B")) < acts(compile.query));
        // …and Transformer Engine's FP8 keeps more than bf16: its saved FP8 weight copies and
        // inputs come on top of what the norms and SDPA keep.
        let (bf16, te) = (acts(fp8.query), acts(fp8.compare.expect("B")));
        assert!(te > bf16, "{te} vs {bf16}");
        let Ok(Answer::Bytes(diff)) = fp8.answer() else { panic!("bytes") };
        assert_eq!(diff, te - bf16);
    }

    #[test]
    fn flash_attention_removes_the_quadratic_scores() {
        let ex = builtin().into_iter().find(|e| e.id == "flash-removes").expect("exists");
        let Ok(Answer::Bytes(diff)) = ex.answer() else { panic!("bytes") };
        // At least the fp32 softmax and its bf16 cast: 32 layers × 6 B × 32 heads × 4,096².
        assert!(diff >= 32 * 6 * 32 * 4096 * 4096);
    }

    /// Every built-in exercise's key, recomputed here from the estimator's own figures by a
    /// second route (the estimate's memory totals and parameter count, not the exercise code's
    /// row sums), so a wrong target or a typed-in number would fail.
    #[test]
    fn every_builtin_answer_matches_the_estimators_own_figures() {
        for ex in builtin() {
            let e = estimate(&ex.config()).expect("estimates");
            let m = &e.memory;
            let want = match ex.id {
                "four-categories" | "dominant-32k" => {
                    let by = |c: Category| e.components.iter().filter(|r| r.category == c).map(|r| r.bytes).sum::<u128>();
                    let best = Category::ALL.into_iter().max_by_key(|c| by(*c)).expect("categories");
                    Answer::Category(best)
                }
                // 16 bytes for each of the estimator's Ψ parameters (2 + 2 + 4 + 4 + 4).
                "sixteen-psi" => Answer::Bytes(16 * e.parameter_count as u128),
                "optimizer-share" => {
                    // The optimizer's master weights and moments against 16Ψ of model states.
                    let row = |id: &str| flatten(&e.components).into_iter().find(|r| r.id.as_str() == id).map_or(0, |r| r.bytes);
                    let states = 16 * e.parameter_count as u128;
                    Answer::Percent((row("master_weights") + row("optimizer_states")) as f64 * 100.0 / states as f64)
                }
                "adam-fp32" => {
                    let moments = flatten(&e.components)
                        .into_iter()
                        .find(|r| r.id == crate::estimator::ledger::RowId::OptimizerStates)
                        .map_or(0, |r| r.bytes);
                    Answer::BytesPerParameter(moments as f64 / e.parameter_count as f64)
                }
                "activations-per-layer" => {
                    let mut more = ex.config();
                    more.arch.layers += 1;
                    Answer::Bytes(estimate(&more).expect("estimates").memory.activations - m.activations)
                }
                "flash-removes" | "op-sac-saves" | "compile-saves" | "fp8-not-half" => {
                    let other = estimate(&ex.compare_config().expect("a B")).expect("estimates");
                    Answer::Bytes(m.activations.abs_diff(other.memory.activations))
                }
                "recompute-some" => {
                    // 24 of the 32 layers keep what no recomputation keeps instead of their
                    // input: 24/32 of the gap between recompute=none and recompute=full.
                    let none = Config { recompute: crate::config::Recompute::None, ..ex.config() };
                    let none = estimate(&none).expect("estimates").memory.activations;
                    Answer::Bytes((none - m.activations) * 24 / 32)
                }
                "verify-allocated" => {
                    // From the step's own stream: resident states + what is live once the loss
                    // is computed + the logits the caller still holds (fp32 here: b × s × V × 4).
                    let cfg = ex.config();
                    let s = crate::estimator::step_stream(&cfg).expect("simulates");
                    let last = s.events.iter().rposition(|e| e.phase <= crate::estimator::step::Phase::Loss).expect("a forward");
                    let logits = cfg.batch as u128 * cfg.seq as u128 * cfg.arch.vocab as u128 * 4;
                    Answer::Bytes(s.resident + s.events[last].live + logits)
                }
                other => panic!("the built-in exercise {other} has no independent check here: add one"),
            };
            assert_eq!(ex.answer(), Ok(want.clone()), "{}", ex.id);
            // Within its tolerance the exact key is right, and a guess twice the key is not.
            let exact = match &want {
                Answer::Bytes(b) | Answer::Count(b) => b.to_string(),
                Answer::Percent(p) | Answer::BytesPerParameter(p) => p.to_string(),
                Answer::Category(c) => category_name(*c).to_string(),
            };
            assert!(check(&want, &exact, ex.tolerance_pct).is_some_and(|c| c.correct), "{}", ex.id);
            if let Answer::Bytes(b) = want {
                assert!(!check(&want, &(2 * b).to_string(), ex.tolerance_pct).is_some_and(|c| c.correct), "{}", ex.id);
            }
        }
    }

    #[test]
    fn the_after_forward_answer_is_what_the_step_holds_once_the_loss_is_computed() {
        let cfg = crate::config::decode_query("model=gpt2&precision=fp32&batch=8&seq=1024").config;
        let e = estimate(&cfg).expect("valid");
        let Ok(Answer::Bytes(b)) = answer(&Target::Memory(Field::AfterForward), &cfg, None) else { panic!("bytes") };
        assert_eq!(b, crate::estimator::after_forward(&cfg).expect("valid"));
        // Weights and AdamW's two moments (fp32: 4 + 8 bytes per parameter) are resident, and the
        // saved activations and the logits come on top: more than the static states, less than
        // the step's allocated peak (backward adds gradients).
        assert!(b > e.memory.parameters + e.memory.optimizer_states + e.memory.activations / 2, "{b}");
        assert!(b <= e.memory.allocated_peak, "{b} vs {}", e.memory.allocated_peak);
    }

    #[test]
    fn targets_round_trip_through_their_link_spelling() {
        for spec in [
            "row:weights+gradients",
            "memory:peak",
            "share:optimizer_states/parameters+gradients",
            "per_param:optimizer_states",
            "per_layer:activations",
            "dominant",
            "diff:activations",
        ] {
            assert_eq!(Target::parse(spec).map(|t| t.spec()), Ok(spec.to_string()));
        }
        assert!(Target::parse("row:").is_err());
        assert!(Target::parse("memory:nope").is_err());
        assert!(Target::parse("guess").is_err());
    }

    #[test]
    fn guesses_are_read_with_units_and_separators() {
        assert_eq!(parse_number("208 GB"), Some(208e9));
        assert_eq!(parse_number("1,024"), Some(1024.0));
        assert_eq!(parse_number("2 GiB"), Some(2.0 * (1u64 << 30) as f64));
        assert_eq!(parse_number("75 %"), Some(75.0));
        assert_eq!(parse_number("lots"), None);
        let a = Answer::Bytes(1000);
        assert_eq!(check(&a, "1040", 5.0), Some(Check { correct: true, error_pct: 4.0 }));
        assert!(!check(&a, "1100", 5.0).is_some_and(|c| c.correct));
        assert!(check(&Answer::Category(Category::Activations), "Activations", 0.0).is_some_and(|c| c.correct));
    }

    #[test]
    fn an_unknown_row_is_named() {
        let cfg = Config::default();
        assert_eq!(answer(&Target::Rows(vec!["nonsense".into()]), &cfg, None), Err(ExerciseError::UnknownRow("nonsense".into())));
        assert_eq!(answer(&Target::Difference(vec!["activations".into()]), &cfg, None), Err(ExerciseError::NoComparison));
    }
}
