//! The gateway's Prometheus metrics (names of the design's metrics section), in the classic
//! text exposition format that `promtool check metrics` accepts.

use prometheus::{
    exponential_buckets, Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Every metric of the gateway.
pub struct Metrics {
    registry: Registry,
    /// Requests answered, by model and HTTP status.
    pub requests: IntCounterVec,
    /// Requests being served (dispatched, not finished).
    pub inflight: IntGauge,
    /// Requests waiting in the admission queue.
    pub queued: IntGauge,
    /// Requests rejected, by reason.
    pub rejected: IntCounterVec,
    /// Requests refused, by tenant, class and reason (tenants and classes are the
    /// configured ones and the defaults: a bounded set).
    pub flow_refused: IntCounterVec,
    /// Config reloads, by result (`applied`, `partial`, `unchanged`, `invalid`).
    pub config_reloads: IntCounterVec,
    /// Prompt tokens per request.
    pub input_tokens: Histogram,
    /// Cached prompt tokens per request, as the engine reported them.
    pub cached_tokens: Histogram,
    /// Generated tokens per request.
    pub output_tokens: Histogram,
    /// Generated tokens in all.
    pub output_tokens_total: IntCounter,
    /// Seconds from arrival to the end of the answer.
    pub duration: Histogram,
    /// Seconds from arrival to the first token.
    pub ttft: Histogram,
    /// Time to first token by the request's class (`router.admission.flow`'s, or
    /// `default`).
    pub class_ttft: HistogramVec,
    /// Seconds between tokens (stream chunks) of a stream.
    pub itl: Histogram,
    /// Requests in flight per worker (the router's ledger).
    pub worker_inflight: IntGaugeVec,
    /// Outstanding prefill tokens per worker (the router's ledger).
    pub worker_prefill: IntGaugeVec,
    /// 1 when the worker is up.
    pub worker_up: IntGaugeVec,
    /// Routing decisions, by policy and worker.
    pub decisions: IntCounterVec,
    /// Seconds spent preprocessing and routing a request.
    pub routing_duration: Histogram,
    /// KV events, by worker, type and result.
    pub kv_events: IntCounterVec,
    /// Blocks the index holds per worker.
    pub index_blocks: IntGaugeVec,
    /// Blocks the index dropped because it was full, per worker.
    pub index_evicted: IntCounterVec,
    /// Blocks engines moved to an offloaded tier, per worker and tier.
    pub offloaded_blocks: IntGaugeVec,
    /// 1 for each worker's current cache state (exact, catching_up, unknown, approximate).
    pub cache_state: IntGaugeVec,
    /// 1 for each worker's role in a disaggregated fleet (both, prefill, decode).
    pub worker_role: IntGaugeVec,
    /// Prefill legs of split requests, by prefill worker and result (`ok`, `failed`: the
    /// decode worker then computed the prompt).
    pub prefill_legs: IntCounterVec,
    /// Workers per role.
    pub pool_workers: IntGaugeVec,
    /// Requests in flight on each role's workers together.
    pub pool_inflight: IntGaugeVec,
    /// Outstanding prefill tokens of each role's workers together.
    pub pool_prefill: IntGaugeVec,
    /// Engine restarts seen on a worker's event stream.
    pub event_restarts: IntCounterVec,
    /// Times a worker's event publisher came back after going away.
    pub event_resubscribes: IntCounterVec,
    /// Prompt tokens the router expected the chosen worker to have cached.
    pub predicted_cached_tokens: Histogram,
    /// Predictions against the engine's report, by worker and outcome (exact, over, under).
    pub predictions: IntCounterVec,
    /// Absolute prediction error in tokens, by worker.
    pub prediction_error: HistogramVec,
    /// Share of exact predictions in the worker's recent window.
    pub prediction_exact_ratio: GaugeVec,
    /// 1 while the worker's predictions are degraded, by reason.
    pub prediction_degraded: IntGaugeVec,
    /// Index repairs the accuracy loop started, by worker and reason.
    pub prediction_repairs: IntCounterVec,
    /// Unknown indexes taken as whole again (the accuracy loop agreed over a window since
    /// the loss), by worker.
    pub index_heals: IntCounterVec,
    /// Requests whose prompt the engine counted differently than the gateway, by worker.
    pub prompt_token_mismatches: IntCounterVec,
    /// Requests retried on another worker after a failure before the first byte.
    pub retries: IntCounter,
    /// Failed calls to workers, by worker and kind.
    pub upstream_errors: IntCounterVec,
    /// The endpoint picker's streams (one per request), by result (`routed`, `refused`,
    /// `other` for requests it does not route, `busy` over `epp.max_streams`).
    pub epp_streams: IntCounterVec,
    /// Streams that broke off after their first byte, by what became of them (`migrated`,
    /// `failed`, `limit`, `off`, `unsupported`, `complete`).
    pub migrations: IntCounterVec,
    /// Other gateway replicas sharing their load over the event plane.
    pub peer_replicas: IntGauge,
    /// Their requests in flight, counted in the workers' load.
    pub peer_inflight: IntGauge,
    /// Load messages, by result (`applied`, `undecodable`, `gap`, `dropped`, `unknown_worker`,
    /// `refused`).
    pub peer_messages: IntCounterVec,
    /// Seconds from a peer sending a load message to this gateway reading it (by the two
    /// machines' clocks).
    pub peer_load_delay: Histogram,
    /// Seconds a burst's later request waited for its replica's turn
    /// (`router.peer_hold_secs`); its count is the requests held.
    pub peer_hold: Histogram,
}

fn token_buckets() -> Vec<f64> {
    // 1 .. ~1M tokens.
    exponential_buckets(1.0, 2.0, 21).unwrap_or_default()
}

fn second_buckets() -> Vec<f64> {
    // 100 µs .. ~200 s.
    exponential_buckets(0.0001, 2.0, 22).unwrap_or_default()
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(c.clone()))?;
            Ok::<_, prometheus::Error>(c)
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, prometheus::Error>(g)
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help)?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, prometheus::Error>(g)
        };
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help)?;
            registry.register(Box::new(c.clone()))?;
            Ok::<_, prometheus::Error>(c)
        };
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))?;
            registry.register(Box::new(h.clone()))?;
            Ok::<_, prometheus::Error>(h)
        };
        let histogram_vec = |name: &str, help: &str, buckets: Vec<f64>, labels: &[&str]| {
            let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)?;
            registry.register(Box::new(h.clone()))?;
            Ok::<_, prometheus::Error>(h)
        };
        let m = Self {
            requests: counter_vec(
                "kvroute_requests_total",
                "Requests answered, by model and HTTP status.",
                &["model", "status"],
            )?,
            inflight: gauge(
                "kvroute_inflight_requests",
                "Requests dispatched to a worker and not finished.",
            )?,
            queued: gauge(
                "kvroute_queued_requests",
                "Requests waiting in the admission queue.",
            )?,
            rejected: counter_vec(
                "kvroute_rejected_requests_total",
                "Requests rejected by admission or for want of a worker, by reason.",
                &["reason"],
            )?,
            flow_refused: counter_vec(
                "kvroute_flow_refused_total",
                "Requests refused, by tenant, class and reason (docs/flow-control.md).",
                &["tenant", "class", "reason"],
            )?,
            config_reloads: counter_vec(
                "kvroute_config_reloads_total",
                "Config reloads (SIGHUP, a changed file), by result: applied, partial (some changed settings wait for a restart), unchanged, invalid (refused whole).",
                &["result"],
            )?,
            input_tokens: histogram(
                "kvroute_input_tokens",
                "Prompt tokens per request.",
                token_buckets(),
            )?,
            cached_tokens: histogram(
                "kvroute_cached_tokens",
                "Cached prompt tokens per request, as reported by the engine.",
                token_buckets(),
            )?,
            output_tokens: histogram(
                "kvroute_output_tokens",
                "Generated tokens per request.",
                token_buckets(),
            )?,
            output_tokens_total: counter(
                "kvroute_output_tokens_total",
                "Generated tokens in all.",
            )?,
            duration: histogram(
                "kvroute_request_duration_seconds",
                "Seconds from a request's arrival to the end of its answer.",
                second_buckets(),
            )?,
            ttft: histogram(
                "kvroute_time_to_first_token_seconds",
                "Seconds from a request's arrival to its first token.",
                second_buckets(),
            )?,
            class_ttft: histogram_vec(
                "kvroute_class_time_to_first_token_seconds",
                "Seconds from a request's arrival to its first token, by its class (docs/flow-control.md).",
                second_buckets(),
                &["class"],
            )?,
            itl: histogram(
                "kvroute_inter_token_latency_seconds",
                "Seconds between consecutive stream chunks carrying tokens.",
                second_buckets(),
            )?,
            worker_inflight: gauge_vec(
                "kvroute_worker_inflight_requests",
                "Requests in flight per worker, as the router booked them.",
                &["worker"],
            )?,
            worker_prefill: gauge_vec(
                "kvroute_worker_outstanding_prefill_tokens",
                "Uncached prompt tokens per worker whose first token has not arrived.",
                &["worker"],
            )?,
            worker_up: gauge_vec(
                "kvroute_worker_up",
                "1 when the worker takes requests, 0 when it was taken out.",
                &["worker"],
            )?,
            decisions: counter_vec(
                "kvroute_routing_decisions_total",
                "Requests dispatched, by policy and worker.",
                &["policy", "worker"],
            )?,
            routing_duration: histogram(
                "kvroute_routing_duration_seconds",
                "Seconds spent preprocessing and routing a request (queueing excluded).",
                exponential_buckets(0.000_001, 2.0, 24).unwrap_or_default(),
            )?,
            kv_events: counter_vec(
                "kvroute_kv_events_total",
                "KV events received, by worker, type and result.",
                &["worker", "type", "result"],
            )?,
            index_blocks: gauge_vec(
                "kvroute_index_blocks",
                "Blocks the prefix index holds per worker.",
                &["worker"],
            )?,
            index_evicted: counter_vec(
                "kvroute_index_evicted_blocks_total",
                "Blocks dropped from the prefix index (any tier) to keep a worker under router.max_blocks_per_worker.",
                &["worker"],
            )?,
            offloaded_blocks: gauge_vec(
                "kvroute_offloaded_blocks",
                "Blocks a worker's engine moved out of device memory and can load back, by tier (host, disk).",
                &["worker", "tier"],
            )?,
            cache_state: gauge_vec(
                "kvroute_worker_cache_state",
                "1 for the worker's cache state: exact (every event applied), catching_up, unknown (events lost or publisher away), approximate (no events).",
                &["worker", "state"],
            )?,
            worker_role: gauge_vec(
                "kvroute_worker_role",
                "1 for the worker's role in a disaggregated fleet: both (serves requests whole), prefill, decode.",
                &["worker", "role"],
            )?,
            prefill_legs: counter_vec(
                "kvroute_prefill_legs_total",
                "Prefill legs of split requests (disaggregated prefill), by prefill worker and result: ok, or failed (the decode worker then computed the prompt).",
                &["worker", "result"],
            )?,
            pool_workers: gauge_vec(
                "kvroute_pool_workers",
                "Workers of each role (both, prefill, decode).",
                &["role"],
            )?,
            pool_inflight: gauge_vec(
                "kvroute_pool_inflight_requests",
                "Requests in flight on the workers of each role together (the router's ledger).",
                &["role"],
            )?,
            pool_prefill: gauge_vec(
                "kvroute_pool_outstanding_prefill_tokens",
                "Uncached prompt tokens without a first token yet on the workers of each role together.",
                &["role"],
            )?,
            event_restarts: counter_vec(
                "kvroute_kv_event_restarts_total",
                "Engine restarts seen on the worker's KV event stream (its index rebuilt).",
                &["worker"],
            )?,
            event_resubscribes: counter_vec(
                "kvroute_kv_event_resubscribes_total",
                "Times the worker's KV event publisher came back after going away.",
                &["worker"],
            )?,
            predicted_cached_tokens: histogram(
                "kvroute_predicted_cached_tokens",
                "Prompt tokens the router expected the chosen worker to have cached.",
                token_buckets(),
            )?,
            predictions: counter_vec(
                "kvroute_predictions_total",
                "Predicted cached tokens against the engine's reported cached tokens, by worker and outcome (exact within a block, over, under).",
                &["worker", "result"],
            )?,
            prediction_error: histogram_vec(
                "kvroute_prediction_error_tokens",
                "Absolute difference between predicted and engine-reported cached tokens, by worker.",
                token_buckets(),
                &["worker"],
            )?,
            prediction_exact_ratio: {
                let g = GaugeVec::new(
                    Opts::new(
                        "kvroute_worker_prediction_exact_ratio",
                        "Share of exact predictions in the worker's recent window.",
                    ),
                    &["worker"],
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            prediction_degraded: gauge_vec(
                "kvroute_worker_prediction_degraded",
                "1 while the worker's predictions are degraded, by reason (over_predicting, under_predicting, token_counts_differ).",
                &["worker", "reason"],
            )?,
            prediction_repairs: counter_vec(
                "kvroute_prediction_repairs_total",
                "Index rebuilds the accuracy loop started, by worker and reason.",
                &["worker", "reason"],
            )?,
            index_heals: counter_vec(
                "kvroute_index_heals_total",
                "Workers whose index, unknown after lost KV events, was taken as exact again because a whole window of predictions since agreed with the engine, by worker.",
                &["worker"],
            )?,
            prompt_token_mismatches: counter_vec(
                "kvroute_prompt_token_mismatches_total",
                "Requests whose prompt tokens the engine counted differently than the gateway (another tokenizer or chat template), by worker.",
                &["worker"],
            )?,
            retries: counter(
                "kvroute_retries_total",
                "Requests retried on another worker after failing before their first byte.",
            )?,
            upstream_errors: counter_vec(
                "kvroute_upstream_errors_total",
                "Failed calls to workers, by worker and kind.",
                &["worker", "kind"],
            )?,
            epp_streams: counter_vec(
                "kvroute_epp_streams_total",
                "The endpoint picker's ext_proc streams (one per request), by result.",
                &["result"],
            )?,
            peer_replicas: gauge(
                "kvroute_peer_replicas",
                "Other gateway replicas sharing their load over the event plane.",
            )?,
            peer_inflight: gauge(
                "kvroute_peer_inflight_requests",
                "Requests in flight of other gateway replicas, counted in the workers' load.",
            )?,
            peer_messages: counter_vec(
                "kvroute_peer_load_messages_total",
                "Load sharing between gateway replicas: messages and operations, by result.",
                &["result"],
            )?,
            peer_load_delay: histogram(
                "kvroute_peer_load_delay_seconds",
                "Seconds from a peer gateway sending its bookings to this one reading them.",
                exponential_buckets(25e-6, 2.0, 16)?,
            )?,
            peer_hold: histogram(
                "kvroute_peer_hold_seconds",
                "Seconds a request of a burst waited for this replica's turn, so that it is routed with the peers' bookings of the burst seen (router.peer_hold_secs).",
                exponential_buckets(25e-6, 2.0, 16)?,
            )?,
            migrations: counter_vec(
                "kvroute_migrations_total",
                "Streams that broke off after their first byte, by what became of them: migrated (carried on by another worker), failed (no worker could), limit (upstream.migration_limit reached), off (the request opted out or the limit is 0), unsupported (the answer cannot be continued), complete (every token had been sent).",
                &["result"],
            )?,
            registry,
        };
        // Every reason shows from the start (at 0), so dashboards see a series before the
        // first rejection.
        for r in kvroute_core::RejectReason::ALL {
            m.rejected.with_label_values(&[r.as_str()]);
        }
        Ok(m)
    }

    /// Drops every series of worker `name` (it left the fleet: a dashboard must not keep
    /// showing its last values).
    pub fn forget_worker(&self, name: &str) {
        forget(&self.worker_inflight, name);
        forget(&self.worker_prefill, name);
        forget(&self.worker_up, name);
        forget(&self.decisions, name);
        forget(&self.kv_events, name);
        forget(&self.index_blocks, name);
        forget(&self.index_evicted, name);
        forget(&self.offloaded_blocks, name);
        forget(&self.cache_state, name);
        forget(&self.worker_role, name);
        forget(&self.prefill_legs, name);
        forget(&self.event_restarts, name);
        forget(&self.event_resubscribes, name);
        forget(&self.predictions, name);
        forget(&self.prediction_error, name);
        forget(&self.prediction_exact_ratio, name);
        forget(&self.prediction_degraded, name);
        forget(&self.prediction_repairs, name);
        forget(&self.index_heals, name);
        forget(&self.prompt_token_mismatches, name);
        forget(&self.upstream_errors, name);
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        render(vec![self.gather_pool(None, true)])
    }

    /// Every metric's samples; with `model` (one pool's of a gateway serving several),
    /// each series without a `model` label gets `model="<model>"`, but for the
    /// [`GATEWAY_WIDE`] ones: the first pool's are the gateway's, unlabelled, the others'
    /// are left out (`first` false).
    pub fn gather_pool(
        &self,
        model: Option<&str>,
        first: bool,
    ) -> Vec<prometheus::proto::MetricFamily> {
        let mut families = self.registry.gather();
        let Some(model) = model else {
            return families;
        };
        families.retain(|f| first || !GATEWAY_WIDE.contains(&f.name()));
        for f in families
            .iter_mut()
            .filter(|f| !GATEWAY_WIDE.contains(&f.name()))
        {
            for m in f.mut_metric() {
                if m.get_label().iter().all(|l| l.name() != "model") {
                    let mut labels = m.take_label();
                    let mut pair = prometheus::proto::LabelPair::default();
                    pair.set_name("model".into());
                    pair.set_value(model.into());
                    labels.insert(0, pair);
                    m.set_label(labels);
                }
            }
        }
        families
    }
}

