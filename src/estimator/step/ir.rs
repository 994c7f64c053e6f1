//! The op-level program of a training step: tensors, the ops that make them, what each op saves
//! for backward and how its autograd node allocates — the single source of the activation ledger,
//! the step's event stream and the peak.
//!
//! A [`Program`] is built by a [`Builder`] whose methods mirror transformers' modeling code line
//! by line (see `blocks.rs`): every aten op the code dispatches becomes an [`Op`] with its output
//! tensors (or views), the tensors its autograd node saves, and a small backward script
//! ([`B`]) that says what the node allocates, in the order PyTorch allocates it. Python scopes
//! are explicit: a tensor lives until its last use or until the local that names it is rebound
//! ([`Builder::hold`]), whichever is later, unless an autograd node saved it.
//!
//! Every tensor's size is an [`Expr`] in the activation symbols (`b`, `s`, `h`, …): the saved
//! ones make the ledger's formulas, and inside `expr::numbers_only` they fold to numbers.

use super::super::ctx::{Ctx, Q};
use super::super::expr::{Expr, Sym};
use super::super::precision::{BF16_BYTES, BOOL_BYTES, INT64_BYTES};
use crate::estimator::part::Part;
use serde::Serialize;

/// A tensor of a program.
pub type Tid = u32;
/// No tensor.
pub const NO_TENSOR: Tid = u32::MAX;
/// An op index that is never reached: held until the program's end.
pub const FOREVER: u32 = u32::MAX;
/// Held until the forward pass ends (autocast's weight-cast cache, cleared when the autocast
/// context exits after the model call).
pub const FWD_END: u32 = u32::MAX - 1;

/// Element type of a tensor as PyTorch stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Fp32,
    Bf16,
    Fp16,
    Fp8,
    I64,
    I32,
    Bool,
    /// fp64 (torchao's scale arithmetic).
    F64,
}

impl DType {
    pub fn bytes(self) -> u64 {
        match self {
            DType::Fp32 | DType::I32 => 4,
            DType::Bf16 | DType::Fp16 => 2,
            DType::Fp8 | DType::Bool => 1,
            DType::I64 | DType::F64 => 8,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::Fp32 => "float32",
            DType::Bf16 => "bfloat16",
            DType::Fp16 => "float16",
            DType::Fp8 => "float8",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::Bool => "bool",
            DType::F64 => "float64",
        }
    }
    /// The tensor dtype of a precision recipe's element type.
    pub fn of(d: super::super::precision::Dtype) -> DType {
        use super::super::precision::Dtype as P;
        match d {
            P::Fp32 => DType::Fp32,
            P::Bf16 => DType::Bf16,
            P::Fp16 => DType::Fp16,
            P::Fp8 => DType::Fp8,
        }
    }
}

/// A dtype as the modeling code names it: the model's compute dtype, the residual stream's, or
/// a fixed one (`.to(torch.float32)`, token ids). Resolved to a [`DType`] and to the symbol its
/// bytes show in a formula (`p`, `p_r`, `FP32_BYTES`, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dt {
    /// The dtype activations are computed in (`p`).
    Model,
    /// The residual stream's dtype (`p_r`: fp32 under autocast).
    Resid,
    /// A GEMM input as saved (`p_lin`: fp8 under Transformer Engine).
    Lin,
    F32,
    Bf16,
    I64,
    I32,
    Bool,
    /// Fixed fp16 (GPTQ's dequantized weights and scales).
    F16,
    /// Fixed fp64 (torchao's scale arithmetic).
    F64,
    /// Fixed fp8 (torchao's and Transformer Engine's casts; 1 byte).
    Fp8,
}

/// Extra quantities a shape can use beyond the activation symbols of [`Q`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum X {
    /// Rotary dims per head (d_rot).
    DRot,
    /// Routed experts (E).
    E,
    /// Experts per token (K).
    K,
    /// Expert intermediate size (f_e).
    FE,
    /// Shared experts' intermediate size (f_s).
    FS,
    /// LoRA rank (r).
    R,
    /// OPT's word_embed_proj_dim (e).
    EProj,
    /// Max positions of a learned position table (GPT-2's wpe rows).
    Pos,
    /// Rows of a chunked loss (n_chunk).
    Chunk,
    /// Tokens of one of torchtune's output chunks (⌈s / 8⌉).
    OutChunk,
    /// MLA's query LoRA rank (r_q, `q_lora_rank`).
    MlaRq,
    /// MLA's compressed-KV rank (r_kv, `kv_lora_rank`).
    MlaRkv,
    /// MLA's non-rotary query/key head dims (d_nope, `qk_nope_head_dim`).
    MlaNope,
    /// MLA's value head dim (d_v, `v_head_dim`).
    MlaV,
    /// `kv_a_proj_with_mqa`'s output: the latent and the shared rotary key (r_kv + d_r).
    MlaKvA,
    /// `kv_b_proj`'s output per head: the key's non-rotary part and the value (d_nope + d_v).
    MlaKvB,
    /// Mamba-2 heads (H, `mamba_n_heads`).
    SsmHeads,
    /// Mamba-2 head dim (P, `mamba_d_head`).
    SsmHeadDim,
    /// Mamba-2 state size (N, `mamba_d_state`).
    SsmState,
    /// Mamba-2 scan width (d_ssm = H·P).
    SsmInner,
    /// Mamba-2 convolution channels (c_d = d_ssm + 2·G·N).
    SsmConvDim,
    /// Mamba-2 `in_proj` width (D_in = d_ssm + c_d + H).
    SsmIn,
    /// Mamba-2 B/C width (G·N).
    SsmGroupState,
    /// The SSD scan's chunk (C, `mamba_chunk_size`).
    SsmChunk,
    /// Chunks of the sequence (n_c = ⌈s / C⌉).
    SsmChunks,
    /// Chunks plus the initial state (n_c + 1).
    SsmChunks1,
    /// The sequence padded to whole chunks (s_p = n_c·C).
    SsmPadded,
    /// The causal convolution's output before its slice (s + K_c − 1).
    SsmConvLen,
    /// DeepSeek-V3.2 indexer heads (H_i, `index_n_heads`).
    IdxHeads,
    /// DeepSeek-V3.2 indexer head dim (d_i, `index_head_dim`).
    IdxHeadDim,
    /// The indexer's query width (H_i·d_i, `wq_b`'s output).
    IdxQ,
    /// Keys the indexer keeps per query: min(`index_topk`, s).
    IdxTopk,
    /// Gated DeltaNet key heads (Hk, `linear_num_key_heads`).
    GdnKHeads,
    /// Gated DeltaNet value heads (Hv, `linear_num_value_heads`).
    GdnVHeads,
    /// Gated DeltaNet key head dim (dk).
    GdnKDim,
    /// Gated DeltaNet value head dim (dv).
    GdnVDim,
    /// Gated DeltaNet query/key width (Hk·dk).
    GdnKeyWidth,
    /// Gated DeltaNet value width (Hv·dv).
    GdnValueWidth,
    /// Gated DeltaNet convolution channels (cd = 2·Hk·dk + Hv·dv).
    GdnConvDim,
    /// Qwen3-Next's `in_proj_qkvz` width (2·Hk·dk + 2·Hv·dv).
    GdnQkvz,
    /// Qwen3-Next's `in_proj_ba` width (2·Hv).
    GdnBa,
    /// `torch_chunk_gated_delta_rule`'s chunk (C = 64).
    GdnChunk,
    /// Its chunks (n = ⌈s / C⌉).
    GdnChunks,
    /// The sequence padded to whole chunks (s_p = n·C).
    GdnPadded,
    /// The causal convolution's output before its slice (s + K_c − 1).
    GdnConvLen,
    /// torchtitan's grouped-GEMM rows (`indices_padding_wrapper`, `_permute`): the token–expert
    /// pairs plus `TOKEN_GROUP_ALIGN_SIZE_M` (8) per expert, rounded up to 8:
    /// ⌈(b·s·K + 8·E) / 8⌉·8.
    MoePadded,
    /// The token–expert pairs plus torchtitan's one zero row (`_permute`'s `vstack`): b·s·K + 1.
    MoePairs1,
}

