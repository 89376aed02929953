//! What the dashboard shows of the fleet behind the target (`GET /api/fleet`): the routing
//! policy and every worker's in-flight requests from a kvroute gateway's `/debug/workers`, with
//! KV usage, busy ratio, queue time and running / waiting requests read from each worker's
//! `/metrics` (kvroute or vLLM names, through `kvroute_protocol::prometheus_text`), as
//! `WorkerCard`s. Answers are cached for a second, every upstream call is bounded in time and
//! size, and a target that is not a kvroute gateway gives `available: false` with the reason.

use crate::flow_cards::{ClassCard, FlowHistory, RefusalCard};
use kvroute_protocol::openai::ModelList;
use kvroute_protocol::prometheus_text::{first_value, samples};
use parking_lot::Mutex;
use serde::Serialize;
use std::time::{Duration, Instant};

/// One worker as the dashboard shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct WorkerCard {
    /// Its name.
    pub name: String,
    /// Its base URL.
    pub url: String,
    /// Whether the gateway sends it traffic.
    pub up: bool,
    /// Its role in a disaggregated fleet (`both`, `prefill`, `decode`), when the gateway
    /// says.
    pub role: Option<String>,
    /// The engine behind it, from its metrics (`vLLM`, `SGLang`, or kvroute's simulated
    /// engine with its profile).
    pub engine: Option<String>,
    /// The model it serves, from its metrics.
    pub model: Option<String>,
    /// Requests the gateway has in flight on it.
    pub inflight: Option<u64>,
    /// Prefix blocks the gateway's index holds for it.
    pub index_blocks: Option<u64>,
    /// Fraction of its KV cache in use.
    pub kv_usage: Option<f64>,
    /// Fraction of time it spent computing (simulated workers).
    pub busy: Option<f64>,
    /// Mean seconds a request waited before its first step.
    pub queue_time_secs: Option<f64>,
    /// Requests running.
    pub running: Option<f64>,
    /// Requests waiting.
    pub waiting: Option<f64>,
    /// How far the gateway trusts its index of it (`exact`, `catching_up`, `unknown`,
    /// `approximate`).
    pub cache_state: Option<String>,
    /// The gateway's prediction accuracy for it over its recent requests.
    pub accuracy: Option<AccuracyCard>,
}

/// How well the gateway predicted a worker's cached tokens (its `/debug/workers` accuracy).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct AccuracyCard {
    /// Requests in the recent window.
    pub samples: u64,
    /// Share of them predicted exactly.
    pub exact_ratio: Option<f64>,
    /// Their mean absolute error, in tokens.
    pub mean_abs_error_tokens: Option<f64>,
    /// Over- and under-predictions among them.
    pub over: u64,
    /// Under-predictions among them.
    pub under: u64,
    /// Why the gateway marked the worker degraded, when it did.
    pub degraded: Option<String>,
    /// Times its index was rebuilt for it.
    pub repairs: u64,
}

impl AccuracyCard {
    fn of(a: &serde_json::Value) -> Option<Self> {
        let u = |k: &str| a[k].as_u64().unwrap_or(0);
        a.is_object().then(|| Self {
            samples: u("samples"),
            exact_ratio: a["exact_ratio"].as_f64(),
            mean_abs_error_tokens: a["mean_abs_error_tokens"].as_f64(),
            over: u("over"),
            under: u("under"),
            degraded: a["degraded"].as_str().map(|s| s.chars().take(64).collect()),
            repairs: u("repairs"),
        })
    }
}

