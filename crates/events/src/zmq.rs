//! KV events over ZMQ, as vLLM and SGLang publish them, through libzmq (the `zmq` crate,
//! the library the engines themselves use via pyzmq).
//!
//! - The SUB socket connects to the engine's PUB endpoint, or binds and lets the engine
//!   connect (vLLM connects its PUB socket for a host endpoint and binds it only for a
//!   wildcard one). It runs on a thread of its own with a socket monitor: every completed
//!   handshake and every disconnect is reported on the feed ([`FeedItem::Connected`],
//!   [`FeedItem::Disconnected`]), so the ingestion re-synchronises after a publisher went
//!   away and came back. libzmq reconnects by itself with backoff; ZMTP heartbeats find a
//!   publisher whose connection died silently; a frame over the configured size closes the
//!   connection instead of allocating it.
//! - The replay client is a DEALER: it sends `["", start_seq (u64 big-endian)]` and reads
//!   one message per batch until the end marker. vLLM 0.32 answers `["", topic, seq,
//!   payload]` and ends with `["", "", 0xFF..FF, ""]`; older publishers (and kvroute's
//!   worker before it spoke vLLM's form) answer `["", seq, payload]` and end with
//!   `["", 0xFF..FF, ""]`. Both are read.

use super::{EventFeed, FeedItem, Replay};
use futures_util::future::BoxFuture;
use kvroute_fleet::backoff;
use kvroute_protocol::kv_events::{decode_message, EventBatch};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The sequence number that ends a replay answer (-1 as a signed 8-byte integer).
pub const END_SEQ: [u8; 8] = [0xFF; 8];

/// Batches buffered between the socket thread and the index.
const FEED_BUFFER: usize = 4096;

/// How often the socket thread looks whether its feed is still wanted, in milliseconds.
const POLL_MS: i64 = 250;

/// How to reach one engine's KV event publisher.
#[derive(Clone, Debug, PartialEq)]
pub struct ZmqSubscription {
    /// The worker's name, for logs.
    pub worker: String,
    /// The endpoint (`tcp://host:port`).
    pub endpoint: String,
    /// Bind the SUB socket to `endpoint` (the engine connects) instead of connecting.
    pub bind: bool,
    /// The replay endpoint, when the engine serves one.
    pub replay: Option<String>,
    /// Largest message accepted, in bytes (a larger frame closes the connection).
    pub max_message_bytes: usize,
    /// Seconds between ZMTP heartbeats (0: none).
    pub heartbeat_secs: f64,
    /// Seconds without any traffic after a heartbeat before the connection is taken for
    /// dead.
    pub heartbeat_timeout_secs: f64,
    /// The longest a replay answer may take, in seconds.
    pub replay_timeout_secs: f64,
}

/// A feed of a publisher's batches, with its replay client. The socket thread runs until
/// the feed's receiver is dropped.
pub fn zmq_feed(sub: ZmqSubscription) -> std::io::Result<EventFeed> {
    let (tx, rx) = mpsc::channel(FEED_BUFFER);
    // A libzmq context (and IO thread) per engine: one publisher's trouble stays its own.
    let ctx = zmq::Context::new();
    let replay = sub.replay.clone().map(|endpoint| {
        Box::new(ZmqReplay {
            ctx: ctx.clone(),
            endpoint,
            worker: sub.worker.clone(),
            max_message_bytes: sub.max_message_bytes,
            timeout: Duration::from_secs_f64(sub.replay_timeout_secs),
        }) as Box<dyn Replay>
    });
    std::thread::Builder::new()
        .name(format!("kv-events-{}", sub.worker))
        .spawn(move || subscribe_thread(&ctx, sub, tx))?;
    Ok(EventFeed { items: rx, replay })
}

/// How a socket's life ended.
enum Ended {
    /// The feed's receiver is gone.
    Dropped,
    /// The publisher went away (connect mode): a new socket connects again.
    Reconnect {
        /// A handshake had succeeded on this socket.
        handshaked: bool,
    },
}

/// Runs sockets one after another until the feed is dropped. In connect mode a socket
/// whose publisher went away, or whose handshake failed, is replaced by a new one (after a
/// pause of [`backoff::reconnect`], growing while no handshake succeeds; the thread sleeps,
/// on the system's clock: it runs no tokio runtime): libzmq reconnects by itself after a lost
/// connection, but never after a protocol error (a frame over the size limit, a bad
/// handshake, a TCP connection to itself), which shows only as a disconnect or a failed
/// handshake.
fn subscribe_thread(ctx: &zmq::Context, sub: ZmqSubscription, tx: mpsc::Sender<FeedItem>) {
    let mut pauses = backoff::Pauses::new(backoff::reconnect());
    loop {
        match run_socket(ctx, &sub, &tx) {
            Ok(Ended::Dropped) => return,
            Ok(Ended::Reconnect { handshaked }) => {
                if handshaked {
                    pauses.reset();
                }
            }
            Err(e) => {
                tracing::warn!(worker = %sub.worker, endpoint = %sub.endpoint, error = %e, "KV event socket failed; retrying");
            }
        }
        if tx.is_closed() {
            return;
        }
        std::thread::sleep(pauses.next_pause());
    }
}

