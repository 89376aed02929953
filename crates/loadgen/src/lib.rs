//! The load generator: multi-turn chat conversations against any OpenAI-compatible endpoint
//! (ours, vLLM, anyone's), streamed, closed loop at a fixed concurrency, one record per turn
//! in the simulator's format ([`RequestRecord`]) so live runs and simulations share their
//! statistics and reports.
//!
//! Each of `concurrency` tasks runs one conversation at a time, turn after turn (the answer
//! of a turn goes into the next one's history), until the conversation or the run ends. A
//! failed or rejected turn is recorded and ends its conversation; nothing is dropped from the
//! records.

mod replay;
mod turn;

pub use replay::{replay, ReplayConfig};
pub use turn::TurnResult;

use kvroute_core::{RequestId, Time};
use kvroute_workload::{ChatConfig, ChatWorkload, RequestRecord, Status};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Settings of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoadgenConfig {
    /// Base URL of the endpoint, e.g. `http://127.0.0.1:8000`.
    pub target: String,
    /// The `model` of every request.
    pub model: String,
    /// Conversations in flight at once.
    pub concurrency: usize,
    /// Conversations to start in all.
    pub conversations: u64,
    /// Stop starting turns after this many seconds (0: no limit).
    pub duration_secs: f64,
    /// Seconds one turn may take.
    pub request_timeout_secs: f64,
    /// Send `ignore_eos: true` (vLLM, SGLang and kvroute's worker honour it) so every turn
    /// generates `max_tokens` tokens.
    pub ignore_eos: bool,
    /// Seed of the conversations.
    pub seed: u64,
    /// The conversations' shape.
    pub chat: ChatConfig,
}

impl Default for LoadgenConfig {
    fn default() -> Self {
        Self {
            target: "http://127.0.0.1:8000".into(),
            model: "kvroute-sim".into(),
            concurrency: 8,
            conversations: 40,
            duration_secs: 0.0,
            request_timeout_secs: 300.0,
            ignore_eos: true,
            seed: 0,
            chat: ChatConfig::default(),
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

impl LoadgenConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), LoadgenError> {
        let bad = |m: String| Err(LoadgenError::Config(m));
        if !(self.target.starts_with("http://") || self.target.starts_with("https://")) {
            return bad(format!("target {:?} must be an http(s) URL", self.target));
        }
        if self.concurrency == 0 || self.concurrency > 100_000 {
            return bad(format!(
                "concurrency must be within 1..=100000, got {}",
                self.concurrency
            ));
        }
        if self.conversations == 0 {
            return bad("conversations must be > 0".into());
        }
        if !(self.duration_secs.is_finite() && self.duration_secs >= 0.0) {
            return bad("duration_secs must be >= 0".into());
        }
        if !(self.request_timeout_secs.is_finite() && self.request_timeout_secs > 0.0) {
            return bad("request_timeout_secs must be > 0".into());
        }
        self.chat.validate().map_err(LoadgenError::Config)
    }
}

/// One turn as sent, beside its record.
#[derive(Clone, Debug, Serialize)]
pub struct TurnInfo {
    /// The conversation.
    pub conversation: u64,
    /// The turn number, from 1.
    pub turn: u32,
    /// The worker's name, when the server said.
    pub worker: Option<String>,
}

/// Everything a run produced.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// One record per turn sent, in completion order.
    pub records: Vec<RequestRecord>,
    /// Parallel to `records`.
    pub turns: Vec<TurnInfo>,
    /// Worker names, by the number records use.
    pub workers: Vec<String>,
    /// How long the run took.
    pub duration: Duration,
}

/// What the tasks collect: records, their turns, and worker names by number.
type Collected = (Vec<RequestRecord>, Vec<TurnInfo>, BTreeMap<String, u64>);

struct Shared {
    workload: Mutex<ChatWorkload>,
    started: Mutex<u64>,
    out: Mutex<Collected>,
}

/// The most closed-loop slots a run may grow to.
pub const MAX_CONCURRENCY: usize = 100_000;

/// Steers a running load: its concurrency (changed without cutting conversations short)
/// and stopping.
#[derive(Clone)]
pub struct Control {
    tx: Arc<watch::Sender<Ctl>>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Ctl {
    concurrency: usize,
    stop: bool,
}

impl Control {
    /// Sets the conversations in flight. Slots above the new level finish their current
    /// conversation, then wait; new slots start at once.
    pub fn set_concurrency(&self, n: usize) {
        let n = n.clamp(1, MAX_CONCURRENCY);
        self.tx.send_modify(|c| c.concurrency = n);
    }

    /// The concurrency asked for.
    pub fn concurrency(&self) -> usize {
        self.tx.borrow().concurrency
    }

