//! The host tier: KV blocks kept in host memory after the device, as vLLM's offloading
//! connector keeps them. Every block the device caches is written through to the host tier
//! (a block already there is refreshed), which holds `capacity` blocks and evicts the least
//! recently written. A request whose prefix continues past the device's hit in the host tier
//! loads those blocks back (at a cost per token) instead of computing them, and reports them
//! cached, as vLLM does. Its events name blocks by their engine hash alone (the connector's
//! default bare form): a `Stored` without tokens for each new block, a `Removed` for each
//! eviction. An engine whose events carry the router's hashes (a router in the same process,
//! as in the fleet simulator) sends `StoredHashed` instead, under the same names.

use crate::pool::engine_hash;
use kvroute_core::{KvEvent, Namespace, SequenceHash, StoredBlocks, StoredHashed};
use std::collections::BTreeMap;

type Map<K, V> = hashbrown::HashMap<K, V, foldhash::fast::RandomState>;

/// The host tier of one engine.
pub(crate) struct HostTier {
    capacity: usize,
    /// Sequence hash -> the stamp of its last write.
    held: Map<u64, u64>,
    /// Stamp -> sequence hash, oldest first.
    order: BTreeMap<u64, u64>,
    next_stamp: u64,
    events: Vec<KvEvent>,
    /// Stores carry the router's sequence hashes (`StoredHashed`) instead of being bare.
    hashed: bool,
}

impl HostTier {
    /// An empty tier of `capacity` blocks (> 0); `hashed`: its stores carry the router's
    /// sequence hashes.
    pub(crate) fn new(capacity: usize, hashed: bool) -> Self {
        Self {
            capacity,
            held: Map::default(),
            order: BTreeMap::new(),
            next_stamp: 0,
            events: Vec::new(),
            hashed,
        }
    }

    /// Blocks held.
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }

    /// Writes blocks through from the device, in order: new ones are announced, present
    /// ones refreshed, the oldest evicted when full.
    pub(crate) fn write(&mut self, seqs: &[SequenceHash]) {
        let mut stored = Vec::new();
        let mut stored_seqs = Vec::new();
        let mut removed = Vec::new();
        for seq in seqs {
            let stamp = self.next_stamp;
            self.next_stamp += 1;
            if let Some(old) = self.held.insert(seq.0, stamp) {
                self.order.remove(&old);
            } else {
                stored.push(engine_hash(*seq));
                if self.hashed {
                    stored_seqs.push(*seq);
                }
                if self.held.len() > self.capacity {
                    if let Some((_, victim)) = self.order.pop_first() {
                        self.held.remove(&victim);
                        removed.push(engine_hash(SequenceHash(victim)));
                    }
                }
            }
            self.order.insert(stamp, seq.0);
        }
        if !stored.is_empty() && self.hashed {
            self.events.push(KvEvent::StoredHashed(StoredHashed {
                parent: None,
                block_hashes: stored,
                sequence_hashes: stored_seqs,
            }));
        } else if !stored.is_empty() {
            self.events.push(KvEvent::Stored(StoredBlocks {
                parent: None,
                block_hashes: stored,
                token_ids: Vec::new(),
                block_size: 0,
                namespace: Namespace::default(),
                block_keys: Vec::new(),
            }));
        }
        if !removed.is_empty() {
            self.events.push(KvEvent::Removed {
                block_hashes: removed,
            });
        }
    }

    /// Leading blocks of `seqs` held.
    pub(crate) fn run(&self, seqs: &[SequenceHash]) -> usize {
        seqs.iter()
            .take_while(|s| self.held.contains_key(&s.0))
            .count()
    }

    /// Drops every block (announced as removed).
    pub(crate) fn clear(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let block_hashes = self
            .order
            .values()
            .map(|s| engine_hash(SequenceHash(*s)))
            .collect();
        self.held.clear();
        self.order.clear();
        self.events.push(KvEvent::Removed { block_hashes });
    }

    /// Moves the events since the last call to the end of `out`, in order.
    pub(crate) fn drain_events_into(&mut self, out: &mut Vec<KvEvent>) {
        out.append(&mut self.events);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seqs(r: std::ops::Range<u64>) -> Vec<SequenceHash> {
        r.map(SequenceHash).collect()
    }

    #[test]
    fn writes_announce_new_blocks_and_evict_the_oldest() {
        let mut h = HostTier::new(3, false);
        h.write(&seqs(0..3));
        h.write(&seqs(0..1)); // refreshed: block 1 is now the oldest
        h.write(&seqs(3..4));
        let mut ev = Vec::new();
        h.drain_events_into(&mut ev);
        let hashes = |r: &[u64]| r.iter().map(|s| engine_hash(SequenceHash(*s))).collect();
        assert_eq!(ev.len(), 3, "{ev:?}");
        assert!(
            matches!(&ev[0], KvEvent::Stored(s) if s.block_hashes == hashes(&[0, 1, 2]) && s.token_ids.is_empty())
        );
        assert!(matches!(&ev[1], KvEvent::Stored(s) if s.block_hashes == hashes(&[3])));
        assert_eq!(
            ev[2],
            KvEvent::Removed {
                block_hashes: hashes(&[1])
            }
        );
        assert_eq!(h.run(&seqs(0..1)), 1);
        assert_eq!(h.run(&seqs(0..4)), 1, "block 1 was evicted");
        assert_eq!(h.run(&seqs(2..4)), 2);
        h.clear();
        assert_eq!((h.len(), h.run(&seqs(0..4))), (0, 0));
    }

    #[test]
    fn a_hashed_tier_stores_the_router_hashes_under_the_same_names() {
        let mut h = HostTier::new(2, true);
        h.write(&seqs(5..8));
        let mut ev = Vec::new();
        h.drain_events_into(&mut ev);
        let names: Vec<_> = (5..8).map(|s| engine_hash(SequenceHash(s))).collect();
        assert_eq!(
            ev,
            vec![
                KvEvent::StoredHashed(StoredHashed {
                    parent: None,
                    block_hashes: names.clone(),
                    sequence_hashes: seqs(5..8),
                }),
                KvEvent::Removed {
                    block_hashes: vec![names[0]]
                },
            ]
        );
    }
}
