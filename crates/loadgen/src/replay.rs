//! Trace replay: each request of a Mooncake trace is sent at its own time (open loop), as a
//! `/v1/completions` request whose prompt is the token ids its hash blocks stand for (equal
//! hash ids give equal token blocks, so the trace's prefix sharing reaches the server), asking
//! for the trace's output length. TTFT counts from the scheduled time, so a late send (the
//! in-flight bound reached) shows up as latency, not as a shorter trace.

use crate::observer::{Finished, Observer, ObserverConfig};
use crate::turn::send_streamed;
use crate::{check_url, LoadgenError, RunResult};
use kvroute_workload::TraceRequest;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// Settings of a replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayConfig {
    /// Base URL of the endpoint.
    pub target: String,
    /// The `model` of every request.
    pub model: String,
    /// Seconds one request may take.
    pub request_timeout_secs: f64,
    /// Send `ignore_eos: true`.
    pub ignore_eos: bool,
    /// Most requests in flight; later ones wait (and their wait counts in their TTFT).
    pub max_in_flight: usize,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        Self {
            target: "http://127.0.0.1:8000".into(),
            model: "kvroute-sim".into(),
            request_timeout_secs: 300.0,
            ignore_eos: true,
            max_in_flight: 4096,
        }
    }
}

/// Replays `requests` (in arrival order) against the target.
pub async fn replay(
    config: ReplayConfig,
    requests: Vec<TraceRequest>,
) -> Result<RunResult, LoadgenError> {
    check_url("target", &config.target)?;
    if config.max_in_flight == 0
        || !(config.request_timeout_secs.is_finite() && config.request_timeout_secs > 0.0)
    {
        return Err(LoadgenError::Config(
            "max_in_flight and request_timeout_secs must be > 0".into(),
        ));
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(config.max_in_flight.min(1024))
        .build()?;
    let observer = Arc::new(Observer::new(&ObserverConfig::default()));
    let url = format!("{}/v1/completions", config.target.trim_end_matches('/'));
    let timeout = Duration::from_secs_f64(config.request_timeout_secs);
    let slots = Arc::new(tokio::sync::Semaphore::new(config.max_in_flight));
    let t0 = observer.epoch();
    let mut tasks = Vec::with_capacity(requests.len());
    for (i, req) in requests.into_iter().enumerate() {
        let due = t0 + req.arrival.0;
        tokio::time::sleep_until(due.into()).await;
        let (client, url, observer, slots, model) = (
            client.clone(),
            url.clone(),
            observer.clone(),
            slots.clone(),
            config.model.clone(),
        );
        let ignore_eos = config.ignore_eos;
        tasks.push(tokio::spawn(async move {
            let Ok(_permit) = slots.acquire().await else {
                return;
            };
            let body = serde_json::json!({
                "model": model,
                "prompt": req.prompt.materialize(),
                "max_tokens": req.max_tokens,
            });
            observer.request_started();
            let result = send_streamed(&client, &url, body, None, ignore_eos, timeout).await;
            observer.finished(Finished {
                conversation: i as u64,
                turn: 1,
                chat: false,
                sent: due,
                result,
                ends: None,
            });
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    Ok(observer.take(t0.elapsed()))
}
