//! A publisher that goes away and comes back, over real ZMQ sockets: the same engine (its
//! replay service holds the batch applied last) keeps its index and is caught up; a restarted
//! one (another stream) has its index rebuilt; a peer announcing a huge frame is dropped and
//! reconnected, not read; the gateway can bind its SUB socket for engines that connect.

use crate::events::stored_map;
use crate::support::*;
use kvroute_gateway::WorkerSpec;
use kvroute_testkit::zmq::{free_low_port, raw, Publisher, ReplayServer};
use std::collections::BTreeMap;
use std::time::Duration;

/// An engine's two sockets: its PUB and its replay ROUTER.
struct Engine {
    publisher: Option<Publisher>,
    replay: ReplayServer,
}

impl Engine {
    fn start(publish: &str, replay: &str) -> Self {
        Self {
            publisher: Some(Publisher::bind(publish)),
            replay: ReplayServer::bind(replay),
        }
    }

    /// Publishes a batch (held for replay; sent live when `live`).
    fn publish(&self, frames: [Vec<u8>; 3], live: bool) {
        let seq = u64::from_be_bytes(frames[1][..].try_into().unwrap());
        self.replay.hold(seq, frames[2].clone());
        if live {
            self.publisher.as_ref().unwrap().send(&frames);
        }
    }
}

fn worker_json(w: &serde_json::Value) -> &serde_json::Value {
    &w["workers"][0]["worker"]
}

