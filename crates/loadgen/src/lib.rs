//! The load generator: multi-turn chat conversations against any OpenAI-compatible endpoint
//! (ours, vLLM, anyone's), streamed, closed loop at a fixed concurrency, one record per turn
//! in the simulator's format ([`RequestRecord`]) so live runs and simulations share their
//! statistics and reports.
//!
//! Each of `concurrency` tasks runs one conversation at a time, turn after turn (the answer
//! of a turn goes into the next one's history), until the conversation or the run ends. A
//! failed or rejected turn is recorded and ends its conversation; nothing is dropped from the
//! records.

mod turn;

pub use turn::TurnResult;

use kvroute_core::{RequestId, Time};
use kvroute_workload::{ChatConfig, ChatWorkload, RequestRecord, Status};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// Runs the load until every conversation has ended (or the duration is up).
pub async fn run(config: LoadgenConfig) -> Result<RunResult, LoadgenError> {
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
    let config = Arc::new(config);
    let t0 = Instant::now();
    let url = format!(
        "{}/v1/chat/completions",
        config.target.trim_end_matches('/')
    );
    let tasks: Vec<_> = (0..config.concurrency)
        .map(|_| {
            let (shared, config, client, url) =
                (shared.clone(), config.clone(), client.clone(), url.clone());
            tokio::spawn(async move { drive(&shared, &config, &client, &url, t0).await })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    let duration = t0.elapsed();
    let (records, turns, names) =
        std::mem::take(&mut *shared.out.lock().unwrap_or_else(|e| e.into_inner()));
    let mut workers = vec![String::new(); names.len()];
    for (name, i) in names {
        workers[i as usize] = name;
    }
    Ok(RunResult {
        records,
        turns,
        workers,
        duration,
    })
}

/// One closed-loop slot: conversations one after another.
async fn drive(
    shared: &Shared,
    config: &LoadgenConfig,
    client: &reqwest::Client,
    url: &str,
    t0: Instant,
) {
    let timeout = Duration::from_secs_f64(config.request_timeout_secs);
    let time_up = |now: Instant| {
        config.duration_secs > 0.0 && now.duration_since(t0).as_secs_f64() >= config.duration_secs
    };
    loop {
        let first = {
            let mut started = shared.started.lock().unwrap_or_else(|e| e.into_inner());
            if *started >= config.conversations || time_up(Instant::now()) {
                return;
            }
            *started += 1;
            shared
                .workload
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .start()
        };
        let mut next = Some(first);
        while let Some(turn) = next.take() {
            let sent = Instant::now();
            let r = turn::send(
                client,
                url,
                &config.model,
                &turn,
                config.ignore_eos,
                timeout,
            )
            .await;
            let ok = r.status == Status::Completed;
            let answer = r.answer.clone();
            record(shared, &turn, sent, t0, r);
            let mut w = shared.workload.lock().unwrap_or_else(|e| e.into_inner());
            if !ok || time_up(Instant::now()) {
                w.end(turn.conversation);
            } else {
                next = w.follow_up(turn.conversation, &answer);
            }
        }
    }
}

fn record(
    shared: &Shared,
    turn: &kvroute_workload::ChatTurn,
    sent: Instant,
    t0: Instant,
    r: TurnResult,
) {
    let at = |i: Instant| Time(i.duration_since(t0));
    let mut out = shared.out.lock().unwrap_or_else(|e| e.into_inner());
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
    rec.session = Some(turn.conversation);
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
        conversation: turn.conversation,
        turn: turn.turn,
        worker: r.worker,
    });
}
