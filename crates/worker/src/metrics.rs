//! `GET /metrics`: the engine's metrics in the Prometheus / OpenMetrics text format, read
//! from the snapshot the driver keeps up to date (a prometheus-client collector, so a scrape
//! never waits for the engine).
//!
//! kvroute names (counters get the `_total` suffix OpenMetrics requires):
//! `kvroute_engine_running_requests`, `kvroute_engine_waiting_requests`,
//! `kvroute_engine_kv_usage_ratio`, `kvroute_engine_kv_blocks` (capacity),
//! `kvroute_engine_cached_blocks`, `kvroute_engine_busy_ratio` (virtual seconds spent in
//! steps over virtual seconds elapsed since start), and the counters
//! `kvroute_engine_queue_time_seconds_total` (seconds admitted requests waited before their
//! first step; divide by `kvroute_engine_admitted_requests_total` for the mean),
//! `kvroute_engine_prefix_cache_hit_tokens_total`, `kvroute_engine_prompt_tokens_total`,
//! `kvroute_engine_generation_tokens_total`, `kvroute_engine_steps_total`,
//! `kvroute_engine_preemptions_total`.
//!
//! vLLM-compatible names, labelled `model_name` as vLLM does: the gauges
//! `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
//! (a fraction, as in vLLM) and the counters `vllm:prompt_tokens_total`,
//! `vllm:generation_tokens_total`, `vllm:prefix_cache_queries_total`,
//! `vllm:prefix_cache_hits_total`.

use crate::clock::Clock;
use kvroute_engine::EngineMetrics;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeMetric,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex};

/// The content type of the answer.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The registry of a worker.
pub(crate) struct Metrics {
    registry: Registry,
}

impl Metrics {
    /// Metrics read from `snapshot`; `model` labels the vLLM names.
    pub(crate) fn new(snapshot: Arc<Mutex<EngineMetrics>>, clock: Clock, model: String) -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(EngineCollector {
            snapshot,
            clock,
            model,
        }));
        Self { registry }
    }

    /// The text exposition.
    pub(crate) fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[derive(Debug)]
struct EngineCollector {
    snapshot: Arc<Mutex<EngineMetrics>>,
    clock: Clock,
    model: String,
}

fn gauge<N: EncodeGaugeValue + std::fmt::Debug>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: N,
) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

fn counter<N: EncodeCounterValue + std::fmt::Debug>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: N,
) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

/// A sample of a vLLM-named metric.
enum Sample {
    Gauge(f64),
    Count(i64),
    Counter(u64),
}

impl EngineCollector {
    fn labelled(
        &self,
        enc: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        v: Sample,
    ) -> std::fmt::Result {
        let labels = [("model_name", self.model.as_str())];
        match v {
            Sample::Counter(v) => {
                let c = ConstCounter::new(v);
                let mut m = enc.encode_descriptor(name, help, None, c.metric_type())?;
                c.encode(m.encode_family(&labels)?)
            }
            Sample::Gauge(v) => {
                let g = ConstGauge::new(v);
                let mut m = enc.encode_descriptor(name, help, None, g.metric_type())?;
                g.encode(m.encode_family(&labels)?)
            }
            Sample::Count(v) => {
                let g = ConstGauge::new(v);
                let mut m = enc.encode_descriptor(name, help, None, g.metric_type())?;
                g.encode(m.encode_family(&labels)?)
            }
        }
    }
}

impl Collector for EngineCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let m = self
            .snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let elapsed = self.clock.now().as_secs_f64();
        let busy = if elapsed > 0.0 {
            (m.busy_secs_total / elapsed).clamp(0.0, 1.0)
        } else {
            0.0
        };
        let e = &mut enc;
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        gauge(
            e,
            "kvroute_engine_running_requests",
            "Sequences running.",
            count(m.running),
        )?;
        gauge(
            e,
            "kvroute_engine_waiting_requests",
            "Requests waiting.",
            count(m.waiting),
        )?;
        gauge(
            e,
            "kvroute_engine_kv_usage_ratio",
            "Fraction of KV blocks in use.",
            m.kv_usage,
        )?;
        gauge(
            e,
            "kvroute_engine_kv_blocks",
            "KV blocks in all.",
            count(m.kv_blocks),
        )?;
        gauge(
            e,
            "kvroute_engine_cached_blocks",
            "Distinct blocks cached.",
            count(m.cached_blocks),
        )?;
        gauge(
            e,
            "kvroute_engine_busy_ratio",
            "Virtual seconds in steps over virtual seconds elapsed.",
            busy,
        )?;
        counter(
            e,
            "kvroute_engine_queue_time_seconds",
            "Seconds admitted requests waited before their first step.",
            m.queue_secs_total,
        )?;
        let counters = [
            (
                "kvroute_engine_admitted_requests",
                "Requests admitted.",
                m.admitted_total,
            ),
            (
                "kvroute_engine_prefix_cache_hit_tokens",
                "Prompt tokens found in the prefix cache.",
                m.prefix_hit_tokens_total,
            ),
            (
                "kvroute_engine_prompt_tokens",
                "Prompt tokens of admitted requests.",
                m.prompt_tokens_total,
            ),
            (
                "kvroute_engine_generation_tokens",
                "Tokens generated.",
                m.generated_tokens_total,
            ),
            ("kvroute_engine_steps", "Engine steps.", m.steps_total),
            (
                "kvroute_engine_preemptions",
                "Preemptions.",
                m.preemptions_total,
            ),
        ];
        for (name, help, v) in counters {
            counter(e, name, help, v)?;
        }
        let vllm = [
            (
                "vllm:num_requests_running",
                "Requests running.",
                Sample::Count(count(m.running)),
            ),
            (
                "vllm:num_requests_waiting",
                "Requests waiting.",
                Sample::Count(count(m.waiting)),
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV cache usage (1 = full).",
                Sample::Gauge(m.kv_usage),
            ),
            (
                "vllm:prompt_tokens",
                "Prompt tokens.",
                Sample::Counter(m.prompt_tokens_total),
            ),
            (
                "vllm:generation_tokens",
                "Generation tokens.",
                Sample::Counter(m.generated_tokens_total),
            ),
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in tokens.",
                Sample::Counter(m.prompt_tokens_total),
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in tokens.",
                Sample::Counter(m.prefix_hit_tokens_total),
            ),
        ];
        for (name, help, v) in vllm {
            self.labelled(e, name, help, v)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_line_is_name_labels_value() {
        let snap = Arc::new(Mutex::new(EngineMetrics {
            running: 2,
            kv_blocks: 10,
            prompt_tokens_total: 7,
            ..EngineMetrics::default()
        }));
        let text = Metrics::new(snap, Clock::new(1.0), "m".into())
            .render()
            .unwrap();
        assert!(
            text.contains("kvroute_engine_running_requests 2\n"),
            "{text}"
        );
        assert!(
            text.contains("kvroute_engine_prompt_tokens_total 7\n"),
            "{text}"
        );
        assert!(
            text.contains("vllm:num_requests_running{model_name=\"m\"} 2\n"),
            "{text}"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = line.rsplit_once(' ').unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
            assert!(!name.is_empty(), "{line}");
        }
    }
}
