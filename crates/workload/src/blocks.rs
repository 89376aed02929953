//! A prompt's router blocks without its token ids: for a simulator replaying a trace, where
//! materialising every prompt (145M tokens for the conversation trace) would cost more than
//! everything else. Mooncake hash blocks are expanded once per hash id and their block hashes
//! remembered; only the tokens of a prompt's partial last block are generated. The result is
//! exactly what hashing the materialised prompt gives. [`BlockHashCache`] serves one thread;
//! [`SharedBlockHashes`] holds a whole trace's ids for several threads at once.

mod shared;

pub use shared::SharedBlockHashes;

use crate::prompt::{block_key, extend_tokens, Prompt};
use kvroute_core::hashing::local_block_hash;
use kvroute_core::{BlockSize, BlockedPrompt, LocalBlockHash, Namespace};

/// The local block hashes of Mooncake hash blocks, by hash id, for one block size and
/// namespace. Bounded: it starts afresh when it holds `capacity` ids.
pub struct BlockHashCache {
    block_size: usize,
    ns: Namespace,
    capacity: usize,
    /// `(hash id, block tokens)` -> its hashes' place in `arena`.
    by_id: hashbrown::HashMap<(u64, usize), Span, foldhash::fast::FixedState>,
    /// The hashes of every id held, back to back in chunks of fixed size (an allocation per
    /// chunk, not one per id; and chunks never move, so growing copies nothing).
    arena: Vec<Vec<LocalBlockHash>>,
    /// A hash block's tokens while they are hashed.
    scratch: Vec<u32>,
}

/// Where an id's hashes are: chunk, start, end.
#[derive(Clone, Copy)]
struct Span(u32, u32, u32);

/// Hashes per arena chunk (512 KiB), unless an id needs more.
const CHUNK: usize = 1 << 16;

impl BlockHashCache {
    /// An empty cache for router blocks of `block_size` tokens in namespace `ns`, holding at
    /// most `capacity` hash ids.
    pub fn new(block_size: BlockSize, ns: Namespace, capacity: usize) -> Self {
        Self {
            block_size: block_size.get(),
            ns,
            capacity: capacity.max(1),
            by_id: Default::default(),
            arena: Vec::new(),
            scratch: Vec::new(),
        }
    }

    fn hashes(&mut self, id: u64, block_tokens: usize) -> &[LocalBlockHash] {
        let key = (id, block_tokens);
        let Span(chunk, start, end) = match self.by_id.get(&key) {
            Some(&span) => span,
            None => {
                if self.by_id.len() >= self.capacity {
                    self.by_id.clear();
                    self.arena.clear();
                }
                let bs = self.block_size;
                let n = block_tokens / bs;
                if self.arena.last().is_none_or(|c| c.capacity() - c.len() < n) {
                    self.arena.push(Vec::with_capacity(CHUNK.max(n)));
                }
                let chunk_ix = self.arena.len() - 1;
                let chunk = &mut self.arena[chunk_ix];
                let start = chunk.len();
                chunk.extend(id_block_hashes(id, block_tokens, bs, &mut self.scratch));
                // Chunk lengths are bounded by CHUNK or one id's blocks, ids by `capacity`.
                let span = Span(chunk_ix as u32, start as u32, chunk.len() as u32);
                self.by_id.insert(key, span);
                span
            }
        };
        &self.arena[chunk as usize][start as usize..end as usize]
    }

    /// `prompt` cut into router blocks, and its tokens after the last full block.
    pub fn blocked_with_tail(&mut self, prompt: &Prompt) -> (BlockedPrompt, Vec<u32>) {
        let bs = self.block_size;
        match prompt {
            Prompt::HashBlocks {
                ids, block_tokens, ..
            } if *block_tokens % bs == 0 => {
                let bt = *block_tokens;
                cut_hash_blocks(ids, bt, prompt.len(), bs, self.ns, |id, full, out| {
                    out.extend_from_slice(&self.hashes(id, bt)[..full]);
                })
            }
            _ => materialized(prompt, bs, self.ns),
        }
    }
}

