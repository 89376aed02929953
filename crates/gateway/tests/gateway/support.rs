//! Starting workers and gateways on 127.0.0.1 with ephemeral ports, and small HTTP helpers.

use kvroute_gateway::{EventFeed, GatewayConfig, GatewayHandle, Replay, WorkerSpec};
use kvroute_preprocess::Preprocessor;
use kvroute_protocol::kv_events::EventBatch;
use kvroute_worker::{WorkerConfig, WorkerHandle};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub const MODEL: &str = "kvroute-sim";

/// A simulated worker, fast (the `tiny-fast` profile at 20x real time).
pub async fn worker(name: &str) -> WorkerHandle {
    worker_with(name, |_| {}).await
}

pub async fn worker_with(name: &str, tweak: impl FnOnce(&mut WorkerConfig)) -> WorkerHandle {
    let mut cfg = WorkerConfig {
        model: MODEL.into(),
        profile: "tiny-fast".into(),
        speedup: 20.0,
        worker_name: name.into(),
        ..WorkerConfig::default()
    };
    tweak(&mut cfg);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    kvroute_worker::spawn(cfg, Preprocessor::builtin(), listener, None)
        .await
        .unwrap()
}

/// A simulated worker publishing its KV events over real ZMQ sockets (PUB and replay, on
/// ephemeral ports) in `format`, serving the LoRA adapter `sql` besides the base model.
pub async fn zmq_worker(
    name: &str,
    format: kvroute_protocol::kv_events::EventFormat,
) -> WorkerHandle {
    zmq_worker_with(name, format, |_| {}).await
}

/// [`zmq_worker`] with its config changed by `tweak`.
pub async fn zmq_worker_with(
    name: &str,
    format: kvroute_protocol::kv_events::EventFormat,
    tweak: impl FnOnce(&mut WorkerConfig),
) -> WorkerHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut cfg = WorkerConfig {
        model: MODEL.into(),
        profile: "tiny-fast".into(),
        speedup: 20.0,
        worker_name: name.into(),
        event_format: format,
        lora_adapters: vec!["sql".into()],
        ..WorkerConfig::default()
    };
    tweak(&mut cfg);
    let zmq = kvroute_worker::ZmqConfig {
        publish: "tcp://127.0.0.1:0".into(),
        connect: false,
        replay: Some("tcp://127.0.0.1:0".into()),
    };
    kvroute_worker::spawn(cfg, Preprocessor::builtin(), listener, Some(zmq))
        .await
        .unwrap()
}

/// Replays from a worker's in-process buffer.
pub struct BufferReplay(pub Arc<dyn Fn(u64) -> Vec<Arc<EventBatch>> + Send + Sync>);

impl Replay for BufferReplay {
    fn replay_from(
        &self,
        from: u64,
    ) -> futures_util::future::BoxFuture<'_, Result<Vec<Arc<EventBatch>>, String>> {
        let got = (self.0)(from);
        Box::pin(async move { Ok(got) })
    }
}

/// A gateway config for `workers` with the builtin tokenizer and block size 16.
pub fn config(workers: &[&WorkerHandle], policy: &str) -> GatewayConfig {
    let mut c = GatewayConfig {
        port: 0,
        models: vec![MODEL.into()],
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
    c.router.block_size = 16;
    c.router.policy.kind = policy.parse().unwrap();
    c.health.interval_secs = 0.2;
    c.health.timeout_secs = 1.0;
    c
}

/// Starts a gateway whose workers' events come over in-process channels.
pub async fn gateway(workers: &[&WorkerHandle], config: GatewayConfig) -> GatewayHandle {
    let feeds: BTreeMap<usize, EventFeed> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| (i, EventFeed::from_broadcast(w.subscribe(), None)))
        .collect();
    gateway_with_feeds(config, feeds).await
}

