//! Admission, dead workers and metrics.

use crate::support::*;
use kvroute_gateway::{EventFeed, WorkerSpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shed_mode_answers_503_with_retry_after_and_counts_it() {
    let a = worker("a").await;
    let mut cfg = config(&[&a], "kv");
    cfg.router.admission.mode = kvroute_core::AdmissionMode::Shed;
    // One request at a time makes the worker busy.
    cfg.workers[0].max_batch = Some(1);
    let gw = gateway(&[&a], cfg).await;
    let url = gw.url();
    let stream = long_stream(&url).await;
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat(&[("user", "me too")], false, 4))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "all_workers_busy");
    // The stream's first chunk may leave the worker before its engine's next step runs it.
    assert!(eventually(10, async || a.engine_metrics().running == 1).await);
    drop(stream);
    // The client went away: the gateway cancels the upstream request and the engine stops
    // generating for it.
    assert!(eventually(10, async || a.engine_metrics().running == 0).await);
    let metrics = scrape(&url).await;
    assert!(
        metrics.contains("kvroute_rejected_requests_total{reason=\"all_workers_busy\"} 1"),
        "{metrics}"
    );
    // The dropped stream released the worker: requests go through again.
    assert!(
        eventually(10, async || {
            post(
                &url,
                "/v1/chat/completions",
                &chat(&[("user", "again")], false, 2),
            )
            .await
            .0 == 200
        })
        .await
    );
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_taken_out_and_requests_keep_succeeding() {
    let (a, b) = (worker("a").await, worker("b").await);
    let mut cfg = config(&[&a, &b], "round_robin");
    // Only failed requests take the worker out here, not the health checker.
    cfg.health.interval_secs = 3600.0;
    let gw = gateway(&[&a, &b], cfg).await;
    let url = gw.url();
    b.shutdown().await;
    for i in 0..6 {
        let (status, worker, json) = post(
            &url,
            "/v1/chat/completions",
            &chat(&[("user", &format!("q{i}"))], false, 2),
        )
        .await;
        assert_eq!(status, 200, "{json}");
        assert_eq!(worker.as_deref(), Some("a"));
    }
    let workers = debug_workers(&url).await;
    assert_eq!(
        workers["workers"][1]["worker"]["health"], "down",
        "{workers}"
    );
    let metrics = scrape(&url).await;
    assert!(
        metrics.contains("kvroute_worker_up{worker=\"b\"} 0"),
        "{metrics}"
    );
    assert!(metrics.contains("kvroute_retries_total 1"), "{metrics}");
    gw.shutdown().await;
    a.shutdown().await;
}

