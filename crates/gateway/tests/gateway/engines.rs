//! Every engine's event format end to end, over real ZMQ sockets: simulated workers publish
//! in vLLM's, SGLang's or TensorRT-LLM's wire form (`--event-format`), serve a LoRA adapter
//! and take cache salts; the gateway reads whichever form comes without being told, and its
//! prediction for each request equals the cached tokens the engine reports, so requests of
//! another adapter or salt are never predicted cached on the base model's blocks. TensorRT-
//! LLM's HTTP pull API (`events = "poll"`) is polled the same way.

use crate::support::*;
use kvroute_gateway::WorkerSpec;
use kvroute_protocol::kv_events::EventFormat;
use std::collections::BTreeMap;

/// One request: (worker, predicted cached tokens, engine-reported cached tokens).
async fn ask(url: &str, model: &str, salt: Option<&str>, text: &str) -> (String, u64, u64) {
    ask_cached(url, model, salt, text).await
}

/// Runs the scenario with events over ZMQ, or (`poll`) from TensorRT-LLM's pull API, which
/// names salts but no adapters (so only salts are asked then).
async fn run(format: EventFormat, poll: bool) {
    let (a, b) = (zmq_worker("a", format).await, zmq_worker("b", format).await);
    let mut cfg = config(&[&a, &b], "kv");
    for (spec, w) in cfg.workers.iter_mut().zip([&a, &b]) {
        let (events, replay) = w.zmq_endpoints().unwrap();
        *spec = WorkerSpec {
            url: w.url(),
            name: Some(w.name().to_string()),
            events: Some(if poll { "poll".into() } else { events }),
            replay: (!poll).then_some(replay),
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

    let first: &[(&str, Option<&str>)] = if poll {
        &[(MODEL, Some("tenant-7"))]
    } else {
        &[
            ("sql", None),
            (MODEL, Some("tenant-7")),
            ("sql", Some("tenant-7")),
        ]
    };
    // The adapter and a salt: equal tokens, but none of the base model's blocks.
    for &(model, salt) in first {
        let (_, p, c) = ask(&url, model, salt, &doc).await;
        assert_eq!((p, c), (0, 0), "{format:?} {model} {salt:?}");
    }
    // Their blocks arrive as blocks of their own namespaces ...
    let namespaces = 1 + first.len() as u64;
    assert!(
        eventually(10, async || total_blocks().await
            >= base_blocks * namespaces)
        .await
    );
    // ... and are predicted exactly for the next request of the same adapter and salt.
    let sglang_form = format!("{MODEL}:sql");
    let again: &[(&str, Option<&str>)] = if poll {
        &[(MODEL, Some("tenant-7"))]
    } else {
        &[
            ("sql", None),
            (MODEL, Some("tenant-7")),
            ("sql", Some("tenant-7")),
            (&sglang_form, None),
        ]
    };
    for &(model, salt) in again {
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
    run(EventFormat::Vllm, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_events_with_adapters_and_salts_predict_what_the_engine_caches() {
    run(EventFormat::Sglang, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trtllm_events_with_adapters_and_salts_predict_what_the_engine_caches() {
    run(EventFormat::Trtllm, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trtllm_pull_api_events_with_salts_predict_what_the_engine_caches() {
    run(EventFormat::Trtllm, true).await;
}

/// A worker publishing TensorRT-LLM's pull API with room for three events only (more between
/// two polls, 1 s apart, and the oldest are dropped), behind a gateway (`tweak`: its other
/// settings), once its cache state is `exact`; then five prompts between two polls: at least
/// five stored events for a queue of three.
async fn polled_worker_losing_events(
    tweak: impl FnOnce(&mut kvroute_gateway::GatewayConfig),
) -> (kvroute_worker::WorkerHandle, kvroute_gateway::GatewayHandle) {
    let a = worker_with("a", |c| {
        c.event_format = EventFormat::Trtllm;
        c.pull_buffer = 3;
    })
    .await;
    let mut cfg = config(&[&a], "kv");
    cfg.workers[0].events = Some("poll".into());
    cfg.upstream.event_poll_secs = 1.0;
    tweak(&mut cfg);
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    let state = async || debug_workers(&url).await["workers"][0]["worker"].clone();
    assert!(eventually(10, async || state().await["cache_state"] == "exact").await);
    for i in 0..5 {
        ask(&url, MODEL, None, &format!("prompt {i} ").repeat(40)).await;
    }
    (a, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_api_that_dropped_events_is_cleared_and_marked_unknown() {
    let (a, gw) = polled_worker_losing_events(|_| {}).await;
    let url = gw.url();
    let state = async || debug_workers(&url).await["workers"][0]["worker"].clone();
    assert!(
        eventually(10, async || state().await["gaps"] == 1).await,
        "{}",
        state().await
    );
    let w = state().await;
    assert_eq!(w["cache_state"], "unknown", "{w}");
    assert_eq!(w["degraded"], true, "{w}");
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_unknown_after_lost_events_heals_once_predictions_agree_again() {
    // Issue 40: a worker whose events were lost for good stayed `unknown` for ever.
    let (a, gw) = polled_worker_losing_events(|cfg| {
        cfg.accuracy.window = 4;
        cfg.accuracy.min_samples = 2;
    })
    .await;
    let url = gw.url();
    let state = async || debug_workers(&url).await["workers"][0]["worker"].clone();
    assert!(eventually(10, async || state().await["cache_state"] == "unknown").await);
    // A prompt the engine kept from before the loss, whose events were among those lost, is
    // predicted short: no agreement.
    let (_, predicted, cached) = ask(&url, MODEL, None, &"prompt 0 ".repeat(40)).await;
    assert!(predicted < cached, "predicted {predicted}, engine {cached}");
    assert_eq!(state().await["cache_state"], "unknown");
    // New prompts, each asked once its predecessor's events were polled: the index follows
    // the engine again, and a whole window of exact predictions heals it.
    let mut healed = false;
    for i in 0..20 {
        ask(&url, MODEL, None, &format!("new {i} ").repeat(40)).await;
        if state().await["cache_state"] == "exact" {
            healed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    }
    let w = state().await;
    assert!(healed, "{w}");
    let metrics = kvroute_testkit::get_text(&client(), &format!("{url}/metrics")).await;
    assert_eq!(
        kvroute_testkit::sample(&metrics, "kvroute_index_heals_total{worker=\"a\"}"),
        Some(1.0),
        "{metrics}"
    );
    gw.shutdown().await;
    a.shutdown().await;
}
