//! Trace prompts cut into router blocks on the router thread: when a trace request is routed
//! the router thread cuts its prompt, and while it waits for calls it hashes the blocks of the
//! next prompts ahead, one hash id at a time (so a call never waits long behind it). The
//! event loop, the busier thread, hashes nothing for a trace.
//!
//! The cache gives the same blocks whenever it is asked, so hashing ahead changes no result.

use kvroute_core::{BlockSize, BlockedPrompt, Namespace};
use kvroute_workload::{BlockHashCache, TraceRequest};

/// Prompts past the last one asked for that may be hashed ahead.
const AHEAD: usize = 64;

/// Hash ids whose blocks the cache keeps (it starts afresh when full; the conversation trace
/// has 182,790).
const CACHED_IDS: usize = 1 << 18;

/// The trace's prompts and their block hashes. See the module documentation.
pub(crate) struct TracePrompts<'a> {
    trace: &'a [TraceRequest],
    cache: BlockHashCache,
    /// The next prompt to hash ahead, and the next hash id in it.
    cursor: (usize, usize),
    /// Prompts below this may be hashed ahead.
    horizon: usize,
}

impl<'a> TracePrompts<'a> {
    /// The prompts of `trace`, to be cut into blocks of `block_size`.
    pub fn new(trace: &'a [TraceRequest], block_size: BlockSize, ns: Namespace) -> Self {
        Self {
            trace,
            cache: BlockHashCache::new(block_size, ns, CACHED_IDS),
            cursor: (0, 0),
            horizon: AHEAD,
        }
    }

    /// Hashes the blocks of one hash id of the prompts ahead; false when there is none left
    /// to hash within the horizon.
    pub fn hash_ahead(&mut self) -> bool {
        let end = self.horizon.min(self.trace.len());
        while self.cursor.0 < end {
            let (p, k) = self.cursor;
            match self.cache.warm_id(&self.trace[p].prompt, k) {
                Some(hashed) => {
                    self.cursor.1 += 1;
                    if hashed {
                        return true;
                    }
                }
                None => self.cursor = (p + 1, 0),
            }
        }
        false
    }

    /// Trace prompt `i` cut into blocks, and its tokens after the last full block.
    pub fn blocked(&mut self, i: usize) -> (BlockedPrompt, Vec<u32>) {
        let prompt = &self.trace[i].prompt;
        self.horizon = self.horizon.max(i.saturating_add(1 + AHEAD));
        if self.cursor.0 <= i {
            self.cursor = (i + 1, 0);
        }
        self.cache.blocked_with_tail(prompt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_core::Time;
    use kvroute_workload::Prompt;

    fn trace(n: u64) -> Vec<TraceRequest> {
        (0..n)
            .map(|i| TraceRequest {
                arrival: Time::ZERO,
                // Shared first id, then one of its own.
                prompt: Prompt::hash_blocks(vec![0, 1 + i], 512, 1000).unwrap(),
                max_tokens: 1,
            })
            .collect()
    }

    #[test]
    fn hashes_ahead_within_the_horizon_and_gives_what_cutting_gives() {
        let t = trace(AHEAD as u64 + 10);
        let b = BlockSize::new(64).unwrap();
        let mut ahead = TracePrompts::new(&t, b, Namespace::default());
        let mut steps = 0;
        while ahead.hash_ahead() {
            steps += 1;
        }
        // The shared id once, then one new id per prompt, for the first AHEAD prompts.
        assert_eq!(steps, 1 + AHEAD);
        // Asking for a prompt moves the horizon on.
        let _ = ahead.blocked(0);
        assert!(ahead.hash_ahead());
        let mut plain = BlockHashCache::new(b, Namespace::default(), 1 << 10);
        for (i, r) in t.iter().enumerate() {
            assert_eq!(
                ahead.blocked(i),
                plain.blocked_with_tail(&r.prompt),
                "prompt {i}"
            );
        }
        assert!(!ahead.hash_ahead(), "nothing left");
    }
}
