//! Where the simulated requests come from: a trace on its own schedule (open loop), or
//! clients that send their next request when the previous one ends (closed loop); or
//! several tenants at once, each one of those loads under its own tenant and class (every
//! request then carries its *source*, the tenant's place in the list).

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
    /// Several tenants at once, each its own load (not itself `Tenants`) under its tenant
    /// and class names (`router.admission.flow` configures them; unknown names get the
    /// defaults).
    Tenants(Vec<TenantLoad>),
}

/// One tenant's load in [`Workload::Tenants`].
pub struct TenantLoad {
    /// Its tenant (unique in the list).
    pub tenant: String,
    /// Its requests' class.
    pub class: String,
    /// Its load.
    pub load: Workload,
}

impl Workload {
    /// The tenants' loads as they are driven: the trace requests of all of them merged in
    /// arrival order with each one's source, and each source's closed loop (if any); with
    /// the sources' tenant and class names (one unnamed source for a load of one tenant).
    #[allow(clippy::type_complexity)]
    pub(crate) fn split(
        self,
    ) -> Result<
        (
            Vec<TraceRequest>,
            Vec<u16>,
            Vec<Option<Workload>>,
            Vec<Source>,
        ),
        String,
    > {
        let loads = match self {
            Workload::Tenants(t) => t,
            one => vec![TenantLoad {
                tenant: String::new(),
                class: String::new(),
                load: one,
            }],
        };
        if loads.is_empty() || loads.len() > usize::from(u16::MAX) {
            return Err(format!("between 1 and 65535 tenants, got {}", loads.len()));
        }
        let mut traced: Vec<(TraceRequest, u16)> = Vec::new();
        let mut loops = Vec::new();
        let mut sources: Vec<Source> = Vec::new();
        for (i, t) in loads.into_iter().enumerate() {
            if sources.iter().any(|s| s.tenant == t.tenant) {
                return Err(format!("tenant {:?} has two loads", t.tenant));
            }
            sources.push(Source {
                tenant: t.tenant,
                class: t.class,
            });
            match t.load {
                Workload::Trace(reqs) => {
                    traced.extend(reqs.into_iter().map(|r| (r, i as u16)));
                    loops.push(None);
                }
                Workload::Tenants(_) => return Err("a tenant's load cannot be tenants".into()),
                closed => loops.push(Some(closed)),
            }
        }
        // Stable: a tenant's own requests keep their order, earlier tenants first on ties.
        traced.sort_by_key(|(r, _)| r.arrival);
        let (trace, source) = traced.into_iter().unzip();
        Ok((trace, source, loops, sources))
    }
}

/// A tenant's names (empty for a load of one tenant: the defaults).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Source {
    /// Its tenant.
    pub tenant: String,
    /// Its class.
    pub class: String,
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
    /// Its source (tenant) in the workload.
    pub source: u16,
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

/// One source's closed loop, and what it sent.
struct Loop {
    workload: Workload,
    sent: usize,
}

pub(crate) struct Driver<'a> {
    /// Per source, its closed loop (none for a source of trace requests).
    loops: Vec<Option<Loop>>,
    /// The trace requests of every source, shared with the router thread, which reads
    /// their prompts; and each one's source.
    trace: &'a [TraceRequest],
    trace_source: &'a [u16],
    stop_at: Option<Time>,
}

impl<'a> Driver<'a> {
    /// A driver of the closed `loops` (per source) and the trace requests `trace` (of
    /// sources `trace_source`).
    pub fn new(
        loops: Vec<Option<Workload>>,
        trace: &'a [TraceRequest],
        trace_source: &'a [u16],
        stop_at: Option<Time>,
    ) -> Self {
        Self {
            loops: loops
                .into_iter()
                .map(|w| w.map(|workload| Loop { workload, sent: 0 }))
                .collect(),
            trace,
            trace_source,
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
        Some(NewRequest {
            source: self.trace_source.get(i).copied().unwrap_or(0),
            prompt: RequestPrompt::Trace {
                index: i,
                tokens: r.prompt.len(),
            },
            max_tokens: r.max_tokens,
            session: None,
            conversation: None,
        })
    }

    /// The closed loops' first requests, all at time zero (the sources' clients
    /// interleaved, so that a ramp starts every tenant's evenly).
    pub fn initial(&mut self) -> Vec<NewRequest> {
        let counts: Vec<usize> = (self.loops.iter())
            .map(|l| match l.as_ref().map(|l| &l.workload) {
                Some(Workload::MultiTurn { concurrency, .. })
                | Some(Workload::Synthetic { concurrency, .. }) => *concurrency,
                _ => 0,
            })
            .collect();
        let mut out = Vec::new();
        for k in 0..counts.iter().copied().max().unwrap_or(0) {
            for (s, &n) in counts.iter().enumerate() {
                if k < n {
                    out.extend(self.fresh(s as u16, Time::ZERO));
                }
            }
        }
        out
    }

    /// The request a closed-loop client of `source` sends after one of its requests ended
    /// at `now`.
    pub fn next(
        &mut self,
        now: Time,
        source: u16,
        conversation: Option<ConversationId>,
        outcome: Outcome<'_>,
    ) -> Option<NewRequest> {
        let may_send = self.may_send(source, now);
        let l = self.loops.get_mut(usize::from(source))?.as_mut()?;
        if let (Workload::MultiTurn { gen, .. }, Some(conv)) = (&mut l.workload, conversation) {
            match outcome {
                Outcome::Answered(answer) if may_send => {
                    if let Some(turn) = gen.follow_up(conv, answer) {
                        l.sent += 1;
                        return Some(NewRequest {
                            source,
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
        self.fresh(source, now)
    }

    fn may_send(&self, source: u16, now: Time) -> bool {
        let Some(Some(l)) = self.loops.get(usize::from(source)) else {
            return false;
        };
        let limit = match &l.workload {
            Workload::MultiTurn { requests, .. } | Workload::Synthetic { requests, .. } => {
                *requests
            }
            _ => 0,
        };
        l.sent < limit && self.stop_at.is_none_or(|s| now < s)
    }

    /// A new client request of `source` (a new conversation, or the next synthetic request).
    fn fresh(&mut self, source: u16, now: Time) -> Option<NewRequest> {
        if !self.may_send(source, now) {
            return None;
        }
        let l = self.loops.get_mut(usize::from(source))?.as_mut()?;
        let req = match &mut l.workload {
            Workload::MultiTurn { gen, .. } => {
                let (conv, turn) = gen.start();
                NewRequest {
                    source,
                    prompt: RequestPrompt::Own(turn.prompt),
                    max_tokens: turn.max_tokens,
                    session: Some(turn.session),
                    conversation: Some(conv),
                }
            }
            Workload::Synthetic { gen, .. } => {
                let r = gen.next_request();
                NewRequest {
                    source,
                    prompt: RequestPrompt::Own(r.prompt),
                    max_tokens: r.max_tokens,
                    session: None,
                    conversation: None,
                }
            }
            _ => return None,
        };
        l.sent += 1;
        Some(req)
    }
}
