//! KV event ingestion: one task per worker reads its event feed (ZMQ or, in the one-process
//! demo, an in-process channel), checks sequence numbers, re-synchronises after the
//! publisher went away, and applies the batches to the router's index.
//!
//! - Sequence numbers are consecutive per engine incarnation. A gap means batches were lost:
//!   the task asks the engine's replay service for them. A number going back is a batch
//!   delivered twice or late (dropped, counted) or, when its number 0 or its content says so
//!   ([`kvroute_fleet::sequence::judge_back`]) and the replay service agrees, a restarted engine: the worker's
//!   entries are dropped before the new batch applies.
//! - At start, and whenever the publisher comes back after a disconnect (or the worker's
//!   health check passes again after failing), the task asks the replay service for the
//!   batch it applied last ([`kvroute_fleet::sequence::verdict`]): the same batch means the same engine, whose
//!   cache the index still mirrors (the batches after it are applied); another one means
//!   the engine restarted, and the index is rebuilt from the replay.
//! - The worker's [`CacheState`] says how far the index can be trusted: exact, catching up,
//!   or unknown (events lost for good, history older than the replay buffer, publisher
//!   away). Nothing here drops an index because an engine is slow or unreachable.

mod poll;
mod sources;
mod zmq;

pub use self::poll::{poll_feeds, PollSubscription};
pub use self::sources::Sources;
pub use self::zmq::{zmq_feed, ZmqReplay, ZmqSubscription, END_SEQ};
pub use kvroute_fleet::feed::{EventFeed, FeedItem, Replay, Snapshot};

use kvroute_core::{IndexError, WorkerId};
use kvroute_fleet::backoff;
use kvroute_fleet::clock::Clock;
use kvroute_fleet::registry::{CacheState, WorkerEntry};
use kvroute_fleet::sequence::{
    classify, complete_from_start, judge_back, verdict, Back, Mark, Recent, Step, Verdict,
};
use kvroute_fleet::sink::IndexSink;
use kvroute_protocol::kv_events::{Event, EventBatch};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Blocks applied per hold of the router's lock when a snapshot loads (routing goes on in
/// between).
const SNAPSHOT_CHUNK: usize = 65_536;

/// Loads `snap` into the worker's (empty) index and takes its batch as the one applied last:
/// the start's re-synchronisation then asks the replay service for what followed.
fn load_snapshot(ix: &IndexSink, entry: &WorkerEntry, t: &mut Tracker, snap: Snapshot) {
    let n = snap.blocks.len();
    for chunk in snap.blocks.chunks(SNAPSHOT_CHUNK) {
        let (names, seqs): (Vec<_>, Vec<_>) = chunk.iter().copied().unzip();
        let ev = kvroute_core::KvEvent::StoredHashed(kvroute_core::StoredHashed {
            parent: None,
            block_hashes: names,
            sequence_hashes: seqs,
        });
        // The router's lock is let go before `clear` takes it again.
        let applied = ix.table.update(|r| r.apply_event(entry.id, &ev));
        if let Err(e) = applied {
            tracing::warn!(worker = %entry.name, error = %e, "snapshot refused; the index rebuilds from the replay");
            clear(ix, entry);
            return;
        }
    }
    entry.events.set_last_mark(Some(snap.mark));
    t.last = Some(snap.mark);
    t.recent.push(snap.mark);
    t.next = Some(snap.mark.seq.wrapping_add(1));
    tracing::info!(worker = %entry.name, blocks = n, seq = snap.mark.seq, "KV index loaded from a snapshot");
}

/// One worker's ingestion state.
#[derive(Default)]
struct Tracker {
    /// The sequence number expected next (None: any).
    next: Option<u64>,
    /// The batch applied last.
    last: Option<Mark>,
    /// The batches applied last (to tell a repeated or late batch from a restart).
    recent: Recent,
    /// Live batches below this were applied from a replay already: skip them.
    skip_below: Option<u64>,
    /// The publisher went away and has not come back yet.
    away: bool,
    /// Events were lost for good since the index was last rebuilt.
    lost: bool,
}

