//! How many blocks an engine without KV events really keeps, learned from its answers.
//!
//! Each answer says how many prompt tokens the engine found cached. Against the depth, in
//! the worker's recency order, of each block the router guessed there (how many other
//! guessed blocks were routed to it since), an LRU cache of `C` blocks gives bounds: a block
//! found at depth `d` means `C > d`; a guessed block the engine no longer had, at depth `d`,
//! means `C <= d`; a block the engine still had beyond what the router's learned capacity
//! kept means `C` is larger than that capacity. The estimate is the middle of the recent
//! bounds; a new bound that contradicts older ones of the other kind drops them (the
//! engine's room for prompt blocks changes with its load).

use std::collections::VecDeque;

/// Bounds of each kind remembered.
const WINDOW: usize = 64;

/// One worker's bounds.
#[derive(Debug, Default)]
pub struct CapacityLearner {
    /// Depths the engine was found to keep a block at (capacity above each).
    lower: VecDeque<u64>,
    /// Depths it was found to have evicted a block at (capacity at most each).
    upper: VecDeque<u64>,
}

impl CapacityLearner {
    /// Learns from one answer: `depths` of the prompt's leading blocks as guessed at the
    /// dispatch, `predicted` blocks expected cached, `reported` blocks the engine found,
    /// `kept` the capacity the guesses were held to. The new estimate, when there is one.
    pub fn observe(
        &mut self,
        depths: &[Option<u64>],
        predicted: usize,
        reported: usize,
        kept: usize,
    ) -> Option<usize> {
        let hits = reported.min(predicted).min(depths.len());
        if let Some(d) = depths[..hits].iter().flatten().max() {
            self.lower_bound(d + 1);
        }
        if reported < predicted {
            if let Some(Some(d)) = depths.get(reported) {
                self.upper_bound((*d).max(1));
            }
        } else if reported > predicted && predicted == depths.len() {
            // The engine kept a block the guesses had dropped at the capacity they kept.
            self.lower_bound(kept as u64 + 1);
        }
        self.estimate()
    }

    fn lower_bound(&mut self, c: u64) {
        self.upper.retain(|&u| u >= c);
        push(&mut self.lower, c);
    }

    fn upper_bound(&mut self, c: u64) {
        self.lower.retain(|&l| l <= c);
        push(&mut self.upper, c);
    }

    /// The middle of the highest lower bound and the lowest upper bound; the upper bound
    /// alone; nothing with no eviction seen.
    pub fn estimate(&self) -> Option<usize> {
        let hi = self.upper.iter().min()?;
        let est = match self.lower.iter().max() {
            Some(lo) if lo <= hi => (lo + hi) / 2,
            _ => *hi,
        };
        Some(est.max(1) as usize)
    }
}

fn push(q: &mut VecDeque<u64>, v: u64) {
    if q.len() == WINDOW {
        q.pop_front();
    }
    q.push_back(v);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_from_hits_and_evictions_meet_at_the_capacity() {
        let mut l = CapacityLearner::default();
        // Hits alone say nothing to act on.
        assert_eq!(l.observe(&[Some(10), Some(40)], 2, 2, 1000), None);
        // A block at depth 120 was gone: at most 120; with more than 40, the middle.
        assert_eq!(l.observe(&[Some(3), Some(120)], 2, 1, 1000), Some(80));
        // More evidence narrows it.
        l.observe(&[Some(90)], 1, 1, 1000);
        l.observe(&[Some(100)], 1, 0, 1000);
        assert_eq!(l.estimate(), Some(95));
        // A newer hit above an older eviction drops it: the engine has more room now.
        l.observe(&[Some(150)], 1, 1, 1000);
        assert_eq!(l.estimate(), None, "no eviction left to bound it");
        // An eviction at 200 bounds it again (151..=200); then the engine kept what the
        // guesses had dropped at the 180 they kept: above 180.
        assert_eq!(l.observe(&[Some(200)], 1, 0, 1000), Some(175));
        assert_eq!(l.observe(&[Some(5)], 1, 3, 180), Some(190));
    }
}
