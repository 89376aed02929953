//! The continuous-batching scheduler of the simulated engine (vLLM v1 style).
//!
//! Each step: running sequences first (decoding ones, then those still prefilling), then
//! waiting ones in FCFS order, within `max_num_seqs` sequences and `max_num_batched_tokens`
//! tokens; long prompts are prefilled in chunks. A sequence needs KV for all its tokens; when
//! a step computes its last one, it samples a new token (the first token ends the prefill).
//! When the pool has no block for a running sequence, the most recently admitted unscheduled
//! sequence is preempted (its blocks freed, recomputed later from the front of the queue).
//! With priority scheduling the order and the victim follow the requests' priorities
//! (`engine/priority.rs`).
//! Admission reuses the longest cached prefix (at most all but one prompt token).
//!
//! A step's effects (tokens, cached blocks) land at its end; its duration comes from the
//! [`StepModel`]. Time is an argument everywhere.

mod host;
mod priority;
mod request;
mod silent;
mod token_runs;

pub use request::{EngineError, EnginePrompt, EngineRequest, Finished, Sampled, StepOutput};
pub use token_runs::TokenRuns;

use crate::pool::{BlockPool, FullBlock};
use crate::profile::Profile;
use crate::timing::{StepModel, StepShape};
use kvroute_core::{RequestId, Time};
use request::Seq;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// Engine settings.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// KV block size in tokens.
    pub block_size: usize,
    /// KV blocks.
    pub num_gpu_blocks: usize,
    /// Most sequences per step.
    pub max_num_seqs: usize,
    /// Most tokens per step.
    pub max_num_batched_tokens: usize,
    /// Most requests waiting.
    pub max_waiting: usize,
    /// Fixed latency between a request's arrival and its first possible step (frontend,
    /// tokenization, engine queueing outside the step loop).
    pub request_overhead: Duration,
    /// Step timing.
    pub model: StepModel,
    /// `Stored` events carry token ids (as engines on the wire do). Off: they carry the
    /// router's sequence hashes (`StoredHashed`), for a router in the same process.
    pub kv_events_with_tokens: bool,
    /// Blocks of the host tier (0: none): blocks written through from the device and
    /// loaded back for a prefix the device no longer holds (`engine/host.rs`).
    pub host_blocks: usize,
    /// Seconds to load one token's KV back from the host tier.
    pub host_load_secs_per_token: f64,
    /// The token ids to sample from (1 to [`MAX_OUTPUT_IDS`]):
    /// a live worker gives the ids of its tokenizer whose text tokenizes back to them, so
    /// an answer sent back in the next turn's prompt finds its blocks cached. `None`: ids
    /// in 100..32,099, meaning nothing (the simulator's; see `request::output_token`).
    pub output_ids: Option<Arc<[u32]>>,
    /// vLLM's `--scheduling-policy priority`: waiting requests taken by their
    /// [`EngineRequest::priority`] (lower first), then arrival; when the cache runs out the
    /// running request of the largest priority value (the latest among equals) is preempted
    /// (`engine/priority.rs`). Off: first come, first served.
    pub priority_scheduling: bool,
}

/// Most entries of [`EngineConfig::output_ids`].
pub const MAX_OUTPUT_IDS: usize = 1 << 20;

/// The default seconds to load one token's KV back from a host tier: an 8B-parameter model
/// in 16-bit precision holds 128 KiB of KV per token, about 5 us over a 25 GB/s host link.
pub const HOST_LOAD_SECS_PER_TOKEN: f64 = 5e-6;

impl EngineConfig {
    /// The settings of a profile, at its own block size.
    pub fn from_profile(p: &Profile) -> Self {
        Self::from_profile_with_block_size(p, p.block_size)
    }