/// Runs a worker's ingestion until its feed ends.
pub async fn ingest(ix: Arc<IndexSink>, worker: WorkerId, mut feed: EventFeed) {
    let Some(entry) = ix.registry.get(worker) else {
        return;
    };
    let entry = &*entry;
    entry.has_feed.store(true, Ordering::Release);
    let mut t = Tracker::default();
    let replay = feed.replay.take();
    let replay = replay.as_deref();
    if let Some(r) = replay {
        if let Some(snap) = r.snapshot().await {
            load_snapshot(&ix, entry, &mut t, snap);
        }
    }
    let mut retry = Retry::new(ix.clock);
    let synced = resync(&ix, entry, replay, &mut t, "start").await;
    retry.after(synced, replay.is_some());
    loop {
        let item = tokio::select! {
            () = retry.due() => {
                // The replay service did not answer when the publisher (re)connected (its
                // relay may reconnect after the gateway): ask again, unless events came
                // meanwhile and made the index whole.
                if entry.cache_state() == CacheState::Unknown && !t.away {
                    let synced = resync(&ix, entry, replay, &mut t, "replay asked again").await;
                    retry.after(synced, true);
                } else {
                    retry.after(Synced::Same, true);
                }
                continue;
            }
            item = feed.items.recv() => match item {
                Some(i) => i,
                None => break,
            },
            () = entry.heal.notified() => {
                heal(&ix, entry, &mut t);
                continue;
            }
            () = entry.repair.notified() => {
                // Its predictions keep missing while the stream looked whole (events lost
                // without a gap, a reset that kept its sequence).
                repair(&ix, entry, replay, &mut t).await;
                continue;
            }
            () = entry.verify.notified() => {
                // The worker answers again after failing: whether its engine restarted is
                // for the replay service to say (even while the publisher is still away),
                // before requests go there again.
                let synced = resync(&ix, entry, replay, &mut t, "health check passed again").await;
                retry.after(synced, replay.is_some());
                ix.workers.verified(entry.id);
                continue;
            }
        };
        match item {
            FeedItem::Batch(b) => on_batch(&ix, entry, replay, &mut t, &b).await,
            FeedItem::Connected => {
                if t.away {
                    entry.events.resubscribes.fetch_add(1, Ordering::Relaxed);
                }
                t.away = false;
                // What the engine published before this subscription held (at start, or
                // while it was away) is in its replay buffer.
                let synced = resync(&ix, entry, replay, &mut t, "publisher connected").await;
                retry.after(synced, replay.is_some());
            }
            FeedItem::Disconnected => {
                t.away = true;
                entry.events.disconnects.fetch_add(1, Ordering::Relaxed);
                entry.set_cache_state(CacheState::Unknown);
            }
            FeedItem::Lost { reason } => {
                tracing::warn!(worker = %entry.name, %reason, "KV events lost for good; dropping the worker's index, which rebuilds from the events that follow");
                clear(&ix, entry);
                entry.events.gaps.fetch_add(1, Ordering::Relaxed);
                entry.events.degraded.store(true, Ordering::Relaxed);
                lose(entry, &mut t);
                entry.set_cache_state(state_of(&t));
            }
            FeedItem::Restarted => {
                entry.events.restarts.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(worker = %entry.name, "engine restarted (its event ids began again): dropping its index entries");
                clear(&ix, entry);
                t.lost = false;
                entry.set_cache_state(state_of(&t));
            }
            FeedItem::Undecodable(error) => {
                tracing::warn!(worker = %entry.name, %error, "undecodable KV event message dropped");
                count(&ix, &entry.name, "message", "undecodable");
            }
        }
    }
    // Nobody checks this worker's events any more: health checks alone bring it back.
    entry.has_feed.store(false, Ordering::Release);
    ix.workers.verified(entry.id);
    tracing::info!(worker = %entry.name, "KV event feed ended");
}

/// When to ask an unanswering replay service again: [`backoff::replay`]'s pauses (1 s,
/// doubling up to 30 s) on the gateway's clock, until it answers.
struct Retry {
    clock: Clock,
    at: Option<tokio::time::Instant>,
    pauses: backoff::Pauses,
}

