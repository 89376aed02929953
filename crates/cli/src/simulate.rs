//! `kvroute simulate`: policy x workers x load sweeps of the fleet simulator, printed as a
//! table or JSON lines, with per-request TSV records and a Markdown report on request.

use anyhow::{bail, Context, Result};
use clap::Args;
use kvroute_core::policy::GoodputConfig;
use kvroute_core::{AdmissionMode, PolicyKind};
use kvroute_engine::{EngineConfig, Profile};
use kvroute_report::Load as Level;
use kvroute_sim::{simulate, SimConfig, SimResult, Workload};
use kvroute_workload::{
    deciles, deciles_markdown, markdown_table, mooncake, numbered_workers, records_tsv,
    text_tokens, MultiTurn, MultiTurnConfig, Slo, Summary, Synthetic, SyntheticConfig,
    TraceOptions, TraceRequest,
};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub(crate) use fleet::{fleets, plan_table, Fleet};

/// Options of `kvroute simulate`.
#[derive(Args, Clone, Debug)]
pub struct SimulateArgs {
    /// The load: `mooncake:<file>` (trace replay), `multiturn` or `synthetic` (closed loops).
    #[arg(long, default_value = "multiturn")]
    pub(crate) workload: String,
    /// Multi-turn: conversation starters, one text file each, from this directory (default:
    /// built-in generated starters).
    #[arg(long)]
    pub(crate) starters: Option<PathBuf>,
    /// Engine replicas; several values make a sweep.
    #[arg(long, value_delimiter = ',', default_value = "3")]
    pub(crate) workers: Vec<usize>,
    /// A disaggregated fleet: this many prefill-only engines (with `--decode-workers`;
    /// `--workers` is then their sum). A request's prompt may be computed on one and its KV
    /// moved to its decode engine over the link (`--link-gb-per-sec`, `--link-latency-ms`).
    #[arg(long, conflicts_with_all = ["workers", "plan_pd"], requires = "decode_workers")]
    pub(crate) prefill_workers: Option<usize>,
    /// A disaggregated fleet: this many decode-only engines (with `--prefill-workers`).
    #[arg(long, conflicts_with_all = ["workers", "plan_pd"], requires = "prefill_workers")]
    pub(crate) decode_workers: Option<usize>,
    /// The P:D planner: every split of this many engines into prefill and decode pools, and
    /// all of them aggregated, at each load; a table says which serves the most goodput.
    #[arg(long, conflicts_with = "workers")]
    pub(crate) plan_pd: Option<usize>,
    /// How a disaggregated fleet's requests use the prefill pool: auto (per request, as the
    /// policy predicts better), always, never; several values make a sweep.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    pub(crate) disaggregation: Vec<kvroute_core::policy::DisaggregationMode>,
    /// The prefill-to-decode link's bandwidth in GB/s [default: `router.disaggregation`'s,
    /// 25].
    #[arg(long)]
    pub(crate) link_gb_per_sec: Option<f64>,
    /// The link's fixed latency per transfer, ms [default: `router.disaggregation`'s, 2].
    #[arg(long)]
    pub(crate) link_latency_ms: Option<f64>,
    /// Bytes of KV per token moved over the link [default: the profile's model's, when it
    /// names one; else 131072, an 8B model's].
    #[arg(long)]
    pub(crate) kv_bytes_per_token: Option<f64>,
    /// Routing policies to compare.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "round_robin,kv,predictive,goodput"
    )]
    pub(crate) policy: Vec<PolicyKind>,
    /// Engine profile (see `kvroute profiles`) [default: mocker-poly; a live `kvroute bench`:
    /// the demo's fleet, `demo`].
    #[arg(long)]
    pub(crate) profile: Option<String>,
    /// KV block size in tokens (default: the profile's; same KV memory).
    #[arg(long)]
    pub(crate) block_size: Option<usize>,
    /// Most sequences per engine step, the batch limit (default: the profile's).
    #[arg(long, visible_alias = "max-num-seqs")]
    pub(crate) max_batch: Option<usize>,
    /// Most tokens per engine step (default: the profile's).
    #[arg(long, visible_alias = "max-num-batched-tokens")]
    pub(crate) max_batched_tokens: Option<usize>,
    /// Device KV blocks per engine (default: what the profile's memory gives).
    #[arg(long)]
    pub(crate) num_gpu_blocks: Option<usize>,
    /// Blocks of a host (CPU) tier per engine, offloaded to and loaded back from (0: none);
    /// the router tracks it from the engines' events.
    #[arg(long, default_value_t = 0)]
    pub(crate) host_blocks: usize,
    /// Seconds the engines take to load one token's KV back from their host tier (default:
    /// 5e-6, an 8B model's 128 KiB per token over a 25 GB/s link).
    #[arg(long)]
    pub(crate) host_load_secs_per_token: Option<f64>,
    /// The router's cost of a token loaded from a host tier, as a fraction of computing it
    /// (default: `router.tiers.host_load_ratio`'s).
    #[arg(long)]
    pub(crate) host_load_ratio: Option<f64>,
    /// Clients (conversations) in flight, for closed loops; several values make a sweep.
    #[arg(long, value_delimiter = ',', default_value = "16")]
    pub(crate) concurrency: Vec<usize>,
    /// Open loop instead of `--concurrency`: synthetic requests (or, live, new conversations)
    /// per second, Poisson arrivals, one cell per rate; needs `--duration-secs` or `--limit`.
    #[arg(long, value_delimiter = ',')]
    pub(crate) rate: Vec<f64>,
    /// Trace replay speed-up (2 = twice as fast).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) speedup: f64,
    /// Trace: replay the first K requests; closed loop: send K requests (default 10 per client).
    #[arg(long)]
    pub(crate) limit: Option<usize>,
    /// Trace: drop requests with longer prompts.
    #[arg(long)]
    pub(crate) max_input_tokens: Option<usize>,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// When every worker is busy: queue, shed or none.
    #[arg(long, default_value = "queue")]
    pub(crate) admission: AdmissionMode,
    /// A request predicted to miss its TTFT objective on every worker: `admit` it, or
    /// `reject` it at once (`predicted_miss`; the default class's `on_predicted_miss`; a
    /// tenants spec sets its classes' own).
    #[arg(long, default_value = "admit")]
    pub(crate) on_predicted_miss: kvroute_core::flow::MissAction,
    /// Closed loops: stop starting requests after this many simulated seconds.
    #[arg(long)]
    pub(crate) duration_secs: Option<f64>,
    /// Closed loops: start the clients evenly over this many seconds (default 0; `bench`:
    /// the reference method's, a seventh of the run up to 60 s).
    #[arg(long)]
    pub(crate) ramp_secs: Option<f64>,
    /// Leave requests arriving in the first seconds out of the summary (default 0; `bench`:
    /// the reference method's, two sevenths of the run up to 120 s).
    #[arg(long)]
    pub(crate) warmup_secs: Option<f64>,
    /// Service objective for goodput: largest TTFT, ms (the `goodput` policy's by default).
    #[arg(long)]
    pub(crate) slo_ttft_ms: Option<f64>,
    /// Service objective for goodput: largest TPOT, ms (the `goodput` policy's by default).
    #[arg(long)]
    pub(crate) slo_tpot_ms: Option<f64>,
    /// Delay of KV events from engine to router, ms.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) kv_event_delay_ms: f64,
    /// Spread a trace's requests that share a timestamp evenly over this many seconds of
    /// trace time after it (the Mooncake traces' timestamps come in 3 s steps); 0: all at
    /// the timestamp.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) spread_bursts_secs: f64,
    /// Router replicas (gateways) in front of the fleet, conversations spread round-robin
    /// over them.
    #[arg(long, default_value_t = 1)]
    pub(crate) replicas: usize,
    /// How late a replica's bookings reach the others, ms, or `none` (each counts only its
    /// own).
    #[arg(long, default_value = "0")]
    pub(crate) replica_sync_ms: String,
    /// With several replicas: how long a replica holds the later requests of a burst so
    /// that they are routed with its peers' bookings seen (`router.peer_hold_secs`), ms;
    /// default: `--replica-sync-ms` (0 with `none`); 0: off.
    #[arg(long)]
    pub(crate) peer_hold_ms: Option<f64>,
    /// With the hold on: only a request finding less than this share of its prompt cached
    /// on any worker is held (`router.peer_hold_max_cached`; 1: any request).
    #[arg(long, default_value_t = kvroute_core::router::DEFAULT_PEER_HOLD_MAX_CACHED)]
    pub(crate) peer_hold_max_cached: f64,
    /// Engines publish no KV events: the router tracks their caches approximately (what it
    /// routed to each, for `--approx-ttl-secs`).
    #[arg(long)]
    pub(crate) no_events: bool,
    /// How long approximate tracking assumes a routed prompt stays cached, in seconds.
    #[arg(long)]
    pub(crate) approx_ttl_secs: Option<f64>,
    /// One JSON object per cell on stdout instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write per-request records (TSV) and a Markdown report into this directory.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
}