    /// Starts no more turns; turns in flight finish.
    pub fn stop(&self) {
        self.tx.send_modify(|c| c.stop = true);
    }
}

/// Runs the load until every conversation has ended (or the duration is up).
pub async fn run(config: LoadgenConfig) -> Result<RunResult, LoadgenError> {
    let (_control, run) = start(config)?;
    run.await
        .map_err(|e| LoadgenError::Config(format!("the run's task failed: {e}")))
}

/// Starts the load; returns its control and the run, which ends when every conversation has
/// ended, the duration is up, or [`Control::stop`] was called.
pub fn start(
    config: LoadgenConfig,
) -> Result<(Control, tokio::task::JoinHandle<RunResult>), LoadgenError> {
    config.validate()?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(config.concurrency.min(1024))
        .build()?;
    let workload =
        ChatWorkload::new(config.chat.clone(), config.seed).map_err(LoadgenError::Config)?;
    let shared = Arc::new(Shared {
        workload: Mutex::new(workload),
        started: Mutex::new(0),
        out: Mutex::new((Vec::new(), Vec::new(), BTreeMap::new())),
    });
    let (tx, rx) = watch::channel(Ctl {
        concurrency: config.concurrency,
        stop: false,
    });
    let control = Control { tx: Arc::new(tx) };
    let config = Arc::new(config);
    let supervisor = control.clone();
    let run = tokio::spawn(async move {
        let t0 = Instant::now();
        let url = format!(
            "{}/v1/chat/completions",
            config.target.trim_end_matches('/')
        );
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let mut ctl_rx = rx.clone();
        let (mut spawned, mut finished) = (0usize, 0usize);
        loop {
            let ctl = *ctl_rx.borrow_and_update();
            while spawned < ctl.concurrency {
                let slot = Slot {
                    index: spawned,
                    shared: shared.clone(),
                    config: config.clone(),
                    client: client.clone(),
                    url: url.clone(),
                    t0,
                    ctl: rx.clone(),
                };
                let done = done_tx.clone();
                tokio::spawn(async move {
                    slot.drive().await;
                    let _ = done.send(());
                });
                spawned += 1;
            }
            if finished == spawned {
                break;
            }
            tokio::select! {
                changed = ctl_rx.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                Some(()) = done_rx.recv() => {
                    finished += 1;
                    // A slot ends only when no conversation is left to start (or the run
                    // stops): wake the slots waiting above the concurrency to see it too.
                    supervisor.tx.send_modify(|_| {});
                }
            }
        }
        collect(&shared.out, t0)
    });
    Ok((control, run))
}

/// The run's result from what its tasks collected.
fn collect(out: &Mutex<Collected>, t0: Instant) -> RunResult {
    let duration = t0.elapsed();
    let (records, turns, names) =
        std::mem::take(&mut *out.lock().unwrap_or_else(|e| e.into_inner()));
    let mut workers = vec![String::new(); names.len()];
    for (name, i) in names {
        workers[i as usize] = name;
    }
    RunResult {
        records,
        turns,
        workers,
        duration,
    }
}

/// One closed-loop slot: conversations one after another while its index is below the
/// concurrency.
struct Slot {
    index: usize,
    shared: Arc<Shared>,
    config: Arc<LoadgenConfig>,
    client: reqwest::Client,
    url: String,
    t0: Instant,
    ctl: watch::Receiver<Ctl>,
}

impl Slot {
    fn time_up(&self) -> bool {
        self.config.duration_secs > 0.0
            && self.t0.elapsed().as_secs_f64() >= self.config.duration_secs
    }

    fn exhausted(&self) -> bool {
        *self
            .shared
            .started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            >= self.config.conversations
    }

    async fn drive(mut self) {
        let timeout = Duration::from_secs_f64(self.config.request_timeout_secs);
        loop {
            let ctl = *self.ctl.borrow_and_update();
            if ctl.stop || self.time_up() || self.exhausted() {
                return;
            }
            if self.index >= ctl.concurrency {
                if self.ctl.changed().await.is_err() {
                    return;
                }
                continue;
            }
            let first = {
                let mut started = self
                    .shared
                    .started
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if *started >= self.config.conversations {
                    return;
                }
                *started += 1;
                self.shared
                    .workload
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .start()
            };
            let mut next = Some(first);
            while let Some(turn) = next.take() {
                let sent = Instant::now();
                let r = turn::send(
                    &self.client,
                    &self.url,
                    &self.config.model,
                    &turn,
                    self.config.ignore_eos,
                    timeout,
                )
                .await;
                let ok = r.status == Status::Completed;
                let answer = r.answer.clone();
                record(
                    &self.shared.out,
                    turn.conversation,
                    turn.turn,
                    Some(turn.conversation),
                    sent,
                    self.t0,
                    r,
                );
                let stop = self.ctl.borrow().stop;
                let mut w = self
                    .shared
                    .workload
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if !ok || stop || self.time_up() {
                    w.end(turn.conversation);
                } else {
                    next = w.follow_up(turn.conversation, &answer);
                }
            }
        }
    }
}

/// Keeps what a request measured: its record (`session` for affinity, if any) and which
/// conversation turn (or trace request, as turn 1) it was.
fn record(
    out: &Mutex<Collected>,
    conversation: u64,
    turn: u32,
    session: Option<u64>,
    sent: Instant,
    t0: Instant,
    r: TurnResult,
) {
    let at = |i: Instant| Time(i.duration_since(t0));
    let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
    let (records, turns, names) = &mut *out;
    let worker = r.worker.as_ref().map(|name| {
        let n = names.len() as u64;
        *names.entry(name.clone()).or_insert(n)
    });
    let usage = r.usage.clone().unwrap_or_default();
    let mut rec = RequestRecord::new(
        RequestId(records.len() as u64),
        at(sent),
        usage.prompt_tokens,
    );
    rec.worker = worker;
    rec.session = session;
    rec.first_token = r.first_token.map(at);
    rec.finished = Some(at(r.finished));
    rec.cached_tokens = usage.cached_tokens();
    rec.output_tokens = if r.usage.is_some() {
        usage.completion_tokens
    } else {
        r.chunks
    };
    rec.status = r.status;
    for g in r.gaps {
        rec.push_gaps(g, 1);
    }
    records.push(rec);
    turns.push(TurnInfo {
        conversation,
        turn,
        worker: r.worker,
    });
}