impl Retry {
    fn new(clock: Clock) -> Self {
        Self {
            clock,
            at: None,
            pauses: backoff::Pauses::new(backoff::replay()),
        }
    }

    /// Notes what a re-synchronisation found.
    fn after(&mut self, synced: Synced, has_replay: bool) {
        if synced == Synced::NoAnswer && has_replay {
            let due = self.clock.now().plus(self.pauses.next_pause());
            self.at = Some(self.clock.instant(due));
        } else {
            self.at = None;
            self.pauses.reset();
        }
    }

    /// Resolves when a retry is due; never when none is pending.
    async fn due(&mut self) {
        match self.at {
            Some(at) => {
                tokio::time::sleep_until(at).await;
                self.at = None;
            }
            None => std::future::pending().await,
        }
    }
}

impl Tracker {
    /// Notes `b` as applied.
    fn applied(&mut self, b: &EventBatch) {
        let mark = Mark::of(b);
        self.last = Some(mark);
        self.recent.push(mark);
    }

    /// Forgets what was applied (the index was dropped).
    fn forget(&mut self) {
        self.last = None;
        self.recent.clear();
    }
}

/// Events of the worker were lost for good: its index is unknown, and the prediction
/// window starts afresh, so that what heals it is judged on answers after the loss.
fn lose(entry: &WorkerEntry, t: &mut Tracker) {
    if !t.lost {
        entry.restart_predictions();
    }
    t.lost = true;
}

/// The accuracy loop found a whole window of answers since the loss predicted as the engine
/// reported them: the index is taken as whole again, unless the publisher is away.
fn heal(ix: &IndexSink, entry: &WorkerEntry, t: &mut Tracker) {
    if !t.lost || t.away {
        return;
    }
    t.lost = false;
    entry.set_cache_state(state_of(t));
    ix.metrics
        .index_heals
        .with_label_values(&[entry.name.as_str()])
        .inc();
    tracing::info!(worker = %entry.name, "KV index taken as whole again: the predictions since its events were lost agree with what the engine reports");
}

fn state_of(t: &Tracker) -> CacheState {
    if t.away || t.lost {
        CacheState::Unknown
    } else {
        CacheState::Exact
    }
}

/// Handles one live batch.
async fn on_batch(
    ix: &Arc<IndexSink>,
    entry: &WorkerEntry,
    replay: Option<&dyn Replay>,
    t: &mut Tracker,
    b: &Arc<EventBatch>,
) {
    if let Some(s) = t.skip_below {
        if b.seq < s {
            return;
        }
        t.skip_below = None;
    }
    // A first batch past 0 means history was published before this feed: fetch it.
    let mut step = match t.next {
        None if b.seq > 0 => Step::Gap { from: 0 },
        next => classify(next, b.seq),
    };
    if step == Step::Back {
        if !went_back(ix, entry, replay, t, b).await {
            return;
        }
        step = classify(t.next, b.seq);
    }
    match step {
        // Handled above.
        Step::Apply | Step::Back => {}
        Step::Gap { from } => {
            entry.events.gaps.fetch_add(1, Ordering::Relaxed);
            let filled = match replay {
                Some(r) => fill_gap(ix, entry, r, t, from, b.seq).await,
                None => false,
            };
            if filled {
                entry.events.replayed.fetch_add(1, Ordering::Relaxed);
            } else {
                lose(entry, t);
                entry.events.degraded.store(true, Ordering::Relaxed);
                tracing::warn!(worker = %entry.name, missing_from = from, missing_to = b.seq, "KV events lost; the worker's index is unknown until it is rebuilt");
            }
        }
    }
    apply(ix, entry, b);
    t.next = Some(b.seq.wrapping_add(1));
    t.applied(b);
    entry
        .events
        .next_seq
        .store(b.seq.wrapping_add(1), Ordering::Relaxed);
    entry.set_cache_state(state_of(t));
}