impl SimulateArgs {
    /// The engine profile: the one given, else the simulator's default.
    pub(crate) fn profile(&self) -> &str {
        self.profile.as_deref().unwrap_or(DEFAULT_PROFILE)
    }

    /// Seconds over which closed-loop clients start.
    pub(crate) fn ramp(&self) -> f64 {
        self.ramp_secs.unwrap_or(0.0)
    }

    /// Seconds of arrivals left out of the summary.
    pub(crate) fn warmup(&self) -> f64 {
        self.warmup_secs.unwrap_or(0.0)
    }

    /// The objectives: those given, each other one the `goodput` policy's default, so every
    /// report measures goodput against the objectives the default policy routes for.
    pub(crate) fn slo(&self) -> Slo {
        let d = GoodputConfig::default();
        Slo {
            ttft_ms: Some(self.slo_ttft_ms.unwrap_or(d.ttft_secs * 1e3)),
            tpot_ms: Some(self.slo_tpot_ms.unwrap_or(d.tpot_secs * 1e3)),
        }
    }

    /// The objectives as the `goodput` policy takes them ([`Self::slo`] in seconds).
    pub(crate) fn objectives(&self) -> GoodputConfig {
        let slo = self.slo();
        GoodputConfig {
            ttft_secs: slo.ttft_ms.unwrap_or_default() / 1e3,
            tpot_secs: slo.tpot_ms.unwrap_or_default() / 1e3,
        }
    }

