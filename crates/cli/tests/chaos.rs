//! The chaos suite: `kvroute serve` in front of three `kvroute worker` processes (KV events
//! over ZMQ), all on 127.0.0.1, under a steady streamed load from the test, while a worker is
//! killed (SIGKILL), frozen (SIGSTOP for 10 s), or restarted, and while 2,000 slow clients
//! hold connections. Each scenario prints its figures (`bash scripts/chaos.sh` shows them)
//! and checks what the operator is promised: no request lost that had not started
//! streaming, streams cut mid-way carried on to their end, the index kept or rebuilt.

#[path = "common/server.rs"]
mod server;

use kvroute_testkit::get_json;
use server::Server;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Tokens per answer: 1.5 s of decoding at the simulated engine's real-time speed.
const MAX_TOKENS: u64 = 150;

/// One worker process and how to start it again on the same ports.
struct Worker {
    name: String,
    args: Vec<String>,
    /// Its `[[workers]]` entry in the gateway's config.
    spec: String,
    proc: Option<Server>,
}

impl Worker {
    fn start(name: &str) -> Self {
        let args: Vec<String> = [
            "worker",
            "--port",
            "0",
            "--name",
            name,
            "--speedup",
            "1",
            "--zmq-publish",
            "tcp://127.0.0.1:0",
            "--zmq-replay",
            "tcp://127.0.0.1:0",
        ]
        .map(String::from)
        .to_vec();
        let proc = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let url = proc.value_after("kvroute worker on ");
        let events = proc.value_after("KV events: ");
        let replay = proc.value_after("replay:    ");
        // Started again, it takes the same ports.
        let port = url.rsplit(':').next().unwrap().to_string();
        let args = [
            "worker",
            "--port",
            &port,
            "--name",
            name,
            "--speedup",
            "1",
            "--zmq-publish",
            &events,
            "--zmq-replay",
            &replay,
        ]
        .map(String::from)
        .to_vec();
        Self {
            name: name.to_string(),
            args,
            spec: format!(
                "[[workers]]\nurl = \"{url}\"\nname = \"{name}\"\nevents = \"{events}\"\nreplay = \"{replay}\"\n"
            ),
            proc: Some(proc),
        }
    }

    fn restart(&mut self) {
        let proc = Server::start(&self.args.iter().map(String::as_str).collect::<Vec<_>>());
        proc.value_after("kvroute worker on ");
        self.proc = Some(proc);
    }
}

struct Fleet {
    workers: Vec<Worker>,
    _gateway: Server,
    url: String,
    _config: TempFile,
}

struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Three workers and a gateway with `config` (TOML) in front.
fn fleet(tag: &str, config: &str) -> Fleet {
    let workers: Vec<Worker> = (1..=3).map(|i| Worker::start(&format!("w{i}"))).collect();
    let path =
        std::env::temp_dir().join(format!("kvroute-chaos-{tag}-{}.toml", std::process::id()));
    let entries: String = workers.iter().map(|w| w.spec.clone()).collect();
    std::fs::write(&path, format!("{config}\n{entries}")).unwrap();
    let args = [
        "serve".to_string(),
        "--port".into(),
        "0".into(),
        "--tokenizer".into(),
        "builtin".into(),
        "--block-size".into(),
        "16".into(),
        "--policy".into(),
        "kv".into(),
        "--config".into(),
        path.display().to_string(),
    ];
    let gateway = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let url = gateway.value_after("kvroute gateway on ");
    Fleet {
        workers,
        _gateway: gateway,
        url,
        _config: TempFile(path),
    }
}

/// How one streamed request went.
#[derive(Clone, Debug, Default)]
struct Outcome {
    worker: String,
    ok: bool,
    error: Option<String>,
    completion_tokens: u64,
    chunks: u32,
    longest_gap: Duration,
}

/// A request in flight: its first worker and the chunks read so far.
struct Flight {
    worker: Mutex<String>,
    chunks: AtomicU32,
}

