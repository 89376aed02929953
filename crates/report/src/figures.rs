//! The figures a report states for one run of one cell, flat so that runs can be averaged.

use kvroute_workload::Summary;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One run's figures (or their mean over runs). Latencies in milliseconds; `None` where the
/// run had nothing to measure (no completed request, say).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Requests sent.
    pub sent: u64,
    /// Requests completed.
    pub completed: u64,
    /// Requests that failed after dispatch.
    pub failed: u64,
    /// Requests refused before dispatch (shed, queue timeout).
    pub rejected: u64,
    /// TTFT of completed requests.
    pub ttft_p50_ms: Option<f64>,
    /// TTFT of completed requests.
    pub ttft_p95_ms: Option<f64>,
    /// TTFT of completed requests.
    pub ttft_p99_ms: Option<f64>,
    /// TTFT over every sent request, failures and rejections infinite (`"inf"` in JSON).
    #[serde(serialize_with = "inf_out", deserialize_with = "inf_in")]
    pub ttft_all_p50_ms: Option<f64>,
    /// TTFT over every sent request, failures and rejections infinite.
    #[serde(serialize_with = "inf_out", deserialize_with = "inf_in")]
    pub ttft_all_p95_ms: Option<f64>,
    /// TTFT over every sent request, failures and rejections infinite.
    #[serde(serialize_with = "inf_out", deserialize_with = "inf_in")]
    pub ttft_all_p99_ms: Option<f64>,
    /// Time per output token.
    pub tpot_p50_ms: Option<f64>,
    /// Time per output token.
    pub tpot_p95_ms: Option<f64>,
    /// Inter-token latency.
    pub itl_p50_ms: Option<f64>,
    /// Inter-token latency.
    pub itl_p95_ms: Option<f64>,
    /// End-to-end latency.
    pub e2e_p50_ms: Option<f64>,
    /// End-to-end latency.
    pub e2e_p95_ms: Option<f64>,
    /// Cached / input tokens of completed requests.
    pub hit_rate: Option<f64>,
    /// Output tokens per second.
    pub output_tokens_per_s: Option<f64>,
    /// Completed requests per second.
    pub requests_per_s: Option<f64>,
    /// Requests per second meeting both objectives (of the sweep's SLO), each request on
    /// its own TTFT and TPOT.
    #[serde(default)]
    pub goodput_per_s: Option<f64>,
}

fn inf_out<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(x) if x.is_infinite() => s.serialize_str("inf"),
        Some(x) if x.is_finite() => s.serialize_f64(*x),
        _ => s.serialize_none(),
    }
}

fn inf_in<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Value {
        Number(f64),
        Text(String),
    }
    match Option::<Value>::deserialize(d)? {
        None => Ok(None),
        Some(Value::Number(x)) => Ok(Some(x)),
        Some(Value::Text(t)) if t == "inf" => Ok(Some(f64::INFINITY)),
        Some(Value::Text(t)) => Err(serde::de::Error::custom(format!(
            "expected a number or \"inf\", got {t:?}"
        ))),
    }
}

impl Metrics {
    /// The figures of a run's summary.
    pub fn from_summary(s: &Summary) -> Self {
        Self {
            sent: s.sent,
            completed: s.completed,
            failed: s.failed,
            rejected: s.rejected,
            ttft_p50_ms: s.ttft_ms.p50,
            ttft_p95_ms: s.ttft_ms.p95,
            ttft_p99_ms: s.ttft_ms.p99,
            ttft_all_p50_ms: s.ttft_all_ms.p50,
            ttft_all_p95_ms: s.ttft_all_ms.p95,
            ttft_all_p99_ms: s.ttft_all_ms.p99,
            tpot_p50_ms: s.tpot_ms.p50,
            tpot_p95_ms: s.tpot_ms.p95,
            itl_p50_ms: s.itl_ms.p50,
            itl_p95_ms: s.itl_ms.p95,
            e2e_p50_ms: s.e2e_ms.p50,
            e2e_p95_ms: s.e2e_ms.p95,
            hit_rate: s.hit_rate,
            output_tokens_per_s: s.output_tokens_per_s,
            requests_per_s: s.requests_per_s,
            goodput_per_s: s.goodput.as_ref().and_then(|g| g.per_s),
        }
    }

