//! What goes into and comes out of the engine, and a sequence's state inside it.

use crate::pool::BlockId;
use kvroute_core::hashing::{chain, local_block_hash};
use kvroute_core::{KvEvent, Namespace, RequestId, SequenceHash, Time};
use serde::{Deserialize, Serialize};

/// A generation request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineRequest {
    /// Unique among the engine's live requests.
    pub id: RequestId,
    /// The prompt.
    pub prompt: EnginePrompt,
    /// Tokens to generate (end of sequence is never sampled, as with `ignore_eos`).
    pub max_tokens: u32,
    /// LoRA / cache-salt namespace of the prompt's blocks.
    pub namespace: Namespace,
    /// Leading prompt tokens whose KV another engine computed and sent with the request
    /// (disaggregated prefill: the transfer already done). At admission the full blocks of
    /// them the prefix cache lacks are written, not computed, and cached as computed ones
    /// are; they count as cached tokens, as real engines report KV a connector loaded. A
    /// sequence preempted later recomputes them. 0: none.
    pub remote_tokens: usize,
    /// Its priority under [`crate::EngineConfig::priority_scheduling`] (lower values first,
    /// as vLLM's `priority` field); ignored otherwise.
    pub priority: i32,
}

impl EngineRequest {
    /// A request for a prompt of token ids, in the default namespace.
    pub fn new(id: RequestId, tokens: Vec<u32>, max_tokens: u32) -> Self {
        Self {
            id,
            prompt: EnginePrompt::Tokens(tokens),
            max_tokens,
            namespace: Namespace::default(),
            remote_tokens: 0,
            priority: 0,
        }
    }
}

/// A prompt as the engine receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnginePrompt {
    /// Token ids; the engine hashes their blocks.
    Tokens(Vec<u32>),
    /// The chained hashes of the prompt's full blocks at the engine's block size, computed
    /// with `kvroute_core::hashing` in the request's namespace, and the tokens after the last
    /// full block (fewer than a block). For a caller in the same process that already
    /// hashed the prompt (the simulator's router); such a request cannot be reported with
    /// token ids, so an engine whose events carry token ids refuses it.
    Hashed {
        /// Sequence hashes of the full blocks.
        blocks: Vec<SequenceHash>,
        /// The tokens of the partial last block.
        tail: Vec<u32>,
    },
}

impl EnginePrompt {
    /// Prompt length in tokens, for blocks of `bs` tokens.
    pub fn len(&self, bs: usize) -> usize {
        match self {
            EnginePrompt::Tokens(t) => t.len(),
            EnginePrompt::Hashed { blocks, tail } => blocks.len() * bs + tail.len(),
        }
    }
}

/// Requests the engine refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// Bad settings.
    #[error("invalid engine config: {0}")]
    InvalidConfig(String),
    /// No prompt tokens.
    #[error("request {0}: the prompt is empty")]
    EmptyPrompt(RequestId),
    /// Nothing to generate.
    #[error("request {0}: max_tokens must be at least 1")]
    ZeroMaxTokens(RequestId),
    /// Prompt plus output cannot fit in the KV cache at all.
    #[error(
        "request {id}: {tokens} tokens (prompt + max_tokens) exceed the KV capacity of {capacity}"
    )]
    TooLong {
        /// The request.
        id: RequestId,
        /// Prompt plus max_tokens.
        tokens: usize,
        /// KV capacity in tokens.
        capacity: usize,
    },
    /// The waiting queue is full.
    #[error("the engine's waiting queue is full ({0} requests)")]
    QueueFull(usize),
    /// A hashed prompt the engine cannot take (a tail of a block or more, or token events).
    #[error("request {id}: {reason}")]
    BadPrompt {
        /// The request.
        id: RequestId,
        /// What is wrong.
        reason: String,
    },
    /// The id is already live.
    #[error("request {0} is already in the engine")]
    DuplicateRequest(RequestId),
}

impl EngineError {
    /// A stable snake_case code for the kind of error (metric labels, report keys).
    pub fn kind(&self) -> &'static str {
        match self {
            EngineError::InvalidConfig(_) => "invalid_config",
            EngineError::EmptyPrompt(_) => "empty_prompt",
            EngineError::ZeroMaxTokens(_) => "zero_max_tokens",
            EngineError::TooLong { .. } => "too_long",
            EngineError::QueueFull(_) => "queue_full",
            EngineError::BadPrompt { .. } => "bad_prompt",
            EngineError::DuplicateRequest(_) => "duplicate_request",
        }
    }
}

/// A request the engine completed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finished {
    /// The request.
    pub id: RequestId,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens found in the prefix cache at admission (`usage.cached_tokens`).
    pub cached_tokens: usize,
    /// Generated tokens.
    pub output: Vec<u32>,
    /// When it arrived.
    pub arrived: Time,
    /// When its first token came out.
    pub first_token: Time,
    /// When its last token came out.
    pub finished: Time,
    /// Times it was preempted.
    pub preemptions: u32,
}

/// What one call of [`crate::Engine::step`] produced, at `time`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepOutput {
    /// The time the output belongs to.
    pub time: Time,
    /// Tokens sampled, in time order.
    pub tokens: Vec<Sampled>,
    /// Tokens of silent steps, by run, when the engine reports them so
    /// ([`crate::Engine::set_token_runs`]); they all come before `tokens`.
    pub runs: super::TokenRuns,
    /// Requests completed.
    pub finished: Vec<Finished>,
    /// KV events, in order.
    pub events: Vec<KvEvent>,
    /// KV events of the host tier (after `events` in time), when the engine has one.
    pub host_events: Vec<KvEvent>,
}

