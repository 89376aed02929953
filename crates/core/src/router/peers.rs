//! Other router replicas' bookings, counted in each worker's load.
//!
//! Several routers in front of the same workers each see only their own requests: one that
//! sees a third of the load would send requests to workers the others already filled. Each
//! replica therefore shares its bookings (dispatch, first token, finish) and counts its
//! peers' in its ledger, exactly as its own: prefill outstanding, active blocks, requests in
//! flight, and the prompts just dispatched count as cached on their worker until its events
//! show them. A peer's first tokens and finishes also teach the worker's prefill and decode
//! fits, so every replica learns from all the traffic.
//!
//! A peer's requests are named apart from the router's own (the top bit set, the peer's id
//! mixed in). A peer that falls silent for longer than its time-to-live is taken for gone:
//! its bookings are released ([`Router::expire_peers`]). A peer's list of what it has in
//! flight ([`Router::peer_inflight`]) releases what a lost finish left booked.

use super::{RouteError, Router};
use crate::hashing::{splitmix64, SequenceHash};
use crate::ledger::{Booking, LedgerError};
use crate::types::{RequestId, Time, WorkerId};

type Set<K> = hashbrown::HashSet<K, foldhash::fast::RandomState>;
type Map<K, V> = hashbrown::HashMap<K, V, foldhash::fast::RandomState>;

/// The most peers one router tracks.
pub const MAX_PEERS: usize = 1024;

/// A peer's booking, as it shared it.
#[derive(Clone, Copy, Debug)]
pub struct PeerBooking<'a> {
    /// The peer's own name for the request.
    pub request: u64,
    /// The worker (this router's id of it).
    pub worker: WorkerId,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Tokens the peer expected cached there.
    pub cached_tokens: usize,
    /// The prompt's full blocks.
    pub blocks: &'a [SequenceHash],
}

/// One peer's state.
#[derive(Debug)]
struct Peer {
    last_seen: Time,
    requests: Set<u64>,
}

/// Every peer's state.
#[derive(Debug, Default)]
pub(super) struct Peers {
    by_replica: Map<u64, Peer>,
}

impl Peers {
    /// The peers' ids.
    pub(super) fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.by_replica.keys().copied()
    }

    /// How many peers are known.
    pub(super) fn len(&self) -> usize {
        self.by_replica.len()
    }
}

/// What the router counts of its peers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Peers heard from within their time-to-live.
    pub peers: usize,
    /// Their requests in flight.
    pub inflight: usize,
}

/// The ledger's name of a peer's request: never one of the router's own (the top bit), and
/// distinct per peer.
pub fn peer_request_id(replica: u64, request: u64) -> RequestId {
    RequestId(splitmix64(replica ^ splitmix64(request)) | 1 << 63)
}

impl Router {
    /// Notes that `replica` was heard from at `now` (any message of it). Refused past
    /// [`MAX_PEERS`] peers.
    pub fn peer_seen(&mut self, replica: u64, now: Time) -> Result<(), RouteError> {
        let n = self.peers.by_replica.len();
        match self.peers.by_replica.get_mut(&replica) {
            Some(p) => p.last_seen = now,
            None if n >= MAX_PEERS => {
                return Err(RouteError::Config(format!(
                    "more than {MAX_PEERS} router replicas share their load"
                )))
            }
            None => {
                self.peers.by_replica.insert(
                    replica,
                    Peer {
                        last_seen: now,
                        requests: Set::default(),
                    },
                );
            }
        }
        Ok(())
    }

    /// Books a peer's dispatch at `now`, as [`Router::dispatch`] books the router's own.
    pub fn peer_dispatch(
        &mut self,
        replica: u64,
        b: &PeerBooking<'_>,
        now: Time,
    ) -> Result<(), RouteError> {
        self.peer_seen(replica, now)?;
        let request = peer_request_id(replica, b.request);
        self.ledger.book(
            &Booking {
                request,
                worker: b.worker,
                prompt_tokens: b.prompt_tokens,
                cached_tokens: b.cached_tokens,
                blocks: b.blocks,
                miss_weight: 1.0,
            },
            now,
        )?;
        if let Some(p) = self.peers.by_replica.get_mut(&replica) {
            p.requests.insert(b.request);
        }
        if let Err(e) = self.note_dispatched(b.worker, b.blocks, now) {
            let _ = self.ledger.finish(request, now);
            if let Some(p) = self.peers.by_replica.get_mut(&replica) {
                p.requests.remove(&b.request);
            }
            return Err(e);
        }
        Ok(())
    }

    /// A peer's request had its first token at about `now`.
    pub fn peer_first_token(
        &mut self,
        replica: u64,
        request: u64,
        now: Time,
    ) -> Result<(), LedgerError> {
        let _ = self.peer_seen(replica, now);
        self.ledger
            .first_token(peer_request_id(replica, request), now)
    }

    /// A peer's request finished at about `now` (with its output token count when known).
    pub fn peer_finish(
        &mut self,
        replica: u64,
        request: u64,
        output_tokens: Option<u64>,
        now: Time,
    ) -> Result<(), LedgerError> {
        let _ = self.peer_seen(replica, now);
        if let Some(p) = self.peers.by_replica.get_mut(&replica) {
            p.requests.remove(&request);
        }
        self.ledger
            .finish_with(peer_request_id(replica, request), now, output_tokens)
    }

