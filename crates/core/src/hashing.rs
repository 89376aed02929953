//! Tokens to KV blocks to hashes.
//!
//! A prompt of `T` tokens splits into `floor(T / B)` full blocks of `B` tokens; the trailing
//! partial block is never hashed nor indexed. Each full block gets a *local* hash (xxh3-64 of
//! its token ids as little-endian `u32` bytes, with a fixed seed; a block with extra keys, such
//! as an engine's multimodal identifiers, mixes their digest in: [`LocalBlockHash::keyed`]), and
//! each position a *sequence* hash chained from the root: `s0 = l0`, `si = xxh3(s(i-1) || li)`.
//! The sequence hash of block `i` therefore names the whole prefix up to and including block `i`.
//!
//! A [`Namespace`] (LoRA adapter, cache salt) changes only the root: its first block is chained
//! from the namespace's seed, `s0 = xxh3(ns || l0)`, and every later block inherits it through
//! the chain. This is how the engines key their caches (vLLM puts the salt in the first block's
//! extra keys only, SGLang keeps a separate tree per key), and it lets a stored event that
//! continues a chain (it names its parent) be hashed without knowing the chain's namespace.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

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
/// or salt never share KV, so they must never share a hash. It seeds the root of a chain
/// ([`Namespace::root`]); the default namespace (the base model, no salt) has no seed, so its
/// hashes are the plain chain.
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
    /// is the base model's default namespace). An empty name or salt is none, wherever it
    /// comes from (a request body, an event).
    pub fn new(lora: Option<&str>, cache_salt: Option<&str>) -> Self {
        let lora = lora.filter(|s| !s.is_empty());
        let cache_salt = cache_salt.filter(|s| !s.is_empty());
        if lora.is_none() && cache_salt.is_none() {
            return Self::default();
        }
        // Length-prefixed so ("ab", "c") and ("a", "bc") differ; a tag byte tells which is
        // given.
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

    /// Whether this is the base model's namespace (no adapter, no salt).
    pub fn is_default(&self) -> bool {
        self.seed == HASH_SEED
    }

    /// The "parent" a chain in this namespace starts from: None for the default namespace,
    /// else a sequence hash no prompt block can name (it is not a chained value).
    pub fn root(&self) -> Option<SequenceHash> {
        (!self.is_default()).then_some(SequenceHash(self.seed))
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
pub fn local_block_hash(tokens: &[u32]) -> LocalBlockHash {
    LocalBlockHash(hash_tokens_le(tokens, HASH_SEED))
}

impl LocalBlockHash {
    /// This block's hash with extra keys mixed in (`key` is their digest, e.g. of an engine's
    /// multimodal identifiers): equal tokens with other keys never share a hash.
    pub fn keyed(self, key: u64) -> Self {
        Self(hash_pair(self.0, key, HASH_SEED ^ 0x6b65_7973)) // "keys"
    }
}

/// xxh3 of two u64 as 16 little-endian bytes (seed 0 is plain `xxh3_64`).
#[inline]
fn hash_pair(a: u64, b: u64, seed: u64) -> u64 {
    let mut buf = [0u8; 16];
    buf[..8].copy_from_slice(&a.to_le_bytes());
    buf[8..].copy_from_slice(&b.to_le_bytes());
    xxh3_64_with_seed(&buf, seed)
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
pub fn local_block_hashes(tokens: &[u32], block_size: usize) -> Vec<LocalBlockHash> {
    assert!(block_size > 0, "block size is validated by BlockSize");
    tokens
        .chunks_exact(block_size)
        .map(local_block_hash)
        .collect()
}

/// The sequence hash of the block after `parent` (or of the first block when `parent` is None).
#[inline]
pub fn chain(parent: Option<SequenceHash>, local: LocalBlockHash) -> SequenceHash {
    match parent {
        None => SequenceHash(local.0),
        Some(p) => SequenceHash(hash_pair(p.0, local.0, 0)),
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

/// Chained sequence hashes of a prompt's local hashes, from the root of the default namespace.
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
        Self::from_local(
            tokens.len(),
            local_block_hashes(tokens, block_size.get()),
            ns,
        )
    }

    /// A prompt known only by its block hashes and length (simulated workloads), in
    /// namespace `ns`.
    pub fn from_local(tokens: usize, local: Vec<LocalBlockHash>, ns: Namespace) -> Self {
        let sequence = sequence_hashes_from(ns.root(), &local);
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
        assert_eq!(local_block_hashes(&tokens, 16).len(), 2);
        assert_eq!(local_block_hashes(&tokens[..15], 16).len(), 0);
    }

    #[test]
    fn local_hash_is_xxh3_of_little_endian_u32() {
        let tokens = [1u32, 2, 0x0102_0304];
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(
            local_block_hash(&tokens).0,
            xxh3_64_with_seed(&bytes, HASH_SEED)
        );
    }

    #[test]
    fn local_hash_is_position_independent_but_sequence_hash_is_not() {
        let a: Vec<u32> = (0..16).collect();
        let b: Vec<u32> = (100..116).collect();
        let ab: Vec<u32> = a.iter().chain(b.iter()).copied().collect();
        let ba: Vec<u32> = b.iter().chain(a.iter()).copied().collect();
        let lab = local_block_hashes(&ab, 16);
        let lba = local_block_hashes(&ba, 16);
        assert_eq!(lab[0], lba[1]);
        assert_eq!(lab[1], lba[0]);
        let sab = sequence_hashes(&lab);
        let sba = sequence_hashes(&lba);
        assert_ne!(sab[1], sba[1]);
        assert_eq!(sab[0], SequenceHash(lab[0].0));
        assert_eq!(sab[1], chain(Some(sab[0]), lab[1]));
    }

    #[test]
    fn a_chained_hash_is_plain_xxh3_of_parent_and_local() {
        let mut buf = [0u8; 16];
        buf[..8].copy_from_slice(&7u64.to_le_bytes());
        buf[8..].copy_from_slice(&9u64.to_le_bytes());
        let got = chain(Some(SequenceHash(7)), LocalBlockHash(9));
        assert_eq!(got.0, xxhash_rust::xxh3::xxh3_64(&buf));
        assert_eq!(chain(None, LocalBlockHash(9)).0, 9);
    }

    #[test]
    fn namespaces_separate_equal_tokens_from_the_root_on() {
        let t: Vec<u32> = (0..32).collect();
        let b = crate::BlockSize::new(16).unwrap();
        let of = |ns| BlockedPrompt::new(&t, b, ns).sequence;
        let base = of(Namespace::default());
        let lora = of(Namespace::new(Some("sql"), None));
        let salt = of(Namespace::new(None, Some("sql")));
        let both = of(Namespace::new(Some("s"), Some("ql")));
        for i in 0..2 {
            assert_ne!(base[i], lora[i]);
            assert_ne!(lora[i], salt[i]);
            assert_ne!(salt[i], both[i]);
        }
        assert_eq!(Namespace::new(None, None), Namespace::default());
        // An empty salt or adapter name is none, from a request or an event alike.
        assert_eq!(Namespace::new(Some(""), Some("")), Namespace::default());
        assert_eq!(Namespace::new(None, Some("")), Namespace::default());
        assert_eq!(Namespace::default().root(), None);
        assert_eq!(base, sequence_hashes(&local_block_hashes(&t, 16)));
        assert_eq!(lora, of(Namespace::new(Some("sql"), None)));
        // The later blocks inherit the namespace through the chain alone.
        assert_eq!(lora[1], chain(Some(lora[0]), local_block_hash(&t[16..])));
    }

    #[test]
    fn extra_keys_separate_a_block() {
        let t: Vec<u32> = (0..16).collect();
        let l = local_block_hash(&t);
        assert_ne!(l.keyed(1), l);
        assert_ne!(l.keyed(1), l.keyed(2));
        assert_eq!(l.keyed(7), local_block_hash(&t).keyed(7));
    }

    #[test]
    fn chained_from_parent_equals_chained_whole() {
        let t: Vec<u32> = (0..64).collect();
        let l = local_block_hashes(&t, 16);
        let whole = sequence_hashes(&l);
        let tail = sequence_hashes_from(Some(whole[1]), &l[2..]);
        assert_eq!(&whole[2..], &tail[..]);
    }

    #[test]
    fn sglang_signed_hashes_keep_their_bits() {
        assert_eq!(EngineHash::from_i64(-1).0, u64::MAX);
    }
}
