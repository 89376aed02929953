//! The admission queue: requests that found every eligible worker busy, waiting until one
//! is free, each until its deadline, within a count and a token budget; and the flow
//! controller around it (per-tenant limits, [`crate::flow::limits`]). One implementation,
//! driven by the fleet simulator and by the live gateway alike.
//!
//! Order ([`Drain`]): strict priority between bands (a higher band first); within a band,
//! fair queuing between tenants by the tokens they were served, divided by their weights
//! (the least served first: a tenant that sends four times its share is served its share);
//! within a tenant, the earliest due first (arrival plus its TTFT objective, or plus the
//! queue's wait when it has none), then arrival. With one flow that is arrival order.
//!
//! A request never takes a worker from one ranked before it: an arrival that finds a request
//! of its band or a higher one waiting whose eligible workers ([`Eligible`]) overlap its own
//! queues ([`AdmissionQueue::holds`]), and a pass skips the later ones of a kind whose best
//! waiter could not go. Requests of another kind (a retry that excludes the worker it failed
//! on, a data plane's subset) may go ahead of the others in a pass, and the others ahead of
//! them, when only workers they differ on are free.
//!
//! When the queue is full, an arrival of a higher band displaces the queued requests of the
//! lowest band (the latest due first), refused as [`RejectReason::Shed`].

use super::{AdmissionConfig, QueueState, RejectReason};
use crate::flow::limits::{OverLimit, Permit, TenantLimits};
use crate::flow::{Flow, Flows, TenantIx};
use crate::types::{Eligible, Time};
use std::collections::VecDeque;
use std::time::Duration;

/// A request's place in the queue (increasing in arrival order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(u64);

/// What a request asks of the queue.
#[derive(Clone, Debug, Default)]
pub struct Ask {
    /// The workers it may go to (its kind, for ordering).
    pub eligible: Eligible,
    /// Its prompt's tokens (counted against the token budget).
    pub tokens: u64,
    /// Its flow.
    pub flow: Flow,
    /// What it costs its tenant in fair queuing: prompt plus (expected) output tokens.
    pub cost: u64,
    /// Its time-to-first-token objective, if it has one: it is due then, and leaves the
    /// queue then if that comes before the queue's wait.
    pub objective: Option<Duration>,
}

/// A request in the queue, with what its driver keeps of it (`item`).
#[derive(Debug)]
pub struct Queued<T> {
    /// Its place.
    pub ticket: Ticket,
    /// The workers it may go to (its kind, for ordering).
    pub eligible: Eligible,
    /// Its prompt's tokens (counted against the token budget).
    pub tokens: u64,
    /// Its flow.
    pub flow: Flow,
    /// Its fair-queuing cost.
    pub cost: u64,
    /// When it is due (orders a tenant's requests).
    pub due: Time,
    /// When it stops waiting: refused with `expiry`.
    pub deadline: Time,
    /// The reason it is refused with at its deadline: [`RejectReason::QueueTimeout`], or
    /// [`RejectReason::Deadline`] when its objective came first.
    pub expiry: RejectReason,
    /// The driver's part.
    pub item: T,
}

/// Requests waiting for a free worker, and the flow controller's state.
#[derive(Debug)]
pub struct AdmissionQueue<T> {
    /// In arrival order.
    entries: VecDeque<Queued<T>>,
    tokens: u64,
    next: u64,
    flows: Flows,
    limits: TenantLimits,
    /// Per tenant: tokens served from the queue divided by its weight.
    served: Vec<f64>,
    /// How many times new flows were taken ([`AdmissionQueue::set_flows`]).
    generation: u32,
    /// The last reloads' maps, oldest first (the last maps `generation - 1` to now).
    maps: VecDeque<crate::flow::remap::FlowMap>,
}

impl<T> Default for AdmissionQueue<T> {
    fn default() -> Self {
        Self::new(Flows::default())
    }
}

impl<T> AdmissionQueue<T> {
    /// An empty queue for these flows.
    pub fn new(flows: Flows) -> Self {
        Self {
            entries: VecDeque::new(),
            tokens: 0,
            next: 0,
            served: vec![0.0; flows.tenants().len()],
            flows,
            limits: TenantLimits::default(),
            generation: 0,
            maps: VecDeque::new(),
        }
    }

