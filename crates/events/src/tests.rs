//! Ingestion's paths that the integration tests cannot reach on purpose: a stored snapshot
//! the router refuses; when an unanswering replay service is asked again.

use super::*;
use kvroute_core::{EngineHash, Router, SequenceHash, Tracking, WorkerCapacity};
use kvroute_fleet::clock::Clock;
use kvroute_fleet::config::{GatewayConfig, WorkerSpec};
use std::time::Duration;

/// An index sink over `router` for the workers of `config`, with fresh metrics and clock.
fn sink_for_tests(config: &GatewayConfig, router: Router) -> Arc<IndexSink> {
    let metrics = Arc::new(kvroute_fleet::metrics::Metrics::new().expect("metrics register"));
    let registry = Arc::new(kvroute_fleet::registry::Registry::new(&config.workers));
    let table = Arc::new(kvroute_fleet::table::RoutingTable::new(
        router,
        metrics.queued.clone(),
    ));
    let clock = Clock::starting_now();
    let workers = Arc::new(kvroute_fleet::workers::Workers::new(
        registry.clone(),
        table.clone(),
        metrics.clone(),
        config.accuracy.clone(),
        clock,
    ));
    Arc::new(IndexSink {
        registry,
        table,
        workers,
        metrics,
        clock,
        replay_timeout: Duration::from_secs(1),
    })
}

#[test]
fn a_snapshot_the_router_refuses_leaves_the_index_empty_and_returns() {
    // Issue 39: the refusal was handled (the index cleared, which locks the router) while
    // the router's lock of the `if let` that saw it was still held: it never returned.
    let mut config = GatewayConfig {
        workers: vec![WorkerSpec {
            url: "http://127.0.0.1:9".into(),
            name: Some("w".into()),
            ..WorkerSpec::default()
        }],
        ..GatewayConfig::default()
    };
    // One worker at most, and that place taken by another: worker 1's blocks are refused.
    config.router.max_workers = 1;
    let mut router = Router::new(config.router.clone()).unwrap();
    router
        .add_worker_with(WorkerId(2), WorkerCapacity::default(), Tracking::Events)
        .unwrap();
    let gw = sink_for_tests(&config, router);
    let entry = gw.registry.get(WorkerId(1)).expect("worker 1 configured");
    entry.events.set_last_mark(Some(Mark::from_parts(3, 3)));
    let (tx, rx) = std::sync::mpsc::channel();
    let ingestion = gw.clone();
    std::thread::spawn(move || {
        let mut t = Tracker::default();
        let snap = Snapshot {
            mark: Mark::from_parts(9, 9),
            blocks: vec![(EngineHash(1), SequenceHash(1))],
        };
        load_snapshot(&ingestion, &entry, &mut t, snap);
        let _ = tx.send((t.last, t.next));
    });
    let (last, next) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("load_snapshot did not return within 20 s: a deadlock");
    // Not taken as applied: the start's re-synchronisation replays from the beginning.
    assert_eq!((last, next), (None, None));
    let entry = gw.registry.get(WorkerId(1)).unwrap();
    assert_eq!(entry.events.last_mark(), None);
    assert_eq!(gw.table.read(|r| r.cached_blocks(WorkerId(1))), 0);
}

#[tokio::test(start_paused = true)]
async fn an_unanswering_replay_service_is_asked_again_after_doubling_pauses_until_it_answers() {
    let mut retry = Retry::new(Clock::starting_now());
    let start = tokio::time::Instant::now();
    let mut asked = Vec::new();
    retry.after(Synced::NoAnswer, true);
    for _ in 0..7 {
        retry.due().await;
        asked.push(start.elapsed().as_secs());
        retry.after(Synced::NoAnswer, true);
    }
    // 1, 2, 4, 8, 16, 30 and 30 s apart, on the gateway's (paused) clock.
    assert_eq!(asked, [1, 3, 7, 15, 31, 61, 91]);
    // It answered: nothing is pending, and the next silence begins at 1 s again.
    retry.after(Synced::Same, true);
    let never = Duration::from_secs(3600);
    assert!(tokio::time::timeout(never, retry.due()).await.is_err());
    let t = tokio::time::Instant::now();
    retry.after(Synced::NoAnswer, true);
    retry.due().await;
    assert_eq!(t.elapsed(), Duration::from_secs(1));
    // Without a replay service there is no one to ask.
    retry.after(Synced::NoAnswer, false);
    assert!(tokio::time::timeout(never, retry.due()).await.is_err());
}
