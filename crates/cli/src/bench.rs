//! `kvroute bench`: A/B sweeps of policy x load x workers, each cell run `--repeats` times
//! after a warm-up and measured in `--snapshots` windows, on the fleet simulator (`--sim`)
//! or live (a fresh in-process gateway and simulated workers per cell, or `--target`).
//! Writes cells (TSV, JSON), per-request records, a Markdown report, plots and the
//! baseline file of `--baseline-policy`. Shows its progress cell by cell with the time
//! left ([`progress`]).

mod progress;
mod tenants;

use crate::demo::{start_fleet, DemoArgs};
use crate::simulate::{
    level_label, levels, prepare, sim_config, simulator_only_options, tiers_label, workload, Fleet,
    Load as SimLoad, Prepared, SimulateArgs,
};
use anyhow::{bail, Context, Result};
use clap::Args;
use kvroute_core::PolicyKind;
use kvroute_loadgen::{LoadKind, LoadgenConfig};
use kvroute_report::{write_plots, Baseline, Cell, Load, Metrics, Sweep, SweepInfo};
use kvroute_sim::simulate;
use kvroute_workload::{deciles, numbered_workers, records_tsv, RequestRecord, Slo, Summary};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Options of `kvroute bench` (the sweep options are those of `kvroute simulate`; the run's
/// shape and the objectives not given follow the reference method:
/// [`SimulateArgs::with_reference_run`],
/// [`SimulateArgs::with_reference_window`], [`SimulateArgs::slo`]).
#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub(crate) sweep: SimulateArgs,
    /// Run the cells on the fleet simulator (virtual time: seconds per cell) instead of live.
    #[arg(long)]
    sim: bool,
    /// Live: drive this OpenAI-compatible endpoint instead of starting a gateway and
    /// simulated workers per cell (its policy is whatever it runs: give one `--policy`).
    #[arg(long)]
    target: Option<String>,
    /// Live: the model name of the requests.
    #[arg(long, default_value = "kvroute-sim")]
    model: String,
    /// Live: speed-up of the simulated workers (2 = twice as fast as the profile).
    #[arg(long, default_value_t = 1.0)]
    worker_speedup: f64,
    /// Live: output tokens asked per turn (a tenants load: its spec's).
    #[arg(long, default_value_t = 830)]
    max_tokens: u32,
    /// Runs per cell (seeds `--seed`, `--seed`+1, ...); the report shows their mean.
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Measurement windows per run (after the warm-up); a run's figures are their mean.
    #[arg(long, default_value_t = 3)]
    snapshots: usize,
    /// The policy the others are compared with (Δ columns, baseline file).
    #[arg(long, default_value = "round_robin")]
    baseline_policy: PolicyKind,
}

/// Most runs per cell and snapshots per run.
const MAX_REPEATS: usize = 100;

