//! `trainmem verify-script --mode serve`: a script that starts vLLM (or SGLang) on this
//! configuration with random weights (`load_format="dummy"`, the model's `config.json` written
//! by [`crate::estimator::hf_export`]) and prints its startup log's figures — weights, activation
//! peak, available KV cache, KV cache tokens, maximum concurrency, CUDA graphs — beside
//! trainmem's. Quantized checkpoints other than FP8 (dynamic, `quantization="fp8"`) need real
//! weights and are refused, as are TensorRT-LLM and transformers (no startup log to compare).

use super::VerifyError;
use crate::config::{encode_query, Config};
use crate::estimator::hf_export;
use crate::estimator::serve::{analyse_serving, Engine, KvDtype, WeightDtype};
use serde_json::{json, Value};

const TEMPLATE: &str = include_str!("serve_template.py");
const GIB: f64 = (1u64 << 30) as f64;

/// The engine's keyword arguments for this configuration.
fn engine_args(cfg: &Config) -> Result<Value, VerifyError> {
    let s = &cfg.serve;
    let refuse = |key, value: String, reason| Err(VerifyError::Refused { key, value, reason });
    let quantization = match s.weight_dtype {
        WeightDtype::Auto | WeightDtype::Bf16 | WeightDtype::Fp16 => Value::Null,
        WeightDtype::Fp8 => json!("fp8"),
        other => {
            return refuse(
                "weight_dtype",
                format!("{other:?}"),
                "needs the quantized checkpoint's real weights; dummy weights can only be fp8 (dynamic)",
            )
        }
    };
    let kv = match s.kv_dtype {
        KvDtype::Auto | KvDtype::Bf16 | KvDtype::Fp16 => "auto",
        KvDtype::Fp8 => "fp8",
        other => return refuse("kv_dtype", format!("{other:?}"), "is not a KV cache dtype vLLM or SGLang take on the command line"),
    };
    let context = crate::estimator::serve::context_of(cfg);
    let ssm = (s.mamba_ssm_cache_dtype != crate::estimator::model::StateDtype::Auto).then(|| s.mamba_ssm_cache_dtype.name());
    let mut args = match s.engine {
        Engine::Vllm => json!({
            "max_model_len": context,
            "gpu_memory_utilization": s.gpu_memory_utilization,
            "max_num_batched_tokens": s.max_num_batched_tokens.unwrap_or(8192),
            "max_num_seqs": s.max_num_seqs,
            "block_size": s.block_size.unwrap_or(16),
            "kv_cache_dtype": kv,
            "tensor_parallel_size": cfg.tp,
            "pipeline_parallel_size": cfg.pp,
            "enforce_eager": !s.cuda_graphs,
            "quantization": quantization,
        }),
        Engine::Sglang => json!({
            "context_length": context,
            "mem_fraction_static": s.mem_fraction_static.unwrap_or_else(|| crate::estimator::serve::sglang_default_fraction(cfg.tp)),
            "tp_size": cfg.tp,
            "kv_cache_dtype": if kv == "fp8" { "fp8_e4m3" } else { "auto" },
            "disable_cuda_graph": !s.cuda_graphs,
            "enable_dp_attention": s.dp_attention,
            "quantization": quantization,
        }),
        other => return refuse("engine", other.label().to_string(), "has no startup log this script reads; use vllm or sglang"),
    };
    // vLLM `--mamba-ssm-cache-dtype`, SGLang `--mamba-ssm-dtype`: only when the key is set.
    if let (Some(d), Some(map)) = (ssm, args.as_object_mut()) {
        let key = if s.engine == Engine::Vllm { "mamba_ssm_cache_dtype" } else { "mamba_ssm_dtype" };
        map.insert(key.into(), d.into());
    }
    Ok(args)
}

/// The serve verify script for `cfg`.
pub fn serve_script(cfg: &Config) -> Result<String, VerifyError> {
    let args = engine_args(cfg)?;
    let exported = hf_export::export(&cfg.arch)?;
    let s = analyse_serving(cfg).map_err(|e| VerifyError::Refused { key: e.key(), value: String::new(), reason: "cannot be analysed" })?;
    let predicted = json!({
        "weights_gib": s.weights as f64 / GIB,
        "available_kv_gib": s.kv_cache_bytes as f64 / GIB,
        "kv_cache_tokens": s.kv_cache_tokens,
        "max_concurrency": s.max_concurrency,
        "activation_gib": s.activation_peak as f64 / GIB,
        "cuda_graphs_gib": crate::estimator::serve::cuda_graph_bytes(cfg) as f64 / GIB,
    });
    let engine = if cfg.serve.engine == Engine::Sglang { "sglang" } else { "vllm" };
    Ok(TEMPLATE
        .replace("__CONFIG__", &exported.config.to_string())
        .replace("__ENGINE__", engine)
        .replace("__ARGS__", &args.to_string())
        .replace("__PREDICTED__", &predicted.to_string())
        .replace("__QUERY__", &encode_query(cfg)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::decode_query;

    #[test]
    fn the_script_carries_the_engine_arguments_and_the_prediction() {
        let c = decode_query("mode=serve&model=qwen3-0.6b&context=4096&kv_dtype=fp8").config;
        let s = serve_script(&c).unwrap_or_default();
        assert!(s.contains("\"kv_cache_dtype\":\"fp8\"") && s.contains("\"max_model_len\":4096"), "{}", &s[..400.min(s.len())]);
        assert!(s.contains("\"max_concurrency\":") && !s.contains("__CONFIG__") && !s.contains("__PREDICTED__"));
    }

    #[test]
    fn a_set_state_dtype_reaches_each_engine_under_its_own_flag() {
        let v = decode_query("mode=serve&model=qwen3.5-27b&context=4096&mamba_ssm_cache_dtype=bfloat16").config;
        assert!(engine_args(&v).is_ok_and(|a| a["mamba_ssm_cache_dtype"] == "bfloat16"));
        let g = decode_query("mode=serve&engine=sglang&model=qwen3.5-27b&context=4096&mamba_ssm_cache_dtype=float32").config;
        assert!(engine_args(&g).is_ok_and(|a| a["mamba_ssm_dtype"] == "float32"));
        // Unset, the engine's own default stands: no flag.
        let d = decode_query("mode=serve&model=qwen3.5-27b&context=4096").config;
        assert!(engine_args(&d).is_ok_and(|a| a.get("mamba_ssm_cache_dtype").is_none()));
    }

    #[test]
    fn engines_without_a_log_are_refused_naming_the_key() {
        let c = decode_query("mode=serve&model=qwen3-0.6b&engine=trtllm").config;
        assert!(matches!(serve_script(&c), Err(VerifyError::Refused { key: "engine", .. })));
        let q = decode_query("mode=serve&model=qwen3-0.6b&weight_dtype=int4-awq").config;
        assert!(matches!(serve_script(&q), Err(VerifyError::Refused { key: "weight_dtype", .. })));
    }
}
