//! `goodput`: the worker that keeps the most requests within both objectives (time to first
//! token and time per output token), then the one that adds the least time to them all.
//!
//! For each worker, from its learned figures (no weights to tune):
//! - the new request's time to first token, as `predictive` predicts it;
//! - the worker's decode step with and without the request ([`DecodeEstimate`]: batch and
//!   KV read, learned from the requests that finished there);
//! - what the request does to the requests running there: its prefill stalls each of them
//!   for its prefill time, and each of their remaining tokens (half a mean answer) takes the
//!   longer step.
//!
//! Predicted misses: the new request when its first token or its step breaks an objective
//! (its class's objectives where it has a class that sets them, its miss weighed by the
//! class's `miss_weight`);
//! the running requests when the step the request brings pushes theirs past the objective
//! (each weighed by its class's `miss_weight`, as the ledger books it);
//! at a worker at its batch limit, the next request to arrive there too, when its wait for
//! a running request to leave breaks the first-token objective (one more request there
//! lengthens that queue for every later one, the conversations that stay there included).
//! Cost, in seconds: the seconds added over every request concerned (the new one's time to
//! first token and decode, the running ones' delay), plus, per predicted miss, the new
//! request's own time there (a request that misses an objective is service given for nothing
//! in goodput). Before any request finished with a count, decode is assumed to take a step of
//! a quarter of the per-token objective, three quarters at the batch limit, so that load is
//! spread from the start.

use super::disaggregation::decode_tail_tokens;
use super::predictive::{batch_wait_secs, Predictive};
use super::{lowest_cost, Choice, Policy, PolicyInput, RemotePrefill};
use crate::ledger::DecodeEstimate;
use serde::{Deserialize, Serialize};

/// Output tokens assumed per request before any finished with a count.
const PRIOR_OUTPUT_TOKENS: f64 = 256.0;

/// Settings of the `goodput` policy: the objectives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GoodputConfig {
    /// Time-to-first-token objective in seconds.
    pub ttft_secs: f64,
    /// Time-per-output-token objective in seconds.
    pub tpot_secs: f64,
}

impl Default for GoodputConfig {
    fn default() -> Self {
        Self {
            ttft_secs: 0.6,
            tpot_secs: 0.06,
        }
    }
}

impl GoodputConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [("ttft_secs", self.ttft_secs), ("tpot_secs", self.tpot_secs)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("goodput {name} must be > 0, got {v}"));
            }
        }
        Ok(())
    }
}

/// The `goodput` policy.
#[derive(Clone, Debug, Default)]
pub struct Goodput {
    config: GoodputConfig,
    ttft: Predictive,
}

impl Goodput {
    /// A `goodput` policy with these objectives, first tokens predicted by `ttft`.
    pub fn new(config: GoodputConfig, ttft: Predictive) -> Self {
        Self { config, ttft }
    }

    /// The decode speed assumed before any request finished with a count: a step of a
    /// quarter of the objective, growing to three quarters at the batch limit (64 when
    /// unknown), so that load is spread from the start.
    fn prior(&self, input: &PolicyInput<'_>) -> DecodeEstimate {
        let batch = input
            .candidates
            .iter()
            .filter_map(|c| c.capacity.max_batch)
            .max()
            .unwrap_or(64)
            .max(1);
        DecodeEstimate {
            base_secs: 0.25 * self.config.tpot_secs,
            per_seq_secs: 0.5 * self.config.tpot_secs / f64::from(batch),
            per_ktoken_secs: 0.0,
            samples: 0,
        }
    }

    /// Predicted misses and seconds added per candidate (none while no decode speed is
    /// known anywhere: then only the time to first token counts).
    pub fn predict(&self, input: &PolicyInput<'_>) -> Vec<f64> {
        let ttft = self.ttft.predict(input);
        self.costs(input, &ttft, true)
    }