/// The fleet behind the target.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct Fleet {
    /// Whether the target told its workers (a kvroute gateway does).
    pub available: bool,
    /// Why not, when not.
    pub error: Option<String>,
    /// The gateway's routing policy.
    pub policy: Option<String>,
    /// Requests waiting in the gateway's admission queue (its `kvroute_queued_requests`).
    pub queued: Option<f64>,
    /// Its workers.
    pub workers: Vec<WorkerCard>,
    /// Each role's workers and load together, for the roles that have workers (the
    /// gateway's `/debug/workers` `pools`).
    pub pools: Vec<PoolCard>,
    /// Each class's time to first token over the last minute (the gateway's metrics).
    pub classes: Vec<ClassCard>,
    /// Refusals by tenant, class and reason (the gateway's metrics).
    pub refusals: Vec<RefusalCard>,
    /// The models the target serves (its `/v1/models`, at most [`MAX_MODELS`]; also when
    /// it is not a kvroute gateway).
    pub models: Vec<String>,
    /// The gateway's pool these views are of, when it serves several models (its
    /// `/debug/workers` `model`).
    pub pool: Option<String>,
}

/// The workers of one role together.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct PoolCard {
    /// The role: `both`, `prefill` or `decode`.
    pub role: String,
    /// Its workers.
    pub workers: u64,
    /// Requests the gateway has in flight on them.
    pub inflight: u64,
    /// Prompt tokens without a first token yet on them.
    pub prefill_tokens: u64,
}

/// Largest upstream answer read, in bytes.
const MAX_ANSWER_BYTES: usize = 4 << 20;
/// Most workers shown.
const MAX_WORKERS: usize = 256;
/// Most model names listed.
pub const MAX_MODELS: usize = 64;
/// Longest model name listed.
const MAX_MODEL_NAME: usize = 256;

/// Reads the fleet behind a target, at most once a second.
pub struct FleetReader {
    target: String,
    client: reqwest::Client,
    /// The last read: when, of which model, what.
    cache: tokio::sync::Mutex<Option<(Instant, String, Fleet)>>,
    last_error: Mutex<Option<String>>,
    flow: Mutex<FlowHistory>,
}

impl FleetReader {
    /// A reader of `target`'s fleet.
    pub fn new(target: &str) -> Self {
        Self {
            target: target.trim_end_matches('/').to_string(),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap_or_default(),
            cache: tokio::sync::Mutex::new(None),
            last_error: Mutex::new(None),
            flow: Mutex::new(FlowHistory::default()),
        }
    }

    /// The fleet now serving `model` (from the cache when younger than a second): with a
    /// gateway serving several models, the workers and flow figures of that model's pool.
    pub async fn read(&self, model: &str) -> Fleet {
        let mut cache = self.cache.lock().await;
        if let Some((at, of, fleet)) = cache.as_ref() {
            if at.elapsed() < Duration::from_secs(1) && of == model {
                return fleet.clone();
            }
        }
        let models = self.models().await;
        let several = models.len() > 1;
        let fleet = match self.fetch(several.then_some(model)).await {
            Ok(f) => f,
            Err(e) => {
                let last = self.last_error.lock().replace(e.clone());
                if last.as_deref() != Some(e.as_str()) {
                    tracing::debug!(target = %self.target, error = %e, "fleet not available");
                }
                Fleet {
                    available: false,
                    error: Some(e),
                    ..Fleet::default()
                }
            }
        };
        let fleet = Fleet { models, ..fleet };
        *cache = Some((Instant::now(), model.to_string(), fleet.clone()));
        fleet
    }

    /// The models the target lists at `/v1/models` (none when it does not answer).
    async fn models(&self) -> Vec<String> {
        let Ok(text) = self.get(&format!("{}/v1/models", self.target)).await else {
            return Vec::new();
        };
        let Ok(list) = serde_json::from_str::<ModelList>(&text) else {
            return Vec::new();
        };
        let mut names: Vec<String> = (list.data.into_iter())
            .map(|m| m.id)
            .filter(|id| !id.is_empty() && id.len() <= MAX_MODEL_NAME)
            .take(MAX_MODELS)
            .collect();
        names.dedup();
        names
    }