impl X {
    pub const COUNT: usize = 47;
    pub fn sym(self) -> Sym {
        use super::super::ctx::{D_ROT, E as E_SYM, F_E, F_S, K_TOP, R as R_SYM};
        match self {
            X::DRot => D_ROT,
            X::E => E_SYM,
            X::K => K_TOP,
            X::FE => F_E,
            X::FS => F_S,
            X::R => R_SYM,
            X::EProj => Sym::new("e", "", "OPT word_embed_proj_dim"),
            X::Pos => Sym::new("P", "", "rows of the learned position table"),
            X::Chunk => Sym::new("n", "chunk", "rows of a loss chunk: ⌈b·s / ⌈V/h⌉⌉ (Liger)"),
            X::OutChunk => Sym::new("s", "chunk", "tokens of an output chunk: ⌈s / 8⌉ (torchtune)"),
            X::MlaRq => Sym::new("r", "q", "MLA query rank (q_lora_rank)"),
            X::MlaRkv => Sym::new("r", "kv", "MLA compressed-KV rank (kv_lora_rank)"),
            X::MlaNope => Sym::new("d", "nope", "MLA non-rotary query/key head dims (qk_nope_head_dim)"),
            X::MlaV => Sym::new("d", "v", "MLA value head dim (v_head_dim)"),
            X::MlaKvA => Sym::new("c", "kv", "MLA latent plus shared rotary key: r_kv + d_r (kv_a_proj_with_mqa)"),
            X::MlaKvB => Sym::new("d", "kvb", "MLA per-head key-nope plus value: d_nope + d_v (kv_b_proj)"),
            X::SsmHeads => Sym::new("H", "", "Mamba-2 heads (mamba_n_heads)"),
            X::SsmHeadDim => Sym::new("P", "", "Mamba-2 head dim (mamba_d_head)"),
            X::SsmState => Sym::new("N", "", "Mamba-2 state size (mamba_d_state)"),
            X::SsmInner => Sym::new("d", "ssm", "Mamba-2 scan width: H·P"),
            X::SsmConvDim => Sym::new("c", "d", "Mamba-2 conv channels: d_ssm + 2·G·N"),
            X::SsmIn => Sym::new("D", "in", "Mamba-2 in_proj width: d_ssm + c_d + H"),
            X::SsmGroupState => Sym::new("G", "N", "Mamba-2 B/C width: G·N"),
            X::SsmChunk => Sym::new("C", "", "SSD scan chunk (mamba_chunk_size)"),
            X::SsmChunks => Sym::new("n", "c", "SSD chunks: ⌈s / C⌉"),
            X::SsmChunks1 => Sym::new("n", "c+1", "SSD chunks plus the initial state"),
            X::SsmPadded => Sym::new("s", "p", "sequence padded to whole chunks: n_c·C"),
            X::SsmConvLen => Sym::new("s", "conv", "causal conv output before its slice: s + K_c − 1"),
            X::IdxHeads => Sym::new("H", "i", "DSA indexer heads (index_n_heads)"),
            X::IdxHeadDim => Sym::new("d", "i", "DSA indexer head dim (index_head_dim)"),
            X::IdxQ => Sym::new("q", "i", "DSA indexer query width: H_i·d_i"),
            X::IdxTopk => Sym::new("k", "i", "keys the DSA indexer keeps: min(index_topk, s)"),
            X::GdnKHeads => Sym::new("H", "k", "gated DeltaNet key heads (linear_num_key_heads)"),
            X::GdnVHeads => Sym::new("H", "v", "gated DeltaNet value heads (linear_num_value_heads)"),
            X::GdnKDim => Sym::new("d", "k", "gated DeltaNet key head dim (linear_key_head_dim)"),
            X::GdnVDim => Sym::new("d", "v", "gated DeltaNet value head dim (linear_value_head_dim)"),
            X::GdnKeyWidth => Sym::new("w", "k", "gated DeltaNet query/key width: H_k·d_k"),
            X::GdnValueWidth => Sym::new("w", "v", "gated DeltaNet value width: H_v·d_v"),
            X::GdnConvDim => Sym::new("c", "gdn", "gated DeltaNet conv channels: 2·H_k·d_k + H_v·d_v"),
            X::GdnQkvz => Sym::new("D", "qkvz", "in_proj_qkvz width: 2·H_k·d_k + 2·H_v·d_v"),
            X::GdnBa => Sym::new("D", "ba", "in_proj_ba width: 2·H_v"),
            X::GdnChunk => Sym::new("C", "gdn", "gated delta rule chunk (64)"),
            X::GdnChunks => Sym::new("n", "gdn", "gated delta rule chunks: ⌈s / 64⌉"),
            X::GdnPadded => Sym::new("s", "gdn", "sequence padded to whole 64-token chunks"),
            X::GdnConvLen => Sym::new("s", "gconv", "gated DeltaNet conv output before its slice: s + K_c − 1"),
            X::MoePadded => Sym::new("n", "pad", "grouped-GEMM rows: b·s·K + 8·E rounded up to 8 (torchtitan)"),
            X::MoePairs1 => Sym::new("n", "pairs+1", "token–expert pairs plus one zero row: b·s·K + 1 (torchtitan)"),
        }
    }
}

/// One dimension of a shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    Q(Q),
    X(X),
    /// A literal count.
    N(u32),
    /// Half of a quantity (rotate_half's halves).
    Half(Q),
    /// A quantity plus one (labels padded by one).
    Plus1(Q),
    /// Half of an extra quantity (half the rotary dims).
    HalfX(X),
    /// The fused q, k, v heads: a + 2k.
    Qkv,
    /// A parameter's element count (already local to this GPU).
    W(u64),
}

/// How a tensor is divided over tensor-parallel ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    None,
    /// Inside the tensor-parallel region (heads, MLP columns): ⌈·/t⌉.
    Tp,
    /// The residual stream under sequence parallelism: ⌈·/t⌉ when sp is on.
    Sp,
}

/// A symbolic shape: up to 6 dims and a split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub dims: [Dim; 6],
    pub n: u8,
    pub split: Split,
}

impl Shape {
    pub fn new(ds: &[Dim], split: Split) -> Shape {
        let mut dims = [Dim::N(1); 6];
        let n = ds.len().min(6);
        dims[..n].copy_from_slice(&ds[..n]);
        Shape { dims, n: n as u8, split }
    }
    /// Token-shaped `[b, s, w]` in the residual split.
    pub fn tok(w: Q) -> Shape {
        Shape::new(&[Dim::Q(Q::B), Dim::Q(Q::S), Dim::Q(w)], Split::Sp)
    }
    pub fn dims(&self) -> &[Dim] {
        &self.dims[..self.n as usize]
    }
    pub fn with_split(mut self, split: Split) -> Shape {
        self.split = split;
        self
    }
    /// The same shape with dim `i` replaced.
    pub fn set(mut self, i: usize, d: Dim) -> Shape {
        self.dims[i] = d;
        self
    }
    /// The shape without its last dim (a `keepdim` reduction: `[b, s, 1]` has `b·s` elements).
    pub fn drop_last(mut self) -> Shape {
        self.n = self.n.saturating_sub(1);
        self
    }
    /// The shape with its last dim replaced.
    pub fn last(mut self, d: Dim) -> Shape {
        let n = self.n as usize;
        self.dims[n - 1] = d;
        self
    }
    /// A scalar.
    pub fn scalar() -> Shape {
        Shape::new(&[], Split::None)
    }
}

