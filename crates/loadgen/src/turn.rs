//! One chat turn over the wire: a streamed request, timed chunk by chunk (first token,
//! inter-token gaps, end), with the usage the server reports and how it ended.

use kvroute_protocol::openai::{SseEvent, SseParser, Usage};
use kvroute_workload::{ChatTurn, Status};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// What one turn measured.
#[derive(Clone, Debug)]
pub struct TurnResult {
    /// When the first content arrived.
    pub first_token: Option<Instant>,
    /// When the answer ended (or failed).
    pub finished: Instant,
    /// Gaps between content chunks, in seconds.
    pub gaps: Vec<f64>,
    /// The answer's text.
    pub answer: String,
    /// Content chunks received.
    pub chunks: u64,
    /// The server's usage, when it sent one.
    pub usage: Option<Usage>,
    /// The worker that served it (`x-kvroute-worker`), when the server says.
    pub worker: Option<String>,
    /// The worker that computed its prompt when another did (`x-kvroute-prefill-worker`:
    /// disaggregated prefill), when the server says.
    pub prefill_worker: Option<String>,
    /// The prompt tokens the router expected that worker to have cached
    /// (`x-kvroute-predicted-cached-tokens`), when the server says.
    pub predicted_cached_tokens: Option<u64>,
    /// Why the router chose that worker (`x-kvroute-route`), when the server says.
    pub route: Option<RouteExplanation>,
    /// How it ended.
    pub status: Status,
    /// When refused: how long the server asked the client to wait (`Retry-After` in
    /// seconds, at most [`MAX_RETRY_AFTER`]).
    pub retry_after: Option<Duration>,
}

/// The longest `Retry-After` the load generator honours.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// A `Retry-After` header in seconds (an HTTP date is not honoured), at most
/// [`MAX_RETRY_AFTER`].
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let secs: f64 = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (secs.is_finite() && secs >= 0.0)
        .then(|| Duration::from_secs_f64(secs.min(MAX_RETRY_AFTER.as_secs_f64())))
}

/// A kvroute gateway's explanation of one routing decision, as its `x-kvroute-route` header
/// gives it (asked for with `x-kvroute-explain: 1`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(default)]
pub struct RouteExplanation {
    /// The routing policy.
    pub policy: String,
    /// Prompt tokens as the router counted them.
    pub prompt_tokens: u64,
    /// Tokens per KV block.
    pub block_size: u64,
    /// Workers left out of the list.
    pub omitted: u64,
    /// The chosen worker first, then the others by cost.
    pub workers: Vec<RouteTerms>,
}

/// One worker's terms in a routing decision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(default)]
pub struct RouteTerms {
    /// The worker's name.
    pub name: String,
    /// Leading prompt blocks the router believed it holds.
    pub matched_blocks: u64,
    /// Prompt blocks after those it could load back from host memory.
    pub host_blocks: u64,
    /// Prompt blocks after those it could load back from disk.
    pub disk_blocks: u64,
    /// Prompt tokens it would have to compute.
    pub uncached_tokens: u64,
    /// Requests in flight on it.
    pub inflight: u64,
    /// Prefill tokens outstanding on it.
    pub prefill_tokens: u64,
    /// Busy by the admission thresholds.
    pub busy: bool,
    /// Offered to the policy.
    pub eligible: bool,
    /// The policy's cost (lower wins), when it computes one.
    pub cost: Option<f64>,
    /// Whether it was chosen.
    pub chosen: bool,
}

/// Most workers kept of an explanation, and the longest worker name kept.
const MAX_ROUTE_WORKERS: usize = 16;
const MAX_NAME_BYTES: usize = 128;

