//! The worker's settings ([`WorkerConfig`]) and the engine settings derived from them.

use crate::WorkerError;
use kvroute_engine::{EngineConfig, Profile};
use kvroute_protocol::kv_events::EventFormat;
use kvroute_runtime::Secret;
use serde::{Deserialize, Serialize};

/// How the simulated engine takes waiting requests (vLLM's `--scheduling-policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedulingPolicy {
    /// First come, first served.
    #[default]
    Fcfs,
    /// By the request's `priority` (lower first), then arrival.
    Priority,
}

impl std::str::FromStr for SchedulingPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fcfs" => Ok(Self::Fcfs),
            "priority" => Ok(Self::Priority),
            _ => Err(format!("{s:?}: expected fcfs or priority")),
        }
    }
}

/// Settings of a simulated worker. Every field has a default, so a TOML or JSON document
/// needs only the ones it changes; unknown fields are refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// The served model name (`model` of requests, `GET /v1/models`).
    pub model: String,
    /// The engine profile (a name from `kvroute_engine`'s `data/profiles.toml`).
    pub profile: String,
    /// KV block size in tokens, instead of the profile's (same KV memory).
    pub block_size: Option<usize>,
    /// Virtual seconds per real second: 2.0 runs the engine twice as fast as the profile
    /// says. Positive and finite.
    pub speedup: f64,
    /// Most sequences per step (the batch limit), instead of the profile's: `max_batch` in
    /// a file (`max_num_seqs`, the engine's name, is read too).
    #[serde(rename = "max_batch", alias = "max_num_seqs")]
    pub max_num_seqs: Option<usize>,
    /// Most tokens per step, instead of the profile's: `max_batched_tokens` in a file
    /// (`max_num_batched_tokens` is read too).
    #[serde(rename = "max_batched_tokens", alias = "max_num_batched_tokens")]
    pub max_num_batched_tokens: Option<usize>,
    /// KV blocks, instead of what the profile's memory gives.
    pub num_gpu_blocks: Option<usize>,
    /// Blocks of a host tier (0: none): device blocks are written through to it and a
    /// prefix the device lost is loaded back from it, published as `CPU` events.
    pub host_blocks: usize,
    /// Seconds to load one token back from the host tier.
    pub host_load_secs_per_token: f64,
    /// How the engine takes waiting requests: `fcfs` (first come, first served) or
    /// `priority` (vLLM's `--scheduling-policy priority`: by the request's `priority`,
    /// lower first; a request with a non-zero `priority` is refused under `fcfs`, as vLLM
    /// refuses it).
    pub scheduling_policy: SchedulingPolicy,
    /// Most requests waiting in the engine, instead of the engine's default (100,000);
    /// beyond it requests get 503 with `Retry-After`.
    pub max_waiting: Option<usize>,
    /// Tokens generated when a request gives no `max_tokens`.
    pub default_max_tokens: u32,
    /// Largest request body, bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Largest prompt, tokens (413 beyond).
    pub max_prompt_tokens: usize,
    /// The ZMQ topic of KV event messages.
    pub topic: String,
    /// Which engine's wire form the KV events take: `vllm` (0.32), `sglang` (0.5.23) or
    /// `trtllm` (its ZMQ publisher).
    pub event_format: EventFormat,
    /// LoRA adapter names served besides the base model (listed at `/v1/models` with it as
    /// their parent): a request naming one is cached in the adapter's namespace.
    pub lora_adapters: Vec<String>,
    /// Events kept for TensorRT-LLM's pull API (`POST /kv_cache_events`, served with the
    /// `trtllm` format), its `event_buffer_max_size`: the oldest go beyond.
    pub pull_buffer: usize,
    /// Event batches kept for replay (vLLM's `buffer_steps`).
    pub replay_buffer: usize,
    /// The most bytes those batches may hold (their token ids and hashes, estimated): the
    /// oldest leave first, so long prompts cannot make the count bound a memory hog.
    pub replay_buffer_bytes: usize,
    /// The data-parallel rank this worker plays (stamped on its event batches, as an
    /// engine's rank R does; publish on the engine's port plus R).
    pub data_parallel_rank: u32,
    /// The worker's name in logs.
    pub worker_name: String,
    /// What it does in a disaggregated fleet: `both` (the default), `prefill` (it refuses
    /// decode legs, those sent a remote prefill's KV) or `decode` (it refuses prefill legs).
    pub role: kvroute_core::WorkerRole,
    /// Bytes per second of the modelled link a decode leg's KV comes over from its
    /// prefill worker (vLLM's `kv_transfer_params`; docs/disaggregation.md).
    pub kv_link_bytes_per_sec: f64,
    /// Seconds every such transfer takes beyond its bytes.
    pub kv_link_latency_secs: f64,
    /// Bytes of KV per prompt token moved (default: the profile's model's, when it names
    /// one; else an 8B model's 131,072).
    pub kv_bytes_per_token: Option<f64>,
    /// The key its OpenAI routes need (`Authorization: Bearer`), as an engine started with
    /// `--api-key` (None: open). Also from `KVROUTE_WORKER_API_KEY`.
    #[serde(skip_serializing)]
    pub api_key: Option<Secret>,
    /// The key its `/admin/*` routes need (None: served on a loopback listener only). Also
    /// from `KVROUTE_ADMIN_KEY`.
    #[serde(skip_serializing)]
    pub admin_key: Option<Secret>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            model: "kvroute-sim".into(),
            profile: "tiny-fast".into(),
            block_size: None,
            speedup: 1.0,
            max_num_seqs: None,
            max_num_batched_tokens: None,
            num_gpu_blocks: None,
            host_blocks: 0,
            host_load_secs_per_token: kvroute_engine::HOST_LOAD_SECS_PER_TOKEN,
            max_waiting: None,
            scheduling_policy: SchedulingPolicy::Fcfs,
            default_max_tokens: 64,
            max_body_bytes: 4 << 20,
            max_prompt_tokens: 131_072,
            topic: "kv-events".into(),
            event_format: EventFormat::Vllm,
            lora_adapters: Vec::new(),
            pull_buffer: 10_000,
            replay_buffer: 10_000,
            replay_buffer_bytes: 32 << 20,
            data_parallel_rank: 0,
            worker_name: "worker".into(),
            role: kvroute_core::WorkerRole::Both,
            kv_link_bytes_per_sec: 25e9,
            kv_link_latency_secs: 0.002,
            kv_bytes_per_token: None,
            api_key: None,
            admin_key: None,
        }
    }
}

