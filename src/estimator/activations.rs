//! Activation memory: the tensors autograd saves for backward, tensor by tensor, for the code the
//! user actually runs.
//!
//! By default this follows Hugging Face transformers' module code (5.x) on CUDA: what
//! `torch.autograd.graph.saved_tensors_hooks` sees at the end of the forward pass, the loss
//! included, each storage counted once. Every term below was measured in the validation harness
//! (`validation/FINDINGS.md`, checked to the byte against PyTorch); the `framework = megatron`
//! profile follows Korthikanti et al. 2022, §4.1 instead.
//!
//! Symbols: b micro-batch, s tokens per sequence on this GPU (s / cp), h hidden, a heads, k
//! key/value heads, d head dim, f MLP intermediate, V vocabulary, L layers on this GPU, p bytes
//! per compute element (2 in bf16), p_r bytes of the residual stream (4 under autocast), E
//! experts, K experts per token, r LoRA rank, t tensor-parallel degree.

use super::config::{Attention, Config, Finetune, Framework, Kernels, LoraTargets, Loss, Recompute};
use super::expr::{Expr, Sym};
use super::ledger::{Bytes, Category, Row};
use super::model::{Activation, MlpKind, NormKind, Positions, QkNorm};
use super::params::Stage;
use super::precision::{Dtype, Recipe, BOOL_BYTES, FP32_BYTES, INT64_BYTES};

pub const B: Sym = Sym::new("b", "", "micro-batch size");
pub const S: Sym = Sym::new("s", "", "tokens of a sequence on this GPU (seq / cp)");
pub const S_KV: Sym = Sym::new("s", "kv", "tokens attended to (the whole sequence)");
pub const H: Sym = Sym::new("h", "", "hidden size");
pub const A: Sym = Sym::new("a", "", "attention heads");
pub const KV: Sym = Sym::new("k", "", "key/value heads");
pub const D: Sym = Sym::new("d", "", "head dim");
pub const D_ROT: Sym = Sym::new("d", "rot", "rotary dims per head");
pub const F: Sym = Sym::new("f", "", "MLP intermediate size");
pub const F_E: Sym = Sym::new("f", "e", "expert intermediate size");
pub const F_S: Sym = Sym::new("f", "s", "shared-expert intermediate size (all shared experts)");
pub const V: Sym = Sym::new("V", "", "vocabulary size");
pub const E: Sym = Sym::new("E", "", "experts per MoE layer");
pub const K_TOP: Sym = Sym::new("K", "", "experts per token (top-k)");
pub const R: Sym = Sym::new("r", "", "LoRA rank");
pub const P: Sym = Sym::new("p", "", "bytes per activation element (compute dtype)");
pub const P_RES: Sym = Sym::new("p", "r", "bytes per residual-stream element (model dtype)");
pub const P_LIN: Sym = Sym::new("p", "lin", "bytes per saved GEMM input (fp8 under Transformer Engine)");
pub const L: Sym = Sym::new("L", "", "decoder layers on this GPU");
pub const L_MOE: Sym = Sym::new("L", "moe", "MoE layers on this GPU");
pub const L_DENSE: Sym = Sym::new("L", "dense", "dense-MLP layers on this GPU");
pub const T_TP: Sym = Sym::new("t", "", "tensor-parallel degree");
pub const M: Sym = Sym::new("m", "", "micro-batches in flight on this pipeline stage");

/// The sub-rows of the activation ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    Embedding,
    Norms,
    AttentionInputs,
    AttentionCore,
    Mlp,
    Moe,
    Lora,
    Dropout,
    Checkpoints,
    Autocast,
    Head,
    Loss,
}

impl Part {
    fn id(self) -> &'static str {
        match self {
            Part::Embedding => "activations.embedding",
            Part::Norms => "activations.norms",
            Part::AttentionInputs => "activations.attention_inputs",
            Part::AttentionCore => "activations.attention_core",
            Part::Mlp => "activations.mlp",
            Part::Moe => "activations.moe",
            Part::Lora => "activations.lora",
            Part::Dropout => "activations.dropout",
            Part::Checkpoints => "activations.checkpoints",
            Part::Autocast => "activations.autocast_weights",
            Part::Head => "activations.head",
            Part::Loss => "activations.loss",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Part::Embedding => "Embedding and positions",
            Part::Norms => "Norm layers",
            Part::AttentionInputs => "Attention projections' inputs",
            Part::AttentionCore => "Attention core (Q, K, V, scores, output)",
            Part::Mlp => "MLP",
            Part::Moe => "MoE router and experts",
            Part::Lora => "LoRA adapter intermediates",
            Part::Dropout => "Dropout masks",
            Part::Checkpoints => "Checkpointed layer inputs",
            Part::Autocast => "Autocast bf16 weight copies",
            Part::Head => "Final norm and LM-head input",
            Part::Loss => "Loss (fp32 log-softmax, targets)",
        }
    }
    fn source(self) -> &'static str {
        match self {
            Part::Norms => "transformers LlamaRMSNorm / Gemma2RMSNorm / nn.LayerNorm forward; validation/FINDINGS.md §2",
            Part::AttentionCore => {
                "transformers eager_attention_forward / sdpa_attention_forward; torch SDPA flash kernel; FINDINGS.md §2–3"
            }
            Part::Loss => "transformers loss_utils.ForCausalLMLoss: logits.float() → cross_entropy (log_softmax keeps its fp32 result)",
            Part::Checkpoints => "torch.utils.checkpoint (non-reentrant): each layer keeps its input; FINDINGS.md §4",
            Part::Autocast => "torch.autocast weight cache: bf16 copies of every GEMM weight are saved for backward (FINDINGS.md §5)",
            Part::Moe => "transformers MixtralSparseMoeBlock with grouped_mm experts; FINDINGS.md §2.2",
            Part::Lora => "peft LoraLayer: lora_B saves lora_A's output (b·s·r)",
            Part::Dropout => "torch native_dropout: a 1-byte bool mask per element on CUDA",
            _ => "transformers modeling code; validation/FINDINGS.md §2",
        }
    }
}

/// What one GPU keeps for backward, and the numbers the step simulation needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Activations {
    /// The ledger row (children by part); bytes = saved at the end of the forward pass.
    pub row: Row,
    /// Saved bytes of one decoder layer of one micro-batch.
    pub per_layer: Bytes,
    /// Saved bytes outside the layers before the head (embedding, positions) for one micro-batch.
    pub embedding: Bytes,
    /// Saved bytes of the final norm, head input and loss for one micro-batch (last stage).
    pub head_and_loss: Bytes,
    /// Micro-batches whose activations are alive at once on this stage (pipeline schedule).
    pub in_flight_num: u64,
    pub in_flight_den: u64,
    /// Transient buffers around the saved tensors.
    pub working: Working,
}

/// Per-term context: the numbers and their symbols.
struct Ctx<'a> {
    cfg: &'a Config,
    b: u64,
    s: u64,
    s_kv: u64,
    h: u64,
    a: u64,
    k: u64,
    d: u64,
    f: u64,
    v: u64,
    p: u64,
    p_res: u64,
    p_lin: u64,
    tp: u64,
    amp: bool,
    cuda: bool,
}

