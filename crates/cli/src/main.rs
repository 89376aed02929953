//! The `kvroute` binary: `serve` runs the gateway, `worker` a simulated engine replica,
//! `demo` both in one process, `loadgen` drives an endpoint with chat load, `simulate` runs
//! the fleet simulator; `profiles` lists the engine profiles, `hash` shows how the router
//! hashes a prompt.

mod bench;
mod config_layers;
mod demo;
mod epp;
mod help_defaults;
mod loadgen;
mod relay;
mod serve;
mod simulate;
mod ui;
mod worker;

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use demo::DemoCommand;
use kvroute_core::{BlockSize, BlockedPrompt, Namespace};

/// mimalloc instead of the system allocator: the tokenizer allocates a few small buffers per
/// word, and with glibc's malloc half of the time of tokenizing new text went to allocating
/// (`cargo bench -p kvroute-preprocess --bench preprocess`, `encode_new`: 139 µs -> 69 µs for
/// a new 30-word chat, 7.4 ms -> 3.2 ms for 2,000 words). Built without the default feature
/// `mimalloc`, the system allocator stays, for heap profilers (docs/operations.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "kvroute",
    version,
    about = "KV-cache-aware router for LLM inference fleets"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: the size of its variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Everything in one process: the gateway and simulated workers, ready to curl.
    Demo(DemoCommand),
    /// Drive an OpenAI-compatible endpoint with multi-turn chat and report what it measured.
    Loadgen(loadgen::LoadgenArgs),
    /// Run the gateway in front of engine replicas.
    Serve(serve::ServeArgs),
    /// The gateway as the endpoint picker of a Gateway API gateway (Envoy ext_proc).
    Epp(epp::EppArgs),
    /// Run one simulated engine replica (OpenAI API, vLLM-style KV events over ZMQ).
    Worker(worker::WorkerArgs),
    /// Publish one engine's KV events to the NATS event plane (runs beside the engine).
    Relay(relay::RelayArgs),
    /// Simulate a fleet in virtual time: compare policies, plan capacity.
    Simulate(simulate::SimulateArgs),
    /// A/B benchmark sweeps (simulated or live) with a Markdown report, plots and a
    /// baseline file.
    Bench(bench::BenchArgs),
    /// Check config files as `serve` (or `worker`) would layer them with the `KVROUTE__`
    /// environment variables: print the effective config, every default filled in, or each
    /// problem with its file, line and key path (exit code 2).
    CheckConfig(CheckConfigArgs),
    /// List the built-in engine profiles.
    Profiles,
    /// Cut token ids into KV blocks and print the router's block hashes as JSON.
    Hash {
        /// Token ids, comma-separated (e.g. 1,2,3).
        #[arg(long, value_delimiter = ',', required = true)]
        tokens: Vec<u32>,
        /// KV block size in tokens.
        #[arg(long, default_value_t = 16)]
        block_size: usize,
        /// LoRA adapter name.
        #[arg(long)]
        lora: Option<String>,
        /// Cache salt.
        #[arg(long)]
        cache_salt: Option<String>,
    },
}

/// Options of `kvroute check-config`.
#[derive(clap::Args)]
struct CheckConfigArgs {
    /// Whose config: `gateway` (`serve`, `epp`, `demo`) or `worker`.
    #[arg(long, default_value = "gateway", value_parser = ["gateway", "worker"])]
    kind: String,
    /// The files, layered in order (none: the defaults and the environment alone).
    files: Vec<std::path::PathBuf>,
}

/// `kvroute check-config`: the effective config on stdout, or the problems on stderr and
/// exit code 2.
fn check_config(a: &CheckConfigArgs) -> Result<()> {
    use config_layers::{env_overrides, ENV_PREFIX, WORKER_ENV_PREFIX};
    let text = match a.kind.as_str() {
        "worker" => config_layers::load_with::<kvroute_worker::WorkerConfig>(
            &a.files,
            &env_overrides(WORKER_ENV_PREFIX),
            WORKER_ENV_PREFIX,
        )
        .map_err(|p| p.to_string())
        .and_then(|c| c.validate().map(|_| c).map_err(|e| e.to_string()))
        .and_then(|c| toml::to_string(&c).map_err(|e| e.to_string())),
        // As `serve` reads it, its keys from the environment too (never printed).
        _ => config_layers::load::<kvroute_gateway::GatewayConfig>(
            &a.files,
            &env_overrides(ENV_PREFIX),
        )
        .map_err(|p| p.to_string())
        .and_then(|c| c.validate().map(|_| c).map_err(|e| e.to_string()))
        .and_then(|c| c.with_pools_written_out().map_err(|e| e.to_string()))
        .and_then(|c| toml::to_string(&c).map_err(|e| e.to_string())),
    };
    match text {
        Ok(t) => {
            print!("{t}");
            Ok(())
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2)
        }
    }
}

