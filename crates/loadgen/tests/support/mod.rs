//! Test fleets: a gateway and simulated workers on 127.0.0.1, and small conversations.
#![allow(dead_code)]

use kvroute_gateway::{EventFeed, GatewayConfig, GatewayHandle, WorkerSpec};
use kvroute_preprocess::Preprocessor;
use kvroute_worker::{WorkerConfig, WorkerHandle};
use kvroute_workload::ChatConfig;
use std::collections::BTreeMap;

/// A simulated worker of `model` (50x speed, the builtin tokenizer) named `name`.
pub async fn sim_worker(name: &str, model: &str) -> WorkerHandle {
    let cfg = WorkerConfig {
        speedup: 50.0,
        worker_name: name.into(),
        model: model.into(),
        ..WorkerConfig::default()
    };
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    kvroute_worker::spawn(cfg, Preprocessor::builtin(), l, None)
        .await
        .unwrap()
}

/// `n` simulated workers (50x speed) behind a `kv` gateway, `tweak`ed.
pub async fn fleet(
    n: usize,
    tweak: impl FnOnce(&mut GatewayConfig),
) -> (Vec<WorkerHandle>, GatewayHandle) {
    let mut workers = Vec::new();
    for i in 0..n {
        workers.push(sim_worker(&format!("w{i}"), &WorkerConfig::default().model).await);
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

/// A gateway serving two models, one pool each: `kvroute-sim` on worker `w0` and
/// `kvroute-sim-2` on worker `m2` (50x speed).
pub async fn two_models() -> (Vec<WorkerHandle>, GatewayHandle) {
    let mut workers = Vec::new();
    for (name, model) in [("w0", "kvroute-sim"), ("m2", "kvroute-sim-2")] {
        workers.push(sim_worker(name, model).await);
    }
    let pool = |w: &WorkerHandle, model: &str| kvroute_gateway::config::PoolConfig {
        models: vec![model.into()],
        workers: vec![WorkerSpec {
            url: w.url(),
            name: Some(w.name().to_string()),
            ..WorkerSpec::default()
        }],
        ..Default::default()
    };
    let mut config = GatewayConfig {
        port: 0,
        tokenizer: Some("builtin".into()),
        pools: vec![
            pool(&workers[0], "kvroute-sim"),
            pool(&workers[1], "kvroute-sim-2"),
        ],
        ..GatewayConfig::default()
    };
    config.router.block_size = 16;
    let starts = (workers.iter().zip(config.pools().unwrap()))
        .map(|(w, p)| kvroute_gateway::PoolStart {
            preprocessor: kvroute_gateway::load_preprocessor(&p.config).unwrap(),
            feeds: [(0, EventFeed::from_broadcast(w.subscribe(), None))].into(),
        })
        .collect();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = kvroute_gateway::spawn_pools(config, starts, l)
        .await
        .unwrap();
    (workers, gw)
}

/// The gateway's `/metrics` text.
pub async fn metrics_text(gw: &GatewayHandle) -> String {
    reqwest::get(format!("{}/metrics", gw.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}
