//! The NATS event plane against a real `nats-server` (JetStream) started here: simulated
//! engines publish over ZMQ to relays, relays to the stream, gateways read it; a gateway
//! started later builds its index through the relays; a NATS restart loses no event.

use crate::support::*;
use kvroute_events::{zmq_feed, ZmqSubscription};
use kvroute_gateway::GatewayHandle;
use kvroute_plane::{self as plane, PlaneConfig, RelayOptions};
use kvroute_protocol::kv_events::EventFormat;
use kvroute_testkit::nats::NatsServer;
use kvroute_worker::WorkerHandle;
use std::collections::BTreeMap;

fn plane_config(nats: &NatsServer) -> PlaneConfig {
    PlaneConfig {
        url: nats.url(),
        request_timeout_secs: 2.0,
        ..PlaneConfig::default()
    }
}

/// A relay for `w`'s ZMQ events (publisher and replay), as `kvroute relay` runs it.
async fn relay(
    nats: &NatsServer,
    w: &WorkerHandle,
    incarnation: u64,
) -> tokio::task::JoinHandle<u64> {
    let (events, replay) = w.zmq_endpoints().unwrap();
    let feed = zmq_feed(ZmqSubscription {
        worker: w.name().to_string(),
        endpoint: events,
        bind: false,
        replay: Some(replay),
        max_message_bytes: 64 << 20,
        heartbeat_secs: 5.0,
        heartbeat_timeout_secs: 30.0,
        replay_timeout_secs: 2.0,
    })
    .unwrap();
    let plane = plane_config(nats);
    let conn = plane::connect(&plane, "relay").await.unwrap();
    tokio::spawn(plane::run_relay(
        conn.client,
        RelayOptions {
            worker: w.name().to_string(),
            format: EventFormat::Vllm,
            plane,
            incarnation,
            status: Default::default(),
        },
        feed,
    ))
}

/// A gateway whose workers' events all come from the plane.
async fn plane_gateway(nats: &NatsServer, workers: &[&WorkerHandle]) -> GatewayHandle {
    let mut cfg = config(workers, "kv");
    for w in &mut cfg.workers {
        w.events = Some("nats".into());
    }
    cfg.plane = Some(plane_config(nats));
    gateway_with_feeds(cfg, BTreeMap::new()).await
}

/// Blocks the engine holds now.
async fn engine_blocks(w: &WorkerHandle) -> u64 {
    let text = kvroute_testkit::get_text(&client(), &format!("{}/metrics", w.url())).await;
    kvroute_testkit::sample(&text, "kvroute_engine_cached_blocks").unwrap_or(-1.0) as u64
}

/// True once every worker's index on `gw` holds exactly what its engine holds.
async fn mirrors(gw: &GatewayHandle, workers: &[&WorkerHandle]) -> bool {
    for (i, w) in workers.iter().enumerate() {
        let e = engine_blocks(w).await;
        if e == 0 || index_blocks(&gw.url(), i).await != e {
            return false;
        }
    }
    true
}

