//! The fleet: workers joining and leaving while the gateway runs. A worker that joins gets an
//! id never used before, a place in the router (tracked by its events, or approximately),
//! and the tasks that ingest its events, which it owns: they end when it leaves. A worker
//! that leaves takes its index entries, its load and its metric series with it; requests
//! in flight there finish as they would (their bookings are simply gone). Health checks stay
//! one loop over the fleet (`health.rs`), since taking a worker out depends on how the
//! others fared in the same round.

use crate::bookings::Waiter;
use crate::config::GatewayConfig;
use crate::config::{ConfigError, WorkerSpec};
use crate::events::Ingestion;
use crate::events::{self, EventFeed};
use crate::metrics::Metrics;
use crate::nats::Connection;
use crate::registry::Registry;
use crate::registry::{CacheState, WorkerEntry};
use crate::table::RoutingTable;
use crate::upstream::Upstream;
use kvroute_core::{Tracking, WorkerId};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Why a worker could not join.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// Its settings are wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A worker of that name is already in the fleet.
    #[error("a worker named {0:?} is already in the fleet")]
    Duplicate(String),
    /// The router refused it (its limit of workers).
    #[error(transparent)]
    Route(#[from] kvroute_core::RouteError),
    /// Its event source could not be opened.
    #[error("its KV event source: {0}")]
    Events(#[from] std::io::Error),
}

/// What joining and leaving touch: the registry, the routing table, event ingestion, calls to
/// workers (the pull-API poller), metric series, the settings (capacities, event sources) and
/// the event plane's connection, when there is one.
pub struct Fleet {
    pub(crate) registry: Arc<Registry>,
    pub(crate) table: Arc<RoutingTable<Waiter>>,
    pub(crate) ingestion: Arc<Ingestion>,
    pub(crate) upstream: Arc<Upstream>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) config: Arc<GatewayConfig>,
    /// The preprocessor's tokens are pseudo tokens: every worker is tracked approximately.
    pub(crate) approximate: bool,
    /// The event plane's connection (set once, when the gateway has one).
    pub(crate) plane: std::sync::OnceLock<Connection>,
}

impl Fleet {
    /// The event plane's connection, when there is one.
    pub fn plane(&self) -> Option<&Connection> {
        self.plane.get()
    }
}

/// How the router tracks `spec`'s cache: approximately when its events cannot be read (no
/// source, or pseudo tokens that are not the engine's).
pub fn tracking_of(gw_approximate: bool, spec: &WorkerSpec, has_feed: bool) -> Tracking {
    if gw_approximate || (spec.events.is_none() && !has_feed) {
        Tracking::Approximate
    } else {
        Tracking::Events
    }
}

/// Adds an engine (one worker per data-parallel rank) while the gateway runs; returns the
/// new workers' ids.
pub fn add(fleet: &Arc<Fleet>, spec: WorkerSpec) -> Result<Vec<WorkerId>, FleetError> {
    spec.check()?;
    if spec.events_from_plane() && fleet.plane().is_none() {
        return Err(ConfigError(format!(
            "worker {}: events = \"nats\" needs the event plane ([plane] url, or --nats)",
            spec.display_name()
        ))
        .into());
    }
    let ranks = crate::config::expand_ranks(std::slice::from_ref(&spec));
    for r in &ranks {
        if fleet.registry.by_name(&r.display_name()).is_some() {
            return Err(FleetError::Duplicate(r.display_name()));
        }
    }
    let mut entries = Vec::with_capacity(ranks.len());
    for r in &ranks {
        let entry = fleet.registry.insert(r);
        let t = tracking_of(fleet.approximate, r, false);
        // The router's lock is let go before the refusal is undone (it takes it again).
        let added = fleet
            .table
            .update(|router| router.add_worker_with(entry.id, fleet.config.capacity_of(r), t));
        if let Err(e) = added {
            for e in entries.iter().chain([&entry]) {
                let e: &Arc<WorkerEntry> = e;
                fleet.registry.remove(e.id);
                fleet.table.update(|router| router.remove_worker(e.id));
            }
            return Err(e.into());
        }
        entries.push(entry);
    }
    if let Err(e) = start_events(fleet, &entries, &mut BTreeMap::new()) {
        for e in &entries {
            remove(fleet, e.id);
        }
        return Err(e.into());
    }
    for e in &entries {
        tracing::info!(worker = %e.name, id = e.id.0, url = %e.spec.url, "worker joined the fleet");
    }
    fleet.table.wake();
    Ok(entries.iter().map(|e| e.id).collect())
}

