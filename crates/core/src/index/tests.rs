use super::*;
use crate::hashing::{local_block_hashes, Namespace};

const BS: usize = 4;

fn index() -> PrefixIndex {
    PrefixIndex::new(BlockSize::new(BS).unwrap())
}

/// Tokens of `n` blocks where block `i` is filled with `ids[i]`.
fn tokens(ids: &[u32]) -> Vec<u32> {
    ids.iter().flat_map(|&i| [i; BS]).collect()
}

fn stored(parent: Option<u64>, hashes: &[u64], ids: &[u32]) -> KvEvent {
    KvEvent::Stored(StoredBlocks {
        parent: parent.map(EngineHash),
        block_hashes: hashes.iter().map(|h| EngineHash(*h)).collect(),
        token_ids: tokens(ids),
        block_size: BS,
        namespace: Namespace::default(),
        block_keys: Vec::new(),
    })
}

fn removed(hashes: &[u64]) -> KvEvent {
    KvEvent::Removed {
        block_hashes: hashes.iter().map(|h| EngineHash(*h)).collect(),
    }
}

fn query(ids: &[u32]) -> Vec<LocalBlockHash> {
    local_block_hashes(&tokens(ids), BS)
}

#[test]
fn stored_chain_matches_contiguous_prefix() {
    let mut ix = index();
    let w = WorkerId(3);
    ix.apply(w, &stored(None, &[10, 11], &[1, 2])).unwrap();
    ix.apply(w, &stored(Some(11), &[12], &[3])).unwrap();
    assert_eq!(ix.find_matches(&query(&[1, 2, 3, 4])).depth(w), 3);
    assert_eq!(ix.find_matches(&query(&[1, 2])).depth(w), 2);
    assert_eq!(
        ix.find_matches(&query(&[2, 3])).depth(w),
        0,
        "position matters"
    );
    assert_eq!(ix.block_count(w), 3);
    assert_eq!(ix.entries(), 3);
}

#[test]
fn removal_in_the_middle_cuts_the_match() {
    let mut ix = index();
    let w = WorkerId(1);
    ix.apply(w, &stored(None, &[10, 11, 12], &[1, 2, 3]))
        .unwrap();
    ix.apply(w, &removed(&[11])).unwrap();
    assert_eq!(ix.find_matches(&query(&[1, 2, 3])).depth(w), 1);
    ix.apply(w, &stored(Some(10), &[11], &[2])).unwrap();
    assert_eq!(ix.find_matches(&query(&[1, 2, 3])).depth(w), 3);
}

#[test]
fn workers_sharing_a_prefix_diverge() {
    let mut ix = index();
    ix.apply(WorkerId(1), &stored(None, &[10, 11], &[1, 2]))
        .unwrap();
    ix.apply(WorkerId(2), &stored(None, &[20, 21, 22], &[1, 2, 3]))
        .unwrap();
    ix.apply(WorkerId(3), &stored(None, &[30], &[9])).unwrap();
    let m = ix.find_matches(&query(&[1, 2, 3]));
    assert_eq!(
        m.iter().collect::<Vec<_>>(),
        vec![(WorkerId(1), 2), (WorkerId(2), 3)]
    );
    assert_eq!(m.max_depth(), 3);
}

#[test]
fn namespaces_do_not_share_blocks() {
    let mut ix = index();
    let KvEvent::Stored(mut s) = stored(None, &[10], &[1]) else {
        unreachable!()
    };
    s.namespace = Namespace::new(Some("adapter"), None);
    ix.apply(WorkerId(1), &KvEvent::Stored(s)).unwrap();
    assert!(ix.find_matches(&query(&[1])).is_empty());
    let ns = Namespace::new(Some("adapter"), None);
    let prompt = crate::BlockedPrompt::new(&tokens(&[1]), crate::BlockSize::new(BS).unwrap(), ns);
    assert_eq!(ix.find_matches_seq(&prompt.sequence).depth(WorkerId(1)), 1);
}

