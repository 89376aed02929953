//! Tokens to KV blocks to hashes.
//!
//! A prompt of `T` tokens splits into `floor(T / B)` full blocks of `B` tokens; the trailing
//! partial block is never hashed nor indexed. Each full block gets a *local* hash (xxh3-64 of
//! its token ids as little-endian `u32` bytes, seeded by the [`Namespace`]), and each position a
//! *sequence* hash chained from the root: `s0 = l0`, `si = xxh3(s(i-1) || li)`. The sequence
//! hash of block `i` therefore names the whole prefix up to and including block `i`.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// The fixed seed of every router hash (changing it invalidates nothing persistent, but all
/// gateway replicas and simulators must agree on it).
pub const HASH_SEED: u64 = 0x6b76_726f_7574_6531; // "kvroute1"

/// Hash of one block's token ids, independent of its position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LocalBlockHash(pub u64);

/// Hash of a whole prefix: chained local hashes from the root to this block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SequenceHash(pub u64);

/// A block hash as an engine reports it (vLLM ints, SGLang signed ints reinterpreted,
/// TensorRT-LLM ids). Opaque: used only to link a stored block to its parent and to apply
/// removals, never compared with router hashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EngineHash(pub u64);

impl EngineHash {
    /// An engine hash from a signed integer (SGLang), bit pattern preserved.
    pub fn from_i64(v: i64) -> Self {
        Self(v as u64)
    }
}

/// Keeps blocks of different adapters / cache salts apart: the same tokens under another LoRA
/// or salt never share KV, so they must never share a hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Namespace {
    seed: u64,
}

impl Default for Namespace {
    fn default() -> Self {
        Self { seed: HASH_SEED }
    }
}

impl Namespace {
    /// The namespace of a LoRA adapter name and / or a cache salt (both optional; `None, None`
    /// is the base model's default namespace).
    pub fn new(lora: Option<&str>, cache_salt: Option<&str>) -> Self {
        if lora.is_none() && cache_salt.is_none() {
            return Self::default();
        }
        // Length-prefixed so ("ab", "c") and ("a", "bc") differ; a tag byte tells None from "".
        let mut buf = Vec::with_capacity(32);
        for part in [lora, cache_salt] {
            match part {
                None => buf.push(0u8),
                Some(s) => {
                    buf.push(1u8);
                    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
                    buf.extend_from_slice(s.as_bytes());
                }
            }
        }
        Self {
            seed: xxh3_64_with_seed(&buf, HASH_SEED),
        }
    }

    /// The xxh3 seed of this namespace.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

/// The splitmix64 finaliser: a fast, well-mixed 64-bit function of `x` (for deterministic
/// pseudo-random streams: synthetic tokens, test data; not a block hash).
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Local hash of one block of token ids (any length; callers pass full blocks).
pub fn local_block_hash(tokens: &[u32], ns: Namespace) -> LocalBlockHash {
    LocalBlockHash(hash_tokens_le(tokens, ns.seed))
}

#[cfg(target_endian = "little")]
fn hash_tokens_le(tokens: &[u32], seed: u64) -> u64 {
    xxh3_64_with_seed(bytemuck::cast_slice(tokens), seed)
}

#[cfg(not(target_endian = "little"))]
fn hash_tokens_le(tokens: &[u32], seed: u64) -> u64 {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxh3_64_with_seed(&bytes, seed)
}

/// Local hashes of the full blocks of `tokens` (the trailing partial block is dropped).
/// `block_size` must be non-zero (see [`crate::BlockSize`]).
pub fn local_block_hashes(tokens: &[u32], block_size: usize, ns: Namespace) -> Vec<LocalBlockHash> {
    assert!(block_size > 0, "block size is validated by BlockSize");
    tokens
        .chunks_exact(block_size)
        .map(|block| local_block_hash(block, ns))
        .collect()
}

/// The sequence hash of the block after `parent` (or of the first block when `parent` is None).
#[inline]
pub fn chain(parent: Option<SequenceHash>, local: LocalBlockHash) -> SequenceHash {
    match parent {
        None => SequenceHash(local.0),
        Some(p) => {
            let mut buf = [0u8; 16];
            buf[..8].copy_from_slice(&p.0.to_le_bytes());
            buf[8..].copy_from_slice(&local.0.to_le_bytes());
            SequenceHash(xxh3_64(&buf))
        }
    }
}

/// Chained sequence hashes of a run of local hashes, starting after `parent`.
pub fn sequence_hashes_from(
    parent: Option<SequenceHash>,
    locals: &[LocalBlockHash],
) -> Vec<SequenceHash> {
    let mut out = Vec::with_capacity(locals.len());
    extend_sequence_hashes(parent, locals, &mut out);
    out
}

/// Chained sequence hashes of a prompt's local hashes, from the root.
pub fn sequence_hashes(locals: &[LocalBlockHash]) -> Vec<SequenceHash> {
    sequence_hashes_from(None, locals)
}

/// Appends the chained sequence hashes of `locals` (after `parent`) to `out`, reusing its
/// allocation (the lookup hot path keeps one buffer).
pub fn extend_sequence_hashes(
    parent: Option<SequenceHash>,
    locals: &[LocalBlockHash],
    out: &mut Vec<SequenceHash>,
) {
    let mut prev = parent;
    out.reserve(locals.len());
    for &l in locals {
        let s = chain(prev, l);
        out.push(s);
        prev = Some(s);
    }
}

/// A prompt cut into blocks: everything the router needs to know about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockedPrompt {
    /// Number of prompt tokens, including the partial tail block.
    pub tokens: usize,
    /// Local hashes of the full blocks.
    pub local: Vec<LocalBlockHash>,
    /// Sequence hashes of the full blocks.
    pub sequence: Vec<SequenceHash>,
}