impl WorkerConfig {
    /// Checks the settings, the profile and the engine settings they give.
    pub fn validate(&self) -> Result<(), WorkerError> {
        let bad = |m: String| Err(WorkerError::Config(m));
        if !(self.kv_link_bytes_per_sec.is_finite() && self.kv_link_bytes_per_sec > 0.0) {
            return bad(format!(
                "kv_link_bytes_per_sec must be > 0, got {}",
                self.kv_link_bytes_per_sec
            ));
        }
        if !(self.kv_link_latency_secs.is_finite()
            && (0.0..=60.0).contains(&self.kv_link_latency_secs))
        {
            return bad(format!(
                "kv_link_latency_secs must be within 0..=60, got {}",
                self.kv_link_latency_secs
            ));
        }
        if let Some(b) = self.kv_bytes_per_token {
            if !(b.is_finite() && b > 0.0) {
                return bad(format!("kv_bytes_per_token must be > 0, got {b}"));
            }
        }
        self.engine_config().map(|_| ())
    }

    /// Seconds to move one prompt token's KV to this worker.
    pub fn kv_secs_per_token(&self) -> f64 {
        let bytes = self.kv_bytes_per_token.unwrap_or_else(|| {
            Profile::builtin(&self.profile)
                .ok()
                .and_then(|p| p.roofline.map(|r| r.kv_bytes_per_token()))
                .unwrap_or(131_072.0)
        });
        bytes / self.kv_link_bytes_per_sec
    }