/// Runs the sweep and writes the report.
pub fn run(args: &BenchArgs) -> Result<()> {
    let mut sweep = args.sweep.with_reference_run();
    // Live, the demo's fleet unless told otherwise: its engine profile (and, by default, its
    // worker count), so a live bench measures what the demo shows.
    if !args.sim && args.target.is_none() && sweep.profile.is_none() {
        sweep.profile = Some(crate::demo::DEMO_PROFILE.to_string());
    }
    let prepared = prepare(&sweep)?;
    let a = &BenchArgs {
        sweep: sweep.with_reference_window(&prepared.load),
        ..args.clone()
    };
    let s = &a.sweep;
    if !(1..=MAX_REPEATS).contains(&a.repeats) || !(1..=MAX_REPEATS).contains(&a.snapshots) {
        bail!("--repeats and --snapshots must be within 1..={MAX_REPEATS}");
    }
    if a.target.is_some() && matches!(prepared.load, SimLoad::Tenants(_)) {
        bail!(
            "a tenants load runs on fleets bench starts (with the spec's flow settings): drive an endpoint with `kvroute loadgen --tenants FILE` instead of --target"
        );
    }
    if a.target.is_some() && a.sim {
        bail!("--target drives a live endpoint: it cannot go with --sim");
    }
    if a.target.is_some() && s.policy.len() != 1 {
        bail!(
            "with --target the endpoint's own policy is measured: give exactly one --policy (its name in the report)"
        );
    }
    let live = !a.sim;
    let slo = s.slo();
    if let (true, [first, ..]) = (live, simulator_only_options(s).as_slice()) {
        bail!(
            "{first} shapes the simulated fleet: use it with --sim (a live bench starts the demo's gateway and workers, or drives --target)"
        );
    }
    if live && s.duration_secs.is_none() {
        bail!(
            "a live bench runs each cell for --duration-secs (default 420); --limit is for --sim"
        );
    }
    if live && matches!(prepared.load, SimLoad::Trace(_)) {
        bail!(
            "a live bench runs chat or synthetic loads; replay traces with `kvroute loadgen` or use --sim"
        );
    }
    let out_dir = s
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("bench-report"));
    std::fs::create_dir_all(out_dir.join("records"))
        .with_context(|| format!("creating {}", out_dir.display()))?;
    let loads = levels(s, &prepared);
    // A live run lasts its duration whatever its load; a simulated one grows with its load
    // (a trace's requests are the same at any speed-up).
    let work = |load: Load| match load {
        _ if live => 1.0,
        Load::Speedup(_) => 1.0,
        l => l.value().max(1e-3),
    };
    let fleets = crate::simulate::fleets(s)?;
    let cell_work: Vec<f64> = (fleets.iter())
        .flat_map(|_| {
            loads
                .iter()
                .flat_map(|&l| s.policy.iter().map(move |_| work(l)))
        })
        .collect();
    let progress = progress::Progress::new(
        cell_work,
        a.repeats,
        live.then(|| s.duration_secs.unwrap_or(0.0)),
    );
    progress.announce(&if live {
        format!("live, {} s each", secs(s.duration_secs.unwrap_or(0.0)))
    } else {
        "on the fleet simulator".to_string()
    });
    let mut cell_index = 0;
    // A tenants load: each run's rows by tenant (Markdown) and figures (JSON, by run).
    let mut by_tenant = String::new();
    let mut tenants_json = serde_json::Map::new();
    let mut planned = Vec::new();
    let rt = if live { Some(crate::runtime()?) } else { None };
    let mut sweep = Sweep {
        info: info(a, &prepared, live),
        cells: Vec::new(),
    };
    for &fleet in &fleets {
        let workers = fleet.workers;
        for &load in &loads {
            for &policy in &s.policy {
                let cell_started = std::time::Instant::now();
                let mut runs = Vec::new();
                let mut first_deciles = Vec::new();
                for r in 0..a.repeats {
                    let seed = s.seed.wrapping_add(r as u64);
                    let label = cell_label(policy, fleet, load, Some(r));
                    progress.run_starts(cell_index, r, &cell_label(policy, fleet, load, None));
                    let (records, workers_named, warm, window) = match (&prepared.load, &rt) {
                        (SimLoad::Tenants(spec), rt) => {
                            let (run, rows, json) = match rt {
                                None => tenants::run_sim(a, &prepared, spec, fleet, policy, seed)?,
                                Some(rt) => rt.block_on(tenants::run_live(
                                    a, &prepared, spec, fleet, policy, seed, &out_dir,
                                ))?,
                            };
                            by_tenant.push_str(&format!("\n### {label}\n\n{rows}"));
                            tenants_json.insert(label.clone(), json);
                            run
                        }
                        (_, None) => run_sim(a, &prepared, fleet, load, policy, seed)?,
                        (_, Some(rt)) => rt.block_on(run_live(a, fleet, load, policy, seed))?,
                    };
                    let measured: Vec<RequestRecord> = records
                        .iter()
                        .filter(|r| r.arrival.0 >= warm)
                        .cloned()
                        .collect();
                    if r == 0 {
                        first_deciles = deciles(&measured);
                    }
                    runs.push(snapshot_mean(&measured, warm, window, a.snapshots, &slo));
                    let file = out_dir.join("records").join(format!("{label}.tsv"));
                    std::fs::write(&file, records_tsv(&records, &workers_named))
                        .with_context(|| format!("writing {}", file.display()))?;
                    progress.run_ends();
                }
                let cell = Cell::new(
                    &fleet.policy_label(policy),
                    workers,
                    load,
                    runs,
                    first_deciles,
                );
                let load_name = match load {
                    Load::Speedup(x) => format!("{x}x"),
                    l => level_label(l),
                };
                planned.push((
                    fleet,
                    policy.as_str().to_string(),
                    load_name,
                    cell.metrics.goodput_per_s,
                ));
                let name = cell_label(policy, fleet, load, None);
                progress.cell_done(cell_index, &name, cell_started.elapsed().as_secs_f64());
                cell_index += 1;
                if s.json {
                    progress.suspend(|| {
                        println!("{}", serde_json::to_string(&cell).unwrap_or_default())
                    });
                }
                sweep.cells.push(cell);
            }
        }
    }
    progress.finish();
    // The planner's table: which fleet serves the most goodput at each load.
    let plan = s
        .plan_pd
        .map(|_| crate::simulate::plan_table(&planned))
        .unwrap_or_default();
    let mut extra = plan;
    if !by_tenant.is_empty() {
        extra.push_str(&format!(
            "\n## By tenant\n\nEach tenant's goodput against its class's objectives{}.\n{by_tenant}",
            if live {
                " (live: not run alone, no isolation)"
            } else {
                "; alone: its goodput with the fleet to itself"
            }
        ));
        let file = out_dir.join("tenants.json");
        std::fs::write(&file, serde_json::Value::Object(tenants_json).to_string())
            .with_context(|| format!("writing {}", file.display()))?;
    }
    write_outputs(a, &sweep, &out_dir, &extra)
}

