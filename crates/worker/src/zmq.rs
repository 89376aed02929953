//! KV events over ZMQ, as vLLM 0.32 publishes them (`vllm/distributed/kv_events.py`,
//! `ZmqEventPublisher`), through libzmq (the `zmq` crate).
//!
//! - PUB: each batch is one message of three frames `[topic, seq (u64 big-endian),
//!   msgpack payload]`. The socket binds its endpoint, or connects to it when configured
//!   (vLLM connects for a host endpoint: the gateway then binds).
//! - ROUTER (replay, always bound): a client (a DEALER) sends `[b"", start_seq]`, the start
//!   as an 8-byte big-endian integer; the ROUTER sees `[client_id, b"", start_seq]` (requests
//!   of another number of frames are ignored) and answers every buffered batch with a
//!   sequence number of `start_seq` or more as `[client_id, b"", topic, seq (8 bytes BE),
//!   payload]`, then the end marker `[client_id, b"", b"", END_SEQ, b""]`, where `END_SEQ`
//!   is -1 as a signed 8-byte big-endian integer (`0xFFFF_FFFF_FFFF_FFFF`). The DEALER thus
//!   receives `["", topic, seq, payload]` messages and `["", "", END_SEQ, ""]`, exactly as
//!   from vLLM 0.32 (older vLLM left the topic frame out).

use crate::events::EventHub;
use crate::{wait_shutdown, WorkerError, ZmqConfig};
use kvroute_protocol::kv_events::encode_message;
use std::sync::{Arc, OnceLock};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

/// The end-of-replay marker: -1 as a signed 8-byte big-endian integer.
pub const END_SEQ: [u8; 8] = [0xFF; 8];

/// How often the replay thread looks for shutdown, in milliseconds.
const POLL_MS: i64 = 100;

/// The largest message a peer may send to either socket: subscriptions (a topic) and
/// replay requests (a sequence number) are a few bytes; a peer announcing more is
/// disconnected at the frame's header instead of being read.
const MAX_INBOUND_MESSAGE_BYTES: i64 = 64 << 10;

fn context() -> &'static zmq::Context {
    static CTX: OnceLock<zmq::Context> = OnceLock::new();
    CTX.get_or_init(zmq::Context::new)
}

