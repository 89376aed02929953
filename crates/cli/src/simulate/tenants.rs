//! `kvroute simulate --workload tenants[:FILE]`: several tenants at once, each its own load
//! under its own tenant and class, through the one admission queue's flow control; per
//! tenant: what it sent, what was served and refused (by reason), its latencies, its goodput
//! against its class's objectives, and its isolation (its goodput here against its goodput
//! with the fleet to itself, which is also run).
//!
//! A spec (TOML) names the flow settings (`[flow]`, `router.admission.flow`'s) and a load per
//! tenant (`[[loads]]`). Open-loop rates and token quotas may be given as shares of the
//! fleet's capacity for that load's requests (`rate_of_capacity`, `quota_of_capacity`),
//! measured by a probe run (a closed loop of those requests saturating the fleet), so that a
//! spec means the same load on any profile and fleet size. The built-in spec (`tenants`) is
//! [`BUILTIN`].

use super::{sim_config, Fleet, Prepared, SimulateArgs};
use anyhow::{bail, Context, Result};
use kvroute_core::flow::FlowConfig;
use kvroute_core::PolicyKind;
use kvroute_sim::{simulate, SimResult, TenantLoad, Workload};
use kvroute_workload::{MultiTurn, MultiTurnConfig, Synthetic, SyntheticConfig};
use serde::Deserialize;
use serde_json::json;
use std::time::Duration;

/// The built-in three-tenant example: an interactive chat tenant in a high band with the
/// reference objectives, a batch summarisation tenant of long documents in the low band
/// (TTFT objective 30 s, open loop at twice the fleet's capacity for its requests), and a
/// tenant flooding at four times its token quota.
pub(crate) const BUILTIN: &str = include_str!("tenants/builtin.toml");

/// A tenants spec.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Spec {
    /// Classes and tenants (weights, limits).
    #[serde(default)]
    pub flow: FlowConfig,
    /// One load per tenant.
    pub loads: Vec<LoadSpec>,
    /// How the engines take waiting requests: `fcfs`, or `priority` (each request's class's
    /// `engine_priority`, lower first, as vLLM's `--scheduling-policy priority` with the
    /// gateway sending it).
    #[serde(default)]
    pub scheduling_policy: kvroute_worker::SchedulingPolicy,
}

/// What a tenant sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    /// Multi-turn conversations, a closed loop.
    Chat,
    /// Shared-prefix requests, a closed loop.
    Closed,
    /// Shared-prefix requests, Poisson arrivals.
    Open,
}

/// One tenant's load.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LoadSpec {
    /// Its tenant (a `[[flow.tenants]]` name, or the defaults).
    pub tenant: String,
    /// Its class (a `[[flow.classes]]` name, or the default class).
    #[serde(default)]
    pub class: String,
    /// What it sends.
    pub kind: Kind,
    /// Closed loops: clients per worker of the fleet.
    pub concurrency_per_worker: Option<f64>,
    /// Open loop: requests per second.
    pub rate: Option<f64>,
    /// Open loop: requests per second as a share of the fleet's capacity for its requests.
    pub rate_of_capacity: Option<f64>,
    /// Its tenant's token bucket (`tokens_per_sec`) as a share of the fleet's capacity in
    /// tokens for its requests (overrides the flow settings').
    pub quota_of_capacity: Option<f64>,
    /// Its tenant's token bucket size in seconds of its quota (with `quota_of_capacity`;
    /// unset: the flow settings' default, 10 s).
    pub burst_secs: Option<f64>,
    /// Open loop: a rate of this many times its quota (with `quota_of_capacity`).
    pub rate_of_quota: Option<f64>,
    /// Shared-prefix requests' shape.
    #[serde(default)]
    pub synthetic: SyntheticConfig,
    /// Conversations' shape.
    #[serde(default)]
    pub multiturn: MultiTurnConfig,
}

/// Most tenants of a spec.
const MAX_LOADS: usize = 64;

impl Spec {
    /// Reads `--workload tenants` (the built-in spec) or `tenants:FILE`.
    pub(crate) fn load(workload: &str) -> Result<Spec> {
        let (name, text) = match workload.split_once(':') {
            Some((_, path)) => (
                path.to_string(),
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading tenants spec {path}"))?,
            ),
            None => ("the built-in spec".to_string(), BUILTIN.to_string()),
        };
        let spec: Spec = toml::from_str(&text).with_context(|| format!("parsing {name}"))?;
        spec.validate()
            .with_context(|| format!("checking {name}"))?;
        Ok(spec)
    }

