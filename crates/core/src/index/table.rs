//! Helpers for the index's hash maps (the worker tables' maps and the small bookkeeping
//! maps): reading entries ahead before a batch of writes, and a map's memory size.

use super::Map;

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
