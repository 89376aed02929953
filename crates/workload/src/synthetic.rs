//! Synthetic shared-prefix workload: `P` prefixes of `Lp` tokens (think system prompts or
//! documents), each request one of them chosen by Zipf popularity, followed by a unique
//! suffix of `Ls` tokens.
//!
//! [`Synthetic::next_request`] gives plain requests for a closed loop;
//! [`Synthetic::open_loop`] wraps the generator in an endless iterator of requests with
//! Poisson arrivals at a fixed rate. The prefix choice and the arrival gaps use separate
//! random streams, so request `i` is the same in both modes for a seed.

use crate::arrivals::PoissonArrivals;
use crate::prompt::{extend_tokens, mix_key, Prompt};
use kvroute_core::{RequestId, Time};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

const PREFIX_TAG: u64 = 0x7072_6566_6978_6573; // "prefixes"
const SUFFIX_TAG: u64 = 0x7375_6666_6978_6573; // "suffixes"
const CHOICE_TAG: u64 = 0x6368_6f69_6365_7321; // "choices!"
const ARRIVAL_TAG: u64 = 0x6172_7269_7661_6c73; // "arrivals"

/// Largest prefix or suffix, in tokens.
pub const MAX_PART_TOKENS: usize = 1_000_000;
/// Largest prefix pool, in tokens over all prefixes.
pub const MAX_POOL_TOKENS: usize = 100_000_000;

/// Settings of the shared-prefix workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SyntheticConfig {
    /// Number of distinct prefixes (P).
    pub prefixes: usize,
    /// Tokens per prefix (Lp).
    pub prefix_tokens: usize,
    /// Tokens of each request's unique suffix (Ls).
    pub suffix_tokens: usize,
    /// Zipf exponent of prefix popularity: prefix `k` (from 0) has weight `1 / (k + 1)^s`;
    /// 0 is uniform.
    pub zipf_s: f64,
    /// Output tokens per request.
    pub max_tokens: u32,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        Self {
            prefixes: 16,
            prefix_tokens: 2_048,
            suffix_tokens: 256,
            zipf_s: 1.0,
            max_tokens: 128,
        }
    }
}

impl SyntheticConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if self.prefixes == 0 || self.prefixes > 1_000_000 {
            return Err(format!(
                "prefixes must be between 1 and 1000000, got {}",
                self.prefixes
            ));
        }
        if self.prefix_tokens > MAX_PART_TOKENS || self.suffix_tokens > MAX_PART_TOKENS {
            return Err(format!(
                "prefix_tokens and suffix_tokens must be at most {MAX_PART_TOKENS}"
            ));
        }
        if self.prefix_tokens + self.suffix_tokens == 0 {
            return Err("a prompt needs at least one token".into());
        }
        if self.prefixes.saturating_mul(self.prefix_tokens) > MAX_POOL_TOKENS {
            return Err(format!(
                "{} prefixes of {} tokens exceed the pool limit of {MAX_POOL_TOKENS} tokens",
                self.prefixes, self.prefix_tokens
            ));
        }
        if !(self.zipf_s.is_finite() && (0.0..=100.0).contains(&self.zipf_s)) {
            return Err(format!(
                "zipf_s must be between 0 and 100, got {}",
                self.zipf_s
            ));
        }
        if self.max_tokens == 0 {
            return Err("max_tokens must be positive".into());
        }
        Ok(())
    }
}

/// The workload could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SyntheticError {
    /// Invalid settings.
    #[error("invalid synthetic workload config: {0}")]
    Config(String),
    /// The arrival rate is not finite and positive.
    #[error("arrival rate must be finite and positive, got {0}")]
    Rate(f64),
}

/// A Zipf distribution over `0..n`: `P(k) ∝ 1 / (k + 1)^s`, sampled by binary search in a
/// precomputed cumulative table.
#[derive(Clone, Debug, PartialEq)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// A Zipf distribution over `n >= 1` ranks with exponent `s` (finite, `>= 0`).
    pub fn new(n: usize, s: f64) -> Result<Self, String> {
        if n == 0 {
            return Err("a Zipf distribution needs at least one rank".into());
        }
        if !(s.is_finite() && s >= 0.0) {
            return Err(format!("Zipf exponent must be finite and >= 0, got {s}"));
        }
        let mut total = 0.0;
        let mut cdf: Vec<f64> = (0..n)
            .map(|k| {
                total += ((k + 1) as f64).powf(-s);
                total
            })
            .collect();
        for c in &mut cdf {
            *c /= total;
        }
        Ok(Self { cdf })
    }

    /// Number of ranks.
    pub fn len(&self) -> usize {
        self.cdf.len()
    }

    /// Always false: a distribution has at least one rank.
    pub fn is_empty(&self) -> bool {
        self.cdf.is_empty()
    }

    /// Probability of rank `k` (0 beyond the last).
    pub fn probability(&self, k: usize) -> f64 {
        match k {
            0 => self.cdf.first().copied().unwrap_or(0.0),
            _ if k < self.cdf.len() => self.cdf[k] - self.cdf[k - 1],
            _ => 0.0,
        }
    }

    /// Draws a rank.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> usize {
        let u: f64 = rng.gen();
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }
}

