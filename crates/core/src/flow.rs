//! Flow control: who a request is (its tenant), what it is (its class: a priority band and
//! objectives) and what it needs (its own objectives, bounded by its class). The admission
//! queue ([`crate::AdmissionQueue`]) orders by it: strict priority between bands, weighted
//! fair queuing between tenants by token cost within a band, earliest deadline first within
//! a tenant; per-tenant limits ([`limits`]) refuse a tenant over its quota.
//!
//! Unknown tenants and classes get the defaults, never an error: a tenant not configured is
//! queued, limited and counted as the `default` tenant; a class not configured is the
//! default class. With no classes and no tenants configured every request is the same flow
//! and the queue keeps arrival order.

pub mod limits;
pub mod remap;

use serde::{Deserialize, Serialize};

/// The name of the tenant every request not mapped to a configured one belongs to.
pub const DEFAULT_TENANT: &str = "default";
/// The name of the class used when none is configured as the default.
pub const DEFAULT_CLASS: &str = "default";
/// Most classes or tenants one configuration may name (a bound on every table and label).
pub const MAX_FLOWS: usize = 256;

/// What to do with a request predicted to miss its time-to-first-token objective on every
/// eligible worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissAction {
    /// Admit it all the same (it may still meet it if the prediction is pessimistic).
    #[default]
    Admit,
    /// Refuse it at once (503 `predicted_miss`, with a `Retry-After` from the predicted
    /// drain), keeping the capacity for requests that can meet theirs.
    Reject,
}

impl std::str::FromStr for MissAction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "admit" => Ok(Self::Admit),
            "reject" => Ok(Self::Reject),
            other => Err(format!(
                "unknown on_predicted_miss {other:?} (expected admit or reject)"
            )),
        }
    }
}

/// A class of requests: a priority band and objectives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClassConfig {
    /// Its name (the class header's value, labels, reports).
    pub name: String,
    /// Its priority band: every waiting request of a higher band goes before any of a lower
    /// one, and a lower band is shed first.
    pub band: u8,
    /// Its time-to-first-token objective in seconds (unset: the router's goodput objective).
    /// A request of this class waits in the queue no longer than this.
    pub ttft_secs: Option<f64>,
    /// Its time-per-output-token objective in seconds (unset: the router's).
    pub tpot_secs: Option<f64>,
    /// What to do with a request predicted to miss its TTFT objective everywhere.
    pub on_predicted_miss: MissAction,
    /// Output tokens charged against a tenant's token bucket when a request does not say
    /// (`max_tokens` unset); the charge is corrected when it finishes.
    pub output_estimate: u32,
    /// How much the goodput policy weighs this class's predicted miss (1 = as today).
    pub miss_weight: f64,
    /// The value sent in the engine's own `priority` field, for workers marked as taking
    /// one (vLLM serves lower values first).
    pub engine_priority: Option<i32>,
    /// A request of this class finds a worker busy from this many outstanding prefill
    /// tokens on (on top of `router.admission`'s thresholds, which hold for every class):
    /// a low band kept from filling the engines' own first-come queues leaves room for the
    /// higher bands' first tokens.
    pub busy_prefill_tokens: Option<u64>,
    /// A request of this class finds a worker busy from this fraction of its batch limit
    /// on (on top of `router.admission`'s thresholds).
    pub busy_batch_fraction: Option<f64>,
}

impl Default for ClassConfig {
    fn default() -> Self {
        Self {
            name: DEFAULT_CLASS.into(),
            band: 0,
            ttft_secs: None,
            tpot_secs: None,
            on_predicted_miss: MissAction::Admit,
            output_estimate: 256,
            miss_weight: 1.0,
            engine_priority: None,
            busy_prefill_tokens: None,
            busy_batch_fraction: None,
        }
    }
}

impl ClassConfig {
    /// Whether a worker with this load and capacity is busy for a request of this class by
    /// the class's own thresholds.
    pub fn is_busy(
        &self,
        load: &crate::ledger::WorkerLoad,
        capacity: &crate::ledger::WorkerCapacity,
    ) -> bool {
        self.busy_prefill_tokens
            .is_some_and(|l| load.prefill_tokens >= l)
            || self
                .busy_batch_fraction
                .zip(capacity.max_batch)
                .is_some_and(|(f, b)| f64::from(load.inflight) >= f * f64::from(b))
    }
}

