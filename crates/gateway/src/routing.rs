//! From a checked request to a booked worker: preprocessing (template + tokenizer, or token
//! ids as given) into blocks, routing with explicit admission (queue, shed, none), and the
//! RAII guard that releases the ledger on first token, completion, failure or disconnect.
//! The admission queue's driver is `routing/queue.rs`.

pub mod flow;
pub mod queue;

use crate::error::GatewayError;
use crate::gateway::Gateway;
use kvroute_core::{
    BlockedPrompt, Eligible, Explanation, Namespace, RouteRequest, Selection, Time,
};
use kvroute_fleet::bookings::AdmitError;
pub use kvroute_fleet::bookings::LedgerGuard;
use kvroute_protocol::openai::{ApiError, RequestView};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A request's prompt, cut into blocks.
pub struct Prepared {
    /// The prompt's blocks.
    pub prompt: BlockedPrompt,
    /// Its session, for affinity (`x-session-id` header, else `user`).
    pub session: Option<u64>,
    /// Its tenant, class and needs (the defaults until [`flow::identify`] says).
    pub identity: flow::Identity,
}

/// Renders and tokenizes the prompt of `view` and cuts it into blocks.
pub async fn prepare(
    gw: &Arc<Gateway>,
    view: &RequestView,
    session_header: Option<&str>,
) -> Result<Prepared, GatewayError> {
    let tokens = gw
        .preprocessor
        .prompt_tokens_pooled(view.input.clone())
        .await?;
    let limit = gw.config().limits.max_prompt_tokens;
    if tokens.len() > limit {
        return Err(ApiError::prompt_too_long(tokens.len(), limit).into());
    }
    let block_size = gw.table.block_size();
    // Hashed as the engines key their caches: per LoRA adapter (a `model` naming one) and
    // per cache salt.
    let lora = gw.models.adapter_of(&view.model);
    let salt = view.cache_salt.as_deref();
    let namespace = Namespace::new(lora, salt);
    let prompt = BlockedPrompt::new(&tokens, block_size, namespace);
    let session = session_header
        .map(str::to_string)
        .or_else(|| view.user.clone())
        .map(|s| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            s.hash(&mut h);
            h.finish()
        });
    Ok(Prepared {
        prompt,
        session,
        identity: flow::Identity::default(),
    })
}

/// Lets `prep` in within its tenant's limits (counted by tenant, class and reason when
/// refused): its hold on them, carried with its booking.
pub fn enter(
    gw: &Arc<Gateway>,
    prep: &Prepared,
) -> Result<kvroute_fleet::bookings::FlowPermit, GatewayError> {
    let id = &prep.identity;
    gw.bookings
        .enter(id.flow, id.generation, prep.prompt.tokens as u64, id.output)
        .map_err(|over| {
            gw.metrics
                .rejected
                .with_label_values(&[kvroute_core::RejectReason::TenantLimit.as_str()])
                .inc();
            count_refusal(gw, id, kvroute_core::RejectReason::TenantLimit);
            GatewayError::RejectedFor {
                reason: kvroute_core::RejectReason::TenantLimit,
                retry_after: over.retry_after,
            }
        })
}

/// Counts a refusal of a request of `identity` by its tenant, class and reason.
pub fn count_refusal(gw: &Gateway, identity: &flow::Identity, reason: kvroute_core::RejectReason) {
    let (flows, flow) = gw.flow_now(identity.flow, identity.generation);
    let tenant = &flows.tenant(flow.tenant).name;
    let class = &flows.class(flow.class).name;
    gw.metrics
        .flow_refused
        .with_label_values(&[tenant, class, reason.as_str()])
        .inc();
}

/// Routes `prep` and books the chosen worker, waiting in the admission queue (in arrival
/// order, until its deadline) when every eligible worker is busy or earlier requests of its
/// kind wait there; with the decision's explanation when `explain`. `eligible` are the
/// workers it may go to (not one it just failed on; a data plane's subset); `started` is when the request came (for the routing time).
pub async fn admit(
    gw: &Arc<Gateway>,
    prep: &Prepared,
    eligible: &Eligible,
    explain: bool,
    started: Time,
) -> Result<(Selection, LedgerGuard, Option<Explanation>), GatewayError> {
    // A burst's later request whose choice is open (with peer replicas,
    // `router.peer_hold_secs`) waits until the peers' bookings of the same burst have
    // arrived, its replica's turn. (Off: the routing table's lock is not taken for it.)
    let arrived = gw.now();
    let hold = gw.config().router.peer_hold_secs > 0.0;
    if let Some(until) = hold
        .then(|| gw.table.update(|r| r.hold_until(arrived, &prep.prompt)))
        .flatten()
    {
        gw.metrics
            .peer_hold
            .observe(until.since(arrived).as_secs_f64());
        tokio::time::sleep_until(gw.clock.instant(until)).await;
    }
    let (first, wake) = gw.table.with_both(|q, r| {
        // Its flow in the flows now (resolved before a reload: mapped by name).
        let identity = flow::Identity {
            flow: q.current(prep.identity.flow, prep.identity.generation),
            generation: q.generation(),
            ..prep.identity
        };
        let request = RouteRequest {
            prompt: &prep.prompt,
            session: prep.session,
            queue: q.state(),
            eligible,
            flow: identity.flow,
        };
        // Behind the requests of its kind (and band or higher) already waiting, without
        // overtaking them.
        let routed = if q.holds(eligible, identity.flow.band) {
            Ok(None)
        } else {
            queue::route_and_book(gw, r, &request, explain)
        };
        match routed {
            Ok(None) => {
                // The queue's task sleeps until the earliest deadline (without one while the
                // queue is empty): it must learn this one when it comes first (an objective
                // shorter than the queue's wait can).
                let before = q.next_deadline();
                // The router's admission settings: a reload changes them there.
                let admission = &r.config().admission;
                match queue::enqueue(gw, q, admission, &request, &identity, explain) {
                    Ok(waiting) => {
                        let wake = before.is_none_or(|b| q.next_deadline() < Some(b));
                        (Err(waiting), wake)
                    }
                    Err(reason) => (Ok(Err(AdmitError::Rejected(reason, None))), false),
                }
            }
            Ok(Some(a)) => (Ok(Ok(a)), false),
            Err(e) => (Ok(Err(e)), false),
        }
    });
    if wake {
        gw.table.wake();
    }
    let (result, queued) = match first {
        Ok(result) => (result, false),
        Err((place, answer)) => {
            let result = answer.await.unwrap_or_else(|_| {
                Err(AdmitError::Internal("the admission queue went away".into()))
            });
            drop(place);
            (result, true)
        }
    };
    let m = &gw.metrics;
    match result {
        Ok(a) => {
            let sel = &a.sel;
            tracing::debug!(worker = %sel.worker, matched_blocks = sel.matched_blocks, prompt_tokens = prep.prompt.tokens, cost = ?sel.cost, queued, "routed");
            if !queued {
                m.routing_duration.observe(gw.clock.secs_since(started));
            }
            m.predicted_cached_tokens.observe(sel.cached_tokens as f64);
            if let Some(w) = gw.registry.get(sel.worker) {
                m.decisions.with_label_values(&[gw.policy, &w.name]).inc();
            }
            Ok((a.sel, a.guard, a.explanation))
        }
        Err(e) => {
            if let AdmitError::Rejected(reason, _) = &e {
                m.rejected.with_label_values(&[reason.as_str()]).inc();
                count_refusal(gw, &prep.identity, *reason);
            }
            Err(e.into())
        }
    }
}
