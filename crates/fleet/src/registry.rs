//! The worker registry: every engine the gateway routes to now, its health, and what its KV
//! event stream has done. Workers come and go while the gateway runs (`fleet.rs`): each new
//! one gets an id never used before. A worker taken out (failed health checks, a refused
//! connection) is offered to no policy until it passes again, but keeps its index entries:
//! only its event stream can say that its engine lost its cache (a restart).

pub use crate::config::endpoint_url;
use crate::config::WorkerSpec;
use kvroute_core::WorkerId;
use kvroute_protocol::openai::Endpoint;
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Whether a worker takes requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// Known to the router, taking requests.
    Up,
    /// Taken out after failed health checks or a failed request.
    Down,
}

/// How far the router's picture of a worker's cache can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheState {
    /// Every event of the engine's current incarnation is applied.
    Exact,
    /// Asking the engine's replay service (start, reconnect).
    CatchingUp,
    /// Events were lost for good, history is older than the replay buffer, or the
    /// publisher is away: the index may differ from the engine's cache.
    Unknown,
    /// No events: what was routed to the worker is assumed cached (TTL and cap).
    Approximate,
}

impl CacheState {
    /// Every state, in metric order.
    pub const ALL: [CacheState; 4] = [
        CacheState::Exact,
        CacheState::CatchingUp,
        CacheState::Unknown,
        CacheState::Approximate,
    ];

    /// The name in reports and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheState::Exact => "exact",
            CacheState::CatchingUp => "catching_up",
            CacheState::Unknown => "unknown",
            CacheState::Approximate => "approximate",
        }
    }

    fn from_u8(v: u8) -> Self {
        Self::ALL
            .get(usize::from(v))
            .copied()
            .unwrap_or(CacheState::Unknown)
    }
}

/// One worker.
pub struct WorkerEntry {
    /// Its id in the router.
    pub id: WorkerId,
    /// Its settings.
    pub spec: WorkerSpec,
    /// Its display name (logs, labels).
    pub name: String,
    /// Its chat and completions URLs, parsed once (or why the base URL does not parse, which
    /// configuration validation refuses).
    urls: Result<[reqwest::Url; 2], String>,
    up: AtomicBool,
    failures: AtomicU32,
    cache_state: AtomicU8,
    /// The KV event stream's state.
    pub events: EventStats,
    /// Notified when the worker passes its health check again after failing: its event
    /// ingestion checks with the replay service whether the engine restarted meanwhile, and
    /// then puts it back into routing.
    pub verify: tokio::sync::Notify,
    /// Its events are ingested (a task answers `verify`).
    pub has_feed: AtomicBool,
    /// A passing health check asked for `verify`, not answered yet.
    pub verifying: AtomicBool,
    /// Its recent predictions against what the engine reported.
    accuracy: Mutex<crate::accuracy::Tracker>,
    /// When its index was last repaired (gateway time).
    last_repair: Mutex<Option<kvroute_core::Time>>,
    /// Notified when its predictions keep missing: its event ingestion rebuilds the index
    /// from the replay service.
    pub repair: tokio::sync::Notify,
    /// Notified when its predictions agreed with the engine over a whole window since its
    /// events were lost: its event ingestion takes the index as whole again.
    pub heal: tokio::sync::Notify,
    /// KV blocks learned from the engine's metrics (0: not learned).
    pub learned_kv_blocks: AtomicU64,
    /// Whether the gateway said admission cannot judge this worker.
    pub capacity_warned: AtomicBool,
    /// Whether the gateway said admission judges this worker by its KV cache only.
    pub batch_warned: AtomicBool,
    /// The tasks that ingest its events (ended when it leaves the fleet).
    tasks: crate::tasks::Tasks,
}

/// Counters of one worker's KV event stream.
#[derive(Default)]
pub struct EventStats {
    /// Which of its events count for its prefix cache (hybrid groups, tiers).
    groups: Mutex<crate::kv_groups::Groups>,
    /// Next sequence number expected (0 before the first batch).
    pub next_seq: AtomicU64,
    /// Batches applied.
    pub batches: AtomicU64,
    /// Sequence gaps seen.
    pub gaps: AtomicU64,
    /// Gaps a replay filled.
    pub replayed: AtomicU64,
    /// Engine restarts seen (sequence going backwards, or another stream after a
    /// reconnect).
    pub restarts: AtomicU64,
    /// Times the publisher went away.
    pub disconnects: AtomicU64,
    /// Times the publisher came back after going away.
    pub resubscribes: AtomicU64,
    /// Set when events were lost for good or were refused (block size mismatch): the index
    /// may be wrong for this worker until its cache is cleared.
    pub degraded: AtomicBool,
    /// The batch applied last to the index (set under the router's lock, with the batch), for
    /// snapshots.
    last_mark: Mutex<Option<crate::sequence::Mark>>,
}

