//! `GET /metrics`: the engine's metrics in the Prometheus text format, read from the snapshot
//! the driver keeps up to date (a scrape never waits for the engine): at each scrape the
//! gauges are set and the counters brought up to the snapshot's totals.
//!
//! kvroute names: `kvroute_engine_running_requests`, `kvroute_engine_waiting_requests`,
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

use kvroute_engine::EngineMetrics;
use kvroute_runtime::Clock;
use parking_lot::Mutex;
use prometheus::{Counter, Encoder, Gauge, Opts, Registry, TextEncoder};
use std::sync::Arc;

/// The content type of the answer.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A figure of the snapshot (with the busy ratio computed at scrape time).
type Read = fn(&EngineMetrics, f64) -> f64;

/// The registry of a worker.
pub(crate) struct Metrics {
    registry: Registry,
    snapshot: Arc<Mutex<EngineMetrics>>,
    clock: Clock,
    gauges: Vec<(Gauge, Read)>,
    counters: Mutex<Vec<(Counter, Read)>>,
}

fn n(v: usize) -> f64 {
    v as f64
}

const GAUGES: [(&str, &str, Read); 6] = [
    (
        "kvroute_engine_running_requests",
        "Sequences running.",
        |m, _| n(m.running),
    ),
    (
        "kvroute_engine_waiting_requests",
        "Requests waiting.",
        |m, _| n(m.waiting),
    ),
    (
        "kvroute_engine_kv_usage_ratio",
        "Fraction of KV blocks in use.",
        |m, _| m.kv_usage,
    ),
    ("kvroute_engine_kv_blocks", "KV blocks in all.", |m, _| {
        n(m.kv_blocks)
    }),
    (
        "kvroute_engine_cached_blocks",
        "Distinct blocks cached.",
        |m, _| n(m.cached_blocks),
    ),
    (
        "kvroute_engine_busy_ratio",
        "Virtual seconds in steps over virtual seconds elapsed.",
        |_, busy| busy,
    ),
];

const COUNTERS: [(&str, &str, Read); 7] = [
    (
        "kvroute_engine_queue_time_seconds_total",
        "Seconds admitted requests waited before their first step.",
        |m, _| m.queue_secs_total,
    ),
    (
        "kvroute_engine_admitted_requests_total",
        "Requests admitted.",
        |m, _| m.admitted_total as f64,
    ),
    (
        "kvroute_engine_prefix_cache_hit_tokens_total",
        "Prompt tokens found in the prefix cache.",
        |m, _| m.prefix_hit_tokens_total as f64,
    ),
    (
        "kvroute_engine_prompt_tokens_total",
        "Prompt tokens of admitted requests.",
        |m, _| m.prompt_tokens_total as f64,
    ),
    (
        "kvroute_engine_generation_tokens_total",
        "Tokens generated.",
        |m, _| m.generated_tokens_total as f64,
    ),
    ("kvroute_engine_steps_total", "Engine steps.", |m, _| {
        m.steps_total as f64
    }),
    (
        "kvroute_engine_preemptions_total",
        "Preemptions.",
        |m, _| m.preemptions_total as f64,
    ),
];

const VLLM_GAUGES: [(&str, &str, Read); 3] = [
    ("vllm:num_requests_running", "Requests running.", |m, _| {
        n(m.running)
    }),
    ("vllm:num_requests_waiting", "Requests waiting.", |m, _| {
        n(m.waiting)
    }),
    (
        "vllm:kv_cache_usage_perc",
        "KV cache usage (1 = full).",
        |m, _| m.kv_usage,
    ),
];

const VLLM_COUNTERS: [(&str, &str, Read); 4] = [
    ("vllm:prompt_tokens_total", "Prompt tokens.", |m, _| {
        m.prompt_tokens_total as f64
    }),
    (
        "vllm:generation_tokens_total",
        "Generation tokens.",
        |m, _| m.generated_tokens_total as f64,
    ),
    (
        "vllm:prefix_cache_queries_total",
        "Prefix cache queries, in tokens.",
        |m, _| m.prompt_tokens_total as f64,
    ),
    (
        "vllm:prefix_cache_hits_total",
        "Prefix cache hits, in tokens.",
        |m, _| m.prefix_hit_tokens_total as f64,
    ),
];

