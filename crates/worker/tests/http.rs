//! The OpenAI API of the worker: answers, streams, errors, metrics, client disconnects and
//! shutdown.

mod common;

use common::*;
use futures_util::StreamExt;
use kvroute_testkit::{eventually, sample};
use kvroute_worker::WorkerConfig;
use serde_json::{json, Value};
use std::time::Duration;

const QUESTION: &str = "Explain in a few words why a prefix cache makes repeated prompts cheaper \
                        to serve, and what a router can do with that knowledge.";

async fn post(client: &reqwest::Client, url: String, body: &Value) -> reqwest::Response {
    client.post(url).json(body).send().await.unwrap()
}

#[tokio::test]
async fn chat_answers_with_usage_and_the_second_request_hits_the_cache() {
    bounded(async {
        let w = start(config(), None).await;
        let client = reqwest::Client::new();
        let url = format!("{}/v1/chat/completions", w.url());
        let want_prompt = chat_prompt_tokens(QUESTION);
        assert!(want_prompt > 32, "the prompt spans blocks: {want_prompt}");

        let first = client
            .post(&url)
            .header("x-request-id", "client-id-1")
            .json(&chat_body(QUESTION, 5, false))
            .send()
            .await
            .unwrap();
        assert_eq!(first.status(), 200);
        assert_eq!(first.headers()["x-request-id"], "client-id-1");
        let first: Value = first.json().await.unwrap();
        assert!(first["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert_eq!(first["object"], "chat.completion");
        assert_eq!(first["model"], "kvroute-sim");
        let choice = &first["choices"][0];
        assert_eq!(choice["message"]["role"], "assistant");
        assert!(!choice["message"]["content"].as_str().unwrap().is_empty());
        assert_eq!(choice["finish_reason"], "length");
        let usage = &first["usage"];
        assert_eq!(usage["prompt_tokens"], want_prompt as u64);
        assert_eq!(usage["completion_tokens"], 5);
        assert_eq!(usage["total_tokens"], want_prompt as u64 + 5);
        assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);

        let second = post(&client, url, &chat_body(QUESTION, 5, false)).await;
        assert_eq!(second.status(), 200);
        assert!(
            second.headers().contains_key("x-request-id"),
            "an id is made up when none is given"
        );
        let second: Value = second.json().await.unwrap();
        assert_ne!(second["id"], first["id"]);
        let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(cached > 0 && cached < want_prompt as u64, "{cached}");
        assert_eq!(cached % 16, 0, "whole blocks of 16 tokens");
        w.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn chat_streams_role_text_finish_usage_then_done() {
    bounded(async {
        let w = start(config(), None).await;
        let client = reqwest::Client::new();
        let url = format!("{}/v1/chat/completions", w.url());
        let resp = post(&client, url, &chat_body(QUESTION, 6, true)).await;
        assert_eq!(resp.status(), 200);
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        let body = resp.bytes().await.unwrap();
        let (chunks, done) = sse_json(&body);
        assert!(done, "ends with [DONE]");
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let content: Vec<&Value> = chunks
            .iter()
            .filter(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty()))
            .filter(|c| {
                !c["choices"][0]["delta"]["content"]
                    .as_str()
                    .unwrap()
                    .is_empty()
            })
            .collect();
        assert_eq!(content.len(), 6, "one chunk per token: {chunks:?}");
        for c in &content[..5] {
            assert_eq!(c["choices"][0]["finish_reason"], Value::Null);
        }
        assert_eq!(content[5]["choices"][0]["finish_reason"], "length");
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"], json!([]));
        assert_eq!(last["usage"]["completion_tokens"], 6);
        assert_eq!(
            last["usage"]["prompt_tokens"],
            chat_prompt_tokens(QUESTION) as u64
        );
        let ids: Vec<&Value> = chunks.iter().map(|c| &c["id"]).collect();
        assert!(ids.iter().all(|i| *i == ids[0]), "one id per stream");
        assert_eq!(chunks[0]["object"], "chat.completion.chunk");
        w.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn completions_take_token_ids_and_text() {
    bounded(async {
        let w = start(config(), None).await;
        let client = reqwest::Client::new();
        let url = format!("{}/v1/completions", w.url());
        let ids: Vec<u32> = (500..540).collect();
        let r = post(
            &client,
            url.clone(),
            &json!({"model": "kvroute-sim", "prompt": ids, "max_tokens": 3}),
        )
        .await;
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["usage"]["prompt_tokens"], 40);
        assert_eq!(v["usage"]["completion_tokens"], 3);
        assert!(!v["choices"][0]["text"].as_str().unwrap().is_empty());

        let text = "The quick brown fox jumps over the lazy dog, again and again.";
        let want = kvroute_preprocess::Preprocessor::builtin()
            .encode(text)
            .unwrap()
            .len();
        let body = json!({"model": "kvroute-sim", "prompt": text, "max_tokens": 4});
        let v: Value = post(&client, url.clone(), &body)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(v["usage"]["prompt_tokens"], want as u64);
        assert_eq!(v["usage"]["completion_tokens"], 4);

        // Streaming, with the default max_tokens and no usage chunk.
        let cfg_default = WorkerConfig::default().default_max_tokens;
        let body = json!({"model": "kvroute-sim", "prompt": text, "stream": true});
        let bytes = post(&client, url, &body).await.bytes().await.unwrap();
        let (chunks, done) = sse_json(&bytes);
        assert!(done);
        assert_eq!(chunks.len(), cfg_default as usize);
        assert!(chunks.iter().all(|c| c["usage"].is_null()));
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "length"
        );
        w.shutdown().await;
    })
    .await;
}

async fn expect_error(resp: reqwest::Response, status: u16) -> Value {
    assert_eq!(resp.status(), status);
    assert!(resp.headers().contains_key("x-request-id"));
    let v: Value = resp.json().await.unwrap();
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    v
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    bounded(async {
        let cfg = WorkerConfig {
            max_body_bytes: 1024,
            max_prompt_tokens: 50,
            num_gpu_blocks: Some(8),
            ..config()
        };
        let w = start(cfg, None).await;
        let client = reqwest::Client::new();
        let chat = format!("{}/v1/chat/completions", w.url());
        let cmpl = format!("{}/v1/completions", w.url());

        let mut body = chat_body("hi", 2, false);
        body["model"] = json!("gpt-nope");
        let v = expect_error(post(&client, chat.clone(), &body).await, 404).await;
        assert_eq!(v["error"]["code"], "model_not_found");

        let r = client
            .post(&chat)
            .header("content-type", "application/json")
            .body("{not json")
            .send()
            .await
            .unwrap();
        let v = expect_error(r, 400).await;
        assert_eq!(v["error"]["type"], "invalid_request_error");

        let big = chat_body(&"x".repeat(4096), 2, false);
        let v = expect_error(post(&client, chat.clone(), &big).await, 413).await;
        assert!(v["error"]["message"].as_str().unwrap().contains("1024"));

        let mut body = chat_body("hi", 2, false);
        body["n"] = json!(2);
        let v = expect_error(post(&client, chat.clone(), &body).await, 400).await;
        assert_eq!(v["error"]["param"], "n");

        // The engine's own priority: refused unless it schedules by priority (as vLLM).
        for p in [json!(3), json!("high"), json!(1.5), json!(1u64 << 40)] {
            let mut body = chat_body("hi", 2, false);
            body["priority"] = p;
            let v = expect_error(post(&client, chat.clone(), &body).await, 400).await;
            assert_eq!(v["error"]["param"], "priority");
        }
        let mut body = chat_body("hi", 2, false);
        body["priority"] = json!(0);
        assert_eq!(post(&client, chat.clone(), &body).await.status(), 200);

        let ids: Vec<u32> = (0..60).collect();
        let body = json!({"model": "kvroute-sim", "prompt": ids, "max_tokens": 2});
        let v = expect_error(post(&client, cmpl.clone(), &body).await, 413).await;
        assert_eq!(v["error"]["code"], "context_length_exceeded");

        let long_chat = chat_body(&"word ".repeat(60), 2, false);
        expect_error(post(&client, chat.clone(), &long_chat).await, 413).await;

        // 8 blocks of 16 tokens: 40 + 100 tokens do not fit.
        let ids: Vec<u32> = (0..40).collect();
        let body = json!({"model": "kvroute-sim", "prompt": ids, "max_tokens": 100});
        let v = expect_error(post(&client, cmpl.clone(), &body).await, 400).await;
        assert_eq!(v["error"]["code"], "context_length_exceeded");

        let body = json!({"model": "kvroute-sim", "prompt": "hi", "max_tokens": 0});
        expect_error(post(&client, cmpl, &body).await, 400).await;

        let r = client
            .get(format!("{}/v1/nothing", w.url()))
            .send()
            .await
            .unwrap();
        expect_error(r, 404).await;
        let r = client
            .get(format!("{}/v1/chat/completions", w.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["allow"], "POST");
        let v = expect_error(r, 405).await;
        assert_eq!(v["error"]["code"], "method_not_allowed");
        w.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_full_queue_answers_503_with_retry_after() {
    bounded(async {
        let cfg = WorkerConfig {
            max_num_seqs: Some(1),
            max_waiting: Some(1),
            ..config()
        };
        let w = start(cfg, None).await;
        let client = reqwest::Client::new();
        let url = format!("{}/v1/completions", w.url());
        let stream = |first: u32, max: u32| {
            json!({"model": "kvroute-sim", "prompt": [first, 2, 3], "max_tokens": max, "stream": true})
        };
        // A runs (for minutes of real time unless aborted), B waits, C is refused.
        let a = post(&client, url.clone(), &stream(1, 100_000)).await;
        assert_eq!(a.status(), 200);
        let mut a_body = a.bytes_stream();
        a_body.next().await.unwrap().unwrap();
        let b = post(&client, url.clone(), &stream(7, 3)).await;
        assert_eq!(b.status(), 200, "B is queued");
        let c = post(&client, url, &stream(9, 3)).await;
        assert_eq!(c.headers()["retry-after"], "1");
        let v = expect_error(c, 503).await;
        assert_eq!(v["error"]["code"], "queue_full");
        // Dropping A frees the engine for B.
        drop(a_body);
        let (chunks, done) = sse_json(&b.bytes().await.unwrap());
        assert!(done);
        assert_eq!(chunks.len(), 3);
        w.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_client_disconnect_aborts_the_engine_request() {
    bounded(async {
        let w = start(config(), None).await;
        let client = reqwest::Client::new();
        // 100,000 tokens at 10 ms per step and 50x: 20 s of real time if not aborted.
        let body = chat_body(QUESTION, 100_000, true);
        let resp = post(&client, format!("{}/v1/chat/completions", w.url()), &body).await;
        assert_eq!(resp.status(), 200);
        let mut chunks = resp.bytes_stream();
        chunks.next().await.unwrap().unwrap();
        let text = scrape(&client, &w.url()).await;
        assert_eq!(sample(&text, "kvroute_engine_running_requests"), Some(1.0));
        assert_eq!(w.engine_metrics().running, 1);
        drop(chunks);
        let url = w.url();
        let idle = eventually(Duration::from_secs(10), || {
            let client = client.clone();
            let url = url.clone();
            async move {
                let text = scrape(&client, &url).await;
                sample(&text, "kvroute_engine_running_requests") == Some(0.0)
            }
        })
        .await;
        assert!(idle, "the request still runs after its client left");
        w.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn models_health_and_metrics() {
    bounded(async {
        let w = start(config(), None).await;
        let client = reqwest::Client::new();
        let v = kvroute_testkit::get_json(&client, &format!("{}/v1/models", w.url())).await;
        assert_eq!(v["object"], "list");
        assert_eq!(v["data"][0]["id"], "kvroute-sim");
        let h = client
            .get(format!("{}/health", w.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(h.status(), 200);
        assert_eq!(h.json::<Value>().await.unwrap()["status"], "ok");

        let r = post(
            &client,
            format!("{}/v1/completions", w.url()),
            &json!({"model": "kvroute-sim", "prompt": (0..40).collect::<Vec<u32>>(), "max_tokens": 4}),
        )
        .await;
        assert_eq!(r.status(), 200);
        let text = scrape(&client, &w.url()).await;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let parsed = kvroute_protocol::prometheus_text::parse_line(line);
            assert!(parsed.is_some(), "{line:?}");
        }
        assert_eq!(sample(&text, "kvroute_engine_prompt_tokens_total"), Some(40.0));
        assert_eq!(sample(&text, "kvroute_engine_generation_tokens_total"), Some(4.0));
        assert_eq!(sample(&text, "kvroute_engine_kv_blocks"), Some(8192.0));
        assert_eq!(sample(&text, "kvroute_engine_running_requests"), Some(0.0));
        let busy = sample(&text, "kvroute_engine_busy_ratio").unwrap();
        assert!(busy > 0.0 && busy <= 1.0, "{busy}");
        assert!(text.contains("vllm:num_requests_running{model_name=\"kvroute-sim\"} 0"));
        assert!(text.contains("vllm:kv_cache_usage_perc{"));
        w.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn shutdown_ends_streams_in_progress() {
    bounded(async {
        let w = start(config(), None).await;
        let client = reqwest::Client::new();
        let body = chat_body(QUESTION, 100_000, true);
        let resp = post(&client, format!("{}/v1/chat/completions", w.url()), &body).await;
        let mut chunks = resp.bytes_stream();
        let mut all = chunks.next().await.unwrap().unwrap().to_vec();
        let reader = tokio::spawn(async move {
            while let Some(c) = chunks.next().await {
                match c {
                    Ok(c) => all.extend_from_slice(&c),
                    Err(_) => break,
                }
            }
            all
        });
        w.shutdown().await;
        let all = reader.await.unwrap();
        let (json, done) = sse_json(&all);
        assert!(done, "the stream ends with [DONE]");
        assert!(json.last().unwrap()["error"]["message"].is_string());
    })
    .await;
}

#[tokio::test]
async fn the_engine_runs_in_real_time_at_the_speedup() {
    bounded(async {
        let w = start(
            WorkerConfig {
                speedup: 5.0,
                ..config()
            },
            None,
        )
        .await;
        let client = reqwest::Client::new();
        let body = json!({"model": "kvroute-sim", "prompt": [1, 2, 3, 4], "max_tokens": 30});
        let started = std::time::Instant::now();
        let r = post(&client, format!("{}/v1/completions", w.url()), &body).await;
        assert_eq!(r.status(), 200);
        let elapsed = started.elapsed();
        // 29 decode steps of 10 virtual ms after the first token: 290 ms / 5 = 58 ms at least.
        assert!(elapsed >= Duration::from_millis(58), "{elapsed:?}");
        w.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_worker_scheduling_by_priority_takes_the_priority_field() {
    bounded(async {
        let cfg = WorkerConfig {
            scheduling_policy: kvroute_worker::SchedulingPolicy::Priority,
            ..config()
        };
        let w = start(cfg, None).await;
        let client = reqwest::Client::new();
        let chat = format!("{}/v1/chat/completions", w.url());
        for p in [-5, 0, 7] {
            let mut body = chat_body("hi", 2, false);
            body["priority"] = json!(p);
            assert_eq!(
                post(&client, chat.clone(), &body).await.status(),
                200,
                "{p}"
            );
        }
        w.shutdown().await;
    })
    .await;
}