impl Ctx<'_> {
    /// The symbol bound to this configuration's value. Matched on first bytes: this runs for
    /// every factor of every term, on every estimate.
    fn v(&self, sym: Sym) -> Expr {
        let value: u64 = match (sym.base.as_bytes().first(), sym.sub.as_bytes().first()) {
            (Some(b'b'), None) => self.b,
            (Some(b's'), None) => self.s,
            (Some(b's'), Some(b'k')) => self.s_kv,
            (Some(b'h'), None) => self.h,
            (Some(b'a'), None) => self.a,
            (Some(b'k'), None) => self.k,
            (Some(b'd'), None) => self.d,
            (Some(b'f'), None) => self.f,
            (Some(b'V'), None) => self.v,
            (Some(b'p'), None) => self.p,
            (Some(b'p'), Some(b'r')) => self.p_res,
            (Some(b'p'), Some(b'l')) => self.p_lin,
            (Some(b't'), None) => self.tp,
            _ => 0,
        };
        Expr::var(sym, value)
    }
    /// Bytes per residual-stream element: its own symbol only when it differs from p.
    fn pr(&self) -> Expr {
        if self.p_res == self.p {
            self.v(P)
        } else {
            self.v(P_RES)
        }
    }
    /// Bytes per saved GEMM input.
    fn pl(&self) -> Expr {
        if self.p_lin == self.p {
            self.v(P)
        } else {
            self.v(P_LIN)
        }
    }
    fn fp32(&self) -> Expr {
        Expr::konst("FP32_BYTES", FP32_BYTES)
    }
    fn i64(&self) -> Expr {
        Expr::konst("INT64_BYTES", INT64_BYTES)
    }
    /// Product of a byte size and symbols: `4 × b × s × h`.
    fn t(&self, bytes: Expr, syms: &[Sym]) -> Expr {
        let mut v = vec![bytes];
        v.extend(syms.iter().map(|&s| self.v(s)));
        Expr::prod(v)
    }
    /// Divides a tensor-parallel-region term by t.
    fn tp_split(&self, e: Expr) -> Expr {
        if self.tp > 1 {
            e.ceil_div(self.v(T_TP))
        } else {
            e
        }
    }
    /// Divides a sequence-parallel-region term by t when sequence parallelism is on.
    fn sp_split(&self, e: Expr) -> Expr {
        if self.tp > 1 && self.cfg.sp {
            e.ceil_div(self.v(T_TP))
        } else {
            e
        }
    }
}

/// Accumulates terms by part, for one decoder layer and for the model's ends.
#[derive(Default)]
struct Terms {
    layer: Vec<(Part, Expr)>,
    moe_layer: Vec<(Part, Expr)>,
    dense_layer: Vec<(Part, Expr)>,
    first: Vec<(Part, Expr)>,
    last: Vec<(Part, Expr)>,
}

/// Which linears keep their input for the weight gradient (their weight is trainable or they
/// carry a LoRA adapter, whose A matrix keeps the same input).
struct Saves {
    qkv_in: bool,
    o_in: bool,
    mlp_in: bool,
    down_in: bool,
    norm_weight: bool,
    embedding: bool,
    head: bool,
}

fn saves(cfg: &Config) -> Saves {
    if cfg.finetune == Finetune::Full {
        return Saves { qkv_in: true, o_in: true, mlp_in: true, down_in: true, norm_weight: true, embedding: true, head: true };
    }
    let t = cfg.lora_targets;
    Saves {
        qkv_in: t.has(LoraTargets::Q) || t.has(LoraTargets::K) || t.has(LoraTargets::V),
        o_in: t.has(LoraTargets::O),
        mlp_in: t.has(LoraTargets::GATE) || t.has(LoraTargets::UP),
        down_in: t.has(LoraTargets::DOWN),
        norm_weight: false,
        embedding: false,
        head: false,
    }
}

/// The terms one norm keeps (per call).
fn norm_terms(c: &Ctx, kind: NormKind, saves_weight_input: bool, width: Sym) -> Vec<Expr> {
    let tokens = [B, S, width];
    match kind {
        // x.to(fp32) (pow's input), rsqrt [b,s,1] fp32, and weight * x.to(dtype)'s `x` when the
        // weight learns.
        NormKind::Rmsnorm => {
            let mut v = vec![c.t(c.fp32(), &tokens), c.t(c.fp32(), &[B, S])];
            if saves_weight_input {
                v.push(c.t(c.pr(), &tokens));
            }
            v
        }
        // Gemma: x.float(), rsqrt, (1 + weight.float()) [h], normalised x in fp32.
        NormKind::RmsnormGemma => {
            let mut v = vec![c.t(c.fp32(), &tokens), c.t(c.fp32(), &[B, S]), c.t(c.fp32(), &[width])];
            if saves_weight_input {
                v.push(c.t(c.fp32(), &tokens));
            }
            v
        }
        // native_layer_norm keeps its input, mean and rstd (fp32 on CUDA; the input dtype on CPU).
        NormKind::Layernorm | NormKind::LayernormNoBias => {
            let stats = if c.cuda {
                c.t(Expr::konst("2 × FP32_BYTES", 2 * FP32_BYTES), &[B, S])
            } else {
                Expr::prod([Expr::num(2u8), c.t(c.pr(), &[B, S])])
            };
            vec![c.t(c.pr(), &tokens), stats]
        }
        // OLMo: F.layer_norm(x.to(fp32)) without parameters: the fp32 input, fp32 mean and rstd.
        NormKind::Nonparametric => vec![c.t(c.fp32(), &tokens), c.t(Expr::konst("2 × FP32_BYTES", 2 * FP32_BYTES), &[B, S])],
    }
}

/// Bytes of eager attention's score matrices beyond Q/K/V.
fn eager_scores(c: &Ctx, t: &mut Terms, spec_softcap: bool, softmax_fp32: bool) {
    let scores = [B, A, S, S_KV];
    let mut push = |e: Expr| t.layer.push((Part::AttentionCore, c.tp_split(e)));
    if spec_softcap {
        // Gemma-2: tanh(scores / cap) keeps its result (model dtype).
        push(c.t(c.v(P), &scores));
    }
    let dropout = c.cfg.dropout > 0.0;
    if softmax_fp32 || c.amp {
        // softmax(dtype=fp32) keeps its fp32 result...
        push(c.t(c.fp32(), &scores));
        if dropout {
            // ... dropout keeps its mask and probs @ v keeps the dropped probabilities.
            let mask = if c.cuda { Expr::konst("BOOL_BYTES", BOOL_BYTES) } else { c.v(P) };
            push(c.t(mask, &scores));
            push(c.t(c.v(P), &scores));
        } else if c.p != FP32_BYTES {
            // ... and probs @ v keeps its cast to the compute dtype.
            push(c.t(c.v(P), &scores));
        }
    } else {
        // GPT-2: softmax in the model dtype.
        push(c.t(c.v(P), &scores));
        if dropout {
            let mask = if c.cuda { Expr::konst("BOOL_BYTES", BOOL_BYTES) } else { c.v(P) };
            push(c.t(mask, &scores));
            push(c.t(c.v(P), &scores));
        }
    }
}