impl BlockedPrompt {
    /// Cuts `tokens` into blocks of `block_size` in namespace `ns` and hashes them.
    pub fn new(tokens: &[u32], block_size: crate::BlockSize, ns: Namespace) -> Self {
        let local = local_block_hashes(tokens, block_size.get(), ns);
        let sequence = sequence_hashes(&local);
        Self {
            tokens: tokens.len(),
            local,
            sequence,
        }
    }

    /// A prompt known only by its block hashes and length (simulated workloads).
    pub fn from_local(tokens: usize, local: Vec<LocalBlockHash>) -> Self {
        let sequence = sequence_hashes(&local);
        Self {
            tokens,
            local,
            sequence,
        }
    }

    /// Number of full blocks.
    pub fn full_blocks(&self) -> usize {
        self.local.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_tail_block_is_not_hashed() {
        let tokens: Vec<u32> = (0..35).collect();
        assert_eq!(
            local_block_hashes(&tokens, 16, Namespace::default()).len(),
            2
        );
        assert_eq!(
            local_block_hashes(&tokens[..15], 16, Namespace::default()).len(),
            0
        );
    }

    #[test]
    fn local_hash_is_xxh3_of_little_endian_u32() {
        let tokens = [1u32, 2, 0x0102_0304];
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(
            local_block_hash(&tokens, Namespace::default()).0,
            xxh3_64_with_seed(&bytes, HASH_SEED)
        );
    }

    #[test]
    fn local_hash_is_position_independent_but_sequence_hash_is_not() {
        let a: Vec<u32> = (0..16).collect();
        let b: Vec<u32> = (100..116).collect();
        let ab: Vec<u32> = a.iter().chain(b.iter()).copied().collect();
        let ba: Vec<u32> = b.iter().chain(a.iter()).copied().collect();
        let ns = Namespace::default();
        let lab = local_block_hashes(&ab, 16, ns);
        let lba = local_block_hashes(&ba, 16, ns);
        assert_eq!(lab[0], lba[1]);
        assert_eq!(lab[1], lba[0]);
        let sab = sequence_hashes(&lab);
        let sba = sequence_hashes(&lba);
        assert_ne!(sab[1], sba[1]);
        assert_eq!(sab[0], SequenceHash(lab[0].0));
        assert_eq!(sab[1], chain(Some(sab[0]), lab[1]));
    }

    #[test]
    fn namespaces_separate_equal_tokens() {
        let t: Vec<u32> = (0..16).collect();
        let base = local_block_hash(&t, Namespace::default());
        let lora = local_block_hash(&t, Namespace::new(Some("sql"), None));
        let salt = local_block_hash(&t, Namespace::new(None, Some("sql")));
        let both = local_block_hash(&t, Namespace::new(Some("s"), Some("ql")));
        assert_ne!(base, lora);
        assert_ne!(lora, salt);
        assert_ne!(salt, both);
        assert_eq!(Namespace::new(None, None), Namespace::default());
        assert_eq!(
            lora,
            local_block_hash(&t, Namespace::new(Some("sql"), None))
        );
    }

    #[test]
    fn chained_from_parent_equals_chained_whole() {
        let t: Vec<u32> = (0..64).collect();
        let l = local_block_hashes(&t, 16, Namespace::default());
        let whole = sequence_hashes(&l);
        let tail = sequence_hashes_from(Some(whole[1]), &l[2..]);
        assert_eq!(&whole[2..], &tail[..]);
    }

    #[test]
    fn sglang_signed_hashes_keep_their_bits() {
        assert_eq!(EngineHash::from_i64(-1).0, u64::MAX);
    }
}