    /// The engine settings: the profile's, with this config's overrides, KV events carrying
    /// token ids (as engines publish them). Checked.
    pub fn engine_config(&self) -> Result<EngineConfig, WorkerError> {
        let bad = |m: &str| Err(WorkerError::Config(m.to_string()));
        if self.model.is_empty() {
            return bad("model must not be empty");
        }
        if !(self.speedup.is_finite() && self.speedup > 0.0) {
            return bad("speedup must be positive and finite");
        }
        if self.default_max_tokens == 0 {
            return bad("default_max_tokens must be at least 1");
        }
        if self.max_body_bytes == 0 || self.max_prompt_tokens == 0 {
            return bad("max_body_bytes and max_prompt_tokens must be at least 1");
        }
        if [&self.api_key, &self.admin_key]
            .into_iter()
            .flatten()
            .any(|k| !k.is_valid())
        {
            return bad("keys must be 1 to 4096 printable ASCII characters without spaces");
        }
        let overrides = [
            ("block_size", self.block_size),
            ("max_batch", self.max_num_seqs),
            ("max_batched_tokens", self.max_num_batched_tokens),
            ("num_gpu_blocks", self.num_gpu_blocks),
            ("max_waiting", self.max_waiting),
        ];
        if let Some((name, _)) = overrides.iter().find(|(_, v)| *v == Some(0)) {
            return Err(WorkerError::Config(format!("{name} must be at least 1")));
        }
        let profile = Profile::builtin(&self.profile)?;
        let block_size = self.block_size.unwrap_or(profile.block_size);
        let mut cfg = EngineConfig::from_profile_with_block_size(&profile, block_size);
        if let Some(n) = self.max_num_seqs {
            cfg.max_num_seqs = n;
        }
        if let Some(n) = self.max_num_batched_tokens {
            cfg.max_num_batched_tokens = n;
        }
        if let Some(n) = self.num_gpu_blocks {
            cfg.num_gpu_blocks = n;
        }
        if let Some(n) = self.max_waiting {
            cfg.max_waiting = n;
        }
        cfg.host_blocks = self.host_blocks;
        cfg.host_load_secs_per_token = self.host_load_secs_per_token;
        cfg.kv_events_with_tokens = true;
        cfg.priority_scheduling = self.scheduling_policy == SchedulingPolicy::Priority;
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_build_the_tiny_fast_engine() {
        let c = WorkerConfig::default();
        let e = c.engine_config().unwrap();
        assert_eq!((e.block_size, e.num_gpu_blocks), (16, 8192));
        assert!(e.kv_events_with_tokens);
    }

    #[test]
    fn overrides_apply_and_bad_values_are_refused() {
        let c = WorkerConfig {
            profile: "tiny".into(),
            block_size: Some(8),
            max_num_seqs: Some(3),
            num_gpu_blocks: Some(10),
            ..WorkerConfig::default()
        };
        let e = c.engine_config().unwrap();
        assert_eq!((e.block_size, e.max_num_seqs, e.num_gpu_blocks), (8, 3, 10));
        for bad in [
            WorkerConfig {
                speedup: 0.0,
                ..WorkerConfig::default()
            },
            WorkerConfig {
                speedup: f64::INFINITY,
                ..WorkerConfig::default()
            },
            WorkerConfig {
                profile: "nope".into(),
                ..WorkerConfig::default()
            },
            WorkerConfig {
                block_size: Some(0),
                ..WorkerConfig::default()
            },
            WorkerConfig {
                default_max_tokens: 0,
                ..WorkerConfig::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unknown_fields_are_refused_and_missing_ones_default() {
        let c: WorkerConfig = serde_json::from_str(r#"{"speedup": 4.0}"#).unwrap();
        assert_eq!((c.speedup, c.model.as_str()), (4.0, "kvroute-sim"));
        assert!(serde_json::from_str::<WorkerConfig>(r#"{"speed": 4.0}"#).is_err());
    }

    #[test]
    fn the_batch_limit_is_max_batch_and_the_engines_name_is_read_too() {
        for text in [
            r#"{"max_batch": 3, "max_batched_tokens": 64}"#,
            r#"{"max_num_seqs": 3, "max_num_batched_tokens": 64}"#,
        ] {
            let c: WorkerConfig = serde_json::from_str(text).unwrap();
            assert_eq!(
                (c.max_num_seqs, c.max_num_batched_tokens),
                (Some(3), Some(64))
            );
        }
        let out = serde_json::to_value(WorkerConfig {
            max_num_seqs: Some(3),
            ..WorkerConfig::default()
        })
        .unwrap();
        assert_eq!(out["max_batch"], 3);
    }
}
