//! The load generator's Prometheus metrics, rendered from its live statistics: summaries of
//! TTFT, TPOT, ITL and end-to-end latency over the rolling window (`loadgen_ttft_all_seconds`
//! and `loadgen_tpot_all_seconds` with quantiles 0.5 and 0.95, as the reference dashboards
//! query), request counters by outcome, and gauges of the load's state.

use crate::service::LiveStats;
use kvroute_workload::stats::Distribution;
use prometheus::proto::{
    Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType, Quantile, Summary,
};
use prometheus::{Encoder, TextEncoder};

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.into());
    f.set_help(help.into());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

/// A summary in seconds from a distribution in milliseconds (NaN quantiles without data).
fn summary(name: &str, help: &str, d: &Distribution) -> MetricFamily {
    let mut s = Summary::default();
    let q = |quantile: f64, v: Option<f64>| {
        let mut q = Quantile::default();
        q.set_quantile(quantile);
        q.set_value(v.map_or(f64::NAN, |ms| ms / 1e3));
        q
    };
    s.set_quantile(vec![q(0.5, d.p50), q(0.95, d.p95)]);
    s.set_sample_count(d.count);
    s.set_sample_sum(d.mean.map_or(0.0, |m| m * d.count as f64 / 1e3));
    let mut m = Metric::default();
    m.set_summary(s);
    family(name, help, MetricType::SUMMARY, vec![m])
}

fn gauge(name: &str, help: &str, v: f64) -> MetricFamily {
    let mut g = Gauge::default();
    g.set_value(v);
    family(name, help, MetricType::GAUGE, vec![Metric::from_gauge(g)])
}

fn counter(name: &str, help: &str, values: &[(&str, &str, u64)]) -> MetricFamily {
    let metrics = values
        .iter()
        .map(|&(label, value, n)| {
            let mut c = Counter::default();
            c.set_value(n as f64);
            let mut m = if label.is_empty() {
                Metric::default()
            } else {
                let mut l = LabelPair::default();
                l.set_name(label.into());
                l.set_value(value.into());
                Metric::from_label(vec![l])
            };
            m.set_counter(c);
            m
        })
        .collect();
    family(name, help, MetricType::COUNTER, metrics)
}

/// The metrics in Prometheus text format.
pub fn render(stats: &LiveStats) -> String {
    let w = &stats.window.summary;
    let t = &stats.totals;
    let families = vec![
        summary(
            "loadgen_ttft_all_seconds",
            "Time to first token of completed requests over the rolling window, client side",
            &w.ttft_ms,
        ),
        summary(
            "loadgen_tpot_all_seconds",
            "Time per output token after the first over the rolling window",
            &w.tpot_ms,
        ),
        summary(
            "loadgen_itl_all_seconds",
            "Gaps between streamed tokens over the rolling window, client side",
            &w.itl_ms,
        ),
        summary(
            "loadgen_e2e_all_seconds",
            "End-to-end latency of completed requests over the rolling window",
            &w.e2e_ms,
        ),
        counter(
            "loadgen_requests_total",
            "Requests that ended since the load started, by outcome",
            &[
                ("status", "completed", t.completed),
                ("status", "failed", t.failed),
                ("status", "rejected", t.rejected),
                ("status", "cancelled", t.cancelled),
            ],
        ),
        counter(
            "loadgen_output_tokens_total",
            "Output tokens of completed requests since the load started",
            &[("", "", t.output_tokens)],
        ),
        gauge(
            "loadgen_inflight_requests",
            "Requests in flight",
            t.in_flight as f64,
        ),
        gauge(
            "loadgen_active_conversations",
            "Conversations under way",
            stats.active_conversations as f64,
        ),
        gauge(
            "loadgen_concurrency",
            "Conversations the closed loop keeps in flight",
            stats.concurrency as f64,
        ),
        gauge(
            "loadgen_running",
            "1 while the load runs",
            f64::from(u8::from(stats.running)),
        ),
        gauge(
            "loadgen_window_requests_per_second",
            "Completed requests per second over the rolling window",
            w.requests_per_s.unwrap_or(0.0),
        ),
        gauge(
            "loadgen_window_output_tokens_per_second",
            "Output tokens per second over the rolling window",
            w.output_tokens_per_s.unwrap_or(0.0),
        ),
        gauge(
            "loadgen_window_kv_hit_ratio",
            "Cached over input prompt tokens of completed requests over the rolling window",
            w.hit_rate.unwrap_or(f64::NAN),
        ),
    ];
    let mut out = Vec::new();
    // Encoding into memory cannot fail for well-formed families.
    if TextEncoder::new().encode(&families, &mut out).is_err() {
        return String::new();
    }
    String::from_utf8(out).unwrap_or_default()
}