/// A cell's name (`kv-w3-c16`, `goodput-w4-1p3d-auto-c16`), with `-runN` for one of its
/// runs (from 0).
fn cell_label(policy: PolicyKind, fleet: Fleet, load: Load, run: Option<usize>) -> String {
    let level = match level_label(load) {
        l if l.is_empty() => l,
        l => format!("-{l}"),
    };
    let run = run.map_or_else(String::new, |r| format!("-run{}", r + 1));
    format!("{}-{}{level}{run}", policy.as_str(), fleet.label('-'))
}

fn info(a: &BenchArgs, p: &Prepared, live: bool) -> SweepInfo {
    let s = &a.sweep;
    let setup = match (&a.target, live) {
        (Some(t), _) => format!("live, endpoint {t}"),
        (None, true) => format!(
            "live: a fresh in-process gateway and simulated workers per cell, profile `{}`, workers at {}x",
            s.profile(), a.worker_speedup
        ),
        (None, false) => format!(
            "fleet simulator, profile `{}`{}, admission `{:?}`, KV event delay {} ms{}",
            s.profile(),
            s.block_size
                .map_or(String::new(), |b| format!(", block size {b}")),
            s.admission,
            s.kv_event_delay_ms,
            tiers_label(s)
        ),
    };
    let window = match s.duration_secs {
        Some(d) => format!(
            "ramp {} s, warm-up {} s, measured until {} s in {} snapshot(s)",
            secs(s.ramp()),
            secs(s.warmup()),
            secs(d),
            a.snapshots
        ),
        None => format!(
            "warm-up {} s, measured to the end of the run in {} snapshot(s)",
            secs(s.warmup()),
            a.snapshots
        ),
    };
    let workload = match &p.load {
        SimLoad::Trace(t) => format!(
            "{} ({} requests, speed-up {})",
            s.workload,
            t.len(),
            s.speedup
        ),
        _ => s.workload.clone(),
    };
    SweepInfo {
        title: if live {
            "kvroute bench (live)"
        } else {
            "kvroute bench --sim"
        }
        .into(),
        setup,
        workload,
        repeats: a.repeats,
        window,
        baseline_policy: a.baseline_policy.as_str().into(),
        slo_ttft_p95_ms: s.slo().ttft_ms,
        slo_tpot_p95_ms: s.slo().tpot_ms,
    }
}