    /// These options with the reference method's run length filled in where not given: a
    /// closed or open loop runs 420 s (unless `--limit` ends it). Before [`prepare`].
    pub(crate) fn with_reference_run(&self) -> SimulateArgs {
        let mut a = self.clone();
        if !a.workload.starts_with("mooncake:") && a.duration_secs.is_none() && a.limit.is_none() {
            a.duration_secs = Some(REFERENCE_RUN_SECS);
        }
        a
    }

    /// These options with the reference method's ramp and warm-up filled in where not
    /// given: a loop's clients start over the first seventh of the run (60 s of 420) and its
    /// measurement starts after two sevenths (120 s); a trace is measured from two sevenths
    /// of its span, at most 120 s. Runs ended by `--limit` alone keep 0.
    pub(crate) fn with_reference_window(&self, load: &Load) -> SimulateArgs {
        let mut a = self.clone();
        let span = match load {
            Load::Trace(t) => t.last().map(|r| r.arrival.0.as_secs_f64()),
            _ => a.duration_secs,
        };
        if let Some(d) = span {
            if !matches!(load, Load::Trace(_)) {
                a.ramp_secs.get_or_insert((d / 7.0).min(60.0));
            }
            a.warmup_secs.get_or_insert((2.0 * d / 7.0).min(120.0));
        }
        a
    }
}

/// Length of a run of the reference method (60 s ramp, 120 s warm-up, measured to 420 s).
pub(crate) const REFERENCE_RUN_SECS: f64 = 420.0;

pub(crate) enum Load {
    Trace(Vec<TraceRequest>),
    MultiTurn,
    Synthetic,
    /// Several tenants at once (`tenants.rs`).
    Tenants(Box<tenants::Spec>),
}

/// What a sweep needs once: the profile, the load, the starters.
pub(crate) struct Prepared {
    pub(crate) profile: Profile,
    pub(crate) load: Load,
    pub(crate) starters: Option<Vec<Vec<u32>>>,
}