#[test]
fn a_continuation_inherits_its_chains_namespace() {
    // vLLM names the salt only in the first block's extra keys: the event that continues
    // the chain carries no namespace, and must still match salted prompts only.
    let mut ix = index();
    let salt = Namespace::new(None, Some("s1"));
    let KvEvent::Stored(mut first) = stored(None, &[10], &[1]) else {
        unreachable!()
    };
    first.namespace = salt;
    ix.apply(WorkerId(1), &KvEvent::Stored(first)).unwrap();
    ix.apply(WorkerId(1), &stored(Some(10), &[11], &[2]))
        .unwrap();
    let b = crate::BlockSize::new(BS).unwrap();
    let salted = crate::BlockedPrompt::new(&tokens(&[1, 2]), b, salt);
    assert_eq!(ix.find_matches_seq(&salted.sequence).depth(WorkerId(1)), 2);
    assert!(ix.find_matches(&query(&[1, 2])).is_empty());
    let other = crate::BlockedPrompt::new(&tokens(&[1, 2]), b, Namespace::new(None, Some("s2")));
    assert!(ix.find_matches_seq(&other.sequence).is_empty());
}

#[test]
fn keyed_blocks_match_only_their_keys() {
    let mut ix = index();
    let KvEvent::Stored(mut s) = stored(None, &[10, 11], &[1, 2]) else {
        unreachable!()
    };
    s.block_keys = vec![0, 99];
    ix.apply(WorkerId(1), &KvEvent::Stored(s.clone())).unwrap();
    // The unkeyed first block matches; the keyed second does not match plain tokens.
    assert_eq!(ix.find_matches(&query(&[1, 2])).depth(WorkerId(1)), 1);
    let mut keyed = query(&[1, 2]);
    keyed[1] = keyed[1].keyed(99);
    assert_eq!(ix.find_matches(&keyed).depth(WorkerId(1)), 2);
    s.block_keys = vec![99];
    assert!(matches!(
        ix.apply(WorkerId(2), &KvEvent::Stored(s)),
        Err(IndexError::KeyCountMismatch {
            keys: 1,
            blocks: 2,
            ..
        })
    ));
}

#[test]
fn rejected_events_change_nothing_and_are_counted() {
    let mut ix = index();
    let w = WorkerId(1);
    ix.apply(w, &stored(None, &[10], &[1])).unwrap();
    let KvEvent::Stored(mut bad) = stored(Some(10), &[11], &[2]) else {
        unreachable!()
    };
    bad.block_size = 16;
    let e = ix.apply(w, &KvEvent::Stored(bad.clone())).unwrap_err();
    assert_eq!(e.kind(), RejectKind::BlockSizeMismatch);
    bad.block_size = BS;
    bad.token_ids.pop();
    let e = ix.apply(w, &KvEvent::Stored(bad)).unwrap_err();
    assert_eq!(e.kind(), RejectKind::TokenCountMismatch);
    let e = ix.apply(w, &stored(Some(99), &[11], &[2])).unwrap_err();
    assert_eq!(
        e,
        IndexError::UnknownParent {
            worker: w,
            parent: 99
        }
    );
    assert_eq!(ix.entries(), 1);
    let e = ix.apply(w, &removed(&[10, 77])).unwrap_err();
    assert_eq!(
        e,
        IndexError::UnknownRemovedHash {
            worker: w,
            unknown: 1,
            total: 2
        }
    );
    assert_eq!(
        ix.entries(),
        0,
        "the known hash of a partly unknown removal goes"
    );
    let e = ix.apply(WorkerId(5), &removed(&[1])).unwrap_err();
    assert_eq!(e.kind(), RejectKind::UnknownRemovedHash);
    let st = ix.stats();
    assert_eq!(st.applied, 1);
    assert_eq!(st.rejected(RejectKind::BlockSizeMismatch), 1);
    assert_eq!(st.rejected(RejectKind::TokenCountMismatch), 1);
    assert_eq!(st.rejected(RejectKind::UnknownParent), 1);
    assert_eq!(st.rejected(RejectKind::UnknownRemovedHash), 2);
    assert_eq!(st.blocks_removed, 1);
}

