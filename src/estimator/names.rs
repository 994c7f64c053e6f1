//! The one spelling of every enumerated setting's values: what the share link, the CLI, the
//! form and the framework files write and read (`zero=full_shard`, `recompute=op`, …). The
//! codec (`config::keys`) parses and prints them through [`Named`]; the planner's table and the
//! exported framework files print them with it too, so that a value is spelled in one place.

use crate::estimator::config::*;
use crate::estimator::model::{Activation, MlpKind, NormKind, Positions, QkNorm, Router, StateDtype, WindowKind};
use crate::estimator::serve_config::{Engine, KvDtype, Mode, WeightDtype};

/// An enumeration's spellings.
pub trait Named: Copy + PartialEq + 'static {
    const ALL: &'static [(Self, &'static str)];
    fn name(self) -> &'static str {
        Self::ALL.iter().find(|(v, _)| *v == self).map_or("", |(_, n)| n)
    }
    fn parse(s: &str) -> Result<Self, String> {
        let s = s.to_ascii_lowercase();
        Self::ALL
            .iter()
            .find(|(_, n)| *n == s)
            .map(|(v, _)| *v)
            .ok_or_else(|| format!("expected one of {}", Self::ALL.iter().map(|(_, n)| *n).collect::<Vec<_>>().join(", ")))
    }
    fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|(_, n)| *n).collect()
    }
}

macro_rules! named {
    ($t:ty, [$(($v:expr, $n:literal)),* $(,)?]) => {
        impl Named for $t {
            const ALL: &'static [(Self, &'static str)] = &[$(($v, $n)),*];
        }
    };
}

named!(
    Precision,
    [
        (Precision::Fp32, "fp32"),
        (Precision::Bf16, "bf16"),
        (Precision::Fp16, "fp16"),
        (Precision::AmpBf16, "amp-bf16"),
        (Precision::AmpFp16, "amp-fp16"),
        (Precision::MixedBf16, "mixed-bf16"),
        (Precision::MixedFp16, "mixed-fp16"),
        (Precision::MixedBf16Fp32grad, "mixed-bf16-fp32grad"),
        (Precision::MixedFp8, "mixed-fp8"),
    ]
);
named!(
    Optimizer,
    [
        (Optimizer::Sgd, "sgd"),
        (Optimizer::Momentum, "momentum"),
        (Optimizer::Adamw, "adamw"),
        (Optimizer::Adafactor, "adafactor"),
        (Optimizer::Lion, "lion"),
        (Optimizer::Adam8bit, "adam8bit"),
        (Optimizer::Muon, "muon"),
    ]
);
named!(OptimImpl, [(OptimImpl::Foreach, "foreach"), (OptimImpl::Fused, "fused"), (OptimImpl::Forloop, "forloop")]);
named!(LoraDtype, [(LoraDtype::Fp32, "fp32"), (LoraDtype::Model, "model")]);
named!(Finetune, [(Finetune::Full, "full"), (Finetune::Lora, "lora"), (Finetune::Qlora, "qlora")]);
named!(Attention, [(Attention::Eager, "eager"), (Attention::Sdpa, "sdpa"), (Attention::Flash, "flash")]);
named!(Recompute, [(Recompute::None, "none"), (Recompute::Selective, "selective"), (Recompute::Full, "full"), (Recompute::Op, "op")]);
named!(Loss, [(Loss::Standard, "standard"), (Loss::Chunked, "chunked")]);
named!(
    Framework,
    [
        (Framework::Hf, "hf"),
        (Framework::Megatron, "megatron"),
        (Framework::Torchtitan, "torchtitan"),
        (Framework::Torchtune, "torchtune"),
        (Framework::Litgpt, "litgpt")
    ]
);
named!(Kernels, [(Kernels::Cuda, "cuda"), (Kernels::Cpu, "cpu")]);
named!(
    Zero,
    [
        (Zero::Ddp, "0"),
        (Zero::Z1, "1"),
        (Zero::Z2, "2"),
        (Zero::Z3, "3"),
        (Zero::FullShard, "full_shard"),
        (Zero::ShardGradOp, "shard_grad_op"),
        (Zero::HybridShard, "hybrid_shard"),
    ]
);
named!(Offload, [(Offload::None, "none"), (Offload::Optimizer, "optimizer"), (Offload::OptimizerParams, "optimizer+params")]);
named!(Unit, [(Unit::Gb, "gb"), (Unit::Gib, "gib")]);
named!(ActOffload, [(ActOffload::None, "none"), (ActOffload::Torchtune, "torchtune"), (ActOffload::SaveOnCpu, "save_on_cpu")]);
named!(CompileRegions, [(CompileRegions::Layer, "layer"), (CompileRegions::Block, "block"), (CompileRegions::Model, "model")]);
named!(
    Interconnect,
    [
        (Interconnect::IbXdr, "ib-xdr"),
        (Interconnect::IbNdr, "ib-ndr"),
        (Interconnect::IbHdr, "ib-hdr"),
        (Interconnect::Roce400, "roce-400"),
        (Interconnect::Eth100, "eth-100"),
        (Interconnect::Eth25, "eth-25"),
    ]
);
named!(MlpKind, [(MlpKind::Plain, "plain"), (MlpKind::Gated, "gated")]);
named!(
    Activation,
    [
        (Activation::Silu, "silu"),
        (Activation::Gelu, "gelu"),
        (Activation::GeluTanh, "gelu-tanh"),
        (Activation::GeluNew, "gelu-new"),
        (Activation::Relu, "relu"),
        (Activation::SwigluClamped, "swiglu-clamped"),
        (Activation::Xielu, "xielu"),
    ]
);
named!(WindowKind, [(WindowKind::Sliding, "sliding"), (WindowKind::Chunked, "chunked")]);
named!(
    Router,
    [
        (Router::Softmax, "softmax"),
        (Router::TopkSoftmax, "topk-softmax"),
        (Router::Sigmoid, "sigmoid"),
        (Router::TopkSigmoid, "topk-sigmoid")
    ]
);
named!(
    NormKind,
    [
        (NormKind::Layernorm, "layernorm"),
        (NormKind::LayernormNoBias, "layernorm-nobias"),
        (NormKind::Rmsnorm, "rmsnorm"),
        (NormKind::RmsnormGemma, "rmsnorm-gemma"),
        (NormKind::Nonparametric, "nonparametric"),
    ]
);
named!(QkNorm, [(QkNorm::None, "none"), (QkNorm::Head, "head"), (QkNorm::Full, "full"), (QkNorm::PerHead, "per-head")]);
named!(Positions, [(Positions::Rope, "rope"), (Positions::Learned, "learned"), (Positions::None, "none")]);

