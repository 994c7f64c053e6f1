//! The parts of the activation ledger: which sub-row a saved tensor is counted in. The op-level
//! IR tags each tensor with its part as the family builds it (`ir::Builder::part`); the ledger
//! (`activations`) groups the kept storages by it.

/// The sub-rows of the activation ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    Embedding,
    Norms,
    AttentionInputs,
    AttentionCore,
    /// Multi-head latent attention's compressed latents (DeepSeek-V2/V3).
    Mla,
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
    pub fn id(self) -> &'static str {
        match self {
            Part::Embedding => "activations.embedding",
            Part::Norms => "activations.norms",
            Part::AttentionInputs => "activations.attention_inputs",
            Part::AttentionCore => "activations.attention_core",
            Part::Mla => "activations.mla_latents",
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
    pub fn label(self) -> &'static str {
        match self {
            Part::Embedding => "Embedding and positions",
            Part::Norms => "Norm layers",
            Part::AttentionInputs => "Attention projections' inputs",
            Part::AttentionCore => "Attention core (Q, K, V, scores, output)",
            Part::Mla => "MLA latents (compressed q and kv, their norms)",
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
    pub fn source(self) -> &'static str {
        match self {
            Part::Norms => "transformers LlamaRMSNorm / Gemma2RMSNorm / nn.LayerNorm forward; validation/FINDINGS.md §2",
            Part::AttentionCore => {
                "transformers eager_attention_forward / sdpa_attention_forward; torch SDPA flash kernel; FINDINGS.md §2–3"
            }
            Part::Loss => "transformers loss_utils.ForCausalLMLoss: logits.float() → cross_entropy (log_softmax keeps its fp32 result)",
            Part::Checkpoints => "torch.utils.checkpoint (non-reentrant): each layer keeps its input; FINDINGS.md §4",
            Part::Autocast => "torch.autocast weight cache: bf16 copies of every GEMM weight are saved for backward (FINDINGS.md §5)",
            Part::Moe => "transformers MixtralSparseMoeBlock with grouped_mm experts; FINDINGS.md §2.2",
            Part::Mla => {
                "transformers DeepseekV3Attention / DeepseekV2Attention: q_a_proj → q_a_layernorm → q_b_proj and \
                 kv_a_proj_with_mqa → kv_a_layernorm → kv_b_proj keep the b·s·r_q and b·s·(r_kv + d_r) latents \
                 (DeepSeek-AI 2024, DeepSeek-V2 §2.1)"
            }
            Part::Lora => {
                "peft LoraLayer: lora_B saves lora_A's output (b·s·r); with lora_dropout > 0 each adapter's dropped \
                 input and its mask (b·s·n_in each)"
            }
            Part::Dropout => "torch native_dropout: a 1-byte bool mask per element on CUDA",
            _ => "transformers modeling code; validation/FINDINGS.md §2",
        }
    }
}