/// Which decoder layers carry a saved tensor: the ledger multiplies it by their count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Group {
    /// Every layer (L).
    All,
    /// Layers whose feed-forward block is a mixture of experts (L_moe).
    Moe,
    /// Layers with a dense MLP in a model that also has MoE layers (L_dense).
    Dense,
    /// Layers with rotary embedding in a model that also has NoPE layers (L_rope): what only
    /// they keep (Llama 4's L2 q/k norm, its chunked layers' SDPA mask).
    Rope,
    /// NoPE layers (L_nope): what only they keep (Llama 4's attention temperature scales).
    Nope,
}

/// Where a tensor's storage comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Allocated by the op that outputs it (or a view of another tensor's storage).
    Op,
    /// A parameter: alive before the step; a trainable one receives a gradient through
    /// AccumulateGrad (`grad_bytes` per gradient, 0 when frozen).
    Param { grad_bytes: u128 },
    /// The batch (token ids, labels): alive before the step, never freed by it.
    Batch,
    /// A model buffer (Gemma's embedding scale): model state, never freed, not an activation.
    Buffer,
    /// A tensor this program receives from its caller (a layer's input, the model's shared
    /// cos/sin): alive at entry. `free_fwd`: the program may free it when its forward liveness
    /// ends; `free_bwd`: when the last node that saved it has run (its owner has let it go).
    Input { free_fwd: bool, free_bwd: bool },
}

/// One tensor.
#[derive(Clone, Debug)]
pub struct Tensor {
    /// numel × element size of this tensor (its gradient has the same size).
    pub bytes: u128,
    /// Its shape in symbols and its dtype as the code names it (the ledger's formula).
    pub shape: Shape,
    pub dt: Dt,
    /// The ledger part it is always counted in, whoever saves it (shared cos/sin, the
    /// checkpoints' keyword arguments).
    pub part: Option<Part>,
    /// The tensor whose storage this one uses (itself unless it is a view).
    pub base: Tid,
    pub dtype: DType,
    pub origin: Origin,
    pub requires_grad: bool,
    /// The aten op that made it.
    pub op: &'static str,
    /// Held by a Python name until this op index (inclusive); at least its producer.
    pub hold: u32,
    /// The last op that reads it.
    pub last_use: u32,
    /// Counted in a shared model-level row rather than this program's (cos/sin in a layer).
    pub elsewhere: bool,
}

/// One step of a node's backward, in PyTorch's order. Temporaries are numbered by their
/// allocation order within the node (`Alloc` k is temporary k).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum B {
    /// Allocate a buffer (a gradient or a temporary of the formula).
    Alloc { bytes: u128, dtype: DType, op: &'static str },
    /// Free temporary k (a formula's intermediate, or a full-size gradient after its sum).
    Free(u8),
    /// Temporary k becomes the gradient of input i.
    Grad { input: u8, temp: u8 },
    /// The gradient of output o flows on to input i unchanged (a view of it, no allocation).
    Pass { input: u8, output: u8 },
    /// The node's formula returns (what follows is the engine's `validate_outputs`: the
    /// `sum_to` of broadcast inputs). Tensors unpacked from a checkpoint die here.
    Apply,
}

/// One op of the forward pass and its autograd node.
#[derive(Clone, Debug)]
pub struct Op {
    /// The aten op (forward).
    pub name: &'static str,
    /// Its autograd node (`MmBackward0`); empty when not differentiable.
    pub node: &'static str,
    /// Module path, relative to the decoder layer for layer ops.
    pub module: &'static str,
    /// Decoder layer index, or [`MODEL`] for the model's ends.
    pub layer: u16,
    pub ins: (u32, u8),
    pub outs: (u32, u16),
    /// Saved tensors (into `Program::saves`).
    pub saved: (u32, u8),
    /// Saves of a node that dies in forward, right after the live ones in `Program::saves`
    /// ([`Program::dead`], [`Builder::dead_save`]): no device memory of their own, but each a
    /// pack under activation offloading.
    pub dead: u8,
    pub bw: (u32, u16),
    /// Where a compiled region ([`super::compile`]) has this op: its saves are taken when the
    /// region starts and released after the backward of the op that holds them.
    pub compiled: Compiled,
    /// Runs inside the `__torch_dispatch__` of the next op that does not (a tensor subclass's
    /// own aten calls: torchao's `Float8TrainingTensor` `mm` takes both scales' reciprocals
    /// before `_scaled_mm`). Selective checkpointing's cache sees only that outer op: a cache
    /// hit returns its output without dispatching, so a recomputation skips these too.
    pub in_dispatch: bool,
}

/// An op's place in a compiled region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compiled {
    /// Not compiled.
    No,
    /// The region's first op: the saves of every op of the region are taken when it runs.
    First,
    /// A later op of the region.
    Inside,
}

/// Layer index of model-level ops.
pub const MODEL: u16 = u16::MAX;

/// A saved reference: the tensor, and the ledger part it is counted in.
#[derive(Clone, Copy, Debug)]
pub struct Save {
    pub t: Tid,
    pub part: Part,
    pub group: Group,
}

/// A `torch.utils.checkpoint` region (non-reentrant, HF's default): its forward saves nothing
/// but its inputs and keyword arguments; its backward first re-runs the forward up to the last
/// op that saves anything (early stop), then backpropagates.
#[derive(Clone, Debug)]
pub struct Region {
    pub first: u32,
    /// One past its last op.
    pub end: u32,
    /// What the checkpoint keeps (positional inputs, saved; closure keyword arguments, held):
    /// released when the region's last saved tensor has been unpacked.
    pub held: Vec<Save>,
    /// How many of `held`'s first entries are the checkpoint's positional tensor inputs: torch
    /// 2.15 `utils/checkpoint.py` `_CheckpointFrame.save_inputs` makes them `SavedTensor`s under
    /// the saved-tensor hooks active at the call (an outer offloading context packs them), before
    /// `_checkpoint_hook` is pushed; the recomputation unpacks them (`get_inputs`). The rest are
    /// closure keyword arguments (`partial(forward, **kwargs)`), plain references.
    pub inputs: u8,
    /// Selective checkpointing (`recompute = op`): the outputs of the ops the policy marks
    /// `MUST_SAVE`, cached in forward by `_CachingTorchDispatchMode` and handed to the
    /// recomputation in place of running those ops again (see [`super::sac`]).
    pub cached: Vec<Save>,
    /// The recomputation stops after the last op that saves anything (`early_stop=True`,
    /// `torch.utils.checkpoint`'s default and transformers'); torchtitan's
    /// `ptd_checkpoint_wrapper(..., early_stop=False)` re-runs the whole region.
    pub early_stop: bool,
    /// Compiled (`compile = true` with checkpointing): the backward kernels Inductor schedules
    /// apart from the eager node order ([`FusedBackward`]).
    pub fused: Vec<FusedBackward>,
}

