//! Trace prompts cut into router blocks, shared by the event loop and the router thread.
//!
//! The router thread cuts a trace request's prompt when it routes it. Hashing the blocks of
//! new Mooncake hash ids is the expensive part, and it does not depend on anything the
//! simulation does, so both threads do it ahead, one hash id at a time, whenever they wait
//! for each other: the event loop while it waits for a route, the router thread while it
//! waits for calls. A shared store ([`SharedBlockHashes`]) hashes each id once, whoever gets
//! to it first; a shared cursor hands out the ids still to hash, at most [`AHEAD`] prompts
//! past the last one routed.
//!
//! The blocks of a prompt do not depend on when or by whom they were hashed, so none of this
//! changes a result.

use kvroute_core::{BlockSize, BlockedPrompt, Namespace};
use kvroute_workload::{BlockHashCache, Prompt, SharedBlockHashes, TraceRequest};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Prompts past the last one routed that may be hashed ahead.
const AHEAD: usize = 64;

/// Hash ids the fallback cache keeps (it starts afresh when full).
const CACHED_IDS: usize = 1 << 18;

/// The trace's prompts and their block hashes. See the module documentation.
pub(crate) struct TracePrompts<'a> {
    trace: &'a [TraceRequest],
    /// None when the prompts are not all hash blocks of one size: the router thread then
    /// cuts each prompt with `fallback` when it routes it, and nothing is hashed ahead.
    shared: Option<Ahead>,
    fallback: Mutex<BlockHashCache>,
}

/// The shared store and the work still to do ahead.
struct Ahead {
    store: SharedBlockHashes,
    /// The hash ids each prompt uses, prompt after prompt.
    ids: Vec<u64>,
    /// Where each prompt's ids start in `ids` (one more entry: the end).
    starts: Vec<usize>,
    /// The next entry of `ids` to hash ahead.
    next: AtomicUsize,
    /// Entries of `ids` below this may be hashed ahead.
    horizon: AtomicUsize,
}

impl<'a> TracePrompts<'a> {
    /// The prompts of `trace`, to be cut into blocks of `block_size`.
    pub fn new(trace: &'a [TraceRequest], block_size: BlockSize, ns: Namespace) -> Self {
        let prompts = trace.iter().map(|r| &r.prompt);
        let shared = SharedBlockHashes::for_prompts(prompts, block_size, ns).map(|store| {
            let mut ids = Vec::new();
            let mut starts = Vec::with_capacity(trace.len() + 1);
            for r in trace {
                starts.push(ids.len());
                if let Prompt::HashBlocks {
                    ids: p_ids,
                    block_tokens,
                    ..
                } = &r.prompt
                {
                    // The ids a prompt's tokens reach.
                    let used = r.prompt.len().div_ceil((*block_tokens).max(1));
                    ids.extend_from_slice(&p_ids[..used.min(p_ids.len())]);
                }
            }
            starts.push(ids.len());
            let horizon = starts[AHEAD.min(trace.len())];
            Ahead {
                store,
                ids,
                starts,
                next: AtomicUsize::new(0),
                horizon: AtomicUsize::new(horizon),
            }
        });
        Self {
            trace,
            shared,
            fallback: Mutex::new(BlockHashCache::new(block_size, ns, CACHED_IDS)),
        }
    }

    /// Prompts in the trace.
    pub fn len(&self) -> usize {
        self.trace.len()
    }

    /// Hashes the blocks of one hash id of the prompts ahead; false when there is none left
    /// to hash within the horizon. `scratch` holds tokens meanwhile.
    pub fn hash_ahead(&self, scratch: &mut Vec<u32>) -> bool {
        let Some(a) = &self.shared else {
            return false;
        };
        loop {
            let u = a.next.load(Ordering::Relaxed);
            if u >= a.horizon.load(Ordering::Relaxed) {
                return false;
            }
            if a.next
                .compare_exchange_weak(u, u + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                // An id seen before (or being hashed by the other thread) costs nothing:
                // go on to the next one.
                if a.store.warm(a.ids[u], scratch) {
                    return true;
                }
            }
        }
    }

    /// Trace prompt `i` cut into blocks, and its tokens after the last full block.
    pub fn blocked(&self, i: usize, scratch: &mut Vec<u32>) -> (BlockedPrompt, Vec<u32>) {
        let prompt = &self.trace[i].prompt;
        let Some(a) = &self.shared else {
            // Only the router thread cuts prompts, so the lock is never contended.
            return self.fallback.lock().blocked_with_tail(prompt);
        };
        let n = self.trace.len();
        a.horizon
            .fetch_max(a.starts[(i + 1 + AHEAD).min(n)], Ordering::Relaxed);
        // Ids of this prompt and earlier ones are not worth hashing ahead any more.
        a.next.fetch_max(a.starts[i + 1], Ordering::Relaxed);
        a.store.blocked_with_tail(prompt, scratch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_core::Time;

    fn trace(n: u64, block_tokens: usize) -> Vec<TraceRequest> {
        (0..n)
            .map(|i| TraceRequest {
                arrival: Time::ZERO,
                // Shared first id, then one of its own.
                prompt: Prompt::hash_blocks(vec![0, 1 + i], block_tokens, 1000).unwrap(),
                max_tokens: 1,
            })
            .collect()
    }

    #[test]
    fn hashes_ahead_within_the_horizon_and_gives_what_cutting_gives() {
        let t = trace(AHEAD as u64 + 10, 512);
        let b = BlockSize::new(64).unwrap();
        let ahead = TracePrompts::new(&t, b, Namespace::default());
        let mut scratch = Vec::new();
        let mut steps = 0;
        while ahead.hash_ahead(&mut scratch) {
            steps += 1;
        }
        // The shared id once, then one new id per prompt, for the first AHEAD prompts.
        assert_eq!(steps, 1 + AHEAD);
        // Routing a prompt moves the horizon on.
        let _ = ahead.blocked(0, &mut scratch);
        assert!(ahead.hash_ahead(&mut scratch));
        let mut plain = BlockHashCache::new(b, Namespace::default(), 1 << 10);
        for (i, r) in t.iter().enumerate() {
            let got = ahead.blocked(i, &mut scratch);
            assert_eq!(got, plain.blocked_with_tail(&r.prompt), "prompt {i}");
        }
        assert!(!ahead.hash_ahead(&mut scratch), "nothing left");
    }

    #[test]
    fn prompts_the_store_cannot_take_are_cut_when_routed() {
        let mut t = trace(3, 512);
        t.push(TraceRequest {
            arrival: Time::ZERO,
            prompt: Prompt::Tokens((0..100).collect()),
            max_tokens: 1,
        });
        let b = BlockSize::new(64).unwrap();
        let prompts = TracePrompts::new(&t, b, Namespace::default());
        let mut scratch = Vec::new();
        assert!(!prompts.hash_ahead(&mut scratch), "no hashing ahead");
        let mut plain = BlockHashCache::new(b, Namespace::default(), 1 << 10);
        for (i, r) in t.iter().enumerate() {
            assert_eq!(
                prompts.blocked(i, &mut scratch),
                plain.blocked_with_tail(&r.prompt)
            );
        }
    }
}
