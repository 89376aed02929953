//! The admission queue: requests that found every eligible worker busy, waiting in arrival
//! order until one is free, each until its deadline, within a count and a token budget. One
//! implementation, driven by the fleet simulator and by the live gateway alike.
//!
//! Order: entries wait in arrival order and are tried in that order ([`Drain`]); a request
//! never takes a worker from an earlier one: an arrival that finds a request waiting whose
//! eligible workers ([`Eligible`]) overlap its own queues behind ([`AdmissionQueue::holds`]),
//! and a pass tries them in arrival order, skipping the later ones of a kind whose first
//! waiter could not go. Requests of another kind (a retry that excludes the worker it failed
//! on, a data plane's subset) may go ahead of the others in a pass, and the others ahead of
//! them, when only workers they differ on are free.

use super::{AdmissionConfig, QueueState, RejectReason};
use crate::types::{Eligible, Time};
use std::collections::VecDeque;
use std::time::Duration;

/// A request's place in the queue (increasing in arrival order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(u64);

/// A request in the queue, with what its driver keeps of it (`item`).
#[derive(Debug)]
pub struct Queued<T> {
    /// Its place.
    pub ticket: Ticket,
    /// The workers it may go to (its kind, for ordering).
    pub eligible: Eligible,
    /// Its prompt's tokens (counted against the token budget).
    pub tokens: u64,
    /// When it stops waiting: rejected with [`RejectReason::QueueTimeout`].
    pub deadline: Time,
    /// The driver's part.
    pub item: T,
}

/// Requests waiting for a free worker, oldest first.
#[derive(Debug)]
pub struct AdmissionQueue<T> {
    entries: VecDeque<Queued<T>>,
    tokens: u64,
    next: u64,
}

impl<T> Default for AdmissionQueue<T> {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
            tokens: 0,
            next: 0,
        }
    }
}

impl<T> AdmissionQueue<T> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Its size: requests and prompt tokens.
    pub fn state(&self) -> QueueState {
        QueueState {
            requests: self.entries.len(),
            tokens: self.tokens,
        }
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a request for `eligible` must wait behind one already here that could take
    /// the same worker, instead of being routed at once.
    pub fn holds(&self, eligible: &Eligible) -> bool {
        self.entries.iter().any(|e| e.eligible.overlaps(eligible))
    }

    /// Queues a request at `now`, until `now` plus the configured wait; refused (and given
    /// back) when the queue is at its request or token limit.
    pub fn push(
        &mut self,
        config: &AdmissionConfig,
        now: Time,
        eligible: Eligible,
        tokens: u64,
        item: T,
    ) -> Result<Ticket, (RejectReason, T)> {
        if !config.queue_has_room(self.state(), tokens) {
            return Err((RejectReason::QueueFull, item));
        }
        let ticket = Ticket(self.next);
        self.next += 1;
        self.tokens = self.tokens.saturating_add(tokens);
        self.entries.push_back(Queued {
            ticket,
            eligible,
            tokens,
            deadline: now.plus(Duration::from_secs_f64(config.max_queue_wait_secs)),
            item,
        });
        Ok(ticket)
    }

    /// Takes a request out (its client left, or its own timer fired); `None` when it is no
    /// longer here (dispatched, rejected or expired meanwhile).
    pub fn remove(&mut self, ticket: Ticket) -> Option<Queued<T>> {
        let i = self
            .entries
            .binary_search_by_key(&ticket, |e| e.ticket)
            .ok()?;
        let e = self.entries.remove(i)?;
        self.tokens = self.tokens.saturating_sub(e.tokens);
        Some(e)
    }

    /// The earliest deadline of the requests waiting.
    pub fn next_deadline(&self) -> Option<Time> {
        self.entries.iter().map(|e| e.deadline).min()
    }

    /// Takes out every request whose deadline is at or before `now`, oldest first.
    pub fn expire(&mut self, now: Time) -> Vec<Queued<T>> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.entries.len() {
            if self.entries[i].deadline <= now {
                let e = self.entries.remove(i).expect("index in range");
                self.tokens = self.tokens.saturating_sub(e.tokens);
                out.push(e);
            } else {
                i += 1;
            }
        }
        out
    }

    /// A pass over the queue in arrival order: [`Drain::next`] takes out the next request
    /// worth trying, [`Drain::wait`] puts back one that must still wait (and skips the later
    /// ones of its kind for the rest of the pass).
    pub fn drain(&mut self) -> Drain<'_, T> {
        Drain {
            queue: self,
            cursor: 0,
            blocked: Vec::new(),
        }
    }
}

/// One pass over an [`AdmissionQueue`] (see [`AdmissionQueue::drain`]).
#[derive(Debug)]
pub struct Drain<'q, T> {
    queue: &'q mut AdmissionQueue<T>,
    cursor: usize,
    blocked: Vec<Eligible>,
}

