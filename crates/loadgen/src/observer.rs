//! What a load observes. Every request's outcome goes, under one lock, to the run's records
//! (when kept), the rolling [`Window`], the running totals and the [`Conversations`] store;
//! the closed loop, the open loop and the trace replay all report here.

use crate::conversations::{ConversationDetail, ConversationStatus, ConversationSummary};
use crate::conversations::{Conversations, TurnView};
use crate::turn::TurnResult;
use crate::window::{Window, WindowStats};
use crate::{RunResult, TurnInfo};
use kvroute_core::{RequestId, Time};
use kvroute_workload::{ChatTurn, RequestRecord, Status};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Bounds and span of what a load keeps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObserverConfig {
    /// Length of the rolling window, in seconds.
    pub window_secs: f64,
    /// Most turns the window holds (beyond, it covers less than its span and says so).
    pub max_window_records: usize,
    /// Most conversations kept for the list and detail views.
    pub max_conversations: usize,
    /// Longest message kept in a transcript, in bytes.
    pub max_message_bytes: usize,
    /// Keep every record for the run's result (a bounded run); a long-lived load driven by
    /// the dashboard keeps only its window.
    pub keep_records: bool,
}

impl Default for ObserverConfig {
    fn default() -> Self {
        Self {
            window_secs: 60.0,
            max_window_records: 20_000,
            max_conversations: 500,
            max_message_bytes: 8 << 10,
            keep_records: true,
        }
    }
}

impl ObserverConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.window_secs.is_finite() && self.window_secs > 0.0 && self.window_secs <= 86_400.0)
        {
            return Err(format!(
                "window_secs must be within (0, 86400], got {}",
                self.window_secs
            ));
        }
        if self.max_window_records == 0 || self.max_window_records > 10_000_000 {
            return Err("max_window_records must be within 1..=10000000".into());
        }
        if self.max_conversations == 0 || self.max_conversations > 1_000_000 {
            return Err("max_conversations must be within 1..=1000000".into());
        }
        if self.max_message_bytes > 16 << 20 {
            return Err("max_message_bytes must be at most 16 MiB".into());
        }
        Ok(())
    }
}

/// Counts since the current run started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct Totals {
    /// Requests that ended (completed, failed or rejected).
    pub sent: u64,
    /// Completed.
    pub completed: u64,
    /// Failed after dispatch (errors, dropped streams, timeouts).
    pub failed: u64,
    /// Refused before dispatch (shed, queue full).
    pub rejected: u64,
    /// Cut off by a stop, not counted as sent.
    pub cancelled: u64,
    /// In flight now.
    pub in_flight: u64,
    /// Prompt tokens of completed requests.
    pub input_tokens: u64,
    /// Cached prompt tokens of completed requests.
    pub cached_tokens: u64,
    /// Output tokens of completed requests.
    pub output_tokens: u64,
}

/// One finished request, as the loops hand it over.
pub(crate) struct Finished {
    /// Its conversation (or trace request number).
    pub conversation: u64,
    /// Its turn, from 1.
    pub turn: u32,
    /// Whether it is a conversation's turn (kept in the conversation store).
    pub chat: bool,
    /// When it was due to be sent (TTFT counts from here).
    pub sent: Instant,
    /// What it measured.
    pub result: TurnResult,
    /// Whether its conversation ends with it, and how.
    pub ends: Option<ConversationStatus>,
}

#[derive(Debug)]
struct State {
    records: Vec<RequestRecord>,
    turns: Vec<TurnInfo>,
    names: BTreeMap<String, u64>,
    window: Window,
    conversations: Conversations,
    totals: Totals,
    run_started: Instant,
}

/// The shared sink of a load's outcomes.
#[derive(Debug)]
pub struct Observer {
    epoch: Instant,
    keep_records: bool,
    state: Mutex<State>,
}

