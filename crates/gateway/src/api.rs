//! The HTTP surface: the OpenAI routes, health and readiness, metrics, and the debug
//! endpoints (`/debug/workers`, `/debug/explain`, `/debug/reset`).

use crate::error::{error_response, GatewayError};
use crate::gateway::Gateway;
use crate::proxy::{forward, Call};
use crate::routing::flow::identify;
use crate::routing::prepare;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kvroute_core::RouteRequest;
use kvroute_fleet::headers::REQUEST_ID_HEADER;
use kvroute_protocol::openai::http::read_body;
use kvroute_protocol::openai::{parse_request, ApiError, Endpoint, ModelList};
use kvroute_runtime::{require, Access, AccessPolicy};
use std::sync::Arc;

/// The gateway's routes, each behind what it needs under `policy`: health, readiness,
/// liveness and metrics for anyone; the OpenAI API and the read-only debug views behind the
/// API keys; `/debug/reset` behind the admin key.
pub fn routes(gw: Arc<Gateway>, policy: &Arc<AccessPolicy>) -> Router {
    let open = Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/live", get(live))
        .route("/metrics", get(metrics));
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/debug/workers", get(debug_workers))
        .route("/debug/explain", post(debug_explain));
    let admin = Router::new().route("/debug/reset", post(debug_reset));
    open.merge(require(api, policy, Access::Api))
        .merge(require(admin, policy, Access::Admin))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(gw)
}

fn request_id(gw: &Gateway, headers: &HeaderMap) -> String {
    gw.bookings
        .request_id(headers.get(REQUEST_ID_HEADER).and_then(|v| v.to_str().ok()))
}

async fn chat(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    openai(gw, Endpoint::Chat, req).await
}

async fn completions(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    openai(gw, Endpoint::Completions, req).await
}

async fn openai(gw: Arc<Gateway>, endpoint: Endpoint, req: Request) -> Response {
    let started = gw.now();
    let headers = req.headers().clone();
    let id = request_id(&gw, &headers);
    let result = async {
        let unknown = |e: ApiError| (GatewayError::Api(e), String::new());
        let body = read_body(
            &headers,
            req.into_body(),
            gw.config().limits.max_body_bytes,
            gw.body_read_timeout(),
        )
        .await
        .map_err(unknown)?;
        let (_, view) = parse_request(endpoint, &body, gw.config().limits.max_prompt_tokens)
            .map_err(unknown)?;
        if !gw.models.serves(&view.model) {
            // Counted under one label: a client's names must not grow the metric's series.
            return Err((
                ApiError::model_not_found(&view.model).into(),
                "unknown".into(),
            ));
        }
        let session = headers.get("x-session-id").and_then(|v| v.to_str().ok());
        let identity = identify(&gw.flows, &gw.config().flow_headers, &headers, &view)
            .map_err(|e| (e.into(), view.model.clone()))?;
        let mut prep = prepare(&gw, &view, session)
            .await
            .map_err(|e| (e, view.model.clone()))?;
        prep.identity = identity;
        let permit = crate::routing::enter(&gw, &prep).map_err(|e| (e, view.model.clone()))?;
        let model = view.model.clone();
        let call = Call {
            view,
            body,
            request_id: id.clone(),
            started,
            explain: crate::explanation::asked(&headers),
            authorization: headers.get(header::AUTHORIZATION).cloned(),
            migrate: gw.config().upstream.migration_limit > 0 && !migration_off(&headers),
            engine_priority: gw.flows.class(identity.flow.class).engine_priority,
        };
        forward(&gw, Arc::new(call), Arc::new(prep), permit)
            .await
            .map_err(|e| (e, model))
    }
    .await;
    match result {
        Ok(resp) => resp,
        Err((e, model)) => {
            let api = e.to_api();
            gw.metrics
                .requests
                .with_label_values(&[model.as_str(), &api.status().to_string()])
                .inc();
            tracing::info!(request_id = %id, status = api.status(), error = %api.message, "request refused");
            error_response(&api, &id)
        }
    }
}

/// Whether the request opted out of mid-stream migration (`x-kvroute-migrate: off`, `false`
/// or `0`).
fn migration_off(headers: &HeaderMap) -> bool {
    headers
        .get(kvroute_fleet::headers::MIGRATE_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "off" | "false" | "0" | "no"
            )
        })
}

async fn models(State(gw): State<Arc<Gateway>>) -> Response {
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (models, adapters) = (gw.models.names(), gw.models.adapters());
    let base = (models.len() == 1).then(|| models[0].as_str());
    Json(ModelList::with_adapters(
        &models, base, &adapters, created, "kvroute",
    ))
    .into_response()
}

