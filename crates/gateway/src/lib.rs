//! The kvroute gateway: an OpenAI-compatible HTTP front for N engine replicas that routes
//! each request to the replica where it will get its first token soonest, weighing cached
//! prefixes (a prefix index fed by the engines' KV events) against load.
//!
//! A request goes: checked ([`kvroute_protocol::openai`]) -> rendered and tokenized
//! ([`kvroute_preprocess`]) -> cut into blocks -> routed by the same core the simulator uses
//! (index lookup, policy, admission queue) -> booked in the ledger -> forwarded to the worker
//! unchanged -> the answer streamed back while the gateway watches for the first token and
//! usage; the booking is released by an RAII guard on first token, end, error or disconnect.

mod api;
pub mod epp;
mod error;
mod explanation;
mod gateway;
mod pools;
mod proxy;
mod reload;
mod routing;

pub use error::GatewayError;
pub use explanation::{EXPLAIN_HEADER, MAX_EXPLAINED_WORKERS, ROUTE_HEADER};
pub use gateway::Gateway;
/// The settings (the fleet crate's tree), as the gateway's API takes them.
pub use kvroute_fleet::config;
pub use kvroute_fleet::config::{ConfigError, GatewayConfig, WorkerSpec};
pub use kvroute_fleet::feed::{EventFeed, FeedItem, Replay};
pub use kvroute_fleet::headers::{
    DP_RANK_HEADER, MIGRATE_HEADER, PREDICTED_CACHED_HEADER, REQUEST_ID_HEADER, WORKER_HEADER,
};
pub use pools::Pools;
pub use reload::{ReloadReport, LIVE_KEYS};

use kvroute_core::Router;
use kvroute_fleet::{clock, health, membership, metrics, tasks};
use kvroute_preprocess::Preprocessor;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinHandle;

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Bad settings.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The tokenizer could not be loaded.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] kvroute_preprocess::PreprocessError),
    /// The router refused the settings.
    #[error(transparent)]
    Router(#[from] kvroute_core::RouteError),
    /// Metrics could not be registered.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The TLS certificate or key could not be read or used.
    #[error("tls: {0}")]
    Tls(String),
    /// The HTTP client could not be built.
    #[error("http client: {0}")]
    Client(#[from] reqwest::Error),
    /// Socket trouble.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The event plane could not be set up.
    #[error("event plane: {0}")]
    Plane(String),
}

/// The preprocessor the settings ask for: `builtin`, a directory, or approximate mode.
pub fn load_preprocessor(config: &GatewayConfig) -> Result<Preprocessor, StartError> {
    let pre = match config.tokenizer.as_deref() {
        None => Preprocessor::approximate(),
        Some(spec) => Preprocessor::from_spec(spec)?,
    };
    let pool = kvroute_preprocess::TokenizePool::new(
        config.limits.tokenizer_threads,
        config.limits.tokenizer_queue,
    )?;
    Ok(pre
        .with_max_input_bytes(config.limits.max_body_bytes)
        .with_cache_bytes(config.limits.tokenizer_cache_bytes)
        .with_pool(pool))
}

/// A running gateway.
pub struct GatewayHandle {
    addr: SocketAddr,
    /// The first pool (the only one without `[[pools]]`).
    state: Arc<Gateway>,
    /// Every pool.
    front: Arc<pools::Pools>,
    /// Each pool's reload state, in the pools' order.
    reloads: Vec<reload::Reloads>,
    /// The discovery sources shared between the pools, as started (a change waits for a
    /// restart).
    shared_discovery: Option<config::DiscoveryConfig>,
    tasks: tasks::Tasks,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
}

impl GatewayHandle {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The shared state (tests, the demo): the first pool's.
    pub fn state(&self) -> &Arc<Gateway> {
        &self.state
    }

    /// Every pool (one without `[[pools]]`).
    pub fn pools(&self) -> &Arc<pools::Pools> {
        &self.front
    }

    /// Stops accepting, lets requests in flight finish, stops background tasks.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
        self.stop_tasks().await;
    }

    /// Ends the gateway's background tasks and every worker's, waiting until they have.
    async fn stop_tasks(&self) {
        for (_, gw) in self.front.all() {
            for w in gw.registry.all() {
                w.stop_tasks();
            }
        }
        if !self.tasks.stopped().await {
            tracing::warn!("background tasks did not end within 5 s of the stop");
        }
    }

    /// Waits until the server stops (it stops on [`GatewayHandle::shutdown`]; failures to
    /// accept a connection are logged and retried, not fatal).
    pub async fn wait(mut self) -> std::io::Result<()> {
        let r = match self.server.take() {
            Some(s) => s.await.map_err(std::io::Error::other),
            None => Ok(()),
        };
        self.stop_tasks().await;
        r
    }
}

