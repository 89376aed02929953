//! Simulated workers in roles speaking each engine's disaggregated legs behind the gateway
//! (`upstream.kv_transfer`): every prompt prefilled on the prefill worker, its KV "moved" to
//! the decode worker, which reports it cached and announces its blocks; each worker refuses
//! the leg its role does not serve.

use crate::support::*;
use kvroute_core::WorkerRole;
use kvroute_gateway::config::KvTransfer;
use kvroute_gateway::GatewayHandle;
use kvroute_worker::WorkerHandle;
use serde_json::{json, Value};

/// A prefill worker `p`, a decode worker `d`, and a gateway splitting every request over
/// them in `protocol`.
async fn pair(protocol: KvTransfer) -> (WorkerHandle, WorkerHandle, GatewayHandle) {
    let p = worker_with("p", |c| c.role = WorkerRole::Prefill).await;
    let d = worker_with("d", |c| c.role = WorkerRole::Decode).await;
    let mut cfg = config(&[&p, &d], "goodput");
    cfg.workers[0].role = WorkerRole::Prefill;
    // The simulated prefill worker's HTTP port stands for SGLang's bootstrap server.
    cfg.workers[0].bootstrap_port = Some(worker_port(&p));
    cfg.workers[1].role = WorkerRole::Decode;
    cfg.router.disaggregation.mode = kvroute_core::policy::DisaggregationMode::Always;
    cfg.upstream.kv_transfer = protocol;
    let gw = gateway(&[&p, &d], cfg).await;
    (p, d, gw)
}

/// Status, (decode worker, prefill worker) headers and body text of a request to `url`.
async fn send(url: &str, body: &Value) -> (u16, (Option<String>, Option<String>), String) {
    let r = client().post(url).json(body).send().await.unwrap();
    let header = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
    let names = (
        header("x-kvroute-worker"),
        header("x-kvroute-prefill-worker"),
    );
    (r.status().as_u16(), names, r.text().await.unwrap())
}

/// The prompt and cached tokens of a whole answer, checked to count the KV sent as cached.
fn cached_as_sent(text: &str) -> u64 {
    let j: Value = serde_json::from_str(text).unwrap();
    let prompt = j["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = j["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached + 16 >= prompt,
        "the KV sent counts as cached: {cached} of {prompt}"
    );
    prompt
}

async fn stop(p: WorkerHandle, d: WorkerHandle, gw: GatewayHandle) {
    gw.shutdown().await;
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllms_two_legs_move_the_kv_and_a_follow_up_is_decoded_where_it_went() {
    let (p, d, gw) = pair(KvTransfer::Vllm).await;
    let url = format!("{}/v1/chat/completions", gw.url());
    let history = format!(
        "tell me about routing: {}",
        "prefix caches and KV ".repeat(60)
    );
    let ask = |text: &str| chat(&[("user", text)], false, 8);
    let (s, names, text) = send(&url, &ask(&history)).await;
    assert_eq!(s, 200, "{text}");
    assert_eq!(names, (Some("d".into()), Some("p".into())), "{text}");
    let prompt = cached_as_sent(&text);
    // The decode worker announced the blocks it was sent: a follow-up is decoded there,
    // its prefix found on the decode worker (the prefill worker lacks the answer).
    assert!(
        eventually(10, async || index_blocks(&gw.url(), 1).await * 16 + 16
            >= prompt)
        .await,
        "the decode worker's blocks reached the index"
    );
    let follow = format!("{history} and then? {}", "more words ".repeat(10));
    let (s, names, text) = send(&url, &ask(&follow)).await;
    assert_eq!((s, names.0.as_deref()), (200, Some("d")), "{text}");
    let metrics = kvroute_testkit::get_text(&client(), &format!("{}/metrics", gw.url())).await;
    let legs = r#"kvroute_prefill_legs_total{worker="p",result="ok"}"#;
    assert_eq!(kvroute_testkit::sample(&metrics, legs), Some(2.0));
    // Each worker refuses the leg its role does not serve.
    let leg = |flag: &str| {
        let mut b = ask("hello");
        b["kv_transfer_params"] = json!({ flag: true });
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
    stop(p, d, gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tensorrt_llms_context_leg_hands_its_state_and_prompt_to_the_generation_leg() {
    let (p, d, gw) = pair(KvTransfer::Trtllm).await;
    let prompt = format!("a long prompt: {}", "context then generation ".repeat(50));
    for (path, body) in [
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": prompt, "max_tokens": 6}),
        ),
        ("/v1/chat/completions", chat(&[("user", &prompt)], false, 6)),
    ] {
        let (s, names, text) = send(&format!("{}{path}", gw.url()), &body).await;
        assert_eq!(s, 200, "{path}: {text}");
        assert_eq!(names, (Some("d".into()), Some("p".into())), "{path}");
        cached_as_sent(&text);
        assert!(text.contains("\"completion_tokens\":6"), "{text}");
    }
    // The context leg alone: one token, the state and the prompt's ids in the answer.
    let ctx = json!({"model": MODEL, "prompt": "hello there", "max_tokens": 9,
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
    stop(p, d, gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglangs_decode_leg_waits_for_its_bootstrap_room() {
    let (p, d, gw) = pair(KvTransfer::Sglang).await;
    let prompt = format!("a long prompt: {}", "bootstrap rooms pair legs ".repeat(50));
    let url = format!("{}/v1/chat/completions", gw.url());
    for stream in [false, true] {
        let (s, names, text) = send(&url, &chat(&[("user", &prompt)], stream, 6)).await;
        assert_eq!(s, 200, "{text}");
        assert_eq!(names, (Some("d".into()), Some("p".into())));
        assert!(text.contains("completion"), "{text}");
    }
    // A decode leg is not admitted before its room is handed over; the room endpoint says
    // which rooms were.
    let status = |room: u64| {
        let url = format!("{}/kvroute/bootstrap/{room}", p.url());
        async move { client().get(url).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status(12345).await, 404);
    let mut leg = chat(&[("user", "hello")], false, 2);
    leg["bootstrap_host"] = json!("127.0.0.1");
    leg["bootstrap_port"] = json!(worker_port(&p));
    leg["bootstrap_room"] = json!(12345);
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
    stop(p, d, gw).await;
}
