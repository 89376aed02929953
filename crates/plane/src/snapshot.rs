//! Snapshots of the workers' indexes in the event plane's object store, so a gateway that
//! starts has a warm index even when the engines' replay buffers no longer reach back to
//! their start: every `snapshot_secs` a gateway writes, for each worker whose events come
//! from the plane and whose cache state is `exact`, the blocks its index holds and the batch
//! applied last (taken together under the router's lock). A starting gateway loads the
//! latest one (at most `snapshot_max_age_secs` old), then asks the relay for the batches
//! after it, as after a reconnect. Several gateways writing the same worker's snapshot is
//! harmless: each writes a consistent one, and the loader catches up from whichever it reads.

use super::{unix_ns, PlaneConfig};
use crate::connection::Connection;
use async_nats::jetstream::{self, object_store};
use kvroute_core::{EngineHash, SequenceHash};
use kvroute_fleet::registry::CacheState;
use kvroute_fleet::sequence::Mark;
use kvroute_fleet::sink::IndexSink;
use kvroute_fleet::tasks::Tasks;
use kvroute_protocol::plane::{subject_token, to_bytes, Snapshot, VERSION};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// The object store bucket (created when missing).
async fn bucket(
    js: &jetstream::Context,
    plane: &PlaneConfig,
) -> Result<object_store::ObjectStore, String> {
    match js.get_object_store(&plane.snapshot_bucket).await {
        Ok(b) => Ok(b),
        Err(_) => js
            .create_object_store(object_store::Config {
                bucket: plane.snapshot_bucket.clone(),
                max_age: Duration::from_secs_f64(plane.snapshot_max_age_secs * 2.0),
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string()),
    }
}

/// Writes snapshots every `snapshot_secs` until the gateway stops (a task in `tasks`).
pub fn start(tasks: &Tasks, ix: &Arc<IndexSink>, conn: &Connection, plane: &PlaneConfig) {
    let ix = ix.clone();
    let plane = plane.clone();
    let mut js = jetstream::new(conn.client.clone());
    js.set_timeout(plane.request_timeout());
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs_f64(plane.snapshot_secs));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut written: HashMap<String, Mark> = HashMap::new();
        loop {
            tick.tick().await;
            let store = match bucket(&js, &plane).await {
                Ok(b) => b,
                Err(e) => {
                    tracing::debug!(error = %e, "snapshot bucket not reachable");
                    continue;
                }
            };
            for w in ix.registry.all() {
                if !w.spec.events_from_plane() || w.cache_state() != CacheState::Exact {
                    continue;
                }
                let taken = ix.table.read(|r| {
                    let mark = w.events.last_mark();
                    match mark {
                        Some(m) if written.get(&w.name) != Some(&m) => {
                            Some((m, r.export_worker(w.id)))
                        }
                        _ => None,
                    }
                });
                let Some((mark, pairs)) = taken else {
                    continue;
                };
                let snap = Snapshot {
                    v: VERSION,
                    worker: w.name.clone(),
                    seq: mark.seq,
                    digest: mark.digest(),
                    taken_ns: unix_ns(),
                    blocks: Snapshot::pack(pairs.iter().map(|(e, s)| (e.0, s.0))),
                };
                let bytes = to_bytes(&snap);
                match store
                    .put(subject_token(&w.name).as_str(), &mut bytes.as_slice())
                    .await
                {
                    Ok(_) => {
                        written.insert(w.name.clone(), mark);
                        tracing::debug!(worker = %w.name, blocks = pairs.len(), bytes = bytes.len(), "snapshot written");
                    }
                    Err(e) => tracing::warn!(worker = %w.name, error = %e, "snapshot not written"),
                }
            }
        }
    })
}

/// The latest snapshot of `worker`, when there is one young enough and whole.
pub async fn load(
    client: &async_nats::Client,
    plane: &PlaneConfig,
    worker: &str,
) -> Option<kvroute_fleet::feed::Snapshot> {
    let mut js = jetstream::new(client.clone());
    js.set_timeout(plane.request_timeout());
    let store = js.get_object_store(&plane.snapshot_bucket).await.ok()?;
    let mut object = store.get(subject_token(worker).as_str()).await.ok()?;
    let mut bytes = Vec::new();
    let limit = plane.max_snapshot_bytes;
    if let Err(e) = (&mut object)
        .take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .await
    {
        tracing::warn!(worker, error = %e, "snapshot not read");
        return None;
    }
    if bytes.len() > limit {
        tracing::warn!(
            worker,
            limit,
            "snapshot larger than max_snapshot_bytes: not loaded"
        );
        return None;
    }
    let snap = match Snapshot::decode(&bytes) {
        Ok(s) if s.worker == worker => s,
        Ok(s) => {
            tracing::warn!(worker, other = %s.worker, "snapshot of another worker: not loaded");
            return None;
        }
        Err(e) => {
            tracing::warn!(worker, error = %e, "snapshot does not decode: not loaded");
            return None;
        }
    };
    let age = unix_ns().saturating_sub(snap.taken_ns) as f64 / 1e9;
    if age > plane.snapshot_max_age_secs {
        tracing::info!(worker, age_secs = age, "snapshot too old: not loaded");
        return None;
    }
    let blocks = snap
        .pairs()
        .ok()?
        .map(|(e, s)| (EngineHash(e), SequenceHash(s)))
        .collect();
    Some(kvroute_fleet::feed::Snapshot {
        mark: Mark::from_parts(snap.seq, snap.digest),
        blocks,
    })
}
