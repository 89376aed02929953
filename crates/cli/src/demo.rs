//! `kvroute demo`: everything in one process: a live A/B of two identical fleets, each a
//! gateway and N simulated workers on loopback ports, their KV events wired to the gateway by
//! in-process channels (with replay from each worker's buffer): one fleet behind the chosen
//! policy (the gateway on `--port`), one behind the baseline policy (round-robin, on the next
//! port), both driven by the dashboard's load generator with the same conversations.
//!
//! The demo's fleet is decided here, once: [`DEMO_PROFILE`] x [`DEMO_WORKERS`], sized so that
//! across the dashboard's slider (60-180 conversations, its default) both arms meet the
//! objectives (600 / 60 ms, the `goodput` policy's defaults) at the low end and round-robin
//! leaves them first (docs/dashboard.md has the measurements). A live `kvroute bench` without
//! `--profile` runs this fleet.

use anyhow::{Context, Result};
use clap::Args;
use kvroute_core::policy::GoodputConfig;
use kvroute_core::{AdmissionMode, PolicyKind, WorkerRole};
use kvroute_gateway::config::PoolConfig;
use kvroute_gateway::{EventFeed, GatewayConfig, Replay, WorkerSpec};
use kvroute_preprocess::Preprocessor;
use kvroute_protocol::kv_events::EventBatch;
use kvroute_worker::{ReplaySource, WorkerConfig};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The engine profile of the demo's workers.
pub const DEMO_PROFILE: &str = "demo";
/// Workers in each of the demo's fleets.
pub const DEMO_WORKERS: usize = 3;
/// The most models (`--pools`) a demo gateway serves.
pub const MAX_DEMO_POOLS: usize = 4;

/// Options of `kvroute demo`.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Address of the gateway.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port of the gateway.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Simulated workers (of each fleet).
    #[arg(long, default_value_t = DEMO_WORKERS)]
    pub workers: usize,
    /// A disaggregated fleet: this many prefill-only workers (`prefill-1`, ...), with
    /// `--decode-workers`; `--workers` is then their sum. The workers speak vLLM's two-leg
    /// protocol, the KV moved over a modelled link (docs/disaggregation.md).
    #[arg(long, conflicts_with = "workers", requires = "decode_workers")]
    pub prefill_workers: Option<usize>,
    /// A disaggregated fleet: this many decode-only workers (`decode-1`, ...), with
    /// `--prefill-workers`.
    #[arg(long, conflicts_with = "workers", requires = "prefill_workers")]
    pub decode_workers: Option<usize>,
    /// How a disaggregated fleet's requests use the prefill workers: auto (per request, as
    /// the policy predicts better), always, never [default: the config file's, else auto].
    #[arg(long)]
    pub disaggregation: Option<kvroute_core::policy::DisaggregationMode>,
    /// Port of the first worker (the others follow: P+1, ...), for a Prometheus scrape
    /// config; 0 picks free ports.
    #[arg(long, default_value_t = 0)]
    pub worker_port: u16,
    /// Engine profile of the workers (`kvroute profiles` lists them).
    #[arg(long, default_value = DEMO_PROFILE)]
    pub profile: String,
    /// Virtual seconds per real second of the workers.
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Routing policy.
    #[arg(long, default_value = "goodput")]
    pub policy: PolicyKind,
    /// Tokenizer directory or `builtin` (shared by the gateway and the workers).
    #[arg(long, default_value = "builtin")]
    pub tokenizer: String,
    /// The served model name.
    #[arg(long, default_value = "kvroute-sim")]
    pub model: String,
    /// Models served by each gateway, one pool each on its own `--workers` workers: the
    /// first is `--model` with `--tokenizer`, the next `MODEL-2`, ... (every second one with
    /// the `builtin-small` tokenizer and twice the block size: pools that differ).
    #[arg(long, default_value_t = 1)]
    pub pools: usize,
    /// MiB of tokenized prompt pieces the tokenizer keeps.
    #[arg(long)]
    pub tokenizer_cache_mib: Option<usize>,
    /// Threads that tokenize prompts, for the gateway and the workers together (each may
    /// hold ~100 MiB of the tokenizer library's caches).
    #[arg(long)]
    pub tokenizer_threads: Option<usize>,
    /// MiB of KV event batches each worker keeps for replay.
    #[arg(long)]
    pub replay_buffer_mib: Option<usize>,
    /// Gateway replicas (ports P, P+1, ...), sharing their load over the NATS event plane
    /// (each reads the workers' events itself).
    #[arg(long, default_value_t = 1)]
    pub gateways: usize,
    /// The NATS server for --gateways above 1; without it the demo starts `nats-server`
    /// (JetStream on, a temporary store) when installed.
    #[arg(long)]
    pub nats: Option<String>,
    /// Admission of the gateways: `queue` (hold a request while every worker is busy),
    /// `shed` (refuse it at once: 503), `none` (dispatch anyway); default: the config
    /// file's, else `queue`.
    #[arg(long)]
    pub admission: Option<AdmissionMode>,
    /// A gateway config file (TOML, as `kvroute serve --config` reads) the demo's gateways
    /// start from: routing, admission, limits; the demo sets their workers, model,
    /// tokenizer, address and policy.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// The objectives the gateway's `goodput` policy routes for (`kvroute bench` passes its
    /// SLO; the demo keeps the defaults).
    #[arg(skip)]
    pub objectives: GoodputConfig,
    /// Set for the demo's second fleet: its name, which keeps its NATS stream, subjects and
    /// snapshot bucket apart from the first fleet's (both may share one `--nats`).
    #[arg(skip)]
    pub arm: Option<String>,
}

