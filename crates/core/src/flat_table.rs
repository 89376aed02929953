//! A flat hash table from 64-bit hashes to small values, for the routing core's hot tables
//! (the prefix index's node table, the ledger's active blocks).
//!
//! Open addressing with linear probing over `(key, value)` entries, with no separate control
//! bytes. It is written for these tables rather than taken from a general map because of how
//! they are used: most of their work is batches of operations on keys spread at random over
//! tables larger than the CPU caches, and reading those keys' entries first
//! ([`FlatTable::warm`]) lets their cache misses overlap. A general map cannot say where a
//! key *absent* from it would be written, so reading ahead only helped keys already present;
//! here a key's first probe is its home entry, known in advance whether the key is there or
//! not, and an insertion lands on it or just after it.
//!
//! Keys are hashes already (uniform 64-bit values); key 0 marks an empty entry, so a key of 0
//! is stored as [`ZERO_KEY`] (a collision of probability 2^-64, like any other). Removal
//! shifts later entries of the probe run back, so no tombstones accumulate.

/// The stand-in for a key of 0 (which marks empty entries).
const ZERO_KEY: u64 = 0x9E37_79B9_7F4A_7C15;

/// Mixes a key into its home position (the top bits of the product are used, so keys with
/// structured low bits still spread).
const HOME_MUL: u64 = 0xD6E8_FEB8_6659_FD93;

/// Entries per entry in use, at most: the table grows beyond 5/8 full, so a probe for an
/// absent key reads about four entries on average (one or two cache lines).
const MAX_LOAD_NUM: usize = 5;
const MAX_LOAD_DEN: usize = 8;

/// Fewest entries of a table that holds anything.
const MIN_ENTRIES: usize = 16;

#[derive(Clone, Copy, Default)]
struct Entry<V> {
    key: u64,
    value: V,
}

/// The table. See the module documentation.
pub(crate) struct FlatTable<V> {
    entries: Vec<Entry<V>>,
    /// Keys present.
    len: usize,
    /// `64 - log2(entries.len())`: the shift that turns a mixed key into a home position.
    shift: u32,
}

impl<V> Default for FlatTable<V> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            len: 0,
            shift: 0,
        }
    }
}

#[inline]
fn stored_key(key: u64) -> u64 {
    if key == 0 {
        ZERO_KEY
    } else {
        key
    }
}

impl<V: Copy + Default> FlatTable<V> {
    /// Keys present.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Keys the table holds before it grows.
    pub fn capacity(&self) -> usize {
        self.entries.len() * MAX_LOAD_NUM / MAX_LOAD_DEN
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry<V>>()
    }

