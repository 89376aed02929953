//! The load generator against a real gateway and simulated workers on 127.0.0.1.

use kvroute_gateway::{EventFeed, GatewayConfig, GatewayHandle, WorkerSpec};
use kvroute_loadgen::{run, LoadgenConfig};
use kvroute_preprocess::Preprocessor;
use kvroute_worker::{WorkerConfig, WorkerHandle};
use kvroute_workload::{ChatConfig, Status, Summary};
use std::collections::BTreeMap;

async fn fleet(
    n: usize,
    tweak: impl FnOnce(&mut GatewayConfig),
) -> (Vec<WorkerHandle>, GatewayHandle) {
    let mut workers = Vec::new();
    for i in 0..n {
        let cfg = WorkerConfig {
            speedup: 50.0,
            worker_name: format!("w{i}"),
            ..WorkerConfig::default()
        };
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        workers.push(
            kvroute_worker::spawn(cfg, Preprocessor::builtin(), l, None)
                .await
                .unwrap(),
        );
    }
    let mut config = GatewayConfig {
        port: 0,
        tokenizer: Some("builtin".into()),
        workers: workers
            .iter()
            .map(|w| WorkerSpec {
                url: w.url(),
                name: Some(w.name().to_string()),
                ..WorkerSpec::default()
            })
            .collect(),
        ..GatewayConfig::default()
    };
    config.router.block_size = 16;
    config.router.policy.kind = kvroute_core::PolicyKind::Kv;
    tweak(&mut config);
    let feeds: BTreeMap<usize, EventFeed> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| (i, EventFeed::from_broadcast(w.subscribe(), None)))
        .collect();
    let pre = kvroute_gateway::load_preprocessor(&config).unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = kvroute_gateway::spawn(config, pre, l, feeds).await.unwrap();
    (workers, gw)
}

