//! `kv`: the Dynamo-compatible prefix-overlap cost, lowest wins.
//!
//! `cost = overlap_weight * prefill_tokens / block_size + decode_blocks`, where
//! `prefill_tokens = outstanding prefill + max(0, prompt - (matched + loadable blocks) *
//! block_size) + the prefill-equivalent of loading the loadable blocks back` and
//! `decode_blocks` = the active KV blocks already on the worker (plus, optionally, the blocks
//! the new request brings). Temperature 0 takes the argmin (ties: least cached data, then
//! seeded random); a positive temperature samples a softmax over range-normalised costs.

use super::{argmin_tiebreak, bias_affinity, Choice, Policy, PolicyInput};
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Settings of the `kv` policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvConfig {
    /// Weight of prefill blocks against decode blocks.
    pub overlap_weight: f64,
    /// Softmax temperature; 0 picks the lowest cost.
    pub temperature: f64,
    /// Also count the blocks the new request brings as decode load.
    pub count_new_blocks: bool,
}

impl Default for KvConfig {
    fn default() -> Self {
        Self {
            overlap_weight: 1.0,
            temperature: 0.0,
            count_new_blocks: false,
        }
    }
}

impl KvConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.overlap_weight.is_finite() && self.overlap_weight >= 0.0) {
            return Err(format!(
                "kv overlap_weight must be >= 0, got {}",
                self.overlap_weight
            ));
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(format!(
                "kv temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        Ok(())
    }
}

/// The `kv` policy.
#[derive(Clone, Debug, Default)]
pub struct KvCost {
    config: KvConfig,
}

impl KvCost {
    /// A `kv` policy with these settings (validated by the caller).
    pub fn new(config: KvConfig) -> Self {
        Self { config }
    }

    /// The cost of every candidate, before any affinity bias.
    pub fn costs(&self, input: &PolicyInput<'_>) -> Vec<f64> {
        let bs = input.block_size as f64;
        input
            .candidates
            .iter()
            .map(|c| {
                let prefill = c.load.prefill_tokens as f64 + input.prefill_work(c);
                let mut decode = c.load.active_blocks as f64;
                if self.config.count_new_blocks {
                    decode += input.prompt_blocks().saturating_sub(c.matched_blocks) as f64;
                }
                self.config.overlap_weight * prefill / bs + decode
            })
            .collect()
    }
}

impl Policy for KvCost {
    fn name(&self) -> &'static str {
        "kv"
    }

    fn select(&self, input: &PolicyInput<'_>) -> Choice {
        let mut costs = self.costs(input);
        bias_affinity(input, &mut costs);
        let chosen = if self.config.temperature > 0.0 {
            softmax_pick(input, &costs, self.config.temperature)
        } else {
            argmin_tiebreak(input, &costs)
        };
        Choice {
            chosen,
            costs: costs.into_iter().map(Some).collect(),
        }
    }
}

/// Samples `i` with probability proportional to `exp(-normalised_cost_i / temperature)`,
/// costs normalised to 0..=1 over their range.
fn softmax_pick(input: &PolicyInput<'_>, costs: &[f64], temperature: f64) -> usize {
    let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = costs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let range = max - min;
    let weights: Vec<f64> = costs
        .iter()
        .map(|c| {
            let norm = if range > 0.0 { (c - min) / range } else { 0.0 };
            (-norm / temperature).exp()
        })
        .collect();
    let total: f64 = weights.iter().sum();
    let mut r = input.rng().gen_range(0.0..total);
    for (i, w) in weights.iter().enumerate() {
        if r < *w {
            return i;
        }
        r -= w;
    }
    weights.len() - 1
}
