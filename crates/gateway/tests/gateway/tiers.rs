//! KV tiers end to end: an engine publishing vLLM events (over real ZMQ) about blocks it moved
//! to host memory (`CPU`) and disk (`STORAGE`), in the offloading connector's bare and full
//! forms; the gateway tracks each tier, routes on the cost of loading blocks back, predicts
//! them cached, and shows them in its explanation, `/debug/workers` and metrics.

use crate::support::*;
use kvroute_core::hashing::EngineHash;
use kvroute_gateway::{WorkerSpec, EXPLAIN_HEADER, PREDICTED_CACHED_HEADER, ROUTE_HEADER};
use kvroute_protocol::kv_events::{
    encode_message, encode_payload, Event, EventFormat, Removed, Stored,
};
use kvroute_testkit::zmq::Publisher;
use std::collections::BTreeMap;

/// The prompt: 8 blocks of 16 tokens and one more token.
fn prompt() -> Vec<u32> {
    (0..8 * 16 + 1).map(|i| 1000 + i).collect()
}

/// Blocks `from..to` of the prompt stored in `medium`: with tokens and parent (`full`), or
/// the engine hashes alone (vLLM's offloading connector by default). Block `i` has engine
/// hash `i + 1`.
fn stored(from: usize, to: usize, medium: &str, full: bool) -> Event {
    let t = prompt();
    Event::Stored(Stored {
        block_hashes: (from..to).map(|i| EngineHash(i as u64 + 1)).collect(),
        parent: (full && from > 0).then_some(EngineHash(from as u64)),
        token_ids: if full {
            t[from * 16..to * 16].to_vec()
        } else {
            Vec::new()
        },
        block_size: if full { 16 } else { 0 },
        medium: Some(medium.into()),
        group_idx: Some(0),
        ..Stored::default()
    })
}

fn removed(from: usize, to: usize, medium: &str) -> Event {
    Event::Removed(Removed {
        block_hashes: (from..to).map(|i| EngineHash(i as u64 + 1)).collect(),
        medium: Some(medium.into()),
        group_idx: Some(0),
    })
}

fn message(seq: u64, events: Vec<Event>) -> [Vec<u8>; 3] {
    encode_message(
        "kv",
        seq,
        encode_payload(EventFormat::Vllm, 1.0, &events, None),
    )
}