/// Builds the activation ledger of one GPU of `stage`.
pub fn activations(cfg: &Config, recipe: &Recipe, stage: Stage, stage_layers: u64) -> Activations {
    let spec = &cfg.arch;
    let amp = recipe.autocast_weight_copy;
    let c = Ctx {
        cfg,
        b: cfg.batch,
        s: cfg.seq.div_ceil(cfg.cp.max(1)),
        s_kv: cfg.seq,
        h: spec.hidden,
        a: spec.heads,
        k: spec.kv_heads,
        d: spec.head_dim,
        f: spec.ffn,
        v: spec.vocab,
        p: recipe.compute.bytes(),
        p_res: if amp { recipe.weight.bytes() } else { recipe.compute.bytes() },
        p_lin: if recipe.fp8_weight_cache { Dtype::Fp8.bytes() } else { recipe.compute.bytes() },
        tp: cfg.tp,
        amp,
        cuda: cfg.kernels == Kernels::Cuda,
    };
    let sv = saves(cfg);
    let mut t = Terms::default();
    if cfg.framework == Framework::Megatron {
        megatron_terms(&c, &mut t);
    } else {
        hf_terms(&c, &sv, &mut t);
    }

    // Micro-batches in flight: 1F1B keeps min(pp, accum) on the first stage; interleaving
    // multiplies by 1 + (p − 1)/(p·v) (Korthikanti et al. 2022, §4.2.3).
    let (num, den) = match stage {
        Stage::Whole | Stage::Last => (1, 1),
        Stage::First | Stage::Middle => {
            let m = cfg.pp.min(cfg.accum).max(1);
            let m = if stage == Stage::Middle { m.div_ceil(2) } else { m };
            if cfg.vpp > 1 {
                (m * (cfg.pp * cfg.vpp + cfg.pp - 1), cfg.pp * cfg.vpp)
            } else {
                (m, 1)
            }
        }
    };

    let moe_layers = stage_layers.min(spec.moe_layers());
    let dense_layers = stage_layers - moe_layers;
    let l = Expr::var(L, stage_layers);
    let mut parts: Vec<Part> =
        t.layer.iter().chain(&t.moe_layer).chain(&t.dense_layer).chain(&t.first).chain(&t.last).map(|(p, _)| *p).collect();
    parts.sort();
    parts.dedup();
    // The numbers the step simulation needs, before the terms move into the rows.
    let eval = |v: &[(Part, Expr)]| -> Bytes { v.iter().map(|(_, e)| e.eval()).sum() };
    let per_moe = eval(&t.moe_layer);
    let per_dense = eval(&t.dense_layer);
    let per_layer = eval(&t.layer) + if spec.moe_layers() > 0 { per_moe.max(per_dense) } else { per_dense };
    let embedding = if stage.has_embedding() { eval(&t.first) } else { 0 };
    let head_and_loss = if stage.has_head() { eval(&t.last) } else { 0 };
    // Moves one part's terms out of a list (no clones: estimate() runs per keystroke and per
    // sweep point).
    let sum_of = |v: &mut Vec<(Part, Expr)>, p: Part| -> Option<Expr> {
        let terms: Vec<Expr> = v.extract_if(.., |(q, _)| *q == p).map(|(_, e)| e).collect();
        (!terms.is_empty()).then(|| Expr::sum_merged(terms))
    };
    let in_flight = |e: Expr| -> Expr {
        if num == 1 && den == 1 {
            e
        } else if den == 1 {
            Expr::prod([Expr::var(M, num), e])
        } else {
            Expr::prod([Expr::var(M, num), e]).ceil_div(Expr::num(den))
        }
    };
    let mut children = Vec::new();
    for p in parts {
        let mut terms = Vec::new();
        if let Some(e) = sum_of(&mut t.layer, p) {
            terms.push(Expr::prod([l.clone(), e]));
        }
        if moe_layers > 0 {
            if let Some(e) = sum_of(&mut t.moe_layer, p) {
                terms.push(Expr::prod([Expr::var(L_MOE, moe_layers), e]));
            }
        }
        if dense_layers > 0 {
            if let Some(e) = sum_of(&mut t.dense_layer, p) {
                let count = if spec.moe_layers() > 0 { Expr::var(L_DENSE, dense_layers) } else { l.clone() };
                terms.push(Expr::prod([count, e]));
            }
        }
        if stage.has_embedding() {
            if let Some(e) = sum_of(&mut t.first, p) {
                terms.push(e);
            }
        }
        let mut expr = if terms.is_empty() { None } else { Some(in_flight(Expr::sum(terms))) };
        if stage.has_head() {
            if let Some(e) = sum_of(&mut t.last, p) {
                expr = Some(match expr {
                    Some(x) => Expr::sum([x, e]),
                    None => e,
                });
            }
        }
        if let Some(e) = expr {
            let row = Row::new(p.id(), p.label(), Category::Activations, e, p.source());
            if row.bytes > 0 {
                children.push(row);
            }
        }
    }
    let mut row = Row::parent(
        "activations",
        "Activations (saved for backward)",
        Category::Activations,
        children,
        "sum of the parts; each part's formula is its own",
    );
    row.note = "bytes of the tensors autograd keeps at the end of the forward pass, loss included, each storage once; gradient accumulation does not change them (one micro-batch is alive at a time)".into();

    let mut working = working_memory(&c, cfg);
    if !stage.has_head() {
        working.loss_forward = Expr::zero();
        working.loss_backward = Expr::zero();
    }
    Activations { row, per_layer, embedding, head_and_loss, in_flight_num: num, in_flight_den: den, working }
}

