//! The router: prefix index + load ledger + policy + admission behind one facade, the object
//! the gateway and the simulator both drive.
//!
//! [`Router::route`] is pure (it looks, it does not touch); [`Router::dispatch`] books the
//! chosen worker; [`Router::first_token`] and [`Router::finish`] release it. KV events go to
//! [`Router::apply_event`]. Each worker is tracked one of two ways ([`Tracking`]): from its
//! engine's KV events, or approximately, from the router's own dispatches (for engines that
//! publish no events). A worker can also be set unavailable: it keeps its index entries and
//! load but is offered to no policy until it is available again.

mod answers;
mod config;
mod explain;
mod hold;
mod miss;
mod peers;
mod reconfigure;
mod roles;
mod sessions;

pub use config::{RouterConfig, DEFAULT_PEER_HOLD_MAX_CACHED, DEFAULT_PEER_HOLD_SECS};
pub use explain::{Explanation, WorkerExplanation};
pub use peers::{peer_request_id, PeerBooking, PeerStats, MAX_PEERS};

use crate::admission::{AdmissionDecision, AdmissionMode, QueueState, RejectReason};
use crate::flow::{Flow, Flows, MissAction};
use crate::hashing::{BlockedPrompt, SequenceHash};
use crate::index::{
    ApproxConfig, ApproxIndex, BatchOutcome, IndexError, KvEvent, Matches, PrefixIndex,
};
use crate::ledger::{Booking, LedgerError, LoadLedger, WorkerCapacity};
use crate::policy::{
    Candidate, Choice, ClassNeeds, Policy, PolicyInput, Predictive, RemotePrefill,
};
use crate::tiers::{Loadable, OffloadedTiers, Tier};
use crate::types::{BlockSize, Eligible, RequestId, Time, WorkerId, WorkerRole, ANY_WORKER};
use serde::{Deserialize, Serialize};

/// Router errors.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RouteError {
    /// Invalid settings.
    #[error("invalid router config: {0}")]
    Config(String),
    /// The index refused a change.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// The ledger refused a change.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// A request to route.
#[derive(Clone, Copy, Debug)]
pub struct RouteRequest<'a> {
    /// The prompt, cut into blocks.
    pub prompt: &'a BlockedPrompt,
    /// The request's session (a hash of its session id), for affinity.
    pub session: Option<u64>,
    /// The gateway's queue now (not counting this request).
    pub queue: QueueState,
    /// The workers it may go to (all but the one a retried request just failed on; the
    /// subset a data plane allows).
    pub eligible: &'a Eligible,
    /// Its tenant and class (`router.admission.flow`): its class's busy thresholds and
    /// objectives apply.
    pub flow: Flow,
}

impl<'a> RouteRequest<'a> {
    /// A request for `prompt` with no session, an empty queue, any worker eligible.
    pub fn new(prompt: &'a BlockedPrompt) -> Self {
        Self {
            prompt,
            session: None,
            queue: QueueState::default(),
            eligible: &ANY_WORKER,
            flow: Flow::default(),
        }
    }
}

/// The worker chosen for a request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    /// The worker.
    pub worker: WorkerId,
    /// Leading prompt blocks it holds.
    pub matched_blocks: usize,
    /// Prompt blocks after those it can load back from offloaded tiers.
    #[serde(default)]
    pub loadable: Loadable,
    /// Prompt tokens it is expected to report cached (matched and loadable blocks, as
    /// engines count tokens loaded back as cached).
    pub cached_tokens: usize,
    /// The policy's cost for it, if the policy has costs.
    pub cost: Option<f64>,
    /// The prefill worker that computes its prompt first, its KV then moved here, when the
    /// request is split (disaggregated prefill); None: this worker computes it.
    #[serde(default)]
    pub prefill: Option<RemotePrefill>,
}

/// What to do with a request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteOutcome {
    /// Send it to this worker now (then call [`Router::dispatch`]).
    Dispatch(Selection),
    /// Every worker is busy: hold it and route again later.
    Queue,
    /// Reject it, with the wait it computed for a retry (a predicted miss: the predicted
    /// drain; else none: [`RejectReason::retry_after_secs`]).
    Reject(RejectReason, Option<std::time::Duration>),
}

