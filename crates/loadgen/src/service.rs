//! A long-lived load that the dashboard steers: start, stop (cutting turns in flight), and a
//! concurrency change applied after a quiet period (debounced), with live statistics
//! published every tick to any number of watchers (the WebSocket stream, `/metrics`).

use crate::closed_loop::{Control, MAX_CONCURRENCY};
use crate::conversations::unix_ms;
use crate::fleet::{DashboardConfig, Fleet, FleetReader};
use crate::observer::{Observer, Totals};
use crate::window::WindowStats;
use crate::{LoadKind, LoadgenConfig, LoadgenError, RunResult};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Settings of the service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceConfig {
    /// The load each start runs (its `concurrency` is the initial level; a service keeps
    /// only its window: `observer.keep_records` is ignored).
    pub load: LoadgenConfig,
    /// Quiet time before a concurrency change is applied, in milliseconds.
    pub debounce_ms: u64,
    /// How often statistics are published, in milliseconds.
    pub tick_ms: u64,
    /// What the dashboard shows beside the load.
    pub dashboard: DashboardConfig,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            load: LoadgenConfig {
                conversations: u64::MAX,
                ..LoadgenConfig::default()
            },
            debounce_ms: 300,
            tick_ms: 1000,
            dashboard: DashboardConfig::default(),
        }
    }
}

/// Why a control request was refused.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The request does not fit the load's state (start while running, stop while stopped).
    #[error("{0}")]
    Conflict(String),
    /// A bad value.
    #[error("{0}")]
    BadRequest(String),
    /// No such thing.
    #[error("{0}")]
    NotFound(String),
    /// Too many clients at once: retry later.
    #[error("{0}")]
    Busy(String),
    /// The load could not start.
    #[error(transparent)]
    Load(#[from] LoadgenError),
}

/// What the dashboard sees, published every tick and after every change.
#[derive(Clone, Debug, Serialize)]
pub struct LiveStats {
    /// When these figures were taken, in milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
    /// Whether the load runs.
    pub running: bool,
    /// Whether a stopped load still has turns finishing.
    pub stopping: bool,
    /// The concurrency applied (closed loop).
    pub concurrency: usize,
    /// A concurrency asked for and not yet applied (debounce).
    pub pending_concurrency: Option<usize>,
    /// The most a concurrency may be set to.
    pub max_concurrency: usize,
    /// The open loop's rate, if the load is open.
    pub rate: Option<f64>,
    /// What the requests are.
    pub workload: LoadKind,
    /// The endpoint driven.
    pub target: String,
    /// Runs started since the service began.
    pub runs: u64,
    /// Conversations under way.
    pub active_conversations: usize,
    /// Counts since the current run started.
    pub totals: Totals,
    /// The rolling window.
    pub window: WindowStats,
}

#[derive(Default)]
struct RunState {
    control: Option<Control>,
    handle: Option<JoinHandle<RunResult>>,
    concurrency: usize,
    pending: Option<usize>,
    runs: u64,
}

impl RunState {
    fn running(&self) -> bool {
        self.control.as_ref().is_some_and(|c| !c.is_stopped())
            && self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }

    fn stopping(&self) -> bool {
        !self.running() && self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }
}

struct Inner {
    config: ServiceConfig,
    fleet: FleetReader,
    observer: Arc<Observer>,
    state: Mutex<RunState>,
    stats: watch::Sender<Arc<LiveStats>>,
    generation: AtomicU64,
}

/// The steerable load (cheap to clone; every clone is the same service).
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

