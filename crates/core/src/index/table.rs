//! The index's tables: the node table (keys, words and bits, in a narrow or a wide layout),
//! and the memory size of its hash maps.

use crate::flat_table::{Entry, FlatTable, Packed8, Pair};

/// The most workers an index keeps in a narrow node table (see [`NodeTable`]).
pub(super) const NARROW_MAX_WORKERS: usize = 8;

/// Spreads the words of one node over the key space (word 0 keeps the sequence hash itself).
const WORD_SALT: u64 = 0x9E37_79B9_7F4A_7C15;

/// The node table: `(sequence hash, word)` keys to the bits of that word's workers holding
/// the block. An index of at most [`NARROW_MAX_WORKERS`] workers keeps 8-bit words packed
/// with their keys in 8-byte entries (half the memory, so more of the table stays in the CPU
/// caches); a larger one keeps 64-bit words in 16-byte entries, so that a fleet of up to 64
/// workers still needs one probe per block.
pub(super) enum NodeTable {
    /// 8 workers per word.
    Narrow(FlatTable<Packed8>),
    /// 64 workers per word.
    Wide(FlatTable<Pair<u64>>),
}

/// Runs `$body` on the node table's inner table, whichever its layout (the layouts differ
/// only in their entry type).
macro_rules! each {
    ($table:expr, $t:ident => $body:expr) => {
        match $table {
            NodeTable::Narrow($t) => $body,
            NodeTable::Wide($t) => $body,
        }
    };
}

/// The key of word `word` of the node with sequence hash `seq`.
#[inline]
pub(super) fn node_key(seq: u64, word: usize) -> u64 {
    seq.wrapping_add((word as u64).wrapping_mul(WORD_SALT))
}

/// Sets `bit` of the word at `key`; true when it was not set.
#[inline]
fn set_in<E: Entry>(t: &mut FlatTable<E>, key: u64, bit: u64) -> bool
where
    E::Value: Into<u64> + TryFrom<u64>,
{
    let mut fresh = false;
    t.modify(key, |bits| {
        let bits = bits.map_or(0, Into::into);
        fresh = bits & bit == 0;
        E::Value::try_from(bits | bit).ok()
    });
    fresh
}

/// Clears `bit` of the word at `key`, dropping a word left empty; true when it was set.
#[inline]
fn clear_in<E: Entry>(t: &mut FlatTable<E>, key: u64, bit: u64) -> bool
where
    E::Value: Into<u64> + TryFrom<u64>,
{
    let mut was = false;
    t.modify(key, |bits| {
        let bits: u64 = bits?.into();
        was = bits & bit != 0;
        E::Value::try_from(bits & !bit)
            .ok()
            .filter(|_| bits & !bit != 0)
    });
    was
}

impl NodeTable {
    /// A table for an index of at most `max_workers` workers.
    pub fn for_workers(max_workers: usize) -> Self {
        if max_workers <= NARROW_MAX_WORKERS {
            NodeTable::Narrow(FlatTable::default())
        } else {
            NodeTable::Wide(FlatTable::default())
        }
    }

    /// log2 of the workers per word.
    #[inline]
    fn word_shift(&self) -> u32 {
        match self {
            NodeTable::Narrow(_) => 3,
            NodeTable::Wide(_) => 6,
        }
    }

    /// Workers per word.
    #[inline]
    pub fn word_bits(&self) -> usize {
        1 << self.word_shift()
    }

    /// The word of slot `ix`'s bit, and the bit (shifts and masks: a division by a
    /// variable word size costs more than the rest of a warm operation).
    #[inline]
    fn word_bit(&self, ix: usize) -> (usize, u64) {
        let shift = self.word_shift();
        (ix >> shift, 1 << (ix & ((1 << shift) - 1)))
    }

    /// The bits of word `word` of node `seq` (0 when absent).
    #[inline]
    pub fn word(&self, seq: u64, word: usize) -> u64 {
        let key = node_key(seq, word);
        each!(self, t => t.get(key).map_or(0, Into::into))
    }

    /// Sets the bit of slot `ix` at node `seq`; true when it was not set.
    #[inline]
    pub fn set_bit(&mut self, seq: u64, ix: usize) -> bool {
        let (word, bit) = self.word_bit(ix);
        let key = node_key(seq, word);
        each!(self, t => set_in(t, key, bit))
    }

    /// Clears the bit of slot `ix` at node `seq`, dropping words left empty; true when it
    /// was set.
    #[inline]
    pub fn clear_bit(&mut self, seq: u64, ix: usize) -> bool {
        let (word, bit) = self.word_bit(ix);
        let key = node_key(seq, word);
        each!(self, t => clear_in(t, key, bit))
    }

    /// Whether the bit of slot `ix` at node `seq` is set.
    #[inline]
    pub fn has_bit(&self, seq: u64, ix: usize) -> bool {
        let (word, bit) = self.word_bit(ix);
        self.word(seq, word) & bit != 0
    }

    /// Reads ahead the entries of slot `ix`'s word of the nodes `seqs` (see
    /// [`FlatTable::warm`]).
    pub fn warm(&self, seqs: impl Iterator<Item = u64>, ix: usize) {
        let (word, _) = self.word_bit(ix);
        let keys = seqs.map(|q| node_key(q, word));
        each!(self, t => t.warm(keys))
    }

    /// Makes room for `more` words beyond those present.
    pub fn reserve(&mut self, more: usize) {
        each!(self, t => t.reserve(more))
    }

    /// Words present.
    pub fn len(&self) -> usize {
        each!(self, t => t.len())
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        each!(self, t => t.bytes())
    }
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
