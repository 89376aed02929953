//! `kvroute relay`'s HTTP port, for Kubernetes and Prometheus: `/live` (the process
//! answers), `/ready` (the engine's publisher connected and NATS up: 200, else 503 naming
//! which is not), `/metrics` (Prometheus text: both as gauges, items published and publishes
//! tried again, labelled with the worker).

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use kvroute_plane::RelayStatus;
use prometheus::{Encoder, IntCounter, IntGauge, Opts, Registry, TextEncoder};
use std::sync::Arc;
use tokio::sync::watch;

/// What the probes read.
#[derive(Clone)]
pub(super) struct Probes {
    /// The relay's status.
    pub status: Arc<RelayStatus>,
    /// True while NATS is connected.
    pub nats_up: watch::Receiver<bool>,
    /// The worker relayed.
    pub worker: String,
}

/// The probes' routes.
pub(super) fn app(p: Probes) -> Router {
    Router::new()
        .route("/live", get(|| async { "ok" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(p)
}

fn state(up: bool) -> &'static str {
    if up {
        "connected"
    } else {
        "disconnected"
    }
}

async fn ready(State(p): State<Probes>) -> impl IntoResponse {
    let (engine, nats) = (p.status.engine_connected(), *p.nats_up.borrow());
    let body = serde_json::json!({
        "ready": engine && nats,
        "worker": p.worker,
        "engine": state(engine),
        "nats": state(nats),
    });
    let code = if engine && nats {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body))
}

async fn metrics(State(p): State<Probes>) -> impl IntoResponse {
    match render(&p) {
        Ok(text) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            text,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            e.to_string(),
        ),
    }
}

/// The metrics now, in Prometheus' text format.
fn render(p: &Probes) -> Result<String, prometheus::Error> {
    let registry = Registry::new();
    let opts = |name: &str, help: &str| Opts::new(name, help).const_label("worker", &p.worker);
    let engine = IntGauge::with_opts(opts(
        "kvroute_relay_engine_connected",
        "1 while the engine's KV event publisher is connected.",
    ))?;
    engine.set(i64::from(p.status.engine_connected()));
    let nats = IntGauge::with_opts(opts(
        "kvroute_relay_nats_connected",
        "1 while the NATS event plane is connected.",
    ))?;
    nats.set(i64::from(*p.nats_up.borrow()));
    let published = IntCounter::with_opts(opts(
        "kvroute_relay_published_total",
        "Engine feed items published to the plane and acknowledged.",
    ))?;
    published.inc_by(p.status.published());
    let retries = IntCounter::with_opts(opts(
        "kvroute_relay_publish_retries_total",
        "Publishes tried again (not acknowledged at first).",
    ))?;
    retries.inc_by(p.status.publish_retries());
    registry.register(Box::new(engine))?;
    registry.register(Box::new(nats))?;
    registry.register(Box::new(published))?;
    registry.register(Box::new(retries))?;
    let mut out = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}
