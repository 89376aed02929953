//! The control API of a [`Service`], for the dashboard and scripts:
//!
//! | route | what |
//! |---|---|
//! | `GET /api/status` | the latest [`LiveStats`] |
//! | `POST /api/start` | starts the load (409 when running or still stopping) |
//! | `POST /api/stop` | stops it, cutting turns in flight (409 when not running) |
//! | `POST /api/concurrency` | `{"concurrency": n}`: applied after the debounce time (202) |
//! | `POST /api/model` | `{"model": "name"}`: the model the load asks for from the next start (one every arm's target lists; 409 while running or stopping); the fleet views follow it |
//! | `GET /api/ws` | WebSocket: a [`LiveStats`] JSON text at once, then at every update (at most [`MAX_WEBSOCKETS`] at once: `503` past it) |
//! | `GET /api/conversations?limit=N&arm=A&followup=1` | the newest conversations (default 100, at most 1000) of arm `A` (default: the first that is not the baseline); `followup=1`: only those with a completed follow-up turn |
//! | `GET /api/conversations/{id}?arm=A` | one conversation with its transcript (404 if unknown) |
//! | `GET /api/config` | the dashboard's settings: SLO objectives, slider range, baselines, the arms |
//! | `GET /api/fleet` | per arm, the routing policy and the workers behind its target |
//! | `GET /api/levels` | what every arm measured at each concurrency level it held |
//! | `GET /metrics` | Prometheus text (`loadgen_ttft_all_seconds`, ...) |
//!
//! Errors are `{"error": {"message", "code"}}` with the status mapped in one place. The
//! control calls need the admin key (`Authorization: Bearer`) when one is set, or else a
//! loopback listener; no route answers another site's page (`Origin`): 401 / 403.

use crate::conversations::ConversationSummary;
use crate::service::{ArmConfig, LevelPoint, LiveStats, Service, ServiceError};
use crate::LoadKind;
use crate::{DashboardConfig, Fleet};
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kvroute_runtime::{require, Access, AccessPolicy};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// The most conversations one list answer holds.
const MAX_LIST: usize = 1000;

/// The most WebSocket clients served at once (an upgraded connection no longer counts
/// against the server's connection cap).
pub const MAX_WEBSOCKETS: usize = 256;

/// How long one update may take to reach a client before its socket is closed.
const WS_SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// `GET /api/config`: the dashboard's settings, the arms and what the load is.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct ConfigAnswer {
    /// Objectives, slider, baseline files.
    pub dashboard: DashboardConfig,
    /// The arms, in order.
    pub arms: Vec<ArmConfig>,
    /// What the requests are.
    pub workload: LoadKind,
    /// The open loop's rate, if the load is open.
    pub rate: Option<f64>,
}

/// One arm's fleet in `GET /api/fleet`.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct ArmFleet {
    /// The arm's name.
    pub arm: String,
    /// Whether it is the baseline.
    pub baseline: bool,
    /// The endpoint it drives.
    pub target: String,
    /// The fleet behind it.
    pub fleet: Fleet,
}

/// `GET /api/fleet`: the fleet behind each arm.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct FleetsAnswer {
    /// One per arm, in order.
    pub arms: Vec<ArmFleet>,
}

/// `GET /api/conversations`: the newest conversations first.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct ConversationsAnswer {
    /// At most the limit asked for.
    pub conversations: Vec<ConversationSummary>,
}

/// `GET /api/levels`: what every arm measured at each level it held.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct LevelsAnswer {
    /// Ascending concurrency.
    pub levels: Vec<LevelPoint>,
}

impl IntoResponse for ServiceError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            ServiceError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ServiceError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ServiceError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ServiceError::Busy(_) => (StatusCode::SERVICE_UNAVAILABLE, "busy"),
            ServiceError::Load(_) => (StatusCode::INTERNAL_SERVER_ERROR, "load_failed"),
        };
        let body = serde_json::json!({"error": {"message": self.to_string(), "code": code}});
        (status, Json(body)).into_response()
    }
}

/// The routes above, on `service`: the control calls (`POST`) need the admin key under
/// `policy` (or a loopback listener without one), the rest refuses other sites' pages.
pub fn router(service: Service, policy: &Arc<AccessPolicy>) -> Router {
    let sockets = Arc::new(Semaphore::new(MAX_WEBSOCKETS));
    let control = Router::new()
        .route("/api/start", post(start))
        .route("/api/stop", post(stop))
        .route("/api/concurrency", post(concurrency))
        .route("/api/model", post(model));
    let views = Router::new()
        .route("/api/status", get(status))
        .route(
            "/api/ws",
            get(move |state, upgrade| ws(state, upgrade, sockets.clone())),
        )
        .route("/api/conversations", get(conversations))
        .route("/api/conversations/{id}", get(conversation))
        .route("/api/config", get(config))
        .route("/api/fleet", get(fleet))
        .route("/api/levels", get(levels))
        .route("/metrics", get(metrics));
    require(control, policy, Access::Admin)
        .merge(require(views, policy, Access::Api))
        .with_state(service)
}

