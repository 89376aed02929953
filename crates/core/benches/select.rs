//! Selection benchmarks.
//!
//! Measures `Router::route` (pure: index lookup, candidates, admission, policy) for a
//! 4,096-token prompt (256 blocks of 16) with the `kv`, `predictive` and `round_robin`
//! policies over 8, 64 and 256 workers, and `Router::explain` over 64 workers. Every worker
//! holds a shared system prompt, a few conversation chains and, for one in four, part of the
//! benchmarked prompt; load is booked by routing and dispatching requests through the router
//! itself (some of them past their first token, some finished).
//!
//! Run with `cargo bench -p kvroute-core --bench select` (CI smoke mode: `-- --test`).

use criterion::{black_box, BenchmarkId, Criterion};
use kvroute_core::ledger::WorkerCapacity;
use kvroute_core::router::RouteOutcome;
use kvroute_core::{
    BlockSize, BlockedPrompt, EngineHash, KvEvent, Namespace, PolicyConfig, PolicyKind, RequestId,
    RouteRequest, Router, RouterConfig, StoredBlocks, Time, WorkerId,
};
use std::time::Duration;

const BS: usize = 16;
/// Blocks of the benchmarked prompt (4,096 tokens).
const PROMPT_BLOCKS: usize = 256;
/// Leading blocks of every prompt that every worker holds.
const SYSTEM_BLOCKS: usize = 32;
const FLEETS: [u64; 3] = [8, 64, 256];
const POLICIES: [PolicyKind; 3] = [
    PolicyKind::Kv,
    PolicyKind::Predictive,
    PolicyKind::RoundRobin,
];
const CHAINS_PER_WORKER: usize = 8;
const REQUESTS_PER_WORKER: u64 = 4;
/// Synthetic token ids stay below this (a typical vocabulary size).
const VOCAB: u64 = 151_936;
/// First block number of the blocks that are not part of the benchmarked prompt.
const OTHER_BASE: u64 = 1 << 32;

use kvroute_core::hashing::splitmix64 as mix;

/// A seeded, deterministic random stream (splitmix64).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix(self.0) % n
    }
}

/// Token ids of `blocks` blocks numbered from `first` (16 per block, derived from the number).
fn tokens(first: u64, blocks: usize) -> Vec<u32> {
    let bs = BS as u64;
    (first..first + blocks as u64)
        .flat_map(|id| (0..bs).map(move |j| (mix(id * bs + j) % VOCAB) as u32))
        .collect()
}

/// A stored chain of blocks numbered from `first` (the engine hash of a block is its number).
fn stored(first: u64, blocks: usize, parent: Option<u64>) -> KvEvent {
    KvEvent::Stored(StoredBlocks {
        parent: parent.map(EngineHash),
        block_hashes: (first..first + blocks as u64).map(EngineHash).collect(),
        token_ids: tokens(first, blocks),
        block_size: BS,
        namespace: Namespace::default(),
        block_keys: Vec::new(),
    })
}

fn prompt(tokens: &[u32]) -> BlockedPrompt {
    let bs = BlockSize::new(BS).expect("16 is a valid block size");
    BlockedPrompt::new(tokens, bs, Namespace::default())
}

fn request(p: &BlockedPrompt) -> RouteRequest<'_> {
    RouteRequest::new(p)
}

/// The benchmarked prompt: blocks 0..256, the first 32 being the system prompt.
fn bench_prompt() -> BlockedPrompt {
    prompt(&tokens(0, PROMPT_BLOCKS))
}

