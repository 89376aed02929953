//! The closed loop on prediction accuracy: a worker whose events are lost without a gap
//! (the simulated engine's `/admin/faults` blanks its live batches; the replay service keeps
//! them) under-predicts; the gateway sees its predictions miss what the engine reports,
//! marks it degraded and rebuilds its index from the replay service, after which its
//! predictions are exact again. Without the repair they stay wrong.

use crate::support::*;
use kvroute_gateway::WorkerSpec;
use kvroute_protocol::kv_events::EventFormat;
use kvroute_worker::WorkerHandle;
use std::collections::BTreeMap;

/// (predicted, engine-reported cached tokens) of one request.
async fn ask(url: &str, text: &str) -> (u64, u64) {
    let (_, predicted, cached) = ask_cached(url, MODEL, None, text).await;
    (predicted, cached)
}

async fn faults(w: &WorkerHandle, blank_live: bool) {
    let r = client()
        .post(format!("{}/admin/faults", w.url()))
        .json(&serde_json::json!({ "blank_live": blank_live }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// A gateway in front of `w` with a short accuracy window, its repair on or off, once its
/// index is exact.
async fn accuracy_gateway(w: &WorkerHandle, repair: bool) -> kvroute_gateway::GatewayHandle {
    let mut cfg = config(&[w], "kv");
    let (events, replay) = w.zmq_endpoints().unwrap();
    cfg.workers[0] = WorkerSpec {
        url: w.url(),
        name: Some("a".into()),
        events: Some(events),
        replay: Some(replay),
        ..WorkerSpec::default()
    };
    // Predictions from events alone (not from prompts just dispatched), a short window.
    cfg.router.pending_secs = 0.0;
    cfg.accuracy.window = 8;
    cfg.accuracy.min_samples = 6;
    cfg.accuracy.repair_cooldown_secs = 0.0;
    cfg.accuracy.repair = repair;
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    assert!(
        eventually(10, async || debug_workers(&url).await["workers"][0]
            ["worker"]["cache_state"]
            == "exact")
        .await
    );
    gw
}

/// Phase 1 loses the events of three prompts asked twice each; phase 2 asks them again.
/// Returns phase 2's (predicted, cached) pairs and the worker's accuracy report.
async fn run(repair: bool) -> (Vec<(u64, u64)>, serde_json::Value, String) {
    let w = zmq_worker("a", EventFormat::Vllm).await;
    let gw = accuracy_gateway(&w, repair).await;
    let url = gw.url();

    faults(&w, true).await;
    let prompts: Vec<String> = (0..3)
        .map(|i| format!("document {i} about caches and routing ").repeat(20))
        .collect();
    for p in &prompts {
        let (p1, c1) = ask(&url, p).await;
        assert_eq!((p1, c1), (0, 0));
        let (p2, c2) = ask(&url, p).await;
        assert!(c2 > 0, "the engine caches the repeat");
        assert_eq!(p2, 0, "its events were lost: nothing predicted");
    }
    faults(&w, false).await;
    if repair {
        assert!(
            eventually(10, async || {
                let d = debug_workers(&url).await;
                let a = &d["workers"][0];
                a["worker"]["accuracy"]["repairs"] == 1 && a["index_blocks"].as_u64() > Some(0)
            })
            .await,
            "{}",
            debug_workers(&url).await
        );
    }
    let mut again = Vec::new();
    for p in &prompts {
        again.push(ask(&url, p).await);
    }
    let report = debug_workers(&url).await["workers"][0]["worker"]["accuracy"].clone();
    let metrics = kvroute_testkit::get_text(&client(), &format!("{url}/metrics")).await;
    gw.shutdown().await;
    w.shutdown().await;
    (again, report, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_lost_without_a_gap_are_found_by_their_predictions_and_repaired() {
    let (again, report, metrics) = run(true).await;
    for (p, c) in &again {
        assert!(*c > 0);
        assert_eq!(p, c, "after the repair the prediction is exact: {again:?}");
    }
    assert_eq!(report["repairs"], 1, "{report}");
    assert_eq!(report["degraded"], serde_json::Value::Null, "{report}");
    assert!(
        metrics.contains(
            "kvroute_prediction_repairs_total{reason=\"under_predicting\",worker=\"a\"} 1"
        ),
        "{metrics}"
    );
    assert!(metrics.contains("kvroute_predictions_total{result=\"under\",worker=\"a\"} 3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_repair_the_lost_events_stay_lost() {
    let (again, report, _) = run(false).await;
    assert!(again.iter().all(|(p, c)| *p == 0 && *c > 0), "{again:?}");
    assert_eq!(report["degraded"], "under_predicting", "{report}");
    assert_eq!(report["repairs"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_the_replay_cannot_complete_keeps_the_index() {
    // The replay keeps two batches: the engine's whole history is gone by the time the
    // predictions degrade, so rebuilding would only lose what the index rightly holds.
    let w = zmq_worker_with("a", EventFormat::Vllm, |c| c.replay_buffer = 2).await;
    let gw = accuracy_gateway(&w, true).await;
    let url = gw.url();
    let kept = "a document whose events arrived ".repeat(20);
    let _ = ask(&url, &kept).await;
    assert!(eventually(10, async || index_blocks(&url, 0).await > 0).await);
    let blocks = index_blocks(&url, 0).await;
    faults(&w, true).await;
    // Four repeats predicted short: half the window (the kept document's first ask is one).
    for i in 0..4 {
        let p = format!("document {i} whose events were lost ").repeat(20);
        let _ = ask(&url, &p).await;
        let _ = ask(&url, &p).await;
    }
    faults(&w, false).await;
    assert!(
        eventually(10, async || debug_workers(&url).await["workers"][0]
            ["worker"]["accuracy"]["repairs"]
            == 1)
        .await
    );
    // Asked for, but not done: the index and its state are as they were.
    let (p, c) = ask(&url, &kept).await;
    assert!(c > 0);
    assert_eq!(p, c, "the kept document is still predicted exactly");
    let d = debug_workers(&url).await;
    assert!(
        d["workers"][0]["index_blocks"].as_u64() >= Some(blocks),
        "{d}"
    );
    assert_eq!(d["workers"][0]["worker"]["cache_state"], "exact", "{d}");
    gw.shutdown().await;
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_without_events_is_learned_to_keep_what_its_cache_holds() {
    // Issue 40: a worker without KV events is tracked from what the gateway sent it, for a
    // TTL up to a fixed cap; its engine keeps an LRU of 64 blocks of 16 tokens. The answers'
    // cached tokens teach the router that size, and its guesses age like the engine's.
    let a = worker_with("a", |c| c.num_gpu_blocks = Some(64)).await;
    let cfg = config(&[&a], "kv");
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    let capacity = async || {
        debug_workers(&url).await["workers"][0]["approx_capacity_blocks"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(
        capacity().await,
        100_000,
        "the configured cap before any answer"
    );
    // Eight conversations of about 16 blocks each, asked round and round: the engine keeps
    // the last four or so, the gateway guessed all eight.
    let texts: Vec<String> = (0..8)
        .map(|i| format!("conversation {i}: ").repeat(40))
        .collect();
    let mut over = Vec::new();
    for round in 0..6 {
        for t in &texts {
            let (_, predicted, cached) = ask_cached(&url, MODEL, None, t).await;
            if predicted > cached + 16 {
                over.push((round, predicted, cached));
            }
        }
    }
    let learned = capacity().await;
    eprintln!("learned {learned} blocks; over-predicted: {over:?}");
    assert!(
        (48..=77).contains(&learned),
        "learned {learned} for an engine of 64"
    );
    // Once learned, the guesses follow the engine: the last rounds predict no more than it
    // finds (within a block).
    assert!(over.iter().all(|(round, ..)| *round < 4), "{over:?}");
    gw.shutdown().await;
    a.shutdown().await;
}
