//! Where workers come from: the configured list (static), a watched file, DNS names (a
//! Kubernetes headless Service resolves to its ready Pods' addresses), Kubernetes Pods by
//! label selector (`kubernetes.rs`). Every source yields
//! the whole set of engines it sees now; [`reconcile`] makes the fleet that set: engines
//! gone (or changed) leave, new ones join. A source that fails (a file that does not parse,
//! a name that does not resolve) changes nothing: the fleet stays as it was.

pub mod kubernetes;

use crate::config::{ConfigError, WorkerSpec};
use crate::fleet;
use crate::state::Gateway;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
    pub kubernetes: Option<kubernetes::KubernetesSource>,
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
            ..WorkerSpec::default()
        }
    }
}

/// The engines a discovery file lists.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkerFile {
    #[serde(default)]
    workers: Vec<WorkerSpec>,
}

/// Reads a discovery file's text: its engines, each checked.
pub fn parse_file(text: &str) -> Result<Vec<WorkerSpec>, ConfigError> {
    let f: WorkerFile = toml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
    for w in &f.workers {
        w.check()?;
    }
    Ok(f.workers)
}

/// What [`reconcile`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Workers that joined (names).
    pub added: Vec<String>,
    /// Workers that left (names).
    pub removed: Vec<String>,
    /// Engines that could not join, and why.
    pub failed: Vec<(String, String)>,
}

/// Makes the fleet `desired`: workers not in it (by name, or with other settings) leave,
/// engines not in the fleet join.
pub fn reconcile(gw: &Arc<Gateway>, desired: &[WorkerSpec]) -> Changes {
    let mut changes = Changes::default();
    let wanted: BTreeMap<String, WorkerSpec> = crate::config::expand_ranks(desired)
        .into_iter()
        .map(|w| (w.display_name(), w))
        .collect();
    for entry in gw.registry.all() {
        let keep = wanted.get(&entry.name).is_some_and(|w| *w == entry.spec);
        if !keep && fleet::remove(gw, entry.id) {
            changes.removed.push(entry.name.clone());
        }
    }
    for spec in desired {
        let first = crate::config::expand_ranks(std::slice::from_ref(spec));
        let Some(first) = first.first() else { continue };
        if gw.registry.by_name(&first.display_name()).is_some() {
            continue;
        }
        match fleet::add(gw, spec.clone()) {
            Ok(ids) => {
                for id in ids {
                    if let Some(e) = gw.registry.get(id) {
                        changes.added.push(e.name.clone());
                    }
                }
            }
            Err(e) => {
                tracing::warn!(worker = %spec.display_name(), error = %e, "discovered engine could not join");
                changes.failed.push((spec.display_name(), e.to_string()));
            }
        }
    }
    changes
}

