//! Kubernetes discovery: the Pods of a namespace that match a label selector, watched through
//! the API server (`kube`'s watcher: a list, then a watch, started again with backoff when it
//! breaks). A Pod is an engine while it is Ready and not terminating and has an IP; its HTTP
//! port, KV event and replay ports come from container port names (or annotations). The
//! gateway needs `get`, `list` and `watch` on `pods` in that namespace (docs/gateway.md).
//! An InferencePool can choose the Pods instead ([`pool`]).
//!
//! The mapping from a Pod to a worker is a pure function ([`worker_of`]); the watch is
//! tested against a stub API server serving watch events written in the API's JSON form
//! (no cluster runs here).

pub mod pool;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};
use kvroute_fleet::config::{WorkerRole, WorkerSpec};
use std::collections::BTreeMap;
use tokio::sync::watch;

/// The annotation naming a Pod's HTTP port (instead of a container port name).
pub const PORT_ANNOTATION: &str = "kvroute.io/port";
/// The annotation giving a Pod's KV event source as-is (`nats`, or an endpoint; `{host}` is
/// the Pod's IP).
pub const EVENTS_ANNOTATION: &str = "kvroute.io/events";
/// The annotation giving a Pod's replay endpoint (`{host}` is the Pod's IP).
pub const REPLAY_ANNOTATION: &str = "kvroute.io/replay";

/// The annotation giving a Pod's role in a disaggregated fleet (`both`, `prefill`,
/// `decode`); without it, the label [`ROLE_LABEL`].
pub const ROLE_ANNOTATION: &str = "kvroute.io/role";
/// The label llm-d's guides put on model server Pods for their role (same values).
pub const ROLE_LABEL: &str = "llm-d.ai/role";

/// The annotation (or label) giving a Pod's KV cache capacity in blocks (over the source's
/// `kv_blocks`; a capacity given is used as it is: the engine's metrics are read only for a
/// worker given none).
pub const KV_BLOCKS_ANNOTATION: &str = "kvroute.io/kv-blocks";
/// The annotation (or label) giving a Pod's batch limit (over the source's `max_batch`).
pub const MAX_BATCH_ANNOTATION: &str = "kvroute.io/max-batch";
/// The annotation (or label) naming the model a Pod serves: with discovery shared between
/// `[[pools]]`, the pool it joins (a label's value cannot hold `/`: the annotation can).
pub const MODEL_ANNOTATION: &str = "kvroute.io/model";

pub use kvroute_fleet::config::KubernetesSource;

/// Whether the Pod takes traffic: Ready, not terminating.
fn serving(pod: &Pod) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The container port named `name`.
fn named_port(pod: &Pod, name: &str) -> Option<u16> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(name))
        .and_then(|p| u16::try_from(p.container_port).ok())
}

