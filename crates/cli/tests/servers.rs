//! `kvroute worker`, `kvroute serve` and `kvroute demo` as processes on 127.0.0.1: KV events
//! over real ZMQ sockets between processes, and a clean stop on Ctrl-C (SIGINT).

#[path = "common/server.rs"]
mod server;

use kvroute_testkit::{eventually, get_json};
use server::Server;
use std::time::Duration;

async fn chat(url: &str, messages: serde_json::Value) -> (String, serde_json::Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .json(&serde_json::json!({"model": "kvroute-sim", "messages": messages, "max_tokens": 8}))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let worker = r.headers()["x-kvroute-worker"]
        .to_str()
        .unwrap()
        .to_string();
    (worker, r.json().await.unwrap())
}

#[tokio::test]
async fn gateway_and_workers_as_processes_share_kv_events_over_zmq() {
    let mut workers = Vec::new();
    let mut specs = Vec::new();
    for name in ["w1", "w2"] {
        let (w, spec) = server::zmq_worker(name);
        specs.push(spec);
        workers.push(w);
    }
    let mut args = vec![
        "serve",
        "--port",
        "0",
        "--policy",
        "kv",
        "--tokenizer",
        "builtin",
        "--block-size",
        "16",
    ];
    for s in &specs {
        args.extend(["--worker", s.as_str()]);
    }
    let gw = Server::start(&args);
    let url = gw.value_after("kvroute gateway on ");

    let system = "You are a helpful assistant who answers briefly. ".repeat(10);
    let turn1 = serde_json::json!([{"role": "system", "content": system}, {"role": "user", "content": "hi"}]);
    let (w1, answer) = chat(&url, turn1.clone()).await;
    let reply = answer["choices"][0]["message"]["content"].clone();
    let mut turn2 = turn1.as_array().unwrap().clone();
    turn2.push(serde_json::json!({"role": "assistant", "content": reply}));
    turn2.push(serde_json::json!({"role": "user", "content": "and then?"}));
    // The first turn's blocks reach the index over ZMQ (the subscription may still be
    // joining when the first events go out: poll the router's view).
    let client = reqwest::Client::new();
    let indexed = eventually(Duration::from_secs(15), async || {
        let v = get_json(&client, &format!("{url}/debug/workers")).await;
        v["workers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["index_blocks"].as_u64() > Some(0))
    })
    .await;
    assert!(indexed, "no KV events reached the gateway");
    let (w2, answer2) = chat(&url, serde_json::Value::Array(turn2)).await;
    assert_eq!(w1, w2);
    assert!(
        answer2["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(100),
        "{answer2}"
    );
    assert!(gw.interrupt(), "the gateway did not stop cleanly");
    for w in workers {
        assert!(w.interrupt(), "a worker did not stop cleanly");
    }
}

#[tokio::test]
async fn the_demo_answers_and_stops_on_ctrl_c() {
    let demo = Server::start(&["demo", "--port", "0", "--ui-port", "0", "--speedup", "20"]);
    let url = demo.value_after("gateway ");
    let (_, answer) = chat(
        &url,
        serde_json::json!([{"role": "user", "content": "Hello!"}]),
    )
    .await;
    assert_eq!(answer["usage"]["completion_tokens"], 8);
    // The dashboard: pages of the app (or the page saying how to build it), its API.
    let ui = demo.value_after("dashboard ");
    let ui = ui.trim_end_matches('/');
    for page in ["/", "/conversations", "/conversations/3"] {
        let r = reqwest::get(format!("{ui}{page}")).await.unwrap();
        assert_eq!(r.status(), 200, "{page}");
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html"));
        assert!(r.text().await.unwrap().contains("<html"));
    }
    for missing in ["/api/nothing", "/assets/nothing.js"] {
        let r = reqwest::get(format!("{ui}{missing}")).await.unwrap();
        assert_eq!(r.status(), 404, "{missing}");
    }
    let client = reqwest::Client::new();
    let status = get_json(&client, &format!("{ui}/api/status")).await;
    assert_eq!(status["running"], false, "the demo's load waits for Start");
    assert_eq!(status["concurrency"], 60);
    // The live A/B: the default policy's fleet, and an identical one behind round-robin.
    assert_eq!(status["arms"][0]["target"], url.as_str(), "{status}");
    assert_eq!(status["arms"][0]["name"], "goodput", "{status}");
    assert_eq!(status["arms"][1]["name"], "round_robin", "{status}");
    assert_eq!(status["arms"][1]["baseline"], true, "{status}");
    let baseline_url = status["arms"][1]["target"].as_str().unwrap().to_string();
    assert_ne!(baseline_url, url);
    let (_, answer) = chat(
        &baseline_url,
        serde_json::json!([{"role": "user", "content": "Hello!"}]),
    )
    .await;
    assert_eq!(answer["usage"]["completion_tokens"], 8);
    let workers = get_json(&client, &format!("{baseline_url}/debug/workers")).await;
    assert_eq!(workers["policy"], "round_robin", "{workers}");
    // This fleet is not the default one: no shipped reference is shown for it.
    let config = get_json(&client, &format!("{ui}/api/config")).await;
    assert_eq!(
        config["dashboard"]["baselines"],
        serde_json::json!([]),
        "{config}"
    );
    // Nothing measured yet: no baseline file to save.
    let r = reqwest::get(format!("{ui}/api/baseline?arm=round_robin"))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(demo.interrupt(), "the demo did not stop cleanly");
}

#[tokio::test]
async fn loadgen_serves_its_control_api_until_ctrl_c() {
    let demo = Server::start(&["demo", "--port", "0", "--ui-port", "0", "--speedup", "50"]);
    let url = demo.value_after("gateway ");
    let loadgen = Server::start(&[
        "loadgen",
        "--target",
        &url,
        "--ui-port",
        "0",
        "--idle",
        "--concurrency",
        "2",
        "--max-tokens",
        "16",
    ]);
    let status = loadgen.value_after("control API ");
    let api = status.trim_end_matches("/api/status").to_string();
    let client = reqwest::Client::new();
    let get = async |path: &str| get_json(&client, &format!("{api}{path}")).await;
    assert_eq!(get("/api/status").await["running"], false);
    let r = client
        .post(format!("{api}/api/start"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut completed = 0;
    while completed < 2 && std::time::Instant::now() < deadline {
        completed = get("/api/status").await["arms"][0]["totals"]["completed"]
            .as_u64()
            .unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(completed >= 2, "no turns completed");
    assert!(loadgen.interrupt(), "loadgen did not stop cleanly");
    assert!(demo.interrupt(), "the demo did not stop cleanly");
}

/// `kvroute demo --config FILE --admission MODE`: the demo's gateways start from a gateway
/// config file (here: a worker is busy from its first request in flight) and the flag's
/// admission mode wins over the file's (`shed`: a request finding every worker busy is
/// refused at once, the load-shedding study's scenario); a config that cannot be read is
/// said in words.
#[tokio::test]
async fn the_demo_takes_a_gateway_config_and_an_admission_mode() {
    let dir = std::env::temp_dir().join(format!("kvroute-demo-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("gateway.toml");
    std::fs::write(
        &config,
        "[router.admission]\nmode = \"queue\"\nbusy_batch_fraction = 0.01\n",
    )
    .unwrap();
    let demo = Server::start(&[
        "demo",
        "--port",
        "0",
        "--no-ui",
        "--workers",
        "1",
        "--baseline-policy",
        "none",
        "--speedup",
        "2",
        "--config",
        config.to_str().unwrap(),
        "--admission",
        "shed",
    ]);
    let url = demo.value_after("gateway ");
    let client = reqwest::Client::new();
    let send = |max_tokens: u32| {
        client
            .post(format!("{url}/v1/chat/completions"))
            .json(
                &serde_json::json!({"model": "kvroute-sim", "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": "Hello!"}]}),
            )
            .timeout(Duration::from_secs(60))
            .send()
    };
    let long = tokio::spawn(send(300));
    let busy = eventually(Duration::from_secs(10), async || {
        let v = get_json(&client, &format!("{url}/debug/workers")).await;
        v["workers"][0]["load"]["inflight"].as_u64() == Some(1)
    })
    .await;
    assert!(busy, "the long request did not start");
    let refused = send(8).await.unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "all_workers_busy", "{body}");
    assert_eq!(long.await.unwrap().unwrap().status(), 200);
    assert!(demo.interrupt(), "the demo did not stop cleanly");
    // A config file that is not there: a sentence and a failing exit, no panic.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args(["demo", "--port", "0", "--no-ui", "--config"])
        .arg(dir.join("missing.toml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("missing.toml") && !err.contains("panicked"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `kvroute demo --pools 2`: each gateway serves two models, each on its own workers with
/// its own tokenizer and block size; a request's `model` picks the pool; a pool count out
/// of range is said in words.
#[tokio::test]
async fn the_demo_serves_several_models() {
    let demo = Server::start(&[
        "demo",
        "--port",
        "0",
        "--no-ui",
        "--workers",
        "1",
        "--pools",
        "2",
        "--baseline-policy",
        "none",
        "--speedup",
        "20",
    ]);
    let url = demo.value_after("gateway ");
    let client = reqwest::Client::new();
    let models = get_json(&client, &format!("{url}/v1/models")).await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["kvroute-sim", "kvroute-sim-2"], "{models}");
    for (model, worker, block) in [
        ("kvroute-sim", "worker-1", 16),
        ("kvroute-sim-2", "m2-worker-1", 32),
    ] {
        let r = client
            .post(format!("{url}/v1/chat/completions"))
            .json(&serde_json::json!({"model": model, "max_tokens": 4,
                "messages": [{"role": "user", "content": "Hello!"}]}))
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-kvroute-worker"], worker);
        let v = get_json(&client, &format!("{url}/debug/workers?model={model}")).await;
        assert_eq!(v["workers"][0]["worker"]["name"], worker, "{v}");
        assert_eq!(v["workers"].as_array().map(Vec::len), Some(1));
        let explain = client
            .post(format!("{url}/debug/explain"))
            .json(&serde_json::json!({"model": model, "prompt": "Hello there"}))
            .send()
            .await
            .unwrap();
        let e: serde_json::Value = explain.json().await.unwrap();
        assert_eq!(e["block_size"], block, "{e}");
    }
    assert!(demo.interrupt(), "the demo did not stop cleanly");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args(["demo", "--port", "0", "--no-ui", "--pools", "9"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--pools must be within 1..=4"), "{err}");
}