/// A token sampled at the end of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampled {
    /// The request.
    pub id: RequestId,
    /// The token.
    pub token: u32,
    /// The end of the step that sampled it.
    pub time: Time,
}

/// The deterministic `k`-th output token of a request: an entry of `table` when given
/// ([`crate::EngineConfig::output_ids`]: ids of a real vocabulary, whose text tokenizes back
/// to them), else an id in 100..32,099 (the simulator's; such ids mean nothing). The entry
/// is chosen by the same hash, so a table changes which ids come out, never when.
pub fn output_token(id: RequestId, k: u32, table: Option<&[u32]>) -> u32 {
    let x = kvroute_core::hashing::splitmix64(id.0 ^ (u64::from(k) << 40));
    match table {
        Some(t) if !t.is_empty() => t[(x % t.len() as u64) as usize],
        _ => 100 + (x % 32_000) as u32,
    }
}

/// A sequence inside the engine.
pub(crate) struct Seq {
    pub id: RequestId,
    pub ns: Namespace,
    /// Tokens so far (prompt, then generated).
    pub len: usize,
    /// Tokens after the last full block.
    pub tail: Vec<u32>,
    /// Every token, kept only when KV events must carry token ids.
    pub history: Option<Vec<u32>>,
    /// Generated tokens.
    pub output: Vec<u32>,
    pub prompt_len: usize,
    pub max_tokens: u32,
    pub generated: u32,
    /// Sequence hashes of every full block.
    pub seqs: Vec<SequenceHash>,
    /// Pool blocks held, in order.
    pub blocks: Vec<BlockId>,
    /// Leading blocks known to the cache (acquired or announced).
    pub cached_blocks: usize,
    /// Tokens whose KV is computed.
    pub computed: usize,
    /// Prefix-cache hit at the first admission.
    pub cached_tokens: Option<usize>,
    /// Leading full blocks whose KV came with the request, until its first admission.
    pub remote_blocks: usize,
    pub arrived: Time,
    /// When it may first be scheduled (arrival plus the request overhead).
    pub ready: Time,
    /// Its priority (lower first) under priority scheduling.
    pub priority: i32,
    pub first_token: Option<Time>,
    pub preemptions: u32,
    pub aborted: bool,
}

impl Seq {
    /// A sequence for `req` (already validated), for blocks of `bs` tokens; `keep_tokens`
    /// keeps every token for KV events with token ids.
    pub fn new(req: EngineRequest, bs: usize, keep_tokens: bool, now: Time, ready: Time) -> Self {
        let (seqs, tail, history, len) = match req.prompt {
            EnginePrompt::Tokens(mut tokens) => {
                let full = tokens.len() / bs;
                let rest = tokens.len() - full * bs + req.max_tokens as usize;
                let mut seqs = Vec::with_capacity(full + rest.div_ceil(bs));
                for block in tokens.chunks_exact(bs) {
                    seqs.push(chain(
                        seqs.last().copied().or(req.namespace.root()),
                        local_block_hash(block),
                    ));
                }
                let mut tail = Vec::with_capacity(bs);
                tail.extend_from_slice(&tokens[full * bs..]);
                let len = tokens.len();
                let history = keep_tokens.then(|| {
                    tokens.reserve_exact(req.max_tokens as usize);
                    tokens
                });
                (seqs, tail, history, len)
            }
            EnginePrompt::Hashed {
                mut blocks,
                mut tail,
            } => {
                let len = blocks.len() * bs + tail.len();
                // Room for the blocks and the tail the output will fill (the engine checked
                // that prompt and output fit its KV cache), so they never grow by copying.
                blocks.reserve_exact((tail.len() + req.max_tokens as usize).div_ceil(bs));
                tail.reserve_exact(bs.saturating_sub(tail.len()));
                (blocks, tail, None, len)
            }
        };
        Self {
            id: req.id,
            ns: req.namespace,
            len,
            tail,
            history,
            output: Vec::with_capacity(req.max_tokens as usize),
            prompt_len: len,
            max_tokens: req.max_tokens,
            generated: 0,
            seqs,
            blocks: Vec::new(),
            cached_blocks: 0,
            computed: 0,
            cached_tokens: None,
            remote_blocks: req.remote_tokens.min(len) / bs,
            arrived: now,
            ready,
            priority: req.priority,
            first_token: None,
            preemptions: 0,
            aborted: false,
        }
    }

    /// Decoding: everything but the last sampled token has KV.
    pub fn is_decoding(&self) -> bool {
        self.generated > 0 && self.computed + 1 == self.len
    }

    /// Appends a generated token, hashing the block it completes.
    pub fn push_output(&mut self, tok: u32, bs: usize) {
        self.output.push(tok);
        self.generated += 1;
        self.len += 1;
        if let Some(h) = &mut self.history {
            h.push(tok);
        }
        self.tail.push(tok);
        if self.tail.len() == bs {
            let local = local_block_hash(&self.tail);
            let parent = self.seqs.last().copied().or(self.ns.root());
            self.seqs.push(chain(parent, local));
            self.tail.clear();
        }
    }

    /// The tokens of full block `b`, when every token is kept (else empty).
    pub fn block_tokens(&self, b: usize, bs: usize) -> &[u32] {
        self.history
            .as_ref()
            .map_or(&[][..], |h| &h[b * bs..(b + 1) * bs])
    }

    pub fn finish(self, at: Time) -> Finished {
        Finished {
            id: self.id,
            prompt_tokens: self.prompt_len,
            cached_tokens: self.cached_tokens.unwrap_or(0),
            output: self.output,
            arrived: self.arrived,
            first_token: self.first_token.unwrap_or(at),
            finished: at,
            preemptions: self.preemptions,
        }
    }
}