fn small_chat() -> ChatConfig {
    ChatConfig {
        starters: 4,
        starter_min_words: 150,
        starter_max_words: 200,
        min_turns: 3,
        max_turns: 3,
        max_tokens: 8,
        ..ChatConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_progress_and_later_turns_hit_the_cache() {
    let (workers, gw) = fleet(2, |_| {}).await;
    let result = run(LoadgenConfig {
        target: gw.url(),
        concurrency: 3,
        conversations: 6,
        chat: small_chat(),
        ..LoadgenConfig::default()
    })
    .await
    .unwrap();
    assert_eq!(result.records.len(), 18);
    assert!(
        result.records.iter().all(|r| r.status == Status::Completed),
        "{:?}",
        result.records
    );
    let (mut later, mut hit) = (0, 0);
    for (rec, t) in result.records.iter().zip(&result.turns) {
        assert_eq!(rec.output_tokens, 8);
        assert!(rec.ttft().is_some() && rec.input_tokens > 100);
        if t.turn > 1 {
            later += 1;
            // A follow-up may go elsewhere when its worker is loaded; most find their prefix.
            hit += usize::from(rec.cached_tokens > 100);
        }
    }
    assert!(
        hit * 4 >= later * 3,
        "{hit} of {later} later turns hit the cache"
    );
    let summary = Summary::from_records(&result.records, result.duration);
    assert_eq!((summary.sent, summary.completed), (18, 18));
    assert!(summary.hit_rate.unwrap() > 0.5, "{:?}", summary.hit_rate);
    // The gateway says what it expected cached; it is close to what the workers found.
    let ratio = summary.prediction_ratio.unwrap();
    assert!((0.8..=1.2).contains(&ratio), "predicted / cached {ratio}");
    assert_eq!(result.workers.len(), 2);
    gw.shutdown().await;
    for w in workers {
        w.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shed_turns_are_counted_not_hidden() {
    let (workers, gw) = fleet(1, |c| {
        c.router.admission.mode = kvroute_core::AdmissionMode::Shed;
        c.workers[0].max_batch = Some(1);
    })
    .await;
    let mut chat = small_chat();
    chat.max_tokens = 200;
    let result = run(LoadgenConfig {
        target: gw.url(),
        concurrency: 4,
        conversations: 8,
        chat,
        ..LoadgenConfig::default()
    })
    .await
    .unwrap();
    let summary = Summary::from_records(&result.records, result.duration);
    assert!(summary.rejected > 0, "{summary:?}");
    assert_eq!(summary.sent, result.records.len() as u64);
    assert_eq!(
        summary.sent,
        summary.completed + summary.failed + summary.rejected
    );
    assert!(
        summary.rejected_by_reason.contains_key("all_workers_busy"),
        "{:?}",
        summary.rejected_by_reason
    );
    // TTFT over all sent requests counts the rejections as infinite.
    if summary.rejected * 100 >= summary.sent {
        assert_eq!(summary.ttft_all_ms.p99, Some(f64::INFINITY));
    }
    gw.shutdown().await;
    for w in workers {
        w.shutdown().await;
    }
}

#[tokio::test]
async fn bad_settings_are_refused() {
    for c in [
        LoadgenConfig {
            target: "localhost:1".into(),
            ..LoadgenConfig::default()
        },
        LoadgenConfig {
            concurrency: 0,
            ..LoadgenConfig::default()
        },
        LoadgenConfig {
            conversations: 0,
            ..LoadgenConfig::default()
        },
    ] {
        assert!(run(c).await.is_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_changes_take_effect_without_cutting_conversations() {
    let (workers, gw) = fleet(2, |_| {}).await;
    let mut chat = small_chat();
    chat.max_tokens = 40;
    let config = LoadgenConfig {
        target: gw.url(),
        concurrency: 1,
        conversations: 12,
        chat,
        ..LoadgenConfig::default()
    };
    let observer = std::sync::Arc::new(kvroute_loadgen::Observer::new(&config.observer));
    let (control, running) = kvroute_loadgen::start(config, observer).unwrap();
    // Let two turns go through at concurrency 1, then raise it.
    let served = || async {
        let text = reqwest::get(format!("{}/metrics", gw.url()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|l| l.starts_with("kvroute_requests_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>()
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while served().await < 2.0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    control.set_concurrency(4);
    assert_eq!(control.concurrency(), 4);
    let result = running.await.unwrap();
    // Every conversation ran all its turns.
    assert_eq!(result.records.len(), 36);
    assert!(result.records.iter().all(|r| r.status == Status::Completed));
    // The most turns in flight at once, from the records: 1 for the first two, more after.
    let overlap = |recs: &[kvroute_workload::RequestRecord]| {
        let mut edges: Vec<(kvroute_core::Time, i32)> = recs
            .iter()
            .flat_map(|r| [(r.arrival, 1), (r.finished.unwrap(), -1)])
            .collect();
        edges.sort_by_key(|&(t, d)| (t, d));
        let (mut now, mut most) = (0, 0);
        for (_, d) in edges {
            now += d;
            most = most.max(now);
        }
        most
    };
    let mut by_arrival = result.records.clone();
    by_arrival.sort_by_key(|r| r.arrival);
    assert_eq!(overlap(&by_arrival[..2]), 1);
    assert!(
        overlap(&by_arrival) > 1,
        "never more than one turn in flight"
    );
    gw.shutdown().await;
    for w in workers {
        w.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_replays_on_schedule_and_shared_blocks_hit_the_cache() {
    let (workers, gw) = fleet(2, |_| {}).await;
    let trace = r#"{"timestamp": 0, "input_length": 200, "output_length": 4, "hash_ids": [1, 2, 3, 4]}
{"timestamp": 400, "input_length": 300, "output_length": 4, "hash_ids": [1, 2, 3, 4, 5]}
{"timestamp": 800, "input_length": 120, "output_length": 4, "hash_ids": [9, 10]}
{"timestamp": 1200, "input_length": 350, "output_length": 4, "hash_ids": [1, 2, 3, 4, 5, 6]}
"#;
    let options = kvroute_workload::TraceOptions {
        speedup: 2.0,
        block_tokens: 64,
        ..Default::default()
    };
    let requests = kvroute_workload::mooncake::parse_str(trace, &options).unwrap();
    let result = kvroute_loadgen::replay(
        kvroute_loadgen::ReplayConfig {
            target: gw.url(),
            // One at a time, so a request's blocks are cached (and indexed) before the next
            // one is routed, however loaded the machine is.
            max_in_flight: 1,
            ..Default::default()
        },
        requests,
    )
    .await
    .unwrap();
    let mut recs = result.records.clone();
    recs.sort_by_key(|r| r.arrival);
    assert_eq!(recs.len(), 4);
    assert!(
        recs.iter().all(|r| r.status == Status::Completed),
        "{recs:?}"
    );
    // On schedule: 0, 200, 400, 600 ms (timestamps in ms at speed-up 2).
    let ms: Vec<u128> = recs.iter().map(|r| r.arrival.0.as_millis()).collect();
    assert_eq!(ms, vec![0, 200, 400, 600]);
    assert_eq!(
        recs.iter().map(|r| r.input_tokens).collect::<Vec<_>>(),
        vec![200, 300, 120, 350]
    );
    assert_eq!(recs[0].cached_tokens, 0);
    // Request 1 held 200 tokens: 12 full blocks of 16 (192) are shared with request 2;
    // request 2 held 300: 18 full blocks (288) are shared with request 4.
    assert_eq!(recs[1].cached_tokens, 192, "{:?}", recs[1]);
    assert_eq!(recs[3].cached_tokens, 288, "{:?}", recs[3]);
    gw.shutdown().await;
    for w in workers {
        w.shutdown().await;
    }
}