/// Expires the router's approximate guesses and idle sessions once a second (dispatches
/// expire guesses too; this keeps an idle gateway's memory honest).
async fn prune(gw: Arc<Gateway>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = gw.now();
        gw.table.update(|r| r.prune(now));
    }
}

/// Starts the gateway on `listener` with `preprocessor`. Workers with a ZMQ `events`
/// endpoint are subscribed; `feeds` gives other workers' event feeds by their index in
/// `config.workers` once data-parallel engines are expanded into one worker per rank (the
/// one-process demo wires in-process channels this way). A worker with
/// neither, and every worker when the preprocessor is approximate (its pseudo tokens are not
/// the engine's), is tracked approximately: from what the gateway routed to it.
pub async fn spawn(
    config: GatewayConfig,
    preprocessor: Preprocessor,
    listener: tokio::net::TcpListener,
    feeds: BTreeMap<usize, EventFeed>,
) -> Result<GatewayHandle, StartError> {
    spawn_pools(
        config,
        vec![PoolStart {
            preprocessor,
            feeds,
        }],
        listener,
    )
    .await
}

/// What one pool starts with: its preprocessor and its workers' in-process event feeds (as
/// [`spawn`]'s).
pub struct PoolStart {
    /// Its chat template and tokenizer ([`load_preprocessor`] of the pool's settings).
    pub preprocessor: Preprocessor,
    /// Event feeds by worker index (see [`spawn`]).
    pub feeds: BTreeMap<usize, EventFeed>,
}

/// Starts a gateway serving every pool of `config` (`[[pools]]`, or the one its top level
/// describes) on `listener`, `starts` giving each pool's preprocessor and feeds in order.
pub async fn spawn_pools(
    config: GatewayConfig,
    starts: Vec<PoolStart>,
    listener: tokio::net::TcpListener,
) -> Result<GatewayHandle, StartError> {
    config.validate()?;
    let pools = config.pools()?;
    if starts.len() != pools.len() {
        return Err(StartError::Config(ConfigError(format!(
            "{} pools, {} preprocessors",
            pools.len(),
            starts.len()
        ))));
    }
    let tasks = tasks::Tasks::new();
    let clock = clock::Clock::starting_now();
    let shared = config.shared_discovery();
    let mut started = Vec::with_capacity(pools.len());
    let mut shares = Vec::new();
    for (pool, start) in pools.into_iter().zip(starts) {
        // With discovery shared between pools, each pool's discovery task takes its share.
        let share = shared
            .as_ref()
            .map(|_| tokio::sync::watch::channel(Vec::new()));
        let (tx, rx) = share.unzip();
        let (gw, reloads) = start_pool(pool.config, start, clock, &tasks, rx).await?;
        if let Some(tx) = tx {
            shares.push(kvroute_discovery::shared::PoolShare {
                name: pool.name.clone(),
                models: gw.models.clone(),
                share: tx,
            });
        }
        started.push((pool.name, gw, reloads));
    }
    if let Some(cfg) = &shared {
        let first = &started[0].1;
        let asking = kvroute_discovery::shared::Asking {
            upstream: first.upstream.clone(),
            timeout: std::time::Duration::from_secs_f64(first.config().health.timeout_secs),
        };
        tasks.spawn(kvroute_discovery::shared::run(cfg.clone(), shares, asking));
    }
    let gw = started[0].1.clone();
    let addr = listener.local_addr()?;
    let loopback = addr.ip().is_loopback();
    if !loopback && config.auth.api_keys.is_empty() {
        tracing::warn!(%addr, "no API keys: the OpenAI API is open to anyone who reaches this address (auth.api_keys or KVROUTE_API_KEYS)");
    }
    if !loopback && config.auth.admin_key.is_none() {
        tracing::info!(%addr, "/debug/reset is off: no admin key and not on loopback");
    }
    // The tenants' keys of every pool are accepted.
    let mut policy = config.access_policy(loopback);
    if !policy.api_keys.is_empty() {
        for (_, g, _) in &started {
            policy
                .api_keys
                .extend(g.config().access_policy(loopback).api_keys);
        }
        policy.api_keys.sort();
        policy.api_keys.dedup();
    }
    let front = Arc::new(pools::Pools::new(
        started
            .iter()
            .map(|(n, g, _)| (n.clone(), g.clone()))
            .collect(),
    ));
    let app = api::routes(front.clone(), &Arc::new(policy));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let limits = config.serve_limits();
    let tls = load_tls(&config.tls)?;
    let server = tokio::spawn(async move {
        kvroute_runtime::serve(listener, app, limits, tls, async move {
            let _ = rx.await;
        })
        .await
    });
    for (name, g, _) in &started {
        tracing::info!(%addr, pool = %name, tls = config.tls.enabled(), policy = g.policy, preprocessor = %g.preprocessor.describe(), workers = g.config().workers.len(), "gateway listening");
    }
    Ok(GatewayHandle {
        addr,
        state: gw,
        front,
        reloads: started.into_iter().map(|(_, _, r)| r).collect(),
        shared_discovery: shared,
        tasks,
        shutdown: Some(tx),
        server: Some(server),
    })
}

