//! The fleet: workers joining and leaving while the gateway runs. A worker that joins gets an
//! id never used before, a place in the router (tracked by its events, or approximately),
//! and the tasks that ingest its events, which it owns: they end when it leaves. A worker
//! that leaves takes its index entries, its load and its metric series with it; requests
//! in flight there finish as they would (their bookings are simply gone). Health checks stay
//! one loop over the fleet (`health.rs`), since taking a worker out depends on how the
//! others fared in the same round. Discovery's sources give whole sets of engines;
//! [`reconcile`] makes the fleet each set.

use crate::bookings::Waiter;
use crate::config::GatewayConfig;
use crate::config::{ConfigError, WorkerSpec};
use crate::feed::{EventFeed, EventSources, PlaneFeeds};
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::registry::WorkerEntry;
use crate::table::RoutingTable;
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

/// What joining and leaving touch: the registry, the routing table, the starting of event
/// ingestion, metric series, the settings (capacities, event sources) and the event plane's
/// feeds, when there is a plane.
pub struct Fleet {
    registry: Arc<Registry>,
    table: Arc<RoutingTable<Waiter>>,
    sources: Arc<dyn EventSources>,
    metrics: Arc<Metrics>,
    config: Arc<GatewayConfig>,
    /// The preprocessor's tokens are pseudo tokens: every worker is tracked approximately.
    approximate: bool,
    /// The event plane's feeds (set once, when the gateway has a plane).
    plane: std::sync::OnceLock<Arc<dyn PlaneFeeds>>,
}

impl Fleet {
    /// The fleet of `registry` and `table`, its workers' events started through `sources`.
    pub fn new(
        registry: Arc<Registry>,
        table: Arc<RoutingTable<Waiter>>,
        sources: Arc<dyn EventSources>,
        metrics: Arc<Metrics>,
        config: Arc<GatewayConfig>,
        approximate: bool,
    ) -> Self {
        Self {
            registry,
            table,
            sources,
            metrics,
            config,
            approximate,
            plane: std::sync::OnceLock::new(),
        }
    }

    /// The event plane's feeds, when there is a plane.
    pub fn plane(&self) -> Option<&Arc<dyn PlaneFeeds>> {
        self.plane.get()
    }

    /// Workers may read their events from the plane from now on (set once; false when set
    /// already).
    pub fn set_plane(&self, feeds: Arc<dyn PlaneFeeds>) -> bool {
        self.plane.set(feeds).is_ok()
    }

    /// The workers now.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The settings (workers' ranks expanded).
    pub fn config(&self) -> &GatewayConfig {
        &self.config
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
        let added = fleet.table.update(|router| {
            router.add_worker_with(entry.id, fleet.config.capacity_of(r), t)?;
            router.set_role(entry.id, r.role);
            Ok::<_, kvroute_core::RouteError>(())
        });
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

/// What [`reconcile`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Workers that joined (names).
    pub added: Vec<String>,
    /// Workers that left (names).
    pub removed: Vec<String>,
    /// Engines that could not join, and why.
    pub failed: Vec<(String, String)>,
}

/// Makes the fleet `desired`: workers not in it (by name, or with other settings) leave,
/// engines not in the fleet join.
pub fn reconcile(fleet: &Arc<Fleet>, desired: &[WorkerSpec]) -> Changes {
    let mut changes = Changes::default();
    let wanted: BTreeMap<String, WorkerSpec> = crate::config::expand_ranks(desired)
        .into_iter()
        .map(|w| (w.display_name(), w))
        .collect();
    for entry in fleet.registry.all() {
        let keep = wanted.get(&entry.name).is_some_and(|w| *w == entry.spec);
        if !keep && remove(fleet, entry.id) {
            changes.removed.push(entry.name.clone());
        }
    }
    for spec in desired {
        let first = crate::config::expand_ranks(std::slice::from_ref(spec));
        let Some(first) = first.first() else { continue };
        if fleet.registry.by_name(&first.display_name()).is_some() {
            continue;
        }
        match add(fleet, spec.clone()) {
            Ok(ids) => {
                for id in ids {
                    if let Some(e) = fleet.registry.get(id) {
                        changes.added.push(e.name.clone());
                    }
                }
            }
            Err(e) => {
                tracing::warn!(worker = %spec.display_name(), error = %e, "discovered engine could not join");
                changes.failed.push((spec.display_name(), e.to_string()));
            }
        }
    }
    changes
}

/// Starts ingesting the events of `entries` (one engine's ranks consecutive, as
/// configuration expands them), `feeds` given by position for in-process sources; the
/// tasks are the entries' own.
pub fn start_events(
    fleet: &Arc<Fleet>,
    entries: &[Arc<WorkerEntry>],
    feeds: &mut BTreeMap<usize, EventFeed>,
) -> std::io::Result<()> {
    fleet
        .sources
        .start(entries, feeds, fleet.plane().map(|p| &**p))
}
