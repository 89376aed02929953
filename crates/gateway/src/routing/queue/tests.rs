//! The gateway's admission queue on paused time: arrival order, no overtaking, deadlines to
//! the millisecond, clients that leave, one wake per request that goes.

use super::*;
use crate::error::GatewayError;
use crate::routing::{admit, Prepared};
use kvroute_core::{
    AdmissionMode, BlockSize, BlockedPrompt, Explanation, Namespace, Router, Selection, Tracking,
    WorkerCapacity, WorkerId,
};
use kvroute_fleet::config::{GatewayConfig, WorkerSpec};
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

/// A gateway with one worker that takes `max_batch` requests at a time, configured by
/// `tweak`, and the queue's task running.
fn gateway_with(max_batch: u32, tweak: impl FnOnce(&mut GatewayConfig)) -> Arc<Gateway> {
    let mut config = GatewayConfig {
        workers: vec![WorkerSpec {
            url: "http://127.0.0.1:9".into(),
            name: Some("w".into()),
            max_batch: Some(max_batch),
            ..WorkerSpec::default()
        }],
        ..GatewayConfig::default()
    };
    tweak(&mut config);
    let mut router = Router::new(config.router.clone()).unwrap();
    router
        .add_worker_with(
            WorkerId(1),
            WorkerCapacity {
                kv_blocks: None,
                max_batch: Some(max_batch),
            },
            Tracking::Approximate,
        )
        .unwrap();
    let gw = Gateway::for_tests(config, router);
    tokio::spawn(drive(gw.clone()));
    gw
}

/// A gateway with one worker that takes one request at a time (`max_batch` 1), requests
/// waiting at most `wait_secs`, and the queue's task running.
fn gateway(wait_secs: f64) -> Arc<Gateway> {
    gateway_with(1, |config| {
        config.router.admission.mode = AdmissionMode::Queue;
        config.router.admission.max_queue_wait_secs = wait_secs;
    })
}

fn prompt(n: u32) -> Prepared {
    let tokens: Vec<u32> = (0..64).map(|i| i * 7 + n).collect();
    Prepared {
        identity: Default::default(),
        prompt: BlockedPrompt::new(&tokens, BlockSize::new(16).unwrap(), Namespace::default()),
        session: None,
    }
}

type Admission = Result<(Selection, LedgerGuard, Option<Explanation>), GatewayError>;

/// Admits prompt `n` on a task of its own.
fn spawn_admit(gw: &Arc<Gateway>, n: u32) -> tokio::task::JoinHandle<Admission> {
    let gw = gw.clone();
    tokio::spawn(
        async move { admit(&gw, &prompt(n), &kvroute_core::ANY_WORKER, false, gw.now()).await },
    )
}

