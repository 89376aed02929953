//! Gateway overhead: time to first token through the gateway versus straight to the worker,
//! and the highest request rate the gateway sustains, against a zero-delay worker (a stub
//! that answers every request at once). The gateway runs on its own runtime (two threads
//! unless the fifth argument says otherwise), as `kvroute serve` does, the stub and the client
//! on a thread each (or, with `same-thread`, all on one thread). All share this machine's
//! cores, so at high concurrency the figures are upper bounds. Direct and gateway requests
//! alternate in ten rounds per cell, so both see the same spells of a shared machine.
//! It first prints what waking a sleeping thread costs here, on the same core and across
//! cores: the price of each hand-over the gateway adds to a request's path. It ends with the
//! CPU the gateway costs per streamed token (streams of 1,000 chunks, one per write).
//!
//! `cargo run --release -p kvroute-gateway --example overhead -- [REQUESTS] [SECONDS] [WORDS,...] [own-runtime|same-thread|epp|pd] [GATEWAY_THREADS]`
//! (`bench/gateway-overhead.sh` runs it). Prints a Markdown table.
//!
//! `epp`: the endpoint picker's cost instead. Two real Envoys (`target/tools-venv`, from
//! `scripts/tools.sh`) in front of the stub: one routing to it directly, one asking the
//! picker (`deploy/envoy/picker-fail-closed.yaml`), requests alternating between them
//! (`bench/epp-overhead.sh`).
//!
//! `pd`: what a disaggregated pair adds: two stubs (a prefill one, whose non-streamed answer
//! is one JSON completion, and a decode one), a gateway serving them split in vLLM's
//! protocol (`always`) and one serving the decode stub alone, requests alternating between
//! the stub, the aggregated gateway and the split one.

use axum::response::IntoResponse;
use axum::routing::{get, post};
use futures_util::StreamExt;
use kvroute_gateway::{GatewayConfig, WorkerSpec};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The allocator of the `kvroute` binary, so the gateway is measured as it runs there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MODEL: &str = "stub";

/// One content chunk of the stub's stream.
fn content_chunk(i: u64) -> String {
    format!(
        "data: {{\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"{MODEL}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}},\"finish_reason\":null}}]}}\n\n"
    )
}

/// The stub's usage chunk and `[DONE]`.
fn stream_end(tokens: u64) -> String {
    format!("data: {{\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"stub\",\"choices\":[],\"usage\":{{\"prompt_tokens\":30,\"completion_tokens\":{tokens},\"total_tokens\":{}}}}}\n\ndata: [DONE]\n\n", tokens + 30)
}

/// The stub worker: four content chunks, usage, `[DONE]`, all in one write; or, when the
/// request asks for more than four tokens, that many content chunks written one at a time
/// (the task yields between them), as an engine streams a token per step.
async fn stub_chat(body: bytes::Bytes) -> axum::response::Response {
    let request = serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default();
    let tokens = request["max_tokens"].as_u64().unwrap_or(4);
    if request["stream"] == false {
        // A prefill leg: one JSON completion.
        let answer = serde_json::json!({
            "id": "x", "object": "text_completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "text": "t0", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 1, "total_tokens": 31},
            "kv_transfer_params": null,
        });
        return axum::Json(answer).into_response();
    }
    let headers = [("content-type", "text/event-stream")];
    if tokens <= 4 {
        let mut body: String = (0..4).map(content_chunk).collect();
        body.push_str(&stream_end(4));
        return (headers, body).into_response();
    }
    let chunks = futures_util::stream::unfold(0u64, move |i| async move {
        if i > tokens {
            return None;
        }
        tokio::task::yield_now().await;
        let text = if i == tokens {
            stream_end(tokens)
        } else {
            content_chunk(i)
        };
        Some((Ok::<_, std::io::Error>(bytes::Bytes::from(text)), i + 1))
    });
    (headers, axum::body::Body::from_stream(chunks)).into_response()
}

/// Starts the stub: on this thread's runtime (`same_thread`), else on a thread of its own, as
/// a worker process would be.
async fn start_stub(same_thread: bool) -> String {
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(stub_chat))
        .route("/v1/completions", post(stub_chat))
        .route("/health", get(|| async { "ok" }));
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    let serve = async move {
        let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
        let _ = axum::serve(listener, app).await;
    };
    if same_thread {
        tokio::spawn(serve);
    } else {
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(serve)
        });
    }
    format!("http://{addr}")
}

