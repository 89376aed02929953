//! The dashboard's web UI (built from `ui/` by Vite into `ui/dist`), embedded in the binary
//! and served beside the load generator's control API: files by path, any other path gets
//! `index.html` (the single-page app routes itself), and a binary built without the UI
//! answers a page saying how to build it instead of a 404.

use axum::body::Body;
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use rust_embed::RustEmbed;

#[derive(RustEmbed)]
#[folder = "../../ui/dist"]
#[allow_missing = true]
struct Assets;

/// The page served when the binary was built without the UI.
const NOT_BUILT: &str = "<!doctype html><html><head><meta charset=\"utf-8\"><title>kvroute dashboard</title></head>\
<body style=\"font-family: sans-serif; max-width: 40em; margin: 4em auto\">\
<h1>The dashboard was not built into this binary</h1>\
<p>Build the UI, then the binary again:</p>\
<pre>cd ui &amp;&amp; npm ci &amp;&amp; npm run build &amp;&amp; cd .. &amp;&amp; cargo build --release -p kvroute</pre>\
<p>The load generator's API works without it: <a href=\"/api/status\">/api/status</a>, \
<a href=\"/api/conversations\">/api/conversations</a>, <a href=\"/metrics\">/metrics</a>.</p>\
</body></html>";

/// Whether the UI is in this binary.
pub fn built() -> bool {
    Assets::get("index.html").is_some()
}

fn file(path: &str) -> Option<Response> {
    let f = Assets::get(path)?;
    let cache = if path.starts_with("assets/") {
        // Vite names these by content hash.
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    Some(
        (
            [
                (header::CONTENT_TYPE, f.metadata.mimetype().to_string()),
                (header::CACHE_CONTROL, cache.to_string()),
            ],
            Body::from(f.data.into_owned()),
        )
            .into_response(),
    )
}

/// Serves the UI for any path the API does not take.
pub async fn serve(uri: Uri) -> Response {
    let path = uri.path().trim_start_matches('/');
    if path.starts_with("api/") {
        return (StatusCode::NOT_FOUND, "no such API route").into_response();
    }
    if let Some(r) = (!path.is_empty()).then(|| file(path)).flatten() {
        return r;
    }
    // A missing asset is a 404; any other path is a page of the app.
    if path.starts_with("assets/") {
        return StatusCode::NOT_FOUND.into_response();
    }
    file("index.html").unwrap_or_else(|| {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            NOT_BUILT,
        )
            .into_response()
    })
}

/// The control API of `service` with the UI behind it, for a listener on `addr`: the
/// control calls need `KVROUTE_ADMIN_KEY` when it is set, else a loopback listener;
/// `workers` (per arm, when known) goes into the baseline files `/api/baseline` writes.
pub fn router(
    service: kvroute_loadgen::Service,
    addr: std::net::SocketAddr,
    workers: Option<usize>,
) -> axum::Router {
    let admin_key = std::env::var("KVROUTE_ADMIN_KEY")
        .ok()
        .filter(|k| !k.is_empty());
    if admin_key.is_none() && !addr.ip().is_loopback() {
        tracing::warn!(%addr, "the dashboard's start / stop / concurrency are off: it listens beyond loopback and KVROUTE_ADMIN_KEY is not set");
    }
    let policy = std::sync::Arc::new(kvroute_runtime::AccessPolicy {
        admin_key,
        loopback: addr.ip().is_loopback(),
        ..Default::default()
    });
    use kvroute_runtime::{require, Access};
    let baseline = require(
        axum::Router::new().route("/api/baseline", axum::routing::get(baseline_file)),
        &policy,
        Access::Api,
    )
    .with_state((service.clone(), workers));
    kvroute_loadgen::api::router(service, &policy)
        .merge(baseline)
        .fallback(serve)
}

/// The dashboard's options (shared by `kvroute demo` and `kvroute loadgen`).
#[derive(clap::Args, Debug, Clone)]
pub struct DashboardArgs {
    /// Address of the dashboard (web UI and load generator API).
    #[arg(long, default_value = "127.0.0.1")]
    pub ui_host: String,
    /// A baseline file compared with where no live arm measured (`kvroute bench` writes
    /// `baseline-<policy>-w<N>.json`; repeat for several policies).
    #[arg(long)]
    pub baseline: Vec<std::path::PathBuf>,
    /// TTFT p95 objective of the dashboard, ms.
    #[arg(
        long = "slo-ttft-ms",
        visible_alias = "slo-ttft-p95-ms",
        default_value_t = kvroute_loadgen::dashboard_config::default_objectives_ms().0
    )]
    pub slo_ttft_p95_ms: f64,
    /// TPOT p95 objective of the dashboard, ms.
    #[arg(
        long = "slo-tpot-ms",
        visible_alias = "slo-tpot-p95-ms",
        default_value_t = kvroute_loadgen::dashboard_config::default_objectives_ms().1
    )]
    pub slo_tpot_p95_ms: f64,
    /// Lowest concurrency of the dashboard's slider.
    #[arg(long, default_value_t = kvroute_loadgen::dashboard_config::DEFAULT_SLIDER.0)]
    pub slider_min: usize,
    /// Highest concurrency of the slider.
    #[arg(long, default_value_t = kvroute_loadgen::dashboard_config::DEFAULT_SLIDER.1)]
    pub slider_max: usize,
    /// Step of the slider.
    #[arg(long, default_value_t = kvroute_loadgen::dashboard_config::DEFAULT_SLIDER.2)]
    pub slider_step: usize,
    /// Seconds a concurrency level must hold before every arm's 60 s window counts as
    /// measured at it (the comparison table's live rows, `/api/baseline`).
    #[arg(long, default_value_t = kvroute_loadgen::service::DEFAULT_MEASURE_AFTER_SECS)]
    pub measure_after_secs: f64,
}

