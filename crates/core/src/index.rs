//! The prefix index: which worker holds which prefix blocks, fed by the engines' KV events.
//!
//! # Structure
//! The index is a radix tree of blocks stored *flat*: a node is named by the chained
//! [`SequenceHash`] of its prefix (which encodes the whole path from the root, so "node at depth
//! `i` of this prompt" is one hash-table probe and a match is always a contiguous prefix), and
//! holds the set of workers that have it cached as a bitset split in words: 64-worker words
//! in 16-byte entries, or, for an index of at most 8 workers, 8-worker words packed with 56
//! bits of their key in 8-byte entries. The table maps `(sequence hash, word)` to that word,
//! so a node costs one entry per non-empty word and needs no pointers. Because every depth's
//! key is known before the walk starts, the probes of a lookup are independent and overlap in
//! the memory system.
//!
//! Each worker also has a table from the engine's own block hash to the sequence hash, used
//! only to resolve the parent of a stored chain and to apply removals; it keeps the blocks in
//! the order they were stored, so the oldest go first when a worker holds more than the
//! per-worker limit. A (block, worker) entry costs a 16-byte log entry and an 8-byte name
//! entry of that table, and its share of a node entry (about 56 bytes in all at 10M entries;
//! see docs/benchmarks.md).
//!
//! A 64-bit sequence-hash collision between two different prefixes (about 3e-6 for 10M live
//! blocks) would make one prefix look cached where it is not: a routing mistake, never a
//! panic. The same holds for `(hash, word)` keys (compared on 56 bits in packed entries).

mod approx;
mod engine_table;
mod event;
mod table;

pub use approx::{ApproxConfig, ApproxIndex, CapacityLearner};
pub use engine_table::{MAX_BLOCK_IDS, MAX_ENTRIES as MAX_BLOCKS_PER_WORKER};
pub use event::{EventStats, IndexError, KvEvent, RejectKind, StoredBlocks, StoredHashed};

use crate::hashing::{
    chain, extend_sequence_hashes, local_block_hash, EngineHash, LocalBlockHash, SequenceHash,
};
use crate::types::{BlockSize, WorkerId};
use foldhash::fast::RandomState;
use hashbrown::hash_map::Entry;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

type Map<K, V> = hashbrown::HashMap<K, V, RandomState>;

use engine_table::EngineTable;
use table::{table_bytes, NodeTable};

/// What [`PrefixIndex::apply_batch`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Events applied in full.
    pub applied: usize,
    /// Rejected events, in batch order.
    pub rejected: Vec<IndexError>,
}

/// The default limit on workers tracked by one index.
pub const DEFAULT_MAX_WORKERS: usize = 4096;

/// Most blocks per worker [`PrefixIndex::reserve`] makes room for ahead of use.
pub const MAX_RESERVED_BLOCKS: usize = 1 << 17;

/// Matched prefix depth (in blocks) per worker, for workers that matched at least one block,
/// sorted by worker.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Matches {
    entries: Vec<(WorkerId, usize)>,
}

impl Matches {
    /// Matches from explicit `(worker, depth)` pairs (depth-0 pairs are dropped).
    pub fn from_pairs(mut entries: Vec<(WorkerId, usize)>) -> Self {
        entries.retain(|e| e.1 > 0);
        entries.sort_unstable();
        entries.dedup_by_key(|e| e.0);
        Self { entries }
    }

    /// Per worker, the deeper of `a`'s and `b`'s matches.
    pub fn deepest(a: &Matches, b: &Matches) -> Self {
        let mut entries: Vec<(WorkerId, usize)> = a.iter().chain(b.iter()).collect();
        entries.sort_unstable_by(|x, y| x.0.cmp(&y.0).then(y.1.cmp(&x.1)));
        entries.dedup_by_key(|e| e.0);
        Self { entries }
    }

    /// The matched depth of `worker` (0 when it matched nothing).
    pub fn depth(&self, worker: WorkerId) -> usize {
        self.entries
            .binary_search_by_key(&worker, |e| e.0)
            .map(|i| self.entries[i].1)
            .unwrap_or(0)
    }