    async fn get(&self, url: &str) -> Result<String, String> {
        let resp = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("{url} answered {}", resp.status()));
        }
        let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
        if bytes.len() > MAX_ANSWER_BYTES {
            return Err(format!("{url} answered more than {MAX_ANSWER_BYTES} bytes"));
        }
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{url} answered non-UTF-8"))
    }

    /// The fleet behind the target: of `model`'s pool when given.
    async fn fetch(&self, model: Option<&str>) -> Result<Fleet, String> {
        let mut url = reqwest::Url::parse(&format!("{}/debug/workers", self.target))
            .map_err(|e| format!("{}: {e}", self.target))?;
        if let Some(m) = model {
            url.query_pairs_mut().append_pair("model", m);
        }
        let text = self.get(url.as_str()).await?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("/debug/workers: {e}"))?;
        let pool = (v["model"].as_str())
            .filter(|p| !p.is_empty())
            .map(|p| p.chars().take(MAX_MODEL_NAME).collect::<String>());
        let list = v["workers"]
            .as_array()
            .ok_or("the target's /debug/workers lists no workers (not a kvroute gateway?)")?;
        let mut workers: Vec<WorkerCard> = list
            .iter()
            .take(MAX_WORKERS)
            .map(|w| WorkerCard {
                name: w["worker"]["name"].as_str().unwrap_or_default().to_string(),
                url: w["worker"]["url"].as_str().unwrap_or_default().to_string(),
                up: w["worker"]["health"] == "up",
                role: w["role"].as_str().map(|s| s.chars().take(16).collect()),
                inflight: w["load"]["inflight"].as_u64(),
                index_blocks: w["index_blocks"].as_u64(),
                cache_state: w["worker"]["cache_state"]
                    .as_str()
                    .map(|s| s.chars().take(32).collect()),
                accuracy: AccuracyCard::of(&w["worker"]["accuracy"]),
                ..WorkerCard::default()
            })
            .collect();
        let scrapes = workers.iter().map(|w| {
            let url = format!("{}/metrics", w.url.trim_end_matches('/'));
            async move { self.get(&url).await.ok() }
        });
        let (texts, gateway) = futures_util::future::join(
            futures_util::future::join_all(scrapes),
            self.get(&format!("{}/metrics", self.target)),
        )
        .await;
        for (w, text) in workers.iter_mut().zip(texts) {
            if let Some(text) = text {
                apply_metrics(w, &text);
            }
        }
        let gateway = gateway.ok();
        let flow = (gateway.as_deref())
            .map(|t| self.flow.lock().read(Instant::now(), t, pool.as_deref()))
            .unwrap_or_default();
        let queued = gateway.as_deref().and_then(|t| match &pool {
            Some(p) => samples(t)
                .find(|s| {
                    s.name == "kvroute_queued_requests" && s.label("model").as_deref() == Some(p)
                })
                .map(|s| s.value),
            None => first_value(t, "kvroute_queued_requests"),
        });
        Ok(Fleet {
            available: true,
            error: None,
            policy: v["policy"].as_str().map(str::to_string),
            queued,
            workers,
            pools: pools_of(&v["pools"]),
            classes: flow.classes,
            refusals: flow.refusals,
            models: Vec::new(),
            pool,
        })
    }
}

/// The pools of a `/debug/workers` answer that have workers, in the gateway's order.
fn pools_of(v: &serde_json::Value) -> Vec<PoolCard> {
    let Some(map) = v.as_object() else {
        return Vec::new();
    };
    map.iter()
        .take(8)
        .map(|(role, p)| PoolCard {
            role: role.chars().take(16).collect(),
            workers: p["workers"].as_u64().unwrap_or(0),
            inflight: p["inflight"].as_u64().unwrap_or(0),
            prefill_tokens: p["prefill_tokens"].as_u64().unwrap_or(0),
        })
        .filter(|p| p.workers > 0)
        .collect()
}

/// The value of label `label` on the first series whose name starts with `prefix`.
fn label_value(text: &str, prefix: &str, label: &str) -> Option<String> {
    samples(text)
        .filter(|s| s.name.starts_with(prefix))
        .find_map(|s| Some(s.label(label)?.chars().take(128).collect()))
}

