//! Forwarding a routed request to its worker and the answer back: the body goes out as the
//! client sent it; a failure before the first byte is retried once on another worker; a
//! whole answer comes back read under a bound, a stream through [`stream`] (watched, and
//! carried on by another worker when its own fails mid-way).

mod prefill;
mod stream;
pub(crate) mod watch;

use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::routing::{admit, LedgerGuard, Prepared};
use crate::{PREDICTED_CACHED_HEADER, REQUEST_ID_HEADER, WORKER_HEADER};
use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use kvroute_fleet::bookings::FlowPermit;
use kvroute_protocol::openai::{RequestView, Usage};
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

/// What the gateway reads of an answer or stream chunk.
#[derive(Deserialize)]
pub(crate) struct Peek {
    #[serde(default)]
    pub(crate) choices: Vec<IgnoredAny>,
    #[serde(default)]
    pub(crate) usage: Option<Usage>,
}

/// What the router expected of a request's worker, checked against the engine's usage.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Prediction {
    /// The ledger's id of the request (a worker tracked approximately learns from its
    /// answer: `Router::observe_cached`).
    pub(crate) request: kvroute_core::RequestId,
    pub(crate) worker: kvroute_core::WorkerId,
    pub(crate) predicted: u64,
    pub(crate) prompt_tokens: u64,
    /// Its prompt was computed on a prefill worker: what the decode engine reports as
    /// cached then depends on its connector and version (the moved KV, or the prefill
    /// engine's hit), so the answer is no sample of the prediction's accuracy.
    pub(crate) split: bool,
}

/// One request on its way through the gateway.
#[derive(Clone)]
pub struct Call {
    /// The checked request.
    pub view: RequestView,
    /// The body as the client sent it.
    pub body: Bytes,
    /// The request id (sent upstream and back).
    pub request_id: String,
    /// When it arrived (the gateway's clock).
    pub started: kvroute_core::Time,
    /// Whether the client asked for the routing explanation (`x-kvroute-explain`).
    pub explain: bool,
    /// The client's `Authorization` header (sent on with `upstream.forward_authorization`).
    pub authorization: Option<HeaderValue>,
    /// Whether a stream that breaks after its first byte may be carried on by another worker
    /// (`upstream.migration_limit` above 0 and no `x-kvroute-migrate: off`).
    pub migrate: bool,
    /// Its class's engine priority (lower = sooner), sent in the body's `priority` to
    /// workers that take one (`WorkerSpec::priority`).
    pub engine_priority: Option<i32>,
}

