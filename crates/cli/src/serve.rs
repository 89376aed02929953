//! `kvroute serve`: the gateway in front of engine replicas, from a TOML file and flags.

use anyhow::{Context, Result};
use clap::Args;
use kvroute_core::{AdmissionMode, PolicyKind};
use kvroute_gateway::{GatewayConfig, WorkerSpec};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Options of `kvroute serve` (each overrides the config file).
#[derive(Args, Debug, Default)]
pub struct ServeArgs {
    /// TOML config file (the `GatewayConfig` tree; see docs/gateway.md). Repeat to layer
    /// several: a later file overrides an earlier one table by table (arrays whole), then
    /// `KVROUTE__<KEY>__<PATH>` environment variables override keys (docs/operations.md).
    #[arg(long = "config")]
    pub config: Vec<PathBuf>,
    /// Address to listen on.
    #[arg(long)]
    pub host: Option<String>,
    /// Port to listen on.
    #[arg(long)]
    pub port: Option<u16>,
    /// An engine: `URL[=EVENTS[=REPLAY]][,dp=N]`, e.g.
    /// `http://10.0.0.5:8000=tcp://10.0.0.5:5557=tcp://10.0.0.5:5558`; EVENTS may be
    /// `bind:tcp://...`, `poll` for TensorRT-LLM's pull API, or `nats` for the event plane
    /// (a `kvroute relay` publishes them; needs --nats); `,dp=N`: N data-parallel ranks,
    /// routed to apart; `,role=prefill|decode|both`: its role in a disaggregated fleet
    /// (docs/disaggregation.md). Repeat per engine.
    #[arg(long = "worker")]
    pub workers: Vec<String>,
    /// Disaggregated prefill, with prefill workers: auto (per request, whichever way the
    /// policy predicts better), always, never (`router.disaggregation.mode`).
    #[arg(long)]
    pub disaggregation: Option<kvroute_core::policy::DisaggregationMode>,
    /// Routing policy: round_robin, random, least_loaded, power_of_two, kv, predictive, goodput.
    #[arg(long)]
    pub policy: Option<PolicyKind>,
    /// Tokenizer directory (tokenizer.json + tokenizer_config.json) or `builtin`. Without
    /// one the gateway routes in approximate mode.
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// KV block size in tokens (must equal the engines').
    #[arg(long)]
    pub block_size: Option<usize>,
    /// A model name served (repeat for several); default: what the workers list.
    #[arg(long = "model")]
    pub models: Vec<String>,
    /// A LoRA adapter name (repeat for several): requests naming it as `model` match only
    /// the adapter's cached blocks. Adapters the workers list are added.
    #[arg(long = "lora-adapter")]
    pub lora_adapters: Vec<String>,
    /// The batch limit of workers that give none of their own `max_batch`: requests an
    /// engine runs at once (vLLM `--max-num-seqs`, SGLang `--max-running-requests`). With it
    /// admission also judges a worker busy when its batch is full.
    #[arg(long, visible_alias = "max-num-seqs", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_batch: Option<u32>,
    /// What happens when every worker is busy: queue, shed or none.
    #[arg(long)]
    pub admission: Option<AdmissionMode>,
    /// Longest wait in the admission queue, in seconds.
    #[arg(long)]
    pub max_queue_wait_secs: Option<f64>,
    /// Most requests in the admission queue.
    #[arg(long)]
    pub max_queued_requests: Option<usize>,
    /// A worker is busy at this many outstanding prefill tokens.
    #[arg(long)]
    pub busy_prefill_tokens: Option<u64>,
    /// A worker is busy at this fraction of its KV blocks in use by in-flight requests.
    #[arg(long)]
    pub busy_active_fraction: Option<f64>,
    /// Seed of the router's random choices.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Serve over TLS with this PEM certificate chain (with --tls-key).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Print the effective config (the files, the environment and these flags, every
    /// default filled in; keys never) as TOML and exit without serving: a dry run.
    #[arg(long)]
    pub print_config: bool,
    /// The NATS event plane (e.g. `nats://127.0.0.1:4222`) for workers whose events are
    /// `nats` (the `[plane]` table's other settings keep their values or defaults).
    #[arg(long)]
    pub nats: Option<String>,
}

