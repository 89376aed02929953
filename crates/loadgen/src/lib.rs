//! The load generator: streamed requests against any OpenAI-compatible endpoint (ours, vLLM,
//! anyone's), one record per request in the simulator's format ([`RequestRecord`]) so live
//! runs and simulations share their statistics and reports.
//!
//! Loads: multi-turn chat conversations (the answer of a turn goes into the next one's
//! history; follow-up questions from the built-in generator or from a model acting as the
//! user) or synthetic shared-prefix requests, either closed loop at a concurrency that can
//! change while running ([`Control`]) or open loop with Poisson arrivals at a rate; and
//! Mooncake trace replay on the trace's own schedule ([`replay`]). Every outcome goes to an
//! [`Observer`]: the run's records, a rolling window, totals and a bounded conversation
//! store, which the control API ([`api`], [`Service`]) serves to the dashboard, with
//! Prometheus summaries. A failed or rejected turn is recorded and ends its conversation;
//! nothing is dropped from the records.

pub mod api;
mod closed_loop;
pub mod conversations;
pub mod dashboard_config;
pub mod flow_cards;
mod job;
pub mod observer;
mod open_loop;
mod prom;
mod replay;
pub mod service;
mod turn;
mod user_model;
pub mod window;
pub mod worker_cards;

pub use closed_loop::{Control, MAX_CONCURRENCY};
pub use dashboard_config::DashboardConfig;
pub use observer::{Observer, ObserverConfig, Totals};
pub use replay::{replay, ReplayConfig};
pub use service::{
    ArmConfig, ArmPoint, ArmStats, LevelPoint, LiveStats, Service, ServiceConfig, ServiceError,
};
pub use turn::{RouteExplanation, RouteTerms, TurnResult};
pub use user_model::UserModelConfig;
pub use worker_cards::{Fleet, WorkerCard};

use kvroute_workload::{ChatConfig, RequestRecord, SyntheticConfig};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// What the requests are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(rename_all = "snake_case")]
pub enum LoadKind {
    /// Multi-turn chat conversations on `/v1/chat/completions`.
    #[default]
    Multiturn,
    /// Single shared-prefix requests with token-id prompts on `/v1/completions`.
    Synthetic,
}

/// Settings of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoadgenConfig {
    /// Base URL of the endpoint, e.g. `http://127.0.0.1:8000`.
    pub target: String,
    /// The `model` of every request.
    pub model: String,
    /// What the requests are.
    pub workload: LoadKind,
    /// Closed loop: conversations (or synthetic requests) in flight at once.
    pub concurrency: usize,
    /// Open loop: new conversations (or synthetic requests) per second, Poisson arrivals;
    /// `None` runs the closed loop.
    pub rate: Option<f64>,
    /// Open loop: most conversations (or requests) in flight; later arrivals wait, and their
    /// wait counts in their TTFT.
    pub max_in_flight: usize,
    /// Conversations (or synthetic requests) to start in all.
    pub conversations: u64,
    /// Stop starting turns after this many seconds (0: no limit).
    pub duration_secs: f64,
    /// Closed loop: start the first `concurrency` conversations evenly over this many
    /// seconds instead of all at once (slots added later start at once).
    pub ramp_secs: f64,
    /// Seconds one turn may take.
    pub request_timeout_secs: f64,
    /// Send `ignore_eos: true` (vLLM, SGLang and kvroute's worker honour it) so every turn
    /// generates `max_tokens` tokens.
    pub ignore_eos: bool,
    /// Seed of the conversations and arrivals.
    pub seed: u64,
    /// The conversations' shape.
    pub chat: ChatConfig,
    /// The synthetic requests' shape.
    pub synthetic: SyntheticConfig,
    /// A model that writes the follow-up questions (else the built-in generator does).
    pub user_model: Option<UserModelConfig>,
    /// What the run keeps and how long its window is.
    pub observer: ObserverConfig,
    /// The API key sent with every request (`Authorization: Bearer`): a gateway's key, or a
    /// tenant's (docs/flow-control.md). Never written out.
    #[serde(skip_serializing)]
    pub api_key: Option<String>,
    /// More headers sent with every request, e.g. `x-kvroute-class` (a class) or a tenant
    /// header the gateway trusts.
    pub headers: std::collections::BTreeMap<String, String>,
}

impl Default for LoadgenConfig {
    fn default() -> Self {
        Self {
            target: "http://127.0.0.1:8000".into(),
            model: "kvroute-sim".into(),
            workload: LoadKind::Multiturn,
            concurrency: 8,
            rate: None,
            max_in_flight: 4096,
            conversations: 40,
            duration_secs: 0.0,
            ramp_secs: 0.0,
            request_timeout_secs: 300.0,
            ignore_eos: true,
            seed: 0,
            chat: ChatConfig::default(),
            synthetic: SyntheticConfig::default(),
            user_model: None,
            observer: ObserverConfig::default(),
            api_key: None,
            headers: std::collections::BTreeMap::new(),
        }
    }
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoadgenError {
    /// Bad settings.
    #[error("invalid loadgen config: {0}")]
    Config(String),
    /// The HTTP client could not be built.
    #[error("http client: {0}")]
    Client(#[from] reqwest::Error),
}

/// Checks that `url` is an http(s) URL.
fn check_url(what: &str, url: &str) -> Result<(), LoadgenError> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(())
    } else {
        Err(LoadgenError::Config(format!(
            "{what} {url:?} must be an http(s) URL"
        )))
    }
}

