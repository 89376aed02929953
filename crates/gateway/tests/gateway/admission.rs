//! The admission queue's accounting: every way out of the queue gives its place back.

use crate::health::scrape;
use crate::support::*;
use std::time::Duration;

/// The `kvroute_queued_requests` gauge.
async fn queued(url: &str) -> u64 {
    let text = scrape(url).await;
    kvroute_testkit::sample(&text, "kvroute_queued_requests").map_or(u64::MAX, |v| v as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_give_up_while_queued_leave_the_queue() {
    // At the profile's own speed the long answer below takes about 40 s.
    let a = worker_with("a", |c| c.speedup = 1.0).await;
    let mut cfg = config(&[&a], "kv");
    cfg.router.admission.mode = kvroute_core::AdmissionMode::Queue;
    cfg.router.admission.max_queue_wait_secs = 120.0;
    // Room for 3 waiting: a leaked place would refuse the 4th as `queue_full` forever.
    cfg.router.admission.max_queued_requests = 3;
    cfg.workers[0].max_batch = Some(1);
    let gw = gateway(&[&a], cfg).await;
    let url = gw.url();
    let stream = long_stream(&url).await;
    for round in 0..2 {
        // Three clients queue, then give up and close their connections.
        let waiting: Vec<_> = (0..3)
            .map(|i| {
                let url = url.clone();
                tokio::spawn(async move {
                    let impatient = reqwest::Client::builder()
                        .no_proxy()
                        .timeout(Duration::from_millis(1500))
                        .build()
                        .unwrap();
                    impatient
                        .post(format!("{url}/v1/chat/completions"))
                        .json(&chat(
                            &[("user", &format!("waiting {round} {i}"))],
                            false,
                            2,
                        ))
                        .send()
                        .await
                })
            })
            .collect();
        assert!(
            eventually(10, async || queued(&url).await == 3).await,
            "round {round}: {} queued",
            queued(&url).await
        );
        for w in waiting {
            let r = w.await.unwrap();
            assert!(
                r.is_err(),
                "the client timed out: {:?}",
                r.map(|r| r.status())
            );
        }
        assert!(
            eventually(10, async || queued(&url).await == 0).await,
            "round {round}: {} still counted after their clients left",
            queued(&url).await
        );
    }
    // The worker frees up: a request goes through, none refused for a full queue.
    drop(stream);
    let (status, _, body) = post(
        &url,
        "/v1/chat/completions",
        &chat(&[("user", "after")], false, 2),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let text = scrape(&url).await;
    let full = text
        .lines()
        .find(|l| l.starts_with("kvroute_rejected_requests_total{reason=\"queue_full\"}"));
    assert!(full.is_none_or(|l| l.ends_with(" 0")), "{full:?}");
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_trickles_in_too_slowly_gets_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let a = worker("a").await;
    let mut cfg = config(&[&a], "kv");
    cfg.limits.body_read_timeout_secs = 0.3;
    let gw = gateway(&[&a], cfg).await;
    let mut c = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    // The headers promise 100 bytes; 10 come, then nothing.
    c.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\nconnection: close\r\n\r\n{\"model\":",
    )
    .await
    .unwrap();
    let mut out = String::new();
    let read = tokio::time::timeout(Duration::from_secs(10), c.read_to_string(&mut out)).await;
    assert!(read.is_ok(), "no answer within 10 s");
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    assert!(out.contains("body_timeout"), "{out}");
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_capacity_is_learned_from_its_cache_config_metric() {
    // Two workers without kv_blocks in the gateway's config; the engines publish
    // vllm:cache_config_info with 300 and 500 blocks of 16 tokens.
    let a = worker_with("a", |c| c.num_gpu_blocks = Some(300)).await;
    let b = worker_with("b", |c| c.num_gpu_blocks = Some(500)).await;
    let mut cfg = config(&[&a, &b], "kv");
    cfg.router.block_size = 32;
    cfg.workers[1].kv_blocks = Some(7);
    let gw = gateway_with_feeds(cfg, Default::default()).await;
    let url = gw.url();
    let capacity =
        async |i: usize| debug_workers(&url).await["workers"][i]["capacity"]["kv_blocks"].clone();
    // In the router's blocks of 32 tokens: 300 x 16 / 32.
    assert!(eventually(10, async || capacity(0).await == 150).await);
    // A configured capacity wins over what the engine says.
    assert_eq!(capacity(1).await, 7);
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

/// Prompts are tokenized on the gateway's tokenizing pool only: with its one thread busy and
/// its one place taken, a chat prompt is refused at once with `503 tokenizer_busy` and
/// `Retry-After`, while token-id prompts (no tokenizer) are still served; once the pool is
/// free, chats are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_tokenizing_pool_refuses_chats_with_a_retry_after() {
    let a = worker("a").await;
    let cfg = config(&[&a], "kv");
    let pool = kvroute_preprocess::TokenizePool::new(1, 1).unwrap();
    let pre = kvroute_gateway::load_preprocessor(&cfg)
        .unwrap()
        .with_pool(pool.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let feeds = [(
        0,
        kvroute_gateway::EventFeed::from_broadcast(a.subscribe(), None),
    )]
    .into();
    let gw = kvroute_gateway::spawn(cfg, pre, listener, feeds)
        .await
        .unwrap();
    let url = gw.url();
    let body = chat(&[("user", "hello there")], false, 4);
    let (status, _, _) = post(&url, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200);

    let (release, released) = std::sync::mpsc::channel::<()>();
    let (started, running) = tokio::sync::oneshot::channel::<()>();
    let holder = pool.clone();
    let held = tokio::spawn(async move {
        holder
            .run(move || {
                let _ = started.send(());
                let _ = released.recv();
                Ok(())
            })
            .await
    });
    running.await.unwrap();
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let json: serde_json::Value = r.json().await.unwrap();
    assert_eq!(json["error"]["code"], "tokenizer_busy", "{json}");
    let ids = serde_json::json!({"model": MODEL, "prompt": [1, 2, 3, 4], "max_tokens": 2});
    let (status, _, _) = post(&url, "/v1/completions", &ids).await;
    assert_eq!(status, 200, "token ids need no tokenizer");

    release.send(()).unwrap();
    held.await.unwrap().unwrap();
    let (status, _, _) = post(&url, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    gw.shutdown().await;
    a.shutdown().await;
}

/// A tenant `small` (key `sk-small`) whose bucket holds one request: a second at once is
/// over it; behind `auth.api_keys` (its key accepted beside them).
fn tenants(cfg: &mut kvroute_gateway::GatewayConfig) {
    use kvroute_core::flow::{ClassConfig, FlowConfig};
    cfg.auth.api_keys = vec![kvroute_gateway::config::Secret("sk-gateway".into())];
    cfg.router.admission.flow = FlowConfig {
        classes: vec![ClassConfig {
            name: "interactive".into(),
            band: 1,
            ..ClassConfig::default()
        }],
        tenants: vec![small_tenant()],
        ..FlowConfig::default()
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_quota_gets_429_with_its_wait_and_the_others_do_not() {
    let a = worker("a").await;
    let mut cfg = config(&[&a], "kv");
    tenants(&mut cfg);
    let gw = gateway(&[&a], cfg).await;
    let url = gw.url();
    let body = chat(&[("user", "hello there")], false, 4);
    // The first request is larger than the bucket: it goes on a full bucket, into debt.
    let (status, _, json) = post_as(&url, "sk-small", Some("interactive"), &body).await;
    assert_eq!(status, 200, "{json}");
    let (status, retry, json) = post_as(&url, "sk-small", Some("interactive"), &body).await;
    assert_eq!(status, 429, "{json}");
    assert_eq!(json["error"]["code"], "tenant_limit");
    let secs: u64 = retry.expect("Retry-After").parse().unwrap();
    assert!((1..=60).contains(&secs), "Retry-After {secs}");
    // The gateway's own key is another tenant (the default): not held to `small`'s bucket.
    for _ in 0..3 {
        let (status, _, json) = post_as(&url, "sk-gateway", Some("interactive"), &body).await;
        assert_eq!(status, 200, "{json}");
    }
    // A streamed answer's first token is timed under its class.
    let (status, _, _) = post_as(
        &url,
        "sk-gateway",
        Some("interactive"),
        &chat(&[("user", "stream it")], true, 4),
    )
    .await;
    assert_eq!(status, 200);
    // A key of nobody's is still refused by auth.
    let (status, _, _) = post_as(&url, "sk-nobody", Some("interactive"), &body).await;
    assert_eq!(status, 401);
    let text = scrape(&url).await;
    assert_eq!(
        kvroute_testkit::sample(
            &text,
            "kvroute_flow_refused_total{class=\"interactive\",reason=\"tenant_limit\",tenant=\"small\"}"
        ),
        Some(1.0),
        "{}",
        text.lines().filter(|l| l.contains("flow_refused")).collect::<Vec<_>>().join("\n")
    );
    assert_eq!(
        kvroute_testkit::sample(
            &text,
            "kvroute_class_time_to_first_token_seconds_count{class=\"interactive\"}"
        ),
        Some(1.0)
    );
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_predicted_miss_is_refused_at_once_with_the_predicted_drain_as_its_wait() {
    use kvroute_core::flow::{ClassConfig, FlowConfig, MissAction};
    let a = worker("a").await;
    let mut cfg = config(&[&a], "kv");
    cfg.auth.api_keys = vec![kvroute_gateway::config::Secret("sk-gateway".into())];
    // Before any first token the router assumes 100 prompt tokens a second: a prompt of a
    // few hundred tokens is predicted seconds past a 0.5 s objective.
    cfg.router.policy.predictive.prior_tokens_per_sec = 100.0;
    cfg.router.admission.flow = FlowConfig {
        classes: vec![
            ClassConfig {
                name: "strict".into(),
                ttft_secs: Some(0.5),
                on_predicted_miss: MissAction::Reject,
                ..ClassConfig::default()
            },
            ClassConfig {
                name: "patient".into(),
                ttft_secs: Some(0.5),
                ..ClassConfig::default()
            },
        ],
        ..FlowConfig::default()
    };
    let gw = gateway(&[&a], cfg).await;
    let url = gw.url();
    let words = "a few more words to make the prompt long enough ".repeat(20);
    let body = chat(&[("user", &words)], false, 2);
    let (status, retry, json) = post_as(&url, "sk-gateway", Some("strict"), &body).await;
    assert_eq!(status, 503, "{json}");
    assert_eq!(json["error"]["code"], "predicted_miss");
    // Its wait is the predicted drain (the prediction less the objective), not the 1 s of
    // a refusal that computes none.
    let secs: u64 = retry.expect("Retry-After").parse().unwrap();
    assert!((2..=600).contains(&secs), "Retry-After {secs}");
    // A class that admits predicted misses is served.
    let (status, _, json) = post_as(&url, "sk-gateway", Some("patient"), &body).await;
    assert_eq!(status, 200, "{json}");
    let text = scrape(&url).await;
    assert_eq!(
        kvroute_testkit::sample(
            &text,
            "kvroute_flow_refused_total{class=\"strict\",reason=\"predicted_miss\",tenant=\"default\"}"
        ),
        Some(1.0)
    );
    gw.shutdown().await;
    a.shutdown().await;
}
