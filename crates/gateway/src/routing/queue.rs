//! The admission queue in the gateway: the core's [`AdmissionQueue`] (the one the simulator
//! drives too) holding the requests that found every eligible worker busy.
//!
//! One task ([`drive`]) drains it in arrival order whenever load is released or the fleet
//! changes ([`Gateway::released`]), and expires it at its next deadline. A request that gets
//! a worker is handed its booking (a [`LedgerGuard`]) over a oneshot: only the requests that
//! go are woken, never every waiter. A request whose client leaves takes itself out
//! ([`Place`]); a booking sent to a request that left meanwhile is dropped with its channel,
//! and so released. Both locks are the routing table's ([`kvroute_fleet::table::RoutingTable`]):
//! the queue's, then the router's; no booking is dropped while either is held.

use crate::gateway::Gateway;
use kvroute_core::{RejectReason, RouteOutcome, RouteRequest, Ticket, Time};
use kvroute_fleet::bookings::{AdmitError, Admitted, Answer, LedgerGuard, Waiter};
use kvroute_protocol::plane::LoadOp;
use std::sync::Arc;
use tokio::sync::oneshot;

/// A request's place in the queue: taken out when dropped (its client left, or it was
/// answered; the second is a no-op).
pub struct Place {
    gw: Arc<Gateway>,
    ticket: Ticket,
}

impl Drop for Place {
    fn drop(&mut self) {
        // The waiter (with its channel) is dropped after the lock is given back.
        let ticket = self.ticket;
        let _gone = self.gw.table.with_queue(|q| q.remove(ticket));
    }
}

/// Puts a request that must wait into `queue` (locked by the caller, with the router):
/// its place and the channel its answer comes on, or the reason it cannot wait. The caller
/// wakes the queue's task, after the locks, when the queue was empty.
pub fn enqueue(
    gw: &Arc<Gateway>,
    queue: &mut kvroute_core::AdmissionQueue<Waiter>,
    admission: &kvroute_core::AdmissionConfig,
    request: &RouteRequest<'_>,
    identity: &super::flow::Identity,
    explain: bool,
) -> Result<(Place, oneshot::Receiver<Answer>), RejectReason> {
    let (tx, rx) = oneshot::channel();
    let waiter = Waiter {
        prompt: request.prompt.clone(),
        session: request.session,
        explain,
        tx,
    };
    let tokens = request.prompt.tokens as u64;
    let ask = kvroute_core::Ask {
        eligible: request.eligible.clone(),
        tokens,
        flow: identity.flow,
        cost: tokens + identity.output,
        objective: identity.objective,
    };
    let (ticket, shed) = queue
        .push(admission, gw.now(), ask, waiter)
        .map_err(|(reason, _)| reason)?;
    for e in shed {
        // Its client's task answers it; a client already gone is nobody's loss.
        let _gone = e
            .item
            .tx
            .send(Err(AdmitError::Rejected(RejectReason::Shed, None)));
    }
    let place = Place {
        gw: gw.clone(),
        ticket,
    };
    Ok((place, rx))
}

/// Routes `request` and books the worker chosen, with the router locked by the caller.
pub fn route_and_book(
    gw: &Arc<Gateway>,
    router: &mut kvroute_core::Router,
    request: &RouteRequest<'_>,
    explain: bool,
) -> Result<Option<Admitted>, AdmitError> {
    let (outcome, explanation) = if explain {
        let (o, ex) = router.route_explained(request);
        (o, Some(ex))
    } else {
        (router.route(request), None)
    };
    match outcome {
        RouteOutcome::Dispatch(sel) => {
            let id = gw.bookings.next_request();
            router
                .dispatch(id, request, &sel, gw.now())
                .map_err(|e| AdmitError::Internal(e.to_string()))?;
            // A split request's decode worker computes none of its prompt.
            let cached = if sel.prefill.is_some() {
                request.prompt.tokens
            } else {
                sel.cached_tokens
            };
            share_dispatch(gw, id, sel.worker, request.prompt, cached);
            let guard = LedgerGuard::booked(&gw.bookings, id, sel.worker);
            Ok(Some(Admitted {
                sel,
                guard,
                explanation,
            }))
        }
        RouteOutcome::Queue => Ok(None),
        RouteOutcome::Reject(reason, wait) => Err(AdmitError::Rejected(reason, wait)),
    }
}