/// Runs the configured sources until the gateway stops: the `configured` workers plus what
/// the file and the DNS names give, every `interval_secs`.
pub async fn run(gw: Arc<Gateway>, configured: Vec<WorkerSpec>) {
    let cfg = gw.config.discovery.clone();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(cfg.interval_secs));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_file: Option<Vec<WorkerSpec>> = None;
    let mut last_dns: BTreeMap<String, Vec<WorkerSpec>> = BTreeMap::new();
    let mut applied: Option<Vec<WorkerSpec>> = None;
    let pods = cfg.kubernetes.clone().map(kubernetes::watch_pods);
    loop {
        tick.tick().await;
        if let Some(path) = &cfg.file {
            match read_file(path, cfg.max_file_bytes).await {
                Ok(specs) => last_file = Some(specs),
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "discovery file not read: the fleet stays as it is")
                }
            }
        }
        for d in &cfg.dns {
            match tokio::net::lookup_host((d.name.as_str(), d.port)).await {
                Ok(addrs) => {
                    let mut ips: Vec<std::net::IpAddr> = addrs.map(|a| a.ip()).collect();
                    ips.sort();
                    ips.dedup();
                    last_dns.insert(
                        d.name.clone(),
                        ips.into_iter().map(|ip| d.spec(ip)).collect(),
                    );
                }
                Err(e) => {
                    tracing::warn!(name = %d.name, error = %e, "discovery name not resolved: its engines stay as they are")
                }
            }
        }
        let from_pods = pods.as_ref().map(|p| p.borrow().clone());
        if (cfg.file.is_some() && last_file.is_none())
            || from_pods.as_ref().is_some_and(Option::is_none)
        {
            // A source not read yet: reconciling without it would take its engines out.
            continue;
        }
        let mut desired = configured.clone();
        desired.extend(last_file.iter().flatten().cloned());
        desired.extend(last_dns.values().flatten().cloned());
        desired.extend(from_pods.flatten().into_iter().flatten());
        let mut seen = std::collections::BTreeSet::new();
        desired.retain(|w| seen.insert(w.display_name()));
        if desired.len() > cfg.max_workers {
            tracing::warn!(
                found = desired.len(),
                max = cfg.max_workers,
                "discovery found more engines than discovery.max_workers: the rest are left out"
            );
            desired.truncate(cfg.max_workers);
        }
        if applied.as_ref() == Some(&desired) {
            continue;
        }
        let changes = reconcile(&gw, &desired);
        if !changes.added.is_empty() || !changes.removed.is_empty() {
            tracing::info!(added = ?changes.added, removed = ?changes.removed, workers = gw.registry.len(), "fleet changed");
        }
        if changes.failed.is_empty() {
            applied = Some(desired);
        }
    }
}

async fn read_file(path: &std::path::Path, max: u64) -> Result<Vec<WorkerSpec>, String> {
    let meta = tokio::fs::metadata(path).await.map_err(|e| e.to_string())?;
    if meta.len() > max {
        return Err(format!(
            "{} bytes, more than discovery.max_file_bytes ({max})",
            meta.len()
        ));
    }
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|e| e.to_string())?;
    parse_file(&text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_lists_workers_and_bad_ones_are_refused() {
        let ok = parse_file(
            "[[workers]]\nurl = \"http://10.0.0.5:8000\"\nevents = \"tcp://10.0.0.5:5557\"\n\n[[workers]]\nurl = \"http://10.0.0.6:8000\"\n",
        )
        .unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[0].events.as_deref(), Some("tcp://10.0.0.5:5557"));
        assert!(parse_file("").unwrap().is_empty());
        assert!(parse_file("[[workers]]\nurl = \"ftp://x\"\n").is_err());
        assert!(parse_file("[[workers]]\nurl = \"http://x:1\"\nbogus = 1\n").is_err());
        assert!(parse_file("workers = 3").is_err());
    }

    #[test]
    fn a_dns_address_becomes_an_engine_with_its_endpoints() {
        let d = DnsSource {
            name: "vllm.ns.svc".into(),
            port: 8000,
            events: Some("tcp://{host}:5557".into()),
            replay: Some("tcp://{host}:5558".into()),
            ..DnsSource::default()
        };
        let w = d.spec("10.1.2.3".parse().unwrap());
        assert_eq!(w.url, "http://10.1.2.3:8000");
        assert_eq!(w.events.as_deref(), Some("tcp://10.1.2.3:5557"));
        assert_eq!(w.display_name(), "10.1.2.3:8000");
        let v6 = d.spec("fd00::7".parse().unwrap());
        assert_eq!(v6.url, "http://[fd00::7]:8000");
        assert!(v6.check().is_ok(), "{v6:?}");
        let cfg = DiscoveryConfig {
            dns: vec![d],
            ..DiscoveryConfig::default()
        };
        assert!(cfg.validate().is_ok());
        let bad = DiscoveryConfig {
            dns: vec![DnsSource {
                events: Some("udp://{host}".into()),
                name: "x".into(),
                ..DnsSource::default()
            }],
            ..DiscoveryConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
