//! Property tests of the routing core's invariants:
//! - the prefix index agrees with a brute-force model over random event sequences (shared
//!   prefixes, removals in the middle, Cleared, removed workers, more than 64 workers);
//! - every match is a contiguous prefix of the query;
//! - the load ledger counts each worker's distinct active blocks at every step and returns to
//!   zero once every request finished, whatever the order;
//! - `kv` always picks a candidate of minimal cost.

use kvroute_core::hashing::{chain, local_block_hash, sequence_hashes};
use kvroute_core::index::{IndexError, KvEvent, PrefixIndex, RejectKind, StoredBlocks};
use kvroute_core::ledger::{Booking, LoadLedger, WorkerCapacity, WorkerLoad};
use kvroute_core::policy::{Candidate, KvCost, Policy, PolicyInput};
use kvroute_core::{
    BlockSize, EngineHash, LocalBlockHash, Namespace, RequestId, SequenceHash, Time, WorkerId,
};
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

const BS: usize = 2;

#[derive(Clone, Debug)]
enum Op {
    Store {
        worker: u64,
        /// None: root; Some(i): the i-th known hash of the worker (or an unknown one).
        parent: Option<usize>,
        blocks: Vec<(u64, [u32; BS])>,
        bad_block_size: bool,
    },
    Remove {
        worker: u64,
        picks: Vec<usize>,
        unknown: bool,
    },
    Clear {
        worker: u64,
    },
    RemoveWorker {
        worker: u64,
    },
}

fn block() -> impl Strategy<Value = [u32; BS]> {
    // A tiny alphabet, so that prompts share prefixes often.
    prop::array::uniform2(0u32..3)
}

fn op(workers: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..workers, prop::option::of(0usize..8), prop::collection::vec((0u64..24, block()), 1..5), prop::bool::weighted(0.05))
            .prop_map(|(worker, parent, blocks, bad_block_size)| Op::Store { worker, parent, blocks, bad_block_size }),
        3 => (0..workers, prop::collection::vec(0usize..8, 0..4), prop::bool::weighted(0.1))
            .prop_map(|(worker, picks, unknown)| Op::Remove { worker, picks, unknown }),
        1 => (0..workers).prop_map(|worker| Op::Clear { worker }),
        1 => (0..workers).prop_map(|worker| Op::RemoveWorker { worker }),
    ]
}

/// The brute-force model: per worker, engine hash -> (sequence hash, copies stored).
#[derive(Default)]
struct Model {
    workers: HashMap<u64, HashMap<u64, (SequenceHash, u32)>>,
}

impl Model {
    fn known(&self, w: u64) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .workers
            .get(&w)
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    fn depth(&self, w: u64, seqs: &[SequenceHash]) -> usize {
        let Some(m) = self.workers.get(&w) else {
            return 0;
        };
        let held: HashSet<SequenceHash> = m.values().map(|v| v.0).collect();
        seqs.iter().take_while(|s| held.contains(s)).count()
    }

    fn entries(&self) -> usize {
        self.workers
            .values()
            .map(|m| m.values().map(|v| v.0).collect::<HashSet<_>>().len())
            .sum()
    }
}

/// Applies `op` to the index and the model; removals go in one event, or (`batched`) as one
/// event per hash through `apply_batch`, the way engines publish evictions.
fn run_op(ix: &mut PrefixIndex, model: &mut Model, op: &Op, batched: bool) {
    match op {
        Op::Store {
            worker,
            parent,
            blocks,
            bad_block_size,
        } => {
            let known = model.known(*worker);
            let parent_hash = parent.map(|i| known.get(i).copied().unwrap_or(1_000 + i as u64));
            let ev = KvEvent::Stored(StoredBlocks {
                parent: parent_hash.map(EngineHash),
                block_hashes: blocks.iter().map(|b| EngineHash(b.0)).collect(),
                token_ids: blocks.iter().flat_map(|b| b.1).collect(),
                block_size: if *bad_block_size { BS + 1 } else { BS },
                namespace: Namespace::default(),
                block_keys: Vec::new(),
            });
            let got = ix.apply(WorkerId(*worker), &ev);
            if *bad_block_size {
                assert_eq!(got.unwrap_err().kind(), RejectKind::BlockSizeMismatch);
                return;
            }
            let m = model.workers.entry(*worker).or_default();
            let mut prev = match parent_hash {
                None => None,
                Some(p) => match m.get(&p) {
                    Some(s) => Some(s.0),
                    None => {
                        assert_eq!(
                            got,
                            Err(IndexError::UnknownParent {
                                worker: WorkerId(*worker),
                                parent: p
                            })
                        );
                        return;
                    }
                },
            };
            got.unwrap();
            for (h, toks) in blocks {
                let s = chain(prev, local_block_hash(toks));
                match m.get_mut(h) {
                    Some(e) if e.0 == s => e.1 += 1,
                    _ => {
                        m.insert(*h, (s, 1));
                    }
                }
                prev = Some(s);
            }
        }
        Op::Remove {
            worker,
            picks,
            unknown,
        } => {
            let known = model.known(*worker);
            let mut hashes: Vec<u64> = picks
                .iter()
                .filter_map(|i| known.get(*i).copied())
                .collect();
            hashes.sort_unstable();
            hashes.dedup();
            if *unknown {
                hashes.push(5_000);
            }
            let failed = if batched {
                let events: Vec<KvEvent> = hashes
                    .iter()
                    .map(|h| KvEvent::Removed {
                        block_hashes: vec![EngineHash(*h)],
                    })
                    .collect();
                let out = ix.apply_batch(WorkerId(*worker), &events);
                assert_eq!(out.applied + out.rejected.len(), events.len());
                !out.rejected.is_empty()
            } else {
                let ev = KvEvent::Removed {
                    block_hashes: hashes.iter().map(|h| EngineHash(*h)).collect(),
                };
                ix.apply(WorkerId(*worker), &ev).is_err()
            };
            if let Some(m) = model.workers.get_mut(worker) {
                for h in &hashes {
                    match m.get_mut(h) {
                        Some(e) if e.1 > 1 => e.1 -= 1,
                        _ => {
                            m.remove(h);
                        }
                    }
                }
            }
            assert_eq!(failed, *unknown);
        }
        Op::Clear { worker } => {
            ix.apply(WorkerId(*worker), &KvEvent::Cleared).unwrap();
            if let Some(m) = model.workers.get_mut(worker) {
                m.clear();
            }
        }
        Op::RemoveWorker { worker } => {
            ix.remove_worker(WorkerId(*worker));
            model.workers.remove(worker);
        }
    }
}

