//! Kubernetes discovery against a stub API server on 127.0.0.1 (no cluster runs here): the
//! Pod list, then watch events in the API's JSON form (ADDED not ready, MODIFIED ready,
//! DELETED), each turned into workers joining and leaving the running gateway.

use crate::support::*;
use kvroute_discovery::kubernetes::KubernetesSource;
use kvroute_discovery::DiscoveryConfig;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

fn pod(name: &str, port: u16, ready: bool) -> serde_json::Value {
    let ready = if ready { "True" } else { "False" };
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "inference", "uid": format!("uid-{name}"),
            "resourceVersion": "101", "labels": {"app": "vllm"}},
        "spec": {"containers": [{"name": "engine", "image": "kvroute",
            "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": ready}]}
    })
}

/// The stub: the list answers `items`; the first watch streams what the test sends.
struct Stub {
    url: String,
    queries: Arc<Mutex<Vec<String>>>,
    events: mpsc::Sender<serde_json::Value>,
}

async fn stub(items: Vec<serde_json::Value>) -> Stub {
    stub_with_pool(items, None).await
}

/// The stub, also serving `pool` as InferencePool `llama` of the namespace.
async fn stub_with_pool(items: Vec<serde_json::Value>, pool: Option<serde_json::Value>) -> Stub {
    use axum::extract::{RawQuery, State};
    let (tx, rx) = mpsc::channel::<serde_json::Value>(16);
    let queries = Arc::new(Mutex::new(Vec::new()));
    type Shared = (
        Vec<serde_json::Value>,
        Arc<Mutex<Vec<String>>>,
        Arc<Mutex<Option<mpsc::Receiver<serde_json::Value>>>>,
    );
    let state: Shared = (items, queries.clone(), Arc::new(Mutex::new(Some(rx))));
    let app = axum::Router::new()
        .route(
            "/api/v1/namespaces/inference/pods",
            axum::routing::get(
                |State((items, queries, watch)): State<Shared>, RawQuery(q): RawQuery| async move {
                    let q = q.unwrap_or_default();
                    queries.lock().unwrap().push(q.clone());
                    if !q.contains("watch=true") {
                        let list = serde_json::json!({"kind": "PodList", "apiVersion": "v1",
                        "metadata": {"resourceVersion": "100"}, "items": items});
                        return axum::response::Response::builder()
                            .header("content-type", "application/json")
                            .body(axum::body::Body::from(list.to_string()))
                            .unwrap();
                    }
                    let rx = watch.lock().unwrap().take();
                    let body = match rx {
                        Some(rx) => axum::body::Body::from_stream(
                            tokio_stream::wrappers::ReceiverStream::new(rx)
                                .map(|e| Ok::<_, std::io::Error>(format!("{e}\n"))),
                        ),
                        // Later watches stay open with nothing to say.
                        None => axum::body::Body::from_stream(futures_util::stream::pending::<
                            Result<String, std::io::Error>,
                        >()),
                    };
                    axum::response::Response::builder()
                        .header("content-type", "application/json")
                        .body(body)
                        .unwrap()
                },
            ),
        )
        .route(
            "/apis/inference.networking.k8s.io/v1/namespaces/inference/inferencepools/llama",
            axum::routing::get(move || async move {
                match pool {
                    Some(p) => axum::response::Response::builder()
                        .header("content-type", "application/json")
                        .body(axum::body::Body::from(p.to_string()))
                        .unwrap(),
                    None => axum::response::Response::builder()
                        .status(404)
                        .header("content-type", "application/json")
                        .body(axum::body::Body::from(
                            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#,
                        ))
                        .unwrap(),
                }
            }),
        )
        .with_state(state);
    Stub {
        url: kvroute_testkit::serve(app).await,
        queries,
        events: tx,
    }
}

use futures_util::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_by_label_join_when_ready_and_leave_when_deleted() {
    let a = worker("a").await;
    let b = worker("b").await;
    let api = stub(vec![pod("vllm-a", worker_port(&a), true)]).await;
    let mut cfg = config(&[], "round_robin");
    cfg.discovery = DiscoveryConfig {
        kubernetes: Some(KubernetesSource {
            namespace: "inference".into(),
            selector: "app=vllm".into(),
            api_url: Some(api.url.clone()),
            ..KubernetesSource::default()
        }),
        interval_secs: 0.1,
        ..DiscoveryConfig::default()
    };
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    assert!(
        eventually(10, async || worker_names(&url).await == ["vllm-a"]).await,
        "{:?}",
        worker_names(&url).await
    );
    let q = api.queries.lock().unwrap().clone();
    assert!(
        q.iter().all(|q| q.contains("labelSelector=app%3Dvllm")),
        "{q:?}"
    );
    // A Pod that is not Ready yet is no worker; once Ready it is.
    api.events
        .send(serde_json::json!({"type": "ADDED", "object": pod("vllm-b", worker_port(&b), false)}))
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(worker_names(&url).await, ["vllm-a"]);
    api.events
        .send(
            serde_json::json!({"type": "MODIFIED", "object": pod("vllm-b", worker_port(&b), true)}),
        )
        .await
        .unwrap();
    assert!(
        eventually(10, async || worker_names(&url).await
            == ["vllm-a", "vllm-b"])
        .await
    );
    // Deleted: it leaves; requests go to the one left.
    api.events
        .send(
            serde_json::json!({"type": "DELETED", "object": pod("vllm-a", worker_port(&a), true)}),
        )
        .await
        .unwrap();
    assert!(eventually(10, async || worker_names(&url).await == ["vllm-b"]).await);
    let (status, w, _) = post(
        &url,
        "/v1/chat/completions",
        &chat(&[("user", "hi")], false, 2),
    )
    .await;
    assert_eq!((status, w.as_deref()), (200, Some("vllm-b")));
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inference_pool_chooses_the_pods_and_their_port() {
    let a = worker("a").await;
    // The Pod's container port is not named `http`: the pool's target port decides.
    let mut p = pod("llama-0", 1, true);
    p["metadata"]["labels"] = serde_json::json!({"app": "vllm", "model": "llama"});
    let pool = serde_json::json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "llama", "namespace": "inference", "resourceVersion": "7"},
        "spec": {"selector": {"matchLabels": {"model": "llama", "app": "vllm"}},
                 "targetPorts": [{"number": worker_port(&a)}],
                 "endpointPickerRef": {"name": "kvroute-epp", "port": {"number": 9002}}}
    });
    let api = stub_with_pool(vec![p], Some(pool)).await;
    let mut cfg = config(&[], "kv");
    cfg.discovery = DiscoveryConfig {
        kubernetes: Some(KubernetesSource {
            namespace: "inference".into(),
            inference_pool: Some("llama".into()),
            api_url: Some(api.url.clone()),
            ..KubernetesSource::default()
        }),
        interval_secs: 0.1,
        ..DiscoveryConfig::default()
    };
    let gw = gateway_with_feeds(cfg, BTreeMap::new()).await;
    let url = gw.url();
    assert!(
        eventually(10, async || worker_names(&url).await == ["llama-0"]).await,
        "{:?}",
        worker_names(&url).await
    );
    let q = api.queries.lock().unwrap().clone();
    assert!(
        q.iter()
            .all(|q| q.contains("labelSelector=app%3Dvllm%2Cmodel%3Dllama")),
        "{q:?}"
    );
    let (status, w, _) = post(
        &url,
        "/v1/chat/completions",
        &chat(&[("user", "hi")], false, 2),
    )
    .await;
    assert_eq!((status, w.as_deref()), (200, Some("llama-0")));
    gw.shutdown().await;
    a.shutdown().await;
}