    /// `(worker, depth)` pairs with depth > 0, sorted by worker.
    pub fn iter(&self) -> impl Iterator<Item = (WorkerId, usize)> + '_ {
        self.entries.iter().copied()
    }

    /// The deepest match of any worker.
    pub fn max_depth(&self) -> usize {
        self.entries.iter().map(|e| e.1).max().unwrap_or(0)
    }

    /// True when no worker matched a block.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// One worker's view of its cache: engine hash to router sequence hash.
struct Slot {
    worker: WorkerId,
    /// Engine hash -> sequence hash of every block the worker holds.
    blocks: EngineTable,
    /// Sequence hashes the worker holds under more than one engine hash: the extra count.
    dups: Map<u64, u32>,
    /// Engine hashes stored more than once (engines such as vLLM may cache several physical
    /// copies of one hash and report each copy's store and eviction): the extra count.
    copies: Map<u64, u32>,
    /// Distinct sequence hashes held (= (block, worker) entries of this worker).
    held: usize,
    /// Blocks reserved ahead for it ([`PrefixIndex::reserve`]).
    reserved: usize,
    /// Blocks dropped from the index to keep the worker under the limit.
    evicted: u64,
}

impl Slot {
    fn new(worker: WorkerId) -> Self {
        Self {
            worker,
            blocks: EngineTable::default(),
            dups: Map::default(),
            copies: Map::default(),
            held: 0,
            reserved: 0,
            evicted: 0,
        }
    }

    /// Drops the oldest names until at most `limit` are held; the number dropped.
    fn evict_past(&mut self, nodes: &mut NodeTable, ix: usize, limit: usize) -> u64 {
        let mut evicted = 0;
        while self.blocks.len() > limit {
            let Some((engine, seq)) = self.blocks.pop_oldest() else {
                break;
            };
            self.copies.remove(&engine);
            release(nodes, self, ix, seq);
            evicted += 1;
        }
        self.evicted += evicted;
        evicted
    }
}

/// Blocks a worker may hold in one index unless configured: past it the oldest are dropped
/// from the index (the engine may still hold them: a predicted miss, never a wrong hit).
pub const DEFAULT_MAX_BLOCKS_PER_WORKER: usize = 1 << 22;

/// The prefix index. See the module documentation.
pub struct PrefixIndex {
    block_size: BlockSize,
    max_workers: usize,
    max_blocks_per_worker: usize,
    /// `(sequence hash, word)` -> bits of the workers of that word holding the block.
    nodes: NodeTable,
    slots: Vec<Option<Slot>>,
    slot_of: Map<WorkerId, usize>,
    free_slots: BinaryHeap<Reverse<usize>>,
    stats: EventStats,
}

impl PrefixIndex {
    /// An empty index for engines with blocks of `block_size` tokens.
    pub fn new(block_size: BlockSize) -> Self {
        Self::with_max_workers(block_size, DEFAULT_MAX_WORKERS)
    }

    /// An empty index tracking at most `max_workers` workers at a time.
    pub fn with_max_workers(block_size: BlockSize, max_workers: usize) -> Self {
        Self {
            block_size,
            max_workers,
            max_blocks_per_worker: DEFAULT_MAX_BLOCKS_PER_WORKER,
            nodes: NodeTable::for_workers(max_workers),
            slots: Vec::new(),
            slot_of: Map::default(),
            free_slots: BinaryHeap::new(),
            stats: EventStats::default(),
        }
    }

    /// The block size events must carry.
    pub fn block_size(&self) -> BlockSize {
        self.block_size
    }

    /// Keeps at most `limit` blocks (at least 1, at most [`MAX_BLOCKS_PER_WORKER`]) per
    /// worker from now on: past it the oldest stored are dropped from the index and counted
    /// ([`PrefixIndex::evicted`]).
    pub fn set_max_blocks_per_worker(&mut self, limit: usize) {
        self.max_blocks_per_worker = limit.clamp(1, MAX_BLOCKS_PER_WORKER);
        for ix in 0..self.slots.len() {
            self.enforce_limit(ix);
        }
    }

