//! Spec sheets and calibrated efficiencies, and the roofline they derive.
//!
//! A profile names a GPU (`[gpus.*]`: what its vendor publishes), how many of them serve one
//! replica with tensor parallelism, a model (`[models.*]`: its architecture) and a data type;
//! the efficiencies (`[efficiency]`) were calibrated once, on the reference demo
//! (docs/simulator.md), and carry to every GPU, model and tensor-parallel size. So a new
//! setup needs its spec sheet, not a new calibration.

use super::{ProfileError, Roofline};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One GPU's spec sheet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// What it is.
    #[serde(default)]
    pub description: String,
    /// Dense BF16 tensor throughput, TFLOP/s.
    pub dense_tflops_bf16: f64,
    /// Dense FP8 tensor throughput, TFLOP/s (absent: no FP8 tensor cores).
    #[serde(default)]
    pub dense_tflops_fp8: Option<f64>,
    /// HBM size, GB.
    pub hbm_gb: f64,
    /// HBM bandwidth, TB/s.
    pub hbm_tb_per_s: f64,
    /// GPU-to-GPU link bandwidth each way, GB/s (NVLink).
    pub link_gb_per_s: f64,
}

/// One model's architecture.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Parameters, in billions.
    pub params_billion: f64,
    /// Transformer layers.
    pub layers: u32,
    /// Attention (query) heads.
    pub heads: u32,
    /// KV heads.
    pub kv_heads: u32,
    /// Head dimension.
    pub head_dim: u32,
}

/// The efficiencies calibrated once, which every derived profile shares.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Efficiency {
    /// Achieved fraction of peak FLOP/s.
    pub mfu: f64,
    /// Achieved fraction of peak bandwidth reading weights.
    pub mbu: f64,
    /// Achieved fraction of peak bandwidth reading the KV cache in attention.
    pub attention_mbu: f64,
    /// Fixed time per step, ms.
    pub step_overhead_ms: f64,
    /// Fixed latency per request before its first step, ms.
    pub request_overhead_ms: f64,
    /// Fixed time of one all-reduce (launch and synchronisation), µs.
    pub allreduce_latency_us: f64,
    /// Achieved fraction of the link bandwidth in an all-reduce.
    pub allreduce_link_efficiency: f64,
}

/// What a profile derived from spec sheets names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hardware {
    /// A GPU of `[gpus]`.
    pub gpu: String,
    /// GPUs per replica (tensor parallel size).
    pub gpus: u32,
    /// A model of `[models]`.
    pub model: String,
    /// Weights and KV cache: `fp8` or `bf16`.
    pub dtype: String,
    /// Fraction of HBM the engine may use (weights + KV).
    pub memory_fraction: f64,
}

/// The spec sheets and efficiencies of a profiles file.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Specs {
    /// GPUs by name.
    pub gpus: BTreeMap<String, GpuSpec>,
    /// Models by name.
    pub models: BTreeMap<String, ModelSpec>,
    /// The calibrated efficiencies.
    pub efficiency: Option<Efficiency>,
}

impl Specs {
    /// The roofline of `h` and the request overhead (ms), or why they cannot be derived.
    pub fn derive(&self, h: &Hardware) -> Result<(Roofline, f64), String> {
        let gpu = self
            .gpus
            .get(&h.gpu)
            .ok_or_else(|| format!("unknown gpu {:?}", h.gpu))?;
        let model = self
            .models
            .get(&h.model)
            .ok_or_else(|| format!("unknown model {:?}", h.model))?;
        let eff = self
            .efficiency
            .as_ref()
            .ok_or("derived profiles need the [efficiency] table")?;
        if h.gpus == 0 || h.gpus > 64 {
            return Err(format!("gpus must be within 1..=64, got {}", h.gpus));
        }
        let (tflops, bytes) = match h.dtype.as_str() {
            "bf16" => (gpu.dense_tflops_bf16, 2.0),
            "fp8" => (
                gpu.dense_tflops_fp8
                    .ok_or_else(|| format!("gpu {:?} has no FP8 throughput", h.gpu))?,
                1.0,
            ),
            other => return Err(format!("dtype must be fp8 or bf16, got {other:?}")),
        };
        let n = f64::from(h.gpus);
        let roofline = Roofline {
            params_billion: model.params_billion,
            layers: model.layers,
            heads: model.heads,
            kv_heads: model.kv_heads,
            head_dim: model.head_dim,
            weight_bytes_per_param: bytes,
            kv_dtype_bytes: bytes,
            peak_tflops: tflops * n,
            hbm_tb_per_s: gpu.hbm_tb_per_s * n,
            hbm_gb: gpu.hbm_gb * n,
            memory_fraction: h.memory_fraction,
            mfu: eff.mfu,
            mbu: eff.mbu,
            attention_mbu: Some(eff.attention_mbu),
            step_overhead_ms: eff.step_overhead_ms,
            tensor_parallel: h.gpus,
            link_gb_per_s: gpu.link_gb_per_s * eff.allreduce_link_efficiency,
            allreduce_latency_us: eff.allreduce_latency_us,
        };
        Ok((roofline, eff.request_overhead_ms))
    }
}

/// `derive`'s error as a profile error.
pub(super) fn invalid(name: &str, reason: String) -> ProfileError {
    ProfileError::Invalid {
        name: name.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests;
