//! Worker roles in a disaggregated fleet, and the prefill worker a request is offered when
//! its prefill may run apart from its decode.

use super::{Candidate, RouteError, RouteRequest, Router};
use crate::ledger::WorkerView;
use crate::ledger::{Booking, LedgerError};
use crate::policy::{DisaggregationMode, RemotePrefill};
use crate::types::{RequestId, Time};
use crate::types::{WorkerId, WorkerRole};

impl Router {
    /// Sets what `worker` does in a disaggregated fleet (`both` unless set). A prefill-only
    /// worker is offered to no policy as a request's worker: it serves prefill legs only.
    pub fn set_role(&mut self, worker: WorkerId, role: WorkerRole) {
        self.roles.retain(|(w, _)| *w != worker);
        if role != WorkerRole::Both {
            self.roles.push((worker, role));
        }
    }

    /// Tells the router that its caller can run a request's prefill on a prefill worker
    /// and its decode on another (the engines' transfer protocols); until then every
    /// request is served whole by a worker that decodes, whatever `disaggregation` says.
    pub fn set_split_prefill(&mut self, can: bool) {
        self.split_prefill = can;
    }

    /// What `worker` does (`both` unless set).
    pub fn role(&self, worker: WorkerId) -> WorkerRole {
        self.roles
            .iter()
            .find(|(w, _)| *w == worker)
            .map_or(WorkerRole::Both, |(_, r)| *r)
    }

    /// The prefill worker to offer `req` (see [`crate::policy::split`]): among the
    /// prefill-only workers it may use that are not busy, the one predicted to end its
    /// prefill of the prompt first (its booked prefill and its matched prefix counted).
    /// None when requests are not split here.
    pub(super) fn remote_prefill(
        &self,
        req: &RouteRequest<'_>,
        open: &dyn Fn(&WorkerView) -> bool,
        candidate: &dyn Fn(&WorkerView) -> Candidate,
    ) -> Option<RemotePrefill> {
        let cfg = &self.config.disaggregation;
        if !self.split_prefill
            || cfg.mode == DisaggregationMode::Never
            || !self.roles.iter().any(|(_, r)| *r == WorkerRole::Prefill)
        {
            return None;
        }
        let bs = self.block_size.get();
        let adm = &self.config.admission;
        let pool: Vec<Candidate> = self
            .ledger
            .views()
            .filter(|v| open(v) && self.role(v.worker) == WorkerRole::Prefill)
            .map(|v| candidate(&v))
            .filter(|c| !adm.is_busy(&c.load, &c.capacity, bs))
            .collect();
        if pool.is_empty() {
            return None;
        }
        let ttft = self.predicted_ttft(req, &pool);
        let best = (0..pool.len()).min_by(|&a, &b| ttft[a].total_cmp(&ttft[b]))?;
        Some(RemotePrefill {
            worker: pool[best].worker,
            matched_blocks: pool[best].matched_blocks,
            prefill_secs: ttft[best],
            transfer_secs_per_token: cfg.secs_per_token(),
            transfer_latency_secs: cfg.link_latency_secs,
        })
    }

    /// Books the prefill leg of a split request (its decode booked by [`Router::dispatch`]
    /// of a selection naming `prefill`) as request `request` (an id of its own) on the
    /// prefill worker at `now`: its prefill work counted there until
    /// [`Router::first_token`] of `request` (the prefill leg's answer), which also teaches
    /// that worker's prefill speed; [`Router::finish`] of `request` ends it. The prompt
    /// counts as cached there until its events show it, as after any dispatch.
    pub fn dispatch_prefill(
        &mut self,
        request: RequestId,
        req: &RouteRequest<'_>,
        prefill: &RemotePrefill,
        now: Time,
    ) -> Result<(), RouteError> {
        let bs = self.block_size.get();
        self.ledger.book(
            &Booking {
                request,
                worker: prefill.worker,
                prompt_tokens: req.prompt.tokens,
                cached_tokens: (prefill.matched_blocks * bs).min(req.prompt.tokens),
                blocks: &req.prompt.sequence,
                miss_weight: self.flows.class(req.flow.class).miss_weight,
            },
            now,
        )?;
        if let Err(e) = self.note_dispatched(prefill.worker, &req.prompt.sequence, now) {
            let _ = self.ledger.finish(request, now);
            return Err(e);
        }
        Ok(())
    }

    /// A split request's KV reached its decode worker at `now` (the caller sends the decode
    /// leg after the prefill leg's answer): its first token there, timed from now, teaches
    /// that worker's prefill speed with the prompt's last tokens as its work
    /// ([`crate::LoadLedger::kv_arrived`]). Callers that cannot tell (legs sent together)
    /// skip it.
    pub fn kv_arrived(&mut self, request: RequestId, now: Time) -> Result<(), LedgerError> {
        let tokens = self.ledger.prompt_tokens(request)? as usize;
        let tail = crate::policy::decode_tail(tokens, self.block_size.get());
        self.ledger.kv_arrived(request, tail as u64, now)
    }
}
