//! The block hashes of a trace's hash ids, shared by threads: each id is hashed once, by
//! whichever thread needs it (or hashes ahead) first, and read by any thread after that.
//! Lock-free: a state byte per id says empty, being hashed or ready, and a thread that needs
//! an id another thread is hashing waits the microsecond it takes.

use super::{cut_hash_blocks, id_block_hashes, materialized};
use crate::prompt::Prompt;
use kvroute_core::{BlockSize, BlockedPrompt, LocalBlockHash, Namespace};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

const EMPTY: u8 = 0;
const BUSY: u8 = 1;
const READY: u8 = 2;

/// Most block hashes held (1 GiB of them): a larger trace is served by [`super::BlockHashCache`].
const MAX_HASHES: usize = 1 << 27;

/// See the module documentation.
pub struct SharedBlockHashes {
    block_size: usize,
    ns: Namespace,
    /// Tokens of every hash block of the prompts.
    block_tokens: usize,
    /// Router blocks per hash block.
    per_id: usize,
    /// The slot of each id, when ids are not their own slot numbers (Mooncake ids are dense
    /// integers from 0, so they usually are).
    slot_of: Option<hashbrown::HashMap<u64, u32, foldhash::fast::FixedState>>,
    state: Vec<AtomicU8>,
    /// `per_id` hashes per slot.
    hashes: Vec<AtomicU64>,
}