    /// The mean of several runs: counts summed, every other figure averaged over the runs
    /// that have it (an infinite value makes the mean infinite). Empty input gives the
    /// default.
    pub fn mean(runs: &[Metrics]) -> Self {
        let avg = |f: fn(&Metrics) -> Option<f64>| {
            let v: Vec<f64> = runs.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let sum = |f: fn(&Metrics) -> u64| runs.iter().map(f).sum();
        Self {
            sent: sum(|m| m.sent),
            completed: sum(|m| m.completed),
            failed: sum(|m| m.failed),
            rejected: sum(|m| m.rejected),
            ttft_p50_ms: avg(|m| m.ttft_p50_ms),
            ttft_p95_ms: avg(|m| m.ttft_p95_ms),
            ttft_p99_ms: avg(|m| m.ttft_p99_ms),
            ttft_all_p50_ms: avg(|m| m.ttft_all_p50_ms),
            ttft_all_p95_ms: avg(|m| m.ttft_all_p95_ms),
            ttft_all_p99_ms: avg(|m| m.ttft_all_p99_ms),
            tpot_p50_ms: avg(|m| m.tpot_p50_ms),
            tpot_p95_ms: avg(|m| m.tpot_p95_ms),
            itl_p50_ms: avg(|m| m.itl_p50_ms),
            itl_p95_ms: avg(|m| m.itl_p95_ms),
            e2e_p50_ms: avg(|m| m.e2e_p50_ms),
            e2e_p95_ms: avg(|m| m.e2e_p95_ms),
            hit_rate: avg(|m| m.hit_rate),
            output_tokens_per_s: avg(|m| m.output_tokens_per_s),
            requests_per_s: avg(|m| m.requests_per_s),
            goodput_per_s: avg(|m| m.goodput_per_s),
        }
    }

    /// Whether the run met a TTFT p95 and a TPOT p95 limit (ms), TTFT taken over every sent
    /// request so that refusing work cannot pass. A missing figure does not meet a limit.
    pub fn meets(&self, ttft_p95_ms: Option<f64>, tpot_p95_ms: Option<f64>) -> bool {
        let ok = |v: Option<f64>, limit: Option<f64>| match limit {
            None => true,
            Some(l) => v.is_some_and(|v| v <= l),
        };
        self.sent > 0 && ok(self.ttft_all_p95_ms, ttft_p95_ms) && ok(self.tpot_p95_ms, tpot_p95_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ttft: f64, sent: u64) -> Metrics {
        Metrics {
            sent,
            completed: sent,
            ttft_p95_ms: Some(ttft),
            ttft_all_p95_ms: Some(ttft),
            tpot_p95_ms: Some(30.0),
            ..Metrics::default()
        }
    }

    #[test]
    fn mean_sums_counts_and_averages_figures() {
        let mut b = run(300.0, 20);
        b.hit_rate = Some(0.5);
        let m = Metrics::mean(&[run(100.0, 10), b]);
        assert_eq!(m.sent, 30);
        assert_eq!(m.ttft_p95_ms, Some(200.0));
        // Only one run has a hit rate: its value, not half of it.
        assert_eq!(m.hit_rate, Some(0.5));
        assert_eq!(m.ttft_p50_ms, None);
        let inf = Metrics {
            ttft_all_p95_ms: Some(f64::INFINITY),
            ..run(1.0, 1)
        };
        assert_eq!(
            Metrics::mean(&[run(1.0, 1), inf]).ttft_all_p95_ms,
            Some(f64::INFINITY)
        );
    }

    #[test]
    fn slo_uses_ttft_over_all_sent() {
        let mut m = run(500.0, 10);
        assert!(m.meets(Some(600.0), Some(60.0)));
        assert!(!m.meets(Some(400.0), None));
        assert!(!m.meets(None, Some(20.0)));
        m.ttft_all_p95_ms = Some(f64::INFINITY);
        assert!(!m.meets(Some(600.0), None));
        assert!(!Metrics::default().meets(None, None));
    }

    #[test]
    fn infinite_values_round_trip_through_json() {
        let m = Metrics {
            ttft_all_p99_ms: Some(f64::INFINITY),
            ..run(5.0, 3)
        };
        let text = serde_json::to_string(&m).unwrap();
        assert!(text.contains("\"ttft_all_p99_ms\":\"inf\""), "{text}");
        let back: Metrics = serde_json::from_str(&text).unwrap();
        assert_eq!(back, m);
        let bad = text.replace("\"inf\"", "\"lots\"");
        assert!(serde_json::from_str::<Metrics>(&bad).is_err());
    }
}
