//! Engine profiles: hardware, model, scheduler limits and the step-timing model, read from the
//! data file shipped with the project (`data/profiles.toml`) or from a caller's TOML text. A
//! roofline profile is derived from spec sheets and the efficiencies calibrated once
//! ([`spec`]), or gives its roofline figures itself.

pub mod spec;

use crate::timing::StepModel;
use serde::{Deserialize, Serialize};
pub use spec::{Efficiency, GpuSpec, Hardware, ModelSpec, Specs};
use std::collections::BTreeMap;

/// The profiles shipped with kvroute.
pub const BUILTIN_PROFILES: &str = include_str!("../data/profiles.toml");

/// One engine profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// What it models.
    #[serde(default)]
    pub description: String,
    /// KV block size in tokens.
    pub block_size: usize,
    /// KV blocks; derived from memory for roofline profiles when absent.
    #[serde(default)]
    pub num_gpu_blocks: Option<usize>,
    /// Most sequences in a step.
    pub max_num_seqs: usize,
    /// Most tokens in a step.
    pub max_num_batched_tokens: usize,
    /// Fixed latency per request before its first step, ms (frontend, tokenization,
    /// queueing outside the step loop).
    #[serde(default)]
    pub request_overhead_ms: f64,
    /// Spec sheets this profile's roofline and request overhead derive from (instead of
    /// `roofline` and `request_overhead_ms`).
    #[serde(default)]
    pub hardware: Option<Hardware>,
    /// Roofline timing.
    #[serde(default)]
    pub roofline: Option<Roofline>,
    /// Polynomial timing.
    #[serde(default)]
    pub polynomial: Option<Polynomial>,
}

/// Hardware and model figures of the roofline step model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Roofline {
    /// Model parameters, in billions.
    pub params_billion: f64,
    /// Transformer layers.
    pub layers: u32,
    /// Attention (query) heads.
    pub heads: u32,
    /// KV heads.
    pub kv_heads: u32,
    /// Head dimension.
    pub head_dim: u32,
    /// Bytes per weight.
    pub weight_bytes_per_param: f64,
    /// Bytes per KV element.
    pub kv_dtype_bytes: f64,
    /// Peak dense FLOP/s of all GPUs of the replica, in TFLOP/s.
    pub peak_tflops: f64,
    /// HBM bandwidth of all GPUs, TB/s.
    pub hbm_tb_per_s: f64,
    /// HBM size of all GPUs, GB.
    pub hbm_gb: f64,
    /// Fraction of HBM the engine may use (weights + KV).
    pub memory_fraction: f64,
    /// Achieved fraction of peak FLOP/s.
    pub mfu: f64,
    /// Achieved fraction of peak bandwidth reading weights.
    pub mbu: f64,
    /// Achieved fraction of peak bandwidth reading the KV cache in attention (paged,
    /// scattered reads run below the weights' streaming rate); `mbu` when absent.
    #[serde(default)]
    pub attention_mbu: Option<f64>,
    /// Fixed time per step, ms (scheduling, kernel launches).
    pub step_overhead_ms: f64,
    /// GPUs the replica's tensors are split over (1: no all-reduce).
    #[serde(default = "one")]
    pub tensor_parallel: u32,
    /// Achieved link bandwidth between them each way, GB/s (for tensor parallelism).
    #[serde(default)]
    pub link_gb_per_s: f64,
    /// Fixed time of one all-reduce, µs.
    #[serde(default)]
    pub allreduce_latency_us: f64,
}

fn one() -> u32 {
    1
}

impl Roofline {
    /// Bytes of weights.
    pub fn weight_bytes(&self) -> f64 {
        self.params_billion * 1e9 * self.weight_bytes_per_param
    }

    /// Bytes of KV cache per token.
    pub fn kv_bytes_per_token(&self) -> f64 {
        2.0 * f64::from(self.layers)
            * f64::from(self.kv_heads)
            * f64::from(self.head_dim)
            * self.kv_dtype_bytes
    }

    /// Seconds of a step's tensor-parallel all-reduces with `tokens` in the batch: two per
    /// layer (after attention and after the MLP), each a ring over the GPUs of 16-bit
    /// activations (`2 (tp - 1) / tp` of them cross each link) plus its fixed latency.
    pub fn allreduce_secs(&self, tokens: f64) -> f64 {
        if self.tensor_parallel <= 1 {
            return 0.0;
        }
        let tp = f64::from(self.tensor_parallel);
        let bytes = tokens * f64::from(self.heads) * f64::from(self.head_dim) * 2.0;
        let one = self.allreduce_latency_us / 1e6
            + 2.0 * (tp - 1.0) / tp * bytes / (self.link_gb_per_s * 1e9);
        2.0 * f64::from(self.layers) * one
    }

