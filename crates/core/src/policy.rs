//! Routing policies behind one trait.
//!
//! A policy sees the same inputs whatever it is: the request (length, block count, the
//! decision number and seed that make it deterministic) and one [`Candidate`] per eligible
//! worker (matched prefix blocks, cached blocks, booked load, capacity, learned prefill
//! speed). It returns the chosen candidate and, where it has one, a cost per candidate
//! (lower is better). Selection has no side effects: randomness comes from
//! `(seed, decision number)`, and the caller books the choice afterwards.

mod baseline;
mod disaggregation;
mod goodput;
mod kv;
mod predictive;

pub use baseline::{LeastLoaded, PowerOfTwo, RandomChoice, RoundRobin};
pub use disaggregation::{
    decode_tail, decode_tail_tokens, joining_secs, split, DisaggregationConfig, DisaggregationMode,
    RemotePrefill, SplitChoice,
};
pub use goodput::{Goodput, GoodputConfig};
pub use kv::{KvConfig, KvCost};
pub use predictive::{Predictive, PredictiveConfig};

use crate::ledger::{DecodeEstimate, PrefillEstimate, WorkerCapacity, WorkerLoad};
use crate::tiers::{Loadable, TierConfig};
use crate::types::WorkerId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// One eligible worker as a policy sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The worker.
    pub worker: WorkerId,
    /// Leading prompt blocks the worker holds.
    pub matched_blocks: usize,
    /// Prompt blocks after those it can load back from offloaded tiers.
    #[serde(default)]
    pub loadable: Loadable,
    /// All blocks the index holds for the worker (tie-break: less cached data wins).
    pub cached_blocks: usize,
    /// The most blocks its cache holds, when known: the engine's KV blocks, or for a worker
    /// without KV events the size learned from its answers. Ties then go to the least full
    /// cache rather than the one holding fewest blocks, so a smaller cache is not picked for
    /// every new prefix (it would evict its own at each).
    #[serde(default)]
    pub cache_blocks: Option<usize>,
    /// Booked load.
    pub load: WorkerLoad,
    /// Known capacity.
    pub capacity: WorkerCapacity,
    /// Learned prefill speed, when the worker produced a first token.
    pub prefill: Option<PrefillEstimate>,
    /// Mean dispatch-to-finish seconds, when a request finished there.
    pub service_secs: Option<f64>,
    /// Learned decode speed, when requests finished there with their token counts.
    #[serde(default)]
    pub decode: Option<DecodeEstimate>,
    /// Mean output tokens of the requests that finished there.
    #[serde(default)]
    pub output_tokens: Option<f64>,
}

/// The request as a policy sees it.
#[derive(Clone, Copy, Debug)]
pub struct PolicyInput<'a> {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Eligible workers, sorted by id, never empty.
    pub candidates: &'a [Candidate],
    /// Decisions dispatched before this one (round-robin position, random stream).
    pub decision: u64,
    /// The router's seed.
    pub seed: u64,
    /// The worker this request's session last went to, if any.
    pub affinity: Option<WorkerId>,
    /// Soft preference for `affinity`: its cost is multiplied by `1 - affinity_bias`.
    pub affinity_bias: f64,
    /// What loading offloaded blocks back costs.
    pub tiers: TierConfig,
    /// The request's class's objectives and the weight of its own miss (`goodput`).
    pub class: ClassNeeds,
}

/// What a request's class asks of the policy (`router.admission.flow`'s classes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClassNeeds {
    /// Its TTFT objective (unset: the policy's own).
    pub ttft_secs: Option<f64>,
    /// Its TPOT objective (unset: the policy's own).
    pub tpot_secs: Option<f64>,
    /// How much its own predicted miss weighs (1: as any request's).
    pub miss_weight: f64,
}

impl Default for ClassNeeds {
    fn default() -> Self {
        Self {
            ttft_secs: None,
            tpot_secs: None,
            miss_weight: 1.0,
        }
    }
}

impl PolicyInput<'_> {
    /// The deterministic random stream of this decision.
    pub fn rng(&self) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(self.decision);
        rng
    }

    /// Prompt tokens the candidate must compute (neither in its matched prefix nor loadable
    /// from an offloaded tier).
    pub fn uncached_tokens(&self, c: &Candidate) -> usize {
        let reused = c.matched_blocks.saturating_add(c.loadable.blocks());
        self.prompt_tokens
            .saturating_sub(reused.saturating_mul(self.block_size))
    }

    /// The candidate's prefill work for this prompt in tokens: those it computes, plus the
    /// prefill-equivalent of those it loads back ([`TierConfig::load_tokens`]).
    pub fn prefill_work(&self, c: &Candidate) -> f64 {
        self.uncached_tokens(c) as f64 + self.tiers.load_tokens(c.loadable, self.block_size)
    }

    /// Blocks the prompt occupies, partial tail included.
    pub fn prompt_blocks(&self) -> usize {
        self.prompt_tokens.div_ceil(self.block_size)
    }
}

/// A policy's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// Index of the chosen candidate.
    pub chosen: usize,
    /// Cost per candidate, when the policy computes one (lower is better).
    pub costs: Vec<Option<f64>>,
}

