//! Gateway replicas sharing their load over a real `nats-server`: a request booked on one
//! replica counts in every other replica's load for its worker, and is released everywhere
//! when it ends; each replica counts its peers.

use crate::support::*;
use kvroute_gateway::GatewayHandle;
use kvroute_plane::PlaneConfig;
use kvroute_testkit::nats::NatsServer;
use kvroute_worker::WorkerHandle;

async fn replica(nats: &NatsServer, workers: &[&WorkerHandle]) -> GatewayHandle {
    let mut cfg = config(workers, "least_loaded");
    cfg.plane = Some(PlaneConfig {
        url: nats.url(),
        load_heartbeat_secs: 0.2,
        peer_ttl_secs: 1.0,
        ..PlaneConfig::default()
    });
    gateway(workers, cfg).await
}

/// Requests in flight on each worker, as `gw` books them.
async fn booked(gw: &GatewayHandle) -> Vec<u64> {
    debug_workers(&gw.url()).await["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["load"]["inflight"].as_u64().unwrap())
        .collect()
}

async fn metric(gw: &GatewayHandle, name: &str) -> f64 {
    let text = crate::scrape(&gw.url()).await;
    kvroute_testkit::sample(&text, name).unwrap_or(-1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_books_what_the_others_dispatch() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let a = worker("a").await;
    let b = worker("b").await;
    let gws = [
        replica(&nats, &[&a, &b]).await,
        replica(&nats, &[&a, &b]).await,
        replica(&nats, &[&a, &b]).await,
    ];
    for g in &gws {
        assert!(
            eventually(10, async || metric(g, "kvroute_peer_replicas").await == 2.0).await,
            "a replica does not see its two peers"
        );
    }
    // Two long streams through replica 0 (least loaded: one per worker), one through 1.
    let s1 = long_stream(&gws[0].url()).await;
    let s2 = long_stream(&gws[0].url()).await;
    assert!(eventually(10, async || booked(&gws[2]).await == [1, 1]).await);
    let s3 = long_stream(&gws[1].url()).await;
    // Every replica books the same three requests.
    for g in &gws {
        assert!(
            eventually(10, async || booked(g).await.iter().sum::<u64>() == 3).await,
            "{:?}",
            booked(g).await
        );
    }
    let first = booked(&gws[0]).await;
    for g in &gws[1..] {
        assert_eq!(booked(g).await, first);
    }
    assert_eq!(metric(&gws[2], "kvroute_peer_inflight_requests").await, 3.0);
    assert_eq!(metric(&gws[0], "kvroute_inflight_requests").await, 2.0);
    // Ended streams are released everywhere.
    drop((s1, s2, s3));
    for g in &gws {
        assert!(eventually(10, async || booked(g).await == [0, 0]).await);
    }
    // A replica that goes away is expired by the others after its time-to-live.
    let [g0, g1, g2] = gws;
    g2.shutdown().await;
    for g in [&g0, &g1] {
        assert!(eventually(10, async || metric(g, "kvroute_peer_replicas").await == 1.0).await);
    }
    g0.shutdown().await;
    g1.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_joins_at_run_time_is_booked_on_every_replica() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let a = worker("a").await;
    let b = worker("b").await;
    let g0 = replica(&nats, &[&a]).await;
    let g1 = replica(&nats, &[&a]).await;
    for g in [&g0, &g1] {
        assert!(eventually(10, async || metric(g, "kvroute_peer_replicas").await == 1.0).await);
        let spec = kvroute_gateway::WorkerSpec {
            url: b.url(),
            name: Some("b".into()),
            ..kvroute_gateway::WorkerSpec::default()
        };
        kvroute_fleet::membership::add(g.state().fleet(), spec).unwrap();
    }
    // Least loaded: one stream on each worker, both through replica 0.
    let s1 = long_stream(&g0.url()).await;
    let s2 = long_stream(&g0.url()).await;
    assert!(
        eventually(10, async || booked(&g1).await == [1, 1]).await,
        "replica 1 books {:?}",
        booked(&g1).await
    );
    drop((s1, s2));
    assert!(eventually(10, async || booked(&g1).await == [0, 0]).await);
    g0.shutdown().await;
    g1.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}
