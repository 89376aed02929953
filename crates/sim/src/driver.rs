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

/// A request about to arrive.
pub(crate) struct NewRequest {
    pub prompt: Prompt,
    pub max_tokens: u32,
    pub session: Option<u64>,
    pub conversation: Option<ConversationId>,
}

/// How a request ended, as the closed loop needs to know.
pub(crate) enum Outcome<'a> {
    Answered(&'a [u32]),
    Failed,
}

pub(crate) struct Driver {
    workload: Workload,
    sent: usize,
    stop_at: Option<Time>,
}

impl Driver {
    pub fn new(workload: Workload, stop_at: Option<Time>) -> Self {
        Self {
            workload,
            sent: 0,
            stop_at,
        }
    }

    /// Trace requests (index, arrival), in order; empty for closed loops.
    pub fn trace_arrivals(&self) -> Vec<(usize, Time)> {
        match &self.workload {
            Workload::Trace(t) => t.iter().enumerate().map(|(i, r)| (i, r.arrival)).collect(),
            _ => Vec::new(),
        }
    }

    /// The prompt of trace request `i`, while it has not arrived.
    pub fn trace_prompt(&self, i: usize) -> Option<&Prompt> {
        match &self.workload {
            Workload::Trace(t) => t.get(i).map(|r| &r.prompt),
            _ => None,
        }
    }

    /// The trace request `i`.
    pub fn trace_request(&mut self, i: usize) -> Option<NewRequest> {
        let Workload::Trace(t) = &mut self.workload else {
            return None;
        };
        let r = t.get_mut(i)?;
        self.sent += 1;
        Some(NewRequest {
            // Taken, not cloned: each trace request arrives once.
            prompt: std::mem::replace(&mut r.prompt, Prompt::Tokens(Vec::new())),
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
                            prompt: turn.prompt,
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
            Workload::Trace(t) => t.len(),
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
                    prompt: turn.prompt,
                    max_tokens: turn.max_tokens,
                    session: Some(turn.session),
                    conversation: Some(conv),
                }
            }
            Workload::Synthetic { gen, .. } => {
                let r = gen.next_request();
                NewRequest {
                    prompt: r.prompt,
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
