//! Transformer architectures and their exact parameter tensors.
//!
//! A [`ModelSpec`] says what a checkpoint is made of; [`ModelSpec::tensors`] lists every
//! parameter tensor it has, as groups of identical tensors (one group per weight or bias name,
//! with how many layers carry it). That one table drives everything static: the parameter count
//! (exact against the published checkpoints), the number of tensors (PyTorch's AdamW keeps a
//! `step` per tensor), how tensor parallelism splits each tensor, which tensors LoRA adapts and
//! QLoRA quantizes, which are matrices for Adafactor and Muon, and which are small enough that
//! bitsandbytes keeps their 8-bit-Adam states in 32 bits.
//!
//! Symbols (as in Megatron and Korthikanti et al. 2022): `V` vocabulary, `h` hidden size, `L`
//! layers, `a` attention heads, `k` key/value heads, `d` head dim, `f` MLP intermediate size,
//! `E` experts, `f_e` expert intermediate size; for multi-head latent attention (MLA) `r_q` and
//! `r_kv` the query and key/value compression ranks, `d_r` the rotary part of a query/key head,
//! `d_v` the value head dim.
//!
//! Layers need not be alike (2026's models mix dense and MoE MLPs, RoPE and NoPE layers, sliding
//! and full attention): such per-layer properties are [`LayerRule`]s, evaluated over any range
//! of layer indices, so that a pipeline stage's share is exact ([`ModelSpec::moe_layers_in`],
//! [`ModelSpec::stage`]).

use super::family::Family;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// Feed-forward block shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MlpKind {
    /// `fc2(act(fc1(x)))`: two matrices h×f and f×h (GPT-2, GPT-NeoX, Falcon, Phi, StarCoder2).
    Plain,
    /// `down(act(gate(x)) * up(x))`: three matrices (SwiGLU in Llama, GeGLU in Gemma).
    Gated,
}

/// The MLP's activation function — matters for what backward keeps, not for the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Activation {
    /// `F.silu` (Llama, Mistral, Qwen): saves its input.
    Silu,
    /// Exact erf GELU, `F.gelu` (GPT-NeoX, Falcon, OPT uses relu).
    Gelu,
    /// `F.gelu(approximate="tanh")` as one kernel (Gemma's `gelu_pytorch_tanh`, StarCoder2).
    GeluTanh,
    /// HF's `NewGELUActivation`, written as Python tensor ops (GPT-2's and Phi's `gelu_new`):
    /// every intermediate of `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` is kept for backward.
    GeluNew,
    /// `F.relu` (OPT): saves its output.
    Relu,
    /// gpt-oss's clamped SwiGLU on its experts (modeling_gpt_oss.py, `GptOssExperts._apply_gate`):
    /// gate and up are the even and odd columns of `gate_up`, `gate.clamp(max=limit)`,
    /// `up.clamp(-limit, limit)`, `glu = gate · sigmoid(alpha · gate)`, output `(up + 1) · glu`
    /// (limit 7, alpha 1.702), written as tensor ops.
    SwigluClamped,
    /// Apertus's xIELU (`transformers.activations.XIELUActivation`, its Python path): two
    /// learnable scalars per MLP (`act_fn.alpha_p`, `act_fn.alpha_n`, `[1]` in the model dtype)
    /// and two 0-dim buffers (`beta`, `eps`); `where(x > 0, softplus(alpha_p)·x·x + beta·x,
    /// (expm1(min(x, eps)) − x)·(beta + softplus(alpha_n)) + beta·x)`, written as tensor ops.
    Xielu,
}

/// Normalization layers' parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NormKind {
    /// `nn.LayerNorm` with weight and bias: 2h parameters.
    Layernorm,
    /// LayerNorm with weight only (`bias=False`): h parameters.
    LayernormNoBias,
    /// RMSNorm: weight only, h parameters.
    Rmsnorm,
    /// Gemma's RMSNorm: `x.float()` normalised and scaled by `(1 + weight)` in fp32 — the same
    /// h parameters, but it keeps more for backward.
    RmsnormGemma,
    /// OLMo-1's LayerNorm without any learnable parameter.
    Nonparametric,
}

impl NormKind {
    /// Parameter tensors of one norm (weight, bias).
    pub fn tensors(self) -> u64 {
        match self {
            NormKind::Layernorm => 2,
            NormKind::LayernormNoBias | NormKind::Rmsnorm | NormKind::RmsnormGemma => 1,
            NormKind::Nonparametric => 0,
        }
    }
}

/// Extra norms on queries and keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QkNorm {
    None,
    /// One norm of size d shared by all heads, for q and for k (Qwen3, Gemma-3).
    Head,
    /// One norm over all heads: a·d for q, k·d for k (OLMo-2).
    Full,
    /// A separate LayerNorm per head (StableLM's `qk_layernorm`): a + k tensors of d.
    PerHead,
}

/// How positions enter the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Positions {
    /// Rotary embeddings: no parameters.
    Rope,
    /// A learned table of (max_pos + pos_offset) × h (GPT-2, OPT).
    Learned,
    /// ALiBi biases or nothing at all: no parameters.
    None,
}

/// Which decoder layers (0-based indices) a per-layer property applies to, as a compact rule that
/// can be evaluated over any range of layers (so that a pipeline stage's share is exact).
/// Indices at or beyond the model's layer count are simply outside the model.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayerRule {
    /// No layer.
    #[default]
    None,
    /// Every layer.
    All,
    /// Layers `0..k` (DeepSeek's `first_k_dense_replace`).
    FirstK(u64),
    /// Layers `i` with `i % step == offset` (`offset < step`): Llama 4's MoE layers
    /// (`interleave_moe_layer_step`), gpt-oss's and Gemma's full-attention layers.
    Every { step: u64, offset: u64 },
    /// Layers `i` with `i % step != offset` (`offset < step`): the complement of `Every`
    /// (Gemma 3's sliding layers, Llama 4's chunked RoPE layers).
    AllBut { step: u64, offset: u64 },
    /// The listed layer indices (ascending, no repeats), for patterns no rule above states.
    List(Vec<u64>),
}

impl LayerRule {
    /// Every layer (a serde default).
    pub fn all() -> LayerRule {
        LayerRule::All
    }

    /// Whether layer `i` is in the rule.
    pub fn contains(&self, i: u64) -> bool {
        match self {
            LayerRule::None => false,
            LayerRule::All => true,
            LayerRule::FirstK(k) => i < *k,
            LayerRule::Every { step, offset } => *step > 0 && i % step == *offset,
            LayerRule::AllBut { step, offset } => *step == 0 || i % step != *offset,
            LayerRule::List(v) => v.contains(&i),
        }
    }

    /// Layers of `range` in the rule — O(1) except for `List`.
    pub fn count_in(&self, range: Range<u64>) -> u64 {
        let (a, b) = (range.start, range.end.max(range.start));
        // Indices i < n with i % step == offset: ⌊(n − offset − 1) / step⌋ + 1 when n > offset.
        let every_below = |n: u64, step: u64, offset: u64| if step == 0 || n <= offset { 0 } else { (n - offset - 1) / step + 1 };
        match self {
            LayerRule::None => 0,
            LayerRule::All => b - a,
            LayerRule::FirstK(k) => (*k).clamp(a, b) - a,
            LayerRule::Every { step, offset } => every_below(b, *step, *offset) - every_below(a, *step, *offset),
            LayerRule::AllBut { step, offset } => (b - a) - (every_below(b, *step, *offset) - every_below(a, *step, *offset)),
            LayerRule::List(v) => v.iter().filter(|i| (a..b).contains(*i)).count() as u64,
        }
    }

    /// Layers `0..layers` in the rule.
    pub fn count(&self, layers: u64) -> u64 {
        self.count_in(0..layers)
    }

    /// The shortest rule that holds exactly for the layers flagged `true` (layer `i` is
    /// `flags[i]`): `None`, `All`, `FirstK`, `Every`, `AllBut`, or else a `List`.
    pub fn from_flags(flags: &[bool]) -> LayerRule {
        let n = flags.len() as u64;
        let on: Vec<u64> = (0..n).filter(|&i| flags[i as usize]).collect();
        if on.is_empty() {
            return LayerRule::None;
        }
        if on.len() as u64 == n {
            return LayerRule::All;
        }
        if on.iter().enumerate().all(|(j, &i)| j as u64 == i) {
            return LayerRule::FirstK(on.len() as u64);
        }
        // A periodic rule is fixed by its first two members (O(n) to find and check).
        let off: Vec<u64> = (0..n).filter(|&i| !flags[i as usize]).collect();
        let periodic = |members: &[u64], every: bool| {
            let (&first, &second) = (members.first()?, members.get(1)?);
            let (step, offset) = (second - first, first);
            let rule = if every { LayerRule::Every { step, offset } } else { LayerRule::AllBut { step, offset } };
            (offset < step && (0..n).all(|i| rule.contains(i) == flags[i as usize])).then_some(rule)
        };
        if let Some(rule) = periodic(&on, true).or_else(|| periodic(&off, false)) {
            return rule;
        }
        LayerRule::List(on)
    }

    /// The rule for a pipeline stage holding layers `range`, re-indexed from 0 (the stage's
    /// first layer is its layer 0).
    pub fn stage(&self, range: Range<u64>) -> LayerRule {
        let (a, b) = (range.start, range.end.max(range.start));
        match self {
            LayerRule::None | LayerRule::All => self.clone(),
            LayerRule::FirstK(k) => LayerRule::FirstK((*k).clamp(a, b) - a),
            LayerRule::Every { step, offset } if offset < step => LayerRule::Every { step: *step, offset: rebase(*step, *offset, a) },
            LayerRule::AllBut { step, offset } if offset < step => LayerRule::AllBut { step: *step, offset: rebase(*step, *offset, a) },
            LayerRule::Every { .. } | LayerRule::AllBut { .. } => self.clone(),
            LayerRule::List(v) => LayerRule::List(v.iter().filter(|i| (a..b).contains(*i)).map(|i| i - a).collect()),
        }
    }

    /// Checks the rule's own numbers (not its extent, which the model's layer count bounds).
    pub fn check(&self) -> Result<(), String> {
        match self {
            LayerRule::Every { step, offset } | LayerRule::AllBut { step, offset } if *step == 0 || offset >= step => {
                Err(format!("needs 0 ≤ offset < step (step {step}, offset {offset})"))
            }
            LayerRule::List(v) if v.windows(2).any(|w| w[0] >= w[1]) => Err("lists layers in ascending order without repeats".into()),
            LayerRule::List(v) if v.len() > 1 << 14 => Err("lists more layers than any model has".into()),
            _ => Ok(()),
        }
    }