#[test]
fn cleared_and_remove_worker_drop_everything() {
    let mut ix = index();
    ix.apply(WorkerId(1), &stored(None, &[10, 11], &[1, 2]))
        .unwrap();
    ix.apply(WorkerId(2), &stored(None, &[20, 21], &[1, 2]))
        .unwrap();
    ix.apply(WorkerId(1), &KvEvent::Cleared).unwrap();
    assert_eq!(ix.block_count(WorkerId(1)), 0);
    assert_eq!(ix.workers().count(), 2);
    assert_eq!(ix.find_matches(&query(&[1, 2])).depth(WorkerId(2)), 2);
    ix.remove_worker(WorkerId(2));
    assert_eq!(ix.workers().collect::<Vec<_>>(), vec![WorkerId(1)]);
    assert!(ix.find_matches(&query(&[1, 2])).is_empty());
    assert_eq!(ix.nodes.len(), 0, "no empty nodes linger");
    // The freed slot is reused by the next worker.
    ix.apply(WorkerId(9), &stored(None, &[90], &[1])).unwrap();
    assert_eq!(ix.slots.len(), 2);
}

#[test]
fn same_block_under_two_engine_hashes_is_held_until_both_go() {
    let mut ix = index();
    let w = WorkerId(1);
    ix.apply(w, &stored(None, &[10], &[1])).unwrap();
    ix.apply(w, &stored(None, &[11], &[1])).unwrap();
    assert_eq!(ix.block_count(w), 1);
    ix.apply(w, &removed(&[10])).unwrap();
    assert_eq!(ix.find_matches(&query(&[1])).depth(w), 1);
    ix.apply(w, &removed(&[11])).unwrap();
    assert_eq!(ix.find_matches(&query(&[1])).depth(w), 0);
    assert_eq!(ix.block_count(w), 0);
}

#[test]
fn engine_hash_reused_for_other_tokens_moves_the_block() {
    let mut ix = index();
    let w = WorkerId(1);
    ix.apply(w, &stored(None, &[10], &[1])).unwrap();
    ix.apply(w, &stored(None, &[10], &[2])).unwrap();
    assert_eq!(ix.find_matches(&query(&[1])).depth(w), 0);
    assert_eq!(ix.find_matches(&query(&[2])).depth(w), 1);
    assert_eq!(ix.block_count(w), 1);
}

#[test]
fn more_than_64_workers_use_further_words() {
    let mut ix = index();
    for w in 0..200u64 {
        // Worker w holds the first (w % 5) + 1 blocks of the shared prompt.
        let n = (w % 5) as usize + 1;
        let hashes: Vec<u64> = (0..n as u64).map(|i| w * 100 + i).collect();
        let ids: Vec<u32> = (1..=n as u32).collect();
        ix.apply(WorkerId(w), &stored(None, &hashes, &ids)).unwrap();
    }
    let m = ix.find_matches(&query(&[1, 2, 3, 4, 5, 6]));
    for w in 0..200u64 {
        assert_eq!(m.depth(WorkerId(w)), (w % 5) as usize + 1, "worker {w}");
    }
    ix.remove_worker(WorkerId(150));
    assert_eq!(ix.find_matches(&query(&[1])).depth(WorkerId(150)), 0);
    assert_eq!(ix.find_matches(&query(&[1])).iter().count(), 199);
}

#[test]
fn worker_limit_is_enforced() {
    let mut ix = PrefixIndex::with_max_workers(BlockSize::new(BS).unwrap(), 2);
    ix.add_worker(WorkerId(1)).unwrap();
    ix.add_worker(WorkerId(2)).unwrap();
    let e = ix
        .apply(WorkerId(3), &stored(None, &[1], &[1]))
        .unwrap_err();
    assert_eq!(e.kind(), RejectKind::TooManyWorkers);
    ix.remove_worker(WorkerId(1));
    ix.apply(WorkerId(3), &stored(None, &[1], &[1])).unwrap();
}