    /// [`Goodput::predict`] with the prompt computed on the prefill worker `remote` offers
    /// and its KV moved to each candidate: the first token after that prefill and the
    /// transfer of what the candidate lacks, and only the prompt's last tokens (computed on
    /// the candidate) stalling the requests running there.
    pub fn predict_remote(&self, input: &PolicyInput<'_>, remote: &RemotePrefill) -> Vec<f64> {
        let ttft: Vec<f64> = (0..input.candidates.len())
            .map(|i| remote.ttft_secs(input, i))
            .collect();
        self.costs(input, &ttft, false)
    }

    /// The costs of the candidates given each one's time to first token (`ttft`), the
    /// prompt computed on the candidate itself when `local_prefill`.
    fn costs(&self, input: &PolicyInput<'_>, ttft: &[f64], local_prefill: bool) -> Vec<f64> {
        let known: Vec<DecodeEstimate> = input.candidates.iter().filter_map(|c| c.decode).collect();
        let fleet = if known.is_empty() {
            self.prior(input)
        } else {
            let n = known.len() as f64;
            DecodeEstimate {
                base_secs: known.iter().map(|e| e.base_secs).sum::<f64>() / n,
                per_seq_secs: known.iter().map(|e| e.per_seq_secs).sum::<f64>() / n,
                per_ktoken_secs: known.iter().map(|e| e.per_ktoken_secs).sum::<f64>() / n,
                samples: 0,
            }
        };
        let outputs: Vec<f64> = input
            .candidates
            .iter()
            .filter_map(|c| c.output_tokens)
            .collect();
        let fleet_output = if outputs.is_empty() {
            PRIOR_OUTPUT_TOKENS
        } else {
            outputs.iter().sum::<f64>() / outputs.len() as f64
        };
        let prompt_tokens = input.prompt_tokens as f64;
        // This request's objectives are its class's where it sets them; the running
        // requests' are the policy's.
        let ttft_objective = input.class.ttft_secs.unwrap_or(self.config.ttft_secs);
        let tpot_objective = input.class.tpot_secs.unwrap_or(self.config.tpot_secs);
        let weight = input.class.miss_weight;
        input
            .candidates
            .iter()
            .zip(ttft.iter().copied())
            .map(|(c, ttft)| {
                let d = c.decode.unwrap_or(fleet);
                let output = c.output_tokens.unwrap_or(fleet_output).max(1.0);
                let running = f64::from(c.load.inflight);
                let kv = c.load.context_tokens as f64;
                let step_now = d.step_secs(running, kv);
                let step_with = d.step_secs(running + 1.0, kv + prompt_tokens);
                // Sent the KV, the worker still computes the prompt's last tokens.
                let work = match local_prefill {
                    true => input.prefill_work(c),
                    false => input.prefill_work(c).min(decode_tail_tokens(input) as f64),
                };
                let prefill_secs = c.prefill.map_or(0.0, |e| work * e.secs_per_token);
                // The running requests are halfway through their answers, on average.
                let remaining = (output / 2.0).max(1.0);
                let stalled_step = step_with + prefill_secs / remaining;
                let mut misses = 0.0;
                if ttft > ttft_objective || step_with > tpot_objective {
                    misses += weight;
                }
                if step_now <= self.config.tpot_secs && stalled_step > self.config.tpot_secs {
                    // Each weighed by its class's `miss_weight` (1 without classes).
                    misses += c.load.miss_weights;
                }
                // At the batch limit (this request waits), the next arrival waits behind it.
                let service = c.service_secs.unwrap_or(ttft + output * step_with);
                if batch_wait_secs(c, 0, service) > 0.0
                    && batch_wait_secs(c, 1, service) > self.config.ttft_secs
                {
                    misses += 1.0;
                }
                let added = ttft
                    + output * step_with
                    + running * (prefill_secs + remaining * (step_with - step_now));
                let own = ttft + output * step_with;
                misses * own + added
            })
            .collect()
    }
}

impl Policy for Goodput {
    fn name(&self) -> &'static str {
        "goodput"
    }

    fn select(&self, input: &PolicyInput<'_>) -> Choice {
        lowest_cost(input, self.predict(input))
    }

    fn price_remote(&self, input: &PolicyInput<'_>, remote: &RemotePrefill) -> Option<Vec<f64>> {
        Some(self.predict_remote(input, remote))
    }
}
