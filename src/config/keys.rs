//! The table of configuration keys: name, group, help, accepted values, and how each is read
//! and written. The URL, the CLI and the UI all go through this one table.

use crate::estimator::config::*;
use crate::estimator::family::Family;
use crate::estimator::gpu::GPUS;
use crate::estimator::model::{Activation, LayerRule, MlpKind, NormKind, Positions, QkNorm, Router, StateDtype, WindowKind};
use crate::estimator::names::Named;
use crate::estimator::presets::{preset, presets};
use crate::estimator::serve::{Engine, KvDtype, Mode, WeightDtype};

/// Where a key belongs in the UI and the help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    Model,
    Architecture,
    Training,
    Cluster,
    Overhead,
    Display,
    /// Serving (`mode=serve`): engine, context, concurrency, served dtypes, engine budgets.
    Serving,
}

/// One configuration key.
pub struct Key {
    pub name: &'static str,
    pub group: Group,
    pub help: &'static str,
    /// The accepted spellings for enumerations (empty for numbers and free text).
    pub choices: fn() -> Vec<&'static str>,
    pub get: fn(&Config) -> String,
    pub set: fn(&mut Config, &str) -> Result<(), String>,
}

/// Largest integer any key accepts (keeps every product far inside `u64`).
const MAX_INT: u64 = 1 << 40;

/// Reads a non-negative integer; `k`/`K` multiply by 1,024 and `m`/`M` by 1,048,576
/// (`seq=8k` is 8,192 tokens).
pub fn parse_uint(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1024),
        Some((i, 'm' | 'M')) => (&s[..i], 1024 * 1024),
        _ => (s, 1),
    };
    let n: u64 = num.replace('_', "").parse().map_err(|_| "expected a whole number".to_string())?;
    let v = n.checked_mul(mult).ok_or_else(|| "is too large".to_string())?;
    if v > MAX_INT {
        return Err(format!("is too large (at most {MAX_INT})"));
    }
    Ok(v)
}

fn parse_positive(s: &str) -> Result<u64, String> {
    match parse_uint(s)? {
        0 => Err("must be at least 1".into()),
        v => Ok(v),
    }
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err("expected true or false".into()),
    }
}

fn parse_f64(s: &str, lo: f64, hi: f64) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| "expected a number".to_string())?;
    if !v.is_finite() || v < lo || v > hi {
        return Err(format!("must be between {lo} and {hi}"));
    }
    Ok(v)
}

fn fmt_f64(v: f64) -> String {
    // Shortest representation that reads back exactly.
    let s = format!("{v}");
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

/// A fraction in (0, 1] (`gpu_memory_utilization`, `mem_fraction_static`,
/// `free_gpu_memory_fraction`).
fn parse_fraction(s: &str) -> Result<f64, String> {
    let v = parse_f64(s, 0.0, 1.0)?;
    if v == 0.0 {
        return Err("must be more than 0".into());
    }
    Ok(v)
}

fn no_choices() -> Vec<&'static str> {
    Vec::new()
}
fn bool_choices() -> Vec<&'static str> {
    vec!["false", "true"]
}

fn lora_targets_to_string(t: LoraTargets) -> String {
    if t == LoraTargets::ALL {
        return "all".into();
    }
    LoraTargets::NAMES.iter().filter(|(_, b)| t.has(*b)).map(|(n, _)| *n).collect::<Vec<_>>().join(",")
}

fn parse_lora_targets(s: &str) -> Result<LoraTargets, String> {
    let s = s.to_ascii_lowercase();
    if s == "all" || s == "all-linear" {
        return Ok(LoraTargets::ALL);
    }
    let mut bits = 0u8;
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let name = part.strip_suffix("_proj").unwrap_or(part);
        let bit = match name {
            "attn" => LoraTargets::Q | LoraTargets::K | LoraTargets::V | LoraTargets::O,
            "mlp" => LoraTargets::GATE | LoraTargets::UP | LoraTargets::DOWN,
            n => LoraTargets::NAMES
                .iter()
                .find(|(m, _)| *m == n)
                .map(|(_, b)| *b)
                .ok_or_else(|| format!("unknown module '{part}' (use q, k, v, o, gate, up, down, attn, mlp or all)"))?,
        };
        bits |= bit;
    }
    if bits == 0 {
        return Err("names no module".into());
    }
    Ok(LoraTargets(bits))
}

fn family_names() -> Vec<&'static str> {
    Family::ALL.iter().map(|(_, t, _)| *t).collect()
}

fn preset_ids() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = presets().iter().map(|p| p.id).collect();
    v.push("custom");
    v
}

fn recipe_ids() -> Vec<&'static str> {
    super::recipes::RECIPES.iter().map(|r| r.id).collect()
}

fn gpu_ids() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = GPUS.iter().map(|g| g.id).collect();
    v.push("custom");
    v
}

/// A non-negative integer key whose `auto` (the default) lets the estimator decide.
macro_rules! auto_uint_key {
    ($name:literal, $group:expr, $help:literal, |$c:ident| $field:expr) => {
        Key {
            name: $name,
            group: $group,
            help: $help,
            choices: no_choices,
            get: |$c: &Config| $field.map_or("auto".to_string(), |v| v.to_string()),
            set: |$c: &mut Config, s: &str| {
                $field = if s.eq_ignore_ascii_case("auto") { None } else { Some(parse_uint(s)?) };
                Ok(())
            },
        }
    };
}