/// The config of `paths` layered in order, then the `KVROUTE__` environment variables
/// ([`config_layers`]), as a `T` (its defaults where nothing is given).
fn read_config<T: serde::de::DeserializeOwned>(paths: &[std::path::PathBuf]) -> Result<T> {
    let prefix = config_layers::ENV_PREFIX;
    Ok(config_layers::load(
        paths,
        &config_layers::env_overrides(prefix),
    )?)
}

/// [`read_config`] for a simulated worker (its variables: `KVROUTE_WORKER__`).
fn read_worker_config<T: serde::de::DeserializeOwned>(paths: &[std::path::PathBuf]) -> Result<T> {
    let prefix = config_layers::WORKER_ENV_PREFIX;
    Ok(config_layers::load_with(
        paths,
        &config_layers::env_overrides(prefix),
        prefix,
    )?)
}

/// A multi-threaded tokio runtime for the server subcommands.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Logs to stderr; `RUST_LOG` filters (default `info`).
fn init_logs() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: a container's log collector would keep the escapes.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Resolves at Ctrl-C or SIGTERM (how Kubernetes and service managers stop a process).
pub async fn stop_signal() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C")?,
        _ = term.recv() => {}
    }
    Ok(())
}

/// The command line, its config flags' help naming their defaults ([`help_defaults`]).
fn parse() -> Cli {
    use help_defaults::{annotate, defaults_of, GATEWAY_FLAGS, WORKER_FLAGS};
    let gateway = defaults_of::<kvroute_gateway::GatewayConfig>();
    let worker = defaults_of::<kvroute_worker::WorkerConfig>();
    let cmd = Cli::command()
        .mut_subcommand("serve", |c| annotate(c, &gateway, GATEWAY_FLAGS))
        .mut_subcommand("epp", |c| annotate(c, &gateway, GATEWAY_FLAGS))
        .mut_subcommand("worker", |c| annotate(c, &worker, WORKER_FLAGS))
        .mut_subcommand("demo", demo::annotate_help)
        .mut_subcommand("simulate", help_defaults::annotate_objectives)
        .mut_subcommand("bench", help_defaults::annotate_objectives);
    Cli::from_arg_matches(&cmd.get_matches()).unwrap_or_else(|e| e.exit())
}

fn main() -> Result<()> {
    match parse().command {
        Command::Demo(a) => {
            init_logs();
            demo::run(&a)?
        }
        Command::Loadgen(a) => {
            init_logs();
            loadgen::run(&a)?
        }
        Command::Worker(a) => {
            init_logs();
            worker::run(&a)?
        }
        Command::Relay(a) => {
            init_logs();
            relay::run(&a)?
        }
        Command::Serve(a) => {
            init_logs();
            serve::run(&a)?
        }
        Command::Epp(a) => {
            init_logs();
            epp::run(&a)?
        }
        Command::Simulate(a) => simulate::run(&a)?,
        Command::Bench(a) => bench::run(&a)?,
        Command::CheckConfig(a) => check_config(&a)?,
        Command::Profiles => {
            for name in kvroute_engine::profile::builtin_names() {
                let p = kvroute_engine::Profile::builtin(&name)?;
                println!(
                    "{name}: {} (block {}, {} KV blocks, max {} seqs, {} tokens/step)",
                    p.description,
                    p.block_size,
                    p.kv_blocks(p.block_size),
                    p.max_num_seqs,
                    p.max_num_batched_tokens
                );
            }
        }
        Command::Hash {
            tokens,
            block_size,
            lora,
            cache_salt,
        } => {
            let bs = BlockSize::new(block_size).context("--block-size")?;
            let ns = Namespace::new(lora.as_deref(), cache_salt.as_deref());
            let prompt = BlockedPrompt::new(&tokens, bs, ns);
            println!("{}", serde_json::to_string_pretty(&prompt)?);
        }
    }
    Ok(())
}