    /// Blocks of `worker` dropped to keep it under the limit since it was registered.
    pub fn evicted(&self, worker: WorkerId) -> u64 {
        self.slot_of
            .get(&worker)
            .and_then(|&ix| self.slots[ix].as_ref())
            .map_or(0, |s| s.evicted)
    }

    fn enforce_limit(&mut self, ix: usize) {
        if let Some(slot) = self.slots[ix].as_mut() {
            let evicted = slot.evict_past(&mut self.nodes, ix, self.max_blocks_per_worker);
            self.stats.blocks_evicted += evicted;
        }
    }

    /// Applies one event of `worker`. A rejected event leaves the index unchanged (but for the
    /// known hashes of a partly unknown removal, which are removed) and is counted.
    pub fn apply(&mut self, worker: WorkerId, event: &KvEvent) -> Result<(), IndexError> {
        let result = match event {
            KvEvent::Stored(s) => self.apply_stored(worker, s),
            KvEvent::Removed { block_hashes } => self.apply_removed(worker, block_hashes),
            KvEvent::StoredHashed(s) => self.apply_stored_hashed(worker, s),
            KvEvent::Cleared => {
                self.clear_worker(worker);
                Ok(())
            }
        };
        match &result {
            Ok(()) => self.stats.applied += 1,
            Err(e) => self.stats.count_rejection(e.kind()),
        }
        result
    }

    fn apply_stored(&mut self, worker: WorkerId, s: &StoredBlocks) -> Result<(), IndexError> {
        let seqs = self.chain_stored(worker, s, |p| self.sequence_of(worker, p))?;
        let slot_ix = self.slot_for(worker)?;
        let slot = self.slots[slot_ix]
            .as_mut()
            .expect("slot_for returns a live slot");
        // Reading ahead pays when several misses can overlap; for one or two blocks it is
        // only extra probes.
        if seqs.len() > 2 {
            self.nodes.warm(seqs.iter().map(|q| q.0), slot_ix);
            slot.blocks.warm(s.block_hashes.iter().map(|h| h.0));
        }
        for (h, seq) in s.block_hashes.iter().zip(&seqs) {
            store(&mut self.nodes, slot, slot_ix, h.0, seq.0, true);
        }
        self.stats.blocks_stored += s.block_hashes.len() as u64;
        self.enforce_limit(slot_ix);
        Ok(())
    }

    /// The sequence hashes of a stored chain, after checking the event's block size, token
    /// count and extra keys and that `worker` has or can get a slot; `parent` finds the
    /// sequence hash of the chain's parent block (a chain without one starts at its
    /// namespace's root). Changes nothing.
    pub(crate) fn chain_stored(
        &self,
        worker: WorkerId,
        s: &StoredBlocks,
        parent: impl FnOnce(EngineHash) -> Option<SequenceHash>,
    ) -> Result<Vec<SequenceHash>, IndexError> {
        let bs = self.block_size.get();
        if s.block_size != bs {
            return Err(IndexError::BlockSizeMismatch {
                worker,
                expected: bs,
                got: s.block_size,
            });
        }
        if s.block_hashes.len().checked_mul(bs) != Some(s.token_ids.len()) {
            return Err(IndexError::TokenCountMismatch {
                worker,
                tokens: s.token_ids.len(),
                blocks: s.block_hashes.len(),
                block_size: bs,
            });
        }
        if !s.block_keys.is_empty() && s.block_keys.len() != s.block_hashes.len() {
            return Err(IndexError::KeyCountMismatch {
                worker,
                keys: s.block_keys.len(),
                blocks: s.block_hashes.len(),
            });
        }
        self.check_slot(worker)?;
        let mut prev = match s.parent {
            None => s.namespace.root(),
            Some(p) => Some(parent(p).ok_or(IndexError::UnknownParent {
                worker,
                parent: p.0,
            })?),
        };
        Ok(s.token_ids
            .chunks_exact(bs)
            .enumerate()
            .map(|(i, tokens)| {
                let local = match s.block_keys.get(i) {
                    Some(&key) if key != 0 => local_block_hash(tokens).keyed(key),
                    _ => local_block_hash(tokens),
                };
                let seq = chain(prev, local);
                prev = Some(seq);
                seq
            })
            .collect())
    }

