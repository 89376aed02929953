//! Each worker's table from the engine's own name of a block (its "engine hash") to the
//! router's sequence hash of that block.
//!
//! Engines on the wire name blocks by hashes of their own, so the table is a hash map. An
//! engine that names blocks by their index in a pool of known size (the fleet simulator's
//! in-process engines) can say so ([`EngineTable::use_block_ids`]): names below the pool size
//! then live in a plain array indexed by the name, which needs no hashing or probing and is a
//! fraction of the map's size (so it mostly stays in the CPU cache). Names outside that range
//! still go to the map, so any name works in either form and gives the same answers.

use super::Map;

/// Most blocks a worker's array may cover (8 bytes and a bit per block: 33 MiB).
pub const MAX_BLOCK_IDS: usize = 1 << 22;

/// One worker's engine-hash -> sequence-hash table. See the module documentation.
#[derive(Default)]
pub(super) struct EngineTable {
    /// Sequence hash of the block named `i`, for names below `by_id.len()`.
    by_id: Vec<u64>,
    /// Which of `by_id` are set, one bit each.
    present: Vec<u64>,
    /// Entries set in `by_id`.
    by_id_len: usize,
    /// Every other name.
    map: Map<u64, u64>,
}

impl EngineTable {
    /// Keeps names below `blocks` (at most [`MAX_BLOCK_IDS`]) in an array from now on.
    /// Entries held move over. False (nothing changed) when `blocks` is over the limit.
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

    /// The sequence hash named `name`.
    #[inline]
    pub fn get(&self, name: u64) -> Option<u64> {
        match self.slot(name) {
            Some(i) => self.is_present(i).then(|| self.by_id[i]),
            None => self.map.get(&name).copied(),
        }
    }

    /// Whether `name` is held.
    #[inline]
    pub fn contains(&self, name: u64) -> bool {
        match self.slot(name) {
            Some(i) => self.is_present(i),
            None => self.map.contains_key(&name),
        }
    }

    /// Sets `name` to `seq`; returns what it named before.
    #[inline]
    pub fn insert(&mut self, name: u64, seq: u64) -> Option<u64> {
        match self.slot(name) {
            Some(i) => {
                let old = self.is_present(i).then(|| self.by_id[i]);
                if old.is_none() {
                    self.present[i / 64] |= 1 << (i % 64);
                    self.by_id_len += 1;
                }
                self.by_id[i] = seq;
                old
            }
            None => self.map.insert(name, seq),
        }
    }

    /// Drops `name`; returns what it named.
    #[inline]
    pub fn remove(&mut self, name: u64) -> Option<u64> {
        match self.slot(name) {
            Some(i) => {
                let old = self.is_present(i).then(|| self.by_id[i]);
                if old.is_some() {
                    self.present[i / 64] &= !(1 << (i % 64));
                    self.by_id_len -= 1;
                }
                old
            }
            None => self.map.remove(&name),
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.by_id_len + self.map.len()
    }

    /// `(name, sequence hash)` of every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let by_id = self.present.iter().enumerate().flat_map(move |(w, &bits)| {
            let mut bits = bits;
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    (i as u64, self.by_id[i])
                })
            })
        });
        by_id.chain(self.map.iter().map(|(&k, &v)| (k, v)))
    }

    /// Drops every entry (the array keeps its size).
    pub fn clear(&mut self) {
        self.present.fill(0);
        self.by_id_len = 0;
        self.map = Map::default();
    }

    /// Makes room for `blocks` entries in the map, beyond what the array covers.
    pub fn reserve(&mut self, blocks: usize) {
        let extra = blocks.saturating_sub(self.by_id.len());
        self.map.reserve(extra.saturating_sub(self.map.len()));
    }

    /// Reads the map entries of `names` ahead (see `table::warm`); the array needs none.
    pub fn warm(&self, names: impl Iterator<Item = u64>) {
        if !self.map.is_empty() {
            super::table::warm(&self.map, names.filter(|&n| self.slot(n).is_none()));
        }
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.by_id.capacity() * 8
            + self.present.capacity() * 8
            + super::table::table_bytes::<u64, u64>(self.map.capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// With or without an array, the table answers like a plain map.
        #[test]
        fn answers_like_a_map(
            blocks in 0usize..40,
            switch_at in 0usize..60,
            ops in prop::collection::vec((0u8..3, 0u64..50, any::<u64>()), 0..60),
        ) {
            let mut table = EngineTable::default();
            let mut model = std::collections::HashMap::new();
            for (n, &(op, name, seq)) in ops.iter().enumerate() {
                if n == switch_at {
                    prop_assert!(table.use_block_ids(blocks));
                }
                let name = if name == 49 { u64::MAX } else { name };
                match op {
                    0 => prop_assert_eq!(table.insert(name, seq), model.insert(name, seq)),
                    1 => prop_assert_eq!(table.remove(name), model.remove(&name)),
                    _ => {
                        prop_assert_eq!(table.get(name), model.get(&name).copied());
                        prop_assert_eq!(table.contains(name), model.contains_key(&name));
                    }
                }
                prop_assert_eq!(table.len(), model.len());
            }
            let mut all: Vec<_> = table.iter().collect();
            all.sort_unstable();
            let mut want: Vec<_> = model.into_iter().collect();
            want.sort_unstable();
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
        assert_eq!(table.map.len(), 0, "the entry moved to the array");
    }
}