/// A completions request with `n` token ids: no template, no tokenizer.
fn ids_body(n: usize) -> bytes::Bytes {
    let ids: Vec<u32> = (0..n as u32).map(|i| 100 + i % 1000).collect();
    serde_json::to_vec(&serde_json::json!({
        "model": MODEL, "prompt": ids, "stream": true, "max_tokens": 4,
    }))
    .unwrap()
    .into()
}

/// Request bodies by request number.
type Bodies = Arc<dyn Fn(u64) -> bytes::Bytes + Send + Sync>;

/// The same body for every request.
fn fixed(b: bytes::Bytes) -> Bodies {
    Arc::new(move |_| b.clone())
}

/// A chat of about `prompt_words` words; `unique`: the message starts with the request number,
/// so no two requests share a piece the tokenizer cache could hold.
fn chat_bodies(prompt_words: usize, unique: bool) -> Bodies {
    Arc::new(move |i| body(prompt_words, unique.then_some(i)))
}

fn body(prompt_words: usize, number: Option<u64>) -> bytes::Bytes {
    let mut content = number.map(|n| format!("request {n}: ")).unwrap_or_default();
    content.push_str(&"route me to the warm cache please ".repeat(prompt_words / 7 + 1));
    serde_json::to_vec(&serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "stream": true,
        "max_tokens": 4,
    }))
    .unwrap()
    .into()
}

/// Sends one request to the endpoint `url` and returns the seconds to the first body chunk (the stream is read to
/// its end).
async fn one(client: &reqwest::Client, url: &str, body: bytes::Bytes) -> f64 {
    let start = Instant::now();
    // Token-id prompts go to the completions API.
    let resp = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("request");
    if !resp.status().is_success() {
        let status = resp.status();
        panic!("status {status}: {}", resp.text().await.unwrap_or_default());
    }
    let mut stream = resp.bytes_stream();
    let mut first = None;
    while let Some(chunk) = stream.next().await {
        chunk.expect("body");
        first.get_or_insert_with(|| start.elapsed().as_secs_f64());
    }
    first.unwrap_or_else(|| start.elapsed().as_secs_f64())
}

/// Seconds from sending a streamed chat asking for `tokens` tokens to the end of its stream.
async fn whole_stream(client: &reqwest::Client, url: &str, tokens: u64) -> f64 {
    let body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "stream me a long answer"}],
        "stream": true,
        "max_tokens": tokens,
    });
    let start = Instant::now();
    let resp = client.post(url).json(&body).send().await.expect("request");
    assert!(resp.status().is_success(), "status {}", resp.status());
    let mut stream = resp.bytes_stream();
    let mut bytes = 0;
    while let Some(chunk) = stream.next().await {
        bytes += chunk.expect("body").len();
    }
    assert!(
        bytes > tokens as usize * 50,
        "a short stream: {bytes} bytes"
    );
    start.elapsed().as_secs_f64()
}

/// CPU seconds this process has used (user + system; `/proc/self/stat` counts in ticks of
/// 1/100 s).
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // After the command name (which ends with ')'), from the state on: utime and stime are
    // the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    (tick(11) + tick(12)) as f64 / 100.0
}

/// The gateway's cost per streamed token: whole streams of `tokens` chunks at `concurrency`,
/// direct and through the gateway alternating in ten rounds. Returns the seconds per stream
/// of each (sorted) and the CPU seconds the whole process used in the rounds of each.
async fn per_token(
    stub: &str,
    via: &str,
    tokens: u64,
    streams: usize,
    concurrency: usize,
) -> ((Vec<f64>, f64), (Vec<f64>, f64)) {
    let client = client();
    let (mut direct, mut gateway) = ((Vec::new(), 0.0), (Vec::new(), 0.0));
    for _ in 0..10 {
        for (url, out) in [(stub, &mut direct), (via, &mut gateway)] {
            let cpu = cpu_secs();
            let times: Vec<f64> = futures_util::stream::iter(0..streams.div_ceil(10))
                .map(|_| whole_stream(&client, url, tokens))
                .buffer_unordered(concurrency)
                .collect()
                .await;
            out.1 += cpu_secs() - cpu;
            out.0.extend(times);
        }
    }
    direct.0.sort_by(f64::total_cmp);
    gateway.0.sort_by(f64::total_cmp);
    (direct, gateway)
}

