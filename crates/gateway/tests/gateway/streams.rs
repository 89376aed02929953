//! How streamed answers are counted: a client that read `[DONE]` and closed at once (as the
//! official clients do) completed its request; one that left before `[DONE]` did not (499).

use crate::support::*;
use axum::routing::{get, post};
use futures_util::StreamExt;
use std::time::Duration;

/// A worker whose stream sends one token chunk and `[DONE]` (none for `max_tokens` 1), then
/// holds the connection open for a long time before ending (so the client, not the worker,
/// ends every stream here).
async fn lingering_worker() -> String {
    let stream = |axum::Json(body): axum::Json<serde_json::Value>| async move {
        let done = body["max_tokens"] != 1;
        let token = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
        let parts: &[&'static str] = if done {
            &[token, "data: [DONE]\n\n"]
        } else {
            &[token]
        };
        let chunks = futures_util::stream::iter(parts.to_vec())
            .map(|s| Ok::<_, std::io::Error>(axum::body::Bytes::from_static(s.as_bytes())))
            .chain(futures_util::stream::once(async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok(axum::body::Bytes::new())
            }));
        (
            [("content-type", "text/event-stream")],
            axum::body::Body::from_stream(chunks),
        )
    };
    kvroute_testkit::serve(
        axum::Router::new()
            .route("/v1/chat/completions", post(stream))
            .route("/health", get(|| async { "ok" })),
    )
    .await
}

