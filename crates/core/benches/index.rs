//! Prefix-index benchmarks.
//!
//! Measures `PrefixIndex::apply` throughput for stored and removed chains of 32 blocks (block
//! events/s, into an empty index and into the big one), and the latency of `find_matches_seq`
//! / `find_matches` for a 16,384-token prompt (1,024 blocks of 16) over 64 workers holding 10M
//! cached (block, worker) entries: a full-depth walk and a miss. Before the criterion groups
//! it prints the fill time, bytes per entry (with shared prefixes, and with no sharing at all),
//! RSS growth, and p50/p99/max of 10,000 individually timed full-depth lookups.
//!
//! Run with `cargo bench -p kvroute-core --bench index`. Under `-- --test` (the CI smoke mode)
//! the index holds 200,000 entries instead; `KVROUTE_BENCH_ENTRIES=N` sets the count.
// Tests and benchmarks of a pure crate may read the clock, files and the environment (they
// time themselves, open fixtures); the crate's clippy.toml rules are for its library code.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use criterion::{black_box, Criterion, Throughput};
use kvroute_core::hashing::{local_block_hashes, sequence_hashes};
use kvroute_core::{
    BlockSize, EngineHash, KvEvent, LocalBlockHash, Namespace, PrefixIndex, SequenceHash,
    StoredBlocks, WorkerId,
};
use std::time::{Duration, Instant};

const BS: usize = 16;
const WORKERS: u64 = 64;
/// "System prompt / document" prefixes held by every worker (shared fill only).
const SHARED_PREFIXES: usize = 8;
const SHARED_BLOCKS: usize = 64;
/// Blocks of the looked-up prompt (16,384 tokens).
const QUERY_BLOCKS: usize = 1024;
const FULL_ENTRIES: usize = 10_000_000;
const TEST_ENTRIES: usize = 200_000;
const LATENCY_SAMPLES: usize = 10_000;
/// Chains per apply batch, and blocks per chain.
const APPLY_CHAINS: u64 = 64;
const APPLY_CHAIN_BLOCKS: usize = 32;
/// Synthetic token ids stay below this (a typical vocabulary size).
const VOCAB: u64 = 151_936;
/// Block-number ranges, kept apart so no two block sets share a block by accident.
const WORST_BASE: u64 = 1 << 40;
const MISS_BASE: u64 = 1 << 41;
const APPLY_BASE: u64 = 1 << 42;
const APPLY_BIG_BASE: u64 = 1 << 43;
const CHURN_BASE: u64 = 1 << 44;
/// Distinct event sets of the churn bench (each 2,048 blocks): about 1M blocks in all.
const CHURN_SETS: usize = 512;

use kvroute_core::hashing::splitmix64 as mix;

/// A seeded, deterministic random stream (splitmix64).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix(self.0) % n
    }
}

fn block_size() -> BlockSize {
    BlockSize::new(BS).expect("16 is a valid block size")
}

/// A stored chain of `len` blocks numbered from `first`: the engine hash of a block is its
/// number and its 16 token ids are derived from it.
fn chain(first: u64, len: usize, parent: Option<EngineHash>) -> StoredBlocks {
    let ids = first..first + len as u64;
    let bs = BS as u64;
    StoredBlocks {
        parent,
        block_hashes: ids.clone().map(EngineHash).collect(),
        token_ids: ids
            .flat_map(|id| (0..bs).map(move |j| (mix(id * bs + j) % VOCAB) as u32))
            .collect(),
        block_size: BS,
        namespace: Namespace::default(),
        block_keys: Vec::new(),
    }
}

/// The engine hash of the last block of a chain.
fn tail(s: &StoredBlocks) -> Option<EngineHash> {
    s.block_hashes.last().copied()
}

/// A filled index and the tokens of the full-depth query.
struct Filled {
    index: PrefixIndex,
    /// Shared prefix 0 then worker 0's deep chain (16,384 tokens); empty with no sharing.
    query: Vec<u32>,
}

