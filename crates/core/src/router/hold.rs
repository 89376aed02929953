//! Bursts across replicas: holding a burst's later requests until the peers' bookings of
//! the same burst have arrived.
//!
//! Replicas share their bookings, but a booking reaches the others only after the plane's
//! sync delay. Requests that reach different replicas within that delay are routed blind to
//! each other, and with the same view every replica picks the same best worker: a burst
//! spread over the replicas herds onto the workers one router would have used first.
//!
//! A replica that routed a request at `s` (a burst's first) holds any request reaching it
//! before `s + (1 + rank) * hold` (`hold`: [`RouterConfig::peer_hold_secs`], the sync delay;
//! `rank`: its place by id among the replicas it has heard from) and routes them then, in
//! their order. Replicas given shares of one burst thus route its first requests at once
//! (blind to each other's, one per replica), then the rest in turn, rank 0 first, each
//! turn with every earlier turn's bookings seen: as one router would, but for the first
//! requests. A steady stream slower than one request per `hold` per replica is never held;
//! a request is held at most `replicas * hold`. A router without peers (or with
//! `peer_hold_secs` 0) holds nothing.
//!
//! [`RouterConfig::peer_hold_secs`]: super::RouterConfig::peer_hold_secs

use super::Router;
use crate::types::Time;
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
    pub fn hold_until(&mut self, now: Time) -> Option<Time> {
        let turn = match self.burst {
            Some(b) if now <= self.turn(&b) => {
                self.burst = Some(Burst {
                    requests: b.requests + 1,
                    ..b
                });
                self.turn(&b)
            }
            prev => {
                let b = Burst {
                    start: now,
                    requests: 1,
                    lead_held: prev.is_some_and(|p| p.requests > 1),
                };
                self.burst = Some(b);
                if !b.lead_held {
                    // The first request goes at once, as it would alone.
                    return None;
                }
                self.turn(&b)
            }
        };
        if self.config.peer_hold_secs <= 0.0 || self.peers.len() == 0 {
            return None;
        }
        (now < turn).then_some(turn)
    }

    /// When the requests held in burst `b` are routed: rank 0 first, one sync delay a
    /// rank; after a first turn of each replica's first request alone unless the burst
    /// before was a burst too (more than one request).
    fn turn(&self, b: &Burst) -> Time {
        let (rank, _) = self.replica_rank();
        let turns = rank + usize::from(!b.lead_held);
        b.start.plus(Duration::from_secs_f64(
            self.config.peer_hold_secs * turns as f64,
        ))
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::RouterConfig;

    fn at(ms: u64) -> Time {
        Time::from_millis(ms)
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
        assert_eq!(r.hold_until(at(1_000)), None);
        assert_eq!(r.hold_until(at(1_000)), Some(at(1_020)));
        assert_eq!(r.hold_until(at(1_015)), Some(at(1_020)));
        // At its turn it routes at once, in the burst.
        assert_eq!(r.hold_until(at(1_020)), None);
        // The next burst follows a burst: its first waits for rank 0's turn too.
        assert_eq!(r.hold_until(at(4_000)), Some(at(4_010)));
        assert_eq!(r.hold_until(at(4_000)), Some(at(4_010)));
        // A lone request, then (after a lone one) requests go at once again.
        assert_eq!(r.hold_until(at(7_000)), Some(at(7_010)));
        assert_eq!(r.hold_until(at(9_000)), None);
        // Rank 0 holds a burst's later requests one sync delay, and never its first.
        let mut first = router(0.010, 1, &[3, 9]);
        assert_eq!(first.replica_rank(), (0, 3));
        assert_eq!(first.hold_until(at(0)), None);
        assert_eq!(first.hold_until(at(5)), Some(at(10)));
        assert_eq!(first.hold_until(at(3_000)), None);
        assert_eq!(first.hold_until(at(3_000)), None, "its turn is the burst's start");
    }

    #[test]
    fn nothing_is_held_alone_or_when_off() {
        let mut alone = router(0.010, 5, &[]);
        let mut off = router(0.0, 5, &[3, 9]);
        for r in [&mut alone, &mut off] {
            for ms in [0, 0, 1, 1, 2, 3_000, 3_000] {
                assert_eq!(r.hold_until(at(ms)), None);
            }
        }
        let bad = RouterConfig {
            peer_hold_secs: -1.0,
            ..RouterConfig::default()
        };
        assert!(Router::new(bad).is_err());
    }
}