impl ServeArgs {
    /// The config file (if any) with the flags applied, checked.
    pub fn config(&self) -> Result<GatewayConfig> {
        let c = self.unchecked_config()?;
        c.validate()?;
        Ok(c)
    }

    /// The config file (if any) with the flags applied, for a caller that applies more
    /// before checking it.
    pub fn unchecked_config(&self) -> Result<GatewayConfig> {
        let mut c: GatewayConfig = crate::read_config(&self.config)?;
        if let Some(h) = &self.host {
            c.host = h.clone();
        }
        if let Some(p) = self.port {
            c.port = p;
        }
        if !self.workers.is_empty() {
            c.workers = self
                .workers
                .iter()
                .map(|w| WorkerSpec::parse(w).with_context(|| format!("--worker {w}")))
                .collect::<Result<_>>()?;
        }
        if let Some(p) = self.policy {
            c.router.policy.kind = p;
        }
        if let Some(m) = self.disaggregation {
            c.router.disaggregation.mode = m;
        }
        if self.tokenizer.is_some() {
            c.tokenizer = self.tokenizer.clone();
        }
        if let Some(b) = self.block_size {
            c.router.block_size = b;
        }
        if !self.models.is_empty() {
            c.models = self.models.clone();
        }
        if !self.lora_adapters.is_empty() {
            c.lora_adapters = self.lora_adapters.clone();
        }
        if self.max_batch.is_some() {
            c.max_batch = self.max_batch;
        }
        let adm = &mut c.router.admission;
        if let Some(m) = self.admission {
            adm.mode = m;
        }
        if let Some(w) = self.max_queue_wait_secs {
            adm.max_queue_wait_secs = w;
        }
        if let Some(n) = self.max_queued_requests {
            adm.max_queued_requests = n;
        }
        if let Some(t) = self.busy_prefill_tokens {
            adm.busy_prefill_tokens = Some(t);
        }
        if let Some(f) = self.busy_active_fraction {
            adm.busy_active_fraction = Some(f);
        }
        if let Some(s) = self.seed {
            c.router.seed = s;
        }
        if self.tls_cert.is_some() {
            c.tls.cert_file = self.tls_cert.clone();
            c.tls.key_file = self.tls_key.clone();
        }
        if let Some(url) = &self.nats {
            c.plane.get_or_insert_with(Default::default).url = url.clone();
        }
        keys_from_env(&mut c, |name| std::env::var(name).ok());
        Ok(c)
    }
}

/// Keys from the environment (never from flags: a command line is visible to every user of
/// the host): `KVROUTE_API_KEYS` (comma-separated, added to the file's), `KVROUTE_ADMIN_KEY`,
/// `KVROUTE_UPSTREAM_API_KEY`.
pub fn keys_from_env(c: &mut GatewayConfig, var: impl Fn(&str) -> Option<String>) {
    use kvroute_gateway::config::Secret;
    if let Some(keys) = var("KVROUTE_API_KEYS") {
        let keys = keys.split(',').map(str::trim).filter(|k| !k.is_empty());
        c.auth.api_keys.extend(keys.map(|k| Secret(k.to_string())));
    }
    if let Some(k) = var("KVROUTE_ADMIN_KEY").filter(|k| !k.is_empty()) {
        c.auth.admin_key = Some(Secret(k));
    }
    if let Some(k) = var("KVROUTE_UPSTREAM_API_KEY").filter(|k| !k.is_empty()) {
        c.upstream.api_key = Some(Secret(k));
    }
}