/// Routes and forwards `call`; returns the answer to send back.
pub async fn forward(
    gw: &Arc<Gateway>,
    call: Arc<Call>,
    prep: Arc<Prepared>,
    permit: FlowPermit,
) -> Result<Response, GatewayError> {
    // The request's hold on its tenant's limits rides with the booking of the worker that
    // answers it; a retry carries it on.
    let mut permit = Some(permit);
    let mut eligible = kvroute_core::Eligible::Any;
    let attempts = if gw.config().upstream.retry { 2 } else { 1 };
    let mut last_error = None;
    for attempt in 0..attempts {
        let (sel, mut guard, explanation) =
            match admit(gw, &prep, &eligible, call.explain, call.started).await {
                Ok(x) => x,
                // A retry that finds no other worker reports the first failure.
                Err(e) if attempt > 0 => return Err(last_error.unwrap_or(e)),
                Err(e) => return Err(e),
            };
        guard.attach(permit.take());
        let worker = guard.worker;
        // A split request: its prompt computed on the prefill worker first.
        let handoff = match &sel.prefill {
            Some(remote) => {
                let handoff = prefill::run(gw, &call, &prep, remote).await;
                if handoff.kv_sent {
                    // The decode leg goes now, its KV computed: its first token is timed
                    // from here as the decode worker's own.
                    guard.kv_arrived();
                }
                Some(handoff)
            }
            None => None,
        };
        let body = handoff
            .as_ref()
            .map_or_else(|| call.body.clone(), |h| h.body.clone());
        match send(gw, &call, worker, body).await {
            Ok(resp) if resp.status().is_server_error() && attempt + 1 < attempts => {
                let name = worker_name(gw, worker);
                gw.metrics
                    .upstream_errors
                    .with_label_values(&[&name, "status_5xx"])
                    .inc();
                tracing::warn!(worker = %name, status = resp.status().as_u16(), request_id = %call.request_id, "worker failed; retrying elsewhere");
                last_error = Some(GatewayError::Upstream {
                    worker: name,
                    message: format!("answered {}", resp.status()),
                    timeout: false,
                });
            }
            Ok(resp) => match start_reading(gw, &call, resp).await {
                Ok(read) => {
                    let prediction = Prediction {
                        request: guard.request,
                        worker,
                        predicted: sel.cached_tokens as u64,
                        prompt_tokens: prep.prompt.tokens as u64,
                        split: sel.prefill.is_some(),
                    };
                    let mut out = answer(gw, &call, &prep, guard, read, prediction);
                    if let Some(v) = handoff
                        .and_then(|h| h.prefill_worker)
                        .and_then(|n| HeaderValue::from_str(&n).ok())
                    {
                        out.headers_mut()
                            .insert(kvroute_fleet::headers::PREFILL_WORKER_HEADER, v);
                    }
                    if let Some(v) = explanation
                        .as_ref()
                        .and_then(|ex| crate::explanation::header_value(gw, ex))
                    {
                        out.headers_mut().insert(crate::ROUTE_HEADER, v);
                    }
                    return Ok(out);
                }
                Err(message) => {
                    // The answer broke off before its first byte reached the client (the
                    // engine died or hung up): nothing was sent, so another worker can take
                    // it.
                    let name = worker_name(gw, worker);
                    gw.metrics
                        .upstream_errors
                        .with_label_values(&[&name, "broken"])
                        .inc();
                    tracing::warn!(worker = %name, error = %message, request_id = %call.request_id, "worker's answer broke off before its first byte");
                    let e = GatewayError::Upstream {
                        worker: name,
                        message,
                        timeout: false,
                    };
                    if attempt + 1 >= attempts {
                        return Err(e);
                    }
                    last_error = Some(e);
                }
            },
            Err(e) => {
                let name = worker_name(gw, worker);
                let kind = if matches!(e, GatewayError::Upstream { timeout: true, .. }) {
                    "timeout"
                } else {
                    "connect"
                };
                gw.metrics
                    .upstream_errors
                    .with_label_values(&[&name, kind])
                    .inc();
                tracing::warn!(worker = %name, error = %e, request_id = %call.request_id, "worker unreachable");
                if kind == "connect" {
                    // A refused connection is a dead worker: stop sending it traffic now
                    // rather than at the next health check.
                    gw.workers.take_out(worker, "connection failed");
                }
                last_error = Some(e);
            }
        }
        permit = guard.detach();
        drop(guard);
        gw.metrics.retries.inc();
        eligible = eligible.after_failure(worker);
    }
    Err(last_error.unwrap_or_else(|| GatewayError::Internal("no attempt was made".into())))
}

fn worker_name(gw: &Gateway, id: kvroute_core::WorkerId) -> String {
    gw.registry
        .get(id)
        .map_or_else(|| id.to_string(), |w| w.name.clone())
}

/// `body` (a JSON object) with its `priority` set to `value`; `None` if it is not one (the
/// gateway and the endpoint picker both send the engine's priority so).
pub(crate) fn with_priority(body: &[u8], value: i64) -> Option<Vec<u8>> {
    let mut map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body).ok()?;
    map.insert("priority".into(), value.into());
    serde_json::to_vec(&map).ok()
}