/// A live batch numbered below the one expected: a repeat or a late delivery is dropped
/// (counted), a new engine incarnation drops the index (after the replay service, when
/// there is one, confirms it and rebuilds). True when `b` is still to be applied (then
/// `t.next` is what to expect now).
async fn went_back(
    ix: &Arc<IndexSink>,
    entry: &WorkerEntry,
    replay: Option<&dyn Replay>,
    t: &mut Tracker,
    b: &EventBatch,
) -> bool {
    let next = t.next.unwrap_or(0);
    match judge_back(&t.recent, Mark::of(b), next) {
        Back::Duplicate => {
            tracing::debug!(worker = %entry.name, seq = b.seq, "KV event batch delivered again: dropped");
            count(ix, &entry.name, "batch", "duplicate");
            return false;
        }
        Back::Stale => {
            tracing::warn!(worker = %entry.name, seq = b.seq, expected = next, "KV event batch arrived after later ones: dropped");
            count(ix, &entry.name, "batch", "stale");
            return false;
        }
        Back::Restart => {}
    }
    // The replay service knows whether the engine is the one applied: same (the batch is a
    // stray; continue) or restarted (rebuild from its replay, which holds `b` too when it is
    // the new incarnation's).
    match resync(ix, entry, replay, t, "event sequence went back").await {
        Synced::Same => {
            count(ix, &entry.name, "batch", "stale");
            return t.next.is_some_and(|n| b.seq >= n);
        }
        Synced::Rebuilt => return t.next.is_some_and(|n| b.seq >= n),
        // The numbers decide.
        Synced::NoAnswer => {}
    }
    entry.events.restarts.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(worker = %entry.name, seq = b.seq, expected = next, "event sequence went back: engine restarted, dropping its index entries");
    clear(ix, entry);
    t.forget();
    t.lost = false;
    t.next = None;
    true
}

/// What a re-synchronisation found.
#[derive(Debug, PartialEq, Eq)]
enum Synced {
    /// The engine applied last, caught up.
    Same,
    /// The index rebuilt from the replay (a restarted engine, or nothing applied before).
    Rebuilt,
    /// No replay service, or it did not answer: nothing changed.
    NoAnswer,
}

/// Re-synchronises with the replay service: continues the same engine's stream, or
/// rebuilds the index after a restart. Without a replay service there is nothing to ask:
/// the live sequence numbers decide.
async fn resync(
    ix: &Arc<IndexSink>,
    entry: &WorkerEntry,
    replay: Option<&dyn Replay>,
    t: &mut Tracker,
    why: &str,
) -> Synced {
    let Some(replay) = replay else {
        entry.set_cache_state(state_of(t));
        return Synced::NoAnswer;
    };
    entry.set_cache_state(CacheState::CatchingUp);
    if let Some(last) = t.last {
        let Some(answer) = fetch(ix, &entry.name, replay, last.seq).await else {
            entry.set_cache_state(CacheState::Unknown);
            return Synced::NoAnswer;
        };
        if let Verdict::Same { from } = verdict(last, &answer) {
            let mut expect = last.seq.wrapping_add(1);
            for b in &answer[from..] {
                if b.seq != expect {
                    lose(entry, t);
                    break;
                }
                apply(ix, entry, b);
                t.applied(b);
                expect = expect.wrapping_add(1);
            }
            finish_sync(entry, t, expect);
            tracing::info!(worker = %entry.name, reason = why, next = expect, "KV events: same engine, caught up");
            return Synced::Same;
        }
    }
    let Some(answer) = fetch(ix, &entry.name, replay, 0).await else {
        entry.set_cache_state(CacheState::Unknown);
        return Synced::NoAnswer;
    };
    if t.last.is_some() {
        entry.events.restarts.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(worker = %entry.name, reason = why, "the engine's event stream is not the one applied: it restarted; rebuilding its index from the replay");
        clear(ix, entry);
    }
    let (run, complete) = complete_from_start(&answer);
    t.lost = false;
    if !complete || run < answer.len() {
        lose(entry, t);
    }
    t.forget();
    for b in &answer[..run] {
        apply(ix, entry, b);
        t.applied(b);
    }
    let next = answer[..run].last().map_or(0, |b| b.seq.wrapping_add(1));
    finish_sync(entry, t, next);
    if t.lost {
        entry.events.degraded.store(true, Ordering::Relaxed);
    } else {
        entry.events.degraded.store(false, Ordering::Relaxed);
    }
    tracing::info!(worker = %entry.name, reason = why, batches = run, next, complete = !t.lost, "KV events: index built from the replay service");
    Synced::Rebuilt
}