/// How the router knows what a worker caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tracking {
    /// From the engine's KV events ([`Router::apply_event`]).
    Events,
    /// From the router's own dispatches: what was routed there is assumed cached for a
    /// time-to-live, up to a per-worker cap (events of such a worker are ignored).
    Approximate,
}

/// Everything one routing evaluation computed (shared by `route` and `explain`).
struct Evaluation {
    candidates: Vec<Candidate>,
    /// Parallel to `candidates`: busy by the admission thresholds.
    busy: Vec<bool>,
    /// Parallel to `candidates`: offered to the policy.
    eligible: Vec<bool>,
    decision: AdmissionDecision,
    /// Indexes into `candidates` of the eligible ones, and the policy's answer over them
    /// (with a split request, its decode worker).
    choice: Option<(Vec<usize>, Choice)>,
    /// The prefill worker offered, and whether the request is split there.
    prefill: Option<(RemotePrefill, bool)>,
    /// A refusal's own wait before a retry.
    retry_after: Option<std::time::Duration>,
}

/// The router.
pub struct Router {
    config: RouterConfig,
    /// `config.admission.flow`, compiled.
    flows: Flows,
    block_size: BlockSize,
    index: PrefixIndex,
    /// Blocks engines moved to host memory or disk.
    offloaded: OffloadedTiers,
    approx: ApproxIndex,
    /// Prompts just dispatched to workers tracked by events, until their events show them
    /// (`pending_secs`; None: off).
    pending: Option<ApproxIndex>,
    /// Dispatches to workers tracked approximately, awaiting their answers.
    answers: answers::Awaited,
    /// Workers tracked approximately (few; usually none).
    approximate: Vec<WorkerId>,
    /// Workers offered to no policy for now (few; usually none).
    unavailable: Vec<WorkerId>,
    /// Workers whose role is not `both` ([`Router::set_role`]; usually none).
    roles: Vec<(WorkerId, WorkerRole)>,
    ledger: LoadLedger,
    policy: Box<dyn Policy>,
    sessions: sessions::Sessions,
    /// Other router replicas' bookings.
    peers: peers::Peers,
    /// This router's id among its replicas ([`Router::set_replica`]).
    replica: u64,
    /// The current burst of requests reaching it ([`Router::hold_until`]).
    burst: Option<hold::Burst>,
    /// The caller runs a request's prefill and decode on two workers
    /// ([`Router::set_split_prefill`]).
    split_prefill: bool,
    decisions: u64,
}

impl Router {
    /// A router with no workers.
    pub fn new(config: RouterConfig) -> Result<Self, RouteError> {
        config.validate()?;
        let block_size =
            BlockSize::new(config.block_size).map_err(|e| RouteError::Config(e.to_string()))?;
        let mut index = PrefixIndex::with_max_workers(block_size, config.max_workers);
        index.set_max_blocks_per_worker(config.max_blocks_per_worker);
        let mut offloaded = OffloadedTiers::new(block_size, config.max_workers);
        offloaded.set_max_blocks_per_worker(config.max_blocks_per_worker);
        Ok(Self {
            block_size,
            index,
            offloaded,
            approx: ApproxIndex::new(block_size, &config.approx),
            answers: answers::Awaited::default(),
            pending: (config.pending_secs > 0.0).then(|| {
                ApproxIndex::new(
                    block_size,
                    &ApproxConfig {
                        ttl_secs: config.pending_secs,
                        ..config.approx.clone()
                    },
                )
            }),
            approximate: Vec::new(),
            unavailable: Vec::new(),
            roles: Vec::new(),
            ledger: LoadLedger::with_max_inflight(block_size, config.max_inflight),
            policy: config.policy.build(),
            sessions: sessions::Sessions::new(
                config.max_sessions,
                std::time::Duration::from_secs_f64(config.session_ttl_secs),
            ),
            peers: peers::Peers::default(),
            replica: 0,
            burst: None,
            split_prefill: false,
            decisions: 0,
            flows: config.admission.flow.compile(),
            config,
        })
    }

