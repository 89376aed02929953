//! The gateway end to end: real gateway and simulated workers on 127.0.0.1, ephemeral ports.

mod accuracy;
mod admission;
mod auth;
mod cold_start;
mod engines;
mod epp;
mod events;
mod explain;
mod fleet;
mod health;
mod kubernetes;
mod migration;
mod pd_workers;
mod plane;
mod pools;
mod priority;
mod ranks;
mod reload;
mod replicas;
mod resync;
mod roles;
mod round_trip;
mod split;
mod streams;
mod support;
mod tiers;
mod tls;

pub use health::scrape;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streams_and_not_through_the_gateway() {
    let (a, b) = (worker("a").await, worker("b").await);
    let gw = gateway(&[&a, &b], config(&[&a, &b], "kv")).await;
    let url = gw.url();

    let (status, worker, json) = post(
        &url,
        "/v1/chat/completions",
        &chat(&[("user", "Hello there")], false, 8),
    )
    .await;
    assert_eq!(status, 200, "{json}");
    assert!(worker.is_some());
    assert_eq!(json["object"], "chat.completion");
    assert!(!json["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .is_empty());
    assert_eq!(json["usage"]["completion_tokens"], 8);

    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("x-request-id", "req-42")
        .json(&chat(&[("user", "Stream me")], true, 5))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-request-id"], "req-42");
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    let chunks: Vec<serde_json::Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 5, "{text}");

    let (status, _, json) = post(
        &url,
        "/v1/completions",
        &serde_json::json!({"model": MODEL, "prompt": [1, 2, 3, 4, 5], "max_tokens": 3}),
    )
    .await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["usage"]["prompt_tokens"], 5);
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

/// Turn 1 of a conversation, then turn 2 resending it: which worker served each, and the
/// cached tokens turn 2 reported.
async fn two_turns(policy: &str) -> (String, String, u64) {
    let (a, b) = (worker("a").await, worker("b").await);
    let gw = gateway(&[&a, &b], config(&[&a, &b], policy)).await;
    let url = gw.url();
    let system = "You are a careful assistant. ".repeat(20);
    let turn1 = [("system", system.as_str()), ("user", "What is a KV cache?")];
    let (s1, w1, j1) = post(&url, "/v1/chat/completions", &chat(&turn1, false, 16)).await;
    assert_eq!(s1, 200, "{j1}");
    let answer = j1["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    // The worker's KV events reach the index.
    let i = if w1.as_deref() == Some("a") { 0 } else { 1 };
    assert!(eventually(10, async || index_blocks(&url, i).await > 0).await);
    let turn2 = [
        turn1[0],
        turn1[1],
        ("assistant", answer.as_str()),
        ("user", "And why does routing matter?"),
    ];
    let (s2, w2, j2) = post(&url, "/v1/chat/completions", &chat(&turn2, false, 16)).await;
    assert_eq!(s2, 200, "{j2}");
    let cached = j2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
    (w1.unwrap(), w2.unwrap(), cached)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_lands_where_its_prefix_is_cached() {
    let (w1, w2, cached) = two_turns("kv").await;
    assert_eq!(w1, w2);
    assert!(cached > 100, "cached {cached}");
    let (w1, w2, cached) = two_turns("round_robin").await;
    assert_ne!(w1, w2);
    assert_eq!(cached, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_their_status_and_an_openai_error() {
    let a = worker("a").await;
    let mut cfg = config(&[&a], "kv");
    cfg.limits.max_body_bytes = 4096;
    cfg.limits.max_prompt_tokens = 64;
    let gw = gateway(&[&a], cfg).await;
    let url = gw.url();
    let raw = |body: &'static str| {
        let url = url.clone();
        async move {
            let r = client()
                .post(format!("{url}/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            (
                r.status().as_u16(),
                r.json::<serde_json::Value>().await.unwrap(),
            )
        }
    };
    let cases: Vec<(u16, serde_json::Value)> = vec![
        raw("{not json").await,
        raw(r#"{"model":"kvroute-sim","messages":[]}"#).await,
        raw(
            r#"{"model":"kvroute-sim","messages":[{"role":"user","content":"x"}],"max_tokens":-3}"#,
        )
        .await,
        raw(r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#).await,
        post(
            &url,
            "/v1/chat/completions",
            &chat(&[("user", &"x".repeat(5000))], false, 4),
        )
        .await
        .pipe(|(s, _, j)| (s, j)),
        post(
            &url,
            "/v1/chat/completions",
            &chat(&[("user", &"word ".repeat(300))], false, 4),
        )
        .await
        .pipe(|(s, _, j)| (s, j)),
        post(&url, "/v1/nothing", &serde_json::json!({}))
            .await
            .pipe(|(s, _, j)| (s, j)),
    ];
    let want = [400, 400, 400, 404, 413, 413, 404];
    for ((status, body), want) in cases.iter().zip(want) {
        assert_eq!(*status, want, "{body}");
        let e = &body["error"];
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
        assert!(e["type"].is_string(), "{body}");
    }
    assert_eq!(cases[3].1["error"]["code"], "model_not_found");
    assert_eq!(cases[6].1["error"]["code"], "not_found");
    // A known route with another method: 405, an OpenAI error body and `Allow`.
    for (path, allow) in [("/v1/chat/completions", "POST"), ("/debug/reset", "POST")] {
        let r = client().get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 405);
        assert_eq!(r.headers()["allow"], allow);
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    }
    let r = client()
        .delete(format!("{url}/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
    gw.shutdown().await;
    a.shutdown().await;
}

trait Pipe: Sized {
    fn pipe<T>(self, f: impl FnOnce(Self) -> T) -> T {
        f(self)
    }
}
impl<T> Pipe for T {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_redirect_goes_back_to_the_client_unfollowed() {
    use axum::routing::{get, post};
    let elsewhere = kvroute_testkit::serve(
        axum::Router::new().route("/v1/chat/completions", post(|| async { "followed" })),
    )
    .await;
    let target = format!("{elsewhere}/v1/chat/completions");
    let redirecting = kvroute_testkit::serve(
        axum::Router::new()
            .route(
                "/v1/chat/completions",
                post(move || async move {
                    (
                        axum::http::StatusCode::TEMPORARY_REDIRECT,
                        [("location", target)],
                        "",
                    )
                }),
            )
            .route("/health", get(|| async { "ok" })),
    )
    .await;
    let mut cfg = config(&[], "kv");
    cfg.workers = vec![kvroute_gateway::WorkerSpec {
        url: redirecting,
        ..kvroute_gateway::WorkerSpec::default()
    }];
    let gw = gateway_with_feeds(cfg, std::collections::BTreeMap::new()).await;
    let no_follow = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = no_follow
        .post(format!("{}/v1/chat/completions", gw.url()))
        .json(&chat(&[("user", "hi")], false, 2))
        .send()
        .await
        .unwrap();
    // Had the gateway followed it, `elsewhere` would have answered 200 "followed".
    assert_eq!(r.status().as_u16(), 307);
    assert_ne!(r.text().await.unwrap(), "followed");
    gw.shutdown().await;
}