/// The statistics (or the error) as the answer, with `status` on success.
fn answer(status: StatusCode, r: Result<Arc<LiveStats>, ServiceError>) -> Response {
    match r {
        Ok(stats) => (status, Json(&*stats)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn status(State(s): State<Service>) -> Response {
    answer(StatusCode::OK, Ok(s.stats()))
}

async fn start(State(s): State<Service>) -> Response {
    answer(StatusCode::OK, s.start())
}

async fn stop(State(s): State<Service>) -> Response {
    answer(StatusCode::OK, s.stop())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetConcurrency {
    concurrency: usize,
}

async fn concurrency(State(s): State<Service>, body: axum::body::Bytes) -> Response {
    let parsed: Result<SetConcurrency, _> = serde_json::from_slice(&body);
    let result = match parsed {
        Ok(b) => s.set_concurrency(b.concurrency),
        Err(e) => Err(ServiceError::BadRequest(format!(
            "expected {{\"concurrency\": n}}: {e}"
        ))),
    };
    answer(StatusCode::ACCEPTED, result)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetModel {
    model: String,
}

async fn model(State(s): State<Service>, body: axum::body::Bytes) -> Response {
    let result = match serde_json::from_slice::<SetModel>(&body) {
        Ok(b) => s.set_model(&b.model).await,
        Err(e) => Err(ServiceError::BadRequest(format!(
            "expected {{\"model\": \"name\"}}: {e}"
        ))),
    };
    answer(StatusCode::OK, result)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    limit: Option<usize>,
    arm: Option<String>,
    /// Only conversations with a completed follow-up turn.
    #[serde(default)]
    followup: Option<u8>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ArmQuery {
    arm: Option<String>,
}

async fn conversations(State(s): State<Service>, Query(q): Query<ListQuery>) -> Response {
    let limit = q.limit.unwrap_or(100).min(MAX_LIST);
    let observer = match s.observer(q.arm.as_deref()) {
        Ok(o) => o,
        Err(e) => return e.into_response(),
    };
    let list = if q.followup.unwrap_or(0) > 0 {
        observer.conversations_with_followup(limit)
    } else {
        observer.conversations(limit)
    };
    Json(ConversationsAnswer {
        conversations: list,
    })
    .into_response()
}

async fn conversation(
    State(s): State<Service>,
    Path(id): Path<String>,
    Query(q): Query<ArmQuery>,
) -> Response {
    let Ok(n) = id.parse::<u64>() else {
        return ServiceError::BadRequest(format!("{id:?} is not a conversation number"))
            .into_response();
    };
    let observer = match s.observer(q.arm.as_deref()) {
        Ok(o) => o,
        Err(e) => return e.into_response(),
    };
    match observer.conversation(n) {
        Some(c) => Json(c).into_response(),
        None => ServiceError::NotFound(format!("no conversation {n} (it may have been dropped)"))
            .into_response(),
    }
}

async fn config(State(s): State<Service>) -> Response {
    let st = s.stats();
    Json(ConfigAnswer {
        dashboard: s.dashboard().clone(),
        arms: s.arms(),
        workload: st.workload,
        rate: st.rate,
    })
    .into_response()
}

async fn fleet(State(s): State<Service>) -> Response {
    let arms = s
        .fleets()
        .await
        .into_iter()
        .map(|(arm, fleet)| ArmFleet {
            arm: arm.name,
            baseline: arm.baseline,
            target: arm.target,
            fleet,
        })
        .collect();
    Json(FleetsAnswer { arms }).into_response()
}

async fn levels(State(s): State<Service>) -> Response {
    Json(LevelsAnswer { levels: s.levels() }).into_response()
}

async fn metrics(State(s): State<Service>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics(),
    )
        .into_response()
}

async fn ws(
    State(s): State<Service>,
    upgrade: WebSocketUpgrade,
    sockets: Arc<Semaphore>,
) -> Response {
    let Ok(permit) = sockets.try_acquire_owned() else {
        return ServiceError::Busy(format!(
            "{MAX_WEBSOCKETS} WebSocket clients are connected already: retry later"
        ))
        .into_response();
    };
    upgrade
        .max_message_size(64 << 10)
        .on_upgrade(move |socket| async move {
            stream(s, socket).await;
            drop(permit);
        })
}

/// Sends the statistics at once, then at every update, until the client goes; only the
/// latest update waits for a slow client (nothing piles up).
async fn stream(s: Service, mut socket: WebSocket) {
    let mut updates = s.subscribe();
    loop {
        let text = {
            let stats = updates.borrow_and_update().clone();
            match serde_json::to_string(&*stats) {
                Ok(t) => t,
                Err(_) => return,
            }
        };
        // A client that stops reading is dropped rather than held forever.
        match tokio::time::timeout(WS_SEND_TIMEOUT, socket.send(Message::Text(text.into()))).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return,
        }
        tokio::select! {
            changed = updates.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            incoming = socket.recv() => match incoming {
                // The client says nothing we act on; pings are answered by the library.
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {
                    // Wait for the next update rather than resending the same figures.
                    if updates.changed().await.is_err() {
                        return;
                    }
                }
            },
        }
    }
}