macro_rules! uint_key {
    ($name:literal, $group:expr, $help:literal, |$c:ident| $field:expr) => {
        uint_key!(@parsed parse_uint, $name, $group, $help, |$c| $field)
    };
    (positive $name:literal, $group:expr, $help:literal, |$c:ident| $field:expr) => {
        uint_key!(@parsed parse_positive, $name, $group, $help, |$c| $field)
    };
    (layers $name:literal, $group:expr, $help:literal, |$c:ident| $field:expr) => {
        uint_key!(@parsed parse_layer_count, $name, $group, $help, |$c| $field)
    };
    (@parsed $parse:path, $name:literal, $group:expr, $help:literal, |$c:ident| $field:expr) => {
        Key {
            name: $name,
            group: $group,
            help: $help,
            choices: no_choices,
            get: |$c: &Config| $field.to_string(),
            set: |$c: &mut Config, s: &str| {
                $field = $parse(s)?;
                Ok(())
            },
        }
    };
}

/// The most layers a layer-count key takes (`recompute_every`, `recompute_layers`).
const MAX_LAYER_COUNT: u64 = 1 << 20;

/// A count of decoder layers, 0 included, at most [`MAX_LAYER_COUNT`].
fn parse_layer_count(s: &str) -> Result<u64, String> {
    match parse_uint(s)? {
        v if v > MAX_LAYER_COUNT => Err(format!("is beyond the supported {MAX_LAYER_COUNT} layers")),
        v => Ok(v),
    }
}

macro_rules! bool_key {
    ($name:literal, $group:expr, $help:literal, |$c:ident| $field:expr) => {
        Key {
            name: $name,
            group: $group,
            help: $help,
            choices: bool_choices,
            get: |$c: &Config| $field.to_string(),
            set: |$c: &mut Config, s: &str| {
                $field = parse_bool(s)?;
                Ok(())
            },
        }
    };
}

macro_rules! rule_key {
    ($name:literal, $group:expr, $help:literal, |$c:ident| $field:expr) => {
        Key {
            name: $name,
            group: $group,
            help: $help,
            choices: no_choices,
            get: |$c: &Config| $field.to_string(),
            set: |$c: &mut Config, s: &str| {
                $field = LayerRule::parse(s)?;
                Ok(())
            },
        }
    };
}

macro_rules! enum_key {
    ($name:literal, $group:expr, $help:literal, $t:ty, |$c:ident| $field:expr) => {
        Key {
            name: $name,
            group: $group,
            help: $help,
            choices: <$t as Named>::names,
            get: |$c: &Config| $field.name().to_string(),
            set: |$c: &mut Config, s: &str| {
                $field = <$t as Named>::parse(s)?;
                Ok(())
            },
        }
    };
}

/// A non-negative number of a custom GPU's datasheet (TFLOP/s, GB/s), in the cluster group.
macro_rules! f64_key {
    ($name:literal, $help:literal, |$c:ident| $field:expr) => {
        Key {
            name: $name,
            group: Cluster,
            help: $help,
            choices: no_choices,
            get: |$c: &Config| fmt_f64($field),
            set: |$c: &mut Config, s: &str| {
                $field = parse_f64(s, 0.0, MAX_DATASHEET_FIGURE)?;
                Ok(())
            },
        }
    };
}

/// Largest TFLOP/s or GB/s a custom GPU may claim (a thousand times today's largest).
const MAX_DATASHEET_FIGURE: f64 = 1.0e7;

use super::recipes::{Recipe, RECIPES};

/// Sets every key of the recipe on `cfg`; the recipe is checked whole first, so a failure
/// leaves `cfg` unchanged.
pub fn apply_recipe(cfg: &mut Config, r: &Recipe) -> Result<(), String> {
    let mut next = cfg.clone();
    for (k, v) in r.pairs {
        let key = KEYS.iter().find(|key| key.name == *k).ok_or_else(|| format!("names an unknown key {k}"))?;
        (key.set)(&mut next, v).map_err(|e| format!("{k}={v}: {e}"))?;
    }
    *cfg = next;
    Ok(())
}

/// The first recipe whose every key has its value in `cfg` (for a page that shows which recipe
/// the configuration still is).
pub fn matching_recipe(cfg: &Config) -> Option<&'static Recipe> {
    RECIPES.iter().find(|r| {
        let mut c = cfg.clone();
        apply_recipe(&mut c, r).is_ok() && c == *cfg
    })
}

use Group::*;

