//! Data-parallel ranks: one engine URL in front of two ranks, each with a KV cache of its own
//! (two simulated workers playing rank 0 and rank 1, publishing on the event and replay
//! ports plus their rank, or through TensorRT-LLM's pull API with `attention_dp_rank`). A
//! front plays the engine's HTTP server: it serves a request on the rank its
//! `X-Data-Parallel-Rank` header names and refuses one without it, so every answer proves the
//! gateway steered it. The gateway tracks the ranks apart (`NAME/dp0`, `NAME/dp1`), predicts
//! each follow-up exactly on the rank that holds it, and refuses a rank's events that arrive
//! on another rank's socket.

use crate::support::*;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kvroute_gateway::WorkerSpec;
use kvroute_protocol::kv_events::EventFormat;
use kvroute_worker::{WorkerConfig, WorkerHandle};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The engine's HTTP server over its ranks (base URLs, by rank).
async fn front(ranks: Vec<String>) -> String {
    let app = axum::Router::new()
        .fallback(forward)
        .with_state(Arc::new(ranks));
    kvroute_testkit::serve(app).await
}

async fn forward(State(ranks): State<Arc<Vec<String>>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let rank = req
        .headers()
        .get("x-data-parallel-rank")
        .map(|v| v.to_str().ok().and_then(|s| s.parse::<usize>().ok()));
    let body = axum::body::to_bytes(req.into_body(), 1 << 24)
        .await
        .unwrap();
    let http = reqwest::Client::new();
    if path == "/kv_cache_events" {
        // TensorRT-LLM's pull API: every rank's events in one answer.
        let mut all = Vec::new();
        for base in ranks.iter() {
            let got: Vec<serde_json::Value> = http
                .post(format!("{base}{path}"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            all.extend(got);
        }
        return axum::Json(all).into_response();
    }
    let base = match (path.starts_with("/v1/c"), rank) {
        (false, _) => &ranks[0],
        (true, Some(Some(r))) if r < ranks.len() => &ranks[r],
        (true, _) => {
            return (
                StatusCode::BAD_REQUEST,
                "this test's engine serves only requests steered to a rank",
            )
                .into_response()
        }
    };
    let resp = http
        .request(method, format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let mut out = Response::builder().status(resp.status().as_u16());
    if let Some(ct) = resp.headers().get("content-type") {
        out = out.header("content-type", ct.as_bytes());
    }
    out.body(Body::from_stream(resp.bytes_stream())).unwrap()
}

/// Two free TCP ports in a row, `(p, p + 1)`, for a rank's base port convention.
fn port_pair() -> u16 {
    for _ in 0..100 {
        let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = a.local_addr().unwrap().port();
        if p < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
    panic!("no two free ports in a row");
}

/// Rank `rank` of the engine: its events on `zmq` ports (publish, replay) when given.
async fn rank_worker(rank: u32, format: EventFormat, zmq: Option<(u16, u16)>) -> WorkerHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cfg = WorkerConfig {
        model: MODEL.into(),
        profile: "tiny-fast".into(),
        speedup: 20.0,
        worker_name: format!("rank{rank}"),
        event_format: format,
        data_parallel_rank: rank,
        ..WorkerConfig::default()
    };
    let zmq = zmq.map(|(publish, replay)| kvroute_worker::ZmqConfig {
        publish: format!("tcp://127.0.0.1:{publish}"),
        connect: false,
        replay: Some(format!("tcp://127.0.0.1:{replay}")),
    });
    kvroute_worker::spawn(cfg, Preprocessor::builtin(), listener, zmq)
        .await
        .unwrap()
}

use kvroute_preprocess::Preprocessor;

/// One request: (worker, predicted cached tokens, engine-reported cached tokens).
async fn ask(url: &str, text: &str) -> (String, u64, u64) {
    ask_cached(url, MODEL, None, text).await
}

/// The engine's two ranks and the gateway in front; `shift` moves the configured event
/// ports up by one (rank 0 then listens where rank 1 publishes).
async fn fleet(poll: bool, shift: u16) -> (Vec<WorkerHandle>, kvroute_gateway::GatewayHandle) {
    let (events, replay) = (port_pair(), port_pair());
    let format = if poll {
        EventFormat::Trtllm
    } else {
        EventFormat::Vllm
    };
    let mut ranks = Vec::new();
    for r in 0..2 {
        let zmq = (!poll).then_some((events + r, replay + r));
        ranks.push(rank_worker(u32::from(r), format, zmq).await);
    }
    let url = front(ranks.iter().map(WorkerHandle::url).collect()).await;
    let mut cfg = config(&[], "kv");
    cfg.workers = vec![WorkerSpec {
        url,
        name: Some("engine".into()),
        events: Some(if poll {
            "poll".into()
        } else {
            format!("tcp://127.0.0.1:{}", events + shift)
        }),
        replay: (!poll).then(|| format!("tcp://127.0.0.1:{}", replay + shift)),
        dp_size: Some(2),
        ..WorkerSpec::default()
    }];
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    (ranks, gw)
}

async fn ranks_are_tracked_apart_and_steered(poll: bool) {
    let (ranks, gw) = fleet(poll, 0).await;
    let url = gw.url();
    let report = debug_workers(&url).await;
    let names: Vec<&str> = report["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["worker"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["engine/dp0", "engine/dp1"]);
    assert_eq!(report["workers"][1]["worker"]["dp_rank"], 1);

    // Eight documents at once: the load spreads them over both ranks.
    let docs: Vec<String> = (0..8)
        .map(|i| format!("document {i} about ranks and their caches ").repeat(12))
        .collect();
    let first = futures_util::future::join_all(docs.iter().map(|d| ask(&url, d))).await;
    let on_rank = |r: usize| {
        first
            .iter()
            .filter(|(w, _, _)| *w == format!("engine/dp{r}"))
            .count()
    };
    assert!(on_rank(0) > 0 && on_rank(1) > 0, "{first:?}");
    assert!(first.iter().all(|&(_, p, c)| (p, c) == (0, 0)), "{first:?}");
    // Each rank's index holds its own documents' blocks only.
    assert!(
        eventually(10, async || index_blocks(&url, 0).await > 0
            && index_blocks(&url, 1).await > 0)
        .await
    );
    // Every document again: on the rank that holds it, predicted as the rank reports.
    for (doc, (w1, _, _)) in docs.iter().zip(&first) {
        let (w2, p, c) = ask(&url, doc).await;
        assert_eq!(&w2, w1, "poll {poll}");
        assert!(p > 0, "poll {poll}: nothing predicted on {w2}");
        assert_eq!(
            p, c,
            "poll {poll}: predicted {p} on {w2}, the rank cached {c}"
        );
    }
    gw.shutdown().await;
    for r in ranks {
        r.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_ranks_are_tracked_apart_and_steered() {
    ranks_are_tracked_apart_and_steered(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_api_ranks_are_tracked_apart_and_steered() {
    ranks_are_tracked_apart_and_steered(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_ranks_events_are_refused() {
    // Configured one port too high: rank 0 subscribes to rank 1's publisher.
    let (ranks, gw) = fleet(false, 1).await;
    let url = gw.url();
    let mut served_by_1 = false;
    for i in 0..6 {
        let (w, _, _) = ask(&url, &format!("prompt {i} ").repeat(40)).await;
        served_by_1 |= w == "engine/dp1";
    }
    assert!(served_by_1);
    let refused = async || {
        let text = kvroute_testkit::get_text(&client(), &format!("{url}/metrics")).await;
        let seen = kvroute_protocol::prometheus_text::samples(&text).any(|s| {
            s.name == "kvroute_kv_events_total"
                && s.label("worker").as_deref() == Some("engine/dp0")
                && s.label("result").as_deref() == Some("wrong_rank")
                && s.value > 0.0
        });
        seen
    };
    assert!(eventually(10, refused).await);
    let report = debug_workers(&url).await;
    assert_eq!(report["workers"][0]["index_blocks"], 0, "{report}");
    assert_eq!(report["workers"][0]["worker"]["degraded"], true, "{report}");
    gw.shutdown().await;
    for r in ranks {
        r.shutdown().await;
    }
}
