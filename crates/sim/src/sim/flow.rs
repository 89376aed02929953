//! Flow control in the simulator: each request's tenant and class (its source's), the
//! tenant's limits at arrival, the queue's order by flow, and the permit given back when the
//! request ends, exactly as the gateway does with the core's [`AdmissionQueue`].

use super::{Sim, Waiting};
use crate::driver::Source;
use crate::{SimConfig, TenantResult};
use kvroute_core::admission::queue::Ask;
use kvroute_core::flow::limits::Permit;
use kvroute_core::flow::{Flow, Flows};
use kvroute_core::{Eligible, RejectReason, RequestId, Time};
use kvroute_workload::{RequestRecord, Slo, Summary};
use std::time::Duration;

/// A request's flow and what it holds of its tenant's limits.
pub(super) struct RequestFlow {
    pub flow: Flow,
    pub permit: Option<Permit>,
}

/// Per tenant (source) of a tenants load, the summary of its requests that arrived at or
/// after `warm`, against its class's objectives (the run's where its class sets none).
pub(super) fn tenant_results(
    cfg: &SimConfig,
    sources: &[Source],
    source: &[u16],
    records: &[RequestRecord],
    warm: Time,
    span: Duration,
) -> Vec<TenantResult> {
    if sources.iter().all(|s| s.tenant.is_empty()) {
        return Vec::new();
    }
    let flows = cfg.router.admission.flow.compile();
    let flow = source_flows(&flows, sources);
    sources
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let class = flows.class(flow[i].class);
            let run = cfg.slo.clone().unwrap_or_default();
            let slo = Slo {
                ttft_ms: class.ttft_secs.map(|v| v * 1e3).or(run.ttft_ms),
                tpot_ms: class.tpot_secs.map(|v| v * 1e3).or(run.tpot_ms),
            };
            let mine = (records.iter().zip(source))
                .filter(|(r, s)| usize::from(**s) == i && r.arrival >= warm)
                .map(|(r, _)| r);
            TenantResult {
                tenant: s.tenant.clone(),
                class: s.class.clone(),
                summary: Summary::from_records_with_slo(mine, span, Some(&slo)),
            }
        })
        .collect()
}

/// Per class the tenants' requests resolve to (in first appearance), the summary of its
/// requests that arrived at or after `warm`, against its objectives.
pub(super) fn class_results(
    cfg: &SimConfig,
    sources: &[Source],
    source: &[u16],
    records: &[RequestRecord],
    warm: Time,
    span: Duration,
) -> Vec<crate::ClassResult> {
    if sources.iter().all(|s| s.tenant.is_empty()) {
        return Vec::new();
    }
    let flows = cfg.router.admission.flow.compile();
    let flow = source_flows(&flows, sources);
    let mut classes: Vec<kvroute_core::flow::ClassIx> = Vec::new();
    for f in &flow {
        if !classes.contains(&f.class) {
            classes.push(f.class);
        }
    }
    classes
        .into_iter()
        .map(|ix| {
            let class = flows.class(ix);
            let run = cfg.slo.clone().unwrap_or_default();
            let slo = Slo {
                ttft_ms: class.ttft_secs.map(|v| v * 1e3).or(run.ttft_ms),
                tpot_ms: class.tpot_secs.map(|v| v * 1e3).or(run.tpot_ms),
            };
            let of_class = |i: usize| flow[i].class == ix;
            let mine = (records.iter().zip(source))
                .filter(|(r, s)| of_class(usize::from(**s)) && r.arrival >= warm)
                .map(|(r, _)| r);
            crate::ClassResult {
                class: class.name.clone(),
                tenants: (0..sources.len())
                    .filter(|&i| of_class(i))
                    .map(|i| sources[i].tenant.clone())
                    .collect(),
                summary: Summary::from_records_with_slo(mine, span, Some(&slo)),
            }
        })
        .collect()
}

/// Each source's flow under `flows`.
pub(super) fn source_flows(flows: &Flows, sources: &[Source]) -> Vec<Flow> {
    fn name(s: &str) -> Option<&str> {
        (!s.is_empty()).then_some(s)
    }
    sources
        .iter()
        .map(|s| flows.flow_of(name(&s.tenant), name(&s.class)))
        .collect()
}

impl Sim<'_> {
    /// Lets request `id` of `flow` in at `t` (its tenant's limits), or refuses it: false.
    pub(super) fn enter(&mut self, t: Time, id: RequestId, flow: Flow, max_tokens: u32) -> bool {
        let prompt = self.records[id.0 as usize].input_tokens;
        let output = u64::from(max_tokens);
        match self.queue.enter(flow, t, prompt, output) {
            Ok(permit) => {
                self.flows.push(RequestFlow {
                    flow,
                    permit: Some(permit),
                });
                true
            }
            Err(over) => {
                self.flows.push(RequestFlow { flow, permit: None });
                self.refuse_for(t, id, RejectReason::TenantLimit, over.retry_after);
                false
            }
        }
    }

    /// What request `q` asks of the queue.
    pub(super) fn ask(&self, q: &Waiting) -> Ask {
        let flow = self.flows[q.id.0 as usize].flow;
        let objective = self.queue.flows().class(flow.class).ttft_secs;
        Ask {
            eligible: Eligible::Any,
            tokens: q.tokens as u64,
            flow,
            cost: q.tokens as u64 + u64::from(q.max_tokens),
            objective: objective.map(Duration::from_secs_f64),
        }
    }

    /// Request `id`'s band.
    pub(super) fn band(&self, id: RequestId) -> u8 {
        self.flows[id.0 as usize].flow.band
    }

    /// Request `id` ended: its permit goes back with the output it produced (none when it
    /// was never dispatched).
    pub(super) fn leave(&mut self, id: RequestId) {
        let i = id.0 as usize;
        let Some(permit) = self.flows.get_mut(i).and_then(|f| f.permit.take()) else {
            return;
        };
        let rec = &self.records[i];
        let output = rec.worker.is_some().then_some(rec.output_tokens);
        self.queue.leave(permit, output);
    }
}

#[cfg(test)]
mod tests;
