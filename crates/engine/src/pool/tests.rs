use super::*;
use kvroute_core::hashing::{chain, local_block_hash};
use proptest::prelude::*;
use std::collections::HashMap;

const BS: usize = 2;

fn seqs_of(blocks: &[[u32; BS]]) -> Vec<SequenceHash> {
    let mut prev = None;
    blocks
        .iter()
        .map(|b| {
            let s = chain(prev, local_block_hash(b));
            prev = Some(s);
            s
        })
        .collect()
}

/// Admits a request the way the engine does: reuse the cached prefix, allocate the rest,
/// cache the new blocks. None when the pool is too full.
fn admit(pool: &mut BlockPool, blocks: &[[u32; BS]]) -> Option<Vec<BlockId>> {
    let seqs = seqs_of(blocks);
    let hit = pool.match_prefix(&seqs);
    // Reference the hits first, so that the allocation cannot evict them.
    let mut ids = pool
        .acquire(&seqs[..hit])
        .expect("matched blocks are cached");
    let Some(fresh) = pool.allocate(seqs.len() - hit) else {
        finish(pool, &ids);
        return None;
    };
    let run: Vec<FullBlock<'_>> = fresh
        .iter()
        .zip(&seqs[hit..])
        .zip(&blocks[hit..])
        .map(|((&block, &seq), tokens)| FullBlock { block, seq, tokens })
        .collect();
    pool.cache(
        hit.checked_sub(1).map(|i| (seqs[i], ids[i])),
        &run,
        Namespace::default(),
    );
    ids.extend(fresh);
    Some(ids)
}

fn finish(pool: &mut BlockPool, ids: &[BlockId]) {
    let rev: Vec<BlockId> = ids.iter().rev().copied().collect();
    pool.release(&rev);
}

#[test]
fn prefix_is_reused_and_evicted_deepest_first() {
    let mut pool = BlockPool::new(4, BS);
    let a = [[1, 1], [2, 2], [3, 3]];
    let ids = admit(&mut pool, &a).unwrap();
    assert_eq!(pool.used_count(), 3);
    let ev = pool.take_events();
    assert_eq!(ev.len(), 1);
    let KvEvent::Stored(s) = &ev[0] else { panic!() };
    assert_eq!(s.parent, None);
    assert_eq!(s.token_ids, vec![1, 1, 2, 2, 3, 3]);
    finish(&mut pool, &ids);
    assert_eq!((pool.free_count(), pool.cached_count()), (4, 3));
    // A request sharing two blocks reuses them and takes one fresh block (the never-used
    // one at the head of the free list).
    let b = [[1, 1], [2, 2], [9, 9]];
    let ids_b = admit(&mut pool, &b).unwrap();
    assert_eq!(ids_b[..2], ids[..2]);
    assert!(pool
        .take_events()
        .iter()
        .all(|e| matches!(e, KvEvent::Stored(_))));
    // The next allocation must evict: the deepest block of `a` goes first.
    let c = [[7, 7]];
    admit(&mut pool, &c).unwrap();
    let ev = pool.take_events();
    let KvEvent::Removed { block_hashes } = &ev[0] else {
        panic!("{ev:?}")
    };
    assert_eq!(block_hashes, &vec![engine_hash(seqs_of(&a)[2])]);
    pool.check_invariants().unwrap();
}

#[test]
fn allocation_beyond_free_blocks_changes_nothing() {
    let mut pool = BlockPool::new(2, BS);
    let held = admit(&mut pool, &[[1, 1], [2, 2]]).unwrap();
    assert!(pool.allocate(1).is_none());
    assert!(admit(&mut pool, &[[5, 5]]).is_none());
    assert!(pool.acquire(&seqs_of(&[[8, 8]])).is_none());
    pool.check_invariants().unwrap();
    finish(&mut pool, &held);
    assert_eq!(pool.free_count(), 2);
}

