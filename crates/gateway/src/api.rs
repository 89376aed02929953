//! The HTTP surface: the OpenAI routes, health and readiness, metrics, and the debug
//! endpoints (`/debug/workers`, `/debug/explain`, `/debug/reset`).

use crate::error::{error_response, GatewayError};
use crate::gateway::Gateway;
use crate::pools::Pools;
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
pub fn routes(pools: Arc<Pools>, policy: &Arc<AccessPolicy>) -> Router {
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
        .with_state(pools)
}

fn request_id(gw: &Gateway, headers: &HeaderMap) -> String {
    gw.bookings
        .request_id(headers.get(REQUEST_ID_HEADER).and_then(|v| v.to_str().ok()))
}

async fn chat(State(pools): State<Arc<Pools>>, req: Request) -> Response {
    openai(pools, Endpoint::Chat, req).await
}

async fn completions(State(pools): State<Arc<Pools>>, req: Request) -> Response {
    openai(pools, Endpoint::Completions, req).await
}

/// A request read and checked, its pool found by its `model` (the shared limits are the
/// first pool's: every pool has the same), then served by that pool.
async fn openai(pools: Arc<Pools>, endpoint: Endpoint, req: Request) -> Response {
    let front = pools.first();
    let started = front.now();
    let headers = req.headers().clone();
    let id = request_id(front, &headers);
    let mut gw = front.clone();
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
        let Some(pool) = pools.for_model(&view.model) else {
            // Counted under one label: a client's names must not grow the metric's series.
            return Err((
                ApiError::model_not_found(&view.model).into(),
                "unknown".into(),
            ));
        };
        gw = pool.clone();
        let session = headers.get("x-session-id").and_then(|v| v.to_str().ok());
        let (flows, generation) = gw.flows_at();
        let mut identity = identify(&flows, &gw.config().flow_headers, &headers, &view)
            .map_err(|e| (e.into(), view.model.clone()))?;
        identity.generation = generation;
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
            engine_priority: flows.class(identity.flow.class).engine_priority,
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

async fn models(State(pools): State<Arc<Pools>>) -> Response {
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut list: Option<ModelList> = None;
    for (_, gw) in pools.all() {
        let (models, adapters) = (gw.models.names(), gw.models.adapters());
        let base = (models.len() == 1).then(|| models[0].as_str());
        let pool = ModelList::with_adapters(&models, base, &adapters, created, "kvroute");
        match &mut list {
            Some(l) => l.data.extend(pool.data),
            None => list = Some(pool),
        }
    }
    Json(list).into_response()
}

/// Each pool's engines up and known, `(name, up, total)`.
fn engines(pools: &Pools) -> Vec<(&str, usize, usize)> {
    pools
        .all()
        .map(|(n, gw)| (n, gw.registry.up_count(), gw.registry.len()))
        .collect()
}

/// Each pool's engines, when several are served: `{"<pool>": {"up": .., "total": ..}}`.
fn by_pool(pools: &Pools, engines: &[(&str, usize, usize)]) -> Option<serde_json::Value> {
    pools.labelled().then(|| {
        engines
            .iter()
            .map(|(n, up, total)| (n.to_string(), serde_json::json!({"up": up, "total": total})))
            .collect::<serde_json::Map<_, _>>()
            .into()
    })
}

/// Healthy while some engine of every pool is up.
async fn health(State(pools): State<Arc<Pools>>) -> Response {
    let engines = engines(&pools);
    let healthy = engines.iter().all(|(_, up, _)| *up > 0);
    let mut body = serde_json::json!({
        "status": if healthy { "ok" } else { "no_healthy_workers" },
        "workers_up": engines.iter().map(|e| e.1).sum::<usize>(),
        "workers": engines.iter().map(|e| e.2).sum::<usize>(),
    });
    if let Some(p) = by_pool(&pools, &engines) {
        body["pools"] = p;
    }
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// Readiness: the gateway serves (200), its engines reported apart; 503 while a pool has
/// none up only when `health.ready_without_engines` is off.
async fn ready(State(pools): State<Arc<Pools>>) -> Response {
    let engines = engines(&pools);
    let ready = engines.iter().all(|(_, up, _)| *up > 0)
        || pools.first().config().health.ready_without_engines;
    let mut body = serde_json::json!({
        "ready": ready,
        "engines": {
            "up": engines.iter().map(|e| e.1).sum::<usize>(),
            "total": engines.iter().map(|e| e.2).sum::<usize>(),
        },
    });
    if let Some(p) = by_pool(&pools, &engines) {
        body["pools"] = p;
    }
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

async fn metrics(State(pools): State<Arc<Pools>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        pools.render_metrics(),
    )
        .into_response()
}

/// The `model` a debug view asks for (`?model=`: a pool's name or a model it serves).
#[derive(serde::Deserialize)]
struct Which {
    model: Option<String>,
}

/// A 404 for a debug view's `?model=` that names no pool, listing the pools.
fn no_pool(pools: &Pools, which: &Which) -> Response {
    let model = which.model.as_deref().unwrap_or_default();
    let mut e = ApiError::model_not_found(model);
    e.message = format!("{} (pools: {})", e.message, pools.names().join(", "));
    error_response(&e, "")
}

async fn debug_workers(
    State(pools): State<Arc<Pools>>,
    axum::extract::Query(which): axum::extract::Query<Which>,
) -> Response {
    let Some(gw) = pools.select(which.model.as_deref()).cloned() else {
        return no_pool(&pools, &which);
    };
    let reports = gw.registry.reports();
    let (list, roles): (Vec<serde_json::Value>, serde_json::Value) = gw.table.read(|r| {
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
    let model = pools
        .all()
        .find(|(_, g)| Arc::ptr_eq(g, &gw))
        .map(|(n, _)| n.to_string());
    Json(
        serde_json::json!({ "policy": gw.policy, "model": model, "workers": list, "pools": roles }),
    )
    .into_response()
}

/// Explains where a request would go: the body is a chat or completions request (chat when
/// it has `messages`).
async fn debug_explain(State(pools): State<Arc<Pools>>, req: Request) -> Response {
    let mut gw = pools.first().clone();
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
        gw = match pools.for_model(&view.model) {
            Some(g) => g.clone(),
            None => return Err(ApiError::model_not_found(&view.model).into()),
        };
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

/// Forgets the index of the pool asked for (`?model=`), or of every pool.
async fn debug_reset(
    State(pools): State<Arc<Pools>>,
    axum::extract::Query(which): axum::extract::Query<Which>,
) -> Response {
    if which.model.is_none() {
        for (_, gw) in pools.all() {
            gw.workers.reset_index();
        }
    } else {
        match pools.select(which.model.as_deref()) {
            Some(gw) => gw.workers.reset_index(),
            None => return no_pool(&pools, &which),
        }
    }
    tracing::info!(model = ?which.model, "index reset by request");
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
