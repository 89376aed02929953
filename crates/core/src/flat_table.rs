//! A flat hash table from 64-bit hashes to small values, for the routing core's hot tables
//! (the prefix index's node table and engine-name tables, the ledger's active blocks).
//!
//! Open addressing with linear probing over small entries, with no separate control bytes.
//! It is written for these tables rather than taken from a general map because of how they
//! are used: most of their work is batches of operations on keys spread at random over
//! tables larger than the CPU caches, and reading those keys' entries first
//! ([`FlatTable::warm`]) lets their cache misses overlap. A general map cannot say where a
//! key *absent* from it would be written, so reading ahead only helped keys already present;
//! here a key's first probe is its home entry, known in advance whether the key is there or
//! not, and an insertion lands on it or just after it. For the same reason entries are as
//! small as they can be: an [`Entry`] type says how a key and a value are stored (a pair, a
//! key and a few bits packed in one word, or part of a key beside a value that tells where
//! the owner keeps the rest).
//!
//! Keys are hashes already (uniform 64-bit values); an entry whose stored key is 0 is empty,
//! so a key stored as 0 is stored as [`ZERO_KEY`] instead (a collision of probability 2^-64,
//! like any other). Removal shifts later entries of the probe run back, so no tombstones
//! accumulate.

/// The stand-in for a key stored as 0 (which marks empty entries).
pub(crate) const ZERO_KEY: u64 = 0x9E37_79B9_7F4A_7C15;

/// Mixes a stored key into its home position (the top bits of the product are used, so
/// keys with structured low bits still spread).
const HOME_MUL: u64 = 0xD6E8_FEB8_6659_FD93;

/// Entries per entry in use, at most: the table grows beyond 5/8 full, so a probe for an
/// absent key reads about four entries on average.
const MAX_LOAD_NUM: usize = 5;
const MAX_LOAD_DEN: usize = 8;

/// Fewest entries of a table that holds anything.
const MIN_ENTRIES: usize = 16;

/// How a table's entries hold a key and a value. The default entry is the empty one.
pub(crate) trait Entry: Copy + Default {
    /// The value type.
    type Value: Copy;
    /// The form a key is stored and compared in: never 0 (see [`ZERO_KEY`]), and a function
    /// of the key alone.
    fn stored(key: u64) -> u64;
    /// The stored key (0 for an empty entry).
    fn key(&self) -> u64;
    /// The value.
    fn value(&self) -> Self::Value;
    /// An entry of stored key `key` (see [`Entry::stored`]) and `value`.
    fn new(key: u64, value: Self::Value) -> Self;
}

/// A key and a value side by side.
#[derive(Clone, Copy, Default)]
pub(crate) struct Pair<V> {
    key: u64,
    value: V,
}

impl<V: Copy + Default> Entry for Pair<V> {
    type Value = V;

    #[inline]
    fn stored(key: u64) -> u64 {
        if key == 0 {
            ZERO_KEY
        } else {
            key
        }
    }

    #[inline]
    fn key(&self) -> u64 {
        self.key
    }

    #[inline]
    fn value(&self) -> V {
        self.value
    }

    #[inline]
    fn new(key: u64, value: V) -> Self {
        Self { key, value }
    }
}

/// 56 bits of a key and an 8-bit value in one word: half the size of a [`Pair`]. The key is
/// mixed first (a multiplication by an odd constant, which maps distinct keys to distinct
/// words), so keys that differ only in their low bits stay apart; two keys are taken for one
/// when their mixed forms agree in the top 56 bits (probability 2^-56).
#[derive(Clone, Copy, Default)]
pub(crate) struct Packed8(u64);

/// The multiplier of [`Packed8`]'s mix.
const PACK_MUL: u64 = 0xBF58_476D_1CE4_E5B9;

impl Entry for Packed8 {
    type Value = u8;

    #[inline]
    fn stored(key: u64) -> u64 {
        match key.wrapping_mul(PACK_MUL) & !0xFF {
            0 => ZERO_KEY & !0xFF,
            k => k,
        }
    }

