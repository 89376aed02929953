//! One request through the endpoint picker: Envoy's `ext_proc` messages in, the picker's
//! answers out.
//!
//! Request path, `FULL_DUPLEX_STREAMED` (the Gateway API's mode): the headers are noted and
//! not answered yet; the body is gathered (bounded by `limits.max_body_bytes`) until its
//! end; then the request is parsed, tokenized, routed and booked as the gateway does it
//! ([`prepare`], [`admit`]), and the headers are answered with the destination, followed
//! by the body given back in chunks. `BUFFERED` (the mode in which Envoy's fail-open works,
//! the body held by Envoy): the headers are let through at once and the destination is set
//! in the answer to the whole body. A refusal is an immediate answer to the client. Requests
//! the picker does not route (paths other than chat and completions, or no body) go to any
//! worker up, unbooked, decided at their headers (their bodies are passed on, never held).
//!
//! Response path: the headers are answered at once (the worker's name and the predicted
//! cached tokens added); a streamed answer goes through the gateway's [`Watch`] (first
//! token, usage, end), a whole one is copied (bounded) for its usage. The end of the answer
//! releases the booking; so does the end of the session (the client left: 499). Without
//! response bodies (mode `NONE`) the answer's headers end it.

use super::wire;
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::proxy::watch::Watch;
use crate::proxy::{finish, Peek, Prediction};
use crate::routing::flow::identify;
use crate::routing::{admit, prepare, LedgerGuard};
use axum::http::StatusCode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request::Request, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use kvroute_core::{Eligible, Time, WorkerId};
use kvroute_protocol::openai::{parse_request, ApiError, Endpoint, ErrorKind};
use std::sync::Arc;

/// The largest whole (unstreamed) answer copied to read its usage: past it the answer is
/// counted without (the whole-answer copies of many streams at once stay bounded).
const MAX_WHOLE_COPY: usize = 1 << 20;

/// The OpenAI endpoint of a request path (a gateway may have put a prefix before it).
fn inference_endpoint(path: &str) -> Option<Endpoint> {
    let path = path.split('?').next().unwrap_or("");
    if path.ends_with("/v1/chat/completions") {
        Some(Endpoint::Chat)
    } else if path.ends_with("/v1/completions") {
        Some(Endpoint::Completions)
    } else {
        None
    }
}

/// A request routed and booked.
struct Pick {
    model: String,
    /// The request's class (latency metrics by class).
    class: String,
    prediction: Prediction,
    worker_name: String,
    /// The booking, until the answer's watch takes it.
    guard: Option<LedgerGuard>,
    /// A split request's prefill booking, until the answer's headers (the decode worker's
    /// sidecar ran the prefill leg before them).
    prefill_guard: Option<LedgerGuard>,
}

/// Where the answer is.
enum Answer {
    /// Its headers have not come yet.
    Awaited,
    /// A stream, watched (until it turns out unreadable: `readable` false).
    Stream { watch: Box<Watch>, readable: bool },
    /// A whole answer: its status and a copy of its body (for the usage), while it fits.
    Whole { status: StatusCode, copy: Vec<u8> },
    /// Over (counted).
    Done,
}

/// One `ext_proc` stream's state.
pub(super) struct Session {
    gw: Arc<Gateway>,
    started: Time,
    request_id: String,
    path: String,
    session_header: Option<String>,
    /// The headers that say who the request is (its key, class, trusted tenant header,
    /// objective: `routing::flow`).
    flow_headers: reqwest::header::HeaderMap,
    /// The data plane's subset hint, when it gave one.
    subset: Option<Vec<String>>,
    /// The conformance suite's endpoint selection header, when honoured and sent.
    test_selection: Option<Vec<String>>,
    /// The endpoint the data plane says served the answer (its response metadata).
    served: Option<String>,
    body: Vec<u8>,
    /// The request headers were answered (the destination is set).
    decided: bool,
    /// The request body comes whole in one message (`BUFFERED`), not streamed.
    buffered: bool,
    /// Response bodies come in `FULL_DUPLEX_STREAMED` mode (given back), not only shown.
    echo_response: bool,
    /// Response bodies do not come at all (`NONE`).
    no_response_body: bool,
    pick: Option<Pick>,
    answer: Answer,
    over: bool,
}