/// The local hashes of the router blocks (of `bs` tokens) of hash id `id`'s block of
/// `block_tokens` tokens; `scratch` holds its tokens meanwhile.
fn id_block_hashes<'s>(
    id: u64,
    block_tokens: usize,
    bs: usize,
    scratch: &'s mut Vec<u32>,
) -> impl Iterator<Item = LocalBlockHash> + 's {
    scratch.clear();
    extend_tokens(scratch, block_key(id), 0, block_tokens);
    scratch.chunks_exact(bs).map(local_block_hash)
}

/// A hash-block prompt (`ids` of `block_tokens`, `len` tokens in all) cut into router blocks
/// of `bs` (a divisor of `block_tokens`): `push(id, n, out)` appends the first `n` block
/// hashes of an id; only the partial last block's tokens are generated. The chain starts at
/// namespace `ns`'s root.
fn cut_hash_blocks(
    ids: &[u64],
    block_tokens: usize,
    len: usize,
    bs: usize,
    ns: Namespace,
    mut push: impl FnMut(u64, usize, &mut Vec<LocalBlockHash>),
) -> (BlockedPrompt, Vec<u32>) {
    let mut local = Vec::with_capacity(len / bs);
    let mut tail = Vec::new();
    let mut left = len;
    for &id in ids {
        let take = block_tokens.min(left);
        if take == 0 {
            break;
        }
        let full = take / bs;
        push(id, full, &mut local);
        if !take.is_multiple_of(bs) {
            // Only the last block can be partial.
            extend_tokens(&mut tail, block_key(id), (full * bs) as u64, take % bs);
        }
        left -= take;
    }
    (BlockedPrompt::from_local(len, local, ns), tail)
}

/// Any prompt cut into router blocks by materialising its tokens.
fn materialized(prompt: &Prompt, bs: usize, ns: Namespace) -> (BlockedPrompt, Vec<u32>) {
    let tokens = prompt.materialize();
    let full = tokens.len() / bs * bs;
    let blocked = BlockedPrompt::new(
        &tokens,
        BlockSize::new(bs).expect("a BlockSize gave it"),
        ns,
    );
    (blocked, tokens[full..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(prompt: &Prompt, bs: usize) {
        let b = BlockSize::new(bs).unwrap();
        let mut cache = BlockHashCache::new(b, Namespace::default(), 3);
        let tokens = prompt.materialize();
        let want = BlockedPrompt::new(&tokens, b, Namespace::default());
        for _ in 0..2 {
            let (got, tail) = cache.blocked_with_tail(prompt);
            assert_eq!(got, want, "block size {bs}");
            assert_eq!(tail, tokens[tokens.len() / bs * bs..]);
        }
    }

    #[test]
    fn equals_hashing_the_materialised_prompt() {
        for len in [1usize, 63, 64, 65, 511, 512, 513, 1000, 1536] {
            let ids: Vec<u64> = (0..len.div_ceil(512) as u64).map(|i| i * 7 + 3).collect();
            let p = Prompt::hash_blocks(ids, 512, len).unwrap();
            for bs in [16, 64, 512, 100] {
                check(&p, bs);
            }
        }
        check(&Prompt::Tokens((0..100).collect()), 16);
        // More ids than the cache holds: it starts afresh and stays right.
        let p = Prompt::hash_blocks((0..9).collect(), 512, 9 * 512).unwrap();
        check(&p, 64);
    }

    #[test]
    fn large_ids_and_other_block_sizes_agree_too() {
        let b = BlockSize::new(64).unwrap();
        let mut cache = BlockHashCache::new(b, Namespace::default(), 1 << 20);
        let prompts = [
            Prompt::hash_blocks(vec![1, 2, 3], 512, 1500).unwrap(),
            // Large ids.
            Prompt::hash_blocks(vec![1, u64::MAX, 1 << 40], 512, 1536).unwrap(),
            // Another hash-block size: the same ids name other blocks.
            Prompt::hash_blocks(vec![1, 2, 3], 256, 700).unwrap(),
        ];
        for _ in 0..2 {
            for p in &prompts {
                let tokens = p.materialize();
                let (got, tail) = cache.blocked_with_tail(p);
                assert_eq!(got, BlockedPrompt::new(&tokens, b, Namespace::default()));
                assert_eq!(tail, tokens[tokens.len() / 64 * 64..]);
            }
        }
        // Ids 1, 2, 3 at 512; MAX and 2^40 at 512; 1, 2, 3 at 256.
        assert_eq!(cache.by_id.len(), 8);
    }
}
