//! Disaggregated prefill in the simulator: a split request's prompt computed on a prefill
//! engine (a leg of one output token, as vLLM's two-step protocol asks for), its KV moved
//! over the link, then its decode on the decode engine, which writes the KV it lacks
//! instead of computing it (`EngineRequest::remote_tokens`).
//!
//! The link is `router.disaggregation`'s: a transfer takes its latency plus the prompt tokens
//! the decode engine does not hold when the prefill ends, at its bytes per token over its
//! bandwidth. The decode engine admits the request when it has the blocks, as any other
//! (decode admission waits for free blocks). The router books the two legs as the gateway
//! does: the decode on the decode worker (`Router::dispatch` of a selection naming the
//! prefill worker), the prefill leg under an id of its own ([`prefill_leg`]) until its
//! answer. A prefill engine refusing the leg leaves the prompt to the decode engine.

use super::{Event, Sim};
use crate::router_thread::prefill_leg;
use kvroute_core::{Namespace, RequestId, SequenceHash, Time};
use kvroute_engine::{EnginePrompt, EngineRequest, StepOutput};
use kvroute_workload::Status;
use std::time::Duration;

/// A split request between its prefill leg and its decode.
pub(super) struct Leg {
    /// The engine that decodes it.
    decode: usize,
    /// Its prompt's tokens.
    tokens: usize,
    blocks: Vec<SequenceHash>,
    tail: Vec<u32>,
    max_tokens: u32,
}

impl Sim<'_> {
    /// Sends request `id`'s prefill leg to engine `prefill` and keeps what its decode on
    /// engine `decode` needs; a leg the prefill engine refuses is served by the decode engine
    /// whole.
    pub(super) fn start_split(
        &mut self,
        t: Time,
        id: RequestId,
        (prefill, decode): (usize, usize),
        (blocks, tail): (Vec<SequenceHash>, Vec<u32>),
        max_tokens: u32,
    ) {
        let leg = EngineRequest {
            id,
            prompt: EnginePrompt::Hashed {
                blocks: blocks.clone(),
                tail: tail.clone(),
            },
            max_tokens: 1,
            namespace: Namespace::default(),
            remote_tokens: 0,
            priority: self.engine_priority(id),
        };
        match self.engines[prefill].submit(leg, t) {
            Ok(()) => {
                self.records[id.0 as usize].prefill_worker = Some(prefill as u64);
                let tokens = blocks.len() * self.cfg.engine.block_size + tail.len();
                let leg = Leg {
                    decode,
                    tokens,
                    blocks,
                    tail,
                    max_tokens,
                };
                self.legs.insert(id, leg);
                self.reschedule(prefill);
            }
            Err(_) => {
                // Counted as the gateway counts a failed prefill leg: the decode engine
                // computes the prompt.
                self.router.finish(prefill_leg(id), t, None, None);
                self.submit(t, id, decode, (blocks, tail), max_tokens, 0);
            }
        }
    }

    /// Applies a prefill engine's step: its legs' answers release their bookings; a leg
    /// that ended has its KV moved to its decode engine.
    pub(super) fn handle_prefill(&mut self, w: usize, out: &mut StepOutput) {
        let t = out.time;
        let mut released = !out.tokens.is_empty();
        for tok in &out.tokens {
            self.router.first_token(prefill_leg(tok.id), tok.time);
        }
        // A prefill engine runs legs of one token: no silent decode steps.
        debug_assert!(out.runs.runs().next().is_none());
        self.deliver_all(w, t, out);
        for f in out.finished.drain(..) {
            released = true;
            self.router.finish(prefill_leg(f.id), t, None, None);
            self.records[f.id.0 as usize].cached_tokens = f.cached_tokens as u64;
            let Some(leg) = self.legs.get(&f.id) else {
                continue;
            };
            // Only what the decode engine lacks crosses the link.
            let bs = self.cfg.engine.block_size;
            let held = self.engines[leg.decode].pool().match_prefix(&leg.blocks) * bs;
            let link = &self.cfg.router.disaggregation;
            let secs = link.link_latency_secs
                + leg.tokens.saturating_sub(held) as f64 * link.secs_per_token();
            self.push(
                t.plus(Duration::from_secs_f64(secs.max(0.0))),
                Event::Transferred(f.id),
            );
        }
        if released && !self.queue.is_empty() {
            self.drain_queue(t);
        }
    }

    /// Request `id`'s KV has reached its decode engine: the decode starts there.
    pub(super) fn transferred(&mut self, t: Time, id: RequestId) {
        let Some(leg) = self.legs.remove(&id) else {
            return;
        };
        // Its first token from now teaches the decode worker's figures (as the gateway
        // does when it sends the decode leg after the prefill leg's answer).
        self.router.kv_arrived(id, t);
        let prompt = (leg.blocks, leg.tail);
        self.submit(t, id, leg.decode, prompt, leg.max_tokens, leg.tokens);
    }

    /// Submits request `id` to engine `w` at `t` (`remote_tokens` of its prompt's KV sent
    /// with it); a refusal ends the request failed.
    pub(super) fn submit(
        &mut self,
        t: Time,
        id: RequestId,
        w: usize,
        (blocks, tail): (Vec<SequenceHash>, Vec<u32>),
        max_tokens: u32,
        remote_tokens: usize,
    ) {
        let req = EngineRequest {
            id,
            prompt: EnginePrompt::Hashed { blocks, tail },
            max_tokens,
            namespace: Namespace::default(),
            remote_tokens,
            priority: self.engine_priority(id),
        };
        match self.engines[w].submit(req, t) {
            Ok(()) => self.reschedule(w),
            Err(e) => {
                self.router.finish(id, t, None, None);
                self.end(t, id, Status::Failed(e.kind().into()), None);
            }
        }
    }
}

#[cfg(test)]
mod tests;
