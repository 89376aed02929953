//! One unit of load, shared by the closed and the open loop: a whole conversation (turn after
//! turn, the answer going into the next turn's history) or one synthetic request; and the
//! run's shared context (settings, HTTP client, the workload generators, the control state).

use crate::closed_loop::{Control, Ctl};
use crate::conversations::ConversationStatus;
use crate::observer::{Finished, Observer};
use crate::turn::{self, TurnResult};
use crate::user_model::UserModel;
use crate::{LoadKind, LoadgenConfig, LoadgenError, RunResult};
use kvroute_workload::{ChatTurn, ChatWorkload, Status, Synthetic};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The generator of the run's work.
enum Source {
    Chat(ChatWorkload),
    Synthetic(Box<Synthetic>),
}

/// A piece of work: a conversation's first turn, or a single request.
pub(crate) enum Job {
    Chat(ChatTurn),
    Single {
        id: u64,
        prompt: Vec<u32>,
        max_tokens: u32,
    },
}

/// What every task of a run shares.
pub(crate) struct Ctx {
    pub config: Arc<LoadgenConfig>,
    pub observer: Arc<Observer>,
    pub t0: Instant,
    pub ctl: watch::Receiver<Ctl>,
    client: reqwest::Client,
    chat_url: String,
    completions_url: String,
    source: Mutex<Source>,
    started: AtomicU64,
    user_model: Option<UserModel>,
}

impl Ctx {
    /// The context of a run and its control.
    pub fn new(
        config: LoadgenConfig,
        observer: Arc<Observer>,
    ) -> Result<(Control, Arc<Ctx>), LoadgenError> {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(config.concurrency.max(config.max_in_flight).min(1024))
            .default_headers(config.default_headers()?)
            .build()?;
        let source = match config.workload {
            LoadKind::Multiturn => Source::Chat(
                ChatWorkload::new(config.chat.clone(), config.seed)
                    .map_err(LoadgenError::Config)?,
            ),
            LoadKind::Synthetic => Source::Synthetic(Box::new(
                Synthetic::new(config.synthetic.clone(), config.seed)
                    .map_err(|e| LoadgenError::Config(e.to_string()))?,
            )),
        };
        // The user model is another server: the target's key and headers are not its.
        let user_model = match config.user_model.clone() {
            Some(u) => Some(UserModel::new(u, reqwest::Client::builder().build()?)),
            None => None,
        };
        let base = config.target.trim_end_matches('/').to_string();
        let (control, ctl) = Control::new(config.concurrency);
        let ctx = Ctx {
            chat_url: format!("{base}/v1/chat/completions"),
            completions_url: format!("{base}/v1/completions"),
            config: Arc::new(config),
            observer,
            t0: Instant::now(),
            ctl,
            client,
            source: Mutex::new(source),
            started: AtomicU64::new(0),
            user_model,
        };
        Ok((control, Arc::new(ctx)))
    }

    fn source(&self) -> parking_lot::MutexGuard<'_, Source> {
        self.source.lock()
    }

    /// Whether the run's duration is up.
    pub fn time_up(&self) -> bool {
        self.config.duration_secs > 0.0
            && self.t0.elapsed().as_secs_f64() >= self.config.duration_secs
    }

    /// Whether every conversation (or request) was started.
    pub fn exhausted(&self) -> bool {
        self.started.load(Ordering::Relaxed) >= self.config.conversations
    }

    /// Whether no more work may start: stopped, time up or exhausted.
    pub fn done(&self) -> bool {
        self.ctl.borrow().stop || self.time_up() || self.exhausted()
    }

    /// The next piece of work, unless every one was started.
    pub fn next_job(&self) -> Option<Job> {
        self.started
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.config.conversations).then_some(n + 1)
            })
            .ok()?;
        Some(match &mut *self.source() {
            Source::Chat(w) => Job::Chat(w.start()),
            Source::Synthetic(s) => {
                let r = s.next_request();
                Job::Single {
                    id: r.id.0,
                    prompt: r.prompt.materialize(),
                    max_tokens: r.max_tokens,
                }
            }
        })
    }

    /// The run's result from what the observer kept.
    pub fn result(&self) -> RunResult {
        self.observer.take(self.t0.elapsed())
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.config.request_timeout_secs)
    }

    /// Sends `request` unless the run is cancelled first (then `None`).
    async fn send_or_cancel(
        &self,
        request: impl std::future::Future<Output = TurnResult>,
    ) -> Option<TurnResult> {
        let mut ctl = self.ctl.clone();
        tokio::select! {
            r = request => Some(r),
            _ = ctl.wait_for(|c| c.cancel) => None,
        }
    }

    /// Runs `job` to its end; `due` is when it was due to start (its first request's TTFT
    /// counts from there). When the server refused it: the wait it asked for (`Retry-After`).
    pub async fn run_job(&self, job: Job, due: Instant) -> Option<Duration> {
        match job {
            Job::Chat(first) => self.converse(first, due).await,
            Job::Single {
                id,
                prompt,
                max_tokens,
            } => {
                self.observer.request_started();
                let body = serde_json::json!({
                    "model": self.config.model,
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                });
                let send = turn::send_streamed(
                    &self.client,
                    &self.completions_url,
                    body,
                    None,
                    self.config.ignore_eos,
                    self.timeout(),
                );
                match self.send_or_cancel(send).await {
                    Some(result) => {
                        let wait = result.retry_after;
                        self.observer.finished(Finished {
                            conversation: id,
                            turn: 1,
                            chat: false,
                            sent: due,
                            result,
                            ends: None,
                        });
                        wait
                    }
                    None => {
                        self.observer.cancelled(None);
                        None
                    }
                }
            }
        }
    }

    /// A conversation, turn after turn, until its last turn, a failure, or the run ends;
    /// the wait a refusal asked for.
    async fn converse(&self, first: ChatTurn, due: Instant) -> Option<Duration> {
        let mut turn = first;
        let mut sent = due;
        loop {
            self.observer.chat_turn_started(&turn);
            let send = turn::send(
                &self.client,
                &self.chat_url,
                &self.config.model,
                &turn,
                self.config.ignore_eos,
                self.timeout(),
            );
            let Some(result) = self.send_or_cancel(send).await else {
                self.observer.cancelled(Some(turn.conversation));
                self.end(turn.conversation);
                return None;
            };
            let ok = result.status == Status::Completed;
            let stopping = self.ctl.borrow().stop || self.time_up();
            let ends = if !ok {
                Some(ConversationStatus::Error)
            } else if turn.is_last() || stopping {
                Some(ConversationStatus::Completed)
            } else {
                None
            };
            let answer = result.answer.clone();
            let wait = result.retry_after;
            self.observer.finished(Finished {
                conversation: turn.conversation,
                turn: turn.turn,
                chat: true,
                sent,
                result,
                ends,
            });
            if ends.is_some() {
                self.end(turn.conversation);
                return wait;
            }
            let question = match &self.user_model {
                Some(u) => u.follow_up(&turn, &answer).await,
                None => None,
            };
            let next = match &mut *self.source() {
                Source::Chat(w) => w.follow_up_with(turn.conversation, &answer, question),
                Source::Synthetic(_) => None,
            };
            match next {
                Some(t) => turn = t,
                None => {
                    self.observer
                        .conversation_ended(turn.conversation, ConversationStatus::Completed);
                    return None;
                }
            }
            sent = Instant::now();
        }
    }

    /// Forgets a conversation in the generator.
    fn end(&self, conversation: u64) {
        if let Source::Chat(w) = &mut *self.source() {
            w.end(conversation);
        }
    }
}