/// In a compiled checkpointed region, a value that only a matmul's weight gradient needs
/// (act(gate)·up, which `down_proj` reads) is not recomputed before the backward: Inductor
/// fuses its recomputation into the kernel of its own pointwise backward (`head`, with the
/// ops whose outputs live inside that kernel, `members`: the SiLU), which writes the value and
/// the gradients of every materialized input at once, after the matmul's input gradient; the
/// matmul's (`late`) weight gradient runs after that kernel. Measured:
/// `frameworks/steps/torchtitan-llama3__…__compile=layer+recompute=full.json` (six `[b·s, ffn]`
/// buffers alive at once: the recomputed gate and up outputs, their product, its gradient, and
/// both input gradients — before `w2`'s weight gradient), FINDINGS §15.1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusedBackward {
    /// The matmuls after the head, in program order.
    pub late: Vec<u32>,
    pub head: u32,
    pub members: Vec<u32>,
    /// Fusible ops after the head whose outputs only late matmuls read (a cast of the head's
    /// output for an adapter): written by the kernel too, in program order.
    pub post: Vec<u32>,
    /// The late matmuls' weight gradients run after the kernel (the checkpoint traced inside
    /// the compiled region: the value they read is made by the kernel). When the checkpoint
    /// wraps the compiled region (torchtune, `apart` false) the re-run made that value before
    /// the backward and each late matmul's node runs whole, in node order; the kernel still
    /// reads the head's output gradient in parts (`w2`'s and its LoRA adapter's input
    /// gradients, not summed first), writes every gradient of its members at once, and writes
    /// its last one into an input that dies in it: Inductor's `inplace_buffers` (torch 2.15
    /// `torch/_inductor/scheduler.py`, `SchedulerNode.decide_inplace_update`) lets a node write
    /// into a buffer of its layout whose remaining uses are that node alone — inside one fused
    /// kernel, true of a shared input once the kernel's other nodes are done, so of the last
    /// node's. Measured: torchtune's compiled LoRA on every linear with full checkpointing
    /// (`frameworks/steps/torchtune-llama3__…__compile=layer+recompute=full__lora-r8-all.json`):
    /// the SiLU·mul backward kernel writes four `[b·s, ffn]` gradients (gate's and up's, each
    /// also scaled for its adapter's `lora_B`) as three new buffers beside its four dying
    /// inputs (both parts of the incoming gradient, the saved gate and up sums).
    pub apart: bool,
}

/// The lengths of a [`Program`]'s growing lists at one point of its building.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lengths {
    pub tensors: usize,
    pub ops: usize,
    pub args: usize,
    pub saves: usize,
    pub script: usize,
}

/// A program: tensors and ops in forward order.
#[derive(Clone, Debug)]
pub struct Program {
    pub tensors: Vec<Tensor>,
    pub ops: Vec<Op>,
    pub args: Vec<Tid>,
    pub saves: Vec<Save>,
    pub script: Vec<B>,
    pub regions: Vec<Region>,
    /// Tensors handed back to the caller (their gradients arrive from outside in backward).
    pub outputs: Vec<Tid>,
    /// Forward ops from this index on run after the LM head returned (the tracker's `loss`
    /// phase); `u32::MAX` when the program has no loss.
    pub loss_from: u32,
    /// Forward ops from this index on are the loss function's (`ForCausalLMLoss`, called on the
    /// logits the model returned: Gemma-2's soft-capping before it is the model's own);
    /// `u32::MAX` when the program has no loss. torchtune's recipes compute it outside their
    /// activation-offloading context.
    pub loss_fn_from: u32,
    /// FSDP2 units whose gathered parameters and unsharded gradients the run allocates
    /// ([`Unit`]): torchtitan's `[norm, output]`, torchtune's root, end units and decoder layers.
    pub units: Vec<Unit>,
}

/// An FSDP2 unit kept gathered after forward (`reshard_after_forward=False`), as the run sees
/// it (torch 2.15 `distributed/fsdp/_fully_shard/_fsdp_param_group.py`): its parameters are
/// all-gathered (`all_gather_copy_out`) before op `first` runs; the node of op `grad_op` makes
/// its unsharded gradient (`grad` bytes); once backward has passed op `first` (its
/// `RegisterPostBackwardFunction` node, on the unit's inputs, runs then) `post_backward`
/// reshards the parameters, then `foreach_reduce` copies the gradient into the
/// `reduce_input`-byte reduce-scatter buffer and frees it. Sizes: `sharding::head_unit`.
///
/// A unit resharded after forward (`fwd_last` an op, not [`NO_OP`]) frees its parameters once
/// op `fwd_last` has run (`post_forward`: the op after it finds them gone) and gathers them
/// again when backward reaches an op at or before `fwd_last` (`pre_backward`, a hook on the
/// unit's outputs): torchtune's root (`sharding::root_unit_bytes`), its full fine-tune's
/// output and embedding units, one a call (`sharding::end_unit`), and its decoder layers
/// (`StepModel::layer_units`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    pub first: u32,
    /// [`NO_OP`] when the unit has no trainable gradient made here.
    pub grad_op: u32,
    pub params: u128,
    pub param_dtype: DType,
    pub grad: u128,
    pub reduce_input: u128,
    /// The unit's last forward op, after which it is resharded; [`NO_OP`] when it is kept
    /// gathered from its forward to its backward.
    pub fwd_last: u32,
    /// The parameter whose gradients the unit accumulates unsharded as `AccumulateGrad` does:
    /// the first arrival kept (`grad` bytes), the second added out of place (the stolen first
    /// one is still referenced), later ones in place; [`NO_OP`] when the unsharded gradient is
    /// allocated at `grad_op` instead.
    pub grad_param: u32,
    /// Bytes of the all-gather's flat output (`FSDP::all_gather`; 0: not modelled). In forward
    /// it outlives the copy-out until the next unit's all-gather (FSDP2 defers its free, to
    /// overlap the copy-out with the next collective; the last one goes when the model's
    /// forward ends); in backward it goes right after the copy-out, and once the copy-out is
    /// done the unit before this one in forward order is prefetched: its flat output allocated.
    pub flat: u128,
    /// The FSDP2 parameter group: one group's units (the output projection's, one a call) hold
    /// the same parameters, which prefetching one of them from another finds gathered already.
    pub group: u32,
    /// Bytes of the unit's sharded gradient, which its reduce-scatter makes after its backward
    /// and which stays to the step's end (torchtune's recipes free it at
    /// `zero_grad(set_to_none=True)`, after the optimizer step); 0 where the shards are
    /// resident outside the stream, offloaded, or none.
    pub shard_grad: u128,
}

/// No op.
pub const NO_OP: u32 = u32::MAX;

impl Default for Program {
    fn default() -> Self {
        // Sized for one decoder layer (a Llama layer has about 60 ops and 90 tensors), so
        // building one does not regrow its vectors op by op.
        Program {
            tensors: Vec::with_capacity(128),
            ops: Vec::with_capacity(96),
            args: Vec::with_capacity(256),
            saves: Vec::with_capacity(96),
            script: Vec::with_capacity(256),
            regions: Vec::new(),
            outputs: Vec::with_capacity(2),
            loss_from: u32::MAX,
            loss_fn_from: u32::MAX,
            units: Vec::new(),
        }
    }
}

impl Program {
    /// A program with no room reserved: for a [`Builder`] that only sizes tensors
    /// ([`Builder::bytes_of`], [`Builder::expr_of`]) and never emits an op.
    pub fn empty() -> Program {
        Program {
            tensors: Vec::new(),
            ops: Vec::new(),
            args: Vec::new(),
            saves: Vec::new(),
            script: Vec::new(),
            regions: Vec::new(),
            outputs: Vec::new(),
            loss_from: u32::MAX,
            loss_fn_from: u32::MAX,
            units: Vec::new(),
        }
    }

    /// How long the program's growing lists are now ([`Program::reserve_repeats`]).
    pub fn lengths(&self) -> Lengths {
        Lengths {
            tensors: self.tensors.len(),
            ops: self.ops.len(),
            args: self.args.len(),
            saves: self.saves.len(),
            script: self.script.len(),
        }
    }