    /// The flows it orders by.
    pub fn flows(&self) -> &Flows {
        &self.flows
    }

    /// Takes new flows (a reload): the waiting requests, the tenants' limits and their
    /// fair-queuing counts carry over by tenant and class name (see [`crate::flow::remap`]);
    /// a waiting request takes its class's band in the new flows.
    pub fn set_flows(&mut self, flows: Flows) {
        let map = flows.map_from(&self.flows);
        for e in &mut self.entries {
            e.flow = map.flow(&flows, e.flow);
        }
        let mut served = vec![0.0; flows.tenants().len()];
        for (i, s) in self.served.iter().enumerate() {
            if map.same.get(i).copied().unwrap_or(false) {
                if let Some(to) = served.get_mut(usize::from(map.tenants[i].0)) {
                    *to = *s;
                }
            }
        }
        self.served = served;
        self.limits.remap(&map);
        self.flows = flows;
        self.generation = self.generation.wrapping_add(1);
        if self.maps.len() == crate::flow::limits::MAX_REMAPS {
            self.maps.pop_front();
        }
        self.maps.push_back(map);
    }

    /// How many times new flows were taken: a flow resolved against the flows of this
    /// generation is given to [`AdmissionQueue::current`] with it.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The maps from the flows of `generation` to the ones now (None: more reloads ago than
    /// are remembered).
    fn maps_since(
        &self,
        generation: u32,
    ) -> Option<impl Iterator<Item = &crate::flow::remap::FlowMap>> {
        let behind = self.generation.wrapping_sub(generation) as usize;
        (behind <= self.maps.len()).then(|| self.maps.iter().skip(self.maps.len() - behind))
    }

    /// Tenant `t` of the flows of `generation` in the flows now.
    fn tenant_now(&self, t: TenantIx, generation: u32) -> Option<TenantIx> {
        self.maps_since(generation)?
            .try_fold(t, |t, m| m.tenants.get(usize::from(t.0)).copied())
    }

    /// `flow`, resolved against the flows of `generation`, in the flows now (by name; from
    /// more reloads ago than are remembered: the default flow).
    pub fn current(&self, flow: Flow, generation: u32) -> Flow {
        if generation == self.generation {
            return flow;
        }
        let class = self.maps_since(generation).and_then(|mut maps| {
            maps.try_fold(flow.class, |c, m| m.classes.get(usize::from(c.0)).copied())
        });
        match (self.tenant_now(flow.tenant, generation), class) {
            (Some(tenant), Some(class)) => self.flows.flow(tenant, class),
            _ => self.flows.flow_of(None, None),
        }
    }

