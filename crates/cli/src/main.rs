//! The `kvroute` binary. Subcommands arrive with the components they drive; today it can
//! hash a prompt the way the router does.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kvroute_core::{BlockSize, BlockedPrompt, Namespace};

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

#[derive(Subcommand)]
enum Command {
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

fn main() -> Result<()> {
    match Cli::parse().command {
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