#[test]
fn memory_grows_with_entries() {
    let mut ix = index();
    let empty = ix.memory_bytes();
    let ids: Vec<u32> = (0..1000).collect();
    let hashes: Vec<u64> = (0..1000).collect();
    ix.apply(WorkerId(1), &stored(None, &hashes, &ids)).unwrap();
    let per_entry = (ix.memory_bytes() - empty) / ix.entries();
    assert!((17..=128).contains(&per_entry), "{per_entry}");
}

#[test]
fn table_bytes_follows_hashbrown_capacity() {
    let mut m: Map<u64, u64> = Map::default();
    m.insert(1, 1);
    assert_eq!(table_bytes::<u64, u64>(m.capacity()), 4 * 17 + 16);
    for i in 0..100 {
        m.insert(i, i);
    }
    assert_eq!(m.capacity(), 112);
    assert_eq!(table_bytes::<u64, u64>(m.capacity()), 128 * 17 + 16);
}

#[test]
fn each_stored_copy_needs_its_own_removal() {
    let mut ix = index();
    let w = WorkerId(1);
    ix.apply(w, &stored(None, &[10, 11], &[1, 2])).unwrap();
    ix.apply(w, &stored(None, &[10, 11], &[1, 2])).unwrap();
    assert_eq!(ix.block_count(w), 2);
    ix.apply(w, &removed(&[10, 11])).unwrap();
    assert_eq!(
        ix.find_matches(&query(&[1, 2])).depth(w),
        2,
        "a copy remains"
    );
    ix.apply(w, &removed(&[11])).unwrap();
    assert_eq!(ix.find_matches(&query(&[1, 2])).depth(w), 1);
    ix.apply(w, &removed(&[10])).unwrap();
    assert_eq!(ix.block_count(w), 0);
    assert_eq!(ix.stats().rejected(RejectKind::UnknownRemovedHash), 0);
    assert_eq!(
        ix.apply(w, &removed(&[10])).unwrap_err().kind(),
        RejectKind::UnknownRemovedHash
    );
}

#[test]
fn batches_apply_in_order_and_report_rejections() {
    let mut ix = index();
    let w = WorkerId(1);
    let batch = [
        stored(None, &[10, 11, 12], &[1, 2, 3]),
        removed(&[12]),
        removed(&[99]),
        removed(&[11]),
        stored(Some(10), &[13], &[4]),
        KvEvent::Cleared,
        stored(None, &[20], &[5]),
    ];
    let out = ix.apply_batch(w, &batch[..5]);
    assert_eq!(out.applied, 4);
    assert_eq!(out.rejected.len(), 1);
    assert_eq!(out.rejected[0].kind(), RejectKind::UnknownRemovedHash);
    assert_eq!(ix.find_matches(&query(&[1, 4])).depth(w), 2);
    assert_eq!(ix.find_matches(&query(&[1, 2])).depth(w), 1);
    let out = ix.apply_batch(w, &batch[5..]);
    assert_eq!((out.applied, out.rejected.len()), (2, 0));
    assert_eq!(ix.entries(), 1);
    assert_eq!(ix.stats().applied, 6);
}

