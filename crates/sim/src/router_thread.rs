//! The router on a thread of its own, so that its work (applying KV events to the prefix
//! index, booking and releasing load) overlaps the engines' steps on another core.
//!
//! The event loop sends the router every call it would have made, in the same order, and
//! waits only where it needs an answer: when it routes a request. Calls that need no answer
//! (KV events, first tokens, finishes) are batched and sent without waiting. Since the router
//! sees exactly the calls of a single-threaded run in exactly the same order, and its
//! randomness depends only on its seed and the decisions it made, every result is the same
//! as on one thread
//! (`bench/sim-golden.sh` compares the output of two builds cell by cell).
//!
//! A waiting side spins a little before it blocks: the answer to a route usually comes
//! within microseconds, much sooner than a thread could be put to sleep and woken again.
//! The router thread also cuts trace prompts into blocks ([`TracePrompts`]); both sides
//! hash the blocks of prompts still to come while they wait. Before that, the router thread
//! prepares the next trace prompt while idle: cuts it and reads the index entries its route
//! will read ([`Router::warm`]), so the event loop, which waits for that route, waits less.

use crate::replicas::Replicas;
use crate::trace_prompts::TracePrompts;

use kvroute_core::admission::QueueState;
use kvroute_core::router::RouteOutcome;
use kvroute_core::{BlockedPrompt, KvEvent, RequestId, RouteRequest, Router, Tier, Time, WorkerId};
use std::sync::mpsc::{sync_channel, Receiver, RecvError, SyncSender, TryRecvError};

/// Calls batched before they are handed to the router thread (when no route comes first).
const BATCH: usize = 256;
/// Batches in flight before the event loop waits for the router to catch up.
const BATCHES_IN_FLIGHT: usize = 64;
/// `try_recv` rounds a waiting side spins through before it blocks.
const SPINS: u32 = 20_000;

/// The prompt of a [`RouteCall`].
pub(crate) enum RoutePrompt {
    /// Cut into blocks, with its tokens after the last full block.
    Blocked(BlockedPrompt, Vec<u32>),
    /// Trace prompt `i`, cut on the router thread.
    Trace(usize),
}

/// A request to route and, when the router says so, dispatch.
pub(crate) struct RouteCall {
    pub id: RequestId,
    /// The router replica that routes it.
    pub replica: usize,
    pub prompt: RoutePrompt,
    pub session: Option<u64>,
    pub queue: QueueState,
    /// Its tenant and class.
    pub flow: kvroute_core::flow::Flow,
    pub now: Time,
    /// The router may hold it (a burst's later request, `Router::hold_until`): false for a
    /// request already held or queued.
    pub may_hold: bool,
}

/// The answer to a [`RouteCall`]: the prompt back (cut into blocks, and its tail), the
/// outcome, and whether the dispatch the outcome asked for was refused.
pub(crate) struct Routed {
    pub prompt: BlockedPrompt,
    pub tail: Vec<u32>,
    pub outcome: RouteOutcome,
    pub dispatch_refused: bool,
    /// Not routed: to be held until then and routed again (`outcome` is meaningless).
    pub held: Option<Time>,
}

enum Call {
    Events(WorkerId, Tier, Vec<KvEvent>),
    FirstToken(RequestId, Time),
    KvArrived(RequestId, Time),
    Finish(RequestId, Time, Option<u64>, Option<usize>),
    Route(Box<RouteCall>),
}

/// What the router thread counted, handed back when it stops.
#[derive(Default)]
pub(crate) struct RouterTotals {
    /// KV events the index rejected.
    pub kv_rejected: u64,
}

/// The event loop's end of the link to the router thread.
pub(crate) struct RouterLink {
    pending: Vec<Call>,
    calls: SyncSender<Vec<Call>>,
    replies: Receiver<Routed>,
    /// Emptied batches and KV event buffers coming back for reuse: a fresh allocation per
    /// batch, freed on the other thread, would keep touching new memory.
    spare: Receiver<Spare>,
    /// Event buffers back from the router thread, for the engines' next steps.
    event_buffers: Vec<Vec<KvEvent>>,
}