/// Prints `config` as TOML (its keys are never serialized).
pub fn print_config(config: &GatewayConfig) -> Result<()> {
    let config = config.with_pools_written_out()?;
    print!(
        "{}",
        toml::to_string(&config).context("writing the config as TOML")?
    );
    Ok(())
}

/// Runs the gateway until Ctrl-C or SIGTERM.
pub fn run(args: &ServeArgs) -> Result<()> {
    let config = args.config()?;
    if args.print_config {
        return print_config(&config);
    }
    // Each pool's tokenizer (one pool without `[[pools]]`).
    let starts = config
        .pools()?
        .iter()
        .map(|p| {
            Ok(kvroute_gateway::PoolStart {
                preprocessor: kvroute_gateway::load_preprocessor(&p.config)?,
                feeds: BTreeMap::new(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    crate::runtime()?.block_on(async move {
        let addr = format!("{}:{}", config.host, config.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("listening on {addr}"))?;
        let handle = kvroute_gateway::spawn_pools(config, starts, listener).await?;
        let reload = Reloader::new(&args.config);
        println!("kvroute gateway on {}", handle.url());
        tokio::select! {
            r = crate::stop_signal() => r?,
            () = reload.run(&handle, || args.config()) => {}
        }
        println!("stopping");
        handle.shutdown().await;
        Ok(())
    })
}

/// How often the config files are looked at for a change.
const CONFIG_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// Each config file's modification time and length (None: not readable now).
fn stamps(paths: &[PathBuf]) -> Vec<Option<(std::time::SystemTime, u64)>> {
    paths
        .iter()
        .map(|p| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.modified().ok()?, m.len()))
        })
        .collect()
}

/// What a running server reloads its config on: SIGHUP and a change of its config files.
/// Made before the server says it serves (a SIGHUP before it would end the process; a
/// change from then on is seen).
pub(crate) struct Reloader {
    files: Vec<PathBuf>,
    hup: Option<tokio::signal::unix::Signal>,
    seen: Vec<Option<(std::time::SystemTime, u64)>>,
}

impl Reloader {
    /// Listens for SIGHUP and notes `files` as they are now.
    pub(crate) fn new(files: &[PathBuf]) -> Self {
        let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|e| tracing::warn!(error = %e, "no reload on SIGHUP: cannot listen for it"))
            .ok();
        Self {
            files: files.to_vec(),
            hup,
            seen: stamps(files),
        }
    }

    /// Reloads `handle`'s config from `config` (the files, the environment and the flags,
    /// as at the start) on SIGHUP and when a file changes, until the server stops; never
    /// returns.
    pub(crate) async fn run(
        mut self,
        handle: &kvroute_gateway::GatewayHandle,
        config: impl Fn() -> Result<GatewayConfig>,
    ) {
        let mut tick = tokio::time::interval(CONFIG_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let why = tokio::select! {
                Some(()) = async {
                    match &mut self.hup {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                } => "SIGHUP",
                _ = tick.tick() => {
                    let now = stamps(&self.files);
                    if now == self.seen {
                        continue;
                    }
                    self.seen = now;
                    "a config file changed"
                }
            };
            reload_once(handle, config(), why);
        }
    }
}

/// One reload of `handle` from `config` (read for `why`), said on stdout.
fn reload_once(handle: &kvroute_gateway::GatewayHandle, config: Result<GatewayConfig>, why: &str) {
    let outcome = match config {
        // (A config that does not hold together is counted by `reload`.)
        Ok(config) => handle.reload(config).map_err(|e| e.to_string()),
        Err(e) => {
            let e = format!("{e:#}");
            handle.reload_refused(&e);
            Err(e)
        }
    };
    match outcome {
        Ok(r) => println!(
            "kvroute config reloaded ({why}): applied {:?}; after a restart: {:?}",
            r.applied, r.restart
        ),
        Err(e) => println!(
            "kvroute config reload refused ({why}): {}",
            e.replace('\n', "; ")
        ),
    }
}