/// `/debug/explain` of the prompt: per worker name, (matched, host, disk) blocks, and the
/// winner (workers by name there, their ids those of `/debug/workers`).
async fn explain(url: &str) -> (BTreeMap<String, (u64, u64, u64)>, String) {
    let body = serde_json::json!({"model": MODEL, "prompt": prompt(), "max_tokens": 2});
    let (_, _, ex) = post(url, "/debug/explain", &body).await;
    let ids: BTreeMap<String, u64> = debug_workers(url).await["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let w = &w["worker"];
            (
                w["name"].as_str().unwrap().to_string(),
                w["id"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut out = BTreeMap::new();
    let mut winner = String::new();
    for w in ex["workers"].as_array().unwrap() {
        let name = w["worker"].as_str().unwrap().to_string();
        assert_eq!(
            Some(w["id"].as_u64().unwrap()),
            ids.get(&name).copied(),
            "{ex}"
        );
        let n = |k: &str| w["loadable"][k].as_u64().unwrap();
        out.insert(
            name.clone(),
            (w["matched_blocks"].as_u64().unwrap(), n("host"), n("disk")),
        );
        if w["chosen"] == true {
            assert_eq!(ex["winner"], name.as_str(), "{ex}");
            winner = name;
        }
    }
    (out, winner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offloaded_blocks_are_tracked_per_tier_and_credited_at_their_load_cost() {
    let (a, b) = (worker("a").await, worker("b").await);
    let (pa, pb) = (
        Publisher::bind("tcp://127.0.0.1:0"),
        Publisher::bind("tcp://127.0.0.1:0"),
    );
    let mut cfg = config(&[&a, &b], "predictive");
    for (spec, (w, p)) in cfg.workers.iter_mut().zip([(&a, &pa), (&b, &pb)]) {
        *spec = WorkerSpec {
            url: w.url(),
            name: Some(w.name().to_string()),
            events: Some(p.endpoint.clone()),
            ..WorkerSpec::default()
        };
    }
    // Only the events say what is cached.
    cfg.router.pending_secs = 0.0;
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();

    // a: blocks 0..2 on the device, announced to host memory bare; 2..8 offloaded in full
    // (their device copies evicted). b: blocks 0..4 on the device.
    let first_a = message(0, vec![stored(0, 8, "GPU", true)]);
    let first_b = message(0, vec![stored(0, 4, "GPU", true)]);
    assert!(
        eventually(10, async || {
            pa.send(&first_a);
            pb.send(&first_b);
            index_blocks(&url, 0).await == 8 && index_blocks(&url, 1).await == 4
        })
        .await
    );
    pa.send(&message(
        1,
        vec![
            stored(0, 2, "CPU", false),
            stored(2, 8, "CPU", true),
            removed(2, 8, "GPU"),
        ],
    ));
    assert!(
        eventually(10, async || explain(&url).await.0["a"] == (2, 6, 0)).await,
        "{:?}",
        explain(&url).await
    );
    // a computes 1 token and loads 96 at a tenth of their prefill time; b computes 65.
    let (terms, winner) = explain(&url).await;
    assert_eq!((terms["b"], winner.as_str()), ((4, 0, 0), "a"));
    let w = &debug_workers(&url).await["workers"][0];
    assert_eq!(w["offloaded_blocks"]["host"], 8, "{w}");
    assert_eq!(w["index_blocks"], 2, "{w}");
    let metrics = crate::scrape(&url).await;
    assert!(
        metrics.contains("kvroute_offloaded_blocks{tier=\"host\",worker=\"a\"} 8"),
        "{metrics}"
    );

    // A request asking for its explanation: a serves it, predicted to report all 8 blocks
    // cached (engines count loaded tokens as cached).
    let r = client()
        .post(format!("{url}/v1/completions"))
        .header(EXPLAIN_HEADER, "1")
        .json(&serde_json::json!({"model": MODEL, "prompt": prompt(), "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let h = |n: &str| r.headers().get(n).unwrap().to_str().unwrap().to_string();
    assert_eq!(h("x-kvroute-worker"), "a");
    assert_eq!(h(PREDICTED_CACHED_HEADER), "128");
    let route: serde_json::Value = serde_json::from_str(&h(ROUTE_HEADER)).unwrap();
    assert_eq!(route["workers"][0]["name"], "a", "{route}");
    assert_eq!(route["workers"][0]["host_blocks"], 6, "{route}");
    assert_eq!(route["workers"][0]["uncached_tokens"], 1, "{route}");
    assert!(route["workers"][1].get("host_blocks").is_none(), "{route}");
    let _ = r.text().await.unwrap();

    // Blocks 4..8 move on to disk (bare, resolved through the host tier) and leave host
    // memory: loading them costs more, a still wins (1 + 32 x 0.1 + 64 x 0.4 < 65).
    pa.send(&message(
        2,
        vec![stored(4, 8, "STORAGE", false), removed(4, 8, "CPU")],
    ));
    assert!(eventually(10, async || explain(&url).await.0["a"] == (2, 2, 4)).await);
    assert_eq!(explain(&url).await.1, "a");
    // They leave the disk too: a would compute 65 tokens and load 32; b wins.
    pa.send(&message(3, vec![removed(4, 8, "STORAGE")]));
    assert!(eventually(10, async || explain(&url).await.0["a"] == (2, 2, 0)).await);
    assert_eq!(explain(&url).await.1, "b");

    // Every offloaded event was applied; none ignored.
    let metrics = crate::scrape(&url).await;
    assert!(!metrics.contains("result=\"offloaded\""), "{metrics}");
    assert!(!metrics.contains("result=\"refused\""), "{metrics}");
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

/// A document of about `words` distinct words.
fn doc(topic: &str, words: usize) -> String {
    (0..words).map(|i| format!("{topic}{i} ")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_engine_with_a_host_tier_is_predicted_exactly_after_its_device_lost_a_prefix() {
    // A small device (24 blocks) and a host tier; vLLM's events over real ZMQ, the host
    // tier's as the offloading connector's bare CPU stores.
    let a = zmq_worker_with("a", EventFormat::Vllm, |c| {
        c.num_gpu_blocks = Some(24);
        c.host_blocks = 4096;
    })
    .await;
    let mut cfg = config(&[&a], "predictive");
    let (events, replay) = a.zmq_endpoints().unwrap();
    cfg.workers[0] = WorkerSpec {
        url: a.url(),
        name: Some("a".into()),
        events: Some(events),
        replay: Some(replay),
        ..WorkerSpec::default()
    };
    cfg.router.pending_secs = 0.0;
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    let host = async || {
        debug_workers(&url).await["workers"][0]["offloaded_blocks"]["host"]
            .as_u64()
            .unwrap()
    };
    let first = doc("alpha", 60);
    let (_, _, cached) = ask_cached(&url, MODEL, None, &first).await;
    assert_eq!(cached, 0);
    assert!(eventually(10, async || host().await > 0).await);
    // Two other documents take the device's blocks: the first one's leave the device.
    for other in ["beta", "gamma"] {
        let before = host().await;
        ask_cached(&url, MODEL, None, &doc(other, 60)).await;
        assert!(eventually(10, async || host().await > before).await);
    }
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .header(EXPLAIN_HEADER, "1")
        .json(&chat(&[("user", &first)], false, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let predicted: u64 = r.headers()[PREDICTED_CACHED_HEADER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let route: serde_json::Value =
        serde_json::from_str(r.headers()[ROUTE_HEADER].to_str().unwrap()).unwrap();
    let json: serde_json::Value = r.json().await.unwrap();
    let cached = json["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // The engine loaded the prefix back and reported it cached; the router predicted just
    // that, from the host tier.
    assert!(cached >= 3 * 16, "{json}");
    assert_eq!(predicted, cached, "{route}");
    let w = &route["workers"][0];
    assert!(w["host_blocks"].as_u64().unwrap() > 0, "{route}");
    assert!(
        w["host_blocks"].as_u64().unwrap() > w["matched_blocks"].as_u64().unwrap(),
        "{route}"
    );
    gw.shutdown().await;
    a.shutdown().await;
}
