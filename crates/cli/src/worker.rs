//! `kvroute worker`: one simulated engine replica served over HTTP in real time, publishing
//! its KV events over ZMQ like vLLM.

use anyhow::{Context, Result};
use clap::Args;
use kvroute_worker::{WorkerConfig, ZmqConfig};
use std::path::PathBuf;

/// Options of `kvroute worker` (each overrides the config file).
#[derive(Args, Debug, Default)]
pub struct WorkerArgs {
    /// TOML config file (the `WorkerConfig` fields). Repeat to layer several (later ones
    /// override earlier ones), then `KVROUTE_WORKER__<KEY>` environment variables.
    #[arg(long = "config")]
    pub config: Vec<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8001)]
    pub port: u16,
    /// Engine profile (`kvroute profiles` lists them).
    #[arg(long)]
    pub profile: Option<String>,
    /// Virtual seconds per real second.
    #[arg(long)]
    pub speedup: Option<f64>,
    /// KV block size in tokens (instead of the profile's).
    #[arg(long)]
    pub block_size: Option<usize>,
    /// Most sequences per step, the batch limit (vLLM's `--max-num-seqs`).
    #[arg(long = "max-batch", visible_alias = "max-num-seqs")]
    pub max_num_seqs: Option<usize>,
    /// Most tokens per step (vLLM's `--max-num-batched-tokens`).
    #[arg(long = "max-batched-tokens", visible_alias = "max-num-batched-tokens")]
    pub max_num_batched_tokens: Option<usize>,
    /// KV blocks (instead of what the profile's memory gives).
    #[arg(long)]
    pub num_gpu_blocks: Option<usize>,
    /// Blocks of a host (CPU) tier the engine offloads to and loads back from (0: none);
    /// published as KV events with medium `CPU`.
    #[arg(long)]
    pub host_blocks: Option<usize>,
    /// Seconds to load one token's KV back from the host tier.
    #[arg(long)]
    pub host_load_secs_per_token: Option<f64>,
    /// How the engine takes waiting requests: fcfs, or priority (by the request's
    /// `priority`, lower first, as vLLM's `--scheduling-policy priority`).
    #[arg(long)]
    pub scheduling_policy: Option<kvroute_worker::SchedulingPolicy>,
    /// The served model name.
    #[arg(long)]
    pub model: Option<String>,
    /// The worker's name in logs.
    #[arg(long)]
    pub name: Option<String>,
    /// Tokenizer directory (tokenizer.json + tokenizer_config.json), `builtin` or
    /// `builtin-small`; use the
    /// gateway's, so both cut prompts into the same tokens.
    #[arg(long, default_value = "builtin")]
    pub tokenizer: String,
    /// ZMQ endpoint to publish KV events on, e.g. tcp://127.0.0.1:5557.
    #[arg(long)]
    pub zmq_publish: Option<String>,
    /// Connect the publisher to `--zmq-publish` (where a gateway binds with
    /// `bind:tcp://...`) instead of binding it.
    #[arg(long, requires = "zmq_publish")]
    pub zmq_connect: bool,
    /// ZMQ endpoint of the replay service, e.g. tcp://127.0.0.1:5558.
    #[arg(long, requires = "zmq_publish")]
    pub zmq_replay: Option<String>,
    /// The KV events' wire form: vllm (0.32), sglang (0.5.23) or trtllm (its ZMQ
    /// publisher).
    #[arg(long)]
    pub event_format: Option<kvroute_protocol::kv_events::EventFormat>,
    /// A LoRA adapter served besides the base model (repeat for several).
    #[arg(long = "lora-adapter")]
    pub lora_adapters: Vec<String>,
    /// The data-parallel rank this worker plays (stamped on its KV event batches).
    #[arg(long)]
    pub data_parallel_rank: Option<u32>,
    /// What it does in a disaggregated fleet: both, prefill (refuses decode legs) or decode
    /// (refuses prefill legs) [default: both].
    #[arg(long)]
    pub role: Option<kvroute_core::WorkerRole>,
    /// Bandwidth of the modelled link a decode leg's KV comes over, GB/s [default: 25].
    #[arg(long)]
    pub kv_link_gb_per_sec: Option<f64>,
    /// Latency of each such transfer, ms [default: 2].
    #[arg(long)]
    pub kv_link_latency_ms: Option<f64>,
}

impl WorkerArgs {
    /// The config file (if any) with the flags applied, checked.
    pub fn config(&self) -> Result<WorkerConfig> {
        let mut c: WorkerConfig = crate::read_worker_config(&self.config)?;
        if let Some(p) = &self.profile {
            c.profile = p.clone();
        }
        if let Some(s) = self.speedup {
            c.speedup = s;
        }
        c.block_size = self.block_size.or(c.block_size);
        c.max_num_seqs = self.max_num_seqs.or(c.max_num_seqs);
        c.max_num_batched_tokens = self.max_num_batched_tokens.or(c.max_num_batched_tokens);
        c.num_gpu_blocks = self.num_gpu_blocks.or(c.num_gpu_blocks);
        c.host_blocks = self.host_blocks.unwrap_or(c.host_blocks);
        c.scheduling_policy = self.scheduling_policy.unwrap_or(c.scheduling_policy);
        c.host_load_secs_per_token = self
            .host_load_secs_per_token
            .unwrap_or(c.host_load_secs_per_token);
        if let Some(m) = &self.model {
            c.model = m.clone();
        }
        if let Some(n) = &self.name {
            c.worker_name = n.clone();
        }
        if let Some(f) = self.event_format {
            c.event_format = f;
        }
        if !self.lora_adapters.is_empty() {
            c.lora_adapters = self.lora_adapters.clone();
        }
        c.data_parallel_rank = self.data_parallel_rank.unwrap_or(c.data_parallel_rank);
        c.role = self.role.unwrap_or(c.role);
        if let Some(g) = self.kv_link_gb_per_sec {
            c.kv_link_bytes_per_sec = g * 1e9;
        }
        if let Some(ms) = self.kv_link_latency_ms {
            c.kv_link_latency_secs = ms / 1e3;
        }
        // Keys from the environment only (a command line is visible to every user).
        let secret = |name: &str| {
            std::env::var(name)
                .ok()
                .filter(|k| !k.is_empty())
                .map(kvroute_runtime::Secret)
        };
        c.api_key = secret("KVROUTE_WORKER_API_KEY").or(c.api_key);
        c.admin_key = secret("KVROUTE_ADMIN_KEY").or(c.admin_key);
        c.validate()?;
        Ok(c)
    }
}

/// Runs the worker until Ctrl-C.
pub fn run(args: &WorkerArgs) -> Result<()> {
    let config = args.config()?;
    let zmq = args.zmq_publish.as_ref().map(|p| ZmqConfig {
        publish: p.clone(),
        connect: args.zmq_connect,
        replay: args.zmq_replay.clone(),
    });
    crate::runtime()?.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("listening on {addr}"))?;
        let pre = crate::demo::preprocessor(&args.tokenizer)?;
        let handle = kvroute_worker::spawn(config, pre, listener, zmq).await?;
        println!("kvroute worker on {}", handle.url());
        if let Some(p) = handle.zmq_publish_endpoint() {
            println!("  KV events: {p}");
        }
        if let Some(r) = handle.zmq_replay_endpoint() {
            println!("  replay:    {r}");
        }
        tokio::signal::ctrl_c()
            .await
            .context("waiting for Ctrl-C")?;
        println!("stopping");
        handle.shutdown().await;
        Ok(())
    })
}
