//! Silent steps: decode steps whose only effect is one new token per running sequence.
//!
//! Most steps of a busy engine change nothing but token counts: every running sequence
//! decodes, none finishes, none fills a KV block (no event, no allocation, so KV usage stays
//! put) and no waiting request can be admitted. Such a run is known in advance, so a caller
//! that only needs the engine's reports (the fleet simulator) can skip straight to the first
//! step that does something else ([`Engine::next_report_time`]); the silent steps before it
//! are then run in a tight loop ([`Engine::catch_up`]) with exactly the tokens, times and
//! counters that stepping one by one gives.
//!
//! The plan is a cache of the ends of the silent steps ahead. Anything that can change it
//! (scheduling, a new request, an abort) drops it; it is rebuilt on demand.

use super::{Engine, Sampled, StepOutput, TokenRuns};
use crate::timing::StepShape;
use kvroute_core::Time;
use std::collections::VecDeque;
use std::time::Duration;

/// Silent steps planned after the step in flight.
#[derive(Default)]
pub(super) struct Plan {
    valid: bool,
    /// For each silent completion, in order: the seconds of the step it schedules and the end
    /// of that step.
    steps: VecDeque<(f64, Time)>,
}

impl Plan {
    pub(super) fn invalidate(&mut self) {
        self.valid = false;
    }
}

impl Engine {
    /// Whether the fast paths are on (tests turn them off to compare).
    pub(super) fn fast_paths(&self) -> bool {
        !self.plain
    }

    /// When the engine next reports more than tokens of running sequences: a first token, a
    /// finish, a KV event, an admission or a preemption, or the end of a step that is not a
    /// plain decode step. Calling [`Engine::step_into`] at each such time gives the same
    /// outputs, tokens with their own times included, as calling it at every
    /// [`Engine::next_event_time`], so long as nothing is submitted in between.
    pub fn next_report_time(&mut self) -> Option<Time> {
        self.plan();
        match (&self.inflight, self.silent.steps.back()) {
            (Some(_), Some(&(_, end))) => Some(end),
            _ => self.next_event_time(),
        }
    }

    /// Runs the silent steps that end by `now`, appending their tokens to `out` (after any
    /// run earlier by a submit or an abort).
    pub fn catch_up(&mut self, now: Time, out: &mut StepOutput) {
        out.tokens.append(&mut self.sampled);
        out.runs.append(&mut self.sampled_runs);
        let mut tokens = std::mem::take(&mut out.tokens);
        let mut runs = std::mem::take(&mut out.runs);
        self.run_silent(|end| end <= now, &mut tokens, &mut runs);
        out.tokens = tokens;
        out.runs = runs;
    }

    /// Runs the silent steps that end before `now` (a request arriving at the very end of a
    /// step is seen by the scheduling at that end), keeping their tokens for the next output.
    pub(super) fn run_silent_before(&mut self, now: Time) {
        let mut tokens = std::mem::take(&mut self.sampled);
        let mut runs = std::mem::take(&mut self.sampled_runs);
        self.run_silent(|end| end < now, &mut tokens, &mut runs);
        self.sampled = tokens;
        self.sampled_runs = runs;
    }

    /// Runs the silent steps that are `due`, their tokens going to `tokens` one by one or,
    /// with token runs on, to `runs` as one run.
    fn run_silent(
        &mut self,
        due: impl Fn(Time) -> bool,
        tokens: &mut Vec<Sampled>,
        runs: &mut TokenRuns,
    ) {
        self.plan();
        let bs = self.cfg.block_size;
        let by_run = self.token_runs;
        if by_run {
            runs.begin(self.running.iter().map(|s| s.id));
        }
        let mut done = 0;
        while let Some(&(secs, end)) = self.silent.steps.get(done) {
            let Some(f) = &mut self.inflight else {
                break;
            };
            if !due(f.ended) {
                break;
            }
            // The step in flight ends: one token each, then the same work starts again.
            let at = f.ended;
            f.ended = end;
            for s in &mut self.running {
                s.computed += 1;
                let token =
                    super::request::output_token(s.id, s.generated, self.cfg.output_ids.as_deref());
                s.push_output(token, bs);
                if !by_run {
                    tokens.push(Sampled {
                        id: s.id,
                        token,
                        time: at,
                    });
                }
            }
            if by_run {
                runs.push_step(at);
            }
            self.metrics.generated_tokens_total += self.running.len() as u64;
            self.metrics.busy_secs_total += secs;
            self.metrics.steps_total += 1;
            done += 1;
        }
        self.silent.steps.drain(..done);
        if by_run {
            runs.end();
        }
    }

    /// Builds the plan when it was dropped.
    fn plan(&mut self) {
        if self.silent.valid {
            return;
        }
        self.silent.valid = true;
        self.silent.steps.clear();
        let Some(f) = &self.inflight else {
            return;
        };
        if !f.pure_decode || !self.fast_paths() {
            return;
        }
        let bs = self.cfg.block_size;
        let n = self.running.len();
        // Completion j (0 = the step in flight) is silent while no sequence fills a block
        // (its length a multiple of the block size: a Stored event and a new block) or
        // reaches max_tokens.
        let mut silent = usize::MAX;
        let mut context = 0u64;
        for s in &self.running {
            if s.aborted {
                return;
            }
            let to_block = (bs - s.len % bs) % bs;
            let to_finish = (s.max_tokens - s.generated - 1) as usize;
            silent = silent.min(to_block).min(to_finish);
            context += s.len as u64;
        }
        // ... and no waiting request can be admitted at its end.
        let admits_from = if n < self.cfg.max_num_batched_tokens && n < self.cfg.max_num_seqs {
            self.next_ready()
        } else {
            None
        };
        let mut shape = StepShape {
            kv_usage: self.pool.used_count() as f64 / self.pool.capacity() as f64,
            decode_seqs: n as u64,
            ..StepShape::default()
        };
        let mut end = f.ended;
        // Without a dependence on context, every step of the run takes the same time.
        let same = (!self.cfg.model.uses_decode_context()).then(|| {
            let secs = self.step_secs(&shape);
            (secs, Duration::from_secs_f64(secs))
        });
        for _ in 0..silent {
            if admits_from.is_some_and(|r| r <= end) {
                break;
            }
            let (secs, next) = match same {
                Some((secs, d)) => (secs, end.plus(d)),
                None => {
                    context += n as u64;
                    shape.decode_context = context;
                    self.step_end(&shape, end)
                }
            };
            end = next;
            self.silent.steps.push_back((secs, end));
        }
    }
}

#[cfg(test)]
mod tests;