/// Rebuilds the worker's index from everything the replay service holds, when that is the
/// whole history of the engine's current incarnation (from batch 0, unbroken). Otherwise the
/// index is kept: a partial rebuild would drop blocks the engine still holds and leave the
/// state `unknown` for good, which is worse than the errors that asked for it.
async fn repair(
    ix: &Arc<IndexSink>,
    entry: &WorkerEntry,
    replay: Option<&dyn Replay>,
    t: &mut Tracker,
) {
    let Some(r) = replay else {
        tracing::warn!(worker = %entry.name, "predictions degraded, but without a replay service the index cannot be rebuilt: keeping it");
        return;
    };
    let Some(answer) = fetch(ix, &entry.name, r, 0).await else {
        tracing::warn!(worker = %entry.name, "predictions degraded, but the replay service did not answer: keeping the index");
        return;
    };
    let (run, complete) = complete_from_start(&answer);
    if !complete || run < answer.len() {
        let first = answer.first().map(|b| b.seq);
        tracing::warn!(worker = %entry.name, ?first, batches = answer.len(), "predictions degraded, but the replay no longer holds the engine's whole history: keeping the index");
        return;
    }
    clear(ix, entry);
    t.lost = false;
    t.forget();
    for b in &answer {
        apply(ix, entry, b);
        t.applied(b);
    }
    let next = answer.last().map_or(0, |b| b.seq.wrapping_add(1));
    finish_sync(entry, t, next);
    tracing::info!(worker = %entry.name, batches = answer.len(), next, "KV events: index rebuilt from the replay service after degraded predictions");
}

fn finish_sync(entry: &WorkerEntry, t: &mut Tracker, next: u64) {
    t.next = Some(next);
    t.skip_below = Some(next);
    entry.events.next_seq.store(next, Ordering::Relaxed);
    entry.set_cache_state(state_of(t));
}

/// Drops the worker's index entries (its engine lost its cache).
fn clear(ix: &IndexSink, entry: &WorkerEntry) {
    entry.events.degraded.store(false, Ordering::Relaxed);
    ix.table.update(|r| r.clear_worker(entry.id));
    entry.events.set_last_mark(None);
}

/// Batches from `from` on, from the replay service within the configured time; None (and a
/// warning) when it fails or takes too long.
async fn fetch(
    ix: &IndexSink,
    name: &str,
    replay: &dyn Replay,
    from: u64,
) -> Option<Vec<Arc<EventBatch>>> {
    let timeout = ix.replay_timeout;
    match tokio::time::timeout(timeout, replay.replay_from(from)).await {
        Ok(Ok(b)) => Some(b),
        Ok(Err(e)) => {
            tracing::warn!(worker = %name, from, error = %e, "replay failed");
            None
        }
        Err(_) => {
            tracing::warn!(worker = %name, from, "replay timed out");
            None
        }
    }
}

/// Asks for batches `from..upto` and applies them; true when all came back.
async fn fill_gap(
    ix: &Arc<IndexSink>,
    entry: &WorkerEntry,
    replay: &dyn Replay,
    t: &mut Tracker,
    from: u64,
    upto: u64,
) -> bool {
    let Some(got) = fetch(ix, &entry.name, replay, from).await else {
        return false;
    };
    let mut expect = from;
    for b in got.iter().filter(|b| b.seq >= from && b.seq < upto) {
        if b.seq != expect {
            break;
        }
        apply(ix, entry, b);
        t.applied(b);
        expect += 1;
    }
    expect == upto
}

