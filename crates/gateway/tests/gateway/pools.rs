//! Several models behind one gateway (`[[pools]]`): two simulated models that differ in
//! tokenizer and block size, each on its own worker; a request's `model` picks the pool.

use super::support::*;
use kvroute_gateway::config::PoolConfig;
use kvroute_gateway::{EventFeed, GatewayConfig, GatewayHandle, PoolStart, WorkerSpec};
use kvroute_preprocess::Preprocessor;
use kvroute_worker::WorkerHandle;

const SMALL_MODEL: &str = "small-sim";

/// A worker of `model` with `pre`'s tokenizer and `block` tokens a block.
async fn model_worker(name: &str, model: &str, pre: Preprocessor, block: usize) -> WorkerHandle {
    let cfg = kvroute_worker::WorkerConfig {
        model: model.into(),
        profile: "tiny-fast".into(),
        speedup: 20.0,
        worker_name: name.into(),
        block_size: Some(block),
        ..Default::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    kvroute_worker::spawn(cfg, pre, listener, None)
        .await
        .unwrap()
}

fn pool(
    name: Option<&str>,
    model: &str,
    tokenizer: &str,
    block: usize,
    w: &WorkerHandle,
) -> PoolConfig {
    PoolConfig {
        name: name.map(str::to_string),
        models: vec![model.into()],
        tokenizer: Some(tokenizer.into()),
        router: Some(toml::from_str(&format!("block_size = {block}")).unwrap()),
        workers: vec![WorkerSpec {
            url: w.url(),
            name: Some(w.name().to_string()),
            ..WorkerSpec::default()
        }],
        ..PoolConfig::default()
    }
}

/// The builtin-tokenizer model (`MODEL`, block 16, worker `a`) and the `builtin-small` one
/// (pool `small`, block 32, worker `b`), each worker's events fed in process; and the
/// config.
async fn two_models() -> (WorkerHandle, WorkerHandle, GatewayHandle, GatewayConfig) {
    let a = model_worker("a", MODEL, Preprocessor::builtin(), 16).await;
    let b = model_worker("b", SMALL_MODEL, Preprocessor::builtin_small(), 32).await;
    let mut config = GatewayConfig {
        port: 0,
        pools: vec![
            pool(None, MODEL, "builtin", 16, &a),
            pool(Some("small"), SMALL_MODEL, "builtin-small", 32, &b),
        ],
        ..GatewayConfig::default()
    };
    config.health.interval_secs = 0.2;
    let given = config.clone();
    let starts = [&a, &b]
        .into_iter()
        .zip(config.pools().unwrap())
        .map(|(w, p)| PoolStart {
            preprocessor: kvroute_gateway::load_preprocessor(&p.config).unwrap(),
            feeds: [(0, EventFeed::from_broadcast(w.subscribe(), None))].into(),
        })
        .collect();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = kvroute_gateway::spawn_pools(config, starts, listener)
        .await
        .unwrap();
    (a, b, gw, given)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_model_is_routed_by_its_own_tokenizer_and_block_size() {
    let (_a, _b, gw, _) = two_models().await;
    let url = gw.url();
    let models = kvroute_testkit::get_json(&client(), &format!("{url}/v1/models")).await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [MODEL, SMALL_MODEL]);

    let text = "Tell me about the routing of requests to the replica that holds their prefix, \
                with the load of each replica weighed against the prefill a cached prefix saves.";
    for (model, worker, block) in [(MODEL, "a", 16), (SMALL_MODEL, "b", 32)] {
        let (first, _, _) = ask_cached(&url, model, None, text).await;
        assert_eq!(first, worker, "{model} goes to its own pool's worker");
        // The follow-up: the router predicts what the engine reports cached, in the pool's
        // own blocks of its own tokens.
        assert!(
            eventually(10, async || {
                let (w, predicted, cached) = ask_cached(&url, model, None, text).await;
                w == worker && predicted > 0 && predicted == cached
            })
            .await,
            "{model}: the follow-up hits its cache as predicted"
        );
        let (_, predicted, _) = ask_cached(&url, model, None, text).await;
        assert_eq!(predicted % block, 0, "{model}: whole blocks of {block}");
    }
    // The small tokenizer cuts the same text into more tokens: its cached prefix is longer.
    let (_, small, _) = ask_cached(&url, MODEL, None, text).await;
    let (_, more, _) = ask_cached(&url, SMALL_MODEL, None, text).await;
    assert!(more > small, "builtin-small {more} vs builtin {small}");

    // An unknown model: 404, as with one pool.
    let mut body = chat(&[("user", "hi")], false, 2);
    body["model"] = "nope".into();
    let (status, _, json) = post(&url, "/v1/chat/completions", &body).await;
    assert_eq!(status, 404, "{json}");

    // Metrics per model: every pool's series labelled with its name.
    let text = super::scrape(&url).await;
    for pool in [MODEL, "small"] {
        assert!(
            text.contains(&format!("kvroute_inflight_requests{{model=\"{pool}\"}}")),
            "{pool}: {text}"
        );
    }
    assert!(text.contains(&format!(
        "kvroute_requests_total{{model=\"{SMALL_MODEL}\",status=\"200\"}}"
    )));
    assert_eq!(text.matches("# TYPE kvroute_inflight_requests ").count(), 1);

    // The debug view of one pool, by its name or a model it serves.
    for q in ["small", SMALL_MODEL] {
        let v =
            kvroute_testkit::get_json(&client(), &format!("{url}/debug/workers?model={q}")).await;
        assert_eq!(v["model"], "small");
        assert_eq!(v["workers"].as_array().unwrap().len(), 1);
        assert_eq!(v["workers"][0]["worker"]["name"], "b");
    }
    let r = client()
        .get(format!("{url}/debug/workers?model=nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains(&format!("{MODEL}, small")));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_each_pool_and_names_a_new_pool_for_a_restart() {
    let (_a, b, gw, config) = two_models().await;
    // The second pool's admission mode: applied to it alone.
    let mut new = config.clone();
    new.pools[1].router =
        Some(toml::from_str("block_size = 32\nadmission = { mode = \"shed\" }").unwrap());
    let report = gw.reload(new.clone()).unwrap();
    assert_eq!(report.applied, ["router.admission.mode"], "{report:?}");
    // Counted once for the gateway, without a pool's label.
    let text = super::scrape(&gw.url()).await;
    assert!(
        text.contains("kvroute_config_reloads_total{result=\"applied\"} 1"),
        "{text}"
    );
    assert!(report.restart.is_empty(), "{report:?}");
    // A pool added: named for a restart, the others applied.
    let mut more = new.clone();
    more.pools
        .push(pool(Some("third"), "third-sim", "builtin", 16, &b));
    let report = gw.reload(more).unwrap();
    assert!(report.restart.iter().any(|k| k == "pools"), "{report:?}");
    // An invalid one (a model in two pools): refused whole, the pools serve on.
    let mut bad = new.clone();
    bad.pools[1].models.push(MODEL.into());
    assert!(gw.reload(bad).is_err());
    let (w, _, _) = ask_cached(&gw.url(), SMALL_MODEL, None, "still here").await;
    assert_eq!(w, "b");
    gw.shutdown().await;
}

/// The names of the workers of pool `model` (`/debug/workers?model=`), sorted.
async fn pool_workers(url: &str, model: &str) -> Vec<String> {
    let v =
        kvroute_testkit::get_json(&client(), &format!("{url}/debug/workers?model={model}")).await;
    let mut names: Vec<String> = (v["workers"].as_array().unwrap().iter())
        .map(|w| w["worker"]["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_shared_between_pools_sends_each_engine_to_its_models_pool() {
    let a = model_worker("a", MODEL, Preprocessor::builtin(), 16).await;
    let b = model_worker("b", SMALL_MODEL, Preprocessor::builtin_small(), 32).await;
    // Serves a model no pool serves: asked, it joins none.
    let x = model_worker("x", "other-sim", Preprocessor::builtin(), 16).await;
    // Also "other-sim", but its entry names the small model: the source's word is taken
    // without asking.
    let c = model_worker("c", "other-sim", Preprocessor::builtin(), 16).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("workers.toml");
    let entry = |w: &WorkerHandle, model: Option<&str>| {
        let model = model
            .map(|m| format!("model = \"{m}\"\n"))
            .unwrap_or_default();
        format!(
            "[[workers]]\nurl = \"{}\"\nname = \"{}\"\n{model}\n",
            w.url(),
            w.name()
        )
    };
    let all = [
        entry(&a, None),
        entry(&b, None),
        entry(&x, None),
        entry(&c, Some(SMALL_MODEL)),
    ];
    std::fs::write(&file, all.concat()).unwrap();
    let no_workers = |p: PoolConfig| PoolConfig {
        workers: Vec::new(),
        ..p
    };
    let mut config = GatewayConfig {
        port: 0,
        pools: vec![
            no_workers(pool(None, MODEL, "builtin", 16, &a)),
            no_workers(pool(Some("small"), SMALL_MODEL, "builtin-small", 32, &b)),
        ],
        ..GatewayConfig::default()
    };
    config.discovery.file = Some(file.clone());
    config.discovery.interval_secs = 0.1;
    config.health.interval_secs = 0.2;
    let starts = config
        .pools()
        .unwrap()
        .iter()
        .map(|p| PoolStart {
            preprocessor: kvroute_gateway::load_preprocessor(&p.config).unwrap(),
            feeds: Default::default(),
        })
        .collect();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = kvroute_gateway::spawn_pools(config.clone(), starts, listener)
        .await
        .unwrap();
    let url = gw.url();
    assert!(eventually(10, async || pool_workers(&url, MODEL).await == ["a"]).await);
    assert!(eventually(10, async || pool_workers(&url, "small").await == ["b", "c"]).await);
    let (w, _, _) = ask_cached(&url, MODEL, None, "which pool").await;
    assert_eq!(w, "a");
    // b leaves the file: it leaves its pool; the others stay where they are.
    std::fs::write(
        &file,
        [&all[0], &all[2], &all[3]].map(String::as_str).concat(),
    )
    .unwrap();
    assert!(eventually(10, async || pool_workers(&url, "small").await == ["c"]).await);
    assert_eq!(pool_workers(&url, MODEL).await, ["a"]);
    // The shared sources change only with a restart.
    let mut new = config.clone();
    new.discovery.interval_secs = 0.5;
    let report = gw.reload(new).unwrap();
    assert!(
        report.restart.iter().any(|k| k == "discovery"),
        "{report:?}"
    );
    gw.shutdown().await;
    for w in [a, b, x, c] {
        w.shutdown().await;
    }
}