    /// Reserves room for what was built since `since`, `times` more times over: sized by the
    /// first decoder layer, a whole stage's program grows its lists once instead of doubling
    /// them layer after layer (the copies were ~9 % of a `reserved()` replay's instructions).
    pub fn reserve_repeats(&mut self, since: Lengths, times: usize) {
        let now = self.lengths();
        self.tensors.reserve((now.tensors - since.tensors) * times);
        self.ops.reserve((now.ops - since.ops) * times);
        self.args.reserve((now.args - since.args) * times);
        self.saves.reserve((now.saves - since.saves) * times);
        self.script.reserve((now.script - since.script) * times);
    }

    pub fn ins(&self, op: &Op) -> &[Tid] {
        &self.args[op.ins.0 as usize..op.ins.0 as usize + op.ins.1 as usize]
    }
    pub fn outs(&self, op: &Op) -> &[Tid] {
        &self.args[op.outs.0 as usize..op.outs.0 as usize + op.outs.1 as usize]
    }
    pub fn saved(&self, op: &Op) -> &[Save] {
        &self.saves[op.saved.0 as usize..op.saved.0 as usize + op.saved.1 as usize]
    }
    /// The saves of `op`'s node that dies in forward ([`Builder::dead_save`]); none in a
    /// compiled region (its graph has no dead nodes: what the region does not return is gone,
    /// and `compile.rs` regroups the region's saves).
    pub fn dead(&self, op: &Op) -> &[Save] {
        if op.compiled != Compiled::No {
            return &[];
        }
        let at = op.saved.0 as usize + op.saved.1 as usize;
        &self.saves[at..at + op.dead as usize]
    }
    pub fn bw(&self, op: &Op) -> &[B] {
        &self.script[op.bw.0 as usize..op.bw.0 as usize + op.bw.1 as usize]
    }
    /// The op index at which a tensor's storage stops being held by forward code.
    pub fn fwd_end(&self, t: Tid) -> u32 {
        let x = &self.tensors[t as usize];
        x.hold.max(x.last_use)
    }
}

/// What an op outputs.
#[derive(Clone, Copy, Debug)]
pub struct Out {
    pub shape: Shape,
    pub dt: Dt,
    /// A view of this tensor's storage instead of a new allocation.
    pub view_of: Option<Tid>,
    pub requires_grad: bool,
}

/// Builds a program; carries the configuration's symbols and the current module, layer, ledger
/// part and layer group.
pub struct Builder<'a> {
    pub c: &'a Ctx<'a>,
    pub p: Program,
    /// Activations' compute dtype and the residual stream's.
    pub compute: DType,
    pub resid: DType,
    /// Dtype of saved GEMM inputs.
    pub lin: DType,
    /// Values of the extra quantities ([`X`]).
    pub xv: [u64; X::COUNT],
    pub layer: u16,
    pub module: &'static str,
    pub part: Part,
    pub group: Group,
    /// Gradients are wanted for activations (false in a frozen prefix).
    pub grad: bool,
    /// Under `torch.autocast`: GEMMs and attention cast their inputs to the compute dtype.
    pub autocast: bool,
    /// Dropout is on (p > 0, training).
    pub dropout: bool,
    /// LoRA adapters on the linears it targets.
    pub lora: Option<Lora>,
    /// Megatron-style selective recomputation of the attention core.
    pub selective: bool,
    /// How projections run their GEMMs beyond plain `nn.Linear`: FP8 recipes and QLoRA's
    /// quantized base (`lowbit.rs`).
    pub lowbit: LowBit,
    /// The selective-checkpoint region being built (`recompute = op`), if any.
    pub sac: Option<super::sac::Open>,
    /// Inside `torch.no_grad()`: no op makes an autograd node (nothing saved, no output
    /// requires a gradient).
    pub no_grad: bool,
    /// Build the dead subgraphs whose nodes pack their saves before they die (activation
    /// offloading: [`Builder::dead_save`]); otherwise they are left out (freed at once, they
    /// change no peak the estimator reports).
    pub dead_graphs: bool,
    /// The ops emitted now run inside the next op's dispatch ([`Op::in_dispatch`]).
    pub in_dispatch: bool,
}

/// LoRA as PEFT applies it: which linears, the rank, the adapters' dtype and gradient size,
/// and whether each adapter drops out its input (`lora_dropout > 0`).
#[derive(Clone, Copy, Debug)]
pub struct Lora {
    pub targets: u8,
    pub rank: u64,
    pub weight: DType,
    pub grad_elem: u64,
    pub dropout: bool,
    /// peft's adapters: each adapted input cast to the adapters' dtype, the sum cast back
    /// (`lora_dtype = fp32`); torchtune's and litgpt's add in the input's dtype.
    pub cast_input: bool,
}

impl Lora {
    /// The adapters' dtype as a tensor dtype of the program.
    pub fn dt(&self) -> Dt {
        match self.weight {
            DType::Fp32 => Dt::F32,
            DType::Fp16 => Dt::F16,
            _ => Dt::Bf16,
        }
    }
}