/// Hugging Face transformers' tensors (FINDINGS.md §1).
fn hf_terms(c: &Ctx, sv: &Saves, t: &mut Terms) {
    let spec = &c.cfg.arch;
    let full_recompute = c.cfg.recompute == Recompute::Full;
    let eager = c.cfg.attn == Attention::Eager;
    let dropout = c.cfg.dropout > 0.0;
    let mask_bytes = || {
        if c.cuda {
            Expr::konst("BOOL_BYTES", BOOL_BYTES)
        } else {
            c.v(P)
        }
    };

    // ---- First stage: embedding and positions.
    if sv.embedding {
        t.first.push((Part::Embedding, c.t(c.i64(), &[B, S])));
    }
    if spec.norm == NormKind::RmsnormGemma {
        // Gemma scales the embedding by a 0-dim sqrt(h) tensor in the model dtype.
        t.first.push((Part::Embedding, c.pr()));
    }
    match spec.positions {
        Positions::Rope => {
            // cos and sin [1, s, d_rot], shared by every layer (position_ids has no batch).
            let d_rot = (spec.head_dim * spec.rotary_pct).div_ceil(100).max(1);
            let d_sym = if d_rot == spec.head_dim { c.v(D) } else { Expr::var(D_ROT, d_rot) };
            t.first.push((Part::Embedding, Expr::prod([Expr::num(2u8), c.pr(), c.v(S), d_sym])));
        }
        Positions::Learned => {
            // GPT-2's wpe keeps position_ids [1, s]; OPT's positions come from the mask, [b, s].
            let e = if spec.pos_offset > 0 { c.t(c.i64(), &[B, S]) } else { c.t(c.i64(), &[S]) };
            t.first.push((Part::Embedding, e));
        }
        Positions::None => {}
    }
    if dropout && spec.embed_dropout {
        t.first.push((Part::Dropout, c.sp_split(c.t(mask_bytes(), &[B, S, H]))));
    }
    if spec.embed_proj > 0 && sv.embedding {
        t.first.push((
            Part::Embedding,
            Expr::prod([c.pr(), c.v(B), c.v(S), Expr::var(Sym::new("e", "", "OPT word_embed_proj_dim"), spec.embed_proj)]),
        ));
    }

    // ---- Decoder layers.
    if full_recompute {
        // Each checkpointed layer keeps its input; the recompute closure keeps the kwargs once.
        t.layer.push((Part::Checkpoints, c.sp_split(c.t(c.pr(), &[B, S, H]))));
        if spec.positions == Positions::Rope {
            t.first.push((Part::Checkpoints, c.t(c.i64(), &[S])));
        }
        if eager {
            let masks: u8 = if spec.norm == NormKind::RmsnormGemma && spec.layer_norms == 4 { 2 } else { 1 };
            t.first.push((Part::Checkpoints, Expr::prod([Expr::num(masks), c.pr(), c.v(B), c.v(S), c.v(S_KV)])));
        }
    } else {
        layer_terms(c, sv, t);
    }

    // ---- Last stage: final norm, head input, loss.
    if spec.final_norm {
        for e in norm_terms(c, spec.norm, sv.norm_weight, H) {
            t.last.push((Part::Head, c.sp_split(e)));
        }
    }
    if sv.head {
        if spec.embed_proj > 0 {
            t.last.push((Part::Head, c.t(c.pr(), &[B, S, H])));
        }
        let width = if spec.embed_proj > 0 { Expr::var(Sym::new("e", "", "OPT word_embed_proj_dim"), spec.embed_proj) } else { c.v(H) };
        let p = if c.amp { Expr::konst("BF16_BYTES", 2u8) } else { c.pl() };
        t.last.push((Part::Head, Expr::prod([p, c.v(B), c.v(S), width])));
    }
    if c.amp {
        // The lm_head's (or tied embedding's) weight cast once to bf16.
        t.last.push((Part::Autocast, c.tp_split(Expr::prod([Expr::konst("BF16_BYTES", 2u8), c.v(V), c.v(H)]))));
    }
    if spec.softcap {
        // Gemma-2's final-logit soft-capping keeps tanh(logits / cap) in the model dtype.
        t.last.push((Part::Loss, c.tp_split(c.t(c.v(P), &[B, S, V]))));
    }
    match c.cfg.loss {
        Loss::Standard => {
            t.last.push((Part::Loss, c.tp_split(c.t(c.fp32(), &[B, S, V]))));
            // Labels are padded to s + 1 and sliced; for b = 1 the slice is already contiguous,
            // so the whole padded storage is kept.
            let target = if c.b == 1 { Expr::prod([c.i64(), Expr::sum([c.v(S), Expr::num(1u8)])]) } else { c.t(c.i64(), &[B, S]) };
            t.last.push((Part::Loss, target));
            t.last.push((Part::Loss, Expr::konst("NLL_TOTAL_WEIGHT_BYTES", FP32_BYTES)));
        }
        Loss::Chunked => {
            // Fused linear cross-entropy computes the input gradient during forward and keeps it.
            t.last.push((Part::Loss, c.t(c.v(P), &[B, S, H])));
            t.last.push((Part::Loss, c.t(c.i64(), &[B, S])));
        }
    }
}

