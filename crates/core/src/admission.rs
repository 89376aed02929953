//! Admission: when is a worker busy, and what happens to a request when every worker is.
//!
//! A worker is *busy* when its outstanding prefill tokens or its active KV blocks pass a
//! threshold (absolute, or as a fraction of its KV capacity when that is known). When some
//! workers are busy the policy only chooses among the others; when all are, the mode decides:
//! `queue` holds the request in the gateway (up to a wait and a queued-token budget), `shed`
//! rejects at once, `none` dispatches anyway. Every rejection carries a reason code. The
//! queue itself, one for the simulator and the gateway, is [`queue::AdmissionQueue`].

pub mod queue;

use crate::flow::FlowConfig;
use crate::ledger::{WorkerCapacity, WorkerLoad};
use serde::{Deserialize, Serialize};

/// What to do with a request when every worker is busy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdmissionMode {
    /// Hold it until a worker is free, within the queue limits.
    #[default]
    Queue,
    /// Reject it at once.
    Shed,
    /// Dispatch it anyway.
    None,
}

impl std::str::FromStr for AdmissionMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "queue" => Ok(Self::Queue),
            "shed" => Ok(Self::Shed),
            "none" => Ok(Self::None),
            other => Err(format!(
                "unknown admission mode {other:?} (expected queue, shed or none)"
            )),
        }
    }
}

/// Admission settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// What happens when every worker is busy.
    pub mode: AdmissionMode,
    /// Busy at this many outstanding prefill tokens.
    pub busy_prefill_tokens: Option<u64>,
    /// Busy when outstanding prefill tokens reach this fraction of the KV capacity in tokens.
    pub busy_prefill_fraction: Option<f64>,
    /// Busy at this many active KV blocks.
    pub busy_active_blocks: Option<u64>,
    /// Busy when active KV blocks reach this fraction of the KV capacity.
    pub busy_active_fraction: Option<f64>,
    /// Busy when in-flight requests reach this fraction of the worker's batch limit
    /// (`max_num_seqs`, when known): past it, a request would only wait in the engine's own
    /// queue, tied to that worker.
    pub busy_batch_fraction: Option<f64>,
    /// Longest time a request may wait in the queue, in seconds.
    pub max_queue_wait_secs: f64,
    /// Most requests in the queue.
    pub max_queued_requests: usize,
    /// Most prompt tokens in the queue.
    pub max_queued_tokens: u64,
    /// Tenants and classes: the queue's order, the tenants' limits (`docs/flow-control.md`).
    pub flow: FlowConfig,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            mode: AdmissionMode::Queue,
            busy_prefill_tokens: None,
            busy_prefill_fraction: None,
            busy_active_blocks: None,
            busy_active_fraction: Some(0.95),
            busy_batch_fraction: Some(1.0),
            max_queue_wait_secs: 30.0,
            max_queued_requests: 4_096,
            max_queued_tokens: 16 << 20,
            flow: FlowConfig::default(),
        }
    }
}