    /// Parses the spelling of [`fmt::Display`](std::fmt::Display): `none`, `all`, `first:K`,
    /// `every:STEP:OFFSET`, `all-but:STEP:OFFSET`, or `list:I,J,…`.
    pub fn parse(s: &str) -> Result<LayerRule, String> {
        let s = s.trim().to_ascii_lowercase();
        let num = |t: &str| t.trim().parse::<u64>().map_err(|_| format!("'{t}' is not a layer number"));
        let pair = |t: &str| -> Result<(u64, u64), String> {
            let (a, b) = t.split_once(':').ok_or("expected STEP:OFFSET")?;
            Ok((num(a)?, num(b)?))
        };
        let rule = match s.split_once(':') {
            None if s == "none" => LayerRule::None,
            None if s == "all" => LayerRule::All,
            Some(("first", k)) => LayerRule::FirstK(num(k)?),
            Some(("every", t)) => pair(t).map(|(step, offset)| LayerRule::Every { step, offset })?,
            Some(("all-but", t)) => pair(t).map(|(step, offset)| LayerRule::AllBut { step, offset })?,
            Some(("list", t)) => LayerRule::List(t.split(',').filter(|x| !x.trim().is_empty()).map(num).collect::<Result<_, _>>()?),
            _ => return Err("expected none, all, first:K, every:STEP:OFFSET, all-but:STEP:OFFSET or list:I,J,…".into()),
        };
        rule.check()?;
        Ok(rule)
    }
}

/// The offset of layer `offset`'s residue class once layer `start` is renumbered 0:
/// `(offset − start) mod step`, without overflow (`offset < step`).
fn rebase(step: u64, offset: u64, start: u64) -> u64 {
    let shift = start % step;
    if offset >= shift {
        offset - shift
    } else {
        offset + (step - shift)
    }
}

impl std::fmt::Display for LayerRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayerRule::None => write!(f, "none"),
            LayerRule::All => write!(f, "all"),
            LayerRule::FirstK(k) => write!(f, "first:{k}"),
            LayerRule::Every { step, offset } => write!(f, "every:{step}:{offset}"),
            LayerRule::AllBut { step, offset } => write!(f, "all-but:{step}:{offset}"),
            LayerRule::List(v) => write!(f, "list:{}", v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")),
        }
    }
}

/// How the layers in [`ModelSpec::window_layers`] restrict attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WindowKind {
    /// Each query sees the `window` tokens before it (Mistral, Gemma 2/3, gpt-oss
    /// `sliding_attention`).
    #[default]
    Sliding,
    /// The sequence is cut into chunks of `window` tokens and attention stays inside a chunk
    /// (Llama 4's `chunked_attention`, `attention_chunk_size`).
    Chunked,
}

/// How the MoE router turns its logits `x·Wᵣᵀ (+ b)` into the top-k experts' weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Router {
    /// Softmax over all E experts, then top-k (Mixtral, Qwen-MoE, DeepSeek-V2; with
    /// `router_groups` > 1, DeepSeek-V2's `group_limited_greedy`).
    #[default]
    Softmax,
    /// Top-k of the logits, then a softmax over those k (gpt-oss, `GptOssTopKRouter`).
    TopkSoftmax,
    /// Sigmoid scores plus the `e_score_correction_bias` buffer choose the experts, group-limited
    /// when `router_groups` > 1; the chosen sigmoid scores are normalised and scaled
    /// (DeepSeek-V3 `DeepseekV3TopkRouter`, GLM-4.5 `Glm4MoeTopkRouter`).
    Sigmoid,
    /// Top-k of the logits, then a sigmoid of those (Llama 4, `Llama4Router`).
    TopkSigmoid,
}

/// One model architecture, rich enough to count real checkpoints exactly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// Whose modeling code the model runs (transformers' `model_type`): decided once, by the
    /// importer, a preset or the `family` key, and read by the step's builders.
    #[serde(default)]
    pub family: Family,
    /// `V`: vocabulary size (rows of the embedding).
    pub vocab: u64,
    /// `h`: hidden size.
    pub hidden: u64,
    /// `L`: decoder layers.
    pub layers: u64,
    /// `a`: attention (query) heads.
    pub heads: u64,
    /// `k`: key/value heads (`= a` for MHA, `1` for MQA, between for GQA).
    pub kv_heads: u64,
    /// `d`: head dim; `h / a` unless the checkpoint says otherwise (Gemma).
    pub head_dim: u64,
    /// `f`: intermediate size of the dense MLP.
    pub ffn: u64,
    pub mlp: MlpKind,
    pub act: Activation,
    pub norm: NormKind,
    /// Norms per decoder layer: 1 (parallel blocks sharing one), 2 (pre-norm), 4 (Gemma-2/3).
    pub layer_norms: u64,
    /// Whether a norm follows the last layer (OPT-350m's post-norm layout has none).
    pub final_norm: bool,
    pub qk_norm: QkNorm,
    pub qkv_bias: bool,
    /// Bias on the attention output projection.
    pub o_bias: bool,
    /// Biases on the MLP's linears.
    pub mlp_bias: bool,
    /// Bias on the LM head (Phi-1/2).
    pub head_bias: bool,
    /// LM head shares the embedding's weight.
    pub tied: bool,
    pub positions: Positions,
    /// `max_position_embeddings`: the longest sequence the checkpoint was trained for.
    pub max_pos: u64,
    /// Extra rows of a learned position table (OPT keeps 2).
    pub pos_offset: u64,
    /// Percentage of each head's dims that get rotary embedding (Phi-2: 40, NeoX: 25).
    pub rotary_pct: u64,
    /// Attention and MLP read the same input and are summed (GPT-J, NeoX, Falcon, Phi).
    pub parallel: bool,
    /// OPT-350m: embeddings of this width, projected in and out of h (0 = none).
    pub embed_proj: u64,
    /// `E`: routed experts per MoE layer (0 = dense model).
    pub experts: u64,
    /// Experts each token is routed to.
    pub top_k: u64,
    /// `f_e`: intermediate size of each routed expert.
    pub expert_ffn: u64,
    /// Shared (always-on) experts per MoE layer, each of `shared_ffn`.
    pub shared_experts: u64,
    pub shared_ffn: u64,
    /// Qwen2-MoE's sigmoid gate (a h×1 linear) on the shared expert's output.
    pub shared_gate: bool,
    /// Layers that keep a dense MLP in an MoE model.
    pub dense_layers: u64,
    /// Q, K and V live in one tensor (GPT-2 `c_attn`, Phi-3 `qkv_proj`, NeoX, Falcon).
    pub fused_qkv: bool,
    /// Gate and up projections live in one tensor (Phi-3 `gate_up_proj`).
    pub fused_gate_up: bool,
    /// Each MoE layer's experts are 3-D tensors (transformers ≥ 5) rather than E modules.
    pub fused_experts: bool,
    /// Gemma-2's tanh soft-capping of attention scores and final logits.
    pub softcap: bool,
    /// Eager attention's softmax runs in fp32 (`softmax(dtype=torch.float32)`), as in most
    /// transformers models; GPT-2's keeps the model dtype.
    pub softmax_fp32: bool,
    /// Dropout after the attention and MLP outputs (GPT-2, Phi, OPT, NeoX, Falcon, StarCoder2);
    /// Llama-style models only have attention dropout.
    pub resid_dropout: bool,
    /// Dropout on the embeddings (GPT-2's `embd_pdrop`, OPT, NeoX, Phi-1/2, StarCoder2).
    pub embed_dropout: bool,

    // ---- Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi K2) -----------------------
    // modeling_deepseek_v3.py, `DeepseekV3Attention` (V2 identical). When `kv_lora_rank` > 0:
    // `head_dim` is the query/key head dim d = d_nope + d_r (`qk_nope_head_dim` +
    // `qk_rope_head_dim`), `kv_heads` = `heads` (keys and values are expanded per head by
    // `kv_b_proj`), so `q_width()` = `kv_width()` = a·d and `v_width()` = a·d_v.
    /// `r_q` (`q_lora_rank`): queries pass through `q_a_proj` [r_q, h] → `q_a_layernorm` [r_q] →
    /// `q_b_proj` [a·d, r_q]; 0 = one plain `q_proj` [a·d, h] (DeepSeek-V2-Lite).
    #[serde(default)]
    pub q_lora_rank: u64,
    /// `r_kv` (`kv_lora_rank`); > 0 makes the attention MLA: `kv_a_proj_with_mqa` [r_kv + d_r, h]
    /// gives the compressed latent (r_kv) and one shared rotary key (d_r); `kv_a_layernorm` [r_kv];
    /// `kv_b_proj` [a·(d_nope + d_v), r_kv] expands the latent to per-head k_nope and v;
    /// `o_proj` [h, a·d_v]. `qkv_bias` puts biases on `q_a_proj` and `kv_a_proj_with_mqa`,
    /// `o_bias` on `o_proj` (DeepSeek's `attention_bias` sets both). 0 = ordinary attention.
    #[serde(default)]
    pub kv_lora_rank: u64,
    /// `d_r` (`qk_rope_head_dim`): the rotary part of each MLA query/key head (the rest,
    /// `head_dim − d_r`, is `qk_nope_head_dim`). Only meaningful with `kv_lora_rank` > 0.
    #[serde(default)]
    pub qk_rope_dim: u64,
    /// `d_v` (`v_head_dim`): MLA value head dim. Only meaningful with `kv_lora_rank` > 0.
    #[serde(default)]
    pub v_head_dim: u64,
    /// DeepSeek-V3.2's sparse-attention indexer on every MLA layer (`Dsa::NONE`: none).
    #[serde(default)]
    pub dsa: Dsa,

    // ---- Attention variants -------------------------------------------------------------------
    /// gpt-oss's attention sinks: a learned logit per head (`sinks` [a], one per layer) joins
    /// each row of the scores before the softmax and is dropped after it
    /// (modeling_gpt_oss.py, `eager_attention_forward`).
    #[serde(default)]
    pub attn_sinks: bool,
    /// Llama 4's weightless L2 norm of q and k (`Llama4TextL2Norm`, `x.float()` normalised,
    /// cast back) on every layer that uses RoPE (those not in `nope_layers`); no parameters.
    #[serde(default)]
    pub qk_l2_norm: bool,
    /// Layers without rotary embedding (NoPE): Llama 4's and SmolLM3's `no_rope_layers` entries
    /// that are 0 (every 4th layer, `no_rope_layer_interval`). Llama 4 also scales the queries of
    /// these layers (`attn_temperature_tuning`).
    #[serde(default)]
    pub nope_layers: LayerRule,
    /// Layers whose attention is local (`window_kind` says how, `window` how far): gpt-oss's and
    /// Gemma's `sliding_attention` layers, Llama 4's `chunked_attention` layers. Other layers
    /// attend to the whole causal prefix.
    #[serde(default)]
    pub window_layers: LayerRule,
    /// Tokens in a local-attention window or chunk (`sliding_window`, `attention_chunk_size`).
    #[serde(default)]
    pub window: u64,
    /// Sliding window or chunked attention on `window_layers`.
    #[serde(default)]
    pub window_kind: WindowKind,

    // ---- Mixture of experts -------------------------------------------------------------------
    /// Layers that hold the MoE block: layer `i` is an MoE layer when `experts` > 0,
    /// `i ≥ dense_layers` and `moe_rule` contains `i`; every other layer has the dense MLP of
    /// `ffn`. `All` (the default) with `dense_layers` = k is DeepSeek's `first_k_dense_replace`;
    /// Llama 4 Maverick is `every:2:1` (`interleave_moe_layer_step` 2); Qwen-MoE's
    /// `decoder_sparse_step`/`mlp_only_layers` become a rule or a list.
    #[serde(default = "LayerRule::all")]
    pub moe_rule: LayerRule,
    /// How router logits become expert weights (see [`Router`]).
    #[serde(default)]
    pub router: Router,
    /// A bias [E] on the router (gpt-oss `router.bias`).
    #[serde(default)]
    pub router_bias: bool,
    /// The router's weight is created and kept in fp32 whatever the model dtype, and its logits
    /// computed in fp32 (DeepSeek-V2/V3, GLM-4.5: `dtype=torch.float32` in the router,
    /// `_keep_in_fp32_modules_strict`); with `Router::Sigmoid` the `e_score_correction_bias`
    /// buffer [E] is fp32 too (a buffer, not a parameter).
    #[serde(default)]
    pub router_fp32: bool,
    /// `n_group`: experts are split into this many groups and only the best `router_group_topk`
    /// groups compete for the top-k (DeepSeek-V3 8/4; 0 or 1 = no group limit). No parameters.
    #[serde(default)]
    pub router_groups: u64,
    /// `topk_group`: groups kept by the group-limited top-k.
    #[serde(default)]
    pub router_group_topk: u64,
    /// Biases on the experts: `gate_up_proj_bias` [E, 2·f_e] and `down_proj_bias` [E, h]
    /// (gpt-oss).
    #[serde(default)]
    pub expert_bias: bool,
    /// Fused experts stored `[E, in, out]` — `gate_up_proj` [E, h, 2·f_e], `down_proj` [E, f_e, h],
    /// applied as `x @ W` (gpt-oss, Llama 4) — instead of transformers' usual `[E, out, in]`.
    /// gpt-oss interleaves gate and up columns (`gate_up[..., ::2]`, `[..., 1::2]`).
    #[serde(default)]
    pub experts_in_out: bool,
    /// Every expert processes every token, its input pre-scaled by the router score (zero for
    /// experts not chosen): Llama 4's `Llama4TextMoe` (`hidden_states.repeat(E, 1) * scores`,
    /// then `torch.bmm` over all E experts). Otherwise tokens are dispatched to their top-k
    /// experts only. Counts are unaffected; `active` still counts top-k experts.
    #[serde(default)]
    pub moe_all_experts: bool,
    /// OLMo's `clip_qkv`: the q, k and v projections are clamped in place
    /// (modeling_olmo.py, `OlmoAttention.forward`: `query_states.clamp_(…)`), whose backward
    /// keeps the projection outputs. No parameters.
    #[serde(default)]
    pub clip_qkv: bool,

    // ---- State-space mixers (Mamba-2: Falcon-H1, Granite 4) -----------------------------------
    /// The Mamba-2 mixer of the layers that have one (`Ssm::NONE`: none).
    #[serde(default)]
    pub ssm: Ssm,

    /// The dtype the checkpoint names for the Mamba-2 SSM or gated DeltaNet recurrent state
    /// (`mamba_ssm_dtype` in its config.json: Qwen3.5 says `float32`; `Auto` when it names none).
    /// It changes no parameter and nothing transformers keeps; the serving engines read it
    /// (`crate::estimator::serve::state_format`).
    #[serde(default)]
    pub ssm_dtype: StateDtype,

    // ---- Gated DeltaNet (Qwen3-Next, Qwen3.5) -------------------------------------------------
    /// The gated DeltaNet linear attention of the layers in `linear_layers` (`Gdn::NONE`: none).
    #[serde(default)]
    pub gdn: Gdn,
    /// The layers whose mixer is the gated DeltaNet (`layer_types` "linear_attention"); the
    /// others run (gated) full attention.
    #[serde(default)]
    pub linear_layers: LayerRule,
    /// Qwen3-Next's gated attention: `q_proj` emits q and a gate (`[b, s, a, 2d]`), the attention
    /// output is multiplied by `sigmoid(gate)` before `o_proj`.
    #[serde(default)]
    pub attn_gate: bool,
}

