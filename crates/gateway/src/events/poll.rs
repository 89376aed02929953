//! TensorRT-LLM's HTTP pull API as an event feed: `POST /kv_cache_events` every
//! `event_poll_secs`, the JSON answer (bounded) decoded and turned into batches by
//! [`Puller`] (per-rank `event_id` gaps and restarts, the largest attention window, partial
//! blocks dropped). The pull API drains: each event comes once, so there is no replay; a gap
//! (the engine's bounded buffer dropped events) becomes [`FeedItem::Lost`], a restart
//! [`FeedItem::Restarted`]. Batches are numbered here, consecutively, one per answer with
//! events. An engine that cannot be reached is [`FeedItem::Disconnected`] until it answers
//! again ([`FeedItem::Connected`]).

use super::{EventFeed, FeedItem};
use kvroute_protocol::kv_events::trtllm_http::{decode, Puller};
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
    /// Seconds between calls.
    pub interval_secs: f64,
    /// The longest a call may take, in seconds (older TensorRT-LLM holds a call open until
    /// 2 s pass without an event).
    pub timeout_secs: f64,
    /// Largest answer read, in bytes.
    pub max_bytes: usize,
    /// The KV block size (partial blocks are dropped).
    pub block_size: u64,
}

/// A feed of an engine's pull API, polled by a task that ends when the feed is dropped.
pub fn poll_feed(client: reqwest::Client, sub: PollSubscription) -> EventFeed {
    let (tx, items) = mpsc::channel(64);
    tokio::spawn(poll_loop(client, sub, tx));
    EventFeed {
        items,
        replay: None,
    }
}

async fn poll_loop(client: reqwest::Client, sub: PollSubscription, tx: mpsc::Sender<FeedItem>) {
    let mut puller = Puller::new(sub.block_size);
    let mut connected = false;
    let mut seq = 0u64;
    let interval = Duration::from_secs_f64(sub.interval_secs);
    loop {
        let answer = fetch(&client, &sub).await;
        let mut out = Vec::new();
        match answer {
            Err(error) => {
                if connected {
                    tracing::warn!(worker = %sub.worker, %error, "KV event pull API unreachable");
                    out.push(FeedItem::Disconnected);
                    connected = false;
                }
            }
            Ok(body) => {
                if !connected {
                    out.push(FeedItem::Connected);
                    connected = true;
                }
                match decode(&body) {
                    Err(e) => out.push(FeedItem::Undecodable(e.to_string())),
                    Ok(events) if events.is_empty() => {}
                    Ok(events) => {
                        let pulled = puller.accept(events);
                        if pulled.restarted {
                            out.push(FeedItem::Restarted);
                        }
                        if let Some((expected, got)) = pulled.gap {
                            out.push(FeedItem::Lost {
                                reason: format!(
                                    "event_id jumped from {expected} to {got}: the engine's event buffer overflowed"
                                ),
                            });
                        }
                        if !pulled.events.is_empty() {
                            out.push(FeedItem::Batch(Arc::new(EventBatch {
                                seq,
                                ts: 0.0,
                                events: pulled.events,
                                dp_rank: None,
                            })));
                            seq += 1;
                        }
                    }
                }
            }
        }
        for item in out {
            if tx.send(item).await.is_err() {
                return;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = tx.closed() => return,
        }
    }
}

/// One call: the answer's body, read up to `max_bytes`.
async fn fetch(client: &reqwest::Client, sub: &PollSubscription) -> Result<Vec<u8>, String> {
    let mut resp = client
        .post(&sub.url)
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