impl AdmissionConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        for (name, f) in [
            ("busy_prefill_fraction", self.busy_prefill_fraction),
            ("busy_active_fraction", self.busy_active_fraction),
            ("busy_batch_fraction", self.busy_batch_fraction),
        ] {
            if let Some(f) = f {
                if !(f.is_finite() && f > 0.0) {
                    return Err(format!("admission {name} must be > 0, got {f}"));
                }
            }
        }
        // At most a week: the wait becomes a deadline.
        if !(self.max_queue_wait_secs.is_finite()
            && (0.0..=604_800.0).contains(&self.max_queue_wait_secs))
        {
            return Err(format!(
                "admission max_queue_wait_secs must be within 0..=604800, got {}",
                self.max_queue_wait_secs
            ));
        }
        self.flow.validate()
    }

    /// Whether a worker with this load and capacity is busy.
    pub fn is_busy(&self, load: &WorkerLoad, capacity: &WorkerCapacity, block_size: usize) -> bool {
        let over = |v: u64, limit: Option<u64>| limit.is_some_and(|l| v >= l);
        let over_frac = |v: u64, frac: Option<f64>, cap: Option<u64>| match (frac, cap) {
            (Some(f), Some(c)) => v as f64 >= f * c as f64,
            _ => false,
        };
        let kv_tokens = capacity
            .kv_blocks
            .map(|b| b.saturating_mul(block_size as u64));
        let batch = capacity.max_batch.map(u64::from);
        over_frac(u64::from(load.inflight), self.busy_batch_fraction, batch)
            || over(load.prefill_tokens, self.busy_prefill_tokens)
            || over(load.active_blocks, self.busy_active_blocks)
            || over_frac(load.prefill_tokens, self.busy_prefill_fraction, kv_tokens)
            || over_frac(
                load.active_blocks,
                self.busy_active_fraction,
                capacity.kv_blocks,
            )
    }

    /// The decision for a request when `free_workers` of `workers` are not busy, given the
    /// queue the gateway holds now (not counting this request).
    pub fn decide(
        &self,
        workers: usize,
        free_workers: usize,
        queue: QueueState,
        prompt_tokens: usize,
    ) -> AdmissionDecision {
        if workers == 0 {
            return AdmissionDecision::Reject(RejectReason::NoWorkers);
        }
        if free_workers > 0 || self.mode == AdmissionMode::None {
            return AdmissionDecision::Dispatch;
        }
        match self.mode {
            AdmissionMode::Shed => AdmissionDecision::Reject(RejectReason::AllWorkersBusy),
            _ if !self.queue_has_room(queue, prompt_tokens as u64) => {
                AdmissionDecision::Reject(RejectReason::QueueFull)
            }
            _ => AdmissionDecision::Queue,
        }
    }

    /// Whether a queue of `queue` has room for one more request of `tokens` prompt tokens.
    pub fn queue_has_room(&self, queue: QueueState, tokens: u64) -> bool {
        queue.requests < self.max_queued_requests
            && queue.tokens.saturating_add(tokens) <= self.max_queued_tokens
    }
}

/// The gateway's queue as admission sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    /// Requests queued.
    pub requests: usize,
    /// Prompt tokens queued.
    pub tokens: u64,
}

/// What admission decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdmissionDecision {
    /// Route and dispatch now.
    Dispatch,
    /// Hold until a worker is free.
    Queue,
    /// Answer 503 with this reason.
    Reject(RejectReason),
}

/// Why a request was rejected (the code in the error body and the metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// No worker is registered.
    NoWorkers,
    /// Every worker is busy and the mode is `shed`.
    AllWorkersBusy,
    /// The queue is at its request or token limit.
    QueueFull,
    /// The request waited in the queue longer than allowed.
    QueueTimeout,
    /// The request waited in the queue until its TTFT objective passed.
    Deadline,
    /// The request was queued, and a request of a higher band took its place in a full
    /// queue.
    Shed,
    /// The request's tenant is over its concurrency or token limit (429, not overload).
    TenantLimit,
    /// The request was predicted to miss its TTFT objective on every eligible worker, and
    /// its class refuses such requests at once.
    PredictedMiss,
}

impl RejectReason {
    /// Every reason (for metrics that show each one from the start).
    pub const ALL: [RejectReason; 8] = [
        RejectReason::NoWorkers,
        RejectReason::AllWorkersBusy,
        RejectReason::QueueFull,
        RejectReason::QueueTimeout,
        RejectReason::Deadline,
        RejectReason::Shed,
        RejectReason::TenantLimit,
        RejectReason::PredictedMiss,
    ];

