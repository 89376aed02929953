//! The load ledger: what the router has put on each worker and not yet seen finish.
//!
//! Booked on dispatch ([`LoadLedger::book`]), partly released on the first token
//! ([`LoadLedger::first_token`]: the request's prefill is done) and fully released on
//! completion or failure ([`LoadLedger::finish`]). Per worker it keeps outstanding prefill
//! tokens, active KV blocks of in-flight requests (a prefix block shared by several in-flight
//! requests counts once) and in-flight requests. From the observed first-token times it
//! learns each worker's prefill speed ([`PrefillFit`]), and from the requests that finish
//! with their output token counts its decode speed against batch and KV ([`DecodeFit`]),
//! which the predictive and goodput policies use.

mod decode;
mod fit;
mod robust;

pub use decode::{DecodeEstimate, DecodeFit};
pub use fit::{PrefillEstimate, PrefillFit};

use crate::flat_table::{FlatTable, Pair};
use crate::hashing::SequenceHash;
use crate::types::{RequestId, Time, WorkerId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

type Map<K, V> = hashbrown::HashMap<K, V, foldhash::fast::RandomState>;

/// The default limit on requests in flight in one ledger.
pub const DEFAULT_MAX_INFLIGHT: usize = 1_000_000;

/// What a worker can hold, when known (engine metrics or configuration).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerCapacity {
    /// KV cache blocks of the worker.
    pub kv_blocks: Option<u64>,
    /// Most sequences the worker runs at once (`max_num_seqs`).
    pub max_batch: Option<u32>,
}

/// Load an engine reported about itself (metrics scrape or load events).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineLoad {
    /// Requests running.
    pub running: u32,
    /// Requests waiting in the engine's queue.
    pub waiting: u32,
    /// Fraction of the KV cache in use, 0..=1.
    pub kv_usage: f64,
}

/// One worker's booked load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerLoad {
    /// Requests dispatched and not finished.
    pub inflight: u32,
    /// Uncached prompt tokens of in-flight requests that have no first token yet.
    pub prefill_tokens: u64,
    /// KV blocks of in-flight requests (shared full blocks once, partial tails each).
    pub active_blocks: u64,
    /// Prompt tokens of in-flight requests, each request's counted (shared or not): the KV
    /// their decode steps read.
    #[serde(default)]
    pub context_tokens: u64,
    /// The in-flight requests' miss weights summed (`inflight` when every one weighs 1):
    /// what the goodput policy counts when it predicts that they miss.
    #[serde(default)]
    pub miss_weights: f64,
    /// The engine's own report, when one arrived.
    pub engine: Option<EngineLoad>,
}

/// One worker as the ledger knows it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorkerView {
    /// The worker.
    pub worker: WorkerId,
    /// Booked load.
    pub load: WorkerLoad,
    /// Known capacity.
    pub capacity: WorkerCapacity,
    /// Learned prefill speed.
    pub prefill: Option<PrefillEstimate>,
    /// Mean dispatch-to-finish seconds.
    pub service_secs: Option<f64>,
    /// Learned decode speed.
    pub decode: Option<DecodeEstimate>,
    /// Mean output tokens of the requests that finished there with a count.
    pub output_tokens: Option<f64>,
}

/// A request being dispatched to a worker.
#[derive(Clone, Copy, Debug)]
pub struct Booking<'a> {
    /// The request.
    pub request: RequestId,
    /// The chosen worker.
    pub worker: WorkerId,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens the router expects the worker to have cached.
    pub cached_tokens: usize,
    /// Sequence hashes of the prompt's full blocks.
    pub blocks: &'a [SequenceHash],
    /// How much its missing an objective weighs (its class's `miss_weight`; 1 without).
    pub miss_weight: f64,
}

/// Ledger misuse, reported rather than panicking.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// The worker was never added (or was removed).
    #[error("worker {0} is not registered")]
    UnknownWorker(WorkerId),
    /// The request is already booked.
    #[error("request {0} is already in flight")]
    DuplicateRequest(RequestId),
    /// The request is not in flight (never booked, or already finished).
    #[error("request {0} is not in flight")]
    UnknownRequest(RequestId),
    /// Too many requests in flight.
    #[error("the ledger already tracks its limit of {0} requests in flight")]
    TooManyInflight(usize),
}