/// Fills an index with about `entries` (block, worker) entries over 64 workers, built from
/// stored events. With `shared`, every worker holds the 8 shared prefixes, worker 0 also holds
/// a 960-block chain after prefix 0, and 3 in 4 conversation chains continue a shared prefix;
/// without, every chain starts at the root and every block is on exactly one worker.
fn fill(entries: usize, shared: bool, label: &str) -> Filled {
    let started = Instant::now();
    let mut in_apply = Duration::ZERO;
    let mut index = PrefixIndex::new(block_size());
    let mut rng = Rng(if shared { 0x5EED } else { 0xBAD5EED });
    let mut next = if shared { 0 } else { WORST_BASE };
    let mut common: Vec<StoredBlocks> = Vec::new();
    let mut query = Vec::new();
    if shared {
        for _ in 0..SHARED_PREFIXES {
            common.push(chain(next, SHARED_BLOCKS, None));
            next += SHARED_BLOCKS as u64;
        }
        let deep = chain(next, QUERY_BLOCKS - SHARED_BLOCKS, tail(&common[0]));
        next += deep.block_hashes.len() as u64;
        query = [&common[0].token_ids[..], &deep.token_ids[..]].concat();
        common.push(deep);
    }
    let parents: Vec<Option<EngineHash>> = common.iter().take(SHARED_PREFIXES).map(tail).collect();
    let common: Vec<KvEvent> = common.into_iter().map(KvEvent::Stored).collect();
    let per_worker = entries / WORKERS as usize;
    let extra = entries % WORKERS as usize;
    let mut blocks = 0;
    for w in 0..WORKERS {
        let target = per_worker + usize::from((w as usize) < extra);
        // Shared prefixes for everybody, the deep chain for worker 0 only.
        let mine = if w == 0 {
            common.len()
        } else {
            SHARED_PREFIXES
        };
        let mut events: Vec<&KvEvent> = common.iter().take(mine).collect();
        let mut held: usize = events.iter().map(|e| stored_len(e)).sum();
        let mut own = Vec::new();
        while held < target {
            let len = (8 + rng.below(249) as usize).min(target - held);
            let parent = if shared && rng.below(4) > 0 {
                parents[rng.below(SHARED_PREFIXES as u64) as usize]
            } else {
                None
            };
            own.push(KvEvent::Stored(chain(next, len, parent)));
            next += len as u64;
            held += len;
        }
        events.extend(own.iter());
        let t = Instant::now();
        for e in events {
            index.apply(WorkerId(w), e).expect("fill events apply");
        }
        in_apply += t.elapsed();
        blocks += held;
    }
    println!(
        "{label}: {} entries over {WORKERS} workers (exact) filled in {:.2} s, {:.2} s of it in \
         apply = {:.2} M block events/s",
        index.entries(),
        started.elapsed().as_secs_f64(),
        in_apply.as_secs_f64(),
        blocks as f64 / in_apply.as_secs_f64() / 1e6,
    );
    Filled { index, query }
}

fn stored_len(e: &KvEvent) -> usize {
    match e {
        KvEvent::Stored(s) => s.block_hashes.len(),
        _ => 0,
    }
}

/// A `/proc/self/status` figure in KiB (`VmRSS`, `VmHWM`), where the platform has one.
fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| {
        let v = l.strip_prefix(field)?.strip_prefix(':')?.trim();
        v.strip_suffix("kB")?.trim().parse().ok()
    })
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

fn report_memory(label: &str, index: &PrefixIndex, rss_before: Option<u64>) {
    let entries = index.entries().max(1) as f64;
    let bytes = index.memory_bytes() as f64;
    println!(
        "{label}: memory_bytes {:.1} MiB, bytes per (block, worker) entry = {:.1}",
        mib(bytes),
        bytes / entries
    );
    if let (Some(before), Some(after)) = (rss_before, status_kib("VmRSS")) {
        let grown = after.saturating_sub(before) as f64 * 1024.0;
        println!(
            "{label}: RSS grew {:.1} MiB = {:.1} bytes per entry (peak RSS so far {:.1} MiB)",
            mib(grown),
            grown / entries,
            mib(status_kib("VmHWM").unwrap_or(0) as f64 * 1024.0)
        );
    }
}

/// Local and sequence hashes of a prompt.
fn hashes(tokens: &[u32]) -> (Vec<LocalBlockHash>, Vec<SequenceHash>) {
    let locals = local_block_hashes(tokens, BS);
    let seqs = sequence_hashes(&locals);
    (locals, seqs)
}

