//! Approximate mode, for engines that publish no KV events: the router assumes that the
//! worker it chose now caches the routed prompt's blocks, for a time-to-live and up to a
//! per-worker size cap, and expires those guesses with [`ApproxIndex::prune`].

mod learn;

pub use learn::CapacityLearner;

use super::{IndexError, Map, Matches, PrefixIndex};
use crate::hashing::SequenceHash;
use crate::types::{BlockSize, Time, WorkerId};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::Duration;

/// Settings of the approximate mode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApproxConfig {
    /// How long a routed prompt's blocks are assumed cached, in seconds.
    pub ttl_secs: f64,
    /// The most blocks assumed cached per worker; the oldest guesses go first.
    pub max_blocks_per_worker: usize,
}

impl Default for ApproxConfig {
    fn default() -> Self {
        Self {
            ttl_secs: 120.0,
            max_blocks_per_worker: 100_000,
        }
    }
}

impl ApproxConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.ttl_secs.is_finite() && self.ttl_secs > 0.0) {
            return Err(format!(
                "approx ttl_secs must be > 0, got {}",
                self.ttl_secs
            ));
        }
        if self.max_blocks_per_worker == 0 {
            return Err("approx max_blocks_per_worker must be > 0".into());
        }
        Ok(())
    }
}

/// One worker's guesses in expiry order. Refreshing a block pushes a new queue entry and
/// leaves the old one stale (its expiry no longer matches `expiry`); stale entries are
/// skipped when popped and compacted away when they outnumber the live ones.
#[derive(Default)]
struct Guesses {
    /// Each guessed block's expiry.
    expiry: Map<u64, Time>,
    /// The blocks in the order they were last routed (= expiry order), stale entries too.
    queue: VecDeque<(Time, u64)>,
    /// The most blocks kept, when learned ([`ApproxIndex::set_capacity`]).
    cap: Option<usize>,
    /// Guesses made since the capacity was learned (their place in the order).
    untimed: u64,
    /// The engine has said what it found cached ([`ApproxIndex::observe`]).
    answered: bool,
    /// What the engine's answers taught of its capacity.
    learner: CapacityLearner,
}

impl Guesses {
    /// Whether the queue entry `(t, seq)` is the block's current one.
    fn current(&self, t: Time, seq: u64) -> bool {
        self.expiry.get(&seq) == Some(&t)
    }
}

/// Where the untimed guesses' "expiry" counts from: past any time a router reaches (about
/// 35,000 years).
const UNTIMED: Duration = Duration::from_secs(1 << 40);

/// Queue entries [`ApproxIndex::depths`] reads at most: it runs at every dispatch to a
/// worker tracked approximately, under the router's lock, so a block deeper than this in
/// the worker's recency order is read as unknown (no bound learned from it) rather than
/// paid for by a long scan.
pub const MAX_SCAN: usize = 16_384;

/// The prefix index in approximate mode.
pub struct ApproxIndex {
    index: PrefixIndex,
    ttl: Duration,
    cap: usize,
    workers: Map<WorkerId, Guesses>,
}

impl ApproxIndex {
    /// An empty approximate index; `config` must have passed `validate`.
    pub fn new(block_size: BlockSize, config: &ApproxConfig) -> Self {
        Self {
            index: PrefixIndex::new(block_size),
            ttl: Duration::from_secs_f64(config.ttl_secs.max(0.001)),
            cap: config.max_blocks_per_worker.max(1),
            workers: Map::default(),
        }
    }

    /// The index of current guesses, for lookups.
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// Matched depth per worker (see [`PrefixIndex::find_matches_seq`]).
    pub fn find_matches_seq(&self, seqs: &[SequenceHash]) -> Matches {
        self.index.find_matches_seq(seqs)
    }

    /// Whether [`ApproxIndex::insert`] for `worker` would succeed, changing nothing.
    pub fn check_insert(&self, worker: WorkerId) -> Result<(), IndexError> {
        self.index.check_slot(worker)
    }