impl LoadgenConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), LoadgenError> {
        let bad = |m: String| Err(LoadgenError::Config(m));
        check_url("target", &self.target)?;
        if self.concurrency == 0 || self.concurrency > MAX_CONCURRENCY {
            return bad(format!(
                "concurrency must be within 1..={MAX_CONCURRENCY}, got {}",
                self.concurrency
            ));
        }
        if let Some(rate) = self.rate {
            if !(rate.is_finite() && rate > 0.0 && rate <= 1e6) {
                return bad(format!(
                    "rate must be within (0, 1000000] per second, got {rate}"
                ));
            }
        }
        if self.max_in_flight == 0 || self.max_in_flight > MAX_CONCURRENCY {
            return bad(format!(
                "max_in_flight must be within 1..={MAX_CONCURRENCY}, got {}",
                self.max_in_flight
            ));
        }
        if self.conversations == 0 {
            return bad("conversations must be > 0".into());
        }
        if !(self.duration_secs.is_finite() && self.duration_secs >= 0.0) {
            return bad("duration_secs must be >= 0".into());
        }
        if !(self.ramp_secs.is_finite() && (0.0..=86_400.0).contains(&self.ramp_secs)) {
            return bad(format!(
                "ramp_secs must be within 0..=86400, got {}",
                self.ramp_secs
            ));
        }
        if !(self.request_timeout_secs.is_finite() && self.request_timeout_secs > 0.0) {
            return bad("request_timeout_secs must be > 0".into());
        }
        if let Some(u) = &self.user_model {
            u.validate()?;
        }
        self.default_headers()?;
        self.observer.validate().map_err(LoadgenError::Config)?;
        match self.workload {
            LoadKind::Multiturn => self.chat.validate().map_err(LoadgenError::Config),
            LoadKind::Synthetic => self.synthetic.validate().map_err(LoadgenError::Config),
        }
    }
}

impl LoadgenConfig {
    /// The headers sent with every request: `headers` and the API key's `Authorization`.
    pub fn default_headers(&self) -> Result<reqwest::header::HeaderMap, LoadgenError> {
        use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
        let bad = |m: String| LoadgenError::Config(m);
        if self.headers.len() > 64 {
            return Err(bad(format!(
                "at most 64 headers, got {}",
                self.headers.len()
            )));
        }
        let mut map = HeaderMap::new();
        for (k, v) in &self.headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| bad(format!("header {k:?} is not a header name")))?;
            let value = HeaderValue::from_str(v)
                .map_err(|_| bad(format!("header {k:?}: {v:?} is not a header value")))?;
            map.insert(name, value);
        }
        if let Some(key) = &self.api_key {
            let mut v = HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| bad("the API key is not a header value".into()))?;
            v.set_sensitive(true);
            map.insert(AUTHORIZATION, v);
        }
        Ok(map)
    }
}

/// One request as sent, beside its record.
#[derive(Clone, Debug, Serialize)]
pub struct TurnInfo {
    /// The conversation (or synthetic / trace request number).
    pub conversation: u64,
    /// The turn number, from 1.
    pub turn: u32,
    /// The worker's name, when the server said.
    pub worker: Option<String>,
}

/// Everything a run produced.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// One record per request sent, in completion order (empty when the observer keeps
    /// only its window).
    pub records: Vec<RequestRecord>,
    /// Parallel to `records`.
    pub turns: Vec<TurnInfo>,
    /// Worker names, by the number records use.
    pub workers: Vec<String>,
    /// How long the run took.
    pub duration: Duration,
}

/// Runs the load until every conversation has ended (or the duration is up).
pub async fn run(config: LoadgenConfig) -> Result<RunResult, LoadgenError> {
    let observer = Arc::new(Observer::new(&config.observer));
    let (_control, run) = start(config, observer)?;
    run.await
        .map_err(|e| LoadgenError::Config(format!("the run's task failed: {e}")))
}

/// Most tenants one [`run_tenants`] drives.
pub const MAX_TENANTS: usize = 64;

/// Several tenants' loads at once (each its own key, headers and load: a run of its own),
/// started together; their results in the same order. Every configuration is checked
/// before any starts.
pub async fn run_tenants(loads: Vec<LoadgenConfig>) -> Result<Vec<RunResult>, LoadgenError> {
    if loads.is_empty() || loads.len() > MAX_TENANTS {
        return Err(LoadgenError::Config(format!(
            "between 1 and {MAX_TENANTS} tenants, got {}",
            loads.len()
        )));
    }
    for c in &loads {
        c.validate()?;
    }
    let mut runs = Vec::with_capacity(loads.len());
    for config in loads {
        let observer = Arc::new(Observer::new(&config.observer));
        runs.push(start(config, observer)?);
    }
    let mut out = Vec::with_capacity(runs.len());
    // Each run's control lives until its run ended (dropping it cancels the run): the
    // later ones wait in the iterator while the earlier ones are awaited.
    for (_control, run) in runs {
        out.push(
            run.await
                .map_err(|e| LoadgenError::Config(format!("a tenant's run failed: {e}")))?,
        );
    }
    Ok(out)
}

/// Starts the load, reporting to `observer`; returns its control and the run, which ends
/// when every conversation has ended, the duration is up, or [`Control::stop`] was called.
pub fn start(
    config: LoadgenConfig,
    observer: Arc<Observer>,
) -> Result<(Control, tokio::task::JoinHandle<RunResult>), LoadgenError> {
    config.validate()?;
    observer.begin_run();
    let (control, ctx) = job::Ctx::new(config, observer)?;
    let handle = if ctx.config.rate.is_some() {
        tokio::spawn(open_loop::drive(ctx))
    } else {
        tokio::spawn(closed_loop::drive(ctx, control.clone()))
    };
    Ok((control, handle))
}
