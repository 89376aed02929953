//! kvroute workloads: what requests to send, and what to report about them.
//!
//! Pure and deterministic: no async runtime, no clock (time is a [`kvroute_core::Time`]
//! argument or field), no environment, no file system: parsers read from any
//! [`std::io::BufRead`] or `&str` that the caller opened. Every random choice comes from a
//! seeded ChaCha8 stream, so a seed gives the same workload on every machine.
//!
//! - [`prompt`]: [`Prompt`], explicit token ids or Mooncake-style hash blocks expanded to
//!   deterministic token ids on demand.
//! - [`blocks`]: a prompt's router blocks without materialising its tokens (trace replay).
//! - [`mooncake`]: the Mooncake FAST'25 JSONL trace format, with speed-up and filters.
//! - [`multiturn`]: the reference multi-turn chat workload for a closed-loop driver.
//! - [`synthetic`]: shared prefixes with Zipf popularity, closed loop or Poisson arrivals.
//! - [`stats`]: per-request records, the run summary (exact percentiles, hit rate, goodput)
//!   and its Markdown / TSV renderings.
//!
//! ```
//! use kvroute_workload::{MultiTurn, MultiTurnConfig};
//!
//! let mut chat = MultiTurn::new(MultiTurnConfig::default(), 7)?;
//! let (conv, first) = chat.start();
//! assert_eq!(first.turn, 1);
//! let answer = vec![42u32; first.max_tokens as usize];
//! let second = chat.follow_up(conv, &answer).expect("at least 3 turns");
//! assert_eq!(second.prompt.materialize()[..first.prompt.len()], first.prompt.materialize()[..]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod arrivals;
pub mod blocks;
pub mod chat;
pub mod mooncake;
pub mod multiturn;
pub mod prompt;
pub mod stats;
pub mod synthetic;

pub use arrivals::PoissonArrivals;
pub use blocks::{BlockHashCache, SharedBlockHashes};
pub use chat::{ChatConfig, ChatMessage, ChatTurn, ChatWorkload};
pub use mooncake::{LineError, TraceError, TraceOptions, TraceRequest, TraceStats};
pub use multiturn::{ConversationId, MultiTurn, MultiTurnConfig, MultiTurnError, TurnRequest};
pub use prompt::{text_tokens, token_block, Prompt, PromptError, VOCAB_SIZE};
pub use stats::{
    deciles, deciles_markdown, markdown_table, numbered_workers, records_tsv, Decile, Distribution,
    Goodput, RequestRecord, Slo, Status, Summary,
};
pub use synthetic::{OpenLoop, Synthetic, SyntheticConfig, SyntheticError, SyntheticRequest, Zipf};
