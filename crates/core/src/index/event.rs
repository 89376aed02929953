//! The KV cache events the prefix index consumes, in engine-neutral form (the protocol layer
//! decodes vLLM / SGLang / TensorRT-LLM wire formats into these), and the errors of applying
//! them.

use crate::hashing::{EngineHash, Namespace};
use crate::types::WorkerId;
use serde::{Deserialize, Serialize};

/// One change of an engine's KV cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvEvent {
    /// Blocks entered the cache (as one chain: each block's parent is the previous one).
    Stored(StoredBlocks),
    /// Blocks left the cache.
    Removed {
        /// The engine's hashes of the removed blocks.
        block_hashes: Vec<EngineHash>,
    },
    /// The whole cache was dropped (also what an engine restart amounts to).
    Cleared,
    /// Blocks entered the cache, named by their router sequence hashes instead of token ids.
    /// Only for producers in the same process that hash with [`crate::hashing`] (the
    /// simulated engines of the fleet simulator): the index trusts the hashes. Decoders of
    /// engines' wire formats never produce it.
    StoredHashed(StoredHashed),
}

/// A chain of blocks stored by an in-process engine, with the router's own hashes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredHashed {
    /// The engine hash of the block before the first one (None: the root).
    pub parent: Option<EngineHash>,
    /// The engine's hash of each stored block.
    pub block_hashes: Vec<EngineHash>,
    /// The router sequence hash of each stored block (same length).
    pub sequence_hashes: Vec<crate::hashing::SequenceHash>,
}

/// A chain of blocks stored by an engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredBlocks {
    /// The engine hash of the block before the first one; `None` when the chain starts at the
    /// root of the prompt.
    pub parent: Option<EngineHash>,
    /// The engine's hash of each stored block, in order.
    pub block_hashes: Vec<EngineHash>,
    /// The token ids of all stored blocks, concatenated: `block_hashes.len() * block_size`.
    pub token_ids: Vec<u32>,
    /// The engine's block size, checked against the index's.
    pub block_size: usize,
    /// LoRA adapter / cache salt of the chain: it seeds the chain's root, so it matters only
    /// when `parent` is None (a continuation inherits its parent's namespace, as in the
    /// engines).
    pub namespace: Namespace,
    /// Extra keys of each block (a digest per block, 0 for none; an engine's multimodal
    /// identifiers, prompt-embedding digests): mixed into that block's hash, so such blocks
    /// match only prompts with the same keys. Empty when no block has any.
    #[serde(default)]
    pub block_keys: Vec<u64>,
}

/// Why an event was rejected. Rejections never change the index, except
/// [`IndexError::UnknownRemovedHash`], where the known hashes of the batch are still removed,
/// and [`IndexError::UnknownBlock`], where the known ones are still stored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    /// The engine uses another block size than the router was configured with.
    #[error("worker {worker}: event block size {got} differs from the configured {expected}")]
    BlockSizeMismatch {
        /// The worker that sent the event.
        worker: WorkerId,
        /// The configured block size.
        expected: usize,
        /// The event's block size.
        got: usize,
    },
    /// A stored event whose token ids do not fill its blocks exactly.
    #[error(
        "worker {worker}: stored event has {tokens} token ids for {blocks} blocks of {block_size}"
    )]
    TokenCountMismatch {
        /// The worker that sent the event.
        worker: WorkerId,
        /// Token ids carried.
        tokens: usize,
        /// Blocks carried.
        blocks: usize,
        /// Block size.
        block_size: usize,
    },
    /// A stored event whose parent block the index does not know for this worker (an event
    /// was lost, or arrived out of order).
    #[error("worker {worker}: parent block {parent:#x} of a stored event is unknown")]
    UnknownParent {
        /// The worker that sent the event.
        worker: WorkerId,
        /// The unknown parent's engine hash.
        parent: u64,
    },
    /// A removed event naming blocks the index does not hold for this worker.
    #[error("worker {worker}: {unknown} of {total} removed blocks are unknown")]
    UnknownRemovedHash {
        /// The worker that sent the event.
        worker: WorkerId,
        /// How many hashes were unknown.
        unknown: usize,
        /// How many hashes the event named.
        total: usize,
    },
    /// A bare store of offloaded blocks (engine hashes only) naming blocks the worker never
    /// reported (see [`crate::tiers`]).
    #[error("worker {worker}: {unknown} of {total} offloaded blocks are unknown")]
    UnknownBlock {
        /// The worker that sent the event.
        worker: WorkerId,
        /// How many hashes were unknown.
        unknown: usize,
        /// How many hashes the event named.
        total: usize,
    },
    /// A hashed stored event whose hash lists differ in length.
    #[error("worker {worker}: stored event has {sequence} sequence hashes for {blocks} blocks")]
    HashCountMismatch {
        /// The worker that sent the event.
        worker: WorkerId,
        /// Sequence hashes carried.
        sequence: usize,
        /// Engine block hashes carried.
        blocks: usize,
    },
    /// A stored event whose extra keys are not one per block.
    #[error("worker {worker}: stored event has {keys} extra-key entries for {blocks} blocks")]
    KeyCountMismatch {
        /// The worker that sent the event.
        worker: WorkerId,
        /// Extra-key entries carried.
        keys: usize,
        /// Blocks carried.
        blocks: usize,
    },
    /// The index already tracks its maximum number of workers.
    #[error("worker {worker}: the index already tracks its limit of {limit} workers")]
    TooManyWorkers {
        /// The worker that could not be added.
        worker: WorkerId,
        /// The configured limit.
        limit: usize,
    },
}

