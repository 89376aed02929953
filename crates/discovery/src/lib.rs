//! Where workers come from: the configured list (static), a watched file, DNS names (a
//! Kubernetes headless Service resolves to its ready Pods' addresses), Kubernetes Pods by
//! label selector (`kubernetes.rs`). Every source yields
//! the whole set of engines it sees now; the fleet's [`reconcile`] makes it that set: engines
//! gone (or changed) leave, new ones join. A source that fails (a file that does not parse,
//! a name that does not resolve) changes nothing: the fleet stays as it was. With several
//! pools the top level's sources are shared (`shared.rs`): each engine goes to the pool of
//! its model.

pub mod kubernetes;
pub mod shared;

use kvroute_fleet::config::{ConfigError, WorkerSpec};
use kvroute_fleet::membership::{reconcile, Fleet};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub use kvroute_fleet::config::{url_host, DiscoveryConfig, DnsSource};

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

/// Runs the configured sources until the gateway stops: the `configured` workers (as the
/// config has them now: a reload changes them), what discovery shared between pools gives
/// this pool (`shared`), plus what the file, the DNS names and the Pods give, every
/// `interval_secs` and at once when the configured or shared ones change.
pub async fn run(
    fleet: Arc<Fleet>,
    mut configured: watch::Receiver<Vec<WorkerSpec>>,
    mut shared: Option<watch::Receiver<Vec<WorkerSpec>>>,
) {
    let cfg = fleet.config().discovery.clone();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(cfg.interval_secs));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reloads = true;
    let mut applied: Option<Vec<WorkerSpec>> = None;
    let mut sources = Sources::new(cfg.clone());
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            // Without a sender no reload comes: the ticks alone.
            changed = configured.changed(), if reloads => reloads = changed.is_ok(),
            changed = changed_or_never(&mut shared) => {
                if changed.is_err() {
                    shared = None;
                }
            }
        }
        let Some(found) = sources.look().await else {
            continue;
        };
        let mut desired = configured.borrow().clone();
        if let Some(s) = &shared {
            desired.extend(s.borrow().iter().cloned());
        }
        desired.extend(found);
        let desired = bounded(desired, cfg.max_workers);
        if applied.as_ref() == Some(&desired) {
            continue;
        }
        let changes = reconcile(&fleet, &desired);
        if !changes.added.is_empty() || !changes.removed.is_empty() {
            tracing::info!(added = ?changes.added, removed = ?changes.removed, workers = fleet.registry().len(), "fleet changed");
        }
        if changes.failed.is_empty() {
            applied = Some(desired);
        }
    }
}

/// The next change of `rx`; never without one.
async fn changed_or_never(
    rx: &mut Option<watch::Receiver<Vec<WorkerSpec>>>,
) -> Result<(), watch::error::RecvError> {
    match rx {
        Some(rx) => rx.changed().await,
        None => std::future::pending().await,
    }
}

/// Each engine once (by name, the first entry kept), at most `max` of them (the rest left
/// out with a warning).
fn bounded(mut desired: Vec<WorkerSpec>, max: usize) -> Vec<WorkerSpec> {
    let mut seen = std::collections::BTreeSet::new();
    desired.retain(|w| seen.insert(w.display_name()));
    if desired.len() > max {
        tracing::warn!(
            found = desired.len(),
            max,
            "discovery found more engines than discovery.max_workers: the rest are left out"
        );
        desired.truncate(max);
    }
    desired
}

/// The file, DNS and Kubernetes sources of one `[discovery]`, with what each gave last.
struct Sources {
    cfg: DiscoveryConfig,
    last_file: Option<Vec<WorkerSpec>>,
    last_dns: BTreeMap<String, Vec<WorkerSpec>>,
    pods: Option<watch::Receiver<Option<Vec<WorkerSpec>>>>,
}

impl Sources {
    /// Starts watching the Pods when a Kubernetes source is set.
    fn new(cfg: DiscoveryConfig) -> Self {
        let pods = cfg.kubernetes.clone().map(kubernetes::watch_pods);
        Self {
            cfg,
            last_file: None,
            last_dns: BTreeMap::new(),
            pods,
        }
    }

    /// Reads every source once: the engines they give now, a source that fails giving what it
    /// gave last. None while a source was never read (reconciling without it would take its
    /// engines out).
    async fn look(&mut self) -> Option<Vec<WorkerSpec>> {
        if let Some(path) = &self.cfg.file {
            match read_file(path, self.cfg.max_file_bytes).await {
                Ok(specs) => self.last_file = Some(specs),
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "discovery file not read: the fleet stays as it is")
                }
            }
        }
        for d in &self.cfg.dns {
            match tokio::net::lookup_host((d.name.clone(), d.port)).await {
                Ok(addrs) => {
                    let mut ips: Vec<std::net::IpAddr> = addrs.map(|a| a.ip()).collect();
                    ips.sort();
                    ips.dedup();
                    self.last_dns.insert(
                        d.name.clone(),
                        ips.into_iter().map(|ip| d.spec(ip)).collect(),
                    );
                }
                Err(e) => {
                    tracing::warn!(name = %d.name, error = %e, "discovery name not resolved: its engines stay as they are")
                }
            }
        }
        let from_pods = self.pods.as_ref().map(|p| p.borrow().clone());
        if (self.cfg.file.is_some() && self.last_file.is_none())
            || from_pods.as_ref().is_some_and(Option::is_none)
        {
            return None;
        }
        let mut found: Vec<WorkerSpec> = self.last_file.iter().flatten().cloned().collect();
        found.extend(self.last_dns.values().flatten().cloned());
        found.extend(from_pods.flatten().into_iter().flatten());
        Some(found)
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
        let roles = parse_file(
            "[[workers]]\nurl = \"http://10.0.0.7:8000\"\nrole = \"prefill\"\n\n[[workers]]\nurl = \"http://10.0.0.8:8000\"\nrole = \"decode\"\n",
        )
        .unwrap();
        assert_eq!(roles[0].role, kvroute_fleet::config::WorkerRole::Prefill);
        assert_eq!(roles[1].role, kvroute_fleet::config::WorkerRole::Decode);
        assert!(parse_file("[[workers]]\nurl = \"http://x:1\"\nrole = \"all\"\n").is_err());
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
        assert_eq!(w.model, None);
        let named = DnsSource {
            model: Some("llama".into()),
            ..d.clone()
        };
        assert_eq!(
            named.spec("10.1.2.3".parse().unwrap()).model.as_deref(),
            Some("llama")
        );
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
