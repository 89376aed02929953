//! Split requests (disaggregated prefill) through the gateway in vLLM's protocol, against
//! stub engines that record what they were sent: the prefill leg asks for one token,
//! unstreamed, with `kv_transfer_params: {"do_remote_decode": true}`; the parameters its
//! answer returns go unchanged into the decode leg; a failed prefill leg costs the request
//! nothing (the decode worker computes the prompt); `x-kvroute-prefill-worker` names the
//! prefill worker.

use crate::support::*;
use axum::routing::{get, post};
use kvroute_core::policy::DisaggregationMode;
use kvroute_core::WorkerRole;
use kvroute_gateway::GatewayHandle;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

type Seen = Arc<Mutex<Vec<Value>>>;

/// The parameters the stub prefill engine returns (NixlConnector's fields).
fn handoff() -> Value {
    json!({"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [[1, 2]],
           "remote_engine_id": "engine-p", "remote_host": "127.0.0.1", "remote_port": 5600})
}

/// The context state the stub prefill engine returns in TensorRT-LLM's protocol.
fn context_state() -> Value {
    json!({"request_type": "context_only", "first_gen_tokens": [727], "ctx_request_id": 1001,
           "encoded_opaque_state": "AAECAw==", "draft_tokens": null})
}

/// A stub engine recording each request; the prefill one answers `status` with a one-token
/// completion carrying [`handoff`], the decode one a streamed or whole answer.
async fn engine(seen: Seen, prefill: bool, status: u16) -> String {
    let answer = move |axum::Json(body): axum::Json<Value>| {
        seen.lock().unwrap().push(body.clone());
        async move {
            let status = axum::http::StatusCode::from_u16(status).unwrap();
            if prefill {
                // vLLM's parameters, and TensorRT-LLM's context state and prompt ids.
                let a = json!({"id": "cmpl-p", "object": "chat.completion",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "A"}, "finish_reason": "length",
                                 "disaggregated_params": context_state()}],
                    "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21},
                    "prompt_token_ids": [1, 2, 3],
                    "kv_transfer_params": handoff()});
                return (
                    status,
                    [("content-type", "application/json")],
                    a.to_string(),
                );
            }
            if body["stream"] == true {
                let c = json!({"id": "cmpl-d", "choices": [{"index": 0, "delta": {"content": "decoded"}, "finish_reason": "stop"}]});
                let text = format!("data: {c}\n\ndata: [DONE]\n\n");
                return (status, [("content-type", "text/event-stream")], text);
            }
            let a = json!({"id": "cmpl-d", "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "decoded"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21,
                          "prompt_tokens_details": {"cached_tokens": 16}}});
            (
                status,
                [("content-type", "application/json")],
                a.to_string(),
            )
        }
    };
    kvroute_testkit::serve(
        axum::Router::new()
            .route("/v1/chat/completions", post(answer))
            .route("/health", get(|| async { "ok" })),
    )
    .await
}

/// A gateway over a prefill engine answering `prefill_status` and a decode engine, every
/// request split: the two engines' records and the gateway.
async fn pair(prefill_status: u16) -> (Seen, Seen, GatewayHandle) {
    pair_with(prefill_status, |_| {}).await
}

async fn pair_with(
    prefill_status: u16,
    tweak: impl FnOnce(&mut kvroute_gateway::GatewayConfig),
) -> (Seen, Seen, GatewayHandle) {
    let (p_seen, d_seen) = (Seen::default(), Seen::default());
    let mut cfg = config(&[], "goodput");
    cfg.workers = vec![
        kvroute_gateway::WorkerSpec {
            url: engine(p_seen.clone(), true, prefill_status).await,
            name: Some("p".into()),
            role: WorkerRole::Prefill,
            ..kvroute_gateway::WorkerSpec::default()
        },
        kvroute_gateway::WorkerSpec {
            url: engine(d_seen.clone(), false, 200).await,
            name: Some("d".into()),
            role: WorkerRole::Decode,
            ..kvroute_gateway::WorkerSpec::default()
        },
    ];
    cfg.router.disaggregation.mode = DisaggregationMode::Always;
    tweak(&mut cfg);
    let gw = gateway_with_feeds(cfg, Default::default()).await;
    (p_seen, d_seen, gw)
}

