//! The baseline file: one policy's results per concurrency level, as the dashboard shows them
//! next to live figures ("round-robin baseline"). Written by `kvroute bench`, read back with
//! every field checked.
//!
//! ```json
//! {"format": "kvroute-baseline", "version": 1, "policy": "round_robin", "workers": 3,
//!  "workload": "multiturn", "source": "kvroute bench --sim ...",
//!  "points": [{"concurrency": 60, "ttft_ms": {"p50": 250.1, "p95": 655.0}, ...}]}
//! ```

use crate::{Load, Sweep};
use serde::{Deserialize, Serialize};

/// The `format` field of a baseline file.
pub const FORMAT: &str = "kvroute-baseline";
/// The version written, and the only one read.
pub const VERSION: u32 = 1;
/// Most points a baseline may hold.
pub const MAX_POINTS: usize = 1_000;

/// A median and a 95th percentile, milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(deny_unknown_fields)]
pub struct P50P95 {
    /// Median.
    pub p50: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
}

/// One concurrency level.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct BaselinePoint {
    /// Conversations in flight.
    pub concurrency: usize,
    /// Time to first token.
    pub ttft_ms: P50P95,
    /// Time per output token.
    pub tpot_ms: P50P95,
    /// Inter-token latency.
    pub itl_ms: P50P95,
    /// End-to-end latency.
    pub e2e_ms: P50P95,
    /// Completed requests per second.
    pub requests_per_s: Option<f64>,
    /// Output tokens per second.
    pub output_tokens_per_s: Option<f64>,
    /// Cached / input tokens.
    pub hit_rate: Option<f64>,
}

impl BaselinePoint {
    /// The point of a run's (or a live window's) summary at `concurrency`.
    pub fn from_summary(concurrency: usize, s: &kvroute_workload::Summary) -> Self {
        let pair = |d: &kvroute_workload::stats::Distribution| P50P95 {
            p50: d.p50,
            p95: d.p95,
        };
        Self {
            concurrency,
            ttft_ms: pair(&s.ttft_ms),
            tpot_ms: pair(&s.tpot_ms),
            itl_ms: pair(&s.itl_ms),
            e2e_ms: pair(&s.e2e_ms),
            requests_per_s: s.requests_per_s,
            output_tokens_per_s: s.output_tokens_per_s,
            hit_rate: s.hit_rate,
        }
    }
}

/// A baseline file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct Baseline {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`VERSION`].
    pub version: u32,
    /// The policy measured.
    pub policy: String,
    /// Workers in the fleet.
    pub workers: usize,
    /// The workload, as given to `kvroute bench`.
    pub workload: String,
    /// How it was produced (back end, profile), free text.
    pub source: String,
    /// Whether the fleet simulator produced it (the dashboard labels it so: a simulated
    /// baseline is not a measurement of any fleet).
    #[serde(default)]
    pub simulated: bool,
    /// Ascending concurrency, no repeats.
    pub points: Vec<BaselinePoint>,
}

/// A baseline file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    /// Not JSON of the expected shape.
    #[error("not a baseline file: {0}")]
    Json(#[from] serde_json::Error),
    /// Another format or version.
    #[error("format {format:?} version {version}: expected {FORMAT:?} version {VERSION}")]
    Format {
        /// The format found.
        format: String,
        /// The version found.
        version: u32,
    },
    /// A field out of range.
    #[error("invalid baseline: {0}")]
    Invalid(String),
    /// The sweep has no concurrency cells of the policy.
    #[error("the sweep has no closed-loop cells of policy {0:?} to make a baseline of")]
    Empty(String),
}