    /// The sequence hash of the block `worker` holds under engine hash `engine`.
    pub fn sequence_of(&self, worker: WorkerId, engine: EngineHash) -> Option<SequenceHash> {
        let &ix = self.slot_of.get(&worker)?;
        self.slots[ix]
            .as_ref()?
            .blocks
            .get(engine.0)
            .map(SequenceHash)
    }

    fn apply_stored_hashed(
        &mut self,
        worker: WorkerId,
        s: &StoredHashed,
    ) -> Result<(), IndexError> {
        if s.sequence_hashes.len() != s.block_hashes.len() {
            return Err(IndexError::HashCountMismatch {
                worker,
                sequence: s.sequence_hashes.len(),
                blocks: s.block_hashes.len(),
            });
        }
        let slot_ix = self.slot_for(worker)?;
        let slot = self.slots[slot_ix]
            .as_mut()
            .expect("slot_for returns a live slot");
        if let Some(p) = s.parent {
            if !slot.blocks.contains(p.0) {
                return Err(IndexError::UnknownParent {
                    worker,
                    parent: p.0,
                });
            }
        }
        if s.block_hashes.len() > 2 {
            self.nodes
                .warm(s.sequence_hashes.iter().map(|q| q.0), slot_ix);
            slot.blocks.warm(s.block_hashes.iter().map(|h| h.0));
        }
        for (h, seq) in s.block_hashes.iter().zip(&s.sequence_hashes) {
            store(&mut self.nodes, slot, slot_ix, h.0, seq.0, true);
        }
        self.stats.blocks_stored += s.block_hashes.len() as u64;
        self.enforce_limit(slot_ix);
        Ok(())
    }

    fn apply_removed(&mut self, worker: WorkerId, hashes: &[EngineHash]) -> Result<(), IndexError> {
        let Some(&slot_ix) = self.slot_of.get(&worker) else {
            if hashes.is_empty() {
                return Ok(());
            }
            return Err(IndexError::UnknownRemovedHash {
                worker,
                unknown: hashes.len(),
                total: hashes.len(),
            });
        };
        if hashes.len() > 1 {
            self.warm_removals(slot_ix, hashes.iter().map(|h| h.0));
        }
        let slot = self.slots[slot_ix].as_mut().expect("mapped slots are live");
        let mut unknown = 0;
        for h in hashes {
            if !unstore(&mut self.nodes, slot, slot_ix, h.0) {
                unknown += 1;
            }
        }
        self.stats.blocks_removed += (hashes.len() - unknown) as u64;
        if unknown > 0 {
            return Err(IndexError::UnknownRemovedHash {
                worker,
                unknown,
                total: hashes.len(),
            });
        }
        Ok(())
    }

    /// Reads ahead for removals of `engine` hashes of a slot (see `warm`): the engine hashes,
    /// then the nodes they name.
    fn warm_removals(&self, slot_ix: usize, engine: impl Iterator<Item = u64>) {
        let Some(slot) = &self.slots[slot_ix] else {
            return;
        };
        let seqs = slot.blocks.get_many(engine);
        self.nodes.warm(seqs.into_iter(), slot_ix);
    }

    /// Applies the events of one batch of `worker` in order (engines publish one batch per
    /// scheduler step), reading ahead across runs of removals: engines report each evicted
    /// block in an event of its own, so per-event read-ahead would not overlap anything.
    /// Every event is applied or rejected as by [`PrefixIndex::apply`].
    pub fn apply_batch(&mut self, worker: WorkerId, events: &[KvEvent]) -> BatchOutcome {
        let mut out = BatchOutcome::default();
        self.apply_batch_with(worker, events, |_, r| match r {
            Ok(()) => out.applied += 1,
            Err(err) => out.rejected.push(err),
        });
        out
    }

