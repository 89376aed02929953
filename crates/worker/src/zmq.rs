//! KV events over ZMQ, as vLLM publishes them (`vllm/distributed/kv_events.py`,
//! `ZmqEventPublisher`).
//!
//! - PUB: each batch is one message of three frames `[topic, seq (u64 big-endian),
//!   msgpack payload]`.
//! - ROUTER (replay): a client (a DEALER) sends `[b"", start_seq]`, the start as an 8-byte
//!   big-endian integer; the ROUTER sees `[client_id, b"", start_seq]` (requests of another
//!   number of frames are ignored) and answers every buffered batch with a sequence number of
//!   `start_seq` or more as `[client_id, b"", seq (8 bytes BE), payload]`, then the end
//!   marker `[client_id, b"", END_SEQ, b""]`, where `END_SEQ` is -1 as a signed 8-byte
//!   big-endian integer (`0xFFFF_FFFF_FFFF_FFFF`). The DEALER thus receives
//!   `[b"", seq, payload]` messages and `[b"", END_SEQ, b""]`.

use crate::events::EventHub;
use crate::{wait_shutdown, WorkerError, ZmqConfig};
use bytes::Bytes;
use kvroute_protocol::vllm_events::{encode_message, encode_payload, EventBatch};
use std::sync::Arc;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// The end-of-replay marker: -1 as a signed 8-byte big-endian integer.
pub const END_SEQ: [u8; 8] = [0xFF; 8];

/// The bound sockets' endpoints and their tasks.
pub(crate) struct ZmqTasks {
    /// The PUB endpoint actually bound (port resolved).
    pub(crate) publish: String,
    /// The ROUTER endpoint actually bound, when configured.
    pub(crate) replay: Option<String>,
    /// The tasks.
    pub(crate) tasks: Vec<(&'static str, JoinHandle<()>)>,
}

/// Binds the sockets and starts their tasks. The publisher subscribes to `hub` before this
/// returns, so it sees every batch published after.
pub(crate) async fn start(
    cfg: &ZmqConfig,
    hub: Arc<EventHub>,
    topic: String,
    shutdown: watch::Receiver<bool>,
    name: String,
) -> Result<ZmqTasks, WorkerError> {
    let mut pub_socket = PubSocket::new();
    let publish = pub_socket
        .bind(&cfg.publish)
        .await
        .map_err(|e| WorkerError::Zmq(format!("binding PUB to {}: {e}", cfg.publish)))?
        .to_string();
    let mut tasks = Vec::new();
    let mut replay = None;
    if let Some(endpoint) = &cfg.replay {
        let mut router = RouterSocket::new();
        let bound = router
            .bind(endpoint)
            .await
            .map_err(|e| WorkerError::Zmq(format!("binding ROUTER to {endpoint}: {e}")))?
            .to_string();
        tracing::info!(worker = %name, endpoint = %bound, "ZMQ replay socket bound");
        replay = Some(bound);
        let task = serve_replay(router, hub.clone(), shutdown.clone(), name.clone());
        tasks.push(("zmq-replay", tokio::spawn(task)));
    }
    tracing::info!(worker = %name, endpoint = %publish, topic = %topic, "ZMQ publisher bound");
    let task = publish_loop(pub_socket, hub.subscribe(), topic, shutdown, name);
    tasks.push(("zmq-publish", tokio::spawn(task)));
    Ok(ZmqTasks {
        publish,
        replay,
        tasks,
    })
}

fn message(frames: Vec<Bytes>) -> Option<ZmqMessage> {
    ZmqMessage::try_from(frames).ok()
}

fn batch_frames(topic: &str, b: &EventBatch) -> Vec<Bytes> {
    let payload = encode_payload(b.ts, &b.events, b.dp_rank);
    encode_message(topic, b.seq, payload)
        .into_iter()
        .map(Bytes::from)
        .collect()
}

async fn publish_loop(
    mut socket: PubSocket,
    mut rx: broadcast::Receiver<Arc<EventBatch>>,
    topic: String,
    mut shutdown: watch::Receiver<bool>,
    name: String,
) {
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
        let Some(msg) = message(batch_frames(&topic, &batch)) else {
            continue;
        };
        if let Err(e) = socket.send(msg).await {
            tracing::warn!(worker = %name, seq = batch.seq, error = %e, "ZMQ publish failed");
        }
    }
    socket.close().await;
}

async fn serve_replay(
    mut socket: RouterSocket,
    hub: Arc<EventHub>,
    mut shutdown: watch::Receiver<bool>,
    name: String,
) {
    loop {
        let request = tokio::select! {
            biased;
            _ = wait_shutdown(&mut shutdown) => break,
            r = socket.recv() => match r {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(worker = %name, error = %e, "ZMQ replay socket failed");
                    break;
                }
            },
        };
        tokio::select! {
            biased;
            _ = wait_shutdown(&mut shutdown) => break,
            r = answer(&mut socket, &hub, request.into_vec()) => match r {
                Ok(Some((start, n))) => {
                    tracing::debug!(worker = %name, start, batches = n, "replay served");
                }
                Ok(None) => {
                    tracing::warn!(worker = %name, "invalid replay request ignored");
                }
                Err(e) => {
                    tracing::warn!(worker = %name, error = %e, "replay answer failed");
                }
            },
        }
    }
    socket.close().await;
}

/// The start sequence number of a replay request `[client_id, b"", start]` (the start
/// is read as a big-endian integer of at most 8 bytes).
fn parse_request(frames: &[Bytes]) -> Option<(Bytes, u64)> {
    let [client, _empty, start] = frames else {
        return None;
    };
    if start.is_empty() || start.len() > 8 {
        return None;
    }
    let mut be = [0u8; 8];
    be[8 - start.len()..].copy_from_slice(start);
    Some((client.clone(), u64::from_be_bytes(be)))
}

/// Answers one request; `(start, batches sent)`, or None for an invalid request.
async fn answer(
    socket: &mut RouterSocket,
    hub: &EventHub,
    frames: Vec<Bytes>,
) -> Result<Option<(u64, usize)>, zeromq::ZmqError> {
    let Some((client, start)) = parse_request(&frames) else {
        return Ok(None);
    };
    let batches = hub.replay_from(start);
    for b in &batches {
        let payload = encode_payload(b.ts, &b.events, b.dp_rank);
        let frames = vec![
            client.clone(),
            Bytes::new(),
            Bytes::copy_from_slice(&b.seq.to_be_bytes()),
            Bytes::from(payload),
        ];
        if let Some(msg) = message(frames) {
            socket.send(msg).await?;
        }
    }
    let end = vec![
        client,
        Bytes::new(),
        Bytes::from_static(&END_SEQ),
        Bytes::new(),
    ];
    if let Some(msg) = message(end) {
        socket.send(msg).await?;
    }
    Ok(Some((start, batches.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_requests_parse_like_vllm() {
        let f = |v: &[&'static [u8]]| v.iter().map(|b| Bytes::from_static(b)).collect::<Vec<_>>();
        let seven = 7u64.to_be_bytes();
        let frames = vec![
            Bytes::from_static(b"id"),
            Bytes::new(),
            Bytes::copy_from_slice(&seven),
        ];
        assert_eq!(parse_request(&frames).map(|r| r.1), Some(7));
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