    /// Records that `worker` was sent the prompt with sequence hashes `seqs` at `now`: its
    /// blocks are assumed cached until `now + ttl` (refreshing earlier guesses), and the
    /// worker's oldest guesses are dropped past the size cap.
    pub fn insert(
        &mut self,
        worker: WorkerId,
        seqs: &[SequenceHash],
        now: Time,
    ) -> Result<(), IndexError> {
        let cap = self
            .workers
            .get(&worker)
            .and_then(|g| g.cap)
            .unwrap_or(self.cap)
            .min(self.cap);
        // Only the first `cap` blocks can be kept; deeper ones would be evicted at once.
        let seqs = &seqs[..seqs.len().min(cap)];
        self.index.insert_chain(worker, seqs)?;
        let g = self.workers.entry(worker).or_default();
        // Once the engine says what it found cached, its guesses age as its LRU does: by what
        // is routed there after them (up to the capacity learned), not by time (the TTL is
        // for engines that say nothing). Their "expiry" is then a count far past any time,
        // one apart each, so the queue keeps its order and a refreshed block's older entry
        // stays stale.
        let expires = if g.answered || g.cap.is_some() {
            g.untimed += 1;
            Time(UNTIMED.saturating_add(Duration::from_nanos(g.untimed)))
        } else {
            now.plus(self.ttl)
        };
        // Deepest blocks first, so that among equal expiries leaves are evicted before roots.
        for s in seqs.iter().rev() {
            g.expiry.insert(s.0, expires);
            g.queue.push_back((expires, s.0));
        }
        self.evict_past(worker, cap);
        Ok(())
    }

    /// Drops `worker`'s oldest guesses past `cap` blocks (the least recently routed first).
    fn evict_past(&mut self, worker: WorkerId, cap: usize) {
        let Some(g) = self.workers.get_mut(&worker) else {
            return;
        };
        while g.expiry.len() > cap {
            match g.queue.pop_front() {
                Some((t, seq)) => {
                    if g.current(t, seq) {
                        g.expiry.remove(&seq);
                        self.index.remove_block(worker, seq);
                    }
                }
                None => break,
            }
        }
        if g.queue.len() > 2 * g.expiry.len() + 64 {
            let expiry = &g.expiry;
            g.queue.retain(|(t, seq)| expiry.get(seq) == Some(t));
        }
    }

    /// For each leading block of `seqs` guessed on `worker` (up to the first that is not),
    /// its depth in the worker's recency order: how many other guessed blocks were routed
    /// there since it last was (an LRU cache of that many blocks or fewer has evicted it).
    /// `None` past the first [`MAX_SCAN`] queue entries read from the newest.
    pub fn depths(&self, worker: WorkerId, seqs: &[SequenceHash]) -> Vec<Option<u64>> {
        let Some(g) = self.workers.get(&worker) else {
            return Vec::new();
        };
        let held = seqs
            .iter()
            .take_while(|s| g.expiry.contains_key(&s.0))
            .count();
        let mut want: Map<u64, usize> = Map::default();
        for (i, s) in seqs[..held].iter().enumerate() {
            want.entry(s.0).or_insert(i);
        }
        let mut out = vec![None; held];
        let mut newer = 0u64;
        let mut found = 0;
        for &(t, seq) in g.queue.iter().rev().take(MAX_SCAN) {
            if found == want.len() {
                break;
            }
            if !g.current(t, seq) {
                continue;
            }
            if let Some(&i) = want.get(&seq) {
                if out[i].is_none() {
                    out[i] = Some(newer);
                    found += 1;
                }
            }
            newer += 1;
        }
        out
    }

