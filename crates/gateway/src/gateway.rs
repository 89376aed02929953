//! One gateway's parts, built and wired in [`Gateway::new`]: the routing table and its
//! bookings, the registry and the workers' standing, event ingestion, the health checks, the
//! fleet, the preprocessor, models, calls to workers, metrics, settings and clock. Each part
//! gets only the others it needs; routing, the proxy and the edges take the whole.

use kvroute_core::flow::{Flow, Flows};
use kvroute_core::{QueueState, Router, Time};
use kvroute_fleet::bookings::{Bookings, Waiter};
use kvroute_fleet::capacity::Capacity;
use kvroute_fleet::clock::Clock;
use kvroute_fleet::config::GatewayConfig;
use kvroute_fleet::health::HealthChecks;
use kvroute_fleet::membership::Fleet;
use kvroute_fleet::metrics::Metrics;
use kvroute_fleet::models::Models;
use kvroute_fleet::registry::Registry;
use kvroute_fleet::sink::IndexSink;
use kvroute_fleet::table::RoutingTable;
use kvroute_fleet::upstream::Upstream;
use kvroute_fleet::workers::Workers;
use kvroute_preprocess::Preprocessor;
use std::sync::Arc;

/// Shared by every handler and background task.
pub struct Gateway {
    /// The settings (a reload swaps them: read them through [`Gateway::config`], once per
    /// use).
    config: parking_lot::RwLock<Arc<GatewayConfig>>,
    /// The router and the requests waiting for a free worker.
    pub(crate) table: Arc<RoutingTable<Waiter>>,
    /// Booking on the table: request ids, the in-flight count, load shared with replicas.
    pub(crate) bookings: Arc<Bookings>,
    /// The workers.
    pub(crate) registry: Arc<Registry>,
    /// What changes a worker's standing: taken out, back, verified, its predictions judged.
    pub(crate) workers: Arc<Workers>,
    /// What event ingestion and the event plane write through.
    pub(crate) sink: Arc<IndexSink>,
    /// Chat template and tokenizer (or approximate mode).
    pub(crate) preprocessor: Preprocessor,
    /// Calls to workers: the client, keys, timeouts.
    pub(crate) upstream: Arc<Upstream>,
    /// The model and adapter names served.
    pub(crate) models: Arc<Models>,
    /// What the health checks need.
    pub(crate) health: Arc<HealthChecks>,
    /// Metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// The policy's name (metric label).
    pub(crate) policy: &'static str,
    /// Where the gateway's times come from.
    pub(crate) clock: Clock,
    /// Workers joining and leaving.
    pub(crate) fleet: Arc<Fleet>,
    /// The tenants and classes requests are resolved against (`router.admission.flow`),
    /// and the admission queue's generation they are of (a reload swaps both, under the
    /// queue's lock: see [`Gateway::flows_at`]).
    flows: parking_lot::RwLock<(Arc<Flows>, u32)>,
}

impl Gateway {
    /// The state for `config` (checked) with `preprocessor`, on `clock`.
    pub fn new(
        config: GatewayConfig,
        preprocessor: Preprocessor,
        router: Router,
        client: reqwest::Client,
        metrics: Metrics,
        clock: Clock,
    ) -> Self {
        let registry = Arc::new(Registry::new(&config.workers));
        let metrics = Arc::new(metrics);
        let models = Arc::new(Models::new(
            config.models.clone(),
            config.lora_adapters.clone(),
        ));
        let upstream = Arc::new(Upstream::new(client, &config));
        let table = Arc::new(RoutingTable::new(router, metrics.queued.clone()));
        let bookings = Arc::new(Bookings::new(
            table.clone(),
            clock,
            metrics.inflight.clone(),
        ));
        let workers = Arc::new(Workers::new(
            registry.clone(),
            table.clone(),
            metrics.clone(),
            config.accuracy.clone(),
            clock,
        ));
        let health = Arc::new(HealthChecks {
            config: config.health.clone(),
            upstream: upstream.clone(),
            registry: registry.clone(),
            workers: workers.clone(),
            models: models.clone(),
            capacity: Arc::new(Capacity::new(registry.clone(), table.clone(), &config)),
        });
        let sink = Arc::new(IndexSink {
            registry: registry.clone(),
            table: table.clone(),
            workers: workers.clone(),
            metrics: metrics.clone(),
            clock,
            replay_timeout: std::time::Duration::from_secs_f64(config.upstream.replay_timeout_secs),
        });
        let config = Arc::new(config);
        let sources = Arc::new(kvroute_events::Sources::new(
            sink.clone(),
            upstream.clone(),
            config.clone(),
        ));
        let fleet = Arc::new(Fleet::new(
            registry.clone(),
            table.clone(),
            sources,
            metrics.clone(),
            config.clone(),
            preprocessor.is_approximate(),
        ));
        let flows = config.router.admission.flow.compile();
        // Every class's series shows from the start (at 0), and the default flow's refusals
        // by reason: dashboards see a series before the first request.
        for c in flows.classes() {
            metrics.class_ttft.with_label_values(&[c.name.as_str()]);
        }
        let default = flows.flow_of(None, None);
        for r in kvroute_core::RejectReason::ALL {
            metrics.flow_refused.with_label_values(&[
                flows.tenant(default.tenant).name.as_str(),
                flows.class(default.class).name.as_str(),
                r.as_str(),
            ]);
        }
        Self {
            policy: config.router.policy.kind.as_str(),
            flows: parking_lot::RwLock::new((Arc::new(flows), 0)),
            config: parking_lot::RwLock::new(config),
            table,
            bookings,
            registry,
            workers,
            sink,
            preprocessor,
            upstream,
            metrics,
            clock,
            models,
            health,
            fleet,
        }
    }