    /// KV capacity in tokens.
    pub fn kv_capacity_tokens(&self) -> f64 {
        ((self.hbm_gb * 1e9 * self.memory_fraction - self.weight_bytes())
            / self.kv_bytes_per_token())
        .max(0.0)
    }
}

/// The polynomial step model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Polynomial {
    /// `[p0, p1, p2]`: prefill ms = p0 + p1 T + p2 T^2 over the step's uncached tokens T.
    pub prefill_ms: [f64; 3],
    /// `[d0, d1, d2]`: decode ms = d0 + d1 u + d2 u^2 over the KV usage u.
    pub decode_ms: [f64; 3],
    /// Lower bound of the decode time, ms.
    pub decode_floor_ms: f64,
}

/// Profile errors.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ProfileError {
    /// The TOML text does not parse.
    #[error("profiles: {0}")]
    Parse(String),
    /// No profile of that name.
    #[error("unknown profile {name:?} (known: {known})")]
    Unknown {
        /// The name asked for.
        name: String,
        /// The names known.
        known: String,
    },
    /// A profile's values are unusable.
    #[error("profile {name:?}: {reason}")]
    Invalid {
        /// The profile.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    #[serde(default)]
    gpus: BTreeMap<String, GpuSpec>,
    #[serde(default)]
    models: BTreeMap<String, ModelSpec>,
    #[serde(default)]
    efficiency: Option<Efficiency>,
    profiles: BTreeMap<String, Profile>,
}

/// Parses a profiles file (the format of `data/profiles.toml`): spec sheets, efficiencies
/// and profiles; the profiles that name `hardware` get their roofline derived.
pub fn parse_profiles(text: &str) -> Result<BTreeMap<String, Profile>, ProfileError> {
    let file: ProfileFile = toml::from_str(text).map_err(|e| ProfileError::Parse(e.to_string()))?;
    let specs = Specs {
        gpus: file.gpus,
        models: file.models,
        efficiency: file.efficiency,
    };
    let mut profiles = file.profiles;
    for (name, p) in &mut profiles {
        if let Some(h) = &p.hardware {
            if p.roofline.is_some() || p.request_overhead_ms != 0.0 {
                return Err(spec::invalid(
                    name,
                    "a profile derived from `hardware` takes its roofline and request overhead from the spec sheets and [efficiency]".into(),
                ));
            }
            let (roofline, overhead) = specs.derive(h).map_err(|r| spec::invalid(name, r))?;
            p.roofline = Some(roofline);
            p.request_overhead_ms = overhead;
        }
        p.validate(name)?;
    }
    Ok(profiles)
}

/// The names of the built-in profiles.
pub fn builtin_names() -> Vec<String> {
    parse_profiles(BUILTIN_PROFILES)
        .map(|m| m.into_keys().collect())
        .unwrap_or_default()
}

impl Profile {
    /// A built-in profile by name.
    pub fn builtin(name: &str) -> Result<Profile, ProfileError> {
        let all = parse_profiles(BUILTIN_PROFILES)?;
        let known = all.keys().cloned().collect::<Vec<_>>().join(", ");
        all.get(name).cloned().ok_or(ProfileError::Unknown {
            name: name.to_string(),
            known,
        })
    }