    /// Keeps at most `blocks` guesses for `worker` from now on (what its engine was found
    /// to keep), the least recently routed dropped first; never above the configured cap.
    /// Its guesses made from now on no longer expire by time: as in the engine's LRU, they
    /// leave when newer ones push them out.
    pub fn set_capacity(&mut self, worker: WorkerId, blocks: usize) {
        let cap = blocks.clamp(1, self.cap);
        self.workers.entry(worker).or_default().cap = Some(cap);
        self.evict_past(worker, cap);
    }

    /// Learns from one of `worker`'s answers ([`CapacityLearner::observe`]) and keeps its
    /// guesses to the new estimate; the capacity kept now.
    pub fn observe(
        &mut self,
        worker: WorkerId,
        depths: &[Option<u64>],
        predicted: usize,
        reported: usize,
    ) -> usize {
        let kept = self.capacity(worker);
        let g = self.workers.entry(worker).or_default();
        g.answered = true;
        let estimate = g.learner.observe(depths, predicted, reported, kept);
        if let Some(c) = estimate {
            self.set_capacity(worker, c);
        }
        self.capacity(worker)
    }

    /// The most guesses kept for `worker` (learned, else the configured cap).
    pub fn capacity(&self, worker: WorkerId) -> usize {
        self.workers
            .get(&worker)
            .and_then(|g| g.cap)
            .unwrap_or(self.cap)
    }

    /// Drops every guess that expired at or before `now`.
    pub fn prune(&mut self, now: Time) {
        for (worker, g) in self.workers.iter_mut() {
            while let Some(&(t, seq)) = g.queue.front() {
                if t > now {
                    break;
                }
                g.queue.pop_front();
                if g.current(t, seq) {
                    g.expiry.remove(&seq);
                    self.index.remove_block(*worker, seq);
                }
            }
        }
    }

    /// Whether any guess of `worker` stands.
    pub fn has_guesses(&self, worker: WorkerId) -> bool {
        self.workers
            .get(&worker)
            .is_some_and(|g| !g.expiry.is_empty())
    }

    /// Drops the guesses of `worker` holding the blocks `seqs` (the engine said they left):
    /// a guessed prefix stops before the first of them.
    pub fn forget(&mut self, worker: WorkerId, seqs: &[SequenceHash]) {
        let Some(g) = self.workers.get_mut(&worker) else {
            return;
        };
        for s in seqs {
            // Its queue entry is stale from now on: skipped when popped, compacted away.
            if g.expiry.remove(&s.0).is_some() {
                self.index.remove_block(worker, s.0);
            }
        }
    }