    /// [`PrefixIndex::apply_batch`], telling `each` every event's result by its position.
    pub fn apply_batch_with(
        &mut self,
        worker: WorkerId,
        events: &[KvEvent],
        mut each: impl FnMut(usize, Result<(), IndexError>),
    ) {
        let mut i = 0;
        while i < events.len() {
            let run = events[i..]
                .iter()
                .take_while(|e| matches!(e, KvEvent::Removed { .. }))
                .count()
                .max(1);
            if run > 1 {
                if let Some(&slot_ix) = self.slot_of.get(&worker) {
                    let hashes = events[i..i + run].iter().flat_map(|e| match e {
                        KvEvent::Removed { block_hashes } => block_hashes.as_slice(),
                        _ => &[],
                    });
                    self.warm_removals(slot_ix, hashes.map(|h| h.0));
                }
            }
            for (k, e) in events[i..i + run].iter().enumerate() {
                each(i + k, self.apply(worker, e));
            }
            i += run;
        }
    }

    /// Inserts a chain of blocks for `worker` without an engine event, using each block's
    /// sequence hash as its engine hash (the approximate mode's bookkeeping). Returns the
    /// sequence hashes inserted.
    pub(crate) fn insert_chain(
        &mut self,
        worker: WorkerId,
        seqs: &[SequenceHash],
    ) -> Result<(), IndexError> {
        let slot_ix = self.slot_for(worker)?;
        let slot = self.slots[slot_ix]
            .as_mut()
            .expect("slot_for returns a live slot");
        for s in seqs {
            store(&mut self.nodes, slot, slot_ix, s.0, s.0, false);
        }
        self.enforce_limit(slot_ix);
        Ok(())
    }

    /// Removes one block of `worker` by engine hash; false when it was not held.
    pub(crate) fn remove_block(&mut self, worker: WorkerId, engine_hash: u64) -> bool {
        let Some(&slot_ix) = self.slot_of.get(&worker) else {
            return false;
        };
        let slot = self.slots[slot_ix].as_mut().expect("mapped slots are live");
        unstore(&mut self.nodes, slot, slot_ix, engine_hash)
    }

    /// Whether `worker` has a slot or can be given one.
    pub(crate) fn check_slot(&self, worker: WorkerId) -> Result<(), IndexError> {
        if self.slot_of.contains_key(&worker) || self.slot_of.len() < self.max_workers {
            Ok(())
        } else {
            Err(IndexError::TooManyWorkers {
                worker,
                limit: self.max_workers,
            })
        }
    }