fn event_type(e: &Event) -> &'static str {
    match e {
        Event::Stored { .. } => "stored",
        Event::Removed { .. } => "removed",
        Event::Cleared => "cleared",
        Event::Unknown(_) => "unknown",
    }
}

fn count(ix: &IndexSink, worker: &str, kind: &str, result: &str) {
    ix.metrics
        .kv_events
        .with_label_values(&[worker, kind, result])
        .inc();
}

/// Applies a batch's events to the index and counts them. A worker that is unavailable for
/// now keeps receiving its events: its index stays true for when it is back.
fn apply(ix: &IndexSink, entry: &WorkerEntry, batch: &EventBatch) {
    entry.events.batches.fetch_add(1, Ordering::Relaxed);
    let name = entry.name.as_str();
    let rank = i64::from(entry.spec.dp_rank.unwrap_or(0));
    if let Some(got) = batch.dp_rank.filter(|&r| r != rank) {
        // Another rank's cache: taken in, it would predict hits this rank does not have.
        entry.events.degraded.store(true, Ordering::Relaxed);
        tracing::error!(worker = %name, expected = rank, got, seq = batch.seq, "KV event batch of another data-parallel rank refused: check the worker's dp_size and event ports");
        for e in &batch.events {
            count(ix, name, event_type(e), "wrong_rank");
        }
        return;
    }
    // Which events count and their core form, outside the router's lock.
    let mut results: Vec<(&'static str, &'static str)> = batch
        .events
        .iter()
        .map(|e| (event_type(e), "applied"))
        .collect();
    let mut device: Vec<kvroute_core::KvEvent> = Vec::with_capacity(batch.events.len());
    let mut device_at: Vec<usize> = Vec::with_capacity(batch.events.len());
    let mut offloaded: Vec<(usize, kvroute_core::Tier, kvroute_core::KvEvent)> = Vec::new();
    entry.events.with_groups(|groups| {
        for (i, e) in batch.events.iter().enumerate() {
            if let Err(ignored) = groups.judge(e) {
                results[i].1 = ignored;
                continue;
            }
            match e.to_kv_event() {
                None => results[i].1 = "unknown",
                Some(kv) if e.tier() == kvroute_core::Tier::Device => {
                    device.push(kv);
                    device_at.push(i);
                }
                Some(kv) => offloaded.push((i, e.tier(), kv)),
            }
        }
    });
    let mut judged = |i: usize, r: Result<(), IndexError>| {
        results[i].1 = match r {
            Ok(()) => "applied",
            Err(IndexError::BlockSizeMismatch { expected, got, .. }) => {
                entry.events.degraded.store(true, Ordering::Relaxed);
                tracing::error!(worker = %name, expected, got, "KV event block size differs from the router's: events refused");
                "block_size_mismatch"
            }
            Err(err) => {
                tracing::debug!(worker = %name, error = %err, "KV event refused");
                "refused"
            }
        };
    };
    ix.table.update(|router| {
        // Under the router's lock: a snapshot taken under it pairs the index with its batch.
        entry.events.set_last_mark(Some(Mark::of(batch)));
        if offloaded.is_empty() {
            // The device's events in one pass (the index reads ahead across removals).
            router.apply_events_with(entry.id, &device, |k, r| judged(device_at[k], r));
        } else {
            // Device and offloaded tiers interleaved: in the engine's order, one by one.
            let mut all: Vec<(usize, kvroute_core::Tier, &kvroute_core::KvEvent)> = device_at
                .iter()
                .zip(&device)
                .map(|(i, kv)| (*i, kvroute_core::Tier::Device, kv))
                .chain(offloaded.iter().map(|(i, t, kv)| (*i, *t, kv)))
                .collect();
            all.sort_by_key(|(i, ..)| *i);
            for (i, tier, kv) in all {
                judged(i, router.apply_tier_event(entry.id, tier, kv));
            }
        }
    });
    tracing::debug!(worker = %name, seq = batch.seq, events = batch.events.len(), ?results, "KV event batch applied");
    for (kind, result) in results {
        count(ix, name, kind, result);
    }
}

#[cfg(test)]
mod tests;