    /// Its size: requests and prompt tokens.
    pub fn state(&self) -> QueueState {
        QueueState {
            requests: self.entries.len(),
            tokens: self.tokens,
        }
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Lets a request of `flow` costing `prompt` + `output` tokens in at `now` (the
    /// tenant's limits), before it is routed or queued; every permit must be given back
    /// with [`AdmissionQueue::leave`].
    pub fn enter(
        &mut self,
        flow: Flow,
        now: Time,
        prompt: u64,
        output: u64,
    ) -> Result<Permit, OverLimit> {
        let permit = self
            .limits
            .enter(&self.flows, flow.tenant, now, prompt, output)?;
        Ok(Permit {
            generation: self.generation,
            ..permit
        })
    }

    /// A request that entered left, having produced `output` tokens (`None`: never
    /// dispatched).
    pub fn leave(&mut self, permit: Permit, output: Option<u64>) {
        // Given out before more reloads than are remembered: dropped, not counted against
        // another tenant.
        let Some(tenant) = self.tenant_now(permit.tenant, permit.generation) else {
            return;
        };
        self.limits
            .leave(&self.flows, Permit { tenant, ..permit }, output);
    }

    /// Whether a request of `band` for `eligible` must wait behind one already here (of
    /// its band or a higher one) that could take the same worker, instead of being routed
    /// at once.
    pub fn holds(&self, eligible: &Eligible, band: u8) -> bool {
        self.entries
            .iter()
            .any(|e| e.flow.band >= band && e.eligible.overlaps(eligible))
    }

    /// Queues a request at `now`; when the queue is at its request or token limit, the
    /// requests of lower bands it displaces are given back with it (to be refused as
    /// [`RejectReason::Shed`]), or it is refused (and given back) when they would not make
    /// room.
    #[allow(clippy::type_complexity)]
    pub fn push(
        &mut self,
        config: &AdmissionConfig,
        now: Time,
        ask: Ask,
        item: T,
    ) -> Result<(Ticket, Vec<Queued<T>>), (RejectReason, T)> {
        let shed = match self.make_room(config, &ask) {
            Some(shed) => shed,
            None => return Err((RejectReason::QueueFull, item)),
        };
        let ticket = Ticket(self.next);
        self.next += 1;
        let t = usize::from(ask.flow.tenant.0);
        if self.served.len() <= t {
            self.served.resize(t + 1, 0.0);
        }
        if !self
            .entries
            .iter()
            .any(|e| e.flow.tenant == ask.flow.tenant)
        {
            // A tenant that was not waiting starts level with the least served waiting
            // one: idle time earns no credit.
            let floor = self
                .entries
                .iter()
                .map(|e| self.served[usize::from(e.flow.tenant.0)])
                .fold(f64::INFINITY, f64::min);
            if floor.is_finite() {
                self.served[t] = self.served[t].max(floor);
            }
        }
        let wait = Duration::from_secs_f64(config.max_queue_wait_secs);
        let (limit, expiry) = match ask.objective {
            Some(o) if o < wait => (o, RejectReason::Deadline),
            _ => (wait, RejectReason::QueueTimeout),
        };
        self.tokens = self.tokens.saturating_add(ask.tokens);
        self.entries.push_back(Queued {
            ticket,
            eligible: ask.eligible,
            tokens: ask.tokens,
            flow: ask.flow,
            cost: ask.cost,
            due: now.plus(ask.objective.unwrap_or(wait)),
            deadline: now.plus(limit),
            expiry,
            item,
        });
        Ok((ticket, shed))
    }

    /// Room for `ask`: nothing to do, or the lower bands' requests taken out to make it
    /// (`None`: not even all of them would).
    fn make_room(&mut self, config: &AdmissionConfig, ask: &Ask) -> Option<Vec<Queued<T>>> {
        if config.queue_has_room(self.state(), ask.tokens) {
            return Some(Vec::new());
        }
        let lower = |e: &Queued<T>| e.flow.band < ask.flow.band;
        let (n, tokens) = self
            .entries
            .iter()
            .filter(|e| lower(e))
            .fold((0, 0u64), |(n, t), e| (n + 1, t.saturating_add(e.tokens)));
        let after = QueueState {
            requests: self.entries.len() - n,
            tokens: self.tokens.saturating_sub(tokens),
        };
        if n == 0 || !config.queue_has_room(after, ask.tokens) {
            return None;
        }
        let mut shed = Vec::new();
        while !config.queue_has_room(self.state(), ask.tokens) {
            // The lowest band, the latest due, the latest arrival.
            let i = (0..self.entries.len())
                .filter(|&i| lower(&self.entries[i]))
                .min_by_key(|&i| {
                    let e = &self.entries[i];
                    (e.flow.band, std::cmp::Reverse((e.due, e.ticket)))
                })?;
            let e = self.entries.remove(i)?;
            self.tokens = self.tokens.saturating_sub(e.tokens);
            shed.push(e);
        }
        Some(shed)
    }

    /// Takes a request out (its client left, or its own timer fired); `None` when it is no
    /// longer here (dispatched, rejected or expired meanwhile).
    pub fn remove(&mut self, ticket: Ticket) -> Option<Queued<T>> {
        let i = self
            .entries
            .binary_search_by_key(&ticket, |e| e.ticket)
            .ok()?;
        self.take(i)
    }

    fn take(&mut self, i: usize) -> Option<Queued<T>> {
        let e = self.entries.remove(i)?;
        self.tokens = self.tokens.saturating_sub(e.tokens);
        if self.entries.is_empty() {
            // Nobody waits: fair queuing starts afresh.
            self.served.iter_mut().for_each(|s| *s = 0.0);
        }
        Some(e)
    }

    /// The deadline of the request at `ticket`, while it waits.
    pub fn deadline_of(&self, ticket: Ticket) -> Option<Time> {
        let i = self
            .entries
            .binary_search_by_key(&ticket, |e| e.ticket)
            .ok()?;
        Some(self.entries[i].deadline)
    }

    /// The earliest deadline of the requests waiting.
    pub fn next_deadline(&self) -> Option<Time> {
        self.entries.iter().map(|e| e.deadline).min()
    }

    /// Takes out every request whose deadline is at or before `now`, oldest first.
    pub fn expire(&mut self, now: Time) -> Vec<Queued<T>> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.entries.len() {
            if self.entries[i].deadline <= now {
                out.extend(self.take(i));
            } else {
                i += 1;
            }
        }
        out
    }

    /// A pass over the queue in its order: [`Drain::next`] takes out the next request
    /// worth trying, [`Drain::wait`] puts back one that must still wait (and skips the later
    /// ones of its kind for the rest of the pass).
    pub fn drain(&mut self) -> Drain<'_, T> {
        Drain {
            queue: self,
            tried: Vec::new(),
            blocked: Vec::new(),
        }
    }

