//! The discrete-event loop.

use crate::driver::{Driver, NewRequest, Outcome, RequestPrompt};
use crate::replicas::Replicas;
use crate::router_thread::{link, RouteCall, RoutePrompt, RouterLink};
use crate::trace_prompts::TracePrompts;
use crate::{SimConfig, SimError, SimResult, Workload};
use kvroute_core::router::RouteOutcome;
use kvroute_core::{
    AdmissionQueue, BlockSize, Eligible, KvEvent, Namespace, QueueState, Queued, RejectReason,
    RequestId, Tier, Time, Tracking, WorkerCapacity, WorkerId, WorkerRole,
};
use kvroute_engine::{Engine, StepOutput};
use kvroute_workload::{BlockHashCache, ConversationId, RequestRecord, Status, Summary};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

mod flow;
mod split;

enum Event {
    Arrival(Box<NewRequest>),
    Wake(usize),
    KvDelivery(usize, Tier, Vec<KvEvent>),
    /// A queued request's deadline.
    QueueTimeout,
    /// A request the router held (a burst's later request) is routed now.
    Release(Box<Waiting>),
    /// A split request's KV has reached its decode engine.
    Transferred(RequestId),
}

struct Entry {
    t: Time,
    seq: u64,
    ev: Event,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.t, self.seq) == (o.t, o.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    /// Reversed: the heap pops the earliest (then first scheduled) event.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.t, o.seq).cmp(&(self.t, self.seq))
    }
}

/// A request to route, or waiting in the admission queue.
struct Waiting {
    id: RequestId,
    prompt: RoutePrompt,
    /// Its prompt's length in tokens.
    tokens: usize,
    max_tokens: u32,
    session: Option<u64>,
}

struct Sim<'a> {
    cfg: SimConfig,
    /// The router, on a thread of its own (see `router_thread`).
    router: RouterLink,
    engines: Vec<Engine>,
    wake: Vec<Option<Time>>,
    heap: BinaryHeap<Entry>,
    seq: u64,
    driver: Driver<'a>,
    /// Trace prompts, hashed ahead while the loop waits for a route.
    prompts: &'a TracePrompts<'a>,
    /// Tokens of a hash id while it is hashed ahead.
    scratch: Vec<u32>,
    records: Vec<RequestRecord>,
    last_token: Vec<Time>,
    conversation: Vec<Option<ConversationId>>,
    /// The admission queue (the gateway's: the core's one implementation).
    queue: AdmissionQueue<Waiting>,
    /// Trace arrivals not yet due, in time order (kept out of the heap: they are many, and
    /// already sorted). At equal times they go before heap events.
    trace: VecDeque<(usize, Time)>,
    queued_total: u64,
    now: Time,
    /// The run stopped at `max_sim_time` with events still due.
    cut: bool,
    /// Block hashes of the hash ids of closed-loop prompts (trace prompts are cut on the
    /// router thread).
    block_hashes: BlockHashCache,
    /// Engine output buffers, reused from step to step.
    out: StepOutput,
    /// The gaps between a token run's steps, run-length encoded (reused).
    gaps: Vec<(f64, u32)>,
    /// Per engine, whether it only prefills (it runs split requests' prefill legs).
    prefill_only: Vec<bool>,
    /// Split requests between their prefill leg and their decode (`split.rs`).
    legs: HashMap<RequestId, split::Leg>,
    /// Per source (tenant), its flow.
    source_flows: Vec<kvroute_core::flow::Flow>,
    /// Per request, its source.
    source: Vec<u16>,
    /// Per request, its flow and permit (`flow.rs`).
    flows: Vec<flow::RequestFlow>,
}

/// Runs a simulation to its end.
pub fn simulate(cfg: &SimConfig, workload: Workload) -> Result<SimResult, SimError> {
    simulate_with(cfg, workload, true)
}