impl EventStats {
    /// Runs `f` on the worker's prefix groups, locked for its duration.
    pub fn with_groups<R>(&self, f: impl FnOnce(&mut crate::kv_groups::Groups) -> R) -> R {
        f(&mut self.groups.lock())
    }

    /// The batch applied last to the index.
    pub fn last_mark(&self) -> Option<crate::sequence::Mark> {
        *self.last_mark.lock()
    }

    /// Notes the batch applied last to the index (`None`: the index was cleared).
    pub fn set_last_mark(&self, mark: Option<crate::sequence::Mark>) {
        *self.last_mark.lock() = mark;
    }
}

impl WorkerEntry {
    /// The URL of `endpoint` on this worker.
    pub fn url(&self, endpoint: Endpoint) -> Result<reqwest::Url, String> {
        let [chat, completions] = self.urls.as_ref().map_err(Clone::clone)?;
        Ok(match endpoint {
            Endpoint::Chat => chat.clone(),
            Endpoint::Completions => completions.clone(),
        })
    }

    /// Whether it is up.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Marks it up or down; returns whether that changed anything.
    pub fn set_up(&self, up: bool) -> bool {
        self.up.swap(up, Ordering::AcqRel) != up
    }

    /// Counts a failure; returns the consecutive failures so far.
    pub fn fail(&self) -> u32 {
        self.failures.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Forgets past failures.
    pub fn succeed(&self) {
        self.failures.store(0, Ordering::Release);
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures.load(Ordering::Acquire)
    }

    /// How far its index can be trusted.
    pub fn cache_state(&self) -> CacheState {
        CacheState::from_u8(self.cache_state.load(Ordering::Relaxed))
    }

    /// Sets how far its index can be trusted.
    pub fn set_cache_state(&self, state: CacheState) {
        let v = CacheState::ALL
            .iter()
            .position(|s| *s == state)
            .unwrap_or(2);
        self.cache_state.store(v as u8, Ordering::Relaxed);
    }
}

/// The workers, in id order.
pub struct Registry {
    workers: RwLock<Vec<Arc<WorkerEntry>>>,
    /// The next id given (ids are never used twice).
    next_id: AtomicU64,
    /// Bumped whenever a worker joins or leaves (for caches of names to ids).
    generation: AtomicU64,
}

/// A worker as `/debug/workers` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct WorkerReport {
    /// Router id.
    pub id: u64,
    /// Display name.
    pub name: String,
    /// Base URL.
    pub url: String,
    /// Up or down.
    pub health: Health,
    /// ZMQ event endpoint, if any (`bind:` when the gateway binds it).
    pub events_endpoint: Option<String>,
    /// Its engine's data-parallel rank, when the engine has several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dp_rank: Option<u32>,
    /// How far its index can be trusted.
    pub cache_state: CacheState,
    /// Next event sequence number expected.
    pub next_seq: u64,
    /// Event batches applied.
    pub event_batches: u64,
    /// Sequence gaps seen.
    pub gaps: u64,
    /// Gaps filled by replay.
    pub replayed: u64,
    /// Restarts seen.
    pub restarts: u64,
    /// Times its publisher went away.
    pub disconnects: u64,
    /// Times its publisher came back.
    pub resubscribes: u64,
    /// The index may be wrong for it.
    pub degraded: bool,
    /// Its predictions against the engine's reports: the recent window and totals.
    pub accuracy: crate::accuracy::Summary,
}

impl WorkerEntry {
    /// A new worker `id` of `spec`, up.
    fn new(id: WorkerId, spec: &WorkerSpec) -> Self {
        WorkerEntry {
            id,
            name: spec.display_name(),
            urls: endpoint_url(&spec.url, Endpoint::Chat)
                .and_then(|c| Ok([c, endpoint_url(&spec.url, Endpoint::Completions)?])),
            spec: spec.clone(),
            up: AtomicBool::new(true),
            failures: AtomicU32::new(0),
            cache_state: AtomicU8::new(1),
            events: EventStats::default(),
            verify: tokio::sync::Notify::new(),
            has_feed: AtomicBool::new(false),
            verifying: AtomicBool::new(false),
            accuracy: Default::default(),
            last_repair: Default::default(),
            repair: tokio::sync::Notify::new(),
            heal: tokio::sync::Notify::new(),
            learned_kv_blocks: AtomicU64::new(0),
            capacity_warned: AtomicBool::new(false),
            batch_warned: AtomicBool::new(false),
            tasks: crate::tasks::Tasks::new(),
        }
    }

