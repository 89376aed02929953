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

use kvroute_core::{EngineHash, KvEvent, Namespace, SequenceHash, StoredBlocks, StoredHashed};

type Map<K, V> = hashbrown::HashMap<K, V, foldhash::fast::RandomState>;

/// Index of a block in the pool.
pub type BlockId = u32;

/// Most blocks in a pool: ids and links take 30 bits, so two flag bits fit beside them.
pub const MAX_BLOCKS: usize = NIL as usize;

/// No block (the end of a list or chain).
const NIL: u32 = (1 << 30) - 1;
/// In [`Block::chain`]: the block holds a cached hash.
const HAS_SEQ: u32 = 1 << 31;
/// In [`Block::chain`]: the block is the first cached copy of its hash (linked in its bucket).
const FIRST: u32 = 1 << 30;
/// In [`Block::link`]: the block is on the free list.
const FREE: u32 = 1 << 31;
/// The block id bits of a link (`chain` or `link`).
const ID: u32 = NIL;

/// The engine's own hash of a cached block (opaque to the router).
pub fn engine_hash(seq: SequenceHash) -> EngineHash {
    EngineHash(seq.0.rotate_left(29) ^ 0x5eed_cafe_f00d_d00d)
}

/// A pool block: 16 bytes, so that eight engines' pools stay small next to the router's
/// tables (the pools are read at random: every eviction takes the least recently used block).
#[derive(Clone, Copy, Debug)]
struct Block {
    /// The sequence hash of its cached content, when `chain & HAS_SEQ`.
    seq: SequenceHash,
    /// The next first copy in its cache bucket (`& ID`, NIL at the end), with the flags
    /// `HAS_SEQ` and `FIRST`.
    chain: u32,
    /// On the free list (`FREE` set): the previous free block (`& ID`). Otherwise its
    /// reference count.
    link: u32,
}

impl Block {
    const EMPTY: Self = Self {
        seq: SequenceHash(0),
        chain: NIL,
        link: 0,
    };

    /// The hash of the cached content, if any.
    #[inline]
    fn seq(&self) -> Option<SequenceHash> {
        (self.chain & HAS_SEQ != 0).then_some(self.seq)
    }

    #[inline]
    fn has_seq(&self) -> bool {
        self.chain & HAS_SEQ != 0
    }

    #[inline]
    fn free(&self) -> bool {
        self.link & FREE != 0
    }

    /// The next first copy in the bucket.
    #[inline]
    fn next_in_bucket(&self) -> u32 {
        self.chain & ID
    }
}

const _: () = assert!(std::mem::size_of::<Block>() == 16);

/// The block pool. See the module documentation.
///
/// The cache finds each hash's first cached copy by hashing into buckets whose first copies
/// are chained through the blocks themselves (`Block::chain`): a lookup reads a bucket head
/// and the blocks of its chain (with at least twice as many buckets as blocks, chains are
/// short), and nothing but the heads lives outside the blocks.
#[derive(Clone, Debug)]
pub struct BlockPool {
    block_size: usize,
    blocks: Vec<Block>,
    /// Free-list successors, by block (meaningful for free blocks): the eviction walk reads
    /// this dense array rather than whole blocks.
    next: Vec<u32>,
    /// The head of each cache bucket's chain of first copies (NIL when empty); a power of
    /// two long.
    heads: Vec<u32>,
    /// `64 - log2(heads.len())`.
    shift: u32,
    /// Distinct hashes cached.
    cached_len: usize,
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
    /// A pool of `num_blocks` free, empty blocks (at most [`MAX_BLOCKS`]).
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        let n = num_blocks.min(MAX_BLOCKS);
        let buckets = (2 * n).max(2).next_power_of_two();
        let mut pool = Self {
            block_size,
            blocks: vec![Block::EMPTY; n],
            next: vec![NIL; n],
            heads: vec![NIL; buckets],
            shift: 64 - buckets.trailing_zeros(),
            cached_len: 0,
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
        self.cached_len
    }