/// [`simulate`], with the engines' fast paths on or off (the results are the same: tests
/// check it).
fn simulate_with(
    cfg: &SimConfig,
    workload: Workload,
    fast_paths: bool,
) -> Result<SimResult, SimError> {
    cfg.validate()?;
    // The fleet is fixed: the router tracks no more workers than it has (a small fleet's
    // index then packs its node table tighter).
    let mut router_cfg = cfg.router.clone();
    router_cfg.max_workers = router_cfg.max_workers.min(cfg.workers);
    let mut router = Replicas::new(&router_cfg, cfg.replicas, cfg.replica_sync)?;
    let mut engines = Vec::with_capacity(cfg.workers);
    for w in 0..cfg.workers {
        for r in router.all_mut() {
            r.add_worker_with(
                WorkerId(w as u64),
                WorkerCapacity {
                    kv_blocks: Some(cfg.engine.num_gpu_blocks as u64),
                    max_batch: Some(cfg.engine.max_num_seqs as u32),
                },
                cfg.tracking,
            )?;
            if cfg.tracking == Tracking::Events {
                // Engines and router share this process: events name blocks by pool index
                // and carry the router's hashes, so the index keeps each engine's names in
                // an array.
                r.use_block_ids(WorkerId(w as u64), cfg.engine.num_gpu_blocks);
                r.reserve(WorkerId(w as u64), cfg.engine.num_gpu_blocks);
            }
            r.set_role(WorkerId(w as u64), cfg.role(w));
            // The loop runs split requests' two legs (`split.rs`).
            r.set_split_prefill(cfg.prefill_workers > 0);
        }
        let mut ecfg = cfg.engine.clone();
        ecfg.kv_events_with_tokens = false;
        let mut engine = Engine::new(ecfg).map_err(|e| SimError::Config(e.to_string()))?;
        engine.set_fast_paths(fast_paths);
        // Only each token's request and time matter here: silent steps' tokens by run.
        engine.set_token_runs(true);
        engines.push(engine);
    }
    // The trace's requests move out of the workload: the event loop and the router thread
    // (which cuts their prompts into blocks) both read them.
    let (trace, trace_source, loops, sources) = workload.split().map_err(SimError::Workload)?;
    let block_size =
        BlockSize::new(cfg.router.block_size).map_err(|e| SimError::Config(e.to_string()))?;
    let prompts = TracePrompts::new(&trace, block_size, Namespace::default());
    let driver = Driver::new(loops, &trace, &trace_source, cfg.duration.map(Time));
    let (router_link, server) = link();
    let (sim, totals) = std::thread::scope(|scope| {
        let serving = scope.spawn(|| server.serve(&mut router, &prompts));
        let sim = run_loop(cfg, driver, &prompts, engines, router_link, &sources);
        // A panic on the router thread is a bug: pass it on.
        let totals = serving
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (sim, totals)
    });
    let sim = sim?;
    let approx_capacities = (0..cfg.workers)
        .map(|w| router.first().approx_capacity(WorkerId(w as u64)))
        .collect();
    let warm = Time(cfg.warmup);
    let measured = || sim.records.iter().filter(|r| r.arrival >= warm);
    let start = measured().map(|r| r.arrival).min().unwrap_or(warm);
    // A closed loop with a set duration is measured over its window; otherwise from the
    // first measured arrival to the last event, or to `max_sim_time` when the run was cut
    // there (the last event before the cut depends on which steps the engines ran one by
    // one: not a property of the run).
    let span = match cfg.duration {
        Some(d) if d > cfg.warmup => d - cfg.warmup,
        _ if sim.cut => Time(cfg.max_sim_time).since(start),
        _ => sim.now.since(start),
    };
    let (tenants, classes) = flow::results(cfg, &sources, &sim.source, &sim.records, warm, span);
    Ok(SimResult {
        tenants,
        classes,
        summary: Summary::from_records_with_slo(measured(), span, cfg.slo.as_ref()),
        sim_seconds: span.as_secs_f64(),
        engines: sim.engines.iter().map(|e| e.metrics()).collect(),
        kv_events_rejected: totals.kv_rejected,
        queued: sim.queued_total,
        records: sim.records,
        approx_capacities,
    })
}

/// What the event loop leaves for the result.
struct Ended {
    records: Vec<RequestRecord>,
    /// Per record, its source.
    source: Vec<u16>,
    engines: Vec<Engine>,
    now: Time,
    cut: bool,
    queued_total: u64,
}

