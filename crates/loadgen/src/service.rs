//! A long-lived load that the dashboard steers: start, stop (cutting turns in flight), and a
//! concurrency change applied after a quiet period (debounced), with live statistics
//! published every tick to any number of watchers (the WebSocket stream, `/metrics`).
//!
//! A service drives one or more arms ([`ArmConfig`]): the same load, the same conversations
//! seeded alike, at the same concurrency, each against its own endpoint — the live A/B of
//! `kvroute demo` (a fleet behind round-robin beside an identical one behind the default
//! policy). Each arm has its own window, totals, conversations and fleet view; what every
//! arm measured at each level it held is kept ([`LevelPoint`]).

mod arm;
mod levels;

pub use arm::{ArmConfig, ArmStats, DEFAULT_ARM, MAX_ARMS};
pub use levels::{ArmPoint, LevelPoint, MAX_LEVELS};

use crate::closed_loop::MAX_CONCURRENCY;
use crate::conversations::unix_ms;
use crate::observer::Observer;
use crate::{DashboardConfig, Fleet};
use crate::{LoadKind, LoadgenConfig, LoadgenError};
use arm::{Arm, ArmRun};
use levels::Levels;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Seconds a level holds before the arms' windows count as measured at it, by default: the
/// 60 s window, then half a window more, so every turn in it ended at the level.
pub const DEFAULT_MEASURE_AFTER_SECS: f64 = 90.0;

/// Settings of the service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceConfig {
    /// The load each start runs (its `concurrency` is the initial level; a service keeps
    /// only its window: `observer.keep_records` is ignored). Its `target` is the only arm's
    /// when `arms` is empty.
    pub load: LoadgenConfig,
    /// The arms, each driven with the same load (empty: one arm, [`DEFAULT_ARM`], at
    /// `load.target`).
    pub arms: Vec<ArmConfig>,
    /// Quiet time before a concurrency change is applied, in milliseconds.
    pub debounce_ms: u64,
    /// How often statistics are published, in milliseconds.
    pub tick_ms: u64,
    /// Seconds a concurrency level must hold before the arms' windows count as measured at
    /// it (the window then holds only turns that ended at that level).
    pub measure_after_secs: f64,
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
            arms: Vec::new(),
            debounce_ms: 300,
            tick_ms: 1000,
            measure_after_secs: DEFAULT_MEASURE_AFTER_SECS,
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
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
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
    /// Seconds the applied concurrency has held while running.
    pub level_secs: Option<f64>,
    /// Seconds a level must hold before it counts as measured.
    pub measure_after_secs: f64,
    /// The open loop's rate, if the load is open.
    pub rate: Option<f64>,
    /// The `model` the load's requests name (the next start's while stopped).
    pub model: String,
    /// What the requests are.
    pub workload: LoadKind,
    /// Runs started since the service began.
    pub runs: u64,
    /// Every arm's figures, in the configured order.
    pub arms: Vec<ArmStats>,
}

impl LiveStats {
    /// The arm named `name`.
    pub fn arm(&self, name: &str) -> Option<&ArmStats> {
        self.arms.iter().find(|a| a.name == name)
    }
}

#[derive(Default)]
struct RunState {
    runs_of_arms: Vec<ArmRun>,
    concurrency: usize,
    /// The model the load asks for.
    model: String,
    pending: Option<usize>,
    runs: u64,
    /// When the applied level began (start, or a change applied while running).
    level_since: Option<Instant>,
}

impl RunState {
    fn running(&self) -> bool {
        !self.runs_of_arms.is_empty() && self.runs_of_arms.iter().any(ArmRun::running)
    }

    fn stopping(&self) -> bool {
        !self.running() && self.runs_of_arms.iter().any(ArmRun::finishing)
    }
}

