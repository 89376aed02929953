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
    /// Prompt token ids.
    pub tokens: Vec<u32>,
    /// Tokens to generate (end of sequence is never sampled, as with `ignore_eos`).
    pub max_tokens: u32,
    /// LoRA / cache-salt namespace of the prompt's blocks.
    pub namespace: Namespace,
    /// The chained hashes of the prompt's full blocks at the engine's block size, when the
    /// caller already computed them with `kvroute_core::hashing` in this namespace (the
    /// simulator's router did): the engine then does not hash the prompt again. Extra
    /// entries are ignored; missing ones are computed.
    pub prompt_hashes: Option<Vec<SequenceHash>>,
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
    /// The id is already live.
    #[error("request {0} is already in the engine")]
    DuplicateRequest(RequestId),
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
    /// Tokens sampled: `(request, token)`.
    pub tokens: Vec<(RequestId, u32)>,
    /// Requests completed.
    pub finished: Vec<Finished>,
    /// KV events, in order.
    pub events: Vec<KvEvent>,
}

/// A cheap guard on caller-supplied prompt hashes: the first and the last must be those of
/// the tokens (a wrong block size or namespace fails it), or the engine hashes itself.
pub(crate) fn hashes_match(h: &[SequenceHash], tokens: &[u32], bs: usize, ns: Namespace) -> bool {
    let Some(last) = h.last() else { return true };
    let first = chain(None, local_block_hash(&tokens[..bs], ns));
    if h[0] != first {
        return false;
    }
    let n = h.len();
    let parent = n.checked_sub(2).map(|i| h[i]);
    *last == chain(parent, local_block_hash(&tokens[(n - 1) * bs..n * bs], ns))
}

/// The deterministic `k`-th output token of a request.
pub fn output_token(id: RequestId, k: u32) -> u32 {
    let x = kvroute_core::hashing::splitmix64(id.0 ^ (u64::from(k) << 40));
    100 + (x % 32_000) as u32
}

/// A sequence inside the engine.
pub(crate) struct Seq {
    pub id: RequestId,
    pub ns: Namespace,
    /// Prompt, then generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub max_tokens: u32,
    pub generated: u32,
    /// Sequence hashes of the leading full blocks hashed so far.
    pub seqs: Vec<SequenceHash>,
    /// Pool blocks held, in order.
    pub blocks: Vec<BlockId>,
    /// Leading blocks known to the cache (acquired or announced).
    pub cached_blocks: usize,
    /// Tokens whose KV is computed.
    pub computed: usize,
    /// Prefix-cache hit at the first admission.
    pub cached_tokens: Option<usize>,
    pub arrived: Time,
    /// When it may first be scheduled (arrival plus the request overhead).
    pub ready: Time,
    pub first_token: Option<Time>,
    pub preemptions: u32,
    pub aborted: bool,
}

impl Seq {
    pub fn new(req: EngineRequest, now: Time, ready: Time) -> Self {
        let mut tokens = req.tokens;
        let seqs = req.prompt_hashes.unwrap_or_default();
        // Room for the output up front: growing a long prompt's vector token by token would
        // copy it again and again.
        tokens.reserve_exact(req.max_tokens as usize);
        Self {
            id: req.id,
            ns: req.namespace,
            prompt_len: tokens.len(),
            tokens,
            max_tokens: req.max_tokens,
            generated: 0,
            seqs,
            blocks: Vec::new(),
            cached_blocks: 0,
            computed: 0,
            cached_tokens: None,
            arrived: now,
            ready,
            first_token: None,
            preemptions: 0,
            aborted: false,
        }
    }

    /// Decoding: everything but the last sampled token has KV.
    pub fn is_decoding(&self) -> bool {
        self.generated > 0 && self.computed + 1 == self.tokens.len()
    }

    /// Hashes the first `n` full blocks (those not hashed yet).
    pub fn hash_blocks(&mut self, bs: usize, n: usize) {
        let n = n.min(self.tokens.len() / bs);
        while self.seqs.len() < n {
            let b = self.seqs.len();
            let local = local_block_hash(&self.tokens[b * bs..(b + 1) * bs], self.ns);
            self.seqs.push(chain(self.seqs.last().copied(), local));
        }
    }

    pub fn finish(self, at: Time) -> Finished {
        Finished {
            id: self.id,
            prompt_tokens: self.prompt_len,
            cached_tokens: self.cached_tokens.unwrap_or(0),
            output: self.tokens[self.prompt_len..].to_vec(),
            arrived: self.arrived,
            first_token: self.first_token.unwrap_or(at),
            finished: at,
            preemptions: self.preemptions,
        }
    }
}