/// A batch and the event buffers it carried, emptied.
struct Spare {
    batch: Vec<Call>,
    events: Vec<Vec<KvEvent>>,
}

/// The router thread's end.
pub(crate) struct RouterServer {
    calls: Receiver<Vec<Call>>,
    replies: SyncSender<Routed>,
    spare: SyncSender<Spare>,
}

/// A connected pair of ends.
pub(crate) fn link() -> (RouterLink, RouterServer) {
    let (calls_tx, calls_rx) = sync_channel(BATCHES_IN_FLIGHT);
    let (replies_tx, replies_rx) = sync_channel(1);
    let (spare_tx, spare_rx) = sync_channel(BATCHES_IN_FLIGHT);
    (
        RouterLink {
            pending: Vec::with_capacity(BATCH),
            calls: calls_tx,
            replies: replies_rx,
            spare: spare_rx,
            event_buffers: Vec::new(),
        },
        RouterServer {
            calls: calls_rx,
            replies: replies_tx,
            spare: spare_tx,
        },
    )
}

impl RouterLink {
    /// `Router::apply_events` of `events` from `worker`'s device tier, or
    /// `Router::apply_tier_event` of each for an offloaded `tier`.
    pub fn events(&mut self, worker: WorkerId, tier: Tier, events: Vec<KvEvent>) {
        self.push(Call::Events(worker, tier, events));
    }

    /// An empty buffer for KV events (one the router thread gave back, when there is one).
    pub fn event_buffer(&mut self) -> Vec<KvEvent> {
        self.event_buffers.pop().unwrap_or_default()
    }

    /// `Router::first_token`.
    pub fn first_token(&mut self, id: RequestId, now: Time) {
        self.push(Call::FirstToken(id, now));
    }

    /// `Router::kv_arrived`: a split request's KV reached its decode engine.
    pub fn kv_arrived(&mut self, id: RequestId, now: Time) {
        self.push(Call::KvArrived(id, now));
    }

    /// `Router::finish`, after `Router::observe_cached` when the engine said how many of the
    /// prompt's tokens it found cached.
    pub fn finish(
        &mut self,
        id: RequestId,
        now: Time,
        output_tokens: Option<u64>,
        cached_tokens: Option<usize>,
    ) {
        self.push(Call::Finish(id, now, output_tokens, cached_tokens));
    }

    /// `Router::route`, then `Router::dispatch` when it says dispatch; waits for the answer,
    /// calling `idle` meanwhile until it says it has nothing left to do (work that does not
    /// depend on the answer, such as hashing the prompts of requests still to come).
    pub fn route(&mut self, call: RouteCall, idle: impl FnMut() -> bool) -> Routed {
        self.pending.push(Call::Route(Box::new(call)));
        self.flush();
        spin_recv(&self.replies, idle).expect("the router thread outlives the event loop")
    }

    /// Hands the pending calls over; the router thread stops once every link is dropped.
    pub fn close(mut self) {
        self.flush();
    }

    fn push(&mut self, call: Call) {
        self.pending.push(call);
        if self.pending.len() >= BATCH {
            self.flush();
        }
    }

    /// Hands the pending calls to the router thread now, so it works on them while the
    /// event loop goes on.
    pub fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let next = match self.spare.try_recv() {
            Ok(spare) => {
                // Bounded: a spare batch holds at most BATCH event buffers.
                if self.event_buffers.len() < BATCH {
                    self.event_buffers.extend(spare.events);
                }
                spare.batch
            }
            Err(_) => Vec::with_capacity(BATCH),
        };
        let batch = std::mem::replace(&mut self.pending, next);
        // A send fails only when the router thread is gone, which it is only after a panic;
        // the scope that runs it then reports that panic.
        let _ = self.calls.send(batch);
    }
}