/// Books the prefill leg of a split request on its prefill worker (`remote`), shared with
/// the peer replicas as any booking is; the guard releases it.
pub fn book_prefill(
    gw: &Arc<Gateway>,
    prompt: &kvroute_core::BlockedPrompt,
    remote: &kvroute_core::policy::RemotePrefill,
) -> Result<LedgerGuard, AdmitError> {
    let id = gw.bookings.next_request();
    let now = gw.now();
    gw.table
        .update(|r| r.dispatch_prefill(id, &RouteRequest::new(prompt), remote, now))
        .map_err(|e| AdmitError::Internal(e.to_string()))?;
    let bs = gw.config().router.block_size;
    let cached = (remote.matched_blocks * bs).min(prompt.tokens);
    share_dispatch(gw, id, remote.worker, prompt, cached);
    Ok(LedgerGuard::booked(&gw.bookings, id, remote.worker))
}

/// Tells the peer replicas of a booking (`cached` of the prompt's tokens held there).
fn share_dispatch(
    gw: &Gateway,
    id: kvroute_core::RequestId,
    worker: kvroute_core::WorkerId,
    prompt: &kvroute_core::BlockedPrompt,
    cached: usize,
) {
    gw.bookings.share(|| LoadOp::Dispatch {
        req: id.0,
        worker: gw
            .registry
            .get(worker)
            .map(|w| w.name.clone())
            .unwrap_or_default(),
        prompt_tokens: prompt.tokens as u64,
        cached_tokens: cached as u64,
        blocks: prompt.sequence.iter().map(|s| s.0).collect(),
    });
}

/// One pass over the queue at the clock's now: expired requests refused, then the others
/// routed in arrival order while workers take them (the core's [`kvroute_core::admission::queue::Drain`]:
/// the first that must still wait holds back the later ones of its kind). Returns the next
/// deadline.
pub fn drain(gw: &Arc<Gateway>) -> Option<Time> {
    let now = gw.now();
    let mut answers: Vec<(oneshot::Sender<Answer>, Answer)> = Vec::new();
    let next = gw.table.with_both(|q, r| {
        for e in q.expire(now) {
            answers.push((e.item.tx, Err(AdmitError::Rejected(e.expiry, None))));
        }
        if !q.is_empty() {
            let mut pass = q.drain();
            while let Some(e) = pass.next() {
                if e.item.tx.is_closed() {
                    // Its client left; its `Place` finds it gone.
                    continue;
                }
                let request = RouteRequest {
                    prompt: &e.item.prompt,
                    session: e.item.session,
                    queue: pass.state(),
                    eligible: &e.eligible,
                    flow: e.flow,
                };
                match route_and_book(gw, r, &request, e.item.explain) {
                    Ok(None) => pass.wait(e),
                    Ok(Some(a)) => answers.push((e.item.tx, Ok(a))),
                    Err(err) => answers.push((e.item.tx, Err(err))),
                }
            }
        }
        q.next_deadline()
    });
    for (tx, answer) in answers {
        // A booking whose request left is dropped here, outside the locks: released.
        let _ = tx.send(answer);
    }
    next
}

/// The queue's task: a pass whenever [`Gateway::released`] rings, and at the next deadline.
pub async fn drive(gw: Arc<Gateway>) {
    loop {
        let next = drain(&gw);
        let rung = gw.table.rung();
        match next {
            Some(t) => {
                tokio::select! {
                    _ = rung => {}
                    _ = tokio::time::sleep_until(gw.clock.instant(t)) => {}
                }
            }
            None => rung.await,
        }
    }
}

#[cfg(test)]
mod tests;
