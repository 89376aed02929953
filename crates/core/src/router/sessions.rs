//! Session affinity: the worker each session's last request went to, so that the policy can
//! prefer it (a soft bias, see [`crate::policy::PolicyInput::affinity_bias`]). Bounded by a
//! count and a time-to-live; the oldest sessions go first.

use crate::types::{Time, WorkerId};
use std::collections::VecDeque;
use std::time::Duration;

type Map<K, V> = hashbrown::HashMap<K, V, foldhash::fast::RandomState>;

/// Sessions by key (the caller hashes its session id, e.g. `x-session-id` or OpenAI `user`).
pub(crate) struct Sessions {
    cap: usize,
    ttl: Duration,
    last: Map<u64, (WorkerId, Time)>,
    /// `(time recorded, session)`, oldest first; entries whose time no longer matches `last`
    /// are stale and skipped.
    order: VecDeque<(Time, u64)>,
}

impl Sessions {
    pub(crate) fn new(cap: usize, ttl: Duration) -> Self {
        Self {
            cap,
            ttl,
            last: Map::default(),
            order: VecDeque::new(),
        }
    }

    /// The worker of a session's last dispatch.
    pub(crate) fn worker(&self, session: u64) -> Option<WorkerId> {
        self.last.get(&session).map(|e| e.0)
    }

    pub(crate) fn len(&self) -> usize {
        self.last.len()
    }

    pub(crate) fn record(&mut self, session: u64, worker: WorkerId, now: Time) {
        if self.cap == 0 {
            return;
        }
        self.last.insert(session, (worker, now));
        self.order.push_back((now, session));
        while self.last.len() > self.cap {
            self.pop_oldest();
        }
        if self.order.len() > 2 * self.last.len() + 64 {
            let last = &self.last;
            self.order
                .retain(|(t, s)| last.get(s).is_some_and(|e| e.1 == *t));
        }
    }

    /// Forgets sessions idle for the time-to-live at `now`.
    pub(crate) fn prune(&mut self, now: Time) {
        while let Some(&(t, _)) = self.order.front() {
            if now.since(t) < self.ttl {
                break;
            }
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some((t, s)) = self.order.pop_front() {
            if self.last.get(&s).is_some_and(|e| e.1 == t) {
                self.last.remove(&s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_last_worker_within_limits() {
        let mut s = Sessions::new(2, Duration::from_secs(10));
        s.record(1, WorkerId(7), Time::from_millis(0));
        s.record(1, WorkerId(8), Time::from_millis(1));
        assert_eq!(s.worker(1), Some(WorkerId(8)));
        s.record(2, WorkerId(9), Time::from_millis(2_000));
        s.record(3, WorkerId(9), Time::from_millis(3_000));
        assert_eq!(s.len(), 2);
        assert_eq!(s.worker(1), None, "the oldest session went first");
        s.prune(Time::from_millis(12_500));
        assert_eq!(s.worker(2), None);
        assert_eq!(s.worker(3), Some(WorkerId(9)));
        s.prune(Time::from_millis(13_000));
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn refreshed_sessions_do_not_pile_up() {
        let mut s = Sessions::new(10, Duration::from_secs(10));
        for i in 0..10_000 {
            s.record(1, WorkerId(1), Time::from_millis(i));
        }
        assert!(s.order.len() <= 2 * s.last.len() + 66);
        let mut off = Sessions::new(0, Duration::from_secs(1));
        off.record(1, WorkerId(1), Time::ZERO);
        assert_eq!(off.worker(1), None);
    }
}
