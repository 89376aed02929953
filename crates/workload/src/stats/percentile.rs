//! Exact percentiles by sorting.
//!
//! Definition (numpy's default, "linear"): for sorted values `x[0..n]` and `q` in `[0, 1]`,
//! let `h = (n - 1) * q`, `lo = floor(h)`; the percentile is
//! `x[lo] + (h - lo) * (x[lo + 1] - x[lo])`, or `x[lo]` when `h` is a whole number. So the
//! median of `[1, 2, 3, 4]` is 2.5 and its 95th percentile is 3.85. An infinite neighbour makes
//! an interpolated result infinite (never NaN). Weighted values `(v, count)` behave exactly as
//! `v` repeated `count` times, without expanding them.

use serde::Serialize;

/// Sorts values ascending (total order; NaNs are the caller's to filter, they sort last).
pub fn sort(values: &mut [f64]) {
    values.sort_unstable_by(f64::total_cmp);
}

fn interpolate(lo: f64, hi: f64, frac: f64) -> f64 {
    if frac == 0.0 || lo == hi {
        lo
    } else if hi.is_infinite() || lo.is_infinite() {
        if lo.is_infinite() {
            lo
        } else {
            hi
        }
    } else {
        lo + frac * (hi - lo)
    }
}

/// Rank position of quantile `q` among `n` values: `(lo, frac)` with `h = lo + frac`.
fn rank(n: u64, q: f64) -> (u64, f64) {
    let q = if q.is_nan() { 0.5 } else { q.clamp(0.0, 1.0) };
    let h = (n - 1) as f64 * q;
    let lo = h.floor();
    ((lo as u64).min(n - 1), h - lo)
}

/// The `q`-quantile (`q` in `[0, 1]`, clamped) of values already sorted ascending; `None`
/// when there are none.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let (lo, frac) = rank(sorted.len() as u64, q);
    let lo = lo as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    Some(interpolate(sorted[lo], sorted[hi], frac))
}

/// The `q`-quantile of weighted values `(value, count)` sorted ascending by value: the same
/// as [`percentile`] over the expanded list. `None` when the counts add up to zero.
pub fn weighted_percentile(sorted: &[(f64, u64)], q: f64) -> Option<f64> {
    let total: u64 = sorted.iter().map(|&(_, c)| c).sum();
    if total == 0 {
        return None;
    }
    let (lo, frac) = rank(total, q);
    // Value at expanded index i: the first entry whose running count passes i.
    let at = |i: u64| {
        let mut seen = 0u64;
        for &(v, c) in sorted {
            seen += c;
            if seen > i {
                return v;
            }
        }
        sorted.last().map_or(f64::NAN, |&(v, _)| v)
    };
    let hi = (lo + 1).min(total - 1);
    Some(interpolate(at(lo), at(hi), frac))
}

/// Summary of a set of samples (milliseconds in reports); fields are `None` (JSON null)
/// without samples.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct Distribution {
    /// Number of samples.
    pub count: u64,
    /// Arithmetic mean.
    pub mean: Option<f64>,
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
}

impl Distribution {
    /// The distribution of `values` (sorted in place; NaNs dropped).
    pub fn of(values: &mut Vec<f64>) -> Self {
        values.retain(|v| !v.is_nan());
        sort(values);
        let n = values.len();
        let mean = (n > 0).then(|| values.iter().sum::<f64>() / n as f64);
        Self {
            count: n as u64,
            mean,
            p50: percentile(values, 0.50),
            p90: percentile(values, 0.90),
            p95: percentile(values, 0.95),
            p99: percentile(values, 0.99),
        }
    }