/// The load: `clients` loops of streamed chat requests, each on its own conversation
/// prefix (so the kv policy spreads them), until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    flights: Arc<Mutex<BTreeMap<u64, Arc<Flight>>>>,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(url: &str, clients: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flights: Arc<Mutex<BTreeMap<u64, Arc<Flight>>>> = Arc::default();
        let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
        let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let tasks = (0..clients)
            .map(|k| {
                let (stop, flights, outcomes, next) = (
                    stop.clone(),
                    flights.clone(),
                    outcomes.clone(),
                    next.clone(),
                );
                let (client, url) = (client.clone(), url.to_string());
                tokio::spawn(async move {
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let id = next.fetch_add(1, Ordering::Relaxed);
                        let flight = Arc::new(Flight {
                            worker: Mutex::new(String::new()),
                            chunks: AtomicU32::new(0),
                        });
                        flights.lock().unwrap().insert(id, flight.clone());
                        let out = stream(&client, &url, k, n, &flight).await;
                        flights.lock().unwrap().remove(&id);
                        outcomes.lock().unwrap().push(out);
                    }
                })
            })
            .collect();
        Self {
            stop,
            flights,
            outcomes,
            tasks,
        }
    }

    /// Requests in flight now: (first worker, chunks read).
    fn in_flight(&self) -> Vec<(String, u32)> {
        self.flights
            .lock()
            .unwrap()
            .values()
            .map(|f| {
                (
                    f.worker.lock().unwrap().clone(),
                    f.chunks.load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// Stops the clients after their current request; every outcome.
    async fn finish(self) -> Vec<Outcome> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        let out = self.outcomes.lock().unwrap().clone();
        out
    }
}

/// One streamed chat request of client `k`'s conversation, turn `n`.
async fn stream(client: &reqwest::Client, url: &str, k: usize, n: usize, f: &Flight) -> Outcome {
    use futures_util::StreamExt;
    let mut out = Outcome::default();
    let system = format!("Client {k} asks about its own topic. ").repeat(12);
    let body = serde_json::json!({
        "model": "kvroute-sim",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": format!("question {n}")}],
        "max_tokens": MAX_TOKENS,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let resp = match client
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
    {
        Ok(r) if r.status() == 200 => r,
        Ok(r) => {
            out.error = Some(format!("status {}", r.status()));
            return out;
        }
        Err(e) => {
            out.error = Some(e.to_string());
            return out;
        }
    };
    out.worker = resp.headers()["x-kvroute-worker"]
        .to_str()
        .unwrap_or("?")
        .to_string();
    *f.worker.lock().unwrap() = out.worker.clone();
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    let mut last = Instant::now();
    loop {
        match body.next().await {
            Some(Ok(chunk)) => {
                out.longest_gap = out.longest_gap.max(last.elapsed());
                last = Instant::now();
                text.push_str(&String::from_utf8_lossy(&chunk));
                out.chunks += 1;
                f.chunks.fetch_add(1, Ordering::Relaxed);
            }
            Some(Err(e)) => {
                out.error = Some(format!("stream: {e}"));
                return out;
            }
            None => break,
        }
    }
    for event in text.split("\n\n") {
        let Some(d) = event.strip_prefix("data: ") else {
            continue;
        };
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(d) {
            if v.get("error").is_some() {
                out.error = Some(v["error"]["message"].to_string());
            }
            if let Some(c) = v["usage"]["completion_tokens"].as_u64() {
                out.completion_tokens = c;
            }
        }
    }
    out.ok = out.error.is_none() && text.contains("data: [DONE]");
    out
}

async fn metrics(url: &str) -> String {
    reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn sample(metrics: &str, name: &str) -> f64 {
    kvroute_testkit::sample(metrics, name).unwrap_or(0.0)
}

/// The gateway's view of a worker: (health, index blocks).
async fn view(url: &str, name: &str) -> (String, u64) {
    let v = get_json(&reqwest::Client::new(), &format!("{url}/debug/workers")).await;
    let w = v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker"]["name"] == name)
        .cloned()
        .unwrap_or_default();
    (
        w["worker"]["health"].as_str().unwrap_or("?").to_string(),
        w["index_blocks"].as_u64().unwrap_or(0),
    )
}

/// The worker with the most streams in flight (at least one chunk read).
fn busiest(load: &Load) -> (String, usize) {
    let mut per: BTreeMap<String, usize> = BTreeMap::new();
    for (w, chunks) in load.in_flight() {
        if chunks > 0 {
            *per.entry(w).or_default() += 1;
        }
    }
    per.into_iter().max_by_key(|(_, n)| *n).unwrap_or_default()
}

fn summary(outcomes: &[Outcome]) -> String {
    let ok = outcomes.iter().filter(|o| o.ok).count();
    let whole = outcomes
        .iter()
        .filter(|o| o.ok && o.completion_tokens == MAX_TOKENS)
        .count();
    format!(
        "{} requests: {ok} ok ({whole} with all {MAX_TOKENS} tokens), {} failed",
        outcomes.len(),
        outcomes.len() - ok
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_a_worker_killed_under_load() {
    let mut f = fleet("kill", "[health]\ninterval_secs = 0.5\n");
    let load = Load::start(&f.url, 9);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (victim, streaming) = busiest(&load);
    let i = f.workers.iter().position(|w| w.name == victim).unwrap();
    let killed_at = Instant::now();
    f.workers[i].proc.take().unwrap().kill9();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let outcomes = load.finish().await;
    let m = metrics(&f.url).await;
    let migrated = sample(&m, "kvroute_migrations_total{result=\"migrated\"}");
    let cut: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.worker == victim && o.chunks > 0)
        .collect();
    println!(
        "chaos a (kill -9 {victim} under 9 streaming clients): {streaming} streams on it at the kill; {}; \
         first served by {victim}: {} ({} whole); migrated {migrated}, retried {}, \
         {victim}'s stream_broken {}; {:.1} s after the kill",
        summary(&outcomes),
        cut.len(),
        cut.iter().filter(|o| o.ok && o.completion_tokens == MAX_TOKENS).count(),
        sample(&m, "kvroute_retries_total"),
        sample(&m, &format!("kvroute_upstream_errors_total{{kind=\"stream_broken\",worker=\"{victim}\"}}")),
        killed_at.elapsed().as_secs_f64(),
    );
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.ok).collect();
    assert!(failed.is_empty(), "lost requests: {failed:?}");
    assert!(
        streaming > 0 && migrated >= 1.0,
        "no stream was cut: the scenario did not happen"
    );
    assert!(
        outcomes.iter().all(|o| o.completion_tokens == MAX_TOKENS),
        "an answer came back short"
    );
    drop(f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_a_worker_frozen_for_10_seconds() {
    // Streams silent for 2 s migrate; a request sent to the frozen worker before the health
    // checks take it out waits 5 s for its headers, then goes elsewhere.
    let config = "[health]\ninterval_secs = 0.5\ntimeout_secs = 0.5\n\n[upstream]\nidle_timeout_secs = 2.0\nfirst_byte_timeout_secs = 5.0\n";
    let f = fleet("stop", config);
    let load = Load::start(&f.url, 9);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (victim, streaming) = busiest(&load);
    let i = f.workers.iter().position(|w| w.name == victim).unwrap();
    let (_, blocks_before) = view(&f.url, &victim).await;
    let proc = f.workers[i].proc.as_ref().unwrap();
    proc.signal("STOP");
    let mut seen = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        let (health, blocks) = view(&f.url, &victim).await;
        if seen.last().map(|(_, h, b)| (h, b)) != Some((&health, &blocks)) {
            seen.push((format!("{:.1}", t0.elapsed().as_secs_f64()), health, blocks));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    proc.signal("CONT");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let outcomes = load.finish().await;
    let (health_after, blocks_after) = view(&f.url, &victim).await;
    let m = metrics(&f.url).await;
    let migrated = sample(&m, "kvroute_migrations_total{result=\"migrated\"}");
    let longest = outcomes
        .iter()
        .map(|o| o.longest_gap)
        .max()
        .unwrap_or_default();
    println!(
        "chaos b (SIGSTOP {victim} for 10 s, idle timeout 2 s): {streaming} streams on it at the stop; {}; \
         migrated {migrated}, retried {}, stream_idle {}; longest silence a client saw {:.2} s; \
         gateway's view of {victim} during the stop (s, health, index blocks): {seen:?}; \
         index {blocks_before} blocks before, {blocks_after} after; {health_after} after SIGCONT",
        summary(&outcomes),
        sample(&m, "kvroute_retries_total"),
        sample(&m, &format!("kvroute_upstream_errors_total{{kind=\"stream_idle\",worker=\"{victim}\"}}")),
        longest.as_secs_f64(),
    );
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.ok).collect();
    assert!(failed.is_empty(), "lost requests: {failed:?}");
    assert!(
        streaming > 0 && migrated >= 1.0,
        "no stream was frozen: the scenario did not happen"
    );
    assert!(
        outcomes.iter().all(|o| o.completion_tokens == MAX_TOKENS),
        "an answer came back short"
    );
    // The idle timeout bounds the silence (2 s), plus the continuation's start; a request
    // routed to the frozen worker before it was taken out waited for its headers instead.
    assert!(
        longest < Duration::from_secs(5),
        "a stream stayed silent {longest:?}"
    );
    assert!(
        blocks_before > 0 && blocks_after >= blocks_before,
        "the frozen worker's index was not kept: {blocks_before} -> {blocks_after}"
    );
    drop(f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_a_worker_restarted() {
    let mut f = fleet("restart", "[health]\ninterval_secs = 0.25\n");
    let load = Load::start(&f.url, 6);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let outcomes = load.finish().await;
    let victim = f.workers[0].name.clone();
    let (_, before) = view(&f.url, &victim).await;
    f.workers[0].proc.take().unwrap().kill9();
    f.workers[0].restart();
    let started = Instant::now();
    // Known empty: the engine lost its cache with the process.
    let mut emptied = None;
    while started.elapsed() < Duration::from_secs(10) {
        let (health, blocks) = view(&f.url, &victim).await;
        if health == "up" && blocks == 0 {
            emptied = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Then exact again: a request served by it shows in the index.
    let client = reqwest::Client::new();
    let flight = Flight {
        worker: Mutex::new(String::new()),
        chunks: AtomicU32::new(0),
    };
    let mut served = None;
    let mut indexed = None;
    for n in 0..12 {
        let o = stream(&client, &f.url, 100 + n, 0, &flight).await;
        assert!(o.ok, "{o:?}");
        if o.worker == victim {
            let at = Instant::now();
            served = Some(o);
            while at.elapsed() < Duration::from_secs(5) {
                if view(&f.url, &victim).await.1 > 0 {
                    indexed = Some(at.elapsed());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            break;
        }
    }
    let m = metrics(&f.url).await;
    println!(
        "chaos c (kill -9 {victim} and start it again on the same ports): {} before; index {before} blocks \
         before, known empty and up {:?} after the restart; a request it served indexed {:?} after its end \
         ({} resubscribes, {} restarts counted)",
        summary(&outcomes),
        emptied,
        indexed,
        sample(&m, &format!("kvroute_kv_event_resubscribes_total{{worker=\"{victim}\"}}")),
        sample(&m, &format!("kvroute_kv_event_restarts_total{{worker=\"{victim}\"}}")),
    );
    assert!(
        before > 0,
        "the scenario needs blocks indexed before the restart"
    );
    assert!(
        emptied.is_some(),
        "the restarted worker was not known empty within 10 s"
    );
    assert!(served.is_some(), "no request reached the restarted worker");
    assert!(
        indexed.is_some_and(|d| d < Duration::from_secs(1)),
        "the restarted worker's new blocks were not indexed within 1 s: {indexed:?}"
    );
    drop(f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_2000_slow_clients() {
    use tokio::io::AsyncWriteExt;
    let f = fleet("slow", "[health]\ninterval_secs = 0.5\n");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let flight = Flight {
        worker: Mutex::new(String::new()),
        chunks: AtomicU32::new(0),
    };
    let timed = |tag: usize| {
        let (client, url, flight) = (client.clone(), f.url.clone(), &flight);
        async move {
            let mut ms = Vec::new();
            for n in 0..10 {
                let t = Instant::now();
                let o = stream(&client, &url, tag, n, flight).await;
                assert!(o.ok, "{o:?}");
                ms.push(t.elapsed().as_millis() as u64);
            }
            ms.sort_unstable();
            ms
        }
    };
    let before = timed(1).await;
    // 2,000 connections that each send part of a request's headers and then a byte a second.
    let addr = f.url.trim_start_matches("http://").to_string();
    let mut slow = Vec::new();
    for _ in 0..2000 {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        slow.push(c);
    }
    let dribble = tokio::spawn(async move {
        for _ in 0..20 {
            for c in &mut slow {
                let _ = c.write_all(b"x").await;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let live = client
        .get(format!("{}/live", f.url))
        .send()
        .await
        .map(|r| r.status().as_u16());
    let during = timed(2).await;
    dribble.abort();
    println!(
        "chaos e (2,000 slow clients dribbling headers): /live {live:?}; 10 streamed requests of {MAX_TOKENS} \
         tokens each, milliseconds sorted: before {before:?}, during {during:?}"
    );
    assert_eq!(live.ok(), Some(200));
    drop(f);
}
