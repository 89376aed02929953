//! Bursts across replicas: holding a burst's later requests until the peers' bookings of
//! the same burst have arrived.
//!
//! Replicas share their bookings, but a booking reaches the others only after the plane's
//! sync delay. Requests that reach different replicas within that delay are routed blind to
//! each other, and with the same view every replica picks the same best worker: a burst
//! spread over the replicas herds onto the workers one router would have used first.
//!
//! A replica whose request comes within a round of turns (`replicas * hold`, `hold`:
//! [`RouterConfig::peer_hold_secs`], the sync delay) of the last of its burst holds it
//! until its next turn: rank `r` (its place by id among the replicas it has heard from)
//! has its turns at `s + (r + 1) * hold`, then one round later each (`s`: the burst's
//! first request, which goes at once). Replicas given shares of one burst thus route its
//! first requests at once (blind to each other's, one per replica), then the rest in turns,
//! rank 0 first, each turn with the earlier turns' bookings seen: as one router would, but
//! for the first requests. When the burst before had several requests too (bursts recur),
//! the first request is held as well, turns starting at `s + r * hold`: no replica decides
//! blind then. A lone request after a lone one is never held; a steady stream slower than
//! one request per round per replica rarely is; a request waits at most a round. A router
//! without peers (or with `peer_hold_secs` 0) holds nothing. The hold must be at least the
//! real sync delay: shorter, the turns overlap again.
//!
//! Only a request whose choice is open takes part: one whose deepest cached prefix on any
//! worker covers less than [`RouterConfig::peer_hold_max_cached`] of its prompt. A request
//! that finds most of its prompt cached goes where its cache is at once (live, holding
//! every turn of multi-turn conversations cost their first-token time and placed none
//! better).
//!
//! [`RouterConfig::peer_hold_secs`]: super::RouterConfig::peer_hold_secs
//! [`RouterConfig::peer_hold_max_cached`]: super::RouterConfig::peer_hold_max_cached

use super::Router;
use crate::types::Time;
use crate::BlockedPrompt;
use std::time::Duration;

impl Router {
    /// Names this router among its replicas: its id in the bookings it shares (peers know
    /// it by that id). Sets its turn in a burst ([`Router::hold_until`]).
    pub fn set_replica(&mut self, id: u64) {
        self.replica = id;
    }

    /// This router's place among the replicas heard from, itself included, by id:
    /// `(rank, replicas)`; `(0, 1)` alone.
    pub fn replica_rank(&self) -> (usize, usize) {
        let below = self.peers.ids().filter(|&id| id < self.replica).count();
        (below, self.peers.len() + 1)
    }

    /// A request reached this router at `now`: when it is to be routed. `None`, now;
    /// `Some(t)`, hold it until `t` and route it then (see the module's text). Called once
    /// per request as it arrives; held requests are routed in the order they came.
    pub fn hold_until(&mut self, now: Time, prompt: &BlockedPrompt) -> Option<Time> {
        // Off, or alone: nothing to wait for, and no burst to follow.
        if self.config.peer_hold_secs <= 0.0 || self.peers.len() == 0 {
            self.burst = None;
            return None;
        }
        // Its cache decides where it goes: at once, and no part of a burst.
        if !self.choice_is_open(prompt) {
            return None;
        }
        let release = match self.burst {
            Some(b) if now <= b.last.plus(self.round()) => {
                let t = self.next_turn(&b, now);
                self.burst = Some(Burst {
                    requests: b.requests + 1,
                    last: t,
                    ..b
                });
                t
            }
            prev => {
                let mut b = Burst {
                    start: now,
                    requests: 1,
                    lead_held: prev.is_some_and(|p| p.requests > 1),
                    last: now,
                };
                if b.lead_held {
                    b.last = self.next_turn(&b, now);
                }
                self.burst = Some(b);
                b.last
            }
        };
        (now < release).then_some(release)
    }