/// The kinds of [`IndexError`], for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectKind {
    /// [`IndexError::BlockSizeMismatch`].
    BlockSizeMismatch,
    /// [`IndexError::TokenCountMismatch`].
    TokenCountMismatch,
    /// [`IndexError::UnknownParent`].
    UnknownParent,
    /// [`IndexError::UnknownRemovedHash`].
    UnknownRemovedHash,
    /// [`IndexError::TooManyWorkers`].
    TooManyWorkers,
    /// [`IndexError::HashCountMismatch`].
    HashCountMismatch,
    /// [`IndexError::KeyCountMismatch`].
    KeyCountMismatch,
    /// [`IndexError::UnknownBlock`].
    UnknownBlock,
}

impl RejectKind {
    /// Every kind, in a fixed order.
    pub const ALL: [RejectKind; 8] = [
        RejectKind::BlockSizeMismatch,
        RejectKind::TokenCountMismatch,
        RejectKind::UnknownParent,
        RejectKind::UnknownRemovedHash,
        RejectKind::TooManyWorkers,
        RejectKind::HashCountMismatch,
        RejectKind::KeyCountMismatch,
        RejectKind::UnknownBlock,
    ];

    /// A stable snake_case name (metric labels).
    pub fn as_str(self) -> &'static str {
        match self {
            RejectKind::BlockSizeMismatch => "block_size_mismatch",
            RejectKind::TokenCountMismatch => "token_count_mismatch",
            RejectKind::UnknownParent => "unknown_parent",
            RejectKind::UnknownRemovedHash => "unknown_removed_hash",
            RejectKind::TooManyWorkers => "too_many_workers",
            RejectKind::HashCountMismatch => "hash_count_mismatch",
            RejectKind::KeyCountMismatch => "key_count_mismatch",
            RejectKind::UnknownBlock => "unknown_block",
        }
    }
}

impl IndexError {
    /// The kind of this error.
    pub fn kind(&self) -> RejectKind {
        match self {
            IndexError::BlockSizeMismatch { .. } => RejectKind::BlockSizeMismatch,
            IndexError::TokenCountMismatch { .. } => RejectKind::TokenCountMismatch,
            IndexError::UnknownParent { .. } => RejectKind::UnknownParent,
            IndexError::UnknownRemovedHash { .. } => RejectKind::UnknownRemovedHash,
            IndexError::TooManyWorkers { .. } => RejectKind::TooManyWorkers,
            IndexError::HashCountMismatch { .. } => RejectKind::HashCountMismatch,
            IndexError::KeyCountMismatch { .. } => RejectKind::KeyCountMismatch,
            IndexError::UnknownBlock { .. } => RejectKind::UnknownBlock,
        }
    }
}

/// Counters of what the index applied and rejected since it was created.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventStats {
    /// Events applied in full.
    pub applied: u64,
    /// Blocks stored.
    pub blocks_stored: u64,
    /// Blocks removed.
    pub blocks_removed: u64,
    /// Blocks dropped to keep a worker under the per-worker limit.
    pub blocks_evicted: u64,
    /// Rejected events, by kind, in the order of [`RejectKind::ALL`].
    pub rejected: [u64; 8],
}

impl EventStats {
    /// Rejections of one kind.
    pub fn rejected(&self, kind: RejectKind) -> u64 {
        self.rejected[RejectKind::ALL.iter().position(|k| *k == kind).unwrap_or(0)]
    }

    pub(crate) fn count_rejection(&mut self, kind: RejectKind) {
        if let Some(i) = RejectKind::ALL.iter().position(|k| *k == kind) {
            self.rejected[i] += 1;
        }
    }
}
