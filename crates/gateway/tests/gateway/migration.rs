//! Mid-stream migration: a worker's stream that breaks off after the client got its first
//! chunks is carried on by another worker as a continuation, and the client reads one
//! unbroken stream; counted, limited, and off per request.

use crate::support::*;
use axum::routing::{get, post};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DEAD_ID: &str = "chatcmpl-dead";

/// A worker whose chat stream sends its role, "Once", " upon", " a", then dies.
async fn dying_worker() -> String {
    dying_worker_after(usize::MAX).await
}

/// The same, dying after its first `chunks` chunks (the role chunk is the first).
async fn dying_worker_after(chunks: usize) -> String {
    let stream = move || async move {
        let chunk = |delta: Value| {
            let c = json!({"id": DEAD_ID, "object": "chat.completion.chunk", "model": MODEL,
                           "choices": [{"index": 0, "delta": delta, "finish_reason": null}]});
            Ok::<_, std::io::Error>(axum::body::Bytes::from(format!("data: {c}\n\n")))
        };
        let parts = vec![
            chunk(json!({"role": "assistant", "content": ""})),
            chunk(json!({"content": "Once"})),
            chunk(json!({"content": " upon"})),
            // The last chunk is cut in half by the worker's death: the client must not get
            // the half.
            Ok(axum::body::Bytes::from(format!(
                "data: {{\"id\":\"{DEAD_ID}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" a\"}}}}]}}\n\ndata: {{\"id\""
            ))),
        ];
        let parts: Vec<_> = parts.into_iter().take(chunks).collect();
        let body = futures_util::stream::iter(parts).chain(futures_util::stream::once(async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Err(std::io::Error::other("engine died"))
        }));
        (
            [("content-type", "text/event-stream")],
            axum::body::Body::from_stream(body),
        )
    };
    kvroute_testkit::serve(
        axum::Router::new()
            .route("/v1/chat/completions", post(stream))
            .route("/health", get(|| async { "ok" })),
    )
    .await
}

