//! Where a worker's KV event batches come from, as ingestion reads them: a feed of items
//! (batches, connection changes, losses) and the engine's replay service, with the
//! in-process sources the one-process demo and tests use. The sources themselves (ZMQ, the
//! pull API, the event plane) live in the crates that speak their protocols; the fleet
//! starts them through [`EventSources`] and [`PlaneFeeds`].

use crate::registry::WorkerEntry;
use crate::sequence::Mark;
use kvroute_protocol::kv_events::EventBatch;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Fetches batches from a sequence number on, from an engine's replay service.
pub trait Replay: Send + Sync {
    /// Batches with `seq >= from`, in order, as far as the engine still holds them.
    fn replay_from(
        &self,
        from: u64,
    ) -> futures_util::future::BoxFuture<'_, Result<Vec<Arc<EventBatch>>, String>>;

    /// The latest snapshot of the worker's index, when the source keeps one (the event
    /// plane's object store): loaded at start, before the replay catches up from its batch.
    fn snapshot(&self) -> futures_util::future::BoxFuture<'_, Option<Snapshot>> {
        Box::pin(async { None })
    }
}

/// A worker's index as another gateway held it: its blocks, and the batch applied last.
pub struct Snapshot {
    /// The batch applied last.
    pub mark: Mark,
    /// `(engine hash, sequence hash)` of every block.
    pub blocks: Vec<(kvroute_core::EngineHash, kvroute_core::SequenceHash)>,
}

/// What a feed delivers.
#[derive(Clone, Debug)]
pub enum FeedItem {
    /// A batch, in arrival order.
    Batch(Arc<EventBatch>),
    /// A message that did not decode (counted; the next batch shows the gap).
    Undecodable(String),
    /// The publisher connected (a completed handshake; also after a reconnect).
    Connected,
    /// The publisher went away.
    Disconnected,
    /// Events were lost for good (a pull API's engine dropped them): the worker's index is
    /// dropped, since what it misses cannot be fetched again.
    Lost {
        /// What happened, for the log.
        reason: String,
    },
    /// The engine restarted (said by a feed without sequence numbers of its own; its next
    /// batch starts with a clear).
    Restarted,
}

/// Where a worker's event batches come from.
pub struct EventFeed {
    /// Batches and connection changes, in arrival order.
    pub items: mpsc::Receiver<FeedItem>,
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
        let (tx, items) = mpsc::channel(1024);
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                match rx.recv().await {
                    Ok(b) => {
                        if tx.send(FeedItem::Batch(b)).await.is_err() {
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
        Self { items, replay }
    }

    /// A feed of batches sent on a channel (tests, embedders).
    pub fn from_batches(
        mut rx: mpsc::Receiver<Arc<EventBatch>>,
        replay: Option<Box<dyn Replay>>,
    ) -> Self {
        let (tx, items) = mpsc::channel(1024);
        tokio::spawn(async move {
            while let Some(b) = rx.recv().await {
                if tx.send(FeedItem::Batch(b)).await.is_err() {
                    return;
                }
            }
        });
        Self { items, replay }
    }
}

/// Opens a worker's feed from the event plane (the plane crate's JetStream subscription).
pub trait PlaneFeeds: Send + Sync {
    /// The feed of the worker named `worker`, with its replay over the plane.
    fn feed(&self, worker: &str) -> EventFeed;
}

/// Starts the ingestion of workers' events (the events crate's `Sources`): one task per
/// worker, owned by its entry.
pub trait EventSources: Send + Sync {
    /// Starts ingesting the events of `entries` (one engine's ranks consecutive, as
    /// configuration expands them); `feeds` gives in-process sources by position, `plane`
    /// the event plane when the gateway has one.
    fn start(
        &self,
        entries: &[Arc<WorkerEntry>],
        feeds: &mut BTreeMap<usize, EventFeed>,
        plane: Option<&dyn PlaneFeeds>,
    ) -> std::io::Result<()>;
}
