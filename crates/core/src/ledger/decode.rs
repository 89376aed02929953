//! Online fit of a worker's decode step time against its batch and the KV it reads.
//!
//! Model: `step = base + per_seq * batch + per_ktoken * kv_tokens / 1000`: a decode step
//! reads the weights once (`base`), does a little work per sequence and reads every running
//! sequence's KV (memory bound, as engines are at decode). A sample is one finished request:
//! its time per output token after the first, against the mean batch and the mean prompt tokens (each request's, the KV its steps read)
//! on its worker while it decoded, with the time the worker spent prefilling others taken
//! out (the caller divides that share out). Fitted by exponentially weighted least squares
//! (memory of about 128 samples) with Huber weights (`ledger/robust.rs`): one slow request
//! moves the fit a bounded step. Slopes never go negative: a term that would is dropped.

use super::robust::RobustScale;
use serde::{Deserialize, Serialize};

/// Weight kept by old samples at each new one (memory of about 128 samples).
const DECAY: f64 = 1.0 - 1.0 / 128.0;

/// A learned decode speed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecodeEstimate {
    /// Seconds per step with nothing running (>= 0).
    pub base_secs: f64,
    /// Seconds per step per running sequence (>= 0).
    pub per_seq_secs: f64,
    /// Seconds per step per 1,000 tokens of KV read (>= 0).
    pub per_ktoken_secs: f64,
    /// Samples seen.
    pub samples: u64,
}

impl DecodeEstimate {
    /// Predicted seconds per decode step with `batch` sequences reading `kv_tokens` of KV.
    pub fn step_secs(&self, batch: f64, kv_tokens: f64) -> f64 {
        self.base_secs
            + self.per_seq_secs * batch.max(0.0)
            + self.per_ktoken_secs * kv_tokens.max(0.0) / 1000.0
    }
}

/// Sufficient statistics of the weighted fit (features 1, batch, kilo-tokens).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodeFit {
    /// Σ w x xᵀ (upper triangle used) and Σ w x y.
    xx: [[f64; 3]; 3],
    xy: [f64; 3],
    /// The residuals' robust scale (Huber weights).
    scale: RobustScale,
    samples: u64,
}

impl DecodeFit {
    /// Adds one observation: `step_secs` per decode step at a mean of `batch` sequences
    /// reading `kv_tokens` of KV. Non-finite or non-positive values are ignored.
    pub fn observe(&mut self, batch: f64, kv_tokens: f64, step_secs: f64) {
        if !(batch.is_finite() && kv_tokens.is_finite() && step_secs.is_finite())
            || batch <= 0.0
            || kv_tokens < 0.0
            || step_secs <= 0.0
        {
            return;
        }
        let x = [1.0, batch, kv_tokens / 1000.0];
        let predicted = self.estimate().map(|e| e.step_secs(batch, kv_tokens));
        let w = self.scale.weigh(step_secs, predicted, self.samples, DECAY);
        for i in 0..3 {
            for j in 0..3 {
                self.xx[i][j] = self.xx[i][j] * DECAY + w * x[i] * x[j];
            }
            self.xy[i] = self.xy[i] * DECAY + w * x[i] * step_secs;
        }
        self.samples += 1;
    }

    /// The current estimate, once a sample arrived.
    pub fn estimate(&self) -> Option<DecodeEstimate> {
        if self.samples == 0 || self.xx[0][0] <= 0.0 {
            return None;
        }
        // Terms in order of preference: all three, then each slope alone, then the mean.
        let fits: [&[usize]; 4] = [&[0, 1, 2], &[0, 2], &[0, 1], &[0]];
        for terms in fits {
            if self.samples < terms.len() as u64 * 4 && terms.len() > 1 {
                continue;
            }
            if let Some(theta) = self.solve(terms) {
                if theta.iter().all(|t| *t >= 0.0) {
                    let mut coef = [0.0; 3];
                    for (k, &i) in terms.iter().enumerate() {
                        coef[i] = theta[k];
                    }
                    return Some(DecodeEstimate {
                        base_secs: coef[0],
                        per_seq_secs: coef[1],
                        per_ktoken_secs: coef[2],
                        samples: self.samples,
                    });
                }
            }
        }
        // The mean alone is never negative (every sample is positive).
        Some(DecodeEstimate {
            base_secs: self.xy[0] / self.xx[0][0],
            per_seq_secs: 0.0,
            per_ktoken_secs: 0.0,
            samples: self.samples,
        })
    }