impl RouterServer {
    /// Serves calls until the event loop closes its end, cutting trace prompts from
    /// `prompts` (hashing ahead while no call is waiting).
    pub fn serve(self, router: &mut Replicas, prompts: &TracePrompts<'_>) -> RouterTotals {
        let mut totals = RouterTotals::default();
        let mut scratch = Vec::new();
        let mut next = Prepared::default();
        loop {
            // While no call waits: the next trace prompt cut and its index entries read
            // (trace requests arrive in order), then the ids of later prompts hashed.
            let idle = || {
                next.prepare(router.first(), prompts, &mut scratch)
                    || prompts.hash_ahead(&mut scratch)
            };
            let Ok(mut batch) = spin_recv(&self.calls, idle) else {
                break;
            };
            let mut buffers = Vec::new();
            for call in batch.drain(..) {
                match call {
                    Call::Events(worker, Tier::Device, mut events) => {
                        let out = router.apply_events(worker, &events);
                        totals.kv_rejected += out.rejected.len() as u64;
                        events.clear();
                        buffers.push(events);
                    }
                    Call::Events(worker, tier, mut events) => {
                        for ev in &events {
                            if router.apply_tier_event(worker, tier, ev).is_err() {
                                totals.kv_rejected += 1;
                            }
                        }
                        events.clear();
                        buffers.push(events);
                    }
                    Call::FirstToken(id, now) => router.first_token(id, now),
                    Call::KvArrived(id, now) => router.kv_arrived(id, now),
                    Call::Finish(id, now, output, cached) => router.finish(id, now, output, cached),
                    Call::Route(call) => {
                        if !route(
                            router,
                            prompts,
                            &mut scratch,
                            &mut next,
                            *call,
                            &self.replies,
                        ) {
                            return totals;
                        }
                    }
                }
            }
            // Dropped when the event loop has not taken the earlier ones yet.
            let _ = self.spare.try_send(Spare {
                batch,
                events: buffers,
            });
        }
        totals
    }
}

/// Routes `call` and sends the answer, then books the dispatch: the event loop waits only
/// for the answer, and the booking (the ledger's work per prompt block) is done before the
/// router takes its next call, so the router sees the same calls in the same order. False
/// when the event loop is gone.
fn route(
    router: &mut Replicas,
    prompts: &TracePrompts<'_>,
    scratch: &mut Vec<u32>,
    next: &mut Prepared,
    call: RouteCall,
    replies: &SyncSender<Routed>,
) -> bool {
    let (prompt, tail) = match call.prompt {
        RoutePrompt::Blocked(prompt, tail) => (prompt, tail),
        RoutePrompt::Trace(i) => next.take(i, prompts, scratch),
    };
    if call.may_hold {
        if let Some(until) = router.hold_until(call.replica, call.now, &prompt) {
            let routed = Routed {
                prompt,
                tail,
                outcome: RouteOutcome::Queue,
                dispatch_refused: false,
                held: Some(until),
            };
            return replies.send(routed).is_ok();
        }
    }
    let req = RouteRequest {
        prompt: &prompt,
        session: call.session,
        queue: call.queue,
        eligible: &kvroute_core::ANY_WORKER,
        flow: call.flow,
    };
    let outcome = router.route(call.replica, &req, call.now);
    let booking = match &outcome {
        RouteOutcome::Dispatch(sel) => Some(sel.clone()),
        _ => None,
    };
    let dispatch_refused = booking
        .as_ref()
        .is_some_and(|sel| !router.check_dispatch(call.replica, call.id, sel));
    let routed = Routed {
        prompt: prompt.clone(),
        tail,
        outcome,
        dispatch_refused,
        held: None,
    };
    if replies.send(routed).is_err() {
        return false;
    }
    if let (Some(sel), false) = (booking, dispatch_refused) {
        let booked = router.dispatch(call.replica, call.id, &req, &sel, call.now);
        debug_assert!(booked.is_ok(), "a dispatch its check allowed was refused");
        if let Some(prefill) = &sel.prefill {
            // A split request: its prefill leg booked on the prefill worker too.
            let leg = prefill_leg(call.id);
            let booked = router.dispatch_prefill(call.replica, leg, &req, prefill, call.now);
            debug_assert!(booked.is_ok(), "a prefill leg was refused: {booked:?}");
        }
    }
    true
}

/// The request id a split request's prefill leg is booked under (the leg's first token and
/// finish are the router's calls of that id).
pub(crate) fn prefill_leg(id: RequestId) -> RequestId {
    RequestId(id.0 | 1 << 62)
}

