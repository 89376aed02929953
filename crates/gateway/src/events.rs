//! KV event ingestion: one task per worker reads its event batches (from ZMQ or, in the
//! one-process demo, from an in-process channel), checks their sequence numbers and applies
//! them to the router's index.
//!
//! Sequence numbers are consecutive per engine incarnation. A gap means batches were lost:
//! the task asks the engine's replay service for them and applies what comes back; when the
//! replay cannot fill the gap the worker is marked degraded (its index entries may be stale
//! until its cache turns over). A number going backwards means the engine restarted: the
//! worker's entries are dropped before the new batch applies.

mod zmq;

pub use self::zmq::{zmq_feed, ZmqReplay};

use crate::state::Gateway;
use kvroute_core::{IndexError, KvEvent, Namespace, WorkerId};
use kvroute_protocol::vllm_events::{Event, EventBatch};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Fetches batches from a sequence number on, from an engine's replay service.
pub trait Replay: Send + Sync {
    /// Batches with `seq >= from`, in order, as far as the engine still holds them.
    fn replay_from(
        &self,
        from: u64,
    ) -> futures_util::future::BoxFuture<'_, Result<Vec<Arc<EventBatch>>, String>>;
}

/// Where a worker's event batches come from.
pub struct EventFeed {
    /// Batches, in arrival order.
    pub batches: mpsc::Receiver<Arc<EventBatch>>,
    /// The replay service, when there is one.
    pub replay: Option<Box<dyn Replay>>,
}

impl EventFeed {
    /// A feed of an in-process publisher's broadcast channel (the one-process demo). A
    /// receiver that lags loses batches; the sequence check then asks `replay`.
    pub fn from_broadcast(
        mut rx: tokio::sync::broadcast::Receiver<Arc<EventBatch>>,
        replay: Option<Box<dyn Replay>>,
    ) -> Self {
        let (tx, batches) = mpsc::channel(1024);
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                match rx.recv().await {
                    Ok(b) => {
                        if tx.send(b).await.is_err() {
                            return;
                        }
                    }
                    Err(RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "in-process KV event feed lagged");
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        });
        Self { batches, replay }
    }
}

/// What one batch did.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Apply,
    Gap { from: u64 },
    Restart,
}

/// Decides what a batch with sequence `seq` means when `next` was expected (None: nothing
/// seen yet).
fn classify(next: Option<u64>, seq: u64) -> Step {
    match next {
        None => Step::Apply,
        Some(n) if seq == n => Step::Apply,
        Some(n) if seq > n => Step::Gap { from: n },
        // A PUB stream never repeats a batch: going back is a new engine incarnation.
        Some(_) => Step::Restart,
    }
}

/// Runs a worker's ingestion until its feed ends.
pub async fn ingest(gw: Arc<Gateway>, worker: WorkerId, mut feed: EventFeed) {
    let Some(entry) = gw.registry.get(worker) else {
        return;
    };
    let name = entry.name.clone();
    // Joining late: what the engine published before the subscription took hold is in its
    // replay buffer. Batches the live feed delivers again below `caught_up` are skipped.
    let mut next: Option<u64> = match &feed.replay {
        Some(r) => catch_up(&gw, worker, &name, r.as_ref()).await,
        None => None,
    };
    if let Some(n) = next {
        entry.events.next_seq.store(n, Ordering::Relaxed);
    }
    let mut caught_up = next;
    while let Some(batch) = feed.batches.recv().await {
        if let Some(c) = caught_up {
            if batch.seq < c {
                continue;
            }
            caught_up = None;
        }
        match classify(next, batch.seq) {
            Step::Apply => {}
            Step::Restart => {
                entry.events.restarts.fetch_add(1, Ordering::Relaxed);
                entry.events.degraded.store(false, Ordering::Relaxed);
                tracing::warn!(worker = %name, seq = batch.seq, expected = ?next, "event sequence went back: engine restarted, dropping its index entries");
                if entry.is_up() {
                    let _ = gw.router().apply_event(worker, &KvEvent::Cleared);
                }
            }
            Step::Gap { from } => {
                entry.events.gaps.fetch_add(1, Ordering::Relaxed);
                let filled = match &feed.replay {
                    Some(r) => fill_gap(&gw, worker, &name, r.as_ref(), from, batch.seq).await,
                    None => false,
                };
                if filled {
                    entry.events.replayed.fetch_add(1, Ordering::Relaxed);
                } else {
                    entry.events.degraded.store(true, Ordering::Relaxed);
                    tracing::warn!(worker = %name, missing_from = from, missing_to = batch.seq, "KV events lost; worker marked degraded");
                }
            }
        }
        apply(&gw, worker, &name, &batch);
        next = Some(batch.seq.wrapping_add(1));
        entry
            .events
            .next_seq
            .store(batch.seq.wrapping_add(1), Ordering::Relaxed);
    }
    tracing::info!(worker = %name, "KV event feed ended");
}