fn layer_terms(c: &Ctx, sv: &Saves, t: &mut Terms) {
    let spec = &c.cfg.arch;
    let eager = c.cfg.attn == Attention::Eager;
    let dropout = c.cfg.dropout > 0.0;
    let selective = c.cfg.recompute == Recompute::Selective;
    let lora = c.cfg.finetune != Finetune::Full;
    let bf16 = || Expr::konst("BF16_BYTES", 2u8);
    let mask_bytes = || {
        if c.cuda {
            Expr::konst("BOOL_BYTES", BOOL_BYTES)
        } else {
            c.v(P)
        }
    };

    // Norms: pre-norm layers' norm outputs feed linears (counted as their inputs); Gemma-2's
    // post-norms and OLMo-2's feed the residual adds and keep nothing more.
    let shared_input = spec.parallel && spec.layer_norms == 2 && matches!(spec.norm, NormKind::Layernorm | NormKind::LayernormNoBias);
    for i in 0..spec.layer_norms {
        let mut terms = norm_terms(c, spec.norm, sv.norm_weight, H);
        if shared_input && i == 1 {
            // NeoX/Falcon-40B: both LayerNorms read the same residual; its storage counts once.
            terms.remove(0);
        }
        for e in terms {
            t.layer.push((Part::Norms, c.sp_split(e)));
        }
    }

    // Attention projections' input (q, k, v share it; under autocast each casts its own).
    let n_proj: u64 = if spec.fused_qkv { 1 } else { 3 };
    if sv.qkv_in {
        if c.amp {
            let e = Expr::prod([Expr::num(n_proj), bf16(), c.v(B), c.v(S), c.v(H)]);
            t.layer.push((Part::AttentionInputs, c.sp_split(e)));
        } else {
            t.layer.push((Part::AttentionInputs, c.sp_split(c.t(c.pl(), &[B, S, H]))));
        }
    }
    // q/k norms (Qwen3, Gemma-3 per head; OLMo-2 over all heads).
    match spec.qk_norm {
        QkNorm::None => {}
        QkNorm::Head | QkNorm::Full | QkNorm::PerHead => {
            for heads in [A, KV] {
                let width = [B, S, heads, D];
                let stats = if spec.qk_norm == QkNorm::Full { vec![B, S] } else { vec![B, S, heads] };
                let mut e = vec![c.t(c.fp32(), &width), c.t(c.fp32(), &stats)];
                if sv.norm_weight {
                    e.push(c.t(c.v(P), &width));
                }
                for x in e {
                    t.layer.push((Part::AttentionCore, c.tp_split(x)));
                }
            }
        }
    }

    // The attention core.
    let qc = |e| c.tp_split(e);
    let p_core = if c.amp { bf16() } else { c.v(P) };
    if selective {
        // The core is recomputed in backward: only its inputs q, k, v and its output stay.
        for heads in [A, KV, KV] {
            t.layer.push((Part::AttentionCore, qc(Expr::prod([p_core.clone(), c.v(B), c.v(S), c.v(heads), c.v(D)]))));
        }
        t.layer.push((Part::AttentionInputs, qc(c.t(p_core.clone(), &[B, S, A, D]))));
    } else if eager || (dropout && !c.cuda) {
        let math_fallback = !eager;
        if math_fallback {
            // CPU SDPA with dropout falls back to the math kernel: fp32 q, k, v at a heads, fp32
            // softmax, mask and dropped probabilities.
            for _ in 0..3 {
                t.layer.push((Part::AttentionCore, qc(c.t(c.fp32(), &[B, S, A, D]))));
            }
            for _ in 0..3 {
                t.layer.push((Part::AttentionCore, qc(c.t(c.fp32(), &[B, A, S, S_KV]))));
            }
        } else {
            // q, k repeated to a heads, v repeated (repeat_kv copies even for MHA).
            for _ in 0..3 {
                t.layer.push((Part::AttentionCore, qc(Expr::prod([p_core.clone(), c.v(B), c.v(S), c.v(A), c.v(D)]))));
            }
            eager_scores(c, t, spec.softcap, spec.softmax_fp32);
        }
        if sv.o_in {
            let p = if math_fallback { c.v(P) } else { p_core.clone() };
            t.layer.push((Part::AttentionInputs, qc(Expr::prod([p, c.v(B), c.v(S), c.v(A), c.v(D)]))));
        }
    } else {
        // SDPA / FlashAttention: q, k, v (k and v at k heads: enable_gqa), output, fp32 logsumexp.
        let rope = spec.positions == Positions::Rope;
        if spec.fused_qkv && !rope {
            // q, k, v are views of the fused output: its whole storage (GPT-2).
            let e = Expr::prod([p_core.clone(), c.v(B), c.v(S), Expr::sum([c.v(A), Expr::prod([Expr::num(2u8), c.v(KV)])]), c.v(D)]);
            t.layer.push((Part::AttentionCore, qc(e)));
        } else {
            t.layer.push((Part::AttentionCore, qc(Expr::prod([p_core.clone(), c.v(B), c.v(S), c.v(A), c.v(D)]))));
            t.layer.push((Part::AttentionCore, qc(Expr::prod([p_core.clone(), c.v(B), c.v(S), c.v(KV), c.v(D)]))));
            if spec.fused_qkv {
                // v is a view of the fused qkv output: the whole storage stays (Phi-3).
                let e = Expr::prod([p_core.clone(), c.v(B), c.v(S), Expr::sum([c.v(A), Expr::prod([Expr::num(2u8), c.v(KV)])]), c.v(D)]);
                t.layer.push((Part::AttentionCore, qc(e)));
            } else {
                t.layer.push((Part::AttentionCore, qc(Expr::prod([p_core.clone(), c.v(B), c.v(S), c.v(KV), c.v(D)]))));
            }
        }
        // The output; it is o_proj's input too unless RoPE's cat changed the layout (Phi-3).
        t.layer.push((Part::AttentionCore, qc(Expr::prod([p_core.clone(), c.v(B), c.v(S), c.v(A), c.v(D)]))));
        if spec.fused_qkv && rope && sv.o_in {
            t.layer.push((Part::AttentionInputs, qc(Expr::prod([p_core.clone(), c.v(B), c.v(S), c.v(A), c.v(D)]))));
        }
        t.layer.push((Part::AttentionCore, qc(c.t(c.fp32(), &[B, A, S]))));
    }
    if dropout && spec.resid_dropout {
        t.layer.push((Part::Dropout, c.sp_split(c.t(mask_bytes(), &[B, S, H]))));
    }

    // The MLP (dense layers) or MoE block.
    let mlp_in = |t: &mut Vec<(Part, Expr)>, part: Part, n_in: u64| {
        if c.amp {
            t.push((part, c.sp_split(Expr::prod([Expr::num(n_in), bf16(), c.v(B), c.v(S), c.v(H)]))));
        } else {
            t.push((part, c.sp_split(c.t(c.pl(), &[B, S, H]))));
        }
    };
    let parallel_shared = spec.parallel && spec.layer_norms == 1;
    let dense = &mut t.dense_layer;
    if sv.mlp_in && !(parallel_shared && sv.qkv_in && !c.amp) {
        let n_in = if spec.mlp == MlpKind::Gated && !spec.fused_gate_up { 2 } else { 1 };
        mlp_in(dense, Part::Mlp, n_in);
    }
    mlp_terms(c, sv, dense, F, Part::Mlp);
    if dropout && spec.resid_dropout {
        t.dense_layer.push((Part::Dropout, c.sp_split(c.t(mask_bytes(), &[B, S, H]))));
    }
    if spec.moe_layers() > 0 {
        let moe = &mut t.moe_layer;
        // The router's input (the norm output) is kept: the router's matmul saves it.
        mlp_in(moe, Part::Moe, 1);
        moe_terms(c, moe);
        if spec.shared_experts > 0 {
            mlp_terms(c, sv, moe, F_S, Part::Moe);
            if spec.shared_gate {
                // sigmoid(gate(x)) [b,s,1] and the shared output [b,s,h] meet in a product.
                moe.push((Part::Moe, c.t(c.v(P), &[B, S])));
                moe.push((Part::Moe, c.t(c.v(P), &[B, S, H])));
            }
        }
        if dropout && spec.resid_dropout {
            moe.push((Part::Dropout, c.sp_split(c.t(mask_bytes(), &[B, S, H]))));
        }
    }

    // LoRA: lora_B keeps lora_A's output (b·s·r) for each adapted linear.
    if lora {
        let targets = c.cfg.lora_targets;
        let count = |bits: &[u8]| bits.iter().filter(|&&b| targets.has(b)).count() as u64;
        let attn = if spec.fused_qkv {
            u64::from(count(&[LoraTargets::Q, LoraTargets::K, LoraTargets::V]) > 0)
        } else {
            count(&[LoraTargets::Q, LoraTargets::K, LoraTargets::V])
        } + count(&[LoraTargets::O]);
        let mlp = if spec.fused_gate_up {
            u64::from(count(&[LoraTargets::GATE, LoraTargets::UP]) > 0)
        } else {
            count(&[LoraTargets::GATE, LoraTargets::UP])
        } + count(&[LoraTargets::DOWN]);
        let r = Expr::var(R, c.cfg.lora_rank);
        if attn > 0 {
            t.layer.push((Part::Lora, Expr::prod([Expr::num(attn), c.v(P), c.v(B), c.v(S), r.clone()])));
        }
        if mlp > 0 {
            t.dense_layer.push((Part::Lora, Expr::prod([Expr::num(mlp), c.v(P), c.v(B), c.v(S), r.clone()])));
            if spec.moe_layers() > 0 {
                let k = Expr::var(K_TOP, spec.top_k);
                t.moe_layer.push((Part::Lora, Expr::prod([Expr::num(mlp), c.v(P), c.v(B), c.v(S), k, r])));
            }
        }
    }

    // Autocast's bf16 weight copies, per layer.
    if c.amp {
        let (qw, kvw) = (spec.q_width(), spec.kv_width());
        let attn = spec.hidden * (qw + 2 * kvw) + qw * spec.hidden;
        let w = Sym::new("W", "attn", "GEMM weight elements of one layer's attention");
        t.layer.push((Part::Autocast, c.tp_split(Expr::prod([bf16(), Expr::var(w, attn)]))));
        let mats: u64 = if spec.mlp == MlpKind::Gated { 3 } else { 2 };
        let wm = Sym::new("W", "mlp", "GEMM weight elements of one layer's MLP");
        t.dense_layer.push((Part::Autocast, c.tp_split(Expr::prod([bf16(), Expr::var(wm, mats * spec.hidden * spec.ffn)]))));
        if spec.moe_layers() > 0 {
            // The router linear casts its weight; grouped_mm experts have no autocast policy.
            let wr = Sym::new("W", "router", "router weight elements");
            t.moe_layer.push((Part::Autocast, Expr::prod([bf16(), Expr::var(wr, spec.experts * spec.hidden)])));
        }
    }
}