    /// Its events were lost: the predictions before say nothing about the index from now
    /// on, so the window starts afresh (what heals it is judged on answers after the loss).
    pub fn restart_predictions(&self) {
        self.accuracy.lock().restart();
    }

    /// Records a prediction sample: what it was judged, and the window's summary after it.
    pub fn record_prediction(
        &self,
        sample: crate::accuracy::Sample,
        config: &crate::config::AccuracyConfig,
    ) -> (crate::accuracy::Recorded, crate::accuracy::Summary) {
        let mut t = self.accuracy.lock();
        let rec = t.record(sample, config);
        (rec, t.summary())
    }

    /// The predictions' summary now.
    pub fn prediction_summary(&self) -> crate::accuracy::Summary {
        self.accuracy.lock().summary()
    }

    /// Takes a repair of the index at `now` unless the last one is under `cooldown` old
    /// (true: repair now; the accuracy window starts afresh).
    pub fn take_repair(&self, now: kvroute_core::Time, cooldown: std::time::Duration) -> bool {
        {
            let mut last = self.last_repair.lock();
            if last.is_some_and(|t| now.0.saturating_sub(t.0) < cooldown) {
                return false;
            }
            *last = Some(now);
        }
        self.accuracy.lock().repaired();
        true
    }

    /// Runs `task` as one of the worker's own: ended when it leaves.
    pub fn spawn_task(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(task);
    }

    /// Ends the tasks that ingest its events (at their next await).
    pub fn stop_tasks(&self) {
        self.tasks.stop();
    }
}

impl Registry {
    /// A registry of `specs` with ids 1, 2, ... in their order; every worker starts up.
    pub fn new(specs: &[WorkerSpec]) -> Self {
        let r = Self {
            workers: RwLock::new(Vec::new()),
            next_id: AtomicU64::new(1),
            generation: AtomicU64::new(0),
        };
        for spec in specs {
            r.insert(spec);
        }
        r
    }

    /// Adds a worker of `spec` under a new id.
    pub fn insert(&self, spec: &WorkerSpec) -> Arc<WorkerEntry> {
        let id = WorkerId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let entry = Arc::new(WorkerEntry::new(id, spec));
        self.write().push(entry.clone());
        self.generation.fetch_add(1, Ordering::Release);
        entry
    }

    /// Takes worker `id` out of the registry.
    pub fn remove(&self, id: WorkerId) -> Option<Arc<WorkerEntry>> {
        let mut w = self.write();
        let i = w.binary_search_by_key(&id, |e| e.id).ok()?;
        self.generation.fetch_add(1, Ordering::Release);
        Some(w.remove(i))
    }

    /// Changes with every worker that joins or leaves.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn read(&self) -> RwLockReadGuard<'_, Vec<Arc<WorkerEntry>>> {
        self.workers.read()
    }

    fn write(&self) -> RwLockWriteGuard<'_, Vec<Arc<WorkerEntry>>> {
        self.workers.write()
    }

    /// Every worker now, in id order.
    pub fn all(&self) -> Vec<Arc<WorkerEntry>> {
        self.read().clone()
    }

    /// How many workers there are.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// One worker.
    pub fn get(&self, id: WorkerId) -> Option<Arc<WorkerEntry>> {
        let w = self.read();
        let i = w.binary_search_by_key(&id, |e| e.id).ok()?;
        Some(w[i].clone())
    }

    /// The worker named `name`.
    pub fn by_name(&self, name: &str) -> Option<Arc<WorkerEntry>> {
        self.read().iter().find(|w| w.name == name).cloned()
    }

    /// Workers up.
    pub fn up_count(&self) -> usize {
        self.read().iter().filter(|w| w.is_up()).count()
    }

    /// What `/debug/workers` shows.
    pub fn reports(&self) -> Vec<WorkerReport> {
        self.read()
            .iter()
            .map(|w| WorkerReport {
                id: w.id.0,
                name: w.name.clone(),
                url: w.spec.url.clone(),
                health: if w.is_up() { Health::Up } else { Health::Down },
                events_endpoint: w.spec.events.clone(),
                dp_rank: w.spec.dp_rank,
                cache_state: w.cache_state(),
                next_seq: w.events.next_seq.load(Ordering::Relaxed),
                event_batches: w.events.batches.load(Ordering::Relaxed),
                gaps: w.events.gaps.load(Ordering::Relaxed),
                replayed: w.events.replayed.load(Ordering::Relaxed),
                restarts: w.events.restarts.load(Ordering::Relaxed),
                disconnects: w.events.disconnects.load(Ordering::Relaxed),
                resubscribes: w.events.resubscribes.load(Ordering::Relaxed),
                degraded: w.events.degraded.load(Ordering::Relaxed),
                accuracy: w.prediction_summary(),
            })
            .collect()
    }
}
