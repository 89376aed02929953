//! The baselines users expect: round-robin, random, least-loaded and power-of-two choices.
//! They ignore the cache; load is compared as (in-flight requests, outstanding prefill
//! tokens, active blocks), in that order.

use super::{Candidate, Choice, Policy, PolicyInput};
use rand::Rng;

/// Cycles through the candidates by decision number.
#[derive(Clone, Copy, Debug, Default)]
pub struct RoundRobin;

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }
    fn select(&self, input: &PolicyInput<'_>) -> Choice {
        let n = input.candidates.len();
        Choice {
            chosen: (input.decision % n as u64) as usize,
            costs: vec![None; n],
        }
    }
}

/// A uniformly random candidate.
#[derive(Clone, Copy, Debug, Default)]
pub struct RandomChoice;

impl Policy for RandomChoice {
    fn name(&self) -> &'static str {
        "random"
    }
    fn select(&self, input: &PolicyInput<'_>) -> Choice {
        let n = input.candidates.len();
        Choice {
            chosen: input.rng().gen_range(0..n),
            costs: vec![None; n],
        }
    }
}

fn load_key(c: &Candidate) -> (u32, u64, u64) {
    (c.load.inflight, c.load.prefill_tokens, c.load.active_blocks)
}

/// The candidate with the fewest in-flight requests (ties: less prefill, fewer blocks, then
/// seeded random).
#[derive(Clone, Copy, Debug, Default)]
pub struct LeastLoaded;

impl Policy for LeastLoaded {
    fn name(&self) -> &'static str {
        "least_loaded"
    }
    fn select(&self, input: &PolicyInput<'_>) -> Choice {
        let best = input
            .candidates
            .iter()
            .map(load_key)
            .min()
            .unwrap_or_default();
        let tied: Vec<usize> = (0..input.candidates.len())
            .filter(|&i| load_key(&input.candidates[i]) == best)
            .collect();
        let chosen = if tied.len() == 1 {
            tied[0]
        } else {
            tied[input.rng().gen_range(0..tied.len())]
        };
        Choice {
            chosen,
            costs: input
                .candidates
                .iter()
                .map(|c| Some(f64::from(c.load.inflight)))
                .collect(),
        }
    }
}

/// Two distinct random candidates; the less loaded wins (the first drawn on a tie).
#[derive(Clone, Copy, Debug, Default)]
pub struct PowerOfTwo;

impl Policy for PowerOfTwo {
    fn name(&self) -> &'static str {
        "power_of_two"
    }
    fn select(&self, input: &PolicyInput<'_>) -> Choice {
        let n = input.candidates.len();
        let mut costs = vec![None; n];
        if n == 1 {
            costs[0] = Some(f64::from(input.candidates[0].load.inflight));
            return Choice { chosen: 0, costs };
        }
        let mut rng = input.rng();
        let a = rng.gen_range(0..n);
        let b = (a + rng.gen_range(1..n)) % n;
        for i in [a, b] {
            costs[i] = Some(f64::from(input.candidates[i].load.inflight));
        }
        let chosen = if load_key(&input.candidates[b]) < load_key(&input.candidates[a]) {
            b
        } else {
            a
        };
        Choice { chosen, costs }
    }
}