/// A client that keeps enough idle connections for the highest concurrency.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .unwrap()
}

/// TTFTs of `n` requests at `concurrency`.
async fn ttfts(
    client: &reqwest::Client,
    url: &str,
    body: Bodies,
    n: usize,
    concurrency: usize,
) -> Vec<f64> {
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, url, body, next) =
                (client.clone(), url.to_string(), body.clone(), next.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i as usize >= n {
                        break;
                    }
                    out.push(one(&client, &url, body(i)).await);
                }
                out
            })
        })
        .collect();
    let mut all = Vec::with_capacity(n);
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_by(f64::total_cmp);
    all
}

/// TTFTs of `n` requests at `concurrency` straight to `direct` and through `via`, in ten
/// alternating rounds, so both see the same spells of this shared machine.
async fn interleaved(
    direct: &str,
    via: &str,
    body: Bodies,
    n: usize,
    concurrency: usize,
) -> (Vec<f64>, Vec<f64>) {
    const ROUNDS: usize = 10;
    let (cd, cg) = (client(), client());
    // Warm up connections and caches.
    ttfts(&cd, direct, body.clone(), 200, 8).await;
    ttfts(&cg, via, body.clone(), 200, 8).await;
    let (mut d, mut g) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for round in 0..ROUNDS {
        let k = n / ROUNDS + usize::from(round < n % ROUNDS);
        d.extend(ttfts(&cd, direct, body.clone(), k, concurrency).await);
        g.extend(ttfts(&cg, via, body.clone(), k, concurrency).await);
    }
    d.sort_by(f64::total_cmp);
    g.sort_by(f64::total_cmp);
    (d, g)
}

