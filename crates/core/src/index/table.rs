//! The flat node table's primitives: the key of a node word, setting, clearing and testing a
//! worker's bit, reading ahead before batched writes, and the table's memory size.

use super::Map;
use hashbrown::hash_map::Entry;

/// Spreads the words of one node over the key space (word 0 keeps the sequence hash itself).
const WORD_SALT: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline]
pub(super) fn node_key(seq: u64, word: usize) -> u64 {
    seq.wrapping_add((word as u64).wrapping_mul(WORD_SALT))
}

/// Reads the table entries of `keys` before a batch of writes to them. The reads do not
/// depend on one another, so their cache misses overlap; the writes that follow then hit the
/// cache instead of waiting for one miss after another. In the churn benchmark at 10M
/// entries (docs/benchmarks.md) this took apply from 3.1M to about 4.6M block events/s.
pub(super) fn warm<V: Copy + Into<u64>>(map: &Map<u64, V>, keys: impl Iterator<Item = u64>) {
    let mut acc = 0u64;
    for k in keys {
        acc ^= map.get(&k).map_or(0, |v| (*v).into());
    }
    std::hint::black_box(acc);
}

/// Sets the bit of slot `ix` at node `seq`; true when it was not set.
pub(super) fn set_bit(nodes: &mut Map<u64, u64>, seq: u64, ix: usize) -> bool {
    let word = nodes.entry(node_key(seq, ix / 64)).or_insert(0);
    let bit = 1u64 << (ix % 64);
    let fresh = *word & bit == 0;
    *word |= bit;
    fresh
}

/// Clears the bit of slot `ix` at node `seq`, dropping empty words; true when it was set.
pub(super) fn clear_bit(nodes: &mut Map<u64, u64>, seq: u64, ix: usize) -> bool {
    let bit = 1u64 << (ix % 64);
    match nodes.entry(node_key(seq, ix / 64)) {
        Entry::Occupied(mut word) if *word.get() & bit != 0 => {
            *word.get_mut() &= !bit;
            if *word.get() == 0 {
                word.remove();
            }
            true
        }
        _ => false,
    }
}

pub(super) fn has_bit(nodes: &Map<u64, u64>, seq: u64, ix: usize) -> bool {
    nodes
        .get(&node_key(seq, ix / 64))
        .is_some_and(|w| w & (1u64 << (ix % 64)) != 0)
}

/// Allocated bytes of a hashbrown table of `capacity` (one control byte per bucket plus one
/// group of trailing control bytes).
pub(super) fn table_bytes<K, V>(capacity: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        capacity + 1
    } else {
        capacity / 7 * 8
    };
    buckets * (std::mem::size_of::<(K, V)>() + 1) + 16
}