/// Checks the options and reads the trace or starters.
pub(crate) fn prepare(a: &SimulateArgs) -> Result<Prepared> {
    if !(a.speedup.is_finite() && a.speedup > 0.0) {
        bail!("--speedup must be > 0, got {}", a.speedup);
    }
    replica_sync(a)?;
    if !(a.spread_bursts_secs.is_finite() && (0.0..=3600.0).contains(&a.spread_bursts_secs)) {
        bail!("--spread-bursts-secs must be within 0..=3600");
    }
    if !(a.kv_event_delay_ms.is_finite() && a.kv_event_delay_ms >= 0.0) {
        bail!("--kv-event-delay-ms must be >= 0");
    }
    for (name, v) in [
        ("--warmup-secs", a.warmup_secs),
        ("--ramp-secs", a.ramp_secs),
        ("--duration-secs", a.duration_secs),
    ] {
        if let Some(v) = v {
            if !(v.is_finite() && v >= 0.0) {
                bail!("{name} must be >= 0, got {v}");
            }
        }
    }
    for (name, v) in [
        ("--slo-ttft-ms", a.slo_ttft_ms),
        ("--slo-tpot-ms", a.slo_tpot_ms),
    ] {
        if let Some(v) = v {
            if !(v.is_finite() && v > 0.0) {
                bail!("{name} must be > 0 (an objective the goodput policy routes for), got {v}");
            }
        }
    }
    if a.workers.contains(&0) || a.concurrency.contains(&0) {
        bail!("--workers and --concurrency values must be >= 1");
    }
    fleet::fleets(a)?;
    for (name, v, max) in [
        ("--link-gb-per-sec", a.link_gb_per_sec, 1e6),
        ("--link-latency-ms", a.link_latency_ms, 60_000.0),
        ("--kv-bytes-per-token", a.kv_bytes_per_token, 1e9),
    ] {
        if let Some(v) = v {
            let positive = name != "--link-latency-ms";
            if !(v.is_finite() && v <= max && (v > 0.0 || (!positive && v == 0.0))) {
                bail!(
                    "{name} must be within {}..={max}, got {v}",
                    if positive { "(0" } else { "0" }
                );
            }
        }
    }
    if let Some(r) = a
        .rate
        .iter()
        .find(|r| !(r.is_finite() && **r > 0.0 && **r <= 1e6))
    {
        bail!("--rate values must be within (0, 1000000], got {r}");
    }
    if a.workload.starts_with("mooncake:") && !a.rate.is_empty() {
        bail!("a trace keeps its own schedule: use --speedup, not --rate");
    }
    if !a.rate.is_empty() && a.duration_secs.is_none() && a.limit.is_none() {
        bail!("an open loop (--rate) needs --duration-secs or --limit to end");
    }
    let profile = Profile::builtin(a.profile())?;
    let load = match a.workload.split_once(':') {
        Some(("mooncake", path)) => {
            let opts = TraceOptions {
                speedup: a.speedup,
                max_input_tokens: a.max_input_tokens,
                first: a.limit,
                ..TraceOptions::default()
            };
            let file =
                std::fs::File::open(path).with_context(|| format!("opening trace {path}"))?;
            let mut trace = mooncake::parse_reader(std::io::BufReader::new(file), &opts)
                .with_context(|| format!("reading trace {path}"))?;
            if a.spread_bursts_secs > 0.0 {
                mooncake::spread_bursts(
                    &mut trace,
                    Duration::from_secs_f64(a.spread_bursts_secs / a.speedup),
                );
            }
            Load::Trace(trace)
        }
        None if a.workload == "multiturn" => Load::MultiTurn,
        None if a.workload == "synthetic" => Load::Synthetic,
        Some(("tenants", _)) | None if a.workload == "tenants" || a.workload.starts_with("tenants:") => {
            Load::Tenants(Box::new(tenants::Spec::load(&a.workload)?))
        }
        _ => bail!(
            "unknown --workload {:?} (expected mooncake:<file>, multiturn, synthetic, tenants or tenants:<file>)",
            a.workload
        ),
    };
    let starters = match &a.starters {
        Some(dir) => Some(read_starters(dir)?),
        None => None,
    };
    Ok(Prepared {
        profile,
        load,
        starters,
    })
}