    #[inline]
    fn key(&self) -> u64 {
        self.0 & !0xFF
    }

    #[inline]
    fn value(&self) -> u8 {
        self.0 as u8
    }

    #[inline]
    fn new(key: u64, value: u8) -> Self {
        Self(key | u64::from(value))
    }
}

/// 32 bits of a key beside a 32-bit value in one word, for a table whose owner keeps the
/// whole key elsewhere (the value names where): two keys agree on these bits with
/// probability 2^-32, so the owner looks its keys up with a check of the value
/// ([`FlatTable::get_by`], [`FlatTable::modify_by`]).
#[derive(Clone, Copy, Default)]
pub(crate) struct Tagged32(u64);

/// The multiplier of [`Tagged32`]'s mix.
const TAG_MUL: u64 = 0x94D0_49BB_1331_11EB;

/// The key half of a [`Tagged32`].
const TAG_MASK: u64 = 0xFFFF_FFFF_0000_0000;

impl Entry for Tagged32 {
    type Value = u32;

    #[inline]
    fn stored(key: u64) -> u64 {
        match key.wrapping_mul(TAG_MUL) & TAG_MASK {
            0 => ZERO_KEY & TAG_MASK,
            k => k,
        }
    }

    #[inline]
    fn key(&self) -> u64 {
        self.0 & TAG_MASK
    }

    #[inline]
    fn value(&self) -> u32 {
        self.0 as u32
    }

    #[inline]
    fn new(key: u64, value: u32) -> Self {
        Self(key | u64::from(value))
    }
}

/// The table. See the module documentation.
pub(crate) struct FlatTable<E> {
    entries: Vec<E>,
    /// Keys present.
    len: usize,
    /// `64 - log2(entries.len())`: the shift that turns a mixed key into a home position.
    shift: u32,
}

impl<E> Default for FlatTable<E> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            len: 0,
            shift: 0,
        }
    }
}

