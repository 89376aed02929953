//! Every engine's event format end to end, over real ZMQ sockets: simulated workers publish
//! in vLLM's, SGLang's or TensorRT-LLM's wire form (`--event-format`), serve a LoRA adapter
//! and take cache salts; the gateway reads whichever form comes without being told, and its
//! prediction for each request equals the cached tokens the engine reports, so requests of
//! another adapter or salt are never predicted cached on the base model's blocks.

use crate::support::*;
use kvroute_gateway::{WorkerSpec, PREDICTED_CACHED_HEADER};
use kvroute_protocol::kv_events::EventFormat;
use kvroute_worker::{WorkerConfig, WorkerHandle, ZmqConfig};
use std::collections::BTreeMap;

async fn zmq_worker(name: &str, format: EventFormat) -> WorkerHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cfg = WorkerConfig {
        model: MODEL.into(),
        profile: "tiny-fast".into(),
        speedup: 20.0,
        worker_name: name.into(),
        event_format: format,
        lora_adapters: vec!["sql".into()],
        ..WorkerConfig::default()
    };
    let zmq = ZmqConfig {
        publish: "tcp://127.0.0.1:0".into(),
        connect: false,
        replay: Some("tcp://127.0.0.1:0".into()),
    };
    kvroute_worker::spawn(
        cfg,
        kvroute_preprocess::Preprocessor::builtin(),
        listener,
        Some(zmq),
    )
    .await
    .unwrap()
}

/// One request: (worker, predicted cached tokens, engine-reported cached tokens).
async fn ask(url: &str, model: &str, salt: Option<&str>, text: &str) -> (String, u64, u64) {
    let mut body = chat(&[("user", text)], false, 2);
    body["model"] = model.into();
    if let Some(s) = salt {
        body["cache_salt"] = s.into();
    }
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let header = |n: &str| r.headers().get(n).unwrap().to_str().unwrap().to_string();
    let worker = header("x-kvroute-worker");
    let predicted: u64 = header(PREDICTED_CACHED_HEADER).parse().unwrap();
    let json: serde_json::Value = r.json().await.unwrap();
    let cached = json["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (worker, predicted, cached)
}

async fn run(format: EventFormat) {
    let (a, b) = (zmq_worker("a", format).await, zmq_worker("b", format).await);
    let mut cfg = config(&[&a, &b], "kv");
    for (spec, w) in cfg.workers.iter_mut().zip([&a, &b]) {
        let (events, replay) = w.zmq_endpoints().unwrap();
        *spec = WorkerSpec {
            url: w.url(),
            name: Some(w.name().to_string()),
            events: Some(events),
            replay: Some(replay),
            ..WorkerSpec::default()
        };
    }
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    // The adapter is learned from the workers' model lists.
    assert!(
        eventually(10, async || {
            let models = kvroute_testkit::get_json(&client(), &format!("{url}/v1/models")).await;
            models.to_string().contains("\"sql\"")
        })
        .await,
        "{format:?}: adapter not learned"
    );
    let doc = "a long shared document about routing caches ".repeat(20);
    let total_blocks = async || index_blocks(&url, 0).await + index_blocks(&url, 1).await;

    // Base model: the first time nothing is cached; the events say where it went.
    let (w1, p1, c1) = ask(&url, MODEL, None, &doc).await;
    assert_eq!((p1, c1), (0, 0), "{format:?}");
    assert!(eventually(10, async || total_blocks().await > 0).await);
    let base_blocks = total_blocks().await;
    // The same prompt again: predicted on the same worker, exactly as the engine reports.
    let (w2, p2, c2) = ask(&url, MODEL, None, &doc).await;
    assert_eq!(w2, w1, "{format:?}");
    assert!(p2 > 0, "{format:?}: nothing predicted");
    assert_eq!(p2, c2, "{format:?}: predicted {p2}, engine cached {c2}");

    // The adapter and a salt: equal tokens, but none of the base model's blocks.
    for (model, salt) in [
        ("sql", None),
        (MODEL, Some("tenant-7")),
        ("sql", Some("tenant-7")),
    ] {
        let (_, p, c) = ask(&url, model, salt, &doc).await;
        assert_eq!((p, c), (0, 0), "{format:?} {model} {salt:?}");
    }
    // Their blocks arrive as blocks of their own namespaces ...
    assert!(eventually(10, async || total_blocks().await >= base_blocks * 4).await);
    // ... and are predicted exactly for the next request of the same adapter and salt.
    for (model, salt) in [
        ("sql", None),
        (MODEL, Some("tenant-7")),
        ("sql", Some("tenant-7")),
        (&format!("{MODEL}:sql") as &str, None),
    ] {
        let (_, p, c) = ask(&url, model, salt, &doc).await;
        assert!(p > 0, "{format:?} {model} {salt:?}: nothing predicted");
        assert_eq!(p, c, "{format:?} {model} {salt:?}");
    }
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_events_with_adapters_and_salts_predict_what_the_engine_caches() {
    run(EventFormat::Vllm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_events_with_adapters_and_salts_predict_what_the_engine_caches() {
    run(EventFormat::Sglang).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trtllm_events_with_adapters_and_salts_predict_what_the_engine_caches() {
    run(EventFormat::Trtllm).await;
}
