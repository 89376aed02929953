//! Test fleets: a gateway and simulated workers on 127.0.0.1, and small conversations.
#![allow(dead_code)]

use kvroute_gateway::{EventFeed, GatewayConfig, GatewayHandle, WorkerSpec};
use kvroute_preprocess::Preprocessor;
use kvroute_worker::{WorkerConfig, WorkerHandle};
use kvroute_workload::ChatConfig;
use std::collections::BTreeMap;

/// `n` simulated workers (50x speed) behind a `kv` gateway, `tweak`ed.
pub async fn fleet(
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

pub fn small_chat() -> ChatConfig {
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