    /// A peer's list of its requests in flight (ordered after its earlier bookings): any of
    /// its requests booked here and not in the list finished there (its finish was lost) and
    /// is released. Returns how many were.
    pub fn peer_inflight(&mut self, replica: u64, requests: &[u64], now: Time) -> usize {
        let _ = self.peer_seen(replica, now);
        let Some(p) = self.peers.by_replica.get_mut(&replica) else {
            return 0;
        };
        let listed: Set<u64> = requests.iter().copied().collect();
        let gone: Vec<u64> = p
            .requests
            .iter()
            .copied()
            .filter(|r| !listed.contains(r))
            .collect();
        for r in &gone {
            p.requests.remove(r);
            let _ = self.ledger.finish(peer_request_id(replica, *r), now);
        }
        gone.len()
    }

    /// Releases the bookings of every peer not heard from for more than `ttl_secs` before
    /// `now`, and forgets it. Returns the peers expired.
    pub fn expire_peers(&mut self, now: Time, ttl_secs: f64) -> usize {
        let gone: Vec<u64> = self
            .peers
            .by_replica
            .iter()
            .filter(|(_, p)| now.since(p.last_seen).as_secs_f64() > ttl_secs)
            .map(|(r, _)| *r)
            .collect();
        for replica in &gone {
            if let Some(p) = self.peers.by_replica.remove(replica) {
                for r in p.requests {
                    let _ = self.ledger.finish(peer_request_id(*replica, r), now);
                }
            }
        }
        gone.len()
    }

    /// Peers and their requests in flight.
    pub fn peer_stats(&self) -> PeerStats {
        PeerStats {
            peers: self.peers.by_replica.len(),
            inflight: self
                .peers
                .by_replica
                .values()
                .map(|p| p.requests.len())
                .sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::{BlockedPrompt, Namespace};
    use crate::router::RouterConfig;
    use crate::types::WorkerId;

    fn router() -> Router {
        let mut r = Router::new(RouterConfig {
            block_size: 4,
            ..RouterConfig::default()
        })
        .unwrap();
        for w in 1..=2 {
            r.add_worker(WorkerId(w), Default::default()).unwrap();
        }
        r
    }

    fn at(ms: u64) -> Time {
        Time::from_millis(ms)
    }

    #[test]
    fn a_peers_bookings_count_as_load_until_released() {
        let mut r = router();
        let prompt = BlockedPrompt::new(
            &(0..16).collect::<Vec<u32>>(),
            r.block_size(),
            Namespace::default(),
        );
        let b = PeerBooking {
            request: 1,
            worker: WorkerId(2),
            prompt_tokens: 16,
            cached_tokens: 0,
            blocks: &prompt.sequence,
        };
        r.peer_dispatch(9, &b, at(0)).unwrap();
        let load = r.ledger().load(WorkerId(2)).unwrap();
        assert_eq!(
            (load.inflight, load.prefill_tokens, load.active_blocks),
            (1, 16, 4)
        );
        // The router's own request 1 is another request.
        assert!(r.ledger().check_booking(RequestId(1), WorkerId(2)).is_ok());
        r.peer_first_token(9, 1, at(50)).unwrap();
        assert_eq!(r.ledger().load(WorkerId(2)).unwrap().prefill_tokens, 0);
        r.peer_finish(9, 1, Some(10), at(300)).unwrap();
        assert_eq!(r.ledger().load(WorkerId(2)).unwrap().inflight, 0);
        assert_eq!(
            r.peer_stats(),
            PeerStats {
                peers: 1,
                inflight: 0
            }
        );
        // Unknown requests are errors, not panics.
        assert!(r.peer_finish(9, 77, None, at(301)).is_err());
    }

    #[test]
    fn a_silent_peer_expires_and_a_listing_releases_lost_finishes() {
        let mut r = router();
        let prompt = BlockedPrompt::new(&[1, 2, 3, 4, 5], r.block_size(), Namespace::default());
        for (replica, req) in [(5, 1), (5, 2), (6, 1)] {
            let b = PeerBooking {
                request: req,
                worker: WorkerId(1),
                prompt_tokens: 5,
                cached_tokens: 0,
                blocks: &prompt.sequence,
            };
            r.peer_dispatch(replica, &b, at(0)).unwrap();
        }
        assert_eq!(r.ledger().load(WorkerId(1)).unwrap().inflight, 3);
        // Peer 5 lists only request 2: request 1's finish was lost.
        assert_eq!(r.peer_inflight(5, &[2], at(1000)), 1);
        assert_eq!(r.ledger().load(WorkerId(1)).unwrap().inflight, 2);
        // Peer 6 falls silent; peer 5 was heard at 1 s.
        assert_eq!(r.expire_peers(at(2500), 2.0), 1);
        assert_eq!(r.ledger().load(WorkerId(1)).unwrap().inflight, 1);
        assert_eq!(
            r.peer_stats(),
            PeerStats {
                peers: 1,
                inflight: 1
            }
        );
        assert_eq!(r.expire_peers(at(3500), 2.0), 1);
        assert_eq!(r.ledger().load(WorkerId(1)).unwrap().inflight, 0);
    }

    #[test]
    fn peers_are_bounded() {
        let mut r = router();
        for p in 0..MAX_PEERS as u64 {
            r.peer_seen(p, at(0)).unwrap();
        }
        assert!(r.peer_seen(u64::MAX, at(0)).is_err());
        assert!(r.peer_seen(3, at(1)).is_ok());
    }

    #[test]
    fn peer_request_names_never_meet_the_routers_own() {
        for replica in [0, 1, u64::MAX] {
            for req in [0, 1, 2, 1 << 40] {
                assert!(peer_request_id(replica, req).0 >= 1 << 63);
            }
        }
        assert_ne!(peer_request_id(1, 2), peer_request_id(2, 1));
    }
}