/// Requests completed per second in a closed loop at `concurrency` for `secs`.
async fn rate(url: &str, body: Bodies, concurrency: usize, secs: f64) -> f64 {
    let client = client();
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, url, body, done) =
                (client.clone(), url.to_string(), body.clone(), done.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    one(&client, &url, body(0)).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Round trips between two threads pinned to cores `a` and `b`, each sleeping in a blocking
/// receive until the other wakes it (as an idle gateway, worker or client does): p50 and p99
/// in microseconds. None when a thread cannot be pinned. Every request through the gateway
/// adds two such hand-overs to the path of a direct request; where they cross cores, their
/// cost on this machine is part of the added TTFT.
fn wake_round_trip(a: core_affinity::CoreId, b: core_affinity::CoreId) -> Option<(f64, f64)> {
    const TRIPS: usize = 1000;
    std::thread::spawn(move || {
        if !core_affinity::set_for_current(a) {
            return None;
        }
        let (to_tx, to_rx) = std::sync::mpsc::channel::<()>();
        let (back_tx, back_rx) = std::sync::mpsc::channel::<()>();
        let peer = std::thread::spawn(move || {
            let pinned = core_affinity::set_for_current(b);
            while to_rx.recv().is_ok() {
                if back_tx.send(()).is_err() {
                    break;
                }
            }
            pinned
        });
        let mut trips = Vec::with_capacity(TRIPS);
        for _ in 0..TRIPS {
            // Long enough for both threads to have gone to sleep.
            std::thread::sleep(Duration::from_micros(200));
            let start = Instant::now();
            to_tx.send(()).ok()?;
            back_rx.recv().ok()?;
            trips.push(start.elapsed().as_secs_f64() * 1e6);
        }
        drop(to_tx);
        if !peer.join().ok()? {
            return None;
        }
        trips.sort_by(f64::total_cmp);
        Some((pct(&trips, 0.5), pct(&trips, 0.99)))
    })
    .join()
    .ok()
    .flatten()
}

/// One line on the cost of waking a sleeping thread on this machine, on the same core and
/// across cores.
fn print_wake_costs() {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let Some(&first) = cores.first() else {
        return;
    };
    let show = |r: Option<(f64, f64)>| {
        r.map_or("n/a".to_string(), |(p50, p99)| {
            format!("p50 {p50:.1} / p99 {p99:.1} us")
        })
    };
    let same = show(wake_round_trip(first, first));
    let across = cores
        .get(1)
        .map_or("n/a (one core)".to_string(), |&second| {
            show(wake_round_trip(first, second))
        });
    println!("thread wake round trip (sleeping threads): same core {same}; across cores {across}");
    println!();
}

/// A table row: TTFT p50 / p99 of the direct (`d`) and routed (`g`) requests and the
/// difference, in ms.
fn print_row(label: &str, concurrency: usize, d: &[f64], g: &[f64]) {
    let ms = |x: f64| x * 1e3;
    println!(
        "| {label} | {concurrency} | {:.3} / {:.3} | {:.3} / {:.3} | {:.3} / {:.3} |",
        ms(pct(d, 0.5)),
        ms(pct(d, 0.99)),
        ms(pct(g, 0.5)),
        ms(pct(g, 0.99)),
        ms(pct(g, 0.5) - pct(d, 0.5)),
        ms(pct(g, 0.99) - pct(d, 0.99)),
    );
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let requests: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5.0);
    let sizes: Vec<usize> = args
        .next()
        .map(|a| a.split(',').filter_map(|w| w.parse().ok()).collect())
        .unwrap_or_else(|| vec![30, 2000]);
    let mode = args.next().unwrap_or_default();
    let same_thread = mode == "same-thread";
    let picker = mode == "epp";
    let gateway_threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    if mode == "pd" {
        pd_overhead(requests, gateway_threads).await;
        return;
    }
    print_wake_costs();
    let stub = start_stub(same_thread).await;
    let mut config = GatewayConfig {
        port: 0,
        models: vec![MODEL.into()],
        tokenizer: Some("builtin".into()),
        workers: vec![WorkerSpec {
            url: stub.clone(),
            ..WorkerSpec::default()
        }],
        ..GatewayConfig::default()
    };
    config.router.block_size = 16;
    config.router.policy.kind = kvroute_core::PolicyKind::Kv;
    config.router.admission.mode = kvroute_core::AdmissionMode::None;
    // `own-runtime` (default): the gateway runs as `kvroute serve` does, on its own
    // two-thread runtime, the stub on a thread of its own, the client on this one.
    // `same-thread`: everything on this thread, which leaves out the cost of waking other
    // threads and measures the gateway's own work.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serve = async move {
        let pre = kvroute_gateway::load_preprocessor(&config).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gw = kvroute_gateway::spawn(config, pre, listener, BTreeMap::new())
            .await
            .unwrap();
        let mut epp = None;
        if picker {
            let bind = || tokio::net::TcpListener::bind("127.0.0.1:0");
            let (grpc, health) = (bind().await.unwrap(), bind().await.unwrap());
            epp = Some(
                kvroute_gateway::epp::spawn(gw.state().clone(), grpc, health)
                    .await
                    .unwrap(),
            );
        }
        let _ = tx.send((gw.url(), epp.as_ref().map(|e| e.addr.port())));
        let _ = stop_rx.await;
        drop(epp);
        gw.shutdown().await;
    };
    let gateway_thread = if same_thread {
        tokio::spawn(serve);
        None
    } else {
        Some(std::thread::spawn(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(gateway_threads)
                .enable_all()
                .build()
                .unwrap()
                .block_on(serve)
        }))
    };
    let (via, grpc_port) = rx.await.unwrap();
    if let Some(port) = grpc_port {
        epp_overhead(&stub, port, requests, secs, gateway_threads).await;
        let _ = stop_tx.send(());
        if let Some(t) = gateway_thread {
            let _ = t.join();
        }
        return;
    }
    if same_thread {
        println!("gateway on the client's thread");
    } else {
        println!("gateway on its own runtime, {gateway_threads} thread(s)");
    }
    println!();

    println!("| prompt | concurrency | direct TTFT p50 / p99 (ms) | via gateway p50 / p99 (ms) | added p50 / p99 (ms) |");
    println!("| --- | --- | --- | --- | --- |");
    const CHAT: &str = "/v1/chat/completions";
    let mut cases: Vec<(String, &str, Bodies)> = vec![(
        "30 token ids".to_string(),
        "/v1/completions",
        fixed(ids_body(30)),
    )];
    for &w in &sizes {
        cases.push((format!("~{w} words, repeated"), CHAT, chat_bodies(w, false)));
        cases.push((format!("~{w} words, unique"), CHAT, chat_bodies(w, true)));
    }
    for (label, path, b) in cases {
        let (stub_url, via_url) = (format!("{stub}{path}"), format!("{via}{path}"));
        for c in [1, 64] {
            let (d, g) = interleaved(&stub_url, &via_url, b.clone(), requests, c).await;
            print_row(&label, c, &d, &g);
        }
    }
    let b = fixed(body(30, None));
    let direct = rate(&format!("{stub}{CHAT}"), b.clone(), 64, secs).await;
    let via_rate = rate(&format!("{via}{CHAT}"), b, 64, secs).await;
    println!();
    println!("closed loop, concurrency 64, {secs} s: direct {direct:.0} req/s, via gateway {via_rate:.0} req/s");
    println!();
    // Per streamed token: the gateway reads each chunk, watches it (first token, usage, the
    // text kept for a migration) and writes it on.
    const TOKENS: u64 = 1000;
    println!("| streams of {TOKENS} tokens, a chunk per write | concurrency | direct p50 (ms) | via gateway p50 (ms) | CPU per token, direct (µs) | via gateway (µs) | added (µs) |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    const STREAMS: usize = 200;
    for c in [1, 8] {
        let ((d, d_cpu), (g, g_cpu)) = per_token(
            &format!("{stub}{CHAT}"),
            &format!("{via}{CHAT}"),
            TOKENS,
            STREAMS,
            c,
        )
        .await;
        let per = |cpu: f64| cpu / (STREAMS as f64 * TOKENS as f64) * 1e6;
        println!(
            "| chat | {c} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            pct(&d, 0.5) * 1e3,
            pct(&g, 0.5) * 1e3,
            per(d_cpu),
            per(g_cpu),
            per(g_cpu) - per(d_cpu),
        );
    }
    let _ = stop_tx.send(());
    if let Some(t) = gateway_thread {
        let _ = t.join();
    }
}

