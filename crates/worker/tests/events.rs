//! KV events: the in-process subscription, replay, reset, and the ZMQ PUB and replay
//! sockets (vLLM's wire format and replay protocol).

mod common;

use common::*;
use kvroute_protocol::kv_events::{decode_message, decode_payload, Event, EventBatch};
use kvroute_testkit::zmq::{raw, replay_raw, Subscriber};
use kvroute_worker::{WorkerHandle, ZmqConfig, END_SEQ};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;

/// Completes a token-id prompt (non-streaming: the answer comes after the prompt's blocks
/// were published).
async fn complete(client: &reqwest::Client, w: &WorkerHandle, prompt: &[u32], max_tokens: u32) {
    let body = json!({"model": "kvroute-sim", "prompt": prompt, "max_tokens": max_tokens});
    let r = client
        .post(format!("{}/v1/completions", w.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

async fn next_batch(rx: &mut broadcast::Receiver<Arc<EventBatch>>) -> Arc<EventBatch> {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("no event batch in time")
        .unwrap()
}

/// The token ids of the `Stored` events of `batches`, concatenated.
fn stored_tokens(batches: &[Arc<EventBatch>]) -> Vec<u32> {
    let mut out = Vec::new();
    for b in batches {
        for e in &b.events {
            if let Event::Stored(s) = e {
                assert_eq!(s.block_size, 16);
                out.extend_from_slice(&s.token_ids);
            }
        }
    }
    out
}

#[tokio::test]
async fn events_are_numbered_replayable_and_restart_after_a_reset() {
    bounded(async {
        let w = start(config(), None).await;
        let client = reqwest::Client::new();
        let mut rx = w.subscribe();
        // 40 tokens: 2 full blocks of 16; 3 more tokens do not fill a third.
        let p1: Vec<u32> = (1000..1040).collect();
        let p2: Vec<u32> = (2000..2040).collect();
        complete(&client, &w, &p1, 3).await;
        complete(&client, &w, &p2, 3).await;
        let mut got = Vec::new();
        while stored_tokens(&got).len() < 64 {
            got.push(next_batch(&mut rx).await);
        }
        let seqs: Vec<u64> = got.iter().map(|b| b.seq).collect();
        assert_eq!(seqs, (0..got.len() as u64).collect::<Vec<_>>());
        let want: Vec<u32> = p1[..32].iter().chain(&p2[..32]).copied().collect();
        assert_eq!(stored_tokens(&got), want);
        let Event::Stored(first) = &got[0].events[0] else {
            panic!("{:?}", got[0]);
        };
        assert_eq!(first.parent, None, "the first block is a root");

        let replay = w.replay_from(0);
        assert_eq!(replay, got, "the buffer holds what was broadcast");
        let from1 = w.replay_from(1);
        assert_eq!(from1[..], got[1..]);

        let r = client
            .post(format!("{}/admin/reset", w.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let b = next_batch(&mut rx).await;
        assert_eq!(b.seq, 0, "the sequence restarts");
        assert!(b.events.contains(&Event::Cleared), "{b:?}");
        assert_eq!(w.replay_from(0), vec![b.clone()]);

        // The cache is empty: the same prompt is stored again, as batch 1.
        complete(&client, &w, &p1, 3).await;
        let b = next_batch(&mut rx).await;
        assert_eq!(b.seq, 1);
        assert_eq!(stored_tokens(&[b]), p1[..32].to_vec());
        w.shutdown().await;
    })
    .await;
}

/// Sends a replay request from `start` and reads the answers up to the end marker, checking
/// vLLM 0.32's form: `["", topic, seq, payload]`, then `["", "", END_SEQ, ""]`.
async fn replay(endpoint: &str, start: u64) -> Vec<EventBatch> {
    let answer = replay_raw(endpoint, start, Duration::from_secs(10)).await;
    let (end, batches) = answer.split_last().unwrap();
    assert_eq!(end, &vec![vec![], vec![], END_SEQ.to_vec(), vec![]]);
    batches
        .iter()
        .map(|f| {
            assert_eq!(f.len(), 4, "[empty, topic, seq, payload]");
            assert!(f[0].is_empty());
            assert_eq!(f[1], b"kv-events");
            let seq = u64::from_be_bytes(f[2][..].try_into().unwrap());
            let (ts, events, dp_rank) = decode_payload(&f[3]).unwrap();
            EventBatch {
                seq,
                ts,
                events,
                dp_rank,
            }
        })
        .collect()
}

/// PUB and replay ROUTER bound to free ports of 127.0.0.1.
fn bound_zmq() -> ZmqConfig {
    ZmqConfig {
        publish: "tcp://127.0.0.1:0".into(),
        connect: false,
        replay: Some("tcp://127.0.0.1:0".into()),
    }
}

#[tokio::test]
async fn zmq_publishes_like_vllm_and_answers_replay_requests() {
    bounded(async {
        let w = start(config(), Some(bound_zmq())).await;
        let (pub_ep, replay_ep) = w.zmq_endpoints().unwrap();
        assert!(pub_ep.starts_with("tcp://127.0.0.1:") && !pub_ep.ends_with(":0"));
        assert!(replay_ep.starts_with("tcp://127.0.0.1:") && !replay_ep.ends_with(":0"));
        let client = reqwest::Client::new();

        let sub = Subscriber::connect(&pub_ep);
        // The subscription reaches the publisher some time after `subscribe` returns (ZMQ's
        // slow joiner): publish fresh blocks until one arrives, within a bound.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut k = 0u32;
        let msg = loop {
            assert!(tokio::time::Instant::now() < deadline, "nothing received");
            let prompt: Vec<u32> = (0..32).map(|i| 10_000 + k * 100 + i).collect();
            k += 1;
            complete(&client, &w, &prompt, 1).await;
            if let Some(m) = sub.recv(Duration::from_millis(250)).await {
                break m;
            }
        };
        let f = msg;
        assert_eq!(&f[0][..], b"kv-events");
        let parts: Vec<&[u8]> = f.iter().map(|b| &b[..]).collect();
        let batch = decode_message(&parts).unwrap();
        let local = w.replay_from(batch.seq);
        assert_eq!(
            local[0].as_ref(),
            &batch,
            "the wire batch is the in-process one"
        );
        assert_eq!(batch.dp_rank, Some(0));

        // Replay from 0: every buffered batch, then the end marker.
        let all = replay(&replay_ep, 0).await;
        let local: Vec<EventBatch> = w.replay_from(0).iter().map(|b| (**b).clone()).collect();
        assert!(!all.is_empty());
        assert_eq!(all, local);
        let tail = replay(&replay_ep, 1).await;
        assert_eq!(tail[..], local[1..]);
        assert!(
            replay(&replay_ep, 1 << 40).await.is_empty(),
            "only the end marker"
        );
        w.shutdown().await;
    })
    .await;
}

/// What a raw peer of `socket_type` gets from `endpoint` when it announces a frame of
/// `size` bytes and sends `send` of them: the bytes taken before the worker closed the
/// connection, and whether it closed it.
async fn oversized(
    endpoint: &str,
    socket_type: &'static str,
    size: u64,
    send: usize,
) -> (usize, bool) {
    use kvroute_testkit::zmq::raw;
    let endpoint = endpoint.to_string();
    tokio::task::spawn_blocking(move || {
        let mut conn = raw::connect(&endpoint, socket_type);
        let taken = raw::send_frame(&mut conn, size, send);
        (taken, raw::read_for(&mut conn, Duration::from_secs(5)).1)
    })
    .await
    .unwrap()
}

/// Sends `bytes` to `endpoint` as a raw `socket_type` peer: the bytes it answers within a
/// second, and whether it closed the connection.
async fn raw_exchange(endpoint: &str, socket_type: &'static str, bytes: Vec<u8>) -> (usize, bool) {
    use std::io::Write;
    let endpoint = endpoint.to_string();
    tokio::task::spawn_blocking(move || {
        let mut conn = raw::connect(&endpoint, socket_type);
        conn.write_all(&bytes).unwrap();
        raw::read_for(&mut conn, Duration::from_secs(1))
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn the_zmq_sockets_refuse_oversized_frames_and_keep_serving() {
    bounded(async {
        let w = start(config(), Some(bound_zmq())).await;
        let (pub_ep, replay_ep) = w.zmq_endpoints().unwrap();
        for (endpoint, peer) in [(&pub_ep, "SUB"), (&replay_ep, "DEALER")] {
            // A frame of 2^62 bytes: the connection is dropped at its header.
            let (_, closed) = oversized(endpoint, peer, 1 << 62, 0).await;
            assert!(closed, "{peer} peer announcing 2^62 bytes still connected");
            // 64 MiB, sent for real: refused long before its end, not buffered.
            let (taken, closed) = oversized(endpoint, peer, 64 << 20, 64 << 20).await;
            assert!(
                closed && taken < 64 << 20,
                "{peer} peer: {taken} bytes taken"
            );
        }
        // Well-formed messages from raw peers are taken (so the peers above were refused
        // for their frames' size, not for their handshakes): a subscription, a replay
        // request answered.
        let subscribe = raw_exchange(&pub_ep, "SUB", raw::message(&[b"\x01kv-events"])).await;
        assert_eq!(subscribe, (0, false));
        let request = raw::message(&[b"", &0u64.to_be_bytes()]);
        let (answered, closed) = raw_exchange(&replay_ep, "DEALER", request).await;
        assert!(
            answered > 0 && !closed,
            "replay answer {answered} bytes, closed {closed}"
        );
        // Both sockets still serve.
        let client = reqwest::Client::new();
        complete(&client, &w, &(0..32).collect::<Vec<u32>>(), 1).await;
        assert!(!replay(&replay_ep, 0).await.is_empty());
        let sub = Subscriber::connect(&pub_ep);
        let mut got = None;
        for k in 1..80u32 {
            let prompt: Vec<u32> = (0..32).map(|i| 50_000 + k * 100 + i).collect();
            complete(&client, &w, &prompt, 1).await;
            got = sub.recv(Duration::from_millis(250)).await;
            if got.is_some() {
                break;
            }
        }
        assert!(
            got.is_some(),
            "nothing published after the oversized frames"
        );
        w.shutdown().await;
    })
    .await;
}
