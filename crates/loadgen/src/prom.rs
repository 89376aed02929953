//! The load generator's Prometheus metrics, rendered from its live statistics: summaries of
//! TTFT, TPOT, ITL and end-to-end latency over the rolling window (`loadgen_ttft_all_seconds`
//! and `loadgen_tpot_all_seconds` with quantiles 0.5 and 0.95, as the reference dashboards
//! query; they cover completed requests), `loadgen_ttft_sent_seconds` over every request sent
//! (a failed or refused one counting as an infinite TTFT, so shedding cannot pass for speed),
//! request counters by outcome, and gauges of the load's state. Every series of an arm
//! carries its `arm` label (`live` for a load with one target; the demo's arms are named by
//! their policy).

use crate::service::{ArmStats, LiveStats};
use kvroute_workload::stats::{AllSentTtft, Distribution};
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

fn labels(pairs: &[(&str, &str)]) -> Metric {
    Metric::from_label(
        pairs
            .iter()
            .map(|&(k, v)| {
                let mut l = LabelPair::default();
                l.set_name(k.into());
                l.set_value(v.into());
                l
            })
            .collect(),
    )
}

/// A summary in seconds of quantiles given in milliseconds (NaN without data).
fn summary_metric(arm: &str, quantiles: &[(f64, Option<f64>)], count: u64, sum_ms: f64) -> Metric {
    let mut s = Summary::default();
    s.set_quantile(
        quantiles
            .iter()
            .map(|&(quantile, v)| {
                let mut q = Quantile::default();
                q.set_quantile(quantile);
                q.set_value(v.map_or(f64::NAN, |ms| ms / 1e3));
                q
            })
            .collect(),
    );
    s.set_sample_count(count);
    s.set_sample_sum(sum_ms / 1e3);
    let mut m = labels(&[("arm", arm)]);
    m.set_summary(s);
    m
}

fn distribution(arm: &str, d: &Distribution) -> Metric {
    let sum = d.mean.map_or(0.0, |m| m * d.count as f64);
    summary_metric(arm, &[(0.5, d.p50), (0.95, d.p95)], d.count, sum)
}

/// The all-sent TTFT (infinite for a request that never got a first token); its sum is not
/// finite once one failed, so it carries the completed requests' sum.
fn all_sent(arm: &str, a: &AllSentTtft, sent: u64, completed: &Distribution) -> Metric {
    let sum = completed.mean.map_or(0.0, |m| m * completed.count as f64);
    summary_metric(
        arm,
        &[(0.5, a.p50), (0.95, a.p95), (0.99, a.p99)],
        sent,
        sum,
    )
}

fn gauge(arm: &str, v: f64) -> Metric {
    let mut g = Gauge::default();
    g.set_value(v);
    let mut m = labels(&[("arm", arm)]);
    m.set_gauge(g);
    m
}

fn counter(pairs: &[(&str, &str)], n: u64) -> Metric {
    let mut c = Counter::default();
    c.set_value(n as f64);
    let mut m = labels(pairs);
    m.set_counter(c);
    m
}

/// One family with a metric per arm.
fn per_arm(
    arms: &[ArmStats],
    name: &str,
    help: &str,
    kind: MetricType,
    f: impl Fn(&ArmStats) -> Vec<Metric>,
) -> MetricFamily {
    family(name, help, kind, arms.iter().flat_map(f).collect())
}

/// The metrics in Prometheus text format.
pub fn render(stats: &LiveStats) -> String {
    use MetricType::{COUNTER, GAUGE, SUMMARY};
    let a = &stats.arms;
    let families = vec![
        per_arm(
            a,
            "loadgen_ttft_all_seconds",
            "Time to first token of completed requests over the rolling window, client side",
            SUMMARY,
            |x| vec![distribution(&x.name, &x.window.summary.ttft_ms)],
        ),
        per_arm(
            a,
            "loadgen_ttft_sent_seconds",
            "Time to first token of every request sent over the rolling window, a failed or refused one counting as infinite",
            SUMMARY,
            |x| {
                let w = &x.window.summary;
                vec![all_sent(&x.name, &w.ttft_all_ms, w.sent, &w.ttft_ms)]
            },
        ),
        per_arm(
            a,
            "loadgen_tpot_all_seconds",
            "Time per output token after the first over the rolling window",
            SUMMARY,
            |x| vec![distribution(&x.name, &x.window.summary.tpot_ms)],
        ),
        per_arm(
            a,
            "loadgen_itl_all_seconds",
            "Gaps between streamed tokens over the rolling window, client side",
            SUMMARY,
            |x| vec![distribution(&x.name, &x.window.summary.itl_ms)],
        ),
        per_arm(
            a,
            "loadgen_e2e_all_seconds",
            "End-to-end latency of completed requests over the rolling window",
            SUMMARY,
            |x| vec![distribution(&x.name, &x.window.summary.e2e_ms)],
        ),
        per_arm(
            a,
            "loadgen_requests_total",
            "Requests that ended since the load started, by outcome",
            COUNTER,
            |x| {
                let t = &x.totals;
                [
                    ("completed", t.completed),
                    ("failed", t.failed),
                    ("rejected", t.rejected),
                    ("cancelled", t.cancelled),
                ]
                .iter()
                .map(|&(status, n)| counter(&[("arm", &x.name), ("status", status)], n))
                .collect()
            },
        ),
        per_arm(
            a,
            "loadgen_output_tokens_total",
            "Output tokens of completed requests since the load started",
            COUNTER,
            |x| vec![counter(&[("arm", &x.name)], x.totals.output_tokens)],
        ),
        per_arm(
            a,
            "loadgen_inflight_requests",
            "Requests in flight",
            GAUGE,
            |x| vec![gauge(&x.name, x.totals.in_flight as f64)],
        ),
        per_arm(
            a,
            "loadgen_active_conversations",
            "Conversations under way",
            GAUGE,
            |x| vec![gauge(&x.name, x.active_conversations as f64)],
        ),
        per_arm(
            a,
            "loadgen_concurrency",
            "Conversations the closed loop keeps in flight",
            GAUGE,
            |x| vec![gauge(&x.name, stats.concurrency as f64)],
        ),
        per_arm(a, "loadgen_running", "1 while the load runs", GAUGE, |x| {
            vec![gauge(&x.name, f64::from(u8::from(stats.running)))]
        }),
        per_arm(
            a,
            "loadgen_window_requests_per_second",
            "Completed requests per second over the rolling window",
            GAUGE,
            |x| {
                vec![gauge(
                    &x.name,
                    x.window.summary.requests_per_s.unwrap_or(0.0),
                )]
            },
        ),
        per_arm(
            a,
            "loadgen_window_output_tokens_per_second",
            "Output tokens per second over the rolling window",
            GAUGE,
            |x| {
                let v = x.window.summary.output_tokens_per_s.unwrap_or(0.0);
                vec![gauge(&x.name, v)]
            },
        ),
        per_arm(
            a,
            "loadgen_window_kv_hit_ratio",
            "Cached over input prompt tokens of completed requests over the rolling window",
            GAUGE,
            |x| {
                vec![gauge(
                    &x.name,
                    x.window.summary.hit_rate.unwrap_or(f64::NAN),
                )]
            },
        ),
    ];
    let mut out = Vec::new();
    // Encoding into memory cannot fail for well-formed families.
    if TextEncoder::new().encode(&families, &mut out).is_err() {
        return String::new();
    }
    String::from_utf8(out).unwrap_or_default()
}