impl Session {
    pub(super) fn new(gw: Arc<Gateway>) -> Self {
        Self {
            started: gw.now(),
            gw,
            request_id: String::new(),
            path: String::new(),
            session_header: None,
            flow_headers: reqwest::header::HeaderMap::new(),
            subset: None,
            test_selection: None,
            served: None,
            body: Vec::new(),
            decided: false,
            buffered: false,
            echo_response: true,
            no_response_body: false,
            pick: None,
            answer: Answer::Awaited,
            over: false,
        }
    }

    /// Whether the stream has nothing more to do (answered at once, or the answer ended).
    pub(super) fn is_over(&self) -> bool {
        self.over
    }

    /// Handles one message; returns the answers to send, in order.
    pub(super) async fn on(&mut self, msg: ProcessingRequest) -> Vec<ProcessingResponse> {
        if self.gw.config().epp.subset_hint && self.subset.is_none() {
            self.subset = wire::subset_hint(msg.metadata_context.as_ref());
        }
        if self.gw.config().epp.conformance_headers
            && matches!(msg.request, Some(Request::ResponseHeaders(_)))
        {
            self.served = wire::served_endpoint(msg.metadata_context.as_ref());
        }
        if let Some(pc) = &msg.protocol_config {
            use wire::mode;
            if ![mode::FULL_DUPLEX_STREAMED, mode::BUFFERED].contains(&pc.request_body_mode) {
                let e = ApiError::new(
                    ErrorKind::Internal,
                    "the endpoint picker needs the request body in FULL_DUPLEX_STREAMED or BUFFERED mode (ext_proc processing_mode.request_body_mode)",
                );
                tracing::error!(mode = pc.request_body_mode, "endpoint picker: {e}");
                return self.refuse(&e);
            }
            self.buffered = pc.request_body_mode == mode::BUFFERED;
            self.echo_response = pc.response_body_mode == mode::FULL_DUPLEX_STREAMED;
            self.no_response_body = pc.response_body_mode == mode::NONE;
        }
        match msg.request {
            Some(Request::RequestHeaders(h)) => self.on_request_headers(&h).await,
            Some(Request::RequestBody(b)) => {
                if self.decided {
                    // A request routed at its headers: its body passes on unchanged.
                    return vec![if self.buffered {
                        wire::request_body_unchanged()
                    } else {
                        wire::body_chunk(true, b.body, b.end_of_stream)
                    }];
                }
                let limit = self.gw.config().limits.max_body_bytes;
                if self.body.len() + b.body.len() > limit {
                    let e = ApiError::new(
                        ErrorKind::TooLarge,
                        format!("the request body is larger than {limit} bytes"),
                    );
                    return self.refuse(&e);
                }
                self.body.extend_from_slice(&b.body);
                if b.end_of_stream || self.buffered {
                    self.decide(b.end_of_stream).await
                } else {
                    Vec::new()
                }
            }
            Some(Request::RequestTrailers(_)) => {
                // Trailers end the body when the request has them.
                let mut out = if self.decided {
                    Vec::new()
                } else {
                    self.decide(false).await
                };
                if !self.over {
                    out.push(wire::trailers(true));
                }
                out
            }
            Some(Request::ResponseHeaders(h)) => self.on_response_headers(&h),
            Some(Request::ResponseBody(b)) => {
                self.observe(&b.body);
                let out = if self.echo_response {
                    wire::body_chunk(false, b.body, b.end_of_stream)
                } else {
                    wire::response_body_unchanged()
                };
                if b.end_of_stream {
                    self.end_answer();
                }
                vec![out]
            }
            Some(Request::ResponseTrailers(_)) => {
                self.end_answer();
                vec![wire::trailers(false)]
            }
            None => Vec::new(),
        }
    }

