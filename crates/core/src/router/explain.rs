//! `explain`: one routing decision laid open, for the debug endpoint and the dashboard.

use super::{Evaluation, RouteRequest, Router};
use crate::admission::AdmissionDecision;
use crate::tiers::Loadable;
use crate::types::WorkerId;
use serde::{Deserialize, Serialize};

/// Every worker's view of one request, and the outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// The policy that decided.
    pub policy: String,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Full blocks of the prompt.
    pub prompt_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// What admission decided.
    pub decision: AdmissionDecision,
    /// The chosen worker, when dispatched.
    pub winner: Option<WorkerId>,
    /// Per worker, in id order.
    pub workers: Vec<WorkerExplanation>,
    /// The prefill worker offered, when requests may be split (disaggregated prefill).
    #[serde(default)]
    pub prefill: Option<PrefillExplanation>,
}

/// The prefill worker offered to a request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefillExplanation {
    /// The worker.
    pub worker: WorkerId,
    /// Leading prompt blocks it holds.
    pub matched_blocks: usize,
    /// Predicted seconds until its prefill of the prompt ends.
    pub prefill_secs: f64,
    /// Whether the prompt goes there (else the decode worker computes it).
    pub chosen: bool,
}

/// One worker's terms.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerExplanation {
    /// The worker.
    pub worker: WorkerId,
    /// Leading prompt blocks it holds.
    pub matched_blocks: usize,
    /// Prompt blocks after those it can load back from offloaded tiers.
    #[serde(default)]
    pub loadable: Loadable,
    /// Prompt tokens it would have to compute.
    pub uncached_tokens: usize,
    /// Blocks the index holds for it.
    pub cached_blocks: usize,
    /// Requests in flight.
    pub inflight: u32,
    /// Outstanding prefill tokens.
    pub prefill_tokens: u64,
    /// Active KV blocks.
    pub active_blocks: u64,
    /// Busy by the admission thresholds.
    pub busy: bool,
    /// Offered to the policy.
    pub eligible: bool,
    /// The policy's cost (lower wins), when it computes one for this worker.
    pub cost: Option<f64>,
    /// Whether it won.
    pub chosen: bool,
}

impl Router {
    /// Explains how `req` would be routed now: every worker's matched blocks, load terms,
    /// cost, and the winner. Changes nothing.
    pub fn explain(&self, req: &RouteRequest<'_>) -> Explanation {
        self.explanation(req, &self.evaluate(req))
    }

    pub(super) fn explanation(&self, req: &RouteRequest<'_>, ev: &Evaluation) -> Explanation {
        let bs = self.block_size.get();
        let mut costs = vec![None; ev.candidates.len()];
        let mut winner = None;
        if let Some((ix, choice)) = &ev.choice {
            for (k, &i) in ix.iter().enumerate() {
                costs[i] = choice.costs[k];
            }
            winner = Some(ev.candidates[ix[choice.chosen]].worker);
        }
        let workers = ev
            .candidates
            .iter()
            .enumerate()
            .map(|(i, c)| WorkerExplanation {
                worker: c.worker,
                matched_blocks: c.matched_blocks,
                loadable: c.loadable,
                uncached_tokens: req
                    .prompt
                    .tokens
                    .saturating_sub((c.matched_blocks + c.loadable.blocks()) * bs),
                cached_blocks: c.cached_blocks,
                inflight: c.load.inflight,
                prefill_tokens: c.load.prefill_tokens,
                active_blocks: c.load.active_blocks,
                busy: ev.busy[i],
                eligible: ev.eligible[i],
                cost: costs[i],
                chosen: Some(c.worker) == winner,
            })
            .collect();
        Explanation {
            policy: self.policy.name().to_string(),
            prompt_tokens: req.prompt.tokens,
            prompt_blocks: req.prompt.full_blocks(),
            block_size: bs,
            decision: ev.decision,
            winner,
            workers,
            prefill: ev.prefill.map(|(p, chosen)| PrefillExplanation {
                worker: p.worker,
                matched_blocks: p.matched_blocks,
                prefill_secs: p.prefill_secs,
                chosen,
            }),
        }
    }
}