struct Inflight {
    worker: WorkerId,
    booked_at: Time,
    /// The worker incarnation booked (a removed and re-added worker starts afresh).
    generation: u64,
    /// Uncached tokens of this request counted as outstanding prefill.
    prefill_tokens: u64,
    /// True once the first token released `prefill_tokens`.
    prefilled: bool,
    /// Prefill work ahead of and including this request at booking: the fit's x.
    work_tokens: u64,
    /// Its prompt's tokens (in its worker's context tokens).
    prompt_tokens: u64,
    blocks: Box<[u64]>,
    partial_block: bool,
    /// The worker's running sums when its first token came (its decode's start).
    decode_from: Option<Sums>,
    /// Its worker computes its prompt (else a prefill worker did: its first token is no
    /// sample of this worker's prefill speed).
    prefills_here: bool,
    /// Its miss weight (in its worker's `miss_weights`).
    miss_weight: f64,
}

/// A worker's running sums: time-integrals of its booked batch and KV, and the prefill
/// tokens it has worked through (first tokens come), at `at`.
#[derive(Clone, Copy, Debug, Default)]
struct Sums {
    at: Time,
    seq_secs: f64,
    context_secs: f64,
    prefilled_tokens: f64,
}

#[derive(Default)]
struct WorkerState {
    generation: u64,
    load: WorkerLoad,
    capacity: WorkerCapacity,
    /// The full blocks of in-flight requests (their number is the active block count), each
    /// with a count: the booked chains that end at it plus its children present. A prompt's
    /// blocks form a chain from the root, so when a chain's last block is present all its
    /// blocks are: booking walks back from the end only over the blocks that are new, and
    /// release walks back only over the blocks it is the last to hold.
    active: FlatTable<Pair<u32>>,
    partial_blocks: u64,
    fit: PrefillFit,
    /// Exponentially weighted mean of dispatch-to-finish seconds.
    service_secs: Option<f64>,
    sums: Sums,
    /// The ledger's booking count at this worker's last first token (see [`STALE_PER_WORKER`]).
    sampled_at: u64,
    /// Work was booked here while its figures were stale: the next first token starts the
    /// prefill fit afresh.
    refit: bool,
    decode: DecodeFit,
    /// Exponentially weighted mean of output tokens.
    output_tokens: Option<f64>,
}

impl WorkerState {
    fn refresh_blocks(&mut self) {
        self.load.active_blocks = self.active.len() as u64 + self.partial_blocks;
    }

    /// Brings the running sums to `now` (before the load changes).
    fn advance(&mut self, now: Time) {
        let s = &mut self.sums;
        let dt = now.since(s.at).as_secs_f64();
        s.seq_secs += f64::from(self.load.inflight) * dt;
        s.context_secs += self.load.context_tokens as f64 * dt;
        s.at = s.at.max(now);
    }

    /// A request that decoded from `from` to now (`sums`, already advanced) and wrote
    /// `output` tokens teaches the decode fit.
    fn learn_decode(&mut self, from: Sums, output: u64) {
        let now = self.sums;
        let span = now.at.since(from.at).as_secs_f64();
        if output < 2 || span <= 0.0 {
            return;
        }
        let batch = (now.seq_secs - from.seq_secs) / span;
        let kv_tokens = (now.context_secs - from.context_secs) / span;
        // The share of the span the worker spent prefilling others (at its learned speed)
        // is not decode time.
        let prefill_secs = self.fit.estimate().map_or(0.0, |e| {
            (now.prefilled_tokens - from.prefilled_tokens) * e.secs_per_token
        });
        let busy = (prefill_secs / span).clamp(0.0, 0.9);
        let step = span * (1.0 - busy) / (output - 1) as f64;
        self.decode.observe(batch, kv_tokens, step);
        self.output_tokens = Some(match self.output_tokens {
            None => output as f64,
            Some(m) => m + SERVICE_ALPHA * (output as f64 - m),
        });
    }
}

/// The per-worker load ledger. Workers iterate in id order (deterministic).
pub struct LoadLedger {
    block_size: usize,
    max_inflight: usize,
    workers: BTreeMap<WorkerId, WorkerState>,
    requests: Map<RequestId, Inflight>,
    generations: u64,
    /// Bookings made so far.
    bookings: u64,
}

/// Weight of a new sample in the service-time mean (about the last 32 requests).
const SERVICE_ALPHA: f64 = 1.0 / 32.0;

