//! A changed config applied to a running gateway (`kvroute serve` on SIGHUP or a changed
//! config file): the workers (joining and leaving as discovery makes them), the model and
//! adapter names, admission's mode, busy thresholds and queue caps, its tenants and classes
//! (the queue's waiting requests, the tenants' limits and fairness carried over by name) and
//! the policy's parameters (the router's [`kvroute_core::Router::reconfigure`]; the
//! gateway's queue reads its caps from the router). Every other changed setting is named as
//! waiting for a restart; an invalid config is refused whole, the running one kept. Counted
//! in `kvroute_config_reloads_total{result}`.

use crate::gateway::Gateway;
use crate::GatewayHandle;
use kvroute_fleet::config::{changed_keys, ConfigError, GatewayConfig, WorkerSpec};
use kvroute_fleet::membership;
use parking_lot::Mutex;
use tokio::sync::watch;

/// The settings a reload applies (key paths, and what is under them): the workers, the
/// model names, admission's mode and busy thresholds, the policy's parameters.
pub const LIVE_KEYS: &[&str] = &[
    "workers",
    "models",
    "lora_adapters",
    "router.admission.mode",
    "router.admission.max_queue_wait_secs",
    "router.admission.max_queued_requests",
    "router.admission.max_queued_tokens",
    "router.admission.busy_prefill_tokens",
    "router.admission.busy_prefill_fraction",
    "router.admission.busy_active_blocks",
    "router.admission.busy_active_fraction",
    "router.admission.busy_batch_fraction",
    "router.admission.flow",
    "router.policy.kv",
    "router.policy.predictive",
    "router.policy.goodput",
    "limits.max_prompt_tokens",
    "limits.max_response_bytes",
    "upstream.retry",
    "upstream.forward_authorization",
    "upstream.first_byte_timeout_secs",
    "upstream.migration_limit",
    "flow_headers",
    "health.ready_without_engines",
    "epp.subset_hint",
    "epp.conformance_headers",
];

/// What a reload did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Changed settings applied (key paths).
    pub applied: Vec<String>,
    /// Changed settings that take effect only after a restart.
    pub restart: Vec<String>,
    /// Workers that joined (named; with discovery on, its next pass reports them instead).
    pub joined: Vec<String>,
    /// Workers that left.
    pub left: Vec<String>,
    /// Workers that could not join, and why.
    pub failed: Vec<(String, String)>,
}

/// The reload state of a running gateway.
pub(crate) struct Reloads {
    /// The config as given at the start (ranks not expanded): what restart-only settings
    /// still are.
    started: GatewayConfig,
    /// The config as last given (as started, then as last reloaded).
    last: Mutex<GatewayConfig>,
    /// The configured workers, for the discovery task (None: no discovery, the fleet is
    /// reconciled at once).
    configured: Option<watch::Sender<Vec<WorkerSpec>>>,
}

impl Reloads {
    /// The state of a gateway started with `config`; `configured` feeds its discovery task.
    pub(crate) fn new(
        config: GatewayConfig,
        configured: Option<watch::Sender<Vec<WorkerSpec>>>,
    ) -> Self {
        Self {
            started: config.clone(),
            last: Mutex::new(config),
            configured,
        }
    }
}

fn live(key: &str) -> bool {
    LIVE_KEYS
        .iter()
        .any(|k| key == *k || key.starts_with(&format!("{k}.")))
}

impl GatewayHandle {
    /// Applies `new` (checked first; refused whole when invalid, the running config kept):
    /// the workers and model names; the other changed settings are named in the report as
    /// waiting for a restart. With `[[pools]]` each pool running is reloaded from its
    /// namesake; a pool added or removed waits for a restart (`pools`).
    pub fn reload(&self, new: GatewayConfig) -> Result<ReloadReport, ConfigError> {
        let pools = match new.validate().and_then(|()| new.pools()) {
            Ok(p) => p,
            Err(e) => {
                self.reload_refused(&e.to_string());
                return Err(e);
            }
        };
        let mut report = ReloadReport::default();
        let running = self.front.names();
        if running != pools.iter().map(|p| p.name.clone()).collect::<Vec<_>>() {
            report.restart.push("pools".into());
        }
        if new.shared_discovery() != self.shared_discovery {
            report.restart.push("discovery".into());
        }
        for ((name, gw), reloads) in self.front.all().zip(&self.reloads) {
            let Some(pool) = pools.iter().find(|p| p.name == name) else {
                continue;
            };
            let r = match reload_pool(gw, reloads, pool.config.clone()) {
                Ok(r) => r,
                Err(e) => {
                    self.reload_refused(&e.to_string());
                    return Err(e);
                }
            };
            report.applied.extend(r.applied);
            report.restart.extend(r.restart);
            report.joined.extend(r.joined);
            report.left.extend(r.left);
            report.failed.extend(r.failed);
        }
        report.applied.sort();
        report.applied.dedup();
        report.restart.sort();
        report.restart.dedup();
        let result = match (report.applied.is_empty(), report.restart.is_empty()) {
            (_, false) => "partial",
            (false, true) => "applied",
            (true, true) => "unchanged",
        };
        self.state
            .metrics
            .config_reloads
            .with_label_values(&[result])
            .inc();
        tracing::info!(applied = ?report.applied, joined = ?report.joined, left = ?report.left, "config reloaded");
        if !report.restart.is_empty() {
            tracing::warn!(settings = ?report.restart, "config reloaded: these changed settings take effect only after a restart");
        }
        for (w, why) in &report.failed {
            tracing::warn!(worker = %w, error = %why, "config reloaded: a worker could not join");
        }
        Ok(report)
    }
}

