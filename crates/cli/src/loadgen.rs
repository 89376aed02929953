//! `kvroute loadgen`: multi-turn chat, synthetic shared-prefix or Mooncake trace load against
//! any OpenAI-compatible endpoint, with the same summary table and records as the simulator;
//! with `--ui-port`, a long-lived load steered from the dashboard or its control API.

use anyhow::{Context, Result};
use clap::Args;
use kvroute_loadgen::{LoadKind, LoadgenConfig, ServiceConfig, UserModelConfig};
use kvroute_workload::{markdown_table, records_tsv, Summary, SyntheticConfig};
use std::path::PathBuf;

/// Options of `kvroute loadgen`.
#[derive(Args, Debug)]
pub struct LoadgenArgs {
    /// Base URL of the endpoint (a kvroute gateway, vLLM, any OpenAI-compatible server).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub target: String,
    /// The `model` of the requests.
    #[arg(long, default_value = "kvroute-sim")]
    pub model: String,
    /// `multiturn` (chat conversations), `synthetic` (shared-prefix token-id requests on
    /// `/v1/completions`) or `mooncake:<file>` (the trace replayed on its own schedule, open
    /// loop, token-id prompts on `/v1/completions`).
    #[arg(long, default_value = "multiturn")]
    pub workload: String,
    /// Trace replay speed (2 = twice as fast).
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Replay only the first K requests of the trace.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Tokens per trace hash id (512 in the Mooncake release and AIPerf's default).
    #[arg(long, default_value_t = kvroute_workload::mooncake::MOONCAKE_BLOCK_TOKENS)]
    pub trace_block_tokens: usize,
    /// Closed loop: conversations (or synthetic requests) in flight at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Open loop instead: new conversations (or synthetic requests) per second, Poisson
    /// arrivals.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Open loop: most conversations (or requests) in flight; later arrivals wait, counted
    /// in their TTFT.
    #[arg(long, default_value_t = 4096)]
    pub max_in_flight: usize,
    /// Conversations (or synthetic requests) to run in all (with `--ui-port`: no limit
    /// unless given).
    #[arg(long)]
    pub conversations: Option<u64>,
    /// Stop starting turns after this many seconds (0: no limit).
    #[arg(long, default_value_t = 0.0)]
    pub duration_secs: f64,
    /// Closed loop: start the conversations evenly over this many seconds.
    #[arg(long, default_value_t = 0.0)]
    pub ramp_secs: f64,
    /// Output tokens per turn (multi-turn) or request (synthetic).
    #[arg(long, default_value_t = 830)]
    pub max_tokens: u32,
    /// Synthetic: distinct shared prefixes.
    #[arg(long, default_value_t = 16)]
    pub prefixes: usize,
    /// Synthetic: tokens per prefix.
    #[arg(long, default_value_t = 2048)]
    pub prefix_tokens: usize,
    /// Synthetic: unique tokens after the prefix.
    #[arg(long, default_value_t = 256)]
    pub suffix_tokens: usize,
    /// Synthetic: Zipf exponent of prefix popularity (0 = uniform).
    #[arg(long, default_value_t = 1.0)]
    pub zipf_s: f64,
    /// An OpenAI-compatible endpoint whose model writes the follow-up questions (base URL);
    /// without it the built-in generator does.
    #[arg(long, requires = "user_model")]
    pub user_model_url: Option<String>,
    /// The user model's name.
    #[arg(long, requires = "user_model_url")]
    pub user_model: Option<String>,
    /// The user model's bearer key.
    #[arg(long, requires = "user_model_url")]
    pub user_model_key: Option<String>,
    /// Do not send `ignore_eos` (for servers that refuse unknown fields).
    #[arg(long)]
    pub no_ignore_eos: bool,
    /// Seed of the conversations and arrivals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The API key sent with every request (a gateway's, or a tenant's: docs/flow-control.md)
    /// [default: $KVROUTE_LOADGEN_API_KEY].
    #[arg(long)]
    pub api_key: Option<String>,
    /// A header sent with every request, `NAME: VALUE` (repeat for several), e.g.
    /// `x-kvroute-class: batch`.
    #[arg(long = "header", value_name = "NAME: VALUE")]
    pub headers: Vec<String>,
    /// Serve the dashboard (web UI) and the control API (start, stop, concurrency,
    /// WebSocket stats, conversations, `/metrics`) on this port and run until Ctrl-C.
    #[arg(long)]
    pub ui_port: Option<u16>,
    /// With `--ui-port`: wait for Start (`POST /api/start`) instead of starting at once.
    #[arg(long, requires = "ui_port")]
    pub idle: bool,
    #[command(flatten)]
    pub dashboard: crate::ui::DashboardArgs,
    /// Several tenants at once from this TOML file (`[[tenants]]`, each a `name` and its own
    /// `api_key`, `headers` and load settings over these options'; docs/loadgen.md): a row
    /// per tenant in the report.
    #[arg(long, conflicts_with = "ui_port")]
    pub tenants: Option<PathBuf>,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Write per-turn records (TSV) and the summary (Markdown) into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

impl LoadgenArgs {
    /// The load these options describe (multi-turn or synthetic).
    pub fn config(&self) -> Result<LoadgenConfig> {
        let workload = match self.workload.as_str() {
            "multiturn" => LoadKind::Multiturn,
            "synthetic" => LoadKind::Synthetic,
            w => anyhow::bail!(
                "unknown workload {w:?} (expected multiturn, synthetic or mooncake:<file>)"
            ),
        };
        let mut config = LoadgenConfig {
            target: self.target.clone(),
            model: self.model.clone(),
            workload,
            concurrency: self.concurrency,
            rate: self.rate,
            max_in_flight: self.max_in_flight,
            duration_secs: self.duration_secs,
            ramp_secs: self.ramp_secs,
            ignore_eos: !self.no_ignore_eos,
            seed: self.seed,
            synthetic: SyntheticConfig {
                prefixes: self.prefixes,
                prefix_tokens: self.prefix_tokens,
                suffix_tokens: self.suffix_tokens,
                zipf_s: self.zipf_s,
                max_tokens: self.max_tokens,
            },
            user_model: self.user_model_url.as_ref().map(|url| UserModelConfig {
                url: url.clone(),
                model: self.user_model.clone().unwrap_or_default(),
                key: self.user_model_key.clone(),
                ..UserModelConfig::default()
            }),
            ..LoadgenConfig::default()
        };
        config.conversations =
            self.conversations
                .unwrap_or(if self.ui_port.is_some() { u64::MAX } else { 40 });
        config.chat.max_tokens = self.max_tokens;
        config.api_key = self
            .api_key
            .clone()
            .or_else(|| std::env::var("KVROUTE_LOADGEN_API_KEY").ok())
            .filter(|k| !k.is_empty());
        for h in &self.headers {
            let Some((name, value)) = h.split_once(':') else {
                anyhow::bail!("--header {h:?}: expected NAME: VALUE");
            };
            config
                .headers
                .insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
        }
        config.validate()?;
        Ok(config)
    }
}

/// Runs the load and prints the summary.
pub fn run(args: &LoadgenArgs) -> Result<()> {
    if let Some(port) = args.ui_port {
        anyhow::ensure!(
            !args.workload.starts_with("mooncake:"),
            "--ui-port drives multiturn or synthetic loads, not trace replay"
        );
        return serve(args, port);
    }
    if let Some(file) = &args.tenants {
        anyhow::ensure!(
            !args.workload.starts_with("mooncake:"),
            "--tenants drives multiturn or synthetic loads, not trace replay"
        );
        return run_tenants(args, file);
    }
    let result = if let Some(path) = args.workload.strip_prefix("mooncake:") {
        let options = kvroute_workload::TraceOptions {
            speedup: args.speedup,
            first: args.limit,
            block_tokens: args.trace_block_tokens,
            ..Default::default()
        };
        let file = std::fs::File::open(path).with_context(|| format!("opening {path}"))?;
        let requests =
            kvroute_workload::mooncake::parse_reader(std::io::BufReader::new(file), &options)
                .with_context(|| format!("reading {path}"))?;
        let config = kvroute_loadgen::ReplayConfig {
            target: args.target.clone(),
            model: args.model.clone(),
            ignore_eos: !args.no_ignore_eos,
            max_in_flight: args.max_in_flight,
            ..Default::default()
        };
        crate::runtime()?.block_on(kvroute_loadgen::replay(config, requests))?
    } else {
        let config = args.config()?;
        crate::runtime()?.block_on(kvroute_loadgen::run(config))?
    };
    let summary = Summary::from_records(&result.records, result.duration);
    let label = match (&args.rate, args.workload.starts_with("mooncake:")) {
        (_, true) => format!("trace x{}", args.speedup),
        (Some(rate), false) => format!("{rate}/s"),
        (None, false) => format!("c{}", args.concurrency),
    };
    let table = markdown_table(&[(label.as_str(), &summary)]);
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print!("{table}");
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(
            dir.join("records.tsv"),
            records_tsv(&result.records, &result.workers),
        )?;
        std::fs::write(
            dir.join("report.md"),
            format!("# kvroute loadgen\n\n{table}"),
        )?;
    }
    if summary.completed == 0 {
        anyhow::bail!("{}", nothing_succeeded(&args.target, &summary));
    }
    Ok(())
}

/// `--tenants`: every tenant's run at once, a row each.
fn run_tenants(args: &LoadgenArgs, file: &std::path::Path) -> Result<()> {
    let tenants = tenants::read(file, &args.config()?)?;
    let (names, configs): (Vec<String>, Vec<_>) = tenants.into_iter().unzip();
    let results = crate::runtime()?.block_on(kvroute_loadgen::run_tenants(configs))?;
    let summaries: Vec<Summary> = results
        .iter()
        .map(|r| Summary::from_records(&r.records, r.duration))
        .collect();
    let rows: Vec<(&str, &Summary)> = names.iter().map(String::as_str).zip(&summaries).collect();
    let table = markdown_table(&rows);
    if args.json {
        let by: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .map(|(n, s)| Ok(((*n).to_string(), serde_json::to_value(s)?)))
            .collect::<Result<_>>()?;
        println!("{}", serde_json::Value::Object(by));
    } else {
        print!("{table}");
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, r) in names.iter().zip(&results) {
            let file = dir.join(format!("records-{}.tsv", sanitize(name)));
            std::fs::write(&file, records_tsv(&r.records, &r.workers))
                .with_context(|| format!("writing {}", file.display()))?;
        }
        std::fs::write(
            dir.join("report.md"),
            format!("# kvroute loadgen, by tenant\n\n{table}"),
        )?;
    }
    if summaries.iter().all(|s| s.completed == 0) {
        let all = Summary::from_records(
            &results
                .iter()
                .flat_map(|r| r.records.clone())
                .collect::<Vec<_>>(),
            results.iter().map(|r| r.duration).max().unwrap_or_default(),
        );
        anyhow::bail!("{}", nothing_succeeded(&args.target, &all));
    }
    Ok(())
}