/// The loads of a sweep: each `--rate`, else each `--concurrency`, or the trace's schedule.
pub(crate) fn levels(a: &SimulateArgs, p: &Prepared) -> Vec<Level> {
    match p.load {
        Load::Trace(_) | Load::Tenants(_) => vec![Level::Speedup(a.speedup)],
        _ if !a.rate.is_empty() => a.rate.iter().map(|r| Level::Rate(*r)).collect(),
        _ => a
            .concurrency
            .iter()
            .map(|c| Level::Concurrency(*c))
            .collect(),
    }
}

/// A cell's name part for its load: `c16`, `r2.5`, or nothing for a trace.
pub(crate) fn level_label(level: Level) -> String {
    match level {
        Level::Concurrency(c) => format!("c{c}"),
        Level::Rate(r) => format!("r{r}"),
        Level::Speedup(_) => String::new(),
    }
}

/// The workload of one cell at `level`, `seed` for every random choice.
pub(crate) fn workload(
    a: &SimulateArgs,
    p: &Prepared,
    level: Level,
    seed: u64,
) -> Result<Workload> {
    let clients = match level {
        Level::Concurrency(c) => c,
        _ => 1,
    };
    Ok(match (&p.load, level) {
        (Load::Trace(t), _) => Workload::Trace(t.clone()),
        (Load::Tenants(_), _) => bail!("a tenants load runs its own cells (simulate/tenants.rs)"),
        (Load::MultiTurn, Level::Rate(_)) => bail!(
            "the simulator runs multi-turn chat as a closed loop (--concurrency); an open loop of conversations runs live (kvroute bench without --sim, kvroute loadgen --rate)"
        ),
        (Load::MultiTurn, _) => Workload::MultiTurn {
            gen: match &p.starters {
                Some(s) => MultiTurn::with_starters(MultiTurnConfig::default(), s.clone(), seed)?,
                None => MultiTurn::new(MultiTurnConfig::default(), seed)?,
            },
            concurrency: clients,
            requests: closed_loop_requests(a, clients),
        },
        (Load::Synthetic, Level::Rate(rate)) => {
            open_loop(a, SyntheticConfig::default(), rate, seed)?
        }
        (Load::Synthetic, _) => Workload::Synthetic {
            gen: Synthetic::new(SyntheticConfig::default(), seed)?,
            concurrency: clients,
            requests: closed_loop_requests(a, clients),
        },
    })
}

/// Synthetic requests of `shape` at `rate` per second (Poisson arrivals from `seed`) until
/// `--duration-secs` or `--limit`, as a trace the simulator replays.
pub(crate) fn open_loop(
    a: &SimulateArgs,
    shape: SyntheticConfig,
    rate: f64,
    seed: u64,
) -> Result<Workload> {
    let end = a
        .duration_secs
        .map_or(Duration::MAX, Duration::from_secs_f64);
    let requests = Synthetic::new(shape, seed)?
        .open_loop(rate)?
        .take_while(|(t, _)| t.0 < end)
        .take(a.limit.unwrap_or(usize::MAX))
        .map(|(arrival, r)| TraceRequest {
            arrival,
            prompt: r.prompt,
            max_tokens: r.max_tokens,
        })
        .collect();
    Ok(Workload::Trace(requests))
}