/// The policy of the demo's second fleet: a policy, or `none` for no second fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BaselineFleet {
    /// No second fleet: the dashboard compares with a baseline file, if given.
    None,
    /// A second, identical fleet behind this policy.
    Policy(PolicyKind),
}

impl std::str::FromStr for BaselineFleet {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            p => p
                .parse()
                .map(Self::Policy)
                .map_err(|e: String| format!("{e} (or `none` for no baseline fleet)")),
        }
    }
}

/// Options of `kvroute demo`: the fleets, and the dashboard in front of a load generator.
#[derive(Args, Debug)]
pub struct DemoCommand {
    #[command(flatten)]
    pub fleet: DemoArgs,
    /// The policy of the identical second fleet the dashboard compares with live (its
    /// gateway on the port after the first fleet's), or `none`.
    #[arg(long, default_value = "round_robin")]
    pub baseline_policy: BaselineFleet,
    /// Port of the dashboard (web UI and load generator API); 0 picks a free one.
    #[arg(long, default_value_t = 8080)]
    pub ui_port: u16,
    /// Start no dashboard and no load generator.
    #[arg(long)]
    pub no_ui: bool,
    /// Conversations the dashboard keeps with their transcripts.
    #[arg(long)]
    pub max_conversations: Option<usize>,
    #[command(flatten)]
    pub dashboard: crate::ui::DashboardArgs,
}

/// The simulated references of the demo's default fleet (round-robin and the default policy
/// on [`DEMO_WORKERS`] [`DEMO_PROFILE`] workers), written by `kvroute bench --sim` (see
/// `deploy/baselines/README.md`): the dashboard shows them, labelled simulated, at the levels
/// its live arms have not measured yet.
const DEMO_REFERENCES: [&str; 2] = [
    include_str!("../../../deploy/baselines/demo-round_robin-w3.json"),
    include_str!("../../../deploy/baselines/demo-goodput-w3.json"),
];