/// A routing policy.
pub trait Policy: Send + Sync {
    /// The policy's name.
    fn name(&self) -> &'static str;
    /// Chooses a candidate. `input.candidates` is never empty.
    fn select(&self, input: &PolicyInput<'_>) -> Choice;
    /// The cost of every candidate decoding with its prompt computed on the prefill worker
    /// `remote` offers, on the scale of [`Policy::select`]'s costs, for a policy that prices
    /// both ways (`goodput`); None for the others.
    fn price_remote(&self, _input: &PolicyInput<'_>, _remote: &RemotePrefill) -> Option<Vec<f64>> {
        None
    }
}

/// The policies by name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Cycle through workers.
    RoundRobin,
    /// Uniformly random worker.
    Random,
    /// Fewest in-flight requests.
    LeastLoaded,
    /// Less loaded of two random workers.
    PowerOfTwo,
    /// Dynamo-compatible prefix-overlap cost.
    Kv,
    /// Predicted time to first token.
    Predictive,
    /// Most requests within both objectives (first token and per-token time), then the
    /// least time added.
    #[default]
    Goodput,
}

impl PolicyKind {
    /// Every policy, in a fixed order.
    pub const ALL: [PolicyKind; 7] = [
        PolicyKind::RoundRobin,
        PolicyKind::Random,
        PolicyKind::LeastLoaded,
        PolicyKind::PowerOfTwo,
        PolicyKind::Kv,
        PolicyKind::Predictive,
        PolicyKind::Goodput,
    ];

    /// The policy's name.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::RoundRobin => "round_robin",
            PolicyKind::Random => "random",
            PolicyKind::LeastLoaded => "least_loaded",
            PolicyKind::PowerOfTwo => "power_of_two",
            PolicyKind::Kv => "kv",
            PolicyKind::Predictive => "predictive",
            PolicyKind::Goodput => "goodput",
        }
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|k| k.as_str()).collect();
                format!(
                    "unknown policy {s:?} (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// Policy settings: which one, and the knobs of those that have any.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// The policy.
    pub kind: PolicyKind,
    /// Settings of `kv`.
    pub kv: KvConfig,
    /// Settings of `predictive` (and of `goodput`'s first-token predictions).
    pub predictive: PredictiveConfig,
    /// Settings of `goodput`: its objectives.
    pub goodput: GoodputConfig,
}

impl PolicyConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        self.kv.validate()?;
        self.predictive.validate()?;
        self.goodput.validate()
    }

    /// Builds the configured policy.
    pub fn build(&self) -> Box<dyn Policy> {
        match self.kind {
            PolicyKind::RoundRobin => Box::new(RoundRobin),
            PolicyKind::Random => Box::new(RandomChoice),
            PolicyKind::LeastLoaded => Box::new(LeastLoaded),
            PolicyKind::PowerOfTwo => Box::new(PowerOfTwo),
            PolicyKind::Kv => Box::new(KvCost::new(self.kv.clone())),
            PolicyKind::Predictive => Box::new(Predictive::new(self.predictive.clone())),
            PolicyKind::Goodput => Box::new(Goodput::new(
                self.goodput.clone(),
                Predictive::new(self.predictive.clone()),
            )),
        }
    }
}

/// Applies the session-affinity bias to a cost vector in place.
fn bias_affinity(input: &PolicyInput<'_>, costs: &mut [f64]) {
    let Some(a) = input.affinity else { return };
    if input.affinity_bias <= 0.0 {
        return;
    }
    if let Some(i) = input.candidates.iter().position(|c| c.worker == a) {
        costs[i] *= 1.0 - input.affinity_bias.min(1.0);
    }
}

/// The choice of the lowest of `costs` after the affinity bias (the cost policies' `select`).
fn lowest_cost(input: &PolicyInput<'_>, mut costs: Vec<f64>) -> Choice {
    bias_affinity(input, &mut costs);
    let chosen = argmin_tiebreak(input, &costs);
    Choice {
        chosen,
        costs: costs.into_iter().map(Some).collect(),
    }
}

/// The lowest cost; ties (within a relative 1e-9) go to the candidate with the least full
/// cache (see [`Candidate::cache_blocks`]), then to a seeded random pick.
fn argmin_tiebreak(input: &PolicyInput<'_>, costs: &[f64]) -> usize {
    let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
    let tol = 1e-9 * min.abs().max(1.0);
    let tied: Vec<usize> = (0..costs.len())
        .filter(|&i| costs[i] <= min + tol)
        .collect();
    if tied.len() <= 1 {
        return tied.first().copied().unwrap_or(0);
    }
    // How full each tied cache is: its share of its size when every tied worker's size is
    // known, else its blocks.
    let sized = tied
        .iter()
        .all(|&i| input.candidates[i].cache_blocks.is_some_and(|b| b > 0));
    let fill = |i: usize| {
        let c = &input.candidates[i];
        match c.cache_blocks {
            Some(size) if sized => c.cached_blocks as f64 / size as f64,
            _ => c.cached_blocks as f64,
        }
    };
    let least = tied.iter().map(|&i| fill(i)).fold(f64::INFINITY, f64::min);
    let tied: Vec<usize> = tied.into_iter().filter(|&i| fill(i) == least).collect();
    if tied.len() == 1 {
        return tied[0];
    }
    tied[input.rng().gen_range(0..tied.len())]
}

#[cfg(test)]
mod tests;
