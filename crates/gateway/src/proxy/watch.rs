//! A streamed answer watched on its way through (the gateway's own proxy and the endpoint
//! picker alike): first token (the ledger's prefill booking released), inter-token gaps,
//! usage, the end (the booking released, the request counted), or the client gone (499).

use super::{finish, worker_name, Peek, Prediction};
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::routing::LedgerGuard;
use axum::http::StatusCode;
use kvroute_core::{Time, WorkerId};
use kvroute_protocol::openai::{ApiError, SseEvent, SseParser, Usage};
use std::sync::Arc;
use std::time::Duration;

/// Watches a stream on its way through.
pub(crate) struct Watch {
    gw: Arc<Gateway>,
    guard: Option<LedgerGuard>,
    /// The current worker's first token went by (its prefill booking released).
    guard_first_token: bool,
    model: String,
    /// The request's class (the per-class latency metric's label).
    class: String,
    started: Time,
    pub(crate) parser: SseParser,
    events: Vec<SseEvent>,
    last_token: Option<Time>,
    usage: Option<Usage>,
    /// Tokens a continuation carried on from (its usage is adjusted by them).
    carried: u32,
    /// The stream's `[DONE]` went by: the client has the whole answer.
    completed: bool,
    /// What the router expected of the worker (none once the stream migrated).
    prediction: Option<Prediction>,
    /// The longest silence between the worker's chunks (`upstream.idle_timeout_secs`).
    pub(crate) idle: Duration,
    done: bool,
}

impl Watch {
    pub(crate) fn new(
        gw: Arc<Gateway>,
        guard: LedgerGuard,
        (model, class): (String, String),
        started: Time,
        prediction: Prediction,
    ) -> Self {
        Self {
            idle: gw.upstream.idle_timeout(),
            gw,
            guard: Some(guard),
            guard_first_token: false,
            model,
            class,
            started,
            parser: SseParser::new(),
            events: Vec::new(),
            last_token: None,
            usage: None,
            carried: 0,
            completed: false,
            prediction: Some(prediction),
            done: false,
        }
    }

    /// Reads a chunk, handing each event to `each`; false when the stream is not one the
    /// gateway can read (it then stops watching).
    pub(crate) fn observe(&mut self, chunk: &[u8], each: impl FnMut(&SseEvent)) -> bool {
        if self.parser.feed(chunk, &mut self.events).is_err() {
            self.events.clear();
            return false;
        }
        self.take_events(each);
        true
    }

    /// The stream ended: an event it did not close with a blank line is read too (a last
    /// usage chunk).
    pub(crate) fn observe_end(&mut self) {
        if self.parser.finish(&mut self.events).is_ok() {
            self.take_events(|_| {});
        }
        self.events.clear();
    }

    /// Handles the events parsed so far.
    fn take_events(&mut self, mut each: impl FnMut(&SseEvent)) {
        let mut events = std::mem::take(&mut self.events);
        for ev in events.drain(..) {
            each(&ev);
            let d = match ev {
                SseEvent::Data(d) => d,
                SseEvent::Done => {
                    self.completed = true;
                    continue;
                }
            };
            // After the worker's first token only the usage chunk needs reading; other
            // chunks are token chunks (for the inter-token gaps) and skip the JSON parse.
            if !self.guard_first_token || d.contains("\"usage\"") {
                let Ok(peek) = serde_json::from_str::<Peek>(&d) else {
                    continue;
                };
                if let Some(mut u) = peek.usage {
                    let carried = u64::from(self.carried);
                    u.prompt_tokens = u.prompt_tokens.saturating_sub(carried);
                    u.completion_tokens += carried;
                    self.usage = Some(u);
                }
                if peek.choices.is_empty() {
                    continue;
                }
            }
            self.token();
        }
        self.events = events;
    }

    /// A token chunk went by.
    fn token(&mut self) {
        let now = self.gw.now();
        let m = &self.gw.metrics;
        match self.last_token {
            None => {
                let secs = now.since(self.started).as_secs_f64();
                m.ttft.observe(secs);
                m.class_ttft
                    .with_label_values(&[self.class.as_str()])
                    .observe(secs);
            }
            Some(prev) => m.itl.observe(now.since(prev).as_secs_f64()),
        }
        self.last_token = Some(now);
        if !self.guard_first_token {
            self.guard_first_token = true;
            if let Some(g) = &mut self.guard {
                g.first_token();
            }
        }
    }

    /// The worker's stream failed after the client got its `200` headers (`kind`:
    /// `stream_broken`, or `stream_idle` when it went silent): counted as an upstream error
    /// of the worker; returns the worker.
    pub(crate) fn worker_failed(&mut self, kind: &'static str, message: &str) -> Option<WorkerId> {
        let worker = self.worker_name();
        tracing::warn!(worker = %worker, kind, error = %message, "worker stream failed");
        self.gw
            .metrics
            .upstream_errors
            .with_label_values(&[&worker, kind])
            .inc();
        self.guard.as_ref().map(|g| g.worker)
    }

    /// A continuation on another worker (booked by `guard`) carries the stream on from
    /// `carried` tokens; the failed worker's booking is released.
    pub(crate) fn switch(&mut self, mut guard: LedgerGuard, carried: u32) {
        // The request's hold on its tenant's limits goes on with it.
        guard.attach(self.guard.as_mut().and_then(LedgerGuard::detach));
        self.guard = Some(guard);
        self.guard_first_token = false;
        self.parser = SseParser::new();
        self.carried = carried;
        self.prediction = None;
    }

    /// The stream ends with an error event: the request counts as the `200` the client saw;
    /// returns the error, mapped like every upstream failure. The upstream request is dropped
    /// with the stream, which cancels it at the worker.
    pub(crate) fn give_up(&mut self, message: String, timeout: bool) -> ApiError {
        let worker = self.worker_name();
        self.end(StatusCode::OK);
        GatewayError::Upstream {
            worker,
            message,
            timeout,
        }
        .to_api()
    }

    fn worker_name(&self) -> String {
        self.guard
            .as_ref()
            .map_or_else(|| "?".to_string(), |g| worker_name(&self.gw, g.worker))
    }

    pub(crate) fn end(&mut self, status: StatusCode) {
        if !self.done {
            self.done = true;
            finish(
                &self.gw,
                &self.model,
                status,
                self.started,
                self.usage.as_ref(),
                self.prediction,
            );
            if let (true, Some(u), Some(g)) = (self.completed, &self.usage, &mut self.guard) {
                // This worker's own tokens: those carried in were another's.
                g.completed(u.completion_tokens.saturating_sub(u64::from(self.carried)));
            }
            self.guard = None;
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // The stream was dropped before the worker's end. A client that read `[DONE]` may
        // close at once (the official clients do): that request completed. Otherwise the
        // client went away before the end: 499, as proxies log it.
        if !self.done {
            let status = if self.completed {
                StatusCode::OK
            } else {
                StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST)
            };
            self.end(status);
        }
    }
}