impl DashboardArgs {
    /// The dashboard's settings; `references` (baseline files' texts: the demo's simulated
    /// ones) are used when no `--baseline` is given.
    pub fn config(&self, references: &[&str]) -> anyhow::Result<kvroute_loadgen::DashboardConfig> {
        use anyhow::Context;
        let mut texts = Vec::new();
        for path in &self.baseline {
            texts.push((
                path.display().to_string(),
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading baseline {}", path.display()))?,
            ));
        }
        if texts.is_empty() {
            texts.extend(
                references
                    .iter()
                    .map(|t| ("shipped".to_string(), t.to_string())),
            );
        }
        let mut baselines = Vec::new();
        for (name, t) in texts {
            let b = kvroute_report::Baseline::parse(&t)
                .with_context(|| format!("the baseline file {name}"))?;
            baselines.push(serde_json::to_value(b)?);
        }
        let c = kvroute_loadgen::DashboardConfig {
            slo_ttft_p95_ms: self.slo_ttft_p95_ms,
            slo_tpot_p95_ms: self.slo_tpot_p95_ms,
            slider_min: self.slider_min,
            slider_max: self.slider_max,
            slider_step: self.slider_step,
            baselines,
        };
        c.validate().map_err(anyhow::Error::msg)?;
        Ok(c)
    }
}

/// `GET /api/baseline?arm=NAME`: what arm `NAME` measured at each level, as a baseline file
/// (`kvroute bench`'s format) to give a later `--baseline`; 404 before it measured a level.
async fn baseline_file(
    axum::extract::State((service, workers)): axum::extract::State<(
        kvroute_loadgen::Service,
        Option<usize>,
    )>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Response {
    let Some(arm) = q.get("arm") else {
        return (StatusCode::BAD_REQUEST, "give ?arm=NAME").into_response();
    };
    // Workers of the arm's fleet: as the demo started it, else as its gateway lists them.
    let workers = match workers {
        Some(n) => n,
        None => service
            .fleets()
            .await
            .into_iter()
            .find(|(a, _)| &a.name == arm)
            .map_or(0, |(_, f)| f.workers.len())
            .max(1),
    };
    let points: Vec<kvroute_report::BaselinePoint> = service
        .levels()
        .iter()
        .filter_map(|l| {
            let p = l.arms.iter().find(|a| &a.name == arm)?;
            Some(kvroute_report::BaselinePoint::from_summary(
                l.concurrency,
                &p.summary,
            ))
        })
        .collect();
    let source = format!(
        "live, measured by the dashboard's load generator (arm {arm}, a 60 s window once each level had held {} s)",
        service.stats().measure_after_secs
    );
    match kvroute_report::Baseline::from_points(arm, workers, "multiturn", &source, points) {
        Ok(b) => (
            [
                (header::CONTENT_TYPE, "application/json".to_string()),
                (
                    header::CONTENT_DISPOSITION,
                    format!("attachment; filename=\"baseline-{arm}-w{workers}.json\""),
                ),
            ],
            b.to_json(),
        )
            .into_response(),
        Err(e) => (
            StatusCode::NOT_FOUND,
            format!("no baseline for arm {arm:?} yet: {e}"),
        )
            .into_response(),
    }
}

/// Binds the dashboard's port (0 picks a free one).
pub async fn bind(host: &str, port: u16) -> anyhow::Result<tokio::net::TcpListener> {
    use anyhow::Context;
    let addr = format!("{host}:{port}");
    tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("listening on {addr} for the dashboard (taken? try --ui-port)"))
}

/// Serves the dashboard (`app` from [`router`]) until `shutdown`, under the same connection
/// limits as the gateway's defaults (header deadline, connection cap, WebSocket upgrades).
pub async fn serve_app(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    use kvroute_runtime::{serve, ServeLimits};
    serve(listener, app, ServeLimits::default(), None, shutdown).await;
}
