//! Several router replicas in front of one fleet, as several gateways sharing their load
//! over the event plane would be: each has its own `Router` (the same KV events reach all),
//! routes the requests of the conversations assigned to it, and learns of its peers'
//! bookings (dispatch, first token, finish) `sync` later through the core's `peer_*` calls,
//! the code the live gateways run; with no sync at all each counts only its own.
//!
//! One replica is exactly the single router: no peer operation exists, and its seed is the
//! configured one.

use kvroute_core::hashing::splitmix64;
use kvroute_core::policy::RemotePrefill;
use kvroute_core::router::{PeerBooking, RouteOutcome, Selection};
use kvroute_core::{
    BatchOutcome, BlockedPrompt, IndexError, KvEvent, RequestId, RouteError, RouteRequest, Router,
    RouterConfig, SequenceHash, Tier, Time, WorkerId,
};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// A booking operation on its way to the other replicas.
enum PeerOp {
    Dispatch {
        worker: WorkerId,
        prompt_tokens: usize,
        cached_tokens: usize,
        blocks: Vec<SequenceHash>,
    },
    FirstToken,
    Finish(Option<u64>),
}

/// The routers.
pub(crate) struct Replicas {
    routers: Vec<Router>,
    /// How late peers learn of a booking (None: they never do).
    sync: Option<Duration>,
    /// Which replica booked each request in flight.
    owner: HashMap<RequestId, usize>,
    /// Operations not yet applied on the peers, in the order they are due.
    pending: VecDeque<(Time, usize, RequestId, PeerOp)>,
}

impl Replicas {
    /// `n` routers of `config` (replica k > 0 with its seed mixed with k).
    pub fn new(
        config: &RouterConfig,
        n: usize,
        sync: Option<Duration>,
    ) -> Result<Self, RouteError> {
        let routers = (0..n.max(1))
            .map(|k| {
                let mut c = config.clone();
                if k > 0 {
                    c.seed = splitmix64(c.seed ^ k as u64);
                }
                let mut r = Router::new(c)?;
                // Its id in the bookings it shares (`catch_up` names peers so).
                r.set_replica(k as u64);
                Ok::<_, RouteError>(r)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            routers,
            sync,
            owner: HashMap::new(),
            pending: VecDeque::new(),
        })
    }

    /// Every router, to set up alike.
    pub fn all_mut(&mut self) -> impl Iterator<Item = &mut Router> {
        self.routers.iter_mut()
    }

    /// The first router (the others' indexes hold the same blocks).
    pub fn first(&self) -> &Router {
        &self.routers[0]
    }

    /// A batch of a worker's device events, on every router; the first's outcome.
    pub fn apply_events(&mut self, worker: WorkerId, events: &[KvEvent]) -> BatchOutcome {
        self.on_all(|r| r.apply_events(worker, events))
    }

    /// An offloaded tier's event, on every router; the first's outcome.
    pub fn apply_tier_event(
        &mut self,
        worker: WorkerId,
        tier: Tier,
        event: &KvEvent,
    ) -> Result<(), IndexError> {
        self.on_all(|r| r.apply_tier_event(worker, tier, event))
    }

    /// `f` on every router (their indexes stay alike); the first's answer.
    fn on_all<T>(&mut self, mut f: impl FnMut(&mut Router) -> T) -> T {
        let (first, rest) = self.routers.split_at_mut(1);
        for r in rest {
            f(r);
        }
        f(&mut first[0])
    }

    /// Applies the peer operations due by `now`.
    pub fn catch_up(&mut self, now: Time) {
        while self.pending.front().is_some_and(|(due, ..)| *due <= now) {
            let Some((due, from, id, op)) = self.pending.pop_front() else {
                break;
            };
            for (k, r) in self.routers.iter_mut().enumerate() {
                if k == from {
                    continue;
                }
                let replica = from as u64;
                let _ = match &op {
                    PeerOp::Dispatch {
                        worker,
                        prompt_tokens,
                        cached_tokens,
                        blocks,
                    } => r
                        .peer_dispatch(
                            replica,
                            &PeerBooking {
                                request: id.0,
                                worker: *worker,
                                prompt_tokens: *prompt_tokens,
                                cached_tokens: *cached_tokens,
                                blocks,
                            },
                            due,
                        )
                        .map_err(|_| ()),
                    PeerOp::FirstToken => r.peer_first_token(replica, id.0, due).map_err(|_| ()),
                    PeerOp::Finish(out) => r.peer_finish(replica, id.0, *out, due).map_err(|_| ()),
                };
            }
        }
    }