    /// The settings.
    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// The block size.
    pub fn block_size(&self) -> BlockSize {
        self.block_size
    }

    /// The prefix index of the workers tracked by events.
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// The indexes of offloaded blocks.
    pub fn offloaded(&self) -> &OffloadedTiers {
        &self.offloaded
    }

    /// How `worker` is tracked (None: unknown worker).
    pub fn tracking(&self, worker: WorkerId) -> Option<Tracking> {
        if self.approximate.contains(&worker) {
            Some(Tracking::Approximate)
        } else if self.ledger.load(worker).is_some() {
            Some(Tracking::Events)
        } else {
            None
        }
    }

    /// Blocks `worker` is known (or, tracked approximately, assumed) to cache.
    pub fn cached_blocks(&self, worker: WorkerId) -> usize {
        if self.approximate.contains(&worker) {
            self.approx.index().block_count(worker)
        } else {
            self.index.block_count(worker)
        }
    }

    /// Whether `worker` is offered to policies (see [`Router::set_available`]).
    pub fn is_available(&self, worker: WorkerId) -> bool {
        !self.unavailable.contains(&worker)
    }

    /// Takes `worker` out of routing (false) or puts it back (true), keeping its index
    /// entries and its load: for a worker that is slow or unreachable for now but has not
    /// lost its cache.
    pub fn set_available(&mut self, worker: WorkerId, available: bool) {
        if available {
            self.unavailable.retain(|w| *w != worker);
        } else if !self.unavailable.contains(&worker) {
            self.unavailable.push(worker);
        }
    }

    /// The load ledger.
    pub fn ledger(&self) -> &LoadLedger {
        &self.ledger
    }

    /// Decisions dispatched so far.
    pub fn decisions(&self) -> u64 {
        self.decisions
    }

    /// Registers a worker tracked by its KV events (or updates its capacity).
    pub fn add_worker(
        &mut self,
        worker: WorkerId,
        capacity: WorkerCapacity,
    ) -> Result<(), RouteError> {
        self.add_worker_with(worker, capacity, Tracking::Events)
    }

    /// Registers a worker tracked as `tracking` says (or updates its capacity; a change of
    /// tracking drops what the other way knew of it).
    pub fn add_worker_with(
        &mut self,
        worker: WorkerId,
        capacity: WorkerCapacity,
        tracking: Tracking,
    ) -> Result<(), RouteError> {
        // `max_workers` counts every worker, however tracked (the approximate index has no
        // limit of its own).
        let limit = self.config.max_workers;
        if self.ledger.capacity(worker).is_none() && self.ledger.worker_count() >= limit {
            return Err(IndexError::TooManyWorkers { worker, limit }.into());
        }
        let was = self.approximate.contains(&worker);
        match tracking {
            Tracking::Events => {
                self.index.add_worker(worker)?;
                if was {
                    self.approx.remove_worker(worker);
                    self.approximate.retain(|w| *w != worker);
                }
            }
            Tracking::Approximate => {
                self.approx.check_insert(worker)?;
                if !was {
                    self.index.remove_worker(worker);
                    self.approximate.push(worker);
                }
            }
        }
        self.ledger.add_worker(worker, capacity);
        Ok(())
    }

    /// Makes room in the index for `blocks` cached blocks of `worker` (see
    /// [`PrefixIndex::reserve`]): for a caller that knows the engines will fill their caches
    /// soon, such as the simulator, so the tables do not grow by rehashing as they fill.
    pub fn reserve(&mut self, worker: WorkerId, blocks: usize) {
        self.index.reserve(worker, blocks);
    }

    /// Tells the index that `worker`'s engine names its blocks by their index in a pool of
    /// `blocks` (see [`PrefixIndex::use_block_ids`]); false when it could not.
    pub fn use_block_ids(&mut self, worker: WorkerId, blocks: usize) -> bool {
        !self.approximate.contains(&worker) && self.index.use_block_ids(worker, blocks)
    }