fn check_queries(ix: &PrefixIndex, model: &Model, queries: &[Vec<[u32; BS]>], workers: &[u64]) {
    for q in queries {
        let locals: Vec<LocalBlockHash> = q.iter().map(|b| local_block_hash(b)).collect();
        let seqs = sequence_hashes(&locals);
        let m = ix.find_matches(&locals);
        for &w in workers {
            let d = m.depth(WorkerId(w));
            assert_eq!(d, model.depth(w, &seqs), "worker {w}, query {q:?}");
            // Contiguity: every block up to the depth is held, the next one is not.
            for s in &seqs[..d] {
                assert!(ix.contains(WorkerId(w), *s));
            }
            if d < seqs.len() && d > 0 {
                assert!(!ix.contains(WorkerId(w), seqs[d]));
            }
        }
    }
    for &w in workers {
        let want = model
            .workers
            .get(&w)
            .map(|m| m.values().map(|v| v.0).collect::<HashSet<_>>().len())
            .unwrap_or(0);
        assert_eq!(
            ix.block_count(WorkerId(w)),
            want,
            "block count of worker {w}"
        );
    }
    assert_eq!(ix.entries(), model.entries());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn index_agrees_with_brute_force_model(
        ops in prop::collection::vec(op(4), 1..60),
        queries in prop::collection::vec(prop::collection::vec(block(), 1..6), 1..12),
        wide in any::<bool>(),
        narrow in any::<bool>(),
        batched in any::<bool>(),
    ) {
        // A narrow index (at most 8 workers: 8-bit node words), or a wide one (64-bit words)
        // with, optionally, 70 idle workers parked first, so the tested ones live past the
        // first word.
        let wide = wide && !narrow;
        let mut ix = if narrow {
            PrefixIndex::with_max_workers(BlockSize::new(BS).unwrap(), 8)
        } else {
            PrefixIndex::new(BlockSize::new(BS).unwrap())
        };
        let mut model = Model::default();
        let base = if wide { 1_000 } else { 0 };
        // In a narrow index, 4 idle workers parked first put the tested ones in the upper
        // half of the word, and fill it.
        let parked = match (wide, narrow) {
            (true, _) => 70,
            (_, true) => 4,
            _ => 0,
        };
        for w in 0..parked {
            ix.add_worker(WorkerId(5_000 + w)).unwrap();
        }
        if narrow {
            for w in 0..4 {
                ix.add_worker(WorkerId(w)).unwrap();
            }
            prop_assert!(ix.add_worker(WorkerId(99)).is_err(), "a ninth worker is refused");
        }
        let workers: Vec<u64> = (0..4).map(|w| base + w).collect();
        for op in &ops {
            let op = match op.clone() {
                Op::Store { worker, parent, blocks, bad_block_size } => Op::Store { worker: base + worker, parent, blocks, bad_block_size },
                Op::Remove { worker, picks, unknown } => Op::Remove { worker: base + worker, picks, unknown },
                Op::Clear { worker } => Op::Clear { worker: base + worker },
                Op::RemoveWorker { worker } => Op::RemoveWorker { worker: base + worker },
            };
            run_op(&mut ix, &mut model, &op, batched);
        }
        check_queries(&ix, &model, &queries, &workers);
        // Dropping every worker leaves nothing behind.
        for w in workers.iter().copied().chain(5_000..5_070) {
            ix.remove_worker(WorkerId(w));
        }

        prop_assert_eq!(ix.entries(), 0);
        prop_assert_eq!(ix.workers().count(), 0);
    }

    #[test]
    fn ledger_returns_to_zero(
        reqs in prop::collection::vec((0u64..4, 1usize..200, 0usize..200, prop::collection::vec(0u64..6, 0..8)), 1..40),
        order in prop::collection::vec(any::<prop::sample::Index>(), 0..200),
    ) {
        let bs = BlockSize::new(16).unwrap();
        let mut l = LoadLedger::new(bs);
        for w in 0..4 {
            l.add_worker(WorkerId(w), WorkerCapacity::default());
        }
        let mut open: Vec<u64> = Vec::new();
        // The model of active blocks: each request's worker, full blocks and partial block.
        let mut held: Vec<(u64, Vec<SequenceHash>, bool)> = Vec::new();
        let check_active = |l: &LoadLedger, open: &[u64], held: &[(u64, Vec<SequenceHash>, bool)]| {
            for w in 0..4u64 {
                let mut distinct = std::collections::HashSet::new();
                let mut partial = 0u64;
                for &id in open {
                    let (hw, full, part) = &held[id as usize];
                    if *hw == w {
                        distinct.extend(full.iter().copied());
                        partial += u64::from(*part);
                    }
                }
                let got = l.load(WorkerId(w)).unwrap().active_blocks;
                if got != distinct.len() as u64 + partial {
                    return Err(format!("worker {w}: {got} active, model {} + {partial}", distinct.len()));
                }
            }
            Ok(())
        };
        for (i, (w, tokens, cached, blocks)) in reqs.iter().enumerate() {
            let locals: Vec<LocalBlockHash> = blocks.iter().map(|b| LocalBlockHash(*b)).collect();
            let seqs = sequence_hashes(&locals);
            let full = seqs.len().min(tokens / 16);
            held.push((*w, seqs[..full].to_vec(), *tokens > full * 16));
            l.book(&Booking {
                request: RequestId(i as u64),
                worker: WorkerId(*w),
                prompt_tokens: *tokens,
                cached_tokens: *cached,
                blocks: &seqs,
                miss_weight: 1.0,
            }, Time::from_millis(i as u64)).unwrap();
            open.push(i as u64);
            prop_assert_eq!(check_active(&l, &open, &held), Ok(()));
        }
        // Interleave first tokens and finishes in a random order.
        let mut t = 1_000;
        for ix in order {
            if open.is_empty() { break; }
            let k = ix.index(open.len());
            t += 1;
            if t % 3 == 0 {
                let id = open.swap_remove(k);
                l.finish(RequestId(id), Time::from_millis(t)).unwrap();
                prop_assert_eq!(check_active(&l, &open, &held), Ok(()));
            } else {
                l.first_token(RequestId(open[k]), Time::from_millis(t)).unwrap();
            }
        }
        for id in open {
            l.finish(RequestId(id), Time::from_millis(t + 1)).unwrap();
        }
        for w in 0..4 {
            prop_assert_eq!(l.load(WorkerId(w)).unwrap(), WorkerLoad::default());
        }
        prop_assert_eq!(l.inflight(), 0);
    }

    #[test]
    fn kv_picks_an_argmin(
        workers in prop::collection::vec((0usize..100, 0u64..5_000, 0u64..500, 0usize..1_000), 1..40),
        tokens in 1usize..4_000,
        weight in 0.0f64..4.0,
        decision in any::<u64>(),
    ) {
        let candidates: Vec<Candidate> = workers.iter().enumerate().map(|(i, (m, p, a, c))| Candidate {
            worker: WorkerId(i as u64),
            matched_blocks: *m,
            loadable: Default::default(),
            cached_blocks: *c,
            cache_blocks: None,
            load: WorkerLoad { inflight: 1, prefill_tokens: *p, active_blocks: *a, ..WorkerLoad::default() },
            capacity: WorkerCapacity::default(),
            prefill: None,
            service_secs: None,
            decode: None,
            output_tokens: None,
        }).collect();
        let input = PolicyInput {
            prompt_tokens: tokens,
            block_size: 16,
            candidates: &candidates,
            decision,
            seed: 1,
            affinity: None,
            affinity_bias: 0.0,
            tiers: Default::default(),
        class: Default::default(),
        };
        let kv = KvCost::new(kvroute_core::policy::KvConfig { overlap_weight: weight, ..Default::default() });
        let choice = kv.select(&input);
        let costs: Vec<f64> = choice.costs.iter().map(|c| c.unwrap()).collect();
        let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
        prop_assert!(costs[choice.chosen] <= min + 1e-9 * min.max(1.0));
        // And the cost is the documented formula.
        for (c, cost) in candidates.iter().zip(&costs) {
            let prefill = c.load.prefill_tokens as f64 + tokens.saturating_sub(c.matched_blocks * 16) as f64;
            let want = weight * prefill / 16.0 + c.load.active_blocks as f64;
            prop_assert!((cost - want).abs() < 1e-9);
        }
    }
}