/// One pool's router, gateway and background tasks (on `tasks`), and its reload state.
async fn start_pool(
    config: GatewayConfig,
    start: PoolStart,
    clock: clock::Clock,
    tasks: &tasks::Tasks,
    shared: Option<tokio::sync::watch::Receiver<Vec<WorkerSpec>>>,
) -> Result<(Arc<Gateway>, reload::Reloads), StartError> {
    let PoolStart {
        preprocessor,
        mut feeds,
    } = start;
    let given = config.clone();
    let configured = config.workers.clone();
    let mut config = config.with_ranks_expanded();
    config.validate_pool(shared.is_none())?;
    let replica = kvroute_plane::incarnation();
    if config.plane.as_ref().is_some_and(|p| p.share_load) {
        // Replicas deciding at the same instant must not break ties alike (the same seed and
        // decision count would send them all to one worker): each mixes in its own id.
        config.router.seed = kvroute_core::hashing::splitmix64(config.router.seed ^ replica);
    }
    let mut router = Router::new(config.router.clone())?;
    // Its id among the replicas, the one its shared bookings carry: its turn in a burst
    // (`router.peer_hold_secs`).
    router.set_replica(replica);
    // Requests may be split between a prefill and a decode worker where the gateway speaks
    // the engines' transfer protocol (`upstream.kv_transfer`).
    router
        .set_split_prefill(config.upstream.kv_transfer != kvroute_fleet::config::KvTransfer::None);
    for (i, w) in config.workers.iter().enumerate() {
        let t = membership::tracking_of(preprocessor.is_approximate(), w, feeds.contains_key(&i));
        let id = kvroute_core::WorkerId(i as u64 + 1);
        router.add_worker_with(id, config.capacity_of(w), t)?;
        router.set_role(id, w.role);
    }
    let client = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs_f64(
            config.upstream.connect_timeout_secs,
        ))
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        // Workers are peers reached directly: no proxy from the environment (`HTTP_PROXY`)
        // and no redirects followed (a worker's 3xx goes back to the client as it is).
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let gw = Arc::new(Gateway::new(
        config,
        preprocessor,
        router,
        client,
        metrics::Metrics::new()?,
        clock,
    ));
    match &gw.config().plane {
        Some(p)
            if p.share_load
                || gw
                    .config()
                    .workers
                    .iter()
                    .any(WorkerSpec::events_from_plane) =>
        {
            let conn = kvroute_plane::connect(p, "kvroute-gateway")
                .await
                .map_err(|e| StartError::Plane(format!("connecting to {}: {e}", p.url)))?;
            if p.share_load {
                kvroute_plane::share_load(tasks, &gw.sink, &gw.bookings, &conn, p, replica);
            }
            if p.snapshot_secs > 0.0 {
                kvroute_plane::write_snapshots(tasks, &gw.sink, &conn, p);
            }
            let _ = gw
                .fleet
                .set_plane(Arc::new(kvroute_plane::NatsFeeds::new(conn, p.clone())));
        }
        _ => {}
    };
    membership::start_events(&gw.fleet, &gw.registry.all(), &mut feeds)?;
    let configured = if gw.config().discovery.enabled() || shared.is_some() {
        let (tx, rx) = tokio::sync::watch::channel(configured);
        tasks.spawn(kvroute_discovery::run(gw.fleet.clone(), rx, shared));
        Some(tx)
    } else {
        None
    };
    tasks.spawn(health::run(gw.health.clone()));
    tasks.spawn(prune(gw.clone()));
    tasks.spawn(routing::queue::drive(gw.clone()));
    Ok((gw, reload::Reloads::new(given, configured)))
}

/// The listener's TLS setup from the configured PEM files (none when TLS is off).
fn load_tls(config: &config::TlsConfig) -> Result<Option<kvroute_runtime::Tls>, StartError> {
    let (Some(cert), Some(key)) = (&config.cert_file, &config.key_file) else {
        return Ok(None);
    };
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| StartError::Tls(format!("reading {}: {e}", path.display())))
    };
    let (cert_pem, key_pem) = (read(cert)?, read(key)?);
    kvroute_runtime::Tls::from_pem(&cert_pem, &key_pem)
        .map(Some)
        .map_err(|e| StartError::Tls(format!("{} and {}: {e}", cert.display(), key.display())))
}