    fn share(&mut self, now: Time, from: usize, id: RequestId, op: PeerOp) {
        if let (Some(d), true) = (self.sync, self.routers.len() > 1) {
            self.pending.push_back((now.plus(d), from, id, op));
        }
    }

    /// Routes on `replica`'s router at `now`.
    pub fn route(&mut self, replica: usize, req: &RouteRequest<'_>, now: Time) -> RouteOutcome {
        self.catch_up(now);
        self.routers[replica].route(req)
    }

    /// When `replica`'s router routes `prompt`, reaching it at `now` (None: at once; see
    /// `Router::hold_until`).
    pub fn hold_until(
        &mut self,
        replica: usize,
        now: Time,
        prompt: &BlockedPrompt,
    ) -> Option<Time> {
        self.catch_up(now);
        self.routers[replica].hold_until(now, prompt)
    }

    /// Whether `replica`'s router would book `sel` for `id`.
    pub fn check_dispatch(&self, replica: usize, id: RequestId, sel: &Selection) -> bool {
        self.routers[replica].check_dispatch(id, sel).is_ok()
    }

    /// Books `sel` on `replica`'s router and sends it to the peers.
    pub fn dispatch(
        &mut self,
        replica: usize,
        id: RequestId,
        req: &RouteRequest<'_>,
        sel: &Selection,
        now: Time,
    ) -> Result<(), RouteError> {
        self.routers[replica].dispatch(id, req, sel, now)?;
        if self.routers.len() > 1 {
            self.owner.insert(id, replica);
            let op = PeerOp::Dispatch {
                worker: sel.worker,
                prompt_tokens: req.prompt.tokens,
                cached_tokens: sel.cached_tokens,
                blocks: req.prompt.sequence.clone(),
            };
            self.share(now, replica, id, op);
        }
        Ok(())
    }

    /// Books the prefill leg of a split request as request `id` on `replica` (the prefill
    /// worker's booking, shared with the peers as any dispatch).
    pub fn dispatch_prefill(
        &mut self,
        replica: usize,
        id: RequestId,
        req: &RouteRequest<'_>,
        prefill: &RemotePrefill,
        now: Time,
    ) -> Result<(), RouteError> {
        let r = &mut self.routers[replica];
        r.dispatch_prefill(id, req, prefill, now)?;
        if self.routers.len() > 1 {
            self.owner.insert(id, replica);
            let bs = self.routers[replica].block_size().get();
            let op = PeerOp::Dispatch {
                worker: prefill.worker,
                prompt_tokens: req.prompt.tokens,
                cached_tokens: (prefill.matched_blocks * bs).min(req.prompt.tokens),
                blocks: req.prompt.sequence.clone(),
            };
            self.share(now, replica, id, op);
        }
        Ok(())
    }

    /// The request's first token, on its router and (later) its peers.
    pub fn first_token(&mut self, id: RequestId, now: Time) {
        self.catch_up(now);
        let k = self.owner.get(&id).copied().unwrap_or(0);
        let _ = self.routers[k].first_token(id, now);
        self.share(now, k, id, PeerOp::FirstToken);
    }

    /// A split request's KV reached its decode worker (its router learns from it; peers
    /// count the booking as it is).
    pub fn kv_arrived(&mut self, id: RequestId, now: Time) {
        self.catch_up(now);
        let k = self.owner.get(&id).copied().unwrap_or(0);
        let _ = self.routers[k].kv_arrived(id, now);
    }

    /// The request finished, on its router and (later) its peers.
    pub fn finish(&mut self, id: RequestId, now: Time, output: Option<u64>, cached: Option<usize>) {
        self.catch_up(now);
        let k = self.owner.remove(&id).unwrap_or(0);
        if let Some(c) = cached {
            // What the engine found cached teaches the replica that routed it (a worker
            // tracked approximately learns its capacity).
            let _ = self.routers[k].observe_cached(id, c);
        }
        let _ = match output {
            Some(n) => self.routers[k].finish_with(id, now, n),
            None => self.routers[k].finish(id, now),
        };
        self.share(now, k, id, PeerOp::Finish(output));
    }
}
