//! Helpers for the index's tables: the node table's keys and bits, reading a hash map's
//! entries ahead before a batch of writes, and a hash map's memory size.

use super::Map;
use crate::flat_table::FlatTable;

/// Spreads the words of one node over the key space (word 0 keeps the sequence hash itself).
const WORD_SALT: u64 = 0x9E37_79B9_7F4A_7C15;

/// The node table: `(sequence hash, word)` keys to the bits of that word's workers holding
/// the block.
pub(super) type NodeTable = FlatTable<u64>;

/// The key of word `word` of the node with sequence hash `seq`.
#[inline]
pub(super) fn node_key(seq: u64, word: usize) -> u64 {
    seq.wrapping_add((word as u64).wrapping_mul(WORD_SALT))
}

/// The word of slot `ix`'s bit, and the bit.
#[inline]
fn word_bit(ix: usize) -> (usize, u64) {
    (ix / 64, 1 << (ix % 64))
}

/// Sets the bit of slot `ix` at node `seq`; true when it was not set.
#[inline]
pub(super) fn set_bit(nodes: &mut NodeTable, seq: u64, ix: usize) -> bool {
    let (word, bit) = word_bit(ix);
    let (bits, _) = nodes.get_or_insert(node_key(seq, word), 0);
    let fresh = *bits & bit == 0;
    *bits |= bit;
    fresh
}

/// Clears the bit of slot `ix` at node `seq`, dropping words left empty; true when it was
/// set.
#[inline]
pub(super) fn clear_bit(nodes: &mut NodeTable, seq: u64, ix: usize) -> bool {
    let (word, bit) = word_bit(ix);
    let mut was = false;
    nodes.update(node_key(seq, word), |bits| {
        was = *bits & bit != 0;
        *bits &= !bit;
        *bits != 0
    });
    was
}

/// Whether the bit of slot `ix` at node `seq` is set.
#[inline]
pub(super) fn has_bit(nodes: &NodeTable, seq: u64, ix: usize) -> bool {
    let (word, bit) = word_bit(ix);
    nodes
        .get(node_key(seq, word))
        .is_some_and(|bits| bits & bit != 0)
}

/// Reads the map entries of `keys` before a batch of writes to them. The reads do not
/// depend on one another, so their cache misses overlap; the writes that follow then hit the
/// cache instead of waiting for one miss after another.
pub(super) fn warm<V: Copy + Into<u64>>(map: &Map<u64, V>, keys: impl Iterator<Item = u64>) {
    let mut acc = 0u64;
    for k in keys {
        acc ^= map.get(&k).map_or(0, |v| (*v).into());
    }
    std::hint::black_box(acc);
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