pub async fn gateway_with_feeds(
    config: GatewayConfig,
    feeds: BTreeMap<usize, EventFeed>,
) -> GatewayHandle {
    // Logs when asked (`RUST_LOG=kvroute_gateway=debug`), captured per test.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let pre = kvroute_gateway::load_preprocessor(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    kvroute_gateway::spawn(config, pre, listener, feeds)
        .await
        .unwrap()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A chat request body.
pub fn chat(messages: &[(&str, &str)], stream: bool, max_tokens: u32) -> serde_json::Value {
    let messages: Vec<_> = messages
        .iter()
        .map(|(r, c)| serde_json::json!({"role": r, "content": c}))
        .collect();
    serde_json::json!({
        "model": MODEL,
        "messages": messages,
        "stream": stream,
        "max_tokens": max_tokens,
        "stream_options": if stream { serde_json::json!({"include_usage": true}) } else { serde_json::Value::Null },
    })
}

/// POSTs `body` to the gateway's `path`; returns status, the worker header and the JSON.
pub async fn post(
    url: &str,
    path: &str,
    body: &serde_json::Value,
) -> (u16, Option<String>, serde_json::Value) {
    let r = client()
        .post(format!("{url}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let worker = r
        .headers()
        .get("x-kvroute-worker")
        .map(|v| v.to_str().unwrap().to_string());
    let json = r.json().await.unwrap_or(serde_json::Value::Null);
    (status, worker, json)
}

/// A tenant `small` (key `sk-small`) whose bucket holds less than one request: the first
/// goes on a full bucket, into debt, and a second at once is over its quota.
pub fn small_tenant() -> kvroute_core::flow::TenantConfig {
    kvroute_core::flow::TenantConfig {
        name: "small".into(),
        tokens_per_sec: Some(2.0),
        burst_tokens: Some(1),
        api_keys: vec!["sk-small".into()],
        ..Default::default()
    }
}

/// POSTs a chat `body` with API key `key` and, when given, a class header; returns the
/// status, the `Retry-After` header and the JSON.
pub async fn post_as(
    url: &str,
    key: &str,
    class: Option<&str>,
    body: &serde_json::Value,
) -> (u16, Option<String>, serde_json::Value) {
    let mut req = client()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .json(body);
    if let Some(c) = class {
        req = req.header("x-kvroute-class", c);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    (status, retry, r.json().await.unwrap_or_default())
}

/// Checks `f` until it is true, for at most `secs` seconds.
pub async fn eventually(secs: u64, f: impl AsyncFnMut() -> bool) -> bool {
    kvroute_testkit::eventually(Duration::from_secs(secs), f).await
}

/// The gateway's `/debug/workers` answer.
pub async fn debug_workers(url: &str) -> serde_json::Value {
    kvroute_testkit::get_json(&client(), &format!("{url}/debug/workers")).await
}

/// Index blocks of the `i`-th worker as the gateway shows them.
pub async fn index_blocks(url: &str, i: usize) -> u64 {
    debug_workers(url).await["workers"][i]["index_blocks"]
        .as_u64()
        .unwrap()
}

/// One chat request of `model` (with a `cache_salt` when given): the worker that served it,
/// the cached tokens the router predicted there and those the engine reported.
pub async fn ask_cached(
    url: &str,
    model: &str,
    salt: Option<&str>,
    text: &str,
) -> (String, u64, u64) {
    let mut body = chat(&[("user", text)], false, 2);
    body["model"] = model.into();
    if let Some(s) = salt {
        body["cache_salt"] = s.into();
    }
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let header = |n: &str| r.headers().get(n).unwrap().to_str().unwrap().to_string();
    let worker = header("x-kvroute-worker");
    let predicted: u64 = header(kvroute_gateway::PREDICTED_CACHED_HEADER)
        .parse()
        .unwrap();
    let json: serde_json::Value = r.json().await.unwrap();
    let cached = json["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (worker, predicted, cached)
}

/// A streamed request for a long answer (4,000 tokens) whose first chunk has arrived: it
/// keeps its worker busy until the stream is dropped.
pub async fn long_stream(
    url: &str,
) -> impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> {
    use futures_util::StreamExt;
    let long = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat(&[("user", "a long answer please")], true, 4000))
        .send()
        .await
        .unwrap();
    assert_eq!(long.status(), 200);
    let mut stream = Box::pin(long.bytes_stream());
    assert!(stream.next().await.is_some());
    stream
}

/// Names of the workers the gateway's `/debug/workers` lists, in id order.
pub async fn worker_names(url: &str) -> Vec<String> {
    debug_workers(url).await["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["worker"]["name"].as_str().unwrap().to_string())
        .collect()
}

/// The port a worker listens on.
pub fn worker_port(w: &WorkerHandle) -> u16 {
    w.url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap()
}
