//! `kvroute bench --workload tenants[:FILE]`: a cell's run of several tenants at once, each
//! its own load, tenant and class (the spec of `kvroute simulate --workload tenants`), and a
//! row per tenant in the report. On the fleet simulator each tenant is also run alone (its
//! isolation); live, the cell's gateway gets the spec's flow settings and trusts a tenant
//! header the load generator sets per tenant (with the class header), and each tenant's
//! load is a run of the load generator of its own.

use super::{BenchArgs, Run};
use crate::demo::start_fleet;
use crate::simulate::tenants::{self as spec_of, Kind, Spec};
use crate::simulate::{Fleet, Prepared};
use anyhow::{Context, Result};
use kvroute_core::PolicyKind;
use kvroute_loadgen::{LoadKind, LoadgenConfig, RunResult};
use kvroute_workload::{numbered_workers, RequestRecord, Slo, Summary};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The header the live cell's gateway trusts to name the tenant (set by the load generator,
/// never by an outside client: the gateway listens on 127.0.0.1 for the bench only).
pub(crate) const TENANT_HEADER: &str = "x-kvroute-tenant";

/// One cell's run with its tenants' rows (Markdown) and their figures (JSON, by tenant).
pub(super) type TenantsRun = (Run, String, serde_json::Value);

/// One simulated run: the tenants together, each alone, a row each.
pub(super) fn run_sim(
    a: &BenchArgs,
    p: &Prepared,
    spec: &Spec,
    fleet: Fleet,
    policy: PolicyKind,
    seed: u64,
) -> Result<TenantsRun> {
    let mut sweep = a.sweep.clone();
    sweep.seed = seed;
    let (r, json, rows) = spec_of::run_cell(&sweep, p, spec, fleet, policy)?;
    Ok((
        (
            r.records,
            numbered_workers(fleet.workers),
            Duration::from_secs_f64(sweep.warmup()),
            Duration::from_secs_f64(r.sim_seconds),
        ),
        rows,
        json,
    ))
}

/// One live run: a fresh fleet whose gateway has the spec's flow settings, every tenant's
/// load at once for `--duration-secs` (open-loop rates and quotas resolved on the simulated
/// profile and scaled by the workers' speed-up; output lengths the spec's, not
/// `--max-tokens`), a row each (not run alone: no isolation).
pub(super) async fn run_live(
    a: &BenchArgs,
    p: &Prepared,
    spec: &Spec,
    fleet: Fleet,
    policy: PolicyKind,
    seed: u64,
    dir: &Path,
) -> Result<TenantsRun> {
    let s = &a.sweep;
    let speedup = a.worker_speedup;
    let mut resolved = spec_of::resolve(s, p, fleet, spec)?;
    for r in &mut resolved {
        r.rate = r.rate.map(|x| x * speedup);
        r.quota_tokens_per_s = r.quota_tokens_per_s.map(|x| x * speedup);
    }
    let flow = spec_of::flow_config(spec, &resolved);
    let config = dir.join("gateway-tenants.toml");
    std::fs::write(&config, gateway_config(&flow)?)
        .with_context(|| format!("writing {}", config.display()))?;
    let fleet_up = start_fleet(&super::demo_args(a, fleet, policy, Some(config))).await?;
    let pre = kvroute_preprocess::Preprocessor::builtin();
    let duration = s.duration_secs.unwrap_or(0.0);
    let mut loads = Vec::with_capacity(spec.loads.len());
    for (i, (l, r)) in spec.loads.iter().zip(&resolved).enumerate() {
        let mut headers = BTreeMap::from([(TENANT_HEADER.to_string(), l.tenant.clone())]);
        if !l.class.is_empty() {
            headers.insert(
                kvroute_gateway::config::FlowHeaders::default().class,
                l.class.clone(),
            );
        }
        let mut c = LoadgenConfig {
            target: fleet_up.gateway.url(),
            model: a.model.clone(),
            workload: match l.kind {
                Kind::Chat => LoadKind::Multiturn,
                Kind::Closed | Kind::Open => LoadKind::Synthetic,
            },
            conversations: u64::MAX,
            duration_secs: duration,
            ramp_secs: s.ramp(),
            seed: seed.wrapping_add(1 + i as u64),
            headers,
            chat: crate::demo::demo_chat_like(&pre, &l.multiturn)?,
            synthetic: l.synthetic.clone(),
            ..LoadgenConfig::default()
        };
        match (l.kind, l.concurrency_per_worker, r.rate) {
            (Kind::Open, _, Some(rate)) => c.rate = Some(rate),
            (_, Some(per_worker), _) => {
                c.concurrency = ((per_worker * fleet.workers as f64).round() as usize).max(1)
            }
            _ => anyhow::bail!("tenant {:?}: no rate or concurrency", l.tenant),
        }
        loads.push(c);
    }
    let results = kvroute_loadgen::run_tenants(loads).await;
    fleet_up.shutdown().await;
    let results = results?;
    let warm = Duration::from_secs_f64(s.warmup());
    let window = Duration::from_secs_f64((duration - s.warmup()).max(0.0));
    let (rows, json) = live_rows(spec, &results, warm, window, &s.slo())?;
    let (records, workers) = merged(results);
    Ok(((records, workers, warm, window), rows, json))
}

