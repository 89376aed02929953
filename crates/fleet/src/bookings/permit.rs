//! A request's hold on its tenant's limits (`kvroute_core::flow::limits`): taken when the
//! request comes in, given back when it ends, its charge corrected by the output the worker
//! wrote (all of it back when it never reached a worker). RAII: dropping it gives it back.

use super::Bookings;
use kvroute_core::flow::limits::{OverLimit, Permit};
use kvroute_core::flow::Flow;
use std::sync::Arc;

/// A request's place within its tenant's limits.
pub struct FlowPermit {
    bookings: Arc<Bookings>,
    permit: Option<Permit>,
    /// Output tokens it produced: `None` while it has reached no worker.
    output: Option<u64>,
}

impl Bookings {
    /// Lets a request of `flow` (resolved against the flows of `generation`: mapped to the
    /// ones now) costing `prompt` + `output` tokens in now, or says which limit refused it
    /// and how long to wait.
    pub fn enter(
        self: &Arc<Self>,
        flow: Flow,
        generation: u32,
        prompt: u64,
        output: u64,
    ) -> Result<FlowPermit, OverLimit> {
        let now = self.clock.now();
        let permit = self.table.with_queue(|q| {
            let flow = q.current(flow, generation);
            q.enter(flow, now, prompt, output)
        })?;
        Ok(FlowPermit {
            bookings: self.clone(),
            permit: Some(permit),
            output: None,
        })
    }
}

impl FlowPermit {
    /// It reached a worker (its prompt is charged from now on, its output when known).
    pub fn dispatched(&mut self) {
        self.output.get_or_insert(0);
    }

    /// Its worker wrote `tokens` output tokens.
    pub fn completed(&mut self, tokens: u64) {
        self.output = Some(tokens);
    }
}

impl Drop for FlowPermit {
    fn drop(&mut self) {
        if let Some(p) = self.permit.take() {
            let output = self.output;
            self.bookings.table.with_queue(|q| q.leave(p, output));
        }
    }
}