impl<'a> Builder<'a> {
    pub fn new(c: &'a Ctx<'a>, compute: DType, resid: DType, lin: DType, xv: [u64; X::COUNT]) -> Builder<'a> {
        Builder::with_program(c, compute, resid, lin, xv, Program::default())
    }

    /// A builder that adds to `p` ([`Program::empty`] for one that only sizes tensors).
    pub fn with_program(c: &'a Ctx<'a>, compute: DType, resid: DType, lin: DType, xv: [u64; X::COUNT], p: Program) -> Builder<'a> {
        Builder {
            c,
            p,
            compute,
            resid,
            lin,
            xv,
            layer: MODEL,
            module: "",
            part: Part::Embedding,
            group: Group::All,
            grad: true,
            autocast: false,
            dropout: false,
            lora: None,
            selective: false,
            lowbit: LowBit::default(),
            sac: None,
            no_grad: false,
            dead_graphs: false,
            in_dispatch: false,
        }
    }

    /// The dtype a name resolves to.
    pub fn dtype(&self, dt: Dt) -> DType {
        match dt {
            Dt::Model => self.compute,
            Dt::Resid => self.resid,
            Dt::Lin => self.lin,
            Dt::F32 => DType::Fp32,
            Dt::Bf16 => DType::Bf16,
            Dt::I64 => DType::I64,
            Dt::I32 => DType::I32,
            Dt::Bool => DType::Bool,
            Dt::F16 => DType::Fp16,
            Dt::F64 => DType::F64,
            Dt::Fp8 => DType::Fp8,
        }
    }

    /// Bytes per element of a dtype, as the formula shows it.
    pub fn dt_expr(&self, dt: Dt) -> Expr {
        let c = self.c;
        match dt {
            Dt::Model => c.v(Q::P),
            Dt::Resid => c.pr(),
            Dt::Lin => c.pl(),
            Dt::F32 => c.fp32(),
            Dt::Bf16 => Expr::konst("BF16_BYTES", BF16_BYTES),
            Dt::I64 => Expr::konst("INT64_BYTES", INT64_BYTES),
            Dt::I32 => Expr::konst("INT32_BYTES", 4u8),
            Dt::Bool => Expr::konst("BOOL_BYTES", BOOL_BYTES),
            Dt::F16 => Expr::konst("FP16_BYTES", 2u8),
            Dt::F64 => Expr::konst("FP64_BYTES", 8u8),
            Dt::Fp8 => Expr::konst("FP8_BYTES", 1u8),
        }
    }

    fn dim_value(&self, d: Dim) -> u128 {
        match d {
            Dim::Q(q) => self.c.n(q) as u128,
            Dim::X(x) => self.xv[x as usize] as u128,
            Dim::N(n) => n as u128,
            Dim::Half(q) => (self.c.n(q) / 2) as u128,
            Dim::Plus1(q) => self.c.n(q) as u128 + 1,
            Dim::HalfX(x) => (self.xv[x as usize] / 2) as u128,
            Dim::Qkv => (self.c.n(Q::A) + 2 * self.c.n(Q::KV)) as u128,
            Dim::W(n) => n as u128,
        }
    }

    fn split_value(&self, split: Split) -> u128 {
        let t = self.c.n(Q::T_TP) as u128;
        match split {
            Split::Tp if t > 1 => t,
            Split::Sp if t > 1 && self.c.cfg.sp => t,
            _ => 1,
        }
    }

    /// Bytes of a tensor of `shape` in `dt`: element size × every dim, divided (rounding up) by
    /// its split.
    ///
    /// Every program op sizes its outputs here, so the product is first taken in `u64` (a
    /// machine multiply and divide); only a product past `u64` is redone in saturating `u128`
    /// arithmetic, which gives the same value wherever both fit.
    pub fn bytes_of(&self, shape: &Shape, dt: Dt) -> u128 {
        let elem = self.dtype(dt).bytes();
        let split = self.split_value(shape.split);
        let narrow = shape.dims().iter().try_fold(elem, |a, &d| u64::try_from(self.dim_value(d)).ok().and_then(|v| a.checked_mul(v)));
        match narrow {
            Some(n) if split == 1 => n as u128,
            Some(n) => n.div_ceil(split as u64) as u128,
            None => {
                let n: u128 = shape.dims().iter().fold(elem as u128, |a, &d| a.saturating_mul(self.dim_value(d)));
                n.div_ceil(split)
            }
        }
    }

    /// The formula of a tensor's bytes: `p × b × s × h`, split where it is.
    pub fn expr_of(&self, shape: &Shape, dt: Dt) -> Expr {
        if super::super::expr::is_numeric() {
            // The formula's value without building it (the numeric path; equal by construction,
            // and checked on every preset against the explained path).
            return Expr::num(self.bytes_of(shape, dt));
        }
        let c = self.c;
        let mut f = Vec::with_capacity(shape.n as usize + 1);
        f.push(self.dt_expr(dt));
        for &d in shape.dims() {
            f.push(match d {
                Dim::Q(q) => c.v(q),
                Dim::X(x) => Expr::var(x.sym(), self.xv[x as usize]),
                Dim::N(n) => Expr::num(n),
                Dim::Half(q) => c.v(q).floor_div(Expr::num(2u8)),
                Dim::Plus1(q) => Expr::sum([c.v(q), Expr::num(1u8)]),
                Dim::HalfX(x) => Expr::var(x.sym(), self.xv[x as usize]).floor_div(Expr::num(2u8)),
                Dim::Qkv => Expr::sum([c.v(Q::A), Expr::prod([Expr::num(2u8), c.v(Q::KV)])]),
                Dim::W(n) => Expr::num(n),
            });
        }
        let e = Expr::prod(f);
        match shape.split {
            Split::None => e,
            Split::Tp => c.tp_split(e),
            Split::Sp => c.sp_split(e),
        }
    }

    /// A tensor that exists before the program runs, of `shape` in `dt`.
    pub fn external(&mut self, shape: Shape, dt: Dt, origin: Origin, requires_grad: bool) -> Tid {
        let bytes = self.bytes_of(&shape, dt);
        self.external_bytes(bytes, shape, dt, origin, requires_grad)
    }

    fn external_bytes(&mut self, bytes: u128, shape: Shape, dt: Dt, origin: Origin, requires_grad: bool) -> Tid {
        let id = self.p.tensors.len() as Tid;
        self.p.tensors.push(Tensor {
            bytes,
            shape,
            dt,
            part: None,
            base: id,
            dtype: self.dtype(dt),
            origin,
            requires_grad,
            op: match origin {
                Origin::Param { .. } => "parameter",
                Origin::Batch => "batch",
                Origin::Buffer => "buffer",
                _ => "input",
            },
            hold: 0,
            last_use: 0,
            elsewhere: false,
        });
        id
    }

    /// A parameter of `bytes` in `dtype` (never allocated by the step); `grad_bytes` > 0 when
    /// it trains.
    pub fn param(&mut self, bytes: u128, dtype: DType, grad_bytes: u128) -> Tid {
        let dt = match dtype {
            DType::Fp32 => Dt::F32,
            DType::Bf16 => Dt::Bf16,
            _ => Dt::Model,
        };
        let numel = (bytes / dtype.bytes().max(1) as u128) as u64;
        self.external_bytes(bytes, Shape::new(&[Dim::W(numel)], Split::None), dt, Origin::Param { grad_bytes }, grad_bytes > 0)
    }

    /// The op index the next op will get.
    pub fn next_op(&self) -> u32 {
        self.p.ops.len() as u32
    }
    /// The index of the last op emitted.
    pub fn last_op(&self) -> u32 {
        self.p.ops.len().saturating_sub(1) as u32
    }

    /// Keeps `t` alive until the op emitted last (the Python name that holds it is rebound or
    /// goes out of scope there).
    pub fn hold(&mut self, t: Tid) {
        let last = self.last_op();
        let x = &mut self.p.tensors[t as usize];
        x.hold = x.hold.max(last);
    }
    /// Keeps `t` alive to the program's end (a model-level local, an output).
    pub fn hold_forever(&mut self, t: Tid) {
        self.p.tensors[t as usize].hold = FOREVER;
    }
    /// Keeps `t` alive until the forward pass ends (autocast's cache).
    pub fn hold_forward(&mut self, t: Tid) {
        self.p.tensors[t as usize].hold = FWD_END;
    }

    /// Emits an op. `saved` refers to inputs (`S::In(i)`) and outputs (`S::Out(i)`); `bw` is
    /// its node's backward script. Returns the output tensors.
    pub fn op(&mut self, name: &'static str, node: &'static str, ins: &[Tid], outs: &[Out], saved: &[S], bw: &[B]) -> [Tid; 4] {
        let idx = self.p.ops.len() as u32;
        let ins_at = self.p.args.len() as u32;
        for &t in ins {
            self.p.args.push(t);
            let x = &mut self.p.tensors[t as usize];
            x.last_use = x.last_use.max(idx);
        }
        let mut out_ids = [NO_TENSOR; 4];
        let outs_at = self.p.args.len() as u32;
        for (k, o) in outs.iter().enumerate() {
            let id = self.p.tensors.len() as Tid;
            let bytes = self.bytes_of(&o.shape, o.dt);
            let base = o.view_of.map_or(id, |v| self.p.tensors[v as usize].base);
            self.p.tensors.push(Tensor {
                bytes,
                shape: o.shape,
                dt: o.dt,
                part: None,
                base,
                dtype: self.dtype(o.dt),
                origin: Origin::Op,
                requires_grad: o.requires_grad && self.grad && !self.no_grad,
                op: name,
                hold: idx,
                last_use: idx,
                elsewhere: false,
            });
            self.p.args.push(id);
            if k < 4 {
                out_ids[k] = id;
            }
        }
        // Autograd makes a node only when an input requires a gradient: without one nothing is
        // saved (a frozen embedding keeps no ids; a LoRA model's first norm, on the frozen
        // embedding's output, keeps nothing — measured: tests/fixtures/pytorch/qlora).
        let autograd = !self.no_grad && ins.iter().any(|&t| self.p.tensors[t as usize].requires_grad);
        let saved = if autograd { saved } else { &[] };
        let bw = if self.no_grad { &[] } else { bw };
        let saved_at = self.p.saves.len() as u32;
        for s in saved {
            let t = match *s {
                S::In(i) => ins[i as usize],
                S::Out(i) => out_ids[i as usize],
            };
            self.p.saves.push(Save { t, part: self.part, group: self.group });
        }
        if let Some(open) = self.sac.as_mut() {
            if open.saves(name, outs.len(), self.module) {
                let (part, group) = (self.part, self.group);
                for &t in out_ids.iter().take(outs.len()) {
                    self.p.regions[open.region].cached.push(Save { t, part, group });
                }
            }
        }
        let bw_at = self.p.script.len() as u32;
        self.p.script.extend_from_slice(bw);
        self.p.ops.push(Op {
            name,
            node,
            module: self.module,
            layer: self.layer,
            ins: (ins_at, ins.len() as u8),
            outs: (outs_at, outs.len() as u16),
            saved: (saved_at, saved.len() as u8),
            dead: 0,
            bw: (bw_at, bw.len() as u16),
            compiled: Compiled::No,
            in_dispatch: self.in_dispatch,
        });
        out_ids
    }

    /// The last op's autograd node saves `t` (an input or an output of it) but dies in
    /// forward: nothing reaches the loss through it (a router's top-k choice, whose outputs
    /// the code drops). Without offloading the node holds no device memory beyond what the
    /// code already holds; under activation offloading its pack hooks ran when it was created
    /// (`torch/csrc/autograd/saved_variable.cpp`: a `SavedVariable` calls the pack hook in its
    /// constructor), so each is a host copy (validation/FINDINGS.md §15.5). Only where the
    /// node exists: an input requires a gradient (`rg`) and grad mode is on.
    pub fn dead_save(&mut self, t: Tid, rg: bool) {
        if !rg || self.no_grad || !self.grad {
            return;
        }
        let Some(op) = self.p.ops.last_mut() else { return };
        debug_assert_eq!((op.saved.0 + op.saved.1 as u32 + op.dead as u32) as usize, self.p.saves.len());
        op.dead += 1;
        self.p.saves.push(Save { t, part: self.part, group: self.group });
    }

    /// A new output of `shape` in `dt`.
    pub fn out(&self, shape: Shape, dt: Dt, requires_grad: bool) -> Out {
        Out { shape, dt, view_of: None, requires_grad }
    }
    /// A view of `of` with `shape`.
    pub fn view_out(&self, of: Tid, shape: Shape) -> Out {
        let t = self.t(of);
        Out { shape, dt: t.dt, view_of: Some(of), requires_grad: t.requires_grad }
    }

    pub fn t(&self, id: Tid) -> &Tensor {
        &self.p.tensors[id as usize]
    }
    pub fn rg(&self, id: Tid) -> bool {
        self.p.tensors[id as usize].requires_grad
    }
    pub fn bytes(&self, id: Tid) -> u128 {
        self.p.tensors[id as usize].bytes
    }
    pub fn shape(&self, id: Tid) -> Shape {
        self.p.tensors[id as usize].shape
    }

    /// Marks the program's outputs (their gradients come from the caller).
    pub fn outputs(&mut self, ts: &[Tid]) {
        for &t in ts {
            self.hold_forever(t);
            self.p.outputs.push(t);
        }
    }

    /// Opens a checkpoint region whose inputs are `held` (positional inputs and closure
    /// keyword arguments, with their ledger part).
    pub fn begin_checkpoint(&mut self, held: Vec<Save>) -> usize {
        self.begin_checkpoint_as(held, true, None)
    }
    /// [`Builder::begin_checkpoint`] with its recomputation's early stop and, for selective
    /// checkpointing, the policy whose saved ops' outputs the region caches.
    pub fn begin_checkpoint_as(&mut self, held: Vec<Save>, early_stop: bool, sac: Option<super::sac::Policy>) -> usize {
        let first = self.next_op();
        self.p.regions.push(Region { first, end: first, held, inputs: 0, cached: Vec::new(), early_stop, fused: Vec::new() });
        let r = self.p.regions.len() - 1;
        self.sac = sac.map(|policy| super::sac::Open { region: r, policy, mm_count: 0 });
        r
    }
    pub fn end_checkpoint(&mut self, region: usize) {
        let end = self.next_op();
        self.p.regions[region].end = end;
        if self.sac.is_some_and(|o| o.region == region) {
            self.sac = None;
        }
    }
}