/// Metrics of the gateway as a whole, not of one pool: counted by the first pool's, shown
/// without a `model` label.
pub const GATEWAY_WIDE: &[&str] = &["kvroute_config_reloads_total"];

/// The text exposition of several registries' metrics (each pool's), a metric's series
/// from all of them under one name.
pub fn render(sets: Vec<Vec<prometheus::proto::MetricFamily>>) -> String {
    let mut merged: Vec<prometheus::proto::MetricFamily> = Vec::new();
    for set in sets {
        for mut f in set {
            match merged.iter_mut().find(|m| m.name() == f.name()) {
                Some(m) => m.mut_metric().extend(f.take_metric()),
                None => merged.push(f),
            }
        }
    }
    let mut buf = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&merged, &mut buf) {
        tracing::error!(error = %e, "encoding metrics failed");
    }
    String::from_utf8(buf).unwrap_or_default()
}

/// Removes the series of `v` whose `worker` label is `name`.
fn forget<T: prometheus::core::MetricVecBuilder>(v: &prometheus::core::MetricVec<T>, name: &str) {
    use prometheus::core::Collector;
    for family in v.collect() {
        for m in family.get_metric() {
            let labels: std::collections::HashMap<&str, &str> = m
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            if labels.get("worker") == Some(&name) {
                let _ = v.remove(&labels);
            }
        }
    }
}
