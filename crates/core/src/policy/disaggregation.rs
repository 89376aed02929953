//! Disaggregated prefill: whether a request's prompt is computed on a prefill worker and its
//! KV moved to the decode worker, or computed by the decode worker itself.
//!
//! The router offers the policy the best prefill worker for the prompt ([`RemotePrefill`]:
//! the predicted time until its prefill of this prompt ends, its booked prefill first, and
//! what moving the KV costs). Moving it costs, per decode worker, the tokens that worker
//! does not hold (it loads only those) over the link, plus a fixed latency
//! ([`DisaggregationConfig`]).
//!
//! `always` sends every request's prompt to a prefill worker when one is free; `never`
//! computes it on the decode worker. `auto` weighs both ways per request: `goodput` prices
//! each decode worker both ways with the same terms it prices a request by (time to first
//! token and decode, the stall a local prefill brings to the requests running there, misses
//! of either objective: [`super::Goodput::predict_remote`]) and takes the lowest of all;
//! every other policy chooses its worker as ever, which then computes the prompt itself
//! unless the remote way gives an earlier first token. A short or mostly cached prompt stays
//! local (its transfer and the prefill worker's queue cost more than computing it), and a
//! backed-up prefill pool is bypassed (its queue is in its predicted time).

use super::{Choice, PolicyInput};
use crate::types::WorkerId;
use serde::{Deserialize, Serialize};

/// How requests use prefill workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisaggregationMode {
    /// Per request, whichever way the policy predicts better (the default).
    #[default]
    Auto,
    /// Every request's prompt on a prefill worker when one can take it.
    Always,
    /// Every request served whole by its decode worker.
    Never,
}

impl DisaggregationMode {
    /// Every mode, in their order.
    pub const ALL: [DisaggregationMode; 3] = [Self::Auto, Self::Always, Self::Never];

    /// Its name in configuration and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Always => "always",
            Self::Never => "never",
        }
    }
}

impl std::str::FromStr for DisaggregationMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| format!("disaggregation {s:?} is not one of auto, always, never"))
    }
}

/// Settings of disaggregated prefill (`[router.disaggregation]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DisaggregationConfig {
    /// Whether requests use prefill workers: `auto`, `always`, `never`.
    pub mode: DisaggregationMode,
    /// Bytes of KV cache per prompt token (2 x layers x KV heads x head size x bytes per
    /// value: 131,072 for an 8B Llama in 16 bits, 327,680 for a 70B one).
    pub kv_bytes_per_token: f64,
    /// Bytes per second between a prefill and a decode worker.
    pub link_bytes_per_sec: f64,
    /// Seconds every transfer takes beyond its bytes (set-up, notification).
    pub link_latency_secs: f64,
}

impl Default for DisaggregationConfig {
    fn default() -> Self {
        Self {
            mode: DisaggregationMode::Auto,
            kv_bytes_per_token: 131_072.0,
            link_bytes_per_sec: 25e9,
            link_latency_secs: 0.002,
        }
    }
}

impl DisaggregationConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("kv_bytes_per_token", self.kv_bytes_per_token),
            ("link_bytes_per_sec", self.link_bytes_per_sec),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("disaggregation {name} must be > 0, got {v}"));
            }
        }
        if !(self.link_latency_secs.is_finite() && self.link_latency_secs >= 0.0) {
            return Err(format!(
                "disaggregation link_latency_secs must be >= 0, got {}",
                self.link_latency_secs
            ));
        }
        Ok(())
    }

    /// Seconds to move one token's KV.
    pub fn secs_per_token(&self) -> f64 {
        self.kv_bytes_per_token / self.link_bytes_per_sec
    }
}

/// The prefill worker offered for a request.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemotePrefill {
    /// The worker.
    pub worker: WorkerId,
    /// Leading prompt blocks it holds.
    pub matched_blocks: usize,
    /// Predicted seconds until its prefill of this prompt ends (its booked prefill first).
    pub prefill_secs: f64,
    /// Seconds to move one token's KV to a decode worker.
    pub transfer_secs_per_token: f64,
    /// Seconds every transfer takes beyond its bytes.
    pub transfer_latency_secs: f64,
}

impl RemotePrefill {
    /// Seconds to move the KV `input`'s candidate `i` lacks.
    pub fn transfer_secs(&self, input: &PolicyInput<'_>, i: usize) -> f64 {
        let missing = input.uncached_tokens(&input.candidates[i]) as f64;
        self.transfer_latency_secs + missing * self.transfer_secs_per_token
    }

    /// Predicted seconds to the first token on candidate `i` with the prompt computed here:
    /// the prefill, the transfer of what the candidate lacks, then the candidate's own way
    /// to a first token ([`joining_secs`]).
    pub fn ttft_secs(&self, input: &PolicyInput<'_>, i: usize) -> f64 {
        self.prefill_secs + self.transfer_secs(input, i) + joining_secs(input, i)
    }
}