    /// Whether a block with this sequence hash is cached.
    pub fn is_cached(&self, seq: SequenceHash) -> bool {
        self.first_copy(seq).is_some()
    }

    /// The first cached copy of `seq`.
    #[inline]
    fn first_copy(&self, seq: SequenceHash) -> Option<BlockId> {
        let mut b = self.heads[self.bucket(seq)];
        while b != NIL {
            let block = &self.blocks[b as usize];
            if block.seq == seq {
                return Some(b);
            }
            b = block.next_in_bucket();
        }
        None
    }

    /// The cache bucket of `seq` (multiplicative hashing: the top bits of the product).
    #[inline]
    fn bucket(&self, seq: SequenceHash) -> usize {
        (seq.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
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
            if self.blocks[b as usize].free() {
                self.unlink(b);
            }
            self.blocks[b as usize].link += 1;
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
                scratch.extend(self.blocks[b as usize].seq());
                b = self.next[b as usize];
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
                self.blocks[b as usize].chain = NIL;
                evicted.push(self.event_name(seq, b));
            }
            self.blocks[b as usize].link = 1;
            out.push(b);
        }
        if !evicted.is_empty() {
            self.events.push(KvEvent::Removed {
                block_hashes: evicted,
            });
        }
        true
    }

    /// Reads the cache buckets of `seqs`, and the first block of each bucket's chain, before
    /// a batch of changes to them. The reads for one hash do not depend on those for
    /// another, so their cache misses overlap instead of coming one after another inside the
    /// changes (which walk the chains from their first block).
    fn warm(&self, seqs: &[SequenceHash]) {
        let mut acc = 0u32;
        for s in seqs {
            let head = self.heads[self.bucket(*s)];
            if let Some(block) = self.blocks.get(head as usize) {
                acc ^= block.chain;
            }
        }
        std::hint::black_box(acc);
    }

    /// Drops the cache entry of copy `b` of `seq` (block `b` still holds `seq`).
    fn uncache(&mut self, seq: SequenceHash, b: BlockId) {
        let first = self.blocks[b as usize].chain & FIRST != 0;
        let rest = self.blocks[b as usize].chain & ID;
        let Some(list) = self.copies.get_mut(&seq) else {
            debug_assert!(first, "evicting a block the cache does not name");
            self.relink(seq, b, rest);
            self.cached_len -= 1;
            return;
        };
        // With other copies left, the hash stays cached: when the first copy goes, another
        // takes its place in the chain.
        let promoted = if first {
            Some(list.pop().expect("copy lists are never empty"))
        } else {
            list.retain(|&x| x != b);
            None
        };
        if list.is_empty() {
            self.copies.remove(&seq);
        }
        if let Some(c) = promoted {
            self.blocks[c as usize].chain = HAS_SEQ | FIRST | rest;
            self.relink(seq, b, c);
        }
    }

    /// Points whatever names first copy `b` in the bucket of `seq` (the head or the block
    /// before it) at `to` instead.
    fn relink(&mut self, seq: SequenceHash, b: BlockId, to: u32) {
        let bucket = self.bucket(seq);
        let mut x = self.heads[bucket];
        if x == b {
            self.heads[bucket] = to;
            return;
        }
        while x != NIL {
            let block = &mut self.blocks[x as usize];
            let next = block.next_in_bucket();
            if next == b {
                block.chain = (block.chain & !ID) | to;
                return;
            }
            x = next;
        }
        debug_assert!(false, "a first copy missing from its bucket");
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
        if run.len() > 2 {
            let mut scratch = std::mem::take(&mut self.scratch);
            scratch.clear();
            scratch.extend(run.iter().map(|fb| fb.seq));
            self.warm(&scratch);
            self.scratch = scratch;
        }
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
                block_keys: Vec::new(),
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
        if self.blocks[fb.block as usize].has_seq() {
            return false;
        }
        let seq = fb.seq;
        let chain = if self.first_copy(seq).is_some() {
            self.copies.entry(seq).or_default().push(fb.block);
            HAS_SEQ | NIL
        } else {
            let bucket = self.bucket(seq);
            let rest = std::mem::replace(&mut self.heads[bucket], fb.block);
            self.cached_len += 1;
            HAS_SEQ | FIRST | rest
        };
        let block = &mut self.blocks[fb.block as usize];
        block.seq = seq;
        block.chain = chain;
        true
    }

    /// Drops one reference to each block, in the order given (pass a request's blocks last
    /// first); unreferenced blocks join the tail of the free list, keeping their content.
    pub fn release(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            let block = &mut self.blocks[b as usize];
            if block.free() {
                debug_assert!(false, "release of an unreferenced block");
                continue;
            }
            debug_assert!(block.link > 0, "release of an unreferenced block");
            block.link = block.link.saturating_sub(1);
            if block.link == 0 {
                self.push_tail(b);
            }
        }
    }

    /// Forgets every cached hash (blocks in use keep their data but are no longer shared).
    pub fn clear(&mut self) {
        for b in &mut self.blocks {
            b.chain = NIL;
        }
        self.heads.fill(NIL);
        self.cached_len = 0;
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
        self.blocks[b as usize].link = FREE | self.tail;
        self.next[b as usize] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.free_len += 1;
    }

    /// Takes free block `b` off the free list (its reference count is then 0).
    fn unlink(&mut self, b: u32) {
        let prev = self.blocks[b as usize].link & ID;
        let next = self.next[b as usize];
        self.blocks[b as usize].link = 0;
        if prev == NIL {
            self.head = next;
        } else {
            self.next[prev as usize] = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            let n = &mut self.blocks[next as usize].link;
            *n = FREE | prev;
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
            if !block.free() || block.link & ID != prev {
                return Err(format!("free list broken at block {b}"));
            }
            walked += 1;
            if walked > self.blocks.len() {
                return Err("free list has a cycle".into());
            }
            prev = b;
            b = self.next[b as usize];
        }
        if walked != self.free_len || prev != self.tail {
            return Err(format!(
                "free list holds {walked}, counted {}",
                self.free_len
            ));
        }
        let unreferenced = self.blocks.iter().filter(|b| b.free()).count();
        if unreferenced != self.free_len {
            return Err(format!(
                "{unreferenced} unreferenced blocks, {} free",
                self.free_len
            ));
        }
        if let Some(b) = self.blocks.iter().position(|b| !b.free() && b.link == 0) {
            return Err(format!("block {b} is neither referenced nor free"));
        }
        let mut firsts = 0;
        for (bucket, &head) in self.heads.iter().enumerate() {
            let mut b = head;
            while b != NIL {
                firsts += 1;
                if firsts > self.blocks.len() {
                    return Err("a cache chain has a cycle".into());
                }
                let block = &self.blocks[b as usize];
                let Some(seq) = block.seq() else {
                    return Err(format!("cache names block {b}, which holds no hash"));
                };
                if block.chain & FIRST == 0 || self.bucket(seq) != bucket {
                    return Err(format!("block {b} is chained in the wrong bucket"));
                }
                if self.first_copy(seq) != Some(b) {
                    return Err(format!("block {b} is not found under its hash"));
                }
                b = block.next_in_bucket();
            }
        }
        if firsts != self.cached_len {
            return Err(format!(
                "{firsts} first copies chained, {} counted",
                self.cached_len
            ));
        }
        let mut count = firsts;
        for (seq, list) in &self.copies {
            for &b in list {
                count += 1;
                let block = &self.blocks[b as usize];
                if block.seq() != Some(*seq) || block.chain & FIRST != 0 {
                    return Err(format!("cache names block {b} for a hash it does not hold"));
                }
            }
            if list.is_empty() || self.first_copy(*seq).is_none() {
                return Err("a copy list without a first copy".into());
            }
        }
        let with_hash = self.blocks.iter().filter(|b| b.has_seq()).count();
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
