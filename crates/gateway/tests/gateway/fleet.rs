//! Workers joining and leaving a running gateway: directly (`fleet::add` / `fleet::remove`),
//! from a watched file, from a DNS name. Ids are never used twice; a worker that leaves
//! takes its metric series with it.

use crate::support::*;
use kvroute_discovery::{DiscoveryConfig, DnsSource};
use kvroute_fleet::membership as fleet;
use kvroute_gateway::WorkerSpec;
use kvroute_protocol::kv_events::EventFormat;
use std::collections::BTreeMap;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_join_and_leave_while_the_gateway_runs() {
    let a = worker("a").await;
    let b = zmq_worker("b", EventFormat::Vllm).await;
    let gw = gateway(&[&a], config(&[&a], "round_robin")).await;
    let url = gw.url();
    let (events, replay) = b.zmq_endpoints().unwrap();
    let spec = WorkerSpec {
        url: b.url(),
        name: Some("b".into()),
        events: Some(events),
        replay: Some(replay),
        ..WorkerSpec::default()
    };
    let ids = fleet::add(gw.state().fleet(), spec.clone()).unwrap();
    assert_eq!(ids.len(), 1);
    assert_eq!(ids[0].0, 2);
    assert!(matches!(
        fleet::add(gw.state().fleet(), spec.clone()),
        Err(fleet::FleetError::Duplicate(_))
    ));
    assert_eq!(worker_names(&url).await, ["a", "b"]);
    // Round robin over both; b's events reach the index.
    let mut served = std::collections::BTreeSet::new();
    for i in 0..4 {
        let (status, w, _) = post(
            &url,
            "/v1/chat/completions",
            &chat(
                &[("user", &format!("joined {i} {}", "x ".repeat(40)))],
                false,
                2,
            ),
        )
        .await;
        assert_eq!(status, 200);
        served.insert(w.unwrap());
    }
    assert_eq!(served.len(), 2, "{served:?}");
    assert!(eventually(10, async || index_blocks(&url, 1).await > 0).await);
    let metrics = crate::scrape(&url).await;
    assert!(metrics.contains("worker=\"b\""), "{metrics}");
    // b leaves: its series go, every request goes to a.
    assert!(fleet::remove(gw.state().fleet(), ids[0]));
    assert!(!fleet::remove(gw.state().fleet(), ids[0]));
    assert_eq!(worker_names(&url).await, ["a"]);
    let metrics = crate::scrape(&url).await;
    assert!(!metrics.contains("worker=\"b\""), "{metrics}");
    for _ in 0..3 {
        let (status, w, _) = post(
            &url,
            "/v1/chat/completions",
            &chat(&[("user", "after")], false, 2),
        )
        .await;
        assert_eq!((status, w.as_deref()), (200, Some("a")));
    }
    // Back again, under a new id.
    assert_eq!(fleet::add(gw.state().fleet(), spec).unwrap()[0].0, 3);
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

/// Runs `f` on a thread of its own (inside the runtime) and waits for it at most 20 s: a
/// deadlock fails the test instead of hanging it (a stuck thread does not keep the test
/// binary from ending).
async fn within_20s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let handle = tokio::runtime::Handle::current();
    std::thread::spawn(move || {
        let _in_runtime = handle.enter();
        let _ = tx.send(f());
    });
    tokio::time::timeout(std::time::Duration::from_secs(20), rx)
        .await
        .expect("did not return within 20 s: a deadlock")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_the_router_refuses_is_turned_away_and_the_gateway_goes_on() {
    // Issue 39: the refusal was undone while the router's lock of the `if let` that saw it
    // was still held (a second lock of the same mutex, which never returns).
    let a = worker("a").await;
    let b = worker("b").await;
    let mut cfg = config(&[&a], "round_robin");
    cfg.router.max_workers = 1;
    let gw = gateway(&[&a], cfg).await;
    let url = gw.url();
    let fleet = gw.state().fleet().clone();
    let spec = WorkerSpec {
        url: b.url(),
        name: Some("b".into()),
        ..WorkerSpec::default()
    };
    let refused = within_20s(move || fleet::add(&fleet, spec)).await;
    assert!(
        matches!(refused, Err(fleet::FleetError::Route(_))),
        "{refused:?}"
    );
    // Nothing of b is left, and the gateway still serves.
    assert_eq!(worker_names(&url).await, ["a"]);
    let (status, w, _) = post(
        &url,
        "/v1/chat/completions",
        &chat(&[("user", "still here")], false, 2),
    )
    .await;
    assert_eq!((status, w.as_deref()), (200, Some("a")));
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_file_brings_and_takes_workers() {
    let a = worker("a").await;
    let b = worker("b").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("workers.toml");
    let entry = |w: &kvroute_worker::WorkerHandle| {
        format!(
            "[[workers]]\nurl = \"{}\"\nname = \"{}\"\n",
            w.url(),
            w.name()
        )
    };
    std::fs::write(&file, entry(&a)).unwrap();
    let mut cfg = config(&[], "round_robin");
    cfg.discovery = DiscoveryConfig {
        file: Some(file.clone()),
        interval_secs: 0.1,
        ..DiscoveryConfig::default()
    };
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    assert!(eventually(10, async || worker_names(&url).await == ["a"]).await);
    std::fs::write(&file, format!("{}\n{}", entry(&a), entry(&b))).unwrap();
    assert!(eventually(10, async || worker_names(&url).await == ["a", "b"]).await);
    std::fs::write(&file, entry(&b)).unwrap();
    assert!(eventually(10, async || worker_names(&url).await == ["b"]).await);
    // A file that does not parse changes nothing.
    std::fs::write(&file, "[[workers]]\nurl = 7\n").unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(worker_names(&url).await, ["b"]);
    let (status, w, _) = post(
        &url,
        "/v1/chat/completions",
        &chat(&[("user", "hi")], false, 2),
    )
    .await;
    assert_eq!((status, w.as_deref()), (200, Some("b")));
    let ids: Vec<u64> = debug_workers(&url).await["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["worker"]["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [2], "b joined second and keeps its id");
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_name_brings_the_engines_it_resolves_to() {
    let a = worker("a").await;
    let port = worker_port(&a);
    let mut cfg = config(&[], "round_robin");
    cfg.discovery = DiscoveryConfig {
        dns: vec![DnsSource {
            name: "127.0.0.1".into(),
            port,
            ..DnsSource::default()
        }],
        interval_secs: 0.1,
        ..DiscoveryConfig::default()
    };
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    let name = format!("127.0.0.1:{port}");
    assert!(eventually(10, async || worker_names(&url).await == [name.clone()]).await);
    let (status, w, _) = post(
        &url,
        "/v1/chat/completions",
        &chat(&[("user", "hi")], false, 2),
    )
    .await;
    assert_eq!((status, w), (200, Some(name)));
    gw.shutdown().await;
    a.shutdown().await;
}