    /// Whether `prompt`'s worker is still to be chosen by load: no worker holds as much as
    /// [`RouterConfig::peer_hold_max_cached`](super::RouterConfig::peer_hold_max_cached) of
    /// it (by the same matches a route reads).
    fn choice_is_open(&self, prompt: &BlockedPrompt) -> bool {
        let share = self.config.peer_hold_max_cached;
        if share >= 1.0 {
            return true;
        }
        let cached = self.matches(prompt).max_depth() * self.block_size.get();
        (cached as f64) < share * prompt.tokens as f64
    }

    /// One round of turns: every replica's.
    fn round(&self) -> Duration {
        let (_, replicas) = self.replica_rank();
        Duration::from_secs_f64(self.config.peer_hold_secs * replicas as f64)
    }

    /// This router's first turn in burst `b` at or after `now`: rank 0 first, one sync delay
    /// a rank, a round of every replica's turn after another; the first turn comes after
    /// a turn of each replica's first request alone unless the burst before was a burst
    /// too (more than one request).
    fn next_turn(&self, b: &Burst, now: Time) -> Time {
        let (rank, _) = self.replica_rank();
        let turns = rank + usize::from(!b.lead_held);
        let first = b.start.plus(Duration::from_secs_f64(
            self.config.peer_hold_secs * turns as f64,
        ));
        if now <= first {
            return first;
        }
        let round = self.round().as_secs_f64();
        if round <= 0.0 {
            return now;
        }
        let k = (now.since(first).as_secs_f64() / round).ceil();
        first.plus(Duration::from_secs_f64(k * round))
    }
}

/// The burst of requests reaching a router.
#[derive(Clone, Copy, Debug)]
pub(super) struct Burst {
    /// Its first request's arrival.
    start: Time,
    /// Requests in it so far.
    requests: u64,
    /// Its first request is held too (the burst before had several requests).
    lead_held: bool,
    /// When its last request is routed.
    last: Time,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::Namespace;
    use crate::index::StoredBlocks;
    use crate::router::RouterConfig;
    use crate::{BlockSize, EngineHash, KvEvent, WorkerCapacity, WorkerId};

    fn at(ms: u64) -> Time {
        Time::from_millis(ms)
    }

    /// A prompt no worker holds.
    fn fresh() -> BlockedPrompt {
        prompt(7)
    }

    fn prompt(salt: u32) -> BlockedPrompt {
        let tokens: Vec<u32> = (0..64).map(|i| i * 31 + salt).collect();
        BlockedPrompt::new(&tokens, BlockSize::new(16).unwrap(), Namespace::default())
    }

    /// Worker 1 holds the first `blocks` blocks of `prompt(salt)`'s tokens.
    fn store(r: &mut Router, salt: u32, blocks: usize) {
        let tokens: Vec<u32> = (0..64).map(|i| i * 31 + salt).collect();
        let _ = r.add_worker(WorkerId(1), WorkerCapacity::default());
        r.apply_event(
            WorkerId(1),
            &KvEvent::Stored(StoredBlocks {
                parent: None,
                block_hashes: (0..blocks as u64)
                    .map(|i| EngineHash(u64::from(salt) << 16 | i))
                    .collect(),
                token_ids: tokens[..blocks * 16].to_vec(),
                block_size: 16,
                namespace: Namespace::default(),
                block_keys: Vec::new(),
            }),
        )
        .unwrap();
    }

    fn router(hold_secs: f64, id: u64, peers: &[u64]) -> Router {
        let mut r = Router::new(RouterConfig {
            peer_hold_secs: hold_secs,
            ..RouterConfig::default()
        })
        .unwrap();
        r.set_replica(id);
        for &p in peers {
            r.peer_seen(p, at(0)).unwrap();
        }
        r
    }

