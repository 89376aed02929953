//! Worker roles (disaggregated fleets): a prefill-only worker is never a request's worker,
//! even when it holds the prompt; `/debug/workers` and the metrics show each worker's role
//! and each role's pool; a fleet of prefill workers only refuses requests with a reason.

use crate::support::*;
use kvroute_core::WorkerRole;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_only_worker_serves_no_request_whole_and_the_pools_show() {
    let (a, b) = (worker("a").await, worker("b").await);
    let mut cfg = config(&[&a, &b], "kv");
    cfg.workers[0].role = WorkerRole::Prefill;
    cfg.workers[1].role = WorkerRole::Decode;
    let gw = gateway(&[&a, &b], cfg).await;
    let url = gw.url();
    for i in 0..6 {
        let text = format!("question {i}: {}", "why route by prefix? ".repeat(8));
        let (s, w, j) = post(
            &url,
            "/v1/chat/completions",
            &chat(&[("user", &text)], false, 4),
        )
        .await;
        assert_eq!((s, w.as_deref()), (200, Some("b")), "{j}");
    }
    let d = debug_workers(&url).await;
    assert_eq!(d["workers"][0]["role"], "prefill", "{d}");
    assert_eq!(d["workers"][1]["role"], "decode", "{d}");
    assert_eq!(d["pools"]["prefill"]["workers"], 1, "{d}");
    assert_eq!(d["pools"]["decode"]["workers"], 1, "{d}");
    assert_eq!(d["pools"]["both"]["workers"], 0, "{d}");
    let metrics = kvroute_testkit::get_text(&client(), &format!("{url}/metrics")).await;
    let value = |series: &str| kvroute_testkit::sample(&metrics, series);
    assert_eq!(
        value(r#"kvroute_worker_role{worker="a",role="prefill"}"#),
        Some(1.0)
    );
    assert_eq!(
        value(r#"kvroute_worker_role{worker="a",role="both"}"#),
        Some(0.0)
    );
    assert_eq!(value(r#"kvroute_pool_workers{role="decode"}"#), Some(1.0));
    assert_eq!(
        value(r#"kvroute_pool_inflight_requests{role="prefill"}"#),
        Some(0.0)
    );
    gw.shutdown().await;

    // Prefill workers only: nobody decodes; the answer says so.
    let mut cfg = config(&[&a], "kv");
    cfg.workers[0].role = WorkerRole::Prefill;
    let gw = gateway(&[&a], cfg).await;
    let (s, _, j) = post(
        &gw.url(),
        "/v1/chat/completions",
        &chat(&[("user", "hi")], false, 4),
    )
    .await;
    assert_eq!(s, 503, "{j}");
    assert!(
        j["error"]["message"]
            .as_str()
            .unwrap()
            .contains("prefill-only"),
        "{j}"
    );
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

/// Two simulated workers speaking vLLM's disaggregated protocol behind the gateway: every
/// prompt prefilled on the prefill worker, its KV "moved" to the decode worker, which
/// reports it cached and announces its blocks, so a follow-up is decoded where its prefix
/// is; each worker refuses the leg its role does not serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_workers_speak_vllms_two_legs_in_their_roles() {
    let p = worker_with("p", |c| c.role = WorkerRole::Prefill).await;
    let d = worker_with("d", |c| c.role = WorkerRole::Decode).await;
    let mut cfg = config(&[&p, &d], "goodput");
    cfg.workers[0].role = WorkerRole::Prefill;
    cfg.workers[1].role = WorkerRole::Decode;
    cfg.router.disaggregation.mode = kvroute_core::policy::DisaggregationMode::Always;
    let gw = gateway(&[&p, &d], cfg).await;
    let url = gw.url();
    let history = format!(
        "tell me about routing: {}",
        "prefix caches and KV ".repeat(60)
    );
    let ask = |text: &str| chat(&[("user", text)], false, 8);
    let send = async |body: &serde_json::Value| {
        let r = client()
            .post(format!("{url}/v1/chat/completions"))
            .json(body)
            .send()
            .await
            .unwrap();
        let header = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
        let names = (
            header("x-kvroute-worker"),
            header("x-kvroute-prefill-worker"),
        );
        (
            r.status().as_u16(),
            names,
            r.json::<serde_json::Value>().await.unwrap(),
        )
    };
    let (s, names, j) = send(&ask(&history)).await;
    assert_eq!(s, 200, "{j}");
    assert_eq!(names, (Some("d".into()), Some("p".into())), "{j}");
    let prompt = j["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = j["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached + 16 >= prompt,
        "the KV sent counts as cached: {cached} of {prompt}"
    );
    // The decode worker announced the blocks it was sent: a follow-up is decoded there,
    // its prefix found on the decode worker (the prefill worker lacks the answer).
    assert!(
        eventually(10, async || index_blocks(&url, 1).await * 16 + 16 >= prompt).await,
        "the decode worker's blocks reached the index"
    );
    let follow = format!("{history} and then? {}", "more words ".repeat(10));
    let (s, names, j) = send(&ask(&follow)).await;
    assert_eq!((s, names.0.as_deref()), (200, Some("d")), "{j}");
    let metrics = kvroute_testkit::get_text(&client(), &format!("{url}/metrics")).await;
    assert_eq!(
        kvroute_testkit::sample(
            &metrics,
            r#"kvroute_prefill_legs_total{worker="p",result="ok"}"#
        ),
        Some(2.0)
    );
    // Each worker refuses the leg its role does not serve.
    let leg = |flag: &str| {
        let mut b = ask("hello");
        b["kv_transfer_params"] = serde_json::json!({ flag: true });
        b
    };
    let (s, _, j) = post(&d.url(), "/v1/chat/completions", &leg("do_remote_decode")).await;
    assert_eq!(s, 400, "{j}");
    assert!(
        j["error"]["message"]
            .as_str()
            .unwrap()
            .contains("decodes only"),
        "{j}"
    );
    let (s, _, j) = post(&p.url(), "/v1/chat/completions", &leg("do_remote_prefill")).await;
    assert_eq!(s, 400, "{j}");
    assert!(
        j["error"]["message"]
            .as_str()
            .unwrap()
            .contains("prefills only"),
        "{j}"
    );
    // The prefill leg's answer names where its KV is.
    let (s, _, j) = post(&p.url(), "/v1/chat/completions", &leg("do_remote_decode")).await;
    assert_eq!(s, 200, "{j}");
    assert_eq!(j["kv_transfer_params"]["do_remote_prefill"], true, "{j}");
    assert_eq!(j["kv_transfer_params"]["remote_engine_id"], "p", "{j}");
    gw.shutdown().await;
    p.shutdown().await;
    d.shutdown().await;
}

/// The same with TensorRT-LLM's legs: the context leg's answer hands its state and the
/// prompt's token ids to the generation leg, which the decode worker admits with the KV.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_workers_speak_tensorrt_llms_context_and_generation_legs() {
    let p = worker_with("p", |c| c.role = WorkerRole::Prefill).await;
    let d = worker_with("d", |c| c.role = WorkerRole::Decode).await;
    let mut cfg = config(&[&p, &d], "goodput");
    cfg.workers[0].role = WorkerRole::Prefill;
    cfg.workers[1].role = WorkerRole::Decode;
    cfg.router.disaggregation.mode = kvroute_core::policy::DisaggregationMode::Always;
    cfg.upstream.kv_transfer = kvroute_gateway::config::KvTransfer::Trtllm;
    let gw = gateway(&[&p, &d], cfg).await;
    let prompt = format!("a long prompt: {}", "context then generation ".repeat(50));
    for (path, body) in [
        (
            "/v1/completions",
            serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": 6}),
        ),
        ("/v1/chat/completions", chat(&[("user", &prompt)], false, 6)),
    ] {
        let r = client()
            .post(format!("{}{path}", gw.url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        let header = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
        let names = (
            header("x-kvroute-worker"),
            header("x-kvroute-prefill-worker"),
        );
        assert_eq!(r.status().as_u16(), 200, "{path}");
        assert_eq!(names, (Some("d".into()), Some("p".into())), "{path}");
        let j: serde_json::Value = r.json().await.unwrap();
        assert_eq!(j["usage"]["completion_tokens"], 6, "{j}");
        let n = j["usage"]["prompt_tokens"].as_u64().unwrap();
        let cached = j["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(
            cached + 16 >= n,
            "{path}: the KV sent counts as cached: {cached} of {n}"
        );
    }
    // The context leg alone: one token, the state and the prompt's ids in the answer.
    let ctx = serde_json::json!({"model": MODEL, "prompt": "hello there", "max_tokens": 9,
        "disaggregated_params": {"request_type": "context_only"}});
    let (s, _, j) = post(&p.url(), "/v1/completions", &ctx).await;
    assert_eq!(s, 200, "{j}");
    assert_eq!(j["usage"]["completion_tokens"], 1, "{j}");
    assert_eq!(
        j["choices"][0]["disaggregated_params"]["request_type"], "context_only",
        "{j}"
    );
    assert!(
        j["prompt_token_ids"]
            .as_array()
            .is_some_and(|a| !a.is_empty()),
        "{j}"
    );
    gw.shutdown().await;
    p.shutdown().await;
    d.shutdown().await;
}

/// The same with SGLang's legs: both sent at once; the decode worker waits until the prefill
/// worker (its HTTP port standing for the bootstrap server) hands the room over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_workers_speak_sglangs_legs_through_a_bootstrap_room() {
    let p = worker_with("p", |c| c.role = WorkerRole::Prefill).await;
    let d = worker_with("d", |c| c.role = WorkerRole::Decode).await;
    let mut cfg = config(&[&p, &d], "goodput");
    cfg.workers[0].role = WorkerRole::Prefill;
    cfg.workers[0].bootstrap_port = Some(worker_port(&p));
    cfg.workers[1].role = WorkerRole::Decode;
    cfg.router.disaggregation.mode = kvroute_core::policy::DisaggregationMode::Always;
    cfg.upstream.kv_transfer = kvroute_gateway::config::KvTransfer::Sglang;
    let gw = gateway(&[&p, &d], cfg).await;
    let prompt = format!("a long prompt: {}", "bootstrap rooms pair legs ".repeat(50));
    for stream in [false, true] {
        let r = client()
            .post(format!("{}/v1/chat/completions", gw.url()))
            .json(&chat(&[("user", &prompt)], stream, 6))
            .send()
            .await
            .unwrap();
        let header = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
        let names = (
            header("x-kvroute-worker"),
            header("x-kvroute-prefill-worker"),
        );
        assert_eq!(r.status().as_u16(), 200);
        assert_eq!(names, (Some("d".into()), Some("p".into())));
        let text = r.text().await.unwrap();
        assert!(text.contains("completion"), "{text}");
    }
    // A decode leg whose room is never handed over is not admitted before it is; the room
    // endpoint says which rooms were.
    let status = |room: u64| {
        let url = format!("{}/kvroute/bootstrap/{room}", p.url());
        async move { client().get(url).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status(12345).await, 404);
    let mut leg = chat(&[("user", "hello")], false, 2);
    leg["bootstrap_host"] = serde_json::json!("127.0.0.1");
    leg["bootstrap_port"] = serde_json::json!(worker_port(&p));
    leg["bootstrap_room"] = serde_json::json!(12345);
    let waiting = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        post(&d.url(), "/v1/chat/completions", &leg),
    )
    .await;
    assert!(waiting.is_err(), "admitted before its room was handed over");
    let (s, _, j) = post(&p.url(), "/v1/chat/completions", &leg).await;
    assert_eq!(s, 200, "{j}");
    assert_eq!(status(12345).await, 200);
    let (s, _, j) = post(&d.url(), "/v1/chat/completions", &leg).await;
    assert_eq!(s, 200, "{j}");
    gw.shutdown().await;
    p.shutdown().await;
    d.shutdown().await;
}