/// Lets every other task run until the queue holds `n` requests.
async fn until_queued(gw: &Gateway, n: usize) {
    for _ in 0..1_000 {
        if gw.queue_state().requests == n {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("{} queued, not {n}", gw.queue_state().requests);
}

/// Lets the other tasks run a while without moving the clock.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn requests_go_in_arrival_order_and_a_new_one_waits_behind_them() {
    let gw = gateway(60.0);
    let (_, first, _) = admit(&gw, &prompt(0), &kvroute_core::ANY_WORKER, false, gw.now())
        .await
        .unwrap();
    let waiting: Vec<_> = (1..=3)
        .map(|n| {
            let h = spawn_admit(&gw, n);
            (n, h)
        })
        .collect();
    until_queued(&gw, 3).await;
    // The worker frees up; before the queue's task runs, a new request comes: it must not
    // take the free worker ahead of the three waiting.
    drop(first);
    let late_prompt = prompt(9);
    let mut late = Box::pin(admit(
        &gw,
        &late_prompt,
        &kvroute_core::ANY_WORKER,
        false,
        gw.now(),
    ));
    let polled = std::future::poll_fn(|cx| Poll::Ready(late.as_mut().poll(cx).is_ready())).await;
    assert!(!polled, "the new request overtook the queue");
    assert_eq!(gw.queue_state().requests, 4);
    // Each release lets exactly the head go, in arrival order.
    let mut guards = Vec::new();
    for (n, h) in waiting {
        let (sel, guard, _) = h.await.unwrap().unwrap();
        assert_eq!(sel.worker, WorkerId(1), "request {n}");
        settle().await;
        assert_eq!(
            gw.queue_state().requests,
            4 - n as usize,
            "after request {n} went, the others still wait"
        );
        guards.push(guard);
        drop(guards.remove(0));
    }
    let (_, guard, _) = Pin::new(&mut late).await.unwrap();
    assert_eq!(gw.queue_state().requests, 0);
    drop(guard);
    assert_eq!(
        gw.table.read(|r| r.ledger().inflight()),
        0,
        "every booking released"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiting_request_is_refused_at_its_deadline_to_the_millisecond() {
    let gw = gateway(2.0);
    let (_, _busy, _) = admit(&gw, &prompt(0), &kvroute_core::ANY_WORKER, false, gw.now())
        .await
        .unwrap();
    let t0 = gw.now();
    let waiting = spawn_admit(&gw, 1);
    until_queued(&gw, 1).await;
    tokio::time::sleep(Duration::from_millis(1_999)).await;
    settle().await;
    assert!(!waiting.is_finished(), "refused before its deadline");
    let r = waiting.await.unwrap();
    assert!(
        matches!(r, Err(GatewayError::Rejected(RejectReason::QueueTimeout))),
        "{:?}",
        r.err()
    );
    assert_eq!(gw.clock.since(t0), Duration::from_secs(2));
    assert_eq!(gw.queue_state().requests, 0);
    let refused = gw
        .metrics
        .rejected
        .with_label_values(&["queue_timeout"])
        .get();
    assert_eq!(refused, 1);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_gives_its_place_back_and_the_next_one_goes() {
    let gw = gateway(60.0);
    let (_, busy, _) = admit(&gw, &prompt(0), &kvroute_core::ANY_WORKER, false, gw.now())
        .await
        .unwrap();
    let leaving = spawn_admit(&gw, 1);
    until_queued(&gw, 1).await;
    let staying = spawn_admit(&gw, 2);
    until_queued(&gw, 2).await;
    leaving.abort();
    assert!(leaving.await.is_err_and(|e| e.is_cancelled()));
    assert_eq!(
        gw.queue_state().requests,
        1,
        "its place is given back at once"
    );
    assert_eq!(gw.metrics.queued.get(), 1);
    drop(busy);
    let (_, guard, _) = staying.await.unwrap().unwrap();
    assert_eq!(gw.queue_state().requests, 0);
    assert_eq!(gw.table.read(|r| r.ledger().inflight()), 1);
    drop(guard);
    assert_eq!(gw.table.read(|r| r.ledger().inflight()), 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_left_while_it_was_being_booked_is_released() {
    // The queue's task books the head and sends it its worker; the head's client has left
    // in between (the booking lands in a closed channel): the booking must not leak.
    let gw = gateway(60.0);
    let (_, busy, _) = admit(&gw, &prompt(0), &kvroute_core::ANY_WORKER, false, gw.now())
        .await
        .unwrap();
    let head_prompt = prompt(1);
    let mut head = Box::pin(admit(
        &gw,
        &head_prompt,
        &kvroute_core::ANY_WORKER,
        false,
        gw.now(),
    ));
    let polled = std::future::poll_fn(|cx| Poll::Ready(head.as_mut().poll(cx).is_ready())).await;
    assert!(!polled);
    drop(busy);
    // A pass now books the head on the free worker ...
    assert_eq!(drain(&gw), None);
    assert_eq!(gw.table.read(|r| r.ledger().inflight()), 1);
    // ... whose client leaves before reading the answer.
    drop(head);
    assert_eq!(gw.table.read(|r| r.ledger().inflight()), 0);
    assert_eq!(gw.queue_state().requests, 0);
    let (_, again, _) = admit(&gw, &prompt(2), &kvroute_core::ANY_WORKER, false, gw.now())
        .await
        .unwrap();
    drop(again);
}

#[tokio::test(start_paused = true)]
async fn a_bursts_later_request_waits_for_its_turn_after_the_peers_bookings() {
    // Issue 40 item 4: with a peer sharing its bookings 10 ms late, a second request
    // within 10 ms of the first is held until the peers' bookings of the burst are in: this
    // replica (id 5) ranks after its peer (id 1), so its turn is two sync delays on.
    let gw = gateway_with(8, |config| {
        config.router.admission.mode = AdmissionMode::None;
        config.router.peer_hold_secs = 0.010;
    });
    gw.table.update(|r| r.set_replica(5));
    gw.table.update(|r| r.peer_seen(1, gw.now())).unwrap();
    let start = tokio::time::Instant::now();
    let (_, _first, _) = admit(&gw, &prompt(0), &kvroute_core::ANY_WORKER, false, gw.now())
        .await
        .unwrap();
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "a burst's first goes at once"
    );
    assert_eq!(gw.metrics.peer_hold.get_sample_count(), 0);
    let (_, _second, _) = admit(&gw, &prompt(1), &kvroute_core::ANY_WORKER, false, gw.now())
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(20));
    // Counted, with the time it waited.
    assert_eq!(gw.metrics.peer_hold.get_sample_count(), 1);
    assert!((gw.metrics.peer_hold.get_sample_sum() - 0.020).abs() < 1e-9);
}

/// Flows: `high` (band 1, a 2 s objective) above the default class; tenant `small` with a
/// bucket of 100 tokens refilled at 10 per second.
fn flow_gateway() -> Arc<Gateway> {
    use kvroute_core::flow::{ClassConfig, FlowConfig, TenantConfig};
    gateway_with(1, |config| {
        config.router.admission.max_queue_wait_secs = 60.0;
        config.router.admission.flow = FlowConfig {
            classes: vec![ClassConfig {
                name: "high".into(),
                band: 1,
                ttft_secs: Some(2.0),
                ..ClassConfig::default()
            }],
            tenants: vec![TenantConfig {
                name: "small".into(),
                tokens_per_sec: Some(10.0),
                burst_tokens: Some(100),
                ..TenantConfig::default()
            }],
            ..FlowConfig::default()
        };
    })
}

fn prompt_of(gw: &Gateway, n: u32, tenant: &str, class: &str) -> Prepared {
    let mut p = prompt(n);
    p.identity.flow = gw.flows().flow_of(Some(tenant), Some(class));
    p.identity.objective = gw
        .flows()
        .class(p.identity.flow.class)
        .ttft_secs
        .map(Duration::from_secs_f64);
    p
}

#[tokio::test(start_paused = true)]
async fn a_higher_band_goes_first_and_its_objective_ends_its_wait() {
    let gw = flow_gateway();
    let (_, busy, _) = admit(&gw, &prompt(0), &kvroute_core::ANY_WORKER, false, gw.now())
        .await
        .unwrap();
    let low = {
        let (gw, p) = (gw.clone(), prompt_of(&gw, 1, "a", "default"));
        tokio::spawn(
            async move { admit(&gw, &p, &kvroute_core::ANY_WORKER, false, gw.now()).await },
        )
    };
    until_queued(&gw, 1).await;
    let high = {
        let (gw, p) = (gw.clone(), prompt_of(&gw, 2, "b", "high"));
        tokio::spawn(
            async move { admit(&gw, &p, &kvroute_core::ANY_WORKER, false, gw.now()).await },
        )
    };
    until_queued(&gw, 2).await;
    // The worker frees up: the later, higher band goes first.
    drop(busy);
    let (_, high_guard, _) = high.await.unwrap().unwrap();
    settle().await;
    assert_eq!(gw.queue_state().requests, 1, "the low band still waits");
    drop(high_guard);
    let (_, low_guard, _) = low.await.unwrap().unwrap();
    // A high-band request waits no longer than its 2 s objective: `deadline`.
    let late = {
        let (gw, p) = (gw.clone(), prompt_of(&gw, 3, "b", "high"));
        tokio::spawn(
            async move { admit(&gw, &p, &kvroute_core::ANY_WORKER, false, gw.now()).await },
        )
    };
    until_queued(&gw, 1).await;
    let asked = gw.now();
    let refused = late.await.unwrap();
    assert!(
        matches!(refused, Err(GatewayError::Rejected(RejectReason::Deadline))),
        "{:?}",
        refused.map(|_| ())
    );
    assert_eq!(gw.now().since(asked), Duration::from_secs(2));
    drop(low_guard);
    let refused =
        |t: &str, c: &str, r: &str| gw.metrics.flow_refused.with_label_values(&[t, c, r]).get();
    // Tenants `a` and `b` are not configured: both count as `default`.
    assert_eq!(refused("default", "high", "deadline"), 1);
    assert_eq!(refused("default", "default", "deadline"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_tenant_over_its_bucket_is_refused_429_with_its_wait_and_others_are_not() {
    let gw = flow_gateway();
    // 64 prompt tokens + 36 output: the whole bucket of 100.
    let mut first = prompt_of(&gw, 1, "small", "default");
    first.identity.output = 36;
    let held = crate::routing::enter(&gw, &first).unwrap();
    let mut second = prompt_of(&gw, 2, "small", "default");
    second.identity.output = 36;
    let e = crate::routing::enter(&gw, &second).err().unwrap();
    let api = e.to_api();
    assert_eq!(api.status(), 429);
    assert_eq!(api.code.as_deref(), Some("tenant_limit"));
    // 100 tokens at 10 per second.
    assert_eq!(api.retry_after_secs, Some(10));
    // Another tenant is not held to it.
    let other = prompt_of(&gw, 3, "someone", "default");
    assert!(crate::routing::enter(&gw, &other).is_ok());
    // Never dispatched: all of it back.
    drop(held);
    assert!(crate::routing::enter(&gw, &second).is_ok());
}
