//! Online fit of a worker's time to first token against the prefill work ahead of a request.
//!
//! Model: `ttft = overhead + work_tokens * secs_per_token`, where `work_tokens` is the
//! outstanding prefill on the worker at dispatch including the request's own uncached tokens.
//! Fitted by exponentially weighted least squares (recent samples count more; the memory is
//! about 64 samples, a property of the estimator rather than a knob), falling back to a line
//! through the origin when the samples do not spread enough to separate the two terms.
//! Huber weights (`ledger/robust.rs`), as in the decode fit: one slow first token moves the fit
//! a bounded step, while a lasting change is learned.

use super::robust::RobustScale;
use serde::{Deserialize, Serialize};

/// Weight kept by old samples at each new one (memory of about 64 samples).
const DECAY: f64 = 1.0 - 1.0 / 64.0;

/// A learned prefill speed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefillEstimate {
    /// Seconds per prefill token (> 0).
    pub secs_per_token: f64,
    /// Seconds of fixed latency per request (>= 0).
    pub overhead_secs: f64,
    /// Samples seen.
    pub samples: u64,
}

impl PrefillEstimate {
    /// Predicted seconds to first token with `work_tokens` of prefill ahead, own included.
    pub fn ttft_secs(&self, work_tokens: f64) -> f64 {
        self.overhead_secs + work_tokens.max(0.0) * self.secs_per_token
    }
}

/// Sufficient statistics of the weighted fit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefillFit {
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
    /// The residuals' robust scale (Huber weights).
    scale: RobustScale,
    samples: u64,
}

impl PrefillFit {
    /// Adds one observation: `ttft_secs` seconds to first token with `work_tokens` ahead.
    /// Non-finite or negative values are ignored.
    pub fn observe(&mut self, work_tokens: f64, ttft_secs: f64) {
        if !(work_tokens.is_finite() && ttft_secs.is_finite())
            || work_tokens < 0.0
            || ttft_secs < 0.0
        {
            return;
        }
        let predicted = self.estimate().map(|e| e.ttft_secs(work_tokens));
        let w = self.scale.weigh(ttft_secs, predicted, self.samples, DECAY);
        self.w = self.w * DECAY + w;
        self.x = self.x * DECAY + w * work_tokens;
        self.y = self.y * DECAY + w * ttft_secs;
        self.xx = self.xx * DECAY + w * work_tokens * work_tokens;
        self.xy = self.xy * DECAY + w * work_tokens * ttft_secs;
        self.samples += 1;
    }

    /// The current estimate, once a sample with prefill work arrived.
    pub fn estimate(&self) -> Option<PrefillEstimate> {
        if self.samples == 0 || self.x <= 0.0 {
            return None;
        }
        let (mx, my) = (self.x / self.w, self.y / self.w);
        let var = self.xx / self.w - mx * mx;
        let cov = self.xy / self.w - mx * my;
        // Two-term fit when x spreads by more than 10% of its mean.
        if self.samples >= 3 && var > (0.1 * mx) * (0.1 * mx) {
            let slope = cov / var;
            let overhead = my - slope * mx;
            if slope > 0.0 && overhead >= 0.0 {
                return Some(self.make(slope, overhead));
            }
            // More work ahead did not take longer: a worker that prefills concurrently (or
            // one whose overhead dwarfs its prefill). Its first token takes the mean time
            // whatever the work; the floor keeps the speed positive.
            if slope <= 0.0 {
                return Some(self.make(1e-12, my.max(0.0)));
            }
        }
        // Otherwise a line through the origin, which cannot go negative.
        // (x > 0 implies xx > 0.) The floor keeps all-zero times from giving a zero speed.
        Some(self.make((self.xy / self.xx).max(1e-12), 0.0))
    }