impl Baseline {
    /// The baseline of `policy` at `workers` in a sweep (its closed-loop cells).
    pub fn from_sweep(
        s: &Sweep,
        policy: &str,
        workers: usize,
        workload: &str,
        source: &str,
    ) -> Result<Self, BaselineError> {
        let points: Vec<BaselinePoint> = s
            .cells
            .iter()
            .filter(|c| c.policy == policy && c.workers == workers)
            .filter_map(|c| match c.load {
                Load::Concurrency(n) => {
                    let m = &c.metrics;
                    Some(BaselinePoint {
                        concurrency: n,
                        ttft_ms: P50P95 {
                            p50: m.ttft_p50_ms,
                            p95: m.ttft_p95_ms,
                        },
                        tpot_ms: P50P95 {
                            p50: m.tpot_p50_ms,
                            p95: m.tpot_p95_ms,
                        },
                        itl_ms: P50P95 {
                            p50: m.itl_p50_ms,
                            p95: m.itl_p95_ms,
                        },
                        e2e_ms: P50P95 {
                            p50: m.e2e_p50_ms,
                            p95: m.e2e_p95_ms,
                        },
                        requests_per_s: m.requests_per_s,
                        output_tokens_per_s: m.output_tokens_per_s,
                        hit_rate: m.hit_rate,
                    })
                }
                _ => None,
            })
            .collect();
        if points.is_empty() {
            return Err(BaselineError::Empty(policy.into()));
        }
        Self::from_points(policy, workers, workload, source, points)
    }

    /// A baseline of `points` (sorted, one per level: the first given wins), checked.
    pub fn from_points(
        policy: &str,
        workers: usize,
        workload: &str,
        source: &str,
        mut points: Vec<BaselinePoint>,
    ) -> Result<Self, BaselineError> {
        if points.is_empty() {
            return Err(BaselineError::Empty(policy.into()));
        }
        points.sort_by_key(|p| p.concurrency);
        points.dedup_by_key(|p| p.concurrency);
        let b = Self {
            format: FORMAT.into(),
            version: VERSION,
            policy: policy.into(),
            workers,
            workload: workload.into(),
            source: source.into(),
            simulated: false,
            points,
        };
        b.validate()?;
        Ok(b)
    }

    /// Reads and checks a baseline file's text.
    pub fn parse(text: &str) -> Result<Self, BaselineError> {
        let b: Baseline = serde_json::from_str(text)?;
        if b.format != FORMAT || b.version != VERSION {
            return Err(BaselineError::Format {
                format: b.format,
                version: b.version,
            });
        }
        b.validate()?;
        Ok(b)
    }

    fn validate(&self) -> Result<(), BaselineError> {
        let bad = |m: String| Err(BaselineError::Invalid(m));
        if self.points.is_empty() || self.points.len() > MAX_POINTS {
            return bad(format!("{} points (1 to {MAX_POINTS})", self.points.len()));
        }
        if self.workers == 0 {
            return bad("workers must be >= 1".into());
        }
        let mut last = 0;
        for p in &self.points {
            if p.concurrency <= last {
                return bad(format!(
                    "concurrency {} after {last}: must be >= 1 and ascending",
                    p.concurrency
                ));
            }
            last = p.concurrency;
            let values = [
                p.ttft_ms.p50,
                p.ttft_ms.p95,
                p.tpot_ms.p50,
                p.tpot_ms.p95,
                p.itl_ms.p50,
                p.itl_ms.p95,
                p.e2e_ms.p50,
                p.e2e_ms.p95,
                p.requests_per_s,
                p.output_tokens_per_s,
                p.hit_rate,
            ];
            if values.iter().flatten().any(|v| !v.is_finite() || *v < 0.0) {
                return bad(format!(
                    "concurrency {}: values must be finite and >= 0",
                    p.concurrency
                ));
            }
            if p.hit_rate.is_some_and(|h| h > 1.0) {
                return bad(format!("concurrency {}: hit rate over 1", p.concurrency));
            }
        }
        Ok(())
    }

    /// The point to compare a live run at `concurrency` with: the exact level, else the
    /// nearest one (the lower on a tie).
    pub fn at(&self, concurrency: usize) -> Option<&BaselinePoint> {
        self.points
            .iter()
            .min_by_key(|p| (p.concurrency.abs_diff(concurrency), p.concurrency))
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}