/// Runs the sweep.
pub fn run(a: &SimulateArgs) -> Result<()> {
    let prepared = prepare(a)?;
    let levels = levels(a, &prepared);
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut rows: Vec<(String, Summary)> = Vec::new();
    let mut planned: Vec<(Fleet, String, String)> = Vec::new();
    let mut over_time = String::new();
    let mut by_tenant = String::new();
    for fleet in fleet::fleets(a)? {
        let workers = fleet.workers;
        for &level in &levels {
            for &policy in &a.policy {
                let started = Instant::now();
                let (r, tenants) = match &prepared.load {
                    Load::Tenants(spec) => {
                        let (r, json, rows) = tenants::run_cell(a, &prepared, spec, fleet, policy)?;
                        (r, Some((json, rows)))
                    }
                    _ => {
                        let cfg = sim_config(a, &prepared.profile, fleet, policy, a.seed)?;
                        (
                            simulate(&cfg, workload(a, &prepared, level, a.seed)?)?,
                            None,
                        )
                    }
                };
                let wall = started.elapsed().as_secs_f64();
                let label = format!(
                    "{} {} {}",
                    policy.as_str(),
                    fleet.label(' '),
                    level_label(level)
                )
                .trim_end()
                .to_string();
                let load = match level {
                    Level::Speedup(x) => format!("{x}x"),
                    l => level_label(l),
                };
                planned.push((fleet, policy.as_str().to_string(), load));
                if let Some((_, rows)) = &tenants {
                    by_tenant.push_str(&format!("\n### {label}\n\n{rows}"));
                }
                if a.json {
                    let mut cell = cell_json(policy, fleet, level, &r, wall);
                    if let Some((t, _)) = tenants {
                        cell["tenants"] = t;
                        cell["classes"] = tenants::classes_json(&r);
                    }
                    println!("{cell}");
                } else {
                    eprintln!(
                        "{label}: {} requests in {:.0} simulated s, {wall:.2} s wall",
                        r.summary.sent, r.sim_seconds
                    );
                }
                if let Some(dir) = &a.out {
                    let file = dir.join(format!("{}.tsv", label.replace(' ', "-")));
                    std::fs::write(&file, records_tsv(&r.records, &numbered_workers(workers)))
                        .with_context(|| format!("writing {}", file.display()))?;
                    over_time.push_str(&format!(
                        "\n### {label}\n\n{}",
                        deciles_markdown(&deciles(&r.records))
                    ));
                }
                rows.push((label, r.summary));
            }
        }
    }
    let table: Vec<(&str, &Summary)> = rows.iter().map(|(l, s)| (l.as_str(), s)).collect();
    let mut table = markdown_table(&table);
    if a.plan_pd.is_some() {
        let cells: Vec<_> = planned
            .into_iter()
            .zip(&rows)
            .map(|((f, p, l), (_, s))| (f, p, l, s.goodput.as_ref().and_then(|g| g.per_s)))
            .collect();
        table.push_str(&fleet::plan_table(&cells));
    }
    if !by_tenant.is_empty() {
        table.push_str(&format!("\n## By tenant\n{by_tenant}"));
    }
    if !a.json {
        print!("{table}");
    }
    if let Some(dir) = &a.out {
        let report = format!(
            "# kvroute simulate\n\nworkload `{}`, profile `{}`, admission `{:?}`, seed {}, KV event delay {} ms{}\n\n{table}\n## Over time (requests by arrival decile)\n{over_time}",
            a.workload, a.profile(), a.admission, a.seed, a.kv_event_delay_ms, tiers_label(a)
        );
        let file = dir.join("report.md");
        std::fs::write(&file, report).with_context(|| format!("writing {}", file.display()))?;
    }
    Ok(())
}

/// `--replica-sync-ms`: a delay, or None for `none`.
fn replica_sync(a: &SimulateArgs) -> Result<Option<Duration>> {
    if a.replica_sync_ms.trim() == "none" {
        return Ok(None);
    }
    match a.replica_sync_ms.trim().parse::<f64>() {
        Ok(ms) if ms.is_finite() && (0.0..=60_000.0).contains(&ms) => {
            Ok(Some(Duration::from_secs_f64(ms / 1e3)))
        }
        _ => bail!(
            "--replica-sync-ms must be a delay in ms (0 to 60000) or none, got {:?}",
            a.replica_sync_ms
        ),
    }
}