/// `pd` mode: time to first token straight to the decode stub, through a gateway serving it
/// alone, and through a gateway splitting every request over a prefill stub and it (vLLM's
/// two legs), in alternating rounds.
async fn pd_overhead(requests: usize, threads: usize) {
    let (prefill, decode) = (start_stub(false).await, start_stub(false).await);
    let spec = |url: &str, role| WorkerSpec {
        url: url.to_string(),
        role,
        ..WorkerSpec::default()
    };
    let base = |workers| {
        let mut c = GatewayConfig {
            port: 0,
            models: vec![MODEL.into()],
            tokenizer: Some("builtin".into()),
            workers,
            ..GatewayConfig::default()
        };
        c.router.block_size = 16;
        c.router.policy.kind = kvroute_core::PolicyKind::Kv;
        c.router.admission.mode = kvroute_core::AdmissionMode::None;
        c
    };
    use kvroute_core::WorkerRole::{Both, Decode, Prefill};
    let aggregated = base(vec![spec(&decode, Both)]);
    let mut split = base(vec![spec(&prefill, Prefill), spec(&decode, Decode)]);
    split.router.disaggregation.mode = kvroute_core::policy::DisaggregationMode::Always;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let gateways = std::thread::spawn(move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let mut urls = Vec::new();
                let mut handles = Vec::new();
                for config in [aggregated, split] {
                    let pre = kvroute_gateway::load_preprocessor(&config).unwrap();
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                    let gw = kvroute_gateway::spawn(config, pre, listener, BTreeMap::new())
                        .await
                        .unwrap();
                    urls.push(gw.url());
                    handles.push(gw);
                }
                let _ = tx.send(urls);
                let _ = stop_rx.await;
                for gw in handles {
                    gw.shutdown().await;
                }
            })
    });
    let urls = rx.await.unwrap();
    let path = "/v1/completions";
    let (direct, agg, split) = (
        format!("{decode}{path}"),
        format!("{}{path}", urls[0]),
        format!("{}{path}", urls[1]),
    );
    // Each split request's legs on the stubs, checked once: the prefill leg went.
    let r = client()
        .post(&split)
        .header("content-type", "application/json")
        .body(ids_body(30))
        .send()
        .await
        .unwrap();
    assert!(
        r.headers().contains_key("x-kvroute-prefill-worker"),
        "not split"
    );
    let _ = r.bytes().await;
    println!("gateways on their own runtime, {threads} thread(s); 30 token ids, streamed, {requests} requests per cell");
    println!();
    println!("| concurrency | direct p50 / p99 (ms) | aggregated gateway | split gateway | added by the split p50 / p99 (ms) | one request to a stub, p50 (ms) |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let b = fixed(ids_body(30));
    for c in [1, 16] {
        let (d, a) = interleaved(&direct, &agg, b.clone(), requests, c).await;
        let (d2, sp) = interleaved(&direct, &split, b.clone(), requests, c).await;
        let ms = |v: &[f64], p: f64| pct(v, p) * 1e3;
        println!(
            "| {c} | {:.3} / {:.3} | {:.3} / {:.3} | {:.3} / {:.3} | {:.3} / {:.3} | {:.3} |",
            ms(&d, 0.5),
            ms(&d, 0.99),
            ms(&a, 0.5),
            ms(&a, 0.99),
            ms(&sp, 0.5),
            ms(&sp, 0.99),
            ms(&sp, 0.5) - ms(&a, 0.5),
            ms(&sp, 0.99) - ms(&a, 0.99),
            ms(&d2, 0.5),
        );
    }
    let _ = stop_tx.send(());
    let _ = gateways.join();
}

