//! The gateway's side of the event plane: a worker's subject read with an ordered JetStream
//! consumer as an [`EventFeed`], and its replay service reached through the relay.

use super::items;
use super::PlaneConfig;
use async_nats::jetstream::{self, consumer::pull::OrderedConfig, consumer::DeliverPolicy};
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use kvroute_fleet::backoff;
use kvroute_fleet::feed::{EventFeed, FeedItem, Replay};
use kvroute_protocol::kv_events::EventBatch;
use kvroute_protocol::plane::{self as wire, Envelope, ReplayPage, ReplayRequest};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// Items buffered between the consumer and the ingestion.
const FEED_BUFFER: usize = 4096;

use crate::connection::Connection;

/// Connects to the plane as `name`. The client keeps trying in the background when the
/// server is not there yet (and after every disconnect), so a gateway or relay starts
/// whether NATS is up or not.
pub async fn connect(
    plane: &PlaneConfig,
    name: &str,
) -> Result<Connection, async_nats::ConnectError> {
    let (tx, up) = watch::channel(false);
    let tx = Arc::new(tx);
    let addrs: Vec<async_nats::ServerAddr> = plane
        .url
        .split(',')
        .filter_map(|u| u.trim().parse().ok())
        .collect();
    let client = async_nats::ConnectOptions::new()
        .name(name)
        .retry_on_initial_connect()
        .request_timeout(Some(plane.request_timeout()))
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                match event {
                    async_nats::Event::Connected => {
                        tracing::info!("event plane: connected");
                        tx.send_replace(true);
                    }
                    async_nats::Event::Disconnected => {
                        tracing::warn!("event plane: disconnected");
                        tx.send_replace(false);
                    }
                    other => tracing::debug!(event = %other, "event plane"),
                }
            }
        })
        .connect(addrs)
        .await?;
    Ok(Connection { client, up })
}

/// The plane's feeds as the fleet opens them (`events = "nats"` workers): a subscription per
/// worker on one connection.
pub struct NatsFeeds {
    conn: Connection,
    plane: PlaneConfig,
}

impl NatsFeeds {
    /// Feeds on `conn`, with the subjects and limits of `plane`.
    pub fn new(conn: Connection, plane: PlaneConfig) -> Self {
        Self { conn, plane }
    }
}

impl kvroute_fleet::feed::PlaneFeeds for NatsFeeds {
    fn feed(&self, worker: &str) -> EventFeed {
        nats_feed(&self.conn, &self.plane, worker)
    }
}

/// A worker's events from the plane. The consumer starts at the stream's end (what came
/// before is the replay's, as for a direct feed) and resumes after the last message it
/// delivered when it is made again: after an error and after every reconnection. NATS connection changes are reported as the
/// publisher's ([`FeedItem::Disconnected`] / [`FeedItem::Connected`]), so the worker's
/// cache state is `unknown` while events cannot arrive and is checked when they can.
pub fn nats_feed(conn: &Connection, plane: &PlaneConfig, worker: &str) -> EventFeed {
    let (tx, items) = mpsc::channel(FEED_BUFFER);
    let replay = NatsReplay {
        client: conn.client.clone(),
        subject: plane.replay_subject(worker),
        max_pages: plane.replay_max_pages,
        plane: plane.clone(),
        worker: worker.to_string(),
    };
    tokio::spawn(consume(conn.clone(), plane.clone(), worker.to_string(), tx));
    EventFeed {
        items,
        replay: Some(Box::new(replay)),
    }
}