fn millis(secs: f64) -> i32 {
    (secs * 1000.0).round().clamp(0.0, f64::from(i32::MAX)) as i32
}

/// The socket's whole life: set up, then receive until the feed is dropped, the publisher
/// goes away (connect mode) or the socket fails (Err); the caller starts a new one.
fn run_socket(
    ctx: &zmq::Context,
    sub: &ZmqSubscription,
    tx: &mpsc::Sender<FeedItem>,
) -> Result<Ended, zmq::Error> {
    static MONITORS: AtomicU64 = AtomicU64::new(0);
    let socket = ctx.socket(zmq::SUB)?;
    socket.set_linger(0)?;
    socket.set_maxmsgsize(i64::try_from(sub.max_message_bytes).unwrap_or(i64::MAX))?;
    socket.set_rcvhwm(100_000)?;
    socket.set_reconnect_ivl(100)?;
    socket.set_reconnect_ivl_max(2_000)?;
    if sub.heartbeat_secs > 0.0 {
        socket.set_heartbeat_ivl(millis(sub.heartbeat_secs))?;
        socket.set_heartbeat_timeout(millis(sub.heartbeat_timeout_secs))?;
    }
    socket.set_subscribe(b"")?;
    let monitor_endpoint = format!(
        "inproc://kvroute-events-monitor-{}",
        MONITORS.fetch_add(1, Ordering::Relaxed)
    );
    let wanted = zmq::SocketEvent::HANDSHAKE_SUCCEEDED.to_raw()
        | zmq::SocketEvent::DISCONNECTED.to_raw()
        | zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL.to_raw()
        | zmq::SocketEvent::HANDSHAKE_FAILED_NO_DETAIL.to_raw();
    socket.monitor(&monitor_endpoint, i32::from(wanted))?;
    let monitor = ctx.socket(zmq::PAIR)?;
    monitor.set_linger(0)?;
    monitor.connect(&monitor_endpoint)?;
    if sub.bind {
        socket.bind(&sub.endpoint)?;
        tracing::info!(worker = %sub.worker, endpoint = %sub.endpoint, "KV event socket bound; waiting for the engine to connect");
    } else {
        socket.connect(&sub.endpoint)?;
        tracing::info!(worker = %sub.worker, endpoint = %sub.endpoint, "KV event socket connecting");
    }
    let mut handshaked = false;
    loop {
        if tx.is_closed() {
            return Ok(Ended::Dropped);
        }
        let mut items = [
            socket.as_poll_item(zmq::POLLIN),
            monitor.as_poll_item(zmq::POLLIN),
        ];
        zmq::poll(&mut items, POLL_MS)?;
        let (messages, events) = (items[0].is_readable(), items[1].is_readable());
        // Connection changes first: a batch read after a reconnect belongs after it.
        let mut gone = false;
        if events {
            while let Some(m) = monitor_event(&monitor, &sub.worker)? {
                let item = match m {
                    Monitor::Item(item) => item,
                    Monitor::HandshakeFailed => {
                        gone = true;
                        continue;
                    }
                };
                gone |= matches!(item, FeedItem::Disconnected);
                handshaked |= matches!(item, FeedItem::Connected);
                if tx.blocking_send(item).is_err() {
                    return Ok(Ended::Dropped);
                }
            }
        }
        if messages {
            loop {
                let frames = match socket.recv_multipart(zmq::DONTWAIT) {
                    Ok(f) => f,
                    Err(zmq::Error::EAGAIN) => break,
                    Err(e) => return Err(e),
                };
                let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
                let item = match decode_message(&refs) {
                    Ok(batch) => FeedItem::Batch(Arc::new(batch)),
                    Err(e) => FeedItem::Undecodable(e.to_string()),
                };
                if tx.blocking_send(item).is_err() {
                    return Ok(Ended::Dropped);
                }
            }
        }
        if gone && !sub.bind {
            return Ok(Ended::Reconnect { handshaked });
        }
    }
}

/// What the socket monitor reported.
enum Monitor {
    /// A connection change for the feed.
    Item(FeedItem),
    /// A handshake failed (a peer of the wrong kind, a bad greeting, or a TCP connection to
    /// itself when nothing listens on a local port in the ephemeral range): libzmq never
    /// retries such a connection.
    HandshakeFailed,
}

