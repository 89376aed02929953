//! Where the simulated requests come from: a trace on its own schedule (open loop), or
//! clients that send their next request when the previous one ends (closed loop).

use kvroute_core::Time;
use kvroute_workload::{ConversationId, MultiTurn, Prompt, Synthetic, TraceRequest};

/// The load of a simulation.
// Built once per run: the size of its variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Workload {
    /// Requests at their trace timestamps.
    Trace(Vec<TraceRequest>),
    /// Multi-turn conversations, `concurrency` at a time, until `requests` were sent.
    MultiTurn {
        /// The conversation generator.
        gen: MultiTurn,
        /// Conversations in flight.
        concurrency: usize,
        /// Requests to send in all.
        requests: usize,
    },
    /// Shared-prefix requests from `concurrency` clients, until `requests` were sent.
    Synthetic {
        /// The request generator.
        gen: Synthetic,
        /// Clients.
        concurrency: usize,
        /// Requests to send in all.
        requests: usize,
    },
}

/// A request's prompt before it is routed.
pub(crate) enum RequestPrompt {
    /// Its own prompt.
    Own(Prompt),
    /// The prompt of trace request `index` (the router thread cuts it into blocks), of
    /// `tokens` tokens.
    Trace { index: usize, tokens: usize },
}

/// A request about to arrive.
pub(crate) struct NewRequest {
    pub prompt: RequestPrompt,
    pub max_tokens: u32,
    pub session: Option<u64>,
    pub conversation: Option<ConversationId>,
}

/// How a request ended, as the closed loop needs to know.
pub(crate) enum Outcome<'a> {
    Answered(&'a [u32]),
    Failed,
}

pub(crate) struct Driver<'a> {
    /// The closed-loop generators (for a trace, `Workload::Trace` with the requests taken
    /// out: they are in `trace`).
    workload: Workload,
    /// The trace's requests, shared with the router thread, which reads their prompts.
    trace: &'a [TraceRequest],
    sent: usize,
    stop_at: Option<Time>,
}

impl<'a> Driver<'a> {
    /// A driver of `workload`, whose trace requests (if any) were moved to `trace`.
    pub fn new(workload: Workload, trace: &'a [TraceRequest], stop_at: Option<Time>) -> Self {
        Self {
            workload,
            trace,
            sent: 0,
            stop_at,
        }
    }

    /// Trace requests (index, arrival), in order; empty for closed loops.
    pub fn trace_arrivals(&self) -> Vec<(usize, Time)> {
        (self.trace.iter().enumerate())
            .map(|(i, r)| (i, r.arrival))
            .collect()
    }

    /// The trace request `i`.
    pub fn trace_request(&mut self, i: usize) -> Option<NewRequest> {
        let r = self.trace.get(i)?;
        self.sent += 1;
        Some(NewRequest {
            prompt: RequestPrompt::Trace {
                index: i,
                tokens: r.prompt.len(),
            },
            max_tokens: r.max_tokens,
            session: None,
            conversation: None,
        })
    }

    /// The closed loop's first requests, all at time zero.
    pub fn initial(&mut self) -> Vec<NewRequest> {
        let n = match &self.workload {
            Workload::Trace(_) => 0,
            Workload::MultiTurn { concurrency, .. } | Workload::Synthetic { concurrency, .. } => {
                *concurrency
            }
        };
        (0..n).filter_map(|_| self.fresh(Time::ZERO)).collect()
    }

    /// The request a closed-loop client sends after one of its requests ended at `now`.
    pub fn next(
        &mut self,
        now: Time,
        conversation: Option<ConversationId>,
        outcome: Outcome<'_>,
    ) -> Option<NewRequest> {
        let may_send = self.may_send(now);
        if let (Workload::MultiTurn { gen, .. }, Some(conv)) = (&mut self.workload, conversation) {
            match outcome {
                Outcome::Answered(answer) if may_send => {
                    if let Some(turn) = gen.follow_up(conv, answer) {
                        self.sent += 1;
                        return Some(NewRequest {
                            prompt: RequestPrompt::Own(turn.prompt),
                            max_tokens: turn.max_tokens,
                            session: Some(turn.session),
                            conversation: Some(conv),
                        });
                    }
                }
                _ => {
                    gen.end(conv);
                }
            }
        }
        self.fresh(now)
    }

    fn may_send(&self, now: Time) -> bool {
        let limit = match &self.workload {
            Workload::Trace(_) => self.trace.len(),
            Workload::MultiTurn { requests, .. } | Workload::Synthetic { requests, .. } => {
                *requests
            }
        };
        self.sent < limit && self.stop_at.is_none_or(|s| now < s)
    }

    /// A new client request (a new conversation, or the next synthetic request).
    fn fresh(&mut self, now: Time) -> Option<NewRequest> {
        if !self.may_send(now) {
            return None;
        }
        let req = match &mut self.workload {
            Workload::Trace(_) => return None,
            Workload::MultiTurn { gen, .. } => {
                let (conv, turn) = gen.start();
                NewRequest {
                    prompt: RequestPrompt::Own(turn.prompt),
                    max_tokens: turn.max_tokens,
                    session: Some(turn.session),
                    conversation: Some(conv),
                }
            }
            Workload::Synthetic { gen, .. } => {
                let r = gen.next_request();
                NewRequest {
                    prompt: RequestPrompt::Own(r.prompt),
                    max_tokens: r.max_tokens,
                    session: None,
                    conversation: None,
                }
            }
        };
        self.sent += 1;
        Some(req)
    }
}