    fn make(&self, secs_per_token: f64, overhead_secs: f64) -> PrefillEstimate {
        PrefillEstimate {
            secs_per_token,
            overhead_secs,
            samples: self.samples,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_rate_and_overhead_from_a_clean_line() {
        let mut f = PrefillFit::default();
        assert!(f.estimate().is_none());
        for i in 0..200 {
            let x = 1_000.0 + 37.0 * (i % 50) as f64;
            f.observe(x, 0.020 + x / 10_000.0);
        }
        let e = f.estimate().unwrap();
        assert!((e.secs_per_token - 1e-4).abs() < 1e-7, "{e:?}");
        assert!((e.overhead_secs - 0.020).abs() < 1e-4, "{e:?}");
        assert!((e.ttft_secs(5_000.0) - 0.52).abs() < 1e-3);
    }

    #[test]
    fn constant_work_falls_back_to_a_ratio() {
        let mut f = PrefillFit::default();
        for _ in 0..10 {
            f.observe(2_000.0, 0.2);
        }
        let e = f.estimate().unwrap();
        assert_eq!(e.overhead_secs, 0.0);
        assert!((e.secs_per_token - 1e-4).abs() < 1e-9);
    }

    #[test]
    fn follows_a_worker_that_slows_down() {
        let mut f = PrefillFit::default();
        for i in 0..300 {
            let x = 500.0 + (i % 10) as f64 * 300.0;
            f.observe(x, x / 20_000.0);
        }
        for i in 0..300 {
            let x = 500.0 + (i % 10) as f64 * 300.0;
            f.observe(x, x / 5_000.0);
        }
        let e = f.estimate().unwrap();
        assert!((e.secs_per_token - 2e-4).abs() < 1e-5, "{e:?}");
    }

    /// `n` first tokens of 10 ms plus `secs_per_token`, over 500 to 3,200 tokens of work.
    fn feed(f: &mut PrefillFit, n: usize, secs_per_token: f64) {
        for i in 0..n {
            let x = 500.0 + (i % 10) as f64 * 300.0;
            f.observe(x, 0.01 + x * secs_per_token);
        }
    }

    #[test]
    fn one_slow_first_token_moves_the_fit_a_bounded_step() {
        let mut f = PrefillFit::default();
        feed(&mut f, 200, 1e-4);
        let before = f.estimate().unwrap().ttft_secs(2_000.0);
        // A request stuck behind a stall: 28x its time.
        f.observe(2_000.0, 28.0 * before);
        let after = f.estimate().unwrap().ttft_secs(2_000.0);
        assert!((after / before - 1.0).abs() < 0.02, "{before} -> {after}");
    }

    #[test]
    fn a_lasting_slowdown_is_learned_despite_the_robust_weights() {
        let mut f = PrefillFit::default();
        feed(&mut f, 200, 1e-4);
        feed(&mut f, 400, 4e-4);
        let e = f.estimate().unwrap();
        assert!((e.secs_per_token / 4e-4 - 1.0).abs() < 0.05, "{e:?}");
    }

    #[test]
    fn a_worker_whose_first_token_does_not_wait_for_queued_prefill_is_learned_as_such() {
        let mut f = PrefillFit::default();
        for i in 0..300 {
            // 500 to 50,000 tokens ahead, always 20-21 ms (a little less with more work:
            // the noise of a worker whose prefill does not queue).
            let x = 500.0 + (i % 100) as f64 * 500.0;
            f.observe(x, 0.021 - x * 1e-8);
        }
        let e = f.estimate().unwrap();
        assert!(e.ttft_secs(100_000.0) < 0.025, "{e:?}");
        assert!(e.ttft_secs(500.0) > 0.018, "{e:?}");
    }

    #[test]
    fn garbage_is_ignored_and_estimates_stay_positive() {
        let mut f = PrefillFit::default();
        f.observe(f64::NAN, 1.0);
        f.observe(-1.0, 1.0);
        f.observe(100.0, f64::INFINITY);
        assert!(f.estimate().is_none());
        // Decreasing times with more work: no negative slope comes out.
        f.observe(100.0, 1.0);
        f.observe(1_000.0, 0.5);
        f.observe(10_000.0, 0.0);
        let e = f.estimate().unwrap();
        assert!(e.secs_per_token > 0.0 && e.overhead_secs >= 0.0, "{e:?}");
        // No prefill work at all (everything cached): nothing learned.
        let mut g = PrefillFit::default();
        g.observe(0.0, 0.05);
        assert!(g.estimate().is_none());
    }
}