impl Observer {
    /// An observer whose clock starts now (records' times count from here).
    pub fn new(config: &ObserverConfig) -> Self {
        let now = Instant::now();
        Self {
            epoch: now,
            keep_records: config.keep_records,
            state: Mutex::new(State {
                records: Vec::new(),
                turns: Vec::new(),
                names: BTreeMap::new(),
                window: Window::new(
                    Duration::from_secs_f64(config.window_secs),
                    config.max_window_records,
                ),
                conversations: Conversations::new(
                    config.max_conversations,
                    config.max_message_bytes,
                ),
                totals: Totals::default(),
                run_started: now,
            }),
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// The instant records' times count from.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// A new run starts: the window and the totals start empty (conversations are kept).
    pub fn begin_run(&self) {
        let mut s = self.lock();
        s.window.clear();
        s.totals = Totals::default();
        s.run_started = Instant::now();
    }

    /// A conversation's turn is being sent.
    pub(crate) fn chat_turn_started(&self, turn: &ChatTurn) {
        let mut s = self.lock();
        s.totals.in_flight += 1;
        let user = turn.messages.last().map_or("", |m| m.content.as_str());
        s.conversations
            .begin_turn(turn.conversation, turn.turn, turn.turns, &turn.topic, user);
    }

    /// A request outside any conversation is being sent.
    pub(crate) fn request_started(&self) {
        self.lock().totals.in_flight += 1;
    }

    /// A request in flight was cut off by a stop (its conversation, if any, ends stopped).
    pub(crate) fn cancelled(&self, conversation: Option<u64>) {
        let mut s = self.lock();
        s.totals.in_flight = s.totals.in_flight.saturating_sub(1);
        s.totals.cancelled += 1;
        if let Some(id) = conversation {
            s.conversations.end(id, ConversationStatus::Stopped);
        }
    }

    /// A conversation ends between turns.
    pub(crate) fn conversation_ended(&self, id: u64, status: ConversationStatus) {
        self.lock().conversations.end(id, status);
    }

    /// A request ended: its record goes everywhere it is kept.
    pub(crate) fn finished(&self, f: Finished) {
        let at = |i: Instant| Time(i.saturating_duration_since(self.epoch));
        let r = f.result;
        let usage = r.usage.clone().unwrap_or_default();
        let mut s = self.lock();
        let worker = r.worker.as_ref().map(|name| {
            let n = s.names.len() as u64;
            *s.names.entry(name.clone()).or_insert(n)
        });
        let mut rec = RequestRecord::new(RequestId(s.totals.sent), at(f.sent), usage.prompt_tokens);
        rec.worker = worker;
        rec.session = f.chat.then_some(f.conversation);
        rec.first_token = r.first_token.map(at);
        rec.finished = Some(at(r.finished));
        rec.cached_tokens = usage.cached_tokens();
        rec.predicted_cached_tokens = r.predicted_cached_tokens.unwrap_or(0);
        rec.output_tokens = if r.usage.is_some() {
            usage.completion_tokens
        } else {
            r.chunks
        };
        rec.status = r.status.clone();
        for &g in &r.gaps {
            rec.push_gaps(g, 1);
        }
        let t = &mut s.totals;
        t.in_flight = t.in_flight.saturating_sub(1);
        t.sent += 1;
        match &rec.status {
            Status::Completed => {
                t.completed += 1;
                t.input_tokens += rec.input_tokens;
                t.cached_tokens += rec.cached_tokens;
                t.output_tokens += rec.output_tokens;
            }
            Status::Failed(_) => t.failed += 1,
            Status::Rejected(_) => t.rejected += 1,
        }
        if f.chat {
            let view = turn_view(&rec, &r, f.turn);
            s.conversations.end_turn(f.conversation, view, f.ends);
        }
        if self.keep_records {
            s.records.push(rec.clone());
            s.turns.push(TurnInfo {
                conversation: f.conversation,
                turn: f.turn,
                worker: r.worker,
            });
        }
        s.window.push(rec);
    }

    /// The rolling window's figures now.
    pub fn window(&self) -> WindowStats {
        let now = Time(self.epoch.elapsed());
        let mut s = self.lock();
        let running = s.run_started.elapsed();
        s.window.stats(now, running)
    }

    /// The counts since the run started.
    pub fn totals(&self) -> Totals {
        self.lock().totals
    }

    /// Conversations active now.
    pub fn active_conversations(&self) -> usize {
        self.lock().conversations.active()
    }

    /// The newest `limit` conversations, newest first.
    pub fn conversations(&self, limit: usize) -> Vec<ConversationSummary> {
        self.lock().conversations.list(limit)
    }

    /// The newest `limit` conversations with a completed follow-up turn, newest first.
    pub fn conversations_with_followup(&self, limit: usize) -> Vec<ConversationSummary> {
        self.lock().conversations.list_with_followup(limit)
    }

    /// One conversation with its transcript.
    pub fn conversation(&self, id: u64) -> Option<ConversationDetail> {
        self.lock().conversations.get(id)
    }

    /// Takes the records kept so far as the result of a run that lasted `duration`.
    pub(crate) fn take(&self, duration: Duration) -> RunResult {
        let mut s = self.lock();
        let names = std::mem::take(&mut s.names);
        let mut workers = vec![String::new(); names.len()];
        for (name, i) in names {
            workers[i as usize] = name;
        }
        RunResult {
            records: std::mem::take(&mut s.records),
            turns: std::mem::take(&mut s.turns),
            workers,
            duration,
        }
    }
}

fn turn_view(rec: &RequestRecord, r: &TurnResult, turn: u32) -> TurnView {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (status, error) = match &rec.status {
        Status::Completed => ("completed", None),
        Status::Failed(why) => ("failed", Some(why.clone())),
        Status::Rejected(why) => ("rejected", Some(why.clone())),
    };
    TurnView {
        turn,
        status: status.into(),
        error,
        ttft_ms: rec.ttft().map(ms),
        itl_ms: (!r.gaps.is_empty())
            .then(|| r.gaps.iter().sum::<f64>() * 1e3 / r.gaps.len() as f64),
        tpot_ms: rec.tpot_secs().map(|s| s * 1e3),
        latency_ms: rec.e2e().map(ms),
        input_tokens: rec.input_tokens,
        cached_tokens: rec.cached_tokens,
        predicted_cached_tokens: r.predicted_cached_tokens,
        output_tokens: rec.output_tokens,
        worker: r.worker.clone(),
        prefill_worker: r.prefill_worker.clone(),
        route: r.route.clone(),
        user: String::new(),
        assistant: r.answer.clone(),
    }
}
