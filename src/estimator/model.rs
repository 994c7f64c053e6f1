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
//! `E` experts, `f_e` expert intermediate size.

use serde::{Deserialize, Serialize};

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

/// One model architecture, rich enough to count real checkpoints exactly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
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
}

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
    /// Layers whose MLP is a mixture of experts.
    pub fn moe_layers(&self) -> u64 {
        if self.experts == 0 {
            0
        } else {
            self.layers.saturating_sub(self.dense_layers)
        }
    }
    /// Layers whose MLP is dense.
    pub fn dense_mlp_layers(&self) -> u64 {
        self.layers - self.moe_layers()
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

        // Attention, per layer.
        if self.fused_qkv {
            push(&mut g, "layers.*.attn.qkv_proj.weight", vec![qw + 2 * kvw, h], l, Part::Attention, Split::Column, Some(Linear::Qkv));
            if self.qkv_bias {
                push(&mut g, "layers.*.attn.qkv_proj.bias", vec![qw + 2 * kvw], l, Part::Attention, Split::Column, None);
            }
        } else {
            push(&mut g, "layers.*.attn.q_proj.weight", vec![qw, h], l, Part::Attention, Split::Column, Some(Linear::Q));
            push(&mut g, "layers.*.attn.k_proj.weight", vec![kvw, h], l, Part::Attention, Split::Column, Some(Linear::K));
            push(&mut g, "layers.*.attn.v_proj.weight", vec![kvw, h], l, Part::Attention, Split::Column, Some(Linear::V));
            if self.qkv_bias {
                push(&mut g, "layers.*.attn.q_proj.bias", vec![qw], l, Part::Attention, Split::Column, None);
                push(&mut g, "layers.*.attn.k_proj.bias", vec![kvw], l, Part::Attention, Split::Column, None);
                push(&mut g, "layers.*.attn.v_proj.bias", vec![kvw], l, Part::Attention, Split::Column, None);
            }
        }
        push(&mut g, "layers.*.attn.o_proj.weight", vec![h, qw], l, Part::Attention, Split::Row, Some(Linear::O));
        if self.o_bias {
            push(&mut g, "layers.*.attn.o_proj.bias", vec![h], l, Part::Attention, Split::Replicated, None);
        }
        let norm_bias = self.norm == NormKind::Layernorm;
        match self.qk_norm {
            QkNorm::None => {}
            QkNorm::Head | QkNorm::Full => {
                let (qn, kn) = if self.qk_norm == QkNorm::Head { (self.head_dim, self.head_dim) } else { (qw, kvw) };
                push(&mut g, "layers.*.attn.q_norm.weight", vec![qn], l, Part::Attention, Split::Replicated, None);
                push(&mut g, "layers.*.attn.k_norm.weight", vec![kn], l, Part::Attention, Split::Replicated, None);
                if norm_bias {
                    push(&mut g, "layers.*.attn.q_norm.bias", vec![qn], l, Part::Attention, Split::Replicated, None);
                    push(&mut g, "layers.*.attn.k_norm.bias", vec![kn], l, Part::Attention, Split::Replicated, None);
                }
            }
            QkNorm::PerHead => {
                // StableLM: nn.ModuleList of one bias-free LayerNorm(d) per head.
                g.push(TensorGroup {
                    name: "layers.*.attn.q_layernorm.norms.*.weight",
                    shape: vec![self.heads, self.head_dim],
                    count: l,
                    tensors_per_instance: self.heads,
                    part: Part::Attention,
                    split: Split::Replicated,
                    linear: None,
                    per_layer: 0,
                });
                g.push(TensorGroup {
                    name: "layers.*.attn.k_layernorm.norms.*.weight",
                    shape: vec![self.kv_heads, self.head_dim],
                    count: l,
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
                g.push(expert("layers.*.mlp.experts.gate_up_proj", vec![e, 2 * fe, h], Linear::GateUp, Split::Column));
            } else {
                g.push(expert("layers.*.mlp.experts.*.gate_proj.weight", vec![e, fe, h], Linear::Gate, Split::Column));
                g.push(expert("layers.*.mlp.experts.*.up_proj.weight", vec![e, fe, h], Linear::Up, Split::Column));
            }
            g.push(expert("layers.*.mlp.experts.down_proj", vec![e, h, fe], Linear::Down, Split::Row));
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
        if self.heads % self.kv_heads != 0 {
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
            if self.dense_layers > 0 && self.ffn == 0 {
                return Err(ModelError::Zero("ffn"));
            }
        }
        if !(1..=4).contains(&self.layer_norms) {
            return Err(ModelError::Invalid { key: "layer_norms", reason: "must be 1, 2, 3 or 4".into() });
        }
        if self.rotary_pct > 100 {
            return Err(ModelError::Invalid { key: "rotary_pct", reason: "is a percentage (0–100)".into() });
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
        ];
        for (key, v, max) in limits {
            if v > max {
                return Err(ModelError::Invalid { key, reason: format!("{v} is beyond the supported {max}") });
            }
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

    /// A toy GPT-2-shaped model whose count is worked out by hand below.
    fn toy_gpt2() -> ModelSpec {
        ModelSpec {
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
}
