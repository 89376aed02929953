//! Load agreement between gateway replicas: each replica publishes its bookings (dispatch,
//! first token, finish) on `PREFIX.load`, batched without waiting (an operation leaves at
//! once when nothing is being sent; those that come meanwhile share the next message), and
//! counts every peer's in its router's ledger
//! ([`kvroute_core::Router::peer_dispatch`] and the rest), ignoring its own echoes. Every
//! `load_heartbeat_secs` it lists its requests in flight (which also says it is alive): a
//! peer releases what a lost finish left booked, and expires a replica silent for
//! `peer_ttl_secs` with all its bookings.

use super::{unix_ns, PlaneConfig};
use crate::connection::Connection;
use backon::Retryable;
use futures_util::StreamExt;
use kvroute_core::{PeerBooking, SequenceHash, WorkerId};
use kvroute_fleet::backoff;
use kvroute_fleet::bookings::Bookings;
use kvroute_fleet::sink::IndexSink;
use kvroute_fleet::tasks::Tasks;
use kvroute_protocol::plane::{LoadMessage, LoadOp, VERSION};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Operations buffered before the publisher; past it they are dropped (counted): the next
/// listing of requests in flight repairs lost finishes.
const SHARE_BUFFER: usize = 65_536;

/// Most operations in one message.
const MAX_OPS: usize = 4096;

/// A listing longer than this is not sent (its message would pass NATS's size limit).
const MAX_LISTED: usize = 100_000;

/// Where a replica's bookings go.
pub struct LoadShare {
    tx: mpsc::Sender<LoadOp>,
    dropped: AtomicU64,
}

