//! An InferencePool (the Gateway API Inference Extension's `inference.networking.k8s.io/v1`)
//! as the source of the Pods: its `spec.selector.matchLabels` select them, its first
//! `spec.targetPorts` number is their HTTP port. Read from the API server at start and
//! again every half minute (a changed pool starts the Pod watch again); the picker needs
//! `get` on `inferencepools` besides the Pods' `get`, `list` and `watch`.

use kube::api::{ApiResource, DynamicObject};

/// The API group.
pub const GROUP: &str = "inference.networking.k8s.io";
/// The version read.
pub const VERSION: &str = "v1";

/// What a pool says about its Pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolTarget {
    /// The label selector (`k=v,...`, keys sorted).
    pub selector: String,
    /// The Pods' HTTP port.
    pub port: u16,
}

/// The target of a pool object (its JSON, as the API server serves it).
pub fn target_of(pool: &serde_json::Value) -> Result<PoolTarget, String> {
    let spec = pool.get("spec").ok_or("the pool has no spec")?;
    let labels = spec
        .pointer("/selector/matchLabels")
        .and_then(|l| l.as_object())
        .filter(|l| !l.is_empty())
        .ok_or("the pool's spec.selector.matchLabels is missing or empty")?;
    let mut pairs = Vec::with_capacity(labels.len());
    for (k, v) in labels {
        let v = v
            .as_str()
            .ok_or_else(|| format!("label {k}: not a string"))?;
        pairs.push(format!("{k}={v}"));
    }
    pairs.sort();
    let port = spec
        .pointer("/targetPorts/0/number")
        .and_then(serde_json::Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or("the pool's spec.targetPorts[0].number is missing or not a port")?;
    Ok(PoolTarget {
        selector: pairs.join(","),
        port,
    })
}

/// Reads pool `name` of `namespace`.
pub async fn read(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<PoolTarget, String> {
    let resource = ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: "InferencePool".into(),
        plural: "inferencepools".into(),
    };
    let api: kube::Api<DynamicObject> =
        kube::Api::namespaced_with(client.clone(), namespace, &resource);
    let pool = api
        .get(name)
        .await
        .map_err(|e| format!("InferencePool {namespace}/{name}: {e}"))?;
    target_of(&pool.data).map_err(|e| format!("InferencePool {namespace}/{name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_gives_its_selector_and_first_target_port() {
        let pool = serde_json::json!({
            "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "llama", "namespace": "inference"},
            "spec": {"selector": {"matchLabels": {"app": "vllm", "model": "llama"}},
                     "targetPorts": [{"number": 8000}, {"number": 8001}],
                     "endpointPickerRef": {"name": "kvroute-epp", "port": {"number": 9002},
                                           "failureMode": "FailClose"}}
        });
        assert_eq!(
            target_of(&pool).unwrap(),
            PoolTarget {
                selector: "app=vllm,model=llama".into(),
                port: 8000
            }
        );
        for broken in [
            serde_json::json!({"spec": {"targetPorts": [{"number": 8000}]}}),
            serde_json::json!({"spec": {"selector": {"matchLabels": {}}, "targetPorts": [{"number": 8000}]}}),
            serde_json::json!({"spec": {"selector": {"matchLabels": {"app": "x"}}}}),
            serde_json::json!({"spec": {"selector": {"matchLabels": {"app": "x"}}, "targetPorts": [{"number": 70000}]}}),
            serde_json::json!({}),
        ] {
            assert!(target_of(&broken).is_err(), "{broken}");
        }
    }
}
