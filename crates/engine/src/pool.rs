//! The paged KV block pool with prefix caching.
//!
//! `num_gpu_blocks` blocks of `block_size` tokens. A full, computed block is *cached* under
//! the chained hash of its prefix so later requests with the same prefix reuse it. Blocks
//! hold a reference count; a block nobody references goes to the tail of an LRU free list but
//! keeps its cached content, and is only evicted (its hash dropped, a `Removed` event emitted)
//! when an allocation takes it from the head of the list. Requests release their blocks last
//! block first, so the deepest blocks of a prefix are evicted before its root.
//!
//! Two requests computing the same prefix at once end up with two physical copies of the
//! same hash; as in vLLM, each copy is cached and reported on its own, and a hit uses the
//! first. Every change of the cached set is reported as a KV event, exactly when it happens:
//! `Stored` (parent-chained, with token ids) when a copy is cached, `Removed` when a copy is
//! evicted, `Cleared` on a reset. The engine's block hash in the events is an opaque mix of the
//! sequence hash, as a real engine's would be. Events for a router in the same process
//! (`StoredHashed`) name each block by its index in the pool instead, so the router can keep
//! them in an array (`PrefixIndex::use_block_ids`).

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;
use kvroute_core::{EngineHash, KvEvent, Namespace, SequenceHash, StoredBlocks, StoredHashed};
use std::hash::BuildHasher;

type Map<K, V> = hashbrown::HashMap<K, V, foldhash::fast::RandomState>;

/// Index of a block in the pool.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

/// The engine's own hash of a cached block (opaque to the router).
pub fn engine_hash(seq: SequenceHash) -> EngineHash {
    EngineHash(seq.0.rotate_left(29) ^ 0x5eed_cafe_f00d_d00d)
}

/// A pool block: 24 bytes (the hash is kept beside a flag rather than in an `Option`, which
/// would take 32), so that eight engines' pools stay small next to the router's tables.
#[derive(Clone, Debug)]
struct Block {
    /// The sequence hash of its cached content, when `has_seq`.
    seq: SequenceHash,
    refs: u32,
    prev: u32,
    next: u32,
    has_seq: bool,
    free: bool,
}

impl Block {
    /// The hash of the cached content, if any.
    #[inline]
    fn seq(&self) -> Option<SequenceHash> {
        self.has_seq.then_some(self.seq)
    }
}

const _: () = assert!(std::mem::size_of::<Block>() == 24);

/// The hash-table hash of a sequence hash.
#[inline]
fn table_hash(seq: SequenceHash) -> u64 {
    foldhash::fast::FixedState::with_seed(0x6b76_726f_7574_6521).hash_one(seq.0)
}

/// The block pool. See the module documentation.
#[derive(Clone, Debug)]
pub struct BlockPool {
    block_size: usize,
    blocks: Vec<Block>,
    /// The first cached copy of each hash, found by the hash its block holds: four bytes per
    /// entry where a map from hash to block would take sixteen.
    cached: HashTable<BlockId>,
    /// Further copies of a hash (rare: concurrent computation of one prefix).
    copies: Map<SequenceHash, Vec<BlockId>>,
    head: u32,
    tail: u32,
    free_len: usize,
    events: Vec<KvEvent>,
    /// Stored events carry token ids (as engines on the wire do); otherwise the router's
    /// sequence hashes (`StoredHashed`, for a router in the same process), and events name
    /// blocks by their pool index.
    event_tokens: bool,
    /// Hashes about to be evicted, read ahead (reused from call to call).
    scratch: Vec<SequenceHash>,
}

/// One block to cache: the pool block, its sequence hash and its token ids.
#[derive(Clone, Copy, Debug)]
pub struct FullBlock<'a> {
    /// The pool block holding it.
    pub block: BlockId,
    /// Its sequence hash.
    pub seq: SequenceHash,
    /// Its tokens.
    pub tokens: &'a [u32],
}