/// The demo's conversations: the reference's shape in tokens (the simulator's
/// `MultiTurnConfig`: starters of 3,500-4,000 tokens, questions of 20-60, 3-5 turns of 830
/// output tokens), in as many words as the fleet's tokenizer needs for those tokens (measured
/// on the generator's own text), so the live fleets carry the load the simulator predicts.
pub fn demo_chat(pre: &Preprocessor) -> Result<kvroute_workload::ChatConfig> {
    demo_chat_like(pre, &kvroute_workload::MultiTurnConfig::default())
}

/// The load generator's conversations sized in tokens as the simulator's `shape`, measured
/// with `pre`.
pub fn demo_chat_like(
    pre: &Preprocessor,
    shape: &kvroute_workload::MultiTurnConfig,
) -> Result<kvroute_workload::ChatConfig> {
    let base = kvroute_workload::ChatConfig::default();
    let (text, words) = base.sample(0).map_err(anyhow::Error::msg)?;
    let tokens = pre
        .encode(&text)
        .context("measuring the tokenizer's tokens per word")?;
    let ratio = tokens.len() as f64 / words.max(1) as f64;
    Ok(base.sized_like(shape, ratio))
}

/// The tokenizer `builtin`, `builtin-small` or in a directory.
pub fn preprocessor(spec: &str) -> Result<Preprocessor> {
    Preprocessor::from_spec(spec).with_context(|| format!("tokenizer {spec}"))
}

/// A worker's replay buffer seen through the gateway's replay interface.
struct BufferReplay(ReplaySource);

impl Replay for BufferReplay {
    fn replay_from(
        &self,
        from: u64,
    ) -> futures_util::future::BoxFuture<'_, Result<Vec<Arc<EventBatch>>, String>> {
        let got = self.0.replay_from(from);
        Box::pin(async move { Ok(got) })
    }
}

/// Runs the demo until Ctrl-C.
/// A gateway and its simulated workers, running in this process.
pub(crate) struct Fleet {
    pub(crate) gateway: kvroute_gateway::GatewayHandle,
    /// The other gateway replicas (`--gateways`).
    pub(crate) replicas: Vec<kvroute_gateway::GatewayHandle>,
    pub(crate) workers: Vec<kvroute_worker::WorkerHandle>,
    /// The `nats-server` the demo started, if it did.
    nats: Option<LocalNats>,
}

impl Fleet {
    /// Stops the gateways, then the workers, then the NATS server it started.
    pub(crate) async fn shutdown(self) {
        self.gateway.shutdown().await;
        for g in self.replicas {
            g.shutdown().await;
        }
        for w in self.workers {
            w.shutdown().await;
        }
        drop(self.nats);
    }
}

/// A `nats-server` child process with JetStream, its store in a temporary directory; ended
/// (by its PID) when dropped.
struct LocalNats {
    child: std::process::Child,
    url: String,
    _store: tempfile::TempDir,
}