    async fn on_request_headers(&mut self, h: &HttpHeaders) -> Vec<ProcessingResponse> {
        self.request_id = self
            .gw
            .bookings
            .request_id(wire::header(h, kvroute_fleet::headers::REQUEST_ID_HEADER));
        self.path = wire::header(h, ":path").unwrap_or("/").to_string();
        self.session_header = wire::header(h, "x-session-id").map(str::to_string);
        let names = &self.gw.config().flow_headers;
        let wanted = [
            Some("authorization"),
            Some(names.class.as_str()),
            Some(names.ttft_ms.as_str()),
            names.tenant.as_deref(),
        ];
        for name in wanted.into_iter().flatten() {
            if let (Some(v), Ok(n)) = (
                wire::header(h, name).and_then(|v| reqwest::header::HeaderValue::from_str(v).ok()),
                reqwest::header::HeaderName::from_bytes(name.as_bytes()),
            ) {
                self.flow_headers.insert(n, v);
            }
        }
        if self.gw.config().epp.conformance_headers {
            self.test_selection = wire::header(h, wire::TEST_SELECTION_HEADER).map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|e| !e.is_empty())
                    .take(256)
                    .map(str::to_string)
                    .collect()
            });
        }
        if h.end_of_stream || inference_endpoint(&self.path).is_none() {
            // No body (a GET), or not a request the picker routes: any worker, at once.
            return self.pass_to_any();
        }
        if self.buffered {
            // Envoy holds the headers until the body is answered.
            return vec![wire::headers_unchanged()];
        }
        Vec::new()
    }

    /// The request body given back after the routing answer: nothing when Envoy buffered it.
    fn body_back(&self, body: &[u8], end_of_stream: bool) -> Vec<ProcessingResponse> {
        if self.buffered {
            Vec::new()
        } else {
            wire::body_chunks(true, body, end_of_stream)
        }
    }

    /// Routes the request whose body is whole; `end_of_stream` marks the last chunk given
    /// back (false when trailers follow).
    async fn decide(&mut self, end_of_stream: bool) -> Vec<ProcessingResponse> {
        let Some(endpoint) = inference_endpoint(&self.path) else {
            // Routed at its headers already (`on_request_headers`).
            return Vec::new();
        };
        match self.route(endpoint).await {
            Ok(headers) => {
                self.decided = true;
                self.gw
                    .metrics
                    .epp_streams
                    .with_label_values(&["routed"])
                    .inc();
                let body = std::mem::take(&mut self.body);
                let mut out = vec![headers];
                out.extend(self.body_back(&body, end_of_stream));
                out
            }
            Err((e, model)) => {
                // (Rejections were counted by `admit`.)
                let api = e.to_picker_api();
                self.gw
                    .metrics
                    .requests
                    .with_label_values(&[model.as_str(), &api.status().to_string()])
                    .inc();
                tracing::info!(request_id = %self.request_id, status = api.status(), error = %api.message, "endpoint picker: request refused");
                self.refuse(&api)
            }
        }
    }

    /// Parses, prepares, routes and books; the answer to the request headers.
    async fn route(
        &mut self,
        endpoint: Endpoint,
    ) -> Result<ProcessingResponse, (GatewayError, String)> {
        let gw = self.gw.clone();
        let unknown = |e: ApiError| (GatewayError::Api(e), String::new());
        let (_, view) = parse_request(endpoint, &self.body, gw.config().limits.max_prompt_tokens)
            .map_err(unknown)?;
        let model = view.model.clone();
        if !gw.models.serves(&view.model) {
            // Counted under one label: a client's names must not grow the metric's series.
            return Err((
                ApiError::model_not_found(&view.model).into(),
                "unknown".into(),
            ));
        }
        let with_model = |e: GatewayError| (e, model.clone());
        let eligible = self.eligible().map_err(with_model)?;
        let (flows, generation) = gw.flows_at();
        let mut identity = identify(&flows, &gw.config().flow_headers, &self.flow_headers, &view)
            .map_err(|e| with_model(e.into()))?;
        identity.generation = generation;
        let mut prep = prepare(&gw, &view, self.session_header.as_deref())
            .await
            .map_err(with_model)?;
        prep.identity = identity;
        let permit = crate::routing::enter(&gw, &prep).map_err(with_model)?;
        let (sel, mut guard, _) = admit(&gw, &prep, &eligible, false, self.started)
            .await
            .map_err(with_model)?;
        guard.attach(Some(permit));
        let worker = gw.registry.get(sel.worker).ok_or_else(|| {
            with_model(GatewayError::Internal(
                "the worker chosen left the fleet".into(),
            ))
        })?;
        let endpoint = wire::endpoint_of(&worker.spec.url).ok_or_else(|| {
            with_model(GatewayError::Internal(format!(
                "worker {} has no endpoint in its URL {}",
                worker.name, worker.spec.url
            )))
        })?;
        let mut more = vec![(
            kvroute_fleet::headers::REQUEST_ID_HEADER,
            self.request_id.clone(),
        )];
        if let Some(rank) = worker.spec.dp_rank {
            more.push((kvroute_fleet::headers::DP_RANK_HEADER, rank.to_string()));
        }
        // A split request: the decode endpoint's sidecar runs the prefill leg on this one.
        let mut prefill_guard = None;
        if let Some(remote) = &sel.prefill {
            let prefiller = gw
                .registry
                .get(remote.worker)
                .and_then(|w| wire::endpoint_of(&w.spec.url));
            if let Some(p) = prefiller {
                prefill_guard = crate::routing::queue::book_prefill(&gw, &prep.prompt, remote).ok();
                more.push((wire::PREFILLER_HEADER, p));
            }
        }
        // The engine's own priority, for a worker marked as taking it: the body rewritten,
        // given back so (Envoy sends a streamed body on chunked) or replaced when Envoy
        // buffered it (its length set to match).
        let (flows, flow) = gw.flow_now(prep.identity.flow, prep.identity.generation);
        let class = flows.class(flow.class);
        // Not for a split request: the decode endpoint's sidecar sends the same body to the
        // prefill worker, which may not take the field.
        let new_body = match (worker.spec.priority, class.engine_priority, &sel.prefill) {
            (Some(order), Some(p), None) => crate::proxy::with_priority(&self.body, order.value(p)),
            _ => None,
        };
        if let Some(b) = &new_body {
            if self.buffered {
                more.push(("content-length", b.len().to_string()));
            }
            self.body.clone_from(b);
        }
        tracing::debug!(request_id = %self.request_id, worker = %worker.name, %endpoint, matched_blocks = sel.matched_blocks, "endpoint picked");
        self.pick = Some(Pick {
            model: model.clone(),
            class: class.name.clone(),
            prediction: Prediction {
                request: guard.request,
                worker: sel.worker,
                predicted: sel.cached_tokens as u64,
                prompt_tokens: prep.prompt.tokens as u64,
                split: sel.prefill.is_some(),
            },
            worker_name: worker.name.clone(),
            guard: Some(guard),
            prefill_guard,
        });
        Ok(wire::routed(&endpoint, &more, self.buffered, new_body))
    }

    /// The workers the data plane allows: all, or those its subset hint names (by address
    /// and port, or by address alone when an entry gives no port; addresses compared as
    /// addresses, so `[::1]:80` and `::1` name the same engine).
    /// The conformance suite's selection header restricts them the same way, when honoured
    /// (`[epp] conformance_headers`): a worker must be named by every list given.
    fn eligible(&self) -> Result<Eligible, GatewayError> {
        let lists: Vec<Vec<Hint>> = [&self.subset, &self.test_selection]
            .into_iter()
            .flatten()
            .map(|l| l.iter().map(|s| Hint::parse(s)).collect())
            .collect();
        if lists.is_empty() {
            return Ok(Eligible::Any);
        }
        let ids: Vec<WorkerId> = self
            .gw
            .registry
            .all()
            .iter()
            .filter(|w| {
                wire::endpoint_of(&w.spec.url)
                    .is_some_and(|e| lists.iter().all(|hints| hints.iter().any(|h| h.names(&e))))
            })
            .map(|w| w.id)
            .collect();
        if ids.is_empty() {
            return Err(GatewayError::Api(ApiError::unavailable(
                "no_eligible_endpoint",
                "no worker the data plane's subset hint or the request's endpoint selection names is known here",
                1,
            )));
        }
        Ok(Eligible::only(ids))
    }

    /// Sends a request the picker does not route to a worker up (round robin over the
    /// subset allowed), unbooked, answering its headers; 503 when none is.
    fn pass_to_any(&mut self) -> Vec<ProcessingResponse> {
        let eligible = self.eligible().unwrap_or(Eligible::only([]));
        let up: Vec<_> = self
            .gw
            .registry
            .all()
            .into_iter()
            .filter(|w| w.is_up() && eligible.allows(w.id))
            .collect();
        let n = self.gw.bookings.next_request().0 as usize;
        let Some(w) = (!up.is_empty()).then(|| &up[n % up.len()]) else {
            return self.refuse(&ApiError::unavailable(
                "no_healthy_workers",
                "no healthy worker can take the request",
                1,
            ));
        };
        let Some(endpoint) = wire::endpoint_of(&w.spec.url) else {
            return self.refuse(&ApiError::new(
                ErrorKind::Internal,
                format!("worker {} has no endpoint in its URL", w.name),
            ));
        };
        self.decided = true;
        self.gw
            .metrics
            .epp_streams
            .with_label_values(&["other"])
            .inc();
        vec![wire::routed(
            &endpoint,
            &[(
                kvroute_fleet::headers::REQUEST_ID_HEADER,
                self.request_id.clone(),
            )],
            false,
            None,
        )]
    }

    fn refuse(&mut self, e: &ApiError) -> Vec<ProcessingResponse> {
        self.over = true;
        self.answer = Answer::Done;
        self.gw
            .metrics
            .epp_streams
            .with_label_values(&["refused"])
            .inc();
        vec![wire::immediate(e, &self.request_id)]
    }

    fn on_response_headers(&mut self, h: &HttpHeaders) -> Vec<ProcessingResponse> {
        let status = wire::header(h, ":status")
            .and_then(|s| s.parse::<u16>().ok())
            .and_then(|s| StatusCode::from_u16(s).ok())
            .unwrap_or(StatusCode::BAD_GATEWAY);
        let Some(pick) = &mut self.pick else {
            // Not routed here: nothing to watch.
            self.answer = Answer::Done;
            if h.end_of_stream {
                self.over = true;
            }
            return vec![wire::response_headers(&[])];
        };
        if let Some(mut g) = pick.prefill_guard.take() {
            g.first_token();
        }
        if status.is_server_error() {
            self.gw
                .metrics
                .upstream_errors
                .with_label_values(&[&pick.worker_name, "status_5xx"])
                .inc();
        }
        let stream = status.is_success()
            && wire::header(h, "content-type").is_some_and(|c| c.starts_with("text/event-stream"));
        self.answer = match (stream, pick.guard.take()) {
            (true, Some(guard)) => Answer::Stream {
                watch: Box::new(Watch::new(
                    self.gw.clone(),
                    guard,
                    (pick.model.clone(), pick.class.clone()),
                    self.started,
                    pick.prediction,
                )),
                readable: true,
            },
            (_, guard) => {
                pick.guard = guard;
                Answer::Whole {
                    status,
                    copy: Vec::new(),
                }
            }
        };
        let mut set = vec![
            (
                kvroute_fleet::headers::WORKER_HEADER,
                pick.worker_name.clone(),
            ),
            (
                kvroute_fleet::headers::PREDICTED_CACHED_HEADER,
                pick.prediction.predicted.to_string(),
            ),
            (
                kvroute_fleet::headers::REQUEST_ID_HEADER,
                self.request_id.clone(),
            ),
        ];
        if self.gw.config().epp.conformance_headers {
            // As the conformance suite's pickers answer when the data plane says nothing.
            let served = self.served.clone().unwrap_or_else(|| {
                "fail: missing destination endpoint served metadata".to_string()
            });
            set.push((wire::TEST_SERVED_HEADER, served));
        }
        let out = vec![wire::response_headers(&set)];
        if h.end_of_stream || self.no_response_body {
            self.end_answer();
        }
        out
    }

    /// A chunk of the answer went by.
    fn observe(&mut self, chunk: &[u8]) {
        let limit = MAX_WHOLE_COPY.min(self.gw.config().limits.max_response_bytes);
        match &mut self.answer {
            Answer::Stream { watch, readable } => {
                // A stream that turned out unreadable is passed on unwatched.
                if *readable {
                    *readable = watch.observe(chunk, |_| {});
                }
            }
            Answer::Whole { copy, .. } => {
                if copy.len() + chunk.len() <= limit {
                    copy.extend_from_slice(chunk);
                } else {
                    // Too large to read for its usage: counted without.
                    copy.clear();
                    copy.shrink_to_fit();
                }
            }
            Answer::Awaited | Answer::Done => {}
        }
    }

    /// The answer ended: counted, its booking released.
    fn end_answer(&mut self) {
        self.over = true;
        match std::mem::replace(&mut self.answer, Answer::Done) {
            Answer::Stream {
                mut watch,
                readable,
            } => {
                if readable {
                    watch.observe_end();
                }
                watch.end(StatusCode::OK);
            }
            Answer::Whole { status, copy } => self.finish_whole(status, &copy),
            Answer::Awaited | Answer::Done => {}
        }
        self.pick = None;
    }

    fn finish_whole(&mut self, status: StatusCode, copy: &[u8]) {
        let Some(pick) = &mut self.pick else {
            return;
        };
        let usage = serde_json::from_slice::<Peek>(copy)
            .ok()
            .and_then(|p| p.usage);
        finish(
            &self.gw,
            &pick.model,
            status,
            self.started,
            usage.as_ref(),
            Some(pick.prediction),
        );
        if let (Some(g), Some(u)) = (&mut pick.guard, &usage) {
            if status.is_success() {
                g.completed(u.completion_tokens);
            }
        }
        pick.guard = None;
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // The stream ended before the answer did: the client (or the proxy) gave up on it.
        // A watched stream counts itself; a whole answer or one never begun counts as 499.
        if let Answer::Awaited | Answer::Whole { .. } = self.answer {
            if self.pick.is_some() {
                let gone = StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST);
                self.finish_whole(gone, &[]);
            }
        }
    }
}