/// Envoy routing everything to `upstream` (host:port), no filter but the router.
fn plain_envoy(upstream: &str) -> String {
    let (host, port) = upstream.rsplit_once(':').unwrap();
    format!(
        r#"
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {{admin_port}}}}}}
static_resources:
  listeners:
  - name: plain
    address: {{socket_address: {{address: 127.0.0.1, port_value: {{port}}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: plain
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{{match: {{prefix: "/"}}, route: {{cluster: engine, timeout: 600s}}}}]
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: engine
    type: STATIC
    connect_timeout: 2s
    load_assignment:
      cluster_name: engine
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: {host}, port_value: {port}}}}}}}}}]}}]
"#
    )
}

/// The picker's cost: TTFT through Envoy asking the picker against Envoy alone, and the
/// closed-loop rate of both.
async fn epp_overhead(stub: &str, grpc_port: u16, requests: usize, secs: f64, threads: usize) {
    use kvroute_testkit::envoy::{self, Envoy};
    let upstream = stub.trim_start_matches("http://");
    let plain = Envoy::start(&plain_envoy(upstream)).expect("Envoy (bash scripts/tools.sh)");
    let picked = Envoy::start(&envoy::picker_config(envoy::FAIL_CLOSED, grpc_port, &[]))
        .expect("Envoy (bash scripts/tools.sh)");
    println!("endpoint picker on the gateway's runtime, {threads} thread(s); two Envoys (--concurrency 1)");
    println!();
    println!("| prompt | concurrency | Envoy alone TTFT p50 / p99 (ms) | Envoy + picker p50 / p99 (ms) | added p50 / p99 (ms) |");
    println!("| --- | --- | --- | --- | --- |");
    const CHAT: &str = "/v1/chat/completions";
    for words in [30, 2000] {
        let bodies = chat_bodies(words, true);
        let (direct, via) = (
            format!("{}{CHAT}", plain.url()),
            format!("{}{CHAT}", picked.url()),
        );
        for c in [1, 16] {
            let (d, g) = interleaved(&direct, &via, bodies.clone(), requests, c).await;
            print_row(&format!("~{words} words, unique"), c, &d, &g);
        }
    }
    // The closed loop, with this process's CPU (stub and client, plus the picker in the
    // second run): the difference per request is the picker's CPU, Envoy's being elsewhere.
    let b = chat_bodies(30, true);
    let cpu0 = cpu_secs();
    let alone = rate(&format!("{}{CHAT}", plain.url()), b.clone(), 16, secs).await;
    let cpu1 = cpu_secs();
    let with = rate(&format!("{}{CHAT}", picked.url()), b, 16, secs).await;
    let cpu2 = cpu_secs();
    let per = |cpu: f64, rate: f64| cpu / (rate * secs) * 1e3;
    let (alone_ms, with_ms) = (per(cpu1 - cpu0, alone), per(cpu2 - cpu1, with));
    println!();
    println!("closed loop, concurrency 16, {secs} s: Envoy alone {alone:.0} req/s, Envoy + picker {with:.0} req/s");
    println!(
        "CPU of this process per request (stub + client, + picker): {alone_ms:.3} ms alone, {with_ms:.3} ms with the picker: the picker {:.3} ms per request ({:.2} cores per 1,000 requests/s)",
        with_ms - alone_ms,
        with_ms - alone_ms
    );
}