/// MLP intermediates of width `width` (f, or the shared experts' f_s).
fn mlp_terms(c: &Ctx, sv: &Saves, out: &mut Vec<(Part, Expr)>, width: Sym, part: Part) {
    let spec = &c.cfg.arch;
    let fw = if width == F { c.v(F) } else { Expr::var(F_S, spec.shared_ffn * spec.shared_experts) };
    let p = if c.amp { Expr::konst("BF16_BYTES", 2u8) } else { c.v(P) };
    let term = |bytes: Expr| c.tp_split(Expr::prod([bytes, c.v(B), c.v(S), fw.clone()]));
    match (spec.mlp, spec.act) {
        (MlpKind::Gated, _) => {
            // act(gate) keeps gate; act(gate) · up keeps both factors; down keeps the product.
            if spec.fused_gate_up {
                // The activation keeps a view of the fused [b,s,2f] output: its whole storage.
                out.push((part, term(Expr::prod([Expr::num(2u8), p.clone()]))));
            } else {
                out.push((part, term(p.clone())));
                out.push((part, term(p.clone())));
            }
            out.push((part, term(p.clone())));
            if sv.down_in {
                out.push((part, term(c.pl())));
            }
        }
        (MlpKind::Plain, Activation::GeluNew) => {
            // gelu_new as Python ops keeps x, tanh(·), 0.5·x and 1 + tanh(·).
            out.push((part, term(Expr::prod([Expr::num(4u8), p.clone()]))));
            if sv.down_in {
                out.push((part, term(c.pl())));
            }
        }
        (MlpKind::Plain, Activation::Relu) => {
            // ReLU keeps its output, which is also fc2's input.
            out.push((part, term(p.clone())));
        }
        (MlpKind::Plain, _) => {
            // GELU/SiLU keep their input; fc2 keeps the activation's output.
            out.push((part, term(p.clone())));
            if sv.down_in {
                out.push((part, term(c.pl())));
            }
        }
    }
}

/// Mixtral-style MoE with grouped_mm experts (FINDINGS.md §2.2): sizes depend only on
/// S = b·s·K token–expert pairs, not on the routing.
fn moe_terms(c: &Ctx, out: &mut Vec<(Part, Expr)>) {
    let spec = &c.cfg.arch;
    let e = Expr::var(E, spec.experts);
    let k = Expr::var(K_TOP, spec.top_k);
    let fe = Expr::var(F_E, spec.expert_ffn);
    let fp32 = c.fp32();
    let i64b = c.i64();
    let bs = || [c.v(B), c.v(S)];
    let pairs = |bytes: Expr, more: &[Expr]| {
        let mut v = vec![bytes];
        v.extend(bs());
        v.push(k.clone());
        v.extend(more.iter().cloned());
        Expr::prod(v)
    };
    // Router: fp32 softmax [T,E], top-k indices (int64) and values (fp32), their sum.
    out.push((Part::Moe, Expr::prod([fp32.clone(), c.v(B), c.v(S), e.clone()])));
    out.push((Part::Moe, pairs(i64b.clone(), &[])));
    out.push((Part::Moe, pairs(fp32.clone(), &[])));
    out.push((Part::Moe, c.t(fp32.clone(), &[B, S])));
    // Experts: 3 int64 index tensors, int32 offsets [E], gathered tokens, gate_up [S,2f_e],
    // act(gate), down input, fp32 routing weights, down output.
    let pe = if c.amp { c.pr() } else { c.v(P) };
    out.push((Part::Moe, pairs(Expr::prod([Expr::num(3u8), i64b]), &[])));
    out.push((Part::Moe, Expr::prod([Expr::konst("INT32_BYTES", 4u8), e])));
    out.push((Part::Moe, pairs(pe.clone(), &[c.v(H)])));
    out.push((Part::Moe, pairs(Expr::prod([Expr::num(2u8), pe.clone()]), &[fe.clone()])));
    out.push((Part::Moe, pairs(pe.clone(), &[fe.clone()])));
    out.push((Part::Moe, pairs(pe.clone(), &[fe])));
    out.push((Part::Moe, pairs(fp32, &[])));
    out.push((Part::Moe, pairs(pe, &[c.v(H)])));
}

/// Megatron-LM's tensor list (Korthikanti et al. 2022, §4.1, generalized to GQA, gated MLPs and
/// flash attention): per layer attention 2sbh (QKV input) + 2sb(a+2k)d (Q, K, V) +
/// [unfused: 2as²b scores + as²b mask + 2as²b dropout output | flash: 2sbad output + 4abs lse]
/// + 2sbad (projection input) + sbh (dropout mask); MLP 2sbh + f-sized intermediates + sbh mask;
/// two LayerNorm inputs 2 × 2sbh.
fn megatron_terms(c: &Ctx, t: &mut Terms) {
    let spec = &c.cfg.arch;
    let dropout = c.cfg.dropout > 0.0;
    let full = c.cfg.recompute == Recompute::Full;
    let selective = c.cfg.recompute == Recompute::Selective;
    t.first.push((Part::Embedding, c.t(c.i64(), &[B, S])));
    if full {
        t.layer.push((Part::Checkpoints, c.sp_split(c.t(c.v(P), &[B, S, H]))));
    } else {
        for _ in 0..2 {
            t.layer.push((Part::Norms, c.sp_split(c.t(c.v(P), &[B, S, H]))));
        }
        t.layer.push((Part::AttentionInputs, c.sp_split(c.t(c.pl(), &[B, S, H]))));
        let qkv = Expr::prod([c.v(P), c.v(B), c.v(S), Expr::sum([c.v(A), Expr::prod([Expr::num(2u8), c.v(KV)])]), c.v(D)]);
        t.layer.push((Part::AttentionCore, c.tp_split(qkv)));
        if !selective {
            if c.cfg.attn == Attention::Eager {
                let scores = [B, A, S, S_KV];
                t.layer.push((Part::AttentionCore, c.tp_split(c.t(c.v(P), &scores))));
                if dropout {
                    t.layer.push((Part::AttentionCore, c.tp_split(c.t(Expr::konst("BOOL_BYTES", BOOL_BYTES), &scores))));
                    t.layer.push((Part::AttentionCore, c.tp_split(c.t(c.v(P), &scores))));
                }
            } else {
                t.layer.push((Part::AttentionCore, c.tp_split(c.t(c.fp32(), &[B, A, S]))));
            }
        }
        t.layer.push((Part::AttentionInputs, c.tp_split(c.t(c.pl(), &[B, S, A, D]))));
        t.dense_layer.push((Part::Mlp, c.sp_split(c.t(c.pl(), &[B, S, H]))));
        let f_elems: u8 = if spec.mlp == MlpKind::Gated { 3 } else { 2 };
        t.dense_layer.push((Part::Mlp, c.tp_split(Expr::prod([Expr::num(f_elems), c.v(P), c.v(B), c.v(S), c.v(F)]))));
        if dropout {
            for _ in 0..2 {
                t.layer.push((Part::Dropout, c.sp_split(c.t(Expr::konst("BOOL_BYTES", BOOL_BYTES), &[B, S, H]))));
            }
        }
        if spec.moe_layers() > 0 {
            moe_terms(c, &mut t.moe_layer);
        }
    }
    t.last.push((Part::Head, c.sp_split(c.t(c.v(P), &[B, S, H]))));
    t.last.push((Part::Head, c.t(c.pl(), &[B, S, H])));
    // Vocab-parallel cross-entropy keeps the fp32 logits shard.
    t.last.push((Part::Loss, c.tp_split(c.t(c.fp32(), &[B, S, V]))));
}

/// Working memory beyond what is saved, as formulas (for the transient rows and the step).
#[derive(Clone, Debug, PartialEq)]
pub struct Working {
    /// Unsaved intermediates inside one layer's forward (eager: raw scores and their fp32 upcast).
    pub layer_forward: Expr,
    /// Eager attention's additive mask, alive for the whole forward.
    pub mask_forward: Expr,
    /// Gradients of one layer's largest intermediates, alive at once in its backward.
    pub layer_backward: Expr,
    /// The saved tensors of one layer, re-materialized in its backward (full recomputation).
    pub recompute_layer: Expr,
    /// Logits and their fp32 copy while the loss runs forward.
    pub loss_forward: Expr,
    /// dL/dlog_probs and dL/dlogits (fp32) beside the saved log_probs in the loss's backward.
    pub loss_backward: Expr,
}