/// Runs the event loop to its end, the router behind `router`; closes the link when done.
fn run_loop<'a>(
    cfg: &SimConfig,
    driver: Driver<'a>,
    prompts: &'a TracePrompts<'a>,
    engines: Vec<Engine>,
    router: RouterLink,
    sources: &[crate::driver::Source],
) -> Result<Ended, SimError> {
    let flows = cfg.router.admission.flow.compile();
    let mut sim = Sim {
        cfg: cfg.clone(),
        router,
        wake: vec![None; engines.len()],
        engines,
        heap: BinaryHeap::new(),
        seq: 0,
        driver,
        prompts,
        scratch: Vec::new(),
        records: Vec::new(),
        last_token: Vec::new(),
        conversation: Vec::new(),
        source_flows: flow::source_flows(&flows, sources),
        queue: AdmissionQueue::new(flows),
        source: Vec::new(),
        flows: Vec::new(),
        trace: VecDeque::new(),
        queued_total: 0,
        now: Time::ZERO,
        cut: false,
        block_hashes: BlockHashCache::new(
            BlockSize::new(cfg.router.block_size).map_err(|e| SimError::Config(e.to_string()))?,
            Namespace::default(),
            1 << 18,
        ),
        out: StepOutput::default(),
        gaps: Vec::new(),
        prefill_only: (0..cfg.workers)
            .map(|w| cfg.role(w) == WorkerRole::Prefill)
            .collect(),
        legs: HashMap::new(),
    };
    sim.trace = sim.driver.trace_arrivals().into();
    // Closed-loop clients start evenly spread over the ramp (all at once without one).
    let first = sim.driver.initial();
    let n = first.len().max(1) as u32;
    for (i, r) in first.into_iter().enumerate() {
        let at = Time(cfg.ramp * i as u32 / n);
        sim.push(at, Event::Arrival(Box::new(r)));
    }
    sim.run();
    sim.finish_silent_steps();
    let Sim {
        router,
        source,
        mut records,
        engines,
        now,
        cut,
        queued_total,
        ..
    } = sim;
    router.close();
    for r in &mut records {
        if r.finished.is_none() {
            r.status = Status::Failed("unfinished when the simulation stopped".into());
        }
    }
    Ok(Ended {
        records,
        source,
        engines,
        now,
        cut,
        queued_total,
    })
}

impl<'a> Sim<'a> {
    fn push(&mut self, t: Time, ev: Event) {
        self.seq += 1;
        self.heap.push(Entry {
            t,
            seq: self.seq,
            ev,
        });
    }

    fn run(&mut self) {
        let end = Time(self.cfg.max_sim_time);
        loop {
            let trace_first = match (self.trace.front(), self.heap.peek()) {
                (None, None) => break,
                (Some(a), Some(e)) => a.1 <= e.t,
                (Some(_), None) => true,
                (None, Some(_)) => false,
            };
            if trace_first {
                let (i, t) = self.trace.pop_front().expect("peeked");
                if t > end {
                    self.cut = true;
                    break;
                }
                self.now = t;
                if let Some(r) = self.driver.trace_request(i) {
                    self.arrive(t, r);
                }
                continue;
            }
            let Some(Entry { t, ev, .. }) = self.heap.pop() else {
                break;
            };
            if t > end {
                self.cut = true;
                break;
            }
            self.now = t;
            match ev {
                Event::Arrival(r) => self.arrive(t, *r),
                Event::Wake(w) => {
                    if self.wake[w] == Some(t) {
                        self.wake[w] = None;
                        self.run_engine(w, t);
                    }
                }
                Event::KvDelivery(w, tier, events) => {
                    self.router.events(WorkerId(w as u64), tier, events)
                }
                Event::QueueTimeout => self.expire(t),
                Event::Release(q) => self.admit(t, *q, false),
                Event::Transferred(id) => self.transferred(t, id),
            }
        }
    }

    /// Steps engine `w` at `t`, then keeps stepping it while its next step ends before
    /// anything else in the simulation happens (and before the end). Exactly what the event
    /// loop would do, without a round through the heap per step: nothing else can reach the
    /// engine or the router in between, and an event the steps cause (a closed-loop turn, a
    /// dispatch, a delayed KV delivery) lands in the heap and stops the run.
    fn run_engine(&mut self, w: usize, t: Time) {
        let end = Time(self.cfg.max_sim_time);
        let mut t = t;
        let mut out = std::mem::take(&mut self.out);
        loop {
            self.engines[w].step_into(t, &mut out);
            self.handle(w, &mut out);
            match self.engines[w].next_report_time() {
                Some(next) if next < self.horizon() && next <= end => {
                    t = next;
                    self.now = next;
                }
                _ => break,
            }
        }
        self.out = out;
        self.reschedule(w);
        self.router.flush();
    }