    /// Least squares over the features `terms`, when well conditioned.
    fn solve(&self, terms: &[usize]) -> Option<Vec<f64>> {
        let n = terms.len();
        let mut a = vec![vec![0.0; n + 1]; n];
        for (r, &i) in terms.iter().enumerate() {
            for (c, &j) in terms.iter().enumerate() {
                a[r][c] = self.xx[i][j];
            }
            a[r][n] = self.xy[i];
        }
        // Gaussian elimination with partial pivoting; a tiny pivot relative to the
        // feature's own spread means the term cannot be told apart.
        for col in 0..n {
            let pivot = (col..n).max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))?;
            a.swap(col, pivot);
            let scale = self.xx[terms[col]][terms[col]].max(f64::MIN_POSITIVE);
            if a[col][col].abs() < 1e-6 * scale {
                return None;
            }
            let pivot_row = a[col].clone();
            for (r, row) in a.iter_mut().enumerate() {
                if r != col {
                    let f = row[col] / pivot_row[col];
                    for (x, p) in row.iter_mut().zip(&pivot_row).skip(col) {
                        *x -= f * p;
                    }
                }
            }
        }
        let theta: Vec<f64> = (0..n).map(|i| a[i][n] / a[i][i]).collect();
        theta.iter().all(|t| t.is_finite()).then_some(theta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn truth(batch: f64, kv: f64) -> f64 {
        0.012 + 0.0002 * batch + 0.0004 * kv / 1000.0
    }

    #[test]
    fn learns_the_three_terms_from_clean_samples() {
        let mut f = DecodeFit::default();
        assert!(f.estimate().is_none());
        for i in 0..400 {
            let batch = 1.0 + (i % 17) as f64 * 3.0;
            let kv = batch * (2_000.0 + (i % 7) as f64 * 900.0);
            f.observe(batch, kv, truth(batch, kv));
        }
        let e = f.estimate().unwrap();
        assert!((e.base_secs - 0.012).abs() < 1e-6, "{e:?}");
        assert!((e.per_seq_secs - 0.0002).abs() < 1e-7, "{e:?}");
        assert!((e.per_ktoken_secs - 0.0004).abs() < 1e-7, "{e:?}");
    }

    #[test]
    fn one_slow_request_moves_the_fit_a_bounded_step() {
        let mut f = DecodeFit::default();
        for i in 0..300 {
            let batch = 4.0 + (i % 9) as f64;
            let kv = batch * 3_000.0 + (i % 5) as f64 * 1_000.0;
            f.observe(
                batch,
                kv,
                truth(batch, kv) * (1.0 + 0.02 * ((i % 3) as f64 - 1.0)),
            );
        }
        let before = f.estimate().unwrap().step_secs(8.0, 24_000.0);
        // A request that stalled 28 times over.
        f.observe(8.0, 24_000.0, 28.0 * before);
        let after = f.estimate().unwrap().step_secs(8.0, 24_000.0);
        assert!(after / before < 1.01, "{before} -> {after}");
        // Without the Huber weights the same sample moves it by a fifth.
        let naive = before + (27.0 * before) / 128.0;
        assert!(naive / before > 1.2);
    }

    #[test]
    fn constant_features_fall_back_to_the_mean_and_nothing_goes_negative() {
        let mut f = DecodeFit::default();
        for _ in 0..50 {
            f.observe(4.0, 8_000.0, 0.02);
        }
        let e = f.estimate().unwrap();
        assert!((e.step_secs(4.0, 8_000.0) - 0.02).abs() < 1e-9, "{e:?}");
        // Times falling with load: no negative slope comes out.
        let mut g = DecodeFit::default();
        for i in 0..100 {
            let b = 1.0 + (i % 10) as f64;
            g.observe(b, b * 1_000.0, 0.05 - 0.002 * b);
        }
        let e = g.estimate().unwrap();
        assert!(e.base_secs >= 0.0 && e.per_seq_secs >= 0.0 && e.per_ktoken_secs >= 0.0);
        // Garbage is ignored.
        let mut h = DecodeFit::default();
        h.observe(f64::NAN, 1.0, 0.1);
        h.observe(1.0, 1.0, -0.1);
        h.observe(0.0, 1.0, 0.1);
        assert!(h.estimate().is_none());
    }
}