/// The options that shape the simulated fleet only, with whether each is set (a live
/// bench starts `kvroute demo`'s fleet and cannot honour them).
pub(crate) fn simulator_only_options(a: &SimulateArgs) -> Vec<&'static str> {
    [
        ("--block-size", a.block_size.is_some()),
        ("--max-batch", a.max_batch.is_some()),
        ("--max-batched-tokens", a.max_batched_tokens.is_some()),
        ("--num-gpu-blocks", a.num_gpu_blocks.is_some()),
        ("--host-blocks", a.host_blocks > 0),
        (
            "--host-load-secs-per-token",
            a.host_load_secs_per_token.is_some(),
        ),
        ("--host-load-ratio", a.host_load_ratio.is_some()),
        ("--kv-event-delay-ms", a.kv_event_delay_ms != 0.0),
        ("--replicas", a.replicas != 1),
        ("--peer-hold-ms", a.peer_hold_ms.is_some()),
        (
            "--peer-hold-max-cached",
            a.peer_hold_max_cached != kvroute_core::router::DEFAULT_PEER_HOLD_MAX_CACHED,
        ),
        ("--no-events", a.no_events),
        ("--approx-ttl-secs", a.approx_ttl_secs.is_some()),
        ("--link-gb-per-sec", a.link_gb_per_sec.is_some()),
        ("--link-latency-ms", a.link_latency_ms.is_some()),
        ("--kv-bytes-per-token", a.kv_bytes_per_token.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect()
}

/// The report header's words on the engines' KV memory, when set.
pub(crate) fn tiers_label(a: &SimulateArgs) -> String {
    let mut s = String::new();
    if let Some(n) = a.num_gpu_blocks {
        s += &format!(", {n} device blocks per engine");
    }
    if a.host_blocks > 0 {
        s += &format!(
            ", a host tier of {} blocks ({} s per token loaded)",
            a.host_blocks,
            a.host_load_secs_per_token
                .unwrap_or(kvroute_engine::HOST_LOAD_SECS_PER_TOKEN)
        );
    }
    if let Some(r) = a.host_load_ratio {
        s += &format!(", host load ratio {r}");
    }
    s
}

/// Most starter files read, and the largest one.
const MAX_STARTERS: usize = 10_000;
const MAX_STARTER_BYTES: u64 = 4 << 20;

/// Conversation starters: every regular file of `dir`, in name order, tokenized.
fn read_starters(dir: &std::path::Path) -> Result<Vec<Vec<u32>>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading starters directory {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no starter files in {}", dir.display());
    }
    if files.len() > MAX_STARTERS {
        bail!(
            "{} holds {} files; at most {MAX_STARTERS} starters",
            dir.display(),
            files.len()
        );
    }
    files
        .iter()
        .map(|f| {
            let size = std::fs::metadata(f)?.len();
            if size > MAX_STARTER_BYTES {
                bail!(
                    "starter {} is {size} bytes; at most {MAX_STARTER_BYTES}",
                    f.display()
                );
            }
            let text = std::fs::read_to_string(f).with_context(|| {
                format!("reading starter {} (UTF-8 text expected)", f.display())
            })?;
            Ok(text_tokens(&text))
        })
        .collect()
}

/// Requests a closed loop sends: `--limit`, else unbounded under `--duration-secs`, else 10
/// per client.
fn closed_loop_requests(a: &SimulateArgs, clients: usize) -> usize {
    match (a.limit, a.duration_secs) {
        (Some(l), _) => l,
        (None, Some(_)) => usize::MAX,
        (None, None) => 10 * clients,
    }
}

/// The simulator's engine profile when none is given (a live bench runs the demo's instead).
pub(crate) const DEFAULT_PROFILE: &str = "mocker-poly";

