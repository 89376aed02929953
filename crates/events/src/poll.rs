//! TensorRT-LLM's HTTP pull API as event feeds: `POST /kv_cache_events` every
//! `event_poll_secs`, the JSON answer (bounded) decoded and turned into batches by
//! [`Puller`] (per-rank `event_id` gaps and restarts, the largest attention window, partial
//! blocks dropped). The pull API drains: each event comes once, so there is no replay; a gap
//! (the engine's bounded buffer dropped events) becomes [`FeedItem::Lost`], a restart
//! [`FeedItem::Restarted`]. Batches are numbered here, consecutively, one per answer with
//! events. An engine that cannot be reached is [`FeedItem::Disconnected`] until it answers
//! again ([`FeedItem::Connected`]). An engine with attention-DP ranks tracked apart gets one
//! feed per rank, each with its own puller.

use super::{EventFeed, FeedItem};
use kvroute_protocol::kv_events::trtllm_http::{decode, PulledEvent, Puller};
use kvroute_protocol::kv_events::EventBatch;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// One engine's pull API.
#[derive(Clone, Debug)]
pub struct PollSubscription {
    /// The worker's name, for logs.
    pub worker: String,
    /// The pull API's URL (`http://host:port/kv_cache_events`).
    pub url: String,
    /// The worker's key (`Authorization: Bearer`), when it has one.
    pub api_key: Option<String>,
    /// Seconds between calls.
    pub interval_secs: f64,
    /// The longest a call may take, in seconds (older TensorRT-LLM holds a call open until
    /// 2 s pass without an event).
    pub timeout_secs: f64,
    /// Largest answer read, in bytes.
    pub max_bytes: usize,
    /// The KV block size (partial blocks are dropped).
    pub block_size: u64,
    /// The engine's attention-DP ranks tracked apart: 1 merges every rank into one feed;
    /// N gives one feed per rank, and events of a rank >= N are refused.
    pub ranks: u32,
}

/// The feeds of an engine's pull API (one per rank, see [`PollSubscription::ranks`]), polled
/// by a task that ends when every feed is dropped.
pub fn poll_feeds(client: reqwest::Client, sub: PollSubscription) -> Vec<EventFeed> {
    let mut feeds = Vec::new();
    let mut outs = Vec::new();
    for _ in 0..sub.ranks.max(1) {
        let (tx, items) = mpsc::channel(64);
        feeds.push(EventFeed {
            items,
            replay: None,
        });
        outs.push(Out {
            tx,
            puller: Puller::new(sub.block_size),
            seq: 0,
            items: Vec::new(),
        });
    }
    tokio::spawn(poll_loop(client, sub, outs));
    feeds
}

/// One rank's feed: its own puller (`event_id`s are per rank) and batch numbers.
struct Out {
    tx: mpsc::Sender<FeedItem>,
    puller: Puller,
    seq: u64,
    items: Vec<FeedItem>,
}

impl Out {
    fn accept(&mut self, events: Vec<PulledEvent>, rank: Option<i64>) {
        let pulled = self.puller.accept(events);
        if pulled.restarted {
            self.items.push(FeedItem::Restarted);
        }
        if let Some((expected, got)) = pulled.gap {
            self.items.push(FeedItem::Lost {
                reason: format!(
                    "event_id jumped from {expected} to {got}: the engine's event buffer overflowed"
                ),
            });
        }
        if !pulled.events.is_empty() {
            self.items.push(FeedItem::Batch(Arc::new(EventBatch {
                seq: self.seq,
                ts: 0.0,
                events: pulled.events,
                dp_rank: rank,
            })));
            self.seq += 1;
        }
    }
}

async fn poll_loop(client: reqwest::Client, sub: PollSubscription, mut outs: Vec<Out>) {
    let mut connected = false;
    let interval = Duration::from_secs_f64(sub.interval_secs);
    loop {
        match fetch(&client, &sub).await {
            Err(error) => {
                if connected {
                    tracing::warn!(worker = %sub.worker, %error, "KV event pull API unreachable");
                    outs.iter_mut()
                        .for_each(|o| o.items.push(FeedItem::Disconnected));
                    connected = false;
                }
            }
            Ok(body) => {
                if !connected {
                    outs.iter_mut()
                        .for_each(|o| o.items.push(FeedItem::Connected));
                    connected = true;
                }
                match decode(&body) {
                    Err(e) => outs[0].items.push(FeedItem::Undecodable(e.to_string())),
                    Ok(events) if events.is_empty() => {}
                    Ok(events) if outs.len() == 1 => outs[0].accept(events, None),
                    Ok(events) => split(&mut outs, events),
                }
            }
        }
        let mut open = 0;
        for out in &mut outs {
            if out.tx.is_closed() {
                out.items.clear();
                continue;
            }
            open += 1;
            for item in out.items.drain(..) {
                let _ = out.tx.send(item).await;
            }
        }
        if open == 0 {
            return;
        }
        tokio::time::sleep(interval).await;
    }
}

/// Hands each rank its events, in order; a rank beyond the feeds is refused on rank 0's.
fn split(outs: &mut [Out], events: Vec<PulledEvent>) {
    let mut per_rank: Vec<Vec<PulledEvent>> = outs.iter().map(|_| Vec::new()).collect();
    let mut stray = std::collections::BTreeSet::new();
    for e in events {
        match usize::try_from(e.rank).ok().filter(|&r| r < outs.len()) {
            Some(r) => per_rank[r].push(e),
            None => {
                stray.insert(e.rank);
            }
        }
    }
    if !stray.is_empty() {
        outs[0].items.push(FeedItem::Undecodable(format!(
            "events of attention-DP ranks {stray:?}, beyond the worker's dp_size {}",
            outs.len()
        )));
    }
    for (r, events) in per_rank.into_iter().enumerate() {
        if !events.is_empty() {
            outs[r].accept(events, Some(r as i64));
        }
    }
}

/// One call: the answer's body, read up to `max_bytes`.
async fn fetch(client: &reqwest::Client, sub: &PollSubscription) -> Result<Vec<u8>, String> {
    let mut resp = kvroute_fleet::upstream::with_key(client.post(&sub.url), sub.api_key.as_deref())
        .timeout(Duration::from_secs_f64(sub.timeout_secs))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("answered {}", resp.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > sub.max_bytes {
            return Err(format!("answer larger than {} bytes", sub.max_bytes));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