    /// The place of the request to try next among those not `tried` and not of a
    /// `blocked` kind.
    fn best(&self, tried: &[Ticket], blocked: &[Eligible]) -> Option<usize> {
        let served = |e: &Queued<T>| {
            self.served
                .get(usize::from(e.flow.tenant.0))
                .copied()
                .unwrap_or(0.0)
        };
        let mut best: Option<usize> = None;
        for (i, e) in self.entries.iter().enumerate() {
            if tried.contains(&e.ticket) || blocked.contains(&e.eligible) {
                continue;
            }
            let better = match best {
                None => true,
                Some(b) => {
                    let b = &self.entries[b];
                    let (se, sb) = (served(e), served(b));
                    e.flow.band > b.flow.band
                        || (e.flow.band == b.flow.band
                            && (se < sb
                                || (se == sb
                                    && (e.flow.tenant, e.due, e.ticket)
                                        < (b.flow.tenant, b.due, b.ticket))))
                }
            };
            if better {
                best = Some(i);
            }
        }
        best
    }
}

/// One pass over an [`AdmissionQueue`] (see [`AdmissionQueue::drain`]).
#[derive(Debug)]
pub struct Drain<'q, T> {
    queue: &'q mut AdmissionQueue<T>,
    tried: Vec<Ticket>,
    blocked: Vec<Eligible>,
}

impl<T> Drain<'_, T> {
    /// The next request to try, taken out of the queue (it is gone unless given back with
    /// [`Drain::wait`]); its tenant is counted as served its cost.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<Queued<T>> {
        let q = &mut *self.queue;
        let i = q.best(&self.tried, &self.blocked)?;
        let e = q.take(i)?;
        let w = q.flows.tenant(e.flow.tenant).weight;
        if let Some(s) = q.served.get_mut(usize::from(e.flow.tenant.0)) {
            *s += e.cost as f64 / w;
        }
        Some(e)
    }

    /// Gives back the request [`Drain::next`] just took: it still waits, in its place, and
    /// its tenant's charge is taken back.
    pub fn wait(&mut self, e: Queued<T>) {
        let q = &mut *self.queue;
        q.tokens = q.tokens.saturating_add(e.tokens);
        let w = q.flows.tenant(e.flow.tenant).weight;
        if let Some(s) = q.served.get_mut(usize::from(e.flow.tenant.0)) {
            *s = (*s - e.cost as f64 / w).max(0.0);
        }
        if !self.blocked.contains(&e.eligible) {
            self.blocked.push(e.eligible.clone());
        }
        self.tried.push(e.ticket);
        let at = q.entries.partition_point(|x| x.ticket < e.ticket);
        q.entries.insert(at, e);
    }

    /// The queue's size without the request being tried (what admission must see for it).
    pub fn state(&self) -> QueueState {
        self.queue.state()
    }
}

#[cfg(test)]
mod tests;