/// A tenant: its share of a band and its limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantConfig {
    /// Its name (the tenant header's value, labels, reports).
    pub name: String,
    /// Its weight in fair queuing: within a band, tenants are served tokens in proportion
    /// to their weights.
    pub weight: f64,
    /// Most of its requests in flight (queued or dispatched) at once.
    pub max_concurrent: Option<u32>,
    /// Its token bucket's rate: prompt + output tokens per second.
    pub tokens_per_sec: Option<f64>,
    /// Its token bucket's size (unset: ten seconds of its rate, so that a tenant sending
    /// below its rate in bursts, as Poisson arrivals come, is not refused). A request costing more
    /// than the whole bucket is let through when the bucket is full (see [`limits`]).
    pub burst_tokens: Option<u64>,
    /// API keys that identify it (`Authorization: Bearer <key>`); the gateway accepts them
    /// as it accepts `auth.api_keys`. Never written out.
    #[serde(skip_serializing)]
    pub api_keys: Vec<String>,
}

impl Default for TenantConfig {
    fn default() -> Self {
        Self {
            name: DEFAULT_TENANT.into(),
            weight: 1.0,
            max_concurrent: None,
            tokens_per_sec: None,
            burst_tokens: None,
            api_keys: Vec::new(),
        }
    }
}

/// Flow control settings: the classes and tenants.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FlowConfig {
    /// The classes (none: every request is of one default class, band 0, the router's
    /// objectives).
    pub classes: Vec<ClassConfig>,
    /// The class of a request that names none or an unknown one (unset: a class named
    /// `default` if configured, else the implicit default class).
    pub default_class: Option<String>,
    /// The tenants (a tenant named `default` sets the defaults' weight and limits).
    pub tenants: Vec<TenantConfig>,
}

/// A class by its place in [`Flows::classes`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassIx(pub u16);

/// A tenant by its place in [`Flows::tenants`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantIx(pub u16);

/// A request's flow: its tenant and class, and its band (its class's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flow {
    /// Its tenant.
    pub tenant: TenantIx,
    /// Its class.
    pub class: ClassIx,
    /// Its priority band.
    pub band: u8,
}