struct Inner {
    config: ServiceConfig,
    arms: Vec<Arm>,
    state: Mutex<RunState>,
    levels: Mutex<Levels>,
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
        if !(config.measure_after_secs.is_finite()
            && (0.0..=86_400.0).contains(&config.measure_after_secs))
        {
            return Err(ServiceError::BadRequest(format!(
                "measure_after_secs must be within 0..=86400, got {}",
                config.measure_after_secs
            )));
        }
        if config.arms.is_empty() {
            config.arms.push(ArmConfig {
                name: DEFAULT_ARM.into(),
                target: config.load.target.clone(),
                baseline: false,
            });
        }
        arm::validate(&config.arms).map_err(ServiceError::BadRequest)?;
        let arms: Vec<Arm> = config
            .arms
            .iter()
            .map(|a| Arm::new(a.clone(), &config.load.observer))
            .collect();
        let state = RunState {
            concurrency: config.load.concurrency,
            model: config.load.model.clone(),
            ..RunState::default()
        };
        let first = Arc::new(LiveStats {
            time_unix_ms: unix_ms(),
            running: false,
            stopping: false,
            concurrency: state.concurrency,
            pending_concurrency: None,
            max_concurrency: MAX_CONCURRENCY,
            level_secs: None,
            measure_after_secs: config.measure_after_secs,
            rate: config.load.rate,
            model: state.model.clone(),
            workload: config.load.workload,
            runs: 0,
            arms: arms.iter().map(Arm::stats).collect(),
        });
        let (stats, _) = watch::channel(first);
        let inner = Arc::new(Inner {
            config,
            arms,
            state: Mutex::new(state),
            levels: Mutex::new(Levels::default()),
            stats,
            generation: AtomicU64::new(0),
        });
        tokio::spawn(tick(Arc::downgrade(&inner)));
        Ok(Self { inner })
    }

    fn state(&self) -> parking_lot::MutexGuard<'_, RunState> {
        self.inner.state.lock()
    }

    fn levels_lock(&self) -> parking_lot::MutexGuard<'_, Levels> {
        self.inner.levels.lock()
    }

    /// The arms' settings, in order.
    pub fn arms(&self) -> Vec<ArmConfig> {
        self.inner.arms.iter().map(|a| a.config.clone()).collect()
    }

    fn arm(&self, name: Option<&str>) -> Result<&Arm, ServiceError> {
        match name {
            None => Ok(self
                .inner
                .arms
                .iter()
                .find(|a| !a.config.baseline)
                .unwrap_or(&self.inner.arms[0])),
            Some(n) => self
                .inner
                .arms
                .iter()
                .find(|a| a.config.name == n)
                .ok_or_else(|| {
                    let names: Vec<&str> = self
                        .inner
                        .arms
                        .iter()
                        .map(|a| a.config.name.as_str())
                        .collect();
                    ServiceError::NotFound(format!(
                        "no arm {n:?}; the arms are {}",
                        names.join(", ")
                    ))
                }),
        }
    }

    /// The observer (conversations, window, totals) of the arm named `arm`, or of the first
    /// arm that is not the baseline.
    pub fn observer(&self, arm: Option<&str>) -> Result<&Arc<Observer>, ServiceError> {
        self.arm(arm).map(|a| &a.observer)
    }

    /// Starts the load at the current concurrency, on every arm with the same seed.
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
            load.model.clone_from(&s.model);
            load.seed = load.seed.wrapping_add(s.runs);
            let mut runs = Vec::with_capacity(self.inner.arms.len());
            for arm in &self.inner.arms {
                let mut l = load.clone();
                l.target = arm.config.target.clone();
                match crate::start(l, arm.observer.clone()) {
                    Ok((control, handle)) => runs.push(ArmRun {
                        control: Some(control),
                        handle: Some(handle),
                    }),
                    Err(e) => {
                        // The arms run together or not at all.
                        for r in &runs {
                            if let Some(c) = &r.control {
                                c.cancel();
                            }
                        }
                        return Err(e.into());
                    }
                }
            }
            s.runs_of_arms = runs;
            s.runs += 1;
            s.level_since = Some(Instant::now());
        }
        tracing::info!(arms = self.inner.arms.len(), "load started");
        Ok(self.publish())
    }

    /// Stops the load on every arm: no new turns, turns in flight are cut (counted as
    /// cancelled).
    pub fn stop(&self) -> Result<Arc<LiveStats>, ServiceError> {
        {
            let mut s = self.state();
            if !s.running() {
                return Err(ServiceError::Conflict("the load is not running".into()));
            }
            for r in &s.runs_of_arms {
                if let Some(c) = &r.control {
                    c.cancel();
                }
            }
            s.level_since = None;
        }
        tracing::info!("load stopped");
        Ok(self.publish())
    }

    /// Asks for `n` conversations in flight on every arm; applied once no other change came
    /// for the debounce time (also to the next start).
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
                if s.concurrency != n && s.running() {
                    s.level_since = Some(Instant::now());
                }
                s.concurrency = n;
                for r in &s.runs_of_arms {
                    if let Some(c) = &r.control {
                        c.set_concurrency(n);
                    }
                }
            }
            tracing::info!(concurrency = n, "concurrency applied");
            service.publish();
        });
        Ok(self.publish())
    }

    /// Makes `model` the one the load's requests name from the next start on: one every
    /// arm's target lists at `/v1/models` (a gateway serving several models; the dashboard's
    /// views follow it). Refused while the load runs or stops (a window of one model).
    pub async fn set_model(&self, model: &str) -> Result<Arc<LiveStats>, ServiceError> {
        if model.is_empty() || model.len() > 256 || model.chars().any(char::is_control) {
            return Err(ServiceError::BadRequest(
                "a model name is 1 to 256 characters without control characters".into(),
            ));
        }
        {
            let s = self.state();
            if s.running() || s.stopping() {
                return Err(ServiceError::Conflict(
                    "stop the load before changing its model".into(),
                ));
            }
            if s.model == model {
                drop(s);
                return Ok(self.publish());
            }
        }
        for (arm, fleet) in self.fleets().await {
            if !fleet.models.iter().any(|m| m == model) {
                let listed = if fleet.models.is_empty() {
                    "lists no models (is it up?)".to_string()
                } else {
                    format!("serves {}", fleet.models.join(", "))
                };
                return Err(ServiceError::BadRequest(format!(
                    "arm {}'s target {} does not serve {model:?}: it {listed}",
                    arm.name, arm.target
                )));
            }
        }
        {
            let mut s = self.state();
            if s.running() || s.stopping() {
                return Err(ServiceError::Conflict(
                    "stop the load before changing its model".into(),
                ));
            }
            s.model = model.to_string();
        }
        tracing::info!(model, "the load's model changed");
        Ok(self.publish())
    }

    /// The dashboard's settings.
    pub fn dashboard(&self) -> &DashboardConfig {
        &self.inner.config.dashboard
    }

    /// The fleet behind each arm (each cached for a second), in arm order.
    pub async fn fleets(&self) -> Vec<(ArmConfig, Fleet)> {
        let model = self.state().model.clone();
        let reads = self.inner.arms.iter().map(|a| a.fleet.read(&model));
        let fleets = futures_util::future::join_all(reads).await;
        self.arms().into_iter().zip(fleets).collect()
    }

    /// What every arm measured at each level it held, lowest level first.
    pub fn levels(&self) -> Vec<LevelPoint> {
        self.levels_lock().list()
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

    /// Takes the statistics now and publishes them; once the level has held long enough,
    /// keeps every arm's window as measured at it.
    pub fn publish(&self) -> Arc<LiveStats> {
        let (running, stopping, concurrency, pending, runs, level_secs, model) = {
            let s = self.state();
            let running = s.running();
            let held = s
                .level_since
                .filter(|_| running)
                .map(|t| t.elapsed().as_secs_f64());
            (
                running,
                s.stopping(),
                s.concurrency,
                s.pending,
                s.runs,
                held,
                s.model.clone(),
            )
        };
        let load = &self.inner.config.load;
        let arms: Vec<ArmStats> = self.inner.arms.iter().map(Arm::stats).collect();
        let now = unix_ms();
        if let Some(held) = level_secs.filter(|&h| {
            pending.is_none() && load.rate.is_none() && h >= self.inner.config.measure_after_secs
        }) {
            let mut levels = self.levels_lock();
            for (order, a) in arms.iter().enumerate() {
                if a.window.summary.completed > 0 {
                    levels.record(
                        concurrency,
                        order,
                        ArmPoint {
                            name: a.name.clone(),
                            baseline: a.baseline,
                            held_secs: held,
                            taken_unix_ms: now,
                            summary: a.window.summary.clone(),
                        },
                    );
                }
            }
        }
        let stats = Arc::new(LiveStats {
            time_unix_ms: now,
            running,
            stopping,
            concurrency,
            pending_concurrency: pending,
            max_concurrency: MAX_CONCURRENCY,
            level_secs,
            measure_after_secs: self.inner.config.measure_after_secs,
            rate: load.rate,
            model,
            workload: load.workload,
            runs,
            arms,
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
