//! Health checking: each worker's `/health` is polled. A worker whose engine refuses
//! connections `failures_to_remove` times in a row is taken out of routing at once; one that
//! times out or answers with an error as often is taken out only while another worker passes
//! the same round, so checks that fail together (an overloaded host, the gateway's own
//! stall) do not empty the fleet. A worker taken out keeps its index entries (see
//! [`Gateway::take_out`]) and comes back on its first passing check. Each pass also learns
//! the model names the workers serve.

use crate::capacity::Capacity;
use crate::config::HealthConfig;
use crate::config::WorkerSpec;
use crate::models::Models;
use crate::registry::Registry;
use crate::upstream::with_key;
use crate::upstream::Upstream;
use crate::workers::Workers;
use kvroute_core::WorkerId;
use kvroute_protocol::openai::{ModelCard, ModelList};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// What one check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    /// `/health` answered 2xx.
    Passed,
    /// Nothing listens: the engine is gone.
    Refused,
    /// A timeout or an error status: slow or unwell, maybe only for now.
    Failed,
}

/// What the health checks need: their settings, calls to workers, the registry and the
/// workers' standing, the model names to learn, capacity learning.
pub struct HealthChecks {
    /// The `[health]` settings.
    pub config: HealthConfig,
    /// Calls to workers.
    pub upstream: Arc<Upstream>,
    /// The workers.
    pub registry: Arc<Registry>,
    /// Taking workers out and back.
    pub workers: Arc<Workers>,
    /// The model names learned from workers.
    pub models: Arc<Models>,
    /// Capacity learned from workers' metrics.
    pub capacity: Arc<Capacity>,
}

/// Checks every worker forever, one pass per interval.
pub async fn run(hc: Arc<HealthChecks>) {
    let interval = Duration::from_secs_f64(hc.config.interval_secs);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        pass(&hc).await;
    }
}

/// One round over every worker, then the decisions. Workers at one URL (the data-parallel
/// ranks of an engine) share one check and one model list per round.
async fn pass(hc: &Arc<HealthChecks>) {
    let workers = hc.registry.all();
    let mut urls: Vec<(&str, Option<&str>)> = workers
        .iter()
        .map(|w| (w.spec.url.as_str(), hc.upstream.key_for(&w.spec)))
        .collect();
    urls.sort_unstable();
    urls.dedup_by_key(|u| u.0);
    let keys: HashMap<&str, Option<&str>> = urls.iter().copied().collect();
    let probes = urls
        .into_iter()
        .map(|(url, key)| async move { (url, probe(hc, url, key).await) });
    let by_url: HashMap<&str, Probe> = futures_util::future::join_all(probes)
        .await
        .into_iter()
        .collect();
    let results: Vec<(WorkerId, Probe)> = workers
        .iter()
        .map(|w| (w.id, by_url[w.spec.url.as_str()]))
        .collect();
    let passing = results.iter().filter(|r| r.1 == Probe::Passed).count();
    let timeout = Duration::from_secs_f64(hc.config.timeout_secs);
    for (url, _) in by_url.iter().filter(|(_, &p)| p == Probe::Passed) {
        learn_models(hc, url.trim_end_matches('/'), keys[url], timeout).await;
        let unknown = workers
            .iter()
            .any(|w| w.spec.url == *url && crate::capacity::unknown(w));
        if unknown {
            learn_capacity(hc, url, keys[url], timeout).await;
        }
    }
    hc.capacity.warn_unknown();
    for (id, result) in results {
        let Some(w) = hc.registry.get(id) else {
            continue;
        };
        if result == Probe::Passed {
            w.succeed();
            if !w.is_up() {
                hc.workers.bring_back(id);
            }
            continue;
        }
        let failures = w.fail();
        tracing::debug!(worker = %w.name, failures, ?result, "health check failed");
        if failures < hc.config.failures_to_remove || !w.is_up() {
            continue;
        }
        if result == Probe::Refused {
            hc.workers.take_out(id, "its engine refuses connections");
        } else if passing > 0 {
            hc.workers.take_out(id, "health checks failed");
        } else if failures == hc.config.failures_to_remove {
            tracing::warn!(worker = %w.name, "every worker failed its health check in the same round: keeping them in service (an overloaded host fails them all together)");
        }
    }
}

/// One check of the engine at `url`.
async fn probe(hc: &HealthChecks, url: &str, key: Option<&str>) -> Probe {
    let base = url.trim_end_matches('/');
    let timeout = Duration::from_secs_f64(hc.config.timeout_secs);
    match with_key(hc.upstream.client().get(format!("{base}/health")), key)
        .timeout(timeout)
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => Probe::Passed,
        Ok(_) => Probe::Failed,
        Err(e) if e.is_connect() && !e.is_timeout() => Probe::Refused,
        Err(_) => Probe::Failed,
    }
}

/// A GET of `base``path` with the worker's key: its body when it answers 200 within
/// `timeout` with at most `limit` bytes (read piece by piece: a larger body is dropped
/// unread past the limit).
async fn get_bounded(
    upstream: &Upstream,
    url: String,
    key: Option<&str>,
    timeout: Duration,
    limit: usize,
) -> Option<Vec<u8>> {
    let read = async {
        let mut resp = with_key(upstream.client().get(url), key)
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.ok()? {
            if body.len() + chunk.len() > limit {
                return None;
            }
            body.extend_from_slice(&chunk);
        }
        Some(body)
    };
    tokio::time::timeout(timeout, read).await.ok().flatten()
}

async fn learn_models(hc: &HealthChecks, base: &str, key: Option<&str>, timeout: Duration) {
    if let Some(cards) = models_at(&hc.upstream, base, key, timeout).await {
        hc.models.learn(&cards);
    }
}

/// What the engine at `base` lists at `/v1/models`, when it answers within `timeout`.
async fn models_at(
    upstream: &Upstream,
    base: &str,
    key: Option<&str>,
    timeout: Duration,
) -> Option<Vec<ModelCard>> {
    // A model list is small.
    let url = format!("{base}/v1/models");
    let bytes = get_bounded(upstream, url, key, timeout, 1 << 20).await?;
    serde_json::from_slice::<ModelList>(&bytes)
        .ok()
        .map(|l| l.data)
}

/// The models the engine `spec` lists at `/v1/models` (asked with its key), when it answers
/// within `timeout`: how discovery shared between pools learns an engine's model.
pub async fn served_models(
    upstream: &Upstream,
    spec: &WorkerSpec,
    timeout: Duration,
) -> Option<Vec<ModelCard>> {
    let base = spec.url.trim_end_matches('/');
    models_at(upstream, base, upstream.key_for(spec), timeout).await
}

/// The engine's KV capacity from its metrics (vLLM's `vllm:cache_config_info`), for the
/// workers at `url` without a configured one.
async fn learn_capacity(hc: &HealthChecks, url: &str, key: Option<&str>, timeout: Duration) {
    // vLLM's metrics text is a few hundred KiB with every histogram.
    let metrics = format!("{}/metrics", url.trim_end_matches('/'));
    let Some(bytes) = get_bounded(&hc.upstream, metrics, key, timeout, 8 << 20).await else {
        return;
    };
    hc.capacity.learn(url, &String::from_utf8_lossy(&bytes));
}
