//! The HTTP server: routes, shared state, the `x-request-id` middleware, OpenAI error
//! answers, body reading under a size limit, and the small endpoints (`/v1/models`,
//! `/health`, `/metrics`, `/admin/reset`). Generation lives in [`crate::generate`].

use crate::driver::Command;
use crate::ids::IdGen;
use crate::metrics::Metrics;
use crate::text::OutputText;
use crate::WorkerConfig;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use kvroute_preprocess::Preprocessor;
use kvroute_protocol::openai::{ApiError, ErrorKind, ModelList};
use kvroute_runtime::{require, Access, AccessPolicy};
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// The header echoed (or generated) on every answer.
pub(crate) const REQUEST_ID: &str = "x-request-id";

/// Longest incoming `x-request-id` echoed; longer ones are replaced.
const MAX_REQUEST_ID: usize = 256;

/// What every handler shares.
pub(crate) struct Shared {
    pub(crate) cfg: WorkerConfig,
    pub(crate) pre: Preprocessor,
    pub(crate) text: OutputText,
    pub(crate) commands: mpsc::Sender<Command>,
    pub(crate) ids: IdGen,
    pub(crate) metrics: Metrics,
    /// Unix seconds at start (`created` of the model card).
    pub(crate) started: u64,
    /// The engine's clock (a decode leg waits its KV's transfer on it).
    pub(crate) clock: kvroute_runtime::Clock,
    /// SGLang's bootstrap rooms this worker handed over (as a prefill worker).
    pub(crate) rooms: Arc<crate::kv_transfer::Rooms>,
    /// The client a decode leg asks its prefill worker with.
    pub(crate) http: reqwest::Client,
    /// The KV event hub (to name the namespaces requests use).
    pub(crate) hub: Arc<crate::events::EventHub>,
}

/// The state handlers get.
pub(crate) type AppState = Arc<Shared>;

/// The request's `x-request-id`: the client's, or one made up.
#[derive(Clone, Debug)]
pub(crate) struct RequestTag(pub(crate) HeaderValue);

/// The routes: health and metrics for anyone, the OpenAI API and the pull API of KV events
/// behind the API key (when set), `/admin/*` behind the admin key (or a loopback listener).
pub(crate) fn router(state: AppState, loopback: bool) -> Router {
    let policy = Arc::new(AccessPolicy {
        api_keys: state.cfg.api_key.iter().map(|k| k.0.clone()).collect(),
        admin_key: state.cfg.admin_key.as_ref().map(|k| k.0.clone()),
        allowed_origins: Vec::new(),
        loopback,
    });
    let open = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/kvroute/bootstrap/{room}", get(bootstrap_room));
    let api = Router::new()
        .route("/v1/chat/completions", post(crate::generate::chat))
        .route("/v1/completions", post(crate::generate::completions))
        .route("/v1/models", get(models))
        .route("/kv_cache_events", post(kv_cache_events));
    let admin = Router::new()
        .route("/admin/reset", post(reset))
        .route("/admin/faults", post(faults));
    open.merge(require(api, &policy, Access::Api))
        .merge(require(admin, &policy, Access::Admin))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), request_id))
        .with_state(state)
}

/// SGLang's bootstrap server, as far as a simulated decode worker asks it: 200 once `room`
/// was handed over, 404 before.
async fn bootstrap_room(State(s): State<AppState>, Path(room): Path<u64>) -> StatusCode {
    if s.rooms.is_ready(room) {
        StatusCode::OK
    } else {
        StatusCode::NOT_FOUND
    }
}

/// Echoes the client's `x-request-id` (a short printable one) or sets a new one, and makes
/// it available to handlers as [`RequestTag`].
async fn request_id(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(REQUEST_ID)
        .filter(|v| v.len() <= MAX_REQUEST_ID && v.to_str().is_ok() && !v.is_empty())
        .cloned();
    let tag = given.unwrap_or_else(|| {
        let (_, hex) = s.ids.next();
        HeaderValue::from_str(&hex).unwrap_or(HeaderValue::from_static("unknown"))
    });
    req.extensions_mut().insert(RequestTag(tag.clone()));
    let mut resp = next.run(req).await;
    resp.headers_mut().insert(REQUEST_ID, tag);
    resp
}

pub(crate) use kvroute_protocol::openai::http::{error_response, read_body};

/// A JSON answer.
pub(crate) fn json_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Unix seconds now.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn models(State(s): State<AppState>) -> Response {
    let list = ModelList::with_adapters(
        std::slice::from_ref(&s.cfg.model),
        Some(&s.cfg.model),
        &s.cfg.lora_adapters,
        s.started,
        "kvroute",
    );
    match serde_json::to_string(&list) {
        Ok(body) => json_response(StatusCode::OK, body),
        Err(e) => error_response(&ApiError::new(ErrorKind::Internal, e.to_string())),
    }
}

async fn health() -> Response {
    json_response(StatusCode::OK, r#"{"status":"ok"}"#.to_string())
}

async fn metrics(State(s): State<AppState>) -> Response {
    match s.metrics.render() {
        Ok(text) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
            text,
        )
            .into_response(),
        Err(_) => error_response(&ApiError::new(
            ErrorKind::Internal,
            "could not encode the metrics",
        )),
    }
}

/// The driver is gone (shutting down).
pub(crate) fn driver_gone() -> ApiError {
    ApiError::unavailable("shutting_down", "the worker is shutting down", 1)
}

async fn reset(State(s): State<AppState>) -> Response {
    let (done, wait) = oneshot::channel();
    if s.commands.send(Command::Reset { done }).await.is_err() || wait.await.is_err() {
        return error_response(&driver_gone());
    }
    json_response(StatusCode::OK, r#"{"status":"reset"}"#.to_string())
}

/// Faults to inject, for tests of the gateway's repair paths.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Faults {
    /// Publish batches live without their events (same sequence numbers, so no gap shows),
    /// while the replay service keeps them whole: events lost without a gap.
    blank_live: bool,
}

async fn faults(State(s): State<AppState>, body: axum::body::Bytes) -> Response {
    match serde_json::from_slice::<Faults>(&body) {
        Ok(f) => {
            s.hub.set_blank_live(f.blank_live);
            tracing::warn!(worker = %s.cfg.worker_name, blank_live = f.blank_live, "fault injection changed");
            json_response(StatusCode::OK, r#"{"status":"ok"}"#.to_string())
        }
        Err(e) => error_response(&ApiError::new(
            ErrorKind::InvalidRequest,
            format!("expected {{\"blank_live\": bool}}: {e}"),
        )),
    }
}

/// TensorRT-LLM's pull API: the queued KV events, each returned once.
async fn kv_cache_events(State(s): State<AppState>, req: Request) -> Response {
    match s.hub.pull() {
        Some(events) => json_response(StatusCode::OK, Value::Array(events).to_string()),
        None => not_found(req).await,
    }
}

async fn not_found(req: Request) -> Response {
    error_response(&ApiError::no_route(req.method().as_str(), req.uri().path()))
}

async fn method_not_allowed(req: Request) -> Response {
    error_response(&ApiError::method_not_allowed(
        req.method().as_str(),
        req.uri().path(),
    ))
}