impl FlowConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if self.classes.len() > MAX_FLOWS || self.tenants.len() > MAX_FLOWS {
            return Err(format!(
                "flow: at most {MAX_FLOWS} classes and {MAX_FLOWS} tenants, got {} and {}",
                self.classes.len(),
                self.tenants.len()
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for c in &self.classes {
            check_name("class", &c.name)?;
            if !seen.insert(c.name.as_str()) {
                return Err(format!("flow: class {:?} is named twice", c.name));
            }
            for (what, v) in [("ttft_secs", c.ttft_secs), ("tpot_secs", c.tpot_secs)] {
                if let Some(v) = v {
                    if !(v.is_finite() && v > 0.0 && v <= 604_800.0) {
                        return Err(format!(
                            "flow: class {:?} {what} must be within (0, 604800], got {v}",
                            c.name
                        ));
                    }
                }
            }
            if c.busy_batch_fraction
                .is_some_and(|f| !(f.is_finite() && f > 0.0))
            {
                return Err(format!(
                    "flow: class {:?} busy_batch_fraction must be > 0",
                    c.name
                ));
            }
            if !(c.miss_weight.is_finite() && c.miss_weight > 0.0) {
                return Err(format!(
                    "flow: class {:?} miss_weight must be > 0, got {}",
                    c.name, c.miss_weight
                ));
            }
        }
        if let Some(d) = &self.default_class {
            if !self.classes.iter().any(|c| &c.name == d) {
                return Err(format!(
                    "flow: default_class {d:?} is not one of the classes"
                ));
            }
        }
        let mut seen = std::collections::HashSet::new();
        let mut keys = std::collections::HashSet::new();
        for t in &self.tenants {
            check_name("tenant", &t.name)?;
            if !seen.insert(t.name.as_str()) {
                return Err(format!("flow: tenant {:?} is named twice", t.name));
            }
            if !(t.weight.is_finite() && t.weight > 0.0 && t.weight <= 1e6) {
                return Err(format!(
                    "flow: tenant {:?} weight must be within (0, 1e6], got {}",
                    t.name, t.weight
                ));
            }
            if let Some(r) = t.tokens_per_sec {
                if !(r.is_finite() && r > 0.0) {
                    return Err(format!(
                        "flow: tenant {:?} tokens_per_sec must be > 0, got {r}",
                        t.name
                    ));
                }
            }
            if t.max_concurrent == Some(0) || t.burst_tokens == Some(0) {
                return Err(format!(
                    "flow: tenant {:?} max_concurrent and burst_tokens must be > 0 when set",
                    t.name
                ));
            }
            for k in &t.api_keys {
                if k.is_empty() || !keys.insert(k.as_str()) {
                    return Err(format!(
                        "flow: tenant {:?} has an empty API key or one another tenant has",
                        t.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether any class or tenant is configured (without, every request is one flow).
    pub fn is_configured(&self) -> bool {
        !self.classes.is_empty() || !self.tenants.is_empty()
    }

    /// The tables requests are resolved against (call on a validated configuration).
    pub fn compile(&self) -> Flows {
        let mut classes = self.classes.clone();
        let default_name = self.default_class.as_deref().unwrap_or(DEFAULT_CLASS);
        let default_class = match classes.iter().position(|c| c.name == default_name) {
            Some(i) => i,
            None => {
                classes.push(ClassConfig::default());
                classes.len() - 1
            }
        };
        let mut tenants = self.tenants.clone();
        let default_tenant = match tenants.iter().position(|t| t.name == DEFAULT_TENANT) {
            Some(i) => i,
            None => {
                tenants.push(TenantConfig::default());
                tenants.len() - 1
            }
        };
        Flows {
            configured: self.is_configured(),
            classes,
            tenants,
            default_class: ClassIx(default_class as u16),
            default_tenant: TenantIx(default_tenant as u16),
        }
    }
}

/// The classes and tenants as requests are resolved against them: every configured one,
/// plus the defaults (see [`FlowConfig::compile`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Flows {
    configured: bool,
    classes: Vec<ClassConfig>,
    tenants: Vec<TenantConfig>,
    default_class: ClassIx,
    default_tenant: TenantIx,
}

impl Default for Flows {
    fn default() -> Self {
        FlowConfig::default().compile()
    }
}

impl Flows {
    /// Whether any class or tenant is configured.
    pub fn is_configured(&self) -> bool {
        self.configured
    }

    /// Every class, the default included.
    pub fn classes(&self) -> &[ClassConfig] {
        &self.classes
    }

    /// Every tenant, the default included.
    pub fn tenants(&self) -> &[TenantConfig] {
        &self.tenants
    }

    /// Class `ix` (out of range: the default).
    pub fn class(&self, ix: ClassIx) -> &ClassConfig {
        self.classes
            .get(usize::from(ix.0))
            .unwrap_or(&self.classes[usize::from(self.default_class.0)])
    }

    /// Tenant `ix` (out of range: the default).
    pub fn tenant(&self, ix: TenantIx) -> &TenantConfig {
        self.tenants
            .get(usize::from(ix.0))
            .unwrap_or(&self.tenants[usize::from(self.default_tenant.0)])
    }

    /// The class named `name` (unknown or none: the default class).
    pub fn class_ix(&self, name: Option<&str>) -> ClassIx {
        name.and_then(|n| self.classes.iter().position(|c| c.name == n))
            .map_or(self.default_class, |i| ClassIx(i as u16))
    }

    /// The class whose engine priority is `priority` (none: the default class).
    pub fn class_of_priority(&self, priority: i64) -> ClassIx {
        self.classes
            .iter()
            .position(|c| c.engine_priority.is_some_and(|p| i64::from(p) == priority))
            .map_or(self.default_class, |i| ClassIx(i as u16))
    }

    /// The tenant named `name` (unknown or none: `default`).
    pub fn tenant_ix(&self, name: Option<&str>) -> TenantIx {
        name.and_then(|n| self.tenants.iter().position(|t| t.name == n))
            .map_or(self.default_tenant, |i| TenantIx(i as u16))
    }

    /// The tenant holding API key `key`, if any.
    pub fn tenant_of_key(&self, key: &str) -> Option<TenantIx> {
        self.tenants
            .iter()
            .position(|t| t.api_keys.iter().any(|k| k == key))
            .map(|i| TenantIx(i as u16))
    }

    /// The flow of tenant `tenant` and class `class`.
    pub fn flow(&self, tenant: TenantIx, class: ClassIx) -> Flow {
        Flow {
            tenant,
            class,
            band: self.class(class).band,
        }
    }

    /// The flow of a request naming tenant `tenant` and class `class` (either unknown or
    /// unset: the default).
    pub fn flow_of(&self, tenant: Option<&str>, class: Option<&str>) -> Flow {
        self.flow(self.tenant_ix(tenant), self.class_ix(class))
    }
}

fn check_name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "flow: {what} name {name:?} must be 1-64 characters of letters, digits, '-', '_', '.'"
        ))
    }
}

#[cfg(test)]
mod tests;