    #[test]
    fn a_bursts_later_requests_wait_for_the_peers_turns_by_rank() {
        // Rank 1 of 3 (peers 3 and 9, itself 5), hold 10 ms.
        let mut r = router(0.010, 5, &[3, 9]);
        assert_eq!(r.replica_rank(), (1, 3));
        // A burst at 1 s: its first goes at once, the rest after rank 0's turn.
        assert_eq!(r.hold_until(at(1_000), &fresh()), None);
        assert_eq!(r.hold_until(at(1_000), &fresh()), Some(at(1_020)));
        assert_eq!(r.hold_until(at(1_015), &fresh()), Some(at(1_020)));
        // At its turn it routes at once, in the burst.
        assert_eq!(r.hold_until(at(1_020), &fresh()), None);
        // Past it, still in the burst (within a round of its last): its turn of the next
        // round, every replica's turn later.
        assert_eq!(r.hold_until(at(1_025), &fresh()), Some(at(1_050)));
        // The next burst follows a burst: its first waits for rank 0's turn too.
        assert_eq!(r.hold_until(at(4_000), &fresh()), Some(at(4_010)));
        assert_eq!(r.hold_until(at(4_000), &fresh()), Some(at(4_010)));
        // A lone request, then (after a lone one) requests go at once again.
        assert_eq!(r.hold_until(at(7_000), &fresh()), Some(at(7_010)));
        assert_eq!(r.hold_until(at(9_000), &fresh()), None);
        // Rank 0 holds a burst's later requests one sync delay, and never its first.
        let mut first = router(0.010, 1, &[3, 9]);
        assert_eq!(first.replica_rank(), (0, 3));
        assert_eq!(first.hold_until(at(0), &fresh()), None);
        assert_eq!(first.hold_until(at(5), &fresh()), Some(at(10)));
        assert_eq!(first.hold_until(at(3_000), &fresh()), None);
        assert_eq!(
            first.hold_until(at(3_000), &fresh()),
            None,
            "its turn is the burst's start"
        );
    }

    #[test]
    fn nothing_is_held_alone_or_when_off() {
        let mut alone = router(0.010, 5, &[]);
        let mut off = router(0.0, 5, &[3, 9]);
        for r in [&mut alone, &mut off] {
            for ms in [0, 0, 1, 1, 2, 3_000, 3_000] {
                assert_eq!(r.hold_until(at(ms), &fresh()), None);
            }
        }
        let bad = RouterConfig {
            peer_hold_secs: -1.0,
            ..RouterConfig::default()
        };
        assert!(Router::new(bad).is_err());
    }

    #[test]
    fn only_a_request_whose_choice_is_open_is_held() {
        // Rank 1 of 3; worker 1 holds 2 of prompt(1)'s 4 blocks (half), 1 of prompt(2)'s;
        // requests finding less than half their prompt cached may be held.
        let mut r = router(0.010, 5, &[3, 9]);
        r.config.peer_hold_max_cached = 0.5;
        store(&mut r, 1, 2);
        store(&mut r, 2, 1);
        assert_eq!(r.hold_until(at(1_000), &fresh()), None, "a burst's first");
        // Half of it cached: it goes where its cache is, at once, and
        // is no part of the burst.
        assert_eq!(r.hold_until(at(1_000), &prompt(1)), None);
        assert_eq!(r.hold_until(at(1_000), &prompt(1)), None);
        // A quarter cached: open, held for its turn like a new prompt.
        assert_eq!(r.hold_until(at(1_000), &prompt(2)), Some(at(1_020)));
        assert_eq!(r.hold_until(at(1_000), &fresh()), Some(at(1_020)));
        // A share of 1: everything may be held.
        let mut all = router(0.010, 5, &[3, 9]);
        all.config.peer_hold_max_cached = 1.0;
        store(&mut all, 1, 2);
        assert_eq!(all.hold_until(at(1_000), &fresh()), None);
        assert_eq!(all.hold_until(at(1_000), &prompt(1)), Some(at(1_020)));
        let bad = RouterConfig {
            peer_hold_max_cached: 1.5,
            ..RouterConfig::default()
        };
        assert!(Router::new(bad).is_err());
    }
}