    /// The stable reason code.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::NoWorkers => "no_workers",
            RejectReason::AllWorkersBusy => "all_workers_busy",
            RejectReason::QueueFull => "queue_full",
            RejectReason::QueueTimeout => "queue_timeout",
            RejectReason::Deadline => "deadline",
            RejectReason::Shed => "shed",
            RejectReason::TenantLimit => "tenant_limit",
            RejectReason::PredictedMiss => "predicted_miss",
        }
    }

    /// Whether it is the caller's own limit (HTTP 429) rather than the fleet's overload
    /// (503).
    pub fn is_caller_limit(self) -> bool {
        self == RejectReason::TenantLimit
    }

    /// Seconds a refused client is asked to wait before it comes back (the gateway's
    /// `Retry-After`; the simulator's clients wait as long) when the refusal computes no
    /// wait of its own (a tenant's bucket, a predicted drain): longer when no worker is
    /// there at all than when they are only busy.
    pub fn retry_after_secs(self) -> u64 {
        match self {
            RejectReason::NoWorkers => 5,
            _ => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(prefill: u64, blocks: u64) -> WorkerLoad {
        WorkerLoad {
            prefill_tokens: prefill,
            active_blocks: blocks,
            ..WorkerLoad::default()
        }
    }

    #[test]
    fn busy_thresholds_absolute_and_fractional() {
        let cap = WorkerCapacity {
            kv_blocks: Some(1_000),
            max_batch: None,
        };
        let cfg = AdmissionConfig {
            busy_prefill_tokens: Some(8_192),
            busy_active_fraction: Some(0.9),
            ..AdmissionConfig::default()
        };
        assert!(!cfg.is_busy(&load(8_191, 899), &cap, 16));
        assert!(cfg.is_busy(&load(8_192, 0), &cap, 16));
        assert!(cfg.is_busy(&load(0, 900), &cap, 16));
        // Fractions need a known capacity.
        assert!(!cfg.is_busy(&load(0, 1_000_000), &WorkerCapacity::default(), 16));
        let frac = AdmissionConfig {
            busy_prefill_fraction: Some(0.5),
            busy_active_fraction: None,
            ..AdmissionConfig::default()
        };
        assert!(!frac.is_busy(&load(7_999, 0), &cap, 16));
        assert!(frac.is_busy(&load(8_000, 0), &cap, 16));
        let abs = AdmissionConfig {
            busy_active_blocks: Some(10),
            ..AdmissionConfig::default()
        };
        assert!(abs.is_busy(&load(0, 10), &WorkerCapacity::default(), 16));
    }

    #[test]
    fn a_full_batch_makes_a_worker_busy() {
        let cap = WorkerCapacity {
            kv_blocks: None,
            max_batch: Some(64),
        };
        let with = |inflight| WorkerLoad {
            inflight,
            ..WorkerLoad::default()
        };
        let cfg = AdmissionConfig::default();
        assert!(!cfg.is_busy(&with(63), &cap, 16));
        assert!(cfg.is_busy(&with(64), &cap, 16));
        assert!(
            !cfg.is_busy(&with(1_000), &WorkerCapacity::default(), 16),
            "unknown batch"
        );
        let off = AdmissionConfig {
            busy_batch_fraction: None,
            ..AdmissionConfig::default()
        };
        assert!(!off.is_busy(&with(64), &cap, 16));
    }

    #[test]
    fn decisions_per_mode() {
        let q = QueueState::default();
        for mode in [
            AdmissionMode::Queue,
            AdmissionMode::Shed,
            AdmissionMode::None,
        ] {
            let cfg = AdmissionConfig {
                mode,
                ..AdmissionConfig::default()
            };
            assert_eq!(
                cfg.decide(0, 0, q, 1),
                AdmissionDecision::Reject(RejectReason::NoWorkers)
            );
            assert_eq!(cfg.decide(3, 1, q, 1), AdmissionDecision::Dispatch);
        }
        let shed = AdmissionConfig {
            mode: AdmissionMode::Shed,
            ..AdmissionConfig::default()
        };
        assert_eq!(
            shed.decide(3, 0, q, 1),
            AdmissionDecision::Reject(RejectReason::AllWorkersBusy)
        );
        let none = AdmissionConfig {
            mode: AdmissionMode::None,
            ..AdmissionConfig::default()
        };
        assert_eq!(none.decide(3, 0, q, 1), AdmissionDecision::Dispatch);
        let queue = AdmissionConfig {
            max_queued_requests: 2,
            max_queued_tokens: 100,
            ..AdmissionConfig::default()
        };
        assert_eq!(queue.decide(3, 0, q, 100), AdmissionDecision::Queue);
        let one = QueueState {
            requests: 1,
            tokens: 50,
        };
        assert_eq!(
            queue.decide(3, 0, one, 51),
            AdmissionDecision::Reject(RejectReason::QueueFull)
        );
        let two = QueueState {
            requests: 2,
            tokens: 0,
        };
        assert_eq!(
            queue.decide(3, 0, two, 1),
            AdmissionDecision::Reject(RejectReason::QueueFull)
        );
    }

    #[test]
    fn validation_and_modes() {
        let cfg = AdmissionConfig {
            max_queue_wait_secs: 2.0,
            ..AdmissionConfig::default()
        };
        assert!(cfg.validate().is_ok());
        let bad = AdmissionConfig {
            busy_active_fraction: Some(-1.0),
            ..AdmissionConfig::default()
        };
        assert!(bad.validate().is_err());
        assert_eq!("shed".parse::<AdmissionMode>(), Ok(AdmissionMode::Shed));
        assert!("drop".parse::<AdmissionMode>().is_err());
    }
}