/// Sends `body` (the client's, or a continuation) for `call` to `worker`, with the request's
/// engine priority when the worker takes one.
async fn send(
    gw: &Arc<Gateway>,
    call: &Call,
    worker: kvroute_core::WorkerId,
    body: Bytes,
) -> Result<reqwest::Response, GatewayError> {
    let w = gw
        .registry
        .get(worker)
        .ok_or_else(|| GatewayError::Internal(format!("unknown worker {worker}")))?;
    let url = w
        .url(call.view.endpoint)
        .map_err(|e| GatewayError::Internal(format!("worker {} URL: {e}", w.name)))?;
    let mut req = gw
        .upstream
        .client()
        .post(url)
        .header(header::CONTENT_TYPE, "application/json")
        .header(REQUEST_ID_HEADER, &call.request_id);
    if let Some(rank) = w.spec.dp_rank {
        req = req.header(kvroute_fleet::headers::DP_RANK_HEADER, rank);
    }
    req = match &call.authorization {
        Some(client) if gw.config().upstream.forward_authorization => {
            req.header(header::AUTHORIZATION, client)
        }
        _ => kvroute_fleet::upstream::with_key(req, gw.upstream.key_for(&w.spec)),
    };
    let body = match (w.spec.priority, call.engine_priority) {
        (Some(order), Some(p)) => with_priority(&body, order.value(p)).map_or(body, Bytes::from),
        _ => body,
    };
    let req = req.body(body).send();
    let timeout = Duration::from_secs_f64(gw.config().upstream.first_byte_timeout_secs);
    match tokio::time::timeout(timeout, req).await {
        Ok(Ok(resp)) => Ok(resp),
        Ok(Err(e)) => Err(GatewayError::Upstream {
            worker: w.name.clone(),
            message: e.to_string(),
            timeout: e.is_timeout(),
        }),
        Err(_) => Err(GatewayError::Upstream {
            worker: w.name.clone(),
            message: format!("no answer within {timeout:?}"),
            timeout: true,
        }),
    }
}

/// A worker's answer, read as far as needed to know that it is coming.
struct Read {
    status: StatusCode,
    content_type: Option<HeaderValue>,
    body: ReadBody,
}

enum ReadBody {
    /// A stream whose first chunk arrived (empty when the stream ended at once).
    Stream {
        first: Bytes,
        rest: futures_util::stream::BoxStream<'static, reqwest::Result<Bytes>>,
    },
    /// A whole answer, or why it could not be read (`too_large`) with an error body.
    Whole(Option<&'static str>, Bytes),
}

/// Reads a stream's first chunk, or a whole answer; Err when it broke off before any byte
/// could reach the client (the request can then go elsewhere).
async fn start_reading(
    gw: &Arc<Gateway>,
    call: &Call,
    resp: reqwest::Response,
) -> Result<Read, String> {
    let status = resp.status();
    let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
    let body = if call.view.stream && status.is_success() {
        let mut rest = resp.bytes_stream().boxed();
        let timeout = Duration::from_secs_f64(gw.config().upstream.first_byte_timeout_secs);
        match tokio::time::timeout(timeout, rest.next()).await {
            Ok(Some(Ok(first))) => ReadBody::Stream { first, rest },
            Ok(None) => ReadBody::Stream {
                first: Bytes::new(),
                rest,
            },
            Ok(Some(Err(e))) => return Err(format!("the worker's stream broke off: {e}")),
            Err(_) => return Err(format!("no stream chunk within {timeout:?}")),
        }
    } else {
        match read_body(gw, resp).await {
            (Some("broken"), _) => return Err("the worker's answer broke off".into()),
            (code, body) => ReadBody::Whole(code, body),
        }
    };
    Ok(Read {
        status,
        content_type,
        body,
    })
}

/// Builds the client's answer from the worker's; `predicted` is the prompt tokens the router
/// expected the worker to hold.
fn answer(
    gw: &Arc<Gateway>,
    call: &Arc<Call>,
    prep: &Arc<Prepared>,
    guard: LedgerGuard,
    read: Read,
    prediction: Prediction,
) -> Response {
    let Read {
        status,
        content_type,
        body,
    } = read;
    let worker = worker_name(gw, guard.worker);
    let streaming = matches!(body, ReadBody::Stream { .. });
    let mut out = match body {
        ReadBody::Stream { first, rest } => Response::new(Body::from_stream(stream::relay(
            gw,
            call.clone(),
            prep.clone(),
            guard,
            (first, rest),
            prediction,
        ))),
        ReadBody::Whole(code, body) => {
            let status = if code.is_some() {
                StatusCode::BAD_GATEWAY
            } else {
                status
            };
            let usage = serde_json::from_slice::<Peek>(&body)
                .ok()
                .and_then(|p| p.usage);
            finish(
                gw,
                &call.view.model,
                status,
                call.started,
                usage.as_ref(),
                Some(prediction),
            );
            drop(guard);
            let mut r = Response::new(Body::from(body));
            *r.status_mut() = status;
            r
        }
    };
    *out.status_mut() = if streaming { status } else { out.status() };
    let headers = out.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        content_type.unwrap_or(HeaderValue::from_static("application/json")),
    );
    if let Ok(v) = HeaderValue::from_str(&call.request_id) {
        headers.insert(REQUEST_ID_HEADER, v);
    }
    if let Ok(v) = HeaderValue::from_str(&worker) {
        headers.insert(WORKER_HEADER, v);
    }
    headers.insert(
        PREDICTED_CACHED_HEADER,
        HeaderValue::from(prediction.predicted),
    );
    out
}

