//! The router's settings: one struct with its defaults, written once, and its checks.

use super::RouteError;
use crate::admission::AdmissionConfig;
use crate::index::ApproxConfig;
use crate::policy::PolicyConfig;
use crate::tiers::TierConfig;
use crate::types::BlockSize;
use serde::{Deserialize, Serialize};

/// Router settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    /// KV block size in tokens; must equal the engines'.
    pub block_size: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// The policy.
    pub policy: PolicyConfig,
    /// Admission.
    pub admission: AdmissionConfig,
    /// Approximate tracking (workers without KV events): how long and how much of what was
    /// routed to a worker is assumed cached.
    pub approx: ApproxConfig,
    /// What loading blocks back from offloaded tiers (host memory, disk) costs.
    pub tiers: TierConfig,
    /// Seconds the prompt blocks of a request dispatched to a worker tracked by events count
    /// as cached there before its events show them (0: off). Real engines publish a batch's
    /// events a little after they answer (vLLM on CPU: up to a few hundred ms under load), so
    /// a follow-up sent at once would otherwise miss what its previous turn just cached.
    pub pending_secs: f64,
    /// Soft preference for a session's previous worker: its cost is multiplied by
    /// `1 - affinity_bias` (0 = off, up to 1).
    pub affinity_bias: f64,
    /// Most sessions remembered for affinity.
    pub max_sessions: usize,
    /// Seconds a session is remembered after its last request.
    pub session_ttl_secs: f64,
    /// Most workers tracked.
    pub max_workers: usize,
    /// Most blocks tracked per worker in each tier's index: past it the oldest stored are
    /// dropped from the index (counted), so a worker that never reports removals, or
    /// reports far more than an engine can hold, cannot grow the index without bound.
    pub max_blocks_per_worker: usize,
    /// Most requests in flight.
    pub max_inflight: usize,
    /// With peer replicas sharing their bookings: how late their bookings arrive, in seconds
    /// (the plane's sync delay, its p99), and how long a replica holds the later requests of
    /// a burst (requests reaching it within that time of the burst's first), so that they
    /// are routed with the bookings its peers made for the same burst seen; replicas take
    /// turns by rank ([`Router::hold_until`](super::Router::hold_until)). Only requests whose
    /// choice is open are held ([`RouterConfig::peer_hold_max_cached`]). A router that has
    /// heard from no peer holds nothing. 0: off (every request routed at once, blind to its
    /// peers' choices of the last sync delay). Default [`DEFAULT_PEER_HOLD_SECS`].
    pub peer_hold_secs: f64,
    /// With the hold on: only a request whose choice is open is held, one whose deepest
    /// cached prefix on any worker covers less than this share of its prompt (a new prompt,
    /// placed by load, where simultaneous replicas herd). A request that finds more of its
    /// prompt cached goes at once and is no part of a burst. 1: every request may be held.
    /// Default [`DEFAULT_PEER_HOLD_MAX_CACHED`].
    pub peer_hold_max_cached: f64,
    /// Disaggregated prefill: whether and how requests use prefill workers, and what
    /// moving KV costs (`[router.disaggregation]`). Applies only where the caller runs a
    /// request's two legs ([`Router::set_split_prefill`](super::Router::set_split_prefill)).
    pub disaggregation: crate::policy::DisaggregationConfig,
}

/// The default of [`RouterConfig::peer_hold_secs`]: 10 ms, above the sync delay measured
/// over NATS here (p99 <= 6.4 ms; docs/scale-out.md). A held request waits at most one
/// round of turns (replicas x this).
pub const DEFAULT_PEER_HOLD_SECS: f64 = 0.010;

/// The default of [`RouterConfig::peer_hold_max_cached`]: requests finding less than 90%
/// of their prompt cached anywhere may be held. Measured (docs/scale-out.md): holding
/// every request of three demo gateways under steady multi-turn load raised TTFT p50 from
/// about 9 ms to 15-32 ms (most turns held, none placed better: their prefix decides);
/// holding only these held 6-10 of each gateway's 72 requests, TTFT p50 as with no hold;
/// in the simulator's bursts of the conversation trace three replicas keep 0.98 of one
/// router's goodput (0.99 holding every request, 0.95 holding below half cached).
pub const DEFAULT_PEER_HOLD_MAX_CACHED: f64 = 0.9;

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            seed: 0,
            policy: PolicyConfig::default(),
            admission: AdmissionConfig::default(),
            approx: ApproxConfig::default(),
            tiers: TierConfig::default(),
            pending_secs: 5.0,
            affinity_bias: 0.0,
            max_sessions: 65_536,
            session_ttl_secs: 600.0,
            max_workers: crate::index::DEFAULT_MAX_WORKERS,
            max_blocks_per_worker: crate::index::DEFAULT_MAX_BLOCKS_PER_WORKER,
            max_inflight: crate::ledger::DEFAULT_MAX_INFLIGHT,
            peer_hold_secs: DEFAULT_PEER_HOLD_SECS,
            peer_hold_max_cached: DEFAULT_PEER_HOLD_MAX_CACHED,
            disaggregation: crate::policy::DisaggregationConfig::default(),
        }
    }
}

impl RouterConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), RouteError> {
        let bad = RouteError::Config;
        BlockSize::new(self.block_size).map_err(|e| bad(e.to_string()))?;
        self.policy.validate().map_err(bad)?;
        self.admission.validate().map_err(bad)?;
        self.approx.validate().map_err(bad)?;
        self.tiers.validate().map_err(bad)?;
        self.disaggregation.validate().map_err(bad)?;
        if !(self.pending_secs.is_finite() && self.pending_secs >= 0.0) {
            return Err(bad(format!(
                "pending_secs must be >= 0, got {}",
                self.pending_secs
            )));
        }
        if !(0.0..=1.0).contains(&self.affinity_bias) {
            return Err(bad(format!(
                "affinity_bias must be within 0..=1, got {}",
                self.affinity_bias
            )));
        }
        if !(self.session_ttl_secs.is_finite() && self.session_ttl_secs > 0.0) {
            return Err(bad(format!(
                "session_ttl_secs must be > 0, got {}",
                self.session_ttl_secs
            )));
        }
        if !(self.peer_hold_secs.is_finite() && (0.0..=1.0).contains(&self.peer_hold_secs)) {
            return Err(bad(format!(
                "peer_hold_secs must be within 0..=1, got {}",
                self.peer_hold_secs
            )));
        }
        if !(0.0..=1.0).contains(&self.peer_hold_max_cached) {
            return Err(bad(format!(
                "peer_hold_max_cached must be within 0..=1, got {}",
                self.peer_hold_max_cached
            )));
        }
        if self.max_workers == 0 || self.max_inflight == 0 || self.max_blocks_per_worker == 0 {
            return Err(bad(
                "max_workers, max_blocks_per_worker and max_inflight must be > 0".into(),
            ));
        }
        Ok(())
    }
}