impl Service {
    /// A stopped service publishing statistics every tick. Must be called within a tokio
    /// runtime.
    pub fn new(mut config: ServiceConfig) -> Result<Self, ServiceError> {
        config.load.observer.keep_records = false;
        config.load.validate()?;
        config
            .dashboard
            .validate()
            .map_err(ServiceError::BadRequest)?;
        if config.tick_ms == 0 || config.tick_ms > 60_000 || config.debounce_ms > 60_000 {
            return Err(ServiceError::BadRequest(
                "tick_ms must be within 1..=60000 and debounce_ms at most 60000".into(),
            ));
        }
        let observer = Arc::new(Observer::new(&config.load.observer));
        let state = RunState {
            concurrency: config.load.concurrency,
            ..RunState::default()
        };
        let first = Arc::new(LiveStats {
            time_unix_ms: unix_ms(),
            running: false,
            stopping: false,
            concurrency: state.concurrency,
            pending_concurrency: None,
            max_concurrency: MAX_CONCURRENCY,
            rate: config.load.rate,
            workload: config.load.workload,
            target: config.load.target.clone(),
            runs: 0,
            active_conversations: 0,
            totals: Totals::default(),
            window: observer.window(),
        });
        let (stats, _) = watch::channel(first);
        let inner = Arc::new(Inner {
            fleet: FleetReader::new(&config.load.target),
            config,
            observer,
            state: Mutex::new(state),
            stats,
            generation: AtomicU64::new(0),
        });
        tokio::spawn(tick(Arc::downgrade(&inner)));
        Ok(Self { inner })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RunState> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The observer (conversations, window, totals).
    pub fn observer(&self) -> &Arc<Observer> {
        &self.inner.observer
    }

    /// Starts the load at the current concurrency.
    pub fn start(&self) -> Result<Arc<LiveStats>, ServiceError> {
        {
            let mut s = self.state();
            if s.running() {
                return Err(ServiceError::Conflict("the load is already running".into()));
            }
            if s.stopping() {
                return Err(ServiceError::Conflict(
                    "the load is still stopping; try again in a moment".into(),
                ));
            }
            let mut load = self.inner.config.load.clone();
            load.concurrency = s.concurrency;
            load.seed = load.seed.wrapping_add(s.runs);
            let (control, handle) = crate::start(load, self.inner.observer.clone())?;
            s.control = Some(control);
            s.handle = Some(handle);
            s.runs += 1;
        }
        tracing::info!("load started");
        Ok(self.publish())
    }

    /// Stops the load: no new turns, turns in flight are cut (counted as cancelled).
    pub fn stop(&self) -> Result<Arc<LiveStats>, ServiceError> {
        {
            let s = self.state();
            if !s.running() {
                return Err(ServiceError::Conflict("the load is not running".into()));
            }
            if let Some(c) = &s.control {
                c.cancel();
            }
        }
        tracing::info!("load stopped");
        Ok(self.publish())
    }

    /// Asks for `n` conversations in flight; applied once no other change came for the
    /// debounce time (also to the next start).
    pub fn set_concurrency(&self, n: usize) -> Result<Arc<LiveStats>, ServiceError> {
        if n == 0 || n > MAX_CONCURRENCY {
            return Err(ServiceError::BadRequest(format!(
                "concurrency must be within 1..={MAX_CONCURRENCY}, got {n}"
            )));
        }
        let generation = self.inner.generation.fetch_add(1, Ordering::SeqCst) + 1;
        self.state().pending = Some(n);
        let weak = Arc::downgrade(&self.inner);
        let wait = Duration::from_millis(self.inner.config.debounce_ms);
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let Some(inner) = weak.upgrade() else {
                return;
            };
            if inner.generation.load(Ordering::SeqCst) != generation {
                return;
            }
            let service = Service { inner };
            {
                let mut s = service.state();
                s.pending = None;
                s.concurrency = n;
                if let Some(c) = &s.control {
                    c.set_concurrency(n);
                }
            }
            tracing::info!(concurrency = n, "concurrency applied");
            service.publish();
        });
        Ok(self.publish())
    }

    /// The dashboard's settings.
    pub fn dashboard(&self) -> &DashboardConfig {
        &self.inner.config.dashboard
    }

    /// The fleet behind the target (cached for a second).
    pub async fn fleet(&self) -> Fleet {
        self.inner.fleet.read().await
    }

    /// The latest statistics.
    pub fn stats(&self) -> Arc<LiveStats> {
        self.inner.stats.borrow().clone()
    }

    /// A receiver of every statistics update.
    pub fn subscribe(&self) -> watch::Receiver<Arc<LiveStats>> {
        self.inner.stats.subscribe()
    }

    /// The Prometheus text of the latest statistics.
    pub fn metrics(&self) -> String {
        crate::prom::render(&self.stats())
    }

    /// Takes the statistics now and publishes them.
    pub fn publish(&self) -> Arc<LiveStats> {
        let (running, stopping, concurrency, pending, runs) = {
            let s = self.state();
            (s.running(), s.stopping(), s.concurrency, s.pending, s.runs)
        };
        let o = &self.inner.observer;
        let load = &self.inner.config.load;
        let stats = Arc::new(LiveStats {
            time_unix_ms: unix_ms(),
            running,
            stopping,
            concurrency,
            pending_concurrency: pending,
            max_concurrency: MAX_CONCURRENCY,
            rate: load.rate,
            workload: load.workload,
            target: load.target.clone(),
            runs,
            active_conversations: o.active_conversations(),
            totals: o.totals(),
            window: o.window(),
        });
        self.inner.stats.send_replace(stats.clone());
        stats
    }
}

/// Publishes the statistics every tick while the service lives.
async fn tick(inner: Weak<Inner>) {
    let every = match inner.upgrade() {
        Some(i) => Duration::from_millis(i.config.tick_ms),
        None => return,
    };
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        Service { inner }.publish();
    }
}
