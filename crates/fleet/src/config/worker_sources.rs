//! `[discovery]`: where workers come from besides the configured list (the discovery crate, `kvroute_discovery`):
//! a watched file, DNS names, Kubernetes Pods.

use super::{ConfigError, WorkerSpec};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Discovery settings (`[discovery]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// A TOML file of `[[workers]]` entries (the `workers` form), read again whenever it
    /// changes: edit it to add or remove engines.
    pub file: Option<PathBuf>,
    /// DNS names resolved periodically, each address one engine.
    pub dns: Vec<DnsSource>,
    /// Pods of a namespace by label selector, watched through the API server.
    pub kubernetes: Option<KubernetesSource>,
    /// Seconds between looks at the sources.
    pub interval_secs: f64,
    /// Most engines the sources may bring (more are left out, with a warning).
    pub max_workers: usize,
    /// Largest discovery file read, in bytes.
    pub max_file_bytes: u64,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            file: None,
            dns: Vec::new(),
            kubernetes: None,
            interval_secs: 2.0,
            max_workers: 1024,
            max_file_bytes: 1 << 20,
        }
    }
}

/// Engines behind a DNS name: every address it resolves to, on one port.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DnsSource {
    /// The name (e.g. `vllm.inference.svc.cluster.local`, a headless Service).
    pub name: String,
    /// The engines' HTTP port.
    pub port: u16,
    /// `http` or `https`.
    pub scheme: String,
    /// Their KV event source, `{host}` standing for each address (e.g.
    /// `tcp://{host}:5557`, or `nats`).
    pub events: Option<String>,
    /// Their replay endpoint, `{host}` standing for each address.
    pub replay: Option<String>,
    /// Data-parallel ranks per engine.
    pub dp_size: Option<u32>,
    /// KV blocks per engine (or rank), when known.
    pub kv_blocks: Option<u64>,
    /// Batch limit per engine (or rank), when known.
    pub max_batch: Option<u32>,
    /// The model its engines serve, when known (with discovery shared between `[[pools]]`:
    /// the pool they join without asking their `/v1/models`).
    pub model: Option<String>,
}

impl Default for DnsSource {
    fn default() -> Self {
        Self {
            name: String::new(),
            port: 8000,
            scheme: "http".into(),
            events: None,
            replay: None,
            dp_size: None,
            kv_blocks: None,
            max_batch: None,
            model: None,
        }
    }
}

impl DiscoveryConfig {
    /// Whether any source besides the static list is set.
    pub fn enabled(&self) -> bool {
        self.file.is_some() || !self.dns.is_empty() || self.kubernetes.is_some()
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.interval_secs.is_finite()
            && self.interval_secs >= 0.1
            && self.interval_secs <= 3600.0)
        {
            return Err(ConfigError(format!(
                "discovery.interval_secs must be within 0.1..=3600, got {}",
                self.interval_secs
            )));
        }
        if self.max_workers == 0 || self.max_workers > 65_536 {
            return Err(ConfigError(
                "discovery.max_workers must be within 1..=65536".into(),
            ));
        }
        for d in &self.dns {
            if d.name.is_empty() || d.port == 0 || !(d.scheme == "http" || d.scheme == "https") {
                return Err(ConfigError(format!(
                    "discovery.dns {:?}: needs a name, a port and scheme http or https",
                    d.name
                )));
            }
            // Checks the templates' shape with a stand-in address.
            d.spec("10.0.0.1".parse().expect("an address")).check()?;
        }
        if let Some(k) = &self.kubernetes {
            if (k.port_name.is_empty() && k.port.is_none())
                || !(k.scheme == "http" || k.scheme == "https")
            {
                return Err(ConfigError(
                    "discovery.kubernetes needs a port_name (or port) and scheme http or https"
                        .into(),
                ));
            }
            if k.selector.trim().is_empty() && k.inference_pool.is_none() {
                return Err(ConfigError(
                    "discovery.kubernetes needs a selector (or an inference_pool): without one every Pod of the namespace, the gateway's own included, would be an engine"
                        .into(),
                ));
            }
            if let Some(u) = &k.api_url {
                if reqwest::Url::parse(u).is_err() {
                    return Err(ConfigError(format!(
                        "discovery.kubernetes.api_url {u:?} is not a URL"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// An address as a URL's host (IPv6 in brackets).
pub fn url_host(addr: std::net::IpAddr) -> String {
    match addr {
        std::net::IpAddr::V4(a) => a.to_string(),
        std::net::IpAddr::V6(a) => format!("[{a}]"),
    }
}

impl DnsSource {
    /// The engine at `addr`.
    pub fn spec(&self, addr: std::net::IpAddr) -> WorkerSpec {
        let host = url_host(addr);
        let fill = |t: &Option<String>| t.as_ref().map(|t| t.replace("{host}", &host));
        WorkerSpec {
            url: format!("{}://{host}:{}", self.scheme, self.port),
            events: fill(&self.events),
            replay: fill(&self.replay),
            dp_size: self.dp_size,
            kv_blocks: self.kv_blocks,
            max_batch: self.max_batch,
            model: self.model.clone(),
            ..WorkerSpec::default()
        }
    }
}

/// `[discovery.kubernetes]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesSource {
    /// The namespace of the Pods; empty: the gateway's own (its service account's in the
    /// cluster, the kubeconfig context's outside).
    pub namespace: String,
    /// Their label selector, e.g. `app=vllm`.
    pub selector: String,
    /// The name of the container port serving the OpenAI API.
    pub port_name: String,
    /// The HTTP port by number, instead of `port_name` (an InferencePool's target port).
    pub port: Option<u16>,
    /// An InferencePool (`inference.networking.k8s.io/v1`) of the namespace whose selector
    /// and target port choose the Pods (instead of `selector` and the port settings).
    pub inference_pool: Option<String>,
    /// The name of the container port of the KV event publisher (ZMQ), if any.
    pub events_port_name: Option<String>,
    /// The name of the container port of the replay service, if any.
    pub replay_port_name: Option<String>,
    /// `http` or `https`.
    pub scheme: String,
    /// Data-parallel ranks per engine.
    pub dp_size: Option<u32>,
    /// KV blocks per engine (or rank), when known.
    pub kv_blocks: Option<u64>,
    /// Batch limit per engine (or rank), when known.
    pub max_batch: Option<u32>,
    /// The API server's URL when not inside the cluster and not the kubeconfig's (e.g.
    /// `kubectl proxy` at `http://127.0.0.1:8001`).
    pub api_url: Option<String>,
}

impl Default for KubernetesSource {
    fn default() -> Self {
        Self {
            namespace: String::new(),
            selector: String::new(),
            port_name: "http".into(),
            port: None,
            inference_pool: None,
            events_port_name: None,
            replay_port_name: None,
            scheme: "http".into(),
            dp_size: None,
            kv_blocks: None,
            max_batch: None,
            api_url: None,
        }
    }
}