async fn ask(url: &str, stream: bool) -> (u16, Option<String>, Option<String>, String) {
    let mut body = chat(&[("user", "Tell me about KV caches")], stream, 32);
    body["stream_options"] = json!({"include_usage": true});
    body["min_tokens"] = json!(2);
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let header = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
    let (worker, prefill) = (
        header("x-kvroute-worker"),
        header("x-kvroute-prefill-worker"),
    );
    (
        r.status().as_u16(),
        worker,
        prefill,
        r.text().await.unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_request_runs_its_prefill_leg_first_and_hands_its_parameters_on() {
    let (p_seen, d_seen, gw) = pair(200).await;
    let url = gw.url();
    for stream in [false, true] {
        let (status, worker, prefill, text) = ask(&url, stream).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(
            (worker.as_deref(), prefill.as_deref()),
            (Some("d"), Some("p"))
        );
        assert!(text.contains("decoded"), "{text}");
        // The prefill leg: one token, unstreamed, the KV kept for a decode elsewhere.
        let p = p_seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(
            (&p["max_tokens"], &p["stream"]),
            (&json!(1), &json!(false)),
            "{p}"
        );
        assert!(
            p.get("stream_options").is_none() && p.get("min_tokens").is_none(),
            "{p}"
        );
        assert_eq!(p["kv_transfer_params"]["do_remote_decode"], true, "{p}");
        // The decode leg: the client's request with the prefill answer's parameters.
        let d = d_seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(d["kv_transfer_params"], handoff(), "{d}");
        assert_eq!(
            (&d["max_tokens"], &d["stream"]),
            (&json!(32), &json!(stream)),
            "{d}"
        );
        assert_eq!(d["min_tokens"], 2, "{d}");
        assert_eq!(d["messages"], p["messages"]);
    }
    let metrics = kvroute_testkit::get_text(&client(), &format!("{url}/metrics")).await;
    let legs = |r: &str| {
        kvroute_testkit::sample(
            &metrics,
            &format!("kvroute_prefill_legs_total{{worker=\"p\",result=\"{r}\"}}"),
        )
    };
    assert_eq!(legs("ok"), Some(2.0));
    // Both legs' bookings were released.
    let w = debug_workers(&url).await;
    assert_eq!(w["pools"]["prefill"]["inflight"], 0, "{w}");
    assert_eq!(w["pools"]["decode"]["inflight"], 0, "{w}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_prefill_leg_leaves_the_prompt_to_the_decode_worker() {
    let (p_seen, d_seen, gw) = pair(500).await;
    let url = gw.url();
    let (status, worker, prefill, text) = ask(&url, false).await;
    assert_eq!(
        (status, worker.as_deref(), prefill),
        (200, Some("d"), None),
        "{text}"
    );
    assert_eq!(p_seen.lock().unwrap().len(), 1);
    // The decode worker got the client's request as it came.
    let d = d_seen.lock().unwrap().last().cloned().unwrap();
    assert!(d.get("kv_transfer_params").is_none(), "{d}");
    let metrics = kvroute_testkit::get_text(&client(), &format!("{url}/metrics")).await;
    assert_eq!(
        kvroute_testkit::sample(
            &metrics,
            r#"kvroute_prefill_legs_total{worker="p",result="failed"}"#
        ),
        Some(1.0)
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglangs_legs_go_at_once_with_one_bootstrap_room() {
    let (p_seen, d_seen, gw) = pair_with(200, |c| {
        c.upstream.kv_transfer = kvroute_fleet::config::KvTransfer::Sglang;
        c.workers[0].bootstrap_port = Some(9100);
    })
    .await;
    let url = gw.url();
    let (status, worker, prefill, text) = ask(&url, false).await;
    assert_eq!(
        (status, worker.as_deref(), prefill.as_deref()),
        (200, Some("d"), Some("p")),
        "{text}"
    );
    assert!(eventually(5, async || !p_seen.lock().unwrap().is_empty()).await);
    let p = p_seen.lock().unwrap()[0].clone();
    let d = d_seen.lock().unwrap()[0].clone();
    // The same request to both, with the prefill server's bootstrap address and one room.
    for leg in [&p, &d] {
        assert_eq!(leg["bootstrap_host"], "127.0.0.1", "{leg}");
        assert_eq!(leg["bootstrap_port"], 9100, "{leg}");
        assert_eq!(
            (&leg["max_tokens"], &leg["stream"]),
            (&json!(32), &json!(false)),
            "{leg}"
        );
        assert!(leg.get("kv_transfer_params").is_none(), "{leg}");
    }
    let room = p["bootstrap_room"].as_u64().unwrap();
    assert_eq!(d["bootstrap_room"].as_u64(), Some(room));
    assert!(room <= i64::MAX as u64);
    // Another request, another room.
    ask(&url, false).await;
    assert!(eventually(5, async || p_seen.lock().unwrap().len() == 2).await);
    assert_ne!(
        p_seen.lock().unwrap()[1]["bootstrap_room"].as_u64(),
        Some(room)
    );
    assert!(
        eventually(5, async || {
            let m = kvroute_testkit::get_text(&client(), &format!("{url}/metrics")).await;
            kvroute_testkit::sample(&m, r#"kvroute_prefill_legs_total{worker="p",result="ok"}"#)
                == Some(2.0)
        })
        .await
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tensorrt_llms_generation_leg_gets_the_context_state() {
    let (p_seen, d_seen, gw) = pair_with(200, |c| {
        c.upstream.kv_transfer = kvroute_fleet::config::KvTransfer::Trtllm;
    })
    .await;
    let (status, worker, prefill, text) = ask(&gw.url(), true).await;
    assert_eq!(
        (status, worker.as_deref(), prefill.as_deref()),
        (200, Some("d"), Some("p")),
        "{text}"
    );
    let p = p_seen.lock().unwrap()[0].clone();
    assert_eq!(
        p["disaggregated_params"],
        json!({"request_type": "context_only"}),
        "{p}"
    );
    assert_eq!(
        (&p["stream"], &p["max_tokens"]),
        (&json!(false), &json!(32)),
        "{p}"
    );
    let d = d_seen.lock().unwrap()[0].clone();
    let mut want = context_state();
    want["request_type"] = json!("generation_only");
    assert_eq!(d["disaggregated_params"], want, "{d}");
    assert_eq!(d["prompt_token_ids"], json!([1, 2, 3]), "{d}");
    assert_eq!(d["stream"], true, "{d}");
    assert!(d.get("kv_transfer_params").is_none(), "{d}");
    gw.shutdown().await;
}
