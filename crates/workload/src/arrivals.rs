//! Poisson arrivals: exponential gaps at a fixed rate from a seeded stream, for open-loop
//! loads (the synthetic workload's [`crate::OpenLoop`], the load generator's `--rate`).

use kvroute_core::Time;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Arrival times of a Poisson process, the first one gap after time 0.
#[derive(Clone, Debug)]
pub struct PoissonArrivals {
    rng: ChaCha8Rng,
    rate: f64,
    now_secs: f64,
}

impl PoissonArrivals {
    /// Arrivals at `rate_per_s` (finite, > 0) from `seed`.
    pub fn new(rate_per_s: f64, seed: u64) -> Result<Self, String> {
        if !(rate_per_s.is_finite() && rate_per_s > 0.0) {
            return Err(format!("rate must be a number > 0, got {rate_per_s}"));
        }
        Ok(Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            rate: rate_per_s,
            now_secs: 0.0,
        })
    }

    /// The rate, per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The next arrival time.
    pub fn next_time(&mut self) -> Time {
        let u: f64 = self.rng.gen(); // [0, 1)
        self.now_secs += -(1.0 - u).ln() / self.rate;
        Time::from_secs_f64(self.now_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_average_one_over_the_rate_and_repeat_for_a_seed() {
        let mut a = PoissonArrivals::new(20.0, 3).unwrap();
        let times: Vec<Time> = (0..20_000).map(|_| a.next_time()).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        let mean_gap = times.last().unwrap().0.as_secs_f64() / times.len() as f64;
        assert!((mean_gap - 0.05).abs() < 0.002, "{mean_gap}");
        let mut b = PoissonArrivals::new(20.0, 3).unwrap();
        assert_eq!(b.next_time(), times[0]);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(PoissonArrivals::new(bad, 0).is_err());
        }
    }
}
