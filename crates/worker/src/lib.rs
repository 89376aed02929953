//! A simulated inference worker: the project's engine ([`kvroute_engine::Engine`]) run in real
//! time behind an OpenAI-compatible HTTP server, publishing its KV cache events the way vLLM
//! does.
//!
//! [`spawn`] starts a worker on a listener and returns a [`WorkerHandle`]: the address, an
//! in-process subscription to the KV event batches, their replay, the ZMQ endpoints when
//! asked for, and a graceful [`WorkerHandle::shutdown`].
//!
//! HTTP: `POST /v1/chat/completions`, `POST /v1/completions` (streaming or not),
//! `GET /v1/models`, `GET /health`, `GET /metrics` (see [`metrics`](crate#metrics)),
//! `POST /admin/reset` (an engine restart: prefix cache dropped, event sequence back to 0,
//! replay buffer emptied). Every answer carries `x-request-id` (the client's, or a new one).
//!
//! Modules: `config` (settings), `driver` (the engine task, on a `kvroute_runtime::Clock` at
//! `speedup`: virtual time), `events` (numbering, replay buffer, broadcast), `zmq` (PUB and
//! replay ROUTER sockets), `http` (routes, errors, small endpoints), `generate` (the two
//! generation endpoints), `stream` (server-sent events), `text` (the ids answers are made of,
//! whose text tokenizes back to them), `metrics` (Prometheus text), `ids` (request ids).
//!
//! # Metrics
//!
//! See the `metrics` module: kvroute gauges and counters prefixed `kvroute_engine_` and
//! vLLM's `vllm:num_requests_running`, `vllm:num_requests_waiting`,
//! `vllm:kv_cache_usage_perc` and token counters.

mod config;
mod driver;
mod error;
mod events;
mod generate;
mod http;
mod ids;
mod kv_pull;
mod kv_transfer;
mod metrics;
mod stream;
mod text;
mod zmq;

pub use config::{SchedulingPolicy, WorkerConfig};
pub use error::WorkerError;
pub use zmq::END_SEQ;

use kvroute_engine::{Engine, EngineMetrics};
use kvroute_preprocess::Preprocessor;
use kvroute_protocol::kv_events::EventBatch;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;

/// Commands queued for the engine driver at most (senders wait beyond).
const COMMAND_QUEUE: usize = 1024;

/// How long [`WorkerHandle::shutdown`] waits for each task before aborting it.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// ZMQ endpoints to bind, e.g. `tcp://127.0.0.1:0` (port 0: any free port; the bound port is
/// reported by [`WorkerHandle::zmq_endpoints`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZmqConfig {
    /// The PUB socket of the event stream.
    pub publish: String,
    /// Connect the PUB socket to `publish` (a gateway bound there) instead of binding it.
    pub connect: bool,
    /// The ROUTER socket answering replay requests (vLLM's protocol, see [`END_SEQ`]).
    pub replay: Option<String>,
}

/// A worker's replay buffer, shareable across tasks.
#[derive(Clone)]
pub struct ReplaySource(Arc<events::EventHub>);

impl ReplaySource {
    /// The buffered batches with a sequence number of `seq` or more, in order.
    pub fn replay_from(&self, seq: u64) -> Vec<Arc<EventBatch>> {
        self.0.replay_from(seq)
    }
}

/// A running worker. Dropping it stops the worker too (without waiting for its tasks).
pub struct WorkerHandle {
    name: String,
    addr: SocketAddr,
    hub: Arc<events::EventHub>,
    snapshot: Arc<Mutex<EngineMetrics>>,
    zmq_publish: Option<String>,
    zmq_replay: Option<String>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHandle")
            .field("name", &self.name)
            .field("addr", &self.addr)
            .field("zmq_publish", &self.zmq_publish)
            .field("zmq_replay", &self.zmq_replay)
            .finish_non_exhaustive()
    }
}

impl WorkerHandle {
    /// The HTTP address the worker listens on.
    pub fn http_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL, e.g. `http://127.0.0.1:8000`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The worker's name (from the config).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The KV event batches published from now on (one per engine step with events,
    /// consecutive sequence numbers from 0, back to 0 after a reset). A receiver that falls
    /// more than 16,384 batches behind gets `Lagged` and can catch up with
    /// [`WorkerHandle::replay_from`].
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<EventBatch>> {
        self.hub.subscribe()
    }

    /// A cloneable handle on the replay buffer (for an in-process subscriber that keeps it
    /// apart from the worker handle).
    pub fn replay_source(&self) -> ReplaySource {
        ReplaySource(self.hub.clone())
    }

    /// The buffered batches with a sequence number of `seq` or more (the last
    /// `replay_buffer` batches of the current incarnation), in order.
    pub fn replay_from(&self, seq: u64) -> Vec<Arc<EventBatch>> {
        self.hub.replay_from(seq)
    }

    /// The ZMQ endpoints actually bound, `(publish, replay)`, when both sockets were asked
    /// for (see [`WorkerHandle::zmq_publish_endpoint`] for a publisher without replay).
    pub fn zmq_endpoints(&self) -> Option<(String, String)> {
        Some((self.zmq_publish.clone()?, self.zmq_replay.clone()?))
    }