#[test]
fn hashed_stores_match_token_stores() {
    let mut by_tokens = index();
    let mut by_hashes = index();
    let w = WorkerId(1);
    by_tokens
        .apply(w, &stored(None, &[10, 11], &[1, 2]))
        .unwrap();
    let seqs = crate::hashing::sequence_hashes(&query(&[1, 2]));
    let hashed = |parent: Option<u64>, blocks: &[u64], seqs: &[SequenceHash]| {
        KvEvent::StoredHashed(StoredHashed {
            parent: parent.map(EngineHash),
            block_hashes: blocks.iter().map(|h| EngineHash(*h)).collect(),
            sequence_hashes: seqs.to_vec(),
        })
    };
    by_hashes
        .apply(w, &hashed(None, &[10], &seqs[..1]))
        .unwrap();
    by_hashes
        .apply(w, &hashed(Some(10), &[11], &seqs[1..]))
        .unwrap();
    let q = query(&[1, 2, 3]);
    assert_eq!(by_tokens.find_matches(&q), by_hashes.find_matches(&q));
    let e = by_hashes
        .apply(w, &hashed(None, &[12, 13], &seqs[..1]))
        .unwrap_err();
    assert_eq!(e.kind(), RejectKind::HashCountMismatch);
    let e = by_hashes
        .apply(w, &hashed(Some(99), &[12], &seqs[..1]))
        .unwrap_err();
    assert_eq!(e.kind(), RejectKind::UnknownParent);
    assert_eq!(by_hashes.stats().rejected(RejectKind::HashCountMismatch), 1);
}

#[test]
fn reserved_tables_hold_the_capacity_without_growing_and_re_registering_adds_nothing() {
    let mut ix = index();
    let (a, b) = (WorkerId(1), WorkerId(2));
    for w in [a, b] {
        ix.add_worker(w).unwrap();
        ix.reserve(w, 300);
    }
    let reserved = ix.memory_bytes();
    // Registering again with the same capacity reserves nothing more.
    ix.reserve(a, 300);
    assert_eq!(ix.memory_bytes(), reserved);
    // 300 distinct blocks on each worker fill the reservation without a rehash.
    for w in [a, b] {
        let base = w.0 as u32 * 1000;
        let ids: Vec<u32> = (base..base + 300).collect();
        let hashes: Vec<u64> = ids.iter().map(|&i| u64::from(i) + 7).collect();
        ix.apply(w, &stored(None, &hashes, &ids)).unwrap();
    }
    assert_eq!(ix.entries(), 600);
    assert_eq!(ix.memory_bytes(), reserved);
    // Beyond the limit, only the limit is reserved ahead.
    let c = WorkerId(3);
    ix.add_worker(c).unwrap();
    ix.reserve(c, usize::MAX);
    // The engine table's log (16 bytes and a bit per block) and its hash table (8-byte
    // entries), and the node table (16-byte entries); a flat table reserved for n keys has
    // fewer than 2 x 8/5 x n entries.
    let grown = ix.memory_bytes() - reserved;
    assert!(grown > 16 * MAX_RESERVED_BLOCKS, "{grown}");
    assert!(
        grown <= (17 + 16 * 8 / 5 + 16 * 16 / 5) * MAX_RESERVED_BLOCKS + 1024,
        "{grown}"
    );
}

#[test]
fn a_worker_past_its_block_limit_loses_its_oldest_blocks_first() {
    let mut ix = index();
    ix.set_max_blocks_per_worker(4);
    let (w, other) = (WorkerId(1), WorkerId(2));
    ix.apply(w, &stored(None, &[10, 11, 12], &[1, 2, 3]))
        .unwrap();
    ix.apply(other, &stored(None, &[10, 11, 12], &[1, 2, 3]))
        .unwrap();
    // Three more blocks of another prompt: the first prompt's two oldest go.
    ix.apply(w, &stored(None, &[20, 21, 22], &[7, 8, 9]))
        .unwrap();
    assert_eq!(ix.block_count(w), 4);
    assert_eq!(ix.evicted(w), 2);
    assert_eq!(ix.stats().blocks_evicted, 2);
    assert_eq!(ix.find_matches(&query(&[7, 8, 9])).depth(w), 3);
    assert!(ix.sequence_of(w, EngineHash(10)).is_none());
    assert!(ix.sequence_of(w, EngineHash(12)).is_some());
    // Only `w` lost them; the other worker's entries of the same blocks stay.
    assert_eq!(ix.find_matches(&query(&[1, 2, 3])).depth(other), 3);
    assert_eq!(ix.block_count(other), 3);
    // A removal of an evicted block is an unknown hash, as for any block not held.
    assert!(ix.apply(w, &removed(&[10])).is_err());
    // Lowering the limit applies at once.
    ix.set_max_blocks_per_worker(1);
    assert_eq!(ix.block_count(w), 1);
    assert_eq!(ix.evicted(w), 5);
    assert!(
        ix.sequence_of(w, EngineHash(22)).is_some(),
        "the newest stays"
    );
}