    /// Checks the values.
    pub fn validate(&self, name: &str) -> Result<(), ProfileError> {
        let bad = |reason: String| ProfileError::Invalid {
            name: name.to_string(),
            reason,
        };
        if self.block_size == 0 || self.block_size > kvroute_core::BlockSize::MAX {
            return Err(bad(format!(
                "block_size {} is out of range",
                self.block_size
            )));
        }
        if !(self.request_overhead_ms.is_finite() && self.request_overhead_ms >= 0.0) {
            return Err(bad("request_overhead_ms must be >= 0".into()));
        }
        if self.max_num_seqs == 0 || self.max_num_batched_tokens == 0 {
            return Err(bad(
                "max_num_seqs and max_num_batched_tokens must be > 0".into()
            ));
        }
        match (&self.roofline, &self.polynomial) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(bad("give exactly one of [roofline] and [polynomial]".into()))
            }
            (Some(r), None) => {
                let positive = [
                    r.params_billion,
                    r.weight_bytes_per_param,
                    r.kv_dtype_bytes,
                    r.peak_tflops,
                    r.hbm_tb_per_s,
                    r.hbm_gb,
                    r.memory_fraction,
                    r.mfu,
                    r.mbu,
                ];
                if positive.iter().any(|v| !(v.is_finite() && *v > 0.0))
                    || r.layers == 0
                    || r.heads == 0
                    || r.kv_heads == 0
                    || r.head_dim == 0
                    || !(r.step_overhead_ms.is_finite() && r.step_overhead_ms >= 0.0)
                    || r.attention_mbu.is_some_and(|a| !(a.is_finite() && a > 0.0))
                    || r.tensor_parallel == 0
                    || (r.tensor_parallel > 1
                        && !(r.link_gb_per_s.is_finite() && r.link_gb_per_s > 0.0))
                    || !(r.allreduce_latency_us.is_finite() && r.allreduce_latency_us >= 0.0)
                {
                    return Err(bad("roofline values must be positive and finite".into()));
                }
                if self.num_gpu_blocks.is_none() && r.kv_capacity_tokens() < self.block_size as f64
                {
                    return Err(bad("the weights leave no memory for the KV cache".into()));
                }
            }
            (None, Some(p)) => {
                if p.prefill_ms
                    .iter()
                    .chain(&p.decode_ms)
                    .any(|v| !v.is_finite())
                    || !(p.decode_floor_ms.is_finite() && p.decode_floor_ms >= 0.0)
                {
                    return Err(bad("polynomial coefficients must be finite".into()));
                }
                if self.num_gpu_blocks.is_none() {
                    return Err(bad("polynomial profiles need num_gpu_blocks".into()));
                }
            }
        }
        if self.num_gpu_blocks == Some(0) {
            return Err(bad("num_gpu_blocks must be > 0".into()));
        }
        Ok(())
    }

    /// KV blocks of `block_size` tokens: the explicit count, or what memory leaves.
    pub fn kv_blocks(&self, block_size: usize) -> usize {
        match (self.num_gpu_blocks, &self.roofline) {
            (Some(n), _) => n * self.block_size / block_size.max(1),
            (None, Some(r)) => (r.kv_capacity_tokens() / block_size.max(1) as f64) as usize,
            (None, None) => 0,
        }
        .max(1)
    }

    /// The step-timing model of this profile.
    pub fn step_model(&self) -> StepModel {
        match (&self.roofline, &self.polynomial) {
            (Some(r), _) => StepModel::Roofline(r.clone()),
            (None, Some(p)) => StepModel::Polynomial(p.clone()),
            (None, None) => StepModel::Polynomial(Polynomial {
                prefill_ms: [0.0; 3],
                decode_ms: [1.0, 0.0, 0.0],
                decode_floor_ms: 1.0,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_profiles_parse_and_validate() {
        let names = builtin_names();
        for n in [
            "h200-llama3-70b-fp8",
            "h100x2-tp2-llama3-70b-fp8",
            "a100-40g-qwen3-8b",
            "tiny",
            "tiny-fast",
            "tiny-concurrent",
            "mocker-poly",
        ] {
            assert!(names.contains(&n.to_string()), "{n} missing from {names:?}");
            Profile::builtin(n).unwrap();
        }
    }

    #[test]
    fn kv_capacity_comes_from_memory() {
        let p = Profile::builtin("a100-40g-qwen3-8b").unwrap();
        let r = p.roofline.as_ref().unwrap();
        // 2 * 36 layers * 8 KV heads * 128 * 2 bytes.
        assert_eq!(r.kv_bytes_per_token(), 147_456.0);
        // (40e9 * 0.9 - 8.2e9 * 2) / 147,456 = 132,921 tokens.
        assert_eq!(r.kv_capacity_tokens().floor(), 132_921.0);
        assert_eq!(p.kv_blocks(64), 2_076);
        let m = Profile::builtin("mocker-poly").unwrap();
        assert_eq!(m.kv_blocks(64), 16_384);
        assert_eq!(m.kv_blocks(16), 65_536, "same memory in smaller blocks");
    }

    #[test]
    fn bad_profiles_are_refused_with_a_reason() {
        assert!(matches!(
            Profile::builtin("b200"),
            Err(ProfileError::Unknown { .. })
        ));
        let text = BUILTIN_PROFILES.replace("block_size = 4\n", "block_size = 0\n");
        let e = parse_profiles(&text).unwrap_err();
        assert!(e.to_string().contains("tiny"), "{e}");
        assert!(parse_profiles("profiles = 3").is_err());
        let two = "[profiles.x]\nblock_size = 4\nmax_num_seqs = 1\nmax_num_batched_tokens = 4\n";
        assert!(parse_profiles(two)
            .unwrap_err()
            .to_string()
            .contains("exactly one"));
    }
}
