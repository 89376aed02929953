//! Each worker's table from the engine's own name of a block (its "engine hash") to the
//! router's sequence hash of that block, in the order the names were stored (the oldest go
//! first when a worker holds more than the index keeps).
//!
//! The entries live in a log in store order ([`log`]: 16 bytes each, in chunks, so it grows
//! and shrinks without copying); a name finds its entry through a flat hash table of 8-byte
//! entries, 32 bits of the name's hash beside its 32-bit log position
//! ([`crate::flat_table::Tagged32`]; the log entry confirms the whole name). A lookup reads
//! one table entry, where a general map reads a control byte and then its bucket, and the
//! order of the names costs nothing beyond the entries themselves, where a map of names
//! plus a queue of them kept each name twice. A removed entry is marked dead in the log; dead entries at
//! the front are dropped at once, and the log is compacted when its dead entries outnumber
//! its live ones (only a worker whose oldest blocks stay while newer ones come and go gets
//! there).
//!
//! An engine that names blocks by their index in a pool of known size (the fleet simulator's
//! in-process engines) can say so ([`EngineTable::use_block_ids`]): names below the pool size
//! then find their position in a plain array indexed by the name, with no hashing or probing.
//! Names outside that range still go to the hash table, so any name works in either form and
//! gives the same answers.

mod log;

use crate::flat_table::{FlatTable, Tagged32};
use log::Log;

/// Most blocks a worker's array may cover (4 bytes and a bit per block: 17 MiB).
pub const MAX_BLOCK_IDS: usize = 1 << 22;

/// Most entries one table holds (log positions are 32-bit and the log holds at most twice
/// the live entries and some slack): the index keeps its per-worker limit at or below it.
pub const MAX_ENTRIES: usize = 1 << 30;

/// Dead entries the log may hold beyond its live ones before it is compacted.
const DEAD_SLACK: usize = 4096;

/// One worker's engine-hash -> sequence-hash table. See the module documentation.
#[derive(Default)]
pub(super) struct EngineTable {
    /// `(name, sequence hash)` in store order.
    log: Log,
    /// Log positions of the names not covered by `by_id`, by name.
    index: FlatTable<Tagged32>,
    /// Log position of the block named `i`, for names below `by_id.len()`.
    by_id: Vec<u32>,
    /// Which of `by_id` are set, one bit each.
    present: Vec<u64>,
    /// Live entries.
    live: usize,
}

impl EngineTable {
    /// Keeps names below `blocks` (at most [`MAX_BLOCK_IDS`]) in an array from now on.
    /// Entries held move over, in their order. False (nothing changed) when `blocks` is over
    /// the limit.
    pub fn use_block_ids(&mut self, blocks: usize) -> bool {
        if blocks > MAX_BLOCK_IDS {
            return false;
        }
        let old = std::mem::take(self);
        self.by_id = vec![0; blocks];
        self.present = vec![0; blocks.div_ceil(64)];
        for (name, seq) in old.iter() {
            self.insert(name, seq);
        }
        true
    }

    #[inline]
    fn slot(&self, name: u64) -> Option<usize> {
        let i = usize::try_from(name).ok()?;
        (i < self.by_id.len()).then_some(i)
    }

    #[inline]
    fn is_present(&self, i: usize) -> bool {
        self.present[i / 64] & (1 << (i % 64)) != 0
    }

    /// The log position of `name`.
    #[inline]
    fn position(&self, name: u64) -> Option<u32> {
        match self.slot(name) {
            Some(i) => self.is_present(i).then(|| self.by_id[i]),
            None => self.index.get_by(name, |p| self.log.name(p) == name),
        }
    }

    /// The sequence hash named `name`.
    #[inline]
    pub fn get(&self, name: u64) -> Option<u64> {
        self.position(name).map(|p| self.log.seq(p))
    }

    /// The sequence hashes of the names held among `names`, looked up in two rounds so that
    /// the cache misses of each round overlap: the table entries of every name (the first
    /// whose 32 bits agree), then their log entries.
    pub fn get_many(&self, names: impl Iterator<Item = u64>) -> Vec<u64> {
        let candidates: Vec<(u64, Option<u32>)> = names
            .map(|n| {
                let p = match self.slot(n) {
                    Some(i) => self.is_present(i).then(|| self.by_id[i]),
                    None => self.index.get(n),
                };
                (n, p)
            })
            .collect();
        candidates
            .into_iter()
            .filter_map(|(n, p)| match p {
                Some(p) if self.log.name(p) == n => Some(self.log.seq(p)),
                _ => self.get(n),
            })
            .collect()
    }