    /// The settings of a profile at another block size (same KV memory).
    pub fn from_profile_with_block_size(p: &Profile, block_size: usize) -> Self {
        Self {
            block_size,
            num_gpu_blocks: p.kv_blocks(block_size),
            max_num_seqs: p.max_num_seqs,
            max_num_batched_tokens: p.max_num_batched_tokens,
            max_waiting: 100_000,
            request_overhead: Duration::from_secs_f64(p.request_overhead_ms.max(0.0) / 1e3),
            model: p.step_model(),
            kv_events_with_tokens: true,
            host_blocks: 0,
            host_load_secs_per_token: HOST_LOAD_SECS_PER_TOKEN,
            output_ids: None,
            priority_scheduling: false,
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |m: &str| Err(EngineError::InvalidConfig(m.to_string()));
        if self.block_size == 0 || self.block_size > kvroute_core::BlockSize::MAX {
            return bad("block_size out of range");
        }
        if self.num_gpu_blocks == 0 || self.num_gpu_blocks > crate::pool::MAX_BLOCKS {
            return bad("num_gpu_blocks must be between 1 and 2^30 - 1");
        }
        if self.max_num_seqs == 0 || self.max_num_batched_tokens == 0 || self.max_waiting == 0 {
            return bad("max_num_seqs, max_num_batched_tokens and max_waiting must be > 0");
        }
        if self.host_blocks > crate::pool::MAX_BLOCKS {
            return bad("host_blocks must be at most 2^30 - 1");
        }
        if !(self.host_load_secs_per_token.is_finite() && self.host_load_secs_per_token >= 0.0) {
            return bad("host_load_secs_per_token must be >= 0");
        }
        if let Some(ids) = &self.output_ids {
            if ids.is_empty() || ids.len() > MAX_OUTPUT_IDS {
                return bad("output_ids must hold 1 to 2^20 token ids");
            }
        }
        Ok(())
    }
}

/// A metrics snapshot (counters are totals since the engine started).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineMetrics {
    /// Sequences running.
    pub running: usize,
    /// Requests waiting.
    pub waiting: usize,
    /// Fraction of KV blocks referenced by sequences.
    pub kv_usage: f64,
    /// KV blocks in all.
    pub kv_blocks: usize,
    /// Distinct block hashes cached.
    pub cached_blocks: usize,
    /// Blocks held in the host tier.
    #[serde(default)]
    pub host_blocks: usize,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens_total: u64,
    /// Of those, tokens found in the prefix cache (or the host tier, or sent with the
    /// request).
    pub prefix_hit_tokens_total: u64,
    /// Prompt tokens whose KV came with their request (disaggregated prefill).
    #[serde(default)]
    pub remote_tokens_total: u64,
    /// Tokens generated.
    pub generated_tokens_total: u64,
    /// Requests admitted (first time).
    pub admitted_total: u64,
    /// Seconds admitted requests waited before their first step.
    pub queue_secs_total: f64,
    /// Seconds spent in steps (busy ratio = its growth over elapsed time).
    pub busy_secs_total: f64,
    /// Steps run.
    pub steps_total: u64,
    /// Preemptions.
    pub preemptions_total: u64,
}

struct Inflight {
    ended: Time,
    /// `(index in running, tokens computed)`.
    work: Vec<(usize, usize)>,
    /// Every running sequence decodes one token (see [`Engine::schedule_decode`]).
    pure_decode: bool,
}

/// The simulated engine. See the module documentation.
pub struct Engine {
    cfg: EngineConfig,
    pool: BlockPool,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    live: hashbrown::HashSet<RequestId, foldhash::fast::RandomState>,
    inflight: Option<Inflight>,
    now: Time,
    stalled: bool,
    metrics: EngineMetrics,
    /// Per-step scratch space, kept to spare the allocator.
    scratch: Scratch,
    /// The silent steps ahead (see the `silent` module).
    silent: silent::Plan,
    /// Tokens of silent steps run outside [`Engine::step_into`], not reported yet.
    sampled: Vec<Sampled>,
    /// The same, by run (see [`Engine::set_token_runs`]).
    sampled_runs: TokenRuns,
    /// Fast paths off (see [`Engine::set_fast_paths`]).
    plain: bool,
    /// Silent steps' tokens reported by run (see [`Engine::set_token_runs`]).
    token_runs: bool,
    /// The host tier, when configured.
    host: Option<host::HostTier>,
    /// Tokens the step being scheduled loads back from the host tier.
    loading_tokens: usize,
}

/// Buffers the scheduler reuses from step to step.
#[derive(Default)]
struct Scratch {
    scheduled: Vec<bool>,
    preempted: Vec<bool>,
    decoding: Vec<bool>,
    work: Vec<(usize, usize)>,
}

