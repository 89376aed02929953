//! The routing table's locks: taken in one order, never re-entered, the queue's size
//! published, its task rung only when requests wait.

use super::RoutingTable;
use kvroute_core::{Router, RouterConfig, WorkerCapacity, WorkerId};
use prometheus::IntGauge;
use std::panic::{catch_unwind, AssertUnwindSafe};

fn table() -> RoutingTable<u32> {
    let router = Router::new(RouterConfig::default()).unwrap();
    RoutingTable::new(router, IntGauge::new("queued", "queued").unwrap())
}

fn panic_text(f: impl FnOnce()) -> String {
    let err = catch_unwind(AssertUnwindSafe(f)).expect_err("must panic, not hang");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn the_router_taken_again_inside_its_own_lock_panics_instead_of_hanging() {
    let t = table();
    let text = panic_text(|| {
        t.update(|_| t.read(|r| r.block_size()));
    });
    assert!(text.contains("Router lock taken again"), "{text}");
    // The thread's record of held locks is let go on unwind: the table works on.
    t.update(|r| r.add_worker(WorkerId(1), WorkerCapacity::default()))
        .unwrap();
    assert_eq!(t.read(|r| r.ledger().worker_count()), 1);
}

#[test]
fn the_queue_taken_while_the_router_is_held_panics() {
    let t = table();
    let text = panic_text(|| {
        t.read(|_| t.queue_state());
    });
    assert!(
        text.contains("Queue lock taken while holding the Router lock"),
        "{text}"
    );
    // The documented order is fine, and so is each lock alone, one after the other.
    let state = t.with_both(|q, r| {
        r.block_size();
        q.state()
    });
    assert_eq!(state, t.queue_state());
}

#[test]
fn the_queue_taken_again_inside_its_own_lock_panics() {
    let t = table();
    let text = panic_text(|| {
        t.with_queue(|_| t.with_queue(|q| q.len()));
    });
    assert!(text.contains("Queue lock taken again"), "{text}");
}

#[test]
fn the_queue_size_is_published_and_rings_only_when_requests_wait() {
    let gauge = IntGauge::new("queued", "queued").unwrap();
    let t: RoutingTable<u32> =
        RoutingTable::new(Router::new(RouterConfig::default()).unwrap(), gauge.clone());
    assert!(!t.has_waiting());
    t.released();
    let rung = t.rung();
    tokio::pin!(rung);
    // Nothing waits: released() stored no ring.
    assert!(futures_util::FutureExt::now_or_never(rung.as_mut()).is_none());
    let admission = kvroute_core::AdmissionConfig::default();
    t.with_queue(|q| {
        q.push(
            &admission,
            kvroute_core::Time::ZERO,
            kvroute_core::admission::queue::Ask {
                tokens: 10,
                ..Default::default()
            },
            7,
        )
        .map_err(|(reason, _)| reason)
        .unwrap();
    });
    assert!(t.has_waiting());
    assert_eq!(gauge.get(), 1);
    t.released();
    assert!(futures_util::FutureExt::now_or_never(rung.as_mut()).is_some());
}