/// The worker a Pod is, when it serves: named after the Pod, at its IP.
pub fn worker_of(pod: &Pod, src: &KubernetesSource) -> Option<WorkerSpec> {
    if !serving(pod) {
        return None;
    }
    let name = pod.metadata.name.clone()?;
    let ip: std::net::IpAddr = pod.status.as_ref()?.pod_ip.as_ref()?.parse().ok()?;
    let host = super::url_host(ip);
    let notes = pod.metadata.annotations.as_ref();
    let note = |k: &str| {
        notes
            .and_then(|a| a.get(k))
            .map(|v| v.replace("{host}", &host))
    };
    // An InferencePool's target port is the data plane's: it wins over the annotation.
    let port = match (note(PORT_ANNOTATION), src.port) {
        (_, Some(p)) if src.inference_pool.is_some() => p,
        (Some(p), _) => p.parse::<u16>().ok()?,
        (None, Some(p)) => p,
        (None, None) => named_port(pod, &src.port_name)?,
    };
    let endpoint = |port_name: &Option<String>| {
        port_name
            .as_deref()
            .and_then(|n| named_port(pod, n))
            .map(|p| format!("tcp://{host}:{p}"))
    };
    let label = |key: &str| {
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .cloned()
    };
    let role = note(ROLE_ANNOTATION).or_else(|| label(ROLE_LABEL));
    let role = match role.as_deref().map(str::parse::<WorkerRole>) {
        None => WorkerRole::Both,
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            tracing::warn!(pod = %name, error = %e, "Kubernetes discovery: a Pod with an unknown role is not served");
            return None;
        }
    };
    // Capacity of this Pod: its annotation, else its label, else the source's.
    let capacity = |key: &str| -> Option<u64> {
        let v = note(key).or_else(|| label(key))?;
        match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Some(n),
            _ => {
                tracing::warn!(pod = %name, key, value = %v, "Kubernetes discovery: not a positive whole number; the source's value is used");
                None
            }
        }
    };
    let kv_blocks = capacity(KV_BLOCKS_ANNOTATION).or(src.kv_blocks);
    let max_batch = capacity(MAX_BATCH_ANNOTATION)
        .and_then(|n| u32::try_from(n).ok())
        .or(src.max_batch);
    let model = note(MODEL_ANNOTATION).or_else(|| label(MODEL_ANNOTATION));
    let events = note(EVENTS_ANNOTATION).or_else(|| endpoint(&src.events_port_name));
    let replay = note(REPLAY_ANNOTATION).or_else(|| endpoint(&src.replay_port_name));
    let spec = WorkerSpec {
        url: format!("{}://{host}:{port}", src.scheme),
        name: Some(name),
        // A replay endpoint goes with a ZMQ publisher (the plane replays through its relay).
        replay: replay.filter(|_| {
            events
                .as_deref()
                .is_some_and(|e| e.starts_with("tcp://") || e.starts_with("bind:"))
        }),
        events,
        dp_size: src.dp_size,
        kv_blocks,
        max_batch,
        role,
        model,
        ..WorkerSpec::default()
    };
    spec.check().ok().map(|()| spec)
}

/// Watches the Pods and publishes the workers they are (None until the first full list).
pub fn watch_pods(src: KubernetesSource) -> watch::Receiver<Option<Vec<WorkerSpec>>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let client = loop {
            match client(&src).await {
                Ok(c) => break c,
                Err(e) => {
                    tracing::warn!(error = %e, "Kubernetes discovery: no API client; trying again in 5 s");
                    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                }
            }
        };
        let src = KubernetesSource {
            namespace: if src.namespace.is_empty() {
                client.default_namespace().to_string()
            } else {
                src.namespace.clone()
            },
            ..src
        };
        loop {
            // The gateway gone (nobody listens): the task ends, whatever it waits for.
            let src = tokio::select! {
                s = with_pool(&client, &src) => s,
                () = tx.closed() => return,
            };
            let changed = tokio::select! {
                c = watch_once(&client, &src, &tx) => c,
                () = tx.closed() => return,
            };
            if !changed {
                return;
            }
            tracing::info!(selector = %src.selector, "Kubernetes discovery: the InferencePool changed; watching its Pods again");
        }
    });
    rx
}