impl<E: Entry> FlatTable<E> {
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
        self.entries.capacity() * std::mem::size_of::<E>()
    }

    #[inline]
    fn mask(&self) -> usize {
        self.entries.len() - 1
    }

    #[inline]
    fn home(&self, stored: u64) -> usize {
        (stored.wrapping_mul(HOME_MUL) >> self.shift) as usize
    }

    /// The position of stored key `key`, or of the empty entry where it would go.
    #[inline]
    fn probe(&self, key: u64) -> (usize, bool) {
        self.probe_by(key, |_| true)
    }

    /// [`FlatTable::probe`] for entries that keep part of their key: an entry of stored key
    /// `key` is the one sought only when `eq` accepts its value.
    #[inline]
    fn probe_by(&self, key: u64, mut eq: impl FnMut(E::Value) -> bool) -> (usize, bool) {
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let e = self.entries[i];
            match e.key() {
                k if k == key && eq(e.value()) => return (i, true),
                0 => return (i, false),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// The value at `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<E::Value> {
        self.get_by(key, |_| true)
    }

    /// The value at `key` that `eq` accepts (see [`Tagged32`]).
    #[inline]
    pub fn get_by(&self, key: u64, eq: impl FnMut(E::Value) -> bool) -> Option<E::Value> {
        if self.entries.is_empty() {
            return None;
        }
        match self.probe_by(E::stored(key), eq) {
            (i, true) => Some(self.entries[i].value()),
            _ => None,
        }
    }

    /// Replaces the value at `key` by what `change` makes of it (None: absent), in one
    /// probe: a value inserts or replaces, None removes (or leaves absent).
    #[inline]
    pub fn modify(&mut self, key: u64, change: impl FnOnce(Option<E::Value>) -> Option<E::Value>) {
        self.modify_by(key, |_| true, change);
    }

    /// [`FlatTable::modify`] of the value at `key` that `eq` accepts (see [`Tagged32`]); a
    /// value `change` makes when none is accepted is inserted beside the others.
    #[inline]
    pub fn modify_by(
        &mut self,
        key: u64,
        mut eq: impl FnMut(E::Value) -> bool,
        change: impl FnOnce(Option<E::Value>) -> Option<E::Value>,
    ) {
        let key = E::stored(key);
        let (i, found) = if self.entries.is_empty() {
            (0, false)
        } else {
            self.probe_by(key, &mut eq)
        };
        let old = found.then(|| self.entries[i].value());
        match (change(old), found) {
            (Some(v), true) => self.entries[i] = E::new(key, v),
            (Some(v), false) => {
                // Only an insertion may need room (then the key's place is found anew).
                let i = if self.len < self.capacity() {
                    i
                } else {
                    self.reserve(1);
                    self.probe_by(key, |_| false).0
                };
                self.entries[i] = E::new(key, v);
                self.len += 1;
            }
            (None, true) => self.remove_at(i),
            (None, false) => {}
        }
    }

    /// Removes the value at `key` that `eq` accepts (see [`Tagged32`]); the value removed.
    #[inline]
    pub fn remove_by(&mut self, key: u64, eq: impl FnMut(E::Value) -> bool) -> Option<E::Value> {
        if self.entries.is_empty() {
            return None;
        }
        match self.probe_by(E::stored(key), eq) {
            (i, true) => {
                let v = self.entries[i].value();
                self.remove_at(i);
                Some(v)
            }
            _ => None,
        }
    }

    /// Empties entry `hole` and moves later entries of its probe run back over it, so every
    /// key stays reachable from its home without passing an empty entry.
    fn remove_at(&mut self, mut hole: usize) {
        let mask = self.mask();
        self.len -= 1;
        let mut j = hole;
        loop {
            self.entries[hole] = E::default();
            loop {
                j = (j + 1) & mask;
                let key = self.entries[j].key();
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
            acc ^= self.entries[self.home(E::stored(k))].key();
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
        let old = std::mem::replace(&mut self.entries, vec![E::default(); entries]);
        self.shift = 64 - entries.trailing_zeros();
        for e in old.into_iter().filter(|e| e.key() != 0) {
            let (i, found) = self.probe(e.key());
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
        /// Subtracts from the value at the key, removing it at 0.
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

    /// Runs `ops` on a table of entries `E` and on a map keyed by stored key, checking they
    /// agree throughout.
    fn against_a_map<E: Entry>(
        ops: &[Op],
        to: impl Fn(u8) -> E::Value,
        from: impl Fn(E::Value) -> u8,
    ) -> Result<(), TestCaseError> {
        let mut table = FlatTable::<E>::default();
        let mut model: HashMap<u64, u8> = HashMap::new();
        for op in ops {
            let (k, delta) = match *op {
                Op::Add(k, n) => (k, i16::from(n)),
                Op::Sub(k, n) => (k, -i16::from(n)),
            };
            let stored = E::stored(k);
            let old = model.get(&stored).copied();
            let new = (i16::from(old.unwrap_or(0)) + delta).clamp(0, 255) as u8;
            let expect = (new > 0).then_some(new);
            match expect {
                Some(v) => model.insert(stored, v),
                None => model.remove(&stored),
            };
            let mut seen = None;
            table.modify(k, |v| {
                seen = v.map(&from);
                expect.map(&to)
            });
            prop_assert_eq!(seen, old);
            prop_assert_eq!(table.len(), model.len());
            prop_assert!(table.len() <= table.capacity());
        }
        for op in ops {
            let (Op::Add(k, _) | Op::Sub(k, _)) = *op;
            prop_assert_eq!(table.get(k).map(&from), model.get(&E::stored(k)).copied());
        }
        let present = table.entries.iter().filter(|e| e.key() != 0).count();
        prop_assert_eq!(present, model.len(), "no entry is left behind by removals");
        Ok(())
    }

    proptest! {
        #[test]
        fn pairs_behave_like_a_map(ops in proptest::collection::vec(op(), 0..400)) {
            against_a_map::<Pair<u32>>(&ops, u32::from, |v| v as u8)?;
        }

        #[test]
        fn packed_entries_behave_like_a_map(ops in proptest::collection::vec(op(), 0..400)) {
            against_a_map::<Packed8>(&ops, |v| v, |v| v)?;
        }

        #[test]
        fn tagged_entries_behave_like_a_map(ops in proptest::collection::vec(op(), 0..400)) {
            against_a_map::<Tagged32>(&ops, u32::from, |v| v as u8)?;
        }

        /// Keys whose tags agree are told apart by the check of the value: the table holds
        /// each, finds each and removes each alone, as a map of the whole keys would.
        #[test]
        fn tagged_keys_that_share_a_tag_are_told_apart_by_their_values(
            ops in proptest::collection::vec((0u64..6, any::<bool>()), 0..200),
        ) {
            // Keys 0..6 all share one tag: k * TAG_MUL differs from the first by k, which
            // stays in the low half. The value stored for key k is k, so the check is v == k.
            let inverse = {
                let mut x = TAG_MUL;
                for _ in 0..5 {
                    x = x.wrapping_mul(2u64.wrapping_sub(TAG_MUL.wrapping_mul(x)));
                }
                x
            };
            let base = 0x1234_5678_0000_0000u64;
            let key = |k: u64| base.wrapping_add(k).wrapping_mul(inverse);
            assert_eq!(Tagged32::stored(key(0)), Tagged32::stored(key(5)));
            let mut table = FlatTable::<Tagged32>::default();
            let mut model = std::collections::BTreeSet::new();
            for (k, insert) in ops {
                let mut seen = None;
                table.modify_by(key(k), |v| u64::from(v) == k, |old| {
                    seen = old;
                    insert.then_some(k as u32)
                });
                prop_assert_eq!(seen.is_some(), model.contains(&k));
                if insert { model.insert(k); } else { model.remove(&k); }
                prop_assert_eq!(table.len(), model.len());
                for j in 0..6u64 {
                    let got = table.get_by(key(j), |v| u64::from(v) == j);
                    prop_assert_eq!(got.is_some(), model.contains(&j));
                }
            }
        }
    }

    #[test]
    fn packed_entries_keep_keys_that_differ_in_low_bits_apart() {
        let stored: std::collections::HashSet<u64> = (0..4096).map(Packed8::stored).collect();
        assert_eq!(stored.len(), 4096);
        assert!(stored.iter().all(|k| k & 0xff == 0 && *k != 0));
        let e = Packed8::new(Packed8::stored(u64::MAX), 0xa5);
        assert_eq!((e.key(), e.value()), (Packed8::stored(u64::MAX), 0xa5));
    }

    #[test]
    fn reserve_makes_room_without_growing_later() {
        let mut table = FlatTable::<Pair<u64>>::default();
        table.reserve(1000);
        let entries = table.entries.len();
        assert!(table.capacity() >= 1000);
        let key = |k: u64| k.wrapping_mul(0x1234_5678_9ABC_DEF1);
        for k in 1..=1000u64 {
            table.modify(key(k), |v| {
                assert_eq!(v, None);
                Some(k)
            });
        }
        assert_eq!(
            table.entries.len(),
            entries,
            "no growth within the reservation"
        );
        assert_eq!(table.len(), 1000);
        for k in 1..=1000u64 {
            assert_eq!(table.get(key(k)), Some(k));
            table.modify(key(k), |_| None);
        }
        assert_eq!(table.len(), 0);
        assert!(table.entries.iter().all(|e| e.key() == 0));
    }

    #[test]
    fn an_empty_table_answers_without_allocating() {
        let table = FlatTable::<Pair<u64>>::default();
        assert_eq!(table.get(5), None);
        table.warm([1, 2, 3].into_iter());
        assert_eq!(table.bytes(), 0);
    }
}
