//! The routing table: the router (prefix index, load ledger, policy) and the admission queue,
//! each behind its lock, owned here and never handed out.
//!
//! Every method locks, acts and lets go before it returns (the shape of a key-value store's
//! `Db`): no guard leaves this type. Work that needs the router's own API runs in a closure
//! given the core types (`&Router`, `&mut Router`, the queue), never this table, so it cannot
//! lock again; a closure cannot await either (it is synchronous), so no lock is held across
//! an await. Notifications (the queue's task, [`RoutingTable::released`]) go out after the
//! locks are let go.
//!
//! One order when both are held: the queue, then the router ([`RoutingTable::with_both`]).
//! Debug builds (every test) check it on each acquisition, per thread: taking a lock this
//! thread already holds through the table, or the queue while holding the router, panics
//! with the two locks named instead of hanging ([`order`]).

use kvroute_core::{AdmissionQueue, QueueState, Router};
use parking_lot::Mutex;
use prometheus::IntGauge;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::futures::Notified;
use tokio::sync::Notify;

pub mod order;

use order::Lock;

/// The router and the admission queue (of waiters `W`), internally locked.
pub struct RoutingTable<W> {
    router: Mutex<Router>,
    queue: Mutex<AdmissionQueue<W>>,
    /// The queue's length, read without its lock by [`RoutingTable::released`].
    queued: AtomicUsize,
    /// The queue's length as a metric.
    queued_gauge: IntGauge,
    /// Rings the queue's task when load is released or workers change while requests wait.
    wake: Notify,
}

impl<W> RoutingTable<W> {
    /// A table over `router` with an empty queue; its length is published to `queued_gauge`.
    pub fn new(router: Router, queued_gauge: IntGauge) -> Self {
        let flows = router.config().admission.flow.compile();
        Self {
            router: Mutex::new(router),
            queue: Mutex::new(AdmissionQueue::new(flows)),
            queued: AtomicUsize::new(0),
            queued_gauge,
            wake: Notify::new(),
        }
    }

    /// The router's block size.
    pub fn block_size(&self) -> kvroute_core::BlockSize {
        self.read(Router::block_size)
    }

    /// Runs `f` on the router, locked for its duration.
    pub fn read<R>(&self, f: impl FnOnce(&Router) -> R) -> R {
        let _held = order::acquire(Lock::Router);
        let router = self.router.lock();
        f(&router)
    }

    /// Runs `f` on the router, locked for its duration, to change it.
    pub fn update<R>(&self, f: impl FnOnce(&mut Router) -> R) -> R {
        let _held = order::acquire(Lock::Router);
        let mut router = self.router.lock();
        f(&mut router)
    }

    /// The admission queue's size.
    pub fn queue_state(&self) -> QueueState {
        let _held = order::acquire(Lock::Queue);
        let state = self.queue.lock().state();
        state
    }

    /// Whether requests wait in the queue (read without its lock).
    pub fn has_waiting(&self) -> bool {
        self.queued.load(Ordering::Acquire) > 0
    }

    /// Runs `f` on the admission queue, locked for its duration; its size is published
    /// afterwards. What `f` returns (taken-out waiters included) is dropped by the caller,
    /// after the lock.
    pub fn with_queue<R>(&self, f: impl FnOnce(&mut AdmissionQueue<W>) -> R) -> R {
        let _held = order::acquire(Lock::Queue);
        let mut queue = self.queue.lock();
        let out = f(&mut queue);
        self.publish(queue.len());
        out
    }

    /// Runs `f` on the queue and the router, locked in that order for its duration (admission
    /// and the queue's passes decide on both at once); the queue's size is published
    /// afterwards.
    pub fn with_both<R>(&self, f: impl FnOnce(&mut AdmissionQueue<W>, &mut Router) -> R) -> R {
        let _queue_held = order::acquire(Lock::Queue);
        let mut queue = self.queue.lock();
        let _router_held = order::acquire(Lock::Router);
        let mut router = self.router.lock();
        let out = f(&mut queue, &mut router);
        drop(router);
        self.publish(queue.len());
        out
    }

    fn publish(&self, len: usize) {
        self.queued.store(len, Ordering::Release);
        self.queued_gauge
            .set(i64::try_from(len).unwrap_or(i64::MAX));
    }

    /// Load was released or the fleet changed: the queue's task makes a pass when requests
    /// wait (only the requests that go are woken).
    pub fn released(&self) {
        if self.has_waiting() {
            self.wake.notify_one();
        }
    }

    /// Rings the queue's task whether or not requests wait (a new deadline, a worker gone).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Completes at the next ring of [`RoutingTable::released`] or [`RoutingTable::wake`]
    /// (one stored ring counts).
    pub fn rung(&self) -> Notified<'_> {
        self.wake.notified()
    }
}

#[cfg(test)]
mod tests;
