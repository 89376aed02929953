//! Bookings: the routing table with what a booking needs beside it (fresh request ids, the
//! clock, the in-flight gauge, the replicas it is shared with), the admission queue's
//! waiters, and the RAII guard that releases a booking on first token, completion, failure
//! or disconnect. Below routing and the proxy, which book and release through it; it knows
//! nothing of them.

mod permit;

pub use permit::FlowPermit;

use crate::clock::Clock;
use crate::table::RoutingTable;
use kvroute_core::{BlockedPrompt, Explanation, RejectReason, RequestId, Selection, WorkerId};
use kvroute_protocol::plane::LoadOp;
use prometheus::IntGauge;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::oneshot;

/// Where bookings go to the other gateway replicas (the event plane's load sharing).
pub trait ShareBookings: Send + Sync {
    /// Sends `op` on (never blocks; what cannot be sent is counted by the sharer).
    fn share(&self, op: LoadOp);
}

/// The routing table and what bookings need beside it.
pub struct Bookings {
    table: Arc<RoutingTable<Waiter>>,
    clock: Clock,
    next_request: AtomicU64,
    /// Requests booked and not yet released.
    inflight: IntGauge,
    share: OnceLock<Arc<dyn ShareBookings>>,
}

impl Bookings {
    /// Bookings on `table`, timed by `clock`, counted in `inflight`.
    pub fn new(table: Arc<RoutingTable<Waiter>>, clock: Clock, inflight: IntGauge) -> Self {
        Self {
            table,
            clock,
            next_request: AtomicU64::new(1),
            inflight,
            share: OnceLock::new(),
        }
    }

    /// A fresh request id for the ledger.
    pub fn next_request(&self) -> RequestId {
        RequestId(self.next_request.fetch_add(1, Ordering::Relaxed))
    }

    /// A request's id: the one it came with (up to 128 bytes), or a new one.
    pub fn request_id(&self, given: Option<&str>) -> String {
        given
            .filter(|s| !s.is_empty() && s.len() <= 128)
            .map_or_else(
                || format!("kvr-{:016x}", self.next_request().0),
                str::to_string,
            )
    }

    /// Shares bookings with the other replicas from now on (set once; false when set
    /// already).
    pub fn share_with(&self, sharer: Arc<dyn ShareBookings>) -> bool {
        self.share.set(sharer).is_ok()
    }

    /// Shares a booking with the other gateway replicas, when they share load.
    pub fn share(&self, op: impl FnOnce() -> LoadOp) {
        if let Some(s) = self.share.get() {
            s.share(op());
        }
    }
}

/// A waiting request, as the admission queue keeps it.
pub struct Waiter {
    /// Its prompt, cut into blocks.
    pub prompt: BlockedPrompt,
    /// Its session, when it names one.
    pub session: Option<u64>,
    /// Whether it asked for the route's explanation.
    pub explain: bool,
    /// Where its answer goes.
    pub tx: oneshot::Sender<Answer>,
}

/// What a waiting request is told.
pub type Answer = Result<Admitted, AdmitError>;

/// Why admission booked no worker for a request (the gateway maps it to its answer).
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// The core refused it (no worker, all busy, the queue full or its wait too long), with
    /// the wait it computed for a retry, if any (a predicted miss's drain).
    #[error("rejected: {}", .0.as_str())]
    Rejected(RejectReason, Option<std::time::Duration>),
    /// The booking failed: a bug or an impossible state.
    #[error("internal error: {0}")]
    Internal(String),
}

/// A booked worker for a request.
pub struct Admitted {
    /// The worker chosen.
    pub sel: Selection,
    /// Its booking.
    pub guard: LedgerGuard,
    /// The decision's explanation, when asked for.
    pub explanation: Option<Explanation>,
}

/// A dispatched request's booking; releases the ledger when dropped.
pub struct LedgerGuard {
    bookings: Arc<Bookings>,
    /// The ledger's id of the request.
    pub request: RequestId,
    /// The worker booked.
    pub worker: WorkerId,
    first_token: bool,
    /// Tokens the worker wrote, once its answer completed (teaches its decode speed).
    output_tokens: Option<u64>,
    /// The request's hold on its tenant's limits, carried with the booking of the worker
    /// that answers it (corrected by its output when it completes).
    permit: Option<FlowPermit>,
}

impl LedgerGuard {
    /// The booking of `request` on `worker`, just dispatched (counted in flight).
    pub fn booked(bookings: &Arc<Bookings>, request: RequestId, worker: WorkerId) -> Self {
        bookings.inflight.inc();
        Self {
            bookings: bookings.clone(),
            request,
            worker,
            first_token: false,
            output_tokens: None,
            permit: None,
        }
    }

    /// Carries the request's hold on its tenant's limits (given back when this booking ends,
    /// unless taken back with [`LedgerGuard::detach`] for another attempt).
    pub fn attach(&mut self, permit: Option<FlowPermit>) {
        self.permit = permit.map(|mut p| {
            p.dispatched();
            p
        });
    }

    /// Takes back the hold on the tenant's limits (a retry carries it on).
    pub fn detach(&mut self) -> Option<FlowPermit> {
        self.permit.take()
    }

    /// The worker's answer completed with `tokens` output tokens of its own.
    pub fn completed(&mut self, tokens: u64) {
        self.output_tokens = Some(tokens);
        if let Some(p) = &mut self.permit {
            p.completed(tokens);
        }
    }

    /// A split request's KV reached the decode worker (its prefill leg answered, the decode
    /// leg about to go): the first token from now is timed as that worker's own
    /// (`Router::kv_arrived`).
    pub fn kv_arrived(&self) {
        if !self.first_token {
            let b = &self.bookings;
            let (request, now) = (self.request, b.clock.now());
            let _ = b.table.update(|r| r.kv_arrived(request, now));
        }
    }

    /// The first token arrived: the prefill part of the booking is released.
    pub fn first_token(&mut self) {
        if !self.first_token {
            self.first_token = true;
            let b = &self.bookings;
            let (request, now) = (self.request, b.clock.now());
            // The worker may have been taken out meanwhile: nothing left to release then.
            let _ = b.table.update(|r| r.first_token(request, now));
            b.share(|| LoadOp::FirstToken { req: request.0 });
            b.table.released();
        }
    }
}

impl Drop for LedgerGuard {
    fn drop(&mut self) {
        let b = &self.bookings;
        let (request, output, now) = (self.request, self.output_tokens, b.clock.now());
        let _ = b.table.update(|r| match output {
            Some(n) => r.finish_with(request, now, n),
            None => r.finish(request, now),
        });
        b.share(|| LoadOp::Finish {
            req: request.0,
            output_tokens: output,
        });
        b.inflight.dec();
        b.table.released();
    }
}
