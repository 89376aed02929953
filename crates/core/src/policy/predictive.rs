//! `predictive`: the predicted time to first token, in seconds, lowest wins.
//!
//! For each worker: the time to work through the prefill already booked there plus this
//! request's uncached tokens and the time to load back its blocks in offloaded tiers
//! (expressed in prefill tokens, [`crate::tiers::TierConfig`]), at the prefill speed learned from that worker's own first-token
//! times ([`crate::ledger::PrefillFit`]); workers not yet measured borrow the fleet's mean
//! speed, or the configured prior when nobody was measured. Two physical penalties, both in
//! seconds and both from learned figures (no weights): at the batch limit the request waits
//! for a running one to leave (`excess / max_batch` of the worker's mean service time); when
//! the worker's KV blocks would overflow, the matched prefix is assumed evicted (recomputed)
//! and the request waits for the overflow fraction of a service time.

use super::{lowest_cost, Candidate, Choice, Policy, PolicyInput};
use crate::ledger::PrefillEstimate;
use serde::{Deserialize, Serialize};

/// Settings of the `predictive` policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PredictiveConfig {
    /// Prefill speed (tokens/s) assumed before any worker produced a first token.
    pub prior_tokens_per_sec: f64,
}

impl Default for PredictiveConfig {
    fn default() -> Self {
        Self {
            prior_tokens_per_sec: 10_000.0,
        }
    }
}

impl PredictiveConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.prior_tokens_per_sec.is_finite() && self.prior_tokens_per_sec > 0.0) {
            return Err(format!(
                "predictive prior_tokens_per_sec must be > 0, got {}",
                self.prior_tokens_per_sec
            ));
        }
        Ok(())
    }
}

/// The `predictive` policy.
#[derive(Clone, Debug, Default)]
pub struct Predictive {
    config: PredictiveConfig,
}

impl Predictive {
    /// A `predictive` policy with these settings (validated by the caller).
    pub fn new(config: PredictiveConfig) -> Self {
        Self { config }
    }

    /// The estimate for workers not measured yet.
    fn fallback(&self, candidates: &[Candidate]) -> PrefillEstimate {
        let known: Vec<&PrefillEstimate> = candidates
            .iter()
            .filter_map(|c| c.prefill.as_ref())
            .collect();
        if known.is_empty() {
            return PrefillEstimate {
                secs_per_token: 1.0 / self.config.prior_tokens_per_sec,
                overhead_secs: 0.0,
                samples: 0,
            };
        }
        let n = known.len() as f64;
        PrefillEstimate {
            secs_per_token: known.iter().map(|e| e.secs_per_token).sum::<f64>() / n,
            overhead_secs: known.iter().map(|e| e.overhead_secs).sum::<f64>() / n,
            samples: 0,
        }
    }

    /// Predicted seconds to first token on every candidate, before any affinity bias.
    pub fn predict(&self, input: &PolicyInput<'_>) -> Vec<f64> {
        let fallback = self.fallback(input.candidates);
        input
            .candidates
            .iter()
            .map(|c| {
                let est = c.prefill.unwrap_or(fallback);
                let uncached = input.prefill_work(c);
                let mut ttft = est.ttft_secs(c.load.prefill_tokens as f64 + uncached);
                let service = c.service_secs.unwrap_or_else(|| est.ttft_secs(uncached));
                ttft += batch_wait_secs(c, 0, service);
                if let Some(cap) = c.capacity.kv_blocks.filter(|c| *c > 0) {
                    // Loaded blocks take device blocks too.
                    let new = input.prompt_blocks().saturating_sub(c.matched_blocks) as u64;
                    let need = c.load.active_blocks + new;
                    if need > cap {
                        let matched = (c.matched_blocks * input.block_size) as f64;
                        ttft += matched * est.secs_per_token
                            + (need - cap) as f64 / cap as f64 * service;
                    }
                }
                ttft
            })
            .collect()
    }
}

/// Seconds a request waits at `c` for a place in its batch with `ahead` more requests
/// booked there first: each request past the batch limit waits for one running request to
/// leave, a `1 / max_batch` share of a mean service time (`service`).
pub(super) fn batch_wait_secs(c: &Candidate, ahead: u32, service: f64) -> f64 {
    match c.capacity.max_batch.filter(|m| *m > 0) {
        Some(max) if c.load.inflight + ahead >= max => {
            f64::from(c.load.inflight + ahead - max + 1) / f64::from(max) * service
        }
        _ => 0.0,
    }
}

impl Policy for Predictive {
    fn name(&self) -> &'static str {
        "predictive"
    }

    fn select(&self, input: &PolicyInput<'_>) -> Choice {
        lowest_cost(input, self.predict(input))
    }
}