/// Reads a whole answer, bounded; on failure returns an error body and a code.
async fn read_body(gw: &Gateway, mut resp: reqwest::Response) -> (Option<&'static str>, Bytes) {
    let limit = gw.config().limits.max_response_bytes;
    let idle = gw.upstream.idle_timeout();
    let mut buf = Vec::new();
    loop {
        let Ok(chunk) = tokio::time::timeout(idle, resp.chunk()).await else {
            let e = kvroute_protocol::openai::ApiError::new(
                kvroute_protocol::openai::ErrorKind::Upstream,
                format!("the worker's answer went silent for {idle:?}"),
            );
            return (Some("broken"), Bytes::from(e.to_json()));
        };
        match chunk {
            Ok(Some(c)) if buf.len() + c.len() <= limit => buf.extend_from_slice(&c),
            Ok(Some(_)) => {
                let e = kvroute_protocol::openai::ApiError::new(
                    kvroute_protocol::openai::ErrorKind::Upstream,
                    format!("the worker's answer is larger than {limit} bytes"),
                );
                return (Some("too_large"), Bytes::from(e.to_json()));
            }
            Ok(None) => return (None, Bytes::from(buf)),
            Err(err) => {
                let e = kvroute_protocol::openai::ApiError::new(
                    kvroute_protocol::openai::ErrorKind::Upstream,
                    format!("the worker's answer broke off: {err}"),
                );
                return (Some("broken"), Bytes::from(e.to_json()));
            }
        }
    }
}

/// Records a finished request; a successful one whose usage reports cached tokens is a
/// sample of the worker's prediction accuracy (`prediction`; none for a migrated stream).
pub(crate) fn finish(
    gw: &Gateway,
    model: &str,
    status: StatusCode,
    started: kvroute_core::Time,
    usage: Option<&Usage>,
    prediction: Option<Prediction>,
) {
    let m = &gw.metrics;
    m.requests
        .with_label_values(&[model, status.as_str()])
        .inc();
    m.duration.observe(gw.clock.secs_since(started));
    if let Some(u) = usage {
        m.input_tokens.observe(u.prompt_tokens as f64);
        m.cached_tokens.observe(u.cached_tokens() as f64);
        m.output_tokens.observe(u.completion_tokens as f64);
        m.output_tokens_total.inc_by(u.completion_tokens);
        if let (true, Some(details), Some(prediction)) = (
            status.is_success(),
            &u.prompt_tokens_details,
            prediction.filter(|p| !p.split),
        ) {
            gw.workers.observe_prediction(
                prediction.worker,
                kvroute_fleet::accuracy::Sample {
                    predicted: prediction.predicted,
                    cached: details.cached_tokens,
                    gateway_prompt: prediction.prompt_tokens,
                    engine_prompt: u.prompt_tokens,
                    block_size: gw.config().router.block_size as u64,
                },
            );
            let approximate = gw.registry.get(prediction.worker).is_some_and(|w| {
                w.cache_state() == kvroute_fleet::registry::CacheState::Approximate
            });
            if approximate {
                // What the engine kept teaches the router how much it keeps.
                let cached = usize::try_from(details.cached_tokens).unwrap_or(usize::MAX);
                gw.table
                    .update(|r| r.observe_cached(prediction.request, cached));
            }
        }
    }
}