    /// The ZMQ PUB endpoint actually bound, when asked for.
    pub fn zmq_publish_endpoint(&self) -> Option<String> {
        self.zmq_publish.clone()
    }

    /// The ZMQ replay (ROUTER) endpoint actually bound, when asked for.
    pub fn zmq_replay_endpoint(&self) -> Option<String> {
        self.zmq_replay.clone()
    }

    /// The engine's metrics as of the driver's last round.
    pub fn engine_metrics(&self) -> EngineMetrics {
        self.snapshot.lock().clone()
    }

    /// Stops gracefully: the server stops accepting, streams in progress end (with an error
    /// event and `[DONE]`), the sockets close, and every task is joined (each one aborted
    /// if it does not end within 5 seconds).
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        for (what, mut task) in std::mem::take(&mut self.tasks) {
            match tokio::time::timeout(SHUTDOWN_GRACE, &mut task).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(worker = %self.name, task = what, error = %e, "task failed")
                }
                Err(_) => {
                    tracing::warn!(worker = %self.name, task = what, "task did not stop in time; aborted");
                    task.abort();
                }
            }
        }
        tracing::info!(worker = %self.name, "worker stopped");
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// Resolves once `rx` says true or its sender is gone.
pub(crate) async fn wait_shutdown(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Starts a worker serving HTTP on `listener`, and ZMQ sockets when `zmq` is given.
pub async fn spawn(
    config: WorkerConfig,
    preprocessor: Preprocessor,
    listener: tokio::net::TcpListener,
    zmq: Option<ZmqConfig>,
) -> Result<WorkerHandle, WorkerError> {
    let mut engine_cfg = config.engine_config()?;
    let addr = listener.local_addr()?;
    let name = config.worker_name.clone();
    let pre = preprocessor.clone();
    let text = tokio::task::spawn_blocking(move || text::OutputText::build(&pre))
        .await
        .map_err(|e| WorkerError::Config(format!("building the output vocabulary: {e}")))?;
    text.log(&name);
    // Ids of the tokenizer whose text tokenizes back to them: answers sent back in the next
    // turn find their blocks cached (module `text`).
    engine_cfg.output_ids = text.output_ids();
    let engine = Engine::new(engine_cfg.clone())?;

    let mut hub = events::EventHub::new(config.replay_buffer, config.event_format)
        .with_replay_bytes(config.replay_buffer_bytes)
        .with_rank(config.data_parallel_rank);
    if config.event_format == kvroute_protocol::kv_events::EventFormat::Trtllm {
        hub = hub.with_pull(config.pull_buffer, engine_cfg.num_gpu_blocks as u64);
    }
    let hub = Arc::new(hub);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let (mut zmq_publish, mut zmq_replay) = (None, None);
    if let Some(z) = &zmq {
        let started = zmq::start(
            z,
            hub.clone(),
            config.topic.clone(),
            shutdown_rx.clone(),
            name.clone(),
        )
        .await?;
        zmq_publish = Some(started.publish);
        zmq_replay = started.replay;
        tasks.extend(started.tasks);
    }

    let clock = kvroute_runtime::Clock::new(config.speedup);
    let snapshot = Arc::new(Mutex::new(engine.metrics()));
    let (commands, command_rx) = mpsc::channel(COMMAND_QUEUE);
    let driver = driver::Driver::new(engine, clock, hub.clone(), snapshot.clone(), name.clone());
    tasks.push((
        "driver",
        tokio::spawn(driver.run(command_rx, shutdown_rx.clone())),
    ));

    let shared = Arc::new(http::Shared {
        metrics: metrics::Metrics::new(
            snapshot.clone(),
            clock,
            config.model.clone(),
            &config.profile,
            &engine_cfg,
        ),
        started: http::unix_now(),
        clock,
        rooms: Arc::default(),
        http: reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(5))
            .build()
            .map_err(|e| WorkerError::Config(format!("HTTP client: {e}")))?,
        ids: ids::IdGen::new(),
        text,
        commands,
        pre: preprocessor.clone(),
        cfg: config.clone(),
        hub: hub.clone(),
    });
    let app = http::router(shared, addr.ip().is_loopback());
    let mut stop = shutdown_rx.clone();
    let server_name = name.clone();
    tasks.push((
        "http",
        tokio::spawn(async move {
            kvroute_runtime::serve(
                listener,
                app,
                kvroute_runtime::ServeLimits::default(),
                None,
                async move { wait_shutdown(&mut stop).await },
            )
            .await;
            tracing::debug!(worker = %server_name, "HTTP server stopped");
        }),
    ));
    tracing::info!(
        worker = %name,
        addr = %addr,
        model = %config.model,
        profile = %config.profile,
        block_size = engine_cfg.block_size,
        kv_blocks = engine_cfg.num_gpu_blocks,
        speedup = config.speedup,
        tokenizer = %preprocessor.describe(),
        zmq_publish = ?zmq_publish,
        zmq_replay = ?zmq_replay,
        "worker started"
    );
    Ok(WorkerHandle {
        name,
        addr,
        hub,
        snapshot,
        zmq_publish,
        zmq_replay,
        shutdown: shutdown_tx,
        tasks,
    })
}