/// A worker's learned speeds are stale once this many bookings per worker went elsewhere
/// since its last first token: routing then sees none (policies use the fleet's figures for
/// it), and its prefill fit starts afresh at its next first token. A worker that looked slow
/// from a few bad samples (a cold start) is otherwise never chosen again, so never measured
/// again.
pub const STALE_PER_WORKER: u64 = 256;

/// The same for a worker with nothing in flight: its figures are stale after this many
/// bookings per worker elsewhere. A worker takes about one booking in N while the load is
/// spread; one left idle for 4N while the others take the load is being avoided on figures
/// that nothing corrects (after a cold burst whose shared prefixes bent every worker's fit,
/// the one that came out a little slower sat idle while the others were at their batch
/// limit), and measuring it again costs nothing of its own.
pub const IDLE_STALE_PER_WORKER: u64 = 4;

impl LoadLedger {
    /// An empty ledger for blocks of `block_size` tokens.
    pub fn new(block_size: crate::BlockSize) -> Self {
        Self::with_max_inflight(block_size, DEFAULT_MAX_INFLIGHT)
    }

    /// An empty ledger tracking at most `max_inflight` requests.
    pub fn with_max_inflight(block_size: crate::BlockSize, max_inflight: usize) -> Self {
        Self {
            block_size: block_size.get(),
            max_inflight,
            workers: BTreeMap::new(),
            requests: Map::default(),
            generations: 0,
            bookings: 0,
        }
    }

    /// Registers a worker (or updates its capacity).
    pub fn add_worker(&mut self, worker: WorkerId, capacity: WorkerCapacity) {
        let generations = &mut self.generations;
        self.workers
            .entry(worker)
            .or_insert_with(|| {
                *generations += 1;
                WorkerState {
                    generation: *generations,
                    ..WorkerState::default()
                }
            })
            .capacity = capacity;
    }