impl Engine {
    /// An idle engine with an empty cache.
    pub fn new(cfg: EngineConfig) -> Result<Self, EngineError> {
        cfg.validate()?;
        let host = (cfg.host_blocks > 0)
            .then(|| host::HostTier::new(cfg.host_blocks, !cfg.kv_events_with_tokens));
        Ok(Self {
            pool: BlockPool::new(cfg.num_gpu_blocks, cfg.block_size)
                .with_event_tokens(cfg.kv_events_with_tokens),
            cfg,
            waiting: VecDeque::new(),
            running: Vec::new(),
            live: Default::default(),
            inflight: None,
            now: Time::ZERO,
            stalled: false,
            metrics: EngineMetrics::default(),
            scratch: Scratch::default(),
            silent: silent::Plan::default(),
            sampled: Vec::new(),
            sampled_runs: TokenRuns::default(),
            plain: false,
            token_runs: false,
            host,
            loading_tokens: 0,
        })
    }

    /// Turns the fast paths (decode-only scheduling, silent runs) on or off. Outputs are the
    /// same either way, only slower without them: for tests that check exactly that.
    pub fn set_fast_paths(&mut self, on: bool) {
        self.plain = !on;
        self.silent.invalidate();
    }

    /// Reports the tokens of silent steps by run, in [`StepOutput::runs`], rather than one
    /// by one in [`StepOutput::tokens`] (off by default). A run's tokens carry their request
    /// and time, not their token id (a request's tokens are still all in its
    /// [`Finished::output`]).
    pub fn set_token_runs(&mut self, on: bool) {
        self.token_runs = on;
    }

    /// The settings.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The block pool (read only).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Queues a request arriving at `now`.
    pub fn submit(&mut self, req: EngineRequest, now: Time) -> Result<(), EngineError> {
        let bs = self.cfg.block_size;
        let len = req.prompt.len(bs);
        if len == 0 {
            return Err(EngineError::EmptyPrompt(req.id));
        }
        if req.max_tokens == 0 {
            return Err(EngineError::ZeroMaxTokens(req.id));
        }
        if let EnginePrompt::Hashed { tail, .. } = &req.prompt {
            let reason = if tail.len() >= bs {
                Some(format!(
                    "a hashed prompt's tail has {} tokens, a block is {bs}",
                    tail.len()
                ))
            } else if self.cfg.kv_events_with_tokens {
                Some("a hashed prompt needs an engine whose KV events carry hashes".to_string())
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(EngineError::BadPrompt { id: req.id, reason });
            }
        }
        let total = len + req.max_tokens as usize;
        if total.div_ceil(bs) > self.cfg.num_gpu_blocks {
            return Err(EngineError::TooLong {
                id: req.id,
                tokens: total,
                capacity: self.cfg.num_gpu_blocks * bs,
            });
        }
        if self.waiting.len() >= self.cfg.max_waiting {
            return Err(EngineError::QueueFull(self.cfg.max_waiting));
        }
        if !self.live.insert(req.id) {
            return Err(EngineError::DuplicateRequest(req.id));
        }
        self.run_silent_before(now);
        self.now = self.now.max(now);
        self.stalled = false;
        let ready = now.plus(self.cfg.request_overhead);
        let keep = self.cfg.kv_events_with_tokens;
        self.enqueue(Seq::new(req, bs, keep, now, ready));
        self.silent.invalidate();
        Ok(())
    }

