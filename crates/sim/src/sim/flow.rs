//! Flow control in the simulator: each request's tenant and class (its source's), the
//! tenant's limits at arrival, the queue's order by flow, and the permit given back when the
//! request ends, exactly as the gateway does with the core's [`AdmissionQueue`].

use super::{Sim, Waiting};
use crate::driver::Source;
use crate::{ClassResult, SimConfig, TenantResult};
use kvroute_core::admission::queue::Ask;
use kvroute_core::flow::limits::Permit;
use kvroute_core::flow::{ClassIx, Flow, Flows};
use kvroute_core::{Eligible, RejectReason, RequestId, Time};
use kvroute_workload::{RequestRecord, Summary};
use std::time::Duration;

/// A request's flow and what it holds of its tenant's limits.
pub(super) struct RequestFlow {
    pub flow: Flow,
    pub permit: Option<Permit>,
}

/// Per tenant (source) of a tenants load, and per class its requests resolve to (in first
/// appearance), the summary of the requests that arrived at or after `warm`, against the
/// class's objectives (the run's where its class sets none).
pub(super) fn results(
    cfg: &SimConfig,
    sources: &[Source],
    source: &[u16],
    records: &[RequestRecord],
    warm: Time,
    span: Duration,
) -> (Vec<TenantResult>, Vec<ClassResult>) {
    if sources.iter().all(|s| s.tenant.is_empty()) {
        return (Vec::new(), Vec::new());
    }
    let flows = cfg.router.admission.flow.compile();
    let flow = source_flows(&flows, sources);
    let run = cfg.slo.clone().unwrap_or_default();
    // The summary of the measured requests of the sources `of` picks, against `class`'s.
    let summary = |class: ClassIx, of: &dyn Fn(usize) -> bool| {
        let c = flows.class(class);
        let slo = run.with_class(c.ttft_secs, c.tpot_secs);
        let mine = (records.iter().zip(source))
            .filter(|(r, s)| of(usize::from(**s)) && r.arrival >= warm)
            .map(|(r, _)| r);
        Summary::from_records_with_slo(mine, span, Some(&slo))
    };
    let tenants = (sources.iter().enumerate())
        .map(|(i, s)| TenantResult {
            tenant: s.tenant.clone(),
            class: s.class.clone(),
            summary: summary(flow[i].class, &|j| j == i),
        })
        .collect();
    let mut order: Vec<ClassIx> = Vec::new();
    for f in &flow {
        if !order.contains(&f.class) {
            order.push(f.class);
        }
    }
    let classes = (order.into_iter())
        .map(|ix| {
            let of_class = |i: usize| flow[i].class == ix;
            ClassResult {
                class: flows.class(ix).name.clone(),
                tenants: (0..sources.len())
                    .filter(|&i| of_class(i))
                    .map(|i| sources[i].tenant.clone())
                    .collect(),
                summary: summary(ix, &of_class),
            }
        })
        .collect();
    (tenants, classes)
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

    /// The engine's own priority of request `id`: its class's `engine_priority` when the
    /// engines schedule by priority (as the gateway sends it to workers marked as taking
    /// one), else 0.
    pub(super) fn engine_priority(&self, id: RequestId) -> i32 {
        if !self.cfg.engine.priority_scheduling {
            return 0;
        }
        (self.flows.get(id.0 as usize))
            .and_then(|f| self.queue.flows().class(f.flow.class).engine_priority)
            .unwrap_or(0)
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