/// Reads an `x-kvroute-route` header, bounded; None when it is not one.
fn route_of(v: &reqwest::header::HeaderValue) -> Option<RouteExplanation> {
    let mut r: RouteExplanation = serde_json::from_slice(v.as_bytes()).ok()?;
    if r.workers.len() > MAX_ROUTE_WORKERS {
        r.omitted += (r.workers.len() - MAX_ROUTE_WORKERS) as u64;
        r.workers.truncate(MAX_ROUTE_WORKERS);
    }
    r.policy.truncate(64);
    for w in &mut r.workers {
        if w.name.len() > MAX_NAME_BYTES {
            let cut = (0..=MAX_NAME_BYTES)
                .rev()
                .find(|&i| w.name.is_char_boundary(i))
                .unwrap_or(0);
            w.name.truncate(cut);
        }
    }
    Some(r)
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    delta: Option<ChunkDelta>,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct ChunkDelta {
    #[serde(default)]
    content: Option<String>,
}

/// The longest answer text kept (the rest is counted, not stored).
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Sends `turn` to `url` (`.../v1/chat/completions`) and reads the stream to its end.
pub async fn send(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    turn: &ChatTurn,
    ignore_eos: bool,
    timeout: Duration,
) -> TurnResult {
    let body = serde_json::json!({
        "model": model,
        "messages": turn.messages,
        "max_tokens": turn.max_tokens,
    });
    send_streamed(
        client,
        url,
        body,
        Some(turn.conversation),
        ignore_eos,
        timeout,
    )
    .await
}

/// Sends a request `body` (chat or completions; `stream` and `stream_options` are set here)
/// and reads the stream to its end; `session` goes out as `x-session-id`.
pub async fn send_streamed(
    client: &reqwest::Client,
    url: &str,
    mut body: serde_json::Value,
    session: Option<u64>,
    ignore_eos: bool,
    timeout: Duration,
) -> TurnResult {
    let start = Instant::now();
    body["stream"] = serde_json::Value::Bool(true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    if ignore_eos {
        body["ignore_eos"] = serde_json::Value::Bool(true);
    }
    let mut r = TurnResult {
        first_token: None,
        finished: start,
        gaps: Vec::new(),
        answer: String::new(),
        chunks: 0,
        usage: None,
        worker: None,
        prefill_worker: None,
        predicted_cached_tokens: None,
        route: None,
        status: Status::Completed,
        retry_after: None,
    };
    let deadline = tokio::time::Instant::from_std(start + timeout);
    let resp = match tokio::time::timeout_at(deadline, {
        // A kvroute gateway then says why it chose the worker; other servers ignore it.
        let req = client
            .post(url)
            .header("x-kvroute-explain", "1")
            .json(&body);
        match session {
            Some(s) => req.header("x-session-id", s.to_string()),
            None => req,
        }
        .send()
    })
    .await
    {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => return failed(r, if e.is_connect() { "connect" } else { "request" }),
        Err(_) => return failed(r, "timeout"),
    };
    r.worker = resp
        .headers()
        .get("x-kvroute-worker")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    r.prefill_worker = resp
        .headers()
        .get("x-kvroute-prefill-worker")
        .and_then(|v| v.to_str().ok())
        .map(|s| s.chars().take(256).collect());
    r.predicted_cached_tokens = resp
        .headers()
        .get("x-kvroute-predicted-cached-tokens")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    r.route = resp.headers().get("x-kvroute-route").and_then(route_of);
    let status = resp.status();
    if !status.is_success() {
        let wait = retry_after(resp.headers());
        let code = error_code(resp, deadline).await;
        r.finished = Instant::now();
        r.status = if status.as_u16() == 503 || status.as_u16() == 429 {
            r.retry_after = wait;
            Status::Rejected(code.unwrap_or_else(|| format!("http_{}", status.as_u16())))
        } else {
            Status::Failed(format!("http_{}", status.as_u16()))
        };
        return r;
    }
    let mut resp = resp;
    let mut parser = SseParser::new();
    let mut events = Vec::new();
    let mut last = None;
    let mut done = false;
    loop {
        let chunk = match tokio::time::timeout_at(deadline, resp.chunk()).await {
            Ok(Ok(Some(c))) => c,
            Ok(Ok(None)) => break,
            Ok(Err(_)) => return failed(r, "stream_broken"),
            Err(_) => return failed(r, "timeout"),
        };
        if parser.feed(&chunk, &mut events).is_err() {
            return failed(r, "bad_stream");
        }
        let now = Instant::now();
        for ev in events.drain(..) {
            let data = match ev {
                SseEvent::Done => {
                    done = true;
                    continue;
                }
                SseEvent::Data(d) => d,
            };
            let Ok(c) = serde_json::from_str::<Chunk>(&data) else {
                continue;
            };
            if c.error.is_some() {
                return failed(r, "stream_error");
            }
            if c.usage.is_some() {
                r.usage = c.usage;
            }
            let text: String = c
                .choices
                .iter()
                .filter_map(|ch| {
                    ch.delta
                        .as_ref()
                        .and_then(|d| d.content.clone())
                        .or_else(|| ch.text.clone())
                })
                .collect();
            if text.is_empty() {
                continue;
            }
            r.chunks += 1;
            match last {
                None => r.first_token = Some(now),
                Some(prev) => r.gaps.push(now.duration_since(prev).as_secs_f64()),
            }
            last = Some(now);
            if r.answer.len() + text.len() <= MAX_ANSWER_BYTES {
                r.answer.push_str(&text);
            }
        }
    }
    r.finished = Instant::now();
    if !done {
        r.status = Status::Failed("no_done".into());
    }
    r
}

fn failed(mut r: TurnResult, why: &str) -> TurnResult {
    r.finished = Instant::now();
    r.status = Status::Failed(why.to_string());
    r
}

/// The `error.code` of an error answer, read with a bound.
async fn error_code(resp: reqwest::Response, deadline: tokio::time::Instant) -> Option<String> {
    let bytes = tokio::time::timeout_at(deadline, resp.bytes())
        .await
        .ok()?
        .ok()?;
    if bytes.len() > 1 << 20 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    v["error"]["code"].as_str().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_gateways_worker_headers_are_kept_with_the_answer() {
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(|| async {
                let chunk = serde_json::json!({"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]});
                (
                    [
                        ("content-type", "text/event-stream"),
                        ("x-kvroute-worker", "decode-1"),
                        ("x-kvroute-prefill-worker", "prefill-1"),
                        ("x-kvroute-predicted-cached-tokens", "64"),
                    ],
                    format!("data: {chunk}\n\ndata: [DONE]\n\n"),
                )
            }),
        );
        let url = kvroute_testkit::serve(app).await;
        let body =
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let r = send_streamed(
            &reqwest::Client::new(),
            &format!("{url}/v1/chat/completions"),
            body,
            None,
            false,
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(r.worker.as_deref(), Some("decode-1"));
        assert_eq!(r.prefill_worker.as_deref(), Some("prefill-1"));
        assert_eq!(r.predicted_cached_tokens, Some(64));
        assert_eq!(r.answer, "hi");
    }
}