#[test]
fn the_eviction_order_stays_bounded_under_store_and_remove_churn() {
    let mut ix = index();
    ix.set_max_blocks_per_worker(1_000);
    let w = WorkerId(1);
    ix.apply(w, &stored(None, &[1], &[1])).unwrap();
    for k in 0..100_000u64 {
        let h = 1_000 + k;
        ix.apply(w, &stored(Some(1), &[h], &[2 + (k % 1000) as u32]))
            .unwrap();
        ix.apply(w, &removed(&[h])).unwrap();
    }
    assert_eq!(ix.block_count(w), 1);
    assert_eq!(ix.evicted(w), 0, "never past the limit: nothing evicted");
    let slot = ix.slots[ix.slot_of[&w]].as_ref().unwrap();
    // The table's log of 100,001 stores stays within its compaction bound (two chunks'
    // worth of dead entries plus the slack, about 100 KiB with the hash table).
    assert!(slot.blocks.bytes() < 256 << 10, "{}", slot.blocks.bytes());
    // The block stored first is still the oldest held: it would go first.
    assert_eq!(slot.blocks.iter().next().map(|e| e.0), Some(1));
}

#[test]
fn an_exported_worker_imports_as_the_same_blocks() {
    let b = crate::BlockSize::new(4).unwrap();
    let mut idx = PrefixIndex::new(b);
    let w = WorkerId(1);
    let tokens: Vec<u32> = (0..16).collect();
    idx.apply(
        w,
        &KvEvent::Stored(StoredBlocks {
            parent: None,
            block_hashes: (1..=4).map(EngineHash).collect(),
            token_ids: tokens.clone(),
            block_size: 4,
            namespace: Namespace::default(),
            block_keys: Vec::new(),
        }),
    )
    .unwrap();
    // Block 2 stored a second time (a second physical copy), then removed once: still held.
    idx.apply(
        w,
        &KvEvent::Stored(StoredBlocks {
            parent: Some(EngineHash(1)),
            block_hashes: vec![EngineHash(2)],
            token_ids: tokens[4..8].to_vec(),
            block_size: 4,
            namespace: Namespace::default(),
            block_keys: Vec::new(),
        }),
    )
    .unwrap();
    let exported = idx.export_worker(w);
    assert_eq!(exported.len(), 5);
    let mut copy = PrefixIndex::new(b);
    let (names, seqs): (Vec<_>, Vec<_>) = exported.into_iter().unzip();
    copy.apply(
        w,
        &KvEvent::StoredHashed(StoredHashed {
            parent: None,
            block_hashes: names,
            sequence_hashes: seqs,
        }),
    )
    .unwrap();
    let prompt = crate::hashing::BlockedPrompt::new(&tokens, b, Namespace::default());
    assert_eq!(copy.block_count(w), idx.block_count(w));
    for seq in &prompt.sequence {
        assert!(copy.contains(w, *seq) && idx.contains(w, *seq));
    }
    for i in [2u64, 2, 3] {
        idx.apply(
            w,
            &KvEvent::Removed {
                block_hashes: vec![EngineHash(i)],
            },
        )
        .ok();
        copy.apply(
            w,
            &KvEvent::Removed {
                block_hashes: vec![EngineHash(i)],
            },
        )
        .ok();
        assert_eq!(copy.block_count(w), idx.block_count(w));
    }
    assert!(PrefixIndex::new(b).export_worker(w).is_empty());
}