/// One synthetic request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyntheticRequest {
    /// Its number, from 0.
    pub id: RequestId,
    /// Which prefix it starts with (0 is the most popular).
    pub prefix: usize,
    /// Prefix then unique suffix.
    pub prompt: Prompt,
    /// Output tokens to ask for.
    pub max_tokens: u32,
}

/// The shared-prefix workload generator.
#[derive(Clone, Debug)]
pub struct Synthetic {
    config: SyntheticConfig,
    seed: u64,
    prefixes: Vec<Vec<u32>>,
    zipf: Zipf,
    rng: ChaCha8Rng,
    next_id: u64,
}

impl Synthetic {
    /// A generator for a seed.
    pub fn new(config: SyntheticConfig, seed: u64) -> Result<Self, SyntheticError> {
        config.validate().map_err(SyntheticError::Config)?;
        let zipf = Zipf::new(config.prefixes, config.zipf_s).map_err(SyntheticError::Config)?;
        let prefixes = (0..config.prefixes)
            .map(|p| {
                let mut t = Vec::new();
                let key = mix_key(mix_key(seed, PREFIX_TAG), p as u64);
                extend_tokens(&mut t, key, 0, config.prefix_tokens);
                t
            })
            .collect();
        Ok(Self {
            rng: ChaCha8Rng::seed_from_u64(mix_key(seed, CHOICE_TAG)),
            config,
            seed,
            prefixes,
            zipf,
            next_id: 0,
        })
    }

    /// The settings.
    pub fn config(&self) -> &SyntheticConfig {
        &self.config
    }

    /// The prefix popularity.
    pub fn zipf(&self) -> &Zipf {
        &self.zipf
    }

    /// The tokens of prefix `k`.
    pub fn prefix(&self, k: usize) -> Option<&[u32]> {
        self.prefixes.get(k).map(Vec::as_slice)
    }

    /// The next request (closed loop: the driver decides when to send it).
    pub fn next_request(&mut self) -> SyntheticRequest {
        let id = self.next_id;
        self.next_id += 1;
        let prefix = self.zipf.sample(&mut self.rng);
        let mut tokens = Vec::with_capacity(self.config.prefix_tokens + self.config.suffix_tokens);
        tokens.extend_from_slice(&self.prefixes[prefix]);
        let key = mix_key(mix_key(self.seed, SUFFIX_TAG), id);
        extend_tokens(&mut tokens, key, 0, self.config.suffix_tokens);
        SyntheticRequest {
            id: RequestId(id),
            prefix,
            prompt: Prompt::Tokens(tokens),
            max_tokens: self.config.max_tokens,
        }
    }

    /// An endless open-loop stream: the same requests with Poisson arrivals at `rate_per_s`
    /// (exponential gaps, the first request after one gap).
    pub fn open_loop(self, rate_per_s: f64) -> Result<OpenLoop, SyntheticError> {
        if !(rate_per_s.is_finite() && rate_per_s > 0.0) {
            return Err(SyntheticError::Rate(rate_per_s));
        }
        Ok(OpenLoop {
            arrivals: PoissonArrivals::new(rate_per_s, mix_key(self.seed, ARRIVAL_TAG))
                .map_err(|_| SyntheticError::Rate(rate_per_s))?,
            gen: self,
        })
    }
}

/// Requests with Poisson arrival times (never ends; use `take` or `take_while`).
#[derive(Clone, Debug)]
pub struct OpenLoop {
    gen: Synthetic,
    arrivals: PoissonArrivals,
}

impl Iterator for OpenLoop {
    type Item = (Time, SyntheticRequest);

    fn next(&mut self) -> Option<Self::Item> {
        Some((self.arrivals.next_time(), self.gen.next_request()))
    }
}

#[cfg(test)]
mod tests;