async fn field(url: &str, name: &str) -> serde_json::Value {
    worker_json(&debug_workers(url).await)[name].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_that_comes_back_is_caught_up_or_rebuilt_after_a_restart() {
    let a = worker("a").await;
    // Ports the engine binds again after a restart: below the ephemeral range.
    let engine = Engine::start(
        &format!("tcp://127.0.0.1:{}", free_low_port()),
        &format!("tcp://127.0.0.1:{}", free_low_port()),
    );
    let (pub_ep, replay_ep) = (
        engine.publisher.as_ref().unwrap().endpoint.clone(),
        engine.replay.endpoint.clone(),
    );
    let mut cfg = config(&[&a], "kv");
    cfg.workers[0] = WorkerSpec {
        url: a.url(),
        name: Some("a".into()),
        events: Some(pub_ep.clone()),
        replay: Some(replay_ep.clone()),
        ..WorkerSpec::default()
    };
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    engine.publish(stored_map(0, 1000, 2, None), true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Batch 0 may have gone out before the subscription held: batch 1 then shows the gap,
    // which the replay service fills.
    engine.publish(stored_map(1, 2000, 1, None), true);
    assert!(eventually(10, async || index_blocks(&url, 0).await == 3).await);
    assert_eq!(field(&url, "cache_state").await, "exact");

    // The publisher goes away (the engine lives on: its replay service too).
    let mut engine = engine;
    engine.publisher = None;
    assert!(eventually(10, async || field(&url, "disconnects").await == 1).await);
    assert_eq!(field(&url, "cache_state").await, "unknown");
    assert_eq!(index_blocks(&url, 0).await, 3, "the index is kept");
    // While it was away it published a batch nobody received.
    engine.publish(stored_map(2, 3000, 1, None), false);
    engine.publisher = Some(Publisher::bind(&pub_ep));
    assert!(eventually(10, async || field(&url, "resubscribes").await == 1).await);
    assert!(eventually(10, async || index_blocks(&url, 0).await == 4).await);
    let w = debug_workers(&url).await;
    let w = worker_json(&w);
    assert_eq!(w["cache_state"], "exact", "{w}");
    assert_eq!(w["restarts"], 0, "{w}");

    // Now the engine restarts: a new stream (from 0, other blocks) on the same ports.
    drop(engine);
    assert!(eventually(10, async || field(&url, "disconnects").await == 2).await);
    let engine = Engine::start(&pub_ep, &replay_ep);
    engine.publish(stored_map(0, 5000, 2, None), false);
    assert!(eventually(10, async || field(&url, "restarts").await == 1).await);
    assert!(eventually(10, async || index_blocks(&url, 0).await == 2).await);
    assert_eq!(field(&url, "cache_state").await, "exact");
    // Its next batch follows on live.
    engine.publish(stored_map(1, 6000, 1, None), true);
    assert!(eventually(10, async || index_blocks(&url, 0).await == 3).await);
    assert_eq!(field(&url, "restarts").await, 1);
    let metrics = crate::scrape(&url).await;
    assert_eq!(
        kvroute_testkit::sample(&metrics, "kvroute_kv_event_restarts_total{worker=\"a\"}"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        kvroute_testkit::sample(
            &metrics,
            "kvroute_worker_cache_state{state=\"exact\",worker=\"a\"}"
        ),
        Some(1.0)
    );
    gw.shutdown().await;
    a.shutdown().await;
}

/// Worker `w` with its events from `endpoint` (no replay service).
fn events_from(w: &kvroute_worker::WorkerHandle, endpoint: String) -> WorkerSpec {
    WorkerSpec {
        url: w.url(),
        name: Some(w.name().to_string()),
        events: Some(endpoint),
        ..WorkerSpec::default()
    }
}

/// What a raw publisher does after its handshake.
#[derive(Clone, Copy)]
enum Then {
    /// Announces a frame of 2^62 bytes, then closes after a moment.
    HugeFrame,
    /// Keeps the connection open and never says a word again (no answer to heartbeats):
    /// an engine whose host vanished.
    Silent,
}

/// A raw TCP peer that speaks ZMTP 3.1 as a PUB socket, then does `then`. Counts the
/// connections it accepted.
fn raw_publisher(then: Then) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            raw::handshake(&mut conn, "PUB");
            let mut reader = conn.try_clone().unwrap();
            std::thread::spawn(move || {
                let mut sink = [0u8; 256];
                while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
            });
            match then {
                Then::HugeFrame => {
                    let mut out = raw::frame_header(1 << 62);
                    out.extend_from_slice(&[0u8; 64]);
                    let _ = conn.write_all(&out);
                    std::thread::sleep(Duration::from_millis(200));
                }
                // Held open (and silent) for the rest of the test.
                Then::Silent => std::mem::forget(conn),
            }
        }
    });
    (endpoint, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_announcing_a_huge_frame_is_dropped_and_reconnected_not_read() {
    let a = worker("a").await;
    let (endpoint, accepted) = raw_publisher(Then::HugeFrame);
    let mut cfg = config(&[&a], "kv");
    cfg.workers[0] = events_from(&a, endpoint);
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    // The gateway drops the connection at the frame header and connects again.
    assert!(
        eventually(20, async || accepted
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 3)
        .await
    );
    // Still serving.
    let (status, _, body) = post(
        &url,
        "/v1/chat/completions",
        &chat(&[("user", "still there?")], false, 2),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(index_blocks(&url, 0).await, 0);
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_binds_for_an_engine_that_connects_its_publisher() {
    // A free port for the gateway to bind (the engine connects to it first).
    let port = free_low_port();
    let events = format!("tcp://127.0.0.1:{port}");
    let zmq = kvroute_worker::ZmqConfig {
        publish: events.clone(),
        connect: true,
        replay: Some("tcp://127.0.0.1:0".into()),
    };
    let w = kvroute_worker::spawn(
        kvroute_worker::WorkerConfig {
            model: MODEL.into(),
            profile: "tiny-fast".into(),
            speedup: 20.0,
            worker_name: "w".into(),
            ..Default::default()
        },
        kvroute_preprocess::Preprocessor::builtin(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        Some(zmq),
    )
    .await
    .unwrap();
    let mut cfg = config(&[&w], "kv");
    cfg.workers[0].events = Some(format!("bind:{events}"));
    cfg.workers[0].replay = w.zmq_replay_endpoint();
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    // Until the engine's connection and subscription hold, what it publishes is lost (a
    // later batch shows the gap, which the replay fills): ask until the index shows blocks.
    let system = "A shared system prompt that spans several blocks. ".repeat(12);
    let mut n = 0;
    assert!(
        eventually(10, async || {
            n += 1;
            let user = format!("question {n}");
            let turn = [("system", system.as_str()), ("user", user.as_str())];
            let (status, _, body) =
                post(&url, "/v1/chat/completions", &chat(&turn, false, 2)).await;
            assert_eq!(status, 200, "{body}");
            index_blocks(&url, 0).await > 0
        })
        .await
    );
    assert_eq!(field(&url, "cache_state").await, "exact");
    assert_eq!(
        field(&url, "events_endpoint").await,
        format!("bind:{events}")
    );
    gw.shutdown().await;
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_gone_silent_is_found_by_heartbeats_and_connected_again() {
    let a = worker("a").await;
    let (endpoint, accepted) = raw_publisher(Then::Silent);
    let mut cfg = config(&[&a], "kv");
    cfg.workers[0] = events_from(&a, endpoint);
    cfg.upstream.event_heartbeat_secs = 0.2;
    cfg.upstream.event_heartbeat_timeout_secs = 1.0;
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    // Its connection stays open but answers no heartbeat: the gateway drops it and
    // connects again.
    assert!(
        eventually(20, async || field(&url, "disconnects").await.as_u64()
            >= Some(1))
        .await
    );
    assert!(
        eventually(20, async || accepted
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 2)
        .await
    );
    assert!(
        eventually(20, async || field(&url, "resubscribes").await.as_u64()
            >= Some(1))
        .await
    );
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_bound_sub_socket_refuses_oversized_frames() {
    let a = worker("a").await;
    let port = free_low_port();
    let events = format!("tcp://127.0.0.1:{port}");
    let mut cfg = config(&[&a], "kv");
    cfg.workers[0] = events_from(&a, format!("bind:{events}"));
    cfg.upstream.max_event_message_bytes = 1 << 20;
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    let refused = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        for (size, send) in [(1u64 << 62, 0usize), (64 << 20, 64 << 20)] {
            let mut conn = raw::connect(&events, "PUB");
            let taken = raw::send_frame(&mut conn, size, send);
            let (_, closed) = raw::read_for(&mut conn, Duration::from_secs(5));
            out.push((size, taken, closed));
        }
        out
    })
    .await
    .unwrap();
    for (size, taken, closed) in refused {
        assert!(closed && taken < 64 << 20, "{size}: {taken} bytes taken");
    }
    // Still serving, and a well-formed publisher is still taken: its batch lands.
    let (status, _, body) = post(
        &url,
        "/v1/chat/completions",
        &chat(&[("user", "hi")], false, 2),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let publisher = Publisher::connect(&format!("tcp://127.0.0.1:{port}"));
    assert!(
        eventually(10, async || {
            publisher.send(&stored_map(0, 1000, 2, None));
            index_blocks(&url, 0).await == 2
        })
        .await
    );
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_service_answering_an_oversized_frame_is_a_failed_replay() {
    use std::io::Write;
    let a = worker("a").await;
    // A raw ROUTER that answers every connection's request with a frame of 2^62 bytes.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let replay = format!("tcp://{}", listener.local_addr().unwrap());
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = asked.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            raw::handshake(&mut conn, "ROUTER");
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = conn.write_all(&raw::frame_header(1 << 62));
            let _ = raw::read_for(&mut conn, Duration::from_secs(2));
        }
    });
    let publisher = Publisher::bind("tcp://127.0.0.1:0");
    let mut cfg = config(&[&a], "kv");
    cfg.workers[0] = events_from(&a, publisher.endpoint.clone());
    cfg.workers[0].replay = Some(replay);
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    assert!(
        eventually(20, async || asked.load(std::sync::atomic::Ordering::SeqCst)
            >= 1)
        .await
    );
    // The replay failed: the state says so, and the gateway serves.
    assert!(eventually(20, async || field(&url, "cache_state").await == "unknown").await);
    let (status, _, body) = post(
        &url,
        "/v1/chat/completions",
        &chat(&[("user", "hi")], false, 2),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    gw.shutdown().await;
    a.shutdown().await;
}