/// Batches from `from` on, from the replay service within the configured time; None (and a
/// warning) when it fails or takes too long.
async fn fetch(
    gw: &Gateway,
    name: &str,
    replay: &dyn Replay,
    from: u64,
) -> Option<Vec<Arc<EventBatch>>> {
    let timeout = std::time::Duration::from_secs_f64(gw.config.upstream.replay_timeout_secs);
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

/// Applies the consecutive batches the replay service holds from the start of the stream;
/// returns the sequence number expected next (None when it held nothing or did not answer).
async fn catch_up(
    gw: &Arc<Gateway>,
    worker: WorkerId,
    name: &str,
    replay: &dyn Replay,
) -> Option<u64> {
    let got = fetch(gw, name, replay, 0).await?;
    let mut next: Option<u64> = None;
    for b in got.iter() {
        if next.is_some_and(|n| b.seq != n) {
            break;
        }
        apply(gw, worker, name, b);
        next = Some(b.seq.wrapping_add(1));
    }
    if let Some(n) = next {
        tracing::info!(worker = %name, next = n, "caught up on KV events from the replay service");
    }
    next
}

/// Asks for batches `from..upto` and applies them; true when all came back.
async fn fill_gap(
    gw: &Arc<Gateway>,
    worker: WorkerId,
    name: &str,
    replay: &dyn Replay,
    from: u64,
    upto: u64,
) -> bool {
    let Some(got) = fetch(gw, name, replay, from).await else {
        return false;
    };
    let mut expect = from;
    for b in got.iter().filter(|b| b.seq >= from && b.seq < upto) {
        if b.seq != expect {
            break;
        }
        apply(gw, worker, name, b);
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

/// Applies a batch's events to the index and counts them.
fn apply(gw: &Gateway, worker: WorkerId, name: &str, batch: &EventBatch) {
    let Some(entry) = gw.registry.get(worker) else {
        return;
    };
    entry.events.batches.fetch_add(1, Ordering::Relaxed);
    let up = entry.is_up();
    let mut results: Vec<(&'static str, &'static str)> = Vec::with_capacity(batch.events.len());
    {
        let mut router = gw.router();
        for e in &batch.events {
            let result = if !e.is_device() {
                "ignored"
            } else if !up {
                "worker_down"
            } else {
                match e.to_kv_event(Namespace::default()) {
                    None => "unknown",
                    Some(kv) => match router.apply_event(worker, &kv) {
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
                    },
                }
            };
            results.push((event_type(e), result));
        }
    }
    for (kind, result) in results {
        gw.metrics
            .kv_events
            .with_label_values(&[name, kind, result])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_are_classified() {
        assert_eq!(classify(None, 17), Step::Apply);
        assert_eq!(classify(Some(5), 5), Step::Apply);
        assert_eq!(classify(Some(5), 9), Step::Gap { from: 5 });
        assert_eq!(classify(Some(5), 4), Step::Restart);
        assert_eq!(classify(Some(100), 0), Step::Restart);
        assert_eq!(classify(Some(100), 3), Step::Restart);
        assert_eq!(classify(Some(5), 0), Step::Restart);
    }
}