/// A gated DeltaNet mixer (transformers 5.24 `modeling_qwen3_next.py`
/// `Qwen3NextGatedDeltaNet.__init__`; `modeling_qwen3_5.py` `Qwen3_5GatedDeltaNet.__init__`):
/// Hk key heads of dk, Hv value heads of dv, a depthwise `conv1d` [cd, 1, Kc] over
/// cd = 2·Hk·dk + Hv·dv channels (no bias), `dt_bias` and `A_log` [Hv], the gated RMSNorm
/// weight [dv] and `out_proj` [h, Hv·dv]; the input projections are `in_proj_qkvz`
/// [2·Hk·dk + 2·Hv·dv, h] and `in_proj_ba` [2·Hv, h] (Qwen3-Next) or `in_proj_qkv` [cd, h],
/// `in_proj_z` [Hv·dv, h], `in_proj_b` and `in_proj_a` [Hv, h] (Qwen3.5: `split`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gdn {
    /// Hk (`linear_num_key_heads`); 0 = no mixer.
    pub k_heads: u64,
    /// Hv (`linear_num_value_heads`).
    pub v_heads: u64,
    /// dk (`linear_key_head_dim`).
    pub k_dim: u64,
    /// dv (`linear_value_head_dim`).
    pub v_dim: u64,
    /// Kc (`linear_conv_kernel_dim`).
    pub conv: u64,
    /// Qwen3.5's four input projections instead of Qwen3-Next's two.
    pub split: bool,
}

impl Gdn {
    /// No mixer.
    pub const NONE: Gdn = Gdn { k_heads: 0, v_heads: 0, k_dim: 0, v_dim: 0, conv: 0, split: false };
    /// `torch_chunk_gated_delta_rule`'s chunk (`chunk_size=64`).
    pub const CHUNK: u64 = 64;
    /// Hk·dk: the query (and key) width.
    pub fn key_width(&self) -> u64 {
        self.k_heads * self.k_dim
    }
    /// Hv·dv: the value (and z, and output) width.
    pub fn value_width(&self) -> u64 {
        self.v_heads * self.v_dim
    }
    /// cd = 2·Hk·dk + Hv·dv: the convolution's channels (q, k, v).
    pub fn conv_dim(&self) -> u64 {
        2 * self.key_width() + self.value_width()
    }
}

/// A dtype named for a recurrent (Mamba SSM / gated DeltaNet) state: a checkpoint's
/// `mamba_ssm_dtype`, vLLM's `--mamba-ssm-cache-dtype`, SGLang's `--mamba-ssm-dtype`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StateDtype {
    /// None named: each engine's default applies.
    #[default]
    Auto,
    Float32,
    Bfloat16,
    Float16,
}

impl StateDtype {
    /// Every value with its name, as config.json and the engines' flags spell it.
    pub const NAMES: [(StateDtype, &'static str); 4] = [
        (StateDtype::Auto, "auto"),
        (StateDtype::Float32, "float32"),
        (StateDtype::Bfloat16, "bfloat16"),
        (StateDtype::Float16, "float16"),
    ];

    /// The name (`float32`).
    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(d, _)| *d == self).map_or("auto", |(_, n)| n)
    }

    /// The value of a name (`float32`, `bfloat16`, `float16`, `auto`), case-insensitive.
    pub fn parse(s: &str) -> Option<StateDtype> {
        Self::NAMES.iter().find(|(_, n)| n.eq_ignore_ascii_case(s.trim())).map(|(d, _)| *d)
    }

    /// Bytes per value; `None` for `Auto`.
    pub fn bytes(self) -> Option<u64> {
        match self {
            StateDtype::Auto => None,
            StateDtype::Float32 => Some(4),
            StateDtype::Bfloat16 | StateDtype::Float16 => Some(2),
        }
    }

    /// `self` unless it is `Auto`, else `other`.
    pub fn or(self, other: StateDtype) -> StateDtype {
        if self == StateDtype::Auto {
            other
        } else {
            self
        }
    }
}

/// A Mamba-2 mixer (transformers 5.24 `modeling_falcon_h1.py` `FalconH1Mixer.__init__`,
/// `modeling_granitemoehybrid.py` `GraniteMoeHybridMambaLayer.__init__`): `in_proj` [Din, h] with
/// Din = 2·H·P + 2·G·N + H (gate, x, B, C, dt), a depthwise `conv1d` [cd, 1, Kc] over
/// cd = H·P + 2·G·N channels, `dt_bias`, `A_log`, `D` [H], an optional gated RMSNorm [H·P]
/// and `out_proj` [h, H·P].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ssm {
    /// `H` (`mamba_n_heads`); 0 = no mixer.
    pub heads: u64,
    /// `P` (`mamba_d_head`).
    pub head_dim: u64,
    /// `N` (`mamba_d_state`).
    pub state: u64,
    /// `G` (`mamba_n_groups`).
    pub groups: u64,
    /// `Kc` (`mamba_d_conv`).
    pub conv: u64,
    /// `C` (`mamba_chunk_size`): the SSD scan's chunk.
    pub chunk: u64,
    /// Bias on `conv1d` (`mamba_conv_bias`).
    pub conv_bias: bool,
    /// Bias on `in_proj` (`mamba_proj_bias`).
    pub in_bias: bool,
    /// Bias on `out_proj` (Falcon-H1's `projectors_bias`).
    pub out_bias: bool,
    /// The gated RMSNorm before `out_proj` (Falcon-H1's `mamba_rms_norm`; always in Granite 4).
    pub gated_norm: bool,
    /// Falcon-H1's µP: `in_proj`'s output times the fp32 `mup_vector` buffer [1, 1, Din], the
    /// input times `ssm_in_multiplier`.
    pub mup: bool,
}

impl Ssm {
    /// No mixer.
    pub const NONE: Ssm = Ssm {
        heads: 0,
        head_dim: 0,
        state: 0,
        groups: 0,
        conv: 0,
        chunk: 0,
        conv_bias: false,
        in_bias: false,
        out_bias: false,
        gated_norm: false,
        mup: false,
    };
    /// `d` = H·P: the scan's width.
    pub fn inner(&self) -> u64 {
        self.heads * self.head_dim
    }
    /// `cd` = d + 2·G·N: the convolution's channels (x, B, C).
    pub fn conv_dim(&self) -> u64 {
        self.inner() + 2 * self.groups * self.state
    }
    /// `Din` = d + cd + H: `in_proj`'s output (gate, x, B, C, dt).
    pub fn in_width(&self) -> u64 {
        self.inner() + self.conv_dim() + self.heads
    }
}

/// DeepSeek Sparse Attention's lightning indexer (transformers 5.24
/// `models/deepseek_v32/modeling_deepseek_v32.py`, `DeepseekV32Indexer.__init__`): `wq_b`
/// [H_i·d_i, r_q] on the query latent, `wk` [d_i, h], `k_norm` (LayerNorm d_i, weight and bias),
/// `weights_proj` [H_i, h]. Its forward runs under `torch.no_grad()`: these parameters never get
/// a gradient in transformers (DeepSeek trains them with a separate KL loss transformers does
/// not implement), so they have no gradient and no optimizer state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dsa {
    /// `H_i` (`index_n_heads`); 0 = no indexer.
    pub heads: u64,
    /// `d_i` (`index_head_dim`).
    pub head_dim: u64,
    /// `index_topk`: keys each query keeps (all of them when the sequence is shorter).
    pub topk: u64,
}

impl Dsa {
    /// No indexer.
    pub const NONE: Dsa = Dsa { heads: 0, head_dim: 0, topk: 0 };
}

/// Kimi Linear's forget-gate bias (`KimiLinearForgetGate.dt_bias`), kept in fp32 in every model
/// dtype (`_keep_in_fp32_modules_strict`).
pub const KDA_DT_BIAS: &str = "layers.*.linear_attn.forget_gate.dt_bias";