/// Seconds for the report: whole when whole, else to the tenth.
fn secs(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// One run's records, its workers' names (by the records' numbers), the warm-up and the
/// measured span.
pub(crate) type Run = (Vec<RequestRecord>, Vec<String>, Duration, Duration);

/// One simulated run: its records, the workers' names, the warm-up and the measured span.
fn run_sim(
    a: &BenchArgs,
    p: &Prepared,
    fleet: Fleet,
    load: Load,
    policy: PolicyKind,
    seed: u64,
) -> Result<Run> {
    let cfg = sim_config(&a.sweep, &p.profile, fleet, policy, seed)?;
    let r = simulate(&cfg, workload(&a.sweep, p, load, seed)?)?;
    Ok((
        r.records,
        numbered_workers(fleet.workers),
        cfg.warmup,
        Duration::from_secs_f64(r.sim_seconds),
    ))
}

/// One live run: a fresh fleet (unless `--target`), the chat (or synthetic) load for
/// `--duration-secs`, closed loop or open at the cell's rate.
async fn run_live(
    a: &BenchArgs,
    fleet: Fleet,
    load: Load,
    policy: PolicyKind,
    seed: u64,
) -> Result<Run> {
    let s = &a.sweep;
    let duration = s.duration_secs.unwrap_or(0.0);
    let fleet = match &a.target {
        Some(_) => None,
        None => Some(start_fleet(&demo_args(a, fleet, policy, None)).await?),
    };
    let target = match &fleet {
        Some(f) => f.gateway.url(),
        None => a.target.clone().unwrap_or_default(),
    };
    let mut config = LoadgenConfig {
        target,
        model: a.model.clone(),
        workload: if s.workload == "synthetic" {
            LoadKind::Synthetic
        } else {
            LoadKind::Multiturn
        },
        conversations: u64::MAX,
        duration_secs: duration,
        ramp_secs: s.ramp(),
        seed,
        ..LoadgenConfig::default()
    };
    match load {
        Load::Rate(r) => config.rate = Some(r),
        Load::Concurrency(c) => config.concurrency = c,
        Load::Speedup(_) => {}
    }
    if a.target.is_none() {
        // The demo's fleet: the demo's conversations, sized in tokens as the simulator's.
        config.chat = crate::demo::demo_chat(&kvroute_preprocess::Preprocessor::builtin())?;
    }
    config.chat.max_tokens = a.max_tokens;
    config.synthetic.max_tokens = a.max_tokens;
    let result = kvroute_loadgen::run(config).await;
    if let Some(f) = fleet {
        f.shutdown().await;
    }
    let result = result?;
    let warm = Duration::from_secs_f64(s.warmup());
    let window = Duration::from_secs_f64((duration - s.warmup()).max(0.0));
    Ok((result.records, result.workers, warm, window))
}

/// The demo's fleet for a live cell: its workers, policy and admission, with `config` as
/// the gateway's config file (if any).
fn demo_args(a: &BenchArgs, fleet: Fleet, policy: PolicyKind, config: Option<PathBuf>) -> DemoArgs {
    let s = &a.sweep;
    DemoArgs {
        host: "127.0.0.1".into(),
        port: 0,
        workers: fleet.workers,
        prefill_workers: fleet.is_split().then_some(fleet.prefill),
        decode_workers: fleet.is_split().then_some(fleet.decode),
        disaggregation: Some(fleet.mode),
        worker_port: 0,
        profile: s.profile().to_string(),
        speedup: a.worker_speedup,
        policy,
        tokenizer: "builtin".into(),
        model: a.model.clone(),
        pools: 1,
        tokenizer_cache_mib: None,
        tokenizer_threads: None,
        replay_buffer_mib: None,
        gateways: 1,
        nats: None,
        admission: Some(s.admission),
        config,
        objectives: s.objectives(),
        arm: None,
    }
}

/// A run's figures: the mean over `snapshots` equal windows of arrivals from `warm` on (one
/// window: the whole measured span).
fn snapshot_mean(
    measured: &[RequestRecord],
    warm: Duration,
    span: Duration,
    snapshots: usize,
    slo: &Slo,
) -> Metrics {
    let summary = |records: &[RequestRecord], span| {
        Metrics::from_summary(&Summary::from_records_with_slo(records, span, Some(slo)))
    };
    if snapshots <= 1 || span.is_zero() {
        return summary(measured, span);
    }
    let part = span / snapshots as u32;
    let parts: Vec<Metrics> = (0..snapshots as u32)
        .map(|i| {
            let from = warm + part * i;
            let to = from + part;
            let window: Vec<RequestRecord> = measured
                .iter()
                .filter(|r| r.arrival.0 >= from && (r.arrival.0 < to || i + 1 == snapshots as u32))
                .cloned()
                .collect();
            summary(&window, part)
        })
        .collect();
    Metrics::mean(&parts)
}

fn write_outputs(a: &BenchArgs, sweep: &Sweep, dir: &Path, plan: &str) -> Result<()> {
    let write = |name: &str, text: String| {
        let file = dir.join(name);
        std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))
    };
    write("cells.tsv", sweep.tsv())?;
    write("sweep.json", sweep.json())?;
    let plots = write_plots(sweep, dir)?;
    let report = kvroute_report::markdown(sweep, &plots) + plan;
    write("report.md", report.clone())?;
    // A baseline file per policy and fleet size (the dashboard compares any two), marked
    // simulated when the fleet simulator ran it.
    let mut baselines = Vec::new();
    for policy in &a.sweep.policy {
        let p = policy.as_str();
        for w in sweep.worker_counts() {
            if let Ok(mut b) =
                Baseline::from_sweep(sweep, p, w, &a.sweep.workload, &sweep.info.setup)
            {
                b.simulated = a.sim;
                let name = format!("baseline-{p}-w{w}.json");
                write(&name, b.to_json())?;
                baselines.push(name);
            }
        }
    }
    if !a.sweep.json {
        print!("{report}");
    }
    eprintln!(
        "wrote {}: report.md, cells.tsv, sweep.json, {} plots (SVG + PNG), records/{}",
        dir.display(),
        plots.len(),
        if baselines.is_empty() {
            String::new()
        } else {
            format!(", {}", baselines.join(", "))
        }
    );
    Ok(())
}