    /// The distribution of weighted values `(value, count)` (sorted in place; NaNs and zero
    /// counts dropped), as if each value appeared `count` times.
    pub fn of_weighted(values: &mut Vec<(f64, u64)>) -> Self {
        values.retain(|&(v, c)| !v.is_nan() && c > 0);
        values.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
        let count: u64 = values.iter().map(|&(_, c)| c).sum();
        let mean = (count > 0)
            .then(|| values.iter().map(|&(v, c)| v * c as f64).sum::<f64>() / count as f64);
        Self {
            count,
            mean,
            p50: weighted_percentile(values, 0.50),
            p90: weighted_percentile(values, 0.90),
            p95: weighted_percentile(values, 0.95),
            p99: weighted_percentile(values, 0.99),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn linear_interpolation_on_hand_computed_cases() {
        let x = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&x, 0.0), Some(1.0));
        assert_eq!(percentile(&x, 1.0), Some(4.0));
        assert_eq!(percentile(&x, 0.5), Some(2.5));
        // h = 3 * 0.95 = 2.85: 3 + 0.85 * (4 - 3).
        assert!((percentile(&x, 0.95).unwrap() - 3.85).abs() < 1e-12);
        // h = 3 * 0.25 = 0.75: 1 + 0.75 * 1.
        assert_eq!(percentile(&x, 0.25), Some(1.75));
        let y = [10.0, 20.0, 30.0, 40.0, 50.0];
        assert_eq!(percentile(&y, 0.5), Some(30.0));
        // h = 4 * 0.9 = 3.6: 40 + 0.6 * 10.
        assert!((percentile(&y, 0.9).unwrap() - 46.0).abs() < 1e-9);
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(percentile(&x, 2.0), Some(4.0));
        assert_eq!(percentile(&x, -1.0), Some(1.0));
    }

    #[test]
    fn infinity_is_never_nan() {
        let x = [1.0, 2.0, f64::INFINITY, f64::INFINITY];
        assert_eq!(percentile(&x, 0.0), Some(1.0));
        // h = 1.5: between 2 and inf.
        assert_eq!(percentile(&x, 0.5), Some(f64::INFINITY));
        // h = 1 exactly: the finite value itself.
        assert_eq!(percentile(&x, 1.0 / 3.0), Some(2.0));
        assert_eq!(percentile(&x, 1.0), Some(f64::INFINITY));
    }

    #[test]
    fn weighted_equals_expanded_on_a_small_case() {
        let w = [(1.0, 3), (5.0, 1), (9.0, 2)];
        let x = [1.0, 1.0, 1.0, 5.0, 9.0, 9.0];
        for q in [0.0, 0.1, 0.5, 0.6, 0.95, 1.0] {
            assert_eq!(weighted_percentile(&w, q), percentile(&x, q), "q {q}");
        }
        // h = 5 * 0.5 = 2.5: between x[2] = 1 and x[3] = 5.
        assert_eq!(weighted_percentile(&w, 0.5), Some(3.0));
        assert_eq!(weighted_percentile(&[(1.0, 0)], 0.5), None);
    }

    #[test]
    fn distribution_mean_and_percentiles() {
        let d = Distribution::of(&mut vec![4.0, 1.0, f64::NAN, 3.0, 2.0]);
        assert_eq!(d.count, 4);
        assert_eq!(d.mean, Some(2.5));
        assert_eq!(d.p50, Some(2.5));
        let w = Distribution::of_weighted(&mut vec![(2.0, 3), (1.0, 1), (7.0, 0)]);
        assert_eq!(w.count, 4);
        assert_eq!(w.mean, Some(7.0 / 4.0));
        assert_eq!(w.p50, Some(2.0));
        assert_eq!(Distribution::of(&mut vec![]), Distribution::default());
    }

    proptest! {
        #[test]
        fn percentiles_are_monotone_in_q_and_bounded(
            mut xs in proptest::collection::vec(-1e6f64..1e6, 1..60),
            a in 0.0f64..=1.0,
            b in 0.0f64..=1.0,
        ) {
            sort(&mut xs);
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let (pl, ph) = (percentile(&xs, lo).unwrap(), percentile(&xs, hi).unwrap());
            prop_assert!(pl <= ph);
            prop_assert!(xs[0] <= pl && ph <= xs[xs.len() - 1]);
        }

        #[test]
        fn weighted_matches_expansion(
            entries in proptest::collection::vec((0u32..50, 1u64..5), 1..20),
            q in 0.0f64..=1.0,
        ) {
            let mut w: Vec<(f64, u64)> = entries.iter().map(|&(v, c)| (f64::from(v), c)).collect();
            w.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut x: Vec<f64> = w.iter().flat_map(|&(v, c)| std::iter::repeat_n(v, c as usize)).collect();
            sort(&mut x);
            prop_assert_eq!(weighted_percentile(&w, q), percentile(&x, q));
        }
    }
}
