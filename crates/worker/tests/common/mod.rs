//! Helpers shared by the integration tests: start a worker on an ephemeral port, bounded
//! waits, SSE and metrics parsing.

#![allow(dead_code)]

use kvroute_preprocess::Preprocessor;
use kvroute_protocol::openai::{SseEvent, SseParser};
use kvroute_worker::{spawn, WorkerConfig, WorkerHandle, ZmqConfig};
use std::future::Future;
use std::time::Duration;

/// The bound on any one test.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A fast worker config: the demo engine at 50x.
pub fn config() -> WorkerConfig {
    WorkerConfig {
        speedup: 50.0,
        worker_name: "test-worker".into(),
        ..WorkerConfig::default()
    }
}

/// Starts a worker on 127.0.0.1 with an ephemeral port.
pub async fn start(cfg: WorkerConfig, zmq: Option<ZmqConfig>) -> WorkerHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    spawn(cfg, Preprocessor::builtin(), listener, zmq)
        .await
        .unwrap()
}

/// Runs `f` with the test time bound.
pub async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_TIMEOUT, f)
        .await
        .expect("the test did not finish in time")
}

/// The events of a whole SSE body.
pub fn sse_events(body: &[u8]) -> Vec<SseEvent> {
    let mut p = SseParser::new();
    let mut out = Vec::new();
    p.feed(body, &mut out).unwrap();
    p.finish(&mut out).unwrap();
    out
}

/// The JSON payloads of an SSE body, and whether it ended with `[DONE]`.
pub fn sse_json(body: &[u8]) -> (Vec<serde_json::Value>, bool) {
    let events = sse_events(body);
    let done = matches!(events.last(), Some(SseEvent::Done));
    let json = events
        .iter()
        .filter_map(|e| match e {
            SseEvent::Data(d) => Some(serde_json::from_str(d).unwrap()),
            SseEvent::Done => None,
        })
        .collect();
    (json, done)
}

/// Scrapes `/metrics`.
pub async fn scrape(client: &reqwest::Client, url: &str) -> String {
    kvroute_testkit::get_text(client, &format!("{url}/metrics")).await
}

/// A chat body.
pub fn chat_body(content: &str, max_tokens: u32, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": "kvroute-sim",
        "messages": [
            {"role": "system", "content": "You are a careful assistant who answers briefly."},
            {"role": "user", "content": content},
        ],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": stream},
    })
}

/// The rendered and tokenized prompt of [`chat_body`], as the worker sees it.
pub fn chat_prompt_tokens(content: &str) -> usize {
    let pre = Preprocessor::builtin();
    let body = chat_body(content, 1, false);
    let messages = body["messages"].as_array().unwrap().clone();
    let text = pre.render_chat(&messages, true).unwrap();
    pre.encode(&text).unwrap().len()
}
