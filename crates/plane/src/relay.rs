//! `kvroute relay`: one engine's KV event feed published to the event plane, and the
//! engine's replay service answered over NATS.
//!
//! Every feed item is published with a dedup id and retried until JetStream acknowledges
//! it, so nothing the relay read is lost while NATS is away (the engine's feed waits
//! meanwhile; what the engine publishes past the feed's buffer is a gap the gateways fill
//! from the replay service) and nothing is stored twice. The relay keeps no state of the
//! engine's cache: sequence checks and restarts are the gateways' ingestion's, as for a
//! direct feed.

use super::items;
use super::PlaneConfig;
use async_nats::jetstream;
use backon::Retryable;
use futures_util::StreamExt;
use kvroute_fleet::backoff;
use kvroute_fleet::feed::FeedItem;
use kvroute_fleet::feed::{EventFeed, Replay};
use kvroute_protocol::kv_events::EventFormat;
use kvroute_protocol::plane::{self as wire, Envelope, ReplayPage, ReplayRequest, VERSION};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// What a relay is doing, for its probes and metrics (`kvroute relay`'s HTTP port).
#[derive(Debug, Default)]
pub struct RelayStatus {
    engine_connected: AtomicBool,
    feed_ended: AtomicBool,
    published: AtomicU64,
    publish_retries: AtomicU64,
}

impl RelayStatus {
    /// Whether the engine's publisher is connected (its feed said so, or sent a batch).
    pub fn engine_connected(&self) -> bool {
        self.engine_connected.load(Ordering::Relaxed)
    }

    /// Whether the engine's feed has ended (the relay then stops).
    pub fn feed_ended(&self) -> bool {
        self.feed_ended.load(Ordering::Relaxed)
    }

    /// Feed items published and acknowledged.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// Publishes tried again (not acknowledged at first).
    pub fn publish_retries(&self) -> u64 {
        self.publish_retries.load(Ordering::Relaxed)
    }
}

/// What a relay publishes and how.
#[derive(Clone, Debug)]
pub struct RelayOptions {
    /// The worker's name, as the gateways configure it.
    pub worker: String,
    /// The wire form of the payloads (the engine's own: nothing is lost re-encoding it).
    pub format: EventFormat,
    /// The plane.
    pub plane: PlaneConfig,
    /// The relay's incarnation (distinct for every start: the dedup ids depend on it).
    pub incarnation: u64,
    /// What it is doing, kept up to date.
    pub status: Arc<RelayStatus>,
}

/// Publishes `feed` until it ends, answering replay requests meanwhile. Returns how many
/// items were published.
pub async fn run_relay(client: async_nats::Client, opts: RelayOptions, mut feed: EventFeed) -> u64 {
    let mut js = jetstream::new(client.clone());
    js.set_timeout(opts.plane.request_timeout());
    ensure_stream(&js, &opts.plane).await;
    let replay: Option<Arc<dyn Replay>> = feed.replay.take().map(Arc::from);
    let service = tokio::spawn(serve_replay(client.clone(), opts.clone(), replay));
    let subject = opts.plane.events_subject(&opts.worker);
    let mut n = 0u64;
    let status = &opts.status;
    while let Some(item) = feed.items.recv().await {
        match &item {
            FeedItem::Connected | FeedItem::Batch(_) => {
                status.engine_connected.store(true, Ordering::Relaxed)
            }
            FeedItem::Disconnected => status.engine_connected.store(false, Ordering::Relaxed),
            _ => {}
        }
        let e = Envelope {
            v: VERSION,
            worker: opts.worker.clone(),
            relay: opts.incarnation,
            n,
            item: items::to_wire(&item, opts.format),
        };
        publish(&js, &subject, &e, status).await;
        status.published.fetch_add(1, Ordering::Relaxed);
        n += 1;
    }
    status.engine_connected.store(false, Ordering::Relaxed);
    status.feed_ended.store(true, Ordering::Relaxed);
    service.abort();
    tracing::info!(worker = %opts.worker, published = n, "relay: the engine's feed ended");
    n
}

