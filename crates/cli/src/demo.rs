//! `kvroute demo`: everything in one process: the gateway on `--port` and N simulated
//! workers on ephemeral loopback ports, their KV events wired to the gateway by in-process
//! channels (with replay from each worker's buffer).

use anyhow::{Context, Result};
use clap::Args;
use kvroute_core::policy::GoodputConfig;
use kvroute_core::PolicyKind;
use kvroute_gateway::{EventFeed, GatewayConfig, Replay, WorkerSpec};
use kvroute_preprocess::Preprocessor;
use kvroute_protocol::kv_events::EventBatch;
use kvroute_worker::{ReplaySource, WorkerConfig};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Options of `kvroute demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Address of the gateway.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port of the gateway.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Simulated workers.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Port of the first worker (the others follow: P+1, ...), for a Prometheus scrape
    /// config; 0 picks free ports.
    #[arg(long, default_value_t = 0)]
    pub worker_port: u16,
    /// Engine profile of the workers (`kvroute profiles` lists them).
    #[arg(long, default_value = "tiny-fast")]
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
    /// MiB of tokenized prompt pieces the tokenizer keeps (default 64).
    #[arg(long)]
    pub tokenizer_cache_mib: Option<usize>,
    /// Threads that tokenize prompts, for the gateway and the workers together (default 2;
    /// each may hold ~100 MiB of the tokenizer library's caches).
    #[arg(long)]
    pub tokenizer_threads: Option<usize>,
    /// MiB of KV event batches each worker keeps for replay (default 32).
    #[arg(long)]
    pub replay_buffer_mib: Option<usize>,
    /// The objectives the gateway's `goodput` policy routes for (`kvroute bench` passes its
    /// SLO; the demo keeps the defaults).
    #[arg(skip)]
    pub objectives: GoodputConfig,
}

/// Options of `kvroute demo`: the fleet, and the dashboard in front of a load generator.
#[derive(Args, Debug)]
pub struct DemoCommand {
    #[command(flatten)]
    pub fleet: DemoArgs,
    /// Port of the dashboard (web UI and load generator API); 0 picks a free one.
    #[arg(long, default_value_t = 8080)]
    pub ui_port: u16,
    /// Start no dashboard and no load generator.
    #[arg(long)]
    pub no_ui: bool,
    /// Conversations the dashboard keeps with their transcripts (default 500).
    #[arg(long)]
    pub max_conversations: Option<usize>,
    #[command(flatten)]
    pub dashboard: crate::ui::DashboardArgs,
}

/// The round-robin baseline of the demo's default fleet (3 `tiny-fast` workers), written by
/// `kvroute bench --sim` (see `deploy/baselines/README.md`).
const DEMO_BASELINE: &str = include_str!("../../../deploy/baselines/demo-round_robin-w3.json");

/// The tokenizer `builtin` or in a directory.
pub fn preprocessor(spec: &str) -> Result<Preprocessor> {
    Ok(match spec {
        "builtin" => Preprocessor::builtin(),
        dir => Preprocessor::from_dir(std::path::Path::new(dir))
            .with_context(|| format!("tokenizer {dir}"))?,
    })
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
    pub(crate) workers: Vec<kvroute_worker::WorkerHandle>,
}

impl Fleet {
    /// Stops the gateway, then the workers.
    pub(crate) async fn shutdown(self) {
        self.gateway.shutdown().await;
        for w in self.workers {
            w.shutdown().await;
        }
    }
}

/// Starts `args.workers` simulated workers on loopback (`--worker-port` onwards, or
/// ephemeral ports) and the gateway on
/// `args.host:args.port` (0: an ephemeral port), wired by in-process channels.
pub(crate) async fn start_fleet(args: &DemoArgs) -> Result<Fleet> {
    anyhow::ensure!(
        (1..=64).contains(&args.workers),
        "--workers must be within 1..=64"
    );
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
    let mut workers = Vec::new();
    let mut specs = Vec::new();
    let mut feeds = BTreeMap::new();
    let mut block_size = 0;
    for i in 0..args.workers {
        let mut cfg = WorkerConfig {
            model: args.model.clone(),
            profile: args.profile.clone(),
            speedup: args.speedup,
            worker_name: format!("worker-{}", i + 1),
            ..WorkerConfig::default()
        };
        if let Some(mib) = args.replay_buffer_mib {
            cfg.replay_buffer_bytes = mib.saturating_mul(1 << 20);
        }
        let engine = cfg.engine_config()?;
        block_size = engine.block_size;
        let port = match args.worker_port {
            0 => 0,
            p => u16::try_from(usize::from(p) + i).map_err(|_| {
                anyhow::anyhow!(
                    "--worker-port {p} leaves no room for {} workers",
                    args.workers
                )
            })?,
        };
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .with_context(|| format!("listening on 127.0.0.1:{port} for worker {}", i + 1))?;
        let w = kvroute_worker::spawn(cfg, pre.clone(), listener, None).await?;
        feeds.insert(
            i,
            EventFeed::from_broadcast(
                w.subscribe(),
                Some(Box::new(BufferReplay(w.replay_source()))),
            ),
        );
        specs.push(WorkerSpec {
            url: w.url(),
            name: Some(w.name().to_string()),
            kv_blocks: Some(engine.num_gpu_blocks as u64),
            max_batch: u32::try_from(engine.max_num_seqs).ok(),
            ..WorkerSpec::default()
        });
        workers.push(w);
    }
    let mut config = GatewayConfig {
        host: args.host.clone(),
        port: args.port,
        models: vec![args.model.clone()],
        tokenizer: Some(args.tokenizer.clone()),
        workers: specs,
        ..GatewayConfig::default()
    };
    config.router.block_size = block_size;
    config.router.policy.kind = args.policy;
    config.router.policy.goodput = args.objectives.clone();
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("listening on {addr} (another demo running? try --port)"))?;
    let gateway = kvroute_gateway::spawn(config, pre, listener, feeds).await?;
    Ok(Fleet { gateway, workers })
}

/// Runs the demo until Ctrl-C.
pub fn run(cmd: &DemoCommand) -> Result<()> {
    let args = &cmd.fleet;
    // The shipped baseline was measured on the default fleet only.
    let default_fleet = args.workers == 3 && args.profile == "tiny-fast" && args.speedup == 1.0;
    let dashboard = cmd
        .dashboard
        .config(default_fleet.then_some(DEMO_BASELINE))?;
    crate::runtime()?.block_on(async move {
        let fleet = start_fleet(args).await?;
        let (gateway, workers) = (&fleet.gateway, &fleet.workers);
        let url = gateway.url();
        println!("kvroute demo: gateway {url} (policy {}), {} simulated workers ({}, {}x real time)", args.policy.as_str(), workers.len(), args.profile, args.speedup);
        for w in workers {
            println!("  {} at {}", w.name(), w.url());
        }
        println!("  metrics: {url}/metrics   workers: {url}/debug/workers");
        if !cmd.no_ui {
            let mut load = kvroute_loadgen::LoadgenConfig {
                target: url.clone(),
                model: args.model.clone(),
                concurrency: dashboard.slider_min,
                conversations: u64::MAX,
                // A cold fleet would otherwise see every first turn at once.
                ramp_secs: 10.0,
                ..kvroute_loadgen::LoadgenConfig::default()
            };
            if let Some(n) = cmd.max_conversations {
                load.observer.max_conversations = n;
            }
            let service = kvroute_loadgen::Service::new(kvroute_loadgen::ServiceConfig {
                load,
                dashboard,
                ..kvroute_loadgen::ServiceConfig::default()
            })?;
            let listener = crate::ui::bind(&cmd.dashboard.ui_host, cmd.ui_port).await?;
            let ui = format!("http://{}/", listener.local_addr()?);
            let app = crate::ui::router(service, listener.local_addr()?);
            tokio::spawn(crate::ui::serve_app(listener, app, std::future::pending()));
            let note = if crate::ui::built() { "" } else { "(UI not built: see the page) " };
            println!("  dashboard {ui} {note}(press Start to run the multi-turn chat load)");
        }
        println!("try:\n  curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\":\"{}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}],\"max_tokens\":32}}'", args.model);
        println!("Ctrl-C stops.");
        tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
        println!("stopping");
        fleet.shutdown().await;
        Ok(())
    })
}
