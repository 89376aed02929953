//! Scale-out as processes on 127.0.0.1 around a real `nats-server` (JetStream): three
//! simulated engines, a `kvroute relay` beside each, three `kvroute serve` gateways reading
//! the events from the plane and sharing their load. Conversations spread over the gateways
//! hit the cache as through one gateway; every gateway books the same load; a gateway killed
//! with SIGKILL costs the others nothing and its bookings expire; a gateway started mid-run
//! routes with a warm index; `nats-server` killed and restarted loses no event, and each
//! relay's probes say so (`/ready` 503 naming NATS while it is away, `/live` 200 throughout).

#[path = "common/server.rs"]
mod server;

use kvroute_testkit::nats::NatsServer;
use kvroute_testkit::{eventually, get_json, get_text, sample};
use server::Server;
use std::time::Duration;

struct Engine {
    _worker: Server,
    _relay: Server,
    url: String,
    /// The relay's probes (`/live`, `/ready`, `/metrics`).
    probes: String,
}

fn engine(nats: &NatsServer, i: usize) -> Engine {
    let (worker, spec) = server::zmq_worker(&format!("w{i}"));
    let mut parts = spec.splitn(3, '=').map(str::to_string);
    let (url, events, replay) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let name = url.trim_start_matches("http://").to_string();
    let relay = Server::start(&[
        "relay",
        "--worker",
        &name,
        "--events",
        &events,
        "--replay",
        &replay,
        "--nats",
        &nats.url(),
        "--http-port",
        "0",
    ]);
    let probes = relay.value_after("kvroute relay probes on ");
    relay.value_after("kvroute relay: ");
    Engine {
        _worker: worker,
        _relay: relay,
        url,
        probes,
    }
}