/// The prefix of the indexer's tensors, which get no gradient ([`Dsa`]).
pub const INDEXER_PREFIX: &str = "layers.*.attn.indexer.";

/// Which part of the model a tensor belongs to (the breakdown's rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    Embedding,
    PositionEmbedding,
    Projection,
    Attention,
    Mlp,
    Router,
    Experts,
    SharedExperts,
    Norms,
    FinalNorm,
    LmHead,
}

impl Part {
    pub fn label(self) -> &'static str {
        match self {
            Part::Embedding => "token embedding",
            Part::PositionEmbedding => "position embedding",
            Part::Projection => "embedding projections",
            Part::Attention => "attention",
            Part::Mlp => "MLP",
            Part::Router => "MoE router",
            Part::Experts => "routed experts",
            Part::SharedExperts => "shared experts",
            Part::Norms => "layer norms",
            Part::FinalNorm => "final norm",
            Part::LmHead => "LM head",
        }
    }

    /// Whether the tensor is repeated in every decoder layer (as opposed to the model's ends).
    pub fn per_layer(self) -> bool {
        matches!(self, Part::Attention | Part::Mlp | Part::Router | Part::Experts | Part::SharedExperts | Part::Norms)
    }
}

/// How Megatron-style tensor parallelism splits a tensor (Shoeybi et al. 2019, §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Split along the output features (Q, K, V, gate, up, fc1 and their biases).
    Column,
    /// Split along the input features (O, down, fc2); their biases stay whole.
    Row,
    /// Vocabulary-parallel embedding and LM head.
    Vocab,
    /// Every rank keeps the whole tensor (norms, row-parallel biases, routers).
    Replicated,
}

/// The linear layers LoRA can target (PEFT's `target_modules`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Linear {
    Q,
    K,
    V,
    /// Fused Q/K/V; targeted when any of q, k, v is.
    Qkv,
    O,
    Gate,
    Up,
    /// Fused gate/up; targeted when gate or up is.
    GateUp,
    Down,
}

/// A set of identical parameter tensors.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TensorGroup {
    /// Parameter name with the layer index as `*`, in transformers' Llama spelling.
    pub name: &'static str,
    /// `[out, in]` for a matrix, `[n]` for a vector, `[E, out, in]` for stacked experts.
    pub shape: Vec<u64>,
    /// Instances in the whole model (e.g. one per layer).
    pub count: u64,
    /// Parameter tensors per instance (E when experts are separate modules, a + k for
    /// StableLM's per-head norms, else 1).
    pub tensors_per_instance: u64,
    pub part: Part,
    pub split: Split,
    /// Set when this is a linear layer's weight.
    pub linear: Option<Linear>,
    /// Instances in one decoder layer that has it (0 for the model's ends; `layer_norms` for
    /// the norms; 1 otherwise).
    pub per_layer: u64,
}

impl TensorGroup {
    /// Elements of one instance.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
    /// An attention tensor of `count` layers, whole on every rank, not a linear's weight.
    fn replicated_attention(name: &'static str, shape: Vec<u64>, count: u64) -> TensorGroup {
        TensorGroup {
            name,
            shape,
            count,
            tensors_per_instance: 1,
            part: Part::Attention,
            split: Split::Replicated,
            linear: None,
            per_layer: 0,
        }
    }
    /// Elements of all instances.
    pub fn total(&self) -> u64 {
        self.numel() * self.count
    }
    /// Parameter tensors of all instances.
    pub fn tensor_count(&self) -> u64 {
        self.count * self.tensors_per_instance
    }
    /// `(rows, cols, matrices per instance)` when each parameter tensor is a matrix (or a
    /// stack of them, as transformers 5 stores experts) — what factored optimizers and Muon
    /// treat as a matrix; `None` for vectors (biases, norms, StableLM's per-head norms).
    pub fn matrix_dims(&self) -> Option<(u64, u64, u64)> {
        match self.shape.as_slice() {
            [e, r, c] => Some((*r, *c, *e)),
            [_, _] if self.tensors_per_instance > 1 => None,
            [r, c] => Some((*r, *c, 1)),
            _ => None,
        }
    }
    /// Elements in one parameter tensor.
    pub fn elements_per_tensor(&self) -> u64 {
        self.numel() / self.tensors_per_instance.max(1)
    }
}

/// Parameter counts of one model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ParamCounts {
    pub total: u64,
    pub tensors: u64,
    /// Parameters a token actually uses in an MoE model (routed experts counted top_k times).
    pub active: u64,
    pub by_part: Vec<(Part, u64)>,
}