/// Estimates of the transient buffers around the saved ones:
/// - eager forward: the raw scores and their fp32 upcast before softmax, (p + 4)·b·a·s·s_kv,
///   and the additive mask p·b·s·s_kv (transformers' `create_causal_mask`);
/// - backward of a layer: the gradients of its largest intermediates alive at once (eager: dS
///   in fp32 and dP in p, plus dq, dk, dv; SDPA: FlashAttention's fp32 dq accumulator and dq,
///   dk, dv; MLP: three f-wide gradients) plus the incoming gradient p·b·s·h;
/// - loss forward: the logits (p) and their fp32 copy (`logits.float()`); loss backward:
///   dL/dlog_probs and dL/dlogits, both fp32 (torch log_softmax_backward).
fn working_memory(c: &Ctx, cfg: &Config) -> Working {
    let spec = &cfg.arch;
    let eager = cfg.attn == Attention::Eager;
    let p4 = || Expr::sum([c.v(P), c.fp32()]);
    let zero = Expr::zero;
    let layer_forward = if eager { c.tp_split(Expr::prod([p4(), c.v(B), c.v(A), c.v(S), c.v(S_KV)])) } else { zero() };
    let mask_forward = if eager { c.t(c.v(P), &[B, S, S_KV]) } else { zero() };
    let attn_bwd = if eager {
        Expr::sum([
            c.tp_split(Expr::prod([p4(), c.v(B), c.v(A), c.v(S), c.v(S_KV)])),
            c.tp_split(Expr::prod([Expr::num(3u8), c.v(P), c.v(B), c.v(S), c.v(A), c.v(D)])),
        ])
    } else {
        Expr::sum([
            c.tp_split(Expr::prod([p4(), c.v(B), c.v(S), c.v(A), c.v(D)])),
            c.tp_split(Expr::prod([Expr::num(2u8), c.v(P), c.v(B), c.v(S), c.v(KV), c.v(D)])),
        ])
    };
    let width = if spec.ffn >= spec.expert_ffn * spec.top_k {
        c.v(F)
    } else {
        Expr::prod([Expr::var(K_TOP, spec.top_k), Expr::var(F_E, spec.expert_ffn)])
    };
    let mlp_bwd = c.tp_split(Expr::prod([Expr::num(3u8), c.v(P), c.v(B), c.v(S), width]));
    let layer_backward = Expr::sum([Expr::Max(vec![attn_bwd, mlp_bwd]), c.t(c.v(P), &[B, S, H])]);
    let (loss_forward, loss_backward) = match cfg.loss {
        Loss::Standard => {
            let logits = c.tp_split(c.t(c.v(P), &[B, S, V]));
            let fwd = if c.p == FP32_BYTES { logits } else { Expr::sum([logits, c.tp_split(c.t(c.fp32(), &[B, S, V]))]) };
            (fwd, c.tp_split(Expr::prod([Expr::num(2u8), c.fp32(), c.v(B), c.v(S), c.v(V)])))
        }
        Loss::Chunked => {
            // Liger's chunk: ⌈b·s / ⌈V/h⌉⌉ rows of fp32 logits and their gradient.
            let rows = (c.b * c.s).div_ceil(c.v.div_ceil(c.h.max(1)).max(1));
            let n = Sym::new("n", "chunk", "rows of a loss chunk: ⌈b·s / ⌈V/h⌉⌉ (Liger)");
            (c.tp_split(Expr::prod([Expr::num(2u8), c.fp32(), Expr::var(n, rows), c.v(V)])), zero())
        }
    };
    let recompute_layer = if cfg.recompute == Recompute::Full {
        let c2 = Config { recompute: Recompute::None, pp: 1, ..cfg.clone() };
        let r = super::precision::recipe(cfg.precision);
        let one = activations(&c2, &r, Stage::Whole, 1);
        Expr::var(Sym::new("A", "layer", "saved bytes of one layer, recomputed"), one.per_layer)
    } else {
        zero()
    };
    Working { layer_forward, mask_forward, layer_backward, recompute_layer, loss_forward, loss_backward }
}

/// The closed formulas the seed material teaches, for the same configuration, to set beside the
/// exact accounting.
pub fn textbook_rows(cfg: &Config) -> Vec<Row> {
    let spec = &cfg.arch;
    let (b, s, h, a) = (cfg.batch, cfg.seq, spec.hidden, spec.heads);
    let l = Expr::var(L, spec.layers);
    let vb = Expr::var(B, b);
    let vs = Expr::var(Sym::new("s", "", "sequence length"), s);
    let vh = Expr::var(H, h);
    let va = Expr::var(A, a);
    // Korthikanti et al. 2022, eq. (1): sbh(34 + 5as/h) bytes per layer (fp16, dropout on,
    // 4h MLP, no tensor parallelism) = 34·sbh + 5·as²b.
    let korthikanti = Expr::prod([
        l.clone(),
        Expr::sum([
            Expr::prod([Expr::num(34u8), vs.clone(), vb.clone(), vh.clone()]),
            Expr::prod([Expr::num(5u8), va.clone(), vs.clone(), vs.clone(), vb.clone()]),
        ]),
    ]);
    // The seed material: 2 bytes × (22·bsh + 2·bas²) per layer.
    let seed = Expr::prod([
        l,
        Expr::num(2u8),
        Expr::sum([Expr::prod([Expr::num(22u8), vb.clone(), vs.clone(), vh]), Expr::prod([Expr::num(2u8), vb, va, vs.clone(), vs])]),
    ]);
    vec![
        Row::new("textbook.korthikanti", "Korthikanti et al.: sbh(34 + 5as/h) per layer", Category::Activations, korthikanti, "Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models, eq. (1)")
            .note("assumes fp16, dropout, a 4h GELU MLP with no gating, multi-head attention with scores materialized, and no loss"),
        Row::new("textbook.seed", "Seed formula: 2 × (22·bsh + 2·bas²) per layer", Category::Activations, seed, "the course's seed material (bf16, materialized scores and probabilities)")
            .note("counts elements of a generic layer in bf16; ignores the fp32 copies real frameworks keep (norm upcasts, fp32 softmax) and the loss"),
    ]
}

/// Bytes eager attention keeps for its score matrices in one layer, as transformers' eager path
/// saves them: the fp32 softmax result and its cast to the compute dtype, (4 + p)·b·a·s² (only
/// 4·b·a·s² in fp32) — the s² term the benchmark materializes.
pub fn eager_score_bytes(batch: u64, heads: u64, seq: u64, compute_bytes: u64) -> Bytes {
    let per_element = FP32_BYTES + if compute_bytes == FP32_BYTES { 0 } else { compute_bytes };
    batch as u128 * heads as u128 * seq as u128 * seq as u128 * per_element as u128
}