/// Takes worker `id` out of the fleet: its tasks end, the router forgets it, its metric
/// series go. False when there is no such worker.
pub fn remove(fleet: &Arc<Fleet>, id: WorkerId) -> bool {
    let Some(entry) = fleet.registry.remove(id) else {
        return false;
    };
    entry.stop_tasks();
    fleet.table.update(|r| r.remove_worker(id));
    fleet.metrics.forget_worker(&entry.name);
    tracing::info!(worker = %entry.name, id = id.0, "worker left the fleet");
    fleet.table.wake();
    true
}

/// Starts ingesting the events of `entries` (one engine's ranks consecutive, as
/// configuration expands them), `feeds` given by position for in-process sources; the
/// tasks are the entries' own.
pub fn start_events(
    fleet: &Arc<Fleet>,
    entries: &[Arc<WorkerEntry>],
    feeds: &mut BTreeMap<usize, EventFeed>,
) -> std::io::Result<()> {
    for (i, entry) in entries.iter().enumerate() {
        let w = &entry.spec;
        if fleet.table.read(|r| r.tracking(entry.id)) == Some(Tracking::Approximate) {
            entry.set_cache_state(CacheState::Approximate);
            continue;
        }
        let feed = match (feeds.remove(&i), w.event_socket()) {
            (Some(f), _) => f,
            (None, None) if w.events_from_plane() => match (fleet.plane(), &fleet.config.plane) {
                (Some(conn), Some(p)) => crate::plane::nats_feed(conn, p, &entry.name),
                _ => continue,
            },
            (None, None) if w.event_poll_url().is_some() => {
                // One poller per engine: rank 0 starts it for every rank (`dp_size`).
                if w.dp_rank.unwrap_or(0) > 0 {
                    continue;
                }
                let up = &fleet.config.upstream;
                let ranks = w.dp_rank.and(w.dp_size).unwrap_or(1);
                let sub = events::PollSubscription {
                    worker: entry.name.clone(),
                    url: w.event_poll_url().unwrap_or_default(),
                    api_key: fleet.upstream.key_for(w).map(str::to_string),
                    interval_secs: up.event_poll_secs,
                    timeout_secs: up.event_poll_timeout_secs,
                    max_bytes: up.max_event_message_bytes,
                    block_size: fleet.config.router.block_size as u64,
                    ranks,
                };
                let mut rank_feeds =
                    events::poll_feeds(fleet.upstream.client().clone(), sub).into_iter();
                let Some(first) = rank_feeds.next() else {
                    continue;
                };
                for (r, f) in rank_feeds.enumerate() {
                    if let Some(rank) = entries.get(i + r + 1) {
                        rank.spawn_task(events::ingest(fleet.ingestion.clone(), rank.id, f));
                    }
                }
                first
            }
            (None, Some((endpoint, bind))) => {
                let up = &fleet.config.upstream;
                events::zmq_feed(events::ZmqSubscription {
                    worker: entry.name.clone(),
                    endpoint: endpoint.to_string(),
                    bind,
                    replay: w.replay.clone(),
                    max_message_bytes: up.max_event_message_bytes,
                    heartbeat_secs: up.event_heartbeat_secs,
                    heartbeat_timeout_secs: up.event_heartbeat_timeout_secs,
                    replay_timeout_secs: up.replay_timeout_secs,
                })?
            }
            (None, None) => continue,
        };
        entry.spawn_task(events::ingest(fleet.ingestion.clone(), entry.id, feed));
    }
    Ok(())
}