/// A router over `workers` workers with cached blocks and booked load (deterministic).
fn router(kind: PolicyKind, workers: u64) -> Router {
    let config = RouterConfig {
        block_size: BS,
        seed: 7,
        policy: PolicyConfig {
            kind,
            ..PolicyConfig::default()
        },
        ..RouterConfig::default()
    };
    let mut r = Router::new(config).expect("valid router config");
    let mut rng = Rng(0x5E1EC7 ^ workers);
    let mut next = OTHER_BASE;
    let system_tail = Some(SYSTEM_BLOCKS as u64 - 1);
    for w in 0..workers {
        let id = WorkerId(w);
        let capacity = WorkerCapacity {
            kv_blocks: Some(65_536),
            max_batch: Some(256),
        };
        r.add_worker(id, capacity).expect("worker registers");
        r.apply_event(id, &stored(0, SYSTEM_BLOCKS, None))
            .expect("system prompt applies");
        if w % 4 == 0 {
            // Part of the benchmarked prompt, to a worker-dependent depth.
            let depth = 1 + rng.below((PROMPT_BLOCKS - SYSTEM_BLOCKS) as u64) as usize;
            r.apply_event(id, &stored(SYSTEM_BLOCKS as u64, depth, system_tail))
                .expect("prompt prefix applies");
        }
        for _ in 0..CHAINS_PER_WORKER {
            let len = 16 + rng.below(113) as usize;
            let parent = if rng.below(2) == 0 { system_tail } else { None };
            r.apply_event(id, &stored(next, len, parent))
                .expect("conversation applies");
            next += len as u64;
        }
    }
    // Load: requests sharing the system prompt, routed and dispatched by the router itself.
    for n in 0..REQUESTS_PER_WORKER * workers {
        let own = 1 + rng.below(200) as usize;
        let mut t = [tokens(0, SYSTEM_BLOCKS), tokens(next, own)].concat();
        next += own as u64;
        t.truncate(t.len() - rng.below(BS as u64) as usize);
        let p = prompt(&t);
        let RouteOutcome::Dispatch(sel) = r.route(&request(&p)) else {
            panic!("load request {n} was not dispatched");
        };
        let at = Time::from_millis(n * 5);
        let req = RequestId(n);
        r.dispatch(req, &request(&p), &sel, at)
            .expect("dispatch books");
        let prefill = Duration::from_micros(20 * (t.len() - sel.cached_tokens) as u64);
        if n % 3 != 0 {
            r.first_token(req, at.plus(prefill)).expect("first token");
        }
        if n % 5 == 0 {
            let done = at.plus(prefill + Duration::from_millis(800));
            r.finish(req, done).expect("finish");
        }
    }
    r
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let p = bench_prompt();
    assert_eq!(p.tokens, PROMPT_BLOCKS * BS);
    let req = request(&p);

    bench_route(&mut c, &req);
    bench_explain(&mut c, &req);
    c.final_summary();
}

/// Route latency by policy and fleet size.
// A false positive of significant_drop_tightening: criterion's BenchmarkGroup is not a lock
// (its Drop only ends the group, which `finish()` does here).
#[allow(clippy::significant_drop_tightening)]
fn bench_route(c: &mut Criterion, req: &RouteRequest<'_>) {
    let mut g = c.benchmark_group("route_4096_tokens");
    for kind in POLICIES {
        for workers in FLEETS {
            let r = router(kind, workers);
            let RouteOutcome::Dispatch(sel) = r.route(req) else {
                panic!("{} over {workers} workers did not dispatch", kind.as_str());
            };
            println!(
                "{}/{workers}: {} blocks cached, {} requests in flight; picks worker {} \
                 (matched {} blocks, cost {:?})",
                kind.as_str(),
                r.index().entries(),
                r.ledger().inflight(),
                sel.worker,
                sel.matched_blocks,
                sel.cost
            );
            g.bench_with_input(BenchmarkId::new(kind.as_str(), workers), &r, |b, r| {
                b.iter(|| r.route(black_box(req)))
            });
        }
    }
    g.finish();
}

/// Explain latency by policy, 64 workers.
// A false positive of significant_drop_tightening: criterion's BenchmarkGroup is not a lock
// (its Drop only ends the group, which `finish()` does here).
#[allow(clippy::significant_drop_tightening)]
fn bench_explain(c: &mut Criterion, req: &RouteRequest<'_>) {
    let mut g = c.benchmark_group("explain_4096_tokens_64_workers");
    for kind in POLICIES {
        let r = router(kind, 64);
        let ex = r.explain(req);
        assert_eq!(ex.workers.len(), 64);
        assert!(ex.winner.is_some());
        g.bench_with_input(BenchmarkId::from_parameter(kind.as_str()), &r, |b, r| {
            b.iter(|| r.explain(black_box(req)))
        });
    }
    g.finish();
}