    /// Time since the gateway started: the router's clock.
    pub fn now(&self) -> Time {
        self.clock.now()
    }

    /// The admission queue's size.
    pub fn queue_state(&self) -> QueueState {
        self.table.queue_state()
    }

    /// How long a client may take to send a request body.
    pub fn body_read_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.config().limits.body_read_timeout_secs)
    }

    /// The settings it runs with now (workers' data-parallel ranks expanded; a reload
    /// swaps the ones it can apply).
    pub fn config(&self) -> Arc<GatewayConfig> {
        self.config.read().clone()
    }

    /// Swaps the settings (a reload).
    pub(crate) fn set_config(&self, config: Arc<GatewayConfig>) {
        *self.config.write() = config;
    }

    /// The tenants and classes now, and the generation they are of: a request's identity
    /// resolved against them carries it ([`crate::routing::flow::Identity::generation`]).
    pub(crate) fn flows_at(&self) -> (Arc<Flows>, u32) {
        let f = self.flows.read();
        (f.0.clone(), f.1)
    }

    /// The tenants and classes now.
    pub(crate) fn flows(&self) -> Arc<Flows> {
        self.flows.read().0.clone()
    }

    /// Takes new admission settings (its tenants and classes too: the admission queue's,
    /// its state carried over by name, then the ones requests are resolved against, all
    /// under the queue's and the router's locks: a request resolved against the old ones is
    /// mapped when it reaches the queue) and policy parameters; nothing changes on an error.
    pub(crate) fn reconfigure(
        &self,
        admission: &kvroute_core::AdmissionConfig,
        policy: &kvroute_core::policy::PolicyConfig,
    ) -> Result<(), kvroute_core::RouteError> {
        let flows = admission.flow.compile();
        let changed = *self.flows() != flows;
        if changed {
            for c in flows.classes() {
                self.metrics
                    .class_ttft
                    .with_label_values(&[c.name.as_str()]);
            }
        }
        self.table.with_both(|q, r| {
            r.reconfigure(admission, policy)?;
            if changed {
                q.set_flows(flows.clone());
                *self.flows.write() = (Arc::new(flows), q.generation());
            }
            Ok(())
        })
    }

    /// `flow` of a request resolved against the flows of `generation`, in the flows now.
    pub(crate) fn flow_now(&self, flow: Flow, generation: u32) -> (Arc<Flows>, Flow) {
        let (flows, now) = self.flows_at();
        if now == generation {
            return (flows, flow);
        }
        let f = self.table.with_queue(|q| q.current(flow, generation));
        (self.flows(), f)
    }

    /// The workers now.
    pub fn workers(&self) -> Vec<std::sync::Arc<kvroute_fleet::registry::WorkerEntry>> {
        self.registry.all()
    }

    /// Workers joining and leaving (`kvroute_fleet::membership::add`, `remove`).
    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    /// A gateway on `router` with an approximate preprocessor, a fresh client, metrics and
    /// clock, for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests(config: GatewayConfig, router: Router) -> Arc<Self> {
        Arc::new(Self::new(
            config,
            Preprocessor::approximate(),
            router,
            reqwest::Client::new(),
            Metrics::new().expect("metrics register"),
            Clock::starting_now(),
        ))
    }
}