/// Every key, in the canonical order of encoded URLs and of the CLI's help.
pub static KEYS: &[Key] = &[
    Key {
        name: "recipe",
        group: Model,
        help:
            "a framework's shipped config (e.g. torchtitan-llama3-8b); applies first, any key after it changes it (see `trainmem recipes`)",
        choices: recipe_ids,
        // Input only: a link spells the recipe's keys out.
        get: |_| String::new(),
        set: |c, s| {
            if s.trim().is_empty() {
                return Ok(());
            }
            let r = super::recipes::recipe(s).ok_or_else(|| "unknown recipe (see `trainmem recipes`)".to_string())?;
            apply_recipe(c, r)
        },
    },
    Key {
        name: "model",
        group: Model,
        help: "preset id (e.g. llama-3.1-8b, gpt2-xl) or custom",
        choices: preset_ids,
        get: |c| c.model.clone(),
        set: |c, s| {
            let id = s.to_ascii_lowercase();
            if id == "custom" {
                c.model = id;
                return Ok(());
            }
            let p = preset(&id).ok_or_else(|| "unknown preset (see `trainmem presets`)".to_string())?;
            c.model = p.id.to_string();
            c.arch = p.spec;
            c.name.clear();
            Ok(())
        },
    },
    Key {
        name: "name",
        group: Model,
        help: "display name of a custom model",
        choices: no_choices,
        get: |c| c.name.clone(),
        set: |c, s| {
            c.name = s.chars().filter(|ch| !ch.is_control()).take(120).collect();
            Ok(())
        },
    },
    Key {
        name: "family",
        group: Architecture,
        help: "whose modeling code the model runs (transformers model_type)",
        choices: family_names,
        get: |c| c.arch.family.model_type().to_string(),
        set: |c, s| {
            c.arch.family =
                Family::from_model_type(&s.to_ascii_lowercase()).ok_or_else(|| format!("expected one of {}", family_names().join(", ")))?;
            Ok(())
        },
    },
    uint_key!(positive "vocab", Architecture, "vocabulary size V", |c| c.arch.vocab),
    uint_key!(positive "hidden", Architecture, "hidden size h", |c| c.arch.hidden),
    uint_key!(positive "layers", Architecture, "decoder layers L", |c| c.arch.layers),
    uint_key!(positive "heads", Architecture, "attention heads a", |c| c.arch.heads),
    uint_key!(positive "kv_heads", Architecture, "key/value heads (GQA/MQA)", |c| c.arch.kv_heads),
    uint_key!(positive "head_dim", Architecture, "head dim d (h / a unless the model says otherwise)", |c| c.arch.head_dim),
    uint_key!("ffn", Architecture, "MLP intermediate size f", |c| c.arch.ffn),
    enum_key!("mlp", Architecture, "MLP shape: plain (2 matrices) or gated (3, SwiGLU/GeGLU)", MlpKind, |c| c.arch.mlp),
    enum_key!("act", Architecture, "MLP activation", Activation, |c| c.arch.act),
    enum_key!("norm", Architecture, "normalization layers", NormKind, |c| c.arch.norm),
    uint_key!(positive "layer_norms", Architecture, "norms per decoder layer (1–4)", |c| c.arch.layer_norms),
    bool_key!("final_norm", Architecture, "a norm after the last layer", |c| c.arch.final_norm),
    enum_key!("qk_norm", Architecture, "norms on queries and keys", QkNorm, |c| c.arch.qk_norm),
    bool_key!("qkv_bias", Architecture, "biases on Q, K, V", |c| c.arch.qkv_bias),
    bool_key!("o_bias", Architecture, "bias on the attention output", |c| c.arch.o_bias),
    bool_key!("mlp_bias", Architecture, "biases on the MLP", |c| c.arch.mlp_bias),
    bool_key!("head_bias", Architecture, "bias on the LM head", |c| c.arch.head_bias),
    bool_key!("tied", Architecture, "LM head tied to the embedding", |c| c.arch.tied),
    enum_key!("pos", Architecture, "position encoding", Positions, |c| c.arch.positions),
    uint_key!("max_pos", Architecture, "max_position_embeddings", |c| c.arch.max_pos),
    uint_key!("pos_offset", Architecture, "extra rows of a learned position table (OPT: 2)", |c| c.arch.pos_offset),
    Key {
        name: "rotary_pct",
        group: Architecture,
        help: "percent of head dims with rotary embedding",
        choices: no_choices,
        get: |c| c.arch.rotary_pct.to_string(),
        set: |c, s| {
            let v = parse_uint(s)?;
            if v > 100 {
                return Err("is a percentage (0–100)".into());
            }
            c.arch.rotary_pct = v;
            Ok(())
        },
    },
    bool_key!("parallel", Architecture, "parallel attention + MLP blocks", |c| c.arch.parallel),
    uint_key!("embed_proj", Architecture, "OPT's word_embed_proj_dim (0 = none)", |c| c.arch.embed_proj),
    uint_key!("experts", Architecture, "routed experts per MoE layer (0 = dense)", |c| c.arch.experts),
    uint_key!("top_k", Architecture, "experts per token", |c| c.arch.top_k),
    uint_key!("expert_ffn", Architecture, "intermediate size of a routed expert", |c| c.arch.expert_ffn),
    uint_key!("shared_experts", Architecture, "shared experts per MoE layer", |c| c.arch.shared_experts),
    uint_key!("shared_ffn", Architecture, "intermediate size of a shared expert", |c| c.arch.shared_ffn),
    bool_key!("shared_gate", Architecture, "sigmoid gate on the shared expert (Qwen2-MoE)", |c| c.arch.shared_gate),
    uint_key!("dense_layers", Architecture, "layers with a dense MLP in an MoE model", |c| c.arch.dense_layers),
    bool_key!("fused_qkv", Architecture, "Q, K, V in one tensor", |c| c.arch.fused_qkv),
    bool_key!("fused_gate_up", Architecture, "gate and up in one tensor", |c| c.arch.fused_gate_up),
    bool_key!("fused_experts", Architecture, "experts stored as 3-D tensors (transformers 5)", |c| c.arch.fused_experts),
    bool_key!("softcap", Architecture, "tanh soft-capping of scores and logits (Gemma-2)", |c| c.arch.softcap),
    bool_key!("softmax_fp32", Architecture, "eager softmax computed in fp32 (false for GPT-2)", |c| c.arch.softmax_fp32),
    bool_key!("resid_dropout", Architecture, "dropout on the attention and MLP outputs", |c| c.arch.resid_dropout),
    bool_key!("embed_dropout", Architecture, "dropout on the embeddings", |c| c.arch.embed_dropout),
    uint_key!("q_lora_rank", Architecture, "MLA query compression rank r_q (0 = plain q_proj)", |c| c.arch.q_lora_rank),
    uint_key!("kv_lora_rank", Architecture, "MLA key/value compression rank r_kv (0 = not MLA)", |c| c.arch.kv_lora_rank),
    uint_key!("qk_rope_dim", Architecture, "MLA rotary dims of a query/key head d_r (head_dim = nope + d_r)", |c| c.arch.qk_rope_dim),
    uint_key!("v_head_dim", Architecture, "MLA value head dim d_v", |c| c.arch.v_head_dim),
    uint_key!("index_n_heads", Architecture, "DeepSeek-V3.2 sparse-attention indexer heads H_i (0 = no indexer)", |c| c.arch.dsa.heads),
    uint_key!("index_head_dim", Architecture, "DeepSeek-V3.2 indexer head dim d_i", |c| c.arch.dsa.head_dim),
    uint_key!("index_topk", Architecture, "keys the DeepSeek-V3.2 indexer keeps per query", |c| c.arch.dsa.topk),
    bool_key!("attn_sinks", Architecture, "a learned attention-sink logit per head (gpt-oss)", |c| c.arch.attn_sinks),
    bool_key!("qk_l2_norm", Architecture, "weightless L2 norm of q and k on RoPE layers (Llama 4)", |c| c.arch.qk_l2_norm),
    rule_key!(
        "nope_layers",
        Architecture,
        "layers without RoPE: none, all, first:K, every:STEP:OFFSET, all-but:STEP:OFFSET, list:I,J",
        |c| c.arch.nope_layers
    ),
    rule_key!("window_layers", Architecture, "layers with sliding or chunked attention (same forms as nope_layers)", |c| c
        .arch
        .window_layers),
    uint_key!("window", Architecture, "tokens in a sliding window or attention chunk", |c| c.arch.window),
    enum_key!("window_kind", Architecture, "local attention: sliding window or chunks", WindowKind, |c| c.arch.window_kind),
    rule_key!("moe_rule", Architecture, "layers that may hold the MoE block, after dense_layers (same forms as nope_layers)", |c| c
        .arch
        .moe_rule),
    enum_key!("router", Architecture, "MoE router: softmax then top-k, top-k then softmax, sigmoid, top-k then sigmoid", Router, |c| c
        .arch
        .router),
    bool_key!("router_bias", Architecture, "bias on the MoE router (gpt-oss)", |c| c.arch.router_bias),
    bool_key!("router_fp32", Architecture, "router weight kept in fp32 (DeepSeek, GLM-4.5)", |c| c.arch.router_fp32),
    uint_key!("router_groups", Architecture, "expert groups of group-limited routing (n_group; 0 = none)", |c| c.arch.router_groups),
    uint_key!("router_group_topk", Architecture, "groups kept by group-limited routing (topk_group)", |c| c.arch.router_group_topk),
    bool_key!("expert_bias", Architecture, "biases on the experts (gpt-oss)", |c| c.arch.expert_bias),
    bool_key!("experts_in_out", Architecture, "experts stored [E, in, out] (gpt-oss, Llama 4)", |c| c.arch.experts_in_out),
    bool_key!("moe_all_experts", Architecture, "every expert computes every token (Llama 4)", |c| c.arch.moe_all_experts),
    bool_key!("clip_qkv", Architecture, "q, k, v projections clamped in place (OLMo's clip_qkv)", |c| c.arch.clip_qkv),
    uint_key!("ssm_heads", Architecture, "Mamba-2 mixer heads H (mamba_n_heads; 0 = no mixer)", |c| c.arch.ssm.heads),
    uint_key!("ssm_head_dim", Architecture, "Mamba-2 head width P (mamba_d_head)", |c| c.arch.ssm.head_dim),
    uint_key!("ssm_state", Architecture, "Mamba-2 state size N (mamba_d_state)", |c| c.arch.ssm.state),
    uint_key!("ssm_groups", Architecture, "Mamba-2 B/C groups G (mamba_n_groups)", |c| c.arch.ssm.groups),
    uint_key!("ssm_conv", Architecture, "Mamba-2 causal convolution width (mamba_d_conv)", |c| c.arch.ssm.conv),
    uint_key!("ssm_chunk", Architecture, "Mamba-2 SSD scan chunk (mamba_chunk_size)", |c| c.arch.ssm.chunk),
    bool_key!("ssm_conv_bias", Architecture, "bias on the Mamba-2 conv1d (mamba_conv_bias)", |c| c.arch.ssm.conv_bias),
    bool_key!("ssm_in_bias", Architecture, "bias on the Mamba-2 in_proj (mamba_proj_bias)", |c| c.arch.ssm.in_bias),
    bool_key!("ssm_out_bias", Architecture, "bias on the Mamba-2 out_proj (Falcon-H1's projectors_bias)", |c| c.arch.ssm.out_bias),
    bool_key!("ssm_gated_norm", Architecture, "gated RMSNorm before the Mamba-2 out_proj", |c| c.arch.ssm.gated_norm),
    bool_key!("ssm_mup", Architecture, "Falcon-H1's µP multipliers on the Mamba-2 in_proj", |c| c.arch.ssm.mup),
    uint_key!("gdn_k_heads", Architecture, "gated DeltaNet key heads (linear_num_key_heads; 0 = none)", |c| c.arch.gdn.k_heads),
    uint_key!("gdn_v_heads", Architecture, "gated DeltaNet value heads (linear_num_value_heads)", |c| c.arch.gdn.v_heads),
    uint_key!("gdn_k_dim", Architecture, "gated DeltaNet key head dim (linear_key_head_dim)", |c| c.arch.gdn.k_dim),
    uint_key!("gdn_v_dim", Architecture, "gated DeltaNet value head dim (linear_value_head_dim)", |c| c.arch.gdn.v_dim),
    uint_key!("gdn_conv", Architecture, "gated DeltaNet causal conv kernel (linear_conv_kernel_dim)", |c| c.arch.gdn.conv),
    bool_key!("gdn_split", Architecture, "gated DeltaNet with four input projections (Qwen3.5)", |c| c.arch.gdn.split),
    rule_key!("linear_layers", Architecture, "gated DeltaNet or Granite's Mamba-2 layers (layer_types linear_attention; same forms as nope_layers)", |c| c
        .arch
        .linear_layers),
    bool_key!("attn_gate", Architecture, "q_proj also emits a sigmoid output gate (Qwen3-Next)", |c| c.arch.attn_gate),
    enum_key!(
        "mamba_ssm_dtype",
        Architecture,
        "recurrent (SSM / gated DeltaNet) state dtype the checkpoint names (config.json mamba_ssm_dtype; Qwen3.5 float32)",
        StateDtype,
        |c| c.arch.ssm_dtype
    ),
    uint_key!(positive "batch", Training, "micro-batch per GPU", |c| c.batch),
    uint_key!(positive "seq", Training, "sequence length, tokens (8k = 8192)", |c| c.seq),
    uint_key!(positive "accum", Training, "gradient-accumulation steps", |c| c.accum),
    enum_key!("precision", Training, "precision recipe", Precision, |c| c.precision),
    enum_key!("optim", Training, "optimizer", Optimizer, |c| c.optim),
    enum_key!("optim_impl", Training, "optimizer implementation (PyTorch)", OptimImpl, |c| c.optim_impl),
    enum_key!("finetune", Training, "fine-tuning method", Finetune, |c| c.finetune),
    uint_key!("lora_rank", Training, "LoRA rank r", |c| c.lora_rank),
    Key {
        name: "lora_targets",
        group: Training,
        help: "LoRA target modules: all, or a list of q,k,v,o,gate,up,down (attn, mlp)",
        choices: no_choices,
        get: |c| lora_targets_to_string(c.lora_targets),
        set: |c, s| {
            c.lora_targets = parse_lora_targets(s)?;
            Ok(())
        },
    },
    Key {
        name: "lora_dropout",
        group: Training,
        help: "dropout probability on the LoRA adapters' input (each adapter keeps its dropped input and a mask)",
        choices: no_choices,
        get: |c| fmt_f64(c.lora_dropout),
        set: |c, s| {
            let v = parse_f64(s, 0.0, 0.999)?;
            c.lora_dropout = v;
            Ok(())
        },
    },
    enum_key!(
        "lora_dtype",
        Training,
        "LoRA adapters' dtype on a 16-bit base: fp32 (peft, which casts each adapted input to fp32) or model (torchtune, litgpt)",
        LoraDtype,
        |c| c.lora_dtype
    ),
    enum_key!("attn", Training, "attention implementation", Attention, |c| c.attn),
    enum_key!("recompute", Training, "activation recomputation (checkpointing)", Recompute, |c| c.recompute),
    Key {
        name: "dropout",
        group: Training,
        help: "dropout probability",
        choices: no_choices,
        get: |c| fmt_f64(c.dropout),
        set: |c, s| {
            let v = parse_f64(s, 0.0, 0.999)?;
            c.dropout = v;
            Ok(())
        },
    },
    enum_key!("loss", Training, "loss implementation", Loss, |c| c.loss),
    enum_key!("framework", Training, "whose code the activations follow", Framework, |c| c.framework),
    enum_key!(
        "kernels",
        Training,
        "whose kernels the saved tensors follow: cuda, or cpu (the PyTorch validation fixtures)",
        Kernels,
        |c| c.kernels
    ),
    uint_key!(positive "gpus", Cluster, "GPUs in the job", |c| c.gpus),
    enum_key!("zero", Cluster, "ZeRO stage or FSDP sharding strategy", Zero, |c| c.zero),
    uint_key!(positive "shard_group", Cluster, "GPUs per HYBRID_SHARD group", |c| c.shard_group),
    uint_key!(positive "tp", Cluster, "tensor-parallel degree", |c| c.tp),
    uint_key!(positive "pp", Cluster, "pipeline-parallel degree", |c| c.pp),
    uint_key!(positive "vpp", Cluster, "virtual pipeline stages per GPU (interleaving)", |c| c.vpp),
    uint_key!(positive "cp", Cluster, "context-parallel degree", |c| c.cp),
    uint_key!(positive "ep", Cluster, "expert-parallel degree", |c| c.ep),
    bool_key!("sp", Cluster, "sequence parallelism (with tp)", |c| c.sp),
    enum_key!("offload", Cluster, "CPU offload", Offload, |c| c.offload),
    Key {
        name: "gpu",
        group: Cluster,
        help: "GPU model, or custom with gpu_gib",
        choices: gpu_ids,
        get: |c| c.gpu.clone(),
        set: |c, s| {
            let id = s.to_ascii_lowercase();
            if id == "custom" {
                c.gpu = id;
                return Ok(());
            }
            // An alias (`h100`, `a100`) is stored as the card's id, so links stay canonical.
            let g = crate::estimator::gpu::gpu(&id).ok_or_else(|| "unknown GPU (see the catalog)".to_string())?;
            c.gpu = g.id.to_string();
            Ok(())
        },
    },
    Key {
        name: "gpu_gib",
        group: Cluster,
        help: "memory of a custom GPU, GiB",
        choices: no_choices,
        get: |c| fmt_f64(c.gpu_gib),
        set: |c, s| {
            c.gpu_gib = parse_f64(s, 0.001, 1.0e6)?;
            Ok(())
        },
    },
    f64_key!("gpu_tflops", "dense 16-bit tensor TFLOP/s of a custom GPU (0 = unknown)", |c| c.gpu_tflops),
    f64_key!("gpu_fp8_tflops", "dense FP8 tensor TFLOP/s of a custom GPU (0 = none)", |c| c.gpu_fp8_tflops),
    f64_key!("gpu_hbm_gbs", "memory bandwidth of a custom GPU, GB/s (0 = unknown)", |c| c.gpu_hbm_gbs),
    f64_key!("gpu_link_gbs", "NVLink/Infinity Fabric of a custom GPU, GB/s per GPU, bidirectional (0 = none)", |c| c.gpu_link_gbs),
    f64_key!("gpu_host_gbs", "PCIe (host link) of a custom GPU, GB/s, bidirectional", |c| c.gpu_host_gbs),
    uint_key!(positive "gpus_per_node", Cluster, "GPUs sharing one NVLink/Infinity Fabric domain (8 per HGX node, 72 per NVL72 rack)", |c| c.gpus_per_node),
    enum_key!(
        "interconnect",
        Cluster,
        "network between nodes: ib-xdr, ib-ndr, ib-hdr (one NIC per GPU), roce-400, eth-100, eth-25 (per node)",
        Interconnect,
        |c| c.interconnect
    ),
    auto_uint_key!("cuda_ctx_mib", Overhead, "CUDA context per GPU, MiB, or auto (measured for the GPU's generation)", |c| c.cuda_ctx_mib),
    auto_uint_key!("nccl_mib", Overhead, "NCCL buffers per GPU, MiB, or auto (channels × peers × protocol buffers)", |c| c.nccl_mib),
    auto_uint_key!(
        "frag_pct",
        Overhead,
        "reserve beyond allocated as a flat percent guess, or auto (the caching allocator simulated)",
        |c| c.frag_pct
    ),
    Key {
        name: "alloc_conf",
        group: Overhead,
        help: "PYTORCH_CUDA_ALLOC_CONF of the simulated allocator, e.g. expandable_segments:True",
        choices: no_choices,
        get: |c| c.alloc_conf.clone(),
        set: |c, s| {
            crate::estimator::allocator::AllocatorOptions::parse(s).map_err(|e| e.to_string())?;
            c.alloc_conf = s.to_string();
            Ok(())
        },
    },
    uint_key!("prefetch_layers", Overhead, "ZeRO-3/FSDP unsharded layers in flight", |c| c.prefetch_layers),
    bool_key!("bucket_view", Overhead, "DDP gradient_as_bucket_view", |c| c.bucket_view),
    enum_key!(
        "fp8",
        Training,
        "FP8 training recipe: none, torchao-tensorwise, torchao-rowwise (Float8Linear), te-delayed, te-current, te-mxfp8 (Transformer Engine)",
        Fp8,
        |c| c.fp8
    ),
    bool_key!(
        "fsdp_root_reshard",
        Cluster,
        "FSDP2 reshards its root unit after forward (torch 2.8 on; false: torch 2.7 and before kept the root gathered into backward)",
        |c| c.fsdp_root_reshard
    ),
    bool_key!("fp8_allgather", Cluster, "FSDP2 all-gathers the FP8 weights (torchao, tensorwise, precomputed scales)", |c| c.fp8_allgather),
    bool_key!(
        "fp8_recompute_weight",
        Training,
        "FP8 weight re-cast in backward instead of saved (torchao force_recompute_fp8_weight_in_bwd: no effect in 0.18)",
        |c| c.fp8_recompute_weight
    ),
    bool_key!("fp8_model_init", Training, "Transformer Engine fp8_model_init: FP8 parameters, no 16-bit weights", |c| c.fp8_model_init),
    enum_key!("qlora_quant", Training, "QLoRA's 4-bit base: nf4 (bitsandbytes), gptq (int4 GPTQ/AWQ) or torchao-nf4 (torchao's NF4Tensor, torchtune)", QloraQuant, |c| c.qlora_quant),
    bool_key!(
        "qlora_double_quant",
        Training,
        "bitsandbytes NF4 double quantization (bnb_4bit_use_double_quant): 8-bit absmax; false: fp32 absmax per 64 weights",
        |c| c.qlora_double_quant
    ),
    bool_key!(
        "bnb_keeps_input",
        Training,
        "bitsandbytes before 0.43.2: each 4-bit linear keeps its input for backward (MatMul4Bit, fixed by bitsandbytes#1270)",
        |c| c.bnb_keeps_input
    ),
    bool_key!(
        "qlora_lightning",
        Training,
        "QLoRA through Lightning's BitsandbytesPrecision (litgpt quantize: bnb.nf4): the LM head 4-bit too, weights quantized from fp16 (each dequantization fp16, then copied to bf16)",
        |c| c.qlora_lightning
    ),
    bool_key!(
        "holds_prev_logits",
        Training,
        "the loop keeps the last micro-batch's logits (and, with bnb_keeps_input, its 4-bit linears' inputs) until the next forward returns (litgpt's fit)",
        |c| c.holds_prev_logits
    ),
    enum_key!(
        "load",
        Training,
        "how the model is loaded: from-pretrained, quantize-on-load (NF4), meta-sharded (FSDP2), zero-init (DeepSpeed)",
        Load,
        |c| c.load
    ),
    bool_key!("empty_cache", Overhead, "torch.cuda.empty_cache() after loading (what loading cached is released)", |c| c.empty_cache),
    enum_key!("mode", Serving, "what to answer: train (the training step) or serve (inference memory)", Mode, |c| c.serve.mode),
    enum_key!("engine", Serving, "inference engine whose KV layout and budget apply", Engine, |c| c.serve.engine),
    auto_uint_key!("context", Serving, "tokens per sequence (vLLM max_model_len), or auto (the model's max_position_embeddings)", |c| c
        .serve
        .context),
    uint_key!(positive "concurrency", Serving, "concurrent sequences the longest-context answer is for", |c| c.serve.concurrency),
    enum_key!("kv_dtype", Serving, "KV cache dtype (vLLM --kv-cache-dtype); auto = the model's", KvDtype, |c| c.serve.kv_dtype),
    enum_key!("weight_dtype", Serving, "dtype the weights are served in", WeightDtype, |c| c.serve.weight_dtype),
    enum_key!(
        "mamba_ssm_cache_dtype",
        Serving,
        "recurrent state dtype (vLLM --mamba-ssm-cache-dtype, SGLang --mamba-ssm-dtype); auto = the engine's default",
        StateDtype,
        |c| c.serve.mamba_ssm_cache_dtype
    ),
    Key {
        name: "gpu_memory_utilization",
        group: Serving,
        help: "vLLM's share of the card's total memory",
        choices: no_choices,
        get: |c| fmt_f64(c.serve.gpu_memory_utilization),
        set: |c, s| {
            c.serve.gpu_memory_utilization = parse_fraction(s)?;
            Ok(())
        },
    },
    auto_uint_key!("max_num_batched_tokens", Serving, "tokens of one prefill chunk, or auto (8192)", |c| c.serve.max_num_batched_tokens),
    uint_key!(positive "max_num_seqs", Serving, "most sequences in one batch (vLLM max_num_seqs)", |c| c.serve.max_num_seqs),
    auto_uint_key!("block_size", Serving, "tokens per KV block, or auto (vLLM 16, SGLang 1, TensorRT-LLM 32)", |c| c.serve.block_size),
    Key {
        name: "mem_fraction_static",
        group: Serving,
        help: "SGLang --mem-fraction-static, or auto (its table by tp)",
        choices: no_choices,
        get: |c| c.serve.mem_fraction_static.map_or("auto".to_string(), fmt_f64),
        set: |c, s| {
            c.serve.mem_fraction_static = if s.eq_ignore_ascii_case("auto") { None } else { Some(parse_fraction(s)?) };
            Ok(())
        },
    },
    Key {
        name: "free_gpu_memory_fraction",
        group: Serving,
        help: "TensorRT-LLM KvCacheConfig.free_gpu_memory_fraction",
        choices: no_choices,
        get: |c| fmt_f64(c.serve.free_gpu_memory_fraction),
        set: |c, s| {
            c.serve.free_gpu_memory_fraction = parse_fraction(s)?;
            Ok(())
        },
    },
    bool_key!("cuda_graphs", Serving, "CUDA graphs captured (false = --enforce-eager)", |c| c.serve.cuda_graphs),
    auto_uint_key!("cuda_graph_mib", Serving, "memory of the CUDA graphs, MiB, or auto (512, assumed)", |c| c.serve.cuda_graph_mib),
    bool_key!("dp_attention", Serving, "data-parallel attention: whole KV heads per GPU, its own sequences", |c| c.serve.dp_attention),
    bool_key!("compile", Training, "torch.compile: the partitioner saves matmul inputs and outputs, recomputes pointwise chains", |c| c
        .compile),
    enum_key!(
        "compile_regions",
        Training,
        "what compiles as one graph: layer (torchtune: each layer + the loss), block (torchtitan), model (Trainer)",
        CompileRegions,
        |c| c.compile_regions
    ),
    uint_key!(
        layers "recompute_every",
        Training,
        "full checkpointing of every Nth layer (N−1, 2N−1, …: torchtitan selective_ac_option=N); 0 = off",
        |c| c.recompute_every
    ),
    uint_key!(
        layers "recompute_layers",
        Training,
        "with recompute=full on Megatron: only the first N layers of each pipeline stage recomputed (--recompute-method block --recompute-num-layers N); 0 = every layer",
        |c| c.recompute_layers
    ),
    bool_key!(
        "recompute_every_first",
        Training,
        "recompute_every counts from the first layer (0, N, 2N, …: transformers' every_n_layers) instead of torchtitan's N−1, 2N−1, …",
        |c| c.recompute_every_first
    ),
    bool_key!(
        "sac_cpu_sdpa",
        Training,
        "recompute=op on kernels=cpu: save the CPU SDPA kernel's outputs as torchtitan saves CUDA's (its list omits the CPU kernel)",
        |c| c.sac_cpu_sdpa
    ),
    Key {
        name: "act_offload",
        group: Training,
        help: "activation offloading: torchtune (saved tensors ≥ 1 KiB, not parameters, to pinned host memory; head and loss on the device), save_on_cpu (torch's: every saved tensor), none; true = torchtune",
        choices: <ActOffload as Named>::names,
        get: |c| c.act_offload.name().to_string(),
        set: |c, s| {
            c.act_offload = match s.to_ascii_lowercase().as_str() {
                "true" => ActOffload::Torchtune,
                "false" => ActOffload::None,
                _ => <ActOffload as Named>::parse(s)?,
            };
            Ok(())
        },
    },
    uint_key!(
        "act_offload_layers",
        Training,
        "per-layer activation offload (Transformer Engine; Megatron's --cpu-offloading-num-layers): the first N layers' large saved tensors to pinned host memory; 0 = off",
        |c| c.act_offload_layers
    ),
    bool_key!(
        "optim_in_bwd",
        Training,
        "optimizer step inside backward (torchtune): each gradient freed after its step; needs accum = 1",
        |c| c.optim_in_bwd
    ),
    bool_key!("optim_paged", Training, "bitsandbytes paged optimizer: states of tensors ≥ 10⁵ elements in unified memory", |c| c
        .optim_paged),
    Key {
        name: "host_ram_gib",
        group: Cluster,
        help: "host RAM per node, GiB: pinned host memory (offloaded activations) must fit in it",
        choices: no_choices,
        get: |c| fmt_f64(c.host_ram_gib),
        set: |c, s| {
            c.host_ram_gib = parse_f64(s, 0.001, 1.0e7)?;
            Ok(())
        },
    },
    enum_key!("unit", Display, "byte unit: gb (10^9) or gib (2^30)", Unit, |c| c.unit),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recipe_applies_cleanly_and_is_found_again() {
        for r in RECIPES {
            let mut c = Config::default();
            assert_eq!(apply_recipe(&mut c, r), Ok(()), "{}", r.id);
            assert!(crate::estimator::validate_consistency(&c).is_ok(), "{}", r.id);
            assert!(matching_recipe(&c).is_some(), "{}", r.id);
        }
    }

    #[test]
    fn lora_dropout_round_trips_through_the_link_and_counts_only_when_above_zero() {
        let d = crate::config::decode_query("finetune=lora&lora_dropout=0.05");
        assert_eq!(d.errors, vec![]);
        assert_eq!(d.config.lora_dropout, 0.05);
        assert!(crate::config::encode_query(&d.config).contains("lora_dropout=0.05"));
        assert!(!crate::config::encode_query(&Config::default()).contains("lora_dropout"));
        let mut c = d.config.clone();
        assert!(crate::config::set(&mut c, "lora_dropout", "1").is_err());
        c.lora_dropout = 1.0;
        assert!(crate::estimator::validate_consistency(&c).is_err());
        let with = crate::estimator::estimate(&d.config).expect("estimates");
        let without = crate::estimator::estimate(&Config { lora_dropout: 0.0, ..d.config.clone() }).expect("estimates");
        assert!(with.memory.activations > without.memory.activations);
        let compiled = Config { compile: true, ..d.config.clone() };
        assert!(crate::estimator::estimate(&compiled).is_err_and(|e| e.to_string().contains("lora_dropout")));
    }

    #[test]
    fn no_recipe_matches_the_default_configuration() {
        assert_eq!(matching_recipe(&Config::default()), None);
    }

    #[test]
    fn integers_accept_k_and_m_suffixes() {
        assert_eq!(parse_uint("8k"), Ok(8192));
        assert_eq!(parse_uint("1M"), Ok(1 << 20));
        assert_eq!(parse_uint("1_000"), Ok(1000));
        assert!(parse_uint("-1").is_err());
        assert!(parse_uint("99999999999999999999").is_err());
        assert!(parse_uint("2m").is_ok());
    }

    #[test]
    fn key_names_are_unique() {
        let mut names: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before);
    }

    #[test]
    fn lora_targets_read_module_names_and_groups() {
        assert_eq!(parse_lora_targets("q_proj,v_proj"), Ok(LoraTargets(LoraTargets::Q | LoraTargets::V)));
        assert_eq!(parse_lora_targets("attn").map(lora_targets_to_string), Ok("q,k,v,o".to_string()));
        assert_eq!(parse_lora_targets("all-linear"), Ok(LoraTargets::ALL));
        assert!(parse_lora_targets("fc9").is_err());
    }

    #[test]
    fn a_gpu_alias_is_stored_as_the_cards_id_so_links_stay_canonical() {
        let k = KEYS.iter().find(|k| k.name == "gpu").expect("gpu key");
        let mut c = Config::default();
        assert_eq!((k.set)(&mut c, "H100-SXM"), Ok(()));
        assert_eq!(c.gpu, "h100-80gb");
        assert!((k.set)(&mut c, "tpu-v5").is_err());
    }

    #[test]
    fn cluster_keys_read_the_interconnect_and_custom_gpu_figures() {
        let set = |name: &str, v: &str, c: &mut Config| (KEYS.iter().find(|k| k.name == name).expect("key").set)(c, v);
        let mut c = Config::default();
        assert_eq!(set("interconnect", "roce-400", &mut c), Ok(()));
        assert_eq!(c.interconnect, Interconnect::Roce400);
        assert_eq!(set("gpus_per_node", "72", &mut c), Ok(()));
        assert_eq!(set("gpu_tflops", "1250.5", &mut c), Ok(()));
        assert_eq!((c.gpus_per_node, c.gpu_tflops), (72, 1250.5));
        assert!(set("gpu_hbm_gbs", "-1", &mut c).is_err());
        assert!(set("gpus_per_node", "0", &mut c).is_err());
        assert!(set("interconnect", "carrier-pigeon", &mut c).is_err_and(|e| e.contains("ib-ndr")));
    }

    #[test]
    fn enumerations_reject_unknown_spellings_listing_the_valid_ones() {
        let err = Precision::parse("bf17");
        assert!(err.is_err_and(|e| e.contains("mixed-bf16-fp32grad")));
    }
}