    /// Forgets a worker, its cached blocks and its load.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        if self.approximate.contains(&worker) {
            self.approx.remove_worker(worker);
            self.approximate.retain(|w| *w != worker);
        } else {
            self.index.remove_worker(worker);
            self.offloaded.remove_worker(worker);
        }
        if let Some(p) = &mut self.pending {
            p.remove_worker(worker);
        }
        self.unavailable.retain(|w| *w != worker);
        self.roles.retain(|(w, _)| *w != worker);
        self.ledger.remove_worker(worker);
    }

    /// Applies a KV event of `worker`. Events of a worker tracked approximately are not
    /// expected and are ignored (the router's own guesses stand).
    pub fn apply_event(&mut self, worker: WorkerId, event: &KvEvent) -> Result<(), IndexError> {
        if self.approximate.contains(&worker) {
            return Ok(());
        }
        if let (KvEvent::Cleared, Some(p)) = (event, &mut self.pending) {
            // The engine lost its cache: what was sent there before is gone too.
            p.remove_worker(worker);
        }
        let removed = self.pending_removed(worker, std::slice::from_ref(event));
        let applied = self.index.apply(worker, event);
        self.forget_pending(worker, &removed);
        applied
    }

    /// The sequence hashes of the blocks `events` remove from `worker`, read before they
    /// apply, when guesses of what was just sent there stand (none otherwise: nothing to
    /// look up on the usual path).
    fn pending_removed(&self, worker: WorkerId, events: &[KvEvent]) -> Vec<SequenceHash> {
        let Some(p) = &self.pending else {
            return Vec::new();
        };
        if !p.has_guesses(worker) {
            return Vec::new();
        }
        events
            .iter()
            .filter_map(|e| match e {
                KvEvent::Removed { block_hashes } => Some(block_hashes),
                _ => None,
            })
            .flatten()
            .filter_map(|h| self.index.sequence_of(worker, *h))
            .collect()
    }

    /// A removal the engine announced ends the guess of every block it names: no guess
    /// made at a dispatch covers a block the engine said it evicted after it.
    fn forget_pending(&mut self, worker: WorkerId, removed: &[SequenceHash]) {
        if let (Some(p), false) = (&mut self.pending, removed.is_empty()) {
            p.forget(worker, removed);
        }
    }

    /// Applies a KV event of `worker` about blocks in `tier` ([`Tier::Device`]: as
    /// [`Router::apply_event`]). Offloaded blocks are tracked apart and credited at the cost
    /// of loading them back ([`crate::tiers`]). Ignored for a worker tracked approximately.
    pub fn apply_tier_event(
        &mut self,
        worker: WorkerId,
        tier: Tier,
        event: &KvEvent,
    ) -> Result<(), IndexError> {
        if tier == Tier::Device {
            return self.apply_event(worker, event);
        }
        if self.approximate.contains(&worker) {
            return Ok(());
        }
        self.offloaded.apply(&self.index, worker, tier, event)
    }

    /// Drops everything known of `worker`'s cache in every tier, and what was just sent
    /// there (its engine restarted or its events were lost), keeping it registered.
    pub fn clear_worker(&mut self, worker: WorkerId) {
        if self.approximate.contains(&worker) {
            return;
        }
        self.index.clear_worker(worker);
        self.offloaded.clear_worker(worker);
        if let Some(p) = &mut self.pending {
            p.remove_worker(worker);
        }
    }

    /// Applies a batch of KV events of `worker` in order (see [`PrefixIndex::apply_batch`]).
    /// Events of a worker tracked approximately are ignored.
    pub fn apply_events(&mut self, worker: WorkerId, events: &[KvEvent]) -> BatchOutcome {
        if self.approximate.contains(&worker) {
            return BatchOutcome::default();
        }
        if let Some(p) = &mut self.pending {
            if events.iter().any(|e| matches!(e, KvEvent::Cleared)) {
                p.remove_worker(worker);
            }
        }
        let removed = self.pending_removed(worker, events);
        let outcome = self.index.apply_batch(worker, events);
        self.forget_pending(worker, &removed);
        outcome
    }

    /// [`Router::apply_events`], telling `each` every event's result by its position (the
    /// gateway counts them); a `Cleared` also drops what was just sent to the worker.
    pub fn apply_events_with(
        &mut self,
        worker: WorkerId,
        events: &[KvEvent],
        mut each: impl FnMut(usize, Result<(), IndexError>),
    ) {
        if self.approximate.contains(&worker) {
            (0..events.len()).for_each(|i| each(i, Ok(())));
            return;
        }
        if let Some(p) = &mut self.pending {
            if events.iter().any(|e| matches!(e, KvEvent::Cleared)) {
                p.remove_worker(worker);
            }
        }
        let removed = self.pending_removed(worker, events);
        self.index.apply_batch_with(worker, events, each);
        self.forget_pending(worker, &removed);
    }

    /// Expires approximate guesses and idle sessions.
    pub fn prune(&mut self, now: Time) {
        if !self.approximate.is_empty() {
            self.approx.prune(now);
        }
        if let Some(p) = &mut self.pending {
            p.prune(now);
        }
        self.sessions.prune(now);
    }

    /// Sessions remembered for affinity.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Decides where `req` goes, without changing anything.
    pub fn route(&self, req: &RouteRequest<'_>) -> RouteOutcome {
        let ev = self.evaluate(req);
        self.outcome(req, &ev)
    }

    /// [`Router::route`] and [`Router::explain`] of the same evaluation, at the cost of one.
    pub fn route_explained(&self, req: &RouteRequest<'_>) -> (RouteOutcome, Explanation) {
        let ev = self.evaluate(req);
        (self.outcome(req, &ev), self.explanation(req, &ev))
    }

    fn outcome(&self, req: &RouteRequest<'_>, ev: &Evaluation) -> RouteOutcome {
        match (ev.decision, &ev.choice) {
            (AdmissionDecision::Dispatch, Some((ix, choice))) => {
                let i = ix[choice.chosen];
                let c = &ev.candidates[i];
                let prefill = ev.prefill.filter(|(_, split)| *split).map(|(p, _)| p);
                // A split request's engines report the prefill worker's own hit (the decode
                // engine counts the moved KV as cached: docs/disaggregation.md).
                let reused = match prefill {
                    Some(p) => p.matched_blocks,
                    None => c.matched_blocks + c.loadable.blocks(),
                };
                RouteOutcome::Dispatch(Selection {
                    worker: c.worker,
                    matched_blocks: c.matched_blocks,
                    loadable: c.loadable,
                    cached_tokens: (reused * self.block_size.get()).min(req.prompt.tokens),
                    cost: choice.costs[choice.chosen],
                    prefill,
                })
            }
            (AdmissionDecision::Queue, _) => RouteOutcome::Queue,
            (AdmissionDecision::Reject(r), _) => RouteOutcome::Reject(r, ev.retry_after),
            (AdmissionDecision::Dispatch, None) => {
                RouteOutcome::Reject(RejectReason::NoWorkers, None)
            }
        }
    }

    /// Whether [`Router::dispatch`] of `selection` for `request` would succeed, changing
    /// nothing. Once it says yes, the dispatch cannot fail (until the router changes), so a
    /// caller may answer with the outcome first and book after.
    pub fn check_dispatch(
        &self,
        request: RequestId,
        selection: &Selection,
    ) -> Result<(), RouteError> {
        self.ledger.check_booking(request, selection.worker)?;
        if self.approximate.contains(&selection.worker) {
            self.approx.check_insert(selection.worker)?;
        } else if let Some(p) = &self.pending {
            p.check_insert(selection.worker)?;
        }
        Ok(())
    }

    /// Books `selection` for `request` at `now` (after [`Router::route`] said dispatch) and
    /// remembers the worker for the request's session.
    pub fn dispatch(
        &mut self,
        request: RequestId,
        req: &RouteRequest<'_>,
        selection: &Selection,
        now: Time,
    ) -> Result<(), RouteError> {
        let prompt = req.prompt;
        // The ledger books prefill work: tokens loaded back count at their load cost.
        let load = self
            .config
            .tiers
            .load_tokens(selection.loadable, self.block_size.get())
            .ceil() as usize;
        let booking = Booking {
            request,
            worker: selection.worker,
            prompt_tokens: prompt.tokens,
            cached_tokens: selection.cached_tokens.saturating_sub(load),
            blocks: &prompt.sequence,
            miss_weight: self.flows.class(req.flow.class).miss_weight,
        };
        if selection.prefill.is_some() {
            // Its prompt is computed elsewhere ([`Router::dispatch_prefill`]).
            self.ledger.book_decode(&booking, now)?;
        } else {
            self.ledger.book(&booking, now)?;
        }
        self.await_answer(
            request,
            selection.worker,
            selection.matched_blocks,
            &prompt.sequence,
        );
        if let Err(e) = self.note_dispatched(selection.worker, &prompt.sequence, now) {
            // Keep the ledger consistent with a refused dispatch.
            let _ = self.ledger.finish(request, now);
            return Err(e);
        }
        if let Some(session) = req.session {
            self.sessions.record(session, selection.worker, now);
        }
        self.decisions += 1;
        Ok(())
    }

    /// A prompt just dispatched to `worker` counts as cached there: for a worker tracked
    /// approximately, for its time-to-live; for one tracked by events, until they show it
    /// (`pending_secs`).
    fn note_dispatched(
        &mut self,
        worker: WorkerId,
        sequence: &[crate::hashing::SequenceHash],
        now: Time,
    ) -> Result<(), RouteError> {
        if !self.approximate.is_empty() {
            // Guesses expire as time passes, whoever drives the router.
            self.approx.prune(now);
        }
        let guesses = if self.approximate.contains(&worker) {
            Some(&mut self.approx)
        } else if let Some(p) = &mut self.pending {
            p.prune(now);
            Some(p)
        } else {
            None
        };
        if let Some(g) = guesses {
            g.insert(worker, sequence, now)?;
        }
        Ok(())
    }

    /// Every block `worker` holds, as `PrefixIndex::export_worker` gives them (a snapshot).
    pub fn export_worker(&self, worker: WorkerId) -> Vec<(crate::EngineHash, crate::SequenceHash)> {
        self.index.export_worker(worker)
    }

    /// The request's first token arrived at `now`.
    pub fn first_token(&mut self, request: RequestId, now: Time) -> Result<(), LedgerError> {
        self.ledger.first_token(request, now)
    }

    /// The request completed or failed at `now`.
    pub fn finish(&mut self, request: RequestId, now: Time) -> Result<(), LedgerError> {
        self.ledger.finish(request, now)
    }

    /// The request completed at `now` having written `output_tokens` tokens: its time per
    /// token teaches the worker's decode speed.
    pub fn finish_with(
        &mut self,
        request: RequestId,
        now: Time,
        output_tokens: u64,
    ) -> Result<(), LedgerError> {
        self.ledger.finish_with(request, now, Some(output_tokens))
    }

    /// Reads the index entries a route of `prompt` would read now, changing nothing, so
    /// that a route of it soon after finds them in the processor's caches (a caller with
    /// idle time before a route it can foresee: the fleet simulator's router thread).
    pub fn warm(&self, prompt: &BlockedPrompt) {
        std::hint::black_box(self.matches(prompt));
    }

    /// Matched depth per worker: from events (or, for a worker just sent a prompt whose
    /// events have not come yet, from that dispatch), or from guesses for workers tracked
    /// approximately; the deepest of them.
    fn matches(&self, prompt: &BlockedPrompt) -> Matches {
        let mut found = self.index.find_matches_seq(&prompt.sequence);
        for extra in [
            (!self.approximate.is_empty()).then_some(&self.approx),
            self.pending.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            let more = extra.find_matches_seq(&prompt.sequence);
            if !more.is_empty() {
                found = Matches::deepest(&found, &more);
            }
        }
        found
    }

    fn evaluate(&self, req: &RouteRequest<'_>) -> Evaluation {
        let matches = self.matches(req.prompt);
        let bs = self.block_size.get();
        // An engine computes at least the prompt's last token: a hit stops at the last full
        // block before it (vLLM and the simulated engine cap a hit at `tokens - 1`).
        let max_hit = req.prompt.tokens.saturating_sub(1) / bs;
        let offloaded = !self.offloaded.is_empty();
        let candidate = |v: &crate::ledger::WorkerView| {
            let matched_blocks = matches.depth(v.worker).min(max_hit);
            let loadable = if offloaded {
                self.offloaded
                    .loadable(v.worker, &req.prompt.sequence, matched_blocks, max_hit)
            } else {
                Loadable::default()
            };
            Candidate {
                worker: v.worker,
                matched_blocks,
                loadable,
                cached_blocks: self.cached_blocks(v.worker),
                cache_blocks: self
                    .approx_capacity(v.worker)
                    .or_else(|| v.capacity.kv_blocks.and_then(|b| usize::try_from(b).ok())),
                load: v.load,
                capacity: v.capacity,
                prefill: v.prefill,
                service_secs: v.service_secs,
                decode: v.decode,
                output_tokens: v.output_tokens,
            }
        };
        let open = |v: &crate::ledger::WorkerView| {
            req.eligible.allows(v.worker) && !self.unavailable.contains(&v.worker)
        };
        let candidates: Vec<Candidate> = self
            .ledger
            .views()
            .filter(|v| open(v) && (self.roles.is_empty() || self.role(v.worker).decodes()))
            .map(|v| candidate(&v))
            .collect();
        let adm = &self.config.admission;
        let class = self.flows.class(req.flow.class);
        let busy: Vec<bool> = candidates
            .iter()
            .map(|c| adm.is_busy(&c.load, &c.capacity, bs) || class.is_busy(&c.load, &c.capacity))
            .collect();
        let free = busy.iter().filter(|b| !**b).count();
        let mut decision = adm.decide(candidates.len(), free, req.queue, req.prompt.tokens);
        let eligible: Vec<bool> = busy
            .iter()
            .map(|b| adm.mode == AdmissionMode::None || free == 0 || !b)
            .collect();
        let ix: Vec<usize> = (0..candidates.len()).filter(|&i| eligible[i]).collect();
        let mut retry_after = None;
        if class.on_predicted_miss == MissAction::Reject
            && !matches!(decision, AdmissionDecision::Reject(_))
        {
            let pool: Vec<Candidate> = ix.iter().map(|&i| candidates[i].clone()).collect();
            retry_after = self.predicted_miss(req, &pool);
            if retry_after.is_some() {
                decision = AdmissionDecision::Reject(RejectReason::PredictedMiss);
            }
        }
        let dispatch = decision == AdmissionDecision::Dispatch && !ix.is_empty();
        let choice = dispatch.then(|| {
            let offered: Vec<Candidate> = ix.iter().map(|&i| candidates[i].clone()).collect();
            let input = PolicyInput {
                prompt_tokens: req.prompt.tokens,
                block_size: bs,
                candidates: &offered,
                decision: self.decisions,
                seed: self.config.seed,
                affinity: req.session.and_then(|s| self.sessions.worker(s)),
                affinity_bias: self.config.affinity_bias,
                tiers: self.config.tiers,
                class: ClassNeeds {
                    ttft_secs: class.ttft_secs,
                    tpot_secs: class.tpot_secs,
                    miss_weight: class.miss_weight,
                },
            };
            let mut choice = self.policy.select(&input);
            let Some(remote) = self.remote_prefill(req, &open, &candidate) else {
                return (ix, choice, None);
            };
            let split = crate::policy::split(
                self.config.disaggregation.mode,
                &input,
                &remote,
                &choice,
                self.policy.as_ref(),
                || Predictive::new(self.config.policy.predictive.clone()).predict(&input),
            );
            choice.chosen = split.chosen;
            if let Some(c) = choice.costs.get_mut(split.chosen) {
                *c = split.cost;
            }
            (ix, choice, Some((remote, split.remote)))
        });
        let (choice, prefill) = match choice {
            Some((ix, c, p)) => (Some((ix, c)), p),
            None => (None, None),
        };
        Evaluation {
            candidates,
            busy,
            eligible,
            decision,
            choice,
            prefill,
            retry_after,
        }
    }
}

#[cfg(test)]
mod tests;