    /// Forgets a worker. Its in-flight requests stay booked until finished, but no longer
    /// count anywhere.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        self.workers.remove(&worker);
    }

    /// Records an engine's own load report.
    pub fn report_engine_load(
        &mut self,
        worker: WorkerId,
        load: EngineLoad,
    ) -> Result<(), LedgerError> {
        let w = self
            .workers
            .get_mut(&worker)
            .ok_or(LedgerError::UnknownWorker(worker))?;
        w.load.engine = Some(load);
        Ok(())
    }

    /// Registered workers in id order.
    pub fn workers(&self) -> impl Iterator<Item = WorkerId> + '_ {
        self.workers.keys().copied()
    }

    /// Every registered worker's booked load, capacity and learned figures, in id order (one
    /// pass, for routing).
    pub fn views(&self) -> impl Iterator<Item = WorkerView> + '_ {
        self.workers.iter().map(|(&worker, w)| {
            let fresh = !self.is_stale(w);
            WorkerView {
                worker,
                load: w.load,
                capacity: w.capacity,
                prefill: w.fit.estimate().filter(|_| fresh),
                service_secs: w.service_secs,
                decode: w.decode.estimate().filter(|_| fresh),
                output_tokens: w.output_tokens,
            }
        })
    }

    /// Whether a worker's learned speeds are too old to route on ([`STALE_PER_WORKER`],
    /// [`IDLE_STALE_PER_WORKER`] while it has nothing in flight).
    fn is_stale(&self, w: &WorkerState) -> bool {
        let per_worker = if w.load.inflight == 0 {
            IDLE_STALE_PER_WORKER
        } else {
            STALE_PER_WORKER
        };
        let limit = per_worker.saturating_mul(self.workers.len() as u64);
        self.bookings.saturating_sub(w.sampled_at) > limit
    }

    /// Number of registered workers.
    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// A worker's booked load.
    pub fn load(&self, worker: WorkerId) -> Option<WorkerLoad> {
        self.workers.get(&worker).map(|w| w.load)
    }

    /// A worker's capacity.
    pub fn capacity(&self, worker: WorkerId) -> Option<WorkerCapacity> {
        self.workers.get(&worker).map(|w| w.capacity)
    }

    /// A worker's learned prefill speed, when it has served a first token.
    pub fn prefill_estimate(&self, worker: WorkerId) -> Option<PrefillEstimate> {
        self.workers.get(&worker).and_then(|w| w.fit.estimate())
    }

    /// A worker's mean dispatch-to-finish time in seconds, when a request finished there.
    pub fn service_secs(&self, worker: WorkerId) -> Option<f64> {
        self.workers.get(&worker).and_then(|w| w.service_secs)
    }

    /// Requests in flight.
    pub fn inflight(&self) -> usize {
        self.requests.len()
    }

    /// Whether [`LoadLedger::book`] would take `request` on `worker`, changing nothing: the
    /// request is new, the ledger has room, the worker is known.
    pub fn check_booking(&self, request: RequestId, worker: WorkerId) -> Result<(), LedgerError> {
        if self.requests.contains_key(&request) {
            return Err(LedgerError::DuplicateRequest(request));
        }
        if self.requests.len() >= self.max_inflight {
            return Err(LedgerError::TooManyInflight(self.max_inflight));
        }
        if !self.workers.contains_key(&worker) {
            return Err(LedgerError::UnknownWorker(worker));
        }
        Ok(())
    }

    /// Books a request on its worker at `now`.
    pub fn book(&mut self, b: &Booking<'_>, now: Time) -> Result<(), LedgerError> {
        self.book_with(b, now, true)
    }

    /// Books a request whose prompt another worker computes (disaggregated prefill): it
    /// arrives with its KV, so no prefill work is booked here, and its first token (which
    /// waited for that other worker and the transfer) teaches this worker's prefill fit
    /// nothing.
    pub fn book_decode(&mut self, b: &Booking<'_>, now: Time) -> Result<(), LedgerError> {
        self.book_with(b, now, false)
    }

    fn book_with(
        &mut self,
        b: &Booking<'_>,
        now: Time,
        prefills_here: bool,
    ) -> Result<(), LedgerError> {
        self.check_booking(b.request, b.worker)?;
        let stale = self
            .workers
            .get(&b.worker)
            .is_some_and(|w| self.is_stale(w));
        let w = self
            .workers
            .get_mut(&b.worker)
            .ok_or(LedgerError::UnknownWorker(b.worker))?;
        let uncached = if prefills_here {
            b.prompt_tokens.saturating_sub(b.cached_tokens) as u64
        } else {
            0
        };
        let full = b.blocks.len().min(b.prompt_tokens / self.block_size);
        let blocks: Box<[u64]> = b.blocks[..full].iter().map(|s| s.0).collect();
        w.active.warm(blocks.iter().copied());
        for s in blocks.iter().rev() {
            let mut new = false;
            w.active.modify(*s, |count| {
                new = count.is_none();
                Some(count.unwrap_or(0) + 1)
            });
            if !new {
                break;
            }
        }
        let partial_block = b.prompt_tokens > full * self.block_size;
        // Sent work on stale figures: its next first token starts the fit afresh.
        w.refit |= stale;
        self.bookings += 1;
        w.advance(now);
        w.partial_blocks += u64::from(partial_block);
        w.load.inflight += 1;
        w.load.prefill_tokens += uncached;
        w.load.context_tokens += b.prompt_tokens as u64;
        let miss_weight = if b.miss_weight.is_finite() {
            b.miss_weight.max(0.0)
        } else {
            1.0
        };
        w.load.miss_weights += miss_weight;
        w.refresh_blocks();
        self.requests.insert(
            b.request,
            Inflight {
                worker: b.worker,
                booked_at: now,
                generation: w.generation,
                prefill_tokens: uncached,
                prefilled: false,
                work_tokens: w.load.prefill_tokens,
                prompt_tokens: b.prompt_tokens as u64,
                blocks,
                partial_block,
                decode_from: None,
                prefills_here,
                miss_weight,
            },
        );
        Ok(())
    }

    /// The prompt tokens of a booked request.
    pub fn prompt_tokens(&self, request: RequestId) -> Result<u64, LedgerError> {
        self.requests
            .get(&request)
            .map(|r| r.prompt_tokens)
            .ok_or(LedgerError::UnknownRequest(request))
    }

    /// The KV of a request booked by [`LoadLedger::book_decode`] reached its worker at `now`,
    /// which still computes the prompt's last `tail_tokens`: from now on the request is
    /// that worker's prefill work of those tokens, and its first token, timed from now, is a
    /// sample of the worker's prefill speed like any other. Once per request; a no-op after
    /// its first token or for a request whose worker computes its whole prompt.
    pub fn kv_arrived(
        &mut self,
        request: RequestId,
        tail_tokens: u64,
        now: Time,
    ) -> Result<(), LedgerError> {
        let r = self
            .requests
            .get_mut(&request)
            .ok_or(LedgerError::UnknownRequest(request))?;
        if r.prefilled || r.prefills_here {
            return Ok(());
        }
        let Some(w) = self
            .workers
            .get_mut(&r.worker)
            .filter(|w| w.generation == r.generation)
        else {
            return Ok(());
        };
        w.advance(now);
        w.load.prefill_tokens += tail_tokens;
        r.prefills_here = true;
        r.prefill_tokens = tail_tokens;
        r.work_tokens = w.load.prefill_tokens;
        r.booked_at = now;
        Ok(())
    }

    /// The request produced its first token at `now`: its prefill is no longer outstanding,
    /// and the time it took teaches the worker's prefill fit. Repeated calls are no-ops.
    pub fn first_token(&mut self, request: RequestId, now: Time) -> Result<(), LedgerError> {
        let r = self
            .requests
            .get_mut(&request)
            .ok_or(LedgerError::UnknownRequest(request))?;
        if r.prefilled {
            return Ok(());
        }
        r.prefilled = true;
        let stale_limit = STALE_PER_WORKER.saturating_mul(self.workers.len() as u64);
        if let Some(w) = self
            .workers
            .get_mut(&r.worker)
            .filter(|w| w.generation == r.generation)
        {
            w.load.prefill_tokens = w.load.prefill_tokens.saturating_sub(r.prefill_tokens);
            if r.prefills_here {
                if std::mem::take(&mut w.refit)
                    || self.bookings.saturating_sub(w.sampled_at) > stale_limit
                {
                    // What was learned is too old to correct: start afresh.
                    w.fit = PrefillFit::default();
                }
                w.sampled_at = self.bookings;
                w.fit
                    .observe(r.work_tokens as f64, now.since(r.booked_at).as_secs_f64());
            } else {
                // A split request's decode (its prompt computed elsewhere) teaches nothing
                // of this worker's prefill, but the worker is being chosen: its figures are
                // not those of a worker left aside, and must not be dropped for a fit that
                // starts afresh from the few prompts it still computes itself.
                w.sampled_at = self.bookings;
            }
            w.advance(now);
            w.sums.prefilled_tokens += r.prefill_tokens as f64;
            r.decode_from = Some(w.sums);
        }
        Ok(())
    }

    /// The request finished at `now` (completed, failed or cancelled): all its load is
    /// released.
    pub fn finish(&mut self, request: RequestId, now: Time) -> Result<(), LedgerError> {
        self.finish_with(request, now, None)
    }

    /// [`LoadLedger::finish`], for a request that wrote `output_tokens` tokens (when
    /// counted): its time per token teaches the worker's decode fit.
    pub fn finish_with(
        &mut self,
        request: RequestId,
        now: Time,
        output_tokens: Option<u64>,
    ) -> Result<(), LedgerError> {
        let r = self
            .requests
            .remove(&request)
            .ok_or(LedgerError::UnknownRequest(request))?;
        let Some(w) = self
            .workers
            .get_mut(&r.worker)
            .filter(|w| w.generation == r.generation)
        else {
            return Ok(());
        };
        if !r.prefilled {
            w.load.prefill_tokens = w.load.prefill_tokens.saturating_sub(r.prefill_tokens);
        }
        w.advance(now);
        if let (Some(from), Some(out)) = (r.decode_from, output_tokens) {
            w.learn_decode(from, out);
        }
        w.active.warm(r.blocks.iter().copied());
        for s in r.blocks.iter().rev() {
            let mut dropped = false;
            w.active.modify(*s, |count| {
                let left = count?.saturating_sub(1);
                dropped = left == 0;
                Some(left).filter(|&c| c > 0)
            });
            // Absent, or still held by another chain: the blocks before it are held too.
            if !dropped {
                break;
            }
        }
        w.partial_blocks -= u64::from(r.partial_block).min(w.partial_blocks);
        w.load.inflight = w.load.inflight.saturating_sub(1);
        w.load.context_tokens = w.load.context_tokens.saturating_sub(r.prompt_tokens);
        // Exact again when none is left (sums of fractions drift).
        w.load.miss_weights = match w.load.inflight {
            0 => 0.0,
            _ => (w.load.miss_weights - r.miss_weight).max(0.0),
        };
        w.refresh_blocks();
        let secs = now.since(r.booked_at).as_secs_f64();
        w.service_secs = Some(match w.service_secs {
            None => secs,
            Some(m) => m + SERVICE_ALPHA * (secs - m),
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests;