/// A worker `ghost` at a port nothing listens on (bound then released).
fn ghost() -> WorkerSpec {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    WorkerSpec {
        url: format!("http://{}", l.local_addr().unwrap()),
        name: Some("ghost".into()),
        ..WorkerSpec::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_worker_left_the_answer_is_503_and_health_says_so() {
    let a = worker("a").await;
    let mut cfg = config(&[&a], "kv");
    cfg.workers.push(ghost());
    let gw = gateway(&[&a], cfg).await;
    let url = gw.url();
    assert!(
        eventually(10, async || debug_workers(&url).await["workers"][1]
            ["worker"]["health"]
            == "down")
        .await
    );
    a.shutdown().await;
    // `/health` says none is up; `/ready` stays 200 (the gateway answers for itself) and
    // reports the engines apart.
    assert!(
        eventually(10, async || {
            client()
                .get(format!("{url}/health"))
                .send()
                .await
                .unwrap()
                .status()
                == 503
        })
        .await
    );
    let r = client().get(format!("{url}/ready")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        body["engines"],
        serde_json::json!({"up": 0, "total": 2}),
        "{body}"
    );
    let (status, _, body) = post(
        &url,
        "/v1/chat/completions",
        &chat(&[("user", "anyone?")], false, 2),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "no_healthy_workers");
    let live = client().get(format!("{url}/live")).send().await.unwrap();
    assert_eq!(live.status(), 200);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_ready_without_engines_ready_is_503_until_an_engine_is_up() {
    let mut cfg = config(&[], "kv");
    cfg.workers.push(ghost());
    cfg.health.ready_without_engines = false;
    let gw = gateway_with_feeds(cfg, Default::default()).await;
    let url = gw.url();
    // Taken out after its failed checks.
    let ready = async || {
        let r = client().get(format!("{url}/ready")).send().await.unwrap();
        (
            r.status().as_u16(),
            r.json::<serde_json::Value>().await.unwrap(),
        )
    };
    assert!(eventually(10, async || ready().await.0 == 503).await);
    assert_eq!(ready().await.1["ready"], false);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scraped_metrics_pass_promtool() {
    let a = worker("a").await;
    let gw = gateway(&[&a], config(&[&a], "predictive")).await;
    let url = gw.url();
    for stream in [false, true] {
        let (status, _, _) = post(
            &url,
            "/v1/chat/completions",
            &chat(&[("user", "hi")], stream, 3),
        )
        .await;
        assert_eq!(status, 200);
    }
    let _ = post(
        &url,
        "/v1/chat/completions",
        &serde_json::json!({"model": "x"}),
    )
    .await;
    let text = scrape(&url).await;
    for name in [
        "kvroute_requests_total",
        "kvroute_inflight_requests",
        "kvroute_queued_requests",
        "kvroute_input_tokens_bucket",
        "kvroute_cached_tokens_bucket",
        "kvroute_output_tokens_bucket",
        "kvroute_output_tokens_total",
        "kvroute_request_duration_seconds_bucket",
        "kvroute_time_to_first_token_seconds_bucket",
        "kvroute_inter_token_latency_seconds_bucket",
        "kvroute_worker_inflight_requests",
        "kvroute_worker_outstanding_prefill_tokens",
        "kvroute_routing_decisions_total",
        "kvroute_routing_duration_seconds_bucket",
        "kvroute_kv_events_total",
        "kvroute_index_blocks",
        "kvroute_predicted_cached_tokens_bucket",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    assert!(
        text.contains("kvroute_requests_total{model=\"kvroute-sim\",status=\"200\"} 2"),
        "{text}"
    );
    match std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(mut child) => {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // CI installs promtool and sets this, so the check cannot be skipped there.
        Err(e) if std::env::var_os("KVROUTE_REQUIRE_PROMTOOL").is_none() => {
            eprintln!("promtool not found ({e}); skipping its check");
        }
        Err(e) => panic!("promtool is required: {e}"),
    }
    gw.shutdown().await;
    a.shutdown().await;
}

/// The gateway's `/metrics` text.
pub async fn scrape(url: &str) -> String {
    kvroute_testkit::get_text(&client(), &format!("{url}/metrics")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_comes_back_is_brought_back() {
    let a = worker("a").await;
    let b = worker("b").await;
    let b_addr = b.http_addr();
    let gw = gateway(&[&a, &b], config(&[&a, &b], "round_robin")).await;
    let url = gw.url();
    b.shutdown().await;
    assert!(
        eventually(10, async || debug_workers(&url).await["workers"][1]
            ["worker"]["health"]
            == "down")
        .await
    );
    // The same address answers again.
    let listener = tokio::net::TcpListener::bind(b_addr).await.unwrap();
    let cfg = kvroute_worker::WorkerConfig {
        model: MODEL.into(),
        speedup: 20.0,
        worker_name: "b".into(),
        ..Default::default()
    };
    let b2 = kvroute_worker::spawn(
        cfg,
        kvroute_preprocess::Preprocessor::builtin(),
        listener,
        None,
    )
    .await
    .unwrap();
    assert!(
        eventually(10, async || debug_workers(&url).await["workers"][1]
            ["worker"]["health"]
            == "up")
        .await
    );
    let mut served = std::collections::BTreeSet::new();
    for i in 0..4 {
        let (status, worker, _) = post(
            &url,
            "/v1/chat/completions",
            &chat(&[("user", &format!("q{i}"))], false, 2),
        )
        .await;
        assert_eq!(status, 200);
        served.insert(worker.unwrap());
    }
    assert_eq!(served.len(), 2, "{served:?}");
    gw.shutdown().await;
    a.shutdown().await;
    b2.shutdown().await;
}

/// Two turns of a conversation: the second goes where the first was sent (the router's
/// guess) and finds its prefix cached there.
async fn a_follow_up_lands_on_its_guessed_prefix(url: &str) {
    let system = "A long shared system prompt for every turn. ".repeat(20);
    let turn1 = [("system", system.as_str()), ("user", "first")];
    let (s1, w1, j1) = post(url, "/v1/chat/completions", &chat(&turn1, false, 4)).await;
    assert_eq!(s1, 200, "{j1}");
    let turn2 = [turn1[0], turn1[1], ("assistant", "ok"), ("user", "second")];
    let (s2, w2, j2) = post(url, "/v1/chat/completions", &chat(&turn2, false, 4)).await;
    assert_eq!(s2, 200, "{j2}");
    assert_eq!(
        w1, w2,
        "the follow-up goes where the router sent its prefix"
    );
    assert!(
        j2["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(100),
        "{j2}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_tokenizer_the_gateway_routes_in_approximate_mode() {
    let (a, b) = (worker("a").await, worker("b").await);
    let mut cfg = config(&[&a, &b], "kv");
    cfg.tokenizer = None;
    // No event feeds: the router keeps its own guesses.
    let gw = gateway_with_feeds(cfg, std::collections::BTreeMap::new()).await;
    let url = gw.url();
    a_follow_up_lands_on_its_guessed_prefix(&url).await;
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

/// A stub engine whose `/health` answers at once, or (while `slow` is set) only after the
/// gateway's health timeout.
async fn stub_engine(slow: std::sync::Arc<std::sync::atomic::AtomicBool>) -> String {
    use axum::routing::get;
    kvroute_testkit::serve(axum::Router::new().route(
        "/health",
        get(move || {
            let slow = slow.clone();
            async move {
                if slow.load(std::sync::atomic::Ordering::SeqCst) {
                    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                }
                "ok"
            }
        }),
    ))
    .await
}

fn flag() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_engine_is_taken_out_but_keeps_its_index_and_is_checked_when_back() {
    use kvroute_protocol::kv_events::{decode_message, EventBatch};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let a = worker("a").await;
    let slow = flag();
    let stalled = stub_engine(slow.clone()).await;
    let mut cfg = config(&[&a], "kv");
    cfg.workers.push(WorkerSpec {
        url: stalled,
        name: Some("s".into()),
        ..WorkerSpec::default()
    });
    let frames = crate::events::stored_map(0, 700, 3, None);
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let batch: Arc<EventBatch> = Arc::new(decode_message(&refs).unwrap());
    let asked = Arc::new(AtomicUsize::new(0));
    let (held, count) = (batch.clone(), asked.clone());
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let feed = EventFeed::from_batches(
        rx,
        Some(Box::new(BufferReplay(Arc::new(move |from| {
            count.fetch_add(1, Ordering::SeqCst);
            if from == 0 {
                vec![held.clone()]
            } else {
                Vec::new()
            }
        })))),
    );
    let mut feeds = std::collections::BTreeMap::new();
    feeds.insert(1, feed);
    feeds.insert(0, EventFeed::from_broadcast(a.subscribe(), None));
    let gw = gateway_with_feeds(cfg, feeds).await;
    let url = gw.url();
    tx.send(batch).await.unwrap();
    assert!(eventually(10, async || index_blocks(&url, 1).await == 3).await);
    let s = |v: serde_json::Value| v["workers"][1].clone();

    // The engine stalls: its health checks time out while `a` passes. It is taken out of
    // routing, and its index stays: a stall does not empty a cache.
    slow.store(true, Ordering::SeqCst);
    assert!(
        eventually(15, async || s(debug_workers(&url).await)["worker"]
            ["health"]
            == "down")
        .await
    );
    let w = s(debug_workers(&url).await);
    assert_eq!(w["index_blocks"], 3, "{w}");
    assert_eq!(w["worker"]["cache_state"], "exact", "{w}");
    let before = asked.load(Ordering::SeqCst);

    // Back: in service again, and its stream is checked with the replay service.
    slow.store(false, Ordering::SeqCst);
    assert!(
        eventually(15, async || s(debug_workers(&url).await)["worker"]
            ["health"]
            == "up")
        .await
    );
    assert!(eventually(10, async || asked.load(Ordering::SeqCst) > before).await);
    let w = s(debug_workers(&url).await);
    assert_eq!(w["index_blocks"], 3, "{w}");
    assert_eq!(w["worker"]["restarts"], 0, "{w}");
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_failing_in_the_same_round_do_not_empty_the_fleet() {
    use std::sync::atomic::Ordering;
    let (slow1, slow2) = (flag(), flag());
    let mut cfg = config(&[], "kv");
    cfg.workers = vec![
        WorkerSpec {
            url: stub_engine(slow1.clone()).await,
            name: Some("x".into()),
            ..WorkerSpec::default()
        },
        WorkerSpec {
            url: stub_engine(slow2.clone()).await,
            name: Some("y".into()),
            ..WorkerSpec::default()
        },
    ];
    let gw = gateway_with_feeds(cfg, std::collections::BTreeMap::new()).await;
    let url = gw.url();
    slow1.store(true, Ordering::SeqCst);
    slow2.store(true, Ordering::SeqCst);
    // Several rounds (0.2 s apart, each failing after the 1 s timeout) pass.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let w = debug_workers(&url).await;
    for i in 0..2 {
        assert_eq!(w["workers"][i]["worker"]["health"], "up", "{w}");
    }
    // One recovers: now the other, still failing, is taken out.
    slow1.store(false, Ordering::SeqCst);
    assert!(
        eventually(15, async || debug_workers(&url).await["workers"][1]
            ["worker"]["health"]
            == "down")
        .await
    );
    assert_eq!(
        debug_workers(&url).await["workers"][0]["worker"]["health"],
        "up"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_without_events_are_tracked_approximately_even_with_a_tokenizer() {
    let (a, b) = (worker("a").await, worker("b").await);
    // The builtin tokenizer, and no event source for either worker.
    let cfg = config(&[&a, &b], "kv");
    let gw = gateway_with_feeds(cfg, std::collections::BTreeMap::new()).await;
    let url = gw.url();
    let w = debug_workers(&url).await;
    for i in 0..2 {
        assert_eq!(
            w["workers"][i]["worker"]["cache_state"], "approximate",
            "{w}"
        );
    }
    a_follow_up_lands_on_its_guessed_prefix(&url).await;
    let metrics = crate::scrape(&url).await;
    assert_eq!(
        kvroute_testkit::sample(
            &metrics,
            "kvroute_worker_cache_state{state=\"approximate\",worker=\"a\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}