/// Times `LATENCY_SAMPLES` individual lookups and prints p50 / p99 / max.
fn latency_percentiles(index: &PrefixIndex, seqs: &[SequenceHash]) {
    let mut us: Vec<f64> = (0..LATENCY_SAMPLES)
        .map(|_| {
            let t = Instant::now();
            black_box(index.find_matches_seq(black_box(seqs)));
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    us.sort_by(f64::total_cmp);
    let at = |p: f64| us[((us.len() - 1) as f64 * p).round() as usize];
    println!(
        "find_matches_seq full depth ({} blocks), {LATENCY_SAMPLES} timed lookups: \
         p50 {:.2} us, p99 {:.2} us, max {:.2} us",
        seqs.len(),
        at(0.50),
        at(0.99),
        us[us.len() - 1]
    );
}

/// One worker's events, as `(worker, event)`.
type Events = Vec<(WorkerId, KvEvent)>;

/// 64 chains of 32 blocks over 16 workers, in pairs (a root chain and its continuation, so
/// parent resolution is exercised), and the removals that undo them.
fn apply_set(base: u64) -> (Events, Events) {
    let mut stored = Vec::new();
    let mut removed = Vec::new();
    for k in 0..APPLY_CHAINS {
        let w = WorkerId(k / 2 % 16);
        let first = base + k * APPLY_CHAIN_BLOCKS as u64;
        let parent = (k % 2 == 1).then(|| EngineHash(first - 1));
        let s = chain(first, APPLY_CHAIN_BLOCKS, parent);
        let block_hashes = s.block_hashes.iter().rev().copied().collect();
        removed.push((w, KvEvent::Removed { block_hashes }));
        stored.push((w, KvEvent::Stored(s)));
    }
    removed.reverse();
    (stored, removed)
}

fn apply_all(index: &mut PrefixIndex, events: &Events) {
    for (w, e) in events {
        index.apply(*w, black_box(e)).expect("bench events apply");
    }
}

/// Apply throughput into `index`, which returns to its prior state after every iteration.
// A false positive of significant_drop_tightening: criterion's BenchmarkGroup is not a lock
// (its Drop only ends the group, which `finish()` does here).
#[allow(clippy::significant_drop_tightening)]
fn bench_apply(c: &mut Criterion, index: &mut PrefixIndex, group: &str, base: u64) {
    let (stored, removed) = apply_set(base);
    let blocks = APPLY_CHAINS * APPLY_CHAIN_BLOCKS as u64;
    let before = index.entries();
    apply_all(index, &stored);
    assert_eq!(index.entries(), before + blocks as usize);
    apply_all(index, &removed);
    assert_eq!(index.entries(), before);

    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(blocks));
    g.bench_function("stored", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                apply_all(index, &stored);
                timed += t.elapsed();
                apply_all(index, &removed);
            }
            timed
        })
    });
    g.bench_function("removed", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                apply_all(index, &stored);
                let t = Instant::now();
                apply_all(index, &removed);
                timed += t.elapsed();
            }
            timed
        })
    });
    g.throughput(Throughput::Elements(2 * blocks));
    g.bench_function("stored_then_removed", |b| {
        b.iter(|| {
            apply_all(index, &stored);
            apply_all(index, &removed);
        })
    });
    g.finish();
    assert_eq!(index.entries(), before);
}

/// Churn at a steady size, the shape of a real event stream: engines store new chains while
/// evicting old ones. `CHURN_SETS` distinct event sets are cycled through (so the keys are
/// not cache-warm from the previous iteration), `CHURN_WINDOW` of them stored at any time;
/// each iteration stores one set and removes the oldest.
// A false positive of significant_drop_tightening: criterion's BenchmarkGroup is not a lock
// (its Drop only ends the group, which `finish()` does here).
#[allow(clippy::significant_drop_tightening)]
fn bench_churn(c: &mut Criterion, index: &mut PrefixIndex, base: u64, sets: usize) {
    let window = sets / 2;
    let per_set = APPLY_CHAINS * APPLY_CHAIN_BLOCKS as u64;
    let all: Vec<(Events, Events)> = (0..sets as u64)
        .map(|k| apply_set(base + k * per_set))
        .collect();
    for (stored, _) in &all[..window] {
        apply_all(index, stored);
    }
    // The removals again, one event per evicted block as vLLM and SGLang send them, grouped
    // in one batch per chain.
    let singles: Vec<Vec<(WorkerId, Vec<KvEvent>)>> = all
        .iter()
        .map(|(_, removed)| {
            removed
                .iter()
                .map(|(w, e)| {
                    let KvEvent::Removed { block_hashes } = e else {
                        unreachable!("removal sets hold removals")
                    };
                    let events = block_hashes
                        .iter()
                        .map(|h| KvEvent::Removed {
                            block_hashes: vec![*h],
                        })
                        .collect();
                    (*w, events)
                })
                .collect()
        })
        .collect();
    let before = index.entries();
    let mut next = window;
    let mut g = c.benchmark_group("apply_churn_filled_index");
    g.throughput(Throughput::Elements(per_set));
    // Each iteration stores the next set and removes the oldest; one of the two is timed.
    #[derive(Clone, Copy, PartialEq)]
    enum Timed {
        Stored,
        Removed,
        RemovedOneEventPerBlock,
        RemovedOneEventPerBlockBatched,
    }
    for (name, timed_part) in [
        ("stored", Timed::Stored),
        ("removed", Timed::Removed),
        (
            "removed_one_event_per_block",
            Timed::RemovedOneEventPerBlock,
        ),
        (
            "removed_one_event_per_block_batched",
            Timed::RemovedOneEventPerBlockBatched,
        ),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let old = (next + sets - window) % sets;
                    let t = Instant::now();
                    apply_all(index, &all[next % sets].0);
                    if timed_part == Timed::Stored {
                        timed += t.elapsed();
                    }
                    let t = Instant::now();
                    match timed_part {
                        Timed::Stored | Timed::Removed => apply_all(index, &all[old].1),
                        Timed::RemovedOneEventPerBlock => {
                            for (w, events) in &singles[old] {
                                for e in events {
                                    index.apply(*w, black_box(e)).expect("bench events apply");
                                }
                            }
                        }
                        Timed::RemovedOneEventPerBlockBatched => {
                            for (w, events) in &singles[old] {
                                let out = index.apply_batch(*w, black_box(events));
                                assert!(out.rejected.is_empty());
                            }
                        }
                    }
                    if timed_part != Timed::Stored {
                        timed += t.elapsed();
                    }
                    next += 1;
                }
                timed
            })
        });
    }
    g.finish();
    assert_eq!(index.entries(), before, "churn keeps the size");
}