/// A worker that records each request and streams " time" as the rest of the answer, with a
/// usage chunk counting its prompt as 20 tokens and its answer as 1.
async fn recording_worker(seen: Arc<Mutex<Vec<Value>>>) -> String {
    let stream = move |axum::Json(body): axum::Json<Value>| {
        seen.lock().unwrap().push(body);
        async {
            let parts = [
                json!({"id": "chatcmpl-new", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
                json!({"id": "chatcmpl-new", "choices": [{"index": 0, "delta": {"content": " time"}, "finish_reason": "length"}]}),
                json!({"id": "chatcmpl-new", "choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21}}),
            ];
            let mut text: String = parts.iter().map(|p| format!("data: {p}\n\n")).collect();
            text.push_str("data: [DONE]\n\n");
            ([("content-type", "text/event-stream")], text)
        }
    };
    kvroute_testkit::serve(
        axum::Router::new()
            .route("/v1/chat/completions", post(stream))
            .route("/health", get(|| async { "ok" })),
    )
    .await
}

fn stub(url: String, name: &str) -> kvroute_gateway::WorkerSpec {
    kvroute_gateway::WorkerSpec {
        url,
        name: Some(name.into()),
        ..kvroute_gateway::WorkerSpec::default()
    }
}

/// The `data:` payloads of a stream, parsed (`[DONE]` as a string).
fn events(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|_| Value::from(d)))
        .collect()
}

fn content(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect()
}

/// Streams a chat request until one lands on `dying` first (round robin over two workers);
/// returns the stream's text.
async fn stream_from_dying(url: &str, max_tokens: u32, migrate: Option<&str>) -> String {
    for _ in 0..2 {
        let mut req = client()
            .post(format!("{url}/v1/chat/completions"))
            .json(&chat(&[("user", "Tell me a story")], true, max_tokens));
        if let Some(v) = migrate {
            req = req.header("x-kvroute-migrate", v);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 200);
        let first = r.headers()["x-kvroute-worker"]
            .to_str()
            .unwrap()
            .to_string();
        let text = r.text().await.unwrap();
        if first == "dying" {
            return text;
        }
    }
    panic!("round robin never chose the dying worker");
}

fn migrations(metrics: &str, result: &str) -> Option<f64> {
    kvroute_testkit::sample(
        metrics,
        &format!("kvroute_migrations_total{{result=\"{result}\"}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_worker_dies_is_carried_on_by_another_as_one_stream() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut cfg = config(&[], "round_robin");
    cfg.workers = vec![
        stub(dying_worker().await, "dying"),
        stub(recording_worker(seen.clone()).await, "rec"),
    ];
    let gw = gateway_with_feeds(cfg, Default::default()).await;
    let url = gw.url();
    let text = stream_from_dying(&url, 10, None).await;
    let evs = events(&text);
    // One stream: the dying worker's whole chunks, then the continuation's, under the first
    // id, one role, one end; the half chunk never reached the client.
    assert_eq!(content(&evs), "Once upon a time", "{text}");
    assert_eq!(evs.last(), Some(&Value::from("[DONE]")), "{text}");
    assert_eq!(text.matches("[DONE]").count(), 1, "{text}");
    assert_eq!(text.matches("\"role\"").count(), 1, "{text}");
    for e in evs.iter().filter(|e| e.is_object()) {
        assert_eq!(e["id"], DEAD_ID, "{text}");
    }
    // The continuation: the prompt plus the streamed text as the assistant's message to
    // continue, the token limit reduced by what was streamed (at least its 3 chunks; more
    // when the tokenizer counts more tokens in the text).
    let body = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": "Tell me a story"}, {"role": "assistant", "content": "Once upon a"}]),
        "{body}"
    );
    assert_eq!(body["continue_final_message"], true, "{body}");
    assert_eq!(body["add_generation_prompt"], false, "{body}");
    assert_eq!(body["stream_options"]["include_usage"], true, "{body}");
    let carried = 10 - body["max_tokens"].as_u64().unwrap();
    assert!((3..10).contains(&carried), "{body}");
    // Usage counted from the original prompt: the carried tokens move from the
    // continuation's prompt to the answer.
    let usage = &evs[evs.len() - 2]["usage"];
    assert_eq!(
        usage,
        &json!({"prompt_tokens": 20 - carried, "completion_tokens": 1 + carried, "total_tokens": 21}),
        "{text}"
    );
    let m = crate::scrape(&url).await;
    assert_eq!(migrations(&m, "migrated"), Some(1.0), "{m}");
    assert_eq!(
        kvroute_testkit::sample(
            &m,
            "kvroute_upstream_errors_total{kind=\"stream_broken\",worker=\"dying\"}"
        ),
        Some(1.0),
        "{m}"
    );
    assert!(
        eventually(5, async || {
            let m = crate::scrape(&url).await;
            kvroute_testkit::sample(
                &m,
                "kvroute_requests_total{model=\"kvroute-sim\",status=\"200\"}",
            )
            .unwrap_or(0.0)
                >= 1.0
                && kvroute_testkit::sample(&m, "kvroute_inflight_requests") == Some(0.0)
        })
        .await,
        "{}",
        crate::scrape(&url).await
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_after_its_role_alone_is_still_one_stream() {
    // The worker dies after its role chunk: nothing to carry on, yet the continuation's
    // chunks must read as the first stream's (a second role confuses clients).
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut cfg = config(&[], "round_robin");
    cfg.workers = vec![
        stub(dying_worker_after(1).await, "dying"),
        stub(recording_worker(seen.clone()).await, "rec"),
    ];
    let gw = gateway_with_feeds(cfg, Default::default()).await;
    let text = stream_from_dying(&gw.url(), 10, None).await;
    let evs = events(&text);
    assert_eq!(content(&evs), " time", "{text}");
    assert_eq!(text.matches("\"role\"").count(), 1, "{text}");
    for e in evs.iter().filter(|e| e.is_object()) {
        assert_eq!(e["id"], DEAD_ID, "{text}");
    }
    let body = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        body["messages"][1],
        json!({"role": "assistant", "content": ""}),
        "{body}"
    );
    assert_eq!(body["max_tokens"], 10, "{body}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_worker_continues_the_answer_of_one_that_died() {
    let good = worker("good").await;
    let mut cfg = config(&[&good], "round_robin");
    cfg.workers.insert(0, stub(dying_worker().await, "dying"));
    let gw = gateway_with_feeds(cfg, Default::default()).await;
    let url = gw.url();
    let text = stream_from_dying(&url, 12, None).await;
    let evs = events(&text);
    let said = content(&evs);
    assert!(
        said.starts_with("Once upon a") && said.len() > "Once upon a".len(),
        "{text}"
    );
    assert_eq!(text.matches("[DONE]").count(), 1, "{text}");
    assert!(!text.contains("\"error\""), "{text}");
    let usage = &evs[evs.len() - 2]["usage"];
    assert_eq!(usage["completion_tokens"], 12, "{text}");
    let m = crate::scrape(&url).await;
    assert_eq!(migrations(&m, "migrated"), Some(1.0), "{m}");
    gw.shutdown().await;
    good.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_stops_at_its_limit_and_when_a_request_opts_out() {
    let mut cfg = config(&[], "round_robin");
    cfg.workers = vec![
        stub(dying_worker().await, "dying"),
        stub(dying_worker().await, "dying2"),
    ];
    cfg.upstream.migration_limit = 1;
    let gw = gateway_with_feeds(cfg, Default::default()).await;
    let url = gw.url();
    // Carried on once, to a worker that dies too: the limit ends it with an error event.
    let text = stream_from_dying(&url, 50, None).await;
    let evs = events(&text);
    assert_eq!(content(&evs), "Once upon aOnce upon a", "{text}");
    assert_eq!(
        evs.last().unwrap()["error"]["code"],
        "upstream_failed",
        "{text}"
    );
    assert!(!text.contains("[DONE]"), "{text}");
    let m = crate::scrape(&url).await;
    assert_eq!(migrations(&m, "migrated"), Some(1.0), "{m}");
    assert_eq!(migrations(&m, "limit"), Some(1.0), "{m}");
    // Opted out: the first failure ends the stream.
    let text = stream_from_dying(&url, 50, Some("off")).await;
    assert_eq!(content(&events(&text)), "Once upon a", "{text}");
    assert!(text.contains("upstream_failed"), "{text}");
    let m = crate::scrape(&url).await;
    assert_eq!(migrations(&m, "off"), Some(1.0), "{m}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_after_its_last_token_still_ends_with_its_finish_reason_and_usage() {
    // Two tokens asked for, "Once" and " upon" streamed, then the worker dies before its
    // finish reason, usage and [DONE]: nothing is left to generate, and the client still
    // gets what the engine would have sent (as real vLLM was seen to die in CI).
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut cfg = config(&[], "round_robin");
    cfg.workers = vec![
        stub(dying_worker_after(3).await, "dying"),
        stub(recording_worker(seen.clone()).await, "rec"),
    ];
    let gw = gateway_with_feeds(cfg, Default::default()).await;
    let text = stream_from_dying(&gw.url(), 2, None).await;
    let evs = events(&text);
    assert_eq!(content(&evs), "Once upon", "{text}");
    assert!(seen.lock().unwrap().is_empty(), "nothing to carry on");
    let finish: Vec<_> = evs
        .iter()
        .filter_map(|e| e["choices"][0]["finish_reason"].as_str())
        .collect();
    assert_eq!(finish, ["length"], "{text}");
    let usage = evs.iter().find(|e| e["usage"].is_object()).expect(&text);
    assert_eq!(usage["usage"]["completion_tokens"], 2, "{text}");
    assert!(
        usage["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "{text}"
    );
    assert_eq!(usage["id"], DEAD_ID, "{text}");
    assert_eq!(usage["model"], MODEL, "{text}");
    assert_eq!(evs.last(), Some(&Value::from("[DONE]")), "{text}");
    let m = crate::scrape(&gw.url()).await;
    assert_eq!(migrations(&m, "complete"), Some(1.0), "{m}");
    gw.shutdown().await;
}