impl BlockPool {
    /// A pool of `num_blocks` free, empty blocks.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        let n = num_blocks.min(NIL as usize - 1);
        let mut pool = Self {
            block_size,
            blocks: vec![
                Block {
                    seq: SequenceHash(0),
                    refs: 0,
                    prev: NIL,
                    next: NIL,
                    has_seq: false,
                    free: false,
                };
                n
            ],
            // At most one first copy per block. Removals leave tombstones that a rehash
            // clears, and hashbrown doubles a table instead when it is over half full: room
            // for 2n keeps every rehash in place, so the table is allocated once.
            cached: HashTable::with_capacity(2 * n),
            copies: Map::default(),
            head: NIL,
            tail: NIL,
            free_len: 0,
            events: Vec::new(),
            event_tokens: true,
            scratch: Vec::new(),
        };
        for b in 0..n as u32 {
            pool.push_tail(b);
        }
        pool
    }

    /// Whether `Stored` events carry token ids (the default) or, for a router in the same
    /// process, sequence hashes (`StoredHashed`, naming blocks by pool index).
    pub fn with_event_tokens(mut self, tokens: bool) -> Self {
        self.event_tokens = tokens;
        self
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn capacity(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks nobody references (allocatable; some still hold cached content).
    pub fn free_count(&self) -> usize {
        self.free_len
    }

    /// Blocks referenced by requests.
    pub fn used_count(&self) -> usize {
        self.blocks.len() - self.free_len
    }

    /// Distinct hashes cached (referenced or not; copies count once).
    pub fn cached_count(&self) -> usize {
        self.cached.len()
    }

    /// Whether a block with this sequence hash is cached.
    pub fn is_cached(&self, seq: SequenceHash) -> bool {
        self.first_copy(seq).is_some()
    }

    /// The first cached copy of `seq`.
    #[inline]
    fn first_copy(&self, seq: SequenceHash) -> Option<BlockId> {
        let blocks = &self.blocks;
        self.cached
            .find(table_hash(seq), |&b| blocks[b as usize].seq == seq)
            .copied()
    }

    /// How many leading blocks of `seqs` are cached.
    pub fn match_prefix(&self, seqs: &[SequenceHash]) -> usize {
        seqs.iter()
            .take_while(|&&s| self.first_copy(s).is_some())
            .count()
    }

    /// References the cached blocks of `seqs` (all must be cached: see
    /// [`BlockPool::match_prefix`]); returns their ids, or None (changing nothing) when one is
    /// not cached.
    pub fn acquire(&mut self, seqs: &[SequenceHash]) -> Option<Vec<BlockId>> {
        let ids: Vec<BlockId> = seqs
            .iter()
            .map(|&s| self.first_copy(s))
            .collect::<Option<_>>()?;
        for &b in &ids {
            if self.blocks[b as usize].free {
                self.unlink(b);
            }
            self.blocks[b as usize].refs += 1;
        }
        Some(ids)
    }

    /// Takes `n` blocks from the head of the free list, evicting their cached content; None
    /// (changing nothing) when fewer than `n` are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        let mut out = Vec::with_capacity(n);
        self.allocate_into(n, &mut out).then_some(out)
    }

    /// [`BlockPool::allocate`] appending the blocks to `out`; false (changing nothing) when
    /// fewer than `n` are free.
    pub fn allocate_into(&mut self, n: usize, out: &mut Vec<BlockId>) -> bool {
        if n > self.free_len {
            return false;
        }
        if n > 2 {
            // The blocks to evict are the first n of the free list: find their hashes, then
            // read their cache entries ahead, so the misses overlap (see `warm`).
            let mut scratch = std::mem::take(&mut self.scratch);
            scratch.clear();
            let mut b = self.head;
            for _ in 0..n {
                let block = &self.blocks[b as usize];
                scratch.extend(block.seq());
                b = block.next;
            }
            self.warm(&scratch);
            self.scratch = scratch;
        }
        let mut evicted = Vec::new();
        for _ in 0..n {
            let b = self.head;
            self.unlink(b);
            if let Some(seq) = self.blocks[b as usize].seq() {
                self.uncache(seq, b);
                self.blocks[b as usize].has_seq = false;
                evicted.push(self.event_name(seq, b));
            }
            self.blocks[b as usize].refs = 1;
            out.push(b);
        }
        if !evicted.is_empty() {
            self.events.push(KvEvent::Removed {
                block_hashes: evicted,
            });
        }
        true
    }

    /// Reads the cache entries of `seqs` before a batch of changes to them. The reads do not
    /// depend on one another, so their cache misses overlap instead of coming one after
    /// another inside the changes.
    fn warm(&self, seqs: &[SequenceHash]) {
        let mut acc = 0u32;
        for s in seqs {
            acc ^= self.first_copy(*s).unwrap_or(0);
        }
        std::hint::black_box(acc);
    }

    /// Drops the cache entry of copy `b` of `seq` (block `b` still holds `seq`).
    fn uncache(&mut self, seq: SequenceHash, b: BlockId) {
        let blocks = &self.blocks;
        let Ok(first) = self
            .cached
            .find_entry(table_hash(seq), |&x| blocks[x as usize].seq == seq)
        else {
            debug_assert!(false, "evicting a block the cache does not name");
            return;
        };
        match self.copies.get_mut(&seq) {
            Some(list) => {
                if *first.get() == b {
                    // The first copy goes: promote another (it holds the same hash, so the
                    // entry stays where it is).
                    let mut first = first;
                    *first.get_mut() = list.pop().expect("copy lists are never empty");
                } else {
                    list.retain(|&x| x != b);
                }
                if list.is_empty() {
                    self.copies.remove(&seq);
                }
            }
            None => {
                first.remove();
            }
        }
    }

    /// The name of cached block `b` (holding `seq`) in events.
    #[inline]
    fn event_name(&self, seq: SequenceHash, b: BlockId) -> EngineHash {
        if self.event_tokens {
            engine_hash(seq)
        } else {
            EngineHash(u64::from(b))
        }
    }

    /// Caches a run of full, computed blocks of one request whose first block follows
    /// `parent` (None: the root; else its hash and the block holding it), and announces them
    /// in one `Stored` event. Blocks already cached are skipped (the run is split around them).
    pub fn cache(
        &mut self,
        parent: Option<(SequenceHash, BlockId)>,
        run: &[FullBlock<'_>],
        ns: Namespace,
    ) {
        // Split the run into stretches of newly cached blocks, one event each.
        let mut start: Option<usize> = None;
        for (i, fb) in run.iter().enumerate() {
            let claimed = self.claim(fb);
            match (claimed, start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    self.announce(parent, run, s..i, ns);
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            self.announce(parent, run, s..run.len(), ns);
        }
    }

    /// The `Stored` (or `StoredHashed`) event of `run[range]`, whose parent is the block
    /// before it in the run (or `parent` for the first).
    fn announce(
        &mut self,
        parent: Option<(SequenceHash, BlockId)>,
        run: &[FullBlock<'_>],
        range: std::ops::Range<usize>,
        ns: Namespace,
    ) {
        let before = match range.start {
            0 => parent,
            i => Some((run[i - 1].seq, run[i - 1].block)),
        };
        let blocks = &run[range];
        let block_hashes = blocks
            .iter()
            .map(|b| self.event_name(b.seq, b.block))
            .collect();
        let parent = before.map(|(seq, b)| self.event_name(seq, b));
        let event = if self.event_tokens {
            KvEvent::Stored(StoredBlocks {
                parent,
                block_hashes,
                token_ids: blocks.iter().fold(
                    Vec::with_capacity(blocks.len() * self.block_size),
                    |mut t, b| {
                        t.extend_from_slice(b.tokens);
                        t
                    },
                ),
                block_size: self.block_size,
                namespace: ns,
            })
        } else {
            KvEvent::StoredHashed(StoredHashed {
                parent,
                block_hashes,
                sequence_hashes: blocks.iter().map(|b| b.seq).collect(),
            })
        };
        self.events.push(event);
    }

    /// Marks `fb`'s block as a cached copy of its hash; false when it already holds one.
    fn claim(&mut self, fb: &FullBlock<'_>) -> bool {
        if self.blocks[fb.block as usize].has_seq {
            return false;
        }
        let blocks = &self.blocks;
        let seq = fb.seq;
        match self.cached.entry(
            table_hash(seq),
            |&x| blocks[x as usize].seq == seq,
            |&x| table_hash(blocks[x as usize].seq),
        ) {
            Entry::Occupied(_) => {
                self.copies.entry(seq).or_default().push(fb.block);
            }
            Entry::Vacant(v) => {
                v.insert(fb.block);
            }
        }
        let block = &mut self.blocks[fb.block as usize];
        block.seq = seq;
        block.has_seq = true;
        true
    }

    /// Drops one reference to each block, in the order given (pass a request's blocks last
    /// first); unreferenced blocks join the tail of the free list, keeping their content.
    pub fn release(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            let block = &mut self.blocks[b as usize];
            debug_assert!(block.refs > 0, "release of an unreferenced block");
            block.refs = block.refs.saturating_sub(1);
            if block.refs == 0 && !block.free {
                self.push_tail(b);
            }
        }
    }

    /// Forgets every cached hash (blocks in use keep their data but are no longer shared).
    pub fn clear(&mut self) {
        for b in &mut self.blocks {
            b.has_seq = false;
        }
        self.cached.clear();
        self.copies.clear();
        self.events.push(KvEvent::Cleared);
    }

    /// The events since the last call, in order.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    /// Moves the events since the last call to the end of `out`, in order.
    pub fn drain_events_into(&mut self, out: &mut Vec<KvEvent>) {
        out.append(&mut self.events);
    }

    fn push_tail(&mut self, b: u32) {
        let block = &mut self.blocks[b as usize];
        block.free = true;
        block.prev = self.tail;
        block.next = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.blocks[self.tail as usize].next = b;
        }
        self.tail = b;
        self.free_len += 1;
    }

    fn unlink(&mut self, b: u32) {
        let (prev, next) = {
            let block = &mut self.blocks[b as usize];
            block.free = false;
            (block.prev, block.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        self.free_len -= 1;
    }

    /// Checks the pool's internal invariants (tests and debug assertions).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut walked = 0;
        let mut b = self.head;
        let mut prev = NIL;
        while b != NIL {
            let block = &self.blocks[b as usize];
            if !block.free || block.refs != 0 || block.prev != prev {
                return Err(format!("free list broken at block {b}"));
            }
            walked += 1;
            if walked > self.blocks.len() {
                return Err("free list has a cycle".into());
            }
            prev = b;
            b = block.next;
        }
        if walked != self.free_len || prev != self.tail {
            return Err(format!(
                "free list holds {walked}, counted {}",
                self.free_len
            ));
        }
        let unreferenced = self.blocks.iter().filter(|b| b.refs == 0).count();
        if unreferenced != self.free_len {
            return Err(format!(
                "{unreferenced} unreferenced blocks, {} free",
                self.free_len
            ));
        }
        let mut count = 0;
        for &b in &self.cached {
            count += 1;
            let Some(seq) = self.blocks[b as usize].seq() else {
                return Err(format!("cache names block {b}, which holds no hash"));
            };
            if self.first_copy(seq) != Some(b) {
                return Err(format!("block {b} is not found under its hash"));
            }
        }
        for (seq, list) in &self.copies {
            for &b in list {
                count += 1;
                if self.blocks[b as usize].seq() != Some(*seq) {
                    return Err(format!("cache names block {b} for a hash it does not hold"));
                }
            }
            if self.first_copy(*seq).is_none() {
                return Err("a copy list without a first copy".into());
            }
        }
        let with_hash = self.blocks.iter().filter(|b| b.has_seq).count();
        if with_hash != count {
            return Err(format!(
                "{with_hash} blocks hold hashes, {count} named by the cache"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
