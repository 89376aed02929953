//! The routing table's lock-order check: per thread, which of its locks are held; taking one
//! already held (a re-entrant lock, which never returns) or the queue while holding the
//! router (the order admission takes them in reversed, which two threads can turn into a
//! deadlock) panics at once, naming both, instead of hanging. Debug builds only (every test
//! runs one); release builds compile it to nothing.
//!
//! Sound because every lock of the table is taken and let go within one synchronous call on
//! one thread ([`super::RoutingTable`] hands out no guard and its closures cannot await).

/// A lock of the routing table, in the order they may be taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lock {
    /// The admission queue's: first.
    Queue,
    /// The router's: second.
    Router,
}

impl Lock {
    #[cfg(debug_assertions)]
    fn bit(self) -> u8 {
        match self {
            Lock::Queue => 1,
            Lock::Router => 2,
        }
    }
}

#[cfg(debug_assertions)]
thread_local! {
    static HELD: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// A lock noted as held by this thread until dropped.
#[must_use = "the lock counts as held only while this lives"]
pub struct Held {
    #[cfg(debug_assertions)]
    lock: Lock,
}

/// Notes that this thread takes `lock`; panics (debug builds) when that breaks the order.
pub fn acquire(lock: Lock) -> Held {
    #[cfg(debug_assertions)]
    {
        let held = HELD.with(std::cell::Cell::get);
        if held & lock.bit() != 0 {
            panic!("routing table: the {lock:?} lock taken again by the thread that holds it (it would never return)");
        }
        if lock == Lock::Queue && held & Lock::Router.bit() != 0 {
            panic!("routing table: the Queue lock taken while holding the Router lock (the order is Queue, then Router)");
        }
        HELD.with(|h| h.set(held | lock.bit()));
        Held { lock }
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = lock;
        Held {}
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        HELD.with(|h| h.set(h.get() & !self.lock.bit()));
    }
}