impl Metrics {
    /// Metrics read from `snapshot`; `model` labels the vLLM names; `engine` gives
    /// `vllm:cache_config_info` (an info gauge of value 1 whose labels carry the block size and
    /// the number of KV blocks, as vLLM's does: what a router can learn the capacity from).
    pub(crate) fn new(
        snapshot: Arc<Mutex<EngineMetrics>>,
        clock: Clock,
        model: String,
        profile: &str,
        engine: &kvroute_engine::EngineConfig,
    ) -> Self {
        let registry = Registry::new();
        // Which engine this is (the dashboard's worker cards name it), as an info gauge.
        let who = Opts::new(
            "kvroute_engine_info",
            "The simulated engine: its profile and served model (value 1).",
        )
        .const_label("profile", profile.to_string())
        .const_label("model", model.clone());
        if let Ok(g) = Gauge::with_opts(who) {
            g.set(1.0);
            let _ = registry.register(Box::new(g));
        }
        let info = Opts::new(
            "vllm:cache_config_info",
            "Information of the KV cache config.",
        )
        .const_label("block_size", engine.block_size.to_string())
        .const_label("num_gpu_blocks", engine.num_gpu_blocks.to_string())
        .const_label("enable_prefix_caching", "True")
        .const_label("engine", "0");
        if let Ok(g) = Gauge::with_opts(info) {
            g.set(1.0);
            let _ = registry.register(Box::new(g));
        }
        let opts = |name: &str, help: &str, labelled: bool| {
            let o = Opts::new(name, help);
            if labelled {
                o.const_label("model_name", model.clone())
            } else {
                o
            }
        };
        let mut gauges = Vec::new();
        let mut counters = Vec::new();
        for (list, labelled) in [(&GAUGES[..], false), (&VLLM_GAUGES[..], true)] {
            for &(name, help, read) in list {
                // Names and labels are fixed and valid: registration cannot fail but for a
                // duplicate, which the lists do not have.
                if let Ok(g) = Gauge::with_opts(opts(name, help, labelled)) {
                    if registry.register(Box::new(g.clone())).is_ok() {
                        gauges.push((g, read));
                    }
                }
            }
        }
        for (list, labelled) in [(&COUNTERS[..], false), (&VLLM_COUNTERS[..], true)] {
            for &(name, help, read) in list {
                if let Ok(c) = Counter::with_opts(opts(name, help, labelled)) {
                    if registry.register(Box::new(c.clone())).is_ok() {
                        counters.push((c, read));
                    }
                }
            }
        }
        Self {
            registry,
            snapshot,
            clock,
            gauges,
            counters: Mutex::new(counters),
        }
    }

    /// The text exposition.
    pub(crate) fn render(&self) -> Result<String, prometheus::Error> {
        let m = self.snapshot.lock().clone();
        let elapsed = self.clock.now().as_secs_f64();
        let busy = if elapsed > 0.0 {
            (m.busy_secs_total / elapsed).clamp(0.0, 1.0)
        } else {
            0.0
        };
        for (g, read) in &self.gauges {
            g.set(read(&m, busy));
        }
        // One scrape at a time brings the counters up to the totals.
        let counters = self.counters.lock();
        for (c, read) in counters.iter() {
            let (want, have) = (read(&m, busy), c.get());
            if want < have {
                c.reset();
                c.inc_by(want);
            } else if want > have {
                c.inc_by(want - have);
            }
        }
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        drop(counters);
        String::from_utf8(buf).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_protocol::prometheus_text;

    #[test]
    fn every_sample_line_is_name_labels_value_and_counters_follow_the_snapshot() {
        let snap = Arc::new(Mutex::new(EngineMetrics {
            running: 2,
            kv_blocks: 10,
            prompt_tokens_total: 7,
            ..EngineMetrics::default()
        }));
        let engine = kvroute_engine::EngineConfig {
            block_size: 32,
            num_gpu_blocks: 500,
            ..kvroute_engine::EngineConfig::from_profile(
                &kvroute_engine::Profile::builtin("tiny").unwrap(),
            )
        };
        let metrics = Metrics::new(snap.clone(), Clock::new(1.0), "m".into(), "tiny", &engine);
        let text = metrics.render().unwrap();
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
        assert!(
            text.contains("kvroute_engine_info{model=\"m\",profile=\"tiny\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("vllm:cache_config_info{block_size=\"32\",enable_prefix_caching=\"True\",engine=\"0\",num_gpu_blocks=\"500\"} 1\n"),
            "{text}"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(prometheus_text::parse_line(line).is_some(), "{line}");
        }
        snap.lock().prompt_tokens_total = 12;
        let text = metrics.render().unwrap();
        assert!(
            text.contains("kvroute_engine_prompt_tokens_total 12\n"),
            "{text}"
        );
        assert!(
            text.contains("vllm:prompt_tokens_total{model_name=\"m\"} 12\n"),
            "{text}"
        );
    }
}
