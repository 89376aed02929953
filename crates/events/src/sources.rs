//! Every kind of event source a worker may name, started for the fleet (workers joining at
//! run time, and at start-up): an in-process feed, the event plane, a TensorRT-LLM pull API
//! (one poller per engine, feeding every rank), or a ZMQ publisher with its replay service.
//! Workers tracked approximately get none.

use crate::{ingest, poll_feeds, zmq_feed, PollSubscription, ZmqSubscription};
use kvroute_core::Tracking;
use kvroute_fleet::config::GatewayConfig;
use kvroute_fleet::feed::{EventFeed, EventSources, PlaneFeeds};
use kvroute_fleet::registry::{CacheState, WorkerEntry};
use kvroute_fleet::sink::IndexSink;
use kvroute_fleet::upstream::Upstream;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What starting a worker's ingestion needs: the index sink its task writes through, calls
/// to workers (the pull API's poller) and the settings (limits, block size).
pub struct Sources {
    sink: Arc<IndexSink>,
    upstream: Arc<Upstream>,
    config: Arc<GatewayConfig>,
}

impl Sources {
    /// Sources writing through `sink`.
    pub fn new(sink: Arc<IndexSink>, upstream: Arc<Upstream>, config: Arc<GatewayConfig>) -> Self {
        Self {
            sink,
            upstream,
            config,
        }
    }
}

impl EventSources for Sources {
    fn start(
        &self,
        entries: &[Arc<WorkerEntry>],
        feeds: &mut BTreeMap<usize, EventFeed>,
        plane: Option<&dyn PlaneFeeds>,
    ) -> std::io::Result<()> {
        for (i, entry) in entries.iter().enumerate() {
            let w = &entry.spec;
            if self.sink.table.read(|r| r.tracking(entry.id)) == Some(Tracking::Approximate) {
                entry.set_cache_state(CacheState::Approximate);
                continue;
            }
            let feed = match (feeds.remove(&i), w.event_socket()) {
                (Some(f), _) => f,
                (None, None) if w.events_from_plane() => match plane {
                    Some(p) => p.feed(&entry.name),
                    None => continue,
                },
                (None, None) if w.event_poll_url().is_some() => {
                    // One poller per engine: rank 0 starts it for every rank (`dp_size`).
                    if w.dp_rank.unwrap_or(0) > 0 {
                        continue;
                    }
                    let up = &self.config.upstream;
                    let ranks = w.dp_rank.and(w.dp_size).unwrap_or(1);
                    let sub = PollSubscription {
                        worker: entry.name.clone(),
                        url: w.event_poll_url().unwrap_or_default(),
                        api_key: self.upstream.key_for(w).map(str::to_string),
                        interval_secs: up.event_poll_secs,
                        timeout_secs: up.event_poll_timeout_secs,
                        max_bytes: up.max_event_message_bytes,
                        block_size: self.config.router.block_size as u64,
                        ranks,
                    };
                    let mut rank_feeds =
                        poll_feeds(self.upstream.client().clone(), sub).into_iter();
                    let Some(first) = rank_feeds.next() else {
                        continue;
                    };
                    for (r, f) in rank_feeds.enumerate() {
                        if let Some(rank) = entries.get(i + r + 1) {
                            rank.spawn_task(ingest(self.sink.clone(), rank.id, f));
                        }
                    }
                    first
                }
                (None, Some((endpoint, bind))) => {
                    let up = &self.config.upstream;
                    zmq_feed(ZmqSubscription {
                        worker: entry.name.clone(),
                        endpoint: endpoint.to_string(),
                        bind,
                        replay: w.replay.clone(),
                        max_message_bytes: up.max_event_message_bytes,
                        heartbeat_secs: up.event_heartbeat_secs,
                        heartbeat_timeout_secs: up.event_heartbeat_timeout_secs,
                        replay_timeout_secs: up.replay_timeout_secs,
                    })?
                }
                (None, None) => continue,
            };
            entry.spawn_task(ingest(self.sink.clone(), entry.id, feed));
        }
        Ok(())
    }
}