    /// Whether `name` is held.
    #[inline]
    pub fn contains(&self, name: u64) -> bool {
        self.position(name).is_some()
    }

    /// Sets `name` to `seq`; returns what it named before. A new name, or a name set to
    /// another block, becomes the newest entry; setting a name to the block it names already
    /// leaves its place.
    #[inline]
    pub fn insert(&mut self, name: u64, seq: u64) -> Option<u64> {
        let old = match self.slot(name) {
            Some(i) => {
                if self.is_present(i) {
                    let p = self.by_id[i];
                    let old = self.log.seq(p);
                    if old != seq {
                        self.log.kill(p);
                        self.by_id[i] = self.log.push(name, seq);
                    }
                    Some(old)
                } else {
                    self.present[i / 64] |= 1 << (i % 64);
                    self.by_id[i] = self.log.push(name, seq);
                    self.live += 1;
                    None
                }
            }
            None => {
                // One probe: the entry's new position is the log's next one, known ahead.
                let (log, next) = (&self.log, self.log.next_position());
                let mut found = None;
                self.index.modify_by(
                    name,
                    |p| log.name(p) == name,
                    |p| {
                        found = p.map(|p| (p, log.seq(p)));
                        match found {
                            Some((p, old)) if old == seq => Some(p),
                            _ => Some(next),
                        }
                    },
                );
                match found {
                    Some((_, old)) if old == seq => {}
                    Some((p, _)) => {
                        self.log.kill(p);
                        self.log.push(name, seq);
                    }
                    None => {
                        self.log.push(name, seq);
                        self.live += 1;
                    }
                }
                found.map(|(_, old)| old)
            }
        };
        if old.is_some() {
            self.tidy();
        }
        old
    }

    /// Drops `name`; returns what it named.
    #[inline]
    pub fn remove(&mut self, name: u64) -> Option<u64> {
        let p = match self.slot(name) {
            Some(i) => {
                if !self.is_present(i) {
                    return None;
                }
                self.present[i / 64] &= !(1 << (i % 64));
                self.by_id[i]
            }
            None => {
                let log = &self.log;
                self.index.remove_by(name, |p| log.name(p) == name)?
            }
        };
        let seq = self.log.take(p);
        self.live -= 1;
        self.tidy();
        Some(seq)
    }

    /// Drops the oldest entry; returns its `(name, sequence hash)`.
    pub fn pop_oldest(&mut self) -> Option<(u64, u64)> {
        let (p, name, seq) = self.log.pop_live()?;
        match self.slot(name) {
            Some(i) => self.present[i / 64] &= !(1 << (i % 64)),
            None => {
                self.index.remove_by(name, |q| q == p);
            }
        }
        self.live -= 1;
        self.tidy();
        Some((name, seq))
    }

    /// Drops the dead entries at the front of the log, and compacts it when dead entries
    /// behind live ones pile up.
    fn tidy(&mut self) {
        self.log.drop_dead_front();
        if self.log.len() > 2 * self.live + DEAD_SLACK {
            self.compact();
        }
    }

    /// Rewrites the log with its live entries only, in order, and points the names at their
    /// new places.
    fn compact(&mut self) {
        let old = std::mem::take(&mut self.log);
        self.index = FlatTable::default();
        self.index.reserve(self.live);
        for (name, seq) in old.live() {
            let p = self.log.push(name, seq);
            match self.slot(name) {
                Some(i) => self.by_id[i] = p,
                None => self.index.modify_by(name, |_| false, |_| Some(p)),
            }
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.live
    }

    /// `(name, sequence hash)` of every entry, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.log.live()
    }

    /// Drops every entry (the array keeps its size).
    pub fn clear(&mut self) {
        self.present.fill(0);
        self.live = 0;
        self.log = Log::default();
        self.index = FlatTable::default();
    }

    /// Makes room for `blocks` entries: in the log, and in the hash table beyond what the
    /// array covers.
    pub fn reserve(&mut self, blocks: usize) {
        self.log.reserve(blocks.saturating_sub(self.live));
        let extra = blocks.saturating_sub(self.by_id.len());
        self.index.reserve(extra.saturating_sub(self.index.len()));
    }

