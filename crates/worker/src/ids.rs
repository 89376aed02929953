//! Request ids: the engine's numeric id (a counter) and the public `cmpl-<hex>` /
//! `chatcmpl-<hex>` id, unpredictable across processes.

use kvroute_core::hashing::splitmix64;
use kvroute_core::RequestId;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

/// Hands out request ids.
pub(crate) struct IdGen {
    seed: u64,
    next: AtomicU64,
}

impl IdGen {
    /// A generator with a per-process random seed.
    pub(crate) fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let seed = std::collections::hash_map::RandomState::new().hash_one(nanos)
            ^ u64::from(std::process::id());
        Self {
            seed,
            next: AtomicU64::new(1),
        }
    }

    /// The next engine id and its 32-digit hex tag.
    pub(crate) fn next(&self) -> (RequestId, String) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let hi = splitmix64(self.seed ^ n);
        let lo = splitmix64(hi ^ self.seed.rotate_left(29));
        (RequestId(n), format!("{hi:016x}{lo:016x}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct() {
        let g = IdGen::new();
        let (a, ha) = g.next();
        let (b, hb) = g.next();
        assert_ne!(a, b);
        assert_ne!(ha, hb);
        assert_eq!(ha.len(), 32);
    }
}