impl ModelSpec {
    /// Query width a·d.
    pub fn q_width(&self) -> u64 {
        self.heads * self.head_dim
    }
    /// Key (or value) width k·d.
    pub fn kv_width(&self) -> u64 {
        self.kv_heads * self.head_dim
    }
    /// Value width a·d_v (MLA) or k·d: the input width of `o_proj` is a·d_v (MLA) or a·d.
    pub fn v_width(&self) -> u64 {
        if self.is_mla() {
            self.heads * self.v_head_dim
        } else {
            self.kv_width()
        }
    }
    /// Input width of the attention output projection: a·d_v (MLA) or a·d.
    pub fn o_width(&self) -> u64 {
        if self.is_mla() {
            self.heads * self.v_head_dim
        } else {
            self.q_width()
        }
    }
    /// Multi-head latent attention (`kv_lora_rank` > 0).
    pub fn is_mla(&self) -> bool {
        self.kv_lora_rank > 0
    }
    /// MLA's non-rotary part of a query/key head, `qk_nope_head_dim` = d − d_r.
    pub fn qk_nope_dim(&self) -> u64 {
        self.head_dim.saturating_sub(self.qk_rope_dim)
    }
    /// Dims of each query/key head that get rotary embedding on a RoPE layer: d_r for MLA, else
    /// ⌊d · rotary_pct / 100⌋ (0 without rotary positions).
    pub fn rope_dims(&self) -> u64 {
        if self.positions != Positions::Rope {
            0
        } else if self.is_mla() {
            self.qk_rope_dim
        } else {
            self.head_dim * self.rotary_pct / 100
        }
    }
    /// Whether layer `i` (0-based) holds the MoE block.
    pub fn is_moe_layer(&self, i: u64) -> bool {
        self.experts > 0 && i >= self.dense_layers && i < self.layers && self.moe_rule.contains(i)
    }
    /// MoE layers among layers `range` (clipped to the model).
    pub fn moe_layers_in(&self, range: Range<u64>) -> u64 {
        if self.experts == 0 {
            return 0;
        }
        let end = range.end.min(self.layers);
        let start = range.start.max(self.dense_layers).min(end);
        self.moe_rule.count_in(start..end)
    }
    /// Dense-MLP layers among layers `range` (clipped to the model).
    pub fn dense_mlp_layers_in(&self, range: Range<u64>) -> u64 {
        let end = range.end.min(self.layers);
        let start = range.start.min(end);
        (end - start) - self.moe_layers_in(start..end)
    }
    /// NoPE layers (no rotary embedding) among layers `range` (clipped to the model).
    pub fn nope_layers_in(&self, range: Range<u64>) -> u64 {
        let end = range.end.min(self.layers);
        self.nope_layers.count_in(range.start.min(end)..end)
    }
    /// Local-attention layers (`window_layers`) among layers `range` (clipped to the model).
    pub fn window_layers_in(&self, range: Range<u64>) -> u64 {
        let end = range.end.min(self.layers);
        self.window_layers.count_in(range.start.min(end)..end)
    }
    /// Layers whose MLP is a mixture of experts.
    pub fn moe_layers(&self) -> u64 {
        self.moe_layers_in(0..self.layers)
    }
    /// Layers whose MLP is dense.
    pub fn dense_mlp_layers(&self) -> u64 {
        self.layers - self.moe_layers()
    }
    /// The decoder layers `range` as a model of their own, for a pipeline stage: `layers` is the
    /// stage's layer count and every per-layer rule (`dense_layers`, `moe_rule`, `nope_layers`,
    /// `window_layers`) is re-indexed so the stage's first layer is layer 0. The ends of the model
    /// (embedding, final norm, head) stay in the spec; which stage holds them is the caller's.
    pub fn stage(&self, range: Range<u64>) -> ModelSpec {
        let end = range.end.min(self.layers);
        let start = range.start.min(end);
        let mut s = self.clone();
        s.layers = end - start;
        s.dense_layers = self.dense_layers.clamp(start, end) - start;
        s.moe_rule = self.moe_rule.stage(start..end);
        s.nope_layers = self.nope_layers.stage(start..end);
        s.window_layers = self.window_layers.stage(start..end);
        s
    }
    /// The architectural features this model uses beyond a uniform pre-2025 decoder, named for
    /// messages ("… is not measured yet"): empty for every family before issue 10.
    pub fn features(&self) -> Vec<&'static str> {
        let mut f = Vec::new();
        let mut add = |on: bool, name| {
            if on {
                f.push(name)
            }
        };
        add(self.is_mla(), "multi-head latent attention (MLA)");
        add(self.attn_sinks, "attention sinks");
        add(self.qk_l2_norm, "L2 q/k norm");
        add(self.nope_layers.count(self.layers) > 0, "NoPE layers");
        add(self.window_layers.count(self.layers) > 0, "sliding-window or chunked attention layers");
        add(self.experts > 0 && self.moe_rule != LayerRule::All, "interleaved dense and MoE layers");
        add(self.experts > 0 && self.router != Router::Softmax, "a router other than softmax-then-top-k");
        add(self.experts > 0 && self.router_bias, "a router bias");
        add(self.experts > 0 && self.router_fp32, "an fp32 router");
        add(self.experts > 0 && self.router_groups > 1, "group-limited expert routing");
        add(self.experts > 0 && self.expert_bias, "expert biases");
        add(self.experts > 0 && self.experts_in_out, "experts stored [E, in, out]");
        add(self.experts > 0 && self.moe_all_experts, "every expert computing every token");
        add(self.act == Activation::SwigluClamped, "clamped SwiGLU");
        f
    }
    /// Width of the token embedding (`embed_proj` when OPT projects it).
    pub fn embed_width(&self) -> u64 {
        if self.embed_proj > 0 {
            self.embed_proj
        } else {
            self.hidden
        }
    }

    /// Every parameter tensor of the model, grouped.
    ///
    /// Shapes follow transformers' modules: `nn.Linear(in, out)` holds an `[out, in]` weight and
    /// an `[out]` bias; GPT-2's `Conv1D` holds `[in, out]`, which counts the same.
    pub fn tensors(&self) -> Vec<TensorGroup> {
        let (h, l) = (self.hidden, self.layers);
        let (qw, kvw) = (self.q_width(), self.kv_width());
        let mut g: Vec<TensorGroup> = Vec::with_capacity(32);
        let push = |g: &mut Vec<TensorGroup>,
                    name: &'static str,
                    shape: Vec<u64>,
                    count: u64,
                    part: Part,
                    split: Split,
                    linear: Option<Linear>| {
            if count > 0 && shape.iter().all(|&d| d > 0) {
                g.push(TensorGroup { name, shape, count, tensors_per_instance: 1, part, split, linear, per_layer: 0 });
            }
        };

        // The ends of the model (first pipeline stage).
        let ew = self.embed_width();
        push(&mut g, "embed_tokens.weight", vec![self.vocab, ew], 1, Part::Embedding, Split::Vocab, None);
        if self.positions == Positions::Learned {
            let rows = self.max_pos + self.pos_offset;
            push(&mut g, "embed_positions.weight", vec![rows, h], 1, Part::PositionEmbedding, Split::Replicated, None);
        }
        if self.embed_proj > 0 {
            push(&mut g, "project_in.weight", vec![h, ew], 1, Part::Projection, Split::Replicated, None);
        }

        // Attention, per (full-attention) layer; Qwen3-Next's q_proj also emits the gate.
        let la = self.attention_layers();
        let qpw = if self.attn_gate { 2 * qw } else { qw };
        if self.is_mla() {
            self.push_mla(&mut g);
        } else if self.fused_qkv {
            push(&mut g, "layers.*.attn.qkv_proj.weight", vec![qw + 2 * kvw, h], la, Part::Attention, Split::Column, Some(Linear::Qkv));
            if self.qkv_bias {
                push(&mut g, "layers.*.attn.qkv_proj.bias", vec![qw + 2 * kvw], la, Part::Attention, Split::Column, None);
            }
        } else {
            push(&mut g, "layers.*.attn.q_proj.weight", vec![qpw, h], la, Part::Attention, Split::Column, Some(Linear::Q));
            push(&mut g, "layers.*.attn.k_proj.weight", vec![kvw, h], la, Part::Attention, Split::Column, Some(Linear::K));
            push(&mut g, "layers.*.attn.v_proj.weight", vec![kvw, h], la, Part::Attention, Split::Column, Some(Linear::V));
            if self.qkv_bias {
                push(&mut g, "layers.*.attn.q_proj.bias", vec![qpw], la, Part::Attention, Split::Column, None);
                push(&mut g, "layers.*.attn.k_proj.bias", vec![kvw], la, Part::Attention, Split::Column, None);
                push(&mut g, "layers.*.attn.v_proj.bias", vec![kvw], la, Part::Attention, Split::Column, None);
            }
        }
        if !self.is_mla() {
            push(&mut g, "layers.*.attn.o_proj.weight", vec![h, qw], la, Part::Attention, Split::Row, Some(Linear::O));
            if self.o_bias {
                push(&mut g, "layers.*.attn.o_proj.bias", vec![h], la, Part::Attention, Split::Replicated, None);
            }
        }
        if self.attn_sinks {
            // gpt-oss: `sinks` [a], one logit per head (split with the heads).
            push(&mut g, "layers.*.attn.sinks", vec![self.heads], la, Part::Attention, Split::Column, None);
        }
        let norm_bias = self.norm == NormKind::Layernorm;
        match self.qk_norm {
            QkNorm::None => {}
            QkNorm::Head | QkNorm::Full => {
                let (qn, kn) = if self.qk_norm == QkNorm::Head { (self.head_dim, self.head_dim) } else { (qw, kvw) };
                push(&mut g, "layers.*.attn.q_norm.weight", vec![qn], la, Part::Attention, Split::Replicated, None);
                push(&mut g, "layers.*.attn.k_norm.weight", vec![kn], la, Part::Attention, Split::Replicated, None);
                if norm_bias {
                    push(&mut g, "layers.*.attn.q_norm.bias", vec![qn], la, Part::Attention, Split::Replicated, None);
                    push(&mut g, "layers.*.attn.k_norm.bias", vec![kn], la, Part::Attention, Split::Replicated, None);
                }
            }
            QkNorm::PerHead => {
                // StableLM: nn.ModuleList of one bias-free LayerNorm(d) per head.
                g.push(TensorGroup {
                    name: "layers.*.attn.q_layernorm.norms.*.weight",
                    shape: vec![self.heads, self.head_dim],
                    count: la,
                    tensors_per_instance: self.heads,
                    part: Part::Attention,
                    split: Split::Replicated,
                    linear: None,
                    per_layer: 0,
                });
                g.push(TensorGroup {
                    name: "layers.*.attn.k_layernorm.norms.*.weight",
                    shape: vec![self.kv_heads, self.head_dim],
                    count: la,
                    tensors_per_instance: self.kv_heads,
                    part: Part::Attention,
                    split: Split::Replicated,
                    linear: None,
                    per_layer: 0,
                });
            }
        }

        // Dense MLP, per dense layer.
        let dl = self.dense_mlp_layers();
        self.push_mlp(&mut g, self.ffn, dl, Part::Mlp);

        // Mixture of experts, per MoE layer.
        let ml = self.moe_layers();
        if ml > 0 {
            let (e, fe) = (self.experts, self.expert_ffn);
            g.push(TensorGroup {
                name: "layers.*.mlp.router.weight",
                shape: vec![e, h],
                count: ml,
                tensors_per_instance: 1,
                part: Part::Router,
                split: Split::Replicated,
                linear: None,
                per_layer: 0,
            });
            if self.router_bias {
                push(&mut g, "layers.*.mlp.router.bias", vec![e], ml, Part::Router, Split::Replicated, None);
            }
            let per = if self.fused_experts { 1 } else { e };
            let expert = |name, shape: Vec<u64>, linear, split| TensorGroup {
                name,
                shape,
                count: ml,
                tensors_per_instance: per,
                part: Part::Experts,
                split,
                linear: Some(linear),
                per_layer: 0,
            };
            if self.fused_experts {
                // transformers 5 stacks the experts: [E, out, in], or [E, in, out] applied as x @ W
                // (modeling_gpt_oss.py `GptOssExperts`, modeling_llama4.py `Llama4TextExperts`).
                let (gate_up, down) =
                    if self.experts_in_out { (vec![e, h, 2 * fe], vec![e, fe, h]) } else { (vec![e, 2 * fe, h], vec![e, h, fe]) };
                g.push(expert("layers.*.mlp.experts.gate_up_proj", gate_up, Linear::GateUp, Split::Column));
                g.push(expert("layers.*.mlp.experts.down_proj", down, Linear::Down, Split::Row));
            } else {
                g.push(expert("layers.*.mlp.experts.*.gate_proj.weight", vec![e, fe, h], Linear::Gate, Split::Column));
                g.push(expert("layers.*.mlp.experts.*.up_proj.weight", vec![e, fe, h], Linear::Up, Split::Column));
                g.push(expert("layers.*.mlp.experts.down_proj", vec![e, h, fe], Linear::Down, Split::Row));
            }
            if self.expert_bias {
                // gpt-oss: `gate_up_proj_bias` [E, 2·f_e], `down_proj_bias` [E, h].
                let bias = |name, shape, split| TensorGroup { linear: None, ..expert(name, shape, Linear::Down, split) };
                g.push(bias("layers.*.mlp.experts.gate_up_proj_bias", vec![e, 2 * fe], Split::Column));
                g.push(bias("layers.*.mlp.experts.down_proj_bias", vec![e, h], Split::Replicated));
            }
            if self.shared_experts > 0 {
                self.push_mlp(&mut g, self.shared_ffn * self.shared_experts, ml, Part::SharedExperts);
                if self.shared_gate {
                    g.push(TensorGroup {
                        name: "layers.*.mlp.shared_expert_gate.weight",
                        shape: vec![1, h],
                        count: ml,
                        tensors_per_instance: 1,
                        part: Part::SharedExperts,
                        split: Split::Replicated,
                        linear: None,
                        per_layer: 0,
                    });
                }
            }
        }

        if self.ssm.heads > 0 {
            self.push_ssm(&mut g);
        }
        if self.gdn.k_heads > 0 && self.family == Family::KimiLinear {
            self.push_kda(&mut g);
        } else if self.gdn.k_heads > 0 {
            self.push_gdn(&mut g);
        }

        // Norms, per layer.
        let nt = self.norm.tensors();
        if nt > 0 {
            push(&mut g, "layers.*.norm.weight", vec![h], l * self.layer_norms, Part::Norms, Split::Replicated, None);
            if norm_bias {
                push(&mut g, "layers.*.norm.bias", vec![h], l * self.layer_norms, Part::Norms, Split::Replicated, None);
            }
        }

        // The other end (last pipeline stage).
        if self.final_norm && nt > 0 {
            push(&mut g, "norm.weight", vec![h], 1, Part::FinalNorm, Split::Replicated, None);
            if norm_bias {
                push(&mut g, "norm.bias", vec![h], 1, Part::FinalNorm, Split::Replicated, None);
            }
        }
        if self.embed_proj > 0 {
            push(&mut g, "project_out.weight", vec![ew, h], 1, Part::Projection, Split::Replicated, None);
        }
        if !self.tied {
            push(&mut g, "lm_head.weight", vec![self.vocab, ew], 1, Part::LmHead, Split::Vocab, None);
        }
        if self.head_bias {
            push(&mut g, "lm_head.bias", vec![self.vocab], 1, Part::LmHead, Split::Vocab, None);
        }
        for t in g.iter_mut().filter(|t| t.part.per_layer()) {
            t.per_layer = if t.part == Part::Norms { self.layer_norms } else { 1 };
        }
        g
    }

    /// The layers with (full) attention: all but the linear-attention ones.
    pub fn attention_layers(&self) -> u64 {
        self.layers - self.linear_attention_layers()
    }

    /// The layers whose mixer replaces attention (`layer_types` "linear_attention"): a gated
    /// DeltaNet (Qwen3-Next, Qwen3.5) or a Mamba-2 mixer (Granite 4.0-H's "mamba" layers).
    pub fn linear_attention_layers(&self) -> u64 {
        if self.gdn.k_heads == 0 && self.ssm.heads == 0 {
            return 0;
        }
        self.linear_layers.count_in(0..self.layers)
    }

    /// The layers with a Mamba-2 mixer: with no `linear_layers`, every layer, beside its
    /// attention (Falcon-H1's parallel hybrid, `FalconH1DecoderLayer`); else the
    /// `linear_layers`, in place of attention (Granite 4.0-H, `GraniteMoeHybridDecoderLayer`).
    pub fn ssm_layers(&self) -> u64 {
        if self.ssm.heads == 0 {
            return 0;
        }
        match self.linear_attention_layers() {
            0 => self.layers,
            n => n,
        }
    }

    /// The gated DeltaNet's tensors on its layers (`Qwen3NextGatedDeltaNet.__init__`,
    /// registration order: conv1d, the input projections, dt_bias, A_log, norm, out_proj).
    fn push_gdn(&self, g: &mut Vec<TensorGroup>) {
        let (h, m) = (self.hidden, self.gdn);
        let l = self.linear_attention_layers();
        if l == 0 {
            return;
        }
        let mut add = |name: &'static str, shape: Vec<u64>| g.push(TensorGroup::replicated_attention(name, shape, l));
        add("layers.*.linear_attn.conv1d.weight", vec![m.conv_dim(), 1, m.conv]);
        if m.split {
            add("layers.*.linear_attn.in_proj_qkv.weight", vec![m.conv_dim(), h]);
            add("layers.*.linear_attn.in_proj_z.weight", vec![m.value_width(), h]);
            add("layers.*.linear_attn.in_proj_b.weight", vec![m.v_heads, h]);
            add("layers.*.linear_attn.in_proj_a.weight", vec![m.v_heads, h]);
        } else {
            add("layers.*.linear_attn.in_proj_qkvz.weight", vec![2 * m.key_width() + 2 * m.value_width(), h]);
            add("layers.*.linear_attn.in_proj_ba.weight", vec![2 * m.v_heads, h]);
        }
        add("layers.*.linear_attn.dt_bias", vec![m.v_heads]);
        add("layers.*.linear_attn.A_log", vec![m.v_heads]);
        add("layers.*.linear_attn.norm.weight", vec![m.v_dim]);
        add("layers.*.linear_attn.out_proj.weight", vec![h, m.value_width()]);
    }

    /// Kimi Delta Attention's tensors on its layers (transformers 5.24 `modeling_kimi_linear.py`
    /// `KimiLinearDeltaAttention.__init__`, H = `gdn.v_heads` heads of K = `gdn.v_dim`, named
    /// parameters' order: q/k/v_proj [HK, h], conv1d [3HK, 1, Kc], the forget gate's own
    /// `dt_bias` [HK] and `A_log` [1, 1, H, 1] before its `f_a_proj` [K, h] and `f_b_proj`
    /// [HK, K], `b_proj` [H, h], `g_a_proj` [K, h], `g_b_proj` [HK, K], `o_norm` [K],
    /// `o_proj` [h, HK]).
    fn push_kda(&self, g: &mut Vec<TensorGroup>) {
        let (h, m) = (self.hidden, self.gdn);
        let (l, hk, k) = (self.linear_attention_layers(), m.value_width(), m.v_dim);
        let mut add = |name: &'static str, shape: Vec<u64>, linear: Option<Linear>| {
            if l > 0 {
                g.push(TensorGroup { linear, ..TensorGroup::replicated_attention(name, shape, l) });
            }
        };
        add("layers.*.linear_attn.q_proj.weight", vec![hk, h], Some(Linear::Q));
        add("layers.*.linear_attn.k_proj.weight", vec![hk, h], Some(Linear::K));
        add("layers.*.linear_attn.v_proj.weight", vec![hk, h], Some(Linear::V));
        add("layers.*.linear_attn.conv1d.weight", vec![m.conv_dim(), 1, m.conv], None);
        add(KDA_DT_BIAS, vec![hk], None);
        add("layers.*.linear_attn.forget_gate.A_log", vec![1, 1, m.v_heads, 1], None);
        add("layers.*.linear_attn.forget_gate.f_a_proj.weight", vec![k, h], None);
        add("layers.*.linear_attn.forget_gate.f_b_proj.weight", vec![hk, k], None);
        add("layers.*.linear_attn.b_proj.weight", vec![m.v_heads, h], None);
        add("layers.*.linear_attn.g_a_proj.weight", vec![k, h], None);
        add("layers.*.linear_attn.g_b_proj.weight", vec![hk, k], None);
        add("layers.*.linear_attn.o_norm.weight", vec![k], None);
        add("layers.*.linear_attn.o_proj.weight", vec![h, hk], Some(Linear::O));
    }

    /// The Mamba-2 mixer's tensors on its layers ([`ModelSpec::ssm_layers`];
    /// `FalconH1Mixer.__init__` registration order: conv1d, in_proj, dt_bias, A_log, norm, D,
    /// out_proj).
    fn push_ssm(&self, g: &mut Vec<TensorGroup>) {
        let (h, l, m) = (self.hidden, self.ssm_layers(), self.ssm);
        let mut add = |name: &'static str, shape: Vec<u64>, split: Split, linear: Option<Linear>| {
            g.push(TensorGroup { name, shape, count: l, tensors_per_instance: 1, part: Part::Attention, split, linear, per_layer: 0 });
        };
        add("layers.*.mamba.conv1d.weight", vec![m.conv_dim(), 1, m.conv], Split::Replicated, None);
        if m.conv_bias {
            add("layers.*.mamba.conv1d.bias", vec![m.conv_dim()], Split::Replicated, None);
        }
        add("layers.*.mamba.in_proj.weight", vec![m.in_width(), h], Split::Replicated, None);
        if m.in_bias {
            add("layers.*.mamba.in_proj.bias", vec![m.in_width()], Split::Replicated, None);
        }
        add("layers.*.mamba.dt_bias", vec![m.heads], Split::Replicated, None);
        add("layers.*.mamba.A_log", vec![m.heads], Split::Replicated, None);
        if m.gated_norm {
            add("layers.*.mamba.norm.weight", vec![m.inner()], Split::Replicated, None);
        }
        add("layers.*.mamba.D", vec![m.heads], Split::Replicated, None);
        add("layers.*.mamba.out_proj.weight", vec![h, m.inner()], Split::Replicated, None);
        if m.out_bias {
            add("layers.*.mamba.out_proj.bias", vec![h], Split::Replicated, None);
        }
    }

    /// MLA's attention tensors (modeling_deepseek_v3.py, `DeepseekV3Attention.__init__`; V2 is
    /// identical). Tensor parallelism follows transformers' plan (`base_model_tp_plan`): the
    /// down-projections `q_a_proj` and `kv_a_proj_with_mqa` are whole on every rank, the
    /// up-projections column-parallel, `o_proj` row-parallel.
    fn push_mla(&self, g: &mut Vec<TensorGroup>) {
        // Kimi Linear: MLA on its full-attention layers only.
        let (h, l, a) = (self.hidden, self.attention_layers(), self.heads);
        let (rq, rkv, dr, dv) = (self.q_lora_rank, self.kv_lora_rank, self.qk_rope_dim, self.v_head_dim);
        let mut add = |name, shape: Vec<u64>, split, linear| {
            if shape.iter().all(|&d| d > 0) {
                g.push(TensorGroup { name, shape, count: l, tensors_per_instance: 1, part: Part::Attention, split, linear, per_layer: 0 });
            }
        };
        if rq > 0 {
            add("layers.*.attn.q_a_proj.weight", vec![rq, h], Split::Replicated, Some(Linear::Q));
            if self.qkv_bias {
                add("layers.*.attn.q_a_proj.bias", vec![rq], Split::Replicated, None);
            }
            add("layers.*.attn.q_a_layernorm.weight", vec![rq], Split::Replicated, None);
            add("layers.*.attn.q_b_proj.weight", vec![a * self.head_dim, rq], Split::Column, Some(Linear::Q));
        } else {
            add("layers.*.attn.q_proj.weight", vec![a * self.head_dim, h], Split::Column, Some(Linear::Q));
        }
        add("layers.*.attn.kv_a_proj_with_mqa.weight", vec![rkv + dr, h], Split::Replicated, Some(Linear::K));
        if self.qkv_bias {
            add("layers.*.attn.kv_a_proj_with_mqa.bias", vec![rkv + dr], Split::Replicated, None);
        }
        add("layers.*.attn.kv_a_layernorm.weight", vec![rkv], Split::Replicated, None);
        add("layers.*.attn.kv_b_proj.weight", vec![a * (self.qk_nope_dim() + dv), rkv], Split::Column, Some(Linear::V));
        add("layers.*.attn.o_proj.weight", vec![h, a * dv], Split::Row, Some(Linear::O));
        if self.o_bias {
            add("layers.*.attn.o_proj.bias", vec![h], Split::Replicated, None);
        }
        // DeepSeek-V3.2's indexer (`DeepseekV32Attention.__init__` registers it after o_proj):
        // whole on every rank (no tensor-parallel plan), not a LoRA target.
        let x = self.dsa;
        if x.heads > 0 {
            add("layers.*.attn.indexer.wq_b.weight", vec![x.heads * x.head_dim, rq], Split::Replicated, None);
            add("layers.*.attn.indexer.wk.weight", vec![x.head_dim, h], Split::Replicated, None);
            add("layers.*.attn.indexer.k_norm.weight", vec![x.head_dim], Split::Replicated, None);
            add("layers.*.attn.indexer.k_norm.bias", vec![x.head_dim], Split::Replicated, None);
            add("layers.*.attn.indexer.weights_proj.weight", vec![x.heads, h], Split::Replicated, None);
        }
    }

    fn push_mlp(&self, g: &mut Vec<TensorGroup>, f: u64, count: u64, part: Part) {
        if count == 0 || f == 0 {
            return;
        }
        let h = self.hidden;
        let mut add = |name, shape: Vec<u64>, split, linear| {
            g.push(TensorGroup { name, shape, count, tensors_per_instance: 1, part, split, linear, per_layer: 0 })
        };
        let shared = part == Part::SharedExperts;
        match self.mlp {
            MlpKind::Gated => {
                if self.fused_gate_up {
                    add(
                        if shared { "layers.*.mlp.shared_expert.gate_up_proj.weight" } else { "layers.*.mlp.gate_up_proj.weight" },
                        vec![2 * f, h],
                        Split::Column,
                        Some(Linear::GateUp),
                    );
                    if self.mlp_bias {
                        add("layers.*.mlp.gate_up_proj.bias", vec![2 * f], Split::Column, None);
                    }
                } else {
                    add(
                        if shared { "layers.*.mlp.shared_expert.gate_proj.weight" } else { "layers.*.mlp.gate_proj.weight" },
                        vec![f, h],
                        Split::Column,
                        Some(Linear::Gate),
                    );
                    add(
                        if shared { "layers.*.mlp.shared_expert.up_proj.weight" } else { "layers.*.mlp.up_proj.weight" },
                        vec![f, h],
                        Split::Column,
                        Some(Linear::Up),
                    );
                    if self.mlp_bias {
                        add("layers.*.mlp.gate_proj.bias", vec![f], Split::Column, None);
                        add("layers.*.mlp.up_proj.bias", vec![f], Split::Column, None);
                    }
                }
            }
            MlpKind::Plain => {
                add(
                    if shared { "layers.*.mlp.shared_expert.up_proj.weight" } else { "layers.*.mlp.up_proj.weight" },
                    vec![f, h],
                    Split::Column,
                    Some(Linear::Up),
                );
                if self.mlp_bias {
                    add("layers.*.mlp.up_proj.bias", vec![f], Split::Column, None);
                }
            }
        }
        add(
            if shared { "layers.*.mlp.shared_expert.down_proj.weight" } else { "layers.*.mlp.down_proj.weight" },
            vec![h, f],
            Split::Row,
            Some(Linear::Down),
        );
        if self.mlp_bias {
            add("layers.*.mlp.down_proj.bias", vec![h], Split::Replicated, None);
        }
        if self.act == Activation::Xielu && !shared {
            // ApertusMLP: `self.act_fn = XIELUActivation(dtype=config.dtype)`, registered after
            // the projections: `alpha_p` and `alpha_n`, `[1]` each.
            add("layers.*.mlp.act_fn.alpha_p", vec![1], Split::Replicated, None);
            add("layers.*.mlp.act_fn.alpha_n", vec![1], Split::Replicated, None);
        }
    }

    /// Total, active and per-part parameter counts and the number of parameter tensors.
    pub fn counts(&self) -> ParamCounts {
        count_groups(self, &self.tensors())
    }

    /// Checks that the numbers describe a buildable model, naming the first offending key.
    pub fn validate(&self) -> Result<(), ModelError> {
        let nonzero = [
            ("vocab", self.vocab),
            ("hidden", self.hidden),
            ("layers", self.layers),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
        ];
        for (key, v) in nonzero {
            if v == 0 {
                return Err(ModelError::Zero(key));
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(ModelError::Invalid {
                key: "kv_heads",
                reason: format!("{} query heads cannot be grouped over {} key/value heads", self.heads, self.kv_heads),
            });
        }
        if self.experts == 0 && self.ffn == 0 {
            return Err(ModelError::Zero("ffn"));
        }
        if self.experts > 0 {
            if self.top_k == 0 || self.top_k > self.experts {
                return Err(ModelError::Invalid { key: "top_k", reason: format!("must be between 1 and the {} experts", self.experts) });
            }
            if self.expert_ffn == 0 {
                return Err(ModelError::Zero("expert_ffn"));
            }
            if self.dense_layers > self.layers {
                return Err(ModelError::Invalid { key: "dense_layers", reason: format!("exceeds the {} layers", self.layers) });
            }
            if self.dense_mlp_layers() > 0 && self.ffn == 0 {
                return Err(ModelError::Zero("ffn"));
            }
        }
        if !(1..=4).contains(&self.layer_norms) {
            return Err(ModelError::Invalid { key: "layer_norms", reason: "must be 1, 2, 3 or 4".into() });
        }
        if self.rotary_pct > 100 {
            return Err(ModelError::Invalid { key: "rotary_pct", reason: "is a percentage (0–100)".into() });
        }
        if self.is_mla() {
            if self.qk_rope_dim == 0 || self.qk_rope_dim > self.head_dim {
                return Err(ModelError::Invalid {
                    key: "qk_rope_dim",
                    reason: format!("must be between 1 and the {} dims of an MLA query/key head", self.head_dim),
                });
            }
            if self.v_head_dim == 0 {
                return Err(ModelError::Zero("v_head_dim"));
            }
            if self.kv_heads != self.heads {
                return Err(ModelError::Invalid {
                    key: "kv_heads",
                    reason: format!("must equal the {} query heads under MLA (kv_b_proj expands keys and values per head)", self.heads),
                });
            }
        }
        for (key, rule) in [("moe_rule", &self.moe_rule), ("nope_layers", &self.nope_layers), ("window_layers", &self.window_layers)] {
            rule.check().map_err(|reason| ModelError::Invalid { key, reason })?;
        }
        if self.window == 0 && self.window_layers.count(self.layers) > 0 {
            return Err(ModelError::Zero("window"));
        }
        if self.experts > 0 && self.router_groups > 1 {
            if !self.experts.is_multiple_of(self.router_groups) {
                return Err(ModelError::Invalid {
                    key: "router_groups",
                    reason: format!("{} experts do not split into {} groups", self.experts, self.router_groups),
                });
            }
            if self.router_group_topk == 0 || self.router_group_topk > self.router_groups {
                return Err(ModelError::Invalid {
                    key: "router_group_topk",
                    reason: format!("must be between 1 and the {} groups", self.router_groups),
                });
            }
        }
        if self.act == Activation::SwigluClamped && self.mlp != MlpKind::Gated {
            return Err(ModelError::Invalid { key: "act", reason: "the clamped SwiGLU needs a gated MLP".into() });
        }
        // Sizes beyond these are typos, and keep every product far inside u64.
        let limits = [
            ("vocab", self.vocab, 1 << 24),
            ("hidden", self.hidden, 1 << 20),
            ("layers", self.layers, 1 << 14),
            ("heads", self.heads, 1 << 14),
            ("head_dim", self.head_dim, 1 << 14),
            ("ffn", self.ffn, 1 << 22),
            ("experts", self.experts, 1 << 12),
            ("expert_ffn", self.expert_ffn, 1 << 22),
            ("shared_ffn", self.shared_ffn, 1 << 22),
            ("shared_experts", self.shared_experts, 1 << 8),
            ("max_pos", self.max_pos, 1 << 26),
            ("embed_proj", self.embed_proj, 1 << 20),
            ("q_lora_rank", self.q_lora_rank, 1 << 20),
            ("kv_lora_rank", self.kv_lora_rank, 1 << 20),
            ("qk_rope_dim", self.qk_rope_dim, 1 << 14),
            ("v_head_dim", self.v_head_dim, 1 << 14),
            ("index_n_heads", self.dsa.heads, 1 << 12),
            ("index_head_dim", self.dsa.head_dim, 1 << 14),
            ("index_topk", self.dsa.topk, 1 << 26),
            ("window", self.window, 1 << 26),
            ("router_groups", self.router_groups, 1 << 12),
            ("router_group_topk", self.router_group_topk, 1 << 12),
            ("ssm_heads", self.ssm.heads, 1 << 14),
            ("ssm_head_dim", self.ssm.head_dim, 1 << 14),
            ("ssm_state", self.ssm.state, 1 << 14),
            ("ssm_groups", self.ssm.groups, 1 << 14),
            ("ssm_conv", self.ssm.conv, 1 << 14),
            ("ssm_chunk", self.ssm.chunk, 1 << 26),
            ("gdn_k_heads", self.gdn.k_heads, 1 << 14),
            ("gdn_v_heads", self.gdn.v_heads, 1 << 14),
            ("gdn_k_dim", self.gdn.k_dim, 1 << 14),
            ("gdn_v_dim", self.gdn.v_dim, 1 << 14),
            ("gdn_conv", self.gdn.conv, 1 << 14),
        ];
        for (key, v, max) in limits {
            if v > max {
                return Err(ModelError::Invalid { key, reason: format!("{v} is beyond the supported {max}") });
            }
        }
        // Each size within its limit, their products can still leave u64 (2¹² experts × 2²²
        // expert_ffn × 2²⁰ hidden × 2¹⁴ layers): the parameter count, in u128, stays below
        // MAX_PARAMETERS (a thousand times the largest model trained), naming the largest tensor.
        let groups = self.tensors();
        let sized = |t: &TensorGroup| t.shape.iter().fold(t.count as u128, |n, &d| n.saturating_mul(d as u128));
        let total: u128 = groups.iter().map(sized).fold(0, u128::saturating_add);
        if total > MAX_PARAMETERS {
            let key = groups.iter().max_by_key(|t| sized(t)).map_or("hidden", |t| t.name);
            return Err(ModelError::Invalid {
                key,
                reason: format!("makes a model of {total} parameters, beyond the supported {MAX_PARAMETERS}"),
            });
        }
        Ok(())
    }
}

