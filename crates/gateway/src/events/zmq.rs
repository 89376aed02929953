//! KV events over ZMQ, as vLLM and SGLang publish them: a SUB socket on the engine's PUB
//! endpoint (reconnecting when the engine goes away), and the replay client of vLLM's ROUTER
//! replay service: the client sends `["", start_seq (u64 big-endian)]` and receives
//! `["", seq, payload]` for each batch the engine still holds, then `["", 0xFF..FF, ""]`.

use super::{EventFeed, Replay};
use futures_util::future::BoxFuture;
use kvroute_protocol::vllm_events::{decode_message, EventBatch};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use zeromq::{DealerSocket, Socket, SocketEvent, SocketRecv, SocketSend, SubSocket, ZmqMessage};

/// The sequence number that ends a replay answer.
const END_SEQ: [u8; 8] = [0xFF; 8];

/// Most batches one replay answer may carry.
const MAX_REPLAY_BATCHES: usize = 100_000;

/// Batches buffered between the socket and the index.
const FEED_BUFFER: usize = 4096;

/// A feed of `endpoint`'s batches (with replay from `replay`, when given). The SUB task
/// runs until the receiver is dropped, reconnecting after disconnects.
pub fn zmq_feed(worker: String, endpoint: String, replay: Option<String>) -> EventFeed {
    let (tx, rx) = mpsc::channel(FEED_BUFFER);
    tokio::spawn(subscribe_loop(worker.clone(), endpoint, tx));
    EventFeed {
        batches: rx,
        replay: replay.map(|endpoint| Box::new(ZmqReplay { endpoint, worker }) as Box<dyn Replay>),
    }
}

async fn subscribe_loop(worker: String, endpoint: String, tx: mpsc::Sender<Arc<EventBatch>>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        if tx.is_closed() {
            return;
        }
        let mut sub = SubSocket::new();
        let mut monitor = sub.monitor();
        let connected = async {
            sub.connect(&endpoint).await?;
            sub.subscribe("").await
        };
        if let Err(e) = connected.await {
            tracing::warn!(worker = %worker, endpoint = %endpoint, error = %e, "KV event subscription failed; retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
            continue;
        }
        tracing::info!(worker = %worker, endpoint = %endpoint, "subscribed to KV events");
        backoff = Duration::from_millis(100);
        loop {
            tokio::select! {
                msg = sub.recv() => match msg {
                    Ok(m) => {
                        let frames: Vec<&[u8]> = m.iter().map(|b| b.as_ref()).collect();
                        match decode_message(&frames) {
                            Ok(batch) => {
                                if tx.send(Arc::new(batch)).await.is_err() {
                                    return;
                                }
                            }
                            Err(e) => tracing::warn!(worker = %worker, error = %e, "undecodable KV event message dropped"),
                        }
                    }
                    Err(e) => {
                        tracing::warn!(worker = %worker, error = %e, "KV event socket failed; reconnecting");
                        break;
                    }
                },
                ev = futures_util::StreamExt::next(&mut monitor) => match ev {
                    Some(SocketEvent::Disconnected(_)) | None => {
                        tracing::warn!(worker = %worker, "KV event publisher went away; reconnecting");
                        break;
                    }
                    Some(_) => {}
                },
                () = tx.closed() => return,
            }
        }
        let _ = sub.close().await;
    }
}

/// The replay client of one engine.
pub struct ZmqReplay {
    /// The engine's replay endpoint.
    pub endpoint: String,
    /// The worker's name, for logs.
    pub worker: String,
}

impl Replay for ZmqReplay {
    fn replay_from(&self, from: u64) -> BoxFuture<'_, Result<Vec<Arc<EventBatch>>, String>> {
        Box::pin(async move {
            let mut dealer = DealerSocket::new();
            dealer
                .connect(&self.endpoint)
                .await
                .map_err(|e| e.to_string())?;
            let mut req = ZmqMessage::from(Vec::<u8>::new());
            req.push_back(from.to_be_bytes().to_vec().into());
            dealer.send(req).await.map_err(|e| e.to_string())?;
            let mut out = Vec::new();
            loop {
                let m = dealer.recv().await.map_err(|e| e.to_string())?;
                let frames: Vec<&[u8]> = m.iter().map(|b| b.as_ref()).collect();
                // ["", seq, payload]; the topic frame of the live stream is not sent.
                let [_, seq, payload] = frames.as_slice() else {
                    return Err(format!("replay answer with {} frames", frames.len()));
                };
                if *seq == END_SEQ {
                    break;
                }
                let batch = decode_message(&[b"", seq, payload]).map_err(|e| e.to_string())?;
                out.push(Arc::new(batch));
                if out.len() > MAX_REPLAY_BATCHES {
                    return Err(format!("replay answer over {MAX_REPLAY_BATCHES} batches"));
                }
            }
            let _ = dealer.close().await;
            Ok(out)
        })
    }
}