/// The next connection change the monitor reports, if one is waiting.
fn monitor_event(monitor: &zmq::Socket, worker: &str) -> Result<Option<Monitor>, zmq::Error> {
    loop {
        let frames = match monitor.recv_multipart(zmq::DONTWAIT) {
            Ok(f) => f,
            Err(zmq::Error::EAGAIN) => return Ok(None),
            Err(e) => return Err(e),
        };
        // [event (u16) + value (u32), native byte order; endpoint]
        let Some(head) = frames.first().and_then(|f| f.get(..2)) else {
            continue;
        };
        let event = u16::from_ne_bytes([head[0], head[1]]);
        let peer = frames
            .get(1)
            .map(|e| String::from_utf8_lossy(e).into_owned())
            .unwrap_or_default();
        if event == zmq::SocketEvent::HANDSHAKE_SUCCEEDED.to_raw() {
            tracing::info!(worker, peer = %peer, "KV event publisher connected");
            return Ok(Some(Monitor::Item(FeedItem::Connected)));
        }
        if event == zmq::SocketEvent::DISCONNECTED.to_raw() {
            tracing::warn!(worker, peer = %peer, "KV event publisher went away");
            return Ok(Some(Monitor::Item(FeedItem::Disconnected)));
        }
        tracing::warn!(worker, peer = %peer, event, "KV event connection refused by the handshake");
        return Ok(Some(Monitor::HandshakeFailed));
    }
}

/// The replay client of one engine.
pub struct ZmqReplay {
    /// The libzmq context its sockets are made in.
    pub ctx: zmq::Context,
    /// The engine's replay endpoint.
    pub endpoint: String,
    /// The worker's name, for logs.
    pub worker: String,
    /// Largest message accepted, in bytes.
    pub max_message_bytes: usize,
    /// The longest a whole answer may take.
    pub timeout: Duration,
}

/// Most batches one replay answer may carry.
const MAX_REPLAY_BATCHES: usize = 100_000;

/// The batch an answer message carries, None at the end marker.
fn replay_message(frames: &[Vec<u8>]) -> Result<Option<EventBatch>, String> {
    let (seq, payload) = match frames {
        // vLLM 0.32: ["", topic, seq, payload]
        [_, _topic, seq, payload] => (seq, payload),
        // older: ["", seq, payload]
        [_, seq, payload] => (seq, payload),
        _ => return Err(format!("replay answer with {} frames", frames.len())),
    };
    if seq.as_slice() == END_SEQ {
        return Ok(None);
    }
    decode_message(&[b"", seq, payload])
        .map(Some)
        .map_err(|e| e.to_string())
}

impl ZmqReplay {
    /// The blocking exchange, within `deadline`.
    fn fetch(&self, from: u64, deadline: Instant) -> Result<Vec<Arc<EventBatch>>, String> {
        let err = |e: zmq::Error| e.to_string();
        let dealer = self.ctx.socket(zmq::DEALER).map_err(err)?;
        dealer.set_linger(0).map_err(err)?;
        dealer
            .set_maxmsgsize(i64::try_from(self.max_message_bytes).unwrap_or(i64::MAX))
            .map_err(err)?;
        dealer.connect(&self.endpoint).map_err(err)?;
        let request: [&[u8]; 2] = [b"", &from.to_be_bytes()];
        dealer.send_multipart(request, 0).map_err(err)?;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero()
                || dealer
                    .poll(zmq::POLLIN, left.as_millis() as i64)
                    .map_err(err)?
                    == 0
            {
                return Err(format!(
                    "no end of the replay answer after {} batches",
                    out.len()
                ));
            }
            let frames = dealer.recv_multipart(0).map_err(err)?;
            match replay_message(&frames)? {
                None => return Ok(out),
                Some(b) => out.push(Arc::new(b)),
            }
            if out.len() > MAX_REPLAY_BATCHES {
                return Err(format!("replay answer over {MAX_REPLAY_BATCHES} batches"));
            }
        }
    }
}

impl Replay for ZmqReplay {
    fn replay_from(&self, from: u64) -> BoxFuture<'_, Result<Vec<Arc<EventBatch>>, String>> {
        let me = ZmqReplay {
            ctx: self.ctx.clone(),
            endpoint: self.endpoint.clone(),
            worker: self.worker.clone(),
            max_message_bytes: self.max_message_bytes,
            timeout: self.timeout,
        };
        Box::pin(async move {
            let deadline = Instant::now() + me.timeout;
            tokio::task::spawn_blocking(move || me.fetch(from, deadline))
                .await
                .map_err(|e| format!("replay task: {e}"))?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_protocol::kv_events::{encode_message, encode_payload, EventFormat};

    #[test]
    fn replay_answers_are_read_in_both_forms() {
        let [topic, seq, payload] =
            encode_message("kv", 7, encode_payload(EventFormat::Vllm, 1.5, &[], None));
        let four = vec![Vec::new(), topic, seq.clone(), payload.clone()];
        let three = vec![Vec::new(), seq, payload];
        for m in [four, three] {
            let b = replay_message(&m).unwrap().unwrap();
            assert_eq!((b.seq, b.ts), (7, 1.5));
        }
        let end4 = vec![Vec::new(), Vec::new(), END_SEQ.to_vec(), Vec::new()];
        let end3 = vec![Vec::new(), END_SEQ.to_vec(), Vec::new()];
        assert_eq!(replay_message(&end4), Ok(None));
        assert_eq!(replay_message(&end3), Ok(None));
        assert!(replay_message(&[Vec::new(), Vec::new()]).is_err());
        assert!(replay_message(&[vec![], vec![1, 2], vec![0x90]]).is_err());
    }
}