impl LoadShare {
    /// Queues `op` for the next message (dropped, counted, when the buffer is full).
    pub fn share(&self, op: LoadOp) {
        if self.tx.try_send(op).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Operations dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl kvroute_fleet::bookings::ShareBookings for LoadShare {
    fn share(&self, op: LoadOp) {
        LoadShare::share(self, op);
    }
}

/// Starts sharing `bookings` with the other replicas as `replica` and counting theirs into the
/// routing table (through `ix`); the tasks run in `tasks`.
pub fn start(
    tasks: &Tasks,
    ix: &Arc<IndexSink>,
    bookings: &Bookings,
    conn: &Connection,
    plane: &PlaneConfig,
    replica: u64,
) {
    let (tx, rx) = mpsc::channel(SHARE_BUFFER);
    let share = Arc::new(LoadShare {
        tx,
        dropped: AtomicU64::new(0),
    });
    if !bookings.share_with(share.clone()) {
        return;
    }
    let subject = plane.load_subject();
    let heartbeat = Duration::from_secs_f64(plane.load_heartbeat_secs);
    tasks.spawn(publish(
        conn.client.clone(),
        subject.clone(),
        replica,
        rx,
        heartbeat,
    ));
    tasks.spawn(receive(ix.clone(), conn.client.clone(), subject, replica));
    tasks.spawn(expire(ix.clone(), plane.peer_ttl_secs, share));
}

async fn publish(
    client: async_nats::Client,
    subject: String,
    replica: u64,
    mut rx: mpsc::Receiver<LoadOp>,
    heartbeat: Duration,
) {
    let mut n = 0u64;
    let mut inflight: HashSet<u64> = HashSet::new();
    let mut tick = tokio::time::interval(heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (ops, listing) = tokio::select! {
            op = rx.recv() => {
                let Some(op) = op else { return };
                // What waits now goes in this message; what comes while it is sent goes in the
                // next: a lone operation leaves at once, and under load messages fill up.
                let mut ops = vec![op];
                while ops.len() < MAX_OPS {
                    match rx.try_recv() {
                        Ok(op) => ops.push(op),
                        Err(_) => break,
                    }
                }
                for op in &ops {
                    match op {
                        LoadOp::Dispatch { req, .. } => {
                            inflight.insert(*req);
                        }
                        LoadOp::Finish { req, .. } => {
                            inflight.remove(req);
                        }
                        LoadOp::FirstToken { .. } => {}
                    }
                }
                (ops, None)
            }
            _ = tick.tick() => {
                let listing = (inflight.len() <= MAX_LISTED).then(|| inflight.iter().copied().collect());
                (Vec::new(), listing)
            }
        };
        let m = LoadMessage {
            v: VERSION,
            replica,
            n,
            ops,
            inflight: listing,
            sent_ns: unix_ns(),
        };
        n += 1;
        if let Err(e) = client.publish(subject.clone(), m.encode().into()).await {
            tracing::debug!(error = %e, "load message not sent");
        }
    }
}

async fn receive(ix: Arc<IndexSink>, client: async_nats::Client, subject: String, replica: u64) {
    let subscribed = (|| client.subscribe(subject.clone()))
        .retry(backoff::reconnect())
        .notify(|e, _| {
            tracing::warn!(%subject, error = %e, "cannot subscribe to the replicas' load; trying again");
        })
        .await;
    // The policy never gives up: subscribed.
    let Ok(mut sub) = subscribed else {
        return;
    };
    // Worker names to ids, made again whenever the fleet changed.
    let mut names: HashMap<String, WorkerId> = HashMap::new();
    let mut names_of = u64::MAX;
    let mut last: HashMap<u64, u64> = HashMap::new();
    let count = |result: &str, n: u64| {
        ix.metrics
            .peer_messages
            .with_label_values(&[result])
            .inc_by(n)
    };
    while let Some(msg) = sub.next().await {
        let m = match LoadMessage::decode(&msg.payload) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "undecodable load message");
                count("undecodable", 1);
                continue;
            }
        };
        if m.replica == replica {
            continue;
        }
        if m.sent_ns > 0 {
            let late = unix_ns().saturating_sub(m.sent_ns);
            ix.metrics.peer_load_delay.observe(late as f64 / 1e9);
        }
        if last.len() > kvroute_core::router::MAX_PEERS * 2 {
            last.clear();
        }
        if let Some(prev) = last.insert(m.replica, m.n) {
            if m.n != prev.wrapping_add(1) {
                count("gap", 1);
            }
        }
        if names_of != ix.registry.generation() {
            names_of = ix.registry.generation();
            names = ix
                .registry
                .all()
                .iter()
                .map(|w| (w.name.clone(), w.id))
                .collect();
        }
        let (mut applied, mut unknown, mut refused) = (0, 0, 0);
        let now = ix.clock.now();
        let released = ix.table.update(|r| {
            let _ = r.peer_seen(m.replica, now);
            for op in &m.ops {
                let ok = match op {
                    LoadOp::Dispatch {
                        req,
                        worker,
                        prompt_tokens,
                        cached_tokens,
                        blocks,
                    } => {
                        let Some(&id) = names.get(worker) else {
                            unknown += 1;
                            continue;
                        };
                        let blocks: Vec<SequenceHash> =
                            blocks.iter().map(|&b| SequenceHash(b)).collect();
                        r.peer_dispatch(
                            m.replica,
                            &PeerBooking {
                                request: *req,
                                worker: id,
                                prompt_tokens: *prompt_tokens as usize,
                                cached_tokens: *cached_tokens as usize,
                                blocks: &blocks,
                            },
                            now,
                        )
                        .is_ok()
                    }
                    LoadOp::FirstToken { req } => r.peer_first_token(m.replica, *req, now).is_ok(),
                    LoadOp::Finish { req, output_tokens } => {
                        r.peer_finish(m.replica, *req, *output_tokens, now).is_ok()
                    }
                };
                if ok {
                    applied += 1;
                } else {
                    refused += 1;
                }
            }
            let listed = m
                .inflight
                .as_ref()
                .map_or(0, |l| r.peer_inflight(m.replica, l, now));
            listed > 0 || m.ops.iter().any(|o| !matches!(o, LoadOp::Dispatch { .. }))
        });
        count("applied", applied);
        if unknown > 0 {
            count("unknown_worker", unknown);
        }
        if refused > 0 {
            count("refused", refused);
        }
        if released {
            ix.table.released();
        }
    }
}

async fn expire(ix: Arc<IndexSink>, ttl_secs: f64, share: Arc<LoadShare>) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(ttl_secs / 4.0));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = ix.clock.now();
        let gone = ix.table.update(|r| r.expire_peers(now, ttl_secs));
        if gone > 0 {
            tracing::warn!(
                replicas = gone,
                ttl_secs,
                "gateway replicas went silent: their bookings are released"
            );
            ix.table.released();
        }
        let dropped = ix.metrics.peer_messages.with_label_values(&["dropped"]);
        dropped.inc_by(share.dropped().saturating_sub(dropped.get()));
    }
}