/// One entry of a subset hint: an address with or without a port (or, failing that, the
/// text as given).
enum Hint {
    Socket(std::net::SocketAddr),
    Ip(std::net::IpAddr),
    Text(String),
}

impl Hint {
    fn parse(s: &str) -> Self {
        let s = s.trim();
        if let Ok(a) = s.parse::<std::net::SocketAddr>() {
            return Self::Socket(a);
        }
        let bare = s.trim_start_matches('[').trim_end_matches(']');
        match bare.parse::<std::net::IpAddr>() {
            Ok(ip) => Self::Ip(ip),
            Err(_) => Self::Text(s.to_string()),
        }
    }

    /// Whether it names the engine at `endpoint` (`host:port`).
    fn names(&self, endpoint: &str) -> bool {
        match (self, endpoint.parse::<std::net::SocketAddr>()) {
            (Self::Socket(a), Ok(e)) => *a == e,
            (Self::Ip(ip), Ok(e)) => *ip == e.ip(),
            (Self::Text(t), _) => {
                t == endpoint || endpoint.rsplit_once(':').is_some_and(|(h, _)| h == t)
            }
            (_, Err(_)) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_name_engines_by_address() {
        let names = |hint: &str, endpoint: &str| Hint::parse(hint).names(endpoint);
        assert!(names("10.0.0.7:8000", "10.0.0.7:8000"));
        assert!(!names("10.0.0.7:8001", "10.0.0.7:8000"));
        assert!(names("10.0.0.7", "10.0.0.7:8000"));
        assert!(names("[fd00::7]:8000", "[fd00::7]:8000"));
        assert!(names("fd00::7", "[fd00::7]:8000"));
        assert!(names("[fd00:0::7]", "[fd00::7]:8000"));
        assert!(names("engine-0", "engine-0:8000"));
        assert!(!names("10.0.0.8", "10.0.0.7:8000"));
    }

    #[test]
    fn paths_with_a_prefix_are_still_inference_requests() {
        assert!(matches!(
            inference_endpoint("/v1/chat/completions"),
            Some(Endpoint::Chat)
        ));
        assert!(matches!(
            inference_endpoint("/llama/v1/chat/completions?x=1"),
            Some(Endpoint::Chat)
        ));
        assert!(matches!(
            inference_endpoint("/v1/completions"),
            Some(Endpoint::Completions)
        ));
        assert!(inference_endpoint("/v1/models").is_none());
        assert!(inference_endpoint("/v1/embeddings").is_none());
    }
}