/// The engine and model of a worker, from its metrics: kvroute's simulated engine names
/// itself in `kvroute_engine_info`; vLLM and SGLang put `model_name` on their series.
fn engine_of(text: &str) -> (Option<String>, Option<String>) {
    if let Some(profile) = label_value(text, "kvroute_engine_info", "profile") {
        let model = label_value(text, "kvroute_engine_info", "model");
        return (Some(format!("kvroute simulated ({profile})")), model);
    }
    for (prefix, engine) in [("vllm:", "vLLM"), ("sglang:", "SGLang")] {
        if samples(text).any(|s| s.name.starts_with(prefix)) {
            return (Some(engine.into()), label_value(text, prefix, "model_name"));
        }
    }
    (None, None)
}

/// Fills a card from a worker's metrics (kvroute names first, vLLM's otherwise).
fn apply_metrics(w: &mut WorkerCard, text: &str) {
    (w.engine, w.model) = engine_of(text);
    let first = |names: &[&str]| names.iter().find_map(|n| first_value(text, n));
    w.kv_usage = first(&["kvroute_engine_kv_usage_ratio", "vllm:kv_cache_usage_perc"]);
    w.busy = first(&["kvroute_engine_busy_ratio"]);
    w.running = first(&[
        "kvroute_engine_running_requests",
        "vllm:num_requests_running",
    ]);
    w.waiting = first(&[
        "kvroute_engine_waiting_requests",
        "vllm:num_requests_waiting",
    ]);
    let queue = first(&["kvroute_engine_queue_time_seconds_total"]);
    let admitted = first(&["kvroute_engine_admitted_requests_total"]);
    w.queue_time_secs = match (queue, admitted) {
        (Some(q), Some(n)) if n > 0.0 => Some(q / n),
        _ => None,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_metrics_are_read_by_kvroute_or_vllm_names() {
        let text = "# HELP x\nkvroute_engine_kv_usage_ratio 0.25\nkvroute_engine_busy_ratio 0.5\n\
            kvroute_engine_queue_time_seconds_total 3\nkvroute_engine_admitted_requests_total 6\n\
            vllm:num_requests_running{model_name=\"m\"} 4\nkvroute_engine_running_requests_x 9\n";
        let mut w = WorkerCard::default();
        apply_metrics(&mut w, text);
        assert_eq!(w.kv_usage, Some(0.25));
        assert_eq!(w.busy, Some(0.5));
        assert_eq!(w.queue_time_secs, Some(0.5));
        // A longer name with the same start is another metric.
        assert_eq!(w.running, Some(4.0));
        assert_eq!(w.waiting, None);
    }

    #[test]
    fn the_engine_and_model_are_read_from_the_metrics() {
        let sim = "kvroute_engine_info{model=\"kvroute-sim\",profile=\"demo\"} 1\n";
        assert_eq!(
            engine_of(sim),
            (
                Some("kvroute simulated (demo)".into()),
                Some("kvroute-sim".into())
            )
        );
        let vllm = "# HELP vllm:num_requests_running x\nvllm:num_requests_running{engine=\"0\",model_name=\"/m/llama\"} 0\n";
        assert_eq!(
            engine_of(vllm),
            (Some("vLLM".into()), Some("/m/llama".into()))
        );
        assert_eq!(engine_of("up 1\n"), (None, None));
        // Quoted label values are read whole, escapes undone.
        let quoted = "vllm:num_requests_running{model_name=\"a \\\"b\\\" }, c\"} 2\n";
        assert_eq!(engine_of(quoted).1.as_deref(), Some("a \"b\" }, c"));
    }

    #[test]
    fn a_real_vllm_engines_metrics_fill_its_card() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../cli/tests/fixtures/vllm-0.32.0-metrics.txt"
        );
        let mut w = WorkerCard::default();
        apply_metrics(&mut w, &std::fs::read_to_string(path).unwrap());
        assert_eq!(w.engine.as_deref(), Some("vLLM"));
        assert_eq!(w.model.as_deref(), Some("tiny-llama"));
        assert_eq!(w.kv_usage, Some(0.0));
        assert_eq!(w.running, Some(0.0));
        assert_eq!(w.waiting, Some(0.0));
        assert_eq!((w.busy, w.queue_time_secs), (None, None));
    }
}