/// Seconds from a request's KV arriving on candidate `i` to its first token there: the
/// engine's fixed time per request and the prefill booked there before it (its learned
/// figures: a step shared with that work computes the prompt's last tokens), and a place in
/// a full batch. 0 while the candidate's prefill speed is unknown.
pub fn joining_secs(input: &PolicyInput<'_>, i: usize) -> f64 {
    let c = &input.candidates[i];
    let Some(est) = c.prefill else {
        return 0.0;
    };
    let service = c.service_secs.unwrap_or(0.0);
    let work = c.load.prefill_tokens as f64 + decode_tail_tokens(input) as f64;
    est.ttft_secs(work) + super::predictive::batch_wait_secs(c, 0, service)
}

/// Seconds candidate `i` takes to compute the prompt itself (its learned prefill speed; 0
/// while unknown).
fn local_prefill_secs(input: &PolicyInput<'_>, i: usize) -> f64 {
    let c = &input.candidates[i];
    c.prefill
        .map_or(0.0, |e| input.prefill_work(c) * e.secs_per_token)
}

/// Tokens a decode worker still computes of a prompt whose KV it was sent: those after the
/// last full block before the prompt's last token (engines never take the last token's KV
/// as cached: it must be computed to sample the first token), 1 to a block.
pub fn decode_tail_tokens(input: &PolicyInput<'_>) -> usize {
    decode_tail(input.prompt_tokens, input.block_size)
}

/// [`decode_tail_tokens`] of a prompt of `prompt_tokens` in blocks of `block_size`.
pub fn decode_tail(prompt_tokens: usize, block_size: usize) -> usize {
    let bs = block_size.max(1);
    prompt_tokens - prompt_tokens.saturating_sub(1) / bs * bs
}

/// A policy's answer with disaggregation: the decode worker (index into the candidates) and
/// whether the prompt is computed on the prefill worker offered.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitChoice {
    /// The decode worker's index.
    pub chosen: usize,
    /// Its cost the way chosen, when the policy has costs.
    pub cost: Option<f64>,
    /// Its prompt is computed on the prefill worker offered.
    pub remote: bool,
    /// Per candidate, the cost with remote prefill, when priced (`goodput` in `auto`).
    pub remote_costs: Vec<Option<f64>>,
}

/// Chooses the decode worker and whether its prompt is computed on the prefill worker
/// `remote` offers (see the module's text). `local` is `policy`'s own choice, every
/// candidate computing the prompt itself; a policy that prices both ways
/// ([`super::Policy::price_remote`]) is asked for the remote way's costs; `local_ttft`, the
/// predicted first-token times of the candidates computing the prompt themselves (read only
/// by `auto` under a policy that does not).
pub fn split(
    mode: DisaggregationMode,
    input: &PolicyInput<'_>,
    remote: &RemotePrefill,
    local: &Choice,
    policy: &dyn super::Policy,
    local_ttft: impl FnOnce() -> Vec<f64>,
) -> SplitChoice {
    let n = input.candidates.len();
    let local_cost = local.costs.get(local.chosen).copied().flatten();
    let stay = |remote_costs: Vec<Option<f64>>| SplitChoice {
        chosen: local.chosen,
        cost: local_cost,
        remote: false,
        remote_costs,
    };
    let priced = policy
        .price_remote(input, remote)
        .map(|costs| super::lowest_cost(input, costs));
    let remote_costs = |p: &Option<Choice>| {
        p.as_ref()
            .map_or_else(|| vec![None; n], |c| c.costs.clone())
    };
    match mode {
        DisaggregationMode::Never => stay(vec![None; n]),
        DisaggregationMode::Always => match &priced {
            Some(c) => SplitChoice {
                chosen: c.chosen,
                cost: c.costs[c.chosen],
                remote: true,
                remote_costs: remote_costs(&priced),
            },
            None => SplitChoice {
                chosen: local.chosen,
                cost: local_cost,
                remote: true,
                remote_costs: vec![None; n],
            },
        },
        DisaggregationMode::Auto => match &priced {
            Some(c) => {
                let best_remote = c.costs[c.chosen].unwrap_or(f64::INFINITY);
                // Computed here, the prompt also holds up the next request to arrive at this
                // decoder (every request passes a decoder; on the remote way that prefill is
                // elsewhere).
                let best_local =
                    local_cost.unwrap_or(f64::INFINITY) + local_prefill_secs(input, local.chosen);
                if best_remote < best_local {
                    SplitChoice {
                        chosen: c.chosen,
                        cost: Some(best_remote),
                        remote: true,
                        remote_costs: remote_costs(&priced),
                    }
                } else {
                    stay(remote_costs(&priced))
                }
            }
            None => {
                let ttft = local_ttft();
                let here = ttft.get(local.chosen).copied().unwrap_or(f64::INFINITY);
                let there = remote.ttft_secs(input, local.chosen);
                SplitChoice {
                    remote: there < here,
                    ..stay(vec![None; n])
                }
            }
        },
    }
}