/// A tenant's name as a file name's part: letters, digits, `-`, `_` kept, the rest `_`.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Why a run in which no request succeeded failed: the counts, each reason, and what the
/// commonest reason usually means.
fn nothing_succeeded(target: &str, s: &Summary) -> String {
    if s.sent == 0 {
        return format!("no request was sent to {target}");
    }
    let reasons = |by: &std::collections::BTreeMap<String, u64>| {
        by.iter()
            .map(|(why, n)| format!("{n} {why}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut counts = Vec::new();
    if s.failed > 0 {
        counts.push(format!(
            "{} failed ({})",
            s.failed,
            reasons(&s.failed_by_reason)
        ));
    }
    if s.rejected > 0 {
        counts.push(format!(
            "{} rejected ({})",
            s.rejected,
            reasons(&s.rejected_by_reason)
        ));
    }
    let commonest = s
        .failed_by_reason
        .iter()
        .chain(&s.rejected_by_reason)
        .max_by_key(|(_, n)| **n)
        .map(|(why, _)| why.as_str());
    let hint = match commonest {
        Some("connect") => {
            format!(": nothing answers at {target} (is the server up, the host and port right?)")
        }
        Some("timeout") => format!(": {target} did not answer in time"),
        Some("http_404") => format!(
            ": {target} answered 404 (give the server's base URL, without /v1, and a --model it serves)"
        ),
        Some("http_401" | "http_403") => {
            format!(": {target} refused the requests (does it need an API key?)")
        }
        Some("http_400" | "http_422") => format!(
            ": {target} refused the requests as invalid (is --model one it serves? --no-ignore-eos for servers that refuse unknown fields)"
        ),
        _ => String::new(),
    };
    format!(
        "no request succeeded: {} sent to {target}, {}{hint}",
        s.sent,
        counts.join(", ")
    )
}

/// Serves the dashboard and the control API until Ctrl-C.
fn serve(args: &LoadgenArgs, port: u16) -> Result<()> {
    let load = args.config()?;
    let dashboard = args.dashboard.config(&[])?;
    crate::runtime()?.block_on(async move {
        let service = kvroute_loadgen::Service::new(ServiceConfig {
            load,
            dashboard,
            measure_after_secs: args.dashboard.measure_after_secs,
            ..ServiceConfig::default()
        })?;
        let listener = crate::ui::bind(&args.dashboard.ui_host, port).await?;
        let local = listener.local_addr()?;
        if !args.idle {
            service.start()?;
        }
        println!("kvroute loadgen: dashboard http://{local}/ and control API http://{local}/api/status (target {})", args.target);
        println!("  POST /api/start, /api/stop, /api/concurrency {{\"concurrency\": N}}; GET /api/ws, /api/conversations, /metrics");
        println!("Ctrl-C stops.");
        let app = crate::ui::router(service.clone(), local, None);
        let ctrl_c = async {
            if let Err(e) = tokio::signal::ctrl_c().await {
                tracing::error!(error = %e, "waiting for Ctrl-C failed: stopping");
            }
        };
        crate::ui::serve_app(listener, app, ctrl_c).await;
        let _ = service.stop();
        let stats = service.publish();
        for arm in &stats.arms {
            println!("{}", serde_json::to_string(&arm.totals)?);
        }
        Ok(())
    })
}

mod tenants;