async fn health(State(gw): State<Arc<Gateway>>) -> Response {
    let up = gw.registry.up_count();
    let body = serde_json::json!({
        "status": if up > 0 { "ok" } else { "no_healthy_workers" },
        "workers_up": up,
        "workers": gw.registry.len(),
    });
    let status = if up > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// Readiness: the gateway serves (200), its engines reported apart; 503 while none is up
/// only when `health.ready_without_engines` is off.
async fn ready(State(gw): State<Arc<Gateway>>) -> Response {
    let up = gw.registry.up_count();
    let ready = up > 0 || gw.config().health.ready_without_engines;
    let body = serde_json::json!({
        "ready": ready,
        "engines": {"up": up, "total": gw.registry.len()},
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

async fn live() -> Response {
    Json(serde_json::json!({"status": "ok"})).into_response()
}

async fn metrics(State(gw): State<Arc<Gateway>>) -> Response {
    gw.workers.refresh_gauges();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        gw.metrics.render(),
    )
        .into_response()
}

async fn debug_workers(State(gw): State<Arc<Gateway>>) -> Response {
    let reports = gw.registry.reports();
    let (list, pools): (Vec<serde_json::Value>, serde_json::Value) = gw.table.read(|r| {
        // Each role's pool: its workers and their booked load together.
        let pools: serde_json::Map<String, serde_json::Value> = kvroute_core::WorkerRole::ALL
            .into_iter()
            .map(|role| {
                let loads: Vec<_> = reports
                    .iter()
                    .map(|w| kvroute_core::WorkerId(w.id))
                    .filter(|&id| r.role(id) == role)
                    .map(|id| r.ledger().load(id).unwrap_or_default())
                    .collect();
                let pool = serde_json::json!({
                    "workers": loads.len(),
                    "inflight": loads.iter().map(|l| u64::from(l.inflight)).sum::<u64>(),
                    "prefill_tokens": loads.iter().map(|l| l.prefill_tokens).sum::<u64>(),
                    "active_blocks": loads.iter().map(|l| l.active_blocks).sum::<u64>(),
                });
                (role.as_str().to_string(), pool)
            })
            .collect();
        let list = reports
            .into_iter()
            .map(|w| {
                let id = kvroute_core::WorkerId(w.id);
                let load = r.ledger().load(id);
                let blocks = r.cached_blocks(id);
                let offloaded = r.offloaded();
                serde_json::json!({
                    "worker": w,
                    "role": r.role(id),
                    "load": load,
                    "index_blocks": blocks,
                    // Tracked approximately: the blocks its guesses are kept to (learned
                    // from the engine's answers, else `router.approx.max_blocks_per_worker`).
                    "approx_capacity_blocks": r.approx_capacity(id),
                    "index_evicted_blocks": kvroute_fleet::workers::evicted_blocks(r, id),
                    "offloaded_blocks": {
                        "host": offloaded.block_count(id, kvroute_core::Tier::Host),
                        "disk": offloaded.block_count(id, kvroute_core::Tier::Disk),
                    },
                    "prefill": r.ledger().prefill_estimate(id),
                    "capacity": r.ledger().capacity(id),
                })
            })
            .collect();
        (list, serde_json::Value::Object(pools))
    });
    Json(serde_json::json!({ "policy": gw.policy, "workers": list, "pools": pools }))
        .into_response()
}

/// Explains where a request would go: the body is a chat or completions request (chat when
/// it has `messages`).
async fn debug_explain(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    let result = async {
        let limit = gw.config().limits.max_body_bytes;
        let (parts, body) = req.into_parts();
        let body = read_body(&parts.headers, body, limit, gw.body_read_timeout())
            .await
            .map_err(GatewayError::from)?;
        let endpoint = if serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .is_some_and(|v| v.get("messages").is_some())
        {
            Endpoint::Chat
        } else {
            Endpoint::Completions
        };
        let (_, view) = parse_request(endpoint, &body, gw.config().limits.max_prompt_tokens)?;
        let prep = prepare(&gw, &view, None).await?;
        // The queue's size first, its lock let go: the router's is never held while the
        // queue's is taken (admission takes them the other way round).
        let queue = gw.queue_state();
        let explanation = gw.table.read(|r| {
            r.explain(&RouteRequest {
                prompt: &prep.prompt,
                session: prep.session,
                queue,
                eligible: &kvroute_core::ANY_WORKER,
                flow: Default::default(),
            })
        });
        Ok::<_, GatewayError>(explanation)
    }
    .await;
    match result {
        Ok(e) => Json(crate::explanation::debug_view(&gw, &e)).into_response(),
        Err(e) => error_response(&e.to_api(), ""),
    }
}

async fn debug_reset(State(gw): State<Arc<Gateway>>) -> Response {
    gw.workers.reset_index();
    tracing::info!("index reset by request");
    Json(serde_json::json!({"status": "ok"})).into_response()
}

async fn not_found(req: Request<Body>) -> Response {
    error_response(
        &ApiError::no_route(req.method().as_str(), req.uri().path()),
        "",
    )
}

async fn method_not_allowed(req: Request<Body>) -> Response {
    error_response(
        &ApiError::method_not_allowed(req.method().as_str(), req.uri().path()),
        "",
    )
}