/// A relay's `/ready` answer: its status and body.
async fn ready(e: &Engine) -> (u16, serde_json::Value) {
    let r = client()
        .get(format!("{}/ready", e.probes))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// A gateway process reading `engines`' events from the plane, sharing its load.
fn gateway(nats: &NatsServer, engines: &[Engine], config: &std::path::Path) -> (Server, String) {
    let mut args: Vec<String> = [
        "serve",
        "--port",
        "0",
        "--policy",
        "kv",
        "--tokenizer",
        "builtin",
        "--block-size",
        "16",
        "--nats",
        &nats.url(),
        "--config",
        config.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for e in engines {
        args.extend(["--worker".into(), format!("{}=nats", e.url)]);
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let gw = Server::start(&refs);
    let url = gw.value_after("kvroute gateway on ");
    (gw, url)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// One conversation of `turns` turns, turn `t` through `urls[(id + t) % urls.len()]`, each
/// 25 ms after the answer before it (a fast client: the replicas' bookings reach each other
/// within about a millisecond, docs/scale-out.md): (prompt tokens, cached tokens) summed.
async fn conversation(urls: &[String], id: usize, turns: usize) -> (u64, u64) {
    let system = format!(
        "Conversation {id}. {}",
        "You are a careful assistant; answer in short sentences. ".repeat(60)
    );
    let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
    let (mut prompt, mut cached) = (0, 0);
    for t in 0..turns {
        if t > 0 {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let url = &urls[(id + t) % urls.len()];
        messages.push(
            serde_json::json!({"role": "user", "content": format!("question {t} of {id}: go on")}),
        );
        let r = client()
            .post(format!("{url}/v1/chat/completions"))
            .json(
                &serde_json::json!({"model": "kvroute-sim", "messages": messages, "max_tokens": 8}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: serde_json::Value = r.json().await.unwrap();
        prompt += v["usage"]["prompt_tokens"].as_u64().unwrap();
        cached += v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        let reply = v["choices"][0]["message"]["content"].clone();
        messages.push(serde_json::json!({"role": "assistant", "content": reply}));
    }
    (prompt, cached)
}

/// Conversations `ids`, starting 50 ms apart and then running together, each turn through
/// the next gateway: the hit rate.
async fn hit_rate(urls: &[String], ids: std::ops::Range<usize>) -> f64 {
    let first = ids.start;
    let runs = ids.map(|id| {
        let urls = urls.to_vec();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50 * (id - first) as u64)).await;
            conversation(&urls, id, 4).await
        })
    });
    let (mut prompt, mut cached) = (0, 0);
    for r in runs.collect::<Vec<_>>() {
        let (p, c) = r.await.unwrap();
        prompt += p;
        cached += c;
    }
    cached as f64 / prompt as f64
}

/// The upper bounds of the buckets holding the median and the 99th percentile of
/// `kvroute_peer_load_delay_seconds`, and the count.
fn delay_quantiles(metrics: &str) -> (f64, f64, f64) {
    let mut buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter(|l| l.starts_with("kvroute_peer_load_delay_seconds_bucket{"))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = buckets.last().map_or(0.0, |b| b.1);
    let q = |f: f64| {
        buckets
            .iter()
            .find(|b| b.1 >= f * n)
            .map_or(f64::INFINITY, |b| b.0)
    };
    (q(0.5), q(0.99), n)
}

async fn workers(url: &str) -> Vec<serde_json::Value> {
    get_json(&client(), &format!("{url}/debug/workers")).await["workers"]
        .as_array()
        .unwrap()
        .clone()
}

/// Index blocks per worker on a gateway.
async fn index(url: &str) -> Vec<u64> {
    workers(url)
        .await
        .iter()
        .map(|w| w["index_blocks"].as_u64().unwrap())
        .collect()
}

/// Blocks each engine holds.
async fn engine_blocks(engines: &[Engine]) -> Vec<u64> {
    let mut out = Vec::new();
    for e in engines {
        let text = get_text(&client(), &format!("{}/metrics", e.url)).await;
        out.push(sample(&text, "kvroute_engine_cached_blocks").unwrap_or(-1.0) as u64);
    }
    out
}

async fn mirrors(url: &str, engines: &[Engine]) -> bool {
    index(url).await == engine_blocks(engines).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_over_nats_route_as_one() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        "[plane]\nload_heartbeat_secs = 0.25\npeer_ttl_secs = 1.5\nrequest_timeout_secs = 2.0\n",
    )
    .unwrap();
    let engines: Vec<Engine> = (0..3).map(|i| engine(&nats, i)).collect();
    let mut gws: Vec<(Server, String)> =
        (0..3).map(|_| gateway(&nats, &engines, &config)).collect();
    let urls: Vec<String> = gws.iter().map(|g| g.1.clone()).collect();
    for u in &urls {
        assert!(
            eventually(Duration::from_secs(15), async || {
                let text = get_text(&client(), &format!("{u}/metrics")).await;
                sample(&text, "kvroute_peer_replicas") == Some(2.0)
            })
            .await,
            "gateway {u} does not see its two peers"
        );
    }

    // Conversations whose every turn goes to the next gateway hit the cache as through one
    // gateway (three at a time: a load at which the policy keeps each on its cache).
    let spread = hit_rate(&urls, 0..3).await;
    let one = hit_rate(&urls[..1], 100..103).await;
    eprintln!("hit rate: three gateways {spread:.4}, one gateway {one:.4}");
    assert!(one > 0.5, "one gateway's hit rate {one}");
    assert!(
        (spread - one).abs() <= 0.01,
        "three gateways {spread:.4} against one {one:.4}"
    );
    for u in &urls {
        assert!(eventually(Duration::from_secs(15), async || mirrors(u, &engines).await).await);
    }
    // How late each gateway reads its peers' bookings (sent and read on this machine's clock).
    for u in &urls {
        let text = get_text(&client(), &format!("{u}/metrics")).await;
        let (p50, p99, n) = delay_quantiles(&text);
        eprintln!("peer load delay at {u}: p50 <= {p50} s, p99 <= {p99} s over {n} messages");
        assert!(
            n > 0.0 && p99 <= 0.1,
            "bookings reach the peers late: p99 <= {p99} s"
        );
    }

    // SIGKILL of gateway 2 while it serves a long stream: the others keep serving, and its
    // booking expires on them.
    let long = {
        let url = urls[2].clone();
        tokio::spawn(async move {
            client()
                .post(format!("{url}/v1/chat/completions"))
                .json(
                    &serde_json::json!({"model": "kvroute-sim", "stream": true, "max_tokens": 20000,
                    "messages": [{"role": "user", "content": "a very long answer"}]}),
                )
                .send()
                .await
                .unwrap()
                .bytes()
                .await
        })
    };
    let booked = async |u: &str| -> u64 {
        workers(u)
            .await
            .iter()
            .map(|w| w["load"]["inflight"].as_u64().unwrap())
            .sum()
    };
    assert!(
        eventually(Duration::from_secs(15), async || booked(&urls[0]).await
            == 1)
        .await
    );
    let (killed, _) = gws.pop().unwrap();
    killed.kill9();
    let _ = long.await;
    let again = hit_rate(&urls[..2], 200..203).await;
    assert!(again > 0.5, "after the kill: hit rate {again}");
    for u in &urls[..2] {
        assert!(
            eventually(Duration::from_secs(10), async || booked(u).await == 0).await,
            "the killed gateway's booking was not released on {u}"
        );
    }

    // A gateway started now routes with a warm index: it mirrors the engines, and an earlier
    // conversation's next turn through it is a hit.
    let (late, late_url) = gateway(&nats, &engines, &config);
    assert!(
        eventually(Duration::from_secs(10), async || mirrors(
            &late_url, &engines
        )
        .await)
        .await,
        "late gateway index {:?}, engines {:?}",
        index(&late_url).await,
        engine_blocks(&engines).await
    );
    let warm = hit_rate(std::slice::from_ref(&late_url), 0..3).await;
    assert!(warm > 0.5, "the late gateway's hit rate {warm}");

    // Each relay: ready, its engine and NATS connected, its items published.
    for e in &engines {
        let (code, body) = ready(e).await;
        assert_eq!(code, 200, "{body}");
        let text = get_text(&client(), &format!("{}/metrics", e.probes)).await;
        let name = e.url.trim_start_matches("http://");
        let published = sample(
            &text,
            &format!("kvroute_relay_published_total{{worker=\"{name}\"}}"),
        );
        assert!(published.is_some_and(|n| n > 0.0), "{text}");
    }

    // nats-server killed and restarted while the engines keep storing blocks: no event lost.
    nats.kill();
    for e in &engines {
        assert!(
            eventually(Duration::from_secs(10), async || {
                let (code, body) = ready(e).await;
                code == 503 && body["nats"] == "disconnected" && body["engine"] == "connected"
            })
            .await,
            "{:?}",
            ready(e).await
        );
        let live = client().get(format!("{}/live", e.probes)).send().await;
        assert_eq!(live.unwrap().status().as_u16(), 200);
    }
    let _ = hit_rate(&urls[..2], 300..303).await;
    nats.restart();
    for e in &engines {
        assert!(
            eventually(Duration::from_secs(20), async || ready(e).await.0 == 200).await,
            "{:?}",
            ready(e).await
        );
    }
    for u in urls[..2].iter().chain([&late_url]) {
        assert!(
            eventually(Duration::from_secs(20), async || mirrors(u, &engines).await).await,
            "after the NATS restart {u}: index {:?}, engines {:?}",
            index(u).await,
            engine_blocks(&engines).await
        );
    }
    drop(late);
    drop(gws);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_three_gateways_sharing_load() {
    // The demo starts its own nats-server: skipped (or failed, in CI) without one, as the
    // tests that start it themselves.
    let Some(_probe) = NatsServer::start() else {
        return;
    };
    let demo = Server::start(&[
        "demo",
        "--gateways",
        "3",
        "--port",
        "0",
        "--no-ui",
        "--speedup",
        "20",
    ]);
    let first = demo.value_after("kvroute demo: gateway ");
    let mut urls = vec![first];
    for _ in 0..2 {
        urls.push(demo.value_after("gateway replica "));
    }
    for u in &urls {
        assert!(
            eventually(Duration::from_secs(15), async || {
                let text = get_text(&client(), &format!("{u}/metrics")).await;
                sample(&text, "kvroute_peer_replicas") == Some(2.0)
            })
            .await,
            "{u} does not see two peers"
        );
    }
    assert!(hit_rate(&urls, 0..3).await > 0.5);
    assert!(demo.interrupt(), "the demo did not stop cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_polls_a_pull_api_of_events_onto_the_plane() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    // An engine with TensorRT-LLM's HTTP pull API of KV events.
    let worker = Server::start(&[
        "worker",
        "--port",
        "0",
        "--name",
        "trt",
        "--speedup",
        "20",
        "--event-format",
        "trtllm",
    ]);
    let url = worker.value_after("kvroute worker on ");
    let name = url.trim_start_matches("http://").to_string();
    let relay = Server::start(&[
        "relay",
        "--worker",
        &name,
        "--events",
        &format!("poll:{url}/kv_cache_events"),
        "--block-size",
        "16",
        "--nats",
        &nats.url(),
        "--http-port",
        "0",
    ]);
    let probes = relay.value_after("kvroute relay probes on ");
    relay.value_after("kvroute relay: ");
    let gw = Server::start(&[
        "serve",
        "--port",
        "0",
        "--tokenizer",
        "builtin",
        "--block-size",
        "16",
        "--nats",
        &nats.url(),
        "--worker",
        &format!("{url}=nats"),
    ]);
    let gw_url = gw.value_after("kvroute gateway on ");
    let hit = hit_rate(std::slice::from_ref(&gw_url), 0..2).await;
    assert!(hit > 0.5, "hit rate {hit}");
    let engine = vec![Engine {
        _worker: worker,
        _relay: relay,
        url,
        probes,
    }];
    assert!(
        eventually(Duration::from_secs(15), async || mirrors(&gw_url, &engine)
            .await)
        .await,
        "index {:?}, engine {:?}",
        index(&gw_url).await,
        engine_blocks(&engine).await
    );
    drop(gw);
}