/// Lookup latency of a full-depth prompt (by sequence and by local hashes) and of a miss.
// A false positive of significant_drop_tightening: criterion's BenchmarkGroup is not a lock
// (its Drop only ends the group, which `finish()` does here).
#[allow(clippy::significant_drop_tightening)]
fn bench_find_matches(
    c: &mut Criterion,
    index: &PrefixIndex,
    seqs: &[SequenceHash],
    miss: &[SequenceHash],
    locals: &[LocalBlockHash],
) {
    let mut g = c.benchmark_group("find_matches_1024_blocks");
    g.bench_function("seq_full_depth", |b| {
        b.iter(|| index.find_matches_seq(black_box(seqs)))
    });
    g.bench_function("seq_miss", |b| {
        b.iter(|| index.find_matches_seq(black_box(miss)))
    });
    g.bench_function("local_full_depth", |b| {
        b.iter(|| index.find_matches(black_box(locals)))
    });
    g.finish();
}

fn entry_count(test_mode: bool) -> usize {
    match std::env::var("KVROUTE_BENCH_ENTRIES") {
        Ok(v) => v
            .trim()
            .replace('_', "")
            .parse()
            .expect("KVROUTE_BENCH_ENTRIES must be a number of entries"),
        Err(_) if test_mode => TEST_ENTRIES,
        Err(_) => FULL_ENTRIES,
    }
}

fn main() {
    let test_mode = std::env::args().any(|a| a == "--test");
    let entries = entry_count(test_mode);
    println!("index bench: {entries} (block, worker) entries over {WORKERS} workers");
    let mut c = Criterion::default().configure_from_args();

    // The realistic fill, kept for the lookups.
    let rss = status_kib("VmRSS");
    let Filled { mut index, query } = fill(entries, true, "shared fill");
    report_memory("shared fill", &index, rss);

    let (locals, seqs) = hashes(&query);
    assert_eq!(seqs.len(), QUERY_BLOCKS);
    let m = index.find_matches_seq(&seqs);
    assert_eq!(
        m.depth(WorkerId(0)),
        QUERY_BLOCKS,
        "worker 0 holds the whole prompt"
    );
    assert_eq!(
        m.iter().count(),
        WORKERS as usize,
        "every worker holds prefix 0"
    );
    assert!(m
        .iter()
        .all(|(w, d)| w == WorkerId(0) || d == SHARED_BLOCKS));
    assert_eq!(index.find_matches(&locals), m);
    let (_, miss) = hashes(&chain(MISS_BASE, QUERY_BLOCKS, None).token_ids);
    assert!(index.find_matches_seq(&miss).is_empty());

    latency_percentiles(&index, &seqs);

    // The worst case for memory: no block shared by two workers.
    let rss = status_kib("VmRSS");
    let worst = fill(entries, false, "unshared fill");
    report_memory("unshared fill", &worst.index, rss);
    drop(worst);

    let mut empty = PrefixIndex::new(block_size());
    bench_apply(&mut c, &mut empty, "apply_empty_index", APPLY_BASE);
    drop(empty);
    bench_apply(&mut c, &mut index, "apply_filled_index", APPLY_BIG_BASE);
    let churn_sets = if test_mode { 4 } else { CHURN_SETS };
    bench_churn(&mut c, &mut index, CHURN_BASE, churn_sets);

    bench_find_matches(&mut c, &index, &seqs, &miss, &locals);

    c.final_summary();
    drop(c);
    if let Some(hwm) = status_kib("VmHWM") {
        println!("peak RSS (VmHWM): {:.1} MiB", mib(hwm as f64 * 1024.0));
    }
}