async fn consume(conn: Connection, plane: PlaneConfig, worker: String, tx: mpsc::Sender<FeedItem>) {
    let mut js = jetstream::new(conn.client.clone());
    js.set_timeout(plane.request_timeout());
    let subject = plane.events_subject(&worker);
    let mut up = conn.up.clone();
    let mut was_up = *up.borrow_and_update();
    let mut last: Option<u64> = None;
    // When the stream read was made: another time means it was deleted and made again.
    let mut created_at: Option<i128> = None;
    // Before the consumer is made again after an error; reset once it is made.
    let mut pauses = backoff::Pauses::new(backoff::reconnect());
    loop {
        if tx.is_closed() {
            return;
        }
        let made = async {
            let stream = js
                .get_or_create_stream(crate::stream_config(&plane))
                .await
                .map_err(|e| e.to_string())?;
            let info = stream.cached_info();
            let created = info.created.unix_timestamp_nanos();
            let same = created_at.is_none_or(|c| c == created);
            let start = resume_at(
                last,
                same,
                info.state.first_sequence,
                info.state.last_sequence,
            );
            let consumer = stream
                .create_consumer(OrderedConfig {
                    filter_subject: subject.clone(),
                    deliver_policy: DeliverPolicy::ByStartSequence {
                        start_sequence: start,
                    },
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string())?;
            let messages = consumer.messages().await.map_err(|e| e.to_string())?;
            Ok::<_, String>((messages, start, created))
        };
        let mut messages = tokio::select! {
            m = made => match m {
                Ok((m, start, created)) => {
                    // What comes next is read from `start` on, whatever this consumer
                    // delivers (a remade consumer resumes there too).
                    last = Some(start.saturating_sub(1));
                    created_at = Some(created);
                    m
                }
                Err(e) => {
                    tracing::warn!(%worker, error = %e, "event plane: consumer not made; trying again");
                    tokio::time::sleep(pauses.next_pause()).await;
                    continue;
                }
            },
            () = tx.closed() => return,
        };
        pauses.reset();
        let mut remake = false;
        loop {
            let item = tokio::select! {
                m = messages.next() => match m {
                    Some(Ok(m)) => {
                        if let Ok(info) = m.info() {
                            last = Some(info.stream_sequence);
                        }
                        match Envelope::decode(&m.payload) {
                            Ok(e) if e.worker == worker => items::from_wire(e.item),
                            Ok(e) => FeedItem::Undecodable(format!("an envelope of worker {:?} on {subject}", e.worker)),
                            Err(e) => FeedItem::Undecodable(e),
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(%worker, error = %e, "event plane: consumer failed; making it again");
                        break;
                    }
                    None => break,
                },
                changed = up.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let now = *up.borrow_and_update();
                    if now == was_up {
                        continue;
                    }
                    was_up = now;
                    if now {
                        // The server may have restarted and forgotten the consumer (the
                        // library notices only after missing heartbeats for seconds):
                        // make it again from the last message read.
                        remake = true;
                        FeedItem::Connected
                    } else {
                        FeedItem::Disconnected
                    }
                }
                () = tx.closed() => return,
            };
            if tx.send(item).await.is_err() {
                return;
            }
            if std::mem::take(&mut remake) {
                break;
            }
        }
    }
}

/// The stream sequence to read from: after the last message read; after the stream's end
/// when nothing was read yet (what came before is the replay's) or when the same stream now
/// ends before it (the server lost its tail: what it stores from now on is new); from the
/// first message of a stream made again since (all of it is new).
fn resume_at(last: Option<u64>, same_stream: bool, stream_first: u64, stream_last: u64) -> u64 {
    match last {
        None => stream_last + 1,
        Some(_) if !same_stream => stream_first.max(1),
        Some(l) if l <= stream_last => l + 1,
        Some(_) => stream_last + 1,
    }
}

/// The engine's replay service, reached through its relay.
struct NatsReplay {
    client: async_nats::Client,
    subject: String,
    max_pages: usize,
    plane: PlaneConfig,
    worker: String,
}

impl Replay for NatsReplay {
    fn snapshot(&self) -> BoxFuture<'_, Option<kvroute_fleet::feed::Snapshot>> {
        Box::pin(super::snapshot::load(
            &self.client,
            &self.plane,
            &self.worker,
        ))
    }

    fn replay_from(&self, from: u64) -> BoxFuture<'_, Result<Vec<Arc<EventBatch>>, String>> {
        Box::pin(async move {
            let mut out = Vec::new();
            let mut next = from;
            for _ in 0..self.max_pages {
                let req = wire::to_bytes(&ReplayRequest { from: next });
                let answer = self
                    .client
                    .request(self.subject.clone(), req.into())
                    .await
                    .map_err(|e| format!("replay through the relay ({}): {e}", self.subject))?;
                match wire::from_bytes::<ReplayPage>(&answer.payload)? {
                    ReplayPage::Error { error } => return Err(error),
                    ReplayPage::Batches { batches, more } => {
                        let got = batches.len();
                        for b in batches {
                            out.push(Arc::new(wire::batch_of(b.seq, &b.payload)?));
                        }
                        match out.last() {
                            Some(b) if more && got > 0 => next = b.seq.wrapping_add(1),
                            _ => return Ok(out),
                        }
                    }
                }
            }
            tracing::warn!(subject = %self.subject, pages = self.max_pages, "replay cut at its page limit");
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::resume_at;

    #[test]
    fn a_consumer_resumes_after_what_it_read_or_at_the_streams_end() {
        // Nothing read yet: the stream's end (an empty stream's first sequence is 1).
        assert_eq!(resume_at(None, true, 0, 0), 1);
        assert_eq!(resume_at(None, true, 1, 41), 42);
        // After the last message read, even when more was stored since.
        assert_eq!(resume_at(Some(7), true, 1, 7), 8);
        assert_eq!(resume_at(Some(7), true, 1, 30), 8);
        // The same stream ends before it (its tail lost in a crash): what it stores next
        // is new.
        assert_eq!(resume_at(Some(30), true, 1, 7), 8);
        assert_eq!(resume_at(Some(30), true, 0, 0), 1);
        // A stream made again: all of it is new, from its first message.
        assert_eq!(resume_at(Some(30), false, 1, 7), 1);
        assert_eq!(resume_at(Some(3), false, 1, 7), 1);
        assert_eq!(resume_at(Some(30), false, 0, 0), 1);
    }
}