    /// Runs the engines' silent steps that end by the end of the run (stepping one by one,
    /// the event loop would have run them).
    fn finish_silent_steps(&mut self) {
        let end = self
            .now
            .max(Time(self.cfg.max_sim_time).min(self.horizon()));
        let mut out = std::mem::take(&mut self.out);
        for w in 0..self.engines.len() {
            out.tokens.clear();
            out.runs.clear();
            self.engines[w].catch_up(end, &mut out);
            out.time = end;
            self.handle(w, &mut out);
        }
        self.out = out;
    }

    /// The time of the next pending event, if any.
    fn horizon(&self) -> Time {
        let heap = self.heap.peek().map(|e| e.t);
        let trace = self.trace.front().map(|a| a.1);
        match (heap, trace) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(Time(Duration::MAX)),
        }
    }

    /// A new request arrives at `t`: record it, then route it.
    fn arrive(&mut self, t: Time, r: NewRequest) {
        let id = RequestId(self.records.len() as u64);
        let (prompt, tokens) = match r.prompt {
            RequestPrompt::Trace { index, tokens } => (RoutePrompt::Trace(index), tokens),
            RequestPrompt::Own(p) => {
                let (blocked, tail) = self.block_hashes.blocked_with_tail(&p);
                let tokens = blocked.tokens;
                (RoutePrompt::Blocked(blocked, tail), tokens)
            }
        };
        let mut rec = RequestRecord::new(id, t, tokens as u64);
        rec.session = r.session;
        self.records.push(rec);
        self.last_token.push(t);
        self.conversation.push(r.conversation);
        self.source.push(r.source);
        let flow = self.source_flows[usize::from(r.source)];
        if !self.enter(t, id, flow, r.max_tokens) {
            return;
        }
        let q = Waiting {
            id,
            prompt,
            tokens,
            max_tokens: r.max_tokens,
            session: r.session,
        };
        self.admit(t, q, true);
    }

    /// Routes `q` at `t` (the router may hold it when `may_hold`), or queues it.
    fn admit(&mut self, t: Time, q: Waiting, may_hold: bool) {
        // Behind the requests already waiting, without overtaking them (as in the gateway).
        let waits = if self.queue.holds(&Eligible::Any, self.band(q.id)) {
            Some(q)
        } else {
            self.try_dispatch(t, q, self.queue.state(), may_hold)
        };
        if let Some(q) = waits {
            let admission = &self.cfg.router.admission;
            let ask = self.ask(&q);
            match self.queue.push(admission, t, ask, q) {
                Ok((ticket, shed)) => {
                    self.queued_total += 1;
                    let deadline = self.queue.deadline_of(ticket);
                    if let Some(d) = deadline {
                        self.push(d, Event::QueueTimeout);
                    }
                    for e in shed {
                        self.refuse(t, e.item.id, RejectReason::Shed);
                    }
                }
                Err((reason, q)) => self.refuse(t, q.id, reason),
            }
        }
    }

    /// Routes and dispatches `q`, with `queue` waiting ahead of it; gives it back when it
    /// must wait in the queue.
    fn try_dispatch(
        &mut self,
        t: Time,
        q: Waiting,
        queue: QueueState,
        may_hold: bool,
    ) -> Option<Waiting> {
        let Waiting {
            id,
            prompt,
            tokens,
            max_tokens,
            session,
        } = q;
        let call = RouteCall {
            id,
            // Conversations (or, without one, requests) spread round-robin over the replicas.
            replica: (session.unwrap_or(id.0) % self.cfg.replicas.max(1) as u64) as usize,
            prompt,
            session,
            queue,
            flow: self.flows[id.0 as usize].flow,
            now: t,
            may_hold,
        };
        let (prompts, scratch) = (self.prompts, &mut self.scratch);
        let routed = self.router.route(call, || prompts.hash_ahead(scratch));
        if let Some(until) = routed.held {
            let held = Waiting {
                id,
                prompt: RoutePrompt::Blocked(routed.prompt, routed.tail),
                tokens,
                max_tokens,
                session,
            };
            self.push(until, Event::Release(Box::new(held)));
            return None;
        }
        let sel = match routed.outcome {
            RouteOutcome::Queue => {
                return Some(Waiting {
                    id,
                    prompt: RoutePrompt::Blocked(routed.prompt, routed.tail),
                    tokens,
                    max_tokens,
                    session,
                })
            }
            RouteOutcome::Reject(reason, _) => {
                self.refuse(t, id, reason);
                return None;
            }
            RouteOutcome::Dispatch(sel) => sel,
        };
        if routed.dispatch_refused {
            self.end(t, id, Status::Failed("dispatch_refused".into()), None);
            return None;
        }
        let w = sel.worker.0 as usize;
        let rec = &mut self.records[id.0 as usize];
        rec.worker = Some(sel.worker.0);
        rec.predicted_cached_tokens = sel.cached_tokens as u64;
        let prompt = (routed.prompt.sequence, routed.tail);
        match sel.prefill {
            Some(p) => self.start_split(t, id, (p.worker.0 as usize, w), prompt, max_tokens),
            None => self.submit(t, id, w, prompt, max_tokens, 0),
        }
        None
    }

    /// Dispatches queued requests in arrival order while the router lets them go (the
    /// core queue's pass: the first that must still wait holds back the rest).
    fn drain_queue(&mut self, t: Time) {
        let mut queue = std::mem::take(&mut self.queue);
        let mut pass = queue.drain();
        while let Some(e) = pass.next() {
            let ahead = pass.state();
            let Queued { item, .. } = e;
            if let Some(item) = self.try_dispatch(t, item, ahead, false) {
                pass.wait(Queued { item, ..e });
            }
        }
        drop(pass);
        self.queue = queue;
    }

    /// Refuses the queued requests whose deadline is `t` or earlier.
    fn expire(&mut self, t: Time) {
        for e in self.queue.expire(t) {
            self.refuse(t, e.item.id, e.expiry);
        }
    }

    /// Applies an engine step's output: tokens, finished requests, KV events.
    fn handle(&mut self, w: usize, out: &mut StepOutput) {
        if self.prefill_only[w] {
            self.handle_prefill(w, out);
            return;
        }
        let t = out.time;
        // First tokens and finishes release booked load: queued requests may go then.
        let mut released = !out.finished.is_empty();
        for (ids, times) in out.runs.runs() {
            released |= self.token_run(ids, times);
        }
        for tok in &out.tokens {
            let i = tok.id.0 as usize;
            let rec = &mut self.records[i];
            if rec.first_token.is_none() {
                rec.first_token = Some(tok.time);
                released = true;
                self.router.first_token(tok.id, tok.time);
            } else {
                rec.push_gaps(tok.time.since(self.last_token[i]).as_secs_f64(), 1);
            }
            self.last_token[i] = tok.time;
        }
        self.deliver_all(w, t, out);
        for f in out.finished.drain(..) {
            let rec = &mut self.records[f.id.0 as usize];
            // A split request's hit is its prefill engine's (the KV moved counts as cached
            // on the decode engine).
            let cached = rec.prefill_worker.is_none().then_some(f.cached_tokens);
            self.router
                .finish(f.id, t, Some(f.output.len() as u64), cached);
            let rec = &mut self.records[f.id.0 as usize];
            if let Some(c) = cached {
                rec.cached_tokens = c as u64;
            }
            rec.output_tokens = f.output.len() as u64;
            self.end(t, f.id, Status::Completed, Some(&f.output));
        }
        if released && !self.queue.is_empty() {
            self.drain_queue(t);
        }
    }

    /// Hands engine `w`'s KV events of a step to the router (none when it tracks engines
    /// without events).
    fn deliver_all(&mut self, w: usize, t: Time, out: &mut StepOutput) {
        if self.cfg.tracking == Tracking::Approximate {
            // Engines without an event publisher: the router never sees their events.
            out.events.clear();
            out.host_events.clear();
        } else {
            // The host tier's events after the device's, as a worker publishes them.
            self.deliver(w, t, Tier::Device, &mut out.events);
            self.deliver(w, t, Tier::Host, &mut out.host_events);
        }
    }

    /// Hands engine `w`'s KV events of `tier` (taken from `events`) to the router, now or
    /// after the configured delay.
    fn deliver(&mut self, w: usize, t: Time, tier: Tier, events: &mut Vec<KvEvent>) {
        if events.is_empty() {
            return;
        }
        let events = std::mem::replace(events, self.router.event_buffer());
        if self.cfg.kv_event_delay.is_zero() {
            self.router.events(WorkerId(w as u64), tier, events);
        } else {
            self.push(
                t.plus(self.cfg.kv_event_delay),
                Event::KvDelivery(w, tier, events),
            );
        }
    }

    /// Records a run of tokens (each of `ids` got one at each of `times`) exactly as one
    /// token at a time would be recorded; true when one was a first token.
    fn token_run(&mut self, ids: &[RequestId], times: &[Time]) -> bool {
        let (Some(&first), Some(&last)) = (times.first(), times.last()) else {
            return false;
        };
        // The gaps after the first token are the same for every request of the run.
        let gaps = &mut self.gaps;
        gaps.clear();
        for w in times.windows(2) {
            let gap = w[1].since(w[0]).as_secs_f64();
            match gaps.last_mut() {
                Some((g, c)) if *g == gap => *c += 1,
                _ => gaps.push((gap, 1)),
            }
        }
        let mut released = false;
        for &id in ids {
            let i = id.0 as usize;
            let rec = &mut self.records[i];
            if rec.first_token.is_none() {
                // Not expected (a run's steps are decode steps), but kept exact.
                rec.first_token = Some(first);
                released = true;
                self.router.first_token(id, first);
            } else {
                rec.push_gaps(first.since(self.last_token[i]).as_secs_f64(), 1);
            }
            for &(gap, count) in self.gaps.iter() {
                rec.push_gaps(gap, count);
            }
            self.last_token[i] = last;
        }
        released
    }

    /// A request ended: close its record and let a closed-loop client go on.
    fn end(&mut self, t: Time, id: RequestId, status: Status, answer: Option<&[u32]>) {
        let backoff = self.cfg.client_backoff;
        self.close(t, id, status, answer, backoff);
    }

    /// The router refused a request: its client comes back after the `Retry-After` the
    /// gateway would have sent for `reason`.
    fn refuse(&mut self, t: Time, id: RequestId, reason: RejectReason) {
        let wait = Duration::from_secs(reason.retry_after_secs());
        self.refuse_for(t, id, reason, wait);
    }

    /// The router or the queue refused a request, asking its client to wait `wait`.
    fn refuse_for(&mut self, t: Time, id: RequestId, reason: RejectReason, wait: Duration) {
        self.close(t, id, Status::Rejected(reason.as_str().into()), None, wait);
    }

    /// Closes a request's record; a closed-loop client goes on at once after an answer, or
    /// after `backoff` when there was none.
    fn close(
        &mut self,
        t: Time,
        id: RequestId,
        status: Status,
        answer: Option<&[u32]>,
        backoff: Duration,
    ) {
        let i = id.0 as usize;
        let rec = &mut self.records[i];
        rec.finished = Some(t);
        rec.status = status;
        self.leave(id);
        let (outcome, at) = match answer {
            Some(a) => (Outcome::Answered(a), t),
            None => (Outcome::Failed, t.plus(backoff)),
        };
        let source = self.source[i];
        if let Some(next) = self.driver.next(at, source, self.conversation[i], outcome) {
            self.push(at, Event::Arrival(Box::new(next)));
        }
    }

    /// Wakes engine `w` when it next reports more than tokens (its silent steps before
    /// then are run on the way: see `kvroute_engine`'s `Engine::next_report_time`).
    fn reschedule(&mut self, w: usize) {
        if let Some(t) = self.engines[w].next_report_time() {
            if self.wake[w] != Some(t) {
                self.wake[w] = Some(t);
                self.push(t, Event::Wake(w));
            }
        }
    }
}

#[cfg(test)]
mod tests;