/// `src` with its InferencePool's selector and port, read until the API server gives them.
async fn with_pool(client: &kube::Client, src: &KubernetesSource) -> KubernetesSource {
    let Some(name) = &src.inference_pool else {
        return src.clone();
    };
    loop {
        match pool::read(client, &src.namespace, name).await {
            Ok(t) => {
                return KubernetesSource {
                    selector: t.selector,
                    port: Some(t.port),
                    ..src.clone()
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "Kubernetes discovery: cannot read the InferencePool; trying again in 5 s");
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
        }
    }
}

/// How often the InferencePool is read again.
const POOL_RECHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// Watches the Pods of `src` until the gateway stops listening (false) or its InferencePool
/// changes (true).
async fn watch_once(
    client: &kube::Client,
    src: &KubernetesSource,
    tx: &watch::Sender<Option<Vec<WorkerSpec>>>,
) -> bool {
    let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &src.namespace);
    let cfg = watcher::Config::default().labels(&src.selector);
    let mut events = watcher(api, cfg).default_backoff().boxed();
    let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
    let mut listing: Option<BTreeMap<String, Pod>> = None;
    let mut recheck =
        tokio::time::interval_at(tokio::time::Instant::now() + POOL_RECHECK, POOL_RECHECK);
    loop {
        let ev = tokio::select! {
            ev = events.next() => match ev {
                Some(ev) => ev,
                None => return true,
            },
            _ = recheck.tick(), if src.inference_pool.is_some() => {
                let name = src.inference_pool.as_deref().unwrap_or_default();
                match pool::read(client, &src.namespace, name).await {
                    Ok(t) if t.selector != src.selector || Some(t.port) != src.port => return true,
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "Kubernetes discovery: cannot read the InferencePool again; keeping its Pods"),
                }
                continue;
            }
        };
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!(error = %e, "Kubernetes discovery: watch failed; it starts again");
                continue;
            }
        };
        let key = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
        match ev {
            watcher::Event::Init => listing = Some(BTreeMap::new()),
            watcher::Event::InitApply(p) => {
                listing.get_or_insert_with(BTreeMap::new).insert(key(&p), p);
            }
            watcher::Event::InitDone => pods = listing.take().unwrap_or_default(),
            watcher::Event::Apply(p) => {
                pods.insert(key(&p), p);
            }
            watcher::Event::Delete(p) => {
                pods.remove(&key(&p));
            }
        }
        if listing.is_some() {
            continue;
        }
        let workers: Vec<WorkerSpec> = pods.values().filter_map(|p| worker_of(p, src)).collect();
        if tx.send(Some(workers)).is_err() {
            return false;
        }
    }
}