/// The builder's state an op takes from it (module, ledger part, layer group, whether
/// activations want gradients): a decoder layer built from one state is copied only where the
/// builder stands in the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuilderState {
    pub module: &'static str,
    pub part: Part,
    pub group: Group,
    pub grad: bool,
}

/// What building one decoder layer changed on a tensor made before it (its input, a shared
/// tensor): the fields as the layer left them, where they changed.
#[derive(Clone, Copy, Debug)]
struct Touched {
    t: Tid,
    hold: Option<u32>,
    last_use: Option<u32>,
    part: Option<Option<Part>>,
    elsewhere: Option<bool>,
}

/// One decoder layer as built into a whole stage's program, kept to be copied as the later
/// layers of the same kind and variant: a Llama-3.1-8B stage builds 32 identical layers, each
/// ~33 k instructions of shape arithmetic and op emission, where copying one with its tensor
/// and op indices moved is a few thousand (see [`Builder::copy_layer`]).
#[derive(Clone, Debug)]
pub struct Fragment {
    /// The lists' lengths at the layer's start and end; its checkpoint regions.
    from: Lengths,
    to: Lengths,
    regions: (usize, usize),
    /// The layer's input and output, and its input as it was before the layer was built.
    x: Tid,
    y: Tid,
    x_was: Tensor,
    /// Tensors made before the stage's first layer (the prologue's: shared cos/sin, mask,
    /// parameters): the layer may read them and only them, besides its input.
    before_layers: usize,
    /// The layer's own tensors as it left them (later layers raise their holds and uses).
    tensors: Vec<Tensor>,
    touched: Vec<Touched>,
    start: BuilderState,
    end: BuilderState,
}

/// Whether a hold or last use is not an op's index, so a copied layer keeps it as it is: one of
/// the sentinels [`FOREVER`] and [`FWD_END`], or 0 (a parameter's or an input's, which no op
/// of a later layer can have: the prologue and the first layer come first).
fn sentinel(op: u32) -> bool {
    op >= FWD_END || op == 0
}

impl Fragment {
    /// Where the copy's tensor stands for the template's `t`: the layer's own tensors move
    /// with it, its input becomes the copy's, the prologue's stay.
    fn map(&self, t: Tid, shift: u32, x: Tid) -> Tid {
        if t as usize >= self.from.tensors {
            t + shift
        } else if t == self.x {
            x
        } else {
            t
        }
    }
}

impl<'a> Builder<'a> {
    /// The state of the builder an op reads.
    pub fn state(&self) -> BuilderState {
        BuilderState { module: self.module, part: self.part, group: self.group, grad: self.grad }
    }