    fn validate(&self) -> Result<()> {
        self.flow.validate().map_err(anyhow::Error::msg)?;
        if self.loads.is_empty() || self.loads.len() > MAX_LOADS {
            bail!("between 1 and {MAX_LOADS} loads, got {}", self.loads.len());
        }
        for (i, l) in self.loads.iter().enumerate() {
            let name = &l.tenant;
            if name.is_empty() || self.loads[..i].iter().any(|o| &o.tenant == name) {
                bail!("load {i}: each load names a tenant of its own, got {name:?}");
            }
            l.synthetic.validate().map_err(anyhow::Error::msg)?;
            l.multiturn.validate().map_err(anyhow::Error::msg)?;
            let positive = |what: &str, v: Option<f64>| -> Result<()> {
                match v {
                    Some(v) if !(v.is_finite() && v > 0.0 && v <= 1e6) => {
                        bail!("tenant {name:?}: {what} must be within (0, 1e6], got {v}")
                    }
                    _ => Ok(()),
                }
            };
            positive("concurrency_per_worker", l.concurrency_per_worker)?;
            positive("rate", l.rate)?;
            positive("rate_of_capacity", l.rate_of_capacity)?;
            positive("quota_of_capacity", l.quota_of_capacity)?;
            positive("rate_of_quota", l.rate_of_quota)?;
            positive("burst_secs", l.burst_secs)?;
            if l.burst_secs.is_some() && l.quota_of_capacity.is_none() {
                bail!("tenant {name:?}: burst_secs needs quota_of_capacity");
            }
            let rates = [l.rate, l.rate_of_capacity, l.rate_of_quota]
                .iter()
                .filter(|r| r.is_some())
                .count();
            match l.kind {
                Kind::Open if rates != 1 => bail!(
                    "tenant {name:?}: an open loop needs one of rate, rate_of_capacity, rate_of_quota"
                ),
                Kind::Open if l.rate_of_quota.is_some() && l.quota_of_capacity.is_none() => {
                    bail!("tenant {name:?}: rate_of_quota needs quota_of_capacity")
                }
                Kind::Chat | Kind::Closed if l.concurrency_per_worker.is_none() || rates > 0 => {
                    bail!("tenant {name:?}: a closed loop needs concurrency_per_worker and no rate")
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// A load's shape resolved on a fleet: its open-loop rate and its tenant's quota.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Resolved {
    /// Its open-loop rate, requests per second.
    pub(crate) rate: Option<f64>,
    /// Its tenant's token bucket rate.
    pub(crate) quota_tokens_per_s: Option<f64>,
}

/// The fleet's capacity for requests of shape `shape`: requests and prompt + output tokens
/// per second served by a closed loop that keeps every worker's batch full.
fn capacity(
    a: &SimulateArgs,
    p: &Prepared,
    fleet: Fleet,
    shape: &SyntheticConfig,
) -> Result<(f64, f64)> {
    let mut cfg = sim_config(a, &p.profile, fleet, PolicyKind::Goodput, a.seed)?;
    cfg.duration = None;
    cfg.warmup = Duration::ZERO;
    cfg.ramp = Duration::ZERO;
    let clients = fleet.workers * cfg.engine.max_num_seqs.min(64);
    let r = simulate(
        &cfg,
        Workload::Synthetic {
            gen: Synthetic::new(shape.clone(), a.seed)?,
            concurrency: clients,
            requests: 4 * clients,
        },
    )?;
    let rps = r.summary.requests_per_s.unwrap_or(0.0);
    let per_request =
        (shape.prefix_tokens + shape.suffix_tokens) as f64 + f64::from(shape.max_tokens);
    if rps <= 0.0 {
        bail!(
            "the capacity probe served none of its requests ({per_request} tokens each): does one fit an engine of profile {}?",
            a.profile()
        );
    }
    Ok((rps, rps * per_request))
}

/// Each load resolved on `fleet` (probing its capacity where a share of it is asked).
pub(crate) fn resolve(
    a: &SimulateArgs,
    p: &Prepared,
    fleet: Fleet,
    spec: &Spec,
) -> Result<Vec<Resolved>> {
    spec.loads
        .iter()
        .map(|l| {
            let probe = l.rate_of_capacity.is_some() || l.quota_of_capacity.is_some();
            let (rps, tps) = if probe {
                capacity(a, p, fleet, &l.synthetic)?
            } else {
                (0.0, 0.0)
            };
            let quota = l.quota_of_capacity.map(|q| q * tps);
            let per_request = (l.synthetic.prefix_tokens + l.synthetic.suffix_tokens) as f64
                + f64::from(l.synthetic.max_tokens);
            let rate = l
                .rate
                .or(l.rate_of_capacity.map(|x| x * rps))
                .or(l.rate_of_quota.zip(quota).map(|(x, q)| x * q / per_request));
            Ok(Resolved {
                rate,
                quota_tokens_per_s: quota,
            })
        })
        .collect()
}

/// The flow settings with the resolved quotas.
pub(crate) fn flow_config(spec: &Spec, resolved: &[Resolved]) -> FlowConfig {
    let mut flow = spec.flow.clone();
    for (l, r) in spec.loads.iter().zip(resolved) {
        if let Some(q) = r.quota_tokens_per_s {
            let burst = l.burst_secs.map(|b| ((q * b).ceil() as u64).max(1));
            match flow.tenants.iter_mut().find(|t| t.name == l.tenant) {
                Some(t) => {
                    t.tokens_per_sec = Some(q);
                    t.burst_tokens = burst.or(t.burst_tokens);
                }
                None => flow.tenants.push(kvroute_core::flow::TenantConfig {
                    name: l.tenant.clone(),
                    tokens_per_sec: Some(q),
                    burst_tokens: burst,
                    ..Default::default()
                }),
            }
        }
    }
    flow
}

/// The workload of the loads `only` (all: `None`), on `workers` workers.
fn workload(
    a: &SimulateArgs,
    spec: &Spec,
    resolved: &[Resolved],
    workers: usize,
    only: Option<usize>,
) -> Result<Workload> {
    let mut loads = Vec::new();
    for (i, (l, r)) in spec.loads.iter().zip(resolved).enumerate() {
        if only.is_some_and(|o| o != i) {
            continue;
        }
        // Each tenant its own stream of prompts and arrivals.
        let seed = a.seed.wrapping_add(1 + i as u64);
        let clients = l
            .concurrency_per_worker
            .map_or(0, |c| ((c * workers as f64).round() as usize).max(1));
        let requests = a.limit.unwrap_or(if a.duration_secs.is_some() {
            usize::MAX
        } else {
            10 * clients.max(1)
        });
        let load = match l.kind {
            Kind::Chat => Workload::MultiTurn {
                gen: MultiTurn::new(l.multiturn.clone(), seed)?,
                concurrency: clients,
                requests,
            },
            Kind::Closed => Workload::Synthetic {
                gen: Synthetic::new(l.synthetic.clone(), seed)?,
                concurrency: clients,
                requests,
            },
            Kind::Open => {
                let rate = r.rate.context("an open loop's rate")?;
                super::open_loop(a, l.synthetic.clone(), rate, seed)?
            }
        };
        loads.push(TenantLoad {
            tenant: l.tenant.clone(),
            class: l.class.clone(),
            load,
        });
    }
    Ok(Workload::Tenants(loads))
}

/// The head of the table of tenants [`row`] writes the rows of.
pub(crate) const TABLE_HEAD: &str = "| tenant | class | sent | completed | refused | TTFT p50 ms | TTFT p95 ms | TPOT p95 ms | goodput /s | alone /s | isolation |\n|---|---|---|---|---|---|---|---|---|---|---|\n";

/// A tenant's row: its summary (goodput against its class's objectives) and, when it was
/// measured, its goodput with the fleet to itself and the ratio.
pub(crate) fn row(
    tenant: &str,
    class: &str,
    s: &kvroute_workload::Summary,
    alone: Option<f64>,
) -> String {
    let here = s.goodput.as_ref().and_then(|g| g.per_s).unwrap_or(0.0);
    let fmt = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
    let refused = match s.rejected_by_reason.len() {
        0 => s.rejected.to_string(),
        _ => {
            let by: Vec<String> = (s.rejected_by_reason.iter())
                .map(|(reason, n)| format!("{n} {reason}"))
                .collect();
            by.join(", ")
        }
    };
    format!(
        "| {tenant} | {class} | {} | {} | {refused} | {} | {} | {} | {here:.3} | {} | {} |\n",
        s.sent,
        s.completed,
        fmt(s.ttft_ms.p50, 0),
        fmt(s.ttft_ms.p95, 0),
        fmt(s.tpot_ms.p95, 0),
        fmt(alone, 3),
        fmt(alone.filter(|a| *a > 0.0).map(|a| here / a), 3),
    )
}

/// One cell: the tenants together, then each alone; its JSON and its Markdown rows.
pub(crate) fn run_cell(
    a: &SimulateArgs,
    p: &Prepared,
    spec: &Spec,
    fleet: Fleet,
    policy: PolicyKind,
) -> Result<(SimResult, serde_json::Value, String)> {
    if a.duration_secs.is_none() && a.limit.is_none() {
        bail!("--workload tenants needs --duration-secs or --limit to end its open loops");
    }
    let resolved = resolve(a, p, fleet, spec)?;
    let mut cfg = sim_config(a, &p.profile, fleet, policy, a.seed)?;
    cfg.router.admission.flow = flow_config(spec, &resolved);
    cfg.engine.priority_scheduling =
        spec.scheduling_policy == kvroute_worker::SchedulingPolicy::Priority;
    cfg.validate()?;
    let together = simulate(&cfg, workload(a, spec, &resolved, fleet.workers, None)?)?;
    let mut tenants = serde_json::Map::new();
    let mut rows = String::from(TABLE_HEAD);
    let flows = cfg.router.admission.flow.compile();
    for (i, t) in together.tenants.iter().enumerate() {
        let alone = simulate(&cfg, workload(a, spec, &resolved, fleet.workers, Some(i))?)?;
        let s = &t.summary;
        let here = s.goodput.as_ref().and_then(|g| g.per_s).unwrap_or(0.0);
        let solo = alone.tenants[0]
            .summary
            .goodput
            .as_ref()
            .and_then(|g| g.per_s)
            .unwrap_or(0.0);
        let isolation = (solo > 0.0).then(|| here / solo);
        let class = &flows
            .class(flows.class_ix(Some(t.class.as_str()).filter(|c| !c.is_empty())))
            .name;
        rows.push_str(&row(&t.tenant, class, s, Some(solo)));
        tenants.insert(
            t.tenant.clone(),
            json!({
                "class": class,
                "sent": s.sent,
                "completed": s.completed,
                "failed": s.failed,
                "refused": s.rejected_by_reason,
                "goodput": {"per_s": here, "met": s.goodput.as_ref().map(|g| g.met)},
                "alone_goodput_per_s": solo,
                "isolation": isolation,
                "output_tokens_per_s": s.output_tokens_per_s,
                "ttft_ms": {"p50": s.ttft_ms.p50, "p95": s.ttft_ms.p95, "p99": s.ttft_ms.p99},
                "tpot_ms": {"p50": s.tpot_ms.p50, "p95": s.tpot_ms.p95},
                "rate": resolved[i].rate,
                "quota_tokens_per_s": resolved[i].quota_tokens_per_s,
            }),
        );
    }
    if together.classes.len() > 1 || together.classes.iter().any(|c| c.tenants.len() > 1) {
        rows.push('\n');
        rows.push_str(&TABLE_HEAD.replacen("| tenant | class |", "| class | tenants |", 1));
        for c in &together.classes {
            rows.push_str(&row(&c.class, &c.tenants.join(", "), &c.summary, None));
        }
    }
    Ok((together, serde_json::Value::Object(tenants), rows))
}

/// The run's classes (every tenant's requests of a class together): by class, its tenants,
/// sent, completed, refused by reason, goodput against its objectives and its latencies.
pub(crate) fn classes_json(r: &SimResult) -> serde_json::Value {
    let by: serde_json::Map<String, serde_json::Value> = (r.classes.iter())
        .map(|c| {
            let s = &c.summary;
            let entry = json!({
                "tenants": c.tenants,
                "sent": s.sent,
                "completed": s.completed,
                "failed": s.failed,
                "refused": s.rejected_by_reason,
                "goodput": {
                    "per_s": s.goodput.as_ref().and_then(|g| g.per_s),
                    "met": s.goodput.as_ref().map(|g| g.met),
                },
                "output_tokens_per_s": s.output_tokens_per_s,
                "ttft_ms": {"p50": s.ttft_ms.p50, "p95": s.ttft_ms.p95, "p99": s.ttft_ms.p99},
                "tpot_ms": {"p50": s.tpot_ms.p50, "p95": s.tpot_ms.p95},
            });
            (c.class.clone(), entry)
        })
        .collect();
    serde_json::Value::Object(by)
}

#[cfg(test)]
mod tests;