/// The live gateway's config for `flow`: the flow settings and the trusted tenant header.
fn gateway_config(flow: &kvroute_core::flow::FlowConfig) -> Result<String> {
    let mut admission = toml::Table::new();
    admission.insert("flow".into(), toml::Value::try_from(flow)?);
    let mut router = toml::Table::new();
    router.insert("admission".into(), toml::Value::Table(admission));
    let mut headers = toml::Table::new();
    headers.insert("tenant".into(), TENANT_HEADER.into());
    let mut top = toml::Table::new();
    top.insert("router".into(), toml::Value::Table(router));
    top.insert("flow_headers".into(), toml::Value::Table(headers));
    Ok(format!(
        "# Written by kvroute bench for a live tenants cell.\n{}",
        toml::to_string(&top)?
    ))
}

/// A row and a JSON entry per tenant: its measured requests' summary against its class's
/// objectives (the run's where its class sets none).
fn live_rows(
    spec: &Spec,
    results: &[RunResult],
    warm: Duration,
    window: Duration,
    slo: &Slo,
) -> Result<(String, serde_json::Value)> {
    let flows = spec.flow.compile();
    let mut rows = String::from(spec_of::TABLE_HEAD);
    let mut json = serde_json::Map::new();
    for (l, r) in spec.loads.iter().zip(results) {
        let class = flows.class(flows.class_ix(Some(l.class.as_str()).filter(|c| !c.is_empty())));
        let objective = slo.with_class(class.ttft_secs, class.tpot_secs);
        let measured: Vec<RequestRecord> = (r.records.iter())
            .filter(|r| r.arrival.0 >= warm)
            .cloned()
            .collect();
        let summary = Summary::from_records_with_slo(&measured, window, Some(&objective));
        rows.push_str(&spec_of::row(&l.tenant, &class.name, &summary, None));
        let mut entry = serde_json::to_value(&summary)?;
        entry["class"] = class.name.clone().into();
        json.insert(l.tenant.clone(), entry);
    }
    Ok((rows, serde_json::Value::Object(json)))
}

/// Every tenant's records in one list, their workers numbered in one list of names.
fn merged(results: Vec<RunResult>) -> (Vec<RequestRecord>, Vec<String>) {
    let mut names: Vec<String> = Vec::new();
    let mut records = Vec::new();
    for r in results {
        let mut number = |w: u64| -> u64 {
            let name = r.workers.get(w as usize).cloned().unwrap_or_default();
            let at = match names.iter().position(|n| *n == name) {
                Some(at) => at,
                None => {
                    names.push(name);
                    names.len() - 1
                }
            };
            at as u64
        };
        for mut rec in r.records.iter().cloned() {
            rec.worker = rec.worker.map(&mut number);
            rec.prefill_worker = rec.prefill_worker.map(&mut number);
            records.push(rec);
        }
    }
    records.sort_by_key(|r| r.arrival.0);
    (records, names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_core::{RequestId, Time};

    fn record(worker: u64, at_ms: u64) -> RequestRecord {
        let mut r = RequestRecord::new(RequestId(at_ms), Time(Duration::from_millis(at_ms)), 10);
        r.worker = Some(worker);
        r
    }

    fn run(workers: &[&str], records: Vec<RequestRecord>) -> RunResult {
        RunResult {
            records,
            turns: Vec::new(),
            workers: workers.iter().map(|w| w.to_string()).collect(),
            duration: Duration::from_secs(1),
        }
    }

    #[test]
    fn merged_records_name_the_same_worker_by_one_number() {
        let (records, names) = merged(vec![
            run(&["w-b", "w-a"], vec![record(0, 5), record(1, 1)]),
            run(&["w-a", "w-c"], vec![record(0, 3), record(1, 2)]),
        ]);
        assert_eq!(names, ["w-b", "w-a", "w-c"]);
        let by: Vec<(u64, &str)> = (records.iter())
            .map(|r| {
                let ms = r.arrival.0.as_millis() as u64;
                (ms, names[r.worker.unwrap() as usize].as_str())
            })
            .collect();
        assert_eq!(by, [(1, "w-a"), (2, "w-c"), (3, "w-a"), (5, "w-b")]);
    }

    #[test]
    fn the_live_gateway_config_reads_back_with_the_flow_and_the_tenant_header() {
        let spec = Spec::load("tenants").unwrap();
        let text = gateway_config(&spec.flow).unwrap();
        let config: kvroute_gateway::config::GatewayConfig = toml::from_str(&text).unwrap();
        assert_eq!(config.router.admission.flow, spec.flow);
        assert_eq!(config.flow_headers.tenant.as_deref(), Some(TENANT_HEADER));
    }
}
