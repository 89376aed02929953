//! From a checked request to a booked worker: preprocessing (template + tokenizer, or token
//! ids as given) into blocks, routing with explicit admission (queue, shed, none), and the
//! RAII guard that releases the ledger on first token, completion, failure or disconnect.

use crate::error::GatewayError;
use crate::state::Gateway;
use kvroute_core::{
    BlockedPrompt, Explanation, Namespace, RejectReason, RequestId, RouteOutcome, RouteRequest,
    Selection, WorkerId,
};
use kvroute_protocol::openai::{ApiError, RequestView};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

/// A request's prompt, cut into blocks.
pub struct Prepared {
    /// The prompt's blocks.
    pub prompt: BlockedPrompt,
    /// Its session, for affinity (`x-session-id` header, else `user`).
    pub session: Option<u64>,
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
    let limit = gw.config.limits.max_prompt_tokens;
    if tokens.len() > limit {
        return Err(ApiError::prompt_too_long(tokens.len(), limit).into());
    }
    let block_size = gw.router().block_size();
    // Hashed as the engines key their caches: per LoRA adapter (a `model` naming one) and
    // per cache salt.
    let lora = gw.adapter_of(&view.model);
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
    Ok(Prepared { prompt, session })
}

/// A dispatched request's booking; releases the ledger when dropped.
pub struct LedgerGuard {
    gw: Arc<Gateway>,
    /// The ledger's id of the request.
    pub request: RequestId,
    /// The worker booked.
    pub worker: WorkerId,
    first_token: bool,
}

impl LedgerGuard {
    /// The first token arrived: the prefill part of the booking is released.
    pub fn first_token(&mut self) {
        if !self.first_token {
            self.first_token = true;
            let now = self.gw.now();
            // The worker may have been taken out meanwhile: nothing left to release then.
            let _ = self.gw.router().first_token(self.request, now);
            self.gw.wake.notify_waiters();
        }
    }
}

impl Drop for LedgerGuard {
    fn drop(&mut self) {
        let now = self.gw.now();
        let _ = self.gw.router().finish(self.request, now);
        self.gw.metrics.inflight.dec();
        self.gw.wake.notify_waiters();
    }
}

/// A request's place in the admission queue's counts (requests and tokens waiting), given
/// back when dropped: on dispatch, rejection, timeout, or the client going away while it
/// waits (its request future is dropped).
struct QueueSlot {
    gw: Arc<Gateway>,
    tokens: u64,
}

impl QueueSlot {
    fn take(gw: &Arc<Gateway>, tokens: u64) -> Self {
        gw.queue_change(true, tokens);
        Self {
            gw: gw.clone(),
            tokens,
        }
    }
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.gw.queue_change(false, self.tokens);
    }
}

/// Routes `prep`, waiting in the admission queue when every worker is busy, and books the
/// chosen worker; with the decision's explanation when `call` asks for it. `exclude` is a
/// worker the request just failed on.
pub async fn admit(
    gw: &Arc<Gateway>,
    prep: &Prepared,
    exclude: Option<WorkerId>,
    call: &crate::proxy::Call,
) -> Result<(Selection, LedgerGuard, Option<Explanation>), GatewayError> {
    let started = call.started;
    let mut explanation = None;
    let tokens = prep.prompt.tokens as u64;
    let mut queued_at = None;
    let result = loop {
        // Registered before looking, so a release between the look and the wait is not lost.
        let wake = gw.wake.notified();
        tokio::pin!(wake);
        wake.as_mut().enable();
        let mut queue = gw.queue_state();
        if queued_at.is_some() {
            // The queue counts this request: admission must see the others only.
            queue.requests = queue.requests.saturating_sub(1);
            queue.tokens = queue.tokens.saturating_sub(tokens);
        }
        let request = RouteRequest {
            prompt: &prep.prompt,
            session: prep.session,
            queue,
            exclude,
        };
        let outcome = {
            let mut r = gw.router();
            let outcome = if call.explain {
                let (outcome, ex) = r.route_explained(&request);
                explanation = Some(ex);
                outcome
            } else {
                r.route(&request)
            };
            match outcome {
                RouteOutcome::Dispatch(sel) => {
                    let id = gw.next_request();
                    match r.dispatch(id, &request, &sel, gw.now()) {
                        Ok(()) => Ok(Some((sel, id))),
                        Err(e) => Err(GatewayError::Internal(e.to_string())),
                    }
                }
                RouteOutcome::Queue => Ok(None),
                RouteOutcome::Reject(reason) => Err(GatewayError::Rejected(reason)),
            }
        };
        match outcome {
            Ok(Some((sel, id))) => {
                tracing::debug!(worker = %sel.worker, matched_blocks = sel.matched_blocks, prompt_tokens = prep.prompt.tokens, cost = ?sel.cost, "routed");
                gw.metrics.inflight.inc();
                break Ok((sel, id));
            }
            Err(e) => break Err(e),
            Ok(None) => {}
        }
        let wait = gw.config.router.admission.max_queue_wait_secs;
        let (deadline, _) = queued_at.get_or_insert_with(|| {
            (
                Instant::now() + std::time::Duration::from_secs_f64(wait),
                QueueSlot::take(gw, tokens),
            )
        });
        if tokio::time::timeout_at((*deadline).into(), wake)
            .await
            .is_err()
        {
            break Err(GatewayError::Rejected(RejectReason::QueueTimeout));
        }
    };
    // Out of the queue (a client that gives up while queued drops its slot with the future).
    let queued = queued_at.take().is_some();
    match result {
        Ok((sel, request)) => {
            let m = &gw.metrics;
            if !queued {
                m.routing_duration.observe(started.elapsed().as_secs_f64());
            }
            m.predicted_cached_tokens.observe(sel.cached_tokens as f64);
            if let Some(w) = gw.registry.get(sel.worker) {
                m.decisions.with_label_values(&[gw.policy, &w.name]).inc();
            }
            let guard = LedgerGuard {
                gw: gw.clone(),
                request,
                worker: sel.worker,
                first_token: false,
            };
            Ok((sel, guard, explanation))
        }
        Err(e) => {
            if let GatewayError::Rejected(reason) = &e {
                gw.metrics
                    .rejected
                    .with_label_values(&[reason.as_str()])
                    .inc();
            }
            Err(e)
        }
    }
}