fn topic(i: usize) -> String {
    format!(
        "conversation {i}: {}",
        "tell me about the plane of events. ".repeat(8)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_read_every_engine_through_relays_and_a_late_one_starts_warm() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let a = zmq_worker("a", EventFormat::Vllm).await;
    let b = zmq_worker("b", EventFormat::Vllm).await;
    let ra = relay(&nats, &a, 1).await;
    let rb = relay(&nats, &b, 2).await;
    let g1 = plane_gateway(&nats, &[&a, &b]).await;
    for i in 0..6 {
        let (status, _, _) = post(
            &g1.url(),
            "/v1/chat/completions",
            &chat(&[("user", &topic(i))], false, 4),
        )
        .await;
        assert_eq!(status, 200);
    }
    assert!(
        eventually(15, async || mirrors(&g1, &[&a, &b]).await).await,
        "gateway 1's index never matched the engines: {}",
        debug_workers(&g1.url()).await
    );
    // A gateway started now builds both indexes through the relays' replay and routes a
    // follow-up to the engine holding its prefix.
    let g2 = plane_gateway(&nats, &[&a, &b]).await;
    assert!(
        eventually(15, async || mirrors(&g2, &[&a, &b]).await).await,
        "gateway 2 did not start warm: {}",
        debug_workers(&g2.url()).await
    );
    let (_, predicted, cached) = ask_cached(&g2.url(), MODEL, None, &topic(3)).await;
    assert!(
        predicted > 0 && cached > 0,
        "predicted {predicted}, cached {cached}"
    );
    // Both gateways keep following live events.
    for i in 6..10 {
        post(
            &g2.url(),
            "/v1/chat/completions",
            &chat(&[("user", &topic(i))], false, 4),
        )
        .await;
    }
    for g in [&g1, &g2] {
        assert!(eventually(15, async || mirrors(g, &[&a, &b]).await).await);
    }
    let w = &debug_workers(&g1.url()).await["workers"][0]["worker"];
    assert_eq!(w["cache_state"], "exact", "{w}");
    ra.abort();
    rb.abort();
    g1.shutdown().await;
    g2.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_restart_loses_no_event() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let a = zmq_worker("a", EventFormat::Vllm).await;
    let ra = relay(&nats, &a, 7).await;
    let g = plane_gateway(&nats, &[&a]).await;
    post(
        &g.url(),
        "/v1/chat/completions",
        &chat(&[("user", &topic(0))], false, 4),
    )
    .await;
    assert!(eventually(15, async || mirrors(&g, &[&a]).await).await);
    let before = index_blocks(&g.url(), 0).await;
    // NATS dies; the engine goes on storing blocks while it is away.
    nats.kill();
    for i in 1..5 {
        let (status, _, _) = post(
            &g.url(),
            "/v1/chat/completions",
            &chat(&[("user", &topic(i))], false, 4),
        )
        .await;
        assert_eq!(status, 200);
    }
    nats.restart();
    assert!(
        eventually(10, async || mirrors(&g, &[&a]).await).await,
        "after the restart the index holds {} blocks, the engine {}: {}\n{}",
        index_blocks(&g.url(), 0).await,
        engine_blocks(&a).await,
        debug_workers(&g.url()).await,
        nats.log()
    );
    assert!(index_blocks(&g.url(), 0).await > before);
    let w = &debug_workers(&g.url()).await["workers"][0]["worker"];
    assert_eq!(w["cache_state"], "exact", "{w}");
    // Live events flow again at once: the gateway's consumer, which the restarted server
    // forgot, was made again on reconnection (not seconds later, after missed heartbeats).
    post(
        &g.url(),
        "/v1/chat/completions",
        &chat(&[("user", &topic(5))], false, 4),
    )
    .await;
    assert!(
        eventually(5, async || mirrors(&g, &[&a]).await).await,
        "live events after the restart: the index holds {} blocks, the engine {}",
        index_blocks(&g.url(), 0).await,
        engine_blocks(&a).await,
    );
    ra.abort();
    g.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_starts_warm_from_a_snapshot_when_the_engine_replay_no_longer_reaches_back() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    // A replay buffer of a few batches: the engine's early history is gone from it.
    let a = zmq_worker_with("a", EventFormat::Vllm, |c| c.replay_buffer_bytes = 4096).await;
    let ra = relay(&nats, &a, 11).await;
    let with_snapshots = |bucket: &str| {
        let mut cfg = config(&[&a], "kv");
        cfg.workers[0].events = Some("nats".into());
        cfg.plane = Some(PlaneConfig {
            snapshot_secs: 0.2,
            snapshot_bucket: bucket.into(),
            ..plane_config(&nats)
        });
        cfg
    };
    let g1 = gateway_with_feeds(with_snapshots("SNAPS"), BTreeMap::new()).await;
    for i in 0..12 {
        let (status, _, _) = post(
            &g1.url(),
            "/v1/chat/completions",
            &chat(&[("user", &topic(i))], false, 4),
        )
        .await;
        assert_eq!(status, 200);
    }
    assert!(eventually(15, async || mirrors(&g1, &[&a]).await).await);
    // Let g1 write the snapshot of what it holds now.
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    let held = engine_blocks(&a).await;
    // Without a snapshot (another bucket), a new gateway gets only what the replay holds.
    let cold = gateway_with_feeds(with_snapshots("NONE"), BTreeMap::new()).await;
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    let cold_blocks = index_blocks(&cold.url(), 0).await;
    assert!(
        cold_blocks < held,
        "the replay buffer still held everything: {cold_blocks} of {held}"
    );
    // With it, the index mirrors the engine.
    let warm = gateway_with_feeds(with_snapshots("SNAPS"), BTreeMap::new()).await;
    assert!(
        eventually(10, async || mirrors(&warm, &[&a]).await).await,
        "warm gateway {} blocks, engine {held}: {}",
        index_blocks(&warm.url(), 0).await,
        debug_workers(&warm.url()).await
    );
    assert!(
        eventually(10, async || debug_workers(&warm.url()).await["workers"][0]
            ["worker"]["cache_state"]
            == "exact")
        .await,
        "{}",
        debug_workers(&warm.url()).await
    );
    assert!(mirrors(&warm, &[&a]).await);
    // And it follows live events from there.
    post(
        &warm.url(),
        "/v1/chat/completions",
        &chat(&[("user", &topic(40))], false, 4),
    )
    .await;
    assert!(eventually(10, async || mirrors(&warm, &[&a]).await).await);
    ra.abort();
    for g in [g1, cold, warm] {
        g.shutdown().await;
    }
    a.shutdown().await;
}
