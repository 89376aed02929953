//! The flat node table: `(sequence hash, word)` keys to the bits of the workers of that word
//! holding the block.
//!
//! An open-addressed table with linear probing over 16-byte `(key, bits)` entries, four to a
//! cache line, with no separate control bytes. It is written for this one job rather than
//! taken from a general map because of how the index uses it: most of its work is a batch of
//! writes to keys spread at random over a table far larger than the CPU caches, and reading
//! those keys' lines first ([`NodeTable::warm`]) lets their cache misses overlap. A general
//! map cannot say where a key *absent* from it would be written, so its reads ahead only
//! helped writes of keys already present; here a key's first probe is its home entry,
//! known in advance whether the key is there or not, and the write lands on it or just
//! after it.
//!
//! Keys are 64-bit hashes; key 0 marks an empty entry, so a key of 0 is stored as
//! [`ZERO_KEY`] (a collision of probability 2^-64, like any other). Removal shifts later
//! entries of the probe run back, so no tombstones accumulate.

/// Spreads the words of one node over the key space (word 0 keeps the sequence hash itself).
const WORD_SALT: u64 = 0x9E37_79B9_7F4A_7C15;

/// The stand-in for a key of 0 (which marks empty entries).
const ZERO_KEY: u64 = WORD_SALT;

/// Mixes a key into its home position (the top bits of the product are used, so keys with
/// structured low bits still spread).
const HOME_MUL: u64 = 0xD6E8_FEB8_6659_FD93;

/// Entries per entry in use, at most: the table grows beyond 5/8 full, so a probe for an
/// absent key reads about four entries on average (one or two cache lines).
const MAX_LOAD_NUM: usize = 5;
const MAX_LOAD_DEN: usize = 8;

/// Fewest entries of a table that holds anything.
const MIN_ENTRIES: usize = 16;

/// The key of word `word` of the node with sequence hash `seq`.
#[inline]
pub(super) fn node_key(seq: u64, word: usize) -> u64 {
    seq.wrapping_add((word as u64).wrapping_mul(WORD_SALT))
}

#[derive(Clone, Copy, Default)]
struct Entry {
    key: u64,
    bits: u64,
}

/// The node table. See the module documentation.
#[derive(Default)]
pub(super) struct NodeTable {
    entries: Vec<Entry>,
    /// Keys present.
    len: usize,
    /// `64 - log2(entries.len())`: the shift that turns a mixed key into a home position.
    shift: u32,
}

#[inline]
fn stored_key(key: u64) -> u64 {
    if key == 0 {
        ZERO_KEY
    } else {
        key
    }
}

impl NodeTable {
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
        self.entries.capacity() * std::mem::size_of::<Entry>()
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

    /// The bits at `key` (0 when absent).
    #[inline]
    pub fn get(&self, key: u64) -> u64 {
        if self.entries.is_empty() {
            return 0;
        }
        match self.probe(stored_key(key)) {
            (i, true) => self.entries[i].bits,
            _ => 0,
        }
    }

    /// Sets `bit` at `key`; true when it was not set.
    #[inline]
    pub fn set_bit(&mut self, key: u64, bit: u64) -> bool {
        self.reserve(1);
        let key = stored_key(key);
        let (i, found) = self.probe(key);
        let e = &mut self.entries[i];
        if !found {
            *e = Entry { key, bits: bit };
            self.len += 1;
            return true;
        }
        let fresh = e.bits & bit == 0;
        e.bits |= bit;
        fresh
    }

    /// Clears `bit` at `key`, dropping the key when no bit is left; true when it was set.
    #[inline]
    pub fn clear_bit(&mut self, key: u64, bit: u64) -> bool {
        if self.entries.is_empty() {
            return false;
        }
        let (i, found) = self.probe(stored_key(key));
        let e = &mut self.entries[i];
        if !found || e.bits & bit == 0 {
            return false;
        }
        e.bits &= !bit;
        if e.bits == 0 {
            self.remove_at(i);
        }
        true
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
        Set(u64, u8),
        Clear(u64, u8),
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
            (key(), 0u8..4).prop_map(|(k, b)| Op::Set(k, b)),
            (key(), 0u8..4).prop_map(|(k, b)| Op::Clear(k, b)),
        ]
    }

    proptest! {
        #[test]
        fn behaves_like_a_map_of_bitsets(ops in proptest::collection::vec(op(), 0..400)) {
            let mut table = NodeTable::default();
            let mut model: HashMap<u64, u64> = HashMap::new();
            for op in ops {
                match op {
                    Op::Set(k, b) => {
                        let bits = model.entry(stored_key(k)).or_insert(0);
                        let fresh = *bits & (1 << b) == 0;
                        *bits |= 1 << b;
                        prop_assert_eq!(table.set_bit(k, 1 << b), fresh);
                    }
                    Op::Clear(k, b) => {
                        let k = stored_key(k);
                        let was = model.get(&k).is_some_and(|bits| bits & (1 << b) != 0);
                        if was {
                            let bits = model.get_mut(&k).unwrap();
                            *bits &= !(1 << b);
                            if *bits == 0 {
                                model.remove(&k);
                            }
                        }
                        prop_assert_eq!(table.clear_bit(k, 1 << b), was);
                    }
                }
                prop_assert_eq!(table.len(), model.len());
                prop_assert!(table.len() <= table.capacity());
            }
            for (k, bits) in &model {
                prop_assert_eq!(table.get(*k), *bits);
            }
            let present = table.entries.iter().filter(|e| e.key != 0).count();
            prop_assert_eq!(present, model.len(), "no entry is left behind by removals");
        }
    }

    #[test]
    fn reserve_makes_room_without_growing_later() {
        let mut table = NodeTable::default();
        table.reserve(1000);
        let entries = table.entries.len();
        assert!(table.capacity() >= 1000);
        for k in 1..=1000u64 {
            assert!(table.set_bit(k.wrapping_mul(0x1234_5678_9ABC_DEF1), 1));
        }
        assert_eq!(
            table.entries.len(),
            entries,
            "no growth within the reservation"
        );
        assert_eq!(table.len(), 1000);
        for k in 1..=1000u64 {
            assert!(table.clear_bit(k.wrapping_mul(0x1234_5678_9ABC_DEF1), 1));
        }
        assert_eq!(table.len(), 0);
        assert!(table.entries.iter().all(|e| e.key == 0));
    }

    #[test]
    fn an_empty_table_answers_without_allocating() {
        let mut table = NodeTable::default();
        assert_eq!(table.get(5), 0);
        assert!(!table.clear_bit(5, 1));
        table.warm([1, 2, 3].into_iter());
        assert_eq!(table.bytes(), 0);
    }
}