#[test]
fn copies_are_cached_and_evicted_one_by_one_and_clear_forgets_all() {
    let mut pool = BlockPool::new(3, BS);
    // Two requests computing the same block at once: each copy is announced.
    let seqs = seqs_of(&[[4, 4]]);
    let x = pool.allocate(2).unwrap();
    let ns = Namespace::default();
    pool.cache(
        None,
        &[FullBlock {
            block: x[0],
            seq: seqs[0],
            tokens: &[4, 4],
        }],
        ns,
    );
    pool.cache(
        None,
        &[FullBlock {
            block: x[1],
            seq: seqs[0],
            tokens: &[4, 4],
        }],
        ns,
    );
    assert_eq!(pool.take_events().len(), 2);
    assert_eq!(pool.cached_count(), 1);
    pool.release(&x);
    // Evicting the first copy keeps the hash cached through the second.
    let y = pool.allocate(2).unwrap();
    assert_eq!(pool.take_events().len(), 1);
    assert!(pool.is_cached(seqs[0]));
    let z = pool.allocate(1).unwrap();
    assert!(!pool.is_cached(seqs[0]));
    pool.check_invariants().unwrap();
    pool.release(&y);
    pool.release(&z);
    let x = pool.allocate(1).unwrap();
    pool.take_events();
    pool.clear();
    assert_eq!(pool.take_events(), vec![KvEvent::Cleared]);
    assert_eq!(pool.cached_count(), 0);
    pool.release(&x);
    pool.check_invariants().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Copies of hashes that share cache buckets (a pool of 8 blocks has 16 buckets): every
    /// hash stays found through its remaining copies, whichever copy goes first.
    #[test]
    fn copies_in_shared_buckets_stay_found_until_the_last_goes(
        hashes in prop::collection::vec(0u64..6, 8),
        order in Just((0..8u32).collect::<Vec<_>>()).prop_shuffle(),
    ) {
        let mut pool = BlockPool::new(8, BS);
        let ids = pool.allocate(8).unwrap();
        for (&b, &h) in ids.iter().zip(&hashes) {
            let fb = FullBlock { block: b, seq: SequenceHash(h), tokens: &[0, 0] };
            pool.cache(None, &[fb], Namespace::default());
        }
        pool.check_invariants().map_err(TestCaseError::fail)?;
        // Release in the shuffled order, then evict one block at a time in that order.
        let rev: Vec<BlockId> = order.iter().map(|&i| ids[i as usize]).collect();
        pool.release(&rev);
        let mut left = hashes.clone();
        for &i in &order {
            pool.allocate(1).unwrap();
            let h = hashes[ids.iter().position(|&b| b == ids[i as usize]).unwrap()];
            let at = left.iter().position(|&x| x == h).unwrap();
            left.swap_remove(at);
            pool.check_invariants().map_err(TestCaseError::fail)?;
            prop_assert_eq!(pool.is_cached(SequenceHash(h)), left.contains(&h));
        }
        prop_assert_eq!(pool.cached_count(), 0);
    }
}

#[derive(Clone, Debug)]
enum Op {
    Start(Vec<[u32; BS]>),
    Finish(prop::sample::Index),
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => prop::collection::vec(prop::array::uniform2(0u32..3), 1..6).prop_map(Op::Start),
        4 => any::<prop::sample::Index>().prop_map(Op::Finish),
        1 => Just(Op::Clear),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Refcounts never go negative, the free list and cached map stay consistent, and the
    /// events, replayed, give exactly the cached set: every Stored hash is later Removed or
    /// still resident.
    #[test]
    fn pool_invariants_hold_and_events_mirror_the_cache(
        ops in prop::collection::vec(op(), 1..80),
        blocks in 1usize..12,
        tokens in any::<bool>(),
    ) {
        let mut pool = BlockPool::new(blocks, BS).with_event_tokens(tokens);
        let mut active: Vec<Vec<BlockId>> = Vec::new();
        let mut mirror: HashMap<EngineHash, u32> = HashMap::new();
        for op in ops {
            match op {
                Op::Start(chain) => {
                    if let Some(ids) = admit(&mut pool, &chain) {
                        active.push(ids);
                    }
                }
                Op::Finish(i) => {
                    if !active.is_empty() {
                        let ids = active.swap_remove(i.index(active.len()));
                        finish(&mut pool, &ids);
                    }
                }
                Op::Clear => pool.clear(),
            }
            pool.check_invariants().map_err(TestCaseError::fail)?;
            for e in pool.take_events() {
                match e {
                    KvEvent::Stored(s) => {
                        prop_assert!(tokens, "hashed events were asked for");
                        if let Some(p) = s.parent {
                            prop_assert!(mirror.contains_key(&p), "parent not cached");
                        }
                        prop_assert_eq!(s.token_ids.len(), s.block_hashes.len() * BS);
                        for h in s.block_hashes {
                            *mirror.entry(h).or_insert(0) += 1;
                        }
                    }
                    KvEvent::StoredHashed(s) => {
                        prop_assert!(!tokens, "token events were asked for");
                        if let Some(p) = s.parent {
                            prop_assert!(mirror.contains_key(&p), "parent not cached");
                        }
                        for (h, seq) in s.block_hashes.iter().zip(&s.sequence_hashes) {
                            // Named by pool index, each name cached once at a time.
                            prop_assert_eq!(pool.blocks[h.0 as usize].seq(), Some(*seq));
                            prop_assert!(mirror.insert(*h, 1).is_none(), "a name stored twice");
                        }
                    }
                    KvEvent::Removed { block_hashes } => {
                        for h in block_hashes {
                            let c = mirror.get_mut(&h);
                            prop_assert!(c.is_some(), "removed a hash never stored");
                            let c = c.unwrap();
                            *c -= 1;
                            if *c == 0 {
                                mirror.remove(&h);
                            }
                        }
                    }
                    KvEvent::Cleared => mirror.clear(),
                }
            }
            // Copies per hash, from the pool's blocks.
            let mut cached: HashMap<EngineHash, u32> = HashMap::new();
            for (i, b) in pool.blocks.iter().enumerate() {
                if let Some(s) = b.seq() {
                    let name = if tokens { engine_hash(s) } else { EngineHash(i as u64) };
                    *cached.entry(name).or_insert(0) += 1;
                }
            }
            prop_assert_eq!(&cached, &mirror);
            let held: usize = active.iter().map(|a| a.len()).sum();
            let refs: u32 = pool.blocks.iter().map(|b| if b.free() { 0 } else { b.link }).sum();
            prop_assert_eq!(refs as usize, held);
        }
        for ids in active.drain(..) {
            finish(&mut pool, &ids);
        }
        prop_assert_eq!(pool.free_count(), blocks);
    }
}