    fn slot_for(&mut self, worker: WorkerId) -> Result<usize, IndexError> {
        if let Some(&ix) = self.slot_of.get(&worker) {
            return Ok(ix);
        }
        self.check_slot(worker)?;
        let ix = match self.free_slots.pop() {
            Some(Reverse(ix)) => ix,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.slots[ix] = Some(Slot::new(worker));
        self.slot_of.insert(worker, ix);
        Ok(ix)
    }

    /// Registers a worker with an empty cache (no-op when known). Workers are also registered
    /// by their first stored event.
    pub fn add_worker(&mut self, worker: WorkerId) -> Result<(), IndexError> {
        self.slot_for(worker).map(|_| ())
    }

    /// Makes room for `blocks` blocks of `worker` (its KV capacity, when known), so its
    /// tables do not grow by rehashing while its cache fills. At most
    /// [`MAX_RESERVED_BLOCKS`] are reserved ahead; beyond that the tables grow as needed.
    pub fn reserve(&mut self, worker: WorkerId, blocks: usize) {
        let Some(&ix) = self.slot_of.get(&worker) else {
            return;
        };
        let slot = self.slots[ix].as_mut().expect("mapped slots are live");
        let blocks = blocks.min(MAX_RESERVED_BLOCKS);
        slot.blocks.reserve(blocks);
        slot.reserved = blocks;
        // Room for the reservations of the workers registered now, together (shared blocks
        // make it an upper bound).
        let total: usize = self.slots.iter().flatten().map(|s| s.reserved).sum();
        self.nodes.reserve(total.saturating_sub(self.nodes.len()));
    }

    /// Tells the index that `worker`'s engine names its blocks by their index in a pool of
    /// `blocks` blocks (as the fleet simulator's engines do), so those names are kept in an
    /// array instead of a hash map: the same answers, fewer cache misses. Any other name
    /// still works. False (nothing changed) for an unknown worker or more than
    /// [`MAX_BLOCK_IDS`] blocks.
    pub fn use_block_ids(&mut self, worker: WorkerId, blocks: usize) -> bool {
        let Some(&ix) = self.slot_of.get(&worker) else {
            return false;
        };
        let slot = self.slots[ix].as_mut().expect("mapped slots are live");
        slot.blocks.use_block_ids(blocks)
    }

    /// Drops every block of `worker` but keeps it registered.
    pub fn clear_worker(&mut self, worker: WorkerId) {
        let Some(&ix) = self.slot_of.get(&worker) else {
            return;
        };
        let slot = self.slots[ix].as_mut().expect("mapped slots are live");
        for (_, seq) in slot.blocks.iter() {
            self.nodes.clear_bit(seq, ix);
        }
        slot.blocks.clear();
        slot.dups = Map::default();
        slot.copies = Map::default();
        slot.held = 0;
    }

    /// Forgets `worker` and all its blocks.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        self.clear_worker(worker);
        if let Some(ix) = self.slot_of.remove(&worker) {
            self.slots[ix] = None;
            self.free_slots.push(Reverse(ix));
        }
    }

    /// Registered workers, in slot order.
    pub fn workers(&self) -> impl Iterator<Item = WorkerId> + '_ {
        self.slots.iter().flatten().map(|s| s.worker)
    }

    /// Distinct blocks `worker` holds (0 when unknown).
    pub fn block_count(&self, worker: WorkerId) -> usize {
        self.slot_of
            .get(&worker)
            .and_then(|&ix| self.slots[ix].as_ref())
            .map_or(0, |s| s.held)
    }

    /// Every block `worker` holds as `(engine hash, sequence hash)`, an engine hash held in
    /// several copies once per copy: applied to an empty worker as one `StoredHashed`
    /// event, they give it the same blocks (a snapshot).
    pub fn export_worker(&self, worker: WorkerId) -> Vec<(EngineHash, SequenceHash)> {
        let Some(slot) = self
            .slot_of
            .get(&worker)
            .and_then(|&ix| self.slots[ix].as_ref())
        else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(slot.blocks.len());
        for (name, seq) in slot.blocks.iter() {
            let copies = 1 + slot.copies.get(&name).copied().unwrap_or(0) as usize;
            for _ in 0..copies {
                out.push((EngineHash(name), SequenceHash(seq)));
            }
        }
        out
    }

    /// Total `(block, worker)` entries.
    pub fn entries(&self) -> usize {
        self.slots.iter().flatten().map(|s| s.held).sum()
    }

    /// Whether `worker` holds the block with sequence hash `seq`.
    pub fn contains(&self, worker: WorkerId, seq: SequenceHash) -> bool {
        self.slot_of
            .get(&worker)
            .is_some_and(|&ix| self.nodes.has_bit(seq.0, ix))
    }

    /// Event counters.
    pub fn stats(&self) -> &EventStats {
        &self.stats
    }

    /// Bytes held by the index's tables (hash tables at their allocated size).
    pub fn memory_bytes(&self) -> usize {
        let mut total = self.nodes.bytes()
            + table_bytes::<WorkerId, usize>(self.slot_of.capacity())
            + self.slots.capacity() * std::mem::size_of::<Option<Slot>>()
            + self.free_slots.capacity() * std::mem::size_of::<usize>();
        for s in self.slots.iter().flatten() {
            total += s.blocks.bytes()
                + table_bytes::<u64, u32>(s.dups.capacity())
                + table_bytes::<u64, u32>(s.copies.capacity());
        }
        total
    }

    /// Matched depth per worker for a prompt given by its local block hashes.
    pub fn find_matches(&self, locals: &[LocalBlockHash]) -> Matches {
        let mut seqs = Vec::with_capacity(locals.len());
        extend_sequence_hashes(None, locals, &mut seqs);
        self.find_matches_seq(&seqs)
    }

    /// Matched depth per worker for a prompt given by its sequence hashes: for each worker,
    /// the number of leading blocks it holds without a gap. Stops as soon as no worker is left.
    pub fn find_matches_seq(&self, seqs: &[SequenceHash]) -> Matches {
        let word_bits = self.nodes.word_bits();
        let words = self.slots.len().div_ceil(word_bits);
        let mut entries = Vec::new();
        let Some(first) = seqs.first() else {
            return Matches { entries };
        };
        // Each word (group of workers) that holds the first block is walked on its own: a
        // branch-light loop whose probes do not depend on one another, so they overlap.
        for word in 0..words {
            let mut active = self.word(first.0, word);
            let mut depth = 1;
            while active != 0 && depth < seqs.len() {
                let next = active & self.word(seqs[depth].0, word);
                self.record(active & !next, word * word_bits, depth, &mut entries);
                active = next;
                depth += 1;
            }
            self.record(active, word * word_bits, depth, &mut entries);
        }
        entries.sort_unstable();
        Matches { entries }
    }

    #[inline]
    fn word(&self, seq: u64, word: usize) -> u64 {
        self.nodes.word(seq, word)
    }

    #[inline]
    fn record(&self, mut bits: u64, first: usize, depth: usize, out: &mut Vec<(WorkerId, usize)>) {
        while bits != 0 {
            let b = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if let Some(slot) = &self.slots[first + b] {
                out.push((slot.worker, depth));
            }
        }
    }
}

