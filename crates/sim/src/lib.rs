//! The fleet simulator: a workload, the routing core (the same `Router` the gateway uses)
//! and N simulated engines, in virtual time.
//!
//! A discrete-event loop: request arrivals (trace timestamps, or a closed loop that sends a
//! client's next request when its previous one finishes), engine steps (each engine says when
//! its next step ends), KV event deliveries (after a configurable delay, as over a network)
//! and queue timeouts. Deterministic for a seed: events at the same instant run in the order
//! they were scheduled. Produces per-request records and a summary, like a live benchmark.
//!
//! ```
//! use kvroute_sim::{simulate, SimConfig, Workload};
//! use kvroute_workload::{Synthetic, SyntheticConfig};
//!
//! let cfg = SimConfig::for_profile("tiny", 2)?;
//! let gen = Synthetic::new(SyntheticConfig { prefixes: 4, prefix_tokens: 64, suffix_tokens: 16,
//!     max_tokens: 8, ..SyntheticConfig::default() }, 1)?;
//! let result = simulate(&cfg, Workload::Synthetic { gen, concurrency: 4, requests: 40 })?;
//! assert_eq!(result.summary.completed, 40);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod driver;
mod replicas;
mod router_thread;
mod sim;
mod trace_prompts;

pub use driver::{TenantLoad, Workload};
pub use sim::simulate;

use kvroute_core::{RouteError, RouterConfig, Tracking, WorkerRole};
use kvroute_engine::{EngineConfig, EngineMetrics, Profile, ProfileError};
use kvroute_workload::{RequestRecord, Slo, Summary};
use serde::Serialize;
use std::time::Duration;

/// Simulator settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Engine replicas.
    pub workers: usize,
    /// Of them, engines that only prefill (the first ones): a request may have its prompt
    /// computed on one and its KV moved to the engine that decodes it, over the link of
    /// `router.disaggregation` (its bytes per token, bandwidth and latency are the
    /// simulated link's). 0: none.
    pub prefill_workers: usize,
    /// Of them, engines that only decode (after the prefill ones); the rest do both.
    pub decode_workers: usize,
    /// The router (policy, admission, seed). Its block size must equal the engines'.
    pub router: RouterConfig,
    /// Every engine's settings.
    pub engine: EngineConfig,
    /// Delay between an engine's KV event and the router seeing it.
    pub kv_event_delay: Duration,
    /// How the router learns what engines cache: from their KV events, or approximately
    /// (engines that publish no events; the router's own dispatches, TTL and cap).
    pub tracking: Tracking,
    /// Closed loops stop starting requests after this much virtual time.
    pub duration: Option<Duration>,
    /// Requests arriving before this much virtual time are left out of the summary (they
    /// still run and load the fleet).
    pub warmup: Duration,
    /// Closed-loop clients start one after another, evenly over this time (a load generator
    /// ramping up), instead of all at once.
    pub ramp: Duration,
    /// Virtual time after which the simulation stops, finished or not.
    pub max_sim_time: Duration,
    /// The service objective goodput is measured against, if any.
    pub slo: Option<Slo>,
    /// A closed-loop client whose request failed waits this long before its next one. Never
    /// zero: a fleet failing every request at once would otherwise loop forever at one
    /// instant of virtual time. A refused one waits the `Retry-After` the gateway sends for
    /// the reason (`RejectReason::retry_after_secs`), as the live load generator does.
    pub client_backoff: Duration,
    /// Router replicas in front of the fleet (gateways), each routing the conversations
    /// assigned to it round-robin (requests without a conversation by their number).
    pub replicas: usize,
    /// How late a replica's bookings reach the others (None: never; each counts only its
    /// own). Meaningless with one replica.
    pub replica_sync: Option<Duration>,
}

impl SimConfig {
    /// `workers` engines of a built-in profile, with the default router at its block size.
    pub fn for_profile(profile: &str, workers: usize) -> Result<Self, SimError> {
        let p = Profile::builtin(profile)?;
        let engine = EngineConfig::from_profile(&p);
        Ok(Self {
            workers,
            prefill_workers: 0,
            decode_workers: 0,
            router: RouterConfig {
                block_size: p.block_size,
                // The simulated engines' events reach the router the moment their cache
                // changes (or after `kv_event_delay`): nothing to bridge.
                pending_secs: 0.0,
                ..RouterConfig::default()
            },
            engine,
            kv_event_delay: Duration::ZERO,
            tracking: Tracking::Events,
            duration: None,
            warmup: Duration::ZERO,
            ramp: Duration::ZERO,
            max_sim_time: Duration::from_secs(7 * 24 * 3600),
            slo: None,
            client_backoff: Duration::from_millis(100),
            replicas: 1,
            replica_sync: Some(Duration::ZERO),
        })
    }

