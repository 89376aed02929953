//! Answers of workers tracked approximately, as the router learns from them: at a dispatch
//! to such a worker, the depth of each of the prompt's guessed blocks in the worker's
//! recency order (read before the dispatch refreshes them) and the blocks predicted; when
//! the engine says how many prompt tokens it found cached ([`Router::observe_cached`]), the
//! approximate index learns how many blocks the engine really keeps and ages its guesses
//! like it ([`crate::index::CapacityLearner`]).

use super::Router;
use crate::types::{RequestId, WorkerId};
use std::collections::VecDeque;

type Map<K, V> = hashbrown::HashMap<K, V, foldhash::fast::RandomState>;

/// Dispatches remembered for their answers at most (the oldest forgotten first).
const MAX_AWAITED: usize = 65_536;

/// One dispatch awaiting its answer.
#[derive(Debug)]
struct Dispatched {
    worker: WorkerId,
    predicted: usize,
    depths: Vec<Option<u64>>,
}

/// The dispatches awaiting their answers.
#[derive(Debug, Default)]
pub(super) struct Awaited {
    by_request: Map<RequestId, Dispatched>,
    order: VecDeque<RequestId>,
}

impl Awaited {
    fn insert(&mut self, request: RequestId, d: Dispatched) {
        while self.order.len() >= MAX_AWAITED {
            if let Some(old) = self.order.pop_front() {
                self.by_request.remove(&old);
            }
        }
        if self.by_request.insert(request, d).is_none() {
            self.order.push_back(request);
        }
    }

    fn take(&mut self, request: RequestId) -> Option<Dispatched> {
        // Its id stays in `order` until it comes up (bounded all the same).
        self.by_request.remove(&request)
    }
}

impl Router {
    /// Remembers, for a dispatch of `request` to `worker` tracked approximately, where the
    /// prompt's guessed blocks stand before the dispatch refreshes them.
    pub(super) fn await_answer(
        &mut self,
        request: RequestId,
        worker: WorkerId,
        predicted: usize,
        sequence: &[crate::hashing::SequenceHash],
    ) {
        if !self.approximate.contains(&worker) {
            return;
        }
        let depths = self.approx.depths(worker, sequence);
        self.answers.insert(
            request,
            Dispatched {
                worker,
                predicted,
                depths,
            },
        );
    }

    /// The engine of `request`'s worker found `cached_tokens` of its prompt cached: a
    /// worker tracked approximately learns from it how many blocks its engine keeps. The
    /// capacity its guesses are kept to now, for such a worker (None otherwise).
    pub fn observe_cached(&mut self, request: RequestId, cached_tokens: usize) -> Option<usize> {
        let d = self.answers.take(request)?;
        if !self.approximate.contains(&d.worker) {
            return None;
        }
        let reported = cached_tokens / self.block_size.get();
        Some(
            self.approx
                .observe(d.worker, &d.depths, d.predicted, reported),
        )
    }

    /// The most blocks assumed cached on `worker` when it is tracked approximately: learned
    /// from its answers, else `approx.max_blocks_per_worker`.
    pub fn approx_capacity(&self, worker: WorkerId) -> Option<usize> {
        self.approximate
            .contains(&worker)
            .then(|| self.approx.capacity(worker))
    }
}