/// Records that the slot holds block `seq` under `engine`. A repeated store of the same
/// block counts as one more copy when `count_copies` (engine events), else it is a refresh.
fn store(
    nodes: &mut NodeTable,
    slot: &mut Slot,
    ix: usize,
    engine: u64,
    seq: u64,
    count_copies: bool,
) {
    let before = slot.blocks.insert(engine, seq);
    match before {
        Some(old) if old == seq => {
            if count_copies {
                let c = slot.copies.entry(engine).or_insert(0);
                *c = c.saturating_add(1);
            }
            return;
        }
        Some(old) => {
            // The engine reused a hash for other tokens: the old block and its copies are gone.
            slot.copies.remove(&engine);
            release(nodes, slot, ix, old);
        }
        None => {}
    }
    if nodes.set_bit(seq, ix) {
        slot.held += 1;
    } else {
        *slot.dups.entry(seq).or_insert(0) += 1;
    }
}

/// Drops one copy of the slot's block stored under `engine`; false when there is none.
fn unstore(nodes: &mut NodeTable, slot: &mut Slot, ix: usize, engine: u64) -> bool {
    if !slot.copies.is_empty() {
        if let Entry::Occupied(mut c) = slot.copies.entry(engine) {
            *c.get_mut() -= 1;
            if *c.get() == 0 {
                c.remove();
            }
            return true;
        }
    }
    match slot.blocks.remove(engine) {
        Some(seq) => {
            release(nodes, slot, ix, seq);
            true
        }
        None => false,
    }
}

/// Drops the slot's hold on node `seq` (one engine hash's worth of it).
fn release(nodes: &mut NodeTable, slot: &mut Slot, ix: usize, seq: u64) {
    if let Some(c) = (!slot.dups.is_empty())
        .then(|| slot.dups.get_mut(&seq))
        .flatten()
    {
        *c -= 1;
        if *c == 0 {
            slot.dups.remove(&seq);
        }
        return;
    }
    if nodes.clear_bit(seq, ix) {
        slot.held -= 1;
    }
}

#[cfg(test)]
mod tests;