    /// Reads the hash-table entries of `names` ahead (the reads of a batch do not depend on
    /// one another, so their cache misses overlap before the writes): the entry where a
    /// name is, or where its insertion will go. The array needs none.
    pub fn warm(&self, names: impl Iterator<Item = u64>) {
        self.index.warm(names.filter(|&n| self.slot(n).is_none()));
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.by_id.capacity() * 4
            + self.present.capacity() * 8
            + self.index.bytes()
            + self.log.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// With or without an array, the table answers like a plain map, and its entries
        /// leave oldest first in the order their names were set.
        #[test]
        fn answers_like_a_map_and_keeps_the_store_order(
            blocks in 0usize..40,
            switch_at in 0usize..60,
            ops in prop::collection::vec((0u8..4, 0u64..50, 0u64..4), 0..300),
        ) {
            let mut table = EngineTable::default();
            // The model: name -> seq, and names in the order they were (re)set.
            let mut model = std::collections::HashMap::new();
            let mut order: Vec<u64> = Vec::new();
            for (n, &(op, name, seq)) in ops.iter().enumerate() {
                if n == switch_at {
                    prop_assert!(table.use_block_ids(blocks));
                }
                let name = if name == 49 { u64::MAX } else { name };
                match op {
                    0 => {
                        let old = model.insert(name, seq);
                        if old != Some(seq) {
                            order.retain(|&x| x != name);
                            order.push(name);
                        }
                        prop_assert_eq!(table.insert(name, seq), old);
                    }
                    1 => {
                        order.retain(|&x| x != name);
                        prop_assert_eq!(table.remove(name), model.remove(&name));
                    }
                    2 => {
                        let want = order.first().map(|&x| (x, model[&x]));
                        if let Some((x, _)) = want {
                            order.remove(0);
                            model.remove(&x);
                        }
                        prop_assert_eq!(table.pop_oldest(), want);
                    }
                    _ => {
                        let names = [name, name ^ 1, u64::MAX];
                        let want: Vec<u64> =
                            names.iter().filter_map(|n| model.get(n).copied()).collect();
                        prop_assert_eq!(table.get_many(names.into_iter()), want);
                        prop_assert_eq!(table.get(name), model.get(&name).copied());
                        prop_assert_eq!(table.contains(name), model.contains_key(&name));
                    }
                }
                prop_assert_eq!(table.len(), model.len());
            }
            let all: Vec<_> = table.iter().collect();
            let want: Vec<_> = order.iter().map(|&x| (x, model[&x])).collect();
            prop_assert_eq!(all, want);
            table.clear();
            prop_assert_eq!(table.len(), 0);
            prop_assert_eq!(table.iter().count(), 0);
        }
    }

    #[test]
    fn an_array_over_the_limit_is_refused() {
        let mut table = EngineTable::default();
        table.insert(3, 30);
        assert!(!table.use_block_ids(MAX_BLOCK_IDS + 1));
        assert!(table.use_block_ids(8));
        assert_eq!(table.get(3), Some(30));
        assert_eq!(table.index.len(), 0, "the entry moved to the array");
    }

    /// A worker whose oldest block stays while newer ones come and go: the log is compacted,
    /// so it stays within twice the live entries and the slack, and every answer holds.
    #[test]
    fn dead_entries_behind_a_live_one_are_compacted_away() {
        let mut table = EngineTable::default();
        table.insert(u64::MAX, 1);
        for name in 0..100_000u64 {
            table.insert(name, name + 7);
            assert_eq!(table.remove(name), Some(name + 7));
            assert!(table.log.len() <= 2 * table.len() + DEAD_SLACK + 1);
        }
        assert_eq!(table.len(), 1);
        assert_eq!(table.get(u64::MAX), Some(1));
        table.insert(5, 6);
        assert_eq!(table.pop_oldest(), Some((u64::MAX, 1)));
        assert_eq!(table.pop_oldest(), Some((5, 6)));
        assert_eq!(table.pop_oldest(), None);
    }

    /// Churn that removes the oldest names (how an LRU cache evicts) never compacts: dead
    /// entries leave from the front as they come.
    #[test]
    fn removing_the_oldest_drops_dead_entries_from_the_front() {
        let mut table = EngineTable::default();
        for name in 0..10_000u64 {
            table.insert(name, name);
            if name >= 100 {
                table.remove(name - 100);
            }
            assert!(table.log.len() <= table.len() + 1);
        }
        assert_eq!(table.iter().next(), Some((9_900, 9_900)));
    }
}