/// Creates the stream when it is missing, trying until NATS answers (after pauses of
/// [`backoff::reconnect`]).
pub(super) async fn ensure_stream(js: &jetstream::Context, plane: &PlaneConfig) {
    // The policy never gives up: the stream is there when this returns.
    let _ = (|| js.get_or_create_stream(crate::stream_config(plane)))
        .retry(backoff::reconnect())
        .notify(|e, _| {
            if let jetstream::context::CreateStreamErrorKind::JetStream(j) = e.kind() {
                if j.error_code() == jetstream::ErrorCode::STORAGE_RESOURCES_EXCEEDED {
                    tracing::warn!(
                        stream = %plane.stream,
                        max_bytes = plane.max_bytes,
                        error = %e,
                        "event plane: the NATS server offers JetStream less file storage than \
                         event_plane.max_bytes; lower max_bytes or raise the server's \
                         jetstream max_file_store (its default is a share of the disk's free \
                         space); trying again"
                    );
                    return;
                }
            }
            tracing::warn!(stream = %plane.stream, error = %e, "event plane: stream not ready; trying again");
        })
        .await;
}

/// Publishes one envelope, retrying with the same dedup id until it is acknowledged (after
/// pauses of [`backoff::publish`]).
async fn publish(js: &jetstream::Context, subject: &str, e: &Envelope, status: &RelayStatus) {
    let bytes: bytes::Bytes = e.encode().into();
    let id = e.dedup_id();
    let id = id.as_str();
    let mut tries = 0u32;
    let acked = (|| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
        let bytes = bytes.clone();
        async move {
            match js
                .publish_with_headers(subject.to_string(), headers, bytes)
                .await
            {
                Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .retry(backoff::publish())
    .notify(|err: &String, _| {
        tries += 1;
        status.publish_retries.fetch_add(1, Ordering::Relaxed);
        if tries == 1 || tries.is_power_of_two() {
            tracing::warn!(subject, n = e.n, tries, error = %err, "event plane: publish not acknowledged; trying again");
        }
    })
    .await;
    // The policy never gives up: the envelope is acknowledged.
    if acked.is_ok() && tries > 0 {
        tracing::info!(
            subject,
            n = e.n,
            tries,
            "event plane: published after retries"
        );
    }
}

/// Answers replay requests for the worker from the engine's replay service, a page at a
/// time (a gateway asks again from the last batch + 1 while `more`).
async fn serve_replay(
    client: async_nats::Client,
    opts: RelayOptions,
    replay: Option<Arc<dyn Replay>>,
) {
    let subject = opts.plane.replay_subject(&opts.worker);
    let subscribed = (|| client.subscribe(subject.clone()))
        .retry(backoff::reconnect())
        .notify(|e, _| {
            tracing::warn!(%subject, error = %e, "relay: cannot subscribe for replay requests; trying again");
        })
        .await;
    // The policy never gives up: subscribed.
    let Ok(mut sub) = subscribed else {
        return;
    };
    let timeout = opts.plane.request_timeout();
    while let Some(msg) = sub.next().await {
        let Some(reply) = msg.reply else {
            continue;
        };
        let page = match (&replay, wire::from_bytes::<ReplayRequest>(&msg.payload)) {
            (_, Err(e)) => ReplayPage::Error {
                error: format!("bad replay request: {e}"),
            },
            (None, _) => ReplayPage::Error {
                error: format!("worker {} has no replay service", opts.worker),
            },
            (Some(r), Ok(req)) => {
                match tokio::time::timeout(timeout, r.replay_from(req.from)).await {
                    Ok(Ok(batches)) => {
                        wire::page_of(&batches, opts.format, opts.plane.replay_page_bytes)
                    }
                    Ok(Err(e)) => ReplayPage::Error { error: e },
                    Err(_) => ReplayPage::Error {
                        error: "the engine's replay service timed out".into(),
                    },
                }
            }
        };
        if let Err(e) = client.publish(reply, wire::to_bytes(&page).into()).await {
            tracing::warn!(%subject, error = %e, "relay: replay answer not sent");
        }
    }
}