    /// What engine `w` does: the first `prefill_workers` prefill, the next
    /// `decode_workers` decode, the others both.
    pub fn role(&self, w: usize) -> WorkerRole {
        if w < self.prefill_workers {
            WorkerRole::Prefill
        } else if w < self.prefill_workers + self.decode_workers {
            WorkerRole::Decode
        } else {
            WorkerRole::Both
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.workers == 0 || self.workers > 4096 {
            return Err(SimError::Config(format!(
                "workers must be between 1 and 4096, got {}",
                self.workers
            )));
        }
        if self.prefill_workers + self.decode_workers > self.workers {
            return Err(SimError::Config(format!(
                "{} prefill and {} decode workers are more than the {} workers",
                self.prefill_workers, self.decode_workers, self.workers
            )));
        }
        if self.prefill_workers == self.workers {
            return Err(SimError::Config(
                "every worker prefills only: no worker would decode".into(),
            ));
        }
        if self.router.block_size != self.engine.block_size {
            return Err(SimError::Config(format!(
                "the router's block size {} differs from the engines' {}",
                self.router.block_size, self.engine.block_size
            )));
        }
        if self.replicas == 0 || self.replicas > 64 {
            return Err(SimError::Config(format!(
                "replicas must be between 1 and 64, got {}",
                self.replicas
            )));
        }
        if self.client_backoff.is_zero() {
            return Err(SimError::Config("client_backoff must be > 0".into()));
        }
        self.router.validate()?;
        self.engine
            .validate()
            .map_err(|e| SimError::Config(e.to_string()))
    }
}

/// Simulator errors.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Bad settings.
    #[error("simulator config: {0}")]
    Config(String),
    /// Unknown or bad profile.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// The router refused its settings.
    #[error(transparent)]
    Route(#[from] RouteError),
    /// The workload refused its settings.
    #[error("workload: {0}")]
    Workload(String),
}

/// What a simulation produced.
#[derive(Clone, Debug, Serialize)]
pub struct SimResult {
    /// One record per request sent, by request id.
    pub records: Vec<RequestRecord>,
    /// The summary over the records that arrived after the warm-up.
    pub summary: Summary,
    /// Virtual seconds from the first measured arrival to the last event.
    pub sim_seconds: f64,
    /// Each engine's metrics at the end.
    pub engines: Vec<EngineMetrics>,
    /// KV events the router rejected (should be 0: engines and router agree).
    pub kv_events_rejected: u64,
    /// Requests that entered the admission queue.
    pub queued: u64,
    /// Per engine tracked approximately, the blocks the first router's guesses are kept to
    /// at the end (learned from the engines' answers); None for engines tracked by events.
    pub approx_capacities: Vec<Option<usize>>,
    /// Per tenant of a [`Workload::Tenants`] load, in its order, the summary of its own
    /// measured requests against its class's objectives (empty for other loads).
    pub tenants: Vec<TenantResult>,
    /// Per class the tenants' requests resolve to (in the order the classes first appear
    /// among the tenants), the summary of all its measured requests against its objectives
    /// (empty for other loads).
    pub classes: Vec<ClassResult>,
}

/// One class's part of a run: every tenant's requests of that class together.
#[derive(Clone, Debug, Serialize)]
pub struct ClassResult {
    /// The class (as resolved: the default class's name for requests naming none).
    pub class: String,
    /// The tenants whose requests it holds.
    pub tenants: Vec<String>,
    /// Their requests' summary (goodput against the class's objectives).
    pub summary: Summary,
}

/// One tenant's part of a run.
#[derive(Clone, Debug, Serialize)]
pub struct TenantResult {
    /// Its tenant.
    pub tenant: String,
    /// Its class.
    pub class: String,
    /// Its requests' summary (goodput against its class's objectives).
    pub summary: Summary,
}