    /// Builds one decoder layer with `build` on input `x` and returns its output, with the
    /// layer kept as a [`Fragment`] when it can be copied: it reads nothing of the layers
    /// before it but its input, and touches nothing of them but its input. `before_layers`:
    /// the tensors made before the stage's first layer.
    pub fn layer_kept(&mut self, x: Tid, before_layers: usize, build: impl FnOnce(&mut Builder<'a>) -> Tid) -> (Tid, Option<Fragment>) {
        let from = self.p.lengths();
        let regions_from = self.p.regions.len();
        let (outputs, loss_from) = (self.p.outputs.len(), self.p.loss_from);
        let start = self.state();
        let x_was = self.p.tensors[x as usize].clone();
        let was: Vec<(u32, u32, Option<Part>, bool)> = self.p.tensors.iter().map(|t| (t.hold, t.last_use, t.part, t.elsewhere)).collect();
        let y = build(self);
        let to = self.p.lengths();
        let p = &self.p;
        let outside_ok = |t: Tid| (t as usize) < before_layers || t == x || t as usize >= from.tensors;
        let op_ok = |o: u32| sentinel(o) || (o as usize >= from.ops && (o as usize) < to.ops);
        let fits = x_was.base == x
            && p.outputs.len() == outputs
            && p.loss_from == loss_from
            && (y as usize) >= from.tensors
            && p.tensors[from.tensors..].iter().all(|t| outside_ok(t.base) && op_ok(t.hold) && op_ok(t.last_use))
            && p.args[from.args..].iter().all(|&t| outside_ok(t))
            && p.saves[from.saves..].iter().all(|s| outside_ok(s.t))
            && p.regions[regions_from..].iter().all(|r| r.held.iter().all(|s| outside_ok(s.t)))
            && p.ops[from.ops..].iter().all(|o| o.layer == self.layer);
        if !fits {
            return (y, None);
        }
        let mut touched = Vec::new();
        for (i, &(hold, last_use, part, elsewhere)) in was.iter().enumerate() {
            let t = &p.tensors[i];
            let changed = |a: u32, b: u32| (a != b).then_some(b);
            let tc = Touched {
                t: i as Tid,
                hold: changed(hold, t.hold),
                last_use: changed(last_use, t.last_use),
                part: (part != t.part).then_some(t.part),
                elsewhere: (elsewhere != t.elsewhere).then_some(t.elsewhere),
            };
            if tc.hold.is_none() && tc.last_use.is_none() && tc.part.is_none() && tc.elsewhere.is_none() {
                continue;
            }
            if !outside_ok(i as Tid) || tc.hold.is_some_and(|o| !op_ok(o)) || tc.last_use.is_some_and(|o| !op_ok(o)) {
                return (y, None);
            }
            touched.push(tc);
        }
        let f = Fragment {
            from,
            to,
            regions: (regions_from, p.regions.len()),
            x,
            y,
            x_was,
            before_layers,
            tensors: p.tensors[from.tensors..].to_vec(),
            touched,
            start,
            end: self.state(),
        };
        (y, Some(f))
    }

    /// Copies the decoder layer `f` on input `x` as the builder's current layer, as building it
    /// would have made it; `None` (nothing emitted) where the builder's state or the input
    /// differ from the template's, so building it is what tells.
    pub fn copy_layer(&mut self, f: &Fragment, x: Tid) -> Option<Tid> {
        let xt = &self.p.tensors[x as usize];
        let w = &f.x_was;
        let same_input = xt.base == x
            && xt.bytes == w.bytes
            && xt.shape == w.shape
            && xt.dt == w.dt
            && xt.dtype == w.dtype
            && xt.origin == w.origin
            && xt.requires_grad == w.requires_grad
            && xt.part == w.part
            && xt.elsewhere == w.elsewhere
            && xt.op == w.op;
        if !same_input || self.state() != f.start || (x as usize) < f.before_layers {
            return None;
        }
        let now = self.p.lengths();
        let st = (now.tensors - f.from.tensors) as u32;
        let so = (now.ops - f.from.ops) as u32;
        let sa = (now.args - f.from.args) as u32;
        let ss = (now.saves - f.from.saves) as u32;
        let sc = (now.script - f.from.script) as u32;
        let op = |o: u32| if sentinel(o) { o } else { o + so };
        let p = &mut self.p;
        // Each list copied whole, then its indices moved in place.
        p.tensors.extend_from_slice(&f.tensors);
        for t in &mut p.tensors[now.tensors..] {
            t.base = f.map(t.base, st, x);
            t.hold = op(t.hold);
            t.last_use = op(t.last_use);
        }
        p.args.extend_from_within(f.from.args..f.to.args);
        for t in &mut p.args[now.args..] {
            *t = f.map(*t, st, x);
        }
        p.saves.extend_from_within(f.from.saves..f.to.saves);
        for s in &mut p.saves[now.saves..] {
            s.t = f.map(s.t, st, x);
        }
        p.script.extend_from_within(f.from.script..f.to.script);
        p.ops.extend_from_within(f.from.ops..f.to.ops);
        for o in &mut p.ops[now.ops..] {
            o.layer = self.layer;
            o.ins.0 += sa;
            o.outs.0 += sa;
            o.saved.0 += ss;
            o.bw.0 += sc;
        }
        for k in f.regions.0..f.regions.1 {
            let r = &p.regions[k];
            let held = r.held.iter().map(|s| Save { t: f.map(s.t, st, x), ..*s }).collect();
            let cached = r.cached.iter().map(|s| Save { t: f.map(s.t, st, x), ..*s }).collect();
            let fused = r
                .fused
                .iter()
                .map(|g| FusedBackward {
                    late: g.late.iter().map(|m| m + so).collect(),
                    head: g.head + so,
                    members: g.members.iter().map(|m| m + so).collect(),
                    post: g.post.iter().map(|m| m + so).collect(),
                    apart: g.apart,
                })
                .collect();
            let r = Region { first: r.first + so, end: r.end + so, held, inputs: r.inputs, cached, early_stop: r.early_stop, fused };
            p.regions.push(r);
        }
        for tc in &f.touched {
            let t = &mut p.tensors[f.map(tc.t, st, x) as usize];
            // A hold or use inside the layer moves with it (raised, as `hold` and `op` do); a
            // sentinel is set as it was.
            let moved = |cur: u32, v: u32| if sentinel(v) { v } else { cur.max(v + so) };
            if let Some(v) = tc.hold {
                t.hold = moved(t.hold, v);
            }
            if let Some(v) = tc.last_use {
                t.last_use = moved(t.last_use, v);
            }
            if let Some(v) = tc.part {
                t.part = v;
            }
            if let Some(v) = tc.elsewhere {
                t.elsewhere = v;
            }
        }
        (self.module, self.part, self.group, self.grad) = (f.end.module, f.end.part, f.end.group, f.end.grad);
        Some(f.map(f.y, st, x))
    }
}

/// A saved reference in [`Builder::op`]: an input or an output of the op.
#[derive(Clone, Copy, Debug)]
pub enum S {
    In(u8),
    Out(u8),
}

// The recipes' linears a program runs (built in `lowbit.rs`, which adds their ops to
// [`Builder`]; kept here so that the builder does not import the module that extends it).

/// How the projections of a program run (none: `nn.Linear`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LowBit {
    pub fp8: Option<Fp8Linear>,
    pub quant: Option<Quant4>,
}

/// An FP8 recipe's linear.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fp8Linear {
    pub recipe: crate::estimator::config::Fp8,
    /// FSDP2 all-gathers the weights already cast to FP8 (torchao `enable_fsdp_float8_all_gather`,
    /// tensorwise): the forward casts no weight, the backward re-casts none for grad_input.
    pub allgathered: bool,
    /// Transformer Engine keeps a transposed (column-wise) copy of FP8 data: Hopper, Ada and
    /// sm120 (`is_non_tn_fp8_gemm_supported()` is false there), not B200/B300.
    pub te_transpose: bool,
    /// Transformer Engine: the FP8 weight is re-quantized in backward instead of saved
    /// (`fp8_recompute_weight`, as TE does under FSDP2).
    pub te_recompute_weight: bool,
    /// Transformer Engine `fp8_model_init`: the parameter is the FP8 weight (no per-step cast).
    pub te_model_init: bool,
}

/// QLoRA's quantized base.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quant4 {
    pub kind: crate::estimator::config::QloraQuant,
    /// bitsandbytes double quantization (8-bit absmax with an fp32 scale per 256 blocks).
    pub double_quant: bool,
    /// bitsandbytes before 0.43.2 keeps each linear's input for backward (`bnb_keeps_input`).
    pub keeps_input: bool,
    /// The quant state's dtype is fp16 (Lightning's `_Linear4bit.quantize`, `qlora_lightning`):
    /// each dequantization writes fp16, then `.to(A.dtype)` copies it to bf16.
    pub fp16_state: bool,
}
