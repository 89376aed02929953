//! KV events over ZMQ in both of vLLM's forms, sequence gaps filled by replay, restarts.

use crate::support::*;
use kvroute_core::hashing::EngineHash;
use kvroute_gateway::{EventFeed, WorkerSpec};
use kvroute_protocol::kv_events::{
    encode_message, encode_payload, Event, EventBatch, EventFormat, Stored,
};
use kvroute_testkit::zmq::Publisher;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A `BlockStored` of `blocks` blocks of 16 tokens starting at token `first`, map form.
pub fn stored_map(seq: u64, first: u32, blocks: u32, parent: Option<u64>) -> [Vec<u8>; 3] {
    let event = Event::Stored(Stored {
        block_hashes: (0..blocks)
            .map(|b| EngineHash(u64::from(first + b)))
            .collect(),
        parent: parent.map(EngineHash),
        token_ids: (first..first + 16 * blocks).collect(),
        block_size: 16,
        medium: Some("GPU".into()),
        ..Stored::default()
    });
    encode_message(
        "kv",
        seq,
        encode_payload(EventFormat::Vllm, 1.0, &[event], None),
    )
}

/// The same in the older positional-array form.
fn stored_array(seq: u64, first: u32, blocks: u32, parent: Option<u64>) -> [Vec<u8>; 3] {
    let hashes: Vec<u64> = (0..blocks).map(|b| u64::from(first + b)).collect();
    let tokens: Vec<u32> = (first..first + 16 * blocks).collect();
    let event = ("BlockStored", hashes, parent, tokens, 16u32, None::<i64>);
    let payload = rmp_serde::to_vec(&(2.0f64, vec![event])).unwrap();
    encode_message("kv", seq, payload)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zmq_events_in_both_forms_update_the_index_and_a_restart_clears_it() {
    let a = worker("a").await;
    let publisher = Publisher::bind("tcp://127.0.0.1:0");
    let endpoint = publisher.endpoint.clone();
    let mut cfg = config(&[&a], "kv");
    cfg.workers[0] = WorkerSpec {
        url: a.url(),
        name: Some("a".into()),
        events: Some(endpoint),
        ..WorkerSpec::default()
    };
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    // Until the subscription is up, published messages are lost (ZMQ's slow joiner): send
    // the first batch again (as a new incarnation each time) until the index shows it.
    assert!(
        eventually(10, async || {
            publisher.send(&stored_map(0, 1000, 2, None));
            index_blocks(&url, 0).await == 2
        })
        .await
    );
    publisher.send(&stored_array(1, 2000, 3, None));
    assert!(eventually(10, async || index_blocks(&url, 0).await == 5).await);
    // The sequence goes back: the engine restarted, its old entries go.
    publisher.send(&stored_map(0, 3000, 1, None));
    assert!(eventually(10, async || index_blocks(&url, 0).await == 1).await);
    let w = &debug_workers(&url).await["workers"][0]["worker"];
    assert!(w["restarts"].as_u64().unwrap() >= 1, "{w}");
    let metrics = crate::scrape(&url).await;
    assert!(
        metrics
            .contains("kvroute_kv_events_total{result=\"applied\",type=\"stored\",worker=\"a\"}"),
        "{metrics}"
    );
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_gap_is_filled_from_the_replay_service() {
    let a = worker("a").await;
    let batch = |seq: u64, first: u32| {
        let frames = stored_map(seq, first, 1, None);
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        Arc::new(kvroute_protocol::kv_events::decode_message(&refs).unwrap())
    };
    let all: Vec<Arc<EventBatch>> = (0..4).map(|s| batch(s, 100 * (s as u32 + 1))).collect();
    // The replay buffer holds what the engine has published so far.
    let (published, tx, feed) = replayed_feed(Vec::new());
    let gw = gateway_with_feeds(config(&[&a], "kv"), BTreeMap::from([(0, feed)])).await;
    let url = gw.url();
    published.lock().unwrap().push(all[0].clone());
    tx.send(all[0].clone()).await.unwrap();
    // Batch 0 is in (live or by the catch-up at start): the catch-up is behind us.
    assert!(eventually(10, async || index_blocks(&url, 0).await == 1).await);
    published.lock().unwrap().extend(all[1..].iter().cloned());
    // Batches 1 and 2 are lost on the way.
    tx.send(all[3].clone()).await.unwrap();
    assert!(eventually(10, async || index_blocks(&url, 0).await == 4).await);
    let w = &debug_workers(&url).await["workers"][0]["worker"];
    assert_eq!(
        (w["gaps"].as_u64(), w["replayed"].as_u64()),
        (Some(1), Some(1)),
        "{w}"
    );
    assert_eq!(w["degraded"], false);
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zmq_replay_client_speaks_the_workers_replay_protocol() {
    use kvroute_events::ZmqReplay;
    use kvroute_gateway::Replay;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let zmq = kvroute_worker::ZmqConfig {
        publish: "tcp://127.0.0.1:0".into(),
        connect: false,
        replay: Some("tcp://127.0.0.1:0".into()),
    };
    let cfg = kvroute_worker::WorkerConfig {
        speedup: 20.0,
        ..Default::default()
    };
    let w = kvroute_worker::spawn(
        cfg,
        kvroute_preprocess::Preprocessor::builtin(),
        listener,
        Some(zmq),
    )
    .await
    .unwrap();
    let (status, _, _) = post(
        &w.url(),
        "/v1/chat/completions",
        &chat(&[("user", &"tell me more ".repeat(30))], false, 4),
    )
    .await;
    assert_eq!(status, 200);
    let held = w.replay_from(0);
    assert!(!held.is_empty());
    let client = ZmqReplay {
        ctx: zmq::Context::new(),
        endpoint: w.zmq_replay_endpoint().unwrap(),
        worker: "w".into(),
        max_message_bytes: 1 << 20,
        timeout: std::time::Duration::from_secs(10),
    };
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), client.replay_from(0))
        .await
        .unwrap()
        .unwrap();
    let want: Vec<_> = held.iter().map(|b| b.as_ref().clone()).collect();
    let got: Vec<_> = got.iter().map(|b| b.as_ref().clone()).collect();
    assert_eq!(got, want);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_published_before_the_gateway_joined_come_from_the_replay_service() {
    let a = worker("a").await;
    let all: Vec<Arc<EventBatch>> = (0..4)
        .map(|s| {
            let frames = stored_map(s, 100 * (s as u32 + 1), 1, None);
            let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            Arc::new(kvroute_protocol::kv_events::decode_message(&refs).unwrap())
        })
        .collect();
    let held = all[..3].to_vec();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let feed = EventFeed::from_batches(
        rx,
        Some(Box::new(BufferReplay(Arc::new(move |from| {
            held.iter().filter(|b| b.seq >= from).cloned().collect()
        })))),
    );
    // All three batches went out before the gateway subscribed: the live feed brings none.
    let gw = gateway_with_feeds(config(&[&a], "kv"), BTreeMap::from([(0, feed)])).await;
    let url = gw.url();
    assert!(eventually(10, async || index_blocks(&url, 0).await == 3).await);
    // A late duplicate of batch 2 on the live feed is not taken for a restart, and the
    // next batch follows on without a gap.
    tx.send(all[2].clone()).await.unwrap();
    tx.send(all[3].clone()).await.unwrap();
    assert!(eventually(10, async || index_blocks(&url, 0).await == 4).await);
    let w = &debug_workers(&url).await["workers"][0]["worker"];
    assert_eq!(
        (w["restarts"].as_u64(), w["gaps"].as_u64()),
        (Some(0), Some(0)),
        "{w}"
    );
    gw.shutdown().await;
    a.shutdown().await;
}

/// What an engine has published (what its replay service holds).
type Published = Arc<std::sync::Mutex<Vec<Arc<EventBatch>>>>;
/// The sending end of an engine's live feed.
type Live = tokio::sync::mpsc::Sender<Arc<EventBatch>>;

/// The engine's published batches (starting with `held`; the replay service answers from
/// them), the sender of its live feed, and the feed.
fn replayed_feed(held: Vec<Arc<EventBatch>>) -> (Published, Live, EventFeed) {
    let published = Arc::new(std::sync::Mutex::new(held));
    let buffer = published.clone();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let replay = BufferReplay(Arc::new(move |from| {
        let held = buffer.lock().unwrap();
        held.iter().filter(|b| b.seq >= from).cloned().collect()
    }));
    (
        published,
        tx,
        EventFeed::from_batches(rx, Some(Box::new(replay))),
    )
}

/// A one-block batch numbered `seq` whose block is token run `first`, decoded as a feed
/// delivers it.
fn one_block(seq: u64, first: u32) -> Arc<EventBatch> {
    let frames = stored_map(seq, first, 1, None);
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    Arc::new(kvroute_protocol::kv_events::decode_message(&refs).unwrap())
}

/// `kvroute_kv_events_total` of worker `a` for `type`/`result`.
async fn dropped(url: &str, kind: &str) -> f64 {
    let name = format!("kvroute_kv_events_total{{result=\"{kind}\",type=\"batch\",worker=\"a\"}}");
    kvroute_testkit::sample(&crate::scrape(url).await, &name).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_and_late_batches_are_dropped_without_wiping_the_index() {
    let a = worker("a").await;
    // Without a replay service: the numbers and the batches' content decide.
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let feed = EventFeed::from_batches(rx, None);
    let gw = gateway_with_feeds(config(&[&a], "kv"), BTreeMap::from([(0, feed)])).await;
    let url = gw.url();
    let batches: Vec<_> = (0..6).map(|s| one_block(s, 100 * (s as u32 + 1))).collect();
    for b in &batches[..3] {
        tx.send(b.clone()).await.unwrap();
    }
    assert!(eventually(10, async || index_blocks(&url, 0).await == 3).await);
    // Batch 1 again (a duplicated delivery).
    tx.send(batches[1].clone()).await.unwrap();
    assert!(eventually(10, async || dropped(&url, "duplicate").await == 1.0).await);
    // 4 overtakes 3 (3 counted lost, nothing to replay it from), then 3 comes late.
    tx.send(batches[4].clone()).await.unwrap();
    tx.send(batches[3].clone()).await.unwrap();
    assert!(eventually(10, async || dropped(&url, "stale").await == 1.0).await);
    assert_eq!(index_blocks(&url, 0).await, 4);
    tx.send(batches[5].clone()).await.unwrap();
    assert!(eventually(10, async || index_blocks(&url, 0).await == 5).await);
    let w = &debug_workers(&url).await["workers"][0]["worker"];
    assert_eq!(w["restarts"], 0, "{w}");
    // A real restart still clears: a batch 0 of other content.
    tx.send(one_block(0, 9000)).await.unwrap();
    assert!(eventually(10, async || index_blocks(&url, 0).await == 1).await);
    let w = &debug_workers(&url).await["workers"][0]["worker"];
    assert_eq!(w["restarts"], 1, "{w}");
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reordered_batch_is_replayed_once_and_a_stray_number_is_checked_with_the_replay() {
    let a = worker("a").await;
    let batches: Vec<_> = (0..4).map(|s| one_block(s, 100 * (s as u32 + 1))).collect();
    let (published, tx, feed) = replayed_feed(batches.clone());
    let gw = gateway_with_feeds(config(&[&a], "kv"), BTreeMap::from([(0, feed)])).await;
    let url = gw.url();
    // At start the replay brings 0..=3 in.
    assert!(eventually(10, async || index_blocks(&url, 0).await == 4).await);
    // 5 overtakes 4: the gap is filled from the replay, and 4 arriving late is a repeat.
    let more = [one_block(4, 500), one_block(5, 600)];
    published.lock().unwrap().extend(more.iter().cloned());
    tx.send(more[1].clone()).await.unwrap();
    assert!(eventually(10, async || index_blocks(&url, 0).await == 6).await);
    tx.send(more[0].clone()).await.unwrap();
    assert!(eventually(10, async || dropped(&url, "duplicate").await == 1.0).await);
    // A batch numbered 2 with other content: the replay says the engine is the same one,
    // so it is a stray and the index stays.
    tx.send(one_block(2, 7000)).await.unwrap();
    assert!(eventually(10, async || dropped(&url, "stale").await == 1.0).await);
    assert_eq!(index_blocks(&url, 0).await, 6);
    let w = &debug_workers(&url).await["workers"][0]["worker"];
    assert_eq!(w["restarts"], 0, "{w}");
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_reporting_more_blocks_than_the_limit_keeps_its_newest() {
    let a = worker("a").await;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let feed = EventFeed::from_batches(rx, None);
    let mut cfg = config(&[&a], "kv");
    cfg.router.max_blocks_per_worker = 4;
    let gw = gateway_with_feeds(cfg, BTreeMap::from([(0, feed)])).await;
    let url = gw.url();
    for seq in 0..6 {
        tx.send(one_block(seq, 100 * (seq as u32 + 1)))
            .await
            .unwrap();
    }
    assert!(
        eventually(10, async || {
            let w = &debug_workers(&url).await["workers"][0];
            w["index_evicted_blocks"] == 2
        })
        .await
    );
    assert_eq!(index_blocks(&url, 0).await, 4);
    let metrics = crate::scrape(&url).await;
    let evicted =
        kvroute_testkit::sample(&metrics, "kvroute_index_evicted_blocks_total{worker=\"a\"}");
    assert_eq!(evicted, Some(2.0), "{metrics}");
    gw.shutdown().await;
    a.shutdown().await;
}

/// A replay service that fails while `failing` is above 0 (counting down per call), then
/// answers from `held`.
struct FlakyReplay {
    failing: std::sync::atomic::AtomicUsize,
    held: Vec<Arc<EventBatch>>,
}

impl kvroute_events::Replay for FlakyReplay {
    fn replay_from(
        &self,
        from: u64,
    ) -> futures_util::future::BoxFuture<'_, Result<Vec<Arc<EventBatch>>, String>> {
        use std::sync::atomic::Ordering;
        let failed = self
            .failing
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let got: Vec<_> = self
            .held
            .iter()
            .filter(|b| b.seq >= from)
            .cloned()
            .collect();
        Box::pin(async move {
            if failed {
                Err("no responders".to_string())
            } else {
                Ok(got)
            }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_service_that_did_not_answer_is_asked_again_until_it_does() {
    use kvroute_events::FeedItem;
    let a = worker("a").await;
    let held: Vec<_> = (0..3).map(|s| one_block(s, 100 * (s as u32 + 1))).collect();
    let (tx, items) = tokio::sync::mpsc::channel(8);
    // The replay service does not answer at start (its relay not connected yet) nor when
    // asked again a second later; no live batch follows. The index is built all the same.
    let feed = EventFeed {
        items,
        replay: Some(Box::new(FlakyReplay {
            failing: 2.into(),
            held,
        })),
    };
    let gw = gateway_with_feeds(config(&[&a], "kv"), BTreeMap::from([(0, feed)])).await;
    let url = gw.url();
    let exact = async || {
        let w = &debug_workers(&url).await["workers"][0];
        w["index_blocks"] == 3 && w["worker"]["cache_state"] == "exact"
    };
    assert!(eventually(15, exact).await, "{}", debug_workers(&url).await);
    // The publisher goes away and comes back; the replay (answering now) catches up.
    tx.send(FeedItem::Disconnected).await.unwrap();
    assert!(
        eventually(10, async || debug_workers(&url).await["workers"][0]
            ["worker"]["cache_state"]
            == "unknown")
        .await
    );
    tx.send(FeedItem::Connected).await.unwrap();
    assert!(eventually(10, exact).await, "{}", debug_workers(&url).await);
    gw.shutdown().await;
    a.shutdown().await;
}