/// Applies one pool's `new` settings (valid) to its gateway `gw`.
fn reload_pool(
    gw: &Gateway,
    reloads: &Reloads,
    new: GatewayConfig,
) -> Result<ReloadReport, ConfigError> {
    {
        let changed = changed_keys(&reloads.last.lock(), &new);
        let mut report = ReloadReport {
            applied: changed.into_iter().filter(|k| live(k)).collect(),
            // Against the config started with: a restart-only setting differs until a
            // restart.
            restart: changed_keys(&reloads.started, &new)
                .into_iter()
                .filter(|k| !live(k))
                .collect(),
            ..ReloadReport::default()
        };
        if (report.applied.iter()).any(|k| k.starts_with("router.")) {
            // The policy's kind stays the running one (restart-only).
            let policy = kvroute_core::policy::PolicyConfig {
                kind: reloads.started.router.policy.kind,
                ..new.router.policy.clone()
            };
            if let Err(e) = gw.reconfigure(&new.router.admission, &policy) {
                return Err(ConfigError(e.to_string()));
            }
            // A tenant's new API key passes the gateway's access check only after a
            // restart when the API takes keys (it names its tenant at once otherwise).
            let keys = |c: &GatewayConfig| {
                let mut k: Vec<_> = (c.router.admission.flow.tenants.iter())
                    .map(|t| (t.name.clone(), t.api_keys.clone()))
                    .collect();
                k.sort();
                k
            };
            if !new.auth.api_keys.is_empty() && keys(&reloads.started) != keys(&new) {
                report
                    .restart
                    .push("router.admission.flow.tenants.api_keys".into());
            }
        }
        // The settings read per request, swapped in the gateway's config.
        let mut live = (*gw.config()).clone();
        live.limits.max_prompt_tokens = new.limits.max_prompt_tokens;
        live.limits.max_response_bytes = new.limits.max_response_bytes;
        live.upstream.retry = new.upstream.retry;
        live.upstream.forward_authorization = new.upstream.forward_authorization;
        live.upstream.first_byte_timeout_secs = new.upstream.first_byte_timeout_secs;
        live.upstream.migration_limit = new.upstream.migration_limit;
        live.flow_headers = new.flow_headers.clone();
        live.health.ready_without_engines = new.health.ready_without_engines;
        live.epp.subset_hint = new.epp.subset_hint;
        live.epp.conformance_headers = new.epp.conformance_headers;
        live.models.clone_from(&new.models);
        live.lora_adapters.clone_from(&new.lora_adapters);
        live.router.admission = new.router.admission.clone();
        live.router.policy = kvroute_core::policy::PolicyConfig {
            kind: live.router.policy.kind,
            ..new.router.policy.clone()
        };
        gw.set_config(std::sync::Arc::new(live));
        if report.applied.iter().any(|k| k == "workers") {
            match &reloads.configured {
                Some(tx) => {
                    tx.send_replace(new.workers.clone());
                }
                None => {
                    let c = membership::reconcile(&gw.fleet, &new.workers);
                    (report.joined, report.left, report.failed) = (c.added, c.removed, c.failed);
                }
            }
        }
        if report
            .applied
            .iter()
            .any(|k| k == "models" || k == "lora_adapters")
        {
            gw.models
                .reconfigure(new.models.clone(), new.lora_adapters.clone());
        }
        let mut applied = new;
        if !report.failed.is_empty() {
            // Not all joined: the next reload reconciles again, even with the same list.
            applied.workers.clear();
        }
        *reloads.last.lock() = applied;
        Ok(report)
    }
}

impl GatewayHandle {
    /// Counts and logs a reload refused before it reached the gateway (the config did not
    /// read); the running config stays.
    pub fn reload_refused(&self, why: &str) {
        self.state
            .metrics
            .config_reloads
            .with_label_values(&["invalid"])
            .inc();
        tracing::error!(error = %why, "config reload refused: the running config stays");
    }
}