/// Streams a chat request and reads until `[DONE]` (or only the first chunk), then drops
/// the connection.
async fn read_and_leave(url: &str, to_done: bool) {
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat(&[("user", "hi")], true, if to_done { 4 } else { 1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream();
    let mut seen = String::new();
    while let Some(chunk) = body.next().await {
        seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        if !to_done || seen.contains("[DONE]") {
            break;
        }
    }
    assert!(!to_done || seen.contains("[DONE]"), "{seen}");
}

/// A gateway in front of the single (fake) worker at `url`, named `w`.
async fn gateway_before(
    url: String,
    tweak: impl FnOnce(&mut kvroute_gateway::GatewayConfig),
) -> kvroute_gateway::GatewayHandle {
    let mut cfg = config(&[], "kv");
    tweak(&mut cfg);
    cfg.workers = vec![kvroute_gateway::WorkerSpec {
        url,
        name: Some("w".into()),
        ..kvroute_gateway::WorkerSpec::default()
    }];
    gateway_with_feeds(cfg, std::collections::BTreeMap::new()).await
}

/// The last `data:` event of a stream's text, as JSON.
fn last_event(text: &str) -> serde_json::Value {
    let last = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .last()
        .unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn count(metrics: &str, status: &str) -> f64 {
    let name = format!("kvroute_requests_total{{model=\"{MODEL}\",status=\"{status}\"}}");
    kvroute_testkit::sample(metrics, &name).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_read_to_done_counts_as_completed_and_one_left_early_as_499() {
    let gw = gateway_before(lingering_worker().await, |_| {}).await;
    let url = gw.url();
    for _ in 0..3 {
        read_and_leave(&url, true).await;
    }
    read_and_leave(&url, false).await;
    assert!(
        eventually(10, async || {
            let m = crate::scrape(&url).await;
            count(&m, "200") == 3.0 && count(&m, "499") == 1.0
        })
        .await,
        "{}",
        crate::scrape(&url).await
    );
    gw.shutdown().await;
}

/// A worker whose chat stream is `chunks()` (after `200` and the stream headers).
async fn sse_worker<S>(chunks: fn() -> S) -> String
where
    S: futures_util::Stream<Item = Result<axum::body::Bytes, std::io::Error>> + Send + 'static,
{
    let stream = move || async move {
        (
            [("content-type", "text/event-stream")],
            axum::body::Body::from_stream(chunks()),
        )
    };
    kvroute_testkit::serve(
        axum::Router::new()
            .route("/v1/chat/completions", post(stream))
            .route("/health", get(|| async { "ok" })),
    )
    .await
}

/// A worker that answers 200 with stream headers, then drops the connection before any
/// chunk (an engine dying right after accepting a request).
async fn breaking_worker() -> String {
    sse_worker(|| {
        // The headers go out first; the connection drops a moment later.
        futures_util::stream::once(async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Err::<axum::body::Bytes, _>(std::io::Error::other("engine died"))
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_breaks_before_its_first_chunk_is_retried_elsewhere() {
    let good = worker("good").await;
    let mut cfg = config(&[&good], "round_robin");
    cfg.workers.insert(
        0,
        kvroute_gateway::WorkerSpec {
            url: breaking_worker().await,
            name: Some("broken".into()),
            ..kvroute_gateway::WorkerSpec::default()
        },
    );
    let gw = gateway_with_feeds(cfg, std::collections::BTreeMap::new()).await;
    let url = gw.url();
    for i in 0..4 {
        let r = client()
            .post(format!("{url}/v1/chat/completions"))
            .json(&chat(&[("user", &format!("question {i}"))], true, 4))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-kvroute-worker"], "good");
        let text = r.text().await.unwrap();
        assert!(text.contains("[DONE]"), "{text}");
    }
    let m = crate::scrape(&url).await;
    assert!(
        kvroute_testkit::sample(
            &m,
            "kvroute_upstream_errors_total{kind=\"broken\",worker=\"broken\"}"
        ) >= Some(1.0),
        "{m}"
    );
    gw.shutdown().await;
    good.shutdown().await;
}

/// A worker whose stream sends one token chunk, then drops the connection (an engine dying
/// mid-answer).
async fn dying_worker() -> String {
    sse_worker(|| {
        let token = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
        futures_util::stream::once(async move {
            Ok::<_, std::io::Error>(axum::body::Bytes::from_static(token.as_bytes()))
        })
        .chain(futures_util::stream::once(async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Err::<axum::body::Bytes, _>(std::io::Error::other("engine died"))
        }))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_breaks_mid_way_ends_with_an_upstream_failed_event() {
    let gw = gateway_before(dying_worker().await, |_| {}).await;
    let url = gw.url();
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat(&[("user", "hi")], true, 4))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let event = last_event(&text);
    assert_eq!(event["error"]["code"], "upstream_failed", "{text}");
    assert_eq!(event["error"]["type"], "upstream_error", "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    // Counted as the 200 the client got, and as the worker's broken stream.
    assert!(
        eventually(10, async || {
            let m = crate::scrape(&url).await;
            count(&m, "200") == 1.0
                && kvroute_testkit::sample(
                    &m,
                    "kvroute_upstream_errors_total{kind=\"stream_broken\",worker=\"w\"}",
                ) == Some(1.0)
        })
        .await,
        "{}",
        crate::scrape(&url).await
    );
    let m = crate::scrape(&url).await;
    assert_eq!(count(&m, "502"), 0.0);
    // The only worker failed: no other could carry the stream on.
    assert_eq!(
        kvroute_testkit::sample(&m, "kvroute_migrations_total{result=\"failed\"}"),
        Some(1.0),
        "{m}"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_goes_silent_ends_with_an_upstream_timeout_event() {
    let gw = gateway_before(lingering_worker().await, |c| {
        c.upstream.idle_timeout_secs = 0.5
    })
    .await;
    let url = gw.url();
    // One token, then the worker holds the stream open without a word for 60 s. (With
    // migration, `max_tokens` 1 would make that token the whole answer: the stream would end
    // complete. Here the request opts out of migration.)
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("x-kvroute-migrate", "off")
        .json(&chat(&[("user", "hi")], true, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let read = tokio::time::timeout(Duration::from_secs(20), r.text()).await;
    let text = read.expect("the gateway ends a silent stream").unwrap();
    assert!(text.contains("\"content\":\"hi\""), "{text}");
    let event = last_event(&text);
    assert_eq!(event["error"]["code"], "upstream_timeout", "{text}");
    let m = crate::scrape(&url).await;
    assert_eq!(
        kvroute_testkit::sample(
            &m,
            "kvroute_upstream_errors_total{kind=\"stream_idle\",worker=\"w\"}"
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(count(&m, "200"), 1.0, "{m}");
    assert_eq!(
        kvroute_testkit::sample(&m, "kvroute_migrations_total{result=\"off\"}"),
        Some(1.0),
        "{m}"
    );
    let bad = {
        let mut c = config(&[], "kv");
        c.workers = vec![kvroute_gateway::WorkerSpec {
            url: "http://127.0.0.1:1".into(),
            ..kvroute_gateway::WorkerSpec::default()
        }];
        c.upstream.idle_timeout_secs = 1e30;
        c.validate().unwrap_err().to_string()
    };
    assert!(bad.contains("upstream.idle_timeout_secs"), "{bad}");
    gw.shutdown().await;
}
