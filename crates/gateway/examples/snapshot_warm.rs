//! How long a gateway takes to start warm from a snapshot of 1M blocks (issue target: within
//! 1 s): a real `nats-server` (JetStream) on 127.0.0.1, a worker's index of N blocks
//! exported, packed and written to the object store; then read back, decoded and applied
//! to an empty router in the chunks a starting gateway uses. Medians of 5 rounds.
//!
//! `cargo run --release -p kvroute-gateway --example snapshot_warm [BLOCKS]`

use async_nats::jetstream::{self, object_store};
use kvroute_core::{
    EngineHash, KvEvent, Router, RouterConfig, SequenceHash, StoredHashed, WorkerId,
};
use kvroute_protocol::plane::{to_bytes, Snapshot, VERSION};
use std::time::Instant;
use tokio::io::AsyncReadExt;

fn router() -> Router {
    let mut r = Router::new(RouterConfig {
        block_size: 16,
        max_blocks_per_worker: 4_000_000,
        ..RouterConfig::default()
    })
    .unwrap();
    r.add_worker(WorkerId(1), Default::default()).unwrap();
    r
}

fn apply(r: &mut Router, pairs: &[(EngineHash, SequenceHash)]) {
    for chunk in pairs.chunks(65_536) {
        let (names, seqs): (Vec<_>, Vec<_>) = chunk.iter().copied().unzip();
        r.apply_event(
            WorkerId(1),
            &KvEvent::StoredHashed(StoredHashed {
                parent: None,
                block_hashes: names,
                sequence_hashes: seqs,
            }),
        )
        .unwrap();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(1_000_000, |a| a.parse().unwrap());
    let nats = kvroute_testkit::nats::NatsServer::start().expect("nats-server is needed");
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = jetstream::new(client);
    let store = js
        .create_object_store(object_store::Config {
            bucket: "BENCH".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut source = router();
    let pairs: Vec<(EngineHash, SequenceHash)> = (0..n as u64)
        .map(|i| {
            (
                EngineHash(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                SequenceHash(kvroute_core::hashing::splitmix64(i)),
            )
        })
        .collect();
    apply(&mut source, &pairs);
    let (mut write, mut read, mut load, mut total) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut size = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let exported = source.export_worker(WorkerId(1));
        let snap = Snapshot {
            v: VERSION,
            worker: "w".into(),
            seq: 1,
            digest: 2,
            taken_ns: 3,
            blocks: Snapshot::pack(exported.iter().map(|(e, s)| (e.0, s.0))),
        };
        let bytes = to_bytes(&snap);
        size = bytes.len();
        store.put("w", &mut bytes.as_slice()).await.unwrap();
        write.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut buf = Vec::new();
        store
            .get("w")
            .await
            .unwrap()
            .read_to_end(&mut buf)
            .await
            .unwrap();
        read.push(t.elapsed().as_secs_f64());
        let t2 = Instant::now();
        let snap = Snapshot::decode(&buf).unwrap();
        let got: Vec<(EngineHash, SequenceHash)> = snap
            .pairs()
            .unwrap()
            .map(|(e, s)| (EngineHash(e), SequenceHash(s)))
            .collect();
        let mut fresh = router();
        apply(&mut fresh, &got);
        assert_eq!(fresh.cached_blocks(WorkerId(1)), n);
        load.push(t2.elapsed().as_secs_f64());
        total.push(t.elapsed().as_secs_f64());
    }
    println!(
        "{n} blocks, snapshot {:.1} MiB: write (export + put) {:.3} s; start warm: read {:.3} s + decode and apply {:.3} s = {:.3} s (medians of 5)",
        size as f64 / (1 << 20) as f64,
        median(write),
        median(read),
        median(load),
        median(total)
    );
}