/// Why the textbook formulas differ from what the framework keeps, for this configuration.
pub fn textbook_differences(cfg: &Config) -> Vec<String> {
    let spec = &cfg.arch;
    let r = super::precision::recipe(cfg.precision);
    let mut out = Vec::new();
    if cfg.framework == Framework::Hf {
        match spec.norm {
            NormKind::Rmsnorm => out.push("each RMSNorm keeps an fp32 copy of its input (4·bsh) and an fp32 rsqrt besides the normalised input — the formulas count one 2-byte tensor per norm".to_string()),
            NormKind::RmsnormGemma => out.push("Gemma's RMSNorm keeps its input and its normalised output in fp32 (8·bsh per norm), four norms per layer".to_string()),
            _ => {}
        }
        if cfg.attn == Attention::Eager {
            if spec.softmax_fp32 || r.autocast_weight_copy {
                out.push("eager attention keeps the softmax in fp32 (4·bas²) and its cast to the compute dtype (2·bas²): 6·bas² per layer rather than the textbook's 4–5·bas²".to_string());
            }
            if spec.kv_heads < spec.heads {
                out.push(format!("eager attention repeats K and V to all {} heads (repeat_kv copies), so grouped-query attention saves no activation memory there", spec.heads));
            }
        } else {
            out.push("SDPA/FlashAttention keep no s² term: only Q, K, V, the output and an fp32 log-sum-exp per row — the 5as/h (or 2bas²) term vanishes".to_string());
            if spec.kv_heads < spec.heads {
                out.push(format!(
                    "SDPA keeps K and V at the {} key/value heads (enable_gqa), fewer bytes than the formulas' a heads",
                    spec.kv_heads
                ));
            }
        }
        if spec.mlp == MlpKind::Gated {
            out.push(format!("the gated MLP keeps four f-wide tensors (gate, act(gate), up, their product) with f = {}, not the 4h GELU MLP the formulas assume", spec.ffn));
        } else if spec.act == Activation::GeluNew {
            out.push("gelu_new is written as Python tensor ops, so autograd keeps x, tanh(·), 0.5·x and 1 + tanh(·): four f-wide tensors for the activation alone".to_string());
        }
        if cfg.loss == Loss::Standard {
            out.push(format!("the loss keeps fp32 log-probabilities of b·s·V = {} × {} × {} elements — absent from per-layer formulas, and large with big vocabularies", cfg.batch, cfg.seq, spec.vocab));
        }
        if cfg.dropout == 0.0 {
            out.push("with dropout 0 there are no dropout masks, which Korthikanti's 34 and 5 include".to_string());
        }
        if r.compute == Dtype::Fp32 {
            out.push("in fp32 every activation takes 4 bytes, twice the formulas' 2".to_string());
        }
        if r.autocast_weight_copy {
            out.push(
                "autocast keeps a bf16 copy of every GEMM weight for backward and casts each projection's input separately".to_string(),
            );
        }
        if cfg.recompute == Recompute::Full {
            out.push(
                "with full recomputation each layer keeps only its input; compare with the formulas' full-recompute 2·sbh".to_string(),
            );
        }
    } else {
        out.push(
            "the megatron profile follows Korthikanti et al.'s own tensor list, generalized to GQA, gated MLPs and flash attention"
                .to_string(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::config::Precision;
    use crate::estimator::precision::recipe;

    fn acts(cfg: &Config) -> Activations {
        activations(cfg, &recipe(cfg.precision), Stage::Whole, cfg.arch.layers)
    }

    /// The worked example of FINDINGS.md: llama-gqa b2 s64 bf16 sdpa, T = 128, h = 64, a = 4,
    /// k = 2, d = 16, f = 176, V = 1000, 2 layers →
    /// layer = 65,536 + 1,024 + 4·16,384 + 32,768 + 16,384 + 2,048 + 180,224 = 363,520;
    /// ends = 1,024 + 4,096 + 49,664 + 16,384 + 512,000 + 1,024 + 4 = 584,196; total 1,311,236.
    #[test]
    fn the_findings_worked_example_comes_out_to_the_byte() {
        let mut cfg = Config { batch: 2, seq: 64, precision: Precision::Bf16, kernels: Kernels::Cpu, ..Config::default() };
        let a = &mut cfg.arch;
        (a.vocab, a.hidden, a.layers, a.heads, a.kv_heads, a.head_dim, a.ffn) = (1000, 64, 2, 4, 2, 16, 176);
        let x = acts(&cfg);
        assert_eq!(x.per_layer, 363_520);
        assert_eq!(x.row.bytes, 1_311_236);
    }

    #[test]
    fn eager_attention_keeps_quadratic_scores_that_sdpa_does_not() {
        let sdpa = acts(&Config::default()).row.bytes;
        let eager = acts(&Config { attn: Attention::Eager, ..Config::default() }).row.bytes;
        // 32 layers × (4 + 2) bytes × a·s² = 32 × 6 × 32 × 4096² more, minus sdpa's linear terms.
        assert!(eager > sdpa + 32 * 6 * 32 * 4096 * 4096 - 32 * 4 * 4096 * 4096);
    }

    #[test]
    fn full_recomputation_keeps_one_input_per_layer() {
        let cfg = Config { recompute: Recompute::Full, ..Config::default() };
        let x = acts(&cfg);
        let ckpt = x.row.children.iter().find(|r| r.id == "activations.checkpoints").map(|r| r.bytes);
        // 32 layers × b·s·h × 2 B + position_ids 8·s.
        assert_eq!(ckpt, Some(32 * 4096 * 4096 * 2 + 8 * 4096));
    }

    #[test]
    fn the_loss_of_a_128k_vocabulary_is_a_large_share() {
        let x = acts(&Config::default());
        let loss = x.row.children.iter().find(|r| r.id == "activations.loss").map_or(0, |r| r.bytes);
        // 4 B × 4096 × 128,256 fp32 log-probabilities ≈ 2.1 GB.
        assert!(loss >= 4 * 4096 * 128_256);
    }

    #[test]
    fn the_differences_name_what_llama_keeps_beyond_the_formulas() {
        let notes = textbook_differences(&Config::default()).join("\n");
        assert!(notes.contains("fp32 copy"), "{notes}");
        assert!(notes.contains("log-probabilities"), "{notes}");
        assert!(notes.contains("no s² term"), "{notes}");
    }

    #[test]
    fn every_symbol_the_terms_use_is_bound_to_its_value() {
        let cfg = Config::default();
        let r = recipe(cfg.precision);
        let x = activations(&cfg, &r, Stage::Whole, 32);
        let mut unbound = Vec::new();
        for row in &x.row.children {
            for (s, v) in row.expr.symbols() {
                if v == 0 {
                    unbound.push(format!("{}_{} in {}", s.base, s.sub, row.id));
                }
            }
        }
        assert!(unbound.is_empty(), "{unbound:?}");
    }

    #[test]
    fn eager_scores_cost_six_bytes_per_element_in_bf16_and_four_in_fp32() {
        assert_eq!(eager_score_bytes(1, 32, 1024, 2), 6 * 32 * 1024 * 1024);
        assert_eq!(eager_score_bytes(2, 1, 10, 4), 4 * 2 * 100);
    }

    #[test]
    fn the_textbook_formulas_evaluate_as_written() {
        let cfg = Config { batch: 1, seq: 2, ..Config::default() };
        let rows = textbook_rows(&cfg);
        // Korthikanti: 32 × (34·2·1·4096 + 5·32·2·2·1) = 32 × (278,528 + 640).
        assert_eq!(rows[0].bytes, 32 * (278_528 + 640));
        // Seed: 32 × 2 × (22·1·2·4096 + 2·1·32·2·2).
        assert_eq!(rows[1].bytes, 32 * 2 * (180_224 + 256));
    }
}