/// Sums a tensor table into counts.
pub fn count_groups(spec: &ModelSpec, groups: &[TensorGroup]) -> ParamCounts {
    let mut by_part: Vec<(Part, u64)> = Vec::new();
    let (mut total, mut tensors, mut inactive) = (0u64, 0u64, 0u64);
    for t in groups {
        total += t.total();
        tensors += t.tensor_count();
        if t.part == Part::Experts && spec.experts > 0 {
            // Only top_k of the E experts run for a token.
            inactive += t.total() / spec.experts * (spec.experts - spec.top_k);
        }
        match by_part.iter_mut().find(|(p, _)| *p == t.part) {
            Some((_, n)) => *n += t.total(),
            None => by_part.push((t.part, t.total())),
        }
    }
    by_part.sort_by_key(|(p, _)| *p);
    ParamCounts { total, tensors, active: total - inactive, by_part }
}

/// The most parameters a model may have (10¹⁵: a thousand times the largest trained; keeps every
/// count inside u64).
pub const MAX_PARAMETERS: u128 = 1_000_000_000_000_000;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    #[error("`{0}` must be at least 1")]
    Zero(&'static str),
    #[error("`{key}` {reason}")]
    Invalid { key: &'static str, reason: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size within its own limit, a MoE of 2¹² experts × 2²² × 2²⁰ over 2¹⁴ layers has
    /// some 2⁷⁰ parameters: refused by name instead of overflowing the count (found by
    /// tests/fuzz.rs on a random config.json).
    #[test]
    fn a_model_whose_sizes_are_each_allowed_but_whose_parameters_overflow_is_refused_by_name() {
        let mut m = crate::estimator::presets::preset("mixtral-8x7b-v0.1").expect("preset").spec;
        assert_eq!(m.validate(), Ok(()));
        (m.experts, m.top_k, m.expert_ffn, m.hidden, m.layers) = (1 << 12, 2, 1 << 22, 1 << 20, 1 << 14);
        let err = m.validate().expect_err("refused").to_string();
        assert!(err.contains("beyond the supported 1000000000000000"), "{err}");
    }

    /// The gated DeltaNet's and Mamba-2's sizes have limits too: a query of
    /// `gdn_k_dim=1400000000&gdn_k_heads=6600000000` on a model without linear layers left the
    /// parameter count alone but overflowed the step's key width, 2·Hk·dk (found by
    /// tests/fuzz.rs in CI, a debug build).
    #[test]
    fn a_gated_deltanet_or_mamba_size_beyond_its_limit_is_refused_by_name() {
        let base = crate::estimator::presets::preset("llama-3.1-8b").expect("preset").spec;
        let mut m = base.clone();
        (m.gdn.k_dim, m.gdn.k_heads) = (1_400_000_000, 6_600_000_000);
        let err = m.validate().expect_err("refused").to_string();
        assert!(err.contains("`gdn_k_heads`") && err.contains("beyond the supported 16384"), "{err}");
        let mut m = base;
        m.ssm.state = 1 << 40;
        assert!(m.validate().expect_err("refused").to_string().contains("`ssm_state`"));
    }

    /// A toy GPT-2-shaped model whose count is worked out by hand below.
    fn toy_gpt2() -> ModelSpec {
        ModelSpec {
            family: Family::Gpt2,
            vocab: 10,
            hidden: 4,
            layers: 2,
            heads: 2,
            kv_heads: 2,
            head_dim: 2,
            ffn: 16,
            mlp: MlpKind::Plain,
            act: Activation::GeluNew,
            norm: NormKind::Layernorm,
            layer_norms: 2,
            final_norm: true,
            qk_norm: QkNorm::None,
            qkv_bias: true,
            o_bias: true,
            mlp_bias: true,
            head_bias: false,
            tied: true,
            positions: Positions::Learned,
            max_pos: 8,
            pos_offset: 0,
            rotary_pct: 0,
            parallel: false,
            embed_proj: 0,
            experts: 0,
            top_k: 0,
            expert_ffn: 0,
            shared_experts: 0,
            shared_ffn: 0,
            shared_gate: false,
            dense_layers: 0,
            fused_qkv: true,
            fused_gate_up: false,
            fused_experts: false,
            softcap: false,
            softmax_fp32: false,
            resid_dropout: true,
            embed_dropout: true,
            q_lora_rank: 0,
            kv_lora_rank: 0,
            qk_rope_dim: 0,
            v_head_dim: 0,
            attn_sinks: false,
            qk_l2_norm: false,
            nope_layers: LayerRule::None,
            window_layers: LayerRule::None,
            window: 0,
            window_kind: WindowKind::Sliding,
            moe_rule: LayerRule::All,
            router: Router::Softmax,
            router_bias: false,
            router_fp32: false,
            router_groups: 0,
            router_group_topk: 0,
            expert_bias: false,
            experts_in_out: false,
            moe_all_experts: false,
            clip_qkv: false,
            ssm: Ssm::NONE,
            ssm_dtype: StateDtype::Auto,
            dsa: Dsa::NONE,
            gdn: Gdn::NONE,
            linear_layers: LayerRule::None,
            attn_gate: false,
        }
    }

    #[test]
    fn a_toy_gpt2_counts_what_was_worked_out_by_hand() {
        // wte 10×4 = 40; wpe 8×4 = 32;
        // per layer: c_attn 4×12 + 12 = 60; c_proj 4×4 + 4 = 20; fc 4×16 + 16 = 80;
        //            proj 16×4 + 4 = 68; two LayerNorms 2×(4 + 4) = 16 → 244; × 2 layers = 488;
        // ln_f 8; head tied → 40 + 32 + 488 + 8 = 568.
        let c = toy_gpt2().counts();
        assert_eq!(c.total, 568);
        // wte, wpe, 12 per layer × 2, ln_f weight + bias.
        assert_eq!(c.tensors, 2 + 24 + 2);
        assert_eq!(c.active, c.total);
    }

    #[test]
    fn untying_the_head_adds_one_vocabulary_matrix() {
        let mut m = toy_gpt2();
        let tied = m.counts().total;
        m.tied = false;
        assert_eq!(m.counts().total, tied + 10 * 4);
    }

    #[test]
    fn experts_count_fully_in_total_but_top_k_times_in_active() {
        let mut m = toy_gpt2();
        m.mlp = MlpKind::Gated;
        m.experts = 4;
        m.top_k = 1;
        m.expert_ffn = 8;
        m.ffn = 0;
        m.mlp_bias = false;
        let c = m.counts();
        // Each expert: 3 × 4 × 8 = 96; per layer 4 experts = 384, router 4×4 = 16.
        let experts = c.by_part.iter().find(|(p, _)| *p == Part::Experts).map(|(_, n)| *n);
        assert_eq!(experts, Some(2 * 384));
        assert_eq!(c.total - c.active, 2 * 3 * 96);
    }

    #[test]
    fn validation_names_the_offending_key() {
        let mut m = toy_gpt2();
        m.kv_heads = 3;
        assert!(matches!(m.validate(), Err(ModelError::Invalid { key: "kv_heads", .. })));
        m.kv_heads = 0;
        assert_eq!(m.validate(), Err(ModelError::Zero("kv_heads")));
    }

    /// A toy MLA model (DeepSeek-V3's layout at toy sizes), counted by hand below.
    fn toy_mla() -> ModelSpec {
        ModelSpec {
            family: Family::DeepseekV3,
            vocab: 10,
            hidden: 8,
            layers: 2,
            heads: 2,
            kv_heads: 2,
            head_dim: 4, // d_nope 3 + d_r 1
            ffn: 6,
            mlp: MlpKind::Gated,
            act: Activation::Silu,
            norm: NormKind::Rmsnorm,
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
            tied: false,
            positions: Positions::Rope,
            rotary_pct: 100,
            fused_qkv: false,
            resid_dropout: false,
            embed_dropout: false,
            softmax_fp32: true,
            q_lora_rank: 4,
            kv_lora_rank: 2,
            qk_rope_dim: 1,
            v_head_dim: 3,
            ..toy_gpt2()
        }
    }

    #[test]
    fn a_toy_mla_model_counts_what_was_worked_out_by_hand() {
        // Per layer: q_a_proj 4×8 = 32, q_a_layernorm 4, q_b_proj (2·4)×4 = 32,
        // kv_a_proj_with_mqa (2 + 1)×8 = 24, kv_a_layernorm 2, kv_b_proj 2·(3 + 3)×2 = 24,
        // o_proj 8×(2·3) = 48 → 166; gated MLP 3×8×6 = 144; two RMSNorms 16 → 326; × 2 = 652.
        // Embedding 80 + final norm 8 + untied head 80 → 820.
        let m = toy_mla();
        assert_eq!(m.validate(), Ok(()));
        let c = m.counts();
        assert_eq!(c.total, 820);
        // 7 attention + 3 MLP + 2 norms per layer, × 2, + embedding, final norm, head.
        assert_eq!(c.tensors, 12 * 2 + 3);
        assert_eq!((m.q_width(), m.kv_width(), m.v_width(), m.o_width(), m.qk_nope_dim(), m.rope_dims()), (8, 8, 6, 6, 3, 1));
    }

    #[test]
    fn mla_without_query_compression_has_one_plain_query_projection() {
        // DeepSeek-V2-Lite: q_proj [a·d, h] = 8×8 = 64 replaces q_a (32) + norm (4) + q_b (32).
        let m = ModelSpec { q_lora_rank: 0, ..toy_mla() };
        assert_eq!(m.counts().total, 820 - 2 * (32 + 4 + 32 - 64));
        assert_eq!(m.counts().tensors, 10 * 2 + 3);
    }

    #[test]
    fn a_toy_gpt_oss_counts_biases_sinks_and_biased_experts() {
        // Per layer: q 4×4 + 4, k 2×4 + 2, v 2×4 + 2, o 4×4 + 4, sinks 2 → 62;
        // router 3×4 + 3 = 15; experts gate_up 3×4×10 + 3×10, down 3×5×4 + 3×4 → 222;
        // norms 8 → 307; × 2 = 614. Embedding 40 + final norm 4 + head 40 → 698.
        let m = ModelSpec {
            vocab: 10,
            hidden: 4,
            layers: 2,
            heads: 2,
            kv_heads: 1,
            head_dim: 2,
            ffn: 0,
            mlp: MlpKind::Gated,
            act: Activation::SwigluClamped,
            norm: NormKind::Rmsnorm,
            fused_qkv: false,
            mlp_bias: false,
            tied: false,
            positions: Positions::Rope,
            experts: 3,
            top_k: 1,
            expert_ffn: 5,
            fused_experts: true,
            experts_in_out: true,
            expert_bias: true,
            router: Router::TopkSoftmax,
            router_bias: true,
            attn_sinks: true,
            ..toy_gpt2()
        };
        assert_eq!(m.validate(), Ok(()));
        let c = m.counts();
        assert_eq!(c.total, 698);
        // Each expert's share of a layer is 222 / 3 = 74; two of three idle in each of 2 layers.
        assert_eq!(c.active, 698 - 2 * 2 * 74);
        // 9 attention + 2 router + 4 expert + 2 norms per layer, + 3 at the ends.
        assert_eq!(c.tensors, 17 * 2 + 3);
        let gate_up = m.tensors().into_iter().find(|t| t.name.ends_with("experts.gate_up_proj")).map(|t| t.shape);
        assert_eq!(gate_up, Some(vec![3, 4, 10]), "stored [E, in, out]");
    }

    #[test]
    fn layer_rules_count_any_range_exactly_as_checking_each_layer() {
        let rules = [
            LayerRule::None,
            LayerRule::All,
            LayerRule::FirstK(3),
            LayerRule::Every { step: 4, offset: 3 },
            LayerRule::AllBut { step: 6, offset: 5 },
            LayerRule::List(vec![0, 5, 6, 11]),
        ];
        for rule in &rules {
            for a in 0..14 {
                for b in a..14 {
                    let by_layer = (a..b).filter(|&i| rule.contains(i)).count() as u64;
                    assert_eq!(rule.count_in(a..b), by_layer, "{rule} on {a}..{b}");
                    // A pipeline stage's re-indexed rule counts the same layers.
                    assert_eq!(rule.stage(a..b).count(b - a), by_layer, "{rule} staged on {a}..{b}");
                }
            }
        }
    }

    #[test]
    fn flags_compress_to_the_shortest_rule_that_states_them() {
        let of = |f: &dyn Fn(u64) -> bool, n: u64| LayerRule::from_flags(&(0..n).map(f).collect::<Vec<_>>());
        assert_eq!(of(&|_| false, 8), LayerRule::None);
        assert_eq!(of(&|_| true, 8), LayerRule::All);
        assert_eq!(of(&|i| i < 3, 8), LayerRule::FirstK(3));
        // Llama 4 Maverick's MoE layers; Gemma 3's sliding layers; SmolLM3's NoPE layers.
        assert_eq!(of(&|i| i % 2 == 1, 48), LayerRule::Every { step: 2, offset: 1 });
        assert_eq!(of(&|i| (i + 1) % 6 != 0, 34), LayerRule::AllBut { step: 6, offset: 5 });
        assert_eq!(of(&|i| (i + 1) % 4 == 0, 36), LayerRule::Every { step: 4, offset: 3 });
        assert_eq!(of(&|i| i == 2 || i == 3 || i == 7, 9), LayerRule::List(vec![2, 3, 7]));
    }

    #[test]
    fn layer_rules_read_back_what_they_write() {
        for rule in [
            LayerRule::None,
            LayerRule::All,
            LayerRule::FirstK(3),
            LayerRule::Every { step: 2, offset: 1 },
            LayerRule::AllBut { step: 6, offset: 5 },
            LayerRule::List(vec![1, 4]),
        ] {
            assert_eq!(LayerRule::parse(&rule.to_string()), Ok(rule.clone()));
        }
        assert!(LayerRule::parse("every:2:2").is_err(), "offset must be below the step");
        assert!(LayerRule::parse("list:3,1").is_err(), "lists ascend");
        assert!(LayerRule::parse("sometimes").is_err());
    }

    #[test]
    fn interleaved_moe_layers_sit_where_the_rule_says_and_stages_stay_exact() {
        // Maverick-like: 4 layers, MoE on the odd ones.
        let mut m = toy_gpt2();
        m.layers = 4;
        m.mlp = MlpKind::Gated;
        m.experts = 2;
        m.top_k = 1;
        m.expert_ffn = 8;
        m.moe_rule = LayerRule::Every { step: 2, offset: 1 };
        assert_eq!(m.validate(), Ok(()));
        assert_eq!((m.moe_layers(), m.dense_mlp_layers()), (2, 2));
        assert!(!m.is_moe_layer(0) && m.is_moe_layer(1) && !m.is_moe_layer(2) && m.is_moe_layer(3));
        assert_eq!(m.moe_layers_in(0..1), 0);
        assert_eq!(m.moe_layers_in(1..3), 1);
        // The stage of layers 1..4 starts with an MoE layer: its rule is every:2:0.
        let s = m.stage(1..4);
        assert_eq!((s.layers, s.moe_layers(), s.dense_mlp_layers()), (3, 2, 1));
        assert!(s.is_moe_layer(0));
        // first_k_dense_replace composes with the rule: layer 1 becomes dense.
        m.dense_layers = 2;
        assert_eq!(m.moe_layers(), 1);
        assert_eq!(m.stage(0..2).moe_layers(), 0);
    }

    #[test]
    fn mla_validation_names_the_offending_key() {
        let m = ModelSpec { kv_heads: 1, ..toy_mla() };
        assert!(matches!(m.validate(), Err(ModelError::Invalid { key: "kv_heads", .. })));
        let m = ModelSpec { qk_rope_dim: 0, ..toy_mla() };
        assert!(matches!(m.validate(), Err(ModelError::Invalid { key: "qk_rope_dim", .. })));
        let m = ModelSpec { nope_layers: LayerRule::Every { step: 0, offset: 0 }, ..toy_gpt2() };
        assert!(matches!(m.validate(), Err(ModelError::Invalid { key: "nope_layers", .. })));
        let m = ModelSpec { window_layers: LayerRule::All, window: 0, ..toy_gpt2() };
        assert_eq!(m.validate(), Err(ModelError::Zero("window")));
    }

    #[test]
    fn only_the_new_architectures_name_features_beyond_a_uniform_decoder() {
        assert!(toy_gpt2().features().is_empty());
        assert_eq!(toy_mla().features(), vec!["multi-head latent attention (MLA)"]);
    }
}