/// The bound sockets' endpoints and their tasks.
pub(crate) struct ZmqTasks {
    /// The PUB endpoint actually bound (port resolved), or the one connected to.
    pub(crate) publish: String,
    /// The ROUTER endpoint actually bound, when configured.
    pub(crate) replay: Option<String>,
    /// The tasks.
    pub(crate) tasks: Vec<(&'static str, JoinHandle<()>)>,
}

fn zmq_err(what: String) -> impl FnOnce(zmq::Error) -> WorkerError {
    move |e| WorkerError::Zmq(format!("{what}: {e}"))
}

/// The endpoint a socket bound (its port resolved).
fn bound(socket: &zmq::Socket, asked: &str) -> String {
    match socket.get_last_endpoint() {
        Ok(Ok(ep)) => ep,
        _ => asked.to_string(),
    }
}

/// Binds (or connects) the sockets and starts their tasks. The publisher subscribes to
/// `hub` before this returns, so it sees every batch published after.
pub(crate) async fn start(
    cfg: &ZmqConfig,
    hub: Arc<EventHub>,
    topic: String,
    shutdown: watch::Receiver<bool>,
    name: String,
) -> Result<ZmqTasks, WorkerError> {
    let ctx = context();
    let pub_socket = ctx
        .socket(zmq::PUB)
        .map_err(zmq_err("creating the PUB socket".into()))?;
    pub_socket
        .set_linger(0)
        .map_err(zmq_err("PUB linger".into()))?;
    pub_socket
        .set_sndhwm(100_000)
        .map_err(zmq_err("PUB high-water mark".into()))?;
    pub_socket
        .set_maxmsgsize(MAX_INBOUND_MESSAGE_BYTES)
        .map_err(zmq_err("PUB message size limit".into()))?;
    let publish = if cfg.connect {
        pub_socket
            .connect(&cfg.publish)
            .map_err(zmq_err(format!("connecting PUB to {}", cfg.publish)))?;
        cfg.publish.clone()
    } else {
        pub_socket
            .bind(&cfg.publish)
            .map_err(zmq_err(format!("binding PUB to {}", cfg.publish)))?;
        bound(&pub_socket, &cfg.publish)
    };
    let mut tasks = Vec::new();
    let mut replay = None;
    if let Some(endpoint) = &cfg.replay {
        let router = ctx
            .socket(zmq::ROUTER)
            .map_err(zmq_err("creating the ROUTER socket".into()))?;
        router
            .set_linger(0)
            .map_err(zmq_err("ROUTER linger".into()))?;
        router
            .set_maxmsgsize(MAX_INBOUND_MESSAGE_BYTES)
            .map_err(zmq_err("ROUTER message size limit".into()))?;
        router
            .bind(endpoint)
            .map_err(zmq_err(format!("binding ROUTER to {endpoint}")))?;
        let at = bound(&router, endpoint);
        tracing::info!(worker = %name, endpoint = %at, "ZMQ replay socket bound");
        replay = Some(at);
        let (hub, shutdown, name, topic) =
            (hub.clone(), shutdown.clone(), name.clone(), topic.clone());
        let task = tokio::task::spawn_blocking(move || {
            serve_replay(&router, &hub, &shutdown, &name, topic.as_bytes())
        });
        tasks.push(("zmq-replay", task));
    }
    tracing::info!(worker = %name, endpoint = %publish, topic = %topic, connect = cfg.connect, "ZMQ publisher ready");
    let task = publish_loop(pub_socket, hub.clone(), topic, shutdown, name);
    tasks.push(("zmq-publish", tokio::spawn(task)));
    Ok(ZmqTasks {
        publish,
        replay,
        tasks,
    })
}

async fn publish_loop(
    socket: zmq::Socket,
    hub: Arc<EventHub>,
    topic: String,
    mut shutdown: watch::Receiver<bool>,
    name: String,
) {
    let mut rx = hub.subscribe();
    loop {
        let batch = tokio::select! {
            biased;
            _ = wait_shutdown(&mut shutdown) => break,
            r = rx.recv() => match r {
                Ok(b) => b,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(worker = %name, missed = n, "ZMQ publisher fell behind; batches dropped");
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
        };
        let payload = hub.encode(&batch);
        let frames = encode_message(&topic, batch.seq, payload);
        // A PUB socket never blocks: past its high-water mark it drops, as vLLM's does.
        if let Err(e) = socket.send_multipart(frames, zmq::DONTWAIT) {
            tracing::warn!(worker = %name, seq = batch.seq, error = %e, "ZMQ publish failed");
        }
    }
}

fn serve_replay(
    socket: &zmq::Socket,
    hub: &EventHub,
    shutdown: &watch::Receiver<bool>,
    name: &str,
    topic: &[u8],
) {
    loop {
        if *shutdown.borrow() {
            return;
        }
        match socket.poll(zmq::POLLIN, POLL_MS) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(worker = %name, error = %e, "ZMQ replay socket failed");
                return;
            }
        }
        let request = match socket.recv_multipart(zmq::DONTWAIT) {
            Ok(r) => r,
            Err(zmq::Error::EAGAIN) => continue,
            Err(e) => {
                tracing::warn!(worker = %name, error = %e, "ZMQ replay socket failed");
                return;
            }
        };
        match answer(socket, hub, topic, &request) {
            Ok(Some((start, n))) => {
                tracing::debug!(worker = %name, start, batches = n, "replay served");
            }
            Ok(None) => tracing::warn!(worker = %name, "invalid replay request ignored"),
            Err(e) => tracing::warn!(worker = %name, error = %e, "replay answer failed"),
        }
    }
}

/// The client and start sequence number of a replay request `[client_id, b"", start]` (the
/// start is read as a big-endian integer of at most 8 bytes).
fn parse_request(frames: &[Vec<u8>]) -> Option<(&[u8], u64)> {
    let [client, _empty, start] = frames else {
        return None;
    };
    if start.is_empty() || start.len() > 8 {
        return None;
    }
    let mut be = [0u8; 8];
    be[8 - start.len()..].copy_from_slice(start);
    Some((client, u64::from_be_bytes(be)))
}

/// Answers one request; `(start, batches sent)`, or None for an invalid request.
fn answer(
    socket: &zmq::Socket,
    hub: &EventHub,
    topic: &[u8],
    frames: &[Vec<u8>],
) -> Result<Option<(u64, usize)>, zmq::Error> {
    let Some((client, start)) = parse_request(frames) else {
        return Ok(None);
    };
    let batches = hub.replay_from(start);
    for b in &batches {
        let payload = hub.encode(b);
        let seq = b.seq.to_be_bytes();
        let message: [&[u8]; 5] = [client, b"", topic, &seq, &payload];
        socket.send_multipart(message, 0)?;
    }
    let end: [&[u8]; 5] = [client, b"", b"", &END_SEQ, b""];
    socket.send_multipart(end, 0)?;
    Ok(Some((start, batches.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_requests_parse_like_vllm() {
        let f = |v: &[&[u8]]| v.iter().map(|b| b.to_vec()).collect::<Vec<_>>();
        let seven = 7u64.to_be_bytes();
        assert_eq!(
            parse_request(&f(&[b"id", b"", &seven])).map(|r| r.1),
            Some(7)
        );
        assert_eq!(
            parse_request(&f(&[b"id", b"", b"\x01\x00"])).map(|r| r.1),
            Some(256)
        );
        assert!(parse_request(&f(&[b"id", b"\x00"])).is_none());
        assert!(parse_request(&f(&[b"id", b"", b""])).is_none());
        assert!(parse_request(&f(&[b"id", b"", b"123456789"])).is_none());
        assert_eq!(i64::from_be_bytes(END_SEQ), -1);
    }
}