    #[inline]
    fn mask(&self) -> usize {
        self.entries.len() - 1
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(HOME_MUL) >> self.shift) as usize
    }

    /// The position of `key` (stored form), or of the empty entry where it would go.
    #[inline]
    fn probe(&self, key: u64) -> (usize, bool) {
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            match self.entries[i].key {
                k if k == key => return (i, true),
                0 => return (i, false),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// The position of `key`, when present.
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        if self.entries.is_empty() {
            return None;
        }
        match self.probe(stored_key(key)) {
            (i, true) => Some(i),
            _ => None,
        }
    }

    /// The value at `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<V> {
        self.find(key).map(|i| self.entries[i].value)
    }

    /// The value at `key`, inserting `value` first when the key is absent; true when it was.
    #[inline]
    pub fn get_or_insert(&mut self, key: u64, value: V) -> (&mut V, bool) {
        self.reserve(1);
        let key = stored_key(key);
        let (i, found) = self.probe(key);
        if !found {
            self.entries[i] = Entry { key, value };
            self.len += 1;
        }
        (&mut self.entries[i].value, !found)
    }

    /// Changes the value at `key` with `change`, which says whether the entry stays (else
    /// it is removed). None when the key is absent, else what `change` said.
    #[inline]
    pub fn update(&mut self, key: u64, change: impl FnOnce(&mut V) -> bool) -> Option<bool> {
        let i = self.find(key)?;
        let keep = change(&mut self.entries[i].value);
        if !keep {
            self.remove_at(i);
        }
        Some(keep)
    }

    /// Empties entry `hole` and moves later entries of its probe run back over it, so every
    /// key stays reachable from its home without passing an empty entry.
    fn remove_at(&mut self, mut hole: usize) {
        let mask = self.mask();
        self.len -= 1;
        let mut j = hole;
        loop {
            self.entries[hole] = Entry::default();
            loop {
                j = (j + 1) & mask;
                let key = self.entries[j].key;
                if key == 0 {
                    return;
                }
                // The entry at j may fill the hole unless its home lies after the hole (in
                // probe order, up to j): it would then be unreachable from its home.
                let home = self.home(key);
                if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                    self.entries[hole] = self.entries[j];
                    hole = j;
                    break;
                }
            }
        }
    }

    /// Reads the home entries of `keys`, changing nothing, before a batch of operations on
    /// them: the reads do not depend on one another, so their cache misses overlap, and the
    /// operations that follow find their lines in the cache (present keys or not).
    pub fn warm(&self, keys: impl Iterator<Item = u64>) {
        if self.entries.is_empty() {
            return;
        }
        let mut acc = 0u64;
        for k in keys {
            acc ^= self.entries[self.home(stored_key(k))].key;
        }
        std::hint::black_box(acc);
    }

    /// Makes room for `more` keys beyond those present.
    pub fn reserve(&mut self, more: usize) {
        let need = self.len.saturating_add(more);
        if need <= self.capacity() && !self.entries.is_empty() {
            return;
        }
        let entries = need
            .saturating_mul(MAX_LOAD_DEN)
            .div_ceil(MAX_LOAD_NUM)
            .max(MIN_ENTRIES)
            .next_power_of_two();
        self.rebuild(entries);
    }

    fn rebuild(&mut self, entries: usize) {
        let old = std::mem::replace(&mut self.entries, vec![Entry::default(); entries]);
        self.shift = 64 - entries.trailing_zeros();
        for e in old.into_iter().filter(|e| e.key != 0) {
            let (i, found) = self.probe(e.key);
            debug_assert!(!found, "keys are unique");
            self.entries[i] = e;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, Clone)]
    enum Op {
        /// Adds to the value at the key (inserting 0 first).
        Add(u64, u8),
        /// Subtracts from the value at the key, removing it at 0 or below.
        Sub(u64, u8),
    }

    /// Keys from a small set (so operations meet), some of them colliding in their home
    /// position in any table size, and 0.
    fn key() -> impl Strategy<Value = u64> {
        prop_oneof![
            (0u64..40),
            (0u64..8).prop_map(|k| k << 60),
            Just(ZERO_KEY),
            any::<u64>(),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (key(), 1u8..4).prop_map(|(k, n)| Op::Add(k, n)),
            (key(), 1u8..4).prop_map(|(k, n)| Op::Sub(k, n)),
        ]
    }

    proptest! {
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec(op(), 0..400)) {
            let mut table = FlatTable::<i64>::default();
            let mut model: HashMap<u64, i64> = HashMap::new();
            for op in ops {
                match op {
                    Op::Add(k, n) => {
                        let inserted = !model.contains_key(&stored_key(k));
                        *model.entry(stored_key(k)).or_insert(0) += i64::from(n);
                        let (v, fresh) = table.get_or_insert(k, 0);
                        *v += i64::from(n);
                        prop_assert_eq!(fresh, inserted);
                    }
                    Op::Sub(k, n) => {
                        let k = stored_key(k);
                        let expected = model.get_mut(&k).map(|v| {
                            *v -= i64::from(n);
                            *v > 0
                        });
                        if expected == Some(false) {
                            model.remove(&k);
                        }
                        let got = table.update(k, |v| {
                            *v -= i64::from(n);
                            *v > 0
                        });
                        prop_assert_eq!(got, expected);
                    }
                }
                prop_assert_eq!(table.len(), model.len());
                prop_assert!(table.len() <= table.capacity());
            }
            for (k, v) in &model {
                prop_assert_eq!(table.get(*k), Some(*v));
            }
            let present = table.entries.iter().filter(|e| e.key != 0).count();
            prop_assert_eq!(present, model.len(), "no entry is left behind by removals");
        }
    }

    #[test]
    fn reserve_makes_room_without_growing_later() {
        let mut table = FlatTable::<u64>::default();
        table.reserve(1000);
        let entries = table.entries.len();
        assert!(table.capacity() >= 1000);
        let key = |k: u64| k.wrapping_mul(0x1234_5678_9ABC_DEF1);
        for k in 1..=1000u64 {
            assert!(table.get_or_insert(key(k), k).1);
        }
        assert_eq!(
            table.entries.len(),
            entries,
            "no growth within the reservation"
        );
        assert_eq!(table.len(), 1000);
        for k in 1..=1000u64 {
            assert_eq!(table.get(key(k)), Some(k));
            assert_eq!(table.update(key(k), |_| false), Some(false));
        }
        assert_eq!(table.len(), 0);
        assert!(table.entries.iter().all(|e| e.key == 0));
    }

    #[test]
    fn an_empty_table_answers_without_allocating() {
        let mut table = FlatTable::<u64>::default();
        assert_eq!(table.get(5), None);
        assert_eq!(table.update(5, |_| true), None);
        table.warm([1, 2, 3].into_iter());
        assert_eq!(table.bytes(), 0);
    }
}