/// The trace prompt the router thread expects to route next, cut ahead in its idle time.
#[derive(Default)]
struct Prepared {
    /// The index of the next trace prompt.
    index: usize,
    /// It, cut into blocks, with its tail.
    cut: Option<(BlockedPrompt, Vec<u32>)>,
    /// Its index entries have been read (once: reading them again after every batch the
    /// router applies was measured slower).
    warm: bool,
}

impl Prepared {
    /// One step of preparing the next trace prompt (cutting it, then reading the index
    /// entries its route will read); false when there is nothing left to do.
    fn prepare(
        &mut self,
        router: &Router,
        prompts: &TracePrompts<'_>,
        scratch: &mut Vec<u32>,
    ) -> bool {
        if self.index >= prompts.len() {
            return false;
        }
        match &self.cut {
            None => {
                self.cut = Some(prompts.blocked(self.index, scratch));
                self.warm = false;
                true
            }
            Some((prompt, _)) if !self.warm => {
                router.warm(prompt);
                self.warm = true;
                true
            }
            Some(_) => false,
        }
    }

    /// Trace prompt `i` cut into blocks (the one prepared, when it is the one); the next
    /// one is expected after it.
    fn take(
        &mut self,
        i: usize,
        prompts: &TracePrompts<'_>,
        scratch: &mut Vec<u32>,
    ) -> (BlockedPrompt, Vec<u32>) {
        let cut = match self.cut.take() {
            Some(cut) if self.index == i => cut,
            _ => prompts.blocked(i, scratch),
        };
        self.index = i + 1;
        cut
    }
}

/// Receives; between empty polls it calls `idle` (work that can wait, bounded per call)
/// until that says it has nothing left, then spins through a bounded number of empty polls
/// before it blocks.
fn spin_recv<T>(rx: &Receiver<T>, mut idle: impl FnMut() -> bool) -> Result<T, RecvError> {
    let mut spins = 0;
    while spins < SPINS {
        match rx.try_recv() {
            Ok(v) => return Ok(v),
            Err(TryRecvError::Disconnected) => return Err(RecvError),
            Err(TryRecvError::Empty) => {
                if !idle() {
                    spins += 1;
                    std::hint::spin_loop();
                }
            }
        }
    }
    rx.recv()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_core::{BlockSize, Namespace, RouterConfig};
    use kvroute_workload::{Prompt, TraceRequest};

    #[test]
    fn a_prepared_prompt_is_the_prompt_cut_when_routed_and_only_used_for_its_index() {
        let trace: Vec<TraceRequest> = (0..4u64)
            .map(|i| TraceRequest {
                arrival: Time::ZERO,
                prompt: Prompt::hash_blocks(vec![0, 1 + i], 512, 1000).unwrap(),
                max_tokens: 1,
            })
            .collect();
        let b = BlockSize::new(64).unwrap();
        let prompts = TracePrompts::new(&trace, b, Namespace::default());
        let plain = TracePrompts::new(&trace, b, Namespace::default());
        let router = Router::new(RouterConfig::default()).unwrap();
        let (mut scratch, mut other) = (Vec::new(), Vec::new());
        let mut next = Prepared::default();
        // Cut, then warmed, then nothing left to do until the prompt is taken.
        assert!(next.prepare(&router, &prompts, &mut scratch));
        assert!(next.prepare(&router, &prompts, &mut scratch));
        assert!(!next.prepare(&router, &prompts, &mut scratch));
        assert_eq!(
            next.take(0, &prompts, &mut scratch),
            plain.blocked(0, &mut other)
        );
        // Prepared for 1, asked for 2 (1 never came): 2 is cut then, 3 expected next.
        assert!(next.prepare(&router, &prompts, &mut scratch));
        assert_eq!(
            next.take(2, &prompts, &mut scratch),
            plain.blocked(2, &mut other)
        );
        assert_eq!(next.index, 3);
        while next.prepare(&router, &prompts, &mut scratch) {}
        assert_eq!(
            next.take(3, &prompts, &mut scratch),
            plain.blocked(3, &mut other)
        );
        assert!(
            !next.prepare(&router, &prompts, &mut scratch),
            "past the trace"
        );
    }
}