impl LocalNats {
    /// Starts `nats-server` on a free loopback port; None when it is not installed.
    fn start() -> Result<Option<Self>> {
        let Some(binary) = ["nats-server", "/usr/sbin/nats-server"]
            .into_iter()
            .find(|b| {
                std::process::Command::new(b)
                    .arg("--version")
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
        else {
            return Ok(None);
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let store = tempfile::tempdir()?;
        let config = store.path().join("server.conf");
        let text = kvroute_plane::local_server_config(port, &store.path().join("store"));
        std::fs::write(&config, text).with_context(|| format!("writing {}", config.display()))?;
        let child = std::process::Command::new(binary)
            .arg("-c")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .with_context(|| format!("starting {binary}"))?;
        let mut nats = Self {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            _store: store,
        };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(Some(nats));
            }
            if let Ok(Some(status)) = nats.child.try_wait() {
                anyhow::bail!("{binary} exited at once ({status})");
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        let _ = nats.child.kill();
        anyhow::bail!("{binary} did not listen on 127.0.0.1:{port} within 5 s")
    }
}

impl Drop for LocalNats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `args.workers` simulated workers on loopback (`--worker-port` onwards, or
/// ephemeral ports) and the gateway on
/// `args.host:args.port` (0: an ephemeral port), wired by in-process channels.
pub(crate) async fn start_fleet(args: &DemoArgs) -> Result<Fleet> {
    anyhow::ensure!(
        (1..=8).contains(&args.gateways),
        "--gateways must be within 1..=8"
    );
    let mut nats = None;
    let plane_url = match (&args.nats, args.gateways) {
        (Some(url), _) => Some(url.clone()),
        (None, 1) => None,
        (None, _) => {
            let started = LocalNats::start()?.ok_or_else(|| {
                anyhow::anyhow!("--gateways {} shares load over NATS: install nats-server (apt-get install nats-server) or give --nats URL", args.gateways)
            })?;
            let url = started.url.clone();
            nats = Some(started);
            Some(url)
        }
    };
    let mut pre = preprocessor(&args.tokenizer)?;
    if let Some(mib) = args.tokenizer_cache_mib {
        pre = pre.with_cache_bytes(mib.saturating_mul(1 << 20));
    }
    if let Some(threads) = args.tokenizer_threads {
        anyhow::ensure!(
            (1..=kvroute_gateway::config::MAX_TOKENIZER_THREADS).contains(&threads),
            "--tokenizer-threads must be within 1..={}",
            kvroute_gateway::config::MAX_TOKENIZER_THREADS
        );
        pre = pre.with_pool(kvroute_preprocess::TokenizePool::new(
            threads,
            kvroute_preprocess::DEFAULT_TOKENIZE_QUEUE,
        )?);
    }
    anyhow::ensure!(
        (1..=MAX_DEMO_POOLS).contains(&args.pools),
        "--pools must be within 1..={MAX_DEMO_POOLS}"
    );
    anyhow::ensure!(
        args.pools == 1 || args.prefill_workers.is_none(),
        "--pools serves several models on workers that do both: not with --prefill-workers"
    );
    let mut workers = Vec::new();
    // Each pool's: model, tokenizer, preprocessor, block size, workers; each gateway's
    // feeds by pool.
    let mut pools = Vec::new();
    let mut feeds: Vec<Vec<BTreeMap<usize, EventFeed>>> = (0..args.gateways)
        .map(|_| (0..args.pools).map(|_| BTreeMap::new()).collect())
        .collect();
    let roles = roles(args)?;
    for p in 0..args.pools {
        // Every second pool differs: the byte tokenizer and twice the block size.
        let other = p % 2 == 1;
        let (model, tokenizer) = match p {
            0 => (args.model.clone(), args.tokenizer.clone()),
            _ => (
                format!("{}-{}", args.model, p + 1),
                if other {
                    "builtin-small".into()
                } else {
                    args.tokenizer.clone()
                },
            ),
        };
        let pool_pre = if tokenizer == args.tokenizer {
            pre.clone()
        } else {
            preprocessor(&tokenizer)?.with_pool(pre.pool()?.clone())
        };
        let mut specs = Vec::new();
        let mut block_size = 0;
        for (i, &role) in roles.iter().enumerate() {
            let n = p * roles.len() + i;
            let prefix = if p == 0 {
                String::new()
            } else {
                format!("m{}-", p + 1)
            };
            let worker_name = match role {
                WorkerRole::Both => format!("{prefix}worker-{}", i + 1),
                WorkerRole::Prefill => format!("prefill-{}", i + 1),
                WorkerRole::Decode => {
                    format!("decode-{}", i + 1 - args.prefill_workers.unwrap_or(0))
                }
            };
            let mut cfg = WorkerConfig {
                model: model.clone(),
                profile: args.profile.clone(),
                speedup: args.speedup,
                worker_name,
                role,
                ..WorkerConfig::default()
            };
            if let Some(mib) = args.replay_buffer_mib {
                cfg.replay_buffer_bytes = mib.saturating_mul(1 << 20);
            }
            if other {
                cfg.block_size = Some(cfg.engine_config()?.block_size * 2);
            }
            let engine = cfg.engine_config()?;
            block_size = engine.block_size;
            let port = match args.worker_port {
                0 => 0,
                port => u16::try_from(usize::from(port) + n).map_err(|_| {
                    anyhow::anyhow!(
                        "--worker-port {port} leaves no room for {} workers",
                        args.workers * args.pools
                    )
                })?,
            };
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .with_context(|| format!("listening on 127.0.0.1:{port} for worker {}", n + 1))?;
            let w = kvroute_worker::spawn(cfg, pool_pre.clone(), listener, None).await?;
            for f in &mut feeds {
                f[p].insert(
                    i,
                    EventFeed::from_broadcast(
                        w.subscribe(),
                        Some(Box::new(BufferReplay(w.replay_source()))),
                    ),
                );
            }
            specs.push(WorkerSpec {
                url: w.url(),
                name: Some(w.name().to_string()),
                kv_blocks: Some(engine.num_gpu_blocks as u64),
                max_batch: u32::try_from(engine.max_num_seqs).ok(),
                role,
                ..WorkerSpec::default()
            });
            workers.push(w);
        }
        pools.push((model, tokenizer, pool_pre, block_size, specs));
    }
    let mut config: GatewayConfig = crate::read_config(args.config.as_slice())?;
    config.host = args.host.clone();
    config.port = args.port;
    let (model, tokenizer, _, block_size, specs) = &pools[0];
    config.models = vec![model.clone()];
    config.tokenizer = Some(tokenizer.clone());
    config.workers.clone_from(specs);
    config.router.block_size = *block_size;
    if args.pools > 1 {
        config.pools = pools
            .iter()
            .map(|(model, tokenizer, _, block_size, specs)| PoolConfig {
                models: vec![model.clone()],
                tokenizer: Some(tokenizer.clone()),
                router: Some(toml::Table::from_iter([(
                    "block_size".to_string(),
                    toml::Value::Integer(i64::try_from(*block_size).unwrap_or(i64::MAX)),
                )])),
                workers: specs.clone(),
                ..PoolConfig::default()
            })
            .collect();
        config.models.clear();
        config.workers.clear();
    }
    config.router.policy.kind = args.policy;
    config.router.policy.goodput = args.objectives.clone();
    if let Some(mode) = args.admission {
        config.router.admission.mode = mode;
    }
    if let Some(mode) = args.disaggregation {
        config.router.disaggregation.mode = mode;
    }
    config.validate().with_context(|| match &args.config {
        Some(path) => format!("the demo's gateway config (from {})", path.display()),
        None => "the demo's gateway config".into(),
    })?;
    if let Some(url) = &plane_url {
        let mut plane = kvroute_gateway::config::PlaneConfig {
            url: url.clone(),
            ..Default::default()
        };
        if let Some(arm) = &args.arm {
            plane.stream = format!("{}_{arm}", plane.stream);
            plane.prefix = format!("{}_{arm}", plane.prefix);
            plane.snapshot_bucket = format!("{}_{arm}", plane.snapshot_bucket);
        }
        config.plane = Some(plane);
    }
    let mut gateways = Vec::with_capacity(args.gateways);
    for (g, feeds) in feeds.into_iter().enumerate() {
        let port = match config.port {
            0 => 0,
            p => u16::try_from(usize::from(p) + g).map_err(|_| {
                anyhow::anyhow!("--port {p} leaves no room for {} gateways", args.gateways)
            })?,
        };
        let addr = format!("{}:{}", config.host, port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("listening on {addr} (another demo running? try --port)"))?;
        let starts = pools
            .iter()
            .zip(feeds)
            .map(|((_, _, pre, _, _), feeds)| kvroute_gateway::PoolStart {
                preprocessor: pre.clone(),
                feeds,
            })
            .collect();
        gateways.push(kvroute_gateway::spawn_pools(config.clone(), starts, listener).await?);
    }
    let gateway = gateways.remove(0);
    Ok(Fleet {
        gateway,
        replicas: gateways,
        workers,
        nats,
    })
}

/// `cmd` (`kvroute demo`) with the defaults of its flags whose values are left to the parts
/// they configure shown in `--help`, read from where each is written.
pub(crate) fn annotate_help(cmd: clap::Command) -> clap::Command {
    let mib = |bytes: usize| (bytes >> 20).to_string();
    let shown = [
        (
            "tokenizer_cache_mib",
            mib(kvroute_preprocess::PIECE_CACHE_BYTES),
        ),
        (
            "tokenizer_threads",
            kvroute_preprocess::DEFAULT_TOKENIZE_THREADS.to_string(),
        ),
        (
            "replay_buffer_mib",
            mib(WorkerConfig::default().replay_buffer_bytes),
        ),
        (
            "max_conversations",
            kvroute_loadgen::ObserverConfig::default()
                .max_conversations
                .to_string(),
        ),
    ];
    crate::help_defaults::annotate_values(cmd, &shown)
}

/// Each worker's role: `--prefill-workers` prefill-only ones then `--decode-workers`
/// decode-only ones, or `--workers` that do both.
fn roles(args: &DemoArgs) -> Result<Vec<WorkerRole>> {
    let roles = match (args.prefill_workers, args.decode_workers) {
        (Some(p), Some(d)) => {
            anyhow::ensure!(
                p >= 1 && d >= 1,
                "--prefill-workers and --decode-workers must each be at least 1"
            );
            let mut r = vec![WorkerRole::Prefill; p];
            r.resize(p + d, WorkerRole::Decode);
            r
        }
        (None, None) => vec![WorkerRole::Both; args.workers],
        _ => anyhow::bail!("--prefill-workers and --decode-workers go together"),
    };
    anyhow::ensure!(
        (1..=64).contains(&roles.len()),
        "--workers (or --prefill-workers plus --decode-workers) must be within 1..=64"
    );
    Ok(roles)
}

/// The second fleet's settings: the same as the first but for the policy and the ports
/// (the gateways after the first fleet's, the workers after its workers').
fn baseline_args(args: &DemoArgs, policy: PolicyKind) -> Result<DemoArgs> {
    let shift = |p: u16, by: usize, what: &str| -> Result<u16> {
        match p {
            0 => Ok(0),
            p => u16::try_from(usize::from(p) + by)
                .map_err(|_| anyhow::anyhow!("{what} {p} leaves no room for the baseline fleet")),
        }
    };
    Ok(DemoArgs {
        policy,
        arm: Some(policy.as_str().into()),
        port: shift(args.port, args.gateways, "--port")?,
        worker_port: shift(args.worker_port, args.workers * args.pools, "--worker-port")?,
        ..args.clone()
    })
}

/// Runs the demo until Ctrl-C.
pub fn run(cmd: &DemoCommand) -> Result<()> {
    let mut args = cmd.fleet.clone();
    if let (Some(p), Some(d)) = (args.prefill_workers, args.decode_workers) {
        args.workers = p + d;
    }
    // The gateways route for the objectives the dashboard judges by.
    args.objectives.ttft_secs = cmd.dashboard.slo_ttft_p95_ms / 1e3;
    args.objectives.tpot_secs = cmd.dashboard.slo_tpot_p95_ms / 1e3;
    let baseline = match cmd.baseline_policy {
        BaselineFleet::Policy(p) if p == args.policy => anyhow::bail!(
            "--baseline-policy {} is the demo's --policy too: compare two different policies, or give `none`",
            p.as_str()
        ),
        BaselineFleet::Policy(p) => Some(baseline_args(&args, p)?),
        BaselineFleet::None => None,
    };
    // The shipped references were simulated on the default fleet only.
    let default_fleet = args.workers == DEMO_WORKERS
        && args.prefill_workers.is_none()
        && args.profile == DEMO_PROFILE
        && args.speedup == 1.0
        && args.config.is_none()
        && args.admission.is_none();
    let references: &[&str] = if default_fleet { &DEMO_REFERENCES } else { &[] };
    let dashboard = cmd.dashboard.config(references)?;
    crate::runtime()?.block_on(async move {
        let fleet = start_fleet(&args).await?;
        let base_fleet = match &baseline {
            Some(b) => Some(start_fleet(b).await?),
            None => None,
        };
        let url = fleet.gateway.url();
        // The first arm's lines as a single-fleet demo printed them (scripts read them).
        let arms_line = |f: &Fleet, a: &DemoArgs, what: &str| {
            println!(
                "kvroute demo: {what}gateway {} (policy {}), {} simulated workers ({}, {}x real time)",
                f.gateway.url(),
                a.policy.as_str(),
                f.workers.len(),
                a.profile,
                a.speedup
            );
            for w in &f.workers {
                println!("  {} at {}", w.name(), w.url());
            }
            for g in &f.replicas {
                println!("  gateway replica {} (load shared over NATS)", g.url());
            }
        };
        arms_line(&fleet, &args, "");
        if let (Some(f), Some(b)) = (&base_fleet, &baseline) {
            arms_line(f, b, "baseline ");
            println!("  the two fleets are identical but for their policy and get the same conversations");
        }
        if let Some(p) = &fleet.gateway.state().config().plane {
            println!("  event plane: {}", p.url);
        }
        println!("  metrics: {url}/metrics   workers: {url}/debug/workers");
        if !cmd.no_ui {
            let mut arms = vec![kvroute_loadgen::ArmConfig {
                name: args.policy.as_str().into(),
                target: url.clone(),
                baseline: false,
            }];
            if let (Some(f), Some(b)) = (&base_fleet, &baseline) {
                arms.push(kvroute_loadgen::ArmConfig {
                    name: b.policy.as_str().into(),
                    target: f.gateway.url(),
                    baseline: true,
                });
            }
            let mut load = kvroute_loadgen::LoadgenConfig {
                target: url.clone(),
                model: args.model.clone(),
                concurrency: dashboard.slider_min,
                conversations: u64::MAX,
                // A cold fleet would otherwise see every first turn at once.
                ramp_secs: 10.0,
                chat: demo_chat(&preprocessor(&args.tokenizer)?)?,
                ..kvroute_loadgen::LoadgenConfig::default()
            };
            if let Some(n) = cmd.max_conversations {
                load.observer.max_conversations = n;
            }
            let service = kvroute_loadgen::Service::new(kvroute_loadgen::ServiceConfig {
                load,
                arms,
                dashboard,
                measure_after_secs: cmd.dashboard.measure_after_secs,
                ..kvroute_loadgen::ServiceConfig::default()
            })?;
            let listener = crate::ui::bind(&cmd.dashboard.ui_host, cmd.ui_port).await?;
            let ui = format!("http://{}/", listener.local_addr()?);
            let app = crate::ui::router(service, listener.local_addr()?, Some(args.workers));
            tokio::spawn(crate::ui::serve_app(listener, app, std::future::pending()));
            let note = if crate::ui::built() { "" } else { "(UI not built: see the page) " };
            println!("  dashboard {ui} {note}(press Start to run the multi-turn chat load on both fleets)");
        }
        println!("try:\n  curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\":\"{}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}],\"max_tokens\":32}}'", args.model);
        println!("Ctrl-C stops.");
        // SIGTERM too (a service manager's stop): the gateways, workers and the NATS server
        // the demo started are all ended.
        crate::stop_signal().await?;
        println!("stopping");
        fleet.shutdown().await;
        if let Some(f) = base_fleet {
            f.shutdown().await;
        }
        Ok(())
    })
}
