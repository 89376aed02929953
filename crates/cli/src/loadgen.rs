//! `kvroute loadgen`: multi-turn chat load against any OpenAI-compatible endpoint, with the
//! same summary table and records as the simulator.

use anyhow::{Context, Result};
use clap::Args;
use kvroute_loadgen::LoadgenConfig;
use kvroute_workload::{markdown_table, records_tsv, Summary};
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
    /// `multiturn` (closed loop at `--concurrency`) or `mooncake:<file>` (the trace replayed on
    /// its own schedule, open loop, token-id prompts on `/v1/completions`).
    #[arg(long, default_value = "multiturn")]
    pub workload: String,
    /// Trace replay speed (2 = twice as fast).
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Replay only the first K requests of the trace.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Conversations in flight at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Conversations to run in all.
    #[arg(long, default_value_t = 40)]
    pub conversations: u64,
    /// Stop starting turns after this many seconds (0: no limit).
    #[arg(long, default_value_t = 0.0)]
    pub duration_secs: f64,
    /// Output tokens per turn.
    #[arg(long, default_value_t = 830)]
    pub max_tokens: u32,
    /// Do not send `ignore_eos` (for servers that refuse unknown fields).
    #[arg(long)]
    pub no_ignore_eos: bool,
    /// Seed of the conversations.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Write per-turn records (TSV) and the summary (Markdown) into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs the load and prints the summary.
pub fn run(args: &LoadgenArgs) -> Result<()> {
    let result = if let Some(path) = args.workload.strip_prefix("mooncake:") {
        let options = kvroute_workload::TraceOptions {
            speedup: args.speedup,
            first: args.limit,
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
            ..Default::default()
        };
        crate::runtime()?.block_on(kvroute_loadgen::replay(config, requests))?
    } else {
        anyhow::ensure!(
            args.workload == "multiturn",
            "unknown workload {:?} (expected multiturn or mooncake:<file>)",
            args.workload
        );
        let mut config = LoadgenConfig {
            target: args.target.clone(),
            model: args.model.clone(),
            concurrency: args.concurrency,
            conversations: args.conversations,
            duration_secs: args.duration_secs,
            ignore_eos: !args.no_ignore_eos,
            seed: args.seed,
            ..LoadgenConfig::default()
        };
        config.chat.max_tokens = args.max_tokens;
        config.validate()?;
        crate::runtime()?.block_on(kvroute_loadgen::run(config))?
    };
    let summary = Summary::from_records(&result.records, result.duration);
    let label = if args.workload.starts_with("mooncake:") {
        format!("trace x{}", args.speedup)
    } else {
        format!("c{}", args.concurrency)
    };
    let table = markdown_table(&[(label.as_str(), &summary)]);
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print!("{table}");
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join("records.tsv"), records_tsv(&result.records))?;
        std::fs::write(
            dir.join("report.md"),
            format!("# kvroute loadgen\n\n{table}"),
        )?;
    }
    Ok(())
}