    /// Forgets `worker` and its guesses.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        self.workers.remove(&worker);
        self.index.remove_worker(worker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::{sequence_hashes, LocalBlockHash};

    fn prompt(ids: &[u64]) -> Vec<SequenceHash> {
        sequence_hashes(&ids.iter().map(|i| LocalBlockHash(*i)).collect::<Vec<_>>())
    }

    fn approx(ttl: f64, cap: usize) -> ApproxIndex {
        let cfg = ApproxConfig {
            ttl_secs: ttl,
            max_blocks_per_worker: cap,
        };
        cfg.validate().unwrap();
        ApproxIndex::new(BlockSize::new(16).unwrap(), &cfg)
    }

    #[test]
    fn guesses_expire_after_ttl() {
        let mut a = approx(10.0, 100);
        let p = prompt(&[1, 2, 3]);
        a.insert(WorkerId(7), &p, Time::from_millis(0)).unwrap();
        assert_eq!(a.find_matches_seq(&p).depth(WorkerId(7)), 3);
        a.prune(Time::from_millis(9_999));
        assert_eq!(a.find_matches_seq(&p).depth(WorkerId(7)), 3);
        a.prune(Time::from_millis(10_000));
        assert_eq!(a.find_matches_seq(&p).depth(WorkerId(7)), 0);
        assert_eq!(a.index().entries(), 0);
    }

    #[test]
    fn refresh_extends_the_ttl() {
        let mut a = approx(10.0, 100);
        let p = prompt(&[1, 2, 3]);
        a.insert(WorkerId(1), &p, Time::from_millis(0)).unwrap();
        a.insert(WorkerId(1), &p[..2], Time::from_millis(8_000))
            .unwrap();
        a.prune(Time::from_millis(12_000));
        assert_eq!(a.find_matches_seq(&p).depth(WorkerId(1)), 2);
        a.prune(Time::from_millis(18_000));
        assert_eq!(a.find_matches_seq(&p).depth(WorkerId(1)), 0);
    }

    #[test]
    fn size_cap_evicts_oldest_leaves_first() {
        let mut a = approx(100.0, 4);
        let p = prompt(&[1, 2, 3]);
        let q = prompt(&[9, 8, 7]);
        a.insert(WorkerId(1), &p, Time::from_millis(0)).unwrap();
        a.insert(WorkerId(1), &q, Time::from_millis(1)).unwrap();
        assert_eq!(a.index().block_count(WorkerId(1)), 4);
        // The two deepest blocks of the older prompt went first.
        assert_eq!(a.find_matches_seq(&p).depth(WorkerId(1)), 1);
        assert_eq!(a.find_matches_seq(&q).depth(WorkerId(1)), 3);
    }

    #[test]
    fn a_learned_capacity_ages_guesses_by_what_follows_not_by_time() {
        let mut a = approx(10.0, 100);
        let (p, q, r) = (prompt(&[1, 2]), prompt(&[3, 4]), prompt(&[5, 6]));
        a.set_capacity(WorkerId(1), 4);
        assert_eq!(a.capacity(WorkerId(1)), 4);
        a.insert(WorkerId(1), &p, Time::from_millis(0)).unwrap();
        a.insert(WorkerId(1), &q, Time::from_millis(1)).unwrap();
        // Long past the TTL they stand...
        a.prune(Time::from_millis(3_600_000));
        assert_eq!(a.find_matches_seq(&p).depth(WorkerId(1)), 2);
        // ...and depths read their recency: q's blocks are the newest (its root last, as
        // a prompt's blocks are noted leaf first), p's behind them.
        assert_eq!(a.depths(WorkerId(1), &q), [Some(0), Some(1)]);
        assert_eq!(a.depths(WorkerId(1), &p), [Some(2), Some(3)]);
        // p refreshed, then r pushes out the least recently routed: q.
        a.insert(WorkerId(1), &p, Time::from_millis(3_600_001))
            .unwrap();
        a.insert(WorkerId(1), &r, Time::from_millis(3_600_002))
            .unwrap();
        assert_eq!(a.find_matches_seq(&q).depth(WorkerId(1)), 0);
        assert_eq!(a.find_matches_seq(&p).depth(WorkerId(1)), 2);
        // Never above the configured cap.
        a.set_capacity(WorkerId(1), 1_000);
        assert_eq!(a.capacity(WorkerId(1)), 100);
    }

    #[test]
    fn stale_queue_entries_are_compacted() {
        let mut a = approx(100.0, 10);
        let p = prompt(&[1, 2]);
        for i in 0..1_000 {
            a.insert(WorkerId(1), &p, Time::from_millis(i)).unwrap();
        }
        let g = &a.workers[&WorkerId(1)];
        assert!(
            g.queue.len() <= 2 * g.expiry.len() + 66,
            "{}",
            g.queue.len()
        );
    }

    #[test]
    fn bad_config_is_rejected() {
        assert!(approx_cfg(0.0, 1).validate().is_err());
        assert!(approx_cfg(f64::NAN, 1).validate().is_err());
        assert!(approx_cfg(1.0, 0).validate().is_err());
    }

    fn approx_cfg(ttl: f64, cap: usize) -> ApproxConfig {
        ApproxConfig {
            ttl_secs: ttl,
            max_blocks_per_worker: cap,
        }
    }
}