/// The simulator's configuration of one cell.
pub(crate) fn sim_config(
    a: &SimulateArgs,
    p: &Profile,
    fleet: Fleet,
    policy: PolicyKind,
    seed: u64,
) -> Result<SimConfig> {
    let bs = a.block_size.unwrap_or(p.block_size);
    let mut engine = EngineConfig::from_profile_with_block_size(p, bs);
    if let Some(m) = a.max_batch {
        engine.max_num_seqs = m;
    }
    if let Some(m) = a.max_batched_tokens {
        engine.max_num_batched_tokens = m;
    }
    if let Some(n) = a.num_gpu_blocks {
        engine.num_gpu_blocks = n;
    }
    engine.host_blocks = a.host_blocks;
    if let Some(t) = a.host_load_secs_per_token {
        engine.host_load_secs_per_token = t;
    }
    let mut cfg = SimConfig::for_profile(a.profile(), fleet.workers)?;
    cfg.engine = engine;
    cfg.prefill_workers = fleet.prefill;
    cfg.decode_workers = fleet.decode;
    let link = &mut cfg.router.disaggregation;
    link.mode = fleet.mode;
    if let Some(b) = fleet::kv_bytes_per_token(a, p) {
        link.kv_bytes_per_token = b;
    }
    if let Some(g) = a.link_gb_per_sec {
        link.link_bytes_per_sec = g * 1e9;
    }
    if let Some(ms) = a.link_latency_ms {
        link.link_latency_secs = ms / 1e3;
    }
    cfg.router.block_size = bs;
    cfg.router.seed = seed;
    cfg.router.policy.kind = policy;
    cfg.router.admission.mode = a.admission;
    if a.on_predicted_miss != kvroute_core::flow::MissAction::Admit {
        cfg.router.admission.flow.classes = vec![kvroute_core::flow::ClassConfig {
            on_predicted_miss: a.on_predicted_miss,
            ..Default::default()
        }];
    }
    if let Some(r) = a.host_load_ratio {
        cfg.router.tiers.host_load_ratio = r;
    }
    cfg.kv_event_delay = Duration::from_secs_f64(a.kv_event_delay_ms / 1e3);
    cfg.replicas = a.replicas;
    cfg.replica_sync = replica_sync(a)?;
    cfg.router.peer_hold_secs = match a.peer_hold_ms {
        Some(ms) => ms / 1e3,
        None => cfg.replica_sync.map_or(0.0, |d| d.as_secs_f64()),
    };
    cfg.router.peer_hold_max_cached = a.peer_hold_max_cached;
    if a.no_events {
        cfg.tracking = kvroute_core::Tracking::Approximate;
    }
    if let Some(ttl) = a.approx_ttl_secs {
        cfg.router.approx.ttl_secs = ttl;
    }
    cfg.duration = a.duration_secs.map(Duration::from_secs_f64);
    cfg.warmup = Duration::from_secs_f64(a.warmup());
    cfg.ramp = Duration::from_secs_f64(a.ramp());
    // The objectives measured are the ones `goodput` routes for.
    cfg.router.policy.goodput = a.objectives();
    cfg.slo = Some(a.slo());
    cfg.validate()?;
    Ok(cfg)
}

fn cell_json(
    policy: PolicyKind,
    fleet: Fleet,
    level: Level,
    r: &SimResult,
    wall: f64,
) -> serde_json::Value {
    let s = &r.summary;
    json!({
        "policy": policy.as_str(),
        "workers": fleet.workers,
        "prefill_workers": fleet.prefill,
        "decode_workers": fleet.decode,
        "disaggregation": fleet.is_split().then_some(fleet.mode.as_str()),
        "split_requests": r.records.iter().filter(|r| r.prefill_worker.is_some()).count(),
        "concurrency": match level { Level::Concurrency(c) => Some(c), _ => None },
        "rate": match level { Level::Rate(r) => Some(r), _ => None },
        "sent": s.sent,
        "completed": s.completed,
        "failed": s.failed,
        "rejected": s.rejected,
        "rejected_by_reason": s.rejected_by_reason,
        "failed_by_reason": s.failed_by_reason,
        "ttft_ms": {"p50": s.ttft_ms.p50, "p95": s.ttft_ms.p95, "p99": s.ttft_ms.p99, "mean": s.ttft_ms.mean},
        "ttft_all_ms": s.ttft_all_ms,
        "tpot_ms": {"p50": s.tpot_ms.p50, "p95": s.tpot_ms.p95},
        "itl_ms": {"p50": s.itl_ms.p50, "p95": s.itl_ms.p95},
        "e2e_ms": {"p50": s.e2e_ms.p50, "p95": s.e2e_ms.p95},
        "hit_rate": s.hit_rate,
        "prediction_ratio": s.prediction_ratio,
        "output_tokens_per_s": s.output_tokens_per_s,
        "requests_per_s": s.requests_per_s,
        "goodput": s.goodput,
        "sim_seconds": r.sim_seconds,
        "wall_seconds": wall,
        "kv_events_rejected": r.kv_events_rejected,
        "preemptions": r.engines.iter().map(|e| e.preemptions_total).sum::<u64>(),
        "engine_steps": r.engines.iter().map(|e| e.steps_total).sum::<u64>(),
        "host_blocks_held": r.engines.iter().map(|e| e.host_blocks).sum::<usize>(),
        "engines": r.engines,
    })
}

mod fleet;
pub(crate) mod tenants;
#[cfg(test)]
mod tests;