async fn client(src: &KubernetesSource) -> Result<kube::Client, String> {
    let config = match &src.api_url {
        Some(url) => kube::Config::new(url.parse().map_err(|e| format!("api_url {url:?}: {e}"))?),
        None => kube::Config::infer().await.map_err(|e| e.to_string())?,
    };
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn vllm_pod(name: &str, ip: &str, ready: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "inference", "labels": {"app": "vllm"}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai",
                "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"},
                          {"name": "kv-events", "containerPort": 5557, "protocol": "TCP"},
                          {"name": "kv-replay", "containerPort": 5558, "protocol": "TCP"}]}]},
            "status": {"phase": "Running", "podIP": ip,
                "conditions": [{"type": "Ready", "status": ready}, {"type": "ContainersReady", "status": ready}]}
        })
    }

    fn source() -> KubernetesSource {
        KubernetesSource {
            namespace: "inference".into(),
            selector: "app=vllm".into(),
            events_port_name: Some("kv-events".into()),
            replay_port_name: Some("kv-replay".into()),
            ..KubernetesSource::default()
        }
    }

    #[test]
    fn a_ready_pod_is_a_worker_with_its_named_ports() {
        let w = worker_of(&pod(vllm_pod("vllm-0", "10.1.0.7", "True")), &source()).unwrap();
        assert_eq!(w.url, "http://10.1.0.7:8000");
        assert_eq!(w.display_name(), "vllm-0");
        assert_eq!(w.events.as_deref(), Some("tcp://10.1.0.7:5557"));
        assert_eq!(w.replay.as_deref(), Some("tcp://10.1.0.7:5558"));
        // Without event port names: tracked approximately (no events).
        let plain = worker_of(
            &pod(vllm_pod("vllm-0", "10.1.0.7", "True")),
            &KubernetesSource::default(),
        )
        .unwrap();
        assert_eq!((plain.events, plain.replay), (None, None));
    }

    #[test]
    fn pods_not_ready_terminating_without_ip_or_port_are_not_workers() {
        let src = source();
        assert!(worker_of(&pod(vllm_pod("a", "10.1.0.7", "False")), &src).is_none());
        let mut gone = vllm_pod("b", "10.1.0.8", "True");
        gone["metadata"]["deletionTimestamp"] = "2026-11-26T10:00:00Z".into();
        assert!(worker_of(&pod(gone), &src).is_none());
        let mut no_ip = vllm_pod("c", "10.1.0.9", "True");
        no_ip["status"].as_object_mut().unwrap().remove("podIP");
        assert!(worker_of(&pod(no_ip), &src).is_none());
        let other_port = KubernetesSource {
            port_name: "api".into(),
            ..source()
        };
        assert!(worker_of(&pod(vllm_pod("d", "10.1.0.10", "True")), &other_port).is_none());
    }

    #[test]
    fn annotations_override_ports_and_event_sources() {
        let mut p = vllm_pod("sglang-1", "fd00::5", "True");
        p["metadata"]["annotations"] = serde_json::json!({
            "kvroute.io/port": "30000",
            "kvroute.io/events": "nats",
        });
        let w = worker_of(&pod(p), &source()).unwrap();
        assert_eq!(w.url, "http://[fd00::5]:30000");
        assert_eq!(w.events.as_deref(), Some("nats"));
        assert_eq!(w.replay, None, "the plane replays through the relay");
        let mut bad = vllm_pod("x", "10.0.0.1", "True");
        bad["metadata"]["annotations"] = serde_json::json!({"kvroute.io/port": "http"});
        assert!(worker_of(&pod(bad), &source()).is_none());
    }

    #[test]
    fn a_pods_capacity_comes_from_its_annotations_or_labels_over_the_sources() {
        let src = KubernetesSource {
            kv_blocks: Some(1_000),
            max_batch: Some(64),
            ..source()
        };
        let plain = worker_of(&pod(vllm_pod("a", "10.0.0.1", "True")), &src).unwrap();
        assert_eq!((plain.kv_blocks, plain.max_batch), (Some(1_000), Some(64)));
        let mut p = vllm_pod("b", "10.0.0.2", "True");
        p["metadata"]["annotations"] = serde_json::json!({"kvroute.io/kv-blocks": "12083"});
        p["metadata"]["labels"]["kvroute.io/max-batch"] = serde_json::json!("128");
        let w = worker_of(&pod(p), &src).unwrap();
        assert_eq!((w.kv_blocks, w.max_batch), (Some(12_083), Some(128)));
        // A value that is no positive whole number: the source's, the Pod still served.
        let mut bad = vllm_pod("c", "10.0.0.3", "True");
        bad["metadata"]["annotations"] =
            serde_json::json!({"kvroute.io/kv-blocks": "lots", "kvroute.io/max-batch": "0"});
        let w = worker_of(&pod(bad), &src).unwrap();
        assert_eq!((w.kv_blocks, w.max_batch), (Some(1_000), Some(64)));
    }

    #[test]
    fn a_pods_role_comes_from_its_annotation_or_llm_ds_label() {
        let plain = worker_of(&pod(vllm_pod("a", "10.0.0.1", "True")), &source()).unwrap();
        assert_eq!(plain.role, WorkerRole::Both);
        let mut p = vllm_pod("p", "10.0.0.2", "True");
        p["metadata"]["labels"]["llm-d.ai/role"] = serde_json::json!("prefill");
        assert_eq!(
            worker_of(&pod(p.clone()), &source()).unwrap().role,
            WorkerRole::Prefill
        );
        // The annotation wins over the label.
        p["metadata"]["annotations"] = serde_json::json!({"kvroute.io/role": "decode"});
        assert_eq!(
            worker_of(&pod(p.clone()), &source()).unwrap().role,
            WorkerRole::Decode
        );
        p["metadata"]["annotations"] = serde_json::json!({"kvroute.io/role": "leader"});
        assert!(worker_of(&pod(p), &source()).is_none(), "an unknown role");
    }

    #[test]
    fn a_pods_model_comes_from_its_annotation_or_label() {
        let plain = worker_of(&pod(vllm_pod("a", "10.0.0.1", "True")), &source()).unwrap();
        assert_eq!(plain.model, None);
        let mut p = vllm_pod("b", "10.0.0.2", "True");
        p["metadata"]["labels"]["kvroute.io/model"] = serde_json::json!("llama-8b");
        let w = worker_of(&pod(p.clone()), &source()).unwrap();
        assert_eq!(w.model.as_deref(), Some("llama-8b"));
        // The annotation wins (and may hold a `/`).
        p["metadata"]["annotations"] =
            serde_json::json!({"kvroute.io/model": "meta-llama/Llama-3.1-8B"});
        let w = worker_of(&pod(p), &source()).unwrap();
        assert_eq!(w.model.as_deref(), Some("meta-llama/Llama-3.1-8B"));
    }
}