named!(
    Fp8,
    [
        (Fp8::None, "none"),
        (Fp8::TorchaoTensorwise, "torchao-tensorwise"),
        (Fp8::TorchaoRowwise, "torchao-rowwise"),
        (Fp8::TeDelayed, "te-delayed"),
        (Fp8::TeCurrent, "te-current"),
        (Fp8::TeMxfp8, "te-mxfp8"),
    ]
);
named!(QloraQuant, [(QloraQuant::Nf4, "nf4"), (QloraQuant::Gptq, "gptq"), (QloraQuant::TorchaoNf4, "torchao-nf4")]);
named!(
    Load,
    [
        (Load::FromPretrained, "from-pretrained"),
        (Load::QuantizeOnLoad, "quantize-on-load"),
        (Load::MetaSharded, "meta-sharded"),
        (Load::ZeroInit, "zero-init"),
    ]
);
named!(
    StateDtype,
    [(StateDtype::Auto, "auto"), (StateDtype::Float32, "float32"), (StateDtype::Bfloat16, "bfloat16"), (StateDtype::Float16, "float16")]
);
named!(Mode, [(Mode::Train, "train"), (Mode::Serve, "serve")]);
named!(Engine, [(Engine::Vllm, "vllm"), (Engine::Sglang, "sglang"), (Engine::Trtllm, "trtllm"), (Engine::Transformers, "transformers")]);
named!(
    KvDtype,
    [
        (KvDtype::Auto, "auto"),
        (KvDtype::Bf16, "bf16"),
        (KvDtype::Fp16, "fp16"),
        (KvDtype::Fp8, "fp8"),
        (KvDtype::Int8, "int8"),
        (KvDtype::Nvfp4, "nvfp4"),
    ]
);
named!(
    WeightDtype,
    [
        (WeightDtype::Auto, "auto"),
        (WeightDtype::Bf16, "bf16"),
        (WeightDtype::Fp16, "fp16"),
        (WeightDtype::Fp8, "fp8"),
        (WeightDtype::Fp8Block, "fp8-block"),
        (WeightDtype::Int8, "int8"),
        (WeightDtype::Int4Awq, "int4-awq"),
        (WeightDtype::Int4Gptq, "int4-gptq"),
        (WeightDtype::Nvfp4, "nvfp4"),
        (WeightDtype::Mxfp4, "mxfp4"),
    ]
);