impl<T> Drain<'_, T> {
    /// The next request to try, taken out of the queue (it is gone unless given back with
    /// [`Drain::wait`]).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<Queued<T>> {
        let q = &mut *self.queue;
        while self.cursor < q.entries.len() {
            if self.blocked.contains(&q.entries[self.cursor].eligible) {
                self.cursor += 1;
                continue;
            }
            let e = q.entries.remove(self.cursor)?;
            q.tokens = q.tokens.saturating_sub(e.tokens);
            return Some(e);
        }
        None
    }

    /// Gives back the request [`Drain::next`] just took: it still waits, in its place.
    pub fn wait(&mut self, e: Queued<T>) {
        let q = &mut *self.queue;
        q.tokens = q.tokens.saturating_add(e.tokens);
        if !self.blocked.contains(&e.eligible) {
            self.blocked.push(e.eligible.clone());
        }
        let at = q.entries.partition_point(|x| x.ticket < e.ticket);
        q.entries.insert(at, e);
        self.cursor = at + 1;
    }

    /// The queue's size without the request being tried (what admission must see for it).
    pub fn state(&self) -> QueueState {
        self.queue.state()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::WorkerId;

    fn cfg(requests: usize, tokens: u64, wait: f64) -> AdmissionConfig {
        AdmissionConfig {
            max_queued_requests: requests,
            max_queued_tokens: tokens,
            max_queue_wait_secs: wait,
            ..AdmissionConfig::default()
        }
    }

    fn t(ms: u64) -> Time {
        Time::from_millis(ms)
    }

    #[test]
    fn budgets_refuse_and_give_the_request_back() {
        let c = cfg(2, 100, 1.0);
        let mut q = AdmissionQueue::new();
        q.push(&c, t(0), Eligible::Any, 60, "a").unwrap();
        assert_eq!(
            q.push(&c, t(0), Eligible::Any, 41, "b"),
            Err((RejectReason::QueueFull, "b"))
        );
        q.push(&c, t(0), Eligible::Any, 40, "c").unwrap();
        assert_eq!(
            q.push(&c, t(0), Eligible::Any, 0, "d"),
            Err((RejectReason::QueueFull, "d"))
        );
        assert_eq!(
            q.state(),
            QueueState {
                requests: 2,
                tokens: 100
            }
        );
    }

    #[test]
    fn a_pass_goes_in_order_and_stops_a_kind_at_its_first_waiter() {
        let c = cfg(10, 1_000, 1.0);
        let mut q = AdmissionQueue::new();
        let x = Eligible::Except(WorkerId(7));
        let any = Eligible::Any;
        for (name, ex) in [("a", &any), ("b", &x), ("c", &any), ("d", &x), ("e", &any)] {
            q.push(&c, t(0), ex.clone(), 10, name).unwrap();
        }
        let mut tried = Vec::new();
        let mut d = q.drain();
        while let Some(e) = d.next() {
            tried.push(e.item);
            // `a` must wait: `c` and `e` (same kind) are not tried; `b` goes, `d` waits.
            match e.item {
                "a" | "d" => d.wait(e),
                _ => {}
            }
        }
        assert_eq!(tried, ["a", "b", "d"]);
        let left: Vec<_> = q.entries.iter().map(|e| e.item).collect();
        assert_eq!(left, ["a", "c", "d", "e"]);
        assert_eq!(q.state().tokens, 40);
        // Arrivals that could take a waiting request's worker queue behind it.
        assert!(q.holds(&any) && q.holds(&x) && q.holds(&Eligible::Except(WorkerId(1))));
        assert!(
            q.holds(&Eligible::only([WorkerId(7)])),
            "the Any waiters could use 7"
        );
        let mut subset = AdmissionQueue::new();
        subset
            .push(&c, t(0), Eligible::only([WorkerId(2)]), 10, "b-only")
            .unwrap();
        assert!(
            subset.holds(&any),
            "an arrival for any worker waits behind a subset's"
        );
        assert!(
            !subset.holds(&Eligible::only([WorkerId(3)])),
            "disjoint subsets do not"
        );
        assert!(!subset.holds(&Eligible::only([])));
    }

    #[test]
    fn deadlines_expire_at_the_configured_wait_and_removal_is_once() {
        let c = cfg(10, 1_000, 2.0);
        let mut q = AdmissionQueue::new();
        let a = q.push(&c, t(1_000), Eligible::Any, 5, "a").unwrap();
        let b = q.push(&c, t(1_500), Eligible::Any, 5, "b").unwrap();
        assert_eq!(q.next_deadline(), Some(t(3_000)));
        assert!(q.expire(t(2_999)).is_empty());
        let gone: Vec<_> = q.expire(t(3_000)).into_iter().map(|e| e.item).collect();
        assert_eq!(gone, ["a"]);
        assert!(q.remove(a).is_none(), "already expired");
        assert_eq!(q.remove(b).map(|e| e.item), Some("b"));
        assert!(q.remove(b).is_none());
        assert!(q.is_empty() && q.state() == QueueState::default());
    }
}