    /// Drops a request at `now` (client gone): its blocks are released. False when unknown.
    pub fn abort(&mut self, id: RequestId, now: Time) -> bool {
        if !self.live.remove(&id) {
            return false;
        }
        self.run_silent_before(now);
        self.silent.invalidate();
        if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            let s = self.waiting.remove(i).expect("position is in range");
            self.release(&s);
            return true;
        }
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            // Mark it; the step in flight (if any) still refers to running indexes.
            self.running[i].aborted = true;
            if self.inflight.is_none() {
                let s = self.running.remove(i);
                self.release(&s);
            }
        }
        true
    }

    /// When the engine next has something to do: the end of the step in flight, or now
    /// when it is idle with work it can start. None when there is nothing to do. (See
    /// [`Engine::next_report_time`] for a caller that does not need every step.)
    pub fn next_event_time(&self) -> Option<Time> {
        match &self.inflight {
            Some(f) => Some(f.ended),
            None if self.stalled => None,
            None if !self.running.is_empty() => Some(self.now),
            None => self.next_ready().map(|r| r.max(self.now)),
        }
    }

    /// Advances to `now`: finishes the step in flight if it ended, then starts the next one.
    pub fn step(&mut self, now: Time) -> StepOutput {
        let mut out = StepOutput::default();
        self.step_into(now, &mut out);
        out
    }

    /// [`Engine::step`] writing into `out` (cleared first), so a caller stepping often can
    /// keep one output's buffers.
    pub fn step_into(&mut self, now: Time, out: &mut StepOutput) {
        self.now = self.now.max(now);
        out.time = self.now;
        out.tokens.clear();
        out.runs.clear();
        out.finished.clear();
        out.events.clear();
        self.catch_up(now, out);
        if let Some(f) = &self.inflight {
            if f.ended > self.now {
                return;
            }
            self.complete(out);
        }
        self.schedule();
        self.pool.drain_events_into(&mut out.events);
        out.host_events.clear();
        if let Some(h) = &mut self.host {
            h.drain_events_into(&mut out.host_events);
        }
    }

    /// A metrics snapshot.
    pub fn metrics(&self) -> EngineMetrics {
        EngineMetrics {
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_usage: self.pool.used_count() as f64 / self.pool.capacity() as f64,
            kv_blocks: self.pool.capacity(),
            cached_blocks: self.pool.cached_count(),
            host_blocks: self.host.as_ref().map_or(0, host::HostTier::len),
            ..self.metrics.clone()
        }
    }

    /// Drops the prefix cache (a `Cleared` event follows with the next step's output).
    pub fn reset_prefix_cache(&mut self) {
        self.pool.clear();
        if let Some(h) = &mut self.host {
            h.clear();
        }
    }

    fn release(&mut self, s: &Seq) {
        let rev: Vec<_> = s.blocks.iter().rev().copied().collect();
        self.pool.release(&rev);
    }

    /// Applies the effects of the step in flight at its end.
    fn complete(&mut self, out: &mut StepOutput) {
        let Some(mut f) = self.inflight.take() else {
            return;
        };
        let work = std::mem::take(&mut f.work);
        let bs = self.cfg.block_size;
        for &(i, new) in &work {
            let s = &mut self.running[i];
            if s.aborted {
                continue;
            }
            s.computed += new;
            // Cache the blocks this step completed.
            let full = s.computed / bs;
            if full > s.cached_blocks {
                let run: Vec<FullBlock<'_>> = (s.cached_blocks..full)
                    .map(|b| FullBlock {
                        block: s.blocks[b],
                        seq: s.seqs[b],
                        tokens: s.block_tokens(b, bs),
                    })
                    .collect();
                let parent = s
                    .cached_blocks
                    .checked_sub(1)
                    .map(|p| (s.seqs[p], s.blocks[p]));
                self.pool.cache(parent, &run, s.ns);
                if let Some(h) = &mut self.host {
                    h.write(&s.seqs[s.cached_blocks..full]);
                }
                s.cached_blocks = full;
            }
            if s.computed == s.len {
                let tok = request::output_token(s.id, s.generated, self.cfg.output_ids.as_deref());
                s.push_output(tok, bs);
                s.first_token.get_or_insert(f.ended);
                out.tokens.push(Sampled {
                    id: s.id,
                    token: tok,
                    time: f.ended,
                });
                self.metrics.generated_tokens_total += 1;
            }
        }
        // Most steps finish nothing: only then is the running set rebuilt.
        if self
            .running
            .iter()
            .any(|s| s.aborted || s.generated >= s.max_tokens)
        {
            let done: Vec<Seq> = self
                .running
                .extract_if(.., |s| s.aborted || s.generated >= s.max_tokens)
                .collect();
            for s in done {
                self.release(&s);
                if !s.aborted {
                    self.live.remove(&s.id);
                    out.finished.push(s.finish(f.ended));
                }
            }
        }
        self.scratch.work = work;
    }

    /// Picks the next step's work and starts it at `self.now`.
    fn schedule(&mut self) {
        self.silent.invalidate();
        let mut work = std::mem::take(&mut self.scratch.work);
        work.clear();
        let pure_decode = self.fast_paths() && self.schedule_decode(&mut work);
        if !pure_decode {
            self.schedule_general(&mut work);
        }
        if work.is_empty() {
            let head_ready = self.first_ready().is_some();
            self.stalled = head_ready || !self.running.is_empty();
            self.scratch.work = work;
            return;
        }
        self.stalled = false;
        let mut shape = StepShape {
            kv_usage: self.pool.used_count() as f64 / self.pool.capacity() as f64,
            ..StepShape::default()
        };
        for &(i, new) in &work {
            let s = &self.running[i];
            if s.is_decoding() {
                shape.decode_seqs += 1;
                shape.decode_context += s.len as u64;
            } else {
                shape.prefill_tokens += new as u64;
                shape.prefill_attention += new as f64 * (s.computed as f64 + new as f64 / 2.0);
                shape.prefill_context += (s.computed + new) as u64;
            }
        }
        let (mut secs, mut ended) = self.step_end(&shape, self.now);
        if self.loading_tokens > 0 {
            // Blocks loaded back from the host tier for the requests admitted.
            let load = self.loading_tokens as f64 * self.cfg.host_load_secs_per_token;
            self.loading_tokens = 0;
            secs += load;
            ended = ended.plus(Duration::from_secs_f64(load));
        }
        self.metrics.busy_secs_total += secs;
        self.metrics.steps_total += 1;
        self.inflight = Some(Inflight {
            ended,
            work,
            pure_decode,
        });
    }

    /// The seconds of a step of `shape` starting at `start`, and its end. At least a
    /// microsecond, so that time always moves forward.
    fn step_end(&self, shape: &StepShape, start: Time) -> (f64, Time) {
        let secs = self.step_secs(shape);
        (secs, start.plus(Duration::from_secs_f64(secs)))
    }

    /// The seconds of a step of `shape` (at least a microsecond).
    fn step_secs(&self, shape: &StepShape) -> f64 {
        self.cfg.model.step_secs(shape).max(1e-6)
    }

    /// The step [`Engine::schedule_general`] would pick when every running sequence decodes,
    /// all fit in the token budget, no waiting request can be admitted and the pool has a
    /// block for each sequence that starts one: one token each, in order. Most steps of a
    /// busy engine are such steps, and this is a fraction of the cost. False (changing
    /// nothing) when it does not apply.
    fn schedule_decode(&mut self, work: &mut Vec<(usize, usize)>) -> bool {
        let n = self.running.len();
        let budget = self.cfg.max_num_batched_tokens;
        if n == 0 || n > budget {
            return false;
        }
        // The general scheduler tries admission when budget and room are left.
        let admits = n < budget && n < self.cfg.max_num_seqs && self.first_ready().is_some();
        if admits {
            return false;
        }
        let bs = self.cfg.block_size;
        let mut need = 0;
        for s in &self.running {
            if !s.is_decoding() {
                return false;
            }
            need += s.len.div_ceil(bs).saturating_sub(s.blocks.len());
        }
        if need > self.pool.free_count() {
            return false; // the general scheduler preempts
        }
        for (i, s) in self.running.iter_mut().enumerate() {
            let need = s.len.div_ceil(bs).saturating_sub(s.blocks.len());
            if need > 0 {
                let got = self.pool.allocate_into(need, &mut s.blocks);
                debug_assert!(got, "free blocks were counted");
            }
            work.push((i, 1));
        }
        true
    }

    /// Picks the next step's work in the general case (see the module documentation).
    fn schedule_general(&mut self, work: &mut Vec<(usize, usize)>) {
        let bs = self.cfg.block_size;
        let mut budget = self.cfg.max_num_batched_tokens;
        let n = self.running.len();
        let mut scratch = std::mem::take(&mut self.scratch);
        let scheduled = &mut scratch.scheduled;
        scheduled.clear();
        scheduled.resize(n, false);
        let preempted = &mut scratch.preempted;
        preempted.clear();
        preempted.resize(n, false);
        // Decoding sequences first, then those still prefilling, in admission order.
        let decoding = &mut scratch.decoding;
        decoding.clear();
        decoding.extend(self.running.iter().map(|s| s.is_decoding()));
        let order = (0..n)
            .filter(|&i| decoding[i])
            .chain((0..n).filter(|&i| !decoding[i]));
        for i in order {
            if budget == 0 {
                break;
            }
            if preempted[i] {
                continue;
            }
            let s = &self.running[i];
            let new = (s.len - s.computed).min(budget);
            let need = (s.computed + new)
                .div_ceil(bs)
                .saturating_sub(s.blocks.len());
            let got = loop {
                if need == 0 || self.pool.allocate_into(need, &mut self.running[i].blocks) {
                    break true;
                }
                let v = self.victim(i, scheduled, preempted);
                if scheduled[v] {
                    // Priority scheduling may take back what this step gave a sequence.
                    if let Some(k) = work.iter().position(|w| w.0 == v) {
                        budget += work.remove(k).1;
                    }
                    scheduled[v] = false;
                }
                self.preempt(v);
                preempted[v] = true;
                if v == i {
                    break false;
                }
            };
            if got {
                scheduled[i] = true;
                work.push((i, new));
                budget -= new;
            }
        }
        // Drop preempted sequences from the running set (to the front of the queue, oldest
        // first) and renumber the work.
        let any_preempted = preempted.iter().any(|p| *p);
        if any_preempted {
            let mut remap = vec![usize::MAX; self.running.len()];
            let mut kept = Vec::with_capacity(self.running.len());
            let mut back = Vec::new();
            for (i, s) in std::mem::take(&mut self.running).into_iter().enumerate() {
                if preempted[i] {
                    back.push(s);
                } else {
                    remap[i] = kept.len();
                    kept.push(s);
                }
            }
            self.requeue(back);
            self.running = kept;
            for w in work.iter_mut() {
                w.0 = remap[w.0];
            }
        }
        self.scratch = scratch;
        // Admit waiting requests in order while there is room.
        while budget > 0 && !any_preempted && self.running.len() < self.cfg.max_num_seqs {
            let Some(at) = self.first_ready() else {
                break;
            };
            let s = &self.waiting[at];
            let max_hit = (s.len - 1) / bs;
            let hit = self.pool.match_prefix(&s.seqs[..max_hit]);
            // The prefix continues in the host tier: those blocks are loaded, not computed.
            let loaded = self
                .host
                .as_ref()
                .map_or(0, |h| h.run(&s.seqs[hit..max_hit]));
            // KV sent with the request (disaggregated prefill) covers what it covers.
            let remote = s.remote_blocks.min(max_hit).saturating_sub(hit + loaded);
            let reused = hit + loaded + remote;
            let new = (s.len - reused * bs).min(budget);
            let need = (reused * bs + new).div_ceil(bs) - hit;
            let Some(mut blocks) = self.pool.acquire(&s.seqs[..hit]) else {
                break;
            };
            if !self.pool.allocate_into(need, &mut blocks) {
                let rev: Vec<_> = blocks.iter().rev().copied().collect();
                self.pool.release(&rev);
                break;
            }
            let mut s = self.waiting.remove(at).expect("a waiting request");
            s.blocks = blocks;
            s.computed = reused * bs;
            s.cached_blocks = hit;
            self.loading_tokens += loaded * bs;
            // Sent once: a sequence preempted later recomputes it.
            s.remote_blocks = 0;
            self.metrics.remote_tokens_total += (remote * bs) as u64;
            if s.cached_tokens.is_none() {
                s.cached_tokens = Some(reused * bs);
                self.metrics.admitted_total += 1;
                self.metrics.prompt_tokens_total += s.prompt_len as u64;
                self.metrics.prefix_hit_tokens_total += (reused * bs) as u64;
                self.metrics.queue_secs_total += self.now.since(s.arrived).as_secs_f64();
            }
            work.push((self.running.len(), new));
            self.running.push(s);
            budget -= new;
        }
    }

    fn preempt(&mut self, i: usize) {
        let s = &mut self.running[i];
        let rev: Vec<_> = s.blocks.drain(..).rev().collect();
        s.computed = 0;
        s.cached_blocks = 0;
        s.preemptions += 1;
        self.metrics.preemptions_total += 1;
        self.pool.release(&rev);
    }
}

#[cfg(test)]
mod tests;
