//! The engine driver: one task owns the [`Engine`] and runs it in real time.
//!
//! Commands arrive on a bounded channel. Each round the driver steps the engine through every
//! event that is due (at the event's own virtual time, so the engine's timeline does not
//! depend on how late the task wakes), sends each request's tokens and completion on the
//! request's own channel, publishes each step's KV events as one batch, then sleeps until the
//! next command or the real instant of the engine's next event, whichever comes first (only
//! for commands when the engine has nothing to do). A failed send means the client is gone:
//! the request is aborted in the engine.

use crate::events::EventHub;
use kvroute_core::{RequestId, Time};
use kvroute_engine::{Engine, EngineError, EngineMetrics, EngineRequest, Finished, StepOutput};
use kvroute_runtime::Clock;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};

/// Steps run in one round at most before the driver looks at its commands again (only
/// reached when the engine's virtual time runs behind the real clock).
const MAX_STEPS_PER_ROUND: usize = 4096;

/// Commands handled in one round at most before the engine is stepped again.
const MAX_COMMANDS_PER_ROUND: usize = 256;

/// What the HTTP side asks of the driver.
pub(crate) enum Command {
    /// Queue a request; its outputs go to `reply`.
    Submit {
        /// The request.
        request: EngineRequest,
        /// Where its outputs go.
        reply: mpsc::UnboundedSender<Reply>,
        /// Send each token as it is sampled (streaming); else only the completion.
        stream: bool,
    },
    /// Drop a request (client gone).
    Abort {
        /// The request.
        id: RequestId,
    },
    /// Simulate an engine restart: the prefix cache is dropped and the event sequence
    /// restarts at 0. `done` is answered once the clearing is published (or, when a step is
    /// in flight, once it is scheduled to be published at that step's end).
    Reset {
        /// Answered when done.
        done: oneshot::Sender<()>,
    },
}

/// What the driver tells a request's handler: `Accepted` or `Rejected` first, then tokens
/// (when streaming), then `Finished`.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The engine queued the request.
    Accepted,
    /// The engine refused it.
    Rejected(EngineError),
    /// A token was sampled.
    Token(u32),
    /// The request completed.
    Finished(Finished),
}

struct Live {
    reply: mpsc::UnboundedSender<Reply>,
    stream: bool,
}

/// The driver's state. See the module documentation.
pub(crate) struct Driver {
    engine: Engine,
    clock: Clock,
    hub: Arc<EventHub>,
    live: HashMap<RequestId, Live>,
    out: StepOutput,
    snapshot: Arc<Mutex<EngineMetrics>>,
    name: String,
    gone: Vec<RequestId>,
}

impl Driver {
    /// A driver for `engine`, publishing to `hub` and keeping `snapshot` up to date.
    pub(crate) fn new(
        engine: Engine,
        clock: Clock,
        hub: Arc<EventHub>,
        snapshot: Arc<Mutex<EngineMetrics>>,
        name: String,
    ) -> Self {
        Self {
            engine,
            clock,
            hub,
            live: HashMap::new(),
            out: StepOutput::default(),
            snapshot,
            name,
            gone: Vec::new(),
        }
    }

    /// Runs until `shutdown` turns true (or its sender is dropped) or every command sender
    /// is gone. Dropping the driver drops every request's channel, which ends their streams.
    pub(crate) async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        tracing::info!(worker = %self.name, "engine driver started");
        loop {
            self.run_due(self.clock.now());
            self.update_snapshot();
            let wake = self.engine.next_event_time().map(|t| self.clock.instant(t));
            tokio::select! {
                biased;
                _ = crate::wait_shutdown(&mut shutdown) => break,
                cmd = commands.recv() => {
                    let Some(cmd) = cmd else { break };
                    let now = self.clock.now();
                    self.run_due(now);
                    self.handle(cmd, now);
                    for _ in 1..MAX_COMMANDS_PER_ROUND {
                        let Ok(cmd) = commands.try_recv() else { break };
                        self.handle(cmd, now);
                    }
                }
                _ = sleep_until(wake), if wake.is_some() => {}
            }
        }
        tracing::info!(
            worker = %self.name,
            live = self.live.len(),
            "engine driver stopped"
        );
    }

    fn handle(&mut self, cmd: Command, now: Time) {
        match cmd {
            Command::Submit {
                request,
                reply,
                stream,
            } => {
                let id = request.id;
                match self.engine.submit(request, now) {
                    Ok(()) => {
                        if reply.send(Reply::Accepted).is_ok() {
                            self.live.insert(id, Live { reply, stream });
                        } else {
                            self.engine.abort(id, now);
                        }
                    }
                    Err(e) => {
                        tracing::debug!(worker = %self.name, request = %id, error = %e, "refused");
                        let _ = reply.send(Reply::Rejected(e));
                    }
                }
            }
            Command::Abort { id } => {
                self.abort(id, now);
                // An engine that found nothing to schedule waits for news; freed blocks are
                // news (stepping with a step in flight changes nothing).
                if self.engine.next_event_time().is_none() {
                    self.step(now);
                }
            }
            Command::Reset { done } => {
                self.engine.reset_prefix_cache();
                self.hub.restart();
                tracing::info!(worker = %self.name, "engine reset: prefix cache cleared, event sequence restarts at 0");
                // Flushes the clearing now when no step is in flight.
                self.step(now);
                let _ = done.send(());
            }
        }
    }

    fn abort(&mut self, id: RequestId, now: Time) {
        if self.live.remove(&id).is_some() && self.engine.abort(id, now) {
            tracing::debug!(worker = %self.name, request = %id, "aborted: client gone");
        }
    }

    /// Steps through every engine event due by `now`.
    fn run_due(&mut self, now: Time) {
        for _ in 0..MAX_STEPS_PER_ROUND {
            match self.engine.next_event_time() {
                Some(t) if t <= now => self.step(t),
                _ => return,
            }
        }
    }

    /// One engine step at `t`, its outputs routed and its events published.
    fn step(&mut self, t: Time) {
        self.engine.step_into(t, &mut self.out);
        for s in &self.out.tokens {
            let Some(live) = self.live.get(&s.id) else {
                continue;
            };
            if live.stream && live.reply.send(Reply::Token(s.token)).is_err() {
                self.gone.push(s.id);
            }
        }
        for f in self.out.finished.drain(..) {
            if let Some(live) = self.live.remove(&f.id) {
                let _ = live.reply.send(Reply::Finished(f));
            }
        }
        self.hub.publish(
            self.out.time.as_secs_f64(),
            &self.out.events,
            &self.out.host_events,
        );
        let now = self.out.time;
        while let Some(id) = self.gone.pop() {
            self.abort(id, now);
        }
    }

    fn update_snapshot(&self) {
        let m = self.engine.metrics();
        *self.snapshot.lock() = m;
    }
}

async fn sleep_until(wake: Option<tokio::time::Instant>) {
    match wake {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