impl SharedBlockHashes {
    /// A store for `prompts` cut into blocks of `block_size`; None unless every prompt is
    /// made of hash blocks of one size that `block_size` divides (and they are not too many).
    pub fn for_prompts<'p>(
        prompts: impl Iterator<Item = &'p Prompt> + Clone,
        block_size: BlockSize,
        ns: Namespace,
    ) -> Option<Self> {
        let bs = block_size.get();
        let mut block_tokens = None;
        let (mut ids, mut max_id) = (0usize, 0u64);
        for p in prompts.clone() {
            let Prompt::HashBlocks {
                ids: p_ids,
                block_tokens: bt,
                ..
            } = p
            else {
                return None;
            };
            if *bt == 0 || *bt % bs != 0 || *block_tokens.get_or_insert(*bt) != *bt {
                return None;
            }
            ids += p_ids.len();
            max_id = p_ids.iter().copied().fold(max_id, u64::max);
        }
        let block_tokens = block_tokens?;
        let per_id = block_tokens / bs;
        let dense = usize::try_from(max_id)
            .ok()
            .filter(|&m| m < ids.saturating_mul(2).saturating_add(1024))
            .map(|m| m + 1);
        let (slots, slot_of) = match dense {
            Some(slots) => (slots, None),
            None => {
                let mut map = hashbrown::HashMap::with_hasher(Default::default());
                for p in prompts {
                    if let Prompt::HashBlocks { ids, .. } = p {
                        for &id in ids {
                            let next = u32::try_from(map.len()).ok()?;
                            map.entry(id).or_insert(next);
                        }
                    }
                }
                (map.len(), Some(map))
            }
        };
        if slots.checked_mul(per_id)? > MAX_HASHES {
            return None;
        }
        Some(Self {
            block_size: bs,
            ns,
            block_tokens,
            per_id,
            slot_of,
            state: (0..slots).map(|_| AtomicU8::new(EMPTY)).collect(),
            hashes: (0..slots * per_id).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn slot(&self, id: u64) -> Option<usize> {
        let slot = match &self.slot_of {
            Some(map) => *map.get(&id)? as usize,
            None => usize::try_from(id).ok()?,
        };
        (slot < self.state.len()).then_some(slot)
    }

    /// Hashes the blocks of `id` unless they are ready or being hashed; true when this call
    /// hashed them. `scratch` holds tokens meanwhile.
    pub fn warm(&self, id: u64, scratch: &mut Vec<u32>) -> bool {
        self.slot(id)
            .is_some_and(|slot| self.claim_and_hash(slot, id, scratch))
    }

    fn claim_and_hash(&self, slot: usize, id: u64, scratch: &mut Vec<u32>) -> bool {
        // A plain read first: most ids asked for are ready, and a failed exchange would
        // still take the cache line away from the other thread.
        let claimed = self.state[slot].load(Ordering::Relaxed) == EMPTY
            && self.state[slot]
                .compare_exchange(EMPTY, BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok();
        if claimed {
            let (bt, bs) = (self.block_tokens, self.block_size);
            let out = &self.hashes[slot * self.per_id..(slot + 1) * self.per_id];
            for (cell, h) in out.iter().zip(id_block_hashes(id, bt, bs, scratch)) {
                cell.store(h.0, Ordering::Relaxed);
            }
            self.state[slot].store(READY, Ordering::Release);
        }
        claimed
    }

    /// Appends the first `n` block hashes of `id`, hashing them first if no thread has (or
    /// waiting for the thread hashing them).
    fn push(&self, id: u64, n: usize, out: &mut Vec<LocalBlockHash>, scratch: &mut Vec<u32>) {
        let Some(slot) = self.slot(id) else {
            // Not an id of these prompts: hashed, not kept.
            let (bt, bs) = (self.block_tokens, self.block_size);
            out.extend(id_block_hashes(id, bt, bs, scratch).take(n));
            return;
        };
        self.claim_and_hash(slot, id, scratch);
        let mut spins = 0u32;
        while self.state[slot].load(Ordering::Acquire) != READY {
            // Another thread is hashing it: a few microseconds at most, unless it was
            // descheduled.
            spins += 1;
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let cells = &self.hashes[slot * self.per_id..slot * self.per_id + n];
        out.extend(
            cells
                .iter()
                .map(|c| LocalBlockHash(c.load(Ordering::Relaxed))),
        );
    }

    /// `prompt` cut into router blocks, and its tokens after the last full block (exactly
    /// what [`super::BlockHashCache::blocked_with_tail`] gives).
    pub fn blocked_with_tail(
        &self,
        prompt: &Prompt,
        scratch: &mut Vec<u32>,
    ) -> (BlockedPrompt, Vec<u32>) {
        match prompt {
            Prompt::HashBlocks {
                ids, block_tokens, ..
            } if *block_tokens == self.block_tokens => cut_hash_blocks(
                ids,
                self.block_tokens,
                prompt.len(),
                self.block_size,
                self.ns,
                |id, n, out| self.push(id, n, out, scratch),
            ),
            _ => materialized(prompt, self.block_size, self.ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::BlockHashCache;
    use super::*;

    fn prompts(ids: &[&[u64]], len: usize) -> Vec<Prompt> {
        ids.iter()
            .map(|i| Prompt::hash_blocks(i.to_vec(), 512, len.min(i.len() * 512)).unwrap())
            .collect()
    }

    fn agree(ps: &[Prompt], store: &SharedBlockHashes, bs: usize) {
        let mut cache = BlockHashCache::new(BlockSize::new(bs).unwrap(), Namespace::default(), 9);
        let mut scratch = Vec::new();
        for p in ps {
            assert_eq!(
                store.blocked_with_tail(p, &mut scratch),
                cache.blocked_with_tail(p)
            );
        }
    }

    #[test]
    fn dense_and_sparse_ids_give_what_the_cache_gives() {
        let b = BlockSize::new(64).unwrap();
        let dense = prompts(&[&[0, 1, 2], &[0, 1, 5], &[3]], 1300);
        let store = SharedBlockHashes::for_prompts(dense.iter(), b, Namespace::default()).unwrap();
        assert!(store.slot_of.is_none());
        let mut scratch = Vec::new();
        assert!(store.warm(1, &mut scratch));
        assert!(!store.warm(1, &mut scratch), "hashed once");
        assert!(!store.warm(99, &mut scratch), "not an id of the prompts");
        agree(&dense, &store, 64);
        // A prompt from elsewhere (unknown id) still comes out right.
        agree(&prompts(&[&[0, 77]], 1000), &store, 64);
        let sparse = prompts(&[&[u64::MAX, 1 << 40], &[u64::MAX, 3]], 1000);
        let store = SharedBlockHashes::for_prompts(sparse.iter(), b, Namespace::default()).unwrap();
        assert_eq!(store.slot_of.as_ref().map(|m| m.len()), Some(3));
        agree(&sparse, &store, 64);
    }

    #[test]
    fn mixed_or_indivisible_prompts_are_refused() {
        let b = BlockSize::new(64).unwrap();
        let ns = Namespace::default();
        let mut mixed = prompts(&[&[1]], 512);
        mixed.push(Prompt::Tokens(vec![1, 2, 3]));
        assert!(SharedBlockHashes::for_prompts(mixed.iter(), b, ns).is_none());
        let two_sizes = [
            Prompt::hash_blocks(vec![1], 512, 512).unwrap(),
            Prompt::hash_blocks(vec![1], 256, 256).unwrap(),
        ];
        assert!(SharedBlockHashes::for_prompts(two_sizes.iter(), b, ns).is_none());
        let odd = BlockSize::new(100).unwrap();
        assert!(SharedBlockHashes::for_prompts(prompts(&[&[1]], 512).iter(), odd, ns).is_none());
    }

    #[test]
    fn threads_hashing_the_same_ids_agree() {
        let b = BlockSize::new(16).unwrap();
        let ids: Vec<Vec<u64>> = (0..64u64).map(|i| vec![i % 7, i]).collect();
        let ps: Vec<Prompt> = ids
            .iter()
            .map(|i| Prompt::hash_blocks(i.clone(), 512, 1000).unwrap())
            .collect();
        let store = SharedBlockHashes::for_prompts(ps.iter(), b, Namespace::default()).unwrap();
        let results: Vec<Vec<(BlockedPrompt, Vec<u32>)>> = std::thread::scope(|s| {
            let run = || {
                let mut scratch = Vec::new();
                ps.iter()
                    .map(|p| store.blocked_with_tail(p, &mut scratch))
                    .collect()
            };
            let a = s.spawn(run);
            let b = s.spawn(run);
            vec![a.join().unwrap(), b.join().unwrap()]
        });
        let mut cache = BlockHashCache::new(b, Namespace::default(), 1 << 10);
        let want: Vec<_> = ps.iter().map(|p| cache.blocked_with_tail(p)).collect();
        assert_eq!(results[0], want);
        assert_eq!(results[1], want);
    }
}
